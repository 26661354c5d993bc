//! Group commit: one writer task per store that folds the hot-path writes queued while a flush is
//! in progress into a single transaction, so durability costs one disk flush per batch rather
//! than one per frame (issue 4, "Durability across a nexus crash").
//!
//! A write is a job: a function that runs its statements on the writer's open transaction. The
//! writer takes the first queued job, then every job already waiting (up to [`MAX_BATCH`]), runs
//! them in order in one transaction and commits it. Each caller hears its own result only after
//! that commit returned, so an acknowledged write is on disk (SQLite `synchronous=FULL`) or
//! committed (PostgreSQL `synchronous_commit`).
//!
//! A job that fails spoils the batch's transaction (PostgreSQL aborts the whole transaction after
//! any failed statement), so the writer rolls the batch back and runs each of its jobs again in a
//! transaction of its own: one job's conflict never fails its neighbours, and every caller gets
//! exactly the result its job would have had alone. Jobs are therefore functions (`Fn`), run once
//! or twice, never half-applied.

use std::any::Any as StdAny;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;
use sqlx::{AnyConnection, AnyPool};
use tokio::sync::{mpsc, oneshot};

use super::lease::{FENCE_SQL, FenceSlot};
use super::{StoreBackend, StoreError, StoreResult};

/// The most jobs folded into one transaction.
pub const MAX_BATCH: usize = 512;
/// Jobs that may wait for the writer before callers queue on the channel itself.
const QUEUE_DEPTH: usize = 4_096;

type Output = Box<dyn StdAny + Send>;
type JobFn = dyn for<'c> Fn(&'c mut AnyConnection) -> BoxFuture<'c, StoreResult<Output>> + Send + Sync;

struct Job {
    run: Arc<JobFn>,
    reply: oneshot::Sender<StoreResult<Output>>,
}

/// The handle to a store's writer task. Cheap to clone; the task ends when the last handle is
/// dropped or the pool is closed.
#[derive(Clone, Debug)]
pub(super) struct Writer {
    jobs: mpsc::Sender<Job>,
    stats: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    writes: AtomicU64,
    transactions: AtomicU64,
    metrics: CommitMetrics,
}

/// The group commit as `/metrics` shows it (`docs/metrics.md`): per committed transaction, how
/// many writes it carried and how long it took from its `BEGIN` to its durable `COMMIT`, in
/// seconds. Clones share the same series.
#[derive(Clone, Debug)]
pub struct CommitMetrics {
    /// Writes per committed transaction (buckets 1, 2, 4, ... 256, [`MAX_BATCH`] at most).
    pub batch_size: prometheus_client::metrics::histogram::Histogram,
    /// Seconds per committed transaction (buckets 100 µs to about 3.3 s, doubling).
    pub flush_seconds: prometheus_client::metrics::histogram::Histogram,
}

impl Default for CommitMetrics {
    fn default() -> Self {
        use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
        CommitMetrics {
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 9)),
            flush_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
        }
    }
}

/// What the writer has done since the store opened: acknowledged writes and the transactions
/// (disk flushes) they took. `writes / transactions` is the mean batch size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupCommitStats {
    /// Writes acknowledged durable.
    pub writes: u64,
    /// Committed transactions.
    pub transactions: u64,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

impl Writer {
    /// Starts the writer task for `pool`. Must be called inside a tokio runtime.
    /// Once `fence` holds a lease's fence (PostgreSQL, several nodes), every transaction first
    /// checks that this node still holds the serve lease (`store::lease`).
    pub(super) fn start(pool: AnyPool, backend: StoreBackend, fence: FenceSlot) -> Writer {
        let (jobs, receiver) = mpsc::channel(QUEUE_DEPTH);
        let stats = Arc::new(Counters::default());
        let opener = Opener { pool, backend, fence };
        tokio::spawn(run(opener, receiver, stats.clone()));
        Writer { jobs, stats }
    }

