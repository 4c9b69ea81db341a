// Test support: run the real livegate binary, mint tokens, publish, and a TCP proxy
// that can drop connections. Every child process is killed when the test process ends.

import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { pace, waitFor } from './clock.mjs';
import { MiniWebSocket } from './mini-websocket.mjs';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const BINARY = process.env.LIVEGATE_BIN || path.join(REPO, 'target/release/livegate');
export const API_KEY = 'test-api-key-0123456789';

/** The WebSocket the tests give livegate.js: Node's own when enabled, else the mini one. */
export const WebSocketImpl = globalThis.WebSocket ?? MiniWebSocket;

const children = new Set();
function killAll() {
  for (const child of children) {
    try {
      child.kill('SIGKILL');
    } catch {
      // gone
    }
  }
}
process.on('exit', killAll);
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    killAll();
    process.exit(130);
  });
}

export function tempDir(prefix = 'livegate-js-') {
  const dir = mkdtempSync(path.join(tmpdir(), prefix));
  return { dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/**
 * Starts `livegate serve` on `port` (0: any) with the data in `dataDir` (`args`: more
 * flags, `env`: more environment variables). Resolves once it printed `listening on
 * http://ADDR` and takes connections (`/readyz` past `starting`: the line comes before the
 * directory is reconciled, and a handshake before that is refused unspent, so a client
 * would mint a second token); rejects if it exits first or takes over 15 s.
 */
export function startServer({ dataDir, port = 0, args = [], env = {} }) {
  if (!existsSync(BINARY)) throw new Error(`${BINARY} is missing: run cargo build --release`);
  const child = spawn(
    BINARY,
    [
      'serve',
      '--listen', `127.0.0.1:${port}`,
      '--data-dir', dataDir,
      '--api-key', API_KEY,
      '--drain-wait-secs', '0',
      '--drain-spread-secs', '1',
      '--drain-grace-secs', '3',
      ...args,
    ],
    { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, RUST_LOG: process.env.RUST_LOG || 'info', ...env } },
  );
  children.add(child);
  let stderr = '';
  let stdout = '';
  child.stderr.on('data', (chunk) => {
    stderr += chunk;
    if (stderr.length > 200_000) stderr = stderr.slice(-100_000);
  });
  const exited = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      children.delete(child);
      resolve({ code, signal });
    });
  });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`livegate did not start within 15 s\n${stderr}`));
    }, 15_000);
    child.stdout.on('data', (chunk) => {
      stdout += chunk;
      const match = /listening on (http:\/\/[^\s]+)/.exec(stdout);
      if (match && timer) {
        clearTimeout(timer);
        const url = match[1];
        const takingConnections = waitFor(async () => {
          const response = await fetch(`${url}/readyz`).catch(() => null);
          if (!response) return false;
          const body = await response.text();
          return response.ok || body.includes('joining');
        }, 'the server to take connections', 15_000);
        takingConnections.then(() => resolve({
          child,
          url,
          port: Number(new URL(url).port),
          exited,
          stderr: () => stderr,
          /** Sends `signal` and waits for the exit (SIGKILL after `ms`). */
          async stop(signal = 'SIGTERM', ms = 10_000) {
            if (child.exitCode == null && child.signalCode == null) child.kill(signal);
            const killer = setTimeout(() => child.kill('SIGKILL'), ms);
            const result = await exited;
            clearTimeout(killer);
            return result;
          },
        }), reject);
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`livegate exited (${code ?? signal}) before listening\n${stderr}`));
    });
  });
}

/** Starts a server on exactly `port`, retrying while the port is not free yet. */
export async function startServerOnPort({ dataDir, port, withinMs = 10_000, args = [] }) {
  const deadline = Date.now() + withinMs;
  for (;;) {
    try {
      return await startServer({ dataDir, port, args });
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await pace(100, 'a refused start on a port not free yet is retried at 10/s');
    }
  }
}

export async function api(base, method, pathName, body) {
  const response = await fetch(base + pathName, {
    method,
    headers: { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(10_000),
  });
  const text = await response.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    // not JSON
  }
  if (!response.ok) throw new Error(`${method} ${pathName}: HTTP ${response.status} ${text}`);
  return { status: response.status, body: json };
}

