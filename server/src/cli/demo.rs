//! `vaultcap demo`: realistic data to try the console with — three billing
//! periods (the current month and the two before it) of a subscription
//! business with usage charges, the ledger its billing job wrote, the vault
//! keys those runs used and the calls the proxy audited for them, with the
//! people who acted on them. The story runs along one timeline (see
//! [`Story`]) and every decision in it is in the action log. Safe to run
//! twice: rows that exist are kept.

use app::{
    actions::sql::{self as actions, Actor},
    domain::BillingPeriod,
};
use chrono::{DateTime, Utc};
use clap::Args;
use sqlx::{PgPool, Postgres, Transaction};

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
    let mut result = fill(&db.pool, args.customers, Utc::now()).await;
    if result.is_ok() && args.audit_rows > 0 {
        result = super::audit_rows::generate(&db.pool, args.audit_rows)
            .await
            .map(|rows| println!("Generated {rows} audit rows."));
    }
    db.close().await?;
    result
}

/// When the demo's events happen, so that each follows what it depends
/// on and all are over by `now`: the demo people and the billing job's
/// token exist before the first period, a key before its calls, a request
/// before its decision and a decision before the revocation it led to.
/// This month's events are placed at shares of the time elapsed since the
/// month began, so the order holds even minutes into a month.
#[derive(Debug, Clone, Copy)]
pub struct Story {
    pub now: DateTime<Utc>,
    pub current: BillingPeriod,
}

impl Story {
    // This month's events, as shares of the time since it began.
    const KEYS_MADE: f64 = 0.02;
    const BACKFILL_ASKED: f64 = 0.30;
    const BACKFILL_REJECTED: f64 = 0.36;
    const BACKFILL_REVOKED: f64 = 0.40;
    /// After the enterprise key's refused calls (the last at 43/44 of its span).
    const ENTERPRISE_ASKED: f64 = 0.99;

    /// The three periods shown: the two before the current one, and it.
    pub fn periods(&self) -> [BillingPeriod; 3] {
        let current = self.current;
        [current.previous().previous(), current.previous(), current]
    }

    /// When the demo people and the billing job's token were made: a week
    /// before the first period.
    fn founded(&self) -> DateTime<Utc> {
        self.periods()[0].starts_at() - chrono::Duration::days(7)
    }

    /// `share` (0 to 1) of the way from this month's start to now.
    fn this_month(&self, share: f64) -> DateTime<Utc> {
        let start = self.current.starts_at();
        let elapsed = (self.now - start).num_milliseconds() as f64;
        start + chrono::Duration::milliseconds((elapsed * share) as i64)
    }
}

/// The demo's people: they made the decisions in its history, and cannot
/// sign in (no password; disabled when the demo was loaded).
pub const DEMO_OPERATOR: &str = "lena.ops@demo.invalid";
pub const DEMO_APPROVER: &str = "omar.approver@demo.invalid";

pub async fn fill(pool: &PgPool, customers: i32, now: DateTime<Utc>) -> anyhow::Result<()> {
    let story = Story {
        now,
        current: BillingPeriod::containing(now),
    };
    let periods = story.periods();
    let mut tx = pool.begin().await?;
    insert_people_and_token(&mut tx, &story).await?;
    for period in periods {
        // The current run is under way: about 60 % of customers billed so far.
        let billed_share = if period == story.current { 60 } else { 100 };
        let records = insert_billing_records(&mut tx, period, customers, billed_share, now).await?;
        insert_run_key(&mut tx, period, customers, period != story.current).await?;
        println!("{period}: {records} new billing records");
    }
    insert_extra_keys(&mut tx, &story).await?;
    insert_calls(&mut tx, &story).await?;
    insert_alerts(&mut tx, &story).await?;
    insert_cap_increases(&mut tx, &story).await?;
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
        "Demo data ready: {customers} customers over {} to {}.",
        periods[0], story.current
    );
    Ok(())
}

