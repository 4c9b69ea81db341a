// The errors the client rejects promises with: an Error with the `code` a caller
// switches on (the server's error codes, or the client's own: `closed`, `stopped`,
// `disconnected`, `unsubscribed`, `unsupported`).

/** An Error carrying `code`. */
export function livegateError(code, message) {
  const error = new Error(message || code);
  error.code = code;
  return error;
}
