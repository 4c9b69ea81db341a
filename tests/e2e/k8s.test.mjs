// The Kubernetes manifests in data/k8s/ against the binary's own configuration: the
// container's environment is handed to `livegate check-config` (so a key the binary does
// not know, or a bad value, fails here), and the drain timings it reports are checked
// against the pod's grace period, preStop, probes, rollout settings and open-file limit.
// Run from the repository root: `node --test tests/e2e/k8s.test.mjs`; needs
// target/release/livegate (or LIVEGATE_BIN) and the npm package yaml (tests/e2e).

import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { parseAllDocuments } from 'yaml';

import { BINARY, REPO, tempDir } from '../js/support/server.mjs';

const MANIFESTS = path.join(REPO, 'data/k8s');
/** What the store flush and exit may take after the drain's grace, at least. */
const EXIT_MARGIN_SECS = 5;
/** Descriptors livegate keeps for itself besides one per WebSocket (http/limits.rs). */
const RESERVED_FDS = 256;

/** Every object in data/k8s/*.yaml, by kind. */
function manifests() {
  const objects = [];
  for (const file of readdirSync(MANIFESTS).filter((f) => f.endsWith('.yaml')).sort()) {
    for (const doc of parseAllDocuments(readFileSync(path.join(MANIFESTS, file), 'utf8'))) {
      assert.deepEqual(doc.errors, [], `${file} parses`);
      const object = doc.toJS();
      if (object) objects.push({ file, ...object });
    }
  }
  const byKind = (kind) => objects.filter((o) => o.kind === kind);
  return { objects, byKind };
}

/**
 * The container's environment as the pod would see it: literal values, the downward API
 * and the secret given stand-in values, `$(VAR)` expanded from the entries before it.
 */
function containerEnv(container) {
  const standIns = { 'status.podIP': '10.1.2.3', 'metadata.name': 'livegate-7d9f-abcde', "metadata.labels['pod-template-hash']": '7d9f' };
  const env = {};
  for (const entry of container.env ?? []) {
    let value;
    if (entry.value !== undefined) {
      value = String(entry.value).replace(/\$\((\w+)\)/g, (_, name) => env[name] ?? `$(${name})`);
    } else if (entry.valueFrom?.fieldRef) {
      value = standIns[entry.valueFrom.fieldRef.fieldPath];
      assert.ok(value, `no stand-in for ${entry.valueFrom.fieldRef.fieldPath}`);
    } else if (entry.valueFrom?.secretKeyRef) {
      value = 'k8s-test-api-key-0123456789abcdef';
    } else {
      assert.fail(`env ${entry.name}: unsupported source`);
    }
    env[entry.name] = value;
  }
  return env;
}

/** `livegate check-config` under `env`: the effective top-level keys (the API key masked). */
function effectiveConfig(env) {
  const run = spawnSync(BINARY, ['check-config'], {
    env: { PATH: process.env.PATH, HOME: tempDir('livegate-k8s-'), ...env },
    encoding: 'utf8',
  });
  assert.equal(run.status, 0, `check-config accepts the manifest's environment: ${run.stderr}`);
  const keys = {};
  for (const line of run.stdout.split('\n')) {
    if (line.startsWith('[')) break;
    const match = /^(\w+) = (.*)$/.exec(line);
    if (match) keys[match[1]] = JSON.parse(match[2].replace(/^'(.*)'$/, '"$1"'));
  }
  return keys;
}

/** The one livegate container of the Deployment, its pod spec and the Deployment. */
function livegate() {
  const { byKind } = manifests();
  const deployments = byKind('Deployment');
  assert.equal(deployments.length, 1, 'one Deployment');
  const [deployment] = deployments;
  const pod = deployment.spec.template.spec;
  const container = pod.containers.find((c) => c.name === 'livegate');
  assert.ok(container, 'a container named livegate');
  return { deployment, pod, container, byKind };
}

