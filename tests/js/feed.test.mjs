// The feed machine of livegate.js (clients/js/livegate/feed.js) on its own, in virtual
// time: no socket, no client, no timers. Each row of the tables below is a script of
// inputs and the actions the feed must ask for, in order, with the state it ends in; a
// seeded simulation then drives a feed against a modelled server that drops, repeats and
// trims events and loses the connection, and checks what an application relies on: each
// subscription sees each event at most once and in order, and every seq it never sees
// was announced as lost (recovery_failed, or a reply with recovered:false).

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { DEFAULT_TIMINGS, connect } from '../../clients/js/livegate.js';
import { Feed, HISTORY_PAGE, MAX_HELD_EVENTS } from '../../clients/js/livegate/feed.js';
import { recorder } from './support/clients.mjs';
import { fakeSocketClass } from './support/fake-socket.mjs';
import { VirtualClock } from './support/virtual-clock.mjs';

const RESUBSCRIBE_MS = 1000;

/** A subscription as the feed sees it (what it asked, its position), named for the trace. */
function sub(name, { since = null, state = false, presence = false } = {}) {
  return { name, floor: since, wantsState: state, wantsPresence: presence };
}

const event = (seq, id = `e-${seq}`) => ({ room: 'r', seq, id, ts_ms: 1, data: { n: seq } });
const range = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

/**
 * A feed on room `r` with the subscriptions `subs` (the first starts it, at `since` in
 * `epoch`), driven by steps; `trace` is every action it asked for, as text.
 */
class Driver {
  constructor({ subs = [sub('a')], since = null, epoch = null } = {}) {
    this.feed = new Feed('r', { resubscribeMs: RESUBSCRIBE_MS });
    this.now = 0;
    this.trace = [];
    this.history = null; // the last history action: {since, limit, token}
    this.feed.start(subs[0], since, epoch);
    for (const other of subs.slice(1)) this.feed.join(other);
  }

  /** Runs a step `[input, ...arguments]` and takes every action it leads to. */
  step([input, ...args]) {
    const feed = this.feed;
    switch (input) {
      case 'subscribe':
        feed.subscribe(args[0]);
        break;
      case 'stream':
        feed.streamOpened(args[0] ?? false);
        break;
      case 'reply': {
        const fields = args[0] ?? {};
        const frame = { op: 'subscribed', room: 'r', epoch: 'E1', ...fields };
        if (!('ref' in fields)) frame.ref = feed.ref === 'sse' ? undefined : feed.ref;
        feed.subscribed(frame);
        break;
      }
      case 'events':
        for (const seq of args) feed.event(typeof seq === 'number' ? event(seq) : seq);
        break;
      case 'history': {
        const { seqs = [], epoch = 'E1', token = this.history?.token } = args[0] ?? {};
        feed.historyReply(token, { op: 'history', room: 'r', epoch, events: seqs.map((seq) => event(seq)) });
        break;
      }
      case 'history_failed':
        feed.historyFailed(this.history?.token, { code: args[0] });
        break;
      case 'refused':
        feed.refused({ op: 'error', code: args[0], message: `refused: ${args[0]}` }, args[1] ?? {}, this.now);
        break;
      case 'presence':
        feed.presence({ room: 'r', count: args[0], joined: null, left: null });
        break;
      case 'lost':
        feed.lost();
        break;
      case 'end':
        feed.end();
        break;
      case 'wait':
        this.wait(args[0]);
        break;
      default:
        throw new Error(`no step ${input}`);
    }
    this.take();
  }

  /** Moves virtual time on by `ms`, ticking the feed at each deadline on the way. */
  wait(ms) {
    const until = this.now + ms;
    for (let at = this.feed.deadline(); at != null && at <= until; at = this.feed.deadline()) {
      this.now = at;
      this.feed.tick(at);
      this.take();
    }
    this.now = until;
  }

