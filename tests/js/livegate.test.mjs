// Tests of livegate.js. Run from the repository root: `node --test tests/js/`
// (needs target/release/livegate: `cargo build --release`).
//
// The recovery, restart and close-code tests run against the real server binary; the gap,
// duplicate and backoff tests play the server through a scripted fake socket, because a
// real server does not produce gaps or duplicates on demand.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { DEFAULT_TIMINGS, connect, endpointOf, suggestedDelayMs } from '../../clients/js/livegate.js';
import { fakeSocketClass } from './support/fake-socket.mjs';
import { VirtualClock } from './support/virtual-clock.mjs';
import { recorder, subscribed as subscribeRoom } from './support/clients.mjs';
import {
  WebSocketImpl,
  api,
  mintToken,
  nextEvent,
  publish,
  sendMessage,
  letTimePass,
  startProxy,
  startServer,
  startServerOnPort,
  tempDir,
  waitFor,
} from './support/server.mjs';

/** Short timings so reconnects in tests take milliseconds. */
const FAST = {
  backoffMs: [0, 50, 100, 200, 400],
  restartJitterMs: 200,
  connectTimeoutMs: 3000,
  stableMs: 60_000,
};

/** Lets promise callbacks (history replies) run. */
const tick = () => new Promise((resolve) => setImmediate(resolve));
const seqs = (events) => events.map((e) => e.seq);
const range = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

// ---------------------------------------------------------------------------------------
// Unit level: the client's delivery rules and reconnect timing, with a scripted socket.
// ---------------------------------------------------------------------------------------

