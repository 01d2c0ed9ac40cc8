//! The cap as a property: random sequences of honest, retried, replayed,
//! raced, malformed and hostile calls go through the real proxy to a fake
//! Stripe that honours Idempotency-Key for 24 hours (by a clock the test
//! moves), and after every sequence:
//!
//! * Stripe took no cent over the cap;
//! * the ledger's spent equals what Stripe took for the calls it settled,
//!   and what Stripe took beyond that is still reserved (outcome unknown);
//! * nothing is left in flight, and every call left one audit row.
//!
//! `PROPTEST_CASES` sets how many sequences run (CI: 256; run it long
//! locally with e.g. `PROPTEST_CASES=5000`). A failure prints the sequence.

use std::{sync::OnceLock, time::Duration};

use axum::{
    body::Body,
    http::{Request, StatusCode},
};
use proptest::{prelude::*, test_runner::TestRunner};
use serde_json::json;
use sqlx::{postgres::PgPoolOptions, Connection, PgPool};

use crate::{fake_stripe::FakeStripe, helpers::TestApp};

/// One call of a sequence.
#[derive(Debug, Clone)]
enum Op {
    /// A charge, as a billing job sends it: Idempotency-Key `k{key}` (or
    /// none) for Stripe customer `customer`. Few keys, customers and
    /// amounts, so sequences reuse them: replays, mismatches, retries.
    Charge {
        key: Option<u8>,
        customer: Customer,
        amount: i64,
    },
    /// The same charge sent twice at once (a redelivery racing the first).
    Twins { key: u8, amount: i64 },
    /// Bytes Stripe would read another way, or over Stripe's limits.
    Hostile(Hostile),
    /// A day and an hour pass, for Vaultcap and for Stripe.
    NextDay,
}

#[derive(Debug, Clone, Copy)]
enum Customer {
    Honest(u8),
    /// Declined: Stripe saves the failure under the key.
    Declined,
    /// Fails validation: Stripe saves nothing.
    Missing,
    /// Stripe answers 500: outcome unknown.
    Failing,
    /// Stripe charges and the answer is lost: outcome unknown.
    Lost,
}

#[derive(Debug, Clone, Copy)]
enum Hostile {
    RepeatedAmount,
    Semicolon,
    NulInMetadata,
    LongIdempotencyKey,
    TwoIdempotencyKeys,
    NulKey,
}

fn op() -> impl Strategy<Value = Op> {
    let customer = prop_oneof![
        6 => (0u8..4).prop_map(Customer::Honest),
        1 => Just(Customer::Declined),
        1 => Just(Customer::Missing),
        1 => Just(Customer::Failing),
        1 => Just(Customer::Lost),
    ];
    let amount = prop_oneof![Just(100i64), Just(250), Just(400)];
    let hostile = prop_oneof![
        Just(Hostile::RepeatedAmount),
        Just(Hostile::Semicolon),
        Just(Hostile::NulInMetadata),
        Just(Hostile::LongIdempotencyKey),
        Just(Hostile::TwoIdempotencyKeys),
        Just(Hostile::NulKey),
    ];
    prop_oneof![
        10 => (proptest::option::weighted(0.8, 0u8..4), customer, amount.clone())
            .prop_map(|(key, customer, amount)| Op::Charge { key, customer, amount }),
        2 => (0u8..4, amount).prop_map(|(key, amount)| Op::Twins { key, amount }),
        2 => hostile.prop_map(Op::Hostile),
        1 => Just(Op::NextDay),
    ]
}

const CAP: i64 = 1000;

fn form(customer: Customer, amount: i64) -> String {
    let name = match customer {
        Customer::Honest(n) => format!("cus_{n}"),
        Customer::Declined => "cus_decline".into(),
        Customer::Missing => "cus_missing".into(),
        Customer::Failing => "cus_500".into(),
        Customer::Lost => "cus_lost".into(),
    };
    format!("amount={amount}&currency=usd&customer={name}")
}

fn request(key: &str, body: String, headers: &[(&str, String)]) -> Request<Body> {
    let mut request = Request::post("/v1/charges")
        .header("content-type", "application/x-www-form-urlencoded")
        .header("authorization", format!("Bearer {key}"));
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    request.body(Body::from(body)).unwrap()
}

