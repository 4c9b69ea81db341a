// `GET /livegate.d.ts` (issue 20): the TypeScript declarations a real server serves are
// checked with `tsc --noEmit --strict` against tests/e2e/types/example.ts (every option,
// method, property and event of livegate.js) and tests/e2e/types/misuse.ts (misuses each
// marked `@ts-expect-error`, so each must stay an error), a misuse without the marker must
// fail tsc, and a guard compares the declarations with livegate.js itself (its exports,
// the option names it reads, the events it emits and their fields, the public members of
// every class it exports, the events a Subscription tells: the entry's exports, and the
// rest read from every module it imports from /livegate/).
// Run from the repository root: `node --test tests/e2e/`. Needs target/release/livegate
// (or LIVEGATE_BIN) and typescript: `npm install --no-save --prefix tests/e2e`.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { REPO, startServer, tempDir } from '../js/support/server.mjs';

let ts;
try {
  ts = (await import('typescript')).default;
} catch (error) {
  throw new Error(`typescript is missing: npm install --no-save --prefix tests/e2e (${error.message})`);
}
const TSC = createRequire(import.meta.url).resolve('typescript/bin/tsc');
const TYPES = path.join(REPO, 'tests/e2e/types');

const cleanups = [];
after(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup();
});

/** What the running server serves at /livegate.d.ts, /livegate.js and /livegate/{file}
 * (the modules the entry imports, and what they import), by path under the root. */
const served = {};
/** The modules' paths (`livegate/client.js`, ...), in the order they were found. */
const modules = [];
before(async () => {
  const data = tempDir('livegate-types-');
  cleanups.push(data.remove);
  const server = await startServer({ dataDir: data.dir });
  cleanups.push(() => server.stop());
  for (const name of ['livegate.d.ts', 'livegate.js']) {
    const response = await fetch(`${server.url}/${name}`, { signal: AbortSignal.timeout(10_000) });
    assert.equal(response.status, 200, `GET /${name}`);
    served[name] = { contentType: response.headers.get('content-type'), text: await response.text() };
  }
  // /livegate.js is the minified build (dist/livegate.min.js); the guard reads the
  // package's readable entry, which imports the served modules.
  served.bundle = served['livegate.js'];
  served['livegate.js'] = { contentType: served.bundle.contentType, text: readFileSync(path.join(REPO, 'clients/js/livegate.js'), 'utf8') };
  const pending = [...importsOf(served['livegate.js'].text, '')];
  while (pending.length) {
    const name = pending.shift();
    if (served[name]) continue;
    const response = await fetch(`${server.url}/${name}`, { signal: AbortSignal.timeout(10_000) });
    assert.equal(response.status, 200, `GET /${name}`);
    served[name] = { contentType: response.headers.get('content-type'), text: await response.text() };
    modules.push(name);
    pending.push(...importsOf(served[name].text, path.posix.dirname(name)));
  }
});

/** The paths (under the root) of the modules `text`, at `dir`, imports or re-exports. */
function importsOf(text, dir) {
  return [...text.matchAll(/^(?:import|export)\b[^;]*?from '(\.[^']+)';/gms)].map((m) => path.posix.normalize(path.posix.join(dir, m[1])));
}

/** The modules' code, one text (the guard reads the whole library in it). */
const moduleCode = () => modules.map((name) => served[name].text).join('\n');

/** Runs tsc on `files` (with the served livegate.d.ts beside them); {status, output}. */
function tsc(files) {
  const dir = tempDir('livegate-tsc-');
  cleanups.push(dir.remove);
  writeFileSync(path.join(dir.dir, 'livegate.d.ts'), served['livegate.d.ts'].text);
  for (const [name, text] of Object.entries(files)) writeFileSync(path.join(dir.dir, name), text);
  const config = {
    compilerOptions: {
      noEmit: true,
      strict: true,
      exactOptionalPropertyTypes: true,
      noUnusedLocals: false,
      target: 'es2022',
      module: 'esnext',
      moduleResolution: 'bundler',
      lib: ['es2022', 'dom'],
      types: [],
    },
    files: Object.keys(files),
  };
  writeFileSync(path.join(dir.dir, 'tsconfig.json'), JSON.stringify(config));
  const run = spawnSync(process.execPath, [TSC, '-p', dir.dir, '--pretty', 'false'], { encoding: 'utf8', timeout: 120_000 });
  return { status: run.status, output: `${run.stdout}${run.stderr}` };
}

