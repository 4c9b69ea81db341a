// The connection machine: its four states and the one place they change
// (`ConnectionMachine.transition`), the order the transports are tried in, and the policy
// it follows: the timings (all overridable with the `timings` option), the close-code
// rules (which codes stop the client, which carry a suggested delay) and the backoff
// between attempts.

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
/** The transports, and the default of the `transports` option: the fallback order. */
export const TRANSPORTS = Object.freeze(['websocket', 'sse']);

/**
 * The `transports` option checked: a non-empty list of distinct names of `TRANSPORTS`,
 * in that order (a failed WebSocket says nothing of why, so it falls back to SSE; a
 * refused SSE request says why, so SSE never falls back to WebSocket). One name: no
 * fallback. Throws a TypeError naming what is wrong.
 */
export function checkTransports(list) {
  const shown = JSON.stringify(list);
  if (!Array.isArray(list) || list.length === 0) throw new TypeError(`livegate: transports must be a non-empty list of 'websocket' and 'sse', not ${shown}`);
  for (const name of list) {
    if (!TRANSPORTS.includes(name)) throw new TypeError(`livegate: unknown transport ${JSON.stringify(name)} in transports (known: 'websocket', 'sse')`);
  }
  if (new Set(list).size !== list.length) throw new TypeError(`livegate: transports names a transport twice: ${shown}`);
  if (list.indexOf('sse') === 0 && list.length > 1) throw new TypeError(`livegate: transports ${shown}: SSE does not fall back to WebSocket; use ['websocket', 'sse']`);
  return [...list];
}

/**
 * The connection's states. `disconnected`: no connection, one is scheduled (also before
 * the first attempt); `connecting`: an attempt is under way; `connected`: welcomed (an SSE
 * stream reopened for its rooms stays `connected`); `closed`: for good, by close() or
 * because the server said not to come back (a close 4500-4999).
 */
export const STATES = Object.freeze(['disconnected', 'connecting', 'connected', 'closed']);

/** The transitions the machine takes; any other is refused. `closed` is final. */
const NEXT = Object.freeze({
  disconnected: new Set(['connecting', 'closed']),
  connecting: new Set(['connected', 'disconnected', 'closed']),
  connected: new Set(['disconnected', 'closed']),
  closed: new Set(),
});

export class ConnectionMachine {
  /** `onChange({previous, state, reason})` runs after each transition. */
  constructor(onChange) {
    this.state = 'disconnected';
    this.reason = 'not connected yet';
    /** Once closed: `client` (close()) or `server` (told not to come back). */
    this.closedBy = null;
    this._onChange = onChange;
  }

  /** Whether the client is closed for good. */
  get closed() {
    return this.state === 'closed';
  }

  /**
   * Moves to `state` for `reason` (and, into `closed`, `closedBy`). Staying in the same
   * state or a transition the machine does not take changes nothing; returns whether it
   * moved.
   */
  transition(state, reason, closedBy = null) {
    const previous = this.state;
    if (state === previous || !NEXT[previous].has(state)) return false;
    this.state = state;
    this.reason = reason;
    if (state === 'closed') this.closedBy = closedBy ?? 'client';
    this._onChange({ previous, state, reason });
    return true;
  }
}

/**
 * The transports to try, in order (the fallback order as data): the `transports` option
 * (checked by `checkTransports`) less what the runtime lacks (`webSocket`: a WebSocket
 * constructor, `fetch`: for SSE), never empty. The client uses the first, moves to the
 * next after `WS_FAILURES_BEFORE_SSE` consecutive failures of the one in use, and back to
 * the first when the fallback turns out wrong; a transport the server lacks is removed.
 */
export class TransportOrder {
  constructor(names, { webSocket, fetch }) {
    const usable = names.filter((name) => (name === 'websocket' ? webSocket : fetch));
    this.names = usable.length ? usable : [names[0]];
    this.index = 0;
    /** Consecutive attempts of the transport in use that failed before welcome (server up). */
    this.failures = 0;
  }

  /** The transport in use (or of the next attempt). */
  get current() {
    return this.names[this.index];
  }

  /** Whether a later transport is in use because earlier ones failed. */
  get fellBack() {
    return this.index > 0;
  }

  /** Whether there is a transport to fall back to after the one in use. */
  get hasFallback() {
    return this.index < this.names.length - 1;
  }

  /** Uses `name` from now on (it must be in the order). */
  use(name) {
    this.index = Math.max(0, this.names.indexOf(name));
    this.failures = 0;
  }

  /** Removes `name` (the server has no such endpoint) unless it is the only one left. */
  remove(name) {
    if (this.names.length < 2 || !this.names.includes(name)) return false;
    const current = this.current;
    this.names = this.names.filter((n) => n !== name);
    this.use(current === name ? this.names[0] : current);
    return true;
  }
}

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