  take() {
    for (let action = this.feed.poll(); action; action = this.feed.poll()) this.trace.push(this.describe(action));
  }

  describe(action) {
    switch (action.type) {
      case 'send': {
        const { since, epoch, state, presence } = action.frame;
        const parts = ['send subscribe'];
        if (since != null) parts.push(`since=${since}`);
        if (epoch != null) parts.push(`epoch=${epoch}`);
        if (state) parts.push('state');
        if (presence) parts.push('presence');
        return parts.join(' ');
      }
      case 'history':
        this.history = action;
        return `history since=${action.since} limit=${action.limit}`;
      case 'emit': {
        const { code, seq, reason } = action.detail;
        return `emit ${action.name} ${code ?? ''}${seq ?? ''}${reason ? ` ${reason}` : ''}`.trimEnd();
      }
      case 'tell': {
        const to = action.subs ? action.subs.map((s) => s.name).join(',') || '-' : '*';
        const { seq, code, count, reason } = action.detail;
        const what = action.name === 'presence' ? count : action.name === 'error' ? code : seq ?? '';
        return `${to} ${action.name} ${what}${reason ? ` ${reason}` : ''}${action.later ? ' later' : ''}`.trimEnd();
      }
      case 'subscribed':
        const { seq, recovered } = action.reply;
        return `subscribed ${seq}${recovered != null ? ` recovered=${recovered}` : ''}`;
      case 'end':
        return `end ${action.code}`;
      default:
        return action.type;
    }
  }
}

/** Runs a row: its steps, then checks the trace, the state and the position. */
function run(row) {
  const driver = new Driver(row.setup);
  for (const step of row.steps) driver.step(step);
  if (row.trace) assert.deepEqual(driver.trace, row.trace, 'the actions, in order');
  if (row.state) assert.equal(driver.feed.state, row.state, 'the state it ends in');
  if (row.position) assert.deepEqual(driver.feed.position(), row.position, 'where delivery stands');
  return driver;
}

/** The first subscribe answered at head `seq` (E1): the feed is live. */
const LIVE_AT = (seq) => [['subscribe'], ['reply', { seq }]];

