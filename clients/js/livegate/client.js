// The client: LivegateClient, the object connect() returns. It owns the connection's
// life (attempts, the welcome, losses and reconnects, redirects to the session's node,
// the WebSocket→SSE fallback), the requests waiting for replies, and the delivery of each
// room's feed (its inputs in, its actions carried out). attempts.js decides each attempt
// (where it goes, with which credential and transport, what a loss means; its actions are
// carried out here), the transports
// (transport-websocket.js, transport-sse.js) move frames, credentials.js keeps the resume
// credential, connection.js holds the timings and the reconnect policy, feed.js each room's
// recovery (a machine: subscribing, live, filling a gap, resubscribing, ended),
// subscriptions.js the application's Subscription objects, emitter.js the listeners, and
// clock.js the time. The behaviour is described at
// the top of livegate.js.

import { Attempts, credentialQuery } from './attempts.js';
import { clockFrom, repeat } from './clock.js';
import { ConnectionMachine, DEFAULT_TIMINGS, TRANSPORTS, TransportOrder, checkTransports } from './connection.js';
import { ResumeCredential } from './credentials.js';
import { Listeners } from './emitter.js';
import { livegateError as lgError } from './errors.js';
import { Feed } from './feed.js';
import { Subscription } from './subscriptions.js';
import { SseTransport, cancelBody } from './transport-sse.js';
import { WebSocketTransport } from './transport-websocket.js';
import { endpointOf, sseEndpointOf } from './urls.js';

/**
 * Opens a client. Options:
 * - `url`: the server's base URL (http(s):// or ws(s)://; `/v1/ws` and `/v1/sse` are
 *   appended). Defaults to the page's origin in a browser.
 * - `getToken()`: returns (a promise of) a fresh one-time token, or the `{token}` reply
 *   of `POST /v1/tokens`; called for an attempt that has no usable resume credential.
 * - `transports`: the transports to use, in fallback order: `['websocket', 'sse']`
 *   (default; SSE after `WS_FAILURES_BEFORE_SSE` failed WebSocket attempts), `['websocket']`
 *   or `['sse']` (one: no fallback). An unknown name throws a TypeError.
 * - `resume`: false to never use resume credentials (default true).
 * - `resumeAttempts`: consecutive failed WebSocket attempts a credential is tried in
 *   before it is dropped (default 3).
 * - `WebSocket`: the constructor to use (default: the global one; in Node without one,
 *   Node 20 without --experimental-websocket, the `ws` package's when it is installed).
 *   No WebSocket at all: SSE with a `warning` (or, with `transports: ['websocket']`, the
 *   client closes with a `warning`).
 * - `autoConnect`: false to connect only when `connect()` is called (default true: the
 *   first attempt starts right after construction).
 * - `requestTimeoutMs`: how long `publish()`, `history()` and `presence()` wait for the
 *   reply, queued while disconnected included, before rejecting with code `timeout`
 *   (default 10000; 0: no timeout). Each call can pass its own `timeoutMs` and `signal`.
 * - `debug`: true to log connection, transport and state changes with console.debug, or a
 *   function `(message, detail)` or an object with a `debug` method to log them with.
 *   Credentials and tokens are never logged.
 * - `fetch`: the fetch function for SSE and the `/readyz` check (default: the global one).
 * - `session`: a session id to resume on the first connection.
 * - `timings`: overrides of `DEFAULT_TIMINGS`.
 * - `random`: a function like Math.random (for tests).
 * - `clock`: `{now, setTimeout, clearTimeout}` to use instead of the real ones (for tests;
 *   see clock.js).
 */
export function connect(options) {
  return new LivegateClient(options);
}

