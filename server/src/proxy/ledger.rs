//! The proxy's ledger writes, grouped across concurrent calls.
//!
//! Every metered call makes two durable writes (reserve before forwarding,
//! settle and audit after), and every refused call one. Made one by one,
//! each waits for its own commit, and calls on one hot key queue on its row
//! lock through every commit. Here a single writer per kind takes whatever
//! calls are waiting whenever the database is free and writes them in one
//! statement and one commit. Nothing waits for a batch to fill: a lone call
//! is written at once, and under load the batches grow by themselves.

use std::{fmt, future::Future, sync::Arc};

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};

use app::ssr::data::spend::{self, CallRecord, ReserveCall, Reserved};

/// The most calls written in one statement.
const MAX_BATCH: usize = 256;

/// Why a ledger write did not happen.
#[derive(Debug, Clone)]
pub struct LedgerError(Arc<String>);

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone)]
pub struct Ledger {
    reserve: Batcher<ReserveCall, Reserved>,
    record: Batcher<CallRecord, ()>,
}

impl Ledger {
    /// Starts the two writers; they stop when the last clone is dropped.
    pub fn start(pool: PgPool) -> Self {
        let reserve = Batcher::start({
            let pool = pool.clone();
            move |calls| {
                let pool = pool.clone();
                async move { spend::reserve_many(&pool, &calls).await }
            }
        });
        let record = Batcher::start(move |calls: Vec<CallRecord>| {
            let pool = pool.clone();
            async move {
                spend::record_many(&pool, &calls).await?;
                Ok(vec![(); calls.len()])
            }
        });
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

/// A queue in front of one writer task that runs `write` on everything
/// queued, in arrival order.
struct Batcher<T, R> {
    queue: mpsc::UnboundedSender<(T, Reply<R>)>,
}

impl<T, R> Clone for Batcher<T, R> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
        }
    }
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    fn start<W, F>(write: W) -> Self
    where
        W: Fn(Vec<T>) -> F + Send + 'static,
        F: Future<Output = Result<Vec<R>, sqlx::Error>> + Send,
    {
        let (queue, mut waiting) = mpsc::unbounded_channel::<(T, Reply<R>)>();
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(MAX_BATCH);
            while waiting.recv_many(&mut batch, MAX_BATCH).await > 0 {
                let (items, replies): (Vec<T>, Vec<Reply<R>>) = batch.drain(..).unzip();
                match write(items).await {
                    Ok(results) => {
                        for (reply, result) in replies.into_iter().zip(results) {
                            // A caller that went away needs no answer.
                            let _ = reply.send(Ok(result));
                        }
                    }
                    Err(err) => {
                        let err = LedgerError(Arc::new(err.to_string()));
                        for reply in replies {
                            let _ = reply.send(Err(err.clone()));
                        }
                    }
                }
            }
        });
        Self { queue }
    }

    async fn submit(&self, item: T) -> Result<R, LedgerError> {
        let stopped = || LedgerError(Arc::new("the ledger writer has stopped".into()));
        let (reply, answer) = oneshot::channel();
        self.queue.send((item, reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}
