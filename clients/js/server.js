// livegate-client/server: the backend helper for Node (18+; node:crypto and fetch). Your
// backend publishes events, mints tokens through the server, signs tokens itself (JWT) and
// checks the webhooks the server sends. Never load this in a browser: it holds the API key
// and the signing keys.
//
//   import { LivegateServer, signToken, verifyWebhook } from 'livegate-client/server';
//   const livegate = new LivegateServer({ url: 'http://127.0.0.1:7070', apiKey: process.env.LIVEGATE_API_KEY });
//   await livegate.publish('match:1', { home: 1 }, { id: 'goal-17' });   // retried with the same id
//   const { token } = await livegate.mintToken({ user: 'alice', rooms: ['match:*'] });
//   const jwt = signToken({ user: 'alice', rooms: ['match:*'], key: process.env.LIVEGATE_JWT_SECRET });
//   if (!verifyWebhook(rawBody, req.headers['x-livegate-signature'], secret)) return 401;
//
// - publish(room, data, {id, state, signal, timeoutMs, retries}): `POST /v1/rooms/{room}/events`.
//   The id (default: a random one) makes a retry safe: an attempt that failed without an
//   answer (no connection, a timeout, 408, 429, 5xx) is sent again with the same id, and
//   the server stores it at most once (`duplicate: true` with the first seq when the lost
//   attempt had been stored). Other refusals reject at once with the server's error code.
// - mintToken({user, device, ttlSecs, rooms, publish, cell}): `POST /v1/tokens`, the
//   server's one-time token.
// - signToken({user, device, rooms, publish, cell, ttlSecs, key, ...}): a JWT the server
//   accepts when it is configured with the matching key: HS256 with a shared secret (a
//   string or bytes, at least 32 bytes), or RS256 / ES256 (P-256) / EdDSA (Ed25519) with a
//   PEM private key (the algorithm follows the key). Claims: `sub`, `device` ("web"),
//   `rooms`, `publish`, `cell` (when given), `iat`, `exp` (iat + ttlSecs), `jti` (16
//   random bytes, base64url: each token connects once).
// - verifyWebhook(rawBody, signatureHeader, secret): whether `X-Livegate-Signature` is
//   `sha256=` + the lowercase hex HMAC-SHA256 of the raw body under `webhook_secret`,
//   compared in constant time. Check the bytes received, before parsing them.

import { createHmac, createPrivateKey, randomBytes, sign as cryptoSign, timingSafeEqual } from 'node:crypto';

import { LivegateError } from './livegate/errors.js';

export { LivegateError };

/** The header livegate signs each webhook in. */
export const WEBHOOK_SIGNATURE_HEADER = 'X-Livegate-Signature';
/** Default request timeout of LivegateServer, in milliseconds. */
export const DEFAULT_SERVER_TIMEOUT_MS = 10000;
/** Default attempts of an idempotent publish. */
export const DEFAULT_PUBLISH_ATTEMPTS = 3;
/** HTTP statuses an idempotent request is tried again after. */
const RETRIED_STATUSES = new Set([408, 429, 500, 502, 503, 504]);

