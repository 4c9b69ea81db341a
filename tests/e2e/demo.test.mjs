// End-to-end test of the demo page (`livegate serve --demo`, `/`) in headless Chromium.
// Run from the repository root: `node --test tests/e2e/`. Needs target/release/livegate
// (or LIVEGATE_BIN), Debian's chromium at /usr/bin/chromium (or CHROMIUM_BIN) and
// playwright-core: `npm install --no-save --prefix tests/e2e playwright-core@1`.
//
// The page is loaded, events arrive in all four match rooms, the connection is dropped
// from the page's own button, then the server is restarted underneath it (SIGTERM, a new
// process on the same data dir and port). Afterwards every room's delivered seqs must run
// without a gap or a duplicate, and the score shown must be the one in the room's last
// event in the server's history. The screenshots go to target/e2e/ (not committed).
// It runs twice: the page's default transport (auto: WebSocket) and `/?transport=sse`
// (livegate.js over Server-Sent Events). A third test reloads the page and checks that
// each card's score comes from the room state, and that "N watching" counts the open
// pages (room state and presence, issue 19: needs those server branches).
//
// The page and /livegate.js (with its /livegate/ modules) are the copies compiled into the
// binary. To try edits of src/web/demo.html and clients/js/ without a rebuild,
// LIVEGATE_E2E_WEB=src serves them from the source tree instead
// (tests/it/client_library.rs checks the binary serves exactly those files).

