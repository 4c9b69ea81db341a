// Subscriptions: what the client knows about each subscribed room across connections
// (its epoch, the last seq delivered, the recent event ids, the events held back while a
// subscribe is answered or a gap is filled) and the handlers it delivers to.

/** Event ids remembered per room to drop repeats. */
export const RECENT_IDS = 500;
/** Largest `limit` the server accepts for history: the page a gap is filled with. */
export const HISTORY_PAGE = 1000;
/** Error codes that end a subscription instead of retrying it. */
export const FINAL_SUBSCRIBE_ERRORS = new Set(['bad_request', 'bad_room', 'forbidden', 'too_many_subscriptions', 'unknown_op']);

/** What the client knows about one subscribed room across connections. */
export class RoomState {
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
    /** Cancels the timer of a resubscribe after `unavailable`, when one is pending. */
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
