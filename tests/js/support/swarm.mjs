// Many livegate.js clients in one Node process, for the Rust tests that drive a cluster
// (tests/it/cluster/rolling_release.rs). Each client is its own user with a token minted for it
// (through the one address it is given, as a backend would), a session, and its rooms.
// It prints one JSON line to stdout per thing the test counts:
//
//   {"t":"welcome","c":7,"node":"b","session":"S","resumed":true,"ms":...}
//   {"t":"sub","c":7,"r":"room"}                         first `subscribed` of a room
//   {"t":"ev","c":7,"r":"room","s":12}                    an event handed to the app
//   {"t":"lost","c":7,"code":1012,"welcomed":true,"ms":...} the client's `disconnected`
//   {"t":"close","c":7,"code":4421,"reason":"...","via":"lb"|"direct","ms":...}  a socket's close
//   {"t":"refused","c":7,"status":429,"via":"lb"|"direct"} an upgrade answered with HTTP
//   {"t":"redirect","c":7,"node":"a","reason":"wrong_node"} livegate.js follows a refusal
//   {"t":"rfail","c":7,"r":"room"}                         recovery_failed
//   {"t":"err","c":7,"code":"...","message":"..."}
//   {"t":"ready"}  every client created;  {"t":"bye"}  every client closed (then exit)
//
// Configuration (environment): SWARM_URL (the address clients are given), SWARM_CLIENTS,
// SWARM_ROOMS (comma-separated), SWARM_ROOMS_PER_CLIENT, SWARM_USER_PREFIX, SWARM_API_KEY;
// SWARM_LIBRARY, a path to another livegate.js to run instead of clients/js/livegate.js
// (another branch's, say; the server serves the one it was built with).
// Closing stdin closes every client and ends the process.
//
// The WebSocket is the tests' MiniWebSocket (Node 20 has no global WebSocket without a
// flag), subclassed only to report closes and refused upgrades with their HTTP status
// (which a browser would not show; livegate.js does not see it either).

import { pathToFileURL } from 'node:url';

import { pace } from './clock.mjs';
import { MiniWebSocket } from './mini-websocket.mjs';

const library = process.env.SWARM_LIBRARY ? pathToFileURL(process.env.SWARM_LIBRARY).href : '../../../clients/js/livegate.js';
const { connect } = await import(library);

const url = process.env.SWARM_URL;
const count = Number(process.env.SWARM_CLIENTS ?? 200);
const rooms = (process.env.SWARM_ROOMS ?? 'swarm:0').split(',');
const perClient = Number(process.env.SWARM_ROOMS_PER_CLIENT ?? 2);
const prefix = process.env.SWARM_USER_PREFIX ?? 'swarm-u';
const apiKey = process.env.SWARM_API_KEY;
if (!url || !apiKey) throw new Error('SWARM_URL and SWARM_API_KEY are required');
const lbHost = new URL(url).host;

let pending = [];
function emit(line) {
  pending.push(JSON.stringify(line));
  if (pending.length >= 512) flush();
}
function flush() {
  if (pending.length === 0) return;
  process.stdout.write(pending.join('\n') + '\n');
  pending = [];
}
setInterval(flush, 20);

function socketFor(c) {
  return class extends MiniWebSocket {
    constructor(target) {
      super(target);
      this._via = new URL(target).host === lbHost ? 'lb' : 'direct';
    }
    _fail(message) {
      const status = /^HTTP (\d+)/.exec(message ?? '');
      if (status && !this._finished) emit({ t: 'refused', c, status: Number(status[1]), via: this._via });
      super._fail(message);
    }
    _finish() {
      if (!this._finished && this._closeReceived) {
        emit({ t: 'close', c, code: this._closeReceived.code, reason: this._closeReceived.reason, via: this._via, ms: Date.now() });
      }
      super._finish();
    }
  };
}

async function mint(user) {
  const response = await fetch(`${url}/v1/tokens`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${apiKey}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ user, device: 'web' }),
  });
  const body = await response.text();
  if (response.status !== 201) throw new Error(`POST /v1/tokens: ${response.status} ${body}`);
  return JSON.parse(body).token;
}

const clients = [];
for (let c = 0; c < count; c += 1) {
  const user = `${prefix}${c}`;
  const client = connect({
    url,
    transports: ['websocket'],
    WebSocket: socketFor(c),
    getToken: () => mint(user),
    // Short tiers so a test's release is not spent waiting; the server's drain hints
    // (1012 "reconnect in N ms") are honoured as in production.
    timings: { backoffMs: [0, 200, 500, 1000, 2000], restartJitterMs: 500, connectTimeoutMs: 5000, probeTimeoutMs: 2000 },
  });
  client.on('connected', ({ session, node, resumed }) => emit({ t: 'welcome', c, node, session, resumed, ms: Date.now() }));
  client.on('disconnected', ({ code, welcomed }) => emit({ t: 'lost', c, code, welcomed: !!welcomed, ms: Date.now() }));
  client.on('redirect', ({ node, reason }) => emit({ t: 'redirect', c, node, reason }));
  client.on('recovery_failed', ({ room }) => emit({ t: 'rfail', c, r: room }));
  client.on('error', ({ code, message }) => emit({ t: 'err', c, code, message: String(message).slice(0, 200) }));
  for (let k = 0; k < perClient; k += 1) {
    const room = rooms[(c + k) % rooms.length];
    const subscription = client.subscribe(room);
    subscription.on('event', (event) => emit({ t: 'ev', c, r: room, s: event.seq }));
    subscription
      .ready()
      .then(() => emit({ t: 'sub', c, r: room }), (error) => emit({ t: 'err', c, code: 'subscribe', message: String(error?.message ?? error) }));
  }
  clients.push(client);
  // A crowd arriving over about two seconds, not in one burst.
  await pace(10, 'a client every 10 ms');
}
emit({ t: 'ready' });

process.stdin.resume();
process.stdin.on('end', () => {
  for (const client of clients) client.close();
  emit({ t: 'bye' });
  flush();
  setTimeout(() => process.exit(0), 100);
});
