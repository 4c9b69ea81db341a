// Unit-level tests of livegate.js's resume credentials and transports (issue 18), with the
// scripted socket and the scripted fetch playing the server: which credential each
// attempt uses, when a credential is dropped, when `auto` goes to SSE and back, and the
// SSE stream's parsing, cursor, reopen and close-code rules. The same rules against the
// real server are in resume.test.mjs and sse.test.mjs.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { EventStreamParser, connect, sseEndpointOf } from '../../clients/js/livegate.js';
import { fakeFetch } from './support/fake-fetch.mjs';
import { fakeSocketClass } from './support/fake-socket.mjs';
import { recorder, subscribed } from './support/clients.mjs';
import { letTimePass, pace, waitFor } from './support/clock.mjs';
import { nextEvent } from './support/server.mjs';
import { VirtualClock } from './support/virtual-clock.mjs';

const FAST = { backoffMs: [0, 5, 10], restartJitterMs: 5, connectTimeoutMs: 3000, stableMs: 60_000 };
const FAR = () => Date.now() + 600_000;
const seqs = (events) => events.map((e) => e.seq);

/** What a WebSocket attempt's URL carried. */
function credentialOf(ws) {
  const params = new URL(ws.url).searchParams;
  return { token: params.get('token'), resume: params.get('resume'), session: params.get('session') };
}

function tokens() {
  let n = 0;
  const getToken = async () => `t${++n}`;
  getToken.calls = () => n;
  return getToken;
}

