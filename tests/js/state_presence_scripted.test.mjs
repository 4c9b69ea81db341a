// Unit-level tests of livegate.js's room state and presence (issue 19), with
// the scripted socket and the scripted fetch playing the server frame by frame: the state
// comes before the events after its seq, events at or below it are dropped, a failed
// recovery brings the state again instead of `recovery_failed`, presence frames reach
// `onPresence`, `presence()` resolves and rejects, and over SSE the stream asks with
// `state=1` / `presence=1`. The same against the real server: state_presence.test.mjs.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { connect } from '../../clients/js/livegate.js';
import { fakeFetch } from './support/fake-fetch.mjs';
import { fakeSocketClass } from './support/fake-socket.mjs';
import { recorder, subscribed } from './support/clients.mjs';
import { waitFor } from './support/server.mjs';

const FAST = { backoffMs: [0, 5, 10], restartJitterMs: 5, connectTimeoutMs: 3000, stableMs: 60_000 };
const FAR = () => Date.now() + 600_000;
const tick = () => new Promise((resolve) => setImmediate(resolve));

/**
 * A client on the scripted socket, welcomed. `timeline` records, in order, every call of
 * the handlers given by `subscribe` below: `['state', data, meta]`, `['event', seq]`,
 * `['presence', detail]`.
 */
async function welcomed() {
  const Fake = fakeSocketClass();
  let tokens = 0;
  const client = connect({
    url: 'http://gw.test',
    getToken: async () => `tok${++tokens}`,
    WebSocket: Fake,
    fetch: null,
    timings: FAST,
  });
  const log = recorder(client);
  const timeline = [];
  const subscribe = (room, options = {}) =>
    subscribed(client, room, (event) => timeline.push(['event', event.room, event.seq]), {
      ...options,
      onState: options.state ? (data, meta) => timeline.push(['state', data, meta]) : undefined,
      onPresence: options.presence ? (detail) => timeline.push(['presence', detail]) : undefined,
    });
  const ws = await Fake.nth(0);
  ws.welcome();
  return { Fake, client, log, timeline, subscribe, ws, tokens: () => tokens };
}

/** Only the `['event', room, seq]` entries of a timeline, as seqs. */
const eventSeqs = (timeline, room) => timeline.filter((e) => e[0] === 'event' && e[1] === room).map((e) => e[2]);

