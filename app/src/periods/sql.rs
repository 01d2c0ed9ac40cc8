//! Period closes and the figures of a period's report. The table's
//! triggers hold the rules (see the period_closes migration); this module
//! reads and writes rows.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};

use crate::domain::{
    BillingPeriod, OperatorId, PeriodClose, PeriodMoney, PeriodReport, PeriodState, PeriodStatus,
    ReportCapIncrease, ReportFinding, ReportKey,
};
use crate::reconciliation::stripe_charges;

/// A close as the console shows it; `c` is period_closes.
const SELECT: &str = "SELECT c.id, c.billing_period, c.prepared_at, p.email AS prepared_by,
        c.prepared_by AS prepared_by_id, c.note, c.signed_at, s.email AS signed_by, c.report_sha256
     FROM period_closes c
     JOIN operators p ON p.id = c.prepared_by
     LEFT JOIN operators s ON s.id = c.signed_by";

/// The period's live close (not withdrawn).
const SELECT_LIVE: &str = "WHERE c.billing_period = $1 AND c.withdrawn_at IS NULL";

/// One close by id, withdrawn or not (the notifier's subject).
#[tracing::instrument(skip_all)]
pub async fn find(db: impl PgExecutor<'_>, id: i64) -> Result<Option<PeriodClose>, sqlx::Error> {
    sqlx::query_as(&format!("{SELECT} WHERE c.id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await
}

/// The period's live close (prepared or signed), if any.
#[tracing::instrument(skip_all)]
pub async fn live(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
) -> Result<Option<PeriodClose>, sqlx::Error> {
    sqlx::query_as(&format!("{SELECT} {SELECT_LIVE}"))
        .bind(period)
        .fetch_optional(db)
        .await
}

/// Like [`live`], holding the row until the transaction ends: two
/// sign-offs (or a sign-off and a withdrawal) at once are one after the other.
#[tracing::instrument(skip_all)]
pub async fn lock_live(
    tx: &mut PgConnection,
    period: BillingPeriod,
) -> Result<Option<PeriodClose>, sqlx::Error> {
    sqlx::query_as(&format!("{SELECT} {SELECT_LIVE} FOR UPDATE OF c"))
        .bind(period)
        .fetch_optional(tx)
        .await
}

/// How many findings of the period are open now.
#[tracing::instrument(skip_all)]
pub async fn open_findings(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM reconciliation_findings WHERE billing_period = $1 AND resolved_at IS NULL",
    )
    .bind(period)
    .fetch_one(db)
    .await
}

/// Locks the period's keys (in id order, as every other locker of several
/// keys): no call is reserved on them until the transaction ends.
#[tracing::instrument(skip_all)]
pub async fn lock_keys(tx: &mut PgConnection, period: BillingPeriod) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT id FROM vault_keys WHERE billing_period = $1 ORDER BY id FOR UPDATE")
        .bind(period)
        .execute(tx)
        .await
        .map(drop)
}

/// The report as it was signed: its exact bytes and the stored hash.
#[tracing::instrument(skip_all)]
pub async fn signed_report(
    db: impl PgExecutor<'_>,
    id: i64,
) -> Result<Option<(String, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT report, report_sha256 FROM period_closes WHERE id = $1 AND signed_at IS NOT NULL",
    )
    .bind(id)
    .fetch_optional(db)
    .await
}

/// Prepares the close; `None` when the period already has a live close.
#[tracing::instrument(skip_all)]
pub async fn prepare(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
    by: OperatorId,
    note: Option<&str>,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO period_closes (billing_period, prepared_by, note) VALUES ($1, $2, $3)
         ON CONFLICT (billing_period) WHERE withdrawn_at IS NULL DO NOTHING RETURNING id",
    )
    .bind(period)
    .bind(by)
    .bind(note)
    .fetch_optional(db)
    .await
}

/// Withdraws a prepared close (the period is open again).
#[tracing::instrument(skip_all)]
pub async fn withdraw(tx: &mut PgConnection, id: i64, by: OperatorId) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE period_closes SET withdrawn_at = now(), withdrawn_by = $2 WHERE id = $1")
        .bind(id)
        .bind(by)
        .execute(tx)
        .await
        .map(drop)
}

/// Signs the close off with the report's bytes and hash. The table's
/// triggers refuse it (open findings, undecided calls, the preparer) and
/// revoke the period's live keys.
#[tracing::instrument(skip_all)]
pub async fn sign(
    tx: &mut PgConnection,
    id: i64,
    by: OperatorId,
    at: DateTime<Utc>,
    report: &str,
    sha256: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE period_closes SET signed_at = $2, signed_by = $3, report = $4, report_sha256 = $5
         WHERE id = $1",
    )
    .bind(id)
    .bind(at)
    .bind(by)
    .bind(report)
    .bind(sha256)
    .execute(tx)
    .await
    .map(drop)
}

