//! A private PostgreSQL cluster for `vaultcap serve` without `DATABASE_URL`:
//! the machine's own PostgreSQL binaries, a data directory of ours, a Unix
//! socket inside it and no TCP listener, so nothing else on the machine can
//! reach the database and nothing clashes with a system PostgreSQL.

use std::{
    ffi::OsStr,
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context};
use sqlx::postgres::PgConnectOptions;

/// The socket's port number only names the socket file; there is no TCP.
const PORT: u16 = 5432;
/// The database Vaultcap uses inside its cluster.
pub const DATABASE: &str = "vaultcap";
/// Unix socket paths are limited to 107 bytes on Linux.
const MAX_SOCKET_PATH: usize = 107;

pub struct EmbeddedPostgres {
    cluster_dir: PathBuf,
    bin_dir: PathBuf,
    /// `Some` when we are root and run PostgreSQL as the `postgres` user:
    /// `initdb` refuses to run as root.
    run_as: Option<nix::unistd::User>,
    /// Whether this process started the server (and so must stop it).
    started_here: bool,
    /// `name=value` server settings given when this process starts it.
    settings: Vec<String>,
}

impl EmbeddedPostgres {
    /// Initialises the cluster on first use and starts it (or joins it if
    /// another Vaultcap process already runs it).
    pub async fn start(cluster_dir: &Path) -> anyhow::Result<Self> {
        Self::start_with(cluster_dir, &[]).await
    }

    /// As [`Self::start`], with `name=value` server settings (used only if
    /// this process starts the server).
    pub async fn start_with(cluster_dir: &Path, settings: &[&str]) -> anyhow::Result<Self> {
        let bin_dir = find_binaries()?;
        let run_as = if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("postgres")
                .context("looking up the postgres system user")?
                .context(
                    "running as root, Vaultcap starts PostgreSQL as the `postgres` system user \
                     (initdb refuses root), but there is no such user: install PostgreSQL's \
                     server package (apt-get install postgresql) or run as a normal user",
                )?;
            Some(user)
        } else {
            None
        };
        let socket = cluster_dir.join(format!(".s.PGSQL.{PORT}"));
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            bail!(
                "the data directory path is too long for a Unix socket ({} bytes, at most {}): choose a shorter --data-dir",
                socket.as_os_str().len(),
                MAX_SOCKET_PATH
            );
        }
        if let Some(user) = &run_as {
            check_reachable_by(cluster_dir, user)?;
        }
        let mut pg = Self {
            cluster_dir: cluster_dir.to_owned(),
            bin_dir,
            run_as,
            started_here: false,
            settings: settings.iter().map(|s| s.to_string()).collect(),
        };
        let dir = pg.cluster_dir.clone();
        let pg = tokio::task::spawn_blocking(move || -> anyhow::Result<Self> {
            pg.init_if_needed()?;
            if !pg.is_running()? {
                pg.start_server()?;
                pg.started_here = true;
            }
            Ok(pg)
        })
        .await
        .context("PostgreSQL start-up task failed")?
        .with_context(|| {
            format!(
                "starting the private PostgreSQL cluster in {}",
                dir.display()
            )
        })?;
        pg.ensure_database().await?;
        Ok(pg)
    }

    /// How to connect: through the socket in the cluster directory.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.cluster_dir)
            .port(PORT)
            .username("postgres")
            .database(database)
    }

    /// The same as a URL, for tools such as psql and `sqlx::test`.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@localhost:{PORT}/{database}?host={}",
            self.cluster_dir.display()
        )
    }

    /// A PostgreSQL client program (`pgbench`, `pg_dump`, `pg_restore`,
    /// `psql`, …) pointed at this cluster as `postgres`, the database still
    /// to name as the program takes it: for benchmarks that compare with it
    /// and for the backup and restore drill.
    pub fn client(&self, program: &str) -> Command {
        // A client: it need not run as the postgres user.
        let mut cmd = Command::new(self.program(program));
        cmd.arg("-h")
            .arg(&self.cluster_dir)
            .args(["-p", &PORT.to_string(), "-U", "postgres"]);
        cmd
    }

    /// The postmaster's process id (the first line of `postmaster.pid`).
    pub fn postmaster_pid(&self) -> anyhow::Result<u32> {
        let file = self.cluster_dir.join("postmaster.pid");
        std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?
            .lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .with_context(|| format!("no process id in {}", file.display()))
    }

    /// Stops the server if this process started it ("fast" shutdown: open
    /// transactions are rolled back, data is flushed).
    pub async fn stop(self) -> anyhow::Result<()> {
        if !self.started_here {
            return Ok(());
        }
        tokio::task::spawn_blocking(move || {
            run(self.pg_ctl(["stop", "-m", "fast", "-w"]), "pg_ctl stop")
        })
        .await?
    }

    /// A hot standby of this cluster in `dir` (which must not hold one
    /// yet): a base backup by `pg_basebackup -R`, which also writes how to
    /// stream from here, then started. For the read replica's test.
    pub async fn start_standby(&self, dir: &Path) -> anyhow::Result<Self> {
        self.make_dir(dir)?;
        let mut backup = self.command("pg_basebackup");
        backup
            .arg("-h")
            .arg(&self.cluster_dir)
            .args(["-p", &PORT.to_string(), "-U", "postgres"])
            .args(["-R", "-X", "stream", "--checkpoint=fast", "-D"])
            .arg(dir);
        tokio::task::spawn_blocking(move || run(backup, "pg_basebackup")).await??;
        // The copy holds the primary's socket lock file (its socket lives
        // in its data directory), which would stop the standby starting.
        let lock = dir.join(format!(".s.PGSQL.{PORT}.lock"));
        std::fs::remove_file(&lock).with_context(|| format!("removing {}", lock.display()))?;
        // Long reads there are not cancelled for rows the primary vacuums.
        Self::start_with(dir, &["hot_standby_feedback=on"]).await
    }

    /// Makes a data directory only the server's user may enter.
    fn make_dir(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        if let Some(user) = &self.run_as {
            nix::unistd::chown(dir, Some(user.uid), Some(user.gid))
                .context("handing the cluster directory to the postgres user")?;
        }
        Ok(())
    }

    fn log_file(&self) -> PathBuf {
        self.cluster_dir.join("postgres.log")
    }

    fn init_if_needed(&self) -> anyhow::Result<()> {
        if self.cluster_dir.join("PG_VERSION").exists() {
            return Ok(());
        }
        self.make_dir(&self.cluster_dir)?;
        let mut initdb = self.command("initdb");
        initdb.arg("-D").arg(&self.cluster_dir).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        ]);
        run(initdb, "initdb")?;
        Ok(())
    }

    fn is_running(&self) -> anyhow::Result<bool> {
        // pg_ctl status: 0 running, 3 not running, 4 no data directory.
        let status = self
            .pg_ctl(["status"])
            .output()
            .context("running pg_ctl status")?
            .status;
        Ok(status.success())
    }

    fn start_server(&self) -> anyhow::Result<()> {
        let mut options = format!(
            "-k {} -p {PORT} -c listen_addresses=",
            self.cluster_dir.display()
        );
        for setting in &self.settings {
            options.push_str(" -c ");
            options.push_str(setting);
        }
        let output = self
            .pg_ctl(["start", "-w", "-t", "60"])
            .arg("-l")
            .arg(self.log_file())
            .arg("-o")
            .arg(options)
            .output()
            .context("running pg_ctl start")?;
        if !output.status.success() {
            let log = std::fs::read_to_string(self.log_file()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(10).collect();
            bail!(
                "PostgreSQL did not start: {}\n{}",
                String::from_utf8_lossy(&output.stderr).trim(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        Ok(())
    }

    async fn ensure_database(&self) -> anyhow::Result<()> {
        use sqlx::{ConnectOptions, Connection};
        let mut conn = self
            .connect_options("postgres")
            .connect()
            .await
            .context("connecting to the private cluster")?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(DATABASE)
                .fetch_one(&mut conn)
                .await?;
        if !exists {
            sqlx::query(&format!("CREATE DATABASE {DATABASE}"))
                .execute(&mut conn)
                .await?;
        }
        conn.close().await?;
        Ok(())
    }

    fn pg_ctl<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D").arg(&self.cluster_dir).args(args);
        cmd
    }

    /// A PostgreSQL program beside the server's, or else on PATH: some
    /// systems keep the clients (`pg_basebackup`, `psql`, …) apart.
    fn program(&self, name: &str) -> PathBuf {
        let beside_server = self.bin_dir.join(name);
        if beside_server.is_file() {
            beside_server
        } else {
            PathBuf::from(name)
        }
    }

    /// A PostgreSQL program run as the server's user.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.program(program));
        // The postgres user may not be able to enter our working directory.
        cmd.current_dir("/");
        if let Some(user) = &self.run_as {
            cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
            cmd.env("HOME", &user.dir).env("USER", &user.name);
        }
        cmd
    }
}

/// Runs a PostgreSQL tool to completion with its output captured (our own
/// stdout may be a pipe nobody reads any more), failing with its stderr.
fn run(mut command: Command, what: &str) -> anyhow::Result<()> {
    let output = command
        .output()
        .with_context(|| format!("running {what}"))?;
    if output.status.success() {
        Ok(())
    } else {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )
    }
}

