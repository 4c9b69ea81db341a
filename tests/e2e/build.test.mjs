// The builds of clients/js/dist/ (committed): rebuilt here with the esbuild version
// clients/js/package.json pins, they must equal the committed files byte for byte (so the
// files never drift from the modules); package.json `exports` and `files` list them; the
// minified ES module exports what livegate.js exports and works (a client connects to a
// real server and gets an event); the classic script defines the global `Livegate` with
// the same API; the server serves the minified module at /livegate.js. Prints the sizes
// (min and min+gzip). Run from the repository root: `node --test tests/e2e/`. Needs
// `npm install --no-save --prefix tests/e2e` (esbuild) and target/release/livegate.
// After changing a module: `npm install && npm run build` in clients/js/.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import vm from 'node:vm';
import { gzipSync } from 'node:zlib';
import { after, before, test } from 'node:test';

import { BUILDS, build } from '../../clients/js/build.mjs';
import { waitFor } from '../js/support/clock.mjs';
import { REPO, WebSocketImpl, mintToken, publish, startServer, tempDir } from '../js/support/server.mjs';

const PACKAGE = path.join(REPO, 'clients/js');
const manifest = JSON.parse(readFileSync(path.join(PACKAGE, 'package.json'), 'utf8'));
const require = createRequire(import.meta.url);
let esbuild;
try {
  esbuild = require('esbuild');
} catch (error) {
  throw new Error(`esbuild is missing: npm install --no-save --prefix tests/e2e (${error.message})`);
}
const dist = (file) => readFileSync(path.join(PACKAGE, 'dist', file), 'utf8');

let server;
let data;
before(async () => {
  data = tempDir('livegate-build-');
  server = await startServer({ dataDir: data.dir });
});
after(async () => {
  await server?.stop();
  data?.remove();
});

test('dist/ is what the pinned esbuild makes of the modules', { timeout: 60_000 }, async (t) => {
  assert.equal(esbuild.version, manifest.devDependencies.esbuild, 'tests/e2e installs the esbuild clients/js pins (exact version)');
  assert.match(manifest.devDependencies.esbuild, /^\d+\.\d+\.\d+$/, 'pinned to one version');
  const built = await build(esbuild);
  assert.deepEqual(Object.keys(built).sort(), BUILDS.map((b) => b.file).sort());
  for (const [file, text] of Object.entries(built)) {
    assert.ok(text === dist(file), `clients/js/dist/${file} differs from a fresh build: cd clients/js && npm install && npm run build`);
    t.diagnostic(`dist/${file}: ${text.length} bytes minified, ${gzipSync(text, { level: 9 }).length} bytes min+gzip`);
  }
});

test('package.json exports and files list the builds and the server helper', () => {
  assert.equal(manifest.exports['./min'].default, './dist/livegate.min.js');
  assert.equal(manifest.exports['./dist/livegate.min.js'].default, './dist/livegate.min.js');
  assert.equal(manifest.exports['./dist/livegate.iife.js'], './dist/livegate.iife.js');
  assert.equal(manifest.exports['./server'].default, './server.js');
  for (const file of ['dist/livegate.min.js', 'dist/livegate.iife.js', 'server.js', 'server.d.ts']) assert.ok(manifest.files.includes(file), file);
  assert.equal(manifest.peerDependenciesMeta?.ws?.optional, true, 'ws is an optional peer (Node 20 without the flag)');
});

test('the minified module exports what livegate.js exports and connects to a real server', { timeout: 30_000 }, async () => {
  const modules = await import(pathToFileURL(path.join(PACKAGE, 'livegate.js')).href);
  const min = await import(pathToFileURL(path.join(PACKAGE, 'dist/livegate.min.js')).href);
  assert.deepEqual(Object.keys(min).sort(), Object.keys(modules).sort());
  const base = server.url;
  const client = min.connect({ url: base, WebSocket: WebSocketImpl, getToken: () => mintToken(base, 'minnie') });
  try {
    const got = [];
    const sub = client.subscribe('match:min');
    sub.on('event', (event) => got.push(event.data));
    await sub.ready();
    await publish(base, 'match:min', { goal: 1 });
    await waitFor(() => got.length === 1, 'the event through the minified build');
    assert.deepEqual(got, [{ goal: 1 }]);
  } finally {
    client.close();
  }
});

test('the classic script defines the global Livegate with the same API', async () => {
  const modules = await import(pathToFileURL(path.join(PACKAGE, 'livegate.js')).href);
  const context = vm.createContext({ console });
  vm.runInContext(dist('livegate.iife.js'), context, { filename: 'livegate.iife.js' });
  const Livegate = context.Livegate;
  assert.equal(typeof Livegate, 'object', 'a <script> defines window.Livegate');
  assert.deepEqual(Object.keys(Livegate).sort(), Object.keys(modules).sort());
  assert.equal(typeof Livegate.connect, 'function');
  assert.equal(Livegate.endpointOf('https://a.test'), 'wss://a.test/v1/ws');
});

test('the server serves the minified module at /livegate.js, the classic script at /livegate.iife.js and the modules under /livegate/', { timeout: 30_000 }, async () => {
  const response = await fetch(`${server.url}/livegate.js`, { signal: AbortSignal.timeout(10_000) });
  assert.equal(response.status, 200);
  assert.match(response.headers.get('content-type'), /^text\/javascript/);
  assert.ok((await response.text()) === dist('livegate.min.js'), 'GET /livegate.js is dist/livegate.min.js (rebuild the server after a new build)');
  const script = await fetch(`${server.url}/livegate.iife.js`, { signal: AbortSignal.timeout(10_000) });
  assert.equal(script.status, 200);
  assert.ok((await script.text()) === dist('livegate.iife.js'), 'GET /livegate.iife.js is dist/livegate.iife.js');
  const module = await fetch(`${server.url}/livegate/client.js`, { signal: AbortSignal.timeout(10_000) });
  assert.equal(module.status, 200);
  assert.equal(await module.text(), readFileSync(path.join(PACKAGE, 'livegate/client.js'), 'utf8'));
});
