//! The proxy's ledger writes, grouped across concurrent calls.
//!
//! Every metered call makes two durable writes (reserve before forwarding,
//! settle and audit after), and every refused call one. Made one by one,
//! each waits for its own commit, and calls on one hot key queue on its row
//! lock through every commit. Here writers take whatever calls are waiting
//! whenever they are free and write them in one statement and one commit:
//! the reservations and the settlements waiting at that moment together,
//! since most of a small batch's cost is the statement's and the commit's,
//! not its calls'. Nothing waits for a batch to fill: a lone call is
//! written at once, and under load the batches grow by themselves. Waiting
//! for the other calls in flight to join (tried: up to tokio's 1 ms timer
//! tick) grew the batches at 8 in flight from 2.4 to 3.8 calls of each
//! kind and cut PostgreSQL's CPU per call by about a fifth, but left the
//! writer idle 14-23 % of the time: faster at 8 in flight in four of six
//! alternated runs, slower at 64 in four of six, and a call on its way to
//! Stripe is no nearer for the wait.
//! Yielding to the scheduler instead grew the batches less and was slower
//! at both.
//!
//! One writer does it all. Each batch appends audit rows, and the audit
//! log's hash chain lets one transaction at a time hold its head, up to its
//! commit: a second writer (in lanes by key, tried) only waited for the
//! first, with smaller batches, and halved the throughput. Nor does a
//! second writer pay without that wait: with a chain per lane, so that
//! neither writer ever waited for the other (tried on 2 cores), two writers
//! were 21-24 % slower at 8 calls in flight and no faster at 64. Most of a
//! write's cost is fixed (its statements' start and its commit), so halving
//! the batches cost 1.5 times the PostgreSQL CPU per call. The price: a
//! batch waiting on a key that a console transaction holds delays every
//! call behind it for that transaction's few milliseconds. A batch locks
//! its keys in key order before the chain head (see the migrations), so it
//! never deadlocks with another instance's writer.
//!
//! One call must never cost another its write: a batch that fails (a row
//! the database refuses, a deadlock with another process) is written again
//! kind by kind, then call by call, so only a call that fails on its own
//! gets the error. The reservation queue is bounded: when it is full, new
//! calls are turned away before anything is reserved
//! ([`LedgerError::Overloaded`]).

use std::{fmt, future::Future, mem, sync::Arc, time::Instant};

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use app::keys::spend::{self, CallRecord, ReserveCall, Reserved};

/// The most calls of each kind written in one statement.
const MAX_BATCH: usize = 256;

/// Calls that may wait for a reservation at once; beyond this the database
/// is not keeping up and waiting longer helps nobody.
pub const RESERVE_QUEUE: usize = 4096;

/// Settlements and audit rows waiting for the writer before callers wait
/// for room.
const RECORD_QUEUE: usize = 4096;

/// Why a ledger write did not happen.
#[derive(Debug, Clone)]
pub enum LedgerError {
    /// The reservation queue is full: nothing was written.
    Overloaded,
    /// The database refused or could not be reached.
    Failed(Arc<String>),
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overloaded => f.write_str("the reservation queue is full"),
            Self::Failed(reason) => f.write_str(reason),
        }
    }
}

type Reply<R> = oneshot::Sender<Result<R, LedgerError>>;

type Waiting<T, R> = Vec<(T, Reply<R>)>;

#[derive(Clone)]
pub struct Ledger {
    reserve: mpsc::Sender<(ReserveCall, Reply<Reserved>)>,
    record: mpsc::Sender<(CallRecord, Reply<()>)>,
}

