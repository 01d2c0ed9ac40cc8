// @ts-check
// The seeds' damage, made by the billing job (stripe-python through the
// proxy to localstripe) and its ledger, found and resolved from the
// browser: a redelivery with a rotated idempotency key (ch_A + ch_B, one
// refunded), a consumer that crashed before writing its billing record
// (adopted), and a record naming a charge Stripe never made (dismissed).
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
  // The ledger: 0000 recorded with ch_A, 0001 never written (the crash),
  // 0002 names a charge Stripe does not have.
  sql(`INSERT INTO billing_records (customer_id, billing_period, charge_id, amount_cents)
       VALUES ('${prefix}_0000', '${period}', '${chA}', 4900), ('${prefix}_0002', '${period}', 'ch_lost_${prefix}', 4900)`);

  await visit('/reconciliation');
  await page.getByRole('button', { name: `Sync ${period} from Stripe` }).click();
  await expect(page.getByRole('status')).toContainText(`Syncing ${period} from Stripe`);
  const rows = page.getByRole('row').filter({ hasText: prefix });
  await expect.poll(async () => {
    await visit('/reconciliation');
    return rows.count();
  }, { timeout: 20_000 }).toBe(3);

  const orphan = rows.filter({ hasText: `${prefix}_0001` });
  await expect(orphan).toContainText('Orphaned charge');
  await orphan.getByRole('button', { name: /Adopt finding/ }).click();
  await expect(page.getByRole('status')).toContainText(`for ${prefix}_0001`);
  expect(sql(`SELECT status FROM billing_records WHERE customer_id = '${prefix}_0001'`)).toBe('charged');

  const duplicate = page.getByRole('row').filter({ hasText: `${prefix}_0000` });
  await expect(duplicate).toContainText('Duplicate charges');
  await expect(duplicate).toContainText(`${chA} (keep)`);
  await duplicate.getByLabel(`Yes, refund 49.00 USD to ${prefix}_0000`).check();
  await duplicate.getByRole('button', { name: /Refund finding/ }).click();
  await expect(page.getByRole('status')).toContainText(`Refunded ${chB} as duplicate of ${chA}`);
  expect((await stripeCharge(chB)).amount_refunded).toBe(4_900);
  expect((await stripeCharge(chA)).amount_refunded).toBe(0);

  const missing = page.getByRole('row').filter({ hasText: `${prefix}_0002` });
  await expect(missing).toContainText('Missing charge');
  await missing.getByLabel(/Reason to dismiss finding/).fill('Test record: the job never called Stripe');
  await missing.getByRole('button', { name: /Dismiss finding/ }).click();
  await expect(page.getByRole('status')).toContainText(`for ${prefix}_0002`);

  await visit('/reconciliation?state=resolved');
  const resolved = page.getByRole('row').filter({ hasText: prefix });
  await expect(resolved).toHaveCount(3);
  await expect(resolved.filter({ hasText: `${prefix}_0002` })).toContainText('Reason: Test record: the job never called Stripe');
});