describe('the feed: subscribing and live', () => {
  const rows = [
    {
      name: 'a first subscribe has no since; the reply starts the room at its head',
      steps: [['subscribe'], ['reply', { seq: 5 }], ['events', 6, 7]],
      trace: ['send subscribe', 'subscribed 5', 'a event 6', 'a event 7'],
      state: 'live',
      position: { epoch: 'E1', seq: 7 },
    },
    {
      name: 'a subscription with since asks from there, in its epoch',
      setup: { subs: [sub('a', { since: 3 })], since: 3, epoch: 'E1' },
      steps: [['subscribe'], ['reply', { seq: 5, recovered: true }], ['events', 4, 5]],
      trace: [
        'send subscribe since=3 epoch=E1',
        'subscribed 5 recovered=true',
        'emit recovered 5',
        'a recovered 5',
        'a event 4',
        'a event 5',
      ],
      state: 'live',
    },
    {
      name: 'events before the reply are held, then delivered in seq order',
      steps: [['subscribe'], ['events', 7, 6], ['reply', { seq: 5 }]],
      trace: ['send subscribe', 'subscribed 5', 'a event 6', 'a event 7'],
      state: 'live',
    },
    {
      name: 'a repeated seq, and a repeated id under a new seq, are delivered once',
      steps: [...LIVE_AT(5), ['events', 6, 6, event(7, 'e-6'), 8]],
      trace: ['send subscribe', 'subscribed 5', 'a event 6', 'a event 8'],
      position: { epoch: 'E1', seq: 8 },
    },
    {
      name: 'a reply that does not answer the subscribe in flight changes nothing',
      steps: [['subscribe'], ['reply', { seq: 5, ref: 99 }], ['reply', { seq: 5, ref: null }], ['events', 6]],
      trace: ['send subscribe'],
      state: 'subscribing',
    },
    {
      name: 'recovered:false: recovery_failed, and the room goes on from the head',
      setup: { since: 3, epoch: 'E1' },
      steps: [['subscribe'], ['reply', { seq: 9, recovered: false }], ['events', 10]],
      trace: [
        'send subscribe since=3 epoch=E1',
        'subscribed 9 recovered=false',
        'emit recovery_failed 9 not_recovered',
        'a recovery_failed 9 not_recovered',
        'a event 10',
      ],
      position: { epoch: 'E1', seq: 10 },
    },
    {
      name: 'a reply in another epoch (no recovered field) starts the room at its head',
      setup: { since: 3, epoch: 'E0' },
      steps: [['subscribe'], ['reply', { seq: 2 }], ['events', 3]],
      trace: ['send subscribe since=3 epoch=E0', 'subscribed 2', 'a event 3'],
      position: { epoch: 'E1', seq: 3 },
    },
    {
      name: 'presence changes go to the subscriptions that asked for them',
      setup: { subs: [sub('a'), sub('b', { presence: true })] },
      steps: [['subscribe'], ['reply', { seq: 0 }], ['presence', 2]],
      trace: ['send subscribe presence', 'subscribed 0', 'b presence 2'],
    },
    {
      name: 'the connection lost: resubscribing; the next subscribe asks from the last delivered seq',
      steps: [
        ...LIVE_AT(5),
        ['events', 6],
        ['lost'],
        ['subscribe'],
        ['reply', { seq: 8, recovered: true }],
        ['events', 7, 8],
      ],
      trace: [
        'send subscribe',
        'subscribed 5',
        'a event 6',
        'send subscribe since=6 epoch=E1',
        'subscribed 8 recovered=true',
        'emit recovered 8',
        'a recovered 8',
        'a event 7',
        'a event 8',
      ],
      state: 'live',
    },
    {
      name: 'ended: the queued actions are dropped and nothing changes it any more',
      steps: [
        ['subscribe'],
        ['refused', 'unavailable'],
        ['end'],
        ['reply', { seq: 5, ref: 1 }],
        ['events', 6],
        ['lost'],
        ['subscribe'],
        ['wait', 10 * RESUBSCRIBE_MS],
      ],
      trace: ['send subscribe', 'emit error unavailable', 'a error unavailable'],
      state: 'ended',
    },
  ];
  for (const row of rows) test(row.name, () => run(row));

  test('a later subscription with an earlier since moves the room back (the server replays)', () => {
    const driver = run({ steps: [...LIVE_AT(5), ['events', 6, 7]] });
    const late = sub('b', { since: 5 });
    assert.equal(driver.feed.join(late), true, 'subscribe again');
    assert.equal(driver.feed.position().seq, 5);
    driver.trace.length = 0;
    for (const step of [['subscribe'], ['reply', { seq: 7, recovered: true }], ['events', 6, 7, 8]]) driver.step(step);
    assert.deepEqual(driver.trace, [
      'send subscribe since=5 epoch=E1',
      'subscribed 7 recovered=true',
      'emit recovered 7',
      'a,b recovered 7',
      'b event 6',
      'b event 7',
      'a,b event 8',
    ]);
  });

  test('a later subscription that asks nothing new shares the subscription as it is', () => {
    const driver = run({ steps: [...LIVE_AT(5), ['events', 6]] });
    assert.equal(driver.feed.join(sub('b')), false);
    assert.equal(driver.feed.awaiting, false);
  });
});

