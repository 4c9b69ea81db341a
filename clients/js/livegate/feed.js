// The feed of one subscribed room: a small machine that delivers the room's events once and
// in order across subscribes, gaps, overflows and lost connections. It does no I/O and
// reads no clock: the client feeds it inputs (a subscribe to send, the `subscribed` reply,
// an event, a history reply, a refusal, the connection lost, the time) and carries out the
// actions it queues, taken one at a time with `poll()`: send a subscribe, ask history,
// reopen the SSE stream, subscribe again, tell the subscriptions or the client's listeners,
// end the room. `deadline()` is when it wants `tick(now)` (a refused subscribe's retry).
//
// States (`feed.state`):
// - `resubscribing`: nothing in flight; the room is subscribed at the next chance (before
//   the first connection, after a loss, or when a refused subscribe's retry is due).
// - `subscribing`: a subscribe is answered (or, over SSE, the stream is reopened for it):
//   events are held back until the reply says where the room starts.
// - `live`: events are delivered as they come; a gap in their seqs starts `filling` (over
//   SSE, where there are no requests, the stream is reopened from the last delivered seq).
// - `filling`: history is asked for the events of a gap; later events are held back.
// - `ended`: unsubscribed, refused for good, or the client closed: inputs change nothing.
// Held-back events are bounded by MAX_HELD_EVENTS: one more and the room subscribes again
// from its last delivered seq (the server replays them).

/** Event ids remembered per room to drop repeats. */
export const RECENT_IDS = 500;
/** Largest `limit` the server accepts for history: the page a gap is filled with. */
export const HISTORY_PAGE = 1000;
/**
 * Most events a room holds back while its subscribe is answered or a gap is filled; one
 * more and the room drops them and resubscribes from its last delivered seq (the server
 * replays them again), so a slow reply or a long gap cannot grow memory without bound.
 */
export const MAX_HELD_EVENTS = 1000;
/** Error codes that end a subscription instead of retrying it. */
export const FINAL_SUBSCRIBE_ERRORS = new Set([
  'bad_request',
  'bad_room',
  'forbidden',
  'too_many_subscriptions',
  'unknown_op',
]);
/** Codes of a failed history request that mean the connection went (the feed was reset). */
const CONNECTION_GONE = new Set(['disconnected', 'closed', 'stopped']);

/**
 * The room state a `subscribed` reply carries: undefined when it has no `state` key (a
 * recovered reply, or a server without room state), null for "no state", else
 * `{seq, data}` (a state without a usable seq counts as none).
 */
export function snapshotOf(frame) {
  if (!Object.prototype.hasOwnProperty.call(frame, 'state')) return undefined;
  const state = frame.state;
  if (!state || typeof state !== 'object' || !Number.isInteger(state.seq) || state.seq < 0) return null;
  return { seq: state.seq, data: state.data === undefined ? null : state.data };
}

/**
 * One room's feed. `nextRef()` gives the ref of a subscribe (the client's requests share
 * the sequence); `resubscribeMs` is how long a subscribe refused as unavailable waits.
 * The subscriptions (`subs`) are read for what they asked (`wantsState`, `wantsPresence`)
 * and their position (`floor`, which the feed moves as it tells them events).
 */
export class Feed {
  constructor(room, { nextRef, resubscribeMs = 1000 } = {}) {
    this.room = room;
    this._nextRef = nextRef ?? counter();
    this._resubscribeMs = resubscribeMs;
    /** 'resubscribing' | 'subscribing' | 'live' | 'filling' | 'ended'. */
    this.state = 'resubscribing';
    /** The application's Subscription objects on this room. */
    this.subs = new Set();
    this.epoch = null;
    /** Seq of the last event delivered (or the head the subscription started at). */
    this.last = null;
    this._ids = new Set();
    this._idOrder = [];
    /** Ref of the subscribe waiting for its reply ('sse': the stream's own subscribe). */
    this.ref = null;
    /** Events held back (subscribing, filling; live: the ones still to drain, by seq). */
    this.held = [];
    /** The history request filling a gap: {token, target}. */
    this._fill = null;
    this._fills = 0;
    /** When a refused subscribe is tried again (null: no retry pending). */
    this._retryAt = null;
    /** Whether the events come on a stream that names its rooms (SSE): gaps reopen it. */
    this.stream = false;
    this.subscribedOnce = false;
    this.lastReply = null;
    /** Reopened SSE stream: its `recovered` is not news to the app. */
    this._quiet = false;
    /** What the room asks the server for: `state` / `presence` (any of its subscriptions asked). */
    this.wantState = false;
    this.wantPresence = false;
    /** The server lacks the flag (it predates it): never asked again. */
    this.lacks = { state: false, presence: false };
    /** Subscribe without `since` next time, to start from the room's state (a later subscription asked for it). */
    this.fromState = false;
    /** Started from "no state": the first event after the reply is delivered, gap or not. */
    this._fromNothing = false;
    this._out = [];
  }

