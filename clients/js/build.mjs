// Builds dist/ from the modules with esbuild (the version pinned in package.json's
// devDependencies): dist/livegate.min.js, the whole client as one minified ES module (what
// the server serves at /livegate.js), and dist/livegate.iife.js, the same as a minified
// classic script that defines the global `Livegate` (for a <script src> without modules).
// The built files are committed; tests/e2e/build.test.mjs rebuilds them with the pinned
// esbuild and fails when they differ. Run: `npm install && npm run build` in clients/js/.

import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const VERSION = JSON.parse(readFileSync(path.join(HERE, 'package.json'), 'utf8')).version;

/** The builds: the file under dist/ and its esbuild options. */
export const BUILDS = Object.freeze([
  { file: 'livegate.min.js', options: { format: 'esm' } },
  { file: 'livegate.iife.js', options: { format: 'iife', globalName: 'Livegate' } },
]);

/** Builds every file with `esbuild` (the module); resolves with {file: text}. */
export async function build(esbuild) {
  const out = {};
  for (const { file, options } of BUILDS) {
    const result = await esbuild.build({
      entryPoints: [path.join(HERE, 'livegate.js')],
      bundle: true,
      minify: true,
      write: false,
      target: 'es2020',
      platform: 'neutral',
      legalComments: 'none',
      charset: 'utf8',
      banner: { js: `/*! livegate.js ${VERSION} (MIT): built from the modules of the livegate-client package */` },
      // The `ws` package, imported by name only in Node without a WebSocket, stays out.
      logOverride: { 'unsupported-dynamic-import': 'silent' },
      logLevel: 'warning',
      ...options,
    });
    out[file] = result.outputFiles[0].text;
  }
  return out;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const esbuild = await import('esbuild');
  mkdirSync(path.join(HERE, 'dist'), { recursive: true });
  for (const [file, text] of Object.entries(await build(esbuild))) {
    writeFileSync(path.join(HERE, 'dist', file), text);
    console.log(`dist/${file}: ${text.length} bytes`);
  }
}
