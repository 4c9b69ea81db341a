// A typed use of livegate.js: every option of connect() and subscribe(), every method,
// property and event, checked by tests/e2e/types.test.mjs with `tsc --noEmit --strict`
// against the livegate.d.ts a running server serves (saved beside this file as
// ./livegate.d.ts, which is how an application uses it: livegate.js and livegate.d.ts
// side by side). Never run, only type-checked.

import {
  connect,
  DEFAULT_TIMINGS,
  endpointOf,
  EventStreamParser,
  LivegateClient,
  MAX_HELD_EVENTS,
  MAX_SSE_MESSAGE_CHARS,
  RECENT_IDS,
  Subscription,
  sseEndpointOf,
  suggestedDelayMs,
  type ClientEvents,
  type ClientOptions,
  type ClientState,
  type Clock,
  type EventStreamMessage,
  type FetchLike,
  type HistoryReply,
  LivegateError,
  DEFAULT_REQUEST_TIMEOUT_MS,
  type DebugLogger,
  type RequestOptions,
  type LivegateEvent,
  type Member,
  type Position,
  type PresenceChange,
  type PresenceReply,
  type PublishResult,
  type SubscribedReply,
  type SubscriptionOptions,
  type SubscriptionState,
  type Timings,
  type Transport,
  type WebSocketConstructor,
} from './livegate.js';

interface Score {
  home: number;
  away: number;
}
interface MatchState {
  minute: number;
  score: [number, number];
}

// The browser's own WebSocket and fetch fit the options as they are.
const socket: WebSocketConstructor = WebSocket;
const fetcher: FetchLike = fetch;

const timings: Partial<Timings> = {
  backoffMs: [0, 1000, 5000],
  restartJitterMs: 2000,
  maxHintMs: 30_000,
  connectTimeoutMs: 8000,
  stableMs: 10_000,
  pingMs: null,
  idleMs: 60_000,
  resubscribeMs: 500,
  resumeMarginMs: 20_000,
  probeTimeoutMs: 2000,
};

// A virtual clock for tests: only now() here, the real timers for the rest.
let virtualNow = 0;
const clock: Clock = { now: () => virtualNow, setTimeout: (fn, ms) => setTimeout(fn, ms), clearTimeout: (handle) => clearTimeout(handle) };
virtualNow += 1;

const options: ClientOptions = {
  url: 'https://push.example.com',
  getToken: async () => {
    const reply = await fetch('/my-backend/livegate-token');
    return (await reply.json()) as { token: string };
  },
  transports: ['websocket', 'sse'],
  resume: true,
  resumeAttempts: 3,
  WebSocket: socket,
  fetch: fetcher,
  session: null,
  timings,
  random: Math.random,
  clock,
  autoConnect: true,
  requestTimeoutMs: DEFAULT_REQUEST_TIMEOUT_MS,
  debug: false,
};

const client: LivegateClient = connect(options);
const other = new LivegateClient({ getToken: () => 'a-token', transports: ['sse'], fetch: null, session: 'S1' });
new LivegateClient({ getToken: () => Promise.resolve('t'), transports: ['websocket'] });
// Explicit connect() / disconnect(), logging, and a getToken that can sign out.
const logger: DebugLogger = console;
const later = new LivegateClient({
  getToken: async () => ((await fetch('/me')).ok ? 'a-token' : null),
  autoConnect: false,
  debug: logger,
});
later.connect().disconnect('user paused');
later.connect();
new LivegateClient({ getToken: () => 't', debug: (message: string, detail: unknown) => console.log(message, detail) });
new LivegateClient({ getToken: () => { throw new LivegateError('signed_out', 'no session'); } });

const state: ClientState = client.state;
const session: string | null = client.session;
const transport: Transport = client.transport;
const hasResume: boolean = client.hasResume;
const position: Position | null = client.position('match:1');
if (position) {
  const seq: number | null = position.seq;
  const epoch: string | null = position.epoch;
  console.log(seq, epoch);
}
console.log(state, session, transport, hasResume);

const stopConnecting = client.on('connecting', ({ attempt, transport }) => console.log(attempt, transport));
stopConnecting();
client.on('connected', (c) => {
  const credential: 'token' | 'resume' = c.credential;
  console.log(c.session, c.node, c.warmup, c.heartbeatMs, c.resumed, c.transport, credential);
});
client.on('disconnected', ({ code, reason, reconnectInMs, welcomed }) => {
  if (reconnectInMs === null) console.log('not reconnecting', code, reason);
  console.log(welcomed ?? false);
});
client.on('transport', ({ from, to, reason }) => console.log(from, to, reason));
client.on('redirect', ({ node, url, avoid, reason }) => {
  const why: 'wrong_node' | 'unreachable' = reason;
  console.log(node ?? 'the given address', url, avoid ?? 'none', why);
});
client.on('recovered', ({ room, epoch, seq, state }) => console.log(room, epoch, seq, state === true));
client.on('recovery_failed', ({ room, epoch, seq, reason }) => console.log(room, epoch ?? 'none', seq, reason));
const onError = (e: ClientEvents['error']) => console.log(e.room ?? '', e.code, e.message, e.error);
client.on('error', onError);
client.off('error', onError);

