// livegate.js basics against the real server: every request has a timeout (and takes an
// AbortSignal), so publish() to a server that went away rejects instead of pending
// forever; the `debug` option logs the connection's life without credentials; connect()
// and disconnect() start and stop the client explicitly; getToken() can say "signed
// out" and the client stops without retrying; a `warning` says when SSE cannot publish.
// Run: `node --test tests/js/`.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { LivegateError, connect } from '../../clients/js/livegate.js';
import { REAL_SERVER_TIMINGS, recorder, subscribed } from './support/clients.mjs';
import { letTimePass, waitFor } from './support/clock.mjs';
import { WebSocketImpl, api, mintToken, nextEvent, publish, startServer, tempDir } from './support/server.mjs';

const FAST = REAL_SERVER_TIMINGS;

async function publishToken(base, user) {
  const { body } = await api(base, 'POST', '/v1/tokens', { user, device: 'web', ttl_secs: 60, publish: ['chat:*'] });
  return body.token;
}

describe('requests time out and abort', () => {
  let server;
  let data;
  before(async () => {
    data = tempDir();
    server = await startServer({ dataDir: data.dir });
  });
  after(async () => {
    await server?.stop();
    data?.remove();
  });

  test('publish to a frozen server rejects with timeout (the default and per call); an AbortSignal rejects with aborted', { timeout: 30_000 }, async () => {
    const base = server.url;
    const client = connect({ url: base, WebSocket: WebSocketImpl, timings: FAST, requestTimeoutMs: 800, getToken: () => publishToken(base, 'tim') });
    try {
      await nextEvent(client, 'connected');
      assert.equal((await client.publish('chat:t', { n: 1 })).seq, 1, 'a live server answers');
      await assert.rejects(client.publish('chat:t', { n: 2 }, { signal: AbortSignal.abort(new Error('user left')) }), (e) => {
        assert.ok(e instanceof LivegateError);
        assert.equal(e.code, 'aborted');
        assert.equal(e.cause?.message, 'user left', 'the signal reason is the cause');
        return true;
      });

      // The server stops answering (frozen, its socket still open: no close to notice).
      server.child.kill('SIGSTOP');
      try {
        const started = Date.now();
        const pending = client.publish('chat:t', { n: 3 }, { id: 'frozen-1' });
        await assert.rejects(pending, (e) => e instanceof LivegateError && e.code === 'timeout' && /no reply within 800 ms/.test(e.message));
        const waited = Date.now() - started;
        assert.ok(waited >= 750 && waited < 5000, `rejected after the timeout, not before and not much later: ${waited} ms`);
        await assert.rejects(client.history('chat:t', 0, 10, { timeoutMs: 200 }), (e) => e.code === 'timeout' && /200 ms/.test(e.message));
        const controller = new AbortController();
        const aborted = client.presence('chat:t', { signal: controller.signal });
        controller.abort();
        await assert.rejects(aborted, (e) => e.code === 'aborted');
      } finally {
        server.child.kill('SIGCONT');
      }
      // Publishing again with the id of the one that timed out is safe: at most one is stored.
      const again = await client.publish('chat:t', { n: 3 }, { id: 'frozen-1', timeoutMs: 10_000 });
      assert.equal(again.seq, 2, 'the frozen request was stored once the server went on, or now: either way seq 2');
      const { body } = await api(base, 'GET', '/v1/rooms/chat%3At/events?since=0&limit=10');
      assert.deepEqual(body.events.map((e) => e.id), [body.events[0].id, 'frozen-1'], 'one event for the id');
    } finally {
      client.close();
    }
  });

  test('a request made while the server is gone waits for a connection, then rejects with timeout', { timeout: 30_000 }, async () => {
    const own = tempDir();
    const gone = await startServer({ dataDir: own.dir });
    const client = connect({ url: gone.url, WebSocket: WebSocketImpl, timings: FAST, requestTimeoutMs: 600, getToken: () => publishToken(gone.url, 'gus') });
    try {
      await nextEvent(client, 'connected');
      const lost = nextEvent(client, 'disconnected');
      await gone.stop('SIGKILL');
      await lost;
      await assert.rejects(client.publish('chat:gone', { n: 1 }), (e) => e.code === 'timeout');
      assert.notEqual(client.state, 'connected');
    } finally {
      client.close();
      own.remove();
    }
  });
});

