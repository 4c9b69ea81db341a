// livegate.js: the browser and Node client of livegate (an ES module, no build step).
//
//   import { connect } from '/livegate.js';
//   const client = connect({
//     url: 'https://push.example.com',              // the server; /v1/ws and /v1/sse are derived
//     getToken: async () => (await fetch('/my-backend/livegate-token')).text(),
//     transport: 'auto',                            // 'auto' (default) | 'websocket' | 'sse'
//   });
//   client.on('connected', ({ session, node, transport }) => ...);
//   client.on('recovery_failed', ({ room }) => reloadOverHttp(room));
//   client.subscribe('match:1', (event) => render(event));   // {room, seq, id, ts_ms, from?, data}
//   const { seq, duplicate } = await client.publish('chat:1', { text: 'hi' });  // needs a
//                              // token with "publish":["chat:*"]; WebSocket only
//   client.subscribe('match:1', render, { state: true, onState: (data, { seq }) => reset(data) });
//   client.subscribe('match:1', render, { presence: true, onPresence: ({ count }) => show(count) });
//   const { count, members } = await client.presence('match:1');   // WebSocket only
//   client.transport;          // 'websocket' or 'sse': the transport in use
//   client.dropConnection();   // drop the connection to watch it reconnect and recover (demos)
//
// What it does for the application:
// - Reconnects by itself. After Close 1012 (service restart) or 1001 it waits the delay
//   the server suggests in the close reason (`... reconnect in 1234 ms`), or a random
//   0-3 s; after any other loss it backs off with full jitter in tiers (about 0, 2, 5,
//   10 s, then 30 s at most); after a Close 4500-4999 (replaced, kicked, token revoked)
//   it stops for good. It offers the session of the last `welcome` again.
// - Reconnects without your backend. Every `welcome` carries a one-time resume credential
//   and its expiry; the next attempt uses it (`resume=`, no `getToken()` call) while it has
//   not expired (counted 30 s early, `timings.resumeMarginMs`, against clock skew; once
//   an SSE response's Date header showed the server's clock off by more than 2 s, the
//   expiry is moved onto the local clock by that much).
//   `getToken()` is called only when there is no credential, it expired, or the server
//   refused it. A browser WebSocket cannot see why a handshake failed, so a credential is
//   tried in at most `resumeAttempts` (default 3) consecutive attempts that fail before
//   `welcome`, then dropped; an attempt counts only when the server was up and ready
//   (`GET /readyz` right after it got an answer other than 503): a server that is down
//   or draining never saw the credential, so a restart does not use the attempts up. Over SSE the refusal is visible (401 `resume_invalid`): the
//   credential is dropped at once. `resume: false` turns this off (a token every attempt).
//   The credential is never logged.
// - Lands on the session's node. A handshake on a node that is not the session's node
//   is refused with where to go: WebSocket close 4421 (reason: the node's URL, or the
//   `wrong_node` frame before it), SSE HTTP 421 (`{"error":{"code":"wrong_node","url",
//   "node"}}`). The client reconnects there at once with the same credential (the refusal
//   did not spend it) and session, no backoff, not a failure (at most 3 such hops in a row
//   without a welcome, then it backs off). After a welcome there, reconnects go to that
//   node first. When that node cannot be reached (and its `/readyz` does not answer), the
//   next attempt goes through the given address with `avoid=<node>`. A close 4029 or an
//   HTTP 429 (the session's migration budget) waits the retry-after seconds it carries.
//   A 1012/1001 from that node sends the next attempt through the given address. A
//   connection closed with 4421 after its welcome (its node handed the session over, a
//   rebalance) reconnects at once to the URL in the reason, with its resume credential. The
//   `redirect` event ({node, url, avoid, reason: 'wrong_node' | 'unreachable'}) tells.
// - Transports (`transport` option). `websocket`: WebSocket only. `sse`: Server-Sent
//   Events read with fetch() and a streamed body (no EventSource needed). `auto` (the
//   default): WebSocket, and SSE from then on when two WebSocket attempts in a row fail
//   before `welcome` while the server is up (a proxy that breaks the upgrade), or when
//   there is no WebSocket constructor at all. `auto` goes back to WebSocket when the SSE
//   endpoint is missing (404), or when SSE refuses the resume credential (the WebSocket
//   failures may have been that credential). The application sees the same API and events
//   either way; `client.transport` and the `connected` event say which is in use.
// - SSE specifics: the stream names its rooms (`rooms=`), so subscribe() and unsubscribe()
//   reopen it (the old request is aborted first) with the resume credential and `since=`
//   the cursor: the last `id:` seen, with every subscribed room's own position (epoch and
//   last delivered seq) written over it, so the server replays exactly what each room
//   missed. `event: close` codes follow the WebSocket close-code rules above; `: ping`
//   comments count as liveness and a stream silent for 3 heartbeats is reconnected. SSE
//   has no client requests: `history()` rejects with code `unsupported` (read history over
//   HTTP from your backend), and a gap in a room's stream is not filled with `history`
//   but by reopening the stream from the room's last delivered seq: the server replays
//   the rest exactly, or says it cannot (`recovery_failed`).
// - Client publish (DESIGN §9): `publish(room, data, {id})` sends the `publish` op and
//   resolves with `{seq, duplicate, id}` once the server has stored the event (it is then
//   durable); the token (and so each resume credential after it) must carry a `publish`
//   pattern naming the room, and inboxes (`user:…`) are never publishable. Without an `id`
//   the library makes one up, so publishing again with the resolved or rejected request's
//   id is safe: a repeat answers `duplicate: true` with the first seq. Events a client
//   published carry `from`, the publishing user, set by the server. Errors reject with
//   the server's code (`forbidden`, `bad_room`, `payload_too_large`, `rate_limited`, ...);
//   over SSE it rejects with code `unsupported` (publish from your backend instead).
// - Room state (DESIGN §9): `subscribe(room, onEvent, {state: true, onState})` asks for
//   the room's state. The `subscribed` reply carries it as of some seq S (`{seq: S, data}`,
//   or null: no state); `onState(data, {room, seq: S, epoch})` runs first, then exactly
//   the events after S are delivered (none at or below S), then live. After a reconnect
//   the usual `since` recovery runs; when the server cannot replay what was missed it
//   answers with the state again: `onState` runs again (the state replaces everything
//   delivered before), delivery continues after its seq and `recovered` is emitted with
//   `state: true` instead of `recovery_failed`: the application needs no reload. Over SSE
//   the stream asks with `state=1` when any of its rooms asked for state.
// - Presence: `subscribe(room, onEvent, {presence: true, onPresence})` hands the server's
//   presence frames to `onPresence({room, count, joined, left})` (`joined`/`left` are
//   `{user, device}` lists, null above the server's members limit; at most one frame per
//   `presence_interval_ms`, only when something changed). `presence(room)` asks who is
//   there now: `{room, count, members}` (WebSocket only; over SSE it rejects with
//   `unsupported`). Over SSE the stream asks with `presence=1`. The first subscribe of a
//   room decides whether it asks for state and presence; a later subscribe to the same
//   room adds its handlers to the same subscription. A server without room state or
//   presence (older than this library) is told no more: the room is subscribed without
//   it and an `error` with code `unsupported` says so.
// - Per room it remembers the epoch and the last seq delivered, resubscribes with
//   `since` and `epoch` after a reconnect, and hands each event to the application
//   exactly once and in seq order: events at or below the last delivered seq are
//   dropped, a gap in the live stream is filled with `history` (WebSocket) before later
//   events are delivered, and the last 500 event ids of each room are remembered so a
//   repeated id is dropped too. When the server cannot replay what was missed
//   (`recovered:false`, or a gap history no longer covers) it emits `recovery_failed` with
//   the room: reload that room's state over HTTP; delivery continues from the server's head.
//
// Works with the browser's WebSocket, Node's (22+, or 20 with --experimental-websocket)
// or any constructor with the same shape passed as `WebSocket`; SSE needs fetch() with a
// streamed response body (browsers, Node 18+).

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
   *  null: 2.5 ping intervals (WebSocket), 3 heartbeats (SSE). */
  idleMs: null,
  /** A subscribe refused as `unavailable` is tried again after this long. */
  resubscribeMs: 1000,
  /** A resume credential counts as expired this long before its expiry (clock skew). */
  resumeMarginMs: 30000,
  /** Longest wait for the `/readyz` check after a failed WebSocket attempt. */
  probeTimeoutMs: 3000,
});

