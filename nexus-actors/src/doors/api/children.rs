//! The delegation door for clients (`docs/delegation.md`, "Watching the tree"):
//! `GET /agent_api/v1/executions/{id}/children` (gRPC `ListChildren`) lists what an execution
//! started, and `GET /agent_api/v1/executions/{id}` shows the execution's parent.

use serde_json::{Value, json};

use nexus_proto::{ExecutionId, Refusal};

use super::standing::Need;
use super::{Api, Caller, internal};
use crate::store::children::ChildRow;

/// The most children one answer lists (a join names at most 32; a turn may start more, one per
/// call, up to the fan bound per round). Beyond it, `truncated` is true.
pub const CHILDREN_BOUND: usize = 256;

/// One child as the doors show it.
fn child_view(child: &ChildRow) -> Value {
    json!({
        "task_key": child.task_key,
        "kind": child.kind,
        "execution_public_id": child.child_execution_public_id,
        "conversation_public_id": child.child_conversation_public_id,
        "label": child.label,
        "lifetime": child.lifetime,
        "wake": child.wake,
        "prompt": child.prompt_head,
        "status": child.status,
        "result_status": child.result_status(),
        "final_text": child.final_text.as_ref().filter(|_| child.succeeded()),
        "error_key": child.error_key,
        "consumed_by": child.consumed_by,
        "consumed_at": child.consumed_at,
        "disposition": child.disposition,
        "owner": child.owner,
        "budget": child.budget.as_ref().map(crate::budget::BudgetLedger::view),
        "created_at": child.created_at,
    })
}

/// The parent of a child execution, as `GET /agent_api/v1/executions/{id}` shows it.
pub(super) fn parent_view(parent: &ChildRow) -> Value {
    json!({
        "execution_public_id": parent.parent_execution_public_id,
        "conversation_public_id": parent.parent_conversation_public_id,
        "task_key": parent.task_key,
        "kind": parent.kind,
        "disposition": parent.disposition,
        "owner": parent.owner,
    })
}

impl Api {
    /// `GET /agent_api/v1/executions/{id}/children` (gRPC `ListChildren`): the children the
    /// execution started, oldest first, each with its status, result, consumption and
    /// disposition; the joins among the execution's tasks (`join` calls, with their policy and
    /// outcome); `{execution_public_id, children, joins, truncated}`.
    ///
    /// # Errors
    /// 404 `not_found` for an unknown execution or another Agent's; 403 `not_authorized` for a
    /// Human without the standing to read it.
    pub async fn children(&self, caller: &Caller, id: ExecutionId) -> Result<Value, Refusal> {
        let row = self.execution_for(caller, id, Need::Read).await?;
        let store = &self.fabric.store;
        let children = store.children_of(row.public_id).await.map_err(internal)?;
        let truncated = children.len() > CHILDREN_BOUND;
        let listed: Vec<Value> = children.iter().take(CHILDREN_BOUND).map(child_view).collect();
        let joins: Vec<Value> = store
            .tasks_of(row.public_id)
            .await
            .map_err(internal)?
            .iter()
            .filter(|t| t.tool_name == "join" && t.target_executor_public_id.is_none())
            .map(|t| {
                json!({
                    "task_key": t.task_key,
                    "status": t.status,
                    "tasks": t.tool_input["tasks"],
                    "policy": t.tool_input["policy"],
                    "result": t.result.as_ref().map(|r| r["structured_content"].clone()),
                })
            })
            .collect();
        Ok(json!({"execution_public_id": row.public_id, "children": listed, "joins": joins, "truncated": truncated}))
    }
}