describe('resume credentials over WebSocket', () => {
  test('every welcome credential is used once for the next attempt, instead of getToken', async () => {
    const Fake = fakeSocketClass();
    const getToken = tokens();
    const client = connect({ url: 'http://gw.test', getToken, WebSocket: Fake, fetch: fakeFetch(), transports: ['websocket'], timings: FAST });
    const log = recorder(client);
    try {
      const ws0 = await Fake.nth(0);
      assert.deepEqual(credentialOf(ws0), { token: 't1', resume: null, session: null });
      assert.equal(client.hasResume, false);
      ws0.welcome('S1', { resume: 'R1', resume_expires_at_ms: FAR() });
      assert.equal(client.hasResume, true);
      ws0.serverClose(1012, 'service restart: reconnect in 1 ms');
      const ws1 = await Fake.nth(1);
      assert.deepEqual(credentialOf(ws1), { token: null, resume: 'R1', session: null }, 'resume names its session itself');
      ws1.welcome('S1', { resume: 'R2', resume_expires_at_ms: FAR() });
      ws1.serverClose(4008, 'heartbeat timeout');
      const ws2 = await Fake.nth(2);
      assert.equal(credentialOf(ws2).resume, 'R2', 'the newest credential');
      assert.equal(getToken.calls(), 1, 'no getToken call after the first');
      assert.deepEqual(log.connected.map((c) => c.credential), ['token', 'resume']);
      // A welcome without a credential (an older server): back to tokens.
      ws2.welcome('S1');
      ws2.serverClose(4008, 'heartbeat timeout');
      const ws3 = await Fake.nth(3);
      assert.deepEqual(credentialOf(ws3), { token: 't2', resume: null, session: 'S1' });
      for (const entry of [...log.disconnected, ...log.error]) {
        assert.ok(!JSON.stringify(entry).includes('R1') && !JSON.stringify(entry).includes('R2'), 'a credential in an event');
      }
    } finally {
      client.close();
    }
  });

  test('a credential expiring within the margin is not used; resume: false never uses one', async () => {
    const Fake = fakeSocketClass();
    const getToken = tokens();
    const client = connect({ url: 'http://gw.test', getToken, WebSocket: Fake, fetch: fakeFetch(), transports: ['websocket'], timings: FAST });
    try {
      const ws0 = await Fake.nth(0);
      ws0.welcome('S1', { resume: 'R1', resume_expires_at_ms: Date.now() + 20_000 }); // inside the 30 s margin
      assert.equal(client.hasResume, false);
      ws0.serverClose(1012, 'reconnect in 1 ms');
      assert.deepEqual(credentialOf(await Fake.nth(1)), { token: 't2', resume: null, session: 'S1' });
    } finally {
      client.close();
    }

    const Off = fakeSocketClass();
    const getToken2 = tokens();
    const off = connect({ url: 'http://gw.test', getToken: getToken2, WebSocket: Off, fetch: fakeFetch(), resume: false, timings: FAST });
    try {
      for (let i = 0; i < 3; i++) {
        const ws = await Off.nth(i);
        assert.equal(credentialOf(ws).resume, null);
        ws.welcome('S1', { resume: `R${i}`, resume_expires_at_ms: FAR() });
        ws.serverClose(1012, 'reconnect in 1 ms');
      }
      await Off.nth(3);
      assert.equal(getToken2.calls(), 4, 'a token for every attempt');
      assert.equal(off.hasResume, false);
    } finally {
      off.close();
    }
  });

  test('failed attempts with a credential: dropped after resumeAttempts while the server is up, kept while it is down', async () => {
    const Fake = fakeSocketClass((socket) => (Fake.failing ? socket.fail() : socket.open()));
    const fetch = fakeFetch({ ready: 'down' });
    const getToken = tokens();
    const client = connect({ url: 'http://gw.test', getToken, WebSocket: Fake, fetch, transports: ['websocket'], timings: FAST });
    try {
      const ws0 = await Fake.nth(0);
      ws0.welcome('S1', { resume: 'R1', resume_expires_at_ms: FAR() });
      Fake.failing = true;
      ws0.serverClose(1012, 'reconnect in 1 ms');
      // The server is down (a restart): six failed attempts, every one with R1.
      await Fake.nth(6);
      assert.ok(Fake.sockets.slice(1, 7).every((ws) => credentialOf(ws).resume === 'R1'));
      assert.equal(getToken.calls(), 1);
      assert.ok(fetch.probes >= 5, `the client checked /readyz (${fetch.probes})`);

      // Draining (503): still not the credential's fault.
      fetch.ready = 'draining';
      const at = Fake.sockets.length;
      await Fake.nth(at + 3);
      assert.ok(Fake.sockets.slice(1).every((ws) => credentialOf(ws).resume === 'R1'));

      // Up and ready, yet the handshake fails: the credential was refused. At most 3
      // consecutive attempts with it (the check of the one under way when the server came
      // up may still say draining), then a token.
      const upFrom = Fake.sockets.length;
      fetch.ready = 'up';
      const withToken = await waitFor(() => Fake.sockets.slice(upFrom).find((ws) => credentialOf(ws).token), 'an attempt with a token');
      const between = Fake.sockets.slice(upFrom, Fake.sockets.indexOf(withToken));
      assert.ok(between.every((ws) => credentialOf(ws).resume === 'R1'));
      assert.ok(between.length >= 2 && between.length <= 3, `${between.length} attempts with R1 once the server was up`);
      assert.deepEqual(credentialOf(withToken), { token: 't2', resume: null, session: 'S1' }, 'the first getToken call since the start');
      Fake.failing = false;
      const ok = await Fake.nth(Fake.sockets.length);
      ok.welcome('S1', { resume: 'R9', resume_expires_at_ms: FAR() });
      assert.equal(client.state, 'connected');
    } finally {
      client.close();
    }
  });

  test('exactly resumeAttempts attempts with a refused credential, counted only while the server is ready', async () => {
    const Fake = fakeSocketClass((socket) => (Fake.failing ? socket.fail() : socket.open()));
    const fetch = fakeFetch({ ready: 'up' });
    const getToken = tokens();
    const client = connect({ url: 'http://gw.test', getToken, WebSocket: Fake, fetch, transports: ['websocket'], resumeAttempts: 2, timings: FAST });
    try {
      const ws0 = await Fake.nth(0);
      ws0.welcome('S1', { resume: 'R1', resume_expires_at_ms: FAR() });
      Fake.failing = true;
      ws0.serverClose(4000, 'dropped');
      const third = await Fake.nth(3);
      assert.deepEqual(Fake.sockets.slice(1, 4).map((ws) => credentialOf(ws).resume ?? credentialOf(ws).token), ['R1', 'R1', 't2']);
      assert.equal(third.url.includes('session=S1'), true, 'the token offers the session again');
      assert.equal(getToken.calls(), 2);
      Fake.failing = false;
    } finally {
      client.close();
    }
  });

  test('a credential is used until resumeMarginMs before its expiry, on the local clock (virtual time)', async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    const getToken = tokens();
    const client = connect({ clock: clock.option, url: 'http://gw.test', getToken, WebSocket: Fake, fetch: fakeFetch({ clock }), transports: ['websocket'], random: () => 0 });
    try {
      const ws0 = await Fake.nth(0);
      ws0.welcome('S1', { resume: 'R1', resume_expires_at_ms: clock.now() + 10 * 60_000 });
      // Nine minutes on, every ping answered: still a minute before the margin.
      for (let step = 0; step < 18; step++) {
        await clock.advance(30_000);
        ws0.serverSend({ op: 'pong' });
      }
      assert.equal(Fake.sockets.length, 1, 'one connection all along');
      assert.equal(client.hasResume, true);
      client.dropConnection();
      const ws1 = await Fake.nth(1);
      assert.deepEqual(credentialOf(ws1), { token: null, resume: 'R1', session: null });
      ws1.welcome('S1', { resume: 'R2', resume_expires_at_ms: clock.now() + 60_000 });
      await clock.advance(29_999); // R2 counts as expired 30 s early
      assert.equal(client.hasResume, true);
      await clock.advance(1);
      assert.equal(client.hasResume, false);
      client.dropConnection();
      assert.deepEqual(credentialOf(await Fake.nth(2)), { token: 't2', resume: null, session: 'S1' });
      assert.equal(getToken.calls(), 2);
    } finally {
      client.close();
    }
  });

  test('4501/4502 stop the client and drop the credential (virtual time)', async () => {
    for (const code of [4501, 4502]) {
      const clock = new VirtualClock();
      const Fake = fakeSocketClass(undefined, clock);
      const getToken = tokens();
      const client = connect({ clock: clock.option, url: 'http://gw.test', getToken, WebSocket: Fake, fetch: fakeFetch({ clock }) });
      const ws = await Fake.nth(0);
      ws.welcome('S1', { resume: 'R1', resume_expires_at_ms: clock.now() + 600_000 });
      ws.serverClose(code, 'go away');
      await clock.advance(60 * 60_000); // an hour: no reconnect
      assert.equal(Fake.sockets.length, 1);
      assert.equal(client.state, 'closed');
      assert.equal(client.hasResume, false);
      client.close();
    }
  });
});

