// The connection attempts: a small machine that decides where each attempt goes, with
// which credential and transport, and what a loss means for the next one. It does no I/O
// and reads no clock: the client feeds it inputs (an attempt is due, a token came or did
// not, the server answered, a welcome, a loss with its code and reason and the time, a
// `/readyz` probe answered) and carries out the actions it queues, taken one at a time
// with `poll()`: move the connection's state, emit an event, ask `getToken`, open an
// attempt, probe a node's `/readyz`, schedule the next attempt after a delay, change the
// transport, stop (signed out, or told not to come back).
//
// What a loss means (`lost`):
// - welcomed, then 4421 with a URL: the session was handed over; go there at once.
// - refused as `wrong_node` before welcome: follow the node named, at once, at most
//   MAX_FOLLOWS times in a row without a welcome (never from https to plain http).
// - an attempt to a named node that did not answer: probe its `/readyz`; unreachable: back
//   through the given address at once, asking it to avoid the node.
// - a WebSocket attempt failing before welcome counts against the resume credential and
//   toward the SSE fallback only when the server's `/readyz` says it is ready.
// - 4500-4999: told to stop, for good.
// - anything else: the backoff (connection.js); a connection that lasted `stableMs`
//   starts it again from its first tier, 1012/1001 do not count as failures.
//
// States (`attempts.state`):
// - `idle`: not connecting (before connect(), after a halt).
// - `waiting`: the next attempt is scheduled (or waits for a `/readyz` verdict).
// - `token`: the attempt waits for `getToken`.
// - `opening`: the attempt is open, not welcomed yet.
// - `connected`: welcomed.
// - `probing`: an attempt to a named node failed; its `/readyz` is asked.
// - `stopped`: signed out, told to stop, or closed: inputs change nothing until start().

import { MAX_FOLLOWS, WS_FAILURES_BEFORE_SSE, reconnectDelayMs, toldToStop } from './connection.js';
import { baseOf, looksLikeUrl, readyzOf, sseEndpointOf } from './urls.js';

/** Codes of an error thrown by `getToken` that mean "signed out: stop" (no retry). */
export const SIGNED_OUT_CODES = new Set(['signed_out', 'unauthorized']);

/** The credential part of an attempt's query string (`session`: the session to resume with a token). */
export function credentialQuery(attempt, session) {
  let query;
  if (attempt.resume != null) query = `resume=${encodeURIComponent(attempt.resume)}`;
  else {
    query = `token=${encodeURIComponent(attempt.token)}`;
    if (session) query += `&session=${encodeURIComponent(session)}`;
  }
  if (attempt.avoid != null) query += `&avoid=${encodeURIComponent(attempt.avoid)}`;
  return query;
}

export class Attempts {
  /**
   * `order`: the TransportOrder (shared with the client, which reads what is in use);
   * `credential`: the ResumeCredential (its `usable()`, `failedWith()`, `drop()`);
   * `sseEndpoint`: the given address's SSE endpoint; `timings`: DEFAULT_TIMINGS with the
   * overrides; `random`: like Math.random; `canProbe`: whether `/readyz` can be asked (fetch).
   */
  constructor({ order, credential, sseEndpoint, timings, random = Math.random, canProbe = true }) {
    this.order = order;
    this.credential = credential;
    this._sseEndpoint = sseEndpoint;
    this._readyz = readyzOf(sseEndpoint);
    this._secure = /^https:/i.test(sseEndpoint);
    this._timings = timings;
    this._random = random;
    this._canProbe = canProbe;
    this.state = 'idle';
    /** Attempts started (the `attempt` of `connecting`). */
    this.count = 0;
    /** Attempts since the last stable connection (the backoff tier). */
    this.failures = 0;
    /**
     * Where the next attempt goes instead of the given address, once: a refusal named a
     * node (`{base, node, avoid, token}`), or that node was unreachable (`{avoid, token}`:
     * the given address, told to avoid it). `token`: the unspent token to offer again.
     */
    this.target = null;
    /** The node the session lives on, after a welcome from a node a refusal named: {base, node}. */
    this.home = null;
    /** Refusals followed (and unreachable nodes avoided) since the last welcome. */
    this.follows = 0;
    /** The attempt under way (opened, until lost). */
    this.current = null;
    /** The attempt waiting for `getToken`: {quiet, transport, target, where}. */
    this._pending = null;
    /** An attempt due while a verdict is out: it starts when the last one is in ({quiet}). */
    this._waiting = null;
    /** WebSocket failures to judge by `/readyz`, in order; the first one's probe is out. */
    this._verdicts = [];
    /** Probes out: id -> {kind: 'verdict' | 'unreached', attempt, code, reason}. */
    this._probes = new Map();
    this._nextProbe = 1;
    this._out = [];
  }

