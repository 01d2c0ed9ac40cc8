//! Reconciliation findings: detected from `stripe_charges` (as last synced)
//! and `billing_records`, one row per kind, period, customer and currency.
//!
//! Detection is idempotent: it upserts what it finds, so running it twice
//! creates no second finding. An open finding that is no longer found is
//! cleared; a resolved one is reopened only when the charges behind it
//! change (a third charge on a dismissed duplicate is news).

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};

use crate::domain::{
    BillingPeriod, Cents, Currency, EvidenceCall, EvidenceCharge, EvidenceRecord, Finding,
    FindingFilter, FindingId, FindingKind, FindingTotal, KeyChoice, OperatorId, VaultKeyId,
};

/// A live charge: Stripe took the money and has not given all of it back.
const LIVE: &str = "c.status = 'succeeded' AND c.amount_refunded_cents < c.amount_cents";

/// Every detection statement inserts these columns, in this order.
const INSERT: &str =
    "INSERT INTO reconciliation_findings AS f (kind, billing_period, customer_id, currency,
        charge_ids, keeper_charge_id, amount_at_risk_cents, explanation, last_detected_at)";

/// On a re-detected finding: refresh its figures; reopen it if it had
/// cleared or its charges changed.
const REFRESH: &str = "ON CONFLICT ON CONSTRAINT reconciliation_findings_once DO UPDATE SET
        charge_ids = EXCLUDED.charge_ids,
        keeper_charge_id = EXCLUDED.keeper_charge_id,
        amount_at_risk_cents = EXCLUDED.amount_at_risk_cents,
        explanation = EXCLUDED.explanation,
        last_detected_at = EXCLUDED.last_detected_at,
        resolution = CASE WHEN f.resolution = 'cleared' OR f.charge_ids <> EXCLUDED.charge_ids
                          THEN NULL ELSE f.resolution END,
        resolved_at = CASE WHEN f.resolution = 'cleared' OR f.charge_ids <> EXCLUDED.charge_ids
                           THEN NULL ELSE f.resolved_at END,
        resolved_by = CASE WHEN f.resolution = 'cleared' OR f.charge_ids <> EXCLUDED.charge_ids
                           THEN NULL ELSE f.resolved_by END,
        resolution_note = CASE WHEN f.resolution = 'cleared' OR f.charge_ids <> EXCLUDED.charge_ids
                               THEN NULL ELSE f.resolution_note END";

/// What one detection run found for a period.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Detected {
    pub orphaned: u64,
    pub duplicate: u64,
    pub missing: u64,
    pub unmetered: u64,
    /// Open findings no longer found, now cleared.
    pub cleared: u64,
}

/// Detects the period's orphaned, duplicate, missing and unmetered charges,
/// in the caller's transaction (so a run is all or nothing), and clears the
/// open findings no longer found. Run it only once a sync has stored the
/// period's charges: before that, every billing record would look missing.
#[tracing::instrument(skip_all)]
pub async fn detect(
    tx: &mut PgConnection,
    period: BillingPeriod,
    run_at: DateTime<Utc>,
) -> Result<Detected, sqlx::Error> {
    let mut detected = detect_live(tx, period, run_at, run_at).await?;
    detected.missing = missing(tx, period, run_at).await?;
    detected.cleared = sqlx::query(
        "UPDATE reconciliation_findings SET resolution = 'cleared', resolved_at = now()
         WHERE billing_period = $1 AND resolved_at IS NULL AND last_detected_at < $2",
    )
    .bind(period.to_string())
    .bind(run_at)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    Ok(detected)
}

/// What the charges stored so far show without a full sync (Stripe's
/// events): duplicates, unmetered charges, and orphans among the charges
/// made before `orphans_before` (the billing job writes its record after
/// Stripe answers). Finds and refreshes; clears nothing and finds nothing
/// missing, which only a sync that saw every charge can tell.
#[tracing::instrument(skip_all)]
pub async fn detect_live(
    tx: &mut PgConnection,
    period: BillingPeriod,
    run_at: DateTime<Utc>,
    orphans_before: DateTime<Utc>,
) -> Result<Detected, sqlx::Error> {
    let orphaned = orphaned(tx, period, run_at, orphans_before).await?;
    let duplicate = duplicate(tx, period, run_at).await?;
    let unmetered = unmetered(tx, period, run_at).await?;
    Ok(Detected {
        orphaned,
        duplicate,
        unmetered,
        ..Detected::default()
    })
}

