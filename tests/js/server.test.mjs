// livegate-client/server, the Node backend helper, against the real server: publish with
// an id that makes a retry safe (an attempt whose answer is lost is sent again and stored
// once), token minting through POST /v1/tokens, JWTs signed with node:crypto (each
// algorithm checked with node:crypto's verify, and an HS256 one connecting to a server
// given LIVEGATE_JWT_HMAC_SECRET), and the signature of a webhook the server really sent.
// Run: `node --test tests/js/`.

import assert from 'node:assert/strict';
import { createHmac, generateKeyPairSync, verify } from 'node:crypto';
import http from 'node:http';
import { after, before, describe, test } from 'node:test';

import { connect } from '../../clients/js/livegate.js';
import { LivegateError, LivegateServer, WEBHOOK_SIGNATURE_HEADER, parseWebhook, signToken, verifyWebhook, webhookSignature } from '../../clients/js/server.js';
import { REAL_SERVER_TIMINGS, subscribed } from './support/clients.mjs';
import { waitFor } from './support/clock.mjs';
import { API_KEY, WebSocketImpl, api, startServer, tempDir } from './support/server.mjs';

const FAST = REAL_SERVER_TIMINGS;

/** A JWT's three parts decoded: {header, payload, input, signature}. */
function decode(jwt) {
  const [h, p, s] = jwt.split('.');
  return {
    header: JSON.parse(Buffer.from(h, 'base64url').toString()),
    payload: JSON.parse(Buffer.from(p, 'base64url').toString()),
    input: Buffer.from(`${h}.${p}`),
    signature: Buffer.from(s, 'base64url'),
  };
}

/**
 * An HTTP front for `target` that forwards the first `lose` requests to it and then drops
 * the connection instead of answering: the request was handled, its answer is lost.
 */
