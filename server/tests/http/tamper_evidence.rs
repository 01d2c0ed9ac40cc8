//! Tamper evidence: the application's role can only append to the logs, and
//! the audit log's hash chain names the first row changed, deleted or added
//! behind the application's back.

use sqlx::PgPool;

use crate::helpers::{app_pool, audit_rows, TestApp};
use app::domain::Role;
use server::audit_chain::{check_new_rows, verify, HASHED_COLUMNS};

/// What a superuser can do that the application cannot: write behind the
/// append-only trigger.
async fn as_superuser_behind_the_trigger(owner: &PgPool, statement: &str) {
    let mut tx = owner.begin().await.unwrap();
    for step in [
        "ALTER TABLE audit_log DISABLE TRIGGER USER",
        statement,
        "ALTER TABLE audit_log ENABLE TRIGGER USER",
    ] {
        sqlx::raw_sql(step).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
}

async fn row_id(pool: &PgPool, seq: i64) -> i64 {
    sqlx::query_scalar("SELECT id FROM audit_log WHERE chain_seq = $1")
        .bind(seq)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn sql_state(err: sqlx::Error) -> String {
    err.as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
        .unwrap_or_else(|| panic!("not a database error: {err}"))
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_application_role_can_append_to_the_logs_and_nothing_more(owner: PgPool) {
    let app = app_pool(&owner, 1);
    audit_rows(&app, 1).await;
    sqlx::query("INSERT INTO operator_actions (via, action, subject_type) VALUES ('cli', 'test', 'nothing')")
        .execute(&app)
        .await
        .unwrap();
    for statement in [
        "UPDATE audit_log SET amount_cents = 1",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
        "UPDATE operator_actions SET action = 'other'",
        "DELETE FROM operator_actions",
        "TRUNCATE operator_actions",
        "UPDATE audit_chain_heads SET seq = 0",
        "DELETE FROM audit_chain_heads",
    ] {
        let err = sqlx::query(statement).execute(&app).await.unwrap_err();
        assert_eq!(
            sql_state(err),
            "42501",
            "{statement} is refused for lack of privilege"
        );
    }
    for statement in [
        "ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only",
        "DROP TRIGGER audit_log_chain ON audit_log",
        "ALTER TABLE operator_actions DISABLE TRIGGER USER",
        "DROP TABLE audit_log",
    ] {
        let err = sqlx::query(statement).execute(&app).await.unwrap_err();
        assert_eq!(sql_state(err), "42501", "{statement}: only the owner may");
    }
    let protection = app::audit::chain_sql::log_protection(&app).await.unwrap();
    assert!(!protection.can_rewrite);
    let owner_protection = app::audit::chain_sql::log_protection(&owner).await.unwrap();
    assert!(
        owner_protection.can_rewrite,
        "the owner could, and is told so"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn every_audit_column_is_in_the_hash(owner: PgPool) {
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT attname::text FROM pg_attribute
         WHERE attrelid = 'audit_log'::regclass AND attnum > 0 AND NOT attisdropped
           AND attname <> 'row_hash'
         ORDER BY attnum",
    )
    .fetch_all(&owner)
    .await
    .unwrap();
    assert_eq!(columns, HASHED_COLUMNS);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn rows_written_at_once_by_many_writers_form_one_unbroken_chain(owner: PgPool) {
    let app = app_pool(&owner, 8);
    let writers: Vec<_> = (0..8)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                for _ in 0..25 {
                    audit_rows(&app, 2).await;
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    // The chain's values are the trigger's to set: an INSERT naming them is
    // refused.
    let named = sqlx::query(
        "INSERT INTO audit_log (request_id, method, path, decision, chain_day, chain_seq, row_hash)
         VALUES (gen_random_uuid(), 'POST', '/v1/charges', 'refused_unknown_key', '2000-01-01', 1, '\\x00')",
    )
    .execute(&app)
    .await
    .unwrap_err();
    assert_eq!(sql_state(named), "42501");
    audit_rows(&app, 1).await;
    let report = verify(&app, None, None).await.unwrap();
    assert!(report.broken.is_none(), "{:?}", report.broken);
    assert_eq!(report.rows, 401);
    let seqs: (i64, i64, i64) = sqlx::query_as(
        "SELECT count(DISTINCT chain_seq), min(chain_seq), max(chain_seq) FROM audit_log",
    )
    .fetch_one(&app)
    .await
    .unwrap();
    assert_eq!(seqs, (401, 1, 401), "numbered without gaps or repeats");
}

/// The trigger hashes in SQL and `audit verify` in Rust: they must encode
/// every field alike, an empty row's NULLs and a full row's non-ASCII text
/// (whose length counts bytes, not characters) included.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_database_and_audit_verify_hash_nulls_and_non_ascii_alike(owner: PgPool) {
    let app = app_pool(&owner, 1);
    sqlx::query(
        "INSERT INTO audit_log (request_id, method, path, decision)
         VALUES (gen_random_uuid(), 'GET', '/v1/balance', 'refused_unknown_key')",
    )
    .execute(&app)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO audit_log (request_id, key_prefix, method, path, stripe_customer,
             metadata_customer_id, metadata_billing_period, billing_period, amount_cents, currency,
             idempotency_key, decision, upstream_status, stripe_object_id, error_code, message,
             latency_ms)
         VALUES (gen_random_uuid(), 'vk_live_ab', 'POST', '/v1/charges', 'cus_Müller',
             'kunde-東京-7', '2026-12', '2026-12', 4200, 'eur', 'msg-ø-1', 'refused_cap', 402,
             'ch_1', 'spend_cap_exceeded', 'Zahlung für Müller – über dem Limit', 12)",
    )
    .execute(&app)
    .await
    .unwrap();
    let report = verify(&app, None, None).await.unwrap();
    assert!(report.broken.is_none(), "{:?}", report.broken);
    assert_eq!(report.rows, 2);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_row_changed_by_a_superuser_is_named(owner: PgPool) {
    let app = app_pool(&owner, 2);
    audit_rows(&app, 10).await;
    assert!(verify(&app, None, None).await.unwrap().broken.is_none());
    let changed = row_id(&app, 4).await;
    as_superuser_behind_the_trigger(
        &owner,
        &format!("UPDATE audit_log SET amount_cents = 1 WHERE id = {changed}"),
    )
    .await;

    let broken = verify(&app, None, None)
        .await
        .unwrap()
        .broken
        .expect("found");
    assert_eq!(broken.broken_row_id, Some(changed));
    let problem = broken.problem.unwrap();
    assert!(
        problem.contains(&format!("audit row {changed} (#4 of")),
        "{problem}"
    );
    assert!(problem.contains("does not match its hash"), "{problem}");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_row_rewritten_with_a_fresh_hash_breaks_the_row_after_it(owner: PgPool) {
    let app = app_pool(&owner, 2);
    audit_rows(&app, 5).await;
    let changed = row_id(&app, 2).await;
    // A careful forger recomputes the changed row's hash, but not the rows
    // after it, which were chained to the old one.
    let first = row_id(&app, 1).await;
    as_superuser_behind_the_trigger(
        &owner,
        &format!(
            "UPDATE audit_log SET amount_cents = 1 WHERE id = {changed};
             UPDATE audit_log r SET row_hash = audit_row_hash(p.row_hash, r)
             FROM audit_log p WHERE r.id = {changed} AND p.id = {first}"
        ),
    )
    .await;
    let broken = verify(&app, None, None)
        .await
        .unwrap()
        .broken
        .expect("found");
    let next = row_id(&app, 3).await;
    assert_eq!(broken.broken_row_id, Some(next), "{:?}", broken.problem);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn deleted_rows_are_found_in_the_middle_and_at_the_end(owner: PgPool) {
    let app = app_pool(&owner, 2);
    audit_rows(&app, 6).await;
    let after_gap = row_id(&app, 4).await;
    as_superuser_behind_the_trigger(&owner, "DELETE FROM audit_log WHERE chain_seq = 3").await;
    let broken = verify(&app, None, None)
        .await
        .unwrap()
        .broken
        .expect("found");
    assert_eq!(broken.broken_row_id, Some(after_gap));
    assert!(broken.problem.unwrap().contains("row #3 of"));

    as_superuser_behind_the_trigger(&owner, "DELETE FROM audit_log WHERE chain_seq >= 3").await;
    let problem = verify(&app, None, None)
        .await
        .unwrap()
        .broken
        .expect("found")
        .problem
        .unwrap();
    assert!(problem.contains("rows #3 to #6 of"), "{problem}");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_row_slipped_in_behind_the_chain_is_found(owner: PgPool) {
    let app = app_pool(&owner, 2);
    audit_rows(&app, 3).await;
    as_superuser_behind_the_trigger(
        &owner,
        "INSERT INTO audit_log (request_id, method, path, decision, chain_day, chain_seq, row_hash)
         SELECT gen_random_uuid(), 'POST', '/v1/charges', 'allowed', chain_day, 4, row_hash
         FROM audit_log WHERE chain_seq = 3",
    )
    .await;
    let broken = verify(&app, None, None)
        .await
        .unwrap()
        .broken
        .expect("found");
    let slipped = crate::helpers::count(&app, "SELECT id FROM audit_log WHERE chain_seq = 4").await;
    assert_eq!(broken.broken_row_id, Some(slipped));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_audit_page_says_how_far_the_chain_is_verified_and_when_it_broke(owner: PgPool) {
    let app = TestApp::new(owner.clone());
    let viewer = app.signed_in("viewer@example.com", Role::Viewer).await;
    let page = app.get("/audit", Some(&viewer)).await.body;
    assert!(
        !page.contains("data-testid=\"chain-status\""),
        "nothing to vouch for yet"
    );
    assert!(
        !page.contains("role-can-rewrite"),
        "the application runs as vaultcap_app"
    );

    audit_rows(&app.pool, 3).await;
    let page = app.get("/audit", Some(&viewer)).await.body;
    assert!(page.contains("Hash chain not checked yet"), "{page}");

    check_new_rows(&app.pool).await.unwrap();
    audit_rows(&app.pool, 2).await;
    let page = app.get("/audit", Some(&viewer)).await.body;
    assert!(page.contains("Hash chain verified up to"), "{page}");
    assert!(page.contains("UTC: 3 rows hold."), "{page}");
    assert!(
        page.contains("2 rows written since are checked within a minute."),
        "{page}"
    );

    // The next round checks only the new rows, and finds them whole.
    let report = check_new_rows(&app.pool).await.unwrap();
    assert_eq!((report.rows, report.broken.is_none()), (2, true));

    let changed = row_id(&app.pool, 5).await;
    as_superuser_behind_the_trigger(
        &owner,
        &format!("UPDATE audit_log SET decision = 'allowed' WHERE id = {changed}"),
    )
    .await;
    // A change inside rows already checked shows at the day's full re-check.
    sqlx::query("UPDATE audit_chain_checks SET checked_at = now() - interval '25 hours'")
        .execute(&app.pool)
        .await
        .unwrap();
    check_new_rows(&app.pool).await.unwrap();
    let page = app.get("/audit", Some(&viewer)).await.body;
    assert!(
        page.contains("The audit log was changed outside Vaultcap."),
        "{page}"
    );
    assert!(
        page.contains(&format!("href=\"/audit/{changed}\"")),
        "{page}"
    );
}
