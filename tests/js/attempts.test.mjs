// The attempts machine of livegate.js (clients/js/livegate/attempts.js) on its own, in
// virtual time: no socket, no fetch, no client, no timers. Each row of the tables below is
// a script of inputs (an attempt due, a token, the server answering, a welcome, a loss with
// its code and reason, a /readyz answer, time passing) and the actions the machine must
// ask for, in order: where each attempt goes and with which credential, what the app is
// told, when the next attempt is scheduled, which transport is used.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { Attempts, credentialQuery } from '../../clients/js/livegate/attempts.js';
import { DEFAULT_TIMINGS, MAX_FOLLOWS, TransportOrder, WS_FAILURES_BEFORE_SSE } from '../../clients/js/livegate/connection.js';
import { ResumeCredential } from '../../clients/js/livegate/credentials.js';
import { sseEndpointOf } from '../../clients/js/livegate/urls.js';

/** random() of every row: each backoff is half its tier (0, 1000, 2500, 5000, 15000 ms). */
const HALF = () => 0.5;

/**
 * An Attempts machine for the given address `url`, driven by steps; `trace` is every
 * action it asked for, as text. The attempt it last opened is the one the server answers,
 * welcomes or loses; the probe it last asked for is the one answered.
 */
class Driver {
  constructor({ url = 'https://lg.example', transports = ['websocket', 'sse'], canProbe = true, timings = {} } = {}) {
    this.now = 0;
    this.credential = new ResumeCredential({ enabled: true, attempts: 3, marginMs: 0, clock: { now: () => this.now } });
    this.order = new TransportOrder(transports, { webSocket: true, fetch: true });
    this.machine = new Attempts({
      order: this.order,
      credential: this.credential,
      sseEndpoint: sseEndpointOf(url),
      timings: { ...DEFAULT_TIMINGS, ...timings },
      random: HALF,
      canProbe,
    });
    this.trace = [];
    this.attempt = null;
    this.probe = null;
    this.welcomed = false;
    this.welcomedAt = 0;
  }

  /** Runs a step `[input, ...arguments]` and takes every action it leads to. */
  step([input, ...args]) {
    const machine = this.machine;
    switch (input) {
      case 'start':
        machine.start();
        break;
      case 'due':
        machine.due({ quiet: args[0] === 'quiet' });
        break;
      case 'token':
        machine.tokenGot(args.length ? args[0] : 't1');
        break;
      case 'token_failed':
        machine.tokenFailed(args[0]);
        break;
      case 'opened':
        machine.opened(this.attempt);
        break;
      case 'named':
        machine.named(this.attempt, { url: args[0], node: args[1] });
        break;
      case 'welcome': {
        const { resume = null, node = 'n1' } = args[0] ?? {};
        this.welcomed = true;
        this.welcomedAt = this.now;
        this.credential.keep({ resume, resume_expires_at_ms: resume ? this.now + 3_600_000 : undefined }, this.now, 0);
        machine.welcomed(this.attempt, { node, websocket: this.attempt.transport === 'websocket' });
        break;
      }
      case 'lost':
        machine.lost(args[0], args[1] ?? '', { attempt: this.attempt, welcomed: this.welcomed, welcomedAt: this.welcomedAt }, this.now);
        this.welcomed = false;
        break;
      case 'probed':
        machine.probed(this.probe, args[0]);
        break;
      case 'wait':
        this.now += args[0];
        break;
      default:
        throw new Error(`no step ${input}`);
    }
    for (let action = machine.poll(); action; action = machine.poll()) this.trace.push(this.describe(action));
  }

  describe(action) {
    switch (action.type) {
      case 'state':
        return `state ${action.state}${action.closedBy ? ` by ${action.closedBy}` : ''}`;
      case 'emit': {
        const d = action.detail;
        if (action.name === 'connecting') return `connecting ${d.attempt} ${d.transport}`;
        if (action.name === 'disconnected') return `disconnected ${d.code} in ${d.reconnectInMs}${d.welcomed ? ' welcomed' : ''}`;
        if (action.name === 'redirect') return `redirect ${d.url}${d.node ? ` node=${d.node}` : ''}${d.avoid ? ` avoid=${d.avoid}` : ''} ${d.reason}`;
        return `${action.name} ${d.code}`;
      }
      case 'open': {
        const a = (this.attempt = action.attempt);
        const credential = a.resume != null ? `resume=${a.resume}` : `token=${a.token}`;
        return `open ${a.transport} ${a.base ?? 'given'}${a.node ? ` node=${a.node}` : ''}${a.avoid ? ` avoid=${a.avoid}` : ''} ${credential}`;
      }
      case 'probe':
        this.probe = action.id;
        return `probe ${action.readyz}`;
      case 'schedule':
        return `schedule ${action.delayMs}`;
      case 'transport':
        return `transport ${action.from}->${action.to}`;
      case 'signed_out':
        return `signed_out ${action.why}`;
      case 'stopped':
        return `stopped ${action.code}`;
      default:
        return action.type;
    }
  }
}