  /** The next action to carry out, or null. */
  poll() {
    for (;;) {
      if (this._out.length) return this._out.shift();
      // Live with events held back: they are accepted one by one, in seq order (an event
      // may open a gap again, and the rest stay held).
      if (this.state !== 'live' || this.held.length === 0) return null;
      this._accept(this.held.shift());
    }
  }

  /** When the feed wants `tick(now)`, or null. */
  deadline() {
    return this._retryAt;
  }

  // ---- subscriptions ----

  /** The room's first subscription, starting after `since` in `epoch` when given. */
  start(sub, since, epoch) {
    this.add(sub);
    if (since != null) {
      this.last = Number(since);
      this.epoch = epoch ?? null;
    }
  }

  /**
   * Adds a subscription; true when the room now asks for more than it asked the server
   * (the room must be subscribed again for it).
   */
  add(sub) {
    this.subs.add(sub);
    let more = false;
    if (sub.wantsState && !this.wantState && !this.lacks.state) more = this.wantState = true;
    if (sub.wantsPresence && !this.wantPresence && !this.lacks.presence) more = this.wantPresence = true;
    return more;
  }

  /**
   * A later subscription of the room: it shares the server subscription. The others keep
   * their place; it starts at its `since`, its state, or the room's position. True when
   * the room must be subscribed again (it asks for more, its state, or events the room
   * delivered before it came).
   */
  join(sub) {
    for (const other of this.subs) other.floor ??= this.last;
    if (sub.floor == null) sub.floor = this.last;
    let again = this.add(sub);
    if (sub.wantsState && this.wantState) {
      // Its own state: the room starts from the state again (the others that asked for
      // state get it too; the events they are owed come after it, and the rest of the
      // room's subscriptions get what the state stands for as events).
      this.fromState = true;
      again = true;
    } else if (sub.floor != null && this.last != null && sub.floor < this.last) {
      // Events the room delivered before this subscription came: the room goes back to
      // its `since` and the server replays them; the others skip what they had.
      this.last = sub.floor;
      this._forgetIds();
      again = true;
    }
    return again;
  }

  /** Removes a subscription; true when it was the room's last (the room goes with it). */
  leave(sub) {
    return this.subs.delete(sub) && this.subs.size === 0;
  }

  /** Whether a subscribe is being answered (a joining subscription waits for that reply). */
  get awaiting() {
    return this.state === 'subscribing';
  }

  // ---- inputs ----

  /**
   * Sends a subscribe from where the room is (`since`/`epoch`, or from its state). `lacks`:
   * `{state, presence}`, what the server announced it lacks: the room goes on without it.
   */
  subscribe(lacks = {}) {
    if (this.state === 'ended') return;
    this._reset();
    const frame = { op: 'subscribe', room: this.room, ref: this._nextRef() };
    if (this.last != null && !this.fromState) {
      frame.since = this.last;
      if (this.epoch != null) frame.epoch = this.epoch;
    }
    this.withoutUnannounced(lacks);
    if (this.wantState) frame.state = true;
    if (this.wantPresence) frame.presence = true;
    this.ref = frame.ref;
    this.stream = false;
    this.state = 'subscribing';
    this._out.push({ type: 'send', frame });
  }

  /** An SSE stream naming this room was welcomed: its `subscribed` comes next. `quiet`: a reopen. */
  streamOpened(quiet) {
    if (this.state === 'ended') return;
    this._reset();
    this.ref = 'sse';
    this.stream = true;
    this.state = 'subscribing';
    this._quiet = quiet && this.subscribedOnce;
  }

