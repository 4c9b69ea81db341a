// livegate.js: the browser and Node client of livegate (an ES module, no build step).
//
//   import { connect } from '/livegate.js';
//   const client = connect({
//     url: 'https://push.example.com',              // the server; ws(s)://.../v1/ws is derived
//     getToken: async () => (await fetch('/my-backend/livegate-token')).text(),
//   });
//   client.on('connected', ({ session, node }) => ...);
//   client.on('recovery_failed', ({ room }) => reloadOverHttp(room));
//   client.subscribe('match:1', (event) => render(event));   // {room, seq, id, ts_ms, data}
//   client.dropConnection();   // drop the socket to watch it reconnect and recover (demos)
//
// What it does for the application:
// - Reconnects by itself. After Close 1012 (service restart) or 1001 it waits the delay
//   the server suggests in the close reason (`... reconnect in 1234 ms`), or a random
//   0-3 s; after any other loss it backs off with full jitter in tiers (about 0, 2, 5,
//   10 s, then 30 s at most); after a Close 4500-4999 (replaced, kicked, token revoked)
//   it stops for good. Every attempt asks `getToken()` for a fresh one-time token and
//   offers the session of the last `welcome` again.
// - Per room it remembers the epoch and the last seq delivered, resubscribes with
//   `since` and `epoch` after a reconnect, and hands each event to the application
//   exactly once and in seq order: events at or below the last delivered seq are
//   dropped, a gap in the live stream is filled with `history` before later events are
//   delivered, and the last 500 event ids of each room are remembered so a repeated id
//   is dropped too. When the server cannot replay what was missed (`recovered:false`,
//   or a gap history no longer covers) it emits `recovery_failed` with the room: reload
//   that room's state over HTTP; delivery continues from the server's head.
//
// Works with the browser's WebSocket, Node's (22+, or 20 with --experimental-websocket)
// or any constructor with the same shape passed as `WebSocket`.

const OPEN = 1;

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
   *  null: 2.5 ping intervals. */
  idleMs: null,
  /** A subscribe refused as `unavailable` is tried again after this long. */
  resubscribeMs: 1000,
});

/** Event ids remembered per room to drop repeats. */
export const RECENT_IDS = 500;
/** Largest `limit` the server accepts for history. */
const HISTORY_PAGE = 1000;
/** Error codes that end a subscription instead of retrying it. */
const FINAL_SUBSCRIBE_ERRORS = new Set(['bad_request', 'bad_room', 'forbidden', 'too_many_subscriptions', 'unknown_op']);

/**
 * Opens a client. Options:
 * - `url`: the server's base URL (http(s):// or ws(s)://; `/v1/ws` is appended unless
 *   present). Defaults to the page's origin in a browser.
 * - `getToken()`: returns (a promise of) a fresh one-time token, or the `{token}` reply
 *   of `POST /v1/tokens`; called for every connection attempt.
 * - `WebSocket`: the constructor to use (default: the global one).
 * - `session`: a session id to resume on the first connection.
 * - `timings`: overrides of `DEFAULT_TIMINGS`.
 * - `random`: a function like Math.random (for tests).
 */
export function connect(options) {
  return new LivegateClient(options);
}

export class LivegateClient {
  constructor(options = {}) {
    const { url, getToken, WebSocket: Socket, session, timings, random } = options;
    if (typeof getToken !== 'function') throw new TypeError('livegate: getToken must be a function');
    this._Socket = Socket || globalThis.WebSocket;
    if (typeof this._Socket !== 'function') {
      throw new TypeError('livegate: no WebSocket constructor (pass one as the WebSocket option)');
    }
    const base = url ?? globalThis.location?.origin;
    if (!base) throw new TypeError('livegate: url is required outside a browser');
    this._endpoint = endpointOf(String(base));
    this._getToken = getToken;
    this._timings = { ...DEFAULT_TIMINGS, ...(timings || {}) };
    this._random = typeof random === 'function' ? random : Math.random;
    this._session = session ?? null;

    this._listeners = new Map();
    this._rooms = new Map(); // room name -> RoomState
    this._requests = new Map(); // ref -> {resolve, reject, frame}
    this._queued = []; // requests waiting for a connection: [ref, ...]
    this._nextRef = 1;

    this._ws = null;
    this._welcomed = false;
    this._state = 'idle';
    this._closed = false; // close() called
    this._stopped = false; // the server said not to reconnect
    this._failures = 0; // attempts since the last stable connection
    this._attempts = 0;
    this._timers = { reconnect: null, connect: null, ping: null };
    this._lastHeard = 0;
    this._welcomedAt = 0;

    this._schedule(() => this._attempt(), 0);
  }

