// Subscriptions: what the client knows about each subscribed room across connections
// (RoomState: its epoch, the last seq delivered, the recent event ids, the events held
// back while a subscribe is answered or a gap is filled), and the application's
// Subscription objects: several of them share one room (one server subscription), each
// with its own listeners, its own position and what it asked for (state, presence).

import { Listeners } from './emitter.js';
import { livegateError } from './errors.js';

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
export const FINAL_SUBSCRIBE_ERRORS = new Set(['bad_request', 'bad_room', 'forbidden', 'too_many_subscriptions', 'unknown_op']);

/** What the client knows about one subscribed room across connections. */
export class RoomState {
  constructor(room) {
    this.room = room;
    /** The application's Subscription objects on this room. */
    this.subs = new Set();
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
    /** Cancels the timer of a resubscribe after `unavailable`, when one is pending. */
    this.retry = null;
    this.subscribedOnce = false;
    this.lastReply = null;
    /** Reopened SSE stream: its `recovered` is not news to the app. */
    this.quiet = false;
    /** What the room asks the server for: `state` / `presence` (any of its subscriptions asked). */
    this.wantState = false;
    this.wantPresence = false;
    /** The server refused the flag (it predates it): never asked again. */
    this.lacks = { state: false, presence: false };
    /** Subscribe without `since` next time, to start from the room's state (a later subscription asked for it). */
    this.fromState = false;
    /** Started from "no state": the first event after the reply is delivered, gap or not. */
    this.fromNothing = false;
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

  /** The lowest position of the subscriptions that did not start from the room's state. */
  lowestPositionWithoutState() {
    let lowest = null;
    for (const sub of this.subs) {
      if (sub.wantsState || sub.floor == null) continue;
      lowest = lowest == null ? sub.floor : Math.min(lowest, sub.floor);
    }
    return lowest;
  }

  cancel() {
    this.retry?.();
    this.retry = null;
    this.filling = null;
    this.awaiting = false;
    this.ref = null;
    this.buffer = [];
  }

  /**
   * Remembers a delivered event's id; false when the id was delivered already (a
   * repeat, dropped). The last `RECENT_IDS` ids are remembered.
   */
  firstDelivery(id) {
    if (id == null) return true;
    if (this.ids.has(id)) return false;
    this.ids.add(id);
    this.idOrder.push(id);
    if (this.idOrder.length > RECENT_IDS) this.ids.delete(this.idOrder.shift());
    return true;
  }

  /** Forgets the remembered ids (the room starts again from a state). */
  forgetIds() {
    this.ids.clear();
    this.idOrder = [];
  }

  /** The connection ended: the server replays from `last` on the next one. */
  connectionLost() {
    this.cancel();
  }
}

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
 * One subscription of the application to a room: `client.subscribe(room, {since, epoch,
 * state, presence})`. Its state is `unsubscribed`, `subscribing` or `subscribed`; its
 * events are `event` (each event of the room once and in order, after its position),
 * `state` ({room, data, seq, epoch}: the room's state, when it asked for it; the events
 * after `seq` follow), `presence` ({room, count, joined, left}, when it asked for it),
 * `subscribing`, `subscribed` (the reply), `unsubscribed` ({code, reason}), `recovered`,
 * `recovery_failed` and `error`. `unsubscribe()` ends this subscription only; the
 * server's subscription ends with the room's last one.
 */
export class Subscription {
  constructor(room, options, detach) {
    this.room = room;
    this.wantsState = options.state === true;
    this.wantsPresence = options.presence === true;
    /** Seq of the last event this subscription was given (or its state's, or its `since`); null: from the room's next. */
    this.floor = options.since != null ? Number(options.since) : null;
    this._state = 'unsubscribed';
    this._listeners = new Listeners();
    this._waiters = [];
    this._reply = null;
    this._detach = detach;
  }

  /** 'unsubscribed' | 'subscribing' | 'subscribed'. */
  get state() {
    return this._state;
  }

  /** Listens to one of the subscription's events; returns a function that removes the listener. */
  on(name, fn) {
    return this._listeners.on(name, fn);
  }

  off(name, fn) {
    this._listeners.off(name, fn);
  }

  /**
   * A promise of the first `subscribed` reply (`{room, epoch, seq, recovered, state?}`); it
   * rejects when the room is refused, or the subscription ends first.
   */
  ready() {
    if (this._reply) return Promise.resolve(this._reply);
    if (this._state === 'unsubscribed' && this._ended) return Promise.reject(this._ended);
    const promise = new Promise((resolve, reject) => this._waiters.push({ resolve, reject }));
    promise.catch(() => {}); // the caller may ignore it; the error also goes to `error`
    return promise;
  }

  /** Ends this subscription (its listeners hear nothing more); the others on the room go on. */
  unsubscribe() {
    if (this._state === 'unsubscribed') return;
    this._detach(this);
    this._end('unsubscribed', `unsubscribed from ${this.room}`);
  }

  /** The room's reply came: subscribed. */
  _subscribed(reply) {
    this._reply ??= reply;
    for (const waiter of this._waiters.splice(0)) waiter.resolve(this._reply);
    this._move('subscribed', reply);
  }

  /** The room is being subscribed (again, after a loss). */
  _subscribing() {
    this._move('subscribing', { room: this.room });
  }

  /** Ends without listeners: `code` says why (`unsubscribed`, `closed`, a refusal's code). */
  _end(code, reason) {
    this._ended = livegateError(code, reason);
    for (const waiter of this._waiters.splice(0)) waiter.reject(this._ended);
    this._move('unsubscribed', { room: this.room, code, reason });
  }

  _move(state, detail) {
    if (this._state === state) return;
    this._state = state;
    this._tell(state, detail);
  }

  /** Hands `detail` to the listeners of `name`; what a listener throws goes to `onThrow`. */
  _tell(name, detail, onThrow = null) {
    this._listeners.emit(name, detail, (error) => {
      if (onThrow) onThrow(error);
      else if (typeof console !== 'undefined') console.error(`livegate: a ${name} listener of ${this.room} threw`, error);
    });
  }
}
