//! The repair doors of a held task (`docs/executions.md`, "Lifecycle hooks"): `retry` runs a
//! failed hook task again as a new generation, `abandon` releases the hold it puts on its
//! execution. Both the HTTP doors and the gRPC twins `RetryTask` and `AbandonTask` call these.

use serde_json::{Value, json};

use nexus_proto::{ExecutionId, Refusal};

use super::{Api, Caller, Need, task_view};
use crate::actors::execution::hooks::Repair;
use crate::store::TaskRow;

impl Api {
    /// `POST /agent_api/v1/executions/{execution_id}/tasks/{task_key}/retry` (gRPC `RetryTask`):
    /// a failed, timed-out or uncertain hook task that holds its execution (`needs_attention`,
    /// `halt_failure`) runs again as its next generation (`…-g2`, `…-g3`) on the same target,
    /// through the ordinary approval stage, and the execution runs again. Answers the new task,
    /// with `retry_of` naming the one it replaces.
    ///
    /// # Errors
    /// 404 `not_found` for an unknown execution or task, and for another Agent's execution; 403
    /// `not_authorized` for a Human who is not a steward of the Agent ([`super::standing`]), or a
    /// suspended member retrying; 409 `not_retryable` unless the task is failed, timed_out or
    /// uncertain and still holds the execution.
    pub async fn retry_task(&self, caller: &Caller, id: ExecutionId, task_key: &str) -> Result<Value, Refusal> {
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
    pub async fn abandon_task(&self, caller: &Caller, id: ExecutionId, task_key: &str) -> Result<Value, Refusal> {
        let task = self.repair(caller, id, task_key, Repair::Abandon).await?;
        let mut view = task_view(&task);
        view["failure_resolution"] = json!("abandoned");
        Ok(view)
    }

    async fn repair(
        &self,
        caller: &Caller,
        id: ExecutionId,
        task_key: &str,
        repair: Repair,
    ) -> Result<TaskRow, Refusal> {
        let (_, task) = self.task_for(caller, id, task_key, Need::Act).await?;
        if repair == Repair::Retry {
            // A retry runs the task again: a suspended member may abandon, never retry.
            caller.require_active("retry tasks")?;
        }
        if !task.status.is_repairable() {
            return Err(Refusal::new(
                repair.refusal(),
                format!(
                    "task {task_key} is {}; only a failed, timed_out or uncertain task can be repaired",
                    task.status
                ),
            ));
        }
        self.root.execution(id).repair(task.task_key, repair).await
    }
}