  // ---- public API ----

  /** 'connecting' | 'connected' | 'disconnected' | 'stopped' (45xx) | 'closed' (close()). */
  get state() {
    return this._state;
  }

  /** The session id of the last welcome (null before the first). */
  get session() {
    return this._session;
  }

  /** Where delivery of a room stands: `{epoch, seq}` (seq = last delivered), or null. */
  position(room) {
    const state = this._rooms.get(room);
    return state ? { epoch: state.epoch, seq: state.last } : null;
  }

  /**
   * Listens to `connecting` ({attempt}), `connected` ({session, node, warmup, heartbeatMs,
   * resumed}), `disconnected` ({code, reason, reconnectInMs: null when not reconnecting}),
   * `recovered` ({room, epoch, seq}), `recovery_failed` ({room, epoch, seq, reason}),
   * `error` ({room?, code, message, error?}). Returns a function that removes the listener.
   */
  on(name, fn) {
    if (!this._listeners.has(name)) this._listeners.set(name, new Set());
    this._listeners.get(name).add(fn);
    return () => this.off(name, fn);
  }

  off(name, fn) {
    this._listeners.get(name)?.delete(fn);
  }

  /**
   * Delivers the room's events to `onEvent(event)` once each, in seq order, from now on
   * (or after `options.since` in `options.epoch`, e.g. the head of a state loaded over
   * HTTP). Returns a promise of the first `subscribed` reply; it rejects when the server
   * refuses the room (the client forgets the room then). Subscribing again to the same
   * room adds another handler.
   */
  subscribe(room, onEvent, options = {}) {
    if (typeof room !== 'string' || room === '') throw new TypeError('livegate: room must be a non-empty string');
    let state = this._rooms.get(room);
    const promise = new Promise((resolve, reject) => {
      if (this._closed) return reject(lgError('closed', 'client closed'));
      if (this._stopped) return reject(lgError('stopped', 'server said not to reconnect'));
      if (state) {
        if (onEvent) state.handlers.add(onEvent);
        if (state.subscribedOnce) resolve(state.lastReply);
        else state.waiters.push({ resolve, reject });
        return;
      }
      state = new RoomState(room);
      if (onEvent) state.handlers.add(onEvent);
      if (options.since != null) {
        state.last = Number(options.since);
        state.epoch = options.epoch ?? null;
      }
      state.waiters.push({ resolve, reject });
      this._rooms.set(room, state);
      if (this._welcomed) this._sendSubscribe(state);
    });
    promise.catch(() => {}); // the caller may ignore it; errors also go to 'error'
    return promise;
  }

  /** Stops delivering the room and tells the server. */
  unsubscribe(room) {
    const state = this._rooms.get(room);
    if (!state) return;
    this._rooms.delete(room);
    state.cancel();
    for (const waiter of state.waiters.splice(0)) waiter.reject(lgError('unsubscribed', `unsubscribed from ${room}`));
    if (this._welcomed) this._send({ op: 'unsubscribe', room });
  }

  /**
   * Asks the server for up to `limit` events of `room` after `since`. Resolves with the
   * `history` reply `{room, epoch, head, events, complete}`; rejects on an `error` reply,
   * when the connection is lost before the reply, or on close(). While disconnected the
   * request waits for the next connection.
   */
  history(room, since = 0, limit = 100) {
    return this._request({ op: 'history', room, since, limit });
  }

  /**
   * Drops the current connection as if it had been lost (to watch recovery in a demo, or
   * in tests): the socket is closed with 4000, `disconnected` follows with that code, and
   * the client reconnects by its backoff and resubscribes every room with `since`, like
   * after any other loss. Returns false when there is no connection to drop.
   */
  dropConnection(reason = 'dropped by the application') {
    const ws = this._ws;
    if (!ws || this._closed || this._stopped) return false;
    this._detach(ws);
    try {
      ws.close(4000, String(reason).slice(0, 120));
    } catch {
      try {
        ws.close(4000); // the reason was refused (over 123 bytes of UTF-8)
      } catch {
        // already closing
      }
    }
    this._lost(4000, reason);
    return true;
  }

