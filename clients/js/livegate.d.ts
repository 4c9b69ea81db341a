// livegate.d.ts: TypeScript declarations for livegate.js, the browser and Node client of
// livegate (served at /livegate.js with its modules under /livegate/, these at
// /livegate.d.ts; the npm package in clients/js/ is the same files). Install the package,
// or save livegate.js, its livegate/ modules and this file side by side, and import the
// module as usual:
//
//   import { connect, type LivegateEvent } from './livegate.js';
//   const client = connect({ url: 'https://push.example.com', getToken: () => fetchToken() });
//   const match = client.subscribe<{ score: [number, number] }>('match:1');
//   match.on('event', (event) => show(event.data.score));
//
// Only the public API is declared; members starting with `_` are the library's own.
// These declarations need no DOM or Node types: the WebSocket and fetch options are
// described by the shape livegate.js uses, which the browser's and Node's satisfy.

/** The transport a client uses now: WebSocket, or Server-Sent Events read with fetch(). */
export type Transport = 'websocket' | 'sse';

/**
 * The `transports` option: the transports to use, in fallback order. The default
 * `['websocket', 'sse']` falls back to SSE after failed WebSocket attempts; one name
 * disables the fallback. SSE never falls back to WebSocket.
 */
export type TransportList = readonly ['websocket', 'sse'] | readonly ['websocket'] | readonly ['sse'];

/**
 * The connection's state: `disconnected` (none: the next attempt is scheduled, or, after
 * `disconnect()`, a signed-out `getToken` or with `autoConnect: false`, it waits for
 * `connect()`), `connecting`, `connected` (welcomed), `closed` (for good: close(), or the
 * server said not to reconnect with a close 4500-4999). The `state` event tells each change.
 */
export type ClientState = 'disconnected' | 'connecting' | 'connected' | 'closed';

/**
 * What `getToken()` may return: the token, the `{token}` reply of `POST /v1/tokens`, or
 * null (or undefined) when the user is signed out: the client stops without retrying
 * (state `disconnected`, a `signed_out` event) until `connect()`. Throwing a
 * `LivegateError` with code `signed_out` or `unauthorized` means the same; any other
 * error is retried with backoff.
 */
export type TokenResult = string | { token: string } | null | undefined;

/** Where the `debug` option logs: a function, or an object with a `debug` method (such as `console`). */
export type DebugLogger = ((message: string, detail: unknown) => void) | { debug(message: string, detail: unknown): void };

/** Per-call options of `history()`, `presence()` and `publish()`. */
export interface RequestOptions {
  /** Aborting it rejects the call with code `aborted` (a reply that still comes is dropped). */
  signal?: AbortSignalLike;
  /** How long to wait for the reply (queued while disconnected included); default `requestTimeoutMs`. Code `timeout`. */
  timeoutMs?: number;
}

/** The part of an AbortSignal livegate.js uses (the DOM's and Node's satisfy it). */
export interface AbortSignalLike {
  readonly aborted: boolean;
  readonly reason?: unknown;
  addEventListener(type: 'abort', listener: () => void, options?: { once?: boolean }): void;
  removeEventListener(type: 'abort', listener: () => void): void;
}

/** Delays of the client (all in milliseconds); `timings` overrides any of them. */
export interface Timings {
  /** Backoff tiers after a lost or failed connection; each delay is random() * tier. */
  backoffMs: readonly number[];
  /** After 1012/1001 without a suggested delay: random() * this. */
  restartJitterMs: number;
  /** Longest server-suggested delay honoured. */
  maxHintMs: number;
  /** No `welcome` this long after opening: give up on the attempt. */
  connectTimeoutMs: number;
  /** A connection that lasted this long starts the backoff from its first tier again. */
  stableMs: number;
  /** Interval of the client's `ping`; null: the server's `heartbeat_ms` from welcome. */
  pingMs: number | null;
  /** Nothing heard from the server this long: reconnect. null: 2.5 ping intervals (WebSocket), 3 heartbeats (SSE). */
  idleMs: number | null;
  /** A subscribe refused as `unavailable` is tried again after this long. */
  resubscribeMs: number;
  /** A resume credential counts as expired this long before its expiry (clock skew). */
  resumeMarginMs: number;
  /** Longest wait for the `/readyz` check after a failed WebSocket attempt. */
  probeTimeoutMs: number;
}

