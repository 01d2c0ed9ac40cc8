//! `vaultcap bench cap`: the cap under load. Concurrent clients fire charges
//! at one key whose cap admits exactly `admits` of them, through a real
//! `vaultcap serve` process in front of an instant fake Stripe; then the same
//! with that process killed (SIGKILL) and restarted mid-run; then three
//! instances behind HAProxy, one killed and one drained mid-run. Prints what
//! happened and fails unless the cap held and every call is accounted for.
//!
//! Clients behave like a billing job with idempotency keys: one key per
//! charge, and a charge whose connection broke is retried with the same key
//! once the proxy is back. The fake Stripe honours those keys as Stripe does
//! (a retry returns the original charge), and counts the money it took.
//!
//! With `--hostile H`, H hostile calls are spread among the charges (bytes
//! Stripe would read another way than Vaultcap, Stripe's limits broken,
//! headers sent twice, a key of NUL bytes): each must be refused, audited,
//! and cost the honest charges nothing.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context};
use clap::Args;
use tokio::sync::watch;

use super::{issue_key, serve, BenchDatabase, FakeStripe, ServeProcess};
use app::{
    domain::{Cents, VaultKeyId},
    keys::{spend, sql::VaultKeyRow},
};

/// Every charge is for this many cents.
const AMOUNT: i64 = 100;

#[derive(Debug, Args)]
pub struct CapBenchArgs {
    /// Charges fired per run.
    #[arg(long, default_value_t = 10_000)]
    charges: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// How many charges the key's cap admits.
    #[arg(long, default_value_t = 2_500)]
    admits: usize,
    /// Times the proxy is killed and restarted in the second run.
    #[arg(long, default_value_t = 2)]
    kills: usize,
    /// Hostile calls mixed among the charges in both runs.
    #[arg(long, default_value_t = 0)]
    hostile: usize,
}

pub async fn run(args: CapBenchArgs) -> anyhow::Result<()> {
    let binary = std::env::current_exe().context("finding the vaultcap binary")?;
    println!(
        "vaultcap bench cap: {} charges of {AMOUNT} cents and {} hostile calls, {} clients, a cap admitting {}",
        args.charges, args.hostile, args.concurrency, args.admits
    );
    let load = Load {
        binary,
        charges: args.charges,
        concurrency: args.concurrency,
        admits: args.admits,
        kills: 0,
        hostile: args.hostile,
    };
    let steady = load.run().await?;
    steady.print("no kills");
    steady.check_exact()?;

    let killed = Load {
        kills: args.kills,
        ..load.clone()
    }
    .run()
    .await?;
    killed.print(&format!("{} kills", args.kills));
    killed.check_held()?;

    let fleet = load.run_behind_haproxy().await?;
    fleet.print("three instances behind HAProxy, one killed, one drained");
    fleet.check_held()?;
    println!("\nthe cap held and every call is accounted for in all three runs");
    Ok(())
}

/// One run's shape.
#[derive(Debug, Clone)]
pub struct Load {
    /// The `vaultcap` binary to serve with.
    pub binary: PathBuf,
    pub charges: usize,
    pub concurrency: usize,
    pub admits: usize,
    /// SIGKILLs, spread evenly over the admitted charges, each followed by
    /// a restart.
    pub kills: usize,
    /// Hostile calls spread evenly among the charges.
    pub hostile: usize,
}

/// What a run did, from the clients', the fake Stripe's and the ledger's
/// side.
#[derive(Debug, Clone)]
pub struct Report {
    pub attempts: usize,
    pub admits: usize,
    pub elapsed: Duration,
    /// Charges answered 200 / 402 `spend_cap_exceeded` / anything else.
    pub succeeded: usize,
    pub refused_cap: usize,
    pub other_answers: Vec<String>,
    /// Hostile calls sent, and those answered other than with a 4xx.
    pub hostile: usize,
    pub hostile_not_refused: Vec<String>,
    /// Audit rows of hostile calls (under the key or without one).
    pub hostile_audit_rows: i64,
    /// Connections that broke (the proxy was killed) and were retried.
    pub retries: usize,
    /// Retries answered 409 while their first try's lease ran.
    pub in_flight_retries: usize,
    /// Distinct charges the fake Stripe made, and the money they took.
    pub upstream_charges: usize,
    pub upstream_cents: Cents,
    pub cap_cents: Cents,
    pub spent_cents: Cents,
    pub reserved_cents: Cents,
    pub audit_rows: i64,
    /// Charges (idempotency keys) with at least one audit row.
    pub audited_charges: i64,
    /// Each charge without an audit row, with what its reservations say
    /// (so a failed check names the call to look for in serve.log).
    pub unaudited_charges: Vec<String>,
    /// Charges Stripe made with no reservation under their idempotency key.
    pub unreserved_upstream_charges: i64,
    /// Charge ids clients received that no audit row names.
    pub unaudited_successes: i64,
}

