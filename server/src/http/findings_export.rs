//! `/reconciliation.csv`: the findings on the Reconciliation page, with the
//! same filters, as CSV (the `csv` crate; text a spreadsheet would run as a
//! formula is neutralised as in the audit export). Recorded in the action
//! log. A period has thousands of findings at most, so the file is built in
//! memory.

use axum::{
    extract::{Query, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
};
use serde::Deserialize;

use super::error::HttpError;
use super::guard::Operator;
use app::{
    actions::sql as actions, audit::csv::neutralise, domain::FindingFilter, error::AppError,
    reconciliation::findings, ssr::AppState,
};

/// The most findings one file holds.
const MAX_ROWS: i64 = 100_000;

pub const HEADER: [&str; 15] = [
    "id",
    "kind",
    "billing_period",
    "customer_id",
    "charge_ids",
    "keeper_charge_id",
    "amount_at_risk_minor_units",
    "amount_at_risk",
    "currency",
    "explanation",
    "detected_at_utc",
    "resolution",
    "resolved_at_utc",
    "resolved_by",
    "resolution_note",
];

#[derive(Debug, Deserialize)]
pub struct ExportQuery {
    period: Option<String>,
    kind: Option<String>,
    state: Option<String>,
    customer: Option<String>,
}

pub async fn export(
    State(state): State<AppState>,
    Operator { actor, .. }: Operator,
    Query(query): Query<ExportQuery>,
) -> Response {
    let outcome = async {
        let filter = FindingFilter::parse(
            query.period.as_deref(),
            query.kind.as_deref(),
            query.state.as_deref(),
            query.customer.as_deref(),
            chrono::Utc::now(),
        )?;
        let period = filter.period.to_string();
        let rows = findings::list(&state.reads.pool, &filter, MAX_ROWS).await?;
        let mut csv = csv::Writer::from_writer(Vec::new());
        let time =
            |at: chrono::DateTime<chrono::Utc>| at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
        let write = |csv: &mut csv::Writer<Vec<u8>>, record: &[String]| {
            csv.write_record(record).map_err(|err| {
                tracing::error!(error = %err, "writing the findings CSV");
                AppError::Internal
            })
        };
        write(&mut csv, &HEADER.map(String::from))?;
        for f in &rows {
            write(
                &mut csv,
                &[
                    f.id.to_string(),
                    f.kind.as_str().to_owned(),
                    f.billing_period.to_string(),
                    neutralise(&f.customer_id),
                    neutralise(&f.charge_ids.join(" ")),
                    neutralise(f.keeper_charge_id.as_deref().unwrap_or_default()),
                    f.at_risk.0.to_string(),
                    f.at_risk.decimal(&f.currency),
                    f.currency.as_str().to_owned(),
                    neutralise(&f.explanation),
                    time(f.detected_at),
                    f.resolution.clone().unwrap_or_default(),
                    f.resolved_at.map(time).unwrap_or_default(),
                    neutralise(f.resolved_by.as_deref().unwrap_or_default()),
                    neutralise(f.resolution_note.as_deref().unwrap_or_default()),
                ],
            )?;
        }
        let body = csv.into_inner().map_err(|_| AppError::Internal)?;
        actions::record(
            &state.pool,
            actor,
            "export_findings_csv",
            "billing_period",
            Some(period.clone()),
            serde_json::json!({ "kind": filter.kind.map(|k| k.as_str()), "state": filter.state(),
                                "rows": rows.len() }),
        )
        .await?;
        let filename = format!("vaultcap-findings-{period}-{}.csv", filter.state());
        Ok::<_, AppError>((filename, body))
    }
    .await;
    match outcome {
        Ok((filename, body)) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
                (
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{filename}\""),
                ),
                (header::CACHE_CONTROL, "no-store".to_owned()),
            ],
            body,
        )
            .into_response(),
        Err(err) => HttpError::from(err).into_response(),
    }
}
