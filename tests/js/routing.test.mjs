// livegate.js lands on the session's node (issue 30): a handshake on the wrong node is
// refused with where to go (WebSocket close 4421, SSE HTTP 421 `wrong_node`), the client
// follows at once with the same credential, remembers the node, and falls back through
// the address it was given (`avoid=<node>`) when that node cannot be reached.
// Run from the repository root: `node --test tests/js/` (the real-server tests need
// target/release/livegate: `cargo build --release`).

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { connect } from '../../clients/js/livegate.js';
import { fakeSocketClass } from './support/fake-socket.mjs';
import { VirtualClock } from './support/virtual-clock.mjs';
import { fakeFetch } from './support/fake-fetch.mjs';
import { REAL_SERVER_TIMINGS, recorder, subscribed } from './support/clients.mjs';
import { WebSocketImpl, letTimePass, mintToken, publish, waitFor } from './support/server.mjs';
import { CLIENTS_ONLY, startCluster, startForwarder, startNats } from './support/nodes.mjs';

/** Backoff tiers long enough that a reconnect within them can only be a follow. */
const SLOW_BACKOFF = {
  backoffMs: [5000, 5000, 5000],
  restartJitterMs: 5000,
  connectTimeoutMs: 3000,
  stableMs: 60_000,
};

const params = (socket) => Object.fromEntries(new URL(socket.url).searchParams);
const hostOf = (socket) => new URL(socket.url).host;

/** A fetch for the /readyz checks only: `down` hosts throw (unreachable), the rest answer 200. */
function readyzFetch(down = new Set()) {
  const fn = async (url) => {
    const target = new URL(url);
    fn.probes.push(target.host);
    if (down.has(target.host)) throw new TypeError('fetch failed');
    return new Response('{"status":"ready"}', { status: 200 });
  };
  fn.probes = [];
  return fn;
}