describe('the feed: filling a gap', () => {
  const rows = [
    {
      name: 'a gap is filled with history before the later events',
      steps: [...LIVE_AT(5), ['events', 6, 9, 10], ['events', 11, 10], ['history', { seqs: [7, 8] }]],
      trace: [
        'send subscribe',
        'subscribed 5',
        'a event 6',
        'history since=6 limit=2',
        'a event 7',
        'a event 8',
        'a event 9',
        'a event 10',
        'a event 11',
      ],
      state: 'live',
      position: { epoch: 'E1', seq: 11 },
    },
    {
      name: 'a gap wider than a page is filled page by page',
      steps: [...LIVE_AT(0), ['events', HISTORY_PAGE + 5], ['history', { seqs: range(1, HISTORY_PAGE) }]],
      trace: [
        'send subscribe',
        'subscribed 0',
        `history since=0 limit=${HISTORY_PAGE}`,
        ...range(1, HISTORY_PAGE).map((s) => `a event ${s}`),
        `history since=${HISTORY_PAGE} limit=4`,
      ],
      state: 'filling',
    },
    {
      name: 'history that no longer covers the gap: recovery_failed, then delivery goes on',
      steps: [...LIVE_AT(10), ['events', 11, 15], ['history', { seqs: [13, 14] }], ['events', 16]],
      trace: [
        'send subscribe',
        'subscribed 10',
        'a event 11',
        'history since=11 limit=3',
        'emit recovery_failed 14 history_trimmed',
        'a recovery_failed 14 history_trimmed',
        'a event 15',
        'a event 16',
      ],
      position: { epoch: 'E1', seq: 16 },
    },
    {
      name: 'history in another epoch: recovery_failed epoch_changed',
      steps: [...LIVE_AT(1), ['events', 3], ['history', { seqs: [2], epoch: 'E2' }]],
      trace: [
        'send subscribe',
        'subscribed 1',
        'history since=1 limit=1',
        'emit recovery_failed 2 epoch_changed',
        'a recovery_failed 2 epoch_changed',
        'a event 3',
      ],
    },
    {
      name: 'history refused (a timeout): recovery_failed with its code',
      steps: [...LIVE_AT(1), ['events', 3], ['history_failed', 'timeout']],
      trace: [
        'send subscribe',
        'subscribed 1',
        'history since=1 limit=1',
        'emit recovery_failed 2 timeout',
        'a recovery_failed 2 timeout',
        'a event 3',
      ],
      state: 'live',
    },
    {
      name: 'history failed because the connection went: quietly resubscribing',
      steps: [...LIVE_AT(1), ['events', 3], ['history_failed', 'disconnected']],
      trace: ['send subscribe', 'subscribed 1', 'history since=1 limit=1'],
      state: 'resubscribing',
      position: { epoch: 'E1', seq: 1 },
    },
    {
      name: 'the connection lost while filling: a late history reply is ignored',
      steps: [...LIVE_AT(1), ['events', 3], ['lost'], ['history', { seqs: [2] }], ['subscribe']],
      trace: ['send subscribe', 'subscribed 1', 'history since=1 limit=1', 'send subscribe since=1 epoch=E1'],
      state: 'subscribing',
    },
  ];
  for (const row of rows) test(row.name, () => run(row));
});

describe('the feed: the bound on held events', () => {
  const held = range(11, 11 + MAX_HELD_EVENTS);
  const name = `${MAX_HELD_EVENTS} events held while subscribing, one more: subscribe again from the last seq`;
  test(name, () => {
    const driver = run({ setup: { since: 10, epoch: 'E1' }, steps: [['subscribe'], ['events', ...held]] });
    assert.deepEqual(driver.trace, ['send subscribe since=10 epoch=E1', 'send subscribe since=10 epoch=E1']);
    assert.equal(driver.feed.held.length, 0, 'the held events are dropped: the server replays them');
    assert.equal(driver.feed.ref, 2, 'the first reply no longer counts');
  });

  test('over SSE the stream is reopened instead', () => {
    const driver = run({ setup: { since: 10, epoch: 'E1' }, steps: [['stream'], ['events', ...held]] });
    assert.deepEqual(driver.trace, ['reopen']);
    assert.equal(driver.feed.state, 'subscribing');
    assert.equal(driver.feed.held.length, 0);
  });

  test('while a gap is filled, too', () => {
    const driver = run({ steps: [...LIVE_AT(10), ['events', 12], ['events', ...range(13, 12 + MAX_HELD_EVENTS)]] });
    assert.deepEqual(driver.trace.slice(-2), ['history since=10 limit=1', 'send subscribe since=10 epoch=E1']);
    assert.equal(driver.feed.state, 'subscribing');
  });
});