/// The demo's operator and approver, and the billing job's API token,
/// made from the command line before the first period; the people are
/// disabled now, so nobody signs in as them.
async fn insert_people_and_token(
    tx: &mut Transaction<'_, Postgres>,
    story: &Story,
) -> anyhow::Result<()> {
    sqlx::query(
        "WITH made AS (
             INSERT INTO operators (email, role, password_hash, created_at, disabled_at)
             SELECT email, role, '!demo person: no password', $1, $2
             FROM (VALUES ($3, 'operator'), ($4, 'approver')) AS p(email, role)
             WHERE NOT EXISTS (SELECT 1 FROM operators o WHERE o.email = p.email)
             RETURNING id, email, role
         ), added AS (
             INSERT INTO operator_actions (at, action, subject_type, subject_id, details, via)
             SELECT $1, 'add_operator', 'operator', id::text,
                    jsonb_build_object('email', email, 'role', role), 'cli' FROM made
         )
         INSERT INTO operator_actions (at, action, subject_type, subject_id, details, via)
         SELECT $2, 'disable_operator', 'operator', id::text,
                jsonb_build_object('email', email, 'reason', 'demo people do not sign in'), 'cli'
         FROM made",
    )
    .bind(story.founded())
    .bind(story.now)
    .bind(DEMO_OPERATOR)
    .bind(DEMO_APPROVER)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "WITH made AS (
             INSERT INTO api_tokens (name, token_hash, token_prefix, scopes, created_at, expires_at)
             SELECT 'demo billing job', sha256(convert_to(gen_random_uuid()::text, 'UTF8')), 'vct_demo',
                    '{keys:create,keys:read,cap_requests:create}', $1, $2::timestamptz + interval '90 days'
             WHERE NOT EXISTS (SELECT 1 FROM api_tokens WHERE name = 'demo billing job')
             RETURNING id, name, scopes
         )
         INSERT INTO operator_actions (at, action, subject_type, subject_id, details, via)
         SELECT $1, 'create_api_token', 'api_token', id::text,
                jsonb_build_object('name', name, 'scopes', scopes), 'cli' FROM made",
    )
    .bind(story.founded())
    .bind(story.now)
    .execute(&mut **tx)
    .await?;
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
    now: DateTime<Utc>,
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
    let run = (period.ends_at().min(now) - period.starts_at()).num_seconds() as f64;
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

/// The period's billing-run key, made by the billing job's token as the
/// period began: expected total is what every customer owes, the cap 10 %
/// above it, spent what the ledger says was charged.
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
         ), token AS (SELECT min(id) AS id FROM api_tokens WHERE name = 'demo billing job'),
         made AS (
             INSERT INTO vault_keys
                 (secret_hash, secret_prefix, label, billing_period, currency, expected_total_cents,
                  cap_cents, spent_cents, allowed_endpoints, expires_at, created_at, created_by_token)
             SELECT sha256(convert_to(gen_random_uuid()::text, 'UTF8')), 'vk_' || left(md5($1), 8),
                    'billing-run-' || $1, $1, 'usd', expected.cents, expected.cents * 11 / 10, charged.cents,
                    ARRAY['POST /v1/charges', 'POST /v1/payment_intents'],
                    CASE WHEN $3 THEN $5::timestamptz - interval '1 second' ELSE $5::timestamptz + interval '2 days' END,
                    $4::timestamptz, token.id
             FROM expected, charged, token
             WHERE NOT EXISTS (SELECT 1 FROM vault_keys WHERE label = 'billing-run-' || $1)
             RETURNING *
         )
         {KEY_CREATED_SQL}"
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

/// The action log's entry for each key in `made` (a CTE of inserted
/// vault keys), as the console or the API writes it.
const KEY_CREATED_SQL: &str = "INSERT INTO operator_actions
         (at, operator_id, api_token_id, action, subject_type, subject_id, details, via)
     SELECT created_at, created_by, created_by_token, 'create_vault_key', 'vault_key', id::text,
            jsonb_build_object('label', label, 'billing_period', billing_period, 'cap_cents', cap_cents,
                               'currency', currency, 'prefix', secret_prefix),
            CASE WHEN created_by IS NOT NULL THEN 'console' ELSE 'api' END
     FROM made";

