//! Reconciliation detection against a real PostgreSQL: Stripe's charges as
//! a sync stores them, the billing jobs' ledger, and the findings between.

use chrono::{Duration, Utc};
use sqlx::PgPool;

use app::{domain::BillingPeriod, reconciliation::findings};

const PERIOD: &str = "2026-07";

async fn charge(
    pool: &PgPool,
    id: &str,
    customer: &str,
    cents: i64,
    refunded: i64,
    status: &str,
    minute: i64,
) {
    sqlx::query(
        "INSERT INTO stripe_charges (id, stripe_customer, amount_cents, amount_refunded_cents, currency,
             status, customer_id, billing_period, created_at)
         VALUES ($1, 'cus_' || $2, $3, $4, 'usd', $5, $2, $6, $7)",
    )
    .bind(id)
    .bind(customer)
    .bind(cents)
    .bind(refunded)
    .bind(status)
    .bind(PERIOD)
    .bind(Utc::now() - Duration::days(1) + Duration::minutes(minute))
    .execute(pool)
    .await
    .unwrap();
}

async fn record(pool: &PgPool, customer: &str, charge_id: &str, cents: i64) {
    sqlx::query(
        "INSERT INTO billing_records (customer_id, billing_period, charge_id, amount_cents)
         VALUES ($1, $2, $3, $4)",
    )
    .bind(customer)
    .bind(PERIOD)
    .bind(charge_id)
    .bind(cents)
    .execute(pool)
    .await
    .unwrap();
}

