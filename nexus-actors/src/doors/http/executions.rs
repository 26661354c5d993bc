//! The execution doors on HTTP: admit an input, read an execution, and read or watch its event
//! feed (`docs/executions.md`, "Events"). They call the same [`Api`] as
//! the gRPC twins (`CreateInput`, `GetExecution`, `StreamEvents`). Stop, pause, resume,
//! regenerate and the estimate are in [`super::control`].
//!
//! - `POST /agent_api/v1/inputs` `{text, conversation_public_id?, execution_declaration?,
//!   runner_executor_public_id?, tool_names?, agent_public_id?, delivery_mode?: queue|steer,
//!   variables?, deliver_at?: ISO 8601 with offset, deliver_in?: 90s|20m|2h|1d}` →
//!   201 `{conversation_public_id, input_public_id, execution_public_id, turn, delivery_mode,
//!   status, queue, deliver_at}` ([`crate::doors::api::Admitted::json`]); 409 `input_queue_full`;
//!   422 `deliver_at_*` ([`crate::schedule::delivery_time`]).
//!   `agent_public_id` names the Agent that answers: a Human steward starting a conversation must
//!   give it (`docs/executions.md`, "People in the loop").
//! - `POST /agent_api/v1/inputs/{id}/cancel` (body empty or `{}`) → 200 the canceled execution;
//!   409 `input_not_queued` once the input has started or was applied.
//! - `GET /agent_api/v1/executions/{id}` → the execution with its tasks.
//! - `GET /agent_api/v1/executions/{id}/events?after=&limit=` → one page `{items:[{cursor, type,
//!   data, at}], next_cursor}`; `limit` is 1 to 200, default 100; `after` is a `cvei_` cursor.
//! - `GET /agent_api/v1/executions/{id}/events/stream?after=` → a live Server-Sent Events stream
//!   (`id:` the cursor, `event:` the type, `data:` the JSON data). It resumes from `after`, or
//!   from the standard `Last-Event-ID` header a reconnecting client sends, and ends once the
//!   execution is quiescent and every event was sent. `?transcript=true` weaves in the ephemeral
//!   transcript deltas (no `id:`) and a `resync` item when the watcher fell behind;
//!   `?progress=true` weaves in the runners' throttled `task_progress` items (no `id:`).

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::routing::{get, post};
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use nexus_proto::{ErrorCode, Refusal};

use super::{HttpRefusal, HttpResult, Peer, caller, json_body, query_of};
use crate::declaration::known_fields;
use crate::doors::api::{Api, CreateInput, Event, Feed};

/// The page size of `GET …/events` when `limit` is absent.
pub const EVENTS_DEFAULT_LIMIT: usize = 100;
/// The largest page of `GET …/events`.
pub const EVENTS_MAX_LIMIT: usize = 200;
/// The most bytes of item JSON one page of `GET …/events` carries (4 MiB; at least one item).
pub const EVENTS_PAGE_BOUND: usize = 4 * 1024 * 1024;

/// The execution doors, merged into [`super::router`].
pub fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/agent_api/v1/inputs", post(post_input))
        .route("/agent_api/v1/inputs/{id}/cancel", post(post_cancel_input))
        .route("/agent_api/v1/executions/{id}", get(get_execution))
        .route("/agent_api/v1/executions/{id}/children", get(get_children))
        .route("/agent_api/v1/executions/{id}/events", get(get_events))
        .route("/agent_api/v1/executions/{id}/events/stream", get(get_event_stream))
}

fn uuid_param<T: std::str::FromStr>(name: &str, text: &str) -> Result<T, Refusal> {
    text.parse().map_err(|_| Refusal::new(ErrorCode::ParameterInvalid, format!("{name} must be a UUID")))
}

fn optional_uuid<T: std::str::FromStr>(body: &Value, name: &str) -> Result<Option<T>, Refusal> {
    match &body[name] {
        Value::Null => Ok(None),
        Value::String(text) => uuid_param(name, text).map(Some),
        _ => Err(Refusal::new(ErrorCode::ParameterInvalid, format!("{name} must be a UUID string"))),
    }
}