/** A message event as livegate.js reads it from a socket. */
export interface SocketMessage {
  data: unknown;
}

/** A close event as livegate.js reads it from a socket. */
export interface SocketClose {
  code?: number;
  reason?: string;
}

/**
 * The shape of a WebSocket livegate.js drives (the browser's, Node's, or any with the
 * same shape). The handlers are set by the library; `any` keeps the DOM's and Node's own
 * handler types assignable.
 */
export interface WebSocketLike {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((event: any) => void) | null;
  onmessage: ((event: any) => void) | null;
  onerror: ((event: any) => void) | null;
  onclose: ((event: any) => void) | null;
}

/** A WebSocket constructor: called with the `ws(s)://…/v1/ws?…` URL only. */
export type WebSocketConstructor = new (url: string) => WebSocketLike;

/** The part of a fetch() response livegate.js reads (SSE streams and `/readyz`). */
export interface FetchResponseLike {
  readonly ok: boolean;
  readonly status: number;
  readonly headers?: { get(name: string): string | null } | null;
  readonly body?: {
    getReader(): {
      read(): Promise<{ done: boolean; value?: Uint8Array | undefined }>;
      cancel(reason?: any): Promise<void>;
    };
    cancel?(reason?: any): Promise<void>;
  } | null;
  json(): Promise<any>;
}

/** A fetch function: called with a URL and `{signal, cache, headers}`. */
export type FetchLike = (input: string, init?: any) => Promise<FetchResponseLike>;

/** The options of `connect()` / `new LivegateClient()`. */
export interface ClientOptions {
  /** The server's base URL, http(s):// or ws(s):// (`/v1/ws` and `/v1/sse` are derived). Default: the page's origin in a browser. */
  url?: string;
  /** A fresh one-time token (or the `{token}` reply of `POST /v1/tokens`), for an attempt without a usable resume credential. */
  getToken: () => TokenResult | PromiseLike<TokenResult>;
  /** The transports in fallback order: `['websocket', 'sse']` (default), or one of them (no fallback). An unknown name throws. */
  transports?: TransportList;
  /**
   * Absent on purpose: the former `transport: 'auto' | 'websocket' | 'sse'` throws a
   * TypeError at construction; give `transports`.
   */
  transport?: never;
  /** false: connect only when `connect()` is called. Default true: connect() and new LivegateClient() start at once. */
  autoConnect?: boolean;
  /** How long `publish()`, `history()` and `presence()` wait for a reply before rejecting with code `timeout`. Default 10000; 0: never. */
  requestTimeoutMs?: number;
  /** true: log connection, transport and state changes with console.debug; or where to log them. Credentials are never logged. */
  debug?: boolean | DebugLogger;
  /** false: never use resume credentials (a token every attempt). Default true. */
  resume?: boolean;
  /** Consecutive failed WebSocket attempts a resume credential is tried in before it is dropped. Default 3. */
  resumeAttempts?: number;
  /**
   * The WebSocket constructor to use. Default: the global one; in Node without one (Node 20
   * without --experimental-websocket) the `ws` package's when it is installed. No WebSocket
   * at all: SSE with a `warning` (with `transports: ['websocket']` the client closes).
   */
  WebSocket?: WebSocketConstructor | null;
  /** The fetch function for SSE and the `/readyz` check (default: the global one; null: none, so no SSE). */
  fetch?: FetchLike | null;
  /** A session id to resume on the first connection. */
  session?: string | null;
  /** Overrides of `DEFAULT_TIMINGS`. */
  timings?: Partial<Timings>;
  /** A function like Math.random (for tests). */
  random?: () => number;
  /**
   * The time the client reads and the timers it sets (for tests: a virtual clock runs
   * reconnects, backoff, heartbeats and credential expiry without waiting). Any function
   * left out is the real one.
   */
  clock?: Clock;
}

/** One event of a room, as the server sent it. `data` is whatever was published. */
export interface LivegateEvent<T = unknown> {
  room: string;
  seq: number;
  /** The publisher's id, or one the server made up. */
  id: string;
  /** When the server accepted it (Unix ms). */
  ts_ms: number;
  /** The publishing user, for events a client published; set by the server. */
  from?: string;
  data: T;
}