/// Sends a call; how many calls it was.
async fn apply(app: &TestApp, stripe: &FakeStripe, pool: &PgPool, key: &str, op: &Op) -> usize {
    let idem = |n: u8| vec![("idempotency-key", format!("k{n}"))];
    match op {
        Op::Charge {
            key: idempotency,
            customer,
            amount,
        } => {
            let headers = idempotency.map(idem).unwrap_or_default();
            send(app, request(key, form(*customer, *amount), &headers)).await;
            1
        }
        Op::Twins { key: n, amount } => {
            let body = form(Customer::Honest(*n), *amount);
            let (a, b) = tokio::join!(
                send(app, request(key, body.clone(), &idem(*n))),
                send(app, request(key, body, &idem(*n)))
            );
            for status in [a, b] {
                assert!(
                    status != StatusCode::INTERNAL_SERVER_ERROR
                        && status != StatusCode::SERVICE_UNAVAILABLE,
                    "a twin failed: {status}"
                );
            }
            2
        }
        Op::Hostile(hostile) => {
            let honest = form(Customer::Honest(0), 100);
            let request = match hostile {
                Hostile::RepeatedAmount => request(key, format!("{honest}&amount=900"), &[]),
                Hostile::Semicolon => request(key, format!("{honest};amount=900"), &[]),
                Hostile::NulInMetadata => {
                    request(key, format!("{honest}&metadata%5Bcustomer_id%5D=a%00"), &[])
                }
                Hostile::LongIdempotencyKey => {
                    request(key, honest, &[("idempotency-key", "x".repeat(6000))])
                }
                Hostile::TwoIdempotencyKeys => request(
                    key,
                    honest,
                    &[
                        ("idempotency-key", "k0".to_owned()),
                        ("idempotency-key", "k1".to_owned()),
                    ],
                ),
                Hostile::NulKey => {
                    let mut request = request(key, honest, &[]);
                    request
                        .headers_mut()
                        .insert("authorization", "Basic AAAAAA==".parse().unwrap());
                    request
                }
            };
            let status = send(app, request).await;
            assert!(status.is_client_error(), "{hostile:?} answered {status}");
            1
        }
        Op::NextDay => {
            sqlx::query(
                "UPDATE reservations SET created_at = created_at - interval '25 hours',
                                         claimed_until = claimed_until - interval '25 hours'",
            )
            .execute(pool)
            .await
            .unwrap();
            stripe.advance_hours(25);
            0
        }
    }
}

async fn send(app: &TestApp, request: Request<Body>) -> StatusCode {
    tower::ServiceExt::oneshot(app.router.clone(), request)
        .await
        .unwrap()
        .status()
}

/// Runs one sequence on a fresh key in front of a fresh fake Stripe, then
/// checks the rules.
async fn check(pool: &PgPool, ops: &[Op]) -> Result<(), String> {
    let stripe = FakeStripe::start().await;
    let app = TestApp::with_upstream(pool.clone(), &stripe.base, Duration::from_millis(150));
    let token = app.api_token().await;
    let created = app
        .post_json("/vault/keys", &token, json!({
                "label": "property", "expected_total_cents": CAP, "cap_cents": CAP,
                "allowed_endpoints": ["POST /v1/charges"], "expires_at": crate::helpers::in_a_month(),
            }))
        .await
        .json();
    let key = created["vault_key"].as_str().unwrap().to_owned();
    let key_id = created["id"].as_i64().unwrap();
    // Each fake Stripe numbers its charges from 1: earlier sequences'
    // reservations would own the same ids.
    sqlx::query("DELETE FROM reservations")
        .execute(pool)
        .await
        .unwrap();
    let unattributed_before = unattributed(pool).await;
    let mut calls = 0;
    for op in ops {
        calls += apply(&app, &stripe, pool, &key, op).await;
    }

    let (taken, _) = stripe.charged();
    let (spent, reserved): (i64, i64) =
        sqlx::query_as("SELECT spent_cents, reserved_cents FROM vault_keys WHERE id = $1")
            .bind(key_id)
            .fetch_one(pool)
            .await
            .unwrap();
    let settled: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT stripe_charge_id FROM reservations WHERE vault_key_id = $1 AND state = 'settled'",
    )
    .bind(key_id)
    .fetch_all(pool)
    .await
    .unwrap();
    let settled_taken: i64 = settled
        .iter()
        .flatten()
        .filter_map(|id| stripe.amount_of(id))
        .sum();
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservations WHERE vault_key_id = $1 AND state = 'pending'",
    )
    .bind(key_id)
    .fetch_one(pool)
    .await
    .unwrap();
    let audited = audit_count(pool, key_id).await;
    let unattributed = unattributed(pool).await - unattributed_before;

    let mut broken = Vec::new();
    if taken > CAP {
        broken.push(format!("Stripe took {taken} over the cap {CAP}"));
    }
    if spent != settled_taken {
        broken.push(format!(
            "the ledger's spent {spent} is not what Stripe took for settled calls ({settled_taken})"
        ));
    }
    if taken > spent + reserved {
        broken.push(format!(
            "Stripe took {taken}, more than spent {spent} + reserved {reserved}"
        ));
    }
    if pending != 0 {
        broken.push(format!("{pending} calls left in flight"));
    }
    if audited + unattributed != calls as i64 {
        broken.push(format!(
            "{calls} calls, {audited} audit rows under the key and {unattributed} without one"
        ));
    }
    if broken.is_empty() {
        Ok(())
    } else {
        Err(broken.join("; "))
    }
}

async fn audit_count(pool: &PgPool, key_id: i64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE vault_key_id = $1")
        .bind(key_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Audit rows of calls that presented no usable key.
async fn unattributed(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE vault_key_id IS NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A database of its own for the property run, made afresh each run.
async fn database() -> PgPool {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL (scripts/test sets it)");
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    let name = "vaultcap_proxy_properties";
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.database(name))
        .await
        .unwrap();
    server::db::MIGRATOR.run(&pool).await.unwrap();
    pool
}

#[test]
fn random_sequences_of_honest_and_hostile_calls_never_break_the_cap() {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    });
    let pool = runtime.block_on(database());
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256);
    let config = ProptestConfig {
        cases,
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let outcome = runner.run(&proptest::collection::vec(op(), 1..24), |ops| {
        runtime
            .block_on(check(&pool, &ops))
            .map_err(TestCaseError::fail)
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}
