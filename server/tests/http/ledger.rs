//! The proxy's grouped ledger writer: settlements and reservations waiting
//! together commit together, one call's bad row never costs the calls
//! written beside it, and a full reservation queue turns new calls away
//! before anything is reserved.

use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use app::{
    audit::sql::AuditEntry,
    domain::Decision,
    keys::spend::{CallRecord, ReserveCall, Reserved},
};
use server::proxy::{Ledger, LedgerError};

use crate::{
    helpers::{until_one_waits_on_a_lock, TestApp},
    proxy::proxy_with_key,
};

fn refused_call(message: &str) -> CallRecord {
    CallRecord {
        entry: AuditEntry {
            decision: Decision::RefusedUnknownKey,
            message: Some(message.into()),
            latency_ms: 1,
            ..AuditEntry::received("POST", "/v1/charges")
        },
        reservation_id: None,
        settlement: None,
        duplicate_of: None,
        release: None,
    }
}

fn reserve_call(key: i64, n: usize) -> ReserveCall {
    ReserveCall {
        key: app::domain::VaultKeyId(key),
        request: Uuid::new_v4(),
        amount: app::domain::Cents(100),
        idempotency_key: Some(format!("k{n}")),
        fingerprint: hex_of(n),
        method: "POST".into(),
        path: "/v1/charges".into(),
        stripe_customer: None,
        metadata_customer_id: None,
        billing_period: "2026-07".parse().unwrap(),
        currency: app::domain::Currency::usd(),
        payment_intent: None,
        request_body: Some("amount=100&currency=usd".into()),
        stripe_version: None,
        lease_secs: 60,
    }
}

/// A key's spent and reserved cents.
async fn counters(pool: &PgPool, key: i64) -> (i64, i64) {
    sqlx::query_as("SELECT spent_cents, reserved_cents FROM vault_keys WHERE id = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn hex_of(n: usize) -> String {
    format!("{n:064x}")
}

/// Locks key `key` in a transaction of the test's, then sends a call on it
/// and waits until a writer is stuck behind the lock (until the transaction
/// ends).
async fn reserve_behind_a_lock(
    pool: &PgPool,
    ledger: &Ledger,
    key: i64,
) -> (
    sqlx::Transaction<'static, sqlx::Postgres>,
    tokio::task::JoinHandle<Result<Reserved, LedgerError>>,
) {
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM vault_keys WHERE id = $1 FOR UPDATE")
        .bind(key)
        .execute(&mut *lock)
        .await
        .unwrap();
    let call = tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.reserve(reserve_call(key, 1)).await }
    });
    until_one_waits_on_a_lock(pool).await;
    (lock, call)
}

/// A key beside `proxy_with_key`'s, made through the key API.
async fn another_key(app: &TestApp, cap_cents: i64) -> i64 {
    let token = app.api_token().await;
    let body = json!({
        "label": "another run", "expected_total_cents": cap_cents, "cap_cents": cap_cents,
        "allowed_endpoints": ["POST /v1/charges"], "expires_at": crate::helpers::in_a_month(),
    });
    let created = app.post_json("/vault/keys", &token, body).await;
    created.json()["id"].as_i64().unwrap()
}

