// The Server-Sent Events transport: one fetch() per attempt, its streamed body read with
// the event-stream parser, each message's data handed up as a frame. It knows HTTP (a
// refusal's status, JSON error and Retry-After; the Date header) and the stream's own
// `event: close`; the client decides what they mean. SSE carries no client frames:
// `send()` always says no, and the client does not send requests over it.
// The transport interface is described in transport-websocket.js.

import { EventStreamParser } from './event-stream.js';
import { firstNumber } from './urls.js';

export class SseTransport {
  constructor(fetchFn) {
    this.name = 'sse';
    this.requests = false;
    this._fetch = fetchFn;
    this._open = null; // the current request: {controller, reader, dead}
  }

  /** Starts the request; the handlers run until it ends or `close()` is called. */
  open(url, handlers) {
    const request = { controller: new AbortController(), reader: null, dead: false };
    this._open = request;
    this._read(request, url, handlers);
  }

  send() {
    return false;
  }

  close() {
    const request = this._open;
    this._open = null;
    if (!request || request.dead) return;
    request.dead = true;
    try {
      request.reader?.cancel().catch(() => {});
    } catch {
      // already done
    }
    request.controller.abort();
  }

  async _read(request, url, handlers) {
    const live = () => this._open === request;
    const end = (code, reason) => {
      this.close();
      handlers.onClose(code, reason);
    };
    let response;
    try {
      response = await this._fetch(url, { signal: request.controller.signal, cache: 'no-store', headers: { Accept: 'text/event-stream' } });
    } catch (error) {
      if (live()) end(1006, `SSE request failed: ${error?.cause?.code ?? error?.message ?? error}`);
      return;
    }
    if (!live()) {
      cancelBody(response);
      return;
    }
    handlers.onOpen({ date: Date.parse(response.headers?.get?.('date') ?? '') });
    if (!live()) return;
    if (!response.ok) {
      const refusal = await refusalOf(response);
      if (!live()) return;
      this.close();
      handlers.onRefused(refusal);
      return;
    }
    if (!response.body?.getReader) {
      this.close();
      handlers.onProblem('sse', 'this fetch() gives no streamed response body');
      handlers.onClose(1006, 'no streamed body');
      return;
    }
    const reader = response.body.getReader();
    request.reader = reader;
    const decoder = new TextDecoder();
    const parser = new EventStreamParser((message) => live() && this._message(message, handlers, end));
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (!live()) return;
        if (done) break;
        handlers.onHeard();
        parser.push(decoder.decode(value, { stream: true }));
        if (!live()) return;
      }
      parser.push(decoder.decode());
      parser.end();
    } catch (error) {
      if (live()) end(1006, `SSE stream broke: ${error?.cause?.code ?? error?.name ?? 'error'}`);
      return;
    }
    if (live()) end(1006, 'SSE stream ended');
  }

  /** One message of the stream: `event: close` ends it with the close code it carries. */
  _message(message, handlers, end) {
    if (message.type === 'close') {
      let detail = {};
      try {
        detail = JSON.parse(message.data);
      } catch {
        // no detail
      }
      end(Number(detail?.code) || 1006, String(detail?.reason ?? ''));
      return;
    }
    if (message.data === '') return;
    handlers.onFrame(message.data, { type: message.type, id: message.id });
  }
}

/**
 * What a non-2xx answer says: `{status, code, message, error, retryAfterSeconds}`
 * (`error`: the JSON body's `error` object, or null).
 */
async function refusalOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON
  }
  const status = response.status;
  const error = body?.error && typeof body.error === 'object' ? body.error : null;
  const message = String(error?.message ?? `HTTP ${status}`);
  return {
    status,
    code: error?.code ?? `http_${status}`,
    message,
    error,
    retryAfterSeconds: firstNumber(response.headers?.get?.('retry-after') ?? '') ?? firstNumber(message),
  };
}

/** Stops reading a response body nobody needs. */
export function cancelBody(response) {
  try {
    response?.body?.cancel?.().catch(() => {});
  } catch {
    // locked or gone
  }
}