/// Decodes `POST /agent_api/v1/inputs`.
fn create_input(body: &Value) -> Result<CreateInput, Refusal> {
    known_fields(
        body,
        &[
            "text",
            "conversation_public_id",
            "execution_declaration",
            "runner_executor_public_id",
            "tool_names",
            "agent_public_id",
            "delivery_mode",
            "variables",
            "deliver_at",
            "deliver_in",
            "budget",
        ],
    )?;
    let text = match &body["text"] {
        Value::String(text) => text.clone(),
        Value::Null => return Err(Refusal::new(ErrorCode::ParameterMissing, "text is required")),
        _ => return Err(Refusal::new(ErrorCode::ParameterInvalid, "text must be a string")),
    };
    Ok(CreateInput {
        conversation_public_id: optional_uuid(body, "conversation_public_id")?,
        text,
        execution_declaration: body.get("execution_declaration").filter(|v| !v.is_null()).cloned(),
        runner_executor_public_id: optional_uuid(body, "runner_executor_public_id")?,
        tool_names: body.get("tool_names").filter(|v| !v.is_null()).cloned(),
        variables: body.get("variables").filter(|v| !v.is_null()).cloned(),
        budget: body.get("budget").filter(|v| !v.is_null()).cloned(),
        agent_public_id: optional_uuid(body, "agent_public_id")?,
        delivery_mode: match &body["delivery_mode"] {
            Value::Null => None,
            Value::String(word) => Some(delivery_mode(word)?),
            _ => return Err(Refusal::new(ErrorCode::ParameterInvalid, "delivery_mode must be a string")),
        },
        deliver_at: optional_text(body, "deliver_at")?,
        deliver_in: optional_text(body, "deliver_in")?,
    })
}

/// A text field that may be absent or null: 400 `parameter_invalid` for any other kind.
fn optional_text(body: &Value, field: &str) -> Result<Option<String>, Refusal> {
    match &body[field] {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text.clone())),
        _ => Err(Refusal::new(ErrorCode::ParameterInvalid, format!("{field} must be a string"))),
    }
}

/// Reads a `delivery_mode` word: 422 `validation_failed` for anything but `queue` and `steer`.
///
/// # Errors
/// `validation_failed` naming the field.
pub fn delivery_mode(word: &str) -> Result<nexus_proto::DeliveryMode, Refusal> {
    word.parse().map_err(|_| {
        Refusal::new(
            ErrorCode::ValidationFailed,
            format!("delivery_mode: {} is no delivery mode; use queue or steer", crate::json::echo(word)),
        )
    })
}

async fn post_input(
    State(api): State<Arc<Api>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, axum::Json<Value>), HttpRefusal> {
    let caller = caller(&api, &headers, peer).await?;
    let input = create_input(&json_body(body)?)?;
    let admitted = api.create_input(&caller, input).await?;
    Ok((StatusCode::CREATED, axum::Json(admitted.json())))
}

async fn post_cancel_input(door: super::ExecutionDoor) -> super::HttpResult {
    super::empty_body(door.body)?;
    let id = uuid_param("id", &door.path)?;
    Ok(axum::Json(door.api.cancel_input(&door.caller, id).await?))
}

#[derive(Debug, serde::Deserialize)]
struct ExecutionQuery {
    /// Continue the task list after this task key (an earlier reply's `tasks_next`).
    tasks_after: Option<String>,
}

async fn get_execution(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
    Peer(peer): Peer,
    headers: HeaderMap,
    query: Result<Query<ExecutionQuery>, QueryRejection>,
) -> HttpResult {
    let query = query_of(query)?;
    let caller = caller(&api, &headers, peer).await?;
    let id = uuid_param("id", &id)?;
    Ok(axum::Json(api.execution_page(&caller, id, query.tasks_after.as_deref()).await?))
}