/// Lets every spawned task run up to its next wait.
async fn let_tasks_queue() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_batch_with_one_bad_row_is_written_again_call_by_call(pool: PgPool) {
    let ledger = Ledger::start(&pool, 64);
    // Hold the writer on its first call so the next ten wait as one batch.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE audit_log IN EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let first = tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.record(refused_call("first")).await }
    });
    until_one_waits_on_a_lock(&pool).await;
    let mut batch = Vec::new();
    for n in 0..10 {
        let ledger = ledger.clone();
        // PostgreSQL's text holds no NUL: this row fails, alone.
        let message = if n == 5 {
            "bad\0row".to_owned()
        } else {
            format!("call {n}")
        };
        batch.push(tokio::spawn(async move {
            ledger.record(refused_call(&message)).await
        }));
    }
    let_tasks_queue().await;
    lock.commit().await.unwrap();

    assert!(first.await.unwrap().is_ok());
    let mut failed = Vec::new();
    for (n, call) in batch.into_iter().enumerate() {
        if call.await.unwrap().is_err() {
            failed.push(n);
        }
    }
    assert_eq!(failed, [5], "only the bad call fails");
    let rows = crate::helpers::count(&pool, "SELECT count(*) FROM audit_log").await;
    assert_eq!(rows, 10, "the first and the nine good ones");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_full_reservation_queue_turns_new_calls_away_before_reserving(pool: PgPool) {
    let (_app, _stripe, _key, key_id) = proxy_with_key(pool.clone(), 1_000_000).await;
    let ledger = Ledger::start(&pool, 1);
    let (lock, writing) = reserve_behind_a_lock(&pool, &ledger, key_id).await;
    let queued = tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.reserve(reserve_call(key_id, 2)).await }
    });
    let_tasks_queue().await;
    let turned_away = ledger.reserve(reserve_call(key_id, 3)).await;
    assert!(
        matches!(turned_away, Err(LedgerError::Overloaded)),
        "{turned_away:?}"
    );
    lock.commit().await.unwrap();
    for call in [writing, queued] {
        assert!(matches!(call.await.unwrap(), Ok(Reserved::New { .. })));
    }
    let reserved: i64 = sqlx::query_scalar("SELECT reserved_cents FROM vault_keys WHERE id = $1")
        .bind(key_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(reserved, 200, "the turned-away call reserved nothing");
}

