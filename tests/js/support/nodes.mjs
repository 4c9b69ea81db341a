// Test support for more than one node: Debian's nats-server (cluster mode), livegate
// nodes on it, a load balancer the test points where it likes, and a gate in front of a
// node that clients cannot pass while the cluster still sees the node alive.

import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import net from 'node:net';

import { api, startServer, tempDir, waitFor } from './server.mjs';

export const NATS_SERVER = process.env.NATS_SERVER_BIN || '/usr/sbin/nats-server';

/** A TCP port nothing listens on right now. */
export async function freePort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** `nats-server -js` on a free port with its store in a temporary directory. */
export async function startNats() {
  if (!existsSync(NATS_SERVER)) throw new Error(`${NATS_SERVER} is missing: apt-get install -y nats-server`);
  const store = tempDir('livegate-js-nats-');
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    const child = spawn(NATS_SERVER, ['-js', '-a', '127.0.0.1', '-p', String(port), '-sd', store.dir], { stdio: ['ignore', 'pipe', 'pipe'] });
    let log = '';
    const ready = await new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), 10_000);
      const onData = (chunk) => {
        log += chunk;
        if (log.includes('Server is ready')) {
          clearTimeout(timer);
          resolve(true);
        }
      };
      child.stdout.on('data', onData);
      child.stderr.on('data', onData);
      child.on('exit', () => {
        clearTimeout(timer);
        resolve(false);
      });
    });
    if (ready) {
      process.on('exit', () => child.kill('SIGKILL'));
      return {
        url: `nats://127.0.0.1:${port}`,
        async stop() {
          child.kill('SIGKILL');
          store.remove();
        },
      };
    }
    child.kill('SIGKILL');
    if (attempt >= 2) throw new Error(`nats-server did not start:\n${log}`);
  }
}

/**
 * Starts livegate nodes named `names` in cluster mode on `nats` (heartbeats every 100 ms),
 * each with its own data dir. `publicUrls[name]`: the URL clients are told for that node
 * (default: its listening address); `argsOf(name)`: flags of that node alone (its `--cell`,
 * say). Resolves once every node sees every other one ready.
 */
export async function startCluster({ nats, names, publicUrls = {}, args = [], argsOf = () => [] }) {
  const nodes = {};
  for (const name of names) {
    const data = tempDir(`livegate-js-${name}-`);
    const port = await freePort();
    const extra = ['--node', name, '--cluster-nats-url', nats.url, '--cluster-heartbeat-ms', '100', ...args, ...argsOf(name)];
    if (publicUrls[name]) extra.push('--public-url', publicUrls[name]);
    const server = await startServer({ dataDir: data.dir, port, args: extra });
    nodes[name] = { ...server, name, data };
  }
  for (const node of Object.values(nodes)) {
    await waitFor(async () => {
      const { body } = await api(node.url, 'GET', '/v1/admin/overview');
      const ready = new Set(body.nodes.filter((n) => n.phase === 'ready').map((n) => n.node));
      return names.every((name) => ready.has(name));
    }, `node ${node.name} to see ${names.join(', ')} ready`, 15_000);
  }
  return {
    nodes,
    async stop() {
      for (const node of Object.values(nodes)) {
        await node.stop('SIGKILL', 5000);
        node.data.remove();
      }
    },
  };
}

/**
 * A TCP forwarder: `point(port)` chooses where new connections go (the "load balancer"
 * the client is given); `dropAll()` cuts every forwarded connection; `hold()` resets new
 * connections until `release()`; `block(filter)` resets connections whose first request
 * head (request line and headers) matches `filter` (a RegExp) until `unblock()`, passing
 * the rest through (a node whose address clients cannot reach while the cluster still
 * can: see `CLIENTS_ONLY`). `accepted()` counts
 * the connections forwarded.
 */
/**
 * A `block` filter for every request but the nodes' own (a node asks another's `/readyz`
 * with ureq before it charges a client's move away from it to the budget): the node is
 * out of the clients' reach, not the cluster's.
 */
export const CLIENTS_ONLY = /^(?![\s\S]*\r\nuser-agent: ureq\/)/i;

export async function startForwarder(targetPort) {
  let target = targetPort;
  let held = false;
  let blocked = null;
  let accepted = 0;
  const pairs = new Set();
  const server = net.createServer((client) => {
    client.on('error', () => client.destroy());
    if (held) return client.resetAndDestroy();
    let head = Buffer.alloc(0);
    const onData = (chunk) => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0 && head.length < 8192) return;
      client.off('data', onData);
      client.pause();
      const request = head.subarray(0, end < 0 ? head.length : end).toString('latin1');
      if (blocked && blocked.test(request)) return client.resetAndDestroy();
      accepted += 1;
      const upstream = net.connect(target, '127.0.0.1');
      const pair = { client, upstream };
      pairs.add(pair);
      const end_ = () => {
        pairs.delete(pair);
        client.destroy();
        upstream.destroy();
      };
      client.on('close', end_);
      upstream.on('error', end_).on('close', end_);
      upstream.write(head);
      client.pipe(upstream);
      upstream.pipe(client);
      client.resume();
    };
    client.on('data', onData);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    accepted: () => accepted,
    point(port_) {
      target = port_;
    },
    hold() {
      held = true;
    },
    release() {
      held = false;
    },
    block(filter) {
      blocked = filter;
    },
    unblock() {
      blocked = null;
    },
    dropAll() {
      for (const { client, upstream } of pairs) {
        client.destroy();
        upstream.destroy();
      }
      pairs.clear();
    },
    async close() {
      this.dropAll();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

