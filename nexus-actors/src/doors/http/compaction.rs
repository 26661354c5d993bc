//! The manual compaction door on HTTP (`docs/executions.md`, "Compaction", trigger `manual`). It
//! calls the same [`Api::compact`] as the gRPC twin `CompactExecution`.
//!
//! - `POST /agent_api/v1/executions/{id}/compact` (body empty or `{}`) → 202 `{execution_public_id,
//!   summary_task_key, task_key, trigger: "manual", mode, status: "waiting"}`.
//!
//! It answers 404 `not_found` for an unknown or malformed execution id and for another Agent's
//! execution, 403 `not_authorized` for a Human who is not a steward of its Agent
//! (`docs/executions.md`, "People in the loop"), 400 `parameter_invalid` for a body other than
//! empty or `{}`, and 409 `compaction_disabled`, `task_not_queued`, `already_compacted` or
//! `nothing_to_compact`.

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::Value;

use super::{ExecutionDoor, HttpRefusal, empty_body, execution_id};
use crate::doors::api::Api;

/// The compaction door, merged into [`super::router`].
pub fn routes() -> Router<Arc<Api>> {
    Router::new().route("/agent_api/v1/executions/{id}/compact", post(post_compact))
}

async fn post_compact(door: ExecutionDoor) -> Result<(StatusCode, axum::Json<Value>), HttpRefusal> {
    empty_body(door.body)?;
    let accepted = door.api.compact(&door.caller, execution_id(&door.path)?).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(accepted)))
}