async fn detect(pool: &PgPool) -> findings::Detected {
    let mut tx = pool.begin().await.unwrap();
    let found = findings::detect(
        &mut tx,
        PERIOD.parse::<BillingPeriod>().unwrap(),
        Utc::now(),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    found
}

/// (kind, customer, charges, keeper, at risk, resolution), by kind and customer.
type Row = (
    String,
    String,
    Vec<String>,
    Option<String>,
    i64,
    Option<String>,
);

async fn findings(pool: &PgPool) -> Vec<Row> {
    sqlx::query_as(
        "SELECT kind, customer_id, charge_ids, keeper_charge_id, amount_at_risk_cents, resolution
         FROM reconciliation_findings ORDER BY kind, customer_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

fn row(
    kind: &str,
    customer: &str,
    charges: &[&str],
    keeper: Option<&str>,
    at_risk: i64,
    resolution: Option<&str>,
) -> Row {
    (
        kind.into(),
        customer.into(),
        charges.iter().map(|c| c.to_string()).collect(),
        keeper.map(Into::into),
        at_risk,
        resolution.map(Into::into),
    )
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn detection_finds_orphaned_duplicate_and_missing_charges_once(pool: PgPool) {
    // cust_1: the seeds' ch_A + ch_B (a redelivery with a rotated key).
    record(&pool, "cust_1", "ch_A", 5_000).await;
    charge(&pool, "ch_A", "cust_1", 5_000, 0, "succeeded", 0).await;
    charge(&pool, "ch_B", "cust_1", 5_000, 0, "succeeded", 5).await;
    // cust_2: the ledger names a charge Stripe does not have.
    record(&pool, "cust_2", "ch_gone", 7_000).await;
    // cust_3: the job crashed before writing its row.
    charge(&pool, "ch_O", "cust_3", 2_500, 0, "succeeded", 1).await;
    // cust_4: two charges, the ledger names the later one.
    record(&pool, "cust_4", "ch_D2", 900).await;
    charge(&pool, "ch_D1", "cust_4", 900, 0, "succeeded", 2).await;
    charge(&pool, "ch_D2", "cust_4", 900, 0, "succeeded", 3).await;
    // cust_5: the second charge was refunded in full, the third failed: fine.
    record(&pool, "cust_5", "ch_5", 1_000).await;
    charge(&pool, "ch_5", "cust_5", 1_000, 0, "succeeded", 4).await;
    charge(&pool, "ch_5r", "cust_5", 1_000, 1_000, "succeeded", 6).await;
    charge(&pool, "ch_5f", "cust_5", 1_000, 0, "failed", 7).await;

    let expected = [
        row(
            "duplicate",
            "cust_1",
            &["ch_A", "ch_B"],
            Some("ch_A"),
            5_000,
            None,
        ),
        row(
            "duplicate",
            "cust_4",
            &["ch_D1", "ch_D2"],
            Some("ch_D2"),
            900,
            None,
        ),
        row("missing", "cust_2", &["ch_gone"], None, 7_000, None),
        row("orphaned", "cust_3", &["ch_O"], None, 2_500, None),
    ];
    let first = detect(&pool).await;
    assert_eq!(
        (
            first.orphaned,
            first.duplicate,
            first.missing,
            first.cleared
        ),
        (1, 2, 1, 0)
    );
    assert_eq!(findings(&pool).await, expected);
    let explanation: String = sqlx::query_scalar(
        "SELECT explanation FROM reconciliation_findings WHERE customer_id = 'cust_4'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        explanation,
        "2 live charges for cust_4 in 2026-07; ch_D2 is kept, as the billing record names it"
    );

    // Twice: the same findings, no second row.
    detect(&pool).await;
    assert_eq!(findings(&pool).await, expected);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_resolved_finding_stays_resolved_until_its_charges_change(pool: PgPool) {
    record(&pool, "cust_1", "ch_A", 5_000).await;
    charge(&pool, "ch_A", "cust_1", 5_000, 0, "succeeded", 0).await;
    charge(&pool, "ch_B", "cust_1", 5_000, 0, "succeeded", 5).await;
    charge(&pool, "ch_O", "cust_3", 2_500, 0, "succeeded", 1).await;
    detect(&pool).await;
    sqlx::query(
        "UPDATE reconciliation_findings SET resolution = 'dismissed', resolved_at = now(),
                resolution_note = 'two seats, two charges' WHERE kind = 'duplicate'",
    )
    .execute(&pool)
    .await
    .unwrap();
    detect(&pool).await;
    assert_eq!(findings(&pool).await[0].5.as_deref(), Some("dismissed"));

    // A third charge is news: the duplicate opens again, with all three.
    charge(&pool, "ch_C", "cust_1", 5_000, 0, "succeeded", 9).await;
    // The orphan's billing record arrives (adopted elsewhere): it clears.
    record(&pool, "cust_3", "ch_O", 2_500).await;
    let found = detect(&pool).await;
    assert_eq!((found.orphaned, found.duplicate, found.cleared), (0, 1, 1));
    assert_eq!(
        findings(&pool).await,
        [
            row(
                "duplicate",
                "cust_1",
                &["ch_A", "ch_B", "ch_C"],
                Some("ch_A"),
                10_000,
                None
            ),
            row(
                "orphaned",
                "cust_3",
                &["ch_O"],
                None,
                2_500,
                Some("cleared")
            ),
        ]
    );
}

/// Findings for the page: ch_A + ch_B for cust_1, an orphan for cust_3.
async fn seeded(pool: &PgPool) -> (i64, i64) {
    record(pool, "cust_1", "ch_A", 5_000).await;
    charge(pool, "ch_A", "cust_1", 5_000, 0, "succeeded", 0).await;
    charge(pool, "ch_B", "cust_1", 5_000, 0, "succeeded", 5).await;
    charge(pool, "ch_O", "cust_3", 2_500, 0, "succeeded", 1).await;
    detect(pool).await;
    let id = |kind: &'static str| async move {
        sqlx::query_scalar::<_, i64>("SELECT id FROM reconciliation_findings WHERE kind = $1")
            .bind(kind)
            .fetch_one(pool)
            .await
            .unwrap()
    };
    (id("orphaned").await, id("duplicate").await)
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn operators_adopt_an_orphan_and_dismiss_a_duplicate_from_the_page(pool: PgPool) {
    use crate::helpers::{enc, TestApp};
    use app::domain::Role;
    use axum::http::StatusCode;

    let (orphan, duplicate) = seeded(&pool).await;
    let app = TestApp::new(pool.clone());
    let viewer = app.signed_in("viewer@example.com", Role::Viewer).await;
    let page = app
        .get("/reconciliation?period=2026-07", Some(&viewer))
        .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains(r#"data-kind="orphaned""#),
        "{}",
        page.body
    );
    assert!(page.body.contains("has never been synced from Stripe"));
    assert!(page.body.contains("ch_A</code> (keep)"), "{}", page.body);
    assert!(!page.body.contains("Adopt finding"), "viewers read");
    let refused = app
        .post_form(
            &format!("/reconciliation/{orphan}/adopt"),
            "period=2026-07",
            Some(&viewer),
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);

    let ops = app.signed_in("ops@example.com", Role::Operator).await;
    let page = app
        .get("/reconciliation?period=2026-07", Some(&ops))
        .await
        .body;
    assert!(page.contains(&format!("Adopt finding {orphan}")));
    assert!(
        !page.contains(&format!("Adopt finding {duplicate}")),
        "only orphans are adopted"
    );

    let post = |path: String, body: String| {
        let (app, ops) = (&app, &ops);
        async move {
            let response = app.post_form(&path, &body, Some(ops)).await;
            assert_eq!(response.status, StatusCode::SEE_OTHER);
            assert_eq!(response.location(), "/reconciliation?period=2026-07");
            app.get(response.location(), Some(ops)).await.body
        }
    };
    let after = post(
        format!("/reconciliation/{orphan}/adopt"),
        "period=2026-07".into(),
    )
    .await;
    assert!(after.contains("Adopted ch_O for cust_3"), "{after}");
    let adopted: (String, i64, String) = sqlx::query_as(
        "SELECT charge_id, amount_cents, status FROM billing_records WHERE customer_id = 'cust_3'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(adopted, ("ch_O".into(), 2_500, "charged".into()));
    let again = post(
        format!("/reconciliation/{orphan}/adopt"),
        "period=2026-07".into(),
    )
    .await;
    assert!(
        again.contains(&format!(
            "finding #{orphan} was already adopted by ops@example.com"
        )),
        "{again}"
    );
    let wrong = post(
        format!("/reconciliation/{duplicate}/adopt"),
        "period=2026-07".into(),
    )
    .await;
    assert!(
        wrong.contains("only orphaned charges are adopted"),
        "{wrong}"
    );

    let no_reason = post(
        format!("/reconciliation/{duplicate}/dismiss"),
        "period=2026-07&reason=+".into(),
    )
    .await;
    assert!(
        no_reason.contains("say why the finding is dismissed"),
        "{no_reason}"
    );
    let dismissed = post(
        format!("/reconciliation/{duplicate}/dismiss"),
        format!(
            "period=2026-07&reason={}",
            enc("Two seats, two charges: confirmed")
        ),
    )
    .await;
    assert!(
        dismissed.contains(&format!("Dismissed finding #{duplicate} for cust_1")),
        "{dismissed}"
    );
    let resolved = app
        .get("/reconciliation?period=2026-07&state=resolved", Some(&ops))
        .await
        .body;
    assert!(
        resolved.contains("Reason: Two seats, two charges: confirmed"),
        "{resolved}"
    );
    assert!(app
        .get("/reconciliation?period=2026-07", Some(&ops))
        .await
        .body
        .contains("No open findings."));

    let logged: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM operator_actions WHERE action LIKE 'finding.%' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(logged, ["finding.adopt", "finding.dismiss"]);

    for bad in ["kind=nope", "period=2026-13", "state=later"] {
        let page = app.get(&format!("/reconciliation?{bad}"), Some(&ops)).await;
        assert!(page.body.contains("panel-error"), "{bad}: {}", page.body);
    }
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_finding_resolved_twice_at_once_is_resolved_once(pool: PgPool) {
    use app::{actions::sql::Actor, domain::Role, reconciliation::rules as reconciliation};
    let (_orphan, duplicate) = seeded(&pool).await;
    let app = crate::helpers::TestApp::new(pool.clone());
    let (a, b) = (
        app.add_operator("a@example.com", Role::Operator).await,
        app.add_operator("b@example.com", Role::Operator).await,
    );
    let actor = |id| Actor::Operator { id, ip: None };
    let (first, second) = tokio::join!(
        reconciliation::dismiss(
            &pool,
            actor(a),
            app::domain::FindingId(duplicate),
            "legitimate"
        ),
        reconciliation::dismiss(
            &pool,
            actor(b),
            app::domain::FindingId(duplicate),
            "legitimate too"
        ),
    );
    assert_eq!(
        first.is_ok() as u8 + second.is_ok() as u8,
        1,
        "{first:?} {second:?}"
    );
    let recorded = crate::helpers::actions_logged(&pool, "finding.dismiss").await;
    assert_eq!(recorded, 1);
}

/// A finished sync of the period, started now.
async fn synced(pool: &PgPool) {
    sqlx::query(
        "INSERT INTO stripe_syncs (billing_period, created_from, created_to, finished_at)
         VALUES ($1, now() - interval '40 days', now() + interval '3 days', now())",
    )
    .bind(PERIOD)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn calls_of_unknown_outcome_are_settled_by_stripes_charge_and_never_released_by_its_absence(
    pool: PgPool,
) {
    use crate::proxy::proxy_with_key;

    // Two calls whose outcome the proxy could not know: a 500 and a timeout.
    let (app, _stripe, key, key_id) = proxy_with_key(pool.clone(), 5_000).await;
    for (customer, cents) in [("cus_500", 1_000), ("cus_slow", 700)] {
        let body = format!(
            "amount={cents}&currency=usd&customer={customer}&metadata%5Bcustomer_id%5D=c_{customer}&metadata%5Bbilling_period%5D={PERIOD}"
        );
        let response = app.charge(&key, &body).await;
        assert!(response.status.is_server_error(), "{}", response.body);
    }
    let money = || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT spent_cents, reserved_cents FROM vault_keys WHERE id = $1",
        )
        .bind(key_id)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(money().await, (0, 1_700), "both stay reserved");
    // An hour later, a sync shows Stripe made the first charge, not the second.
    sqlx::query("UPDATE reservations SET created_at = now() - interval '1 hour'")
        .execute(&pool)
        .await
        .unwrap();
    charge(
        &pool,
        "ch_made",
        "c_cus_500",
        1_000,
        0,
        "succeeded",
        23 * 60,
    )
    .await;
    sqlx::query("UPDATE stripe_charges SET created_at = now() - interval '59 minutes'")
        .execute(&pool)
        .await
        .unwrap();
    synced(&pool).await;

    let found = server::reconcile::detect(&pool, PERIOD.parse().unwrap())
        .await
        .unwrap();
    assert_eq!((found.unknown.settled, found.unknown.still_unknown), (1, 1));
    assert_eq!(
        money().await,
        (1_000, 700),
        "the made charge is spent; no charge in the sync proves nothing: still reserved"
    );
    let states: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT state, stripe_charge_id FROM reservations ORDER BY amount_cents DESC",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        states,
        [
            ("settled".into(), Some("ch_made".into())),
            ("outcome_unknown".into(), None)
        ]
    );
    let logged: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM operator_actions WHERE action LIKE 'reservation.%' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(logged, ["reservation.settle"]);
    // Again: nothing left to decide.
    let again = server::reconcile::detect(&pool, PERIOD.parse().unwrap())
        .await
        .unwrap();
    assert_eq!((again.unknown.settled, again.unknown.still_unknown), (0, 1));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_findings_download_as_csv_with_the_pages_filters(pool: PgPool) {
    use crate::helpers::TestApp;
    use app::domain::Role;
    use axum::http::StatusCode;

    seeded(&pool).await;
    // A customer id a spreadsheet would run as a formula.
    charge(&pool, "ch_F", "=HYPERLINK(\"x\")", 100, 0, "succeeded", 9).await;
    detect(&pool).await;
    let app = TestApp::new(pool.clone());
    let viewer = app.signed_in("viewer@example.com", Role::Viewer).await;
    let all = app
        .get(
            "/reconciliation.csv?period=2026-07&state=all",
            Some(&viewer),
        )
        .await;
    assert_eq!(all.status, StatusCode::OK);
    assert!(all.headers["content-disposition"]
        .to_str()
        .unwrap()
        .contains("vaultcap-findings-2026-07-all.csv"));
    let mut reader = csv::Reader::from_reader(all.body.as_bytes());
    assert_eq!(reader.headers().unwrap().len(), 15);
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 3);
    let formula = rows.iter().find(|r| r[4] == *"ch_F").unwrap();
    assert_eq!(&formula[3], "'=HYPERLINK(\"x\")");
    let duplicate = rows.iter().find(|r| &r[1] == "duplicate").unwrap();
    assert_eq!(
        (&duplicate[4], &duplicate[5], &duplicate[6], &duplicate[7]),
        ("ch_A ch_B", "ch_A", "5000", "50.00")
    );

    let orphans = app
        .get(
            "/reconciliation.csv?period=2026-07&kind=orphaned",
            Some(&viewer),
        )
        .await;
    assert_eq!(
        csv::Reader::from_reader(orphans.body.as_bytes())
            .records()
            .count(),
        2
    );
    let bad = app
        .get("/reconciliation.csv?kind=nope", Some(&viewer))
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        bad.body.contains("is not a kind of finding"),
        "{}",
        bad.body
    );
    let logged = crate::helpers::actions_logged(&pool, "export_findings_csv").await;
    assert_eq!(logged, 2);
}

/// A proxy call's audit row, as the proxy writes it for a charge.
async fn proxied(pool: &PgPool, customer: &str, idempotency_key: &str, charge: &str) {
    sqlx::query(
        "INSERT INTO audit_log (request_id, key_prefix, method, path, metadata_customer_id, billing_period,
             amount_cents, currency, idempotency_key, decision, upstream_status, stripe_object_id, latency_ms)
         VALUES (gen_random_uuid(), 'vk_test_ab', 'POST', '/v1/charges', $1, $2, 5000, 'usd', $3, 'allowed',
                 200, $4, 40)",
    )
    .bind(customer)
    .bind(PERIOD)
    .bind(idempotency_key)
    .bind(charge)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_findings_page_shows_every_piece_of_evidence_and_resolves_it_there(pool: PgPool) {
    use crate::helpers::{enc, TestApp};
    use app::domain::Role;
    use axum::http::StatusCode;

    let (orphan, duplicate) = seeded(&pool).await;
    proxied(&pool, "cust_1", "msg-1:delivery-1", "ch_A").await;
    proxied(&pool, "cust_1", "msg-1:delivery-2", "ch_B").await;
    let app = TestApp::new(pool.clone());
    let viewer = app.signed_in("viewer@example.com", Role::Viewer).await;

    let page = app
        .get(&format!("/reconciliation/{duplicate}"), Some(&viewer))
        .await;
    assert_eq!(page.status, StatusCode::OK);
    let body = &page.body;
    assert!(
        body.contains(
            "2 live charges for cust_1 in 2026-07; ch_A is kept, as the billing record names it"
        ),
        "{body}"
    );
    let comparison = body
        .split(r#"data-testid="charge-comparison""#)
        .nth(1)
        .unwrap()
        .split("</table>")
        .next()
        .unwrap();
    for expected in [
        "ch_A",
        "ch_B",
        "keep",
        "msg-1:delivery-1",
        "msg-1:delivery-2",
        "50.00",
    ] {
        assert!(comparison.contains(expected), "{expected}: {comparison}");
    }
    assert!(
        comparison.find("msg-1:delivery-1") < comparison.find("msg-1:delivery-2"),
        "each charge's column has its own call's key"
    );
    assert!(body.contains("Billing record") && body.contains("<code>ch_A</code>"));
    assert!(body.contains("Proxy calls") && body.contains("vk_test_ab…"));
    assert!(body.contains("Nobody has acted on this finding yet."));
    assert!(!body.contains("Dismiss finding"), "viewers read");

    let orphan_page = app
        .get(&format!("/reconciliation/{orphan}"), Some(&viewer))
        .await
        .body;
    assert!(
        orphan_page.contains("No billing record for cust_3 in 2026-07"),
        "{orphan_page}"
    );
    assert!(orphan_page.contains("the charges were made around Vaultcap"));
    let missing = app.get("/reconciliation/999999", Some(&viewer)).await.body;
    assert!(missing.contains("Finding not found"), "{missing}");

    // Resolved on its own page, the operator comes back to it; a foreign
    // return address is not followed.
    let ops = app.signed_in("ops@example.com", Role::Operator).await;
    let here = format!("/reconciliation/{duplicate}");
    let dismissed = app
        .post_form(
            &format!("{here}/dismiss"),
            &format!(
                "period=2026-07&return_to={}&reason={}",
                enc(&here),
                enc("Second order, invoiced separately")
            ),
            Some(&ops),
        )
        .await;
    assert_eq!(dismissed.location(), here);
    let after = app.get(&here, Some(&ops)).await.body;
    assert!(after.contains("Dismissed finding"), "{after}");
    assert!(after.contains("finding.dismiss") && after.contains("ops@example.com"));
    assert!(after.contains("Reason: Second order, invoiced separately"));
    let foreign = app
        .post_form(
            &format!("/reconciliation/{orphan}/dismiss"),
            &format!(
                "period=2026-07&return_to={}&reason=x",
                enc("https://evil.example/")
            ),
            Some(&ops),
        )
        .await;
    assert_eq!(foreign.location(), "/reconciliation?period=2026-07");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_bulk_action_previews_count_and_money_then_resolves_exactly_those_once(pool: PgPool) {
    use crate::helpers::{enc, TestApp};
    use app::domain::Role;
    use axum::http::StatusCode;

    seeded(&pool).await;
    charge(&pool, "ch_O4", "cust_4", 1_000, 0, "succeeded", 2).await;
    charge(&pool, "ch_O5", "cust_5", 250, 0, "succeeded", 3).await;
    detect(&pool).await;
    let orphans: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM reconciliation_findings WHERE kind = 'orphaned' ORDER BY amount_at_risk_cents DESC",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(orphans.len(), 3);
    let app = TestApp::new(pool.clone());
    let ops = app.signed_in("ops@example.com", Role::Operator).await;

    let list = app
        .get("/reconciliation?period=2026-07&kind=orphaned", Some(&ops))
        .await
        .body;
    assert!(list.contains(r#"action="/reconciliation/bulk""#), "{list}");
    let preview = app
        .get(
            "/reconciliation/bulk?period=2026-07&kind=orphaned&action=adopt",
            Some(&ops),
        )
        .await
        .body;
    assert!(
        preview.contains(r#"data-testid="bulk-count">3<"#),
        "{preview}"
    );
    assert!(
        preview.contains(r#"data-testid="bulk-total">37.50 USD<"#),
        "{preview}"
    );
    let ids = orphans
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    assert!(
        preview.contains(&format!(r#"name="ids" value="{ids}""#)),
        "{preview}"
    );
    let scoped = app
        .get(
            "/reconciliation/bulk?period=2026-07&kind=orphaned&action=adopt&customer=cust_4",
            Some(&ops),
        )
        .await
        .body;
    assert!(
        scoped.contains(r#"data-testid="bulk-count">1<"#),
        "{scoped}"
    );
    assert!(scoped.contains("for customers starting with cust_4"));
    let mismatch = app
        .get(
            "/reconciliation/bulk?period=2026-07&kind=duplicate&action=adopt",
            Some(&ops),
        )
        .await
        .body;
    assert!(
        mismatch.contains("applies to orphaned charges only"),
        "{mismatch}"
    );

    let viewer = app.signed_in("viewer@example.com", Role::Viewer).await;
    let bulk = |body: String, who: &str| {
        let (app, who) = (&app, who.to_owned());
        async move {
            app.post_form("/reconciliation/bulk", &body, Some(&who))
                .await
        }
    };
    let form = |extra: &str| {
        format!(
            "action=adopt&period=2026-07&kind=orphaned&ids={}{extra}",
            enc(&ids)
        )
    };
    assert_eq!(
        bulk(form("&confirm=yes"), &viewer).await.status,
        StatusCode::FORBIDDEN
    );
    let unconfirmed = bulk(form(""), &ops).await;
    assert_eq!(
        unconfirmed.location(),
        "/reconciliation?period=2026-07&kind=orphaned&state=open"
    );
    let notice = app.notice(unconfirmed.location(), &ops).await;
    assert!(notice.contains("tick the box"), "{notice}");
    let adopted_rows = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM billing_records")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(adopted_rows().await, 1, "nothing adopted unconfirmed");

    let done = bulk(form("&confirm=yes"), &ops).await;
    let notice = app.notice(done.location(), &ops).await;
    assert_eq!(notice, "Adopted 3 of 3 findings: 37.50 USD.");
    assert_eq!(adopted_rows().await, 4);
    let again = bulk(form("&confirm=yes"), &ops).await;
    let notice = app.notice(again.location(), &ops).await;
    assert!(
        notice.starts_with("Adopted 0 of 3 findings: nothing."),
        "{notice}"
    );
    assert!(
        notice.contains("was already adopted by ops@example.com"),
        "{notice}"
    );
    assert_eq!(adopted_rows().await, 4, "nothing adopted twice");

    // Dismissing needs its reason; the run is in the action log.
    let duplicate = crate::helpers::count(
        &pool,
        "SELECT id FROM reconciliation_findings WHERE kind = 'duplicate'",
    )
    .await;
    let dismiss = |reason: &str| {
        format!(
            "action=dismiss&period=2026-07&kind=all&ids={duplicate}&confirm=yes&reason={}",
            enc(reason)
        )
    };
    let refused = bulk(dismiss(" "), &ops).await;
    assert!(app
        .notice(refused.location(), &ops)
        .await
        .contains("say why"));
    let dismissed = bulk(dismiss("Both orders were real"), &ops).await;
    assert_eq!(
        app.notice(dismissed.location(), &ops).await,
        "Dismissed 1 of 1 finding: 50.00 USD."
    );
    let logged: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT details FROM operator_actions WHERE action = 'finding.bulk' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        logged.len(),
        3,
        "each confirmed run, done or not: {logged:?}"
    );
    assert_eq!(logged[0]["done"].as_array().unwrap().len(), 3);
    assert_eq!(logged[2]["reason"], "Both orders were real");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_sync_panel_words_each_state_once_and_offers_only_a_sync_that_can_work(pool: PgPool) {
    use crate::helpers::TestApp;
    use app::domain::Role;

    async fn page_for(app: &TestApp, cookie: String, query: &str) -> String {
        app.get(
            &format!("/reconciliation?period={PERIOD}{query}"),
            Some(&cookie),
        )
        .await
        .body
    }
    let sync_form = r#"action="/reconciliation/sync""#;
    let agree = "Stripe and the billing records agree";

    // This server has no Stripe key: no button that cannot work.
    let app = TestApp::new(pool.clone());
    let ops = app.signed_in("ops@example.com", Role::Operator).await;
    let page = page_for(&app, ops.clone(), "").await;
    assert!(page.contains("has never been synced from Stripe"), "{page}");
    assert!(page.contains("Syncing is not possible: this server has no Stripe secret key"));
    assert!(!page.contains(sync_form) && !page.contains(agree), "{page}");

    // A server with one offers the sync to operators, and says so to viewers.
    let with_stripe = TestApp::with_upstream(
        pool.clone(),
        "http://127.0.0.1:9",
        std::time::Duration::from_secs(1),
    );
    let ops = with_stripe
        .signed_in("ops2@example.com", Role::Operator)
        .await;
    let viewer = with_stripe
        .signed_in("viewer@example.com", Role::Viewer)
        .await;
    assert!(page_for(&with_stripe, ops.clone(), "")
        .await
        .contains(sync_form));
    let page = page_for(&with_stripe, viewer, "").await;
    assert!(!page.contains(sync_form) && page.contains("An operator can start a sync."));

    let sync = |started: &'static str,
                finished: Option<&'static str>,
                error: Option<&'static str>| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO stripe_syncs (billing_period, created_from, created_to, started_at, finished_at, error)
                 VALUES ($1, now() - interval '40 days', now(), now() - $2::interval,
                         now() - $3::interval, $4)",
            )
            .bind(PERIOD)
            .bind(started)
            .bind(finished)
            .bind(error)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    // Finished two days ago: agreement is not claimed.
    sync("49 hours", Some("48 hours"), None).await;
    let page = page_for(&with_stripe, ops.clone(), "").await;
    assert!(page.contains("more than a day ago"), "{page}");
    assert!(page.contains("Nothing to resolve as of the last sync."));
    assert!(!page.contains(agree) && page.contains(sync_form));

    // Finished a minute ago: now it is, once.
    sync("2 minutes", Some("1 minute"), None).await;
    let page = page_for(&with_stripe, ops.clone(), "").await;
    assert_eq!(page.matches(agree).count(), 1, "{page}");
    assert!(page.contains("Last synced") && !page.contains("more than a day ago"));
    assert!(
        page.contains(">Open findings</h2>"),
        "the heading names the filter"
    );
    let all = page_for(&with_stripe, ops.clone(), "&state=all").await;
    assert!(all.contains(">All findings</h2>") && !all.contains(">Open findings"));
    assert!(!all.contains(agree), "agreement is about open findings");

    // Under way: followed, and not started twice.
    sync("10 seconds", None, None).await;
    let page = page_for(&with_stripe, ops.clone(), "").await;
    assert!(page.contains("is under way") && page.contains(r#"http-equiv="refresh""#));
    assert!(!page.contains(sync_form) && !page.contains(agree), "{page}");

    // Failed: the reason, and a sync that resumes it.
    sync("5 seconds", None, Some("Stripe answered 401")).await;
    let page = page_for(&with_stripe, ops, "").await;
    assert!(page.contains("failed after") && page.contains("Stripe answered 401"));
    assert!(page.contains("panel-error") && page.contains("again (resumes)"));
    assert!(!page.contains(agree), "{page}");
}
