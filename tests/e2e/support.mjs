// What the browser tests share: playwright-core driving Debian's Chromium (never a
// browser download of its own), and cleanups that run after every test of a file.

import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { after } from 'node:test';

import { REPO } from '../js/support/server.mjs';

const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';

let chromium;
try {
  ({ chromium } = await import('playwright-core'));
} catch (error) {
  throw new Error(`playwright-core is missing: npm install --no-save --prefix tests/e2e (${error.message})`);
}

const cleanups = [];
after(async () => {
  for (const cleanup of cleanups.reverse()) {
    try {
      await cleanup();
    } catch (error) {
      console.error('cleanup failed:', error);
    }
  }
});

/** Runs each of `fns` after the file's tests, latest first; a failing one is logged, not fatal. */
export const cleanup = (...fns) => cleanups.push(...fns);

/** Resizes the page and waits until it has painted two frames at the new size. */
export async function resize(page, width, height) {
  await page.setViewportSize({ width, height });
  await page.evaluate(() => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve))));
}

/**
 * A headless Chromium with its profile in `dir`, closed after the tests. The flags keep it
 * off the network this machine does not have (background fetches are refused otherwise).
 */
export async function launchBrowser(dir, { viewport, args = [] }) {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: apt-get install -y chromium`);
  const context = await chromium.launchPersistentContext(dir, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      ...args,
    ],
    viewport,
    timeout: 15_000,
  });
  cleanup(() => context.close());
  return context;
}

/**
 * Makes `page` load the client library from the source tree (clients/js: `/livegate.js`
 * and the modules it imports from `/livegate/`) instead of the server's copies.
 */
export async function clientFromSource(page) {
  const dir = path.join(REPO, 'clients/js');
  const file = (pathname) => (pathname === '/livegate.js' ? 'livegate.js' : /^\/livegate\/[a-z-]+\.js$/.test(pathname) ? pathname.slice(1) : null);
  await page.route((url) => file(url.pathname) != null, (route) =>
    route.fulfill({
      status: 200,
      contentType: 'text/javascript; charset=utf-8',
      body: readFileSync(path.join(dir, file(new URL(route.request().url()).pathname)), 'utf8'),
    }));
}
