// The copy-paste page of Getting started ("A page from any origin"), exactly as printed,
// in headless Chromium against `livegate serve --dev`. Run from the repository root:
// `node --test tests/e2e/first-page.test.mjs` (needs target/release/livegate or
// LIVEGATE_BIN, Debian's chromium and playwright-core, as the other browser tests).
//
// The page is the ```html block between the `first-page:begin` and `first-page:end`
// markers of docs/src/getting-started.md, served byte for byte by a small node HTTP
// server from a second origin (http://localhost:PORT/). It hardcodes the dev server's
// address, http://127.0.0.1:7070, as a reader's copy does; so this test runs the server
// on port 7070 (nothing else in the suite binds it) instead of changing the page. The
// page loads /livegate.js cross-origin (CORS on the client files), mints its token with
// fetch and no key (dev mode; a CORS preflight first, for its JSON body), connects over
// WebSocket from its origin, and shows the events published with the API key.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { test } from 'node:test';

import { REPO, api, startServer, tempDir, waitFor } from '../js/support/server.mjs';
import { cleanup, launchBrowser } from './support.mjs';

/** The port the printed page talks to. */
const PAGE_PORT = 7070;

/** The page as Getting started prints it: the fenced block between the markers. */
function printedPage() {
  const book = readFileSync(path.join(REPO, 'docs/src/getting-started.md'), 'utf8');
  const begin = book.indexOf('<!-- first-page:begin');
  const end = book.indexOf('<!-- first-page:end -->');
  assert.ok(begin >= 0 && end > begin, 'getting-started.md marks the page with first-page:begin and first-page:end');
  const block = /```html\n([\s\S]*?)\n```/.exec(book.slice(begin, end));
  assert.ok(block, 'an ```html block between the markers');
  return `${block[1]}\n`;
}

/** Serves `html` at / of http://localhost:PORT (any free port); resolves with its origin. */
function servePage(html) {
  const server = http.createServer((req, res) => {
    if (req.url === '/favicon.ico') {
      res.writeHead(204).end();
    } else if (req.url === '/' || req.url === '/index.html') {
      res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
      res.end(html);
    } else {
      res.writeHead(404).end();
    }
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      cleanup(() => new Promise((done) => server.close(done)));
      resolve(`http://localhost:${server.address().port}`);
    });
  });
}

test('the Getting started page, exactly as printed, shows live events from a --dev server on another origin', { timeout: 60_000 }, async (t) => {
  const html = printedPage();
  assert.match(html, /import \{ connect \} from "http:\/\/127\.0\.0\.1:7070\/livegate\.js"/, 'the page loads the client library from the dev server');
  assert.match(html, /res\.json\(\)/, 'the page reads the token reply with res.json()');
  assert.match(html, /\.subscribe\("lobby"\)\.on\("event"/, 'the page uses the Subscription API');

  const data = tempDir('livegate-e2e-first-page-');
  const profile = tempDir('livegate-e2e-first-page-chromium-');
  cleanup(() => data.remove(), () => profile.remove());
  let server;
  try {
    server = await startServer({ dataDir: data.dir, port: PAGE_PORT, args: ['--dev'] });
  } catch (error) {
    throw new Error(`could not start livegate serve --dev on port ${PAGE_PORT}, the port the printed page uses (is something else on it?)\n${error.message}`);
  }
  cleanup(() => server.stop('SIGTERM', 5000));
  const pageOrigin = await servePage(html);
  assert.notEqual(new URL(pageOrigin).origin, new URL(server.url).origin, 'the page comes from a second origin');
  t.diagnostic(`page at ${pageOrigin}/, dev server at ${server.url}`);

  const context = await launchBrowser(profile.dir, { viewport: { width: 900, height: 700 } });
  const page = context.pages()[0] ?? (await context.newPage());
  const pageErrors = [];
  const requests = [];
  page.on('pageerror', (error) => pageErrors.push(String(error)));
  page.on('console', (message) => t.diagnostic(`page ${message.type()}: ${message.text()}`));
  page.on('request', (request) => requests.push(`${request.method()} ${request.url()}`));

  await page.goto(`${pageOrigin}/`, { waitUntil: 'domcontentloaded', timeout: 10_000 });
  assert.equal(await page.title(), 'My first livegate page');
  const waitInPage = async (what, fn, arg) => {
    try {
      await page.waitForFunction(fn, arg, { timeout: 15_000, polling: 100 });
    } catch (error) {
      const shown = await page.evaluate(() => ({
        status: document.getElementById('status')?.textContent,
        events: [...document.querySelectorAll('#events li')].map((li) => li.textContent),
      })).catch(() => null);
      throw new Error(`timed out waiting for ${what}; the page shows ${JSON.stringify(shown)}; errors ${JSON.stringify(pageErrors)}\n(${error.message.split('\n')[0]})`);
    }
  };
  await waitInPage('the page to connect', () => document.getElementById('status').textContent === 'connected');
  // The page is subscribed once the server counts it in the room.
  await waitFor(async () => (await api(server.url, 'GET', '/v1/rooms/lobby/presence')).body.count >= 1, 'the page in lobby', 15_000, 100);

  // The backend (here: the test, with the API key) publishes; the page shows each event once, in order.
  const published = [];
  for (const text of ['hello from the terminal', 'second', 'third']) {
    published.push((await api(server.url, 'POST', '/v1/rooms/lobby/events', { data: { text } })).body.seq);
  }
  await waitInPage('three events on the page', () => document.querySelectorAll('#events li').length >= 3);
  const shown = await page.$$eval('#events li', (items) => items.map((li) => li.textContent));
  assert.deepEqual(shown, [
    `#${published[0]}: {"text":"hello from the terminal"}`,
    `#${published[1]}: {"text":"second"}`,
    `#${published[2]}: {"text":"third"}`,
  ]);
  assert.deepEqual(pageErrors, [], 'no uncaught errors in the page');

  // What made it work: a cross-origin module, a keyless token after a preflight, a WebSocket.
  assert.ok(requests.includes(`GET ${server.url}/livegate.js`), `the page imported /livegate.js from the server: ${requests.join(', ')}`);
  assert.ok(requests.includes(`POST ${server.url}/v1/tokens`), `the page minted its token: ${requests.join(', ')}`);
  const library = await fetch(`${server.url}/livegate.js`, { headers: { Origin: pageOrigin } });
  assert.equal(library.headers.get('access-control-allow-origin'), pageOrigin);
  const noKey = await fetch(`${server.url}/v1/tokens`, { method: 'POST', headers: { Origin: 'https://elsewhere.example', 'Content-Type': 'application/json' }, body: '{"user":"x"}' });
  assert.equal(noKey.status, 401, 'a page from another origin gets no token without the key');
});
