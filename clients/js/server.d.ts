// server.d.ts: TypeScript declarations for livegate-client/server (server.js), the backend
// helper for Node: publish with idempotent retry, mint tokens, sign JWTs, check webhooks.
// Needs Node's types only for `KeyObject` and `Buffer`, which it names structurally.

export { LivegateError } from './livegate.js';

/** The header livegate signs each webhook in: `X-Livegate-Signature`. */
export declare const WEBHOOK_SIGNATURE_HEADER: string;
/** Default request timeout of LivegateServer (10000 ms). */
export declare const DEFAULT_SERVER_TIMEOUT_MS: number;
/** Default attempts of an idempotent publish (3). */
export declare const DEFAULT_PUBLISH_ATTEMPTS: number;

/** What a signal must offer (the DOM's and Node's AbortSignal do). */
export interface AbortSignalLike {
  readonly aborted: boolean;
  readonly reason?: unknown;
  addEventListener(type: 'abort', listener: () => void, options?: { once?: boolean }): void;
}

export interface LivegateServerOptions {
  /** The server's base URL, http(s)://. */
  url: string;
  /** The server's `api_key`. */
  apiKey: string;
  /** Each request's timeout (default 10000 ms): code `timeout`. */
  timeoutMs?: number;
  /** Attempts of a publish (default 3), each with the same id. */
  retries?: number;
  /** The first pause between publish attempts (default 200 ms, doubling). */
  retryDelayMs?: number;
  /** The fetch function (default: the global one). */
  fetch?: (input: string, init?: any) => Promise<any>;
}

export interface ServerRequestOptions {
  /** Aborting it rejects with code `aborted`. */
  signal?: AbortSignalLike;
  /** This request's timeout (default: the server's `timeoutMs`). */
  timeoutMs?: number;
}

export interface ServerPublishOptions extends ServerRequestOptions {
  /** The idempotency id (default: a random one): every attempt carries it, the server stores it once. */
  id?: string;
  /** The room's state as of this event. */
  state?: unknown;
  /** Attempts of this publish (default: the server's `retries`). */
  retries?: number;
}

/** What a publish resolves with once the event is durable. */
export interface ServerPublishResult {
  room: string;
  seq: number;
  epoch: string;
  /** true: the id had been stored before (maybe by a lost attempt); `seq` is its seq. */
  duplicate: boolean;
  id: string;
}

export interface MintOptions extends ServerRequestOptions {
  user: string;
  /** Default "web". */
  device?: string;
  /** Default 60. */
  ttlSecs?: number;
  /** Read patterns (`match:*`); none: any room. */
  rooms?: string[];
  /** Publish patterns; none: no client publish. */
  publish?: string[];
  /** The user's home cell (one of the server's `cells`). */
  cell?: string;
}

/** The token `POST /v1/tokens` minted and when it expires (Unix ms). */
export interface MintedToken {
  token: string;
  expiresAtMs: number;
}

/** The backend's view of a livegate server (its URL and API key). */
export declare class LivegateServer {
  constructor(options: LivegateServerOptions);
  readonly url: string;
  /** `POST /v1/rooms/{room}/events`, retried with the same id after a failure without an answer. */
  publish(room: string, data: unknown, options?: ServerPublishOptions): Promise<ServerPublishResult>;
  /** `POST /v1/tokens`: a one-time token for one connection. */
  mintToken(options: MintOptions): Promise<MintedToken>;
}

/** A private key as node:crypto takes it (a PEM string or Buffer, or a KeyObject). */
export type PrivateKeyLike = string | Uint8Array | { readonly type: string; readonly asymmetricKeyType?: string };

export interface SignOptions {
  /** The `sub` claim: the user. */
  user: string;
  /** Default "web". */
  device?: string;
  /** Read patterns (`rooms` claim). */
  rooms?: string[];
  /** Publish patterns (`publish` claim). */
  publish?: string[];
  /** The user's home cell (`cell` claim). */
  cell?: string | null;
  /** exp = iat + ttlSecs; default 60 (at most the server's `token_ttl_max_secs`). */
  ttlSecs?: number;
  /**
   * A string or bytes without a PEM header: the HS256 secret (at least 32 bytes, the
   * server's `jwt_hmac_secret`). A PEM private key or KeyObject: RSA → RS256, EC P-256 →
   * ES256, Ed25519 → EdDSA.
   */
  key: string | Uint8Array | PrivateKeyLike;
  /** The header's `kid` (a JWKS on the server). */
  keyId?: string;
  /** The `iss` claim. */
  issuer?: string;
  /** The `aud` claim. */
  audience?: string;
  /** The time to sign at, in ms (default Date.now()). */
  now?: number;
  /** More claims, merged last. */
  claims?: Record<string, unknown>;
}

/** A JWT for one connection (`jti`: 16 random bytes, base64url; each token connects once). */
export declare function signToken(options: SignOptions): string;

/** `sha256=` + the lowercase hex HMAC-SHA256 of `rawBody` under `secret`. */
export declare function webhookSignature(rawBody: string | Uint8Array, secret: string | Uint8Array): string;

/** Whether `signature` (the `X-Livegate-Signature` header) signs the raw body under `secret` (constant time). */
export declare function verifyWebhook(rawBody: string | Uint8Array, signature: string | null | undefined, secret: string | Uint8Array): boolean;

/** The webhook body parsed once its signature is checked; throws a LivegateError `bad_signature` otherwise. */
export declare function parseWebhook<T = WebhookBody>(rawBody: string | Uint8Array, signature: string | null | undefined, secret: string | Uint8Array): T;

/** A webhook's body. */
export interface WebhookBody {
  id: string;
  type: 'room_occupied' | 'room_vacated' | 'client_published';
  room: string;
  ts_ms: number;
  node: string;
  /** client_published only. */
  user?: string;
  device?: string;
  seq?: number;
  event_id?: string;
  data?: unknown;
}