/// Holds the writer on a reservation for `key` behind a lock, queues
/// `records` and a second reservation for `key` behind it, and lets them
/// go: they are written as one batch. The records' and the reservation's
/// outcomes.
async fn record_beside_a_reservation(
    pool: &PgPool,
    key: i64,
    records: Vec<CallRecord>,
) -> (Vec<Result<(), LedgerError>>, Result<Reserved, LedgerError>) {
    let ledger = Ledger::start(pool, 64);
    let (lock, first) = reserve_behind_a_lock(pool, &ledger, key).await;
    let recorded: Vec<_> = records
        .into_iter()
        .map(|record| {
            let ledger = ledger.clone();
            tokio::spawn(async move { ledger.record(record).await })
        })
        .collect();
    let reserved = tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.reserve(reserve_call(key, 2)).await }
    });
    let_tasks_queue().await;
    lock.commit().await.unwrap();
    assert!(matches!(first.await.unwrap(), Ok(Reserved::New { .. })));
    let mut outcomes = Vec::new();
    for record in recorded {
        outcomes.push(record.await.unwrap());
    }
    (outcomes, reserved.await.unwrap())
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn settlements_and_reservations_waiting_together_commit_in_one_transaction(pool: PgPool) {
    let (_app, _stripe, _key, key) = proxy_with_key(pool.clone(), 1_000_000).await;
    let (recorded, reserved) =
        record_beside_a_reservation(&pool, key, vec![refused_call("beside")]).await;
    assert!(recorded.iter().all(Result::is_ok), "{recorded:?}");
    assert!(matches!(reserved, Ok(Reserved::New { .. })), "{reserved:?}");

    let (audited_in, reserved_in): (String, String) = sqlx::query_as(
        "SELECT (SELECT xmin::text FROM audit_log WHERE message = 'beside'),
                (SELECT xmin::text FROM reservations WHERE idempotency_key = 'k2')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(audited_in, reserved_in, "one transaction wrote both");
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_bad_audit_row_costs_the_reservation_beside_it_nothing(pool: PgPool) {
    let (_app, _stripe, _key, key) = proxy_with_key(pool.clone(), 1_000_000).await;
    // PostgreSQL's text holds no NUL: this row fails, alone.
    let records = vec![refused_call("good"), refused_call("bad\0row")];
    let (recorded, reserved) = record_beside_a_reservation(&pool, key, records).await;
    assert!(recorded[0].is_ok(), "{:?}", recorded[0]);
    assert!(recorded[1].is_err(), "the bad row fails");
    assert!(matches!(reserved, Ok(Reserved::New { .. })), "{reserved:?}");
    let (rows, reservations) = (
        crate::helpers::count(&pool, "SELECT count(*) FROM audit_log").await,
        crate::helpers::count(&pool, "SELECT count(*) FROM reservations").await,
    );
    assert_eq!(
        (rows, reservations),
        (1, 2),
        "the good row and both reservations"
    );
}

/// Another instance's transaction that takes the audit chain's head and
/// then the key, while this instance's writer settles the key and then
/// appends to the chain: PostgreSQL breaks the deadlock by rolling one of
/// them back. Ours is written again, not lost: with three instances behind
/// a balancer a refused call's audit row was lost this way ("deadlock
/// detected") while its client had its answer.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_write_rolled_back_to_break_a_deadlock_is_written_again(pool: PgPool) {
    use app::keys::spend::Settlement;

    let (_app, _stripe, _key, key) = proxy_with_key(pool.clone(), 1_000_000).await;
    let ledger = Ledger::start(&pool, 64);
    let Ok(Reserved::New { reservation_id, .. }) = ledger.reserve(reserve_call(key, 1)).await
    else {
        panic!("reserved");
    };

    // The other transaction: the chain's head first (an audit row of its
    // own), and a longer deadlock_timeout, so that PostgreSQL picks ours to
    // roll back.
    let mut other = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL deadlock_timeout = '30s'")
        .execute(&mut *other)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO audit_log (request_id, method, path, decision)
         VALUES (gen_random_uuid(), 'POST', '/v1/charges', 'refused_unknown_key')",
    )
    .execute(&mut *other)
    .await
    .unwrap();

    let settled = tokio::spawn({
        let ledger = ledger.clone();
        let mut record = refused_call("settled behind the other transaction");
        record.entry.decision = Decision::Allowed;
        record.entry.vault_key_id = Some(app::domain::VaultKeyId(key));
        record.reservation_id = Some(reservation_id);
        record.settlement = Some(Settlement::Spent);
        record.entry.stripe_object_id = Some("ch_deadlocked".into());
        async move { ledger.record(record).await }
    });
    // Ours holds the key and waits for the chain's head; the other now
    // asks for the key: a deadlock.
    until_one_waits_on_a_lock(&pool).await;
    sqlx::query("SELECT 1 FROM vault_keys WHERE id = $1 FOR UPDATE")
        .bind(key)
        .execute(&mut *other)
        .await
        .unwrap();
    other.commit().await.unwrap();

    settled.await.unwrap().unwrap();
    let (state, audited): (String, i64) = sqlx::query_as(
        "SELECT r.state, (SELECT count(*) FROM audit_log WHERE stripe_object_id = 'ch_deadlocked')
         FROM reservations r WHERE r.id = $1",
    )
    .bind(reservation_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((state.as_str(), audited), ("settled", 1));
}

/// A batch of plain calls is reserved in one statement (reserve_spend_many's
/// short way); one call that is not plain sends the batch call by call. Both
/// meter what calls made one at a time would: the same outcomes in order,
/// the key's counters, and each threshold alert once, at the call that
/// crossed it.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_batch_reserved_at_once_meters_as_calls_one_by_one(pool: PgPool) {
    use app::keys::spend::reserve_many;

    let (_app, _stripe, _key, key) = proxy_with_key(pool.clone(), 1_250).await;
    sqlx::query("UPDATE vault_keys SET alert_thresholds_pct = '{50,90}' WHERE id = $1")
        .bind(key)
        .execute(&pool)
        .await
        .unwrap();
    let reserved = |outcomes: &[Reserved]| {
        outcomes
            .iter()
            .map(|outcome| matches!(outcome, Reserved::New { .. }))
            .collect::<Vec<_>>()
    };

    // Ten plain calls of 100: the short way.
    let plain: Vec<ReserveCall> = (0..10).map(|n| reserve_call(key, n)).collect();
    let outcomes = reserve_many(&pool, &plain).await.unwrap();
    assert_eq!(reserved(&outcomes), [true; 10]);
    let ids: std::collections::BTreeSet<i64> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            Reserved::New { reservation_id, .. } => Some(*reservation_id),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 10, "a reservation of its own for each call");
    assert_eq!(counters(&pool, key).await, (0, 1_000));
    let alerts: Vec<(i16, i64)> = sqlx::query_as(
        "SELECT threshold_pct, committed_cents FROM alerts
         WHERE vault_key_id = $1 AND kind = 'threshold' ORDER BY threshold_pct",
    )
    .bind(key)
    .fetch_all(&pool)
    .await
    .unwrap();
    // 50 % of 1,250 is 625: crossed by the seventh call (700); 90 % (1,125)
    // by none.
    assert_eq!(alerts, [(50, 700)]);

    // Three more: 250 cents are left, so the batch is not plain. The first
    // two fit, the third is over the cap; the twin of a call already
    // reserved is in flight.
    let mut mixed: Vec<ReserveCall> = (10..13).map(|n| reserve_call(key, n)).collect();
    mixed.push(reserve_call(key, 3));
    let outcomes = reserve_many(&pool, &mixed).await.unwrap();
    assert_eq!(reserved(&outcomes), [true, true, false, false]);
    assert!(
        matches!(outcomes[2], Reserved::OverCap { .. }),
        "{:?}",
        outcomes[2]
    );
    assert_eq!(outcomes[3], Reserved::InFlight);
    assert_eq!(counters(&pool, key).await, (0, 1_200));
    let crossed = crate::helpers::count(
        &pool,
        &format!(
            "SELECT count(*) FROM alerts WHERE vault_key_id = {key} AND kind = 'threshold' \
             AND threshold_pct = 90 AND committed_cents = 1200"
        ),
    )
    .await;
    assert_eq!(crossed, 1, "90 % crossed once, by the call that took 1,200");
}

