// @ts-check
// The seeds' damage, made by the billing job (stripe-python through the
// proxy to localstripe) and its ledger, found and resolved from the
// browser: a redelivery with a rotated idempotency key (ch_A + ch_B, flagged
// by the proxy at once, refunded from the finding's evidence page), a
// consumer that crashed before writing its billing record and a charge whose
// answer Stripe never sent (an upstream timeout: outcome unknown), both
// adopted in one bulk action, and a record naming a charge Stripe never made
// (dismissed).
const { test, expect, accounts, sql, runBillingJob, createKey, currentPeriod } = require('./fixtures');

const stripeBase = `http://127.0.0.1:${process.env.E2E_STRIPE_PORT || '3902'}`;

async function stripeCharge(id) {
  const response = await fetch(`${stripeBase}/v1/charges/${id}`, {
    headers: { authorization: 'Bearer sk_test_vaultcap_upstream' },
  });
  return response.json();
}

test('operators resolve an orphaned, a duplicate and a missing charge found by a sync', async ({ page, signIn, visit, baseURL }, testInfo) => {
  const prefix = `cust_rec_${testInfo.project.name.replace('-', '')}`;
  const period = currentPeriod();
  await signIn(accounts.admin);
  const secret = await createKey(page, visit, { label: `e2e-reconcile-${testInfo.project.name}-${Date.now()}`, expected: '1,000.00' });

  const first = runBillingJob(baseURL, secret, 2, 4_900, prefix);
  const [chA] = first[0].split(' ').slice(1);
  // The redelivery of customer 0000 with a rotated key charges again.
  const again = runBillingJob(baseURL, secret, 1, 4_900, prefix, 'redelivered');
  const [chB] = again[0].split(' ').slice(1);
  expect(chB).not.toBe(chA);
  // Stripe makes 0000 of the second run, but its answer is lost.
  const lost = runBillingJob(baseURL, secret, 1, 4_900, `${prefix}_t`, 'bill', 'answer_lost');
  expect(lost[0]).toBe(`${prefix}_t_0000 refused outcome_unknown`);
  expect(sql(`SELECT state FROM reservations WHERE metadata_customer_id = '${prefix}_t_0000'`)).toBe('outcome_unknown');
  // Reconciliation decides calls made at least ten minutes before a sync
  // (Stripe's lists may lag): this one was, as far as it knows.
  sql(`UPDATE reservations SET created_at = created_at - interval '15 minutes' WHERE metadata_customer_id = '${prefix}_t_0000'`);
  // The ledger: 0000 recorded with ch_A, 0001 never written (the crash),
  // 0002 names a charge Stripe does not have.
  sql(`INSERT INTO billing_records (customer_id, billing_period, charge_id, amount_cents)
       VALUES ('${prefix}_0000', '${period}', '${chA}', 4900), ('${prefix}_0002', '${period}', 'ch_lost_${prefix}', 4900)`);

  // The duplicate guard (flag, the default) opened the duplicate at once.
  await visit(`/reconciliation?customer=${prefix}`);
  await expect(page.getByRole('row').filter({ hasText: `${prefix}_0000` })).toContainText(`The proxy flagged ${chB}`);

  // The first project's run synced the period already: then it is "again".
  await page.getByRole('button', { name: new RegExp(`^Sync ${period} (from Stripe|again)$`) }).click();
  await expect(page.getByRole('status')).toContainText(`Syncing ${period} from Stripe`);
  const rows = page.getByRole('row').filter({ hasText: prefix });
  await expect.poll(async () => {
    await visit(`/reconciliation?customer=${prefix}`);
    return rows.count();
  }, { timeout: 20_000 }).toBe(4);
  // The sync settled the unknown outcome with the charge Stripe did make.
  const lostCharge = sql(`SELECT id FROM stripe_charges WHERE customer_id = '${prefix}_t_0000'`);
  expect(sql(`SELECT state || ' ' || stripe_charge_id FROM reservations WHERE metadata_customer_id = '${prefix}_t_0000'`))
    .toBe(`settled ${lostCharge}`);

  // Both orphans (the crash and the lost answer) adopted in one bulk action.
  await visit(`/reconciliation?kind=orphaned&customer=${prefix}`);
  await page.getByLabel('Resolve every open finding shown').selectOption('adopt');
  await page.getByRole('button', { name: 'Preview' }).click();
  await expect(page.getByTestId('bulk-count')).toHaveText('2');
  await expect(page.getByTestId('bulk-total')).toHaveText('98.00 USD');
  await page.getByLabel('Yes, adopt 2 orphaned charges').check();
  await page.getByRole('button', { name: 'Adopt the orphaned charges' }).click();
  await expect(page.getByRole('status')).toContainText('Adopted 2 of 2 findings: 98.00 USD.');
  expect(sql(`SELECT string_agg(charge_id, ' ' ORDER BY customer_id) FROM billing_records
              WHERE customer_id IN ('${prefix}_0001', '${prefix}_t_0000')`)).toContain(lostCharge);

  // The duplicate's evidence, then its refund, on its own page.
  await visit(`/reconciliation?customer=${prefix}`);
  const duplicate = page.getByRole('row').filter({ hasText: `${prefix}_0000` });
  await expect(duplicate).toContainText('Duplicate charges');
  await expect(duplicate).toContainText(`${chA} (keep)`);
  await duplicate.getByRole('link', { name: /Evidence for finding/ }).click();
  const comparison = page.getByTestId('charge-comparison');
  await expect(comparison).toContainText(`bill-${prefix}_0000-${period}`);
  await expect(comparison).toContainText(`redelivered-${prefix}_0000-${period}`);
  await page.getByLabel(`Yes, refund 49.00 USD to ${prefix}_0000`).check();
  await page.getByRole('button', { name: /Refund finding/ }).click();
  await expect(page.getByRole('status')).toContainText(`Refunded ${chB} as duplicate of ${chA}`);
  await expect(page.getByRole('heading', { name: 'What was done' })).toBeVisible();
  await expect(page.getByRole('table').filter({ hasText: 'Refunded in Stripe: finding' })).toBeVisible();
  expect((await stripeCharge(chB)).amount_refunded).toBe(4_900);
  expect((await stripeCharge(chA)).amount_refunded).toBe(0);
  await visit(`/reconciliation?customer=${prefix}`);

  const missing = page.getByRole('row').filter({ hasText: `${prefix}_0002` });
  await expect(missing).toContainText('Missing charge');
  await missing.getByLabel(/Reason to dismiss finding/).fill('Test record: the job never called Stripe');
  await missing.getByRole('button', { name: /Dismiss finding/ }).click();
  await expect(page.getByRole('status')).toContainText(`for ${prefix}_0002`);

  await visit(`/reconciliation?state=resolved&customer=${prefix}`);
  const resolved = page.getByRole('row').filter({ hasText: prefix });
  await expect(resolved).toHaveCount(4);
  await expect(resolved.filter({ hasText: `${prefix}_0002` })).toContainText('Reason: Test record: the job never called Stripe');
});