  /** The next action to carry out, or null. */
  poll() {
    return this._out.length ? this._out.shift() : null;
  }

  // ---- inputs ----

  /** connect(): the first attempt at once, the backoff from its first tier. */
  start() {
    this.state = 'waiting';
    this.failures = 0;
    this._out.push({ type: 'schedule', delayMs: 0 });
  }

  /**
   * Stops without closing (disconnect(), signed out, close()): nothing scheduled or asked
   * is carried on; an unreached node's probe is forgotten (a verdict still counts).
   */
  halt() {
    this._forget();
    this.state = 'idle';
    this._out.length = 0;
  }

  /** The scheduled attempt is due; `quiet`: an SSE stream reopened for its rooms (no events). */
  due({ quiet = false } = {}) {
    this._pending = null;
    if (this._verdicts.length) {
      this.state = 'waiting';
      this._waiting = { quiet };
      return;
    }
    this._begin(quiet);
  }

  /** What `getToken` resolved with (a string, `{token}`, or null: signed out). */
  tokenGot(value) {
    if (!this._pending) return;
    if (value == null) {
      this._pending = null;
      this._stop();
      this._out.push({ type: 'signed_out', why: 'getToken returned no token' });
      return;
    }
    const token = typeof value === 'object' ? value.token : value;
    if (typeof token !== 'string' || token === '') {
      this.tokenFailed(new Error('getToken returned no token'));
      return;
    }
    const { quiet, transport, target, where } = this._pending;
    this._pending = null;
    this._open({ quiet, transport, target, where, resume: null, token });
  }

  /** What `getToken` threw (or rejected with). */
  tokenFailed(error) {
    if (!this._pending) return;
    this._pending = null;
    if (SIGNED_OUT_CODES.has(error?.code)) {
      this._stop();
      this._out.push({ type: 'signed_out', why: error?.message ?? error.code });
      return;
    }
    this._emit('error', { code: 'token', message: `getToken failed: ${error?.message ?? error}`, error });
    this._afterLoss(1006, 'getToken failed', false);
  }

  /** The attempt could not even start (a WebSocket constructor threw): a backoff, not judged. */
  openFailed(attempt, reason) {
    if (this.current === attempt) this.current = null;
    this._afterLoss(1006, reason, false);
  }

  /** The server answered `attempt` (the upgrade went through, or an HTTP response came). */
  opened(attempt) {
    attempt.opened = true;
  }

  /** A `wrong_node` refusal of `attempt` named the node to use: `{url, node}`. */
  named(attempt, { url, node }) {
    attempt.named = { url, node };
  }

  /** `attempt` was welcomed by `node` (`websocket`: over WebSocket). */
  welcomed(attempt, { node, websocket }) {
    this.state = 'connected';
    if (websocket) this.order.failures = 0;
    this.follows = 0;
    // Welcomed by a node a refusal named: the session lives there, reconnects go there first.
    this.home = attempt.base ? { base: attempt.base, node: typeof node === 'string' ? node : attempt.node } : null;
  }

