// @ts-check
// The audit log as an auditor uses it during an incident: filter by
// customer and decision, page forward and back, open a call, export the CSV
// of exactly the filtered set and read it with a standard CSV parser.
const fs = require('node:fs');
const { parse } = require('csv-parse/sync');
const { test, expect, accounts, sql } = require('./fixtures');

/** 60 calls for `customer` under a key labelled as a spreadsheet formula, every third refused at the cap. */
function seed(customer) {
  const key = sql(`INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
                       expected_total_cents, cap_cents, allowed_endpoints, expires_at)
                   VALUES (sha256(convert_to('${customer}', 'UTF8')), 'vk_e2eaud', '=HYPERLINK("x")', '2026-11', 'usd',
                           100000, 110000, ARRAY['POST /v1/charges'], now() + interval '30 days')
                   RETURNING id`);
  sql(`INSERT INTO audit_log (at, request_id, vault_key_id, key_prefix, method, path, metadata_customer_id,
                              billing_period, amount_cents, currency, idempotency_key, decision, upstream_status)
       SELECT now() - make_interval(secs => n), gen_random_uuid(), ${key}, 'vk_e2eaud', 'POST', '/v1/charges',
              '${customer}', '2026-11', 2500, 'usd', '${customer}-' || n,
              CASE WHEN n % 3 = 0 THEN 'refused_cap' ELSE 'allowed' END, CASE WHEN n % 3 = 0 THEN NULL ELSE 200 END
       FROM generate_series(1, 60) AS n`);
}

test('an auditor filters, pages, opens a call and exports exactly the filtered calls', async ({ page, signIn, visit }, testInfo) => {
  const customer = `cust_e2e_${testInfo.project.name}_${Date.now()}`;
  seed(customer);
  await signIn(accounts.viewer);
  await visit('/audit');

  const filters = page.getByRole('search', { name: 'Filter the audit log' });
  await filters.getByLabel('Customer (metadata)').fill(customer);
  await filters.getByLabel('Decision').selectOption('refused_cap');
  await filters.getByLabel('Per page').selectOption('25');
  await filters.getByRole('button', { name: 'Apply' }).click();
  await expect(page).toHaveURL(/decision=refused_cap/);

  const rows = page.locator('tbody tr');
  await expect(rows).toHaveCount(20);
  await expect(rows.first()).toContainText('Refused: over the cap');
  await expect(filters.getByLabel('Per page')).toHaveValue('25');
  const firstPage = await rows.first().getAttribute('data-call');

  // 20 refusals in pages of 25 fit one page: widen to every decision to page.
  await filters.getByLabel('Decision').selectOption('');
  await filters.getByRole('button', { name: 'Apply' }).click();
  await expect(rows).toHaveCount(25);
  const pageOne = await rows.evaluateAll((trs) => trs.map((tr) => tr.getAttribute('data-call')));
  await page.getByRole('link', { name: 'Older →' }).click();
  await expect(rows).toHaveCount(25);
  const pageTwo = await rows.evaluateAll((trs) => trs.map((tr) => tr.getAttribute('data-call')));
  expect(pageTwo.filter((id) => pageOne.includes(id))).toEqual([]);
  await page.getByRole('link', { name: '← Newer' }).click();
  await expect(rows).toHaveCount(25);
  expect(await rows.evaluateAll((trs) => trs.map((tr) => tr.getAttribute('data-call')))).toEqual(pageOne);

  // Open one call: everything about it, and the way to its siblings.
  await rows.first().getByRole('link').click();
  await expect(page.getByRole('heading', { level: 1 })).toContainText('POST /v1/charges');
  await expect(page.getByRole('link', { name: 'Every call for this customer' })).toBeVisible();
  await page.getByRole('link', { name: 'Every call for this customer' }).click();
  await expect(rows).toHaveCount(50);

  // Export the refusals: exactly the 20 shown, the formula label neutralised.
  await visit(`/audit?customer_id=${customer}&decision=refused_cap`);
  const [download] = await Promise.all([
    page.waitForEvent('download'),
    page.getByRole('link', { name: 'Export CSV' }).click(),
  ]);
  expect(download.suggestedFilename()).toMatch(/^vaultcap-audit-.*-decision-refused_cap\.csv$/);
  const records = parse(fs.readFileSync(await download.path(), 'utf8'), { columns: true });
  expect(records).toHaveLength(20);
  expect(records.every((r) => r.decision === 'refused_cap' && r.customer_id === customer)).toBe(true);
  expect(records[0].vault_key_label).toBe(`'=HYPERLINK("x")`);
  expect(records[0].amount).toBe('25.00');
  expect(records[0].id).toBe(firstPage);
});
