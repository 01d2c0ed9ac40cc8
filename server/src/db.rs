//! Opening the database: an existing server from `DATABASE_URL`, or the
//! private cluster. Migrations run on every open, so every command sees the
//! schema it was built for.

use std::str::FromStr;

use anyhow::Context;
use app::{audit::chain_sql as audit_chain, ssr::Reads};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    ConnectOptions, Connection, PgConnection, PgPool,
};

use crate::{config::DatabaseArgs, embedded_pg::EmbeddedPostgres};

/// The migrations in `migrations/`, compiled into the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// An open database, and the private cluster behind it if there is one.
pub struct Database {
    /// The console's, the key API's and the background jobs' connections.
    pub pool: PgPool,
    /// The proxy's own: key lookups and its other queries (the spend
    /// ledger's writer opens one connection more, its own).
    pub ledger_pool: PgPool,
    /// The schema's owner: migrations, and archiving months of the audit
    /// log, which the application's own role may not drop.
    owner: PgConnectOptions,
    embedded: Option<EmbeddedPostgres>,
}

/// The role the application logs in as in the private cluster: a member of
/// `vaultcap_app` (made by the migrations), so it owns nothing and may only
/// append to the logs. Migrations there run as the cluster's superuser.
pub const APP_LOGIN: &str = "vaultcap";

impl Database {
    pub async fn open(args: &DatabaseArgs) -> anyhow::Result<Self> {
        let (owner, app, embedded) = match &args.database_url {
            Some(url) => {
                let app = PgConnectOptions::from_str(url)
                    .context("DATABASE_URL is not a PostgreSQL URL")?;
                let owner = match &args.migration_database_url {
                    Some(url) => PgConnectOptions::from_str(url)
                        .context("VAULTCAP_MIGRATION_DATABASE_URL is not a PostgreSQL URL")?,
                    None => app.clone(),
                };
                (owner, app, None)
            }
            None => {
                anyhow::ensure!(
                    args.migration_database_url.is_none(),
                    "VAULTCAP_MIGRATION_DATABASE_URL needs DATABASE_URL: the private cluster \
                     runs its migrations as its own superuser"
                );
                let dir = args.data_dir().join("postgres");
                let pg = EmbeddedPostgres::start(&dir).await?;
                tracing::info!(dir = %dir.display(), "private PostgreSQL cluster running");
                let owner = pg.connect_options(crate::embedded_pg::DATABASE);
                let app = owner.clone().username(APP_LOGIN);
                (owner, app, Some(pg))
            }
        };
        migrate(&owner, embedded.is_some()).await?;
        let pool = PgPoolOptions::new()
            .max_connections(args.db_max_connections)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_with(app.clone())
            .await
            .context("connecting to PostgreSQL")?;
        // Key lookups; the ledger's writer opens the last one of its own
        // (Ledger::start).
        let ledger_pool = PgPoolOptions::new()
            .max_connections(args.db_ledger_connections.max(2) - 1)
            .acquire_timeout(std::time::Duration::from_secs(5))
            // No ping before every lookup or ledger write: one more round
            // trip on the proxy's path. A connection that broke fails its
            // query, which refuses its calls (fail closed), and is then
            // replaced.
            .test_before_acquire(false)
            .connect_lazy_with(app);
        let protection = audit_chain::log_protection(&pool).await?;
        if protection.can_rewrite {
            tracing::warn!(
                role = %protection.role,
                "the application's database role can rewrite the audit log: give DATABASE_URL \
                 a role that is a member of vaultcap_app and run migrations through \
                 VAULTCAP_MIGRATION_DATABASE_URL (README: tamper evidence)"
            );
        }
        Ok(Self {
            pool,
            ledger_pool,
            owner,
            embedded,
        })
    }

    /// How to connect as the schema's owner.
    pub fn owner(&self) -> PgConnectOptions {
        self.owner.clone()
    }

    /// Closes the pool and stops the private cluster if this process started it.
    pub async fn close(self) -> anyhow::Result<()> {
        self.ledger_pool.close().await;
        self.pool.close().await;
        if let Some(pg) = self.embedded {
            pg.stop().await?;
        }
        Ok(())
    }
}

/// Where the console's long reads go: the streaming replica `url` names,
/// or the primary itself. A replica that cannot be reached, or is not in
/// recovery, is said at start; metering never depends on it.
pub async fn reads(
    primary: &PgPool,
    url: Option<&str>,
    max_connections: u32,
    notice_after: chrono::Duration,
) -> anyhow::Result<Reads> {
    let Some(url) = url else {
        return Ok(Reads::primary(primary.clone()));
    };
    let options = PgConnectOptions::from_str(url)
        .context("VAULTCAP_READ_DATABASE_URL is not a PostgreSQL URL")?;
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect_lazy_with(options);
    match sqlx::query_scalar::<_, bool>("SELECT pg_is_in_recovery()")
        .fetch_one(&pool)
        .await
    {
        Ok(true) => tracing::info!("the console's long reads go to the read replica"),
        Ok(false) => tracing::warn!(
            "VAULTCAP_READ_DATABASE_URL names a server that is not a replica (not in recovery): \
             pages read from it may show another database's rows"
        ),
        Err(err) => tracing::warn!(
            error = %err,
            "the read replica cannot be reached: the audit log, exports, the action log, charts \
             and reconciliation listings fail until it can (metering is unaffected)"
        ),
    }
    Ok(Reads::replica(pool, notice_after))
}

/// Brings the schema up to date as its owner, on a connection of its own.
/// In the private cluster it also makes the application's login role.
async fn migrate(owner: &PgConnectOptions, private_cluster: bool) -> anyhow::Result<()> {
    let mut conn = owner
        .connect()
        .await
        .context("connecting to PostgreSQL to run migrations")?;
    MIGRATOR
        .run(&mut conn)
        .await
        .context("running database migrations")?;
    if private_cluster {
        ensure_login_role(&mut conn, APP_LOGIN).await?;
    }
    conn.close().await?;
    Ok(())
}

/// Creates `name`, a login role in `vaultcap_app`, unless it exists.
pub async fn ensure_login_role(conn: &mut PgConnection, name: &str) -> anyhow::Result<()> {
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)")
            .bind(name)
            .fetch_one(&mut *conn)
            .await?;
    if !exists {
        // A role name cannot be a bind parameter; this one is a constant.
        let created = sqlx::query(&format!(
            "CREATE ROLE \"{name}\" LOGIN IN ROLE vaultcap_app"
        ))
        .execute(&mut *conn)
        .await;
        match created {
            // Made by another process at the same moment.
            Err(sqlx::Error::Database(err))
                if matches!(err.code().as_deref(), Some("42710" | "23505")) => {}
            other => {
                other
                    .with_context(|| format!("creating the application's database role {name}"))?;
            }
        }
    }
    Ok(())
}