/** Runs a row: its steps, then checks the trace (or its tail) and the state. */
function run(row) {
  const driver = new Driver(row.setup);
  for (const step of row.steps) driver.step(step);
  if (row.trace) assert.deepEqual(driver.trace, row.trace, 'the actions, in order');
  if (row.tail) assert.deepEqual(driver.trace.slice(-row.tail.length), row.tail, 'the last actions, in order');
  if (row.state) assert.equal(driver.machine.state, row.state, 'the state it ends in');
  if (row.check) row.check(driver);
  return driver;
}

/** The first attempt, with a token from getToken: connecting, asked, opened. */
const FIRST = [['start'], ['due'], ['token']];
const FIRST_TRACE = ['schedule 0', 'state connecting', 'connecting 1 websocket', 'token', 'open websocket given token=t1'];
/** A refusal naming node b at https://b.example (the 4421 close after the wrong_node frame). */
const REFUSED_TO_B = [['opened'], ['named', 'https://b.example', 'b'], ['lost', 4421, 'https://b.example']];
const FOLLOWED_TO_B = ['state disconnected', 'disconnected 4421 in 0', 'redirect https://b.example node=b wrong_node', 'schedule 0'];

describe('attempts: wrong_node refusals and hand-overs', () => {
  const rows = [
    {
      name: 'a refusal is followed at once to the node it names, with the same token, then that node is home',
      steps: [...FIRST, ...REFUSED_TO_B, ['due'], ['opened'], ['welcome', { resume: 'r1', node: 'b' }], ['wait', 20_000], ['lost', 1006, 'gone'], ['due']],
      trace: [
        ...FIRST_TRACE,
        ...FOLLOWED_TO_B,
        'state connecting',
        'connecting 2 websocket',
        'open websocket https://b.example node=b token=t1',
        'state disconnected',
        'disconnected 1006 in 0 welcomed',
        'schedule 0',
        'state connecting',
        'connecting 3 websocket',
        'open websocket https://b.example node=b resume=r1',
      ],
      state: 'opening',
    },
    {
      name: 'an empty reason follows the wrong_node frame',
      steps: [...FIRST, ['opened'], ['named', 'https://b.example', 'b'], ['lost', 4421, '']],
      tail: ['disconnected 4421 in 0', 'redirect https://b.example node=b wrong_node', 'schedule 0'],
    },
    {
      name: `at most ${MAX_FOLLOWS} refusals in a row are followed; the next backs off through the given address`,
      steps: [...FIRST, ...REFUSED_TO_B, ['due'], ...REFUSED_TO_B, ['due'], ...REFUSED_TO_B, ['due'], ...REFUSED_TO_B, ['due']],
      tail: [
        'open websocket https://b.example node=b token=t1',
        'state disconnected',
        'disconnected 4421 in 0',
        'schedule 0',
        'state connecting',
        'connecting 5 websocket',
        'token',
      ],
      check: (d) => {
        assert.equal(d.trace.filter((line) => line.startsWith('redirect')).length, MAX_FOLLOWS);
        assert.equal(d.machine.failures, 1, 'the capped refusal counts as a failure');
        assert.equal(d.machine.follows, 0);
      },
    },
    {
      name: 'a refusal naming plain http is never followed from https',
      steps: [...FIRST, ['opened'], ['named', 'http://b.example', 'b'], ['lost', 4421, 'http://b.example'], ['due']],
      tail: ['state disconnected', 'disconnected 4421 in 0', 'schedule 0', 'state connecting', 'connecting 2 websocket', 'token'],
      check: (d) => assert.ok(!d.trace.some((line) => line.startsWith('redirect'))),
    },
    {
      name: 'from plain http a refusal naming http is followed',
      setup: { url: 'http://lg.example' },
      steps: [...FIRST, ['opened'], ['lost', 4421, 'http://b.example']],
      tail: ['disconnected 4421 in 0', 'redirect http://b.example wrong_node', 'schedule 0'],
    },
    {
      name: 'handed over after a welcome: at once to the URL with the resume credential, not a failure',
      steps: [...FIRST, ['opened'], ['welcome', { resume: 'r1' }], ['lost', 4421, 'https://c.example'], ['due']],
      trace: [
        ...FIRST_TRACE,
        'state disconnected',
        'disconnected 4421 in 0 welcomed',
        'redirect https://c.example wrong_node',
        'schedule 0',
        'state connecting',
        'connecting 2 websocket',
        'open websocket https://c.example resume=r1',
      ],
      check: (d) => assert.equal(d.machine.failures, 0),
    },
    {
      name: 'handed over to plain http from https: an ordinary loss',
      steps: [...FIRST, ['opened'], ['welcome', { resume: 'r1' }], ['lost', 4421, 'http://c.example']],
      tail: ['state disconnected', 'disconnected 4421 in 0 welcomed', 'schedule 0'],
    },
  ];
  for (const row of rows) test(row.name, () => run(row));
});

