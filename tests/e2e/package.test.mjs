// The npm package (clients/js/, issue 34): `npm pack` makes a tarball of exactly the files
// the server serves (livegate.js, livegate.d.ts, livegate/*.js) with package.json and the
// README; installed into a scratch project (offline, from the tarball) it imports from
// Node by its name and type-checks under `tsc --strict` with Node's own module resolution
// (package.json `exports` and `types`). Run from the repository root:
// `node --test tests/e2e/`. Needs npm and typescript (`npm install --no-save --prefix tests/e2e`).

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { after, test } from 'node:test';

import { REPO, tempDir } from '../js/support/server.mjs';

const PACKAGE = path.join(REPO, 'clients/js');
const NAME = JSON.parse(readFileSync(path.join(PACKAGE, 'package.json'), 'utf8')).name;
const TSC = createRequire(import.meta.url).resolve('typescript/bin/tsc');

const cleanups = [];
after(() => {
  for (const cleanup of cleanups.reverse()) cleanup();
});
const scratch = (prefix) => {
  const dir = tempDir(prefix);
  cleanups.push(dir.remove);
  return dir.dir;
};

/** Runs `command args` in `cwd`; its stdout, or a failure with its output. */
function run(command, args, cwd) {
  const result = spawnSync(command, args, { cwd, encoding: 'utf8', timeout: 120_000, env: { ...process.env, npm_config_update_notifier: 'false' } });
  assert.equal(result.status, 0, `${command} ${args.join(' ')} in ${cwd}:\n${result.stdout}${result.stderr}`);
  return result.stdout;
}

test('npm pack: the tarball installs, imports from Node and type-checks with tsc --strict', { timeout: 120_000 }, () => {
  const packed = scratch('livegate-pack-');
  const report = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', packed], PACKAGE));
  const files = report[0].files.map((f) => f.path).sort();
  const modules = readdirSync(path.join(PACKAGE, 'livegate')).filter((name) => name.endsWith('.js')).map((name) => `livegate/${name}`);
  const expected = ['README.md', 'livegate.d.ts', 'livegate.js', ...modules, 'server.js', 'server.d.ts', 'dist/livegate.min.js', 'dist/livegate.iife.js', 'build.mjs', 'package.json'];
  assert.deepEqual(files, expected.sort(), 'the tarball holds the served files, the builds, the server helper, package.json and the README');
  const tarball = path.join(packed, report[0].filename);

  const project = scratch('livegate-scratch-');
  writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'scratch', private: true, type: 'module' }));
  run('npm', ['install', '--offline', '--no-audit', '--no-fund', '--no-package-lock', tarball], project);

  // Node: the package's entry by name, and its modules behind it.
  writeFileSync(path.join(project, 'use.mjs'), `
import { connect, EventStreamParser, DEFAULT_TIMINGS, endpointOf } from '${NAME}';
import * as min from '${NAME}/min';
import { signToken, verifyWebhook } from '${NAME}/server';
const messages = [];
new EventStreamParser((m) => messages.push(m)).push('data: hi\\n\\n');
const sockets = [];
class Socket { constructor(url) { sockets.push(url); } close() {} }
let now = 0;
const timers = [];
const client = connect({ url: 'http://gw.test', getToken: () => 'tok', WebSocket: Socket, fetch: null,
  clock: { now: () => now, setTimeout: (fn, ms) => timers.push(fn), clearTimeout: () => {} } });
timers.shift()();
await new Promise((resolve) => setImmediate(resolve));
client.close();
const helpers = [typeof min.connect, signToken({ user: 'u', key: 'k'.repeat(32) }).split('.').length, verifyWebhook('{}', 'sha256=00', 's')];
console.log(JSON.stringify({ messages, backoff: DEFAULT_TIMINGS.backoffMs.length, endpoint: endpointOf('https://a.test'), sockets, state: client.state, helpers }));
`);
  const used = JSON.parse(run(process.execPath, ['use.mjs'], project));
  assert.deepEqual(used, {
    messages: [{ type: 'message', data: 'hi' }],
    backoff: 5,
    endpoint: 'wss://a.test/v1/ws',
    sockets: ['ws://gw.test/v1/ws?token=tok'],
    state: 'closed',
    helpers: ['function', 3, false],
  });

  // TypeScript: the declarations found through package.json, with Node's resolution.
  writeFileSync(path.join(project, 'typed.ts'), `
import { connect, type LivegateEvent, type ClientState } from '${NAME}';
const client = connect({ url: 'https://push.example.com', getToken: async () => 'tok' });
client.subscribe<{ home: number }>('match:1').on('event', (event: LivegateEvent<{ home: number }>) => console.log(event.data.home));
const state: ClientState = client.state;
client.on('state', ({ previous, state: next, reason }) => console.log(previous, next, reason, state));
import { LivegateServer, signToken, verifyWebhook } from '${NAME}/server';
const backend = new LivegateServer({ url: 'http://127.0.0.1:7070', apiKey: 'key' });
void backend.publish('match:1', { n: 1 }, { id: 'x' }).then((r) => r.seq + (r.duplicate ? 0 : 1));
void backend.mintToken({ user: 'u', rooms: ['match:*'] }).then(({ token, expiresAtMs }) => token.length + expiresAtMs);
const jwt: string = signToken({ user: 'u', key: 'k'.repeat(32), publish: ['chat:*'] });
const signed: boolean = verifyWebhook(new TextEncoder().encode('{}'), 'sha256=00', 'secret');
console.log(jwt, signed);
`);
  writeFileSync(path.join(project, 'tsconfig.json'), JSON.stringify({
    compilerOptions: { noEmit: true, strict: true, target: 'es2022', module: 'node16', moduleResolution: 'node16', lib: ['es2022', 'dom'], types: [] },
    files: ['typed.ts'],
  }));
  run(process.execPath, [TSC, '-p', project, '--pretty', 'false'], project);

  // The check can fail: a misuse does not type-check.
  writeFileSync(path.join(project, 'typed.ts'), `import { connect } from '${NAME}';\nconnect({ getToken: () => 'tok', transports: ['carrier-pigeon'] });\n`);
  const misuse = spawnSync(process.execPath, [TSC, '-p', project, '--pretty', 'false'], { cwd: project, encoding: 'utf8', timeout: 120_000 });
  assert.notEqual(misuse.status, 0, 'tsc refuses an unknown transport');
  assert.match(misuse.stdout, /carrier-pigeon/);
});
