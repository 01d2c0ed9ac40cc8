//! `vaultcap demo` tells one story: nothing happens before what it
//! depends on, nobody acts before they exist, and every decision is in the
//! action log.

use chrono::{TimeZone, Utc};
use sqlx::PgPool;

/// Each query counts the rows that break one rule of the timeline.
const BROKEN_RULES: &[(&str, &str)] = &[
    (
        "a call before its key was made",
        "SELECT count(*) FROM audit_log a JOIN vault_keys k ON k.id = a.vault_key_id WHERE a.at < k.created_at",
    ),
    (
        "a call after its key was revoked",
        "SELECT count(*) FROM audit_log a JOIN vault_keys k ON k.id = a.vault_key_id WHERE a.at > k.revoked_at",
    ),
    (
        "a key revoked before it was made, or by someone who did not exist yet",
        "SELECT count(*) FROM vault_keys k LEFT JOIN operators o ON o.id = k.revoked_by
         WHERE k.revoked_at < k.created_at OR k.revoked_at < o.created_at",
    ),
    (
        "a key made before its maker existed",
        "SELECT count(*) FROM vault_keys k LEFT JOIN operators o ON o.id = k.created_by
         LEFT JOIN api_tokens t ON t.id = k.created_by_token
         WHERE k.created_at < o.created_at OR k.created_at < t.created_at
            OR (k.created_by IS NULL AND k.created_by_token IS NULL)",
    ),
    (
        "a decision before its request, or by someone who did not exist yet",
        "SELECT count(*) FROM cap_increase_requests c LEFT JOIN operators o ON o.id = c.decided_by
         WHERE c.decided_at < c.requested_at OR c.decided_at < o.created_at
            OR (c.decision IS NOT NULL AND c.decided_by IS NULL)",
    ),
    (
        "a request before its key was made, or after the key was revoked",
        "SELECT count(*) FROM cap_increase_requests c JOIN vault_keys k ON k.id = c.vault_key_id
         WHERE c.requested_at < k.created_at OR c.requested_at > k.revoked_at",
    ),
    (
        "an alert before its key, or acknowledged before it was raised or by someone who did not exist yet",
        "SELECT count(*) FROM alerts al JOIN vault_keys k ON k.id = al.vault_key_id
         LEFT JOIN operators o ON o.id = al.acknowledged_by
         WHERE al.raised_at < k.created_at OR al.acknowledged_at < al.raised_at
            OR al.acknowledged_at < o.created_at",
    ),
    (
        "an event after now",
        "SELECT count(*) FROM (
             SELECT at FROM audit_log UNION ALL SELECT created_at FROM vault_keys
             UNION ALL SELECT revoked_at FROM vault_keys UNION ALL SELECT raised_at FROM alerts
             UNION ALL SELECT acknowledged_at FROM alerts UNION ALL SELECT requested_at FROM cap_increase_requests
             UNION ALL SELECT decided_at FROM cap_increase_requests UNION ALL SELECT at FROM operator_actions
             UNION ALL SELECT created_at FROM billing_records
         ) AS t(at) WHERE at > now()",
    ),
    (
        "a key's making missing from the action log",
        "SELECT count(*) FROM vault_keys k WHERE NOT EXISTS (
             SELECT 1 FROM operator_actions x WHERE x.action = 'create_vault_key' AND x.subject_id = k.id::text
               AND x.at = k.created_at
               AND (x.operator_id = k.created_by OR x.api_token_id = k.created_by_token))",
    ),
    (
        "a revocation missing from the action log",
        "SELECT count(*) FROM vault_keys k WHERE k.revoked_at IS NOT NULL AND NOT EXISTS (
             SELECT 1 FROM operator_actions x WHERE x.action = 'revoke_vault_key' AND x.subject_id = k.id::text
               AND x.at = k.revoked_at AND x.operator_id = k.revoked_by)",
    ),
    (
        "a request or its decision missing from the action log",
        "SELECT count(*) FROM cap_increase_requests c WHERE NOT EXISTS (
             SELECT 1 FROM operator_actions x WHERE x.action = 'cap_increase.request'
               AND (x.details->>'request_id')::bigint = c.id AND x.at = c.requested_at
               AND x.api_token_id = c.requested_by_token)
            OR (c.decision = 'rejected' AND NOT EXISTS (
             SELECT 1 FROM operator_actions x WHERE x.action = 'cap_increase.reject'
               AND (x.details->>'request_id')::bigint = c.id AND x.at = c.decided_at
               AND x.operator_id = c.decided_by))",
    ),
    (
        "an acknowledgement missing from the action log",
        "SELECT count(*) FROM alerts al WHERE al.acknowledged_at IS NOT NULL AND NOT EXISTS (
             SELECT 1 FROM operator_actions x WHERE x.action = 'alert.acknowledge'
               AND x.subject_id = al.id::text AND x.at = al.acknowledged_at
               AND x.operator_id = al.acknowledged_by)",
    ),
];

async fn counts(pool: &PgPool) -> Vec<(&'static str, i64)> {
    let mut counts = Vec::new();
    for (rule, sql) in BROKEN_RULES {
        let broken: i64 = sqlx::query_scalar(sql).fetch_one(pool).await.unwrap();
        counts.push((*rule, broken));
    }
    counts
}

async fn rows(pool: &PgPool) -> Vec<i64> {
    let mut rows = Vec::new();
    for table in [
        "vault_keys",
        "audit_log",
        "alerts",
        "cap_increase_requests",
        "operators",
        "api_tokens",
    ] {
        let sql = format!("SELECT count(*) FROM {table}");
        rows.push(sqlx::query_scalar(&sql).fetch_one(pool).await.unwrap());
    }
    rows
}

#[sqlx::test(migrator = "server::db::MIGRATOR")]
async fn the_demo_tells_one_story_even_minutes_into_a_month(pool: PgPool) {
    // Twenty minutes into December: this month's story must fit in them.
    let now = Utc.with_ymd_and_hms(2026, 12, 1, 0, 20, 0).unwrap();
    server::cli::demo::fill(&pool, 60, now).await.unwrap();
    let story = rows(&pool).await;
    assert_eq!(&story[..1], [5], "three run keys and two extra keys");
    let (alerts, decided, acknowledged): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM alerts),
                (SELECT count(*) FROM cap_increase_requests WHERE decision IS NOT NULL),
                (SELECT count(*) FROM alerts WHERE acknowledged_at IS NOT NULL)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        alerts >= 1 && decided == 1,
        "{alerts} alerts, {decided} decided"
    );
    assert_eq!(
        acknowledged,
        alerts - 1,
        "past alerts acknowledged, this month's open"
    );
    for (rule, broken) in counts(&pool).await {
        assert_eq!(broken, 0, "{rule}");
    }

    // Loading it again adds nothing.
    server::cli::demo::fill(&pool, 60, now).await.unwrap();
    assert_eq!(rows(&pool).await, story);
}
