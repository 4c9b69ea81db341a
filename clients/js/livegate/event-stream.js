// The `text/event-stream` parser the SSE transport reads its stream with: bytes
// decoded to text go in, whole messages come out. No state of the client lives here.

/** Largest SSE message (its data lines plus the line being read), in characters. */
export const MAX_SSE_MESSAGE_CHARS = 64 * 1024 * 1024;

/**
 * A `text/event-stream` parser (the HTML standard's rules): lines end with `\r\n`, `\n`
 * or `\r` (also split across chunks); `data:` lines of one message are joined with `\n`;
 * one space after the colon is dropped; `: comment` lines go to `onComment`; a blank line
 * dispatches `{type, data, id}` (type `message` when no `event:` was given, `id` the
 * message's own `id:` or undefined). A message over `maxChars` throws a RangeError.
 */
export class EventStreamParser {
  constructor(onMessage, onComment = () => {}, maxChars = MAX_SSE_MESSAGE_CHARS) {
    this._maxChars = maxChars;
    this._size = 0; // characters of the data lines kept for the current message
    this._onMessage = onMessage;
    this._onComment = onComment;
    this._buffer = '';
    this._skipLf = false; // the last chunk ended with \r: a \n first in the next is its pair
    this._type = '';
    this._data = [];
    this._id = undefined;
    this._first = true;
  }

  /** Feeds decoded text. */
  push(text) {
    if (!text) return;
    if (this._first) {
      this._first = false;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    if (this._skipLf) {
      this._skipLf = false;
      if (text[0] === '\n') text = text.slice(1);
    }
    let buffer = this._buffer + text;
    let start = 0;
    for (;;) {
      const cr = buffer.indexOf('\r', start);
      const lf = buffer.indexOf('\n', start);
      if (cr < 0 && lf < 0) break;
      let end;
      let next;
      if (cr >= 0 && (lf < 0 || cr < lf)) {
        end = cr;
        if (cr + 1 < buffer.length) next = buffer[cr + 1] === '\n' ? cr + 2 : cr + 1;
        else {
          next = cr + 1;
          this._skipLf = true;
        }
      } else {
        end = lf;
        next = lf + 1;
      }
      this._line(buffer.slice(start, end));
      start = next;
    }
    this._buffer = buffer.slice(start);
    if (this._buffer.length + this._size > this._maxChars) {
      throw new RangeError(`an event stream message over ${this._maxChars} characters`);
    }
  }

  /** The stream ended: a message without its blank line is dropped (the standard's rule). */
  end() {
    this._buffer = '';
    this._size = 0;
    this._type = '';
    this._data = [];
    this._id = undefined;
  }

  _line(line) {
    if (line === '') {
      const message = { type: this._type || 'message', data: this._data.join('\n'), id: this._id };
      const any = this._data.length > 0;
      this._type = '';
      this._data = [];
      this._size = 0;
      this._id = undefined;
      if (any) this._onMessage(message);
      return;
    }
    if (line[0] === ':') {
      this._onComment(line.slice(1).replace(/^ /, ''));
      return;
    }
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value[0] === ' ') value = value.slice(1);
    switch (field) {
      case 'event':
        this._type = value;
        return;
      case 'data':
        this._data.push(value);
        this._size += value.length + 1;
        if (this._size > this._maxChars) throw new RangeError(`an event stream message over ${this._maxChars} characters`);
        return;
      case 'id':
        if (!value.includes('\0')) this._id = value;
        return;
      default:
        return; // retry and unknown fields
    }
  }
}
