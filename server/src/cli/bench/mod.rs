//! `vaultcap bench …`: benchmarks that print figures, each in a private
//! PostgreSQL cluster made for the run and removed after it.

mod audit;
pub mod cap;
mod console;
mod fleet;
mod proxy;
mod reconcile;
mod webhooks;

use std::{
    collections::HashMap,
    os::unix::fs::PermissionsExt,
    path::Path,
    process::Stdio,
    sync::{Arc, Mutex},
};

use anyhow::{bail, Context};
use app::{
    actions::sql::Actor,
    keys::{
        rules::{self as vault_keys, NewVaultKey, DEFAULT_THRESHOLDS_PCT},
        sql::VaultKeyRow,
    },
};
use axum::{extract::State, http::HeaderMap, routing::post, Form, Json, Router};
use clap::Subcommand;
use sqlx::{postgres::PgPoolOptions, PgPool};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::mpsc,
};

use crate::embedded_pg::{EmbeddedPostgres, DATABASE};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Added latency and throughput of the spend-cap proxy.
    Proxy(proxy::ProxyBenchArgs),
    /// The cap under load: concurrent charges at one key, with the proxy
    /// killed (SIGKILL) and restarted mid-run.
    Cap(cap::CapBenchArgs),
    /// N instances over one database behind HAProxy (N = 1, 2, 4):
    /// calls/s, latency, CPU per call and what one database core carries.
    Fleet(fleet::FleetBenchArgs),
    /// Server time to render the overview, keys list and a key's page with
    /// many keys and a large audit log.
    Console(console::ConsoleBenchArgs),
    /// The audit log at scale: page times per filter (first and 100,000
    /// rows deep) and a CSV export against psql's \copy.
    Audit(audit::AuditBenchArgs),
    /// Reconciliation detection over a period with many charges and billing
    /// records (local work, no Stripe paging).
    Reconcile(reconcile::ReconcileBenchArgs),
    /// Stripe's webhook events ingested over HTTP: events/s and the
    /// latency per event, then a live detection pass over them.
    Webhooks(webhooks::WebhooksBenchArgs),
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Proxy(args) => proxy::run(args).await,
        BenchCommand::Cap(args) => cap::run(args).await,
        BenchCommand::Fleet(args) => fleet::run(args).await,
        BenchCommand::Console(args) => console::run(args).await,
        BenchCommand::Audit(args) => audit::run(args).await,
        BenchCommand::Reconcile(args) => reconcile::run(args).await,
        BenchCommand::Webhooks(args) => webhooks::run(args).await,
    }
}

/// The `q` quantile (0 to 1) of timings sorted ascending (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// A private, migrated PostgreSQL cluster for one run.
pub struct BenchDatabase {
    dir: tempfile::TempDir,
    pub pg: EmbeddedPostgres,
    pub pool: PgPool,
}

impl BenchDatabase {
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(&[]).await
    }

    /// With `name=value` server settings.
    pub async fn start_with(settings: &[&str]) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("vaultcap-bench.")
            .tempdir()?;
        // Run as root, PostgreSQL runs as the postgres user, who must get in.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let pg = EmbeddedPostgres::start_with(&dir.path().join("postgres"), settings).await?;
        let pool = PgPoolOptions::new()
            .max_connections(32)
            .connect_with(pg.connect_options(DATABASE))
            .await?;
        crate::db::MIGRATOR.run(&pool).await?;
        // Loading millions of rows: fewer checkpoints on the way.
        sqlx::query("ALTER SYSTEM SET max_wal_size = '4GB'")
            .execute(&pool)
            .await?;
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&pool)
            .await?;
        Ok(Self { dir, pg, pool })
    }

    pub fn url(&self) -> String {
        self.pg.url(DATABASE)
    }

    /// What a `vaultcap serve` over this database, forwarding to the
    /// Stripe stand-in at `stripe`, is started with.
    pub fn serve_env(&self, stripe: &str) -> Vec<(&'static str, String)> {
        vec![
            ("DATABASE_URL", self.url()),
            ("STRIPE_API_BASE", stripe.to_owned()),
            ("STRIPE_SECRET_KEY", "sk_bench".to_owned()),
        ]
    }

    /// A directory for the run's other files (logs), removed with it.
    pub fn scratch(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        self.pool.close().await;
        self.pg.stop().await
    }

    /// Runs `measure` in a cluster of its own, stopped after it whatever
    /// `measure` answered.
    pub async fn around<T>(
        measure: impl AsyncFnOnce(&BenchDatabase) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        Self::around_with(&[], measure).await
    }

    /// Like [`BenchDatabase::around`], with PostgreSQL settings (`name=value`).
    pub async fn around_with<T>(
        settings: &[&str],
        measure: impl AsyncFnOnce(&BenchDatabase) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let db = Self::start_with(settings).await?;
        let result = measure(&db).await;
        db.stop().await?;
        result
    }
}

/// Serves a router on a free local port.
pub async fn serve(router: Router) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(addr)
}

