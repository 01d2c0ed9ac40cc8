//! The proxy's ledger writes, grouped across concurrent calls.
//!
//! Every metered call makes two durable writes (reserve before forwarding,
//! settle and audit after), and every refused call one. Made one by one,
//! each waits for its own commit, and calls on one hot key queue on its row
//! lock through every commit. Here writers take whatever calls are waiting
//! whenever they are free and write them in one statement and one commit.
//! Nothing waits for a batch to fill: a lone call is written at once, and
//! under load the batches grow by themselves.
//!
//! Reservations are written in lanes: a key's calls always go to the same
//! writer (its lane), so a hot key's calls are written together rather than
//! split over writers that then queue on its row lock, and a call on a key
//! of another lane is written beside a batch that waits on a locked key.
//! Settlements have one writer: each batch appends audit rows, and the
//! audit log's hash chain lets one transaction at a time hold its head, up
//! to its commit, so a second writer would only wait for the first, with
//! smaller batches. Batches lock keys in key order (see the migrations), so
//! writers never deadlock each other.
//!
//! One call must never cost another its write: a batch that fails (a row
//! the database refuses, a deadlock with another process) is written again
//! call by call, so only a call that fails on its own gets the error. The
//! reservation queue is bounded: when it is full, new calls are turned away
//! before anything is reserved ([`LedgerError::Overloaded`]).

use std::{fmt, future::Future, sync::Arc, time::Instant};

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use app::keys::spend::{self, CallRecord, ReserveCall, Reserved};

/// The most calls written in one statement.
const MAX_BATCH: usize = 256;

/// Calls that may wait for a reservation at once, an equal share in each
/// lane (so one hot key may queue its lane's share); beyond this the
/// database is not keeping up and waiting longer helps nobody.
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

#[derive(Clone)]
pub struct Ledger {
    reserve: Batcher<ReserveCall, Reserved>,
    record: Batcher<CallRecord, ()>,
}

impl Ledger {
    /// Starts `lanes` writers of reservations and one of settlements on
    /// `pool` (each holds one of its connections while it writes); at most
    /// `reserve_queue` calls wait for a reservation. They stop when the last
    /// clone is dropped.
    pub fn start(pool: PgPool, reserve_queue: usize, lanes: usize) -> Self {
        let reserve = Batcher::start(
            "reserve",
            reserve_queue,
            true,
            lanes,
            |call: &ReserveCall| call.key.0,
            {
                let pool = pool.clone();
                move |calls: Arc<[ReserveCall]>| {
                    let pool = pool.clone();
                    async move { spend::reserve_many(&pool, &calls).await }
                }
            },
        );
        // Settlements are never turned away (Stripe has answered them): a
        // full queue makes them wait for room.
        let record = Batcher::start(
            "record",
            RECORD_QUEUE,
            false,
            1,
            |_| 0,
            move |calls: Arc<[CallRecord]>| {
                let pool = pool.clone();
                async move {
                    spend::record_many(&pool, &calls).await?;
                    Ok(vec![(); calls.len()])
                }
            },
        );
        Self { reserve, record }
    }

    /// Reserves a call's amount against its key's cap (committed on return).
    pub async fn reserve(&self, call: ReserveCall) -> Result<Reserved, LedgerError> {
        self.reserve.submit(call).await
    }

    /// Settles a call's reservation, if any, and appends its audit row
    /// (committed together on return).
    pub async fn record(&self, call: CallRecord) -> Result<(), LedgerError> {
        self.record.submit(call).await
    }
}

type Reply<R> = oneshot::Sender<Result<R, LedgerError>>;

type Queue<T, R> = mpsc::Sender<(T, Reply<R>)>;

/// Bounded queues (lanes) in front of writer tasks, one each, that take
/// everything queued in their lane (in arrival order) when they are free
/// and run `write` on it. A call's lane is its key's.
struct Batcher<T, R> {
    lanes: Arc<[Queue<T, R>]>,
    lane_of: fn(&T) -> i64,
    /// Full queue: turn the call away (true) or wait for room (false).
    turn_away: bool,
}