/// Orphaned: live charges for a customer and period the ledger has no row
/// for (the job crashed after Stripe answered, before it wrote).
#[tracing::instrument(skip_all)]
async fn orphaned(
    tx: &mut PgConnection,
    period: BillingPeriod,
    run_at: DateTime<Utc>,
    made_before: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let period = period.to_string();
    sqlx::query(&format!(
        "{INSERT}
         SELECT 'orphaned', $1, c.customer_id, c.currency, array_agg(c.id ORDER BY c.created_at, c.id), NULL,
                sum(c.amount_cents - c.amount_refunded_cents),
                format('%s live charge(s) in Stripe for %s in %s, and no billing record for them',
                       count(*), c.customer_id, $1),
                $2
         FROM stripe_charges c
         WHERE c.billing_period = $1 AND c.customer_id IS NOT NULL AND {LIVE} AND c.created_at < $3
           AND NOT EXISTS (SELECT 1 FROM billing_records b
                           WHERE b.customer_id = c.customer_id AND b.billing_period = $1)
         GROUP BY c.customer_id, c.currency
         {REFRESH}"
    ))
    .bind(&period)
    .bind(run_at)
    .bind(made_before)
    .execute(&mut *tx)
    .await
    .map(|done| done.rows_affected())
}

/// Duplicate: two or more live charges for one customer and period. The
/// keeper is the charge the ledger names, else the earliest.
#[tracing::instrument(skip_all)]
async fn duplicate(
    tx: &mut PgConnection,
    period: BillingPeriod,
    run_at: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let period = period.to_string();
    sqlx::query(&format!(
        "WITH live AS (
             SELECT c.customer_id, c.currency,
                    array_agg(c.id ORDER BY c.created_at, c.id) AS ids,
                    array_agg(c.amount_cents - c.amount_refunded_cents ORDER BY c.created_at, c.id) AS left_cents
             FROM stripe_charges c
             WHERE c.billing_period = $1 AND c.customer_id IS NOT NULL AND {LIVE}
             GROUP BY c.customer_id, c.currency
             HAVING count(*) >= 2
         ), named AS (
             SELECT l.*, (SELECT b.charge_id FROM billing_records b
                          WHERE b.customer_id = l.customer_id AND b.billing_period = $1
                            AND b.charge_id = ANY (l.ids)) AS named_id
             FROM live l
         )
         {INSERT}
         SELECT 'duplicate', $1, n.customer_id, n.currency, n.ids, COALESCE(n.named_id, n.ids[1]),
                (SELECT sum(x.amount) FROM unnest(n.ids, n.left_cents) AS x(id, amount)
                 WHERE x.id <> COALESCE(n.named_id, n.ids[1])),
                format('%s live charges for %s in %s; %s is kept, %s', cardinality(n.ids), n.customer_id, $1,
                       COALESCE(n.named_id, n.ids[1]),
                       CASE WHEN n.named_id IS NULL THEN 'the earliest' ELSE 'as the billing record names it' END),
                $2
         FROM named n
         {REFRESH}"
    ))
    .bind(&period)
    .bind(run_at)
    .execute(&mut *tx)
    .await
    .map(|done| done.rows_affected())
}

/// Missing: the ledger says charged, with a charge id Stripe does not have.
#[tracing::instrument(skip_all)]
async fn missing(
    tx: &mut PgConnection,
    period: BillingPeriod,
    run_at: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let period = period.to_string();
    sqlx::query(&format!(
        "{INSERT}
         SELECT 'missing', $1, b.customer_id, b.currency, ARRAY[b.charge_id], NULL, b.amount_cents,
                format('The billing record of %s in %s says charged with %s, which Stripe does not have',
                       b.customer_id, $1, b.charge_id),
                $2
         FROM billing_records b
         WHERE b.billing_period = $1 AND b.status = 'charged' AND b.charge_id IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM stripe_charges c WHERE c.id = b.charge_id)
         {REFRESH}"
    ))
    .bind(&period)
    .bind(run_at)
    .execute(&mut *tx)
    .await
    .map(|done| done.rows_affected())
}

