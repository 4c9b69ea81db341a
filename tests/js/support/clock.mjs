// Time in the JS tests (tests/js and tests/e2e): the only place they wait for time to
// pass. A test waits for what it can observe with `waitFor` (a poll), spreads its own
// load over time with `pace`, and lets the product's clock run with `letTimePass` where
// the elapsed time is the behaviour under test (a backoff, a heartbeat, "nothing more
// arrives"). Each pace and each wait for the clock says why; tests/count-sleeps counts
// them apart and fails on any other sleep.

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check()` every `everyMs` until it returns a truthy value, which it returns;
 * throws after `ms` with `what`. */
export async function waitFor(check, what, ms = 10_000, everyMs = 10) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await pause(everyMs);
  }
}

/** Spreads the test's own load over time on purpose; `why` says what is paced. */
export function pace(ms, why) {
  void why;
  return pause(ms);
}

/** Lets the product's clock run for `ms` where the elapsed time is what is tested and
 * nothing can be polled before it; `why` names the product's time waited for. */
export function letTimePass(ms, why) {
  void why;
  return pause(ms);
}
