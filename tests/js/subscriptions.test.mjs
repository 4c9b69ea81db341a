// Subscription objects (issue 34): `client.subscribe(room, {since, state, presence})`
// returns a Subscription with its own states, events and unsubscribe(); several of them
// share one server subscription and each gets what it asked for; a room holds back a
// bounded number of events (one more and it resubscribes with `since`; the application
// still sees every event once and in order), over WebSocket and over SSE. Scripted socket
// and scripted fetch, virtual time.
// Run from the repository root: `node --test tests/js/`.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { connect } from '../../clients/js/livegate.js';
import { MAX_HELD_EVENTS } from '../../clients/js/livegate/feed.js';
import { fakeFetch } from './support/fake-fetch.mjs';
import { fakeSocketClass } from './support/fake-socket.mjs';
import { recorder } from './support/clients.mjs';
import { VirtualClock } from './support/virtual-clock.mjs';

const seqs = (events) => events.map((e) => e.seq);
/** The whole numbers from `from` to `to`, both included. */
const range = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => from + i);
/** An SSE `events` message's data: `room`'s events of `list` (seqs). */
const sseEvents = (room, list) => ({ op: 'events', events: list.map((seq) => ({ room, seq, id: `${room}-${seq}`, ts_ms: 1, data: { n: seq } })) });

/** A client on the scripted fetch (SSE only) and a virtual clock, not yet connected. */
function streamingClient() {
  const clock = new VirtualClock();
  const fetch = fakeFetch({ clock });
  const client = connect({ clock: clock.option, url: 'https://gw.test', getToken: async () => 't1', transports: ['sse'], fetch, random: () => 0 });
  const log = recorder(client);
  return { clock, fetch, client, log };
}

/** A client on a scripted socket and a virtual clock, welcomed. */
async function welcomed() {
  const clock = new VirtualClock();
  const Fake = fakeSocketClass(undefined, clock);
  const client = connect({ clock: clock.option, url: 'http://gw.test', getToken: async () => 'tok', WebSocket: Fake, fetch: null, random: () => 0 });
  const log = recorder(client);
  const ws = await Fake.nth(0);
  ws.welcome('S1');
  return { clock, Fake, client, log, ws };
}

/** Everything a subscription tells, in order: [name, detail]. */
function listen(sub) {
  const heard = [];
  for (const name of ['event', 'state', 'presence', 'subscribing', 'subscribed', 'unsubscribed', 'recovered', 'recovery_failed', 'error']) {
    sub.on(name, (detail) => heard.push([name, detail]));
  }
  heard.events = () => heard.filter(([name]) => name === 'event').map(([, e]) => e.seq);
  return heard;
}

