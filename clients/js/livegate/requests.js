// The requests waiting for replies (publish, history, presence): each one's ref, its
// frame (sent, or queued until the next connection), its timeout and AbortSignal, and
// how it settles: a reply, an `error` frame naming its ref, a timeout, an abort, or a
// loss that rejects it (all, or those sent on the lost connection). The client gives
// each its ref and decides when one may be sent; this file owns the waiting (and makes
// the random id of a publish).

import { livegateError as lgError } from './errors.js';

export class Requests {
  /** `clock`: see clock.js; `timeoutMs`: the default wait for a reply (0: none). */
  constructor(clock, timeoutMs) {
    this._clock = clock;
    this._timeoutMs = timeoutMs;
    this._requests = new Map(); // ref -> {resolve, reject, frame, sent}
    this._queued = []; // requests waiting for a connection: [ref, ...]
  }

  /**
   * Waits for the reply to `frame` (its `ref` set): rejects with `timeout` after
   * `timeoutMs` (default: the client's) without a reply, and with `aborted` when `signal`
   * aborts (the reply, if one still comes, is dropped). `trySend()` sends the frame now
   * if it can (true); else it waits in the queue for `flush()`.
   */
  add(frame, { signal, timeoutMs }, trySend) {
    const ref = frame.ref;
    return new Promise((resolve, reject) => {
      const ms = timeoutMs ?? this._timeoutMs;
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
        timer = this._clock.setTimeout(() => giveUp(lgError('timeout', `${frame.op}: no reply within ${ms} ms`)), ms);
      }
      if (signal) {
        onAbort = () => giveUp(abortedBy(signal, frame.op));
        signal.addEventListener('abort', onAbort, { once: true });
      }
      if (trySend()) request.sent = true;
      else this._queued.push(ref);
    });
  }

  /** Sends the queued requests with `send(frame)` (true when sent); the rest stay queued. */
  flush(send) {
    for (const ref of this._queued.splice(0)) {
      const request = this._requests.get(ref);
      if (request && send(request.frame)) request.sent = true;
      else if (request) this._queued.push(ref);
    }
  }

  /** Rejects pending requests: all, or (onlySent) those sent on the lost connection. */
  rejectAll(error, onlySent = false) {
    for (const [ref, request] of this._requests) {
      if (onlySent && !request.sent) continue;
      this._requests.delete(ref);
      request.reject(error);
    }
    if (!onlySent) this._queued.length = 0;
  }

  /** A reply frame: resolves the request its `ref` names, if one still waits. */
  reply(frame) {
    if (frame.ref == null) return;
    const request = this._requests.get(frame.ref);
    if (!request) return;
    this._requests.delete(frame.ref);
    request.resolve(frame);
  }

  /** An `error` frame: rejects the request its `ref` names; false when none waits. */
  refused(frame) {
    const request = frame.ref != null && this._requests.get(frame.ref);
    if (!request) return false;
    this._requests.delete(frame.ref);
    request.reject(lgError(frame.code, frame.message));
    return true;
  }
}

/** The rejection of a request whose `signal` aborted. */
export function abortedBy(signal, op) {
  return lgError('aborted', `${op} aborted`, { cause: signal.reason });
}

/** `bytes` random bytes as hex, for a publish's idempotency id (crypto when there is one: ids must not repeat). */
export function randomHex(bytes) {
  const buffer = new Uint8Array(bytes);
  if (globalThis.crypto?.getRandomValues) globalThis.crypto.getRandomValues(buffer);
  else for (let i = 0; i < bytes; i++) buffer[i] = Math.floor(Math.random() * 256);
  return Array.from(buffer, (b) => b.toString(16).padStart(2, '0')).join('');
}
