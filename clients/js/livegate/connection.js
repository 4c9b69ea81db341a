// The connection machine's policy: how long the client waits and when it gives up. The
// timings (all overridable with the `timings` option), the close-code rules (which codes
// stop the client, which carry a suggested delay) and the backoff between attempts.

import { firstNumber, suggestedDelayMs } from './urls.js';

/** Defaults of the `timings` option (all in milliseconds). */
export const DEFAULT_TIMINGS = Object.freeze({
  /** Backoff tiers after a lost or failed connection; each delay is random() * tier. */
  backoffMs: Object.freeze([0, 2000, 5000, 10000, 30000]),
  /** After 1012/1001 without a suggested delay: random() * this. */
  restartJitterMs: 3000,
  /** Longest server-suggested delay honoured. */
  maxHintMs: 60000,
  /** No `welcome` this long after opening the socket: give up on the attempt. */
  connectTimeoutMs: 10000,
  /** A connection that lasted this long starts the backoff from its first tier again. */
  stableMs: 10000,
  /** Interval of the client's `ping`; null: the server's `heartbeat_ms` from welcome. */
  pingMs: null,
  /** Nothing heard from the server this long: the connection is dead, reconnect.
   *  null: 2.5 ping intervals (WebSocket), 3 heartbeats (SSE). */
  idleMs: null,
  /** A subscribe refused as `unavailable` is tried again after this long. */
  resubscribeMs: 1000,
  /** A resume credential counts as expired this long before its expiry (clock skew). */
  resumeMarginMs: 30000,
  /** Longest wait for the `/readyz` check after a failed WebSocket attempt. */
  probeTimeoutMs: 3000,
});

/** Consecutive WebSocket attempts failing before welcome after which `auto` uses SSE. */
export const WS_FAILURES_BEFORE_SSE = 2;
/** Refusals (`wrong_node`) followed in a row without a welcome before backing off. */
export const MAX_FOLLOWS = 3;
/** The `transport` option's values. */
export const TRANSPORT_OPTIONS = new Set(['auto', 'websocket', 'sse']);

/** A close 4500-4999 (replaced, kicked, token revoked): the server says not to come back. */
export function toldToStop(code) {
  return code >= 4500 && code <= 4999;
}

/**
 * How long to wait before the next attempt after losing a connection with `code` and
 * `reason`, when `failures` attempts failed since the last stable connection. After
 * 1012/1001: the delay the reason suggests, or a random part of `restartJitterMs`; after
 * anything else: a random part of the backoff tier (full jitter), and at least the
 * retry-after seconds a 4029 carries. `random` is like Math.random.
 */
export function reconnectDelayMs(code, reason, failures, timings, random) {
  if (code === 1012 || code === 1001) {
    const hint = suggestedDelayMs(reason);
    if (hint != null) return Math.min(hint, timings.maxHintMs);
    return Math.floor(random() * timings.restartJitterMs);
  }
  const tiers = timings.backoffMs;
  const tier = tiers[Math.min(failures, tiers.length - 1)];
  let delay = Math.floor(random() * tier);
  if (code === 4029) {
    // Migration budget spent: the reason carries the retry-after seconds.
    const seconds = firstNumber(reason);
    if (seconds != null) delay = Math.max(delay, Math.min(seconds * 1000, timings.maxHintMs));
  }
  return delay;
}