describe('Subscription objects', () => {
  test('states and events of a subscription; two share one server subscription; each unsubscribes only itself', async () => {
    const { client, ws } = await welcomed();
    try {
      const a = client.subscribe('r');
      assert.equal(a.state, 'subscribing');
      const heardA = listen(a);
      const sub = await ws.expect('subscribe');
      ws.serverSend({ op: 'subscribed', room: 'r', epoch: 'E', seq: 4, ref: sub.ref });
      assert.equal(a.state, 'subscribed');
      assert.deepEqual(await a.ready(), { room: 'r', epoch: 'E', seq: 4, recovered: undefined });
      ws.events('r', 5);

      const b = client.subscribe('r');
      const heardB = listen(b);
      await b.ready();
      assert.equal(b.state, 'subscribed');
      ws.events('r', 6, 7);
      assert.deepEqual(heardA.events(), [5, 6, 7]);
      assert.deepEqual(heardB.events(), [6, 7], 'from the room\'s position on');
      assert.equal(ws.frames('subscribe').length, 1, 'one server subscription');

      a.unsubscribe();
      assert.equal(a.state, 'unsubscribed');
      assert.deepEqual(heardA.at(-1), ['unsubscribed', { room: 'r', code: 'unsubscribed', reason: 'unsubscribed from r' }]);
      ws.events('r', 8);
      assert.deepEqual(heardA.events(), [5, 6, 7], 'nothing after its own unsubscribe');
      assert.deepEqual(heardB.events(), [6, 7, 8]);
      assert.equal(ws.frames('unsubscribe').length, 0, 'the room still has a subscription');
      b.unsubscribe();
      assert.deepEqual(ws.frames('unsubscribe').map((f) => f.room), ['r'], 'the last one ends the server subscription');
      assert.equal(client.position('r'), null);
    } finally {
      client.close();
    }
  });

  test('a lost connection: subscribing, then subscribed again with since; close() ends it', async () => {
    const { Fake, client, ws } = await welcomed();
    const a = client.subscribe('r');
    const heard = listen(a);
    try {
      const sub = await ws.expect('subscribe');
      ws.serverSend({ op: 'subscribed', room: 'r', epoch: 'E', seq: 1, ref: sub.ref });
      ws.events('r', 2);
      ws.serverClose(1006);
      assert.equal(a.state, 'subscribing');
      const ws1 = await Fake.nth(1, 10_000);
      ws1.welcome('S1');
      const again = await ws1.expect('subscribe');
      assert.deepEqual([again.since, again.epoch], [2, 'E']);
      ws1.serverSend({ op: 'subscribed', room: 'r', epoch: 'E', seq: 3, recovered: true, ref: again.ref });
      ws1.events('r', 3);
      assert.deepEqual(heard.filter(([n]) => n !== 'event').map(([n]) => n), ['subscribed', 'subscribing', 'subscribed', 'recovered']);
      assert.deepEqual(heard.events(), [2, 3]);
    } finally {
      client.close();
    }
    assert.equal(a.state, 'unsubscribed');
    assert.equal(heard.at(-1)[1].code, 'closed');
  });

  test('each gets what it asked for: presence added later, from the same position', async () => {
    const { client, ws } = await welcomed();
    try {
      const plain = listen(client.subscribe('lobby'));
      const first = await ws.expect('subscribe');
      assert.equal(first.presence, undefined);
      ws.serverSend({ op: 'subscribed', room: 'lobby', epoch: 'E', seq: 0, ref: first.ref });
      ws.events('lobby', 1, 2);

      const watching = listen(client.subscribe('lobby', { presence: true }));
      const second = await ws.expect('subscribe', (f) => f.ref !== first.ref);
      assert.deepEqual([second.presence, second.since, second.epoch], [true, 2, 'E'], 'asked again from where the room is: nothing lost');
      ws.serverSend({ op: 'subscribed', room: 'lobby', epoch: 'E', seq: 2, recovered: true, ref: second.ref });
      ws.serverSend({ op: 'presence', room: 'lobby', count: 2, joined: [], left: [] });
      ws.events('lobby', 3);
      assert.deepEqual(plain.filter(([n]) => n === 'presence'), [], 'it did not ask for presence');
      assert.deepEqual(watching.filter(([n]) => n === 'presence').map(([, d]) => d.count), [2]);
      assert.deepEqual(plain.events(), [1, 2, 3]);
      assert.deepEqual(watching.events(), [3]);
    } finally {
      client.close();
    }
  });

  test('a later subscription with state: the room starts from the state, the others get what it stands for as events', async () => {
    const { client, ws } = await welcomed();
    try {
      const plain = listen(client.subscribe('m'));
      const first = await ws.expect('subscribe');
      ws.serverSend({ op: 'subscribed', room: 'm', epoch: 'E', seq: 2, ref: first.ref });
      ws.events('m', 3);

      const stateful = listen(client.subscribe('m', { state: true }));
      const second = await ws.expect('subscribe', (f) => f.ref !== first.ref);
      assert.deepEqual([second.state, second.since], [true, undefined], 'no since: the reply carries the state');
      ws.serverSend({ op: 'subscribed', room: 'm', epoch: 'E', seq: 6, ref: second.ref, state: { seq: 6, data: { score: 6 } } });
      // The plain subscription is owed 4..6: the client reads them with history.
      const history = await ws.expect('history');
      assert.deepEqual([history.room, history.since, history.limit], ['m', 3, 3]);
      ws.events('m', 7); // live, held back until the history is in
      ws.serverSend({ op: 'history', ref: history.ref, room: 'm', epoch: 'E', head: 7, complete: true, events: [4, 5, 6].map((seq) => ({ room: 'm', seq, id: `e-${seq}`, ts_ms: 1, data: { n: seq } })) });
      await Promise.resolve();
      assert.deepEqual(plain.events(), [3, 4, 5, 6, 7]);
      assert.deepEqual(stateful.filter(([n]) => n === 'state').map(([, d]) => [d.seq, d.data]), [[6, { score: 6 }]]);
      assert.deepEqual(stateful.events(), [7], 'only the events after its state');
      assert.deepEqual(plain.filter(([n]) => n === 'state'), []);
    } finally {
      client.close();
    }
  });

  test('a later subscription with an earlier since: the server replays, each gets only what it had not', async () => {
    const { client, ws } = await welcomed();
    try {
      const early = listen(client.subscribe('h'));
      const first = await ws.expect('subscribe');
      ws.serverSend({ op: 'subscribed', room: 'h', epoch: 'E', seq: 2, ref: first.ref });
      ws.events('h', 3, 4, 5);
      const late = listen(client.subscribe('h', { since: 3 }));
      const second = await ws.expect('subscribe', (f) => f.ref !== first.ref);
      assert.deepEqual([second.since, second.epoch], [3, 'E']);
      ws.serverSend({ op: 'subscribed', room: 'h', epoch: 'E', seq: 5, recovered: true, ref: second.ref });
      ws.events('h', 4, 5, 6);
      assert.deepEqual(early.events(), [3, 4, 5, 6]);
      assert.deepEqual(late.events(), [4, 5, 6]);
    } finally {
      client.close();
    }
  });

  test(`a room holds back at most ${MAX_HELD_EVENTS} events: then it subscribes again from its last delivered seq`, async () => {
    const { client, ws } = await welcomed();
    try {
      const heard = listen(client.subscribe('busy', { since: 10, epoch: 'E' }));
      const first = await ws.expect('subscribe');
      // The reply is slow; the live stream is not.
      for (let seq = 11; seq <= 11 + MAX_HELD_EVENTS; seq++) ws.events('busy', seq);
      const second = await ws.expect('subscribe', (f) => f.ref !== first.ref);
      assert.deepEqual([second.since, second.epoch], [10, 'E'], 'from the last delivered seq, nothing held any more');
      ws.serverSend({ op: 'subscribed', room: 'busy', epoch: 'E', seq: 10, recovered: true, ref: first.ref }); // superseded: ignored
      const last = 11 + MAX_HELD_EVENTS;
      ws.serverSend({ op: 'subscribed', room: 'busy', epoch: 'E', seq: last, recovered: true, ref: second.ref });
      ws.events('busy', ...range(11, last)); // the replay
      ws.events('busy', last - 1, last, last + 1); // the live stream, overlapping it
      assert.deepEqual(heard.events(), range(11, last + 1), 'every event once, in order');
    } finally {
      client.close();
    }
  });
});