  /**
   * The connection ended (or an attempt failed) with `code` and `reason` at `now`:
   * `attempt` is what it used when it matters for what comes next (null: a loss the client
   * caused), `welcomed` whether its welcome came, at `welcomedAt`.
   */
  lost(code, reason, { attempt = null, welcomed = false, welcomedAt = 0 } = {}, now = 0) {
    this.current = null;
    if (welcomed && now - welcomedAt >= this._timings.stableMs) this.failures = 0;
    if (welcomed && (code === 1012 || code === 1001) && attempt?.base) {
      // The node restarts or goes away: the given address knows where the session goes.
      this.home = null;
    }
    const told = toldToStop(code);
    if (welcomed && code === 4421 && this._handedOver(code, reason)) return;
    if (!welcomed && attempt && code === 4421 && this._follow(attempt, code, reason)) return;
    if (!welcomed && attempt?.base && !attempt.opened && !told) {
      this._unreached(attempt, code, reason);
      return;
    }
    // 4421 and 4029 are refusals the server explained: the credential was not spent.
    if (!welcomed && attempt && attempt.transport === 'websocket' && !told && code !== 4421 && code !== 4029) {
      this._judgeWebSocketFailure(attempt);
    }
    this._afterLoss(code, reason, welcomed);
  }

  /** The answer to probe `id`: whether the node is up and ready (not draining or starting). */
  probed(id, ready) {
    const probe = this._probes.get(id);
    if (!probe) return;
    this._probes.delete(id);
    if (probe.kind === 'unreached') {
      if (this.current || this.state !== 'probing') return;
      this._unreachedAnswer(probe, ready);
      return;
    }
    if (ready) this._counts(probe.attempt);
    this._verdicts.shift();
    if (this._verdicts.length) this._probe(this._verdicts[0]);
    else if (this._waiting) {
      const { quiet } = this._waiting;
      this._waiting = null;
      this._begin(quiet);
    }
  }

  /**
   * An SSE request refused with `status` and `code` (before the loss that follows): a
   * refused credential is dropped (and the WebSocket it may have failed on tried again),
   * a server without SSE leaves WebSocket alone. True when the refusal was one of these.
   */
  sseRefused(status, code) {
    if (code === 'resume_invalid') {
      this.credential.drop();
      if (this.order.fellBack) {
        // The WebSocket failures that brought auto here may have been this credential.
        this._switchTransport(this.order.names[0], 'resume credential refused over SSE');
      }
      return true;
    }
    if (status === 404 && this.order.names.length > 1) {
      const from = this.order.current;
      this.order.remove('sse');
      this._announce(from, 'the server has no SSE endpoint');
      return true;
    }
    return false;
  }

  /** No WebSocket in this runtime: SSE when the transports allow it (true), else false. */
  noWebSocket(message) {
    const from = this.order.current;
    if (!this.order.remove('websocket')) return false;
    this._announce(from, message, 'no_websocket');
    return true;
  }

  /** Closed for good (close(), or no transport left): inputs change nothing. */
  close() {
    this.halt();
    this.state = 'stopped';
  }

  // ---- decisions ----

  /** Starts the next attempt: where it goes, and with which credential. */
  _begin(quiet) {
    this.count += 1;
    const transport = this.order.current;
    // A refusal's node (or the given address avoiding an unreachable one), else the node
    // the session lives on, else the given address.
    const target = this.target;
    const where = target ?? this.home;
    if (!quiet) {
      this._state('connecting', `attempt ${this.count} over ${transport}`);
      this._emit('connecting', { attempt: this.count, transport });
    }
    const resume = this.credential.usable();
    if (resume == null && target?.token) {
      this._open({ quiet, transport, target, where, resume, token: target.token }); // refused unspent (or never seen): offered again
    } else if (resume == null) {
      this.state = 'token';
      this._pending = { quiet, transport, target, where };
      this._out.push({ type: 'token' });
    } else {
      this._open({ quiet, transport, target, where, resume, token: null });
    }
  }