impl Load {
    fn serve_env(&self, db: &BenchDatabase, stripe: &str) -> Vec<(&'static str, String)> {
        let mut env = db.serve_env(stripe);
        // The fake Stripe answers at once: a short timeout makes the calls
        // a killed process abandoned free for their retries soon.
        env.push(("VAULTCAP_UPSTREAM_TIMEOUT_SECS", "1".to_owned()));
        env
    }

    pub async fn run(&self) -> anyhow::Result<Report> {
        BenchDatabase::around(async |db| self.run_in(db).await).await
    }

    async fn run_in(&self, db: &BenchDatabase) -> anyhow::Result<Report> {
        let (secret, key) = self.issue_key(db).await?;
        let stripe = FakeStripe::default();
        let stripe_base = format!("http://{}", serve(stripe.router()).await?);
        let log = db.scratch().join("serve.log");
        let mut proxy =
            ServeProcess::start(&self.binary, &self.serve_env(db, &stripe_base), &log).await?;
        let (base_tx, base_rx) = watch::channel(proxy.base.clone());
        let clients = self.clients(&secret, base_rx, false)?;

        // Kill and restart at evenly spaced points while the cap still
        // admits charges, so that kills cut off calls that move money.
        let mut answered = clients.answered.clone();
        for kill in 1..=self.kills {
            let at = self.admits * kill / (self.kills + 1);
            answered.wait_for(|count| *count >= at).await?;
            proxy.kill().await?;
            proxy =
                ServeProcess::start(&self.binary, &self.serve_env(db, &stripe_base), &log).await?;
            base_tx.send_replace(proxy.base.clone());
        }

        let (tally, elapsed) = clients.finish().await?;
        proxy.stop().await?;
        self.report(db, key.id, &stripe, tally, elapsed).await
    }

    /// The run as a fleet: three instances behind HAProxy (Debian's
    /// package), health-checked on `/readyz`. A third of the way through
    /// the admitted charges the first instance is killed (SIGKILL), two
    /// thirds of the way the second is drained (SIGTERM); clients see
    /// broken connections and HAProxy's 502s and retry each charge with its
    /// Idempotency-Key, as a billing job would. `kills` is not used.
    pub async fn run_behind_haproxy(&self) -> anyhow::Result<Report> {
        BenchDatabase::around(async |db| self.fleet_in(db).await).await
    }

    async fn fleet_in(&self, db: &BenchDatabase) -> anyhow::Result<Report> {
        let (secret, key) = self.issue_key(db).await?;
        let stripe = FakeStripe::default();
        let stripe_base = format!("http://{}", serve(stripe.router()).await?);
        let log = db.scratch().join("serve.log");
        let mut env = self.serve_env(db, &stripe_base);
        env.push(("VAULTCAP_DRAIN_SECS", "1".to_owned()));
        let mut instances = Vec::new();
        for _ in 0..3 {
            instances.push(ServeProcess::start(&self.binary, &env, &log).await?);
        }
        let balancer = HaProxy::start(db.scratch(), &instances).await?;
        let (_base, base_rx) = watch::channel(balancer.base.clone());
        let clients = self.clients(&secret, base_rx, true)?;

        let mut answered = clients.answered.clone();
        answered.wait_for(|count| *count >= self.admits / 3).await?;
        instances[0].kill().await?;
        answered
            .wait_for(|count| *count >= self.admits * 2 / 3)
            .await?;
        instances[1].signal(nix::sys::signal::Signal::SIGTERM)?;

        let (tally, elapsed) = clients.finish().await?;
        instances[1].wait().await.context("the drained instance")?;
        instances
            .pop()
            .context("the third instance")?
            .stop()
            .await?;
        drop(balancer);
        self.report(db, key.id, &stripe, tally, elapsed).await
    }

    async fn issue_key(&self, db: &BenchDatabase) -> anyhow::Result<(String, VaultKeyRow)> {
        issue_key(&db.pool, Cents(self.admits as i64 * AMOUNT)).await
    }

