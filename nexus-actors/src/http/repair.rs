//! The repair doors on HTTP (spec/REFERENCE.md 7, "Failure policy"; 11). They call the same
//! [`Api`] as the gRPC twins `RetryTask` and `AbandonTask`.
//!
//! - `POST /agent_api/v1/executions/{id}/tasks/{task_key}/retry` (body empty or `{}`) → the new
//!   generation of a held hook task, `{task_key, status, ..., retry_of}`.
//! - `POST /agent_api/v1/executions/{id}/tasks/{task_key}/abandon` (body empty or `{}`) → the
//!   task with `failure_resolution: "abandoned"`; the execution goes on.
//!
//! Both need write standing on the execution (403 `not_authorized`), answer 404 `not_found` for
//! an unknown execution or task, 400 `parameter_invalid` for a body other than empty or `{}`, and
//! 409 `not_retryable` / `not_abandonable` unless the task is failed, timed_out or uncertain and
//! still holds its execution.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::post;

use super::approval::{empty_body, execution_id};
use super::{HttpResult, caller};
use crate::api::Api;

/// The repair doors, merged into [`super::router`].
pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/agent_api/v1/executions/{id}/tasks/{task_key}/retry", post(post_retry))
        .route("/agent_api/v1/executions/{id}/tasks/{task_key}/abandon", post(post_abandon))
}

async fn post_retry(
    State(api): State<Arc<Api>>,
    Path((id, task_key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> HttpResult {
    let caller = caller(&api, &headers).await?;
    empty_body(body)?;
    Ok(axum::Json(api.retry_task(&caller, execution_id(&id)?, &task_key).await?))
}

async fn post_abandon(
    State(api): State<Arc<Api>>,
    Path((id, task_key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> HttpResult {
    let caller = caller(&api, &headers).await?;
    empty_body(body)?;
    Ok(axum::Json(api.abandon_task(&caller, execution_id(&id)?, &task_key).await?))
}