describe('transport auto', () => {
  test('the fallback in the default timings: two WebSocket failures, their backoff, then SSE (virtual time)', async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass((socket) => socket.fail(), clock); // a proxy breaks every upgrade
    const fetch = fakeFetch({ ready: 'up', clock });
    const client = connect({ clock: clock.option, url: 'http://gw.test', getToken: tokens(), WebSocket: Fake, fetch, random: () => 0.99999 });
    const log = recorder(client);
    try {
      const sse = await fetch.nth(0, 60_000);
      assert.deepEqual(Fake.sockets.map((s) => s.createdAt - Fake.sockets[0].createdAt), [0, 0], 'the first tier is 0 ms');
      assert.equal(sse.createdAt - Fake.sockets[1].createdAt, 1999, 'SSE after the second tier');
      assert.deepEqual(log.transport.map((t) => [t.from, t.to, t.reason]), [['websocket', 'sse', '2 WebSocket attempts in a row failed']]);
      assert.equal(fetch.probes, 2, 'each failure counted only once /readyz said the server is up');
      sse.open();
      sse.welcome('S1');
      await clock.until(() => client.state === 'connected', 'connected over SSE', 1000);
      assert.equal(log.connected.at(-1).transport, 'sse');
    } finally {
      client.close();
    }
  });

  test('two WebSocket attempts failing while the server is up: SSE from then on, with the credential', async () => {
    const Fake = fakeSocketClass((socket) => (Fake.failing ? socket.fail() : socket.open()));
    const fetch = fakeFetch({ ready: 'up' });
    const getToken = tokens();
    const client = connect({ url: 'http://gw.test/x', getToken, WebSocket: Fake, fetch, timings: FAST });
    const log = recorder(client);
    try {
      assert.equal(client.transport, 'websocket');
      const ws0 = await Fake.nth(0);
      ws0.welcome('S1', { resume: 'R1', resume_expires_at_ms: FAR() });
      Fake.failing = true; // a proxy starts breaking the upgrade
      ws0.serverClose(4000, 'dropped');
      const sse = await fetch.nth(0);
      assert.equal(Fake.sockets.length, 3, 'two failed WebSocket attempts');
      assert.equal(client.transport, 'sse');
      assert.deepEqual(log.transport.map((t) => [t.from, t.to]), [['websocket', 'sse']]);
      assert.equal(sse.url.pathname, '/x/v1/sse');
      assert.equal(sse.params.resume, 'R1', 'the credential survived the two failures');
      assert.equal(getToken.calls(), 1);
      sse.open();
      sse.welcome('S1', { resume: 'R2', resume_expires_at_ms: FAR() });
      await waitFor(() => client.state === 'connected', 'connected over SSE');
      assert.equal(log.connected.at(-1).transport, 'sse');
      await assert.rejects(client.history('r', 0, 1), (e) => e.code === 'unsupported');
    } finally {
      client.close();
    }
  });

  test('a server that is down does not make auto switch; no WebSocket constructor means SSE', async () => {
    const Fake = fakeSocketClass((socket) => socket.fail());
    const fetch = fakeFetch({ ready: 'down' });
    const client = connect({ url: 'http://gw.test', getToken: tokens(), WebSocket: Fake, fetch, timings: FAST });
    try {
      await Fake.nth(6);
      assert.equal(client.transport, 'websocket');
      assert.equal(fetch.streams.length, 0);
    } finally {
      client.close();
    }
    const bare = connect({ url: 'http://gw.test', getToken: tokens(), WebSocket: null, fetch: fakeFetch(), timings: FAST });
    const warnings = [];
    bare.on('warning', (w) => warnings.push(w));
    try {
      const first = await nextEvent(bare, 'connecting');
      // Node 20 without the flag has no global WebSocket: the `ws` package's when it can be
      // imported from the client's folder, else SSE, never silently.
      if (typeof globalThis.WebSocket !== 'function' && first.transport === 'sse') {
        assert.equal(bare.transport, 'sse');
        assert.deepEqual(warnings.map((w) => w.code), ['no_websocket']);
        assert.match(warnings[0].message, /npm install ws/);
      } else assert.equal(first.transport, 'websocket');
    } finally {
      bare.close();
    }
  });

  test('auto goes back to WebSocket when SSE answers 404, or refuses the credential', async () => {
    const Fake = fakeSocketClass((socket) => (Fake.failing ? socket.fail() : socket.open()));
    const fetch = fakeFetch({ ready: 'up' });
    const getToken = tokens();
    const client = connect({ url: 'http://gw.test', getToken, WebSocket: Fake, fetch, timings: FAST });
    const log = recorder(client);
    try {
      const ws0 = await Fake.nth(0);
      ws0.welcome('S1', { resume: 'R1', resume_expires_at_ms: FAR() });
      Fake.failing = true; // e.g. the data dir was wiped: R1 is refused on every handshake
      ws0.serverClose(4000, 'dropped');
      const sse = await fetch.nth(0);
      assert.equal(sse.params.resume, 'R1');
      Fake.failing = false;
      sse.respond(401, { error: { code: 'resume_invalid', message: 'resume credential has an invalid signature' } });
      const ws3 = await Fake.nth(3);
      assert.deepEqual(credentialOf(ws3), { token: 't2', resume: null, session: 'S1' }, 'a fresh token, over WebSocket again');
      assert.deepEqual(log.transport.map((t) => t.to), ['sse', 'websocket']);
      ws3.welcome('S1');
      assert.equal(client.transport, 'websocket');
    } finally {
      client.close();
    }

    const F2 = fakeSocketClass((socket) => socket.fail());
    const fetch2 = fakeFetch({ ready: 'up' });
    const c2 = connect({ url: 'http://gw.test', getToken: tokens(), WebSocket: F2, fetch: fetch2, timings: FAST });
    try {
      const sse = await fetch2.nth(0);
      sse.respond(404, { error: { code: 'not_found', message: 'no route for GET /v1/sse' } });
      await F2.nth(5);
      assert.equal(c2.transport, 'websocket', 'no SSE endpoint: WebSocket for good');
      assert.equal(fetch2.streams.length, 1);
    } finally {
      c2.close();
    }
  });
});

