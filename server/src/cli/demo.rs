//! `vaultcap demo`: realistic data to try the console with — three billing
//! periods (the current month and the two before it) of a subscription
//! business with usage charges, the ledger its billing job wrote, the vault
//! keys those runs used and the calls the proxy audited for them. Safe to
//! run twice: rows that exist are kept.

use app::{
    domain::BillingPeriod,
    ssr::data::actions::{self, Actor},
};
use clap::Args;
use sqlx::{Postgres, Transaction};

use crate::{config::DatabaseArgs, db::Database};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How many customers the demo business bills each month.
    #[arg(long, default_value_t = 1200, value_parser = clap::value_parser!(i32).range(1..=1_000_000))]
    customers: i32,

    /// Also generate this many audit rows over the keys (scale data for
    /// benchmarks; the keys' spent totals are left as they are).
    #[arg(long, default_value_t = 0)]
    audit_rows: u64,

    #[command(flatten)]
    database: DatabaseArgs,
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let db = Database::open(&args.database).await?;
    let mut result = fill(&db, args.customers).await;
    if result.is_ok() && args.audit_rows > 0 {
        result = super::audit_rows::generate(&db.pool, args.audit_rows)
            .await
            .map(|rows| println!("Generated {rows} audit rows."));
    }
    db.close().await?;
    result
}

async fn fill(db: &Database, customers: i32) -> anyhow::Result<()> {
    let current = BillingPeriod::containing(chrono::Utc::now());
    let periods = [current.previous().previous(), current.previous(), current];
    let mut tx = db.pool.begin().await?;
    for period in periods {
        // The current run is under way: about 60 % of customers billed so far.
        let billed_share = if period == current { 60 } else { 100 };
        let records = insert_billing_records(&mut tx, period, customers, billed_share).await?;
        insert_run_key(&mut tx, period, customers, period != current).await?;
        println!("{period}: {records} new billing records");
    }
    insert_extra_keys(&mut tx, current).await?;
    insert_calls(&mut tx, current).await?;
    insert_alerts(&mut tx, current).await?;
    insert_cap_increases(&mut tx, current).await?;
    actions::record(
        &mut *tx,
        Actor::Cli,
        "load_demo_data",
        "database",
        None,
        serde_json::json!({ "customers": customers, "periods": periods.map(|p| p.to_string()) }),
    )
    .await?;
    tx.commit().await?;
    println!(
        "Demo data ready: {customers} customers over {} to {current}.",
        periods[0]
    );
    Ok(())
}

/// The amount customer `n` owes in `period`, in cents: a plan fee (29, 49,
/// 99 or 249 USD) plus up to 50 USD of usage, the same on every run.
const AMOUNT_SQL: &str = "(ARRAY[2900, 4900, 9900, 24900])[1 + abs(hashtext('plan' || n)) % 4]
                          + abs(hashtext($1 || ':usage:' || n)) % 5000";

async fn insert_billing_records(
    tx: &mut Transaction<'_, Postgres>,
    period: BillingPeriod,
    customers: i32,
    billed_share: i32,
) -> anyhow::Result<u64> {
    // About 2 % of cards are declined; declined customers have no charge.
    let sql = format!(
        "INSERT INTO billing_records
             (customer_id, billing_period, stripe_customer_id, charge_id, amount_cents, currency, status, created_at)
         SELECT format('cust_%s', lpad(n::text, 6, '0')), $1, format('cus_demo%s', lpad(n::text, 8, '0')),
                CASE WHEN declined THEN NULL ELSE 'ch_demo_' || left(md5($1 || n), 20) END,
                {AMOUNT_SQL}, 'usd',
                CASE WHEN declined THEN 'card_declined' ELSE 'charged' END,
                $2::timestamptz + make_interval(secs => $5 * n / ($3 * $4 / 100))
         FROM generate_series(1, $3 * $4 / 100) AS n,
              LATERAL (SELECT abs(hashtext($1 || ':card:' || n)) % 100 < 2 AS declined) AS card
         ON CONFLICT (customer_id, billing_period) DO NOTHING"
    );
    // The run charges customers one after the other, until now at most.
    let run = (period.ends_at().min(chrono::Utc::now()) - period.starts_at()).num_seconds() as f64;
    let done = sqlx::query(&sql)
        .bind(period.to_string())
        .bind(period.starts_at())
        .bind(customers)
        .bind(billed_share)
        .bind(run)
        .execute(&mut **tx)
        .await?;
    Ok(done.rows_affected())
}

