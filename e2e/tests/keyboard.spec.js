// @ts-check
// The main flows with the keyboard alone: focus moves only by Tab, text is
// typed, buttons and links are pressed with Enter. No click, no fill, so a
// control that cannot be reached or used from the keyboard fails the test.
const fs = require('node:fs');
const { test, expect, accounts, keyWithAlert } = require('./fixtures');

/** Presses Tab until `target` has the focus; fails if 400 presses do not get there. */
async function tabTo(page, target) {
  await expect(target).toHaveCount(1);
  for (let presses = 0; presses < 400; presses++) {
    await page.keyboard.press('Tab');
    if (await target.evaluate((el) => el === document.activeElement)) return;
  }
  throw new Error(`Tab never reached ${target}`);
}

/** Tabs to a text field, clears it and types `text`. */
async function typeInto(page, field, text) {
  await tabTo(page, field);
  await page.keyboard.press('Control+A');
  await page.keyboard.press('Delete');
  await page.keyboard.type(text);
}

async function press(page, control) {
  await tabTo(page, control);
  await page.keyboard.press('Enter');
}

async function signInByKeyboard(page, visit, account) {
  await visit('/login');
  await typeInto(page, page.getByLabel('Email'), account.email);
  await typeInto(page, page.getByLabel('Password'), account.password);
  await press(page, page.getByRole('button', { name: 'Sign in' }));
  await expect(page.getByTestId('signed-in-as')).toHaveText(account.email);
}

test('create a key, ask for a higher cap and approve it as a second person, keyboard only', async ({ page, visit }, testInfo) => {
  const label = `e2e-keys-${testInfo.project.name}-${Date.now()}`;
  await signInByKeyboard(page, visit, accounts.admin);
  await visit('/keys/new');
  await typeInto(page, page.getByLabel('Currency'), 'usd');
  await typeInto(page, page.getByLabel('Expected total'), '200.00');
  await typeInto(page, page.getByLabel('Label'), label);
  await press(page, page.getByRole('button', { name: 'Create vault key' }));
  await expect(page.getByRole('status')).toContainText(`Created ${label}`);
  await expect(page.getByTestId('one-time-secret')).toHaveText(/^vk_/);

  await press(page, page.getByRole('link', { name: label }));
  await press(page, page.getByRole('link', { name: 'Request cap increase' }));
  await typeInto(page, page.getByLabel('New cap (USD)'), '300.00');
  await typeInto(page, page.getByLabel(/^Reason/), 'Two more customers this month');
  await press(page, page.getByRole('button', { name: 'Request increase' }));
  await expect(page.getByRole('status')).toContainText('220.00 → 300.00 USD (+80.00)');
  await press(page, page.getByRole('button', { name: 'Sign out' }));
  await expect(page.getByRole('button', { name: 'Sign in' })).toBeVisible();

  await signInByKeyboard(page, visit, accounts.approver);
  await visit('/approvals');
  const row = page.getByRole('row').filter({ hasText: label });
  await typeInto(page, row.getByLabel(/Note on request/), 'Confirmed with sales');
  await press(page, row.getByRole('button', { name: /Approve request/ }));
  await press(page, page.getByRole('button', { name: 'Approve: cap 300.00 USD' }));
  await expect(page.getByRole('status')).toContainText(`${label} now has a cap of 300.00 USD`);
});

test('acknowledge an alert and export the audit log, keyboard only', async ({ page, visit }, testInfo) => {
  const label = `e2e-kbd-alert-${testInfo.project.name}-${Date.now()}`;
  keyWithAlert(label);
  await signInByKeyboard(page, visit, accounts.admin);
  await visit('/alerts');
  const row = page.getByRole('row').filter({ hasText: label });
  await typeInto(page, row.getByRole('textbox', { name: /Note for alert/ }), 'Seen, month end');
  await press(page, row.getByRole('button', { name: 'Acknowledge' }));
  await expect(page.getByRole('status')).toContainText(`Acknowledged the alert on ${label}.`);

  await visit('/audit');
  const download = page.waitForEvent('download');
  await press(page, page.getByRole('link', { name: 'Export CSV' }));
  const csv = fs.readFileSync(await (await download).path(), 'utf8');
  expect(csv.split('\n')[0]).toContain('idempotency_key');
});
