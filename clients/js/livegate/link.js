// The link: the current attempt or connection of a client, and what happens on it below
// the protocol's frames. It opens the transport an attempt asks for (transport-websocket.js,
// transport-sse.js) and hands up what that transport reports while it is the current one,
// watches for the welcome (the connect timeout), keeps the pings and the idle check once
// welcomed, remembers the SSE stream's cursor and the server's clock skew, answers an SSE
// request's refusal, and reopens an SSE stream whose rooms changed. The rooms (rooms.js)
// and the attempts (attempts.js) are the client's, shared; what belongs to the client goes
// through `host`: {emit(name, detail), frame(text), lost(code, reason, attempt, link),
// runAttempts(), closed(), reattempt()}.

import { credentialQuery } from './attempts.js';
import { repeat } from './clock.js';
import { SseTransport, cancelBody } from './transport-sse.js';
import { WebSocketTransport } from './transport-websocket.js';
import { endpointOf, sseEndpointOf } from './urls.js';

export class Links {
  constructor({ fetch, endpoint, sseEndpoint, timings, clock, rooms, attempts, host }) {
    this._fetch = fetch;
    this._endpoint = endpoint;
    this._sseEndpoint = sseEndpoint;
    this._timings = timings;
    this._clock = clock;
    this._rooms = rooms;
    this._attempts = attempts;
    this._host = host;
    /**
     * The current attempt or connection: {transport, attempt, rooms, welcomed, welcomedAt,
     * reopenPending}: `attempt` is what it used ({transport, resume, quiet, ...}), `rooms`
     * the rooms an SSE stream names (null over WebSocket), `welcomed` whether its
     * `welcome` came (at `welcomedAt`), `reopenPending` whether an SSE stream is about to
     * be reopened for changed rooms.
     */
    this.current = null;
    /** connect: the clock's timer handle; ping: the function that stops it. */
    this._timers = { connect: null, ping: null };
    this._lastHeard = 0;
    /** Server clock minus local clock, from an SSE response's Date header. */
    this.skewMs = 0;
    /** The `id:` of the last SSE events message: the stream's cursor. */
    this._cursor = null;
  }

  _emit(name, detail) {
    this._host.emit(name, detail);
  }

  /** Sends `frame` on the current link; whether it went out. */
  send(frame) {
    return this.current ? this.current.transport.send(frame) : false;
  }

  openWebSocket(attempt, Socket, session) {
    const endpoint = attempt.base ? endpointOf(attempt.base) : this._endpoint;
    const url = `${endpoint}?${credentialQuery(attempt, session)}`;
    const link = newLink(new WebSocketTransport(Socket), attempt, null);
    this.current = link;
    this._lastHeard = this._clock.now();
    try {
      link.transport.open(url, this._handlersOf(link));
    } catch (error) {
      this.current = null;
      this._emit('error', { code: 'socket', message: error.message });
      this._attempts.openFailed(attempt, error.message);
      this._host.runAttempts();
      return;
    }
    this._watchForWelcome(link);
  }

  /** Opens an SSE stream for the current rooms with `since` = the cursor, without the room flags in `lacking`. */
  openSse(attempt, session, lacking) {
    const rooms = [...this._rooms.keys()];
    const endpoint = attempt.base ? sseEndpointOf(attempt.base) : this._sseEndpoint;
    let url = `${endpoint}?${credentialQuery(attempt, session)}&rooms=${rooms.map(encodeURIComponent).join(',')}`;
    const since = this._sseSince();
    if (since) url += `&since=${encodeURIComponent(since)}`;
    // The stream's flags apply to all its rooms; a room that did not ask ignores them.
    const feeds = [...this._rooms.values()];
    for (const feed of feeds) {
      feed.withoutUnannounced(lacking);
      this._rooms.run(feed);
    }
    if (feeds.some((feed) => feed.wantState)) url += '&state=1';
    if (feeds.some((feed) => feed.wantPresence)) url += '&presence=1';
    const link = newLink(new SseTransport(this._fetch), attempt, new Set(rooms));
    this.current = link;
    this._lastHeard = this._clock.now();
    this._watchForWelcome(link);
    link.transport.open(url, this._handlersOf(link));
  }

