// livegate.js's room state and presence (issue 19) against the real server.
//
// NEEDS THE SERVER SIDE: these tests fail (they do not skip) on a binary without room
// state (`"state"` on a publish, GET/PUT /v1/rooms/{room}/state, subscribe `state:true`)
// and presence (GET /v1/rooms/{room}/presence, op `presence`, subscribe `presence:true`),
// which land on the `state` and `presence` branches. Each test first asks the server for
// its endpoint and fails with a message saying which branch is missing.
//
// - A subscriber with state:true after 50 events (the state last set by event 40) gets
//   onState at S = 40 and exactly the events 41..50, then live; over SSE the same.
// - A reconnect whose recovery fails (history trimmed to 10 while the client was away)
//   brings the state again and the events after it: no recovery_failed, no reload.
// - Presence: 3 clients with presence:true count 3; a fourth user's two tabs (same user
//   and device) count once; presence() and GET /v1/rooms/{room}/presence agree, and
//   onPresence hears the count change.
// Run: `LIVEGATE_BIN=... node --test tests/js/state_presence.test.mjs`.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { connect } from '../../clients/js/livegate.js';
import { API_KEY, WebSocketImpl, api, metric, mintToken, startProxy, startServer, tempDir, waitFor } from './support/server.mjs';
import { REAL_SERVER_TIMINGS, recorder, subscribed } from './support/clients.mjs';

const FAST = REAL_SERVER_TIMINGS;
const range = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

/** Fails (never skips) with a clear message when the binary lacks `path`'s endpoint. */
async function requireEndpoint(base, path, branch) {
  const response = await fetch(base + path, { headers: { Authorization: `Bearer ${API_KEY}` }, signal: AbortSignal.timeout(10_000) });
  const text = await response.text();
  assert.equal(
    response.status,
    200,
    `GET ${path} answered ${response.status} ${text}: this binary has no ${branch}; these tests need the "${branch}" branch merged (issue 19)`,
  );
  return JSON.parse(text);
}

/** Publishes event `n` to `room` (id `room-n`), with `state` when given. */
async function publishEvent(base, room, n, state) {
  const body = { id: `${room}-${n}`, data: { n } };
  if (state !== undefined) body.state = state;
  const { body: reply } = await api(base, 'POST', `/v1/rooms/${encodeURIComponent(room)}/events`, body);
  assert.equal(reply.seq, n, `publish ${n} to ${room}: ${JSON.stringify(reply)}`);
  return reply;
}

/** A client of `base` whose handlers record `['state', data, meta]` and `['event', seq]`. */
function stateClient(url, base, user, extra = {}) {
  const client = connect({ url, WebSocket: WebSocketImpl, timings: FAST, getToken: () => mintToken(base, user), ...extra });
  const timeline = [];
  const subscribe = (room) =>
    subscribed(client, room, (event) => timeline.push(['event', event.seq]), {
      state: true,
      onState: (data, meta) => timeline.push(['state', data, meta]),
    });
  return { client, timeline, subscribe, log: recorder(client) };
}

const eventsOf = (timeline) => timeline.filter((e) => e[0] === 'event').map((e) => e[1]);

