use std::{net::SocketAddr, sync::Arc};

use anyhow::Context;
use app::{
    alerts::sql as alerts,
    domain::Email,
    key_requests::rules::KeyPolicy,
    keys::spend,
    operators::{accounts, auth::PasswordChecks},
    ssr::{AppState, AuthConfig, CapIncreaseRules},
};
use leptos::config::LeptosOptions;
use tokio_util::task::TaskTracker;

use crate::{
    audit_archive,
    config::ServeArgs,
    db::Database,
    fleet, http,
    jobs::{self, notifier::Notifier, unknown_outcomes},
    proxy::upstream::{StripeSecret, Upstream},
    reconcile,
    stripe_events::{self, WebhookSecrets},
};

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let bootstrap_email = Email::parse(&args.bootstrap_email)
        .map_err(|err| anyhow::anyhow!("VAULTCAP_BOOTSTRAP_EMAIL: {err}"))?;
    if !args.site_root.join("pkg").join("vaultcap.js").exists() {
        tracing::warn!(
            site_root = %args.site_root.display(),
            "the browser bundle is missing: pages will render but not hydrate (build it with scripts/build)"
        );
    }
    crate::metrics::install();
    let db = Database::open(&args.database).await?;
    fleet::agree(
        &db.pool,
        &fleet::settings_of(&args),
        args.replace_fleet_settings,
    )
    .await?;
    if let Some(password) = accounts::bootstrap_admin(&db.pool, &bootstrap_email)
        .await
        .map_err(|err| anyhow::anyhow!("creating the first admin: {err}"))?
    {
        println!("First start: created the admin {bootstrap_email} with password {password}");
        println!("This password is shown only once. Add your colleagues on the Operators page.");
    }

    // Calls cut off by a process killed between reserve and settle are
    // recorded as outcome unknown once no live call can still own them: at
    // start, then every minute (with the expiry alerts and the check of the
    // audit log's hash chain).
    let timeout = std::time::Duration::from_secs(args.stripe.upstream_timeout_secs);
    sweep_abandoned(&db.pool).await?;
    let minutely = tokio::spawn({
        let pool = db.pool.clone();
        async move {
            let mut every_minute = tokio::time::interval(std::time::Duration::from_secs(60));
            loop {
                every_minute.tick().await;
                fleet_round(&pool, "sweep", sweep_abandoned(&pool)).await;
                fleet_round(&pool, "expiry", alerts::raise_expiring(&pool)).await;
                if let Err(err) = crate::audit_chain::check_in_background(&pool).await {
                    tracing::error!(error = %err, "checking the audit log's hash chain");
                }
            }
        }
    });
    // The audit log's months: made ahead now (before any call is audited)
    // and then each hour; with --audit-retention-months, those out of
    // retention archived and dropped, now and then each hour.
    audit_archive::add_partitions(&db.pool).await?;
    let hourly = tokio::spawn({
        let (pool, owner) = (db.pool.clone(), db.owner());
        let retention = args
            .audit_retention_months
            .zip(args.audit_archive_dir.clone());
        async move {
            let hour = std::time::Duration::from_secs(3600);
            let mut next = tokio::time::Instant::now();
            loop {
                if let Some((months, dir)) = &retention {
                    let archiving = audit_archive::apply_retention(&owner, *months, dir);
                    fleet_round(&pool, "audit_archive", archiving).await;
                }
                next += hour;
                tokio::time::sleep_until(next).await;
                let adding = audit_archive::add_partitions(&pool);
                fleet_round(&pool, "audit_partitions", adding).await;
            }
        }
    });
    let notifier = tokio::spawn(Notifier::new(db.pool.clone())?.run());
    let upstream = Upstream::new(
        &args.stripe.stripe_api_base,
        args.stripe.stripe_secret_key.clone().map(StripeSecret::new),
        timeout,
    )?
    .with_webhook_secrets(WebhookSecrets::new(
        args.stripe.stripe_webhook_secrets.clone(),
    ));
    // Calls of unknown outcome: Stripe is asked about them each minute.
    let asking = tokio::spawn({
        let (pool, upstream) = (db.pool.clone(), upstream.clone());
        async move {
            let mut every_minute = tokio::time::interval(std::time::Duration::from_secs(60));
            loop {
                every_minute.tick().await;
                let round = unknown_outcomes::resolve(&pool, &upstream);
                if let Some(resolved) = fleet_round(&pool, "unknown_outcomes", round).await {
                    if resolved != Default::default() {
                        tracing::info!(?resolved, "asked Stripe about calls of unknown outcome")
                    }
                }
            }
        }
    });
    if !upstream.is_configured() {
        tracing::warn!("STRIPE_SECRET_KEY is not set: the proxy refuses every call until it is");
    }
    // Each night, the syncs that fill what Stripe's events missed.
    let nightly = tokio::spawn({
        let (pool, client) = (
            db.pool.clone(),
            upstream.stripe_client(&reconcile::sync::SyncOptions::default()),
        );
        let hour = args.stripe.nightly_sync_hour.0;
        async move {
            let (Some(client), Some(hour)) = (client, hour) else {
                return;
            };
            loop {
                let at = reconcile::next_at_hour(chrono::Utc::now(), hour);
                tokio::time::sleep((at - chrono::Utc::now()).to_std().unwrap_or_default()).await;
                if let Some(synced) =
                    fleet_round(&pool, "nightly_sync", reconcile::nightly(&pool, &client)).await
                {
                    tracing::info!(?synced, "nightly sync from Stripe");
                }
            }
        }
    });
    // What Stripe's events changed, detected every few seconds.
    let live = tokio::spawn({
        let pool = db.pool.clone();
        async move {
            let mut every = tokio::time::interval(stripe_events::live::EVERY);
            let mut since = None;
            loop {
                every.tick().await;
                let started = chrono::Utc::now();
                let pass = stripe_events::live::pass(&pool, since);
                // Only a pass that ran here moves this process's mark on.
                if fleet_round(&pool, "stripe_live", pass).await.is_some() {
                    since = Some(started);
                }
            }
        }
    });

    let state = AppState {
        leptos_options: LeptosOptions::builder()
            .output_name("vaultcap")
            .site_root(args.site_root.to_string_lossy().as_ref())
            .site_pkg_dir("pkg")
            .site_addr(args.addr)
            .build(),
        pool: db.pool.clone(),
        reads: crate::db::reads(
            &db.pool,
            args.read_database_url.as_deref(),
            args.database.db_max_connections,
            chrono::Duration::seconds(args.replica_lag_notice_secs.into()),
        )
        .await?,
        auth: Arc::new(AuthConfig {
            idle_timeout: chrono::Duration::minutes(args.session_idle_minutes),
            absolute_timeout: chrono::Duration::hours(args.session_max_hours),
            secure_cookies: args.secure_cookies,
            trusted_proxies: args.trusted_proxies.clone(),
            metrics_token: args.metrics_token.clone(),
            ..AuthConfig::default()
        }),
        key_policy: KeyPolicy {
            buffer_bps: args.key_policy_buffer_pct * 100,
            role_ceilings: args.key_ceilings.clone(),
            request_ttl: chrono::Duration::hours(args.cap_request_ttl_hours),
        },
        password_checks: PasswordChecks::new(
            args.max_password_checks.into(),
            std::time::Duration::from_secs(3),
        ),
        stripe_configured: upstream.is_configured(),
        cap_increases: CapIncreaseRules {
            request_ttl: chrono::Duration::hours(args.cap_request_ttl_hours),
            ceiling_pct: args.cap_ceiling_pct,
        },
    };
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("listening on {}", args.addr))?;
    let signalled = super::shutdown_signal();
    // Closing the tracker of proxied calls marks the instance as draining
    // (`/readyz` answers 503); it goes on serving until the listener closes.
    let calls = TaskTracker::new();
    let drain = std::time::Duration::from_secs(args.drain_secs);
    let shutdown = {
        let calls = calls.clone();
        async move {
            signalled.await;
            calls.close();
            if !drain.is_zero() {
                println!(
                    "Draining: /readyz answers 503 for {} s while calls are still served",
                    drain.as_secs()
                );
                tokio::time::sleep(drain).await;
            }
            println!("Shutting down: finishing the calls in flight");
        }
    };
    println!("Vaultcap console: http://{}", listener.local_addr()?);
    let served = axum::serve(
        listener,
        http::router_tracking(state, upstream, db.ledger_pool.clone(), calls.clone())
            .into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
    .context("serving HTTP");
    // Connections are closed; calls whose clients hung up may still be at
    // Stripe or settling, and each must finish before the pools close.
    calls.close();
    calls.wait().await;
    tracing::info!("shutting down");
    // The background jobs hold pool connections; the pool closes only once
    // they are gone.
    notifier.abort();
    minutely.abort();
    asking.abort();
    hourly.abort();
    live.abort();
    nightly.abort();
    let _ = tokio::join!(notifier, minutely, asking, hourly, live, nightly);
    db.close().await?;
    served
}

/// One round of the background job `name`, unless another instance of the
/// fleet is running it (`jobs::once_in_fleet`); a failure is logged, and the
/// next round tries again.
async fn fleet_round<T, E: std::fmt::Display>(
    pool: &sqlx::PgPool,
    name: &str,
    job: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    match jobs::once_in_fleet(pool, name, job).await {
        Ok(Some(Ok(done))) => Some(done),
        Ok(None) => None,
        Ok(Some(Err(err))) => {
            tracing::error!(error = %err, job = name, "background job failed");
            None
        }
        Err(err) => {
            tracing::error!(error = %err, job = name, "claiming a background job");
            None
        }
    }
}

/// Records reservations a minute past the time their process answered for
/// them (its upstream timeout and a margin, stored with each) as outcome
/// unknown.
async fn sweep_abandoned(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    let swept = spend::sweep_abandoned(pool, 60).await?;
    if swept > 0 {
        tracing::warn!(
            swept,
            "recorded reservations abandoned mid-call as outcome unknown"
        );
    }
    Ok(())
}
