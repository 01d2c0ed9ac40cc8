// @ts-check
// The four-eyes rule from the browser: a billing job (stripe-python through
// the proxy to localstripe) is refused for the cap; operator A asks for more
// from the refused call, cannot approve their own request, approver B
// approves, and the billing job's retry goes through.
const { test, expect, accounts, runBillingJob, createKey } = require('./fixtures');

test('operator A asks, cannot approve, approver B approves, and the refused charge succeeds on retry', async ({ page, signIn, visit, baseURL }, testInfo) => {
  const label = `e2e-raise-${testInfo.project.name}-${Date.now()}`;
  const customers = `cust_raise_${testInfo.project.name}`;
  // A: an admin, so only the four-eyes rule (not the role) stops them approving.
  await signIn(accounts.admin);
  const secret = await createKey(page, visit, { label, expected: '100.00', buffer: '10' });

  // Cap 110.00: two charges of 50.00 go through, the third is refused.
  const first = runBillingJob(baseURL, secret, 3, 5_000, customers);
  expect(first.filter((line) => / ch_/.test(line))).toHaveLength(2);
  expect(first[2]).toBe(`${customers}_0002 refused spend_cap_exceeded`);

  await page.getByRole('link', { name: label }).click();
  // The chart's text alternative: its figures, folded under it.
  const spend = page.getByRole('region', { name: 'Spend over time' });
  await spend.getByText('The figures as a table').click();
  await expect(spend.getByRole('table', { name: 'Spend by day' }).locator('tbody tr')).toHaveCount(1);
  await expect(spend.getByRole('table', { name: 'Spend by day' }).locator('tbody tr')).toContainText(/100\.00\s*USD\s*100\.00\s*USD/);
  await page.getByRole('region', { name: 'Latest calls' }).locator('tr.refused a').first().click();
  await expect(page.getByRole('heading', { level: 1 })).toContainText('Refused: over the cap');
  await page.getByRole('link', { name: 'Request cap increase' }).click();

  await expect(page.getByRole('heading', { level: 1 })).toHaveText(`Request a cap increase for ${label}`);
  // The suggestion counts the refused charge as billing still to come.
  await expect(page.getByTestId('suggestion-derivation')).toHaveText(
    'spent 100.00 + reserved 0.00 + remaining billing 50.00 × 1.1 = 155.00 USD, rounded up');
  await expect(page.getByLabel('New cap (USD)')).toHaveValue('155.00');
  await page.getByLabel(/^Reason/).fill('Customer 3 upgraded mid-period');
  await page.getByRole('button', { name: 'Request increase' }).click();
  await expect(page.getByRole('status')).toContainText('110.00 → 155.00 USD (+45.00)');
  await expect(page.getByRole('region', { name: 'Cap history' })).toContainText('waiting for an approver');

  await visit('/approvals');
  const mine = page.getByRole('row').filter({ hasText: label });
  await expect(mine).toContainText('You asked for this increase');
  await expect(mine.getByRole('button', { name: /Approve/ })).toHaveCount(0);

  await page.getByRole('button', { name: 'Sign out' }).click();
  await signIn(accounts.approver);
  await expect(page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: /Approvals/ })).toContainText(/\d/);
  await visit('/approvals');
  const row = page.getByRole('row').filter({ hasText: label });
  await expect(row).toContainText('Customer 3 upgraded mid-period');
  await expect(row).toContainText(`by ${accounts.admin.email} from a refused call`);
  await row.getByLabel(/Note on request/).fill('Upgrade confirmed in the CRM');
  await row.getByRole('button', { name: /Approve request/ }).click();
  // Approve leads to what it changes, and asks once more.
  await expect(page.getByRole('heading', { level: 1 })).toHaveText(`Approve 110.00 → 155.00 USD (+45.00) for ${label}?`);
  await expect(page.getByTestId('consequence')).toHaveText(
    `The cap of ${label} goes from 110.00 to 155.00 USD; the proxy applies it from the next call.`);
  await expect(page.getByTestId('approval-figures').getByRole('row').filter({ hasText: 'Utilization' })).toContainText(/90 %.*64 %/);
  await expect(page.getByTestId('approval-figures').getByRole('row').filter({ hasText: 'Still chargeable' })).toContainText(/10\.00\s*USD\s*55\.00\s*USD/);
  await expect(page.getByLabel('Note (optional)')).toHaveValue('Upgrade confirmed in the CRM');
  await page.getByRole('button', { name: 'Approve: cap 155.00 USD' }).click();
  await expect(page.getByRole('status')).toContainText(`${label} now has a cap of 155.00 USD`);
  await visit('/approvals?tab=history');
  await expect(page.getByRole('row').filter({ hasText: label })).toContainText(`by ${accounts.approver.email}`);

  // The same run again: the first two replay, the third now fits.
  const retry = runBillingJob(baseURL, secret, 3, 5_000, customers);
  expect(retry.filter((line) => / ch_/.test(line))).toHaveLength(3);
  expect(retry.slice(0, 2)).toEqual(first.slice(0, 2));
});

test('a viewer reads the Approvals page but has nothing to decide with', async ({ page, signIn, visit }) => {
  await signIn(accounts.viewer);
  await visit('/approvals?tab=history');
  await expect(page.getByRole('heading', { level: 1 })).toHaveText('Approvals');
  await expect(page.getByRole('button', { name: /Approve request|Reject request/ })).toHaveCount(0);
});
