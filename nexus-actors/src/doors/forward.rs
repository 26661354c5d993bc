//! Request forwarding between the nodes of one PostgreSQL store (`docs/cluster.md`, "Any node
//! answers"): a standby passes every request it receives, HTTP or gRPC, to the node that holds
//! the serve lease, and streams the answer back, so a runner-agent, a client or a load balancer
//! may use any node's address.
//!
//! Both halves live here. [`Forwarder`] is the standby's: one HTTP/2 connection (cleartext, prior
//! knowledge) to the holder, multiplexing every forwarded request, runner streams and followed
//! event streams included; a request whose client goes away resets its stream on the holder,
//! and keep-alive pings end a stream whose holder stopped answering (paused, partitioned), so
//! the runner behind it reconnects and moves on. [`admit`] is the holder's: a request that says
//! it was forwarded ([`FORWARDED`]) must carry the holder's secret of this term (the lease's
//! `forward_key`), and then the holder takes the client address the standby reports as the
//! request's own, so the loopback rule and the failed-credential throttle key on the real caller,
//! not on the standby.
//!
//! Forwarding is one hop: a standby never forwards a request that already says it was forwarded.
//! A node serving over TLS does not forward (its clients are sent to the holder by a refusal, as
//! before): a forwarded request would have to be sent on over a second TLS session, with the
//! client's certificate lost on the way.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Uri, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use nexus_proto::{ErrorCode, Refusal};

use crate::doors::http::HttpRefusal;

/// The header a standby adds to each request it forwards:
/// `key=<the holder's forward key>;for=<the client's IP address>;by=<the standby's node id>`.
pub const FORWARDED: HeaderName = HeaderName::from_static("nexus-forwarded");

/// How long a standby waits for a TCP connection to the holder before it refuses the request.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A forwarded stream's flow-control window, in bytes: a runner stream's frames are small, and
/// one slow reader must not hold a large buffer on the standby.
const STREAM_WINDOW: u32 = 1 << 20;

/// The connection's flow-control window, in bytes, shared by every forwarded stream.
const CONNECTION_WINDOW: u32 = 64 << 20;

/// What a forwarded request says of itself ([`FORWARDED`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forwarded {
    /// The holder's forwarding secret, as the standby read it with the lease.
    pub key: String,
    /// The address of the client that sent the request to the standby.
    pub client: IpAddr,
    /// The standby's node id.
    pub by: String,
}

impl Forwarded {
    /// The header's value.
    pub fn to_header(&self) -> Option<HeaderValue> {
        HeaderValue::from_str(&format!("key={};for={};by={}", self.key, self.client, self.by)).ok()
    }

    /// Reads a header's value; `None` when it is not of the form [`Forwarded::to_header`] writes.
    pub fn parse(value: &HeaderValue) -> Option<Forwarded> {
        let (mut key, mut client, mut by) = (None, None, None);
        for part in value.to_str().ok()?.split(';') {
            match part.split_once('=')? {
                ("key", value) => key = Some(value.to_owned()),
                ("for", value) => client = Some(value.parse().ok()?),
                ("by", value) => by = Some(value.to_owned()),
                _ => return None,
            }
        }
        Some(Forwarded { key: key?, client: client?, by: by? })
    }
}

/// Where a standby forwards to: the holder's node id, its address and its key of this term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The holder's node id.
    pub node_id: String,
    /// Its address, `host:port`.
    pub address: String,
    /// Its forwarding secret of this term.
    pub key: String,
}

/// The standby's half: an HTTP/2 client to the holder ([`Target`]).
#[derive(Clone)]
pub struct Forwarder {
    this_node: String,
    client: Client<HttpConnector, Body>,
}

impl Forwarder {
    /// A forwarder for the node `this_node`, whose keep-alive pings to the holder go every
    /// `keepalive_interval` and give up after `keepalive_timeout` (the runner stream's own
    /// settings, `[runner] http2_keepalive_*`), and which closes its connection to the holder
    /// after `idle` without a request: give half the doors' idle bound
    /// (`[connections] idle_timeout_ms`), so the standby closes an idle connection first and
    /// never sends a request down one the holder is closing.
    pub fn new(
        this_node: String,
        keepalive_interval: Duration,
        keepalive_timeout: Duration,
        idle: Duration,
    ) -> Forwarder {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let client = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(idle)
            .http2_initial_stream_window_size(STREAM_WINDOW)
            .http2_initial_connection_window_size(CONNECTION_WINDOW)
            .http2_keep_alive_interval(keepalive_interval)
            .http2_keep_alive_timeout(keepalive_timeout)
            .http2_keep_alive_while_idle(true)
            .build(connector);
        Forwarder { this_node, client }
    }

