//! The approval doors on HTTP (spec/REFERENCE.md 10, "Park"). They call the same [`Api`] as the
//! gRPC twins `ApproveTask` and `DenyTask`.
//!
//! - `POST /agent_api/v1/executions/{id}/tasks/{task_key}/approve` (body empty or `{}`) → the
//!   task `{task_key, status, approval, ...}` after the decision: `dispatched` on its runner,
//!   settled in-process, or parked again when its effect profile changed under the park.
//! - `POST /agent_api/v1/executions/{id}/tasks/{task_key}/deny` `{reason?}` → the task, `failed`
//!   with `approval_denied`.
//!
//! Both need write standing on the execution (403 `not_authorized`), answer 404 `not_found` for
//! an unknown execution or task, 400 `parameter_invalid` for a body that is not an object or
//! names a field the door does not take, and 409 `not_awaiting_approval` or `not_adjudicable`.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::Value;
use uuid::Uuid;

use nexus_proto::{ErrorCode, Refusal};

use super::{HttpRefusal, HttpResult, caller, json_body};
use crate::api::{Api, known_fields};

/// The approval doors, merged into [`super::router`].
pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/agent_api/v1/executions/{id}/tasks/{task_key}/approve", post(post_approve))
        .route("/agent_api/v1/executions/{id}/tasks/{task_key}/deny", post(post_deny))
}

/// A malformed execution id names no execution: 404, as an unknown one.
pub(super) fn execution_id(text: &str) -> Result<Uuid, Refusal> {
    Uuid::parse_str(text).map_err(|_| Refusal::new(ErrorCode::NotFound, format!("no execution {text}")))
}

/// The body, where an empty one means `{}`.
pub(super) fn optional_body(body: Result<Bytes, BytesRejection>) -> Result<Value, HttpRefusal> {
    match body {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Ok(Value::Null),
        other => json_body(other),
    }
}

/// The body of a door that takes no fields: empty or `{}`.
pub(super) fn empty_body(body: Result<Bytes, BytesRejection>) -> Result<(), HttpRefusal> {
    Ok(known_fields(&optional_body(body)?, &[])?)
}

async fn post_approve(
    State(api): State<Arc<Api>>,
    Path((id, task_key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> HttpResult {
    let caller = caller(&api, &headers).await?;
    empty_body(body)?;
    Ok(axum::Json(api.approve_task(&caller, execution_id(&id)?, &task_key).await?))
}

async fn post_deny(
    State(api): State<Arc<Api>>,
    Path((id, task_key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> HttpResult {
    let caller = caller(&api, &headers).await?;
    let body = optional_body(body)?;
    Ok(axum::Json(api.deny_task(&caller, execution_id(&id)?, &task_key, &body).await?))
}
