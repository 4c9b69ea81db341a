// End-to-end test of the admin page (`GET /admin`, issue 20) in headless Chromium, against
// the real binary (LIVEGATE_BIN, else target/release/livegate) started with an API key.
// Run from the repository root: `node --test tests/e2e/admin.test.mjs` after
// `npm install --no-save --no-audit --no-fund --prefix tests/e2e`.
//
// Before login the page shows no node data and asks the overview nothing; a wrong key is
// refused with a message; the right one logs in. A real WebSocket subscriber (outside the
// browser) makes its room appear with 1 subscriber; an event published through the page's
// box moves the room's head seq on the page and reaches the subscriber. The key is never
// in the page's URL nor in localStorage (sessionStorage only; gone after logging out).
// Screenshots at 1280x800 and 375x800 go to tests/e2e/screenshots/ (gitignored), with no
// horizontal scroll at either width; axe-core (WCAG 2.0/2.1 A and AA) finds no violation
// logged out, logged in, and at the phone width.
//
// In cluster mode (two nodes, cells east and west, on a nats-server) the page shows one
// row per configured cell with its breaker and its probe rounds as marks; when NATS goes
// away, the node's own cell fails its probes and its row shows the breaker open and the
// failed rounds (admin-cells-1280.png), with no axe violation.
//
// Dead letters: with a webhook receiver that answers 500 and webhook_max_attempts 1, a
// room's room_occupied webhook is a dead letter at once; the page lists it, its Replay
// button reports a failed replay (and the row shows two attempts), then, with the receiver
// taking webhooks, a delivered one, after which the row is gone and the receiver got the
// webhook (admin-dead-letters-1280.png), with no axe violation.

import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { test } from 'node:test';
import { createRequire } from 'node:module';

import { API_KEY, REPO, api, letTimePass, mintToken, startServer, tempDir, waitFor } from '../js/support/server.mjs';
import { MiniWebSocket } from '../js/support/mini-websocket.mjs';
import { startCluster, startNats } from '../js/support/nodes.mjs';
import { cleanup, launchBrowser, resize } from './support.mjs';

const SCREENSHOTS = path.join(REPO, 'tests/e2e/screenshots');
const ROOM = 'admin:e2e';
const NODE = 'admin-e2e-node';
const require = createRequire(import.meta.url);

const AXE = require.resolve('axe-core/axe.min.js');

/** A protocol-level WebSocket subscriber: its frames, and a wait for one that matches. */
async function subscriber(base, user, room) {
  const token = await mintToken(base, user);
  const ws = new MiniWebSocket(`${base.replace('http', 'ws')}/v1/ws?token=${encodeURIComponent(token)}`);
  const frames = [];
  const waiters = new Set();
  ws.onmessage = (message) => {
    const frame = JSON.parse(String(message.data));
    frames.push(frame);
    for (const waiter of waiters) waiter();
  };
  const next = (what, match, ms = 10_000) =>
    new Promise((resolve, reject) => {
      const check = () => {
        const found = frames.find(match);
        if (!found) return false;
        waiters.delete(check);
        clearTimeout(timer);
        resolve(found);
        return true;
      };
      const timer = setTimeout(() => {
        waiters.delete(check);
        reject(new Error(`no ${what} within ${ms} ms; frames: ${JSON.stringify(frames)}`));
      }, ms);
      waiters.add(check);
      check();
    });
  await new Promise((resolve, reject) => {
    ws.onopen = resolve;
    ws.onerror = (error) => reject(new Error(`WebSocket failed: ${error?.message ?? error}`));
  });
  await next('welcome', (f) => f.op === 'welcome');
  ws.send(JSON.stringify({ op: 'subscribe', room, ref: 1 }));
  await next(`subscribed to ${room}`, (f) => f.op === 'subscribed' && f.ref === 1);
  return { ws, frames, next, close: () => ws.close() };
}

