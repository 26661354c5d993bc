//! What `/metrics` reads from the store at each scrape (`docs/metrics.md`): counts of tasks and
//! executions by status and each runner's open work. The store is the truth, so these are read,
//! not counted in memory: a scrape after a restart or on another node sees the same numbers.

use sqlx::Row;

use nexus_proto::{RunStatus, RunnerId, TaskStatus};

use super::{Store, StoreResult, parse};

/// The store's census at one moment. Statuses with no rows are left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Tasks (tool calls, hooks, summaries) by status.
    pub tasks: Vec<(TaskStatus, i64)>,
    /// Executions by status.
    pub executions: Vec<(RunStatus, i64)>,
    /// Each runner with open (dispatched) tasks addressed to it.
    pub runners: Vec<RunnerTally>,
}

/// One runner's inbox: its `dispatched` tasks, and how many of those were never claimed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerTally {
    /// The runner's executor public id.
    pub runner: RunnerId,
    /// Tasks in its inbox (status `dispatched`), claimed or not.
    pub open: i64,
    /// Of those, the ones nobody has claimed yet.
    pub unclaimed: i64,
}

impl Store {
    /// Counts tasks and executions by status, and each runner's open and unclaimed tasks: three
    /// grouped reads.
    ///
    /// # Errors
    /// [`super::StoreError`] when the store fails or holds a status word it does not know.
    pub async fn tally(&self) -> StoreResult<Tally> {
        let mut tally = Tally::default();
        for row in sqlx::query("SELECT status, COUNT(*) AS n FROM tasks GROUP BY status ORDER BY status")
            .fetch_all(self.reader())
            .await?
        {
            tally.tasks.push((parse(&row.try_get::<String, _>("status")?)?, row.try_get("n")?));
        }
        for row in sqlx::query("SELECT status, COUNT(*) AS n FROM executions GROUP BY status ORDER BY status")
            .fetch_all(self.reader())
            .await?
        {
            tally.executions.push((parse(&row.try_get::<String, _>("status")?)?, row.try_get("n")?));
        }
        for row in sqlx::query(
            "SELECT target_executor_public_id AS runner, COUNT(*) AS open, \
             SUM(CASE WHEN claimed = 0 THEN 1 ELSE 0 END) AS unclaimed FROM tasks \
             WHERE status = 'dispatched' AND target_executor_public_id IS NOT NULL \
             GROUP BY target_executor_public_id ORDER BY target_executor_public_id",
        )
        .fetch_all(self.reader())
        .await?
        {
            tally.runners.push(RunnerTally {
                runner: parse(&row.try_get::<String, _>("runner")?)?,
                open: row.try_get("open")?,
                unclaimed: row.try_get("unclaimed")?,
            });
        }
        Ok(tally)
    }
}
