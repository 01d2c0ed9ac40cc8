//! The audit log's CSV rows: RFC 4180 (written by the `csv` crate), UTF-8,
//! ISO-8601 UTC times, amounts as integer minor units plus a decimal column,
//! and every text cell that a spreadsheet would run as a formula neutralised.

use std::fmt::Write;

use csv::ByteRecord;

use crate::domain::AuditCall;

pub const HEADER: [&str; 19] = [
    "id",
    "at_utc",
    "vault_key_id",
    "vault_key_label",
    "key_prefix",
    "method",
    "path",
    "stripe_customer",
    "customer_id",
    "billing_period",
    "amount_minor_units",
    "amount",
    "currency",
    "idempotency_key",
    "decision",
    "stripe_status",
    "stripe_object_id",
    "error_code",
    "latency_ms",
];

/// Fills `record` with one call's cells, in [`HEADER`]'s order, reusing
/// its buffer and `scratch` (an export writes a million rows: no cell
/// allocates).
pub fn fill(record: &mut ByteRecord, scratch: &mut String, call: &AuditCall) {
    record.clear();
    let number = |record: &mut ByteRecord, scratch: &mut String, n: Option<i64>| {
        scratch.clear();
        if let Some(n) = n {
            let _ = write!(scratch, "{n}");
        }
        record.push_field(scratch.as_bytes());
    };
    number(record, scratch, Some(call.id));
    scratch.clear();
    let _ = write!(scratch, "{}", call.at.format("%Y-%m-%dT%H:%M:%S%.6fZ"));
    record.push_field(scratch.as_bytes());
    number(record, scratch, call.vault_key_id);
    push_text(record, call.key_label.as_deref());
    push_text(record, call.key_prefix.as_deref());
    push_text(record, Some(&call.method));
    push_text(record, Some(&call.path));
    push_text(record, call.stripe_customer.as_deref());
    push_text(record, call.metadata_customer_id.as_deref());
    push_text(record, call.billing_period.as_deref());
    number(record, scratch, call.amount.map(|c| c.0));
    let decimal = match (call.amount, &call.currency) {
        (Some(amount), Some(currency)) => amount.decimal(currency),
        _ => String::new(),
    };
    record.push_field(decimal.as_bytes());
    record.push_field(call.currency.as_ref().map_or("", |c| c.as_str()).as_bytes());
    push_text(record, call.idempotency_key.as_deref());
    record.push_field(call.decision.as_str().as_bytes());
    number(record, scratch, call.upstream_status.map(i64::from));
    push_text(record, call.stripe_object_id.as_deref());
    push_text(record, call.error_code.as_deref());
    number(record, scratch, call.latency_ms.map(i64::from));
}

/// A text cell, neutralised when a spreadsheet would run it.
fn push_text(record: &mut ByteRecord, text: Option<&str>) {
    let text = text.unwrap_or("");
    if is_formula(text) {
        record.push_field(format!("'{text}").as_bytes());
    } else {
        record.push_field(text.as_bytes());
    }
}

fn is_formula(text: &str) -> bool {
    text.starts_with(['=', '+', '-', '@', '\t', '\r'])
}

/// A text cell a spreadsheet would read as a formula (`=`, `+`, `-`, `@`,
/// tab or carriage return first) gets a leading apostrophe, which makes it
/// text (OWASP's advice for CSV injection).
pub fn neutralise(text: &str) -> String {
    if is_formula(text) {
        format!("'{text}")
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Cents, Currency, Decision};

    #[test]
    fn formulas_arrive_as_text_and_other_cells_as_they_are() {
        assert_eq!(neutralise("=HYPERLINK(\"x\")"), "'=HYPERLINK(\"x\")");
        for risky in ["+1", "-1", "@SUM(A1)", "\tx", "\rx"] {
            assert!(neutralise(risky).starts_with('\''), "{risky:?}");
        }
        assert_eq!(neutralise("cust_1"), "cust_1");
        assert_eq!(neutralise("a=b"), "a=b");
    }

    #[test]
    fn a_record_has_a_cell_per_header_with_times_in_utc_and_both_amounts() {
        let call = AuditCall {
            id: 7,
            at: "2026-11-30T14:05:06.123456Z".parse().unwrap(),
            vault_key_id: Some(3),
            key_label: Some("=HYPERLINK(\"x\")".into()),
            key_prefix: Some("vk_abc".into()),
            method: "POST".into(),
            path: "/v1/charges".into(),
            stripe_customer: None,
            metadata_customer_id: Some("cust_1".into()),
            billing_period: Some("2026-11".into()),
            amount: Some(Cents(123_450)),
            currency: Some(Currency::usd()),
            idempotency_key: Some("bill-cust_1".into()),
            decision: Decision::RefusedCap,
            upstream_status: None,
            stripe_object_id: None,
            error_code: Some("spend_cap_exceeded".into()),
            latency_ms: Some(3),
        };
        let mut record = ByteRecord::new();
        fill(&mut record, &mut String::new(), &call);
        let cells: Vec<String> = record
            .iter()
            .map(|c| String::from_utf8(c.to_vec()).unwrap())
            .collect();
        assert_eq!(cells.len(), HEADER.len());
        assert_eq!(cells[1], "2026-11-30T14:05:06.123456Z");
        assert_eq!(cells[3], "'=HYPERLINK(\"x\")");
        assert_eq!(
            (cells[10].as_str(), cells[11].as_str(), cells[12].as_str()),
            ("123450", "1234.50", "usd")
        );
        assert_eq!(cells[14], "refused_cap");
        assert_eq!(cells[15], "");
    }
}
