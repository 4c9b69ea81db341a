// livegate.js: the browser and Node client of livegate (ES modules, no build step). This
// file is the entry point: it re-exports the API of the modules in ./livegate/ (the server
// serves them at /livegate/{file}, npm installs them with the package; see the header of
// each for what it owns).
//
//   import { connect } from '/livegate.js';
//   const client = connect({
//     url: 'https://push.example.com',              // the server; /v1/ws and /v1/sse are derived
//     getToken: async () => (await fetch('/my-backend/livegate-token')).text(),
//     transports: ['websocket', 'sse'],             // the default fallback order; ['sse']: SSE only
//     requestTimeoutMs: 10000,                      // publish/history/presence reject `timeout` after
//     debug: false,                                 // true: state and transport changes to console.debug
//   });                                             // connects at once (autoConnect: false: on connect())
//   client.on('connected', ({ session, node, transport }) => ...);
//   client.on('recovery_failed', ({ room }) => reloadOverHttp(room));
//   const match = client.subscribe('match:1', { state: true, presence: true });  // a Subscription
//   match.on('state', ({ data, seq }) => reset(data));       // first, then the events after seq
//   match.on('event', (event) => render(event));              // {room, seq, id, ts_ms, from?, data}
//   match.on('presence', ({ count }) => show(count));
//   match.unsubscribe();                                      // this subscription only
//   const { seq, duplicate } = await client.publish('chat:1', { text: 'hi' });  // needs a
//                              // token with "publish":["chat:*"]; WebSocket only
//   await client.publish('chat:1', data, { signal: AbortSignal.timeout(2000) });  // per call
//   client.on('warning', ({ code, message }) => ...);  // e.g. on SSE, which cannot publish
//   client.on('signed_out', () => showLogin());  // getToken returned null: stopped, no retries
//   client.disconnect();       // stop until client.connect(); subscriptions stay
//   const { count, members } = await client.presence('match:1');   // WebSocket only
//   client.transport;          // 'websocket' or 'sse': the transport in use
//   client.state;              // 'disconnected' | 'connecting' | 'connected' | 'closed'
//   client.on('state', ({ previous, state, reason }) => log(previous, '->', state, reason));
//   client.dropConnection();   // drop the connection to watch it reconnect and recover (demos)
//
// What it does for the application:
// - Reconnects by itself. After Close 1012 (service restart) or 1001 it waits the delay
//   the server suggests in the close reason (`... reconnect in 1234 ms`), or a random
//   0-3 s; after any other loss it backs off with full jitter in tiers (about 0, 2, 5,
//   10 s, then 30 s at most); after a Close 4500-4999 (replaced, kicked, token revoked)
//   it stops for good. It offers the session of the last `welcome` again.
// - Reconnects without your backend. Every `welcome` carries a one-time resume credential
//   and its expiry; the next attempt uses it (`resume=`, no `getToken()` call) while it has
//   not expired (counted 30 s early, `timings.resumeMarginMs`, against clock skew; once
//   an SSE response's Date header showed the server's clock off by more than 2 s, the
//   expiry is moved onto the local clock by that much).
//   `getToken()` is called only when there is no credential, it expired, or the server
//   refused it. A browser WebSocket cannot see why a handshake failed, so a credential is
//   tried in at most `resumeAttempts` (default 3) consecutive attempts that fail before
//   `welcome`, then dropped; an attempt counts only when the server was up and ready
//   (`GET /readyz` right after it got an answer other than 503): a server that is down
//   or draining never saw the credential, so a restart does not use the attempts up. Over SSE the refusal is visible (401 `resume_invalid`): the
//   credential is dropped at once. `resume: false` turns this off (a token every attempt).
//   The credential is never logged.
// - Lands on the session's node. A handshake on a node that is not the session's node
//   is refused with where to go: WebSocket close 4421 (reason: the node's URL, or the
//   `wrong_node` frame before it), SSE HTTP 421 (`{"error":{"code":"wrong_node","url",
//   "node"}}`). The client reconnects there at once with the same credential (the refusal
//   did not spend it) and session, no backoff, not a failure (at most 3 such hops in a row
//   without a welcome, then it backs off). After a welcome there, reconnects go to that
//   node first. When that node cannot be reached (and its `/readyz` does not answer), the
//   next attempt goes through the given address with `avoid=<node>`. A close 4029 or an
//   HTTP 429 (the session's migration budget) waits the retry-after seconds it carries.
//   A 1012/1001 from that node sends the next attempt through the given address. A
//   connection closed with 4421 after its welcome (its node handed the session over, a
//   rebalance) reconnects at once to the URL in the reason, with its resume credential. The
//   `redirect` event ({node, url, avoid, reason: 'wrong_node' | 'unreachable'}) tells.
// - Transports (`transports` option, the fallback order as data). `['websocket']`:
//   WebSocket only. `['sse']`: Server-Sent Events read with fetch() and a streamed body
//   (no EventSource needed). `['websocket', 'sse']` (the default): WebSocket, and SSE from
//   then on when two WebSocket attempts in a row fail before `welcome` while the server is
//   up (a proxy that breaks the upgrade), or when there is no WebSocket constructor at
//   all; back to WebSocket when the SSE endpoint is missing (404), or when SSE refuses the
//   resume credential (the WebSocket failures may have been that credential). An unknown
//   name, a repeated one or SSE before WebSocket throws at construction. The application
//   sees the same API and events either way; `client.transport` and the `connected` event
//   say which is in use.
// - SSE specifics: the stream names its rooms (`rooms=`), so subscribe() and unsubscribe()
//   reopen it (the old request is aborted first) with the resume credential and `since=`
//   the cursor: the last `id:` seen, with every subscribed room's own position (epoch and
//   last delivered seq) written over it, so the server replays exactly what each room
//   missed. `event: close` codes follow the WebSocket close-code rules above; `: ping`
//   comments count as liveness and a stream silent for 3 heartbeats is reconnected. SSE
//   has no client requests: `history()` rejects with code `unsupported` (read history over
//   HTTP from your backend), and a gap in a room's stream is not filled with `history`
//   but by reopening the stream from the room's last delivered seq: the server replays
//   the rest exactly, or says it cannot (`recovery_failed`).
// - Client publish: `publish(room, data, {id})` sends the `publish` op and
//   resolves with `{seq, duplicate, id}` once the server has stored the event (it is then
//   durable); the token (and so each resume credential after it) must carry a `publish`
//   pattern naming the room, and inboxes (`user:…`) are never publishable. Without an `id`
//   the library makes one up, so publishing again with the resolved or rejected request's
//   id is safe: a repeat answers `duplicate: true` with the first seq. Events a client
//   published carry `from`, the publishing user, set by the server. Errors reject with
//   the server's code (`forbidden`, `bad_room`, `payload_too_large`, `rate_limited`, ...);
//   over SSE it rejects with code `unsupported` (publish from your backend instead).
// - Room state: `subscribe(room, {state: true})` asks for the room's state. The `subscribed` reply carries it as of some seq S (`{seq: S, data}`,
//   or null: no state); the subscription's `state` event ({room, data, seq: S, epoch}) comes first, then exactly
//   the events after S are delivered (none at or below S), then live. After a reconnect
//   the usual `since` recovery runs; when the server cannot replay what was missed it
//   answers with the state again: `state` comes again (the state replaces everything
//   delivered before), delivery continues after its seq and `recovered` is emitted with
//   `state: true` instead of `recovery_failed`: the application needs no reload. Over SSE
//   the stream asks with `state=1` when any of its rooms asked for state.
// - Presence: `subscribe(room, {presence: true})` hands the server's presence frames to
//   the subscription's `presence` event ({room, count, joined, left}) (`joined`/`left` are
//   `{user, device}` lists, null above the server's members limit; at most one frame per
//   `presence_interval_ms`, only when something changed). `presence(room)` asks who is
//   there now: `{room, count, members}` (WebSocket only; over SSE it rejects with
//   `unsupported`). Over SSE the stream asks with `presence=1`.
// - Subscriptions (subscriptions.js): `subscribe(room, {since, epoch, state, presence})`
//   returns a Subscription (states `unsubscribed`, `subscribing`, `subscribed`; events
//   `event`, `state`, `presence`, `recovered`, `recovery_failed`, `error`, and one per
//   state). Several subscriptions to one room share one server subscription and each gets
//   what it asked for: one asking for presence later makes the room subscribe again from
//   where it is, with presence; one asking for state later makes it start from the state
//   again (the others that asked get it too; the others get the events it stands for, read
//   with history); one with an earlier `since` makes the server replay from there, each
//   subscription skipping what it had. A room holds back at most MAX_HELD_EVENTS events
//   while its subscribe is answered or a gap filled; past that it subscribes again from
//   its last delivered seq. `unsubscribe(room)` ends every subscription of the room. A
//   server without room state or
//   presence (older than this library) is told no more: the room is subscribed without
//   it and an `error` with code `unsupported` says so.
// - Per room a feed (feed.js: subscribing, live, filling a gap, resubscribing, ended)
//   remembers the epoch and the last seq delivered, resubscribes with
//   `since` and `epoch` after a reconnect, and hands each event to the application
//   exactly once and in seq order: events at or below the last delivered seq are
//   dropped, a gap in the live stream is filled with `history` (WebSocket) before later
//   events are delivered, and the last 500 event ids of each room are remembered so a
//   repeated id is dropped too. When the server cannot replay what was missed
//   (`recovered:false`, or a gap history no longer covers) it emits `recovery_failed` with
//   the room: reload that room's state over HTTP; delivery continues from the server's head.
//
// - Requests (`publish`, `history`, `presence`) reject with `timeout` after
//   `requestTimeoutMs` (default 10 s) without a reply, waiting for a connection included,
//   and with `aborted` when the call's `signal` aborts; all rejections are LivegateError
//   with a `code`. A `warning` event says when the client works with less than asked:
//   fallen back to SSE (which cannot publish), a request made on SSE, no WebSocket.
// - `getToken()` returning null (or throwing a LivegateError with code `signed_out` or
//   `unauthorized`) means signed out: the client stops (state `disconnected`), emits
//   `signed_out`, and waits for `connect()`. `disconnect()` does the same on request;
//   `close()` ends the client for good.
//
// Works with the browser's WebSocket, Node's (22+, or 20 with --experimental-websocket),
// in Node 20 without the flag the `ws` package's (an optional peer dependency, loaded when
// installed), or any constructor with the same shape passed as `WebSocket`. No WebSocket
// at all: SSE with a `warning`. SSE needs fetch() with a streamed response body (browsers,
// Node 18+).

export { connect, DEFAULT_REQUEST_TIMEOUT_MS, LivegateClient } from './livegate/client.js';
export { LivegateError } from './livegate/errors.js';
export { DEFAULT_TIMINGS } from './livegate/connection.js';
export { MAX_HELD_EVENTS, RECENT_IDS } from './livegate/feed.js';
export { Subscription } from './livegate/subscriptions.js';
export { EventStreamParser, MAX_SSE_MESSAGE_CHARS } from './livegate/event-stream.js';
export { endpointOf, sseEndpointOf, suggestedDelayMs } from './livegate/urls.js';