  /**
   * Drops the flags the server lacks (`{state, presence}`), telling why: the room goes on
   * without them and never asks again.
   */
  withoutUnannounced(lacks = {}) {
    for (const [flag, what] of [['state', 'room state'], ['presence', 'presence']]) {
      if (!(flag === 'state' ? this.wantState : this.wantPresence) || !lacks[flag]) continue;
      this._lack(flag);
      const message = `the server has no ${what}: subscribed without it`;
      this._emit('error', { room: this.room, code: 'unsupported', message });
      // Told after subscribe() returned, so the new subscription's listeners hear it too.
      this._tell('error', { room: this.room, code: 'unsupported', message }, null);
    }
  }

  /** A `subscribed` frame; ignored unless it answers this feed's subscribe. */
  subscribed(frame) {
    if (this.state !== 'subscribing') return;
    if (this.ref === 'sse') {
      // The stream's `subscribed` has no ref (the automatic inbox's has no epoch: not a reply).
      if (frame.epoch == null) return;
    } else if (frame.ref == null || frame.ref !== this.ref) {
      return; // the inbox's, or a superseded request's
    }
    const quiet = this._quiet;
    this._quiet = false;
    this.ref = null;
    const epochChanged = this.epoch != null && this.epoch !== frame.epoch;
    const head = Number(frame.seq);
    // The room's state, when this room asked for it and the reply starts from it (a first
    // subscribe, or a recovery that failed): null (none) or {seq, data}.
    const snapshot = this.wantState && frame.recovered !== true ? snapshotOf(frame) : undefined;
    let failed = false;
    this._fromNothing = false;
    if (frame.recovered === true) {
      // The missed events follow this frame.
    } else if (snapshot !== undefined) {
      // The state stands for every event up to its seq: only the events after it follow
      // (again, after a failed recovery: the state replaces what was delivered before).
      // Subscriptions that did not ask for state keep their place: the room goes on from
      // the lowest of them, and they get the events the state stands for.
      const from = snapshot ? snapshot.seq : 0;
      const behind = this._lowestPositionWithoutState();
      this.last = behind != null && behind < from ? behind : from;
      this._fromNothing = snapshot == null && behind == null;
      this._forgetIds();
    } else if (frame.recovered === false) {
      failed = true;
      this.last = head;
    } else if (this.last == null || epochChanged) {
      this.last = head;
    }
    this.epoch = frame.epoch;
    this.fromState = false;
    this.subscribedOnce = true;
    this.lastReply = { room: frame.room, epoch: frame.epoch, seq: head, recovered: frame.recovered };
    if (snapshot !== undefined) this.lastReply.state = snapshot;
    this.state = 'live';
    this._out.push({ type: 'subscribed', reply: this.lastReply });
    if (this.wantState && frame.recovered == null && snapshot === undefined) {
      const message = 'the server sent no room state (it predates room state)';
      this._emit('error', { room: this.room, code: 'unsupported', message });
    }
    if (snapshot !== undefined) {
      const from = snapshot ? snapshot.seq : 0;
      const detail = { room: this.room, data: snapshot ? snapshot.data : null, seq: from, epoch: frame.epoch };
      const told = [...this.subs].filter((sub) => sub.wantsState);
      for (const sub of told) sub.floor = snapshot ? from : null;
      this._tell('state', detail, told);
      if (frame.recovered === false && !quiet) {
        this._emit('recovered', { room: this.room, epoch: frame.epoch, seq: from, state: true });
        this._tell('recovered', { room: this.room, epoch: frame.epoch, seq: from, state: true });
      }
      // Subscriptions without state behind it: what the state stands for, as events.
      if (this.last < from && !this.stream) this._startFill(from);
    } else if (failed) {
      this._emit('recovery_failed', { room: this.room, epoch: frame.epoch, seq: head, reason: 'not_recovered' });
      this._tell('recovery_failed', { room: this.room, epoch: frame.epoch, seq: head, reason: 'not_recovered' });
    } else if (frame.recovered === true && !quiet) {
      this._emit('recovered', { room: this.room, epoch: frame.epoch, seq: head });
      this._tell('recovered', { room: this.room, epoch: frame.epoch, seq: head });
    }
    if (this.state === 'live') this._drainHeld();
  }

