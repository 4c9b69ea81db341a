// The client's only source of time: the current time and one-shot timers. Everything
// that waits (reconnect backoff, the connect timeout, heartbeats, credential expiry,
// the /readyz probe's timeout) asks the clock it was given, so a test can hand the client
// a virtual clock and run minutes of reconnects in milliseconds (`clock` option of
// connect()). A clock is `{now(), setTimeout(fn, ms), clearTimeout(handle)}`.

/** The real clock: Date.now and the global timers. */
export const systemClock = Object.freeze({
  now: () => Date.now(),
  setTimeout: (fn, ms) => globalThis.setTimeout(fn, ms),
  clearTimeout: (handle) => globalThis.clearTimeout(handle),
});

/** The clock to use for a `clock` option: its own functions, the real ones for any it lacks. */
export function clockFrom(option) {
  if (option == null) return systemClock;
  if (typeof option !== 'object') throw new TypeError('livegate: clock must be an object with now, setTimeout and clearTimeout');
  for (const name of ['now', 'setTimeout', 'clearTimeout']) {
    if (option[name] != null && typeof option[name] !== 'function') throw new TypeError(`livegate: clock.${name} must be a function`);
  }
  return Object.freeze({
    now: option.now ? () => option.now() : systemClock.now,
    setTimeout: option.setTimeout ? (fn, ms) => option.setTimeout(fn, ms) : systemClock.setTimeout,
    clearTimeout: option.clearTimeout ? (handle) => option.clearTimeout(handle) : systemClock.clearTimeout,
  });
}

/**
 * Runs `fn` every `ms` on `clock` until the returned function is called (a chain of
 * one-shot timers, so a clock needs no setInterval).
 */
export function repeat(clock, ms, fn) {
  let handle = null;
  let stopped = false;
  const tick = () => {
    if (stopped) return;
    handle = clock.setTimeout(tick, ms);
    fn();
  };
  handle = clock.setTimeout(tick, ms);
  return () => {
    stopped = true;
    clock.clearTimeout(handle);
  };
}