/// The period's billing-run key: expected total is what every customer owes,
/// the cap 10 % above it, spent what the ledger says was charged.
async fn insert_run_key(
    tx: &mut Transaction<'_, Postgres>,
    period: BillingPeriod,
    customers: i32,
    finished: bool,
) -> anyhow::Result<()> {
    let sql = format!(
        "WITH expected AS (
             SELECT sum({AMOUNT_SQL})::bigint AS cents FROM generate_series(1, $2) AS n
         ), charged AS (
             SELECT coalesce(sum(amount_cents), 0)::bigint AS cents
             FROM billing_records WHERE billing_period = $1 AND status = 'charged'
         )
         INSERT INTO vault_keys
             (secret_hash, secret_prefix, label, billing_period, currency, expected_total_cents,
              cap_cents, spent_cents, allowed_endpoints, expires_at, created_at)
         SELECT sha256(convert_to(gen_random_uuid()::text, 'UTF8')), 'vk_' || left(md5($1), 8),
                'billing-run-' || $1, $1, 'usd', expected.cents, expected.cents * 11 / 10, charged.cents,
                ARRAY['POST /v1/charges', 'POST /v1/payment_intents'],
                CASE WHEN $3 THEN $5::timestamptz + interval '2 days' ELSE $5::timestamptz - interval '1 second' END,
                $4::timestamptz
         FROM expected, charged
         WHERE NOT EXISTS (SELECT 1 FROM vault_keys WHERE label = 'billing-run-' || $1)"
    );
    sqlx::query(&sql)
        .bind(period.to_string())
        .bind(customers)
        .bind(finished)
        .bind(period.starts_at())
        .bind(period.ends_at())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A busy key near its cap and a revoked one, so the console shows the
/// states operators must notice.
async fn insert_extra_keys(
    tx: &mut Transaction<'_, Postgres>,
    period: BillingPeriod,
) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO vault_keys
             (secret_hash, secret_prefix, label, billing_period, currency, expected_total_cents,
              cap_cents, spent_cents, reserved_cents, allowed_endpoints, expires_at,
              revoked_at, revoke_reason)
         SELECT sha256(convert_to(gen_random_uuid()::text, 'UTF8')), 'vk_' || left(md5(label), 8), label, $1,
                currency, expected, cap, spent, reserved,
                ARRAY['POST /v1/payment_intents', 'POST /v1/payment_intents/{id}/confirm'],
                $2::timestamptz - interval '1 second', revoked_at, revoke_reason
         FROM (VALUES
             ('eu-enterprise-' || $1, 'eur', 1850000::bigint, 2035000::bigint, 1840500::bigint, 52000::bigint,
              NULL::timestamptz, NULL::text),
             ('usage-backfill-' || $1, 'usd', 420000, 462000, 12500, 0,
              LEAST($3::timestamptz + interval '3 days', now() - interval '1 hour'),
              'Replaced: the backfill was re-planned with corrected totals')
         ) AS extra(label, currency, expected, cap, spent, reserved, revoked_at, revoke_reason)
         WHERE NOT EXISTS (SELECT 1 FROM vault_keys k WHERE k.label = extra.label)",
    )
    .bind(period.to_string())
    .bind(period.ends_at())
    .bind(period.starts_at())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The calls the proxy audited for the keys above: one charge per billing