describe('the bound on held events', () => {
  test(`more than ${MAX_HELD_EVENTS} events while a gap is filled: the room resubscribes with since, each event once and in order`, async () => {
    const { client, ws } = await welcomed();
    try {
      const heard = listen(client.subscribe('busy', { since: 10, epoch: 'E' }));
      const first = await ws.expect('subscribe');
      ws.serverSend({ op: 'subscribed', room: 'busy', epoch: 'E', seq: 10, recovered: true, ref: first.ref });
      ws.events('busy', 11, 13); // 12 is missing: a history request fills the gap
      const history = await ws.expect('history');
      assert.deepEqual([history.room, history.since, history.limit], ['busy', 11, 1]);
      // The history reply is slow; the live stream is not.
      const last = 13 + MAX_HELD_EVENTS;
      ws.events('busy', ...range(14, last));
      const second = await ws.expect('subscribe', (f) => f.ref !== first.ref);
      assert.deepEqual([second.since, second.epoch], [11, 'E'], 'from the last delivered seq');
      ws.serverSend({ op: 'history', ref: history.ref, room: 'busy', epoch: 'E', head: last, events: [{ room: 'busy', seq: 12, id: 'e-12', ts_ms: 1, data: {} }], complete: true }); // given up: ignored
      ws.serverSend({ op: 'subscribed', room: 'busy', epoch: 'E', seq: last, recovered: true, ref: second.ref });
      ws.events('busy', ...range(12, last));
      ws.events('busy', last + 1);
      assert.deepEqual(heard.events(), range(11, last + 1), 'every event once, in order');
    } finally {
      client.close();
    }
  });

  test(`over SSE, more than ${MAX_HELD_EVENTS} events before a room's subscribed: the stream reopens from its position, each event once and in order`, async () => {
    const { clock, fetch, client } = streamingClient();
    try {
      const heard = listen(client.subscribe('busy', { since: 10, epoch: 'E' }));
      const sse = await fetch.nth(0);
      assert.deepEqual([sse.params.rooms, sse.params.since], ['busy', 'busy:E:10']);
      sse.open();
      sse.welcome('S1', { resume: 'R1', resume_expires_at_ms: clock.now() + 600_000 });
      const last = 11 + MAX_HELD_EVENTS;
      sse.message('events', sseEvents('busy', range(11, last)), `busy:E:${last}`); // before its subscribed
      const again = await fetch.nth(1);
      assert.deepEqual([again.params.rooms, again.params.since, again.params.resume], ['busy', 'busy:E:10', 'R1'], 'from the last delivered seq, not the stream id');
      assert.equal(heard.events().length, 0);
      again.open();
      again.welcome('S1', { resume: 'R2', resume_expires_at_ms: clock.now() + 600_000 });
      again.message('subscribed', { op: 'subscribed', room: 'busy', epoch: 'E', seq: last, recovered: true });
      again.message('events', sseEvents('busy', range(11, last + 1)), `busy:E:${last + 1}`);
      await clock.until(() => heard.events().length >= last + 1 - 10, 'the replay delivered', 1000);
      assert.deepEqual(heard.events(), range(11, last + 1), 'every event once, in order');
    } finally {
      client.close();
    }
  });
});