describe('room state with a scripted socket', () => {
  test('the state comes first, then exactly the events after its seq, then live', async () => {
    const { client, log, timeline, subscribe, ws } = await welcomed();
    try {
      const reply = subscribe('match:1', { state: true });
      const sub = await ws.expect('subscribe');
      assert.deepEqual({ ...sub, ref: undefined }, { op: 'subscribe', room: 'match:1', state: true, ref: undefined }, 'state:true, no since');
      // S = 7 while the head is 10: the server sends 8..10 after the reply. It may also
      // send events at or below S (a window that overlapped): those are not delivered.
      ws.serverSend({ op: 'subscribed', room: 'match:1', epoch: 'E1', seq: 10, ref: sub.ref, state: { seq: 7, data: { score: [1, 0] } } });
      ws.events('match:1', 6, 7, 8);
      ws.events('match:1', 9, 10);
      ws.events('match:1', 10, 11); // 10 again, then live
      assert.deepEqual(timeline, [
        ['state', { score: [1, 0] }, { room: 'match:1', seq: 7, epoch: 'E1' }],
        ['event', 'match:1', 8],
        ['event', 'match:1', 9],
        ['event', 'match:1', 10],
        ['event', 'match:1', 11],
      ]);
      assert.deepEqual(await reply, { room: 'match:1', epoch: 'E1', seq: 10, recovered: undefined, state: { seq: 7, data: { score: [1, 0] } } });
      assert.deepEqual(client.position('match:1'), { epoch: 'E1', seq: 11 });
      assert.equal(ws.frames('history').length, 0, 'no history request: the server sends what follows S');
      assert.deepEqual(log.error, []);
    } finally {
      client.close();
    }
  });

  test('"state": null: onState(null) with seq 0, then the retained events wherever they start', async () => {
    const { client, log, timeline, subscribe, ws } = await welcomed();
    try {
      subscribe('chat:1', { state: true });
      const sub = await ws.expect('subscribe');
      ws.serverSend({ op: 'subscribed', room: 'chat:1', epoch: 'E1', seq: 5, ref: sub.ref, state: null });
      ws.events('chat:1', 3, 4, 5); // history was trimmed below 3
      ws.events('chat:1', 6);
      assert.deepEqual(timeline, [
        ['state', null, { room: 'chat:1', seq: 0, epoch: 'E1' }],
        ['event', 'chat:1', 3],
        ['event', 'chat:1', 4],
        ['event', 'chat:1', 5],
        ['event', 'chat:1', 6],
      ]);
      assert.equal(ws.frames('history').length, 0);
      // After that first event a gap is a gap again: filled with history.
      ws.events('chat:1', 9);
      const ask = await ws.expect('history');
      assert.equal(ask.since, 6);
      assert.deepEqual(log.recovery_failed, []);
    } finally {
      client.close();
    }
  });

  test('after a reconnect: recovered replays as usual; a failed recovery brings the state again and continues after it', async () => {
    const { Fake, client, log, timeline, subscribe, ws, tokens } = await welcomed();
    try {
      subscribe('match:2', { state: true });
      subscribe('plain'); // no state: its subscribe frames never ask for it
      const sub = await ws.expect('subscribe', (f) => f.room === 'match:2');
      const plain = await ws.expect('subscribe', (f) => f.room === 'plain');
      assert.equal(plain.state, undefined);
      ws.serverSend({ op: 'subscribed', room: 'match:2', epoch: 'E1', seq: 4, ref: sub.ref, state: { seq: 4, data: { minute: 10 } } });
      ws.serverSend({ op: 'subscribed', room: 'plain', epoch: 'P', seq: 0, ref: plain.ref });
      ws.events('match:2', 5, 6);

      // 1. Lost; the resubscribe carries since, epoch and state:true; the server recovers.
      ws.serverClose(1006);
      const ws1 = await Fake.nth(1);
      ws1.welcome('S1');
      const again = await ws1.expect('subscribe', (f) => f.room === 'match:2');
      assert.deepEqual({ since: again.since, epoch: again.epoch, state: again.state }, { since: 6, epoch: 'E1', state: true });
      ws1.serverSend({ op: 'subscribed', room: 'match:2', epoch: 'E1', seq: 8, ref: again.ref, recovered: true });
      ws1.events('match:2', 7, 8);
      assert.deepEqual(timeline.filter((e) => e[0] === 'state').length, 1, 'a recovered reply has no state');
      assert.deepEqual(eventSeqs(timeline, 'match:2'), [5, 6, 7, 8]);
      assert.deepEqual(log.recovered.map((r) => [r.room, r.seq, r.state]), [['match:2', 8, undefined]]);

      // 2. Lost again; this time history no longer covers since 8: recovered:false with
      //    the state at 20 (head 22) and the events after it.
      ws1.serverClose(1006);
      const ws2 = await Fake.nth(2);
      ws2.welcome('S1');
      const third = await ws2.expect('subscribe', (f) => f.room === 'match:2');
      assert.equal(third.since, 8);
      const plain2 = await ws2.expect('subscribe', (f) => f.room === 'plain');
      ws2.serverSend({ op: 'subscribed', room: 'match:2', epoch: 'E1', seq: 22, ref: third.ref, recovered: false, state: { seq: 20, data: { minute: 70 } } });
      ws2.events('match:2', 20, 21, 22, 23);
      // A room without state still gets recovery_failed.
      ws2.serverSend({ op: 'subscribed', room: 'plain', epoch: 'P2', seq: 3, ref: plain2.ref, recovered: false });
      const states = timeline.filter((e) => e[0] === 'state');
      assert.deepEqual(states.at(-1), ['state', { minute: 70 }, { room: 'match:2', seq: 20, epoch: 'E1' }]);
      const afterState = timeline.slice(timeline.indexOf(states.at(-1)) + 1);
      assert.deepEqual(afterState.filter((e) => e[1] === 'match:2').map((e) => e[2]), [21, 22, 23], 'only the events after S, after onState');
      assert.deepEqual(log.recovery_failed.map((r) => r.room), ['plain'], 'no recovery_failed for the room with state');
      assert.deepEqual(log.recovered.at(-1), { room: 'match:2', epoch: 'E1', seq: 20, state: true });
      assert.equal(ws2.frames('history').length, 0, 'nothing to reload');
      assert.equal(tokens(), 3, 'one token per attempt (this fake server gives no resume credential), nothing more');

      // 3. The room was recreated (new epoch, seqs start again): the state resets the view,
      //    so events with seqs and ids delivered before are delivered again.
      ws2.serverClose(1006);
      const ws3 = await Fake.nth(3);
      ws3.welcome('S1');
      const fourth = await ws3.expect('subscribe', (f) => f.room === 'match:2');
      assert.deepEqual({ since: fourth.since, epoch: fourth.epoch }, { since: 23, epoch: 'E1' });
      ws3.serverSend({ op: 'subscribed', room: 'match:2', epoch: 'E2', seq: 6, ref: fourth.ref, recovered: false, state: { seq: 4, data: { minute: 1 } } });
      ws3.events('match:2', 5, 6);
      assert.deepEqual(timeline.filter((e) => e[0] === 'state').at(-1), ['state', { minute: 1 }, { room: 'match:2', seq: 4, epoch: 'E2' }]);
      assert.deepEqual(eventSeqs(timeline, 'match:2').slice(-2), [5, 6], 'ids e-5 and e-6 of the old epoch do not block the new ones');
      assert.deepEqual(client.position('match:2'), { epoch: 'E2', seq: 6 });
    } finally {
      client.close();
    }
  });

  test('a throwing onState is reported as an error and delivery goes on; a server without state or presence is subscribed without them', async () => {
    const { client, log, timeline, ws } = await welcomed();
    try {
      subscribed(client, 'r', (e) => timeline.push(e.seq), {
        state: true,
        onState: () => {
          throw new Error('render failed');
        },
      });
      const sub = await ws.expect('subscribe');
      ws.serverSend({ op: 'subscribed', room: 'r', epoch: 'E', seq: 2, ref: sub.ref, state: { seq: 1, data: 'x' } });
      ws.events('r', 2);
      assert.deepEqual(timeline, [2]);
      assert.deepEqual(log.error.map((e) => [e.room, e.code, e.message]), [['r', 'handler', 'render failed']]);

      // An older server ignores state:true: its reply has no `state`. The subscription
      // starts at the head like a plain one, and the app hears why no onState came.
      subscribed(client, 'old', () => {}, { state: true, onState: () => timeline.push('state!') });
      const old = await ws.expect('subscribe', (f) => f.room === 'old');
      ws.serverSend({ op: 'subscribed', room: 'old', epoch: 'E', seq: 9, ref: old.ref });
      assert.deepEqual(log.error.at(-1).code, 'unsupported');
      assert.deepEqual(client.position('old'), { epoch: 'E', seq: 9 });
      assert.ok(!timeline.includes('state!'));

      // A server without `features` that refuses the flags (bad_request): subscribed again
      // without the newest flag, then without the next; its message is never read.
      const older = subscribed(client, 'older', () => {}, { state: true, presence: true });
      const first = await ws.expect('subscribe', (f) => f.room === 'older');
      assert.equal(first.state, true);
      ws.serverSend({ op: 'error', ref: first.ref, room: 'older', code: 'bad_request', message: 'no' });
      const second = await ws.expect('subscribe', (f) => f.room === 'older' && f.ref !== first.ref);
      assert.deepEqual([second.state, second.presence], [true, undefined]);
      ws.serverSend({ op: 'error', ref: second.ref, room: 'older', code: 'bad_request', message: 'no' });
      const third = await ws.expect('subscribe', (f) => f.room === 'older' && f.ref !== first.ref && f.ref !== second.ref);
      assert.deepEqual([third.state, third.presence], [undefined, undefined]);
      ws.serverSend({ op: 'subscribed', room: 'older', epoch: 'E', seq: 4, ref: third.ref });
      assert.equal((await older).seq, 4);
      assert.deepEqual(log.error.slice(-2).map((e) => [e.room, e.code]), [['older', 'unsupported'], ['older', 'unsupported']]);
      // A bad_request of a subscribe without flags ends the subscription.
      const bad = subscribed(client, 'bad', () => {}, { state: true });
      const badSub = await ws.expect('subscribe', (f) => f.room === 'bad');
      ws.serverSend({ op: 'error', ref: badSub.ref, code: 'bad_request', message: 'subscribe: since without a number' });
      const badAgain = await ws.expect('subscribe', (f) => f.room === 'bad' && f.ref !== badSub.ref);
      assert.equal(badAgain.state, undefined);
      ws.serverSend({ op: 'error', ref: badAgain.ref, code: 'bad_request', message: 'subscribe: since without a number' });
      await assert.rejects(bad, (error) => error.code === 'bad_request');
    } finally {
      client.close();
    }
  });
});