/// Twins in one batch (one key, one Idempotency-Key, sent twice at once)
/// are answered as one by one: the first is reserved, the later one is in
/// flight, or a mismatch when its parameters differ; only the first counts.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn twins_in_one_batch_are_answered_as_one_by_one(pool: PgPool) {
    use app::keys::spend::reserve_many;

    let (_app, _stripe, _key, key) = proxy_with_key(pool.clone(), 1_250).await;
    let other_parameters = ReserveCall {
        fingerprint: hex_of(99),
        ..reserve_call(key, 1)
    };
    let batch = [
        reserve_call(key, 0),
        reserve_call(key, 0),
        reserve_call(key, 1),
        other_parameters,
        reserve_call(key, 2),
        reserve_call(key, 0),
    ];
    let outcomes = reserve_many(&pool, &batch).await.unwrap();
    let first = |outcome: &Reserved| match outcome {
        Reserved::New { reservation_id, .. } => *reservation_id,
        other => panic!("{other:?}"),
    };
    let ids = [
        first(&outcomes[0]),
        first(&outcomes[2]),
        first(&outcomes[4]),
    ];
    assert_eq!(outcomes[1], Reserved::InFlight);
    assert_eq!(outcomes[3], Reserved::IdempotencyMismatch);
    assert_eq!(outcomes[5], Reserved::InFlight);
    let held: Vec<(i64, String)> = sqlx::query_as(
        "SELECT id, idempotency_key FROM reservations WHERE vault_key_id = $1 ORDER BY id",
    )
    .bind(key)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        held,
        [
            (ids[0], "k0".into()),
            (ids[1], "k1".into()),
            (ids[2], "k2".into())
        ]
    );
    assert_eq!(
        counters(&pool, key).await,
        (0, 300),
        "the twins reserve nothing"
    );
}