    /// `concurrency` clients sending the run's charges and hostile calls to
    /// `base`, each charge until it has an answer.
    fn clients(
        &self,
        secret: &str,
        base: watch::Receiver<String>,
        behind_balancer: bool,
    ) -> anyhow::Result<Clients> {
        let (answered_tx, answered) = watch::channel(0usize);
        let answered_tx = Arc::new(answered_tx);
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(self.concurrency)
            .build()?;
        let started = Instant::now();
        let mut running = tokio::task::JoinSet::new();
        for _ in 0..self.concurrency {
            let charger = Charger {
                client: client.clone(),
                secret: secret.to_owned(),
                base: base.clone(),
                behind_balancer,
            };
            let (next, answered) = (next.clone(), answered_tx.clone());
            let (charges, hostile) = (self.charges, self.hostile);
            running.spawn(async move {
                let mut tally = Tally::default();
                let total = charges + hostile;
                loop {
                    let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if n >= total {
                        return Ok::<_, anyhow::Error>(tally);
                    }
                    // Hostile calls fall evenly among the charges.
                    let hostile_before = n * hostile / total;
                    if (n + 1) * hostile / total > hostile_before {
                        charger.hostile(hostile_before, &mut tally).await?;
                        continue;
                    }
                    charger.charge(n - hostile_before, &mut tally).await?;
                    answered.send_modify(|count| *count += 1);
                }
            });
        }
        Ok(Clients {
            running,
            answered,
            started,
        })
    }

    /// What the clients, the fake Stripe and the ledger say about the run.
    async fn report(
        &self,
        db: &BenchDatabase,
        key: VaultKeyId,
        stripe: &FakeStripe,
        tally: Tally,
        elapsed: Duration,
    ) -> anyhow::Result<Report> {
        // Reservations the killed processes left pending are recorded as
        // outcome unknown (what `serve` does for older ones at start-up).
        spend::sweep_abandoned(&db.pool, -3600).await?;
        let (spent_cents, reserved_cents): (Cents, Cents) =
            sqlx::query_as("SELECT spent_cents, reserved_cents FROM vault_keys WHERE id = $1")
                .bind(key)
                .fetch_one(&db.pool)
                .await?;
        let (audit_rows, audited_charges): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(DISTINCT idempotency_key) FROM audit_log
             WHERE vault_key_id = $1 AND (idempotency_key LIKE 'charge-%')",
        )
        .bind(key)
        .fetch_one(&db.pool)
        .await?;
        let unaudited_charges: Vec<String> = sqlx::query_scalar(
            "SELECT k || ': ' || coalesce((SELECT string_agg(r.state || ' ' || r.created_at::text, ', ')
                                           FROM reservations r WHERE r.idempotency_key = k), 'no reservation')
             FROM (SELECT 'charge-' || n AS k FROM generate_series(0, $2 - 1) AS n) charges
             WHERE NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.vault_key_id = $1 AND a.idempotency_key = k)",
        )
        .bind(key)
        .bind(self.charges as i64)
        .fetch_all(&db.pool)
        .await?;
        let hostile_audit_rows: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM audit_log
             WHERE vault_key_id IS NULL OR idempotency_key IS NULL OR idempotency_key NOT LIKE 'charge-%'",
        )
        .fetch_one(&db.pool)
        .await?;
        let charged = stripe.charges();
        let unreserved_upstream_charges: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM unnest($1::text[]) AS k
             WHERE NOT EXISTS (SELECT 1 FROM reservations r WHERE r.vault_key_id = $2 AND r.idempotency_key = k)",
        )
        .bind(charged.keys().cloned().collect::<Vec<_>>())
        .bind(key)
        .fetch_one(&db.pool)
        .await?;
        let unaudited_successes: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM unnest($1::text[]) AS c
             WHERE NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.vault_key_id = $2 AND a.stripe_object_id = c)",
        )
        .bind(&tally.charge_ids)
        .bind(key)
        .fetch_one(&db.pool)
        .await?;

        Ok(Report {
            attempts: self.charges,
            admits: self.admits,
            elapsed,
            succeeded: tally.succeeded,
            refused_cap: tally.refused_cap,
            other_answers: tally.other_answers,
            hostile: self.hostile,
            hostile_not_refused: tally.hostile_not_refused,
            hostile_audit_rows,
            retries: tally.retries,
            in_flight_retries: tally.in_flight_retries,
            upstream_charges: charged.len(),
            upstream_cents: Cents(charged.len() as i64 * AMOUNT),
            cap_cents: Cents(self.admits as i64 * AMOUNT),
            spent_cents,
            reserved_cents,
            audit_rows,
            audited_charges,
            unaudited_charges,
            unreserved_upstream_charges,
            unaudited_successes,
        })
    }
}