  /** Closes the connection for good: no reconnect, pending requests are rejected. */
  close() {
    if (this._closed) return;
    this._closed = true;
    const ws = this._ws;
    this._clearTimers();
    if (ws) {
      this._detach(ws);
      try {
        ws.close(1000, 'client closed');
      } catch {
        // already closing
      }
      this._lost(1000, 'client closed');
    } else {
      this._state = 'closed';
    }
    this._rejectAll(lgError('closed', 'client closed'));
    for (const state of this._rooms.values()) {
      state.cancel();
      for (const waiter of state.waiters.splice(0)) waiter.reject(lgError('closed', 'client closed'));
    }
  }

  // ---- connection lifecycle ----

  async _attempt() {
    this._timers.reconnect = null;
    if (this._closed || this._stopped) return;
    this._attempts += 1;
    this._state = 'connecting';
    this._emit('connecting', { attempt: this._attempts });
    let token;
    try {
      token = await this._getToken();
      if (token && typeof token === 'object') token = token.token;
      if (typeof token !== 'string' || token === '') throw new Error('getToken returned no token');
    } catch (error) {
      if (this._closed) return;
      this._emit('error', { code: 'token', message: `getToken failed: ${error?.message ?? error}`, error });
      this._afterLoss(1006, 'getToken failed', false);
      return;
    }
    if (this._closed) return;
    let url = `${this._endpoint}?token=${encodeURIComponent(token)}`;
    if (this._session) url += `&session=${encodeURIComponent(this._session)}`;
    let ws;
    try {
      ws = new this._Socket(url);
    } catch (error) {
      this._emit('error', { code: 'socket', message: `cannot open a WebSocket: ${error?.message ?? error}`, error });
      this._afterLoss(1006, 'cannot open a WebSocket', false);
      return;
    }
    this._ws = ws;
    this._welcomed = false;
    this._lastHeard = now();
    ws.onopen = null;
    ws.onmessage = (message) => {
      if (this._ws !== ws) return;
      this._lastHeard = now();
      this._onFrame(message.data);
    };
    ws.onerror = () => {}; // a close event follows
    ws.onclose = (event) => {
      if (this._ws !== ws) return;
      this._detach(ws);
      this._lost(event?.code ?? 1006, event?.reason ?? '');
    };
    this._timers.connect = setTimeout(() => {
      if (this._ws !== ws || this._welcomed) return;
      this._abandon(ws, `no welcome within ${this._timings.connectTimeoutMs} ms`);
    }, this._timings.connectTimeoutMs);
  }

  /** Gives up on a socket that stopped answering: no waiting for its close handshake. */
  _abandon(ws, reason) {
    this._detach(ws);
    try {
      ws.close(4000, reason.slice(0, 120));
    } catch {
      // not open yet or already closing
    }
    this._lost(1006, reason);
  }

  _detach(ws) {
    ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null;
    if (this._ws === ws) this._ws = null;
  }

  /** The current connection ended (or an attempt failed) with `code`. */
  _lost(code, reason) {
    const wasWelcomed = this._welcomed;
    this._welcomed = false;
    this._ws = null;
    this._clearTimers();
    this._rejectAll(lgError('disconnected', `connection lost (${code}${reason ? `: ${reason}` : ''})`), true);
    for (const state of this._rooms.values()) state.connectionLost();
    if (this._closed) {
      this._state = 'closed';
      this._emit('disconnected', { code, reason, reconnectInMs: null });
      return;
    }
    if (wasWelcomed && now() - this._welcomedAt >= this._timings.stableMs) this._failures = 0;
    this._afterLoss(code, reason, wasWelcomed);
  }

  /** Decides whether and when to reconnect after losing a connection with `code`. */
  _afterLoss(code, reason, wasWelcomed) {
    this._state = 'disconnected';
    if (code >= 4500 && code <= 4999) {
      this._stopped = true;
      this._state = 'stopped';
      const stopped = lgError('stopped', `server said not to reconnect (${code})`);
      this._rejectAll(stopped);
      for (const state of this._rooms.values()) for (const waiter of state.waiters.splice(0)) waiter.reject(stopped);
      this._emit('disconnected', { code, reason, reconnectInMs: null });
      return;
    }
    const delay = this._reconnectDelay(code, reason);
    this._emit('disconnected', { code, reason, reconnectInMs: delay, welcomed: wasWelcomed });
    if (this._closed || this._stopped) return;
    this._schedule(() => this._attempt(), delay);
  }