/// A batch over several keys with calls that are not plain is answered as
/// its calls one by one in key order: a twin in flight on one key, a
/// customer and period named on two keys guarded against duplicates (the
/// later key's call is the duplicate), plain calls beside them.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_mixed_batch_over_several_keys_meters_as_calls_one_by_one(pool: PgPool) {
    use app::keys::spend::reserve_many;

    let (app, _stripe, _key, first) = proxy_with_key(pool.clone(), 1_250).await;
    let second = another_key(&app, 1_000).await;
    let third = another_key(&app, 1_000).await;
    let fourth = another_key(&app, 1_000).await;
    sqlx::query("UPDATE vault_keys SET duplicate_policy = 'block' WHERE id = ANY ($1)")
        .bind([third, fourth])
        .execute(&pool)
        .await
        .unwrap();
    let for_customer = |key: i64, n: usize| ReserveCall {
        metadata_customer_id: Some("cust_shared".into()),
        ..reserve_call(key, n)
    };
    let batch = [
        reserve_call(first, 0),
        reserve_call(first, 0),
        reserve_call(second, 1),
        for_customer(fourth, 2),
        reserve_call(second, 3),
        for_customer(third, 4),
        reserve_call(first, 5),
    ];
    let outcomes = reserve_many(&pool, &batch).await.unwrap();
    let new = |outcome: &Reserved| matches!(outcome, Reserved::New { .. });
    assert!(new(&outcomes[0]), "{:?}", outcomes[0]);
    assert_eq!(outcomes[1], Reserved::InFlight, "the twin of the first");
    assert!(new(&outcomes[2]) && new(&outcomes[4]) && new(&outcomes[6]));
    // In key order the third key's call comes first: the fourth's is the
    // customer's second charge in the period.
    assert!(new(&outcomes[5]), "{:?}", outcomes[5]);
    assert!(
        matches!(&outcomes[3], Reserved::Duplicate { earlier_charge: None, earlier_state }
                 if earlier_state == "pending"),
        "{:?}",
        outcomes[3]
    );
    let reserved: Vec<(i64, i64)> =
        sqlx::query_as("SELECT id, reserved_cents FROM vault_keys WHERE id = ANY ($1) ORDER BY id")
            .bind([first, second, third, fourth])
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        reserved,
        [(first, 200), (second, 200), (third, 100), (fourth, 0)]
    );
}