impl Ledger {
    /// Starts the writer on a connection of its own, opened as `pool`
    /// opens its own (one more than `pool` holds); at most `reserve_queue`
    /// calls wait for a reservation. It stops when the last clone is
    /// dropped.
    pub fn start(pool: &PgPool, reserve_queue: usize) -> Self {
        // One connection, so one backend does every write with its plans
        // and caches warm: taking whichever of a pool's connections was
        // idle longest (sqlx's order) spread the writes over four backends,
        // and one instead cut PostgreSQL's CPU per call at 8 in flight by
        // 11-24 % (three alternated runs). A connection that broke fails its
        // batch, which refuses its calls (fail closed), and is then
        // replaced.
        let writer = pool
            .options()
            .clone()
            .max_connections(1)
            .connect_lazy_with((*pool.connect_options()).clone());
        let (reserve, reserves) = mpsc::channel(reserve_queue.max(1));
        // Settlements are never turned away (Stripe has answered them): a
        // full queue makes them wait for room.
        let (record, records) = mpsc::channel(RECORD_QUEUE);
        tokio::spawn(write_all(writer, reserves, records));
        Self { reserve, record }
    }

    /// Reserves a call's amount against its key's cap (committed on return).
    pub async fn reserve(&self, call: ReserveCall) -> Result<Reserved, LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.reserve
            .try_send((call, reply))
            .map_err(|err| match err {
                mpsc::error::TrySendError::Full(_) => LedgerError::Overloaded,
                mpsc::error::TrySendError::Closed(_) => stopped(),
            })?;
        answer.await.map_err(|_| stopped())?
    }

    /// Settles a call's reservation, if any, and appends its audit row
    /// (committed together on return).
    pub async fn record(&self, call: CallRecord) -> Result<(), LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.record
            .send((call, reply))
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn stopped() -> LedgerError {
    LedgerError::Failed(Arc::new("the ledger writer has stopped".into()))
}

/// The writer: whatever of either kind is waiting when it is free, in one
/// write.
async fn write_all(
    pool: PgPool,
    mut reserves: mpsc::Receiver<(ReserveCall, Reply<Reserved>)>,
    mut records: mpsc::Receiver<(CallRecord, Reply<()>)>,
) {
    let mut reserving = Vec::with_capacity(MAX_BATCH);
    let mut recording = Vec::with_capacity(MAX_BATCH);
    loop {
        // Both queues close together, when the last Ledger is dropped.
        let taken = tokio::select! {
            taken = reserves.recv_many(&mut reserving, MAX_BATCH) => taken,
            taken = records.recv_many(&mut recording, MAX_BATCH) => taken,
        };
        if taken == 0 {
            break;
        }
        take_waiting(&mut reserves, &mut reserving);
        take_waiting(&mut records, &mut recording);
        let started = Instant::now();
        write(&pool, mem::take(&mut recording), mem::take(&mut reserving)).await;
        crate::metrics::ledger_written(started.elapsed());
    }
}

/// Adds what `queue` holds now to `batch`, up to a full batch.
fn take_waiting<T>(queue: &mut mpsc::Receiver<T>, batch: &mut Vec<T>) {
    while batch.len() < MAX_BATCH {
        match queue.try_recv() {
            Ok(item) => batch.push(item),
            Err(_) => break,
        }
    }
}

/// Writes the waiting calls: both kinds in one transaction when both
/// wait; when that fails, kind by kind.
async fn write(
    pool: &PgPool,
    recording: Waiting<CallRecord, ()>,
    reserving: Waiting<ReserveCall, Reserved>,
) {
    let record = |calls: Arc<[CallRecord]>| async move {
        spend::record_many(pool, &calls).await?;
        Ok(vec![(); calls.len()])
    };
    let reserve =
        |calls: Arc<[ReserveCall]>| async move { spend::reserve_many(pool, &calls).await };
    if reserving.is_empty() {
        return write_batch("record", recording, record).await;
    }
    if recording.is_empty() {
        return write_batch("reserve", reserving, reserve).await;
    }
    let (records, record_replies): (Vec<_>, Vec<_>) = recording.into_iter().unzip();
    let (reserves, reserve_replies): (Vec<_>, Vec<_>) = reserving.into_iter().unzip();
    let started = Instant::now();
    let span = tracing::info_span!(
        "ledger_write",
        kind = "both",
        calls = records.len() + reserves.len()
    );
    match again_if_rolled_back(records.len() + reserves.len(), || {
        spend::record_and_reserve(pool, &records, &reserves)
    })
    .instrument(span)
    .await
    {
        Ok(outcomes) => {
            crate::metrics::ledger_batch_written("record", records.len(), started.elapsed());
            crate::metrics::ledger_batch_written("reserve", reserves.len(), started.elapsed());
            answer(record_replies, records.iter().map(|_| Ok(())));
            answer(reserve_replies, outcomes.into_iter().map(Ok));
        }
        Err(err) => {
            crate::metrics::ledger_failed("batch");
            tracing::warn!(error = %err, records = records.len(), reserves = reserves.len(),
                "a ledger batch failed; writing its settlements and reservations apart");
            write_batch(
                "record",
                records.into_iter().zip(record_replies).collect(),
                record,
            )
            .await;
            write_batch(
                "reserve",
                reserves.into_iter().zip(reserve_replies).collect(),
                reserve,
            )
            .await;
        }
    }
}

