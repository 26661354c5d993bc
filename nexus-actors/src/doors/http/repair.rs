//! The repair doors on HTTP (`docs/executions.md`, "Lifecycle hooks"). They call the same
//! [`Api`] as the gRPC twins `RetryTask` and `AbandonTask`.
//!
//! - `POST /agent_api/v1/executions/{id}/tasks/{task_key}/retry` (body empty or `{}`) → the new
//!   generation of a held hook task, `{task_key, status, ..., retry_of}`.
//! - `POST /agent_api/v1/executions/{id}/tasks/{task_key}/abandon` (body empty or `{}`) → the
//!   task with `failure_resolution: "abandoned"`; the execution goes on.
//!
//! Both answer 404 `not_found` for an unknown execution or task and for another Agent's execution
//! (the same answer, so that no id is confirmed to another Agent), 403 `not_authorized` for a Human
//! who is not a steward of its Agent (`docs/executions.md`, "People in the loop"), 400
//! `parameter_invalid` for a body other than empty or `{}`, and 409 `not_retryable` /
//! `not_abandonable` unless the task is failed, timed_out or uncertain and still holds its
//! execution.

use std::sync::Arc;

use axum::Router;
use axum::routing::post;

use super::{ExecutionDoor, HttpResult, empty_body, execution_id};
use crate::doors::api::Api;

/// The repair doors, merged into [`super::router`].
pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/agent_api/v1/executions/{id}/tasks/{task_key}/retry", post(post_retry))
        .route("/agent_api/v1/executions/{id}/tasks/{task_key}/abandon", post(post_abandon))
}

async fn post_retry(door: ExecutionDoor<(String, String)>) -> HttpResult {
    empty_body(door.body)?;
    let (id, task_key) = &door.path;
    Ok(axum::Json(door.api.retry_task(&door.caller, execution_id(id)?, task_key).await?))
}

async fn post_abandon(door: ExecutionDoor<(String, String)>) -> HttpResult {
    empty_body(door.body)?;
    let (id, task_key) = &door.path;
    Ok(axum::Json(door.api.abandon_task(&door.caller, execution_id(id)?, task_key).await?))
}