describe('Subscription objects over SSE', () => {
  test('two share the stream\'s one subscription; each unsubscribes only itself; state and presence asked by a later one are honoured', async () => {
    const { clock, fetch, client } = streamingClient();
    try {
      const a = client.subscribe('r');
      const heardA = listen(a);
      const sse = await fetch.nth(0);
      assert.deepEqual(sse.params, { token: 't1', rooms: 'r' });
      sse.open();
      sse.welcome('S1', { resume: 'R1', resume_expires_at_ms: clock.now() + 600_000 });
      sse.message('subscribed', { op: 'subscribed', room: 'r', epoch: 'E', seq: 4 });
      sse.message('events', sseEvents('r', [5]), 'r:E:5');
      await clock.until(() => heardA.events().length === 1, 'a first event');

      const b = client.subscribe('r');
      const heardB = listen(b);
      await clock.until(() => b.state === 'subscribed', 'b subscribed');
      await clock.advance(1000);
      assert.equal(fetch.streams.length, 1, 'the same rooms, nothing more asked: the stream is not reopened');
      sse.message('events', sseEvents('r', [6, 7]), 'r:E:7');
      await clock.until(() => heardB.events().length === 2, 'events to both');
      assert.deepEqual([heardA.events(), heardB.events()], [[5, 6, 7], [6, 7]]);

      a.unsubscribe();
      assert.equal(a.state, 'unsubscribed');
      await clock.advance(1000);
      assert.equal(fetch.streams.length, 1, 'the room keeps its other subscription');
      sse.message('events', sseEvents('r', [8]), 'r:E:8');
      await clock.until(() => heardB.events().length === 3, 'b goes on');
      assert.deepEqual(heardA.events(), [5, 6, 7], 'nothing after its own unsubscribe');

      // A later subscription asks for the room's state and presence: the stream reopens asking for both.
      const c = client.subscribe('r', { state: true, presence: true });
      const heardC = listen(c);
      const reopened = await fetch.nth(1);
      assert.equal(reopened.params.rooms, 'r');
      assert.deepEqual([reopened.params.state, reopened.params.presence, reopened.params.resume], ['1', '1', 'R1']);
      reopened.open();
      reopened.welcome('S1', { resume: 'R2', resume_expires_at_ms: clock.now() + 600_000 });
      reopened.message('subscribed', { op: 'subscribed', room: 'r', epoch: 'E', seq: 9, state: { seq: 7, data: { n: 7 } } });
      reopened.message('events', sseEvents('r', [8, 9]), 'r:E:9');
      reopened.message('presence', { op: 'presence', room: 'r', count: 1, joined: [{ user: 'u', device: 'web' }], left: [] });
      await clock.until(() => heardC.some(([name]) => name === 'presence'), 'presence to c');
      assert.deepEqual(heardC.filter(([name]) => name === 'state').map(([, s]) => [s.seq, s.data]), [[7, { n: 7 }]]);
      assert.deepEqual(heardC.events(), [8, 9], 'the events after its state');
      assert.deepEqual(heardB.events(), [6, 7, 8, 9], 'b: each event once, its state not asked');
      assert.equal(heardB.some(([name]) => name === 'state' || name === 'presence'), false, 'b asked for neither');

      c.unsubscribe();
      b.unsubscribe();
      await clock.until(() => fetch.streams.length === 3, 'the stream reopened without the room');
      assert.equal(fetch.streams[2].params.rooms, '');
    } finally {
      client.close();
    }
  });
});

