// The errors the client rejects promises with: a LivegateError, an Error with the `code` a
// caller switches on (the server's error codes, or the client's own: `closed`, `stopped`,
// `disconnected`, `unsubscribed`, `unsupported`, `timeout`, `aborted`, `signed_out`).

/** An Error carrying `code` (and, for `aborted`, the signal's reason as `cause`). */
export class LivegateError extends Error {
  constructor(code, message, options) {
    super(message || code, options);
    this.name = 'LivegateError';
    this.code = code;
  }
}

/** A LivegateError with `code`. */
export function livegateError(code, message, options) {
  return new LivegateError(code, message, options);
}