describe('livegate.js with a scripted socket', () => {
  /** A client on a fake socket, welcomed and subscribed to `room` at head `head`. */
  async function subscribed(room, head, { epoch = 'E1', options = {} } = {}) {
    const Fake = fakeSocketClass();
    const client = connect({ url: 'http://gw.test', getToken: async () => 'tok', WebSocket: Fake, fetch: null, timings: FAST, ...options });
    const log = recorder(client);
    const got = [];
    const reply = subscribeRoom(client, room, (event) => got.push(event));
    const ws = await Fake.nth(0);
    ws.welcome();
    const sub = await ws.expect('subscribe');
    assert.equal(sub.room, room);
    assert.equal(sub.since, undefined, 'a first subscribe is live only');
    ws.serverSend({ op: 'subscribed', room, epoch, seq: head, ref: sub.ref });
    assert.deepEqual(await reply, { room, epoch, seq: head, recovered: undefined });
    return { Fake, client, log, got, ws };
  }

  test('a gap in the live stream is filled with history before later events', { timeout: 10_000 }, async () => {
    const { client, got, ws, log } = await subscribed('match:1', 5);
    try {
      ws.events('match:1', 6);
      assert.deepEqual(seqs(got), [6]);

      ws.events('match:1', 9, 10); // 7 and 8 missing
      const ask = await ws.expect('history');
      assert.deepEqual({ room: ask.room, since: ask.since, limit: ask.limit }, { room: 'match:1', since: 6, limit: 2 });
      assert.deepEqual(seqs(got), [6], 'nothing after the gap is delivered before the gap is filled');
      ws.events('match:1', 11, 10); // arrives while filling (10 a second time)
      assert.deepEqual(seqs(got), [6]);

      ws.serverSend({
        op: 'history', room: 'match:1', epoch: 'E1', head: 11, complete: false, ref: ask.ref,
        events: [7, 8].map((seq) => ({ room: 'match:1', seq, id: `e-${seq}`, ts_ms: 1, data: { n: seq } })),
      });
      await tick();
      assert.deepEqual(seqs(got), [6, 7, 8, 9, 10, 11]);
      assert.deepEqual(got.map((e) => e.data.n), [6, 7, 8, 9, 10, 11]);

      // A gap wider than one history page is filled page by page.
      ws.sent.length = 0;
      ws.events('match:1', 16);
      const page1 = await ws.expect('history');
      assert.equal(page1.since, 11);
      assert.equal(page1.limit, 4);
      ws.serverSend({
        op: 'history', room: 'match:1', epoch: 'E1', head: 16, complete: false, ref: page1.ref,
        events: [12, 13].map((seq) => ({ room: 'match:1', seq, id: `e-${seq}`, ts_ms: 1, data: {} })),
      });
      const page2 = await ws.expect('history', (f) => f.ref !== page1.ref);
      assert.equal(page2.since, 13);
      assert.equal(page2.limit, 2);
      ws.serverSend({
        op: 'history', room: 'match:1', epoch: 'E1', head: 16, complete: true, ref: page2.ref,
        events: [14, 15, 16].map((seq) => ({ room: 'match:1', seq, id: `e-${seq}`, ts_ms: 1, data: {} })),
      });
      await tick();
      assert.deepEqual(seqs(got), range(6, 16));
      assert.equal(log.recovery_failed.length, 0);
      assert.deepEqual(client.position('match:1'), { epoch: 'E1', seq: 16 });
    } finally {
      client.close();
    }
  });

  test('a gap history no longer covers ends in recovery_failed, then delivery goes on', { timeout: 10_000 }, async () => {
    const { client, got, ws, log } = await subscribed('match:2', 10);
    try {
      ws.events('match:2', 11, 15);
      const ask = await ws.expect('history');
      assert.equal(ask.since, 11);
      // Trimmed: history starts after the gap.
      ws.serverSend({ op: 'history', room: 'match:2', epoch: 'E1', head: 15, complete: false, ref: ask.ref, events: [] });
      await tick();
      assert.deepEqual(seqs(got), [11, 15]);
      assert.equal(log.recovery_failed.length, 1);
      assert.equal(log.recovery_failed[0].room, 'match:2');

      // The room's epoch changed under the gap: also a failed recovery.
      ws.sent.length = 0;
      ws.events('match:2', 18);
      const ask2 = await ws.expect('history');
      ws.serverSend({ op: 'history', room: 'match:2', epoch: 'E2', head: 18, complete: true, ref: ask2.ref, events: [] });
      await tick();
      assert.equal(log.recovery_failed.length, 2);
      assert.deepEqual(seqs(got), [11, 15, 18]);

      // A history error (e.g. unavailable) for the gap: the same.
      ws.sent.length = 0;
      ws.events('match:2', 20);
      const ask3 = await ws.expect('history');
      ws.serverSend({ op: 'error', code: 'unavailable', message: 'room busy', ref: ask3.ref });
      await tick();
      assert.equal(log.recovery_failed.length, 3);
      assert.deepEqual(seqs(got), [11, 15, 18, 20]);
    } finally {
      client.close();
    }
  });

  test('duplicates are dropped: a seq delivered before, a repeated id, a replay overlap', { timeout: 10_000 }, async () => {
    const { Fake, client, got, ws, log } = await subscribed('match:3', 0);
    try {
      ws.events('match:3', 1, 2);
      ws.events('match:3', 2); // the same seq again
      ws.events('match:3', 3, 3); // twice in one frame
      ws.events('match:3', { seq: 4, id: 'e-1' }); // a new seq repeating an id already delivered
      ws.events('match:3', 5); // not a gap: 4 was consumed (and dropped as a repeat)
      assert.deepEqual(seqs(got), [1, 2, 3, 5]);
      assert.deepEqual(got.map((e) => e.id), ['e-1', 'e-2', 'e-3', 'e-5']);
      assert.equal(ws.frames('history').length, 0, 'no gap was seen');

      // Events of rooms not subscribed (the automatic inbox) are ignored.
      ws.serverSend({ op: 'subscribed', room: 'user:u1', epoch: 'EI', seq: 3 });
      ws.events('user:u1', 4);

      // A restart: the client resubscribes with since + epoch; the replay overlaps.
      ws.serverClose(1012, 'service restart: reconnect in 5 ms');
      const ws2 = await Fake.nth(1);
      ws2.welcome('S1');
      const resub = await ws2.expect('subscribe');
      assert.deepEqual({ since: resub.since, epoch: resub.epoch }, { since: 5, epoch: 'E1' });
      ws2.serverSend({ op: 'subscribed', room: 'match:3', epoch: 'E1', seq: 7, recovered: true, ref: resub.ref });
      ws2.events('match:3', 4, 5, 6);
      ws2.events('match:3', 6, 7);
      assert.deepEqual(seqs(got), [1, 2, 3, 5, 6, 7]);
      assert.deepEqual(log.recovered.map((r) => r.room), ['match:3']);

      // Recovery refused: tell the app, go on from the new head, never below it.
      ws2.serverClose(1012, 'service restart: reconnect in 5 ms');
      const ws3 = await Fake.nth(2);
      ws3.welcome('S1');
      const resub3 = await ws3.expect('subscribe');
      assert.equal(resub3.since, 7);
      ws3.serverSend({ op: 'subscribed', room: 'match:3', epoch: 'E9', seq: 40, recovered: false, ref: resub3.ref });
      ws3.events('match:3', 40, 41);
      assert.deepEqual(seqs(got), [1, 2, 3, 5, 6, 7, 41]);
      assert.deepEqual(log.recovery_failed.map((r) => [r.room, r.seq]), [['match:3', 40]]);
      assert.deepEqual(client.position('match:3'), { epoch: 'E9', seq: 41 });
    } finally {
      client.close();
    }
  });

  test('only the last 500 ids are remembered', { timeout: 10_000 }, async () => {
    const { client, got, ws } = await subscribed('match:4', 0);
    try {
      ws.events('match:4', ...range(1, 501).map((seq) => ({ seq, id: `id-${seq}` })));
      ws.events('match:4', { seq: 502, id: 'id-1' }); // id-1 has been forgotten: delivered
      ws.events('match:4', { seq: 503, id: 'id-501' }); // id-501 is remembered: dropped
      ws.events('match:4', { seq: 504, id: 'id-3' }); // id-3 is remembered: dropped
      ws.events('match:4', { seq: 505, id: 'id-2' }); // id-2 was pushed out by id-1: delivered
      assert.equal(got.length, 503);
      assert.deepEqual(got.slice(-2).map((e) => [e.seq, e.id]), [[502, 'id-1'], [505, 'id-2']]);
    } finally {
      client.close();
    }
  });

  test('without a resume credential, every attempt gets a fresh token and offers the last session', { timeout: 10_000 }, async () => {
    const Fake = fakeSocketClass();
    let n = 0;
    const client = connect({ url: 'https://gw.test/base/', getToken: async () => `t${++n}`, WebSocket: Fake, fetch: null, timings: FAST });
    try {
      const ws = await Fake.nth(0);
      assert.equal(ws.url, 'wss://gw.test/base/v1/ws?token=t1');
      ws.welcome('sess/1');
      ws.serverClose(1012, 'service restart: reconnect in 1 ms');
      const ws2 = await Fake.nth(1);
      assert.equal(ws2.url, 'wss://gw.test/base/v1/ws?token=t2&session=sess%2F1');
      ws2.welcome('sess-2'); // the server did not keep it: the new one is offered next
      ws2.serverClose(4008, 'heartbeat timeout');
      const ws3 = await Fake.nth(2);
      assert.equal(ws3.url, 'wss://gw.test/base/v1/ws?token=t3&session=sess-2');
      assert.equal(client.session, 'sess-2');
    } finally {
      client.close();
    }
    assert.equal(endpointOf('http://127.0.0.1:7070'), 'ws://127.0.0.1:7070/v1/ws');
    assert.equal(endpointOf('ws://h/v1/ws'), 'ws://h/v1/ws');
    assert.equal(suggestedDelayMs('service restart: reconnect in 1234 ms'), 1234);
    assert.equal(suggestedDelayMs(''), null);
  });

  test('a server that never welcomes, or goes silent, is given up on (default timings, virtual time)', { timeout: 10_000 }, async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    const client = connect({
      clock: clock.option,
      url: 'http://gw.test',
      getToken: async () => 'tok',
      WebSocket: Fake,
      fetch: null, // no SSE, no /readyz check: the plain WebSocket rules
      random: () => 0, // every backoff 0: the times below are the timeouts alone
    });
    const log = recorder(client);
    try {
      const mute = await Fake.nth(0); // opens, never says welcome
      const next = await Fake.nth(1, 60_000);
      assert.equal(next.createdAt - mute.createdAt, DEFAULT_TIMINGS.connectTimeoutMs, 'gave up after the connect timeout, to the ms');
      assert.equal(log.disconnected[0].code, 1006);
      assert.match(log.disconnected[0].reason, /no welcome within 10000 ms/);
      assert.equal(mute.closedByClient?.code, 4000);

      next.welcome(); // heartbeat_ms 30000: a ping every 30 s, silent after 75 s
      const welcomedAt = clock.now();
      await clock.until(() => next.frames('ping').length > 0, 'a ping', 60_000);
      assert.equal(clock.now() - welcomedAt, 30_000, 'the client pings every heartbeat');
      const third = await Fake.nth(2, 5 * 60_000); // nobody answers: dropped at the first check past 75 s
      assert.equal(third.createdAt - welcomedAt, 90_000);
      assert.match(log.disconnected[1].reason, /nothing heard from the server for 75000 ms/);
      const subscribed = subscribeRoom(client, 'r', () => {});
      third.welcome();
      const sub = await third.expect('subscribe');
      third.serverSend({ op: 'subscribed', room: 'r', epoch: 'E', seq: 0, ref: sub.ref });
      await subscribed;
      // Each ping answered: ten minutes pass on one connection.
      for (let minute = 0; minute < 10; minute++) {
        await clock.advance(30_000);
        third.serverSend({ op: 'pong' });
        await clock.advance(30_000);
        third.serverSend({ op: 'pong' });
      }
      assert.equal(third.frames('ping').length, 20);
      assert.equal(Fake.sockets.length, 3);
      assert.equal(client.state, 'connected');
    } finally {
      client.close();
    }
  });

  test('the connection machine: one state at a time, each change a state event with its reason', { timeout: 10_000 }, async () => {
    const Fake = fakeSocketClass();
    const client = connect({ url: 'http://gw.test', getToken: async () => 'tok', WebSocket: Fake, fetch: null, timings: FAST });
    const log = recorder(client);
    const changes = () => log.state.map((c) => `${c.previous}>${c.state}`);
    try {
      assert.equal(client.state, 'disconnected', 'before the first attempt');
      const ws = await Fake.nth(0);
      assert.equal(client.state, 'connecting');
      ws.welcome();
      assert.equal(client.state, 'connected');
      assert.match(log.state.at(-1).reason, /welcomed by fake over websocket/);
      ws.serverClose(4008, 'heartbeat timeout');
      assert.equal(client.state, 'disconnected');
      assert.match(log.state.at(-1).reason, /lost \(4008: heartbeat timeout\), reconnecting in 0 ms/);
      const ws2 = await Fake.nth(1);
      ws2.welcome();
      ws2.serverClose(4502, 'kicked');
      assert.equal(client.state, 'closed');
      assert.match(log.state.at(-1).reason, /server said not to reconnect \(4502: kicked\)/);
      assert.deepEqual(changes(), [
        'disconnected>connecting', 'connecting>connected', 'connected>disconnected',
        'disconnected>connecting', 'connecting>connected', 'connected>closed',
      ]);
      await assert.rejects(subscribeRoom(client, 'r', () => {}), (e) => e.code === 'stopped');
      client.close();
      assert.equal(log.state.length, 6, 'closed is final: close() after it changes nothing');
    } finally {
      client.close();
    }

    // close() from connected: one change, the client's reason; requests refused as closed.
    const F = fakeSocketClass();
    const c = connect({ url: 'http://gw.test', getToken: async () => 'tok', WebSocket: F, fetch: null, timings: FAST });
    const l = recorder(c);
    (await F.nth(0)).welcome();
    c.close();
    assert.deepEqual(l.state.map((s) => [s.previous, s.state, s.reason]).at(-1), ['connected', 'closed', 'client closed']);
    assert.deepEqual(l.disconnected.map((d) => [d.code, d.reconnectInMs]), [[1000, null]]);
    await assert.rejects(c.history('r'), (e) => e.code === 'closed');
  });

  test('backoff tiers are bounded: full jitter under about 0, 2, 5, 10 s, then 30 s (virtual time)', { timeout: 10_000 }, async () => {
    const tiers = [...DEFAULT_TIMINGS.backoffMs];
    async function delaysWith(random, attempts) {
      const clock = new VirtualClock();
      const Fake = fakeSocketClass((socket) => socket.fail(), clock); // every attempt fails at once
      const client = connect({
        clock: clock.option,
        url: 'http://gw.test',
        getToken: async () => 'tok',
        WebSocket: Fake,
        fetch: null, // no SSE, no /readyz check: the plain WebSocket rules
        random,
      });
      const log = recorder(client);
      try {
        await Fake.nth(attempts - 1, 10 * 60_000);
      } finally {
        client.close();
      }
      const created = Fake.sockets.map((s) => s.createdAt);
      const waited = created.slice(1).map((t, i) => t - created[i]);
      return { delays: log.disconnected.slice(0, attempts - 1).map((d) => d.reconnectInMs), waited, log };
    }

    // random() just under 1: each delay is its tier, and each attempt comes exactly then.
    const top = await delaysWith(() => 0.99999, 9);
    assert.deepEqual(top.delays, [0, 1999, 4999, 9999, 29999, 29999, 29999, 29999]);
    assert.deepEqual(top.waited, top.delays);
    assert.ok(top.log.disconnected.slice(0, 8).every((d) => d.code === 1006));

    // A seeded generator: every delay within [0, tier), not all the same.
    let seed = 42;
    const lcg = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const jittered = await delaysWith(lcg, 9);
    jittered.delays.forEach((ms, i) => {
      const tier = tiers[Math.min(i, tiers.length - 1)];
      assert.ok(ms >= 0 && ms <= tier, `delay ${i} = ${ms} outside [0, ${tier}]`);
    });
    assert.deepEqual(jittered.waited, jittered.delays);
    assert.ok(new Set(jittered.delays.slice(4)).size > 1, `no jitter at the cap: ${jittered.delays}`);

    // The defaults are the documented tiers.
    assert.deepEqual(tiers, [0, 2000, 5000, 10000, 30000]);
    assert.equal(DEFAULT_TIMINGS.restartJitterMs, 3000);
  });

  test('a connection that stayed up for stableMs starts the backoff from the first tier again (virtual time)', { timeout: 10_000 }, async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    const client = connect({
      clock: clock.option,
      url: 'http://gw.test',
      getToken: async () => 'tok',
      WebSocket: Fake,
      fetch: null, // no SSE, no /readyz check: the plain WebSocket rules
      random: () => 0.99999,
    });
    const log = recorder(client);
    try {
      for (let i = 0; i < 3; i++) {
        const ws = await Fake.nth(i, 60_000);
        ws.welcome();
        ws.serverClose(4008, 'heartbeat timeout'); // short-lived: the tiers climb
      }
      const ws = await Fake.nth(3, 60_000);
      ws.welcome();
      await clock.advance(DEFAULT_TIMINGS.stableMs); // the connection counts as stable
      ws.serverClose(4008, 'heartbeat timeout');
      await Fake.nth(4, 60_000);
      assert.deepEqual(log.disconnected.map((d) => d.reconnectInMs), [0, 1999, 4999, 0]);
    } finally {
      client.close();
    }
  });

  test('dropConnection closes the socket with 4000, then reconnects and resubscribes with since', { timeout: 10_000 }, async () => {
    const { Fake, client, got, ws, log } = await subscribed('match:5', 3);
    try {
      ws.events('match:5', 4, 5);
      assert.equal(client.dropConnection('demo button'), true);
      assert.deepEqual(ws.closedByClient, { code: 4000, reason: 'demo button' });
      assert.deepEqual(log.disconnected.map((d) => [d.code, d.reason, d.reconnectInMs]), [[4000, 'demo button', 0]]);
      ws.events('match:5', 6); // late frames of the dropped socket are ignored
      const ws2 = await Fake.nth(1);
      assert.equal(client.dropConnection(), true, 'an attempt not yet welcomed can be dropped too');
      const ws3 = await Fake.nth(2);
      ws3.welcome('S1');
      const resub = await ws3.expect('subscribe');
      assert.deepEqual({ since: resub.since, epoch: resub.epoch }, { since: 5, epoch: 'E1' });
      ws3.serverSend({ op: 'subscribed', room: 'match:5', epoch: 'E1', seq: 6, recovered: true, ref: resub.ref });
      ws3.events('match:5', 6, 7);
      assert.deepEqual(seqs(got), [4, 5, 6, 7]);
      assert.deepEqual(log.recovered.map((r) => r.room), ['match:5']);
      assert.equal(ws2.closedByClient?.code, 4000);
      client.close();
      assert.equal(client.dropConnection(), false, 'nothing to drop after close()');
    } finally {
      client.close();
    }
  });

  test('close codes: 1012/1001 wait the suggested delay or 0-3 s; 4000-4499 back off; 4500-4999 stop (virtual time)', { timeout: 10_000 }, async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    const client = connect({
      clock: clock.option,
      url: 'http://gw.test',
      getToken: async () => 'tok',
      WebSocket: Fake,
      fetch: null, // no SSE, no /readyz check: the plain WebSocket rules
      random: () => 0.5,
    });
    const log = recorder(client);
    try {
      const closes = [
        [1012, 'service restart: reconnect in 3700 ms', 3700],
        [1012, '', 1500], // 0.5 * restartJitterMs
        [1001, 'going away', 1500],
        [1001, 'reconnect in 9 ms', 9],
        [1012, 'reconnect in 600000 ms', 60000], // at most maxHintMs
        [4008, 'heartbeat timeout', 0], // backoff: first tier
        [4009, 'slow consumer', 1000], // second tier, 0.5 * 2000
        [1011, 'internal', 2500], // third tier
      ];
      for (const [i, [code, reason, expected]] of closes.entries()) {
        const ws = await Fake.nth(i, 120_000);
        ws.welcome();
        const before = clock.now();
        ws.serverClose(code, reason);
        const last = log.disconnected.at(-1);
        assert.deepEqual([last.code, last.reason, last.reconnectInMs], [code, reason, expected]);
        const next = await Fake.nth(i + 1, 120_000);
        assert.equal(next.createdAt - before, expected, `${code} ${reason}: reconnected after its delay, to the ms`);
      }
    } finally {
      client.close();
    }

    for (const code of [4500, 4501, 4502, 4503, 4999]) {
      const c2 = new VirtualClock();
      const F = fakeSocketClass(undefined, c2);
      const c = connect({ clock: c2.option, url: 'http://gw.test', getToken: async () => 'tok', WebSocket: F, fetch: null });
      const l = recorder(c);
      const ws = await F.nth(0);
      ws.welcome();
      ws.serverClose(code, 'go away');
      await c2.advance(60 * 60_000); // an hour: no reconnect
      assert.equal(c2.pending, 0, `${code}: no timer left`);
      assert.equal(F.sockets.length, 1, `${code}: the client reconnected`);
      assert.equal(l.connecting.length, 1);
      assert.deepEqual(l.disconnected.map((d) => [d.code, d.reconnectInMs]), [[code, null]]);
      assert.equal(c.state, 'closed');
      await assert.rejects(c.history('r', 0, 1), /not to reconnect/);
      c.close();
    }
  });
});

