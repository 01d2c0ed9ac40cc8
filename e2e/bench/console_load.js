// @ts-check
// Cold loads of console pages in Debian's Chromium: how many bytes the
// browser fetches and how long until the page is interactive (navigation
// start to `data-hydrated` on <body>, which the bundle sets once every
// island on the page is live). Each load is a fresh browser context, so
// nothing is cached. Run through scripts/bench-load, which starts a server.
//
//   node bench/console_load.js BASE_URL EMAIL PASSWORD LOADS
const { chromium } = require('@playwright/test');

const [baseURL, email, password, loadsArg] = process.argv.slice(2);
const loads = Number(loadsArg || 5);
const pages = ['/', '/keys', '/keys/new', '/audit', '/approvals'];
// A mid-range phone: Chrome's DevTools preset slows the CPU 4×.
const cpuRates = [1, 4];

/** The session cookie of a signed-in operator, reused by every cold load. */
async function signIn(browser) {
  const context = await browser.newContext({ baseURL });
  const page = await context.newPage();
  await page.goto('/login');
  await page.getByLabel('Email').fill(email);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL((url) => url.pathname === '/');
  const cookies = await context.cookies();
  await context.close();
  return cookies;
}

/** One cold load: bytes transferred (as sent, compressed) and time to interactive. */
async function coldLoad(browser, cookies, path, cpuRate) {
  const context = await browser.newContext({ baseURL });
  await context.addCookies(cookies);
  // Record when <body> gets data-hydrated, on the page's own clock.
  await context.addInitScript(() => {
    new MutationObserver((_, observer) => {
      if (document.body?.dataset.hydrated === 'true') {
        window.__interactiveAt = performance.now();
        observer.disconnect();
      }
    }).observe(document, { attributes: true, subtree: true, attributeFilter: ['data-hydrated'] });
  });
  const page = await context.newPage();
  const cdp = await context.newCDPSession(page);
  await cdp.send('Network.enable');
  await cdp.send('Emulation.setCPUThrottlingRate', { rate: cpuRate });
  let bytes = 0;
  let wasmBytes = 0;
  const wasmRequests = new Set();
  cdp.on('Network.responseReceived', (event) => {
    if (event.response.url.endsWith('.wasm')) wasmRequests.add(event.requestId);
  });
  cdp.on('Network.loadingFinished', (event) => {
    bytes += event.encodedDataLength;
    if (wasmRequests.has(event.requestId)) wasmBytes += event.encodedDataLength;
  });
  const response = await page.goto(path);
  if (!response || response.status() !== 200) {
    throw new Error(`${path} answered ${response && response.status()}`);
  }
  await page.waitForFunction(() => window.__interactiveAt !== undefined, null, { timeout: 60_000 });
  const interactive = await page.evaluate(() => window.__interactiveAt);
  await context.close();
  return { interactive, bytes, wasmBytes };
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

(async () => {
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run'],
  });
  try {
    const cookies = await signIn(browser);
    const worst = {};
    console.log(`${loads} cold loads per page; median (max) time to interactive, bytes transferred`);
    console.log('page                 CPU   interactive ms        transferred   of it wasm');
    for (const cpuRate of cpuRates) {
      for (const path of pages) {
        const runs = [];
        for (let i = 0; i < loads; i++) runs.push(await coldLoad(browser, cookies, path, cpuRate));
        const times = runs.map((r) => r.interactive);
        const last = runs[runs.length - 1];
        worst[cpuRate] = Math.max(worst[cpuRate] || 0, median(times));
        console.log(
          `${path.padEnd(20)} ${String(cpuRate).padStart(2)}×   ${median(times).toFixed(0).padStart(6)} (${Math.max(...times).toFixed(0).padStart(6)})` +
          `   ${String(last.bytes).padStart(12)}   ${String(last.wasmBytes).padStart(10)}`,
        );
      }
    }
    // The figure the budget checks: the slowest page's median at 4× CPU.
    console.log(`INTERACTIVE_4X_MS=${worst[4].toFixed(0)}`);
  } finally {
    await browser.close();
  }
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