describe('the feed: over SSE', () => {
  const rows = [
    {
      name: "the stream's subscribed has no ref; a notice without epoch (the inbox's) is not the reply",
      steps: [['stream'], ['reply', { seq: 3, epoch: null }], ['reply', { seq: 5 }], ['events', 6]],
      trace: ['subscribed 5', 'a event 6'],
      state: 'live',
    },
    {
      name: 'a gap reopens the stream (no history requests); later events are held, then dropped on the reopen',
      steps: [
        ['stream'],
        ['reply', { seq: 5 }],
        ['events', 6, 8, 9],
        ['lost'],
        ['stream', true],
        ['reply', { seq: 9, recovered: true }],
      ],
      trace: ['subscribed 5', 'a event 6', 'reopen', 'subscribed 9 recovered=true'],
      state: 'live',
      position: { epoch: 'E1', seq: 6 },
    },
    {
      name: 'a stream opened again at first (not quiet): its recovered is told',
      steps: [['stream'], ['reply', { seq: 5 }], ['lost'], ['stream', false], ['reply', { seq: 5, recovered: true }]],
      trace: ['subscribed 5', 'subscribed 5 recovered=true', 'emit recovered 5', 'a recovered 5'],
    },
    {
      name: 'a state that leaves a subscription behind over SSE asks no history',
      setup: { subs: [sub('a', { state: true }), sub('b', { since: 2 })], since: null },
      steps: [['stream'], ['reply', { seq: 9, state: { seq: 7, data: 'S' } }]],
      trace: ['subscribed 9', 'a state 7'],
      state: 'live',
    },
  ];
  for (const row of rows) test(row.name, () => run(row));
});

describe('the feed: room state', () => {
  const rows = [
    {
      name: 'the state first, then only the events after its seq',
      setup: { subs: [sub('a', { state: true })] },
      steps: [['subscribe'], ['events', 6, 8], ['reply', { seq: 8, state: { seq: 7, data: 'S' } }]],
      trace: ['send subscribe state', 'subscribed 8', 'a state 7', 'a event 8'],
      position: { epoch: 'E1', seq: 8 },
    },
    {
      name: 'a subscription without state behind the state gets what it stands for, as events (history)',
      setup: { subs: [sub('a', { since: 4 }), sub('b', { state: true })], since: 4, epoch: 'E1' },
      steps: [['subscribe'], ['reply', { seq: 7, state: { seq: 7, data: 'S' } }], ['history', { seqs: [5, 6, 7] }]],
      trace: [
        'send subscribe state',
        'subscribed 7',
        'b state 7',
        'history since=4 limit=3',
        'a event 5',
        'a event 6',
        'a event 7',
      ],
      state: 'live',
    },
    {
      name: 'no state (null): the first event after the reply starts the view, wherever it is',
      setup: { subs: [sub('a', { state: true })] },
      steps: [['subscribe'], ['reply', { seq: 40, state: null }], ['events', 38, 39]],
      trace: ['send subscribe state', 'subscribed 40', 'a state 0', 'a event 38', 'a event 39'],
    },
    {
      name: 'a failed recovery brings the state instead of recovery_failed',
      setup: { subs: [sub('a', { state: true })] },
      steps: [
        ['subscribe'],
        ['reply', { seq: 5, state: { seq: 5, data: 'S0' } }],
        ['lost'],
        ['subscribe'],
        ['reply', { seq: 20, recovered: false, state: { seq: 19, data: 'S' } }],
      ],
      trace: [
        'send subscribe state',
        'subscribed 5',
        'a state 5',
        'send subscribe since=5 epoch=E1 state',
        'subscribed 20 recovered=false',
        'a state 19',
        'emit recovered 19',
        'a recovered 19',
      ],
    },
    {
      name: 'a server that lacks room state: the feed goes on without, told why',
      setup: { subs: [sub('a', { state: true })] },
      steps: [['subscribe', { state: true }], ['reply', { seq: 3 }]],
      trace: ['emit error unsupported', '* error unsupported later', 'send subscribe', 'subscribed 3'],
    },
    {
      name: 'a server that predates state replies without it: an error, delivery as usual',
      setup: { subs: [sub('a', { state: true })] },
      steps: [['subscribe'], ['reply', { seq: 3 }], ['events', 4]],
      trace: ['send subscribe state', 'subscribed 3', 'emit error unsupported', 'a event 4'],
    },
  ];
  for (const row of rows) test(row.name, () => run(row));
});

