// A minimal RFC 6455 WebSocket client over node:http, shaped like the browser's
// WebSocket (onopen/onmessage/onclose/onerror, send, close, readyState), for Node 20
// where the global WebSocket needs --experimental-websocket. Text and binary frames,
// client masking, continuation frames, ping/pong, and the close handshake with code and
// reason. Not for production: no extensions, no subprotocols, no TLS.

import { createHash, randomBytes } from 'node:crypto';
import http from 'node:http';

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';

export class MiniWebSocket {
  static CONNECTING = 0;
  static OPEN = 1;
  static CLOSING = 2;
  static CLOSED = 3;

  constructor(url) {
    this.url = url;
    this.readyState = MiniWebSocket.CONNECTING;
    this.onopen = this.onmessage = this.onclose = this.onerror = null;
    this._socket = null;
    this._buffer = Buffer.alloc(0);
    this._fragments = null;
    this._closeSent = false;
    this._closeReceived = null; // {code, reason}
    this._finished = false;

    const target = new URL(url);
    if (target.protocol !== 'ws:') throw new SyntaxError(`MiniWebSocket supports ws:// only: ${url}`);
    const key = randomBytes(16).toString('base64');
    this._request = http.request({
      host: target.hostname,
      port: target.port || 80,
      path: target.pathname + target.search,
      headers: {
        Connection: 'Upgrade',
        Upgrade: 'websocket',
        'Sec-WebSocket-Key': key,
        'Sec-WebSocket-Version': '13',
      },
    });
    this._request.on('upgrade', (res, socket, head) => {
      const expected = createHash('sha1').update(key + GUID).digest('base64');
      if (res.headers['sec-websocket-accept'] !== expected) {
        socket.destroy();
        return this._fail('bad Sec-WebSocket-Accept');
      }
      this._socket = socket;
      socket.setNoDelay(true);
      socket.on('data', (chunk) => this._onData(chunk));
      socket.on('close', () => this._finish());
      socket.on('error', () => {}); // 'close' follows
      this.readyState = MiniWebSocket.OPEN;
      this.onopen?.({ type: 'open' });
      if (head && head.length) this._onData(head);
    });
    this._request.on('response', (res) => {
      // Not upgraded (401, 503, ...): like a browser, an error then close 1006.
      res.resume();
      this._fail(`HTTP ${res.statusCode}`);
    });
    this._request.on('error', (error) => this._fail(error.message));
    this._request.end();
  }

  send(data) {
    if (this.readyState !== MiniWebSocket.OPEN) throw new Error('InvalidStateError: socket not open');
    const text = typeof data === 'string';
    this._write(text ? 0x1 : 0x2, text ? Buffer.from(data, 'utf8') : Buffer.from(data));
  }

  close(code = 1000, reason = '') {
    if (this.readyState === MiniWebSocket.CLOSED || this.readyState === MiniWebSocket.CLOSING) return;
    if (this.readyState === MiniWebSocket.CONNECTING) {
      this._request.destroy();
      return this._fail('closed before open');
    }
    this.readyState = MiniWebSocket.CLOSING;
    this._sendClose(code, reason);
    // The server answers with its Close and ends the TCP connection; do not wait forever.
    setTimeout(() => this._socket?.destroy(), 2000).unref();
  }

  /** Test hook: drop the TCP connection without a close handshake. */
  terminate() {
    this._socket?.destroy();
    if (!this._socket) this._request.destroy();
  }

  _fail(message) {
    if (this._finished) return;
    this.onerror?.({ type: 'error', message });
    this._finish();
  }

  _finish() {
    if (this._finished) return;
    this._finished = true;
    this.readyState = MiniWebSocket.CLOSED;
    const closed = this._closeReceived;
    this.onclose?.({
      type: 'close',
      code: closed ? closed.code : 1006,
      reason: closed ? closed.reason : '',
      wasClean: !!closed && this._closeSent,
    });
  }

  _sendClose(code, reason) {
    if (this._closeSent || !this._socket) return;
    this._closeSent = true;
    let payload = Buffer.alloc(0);
    if (code != null && code !== 1005) {
      const text = Buffer.from(reason || '', 'utf8');
      payload = Buffer.alloc(2 + text.length);
      payload.writeUInt16BE(code, 0);
      text.copy(payload, 2);
    }
    this._write(0x8, payload);
  }

  _write(opcode, payload) {
    if (!this._socket || this._socket.destroyed) return;
    const mask = randomBytes(4);
    const length = payload.length;
    let header;
    if (length < 126) {
      header = Buffer.alloc(2);
      header[1] = 0x80 | length;
    } else if (length < 65536) {
      header = Buffer.alloc(4);
      header[1] = 0x80 | 126;
      header.writeUInt16BE(length, 2);
    } else {
      header = Buffer.alloc(10);
      header[1] = 0x80 | 127;
      header.writeBigUInt64BE(BigInt(length), 2);
    }
    header[0] = 0x80 | opcode;
    const masked = Buffer.alloc(length);
    for (let i = 0; i < length; i++) masked[i] = payload[i] ^ mask[i & 3];
    this._socket.write(Buffer.concat([header, mask, masked]));
  }

  _onData(chunk) {
    this._buffer = this._buffer.length ? Buffer.concat([this._buffer, chunk]) : chunk;
    for (;;) {
      const buf = this._buffer;
      if (buf.length < 2) return;
      const fin = (buf[0] & 0x80) !== 0;
      const opcode = buf[0] & 0x0f;
      const masked = (buf[1] & 0x80) !== 0;
      let length = buf[1] & 0x7f;
      let offset = 2;
      if (length === 126) {
        if (buf.length < 4) return;
        length = buf.readUInt16BE(2);
        offset = 4;
      } else if (length === 127) {
        if (buf.length < 10) return;
        length = Number(buf.readBigUInt64BE(2));
        offset = 10;
      }
      let mask = null;
      if (masked) {
        if (buf.length < offset + 4) return;
        mask = buf.subarray(offset, offset + 4);
        offset += 4;
      }
      if (buf.length < offset + length) return;
      let payload = Buffer.from(buf.subarray(offset, offset + length));
      if (mask) for (let i = 0; i < payload.length; i++) payload[i] ^= mask[i & 3];
      this._buffer = buf.subarray(offset + length);
      this._onFrame(fin, opcode, payload);
    }
  }

  _onFrame(fin, opcode, payload) {
    switch (opcode) {
      case 0x0: // continuation
        if (!this._fragments) return;
        this._fragments.parts.push(payload);
        if (fin) {
          const { opcode: first, parts } = this._fragments;
          this._fragments = null;
          this._message(first, Buffer.concat(parts));
        }
        return;
      case 0x1:
      case 0x2:
        if (fin) this._message(opcode, payload);
        else this._fragments = { opcode, parts: [payload] };
        return;
      case 0x8: {
        const code = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
        const reason = payload.length > 2 ? payload.subarray(2).toString('utf8') : '';
        this._closeReceived = { code, reason };
        this.readyState = MiniWebSocket.CLOSING;
        this._sendClose(code === 1005 ? null : code, '');
        // The server closes the TCP connection after the handshake; be sure it ends.
        setTimeout(() => this._socket?.destroy(), 1000).unref();
        this._socket?.end();
        return;
      }
      case 0x9: // ping
        this._write(0xa, payload);
        return;
      default: // pong, reserved
        return;
    }
  }

  _message(opcode, payload) {
    if (this.readyState !== MiniWebSocket.OPEN) return;
    const data = opcode === 0x1 ? payload.toString('utf8') : payload;
    this.onmessage?.({ type: 'message', data });
  }
}