describe('the transports option', () => {
  test("transports: ['websocket'] never falls back: WebSocket attempts go on failing, no SSE request (virtual time)", async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass((socket) => socket.fail(), clock);
    const fetch = fakeFetch({ ready: 'up', clock });
    const client = connect({ clock: clock.option, url: 'http://gw.test', getToken: tokens(), WebSocket: Fake, fetch, transports: ['websocket'], random: () => 0.99999 });
    const log = recorder(client);
    try {
      await Fake.nth(5, 120_000);
      assert.equal(fetch.streams.length, 0, 'no SSE request');
      assert.deepEqual(log.transport, []);
      assert.equal(client.transport, 'websocket');
    } finally {
      client.close();
    }
  });

  test('an unknown, repeated or misordered transport throws at construction, and so does the old transport option', () => {
    const base = { url: 'http://gw.test', getToken: () => 't', WebSocket: fakeSocketClass(), fetch: fakeFetch() };
    const refused = (options, pattern) => assert.throws(() => connect({ ...base, ...options }), (e) => e instanceof TypeError && pattern.test(e.message), JSON.stringify(options));
    refused({ transports: ['websocket', 'carrier-pigeon'] }, /unknown transport "carrier-pigeon"/);
    refused({ transports: [] }, /non-empty list/);
    refused({ transports: 'sse' }, /non-empty list/);
    refused({ transports: ['sse', 'sse'] }, /twice/);
    refused({ transports: ['sse', 'websocket'] }, /SSE does not fall back to WebSocket/);
    refused({ transport: 'sse' }, /there is no transport option: use transports/);
    refused({ transports: ['sse'], transport: 'sse' }, /there is no transport option/);
    for (const [options, first] of [[{}, 'websocket'], [{ transports: ['sse'] }, 'sse'], [{ transports: ['websocket', 'sse'] }, 'websocket']]) {
      const client = connect({ ...base, ...options });
      assert.equal(client.transport, first, JSON.stringify(options));
      client.close();
    }
  });
});