/** The page with axe-core injected, run for WCAG 2.0/2.1 A and AA: the violations, each readable. */
async function axe(page) {
  if (!(await page.evaluate(() => typeof window.axe !== 'undefined'))) await page.addScriptTag({ path: AXE });
  const result = await page.evaluate(async () =>
    window.axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'] } }));
  return result.violations.map((v) => `${v.id} (${v.impact}): ${v.help}; at ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`);
}

async function noSideScroll(page, width) {
  const { scrollWidth, innerWidth } = await page.evaluate(() => ({
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
  }));
  assert.ok(scrollWidth <= innerWidth, `at ${width} px the page scrolls sideways: scrollWidth ${scrollWidth} > innerWidth ${innerWidth}`);
}

/** What the rooms table shows for `room`: { subscribers, head } as numbers, or null. */
const roomRow = (page, room) =>
  page.evaluate((name) => {
    const row = [...document.querySelectorAll('#rooms tbody tr')].find((tr) => tr.dataset.room === name);
    if (!row) return null;
    return { subscribers: Number(row.cells[1].dataset.subscribers), head: Number(row.cells[2].dataset.head), text: row.textContent };
  }, room);

async function waitRow(page, room, what, ok, ms = 10_000) {
  let row;
  const found = async () => {
    row = await roomRow(page, room);
    return row && ok(row) ? row : null;
  };
  return waitFor(found, what, ms, 100).catch(() => {
    throw new Error(`timed out after ${ms} ms waiting for ${what}; the row: ${JSON.stringify(row)}`);
  });
}

test('the admin page: login, live rooms, publish box, no key in URL or localStorage, screenshots, axe', { timeout: 90_000 }, async (t) => {
  const data = tempDir('livegate-admin-e2e-');
  const profile = tempDir('livegate-admin-chromium-');
  cleanup(() => data.remove(), () => profile.remove());
  const server = await startServer({ dataDir: data.dir, args: ['--node', NODE] });
  cleanup(() => server.stop('SIGTERM', 5000));
  t.diagnostic(`server at ${server.url}`);

  const context = await launchBrowser(profile.dir, { viewport: { width: 1280, height: 800 } });
  const page = context.pages()[0] ?? (await context.newPage());
  const pageErrors = [];
  page.on('pageerror', (error) => pageErrors.push(String(error)));
  page.on('console', (message) => {
    if (message.type() === 'error' || message.type() === 'warning') t.diagnostic(`page ${message.type()}: ${message.text()}`);
  });
  const overviewRequests = [];
  page.on('request', (request) => {
    if (new URL(request.url()).pathname === '/v1/admin/overview') {
      overviewRequests.push({ url: request.url(), request });
    }
  });

  // 1. Logged out: the login form, and no node data anywhere.
  await page.goto(`${server.url}/admin`, { waitUntil: 'load', timeout: 10_000 });
  assert.equal(await page.title(), 'Admin · livegate');
  assert.equal(await page.getAttribute('html', 'lang'), 'en');
  const keyField = page.getByLabel('API key', { exact: true });
  assert.equal(await keyField.getAttribute('type'), 'password');
  assert.ok(await keyField.isVisible(), 'the key field is shown');
  assert.equal(await page.locator('#dashboard').isVisible(), false, 'no dashboard before login');
  assert.equal(await page.locator('#rooms tbody tr').count(), 0, 'no rooms before login');
  assert.equal(await page.locator('#nodes tbody tr').count(), 0, 'no nodes before login');
  const shown = await page.evaluate(() => document.body.innerText);
  assert.ok(!shown.includes(NODE) && !shown.includes('127.0.0.1'), `no node data before login: ${shown}`);
  await letTimePass(300, 'the page asks nothing before a key is entered');
  assert.deepEqual(overviewRequests, [], 'the page asks nothing before a key is entered');
  assert.deepEqual(await axe(page), [], 'axe: no WCAG A/AA violation logged out');

  // 2. A wrong key is refused, with a clear message, and nothing is kept.
  await keyField.fill('not-the-key');
  await page.getByRole('button', { name: 'Sign in' }).click();
  const refusal = page.locator('#login-message');
  await refusal.filter({ hasText: 'refused' }).waitFor({ timeout: 5000 });
  assert.match(await refusal.textContent(), /That API key was refused \(401\)/);
  assert.equal(await page.locator('#dashboard').isVisible(), false, 'still logged out after a wrong key');
  assert.equal(await keyField.getAttribute('aria-invalid'), 'true');
  assert.equal(await page.evaluate(() => sessionStorage.length + localStorage.length), 0, 'a refused key is not kept');
  assert.equal((await overviewRequests.at(-1).request.allHeaders()).authorization, 'Bearer not-the-key', 'the key goes as a bearer header');
  assert.deepEqual(await axe(page), [], 'axe: no WCAG A/AA violation with the refusal shown');

  // 3. The right key logs in.
  await keyField.fill(API_KEY);
  await keyField.press('Enter');
  await page.locator('#dashboard').waitFor({ state: 'visible', timeout: 5000 });
  assert.equal(await page.locator('#node-name').textContent(), NODE);
  assert.equal(await page.locator('#node-phase').textContent(), 'ready');
  await page.locator(`#nodes tbody tr[data-node="${NODE}"]`).waitFor({ timeout: 5000 });
  assert.match(await page.locator('#nodes tbody tr').first().textContent(), new RegExp(`${NODE} \\(this node\\)\\s*ready`));
  assert.equal(await page.locator('#nodes tbody tr').count(), 1, 'one node: this one');
  // Its load: connections of the limit in force, and the headroom left.
  assert.match(await page.locator('#nodes tbody tr').first().textContent(), /\d of [\d,]+\d/);
  assert.equal(await page.locator('#cells tbody tr').textContent(), 'Not in cluster mode.', 'one node: no cells');
  assert.equal(await page.getByRole('button', { name: 'Log out' }).isVisible(), true);

  // 4. A real WebSocket subscriber: its room appears with 1 subscriber.
  const viewer = await subscriber(server.url, 'viewer-1', ROOM);
  cleanup(() => viewer.close());
  const appeared = await waitRow(page, ROOM, `${ROOM} with 1 subscriber`, (row) => row.subscribers === 1);
  t.diagnostic(`room row: ${appeared.text}`);
  const headBefore = appeared.head;
  assert.ok(Number(await page.locator('[data-stat="connections"]').textContent()) >= 1, 'the subscriber is counted');

  // 5. A publish the node refuses shows the error body; bad JSON never leaves the page.
  const result = page.locator('#pub-result');
  await page.getByLabel(/^Data/).fill('{"bad json"');
  await page.getByRole('button', { name: 'Publish' }).click();
  await result.filter({ hasText: 'not valid JSON' }).waitFor({ timeout: 5000 });
  await page.getByLabel(/^Data/).fill('{"ok": true}');
  await page.getByLabel('Room', { exact: true }).fill('bad room name!');
  await page.getByRole('button', { name: 'Publish' }).click();
  await result.filter({ hasText: 'Refused' }).waitFor({ timeout: 5000 });
  assert.match(await result.textContent(), /^Refused: 400 bad_room: /);

  // 6. Publish through the page's box: the page shows the seq, the head moves, and the
  //    subscriber receives the event.
  await page.getByLabel('Room', { exact: true }).fill(ROOM);
  await page.getByLabel(/^Data/).fill('{"from": "the admin page", "n": 1}');
  await page.getByRole('button', { name: 'Publish' }).click();
  await result.filter({ hasText: 'seq' }).waitFor({ timeout: 5000 });
  const seq = Number(await result.getAttribute('data-seq'));
  assert.equal(seq, headBefore + 1, 'the first event of the room');
  assert.equal(await result.textContent(), `Published to ${ROOM} as seq ${seq}.`);
  const moved = await waitRow(page, ROOM, `${ROOM} at head ${seq}`, (row) => row.head === seq);
  assert.equal(moved.subscribers, 1);
  const frame = await viewer.next(`the event at seq ${seq}`, (f) => f.op === 'events' && f.events.some((e) => e.room === ROOM && e.seq === seq));
  assert.deepEqual(frame.events.find((e) => e.seq === seq).data, { from: 'the admin page', n: 1 });
  const { body: history } = await api(server.url, 'GET', `/v1/rooms/${encodeURIComponent(ROOM)}/events?since=0`);
  assert.equal(history.head, seq, 'the server has it at that seq');

  // The publish rate moves: a few more events between polls.
  for (let i = 0; i < 10; i++) await api(server.url, 'POST', `/v1/rooms/${encodeURIComponent(ROOM)}/events`, { data: { i } });
  await page.waitForFunction(() => Number(document.querySelector('[data-stat="publish_rate"]').textContent) > 0, null, { timeout: 8000, polling: 100 });
  t.diagnostic(`publish rate shown: ${await page.locator('[data-stat="publish_rate"]').textContent()} / s`);
  await waitRow(page, ROOM, `${ROOM} at head ${seq + 10}`, (row) => row.head === seq + 10);

  // The box once more, so the screenshots show a publish that went through.
  await page.getByLabel('Room', { exact: true }).fill(ROOM);
  await page.getByLabel(/^Data/).fill('{"from": "the admin page", "n": 2}');
  await page.getByRole('button', { name: 'Publish' }).click();
  await result.filter({ hasText: `seq ${seq + 11}` }).waitFor({ timeout: 5000 });
  await waitRow(page, ROOM, `${ROOM} at head ${seq + 11}`, (row) => row.head === seq + 11);

  // 7. The key is in neither the URL nor localStorage; sessionStorage holds it.
  const storage = await page.evaluate(() => ({
    url: location.href,
    local: Object.fromEntries(Object.entries(localStorage)),
    session: Object.fromEntries(Object.entries(sessionStorage)),
  }));
  assert.ok(!page.url().includes(API_KEY), `the key is in the URL: ${page.url()}`);
  assert.ok(!storage.url.includes(API_KEY));
  assert.deepEqual(storage.local, {}, 'nothing in localStorage');
  assert.deepEqual(Object.values(storage.session), [API_KEY], 'the key is in sessionStorage');
  assert.ok(overviewRequests.every((r) => !r.url.includes(API_KEY)), 'the key never rides in a request URL');
  assert.ok(overviewRequests.length >= 3, `the page polls (${overviewRequests.length} requests)`);

  // 8. Screenshots at 1280 and 375 px, no horizontal scroll, no axe violation.
  mkdirSync(SCREENSHOTS, { recursive: true });
  await noSideScroll(page, 1280);
  assert.deepEqual(await axe(page), [], 'axe: no WCAG A/AA violation logged in');
  const wide = path.join(SCREENSHOTS, 'admin-1280.png');
  await page.screenshot({ path: wide, fullPage: true });
  await resize(page, 375, 800);
  await noSideScroll(page, 375);
  assert.deepEqual(await axe(page), [], 'axe: no WCAG A/AA violation at 375 px');
  const phone = path.join(SCREENSHOTS, 'admin-375.png');
  await page.screenshot({ path: phone, fullPage: true });
  console.log(`screenshots: ${wide} ${phone}`);
  t.diagnostic(`screenshots: ${wide}, ${phone}`);

  // 9. A reload keeps the tab logged in (sessionStorage); logging out forgets the key and
  //    shows no data again.
  await page.reload({ waitUntil: 'load' });
  await page.locator('#dashboard').waitFor({ state: 'visible', timeout: 5000 });
  assert.ok(!page.url().includes(API_KEY));
  await page.getByRole('button', { name: 'Log out' }).click();
  await page.locator('#login').waitFor({ state: 'visible', timeout: 5000 });
  assert.equal(await page.locator('#dashboard').isVisible(), false);
  assert.equal(await page.locator('#rooms tbody tr').count(), 0, 'the rooms are gone from the page');
  assert.equal(await page.evaluate(() => sessionStorage.length + localStorage.length), 0, 'the key is forgotten');
  const polls = overviewRequests.length;
  await letTimePass(2500, 'several of the page\'s polling periods');
  assert.equal(overviewRequests.length, polls, 'no polling after logging out');
  assert.deepEqual(await axe(page), [], 'axe: no WCAG A/AA violation after logging out');

  assert.deepEqual(pageErrors, [], 'no uncaught errors in the page');
  viewer.close();
});

/** The cells table as the page shows it: { cell: { breaker, probes, text } }. */
const cellRows = (page) =>
  page.evaluate(() => Object.fromEntries([...document.querySelectorAll('#cells tbody tr')]
    .filter((tr) => tr.dataset.cell)
    .map((tr) => [tr.dataset.cell, { breaker: tr.dataset.breaker, probes: tr.cells[3].dataset.probes ?? '', text: tr.textContent }])));

test('the admin page in cluster mode: a row per configured cell with its breaker and probe rounds', { timeout: 90_000 }, async (t) => {
  const nats = await startNats();
  cleanup(() => nats.stop());
  const cellOf = { a: 'east', b: 'west' };
  const cluster = await startCluster({ nats, names: ['a', 'b'], args: ['--cells', 'east,west'], argsOf: (name) => ['--cell', cellOf[name]] });
  cleanup(() => cluster.stop());
  const { a } = cluster.nodes;
  const profile = tempDir('livegate-admin-cells-chromium-');
  cleanup(() => profile.remove());
  const context = await launchBrowser(profile.dir, { viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  const pageErrors = [];
  page.on('pageerror', (error) => pageErrors.push(String(error)));

  await page.goto(`${a.url}/admin`, { waitUntil: 'load', timeout: 10_000 });
  const keyField = page.getByLabel('API key', { exact: true });
  await keyField.fill(API_KEY);
  await keyField.press('Enter');
  await page.locator('#dashboard').waitFor({ state: 'visible', timeout: 5000 });

  // Both cells closed, their probe rounds passing (east: a's reports, west: b's).
  let rows;
  await waitFor(async () => {
    rows = await cellRows(page);
    return ['east', 'west'].every((c) => rows[c]?.breaker === 'closed' && /^✓{3,}$/.test(rows[c].probes));
  }, 'both cells closed with passing rounds', 15_000, 100).catch(() => assert.fail(`the cells table: ${JSON.stringify(rows)}`));
  assert.deepEqual(Object.keys(rows), ['east', 'west'], 'one row per configured cell, by name');
  assert.match(rows.east.text, /^east\s*closed/);
  assert.deepEqual(await axe(page), [], 'axe: no WCAG A/AA violation with the cells shown');

  // NATS goes away: a's probes of east fail, so east's breaker opens and its last rounds
  // are failures; nobody reports for west any more, so its breaker is fed nothing.
  await nats.stop();
  await waitFor(async () => {
    rows = await cellRows(page);
    return rows.east?.breaker === 'open' && rows.east.probes.endsWith('✗✗✗');
  }, 'east open after failed rounds', 15_000, 100).catch(() => assert.fail(`the cells table: ${JSON.stringify(rows)}`));
  t.diagnostic(`east: ${rows.east.probes}; west: ${rows.west.probes} (${rows.west.breaker})`);
  assert.equal(rows.west.breaker, 'closed', 'west was fed no failure');
  assert.match(rows.east.text, /open/);
  assert.equal(await page.locator('#cells tbody tr[data-cell="east"] .pill').textContent(), 'open');
  mkdirSync(SCREENSHOTS, { recursive: true });
  await noSideScroll(page, 1280);
  assert.deepEqual(await axe(page), [], 'axe: no WCAG A/AA violation with a breaker open');
  const shot = path.join(SCREENSHOTS, 'admin-cells-1280.png');
  await page.locator('#cells').screenshot({ path: shot });
  t.diagnostic(`screenshot: ${shot}`);
  await resize(page, 375, 800);
  await noSideScroll(page, 375);
  assert.deepEqual(await axe(page), [], 'axe: no WCAG A/AA violation at 375 px with the cells shown');
  assert.deepEqual(pageErrors, [], 'no uncaught errors in the page');
});

/** A webhook receiver answering `status()` to every POST; the bodies it took (2xx). */
async function receiver(status) {
  const taken = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const code = status();
      if (code < 300) taken.push(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      res.writeHead(code, { 'Content-Type': 'text/plain' }).end('ok');
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${server.address().port}/hooks`, taken, close: () => server.close() };
}

test('the admin page lists webhook dead letters and replays one', { timeout: 90_000 }, async (t) => {
  let answer = 500;
  const hooks = await receiver(() => answer);
  cleanup(() => hooks.close());
  const data = tempDir('livegate-admin-dead-');
  const profile = tempDir('livegate-admin-dead-chromium-');
  cleanup(() => data.remove(), () => profile.remove());
  const server = await startServer({
    dataDir: data.dir,
    args: ['--node', NODE, '--webhook-url', hooks.url, '--webhook-secret', 's', '--webhook-max-attempts', '1'],
  });
  cleanup(() => server.stop('SIGTERM', 5000));
  const context = await launchBrowser(profile.dir, { viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  const pageErrors = [];
  page.on('pageerror', (error) => pageErrors.push(String(error)));
  await page.goto(`${server.url}/admin`, { waitUntil: 'load', timeout: 10_000 });
  const keyField = page.getByLabel('API key', { exact: true });
  await keyField.fill(API_KEY);
  await keyField.press('Enter');
  await page.locator('#dashboard').waitFor({ state: 'visible', timeout: 5000 });
  assert.equal(await page.locator('#dead-count').textContent(), 'No dead letters.');

  // A subscriber makes the room occupied; its webhook fails once and is a dead letter.
  const viewer = await subscriber(server.url, 'viewer-dead', 'dead:room');
  cleanup(() => viewer.close());
  const row = page.locator('#dead tbody tr[data-id]');
  await row.first().waitFor({ timeout: 10_000 });
  const id = await row.first().getAttribute('data-id');
  assert.match(await row.first().textContent(), /room_occupied\s*dead:room\s*1\s*HTTP 500 \(out of attempts\)/);
  assert.equal(await page.locator('#dead-count').textContent(), '1 dead letter (at most 1,000).');
  mkdirSync(SCREENSHOTS, { recursive: true });
  await noSideScroll(page, 1280);
  assert.deepEqual(await axe(page), [], 'axe: no WCAG A/AA violation with a dead letter shown');
  const shot = path.join(SCREENSHOTS, 'admin-dead-letters-1280.png');
  await page.locator('#dead').screenshot({ path: shot });
  t.diagnostic(`screenshot: ${shot}`);

  // Replay while the receiver still fails: the page says so, the row stays, two attempts.
  const button = page.getByRole('button', { name: `Replay room_occupied webhook ${id} of room dead:room` });
  await button.click();
  const state = page.locator('#dead-state');
  await state.filter({ hasText: 'failed' }).waitFor({ timeout: 10_000 });
  assert.match(await state.textContent(), new RegExp(`^Replay of ${id} failed: 502 replay_failed: `));
  await page.waitForFunction((dead) => document.querySelector(`#dead tbody tr[data-id="${dead}"]`)?.cells[3].textContent === '2', id, { timeout: 5000, polling: 100 });

  // The receiver takes webhooks again: delivered, the row leaves, the receiver has it.
  answer = 204;
  await button.click();
  await state.filter({ hasText: 'delivered' }).waitFor({ timeout: 10_000 });
  assert.equal(await state.textContent(), `Replayed ${id}: delivered (3 attempts in all); it left the list.`);
  await page.locator('#dead tbody tr[data-id]').waitFor({ state: 'detached', timeout: 5000 });
  assert.equal(await page.locator('#dead-count').textContent(), 'No dead letters.');
  assert.deepEqual(hooks.taken.map((b) => [b.id, b.type, b.room]), [[id, 'room_occupied', 'dead:room']]);
  await resize(page, 375, 800);
  await noSideScroll(page, 375);
  assert.deepEqual(await axe(page), [], 'axe: no WCAG A/AA violation at 375 px after the replay');
  assert.deepEqual(pageErrors, [], 'no uncaught errors in the page');
  viewer.close();
});
