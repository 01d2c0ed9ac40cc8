// @ts-check
const { test, expect, accounts } = require('./fixtures');

test('an admin invites an operator, who sets their own password from the link and signs in', async ({ page, signIn, visit, browser }, testInfo) => {
  const email = `new-${testInfo.project.name}-${Date.now()}@e2e.test`;
  await signIn(accounts.admin);
  await visit('/operators');

  await page.getByLabel('Email').fill(email);
  await page.getByLabel('Role', { exact: true }).selectOption('operator');
  await page.getByRole('button', { name: 'Add operator' }).click();

  await expect(page).toHaveURL(/\/operators$/);
  await expect(page.getByRole('status')).toContainText(`Added ${email} as operator. Send them this invitation link`);
  const link = (await page.getByTestId('one-time-secret').textContent()) ?? '';
  expect(link).toMatch(/\/invite\/inv_[A-Za-z0-9]{40}$/);
  const row = page.getByRole('row').filter({ hasText: email });
  await expect(row).toHaveCount(1);
  await expect(row.getByRole('combobox')).toHaveValue('operator');

  // Shown once: a reload no longer has it.
  await page.reload();
  await expect(page.getByTestId('one-time-secret')).toHaveCount(0);

  // The new operator opens the link in their own browser and chooses a password.
  const { baseURL, javaScriptEnabled } = testInfo.project.use;
  const context = await browser.newContext({ baseURL, javaScriptEnabled });
  const other = await context.newPage();
  await other.goto(link);
  const password = `only ${testInfo.project.name} knows this`;
  await other.getByLabel('New password').fill(password);
  await other.getByLabel('The same password again').fill(password);
  await other.getByRole('button', { name: 'Set password' }).click();
  await expect(other).toHaveURL(/\/login\?invited=1$/);
  await expect(other.getByRole('status')).toHaveText('Your password is set. Sign in with it.');
  await other.getByLabel('Email').fill(email);
  await other.getByLabel('Password').fill(password);
  await other.getByRole('button', { name: 'Sign in' }).click();
  await expect(other.getByTestId('signed-in-as')).toHaveText(email);

  // The link works once.
  await other.goto(link);
  await other.getByLabel('New password').fill('a second password!');
  await other.getByLabel('The same password again').fill('a second password!');
  await other.getByRole('button', { name: 'Set password' }).click();
  await expect(other.getByRole('alert')).toContainText('this invitation link was already used');
  await context.close();
});

test('adding an operator with an address already in use explains why', async ({ page, signIn, visit }) => {
  await signIn(accounts.admin);
  await visit('/operators');
  await page.getByLabel('Email').fill(accounts.viewer.email);
  await page.getByRole('button', { name: 'Add operator' }).click();
  await expect(page.getByRole('alert')).toHaveText(`Nothing was changed: ${accounts.viewer.email} already has an account.`);
});