/// `GET /agent_api/v1/executions/{id}/children` ([`Api::children`]).
async fn get_children(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> HttpResult {
    let caller = caller(&api, &headers, peer).await?;
    let id = uuid_param("id", &id)?;
    Ok(axum::Json(api.children(&caller, id).await?))
}

#[derive(Debug, serde::Deserialize)]
struct EventsQuery {
    after: Option<String>,
    limit: Option<String>,
    /// `true`: the stream also carries the transcript deltas.
    transcript: Option<bool>,
    /// `true`: the stream also carries the runners' `task_progress` items.
    progress: Option<bool>,
}

/// `limit`: 1 to [`EVENTS_MAX_LIMIT`], default [`EVENTS_DEFAULT_LIMIT`].
fn page_limit(limit: Option<&str>) -> Result<usize, Refusal> {
    let Some(text) = limit else { return Ok(EVENTS_DEFAULT_LIMIT) };
    text.parse::<usize>().ok().filter(|n| (1..=EVENTS_MAX_LIMIT).contains(n)).ok_or_else(|| {
        Refusal::new(ErrorCode::ParameterInvalid, format!("limit must be an integer from 1 to {EVENTS_MAX_LIMIT}"))
    })
}

fn event_json(event: &Event) -> Value {
    json!({"cursor": event.cursor, "type": event.event_type.as_str(), "data": event.data, "at": event.at})
}

async fn get_events(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
    Peer(peer): Peer,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> HttpResult {
    let query = query_of(query)?;
    let caller = caller(&api, &headers, peer).await?;
    let id = uuid_param("id", &id)?;
    let limit = page_limit(query.limit.as_deref())?;
    let after = query.after.unwrap_or_default();
    let events = api.events(&caller, id, &after, false).await?.take(limit);
    let mut events = std::pin::pin!(events);
    // A page ends at `limit` items or at the byte bound, whichever comes first (at least one
    // item): one event may be megabytes (`docs/executions.md`, "Reply bounds").
    let mut items = Vec::new();
    let mut bytes = 0;
    let mut last = None;
    while let Some(event) = events.next().await {
        let event = event?;
        let item = event_json(&event);
        let size = item.to_string().len();
        if !items.is_empty() && bytes + size > EVENTS_PAGE_BOUND {
            break;
        }
        bytes += size;
        last = Some(event.cursor);
        items.push(item);
    }
    // The next read starts after the last item, or where this one started when nothing is new.
    let next_cursor = last.unwrap_or(after);
    Ok(axum::Json(json!({"items": items, "next_cursor": next_cursor})))
}

async fn get_event_stream(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
    Peer(peer): Peer,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, HttpRefusal> {
    let query = query_of(query)?;
    let caller = caller(&api, &headers, peer).await?;
    let id = uuid_param("id", &id)?;
    // A reconnecting EventSource sends the last `id:` it saw; it wins over the query.
    let resume = headers.get("last-event-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let after = resume.or(query.after).unwrap_or_default();
    let feed = Feed { transcript: query.transcript.unwrap_or(false), progress: query.progress.unwrap_or(false) };
    let events = api.watch(&caller, id, &after, true, feed).await?;
    let frames = events.map(|event| {
        Ok(match event {
            // Deltas and `resync` have no cursor: no `id:`, so a reconnect resumes at the last
            // durable event.
            Ok(event) if event.cursor.is_empty() => SseEvent::default()
                .event(event.event_type.as_str())
                .data(json!({"data": event.data, "at": event.at}).to_string()),
            Ok(event) => SseEvent::default()
                .id(event.cursor.clone())
                .event(event.event_type.as_str())
                .data(json!({"cursor": event.cursor, "data": event.data, "at": event.at}).to_string()),
            // The feed cannot go on (the store failed): say so in the stream, then end it.
            Err(refusal) => SseEvent::default()
                .event("error")
                .data(json!({"code": refusal.code, "message": refusal.message}).to_string()),
        })
    });
    Ok(Sse::new(frames).keep_alive(KeepAlive::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_limits_are_bounded() {
        assert_eq!(page_limit(None).ok(), Some(EVENTS_DEFAULT_LIMIT));
        assert_eq!(page_limit(Some("1")).ok(), Some(1));
        assert_eq!(page_limit(Some("200")).ok(), Some(200));
        for bad in ["0", "201", "-1", "ten", ""] {
            assert_eq!(page_limit(Some(bad)).unwrap_err().code, ErrorCode::ParameterInvalid, "{bad}");
        }
    }

    #[test]
    fn inputs_decode_with_clear_refusals() {
        let input = create_input(&json!({"text": "hi", "tool_names": ["bash"]})).expect("decoded");
        assert_eq!(input.text, "hi");
        assert_eq!(input.tool_names, Some(json!(["bash"])));
        assert_eq!(create_input(&json!({})).unwrap_err().code, ErrorCode::ParameterMissing);
        assert_eq!(create_input(&json!({"text": 3})).unwrap_err().code, ErrorCode::ParameterInvalid);
        assert_eq!(create_input(&json!({"text": "x", "txt": "y"})).unwrap_err().code, ErrorCode::ParameterInvalid);
        assert_eq!(create_input(&json!([1])).unwrap_err().code, ErrorCode::ParameterMissing, "not an object");
        assert_eq!(create_input(&json!("hi")).unwrap_err().code, ErrorCode::ParameterMissing, "not an object");
        assert_eq!(
            create_input(&json!({"text": "x", "conversation_public_id": "nope"})).unwrap_err().code,
            ErrorCode::ParameterInvalid
        );
    }
}
