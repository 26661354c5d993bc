//! The approval doors on HTTP (`docs/executions.md`, "Approval"). They call the same [`Api`] as the
//! gRPC twins `ApproveTask` and `DenyTask`.
//!
//! - `POST /agent_api/v1/executions/{id}/tasks/{task_key}/approve` (body empty or `{}`) → the
//!   task `{task_key, status, approval, ...}` after the decision: `dispatched` on its runner,
//!   settled in-process, or parked again when its effect profile changed under the park.
//! - `POST /agent_api/v1/executions/{id}/tasks/{task_key}/deny` `{reason?}` → the task, `failed`
//!   with `approval_denied`.
//!
//! Both answer 404 `not_found` for an unknown execution or task and for another Agent's execution
//! (the same answer, so that no id is confirmed to another Agent), 403 `not_authorized` for a Human
//! who is not a steward of its Agent (`docs/executions.md`, "People in the loop"), 400
//! `parameter_invalid` for a body that is not an object or names a field the door does not take,
//! and 409 `not_awaiting_approval` or `not_adjudicable`.

use std::sync::Arc;

use axum::Router;
use axum::routing::post;

use super::{ExecutionDoor, HttpResult, empty_body, execution_id, optional_body};
use crate::doors::api::Api;

/// The approval doors, merged into [`super::router`].
pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/agent_api/v1/executions/{id}/tasks/{task_key}/approve", post(post_approve))
        .route("/agent_api/v1/executions/{id}/tasks/{task_key}/deny", post(post_deny))
}

async fn post_approve(door: ExecutionDoor<(String, String)>) -> HttpResult {
    empty_body(door.body)?;
    let (id, task_key) = &door.path;
    Ok(axum::Json(door.api.approve_task(&door.caller, execution_id(id)?, task_key).await?))
}

async fn post_deny(door: ExecutionDoor<(String, String)>) -> HttpResult {
    let body = optional_body(door.body)?;
    let (id, task_key) = &door.path;
    Ok(axum::Json(door.api.deny_task(&door.caller, execution_id(id)?, task_key, &body).await?))
}
