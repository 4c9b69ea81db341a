// The WebSocket transport: one WebSocket per attempt, its frames handed up as text. It
// knows the socket's API (the browser's, Node's or any constructor of the same shape) and
// nothing of the protocol above it.
//
// Every transport has the same shape: `open(url, handlers)` starts the attempt, where
// `handlers` is {onOpen(), onHeard(), onFrame(text, meta), onClose(code, reason),
// onRefused(refusal), onProblem(code, message)}; `send(frame)` says whether the frame went
// out; `close(code, reason)` ends it without calling any handler again. `name` is the
// transport's name in the `transport` option and events; `requests` whether the client
// can send requests over it.

const OPEN = 1;

export class WebSocketTransport {
  constructor(Socket) {
    this.name = 'websocket';
    this.requests = true;
    this._Socket = Socket;
    this._ws = null;
  }

  /** Opens the socket; throws (without the URL, which may hold a credential) when it cannot. */
  open(url, handlers) {
    let ws;
    try {
      ws = new this._Socket(url);
    } catch {
      // The message of a constructor error may quote the URL: never pass it on.
      throw new Error('cannot open a WebSocket');
    }
    this._ws = ws;
    ws.onopen = () => handlers.onOpen();
    ws.onmessage = (message) => {
      if (this._ws !== ws) return;
      handlers.onHeard();
      handlers.onFrame(message.data, null);
    };
    ws.onerror = () => {}; // a close event follows
    ws.onclose = (event) => {
      if (this._ws !== ws) return;
      this._detach();
      handlers.onClose(event?.code ?? 1006, event?.reason ?? '');
    };
  }

  send(frame) {
    const ws = this._ws;
    if (!ws || ws.readyState !== OPEN) return false;
    try {
      ws.send(JSON.stringify(frame));
      return true;
    } catch {
      return false;
    }
  }

  /** Closes the socket with `code` (the reason is dropped when the socket refuses it). */
  close(code, reason) {
    const ws = this._detach();
    if (!ws) return;
    try {
      ws.close(code, String(reason).slice(0, 120));
    } catch {
      try {
        ws.close(code); // the reason was refused (over 123 bytes of UTF-8)
      } catch {
        // not open yet, or already closing
      }
    }
  }

  _detach() {
    const ws = this._ws;
    if (ws) ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null;
    this._ws = null;
    return ws;
  }
}

/**
 * The client's WebSocket constructor: the one given (the option, else the global one),
 * or in Node without one the `ws` package's, loaded before the first attempt.
 */
export class WebSocketSource {
  /** `wanted`: whether the client's transports include WebSocket. */
  constructor(given, wanted) {
    /** The constructor, or null (none, or still loading). */
    this.Socket = typeof given === 'function' ? given : null;
    /** Node without a global WebSocket: the `ws` package's constructor, loading (or null). */
    this.loading = !this.Socket && wanted && isNode() ? loadWs() : null;
    /** No WebSocket at all although asked for: the first attempt warns. */
    this._warn = wanted && !this.Socket && !this.loading;
  }

  /** Whether there is a constructor, or one loading. */
  get available() {
    return !!(this.Socket || this.loading);
  }

  /** Waits for the `ws` package (while `loading`): its constructor, or a warning to come. */
  async load() {
    const Socket = await this.loading;
    this.loading = null;
    if (Socket) this.Socket = Socket;
    else this._warn = true;
  }

  /** Whether the next attempt must say there is no WebSocket (true once). */
  missing() {
    if (!this._warn) return false;
    this._warn = false;
    return !this.Socket;
  }
}

/** Whether this runs in Node (where a missing WebSocket can come from the `ws` package). */
function isNode() {
  return typeof globalThis.process?.versions?.node === 'string' && typeof globalThis.document === 'undefined';
}

/**
 * Node without a global WebSocket (20 without --experimental-websocket): the `ws`
 * package's constructor when it is installed (an optional peer dependency), else null.
 */
async function loadWs() {
  const specifier = 'ws'; // not a literal: bundlers leave it alone, browsers never get here
  try {
    const module = await import(/* webpackIgnore: true */ /* @vite-ignore */ specifier);
    const Socket = module.WebSocket ?? module.default;
    return typeof Socket === 'function' ? Socket : null;
  } catch {
    return null;
  }
}