// ---------------------------------------------------------------------------------------
// Against the real server binary.
// ---------------------------------------------------------------------------------------

describe('livegate.js against a real livegate server', () => {
  let server;
  let data;
  const clients = [];
  const open = (options) => {
    const client = connect({ WebSocket: WebSocketImpl, timings: FAST, ...options });
    clients.push(client);
    return client;
  };

  before(async () => {
    data = tempDir();
    server = await startServer({ dataDir: data.dir });
  });

  after(async () => {
    for (const client of clients) client.close();
    await server?.stop('SIGKILL');
    data?.remove();
  });

  test('subscribe, live events, history, and errors', { timeout: 20_000 }, async (t) => {
    t.diagnostic(`WebSocket implementation: ${WebSocketImpl.name}`);
    const base = server.url;
    const client = open({ url: base, getToken: () => mintToken(base, 'alice', 'web') });
    const log = recorder(client);
    const got = [];
    const connected = nextEvent(client, 'connected');
    const reply = await subscribeRoom(client, 'match:live', (e) => got.push(e));
    assert.equal(reply.room, 'match:live');
    assert.equal(reply.seq, 0);
    const welcome = await connected;
    assert.ok(welcome.session && welcome.node, JSON.stringify(welcome));

    for (let i = 1; i <= 5; i++) await publish(base, 'match:live', { goal: i }, `g-${i}`);
    await publish(base, 'match:live', { goal: 5 }, 'g-5'); // an idempotent retry: no new event
    await waitFor(() => got.length >= 5, '5 live events');
    await letTimePass(300, 'the idempotent retry brings no sixth event');
    assert.deepEqual(seqs(got), [1, 2, 3, 4, 5]);
    assert.deepEqual(got.map((e) => e.data.goal), [1, 2, 3, 4, 5]);

    const page = await client.history('match:live', 2, 10);
    assert.equal(page.room, 'match:live');
    assert.equal(page.epoch, reply.epoch);
    assert.equal(page.head, 5);
    assert.deepEqual(seqs(page.events), [3, 4, 5]);

    // Another user's inbox is forbidden: the subscribe promise rejects, the room is dropped.
    await assert.rejects(subscribeRoom(client, 'user:bob', () => {}), (e) => e.code === 'forbidden');
    assert.equal(client.position('user:bob'), null);
    await assert.rejects(client.history('user:bob', 0, 10), (e) => e.code === 'forbidden');

    // The own inbox, once subscribed, delivers messages exactly once (the automatic
    // inbox subscription does not duplicate them).
    const inbox = [];
    await subscribeRoom(client, 'user:alice', (e) => inbox.push(e));
    await sendMessage(base, 'alice', { hi: 1 }, 'm-1');
    await sendMessage(base, 'alice', { hi: 2 }, 'm-2');
    await waitFor(() => inbox.length >= 2, 'two inbox messages');
    await letTimePass(300, 'no inbox message arrives twice');
    assert.deepEqual(inbox.map((e) => e.data.hi), [1, 2]);

    client.unsubscribe('match:live');
    await publish(base, 'match:live', { goal: 6 }, 'g-6');
    await letTimePass(300, 'nothing arrives after the unsubscribe');
    assert.equal(got.length, 5, 'nothing after unsubscribe');
    assert.equal(log.disconnected.length, 0);
    assert.equal(log.connecting.length, 1);
  });

  test('recovery after the connection is dropped without a close frame', { timeout: 30_000 }, async () => {
    const base = server.url;
    const proxy = await startProxy(server.port);
    let minted = 0;
    const client = open({
      url: proxy.url,
      getToken: async () => {
        minted += 1;
        return mintToken(base, 'dora', 'web');
      },
    });
    const log = recorder(client);
    const got = [];
    try {
      await subscribeRoom(client, 'match:drop', (e) => got.push(e));
      for (let i = 1; i <= 3; i++) await publish(base, 'match:drop', { n: i }, `d-${i}`);
      await waitFor(() => got.length === 3, '3 events before the drop');

      // Hold the reconnect until the missed events are published: the reconnect uses the
      // resume credential (no getToken call), so the proxy keeps it out.
      proxy.hold();
      const lost = nextEvent(client, 'disconnected');
      proxy.dropAll();
      const detail = await lost;
      assert.equal(detail.code, 1006);
      assert.ok(detail.reconnectInMs != null && detail.reconnectInMs <= FAST.backoffMs[0] + 1);

      for (let i = 4; i <= 7; i++) await publish(base, 'match:drop', { n: i }, `d-${i}`);
      const recovered = nextEvent(client, 'recovered');
      proxy.release();
      assert.equal((await recovered).room, 'match:drop');
      await waitFor(() => got.length === 7, 'the 4 missed events');

      await publish(base, 'match:drop', { n: 8 }, 'd-8');
      await waitFor(() => got.length === 8, 'live again');
      await letTimePass(300, 'no event arrives twice');
      assert.deepEqual(seqs(got), range(1, 8));
      assert.deepEqual(got.map((e) => e.data.n), range(1, 8));
      assert.equal(log.connected.length, 2);
      assert.equal(log.connected[1].session, log.connected[0].session, 'the session was kept');
      assert.equal(log.connected[1].resumed, true);
      assert.equal(minted, 1, 'the reconnect used the resume credential, not a token');
      assert.deepEqual(log.connected.map((c) => c.credential), ['token', 'resume']);
      assert.equal(log.recovery_failed.length, 0);
    } finally {
      client.close();
      await proxy.close();
    }
  });

  test('a refused handshake (401) is retried with a fresh token', { timeout: 20_000 }, async () => {
    const base = server.url;
    let calls = 0;
    const client = open({
      url: base,
      transports: ['websocket'], // (auto would take two refusals for a broken upgrade and try SSE)
      getToken: async () => (++calls <= 2 ? 'not-a-token' : mintToken(base, 'hana', 'web')),
    });
    const log = recorder(client);
    const connected = await nextEvent(client, 'connected');
    assert.ok(connected.session);
    assert.equal(calls, 3);
    assert.deepEqual(log.disconnected.map((d) => d.code), [1006, 1006]);
    // The first two backoff tiers (0 and 50 ms in FAST), with jitter.
    assert.ok(log.disconnected[0].reconnectInMs === 0, JSON.stringify(log.disconnected));
    assert.ok(log.disconnected[1].reconnectInMs <= 50, JSON.stringify(log.disconnected));
  });

  test('recovery_failed when history no longer covers what was missed, then live from the head', { timeout: 30_000 }, async () => {
    const small = tempDir();
    const trimmed = await startServer({ dataDir: small.dir, args: ['--history-size', '3'] });
    const proxy = await startProxy(trimmed.port);
    const base = trimmed.url;
    const client = open({ url: proxy.url, getToken: () => mintToken(base, 'ivy', 'web') });
    const log = recorder(client);
    const got = [];
    try {
      await subscribeRoom(client, 'match:trim', (e) => got.push(e));
      await publish(base, 'match:trim', { n: 1 });
      await waitFor(() => got.length === 1, 'the first event');
      proxy.hold(); // the reconnect waits until history has moved on
      const lost = nextEvent(client, 'disconnected');
      proxy.dropAll();
      await lost;
      for (let i = 2; i <= 7; i++) await publish(base, 'match:trim', { n: i }); // history keeps 5..7
      const failed = nextEvent(client, 'recovery_failed');
      proxy.release();
      const detail = await failed;
      assert.equal(detail.room, 'match:trim');
      assert.equal(detail.seq, 7);
      await publish(base, 'match:trim', { n: 8 });
      await waitFor(() => got.length === 2, 'live after the failed recovery');
      await letTimePass(300, 'nothing is replayed');
      assert.deepEqual(seqs(got), [1, 8], 'nothing replayed, nothing twice: the app reloads over HTTP');
      assert.equal(log.recovered.length, 0);
      assert.deepEqual(client.position('match:trim').seq, 8);
    } finally {
      client.close();
      await proxy.close();
      await trimmed.stop('SIGKILL');
      small.remove();
    }
  });

  test('no reconnect after 4501: replaced by a newer connection of the same user and device', { timeout: 20_000 }, async () => {
    const base = server.url;
    let firstTokens = 0;
    const first = open({ url: base, getToken: () => (firstTokens++, mintToken(base, 'pat', 'phone')) });
    const firstLog = recorder(first);
    await nextEvent(first, 'connected');

    const second = open({ url: base, getToken: () => mintToken(base, 'pat', 'phone') });
    const secondLog = recorder(second);
    const replaced = nextEvent(first, 'disconnected');
    await nextEvent(second, 'connected');
    const detail = await replaced;
    assert.equal(detail.code, 4501, JSON.stringify(detail));
    assert.equal(detail.reconnectInMs, null);

    await letTimePass(1000, 'many times the injected backoff tiers: no reconnect');
    assert.equal(first.state, 'closed');
    assert.equal(firstTokens, 1, 'the replaced client asked for no new token');
    assert.equal(firstLog.connecting.length, 1);
    assert.equal(second.state, 'connected');
    assert.equal(secondLog.disconnected.length, 0, 'the newer connection was not replaced back');
    const got = [];
    await subscribeRoom(second, 'match:phone', (e) => got.push(e));
    await publish(base, 'match:phone', { ok: true });
    await waitFor(() => got.length === 1, 'an event on the surviving connection');
  });

  test('no reconnect after 4502: kicked by an operator', { timeout: 20_000 }, async () => {
    const base = server.url;
    let tokens = 0;
    const client = open({ url: base, getToken: () => (tokens++, mintToken(base, 'kim', 'web')) });
    const log = recorder(client);
    await nextEvent(client, 'connected');
    const kicked = nextEvent(client, 'disconnected');
    const { body } = await api(base, 'DELETE', '/v1/users/kim/connections');
    assert.deepEqual(body, { closed: 1 });
    const detail = await kicked;
    assert.equal(detail.code, 4502, JSON.stringify(detail));
    await letTimePass(1000, 'many times the backoff: a kicked client does not reconnect');
    assert.equal(client.state, 'closed');
    assert.equal(tokens, 1);
    assert.equal(log.connecting.length, 1);
  });
});