impl<T, R> Clone for Batcher<T, R> {
    fn clone(&self) -> Self {
        Self {
            lanes: self.lanes.clone(),
            lane_of: self.lane_of,
            turn_away: self.turn_away,
        }
    }
}

impl<T: Clone + Send + Sync + 'static, R: Send + 'static> Batcher<T, R> {
    /// `kind` names the writers in the metrics; `limit` calls wait in all.
    fn start<W, F>(
        kind: &'static str,
        limit: usize,
        turn_away: bool,
        lanes: usize,
        lane_of: fn(&T) -> i64,
        write: W,
    ) -> Self
    where
        W: Fn(Arc<[T]>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Result<Vec<R>, sqlx::Error>> + Send + 'static,
    {
        let lanes = lanes.max(1);
        let lanes = (0..lanes)
            .map(|_| {
                let (queue, waiting) = mpsc::channel((limit / lanes).max(1));
                tokio::spawn(write_batches(kind, waiting, write.clone()));
                queue
            })
            .collect();
        Self {
            lanes,
            lane_of,
            turn_away,
        }
    }

    async fn submit(&self, item: T) -> Result<R, LedgerError> {
        let stopped = || LedgerError::Failed(Arc::new("the ledger writer has stopped".into()));
        let lane = (self.lane_of)(&item).unsigned_abs() as usize % self.lanes.len();
        let queue = &self.lanes[lane];
        let (reply, answer) = oneshot::channel();
        if self.turn_away {
            queue.try_send((item, reply)).map_err(|err| match err {
                mpsc::error::TrySendError::Full(_) => LedgerError::Overloaded,
                mpsc::error::TrySendError::Closed(_) => stopped(),
            })?;
        } else {
            queue.send((item, reply)).await.map_err(|_| stopped())?;
        }
        answer.await.map_err(|_| stopped())?
    }
}

/// A lane's writer: whatever is waiting when it is free, in one write; a
/// failed batch again one call at a time, so a bad call fails alone (only
/// then are calls copied).
async fn write_batches<T, R, W, F>(
    kind: &'static str,
    mut waiting: mpsc::Receiver<(T, Reply<R>)>,
    write: W,
) where
    T: Clone,
    W: Fn(Arc<[T]>) -> F + Sync,
    F: Future<Output = Result<Vec<R>, sqlx::Error>>,
{
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        let taken = waiting.recv_many(&mut batch, MAX_BATCH).await;
        if taken == 0 {
            break;
        }
        let (items, replies): (Vec<T>, Vec<Reply<R>>) = batch.drain(..).unzip();
        let items: Arc<[T]> = items.into();
        let alone = items.len() == 1;
        let started = Instant::now();
        let span = tracing::info_span!("ledger_write", kind, calls = items.len());
        match write_again_if_rolled_back(&write, items.clone())
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
                    let result = match write_again_if_rolled_back(&write, Arc::from([item.clone()]))
                        .await
                    {
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
}

/// How often a write PostgreSQL rolled back to break a deadlock, or could
/// not serialize, is tried in all.
const ATTEMPTS: u32 = 5;

/// Writes `items`, and again when PostgreSQL rolled the whole transaction
/// back to break a deadlock with another writer (another instance's
/// settlements, say, taking the audit chain and a key in the other order)
/// or could not serialize it: nothing of it was kept, so writing it again
/// writes it once. Any other error is the caller's.
async fn write_again_if_rolled_back<T, R, W, F>(
    write: &W,
    items: Arc<[T]>,
) -> Result<Vec<R>, sqlx::Error>
where
    W: Fn(Arc<[T]>) -> F + Sync,
    F: Future<Output = Result<Vec<R>, sqlx::Error>>,
{
    let mut attempt = 1;
    loop {
        match write(items.clone()).await {
            Err(err) if rolled_back(&err) && attempt < ATTEMPTS => {
                crate::metrics::ledger_failed("rolled_back");
                tracing::warn!(error = %err, attempt, calls = items.len(),
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