describe('room state against a real server (needs the state branch)', () => {
  let server;
  before(async () => {
    server = await startServer({ dataDir: tempDir().dir });
  });
  after(async () => {
    await server?.stop();
  });

  for (const transport of ['websocket', 'sse']) {
    test(`${transport}: after 50 events the subscriber gets the state at S, then exactly the events after S, then live`, { timeout: 30_000 }, async () => {
      const base = server.url;
      const room = `score:${transport}`;
      const none = await requireEndpoint(base, `/v1/rooms/${room}/state`, 'state');
      assert.deepEqual({ seq: none.seq, data: none.data }, { seq: 0, data: null }, 'no state yet');
      // Events 1..40 each carry the state; 41..50 do not, so the state stays at 40.
      for (const n of range(1, 50)) await publishEvent(base, room, n, n <= 40 ? { score: [n, 0], at: n } : undefined);
      const stored = await requireEndpoint(base, `/v1/rooms/${room}/state`, 'state');
      assert.deepEqual({ seq: stored.seq, data: stored.data }, { seq: 40, data: { score: [40, 0], at: 40 } });

      const { client, timeline, subscribe, log } = stateClient(base, base, `state-${transport}`, { transports: [transport] });
      try {
        const reply = await subscribe(room);
        assert.equal(reply.seq, 50, 'the reply has the head');
        assert.deepEqual(reply.state, { seq: 40, data: { score: [40, 0], at: 40 } });
        await waitFor(() => eventsOf(timeline).length >= 10, 'the events after S');
        await publishEvent(base, room, 51, { score: [40, 1], at: 51 });
        await waitFor(() => eventsOf(timeline).length >= 11, 'the live event');
        assert.deepEqual(timeline[0], ['state', { score: [40, 0], at: 40 }, { room, seq: 40, epoch: stored.epoch }], 'onState first');
        assert.deepEqual(eventsOf(timeline), range(41, 51), 'exactly the events after S, once each, in order');
        assert.equal(timeline.filter((e) => e[0] === 'state').length, 1);
        assert.deepEqual(log.recovery_failed, []);
      } finally {
        client.close();
      }
    });
  }

  test('PUT state sets it as of the head: a new subscriber gets it and no replay', { timeout: 30_000 }, async () => {
    const base = server.url;
    const room = 'score:put';
    for (const n of range(1, 5)) await publishEvent(base, room, n);
    await requireEndpoint(base, `/v1/rooms/${room}/state`, 'state');
    const { body: put } = await api(base, 'PUT', `/v1/rooms/${room}/state`, { data: { status: 'half-time' } });
    assert.equal(put.seq, 5);
    const { client, timeline, subscribe } = stateClient(base, base, 'state-put');
    try {
      const reply = await subscribe(room);
      assert.deepEqual(reply.state, { seq: 5, data: { status: 'half-time' } });
      await publishEvent(base, room, 6);
      await waitFor(() => eventsOf(timeline).length >= 1, 'the live event');
      assert.deepEqual(timeline, [['state', { status: 'half-time' }, { room, seq: 5, epoch: put.epoch }], ['event', 6]]);
    } finally {
      client.close();
    }
  });
});

describe('a failed recovery brings the state again (needs the state branch)', () => {
  let server;
  let proxy;
  before(async () => {
    server = await startServer({ dataDir: tempDir().dir, args: ['--history-size', '10'] });
    proxy = await startProxy(server.port);
  });
  after(async () => {
    await proxy?.close();
    await server?.stop();
  });

  test('history trimmed while the client was away: onState again at the new S and the events after it, no recovery_failed', { timeout: 40_000 }, async () => {
    const base = server.url;
    const room = 'score:away';
    await requireEndpoint(base, `/v1/rooms/${room}/state`, 'state');
    for (const n of range(1, 5)) await publishEvent(base, room, n, { at: n });
    let tokens = 0;
    const { client, timeline, subscribe, log } = stateClient(proxy.url, base, 'state-away', {
      getToken: () => {
        tokens += 1;
        return mintToken(base, 'state-away');
      },
    });
    try {
      await subscribe(room);
      assert.deepEqual(timeline, [['state', { at: 5 }, { room, seq: 5, epoch: timeline[0]?.[2]?.epoch }]]);
      const epoch = timeline[0][2].epoch;

      // The client is cut off; 30 events happen (state on 6..30, none on 31..35); the
      // room keeps only the last 10, so `since` 5 cannot be replayed.
      proxy.hold();
      proxy.dropAll();
      await waitFor(() => client.state !== 'connected', 'the client noticed the drop');
      for (const n of range(6, 35)) await publishEvent(base, room, n, n <= 30 ? { at: n } : undefined);
      proxy.release();

      await waitFor(() => eventsOf(timeline).length >= 5 && client.state === 'connected', 'the state again and the events after it', 20_000);
      assert.deepEqual(timeline.slice(1), [['state', { at: 30 }, { room, seq: 30, epoch }], ...range(31, 35).map((n) => ['event', n])]);
      assert.deepEqual(log.recovery_failed, [], 'the state stood in for the replay');
      assert.ok(log.recovered.some((r) => r.room === room && r.state === true && r.seq === 30), JSON.stringify(log.recovered));
      assert.equal(tokens, 1, 'the reconnect used the resume credential: nothing asked of the backend');
    } finally {
      client.close();
    }
  });
});