/// A busy key near its cap and one revoked after its cap increase was
/// rejected, both made by the demo operator early this month, so the
/// console shows the states operators must notice.
async fn insert_extra_keys(
    tx: &mut Transaction<'_, Postgres>,
    story: &Story,
) -> anyhow::Result<()> {
    let sql = format!(
        "WITH lena AS (SELECT id FROM operators WHERE email = $4),
         made AS (
             INSERT INTO vault_keys
                 (secret_hash, secret_prefix, label, billing_period, currency, expected_total_cents,
                  cap_cents, spent_cents, reserved_cents, allowed_endpoints, expires_at,
                  created_at, created_by)
             SELECT sha256(convert_to(gen_random_uuid()::text, 'UTF8')), 'vk_' || left(md5(label), 8), label, $1,
                    currency, expected, cap, spent, reserved,
                    ARRAY['POST /v1/payment_intents', 'POST /v1/payment_intents/{{id}}/confirm'],
                    $2::timestamptz - interval '1 second', $3, lena.id
             FROM (VALUES
                 ('eu-enterprise-' || $1, 'eur', 1850000::bigint, 2035000::bigint, 1840500::bigint, 52000::bigint),
                 ('usage-backfill-' || $1, 'usd', 420000, 462000, 12500, 0)
             ) AS extra(label, currency, expected, cap, spent, reserved), lena
             WHERE NOT EXISTS (SELECT 1 FROM vault_keys k WHERE k.label = extra.label)
             RETURNING *
         )
         {KEY_CREATED_SQL}"
    );
    sqlx::query(&sql)
        .bind(story.current.to_string())
        .bind(story.current.ends_at())
        .bind(story.this_month(Story::KEYS_MADE))
        .bind(DEMO_OPERATOR)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The calls the proxy audited for the keys above: one charge per billing
/// record of a run (declined cards answered 402 by Stripe), a few retries
/// the proxy recognised as replays, and the extra keys' payment intents,
/// spread from each key's creation to now (or its revocation), with the
/// calls the key near its cap refused. Skipped for keys that have calls.
async fn insert_calls(tx: &mut Transaction<'_, Postgres>, story: &Story) -> anyhow::Result<()> {
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
    // 40 payment intents adding up to what each key spent, then (for the
    // key near its cap) three refused at the cap. The backfill's calls end
    // before it is revoked.
    sqlx::query(
        "INSERT INTO audit_log (at, request_id, vault_key_id, key_prefix, method, path, stripe_customer,
             metadata_customer_id, billing_period, amount_cents, currency, idempotency_key, decision,
             upstream_status, stripe_object_id, error_code, latency_ms)
         SELECT k.created_at + (span.until - k.created_at) * n / 44,
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
         FROM vault_keys k
         CROSS JOIN LATERAL (SELECT CASE WHEN k.label LIKE 'usage-backfill-%' THEN $4::timestamptz
                                         ELSE $3::timestamptz END AS until) AS span
         CROSS JOIN generate_series(1, 43) AS n
         WHERE k.label IN ('eu-enterprise-' || $1, 'usage-backfill-' || $1)
           AND (n <= 40 OR k.label LIKE 'eu-enterprise-%')
           AND NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.vault_key_id = k.id)",
    )
    .bind(story.current.to_string())
    .bind(story.current.starts_at())
    .bind(story.now)
    .bind(story.this_month(Story::BACKFILL_REVOKED))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The threshold alerts the proxy raised for the demo keys, each at the
