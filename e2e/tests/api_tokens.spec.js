// @ts-check
const { test, expect, accounts, runBillingJob, currentPeriod } = require('./fixtures');

test('an admin makes a keys:create token; a billing job creates its key with it but cannot revoke', async ({ page, signIn, visit }, testInfo) => {
  const name = `billing job ${testInfo.project.name} ${Date.now()}`;
  await signIn(accounts.admin);
  await visit('/tokens');

  await page.getByLabel('Name').fill(name);
  await page.getByLabel(/^keys:create/).check();
  await page.getByLabel('Expires after (days)').fill('30');
  await page.getByRole('button', { name: 'Create token' }).click();

  await expect(page).toHaveURL(/\/tokens$/);
  await expect(page.getByRole('status')).toContainText(`Created the token "${name}" with keys:create, valid 30 days.`);
  const token = (await page.getByTestId('one-time-secret').textContent()) ?? '';
  expect(token).toMatch(/^vct_/);
  const row = page.getByRole('row').filter({ hasText: name });
  await expect(row).toContainText('keys:create');
  await expect(row).toContainText('active');
  await expect(row).toContainText('never');

  // The seed articles' billing job asks for its key with the token.
  const auth = { authorization: `Bearer ${token}` };
  const created = await page.request.post('/vault/keys', {
    headers: auth,
    data: {
      vendor: 'stripe',
      label: `seeds ${testInfo.project.name} ${Date.now()}`,
      daily_usd_cap: 55.0,
      allowed_endpoints: ['/v1/charges'],
      expires_at: new Date(Date.now() + 6 * 3600 * 1000).toISOString(),
    },
  });
  expect(created.status()).toBe(201);
  const key = await created.json();
  expect(key.vault_key).toMatch(/^vk_/);

  // It may not revoke keys, read them or export the audit log.
  const revoke = await page.request.post(`/vault/keys/${key.id}/revoke`, { headers: auth, data: { reason: 'let me' } });
  expect(revoke.status()).toBe(403);
  expect((await revoke.json()).error).toEqual({
    code: 'insufficient_scope',
    message: 'this API token lacks the `keys:revoke` scope this call needs; nothing was done',
  });
  expect((await page.request.get(`/vault/keys/${key.id}`, { headers: auth })).status()).toBe(403);
  expect((await page.request.get('/api/audit.csv', { headers: auth })).status()).toBe(403);

  // Shown once; its use is on the page; the admin revokes it.
  await visit('/tokens');
  await expect(page.getByTestId('one-time-secret')).toHaveCount(0);
  await expect(row).not.toContainText('never');
  await row.getByRole('button', { name: `Revoke the token ${name}` }).click();
  await expect(page.getByRole('status')).toContainText(`Revoked the token "${name}"`);
  await expect(row).toContainText('revoked');
  const after = await page.request.post('/vault/keys', { headers: auth, data: {} });
  expect(after.status()).toBe(401);
  expect((await after.json()).error.code).toBe('token_revoked');
});

test('a token without a scope is refused with a message and nothing is made', async ({ page, signIn, visit }) => {
  await signIn(accounts.admin);
  await visit('/tokens');
  await page.getByLabel('Name').fill('no scopes');
  await page.getByRole('button', { name: 'Create token' }).click();
  await expect(page.getByRole('alert')).toContainText('Nothing was changed: tick at least one scope');
  await expect(page.getByRole('row').filter({ hasText: 'no scopes' })).toHaveCount(0);
});

test('a key beyond policy waits for an approver other than the token\'s maker, then works', async ({ page, signIn, visit, browser, baseURL }, testInfo) => {
  const name = `run ${testInfo.project.name} ${Date.now()}`;
  await signIn(accounts.admin);
  await visit('/tokens');
  await page.getByLabel('Name').fill(name);
  await page.getByLabel(/^keys:create/).check();
  await page.getByRole('button', { name: 'Create token' }).click();
  const token = (await page.getByTestId('one-time-secret').textContent()) ?? '';

  // 120.00 on an expected 100.00: beyond the 10 % buffer policy.
  const label = `beyond ${testInfo.project.name} ${Date.now()}`;
  const asked = await page.request.post('/vault/keys', {
    headers: { authorization: `Bearer ${token}` },
    data: {
      label, billing_period: currentPeriod(), currency: 'usd',
      expected_total_cents: 10_000, cap_cents: 12_000,
      allowed_endpoints: ['POST /v1/charges'], expires_at: new Date(Date.now() + 30 * 86_400_000).toISOString(),
    },
  });
  expect(asked.status()).toBe(202);
  const waiting = await asked.json();
  expect(waiting.status).toBe('pending_approval');
  expect(waiting.key_request.policy_cap_cents).toBe(11_000);
  const id = waiting.key_request.id;

  // Until approved the key opens nothing.
  const prefix = `cust_beyond_${testInfo.project.name}_${Date.now()}`;
  expect(runBillingJob(baseURL, waiting.vault_key, 1, 1_000, prefix)[0]).toMatch(/refused invalid_api_key$/);

  // The admin made the token: the page leaves the decision to someone else.
  await visit('/approvals');
  const row = page.locator(`tr[data-key-request="${id}"]`);
  await expect(row).toContainText(label);
  await expect(row).toContainText('You asked for this key');
  await expect(row.getByRole('button', { name: `Approve key request ${id}` })).toHaveCount(0);

  // The approver approves it.
  const { javaScriptEnabled } = testInfo.project.use;
  const context = await browser.newContext({ baseURL, javaScriptEnabled });
  const other = await context.newPage();
  await other.goto('/login');
  await other.getByLabel('Email').fill(accounts.approver.email);
  await other.getByLabel('Password').fill(accounts.approver.password);
  await other.getByRole('button', { name: 'Sign in' }).click();
  await other.goto('/approvals');
  if (javaScriptEnabled) await other.locator('body[data-hydrated="true"]').waitFor();
  const theirs = other.locator(`tr[data-key-request="${id}"]`);
  await theirs.getByRole('textbox', { name: `Note on key request ${id}` }).fill('month-end seats');
  await theirs.getByRole('button', { name: `Approve key request ${id}` }).click();
  // Approve leads to what issuing the key means, and asks once more.
  await expect(other.getByRole('heading', { level: 1 })).toHaveText(`Issue ${label} with a cap of 120.00 USD?`);
  await expect(other.getByTestId('consequence')).toContainText('may charge up to 120.00 USD through the proxy');
  await expect(other.getByLabel('Note (optional)')).toHaveValue('month-end seats');
  await other.getByRole('button', { name: 'Approve: issue 120.00 USD' }).click();
  await expect(other.getByRole('status')).toContainText(`Approved key request #${id}: ${label} is issued with a cap of 120.00 USD`);
  await context.close();

  // Now the same key charges.
  expect(runBillingJob(baseURL, waiting.vault_key, 1, 1_000, `${prefix}_after`)[0]).toMatch(/ ch_/);
});
