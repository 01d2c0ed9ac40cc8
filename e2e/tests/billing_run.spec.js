// @ts-check
// The whole path a billing run takes: an operator issues a key from an
// expected total, the billing job (stripe-python through the proxy, to
// localstripe) spends past 90 %, exactly one alert is raised and delivered
// to the webhook once, the operator acknowledges it, and the key's page
// shows the spend.
const fs = require('node:fs');
const { parse } = require('csv-parse/sync');
const { test, expect, accounts, runBillingJob, createKey } = require('./fixtures');

const hooks = `http://127.0.0.1:${process.env.E2E_HOOK_PORT || '3903'}/deliveries`;

/** Webhook deliveries about the key labelled `label`. */
async function deliveriesFor(label) {
  const all = await (await fetch(hooks)).json();
  return all.filter((d) => d.body?.alert?.key_label === label);
}

test('a billing run past 90 % raises one alert, notifies once, and the operator acknowledges it', async ({ page, signIn, visit, baseURL }, testInfo) => {
  const label = `e2e-billing-${testInfo.project.name}-${Date.now()}`;
  await signIn(accounts.admin);
  const secret = await createKey(page, visit, { label, expected: '5,000.00', buffer: '10' });
  await expect(page.getByRole('status')).toContainText('cap 5,500.00 USD');
  expect(secret).toMatch(/^vk_/);

  // Ten customers at 500.00: 5,000.00 of 5,500.00 is 90.9 %.
  const lines = runBillingJob(baseURL, secret, 10, 50_000, `cust_${testInfo.project.name}`);
  expect(lines.filter((line) => / ch_/.test(line))).toHaveLength(10);

  // The notifier delivers in the background: wait for it, then check it was once.
  await expect.poll(async () => (await deliveriesFor(label)).length, { timeout: 15_000 }).toBe(1);
  const [delivery] = await deliveriesFor(label);
  expect(delivery.body.alert.threshold_pct).toBe(90);
  expect(delivery.body.text).toContain(label);

  await visit('/alerts');
  const rows = page.getByRole('row').filter({ hasText: label });
  await expect(rows).toHaveCount(1);
  await expect(rows).toContainText('90 %');
  await expect(rows).toContainText('1 delivered');
  await rows.getByLabel(/Note for alert/).fill('Expected: all ten customers billed');
  await rows.getByRole('button', { name: 'Acknowledge' }).click();
  await expect(page.getByRole('status')).toContainText('Acknowledged');
  await visit('/alerts?state=acknowledged');
  await expect(page.getByRole('row').filter({ hasText: label })).toContainText('Expected: all ten customers billed');

  await visit('/keys');
  await page.getByRole('link', { name: label }).click();
  await expect(page.getByRole('heading', { level: 1 })).toContainText(label);
  await expect(page.locator('.util-large .util-figure')).toHaveText('90 %');
  await expect(page.getByRole('img', { name: /Cumulative spend/ })).toBeVisible();
  const calls = page.getByRole('region', { name: 'Calls by decision' });
  await expect(calls.getByRole('row', { name: /^Allowed/ })).toContainText('10');
  await expect(page.getByRole('region', { name: 'Latest calls' }).getByRole('row')).toHaveCount(11);
  const [download] = await Promise.all([
    page.waitForEvent('download'),
    page.getByRole('link', { name: 'Download audit CSV' }).click(),
  ]);
  const exported = parse(fs.readFileSync(await download.path(), 'utf8'), { columns: true });
  expect(exported).toHaveLength(10);
  expect(exported.every((r) => r.vault_key_label === label && r.decision === 'allowed' && r.amount === '500.00')).toBe(true);

  // Still exactly one delivery once everything above has happened.
  expect(await deliveriesFor(label)).toHaveLength(1);
});

test('an operator revokes a key with a reason and the billing job is refused', async ({ page, signIn, visit, baseURL }, testInfo) => {
  const label = `e2e-revoke-${testInfo.project.name}-${Date.now()}`;
  await signIn(accounts.admin);
  const secret = await createKey(page, visit, { label, expected: '100.00' });

  // Two charges of 10.00 USD against a 110.00 USD cap.
  const customers = `cust_revoked_${testInfo.project.name}`;
  expect(runBillingJob(baseURL, secret, 2, 1_000, `${customers}_before`)).toHaveLength(2);

  await page.getByRole('link', { name: label }).click();
  const revoke = page.getByRole('region', { name: 'Revoke this key' });
  // What revoking changes shows before anything is asked.
  const consequences = revoke.getByTestId('revoke-consequences');
  await expect(consequences).toContainText(/Spent: stays charged\s*20\.00\s*USD/);
  await expect(consequences).toContainText(/Headroom given up\s*90\.00\s*USD/);
  await expect(consequences).toContainText(/Calls so far\s*2, the last at/);
  await revoke.getByLabel(/Reason/).fill('Queue replayed: re-plan the run');
  await revoke.getByLabel(`Yes, revoke ${label} now`).check();
  await revoke.getByRole('button', { name: 'Revoke key' }).click();
  await expect(page.getByRole('status')).toContainText(`Revoked ${label}`);
  await expect(page.getByRole('heading', { level: 1 })).toContainText('revoked');
  await expect(page.getByText('Reason: Queue replayed: re-plan the run')).toBeVisible();

  const lines = runBillingJob(baseURL, secret, 1, 1_000, customers);
  expect(lines).toEqual([`${customers}_0000 refused api_key_revoked`]);
});

test('the keys list filters and sorts with a plain form', async ({ page, signIn, visit }) => {
  await signIn(accounts.viewer);
  await visit('/keys');
  await page.getByLabel('Status').selectOption('revoked');
  await page.getByRole('button', { name: 'Apply' }).click();
  await expect(page).toHaveURL(/status=revoked/);
  const statuses = page.locator('tbody .status');
  await expect(statuses.first()).toHaveText('revoked');
  expect(new Set(await statuses.allTextContents())).toEqual(new Set(['revoked']));

  await page.getByRole('link', { name: 'Cap', exact: true }).click();
  await expect(page).toHaveURL(/sort=cap&dir=desc/);
  await expect(page.getByRole('columnheader', { name: /Cap/ })).toHaveAttribute('aria-sort', 'descending');
  await expect(page.getByLabel('Status')).toHaveValue('revoked');
});

test('a viewer sees a key but cannot revoke it', async ({ page, signIn, visit }) => {
  await signIn(accounts.viewer);
  await visit('/keys');
  await page.locator('tbody a').first().click();
  await expect(page.getByRole('region', { name: 'Cap utilization' })).toBeVisible();
  await expect(page.getByRole('button', { name: 'Revoke key' })).toHaveCount(0);
});

test('the overview shows new refusals: by itself when hydrated, on reload without JavaScript', async ({ page, signIn, visit, baseURL }, testInfo) => {
  await signIn(accounts.viewer);
  await visit('/');
  const refused = page.locator('[data-figure="refused-24h"]');
  const before = Number((await refused.textContent())?.replace(/,/g, ''));

  const lines = runBillingJob(baseURL, 'vk_no_such_key', 1, 1_000, `cust_unknown_${testInfo.project.name}`);
  expect(lines[0]).toMatch(/refused invalid_api_key$/);

  if (testInfo.project.name !== 'hydrated') await page.reload();
  // Hydrated, the page polls every 5 s: allow two rounds, never reload.
  await expect(refused).toHaveText(String(before + 1), { timeout: 12_000 });
});
