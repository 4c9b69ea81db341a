// A scripted stand-in for fetch(), for the unit-level tests of livegate.js's SSE transport
// and its /readyz check: the test plays the server. Each SSE request is recorded in
// `Fake.streams`; the test answers it with `respond(status, body)` or `open()`, then
// writes the event stream with `send(text)` (split wherever the test likes), `end()` or
// `fail()`. `/readyz` is answered by `Fake.ready` ('up': 200, 'draining': 503, 'down': a
// network error) and counted in `Fake.probes`. With a `clock` (support/virtual-clock.mjs,
// the client's), requests are stamped with its time and `nth` moves it on instead of waiting.

export function fakeFetch({ ready = 'up', clock = null } = {}) {
  const streams = [];
  const waiters = [];
  const encoder = new TextEncoder();

  async function fetchFn(url, init = {}) {
    const target = new URL(url);
    if (target.pathname.endsWith('/readyz')) {
      fetchFn.probes += 1;
      if (fetchFn.ready === 'down') throw new TypeError('fetch failed');
      return new Response(fetchFn.ready === 'up' ? '{"status":"ready"}' : '{"error":{"code":"unavailable"}}', {
        status: fetchFn.ready === 'up' ? 200 : 503,
      });
    }
    return new Promise((resolve, reject) => {
      let controller;
      const stream = {
        url: target,
        init,
        aborted: false,
        createdAt: clock ? clock.now() : Date.now(),
        params: Object.fromEntries(target.searchParams),
        respond(status, body) {
          resolve(new Response(JSON.stringify(body), { status, headers: { 'Content-Type': 'application/json' } }));
        },
        open(headers = {}) {
          const body = new ReadableStream({
            start(c) {
              controller = c;
            },
          });
          resolve(new Response(body, { status: 200, headers: { 'Content-Type': 'text/event-stream', ...headers } }));
        },
        send(text) {
          if (!stream.aborted) controller.enqueue(encoder.encode(text));
        },
        /** One SSE message: `event`, optional `id`, JSON `data`. */
        message(event, data, id) {
          stream.send(`event: ${event}\n${id != null ? `id: ${id}\n` : ''}data: ${JSON.stringify(data)}\n\n`);
        },
        welcome(session = 'S1', extra = {}) {
          stream.message('welcome', { op: 'welcome', session, node: 'fake', heartbeat_ms: 30000, warmup: false, ...extra });
        },
        end() {
          if (!stream.aborted) controller.close();
        },
        fail() {
          if (!stream.aborted) controller.error(new TypeError('terminated'));
        },
      };
      init.signal?.addEventListener('abort', () => {
        stream.aborted = true;
        const error = new DOMException('aborted', 'AbortError');
        reject(error);
        try {
          controller?.error(error);
        } catch {
          // closed
        }
      });
      streams.push(stream);
      for (const waiter of waiters.filter((w) => w.n === streams.length - 1)) waiter.resolve(stream);
    });
  }
  fetchFn.streams = streams;
  fetchFn.ready = ready;
  fetchFn.probes = 0;
  /** Resolves with the n-th SSE request (0-based) once the client made it. */
  fetchFn.nth = (n, ms = 5000) => {
    if (streams[n]) return Promise.resolve(streams[n]);
    if (clock) {
      return new Promise((resolve, reject) => {
        waiters.push({ n, resolve });
        clock.until(() => streams[n], `SSE request #${n}`, ms).catch(reject);
      });
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no SSE request #${n} within ${ms} ms`)), ms);
      waiters.push({ n, resolve: (s) => (clearTimeout(timer), resolve(s)) });
    });
  };
  return fetchFn;
}