import assert from 'node:assert/strict';
import { mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { REPO, api, startServer, startServerOnPort, tempDir, waitFor } from '../js/support/server.mjs';
import { cleanup, clientFromSource, launchBrowser, resize } from './support.mjs';

const ROOMS = ['match:1', 'match:2', 'match:3', 'match:4'];
const ARTIFACTS = path.join(REPO, 'target/e2e');
const DEMO = ['--demo'];

/** Evaluates `fn(arg)` in the page until it returns something truthy; throws after `ms`. */
async function waitInPage(page, what, ms, fn, arg) {
  try {
    await page.waitForFunction(fn, arg, { timeout: ms, polling: 100 });
  } catch (error) {
    const seen = await page.evaluate(() => ({
      state: window.__demo?.state,
      status: window.__demo?.status,
      connections: window.__demo?.connections,
      counts: window.__demo && Object.fromEntries(Object.entries(window.__demo.seqs).map(([r, s]) => [r, s.length])),
      recovered: window.__demo?.recovered,
      recoveryFailed: window.__demo?.recoveryFailed,
    })).catch(() => null);
    throw new Error(`timed out after ${ms} ms waiting for ${what}; the page: ${JSON.stringify(seen)}\n(${error.message.split('\n')[0]})`);
  }
}

/** `window.__demo` and what each card shows, read in one go (the page keeps changing). */
const snapshot = (page) =>
  page.evaluate(() => {
    const demo = JSON.parse(JSON.stringify({ ...window.__demo, client: undefined }));
    demo.cards = {};
    for (const card of document.querySelectorAll('article.match')) {
      const text = (selector) => card.querySelector(selector)?.textContent.trim();
      demo.cards[card.dataset.room] = {
        score: [Number(text('[data-home-goals]')), Number(text('[data-away-goals]'))],
        lastSeq: text('[data-last-seq]'),
        title: text('h2'),
        tickerLines: card.querySelectorAll('[data-ticker] li').length,
      };
    }
    return demo;
  });

/** Serves src/web/demo.html and clients/js/ instead of the binary's copies (LIVEGATE_E2E_WEB=src). */
async function fromSource(page) {
  if (process.env.LIVEGATE_E2E_WEB !== 'src') return;
  const file = (name) => readFileSync(path.join(REPO, 'src/web', name), 'utf8');
  await clientFromSource(page);
  await page.route((url) => url.pathname === '/', (route) =>
    route.fulfill({ status: 200, contentType: 'text/html; charset=utf-8', body: file('demo.html') }));
}

test('the demo page shows live scores and recovers across a dropped connection and a server restart', { timeout: 60_000 }, async (t) => {
  await demoAcrossRestart(t, { transport: null, screenshots: true });
});

test('the demo page over SSE (/?transport=sse) recovers across a dropped stream and a server restart', { timeout: 60_000 }, async (t) => {
  await demoAcrossRestart(t, { transport: 'sse', screenshots: false });
});

/** A headless Chromium with its profile in `dir`; page errors are collected, console warnings logged. */
async function openBrowser(t, dir) {
  const context = await launchBrowser(dir, {
    viewport: { width: 1280, height: 900 },
    // A page fulfilled by the test (LIVEGATE_E2E_WEB=src) has no address for Chromium's
    // local network access checks, which would then block its loopback WebSocket.
    args: process.env.LIVEGATE_E2E_WEB === 'src' ? ['--disable-features=LocalNetworkAccessChecks'] : [],
  });
  const pageErrors = [];
  const watch = async (page) => {
    page.on('pageerror', (error) => pageErrors.push(String(error)));
    page.on('console', (message) => {
      if (message.type() === 'error' || message.type() === 'warning') t.diagnostic(`page ${message.type()}: ${message.text()}`);
    });
    await fromSource(page);
    return page;
  };
  const page = await watch(context.pages()[0] ?? (await context.newPage()));
  /** Another tab of the same browser: its own page, token and viewer. */
  const newPage = async () => watch(await context.newPage());
  return { context, page, newPage, pageErrors };
}

async function demoAcrossRestart(t, { transport, screenshots }) {
  const started = Date.now();
  const data = tempDir('livegate-e2e-');
  const profile = tempDir('livegate-e2e-chromium-');
  cleanup(() => data.remove(), () => profile.remove());

  let server = await startServer({ dataDir: data.dir, args: DEMO });
  cleanup(() => server.stop('SIGTERM', 5000)); // SIGKILL after 5 s
  t.diagnostic(`server 1 at ${server.url}`);
  const { page, pageErrors } = await openBrowser(t, profile.dir);

  // 1. The page loads, connects, and events arrive in every room.
  const pageUrl = transport ? `${server.url}/?transport=${transport}` : server.url;
  await page.goto(pageUrl, { waitUntil: 'domcontentloaded', timeout: 10_000 });
  assert.equal(await page.title(), 'Live scores · livegate demo');
  assert.equal(await page.getAttribute('html', 'lang'), 'en');
  await waitInPage(page, 'the first connection', 10_000, () => window.__demo?.state === 'connected');
  await waitInPage(page, '3 events in every room', 15_000, ([rooms, min]) => rooms.every((room) => window.__demo.seqs[room].length >= min), [ROOMS, 3]);
  assert.equal(await page.locator('#status').getAttribute('data-state'), 'connected');
  assert.equal(await page.locator('article.match').count(), 4);
  assert.equal(await page.evaluate(() => window.__demo.transport), transport ?? 'websocket', 'the transport in use');
  t.diagnostic(`events in every room after ${Date.now() - started} ms`);

  // 2. The page's own button drops the socket: the client reconnects and recovers each room.
  const drop = page.getByRole('button', { name: 'Drop connection' });
  await drop.click();
  await waitInPage(page, 'recovery of every room after the drop', 15_000, (rooms) => {
    const d = window.__demo;
    return d.state === 'connected' && d.connections === 2 && rooms.every((room) => d.recovered.some((r) => r.room === room && r.connection === 2));
  }, ROOMS);
  assert.equal(await page.locator('#status').getAttribute('data-state'), 'recovered');
  t.diagnostic(`recovered after the drop at ${Date.now() - started} ms`);

  // 3. Restart the server underneath the page: SIGTERM (drain, 1012), then a new process on
  //    the same data dir and port.
  const before = await snapshot(page);
  const port = server.port;
  const stopped = await server.stop('SIGTERM', 10_000);
  assert.equal(stopped.code, 0, `server 1 exited with ${JSON.stringify(stopped)}`);
  t.diagnostic(`server 1 drained and exited at ${Date.now() - started} ms`);
  server = await startServerOnPort({ dataDir: data.dir, port, args: DEMO });
  t.diagnostic(`server 2 at ${server.url}, ${Date.now() - started} ms`);
  const connectionsBefore = before.connections;
  await waitInPage(page, 'recovery of every room after the restart and 3 more events each', 30_000, ([rooms, counts, n]) => {
    const d = window.__demo;
    return (
      d.state === 'connected' &&
      d.connections > n &&
      rooms.every((room) => d.recovered.some((r) => r.room === room && r.connection === d.connections)) &&
      rooms.every((room) => d.seqs[room].length >= counts[room] + 3)
    );
  }, [ROOMS, Object.fromEntries(ROOMS.map((room) => [room, before.seqs[room].length])), connectionsBefore]);
  assert.match(await page.locator('#status-text').textContent(), /^Connected/);
  t.diagnostic(`recovered after the restart with 3 more events per room at ${Date.now() - started} ms`);

  // 4. No gap, no duplicate; the score shown is the score of the room's last event.
  let last;
  const caughtUp = async () => {
    const demo = await snapshot(page);
    const history = {};
    for (const room of ROOMS) {
      const { body } = await api(server.url, 'GET', `/v1/rooms/${encodeURIComponent(room)}/events?since=0&limit=1000`);
      history[room] = body;
    }
    last = { demo, history };
    // The page read first: the history then holds at least what the page saw. Compare
    // once every room's newest event is on the page too (events keep coming, ~1/s a room).
    return ROOMS.every((room) => demo.seqs[room].at(-1) === history[room].head);
  };
  // Not caught up within 10 s: the assertions below say where the page and history differ.
  await waitFor(caughtUp, 'the page at every room\'s head', 10_000, 150).catch(() => {});
  const { demo, history } = last;
  assert.deepEqual(demo.recoveryFailed, [], 'no room failed to recover');
  for (const room of ROOMS) {
    const seqs = demo.seqs[room];
    const expected = Array.from({ length: seqs.length }, (_, i) => seqs[0] + i);
    assert.deepEqual(seqs, expected, `${room}: the delivered seqs have a gap or a duplicate`);
    const events = history[room].events;
    assert.ok(events.length > 0 && events.length < 1000, `${room}: ${events.length} events in history`);
    const lastEvent = events.at(-1);
    assert.equal(lastEvent.seq, history[room].head);
    assert.equal(seqs.at(-1), lastEvent.seq, `${room}: the page's last seq is the room's head`);
    const stored = new Set(events.map((event) => event.seq));
    assert.ok(seqs.every((seq) => stored.has(seq)), `${room}: the page saw seqs the server does not have`);
    assert.deepEqual(demo.scores[room], lastEvent.data.score, `${room}: the page's score is the last event's`);
    const card = demo.cards[room];
    assert.deepEqual(card.score, lastEvent.data.score, `${room}: the score on the card`);
    assert.equal(card.lastSeq, String(lastEvent.seq), `${room}: the seq on the card`);
    assert.equal(card.title, `${lastEvent.data.home} v ${lastEvent.data.away}`);
    assert.ok(card.tickerLines >= 3 && card.tickerLines <= 8, `${room}: ${card.tickerLines} ticker lines`);
    t.diagnostic(`${room}: seqs ${seqs[0]}..${seqs.at(-1)} (${seqs.length} delivered), score ${lastEvent.data.score.join('-')}`);
  }
  assert.deepEqual(pageErrors, [], 'no uncaught errors in the page');
  assert.equal(demo.transport, transport ?? 'websocket', 'still on the same transport after the restart');
  if (!screenshots) return;

  // 5. Artifacts: the desktop view, then the phone width (which must not scroll sideways).
  mkdirSync(ARTIFACTS, { recursive: true });
  const shot = path.join(ARTIFACTS, 'demo.png');
  await page.screenshot({ path: shot, fullPage: true });
  await resize(page, 375, 812);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page scrolls sideways by ${overflow} px at 375 px`);
  const phone = path.join(ARTIFACTS, 'demo-phone.png');
  await page.screenshot({ path: phone, fullPage: true });
  console.log(`screenshots: ${shot} ${phone}`);
  t.diagnostic(`screenshots: ${shot}, ${phone}; the test took ${Date.now() - started} ms`);
}

// NEEDS THE SERVER SIDE (issue 19: the `state` branch, whose simulator stores each
// match's state with its events, and the `presence` branch). Until they are merged this
// test fails, saying which part is missing; it never skips.
test('after a reload each card\'s score comes from the room state, and "N watching" counts the open pages', { timeout: 60_000 }, async (t) => {
  const data = tempDir('livegate-e2e-');
  const profile = tempDir('livegate-e2e-chromium-');
  cleanup(() => data.remove(), () => profile.remove());
  const server = await startServer({ dataDir: data.dir, args: DEMO });
  cleanup(() => server.stop('SIGTERM', 5000));
  const { page, newPage, pageErrors } = await openBrowser(t, profile.dir);

  await page.goto(server.url, { waitUntil: 'domcontentloaded', timeout: 10_000 });
  await waitInPage(page, '2 events in every room', 15_000, ([rooms, min]) => rooms.every((room) => window.__demo.seqs[room].length >= min), [ROOMS, 2]);

  // 1. Reload: the score of every card is first set by the room state, as of its seq.
  await page.reload({ waitUntil: 'domcontentloaded', timeout: 10_000 });
  await waitInPage(page, 'the connection after the reload', 10_000, () => window.__demo?.state === 'connected');
  try {
    await page.waitForFunction((rooms) => rooms.every((room) => window.__demo.states[room].length > 0), ROOMS, { timeout: 10_000, polling: 100 });
  } catch {
    assert.fail('no onState for every room within 10 s: the server sends no room state (needs the "state" branch merged)');
  }
  const loaded = await snapshot(page);
  for (const room of ROOMS) {
    const [state] = loaded.states[room];
    assert.ok(state.seq > 0 && state.data && typeof state.data === 'object', `${room}: the simulator stores a state with its events (state branch): ${JSON.stringify(state)}`);
    assert.deepEqual(loaded.firstScore[room], { source: 'state', seq: state.seq, score: state.data.score }, `${room}: the first score shown came from the room state`);
    const { body } = await api(server.url, 'GET', `/v1/rooms/${encodeURIComponent(room)}/events?since=${state.seq - 1}&limit=1`);
    const atS = body.events[0];
    assert.equal(atS.seq, state.seq);
    assert.deepEqual(state.data.score, atS.data.score, `${room}: the state's score is the score of its event`);
    if (typeof state.data.home === 'string') assert.equal(state.data.home, atS.data.home);
    // Only events after S were delivered on this load.
    assert.ok(loaded.seqs[room].every((seq) => seq > state.seq), `${room}: an event at or below S was delivered: ${loaded.seqs[room]}`);
  }
  t.diagnostic(`after the reload: ${ROOMS.map((room) => `${room} state at ${loaded.states[room][0].seq}`).join(', ')}`);

  // 2. "N watching": a second page counts in every room, and leaves when it closes.
  const expectWatching = async (n, what) => {
    try {
      await page.waitForFunction(([rooms, count]) => rooms.every((room) => window.__demo.watching[room] === count), [ROOMS, n], { timeout: 10_000, polling: 100 });
    } catch {
      const seen = await page.evaluate(() => window.__demo.watching);
      assert.fail(`${what}: the page shows ${JSON.stringify(seen)}, not ${n} watching everywhere (needs the "presence" branch merged)`);
    }
  };
  await expectWatching(1, 'one page open');
  const other = await newPage();
  await other.goto(server.url, { waitUntil: 'domcontentloaded', timeout: 10_000 });
  await expectWatching(2, 'a second page opened');
  assert.equal(await page.locator('article.match[data-room="match:1"] [data-watching]').textContent(), '2 watching');
  await other.close();
  await expectWatching(1, 'the second page closed');
  assert.deepEqual(pageErrors, [], 'no uncaught errors in the pages');
});