describe('the feed: refusals and time', () => {
  const rows = [
    {
      name: 'unavailable: told, and subscribed again after resubscribeMs of virtual time, not before',
      steps: [['subscribe'], ['refused', 'unavailable'], ['wait', RESUBSCRIBE_MS - 1]],
      trace: ['send subscribe', 'emit error unavailable', 'a error unavailable'],
      state: 'resubscribing',
    },
    {
      name: 'unavailable, then the retry is due',
      steps: [['subscribe'], ['refused', 'unavailable'], ['wait', RESUBSCRIBE_MS]],
      trace: ['send subscribe', 'emit error unavailable', 'a error unavailable', 'resubscribe'],
      state: 'resubscribing',
    },
    {
      name: 'the connection lost before the retry is due: no retry (the next connection subscribes)',
      steps: [['subscribe'], ['refused', 'unavailable'], ['wait', 10], ['lost'], ['wait', 10 * RESUBSCRIBE_MS]],
      trace: ['send subscribe', 'emit error unavailable', 'a error unavailable'],
    },
    {
      name: 'a final refusal ends the room',
      steps: [['subscribe'], ['refused', 'forbidden'], ['events', 1], ['wait', 10 * RESUBSCRIBE_MS]],
      trace: ['send subscribe', 'emit error forbidden', 'a error forbidden', 'end forbidden'],
      state: 'ended',
    },
    {
      name: 'bad_request from a server without features: it lacks the newest flag asked; asked again without it',
      setup: { subs: [sub('a', { state: true, presence: true })] },
      steps: [['subscribe'], ['refused', 'bad_request', { featuresKnown: false }], ['subscribe']],
      trace: [
        'send subscribe state presence',
        'emit error unsupported',
        'a error unsupported',
        'resubscribe',
        'send subscribe state',
      ],
      state: 'subscribing',
    },
  ];
  for (const row of rows) test(row.name, () => run(row));

  test('the deadline is the retry time, and goes with a new subscribe', () => {
    const driver = run({ steps: [['subscribe'], ['wait', 500], ['refused', 'unavailable']] });
    assert.equal(driver.feed.deadline(), 500 + RESUBSCRIBE_MS);
    driver.step(['subscribe']);
    assert.equal(driver.feed.deadline(), null);
  });
});

/** A small seeded generator (mulberry32): the same seed, the same run. */
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * One simulated run: a server whose log grows, whose stream to the client drops and
 * repeats events, whose history is trimmed from below, and connections that are lost;
 * the client's part played as client.js plays it (actions carried out, replies fed back,
 * some of them late). Returns what each subscription was told.
 */
