// Misuses livegate.d.ts must refuse: each line after `@ts-expect-error` has to be a type
// error, or tsc reports the directive as unused (tests/e2e/types.test.mjs compiles this
// file like example.ts and requires success). The test also compiles one misuse without
// the directive and requires tsc to fail.

import { connect, LivegateClient } from './livegate.js';

// @ts-expect-error getToken is required
connect({ url: 'http://localhost:7070' });
// @ts-expect-error the transport option is gone: transports
connect({ getToken: () => 't', transport: 'sse' });
// @ts-expect-error requestTimeoutMs is a number
connect({ getToken: () => 't', requestTimeoutMs: '10s' });
// @ts-expect-error debug is a boolean or a logger
connect({ getToken: () => 't', debug: 'verbose' });
// @ts-expect-error transports names 'websocket' and 'sse' only
connect({ getToken: () => 't', transports: ['websocket', 'carrier-pigeon'] });
// @ts-expect-error SSE does not fall back to WebSocket
connect({ getToken: () => 't', transports: ['sse', 'websocket'] });
// @ts-expect-error getToken returns a token, not a number
connect({ getToken: () => 42 });
// @ts-expect-error resumeAttempts is a number
connect({ getToken: () => 't', resumeAttempts: '3' });
// @ts-expect-error an option livegate.js does not read
connect({ getToken: () => 't', reconnect: true });
// @ts-expect-error timings are numbers
connect({ getToken: () => 't', timings: { stableMs: 'long' } });
// @ts-expect-error an unknown timing
connect({ getToken: () => 't', timings: { heartbeatMs: 1 } });

const client = new LivegateClient({ getToken: () => 't' });
// @ts-expect-error no such event
client.on('message', () => {});
// @ts-expect-error `connected` listeners get {session, node, ...}, which has no seq
client.on('connected', ({ seq }) => seq);
// @ts-expect-error a room name is a string
client.subscribe(1);
// @ts-expect-error the form subscribe(room, onEvent, options) is gone
client.subscribe('match:1', () => {}, { state: true });
// @ts-expect-error state is a boolean
client.subscribe('match:1', { state: 'yes' });
// @ts-expect-error presence listeners get a PresenceChange, whose count is a number
client.subscribe('match:1', { presence: true }).on('presence', (change: { count: string }) => change);
client.subscribe<{ home: number }>('match:1').on('event', (event) => {
  // @ts-expect-error the event's data is the declared type
  const away: number = event.data.away;
  return away;
});
// @ts-expect-error publish's options are {id, signal, timeoutMs}
client.publish('chat:1', {}, { ttl: 5 });
// @ts-expect-error a signal is an AbortSignal
client.publish('chat:1', {}, { signal: true });
// @ts-expect-error no such warning code
client.on('warning', ({ code }) => code === 'slow');
// @ts-expect-error state is read-only
client.state = 'closed';
// @ts-expect-error private members are not declared
client._attempt();
void client.publish('chat:1', {}).then((result) => {
  // @ts-expect-error seq is a number
  const seq: string = result.seq;
  return seq;
});