/** A member of a room: one user on one device. */
export interface Member {
  user: string;
  device: string;
}

/** A room's state as a `subscribed` reply carries it: as of `seq`. */
export interface RoomSnapshot<S = unknown> {
  seq: number;
  data: S;
}

/** A presence frame: who joined and left since the room's last one. */
export interface PresenceChange {
  room: string;
  count: number;
  /** null above the server's `presence_members_max`. */
  joined: Member[] | null;
  left: Member[] | null;
}

/** The options of `subscribe(room, options)`. */
export interface SubscriptionOptions {
  /** Deliver the events after this seq (e.g. the head of a state loaded over HTTP). */
  since?: number | null;
  /** The epoch `since` belongs to. */
  epoch?: string | null;
  /** Start from the room's state: a `state` event first, then the events after its seq. */
  state?: boolean;
  /** Presence changes of the room as `presence` events. */
  presence?: boolean;
}

/** A Subscription's state. */
export type SubscriptionState = 'unsubscribed' | 'subscribing' | 'subscribed';

/** The events of a Subscription and what each carries. */
export interface SubscriptionEvents<T = unknown, S = unknown> {
  /** One event of the room, once and in seq order. */
  event: LivegateEvent<T>;
  /** The room's state (null: none) as of `seq`; the events after it follow. */
  state: { room: string; data: S | null; seq: number; epoch: string };
  presence: PresenceChange;
  subscribing: { room: string };
  subscribed: SubscribedReply<S>;
  unsubscribed: { room: string; code: string; reason: string };
  recovered: { room: string; epoch: string; seq: number; state?: true };
  recovery_failed: { room: string; epoch: string | null; seq: number; reason: string };
  error: { room?: string; code: string; message: string; error?: unknown };
}

/** One subscription of the application to a room (`client.subscribe(room, options)`). */
export declare class Subscription<T = unknown, S = unknown> {
  readonly room: string;
  readonly state: SubscriptionState;
  /** Listens to one of its events; returns a function that removes the listener. */
  on<K extends keyof SubscriptionEvents<T, S>>(name: K, listener: (detail: SubscriptionEvents<T, S>[K]) => void): () => void;
  off<K extends keyof SubscriptionEvents<T, S>>(name: K, listener: (detail: SubscriptionEvents<T, S>[K]) => void): void;
  /** The first `subscribed` reply; rejects (a `LivegateError`) when the room is refused or the subscription ends first. */
  ready(): Promise<SubscribedReply<S>>;
  /** Ends this subscription only; the server's ends with the room's last one. */
  unsubscribe(): void;
}

/** What `Subscription.ready()` resolves with: the room's first `subscribed` reply. */
export interface SubscribedReply<S = unknown> {
  room: string;
  epoch: string;
  /** The room's head when the server answered. */
  seq: number;
  /** Set when the subscribe named a `since`: whether the missed events follow. */
  recovered?: boolean | undefined;
  /** With `state: true`: the room's state, or null when it has none. */
  state?: RoomSnapshot<S> | null;
}

/** What `history()` resolves with: the server's `history` frame. */
export interface HistoryReply<T = unknown> {
  op: 'history';
  ref?: number;
  room: string;
  /** null for a room never published to. */
  epoch: string | null;
  head: number;
  /** Whether every event after `since` (up to the head) is in `events`. */
  complete: boolean;
  events: LivegateEvent<T>[];
}

/** The options of `publish()`. */
export interface PublishOptions {
  /** The idempotency id (default: a random one); publishing again with it stores it at most once (after a `timeout` too). */
  id?: string;
  /** Aborting it rejects the call with code `aborted`. */
  signal?: AbortSignalLike;
  /** How long to wait for the reply; default `requestTimeoutMs`. Code `timeout`. */
  timeoutMs?: number;
}

/** What `publish()` resolves with once the event is stored. */
export interface PublishResult {
  seq: number;
  /** true: the id was published before; `seq` is the first one's. */
  duplicate: boolean;
  /** The id the event was published with (the given one, or the one made up). */
  id: string;
}

