// livegate.js in Node 20 without --experimental-websocket (no global WebSocket): with the
// `ws` package installed beside it (an optional peer dependency) the client loads it and
// publishes over WebSocket; without it the client says so with a `warning` and uses SSE,
// never silently. The package is installed into a scratch project as npm would (a copy of
// clients/js/ under node_modules/livegate-client, `ws` beside it), and a child `node`
// without flags runs against a real server. Run from the repository root:
// `node --test tests/e2e/`. Needs `npm install --no-save --prefix tests/e2e` (ws).

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { API_KEY, REPO, startServer, tempDir } from '../js/support/server.mjs';

const WS = path.dirname(createRequire(import.meta.url).resolve('ws/package.json'));

const cleanups = [];
let server;
before(async () => {
  const data = tempDir('livegate-node20-');
  cleanups.push(data.remove);
  server = await startServer({ dataDir: data.dir });
  cleanups.push(() => server.stop());
});
after(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
});

/** A scratch project with the package installed (and `ws` when `withWs`). */
function project(withWs) {
  const dir = tempDir('livegate-node20-project-');
  cleanups.push(dir.remove);
  const modules = path.join(dir.dir, 'node_modules');
  mkdirSync(modules);
  cpSync(path.join(REPO, 'clients/js'), path.join(modules, 'livegate-client'), { recursive: true, filter: (src) => !src.includes('node_modules') });
  if (withWs) cpSync(WS, path.join(modules, 'ws'), { recursive: true });
  writeFileSync(path.join(dir.dir, 'package.json'), JSON.stringify({ name: 'scratch', private: true, type: 'module' }));
  writeFileSync(
    path.join(dir.dir, 'main.mjs'),
    `
import { connect } from 'livegate-client';
const base = process.env.BASE;
const getToken = async () => {
  const r = await fetch(base + '/v1/tokens', { method: 'POST', headers: { Authorization: 'Bearer ${API_KEY}', 'Content-Type': 'application/json' },
    body: JSON.stringify({ user: 'nod', publish: ['chat:*'] }) });
  return r.json();
};
const warnings = [];
const client = connect({ url: base, getToken });
client.on('warning', (w) => warnings.push(w.code));
const connected = await new Promise((resolve) => client.on('connected', resolve));
let published = null;
try {
  published = (await client.publish('chat:node20', { hi: 1 }, { timeoutMs: 5000 })).seq;
} catch (error) {
  published = error.code;
}
client.close();
console.log(JSON.stringify({ node: process.versions.node, globalWebSocket: typeof globalThis.WebSocket, transport: connected.transport, warnings, published }));
`,
  );
  return dir.dir;
}

function run(dir) {
  const env = { ...process.env, BASE: server.url };
  delete env.NODE_OPTIONS; // no --experimental-websocket from outside
  const result = spawnSync(process.execPath, ['main.mjs'], { cwd: dir, encoding: 'utf8', timeout: 30_000, env });
  assert.equal(result.status, 0, result.stdout + result.stderr);
  return JSON.parse(result.stdout.trim().split('\n').at(-1));
}

test('Node without a global WebSocket: the ws package beside livegate-client gives WebSocket, publish works', { timeout: 60_000 }, () => {
  const out = run(project(true));
  assert.equal(out.transport, 'websocket', JSON.stringify(out));
  assert.deepEqual(out.warnings, []);
  assert.equal(out.published, 1);
});

test('Node without a global WebSocket and without ws: SSE with a no_websocket warning, publish unsupported', { timeout: 60_000 }, (t) => {
  const out = run(project(false));
  if (out.globalWebSocket === 'function') {
    t.diagnostic(`Node ${out.node} has a global WebSocket: nothing to fall back from`);
    assert.equal(out.transport, 'websocket');
    return;
  }
  assert.equal(out.transport, 'sse', JSON.stringify(out));
  assert.deepEqual(out.warnings, ['no_websocket', 'unsupported'], 'told at the fallback and at the publish');
  assert.equal(out.published, 'unsupported');
});
