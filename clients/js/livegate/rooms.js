// The rooms of a client: each room's Feed (feed.js) by name, and the carrying out of what
// each feed asks (frames to send, history to ask, a stream to reopen, a resubscribe,
// events for the client and its subscriptions, the end), its inputs from the server's
// frames (`subscribed`, `events`, `presence`), and the timer of each feed's deadline (a
// refused subscribe's retry). What needs the connection goes through `host`, given by
// the client: {clock, send(frame), request(fields), reopen(), resubscribe(feed),
// emit(name, detail)}.

export class Rooms extends Map {
  constructor(host) {
    super(); // room name -> Feed
    this._host = host;
    this._clock = host.clock;
    this._retryTimers = new Map(); // Feed -> {at, handle}: the timer of its deadline()
  }

  _emit(name, detail) {
    this._host.emit(name, detail);
  }

  /**
   * Adds the Subscription `sub` (starting after `since` in `epoch`) to its room: to a
   * new feed made by `newFeed()` (`fresh`), or to the room's feed, which shares its server
   * subscription (`again`: the feed must subscribe again for what `sub` asks more).
   */
  join(sub, since, epoch, newFeed) {
    let feed = this.get(sub.room);
    if (!feed) {
      feed = newFeed();
      feed.start(sub, since, epoch);
      this.set(sub.room, feed);
      sub._subscribing();
      return { feed, fresh: true, again: false };
    }
    // A later subscription of a subscribed room shares its server subscription.
    const again = feed.join(sub);
    sub._subscribing();
    if (!again && feed.subscribedOnce) {
      // Told after the caller had the object to listen on.
      queueMicrotask(() => {
        if (sub.state === 'subscribing' && feed.subs.has(sub) && !feed.awaiting) sub._subscribed(feed.lastReply);
      });
    }
    return { feed, fresh: false, again };
  }

  /** A `subscribed` frame: the reply to a feed's own subscribe (over SSE, the stream's). */
  subscribed(frame) {
    const feed = this.get(frame.room);
    if (!feed) return;
    // Only replies to this feed's own subscribe count (over SSE, the stream's): the
    // automatic inbox subscription and replies to superseded requests are ignored.
    feed.subscribed(frame);
    this.run(feed);
  }

  /** An `events` frame: each event to its room's feed. */
  events(frame) {
    if (!Array.isArray(frame.events)) return;
    for (const event of frame.events) {
      const feed = event && this.get(event.room);
      if (!feed || !Number.isInteger(event.seq)) continue;
      feed.event(event);
      this.run(feed);
    }
  }

  /** A `presence` frame without a ref: a room's changes. */
  presence(frame) {
    const feed = typeof frame.room === 'string' ? this.get(frame.room) : null;
    if (!feed) return;
    feed.presence({
      room: frame.room,
      count: Number(frame.count),
      joined: Array.isArray(frame.joined) ? frame.joined : null,
      left: Array.isArray(frame.left) ? frame.left : null,
    });
    this.run(feed);
  }

  /**
   * An `error` frame refusing a feed's subscribe: by its ref, or over SSE (`overStream`:
   * the stream's subscribes have no ref) by the room the frame names. False when it
   * refuses no feed's subscribe. `featuresKnown`: whether the welcome announced features.
   */
  subscribeRefused(frame, overStream, featuresKnown) {
    const room = typeof frame.room === 'string' ? frame.room : undefined;
    const feed =
      frame.ref != null
        ? [...this.values()].find((f) => f.ref === frame.ref)
        : room != null && overStream && this.get(room)?.ref === 'sse' && this.get(room);
    if (!feed) return false;
    // A server before `features` in welcome refuses a flag it lacks as a bad request (the
    // feed takes the newest flag asked as lacking); unavailable and the like are tried
    // again shortly on this connection; a final code ends the room.
    feed.refused(frame, { featuresKnown }, this._clock.now());
    this.run(feed);
    return true;
  }

  /** The connection is lost: every feed waits to resubscribe, subscribed subscriptions too. */
  lost() {
    for (const feed of this.values()) {
      feed.lost();
      this.run(feed);
      for (const sub of feed.subs) if (sub.state === 'subscribed') sub._subscribing();
    }
  }

  /** Ends every subscription of every room with `code` (the rooms stay, for a reconnect). */
  endAll(code, message) {
    for (const feed of this.values()) for (const sub of [...feed.subs]) sub._end(code, message);
  }

  /** The client closed: every feed ends, and every subscription with `code`. */
  close(code, message) {
    for (const feed of this.values()) {
      feed.end();
      this.run(feed);
      for (const sub of [...feed.subs]) sub._end(code, message);
    }
  }

  /** An SSE request refused `room` with `code`: the room ends, its subscriptions are told. */
  refused(room, code, message) {
    const feed = this.get(room);
    this.delete(room);
    feed.end();
    this.run(feed);
    this._emit('error', { room, code, message });
    this._tellSubscriptions(feed, 'error', { room, code, message });
    for (const sub of [...feed.subs]) sub._end(code, message);
  }

  /**
   * Carries out what `feed` asks, in order, until it asks nothing more (a listener called
   * meanwhile may feed it inputs and run it too), then arms the timer of its deadline.
   */
  run(feed) {
    for (let action = feed.poll(); action; action = feed.poll()) {
      switch (action.type) {
        case 'send':
          this._host.send(action.frame);
          break;
        case 'history':
          this._askHistory(feed, action);
          break;
        case 'reopen':
          // No history over SSE: the stream reopens from each room's position.
          this._host.reopen();
          break;
        case 'resubscribe':
          if (this.get(feed.room) === feed) this._host.resubscribe(feed);
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
          if (this.get(feed.room) === feed) this.delete(feed.room);
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
    this._host.request({ op: 'history', room: feed.room, since, limit }).then(
      (reply) => {
        if (this.get(feed.room) !== feed) return;
        feed.historyReply(token, reply);
        this.run(feed);
      },
      (error) => {
        feed.historyFailed(token, error);
        this.run(feed);
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
      this.run(feed);
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
}
