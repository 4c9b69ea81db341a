// A virtual clock for the scripted tests of livegate.js (the client's `clock` option):
// time stands still until the test moves it, and moving it runs every timer that falls
// due, in order, letting the promises each one starts settle before the next. A backoff
// of seconds, a heartbeat, a credential's expiry or a connect timeout then takes
// microseconds of real time, and "nothing happens for 10 s" is a fact, not a wait.

/** Lets every pending promise callback and already-arrived I/O callback run. */
const settle = () => new Promise((resolve) => setImmediate(resolve));

export class VirtualClock {
  constructor(start = 1_700_000_000_000) {
    this._now = start;
    this._timers = new Map(); // handle -> {at, order, fn}
    this._nextHandle = 1;
  }

  now() {
    return this._now;
  }

  setTimeout(fn, ms) {
    const handle = this._nextHandle++;
    this._timers.set(handle, { at: this._now + Math.max(0, Number(ms) || 0), order: handle, fn });
    return handle;
  }

  clearTimeout(handle) {
    this._timers.delete(handle);
  }

  /** Timers pending now. */
  get pending() {
    return this._timers.size;
  }

  /** The clock as the client's `clock` option (bound functions). */
  get option() {
    return { now: () => this.now(), setTimeout: (fn, ms) => this.setTimeout(fn, ms), clearTimeout: (h) => this.clearTimeout(h) };
  }

  /** Moves time on by `ms`, running each timer that falls due on the way, in order. */
  async advance(ms) {
    const end = this._now + ms;
    await settle();
    for (;;) {
      const due = this._earliest(end);
      if (!due) break;
      this._timers.delete(due.handle);
      this._now = Math.max(this._now, due.at);
      due.fn();
      await settle();
    }
    this._now = end;
    await settle();
  }

  /**
   * Runs the timers in order, one at a time, until `check()` is truthy (returned), at
   * most `maxMs` of virtual time on; throws naming `what` after that (the clock then
   * stands `maxMs` on). Time jumps from timer to timer: no step is skipped or guessed.
   */
  async until(check, what, maxMs = 120_000) {
    const end = this._now + maxMs;
    await settle();
    for (;;) {
      const value = await check();
      if (value) return value;
      const due = this._earliest(end);
      if (!due) {
        this._now = end;
        await settle();
        throw new Error(`virtual time: ${maxMs} ms passed without ${what}`);
      }
      this._timers.delete(due.handle);
      this._now = Math.max(this._now, due.at);
      due.fn();
      await settle();
    }
  }

  _earliest(end) {
    let best = null;
    for (const [handle, timer] of this._timers) {
      if (timer.at > end) continue;
      if (!best || timer.at < best.at || (timer.at === best.at && timer.order < best.order)) best = { handle, ...timer };
    }
    return best;
  }
}
