//! The billing jobs' ledger, read for the console.

use sqlx::PgExecutor;

use crate::domain::{BillingPeriod, Cents, Currency};

/// How many customers the ledger records as charged in a period, and their
/// total per currency.
#[tracing::instrument(skip_all)]
pub async fn charged_in_period(
    db: impl PgExecutor<'_>,
    period: BillingPeriod,
) -> Result<(i64, Vec<(Currency, Cents)>), sqlx::Error> {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT currency, count(*), sum(amount_cents)::bigint
         FROM billing_records WHERE billing_period = $1 AND status = 'charged'
         GROUP BY currency ORDER BY currency",
    )
    .bind(period.to_string())
    .fetch_all(db)
    .await?;
    let count = rows.iter().map(|(_, n, _)| n).sum();
    let totals = rows
        .into_iter()
        .filter_map(|(currency, _, sum)| Some((Currency::parse(&currency).ok()?, Cents(sum))))
        .collect();
    Ok((count, totals))
}

/// What a period billed, per currency, largest first: (currency, customers,
/// total cents).
#[tracing::instrument(skip_all)]
pub async fn period_totals(
    db: impl sqlx::PgExecutor<'_>,
    period: crate::domain::BillingPeriod,
) -> Result<Vec<(String, i64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT currency, count(*), sum(amount_cents)::bigint FROM billing_records
         WHERE billing_period = $1 GROUP BY currency ORDER BY sum(amount_cents) DESC",
    )
    .bind(period.to_string())
    .fetch_all(db)
    .await
}