async function answerLosingProxy(target, lose) {
  const seen = [];
  const proxy = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const body = Buffer.concat(chunks);
    seen.push(JSON.parse(body.toString() || 'null'));
    const answer = await fetch(target + req.url, { method: req.method, headers: { authorization: req.headers.authorization, 'content-type': 'application/json' }, body });
    const text = await answer.text();
    if (seen.length <= lose) {
      req.socket.destroy();
      return;
    }
    res.writeHead(answer.status, { 'content-type': 'application/json' });
    res.end(text);
  });
  await new Promise((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${proxy.address().port}`, seen, close: () => new Promise((resolve) => proxy.close(resolve)) };
}

describe('LivegateServer against a real server', () => {
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

  test('publish stores once per id: an attempt whose answer was lost is retried and answers duplicate with the first seq', { timeout: 30_000 }, async () => {
    const direct = new LivegateServer({ url: server.url, apiKey: API_KEY });
    const first = await direct.publish('news:srv', { n: 1 }, { id: 'srv-1' });
    assert.deepEqual({ ...first, epoch: typeof first.epoch }, { room: 'news:srv', seq: 1, epoch: 'string', duplicate: false, id: 'srv-1' });
    const made = await direct.publish('news:srv', { n: 2 });
    assert.match(made.id, /^s-[0-9a-f]{16}$/, 'an id is made up when none is given');
    assert.equal(made.seq, 2);

    const proxy = await answerLosingProxy(server.url, 1);
    try {
      const flaky = new LivegateServer({ url: proxy.url, apiKey: API_KEY, retryDelayMs: 10 });
      const retried = await flaky.publish('news:srv', { n: 3 });
      assert.equal(proxy.seen.length, 2, 'sent twice');
      assert.equal(proxy.seen[0].id, proxy.seen[1].id, 'with the same id');
      assert.deepEqual([retried.seq, retried.duplicate], [3, true], 'the lost attempt was stored: the retry is its duplicate');
      const { body } = await api(server.url, 'GET', '/v1/rooms/news%3Asrv/events?since=0&limit=10');
      assert.deepEqual(body.events.map((e) => e.data.n), [1, 2, 3], 'stored once');
    } finally {
      await proxy.close();
    }
  });

  test('publish refusals reject at once with the server code; a wrong key is unauthorized', { timeout: 30_000 }, async () => {
    const lg = new LivegateServer({ url: server.url, apiKey: API_KEY });
    await assert.rejects(lg.publish('bad room!', {}), (e) => e instanceof LivegateError && e.code === 'bad_room' && e.status === 400);
    const wrong = new LivegateServer({ url: server.url, apiKey: 'not-the-key-0123456789' });
    await assert.rejects(wrong.mintToken({ user: 'x' }), (e) => e.code === 'unauthorized' && e.status === 401);
    const nowhere = new LivegateServer({ url: 'http://127.0.0.1:9', apiKey: API_KEY, retries: 2, retryDelayMs: 1 });
    await assert.rejects(nowhere.publish('news:x', {}), (e) => e.code === 'unreachable');
  });

  test('mintToken makes a token a livegate.js client connects with, limited to its rooms', { timeout: 30_000 }, async () => {
    const lg = new LivegateServer({ url: server.url, apiKey: API_KEY });
    const minted = await lg.mintToken({ user: 'mia', rooms: ['match:*'], ttlSecs: 30 });
    assert.equal(typeof minted.token, 'string');
    assert.ok(minted.expiresAtMs > Date.now() && minted.expiresAtMs <= Date.now() + 31_000, 'expires within its ttl');
    const client = connect({ url: server.url, WebSocket: WebSocketImpl, timings: FAST, getToken: () => lg.mintToken({ user: 'mia', rooms: ['match:*'] }) });
    try {
      const got = [];
      await subscribed(client, 'match:mint', (e) => got.push(e.data));
      await assert.rejects(subscribed(client, 'news:mint', () => {}), (e) => e.code === 'forbidden');
      await lg.publish('match:mint', { goal: true });
      await waitFor(() => got.length === 1, 'the event');
      assert.deepEqual(got, [{ goal: true }]);
    } finally {
      client.close();
    }
  });
});

describe('signToken', () => {
  const SECRET = 'a-shared-secret-of-at-least-32-bytes!';

  test('HS256: the claims livegate reads, signed with HMAC-SHA256 of the secret', () => {
    const now = Date.UTC(2026, 0, 1);
    const jwt = signToken({ user: 'ann', rooms: ['match:*'], publish: ['chat:*'], cell: 'eu', ttlSecs: 120, key: SECRET, now });
    const { header, payload, input, signature } = decode(jwt);
    assert.deepEqual(header, { alg: 'HS256', typ: 'JWT' });
    assert.equal(payload.sub, 'ann');
    assert.equal(payload.device, 'web', 'device defaults to web');
    assert.deepEqual(payload.rooms, ['match:*']);
    assert.deepEqual(payload.publish, ['chat:*']);
    assert.equal(payload.cell, 'eu');
    assert.equal(payload.iat, now / 1000);
    assert.equal(payload.exp, now / 1000 + 120);
    assert.match(payload.jti, /^[A-Za-z0-9_-]{22}$/, '16 random bytes, base64url');
    assert.deepEqual(signature, createHmac('sha256', SECRET).update(input).digest());
    assert.notEqual(decode(signToken({ user: 'ann', key: SECRET })).payload.jti, payload.jti, 'a new jti each time');
    assert.equal('cell' in decode(signToken({ user: 'ann', key: SECRET })).payload, false, 'no cell unless given');
    assert.throws(() => signToken({ user: 'ann', key: 'short' }), /at least 32 bytes/);
    assert.throws(() => signToken({ key: SECRET }), /user is required/);
  });

  for (const [alg, type, options, verifyOptions] of [
    ['RS256', 'rsa', { modulusLength: 2048 }, (key) => key],
    ['ES256', 'ec', { namedCurve: 'P-256' }, (key) => ({ key, dsaEncoding: 'ieee-p1363' })],
    ['EdDSA', 'ed25519', {}, (key) => key],
  ]) {
    test(`${alg}: a PEM ${type} private key signs; node:crypto verifies it with the public key`, () => {
      const { privateKey, publicKey } = generateKeyPairSync(type, options);
      const pem = privateKey.export({ type: 'pkcs8', format: 'pem' });
      const jwt = signToken({ user: 'bo', device: 'phone', key: pem, keyId: 'k1', issuer: 'backend', audience: 'livegate' });
      const { header, payload, input, signature } = decode(jwt);
      assert.deepEqual(header, { alg, typ: 'JWT', kid: 'k1' });
      assert.deepEqual([payload.sub, payload.device, payload.iss, payload.aud], ['bo', 'phone', 'backend', 'livegate']);
      const publicPem = publicKey.export({ type: 'spki', format: 'pem' });
      assert.ok(verify(alg === 'EdDSA' ? null : 'sha256', input, verifyOptions(publicPem), signature), `${alg} signature verifies`);
      if (alg === 'ES256') assert.equal(signature.length, 64, 'ES256 signatures are r||s (JOSE), not DER');
      assert.ok(!verify(alg === 'EdDSA' ? null : 'sha256', Buffer.from(`${input}x`), verifyOptions(publicPem), signature), 'and fails for other bytes');
    });
  }

  test('an EC key off P-256 is refused', () => {
    const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'secp384r1' });
    assert.throws(() => signToken({ user: 'x', key: privateKey }), /P-256/);
  });

  test('a JWT signed with HS256 connects livegate.js to a server given LIVEGATE_JWT_HMAC_SECRET, once', { timeout: 30_000 }, async () => {
    const data = tempDir();
    const jwtServer = await startServer({ dataDir: data.dir, env: { LIVEGATE_JWT_HMAC_SECRET: SECRET } });
    const tokens = [];
    const client = connect({
      url: jwtServer.url,
      WebSocket: WebSocketImpl,
      timings: FAST,
      getToken: () => {
        tokens.push(signToken({ user: 'jay', rooms: ['match:*'], key: SECRET }));
        return tokens.at(-1);
      },
    });
    try {
      const got = [];
      await subscribed(client, 'match:jwt', (e) => got.push(e.data));
      await new LivegateServer({ url: jwtServer.url, apiKey: API_KEY }).publish('match:jwt', { n: 1 });
      await waitFor(() => got.length === 1, 'the event over a JWT connection');
      // The JWT that opened the connection again: its jti was spent.
      const replay = await fetch(`${jwtServer.url}/v1/sse?token=${encodeURIComponent(tokens.at(-1))}&rooms=match:jwt`, { signal: AbortSignal.timeout(10_000) });
      assert.equal(replay.status, 401);
      assert.equal((await replay.json()).error.code, 'token_replayed');
    } finally {
      client.close();
      await jwtServer.stop();
      data.remove();
    }
  });
});

describe('webhooks', () => {
  const SECRET = 'webhook-secret-for-the-js-test';
  let receiver;
  let server;
  let data;
  const received = [];
  before(async () => {
    receiver = http.createServer(async (req, res) => {
      const chunks = [];
      for await (const chunk of req) chunks.push(chunk);
      received.push({ body: Buffer.concat(chunks), signature: req.headers[WEBHOOK_SIGNATURE_HEADER.toLowerCase()] });
      res.writeHead(204).end();
    });
    await new Promise((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    data = tempDir();
    server = await startServer({
      dataDir: data.dir,
      args: ['--webhook-url', `http://127.0.0.1:${receiver.address().port}/hooks`, '--webhook-secret', SECRET],
    });
  });
  after(async () => {
    await server?.stop();
    data?.remove();
    await new Promise((resolve) => receiver?.close(resolve));
  });

  test('verifyWebhook accepts the signature of a webhook the server sent, and nothing altered', { timeout: 30_000 }, async () => {
    const client = connect({ url: server.url, WebSocket: WebSocketImpl, timings: FAST, getToken: () => new LivegateServer({ url: server.url, apiKey: API_KEY }).mintToken({ user: 'hank' }) });
    try {
      await subscribed(client, 'match:hook', () => {});
      const hook = await waitFor(() => received.find((r) => JSON.parse(r.body).room === 'match:hook'), 'the room_occupied webhook');
      assert.ok(verifyWebhook(hook.body, hook.signature, SECRET), 'the raw bytes as received');
      assert.ok(verifyWebhook(hook.body.toString(), hook.signature, SECRET), 'or as a string');
      assert.equal(webhookSignature(hook.body, SECRET), hook.signature);
      const parsed = parseWebhook(hook.body, hook.signature, SECRET);
      assert.equal(parsed.type, 'room_occupied');
      assert.equal(parsed.room, 'match:hook');

      const altered = Buffer.from(hook.body.toString().replace('match:hook', 'match:hoo0'));
      assert.equal(verifyWebhook(altered, hook.signature, SECRET), false, 'another body');
      assert.equal(verifyWebhook(hook.body, hook.signature, 'another secret'), false, 'another secret');
      assert.equal(verifyWebhook(hook.body, undefined, SECRET), false, 'no header');
      assert.equal(verifyWebhook(hook.body, hook.signature.slice(0, -2), SECRET), false, 'a cut signature');
      assert.throws(() => parseWebhook(altered, hook.signature, SECRET), (e) => e instanceof LivegateError && e.code === 'bad_signature');
    } finally {
      client.close();
    }
  });
});