describe('refusals over SSE', () => {
  test('an error frame naming a room of the stream (no ref) reaches that room: forbidden ends it, unavailable reopens the stream', async () => {
    const { clock, fetch, client, log } = streamingClient();
    try {
      const a = client.subscribe('a');
      const b = client.subscribe('b');
      const c = client.subscribe('c');
      const sse = await fetch.nth(0);
      assert.equal(sse.params.rooms, 'a,b,c');
      sse.open();
      sse.welcome('S1', { resume: 'R1', resume_expires_at_ms: clock.now() + 600_000 });
      sse.message('subscribed', { op: 'subscribed', room: 'a', epoch: 'E', seq: 0 });
      sse.message('error', { op: 'error', room: 'b', code: 'forbidden', message: 'a b c' });
      sse.message('error', { op: 'error', room: 'c', code: 'unavailable', message: 'a b c' });
      await assert.rejects(b.ready(), (e) => e.code === 'forbidden');
      assert.deepEqual([a.state, b.state, c.state], ['subscribed', 'unsubscribed', 'subscribing']);
      assert.deepEqual(log.error.map((e) => [e.room, e.code]), [['b', 'forbidden'], ['c', 'unavailable']]);
      const again = await fetch.nth(1);
      assert.equal(again.params.rooms, 'a,c', 'c asked again, b not');
      assert.ok(again.createdAt - sse.createdAt >= 1000, 'after resubscribeMs');
    } finally {
      client.close();
    }
  });
});

describe('protocol features from welcome', () => {
  test('a server whose welcome lists no state or presence is never asked for them; one without the list is', async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    const client = connect({ clock: clock.option, url: 'http://gw.test', getToken: async () => 'tok', WebSocket: Fake, fetch: null, random: () => 0 });
    const log = recorder(client);
    try {
      const ws = await Fake.nth(0);
      ws.welcome('S1', { features: ['publish'] });
      const heard = listen(client.subscribe('m', { state: true, presence: true }));
      const sub = await ws.expect('subscribe');
      assert.deepEqual([sub.state, sub.presence], [undefined, undefined], 'not asked: the welcome did not list them');
      assert.deepEqual(log.error.map((e) => [e.room, e.code]), [['m', 'unsupported'], ['m', 'unsupported']]);
      assert.deepEqual(heard.filter(([n]) => n === 'error').map(([, e]) => e.code), ['unsupported', 'unsupported']);
      await assert.rejects(client.presence('m'), (e) => e.code === 'unsupported');
      assert.equal(ws.frames('presence').length, 0);

      // A server before `features` (no list) is asked, and answers for itself.
      ws.serverClose(1012, 'reconnect in 0 ms');
      const ws1 = await Fake.nth(1, 10_000);
      ws1.welcome('S1');
      const heardOld = listen(client.subscribe('n', { presence: true }));
      const asked = await ws1.expect('subscribe', (f) => f.room === 'n');
      assert.equal(asked.presence, true);
      ws1.serverSend({ op: 'subscribed', room: 'n', epoch: 'E', seq: 0, ref: asked.ref });
      assert.equal(heardOld.at(-1)[0], 'subscribed');
    } finally {
      client.close();
    }
  });
});
