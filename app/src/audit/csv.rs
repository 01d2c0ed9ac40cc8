//! The audit log's CSV rows: RFC 4180, UTF-8, ISO-8601 UTC times, amounts
//! as integer minor units plus a decimal column, and every text cell that a
//! spreadsheet would run as a formula neutralised. PostgreSQL writes the
//! rows itself (`COPY … (FORMAT csv)`) from the cells below, at the speed of
//! `psql \copy`; the rules for a cell are the ones [`neutralise`] and
//! `Cents::decimal` apply everywhere else.

use crate::domain::ZERO_DECIMAL;

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

/// The export's cells in [`HEADER`]'s order, as SQL over `audit_log a` and
/// `vault_keys k`: times in UTC to the microsecond, the amount in minor
/// units and as a decimal with its currency's digits, text neutralised and
/// empty text written as an empty cell (never `""`).
pub fn copy_columns() -> String {
    [
        "a.id".to_owned(),
        r#"to_char(a.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"#.to_owned(),
        "a.vault_key_id".to_owned(),
        text_cell("k.label"),
        text_cell("a.key_prefix"),
        text_cell("a.method"),
        text_cell("a.path"),
        text_cell("a.stripe_customer"),
        text_cell("a.metadata_customer_id"),
        text_cell("a.billing_period"),
        "a.amount_cents".to_owned(),
        decimal_cell(),
        CURRENCY.to_owned(),
        text_cell("a.idempotency_key"),
        "a.decision".to_owned(),
        "a.upstream_status".to_owned(),
        text_cell("a.stripe_object_id"),
        text_cell("a.error_code"),
        "a.latency_ms".to_owned(),
    ]
    .join(",\n       ")
}

/// A text column as [`neutralise`] writes it.
fn text_cell(column: &str) -> String {
    format!(
        "CASE WHEN left({column}, 1) IN ('=', '+', '-', '@', chr(9), chr(13)) \
         THEN '''' || {column} ELSE nullif({column}, '') END"
    )
}

/// The currency as `Currency::parse` reads it: three letters, trimmed,
/// lower-case; anything else is no currency.
const CURRENCY: &str = r"(CASE WHEN a.currency ~ '^\s*[A-Za-z]{3}\s*$'
        THEN lower(btrim(a.currency, E' \t\n\r')) END)";

/// The amount as `Cents::decimal` writes it in the row's currency (in
/// `numeric`, so no amount overflows on the way).
fn decimal_cell() -> String {
    let zero_decimal: Vec<String> = ZERO_DECIMAL.iter().map(|c| format!("'{c}'")).collect();
    format!(
        "CASE WHEN a.amount_cents IS NULL OR {CURRENCY} IS NULL THEN NULL \
         WHEN {CURRENCY} IN ({zero}) THEN a.amount_cents::text \
         ELSE CASE WHEN a.amount_cents < 0 THEN '-' ELSE '' END \
           || div(abs(a.amount_cents::numeric), 100)::text || '.' \
           || lpad(mod(abs(a.amount_cents::numeric), 100)::text, 2, '0') END",
        zero = zero_decimal.join(", ")
    )
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
    fn the_export_has_a_cell_per_header() {
        // Each cell is on its own line; none spans one.
        assert_eq!(
            copy_columns().matches(",\n       ").count() + 1,
            HEADER.len()
        );
    }
}
