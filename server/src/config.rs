//! Configuration: flags with environment-variable fallbacks, read once at
//! start-up. `vaultcap --help` lists them all.

use std::{net::SocketAddr, path::PathBuf};

use clap::Args;

/// Where the database is.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// An existing PostgreSQL server. Without it, Vaultcap runs a private
    /// cluster from the machine's PostgreSQL binaries in --data-dir.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// The owner of the schema, for migrations only, when DATABASE_URL names
    /// the role the application runs as (a member of `vaultcap_app`, which
    /// cannot rewrite the logs). Without it, migrations run through
    /// DATABASE_URL, and the application can rewrite its logs if that role
    /// owns them (it says so at start).
    #[arg(long, env = "VAULTCAP_MIGRATION_DATABASE_URL", hide_env_values = true)]
    pub migration_database_url: Option<String>,

    /// Where the private PostgreSQL cluster lives [default: the user's data
    /// directory, e.g. ~/.local/share/vaultcap; /var/lib/vaultcap for root,
    /// whose home the postgres user cannot enter].
    #[arg(long, env = "VAULTCAP_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Most connections each Vaultcap process opens.
    #[arg(long, env = "VAULTCAP_DB_MAX_CONNECTIONS", default_value_t = 10)]
    pub db_max_connections: u32,

    /// Connections kept apart for the proxy's spend ledger (one, its
    /// writer's) and key lookups (the rest; at least one), on top of
    /// --db-max-connections, so no console work (exports, syncs, pages) can
    /// hold every connection while billing waits.
    #[arg(long, env = "VAULTCAP_DB_LEDGER_CONNECTIONS", default_value_t = 4)]
    pub db_ledger_connections: u32,
}

impl DatabaseArgs {
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(|| {
            if nix::unistd::geteuid().is_root() {
                PathBuf::from("/var/lib/vaultcap")
            } else {
                dirs::data_dir()
                    .unwrap_or_else(|| PathBuf::from("."))
                    .join("vaultcap")
            }
        })
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// A streaming replica of the database for the console's long reads:
    /// the audit log and its CSV export, the action log, spend charts and
    /// reconciliation listings. Money decisions, alerts, approvals and
    /// every write stay on the primary. Without it, all reads go there.
    #[arg(long, env = "VAULTCAP_READ_DATABASE_URL", hide_env_values = true)]
    pub read_database_url: Option<String>,

    /// Seconds the replica may trail the primary before the pages read from
    /// it say how far behind it is.
    #[arg(long, env = "VAULTCAP_REPLICA_LAG_NOTICE_SECS", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(0..=86_400))]
    pub replica_lag_notice_secs: u32,

    /// Months of the audit log kept before the current one (0: only the
    /// current month). At start and each hour, one instance archives the
    /// months before them to --audit-archive-dir (gzipped CSV, row count
    /// and SHA-256 recorded) and drops them, as the schema's owner. Unset:
    /// the log is kept forever.
    #[arg(long, env = "VAULTCAP_AUDIT_RETENTION_MONTHS", requires = "audit_archive_dir",
          value_parser = clap::value_parser!(u32).range(0..=1200))]
    pub audit_retention_months: Option<u32>,

    /// Where archived months of the audit log are written.
    #[arg(long, env = "VAULTCAP_AUDIT_ARCHIVE_DIR")]
    pub audit_archive_dir: Option<PathBuf>,

    /// Address the console listens on.
    #[arg(long, env = "VAULTCAP_ADDR", default_value = "127.0.0.1:3000")]
    pub addr: SocketAddr,

    /// Directory holding the built browser bundle (`pkg/`).
    #[arg(long, env = "VAULTCAP_SITE_ROOT", default_value = "target/site")]
    pub site_root: PathBuf,

    /// Mark the session cookie `Secure`: set when the console is served over
    /// HTTPS (behind a TLS-terminating proxy).
    #[arg(long, env = "VAULTCAP_SECURE_COOKIES", default_value_t = false)]
    pub secure_cookies: bool,

    /// Reverse proxies (TLS terminators, load balancers) in front of the
    /// console, as addresses or networks (`10.0.0.0/8`): only their
    /// `X-Forwarded-For` names the client for sign-in throttling and the
    /// action log. Repeat the flag, or separate them with commas.
    #[arg(long = "trusted-proxy", env = "VAULTCAP_TRUSTED_PROXIES", value_delimiter = ',', value_parser = parse_network)]
    pub trusted_proxies: Vec<ipnet::IpNet>,

    /// The bearer token a Prometheus scraper sends for `/metrics`. Without
    /// it, `/metrics` answers only to clients on this host.
    #[arg(long, env = "VAULTCAP_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,

    /// Passwords checked at once (each check takes 19 MiB for a few tens
    /// of milliseconds); a sign-in that waits 3 s for a slot gets 503.
    #[arg(long, env = "VAULTCAP_MAX_PASSWORD_CHECKS", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub max_password_checks: u16,

    /// Minutes of inactivity after which a session ends.
    #[arg(long, env = "VAULTCAP_SESSION_IDLE_MINUTES", default_value_t = 30)]
    pub session_idle_minutes: i64,

    /// Hours after sign-in at which a session ends, however active.
    #[arg(long, env = "VAULTCAP_SESSION_MAX_HOURS", default_value_t = 12)]
    pub session_max_hours: i64,

    /// Email of the admin created on first start when there are no operators.
    #[arg(
        long,
        env = "VAULTCAP_BOOTSTRAP_EMAIL",
        default_value = "admin@localhost"
    )]
    pub bootstrap_email: String,

    /// Webhook URLs that receive alert notifications (Slack incoming
    /// webhooks or any endpoint taking JSON); repeat the flag, or separate
    /// them with commas in the variable.
    #[arg(long = "alert-webhook", env = "VAULTCAP_ALERT_WEBHOOKS", value_delimiter = ',', value_parser = parse_webhook)]
    pub alert_webhooks: Vec<String>,

    /// Seconds between SIGTERM and closing the listener, while `/readyz`
    /// answers 503 so a load balancer's health check takes this instance
    /// out; calls that still arrive are served. 0: close at once.
    #[arg(long, env = "VAULTCAP_DRAIN_SECS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=300))]
    pub drain_secs: u64,

    /// Make this instance's shared settings (alert webhooks, cap policy,
    /// upstream timeout) the fleet's, where they differ from what the other
    /// instances over this database recorded. Without it, an instance whose
    /// settings disagree refuses to start and names each difference.
    #[arg(long, env = "VAULTCAP_REPLACE_FLEET_SETTINGS", default_value_t = false)]
    pub replace_fleet_settings: bool,

    /// Hours a cap increase request waits for a decision before it expires
    /// (sooner when its key expires first).
    #[arg(long, env = "VAULTCAP_CAP_REQUEST_TTL_HOURS", default_value_t = 24,
          value_parser = clap::value_parser!(i64).range(1..=720))]
    pub cap_request_ttl_hours: i64,

    /// The most a cap may be raised to, in percent of the key's expected
    /// total.
    #[arg(long, env = "VAULTCAP_CAP_CEILING_PCT", default_value_t = 300,
          value_parser = clap::value_parser!(u32).range(100..=10_000))]
    pub cap_ceiling_pct: u32,

    /// The largest buffer over the expected total, in percent, a new key
    /// may have without an approver; beyond it the key waits for one.
    #[arg(long, env = "VAULTCAP_KEY_POLICY_BUFFER_PCT", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub key_policy_buffer_pct: u32,

    /// The largest cap an operator with a role may issue without an
    /// approver, in minor units of the key's currency: `operator=500000`.
    /// Repeat the flag, or separate them with commas.
    #[arg(long = "key-ceiling", env = "VAULTCAP_KEY_CEILINGS", value_delimiter = ',', value_parser = parse_ceiling)]
    pub key_ceilings: Vec<(app::domain::Role, app::domain::Cents)>,

    #[command(flatten)]
    pub stripe: StripeArgs,
}