describe('attempts: an unreachable node is avoided', () => {
  const AT_B = [...FIRST, ...REFUSED_TO_B, ['due']];
  const rows = [
    {
      name: 'the named node does not answer and its /readyz neither: back through the given address avoiding it, the same token',
      steps: [...AT_B, ['lost', 1006, 'no answer'], ['probed', false], ['due']],
      tail: [
        'state disconnected',
        'probe https://b.example/readyz',
        'disconnected 1006 in 0',
        'redirect https://lg.example avoid=b unreachable',
        'schedule 0',
        'state connecting',
        'connecting 3 websocket',
        'open websocket given avoid=b token=t1',
      ],
    },
    {
      name: 'the named node is ready although the attempt failed: a failure like any other (judged ready at once)',
      steps: [...AT_B, ['lost', 1006, 'no answer'], ['probed', true]],
      tail: ['probe https://b.example/readyz', 'state disconnected', 'disconnected 1006 in 0', 'schedule 0'],
      check: (d) => {
        assert.equal(d.order.failures, 1, 'it counts toward the fallback');
        assert.equal(d.machine.failures, 1);
      },
    },
    {
      name: 'a refusal after the avoiding attempt keeps avoiding the node down the chain',
      steps: [...AT_B, ['lost', 1006, 'no answer'], ['probed', false], ['due'], ['opened'], ['named', 'https://c.example', 'c'], ['lost', 4421, 'https://c.example'], ['due']],
      tail: ['redirect https://c.example node=c avoid=b wrong_node', 'schedule 0', 'state connecting', 'connecting 4 websocket', 'open websocket https://c.example node=c avoid=b token=t1'],
    },
    {
      name: 'a probe answered after the client halted changes nothing',
      steps: [...AT_B, ['lost', 1006, 'no answer']],
      check: (d) => {
        d.machine.halt();
        d.step(['probed', false]);
        assert.ok(!d.trace.some((line) => line.startsWith('redirect https://lg.example')));
        assert.equal(d.machine.state, 'idle');
      },
    },
  ];
  for (const row of rows) test(row.name, () => run(row));
});

