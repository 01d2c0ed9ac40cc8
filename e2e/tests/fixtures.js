// @ts-check
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

module.exports = { test, expect: base.expect, accounts };
