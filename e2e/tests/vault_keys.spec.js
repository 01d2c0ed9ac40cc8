// @ts-check
const { test, expect, accounts } = require('./fixtures');

test('an operator creates a key from an expected total and sees its secret once', async ({ page, signIn, visit }, testInfo) => {
  const label = `e2e-run-${testInfo.project.name}-${Date.now()}`;
  await signIn(accounts.admin);
  await visit('/keys');
  await page.getByRole('link', { name: 'New vault key' }).click();
  await expect(page).toHaveURL(/\/keys\/new$/);
  if (testInfo.project.name === 'hydrated') await page.locator('body[data-hydrated="true"]').waitFor();

  await page.getByLabel('Currency').fill('usd');
  await page.getByLabel('Expected total').fill('5,000.00');
  await page.getByLabel('Buffer (%)').fill('10');
  await page.getByLabel('Label').fill(label);
  if (testInfo.project.name === 'hydrated') {
    await expect(page.getByTestId('cap-preview')).toHaveText('5,500.00 USD');
  }
  await page.getByRole('button', { name: 'Create vault key' }).click();

  await expect(page).toHaveURL(/\/keys$/);
  await expect(page.getByRole('status')).toContainText(`Created ${label}`);
  await expect(page.getByRole('status')).toContainText('cap 5,500.00 USD');
  const secret = (await page.getByTestId('one-time-secret').textContent()) ?? '';
  expect(secret).toMatch(/^vk_/);
  if (testInfo.project.name === 'hydrated') {
    await expect(page.getByRole('button', { name: 'Copy' })).toBeVisible();
  }
  const row = page.getByRole('row').filter({ hasText: label });
  await expect(row).toContainText('5,500.00');

  await page.reload();
  await expect(page.getByTestId('one-time-secret')).toHaveCount(0);
  await expect(page.getByText(secret)).toHaveCount(0);
});

test('a refused key form keeps what was typed and says what to fix', async ({ page, signIn, visit }) => {
  await signIn(accounts.admin);
  await visit('/keys/new');
  await page.getByLabel('Expected total').fill('12.345');
  await page.getByLabel('Buffer (%)').fill('150');
  await page.getByLabel('Label').fill('<b>bold</b>');
  await page.getByRole('button', { name: 'Create vault key' }).click();

  await expect(page.getByRole('alert')).toContainText('Nothing was created');
  await expect(page.locator('#expected_total-error')).toContainText('2 decimals at most');
  await expect(page.locator('#buffer_pct-error')).toContainText('from 0 to 100');
  await expect(page.getByLabel('Expected total')).toHaveValue('12.345');
  await expect(page.getByLabel('Label')).toHaveValue('<b>bold</b>');
});

test('a viewer cannot create keys', async ({ page, signIn, visit }) => {
  await signIn(accounts.viewer);
  await visit('/keys');
  await expect(page.getByRole('link', { name: 'New vault key' })).toHaveCount(0);
  await visit('/keys/new');
  await expect(page.getByRole('button', { name: 'Create vault key' })).toHaveCount(0);
});