/// Written with settlements (record_and_reserve, which locks every key of
/// the batch once for both halves), reservations take the same short and
/// long ways as alone: a plain batch at once, a batch with one call over
/// the cap or in flight call by call, and the settlement beside them moves
/// its amount from reserved to spent either way.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn reservations_written_with_settlements_meter_as_alone(pool: PgPool) {
    use app::keys::spend::{record_and_reserve, Settlement};

    let (_app, _stripe, _key, key) = proxy_with_key(pool.clone(), 1_250).await;
    let settled = |reservation_id: i64| CallRecord {
        entry: AuditEntry {
            vault_key_id: Some(app::domain::VaultKeyId(key)),
            decision: Decision::Allowed,
            upstream_status: Some(200),
            stripe_object_id: Some(format!("ch_{reservation_id}")),
            latency_ms: 1,
            ..AuditEntry::received("POST", "/v1/charges")
        },
        reservation_id: Some(reservation_id),
        settlement: Some(Settlement::Spent),
        duplicate_of: None,
        release: None,
    };
    let new_id = |outcome: &Reserved| match outcome {
        Reserved::New { reservation_id, .. } => *reservation_id,
        other => panic!("{other:?}"),
    };

    // Ten plain calls of 100, nothing to settle yet: the short way.
    let plain: Vec<ReserveCall> = (0..10).map(|n| reserve_call(key, n)).collect();
    let outcomes = record_and_reserve(&pool, &[], &plain).await.unwrap();
    let ids: Vec<i64> = outcomes.iter().map(new_id).collect();
    assert_eq!(counters(&pool, key).await, (0, 1_000));

    // The first settles; beside it three more calls and the twin of the
    // fourth. 250 cents are left: the first two fit, the third is over the
    // cap, the twin is in flight.
    let mut mixed: Vec<ReserveCall> = (10..13).map(|n| reserve_call(key, n)).collect();
    mixed.push(reserve_call(key, 3));
    let outcomes = record_and_reserve(&pool, &[settled(ids[0])], &mixed)
        .await
        .unwrap();
    new_id(&outcomes[0]);
    new_id(&outcomes[1]);
    assert!(
        matches!(outcomes[2], Reserved::OverCap { .. }),
        "{:?}",
        outcomes[2]
    );
    assert_eq!(outcomes[3], Reserved::InFlight);
    assert_eq!(counters(&pool, key).await, (100, 1_100));

    // Two more settle beside a plain call of the 50 cents left.
    let last = ReserveCall {
        amount: app::domain::Cents(50),
        ..reserve_call(key, 20)
    };
    let outcomes = record_and_reserve(&pool, &[settled(ids[1]), settled(ids[2])], &[last])
        .await
        .unwrap();
    new_id(&outcomes[0]);
    assert_eq!(counters(&pool, key).await, (300, 950));
    let audited = crate::helpers::count(
        &pool,
        &format!(
            "SELECT count(*) FROM audit_log WHERE vault_key_id = {key} AND decision = 'allowed'"
        ),
    )
    .await;
    assert_eq!(audited, 3, "one audit row per settled call");
}

/// Stripe answers the same Idempotency-Key and parameters with the same
/// charge, so two keys on one account can both be told `ch_same`. Settled
/// in one batch, the charge is bound to the first reservation in key order
/// (as call by call) and the batch is not refused for it: one such pair
/// must not send a whole batch the slow way.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn one_charge_answered_to_two_keys_settles_both_in_one_batch(pool: PgPool) {
    use app::keys::spend::{record_many, reserve_many, Settlement};

    let (app, _stripe, _key, first) = proxy_with_key(pool.clone(), 1_000).await;
    let second = another_key(&app, 1_000).await;
    let mut reservations = Vec::new();
    for key in [second, first] {
        let outcome = reserve_many(&pool, &[reserve_call(key, 1)]).await.unwrap();
        let [Reserved::New { reservation_id, .. }] = outcome[..] else {
            panic!("{outcome:?}");
        };
        reservations.push((key, reservation_id));
    }
    let settled: Vec<CallRecord> = reservations
        .iter()
        .map(|&(key, reservation)| CallRecord {
            entry: AuditEntry {
                vault_key_id: Some(app::domain::VaultKeyId(key)),
                decision: Decision::Allowed,
                upstream_status: Some(200),
                stripe_object_id: Some("ch_same".into()),
                latency_ms: 1,
                ..AuditEntry::received("POST", "/v1/charges")
            },
            reservation_id: Some(reservation),
            settlement: Some(Settlement::Spent),
            duplicate_of: None,
            release: None,
        })
        .collect();

    record_many(&pool, &settled).await.unwrap();

    let states: Vec<(i64, String, Option<String>, i64)> = sqlx::query_as(
        "SELECT r.vault_key_id, r.state, r.stripe_charge_id, k.spent_cents
         FROM reservations r JOIN vault_keys k ON k.id = r.vault_key_id ORDER BY r.vault_key_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        states,
        [
            (first, "settled".into(), Some("ch_same".into()), 100),
            (second, "settled".into(), None, 100),
        ]
    );
}