describe('connect(), disconnect(), debug and signed out', () => {
  let server;
  let data;
  before(async () => {
    data = tempDir();
    server = await startServer({ dataDir: data.dir });
  });
  after(async () => {
    await server?.stop();
    data?.remove();
  });

  test('autoConnect false waits for connect(); disconnect() stops until connect(), which resubscribes and recovers', { timeout: 30_000 }, async () => {
    const base = server.url;
    let tokens = 0;
    const client = connect({ url: base, WebSocket: WebSocketImpl, timings: FAST, autoConnect: false, getToken: () => (tokens++, mintToken(base, 'cora')) });
    const log = recorder(client);
    try {
      await letTimePass(200, 'a client made with autoConnect: false must not attempt on its own');
      assert.equal(tokens, 0, 'no attempt before connect()');
      assert.equal(client.state, 'disconnected');
      const got = [];
      const reply = subscribed(client, 'match:cd', (e) => got.push(e.seq));
      assert.equal(client.connect(), client, 'connect() returns the client');
      await reply;
      await publish(base, 'match:cd', { n: 1 });
      await waitFor(() => got.length === 1, 'the first event');

      client.disconnect();
      assert.equal(client.state, 'disconnected');
      assert.deepEqual(log.disconnected.at(-1), { code: 1000, reason: 'client disconnected', reconnectInMs: null });
      await assert.rejects(client.publish('chat:x', {}), (e) => e.code === 'disconnected' || e.code === 'timeout');
      await publish(base, 'match:cd', { n: 2 });
      const attempts = log.connecting.length;
      await letTimePass(300, 'a disconnected client must not reconnect by itself');
      assert.equal(log.connecting.length, attempts, 'no attempt after disconnect()');
      assert.deepEqual(got, [1]);

      client.connect();
      await waitFor(() => got.length === 2, 'the event published while disconnected, after connect()');
      assert.deepEqual(got, [1, 2]);
      assert.equal(client.state, 'connected');
      client.close();
      assert.throws(() => client.connect(), (e) => e instanceof LivegateError && e.code === 'closed');
    } finally {
      client.close();
    }
  });

  test('debug logs state and transport changes to the given logger, never a token', { timeout: 30_000 }, async () => {
    const base = server.url;
    const lines = [];
    const tokens = [];
    const client = connect({
      url: base,
      WebSocket: WebSocketImpl,
      timings: FAST,
      debug: { debug: (message, detail) => lines.push([message, JSON.stringify(detail)]) },
      getToken: async () => {
        const token = await mintToken(base, 'dora');
        tokens.push(token);
        return token;
      },
    });
    try {
      await nextEvent(client, 'connected');
      client.dropConnection('debug test');
      await waitFor(() => lines.filter(([m]) => m === 'connected').length === 2, 'the reconnect logged');
      const messages = lines.map(([m]) => m);
      assert.ok(messages.includes('state disconnected -> connecting: attempt 1 over websocket'), messages.join('\n'));
      assert.ok(messages.some((m) => /^state connecting -> connected: welcomed by .* over websocket$/.test(m)), messages.join('\n'));
      assert.ok(messages.includes('disconnected'));
      const text = JSON.stringify(lines);
      for (const token of tokens) assert.ok(!text.includes(token), 'no token in the log');
      assert.ok(!/resume=|"resume":"/.test(text), 'no resume credential in the log');
    } finally {
      client.close();
    }
  });

  test('getToken returning null signs out: state disconnected, a signed_out event, no retries; connect() starts again', { timeout: 30_000 }, async () => {
    const base = server.url;
    let signedIn = true;
    let calls = 0;
    const client = connect({
      url: base,
      WebSocket: WebSocketImpl,
      timings: FAST,
      resume: false, // every attempt asks getToken
      getToken: () => {
        calls++;
        return signedIn ? mintToken(base, 'sid') : null;
      },
    });
    const log = recorder(client);
    const signedOut = [];
    client.on('signed_out', (detail) => signedOut.push(detail));
    try {
      await nextEvent(client, 'connected');
      signedIn = false;
      const stopped = nextEvent(client, 'signed_out');
      client.dropConnection('the user signs out elsewhere');
      assert.deepEqual(await stopped, { reason: 'signed out: getToken returned no token' });
      assert.equal(client.state, 'disconnected');
      assert.equal(log.disconnected.at(-1).reconnectInMs, null);
      const asked = calls;
      await assert.rejects(client.publish('chat:x', {}, { timeoutMs: 300 }), (e) => e.code === 'timeout');
      await letTimePass(400, 'a signed-out client must not retry getToken');
      assert.equal(calls, asked, 'getToken is not called again');
      assert.equal(signedOut.length, 1);

      signedIn = true;
      client.connect();
      await waitFor(() => client.state === 'connected', 'connected again after connect()');
    } finally {
      client.close();
    }
  });

  test('getToken throwing a LivegateError with code signed_out or unauthorized stops the client too', { timeout: 30_000 }, async () => {
    for (const code of ['signed_out', 'unauthorized']) {
      let calls = 0;
      const client = connect({
        url: server.url,
        WebSocket: WebSocketImpl,
        timings: FAST,
        getToken: async () => {
          calls++;
          throw new LivegateError(code, 'session cookie expired');
        },
      });
      try {
        assert.deepEqual(await nextEvent(client, 'signed_out'), { reason: 'signed out: session cookie expired' });
        assert.equal(client.state, 'disconnected');
        await letTimePass(300, 'a signed-out client must not retry getToken');
        assert.equal(calls, 1, code);
      } finally {
        client.close();
      }
    }
  });
});

describe('warnings', () => {
  let server;
  let data;
  before(async () => {
    data = tempDir();
    server = await startServer({ dataDir: data.dir });
  });
  after(async () => {
    await server?.stop();
    data?.remove();
  });

  test('on SSE a publish warns and rejects unsupported; a fallback to SSE warns once it happens', { timeout: 30_000 }, async () => {
    const base = server.url;
    const sse = connect({ url: base, transports: ['sse'], timings: FAST, getToken: () => publishToken(base, 'sam') });
    const warnings = [];
    sse.on('warning', (w) => warnings.push(w));
    try {
      await subscribed(sse, 'chat:w', () => {});
      await assert.rejects(sse.publish('chat:w', { n: 1 }), (e) => e.code === 'unsupported');
      assert.deepEqual(warnings.map((w) => w.code), ['unsupported']);
      assert.match(warnings[0].message, /publish needs the WebSocket transport/);
    } finally {
      sse.close();
    }

    // A proxy that breaks the upgrade: the handshake reaches a path with no WebSocket
    // (404), while the server is up, so the client falls back to SSE and warns.
    class BrokenUpgrade extends WebSocketImpl {
      constructor(url) {
        super(url.replace('/v1/ws', '/v1/no-websocket-here'));
      }
    }
    const auto = connect({ url: base, WebSocket: BrokenUpgrade, timings: FAST, getToken: () => publishToken(base, 'sal') });
    const autoWarnings = [];
    auto.on('warning', (w) => autoWarnings.push(w));
    try {
      const pending = auto.publish('chat:w', { n: 2 }, { timeoutMs: 20_000 }).then(() => null, (error) => error);
      const connected = await nextEvent(auto, 'connected', 20_000);
      assert.equal(connected.transport, 'sse');
      assert.equal(autoWarnings[0]?.code, 'fallback', JSON.stringify(autoWarnings));
      assert.match(autoWarnings[0].message, /on SSE from now on .*publish, history and presence reject with unsupported/);
      assert.equal((await pending)?.code, 'unsupported', 'a publish waiting for a connection is told at the fallback');
    } finally {
      auto.close();
    }
  });
});
