//! The HTTP/JSON doors of the spec, on the same port as gRPC.
//!
//! Errors are JSON `{"code", "message"}` with the HTTP status their word carries (`ErrorCode`;
//! `docs/declaration.md`, "Doors"). Bodies are read as bytes and parsed here so that every failure
//! has a spec word.

pub mod approval;
pub mod ask;
pub mod compaction;
pub mod control;
pub mod conversations;
pub mod executions;
pub mod memory;
pub mod repair;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use nexus_proto::{ErrorCode, ExecutionId, Refusal};

use crate::auth::bearer_of;
use crate::auth::throttle::Source;
use crate::declaration::known_fields;
use crate::doors::api::{Api, Caller};

/// The largest request body, in bytes; larger bodies get 413 `content_too_large`.
pub const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// A refusal as an HTTP response.
#[derive(Debug)]
pub struct HttpRefusal(pub Refusal);

impl From<Refusal> for HttpRefusal {
    fn from(refusal: Refusal) -> Self {
        HttpRefusal(refusal)
    }
}

impl IntoResponse for HttpRefusal {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response =
            (status, axum::Json(json!({"code": self.0.code, "message": self.0.message}))).into_response();
        if let Some(seconds) = self.0.retry_after
            && let Ok(value) = header::HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        // For `/metrics`' count of answers by code ([`crate::metrics::count_answers`]).
        response.extensions_mut().insert(self.0.code);
        response
    }
}

type HttpResult = Result<axum::Json<Value>, HttpRefusal>;

/// The doors: `GET /agent_api/v1/profile`, `PUT /agent_api/v1/profile/configuration`,
/// `GET /agent_api/v1/models`, the named definitions under `/agent_api/v1/profile/agents`, and
/// the read-only `POST /agent_api/v1/tools/assembly`.
pub fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/agent_api/v1/profile", get(get_profile))
        .route("/agent_api/v1/profile/configuration", put(put_configuration))
        .route("/agent_api/v1/models", get(get_models))
        .route("/agent_api/v1/profile/agents", get(get_agents))
        .route("/agent_api/v1/profile/agents/{name}", put(put_agent).delete(delete_agent))
        .route("/agent_api/v1/profile/prompt_documents/{slot}", get(get_prompt_document).put(put_prompt_document))
        .route("/agent_api/v1/tools", get(get_tools))
        .route("/agent_api/v1/executors", get(get_executors))
        .route("/agent_api/v1/cluster", get(get_cluster))
        .route("/metrics", get(get_metrics))
        .route("/agent_api/v1/executors/{id}", get(get_executor))
        .route("/agent_api/v1/tools/assembly", post(post_assembly))
        .merge(executions::routes())
        .merge(approval::routes())
        .merge(ask::routes())
        .merge(control::routes())
        .merge(repair::routes())
        .merge(compaction::routes())
        .merge(conversations::routes())
        .merge(memory::routes())
        // Inside the routes, where the matched path is known.
        .route_layer(axum::middleware::from_fn(request_rule))
        .fallback(not_found)
        // After every route: it reaches only the routes registered before it.
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(api)
}

/// The member behind the request's one `Authorization` header, presented from `peer`.
async fn caller(api: &Api, headers: &HeaderMap, peer: Option<Source>) -> Result<Caller, HttpRefusal> {
    let token = bearer_of(headers.get_all(header::AUTHORIZATION).iter().map(|v| v.to_str().ok()))?;
    Ok(api.member_from(token, peer).await?)
}

/// The source address of a request, as the failed-credential throttle keys it: from the
/// connection info the transport puts on every request (plaintext or TLS).
pub(crate) fn peer_source(extensions: &axum::http::Extensions) -> Option<Source> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let plain = extensions.get::<TcpConnectInfo>().and_then(TcpConnectInfo::remote_addr);
    let tls = || extensions.get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|info| info.get_ref().remote_addr());
    plain.or_else(tls).map(|address| Source::of(address.ip()))
}

/// The request's source address ([`peer_source`]); never refuses.
pub(crate) struct Peer(pub Option<Source>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Peer(peer_source(&parts.extensions)))
    }
}

/// What a door on one execution (or one of its tasks) is called with: the path (`id`, or
/// `(id, task_key)`), the caller, and the body still unread. The caller is resolved here, so a
/// bad credential is refused before the door judges the body and then the execution id.
struct ExecutionDoor<P = String> {
    api: Arc<Api>,
    caller: Caller,
    path: P,
    body: Result<Bytes, BytesRejection>,
}

