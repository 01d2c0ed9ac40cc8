//! The Stripe sync with async-stripe: against localstripe (started through
//! e2e/sdk/localstripe_launcher.py, which adds what async-stripe needs to
//! decode its charges), and against a small fake for the faults localstripe
//! cannot produce on demand (429, 500, an unreadable answer).

use std::{
    process::Stdio,
    sync::{Arc, Mutex},
};

use axum::{extract::RawQuery, http::StatusCode, response::IntoResponse, routing::get, Router};
use chrono::Utc;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};

use app::domain::BillingPeriod;
use server::reconcile::{self, sync};

const KEY: &str = "sk_test_sync";

/// localstripe on a free port, stopped when dropped.
struct Localstripe {
    base: String,
    _child: tokio::process::Child,
}

impl Localstripe {
    async fn start() -> Self {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let python = format!("{root}/target/pyenv/bin/python");
        assert!(
            std::path::Path::new(&python).exists(),
            "{python} is missing: run scripts/setup (it installs localstripe)"
        );
        let mut child = tokio::process::Command::new(python)
            .args([
                &format!("{root}/e2e/sdk/localstripe_launcher.py"),
                "--port",
                "0",
            ])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting localstripe");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("localstripe announces its port");
            if let Some(port) = line.strip_prefix("port=") {
                break port.to_owned();
            }
        };
        Self {
            base: format!("http://127.0.0.1:{port}"),
            _child: child,
        }
    }

    /// `GET path` with the key, as JSON.
    async fn get(&self, path: &str) -> Value {
        let text = reqwest::Client::new()
            .get(format!("{}{path}", self.base))
            .basic_auth(KEY, Some(""))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// A billing job's call for `customer` in this period (its metadata
    /// added to `fields`), as JSON.
    async fn bill(&self, path: &str, customer: &str, fields: &[(&str, &str)]) -> Value {
        let period = BillingPeriod::containing(Utc::now()).to_string();
        let mut form = fields.to_vec();
        form.extend([
            ("currency", "usd"),
            ("metadata[customer_id]", customer),
            ("metadata[billing_period]", period.as_str()),
        ]);
        let text = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .basic_auth(KEY, Some(""))
            .form(&form)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// A payment intent confirmed at once, the billing job's metadata on
    /// the intent (Stripe does not copy it to the charge); its charge's id.
    async fn intent(&self, customer: &str, amount: i64) -> String {
        let amount = amount.to_string();
        let fields = [
            ("amount", amount.as_str()),
            ("payment_method", "pm_card_visa"),
            ("confirm", "true"),
        ];
        let created = self.bill("/v1/payment_intents", customer, &fields).await;
        created["latest_charge"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("a confirmed intent has a charge: {created}"))
            .to_owned()
    }

    /// A charge as a billing job makes it; its id.
    async fn charge(&self, customer: &str, amount: i64) -> String {
        let amount = amount.to_string();
        let fields = [("amount", amount.as_str()), ("source", "pm_card_visa")];
        let created = self.bill("/v1/charges", customer, &fields).await;
        created["id"].as_str().expect("a charge id").to_owned()
    }
}

fn options(page_size: i64, attempts: u32) -> sync::SyncOptions {
    sync::SyncOptions {
        page_size,
        attempts,
        ..sync::SyncOptions::default()
    }
}

async fn record(pool: &PgPool, customer: &str, charge_id: &str) {
    sqlx::query(
        "INSERT INTO billing_records (customer_id, billing_period, charge_id, amount_cents)
         VALUES ($1, $2, $3, 5000)",
    )
    .bind(customer)
    .bind(BillingPeriod::containing(Utc::now()).to_string())
    .bind(charge_id)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_period_syncs_page_by_page_and_detection_finds_the_seeds_failure_modes(pool: PgPool) {
    let stripe = Localstripe::start().await;
    // ch_A + ch_B: a redelivery with a rotated idempotency key.
    let ch_a = stripe.charge("cust_1", 5000).await;
    let ch_b = stripe.charge("cust_1", 5000).await;
    // A consumer that crashed before writing its billing record.
    let orphan = stripe.charge("cust_2", 3000).await;
    let fine = stripe.charge("cust_3", 5000).await;
    record(&pool, "cust_1", &ch_a).await;
    record(&pool, "cust_3", &fine).await;
    record(&pool, "cust_4", "ch_never_made").await;

    let period = BillingPeriod::containing(Utc::now());
    let client = sync::client(&stripe.base, KEY, &options(3, 1)).unwrap();
    assert!(
        matches!(
            reconcile::detect(&pool, period).await,
            Err(reconcile::DetectError::NotSynced(_))
        ),
        "no detection before a sync: every record would look missing"
    );
    let mut seen = Vec::new();
    let synced = sync::sync_period(&pool, &client, period, &options(3, 1), |p| {
        seen.push((p.intents_seen, p.charges_seen))
    })
    .await
    .unwrap();
    assert_eq!(
        seen,
        [(0, 0), (0, 3), (0, 4)],
        "a page of (no) payment intents, then two of at most three charges"
    );
    assert!(synced.finished_at.is_some());

    let found = reconcile::detect(&pool, period).await.unwrap().findings;
    assert_eq!((found.orphaned, found.duplicate, found.missing), (1, 1, 1));
    let kinds: Vec<(String, String, Vec<String>, Option<String>)> = sqlx::query_as(
        "SELECT kind, customer_id, charge_ids, keeper_charge_id FROM reconciliation_findings ORDER BY kind",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let (kind, customer, mut charges, keeper) = kinds[0].clone();
    charges.sort();
    let mut both = vec![ch_a.clone(), ch_b];
    both.sort();
    assert_eq!(
        (kind.as_str(), customer.as_str(), charges),
        ("duplicate", "cust_1", both)
    );
    assert_eq!(keeper, Some(ch_a), "the billing record names the keeper");
    assert_eq!(
        kinds[1],
        (
            "missing".into(),
            "cust_4".into(),
            vec!["ch_never_made".into()],
            None
        )
    );
    assert_eq!(
        kinds[2],
        ("orphaned".into(), "cust_2".into(), vec![orphan], None)
    );

    // Again: the same four charges, no copies.
    sync::sync_period(&pool, &client, period, &options(100, 1), |_| {})
        .await
        .unwrap();
    let stored = crate::helpers::count(&pool, "SELECT count(*) FROM stripe_charges").await;
    assert_eq!(stored, 4);
}

/// A fake Stripe answering the charge list from `script`, one entry per
/// request: (status, body), and the payment intent list with no intents. It
/// records each charge list request's query.
async fn scripted(script: Vec<(u16, String)>) -> (String, Arc<Mutex<Vec<String>>>) {
    let script = Arc::new(Mutex::new(script.into_iter()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let no_intents =
        json!({ "object": "list", "url": "/v1/payment_intents", "has_more": false, "data": [] });
    let router = Router::new()
        .route(
            "/v1/payment_intents",
            get(move || async move { axum::Json(no_intents) }),
        )
        .route(
            "/v1/charges",
            get({
                let seen = seen.clone();
                move |RawQuery(query): RawQuery| async move {
                    seen.lock().unwrap().push(query.unwrap_or_default());
                    let (status, body) = script
                        .lock()
                        .unwrap()
                        .next()
                        .expect("no more answers scripted");
                    (
                        StatusCode::from_u16(status).unwrap(),
                        [("content-type", "application/json")],
                        body,
                    )
                        .into_response()
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    (base, seen)
}

/// A page of charges shaped like localstripe's (what async-stripe decodes).
async fn page(template: &Value, ids: &[&str], has_more: bool) -> String {
    let data: Vec<Value> = ids
        .iter()
        .map(|id| {
            let mut charge = template.clone();
            charge["id"] = json!(id);
            charge
        })
        .collect();
    json!({ "object": "list", "url": "/v1/charges", "has_more": has_more, "data": data })
        .to_string()
}

fn stripe_error(message: &str) -> String {
    json!({ "error": { "type": "api_error", "message": message } }).to_string()
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_sync_stopped_by_a_stripe_error_resumes_after_its_last_page(pool: PgPool) {
    let stripe = Localstripe::start().await;
    let id = stripe.charge("cust_1", 5000).await;
    let template = stripe.get(&format!("/v1/charges/{id}")).await;
    let (base, seen) = scripted(vec![
        (200, page(&template, &["ch_p1a", "ch_p1b"], true).await),
        (500, stripe_error("An unknown error occurred")),
        (200, "{not json".into()),
        (429, stripe_error("Too many requests")),
        (200, page(&template, &["ch_p2a"], false).await),
    ])
    .await;
    let period = BillingPeriod::containing(Utc::now());
    let client = sync::client(&base, KEY, &options(2, 1)).unwrap();

    let err = sync::sync_period(&pool, &client, period, &options(2, 1), |_| {})
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Stripe answered 500: An unknown error occurred"
    );
    let (cursor, error, pages): (Option<String>, Option<String>, i32) =
        sqlx::query_as("SELECT cursor, error, pages FROM stripe_syncs")
            .fetch_one(&pool)
            .await
            .unwrap();
    // One page of (no) payment intents, one of charges.
    assert_eq!((cursor.as_deref(), pages), (Some("ch_p1b"), 2));
    assert!(error.unwrap().contains("500"));

    let err = sync::sync_period(&pool, &client, period, &options(2, 1), |_| {})
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("Stripe's answer could not be read"),
        "{err}"
    );

    // A 429 is retried with backoff; the sync goes on from ch_p1b and ends.
    let retrying = sync::client(&base, KEY, &options(2, 3)).unwrap();
    let synced = sync::sync_period(&pool, &retrying, period, &options(2, 3), |_| {})
        .await
        .unwrap();
    assert_eq!((synced.pages, synced.charges_seen), (3, 3));
    assert!(synced.error.is_none());
    let queries = seen.lock().unwrap().clone();
    assert!(!queries[0].contains("starting_after"), "{queries:?}");
    assert!(
        queries[1..]
            .iter()
            .all(|q| q.contains("starting_after=ch_p1b")),
        "{queries:?}"
    );
    let syncs = crate::helpers::count(&pool, "SELECT count(*) FROM stripe_syncs").await;
    assert_eq!(syncs, 1, "one sync, resumed");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_refused_api_key_is_said_plainly(pool: PgPool) {
    let stripe = Localstripe::start().await;
    let client = sync::client(&stripe.base, "not_a_key", &options(10, 1)).unwrap();
    let err = sync::sync_period(
        &pool,
        &client,
        BillingPeriod::containing(Utc::now()),
        &options(10, 1),
        |_| {},
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("Stripe refused the API key (401)"),
        "{err}"
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn an_operator_syncs_a_period_from_the_console(pool: PgPool) {
    use crate::helpers::TestApp;
    use app::domain::Role;

    let stripe = Localstripe::start().await;
    let orphan = stripe.charge("cust_9", 4_900).await;
    let period = BillingPeriod::containing(Utc::now());

    let keyless = TestApp::new(pool.clone());
    let ops = keyless.signed_in("ops@example.com", Role::Operator).await;
    let refused = keyless
        .post_form(
            "/reconciliation/sync",
            &format!("period={period}"),
            Some(&ops),
        )
        .await;
    let page = keyless.get(refused.location(), Some(&ops)).await.body;
    assert!(page.contains("Vaultcap has no Stripe key"), "{page}");

    let app = TestApp::with_upstream(
        pool.clone(),
        &stripe.base,
        std::time::Duration::from_secs(5),
    );
    let started = app
        .post_form(
            "/reconciliation/sync",
            &format!("period={period}"),
            Some(&ops),
        )
        .await;
    assert_eq!(
        started.location(),
        format!("/reconciliation?period={period}")
    );
    assert!(app
        .get(started.location(), Some(&ops))
        .await
        .body
        .contains(&format!("Syncing {period} from Stripe")));

    // The sync and detection run in the background: wait for the finding.
    let found = async {
        loop {
            let charges: Option<Vec<String>> = sqlx::query_scalar(
                "SELECT charge_ids FROM reconciliation_findings WHERE kind = 'orphaned'",
            )
            .fetch_optional(&pool)
            .await
            .unwrap();
            match charges {
                Some(charges) => return charges,
                None => tokio::task::yield_now().await,
            }
        }
    };
    let charges = tokio::time::timeout(std::time::Duration::from_secs(30), found)
        .await
        .expect("the console's sync found the orphan");
    assert_eq!(charges, [orphan]);
    let page = app
        .get(&format!("/reconciliation?period={period}"), Some(&ops))
        .await
        .body;
    assert!(page.contains("Last synced"), "{page}");
    assert!(page.contains("cust_9"));
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_duplicate_is_refunded_in_stripe_once_however_often_it_is_asked(pool: PgPool) {
    use crate::helpers::{TestApp, REAL_STRIPE_KEY};
    use app::domain::Role;

    let stripe = Localstripe::start().await;
    let keeper = stripe.charge("cust_1", 5_000).await;
    let extra = stripe.charge("cust_1", 5_000).await;
    record(&pool, "cust_1", &keeper).await;
    // cust_2's second charge was already refunded by hand in Stripe's
    // dashboard after the sync saw it.
    let kept_2 = stripe.charge("cust_2", 1_000).await;
    let extra_2 = stripe.charge("cust_2", 1_000).await;
    record(&pool, "cust_2", &kept_2).await;
    let period = BillingPeriod::containing(Utc::now());
    let client = sync::client(&stripe.base, REAL_STRIPE_KEY, &options(100, 1)).unwrap();
    sync::sync_period(&pool, &client, period, &options(100, 1), |_| {})
        .await
        .unwrap();
    reconcile::detect(&pool, period).await.unwrap();
    let finding = |customer: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT id FROM reconciliation_findings WHERE kind = 'duplicate' AND customer_id = $1",
            )
            .bind(customer)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let (first, second) = (finding("cust_1").await, finding("cust_2").await);
    let http = reqwest::Client::new();
    http.post(format!("{}/v1/refunds", stripe.base))
        .basic_auth(KEY, Some(""))
        .form(&[("charge", extra_2.as_str())])
        .send()
        .await
        .unwrap();

    let app = TestApp::with_upstream(
        pool.clone(),
        &stripe.base,
        std::time::Duration::from_secs(5),
    );
    let ops = app.signed_in("ops@example.com", Role::Operator).await;
    let refund = |id: i64, body: &'static str| {
        let (app, ops) = (&app, &ops);
        async move {
            let done = app
                .post_form(&format!("/reconciliation/{id}/refund"), body, Some(ops))
                .await;
            app.get(done.location(), Some(ops)).await.body
        }
    };
    let unconfirmed = refund(first, "period=").await;
    assert!(
        unconfirmed.contains("tick the box to confirm the refund"),
        "{unconfirmed}"
    );

    let page = refund(first, "confirm=yes").await;
    assert!(
        page.contains(&format!(
            "Refunded {extra} as duplicate of {keeper} for cust_1: 50.00 USD"
        )),
        "{page}"
    );
    let charge = stripe.get(&format!("/v1/charges/{extra}")).await;
    assert_eq!(
        (
            charge["refunded"].as_bool(),
            charge["amount_refunded"].as_i64()
        ),
        (Some(true), Some(5_000))
    );
    let stored: i64 =
        sqlx::query_scalar("SELECT amount_refunded_cents FROM stripe_charges WHERE id = $1")
            .bind(&extra)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, 5_000, "re-read from Stripe after the refund");

    let again = refund(first, "confirm=yes").await;
    assert!(
        again.contains(&format!(
            "finding #{first} was already refunded by ops@example.com"
        )),
        "{again}"
    );
    // The charge refunded by hand counts as done; nothing is refunded twice.
    let page = refund(second, "confirm=yes").await;
    assert!(page.contains(&format!("Refunded {extra_2}")), "{page}");
    let refunds = stripe.get("/v1/refunds?limit=100").await;
    assert_eq!(
        refunds["data"].as_array().unwrap().len(),
        2,
        "one refund per extra charge"
    );
    // The next detection finds nothing left to refund.
    let found = reconcile::detect(&pool, period).await;
    assert!(found.is_ok());
    let open = crate::helpers::count(
        &pool,
        "SELECT count(*) FROM reconciliation_findings WHERE resolved_at IS NULL",
    )
    .await;
    assert_eq!(open, 0);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_bulk_refund_refunds_every_previewed_duplicate_in_stripe(pool: PgPool) {
    use crate::helpers::{enc, TestApp, REAL_STRIPE_KEY};
    use app::domain::Role;

    let stripe = Localstripe::start().await;
    let mut extras = Vec::new();
    for (customer, cents) in [("cust_1", 5_000), ("cust_2", 1_000)] {
        let keeper = stripe.charge(customer, cents).await;
        extras.push(stripe.charge(customer, cents).await);
        record(&pool, customer, &keeper).await;
    }
    let period = BillingPeriod::containing(Utc::now());
    let client = sync::client(&stripe.base, REAL_STRIPE_KEY, &options(100, 1)).unwrap();
    sync::sync_period(&pool, &client, period, &options(100, 1), |_| {})
        .await
        .unwrap();
    reconcile::detect(&pool, period).await.unwrap();

    let app = TestApp::with_upstream(
        pool.clone(),
        &stripe.base,
        std::time::Duration::from_secs(5),
    );
    let ops = app.signed_in("ops@example.com", Role::Operator).await;
    let preview = app
        .get(
            &format!("/reconciliation/bulk?period={period}&kind=duplicate&action=refund"),
            Some(&ops),
        )
        .await
        .body;
    assert!(
        preview.contains(r#"data-testid="bulk-total">60.00 USD<"#),
        "{preview}"
    );
    assert!(preview.contains("Yes, refund 60.00 USD to 2 customers"));
    let ids = preview
        .split(r#"name="ids" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();

    let done = app
        .post_form(
            "/reconciliation/bulk",
            &format!(
                "action=refund&period={period}&kind=duplicate&ids={}&confirm=yes",
                enc(&ids)
            ),
            Some(&ops),
        )
        .await;
    let notice = app.notice(done.location(), &ops).await;
    assert_eq!(notice, "Refunded 2 of 2 findings: 60.00 USD.");
    for extra in &extras {
        let charge = stripe.get(&format!("/v1/charges/{extra}")).await;
        assert_eq!(charge["refunded"], true, "{charge}");
    }
    let refunds = stripe.get("/v1/refunds?limit=100").await;
    assert_eq!(refunds["data"].as_array().unwrap().len(), 2);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_charge_made_through_a_payment_intent_is_attributed_through_the_intent(pool: PgPool) {
    let stripe = Localstripe::start().await;
    let charge = stripe.intent("cust_pi", 2_500).await;
    let bare = stripe.get(&format!("/v1/charges/{charge}")).await;
    assert_eq!(
        bare["metadata"],
        json!({}),
        "Stripe keeps the metadata on the intent"
    );
    let period = BillingPeriod::containing(Utc::now());
    let client = sync::client(&stripe.base, KEY, &options(100, 1)).unwrap();
    let synced = sync::sync_period(&pool, &client, period, &options(100, 1), |_| {})
        .await
        .unwrap();
    assert_eq!((synced.intents_seen, synced.charges_seen), (1, 1));

    let stored: (Option<String>, Option<String>, Option<String>) = sqlx::query_as(
        "SELECT c.customer_id, c.billing_period, i.latest_charge
         FROM stripe_charges c JOIN stripe_payment_intents i ON i.id = c.payment_intent WHERE c.id = $1",
    )
    .bind(&charge)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        stored,
        (
            Some("cust_pi".into()),
            Some(period.to_string()),
            Some(charge.clone())
        )
    );
    // No billing record: the intent's charge is an orphan of its customer.
    reconcile::detect(&pool, period).await.unwrap();
    let orphan: Vec<String> = sqlx::query_scalar(
        "SELECT customer_id FROM reconciliation_findings WHERE kind = 'orphaned'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(orphan, ["cust_pi"]);
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_sync_that_fails_in_the_background_is_in_the_action_log(pool: PgPool) {
    use crate::helpers::TestApp;
    use app::domain::Role;

    let refusal = json!({ "error": { "type": "invalid_request_error", "message": "No such key" } });
    let (base, _) = scripted(vec![(400, refusal.to_string())]).await;
    let app = TestApp::with_upstream(pool.clone(), &base, std::time::Duration::from_secs(5));
    let ops = app.signed_in("ops@example.com", Role::Operator).await;
    let period = BillingPeriod::containing(Utc::now());
    let started = app
        .post_form(
            "/reconciliation/sync",
            &format!("period={period}"),
            Some(&ops),
        )
        .await;
    assert_eq!(started.status, StatusCode::SEE_OTHER);

    // The sync runs in the background: wait for its failure to be logged.
    let logged = async {
        loop {
            let row: Option<(String, Value)> = sqlx::query_as(
                "SELECT subject_id, details FROM operator_actions WHERE action = 'reconcile.sync_failed'",
            )
            .fetch_optional(&pool)
            .await
            .unwrap();
            match row {
                Some(row) => return row,
                None => tokio::task::yield_now().await,
            }
        }
    };
    let (subject, details) = tokio::time::timeout(std::time::Duration::from_secs(30), logged)
        .await
        .expect("the failed sync is in the action log");
    assert_eq!(subject, period.to_string());
    assert_eq!(details["step"], "the sync from Stripe");
    assert!(
        details["error"].as_str().unwrap().contains("No such key"),
        "{details}"
    );
}