test('the binary reads every LIVEGATE_ variable of the container as the key it names', () => {
  const { container } = livegate();
  const env = containerEnv(container);
  const config = effectiveConfig(env);
  const variables = Object.keys(env).filter((n) => n.startsWith('LIVEGATE_'));
  assert.ok(variables.length >= 5, 'the container configures livegate through its environment');
  for (const name of variables) {
    const key = name.slice('LIVEGATE_'.length).toLowerCase();
    const expected = key === 'api_key' ? '********' : env[name];
    assert.equal(String(config[key]), expected, `${name} is read as ${key} (check-config prints ${config[key]})`);
  }
  assert.equal(config.public_url, 'http://10.1.2.3:7070', '$(POD_IP) is expanded in public_url');
  assert.match(config.cluster_nats_url, /^nats:\/\//, 'the manifests run cluster mode');
});

test('terminationGracePeriodSeconds covers preStop, drain wait, spread, grace and the exit', () => {
  const { pod, container } = livegate();
  const config = effectiveConfig(containerEnv(container));
  const preStop = container.lifecycle?.preStop;
  assert.ok(preStop, 'the container has a preStop hook');
  const preStopSecs = preStop.sleep?.seconds ?? Number(/sleep (\d+)/.exec(preStop.exec?.command?.join(' ') ?? '')?.[1]);
  assert.ok(Number.isInteger(preStopSecs) && preStopSecs > 0, 'preStop waits a whole number of seconds');
  const drain = config.drain_wait_secs + config.drain_spread_secs + config.drain_grace_secs;
  assert.ok(drain >= 50, `the binary's drain keys are read (${drain} s)`);
  const needed = preStopSecs + drain + EXIT_MARGIN_SECS;
  assert.ok(
    pod.terminationGracePeriodSeconds >= needed,
    `terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds} >= preStop ${preStopSecs} + drain_wait ` +
      `${config.drain_wait_secs} + drain_spread ${config.drain_spread_secs} + drain_grace ${config.drain_grace_secs} + ${EXIT_MARGIN_SECS}`,
  );
});

test('readiness is /readyz and fails over well inside the drain wait; liveness never reads readiness', () => {
  const { container } = livegate();
  const config = effectiveConfig(containerEnv(container));
  const port = container.ports.find((p) => p.name === container.readinessProbe.httpGet.port) ?? { containerPort: container.readinessProbe.httpGet.port };
  assert.equal(container.readinessProbe.httpGet.path, '/readyz');
  assert.equal(`0.0.0.0:${port.containerPort}`, config.listen, 'the probe reaches the port livegate listens on');
  const { periodSeconds = 10, failureThreshold = 3, timeoutSeconds = 1 } = container.readinessProbe;
  const notReadyWithin = periodSeconds * failureThreshold + timeoutSeconds;
  assert.ok(
    notReadyWithin * 2 <= config.drain_wait_secs,
    `not ready within ${notReadyWithin} s of SIGTERM, at most half of drain_wait_secs ${config.drain_wait_secs}`,
  );
  assert.equal(container.livenessProbe?.httpGet?.path, '/healthz', 'liveness reads /healthz: a draining pod is not ready but alive');
});

test('a rollout surges and never takes a ready pod away first', () => {
  const { deployment, byKind } = livegate();
  assert.equal(deployment.spec.strategy.type, 'RollingUpdate');
  assert.equal(deployment.spec.strategy.rollingUpdate.maxUnavailable, 0);
  assert.ok(deployment.spec.strategy.rollingUpdate.maxSurge >= 1);
  const budgets = byKind('PodDisruptionBudget');
  assert.equal(budgets.length, 1, 'a PodDisruptionBudget');
  assert.deepEqual(budgets[0].spec.selector.matchLabels, deployment.spec.selector.matchLabels);
});

test("each pod's release is its pod-template-hash, which every rollout changes", () => {
  const { container } = livegate();
  const release = (container.env ?? []).find((e) => e.name === 'LIVEGATE_RELEASE');
  assert.equal(release?.valueFrom?.fieldRef?.fieldPath, "metadata.labels['pod-template-hash']");
  assert.equal(effectiveConfig(containerEnv(container)).release, '7d9f', 'check-config reads it as release');
});

test('the open-file limit set in the container fits max_connections', () => {
  const { container } = livegate();
  const config = effectiveConfig(containerEnv(container));
  const command = (container.command ?? []).join(' ');
  const limit = Number(/ulimit -n (\d+)/.exec(command)?.[1]);
  assert.ok(limit > 0, `the command raises the open-file limit (${command})`);
  assert.ok(/exec \S*livegate serve/.test(command), 'livegate replaces the shell, so SIGTERM reaches it');
  assert.ok(config.max_connections > 0, 'max_connections is bounded');
  assert.ok(
    limit >= config.max_connections + RESERVED_FDS,
    `ulimit -n ${limit} >= max_connections ${config.max_connections} + ${RESERVED_FDS} reserved`,
  );
  // The line is valid sh (run with a shell's -n: parsed, not executed, since raising the
  // limit needs the container's hard limit, not this machine's).
  const script = container.command.at(-1);
  assert.deepEqual(container.command.slice(0, -1), ['/bin/sh', '-c']);
  execFileSync('/bin/sh', ['-n', '-c', script]);
});

test('the Service selects the pods and targets the port livegate listens on', () => {
  const { deployment, container, byKind } = livegate();
  const [service] = byKind('Service');
  assert.ok(service, 'a Service');
  for (const [label, value] of Object.entries(service.spec.selector)) {
    assert.equal(deployment.spec.template.metadata.labels[label], value, `pods carry ${label}=${value}`);
  }
  for (const port of service.spec.ports) {
    assert.ok(container.ports.some((p) => p.name === port.targetPort || p.containerPort === port.targetPort), `targetPort ${port.targetPort} is a container port`);
  }
});
