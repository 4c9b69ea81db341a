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

/**
 * Subscribes `room` and resolves with the first `subscribed` reply: a Subscription with
 * `onEvent` on its `event`, and `onState(data, {room, seq, epoch})` / `onPresence(change)`
 * from `options` on its `state` / `presence` (the other options go to subscribe()).
 */
export function subscribed(client, room, onEvent, options = {}) {
  const { onState, onPresence, ...asked } = options ?? {};
  const sub = client.subscribe(room, asked);
  if (typeof onEvent === 'function') sub.on('event', onEvent);
  if (typeof onState === 'function') sub.on('state', ({ data, room: name, seq, epoch }) => onState(data, { room: name, seq, epoch }));
  if (typeof onPresence === 'function') sub.on('presence', onPresence);
  return sub.ready();
}
