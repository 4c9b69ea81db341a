// The wrong-node refusal in a real browser (issue 30): a browser cannot read the status of
// a refused WebSocket upgrade, so a node that does not own the session accepts the socket
// and closes it at once with 4421, the owner's URL in the reason. This checks, in headless
// Chromium, that livegate.js reads that close and lands on the owner with its credential.
// Run from the repository root: `node --test tests/e2e/`. Needs target/release/livegate
// (or LIVEGATE_BIN), Debian's chromium and nats-server, and playwright-core.
//
// Two nodes, a and b, in cluster mode behind a forwarder the test points at either (the
// address the page was given). The page and clients/js/livegate.js are served by the test
// (so the client under test is the source tree's), from the forwarder's origin.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { mintToken, publish, tempDir } from '../js/support/server.mjs';
import { startCluster, startForwarder, startNats } from '../js/support/nodes.mjs';
import { cleanup, clientFromSource, launchBrowser } from './support.mjs';

const PAGE = `<!doctype html><meta charset="utf-8"><title>routing</title>
<script type="module">
  import { connect } from '/livegate.js';
  const t = (window.__t = { timeline: [], got: [], redirects: [] });
  const client = connect({
    url: location.origin,
    transports: ['websocket'],
    getToken: () => window.mintToken('browser-route'),
    timings: { backoffMs: [0, 50, 100, 200, 400], restartJitterMs: 200, connectTimeoutMs: 5000, stableMs: 60000 },
  });
  for (const name of ['connecting', 'connected', 'disconnected', 'error']) {
    client.on(name, (d) => t.timeline.push([name, d]));
  }
  client.on('redirect', (r) => t.redirects.push(r));
  const sub = client.subscribe('browser-route:1');
  sub.on('event', (event) => t.got.push(event.data.n));
  sub.ready().then(() => (t.subscribed = true));
  window.__client = client;
</script>`;

test('Chromium: a session on a reconnecting through b is closed with 4421 and lands on a with its resume credential', { timeout: 90_000 }, async (t) => {
  const nats = await startNats();
  cleanup(() => nats.stop());
  const cluster = await startCluster({ nats, names: ['a', 'b'] });
  cleanup(() => cluster.stop());
  const { a, b } = cluster.nodes;
  const balancer = await startForwarder(a.port);
  cleanup(() => balancer.close());
  const profile = tempDir('livegate-e2e-chromium-');
  cleanup(() => profile.remove());

  // A page fulfilled by the test has no address for Chromium's local network access
  // checks, which would then block its loopback WebSocket.
  const context = await launchBrowser(profile.dir, { viewport: { width: 800, height: 600 }, args: ['--disable-features=LocalNetworkAccessChecks'] });
  const page = context.pages()[0] ?? (await context.newPage());
  const pageErrors = [];
  page.on('pageerror', (error) => pageErrors.push(String(error)));
  await page.exposeFunction('mintToken', (user) => mintToken(b.url, user));
  await clientFromSource(page);
  await page.route((url) => url.pathname === '/routing.html', (route) => route.fulfill({ status: 200, contentType: 'text/html; charset=utf-8', body: PAGE }));
  await page.goto(`${balancer.url}/routing.html`, { waitUntil: 'domcontentloaded', timeout: 10_000 });

  const state = () => page.evaluate(() => JSON.parse(JSON.stringify(window.__t)));
  const waitInPage = (what, fn, arg, ms = 15_000) =>
    page.waitForFunction(fn, arg, { timeout: ms, polling: 50 }).catch(async (error) => {
      throw new Error(`timed out waiting for ${what}: ${JSON.stringify(await state().catch(() => null))}\n${error.message.split('\n')[0]}`);
    });

  await waitInPage('the first connection and subscription', () => window.__t.subscribed === true);
  let seen = await state();
  const first = seen.timeline.filter(([name]) => name === 'connected').map(([, d]) => d);
  assert.deepEqual(first.map((c) => c.node), ['a']);
  const session = first[0].session;
  await publish(a.url, 'browser-route:1', { n: 0 });
  await waitInPage('the first event', () => window.__t.got.length === 1);

  // The balancer now sends the page to b; events are published while it cannot get in.
  balancer.hold();
  balancer.point(b.port);
  balancer.dropAll();
  await waitInPage('the page to notice', () => window.__client.state !== 'connected');
  await publish(a.url, 'browser-route:1', { n: 1 });
  await publish(b.url, 'browser-route:1', { n: 2 });
  balancer.release();
  await waitInPage('the page back', () => window.__t.timeline.filter(([name]) => name === 'connected').length === 2);
  await waitInPage('the missed events', () => window.__t.got.length === 3);

  seen = await state();
  t.diagnostic(`timeline after the cut: ${JSON.stringify(seen.timeline.slice(2).map(([name, d]) => [name, d.code ?? d.node ?? d.attempt]))}`);
  const back = seen.timeline.filter(([name]) => name === 'connected').map(([, d]) => d)[1];
  assert.deepEqual([back.node, back.session, back.resumed, back.credential], ['a', session, true, 'resume']);
  const refusedAt = seen.timeline.findIndex(([name, d]) => name === 'disconnected' && d.code === 4421);
  assert.ok(refusedAt > 0, 'the browser saw close 4421');
  assert.equal(seen.timeline[refusedAt][1].reason, a.url, 'its reason: the owner\'s URL');
  assert.equal(seen.timeline[refusedAt][1].reconnectInMs, 0);
  assert.deepEqual(seen.timeline.slice(refusedAt - 1).map(([name]) => name), ['connecting', 'disconnected', 'connecting', 'connected'], 'one extra round trip');
  assert.deepEqual(seen.redirects.map((r) => [r.reason, r.node, r.url]), [['wrong_node', 'a', a.url]]);
  assert.deepEqual(seen.got, [0, 1, 2]);
  assert.deepEqual(seen.timeline.filter(([name]) => name === 'error'), []);
  assert.deepEqual(pageErrors, []);
  await page.evaluate(() => window.__client.close());
});