/** What `presence()` resolves with. */
export interface PresenceReply {
  room: string;
  count: number;
  /** The distinct members; null above the server's `presence_members_max`. */
  members: Member[] | null;
}

/** Where delivery of a room stands: its epoch and the last seq delivered. */
export interface Position {
  epoch: string | null;
  seq: number | null;
}

/**
 * The error a promise rejects with: `code` is the server's error code (`forbidden`,
 * `bad_room`, `presence_off`, `payload_too_large`, `rate_limited`, …) or the client's own
 * (`closed`, `stopped`, `disconnected`, `unsubscribed`, `unsupported`, `timeout`,
 * `aborted`: `cause` is the signal's reason, `signed_out`). `getToken` may throw one with
 * code `signed_out` or `unauthorized` to stop the client.
 */
export declare class LivegateError extends Error {
  constructor(code: string, message?: string, options?: { cause?: unknown });
  readonly name: 'LivegateError';
  code: string;
}

/** Default of the `requestTimeoutMs` option (10000). */
export declare const DEFAULT_REQUEST_TIMEOUT_MS: number;

/** The events `on()` listens to, with what each listener is given. */
export interface ClientEvents {
  /** The connection's state changed (`reason`: why, in words, for logs). */
  state: { previous: ClientState; state: ClientState; reason: string };
  connecting: { attempt: number; transport: Transport };
  connected: {
    session: string;
    node: string;
    warmup: boolean;
    heartbeatMs: number;
    /** The session of the previous welcome was kept. */
    resumed: boolean;
    transport: Transport;
    /** What opened the connection. */
    credential: 'token' | 'resume';
  };
  disconnected: {
    code: number;
    reason: string;
    /** null when the client will not reconnect. */
    reconnectInMs: number | null;
    /** Whether the lost connection had been welcomed (absent when not reconnecting). */
    welcomed?: boolean;
  };
  transport: { from: Transport; to: Transport; reason: string };
  /**
   * The next attempt goes to `url` at once: a node refused the handshake naming the
   * session's node (`wrong_node`; also a connection closed 4421 after its welcome, when a
   * rebalance handed the session over to that node, `node` null), or that node could not
   * be reached and the given address is asked to avoid it (`unreachable`).
   */
  redirect: {
    /** The node to connect to (null: the given address decides). */
    node: string | null;
    /** Its http(s) base URL. */
    url: string;
    /** The node the attempt asks to be kept away from (`avoid=`), if any. */
    avoid: string | null;
    reason: 'wrong_node' | 'unreachable';
  };
  /** The missed events of a room follow (or, with `state: true`, its state replaced them). */
  recovered: { room: string; epoch: string; seq: number; state?: true };
  /** The server could not replay what a room missed: reload its state over HTTP. */
  recovery_failed: {
    room: string;
    epoch: string | null;
    seq: number;
    /** `not_recovered`, `epoch_changed`, `history_trimmed`, or the code a history request failed with. */
    reason: string;
  };
  /** `code`: a server error code, or the client's (`token`, `socket`, `sse`, `handler`, `unsupported`, `http_NNN`). */
  error: { room?: string; code: string; message: string; error?: unknown };
  /**
   * The client works with less than asked: `fallback` (on SSE from now on after WebSocket
   * attempts failed: publish, history and presence reject with `unsupported`),
   * `unsupported` (such a request was made on SSE), `no_websocket` (no WebSocket in this
   * runtime: SSE, or closed with `transports: ['websocket']`).
   */
  warning: { code: 'fallback' | 'unsupported' | 'no_websocket'; message: string };
  /** `getToken` said the user is signed out: the client stopped (state `disconnected`) until `connect()`. */
  signed_out: { reason: string };
}

/** The name of an event `on()` listens to. */
export type ClientEventName = keyof ClientEvents;

