// Test support shared by the livegate.js tests: short timings for clients of a real
// server, and a recorder of everything a client reports.

/** Reconnects in milliseconds, with room for a real server's handshake. */
export const REAL_SERVER_TIMINGS = Object.freeze({
  backoffMs: [0, 50, 100, 200, 400],
  restartJitterMs: 200,
  connectTimeoutMs: 5000,
  stableMs: 60_000,
});

/** Every event a client emits about its connection, as it came. */
export function recorder(client) {
  const log = { state: [], connecting: [], connected: [], disconnected: [], recovered: [], recovery_failed: [], error: [], transport: [] };
  for (const name of Object.keys(log)) client.on(name, (detail) => log[name].push(detail));
  return log;
}