describe('attempts: the WebSocket→SSE fallback', () => {
  /** A WebSocket attempt failing before welcome, then the next attempt due. */
  const FAIL = [['lost', 1006, 'failed'], ['due']];
  const rows = [
    {
      name: `after ${WS_FAILURES_BEFORE_SSE} failures while /readyz says ready, the next attempt is SSE`,
      steps: [...FIRST, ...FAIL, ['probed', true], ['token'], ...FAIL, ['probed', true], ['token']],
      trace: [
        ...FIRST_TRACE,
        'probe https://lg.example/readyz',
        'state disconnected',
        'disconnected 1006 in 0',
        'schedule 0',
        // due: the attempt waits for the verdict
        'state connecting',
        'connecting 2 websocket',
        'token',
        'open websocket given token=t1',
        'probe https://lg.example/readyz',
        'state disconnected',
        'disconnected 1006 in 1000',
        'schedule 1000',
        'transport websocket->sse',
        'state connecting',
        'connecting 3 sse',
        'token',
        'open sse given token=t1',
      ],
    },
    {
      name: 'failures while /readyz says not ready (or does not answer) count for nothing',
      steps: [...FIRST, ...FAIL, ['probed', false], ['token'], ...FAIL, ['probed', false], ['token'], ...FAIL, ['probed', false]],
      check: (d) => {
        assert.equal(d.order.current, 'websocket');
        assert.equal(d.order.failures, 0);
        assert.ok(!d.trace.some((line) => line.startsWith('transport')));
        assert.equal(d.machine.failures, 3, 'they still back off');
      },
    },
    {
      name: 'a welcome over WebSocket resets the count toward the fallback',
      steps: [...FIRST, ...FAIL, ['probed', true], ['token'], ['opened'], ['welcome'], ['lost', 1006, 'gone'], ['due'], ['token'], ...FAIL, ['probed', true]],
      check: (d) => {
        assert.equal(d.order.current, 'websocket');
        assert.equal(d.order.failures, 1);
      },
    },
    {
      name: 'one transport: no fallback, and no /readyz asked without a credential to judge',
      setup: { transports: ['websocket'] },
      steps: [...FIRST, ...FAIL, ['token'], ...FAIL],
      check: (d) => assert.ok(!d.trace.some((line) => line.startsWith('probe') || line.startsWith('transport'))),
    },
    {
      name: 'a credential that fails while the server is ready is dropped after 3 attempts',
      setup: { transports: ['websocket'] },
      steps: [...FIRST, ['opened'], ['welcome', { resume: 'r1' }], ['lost', 1006, 'gone'], ['due'], ...FAIL, ['probed', true], ...FAIL, ['probed', true], ...FAIL, ['probed', true]],
      tail: ['state connecting', 'connecting 5 websocket', 'token'],
    },
    {
      name: '4421 and 4029 are explained refusals: not judged',
      steps: [...FIRST, ['opened'], ['lost', 4029, '7']],
      tail: ['state disconnected', 'disconnected 4029 in 7000', 'schedule 7000'],
    },
    {
      name: 'a refused credential over SSE after the fallback goes back to WebSocket',
      steps: [...FIRST, ...FAIL, ['probed', true], ['token'], ...FAIL, ['probed', true], ['token']],
      check: (d) => {
        assert.equal(d.order.current, 'sse');
        assert.equal(d.machine.sseRefused(401, 'resume_invalid'), true);
        assert.equal(d.machine.poll().type, 'transport');
        assert.equal(d.order.current, 'websocket');
      },
    },
  ];
  for (const row of rows) test(row.name, () => run(row));
});

describe('attempts: transports and quiet reopens', () => {
  const rows = [
    {
      name: 'an SSE stream reopened for its rooms is quiet: no connecting, the credential of the last welcome',
      setup: { transports: ['sse'] },
      steps: [['start'], ['due'], ['token'], ['opened'], ['welcome', { resume: 'r1' }], ['due', 'quiet']],
      tail: ['open sse given token=t1', 'open sse given resume=r1'],
      check: (d) => assert.equal(d.trace.filter((line) => line.startsWith('connecting')).length, 1),
    },
    {
      name: 'a server without SSE (404): WebSocket only from then on',
      steps: [...FIRST],
      check: (d) => {
        d.order.use('sse');
        assert.equal(d.machine.sseRefused(404, 'not_found'), true);
        assert.deepEqual(d.machine.poll(), { type: 'transport', from: 'sse', to: 'websocket', reason: 'the server has no SSE endpoint', warning: 'fallback' });
        assert.deepEqual(d.order.names, ['websocket']);
        assert.equal(d.machine.sseRefused(400, 'bad_room'), false, 'a refused room is the client\'s business');
      },
    },
    {
      name: 'no WebSocket in the runtime: SSE with the no_websocket warning, or false when SSE is not allowed',
      check: (d) => {
        assert.equal(d.machine.noWebSocket('none here'), true);
        assert.deepEqual(d.machine.poll(), { type: 'transport', from: 'websocket', to: 'sse', reason: 'none here', warning: 'no_websocket' });
        const alone = new Driver({ transports: ['websocket'] });
        assert.equal(alone.machine.noWebSocket('none here'), false);
        assert.equal(alone.machine.poll(), null);
      },
    },
  ];
  for (const row of rows) test(row.name, () => run({ steps: [], ...row }));
});

