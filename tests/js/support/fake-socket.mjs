// A scripted stand-in for WebSocket, for the unit-level tests of livegate.js only (gap
// fill, duplicates, backoff): the test plays the server by calling `serverSend` and
// `serverClose` and reads what the client sent from `sent`.

import { waitFor } from './clock.mjs';

/**
 * Returns a WebSocket-shaped class whose instances are recorded in `Fake.sockets`.
 * `behaviour(socket)` runs right after construction (e.g. fail at once). With a `clock`
 * (support/virtual-clock.mjs, the one the client was given), sockets are stamped with its
 * time and `nth` moves that clock on instead of waiting.
 */
export function fakeSocketClass(behaviour = (socket) => socket.open(), clock = null) {
  const sockets = [];
  const waiters = [];
  class FakeSocket {
    static sockets = sockets;

    /** Resolves with the n-th socket (0-based) once the client created it (within `ms`, virtual with a clock). */
    static nth(n, ms = 5000) {
      if (sockets[n]) return Promise.resolve(sockets[n]);
      if (clock) {
        // Resolved by the constructor itself, as without a clock: the test runs before
        // the socket's behaviour; the clock runs timers until then.
        return new Promise((resolve, reject) => {
          waiters.push({ n, resolve });
          clock.until(() => sockets[n], `socket #${n}`, ms).catch(reject);
        });
      }
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no socket #${n} within ${ms} ms`)), ms);
        waiters.push({ n, resolve: (s) => (clearTimeout(timer), resolve(s)) });
      });
    }

    constructor(url) {
      this.url = url;
      this.readyState = 0;
      this.sent = [];
      this.closedByClient = null;
      this.createdAt = clock ? clock.now() : Date.now();
      this.onopen = this.onmessage = this.onclose = this.onerror = null;
      sockets.push(this);
      for (const waiter of waiters.filter((w) => w.n === sockets.length - 1)) waiter.resolve(this);
      queueMicrotask(() => behaviour(this));
    }

    send(text) {
      if (this.readyState !== 1) throw new Error('not open');
      this.sent.push(JSON.parse(text));
    }

    close(code, reason) {
      if (this.readyState >= 2) return;
      this.readyState = 2;
      this.closedByClient = { code, reason };
      setTimeout(() => this.serverClose(code ?? 1005, reason ?? ''), 0);
    }

    // ---- the test's side ----

    open() {
      this.readyState = 1;
      this.onopen?.({ type: 'open' });
    }

    welcome(session = 'S1', extra = {}) {
      if (this.readyState === 0) this.open();
      this.serverSend({ op: 'welcome', session, node: 'fake', heartbeat_ms: 30000, warmup: false, ...extra });
    }

    serverSend(frame) {
      this.onmessage?.({ type: 'message', data: JSON.stringify(frame) });
    }

    events(room, ...events) {
      this.serverSend({
        op: 'events',
        events: events.map((e) => (typeof e === 'number' ? { seq: e, id: `e-${e}` } : e)).map((e) => ({
          room,
          ts_ms: 1,
          data: { n: e.seq },
          ...e,
        })),
      });
    }

    fail() {
      this.readyState = 3;
      this.onerror?.({ type: 'error' });
      this.onclose?.({ type: 'close', code: 1006, reason: '', wasClean: false });
    }

    serverClose(code, reason = '') {
      if (this.readyState === 3) return;
      this.readyState = 3;
      this.onclose?.({ type: 'close', code, reason, wasClean: true });
    }

    /** The frames the client sent with this op. */
    frames(op) {
      return this.sent.filter((f) => f.op === op);
    }

    /** Waits until the client sent a frame with `op` (and matching `filter`). */
    async expect(op, filter = () => true, ms = 2000) {
      const sent = () => this.sent.find((f) => f.op === op && filter(f));
      return waitFor(sent, `a ${op} frame`, ms, 2).catch(() => {
        throw new Error(`client sent no ${op} frame within ${ms} ms; sent: ${JSON.stringify(this.sent)}`);
      });
    }
  }
  return FakeSocket;
}