describe('presence with a scripted socket', () => {
  test('subscribe with presence:true asks for it; presence frames reach onPresence, other rooms\' do not', async () => {
    const { client, timeline, subscribe, ws } = await welcomed();
    try {
      subscribe('lobby', { presence: true });
      subscribe('quiet');
      const sub = await ws.expect('subscribe', (f) => f.room === 'lobby');
      const quiet = await ws.expect('subscribe', (f) => f.room === 'quiet');
      assert.equal(sub.presence, true);
      assert.equal(sub.state, undefined);
      assert.equal(quiet.presence, undefined);
      ws.serverSend({ op: 'subscribed', room: 'lobby', epoch: 'E', seq: 0, ref: sub.ref });
      ws.serverSend({ op: 'subscribed', room: 'quiet', epoch: 'E', seq: 0, ref: quiet.ref });
      ws.serverSend({ op: 'presence', room: 'lobby', count: 2, joined: [{ user: 'ann', device: 'web' }, { user: 'bob', device: 'phone' }], left: [] });
      ws.serverSend({ op: 'presence', room: 'quiet', count: 1, joined: [{ user: 'x', device: 'web' }], left: [] });
      ws.serverSend({ op: 'presence', room: 'nowhere', count: 1, joined: [], left: [] });
      ws.serverSend({ op: 'presence', room: 'lobby', count: 1, joined: [], left: [{ user: 'bob', device: 'phone' }] });
      // Above the server's members limit: counts only.
      ws.serverSend({ op: 'presence', room: 'lobby', count: 5000, joined: null, left: null });
      assert.deepEqual(timeline, [
        ['presence', { room: 'lobby', count: 2, joined: [{ user: 'ann', device: 'web' }, { user: 'bob', device: 'phone' }], left: [] }],
        ['presence', { room: 'lobby', count: 1, joined: [], left: [{ user: 'bob', device: 'phone' }] }],
        ['presence', { room: 'lobby', count: 5000, joined: null, left: null }],
      ]);

      // A later subscription asking for presence shares the room's server subscription.
      const second = [];
      subscribed(client, 'lobby', null, { presence: true, onPresence: (d) => second.push(d.count) });
      ws.serverSend({ op: 'presence', room: 'lobby', count: 3, joined: [{ user: 'cy', device: 'web' }], left: [] });
      assert.deepEqual(second, [3]);
      assert.equal(ws.frames('subscribe').filter((f) => f.room === 'lobby').length, 1, 'no second subscribe frame');

      // After a reconnect the resubscribe asks for presence again.
      ws.serverClose(1006);
      const Fake = ws.constructor;
      const ws1 = await Fake.nth(1);
      ws1.welcome('S1');
      const again = await ws1.expect('subscribe', (f) => f.room === 'lobby');
      assert.equal(again.presence, true);
    } finally {
      client.close();
    }
  });

  test('presence() resolves with {room, count, members}; error frames reject with their code', async () => {
    const { client, timeline, subscribe, ws } = await welcomed();
    try {
      subscribe('lobby', { presence: true });
      const sub = await ws.expect('subscribe');
      ws.serverSend({ op: 'subscribed', room: 'lobby', epoch: 'E', seq: 0, ref: sub.ref });

      const asked = client.presence('lobby');
      const op = await ws.expect('presence');
      assert.deepEqual({ ...op, ref: undefined }, { op: 'presence', room: 'lobby', ref: undefined });
      assert.ok(Number.isInteger(op.ref));
      const members = [{ user: 'ann', device: 'web' }, { user: 'ann', device: 'phone' }];
      ws.serverSend({ op: 'presence', ref: op.ref, room: 'lobby', count: 2, members });
      assert.deepEqual(await asked, { room: 'lobby', count: 2, members });
      assert.deepEqual(timeline, [], 'the reply is not a presence change');

      const big = client.presence('stadium');
      const op2 = await ws.expect('presence', (f) => f.room === 'stadium');
      ws.serverSend({ op: 'presence', ref: op2.ref, room: 'stadium', count: 9500, members: null });
      assert.deepEqual(await big, { room: 'stadium', count: 9500, members: null });

      for (const code of ['presence_off', 'forbidden', 'bad_room']) {
        const refused = client.presence(`r-${code}`);
        const ask = await ws.expect('presence', (f) => f.room === `r-${code}`);
        ws.serverSend({ op: 'error', ref: ask.ref, code, message: `no presence (${code})` });
        await assert.rejects(refused, (error) => error.code === code && error.message === `no presence (${code})`);
      }

      // A request in flight when the connection is lost rejects with `disconnected`.
      const lost = client.presence('lobby');
      await ws.expect('presence', (f) => f.ref > op2.ref + 3);
      ws.serverClose(1006);
      await assert.rejects(lost, (error) => error.code === 'disconnected');
    } finally {
      client.close();
    }
    await assert.rejects(client.presence('lobby'), (error) => error.code === 'closed');
  });
});