function simulate(seed, { stream = false } = {}) {
  const random = prng(seed);
  const chance = (p) => random() < p;
  const log = []; // seqs 1..head
  let trimmed = 0; // history and replay hold seqs > trimmed
  const feed = new Feed('r', { resubscribeMs: RESUBSCRIBE_MS });
  const subs = [sub('a'), sub('b')];
  feed.start(subs[0]);
  feed.join(subs[1]);
  const told = new Map(subs.map((s) => [s, []])); // ['event', seq] | ['lost', seq] | ['reset', head]
  let connected = false;
  let pending = []; // server -> client: () => input, in order
  let later = []; // history replies that come late
  let now = 0;
  const since = () => feed.last;

  const counts = {}; // actions by type (and recovery_failed), to show the run went through them
  const carryOut = () => {
    for (let action = feed.poll(); action; action = feed.poll()) {
      const kind = action.type === 'emit' ? action.name : action.type;
      counts[kind] = (counts[kind] ?? 0) + 1;
      if (action.type === 'send' && connected) {
        const from = action.frame.since;
        const ref = action.frame.ref;
        pending.push(() => reply(ref, from));
      } else if (action.type === 'history' && connected) {
        const { token, since: after, limit } = action;
        const events = log.filter((seq) => seq > Math.max(after, trimmed)).slice(0, limit);
        const answer = () => feed.historyReply(token, { epoch: 'E1', events: events.map((seq) => event(seq)) });
        if (chance(0.3)) later.push(answer);
        else pending.push(answer);
      } else if ((action.type === 'reopen' || action.type === 'resubscribe') && connected) {
        lose();
        connect(true);
      } else if (action.type === 'tell') {
        for (const s of action.subs ?? subs) {
          if (action.name === 'event') told.get(s).push(['event', action.detail.seq]);
          if (action.name === 'recovery_failed') told.get(s).push(['lost', action.detail.seq]);
        }
      } else if (action.type === 'subscribed' && action.reply.recovered !== true) {
        // A first reply starts the room at its head; recovered:false skips to it, told.
        for (const s of subs) told.get(s).push(['reset', action.reply.seq]);
      }
    }
  };
  /** The server's answer to a subscribe from `from`: the reply, then the replay. */
  const reply = (ref, from) => {
    const head = log.length;
    const recovered = from == null ? undefined : from >= trimmed;
    const frame = { op: 'subscribed', room: 'r', epoch: 'E1', seq: head, ref: stream ? undefined : ref, recovered };
    feed.subscribed(frame);
    if (recovered) for (const seq of log.filter((s) => s > from)) feed.event(event(seq));
  };
  const connect = (reopen = false) => {
    connected = true;
    if (stream) {
      feed.streamOpened(reopen);
      const from = since();
      pending.push(() => reply(undefined, from));
    } else feed.subscribe();
  };
  const lose = () => {
    connected = false;
    pending = [];
    later = [];
    feed.lost();
  };

  connect();
  carryOut();
  for (let round = 0; round < 400; round++) {
    const roll = random();
    if (roll < 0.45) {
      // A publish: the event goes out live, unless the stream drops it; some twice.
      log.push(log.length + 1);
      const seq = log.length;
      if (connected && !chance(0.1)) pending.push(() => feed.event(event(seq)));
      if (connected && chance(0.05)) pending.push(() => feed.event(event(seq)));
    } else if (roll < 0.8 && pending.length) {
      pending.shift()();
    } else if (roll < 0.85 && later.length) {
      later.shift()();
    } else if (roll < 0.88) {
      trimmed = Math.min(log.length, trimmed + 1 + Math.floor(random() * 5));
    } else if (roll < 0.91 && connected) {
      lose();
    } else if (roll < 0.95 && !connected) {
      connect();
    } else {
      now += Math.floor(random() * 2 * RESUBSCRIBE_MS);
      feed.tick(now);
    }
    carryOut();
  }
  // Quiet: no more faults; everything in flight arrives, then one more event (the last
  // ones may have been dropped: a later one shows the gap), and the feed catches up.
  if (!connected) connect();
  carryOut();
  const deliverAll = () => {
    for (let i = 0; i < 10_000 && (pending.length || later.length); i++) {
      (pending.length ? pending : later).shift()();
      carryOut();
    }
  };
  deliverAll();
  log.push(log.length + 1);
  feed.event(event(log.length));
  carryOut();
  deliverAll();
  return { told, head: log.length, feed, subs, counts };
}