describe('presence against a real server (needs the presence branch)', () => {
  let server;
  before(async () => {
    server = await startServer({ dataDir: tempDir().dir });
  });
  after(async () => {
    await server?.stop();
  });

  test('3 clients count 3; two tabs of one user and device count once; presence(), GET and onPresence agree', { timeout: 40_000 }, async () => {
    const base = server.url;
    const room = 'lobby:js';
    const empty = await requireEndpoint(base, `/v1/rooms/${room}/presence`, 'presence');
    assert.equal(empty.count, 0);
    const clients = [];
    const heard = [];
    const open = (user, device = 'web') => {
      const client = connect({ url: base, WebSocket: WebSocketImpl, timings: FAST, getToken: () => mintToken(base, user, device) });
      clients.push(client);
      return client;
    };
    try {
      const watcher = open('ann');
      await subscribed(watcher, room, () => {}, { presence: true, onPresence: (detail) => heard.push(detail) });
      for (const user of ['bob', 'cy']) await subscribed(open(user), room, () => {}, { presence: true });
      const members3 = [['ann', 'web'], ['bob', 'web'], ['cy', 'web']];
      const get = async () => (await api(base, 'GET', `/v1/rooms/${room}/presence`)).body;
      const sorted = (members) => (members ?? []).map((m) => [m.user, m.device]).sort();

      await waitFor(async () => (await get()).count === 3, 'GET presence counting 3');
      const three = await get();
      assert.deepEqual(sorted(three.members), members3);
      const asked = await watcher.presence(room);
      assert.equal(asked.room, room);
      assert.equal(asked.count, 3);
      assert.deepEqual(sorted(asked.members), members3);
      await waitFor(() => heard.at(-1)?.count === 3, 'onPresence hearing 3', 10_000);

      // Two tabs of dee on the same device: one member.
      await subscribed(open('dee'), room, () => {});
      await subscribed(open('dee'), room, () => {});
      await waitFor(async () => (await get()).count === 4, 'GET presence counting 4');
      const four = await watcher.presence(room);
      assert.equal(four.count, 4, 'two tabs of dee/web count once');
      assert.deepEqual(sorted(four.members), [...members3, ['dee', 'web']].sort());
      await waitFor(() => heard.at(-1)?.count === 4, 'onPresence hearing 4', 10_000);
      const joined = heard.flatMap((d) => d.joined ?? []).map((m) => m.user);
      assert.ok(joined.includes('dee'), `dee joined in a presence frame: ${JSON.stringify(heard)}`);

      // One tab closes: dee is still there. Both closed: dee left.
      const connections = await metric(base, 'livegate_connections_open');
      clients.at(-1).close();
      await waitFor(async () => (await metric(base, 'livegate_connections_open')) === connections - 1, 'the closed tab gone from the server');
      assert.equal((await watcher.presence(room)).count, 4, 'the other tab keeps dee present');
      clients.at(-2).close();
      await waitFor(async () => (await watcher.presence(room)).count === 3, 'dee gone with both tabs');
      await waitFor(() => heard.some((d) => (d.left ?? []).some((m) => m.user === 'dee')), 'onPresence hearing dee leave', 10_000);

      // Over SSE: presence() is refused by the client itself.
      const sse = connect({ url: base, transports: ['sse'], timings: FAST, getToken: () => mintToken(base, 'eve') });
      clients.push(sse);
      await subscribed(sse, room, () => {}, { presence: true });
      await assert.rejects(sse.presence(room), (error) => error.code === 'unsupported');
    } finally {
      for (const client of clients) client.close();
    }
  });
});