/// Unmetered: succeeded charges in the period (by the billing job's
/// metadata, else the month Stripe made them in), made since Vaultcap
/// issued its first vault key, that no vault key's call made: no
/// reservation names the charge or its payment intent, and no call still in
/// flight or of unknown outcome could turn out to be it. Someone used the
/// real Stripe key directly. Grouped by customer (the job's id, else
/// Stripe's) and currency.
#[tracing::instrument(skip_all)]
async fn unmetered(
    tx: &mut PgConnection,
    period: BillingPeriod,
    run_at: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    sqlx::query(&format!(
        "{INSERT}
         SELECT 'unmetered', $1, u.customer, u.currency, array_agg(u.id ORDER BY u.created_at, u.id), NULL,
                sum(u.amount_cents - u.amount_refunded_cents),
                format('%s charge(s) in Stripe for %s in %s that no vault key''s call made (%s): '
                       'the real Stripe key was used directly',
                       count(*), u.customer, $1, string_agg(u.id, ', ' ORDER BY u.created_at, u.id)),
                $2
         FROM (SELECT c.*, COALESCE(c.customer_id, c.stripe_customer, 'no customer') AS customer
               FROM stripe_charges c
               WHERE (c.billing_period = $1
                      OR (c.billing_period IS NULL AND c.created_at >= $3 AND c.created_at < $4))
                 AND c.status = 'succeeded'
                 -- (Stripe's times are whole seconds, and clocks differ.)
                 AND c.created_at >= (SELECT min(k.created_at) - interval '1 minute' FROM vault_keys k)
                 AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.stripe_charge_id = c.id)
                 AND NOT EXISTS (SELECT 1 FROM reservations r
                                 WHERE c.payment_intent IS NOT NULL AND r.stripe_charge_id = c.payment_intent)
                 AND NOT EXISTS (SELECT 1 FROM reservations r
                                 WHERE r.state IN ('pending', 'outcome_unknown') AND r.stripe_charge_id IS NULL
                                   AND r.amount_cents = c.amount_cents AND lower(r.currency) = c.currency
                                   AND r.metadata_customer_id IS NOT DISTINCT FROM c.customer_id)) u
         GROUP BY u.customer, u.currency
         {REFRESH}"
    ))
    .bind(period.to_string())
    .bind(run_at)
    .bind(period.starts_at())
    .bind(period.ends_at())
    .execute(&mut *tx)
    .await
    .map(|done| done.rows_affected())
}

const SELECT: &str = "SELECT f.id, f.kind, f.billing_period, f.customer_id, f.currency, f.charge_ids,
        f.keeper_charge_id, f.amount_at_risk_cents, f.explanation, f.detected_at, f.resolution,
        f.resolved_at, COALESCE(o.email, CASE WHEN f.resolution = 'cleared' THEN 'detection' END) AS resolved_by,
        f.resolution_note, k.label AS attributed_to
     FROM reconciliation_findings f LEFT JOIN operators o ON o.id = f.resolved_by
          LEFT JOIN vault_keys k ON k.id = f.attributed_key_id";

/// The findings a filter selects, the largest risk first (open ones before
/// resolved ones).
#[tracing::instrument(skip_all)]
pub async fn list(
    db: impl PgExecutor<'_>,
    filter: &FindingFilter,
    limit: i64,
) -> Result<Vec<Finding>, sqlx::Error> {
    sqlx::query_as(&format!(
        "{SELECT} WHERE {MATCHES}
         ORDER BY f.resolved_at IS NULL DESC, f.amount_at_risk_cents DESC, f.id LIMIT $5"
    ))
    .bind(filter.period.to_string())
    .bind(filter.kind.map(FindingKind::as_str))
    .bind(filter.open)
    .bind(&filter.customer)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// How many findings a filter selects.
#[tracing::instrument(skip_all)]
pub async fn count(db: impl PgExecutor<'_>, filter: &FindingFilter) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM reconciliation_findings f WHERE {MATCHES}"
    ))
    .bind(filter.period.to_string())
    .bind(filter.kind.map(FindingKind::as_str))
    .bind(filter.open)
    .bind(&filter.customer)
    .fetch_one(db)
    .await
}

/// A [`FindingFilter`] as SQL over `f`, bound as $1 period, $2 kind, $3
/// open, $4 customer prefix.
const MATCHES: &str = "f.billing_period = $1 AND ($2::text IS NULL OR f.kind = $2)
    AND ($3::boolean IS NULL OR (f.resolved_at IS NULL) = $3)
    AND ($4::text IS NULL OR starts_with(f.customer_id, $4))";

