//! Reading vault keys for the console. (Issuing keys and moving money under
//! them belongs to the key API and the proxy.)

use sqlx::{PgExecutor, Row};

use crate::domain::{BillingPeriod, Cents, Currency, KeySummary, ParseError, PeriodTotals};

/// Reads a text column through a domain parser.
fn parsed<T>(
    row: &sqlx::postgres::PgRow,
    column: &str,
    parse: impl FnOnce(&str) -> Result<T, ParseError>,
) -> Result<T, sqlx::Error> {
    parse(row.try_get(column)?).map_err(|err| sqlx::Error::ColumnDecode {
        index: column.into(),
        source: Box::new(err),
    })
}

fn summary_from_row(row: sqlx::postgres::PgRow) -> Result<KeySummary, sqlx::Error> {
    Ok(KeySummary {
        id: row.try_get("id")?,
        label: row.try_get("label")?,
        secret_prefix: row.try_get("secret_prefix")?,
        billing_period: row.try_get("billing_period")?,
        currency: parsed(&row, "currency", Currency::parse)?,
        expected_total: Cents(row.try_get("expected_total_cents")?),
        cap: Cents(row.try_get("cap_cents")?),
        spent: Cents(row.try_get("spent_cents")?),
        reserved: Cents(row.try_get("reserved_cents")?),
        status: parsed(&row, "status", str::parse)?,
        expires_at: row.try_get("expires_at")?,
    })
}

/// Keys, newest period first, at most `limit`.
pub async fn list(db: impl PgExecutor<'_>, limit: i64) -> Result<Vec<KeySummary>, sqlx::Error> {
    sqlx::query(
        "SELECT id, label, secret_prefix, billing_period, currency, expected_total_cents,
                cap_cents, spent_cents, reserved_cents, expires_at,
                CASE WHEN revoked_at IS NOT NULL THEN 'revoked'
                     WHEN expires_at <= now() THEN 'expired'
                     ELSE 'active' END AS status
         FROM vault_keys
         ORDER BY billing_period DESC, created_at DESC, id DESC
         LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await?
    .into_iter()
    .map(summary_from_row)
    .collect()
}

/// Totals of a period's keys, one row per currency.
pub async fn period_totals(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
) -> Result<Vec<PeriodTotals>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT currency, count(*) AS keys,
                count(*) FILTER (WHERE revoked_at IS NULL AND expires_at > now()) AS active_keys,
                sum(expected_total_cents)::bigint AS expected, sum(cap_cents)::bigint AS cap,
                sum(spent_cents)::bigint AS spent, sum(reserved_cents)::bigint AS reserved
         FROM vault_keys WHERE billing_period = $1
         GROUP BY currency ORDER BY currency",
    )
    .bind(period.to_string())
    .fetch_all(db)
    .await?;
    rows.into_iter()
        .map(|row| {
            Ok(PeriodTotals {
                currency: parsed(&row, "currency", Currency::parse)?,
                keys: row.try_get("keys")?,
                active_keys: row.try_get("active_keys")?,
                expected_total: Cents(row.try_get("expected")?),
                cap: Cents(row.try_get("cap")?),
                spent: Cents(row.try_get("spent")?),
                reserved: Cents(row.try_get("reserved")?),
            })
        })
        .collect()
}
