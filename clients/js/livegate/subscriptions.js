// Subscriptions: the application's Subscription objects. Several of them share one room
// (one server subscription, one feed: feed.js), each with its own listeners, its own
// position and what it asked for (state, presence).

import { Listeners } from './emitter.js';
import { livegateError } from './errors.js';

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