  /** One event of the room from the live stream (or a replay). */
  event(event) {
    if (this.state === 'ended') return;
    if (this.state === 'live' && this.held.length) {
      // Still draining what was held back: it goes in its place among them.
      const at = this.held.findIndex((held) => held.seq > event.seq);
      this.held.splice(at < 0 ? this.held.length : at, 0, event);
      return;
    }
    this._accept(event);
  }

  /** Presence changes of the room: to the subscriptions that asked for them. */
  presence(detail) {
    if (this.state === 'ended') return;
    const subs = [...this.subs].filter((sub) => sub.wantsPresence);
    this._tell('presence', detail, subs);
  }

  /** The reply to the history request `token`. */
  historyReply(token, reply) {
    const fill = this._fill;
    if (this.state !== 'filling' || fill?.token !== token) return;
    this._fill = null;
    if (reply.epoch !== this.epoch) return this._gapLost(fill.target, 'epoch_changed');
    let progressed = false;
    for (const event of Array.isArray(reply.events) ? reply.events : []) {
      if (!Number.isInteger(event?.seq) || event.seq <= this.last || event.seq > fill.target) continue;
      if (event.seq !== this.last + 1) break; // trimmed: history has a hole too
      this._deliver(event);
      progressed = true;
    }
    if (this.last >= fill.target) return this._drainHeld();
    if (progressed) return this._startFill(fill.target); // the next page
    this._gapLost(fill.target, 'history_trimmed');
  }

  /** The history request `token` failed with `error` ({code}). */
  historyFailed(token, error) {
    const fill = this._fill;
    if (this.state !== 'filling' || fill?.token !== token) return;
    this._fill = null;
    if (CONNECTION_GONE.has(error?.code)) {
      this._reset();
      this.state = 'resubscribing';
      return;
    }
    this._gapLost(fill.target, error?.code ?? 'history_failed');
  }

  /**
   * The server refused this feed's subscribe with the `error` frame. `featuresKnown`: the
   * welcome listed the server's features (else a `bad_request` means it lacks the newest
   * flag asked: presence, then state). Unavailable and the like: tried again after
   * `resubscribeMs` from `now`; a final code ends the room.
   */
  refused(frame, { featuresKnown = true } = {}, now = 0) {
    if (this.state === 'ended') return;
    const newest = this.wantPresence ? 'presence' : this.wantState ? 'state' : null;
    const flag = !featuresKnown && frame.code === 'bad_request' && newest;
    if (flag) {
      this._lack(flag);
      const what = flag === 'state' ? 'room state' : 'presence';
      const message = `the server has no ${what}: subscribed without it`;
      this._emit('error', { room: this.room, code: 'unsupported', message });
      this._tell('error', { room: this.room, code: 'unsupported', message });
      this._out.push({ type: 'resubscribe' });
      return;
    }
    this.ref = null;
    this.held = [];
    this.state = 'resubscribing';
    this._emit('error', { room: this.room, code: frame.code, message: frame.message });
    this._tell('error', { room: this.room, code: frame.code, message: frame.message });
    if (FINAL_SUBSCRIBE_ERRORS.has(frame.code)) {
      this._end();
      this._out.push({ type: 'end', code: frame.code, message: frame.message });
      return;
    }
    this._retryAt = now + this._resubscribeMs;
  }

  /** The time is `now`: a refused subscribe's retry may be due. */
  tick(now) {
    if (this._retryAt == null || now < this._retryAt) return;
    this._retryAt = null;
    if (this.state === 'resubscribing') this._out.push({ type: 'resubscribe' });
  }

  /** The connection ended (or the SSE stream is reopened): the next one subscribes from `last`. */
  lost() {
    if (this.state === 'ended') return;
    this._reset();
    this.state = 'resubscribing';
  }

  /** The room is no longer delivered (unsubscribed, refused, the client closed): nothing more. */
  end() {
    this._end();
    this._out = [];
  }

  /** Where delivery stands: `{epoch, seq}`. */
  position() {
    return { epoch: this.epoch, seq: this.last };
  }

  // ---- inside ----

