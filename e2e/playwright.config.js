// @ts-check
const { defineConfig } = require('@playwright/test');

// scripts/test starts PostgreSQL, creates the test accounts and passes
// these in; Playwright starts and stops the server itself.
const port = process.env.E2E_PORT || '3901';
const dataDir = process.env.E2E_DATA_DIR;
if (!dataDir) throw new Error('E2E_DATA_DIR is not set: run the browser tests through scripts/test');
const baseURL = `http://127.0.0.1:${port}`;
// localstripe (the Stripe the proxy forwards to) and a webhook receiver (the
// alert notifications' destination), on ports scripts/test picked.
const stripePort = process.env.E2E_STRIPE_PORT || '3902';
const hookPort = process.env.E2E_HOOK_PORT || '3903';
// Vaultcap reaches localstripe through stripe_faults.js, which can lose a
// charge's answer on demand (the upstream timeout localstripe cannot make).
const faultPort = process.env.E2E_FAULT_PORT || '3904';

module.exports = defineConfig({
  testDir: './tests',
  fullyParallel: false,
  workers: 1,
  forbidOnly: !!process.env.CI,
  reporter: [['list']],
  timeout: 30_000,
  use: {
    baseURL,
    screenshot: 'only-on-failure',
    launchOptions: {
      // Debian's Chromium; Playwright never downloads a browser here.
      executablePath: '/usr/bin/chromium',
      args: [
        '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
        '--disable-background-networking', '--disable-component-update', '--disable-sync',
      ],
    },
  },
  // Every test runs twice: as plain server-rendered HTML with JavaScript
  // off, and hydrated by the WebAssembly bundle.
  projects: [
    { name: 'no-js', use: { javaScriptEnabled: false } },
    { name: 'hydrated', use: { javaScriptEnabled: true } },
  ],
  webServer: [
    {
      command: `../target/pyenv/bin/python sdk/localstripe_launcher.py --port ${stripePort}`,
      url: `http://127.0.0.1:${stripePort}/v1/charges`,
      reuseExistingServer: false,
      timeout: 60_000,
    },
    {
      command: `node stripe_faults.js ${faultPort} ${stripePort}`,
      port: Number(faultPort),
      reuseExistingServer: false,
    },
    {
      command: `node webhook_receiver.js ${hookPort}`,
      url: `http://127.0.0.1:${hookPort}/deliveries`,
      reuseExistingServer: false,
    },
    {
      command: `../target/debug/vaultcap serve --addr 127.0.0.1:${port} --site-root ../target/site --data-dir ${dataDir}`,
      url: `${baseURL}/healthz`,
      env: {
        STRIPE_API_BASE: `http://127.0.0.1:${faultPort}`,
        // Short, so a lost answer becomes an unknown outcome quickly.
        VAULTCAP_UPSTREAM_TIMEOUT_SECS: '4',
        STRIPE_SECRET_KEY: 'sk_test_vaultcap_upstream',
        VAULTCAP_ALERT_WEBHOOKS: `http://127.0.0.1:${hookPort}/slack`,
      },
      reuseExistingServer: false,
      stdout: 'pipe',
      stderr: 'pipe',
      timeout: 60_000,
    },
  ],
});