const source = (name) => readFileSync(path.join(TYPES, name), 'utf8');

test('the server serves clients/js/ (livegate.d.ts as TypeScript, each module as JavaScript)', () => {
  const { contentType, text } = served['livegate.d.ts'];
  assert.match(contentType, /^application\/typescript/);
  const file = (name) => readFileSync(path.join(REPO, 'clients/js', name), 'utf8');
  assert.equal(text, file('livegate.d.ts'));
  assert.ok(modules.includes('livegate/client.js') && modules.includes('livegate/transport-sse.js'), modules.join());
  for (const name of modules) {
    assert.match(served[name].contentType, /^text\/javascript/, name);
    assert.equal(served[name].text, file(name), `/${name} is clients/js/${name}`);
  }
  assert.match(served.bundle.contentType, /^text\/javascript/);
  assert.ok(served.bundle.text === file('dist/livegate.min.js'), '/livegate.js is clients/js/dist/livegate.min.js');
});

test('the typed example and the marked misuses pass tsc --strict against the served declarations', () => {
  const { status, output } = tsc({ 'example.ts': source('example.ts'), 'misuse.ts': source('misuse.ts') });
  assert.equal(status, 0, `tsc failed:\n${output}`);
});

test('tsc fails on a misuse (a wrong option type)', () => {
  const bad = "import { connect } from './livegate.js';\nconnect({ getToken: () => 't', transports: ['carrier-pigeon'] });\n";
  const { status, output } = tsc({ 'bad.ts': bad });
  assert.notEqual(status, 0, `tsc accepted transports: ['carrier-pigeon']:\n${output}`);
  assert.match(output, /bad\.ts\(2,\d+\): error TS2322/);
  // A misuse marker on a line that is fine is an error too (so misuse.ts cannot rot).
  const stale = "import { connect } from './livegate.js';\n// @ts-expect-error\nconnect({ getToken: () => 't' });\n";
  const unused = tsc({ 'stale.ts': stale });
  assert.notEqual(unused.status, 0, `tsc accepted an unused @ts-expect-error:\n${unused.output}`);
});

// ---- the guard: livegate.d.ts against livegate.js ----

const nameOf = (node) => (node.name && (ts.isIdentifier(node.name) || ts.isStringLiteral(node.name)) ? node.name.text : null);

function walk(node, visit) {
  visit(node);
  ts.forEachChild(node, (child) => walk(child, visit));
}

/** Property names read from the identifier `object` inside `node`: `object.x` and `const {x} = object`. */
function readsOf(node, object) {
  const names = new Set();
  walk(node, (n) => {
    if (ts.isPropertyAccessExpression(n) && ts.isIdentifier(n.expression) && n.expression.text === object) names.add(n.name.text);
    if (ts.isVariableDeclaration(n) && n.initializer && ts.isIdentifier(n.initializer) && n.initializer.text === object && ts.isObjectBindingPattern(n.name)) {
      for (const element of n.name.elements) names.add((element.propertyName ?? element.name).text);
    }
  });
  return names;
}