describe('state and presence over SSE (scripted fetch)', () => {
  test('the stream asks with state=1 and presence=1; subscribed carries the state; event: presence reaches onPresence; presence() is unsupported', async () => {
    const fetch = fakeFetch();
    const client = connect({ url: 'https://gw.test', getToken: async () => 't1', transports: ['sse'], fetch, timings: FAST });
    const log = recorder(client);
    const timeline = [];
    try {
      subscribed(client, 'a', (e) => timeline.push(['event', e.room, e.seq]), {
        state: true,
        onState: (data, meta) => timeline.push(['state', data, meta]),
      });
      subscribed(client, 'b', (e) => timeline.push(['event', e.room, e.seq]), {
        presence: true,
        onPresence: (detail) => timeline.push(['presence', detail]),
      });
      const sse = await fetch.nth(0);
      assert.deepEqual(sse.params, { token: 't1', rooms: 'a,b', state: '1', presence: '1' });
      sse.open();
      sse.welcome('S1', { resume: 'R1', resume_expires_at_ms: FAR() });
      // The stream applies state=1 to every room: b gets a state it did not ask for and
      // ignores it (it starts at the head, like a plain subscribe).
      sse.message('subscribed', { op: 'subscribed', room: 'a', epoch: 'E', seq: 3, state: { seq: 2, data: { n: 2 } } });
      sse.message('subscribed', { op: 'subscribed', room: 'b', epoch: 'F', seq: 5, state: { seq: 1, data: { n: 1 } } });
      sse.message('events', { op: 'events', events: [{ room: 'a', seq: 3, id: 'a3', ts_ms: 1, data: {} }] }, 'a:E:3,b:F:5');
      sse.message('events', { op: 'events', events: [2, 3, 4, 5, 6].map((seq) => ({ room: 'b', seq, id: `b${seq}`, ts_ms: 1, data: {} })) }, 'a:E:3,b:F:6');
      sse.message('presence', { op: 'presence', room: 'b', count: 1, joined: [{ user: 'u', device: 'web' }], left: [] });
      await waitFor(() => timeline.length === 4, 'state, events and presence over SSE');
      assert.deepEqual(timeline, [
        ['state', { n: 2 }, { room: 'a', seq: 2, epoch: 'E' }],
        ['event', 'a', 3],
        ['event', 'b', 6],
        ['presence', { room: 'b', count: 1, joined: [{ user: 'u', device: 'web' }], left: [] }],
      ]);
      await assert.rejects(client.presence('b'), (error) => error.code === 'unsupported');

      // A reconnect whose recovery fails: the state again, then the events after it.
      sse.message('close', { code: 1012, reason: 'service restart: reconnect in 1 ms' });
      sse.end();
      const next = await fetch.nth(1);
      assert.deepEqual(next.params, { resume: 'R1', rooms: 'a,b', since: 'a:E:3,b:F:6', state: '1', presence: '1' });
      next.open();
      next.welcome('S1', { resume: 'R2', resume_expires_at_ms: FAR() });
      next.message('subscribed', { op: 'subscribed', room: 'a', epoch: 'E', seq: 40, recovered: false, state: { seq: 39, data: { n: 39 } } });
      next.message('subscribed', { op: 'subscribed', room: 'b', epoch: 'F', seq: 6, recovered: true });
      next.message('events', { op: 'events', events: [{ room: 'a', seq: 40, id: 'a40', ts_ms: 1, data: {} }] }, 'a:E:40,b:F:6');
      await waitFor(() => timeline.length === 6, 'the state again and the event after it');
      assert.deepEqual(timeline.slice(4), [['state', { n: 39 }, { room: 'a', seq: 39, epoch: 'E' }], ['event', 'a', 40]]);
      assert.deepEqual(log.recovery_failed, []);
      assert.deepEqual(log.recovered.map((r) => [r.room, r.state]).sort(), [['a', true], ['b', undefined]]);

      // Rooms that ask for neither: no flags.
      client.unsubscribe('a');
      client.unsubscribe('b');
      subscribed(client, 'c', () => {});
      await tick();
      const last = await fetch.nth(2);
      assert.equal(last.params.state, undefined);
      assert.equal(last.params.presence, undefined);
    } finally {
      client.close();
    }
  });
});