    /// The group commit's histograms, for `/metrics`.
    pub(super) fn metrics(&self) -> CommitMetrics {
        self.stats.metrics.clone()
    }

    /// Writes and transactions so far.
    pub(super) fn stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            writes: self.stats.writes.load(Ordering::Relaxed),
            transactions: self.stats.transactions.load(Ordering::Relaxed),
        }
    }

    /// Runs `job` in the next group-committed transaction and answers once that transaction is
    /// durable.
    ///
    /// # Errors
    /// The job's own error, or [`StoreError::Database`] when the transaction could not begin or
    /// commit, or the writer has stopped (the store was closed).
    pub(super) async fn write<R, F>(&self, job: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: for<'c> Fn(&'c mut AnyConnection) -> BoxFuture<'c, StoreResult<R>> + Send + Sync + 'static,
    {
        let run: Arc<JobFn> = Arc::new(move |connection: &mut AnyConnection| {
            let future = job(connection);
            Box::pin(async move { future.await.map(|value| Box::new(value) as Output) })
        });
        let (reply, answer) = oneshot::channel();
        self.jobs.send(Job { run, reply }).await.map_err(|_| closed())?;
        let output = answer.await.map_err(|_| closed())??;
        Ok(*output.downcast::<R>().expect("a job's output has the type its caller gave it"))
    }
}

fn closed() -> StoreError {
    StoreError::Database(sqlx::Error::PoolClosed)
}

/// The transaction opener: SQLite takes the write lock at BEGIN, so a batch never has to upgrade
/// a read lock (which fails at once instead of waiting out the busy timeout).
fn begin_statement(backend: StoreBackend) -> Option<&'static str> {
    match backend {
        StoreBackend::Sqlite => Some("BEGIN IMMEDIATE"),
        StoreBackend::Postgres => None,
    }
}

/// What opens the writer's transactions: the pool, its backend, and the fence to check first.
struct Opener {
    pool: AnyPool,
    backend: StoreBackend,
    fence: FenceSlot,
}

impl Opener {
    /// Begins a transaction; under a fence, checks it first, so a node that lost the serve
    /// lease commits nothing ([`StoreError::Fenced`]).
    async fn begin(&self) -> StoreResult<sqlx::Transaction<'static, sqlx::Any>> {
        let mut tx = match begin_statement(self.backend) {
            Some(statement) => self.pool.begin_with(statement).await?,
            None => self.pool.begin().await?,
        };
        if let Some(fence) = self.fence.get() {
            let held = sqlx::query(FENCE_SQL)
                .bind(fence.holder.as_str())
                .bind(fence.generation)
                .bind(fence.idle_timeout_ms.as_str())
                .fetch_optional(&mut *tx)
                .await?;
            if held.is_none() {
                let reason = format!(
                    "this node no longer holds the serve lease at generation {}; its writes are refused",
                    fence.generation
                );
                fence.lose(reason.clone());
                return Err(StoreError::Fenced(reason));
            }
        }
        Ok(tx)
    }
}

async fn run(opener: Opener, mut receiver: mpsc::Receiver<Job>, stats: Arc<Counters>) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    while receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let jobs = std::mem::take(&mut batch);
        flush(&opener, jobs, &stats).await;
    }
}

/// Runs `jobs` in one transaction; on any failure, each alone.
async fn flush(opener: &Opener, jobs: Vec<Job>, stats: &Counters) {
    if jobs.len() > 1 {
        let began = tokio::time::Instant::now();
        match together(opener, &jobs).await {
            Ok(outputs) => {
                stats.metrics.flush_seconds.observe(began.elapsed().as_secs_f64());
                stats.metrics.batch_size.observe(outputs.len() as f64);
                stats.transactions.fetch_add(1, Ordering::Relaxed);
                stats.writes.fetch_add(outputs.len() as u64, Ordering::Relaxed);
                for (job, output) in jobs.into_iter().zip(outputs) {
                    let _ = job.reply.send(Ok(output));
                }
                return;
            }
            Err(e) => tracing::debug!(jobs = jobs.len(), error = %e, "a batch failed; running its writes one by one"),
        }
    }
    for job in jobs {
        let began = tokio::time::Instant::now();
        let result = alone(opener, &job).await;
        if result.is_ok() {
            stats.metrics.flush_seconds.observe(began.elapsed().as_secs_f64());
            stats.metrics.batch_size.observe(1.0);
            stats.transactions.fetch_add(1, Ordering::Relaxed);
            stats.writes.fetch_add(1, Ordering::Relaxed);
        }
        let _ = job.reply.send(result);
    }
}