/// The postgres user must be able to enter every directory above the
/// cluster; root's home and `mktemp -d` directories are closed to it.
fn check_reachable_by(cluster_dir: &Path, user: &nix::unistd::User) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    for dir in cluster_dir.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        let enterable = meta.mode() & 0o001 != 0
            || (meta.uid() == user.uid.as_raw() && meta.mode() & 0o100 != 0)
            || (meta.gid() == user.gid.as_raw() && meta.mode() & 0o010 != 0);
        if !enterable {
            bail!(
                "the postgres user cannot enter {} (mode {:o}), so PostgreSQL cannot reach its data \
                 directory {}: choose a --data-dir outside it (e.g. /var/lib/vaultcap) or `chmod o+x` it",
                dir.display(),
                meta.mode() & 0o777,
                cluster_dir.display()
            );
        }
    }
    Ok(())
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`: on `PATH`, or
/// the newest `/usr/lib/postgresql/<version>/bin` (Debian and Ubuntu keep
/// them off `PATH`).
pub fn find_binaries() -> anyhow::Result<PathBuf> {
    let has_all = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|bin| dir.join(bin).is_file())
    };
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(dir) = std::env::split_paths(&path).find(|dir| has_all(dir)) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            has_all(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, bin)) => Ok(bin),
        None => bail!(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) on PATH or under \
             /usr/lib/postgresql/*/bin. Install them with `sudo apt-get install postgresql` \
             (Debian/Ubuntu), or set DATABASE_URL to use an existing PostgreSQL server."
        ),
    }
}