describe('attempts: backoff', () => {
  const WS = { transports: ['websocket'] };
  const delays = (d) => d.trace.filter((line) => line.startsWith('schedule')).map((line) => Number(line.split(' ')[1]));
  const rows = [
    {
      name: 'failures climb the tiers (random() * tier)',
      setup: WS,
      steps: [...FIRST, ['lost', 1006], ['due'], ['token'], ['lost', 1006], ['due'], ['token'], ['lost', 1006], ['due'], ['token'], ['lost', 1006], ['due'], ['token'], ['lost', 1006], ['due'], ['token'], ['lost', 1006]],
      check: (d) => assert.deepEqual(delays(d), [0, 0, 1000, 2500, 5000, 15000, 15000]),
    },
    {
      name: '1012 is not a failure: its suggested delay, and the tier stays',
      setup: WS,
      steps: [...FIRST, ['lost', 1006], ['due'], ['token'], ['opened'], ['welcome'], ['lost', 1012, 'restarting: reconnect in 1234 ms'], ['due'], ['token'], ['opened'], ['welcome'], ['lost', 1001], ['due'], ['token'], ['lost', 1006]],
      check: (d) => {
        assert.deepEqual(delays(d), [0, 0, 1234, 1500, 1000]);
        assert.equal(d.machine.failures, 2);
      },
    },
    {
      name: `a connection that lasted stableMs (${DEFAULT_TIMINGS.stableMs} ms) starts the backoff from its first tier; a shorter one does not`,
      setup: WS,
      steps: [...FIRST, ['lost', 1006], ['due'], ['token'], ['lost', 1006], ['due'], ['token'], ['lost', 1006], ['due'], ['token'], ['opened'], ['welcome'], ['wait', DEFAULT_TIMINGS.stableMs - 1], ['lost', 1006], ['due'], ['token'], ['opened'], ['welcome'], ['wait', DEFAULT_TIMINGS.stableMs], ['lost', 1006]],
      check: (d) => assert.deepEqual(delays(d), [0, 0, 1000, 2500, 5000, 0]),
    },
    {
      name: 'getToken failing is an error and a backoff',
      setup: WS,
      steps: [['start'], ['due'], ['token_failed', new Error('backend down')]],
      tail: ['token', 'error token', 'state disconnected', 'disconnected 1006 in 0', 'schedule 0'],
    },
  ];
  for (const row of rows) test(row.name, () => run(row));
});

describe('attempts: stopping', () => {
  const rows = [
    {
      name: 'told to stop (4500-4999): closed by the server, the credential dropped, nothing scheduled',
      steps: [...FIRST, ['opened'], ['welcome', { resume: 'r1' }], ['lost', 4503, 'replaced']],
      tail: ['state closed by server', 'stopped 4503'],
      state: 'stopped',
      check: (d) => assert.equal(d.credential.usable(), null),
    },
    {
      name: 'told to stop before a welcome: no /readyz asked, nothing counted',
      steps: [...FIRST, ['opened'], ['lost', 4501, 'kicked']],
      tail: ['open websocket given token=t1', 'state closed by server', 'stopped 4501'],
      check: (d) => assert.equal(d.order.failures, 0),
    },
    {
      name: 'getToken returning null: signed out',
      steps: [['start'], ['due'], ['token', null]],
      tail: ['token', 'signed_out getToken returned no token'],
      state: 'stopped',
    },
    {
      name: 'getToken throwing unauthorized: signed out',
      steps: [['start'], ['due'], ['token_failed', Object.assign(new Error('expired session'), { code: 'unauthorized' })]],
      tail: ['token', 'signed_out expired session'],
      state: 'stopped',
    },
    {
      name: 'a token that comes after a halt is not used',
      steps: [['start'], ['due']],
      check: (d) => {
        d.machine.halt();
        d.step(['token']);
        assert.deepEqual(d.trace.slice(-1), ['token']);
      },
    },
  ];
  for (const row of rows) test(row.name, () => run(row));
});

test('the credential part of a query: resume alone, else the token with the session; avoid either way', () => {
  assert.equal(credentialQuery({ resume: 'r/1', token: null, avoid: null }, 's1'), 'resume=r%2F1');
  assert.equal(credentialQuery({ resume: null, token: 't 1', avoid: 'n2' }, 's1'), 'token=t%201&session=s1&avoid=n2');
  assert.equal(credentialQuery({ resume: null, token: 't1', avoid: null }, null), 'token=t1');
});
