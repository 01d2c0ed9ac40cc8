// @ts-check
const { test, expect, accounts } = require('./fixtures');

test('an operator signs in, sees who they are, and signs out', async ({ page, signIn }) => {
  await signIn(accounts.admin);
  await expect(page).toHaveURL(/\/$/);
  await expect(page.getByRole('heading', { level: 1 })).toContainText('Overview');
  await expect(page.getByTestId('signed-in-as')).toHaveText(accounts.admin.email);

  await page.getByRole('button', { name: 'Sign out' }).click();
  await expect(page).toHaveURL(/\/login\?signed_out=1$/);
  await expect(page.getByRole('status')).toHaveText('You have signed out.');

  // The old session is gone: the console sends us back to sign in.
  await page.goto('/keys');
  await expect(page).toHaveURL(/\/login\?next=%2Fkeys$/);
});

test('a wrong password is refused with a message and no session', async ({ page, signIn }) => {
  await signIn({ email: accounts.viewer.email, password: 'not the password' });
  await expect(page).toHaveURL(/\/login\?error=invalid$/);
  await expect(page.getByRole('alert')).toHaveText('Email or password is incorrect.');
  await page.goto('/');
  await expect(page).toHaveURL(/\/login/);
});

test('signing in from a deep link returns to it', async ({ page, signIn }) => {
  await signIn(accounts.viewer, '/audit');
  await expect(page).toHaveURL(/\/audit$/);
  await expect(page.getByRole('heading', { level: 1 })).toHaveText('Audit log');
});

test('a viewer is denied the Operators page', async ({ page, signIn }) => {
  await signIn(accounts.viewer);
  await expect(page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Operators' })).toHaveCount(0);
  const response = await page.goto('/operators');
  expect(response?.status()).toBe(403);
  await expect(page.getByRole('alert')).toContainText('You do not have access to this page');
  await expect(page.getByRole('alert')).toContainText('It needs the admin role');
});