  _reconnectDelay(code, reason) {
    const t = this._timings;
    if (code === 1012 || code === 1001) {
      const hint = suggestedDelayMs(reason);
      if (hint != null) return Math.min(hint, t.maxHintMs);
      return Math.floor(this._random() * t.restartJitterMs);
    }
    const tiers = t.backoffMs;
    const tier = tiers[Math.min(this._failures, tiers.length - 1)];
    this._failures += 1;
    let delay = Math.floor(this._random() * tier);
    if (code === 4029) {
      // Migration budget spent: the reason carries the retry-after seconds.
      const seconds = firstNumber(reason);
      if (seconds != null) delay = Math.max(delay, Math.min(seconds * 1000, t.maxHintMs));
    }
    return delay;
  }

  _schedule(fn, delay) {
    clearTimeout(this._timers.reconnect);
    this._timers.reconnect = setTimeout(fn, delay);
  }

  _clearTimers() {
    clearTimeout(this._timers.reconnect);
    clearTimeout(this._timers.connect);
    clearInterval(this._timers.ping);
    this._timers = { reconnect: null, connect: null, ping: null };
  }

  _onWelcome(frame) {
    const ws = this._ws;
    clearTimeout(this._timers.connect);
    this._timers.connect = null;
    this._welcomed = true;
    this._welcomedAt = now();
    const resumed = this._session != null && frame.session === this._session;
    if (frame.session) this._session = frame.session;
    this._state = 'connected';
    const heartbeatMs = Number(frame.heartbeat_ms) || 30000;
    const pingMs = this._timings.pingMs ?? heartbeatMs;
    const idleMs = this._timings.idleMs ?? Math.round(pingMs * 2.5);
    this._timers.ping = setInterval(() => {
      if (this._ws !== ws) return;
      if (now() - this._lastHeard > idleMs) {
        this._abandon(ws, `nothing heard from the server for ${idleMs} ms`);
        return;
      }
      this._send({ op: 'ping' });
    }, pingMs);
    this._emit('connected', { session: frame.session, node: frame.node, warmup: !!frame.warmup, heartbeatMs, resumed });
    if (this._ws !== ws) return; // a listener closed the client
    for (const state of this._rooms.values()) this._sendSubscribe(state);
    for (const ref of this._queued.splice(0)) {
      const request = this._requests.get(ref);
      if (request && this._send(request.frame)) request.sent = true;
      else if (request) this._queued.push(ref);
    }
  }

  // ---- frames ----

  _send(frame) {
    const ws = this._ws;
    if (!ws || ws.readyState !== OPEN) return false;
    try {
      ws.send(JSON.stringify(frame));
      return true;
    } catch {
      return false;
    }
  }

  _request(fields) {
    const ref = this._nextRef++;
    const frame = { ...fields, ref };
    const promise = new Promise((resolve, reject) => {
      if (this._closed) return reject(lgError('closed', 'client closed'));
      if (this._stopped) return reject(lgError('stopped', 'server said not to reconnect'));
      this._requests.set(ref, { resolve, reject, frame, sent: false });
      if (this._welcomed && this._send(frame)) this._requests.get(ref).sent = true;
      else this._queued.push(ref);
    });
    return promise;
  }

  /** Rejects pending requests: all, or (onlySent) those sent on the lost connection. */
  _rejectAll(error, onlySent = false) {
    for (const [ref, request] of this._requests) {
      if (onlySent && !request.sent) continue;
      this._requests.delete(ref);
      request.reject(error);
    }
    if (!onlySent) this._queued.length = 0;
  }

  _onFrame(text) {
    let frame;
    try {
      frame = JSON.parse(typeof text === 'string' ? text : new TextDecoder().decode(text));
    } catch {
      return; // not JSON: nothing this client understands
    }
    if (!frame || typeof frame !== 'object') return;
    switch (frame.op) {
      case 'welcome':
        return this._onWelcome(frame);
      case 'subscribed':
        return this._onSubscribed(frame);
      case 'events':
        if (Array.isArray(frame.events)) {
          for (const event of frame.events) {
            const state = event && this._rooms.get(event.room);
            if (state && Number.isInteger(event.seq)) this._accept(state, event);
          }
        }
        return;
      case 'history':
      case 'unsubscribed':
      case 'pong':
        return this._reply(frame);
      case 'error':
        return this._onError(frame);
      default:
        return;
    }
  }