  _open({ quiet, transport, target, where, resume, token }) {
    if (this.target === target) this.target = null;
    const attempt = {
      transport,
      resume,
      quiet,
      token,
      base: where?.base ?? null, // null: the given address
      node: where?.base ? where.node ?? null : null,
      avoid: target?.avoid ?? null,
      opened: false, // the server answered (WebSocket open, or an HTTP response)
      named: null, // the `wrong_node` frame's {url, node}
    };
    this.state = 'opening';
    this.current = attempt;
    this._out.push({ type: 'open', attempt });
  }

  /**
   * A connection that was welcomed and then closed with 4421: its node handed the session
   * over to the node whose URL is the reason (an operator's rebalance). Reconnect there at
   * once with the resume credential the welcome gave (else a new token), no backoff, not
   * a failure. False (an ordinary loss) when the reason is no usable URL.
   */
  _handedOver(code, reason) {
    const text = String(reason ?? '').trim();
    if (!looksLikeUrl(text)) return false;
    const base = this._followable(text);
    if (base == null) return false;
    this.target = { base, node: null, avoid: null, token: null };
    this.home = null;
    this._state('disconnected', `handed over to ${base}`);
    this._emit('disconnected', { code, reason, reconnectInMs: 0, welcomed: true });
    this._emit('redirect', { node: null, url: base, avoid: null, reason: 'wrong_node' });
    this._schedule(0);
    return true;
  }

  /**
   * A handshake refused as `wrong_node` (close 4421 or HTTP 421): reconnect at once to the
   * node it named, with the same credential and session, without counting a failure.
   * False (an ordinary failure, with backoff) when it named nothing usable, or after
   * `MAX_FOLLOWS` refusals in a row without a welcome (two nodes sending it back and forth).
   */
  _follow(attempt, code, reason) {
    const text = String(reason ?? '').trim();
    const base = this._followable(looksLikeUrl(text) ? text : String(attempt.named?.url ?? ''));
    if (base == null) return false;
    if (this.follows >= MAX_FOLLOWS) {
      this.follows = 0;
      this.target = null;
      return false;
    }
    this.follows += 1;
    const node = typeof attempt.named?.node === 'string' ? attempt.named.node : null;
    // An attempt that avoided an unreachable node keeps avoiding it down the chain.
    this.target = { base, node, avoid: attempt.avoid, token: attempt.token };
    this._state('disconnected', `refused as wrong_node: ${base} has the session`);
    this._emit('disconnected', { code, reason, reconnectInMs: 0, welcomed: false });
    this._emit('redirect', { node, url: base, avoid: attempt.avoid, reason: 'wrong_node' });
    this._schedule(0);
    return true;
  }

  /** The base URL of `url` when a refusal's URL may be followed, else null. */
  _followable(url) {
    let base;
    try {
      base = baseOf(url);
    } catch {
      return null;
    }
    // Never from https to plain http: the credential would travel in the clear.
    if (this._secure && !/^https:/i.test(base)) return null;
    return base;
  }

  /**
   * An attempt to a node a refusal named (or the session's node) failed before the server
   * answered. If the node's `/readyz` does not answer either (or says draining), it is
   * unreachable: reconnect at once through the given address, asking it to avoid the node
   * (the token, never seen, is offered again). Otherwise the attempt failed like any other.
   */
  _unreached(attempt, code, reason) {
    this._state('disconnected', `${attempt.base} did not answer`);
    this.state = 'probing';
    const probe = { kind: 'unreached', attempt, code, reason, readyz: readyzOf(sseEndpointOf(attempt.base)) };
    if (attempt.transport === 'websocket' && this._canProbe) this._probe(probe);
    else this._unreachedAnswer(probe, false);
  }