impl Report {
    /// What the ledger holds against the key: spent plus reserved.
    fn accounted(&self) -> Cents {
        Cents(self.spent_cents.0 + self.reserved_cents.0)
    }

    pub fn print(&self, name: &str) {
        println!("\n{name}: {:.1} s", self.elapsed.as_secs_f64());
        println!(
            "  answers         {} succeeded, {} refused for the cap, {} other, {} retried after a broken connection \
             ({} answers 409 while the killed call's lease ran, or 503 while the ledger was unreachable)",
            self.succeeded,
            self.refused_cap,
            self.other_answers.len(),
            self.retries,
            self.in_flight_retries
        );
        println!(
            "  Stripe charged  {} charges, {} cents (cap {} cents)",
            self.upstream_charges, self.upstream_cents.0, self.cap_cents.0
        );
        println!(
            "  ledger          spent {} + reserved {} cents",
            self.spent_cents.0, self.reserved_cents.0
        );
        println!(
            "  audit log       {} rows for {} of {} charges",
            self.audit_rows, self.audited_charges, self.attempts
        );
        if self.hostile > 0 {
            println!(
                "  hostile calls   {} sent, {} refused, {} audit rows",
                self.hostile,
                self.hostile - self.hostile_not_refused.len(),
                self.hostile_audit_rows
            );
        }
    }

    /// Without kills: exactly `admits` charges succeed and everything adds
    /// up to the cent.
    pub fn check_exact(&self) -> anyhow::Result<()> {
        self.check_held()?;
        ensure!(
            self.succeeded == self.admits,
            "{} succeeded, {} admitted",
            self.succeeded,
            self.admits
        );
        ensure!(self.upstream_charges == self.admits);
        ensure!(self.refused_cap == self.attempts - self.admits);
        ensure!(self.spent_cents == self.cap_cents && self.reserved_cents == Cents(0));
        ensure!(
            self.audit_rows == self.attempts as i64,
            "{} audit rows for {} calls",
            self.audit_rows,
            self.attempts
        );
        Ok(())
    }

    /// With or without kills: never a cent over the cap, and every charge
    /// and every call accounted for.
    pub fn check_held(&self) -> anyhow::Result<()> {
        ensure!(
            self.hostile_not_refused.is_empty(),
            "hostile calls not refused: {:?}",
            &self.hostile_not_refused[..self.hostile_not_refused.len().min(5)]
        );
        ensure!(
            self.hostile_audit_rows >= self.hostile as i64,
            "{} hostile calls, {} audit rows for them",
            self.hostile,
            self.hostile_audit_rows
        );
        ensure!(
            self.other_answers.is_empty(),
            "unexpected answers: {:?}",
            &self.other_answers[..self.other_answers.len().min(5)]
        );
        ensure!(
            self.succeeded + self.refused_cap == self.attempts,
            "every charge was answered"
        );
        ensure!(
            self.upstream_cents <= self.cap_cents,
            "Stripe took {} cents over a cap of {}",
            self.upstream_cents.0,
            self.cap_cents.0
        );
        ensure!(
            self.upstream_cents <= self.accounted(),
            "Stripe took {} cents; the ledger accounts for {} spent + {} reserved",
            self.upstream_cents.0,
            self.spent_cents.0,
            self.reserved_cents.0
        );
        ensure!(self.accounted() <= self.cap_cents);
        ensure!(
            self.spent_cents <= self.upstream_cents,
            "the ledger counts {} cents spent; Stripe took {}",
            self.spent_cents.0,
            self.upstream_cents.0
        );
        ensure!(
            self.succeeded <= self.upstream_charges,
            "{} successes for {} charges",
            self.succeeded,
            self.upstream_charges
        );
        ensure!(
            self.unreserved_upstream_charges == 0,
            "{} charges reached Stripe without a reservation",
            self.unreserved_upstream_charges
        );
        ensure!(
            self.audited_charges == self.attempts as i64,
            "{} of {} charges have an audit row; without one: {:?}",
            self.audited_charges,
            self.attempts,
            self.unaudited_charges
        );
        ensure!(
            self.unaudited_successes == 0,
            "{} charges clients saw succeed are missing from the audit log",
            self.unaudited_successes
        );
        Ok(())
    }
}