/// record of a run (declined cards answered 402 by Stripe), a few retries
/// the proxy recognised as replays, and the enterprise key's charges with
/// the calls it refused at its cap. Skipped for keys that have calls.
async fn insert_calls(
    tx: &mut Transaction<'_, Postgres>,
    period: BillingPeriod,
) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO audit_log (at, request_id, vault_key_id, key_prefix, method, path, stripe_customer,
             metadata_customer_id, metadata_billing_period, billing_period, amount_cents, currency,
             idempotency_key, decision, upstream_status, stripe_object_id, error_code, latency_ms)
         SELECT br.created_at, gen_random_uuid(), k.id, k.secret_prefix, 'POST', '/v1/charges',
                br.stripe_customer_id, br.customer_id, br.billing_period, br.billing_period,
                br.amount_cents, br.currency, 'bill-' || br.customer_id || '-' || br.billing_period,
                call.decision, call.status, call.object_id, call.error_code,
                180 + abs(hashtext(br.customer_id)) % 400
         FROM billing_records br
         JOIN vault_keys k ON k.label = 'billing-run-' || br.billing_period
         CROSS JOIN LATERAL (VALUES
             ('allowed', CASE WHEN br.status = 'charged' THEN 200 ELSE 402 END,
              br.charge_id, CASE WHEN br.status = 'charged' THEN NULL ELSE 'card_declined' END),
             -- Every 97th message was delivered twice: the retry replays.
             ('replay', 200, br.charge_id, NULL)
         ) AS call(decision, status, object_id, error_code)
         WHERE (call.decision = 'allowed' OR (br.status = 'charged' AND br.id % 97 = 0))
           AND NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.vault_key_id = k.id)
         ORDER BY br.created_at",
    )
    .execute(&mut **tx)
    .await?;
    // The extra keys: 40 payment intents adding up to what each spent, then
    // (for the key near its cap) three refused at the cap.
    sqlx::query(
        "INSERT INTO audit_log (at, request_id, vault_key_id, key_prefix, method, path, stripe_customer,
             metadata_customer_id, billing_period, amount_cents, currency, idempotency_key, decision,
             upstream_status, stripe_object_id, error_code, latency_ms)
         SELECT $2::timestamptz + (LEAST(now(), k.revoked_at) - $2::timestamptz) * n / 44,
                gen_random_uuid(), k.id, k.secret_prefix, 'POST', '/v1/payment_intents',
                format('cus_x%s', lpad(n::text, 4, '0')), format('x_%s', lpad(n::text, 4, '0')), $1,
                CASE WHEN n <= 40 THEN k.spent_cents / 40 + CASE WHEN n = 40 THEN k.spent_cents % 40 ELSE 0 END
                     ELSE 190000 END,
                k.currency, format('%s-%s', k.label, n),
                CASE WHEN n <= 40 THEN 'allowed' ELSE 'refused_cap' END,
                CASE WHEN n <= 40 THEN 200 END,
                CASE WHEN n <= 40 THEN 'pi_demo_' || left(md5(k.label || n), 20) END,
                CASE WHEN n > 40 THEN 'spend_cap_exceeded' END,
                CASE WHEN n <= 40 THEN 250 ELSE 3 END
         FROM vault_keys k, generate_series(1, 43) AS n
         WHERE k.label IN ('eu-enterprise-' || $1, 'usage-backfill-' || $1)
           AND (n <= 40 OR k.revoked_at IS NULL)
           AND NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.vault_key_id = k.id)",
    )
    .bind(period.to_string())
    .bind(period.starts_at())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The threshold alerts the proxy would have raised for the keys above:
/// those of past periods acknowledged by the first admin (when there is
/// one), this period's open.
async fn insert_alerts(
    tx: &mut Transaction<'_, Postgres>,
    current: BillingPeriod,
) -> anyhow::Result<()> {
    sqlx::query(
        "WITH crossed AS (
             SELECT k.id, t, k.cap_cents, k.spent_cents + k.reserved_cents AS used,
                    LEAST(now() - interval '2 hours', k.expires_at - interval '3 days') AS raised_at,
                    k.billing_period <> $1 AS past
             FROM vault_keys k, unnest(k.alert_thresholds_pct) AS t
             WHERE (k.spent_cents + k.reserved_cents) * 100 >= t::bigint * k.cap_cents
         ), admin AS (SELECT min(id) AS id FROM operators WHERE role = 'admin')
         INSERT INTO alerts (vault_key_id, kind, threshold_pct, committed_cents, cap_cents,
                             raised_at, last_occurred_at, acknowledged_at, acknowledged_by, ack_note)
         SELECT c.id, 'threshold', c.t, c.used, c.cap_cents, c.raised_at, c.raised_at,
                CASE WHEN c.past AND admin.id IS NOT NULL THEN c.raised_at + interval '40 minutes' END,
                CASE WHEN c.past THEN admin.id END,
                CASE WHEN c.past AND admin.id IS NOT NULL THEN 'Expected: every customer billed, within the buffer.' END
         FROM crossed c, admin
         ON CONFLICT ON CONSTRAINT alerts_once DO NOTHING",
    )
    .bind(current.to_string())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Cap increase requests from the demo billing job's API token: one waiting
/// for a decision on the key near its cap (the three charges it refused),
/// and one the first admin rejected (when there is one) on the key that was
/// revoked later. Skipped for keys that have requests.
async fn insert_cap_increases(
    tx: &mut Transaction<'_, Postgres>,
    current: BillingPeriod,
) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO api_tokens (name, token_hash, token_prefix, scopes, expires_at)
         SELECT 'demo billing job', sha256(convert_to(gen_random_uuid()::text, 'UTF8')), 'vct_demo',
                '{keys:create,keys:read,cap_requests:create}', now() + interval '90 days'
         WHERE NOT EXISTS (SELECT 1 FROM api_tokens WHERE name = 'demo billing job')",
    )
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "WITH token AS (SELECT min(id) AS id FROM api_tokens WHERE name = 'demo billing job'),
              admin AS (SELECT min(id) AS id FROM operators WHERE role = 'admin' AND disabled_at IS NULL)
         INSERT INTO cap_increase_requests (vault_key_id, from_cap_cents, to_cap_cents, apply_as, reason,
             origin, requested_at, requested_by_token, expires_at, decision, decided_at, decided_by, decision_note)
         SELECT k.id, k.cap_cents, k.cap_cents + r.more, 'raise_cap', r.reason, 'api', r.asked,
                token.id, LEAST(r.asked + interval '24 hours', k.expires_at),
                CASE WHEN r.rejected AND admin.id IS NOT NULL THEN 'rejected' END,
                CASE WHEN r.rejected AND admin.id IS NOT NULL THEN r.asked + interval '35 minutes' END,
                CASE WHEN r.rejected THEN admin.id END,
                CASE WHEN r.rejected AND admin.id IS NOT NULL THEN 'The backfill totals were wrong: re-plan it with a new key.' END
         FROM (VALUES
             ('eu-enterprise-' || $1, 627000::bigint, false, now() - interval '25 minutes',
              'Three payment intents of 1,900.00 EUR were refused at the cap: new enterprise seats signed this week.'),
             ('usage-backfill-' || $1, 150000, true, LEAST($2::timestamptz + interval '2 days', now() - interval '3 hours'),
              'The backfill found more usage than planned.')
         ) AS r(label, more, rejected, asked, reason)
         JOIN vault_keys k ON k.label = r.label, token, admin
         WHERE (NOT r.rejected OR admin.id IS NOT NULL)
           AND NOT EXISTS (SELECT 1 FROM cap_increase_requests c WHERE c.vault_key_id = k.id)",
    )
    .bind(current.to_string())
    .bind(current.starts_at())
    .execute(&mut **tx)
    .await?;
    Ok(())
}