/// Open findings and money at risk per kind and currency.
#[tracing::instrument(skip_all)]
pub async fn totals(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
) -> Result<Vec<FindingTotal>, sqlx::Error> {
    sqlx::query_as(
        "SELECT kind, currency, count(*) AS open, sum(amount_at_risk_cents)::bigint AS at_risk
         FROM reconciliation_findings WHERE billing_period = $1 AND resolved_at IS NULL
         GROUP BY kind, currency ORDER BY kind, currency",
    )
    .bind(period)
    .fetch_all(db)
    .await
}

/// Periods with synced charges, findings or billing records, newest first.
#[tracing::instrument(skip_all)]
pub async fn periods(db: impl PgExecutor<'_>) -> Result<Vec<BillingPeriod>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT billing_period FROM stripe_syncs UNION SELECT billing_period FROM billing_records
         ORDER BY 1 DESC LIMIT 36",
    )
    .fetch_all(db)
    .await
}

/// The finding, locked for the rest of the transaction: two people
/// resolving it at once are served one after the other.
#[tracing::instrument(skip_all)]
pub async fn lock(tx: &mut PgConnection, id: FindingId) -> Result<Option<Finding>, sqlx::Error> {
    let exists = sqlx::query("SELECT 1 FROM reconciliation_findings WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .is_some();
    if !exists {
        return Ok(None);
    }
    sqlx::query_as(&format!("{SELECT} WHERE f.id = $1"))
        .bind(id)
        .fetch_optional(tx)
        .await
}

/// Marks an open finding resolved; false if it was resolved already.
#[tracing::instrument(skip_all)]
pub async fn resolve(
    tx: &mut PgConnection,
    id: FindingId,
    resolution: &str,
    by: OperatorId,
    note: Option<&str>,
) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query(
        "UPDATE reconciliation_findings SET resolution = $2, resolved_at = now(), resolved_by = $3,
                resolution_note = $4
         WHERE id = $1 AND resolved_at IS NULL",
    )
    .bind(id)
    .bind(resolution)
    .bind(by)
    .bind(note)
    .execute(tx)
    .await?
    .rows_affected()
        == 1)
}

/// Writes the billing record an orphaned charge lacks, as the billing job
/// would have (`ON CONFLICT DO NOTHING`): the next redelivery's pre-flight
/// check then skips the customer. Returns whether a row was written.
#[tracing::instrument(skip_all)]
pub async fn adopt_charge(
    tx: &mut PgConnection,
    period: BillingPeriod,
    customer_id: &str,
    charge_id: &str,
) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query(
        "INSERT INTO billing_records (customer_id, billing_period, stripe_customer_id, charge_id,
             amount_cents, currency, status)
         SELECT $2, $1, c.stripe_customer, c.id, c.amount_cents, c.currency, 'charged'
         FROM stripe_charges c WHERE c.id = $3
         ON CONFLICT ON CONSTRAINT billing_records_customer_period_key DO NOTHING",
    )
    .bind(period)
    .bind(customer_id)
    .bind(charge_id)
    .execute(tx)
    .await?
    .rows_affected()
        == 1)
}