/// The clients of a run, sending.
struct Clients {
    running: tokio::task::JoinSet<anyhow::Result<Tally>>,
    /// Charges answered so far.
    answered: watch::Receiver<usize>,
    started: Instant,
}

impl Clients {
    /// Waits for every client; their tallies together, and how long it took.
    async fn finish(mut self) -> anyhow::Result<(Tally, Duration)> {
        let mut tally = Tally::default();
        while let Some(done) = self.running.join_next().await {
            tally.add(done??);
        }
        Ok((tally, self.started.elapsed()))
    }
}

/// HAProxy in front of `vaultcap serve` instances, in the foreground of
/// its own process (killed when dropped).
pub(super) struct HaProxy {
    _process: tokio::process::Child,
    pub(super) base: String,
}

impl HaProxy {
    pub(super) async fn start(
        scratch: &std::path::Path,
        instances: &[ServeProcess],
    ) -> anyhow::Result<Self> {
        let port = {
            let free = std::net::TcpListener::bind("127.0.0.1:0")?;
            free.local_addr()?.port()
        };
        let servers: String = instances
            .iter()
            .enumerate()
            .map(|(n, instance)| {
                let addr = instance.base.trim_start_matches("http://");
                format!("    server vaultcap{n} {addr} check\n")
            })
            .collect();
        // Only a connection that failed is sent again by HAProxy: a call
        // that reached an instance is the client's to retry, with its
        // Idempotency-Key.
        let config = format!(
            "global\n    maxconn 1024\n\
             defaults\n    mode http\n    timeout connect 1s\n    timeout client 60s\n\
             \x20   timeout server 60s\n    retries 3\n    retry-on conn-failure\n\
             \x20   option redispatch 1\n\
             frontend proxy\n    bind 127.0.0.1:{port}\n    default_backend vaultcap\n\
             backend vaultcap\n    balance roundrobin\n    option httpchk GET /readyz\n\
             \x20   http-check expect status 200\n    default-server inter 200ms fall 1 rise 2\n\
             {servers}"
        );
        let path = scratch.join("haproxy.cfg");
        std::fs::write(&path, config)?;
        let log = std::fs::File::create(scratch.join("haproxy.log"))?;
        let process = tokio::process::Command::new("/usr/sbin/haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context(
                "starting /usr/sbin/haproxy (Debian's haproxy package; scripts/setup installs it)",
            )?;
        let base = format!("http://127.0.0.1:{port}");
        // Ready once it answers through to an instance.
        let client = reqwest::Client::new();
        let started = Instant::now();
        loop {
            match client.get(format!("{base}/readyz")).send().await {
                Ok(answer) if answer.status().is_success() => break,
                _ if started.elapsed() > Duration::from_secs(10) => {
                    anyhow::bail!("HAProxy did not answer within 10 s: see haproxy.log")
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        Ok(Self {
            _process: process,
            base,
        })
    }
}

/// One client's view of a run.
#[derive(Debug, Default)]
struct Tally {
    succeeded: usize,
    refused_cap: usize,
    other_answers: Vec<String>,
    hostile_not_refused: Vec<String>,
    retries: usize,
    in_flight_retries: usize,
    charge_ids: Vec<String>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.succeeded += other.succeeded;
        self.refused_cap += other.refused_cap;
        self.other_answers.extend(other.other_answers);
        self.hostile_not_refused.extend(other.hostile_not_refused);
        self.retries += other.retries;
        self.in_flight_retries += other.in_flight_retries;
        self.charge_ids.extend(other.charge_ids);
    }
}

/// A billing job's charge loop.
struct Charger {
    client: reqwest::Client,
    secret: String,
    base: watch::Receiver<String>,
    /// Sending through a load balancer: the address stays, and a broken
    /// call comes back as a broken connection or the balancer's own 5xx.
    behind_balancer: bool,
}

impl Charger {
    /// Charge `n` until it gets an answer, retrying with the same
    /// Idempotency-Key when the connection breaks.
    async fn charge(&self, n: usize, tally: &mut Tally) -> anyhow::Result<()> {
        loop {
            let base = self.base.borrow().clone();
            let sent = self
                .client
                .post(format!("{base}/v1/charges"))
                .bearer_auth(&self.secret)
                .header("idempotency-key", format!("charge-{n}"))
                .form(&[
                    ("amount", AMOUNT.to_string()),
                    ("currency", "usd".into()),
                    ("customer", format!("cus_{n}")),
                ])
                .send()
                .await;
            let answer = match sent {
                Ok(response) => {
                    let status = response.status();
                    response.bytes().await.map(|body| (status, body))
                }
                Err(err) => Err(err),
            };
            let (status, body) = match answer {
                Ok(answer) => answer,
                Err(err) if err.is_connect() || err.is_request() || err.is_body() => {
                    tally.retries += 1;
                    self.reconnect(&base).await?;
                    continue;
                }
                Err(err) => return Err(err.into()),
            };
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            if self.balancer_failed(status, &body) {
                tally.retries += 1;
                self.reconnect(&base).await?;
                continue;
            }
            let in_use =
                status.as_u16() == 409 && body["error"]["code"] == "idempotency_key_in_use";
            // A restarted proxy whose ledger connection is not back yet
            // fails closed and says to retry: nothing was forwarded.
            let unavailable =
                status.as_u16() == 503 && body["error"]["code"] == "spend_ledger_unavailable";
            if in_use || unavailable {
                // The call was in flight in a killed process: until the
                // time that process answered for it has passed, Vaultcap
                // says so, as Stripe would. Retried as Stripe's SDKs do.
                tally.in_flight_retries += 1;
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
            match status.as_u16() {
                200 => {
                    tally.succeeded += 1;
                    tally
                        .charge_ids
                        .push(body["id"].as_str().unwrap_or_default().to_owned());
                }
                402 if body["error"]["code"] == "spend_cap_exceeded" => tally.refused_cap += 1,
                _ => tally.other_answers.push(format!("{status}: {body}")),
            }
            return Ok(());
        }
    }
}

impl Charger {
    /// After a broken connection: a moment's pause behind a balancer (it
    /// sends the retry to an instance still up), otherwise a wait until the
    /// killed proxy is back at a new address.
    async fn reconnect(&self, base: &str) -> anyhow::Result<()> {
        if self.behind_balancer {
            tokio::time::sleep(Duration::from_millis(50)).await;
            return Ok(());
        }
        let mut base_rx = self.base.clone();
        tokio::time::timeout(
            Duration::from_secs(60),
            base_rx.wait_for(|current| current != base),
        )
        .await
        .context("the proxy did not come back within 60 s")??;
        Ok(())
    }

    /// The balancer's own error (its instance died mid-call, or none was
    /// up), not an answer from Vaultcap, which always says why in JSON.
    fn balancer_failed(&self, status: reqwest::StatusCode, body: &serde_json::Value) -> bool {
        self.behind_balancer && matches!(status.as_u16(), 502..=504) && body.get("error").is_none()
    }

    /// Hostile call `n` (of six kinds, in turn): it must come back 4xx. A
    /// broken connection (the proxy was killed) is sent again.
    async fn hostile(&self, n: usize, tally: &mut Tally) -> anyhow::Result<()> {
        let honest = format!("amount={AMOUNT}&currency=usd&customer=cus_hostile{n}");
        loop {
            let base = self.base.borrow().clone();
            let mut request = self
                .client
                .post(format!("{base}/v1/charges"))
                .header("content-type", "application/x-www-form-urlencoded");
            request = if n % 6 == 5 {
                request.header("authorization", "Basic AAAAAA==")
            } else {
                request.bearer_auth(&self.secret)
            };
            let body = match n % 6 {
                0 => format!("{honest}&amount=99999"),
                1 => format!("{honest};amount=99999"),
                2 => format!("{honest}&metadata%5Bcustomer_id%5D=a%00b"),
                3 => {
                    request = request.header("idempotency-key", "k".repeat(6000));
                    honest.clone()
                }
                4 => {
                    request = request
                        .header("idempotency-key", format!("hostile-{n}-a"))
                        .header("idempotency-key", format!("hostile-{n}-b"));
                    honest.clone()
                }
                _ => honest.clone(),
            };
            match request.body(body).send().await {
                Ok(response) => {
                    let status = response.status();
                    let body = response.text().await.unwrap_or_default();
                    let json = serde_json::from_str(&body).unwrap_or_default();
                    if self.balancer_failed(status, &json) {
                        self.reconnect(&base).await?;
                        continue;
                    }
                    if !status.is_client_error() {
                        tally
                            .hostile_not_refused
                            .push(format!("hostile {n}: {status} {body}"));
                    }
                    return Ok(());
                }
                Err(err) if err.is_connect() || err.is_request() || err.is_body() => {
                    self.reconnect(&base).await?;
                }
                Err(err) => return Err(err.into()),
            }
        }
    }
}
