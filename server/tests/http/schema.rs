//! The invariants PostgreSQL itself guards.

use sqlx::PgPool;

async fn insert_key(
    pool: &PgPool,
    cap: i64,
    spent: i64,
    reserved: i64,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO vault_keys (secret_hash, secret_prefix, label, billing_period, currency,
             expected_total_cents, cap_cents, spent_cents, reserved_cents, allowed_endpoints, expires_at)
         VALUES (sha256(convert_to(gen_random_uuid()::text, 'UTF8')), 'vk_t', 'test', '2026-07', 'usd',
             100, $1, $2, $3, ARRAY['POST /v1/charges'], now() + interval '1 day')
         RETURNING id",
    )
    .bind(cap)
    .bind(spent)
    .bind(reserved)
    .fetch_one(pool)
    .await
}

fn constraint(err: sqlx::Error) -> String {
    err.as_database_error()
        .and_then(|e| e.constraint())
        .unwrap_or_default()
        .to_owned()
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn spent_plus_reserved_can_never_exceed_the_cap(pool: PgPool) {
    let id = insert_key(&pool, 1000, 600, 400)
        .await
        .expect("exactly at the cap is allowed");
    let err =
        sqlx::query("UPDATE vault_keys SET reserved_cents = reserved_cents + 1 WHERE id = $1")
            .bind(id)
            .execute(&pool)
            .await
            .unwrap_err();
    assert_eq!(constraint(err), "vault_keys_within_cap");
    assert_eq!(
        constraint(insert_key(&pool, 0, 0, 0).await.unwrap_err()),
        "vault_keys_cap_cents_check"
    );
    assert_eq!(
        constraint(insert_key(&pool, 10, -1, 0).await.unwrap_err()),
        "vault_keys_spent_cents_check"
    );
}

/// A key's field rules are domains (migration 31), so a spend does not
/// check them again; every write of a field still does.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_keys_field_rules_hold_for_every_write_of_the_field(pool: PgPool) {
    let id = insert_key(&pool, 1000, 0, 0).await.unwrap();
    for (field, junk) in [
        ("currency", "'USD'"),
        ("billing_period", "'2026-13'"),
        ("label", "''"),
        ("allowed_endpoints", "'{}'"),
        ("duplicate_policy", "'sometimes'"),
        ("stripe_account", "'acct_'"),
        ("buffer_bps", "100001"),
        ("expected_total_cents", "-1"),
        ("vendor", "'paypal'"),
    ] {
        let err = sqlx::query(&format!(
            "UPDATE vault_keys SET {field} = {junk} WHERE id = $1"
        ))
        .bind(id)
        .execute(&pool)
        .await
        .expect_err(field);
        // The names the table constraints had.
        assert_eq!(
            constraint(err),
            format!("vault_keys_{field}_check"),
            "{field} = {junk}"
        );
    }
    let spent: i64 = sqlx::query_scalar(
        "UPDATE vault_keys SET spent_cents = spent_cents + 100 WHERE id = $1 RETURNING spent_cents",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(spent, 100);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_audit_log_cannot_be_updated_deleted_or_truncated(pool: PgPool) {
    sqlx::query(
        "INSERT INTO audit_log (request_id, method, path, decision) VALUES (gen_random_uuid(), 'POST', '/v1/charges', 'refused_unknown_key')",
    )
    .execute(&pool)
    .await
    .unwrap();
    for statement in [
        "UPDATE audit_log SET path = '/v1/refunds'",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
    ] {
        let err = sqlx::query(statement).execute(&pool).await.unwrap_err();
        assert!(
            err.to_string().contains("audit_log is append-only"),
            "{statement}: {err}"
        );
    }
    let rows = crate::helpers::count(&pool, "SELECT count(*) FROM audit_log").await;
    assert_eq!(rows, 1);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_operator_action_log_is_append_only_too(pool: PgPool) {
    sqlx::query("INSERT INTO operator_actions (via, action, subject_type) VALUES ('cli', 'test', 'nothing')")
        .execute(&pool)
        .await
        .unwrap();
    let err = sqlx::query("DELETE FROM operator_actions")
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("append-only"));
    let unattributed = sqlx::query(
        "INSERT INTO operator_actions (via, action, subject_type) VALUES ('console', 'x', 'y')",
    )
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(
        constraint(unattributed),
        "operator_actions_attributed",
        "console actions name their operator"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_billing_ledger_holds_one_row_per_customer_and_period(pool: PgPool) {
    let insert =
        "INSERT INTO billing_records (customer_id, billing_period, charge_id, amount_cents, status)
                  VALUES ('cust_1', '2026-07', $1, 5000, 'charged')
                  ON CONFLICT (customer_id, billing_period) DO NOTHING";
    let first = sqlx::query(insert)
        .bind("ch_A")
        .execute(&pool)
        .await
        .unwrap();
    let second = sqlx::query(insert)
        .bind("ch_B")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!((first.rows_affected(), second.rows_affected()), (1, 0));
    let charge: String = sqlx::query_scalar("SELECT charge_id FROM billing_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(charge, "ch_A");
}

/// Where the functions the migrations leave are written out, one after
/// another, so a reader need not replay the migrations to know the live rule.
const LIVE_FUNCTIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../migrations/live/functions.sql"
);

/// Every function of the migrated schema (extensions' aside) as PostgreSQL
/// itself prints it, in name order.
async fn live_functions(pool: &PgPool) -> String {
    let definitions: Vec<String> = sqlx::query_scalar(
        "SELECT pg_get_functiondef(p.oid)
         FROM pg_proc p
         JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = current_schema()
           AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
         ORDER BY p.proname, p.oid::regprocedure::text",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut file = String::from(
        "-- The live definition of every function in Vaultcap's schema, as\n\
         -- PostgreSQL prints it after all of migrations/ have run (generated, in\n\
         -- name order). Read the rules here; change them with a new migration,\n\
         -- then rewrite this file: VAULTCAP_BLESS=1 cargo test -p server --test http\n\
         -- schema::the_live_functions. A test fails while the two differ.\n",
    );
    for definition in definitions {
        file.push('\n');
        file.push_str(definition.trim_end());
        file.push_str(";\n");
    }
    file
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_live_functions_file_is_what_the_migrations_leave(pool: PgPool) {
    let live = live_functions(&pool).await;
    for rule in ["reserve_spend", "settle_calls", "record_calls"] {
        assert!(
            live.contains(&format!("FUNCTION public.{rule}(")),
            "{rule} is missing"
        );
    }
    if std::env::var_os("VAULTCAP_BLESS").is_some() {
        std::fs::write(LIVE_FUNCTIONS, &live).unwrap();
    }
    let written = std::fs::read_to_string(LIVE_FUNCTIONS).unwrap_or_default();
    assert!(
        written == live,
        "{LIVE_FUNCTIONS} is not what the migrations leave; rewrite it with \
         VAULTCAP_BLESS=1 cargo test -p server --test http schema::the_live_functions \
         and commit it with the migration"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_stored_value_that_is_no_domain_value_is_an_error_naming_it(pool: PgPool) {
    use app::domain::{BillingPeriod, Cents, Currency, DuplicatePolicy};
    let period: BillingPeriod = sqlx::query_scalar("SELECT '2026-07'::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(period.to_string(), "2026-07");
    let cents: Cents = sqlx::query_scalar("SELECT 1250::bigint")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(cents, Cents(1250));

    // Never folded into a currency: what is stored must already be one.
    for (error, expected) in [
        (
            decode_error::<BillingPeriod>(&pool, "2026-13").await,
            "\"2026-13\" is not a billing period",
        ),
        (
            decode_error::<Currency>(&pool, "USD").await,
            "\"USD\" is not a currency",
        ),
        (
            decode_error::<DuplicatePolicy>(&pool, "sometimes").await,
            "\"sometimes\" is not a duplicate policy",
        ),
    ] {
        assert!(error.contains(expected), "{error}");
    }
}

/// Why `text` read from the database as a `T` is refused.
async fn decode_error<T>(pool: &PgPool, text: &str) -> String
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar::<_, T>("SELECT $1::text")
        .bind(text)
        .fetch_one(pool)
        .await
        .err()
        .expect("refused")
        .to_string()
}
