//! Test only: an HTTP server on 127.0.0.1:0 that answers queued replies in order and records every
//! request, for the adapters' unit tests.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// What the fake answers next.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) content_type: &'static str,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: String,
    pub(crate) delay: Option<Duration>,
}

impl Reply {
    /// A JSON answer.
    pub(crate) fn json(status: u16, body: impl Into<String>) -> Self {
        Self { status, content_type: "application/json", headers: Vec::new(), body: body.into(), delay: None }
    }

    /// A 200 `text/event-stream` answer with `body` as the whole stream.
    pub(crate) fn sse(body: impl Into<String>) -> Self {
        Self { content_type: "text/event-stream", ..Self::json(200, body) }
    }
}

/// What the fake received.
#[derive(Debug)]
pub(crate) struct Seen {
    pub(crate) path: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Value,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().expect("ascii header"))
    }
}

#[derive(Default)]
struct FakeState {
    replies: Mutex<VecDeque<Reply>>,
    seen: Mutex<Vec<Seen>>,
}

/// The server; it stops when dropped.
pub(crate) struct FakeServer {
    addr: SocketAddr,
    state: Arc<FakeState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeServer {
    pub(crate) async fn start() -> Self {
        let state = Arc::new(FakeState::default());
        let router = Router::new().fallback(answer).with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("fake server runs");
        });
        Self { addr, state, task }
    }

    /// Queues a JSON answer.
    pub(crate) fn reply(&self, status: u16, body: impl Into<String>) {
        self.push(Reply::json(status, body));
    }

    pub(crate) fn push(&self, reply: Reply) {
        self.state.replies.lock().expect("lock").push_back(reply);
    }

    /// `http://127.0.0.1:<port>` plus `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub(crate) fn take_seen(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.state.seen.lock().expect("lock"))
    }
}

async fn answer(State(state): State<Arc<FakeState>>, uri: Uri, headers: HeaderMap, body: String) -> Response {
    let body = serde_json::from_str(&body).unwrap_or(Value::String(body));
    state.seen.lock().expect("lock").push(Seen { path: uri.path().to_owned(), headers, body });
    let reply = state.replies.lock().expect("lock").pop_front();
    let Some(reply) = reply else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no reply queued").into_response();
    };
    if let Some(delay) = reply.delay {
        tokio::time::sleep(delay).await;
    }
    let status = StatusCode::from_u16(reply.status).expect("valid status");
    let mut response = (status, [(header::CONTENT_TYPE, reply.content_type)], reply.body).into_response();
    for (name, value) in reply.headers {
        response.headers_mut().insert(name, value.parse().expect("header value"));
    }
    response
}