/** What livegate.js exports (`entry`: its re-exports) and the modules' `code` reads: its API as the code has it. */
function jsApi({ entry, code }) {
  const file = ts.createSourceFile('livegate-modules.js', code, ts.ScriptTarget.Latest, true, ts.ScriptKind.JS);
  const api = { exports: new Set(), classes: {}, clientOptions: new Set(), subscribeOptions: new Set(), publishOptions: new Set(), timings: new Set(), timingReads: new Set(), events: {}, subscriptionEvents: new Set() };
  for (const statement of file.statements) {
    const exported = statement.modifiers?.some((m) => m.kind === ts.SyntaxKind.ExportKeyword);
    if (ts.isClassDeclaration(statement)) {
      const members = new Set();
      const fields = new Set();
      for (const member of statement.members) {
        const name = nameOf(member);
        if (name && !name.startsWith('_') && !ts.isConstructorDeclaration(member)) members.add(name);
        // `this.x = ...` in the constructor: a field (public when declared).
        if (ts.isConstructorDeclaration(member)) {
          walk(member, (n) => {
            if (ts.isBinaryExpression(n) && n.operatorToken.kind === ts.SyntaxKind.EqualsToken && ts.isPropertyAccessExpression(n.left) && n.left.expression.kind === ts.SyntaxKind.ThisKeyword) fields.add(n.left.name.text);
          });
        }
      }
      api.classes[statement.name.text] = { members, fields, node: statement };
    }
    if (!exported) continue;
    if (ts.isVariableStatement(statement)) {
      for (const declaration of statement.declarationList.declarations) {
        if (declaration.name.text === 'DEFAULT_TIMINGS') {
          walk(declaration.initializer, (n) => {
            if (ts.isObjectLiteralExpression(n) && n.parent === declaration.initializer) {
              for (const property of n.properties) api.timings.add(nameOf(property));
            }
          });
        }
      }
    }
  }
  const entryFile = ts.createSourceFile('livegate.js', entry, ts.ScriptTarget.Latest, true, ts.ScriptKind.JS);
  for (const statement of entryFile.statements) {
    if (ts.isExportDeclaration(statement) && statement.exportClause && ts.isNamedExports(statement.exportClause)) {
      for (const element of statement.exportClause.elements) api.exports.add(element.name.text);
    }
  }
  const client = api.classes.LivegateClient?.node;
  assert.ok(client, 'livegate.js has class LivegateClient');
  for (const member of client.members) {
    const name = ts.isConstructorDeclaration(member) ? 'constructor' : nameOf(member);
    if (name === 'constructor') api.clientOptions = readsOf(member, 'options');
    // subscribe() and the _subscription() it makes read the subscribe options.
    if (name === 'subscribe' || name === '_subscription') for (const option of readsOf(member, 'options')) api.subscribeOptions.add(option);
    if (name === 'publish') {
      const pattern = member.parameters[2]?.name;
      if (pattern && ts.isObjectBindingPattern(pattern)) for (const element of pattern.elements) api.publishOptions.add(element.name.text);
    }
  }
  // The Subscription reads its options in its constructor.
  for (const member of api.classes.Subscription?.node.members ?? []) {
    if (ts.isConstructorDeclaration(member)) for (const option of readsOf(member, 'options')) api.subscribeOptions.add(option);
  }
  walk(file, (n) => {
    if (ts.isPropertyAccessExpression(n) && ts.isPropertyAccessExpression(n.expression) && n.expression.name.text === '_timings') api.timingReads.add(n.name.text);
    // A Subscription's events: `sub._tell('x', ...)`, `this._tellSubscriptions(state, 'x', ...)`, `this._move('x', ...)`.
    if (ts.isCallExpression(n) && ts.isPropertyAccessExpression(n.expression)) {
      const position = { _tell: 0, _move: 0, _tellSubscriptions: 1 }[n.expression.name.text];
      const name = position != null ? n.arguments[position] : null;
      if (name && ts.isStringLiteral(name)) api.subscriptionEvents.add(name.text);
    }
    if (ts.isCallExpression(n) && ts.isPropertyAccessExpression(n.expression) && n.expression.name.text === '_emit') {
      const [event, detail] = n.arguments;
      if (!event || !ts.isStringLiteral(event)) return;
      const fields = (api.events[event.text] ??= new Set());
      if (detail && ts.isObjectLiteralExpression(detail)) for (const property of detail.properties) fields.add(nameOf(property));
    }
  });
  return api;
}