describe('transport sse', () => {
  /** A client on the scripted fetch, welcomed over SSE and subscribed to `rooms`. */
  async function streaming(rooms, { timings = {}, heartbeatMs = 30000 } = {}) {
    const fetch = fakeFetch();
    const getToken = tokens();
    const client = connect({ url: 'https://gw.test', getToken, transports: ['sse'], fetch, timings: { ...FAST, ...timings } });
    const log = recorder(client);
    const got = Object.fromEntries(rooms.map((room) => [room, []]));
    const replies = rooms.map((room) => subscribed(client, room, (e) => got[room].push(e)));
    const sse = await fetch.nth(0);
    assert.equal(sse.url.origin + sse.url.pathname, 'https://gw.test/v1/sse');
    assert.deepEqual(sse.params, { token: 't1', rooms: rooms.join(',') });
    sse.open();
    sse.welcome('S1', { resume: 'R1', resume_expires_at_ms: FAR(), heartbeat_ms: heartbeatMs });
    rooms.forEach((room, i) => sse.message('subscribed', { op: 'subscribed', room, epoch: 'E', seq: 10 * i }));
    await Promise.all(replies);
    return { fetch, getToken, client, log, got, sse };
  }
  const events = (room, ...list) => ({ op: 'events', events: list.map((seq) => ({ room, seq, id: `${room}-${seq}`, ts_ms: 1, data: { n: seq } })) });

  test('the stream is parsed in any chunking; the cursor and resume carry a reconnect after close 1012', async () => {
    const { fetch, getToken, client, log, got, sse } = await streaming(['a', 'b']);
    try {
      assert.equal(client.transport, 'sse');
      assert.equal(log.connected[0].transport, 'sse');
      // CRLF line ends, a comment, a split data: payload (raw newline inside the JSON), an
      // id, all cut into 3-byte chunks.
      const text =
        ': ping\r\n\r\n' +
        'event: events\r\nid: a:E:1,b:E:10\r\ndata: {"op":"events","events":[{"room":"a","seq":1,"id":"x1","ts_ms":1,\r\ndata: "data":{"t":"two\\nlines"}}]}\r\n\r\n' +
        'event: events\nid: a:E:2,b:E:11\ndata: ' + JSON.stringify(events('b', 11)).slice(0, -1) + '\r' + 'data: ,"x":1}\r\r' +
        'event: events\nid: a:E:2,b:E:11\ndata: ' + JSON.stringify(events('a', 2)) + '\n\n';
      for (let i = 0; i < text.length; i += 3) {
        sse.send(text.slice(i, i + 3));
        await pace(0, 'each chunk in a task of its own');
      }
      await waitFor(() => got.a.length === 2 && got.b.length === 1, 'the three events');
      assert.deepEqual(got.a.map((e) => e.data), [{ t: 'two\nlines' }, { n: 2 }]);
      assert.deepEqual(seqs(got.b), [11]);

      sse.message('close', { code: 1012, reason: 'service restart: reconnect in 1 ms' });
      sse.end();
      const next = await fetch.nth(1);
      assert.deepEqual(next.params, { resume: 'R1', rooms: 'a,b', since: 'a:E:2,b:E:11' });
      assert.equal(getToken.calls(), 1);
      assert.deepEqual(log.disconnected.map((d) => [d.code, d.reconnectInMs]), [[1012, 1]]);
      next.open();
      next.welcome('S1', { resume: 'R2', resume_expires_at_ms: FAR() });
      next.message('subscribed', { op: 'subscribed', room: 'a', epoch: 'E', seq: 3, recovered: true });
      next.message('subscribed', { op: 'subscribed', room: 'b', epoch: 'E', seq: 11, recovered: true });
      next.message('events', events('a', 2, 3), 'a:E:3,b:E:11');
      await waitFor(() => got.a.length === 3, 'the replay');
      assert.deepEqual(seqs(got.a), [1, 2, 3], 'no duplicate across the reconnect');
      assert.deepEqual(log.recovered.map((r) => r.room).sort(), ['a', 'b']);
    } finally {
      client.close();
    }
  });

  test('subscribe and unsubscribe reopen the stream with resume and the cursor, quietly', async () => {
    const { fetch, getToken, client, log, got, sse } = await streaming(['a']);
    try {
      sse.message('events', events('a', 1), 'a:E:1,user:u:F:4');
      await waitFor(() => got.a.length === 1, 'an event');
      const c = [];
      const reply = subscribed(client, 'c', (e) => c.push(e), { since: 5, epoch: 'EC' });
      const reopened = await fetch.nth(1);
      assert.ok(sse.aborted, 'the old request was aborted first');
      assert.deepEqual(reopened.params, { resume: 'R1', rooms: 'a,c', since: 'a:E:1,user:u:F:4,c:EC:5' });
      reopened.open();
      reopened.welcome('S1', { resume: 'R2', resume_expires_at_ms: FAR() });
      reopened.message('subscribed', { op: 'subscribed', room: 'a', epoch: 'E', seq: 1, recovered: true });
      reopened.message('subscribed', { op: 'subscribed', room: 'c', epoch: 'EC', seq: 6, recovered: true });
      reopened.message('events', events('c', 6), 'a:E:1,c:EC:6');
      assert.equal((await reply).seq, 6);
      await waitFor(() => c.length === 1, 'the new room');
      client.unsubscribe('a');
      const third = await fetch.nth(2);
      assert.deepEqual(third.params, { resume: 'R2', rooms: 'c', since: 'a:E:1,c:EC:6' });
      assert.equal(getToken.calls(), 1);
      assert.equal(log.disconnected.length, 0, 'a reopen is not a disconnect');
      assert.equal(log.connected.length, 1);
      assert.deepEqual(log.recovered.map((r) => r.room), ['c'], 'the new room recovered from its since; the others are not news');
      assert.equal(client.state, 'connected');
    } finally {
      client.close();
    }
  });

  test('a gap reopens the stream from the last delivered seq; 401 resume_invalid drops the credential at once', async () => {
    const { fetch, getToken, client, got, sse } = await streaming(['a']);
    try {
      sse.message('events', events('a', 1), 'a:E:1');
      sse.message('events', events('a', 4), 'a:E:4'); // 2 and 3 missing
      const reopened = await fetch.nth(1);
      assert.equal(reopened.params.since, 'a:E:1', 'from what the app has, not from the last id');
      assert.deepEqual(seqs(got.a), [1]);
      reopened.respond(401, { error: { code: 'resume_invalid', message: 'resume credential was already used' } });
      const withToken = await fetch.nth(2);
      assert.deepEqual(withToken.params, { token: 't2', session: 'S1', rooms: 'a', since: 'a:E:1' });
      assert.equal(getToken.calls(), 2);
      withToken.open();
      withToken.welcome('S1', { resume: 'R3', resume_expires_at_ms: FAR() });
      withToken.message('subscribed', { op: 'subscribed', room: 'a', epoch: 'E', seq: 4, recovered: true });
      withToken.message('events', events('a', 2, 3, 4), 'a:E:4');
      await waitFor(() => got.a.length === 4, 'the gap filled');
      assert.deepEqual(seqs(got.a), [1, 2, 3, 4]);
    } finally {
      client.close();
    }
  });

  test('close codes: 4000-4499 back off, 4500-4999 stop; a silent stream is given up after 3 heartbeats', async () => {
    const { fetch, client, log, sse } = await streaming(['a'], { timings: { backoffMs: [30] }, heartbeatMs: 40 });
    try {
      // `: ping` every 20 ms keeps it alive well past 3 heartbeats (120 ms).
      for (let i = 0; i < 10; i++) {
        sse.send(': ping\n\n');
        await pace(20, 'a ping every 20 ms, across three heartbeats');
      }
      assert.equal(fetch.streams.length, 1);
      const before = Date.now();
      const next = fetch.nth(1);
      // Silence: given up after 3 heartbeats, then a reconnect with the credential.
      const reopened = await next;
      assert.ok(Date.now() - before >= 100, `gave up after ${Date.now() - before} ms`);
      assert.match(log.disconnected[0].reason, /nothing heard from the server for 120 ms/);
      assert.equal(reopened.params.resume, 'R1');
      reopened.open();
      reopened.welcome('S1', { resume: 'R2', resume_expires_at_ms: FAR() });
      reopened.message('close', { code: 4009, reason: 'slow consumer' });
      const third = await fetch.nth(2);
      assert.deepEqual(log.disconnected.at(-1).code, 4009);
      assert.ok(log.disconnected.at(-1).reconnectInMs <= 30);
      third.open();
      third.welcome('S1', { resume: 'R3', resume_expires_at_ms: FAR() });
      third.message('close', { code: 4502, reason: 'kicked' });
      await letTimePass(100, 'past the backoff: no reconnect after 4502');
      assert.equal(fetch.streams.length, 3, 'no reconnect after 4502');
      assert.equal(client.state, 'closed');
      assert.deepEqual(log.disconnected.at(-1), { code: 4502, reason: 'kicked', reconnectInMs: null });
    } finally {
      client.close();
    }
  });

  test('a refused room (403) rejects that subscription only; the others stay', async () => {
    const { fetch, client, log, sse } = await streaming(['a']);
    try {
      const refused = subscribed(client, 'user:other', () => {});
      const reopened = await fetch.nth(1);
      assert.equal(reopened.params.rooms, 'a,user:other');
      assert.ok(sse.aborted);
      reopened.respond(403, { error: { code: 'forbidden', message: 'room user:other is not allowed' } });
      await assert.rejects(refused, (e) => e.code === 'forbidden');
      const again = await fetch.nth(2);
      assert.equal(again.params.rooms, 'a');
      assert.ok(log.error.some((e) => e.room === 'user:other' && e.code === 'forbidden'));
      assert.equal(client.position('user:other'), null);
    } finally {
      client.close();
    }
  });

  test('a refusal names its room in a field: that room is refused, the other new one stays (the message is never read)', async () => {
    const { fetch, client, log } = await streaming(['a']);
    try {
      const kept = client.subscribe('b', { state: false });
      const refused = client.subscribe('c', { state: false });
      const reopened = await fetch.nth(1);
      assert.equal(reopened.params.rooms, 'a,b,c');
      reopened.respond(403, { error: { code: 'forbidden', room: 'c', message: 'b b b' } });
      await assert.rejects(refused.ready(), (e) => e.code === 'forbidden');
      const again = await fetch.nth(2);
      assert.equal(again.params.rooms, 'a,b');
      assert.equal(kept.state, 'subscribing');
      assert.deepEqual(log.error.filter((e) => e.room).map((e) => [e.room, e.code]), [['c', 'forbidden']]);
      // Without the field (an older server), every room not yet subscribed is a suspect.
      const other = client.subscribe('d', { state: false });
      again.open();
      again.welcome('S1');
      const third = await fetch.nth(3);
      assert.equal(third.params.rooms, 'a,b,d');
      third.respond(403, { error: { code: 'forbidden', message: 'room d is not allowed' } });
      await assert.rejects(other.ready(), (e) => e.code === 'forbidden');
      assert.equal(kept.state, 'unsubscribed', 'b was not subscribed yet either');
    } finally {
      client.close();
    }
  });
});

