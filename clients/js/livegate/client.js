// The client: LivegateClient, the object connect() returns: its public API, and the
// orchestration of the connection's life (attempts, the welcome, losses and reconnects,
// the WebSocket→SSE fallback, closing) and of the server's frames. Each part it holds
// owns one concern: attempts.js decides each attempt (what a loss means, where the next
// goes), link.js opens and watches the current link (transports, welcome timeout, pings,
// SSE refusals and reopen), requests.js the requests waiting for replies, rooms.js each
// room's feed (feed.js) and what it asks carried out, events.js the client's listeners,
// connection.js the state and timings, credentials.js the resume credential. The
// behaviour is described at the top of livegate.js.

import { Attempts } from './attempts.js';
import { clockFrom } from './clock.js';
import { ConnectionMachine, DEFAULT_TIMINGS, TRANSPORTS, TransportOrder, checkTransports } from './connection.js';
import { ResumeCredential } from './credentials.js';
import { livegateError as lgError } from './errors.js';
import { ClientEvents } from './events.js';
import { Feed } from './feed.js';
import { Links } from './link.js';
import { Requests, abortedBy, randomHex } from './requests.js';
import { Rooms } from './rooms.js';
import { Subscription } from './subscriptions.js';
import { WebSocketSource } from './transport-websocket.js';
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
    /** The WebSocket constructor: given, global, or (Node) the `ws` package's, loading. */
    this._sockets = new WebSocketSource(Socket || globalThis.WebSocket, transports.includes('websocket'));
    const fetchFn = options.fetch === undefined ? globalThis.fetch : options.fetch;
    this._fetch = typeof fetchFn === 'function' ? (input, init) => fetchFn(input, init) : null;
    if (transports.length === 1 && transports[0] === 'websocket' && !this._sockets.available) {
      throw new TypeError('livegate: no WebSocket constructor (pass one as the WebSocket option)');
    }
    if (transports.length === 1 && transports[0] === 'sse' && !this._fetch) throw new TypeError('livegate: transport sse needs fetch()');
    if (!this._sockets.available && !this._fetch) {
      throw new TypeError('livegate: no WebSocket constructor and no fetch (pass one as the WebSocket option)');
    }
    const base = url ?? globalThis.location?.origin;
    if (!base) throw new TypeError('livegate: url is required outside a browser');
    this._endpoint = endpointOf(String(base));
    this._sseEndpoint = sseEndpointOf(String(base));
    /** The transports to try, in order, and the one in use. */
    this._order = new TransportOrder(transports, { webSocket: this._sockets.available, fetch: !!this._fetch });
    this._getToken = getToken;
    this._timings = { ...DEFAULT_TIMINGS, ...(timings || {}) };
    this._random = typeof random === 'function' ? random : Math.random;
    const timeout = options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    if (typeof timeout !== 'number' || !(timeout >= 0)) throw new TypeError(`livegate: requestTimeoutMs must be a number >= 0, not ${timeout}`);
    this._clock = clockFrom(clock);
    this._session = session ?? null;
    /** The resume credential of the last welcome. */
    this._credential = new ResumeCredential({
      enabled: options.resume !== false,
      attempts: Math.max(1, Number(options.resumeAttempts ?? 3) || 3),
      marginMs: this._timings.resumeMarginMs,
      clock: this._clock,
    });

    /** The client's listeners, and the `debug` option's log. */
    this._events = new ClientEvents(options.debug);
    /** Each room's feed, and what it asks carried out (rooms.js). */
    this._rooms = new Rooms({
      clock: this._clock,
      send: (frame) => this._send(frame),
      request: (fields) => this._request(fields),
      reopen: () => this._links.reopenSoon(),
      resubscribe: (feed) => this._resubscribe(feed),
      emit: (name, detail) => this._emit(name, detail),
    });
    /** The requests waiting for replies (requests.js). */
    this._requests = new Requests(this._clock, timeout);
    this._nextRef = 1;

    /** The connection's state: `state`, and the `state` event on each change. */
    this._machine = new ConnectionMachine((change) => this._emit('state', { previous: change.previous, state: change.state, reason: change.reason }));
    /** Whether the client is connected or trying to be (connect(); not after disconnect()). */
    this._running = false;
    this._attemptGen = 0;
    /** The clock's timer handle of the next attempt. */
    this._timers = { reconnect: null };

    /**
     * The optional parts of the protocol the server announced in its last welcome
     * (`features`: `state`, `presence`, `publish`), or null: a server before that field,
     * asked anyway (it refuses what it lacks, see `_onError`).
     */
    this._features = null;
    /** The attempts: where the next goes, with what, and what a loss means (attempts.js). */
    this._attempts = new Attempts({
      order: this._order,
      credential: this._credential,
      sseEndpoint: this._sseEndpoint,
      timings: this._timings,
      random: this._random,
      canProbe: !!this._fetch,
    });
    /** The current attempt or connection, opened and watched (link.js). */
    this._links = new Links({
      fetch: this._fetch,
      endpoint: this._endpoint,
      sseEndpoint: this._sseEndpoint,
      timings: this._timings,
      clock: this._clock,
      rooms: this._rooms,
      attempts: this._attempts,
      host: {
        emit: (name, detail) => this._emit(name, detail),
        frame: (text) => this._onFrame(text),
        lost: (code, reason, attempt, link) => this._lost(code, reason, attempt, link),
        runAttempts: () => this._runAttempts(),
        closed: () => this._machine.closed,
        reattempt: () => this._schedule(() => this._attempt({ quiet: true }), 0),
      },
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
    return this._events.on(name, fn);
  }

  off(name, fn) {
    this._events.off(name, fn);
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
    const { feed, fresh, again } = this._rooms.join(sub, options.since, options.epoch, () => new Feed(room, { nextRef: () => this._nextRef++, resubscribeMs: this._timings.resubscribeMs }));
    if (fresh) {
      if (this._links.stream()) this._links.roomsChanged();
      else if (this._links.current?.welcomed) this._sendSubscribe(feed);
    } else if (again) this._resubscribe(feed);
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
    this._rooms.run(feed);
    if (this._links.stream()) this._links.roomsChanged();
    else if (this._links.current?.welcomed) this._send({ op: 'unsubscribe', room: feed.room });
  }

  /** Subscribes `feed`'s room again for what it asks now (the stream reopens over SSE). */
  _resubscribe(feed) {
    if (this._links.stream()) this._links.roomsChanged(true);
    else if (this._links.current?.welcomed) this._sendSubscribe(feed);
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
    const link = this._links.current;
    if (!link) return false;
    this._links.drop(link, 4000, String(reason));
    this._lost(4000, reason, null, link);
    return true;
  }

  /** Closes the connection for good: no reconnect, pending requests are rejected. */
  close() {
    if (this._machine.closedBy === 'client') return;
    this._running = false;
    this._machine.transition('closed', 'client closed', 'client');
    this._attempts.close();
    const link = this._links.current;
    this._clearTimers();
    if (link) {
      this._links.drop(link, 1000, 'client closed');
      this._lost(1000, 'client closed', null, link);
    }
    this._requests.rejectAll(lgError('closed', 'client closed'));
    this._rooms.close('closed', 'client closed');
  }

  // ---- connection lifecycle ----

  /**
   * Stops the client without closing it (disconnect(), or signed out): the connection
   * ends, no attempt follows, requests reject with `error`; connect() starts again.
   */
  _halt(reason, error) {
    this._running = false;
    this._attemptGen += 1; // an attempt waiting for getToken or a check gives up
    const link = this._links.current;
    this._clearTimers();
    this._attempts.halt();
    if (link) this._links.drop(link, 1000, reason);
    this._links.current = null;
    this._requests.rejectAll(error);
    this._rooms.lost();
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
    this._requests.rejectAll(error);
    this._rooms.endAll('unsupported', message);
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
    if (this._sockets.loading) {
      await this._sockets.load();
      if (gen !== this._attemptGen || this._machine.closed) return;
    }
    if (this._sockets.missing() && !this._noWebSocket()) return;
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
          if (action.attempt.transport === 'sse') this._links.openSse(action.attempt, this._session, this._lacking());
          else this._links.openWebSocket(action.attempt, this._sockets.Socket, this._session);
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
    const ready = await this._links.serverReady(readyz);
    if (this._machine.closed) return;
    this._attempts.probed(id, ready);
    this._runAttempts();
  }

  /**
   * The current connection ended (or an attempt failed) with `code`: `ended` is its link
   * (whether it was welcomed, and when), `attempt` what the attempt used when it matters
   * for what comes next (null: a loss the client caused).
   */
  _lost(code, reason, attempt = null, ended = null) {
    const wasWelcomed = ended?.welcomed === true;
    this._links.current = null;
    this._clearTimers();
    this._requests.rejectAll(lgError('disconnected', `connection lost (${code}${reason ? `: ${reason}` : ''})`), true);
    this._rooms.lost();
    if (this._machine.closed) {
      this._emit('disconnected', { code, reason, reconnectInMs: null });
      return;
    }
    this._attempts.lost(code, reason, { attempt, welcomed: wasWelcomed, welcomedAt: ended?.welcomedAt ?? 0 }, this._clock.now());
    this._runAttempts();
  }

  /** The transport in use changed from `from`: requests it cannot carry fail, the app is told. */
  _announceTransport(from, reason, warning = 'fallback') {
    const to = this._order.current;
    if (from === to) return;
    if (to === 'sse') {
      this._warn(warning, `on SSE from now on (${reason}): publish, history and presence reject with unsupported`);
      this._requests.rejectAll(lgError('unsupported', 'history, publish and presence need the WebSocket transport (now on SSE)'));
    }
    this._emit('transport', { from, to, reason });
  }

  /** The server said not to come back (a close 4500-4999): the client is closed (by the attempts). */
  _stopped(code, reason) {
    const stopped = lgError('stopped', `server said not to reconnect (${code})`);
    this._requests.rejectAll(stopped);
    this._rooms.endAll('stopped', stopped.message);
    this._emit('disconnected', { code, reason, reconnectInMs: null });
  }

  _schedule(fn, delay) {
    if (!this._running) return;
    this._clock.clearTimeout(this._timers.reconnect);
    this._timers.reconnect = this._clock.setTimeout(fn, delay);
  }

  _clearTimers() {
    this._clock.clearTimeout(this._timers.reconnect);
    this._timers = { reconnect: null };
    this._links.stopTimers();
  }

  _onWelcome(frame) {
    const link = this._links.current;
    const sse = this._links.stream();
    const ws = link && !sse ? link : null;
    const attempt = link?.attempt ?? { quiet: false, resume: null };
    this._links.welcomed(link);
    this._credential.keep(frame, link.welcomedAt, this._links.skewMs);
    this._features = Array.isArray(frame.features) ? new Set(frame.features.filter((f) => typeof f === 'string')) : null;
    this._attempts.welcomed(attempt, { node: frame.node, websocket: !!ws });
    const resumed = this._session != null && frame.session === this._session;
    if (frame.session) this._session = frame.session;
    this._machine.transition('connected', `welcomed by ${frame.node ?? 'the server'} over ${link.transport.name}`);
    const heartbeatMs = Number(frame.heartbeat_ms) || 30000;
    this._links.keepAlive(link, heartbeatMs);
    if (sse) {
      this._links.streamWelcomed(sse, attempt.quiet);
      this._requests.rejectAll(lgError('unsupported', 'history, publish and presence need the WebSocket transport (connected over SSE)'));
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
    if (this._links.current !== link) return; // a listener closed the client
    if (sse) return this._links.roomsChangedMeanwhile(sse);
    for (const feed of this._rooms.values()) this._sendSubscribe(feed);
    this._requests.flush((queued) => this._send(queued));
  }

  // ---- frames ----

  _send(frame) {
    return this._links.send(frame);
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
    const refusal = this._refusalWhenClosed();
    if (refusal) return Promise.reject(refusal);
    if (signal?.aborted) return Promise.reject(abortedBy(signal, fields.op));
    if (this._order.current === 'sse') {
      const message = `${fields.op} needs the WebSocket transport (SSE has no client requests)`;
      this._warn('unsupported', message);
      return Promise.reject(lgError('unsupported', message));
    }
    return this._requests.add(frame, { signal, timeoutMs }, () => this._links.current?.welcomed && this._send(frame));
  }

  _onFrame(text) {
    let frame;
    try {
      frame = JSON.parse(typeof text === 'string' ? text : new TextDecoder().decode(text));
    } catch {
      return; // not JSON: nothing this client understands
    }
    if (!frame || typeof frame !== 'object') return;
    if (frame.op === 'error' && frame.code === 'wrong_node' && !this._links.current?.welcomed) {
      // The 4421 close that follows names the node; this frame too (when the URL is too long for the reason).
      const attempt = this._links.current?.attempt;
      if (attempt) this._attempts.named(attempt, { url: frame.url, node: frame.node });
      return;
    }
    switch (frame.op) {
      case 'welcome':
        return this._onWelcome(frame);
      case 'subscribed':
        return this._rooms.subscribed(frame);
      case 'events':
        return this._rooms.events(frame);
      case 'presence':
        // The reply to `presence()` (it has a ref, maybe of a request given up), or a room's changes.
        return frame.ref != null ? this._requests.reply(frame) : this._rooms.presence(frame);
      case 'history':
      case 'published':
      case 'unsubscribed':
      case 'pong':
        return this._requests.reply(frame);
      case 'error':
        return this._onError(frame);
      default:
        return;
    }
  }

  _onError(frame) {
    if (this._requests.refused(frame)) return;
    if (this._rooms.subscribeRefused(frame, this._links.stream() != null, this._features != null)) return;
    const room = typeof frame.room === 'string' ? frame.room : undefined;
    this._emit('error', room != null ? { room, code: frame.code, message: frame.message } : { code: frame.code, message: frame.message });
  }


  // ---- rooms ----

  /** Subscribes `feed`'s room on this connection, without what the server lacks. */
  _sendSubscribe(feed) {
    feed.subscribe(this._lacking());
    this._rooms.run(feed);
  }

  /** Whether the server's welcome announced features and `feature` is not among them. */
  _serverLacks(feature) {
    return this._features != null && !this._features.has(feature);
  }

  /** The room flags the server announced it lacks: a feed goes on without them. */
  _lacking() {
    return { state: this._serverLacks('state'), presence: this._serverLacks('presence') };
  }

  _emit(name, detail) {
    this._events.emit(name, detail);
  }

}

/** Default of the `requestTimeoutMs` option. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 10000;
