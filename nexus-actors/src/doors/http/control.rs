//! The execution control doors on HTTP (`docs/executions.md`, "Control";
//! `docs/declaration.md`, "Inline declarations"). They call the same [`Api`] as the gRPC twins
//! `PauseExecution`, `ResumeExecution`, `StopExecution`, `RegenerateExecution` and
//! `EstimateContext`; the semantics are in [`crate::actors::execution::control`].
//!
//! - `POST /agent_api/v1/executions/{id}/pause` `{force?}` (default `false`) → the execution,
//!   `paused`. 409 `not_pausable` unless it is running.
//! - `POST /agent_api/v1/executions/{id}/resume` (body empty or `{}`) → the execution, `running`.
//!   409 `not_paused` unless it is paused.
//! - `POST /agent_api/v1/executions/{id}/stop` `{force?}` (default `true`) → the execution:
//!   `canceled`, or `canceling` while a graceful stop lets dispatched work finish.
//! - `POST /agent_api/v1/executions/{id}/regenerate` `{execution_declaration?}` → 201
//!   `{execution_public_id, regenerated_from, declaration: reused|replaced, declaration_digest}`.
//!   409 `not_regenerable` when the original froze no declaration and none is given.
//! - `GET /agent_api/v1/executions/{id}/estimate`, or `POST` with `{execution_declaration?}` → the
//!   next round's request size `{bytes, estimated_tokens, estimator, ...}`. Writes nothing.
//!
//! Every door answers 404 `not_found` for an unknown execution id and for another Agent's
//! execution, 403 `not_authorized` for a Human who is not a steward of its Agent
//! (`docs/executions.md`, "People in the loop"), 400 `parameter_invalid` for a malformed id, 400
//! `parameter_missing` for a body that is not a JSON object, and 400 `parameter_invalid` for a body
//! that names a field the door does not take or has a `force` that is not a boolean.

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::Value;

use nexus_proto::{ErrorCode, Refusal};

use super::{ExecutionDoor, HttpRefusal, HttpResult, empty_body, execution_id, optional_body};
use crate::declaration::known_fields;
use crate::doors::api::Api;

/// The control doors, merged into [`super::router`].
pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/agent_api/v1/executions/{id}/pause", post(post_pause))
        .route("/agent_api/v1/executions/{id}/resume", post(post_resume))
        .route("/agent_api/v1/executions/{id}/stop", post(post_stop))
        .route("/agent_api/v1/executions/{id}/regenerate", post(post_regenerate))
        .route("/agent_api/v1/executions/{id}/estimate", post(post_estimate).get(get_estimate))
}

/// `force` of a pause or stop body (`null`, `{}` or `{force: bool}`), or `default` when absent.
///
/// # Errors
/// 400 `parameter_missing` for a body that is not an object; 400 `parameter_invalid` when it names
/// another field or has a `force` that is not a boolean.
pub fn force_of(body: &Value, default: bool) -> Result<bool, Refusal> {
    known_fields(body, &["force"])?;
    match body.get("force") {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(force)) => Ok(*force),
        Some(_) => Err(Refusal::new(ErrorCode::ParameterInvalid, "force must be true or false")),
    }
}

async fn post_pause(door: ExecutionDoor) -> HttpResult {
    let force = force_of(&optional_body(door.body)?, false)?;
    Ok(axum::Json(door.api.pause(&door.caller, execution_id(&door.path)?, force).await?))
}

async fn post_resume(door: ExecutionDoor) -> HttpResult {
    empty_body(door.body)?;
    Ok(axum::Json(door.api.resume(&door.caller, execution_id(&door.path)?).await?))
}

async fn post_stop(door: ExecutionDoor) -> HttpResult {
    let force = force_of(&optional_body(door.body)?, true)?;
    Ok(axum::Json(door.api.stop(&door.caller, execution_id(&door.path)?, force).await?))
}

async fn post_regenerate(door: ExecutionDoor) -> Result<(StatusCode, axum::Json<Value>), HttpRefusal> {
    let body = optional_body(door.body)?;
    let created = door.api.regenerate(&door.caller, execution_id(&door.path)?, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

async fn post_estimate(door: ExecutionDoor) -> HttpResult {
    let body = optional_body(door.body)?;
    Ok(axum::Json(door.api.estimate(&door.caller, execution_id(&door.path)?, &body).await?))
}

async fn get_estimate(door: ExecutionDoor) -> HttpResult {
    Ok(axum::Json(door.api.estimate(&door.caller, execution_id(&door.path)?, &Value::Null).await?))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn force_defaults_per_door_and_refuses_other_shapes_and_fields() {
        assert_eq!(force_of(&Value::Null, true).ok(), Some(true));
        assert_eq!(force_of(&json!({}), false).ok(), Some(false));
        assert_eq!(force_of(&json!({"force": null}), true).ok(), Some(true));
        assert_eq!(force_of(&json!({"force": false}), true).ok(), Some(false));
        assert_eq!(force_of(&json!({"force": true}), false).ok(), Some(true));
        let shapes = [json!({"force": "yes"}), json!({"force": 1})];
        let misspelled = [json!({"forse": false}), json!({"force": false, "why": "x"})];
        for bad in shapes.into_iter().chain(misspelled) {
            assert_eq!(force_of(&bad, true).unwrap_err().code, ErrorCode::ParameterInvalid, "{bad}");
        }
        // A body that is not an object has every door's word for it.
        for bad in [json!([true]), json!("force")] {
            assert_eq!(force_of(&bad, true).unwrap_err().code, ErrorCode::ParameterMissing, "{bad}");
        }
    }
}
