// livegate.js client publish against the real server: `publish(room, data)`
// resolves with the stored seq once the server answers `published`, another client
// receives the event with `from`, a repeated id is a duplicate with the first seq, a
// room outside the token's patterns rejects with `forbidden`, and over SSE publish
// rejects with `unsupported`. Run: `node --test tests/js/`.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { connect } from '../../clients/js/livegate.js';
import { WebSocketImpl, api, mintToken, nextEvent, startServer, tempDir, waitFor } from './support/server.mjs';
import { REAL_SERVER_TIMINGS, subscribed } from './support/clients.mjs';

const FAST = REAL_SERVER_TIMINGS;

async function publishToken(base, user, publish) {
  const { body } = await api(base, 'POST', '/v1/tokens', { user, device: 'web', ttl_secs: 60, publish });
  return body.token;
}

describe('livegate.js publish against a real server', () => {
  let server;
  before(async () => {
    server = await startServer({ dataDir: tempDir().dir });
  });
  after(async () => {
    await server?.stop();
  });

  test('publish resolves with the seq; others get the event with from; a repeated id is a duplicate; outside the patterns is forbidden', { timeout: 30_000 }, async () => {
    const base = server.url;
    const reader = connect({ url: base, WebSocket: WebSocketImpl, timings: FAST, getToken: () => mintToken(base, 'bob') });
    const writer = connect({
      url: base,
      WebSocket: WebSocketImpl,
      timings: FAST,
      getToken: () => publishToken(base, 'alice', ['chat:*']),
    });
    const got = [];
    try {
      await subscribed(reader, 'chat:js', (event) => got.push(event));
      const first = await writer.publish('chat:js', { text: 'hi' }, { id: 'js-1' });
      assert.deepEqual(first, { seq: 1, duplicate: false, id: 'js-1' });
      const second = await writer.publish('chat:js', { text: 'again' });
      assert.equal(second.seq, 2);
      assert.equal(second.duplicate, false);
      assert.match(second.id, /^c-[0-9a-f]{16}$/, 'an id is made up when none is given');
      assert.deepEqual(await writer.publish('chat:js', { text: 'hi' }, { id: 'js-1' }), { seq: 1, duplicate: true, id: 'js-1' });

      await assert.rejects(writer.publish('news', { text: 'no' }), (error) => error.code === 'forbidden');
      await assert.rejects(writer.publish('user:alice', { text: 'no' }), (error) => error.code === 'forbidden');
      // The connection stays usable after a refusal.
      assert.equal((await writer.publish('chat:js', { n: 3 })).seq, 3);

      await waitFor(() => got.length >= 3, 'three events');
      assert.deepEqual(got.map((e) => [e.seq, e.from]), [[1, 'alice'], [2, 'alice'], [3, 'alice']]);
      assert.deepEqual(got[0].data, { text: 'hi' });

      // A reader without publish rights is refused.
      await assert.rejects(reader.publish('chat:js', { n: 4 }), (error) => error.code === 'forbidden');
    } finally {
      reader.close();
      writer.close();
    }
  });

  test('over SSE publish rejects with unsupported', { timeout: 30_000 }, async () => {
    const base = server.url;
    const client = connect({ url: base, transports: ['sse'], timings: FAST, getToken: () => publishToken(base, 'sse-user', ['chat:*']) });
    try {
      const connected = nextEvent(client, 'connected');
      await subscribed(client, 'chat:sse', () => {});
      const info = await connected;
      assert.equal(info.transport, 'sse');
      await assert.rejects(client.publish('chat:sse', { text: 'hi' }), (error) => error.code === 'unsupported');
    } finally {
      client.close();
    }
  });
});
