// @ts-check
// Every console page at a phone's, a tablet's and a desktop's width: nothing
// scrolls sideways (wide tables scroll inside their own container), axe-core
// finds no WCAG 2.1 A/AA violation, and a screenshot of each lands in
// e2e/screenshots/ for a person to look at.
const fs = require('node:fs');
const path = require('node:path');
const { default: AxeBuilder } = require('@axe-core/playwright');
const { test, expect, accounts, sql, createKey } = require('./fixtures');

const WIDTHS = [390, 768, 1440];
const shots = path.resolve(__dirname, '../screenshots');

/**
 * What axe-core (WCAG 2.1 A and AA rules) finds wrong on the page, a line a
 * rule. It runs scripts in the page, so only in the hydrated project; the
 * markup is the server's in both.
 */
async function accessibilityViolations(page) {
  const result = await new AxeBuilder({ page })
    .withTags(['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa'])
    .analyze();
  return result.violations.map((v) => `${v.id} on ${v.nodes.length}: ${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(', ')}`);
}

/** The pages, with ids of rows the earlier tests (or this one) made. */
function pages() {
  const key = sql('SELECT id FROM vault_keys ORDER BY id LIMIT 1');
  const call = sql('SELECT id FROM audit_log ORDER BY id DESC LIMIT 1');
  const finding = sql('SELECT id FROM reconciliation_findings ORDER BY id LIMIT 1');
  const period = sql('SELECT billing_period FROM vault_keys ORDER BY id LIMIT 1');
  const signed = sql('SELECT billing_period FROM period_closes WHERE signed_at IS NOT NULL LIMIT 1');
  // A cap increase the approver asked for, so the admin may decide it.
  const label = `responsive-request-${Date.now()}`;
  const request = sql(`WITH k AS (
      INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
                              expected_total_cents, cap_cents, spent_cents, allowed_endpoints, expires_at)
      VALUES (sha256(convert_to('${label}', 'UTF8')), 'vk_e2ersp', '${label}', '2026-11', 'eur',
              600000, 660000, 640000, ARRAY['POST /v1/charges'], now() + interval '30 days')
      RETURNING id, cap_cents)
    INSERT INTO cap_increase_requests (vault_key_id, from_cap_cents, to_cap_cents, apply_as, reason, requested_by, expires_at)
    SELECT id, cap_cents, cap_cents + 627000, 'raise_cap', 'Month-end upgrades',
           (SELECT id FROM operators WHERE email = 'approver@e2e.test'), now() + interval '1 day'
    FROM k RETURNING id`);
  // A key beyond policy the approver asked for.
  const keyRequest = sql(`INSERT INTO key_requests (label, billing_period, currency, expected_total_cents,
        buffer_bps, cap_cents, allowed_endpoints, alert_thresholds_pct, duplicate_policy, key_expires_at,
        secret_hash, secret_prefix, over_policy, policy_cap_cents, requested_by, expires_at)
      VALUES ('${label}-new', '2026-11', 'eur', 600000, 2500, 750000, ARRAY['POST /v1/charges'], ARRAY[90]::smallint[],
              'flag', now() + interval '30 days', sha256(convert_to('${label}-new', 'UTF8')), 'vk_e2erkr',
              'a 25 % buffer is above the 10 % policy', 660000,
              (SELECT id FROM operators WHERE email = 'approver@e2e.test'), now() + interval '1 day')
      RETURNING id`);
  return [
    ['overview', '/'],
    ['keys', '/keys'],
    ['new-key', '/keys/new'],
    ['key', `/keys/${key}`],
    ['cap-increase', `/keys/${key}/cap-increase`],
    ['alerts', '/alerts'],
    ['audit', '/audit'],
    ...(call ? [['audit-call', `/audit/${call}`]] : []),
    ['actions', '/actions'],
    ['reconciliation', '/reconciliation'],
    ...(finding ? [['finding', `/reconciliation/${finding}`]] : []),
    ['period', `/periods/${period}`],
    ...(signed ? [['period-signed', `/periods/${signed}`]] : []),
    ['approvals', '/approvals'],
    ['approval-confirm', `/approvals/${request}/confirm`],
    ['key-request-confirm', `/key-requests/${keyRequest}/confirm`],
    ['operators', '/operators'],
    ['tokens', '/tokens'],
    ['two-factor', '/account/two-factor'],
  ];
}