/// A settlement alone is written by statements of its own (migration 33),
/// a batch by the set-based ones, and every way a call can end leaves the
/// same books either way. Each key gets the same five calls: one Stripe
/// charged, one it declined, one whose outcome nobody knows, one told a
/// charge another call already holds, one answered with a payment intent;
/// then a late record for the first call, no longer pending; then a retry
/// of the unknown one, which Stripe answers with the charge it holds.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_settlement_alone_ends_as_in_a_batch(pool: PgPool) {
    use app::keys::spend::{record_many, reserve_many, Settlement};

    let (app, _stripe, _key, alone) = proxy_with_key(pool.clone(), 1_000).await;
    let batched = another_key(&app, 1_000).await;
    let mut books = Vec::new();
    for (key, tag) in [(alone, "alone"), (batched, "batched")] {
        let mut ids = Vec::new();
        for n in 0..5 {
            let outcome = reserve_many(&pool, &[reserve_call(key, n)]).await.unwrap();
            let [Reserved::New { reservation_id, .. }] = outcome[..] else {
                panic!("{outcome:?}");
            };
            ids.push(reservation_id);
        }
        let record =
            |reservation: i64, settlement: Settlement, object: Option<String>| CallRecord {
                entry: AuditEntry {
                    vault_key_id: Some(app::domain::VaultKeyId(key)),
                    decision: Decision::Allowed,
                    upstream_status: Some(match settlement {
                        Settlement::Released => 402,
                        _ => 200,
                    }),
                    stripe_object_id: object,
                    latency_ms: 1,
                    ..AuditEntry::received("POST", "/v1/charges")
                },
                reservation_id: Some(reservation),
                settlement: Some(settlement),
                duplicate_of: None,
                release: None,
            };
        let charge = format!("ch_{tag}");
        let records = [
            record(ids[0], Settlement::Spent, Some(charge.clone())),
            record(ids[1], Settlement::Released, None),
            record(
                ids[2],
                Settlement::Unknown,
                Some(format!("ch_{tag}_unknown")),
            ),
            record(ids[3], Settlement::Spent, Some(charge.clone())),
            record(ids[4], Settlement::Spent, Some(format!("pi_{tag}"))),
            record(ids[0], Settlement::Released, Some(charge)),
        ];
        if key == alone {
            for call in &records {
                record_many(&pool, std::slice::from_ref(call))
                    .await
                    .unwrap();
            }
        } else {
            record_many(&pool, &records[..3]).await.unwrap();
            record_many(&pool, &records[3..]).await.unwrap();
        }
        let settled = books_of(&pool, key, tag).await;

        // A retry of the unknown call (same Idempotency-Key and parameters)
        // reopens its reservation, and Stripe's answer names the charge the
        // reservation already holds. The batch beside it: a refused call.
        let retry = reserve_many(&pool, &[reserve_call(key, 2)]).await.unwrap();
        assert_eq!(
            retry,
            [Reserved::RetryUnknown {
                reservation_id: ids[2]
            }]
        );
        let answered = record(ids[2], Settlement::Spent, Some(format!("ch_{tag}_unknown")));
        if key == alone {
            record_many(&pool, &[answered]).await.unwrap();
        } else {
            record_many(&pool, &[answered, refused_call("beside the retry")])
                .await
                .unwrap();
        }
        books.push((settled, books_of(&pool, key, tag).await));
    }

    let text = |s: &str| Some(s.to_owned());
    let settled = |unknown: (&str, i64, i64), audited| {
        (
            vec![
                ("settled".to_owned(), text("ch_*"), None),
                ("released".to_owned(), None, None),
                (unknown.0.to_owned(), text("ch_*_unknown"), None),
                // ch_* is the first call's: this one is spent, bound to nothing.
                ("settled".to_owned(), None, None),
                ("settled".to_owned(), text("pi_*"), text("pi_*")),
            ],
            (unknown.1, unknown.2),
            audited,
        )
    };
    let expected = (
        // Spent: three calls of 100; reserved: the unknown one.
        settled(("outcome_unknown", 300, 100), 6),
        // The retry settles it, keeping its charge: all four spent.
        settled(("settled", 400, 0), 7),
    );
    assert_eq!(books[0], expected, "alone");
    assert_eq!(books[1], expected, "in batches");
}

