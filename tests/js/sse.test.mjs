// livegate.js over Server-Sent Events against the real server (issue 18):
// `auto` behind a proxy that refuses WebSocket upgrades falls back to SSE and delivers
// every event once, in order, across a dropped stream and a server restart; `sse`
// reopens its stream on subscribe/unsubscribe with the resume credential and the cursor
// and loses nothing; a kicked stream (4502) stops for good; a refused credential is
// dropped at the first 401. Needs a binary with /v1/sse. Run: `node --test tests/js/`.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { connect } from '../../clients/js/livegate.js';
import {
  WebSocketImpl,
  api,
  metric,
  mintToken,
  nextEvent,
  publish,
  letTimePass,
  pace,
  startProxy,
  startServer,
  startServerOnPort,
  tempDir,
  waitFor,
} from './support/server.mjs';
import { REAL_SERVER_TIMINGS, recorder, subscribed } from './support/clients.mjs';

const FAST = REAL_SERVER_TIMINGS;
const range = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

async function publishRange(base, room, from, to) {
  for (let n = from; n <= to; n++) await publish(base, room, { n }, `${room}-${n}`);
}

describe('livegate.js over SSE against a real server', () => {
  for (const refuseUpgrade of ['answer', 'reset']) {
    test(`auto behind a proxy that ${refuseUpgrade === 'answer' ? 'answers 502 to' : 'resets'} WebSocket upgrades: SSE, every seq once and in order, across a dropped stream and a restart`, { timeout: 60_000 }, async () => {
      const data = tempDir();
      let server = await startServer({ dataDir: data.dir });
      const base = server.url;
      const proxy = await startProxy(server.port, { refuseUpgrade });
      let calls = 0;
      const client = connect({
        url: proxy.url,
        WebSocket: WebSocketImpl,
        timings: FAST,
        getToken: async () => {
          calls += 1;
          return mintToken(base, 'sam', 'web');
        },
      });
      const log = recorder(client);
      const got = [];
      try {
        await subscribed(client, 'sse:auto', (e) => got.push(e.seq));
        assert.equal(client.transport, 'sse');
        assert.equal(proxy.upgradesRefused(), 2, 'two WebSocket attempts, then SSE');
        assert.deepEqual(log.transport.map((t) => [t.from, t.to]), [['websocket', 'sse']]);
        assert.equal(log.connected[0].transport, 'sse');
        const initialCalls = calls;

        await publishRange(base, 'sse:auto', 1, 5);
        await waitFor(() => got.length === 5, 'events over SSE');

        // The stream is cut without an `event: close`.
        const cut = nextEvent(client, 'disconnected');
        proxy.dropAll();
        assert.equal((await cut).code, 1006);
        await publishRange(base, 'sse:auto', 6, 10);
        await waitFor(() => got.length === 10, 'the events around the cut');

        // A drain (event: close 1012) and a restart on the same data dir and port.
        const drained = nextEvent(client, 'disconnected', 15_000, (d) => d.code !== 1006);
        const stopping = server.stop('SIGTERM');
        assert.equal((await drained).code, 1012);
        assert.deepEqual(await stopping, { code: 0, signal: null });
        server = await startServerOnPort({ dataDir: data.dir, port: server.port });
        await publishRange(base, 'sse:auto', 11, 15);
        await waitFor(() => got.length === 15 && client.state === 'connected', 'the events missed during the restart', 20_000);
        await publishRange(base, 'sse:auto', 16, 18);
        await waitFor(() => got.length === 18, 'live after the restart');
        await letTimePass(300, 'no event arrives twice');

        assert.deepEqual(got, range(1, 18));
        assert.equal(client.transport, 'sse', 'still SSE');
        assert.equal(proxy.upgradesRefused(), 2, 'no WebSocket attempt after the fallback');
        assert.equal(calls, initialCalls, 'reconnects used the resume credential');
        assert.ok(log.connected.slice(1).every((c) => c.credential === 'resume' && c.transport === 'sse'));
        assert.deepEqual(log.recovery_failed, []);
      } finally {
        client.close();
        await proxy.close();
        await server.stop('SIGKILL');
        data.remove();
      }
    });
  }

  test('transport sse: subscribe and unsubscribe reopen the stream with resume and the cursor, and lose nothing', { timeout: 60_000 }, async () => {
    const data = tempDir();
    const server = await startServer({ dataDir: data.dir });
    const base = server.url;
    let calls = 0;
    const client = connect({
      url: base,
      transports: ['sse'],
      timings: FAST,
      getToken: async () => {
        calls += 1;
        return mintToken(base, 'stella', 'web');
      },
    });
    const log = recorder(client);
    const got = { a: [], b: [], c: [] };
    const handler = (room) => (e) => got[room].push(e.seq);
    try {
      assert.equal(client.transport, 'sse');
      await subscribed(client, 'sse:a', handler('a'));
      // Room a is published to all along; rooms b and c come and go under it.
      let stop = false;
      let published = 0;
      const publisher = (async () => {
        while (!stop) {
          published += 1;
          await publish(base, 'sse:a', { n: published }, `a-${published}`);
          await pace(5, 'room a gets an event every 5 ms');
        }
      })();
      await subscribed(client, 'sse:b', handler('b'));
      await publishRange(base, 'sse:b', 1, 3);
      await waitFor(() => got.b.length === 3, 'room b');
      await subscribed(client, 'sse:c', handler('c'));
      const left = client.position('sse:b');
      client.unsubscribe('sse:b');
      await publishRange(base, 'sse:b', 4, 5); // not delivered: unsubscribed
      await publishRange(base, 'sse:c', 1, 4);
      await waitFor(() => got.c.length === 4, 'room c');
      // b again, from where it was left (the app says so): 4 and 5 are replayed.
      await subscribed(client, 'sse:b', handler('b'), { since: left.seq, epoch: left.epoch });
      await publishRange(base, 'sse:b', 6, 6);
      await waitFor(() => got.b.length === 6, 'room b again');
      client.unsubscribe('sse:c');
      await pace(200, 'room a is published to across the last reopen');
      stop = true;
      await publisher;
      await waitFor(() => got.a.length === published, `all ${published} events of room a`, 15_000);
      await letTimePass(300, 'no event arrives twice');

      assert.deepEqual(got.a, range(1, published), 'room a: every event once, in order, across the reopens');
      assert.deepEqual(got.c, [1, 2, 3, 4]);
      assert.deepEqual(left.seq, 3);
      assert.deepEqual(got.b, [1, 2, 3, 4, 5, 6], 'room b: 4 and 5 replayed from the since it was subscribed with again');
      // One token, every reopen on the resume credential. (A second one was minted, rarely,
      // when the first attempt met the server still reconciling at start: a refusal that
      // spends nothing. startServer waits for /readyz now.)
      assert.equal(calls, 1, `${calls} tokens: every reopen used the resume credential`);
      assert.equal(log.disconnected.length, 0, 'reopens are not disconnects');
      assert.equal(log.connected.length, 1);
      const reopens = await metric(base, 'livegate_handshakes_total', { credential: 'resume' });
      assert.ok(reopens >= 4, `${reopens} streams opened with a resume credential`);
      await assert.rejects(client.history('sse:a', 0, 10), (e) => e.code === 'unsupported');
    } finally {
      client.close();
      await server.stop('SIGKILL');
      data.remove();
    }
  });

  test('transport sse: a kicked stream (4502) stops for good', { timeout: 20_000 }, async () => {
    const data = tempDir();
    const server = await startServer({ dataDir: data.dir });
    const base = server.url;
    let calls = 0;
    const client = connect({ url: base, transports: ['sse'], timings: FAST, getToken: () => (calls++, mintToken(base, 'kit', 'web')) });
    const log = recorder(client);
    try {
      await subscribed(client, 'sse:kick', () => {});
      const kicked = nextEvent(client, 'disconnected');
      const { body } = await api(base, 'DELETE', '/v1/users/kit/connections');
      assert.deepEqual(body, { closed: 1 });
      const detail = await kicked;
      assert.equal(detail.code, 4502, JSON.stringify(detail));
      assert.equal(detail.reconnectInMs, null);
      await letTimePass(1000, 'many times the backoff: a kicked stream does not reopen');
      assert.equal(client.state, 'closed');
      assert.equal(calls, 1);
      assert.equal(log.connecting.length, 1);
      assert.equal(client.hasResume, false);
    } finally {
      client.close();
      await server.stop('SIGKILL');
      data.remove();
    }
  });

  test('transport sse: a refused credential (data dir wiped) is dropped at the first 401', { timeout: 30_000 }, async () => {
    const data = tempDir();
    let server = await startServer({ dataDir: data.dir });
    const port = server.port;
    let calls = 0;
    const client = connect({
      url: server.url,
      transports: ['sse'],
      timings: FAST,
      getToken: async () => {
        calls += 1;
        return mintToken(server.url, 'wade', 'web');
      },
    });
    const log = recorder(client);
    try {
      await subscribed(client, 'sse:wipe', () => {});
      await server.stop('SIGKILL');
      data.remove();
      server = await startServerOnPort({ dataDir: data.dir, port });
      await waitFor(() => log.connected.length === 2, 'connected again', 20_000);
      assert.equal(log.connected[1].credential, 'token');
      assert.equal(calls, 2);
      assert.equal(await metric(server.url, 'livegate_handshake_rejections_total', { reason: 'resume_invalid' }), 1);
      assert.ok(log.error.some((e) => e.code === 'resume_invalid'));
    } finally {
      client.close();
      await server.stop('SIGKILL');
      data.remove();
    }
  });
});
