//! The signed period report as CSV files, for the close pack: one file per
//! table (money, sign-off, findings, keys, cap increases), RFC 4180, UTF-8,
//! ISO-8601 UTC times, amounts in minor units beside their decimal, every
//! text cell neutralised like the audit export's. The calls themselves come
//! from the audit log (see `calls_filter`).

use chrono::{DateTime, Utc};

use crate::audit::csv::neutralise;
use crate::domain::{AuditFilter, Cents, Currency, PeriodClose, PeriodReport};

/// The pack's small files, in the order they go into it.
pub fn files(
    report: &PeriodReport,
    close: &PeriodClose,
) -> Result<Vec<(&'static str, Vec<u8>)>, csv::Error> {
    Ok(vec![
        ("sign_off.csv", sign_off(report, close)?),
        ("money.csv", money(report)?),
        ("findings.csv", findings(report)?),
        ("keys.csv", keys(report)?),
        ("cap_increases.csv", cap_increases(report)?),
    ])
}

/// The audit log's calls the report counts: the period's keys, up to the
/// report's time.
pub fn calls_filter(report: &PeriodReport) -> AuditFilter {
    AuditFilter {
        period: Some(report.period),
        to: Some(report.as_of),
        ..AuditFilter::default()
    }
}

fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

fn maybe_time(at: Option<DateTime<Utc>>) -> String {
    at.map(time).unwrap_or_default()
}

fn text(value: &str) -> String {
    neutralise(value)
}

fn maybe_text(value: &Option<String>) -> String {
    value.as_deref().map(neutralise).unwrap_or_default()
}

/// An amount as two cells: minor units, and the decimal in its currency.
fn amount(cents: Cents, currency: &Currency) -> [String; 2] {
    [cents.0.to_string(), cents.decimal(currency)]
}

fn write(
    header: &[&str],
    rows: impl IntoIterator<Item = Vec<String>>,
) -> Result<Vec<u8>, csv::Error> {
    let mut out = csv::Writer::from_writer(Vec::new());
    out.write_record(header)?;
    for row in rows {
        out.write_record(row)?;
    }
    out.into_inner().map_err(|err| err.into_error().into())
}

fn sign_off(report: &PeriodReport, close: &PeriodClose) -> Result<Vec<u8>, csv::Error> {
    write(
        &[
            "billing_period",
            "prepared_by",
            "prepared_at_utc",
            "note",
            "signed_by",
            "signed_at_utc",
            "report_sha256",
            "calls",
            "findings",
            "keys",
        ],
        [vec![
            report.period.to_string(),
            text(&close.prepared_by),
            time(close.prepared_at),
            maybe_text(&close.note),
            maybe_text(&close.signed_by),
            maybe_time(close.signed_at),
            close.report_sha256.clone().unwrap_or_default(),
            report.calls.to_string(),
            report.findings.len().to_string(),
            report.keys.len().to_string(),
        ]],
    )
}

fn money(report: &PeriodReport) -> Result<Vec<u8>, csv::Error> {
    write(
        &[
            "currency",
            "keys",
            "expected_minor_units",
            "expected",
            "capped_minor_units",
            "capped",
            "metered_minor_units",
            "metered",
            "charged_minor_units",
            "charged",
            "refunded_minor_units",
            "refunded",
            "net_minor_units",
            "net",
        ],
        report.money.iter().map(|m| {
            let c = &m.currency;
            let mut row = vec![c.to_string(), m.keys.to_string()];
            for cents in [
                m.expected,
                m.capped,
                m.metered,
                m.charged,
                m.refunded,
                m.net(),
            ] {
                row.extend(amount(cents, c));
            }
            row
        }),
    )
}

fn findings(report: &PeriodReport) -> Result<Vec<u8>, csv::Error> {
    write(
        &[
            "id",
            "kind",
            "customer_id",
            "currency",
            "at_risk_minor_units",
            "at_risk",
            "charge_ids",
            "detected_at_utc",
            "resolution",
            "resolved_at_utc",
            "resolved_by",
            "resolution_note",
        ],
        report.findings.iter().map(|f| {
            let [minor, decimal] = amount(f.at_risk, &f.currency);
            vec![
                f.id.to_string(),
                f.kind.as_str().to_owned(),
                text(&f.customer_id),
                f.currency.to_string(),
                minor,
                decimal,
                text(&f.charge_ids.join(" ")),
                time(f.detected_at),
                maybe_text(&f.resolution),
                maybe_time(f.resolved_at),
                maybe_text(&f.resolved_by),
                maybe_text(&f.resolution_note),
            ]
        }),
    )
}

fn keys(report: &PeriodReport) -> Result<Vec<u8>, csv::Error> {
    write(
        &[
            "id",
            "label",
            "key_prefix",
            "currency",
            "expected_minor_units",
            "expected",
            "cap_minor_units",
            "cap",
            "spent_minor_units",
            "spent",
            "created_at_utc",
            "expires_at_utc",
            "revoked_at_utc",
            "revoke_reason",
        ],
        report.keys.iter().map(|k| {
            let mut row = vec![
                k.id.to_string(),
                text(&k.label),
                text(&k.secret_prefix),
                k.currency.to_string(),
            ];
            for cents in [k.expected, k.cap, k.spent] {
                row.extend(amount(cents, &k.currency));
            }
            row.extend([
                time(k.created_at),
                time(k.expires_at),
                maybe_time(k.revoked_at),
                maybe_text(&k.revoke_reason),
            ]);
            row
        }),
    )
}

fn cap_increases(report: &PeriodReport) -> Result<Vec<u8>, csv::Error> {
    write(
        &[
            "id",
            "vault_key_id",
            "key_label",
            "currency",
            "from_cap_minor_units",
            "from_cap",
            "to_cap_minor_units",
            "to_cap",
            "reason",
            "requested_at_utc",
            "requested_by",
            "decision",
            "decided_at_utc",
            "decided_by",
        ],
        report.cap_increases.iter().map(|r| {
            let mut row = vec![
                r.id.to_string(),
                r.vault_key_id.to_string(),
                text(&r.key_label),
                r.currency.to_string(),
            ];
            row.extend(amount(r.from_cap, &r.currency));
            row.extend(amount(r.to_cap, &r.currency));
            row.extend([
                text(&r.reason),
                time(r.requested_at),
                text(&r.requested_by),
                maybe_text(&r.decision),
                maybe_time(r.decided_at),
                maybe_text(&r.decided_by),
            ]);
            row
        }),
    )
}