/// The period's report as of `as_of`, read in one transaction's snapshot.
#[tracing::instrument(skip_all)]
pub async fn report(
    tx: &mut PgConnection,
    period: BillingPeriod,
    as_of: DateTime<Utc>,
) -> Result<PeriodReport, sqlx::Error> {
    Ok(PeriodReport {
        period,
        as_of,
        money: money(&mut *tx, period).await?,
        findings: findings(&mut *tx, period).await?,
        keys: keys(&mut *tx, period).await?,
        cap_increases: cap_increases(&mut *tx, period).await?,
        calls: sqlx::query_scalar(
            // Before `as_of`, as the pack's calls.csv (the audit export's `to`).
            "SELECT count(*) FROM audit_log WHERE billing_period = $1 AND at < $2",
        )
        .bind(period)
        .bind(as_of)
        .fetch_one(&mut *tx)
        .await?,
        undecided_calls: sqlx::query_scalar(
            "SELECT count(*) FROM reservations r JOIN vault_keys k ON k.id = r.vault_key_id
             WHERE k.billing_period = $1 AND r.state IN ('pending', 'outcome_unknown')",
        )
        .bind(period)
        .fetch_one(&mut *tx)
        .await?,
        synced_at: stripe_charges::last_finished(&mut *tx, period)
            .await?
            .map(|sync| sync.started_at),
    })
}

/// Per currency: the keys' expected totals, caps and settled spend beside
/// Stripe's succeeded charges and refunds for the period (by the charge's
/// `metadata[billing_period]`, else the month it was made in).
#[tracing::instrument(skip_all)]
async fn money(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
) -> Result<Vec<PeriodMoney>, sqlx::Error> {
    sqlx::query_as(
        "WITH keys AS (
             SELECT currency, count(*) AS keys, sum(expected_total_cents) AS expected,
                    sum(cap_cents) AS capped, sum(spent_cents) AS metered
             FROM vault_keys WHERE billing_period = $1 GROUP BY currency),
         stripe AS (
             SELECT currency, sum(amount_cents) AS charged, sum(amount_refunded_cents) AS refunded
             FROM stripe_charges
             WHERE status = 'succeeded'
               AND COALESCE(billing_period, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM')) = $1
             GROUP BY currency)
         SELECT COALESCE(k.currency, s.currency) AS currency, COALESCE(k.keys, 0) AS keys,
                COALESCE(k.expected, 0)::bigint AS expected, COALESCE(k.capped, 0)::bigint AS capped,
                COALESCE(k.metered, 0)::bigint AS metered, COALESCE(s.charged, 0)::bigint AS charged,
                COALESCE(s.refunded, 0)::bigint AS refunded
         FROM keys k FULL JOIN stripe s ON s.currency = k.currency
         ORDER BY 1",
    )
    .bind(period)
    .fetch_all(db)
    .await
}

#[tracing::instrument(skip_all)]
async fn findings(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
) -> Result<Vec<ReportFinding>, sqlx::Error> {
    sqlx::query_as(
        "SELECT f.id, f.kind, f.customer_id, f.currency, f.amount_at_risk_cents AS at_risk,
                f.charge_ids, f.detected_at, f.resolution, f.resolved_at,
                o.email AS resolved_by, f.resolution_note
         FROM reconciliation_findings f LEFT JOIN operators o ON o.id = f.resolved_by
         WHERE f.billing_period = $1 ORDER BY f.id",
    )
    .bind(period)
    .fetch_all(db)
    .await
}

#[tracing::instrument(skip_all)]
async fn keys(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
) -> Result<Vec<ReportKey>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, label, secret_prefix, currency, expected_total_cents AS expected,
                cap_cents AS cap, spent_cents AS spent, created_at, expires_at, revoked_at, revoke_reason
         FROM vault_keys WHERE billing_period = $1 ORDER BY id",
    )
    .bind(period)
    .fetch_all(db)
    .await
}

#[tracing::instrument(skip_all)]
async fn cap_increases(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
) -> Result<Vec<ReportCapIncrease>, sqlx::Error> {
    sqlx::query_as(
        "SELECT r.id, r.vault_key_id, k.label AS key_label, k.currency,
                r.from_cap_cents AS from_cap, r.to_cap_cents AS to_cap, r.reason, r.requested_at,
                COALESCE(o.email, 'API token ' || t.name) AS requested_by,
                r.decision, r.decided_at, d.email AS decided_by
         FROM cap_increase_requests r
         JOIN vault_keys k ON k.id = r.vault_key_id
         LEFT JOIN operators o ON o.id = r.requested_by
         LEFT JOIN api_tokens t ON t.id = r.requested_by_token
         LEFT JOIN operators d ON d.id = r.decided_by
         WHERE k.billing_period = $1 ORDER BY r.id",
    )
    .bind(period)
    .fetch_all(db)
    .await
}

/// The latest `limit` periods that have keys or a close, newest first,
/// with where each stands.
#[tracing::instrument(skip_all)]
pub async fn statuses(
    db: impl PgExecutor<'_>,
    limit: i64,
) -> Result<Vec<PeriodStatus>, sqlx::Error> {
    let rows: Vec<(BillingPeriod, bool, bool, i64, i64)> = sqlx::query_as(
        "SELECT p.period, c.signed_at IS NOT NULL, c.id IS NOT NULL,
                (SELECT count(*) FROM vault_keys k WHERE k.billing_period = p.period),
                (SELECT count(*) FROM reconciliation_findings f
                 WHERE f.billing_period = p.period AND f.resolved_at IS NULL)
         FROM (SELECT billing_period AS period FROM vault_keys
               UNION SELECT billing_period FROM period_closes) p
         LEFT JOIN period_closes c ON c.billing_period = p.period AND c.withdrawn_at IS NULL
         ORDER BY p.period DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(period, signed, prepared, keys, open_findings)| PeriodStatus {
                period,
                state: match (signed, prepared) {
                    (true, _) => PeriodState::SignedOff,
                    (false, true) => PeriodState::Closing,
                    (false, false) => PeriodState::Open,
                },
                keys,
                open_findings,
            },
        )
        .collect())
}