/// A Stripe stand-in that answers every charge at once as `charge_id`; its
/// base URL.
pub async fn stripe_answering(charge_id: &'static str) -> anyhow::Result<String> {
    let charge = serde_json::json!({ "id": charge_id, "object": "charge" });
    let stripe = Router::new().route(
        "/v1/charges",
        axum::routing::post(move || async move { axum::Json(charge) }),
    );
    Ok(format!("http://{}", serve(stripe).await?))
}

/// One vault key for `/v1/charges` in USD, capped at `cap`, and its secret.
pub async fn issue_key(
    pool: &PgPool,
    cap: app::domain::Cents,
) -> anyhow::Result<(String, VaultKeyRow)> {
    issue_keys(pool, 1, cap)
        .await?
        .pop()
        .context("a key was issued")
}

/// `count` vault keys for `/v1/charges` in USD, each capped at `cap`.
pub async fn issue_keys(
    pool: &PgPool,
    count: usize,
    cap: app::domain::Cents,
) -> anyhow::Result<Vec<(String, VaultKeyRow)>> {
    let mut keys = Vec::with_capacity(count);
    for n in 0..count {
        let key = NewVaultKey {
            label: format!("bench-{n}"),
            billing_period: app::domain::BillingPeriod::containing(chrono::Utc::now()),
            currency: app::domain::Currency::usd(),
            expected_total: cap,
            buffer_bps: 0,
            cap,
            allowed_endpoints: vec![app::domain::EndpointPattern::parse("/v1/charges")?],
            expires_at: chrono::Utc::now() + chrono::Duration::hours(1),
            alert_thresholds_pct: DEFAULT_THRESHOLDS_PCT.to_vec(),
            duplicate_policy: app::domain::DuplicatePolicy::default(),
            stripe_account: None,
        };
        keys.push(
            vault_keys::issue(pool, Actor::System, key)
                .await
                .map_err(|e| anyhow::anyhow!("issuing a bench key: {e}"))
                .context("bench keys")?,
        );
    }
    Ok(keys)
}

/// `vaultcap serve` as a child process, its stdout read line by line.
pub struct ServeProcess {
    child: Child,
    /// The console's (and proxy's) base URL, `http://127.0.0.1:…`.
    pub base: String,
    lines: mpsc::UnboundedReceiver<String>,
}

impl ServeProcess {
    /// Starts `binary serve` on a free port with `env`, its log appended to
    /// `log`, and returns once it is ready.
    pub async fn start(binary: &Path, env: &[(&str, String)], log: &Path) -> anyhow::Result<Self> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let mut child = Command::new(binary)
            .args(["serve", "--addr", "127.0.0.1:0"])
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut stdout = BufReader::new(child.stdout.take().context("serve's stdout")?).lines();
        while let Some(line) = stdout.next_line().await? {
            if let Some(address) = line.strip_prefix("Vaultcap console: ") {
                let base = address.trim().to_owned();
                // Keep reading so the child never blocks on a full pipe.
                let (tx, lines) = mpsc::unbounded_channel();
                tokio::spawn(async move {
                    while let Ok(Some(line)) = stdout.next_line().await {
                        let _ = tx.send(line);
                    }
                });
                return Ok(Self { child, base, lines });
            }
        }
        bail!(
            "vaultcap serve exited before it was ready: {}",
            child.wait().await?
        )
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The next line serve prints after its address (`None` once it exits).
    pub async fn next_line(&mut self) -> Option<String> {
        self.lines.recv().await
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) -> anyhow::Result<()> {
        let pid = self.child.id().context("serve has exited")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)?;
        Ok(())
    }

    /// SIGKILL: no chance to finish anything.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("killing vaultcap serve")
    }

    /// SIGTERM, then waits for the graceful shutdown to end.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.signal(nix::sys::signal::Signal::SIGTERM)?;
        self.wait().await
    }

    /// Waits for the process to exit; an error unless it exits cleanly
    /// within a minute.
    pub async fn wait(&mut self) -> anyhow::Result<()> {
        let status = tokio::time::timeout(std::time::Duration::from_secs(60), self.child.wait())
            .await
            .context("vaultcap serve did not stop within 60 s")??;
        anyhow::ensure!(status.success(), "vaultcap serve stopped with {status}");
        Ok(())
    }
}

/// An instant Stripe that honours Idempotency-Key as Stripe does: a retry
/// gets the original charge back and takes no money.
#[derive(Clone, Default)]
pub struct FakeStripe {
    /// Idempotency-Key → charge id.
    charged: Arc<Mutex<HashMap<String, String>>>,
}

impl FakeStripe {
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/charges", post(Self::charge))
            .with_state(self.clone())
    }

    async fn charge(
        State(stripe): State<Self>,
        headers: HeaderMap,
        Form(params): Form<HashMap<String, String>>,
    ) -> Json<serde_json::Value> {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let mut charged = stripe.charged.lock().expect("not poisoned");
        let next = format!("ch_{}", charged.len() + 1);
        let id = charged.entry(key).or_insert(next).clone();
        Json(serde_json::json!({
            "id": id, "object": "charge", "amount": params.get("amount"), "status": "succeeded",
        }))
    }

    /// Idempotency-Key → the charge made under it.
    pub fn charges(&self) -> HashMap<String, String> {
        self.charged.lock().expect("not poisoned").clone()
    }
}