export class LivegateClient {
  constructor(options = {}) {
    const { url, getToken, WebSocket: Socket, session, timings, random, clock, transports: order } = options;
    if (typeof getToken !== 'function') throw new TypeError('livegate: getToken must be a function');
    if (options.transport !== undefined) {
      throw new TypeError("livegate: there is no transport option: use transports: ['websocket', 'sse'] (the default), ['websocket'] or ['sse']");
    }
    const transports = checkTransports(order ?? TRANSPORTS);
    const given = Socket || globalThis.WebSocket;
    this._Socket = typeof given === 'function' ? given : null;
    /** Node without a global WebSocket: the `ws` package's constructor, loading (or null). */
    this._socketLoad = !this._Socket && transports.includes('websocket') && isNode() ? loadWs() : null;
    /** No WebSocket at all although asked for: the first attempt warns. */
    this._warnNoWebSocket = transports.includes('websocket') && !this._Socket && !this._socketLoad;
    const fetchFn = options.fetch === undefined ? globalThis.fetch : options.fetch;
    this._fetch = typeof fetchFn === 'function' ? (input, init) => fetchFn(input, init) : null;
    if (transports.length === 1 && transports[0] === 'websocket' && !this._Socket && !this._socketLoad) {
      throw new TypeError('livegate: no WebSocket constructor (pass one as the WebSocket option)');
    }
    if (transports.length === 1 && transports[0] === 'sse' && !this._fetch) throw new TypeError('livegate: transport sse needs fetch()');
    if (!this._Socket && !this._socketLoad && !this._fetch) {
      throw new TypeError('livegate: no WebSocket constructor and no fetch (pass one as the WebSocket option)');
    }
    const base = url ?? globalThis.location?.origin;
    if (!base) throw new TypeError('livegate: url is required outside a browser');
    this._endpoint = endpointOf(String(base));
    this._sseEndpoint = sseEndpointOf(String(base));
    /** The transports to try, in order, and the one in use. */
    this._order = new TransportOrder(transports, { webSocket: !!(this._Socket || this._socketLoad), fetch: !!this._fetch });
    this._getToken = getToken;
    this._timings = { ...DEFAULT_TIMINGS, ...(timings || {}) };
    this._random = typeof random === 'function' ? random : Math.random;
    const timeout = options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    if (typeof timeout !== 'number' || !(timeout >= 0)) throw new TypeError(`livegate: requestTimeoutMs must be a number >= 0, not ${timeout}`);
    this._requestTimeoutMs = timeout;
    this._debug = debugOf(options.debug);
    this._clock = clockFrom(clock);
    this._session = session ?? null;
    /** The resume credential of the last welcome. */
    this._credential = new ResumeCredential({
      enabled: options.resume !== false,
      attempts: Math.max(1, Number(options.resumeAttempts ?? 3) || 3),
      marginMs: this._timings.resumeMarginMs,
      clock: this._clock,
    });

    this._listeners = new Listeners();
    this._rooms = new Map(); // room name -> Feed
    this._retryTimers = new Map(); // Feed -> {at, handle}: the timer of its deadline()
    this._requests = new Map(); // ref -> {resolve, reject, frame}
    this._queued = []; // requests waiting for a connection: [ref, ...]
    this._nextRef = 1;

    /**
     * The current attempt or connection: {transport, attempt, rooms, welcomed, welcomedAt,
     * reopenPending}: `attempt` is what it used ({transport, resume, quiet, ...}), `rooms`
     * the rooms an SSE stream names (null over WebSocket), `welcomed` whether its
     * `welcome` came (at `welcomedAt`), `reopenPending` whether an SSE stream is about to
     * be reopened for changed rooms.
     */
    this._link = null;
    /** The connection's state: `state`, and the `state` event on each change. */
    this._machine = new ConnectionMachine((change) => this._emit('state', { previous: change.previous, state: change.state, reason: change.reason }));
    /** Whether the client is connected or trying to be (connect(); not after disconnect()). */
    this._running = false;
    this._attemptGen = 0;
    /** reconnect, connect: the clock's timer handles; ping: the function that stops it. */
    this._timers = { reconnect: null, connect: null, ping: null };
    this._lastHeard = 0;

    /**
     * The optional parts of the protocol the server announced in its last welcome
     * (`features`: `state`, `presence`, `publish`), or null: a server before that field,
     * asked anyway (it refuses what it lacks, see `_onError`).
     */
    this._features = null;
    /** Server clock minus local clock, from an SSE response's Date header. */
    this._skewMs = 0;
    /** The `id:` of the last SSE events message: the stream's cursor. */
    this._cursor = null;
    /** The attempts: where the next goes, with what, and what a loss means (attempts.js). */
    this._attempts = new Attempts({
      order: this._order,
      credential: this._credential,
      sseEndpoint: this._sseEndpoint,
      timings: this._timings,
      random: this._random,
      canProbe: !!this._fetch,
    });

    if (options.autoConnect !== false) this.connect();
  }

  // ---- public API ----

  /**
   * 'disconnected' | 'connecting' | 'connected' | 'closed' (for good: close(), or a close
   * 4500-4999 from the server). The `state` event tells each change and its reason.
   */
  get state() {
    return this._machine.state;
  }

  /** The session id of the last welcome (null before the first). */
  get session() {
    return this._session;
  }

  /** The transport in use (or of the next attempt): 'websocket' or 'sse'. */
  get transport() {
    return this._order.current;
  }

  /** Whether a resume credential is held for the next attempt (never the credential). */
  get hasResume() {
    return this._credential.usable() != null;
  }

  /** Where delivery of a room stands: `{epoch, seq}` (seq = last delivered), or null. */
  position(room) {
    const feed = this._rooms.get(room);
    return feed ? feed.position() : null;
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
    return this._listeners.on(name, fn);
  }

  off(name, fn) {
    this._listeners.off(name, fn);
  }

  /**
   * `subscribe(room, {since, epoch, state, presence})` returns a Subscription (see
   * subscriptions.js): its own events (`event`, `state`, `presence`, `recovered`,
   * `recovery_failed`, `error`, `subscribing`, `subscribed`, `unsubscribed`), state and
   * `unsubscribe()`. It starts after `since` (in `epoch`, e.g. the head of a state loaded
   * over HTTP), else from now on; `state: true` starts it from the room's state;
   * `presence: true` adds presence changes. Several subscriptions to one room share one
   * server subscription and each gets what it asked for.
   *
   * (The form `subscribe(room, onEvent, options)` of earlier drafts is gone: it throws.)
   */
  subscribe(room, options = {}) {
    if (typeof room !== 'string' || room === '') throw new TypeError('livegate: room must be a non-empty string');
    if (typeof options === 'function' || arguments.length > 2) {
      throw new TypeError("livegate: subscribe(room, options) returns a Subscription: listen with subscription.on('event', fn)");
    }
    return this._subscription(room, options ?? {});
  }

  /** Stops delivering the room to every subscription of it and tells the server (over SSE: reopens the stream). */
  unsubscribe(room) {
    const feed = this._rooms.get(room);
    if (!feed) return;
    for (const sub of [...feed.subs]) sub._end('unsubscribed', `unsubscribed from ${room}`);
    this._forgetRoom(feed);
  }