/** What livegate.d.ts declares. */
function dtsApi(text) {
  const file = ts.createSourceFile('livegate.d.ts', text, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
  const api = { values: new Set(), interfaces: {}, classes: {} };
  for (const statement of file.statements) {
    const exported = statement.modifiers?.some((m) => m.kind === ts.SyntaxKind.ExportKeyword);
    if (ts.isInterfaceDeclaration(statement)) {
      const members = {};
      for (const member of statement.members) members[nameOf(member)] = member;
      api.interfaces[statement.name.text] = members;
    } else if (ts.isClassDeclaration(statement)) {
      const members = new Set();
      const properties = new Set();
      for (const member of statement.members) {
        if (ts.isConstructorDeclaration(member)) continue;
        // A plain property may be a field the constructor sets; methods and accessors are members.
        (ts.isPropertyDeclaration(member) ? properties : members).add(nameOf(member));
      }
      api.classes[statement.name.text] = { members, properties };
      if (exported) api.values.add(statement.name.text);
    } else if (exported && ts.isFunctionDeclaration(statement)) {
      api.values.add(statement.name.text);
    } else if (exported && ts.isVariableStatement(statement)) {
      for (const declaration of statement.declarationList.declarations) api.values.add(declaration.name.text);
    }
  }
  return api;
}

const sorted = (set) => [...set].sort();
function compareSets(problems, what, inJs, inDts) {
  const missing = sorted(inJs).filter((name) => !inDts.has(name));
  const extra = sorted(inDts).filter((name) => !inJs.has(name));
  if (missing.length) problems.push(`${what}: in livegate.js, not declared: ${missing.join(', ')}`);
  if (extra.length) problems.push(`${what}: declared, not in livegate.js: ${extra.join(', ')}`);
}

/** Every way livegate.d.ts and livegate.js disagree, as sentences. */
function apiMismatches(jsText, dtsText) {
  const js = jsApi(jsText);
  const dts = dtsApi(dtsText);
  const problems = [];
  const keys = (name) => new Set(Object.keys(dts.interfaces[name] ?? {}));
  compareSets(problems, 'exports', js.exports, dts.values);
  compareSets(problems, 'connect() options', js.clientOptions, keys('ClientOptions'));
  compareSets(problems, 'subscribe() options', js.subscribeOptions, keys('SubscriptionOptions'));
  compareSets(problems, 'publish() options', js.publishOptions, keys('PublishOptions'));
  compareSets(problems, 'timings', js.timings, keys('Timings'));
  const unknownTimings = sorted(js.timingReads).filter((name) => !js.timings.has(name));
  if (unknownTimings.length) problems.push(`timings read but not in DEFAULT_TIMINGS: ${unknownTimings.join(', ')}`);
  // Every class the entry exports: its methods and accessors both ways; a property the
  // declarations name must be a member or a field its constructor sets.
  for (const name of sorted(js.exports).filter((name) => js.classes[name])) {
    const { members, fields } = js.classes[name];
    const declared = dts.classes[name] ?? { members: new Set(), properties: new Set() };
    const declaredPlain = new Set([...declared.properties].filter((p) => !members.has(p)));
    compareSets(problems, `${name} members`, members, new Set([...declared.members, ...[...declared.properties].filter((p) => members.has(p))]));
    const unset = sorted(declaredPlain).filter((p) => !fields.has(p));
    if (unset.length) problems.push(`${name} members: declared, not in livegate.js: ${unset.join(', ')}`);
  }
  compareSets(problems, 'Subscription events', js.subscriptionEvents, keys('SubscriptionEvents'));
  const events = dts.interfaces.ClientEvents ?? {};
  compareSets(problems, 'events', new Set(Object.keys(js.events)), new Set(Object.keys(events)));
  for (const [event, fields] of Object.entries(js.events)) {
    const declared = events[event]?.type;
    if (!declared || !ts.isTypeLiteralNode(declared)) continue;
    const names = new Set(declared.members.map(nameOf));
    const undeclared = sorted(fields).filter((field) => !names.has(field));
    if (undeclared.length) problems.push(`event ${event}: fields emitted, not declared: ${undeclared.join(', ')}`);
  }
  return problems;
}

test('livegate.d.ts declares what livegate.js exports, reads and emits', () => {
  const entry = served['livegate.js'].text;
  const code = moduleCode();
  const js = { entry, code };
  const dts = served['livegate.d.ts'].text;
  const found = jsApi(js);
  assert.ok(found.exports.has('connect') && found.exports.has('EventStreamParser'), sorted(found.exports).join());
  // The guard reads something: the options and events it compares are there.
  assert.ok(found.clientOptions.has('getToken') && found.clientOptions.has('transport') && found.clientOptions.size >= 10, sorted(found.clientOptions).join());
  assert.ok(found.subscribeOptions.has('since') && found.subscribeOptions.has('presence'), sorted(found.subscribeOptions).join());
  assert.ok(found.events.connected?.has('credential') && found.events.disconnected?.has('welcomed'));
  assert.ok(found.exports.has('Subscription') && found.classes.Subscription.members.has('unsubscribe'), sorted(found.classes.Subscription?.members ?? []).join());
  assert.ok(found.subscriptionEvents.has('event') && found.subscriptionEvents.has('unsubscribed'), sorted(found.subscriptionEvents).join());
  assert.deepEqual(apiMismatches(js, dts), []);

  // The guard can fail: an option the code starts reading, an event field it starts
  // sending, a member the declarations lose.
  const newOption = { entry, code: code.replace('random, clock, transports: order } = options;', 'random, clock, transports: order, mode } = options;') };
  assert.notEqual(newOption.code, code);
  assert.match(apiMismatches(newOption, dts).join('\n'), /connect\(\) options: in livegate\.js, not declared: mode/);
  const newField = { entry, code: code.replace("this._emit('transport', { from, to, reason });", "this._emit('transport', { from, to, reason, at: now() });") };
  assert.notEqual(newField.code, code);
  assert.match(apiMismatches(newField, dts).join('\n'), /event transport: fields emitted, not declared: at/);
  const lostMember = dts.replace(/^ {2}dropConnection\(.*$/m, '');
  assert.notEqual(lostMember, dts);
  assert.match(apiMismatches(js, lostMember).join('\n'), /LivegateClient members: in livegate\.js, not declared: dropConnection/);
  // A Subscription method the declarations lose, one they invent, an event it starts telling.
  const lostReady = dts.replace(/^ {2}ready\(\): Promise<SubscribedReply<S>>;$/m, '');
  assert.notEqual(lostReady, dts);
  assert.match(apiMismatches(js, lostReady).join('\n'), /Subscription members: in livegate\.js, not declared: ready/);
  const invented = dts.replace(/^ {2}unsubscribe\(\): void;$/m, '  unsubscribe(): void;\n  pause(): void;\n  readonly paused: boolean;');
  assert.notEqual(invented, dts);
  assert.match(apiMismatches(js, invented).join('\n'), /Subscription members: declared, not in livegate\.js: pause/);
  assert.match(apiMismatches(js, invented).join('\n'), /Subscription members: declared, not in livegate\.js: paused/);
  const newEvent = { entry, code: code.replace("this._move('subscribing', { room: this.room });", "this._move('subscribing', { room: this.room });\n    this._tell('paused', {});") };
  assert.notEqual(newEvent.code, code);
  assert.match(apiMismatches(newEvent, dts).join('\n'), /Subscription events: in livegate\.js, not declared: paused/);
});
