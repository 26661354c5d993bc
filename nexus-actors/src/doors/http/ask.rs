//! The answer door of `ask` on HTTP (`docs/kernel-tools.md`, "ask"). It calls the same [`Api`]
//! as the gRPC twin `AnswerTask`.
//!
//! - `POST /agent_api/v1/executions/{id}/tasks/{task_key}/answer` `{"answer": "..."}` (or a list
//!   of options for a `multi` question) → the task `{task_key, status: "completed", result, ...}`
//!   after the answer.
//!
//! Refusals as [`Api::answer_task`]: 400 `parameter_invalid` / `parameter_missing` for the body,
//! 404 `not_found`, 403 `not_authorized`, 409 `not_awaiting_input` or `not_adjudicable`, 422
//! `validation_failed`.

use std::sync::Arc;

use axum::Router;
use axum::routing::post;

use super::{ExecutionDoor, HttpResult, execution_id, optional_body};
use crate::doors::api::Api;

/// The answer door, merged into [`super::router`].
pub fn routes() -> Router<Arc<Api>> {
    Router::new().route("/agent_api/v1/executions/{id}/tasks/{task_key}/answer", post(post_answer))
}

async fn post_answer(door: ExecutionDoor<(String, String)>) -> HttpResult {
    let body = optional_body(door.body)?;
    let (id, task_key) = &door.path;
    Ok(axum::Json(door.api.answer_task(&door.caller, execution_id(id)?, task_key, &body).await?))
}