describe('the feed against a simulated server', () => {
  for (const stream of [false, true]) {
    const how = stream ? 'SSE (gaps reopen the stream)' : 'WebSocket (gaps filled with history)';
    test(`over ${how}: once, in order, every missing seq announced, caught up at the end`, () => {
      const total = {};
      for (let seed = 1; seed <= 200; seed++) {
        const { told, head, feed, counts } = simulate(seed, { stream });
        for (const [kind, n] of Object.entries(counts)) total[kind] = (total[kind] ?? 0) + n;
        for (const [s, seen] of told) {
          let at = 0; // the last seq this subscription saw, or was told it will not see
          for (const [what, seq] of seen) {
            if (what !== 'event') {
              at = Math.max(at, seq);
              continue;
            }
            assert.ok(seq > at, `seed ${seed}, ${s.name}: ${seq} after ${at}: at most once, in order`);
            const gap = `the seqs from ${at + 1} to ${seq - 1} went unannounced`;
            assert.equal(seq, at + 1, `seed ${seed}, ${s.name}: ${gap}`);
            at = seq;
          }
          assert.equal(feed.state, 'live', `seed ${seed}: live at the end`);
          assert.equal(feed.last, head, `seed ${seed}, ${s.name}: caught up with the head`);
        }
      }
      // The runs went through the recoveries this checks.
      for (const kind of [stream ? 'reopen' : 'history', 'recovered', 'recovery_failed']) {
        assert.ok(total[kind] > 0, `${kind} in some run: ${JSON.stringify(total)}`);
      }
    });
  }
});

describe('the client carries out a feed', () => {
  const name = 'a subscribe refused as unavailable is sent again after resubscribeMs on its clock; a loss cancels it';
  test(name, { timeout: 10_000 }, async () => {
    const clock = new VirtualClock();
    const Fake = fakeSocketClass(undefined, clock);
    const client = connect({
      clock: clock.option,
      url: 'http://gw.test',
      getToken: async () => 'tok',
      WebSocket: Fake,
      fetch: null,
      random: () => 0,
    });
    const log = recorder(client);
    try {
      const ws = await Fake.nth(0);
      ws.welcome();
      const subscription = client.subscribe('r');
      const first = await ws.expect('subscribe');
      ws.serverSend({ op: 'error', ref: first.ref, code: 'unavailable', message: 'try again' });
      await clock.advance(DEFAULT_TIMINGS.resubscribeMs - 1);
      assert.equal(ws.frames('subscribe').length, 1, 'not before resubscribeMs');
      assert.deepEqual(log.error.map((e) => e.code), ['unavailable']);
      await clock.advance(1);
      assert.equal(ws.frames('subscribe').length, 2, 'again at resubscribeMs');
      const second = ws.frames('subscribe')[1];
      ws.serverSend({ op: 'subscribed', room: 'r', epoch: 'E1', seq: 4, ref: second.ref });
      await subscription.ready();
      assert.equal(subscription.state, 'subscribed');

      // Refused again, then the connection goes before the retry: the retry never fires
      // on it, the next connection subscribes (once) from the room's position.
      ws.serverSend({ op: 'error', ref: second.ref, code: 'unavailable', message: 'try again' });
      ws.serverClose(1011, 'gone');
      const next = await Fake.nth(1, 60_000);
      next.welcome();
      const third = await next.expect('subscribe');
      assert.equal(third.since, 4);
      await clock.advance(10 * DEFAULT_TIMINGS.resubscribeMs);
      assert.equal(next.frames('subscribe').length, 1, 'no stale retry');
      assert.equal(ws.frames('subscribe').length, 2);
    } finally {
      client.close();
    }
  });
});