test('EventStreamParser: the standard rules, in every split of the input', () => {
  const input = '\ufeff: hi\r\nevent: events\r\nid: 1\r\ndata: a\r\ndata:b\r\ndata\r\n\r\nevent: close\rdata: {"code":1012}\r\rretry: 5\nid\ndata:  x\n\ndata: no end';
  const expected = [
    { type: 'events', data: 'a\nb\n', id: '1' },
    { type: 'close', data: '{"code":1012}', id: undefined },
    { type: 'message', data: ' x', id: '' },
  ];
  for (let cut = 0; cut <= input.length; cut++) {
    for (const step of [1, 2, 7]) {
      const seen = [];
      const comments = [];
      const parser = new EventStreamParser((m) => seen.push(m), (c) => comments.push(c));
      parser.push(input.slice(0, cut));
      for (let i = cut; i < input.length; i += step) parser.push(input.slice(i, i + step));
      parser.end();
      assert.deepEqual(seen, expected, `cut at ${cut}, step ${step}`);
      assert.deepEqual(comments, ['hi']);
    }
  }
  // Bounded: a message (or a line) over the limit throws instead of growing.
  const small = new EventStreamParser(() => {}, () => {}, 100);
  small.push(`data: ${'x'.repeat(50)}\n`);
  assert.throws(() => small.push(`data: ${'y'.repeat(50)}\n`), RangeError);
  assert.throws(() => new EventStreamParser(() => {}, () => {}, 100).push('z'.repeat(101)), RangeError);
  assert.equal(sseEndpointOf('ws://h:1/v1/ws'), 'http://h:1/v1/sse');
  assert.equal(sseEndpointOf('https://h/base/'), 'https://h/base/v1/sse');
});