describe('livegate.js follows wrong_node refusals (scripted socket, virtual time)', () => {
  test('close 4421: reconnects at once to the node in the reason, with the same token and session, then goes there first', { timeout: 10_000 }, async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    let tokens = 0;
    const client = connect({
      clock: clock.option,
      url: 'http://gw.test',
      session: 'S1',
      getToken: async () => `t${++tokens}`,
      WebSocket: Fake,
      fetch: readyzFetch(),
      transports: ['websocket'],
      random: () => 1,
      timings: SLOW_BACKOFF,
    });
    const log = recorder(client);
    const redirects = [];
    client.on('redirect', (r) => redirects.push(r));
    try {
      const ws0 = await Fake.nth(0);
      assert.equal(hostOf(ws0), 'gw.test');
      assert.deepEqual(params(ws0), { token: 't1', session: 'S1' });
      ws0.open();
      ws0.serverSend({ op: 'error', code: 'wrong_node', message: 'session S1 lives on a', node: 'a', url: 'http://a.test:7001' });
      ws0.serverClose(4421, 'http://a.test:7001');
      const ws1 = await Fake.nth(1, 1000); // no backoff: the tiers are 5 s here
      assert.equal(ws1.url, 'ws://a.test:7001/v1/ws?token=t1&session=S1', 'the same, unspent token');
      assert.equal(tokens, 1, 'getToken is not asked again');
      assert.deepEqual(log.disconnected.map((d) => [d.code, d.reconnectInMs]), [[4421, 0]]);
      assert.deepEqual(redirects, [{ node: 'a', url: 'http://a.test:7001', avoid: null, reason: 'wrong_node' }]);
      assert.equal(log.error.length, 0, 'a refusal to follow is not an error');
      ws1.welcome('S1', { node: 'a', resume: 'R1', resume_expires_at_ms: clock.now() + 600_000 });
      assert.equal(log.connected.at(-1).node, 'a');

      // Lost: the next attempt goes to node a first, with the resume credential.
      ws1.serverClose(4008, 'heartbeat timeout');
      const ws2 = await Fake.nth(2, 7000);
      assert.equal(ws2.url, 'ws://a.test:7001/v1/ws?resume=R1');
      // A drain of node a (1012) sends the next attempt through the given address.
      ws2.welcome('S1', { node: 'a', resume: 'R2', resume_expires_at_ms: clock.now() + 600_000 });
      ws2.serverClose(1012, 'service restart: reconnect in 1 ms');
      const ws3 = await Fake.nth(3, 1000);
      assert.equal(ws3.url, 'ws://gw.test/v1/ws?resume=R2');
    } finally {
      client.close();
    }
  });

  test('close 4421 after a welcome (a rebalance handed the session over): reconnects at once to the URL with the resume credential', { timeout: 10_000 }, async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    let tokens = 0;
    const client = connect({
      clock: clock.option,
      url: 'http://gw.test',
      getToken: async () => `t${++tokens}`,
      WebSocket: Fake,
      fetch: readyzFetch(),
      transports: ['websocket'],
      random: () => 1,
      timings: SLOW_BACKOFF,
    });
    const log = recorder(client);
    const redirects = [];
    client.on('redirect', (r) => redirects.push(r));
    try {
      const ws0 = await Fake.nth(0);
      ws0.open();
      ws0.welcome('S1', { node: 'a', resume: 'R1', resume_expires_at_ms: clock.now() + 600_000 });
      ws0.serverClose(4421, 'http://c.test:7003');
      const ws1 = await Fake.nth(1, 1000); // no backoff: the tiers are 5 s here
      assert.equal(ws1.url, 'ws://c.test:7003/v1/ws?resume=R1', 'the welcome\'s resume credential, at the URL given');
      assert.equal(tokens, 1, 'getToken is not asked again');
      assert.deepEqual(log.disconnected.map((d) => [d.code, d.reconnectInMs, d.welcomed]), [[4421, 0, true]]);
      assert.deepEqual(redirects, [{ node: null, url: 'http://c.test:7003', avoid: null, reason: 'wrong_node' }]);
      assert.equal(log.error.length, 0);
      // A 4421 after a welcome without a URL is an ordinary loss (backoff), not a follow.
      ws1.welcome('S1', { node: 'c', resume: 'R2', resume_expires_at_ms: clock.now() + 600_000 });
      ws1.serverClose(4421, '');
      await assert.rejects(Fake.nth(2, 500));
    } finally {
      client.close();
    }
  });

  test('close 4421 with an empty reason follows the wrong_node frame; a resume credential is not counted as failed', { timeout: 10_000 }, async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    const fetch = readyzFetch();
    const client = connect({ clock: clock.option, url: 'http://gw.test', getToken: async () => 'tok', WebSocket: Fake, fetch, transports: ['websocket'], resumeAttempts: 1, random: () => 1, timings: SLOW_BACKOFF });
    try {
      const ws0 = await Fake.nth(0);
      ws0.welcome('S1', { node: 'b', resume: 'R1', resume_expires_at_ms: clock.now() + 600_000 });
      client.dropConnection();
      const long = `https://${'x'.repeat(120)}.example/`;
      // Plain http given, https named: allowed (never the other way round).
      for (let n = 1; n <= 2; n++) {
        const ws = await Fake.nth(n, 7000);
        ws.open();
        ws.serverSend({ op: 'error', code: 'wrong_node', message: 'elsewhere', node: 'a', url: long });
        ws.serverClose(4421, '');
      }
      const ws3 = await Fake.nth(3, 1000);
      assert.equal(ws3.url, `wss://${'x'.repeat(120)}.example/v1/ws?resume=R1`);
      assert.ok(client.hasResume, 'refusals that named a node do not use up the credential');
      assert.equal(fetch.probes.length, 0, 'nothing to judge: the server said why');
    } finally {
      client.close();
    }
  });

  test('at most 3 refusals are followed in a row without a welcome, then the client backs off through the given address', { timeout: 15_000 }, async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    const client = connect({
      clock: clock.option,
      url: 'http://gw.test',
      session: 'S1',
      getToken: async () => 'tok',
      WebSocket: Fake,
      fetch: null,
      random: () => 0.5,
      timings: { ...SLOW_BACKOFF, backoffMs: [300, 300] },
    });
    const log = recorder(client);
    try {
      for (let n = 0; n < 4; n++) {
        const ws = await Fake.nth(n, 1000);
        assert.equal(hostOf(ws), n === 0 ? 'gw.test' : n % 2 ? 'a.test' : 'b.test');
        ws.open();
        ws.serverClose(4421, n % 2 ? 'http://b.test' : 'http://a.test');
      }
      assert.deepEqual(log.disconnected.map((d) => d.reconnectInMs), [0, 0, 0, 150], 'the 4th refusal backs off');
      const ws4 = await Fake.nth(4, 1000);
      assert.equal(hostOf(ws4), 'gw.test');
      // A welcome resets the count.
      ws4.open();
      ws4.serverClose(4421, 'http://a.test');
      const ws5 = await Fake.nth(5, 1000);
      assert.equal(hostOf(ws5), 'a.test');
      ws5.welcome('S1', { node: 'a' });
      assert.equal(client.state, 'connected');
    } finally {
      client.close();
    }
  });

  test('a refusal naming plain http is not followed from https (the credential would travel in the clear)', { timeout: 10_000 }, async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    const client = connect({ clock: clock.option, url: 'https://gw.test', getToken: async () => 'tok', WebSocket: Fake, fetch: null, random: () => 0.5, timings: { ...SLOW_BACKOFF, backoffMs: [100] } });
    const log = recorder(client);
    try {
      const ws0 = await Fake.nth(0);
      ws0.open();
      ws0.serverClose(4421, 'http://a.test');
      const ws1 = await Fake.nth(1, 1000);
      assert.equal(hostOf(ws1), 'gw.test');
      assert.deepEqual(log.disconnected.map((d) => d.reconnectInMs), [50]);
    } finally {
      client.close();
    }
  });

  test('the named node unreachable: back through the given address once with avoid=<node>, the same token', { timeout: 10_000 }, async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    const down = new Set(['a.test']);
    const fetch = readyzFetch(down);
    let tokens = 0;
    const client = connect({ clock: clock.option, url: 'http://gw.test', session: 'S1', getToken: async () => `t${++tokens}`, WebSocket: Fake, fetch, transports: ['websocket'], random: () => 1, timings: SLOW_BACKOFF });
    const redirects = [];
    client.on('redirect', (r) => redirects.push(r));
    try {
      const ws0 = await Fake.nth(0);
      ws0.open();
      ws0.serverSend({ op: 'error', code: 'wrong_node', message: 'elsewhere', node: 'a', url: 'http://a.test' });
      ws0.serverClose(4421, 'http://a.test');
      const ws1 = await Fake.nth(1, 1000);
      assert.equal(hostOf(ws1), 'a.test');
      ws1.fail(); // connection refused: no open, close 1006
      const ws2 = await Fake.nth(2, 1000);
      assert.equal(ws2.url, 'ws://gw.test/v1/ws?token=t1&session=S1&avoid=a');
      assert.deepEqual(fetch.probes, ['a.test']);
      assert.deepEqual(redirects.map((r) => [r.reason, r.node, r.avoid]), [['wrong_node', 'a', null], ['unreachable', null, 'a']]);
      // The given address answers with another node: the chain keeps avoiding a.
      ws2.open();
      ws2.serverClose(4421, 'http://c.test');
      const ws3 = await Fake.nth(3, 1000);
      assert.equal(ws3.url, 'ws://c.test/v1/ws?token=t1&session=S1&avoid=a');
      ws3.welcome('S1', { node: 'c', resume: 'R1', resume_expires_at_ms: clock.now() + 600_000 });
      client.dropConnection();
      const ws4 = await Fake.nth(4, 7000);
      assert.equal(ws4.url, 'ws://c.test/v1/ws?resume=R1', 'the avoid was for one handshake chain only');
      // The remembered node unreachable: the given address next, avoiding it.
      down.add('c.test');
      ws4.fail();
      const ws5 = await Fake.nth(5, 1000);
      assert.equal(ws5.url, 'ws://gw.test/v1/ws?resume=R1&avoid=c');
      assert.ok(client.hasResume, 'an unreachable node did not see the credential');
    } finally {
      client.close();
    }
  });

  test('close 4029 waits the retry-after seconds of its reason', { timeout: 10_000 }, async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    const client = connect({ clock: clock.option, url: 'http://gw.test', getToken: async () => 'tok', WebSocket: Fake, fetch: null, random: () => 0, timings: { ...SLOW_BACKOFF, backoffMs: [0] } });
    const log = recorder(client);
    try {
      const ws0 = await Fake.nth(0);
      ws0.open();
      const before = clock.now();
      ws0.serverClose(4029, '1');
      assert.deepEqual(log.disconnected.map((d) => [d.code, d.reconnectInMs]), [[4029, 1000]]);
      const ws1 = await Fake.nth(1, 3000);
      assert.ok(ws1.createdAt - before >= 990, 'waited the second');
    } finally {
      client.close();
    }
  });
});