/// call that crossed it: those of past periods acknowledged by the demo
/// operator soon after (in the action log), this period's open.
async fn insert_alerts(tx: &mut Transaction<'_, Postgres>, story: &Story) -> anyhow::Result<()> {
    sqlx::query(
        "WITH running AS (
             SELECT a.vault_key_id, a.at,
                    sum(a.amount_cents) OVER (PARTITION BY a.vault_key_id ORDER BY a.at, a.id) AS spent
             FROM audit_log a JOIN vault_keys k ON k.id = a.vault_key_id
             WHERE a.decision = 'allowed' AND a.upstream_status BETWEEN 200 AND 299
               AND k.label ~ '^(billing-run|eu-enterprise|usage-backfill)-'
         ), crossed AS (
             SELECT k.id, t, k.cap_cents, min(r.spent) AS used, min(r.at) AS raised_at,
                    k.billing_period <> $1 AS past
             FROM vault_keys k
             CROSS JOIN unnest(k.alert_thresholds_pct) AS t
             JOIN running r ON r.vault_key_id = k.id AND r.spent * 100 >= t::bigint * k.cap_cents
             GROUP BY k.id, t, k.cap_cents, k.billing_period
         ), lena AS (SELECT id FROM operators WHERE email = $2),
         raised AS (
             INSERT INTO alerts (vault_key_id, kind, threshold_pct, committed_cents, cap_cents,
                                 raised_at, last_occurred_at, acknowledged_at, acknowledged_by, ack_note)
             SELECT c.id, 'threshold', c.t, c.used, c.cap_cents, c.raised_at, c.raised_at,
                    CASE WHEN c.past THEN LEAST(c.raised_at + interval '40 minutes', $3) END,
                    CASE WHEN c.past THEN lena.id END,
                    CASE WHEN c.past THEN 'Expected: every customer billed, within the buffer.' END
             FROM crossed c, lena
             ON CONFLICT ON CONSTRAINT alerts_once DO NOTHING
             RETURNING id, acknowledged_at, acknowledged_by, ack_note
         )
         INSERT INTO operator_actions (at, operator_id, action, subject_type, subject_id, details, via)
         SELECT acknowledged_at, acknowledged_by, 'alert.acknowledge', 'alert', id::text,
                jsonb_build_object('note', ack_note), 'console'
         FROM raised WHERE acknowledged_at IS NOT NULL",
    )
    .bind(story.current.to_string())
    .bind(DEMO_OPERATOR)
    .bind(story.now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Cap increase requests from the billing job's token: one waiting for a
/// decision on the key near its cap (after the three charges it refused),
/// and one on the backfill key that the demo approver rejected, after
/// which the demo operator revoked the key. Each step is in the action
/// log. Skipped for keys that have requests.
async fn insert_cap_increases(
    tx: &mut Transaction<'_, Postgres>,
    story: &Story,
) -> anyhow::Result<()> {
    sqlx::query(
        "WITH token AS (SELECT min(id) AS id FROM api_tokens WHERE name = 'demo billing job'),
              omar AS (SELECT id FROM operators WHERE email = $3),
         asked AS (
             INSERT INTO cap_increase_requests (vault_key_id, from_cap_cents, to_cap_cents, apply_as, reason,
                 origin, requested_at, requested_by_token, expires_at, decision, decided_at, decided_by, decision_note)
             SELECT k.id, k.cap_cents, k.cap_cents + r.more, 'raise_cap', r.reason, 'api', r.asked,
                    token.id, LEAST(r.asked + interval '24 hours', k.expires_at),
                    CASE WHEN r.rejected THEN 'rejected' END,
                    CASE WHEN r.rejected THEN $5::timestamptz END,
                    CASE WHEN r.rejected THEN omar.id END,
                    CASE WHEN r.rejected THEN 'The backfill totals were wrong: re-plan it with a new key.' END
             FROM (VALUES
                 ('eu-enterprise-' || $1, 627000::bigint, false, $2::timestamptz,
                  'Three payment intents of 1,900.00 EUR were refused at the cap: new enterprise seats signed this week.'),
                 ('usage-backfill-' || $1, 150000, true, $4::timestamptz,
                  'The backfill found more usage than planned.')
             ) AS r(label, more, rejected, asked, reason)
             JOIN vault_keys k ON k.label = r.label, token, omar
             WHERE NOT EXISTS (SELECT 1 FROM cap_increase_requests c WHERE c.vault_key_id = k.id)
             RETURNING *
         ), requested AS (
             INSERT INTO operator_actions (at, api_token_id, action, subject_type, subject_id, details, via)
             SELECT requested_at, requested_by_token, 'cap_increase.request', 'vault_key', vault_key_id::text,
                    jsonb_build_object('request_id', id, 'from_cap_cents', from_cap_cents,
                        'to_cap_cents', to_cap_cents, 'apply_as', apply_as, 'reason', reason,
                        'origin', origin, 'expires_at', expires_at), 'api'
             FROM asked
         )
         INSERT INTO operator_actions (at, operator_id, action, subject_type, subject_id, details, via)
         SELECT decided_at, decided_by, 'cap_increase.reject', 'vault_key', vault_key_id::text,
                jsonb_build_object('request_id', id, 'from_cap_cents', from_cap_cents,
                    'to_cap_cents', to_cap_cents, 'apply_as', apply_as, 'note', decision_note), 'console'
         FROM asked WHERE decision = 'rejected'",
    )
    .bind(story.current.to_string())
    .bind(story.this_month(Story::ENTERPRISE_ASKED))
    .bind(DEMO_APPROVER)
    .bind(story.this_month(Story::BACKFILL_ASKED))
    .bind(story.this_month(Story::BACKFILL_REJECTED))
    .execute(&mut **tx)
    .await?;
    // The rejection led the demo operator to revoke the backfill key.
    sqlx::query(
        "WITH lena AS (SELECT id FROM operators WHERE email = $3),
         revoked AS (
             UPDATE vault_keys k SET revoked_at = $2, revoked_by = lena.id,
                    revoke_reason = 'Replaced: the backfill was re-planned with corrected totals'
             FROM lena
             WHERE k.label = 'usage-backfill-' || $1 AND k.revoked_at IS NULL
             RETURNING k.id, k.label, k.revoked_at, k.revoked_by, k.revoke_reason
         )
         INSERT INTO operator_actions (at, operator_id, action, subject_type, subject_id, details, via)
         SELECT revoked_at, revoked_by, 'revoke_vault_key', 'vault_key', id::text,
                jsonb_build_object('label', label, 'reason', revoke_reason), 'console'
         FROM revoked",
    )
    .bind(story.current.to_string())
    .bind(story.this_month(Story::BACKFILL_REVOKED))
    .bind(DEMO_OPERATOR)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
