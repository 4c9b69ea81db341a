// The resume credential: the one-time credential each `welcome` hands out, which the next
// attempt offers instead of a token from the application's backend. It owns the
// credential's expiry on the local clock (with a margin against clock skew) and the count
// of failed attempts that used it, and never lets the credential out except to build an
// attempt's URL.

/** Without an expiry in the welcome, a credential is trusted this long after receipt. */
const UNDATED_LIFETIME_MS = 60000;

export class ResumeCredential {
  /**
   * `enabled`: false never keeps one (`resume: false`); `attempts`: consecutive failed
   * attempts it is tried in before it is dropped; `marginMs`: it counts as expired this
   * long before its expiry; `clock`: the client's clock.
   */
  constructor({ enabled, attempts, marginMs, clock }) {
    this.enabled = enabled;
    this.attempts = attempts;
    this.marginMs = marginMs;
    this.clock = clock;
    /** {value, expiresAt (local clock)} or null. */
    this.held = null;
    /** Consecutive failed attempts (server up) that used the held credential. */
    this.failures = 0;
  }

  /** The credential to use now, or null (none, expired, or resume is off). */
  usable() {
    const held = this.held;
    if (!held || !this.enabled) return null;
    if (this.clock.now() >= held.expiresAt - this.marginMs) {
      this.held = null;
      return null;
    }
    return held.value;
  }

  /** Keeps a welcome's credential, its expiry moved onto the local clock by `skewMs`. */
  keep(frame, receivedAt, skewMs) {
    this.failures = 0;
    if (!this.enabled || typeof frame.resume !== 'string' || frame.resume === '') {
      this.held = null;
      return;
    }
    const expires = Number(frame.resume_expires_at_ms);
    const expiresAt = Number.isFinite(expires) && expires > 0 ? expires - skewMs : receivedAt + UNDATED_LIFETIME_MS;
    this.held = { value: frame.resume, expiresAt };
  }

  /** Forgets the credential (refused, or the server said not to come back). */
  drop() {
    this.held = null;
    this.failures = 0;
  }

  /**
   * An attempt that offered `value` failed while the server was up: one more failure
   * against it, and it is dropped after `attempts` of them.
   */
  failedWith(value) {
    if (value == null || this.held?.value !== value) return;
    this.failures += 1;
    if (this.failures >= this.attempts) this.drop();
  }
}