describe('livegate.js follows wrong_node refusals over SSE (scripted fetch)', () => {
  test('HTTP 421 wrong_node: the next request goes to the named node with the same token; 429 waits Retry-After', { timeout: 10_000 }, async () => {
    const fetch = fakeFetch();
    let tokens = 0;
    const client = connect({ url: 'http://gw.test', session: 'S1', getToken: async () => `t${++tokens}`, fetch, transports: ['sse'], random: () => 0, timings: { ...SLOW_BACKOFF, backoffMs: [0] } });
    const log = recorder(client);
    try {
      subscribed(client, 'r1', () => {});
      const s0 = await fetch.nth(0);
      assert.equal(s0.url.host, 'gw.test');
      s0.respond(421, { error: { code: 'wrong_node', message: 'session S1 lives on a', node: 'a', url: 'http://a.test:7001' } });
      const s1 = await fetch.nth(1, 1000);
      assert.equal(s1.url.origin + s1.url.pathname, 'http://a.test:7001/v1/sse');
      assert.deepEqual([s1.params.token, s1.params.session, s1.params.rooms], ['t1', 'S1', 'r1']);
      assert.equal(tokens, 1);
      assert.equal(log.error.length, 0);
      s1.respond(429, { error: { code: 'migration_budget', message: 'retry after 1 s' } });
      const s2 = await fetch.nth(2, 3000);
      assert.ok(s2.createdAt - s1.createdAt >= 990, 'waited the retry-after second');
      assert.equal(log.disconnected.at(-1).code, 4029);
      assert.equal(log.disconnected.at(-1).reconnectInMs, 1000);
    } finally {
      client.close();
    }
  });
});


