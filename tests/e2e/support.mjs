// What the browser tests share: playwright-core driving Debian's Chromium (never a
// browser download of its own), and cleanups that run after every test of a file.

import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { after } from 'node:test';

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
