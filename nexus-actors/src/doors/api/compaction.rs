//! The manual compaction door (`docs/executions.md`, "Compaction", trigger `manual`): the HTTP door
//! `POST /agent_api/v1/executions/{id}/compact` and its gRPC twin `CompactExecution` call this.
//! The semantics are in [`crate::actors::execution::compaction`].

use serde_json::Value;

use nexus_proto::{ExecutionId, Refusal};

use super::{Api, Caller, Need};

impl Api {
    /// `POST /agent_api/v1/executions/{id}/compact` (gRPC `CompactExecution`): asks for a
    /// compaction of the execution's history before its next model round. Our executions have no
    /// separate queued model task: the next round counts as queued while the execution runs, no
    /// model call is out and its last answer was no final one (it waits for its tool calls, a hook
    /// or an approval). The compaction is durable before this answers `{execution_public_id,
    /// summary_task_key, task_key, trigger: "manual", mode, status: "waiting"}` (HTTP 202); it
    /// runs, between `pre_compact` and `post_compact`, when the round is about to start.
    ///
    /// # Errors
    /// 404 `not_found` for an unknown execution or another Agent's; 403 `not_authorized` for a
    /// Human who is not a steward of the Agent, or a suspended member ([`super::standing`]); 409
    /// `compaction_disabled` (no `compaction_policy`, or mode `off`), `task_not_queued` (a model
    /// call is out, an answer is ready, or the execution is not running), `already_compacted`
    /// (the next round was compacted or is being compacted) and `nothing_to_compact` (the history
    /// holds only pinned user messages and the retained tail); `unavailable` during shutdown.
    pub async fn compact(&self, caller: &Caller, id: ExecutionId) -> Result<Value, Refusal> {
        self.execution_for(caller, id, Need::Act).await?;
        caller.require_active("compact executions")?;
        self.root.execution(id).compact().await
    }
}