// ---------------------------------------------------------------------------------------
// Two real nodes, a and b, in cluster mode (one NATS: the shared directory, token secret
// and rooms), behind a forwarder the test points at either one (the load balancer the
// client is given). Each node's public URL goes through a gate of its own, so a test can
// make a node unreachable for clients while the cluster still sees it alive.
// ---------------------------------------------------------------------------------------

describe('livegate.js lands on the session\'s node (two real nodes)', () => {
  let nats;
  let cluster;
  let gate; // node a's
  let gateB;
  let balancer;
  // The server believes a client that cannot reach a node started less than 10 s ago
  // without charging its budget (the node was restarting): budget tests wait past that.
  let clusterReadyAt;
  const RESTART_GRACE_MS = 10_000;
  before(async () => {
    nats = await startNats();
    gate = await startForwarder(0);
    gateB = await startForwarder(0);
    cluster = await startCluster({ nats, names: ['a', 'b'], publicUrls: { a: gate.url, b: gateB.url } });
    clusterReadyAt = Date.now();
    gate.point(cluster.nodes.a.port);
    gateB.point(cluster.nodes.b.port);
    balancer = await startForwarder(cluster.nodes.a.port);
  });
  after(async () => {
    await balancer?.close();
    await gate?.close();
    await gateB?.close();
    await cluster?.stop();
    await nats?.stop();
  });

  /**
   * A client through the balancer (pointed at a) with a session on a, subscribed to
   * `room`; then the balancer points at b, the connection is cut, `missed` events are
   * published while the client cannot get in, and it is let in again.
   */
  async function sessionOnAThenThroughB({ user, room, transport, missed }) {
    const { a, b } = cluster.nodes;
    balancer.point(a.port);
    let tokens = 0;
    const client = connect({
      url: balancer.url,
      WebSocket: WebSocketImpl,
      transports: [transport],
      timings: REAL_SERVER_TIMINGS,
      getToken: async () => {
        tokens += 1;
        return mintToken(b.url, user);
      },
    });
    const log = recorder(client);
    const redirects = [];
    client.on('redirect', (r) => redirects.push(r));
    const timeline = [];
    for (const name of ['connecting', 'connected', 'disconnected']) client.on(name, (d) => timeline.push([name, d]));
    const got = [];
    await subscribed(client, room, (event) => got.push(event.data.n));
    assert.equal(log.connected.at(-1).node, 'a');
    const session = client.session;
    await publish(a.url, room, { n: 0 });
    await waitFor(() => got.length === 1, 'the first event');

    balancer.hold();
    balancer.point(b.port);
    balancer.dropAll();
    gate.dropAll();
    await waitFor(() => client.state !== 'connected', 'the client to notice');
    for (let n = 1; n <= missed; n++) await publish(n % 2 ? a.url : b.url, room, { n });
    const connectedBefore = log.connected.length;
    balancer.release();
    await waitFor(() => log.connected.length > connectedBefore, 'the client back', 15_000);
    return { client, log, redirects, got, session, timeline, tokens: () => tokens, connectedBefore };
  }

  for (const transport of ['websocket', 'sse']) {
    test(`${transport}: a session on a reconnecting through b lands on a within one extra round trip, its credential unspent, nothing lost`, { timeout: 60_000 }, async () => {
      const room = `route-${transport}:1`;
      const run = await sessionOnAThenThroughB({ user: `lands-${transport}`, room, transport, missed: 3 });
      const { client, log, redirects, got, session } = run;
      try {
        const back = log.connected.slice(run.connectedBefore);
        assert.deepEqual(back.map((c) => [c.node, c.session, c.resumed, c.credential, c.transport]), [['a', session, true, 'resume', transport]]);
        // Attempts while the balancer held them off failed before reaching anyone; from
        // the first that got through: one refused by b, one welcomed by a.
        assert.deepEqual(redirects.map((r) => [r.reason, r.node, r.url, r.avoid]), [['wrong_node', 'a', gate.url, null]]);
        const refused = log.disconnected.filter((d) => d.code === 4421);
        assert.equal(refused.length, 1, JSON.stringify(log.disconnected));
        assert.equal(refused[0].reconnectInMs, 0);
        // b's refusal, then exactly one handshake: a's welcome.
        const refusedAt = run.timeline.findIndex(([name, d]) => name === 'disconnected' && d.code === 4421);
        assert.deepEqual(run.timeline.slice(refusedAt - 1).map(([name]) => name), ['connecting', 'disconnected', 'connecting', 'connected']);
        assert.equal(run.tokens(), 1, 'the resume credential did it: no token asked for');
        await waitFor(() => got.length === 4, 'the missed events', 10_000);
        assert.deepEqual(got, [0, 1, 2, 3]);
        assert.deepEqual(log.error.filter((e) => e.code !== 'token'), []);

        // Reconnects go to a first now: the balancer sees none of them.
        const through = balancer.accepted();
        client.dropConnection();
        await waitFor(() => log.connected.length > run.connectedBefore + 1, 'the client back again');
        assert.equal(log.connected.at(-1).node, 'a');
        assert.equal(balancer.accepted(), through, 'the reconnect went straight to a');
        assert.equal(redirects.length, 1);
        await publish(cluster.nodes.b.url, room, { n: 4 });
        await waitFor(() => got.length === 5, 'a live event');
        assert.deepEqual(got, [0, 1, 2, 3, 4]);
      } finally {
        client.close();
      }
    });
  }

  for (const transport of ['websocket', 'sse']) {
    test(`${transport}: a unreachable for clients: back through b with avoid=a, lands on b; a second move the route did not choose waits the budget's retry-after`, { timeout: 60_000 }, async () => {
      await letTimePass(Math.max(0, clusterReadyAt + RESTART_GRACE_MS + 500 - Date.now()), 'the nodes outlive the restart grace');
      const room = `route-fallback-${transport}:1`;
      const run = await sessionOnAThenThroughB({ user: `fallback-${transport}`, room, transport, missed: 1 });
      const { client, log, redirects, got } = run;
      try {
        assert.equal(log.connected.at(-1).node, 'a');
        // a stays alive for the cluster (its peers' readiness probes still pass); clients
        // cannot reach its public URL any more.
        gate.block(CLIENTS_ONLY);
        const connectedBefore = log.connected.length;
        client.dropConnection();
        await waitFor(() => log.connected.length > connectedBefore, 'the client back', 20_000);
        assert.deepEqual(log.connected.slice(connectedBefore).map((c) => [c.node, c.session, c.resumed]), [['b', run.session, true]]);
        assert.deepEqual(redirects.map((r) => [r.reason, r.node, r.avoid]), [['wrong_node', 'a', null], ['unreachable', null, 'a']]);
        await publish(cluster.nodes.b.url, room, { n: 2 });
        await waitFor(() => got.length === 3, 'the events, a live one on b');
        assert.deepEqual(got, [0, 1, 2]);

        // The session moved once (a to b, not the route's choice). Now b is the one clients
        // cannot reach and the balancer sends them to a: a names b, b is unreachable, a is
        // asked to avoid b: a second move in the window, refused for the budget (4029 /
        // HTTP 429), and the client waits the retry-after it was given.
        gate.unblock();
        gateB.block(CLIENTS_ONLY);
        balancer.point(cluster.nodes.a.port);
        const refusedBefore = log.disconnected.length;
        // Cut every connection through the balancer: the stream on b, and the idle ones
        // fetch() keeps alive (they would carry the next SSE request to b).
        balancer.dropAll();
        const budget = await waitFor(() => log.disconnected.slice(refusedBefore).find((d) => d.code === 4029), 'the budget refusal', 20_000).catch((e) => { throw new Error(`${e.message}: ${JSON.stringify({ d: log.disconnected.slice(refusedBefore), r: redirects, c: log.connected.slice(-2), e: log.error })}`); });
        assert.ok(budget.reconnectInMs >= 1000, `waits the retry-after: ${JSON.stringify(budget)}`);
        assert.ok(budget.reconnectInMs <= 60_000, 'at most timings.maxHintMs');
        assert.deepEqual(redirects.slice(2).map((r) => [r.reason, r.node, r.avoid]), [['wrong_node', 'b', null], ['unreachable', null, 'b']]);
        assert.ok(client.hasResume, 'the refused credential is kept');
      } finally {
        gate.unblock();
        gateB.unblock();
        client.close();
      }
    });
  }
});