  _unreachedAnswer({ attempt, code, reason }, reachable) {
    if (reachable) {
      if (attempt.transport === 'websocket') this._judgeWebSocketFailure(attempt, true);
      this._afterLoss(code, reason, false);
      return;
    }
    this.home = null;
    if (attempt.node == null || this.follows >= MAX_FOLLOWS) {
      this.follows = 0;
      this._afterLoss(code, reason, false); // the given address next, after a backoff
      return;
    }
    this.follows += 1;
    this.target = { base: null, node: null, avoid: attempt.node, token: attempt.token };
    this._emit('disconnected', { code, reason, reconnectInMs: 0, welcomed: false });
    this._emit('redirect', { node: null, url: this._sseEndpoint.replace(/\/v1\/sse$/, ''), avoid: attempt.node, reason: 'unreachable' });
    this._schedule(0);
  }

  /**
   * A WebSocket attempt failed before welcome, for a reason the browser does not show.
   * If the server is up and ready (it could have looked at the credential, the upgrade
   * could have gone through), the failure counts against the resume credential and, with
   * a fallback, towards SSE; a server down or draining counts for nothing. `ready`: known
   * already; else `/readyz` is asked (after the verdicts before it), and the next attempt
   * waits for the answer.
   */
  _judgeWebSocketFailure(attempt, ready = false) {
    const needed = attempt.resume != null || this.order.hasFallback;
    if (!needed) return;
    if (!this._canProbe || ready) {
      this._counts(attempt);
      return;
    }
    const verdict = { kind: 'verdict', attempt, readyz: attempt.base ? readyzOf(sseEndpointOf(attempt.base)) : this._readyz };
    this._verdicts.push(verdict);
    if (this._verdicts.length === 1) this._probe(verdict);
  }

  /** A WebSocket failure that counts: against the credential, toward the fallback. */
  _counts(attempt) {
    this.credential.failedWith(attempt.resume);
    const order = this.order;
    if (order.current === 'websocket' && order.hasFallback) {
      order.failures += 1;
      if (order.failures >= WS_FAILURES_BEFORE_SSE) this._switchTransport(order.names[order.index + 1], `${order.failures} WebSocket attempts in a row failed`);
    }
  }

  /** Decides whether and when to reconnect after losing a connection with `code`. */
  _afterLoss(code, reason, welcomed) {
    if (toldToStop(code)) {
      this._stop();
      this._state('closed', `server said not to reconnect (${code}${reason ? `: ${reason}` : ''})`, 'server');
      this.credential.drop();
      this._out.push({ type: 'stopped', code, reason });
      return;
    }
    const delay = reconnectDelayMs(code, reason, this.failures, this._timings, this._random);
    if (code !== 1012 && code !== 1001) this.failures += 1;
    this._state('disconnected', `lost (${code}${reason ? `: ${reason}` : ''}), reconnecting in ${delay} ms`);
    this._emit('disconnected', { code, reason, reconnectInMs: delay, welcomed });
    this._schedule(delay);
  }

  _switchTransport(to, reason) {
    const from = this.order.current;
    if (from === to) return;
    this.order.use(to);
    this._announce(from, reason);
  }

  // ---- actions ----

  /** The transport in use changed from `from` (the client tells the app). */
  _announce(from, reason, warning = 'fallback') {
    const to = this.order.current;
    if (from === to) return;
    this._out.push({ type: 'transport', from, to, reason, warning });
  }

  _probe(probe) {
    const id = this._nextProbe++;
    this._probes.set(id, probe);
    this._out.push({ type: 'probe', id, readyz: probe.readyz });
  }

  _schedule(delayMs) {
    this.state = 'waiting';
    this._out.push({ type: 'schedule', delayMs });
  }

  /** Signed out or told to stop: what was under way is forgotten (not what is queued). */
  _stop() {
    this._forget();
    this.state = 'stopped';
  }

  _forget() {
    this.target = null;
    this.current = null;
    this._pending = null;
    this._waiting = null;
    for (const [id, probe] of this._probes) if (probe.kind === 'unreached') this._probes.delete(id);
  }

  _state(state, reason, closedBy = null) {
    this._out.push({ type: 'state', state, reason, closedBy });
  }

  _emit(name, detail) {
    this._out.push({ type: 'emit', name, detail });
  }
}