  /** A new Subscription on `room` with `options` {since, epoch, state, presence}. */
  _subscription(room, options) {
    const sub = new Subscription(room, options, (ended) => this._subscriptionEnded(ended));
    const refusal = this._refusalWhenClosed();
    if (refusal) {
      sub._end(refusal.code, refusal.message);
      return sub;
    }
    let feed = this._rooms.get(room);
    if (!feed) {
      feed = new Feed(room, { nextRef: () => this._nextRef++, resubscribeMs: this._timings.resubscribeMs });
      feed.start(sub, options.since, options.epoch);
      this._rooms.set(room, feed);
      sub._subscribing();
      if (this._stream()) this._roomsChanged();
      else if (this._link?.welcomed) this._sendSubscribe(feed);
      return sub;
    }
    // A later subscription of a subscribed room shares its server subscription.
    const again = feed.join(sub);
    sub._subscribing();
    if (again) this._resubscribe(feed);
    else if (feed.subscribedOnce) {
      // Told after the caller had the object to listen on.
      queueMicrotask(() => {
        if (sub.state === 'subscribing' && feed.subs.has(sub) && !feed.awaiting) sub._subscribed(feed.lastReply);
      });
    }
    return sub;
  }

  /** A subscription ended by its own unsubscribe(): the room goes with its last one. */
  _subscriptionEnded(sub) {
    const feed = this._rooms.get(sub.room);
    if (feed?.leave(sub)) this._forgetRoom(feed);
  }

  /** Stops delivering `feed`'s room and tells the server. */
  _forgetRoom(feed) {
    if (this._rooms.get(feed.room) !== feed) return;
    this._rooms.delete(feed.room);
    feed.end();
    this._run(feed);
    if (this._stream()) this._roomsChanged();
    else if (this._link?.welcomed) this._send({ op: 'unsubscribe', room: feed.room });
  }

  /** Subscribes `feed`'s room again for what it asks now (the stream reopens over SSE). */
  _resubscribe(feed) {
    if (this._stream()) this._roomsChanged(true);
    else if (this._link?.welcomed) this._sendSubscribe(feed);
  }