  _reply(frame) {
    if (frame.ref == null) return;
    const request = this._requests.get(frame.ref);
    if (!request) return;
    this._requests.delete(frame.ref);
    request.resolve(frame);
  }

  _onError(frame) {
    const request = frame.ref != null && this._requests.get(frame.ref);
    if (request) {
      this._requests.delete(frame.ref);
      request.reject(lgError(frame.code, frame.message));
      return;
    }
    const state = frame.ref != null && [...this._rooms.values()].find((s) => s.ref === frame.ref);
    if (!state) {
      this._emit('error', { code: frame.code, message: frame.message });
      return;
    }
    state.ref = null;
    state.awaiting = false;
    state.buffer = [];
    this._emit('error', { room: state.room, code: frame.code, message: frame.message });
    if (FINAL_SUBSCRIBE_ERRORS.has(frame.code)) {
      this._rooms.delete(state.room);
      for (const waiter of state.waiters.splice(0)) waiter.reject(lgError(frame.code, frame.message));
      return;
    }
    // unavailable and the like: try again shortly on this connection.
    const ws = this._ws;
    state.retry = setTimeout(() => {
      state.retry = null;
      if (this._ws === ws && this._welcomed && this._rooms.get(state.room) === state) this._sendSubscribe(state);
    }, this._timings.resubscribeMs);
  }

  // ---- rooms ----

  _sendSubscribe(state) {
    state.cancel();
    const ref = this._nextRef++;
    const frame = { op: 'subscribe', room: state.room, ref };
    if (state.last != null) {
      frame.since = state.last;
      if (state.epoch != null) frame.epoch = state.epoch;
    }
    state.ref = ref;
    state.awaiting = true;
    state.buffer = [];
    this._send(frame);
  }

  _onSubscribed(frame) {
    // Only replies to this client's own requests count: the automatic inbox
    // subscription (no ref) and replies to superseded requests are ignored.
    if (frame.ref == null) return;
    const state = this._rooms.get(frame.room);
    if (!state || state.ref !== frame.ref) return;
    state.ref = null;
    state.awaiting = false;
    const epochChanged = state.epoch != null && state.epoch !== frame.epoch;
    const head = Number(frame.seq);
    let failed = false;
    if (frame.recovered === true) {
      // The missed events follow this frame.
    } else if (frame.recovered === false) {
      failed = true;
      state.last = head;
    } else if (state.last == null || epochChanged) {
      state.last = head;
    }
    state.epoch = frame.epoch;
    state.subscribedOnce = true;
    state.lastReply = { room: frame.room, epoch: frame.epoch, seq: head, recovered: frame.recovered };
    for (const waiter of state.waiters.splice(0)) waiter.resolve(state.lastReply);
    if (failed) {
      this._emit('recovery_failed', { room: state.room, epoch: frame.epoch, seq: head, reason: 'not_recovered' });
    } else if (frame.recovered === true) {
      this._emit('recovered', { room: state.room, epoch: frame.epoch, seq: head });
    }
    if (this._rooms.get(state.room) === state) this._drain(state);
  }

  /** One event of a room from the live stream (or a replay). */
  _accept(state, event) {
    if (state.awaiting || state.filling) {
      state.buffer.push(event);
      return;
    }
    if (state.last != null && event.seq <= state.last) return; // already delivered
    if (state.last != null && event.seq > state.last + 1) {
      state.buffer.push(event);
      this._fill(state, event.seq - 1);
      return;
    }
    this._deliver(state, event);
  }

  _deliver(state, event) {
    state.last = event.seq;
    if (event.id != null) {
      if (state.ids.has(event.id)) return; // a repeat of an id already delivered
      state.ids.add(event.id);
      state.idOrder.push(event.id);
      if (state.idOrder.length > RECENT_IDS) state.ids.delete(state.idOrder.shift());
    }
    for (const handler of [...state.handlers]) {
      try {
        handler(event);
      } catch (error) {
        this._emit('error', { room: state.room, code: 'handler', message: String(error?.message ?? error), error });
      }
    }
  }

  /** Feeds the buffered events through `_accept` again, in seq order. */
  _drain(state) {
    const buffered = state.buffer.sort((a, b) => a.seq - b.seq);
    state.buffer = [];
    for (const event of buffered) this._accept(state, event);
  }