/// One finding, resolved or not.
#[tracing::instrument(skip_all)]
pub async fn find(db: impl PgExecutor<'_>, id: FindingId) -> Result<Option<Finding>, sqlx::Error> {
    sqlx::query_as(&format!("{SELECT} WHERE f.id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await
}

#[derive(sqlx::FromRow)]
struct ChargeRow {
    id: String,
    synced: bool,
    created_at: Option<DateTime<Utc>>,
    amount_cents: Option<Cents>,
    amount_refunded_cents: Option<Cents>,
    currency: Option<Currency>,
    status: Option<String>,
    payment_intent: Option<String>,
    stripe_customer: Option<String>,
    customer_id: Option<String>,
    metadata_billing_period: Option<String>,
    idempotency_key: Option<String>,
    key_prefix: Option<String>,
}

/// The finding's charges and the customer's other charges in the period,
/// oldest first, each with the proxy call that made it (by object id).
#[tracing::instrument(skip_all)]
pub async fn evidence_charges(
    db: impl PgExecutor<'_>,
    finding: &Finding,
) -> Result<Vec<EvidenceCharge>, sqlx::Error> {
    let rows: Vec<ChargeRow> = sqlx::query_as(
        "WITH ids AS (
             SELECT id FROM unnest($1::text[]) AS id
             UNION SELECT id FROM stripe_charges WHERE billing_period = $2 AND customer_id = $3
         )
         SELECT ids.id, c.id IS NOT NULL AS synced, c.created_at, c.amount_cents, c.amount_refunded_cents,
                c.currency, c.status, c.payment_intent, c.stripe_customer, c.customer_id,
                c.billing_period AS metadata_billing_period,
                a.idempotency_key, a.key_prefix
         FROM ids
         LEFT JOIN stripe_charges c ON c.id = ids.id
         LEFT JOIN LATERAL (SELECT idempotency_key, key_prefix FROM audit_log
                            WHERE stripe_object_id IN (ids.id, c.payment_intent)
                              AND decision IN ('allowed', 'replay')
                            ORDER BY id LIMIT 1) a ON true
         ORDER BY c.created_at NULLS LAST, ids.id
         LIMIT 50",
    )
    .bind(&finding.charge_ids)
    .bind(finding.billing_period)
    .bind(&finding.customer_id)
    .fetch_all(db)
    .await?;
    let fallback = finding.currency.clone();
    Ok(rows
        .into_iter()
        .map(|row| EvidenceCharge {
            in_finding: finding.charge_ids.contains(&row.id),
            keeper: finding.keeper_charge_id.as_deref() == Some(row.id.as_str()),
            synced: row.synced,
            created_at: row.created_at,
            // A charge the last sync did not see has no amount or currency
            // from Stripe; the page says it was not synced.
            amount: row.amount_cents.unwrap_or_default(),
            refunded: row.amount_refunded_cents.unwrap_or_default(),
            currency: row.currency.unwrap_or_else(|| fallback.clone()),
            status: row.status,
            payment_intent: row.payment_intent,
            stripe_customer: row.stripe_customer,
            metadata_customer_id: row.customer_id,
            metadata_billing_period: row.metadata_billing_period,
            idempotency_key: row.idempotency_key,
            key_prefix: row.key_prefix,
            id: row.id,
        })
        .collect())
}

/// The billing record of the finding's customer and period, if any.
#[tracing::instrument(skip_all)]
pub async fn evidence_record(
    db: impl PgExecutor<'_>,
    finding: &Finding,
) -> Result<Option<EvidenceRecord>, sqlx::Error> {
    sqlx::query_as(
        "SELECT charge_id, amount_cents, currency, status, stripe_customer_id, created_at
         FROM billing_records WHERE customer_id = $1 AND billing_period = $2",
    )
    .bind(&finding.customer_id)
    .bind(finding.billing_period)
    .fetch_optional(db)
    .await
}

/// The proxy calls for the finding's customer and period, or that made one
/// of its charges, oldest first.
#[tracing::instrument(skip_all)]
pub async fn evidence_calls(
    db: impl PgExecutor<'_>,
    finding: &Finding,
) -> Result<Vec<EvidenceCall>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, at, key_prefix, method, path, idempotency_key, amount_cents, decision, upstream_status,
                stripe_object_id, message
         FROM (SELECT * FROM audit_log WHERE metadata_customer_id = $1 AND billing_period = $2
               UNION SELECT * FROM audit_log WHERE stripe_object_id = ANY ($3)) calls
         ORDER BY at, id LIMIT 100",
    )
    .bind(&finding.customer_id)
    .bind(finding.billing_period)
    .bind(&finding.charge_ids)
    .fetch_all(db)
    .await
}

/// Attributes an open unmetered finding to the vault key `key`, with the
/// reason; false if it is no longer open.
#[tracing::instrument(skip_all)]
pub async fn attribute(
    tx: &mut PgConnection,
    id: FindingId,
    key: VaultKeyId,
    by: OperatorId,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query(
        "UPDATE reconciliation_findings SET resolution = 'attributed', attributed_key_id = $2,
                resolved_at = now(), resolved_by = $3, resolution_note = $4
         WHERE id = $1 AND resolved_at IS NULL AND kind = 'unmetered'",
    )
    .bind(id)
    .bind(key)
    .bind(by)
    .bind(reason)
    .execute(tx)
    .await?
    .rows_affected()
        == 1)
}

/// The vault keys an unmetered finding may be attributed to: its period's
/// and currency's, newest first (none for the other kinds).
#[tracing::instrument(skip_all)]
pub async fn attributable_keys(
    db: impl PgExecutor<'_>,
    finding: &Finding,
) -> Result<Vec<KeyChoice>, sqlx::Error> {
    if finding.kind != FindingKind::Unmetered {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        "SELECT id, label, secret_prefix FROM vault_keys
         WHERE billing_period = $1 AND currency = $2 ORDER BY id DESC LIMIT 200",
    )
    .bind(finding.billing_period)
    .bind(&finding.currency)
    .fetch_all(db)
    .await
}