/** Event ids remembered per room to drop repeats. */
export const RECENT_IDS = 500;
/** Largest SSE message (its data lines plus the line being read), in characters. */
export const MAX_SSE_MESSAGE_CHARS = 64 * 1024 * 1024;
/** Largest `limit` the server accepts for history. */
const HISTORY_PAGE = 1000;
/** Error codes that end a subscription instead of retrying it. */
const FINAL_SUBSCRIBE_ERRORS = new Set(['bad_request', 'bad_room', 'forbidden', 'too_many_subscriptions', 'unknown_op']);
/** Consecutive WebSocket attempts failing before welcome after which `auto` uses SSE. */
const WS_FAILURES_BEFORE_SSE = 2;
const TRANSPORTS = new Set(['auto', 'websocket', 'sse']);
/** Refusals (`wrong_node`) followed in a row without a welcome before backing off. */
const MAX_FOLLOWS = 3;

/**
 * Opens a client. Options:
 * - `url`: the server's base URL (http(s):// or ws(s)://; `/v1/ws` and `/v1/sse` are
 *   appended). Defaults to the page's origin in a browser.
 * - `getToken()`: returns (a promise of) a fresh one-time token, or the `{token}` reply
 *   of `POST /v1/tokens`; called for an attempt that has no usable resume credential.
 * - `transport`: `'auto'` (default), `'websocket'` or `'sse'` (see the top of this file).
 * - `resume`: false to never use resume credentials (default true).
 * - `resumeAttempts`: consecutive failed WebSocket attempts a credential is tried in
 *   before it is dropped (default 3).
 * - `WebSocket`: the constructor to use (default: the global one).
 * - `fetch`: the fetch function for SSE and the `/readyz` check (default: the global one).
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
    const transport = options.transport ?? 'auto';
    if (!TRANSPORTS.has(transport)) throw new TypeError(`livegate: transport must be 'auto', 'websocket' or 'sse', not ${transport}`);
    this._Socket = typeof (Socket || globalThis.WebSocket) === 'function' ? Socket || globalThis.WebSocket : null;
    const fetchFn = options.fetch === undefined ? globalThis.fetch : options.fetch;
    this._fetch = typeof fetchFn === 'function' ? (input, init) => fetchFn(input, init) : null;
    if (transport === 'websocket' && !this._Socket) {
      throw new TypeError('livegate: no WebSocket constructor (pass one as the WebSocket option)');
    }
    if (transport === 'sse' && !this._fetch) throw new TypeError('livegate: transport sse needs fetch()');
    if (!this._Socket && !this._fetch) {
      throw new TypeError('livegate: no WebSocket constructor and no fetch (pass one as the WebSocket option)');
    }
    const base = url ?? globalThis.location?.origin;
    if (!base) throw new TypeError('livegate: url is required outside a browser');
    this._endpoint = endpointOf(String(base));
    this._sseEndpoint = sseEndpointOf(String(base));
    this._readyz = readyzOf(this._sseEndpoint);
    this._secure = /^https:/i.test(this._sseEndpoint);
    this._transportOption = transport;
    this._transport = transport === 'sse' || !this._Socket ? 'sse' : 'websocket';
    this._getToken = getToken;
    this._timings = { ...DEFAULT_TIMINGS, ...(timings || {}) };
    this._random = typeof random === 'function' ? random : Math.random;
    this._session = session ?? null;
    this._resumeEnabled = options.resume !== false;
    this._resumeAttempts = Math.max(1, Number(options.resumeAttempts ?? 3) || 3);

    this._listeners = new Map();
    this._rooms = new Map(); // room name -> RoomState
    this._requests = new Map(); // ref -> {resolve, reject, frame}
    this._queued = []; // requests waiting for a connection: [ref, ...]
    this._nextRef = 1;

    this._ws = null; // the WebSocket of the current attempt or connection
    this._wsAttempt = null; // what that attempt used: {transport, resume, quiet}
    this._sse = null; // the SSE link ({controller, rooms, ...}) of the current attempt or stream
    this._welcomed = false;
    this._state = 'idle';
    this._closed = false; // close() called
    this._stopped = false; // the server said not to reconnect
    this._failures = 0; // attempts since the last stable connection
    this._attempts = 0;
    this._attemptGen = 0;
    this._timers = { reconnect: null, connect: null, ping: null };
    this._lastHeard = 0;
    this._welcomedAt = 0;

    /** The resume credential of the last welcome: {value, expiresAt (local clock)} or null. */
    this._resume = null;
    /** Consecutive failed attempts (server up) that used the current credential. */
    this._resumeFailures = 0;
    /** Consecutive failed WebSocket attempts (server up), for auto's fallback. */
    this._wsFailures = 0;
    /** `auto` went to SSE and found no SSE endpoint: do not go there again. */
    this._sseMissing = false;
    /** `auto` is on SSE because WebSocket attempts failed. */
    this._fellBack = false;
    /** The /readyz check of the last failed attempt; the next attempt waits for it. */
    this._verdict = null;
    /** Server clock minus local clock, from an SSE response's Date header. */
    this._skewMs = 0;
    /** The `id:` of the last SSE events message: the stream's cursor. */
    this._cursor = null;
    /** A reopen of the SSE stream (rooms changed, gap) is pending or under way. */
    this._reopenPending = false;
    this._quiet = false;
    /**
     * Where the next attempt goes instead of the given address, once: a refusal named a
     * node (`{base, node, avoid, token}`), or that node was unreachable (`{avoid, token}`:
     * the given address, told to avoid it). `token`: the unspent token to offer again.
     */
    this._target = null;
    /** The node the session lives on, after a welcome from a node a refusal named: {base, node}. */
    this._home = null;
    /** Refusals followed (and unreachable nodes avoided) since the last welcome. */
    this._follows = 0;

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

  /** The transport in use (or of the next attempt): 'websocket' or 'sse'. */
  get transport() {
    return this._transport;
  }

  /** Whether a resume credential is held for the next attempt (never the credential). */
  get hasResume() {
    return this._usableResume() != null;
  }

  /** Where delivery of a room stands: `{epoch, seq}` (seq = last delivered), or null. */
  position(room) {
    const state = this._rooms.get(room);
    return state ? { epoch: state.epoch, seq: state.last } : null;
  }

  /**
   * Listens to `connecting` ({attempt, transport}), `connected` ({session, node, warmup,
   * heartbeatMs, resumed, transport, credential: 'token' | 'resume'}), `disconnected`
   * ({code, reason, reconnectInMs: null when not reconnecting}), `transport` ({from, to,
   * reason}), `redirect` ({node, url, avoid, reason}: the next attempt goes to `url`), `recovered` ({room, epoch, seq}; with `state: true` when the server could
   * not replay but sent the room's state instead), `recovery_failed` ({room, epoch, seq,
   * reason}), `error` ({room?, code, message, error?}). Returns a function that removes
   * the listener.
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
   * room adds another handler. Over SSE the stream is reopened with the new room.
   * `options.state: true` with `options.onState(data, {room, seq, epoch})`: start from the
   * room's state (the reply then also has `state`: null or `{seq, data}`); `options.presence:
   * true` with `options.onPresence({room, count, joined, left})`: presence changes. See
   * the top of this file.
   */
  subscribe(room, onEvent, options = {}) {
    if (typeof room !== 'string' || room === '') throw new TypeError('livegate: room must be a non-empty string');
    let state = this._rooms.get(room);
    const promise = new Promise((resolve, reject) => {
      if (this._closed) return reject(lgError('closed', 'client closed'));
      if (this._stopped) return reject(lgError('stopped', 'server said not to reconnect'));
      if (state) {
        if (onEvent) state.handlers.add(onEvent);
        state.addHandlers(options);
        if (state.subscribedOnce) resolve(state.lastReply);
        else state.waiters.push({ resolve, reject });
        return;
      }
      state = new RoomState(room);
      if (onEvent) state.handlers.add(onEvent);
      state.wantState = options.state === true;
      state.wantPresence = options.presence === true;
      state.addHandlers(options);
      if (options.since != null) {
        state.last = Number(options.since);
        state.epoch = options.epoch ?? null;
      }
      state.waiters.push({ resolve, reject });
      this._rooms.set(room, state);
      if (this._sse) this._roomsChanged();
      else if (this._welcomed) this._sendSubscribe(state);
    });
    promise.catch(() => {}); // the caller may ignore it; errors also go to 'error'
    return promise;
  }

  /** Stops delivering the room and tells the server (over SSE: reopens the stream). */
  unsubscribe(room) {
    const state = this._rooms.get(room);
    if (!state) return;
    this._rooms.delete(room);
    state.cancel();
    for (const waiter of state.waiters.splice(0)) waiter.reject(lgError('unsubscribed', `unsubscribed from ${room}`));
    if (this._sse) this._roomsChanged();
    else if (this._welcomed) this._send({ op: 'unsubscribe', room });
  }

  /**
   * Asks the server for up to `limit` events of `room` after `since`. Resolves with the
   * `history` reply `{room, epoch, head, events, complete}`; rejects on an `error` reply,
   * when the connection is lost before the reply, or on close(). While disconnected the
   * request waits for the next connection. Over SSE (no client requests) it rejects with
   * code `unsupported`.
   */
  history(room, since = 0, limit = 100) {
    return this._request({ op: 'history', room, since, limit });
  }

  /**
   * Publishes `data` (any JSON value) to `room` as this connection's user. Resolves with
   * `{seq, duplicate, id}` once the server has stored the event; rejects with the server's
   * error code (`forbidden` outside the token's `publish` patterns, `bad_room`,
   * `payload_too_large`, `rate_limited`, `bad_request`), when the connection is lost after
   * the request went out (publish again with the same `id`: at most once is stored), or
   * on close(). While disconnected the request waits for the next connection. Over SSE it
   * rejects with code `unsupported`. `id`: the idempotency id (default: a random one).
   */
  publish(room, data, { id } = {}) {
    const eventId = id ?? `c-${randomHex(8)}`;
    return this._request({ op: 'publish', room, id: eventId, data }).then((reply) => ({
      seq: reply.seq,
      duplicate: reply.duplicate === true,
      id: eventId,
    }));
  }

  /**
   * Asks who is in `room` now (the `presence` op). Resolves with `{room, count, members}`:
   * `members` lists the distinct `{user, device}` pairs with a subscription to the room
   * (null above the server's `presence_members_max`); the token must allow reading the
   * room. Rejects with the server's error code (`forbidden`, `bad_room`, `presence_off`
   * for a room whose namespace turns presence off, ...), when the connection is lost
   * after the request went out, or on close(). Over SSE it rejects with `unsupported`
   * (ask `GET /v1/rooms/{room}/presence` from your backend instead).
   */
  presence(room) {
    return this._request({ op: 'presence', room }).then((reply) => ({
      room: reply.room,
      count: Number(reply.count),
      members: Array.isArray(reply.members) ? reply.members : null,
    }));
  }

  /**
   * Drops the current connection as if it had been lost (to watch recovery in a demo, or
   * in tests): the socket is closed with 4000 (the SSE request aborted), `disconnected`
   * follows with that code, and the client reconnects by its backoff and resubscribes
   * every room with `since`, like after any other loss. Returns false when there is no
   * connection to drop.
   */
  dropConnection(reason = 'dropped by the application') {
    if (this._closed || this._stopped) return false;
    const ws = this._ws;
    const sse = this._sse;
    if (!ws && !sse) return false;
    if (ws) {
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
    }
    if (sse) this._detachSse(sse);
    this._lost(4000, reason);
    return true;
  }

  /** Closes the connection for good: no reconnect, pending requests are rejected. */
  close() {
    if (this._closed) return;
    this._closed = true;
    const ws = this._ws;
    const sse = this._sse;
    this._clearTimers();
    if (ws || sse) {
      if (ws) {
        this._detach(ws);
        try {
          ws.close(1000, 'client closed');
        } catch {
          // already closing
        }
      }
      if (sse) this._detachSse(sse);
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

  // ---- credentials ----

  /** The resume credential to use now, or null (none, expired, or resume is off). */
  _usableResume() {
    const held = this._resume;
    if (!held || !this._resumeEnabled) return null;
    if (now() >= held.expiresAt - this._timings.resumeMarginMs) {
      this._resume = null;
      return null;
    }
    return held.value;
  }

  /** Keeps the welcome's credential, its expiry moved onto the local clock. */
  _keepResume(frame, receivedAt) {
    this._resumeFailures = 0;
    if (!this._resumeEnabled || typeof frame.resume !== 'string' || frame.resume === '') {
      this._resume = null;
      return;
    }
    const expires = Number(frame.resume_expires_at_ms);
    // Without an expiry, trust it for a minute after receipt.
    const expiresAt = Number.isFinite(expires) && expires > 0 ? expires - this._skewMs : receivedAt + 60000;
    this._resume = { value: frame.resume, expiresAt };
  }

  _dropResume() {
    this._resume = null;
    this._resumeFailures = 0;
  }

  // ---- connection lifecycle ----

  async _attempt() {
    this._timers.reconnect = null;
    if (this._closed || this._stopped) return;
    const gen = ++this._attemptGen;
    if (this._verdict) {
      await this._verdict;
      if (gen !== this._attemptGen || this._closed || this._stopped) return;
    }
    this._attempts += 1;
    const transport = this._transport;
    const quiet = this._quiet;
    this._quiet = false;
    // A refusal's node (or the given address avoiding an unreachable one), else the node
    // the session lives on, else the given address.
    const target = this._target;
    const where = target ?? this._home;
    if (!quiet) {
      this._state = 'connecting';
      this._emit('connecting', { attempt: this._attempts, transport });
    }
    const resume = this._usableResume();
    let token = null;
    if (resume == null && target?.token) {
      token = target.token; // refused unspent (or never seen): offered again
    } else if (resume == null) {
      try {
        token = await this._getToken();
        if (token && typeof token === 'object') token = token.token;
        if (typeof token !== 'string' || token === '') throw new Error('getToken returned no token');
      } catch (error) {
        if (this._closed || gen !== this._attemptGen) return;
        this._emit('error', { code: 'token', message: `getToken failed: ${error?.message ?? error}`, error });
        this._afterLoss(1006, 'getToken failed', false);
        return;
      }
      if (this._closed || this._stopped || gen !== this._attemptGen) return;
    }
    if (this._target === target) this._target = null;
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
    if (transport === 'sse') this._openSse(attempt, token);
    else this._openWebSocket(attempt, token);
  }

  /** The credential part of an attempt's query string. */
  _credentialQuery(attempt, token) {
    let query;
    if (attempt.resume != null) query = `resume=${encodeURIComponent(attempt.resume)}`;
    else {
      query = `token=${encodeURIComponent(token)}`;
      if (this._session) query += `&session=${encodeURIComponent(this._session)}`;
    }
    if (attempt.avoid != null) query += `&avoid=${encodeURIComponent(attempt.avoid)}`;
    return query;
  }

  _openWebSocket(attempt, token) {
    const endpoint = attempt.base ? endpointOf(attempt.base) : this._endpoint;
    const url = `${endpoint}?${this._credentialQuery(attempt, token)}`;
    let ws;
    try {
      ws = new this._Socket(url);
    } catch (error) {
      // The message of a constructor error may quote the URL: never pass it on.
      this._emit('error', { code: 'socket', message: 'cannot open a WebSocket' });
      this._afterLoss(1006, 'cannot open a WebSocket', false);
      return;
    }
    this._ws = ws;
    this._wsAttempt = attempt;
    this._welcomed = false;
    this._lastHeard = now();
    ws.onopen = () => {
      attempt.opened = true;
    };
    ws.onmessage = (message) => {
      if (this._ws !== ws) return;
      this._lastHeard = now();
      this._onFrame(message.data);
    };
    ws.onerror = () => {}; // a close event follows
    ws.onclose = (event) => {
      if (this._ws !== ws) return;
      this._detach(ws);
      this._lost(event?.code ?? 1006, event?.reason ?? '', attempt);
    };
    this._timers.connect = setTimeout(() => {
      if (this._ws !== ws || this._welcomed) return;
      this._abandon(`no welcome within ${this._timings.connectTimeoutMs} ms`);
    }, this._timings.connectTimeoutMs);
  }

  /** Opens an SSE stream for the current rooms with `since` = the cursor. */
  async _openSse(attempt, token) {
    const rooms = [...this._rooms.keys()];
    const endpoint = attempt.base ? sseEndpointOf(attempt.base) : this._sseEndpoint;
    let url = `${endpoint}?${this._credentialQuery(attempt, token)}&rooms=${rooms.map(encodeURIComponent).join(',')}`;
    const since = this._sseSince();
    if (since) url += `&since=${encodeURIComponent(since)}`;
    // The stream's flags apply to all its rooms; a room that did not ask ignores them.
    const subscriptions = [...this._rooms.values()];
    if (subscriptions.some((state) => state.wantState)) url += '&state=1';
    if (subscriptions.some((state) => state.wantPresence)) url += '&presence=1';
    const controller = new AbortController();
    const link = { controller, rooms: new Set(rooms), attempt, dead: false };
    this._sse = link;
    this._welcomed = false;
    this._lastHeard = now();
    this._timers.connect = setTimeout(() => {
      if (this._sse !== link || this._welcomed) return;
      this._abandon(`no welcome within ${this._timings.connectTimeoutMs} ms`);
    }, this._timings.connectTimeoutMs);
    let response;
    try {
      response = await this._fetch(url, { signal: controller.signal, cache: 'no-store', headers: { Accept: 'text/event-stream' } });
    } catch (error) {
      if (this._sse !== link) return;
      this._detachSse(link);
      this._lost(1006, `SSE request failed: ${error?.cause?.code ?? error?.message ?? error}`, attempt);
      return;
    }
    if (this._sse !== link) {
      cancelBody(response);
      return;
    }
    attempt.opened = true;
    const date = Date.parse(response.headers?.get?.('date') ?? '');
    if (Number.isFinite(date)) this._skewMs = Math.abs(date - now()) > 2000 ? date - now() : 0;
    if (!response.ok) return this._sseRefused(link, response);
    if (!response.body?.getReader) {
      this._detachSse(link);
      this._emit('error', { code: 'sse', message: 'this fetch() gives no streamed response body' });
      this._lost(1006, 'no streamed body', attempt);
      return;
    }
    const reader = response.body.getReader();
    link.reader = reader;
    const decoder = new TextDecoder();
    const parser = new EventStreamParser(
      (message) => this._sse === link && this._onSseMessage(link, message),
      () => {},
    );
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (this._sse !== link) return;
        if (done) break;
        this._lastHeard = now();
        parser.push(decoder.decode(value, { stream: true }));
        if (this._sse !== link) return;
      }
      parser.push(decoder.decode());
      parser.end();
    } catch (error) {
      if (this._sse !== link) return;
      this._detachSse(link);
      this._lost(1006, `SSE stream broke: ${error?.cause?.code ?? error?.name ?? 'error'}`, attempt);
      return;
    }
    if (this._sse !== link) return;
    this._detachSse(link);
    this._lost(1006, 'SSE stream ended', attempt);
  }

  /** `since=` of the next SSE request: the last `id:` with each room's own position over it. */
  _sseSince() {
    const entries = new Map();
    for (const entry of (this._cursor ?? '').split(',')) {
      const seqAt = entry.lastIndexOf(':');
      const epochAt = seqAt > 0 ? entry.lastIndexOf(':', seqAt - 1) : -1;
      if (epochAt > 0) entries.set(entry.slice(0, epochAt), entry);
    }
    for (const state of this._rooms.values()) {
      if (state.epoch != null && state.last != null) entries.set(state.room, `${state.room}:${state.epoch}:${state.last}`);
    }
    return [...entries.values()].join(',');
  }

  /** A non-2xx answer to an SSE request. */
  async _sseRefused(link, response) {
    let body = null;
    try {
      body = await response.json();
    } catch {
      // not JSON
    }
    if (this._sse !== link) return;
    this._detachSse(link);
    const status = response.status;
    const code = body?.error?.code ?? `http_${status}`;
    const message = String(body?.error?.message ?? `HTTP ${status}`);
    const attempt = link.attempt;
    if (status === 421 && code === 'wrong_node') {
      // Not this node's session: the body names the node to use (not an error).
      attempt.named = { url: body.error.url, node: body.error.node };
      this._lost(4421, String(body.error.url ?? ''), attempt);
      return;
    }
    if (status === 429) {
      // Told to wait (the migration budget, or a rate limit): Retry-After seconds.
      const seconds = firstNumber(response.headers?.get?.('retry-after') ?? '') ?? firstNumber(message);
      this._emit('error', { code, message: `SSE request refused: HTTP ${status} ${code}` });
      this._lost(4029, seconds != null ? String(seconds) : '', attempt);
      return;
    }
    if (code === 'resume_invalid') {
      this._dropResume();
      if (this._fellBack) {
        // The WebSocket failures that brought auto here may have been this credential.
        this._switchTransport('websocket', 'resume credential refused over SSE');
      }
    } else if (status === 404 && this._transportOption === 'auto' && this._Socket) {
      this._sseMissing = true;
      this._switchTransport('websocket', 'the server has no SSE endpoint');
    } else if (['bad_room', 'too_many_subscriptions', 'forbidden'].includes(code)) {
      // A room of the request was refused: the rooms not yet subscribed are the suspects
      // (only the one the message names, when it names one).
      const fresh = [...link.rooms].filter((room) => this._rooms.get(room) && !this._rooms.get(room).subscribedOnce);
      const named = fresh.filter((room) => message.includes(room));
      for (const room of named.length ? named : fresh) {
        const state = this._rooms.get(room);
        this._rooms.delete(room);
        state.cancel();
        this._emit('error', { room, code, message });
        for (const waiter of state.waiters.splice(0)) waiter.reject(lgError(code, message));
      }
    }
    this._emit('error', { code, message: `SSE request refused: HTTP ${status} ${code}` });
    this._lost(1006, `HTTP ${status} ${code}`, attempt);
  }

  _onSseMessage(link, message) {
    if (message.type === 'close') {
      let detail = {};
      try {
        detail = JSON.parse(message.data);
      } catch {
        // no detail
      }
      this._detachSse(link);
      this._lost(Number(detail?.code) || 1006, String(detail?.reason ?? ''), link.attempt);
      return;
    }
    if (message.data === '') return;
    this._onFrame(message.data);
    if (message.type === 'events' && message.id != null && this._sse === link) this._cursor = message.id;
  }

  /** Subscriptions changed while on SSE: reopen the stream (once the current one is welcomed). */
  _roomsChanged() {
    const link = this._sse;
    if (!link || !this._welcomed || this._reopenPending) return; // a welcome compares the rooms
    this._reopenPending = true;
    setTimeout(() => {
      this._reopenPending = false;
      if (this._sse !== link || this._closed || this._stopped) return;
      if (sameSet(link.rooms, this._rooms)) return;
      this._reopen(link);
    }, 0);
  }

  /** Ends the stream `link` and opens the next at once, without telling the app. */
  _reopen(link) {
    this._detachSse(link);
    this._welcomed = false;
    clearTimeout(this._timers.connect);
    clearInterval(this._timers.ping);
    this._timers.connect = this._timers.ping = null;
    for (const state of this._rooms.values()) state.connectionLost();
    this._quiet = true;
    this._schedule(() => this._attempt(), 0);
  }

  /** Gives up on the current attempt or connection: no waiting for a close handshake. */
  _abandon(reason) {
    const ws = this._ws;
    const sse = this._sse;
    const attempt = ws ? this._wsAttempt : sse?.attempt;
    if (ws) {
      this._detach(ws);
      try {
        ws.close(4000, reason.slice(0, 120));
      } catch {
        // not open yet or already closing
      }
    }
    if (sse) this._detachSse(sse);
    this._lost(1006, reason, attempt);
  }

  _detach(ws) {
    ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null;
    if (this._ws === ws) this._ws = null;
  }

  _detachSse(link) {
    if (!link.dead) {
      link.dead = true;
      try {
        link.reader?.cancel().catch(() => {});
      } catch {
        // already done
      }
      link.controller.abort();
    }
    if (this._sse === link) this._sse = null;
  }

  /** The current connection ended (or an attempt failed) with `code`. */
  _lost(code, reason, attempt = null) {
    const wasWelcomed = this._welcomed;
    this._welcomed = false;
    this._ws = null;
    this._sse = null;
    this._clearTimers();
    this._rejectAll(lgError('disconnected', `connection lost (${code}${reason ? `: ${reason}` : ''})`), true);
    for (const state of this._rooms.values()) state.connectionLost();
    if (this._closed) {
      this._state = 'closed';
      this._emit('disconnected', { code, reason, reconnectInMs: null });
      return;
    }
    if (wasWelcomed && now() - this._welcomedAt >= this._timings.stableMs) this._failures = 0;
    if (wasWelcomed && (code === 1012 || code === 1001) && attempt?.base) {
      // The node restarts or goes away: the given address knows where the session goes.
      this._home = null;
    }
    const told = code >= 4500 && code <= 4999;
    if (wasWelcomed && code === 4421 && this._handedOver(code, reason)) return;
    if (!wasWelcomed && attempt && code === 4421 && this._follow(attempt, code, reason)) return;
    if (!wasWelcomed && attempt?.base && !attempt.opened && !told) {
      this._unreached(attempt, code, reason);
      return;
    }
    // 4421 and 4029 are refusals the server explained: the credential was not spent.
    if (!wasWelcomed && attempt && attempt.transport === 'websocket' && !told && code !== 4421 && code !== 4029) {
      this._judgeWebSocketFailure(attempt);
    }
    this._afterLoss(code, reason, wasWelcomed);
  }

  /**
   * A connection that was welcomed and then closed with 4421: its node handed the session
   * over to the node whose URL is the reason (an operator's rebalance). Reconnect there at
   * once with the resume credential the welcome gave (else a new token), no backoff, not
   * a failure. False (an ordinary loss) when the reason is no usable URL.
   */
  _handedOver(code, reason) {
    const text = String(reason ?? '').trim();
    if (!/^(https?|wss?):\/\//i.test(text)) return false;
    let base;
    try {
      base = baseOf(text);
    } catch {
      return false;
    }
    // Never from https to plain http: the credential would travel in the clear.
    if (this._secure && !/^https:/i.test(base)) return false;
    this._target = { base, node: null, avoid: null, token: null };
    this._home = null;
    this._state = 'disconnected';
    this._emit('disconnected', { code, reason, reconnectInMs: 0, welcomed: true });
    this._emit('redirect', { node: null, url: base, avoid: null, reason: 'wrong_node' });
    this._schedule(() => this._attempt(), 0);
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
    const url = /^(https?|wss?):\/\//i.test(text) ? text : String(attempt.named?.url ?? '');
    let base;
    try {
      base = baseOf(url);
    } catch {
      return false;
    }
    // Never from https to plain http: the credential would travel in the clear.
    if (this._secure && !/^https:/i.test(base)) return false;
    if (this._follows >= MAX_FOLLOWS) {
      this._follows = 0;
      this._target = null;
      return false;
    }
    this._follows += 1;
    const node = typeof attempt.named?.node === 'string' ? attempt.named.node : null;
    // An attempt that avoided an unreachable node keeps avoiding it down the chain.
    this._target = { base, node, avoid: attempt.avoid, token: attempt.token };
    this._state = 'disconnected';
    this._emit('disconnected', { code, reason, reconnectInMs: 0, welcomed: false });
    this._emit('redirect', { node, url: base, avoid: attempt.avoid, reason: 'wrong_node' });
    this._schedule(() => this._attempt(), 0);
    return true;
  }

  /**
   * An attempt to a node a refusal named (or the session's node) failed before the server
   * answered. If the node's `/readyz` does not answer either (or says draining), it is
   * unreachable: reconnect at once through the given address, asking it to avoid the node
   * (the token, never seen, is offered again). Otherwise the attempt failed like any other.
   */
  async _unreached(attempt, code, reason) {
    this._state = 'disconnected';
    const gen = this._attemptGen;
    const reachable = attempt.transport === 'websocket' && this._fetch ? await this._serverReady(readyzOf(sseEndpointOf(attempt.base))) : false;
    if (this._closed || this._stopped || gen !== this._attemptGen || this._ws || this._sse) return;
    if (reachable) {
      if (attempt.transport === 'websocket') this._judgeWebSocketFailure(attempt, true);
      this._afterLoss(code, reason, false);
      return;
    }
    this._home = null;
    if (attempt.node == null || this._follows >= MAX_FOLLOWS) {
      this._follows = 0;
      this._afterLoss(code, reason, false); // the given address next, after a backoff
      return;
    }
    this._follows += 1;
    this._target = { base: null, node: null, avoid: attempt.node, token: attempt.token };
    this._emit('disconnected', { code, reason, reconnectInMs: 0, welcomed: false });
    this._emit('redirect', { node: null, url: this._sseEndpoint.replace(/\/v1\/sse$/, ''), avoid: attempt.node, reason: 'unreachable' });
    this._schedule(() => this._attempt(), 0);
  }

  /**
   * A WebSocket attempt failed before welcome, for a reason the browser does not show.
   * If the server is up and ready (it could have looked at the credential, the upgrade
   * could have gone through), the failure counts against the resume credential and, in
   * `auto`, towards the SSE fallback; a server down or draining counts for nothing.
   */
  _judgeWebSocketFailure(attempt, ready = false) {
    const counts = () => {
      if (attempt.resume != null && this._resume?.value === attempt.resume) {
        this._resumeFailures += 1;
        if (this._resumeFailures >= this._resumeAttempts) this._dropResume();
      }
      if (this._transportOption === 'auto' && this._fetch && !this._sseMissing && this._transport === 'websocket') {
        this._wsFailures += 1;
        if (this._wsFailures >= WS_FAILURES_BEFORE_SSE) this._switchTransport('sse', `${this._wsFailures} WebSocket attempts in a row failed`);
      }
    };
    const needed = attempt.resume != null || (this._transportOption === 'auto' && this._fetch && !this._sseMissing);
    if (!needed) return;
    if (!this._fetch || ready) return counts();
    const readyz = attempt.base ? readyzOf(sseEndpointOf(attempt.base)) : this._readyz;
    const previous = this._verdict;
    const verdict = (async () => {
      await previous;
      if (await this._serverReady(readyz)) counts();
    })();
    this._verdict = verdict;
    verdict.finally(() => {
      if (this._verdict === verdict) this._verdict = null;
    });
  }

  /** `GET /readyz`: true when the server answered and is not draining or starting. */
  async _serverReady(readyz = this._readyz) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), this._timings.probeTimeoutMs);
    try {
      // The server answers /readyz with CORS headers for the origins it allows, so a page
      // on another origin reads the status too (a draining node's 503 must not count).
      const init = { signal: controller.signal, cache: 'no-store' };
      const response = await this._fetch(readyz, init);
      cancelBody(response);
      return response.status !== 503;
    } catch {
      return false;
    } finally {
      clearTimeout(timer);
    }
  }

  _switchTransport(to, reason) {
    const from = this._transport;
    if (from === to) return;
    this._transport = to;
    this._wsFailures = 0;
    this._fellBack = to === 'sse' && this._transportOption === 'auto';
    if (to === 'sse') this._rejectAll(lgError('unsupported', 'history, publish and presence need the WebSocket transport (now on SSE)'));
    this._emit('transport', { from, to, reason });
  }

  /** Decides whether and when to reconnect after losing a connection with `code`. */
  _afterLoss(code, reason, wasWelcomed) {
    this._state = 'disconnected';
    if (code >= 4500 && code <= 4999) {
      this._stopped = true;
      this._state = 'stopped';
      this._dropResume();
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
    const sse = this._sse;
    const link = ws ?? sse;
    const attempt = (ws ? this._wsAttempt : sse?.attempt) ?? { quiet: false, resume: null };
    clearTimeout(this._timers.connect);
    this._timers.connect = null;
    this._welcomed = true;
    this._welcomedAt = now();
    this._keepResume(frame, this._welcomedAt);
    if (ws) this._wsFailures = 0;
    this._follows = 0;
    // Welcomed by a node a refusal named: the session lives there, reconnects go there first.
    this._home = attempt.base ? { base: attempt.base, node: typeof frame.node === 'string' ? frame.node : attempt.node } : null;
    const resumed = this._session != null && frame.session === this._session;
    if (frame.session) this._session = frame.session;
    this._state = 'connected';
    const heartbeatMs = Number(frame.heartbeat_ms) || 30000;
    const pingMs = this._timings.pingMs ?? heartbeatMs;
    const idleMs = this._timings.idleMs ?? Math.round(pingMs * (sse ? 3 : 2.5));
    this._timers.ping = setInterval(() => {
      if ((this._ws ?? this._sse) !== link) return;
      if (now() - this._lastHeard > idleMs) {
        this._abandon(`nothing heard from the server for ${idleMs} ms`);
        return;
      }
      if (ws) this._send({ op: 'ping' }); // over SSE the server's `: ping` comments do
    }, sse ? Math.min(pingMs, idleMs) : pingMs);
    if (sse) {
      // The stream subscribes its rooms itself: each one's `subscribed` comes next.
      for (const room of sse.rooms) {
        const state = this._rooms.get(room);
        if (!state) continue;
        state.cancel();
        state.ref = 'sse';
        state.awaiting = true;
        state.quiet = attempt.quiet && state.subscribedOnce;
      }
      this._rejectAll(lgError('unsupported', 'history, publish and presence need the WebSocket transport (connected over SSE)'));
    }
    if (!attempt.quiet) {
      this._emit('connected', {
        session: frame.session,
        node: frame.node,
        warmup: !!frame.warmup,
        heartbeatMs,
        resumed,
        transport: sse ? 'sse' : 'websocket',
        credential: attempt.resume != null ? 'resume' : 'token',
      });
    }
    if ((this._ws ?? this._sse) !== link) return; // a listener closed the client
    if (sse) {
      if (!sameSet(sse.rooms, this._rooms)) {
        // Rooms changed while this stream was being opened.
        this._reopenPending = false;
        this._roomsChanged();
      }
      return;
    }
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
      if (this._transport === 'sse') {
        return reject(lgError('unsupported', `${fields.op} needs the WebSocket transport (SSE has no client requests)`));
      }
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
    if (frame.op === 'error' && frame.code === 'wrong_node' && !this._welcomed) {
      // The 4421 close that follows names the node; this frame too (when the URL is too long for the reason).
      const attempt = this._ws ? this._wsAttempt : this._sse?.attempt;
      if (attempt) attempt.named = { url: frame.url, node: frame.node };
      return;
    }
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
      case 'presence':
        return this._onPresence(frame);
      case 'history':
      case 'published':
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
    const unknown = frame.code === 'bad_request' && /unknown field `(state|presence)`/.exec(String(frame.message ?? ''));
    if (unknown && (unknown[1] === 'state' ? state.wantState : state.wantPresence)) {
      // A server older than room state or presence refuses the flag: go on without it.
      if (unknown[1] === 'state') state.wantState = false;
      else state.wantPresence = false;
      const what = unknown[1] === 'state' ? 'room state' : 'presence';
      this._emit('error', { room: state.room, code: 'unsupported', message: `the server has no ${what}: subscribed without it` });
      this._sendSubscribe(state);
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
    if (state.wantState) frame.state = true;
    if (state.wantPresence) frame.presence = true;
    state.ref = ref;
    state.awaiting = true;
    state.buffer = [];
    this._send(frame);
  }

  _onSubscribed(frame) {
    const state = this._rooms.get(frame.room);
    if (this._sse) {
      // SSE: one `subscribed` per requested room, right after welcome, without a ref
      // (the automatic inbox's notice has no epoch: not a reply).
      if (!state || state.ref !== 'sse' || frame.epoch == null) return;
    } else {
      // Only replies to this client's own requests count: the automatic inbox
      // subscription (no ref) and replies to superseded requests are ignored.
      if (frame.ref == null) return;
      if (!state || state.ref !== frame.ref) return;
    }
    const quiet = state.quiet;
    state.quiet = false;
    state.ref = null;
    state.awaiting = false;
    const epochChanged = state.epoch != null && state.epoch !== frame.epoch;
    const head = Number(frame.seq);
    // The room's state, when this room asked for it and the reply starts from it (a first
    // subscribe, or a recovery that failed): null (none) or {seq, data}.
    const snapshot = state.wantState && frame.recovered !== true ? snapshotOf(frame) : undefined;
    let failed = false;
    state.fromNothing = false;
    if (frame.recovered === true) {
      // The missed events follow this frame.
    } else if (snapshot !== undefined) {
      // The state stands for every event up to its seq: only the events after it follow
      // (again, after a failed recovery: the state replaces what was delivered before).
      state.last = snapshot ? snapshot.seq : 0;
      state.fromNothing = snapshot == null;
      state.ids.clear();
      state.idOrder = [];
    } else if (frame.recovered === false) {
      failed = true;
      state.last = head;
    } else if (state.last == null || epochChanged) {
      state.last = head;
    }
    state.epoch = frame.epoch;
    state.subscribedOnce = true;
    state.lastReply = { room: frame.room, epoch: frame.epoch, seq: head, recovered: frame.recovered };
    if (snapshot !== undefined) state.lastReply.state = snapshot;
    for (const waiter of state.waiters.splice(0)) waiter.resolve(state.lastReply);
    if (state.wantState && frame.recovered == null && snapshot === undefined) {
      this._emit('error', { room: state.room, code: 'unsupported', message: 'the server sent no room state (it predates room state)' });
    }
    if (snapshot !== undefined) {
      const meta = { room: state.room, seq: state.last, epoch: frame.epoch };
      for (const handler of [...state.stateHandlers]) {
        try {
          handler(snapshot ? snapshot.data : null, meta);
        } catch (error) {
          this._emit('error', { room: state.room, code: 'handler', message: String(error?.message ?? error), error });
        }
      }
      if (frame.recovered === false && !quiet) {
        this._emit('recovered', { room: state.room, epoch: frame.epoch, seq: state.last, state: true });
      }
    } else if (failed) {
      this._emit('recovery_failed', { room: state.room, epoch: frame.epoch, seq: head, reason: 'not_recovered' });
    } else if (frame.recovered === true && !quiet) {
      this._emit('recovered', { room: state.room, epoch: frame.epoch, seq: head });
    }
    if (this._rooms.get(state.room) === state) this._drain(state);
  }

  /** A `presence` frame: the reply to `presence()` (it has a ref), or a room's changes. */
  _onPresence(frame) {
    if (frame.ref != null) return this._reply(frame); // a reply (maybe to a request given up)
    const state = typeof frame.room === 'string' ? this._rooms.get(frame.room) : null;
    if (!state || state.presenceHandlers.size === 0) return;
    const detail = {
      room: frame.room,
      count: Number(frame.count),
      joined: Array.isArray(frame.joined) ? frame.joined : null,
      left: Array.isArray(frame.left) ? frame.left : null,
    };
    for (const handler of [...state.presenceHandlers]) {
      try {
        handler(detail);
      } catch (error) {
        this._emit('error', { room: state.room, code: 'handler', message: String(error?.message ?? error), error });
      }
    }
  }

  /** One event of a room from the live stream (or a replay). */
  _accept(state, event) {
    if (state.awaiting || state.filling) {
      state.buffer.push(event);
      return;
    }
    if (state.last != null && event.seq <= state.last) return; // already delivered
    if (state.fromNothing) {
      // The room had no state: its view starts with the first event that follows,
      // wherever the retained history starts.
      state.fromNothing = false;
    } else if (state.last != null && event.seq > state.last + 1) {
      if (this._sse) {
        // No history requests over SSE: reopen the stream from the last delivered seq,
        // which the server replays exactly (or answers recovered:false).
        state.awaiting = true;
        state.buffer = [];
        const link = this._sse;
        setTimeout(() => {
          if (this._sse === link && !this._closed && !this._stopped) this._reopen(link);
        }, 0);
        return;
      }
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
    /** Reopened SSE stream: its `recovered` is not news to the app. */
    this.quiet = false;
    /** Subscribed with `state: true` / `presence: true` (decided by the first subscribe). */
    this.wantState = false;
    this.wantPresence = false;
    this.stateHandlers = new Set();
    this.presenceHandlers = new Set();
    /** Started from "no state": the first event after the reply is delivered, gap or not. */
    this.fromNothing = false;
  }

  /** The `onState` / `onPresence` handlers of a subscribe's options. */
  addHandlers(options) {
    if (typeof options.onState === 'function') this.stateHandlers.add(options.onState);
    if (typeof options.onPresence === 'function') this.presenceHandlers.add(options.onPresence);
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

/** `bytes` random bytes as hex (crypto when there is one: ids must not repeat). */
function randomHex(bytes) {
  const buffer = new Uint8Array(bytes);
  if (globalThis.crypto?.getRandomValues) globalThis.crypto.getRandomValues(buffer);
  else for (let i = 0; i < bytes; i++) buffer[i] = Math.floor(Math.random() * 256);
  return Array.from(buffer, (b) => b.toString(16).padStart(2, '0')).join('');
}

function lgError(code, message) {
  const error = new Error(message || code);
  error.code = code;
  return error;
}

function now() {
  return Date.now();
}

/**
 * The room state a `subscribed` reply carries: undefined when it has no `state` key (a
 * recovered reply, or a server without room state), null for "no state", else
 * `{seq, data}` (a state without a usable seq counts as none).
 */
function snapshotOf(frame) {
  if (!Object.prototype.hasOwnProperty.call(frame, 'state')) return undefined;
  const state = frame.state;
  if (!state || typeof state !== 'object' || !Number.isInteger(state.seq) || state.seq < 0) return null;
  return { seq: state.seq, data: state.data === undefined ? null : state.data };
}

/** The `/readyz` of the node whose SSE endpoint is `sseEndpoint`. */
function readyzOf(sseEndpoint) {
  return sseEndpoint.replace(/\/v1\/sse$/, '/readyz');
}

/** The http(s) base URL of a node (its `public_url`, ws(s):// accepted), without a path to /v1. */
function baseOf(url) {
  return sseEndpointOf(url).replace(/\/v1\/sse$/, '');
}

/** The SSE endpoint for a base URL: ws→http, wss→https, `/v1/sse` in place of `/v1/ws`. */
export function sseEndpointOf(base) {
  let url = base.trim().replace(/[?#].*$/, '');
  url = url.replace(/^ws(s?):\/\//i, (_, s) => `http${s}://`);
  if (!/^https?:\/\//i.test(url)) throw new TypeError(`livegate: not an http(s) or ws(s) URL: ${base}`);
  url = url.replace(/\/+$/, '').replace(/\/v1\/(ws|sse)$/, '');
  return `${url}/v1/sse`;
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

/** Whether the set `a` holds exactly the keys of the map (or set) `b`. */
function sameSet(a, b) {
  if (a.size !== b.size) return false;
  for (const key of b.keys()) if (!a.has(key)) return false;
  return true;
}

/** Stops reading a response body nobody needs. */
function cancelBody(response) {
  try {
    response?.body?.cancel?.().catch(() => {});
  } catch {
    // locked or gone
  }
}

/**
 * A `text/event-stream` parser (the HTML standard's rules): lines end with `\r\n`, `\n`
 * or `\r` (also split across chunks); `data:` lines of one message are joined with `\n`;
 * one space after the colon is dropped; `: comment` lines go to `onComment`; a blank line
 * dispatches `{type, data, id}` (type `message` when no `event:` was given, `id` the
 * message's own `id:` or undefined). A message over `maxChars` throws a RangeError.
 */
export class EventStreamParser {
  constructor(onMessage, onComment = () => {}, maxChars = MAX_SSE_MESSAGE_CHARS) {
    this._maxChars = maxChars;
    this._size = 0; // characters of the data lines kept for the current message
    this._onMessage = onMessage;
    this._onComment = onComment;
    this._buffer = '';
    this._skipLf = false; // the last chunk ended with \r: a \n first in the next is its pair
    this._type = '';
    this._data = [];
    this._id = undefined;
    this._first = true;
  }

  /** Feeds decoded text. */
  push(text) {
    if (!text) return;
    if (this._first) {
      this._first = false;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    if (this._skipLf) {
      this._skipLf = false;
      if (text[0] === '\n') text = text.slice(1);
    }
    let buffer = this._buffer + text;
    let start = 0;
    for (;;) {
      const cr = buffer.indexOf('\r', start);
      const lf = buffer.indexOf('\n', start);
      if (cr < 0 && lf < 0) break;
      let end;
      let next;
      if (cr >= 0 && (lf < 0 || cr < lf)) {
        end = cr;
        if (cr + 1 < buffer.length) next = buffer[cr + 1] === '\n' ? cr + 2 : cr + 1;
        else {
          next = cr + 1;
          this._skipLf = true;
        }
      } else {
        end = lf;
        next = lf + 1;
      }
      this._line(buffer.slice(start, end));
      start = next;
    }
    this._buffer = buffer.slice(start);
    if (this._buffer.length + this._size > this._maxChars) {
      throw new RangeError(`an event stream message over ${this._maxChars} characters`);
    }
  }

  /** The stream ended: a message without its blank line is dropped (the standard's rule). */
  end() {
    this._buffer = '';
    this._size = 0;
    this._type = '';
    this._data = [];
    this._id = undefined;
  }

  _line(line) {
    if (line === '') {
      const message = { type: this._type || 'message', data: this._data.join('\n'), id: this._id };
      const any = this._data.length > 0;
      this._type = '';
      this._data = [];
      this._size = 0;
      this._id = undefined;
      if (any) this._onMessage(message);
      return;
    }
    if (line[0] === ':') {
      this._onComment(line.slice(1).replace(/^ /, ''));
      return;
    }
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value[0] === ' ') value = value.slice(1);
    switch (field) {
      case 'event':
        this._type = value;
        return;
      case 'data':
        this._data.push(value);
        this._size += value.length + 1;
        if (this._size > this._maxChars) throw new RangeError(`an event stream message over ${this._maxChars} characters`);
        return;
      case 'id':
        if (!value.includes('\0')) this._id = value;
        return;
      default:
        return; // retry and unknown fields
    }
  }
}