/** A reconnecting livegate client (see the top of livegate.js). */
export declare class LivegateClient {
  constructor(options: ClientOptions);
  /** Where the client is in its life. */
  readonly state: ClientState;
  /** The session id of the last welcome (null before the first). */
  readonly session: string | null;
  /** The transport in use (or of the next attempt). */
  readonly transport: Transport;
  /** Whether a resume credential is held for the next attempt (never the credential). */
  readonly hasResume: boolean;
  /** Where delivery of a room stands, or null for a room not subscribed. */
  position(room: string): Position | null;
  /** Listens to an event; returns a function that removes the listener. */
  on<K extends ClientEventName>(name: K, listener: (detail: ClientEvents[K]) => void): () => void;
  off<K extends ClientEventName>(name: K, listener: (detail: ClientEvents[K]) => void): void;
  /**
   * A subscription to the room: its events once each, in seq order, after `since` (else
   * from now on), from the room's state with `state: true`, presence with `presence:
   * true`. Subscriptions to one room share one server subscription; each gets what it
   * asked for and `unsubscribe()` ends only itself.
   */
  subscribe<T = unknown, S = unknown>(room: string, options?: SubscriptionOptions): Subscription<T, S>;
  /** Ends every subscription of the room and tells the server (over SSE: reopens the stream). */
  unsubscribe(room: string): void;
  /** Up to `limit` (default 100) events of `room` after `since` (default 0); WebSocket only. */
  history<T = unknown>(room: string, since?: number, limit?: number, options?: RequestOptions): Promise<HistoryReply<T>>;
  /** Publishes `data` (any JSON value) as this connection's user, once stored; WebSocket only. */
  publish(room: string, data: unknown, options?: PublishOptions): Promise<PublishResult>;
  /** Who is in `room` now; WebSocket only. */
  presence(room: string, options?: RequestOptions): Promise<PresenceReply>;
  /**
   * Starts connecting (the constructor already does unless `autoConnect: false`), or again
   * after `disconnect()` or a signed-out `getToken`; subscriptions resubscribe from where
   * they were. Throws a `LivegateError` once closed.
   */
  connect(): this;
  /** Ends the connection and stops reconnecting until `connect()`; subscriptions stay, pending requests reject with `disconnected`. */
  disconnect(reason?: string): void;
  /** Drops the connection as if it had been lost (close 4000); false when there is none. */
  dropConnection(reason?: string): boolean;
  /** Closes for good: no reconnect, pending requests are rejected. */
  close(): void;
}

/** Opens a client: `new LivegateClient(options)`, connecting at once unless `autoConnect: false`. */
export declare function connect(options: ClientOptions): LivegateClient;

/** Time as the client sees it: the `clock` option. */
export interface Clock {
  /** The current time in milliseconds since the epoch, like Date.now(). */
  now?: () => number;
  /** Runs `fn` once after `ms`; returns a handle for clearTimeout. */
  setTimeout?: (fn: () => void, ms: number) => unknown;
  clearTimeout?: (handle: any) => void;
}

/** The defaults of the `timings` option. */
export declare const DEFAULT_TIMINGS: Readonly<Timings>;
/** Event ids remembered per room to drop repeats. */
export declare const RECENT_IDS: number;
/** Most events a room holds back while subscribing or filling a gap before it subscribes again from its last delivered seq. */
export declare const MAX_HELD_EVENTS: number;
/** Largest SSE message, in characters. */
export declare const MAX_SSE_MESSAGE_CHARS: number;

/** The SSE endpoint for a base URL (`…/v1/sse`); throws a TypeError for other schemes. */
export declare function sseEndpointOf(base: string): string;
/** The WebSocket endpoint for a base URL (`ws(s)://…/v1/ws`); throws a TypeError for other schemes. */
export declare function endpointOf(base: string): string;
/** The reconnect delay a 1012/1001 close reason suggests, in ms, or null. */
export declare function suggestedDelayMs(reason: string | null | undefined): number | null;

/** One message of an event stream. */
export interface EventStreamMessage {
  /** The `event:` field, `message` when none was given. */
  type: string;
  /** The `data:` lines joined with `\n`. */
  data: string;
  /** The message's own `id:`, if any. */
  id: string | undefined;
}

/** A `text/event-stream` parser (the HTML standard's rules). */
export declare class EventStreamParser {
  constructor(onMessage: (message: EventStreamMessage) => void, onComment?: (text: string) => void, maxChars?: number);
  /** Feeds decoded text; throws a RangeError for a message over `maxChars`. */
  push(text: string): void;
  /** The stream ended: a message without its blank line is dropped. */
  end(): void;
}