test('no page scrolls sideways at 390, 768 or 1440 px, nor breaks an accessibility rule', async ({ page, visit, signIn }, testInfo) => {
  test.setTimeout(180_000);
  fs.mkdirSync(shots, { recursive: true });
  const project = testInfo.project.name;
  await signIn(accounts.admin);
  await expect(page.getByTestId('signed-in-as')).toBeVisible();
  if (!sql('SELECT id FROM vault_keys LIMIT 1')) {
    await createKey(page, visit, { label: 'responsive-check', expected: '1000.00' });
  }
  const overflowing = [];
  const inaccessible = [];
  const hydrated = project === 'hydrated';
  for (const width of WIDTHS) {
    await page.setViewportSize({ width, height: 900 });
    for (const [name, url] of pages()) {
      await visit(url);
      await expect(page.locator('main h1').first()).toBeVisible();
      const { scroll, inner } = await page.evaluate(() => ({
        scroll: document.documentElement.scrollWidth,
        inner: window.innerWidth,
      }));
      if (scroll > inner) overflowing.push(`${name} at ${width} px: ${scroll} px wide`);
      if (hydrated && width !== 768) {
        for (const found of await accessibilityViolations(page)) inaccessible.push(`${name} at ${width} px: ${found}`);
      }
      await page.screenshot({ path: path.join(shots, `${name}-${width}-${project}.png`), fullPage: true });
    }
  }
  expect(overflowing).toEqual([]);
  expect(inaccessible).toEqual([]);
});

test('every page a viewer opens keeps the accessibility rules', async ({ page, visit, signIn }, testInfo) => {
  test.skip(testInfo.project.name !== 'hydrated', 'axe-core runs scripts in the page');
  test.setTimeout(120_000);
  await signIn(accounts.viewer);
  await expect(page.getByTestId('signed-in-as')).toBeVisible();
  const inaccessible = [];
  for (const [name, url] of pages()) {
    await visit(url);
    for (const found of await accessibilityViolations(page)) inaccessible.push(`${name}: ${found}`);
  }
  expect(inaccessible).toEqual([]);
});

test('the sign-in page fits a phone', async ({ page, visit }, testInfo) => {
  fs.mkdirSync(shots, { recursive: true });
  await page.setViewportSize({ width: 390, height: 844 });
  await visit('/login');
  const wide = await page.evaluate(() => document.documentElement.scrollWidth);
  expect(wide).toBeLessThanOrEqual(390);
  if (testInfo.project.name === 'hydrated') expect(await accessibilityViolations(page)).toEqual([]);
  await page.screenshot({ path: path.join(shots, `login-390-${testInfo.project.name}.png`) });
});

test('on a phone the navigation is a menu that opens', async ({ page, visit, signIn }) => {
  await page.setViewportSize({ width: 390, height: 844 });
  await signIn(accounts.viewer);
  await expect(page.getByTestId('signed-in-as')).toBeVisible();
  const nav = page.getByRole('navigation', { name: 'Main' });
  await expect(nav).toBeHidden();
  await page.getByText('Menu', { exact: true }).click();
  await expect(nav).toBeVisible();
  await nav.getByRole('link', { name: 'Audit log' }).click();
  await expect(page.getByRole('heading', { name: 'Audit log', level: 1 })).toBeVisible();
  await page.setViewportSize({ width: 1440, height: 900 });
  await visit('/');
  await expect(nav).toBeVisible();
});
