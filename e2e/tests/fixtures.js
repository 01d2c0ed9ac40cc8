// @ts-check
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const base = require('@playwright/test');

const password = process.env.E2E_PASSWORD;
if (!password) throw new Error('E2E_PASSWORD is not set: run the browser tests through scripts/test');

/** Accounts scripts/test created before the server started. */
const accounts = {
  admin: { email: 'admin@e2e.test', password },
  approver: { email: 'approver@e2e.test', password },
  viewer: { email: 'viewer@e2e.test', password },
};

const test = base.test.extend({
  /** Opens a page and, in the hydrated project, waits until the bundle has taken over. */
  visit: async ({ page }, use, testInfo) => {
    const hydrated = testInfo.project.name === 'hydrated';
    await use(async (path) => {
      await page.goto(path);
      if (hydrated) await page.locator('body[data-hydrated="true"]').waitFor();
    });
  },
  signIn: async ({ page, visit }, use) => {
    await use(async (account, next) => {
      await visit(next ? `/login?next=${encodeURIComponent(next)}` : '/login');
      await page.getByLabel('Email').fill(account.email);
      await page.getByLabel('Password').fill(account.password);
      await page.getByRole('button', { name: 'Sign in' }).click();
    });
  },
});

/** Runs SQL against the run's database (psql), returning its output. */
function sql(text) {
  const url = process.env.E2E_DATABASE_URL;
  if (!url) throw new Error('E2E_DATABASE_URL is not set: run the browser tests through scripts/test');
  return execFileSync('psql', [url, '-qAtc', text], { encoding: 'utf8' }).trim();
}

const python = path.resolve(__dirname, '../../target/pyenv/bin/python');
const billingJob = path.resolve(__dirname, '../sdk/billing_job.py');

/** The current billing period, as the console defaults it (UTC). */
function currentPeriod() {
  return new Date().toISOString().slice(0, 7);
}

/**
 * Runs the billing job (stripe-python through the proxy) for `customers`
 * customers named `${prefix}_0000…`; its output lines (`cust_… ch_…` or
 * `cust_… refused <code>`).
 */
function runBillingJob(baseURL, key, customers, amount, prefix, idempotencyPrefix = 'bill', fault = '') {
  const out = execFileSync(python, [
    billingJob, '--api-base', baseURL, '--key', key, '--period', currentPeriod(),
    '--customers', String(customers), '--amount', String(amount), '--prefix', prefix,
    '--idempotency-prefix', idempotencyPrefix, ...(fault ? ['--fault', fault] : []),
  ], { encoding: 'utf8' });
  return out.trim().split('\n');
}

/** Creates a key on the new-key page (signed in as an operator); its secret. */
async function createKey(page, visit, { label, expected, buffer }) {
  await visit('/keys/new');
  await page.getByLabel('Currency').fill('usd');
  await page.getByLabel('Expected total').fill(expected);
  if (buffer !== undefined) await page.getByLabel('Buffer (%)').fill(buffer);
  await page.getByLabel('Label').fill(label);
  await page.getByRole('button', { name: 'Create vault key' }).click();
  return (await page.getByTestId('one-time-secret').textContent()) ?? '';
}

/** A key at 5,000.00 of 5,500.00 USD with the 90 % alert the proxy raises. */
function keyWithAlert(label) {
  const keyId = sql(`INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
                         expected_total_cents, cap_cents, spent_cents, allowed_endpoints, expires_at)
                     VALUES (sha256(convert_to('${label}', 'UTF8')), 'vk_e2e', '${label}', '2026-11', 'usd',
                             500000, 550000, 500000, ARRAY['POST /v1/charges'], now() + interval '30 days')
                     RETURNING id`);
  sql(`INSERT INTO alerts (vault_key_id, kind, threshold_pct, committed_cents, cap_cents)
       VALUES (${keyId}, 'threshold', 90, 500000, 550000)`);
}

module.exports = { test, expect: base.expect, accounts, sql, runBillingJob, createKey, keyWithAlert, currentPeriod };