/// Writes one kind's calls in one statement; when that fails, again one
/// call at a time, so a bad call fails alone (only then are calls copied).
async fn write_batch<T, R, W, F>(kind: &'static str, batch: Waiting<T, R>, write: W)
where
    T: Clone,
    W: Fn(Arc<[T]>) -> F,
    F: Future<Output = Result<Vec<R>, sqlx::Error>>,
{
    let (items, replies): (Vec<T>, Vec<Reply<R>>) = batch.into_iter().unzip();
    let items: Arc<[T]> = items.into();
    let alone = items.len() == 1;
    let started = Instant::now();
    let span = tracing::info_span!("ledger_write", kind, calls = items.len());
    match again_if_rolled_back(items.len(), || write(items.clone()))
        .instrument(span)
        .await
    {
        Ok(results) => {
            crate::metrics::ledger_batch_written(kind, items.len(), started.elapsed());
            answer(replies, results.into_iter().map(Ok))
        }
        Err(err) if alone => answer(replies, [Err(failed(err))]),
        Err(err) => {
            crate::metrics::ledger_failed("batch");
            tracing::warn!(error = %err, calls = items.len(),
                "a ledger batch failed; writing its calls one by one");
            for (item, reply) in items.iter().zip(replies) {
                let result =
                    match again_if_rolled_back(1, || write(Arc::from([item.clone()]))).await {
                        Ok(mut results) => results.pop().ok_or_else(|| {
                            LedgerError::Failed(Arc::new("the ledger returned no outcome".into()))
                        }),
                        Err(err) => Err(failed(err)),
                    };
                answer(vec![reply], [result]);
            }
        }
    }
}

/// How often a write PostgreSQL rolled back to break a deadlock, or could
/// not serialize, is tried in all.
const ATTEMPTS: u32 = 5;

/// Runs `write` (of `calls` calls), and again when PostgreSQL rolled the
/// whole transaction back to break a deadlock with another writer (another
/// instance's settlements, say) or could not serialize it: nothing of it
/// was kept, so writing it again writes it once. Any other error is the
/// caller's.
async fn again_if_rolled_back<R, W, F>(calls: usize, write: W) -> Result<R, sqlx::Error>
where
    W: Fn() -> F,
    F: Future<Output = Result<R, sqlx::Error>>,
{
    let mut attempt = 1;
    loop {
        match write().await {
            Err(err) if rolled_back(&err) && attempt < ATTEMPTS => {
                crate::metrics::ledger_failed("rolled_back");
                tracing::warn!(error = %err, attempt, calls,
                    "a ledger write was rolled back by PostgreSQL; writing it again");
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// `deadlock_detected` (40P01) or `serialization_failure` (40001).
fn rolled_back(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|err| err.code())
        .is_some_and(|code| code == "40P01" || code == "40001")
}

fn failed(err: sqlx::Error) -> LedgerError {
    LedgerError::Failed(Arc::new(err.to_string()))
}

fn answer<R>(replies: Vec<Reply<R>>, results: impl IntoIterator<Item = Result<R, LedgerError>>) {
    for (reply, result) in replies.into_iter().zip(results) {
        // A caller that went away needs no answer.
        let _ = reply.send(result);
    }
}