  /** No `welcome` on `link` within the connect timeout: give up on the attempt. */
  _watchForWelcome(link) {
    this._timers.connect = this._clock.setTimeout(() => {
      if (this.current !== link || link.welcomed) return;
      this.abandon(`no welcome within ${this._timings.connectTimeoutMs} ms`);
    }, this._timings.connectTimeoutMs);
  }

  /** What the transport of `link` reports to, while `link` is the current one. */
  _handlersOf(link) {
    const current = () => this.current === link;
    return {
      onOpen: (info) => {
        // The server answered (the upgrade went through, or an HTTP response came).
        this._attempts.opened(link.attempt);
        const date = info?.date;
        if (current() && Number.isFinite(date)) {
          const now = this._clock.now();
          this.skewMs = Math.abs(date - now) > 2000 ? date - now : 0;
        }
      },
      onHeard: () => {
        if (current()) this._lastHeard = this._clock.now();
      },
      onFrame: (text, meta) => {
        if (!current()) return;
        this._host.frame(text);
        if (meta?.type === 'events' && meta.id != null && current()) this._cursor = meta.id;
      },
      onClose: (code, reason) => {
        if (!current()) return;
        this.current = null;
        this._host.lost(code, reason, link.attempt, link);
      },
      onRefused: (refusal) => {
        if (!current()) return;
        this.current = null;
        this._refused(link, refusal);
      },
      onProblem: (code, message) => {
        if (current()) this._emit('error', { code, message });
      },
    };
  }

  /** The current link when its transport is a stream that names its rooms (SSE), else null. */
  stream() {
    const link = this.current;
    return link && !link.transport.requests ? link : null;
  }

  /** `link`'s welcome came: no more waiting for it. */
  welcomed(link) {
    this._clock.clearTimeout(this._timers.connect);
    this._timers.connect = null;
    link.welcomed = true;
    link.welcomedAt = this._clock.now();
  }

  /**
   * Pings the welcomed `link` (over WebSocket; over SSE the server's `: ping` comments do)
   * and gives it up when nothing was heard for the idle time.
   */
  keepAlive(link, heartbeatMs) {
    const sse = !link.transport.requests;
    const pingMs = this._timings.pingMs ?? heartbeatMs;
    const idleMs = this._timings.idleMs ?? Math.round(pingMs * (sse ? 3 : 2.5));
    this._timers.ping = repeat(this._clock, sse ? Math.min(pingMs, idleMs) : pingMs, () => {
      if (this.current !== link) return;
      if (this._clock.now() - this._lastHeard > idleMs) {
        this.abandon(`nothing heard from the server for ${idleMs} ms`);
        return;
      }
      if (!sse) this.send({ op: 'ping' }); // over SSE the server's `: ping` comments do
    });
  }

  /** The stream `sse` was welcomed: it subscribes its rooms itself, each one's `subscribed` comes next. */
  streamWelcomed(sse, quiet) {
    for (const room of sse.rooms) {
      const feed = this._rooms.get(room);
      if (!feed) continue;
      feed.streamOpened(quiet);
      this._rooms.run(feed);
    }
  }

  /** After the welcome of the stream `sse`: reopen it if its rooms changed while it was being opened. */
  roomsChangedMeanwhile(sse) {
    if (!sameSet(sse.rooms, this._rooms) || sse.flagsChanged) {
      sse.reopenPending = false;
      this.roomsChanged();
    }
  }