impl<P> FromRequest<Arc<Api>> for ExecutionDoor<P>
where
    P: DeserializeOwned + Send + 'static,
{
    type Rejection = Response;

    async fn from_request(request: Request, api: &Arc<Api>) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let Path(path) = Path::<P>::from_request_parts(&mut parts, api).await.map_err(IntoResponse::into_response)?;
        let peer = peer_source(&parts.extensions);
        let caller = caller(api, &parts.headers, peer).await.map_err(IntoResponse::into_response)?;
        let body = Bytes::from_request(Request::from_parts(parts, body), api).await;
        Ok(ExecutionDoor { api: Arc::clone(api), caller, path, body })
    }
}

/// The query parameters each door takes; every other door takes none.
const QUERY_PARAMETERS: &[(&str, &[&str])] = &[
    ("/agent_api/v1/executors", &["kind"]),
    ("/agent_api/v1/executions/{id}", &["tasks_after"]),
    ("/agent_api/v1/executions/{id}/events", &["after", "limit"]),
    ("/agent_api/v1/executions/{id}/events/stream", &["after", "transcript", "progress"]),
    ("/agent_api/v1/conversations", &["after", "limit"]),
    ("/agent_api/v1/conversations/{id}", &["turns_after"]),
    ("/agent_api/v1/executions", &["conversation", "status", "after", "limit"]),
    ("/agent_api/v1/memory", &["binding", "prefix", "conversation", "agent_public_id"]),
    ("/agent_api/v1/memory/{binding}/{*path}", &["conversation", "agent_public_id", "revisions"]),
];

/// Refuses, with 400 `parameter_invalid`, a query string that names a parameter the door does not
/// take or one parameter twice (a misspelt parameter is never silently ignored, and a repeated one
/// never guessed at), and a body declared as something other than JSON.
async fn request_rule(request: Request, next: axum::middleware::Next) -> Response {
    let refusal = query_refusal(request.uri()).or_else(|| content_type_refusal(request.headers()));
    match refusal {
        Some(refusal) => HttpRefusal(refusal).into_response(),
        None => next.run(request).await,
    }
}

/// A body is JSON: a `Content-Type` other than `application/json` (or another `+json` type) on
/// a request that has a body is refused. No `Content-Type` at all is read as JSON.
fn content_type_refusal(headers: &HeaderMap) -> Option<Refusal> {
    let declared = headers.get(header::CONTENT_TYPE)?;
    let empty = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok())
        .is_some_and(|length| length.trim() == "0");
    let essence =
        declared.to_str().ok().and_then(|value| value.split(';').next()).map(|e| e.trim().to_ascii_lowercase());
    let json = essence
        .as_deref()
        .is_some_and(|e| e == "application/json" || (e.starts_with("application/") && e.ends_with("+json")));
    if json || empty {
        return None;
    }
    let shown = declared.to_str().map_or_else(|_| "not text".to_owned(), crate::json::echo);
    Some(Refusal::new(
        ErrorCode::ParameterInvalid,
        format!("the body is declared as {shown}; bodies are JSON: send content-type: application/json"),
    ))
}

/// Whether a request path is an instance of a route pattern (`{…}` matches one segment).
fn route_matches(pattern: &str, path: &str) -> bool {
    let (mut pattern, mut path) = (pattern.split('/'), path.split('/'));
    loop {
        match (pattern.next(), path.next()) {
            (None, None) => return true,
            // A `{*…}` segment matches the rest of the path, one segment or more.
            (Some(want), Some(_)) if want.starts_with("{*") => return true,
            (Some(want), Some(got)) if want.starts_with('{') || want == got => {}
            _ => return false,
        }
    }
}