/// A key's reservations in the order they were made (state, charge and
/// payment intent, with `tag` written `*`), its spent and reserved cents,
/// and its audit rows.
async fn books_of(
    pool: &PgPool,
    key: i64,
    tag: &str,
) -> (
    Vec<(String, Option<String>, Option<String>)>,
    (i64, i64),
    i64,
) {
    let reservations = sqlx::query_as(
        "SELECT state, replace(stripe_charge_id, $2, '*'), replace(payment_intent, $2, '*')
         FROM reservations WHERE vault_key_id = $1 ORDER BY id",
    )
    .bind(key)
    .bind(tag)
    .fetch_all(pool)
    .await
    .unwrap();
    let audited = crate::helpers::count(
        pool,
        &format!("SELECT count(*) FROM audit_log WHERE vault_key_id = {key}"),
    )
    .await;
    (reservations, counters(pool, key).await, audited)
}

/// A settled call flagged as a duplicate opens a finding only when it held
/// a reservation, as it always did: an audit row alone claims no charge.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_flagged_duplicate_without_a_reservation_opens_no_finding(pool: PgPool) {
    use app::keys::spend::{record_many, Settlement};

    let (_app, _stripe, _key, key) = proxy_with_key(pool.clone(), 1_000).await;
    let unreserved = CallRecord {
        entry: AuditEntry {
            vault_key_id: Some(app::domain::VaultKeyId(key)),
            decision: Decision::Allowed,
            stripe_object_id: Some("ch_second".into()),
            metadata_customer_id: Some("cust-1".into()),
            billing_period: Some("2026-07".parse().unwrap()),
            amount_cents: Some(app::domain::Cents(100)),
            currency: Some("usd".into()),
            latency_ms: 1,
            ..AuditEntry::received("POST", "/v1/charges")
        },
        reservation_id: None,
        settlement: Some(Settlement::Spent),
        duplicate_of: Some("ch_first".into()),
        release: None,
    };
    record_many(&pool, &[unreserved]).await.unwrap();
    let findings =
        crate::helpers::count(&pool, "SELECT count(*) FROM reconciliation_findings").await;
    assert_eq!(findings, 0);
}

/// An audit row's foreign key takes a KEY SHARE lock on its vault key. A
/// reservation refused over the cap must not lock keys any harder than a
/// plain one does: FOR UPDATE waited for such rows in the order they were
/// written, not key order, and deadlocked with their writer.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn calls_refused_over_the_cap_do_not_wait_for_audit_rows_of_their_keys(pool: PgPool) {
    use app::keys::spend::reserve_many;

    let (app, _stripe, _key, low) = proxy_with_key(pool.clone(), 50).await;
    let high = another_key(&app, 50).await;
    let mut writing = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO audit_log (request_id, vault_key_id, method, path, decision)
         VALUES (gen_random_uuid(), $1, 'POST', '/v1/charges', 'allowed')",
    )
    .bind(high)
    .execute(&mut *writing)
    .await
    .unwrap();

    // Both calls are over their caps: the long way, key by key. (The bound
    // only turns a hang into a failure.)
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        reserve_many(&pool, &[reserve_call(low, 1), reserve_call(high, 2)]),
    )
    .await
    .expect("the reservation waited for an audit row's transaction")
    .unwrap();
    assert!(
        refused
            .iter()
            .all(|outcome| matches!(outcome, Reserved::OverCap { .. })),
        "{refused:?}"
    );
    writing.commit().await.unwrap();
}