  /** Stops the connect timeout and the pings. */
  stopTimers() {
    this._clock.clearTimeout(this._timers.connect);
    this._timers.ping?.();
    this._timers = { connect: null, ping: null };
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
      this._host.lost(4421, String(refusal.error?.url ?? ''), attempt, link);
      return;
    }
    if (status === 429) {
      // Told to wait (the migration budget, or a rate limit): Retry-After seconds.
      const seconds = refusal.retryAfterSeconds;
      this._emit('error', { code, message: `SSE request refused: HTTP ${status} ${code}` });
      this._host.lost(4029, seconds != null ? String(seconds) : '', attempt, link);
      return;
    }
    // A refused credential, or a server without SSE: the attempts' business.
    const theirs = this._attempts.sseRefused(status, code);
    this._host.runAttempts();
    if (!theirs && ['bad_room', 'too_many_subscriptions', 'forbidden'].includes(code)) {
      // A room of the request was refused: the one the answer's `room` field names, else
      // (no field: too many rooms, or an older server) every room not yet subscribed.
      const fresh = [...link.rooms].filter((room) => this._rooms.get(room) && !this._rooms.get(room).subscribedOnce);
      const named = typeof refusal.error?.room === 'string' ? fresh.filter((room) => room === refusal.error.room) : [];
      for (const room of named.length ? named : fresh) this._rooms.refused(room, code, message);
    }
    this._emit('error', { code, message: `SSE request refused: HTTP ${status} ${code}` });
    this._host.lost(1006, `HTTP ${status} ${code}`, attempt, link);
  }

  /**
   * Subscriptions changed while on SSE: reopen the stream (once the current one is
   * welcomed). `flags`: a room asks for more (state, presence) or starts from its state:
   * reopen even with the same rooms.
   */
  roomsChanged(flags = false) {
    const link = this.stream();
    if (!link) return;
    if (flags) link.flagsChanged = true;
    if (!link.welcomed || link.reopenPending) return; // a welcome compares the rooms
    link.reopenPending = true;
    this._clock.setTimeout(() => {
      link.reopenPending = false;
      if (this.current !== link || this._host.closed()) return;
      if (sameSet(link.rooms, this._rooms) && !link.flagsChanged) return;
      this._reopen(link);
    }, 0);
  }

  /** A feed asks the stream to reopen (no history over SSE: it reopens from each room's position). */
  reopenSoon() {
    const stream = this.stream();
    if (!stream) return;
    this._clock.setTimeout(() => {
      if (this.current === stream && !this._host.closed()) this._reopen(stream);
    }, 0);
  }

  /** Ends the stream `link` and opens the next at once, without telling the app. */
  _reopen(link) {
    this.drop(link);
    this._clock.clearTimeout(this._timers.connect);
    this._timers.ping?.();
    this._timers.connect = this._timers.ping = null;
    for (const feed of this._rooms.values()) {
      feed.lost();
      this._rooms.run(feed);
    }
    this._host.reattempt();
  }

  /** Gives up on the current attempt or connection: no waiting for a close handshake. */
  abandon(reason) {
    const link = this.current;
    if (link) this.drop(link, 4000, reason);
    this._host.lost(1006, reason, link?.attempt ?? null, link);
  }

  /** Ends `link`'s transport (closing a socket with `code`); its handlers are not called again. */
  drop(link, code = 1000, reason = '') {
    link.transport.close(code, reason);
    if (this.current === link) this.current = null;
  }

  /** `GET /readyz`: true when the server answered and is not draining or starting. */
  async serverReady(readyz) {
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
}

/** A new attempt's link (see `Links.current`). */
function newLink(transport, attempt, rooms) {
  return { transport, attempt, rooms, welcomed: false, welcomedAt: 0, reopenPending: false, flagsChanged: false };
}

/** Whether the set `a` holds exactly the keys of the map (or set) `b`. */
export function sameSet(a, b) {
  if (a.size !== b.size) return false;
  for (const key of b.keys()) if (!a.has(key)) return false;
  return true;
}
