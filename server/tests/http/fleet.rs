//! Settings the instances over one database share (`server::fleet`).

use serde_json::json;
use server::fleet::{agree, AgreeError};
use sqlx::PgPool;

async fn fleet_value(pool: &PgPool, flag: &str) -> serde_json::Value {
    sqlx::query_scalar("SELECT value FROM fleet_settings WHERE flag = $1")
        .bind(flag)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_first_instance_records_the_settings_and_a_disagreeing_one_changes_nothing(
    pool: PgPool,
) {
    let first = [
        ("--alert-webhook", json!(["https://hooks.example/a"])),
        ("--upstream-timeout-secs", json!(30)),
    ];
    agree(&pool, &first, false).await.unwrap();
    agree(&pool, &first, false).await.unwrap();

    let odd = [
        ("--alert-webhook", json!([])),
        ("--upstream-timeout-secs", json!(5)),
    ];
    let refused = agree(&pool, &odd, false).await.unwrap_err();
    assert!(matches!(refused, AgreeError::Disagree(ref found) if found.len() == 2));
    let said = refused.to_string();
    assert!(
        said.contains(r#"--alert-webhook is [] here and ["https://hooks.example/a"] in the fleet"#),
        "{said}"
    );
    assert!(
        said.contains("--upstream-timeout-secs is 5 here and 30 in the fleet"),
        "{said}"
    );
    assert_eq!(
        fleet_value(&pool, "--alert-webhook").await,
        json!(["https://hooks.example/a"])
    );
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn replacing_the_fleets_settings_is_in_the_action_log(pool: PgPool) {
    agree(&pool, &[("--cap-ceiling-pct", json!(300))], false)
        .await
        .unwrap();
    agree(&pool, &[("--cap-ceiling-pct", json!(200))], true)
        .await
        .unwrap();
    assert_eq!(fleet_value(&pool, "--cap-ceiling-pct").await, json!(200));
    let logged: (String, String, String, serde_json::Value) = sqlx::query_as(
        "SELECT action, via, subject_id, details FROM operator_actions
         WHERE subject_type = 'fleet_setting'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        logged,
        (
            "fleet_setting.replace".to_owned(),
            "system".to_owned(),
            "--cap-ceiling-pct".to_owned(),
            json!({ "from": 300, "to": 200 })
        )
    );
}

/// The fleet's background jobs (the sweep, the expiry check, the unknown
/// outcomes round, the audit chain check, a period's sync) run in one
/// instance at a time: another instance's round finds the job taken and
/// skips it, and the job is free again as soon as the round ends.
#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn a_background_job_runs_in_one_instance_at_a_time(pool: PgPool) {
    use std::sync::Arc;

    use server::jobs::once_in_fleet;
    use tokio::sync::Notify;

    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let first = tokio::spawn({
        let (pool, started, finish) = (pool.clone(), started.clone(), finish.clone());
        async move {
            once_in_fleet(&pool, "sweep", async {
                started.notify_one();
                finish.notified().await;
                "first"
            })
            .await
        }
    });
    started.notified().await;

    let meanwhile = once_in_fleet(&pool, "sweep", async { "second" }).await;
    assert_eq!(
        meanwhile.unwrap(),
        None,
        "the running sweep is not run twice"
    );
    let other = once_in_fleet(&pool, "expiry", async { "expiry" }).await;
    assert_eq!(other.unwrap(), Some("expiry"), "other jobs run beside it");

    finish.notify_one();
    assert_eq!(first.await.unwrap().unwrap(), Some("first"));
    let next = once_in_fleet(&pool, "sweep", async { "next" }).await;
    assert_eq!(next.unwrap(), Some("next"));
}