  _accept(event) {
    if (this.state === 'subscribing' || this.state === 'filling') {
      if (this.held.length >= MAX_HELD_EVENTS) return this._overflow();
      this.held.push(event);
      return;
    }
    if (this.last != null && event.seq <= this.last) return; // already delivered
    if (this._fromNothing) {
      // The room had no state: its view starts with the first event that follows,
      // wherever the retained history starts.
      this._fromNothing = false;
    } else if (this.last != null && event.seq > this.last + 1) {
      if (this.stream) {
        // No history requests over SSE: reopen the stream from the last delivered seq,
        // which the server replays exactly (or answers recovered:false).
        this._awaitReopen();
        return;
      }
      this.held.unshift(event);
      this._startFill(event.seq - 1);
      return;
    }
    this._deliver(event);
  }

  _deliver(event) {
    this.last = event.seq;
    if (!this._firstDelivery(event.id)) return; // a repeat of an id already delivered
    const told = [];
    for (const sub of this.subs) {
      if (sub.floor != null && event.seq <= sub.floor) continue; // it had this one (or its state covers it)
      sub.floor = event.seq;
      told.push(sub);
    }
    this._tell('event', event, told);
  }

  /**
   * `MAX_HELD_EVENTS` are held back already: drop them and subscribe again from the last
   * delivered seq (over SSE: reopen the stream from there); the server replays them.
   */
  _overflow() {
    if (this.stream) return this._awaitReopen();
    this.subscribe(); // the flags the server lacks were dropped when this link subscribed
  }

  /** Over SSE: held events dropped, the stream reopened from the last delivered seq. */
  _awaitReopen() {
    this._fill = null;
    this.held = [];
    this.state = 'subscribing';
    this._out.push({ type: 'reopen' });
  }

  /** Asks history for the events after `last` up to `target`; later events are held. */
  _startFill(target) {
    const token = ++this._fills;
    this._fill = { token, target };
    this.state = 'filling';
    this._out.push({ type: 'history', since: this.last, limit: Math.min(target - this.last, HISTORY_PAGE), token });
  }

  /** A gap history cannot fill: tell the application and go on after it. */
  _gapLost(target, reason) {
    this.last = Math.max(this.last, target);
    this._emit('recovery_failed', { room: this.room, epoch: this.epoch, seq: target, reason });
    this._tell('recovery_failed', { room: this.room, epoch: this.epoch, seq: target, reason });
    this._drainHeld();
  }

  /** Goes live; `poll()` hands the held events on in seq order. */
  _drainHeld() {
    this.state = 'live';
    this.held.sort((a, b) => a.seq - b.seq);
  }

  /** Asks the client to emit `name` to its listeners. */
  _emit(name, detail) {
    this._out.push({ type: 'emit', name, detail });
  }

  /**
   * Asks the client to tell `subs` (default: every subscription now) `name`; null: every
   * subscription of the room once the caller has returned (a microtask later).
   */
  _tell(name, detail, subs = [...this.subs]) {
    if (subs === null) this._out.push({ type: 'tell', name, detail, later: true });
    else this._out.push({ type: 'tell', name, detail, subs });
  }

  _lack(flag) {
    if (flag === 'state') {
      this.wantState = false;
      this.fromState = false;
    } else this.wantPresence = false;
    this.lacks[flag] = true;
  }

  _reset() {
    this._retryAt = null;
    this._fill = null;
    this.ref = null;
    this.held = [];
  }

  _end() {
    this._reset();
    this.state = 'ended';
  }

  /** The lowest position of the subscriptions that did not start from the room's state. */
  _lowestPositionWithoutState() {
    let lowest = null;
    for (const sub of this.subs) {
      if (sub.wantsState || sub.floor == null) continue;
      lowest = lowest == null ? sub.floor : Math.min(lowest, sub.floor);
    }
    return lowest;
  }

  /**
   * Remembers a delivered event's id; false when the id was delivered already (a
   * repeat, dropped). The last `RECENT_IDS` ids are remembered.
   */
  _firstDelivery(id) {
    if (id == null) return true;
    if (this._ids.has(id)) return false;
    this._ids.add(id);
    this._idOrder.push(id);
    if (this._idOrder.length > RECENT_IDS) this._ids.delete(this._idOrder.shift());
    return true;
  }

  /** Forgets the remembered ids (the room starts again from a state). */
  _forgetIds() {
    this._ids.clear();
    this._idOrder = [];
  }
}

/** Refs 1, 2, 3, ... (a feed on its own, in tests). */
function counter() {
  let next = 1;
  return () => next++;
}