/** A livegate server as your backend sees it: its URL and API key. */
export class LivegateServer {
  /**
   * `url`: the server's base URL (http(s)://); `apiKey`: its `api_key`; `timeoutMs`: each
   * request's timeout (default 10 s); `retries`: attempts of a publish (default 3);
   * `retryDelayMs`: the first pause between them (doubling); `fetch`: the fetch function
   * (default: the global one).
   */
  constructor({ url, apiKey, timeoutMs = DEFAULT_SERVER_TIMEOUT_MS, retries = DEFAULT_PUBLISH_ATTEMPTS, retryDelayMs = 200, fetch: fetchFn } = {}) {
    if (typeof url !== 'string' || !/^https?:\/\//i.test(url)) throw new TypeError('livegate: url must be an http(s):// URL');
    if (typeof apiKey !== 'string' || apiKey === '') throw new TypeError('livegate: apiKey is required');
    this.url = url.replace(/\/+$/, '');
    this._apiKey = apiKey;
    this._timeoutMs = timeoutMs;
    this._attempts = Math.max(1, Math.floor(retries));
    this._retryDelayMs = retryDelayMs;
    this._fetch = fetchFn ?? globalThis.fetch;
    if (typeof this._fetch !== 'function') throw new TypeError('livegate: no fetch (Node 18+, or pass one)');
  }

  /**
   * Publishes `data` to `room`; resolves with `{room, seq, epoch, duplicate, id}` once the
   * event is durable. `state`: the room's state as of this event. Retried with the same
   * `id` after a failure without an answer (see the top of the file).
   */
  async publish(room, data, { id, state, signal, timeoutMs, retries } = {}) {
    if (typeof room !== 'string' || room === '') throw new TypeError('livegate: room must be a non-empty string');
    const eventId = id ?? `s-${randomBytes(8).toString('hex')}`;
    const body = { id: eventId, data };
    if (state !== undefined) body.state = state;
    const attempts = retries == null ? this._attempts : Math.max(1, Math.floor(retries));
    const reply = await this._retrying(attempts, signal, () =>
      this._call('POST', `/v1/rooms/${encodeURIComponent(room)}/events`, body, { signal, timeoutMs }),
    );
    return { room: reply.room, seq: reply.seq, epoch: reply.epoch, duplicate: reply.duplicate === true, id: eventId };
  }

  /**
   * A one-time token from `POST /v1/tokens`: `{token, expiresAtMs}`. `ttlSecs` (default
   * 60), `rooms` (read patterns; none: any room), `publish` (publish patterns), `cell`.
   */
  async mintToken({ user, device = 'web', ttlSecs = 60, rooms, publish, cell, signal, timeoutMs } = {}) {
    if (typeof user !== 'string' || user === '') throw new TypeError('livegate: user is required');
    const body = { user, device, ttl_secs: ttlSecs };
    if (rooms !== undefined) body.rooms = rooms;
    if (publish !== undefined) body.publish = publish;
    if (cell !== undefined) body.cell = cell;
    const reply = await this._call('POST', '/v1/tokens', body, { signal, timeoutMs });
    return { token: reply.token, expiresAtMs: reply.expires_at_ms };
  }

  /** Runs `attempt` up to `attempts` times while it fails without an answer. */
  async _retrying(attempts, signal, attempt) {
    for (let n = 1; ; n++) {
      try {
        return await attempt();
      } catch (error) {
        const again = n < attempts && error?.retryable === true && !signal?.aborted;
        if (!again) throw error;
        await pause(this._retryDelayMs * 2 ** (n - 1), signal);
      }
    }
  }

  /** One request with the API key; resolves with the JSON reply, rejects with a LivegateError. */
  async _call(method, pathName, body, { signal, timeoutMs } = {}) {
    const ms = timeoutMs ?? this._timeoutMs;
    const signals = [AbortSignal.timeout(ms), signal].filter(Boolean);
    const combined = signals.length > 1 ? anySignal(signals) : signals[0];
    let response;
    try {
      response = await this._fetch(this.url + pathName, {
        method,
        headers: { Authorization: `Bearer ${this._apiKey}`, 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
        signal: combined,
      });
    } catch (cause) {
      if (signal?.aborted) throw new LivegateError('aborted', `${method} ${pathName} aborted`, { cause: signal.reason });
      const timedOut = cause?.name === 'TimeoutError';
      const error = new LivegateError(timedOut ? 'timeout' : 'unreachable', timedOut ? `${method} ${pathName}: no answer within ${ms} ms` : `${method} ${pathName}: ${cause?.message ?? cause}`, { cause });
      error.retryable = true;
      throw error;
    }
    let text = '';
    try {
      text = await response.text();
    } catch (cause) {
      const error = new LivegateError('unreachable', `${method} ${pathName}: the answer was cut off`, { cause });
      error.retryable = true;
      throw error;
    }
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      // not JSON: the status says what happened
    }
    if (!response.ok) {
      const code = json?.error?.code ?? `http_${response.status}`;
      const error = new LivegateError(code, json?.error?.message ?? `${method} ${pathName}: HTTP ${response.status}`);
      error.status = response.status;
      error.retryable = RETRIED_STATUSES.has(response.status);
      throw error;
    }
    return json ?? {};
  }
}

/**
 * A JWT for one connection of `user`, signed with `key`. `key`: a string or bytes (HS256,
 * the server's `jwt_hmac_secret`), or a PEM private key / KeyObject: RSA → RS256, EC P-256
 * → ES256, Ed25519 → EdDSA (the server holds the public key). `ttlSecs` (default 60, at
 * most the server's `token_ttl_max_secs`), `device` (default "web"), `rooms` / `publish`
 * (patterns), `cell`, `keyId` (the header's `kid`, for a JWKS), `issuer` / `audience`
 * (`iss` / `aud`), `now` (ms, default Date.now()), `claims` (more claims, merged last).
 */
export function signToken({ user, device = 'web', rooms, publish, cell, ttlSecs = 60, key, keyId, issuer, audience, now = Date.now(), claims = {} } = {}) {
  if (typeof user !== 'string' || user === '') throw new TypeError('livegate: user is required');
  if (!(ttlSecs > 0)) throw new TypeError('livegate: ttlSecs must be positive');
  const { alg, signer } = signerOf(key);
  const iat = Math.floor(now / 1000);
  const payload = { sub: user, device };
  if (rooms !== undefined) payload.rooms = rooms;
  if (publish !== undefined) payload.publish = publish;
  if (cell !== undefined && cell !== null) payload.cell = cell;
  if (issuer !== undefined) payload.iss = issuer;
  if (audience !== undefined) payload.aud = audience;
  Object.assign(payload, { iat, exp: iat + Math.ceil(ttlSecs), jti: randomBytes(16).toString('base64url') }, claims);
  const header = { alg, typ: 'JWT' };
  if (keyId !== undefined) header.kid = keyId;
  const input = `${base64url(JSON.stringify(header))}.${base64url(JSON.stringify(payload))}`;
  return `${input}.${signer(Buffer.from(input)).toString('base64url')}`;
}

/** The algorithm and the signing function for `key`. */
function signerOf(key) {
  const pem = typeof key === 'string' && key.includes('-----BEGIN');
  if ((typeof key === 'string' && !pem) || key instanceof Uint8Array) {
    const secret = Buffer.from(key);
    if (secret.length < 32) throw new TypeError('livegate: an HS256 secret has at least 32 bytes');
    return { alg: 'HS256', signer: (input) => createHmac('sha256', secret).update(input).digest() };
  }
  let privateKey;
  try {
    privateKey = pem ? createPrivateKey(key) : key?.type === 'private' ? key : createPrivateKey(key);
  } catch (cause) {
    throw new TypeError(`livegate: key is neither an HS256 secret nor a private key (${cause?.message ?? cause})`);
  }
  switch (privateKey.asymmetricKeyType) {
    case 'rsa':
      return { alg: 'RS256', signer: (input) => cryptoSign('sha256', input, privateKey) };
    case 'ec': {
      const curve = privateKey.asymmetricKeyDetails?.namedCurve;
      if (curve !== 'prime256v1' && curve !== 'P-256') throw new TypeError(`livegate: an EC key must be P-256 for ES256, not ${curve}`);
      return { alg: 'ES256', signer: (input) => cryptoSign('sha256', input, { key: privateKey, dsaEncoding: 'ieee-p1363' }) };
    }
    case 'ed25519':
      return { alg: 'EdDSA', signer: (input) => cryptoSign(null, input, privateKey) };
    default:
      throw new TypeError(`livegate: no JWT algorithm for a ${privateKey.asymmetricKeyType} key (RSA, EC P-256 or Ed25519)`);
  }
}

/** The `X-Livegate-Signature` value of `rawBody` under `secret`: `sha256=<hex>`. */
export function webhookSignature(rawBody, secret) {
  return `sha256=${createHmac('sha256', secret).update(bytesOf(rawBody)).digest('hex')}`;
}

/**
 * Whether `signature` (the `X-Livegate-Signature` header) signs `rawBody` (the bytes
 * received, a Buffer or string) under `secret`, compared in constant time.
 */
export function verifyWebhook(rawBody, signature, secret) {
  if (typeof signature !== 'string' || !signature.startsWith('sha256=')) return false;
  const want = Buffer.from(webhookSignature(rawBody, secret));
  const got = Buffer.from(signature);
  return got.length === want.length && timingSafeEqual(got, want);
}

/**
 * The webhook `rawBody` parsed, once its signature is checked; throws a LivegateError with
 * code `bad_signature` (answer 401) when it does not match.
 */
export function parseWebhook(rawBody, signature, secret) {
  if (!verifyWebhook(rawBody, signature, secret)) throw new LivegateError('bad_signature', 'the webhook signature does not match its body');
  return JSON.parse(bytesOf(rawBody).toString('utf8'));
}

function bytesOf(body) {
  if (typeof body === 'string') return Buffer.from(body, 'utf8');
  if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  throw new TypeError('livegate: the raw body is a Buffer or string (the bytes received, before parsing)');
}

function base64url(text) {
  return Buffer.from(text, 'utf8').toString('base64url');
}

/** A signal that aborts when any of `signals` does. */
function anySignal(signals) {
  if (typeof AbortSignal.any === 'function') return AbortSignal.any(signals);
  const controller = new AbortController();
  for (const signal of signals) {
    if (signal.aborted) return AbortSignal.abort(signal.reason);
    signal.addEventListener('abort', () => controller.abort(signal.reason), { once: true });
  }
  return controller.signal;
}

/** Waits `ms` (the pause between publish attempts), or less when `signal` aborts. */
function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener(
      'abort',
      () => {
        clearTimeout(timer);
        resolve();
      },
      { once: true },
    );
  });
}
