// @ts-check
// Closing a billing period with four eyes, from the browser: an operator
// prepares the close of an ended period, cannot sign it off themselves, a
// different approver signs it, the period's keys are revoked, and the CSV
// pack of the signed report parses (checked with Python's zipfile and csv).
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { test, expect, accounts, sql } = require('./fixtures');

const python = path.resolve(__dirname, '../../target/pyenv/bin/python');
const shots = path.resolve(__dirname, '../screenshots');

/** An ended period of its own per project, so the two runs never meet. */
function periodFor(project) {
  return project === 'hydrated' ? '2019-04' : '2019-03';
}

/** A key of `period` that spent 30.00 USD in three audited calls. */
function seedPeriod(period, label) {
  const keyId = sql(`INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
                         expected_total_cents, cap_cents, spent_cents, allowed_endpoints, expires_at)
                     VALUES (sha256(convert_to('${label}', 'UTF8')), 'vk_e2e', '${label}', '${period}', 'usd',
                             10000, 11000, 3000, ARRAY['POST /v1/charges'], now() + interval '30 days')
                     RETURNING id`);
  sql(`INSERT INTO audit_log (request_id, vault_key_id, billing_period, method, path,
           amount_cents, currency, decision, upstream_status)
       SELECT gen_random_uuid(), ${keyId}, '${period}', 'POST', '/v1/charges', 1000, 'usd', 'allowed', 200
       FROM generate_series(1, 3)`);
}

/** The pack's files, as Python's zipfile reads them: name -> CSV rows (or text). */
function unpack(file) {
  const script = `
import csv, io, json, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as pack:
    assert pack.testzip() is None
    out = {}
    for name in pack.namelist():
        text = pack.read(name).decode("utf-8")
        out[name] = list(csv.DictReader(io.StringIO(text))) if name.endswith(".csv") else text
print(json.dumps(out))`;
  return JSON.parse(execFileSync(python, ['-c', script, file], { encoding: 'utf8' }));
}

test('an operator prepares the close, cannot sign it, an approver signs it off and the pack parses', async ({ page, signIn, visit }, testInfo) => {
  const period = periodFor(testInfo.project.name);
  const label = `e2e-close-${testInfo.project.name}`;
  seedPeriod(period, label);

  // The admin may both prepare and approve: only the four-eyes rule stops them.
  await signIn(accounts.admin);
  await visit(`/periods/${period}`);
  await expect(page.getByRole('heading', { level: 1 })).toHaveText(`Close of ${period}`);
  await expect(page.getByTestId('period-state')).toHaveText('Open');
  await expect(page.getByTestId('period-money').locator('tbody tr')).toContainText(/110\.00\s*USD\s*30\.00\s*USD/);
  await expect(page.getByTestId('blockers')).toHaveText('Nothing stands in the way of the sign-off.');
  await page.getByLabel('Note for the approver (optional)').fill('Matches the ledger export of 2 Dec');
  await page.getByRole('button', { name: `Prepare the close of ${period}` }).click();

  await expect(page.getByRole('status')).toContainText(`The close of ${period} is prepared`);
  await expect(page.getByTestId('period-state')).toHaveText('Closing');
  await expect(page.getByTestId('four-eyes')).toContainText('another approver signs it off');
  await expect(page.getByRole('button', { name: `Sign off ${period}` })).toHaveCount(0);
  expect(sql(`SELECT count(*) FROM vault_keys WHERE billing_period = '${period}' AND revoked_at IS NULL`)).toBe('1');

  await page.getByRole('button', { name: 'Sign out' }).click();
  await signIn(accounts.approver);
  await visit(`/periods/${period}`);
  await expect(page.getByTestId('prepared-by')).toContainText(`Prepared by ${accounts.admin.email}`);
  await expect(page.locator('blockquote.note')).toHaveText('Matches the ledger export of 2 Dec');
  await page.getByRole('button', { name: `Sign off ${period}` }).click();

  await expect(page.getByRole('status')).toContainText(`${period} is signed off: 1 key(s) revoked`);
  await expect(page.getByTestId('period-state')).toHaveText('Signed off');
  await expect(page.getByTestId('signed-by')).toContainText(accounts.approver.email);
  await expect(page.getByRole('table', { name: 'Keys of the period' }).getByRole('row').filter({ hasText: label })).toContainText('revoked');
  expect(sql(`SELECT count(*) FROM vault_keys WHERE billing_period = '${period}' AND revoked_at IS NULL`)).toBe('0');
  const hash = await page.locator('code.hash').textContent();
  expect(hash).toMatch(/^[0-9a-f]{64}$/);

  const [download] = await Promise.all([
    page.waitForEvent('download'),
    page.getByRole('link', { name: 'Download CSV pack' }).click(),
  ]);
  expect(download.suggestedFilename()).toBe(`vaultcap-close-${period}.zip`);
  const file = testInfo.outputPath('pack.zip');
  await download.saveAs(file);
  const pack = unpack(file);
  expect(Object.keys(pack).sort()).toEqual([
    'calls.csv', 'cap_increases.csv', 'findings.csv', 'keys.csv', 'money.csv',
    'report.json', 'report.sha256', 'sign_off.csv',
  ]);
  expect(pack['report.sha256']).toBe(`${hash}  report.json\n`);
  expect(pack['sign_off.csv']).toHaveLength(1);
  expect(pack['sign_off.csv'][0]).toMatchObject({
    billing_period: period, prepared_by: accounts.admin.email, signed_by: accounts.approver.email,
    report_sha256: hash, calls: '3',
  });
  expect(pack['calls.csv']).toHaveLength(3);
  expect(pack['keys.csv'].map((key) => key.label)).toEqual([label]);
  expect(pack['money.csv'][0]).toMatchObject({ currency: 'USD', capped_minor_units: '11000', metered_minor_units: '3000' });

  // Printed, the page is the report: no navigation, no buttons, the hash kept.
  await page.emulateMedia({ media: 'print' });
  await expect(page.getByRole('navigation', { name: 'Main' })).toBeHidden();
  await expect(page.getByRole('link', { name: 'Download CSV pack' })).toBeHidden();
  await expect(page.getByRole('button', { name: 'Sign out' })).toBeHidden();
  await expect(page.locator('code.hash')).toBeVisible();
  await expect(page.getByRole('table', { name: 'Keys of the period' })).toBeVisible();
  fs.mkdirSync(shots, { recursive: true });
  await page.screenshot({ path: path.join(shots, `period-print-${testInfo.project.name}.png`), fullPage: true });
});
