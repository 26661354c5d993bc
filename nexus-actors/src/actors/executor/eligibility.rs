//! An assigned runner's inbox checks whose work it holds (`docs/protocol.md`, "Assignment"; the
//! spec rechecks the frozen target at dispatch and at claim).
//!
//! Materialization already refuses a declaration that selects a runner not eligible for its
//! Agent, so work reaches an assigned (`user_private`) runner only for an Agent assigned to it
//! when the execution froze. An assignment removed afterwards takes effect here: a task offered
//! for an Agent the runner no longer serves fails at once with `not_eligible` instead of being
//! offered, and a claim of one refuses with `not_eligible` (409) and fails the task the same way,
//! so the execution hears of it rather than waiting out the park. A task already claimed before
//! the assignment went away keeps its claim and may commit: the work was granted and may have
//! run. An account-wide runner serves every Agent and reads nothing here.

use std::collections::HashSet;

use nexus_proto::{AssignmentScope, ErrorCode, ExecutionId, Refusal, TaskStatus};

use super::{Decided, Effect, ExecutorState, Staged, claim, internal, settled};
use crate::store::{StoreError, TaskRow};

/// The error key of a task failed because its runner no longer serves its Agent.
pub(super) const NOT_ELIGIBLE: &str = "not_eligible";

/// Which runs a runner may serve.
pub(super) enum Served {
    /// Every run: an account-wide runner.
    All,
    /// These runs: their Agents are assigned to the runner.
    Only(HashSet<ExecutionId>),
}

impl Served {
    /// Whether the runner may serve `run`.
    pub(super) fn covers(&self, run: ExecutionId) -> bool {
        match self {
            Served::All => true,
            Served::Only(runs) => runs.contains(&run),
        }
    }
}

/// Which of `runs` this runner may serve: every one for an account-wide runner (no read), else
/// those whose Agent is assigned to it (one read).
///
/// # Errors
/// [`StoreError`] on a database failure.
pub(super) async fn served(
    state: &ExecutorState,
    runs: impl IntoIterator<Item = ExecutionId>,
) -> Result<Served, StoreError> {
    if state.row.assignment_scope == AssignmentScope::AccountWide {
        return Ok(Served::All);
    }
    let mut distinct: Vec<ExecutionId> = Vec::new();
    for run in runs {
        if !distinct.contains(&run) {
            distinct.push(run);
        }
    }
    Ok(Served::Only(state.fabric.store.runs_served_by(state.row.public_id, &distinct).await?))
}

/// A claim on an assigned runner: the ordinary claim, then the assignment. A task whose Agent the
/// runner no longer serves is refused `not_eligible`, and fails with that key when it is open
/// here (the answer waits for that settlement to be durable).
///
/// # Errors
/// The claim's refusals; `not_eligible`; `internal` on a store failure.
pub(super) async fn claim_assigned(state: &ExecutorState, task: TaskRow) -> Result<Decided, Refusal> {
    let decided = claim(state, task.clone())?;
    let run = task.run_public_id;
    if served(state, [run]).await.map_err(internal)?.covers(run) {
        return Ok(decided);
    }
    let refusal = Refusal::new(
        ErrorCode::NotEligible,
        format!(
            "this runner is no longer assigned to the Agent of run {run}; the task fails with {NOT_ELIGIBLE}, and an \
             operator can assign the runner again with `nexus admin runner assign`"
        ),
    );
    tracing::info!(runner_id = %state.row.public_id, run_id = %run, task_key = %task.task_key, "claim refused: not assigned");
    if !state.open.contains_key(&(run, task.task_key)) {
        return Err(refusal);
    }
    let row = settled(state, task, TaskStatus::Failed, None, Some(NOT_ELIGIBLE));
    Ok(Decided::Write(Staged { row, effect: Effect::Settle { answer: Err(refusal) } }))
}
