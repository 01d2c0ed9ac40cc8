//! Settings the whole fleet must share. Instances over one database that
//! disagree on where alerts go or on the money rules behave differently
//! depending on which one a call, a decision or a notification happens to
//! reach. So the first `vaultcap serve` to start records its settings in
//! `fleet_settings`; a later one whose flags disagree refuses to start and
//! names each difference, unless it is started with
//! `--replace-fleet-settings`: the way to change them is to restart the
//! fleet with the new flags, the first instance with that flag.

use serde_json::{json, Value};
use sqlx::PgPool;

use app::actions::sql::{self as actions, Actor};

use crate::config::ServeArgs;

/// This instance's value of each shared setting, by the flag that sets it.
pub fn settings_of(args: &ServeArgs) -> Vec<(&'static str, Value)> {
    let mut webhooks = args.alert_webhooks.clone();
    webhooks.sort();
    webhooks.dedup();
    let mut ceilings: Vec<String> = args
        .key_ceilings
        .iter()
        .map(|(role, cents)| format!("{}={}", role.as_str(), cents.0))
        .collect();
    ceilings.sort();
    vec![
        ("--alert-webhook", json!(webhooks)),
        (
            "--audit-retention-months",
            json!(args.audit_retention_months),
        ),
        ("--cap-ceiling-pct", json!(args.cap_ceiling_pct)),
        ("--cap-request-ttl-hours", json!(args.cap_request_ttl_hours)),
        ("--key-ceiling", json!(ceilings)),
        ("--key-policy-buffer-pct", json!(args.key_policy_buffer_pct)),
        (
            "--upstream-timeout-secs",
            json!(args.stripe.upstream_timeout_secs),
        ),
    ]
}

#[derive(Debug, thiserror::Error)]
pub enum AgreeError {
    #[error(
        "this instance's settings disagree with the fleet's (other vaultcap serve instances over \
         this database): {}. Start it with the fleet's values, or with --replace-fleet-settings \
         to make its own the fleet's and then restart the others with the same flags",
        .0.join("; ")
    )]
    Disagree(Vec<String>),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Records `mine` where the fleet has no value yet, and checks the rest
/// agree; with `replace`, makes `mine` the fleet's (each change in the
/// action log). One instance at a time (a transaction-scoped advisory
/// lock), so two first starts cannot record different settings.
pub async fn agree(
    pool: &PgPool,
    mine: &[(&'static str, Value)],
    replace: bool,
) -> Result<(), AgreeError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('fleet_settings'))")
        .execute(&mut *tx)
        .await?;
    let mut disagreements = Vec::new();
    for (flag, value) in mine {
        let fleet: Option<Value> =
            sqlx::query_scalar("SELECT value FROM fleet_settings WHERE flag = $1")
                .bind(flag)
                .fetch_optional(&mut *tx)
                .await?;
        match fleet {
            Some(fleet) if fleet == *value => {}
            Some(fleet) if !replace => {
                disagreements.push(format!("{flag} is {value} here and {fleet} in the fleet"))
            }
            fleet => {
                sqlx::query(
                    "INSERT INTO fleet_settings (flag, value) VALUES ($1, $2)
                     ON CONFLICT (flag) DO UPDATE SET value = EXCLUDED.value, set_at = now()",
                )
                .bind(flag)
                .bind(value)
                .execute(&mut *tx)
                .await?;
                if let Some(fleet) = fleet {
                    actions::record(
                        &mut *tx,
                        Actor::System,
                        "fleet_setting.replace",
                        "fleet_setting",
                        Some((*flag).to_owned()),
                        json!({ "from": fleet, "to": value }),
                    )
                    .await?;
                }
            }
        }
    }
    if !disagreements.is_empty() {
        return Err(AgreeError::Disagree(disagreements));
    }
    tx.commit().await?;
    Ok(())
}