    /// Sends `request`, received from `client`, on to `target` and answers with what it
    /// answers, its body streamed. When the holder cannot be reached the answer is a refusal
    /// (`unavailable`, retry in a second) that names it.
    pub async fn forward(&self, request: Request, client: Option<IpAddr>, target: &Target) -> Response {
        let grpc = is_grpc(request.headers());
        let (mut parts, body) = request.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
        let uri = match format!("http://{}{path}", target.address).parse::<Uri>() {
            Ok(uri) => uri,
            Err(error) => return self.unreachable(target, &error.to_string(), grpc),
        };
        parts.uri = uri;
        parts.version = Version::HTTP_2;
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.remove(header::HOST);
        let forwarded = Forwarded {
            key: target.key.clone(),
            client: client.unwrap_or(IpAddr::from([0, 0, 0, 0])),
            by: self.this_node.clone(),
        };
        match forwarded.to_header() {
            Some(value) => parts.headers.insert(FORWARDED, value),
            None => return self.unreachable(target, "the node id is not a header value", grpc),
        };
        let request = Request::from_parts(parts, body);
        match self.client.request(request).await {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                // A standby connection counts as authenticated once the holder accepted a
                // request on it, so the standby's cap sheds strangers' connections first.
                let trailers_only = parts.headers.contains_key("grpc-status");
                if parts.status.is_success() && !trailers_only {
                    crate::doors::sockets::authenticated();
                }
                Response::from_parts(parts, Body::new(body))
            }
            Err(error) => {
                tracing::debug!(holder = %target.node_id, address = %target.address, %error, "could not forward a request");
                self.unreachable(target, &error.to_string(), grpc)
            }
        }
    }

    fn unreachable(&self, target: &Target, error: &str, grpc: bool) -> Response {
        let refusal = Refusal {
            code: ErrorCode::Unavailable,
            message: format!(
                "this nexus node ({}) is a standby and could not pass the request on to node {} at {}, which serves this cluster ({error}): retry in a moment",
                self.this_node, target.node_id, target.address
            ),
            retry_after: Some(crate::doors::standby::STANDBY_RETRY_AFTER_SECONDS),
        };
        refusal_response(refusal, grpc, Version::HTTP_2)
    }
}

/// Whether a request is gRPC (by its content type).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"))
}

/// A refusal as gRPC (trailers only) or as the doors' JSON error; an HTTP/1.1 one closes its
/// connection after the answer.
pub(crate) fn refusal_response(refusal: Refusal, grpc: bool, version: Version) -> Response {
    if grpc {
        return refusal.to_status().into_http::<Body>();
    }
    let mut response = HttpRefusal(refusal).into_response();
    if version <= Version::HTTP_11 {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Removes the headers that describe one connection, not the request (RFC 9110, section 7.6.1),
/// and the ones HTTP/2 forbids; `te: trailers` stays (gRPC needs it).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [header::CONNECTION, header::TRANSFER_ENCODING, header::UPGRADE, header::PROXY_AUTHORIZATION] {
        headers.remove(name);
    }
    for name in ["keep-alive", "proxy-connection"] {
        headers.remove(name);
    }
    if headers.get(header::TE).is_some_and(|value| value != "trailers") {
        headers.remove(header::TE);
    }
}

/// The holder's forwarding secret of this term (`None`: this node takes no forwarded request,
/// as on SQLite, which has one node).
#[derive(Clone, Debug, Default)]
pub struct ForwardKey(pub Option<Arc<str>>);

/// The holder's half, a layer inside the connection tracking of every serving door: a request
/// without [`FORWARDED`] passes as it came; one with it passes, as sent by the client the
/// standby names, only with this term's key, and is refused (`unavailable`) otherwise.
pub async fn admit(State(key): State<ForwardKey>, mut request: Request, next: Next) -> Response {
    let Some(value) = request.headers_mut().remove(FORWARDED) else {
        return next.run(request).await;
    };
    let grpc = is_grpc(request.headers());
    let forwarded = Forwarded::parse(&value);
    let accepted = match (&forwarded, &key.0) {
        (Some(forwarded), Some(key)) => same_secret(forwarded.key.as_bytes(), key.as_bytes()),
        _ => false,
    };
    let Some(forwarded) = forwarded.filter(|_| accepted) else {
        let refusal = Refusal {
            code: ErrorCode::Unavailable,
            message: "the request says a standby forwarded it, but it does not carry this node's forwarding key of \
                      this term (the standby's view of the serve lease is out of date): retry in a moment"
                .to_owned(),
            retry_after: Some(crate::doors::standby::STANDBY_RETRY_AFTER_SECONDS),
        };
        return refusal_response(refusal, grpc, request.version());
    };
    let extensions = request.extensions_mut();
    let local_addr = extensions
        .get::<TcpConnectInfo>()
        .and_then(|info| info.local_addr)
        .or_else(|| extensions.get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|info| info.get_ref().local_addr));
    extensions.remove::<TlsConnectInfo<TcpConnectInfo>>();
    extensions.insert(TcpConnectInfo { local_addr, remote_addr: Some(SocketAddr::new(forwarded.client, 0)) });
    next.run(request).await
}

/// Compares two secrets in time that depends on their lengths only.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_reads_back_what_it_wrote_and_refuses_anything_else() {
        let forwarded = Forwarded { key: "ab12".into(), client: "10.1.2.3".parse().unwrap(), by: "n-2".into() };
        let value = forwarded.to_header().expect("a header value");
        assert_eq!(Forwarded::parse(&value), Some(forwarded));
        let v6 = Forwarded { key: "k".into(), client: "::1".parse().unwrap(), by: "n".into() };
        assert_eq!(Forwarded::parse(&v6.to_header().unwrap()), Some(v6));
        for bad in ["", "key=k;for=10.0.0.1", "key=k;for=nowhere;by=n", "key=k;for=10.0.0.1;by=n;x=1", "garbage"] {
            assert_eq!(Forwarded::parse(&HeaderValue::from_static(bad)), None, "{bad}");
        }
    }

    #[test]
    fn secrets_compare_by_every_byte() {
        assert!(same_secret(b"abcd", b"abcd"));
        assert!(!same_secret(b"abcd", b"abce"));
        assert!(!same_secret(b"abcd", b"abc"));
        assert!(!same_secret(b"", b"a"));
    }

    #[test]
    fn connection_headers_are_not_passed_on_but_grpc_trailers_are() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-hop"));
        headers.insert("x-hop", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 2, "{headers:?}");
        assert_eq!(headers.get(header::TE).unwrap(), "trailers");
        assert_eq!(headers.get(header::AUTHORIZATION).unwrap(), "Bearer t");
    }
}
