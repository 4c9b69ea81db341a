// The client's own events: its listeners (emitter.js) and the `debug` option, which logs
// the connection's events (state changes, connecting, connected, ...) as they are emitted.
// An `error` nobody listens to with a thrown error in it goes to console.error; what a
// listener throws too, and the next listener is called.

import { Listeners } from './emitter.js';

export class ClientEvents {
  /** `debug`: the client's `debug` option. */
  constructor(debug) {
    this._listeners = new Listeners();
    this._debug = debugOf(debug);
  }

  on(name, fn) {
    return this._listeners.on(name, fn);
  }

  off(name, fn) {
    this._listeners.off(name, fn);
  }

  /** Logs `name` when it is debugged, then calls its listeners with `detail`. */
  emit(name, detail) {
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

/** The events the `debug` option logs. */
const DEBUGGED = new Set(['state', 'connecting', 'connected', 'disconnected', 'transport', 'redirect', 'warning', 'signed_out']);

/** The `debug` option as a function `(message, detail)`, or null. */
function debugOf(option) {
  if (option === true) return (message, detail) => console.debug('livegate:', message, detail);
  if (typeof option === 'function') return option;
  if (option && typeof option.debug === 'function') return (message, detail) => option.debug(message, detail);
  return null;
}