  /**
   * Asks the server for up to `limit` events of `room` after `since`. Resolves with the
   * `history` reply `{room, epoch, head, events, complete}`; rejects on an `error` reply,
   * when the connection is lost before the reply, or on close(). While disconnected the
   * request waits for the next connection. Over SSE (no client requests) it rejects with
   * code `unsupported`.
   */
  history(room, since = 0, limit = 100, options = {}) {
    return this._request({ op: 'history', room, since, limit }, options);
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
  publish(room, data, { id, signal, timeoutMs } = {}) {
    if (this._serverLacks('publish')) return Promise.reject(lgError('unsupported', 'the server has no client publish'));
    const eventId = id ?? `c-${randomHex(8)}`;
    return this._request({ op: 'publish', room, id: eventId, data }, { signal, timeoutMs }).then((reply) => ({
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
  presence(room, options = {}) {
    if (this._serverLacks('presence')) return Promise.reject(lgError('unsupported', 'the server has no presence'));
    return this._request({ op: 'presence', room }, options).then((reply) => ({
      room: reply.room,
      count: Number(reply.count),
      members: Array.isArray(reply.members) ? reply.members : null,
    }));
  }

  /**
   * Starts connecting (the constructor does unless `autoConnect: false`), or again after
   * `disconnect()` or a signed-out `getToken`: subscriptions resubscribe from where they
   * were. Does nothing while connected or connecting; throws once closed.
   */
  connect() {
    if (this._machine.closed) throw lgError(this._refusalWhenClosed().code, 'livegate: the client is closed; make a new one');
    if (this._running) return this;
    this._running = true;
    this._attempts.start();
    this._runAttempts();
    return this;
  }

  /**
   * Ends the connection (close 1000) and stops reconnecting until `connect()`: state
   * `disconnected`, pending requests reject with `disconnected`, subscriptions stay and
   * resubscribe on `connect()`. Unlike close(), the client can connect again.
   */
  disconnect(reason = 'client disconnected') {
    if (this._machine.closed || !this._running) return;
    this._halt(String(reason), lgError('disconnected', String(reason)));
  }

  /**
   * Drops the current connection as if it had been lost (to watch recovery in a demo, or
   * in tests): the socket is closed with 4000 (the SSE request aborted), `disconnected`
   * follows with that code, and the client reconnects by its backoff and resubscribes
   * every room with `since`, like after any other loss. Returns false when there is no
   * connection to drop.
   */
  dropConnection(reason = 'dropped by the application') {
    if (this._machine.closed) return false;
    const link = this._link;
    if (!link) return false;
    this._drop(link, 4000, String(reason));
    this._lost(4000, reason, null, link);
    return true;
  }

  /** Closes the connection for good: no reconnect, pending requests are rejected. */
  close() {
    if (this._machine.closedBy === 'client') return;
    this._running = false;
    this._machine.transition('closed', 'client closed', 'client');
    this._attempts.close();
    const link = this._link;
    this._clearTimers();
    if (link) {
      this._drop(link, 1000, 'client closed');
      this._lost(1000, 'client closed', null, link);
    }
    this._rejectAll(lgError('closed', 'client closed'));
    for (const feed of this._rooms.values()) {
      feed.end();
      this._run(feed);
      for (const sub of [...feed.subs]) sub._end('closed', 'client closed');
    }
  }

  // ---- connection lifecycle ----

  /**
   * Stops the client without closing it (disconnect(), or signed out): the connection
   * ends, no attempt follows, requests reject with `error`; connect() starts again.
   */
  _halt(reason, error) {
    this._running = false;
    this._attemptGen += 1; // an attempt waiting for getToken or a check gives up
    const link = this._link;
    this._clearTimers();
    this._attempts.halt();
    if (link) this._drop(link, 1000, reason);
    this._link = null;
    this._rejectAll(error);
    for (const feed of this._rooms.values()) {
      feed.lost();
      this._run(feed);
      for (const sub of feed.subs) if (sub.state === 'subscribed') sub._subscribing();
    }
    this._machine.transition('disconnected', reason);
    this._emit('disconnected', { code: 1000, reason, reconnectInMs: null });
  }

  /** `getToken` said the user is signed out: stop, tell, and wait for connect(). */
  _signedOut(why) {
    const reason = `signed out${why ? `: ${why}` : ''}`;
    this._credential.drop();
    this._emit('signed_out', { reason });
    this._halt(reason, lgError('signed_out', reason));
  }

  /** A `warning`: something works less well than asked (no WebSocket, SSE cannot publish). */
  _warn(code, message) {
    this._emit('warning', { code, message });
  }

  /**
   * No WebSocket constructor in this runtime (the `ws` package is not installed): SSE when
   * the transports allow it, else the client closes; a `warning` says so either way.
   */
  _noWebSocket() {
    const message = 'no WebSocket in this runtime (Node 20: npm install ws, pass the WebSocket option, or use Node 22+)';
    if (this._attempts.noWebSocket(message)) {
      this._runAttempts();
      return true;
    }
    this._attempts.close();
    this._warn('no_websocket', message);
    this._emit('error', { code: 'unsupported', message });
    this._running = false;
    this._machine.transition('closed', message, 'client');
    const error = lgError('unsupported', message);
    this._rejectAll(error);
    for (const feed of this._rooms.values()) for (const sub of [...feed.subs]) sub._end('unsupported', message);
    return false;
  }

  /** The rejection for a request or subscribe made once closed, or null while not closed. */
  _refusalWhenClosed() {
    if (!this._machine.closed) return null;
    if (this._machine.closedBy === 'server') return lgError('stopped', 'server said not to reconnect');
    return lgError('closed', 'client closed');
  }

  /** Opens the next connection; `quiet`: an SSE stream reopened for its rooms (no events). */
  async _attempt({ quiet = false } = {}) {
    this._timers.reconnect = null;
    if (this._machine.closed || !this._running) return;
    const gen = ++this._attemptGen;
    if (this._socketLoad) {
      const Socket = await this._socketLoad;
      this._socketLoad = null;
      if (Socket) this._Socket = Socket;
      else this._warnNoWebSocket = true;
      if (gen !== this._attemptGen || this._machine.closed) return;
    }
    if (this._warnNoWebSocket) {
      this._warnNoWebSocket = false;
      if (!this._Socket && !this._noWebSocket()) return;
    }
    this._attempts.due({ quiet });
    this._runAttempts();
  }

  /** Carries out what the attempts ask, in order, until they ask nothing more. */
  _runAttempts() {
    for (let action = this._attempts.poll(); action; action = this._attempts.poll()) {
      switch (action.type) {
        case 'state':
          this._machine.transition(action.state, action.reason, action.closedBy);
          break;
        case 'emit':
          this._emit(action.name, action.detail);
          break;
        case 'token':
          this._askToken();
          break;
        case 'open':
          if (action.attempt.transport === 'sse') this._openSse(action.attempt);
          else this._openWebSocket(action.attempt);
          break;
        case 'probe':
          this._probe(action.id, action.readyz);
          break;
        case 'schedule':
          if (!this._machine.closed) this._schedule(() => this._attempt(), action.delayMs);
          break;
        case 'transport':
          this._announceTransport(action.from, action.reason, action.warning);
          break;
        case 'signed_out':
          this._signedOut(action.why);
          break;
        case 'stopped':
          this._stopped(action.code, action.reason);
          break;
        default:
          break;
      }
    }
  }

  /** Asks `getToken` for the attempt waiting for one; what it says goes to the attempts. */
  async _askToken() {
    const gen = this._attemptGen;
    let token;
    try {
      token = await this._getToken();
    } catch (error) {
      if (this._machine.closed || gen !== this._attemptGen) return;
      this._attempts.tokenFailed(error);
      this._runAttempts();
      return;
    }
    if (this._machine.closed || gen !== this._attemptGen) return;
    this._attempts.tokenGot(token);
    this._runAttempts();
  }

  /** Asks `readyz` whether the node is up and ready; the answer goes to the attempts. */
  async _probe(id, readyz) {
    const ready = await this._serverReady(readyz);
    if (this._machine.closed) return;
    this._attempts.probed(id, ready);
    this._runAttempts();
  }

  _openWebSocket(attempt) {
    const endpoint = attempt.base ? endpointOf(attempt.base) : this._endpoint;
    const url = `${endpoint}?${credentialQuery(attempt, this._session)}`;
    const link = newLink(new WebSocketTransport(this._Socket), attempt, null);
    this._link = link;
    this._lastHeard = this._clock.now();
    try {
      link.transport.open(url, this._handlersOf(link));
    } catch (error) {
      this._link = null;
      this._emit('error', { code: 'socket', message: error.message });
      this._attempts.openFailed(attempt, error.message);
      this._runAttempts();
      return;
    }
    this._watchForWelcome(link);
  }

  /** Opens an SSE stream for the current rooms with `since` = the cursor. */
  _openSse(attempt) {
    const rooms = [...this._rooms.keys()];
    const endpoint = attempt.base ? sseEndpointOf(attempt.base) : this._sseEndpoint;
    let url = `${endpoint}?${credentialQuery(attempt, this._session)}&rooms=${rooms.map(encodeURIComponent).join(',')}`;
    const since = this._sseSince();
    if (since) url += `&since=${encodeURIComponent(since)}`;
    // The stream's flags apply to all its rooms; a room that did not ask ignores them.
    const feeds = [...this._rooms.values()];
    for (const feed of feeds) {
      feed.withoutUnannounced(this._lacking());
      this._run(feed);
    }
    if (feeds.some((feed) => feed.wantState)) url += '&state=1';
    if (feeds.some((feed) => feed.wantPresence)) url += '&presence=1';
    const link = newLink(new SseTransport(this._fetch), attempt, new Set(rooms));
    this._link = link;
    this._lastHeard = this._clock.now();
    this._watchForWelcome(link);
    link.transport.open(url, this._handlersOf(link));
  }

  /** No `welcome` on `link` within the connect timeout: give up on the attempt. */
  _watchForWelcome(link) {
    this._timers.connect = this._clock.setTimeout(() => {
      if (this._link !== link || link.welcomed) return;
      this._abandon(`no welcome within ${this._timings.connectTimeoutMs} ms`);
    }, this._timings.connectTimeoutMs);
  }

  /** What the transport of `link` reports to, while `link` is the current one. */
  _handlersOf(link) {
    const current = () => this._link === link;
    return {
      onOpen: (info) => {
        // The server answered (the upgrade went through, or an HTTP response came).
        this._attempts.opened(link.attempt);
        const date = info?.date;
        if (current() && Number.isFinite(date)) {
          const now = this._clock.now();
          this._skewMs = Math.abs(date - now) > 2000 ? date - now : 0;
        }
      },
      onHeard: () => {
        if (current()) this._lastHeard = this._clock.now();
      },
      onFrame: (text, meta) => {
        if (!current()) return;
        this._onFrame(text);
        if (meta?.type === 'events' && meta.id != null && current()) this._cursor = meta.id;
      },
      onClose: (code, reason) => {
        if (!current()) return;
        this._link = null;
        this._lost(code, reason, link.attempt, link);
      },
      onRefused: (refusal) => {
        if (!current()) return;
        this._link = null;
        this._refused(link, refusal);
      },
      onProblem: (code, message) => {
        if (current()) this._emit('error', { code, message });
      },
    };
  }

  /** The current link when its transport is a stream that names its rooms (SSE), else null. */
  _stream() {
    const link = this._link;
    return link && !link.transport.requests ? link : null;
  }

  /** `since=` of the next SSE request: the last `id:` with each room's own position over it. */
  _sseSince() {
    const entries = new Map();
    for (const entry of (this._cursor ?? '').split(',')) {
      const seqAt = entry.lastIndexOf(':');
      const epochAt = seqAt > 0 ? entry.lastIndexOf(':', seqAt - 1) : -1;
      if (epochAt > 0) entries.set(entry.slice(0, epochAt), entry);
    }
    for (const feed of this._rooms.values()) {
      if (feed.fromState) entries.delete(feed.room); // to start from its state, not replay
      else if (feed.epoch != null && feed.last != null) {
        entries.set(feed.room, `${feed.room}:${feed.epoch}:${feed.last}`);
      }
    }
    return [...entries.values()].join(',');
  }

  /** A non-2xx answer to an SSE request: `refusal` is {status, code, message, error, retryAfterSeconds}. */
  _refused(link, refusal) {
    const { status, code, message } = refusal;
    const attempt = link.attempt;
    if (status === 421 && code === 'wrong_node') {
      // Not this node's session: the body names the node to use (not an error).
      this._attempts.named(attempt, { url: refusal.error?.url, node: refusal.error?.node });
      this._lost(4421, String(refusal.error?.url ?? ''), attempt, link);
      return;
    }
    if (status === 429) {
      // Told to wait (the migration budget, or a rate limit): Retry-After seconds.
      const seconds = refusal.retryAfterSeconds;
      this._emit('error', { code, message: `SSE request refused: HTTP ${status} ${code}` });
      this._lost(4029, seconds != null ? String(seconds) : '', attempt, link);
      return;
    }
    // A refused credential, or a server without SSE: the attempts' business.
    const theirs = this._attempts.sseRefused(status, code);
    this._runAttempts();
    if (!theirs && ['bad_room', 'too_many_subscriptions', 'forbidden'].includes(code)) {
      // A room of the request was refused: the one the answer's `room` field names, else
      // (no field: too many rooms, or an older server) every room not yet subscribed.
      const fresh = [...link.rooms].filter((room) => this._rooms.get(room) && !this._rooms.get(room).subscribedOnce);
      const named = typeof refusal.error?.room === 'string' ? fresh.filter((room) => room === refusal.error.room) : [];
      for (const room of named.length ? named : fresh) {
        const feed = this._rooms.get(room);
        this._rooms.delete(room);
        feed.end();
        this._run(feed);
        this._emit('error', { room, code, message });
        this._tellSubscriptions(feed, 'error', { room, code, message });
        for (const sub of [...feed.subs]) sub._end(code, message);
      }
    }
    this._emit('error', { code, message: `SSE request refused: HTTP ${status} ${code}` });
    this._lost(1006, `HTTP ${status} ${code}`, attempt, link);
  }

  /**
   * Subscriptions changed while on SSE: reopen the stream (once the current one is
   * welcomed). `flags`: a room asks for more (state, presence) or starts from its state:
   * reopen even with the same rooms.
   */
  _roomsChanged(flags = false) {
    const link = this._stream();
    if (!link) return;
    if (flags) link.flagsChanged = true;
    if (!link.welcomed || link.reopenPending) return; // a welcome compares the rooms
    link.reopenPending = true;
    this._clock.setTimeout(() => {
      link.reopenPending = false;
      if (this._link !== link || this._machine.closed) return;
      if (sameSet(link.rooms, this._rooms) && !link.flagsChanged) return;
      this._reopen(link);
    }, 0);
  }

  /** Ends the stream `link` and opens the next at once, without telling the app. */
  _reopen(link) {
    this._drop(link);
    this._clock.clearTimeout(this._timers.connect);
    this._timers.ping?.();
    this._timers.connect = this._timers.ping = null;
    for (const feed of this._rooms.values()) {
      feed.lost();
      this._run(feed);
    }
    this._schedule(() => this._attempt({ quiet: true }), 0);
  }

  /** Gives up on the current attempt or connection: no waiting for a close handshake. */
  _abandon(reason) {
    const link = this._link;
    if (link) this._drop(link, 4000, reason);
    this._lost(1006, reason, link?.attempt ?? null, link);
  }

  /** Ends `link`'s transport (closing a socket with `code`); its handlers are not called again. */
  _drop(link, code = 1000, reason = '') {
    link.transport.close(code, reason);
    if (this._link === link) this._link = null;
  }

  /**
   * The current connection ended (or an attempt failed) with `code`: `ended` is its link
   * (whether it was welcomed, and when), `attempt` what the attempt used when it matters
   * for what comes next (null: a loss the client caused).
   */
  _lost(code, reason, attempt = null, ended = null) {
    const wasWelcomed = ended?.welcomed === true;
    this._link = null;
    this._clearTimers();
    this._rejectAll(lgError('disconnected', `connection lost (${code}${reason ? `: ${reason}` : ''})`), true);
    for (const feed of this._rooms.values()) {
      feed.lost();
      this._run(feed);
      for (const sub of feed.subs) if (sub.state === 'subscribed') sub._subscribing();
    }
    if (this._machine.closed) {
      this._emit('disconnected', { code, reason, reconnectInMs: null });
      return;
    }
    this._attempts.lost(code, reason, { attempt, welcomed: wasWelcomed, welcomedAt: ended?.welcomedAt ?? 0 }, this._clock.now());
    this._runAttempts();
  }

  /** `GET /readyz`: true when the server answered and is not draining or starting. */
  async _serverReady(readyz) {
    const controller = new AbortController();
    const timer = this._clock.setTimeout(() => controller.abort(), this._timings.probeTimeoutMs);
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
      this._clock.clearTimeout(timer);
    }
  }

  /** The transport in use changed from `from`: requests it cannot carry fail, the app is told. */
  _announceTransport(from, reason, warning = 'fallback') {
    const to = this._order.current;
    if (from === to) return;
    if (to === 'sse') {
      this._warn(warning, `on SSE from now on (${reason}): publish, history and presence reject with unsupported`);
      this._rejectAll(lgError('unsupported', 'history, publish and presence need the WebSocket transport (now on SSE)'));
    }
    this._emit('transport', { from, to, reason });
  }

  /** The server said not to come back (a close 4500-4999): the client is closed (by the attempts). */
  _stopped(code, reason) {
    const stopped = lgError('stopped', `server said not to reconnect (${code})`);
    this._rejectAll(stopped);
    for (const feed of this._rooms.values()) for (const sub of [...feed.subs]) sub._end('stopped', stopped.message);
    this._emit('disconnected', { code, reason, reconnectInMs: null });
  }

  _schedule(fn, delay) {
    if (!this._running) return;
    this._clock.clearTimeout(this._timers.reconnect);
    this._timers.reconnect = this._clock.setTimeout(fn, delay);
  }

  _clearTimers() {
    this._clock.clearTimeout(this._timers.reconnect);
    this._clock.clearTimeout(this._timers.connect);
    this._timers.ping?.();
    this._timers = { reconnect: null, connect: null, ping: null };
  }

  _onWelcome(frame) {
    const link = this._link;
    const sse = this._stream();
    const ws = link && !sse ? link : null;
    const attempt = link?.attempt ?? { quiet: false, resume: null };
    this._clock.clearTimeout(this._timers.connect);
    this._timers.connect = null;
    link.welcomed = true;
    link.welcomedAt = this._clock.now();
    this._credential.keep(frame, link.welcomedAt, this._skewMs);
    this._features = Array.isArray(frame.features) ? new Set(frame.features.filter((f) => typeof f === 'string')) : null;
    this._attempts.welcomed(attempt, { node: frame.node, websocket: !!ws });
    const resumed = this._session != null && frame.session === this._session;
    if (frame.session) this._session = frame.session;
    this._machine.transition('connected', `welcomed by ${frame.node ?? 'the server'} over ${link.transport.name}`);
    const heartbeatMs = Number(frame.heartbeat_ms) || 30000;
    const pingMs = this._timings.pingMs ?? heartbeatMs;
    const idleMs = this._timings.idleMs ?? Math.round(pingMs * (sse ? 3 : 2.5));
    this._timers.ping = repeat(this._clock, sse ? Math.min(pingMs, idleMs) : pingMs, () => {
      if (this._link !== link) return;
      if (this._clock.now() - this._lastHeard > idleMs) {
        this._abandon(`nothing heard from the server for ${idleMs} ms`);
        return;
      }
      if (ws) this._send({ op: 'ping' }); // over SSE the server's `: ping` comments do
    });
    if (sse) {
      // The stream subscribes its rooms itself: each one's `subscribed` comes next.
      for (const room of sse.rooms) {
        const feed = this._rooms.get(room);
        if (!feed) continue;
        feed.streamOpened(attempt.quiet);
        this._run(feed);
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
    if (this._link !== link) return; // a listener closed the client
    if (sse) {
      if (!sameSet(sse.rooms, this._rooms) || sse.flagsChanged) {
        // Rooms changed while this stream was being opened.
        sse.reopenPending = false;
        this._roomsChanged();
      }
      return;
    }
    for (const feed of this._rooms.values()) this._sendSubscribe(feed);
    for (const ref of this._queued.splice(0)) {
      const request = this._requests.get(ref);
      if (request && this._send(request.frame)) request.sent = true;
      else if (request) this._queued.push(ref);
    }
  }

  // ---- frames ----

  _send(frame) {
    return this._link ? this._link.transport.send(frame) : false;
  }

  /**
   * Sends a request and resolves with its reply. It waits for a connection while there is
   * none; it rejects with `timeout` after `timeoutMs` (default `requestTimeoutMs`) without
   * a reply, and with `aborted` when `signal` aborts (the reply, if one still comes, is
   * dropped: a publish may have been stored, so publish again with the same id).
   */
  _request(fields, { signal, timeoutMs } = {}) {
    const ref = this._nextRef++;
    const frame = { ...fields, ref };
    return new Promise((resolve, reject) => {
      const refusal = this._refusalWhenClosed();
      if (refusal) return reject(refusal);
      if (signal?.aborted) return reject(abortedBy(signal, fields.op));
      if (this._order.current === 'sse') {
        const message = `${fields.op} needs the WebSocket transport (SSE has no client requests)`;
        this._warn('unsupported', message);
        return reject(lgError('unsupported', message));
      }
      const ms = timeoutMs ?? this._requestTimeoutMs;
      let timer = null;
      let onAbort = null;
      const settled = () => {
        if (timer != null) this._clock.clearTimeout(timer);
        if (onAbort) signal.removeEventListener('abort', onAbort);
      };
      const request = {
        frame,
        sent: false,
        resolve: (reply) => (settled(), resolve(reply)),
        reject: (error) => (settled(), reject(error)),
      };
      const giveUp = (error) => {
        if (this._requests.get(ref) !== request) return;
        this._requests.delete(ref);
        const queued = this._queued.indexOf(ref);
        if (queued >= 0) this._queued.splice(queued, 1);
        request.reject(error);
      };
      this._requests.set(ref, request);
      if (ms > 0 && Number.isFinite(ms)) {
        timer = this._clock.setTimeout(() => giveUp(lgError('timeout', `${fields.op}: no reply within ${ms} ms`)), ms);
      }
      if (signal) {
        onAbort = () => giveUp(abortedBy(signal, fields.op));
        signal.addEventListener('abort', onAbort, { once: true });
      }
      if (this._link?.welcomed && this._send(frame)) request.sent = true;
      else this._queued.push(ref);
    });
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
    if (frame.op === 'error' && frame.code === 'wrong_node' && !this._link?.welcomed) {
      // The 4421 close that follows names the node; this frame too (when the URL is too long for the reason).
      const attempt = this._link?.attempt;
      if (attempt) this._attempts.named(attempt, { url: frame.url, node: frame.node });
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
            const feed = event && this._rooms.get(event.room);
            if (!feed || !Number.isInteger(event.seq)) continue;
            feed.event(event);
            this._run(feed);
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
    const room = typeof frame.room === 'string' ? frame.room : undefined;
    // A subscribe's refusal: by its ref, or over SSE (the stream's subscribes have no
    // ref) by the room the frame names.
    const feed =
      frame.ref != null
        ? [...this._rooms.values()].find((f) => f.ref === frame.ref)
        : room != null && this._stream() && this._rooms.get(room)?.ref === 'sse' && this._rooms.get(room);
    if (!feed) {
      this._emit('error', room != null ? { room, code: frame.code, message: frame.message } : { code: frame.code, message: frame.message });
      return;
    }
    // A server before `features` in welcome refuses a flag it lacks as a bad request (the
    // feed takes the newest flag asked as lacking); unavailable and the like are tried
    // again shortly on this connection; a final code ends the room.
    feed.refused(frame, { featuresKnown: this._features != null }, this._clock.now());
    this._run(feed);
  }

  // ---- rooms ----

  /** Subscribes `feed`'s room on this connection, without what the server lacks. */
  _sendSubscribe(feed) {
    feed.subscribe(this._lacking());
    this._run(feed);
  }

  /** Whether the server's welcome announced features and `feature` is not among them. */
  _serverLacks(feature) {
    return this._features != null && !this._features.has(feature);
  }

  /** The room flags the server announced it lacks: a feed goes on without them. */
  _lacking() {
    return { state: this._serverLacks('state'), presence: this._serverLacks('presence') };
  }

  _onSubscribed(frame) {
    const feed = this._rooms.get(frame.room);
    if (!feed) return;
    // Only replies to this feed's own subscribe count (over SSE, the stream's): the
    // automatic inbox subscription and replies to superseded requests are ignored.
    feed.subscribed(frame);
    this._run(feed);
  }

  /** A `presence` frame: the reply to `presence()` (it has a ref), or a room's changes. */
  _onPresence(frame) {
    if (frame.ref != null) return this._reply(frame); // a reply (maybe to a request given up)
    const feed = typeof frame.room === 'string' ? this._rooms.get(frame.room) : null;
    if (!feed) return;
    feed.presence({
      room: frame.room,
      count: Number(frame.count),
      joined: Array.isArray(frame.joined) ? frame.joined : null,
      left: Array.isArray(frame.left) ? frame.left : null,
    });
    this._run(feed);
  }

  /**
   * Carries out what `feed` asks, in order, until it asks nothing more (a listener called
   * meanwhile may feed it inputs and run it too), then arms the timer of its deadline.
   */
  _run(feed) {
    for (let action = feed.poll(); action; action = feed.poll()) {
      switch (action.type) {
        case 'send':
          this._send(action.frame);
          break;
        case 'history':
          this._askHistory(feed, action);
          break;
        case 'reopen': {
          // No history over SSE: the stream reopens from each room's position.
          const stream = this._stream();
          if (!stream) break;
          this._clock.setTimeout(() => {
            if (this._link === stream && !this._machine.closed) this._reopen(stream);
          }, 0);
          break;
        }
        case 'resubscribe':
          if (this._rooms.get(feed.room) === feed) this._resubscribe(feed);
          break;
        case 'emit':
          this._emit(action.name, action.detail);
          break;
        case 'tell':
          if (action.later) queueMicrotask(() => this._tellSubscriptions(feed, action.name, action.detail));
          else this._tellSubscriptions(feed, action.name, action.detail, action.subs);
          break;
        case 'subscribed':
          for (const sub of [...feed.subs]) sub._subscribed(action.reply);
          break;
        case 'end':
          if (this._rooms.get(feed.room) === feed) this._rooms.delete(feed.room);
          for (const sub of [...feed.subs]) sub._end(action.code, action.message);
          break;
        default:
          break;
      }
    }
    this._armRetry(feed);
  }

  /** Asks history for a feed filling a gap; the reply (or failure) goes back to it. */
  _askHistory(feed, { since, limit, token }) {
    this._request({ op: 'history', room: feed.room, since, limit }).then(
      (reply) => {
        if (this._rooms.get(feed.room) !== feed) return;
        feed.historyReply(token, reply);
        this._run(feed);
      },
      (error) => {
        feed.historyFailed(token, error);
        this._run(feed);
      },
    );
  }

  /** Keeps one clock timer per feed at its `deadline()` (a refused subscribe's retry). */
  _armRetry(feed) {
    const at = feed.deadline();
    const armed = this._retryTimers.get(feed);
    if (armed?.at === at) return;
    if (armed) {
      this._clock.clearTimeout(armed.handle);
      this._retryTimers.delete(feed);
    }
    if (at == null) return;
    const handle = this._clock.setTimeout(() => {
      if (this._retryTimers.get(feed)?.handle !== handle) return;
      this._retryTimers.delete(feed);
      // A timer may fire a little before the system clock reads its time.
      feed.tick(Math.max(this._clock.now(), at));
      this._run(feed);
    }, Math.max(0, at - this._clock.now()));
    this._retryTimers.set(feed, { at, handle });
  }

  /** What an application's listener on `feed`'s room threw: an `error` (code `handler`). */
  _handlerThrew(feed, error) {
    this._emit('error', { room: feed.room, code: 'handler', message: String(error?.message ?? error), error });
  }

  /** Hands a room's event to the listeners of `subs` (default: each subscription of the room). */
  _tellSubscriptions(feed, name, detail, subs = [...feed.subs]) {
    for (const sub of subs) sub._tell(name, detail, (error) => this._handlerThrew(feed, error));
  }

  _emit(name, detail) {
    if (this._debug && DEBUGGED.has(name)) {
      try {
        this._debug(name === 'state' ? `state ${detail.previous} -> ${detail.state}: ${detail.reason}` : name, detail);
      } catch {
        // a logger that throws changes nothing
      }
    }
    if (!this._listeners.has(name)) {
      if (name === 'error' && detail?.error && typeof console !== 'undefined') {
        console.error('livegate:', detail.message, detail.error);
      }
      return;
    }
    this._listeners.emit(name, detail, (error) => {
      if (typeof console !== 'undefined') console.error(`livegate: a ${name} listener threw`, error);
    });
  }
}

/** Default of the `requestTimeoutMs` option. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 10000;
/** The events the `debug` option logs. */
const DEBUGGED = new Set(['state', 'connecting', 'connected', 'disconnected', 'transport', 'redirect', 'warning', 'signed_out']);

/** The `debug` option as a function `(message, detail)`, or null. */
function debugOf(option) {
  if (option === true) return (message, detail) => console.debug('livegate:', message, detail);
  if (typeof option === 'function') return option;
  if (option && typeof option.debug === 'function') return (message, detail) => option.debug(message, detail);
  return null;
}

/** Whether this runs in Node (where a missing WebSocket can come from the `ws` package). */
function isNode() {
  return typeof globalThis.process?.versions?.node === 'string' && typeof globalThis.document === 'undefined';
}

/**
 * Node without a global WebSocket (20 without --experimental-websocket): the `ws`
 * package's constructor when it is installed (an optional peer dependency), else null.
 */
async function loadWs() {
  const specifier = 'ws'; // not a literal: bundlers leave it alone, browsers never get here
  try {
    const module = await import(/* webpackIgnore: true */ /* @vite-ignore */ specifier);
    const Socket = module.WebSocket ?? module.default;
    return typeof Socket === 'function' ? Socket : null;
  } catch {
    return null;
  }
}

/** The rejection of a request whose `signal` aborted. */
function abortedBy(signal, op) {
  return lgError('aborted', `${op} aborted`, { cause: signal.reason });
}

/** A new attempt's link (see `LivegateClient._link`). */
function newLink(transport, attempt, rooms) {
  return { transport, attempt, rooms, welcomed: false, welcomedAt: 0, reopenPending: false, flagsChanged: false };
}

/** `bytes` random bytes as hex (crypto when there is one: ids must not repeat). */
function randomHex(bytes) {
  const buffer = new Uint8Array(bytes);
  if (globalThis.crypto?.getRandomValues) globalThis.crypto.getRandomValues(buffer);
  else for (let i = 0; i < bytes; i++) buffer[i] = Math.floor(Math.random() * 256);
  return Array.from(buffer, (b) => b.toString(16).padStart(2, '0')).join('');
}

/** Whether the set `a` holds exactly the keys of the map (or set) `b`. */
function sameSet(a, b) {
  if (a.size !== b.size) return false;
  for (const key of b.keys()) if (!a.has(key)) return false;
  return true;
}