client.on('warning', ({ code, message }) => {
  const kind: 'fallback' | 'unsupported' | 'no_websocket' = code;
  console.log(kind, message);
});
client.on('signed_out', ({ reason }) => console.log('show the login page', reason));

const first: Subscription<Score, MatchState> = client.subscribe<Score, MatchState>('match:1', { since: 41, epoch: 'E', state: true, presence: true });
first.on('event', (event: LivegateEvent<Score>) => {
  const goals: number = event.data.home + event.data.away;
  const from: string | undefined = event.from;
  console.log(event.room, event.seq, event.id, event.ts_ms, goals, from);
});
first.on('presence', (change: PresenceChange) => {
  const joined: Member[] | null = change.joined;
  console.log(change.room, change.count, joined?.length, change.left?.map((m) => m.user));
});
const subscribed: Promise<SubscribedReply<MatchState>> = first.ready();
subscribed.then((reply) => {
  console.log(reply.room, reply.epoch, reply.seq, reply.recovered, reply.state?.seq, reply.state?.data.score);
});
const lobby: Subscription = client.subscribe('lobby');
client.unsubscribe('lobby');

// Subscription objects: each its own listeners, state and unsubscribe().
const match: Subscription<Score, MatchState> = client.subscribe<Score, MatchState>('match:2', { since: 3, epoch: 'E', state: true, presence: true });
const subscriptionState: SubscriptionState = match.state;
const stopEvents = match.on('event', (event) => console.log(event.data.home, event.seq));
match.on('state', ({ room, data, seq, epoch }) => console.log(room, data?.minute, seq, epoch));
match.on('presence', ({ count }) => console.log(count));
match.on('subscribing', ({ room }) => console.log(room));
match.on('subscribed', (reply) => console.log(reply.seq, reply.state?.data.score));
match.on('unsubscribed', ({ code, reason }) => console.log(code, reason));
match.on('recovered', ({ seq }) => console.log(seq));
match.on('recovery_failed', ({ reason }) => console.log(reason));
match.on('error', ({ code }) => console.log(code));
stopEvents();
match.ready().then((reply) => console.log(reply.epoch, subscriptionState, MAX_HELD_EVENTS, lobby.room));
const subscriptionOptions: SubscriptionOptions = { presence: true };
client.subscribe('lobby', subscriptionOptions).unsubscribe();

async function requests(): Promise<void> {
  const history: HistoryReply<Score> = await client.history<Score>('match:1', 40, 100);
  const perCall: RequestOptions = { signal: AbortSignal.timeout(2000), timeoutMs: 2000 };
  await client.history('match:1', 0, 10, perCall);
  await client.publish('chat:1', { text: 'hi' }, { id: 'c-2', signal: new AbortController().signal, timeoutMs: 500 });
  await client.presence('match:1', { timeoutMs: 1000 });
  console.log(history.op, history.room, history.epoch, history.head, history.complete, history.events[0]?.data.home);
  await client.history('match:1');
  const published: PublishResult = await client.publish('chat:1', { text: 'hi' }, { id: 'c-1' });
  console.log(published.seq, published.duplicate, published.id);
  await client.publish('chat:1', 42);
  const present: PresenceReply = await client.presence('match:1');
  console.log(present.room, present.count, present.members?.[0]?.device);
  try {
    await client.presence('user:someone-else');
  } catch (error) {
    if (error instanceof LivegateError && (error.code === 'timeout' || error.code === 'aborted')) console.log('try again', error.name);
    console.log((error as LivegateError).code);
  }
}
void requests();

const dropped: boolean = client.dropConnection('demo');
client.dropConnection();
client.close();
other.close();
console.log(dropped);

// The module's helpers and constants.
const ws: string = endpointOf('https://push.example.com');
const sse: string = sseEndpointOf('wss://push.example.com/v1/ws');
const delay: number | null = suggestedDelayMs('service restart: reconnect in 840 ms');
const backoff: readonly number[] = DEFAULT_TIMINGS.backoffMs;
const limits: number = RECENT_IDS + MAX_SSE_MESSAGE_CHARS;
const parser = new EventStreamParser(
  (message: EventStreamMessage) => console.log(message.type, message.data, message.id),
  (comment: string) => console.log(comment),
  1024,
);
parser.push('event: welcome\ndata: {}\n\n');
parser.end();
console.log(ws, sse, delay, backoff, limits);