describe('livegate.js across a server restart', () => {
  test('after a drain (1012) and a restart on the same data dir and port, exactly the missed events, then live', { timeout: 60_000 }, async () => {
    const data = tempDir();
    let server = await startServer({ dataDir: data.dir });
    const port = server.port;
    const base = server.url;
    // The client goes through a proxy that keeps its reconnect out until the missed events
    // are published (the reconnect uses its resume credential: no getToken call to hold).
    const proxy = await startProxy(port);
    let minted = 0;
    const client = connect({
      url: proxy.url,
      WebSocket: WebSocketImpl,
      timings: FAST,
      getToken: async () => {
        minted += 1;
        return mintToken(base, 'rita', 'web');
      },
    });
    const log = recorder(client);
    const got = [];
    const inbox = [];
    try {
      const first = await subscribeRoom(client, 'match:restart', (e) => got.push(e));
      await subscribeRoom(client, 'user:rita', (e) => inbox.push(e));
      for (let i = 1; i <= 3; i++) await publish(base, 'match:restart', { n: i }, `r-${i}`);
      await sendMessage(base, 'rita', { m: 1 }, 'm-1');
      await waitFor(() => got.length === 3 && inbox.length === 1, 'the events before the restart');

      proxy.hold(); // the reconnect waits until the missed events are published
      const drained = nextEvent(client, 'disconnected');
      const stopping = server.stop('SIGTERM');
      const detail = await drained;
      assert.equal(detail.code, 1012, JSON.stringify(detail));
      const suggested = /reconnect in (\d+) ms/.exec(detail.reason);
      assert.ok(suggested, `the close reason suggests a delay: ${JSON.stringify(detail.reason)}`);
      assert.equal(detail.reconnectInMs, Number(suggested[1]));
      assert.ok(detail.reconnectInMs <= 1000, 'within drain_spread (1 s)');
      assert.deepEqual(await stopping, { code: 0, signal: null }, 'the drained server exits 0');

      server = await startServerOnPort({ dataDir: data.dir, port });
      for (let i = 4; i <= 6; i++) await publish(base, 'match:restart', { n: i }, `r-${i}`);
      await sendMessage(base, 'rita', { m: 2 }, 'm-2');
      const recovered = [];
      client.on('recovered', (r) => recovered.push(r.room));
      proxy.release();

      await waitFor(() => got.length === 6 && inbox.length === 2, 'exactly the missed events', 15_000);
      for (let i = 7; i <= 8; i++) await publish(base, 'match:restart', { n: i }, `r-${i}`);
      await sendMessage(base, 'rita', { m: 3 }, 'm-3');
      await waitFor(() => got.length === 8 && inbox.length === 3, 'live events after the restart');
      await letTimePass(400, 'no event arrives twice');

      assert.deepEqual(seqs(got), range(1, 8));
      assert.deepEqual(got.map((e) => e.data.n), range(1, 8));
      assert.deepEqual(inbox.map((e) => e.data.m), [1, 2, 3]);
      assert.deepEqual(recovered.sort(), ['match:restart', 'user:rita']);
      assert.equal(log.recovery_failed.length, 0);
      assert.equal(log.connected.length, 2);
      assert.equal(log.connected[1].session, log.connected[0].session, 'the session survives the restart');
      assert.equal(minted, 1, 'the reconnect used the resume credential');
      const position = client.position('match:restart');
      assert.deepEqual(position, { epoch: first.epoch, seq: 8 }, 'same epoch after the restart');

      const page = await client.history('match:restart', 0, 100);
      assert.deepEqual(seqs(page.events), range(1, 8));
    } finally {
      client.close();
      await proxy.close();
      await server.stop('SIGKILL');
      data.remove();
    }
  });
});
