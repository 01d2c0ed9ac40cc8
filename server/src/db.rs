//! Opening the database: an existing server from `DATABASE_URL`, or the
//! private cluster. Migrations run on every open, so every command sees the
//! schema it was built for.

use std::str::FromStr;

use anyhow::Context;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};

use crate::{config::DatabaseArgs, embedded_pg::EmbeddedPostgres};

/// The migrations in `migrations/`, compiled into the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// An open database, and the private cluster behind it if there is one.
pub struct Database {
    /// The console's, the key API's and the background jobs' connections.
    pub pool: PgPool,
    /// The proxy's own: the spend ledger's writers and key lookups.
    pub ledger_pool: PgPool,
    embedded: Option<EmbeddedPostgres>,
}

impl Database {
    pub async fn open(args: &DatabaseArgs) -> anyhow::Result<Self> {
        let (options, embedded) = match &args.database_url {
            Some(url) => (
                PgConnectOptions::from_str(url).context("DATABASE_URL is not a PostgreSQL URL")?,
                None,
            ),
            None => {
                let dir = args.data_dir().join("postgres");
                let pg = EmbeddedPostgres::start(&dir).await?;
                tracing::info!(dir = %dir.display(), "private PostgreSQL cluster running");
                (pg.connect_options(crate::embedded_pg::DATABASE), Some(pg))
            }
        };
        let pool = PgPoolOptions::new()
            .max_connections(args.db_max_connections)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_with(options.clone())
            .await
            .context("connecting to PostgreSQL")?;
        let ledger_pool = PgPoolOptions::new()
            .max_connections(args.db_ledger_connections.max(2))
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_lazy_with(options);
        MIGRATOR
            .run(&pool)
            .await
            .context("running database migrations")?;
        Ok(Self {
            pool,
            ledger_pool,
            embedded,
        })
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