async fn together(opener: &Opener, jobs: &[Job]) -> StoreResult<Vec<Output>> {
    let mut tx = opener.begin().await?;
    let mut outputs = Vec::with_capacity(jobs.len());
    for job in jobs {
        outputs.push((job.run)(&mut tx).await?);
    }
    tx.commit().await?;
    Ok(outputs)
}

async fn alone(opener: &Opener, job: &Job) -> StoreResult<Output> {
    let mut tx = opener.begin().await?;
    let output = (job.run)(&mut tx).await?;
    tx.commit().await?;
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::super::{Store, StoreError};

    async fn scratch() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).await.expect("store");
        sqlx::query("CREATE TABLE scratch (k TEXT PRIMARY KEY, v BIGINT NOT NULL)")
            .execute(&store.pool)
            .await
            .expect("scratch table");
        (dir, store)
    }

    async fn insert(store: &Store, key: String, value: i64) -> Result<(), StoreError> {
        store
            .writer
            .write(move |connection| {
                let key = key.clone();
                Box::pin(async move {
                    sqlx::query("INSERT INTO scratch (k, v) VALUES ($1, $2)")
                        .bind(key)
                        .bind(value)
                        .execute(&mut *connection)
                        .await?;
                    Ok(())
                })
            })
            .await
    }

    async fn count(store: &Store) -> i64 {
        use sqlx::Row;
        let row = sqlx::query("SELECT COUNT(*) AS n FROM scratch").fetch_one(&store.pool).await.expect("count");
        row.try_get::<i64, _>("n").expect("n")
    }

    #[tokio::test]
    async fn concurrent_writes_share_transactions_and_are_all_durable() {
        let (_dir, store) = scratch().await;
        let before = store.writer.stats();
        let writes: Vec<_> = (0..400).map(|i| insert(&store, format!("k{i}"), i)).collect();
        for result in futures::future::join_all(writes).await {
            result.expect("every write is acknowledged");
        }
        let after = store.writer.stats();
        assert_eq!(after.writes - before.writes, 400);
        assert_eq!(count(&store).await, 400, "an acknowledged write is in the table");
        assert!(
            after.transactions - before.transactions < 400,
            "400 writes queued together must share transactions, took {}",
            after.transactions - before.transactions
        );
    }

    #[tokio::test]
    async fn a_failing_write_never_fails_its_neighbours() {
        let (_dir, store) = scratch().await;
        insert(&store, "taken".into(), 0).await.expect("first insert");
        // Queued together: the duplicate fails alone, the others land.
        let mut writes: Vec<_> = (0..50).map(|i| insert(&store, format!("n{i}"), i)).collect();
        writes.insert(25, insert(&store, "taken".into(), 1));
        let results = futures::future::join_all(writes).await;
        let failed: Vec<usize> = results.iter().enumerate().filter(|(_, r)| r.is_err()).map(|(i, _)| i).collect();
        assert_eq!(failed, vec![25], "only the duplicate fails");
        assert_eq!(count(&store).await, 51);
    }

    #[tokio::test]
    async fn a_closed_store_refuses_writes() {
        let (_dir, store) = scratch().await;
        store.close().await;
        assert!(insert(&store, "late".into(), 0).await.is_err());
    }
}
