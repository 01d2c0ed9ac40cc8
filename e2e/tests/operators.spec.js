// @ts-check
const { test, expect, accounts } = require('./fixtures');

test('an admin adds an operator, who can then sign in with the password shown once', async ({ page, signIn, visit, browser }, testInfo) => {
  const email = `new-${testInfo.project.name}-${Date.now()}@e2e.test`;
  await signIn(accounts.admin);
  await visit('/operators');

  await page.getByLabel('Email').fill(email);
  await page.getByLabel('Role', { exact: true }).selectOption('operator');
  await page.getByRole('button', { name: 'Add operator' }).click();

  await expect(page).toHaveURL(/\/operators$/);
  await expect(page.getByRole('status')).toContainText(`Added ${email} as operator.`);
  const password = (await page.getByTestId('one-time-secret').textContent()) ?? '';
  expect(password).toHaveLength(20);
  const row = page.getByRole('row').filter({ hasText: email });
  await expect(row).toHaveCount(1);
  await expect(row.getByRole('combobox')).toHaveValue('operator');

  // Shown once: a reload no longer has it.
  await page.reload();
  await expect(page.getByTestId('one-time-secret')).toHaveCount(0);

  // The new operator signs in in a separate browser context.
  const { baseURL, javaScriptEnabled } = testInfo.project.use;
  const context = await browser.newContext({ baseURL, javaScriptEnabled });
  const other = await context.newPage();
  await other.goto('/login');
  await other.getByLabel('Email').fill(email);
  await other.getByLabel('Password').fill(password);
  await other.getByRole('button', { name: 'Sign in' }).click();
  await expect(other.getByTestId('signed-in-as')).toHaveText(email);
  await context.close();
});

test('adding an operator with an address already in use explains why', async ({ page, signIn, visit }) => {
  await signIn(accounts.admin);
  await visit('/operators');
  await page.getByLabel('Email').fill(accounts.viewer.email);
  await page.getByRole('button', { name: 'Add operator' }).click();
  await expect(page.getByRole('alert')).toHaveText(`Nothing was changed: ${accounts.viewer.email} already has an account.`);
});