export async function mintToken(base, user, device = 'web') {
  const { body } = await api(base, 'POST', '/v1/tokens', { user, device, ttl_secs: 60 });
  return body.token;
}

export async function publish(base, room, data, id) {
  const { body } = await api(base, 'POST', `/v1/rooms/${encodeURIComponent(room)}/events`, id ? { id, data } : { data });
  return body;
}

export async function sendMessage(base, user, data, id) {
  const { body } = await api(base, 'POST', `/v1/users/${encodeURIComponent(user)}/messages`, id ? { id, data } : { data });
  return body;
}

export { letTimePass, pace, waitFor } from './clock.mjs';

/** Resolves with the detail of the next `name` event of a livegate client. */
export function nextEvent(client, name, ms = 10_000, filter = () => true) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      off();
      reject(new Error(`no ${name} event within ${ms} ms`));
    }, ms);
    const off = client.on(name, (detail) => {
      if (!filter(detail)) return;
      clearTimeout(timer);
      off();
      resolve(detail);
    });
  });
}

/** A gate: `wait()` blocks until `open()`; `close()` arms it again. */
export function gate(initiallyOpen = true) {
  let release;
  let promise = initiallyOpen ? Promise.resolve() : new Promise((r) => (release = r));
  return {
    wait: () => promise,
    close() {
      promise = new Promise((r) => (release = r));
    },
    open() {
      release?.();
      promise = Promise.resolve();
    },
  };
}

/**
 * A TCP proxy in front of `target` (host:port): `dropAll()` destroys every proxied
 * connection at once, without a WebSocket close: the "server drops the socket" case.
 * `hold()` makes it refuse (reset) every new connection until `release()`: the server is
 * unreachable. With `refuseUpgrade`, it reads the head of each connection's first
 * request and refuses any with `Upgrade: websocket`, the way some corporate proxies
 * break WebSockets: `'answer'` replies 502 and closes, `'reset'` destroys the connection;
 * everything else is passed through. `upgradesRefused()` counts them.
 */
export async function startProxy(targetPort, { refuseUpgrade = null } = {}) {
  const pairs = new Set();
  let held = false;
  let refused = 0;
  const server = net.createServer((client) => {
    if (held) {
      client.resetAndDestroy();
      return;
    }
    client.on('error', () => client.destroy());
    if (!refuseUpgrade) return pipe(client, Buffer.alloc(0));
    // Read up to the end of the first request head, then decide.
    let head = Buffer.alloc(0);
    const onData = (chunk) => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0 && head.length < 16_384) return;
      client.off('data', onData);
      client.pause();
      const text = head.subarray(0, end < 0 ? head.length : end).toString('latin1');
      if (/^upgrade:\s*websocket\s*$/im.test(text)) {
        refused += 1;
        if (refuseUpgrade === 'reset') {
          client.resetAndDestroy();
        } else {
          client.end('HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: 21\r\nConnection: close\r\n\r\nno WebSockets here.\r\n');
        }
        return;
      }
      pipe(client, head);
    };
    client.on('data', onData);
  });
  function pipe(client, head) {
    const upstream = net.connect(targetPort, '127.0.0.1');
    const pair = { client, upstream };
    pairs.add(pair);
    const end = () => {
      pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
    if (head.length) upstream.write(head);
    client.pipe(upstream);
    upstream.pipe(client);
    client.resume();
  }
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    port: server.address().port,
    connections: () => pairs.size,
    upgradesRefused: () => refused,
    hold() {
      held = true;
    },
    release() {
      held = false;
    },
    dropAll() {
      for (const { client, upstream } of pairs) {
        client.destroy();
        upstream.destroy();
      }
      pairs.clear();
    },
    close() {
      this.dropAll();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}

/** The value of a counter in the server's /metrics (0 when absent). */
export async function metric(base, name, labels = {}) {
  const response = await fetch(`${base}/metrics`, { headers: { Authorization: `Bearer ${API_KEY}` }, signal: AbortSignal.timeout(10_000) });
  const text = await response.text();
  const want = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  let total = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const match = /^([a-z_]+)(\{[^}]*\})?\s+([0-9.e+-]+)/.exec(line);
    if (!match || match[1] !== name) continue;
    if (want.every((w) => (match[2] ?? '').includes(w))) total += Number(match[3]);
  }
  return total;
}