/// `operator=500000`: a role and a cap in minor units.
fn parse_ceiling(raw: &str) -> Result<(app::domain::Role, app::domain::Cents), String> {
    let (role, cents) = raw
        .trim()
        .split_once('=')
        .ok_or_else(|| format!("{raw:?} is not ROLE=CENTS, e.g. operator=500000"))?;
    let role = role.trim().parse().map_err(|err| format!("{err}"))?;
    let cents = cents
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|cents| *cents > 0)
        .ok_or_else(|| format!("{cents:?} is not a positive amount in minor units"))?;
    Ok((role, app::domain::Cents(cents)))
}

/// `10.0.0.0/8`, or a single address (`10.0.0.2`).
fn parse_network(raw: &str) -> Result<ipnet::IpNet, String> {
    let raw = raw.trim();
    raw.parse::<ipnet::IpNet>()
        .or_else(|_| raw.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{raw:?} is neither an address nor a network like 10.0.0.0/8"))
}

/// The hour of the nightly sync (UTC), or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NightlySync(pub Option<u32>);

/// `0` to `23`, or `off`.
fn parse_hour(raw: &str) -> Result<NightlySync, String> {
    match raw.trim() {
        "off" => Ok(NightlySync(None)),
        hour => hour
            .parse::<u32>()
            .ok()
            .filter(|hour| *hour < 24)
            .map(|hour| NightlySync(Some(hour)))
            .ok_or_else(|| format!("{raw:?} is not an hour of the day (0 to 23) or off")),
    }
}

fn parse_webhook(raw: &str) -> Result<String, String> {
    let url =
        reqwest::Url::parse(raw.trim()).map_err(|err| format!("{raw:?} is not a URL: {err}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(format!("{raw:?} is not an http(s) URL"));
    }
    Ok(url.to_string())
}

/// Where the proxy forwards allowed calls.
#[derive(Debug, Clone, Args)]
pub struct StripeArgs {
    /// Stripe's API base (a local stand-in such as localstripe in tests).
    #[arg(
        long,
        env = "STRIPE_API_BASE",
        default_value = "https://api.stripe.com"
    )]
    pub stripe_api_base: String,

    /// The real Stripe secret key the proxy swaps in. Without it the proxy
    /// refuses every call (503) instead of forwarding.
    #[arg(long, env = "STRIPE_SECRET_KEY", hide_env_values = true)]
    pub stripe_secret_key: Option<String>,

    /// The secrets Stripe signs its webhook events with (`whsec_…`), for
    /// `POST /stripe/webhooks`; during a rotation give the old and the new
    /// (repeat the flag, or separate them with commas). Without one the
    /// endpoint answers 503 and Stripe delivers again later.
    #[arg(
        long = "stripe-webhook-secret",
        env = "STRIPE_WEBHOOK_SECRET",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub stripe_webhook_secrets: Vec<String>,

    /// The hour (UTC, 0 to 23) at which `serve` syncs the current and the
    /// previous period from Stripe each night, filling whatever webhook
    /// events were missed; `off` for none.
    #[arg(long, env = "VAULTCAP_NIGHTLY_SYNC_HOUR", default_value = "3", value_parser = parse_hour)]
    pub nightly_sync_hour: NightlySync,

    /// Seconds to wait for Stripe before a call's outcome counts as unknown.
    #[arg(long, env = "VAULTCAP_UPSTREAM_TIMEOUT_SECS", default_value_t = 30)]
    pub upstream_timeout_secs: u64,
}