  /** Fetches the events after `state.last` up to `target` with history, then drains. */
  _fill(state, target) {
    const token = {};
    state.filling = token;
    const limit = Math.min(target - state.last, HISTORY_PAGE);
    this._request({ op: 'history', room: state.room, since: state.last, limit }).then(
      (reply) => {
        if (state.filling !== token || this._rooms.get(state.room) !== state) return;
        state.filling = null;
        if (reply.epoch !== state.epoch) {
          return this._gapLost(state, target, 'epoch_changed');
        }
        let progressed = false;
        for (const event of Array.isArray(reply.events) ? reply.events : []) {
          if (!Number.isInteger(event?.seq) || event.seq <= state.last || event.seq > target) continue;
          if (event.seq !== state.last + 1) break; // trimmed: history has a hole too
          this._deliver(state, event);
          progressed = true;
        }
        if (state.last >= target) return this._drain(state);
        if (progressed) return this._fill(state, target); // the next page
        this._gapLost(state, target, 'history_trimmed');
      },
      (error) => {
        if (state.filling !== token) return;
        state.filling = null;
        if (error?.code === 'disconnected' || error?.code === 'closed' || error?.code === 'stopped') return;
        if (this._rooms.get(state.room) === state) this._gapLost(state, target, error?.code ?? 'history_failed');
      },
    );
  }

  /** A gap history cannot fill: tell the application and go on after it. */
  _gapLost(state, target, reason) {
    state.last = Math.max(state.last, target);
    this._emit('recovery_failed', { room: state.room, epoch: state.epoch, seq: target, reason });
    if (this._rooms.get(state.room) === state) this._drain(state);
  }

  _emit(name, detail) {
    const listeners = this._listeners.get(name);
    if (!listeners || listeners.size === 0) {
      if (name === 'error' && detail?.error && typeof console !== 'undefined') {
        console.error('livegate:', detail.message, detail.error);
      }
      return;
    }
    for (const fn of [...listeners]) {
      try {
        fn(detail);
      } catch (error) {
        if (typeof console !== 'undefined') console.error(`livegate: a ${name} listener threw`, error);
      }
    }
  }
}

/** What the client knows about one subscribed room across connections. */
class RoomState {
  constructor(room) {
    this.room = room;
    this.handlers = new Set();
    this.epoch = null;
    /** Seq of the last event delivered (or the head the subscription started at). */
    this.last = null;
    this.ids = new Set();
    this.idOrder = [];
    /** Ref of the subscribe waiting for its reply. */
    this.ref = null;
    /** Waiting for `subscribed`: events are buffered. */
    this.awaiting = false;
    /** A gap is being filled: later events are buffered. */
    this.filling = null;
    this.buffer = [];
    this.retry = null;
    this.waiters = [];
    this.subscribedOnce = false;
    this.lastReply = null;
  }

  cancel() {
    clearTimeout(this.retry);
    this.retry = null;
    this.filling = null;
    this.awaiting = false;
    this.ref = null;
    this.buffer = [];
  }

  /** The connection ended: the server replays from `last` on the next one. */
  connectionLost() {
    this.cancel();
  }
}

function lgError(code, message) {
  const error = new Error(message || code);
  error.code = code;
  return error;
}

function now() {
  return Date.now();
}

/** The WebSocket endpoint for a base URL: http→ws, https→wss, `/v1/ws` appended. */
export function endpointOf(base) {
  let url = base.trim().replace(/[?#].*$/, '');
  url = url.replace(/^http(s?):\/\//i, (_, s) => `ws${s}://`);
  if (!/^wss?:\/\//i.test(url)) throw new TypeError(`livegate: not an http(s) or ws(s) URL: ${base}`);
  url = url.replace(/\/+$/, '');
  if (!/\/v1\/ws$/.test(url)) url += '/v1/ws';
  return url;
}

/** The reconnect delay a 1012/1001 close reason suggests, in ms (`reconnect in 1234 ms`). */
export function suggestedDelayMs(reason) {
  if (!reason) return null;
  const ms = /(\d+)\s*ms\b/.exec(reason);
  if (ms) return Number(ms[1]);
  return firstNumber(reason);
}

function firstNumber(text) {
  const match = /\d+/.exec(text || '');
  return match ? Number(match[0]) : null;
}
