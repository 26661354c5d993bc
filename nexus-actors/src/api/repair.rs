//! The repair doors of a held task (spec/REFERENCE.md 7, "Failure policy"; 11): `retry` runs a
//! failed hook task again as a new generation, `abandon` releases the hold it puts on its
//! execution. Both the HTTP doors and the gRPC twins `RetryTask` and `AbandonTask` call these.

use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use nexus_proto::{ErrorCode, Refusal};

use super::{Api, Caller, internal, task_view, unavailable};
use crate::execution::ExecutionMsg;
use crate::execution::hooks::{Repair, repairable_status};
use crate::store::TaskRow;

impl Api {
    /// `POST /agent_api/v1/executions/{execution_id}/tasks/{task_key}/retry` (gRPC `RetryTask`):
    /// a failed, timed-out or uncertain hook task that holds its execution (`needs_attention`,
    /// `halt_failure`) runs again as its next generation (`…-g2`, `…-g3`) on the same target,
    /// through the ordinary approval stage, and the execution runs again. Answers the new task,
    /// with `retry_of` naming the one it replaces.
    ///
    /// # Errors
    /// 404 `not_found` for an unknown execution or task; 403 `not_authorized` when the caller does
    /// not own the execution; 409 `not_retryable` unless the task is failed, timed_out or
    /// uncertain and still holds the execution.
    pub async fn retry_task(&self, caller: &Caller, id: Uuid, task_key: &str) -> Result<Value, Refusal> {
        // A retry runs the task again: a suspended member may abandon, never retry.
        caller.require_active("retry tasks")?;
        let task = self.repair(caller, id, task_key, Repair::Retry).await?;
        let mut view = task_view(&task);
        view["retry_of"] = json!(task_key);
        Ok(view)
    }

    /// `POST /agent_api/v1/executions/{execution_id}/tasks/{task_key}/abandon` (gRPC
    /// `AbandonTask`): releases the hold a failed hook task puts on its execution, as if the hook
    /// had let it go on: a `stop` hook's answer is delivered, a `turn_start` hook's round starts.
    /// Answers the task with `failure_resolution: "abandoned"`.
    ///
    /// # Errors
    /// As [`Api::retry_task`], with 409 `not_abandonable`.
    pub async fn abandon_task(&self, caller: &Caller, id: Uuid, task_key: &str) -> Result<Value, Refusal> {
        let task = self.repair(caller, id, task_key, Repair::Abandon).await?;
        let mut view = task_view(&task);
        view["failure_resolution"] = json!("abandoned");
        Ok(view)
    }

    async fn repair(&self, caller: &Caller, id: Uuid, task_key: &str, repair: Repair) -> Result<TaskRow, Refusal> {
        let store = &self.fabric.store;
        let row = store
            .execution(id)
            .await
            .map_err(internal)?
            .ok_or_else(|| Refusal::new(ErrorCode::NotFound, format!("no execution {id}")))?;
        if row.member_public_id != caller.member.public_id {
            return Err(Refusal::new(
                ErrorCode::NotAuthorized,
                format!("only the member that owns execution {id} may retry or abandon its tasks"),
            ));
        }
        let task = store
            .task(id, task_key)
            .await
            .map_err(internal)?
            .ok_or_else(|| Refusal::new(ErrorCode::NotFound, format!("no task {task_key} in execution {id}")))?;
        if !repairable_status(&task.status) {
            return Err(Refusal::new(
                repair.refusal(),
                format!(
                    "task {task_key} is {}; only a failed, timed_out or uncertain task can be repaired",
                    task.status
                ),
            ));
        }
        // A quiet execution's actor may be stopping just now: Root forgets it within moments and
        // the next lookup starts a fresh one from the store.
        let mut attempts = 0;
        loop {
            let actor = self.root.execution(id).await?;
            let outcome =
                ractor::call!(actor, |reply| ExecutionMsg::Repair { task_key: task_key.to_owned(), repair, reply });
            match outcome {
                Ok(repaired) => return repaired,
                Err(_) if attempts < 10 => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(_) => return Err(unavailable()),
            }
        }
    }
}
