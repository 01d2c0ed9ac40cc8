// @ts-check
const { test, expect, accounts, keyWithAlert } = require('./fixtures');

test('an operator acknowledges an alert with a note', async ({ page, signIn, visit }, testInfo) => {
  const label = `e2e-alert-${testInfo.project.name}-${Date.now()}`;
  keyWithAlert(label);
  await signIn(accounts.admin);
  await visit('/alerts');

  await expect(page.getByRole('navigation', { name: 'Main' }).getByLabel(/\d+ open/)).toBeVisible();
  const row = page.getByRole('row').filter({ hasText: label });
  await expect(row).toContainText('passed 90 % of its cap: 5,000.00 USD of 5,500.00 USD committed.');
  await row.getByRole('textbox', { name: /Note for alert/ }).fill('Month-end run, expected');
  await row.getByRole('button', { name: 'Acknowledge' }).click();

  await expect(page.getByRole('status')).toContainText(`Acknowledged the alert on ${label}.`);
  await expect(page.getByRole('row').filter({ hasText: label })).toHaveCount(0);
  await visit('/alerts?state=acknowledged');
  const done = page.getByRole('row').filter({ hasText: label });
  await expect(done).toContainText('Note: Month-end run, expected');
  await expect(done).toContainText('by admin@e2e.test at');
});

test('a viewer sees alerts but no actions', async ({ page, signIn, visit }, testInfo) => {
  const label = `e2e-alert-viewer-${testInfo.project.name}-${Date.now()}`;
  keyWithAlert(label);
  await signIn(accounts.viewer);
  await visit('/alerts');
  const row = page.getByRole('row').filter({ hasText: label });
  await expect(row).toContainText('90 % of cap');
  await expect(row.getByRole('button')).toHaveCount(0);
});