fn query_refusal(uri: &Uri) -> Option<Refusal> {
    uri.query().filter(|query| !query.is_empty())?;
    let takes =
        QUERY_PARAMETERS.iter().find(|(door, _)| route_matches(door, uri.path())).map_or(&[][..], |(_, takes)| *takes);
    let pairs = match Query::<Vec<(String, String)>>::try_from_uri(uri) {
        Ok(Query(pairs)) => pairs,
        Err(rejection) => {
            return Some(Refusal::new(
                ErrorCode::ParameterInvalid,
                format!("the query string is invalid: {}", rejection.body_text()),
            ));
        }
    };
    let mut seen: Vec<&str> = Vec::with_capacity(pairs.len());
    for (name, _) in &pairs {
        if !takes.contains(&name.as_str()) {
            let door_takes = if takes.is_empty() { "no query parameters".to_owned() } else { takes.join(", ") };
            return Some(Refusal::new(
                ErrorCode::ParameterInvalid,
                format!("unknown query parameter {:?}; this door takes {door_takes}", crate::json::echo(name)),
            ));
        }
        if seen.contains(&name.as_str()) {
            return Some(Refusal::new(
                ErrorCode::ParameterInvalid,
                format!("the query parameter {name} is given twice; give it once"),
            ));
        }
        seen.push(name);
    }
    None
}

/// A malformed execution id names no execution: 404, as an unknown one.
/// A query string, or 400 `parameter_invalid` saying what is wrong with it (a repeated key, a
/// value of the wrong type) as JSON, never axum's plain-text rejection.
fn query_of<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, HttpRefusal> {
    query.map(|Query(query)| query).map_err(|rejection| {
        HttpRefusal(Refusal::new(
            ErrorCode::ParameterInvalid,
            format!("the query string is invalid: {}", rejection.body_text()),
        ))
    })
}

/// The `{id}` of an execution door: 400 `parameter_invalid` when it is not a UUID, as on the
/// read doors and the gRPC twins.
fn execution_id(text: &str) -> Result<ExecutionId, Refusal> {
    text.parse().map_err(|_| Refusal::new(ErrorCode::ParameterInvalid, "id must be a UUID"))
}

/// The body of a door whose body is optional: empty means no fields (`null`); anything else must
/// be a JSON object (a literal `null` is refused like any other body that is not an object, so it
/// can never pass for "no body").
fn optional_body(body: Result<Bytes, BytesRejection>) -> Result<Value, HttpRefusal> {
    let bytes = body_bytes(body)?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    Ok(crate::doors::body::object(&bytes, "the body")?)
}

/// The body of a door that takes no fields: empty or `{}`.
fn empty_body(body: Result<Bytes, BytesRejection>) -> Result<(), HttpRefusal> {
    Ok(known_fields(&optional_body(body)?, &[])?)
}

/// The body of a door that needs one, as JSON (any value: the door judges its shape).
fn json_body(body: Result<Bytes, BytesRejection>) -> Result<Value, HttpRefusal> {
    Ok(crate::doors::body::json(&body_bytes(body)?, "the body")?)
}

/// The body's bytes: 413 `content_too_large` over [`BODY_LIMIT`].
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Refusal> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            crate::doors::body::too_large("the body")
        } else {
            Refusal::new(
                ErrorCode::ParameterMissing,
                format!("the body could not be read ({rejection}); send it again"),
            )
        }
    })
}

async fn get_profile(State(api): State<Arc<Api>>, Peer(peer): Peer, headers: HeaderMap) -> HttpResult {
    let caller = caller(&api, &headers, peer).await?;
    Ok(axum::Json(api.profile(&caller).await?))
}

async fn put_configuration(
    State(api): State<Arc<Api>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> HttpResult {
    let caller = caller(&api, &headers, peer).await?;
    let body = json_body(body)?;
    Ok(axum::Json(api.declare(&caller, body).await?))
}

async fn get_models(State(api): State<Arc<Api>>, Peer(peer): Peer, headers: HeaderMap) -> HttpResult {
    let caller = caller(&api, &headers, peer).await?;
    Ok(axum::Json(api.models(&caller)))
}

async fn get_tools(State(api): State<Arc<Api>>, Peer(peer): Peer, headers: HeaderMap) -> HttpResult {
    let caller = caller(&api, &headers, peer).await?;
    Ok(axum::Json(api.tools(&caller)))
}

async fn get_prompt_document(
    State(api): State<Arc<Api>>,
    Path(slot): Path<String>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> HttpResult {
    let caller = caller(&api, &headers, peer).await?;
    Ok(axum::Json(api.prompt_document(&caller, &slot).await?))
}

async fn put_prompt_document(
    State(api): State<Arc<Api>>,
    Path(slot): Path<String>,
    Peer(peer): Peer,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> HttpResult {
    let caller = caller(&api, &headers, peer).await?;
    let body = json_body(body)?;
    Ok(axum::Json(api.put_prompt_document(&caller, &slot, body).await?))
}

#[derive(Debug, serde::Deserialize)]
struct KindQuery {
    kind: Option<String>,
}

async fn get_executors(
    State(api): State<Arc<Api>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    query: Result<Query<KindQuery>, QueryRejection>,
) -> HttpResult {
    let query = query_of(query)?;
    let caller = caller(&api, &headers, peer).await?;
    Ok(axum::Json(api.executors(&caller, query.kind.as_deref()).await?))
}

/// `GET /agent_api/v1/cluster`: the nodes on this store, the serve lease and what the holder
/// drives (`docs/cluster.md`). It takes a member credential, like every door, and is served to
/// loopback callers only, like a local admin command: it names hosts, pids and addresses.
async fn get_cluster(State(api): State<Arc<Api>>, request: Request) -> HttpResult {
    let extensions = request.extensions();
    caller(&api, request.headers(), peer_source(extensions)).await?;
    if !from_loopback(extensions) {
        return Err(HttpRefusal(Refusal::new(
            ErrorCode::NotAuthorized,
            "the cluster listing is served to loopback callers only: ask it on the node's own host (curl http://127.0.0.1:PORT/agent_api/v1/cluster)",
        )));
    }
    Ok(axum::Json(api.cluster().await?))
}

/// Whether the request came from this host: its connection's peer (or, forwarded by a standby,
/// the client's own address) is a loopback address.
fn from_loopback(extensions: &axum::http::Extensions) -> bool {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let peer = extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| extensions.get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|info| info.get_ref().remote_addr()));
    peer.is_some_and(|peer| peer.ip().to_canonical().is_loopback())
}

/// `GET /metrics`: the Prometheus series in the OpenMetrics text format (`docs/metrics.md`).
/// A caller on this host needs no credential (a Prometheus beside the node scrapes as it is);
/// from elsewhere it takes a Human member's credential. A credential presented is checked
/// either way.
///
/// # Errors
/// 401 `unauthorized` for a missing or bad credential from another host; 403
/// `not_authorized` for an Agent's from another host; 500 `internal` when the store fails.
async fn get_metrics(State(api): State<Arc<Api>>, request: Request) -> Result<Response, HttpRefusal> {
    let extensions = request.extensions();
    let loopback = from_loopback(extensions);
    if !loopback || request.headers().contains_key(header::AUTHORIZATION) {
        let caller = caller(&api, request.headers(), peer_source(extensions)).await?;
        if !loopback && caller.member.kind != nexus_proto::MemberKind::Human {
            return Err(HttpRefusal(Refusal::new(
                ErrorCode::NotAuthorized,
                "the metrics are served to callers on the node's own host, or with a Human member's credential",
            )));
        }
    }
    let text = api.metrics().await?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

async fn get_executor(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> HttpResult {
    let caller = caller(&api, &headers, peer).await?;
    Ok(axum::Json(api.executor(&caller, &id).await?))
}

async fn get_agents(State(api): State<Arc<Api>>, Peer(peer): Peer, headers: HeaderMap) -> HttpResult {
    let caller = caller(&api, &headers, peer).await?;
    Ok(axum::Json(api.named_definitions(&caller).await?))
}

async fn put_agent(
    State(api): State<Arc<Api>>,
    Path(name): Path<String>,
    Peer(peer): Peer,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, axum::Json<Value>), HttpRefusal> {
    let caller = caller(&api, &headers, peer).await?;
    let body = json_body(body)?;
    let (minted, definition) = api.put_named_definition(&caller, &name, body).await?;
    Ok((if minted { StatusCode::CREATED } else { StatusCode::OK }, axum::Json(definition)))
}

async fn delete_agent(
    State(api): State<Arc<Api>>,
    Path(name): Path<String>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Result<StatusCode, HttpRefusal> {
    let caller = caller(&api, &headers, peer).await?;
    api.delete_named_definition(&caller, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn post_assembly(
    State(api): State<Arc<Api>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> HttpResult {
    let caller = caller(&api, &headers, peer).await?;
    let body = json_body(body)?;
    Ok(axum::Json(api.assembly_preview(&caller, &body).await?))
}

async fn not_found() -> HttpRefusal {
    HttpRefusal(Refusal::new(ErrorCode::NotFound, "no such door"))
}

async fn method_not_allowed(method: Method, uri: Uri) -> HttpRefusal {
    HttpRefusal(Refusal::new(
        ErrorCode::MethodNotAllowed,
        format!("{method} is not taken by {}; the Allow header names the methods it takes", uri.path()),
    ))
}
