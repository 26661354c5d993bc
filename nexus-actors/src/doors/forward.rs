//! Request forwarding between the nodes of one PostgreSQL store (`docs/cluster.md`, "Any node
//! answers"): a standby passes every request it receives, HTTP or gRPC, to the node that holds
//! the serve lease, and streams the answer back, so a runner-agent, a client or a load balancer
//! may use any node's address.
//!
//! Both halves live here. [`Forwarder`] is the standby's: one HTTP/2 connection (cleartext, prior
//! knowledge) to the holder, multiplexing every forwarded request, runner streams and followed
//! event streams included; a request whose client goes away resets its stream on the holder;
//! keep-alive pings paced by the lease end a stream whose holder stopped answering (paused,
//! partitioned); and every forwarded request is cut once the standby reads another holder or
//! takes the lease itself ([`Forwarder::forward`]'s `cut`), so the runner or client behind it
//! reconnects to the node that serves now. [`admit`] is the holder's: a request that says
//! it was forwarded ([`FORWARDED`]) must carry the holder's secret of this term (the lease's
//! `forward_key`), and then the holder takes the client address the standby reports as the
//! request's own, so the loopback rule and the failed-credential throttle key on the real caller,
//! not on the standby.
//!
//! Forwarding is one hop: a standby never forwards a request that already says it was forwarded.
//! A node serving over TLS does not forward (its clients are sent to the holder by a refusal, as
//! before): a forwarded request would have to be sent on over a second TLS session, with the
//! client's certificate lost on the way.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Uri, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use nexus_proto::runner::v1::{NexusFrame, nexus_frame};
use nexus_proto::{ErrorCode, Refusal};

use crate::doors::http::HttpRefusal;

/// The header a standby adds to each request it forwards:
/// `key=<the holder's forward key>;for=<the client's IP address>;by=<the standby's node id>`.
pub const FORWARDED: HeaderName = HeaderName::from_static("nexus-forwarded");

/// How long a standby waits for a TCP connection to the holder before it refuses the request.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The response header by which the holder tells a standby that the request it forwarded carried
/// a member credential the holder verified; the standby then counts its client's connection as
/// authenticated (`doors::sockets`), and drops the header.
pub const AUTHENTICATED: HeaderName = HeaderName::from_static("nexus-authenticated");

/// The runner stream's path: its connection counts as authenticated on a standby once the holder
/// welcomes the runner (the first message of the answer is a Welcome).
const RUNNER_STREAM: &str = "/nexus.runner.v1.RunnerService/Connect";

/// What ends a forwarded request early: the standby read another holder, took the lease, or is
/// stopping. It resolves to why, as the client is told (`docs/cluster.md`, "Any node answers").
pub type Cut = Pin<Box<dyn Future<Output = String> + Send>>;

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

/// Whether `address` (`host:port`) is an IP address with no host (`0.0.0.0:7740`, `[::]:7740`):
/// nothing can be sent to it, so no standby forwards there.
pub fn names_no_host(address: &str) -> bool {
    address.parse::<SocketAddr>().is_ok_and(|address| address.ip().is_unspecified())
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
    /// A forwarder for the node `this_node` of a cluster whose lease term is `lease`: its
    /// keep-alive pings to the holder go every half term (at most every 20 s) and give up after
    /// a term (at most 10 s), so a request to a holder that froze or went silent is refused
    /// within about a term and a half, when the holder has lost its lease anyway. It closes its
    /// connection to the holder after `idle` without a request: give half the doors' idle bound
    /// (`[connections] idle_timeout_ms`), so the standby closes an idle connection first and
    /// never sends a request down one the holder is closing.
    pub fn new(this_node: String, lease: Duration, idle: Duration) -> Forwarder {
        let keepalive_interval = (lease / 2).min(Duration::from_secs(20));
        let keepalive_timeout = lease.min(Duration::from_secs(10));
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
    /// answers, its body streamed, until `cut` resolves: then a request still waiting for its
    /// answer is refused, and an answer still streaming ends with an error (its HTTP/2 stream is
    /// reset, its HTTP/1.1 connection closed). When the holder cannot be reached the answer is a
    /// refusal (`unavailable`, retry in a second) that names it and says why.
    pub async fn forward(&self, request: Request, client: Option<IpAddr>, target: &Target, mut cut: Cut) -> Response {
        let grpc = is_grpc(request.headers());
        let (mut parts, body) = request.into_parts();
        let Some(path) = parts.uri.path_and_query().map(|path| path.as_str()).filter(|path| path.starts_with('/'))
        else {
            // `OPTIONS *` and the like: no door answers them.
            let refusal = Refusal::new(ErrorCode::NotFound, "no door answers this request target: ask a path");
            return refusal_response(refusal, grpc);
        };
        let runner_stream = path == RUNNER_STREAM;
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
        let answered = tokio::select! {
            answered = self.client.request(request) => answered,
            why = &mut cut => {
                return self.unreachable(target, &format!("{why}, while this request waited for its answer"), grpc);
            }
        };
        match answered {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                // The client's connection counts as authenticated once the holder verified a
                // credential on it (its word, or its Welcome to a runner), so the standby's cap
                // sheds strangers' connections first.
                if parts.headers.remove(AUTHENTICATED).is_some() {
                    crate::doors::sockets::authenticated();
                }
                let welcome = runner_stream.then(crate::doors::sockets::current).flatten();
                let ending = Ending::of(&parts.headers);
                Response::from_parts(parts, Body::new(Forwarding { body: Body::new(body), cut, welcome, ending }))
            }
            Err(error) => {
                let error = causes(&error);
                tracing::debug!(holder = %target.node_id, address = %target.address, %error, "could not forward a request");
                self.unreachable(target, &error, grpc)
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
        refusal_response(refusal, grpc)
    }
}

/// An error and its causes, outermost first (`client error (Connect): tcp connect error:
/// Connection refused (os error 111)`).
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut said = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        said.push_str(": ");
        said.push_str(&cause.to_string());
        source = cause.source();
    }
    said
}

/// A forwarded answer's body: ends once `cut` resolves, and, for a runner stream, counts the
/// client's connection as authenticated when the first message is a Welcome.
struct Forwarding {
    body: Body,
    cut: Cut,
    /// The client's connection, until the runner stream's first message has been read.
    welcome: Option<crate::doors::sockets::Socket>,
    ending: Ending,
}

/// How a forwarded answer ends when it is cut, so that its client can tell a cut from an end:
/// an event stream with a last `error` event `{code: "unavailable", message}`, as the holder's
/// own follows end when it stops; a gRPC answer with trailers `grpc-status` 14 (`UNAVAILABLE`)
/// and `nexus-error-code: unavailable`; anything else, or an event stream cut inside an event,
/// with an error (its HTTP/2 stream is reset, its HTTP/1.1 connection closed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// `text/event-stream`: whether what was sent so far ends at an event's end.
    Events {
        at_boundary: bool,
    },
    Grpc,
    Broken,
    /// Cut and ended: nothing more is sent.
    Ended,
}

impl Ending {
    fn of(headers: &HeaderMap) -> Ending {
        let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        if content_type.starts_with("text/event-stream") {
            Ending::Events { at_boundary: true }
        } else if is_grpc(headers) {
            Ending::Grpc
        } else {
            Ending::Broken
        }
    }

    /// The last frame of an answer cut because of `why`.
    fn last_frame(self, why: &str) -> Result<http_body::Frame<Bytes>, axum::Error> {
        match self {
            Ending::Events { at_boundary: true } => {
                let data = serde_json::json!({"code": ErrorCode::Unavailable, "message": why});
                Ok(http_body::Frame::data(Bytes::from(format!("event: error\ndata: {data}\n\n"))))
            }
            Ending::Grpc => {
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("14"));
                trailers.insert("nexus-error-code", HeaderValue::from_static("unavailable"));
                // grpc-message is percent-encoded; the reasons are plain ASCII, spaces encoded.
                let message: String = why
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || ".,:;()-_".contains(c) {
                            c.to_string()
                        } else {
                            format!("%{:02X}", c as u32 & 0xff)
                        }
                    })
                    .collect();
                if let Ok(value) = HeaderValue::from_str(&message) {
                    trailers.insert("grpc-message", value);
                }
                Ok(http_body::Frame::trailers(trailers))
            }
            _ => Err(axum::Error::new(format!("{why}: this forwarded answer is cut"))),
        }
    }
}

impl HttpBody for Forwarding {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.ending == Ending::Ended {
            return Poll::Ready(None);
        }
        if let Poll::Ready(why) = self.cut.as_mut().poll(cx) {
            let last = self.ending.last_frame(&why);
            self.ending = Ending::Ended;
            return Poll::Ready(Some(last));
        }
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Ending::Events { at_boundary }) = (&polled, &mut self.ending)
            && let Some(data) = frame.data_ref()
            && !data.is_empty()
        {
            *at_boundary = data.ends_with(b"\n\n");
        }
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
            && let Some(socket) = self.welcome.take()
            && is_welcome(data)
        {
            socket.authenticated();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ending == Ending::Ended || self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Whether `data` opens with a whole uncompressed gRPC message (1 byte of flags, 4 of length,
/// then the message) that is a runner stream's Welcome.
fn is_welcome(data: &[u8]) -> bool {
    use prost::Message;
    let Some(([0], rest)) = data.split_first_chunk::<1>() else { return false };
    let Some((length, message)) = rest.split_first_chunk::<4>() else { return false };
    let length = u32::from_be_bytes(*length) as usize;
    message
        .get(..length)
        .and_then(|message| NexusFrame::decode(message).ok())
        .is_some_and(|frame| matches!(frame.frame, Some(nexus_frame::Frame::Welcome(_))))
}

/// Whether a request is gRPC (by its content type).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"))
}

/// A refusal as gRPC (trailers only) or as the doors' JSON error.
pub(crate) fn refusal_response(refusal: Refusal, grpc: bool) -> Response {
    if grpc {
        return refusal.to_status().into_http::<Body>();
    }
    HttpRefusal(refusal).into_response()
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
        return refusal_response(refusal, grpc);
    };
    let extensions = request.extensions_mut();
    let local_addr = extensions
        .get::<TcpConnectInfo>()
        .and_then(|info| info.local_addr)
        .or_else(|| extensions.get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|info| info.get_ref().local_addr));
    extensions.remove::<TlsConnectInfo<TcpConnectInfo>>();
    extensions.insert(TcpConnectInfo { local_addr, remote_addr: Some(SocketAddr::new(forwarded.client, 0)) });
    let (mut response, verified) = crate::doors::sockets::verifying(next.run(request)).await;
    if verified {
        response.headers_mut().insert(AUTHENTICATED, HeaderValue::from_static("1"));
    }
    response
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
    fn only_a_whole_welcome_message_counts_as_one() {
        use prost::Message;
        let framed = |frame: nexus_frame::Frame| {
            let message = NexusFrame { request_id: 1, frame: Some(frame) }.encode_to_vec();
            let mut data = vec![0];
            data.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
            data.extend_from_slice(&message);
            data
        };
        let welcome = framed(nexus_frame::Frame::Welcome(Default::default()));
        assert!(is_welcome(&welcome));
        assert!(!is_welcome(&welcome[..welcome.len() - 1]), "a partial message is not read");
        let mut compressed = welcome.clone();
        compressed[0] = 1;
        assert!(!is_welcome(&compressed));
        assert!(!is_welcome(&framed(nexus_frame::Frame::Refusal(Default::default()))));
        assert!(!is_welcome(b""));
    }

    #[tokio::test]
    async fn a_forwarded_answer_streams_until_it_is_cut_and_then_ends_with_an_error() {
        use futures::StreamExt;
        let (chunks_tx, chunks) = tokio::sync::mpsc::unbounded_channel::<Result<Bytes, std::io::Error>>();
        let body = Body::from_stream(tokio_stream::wrappers::UnboundedReceiverStream::new(chunks));
        let (cut_tx, cut_rx) = tokio::sync::oneshot::channel::<()>();
        let cut: Cut = Box::pin(async move {
            let _ = cut_rx.await;
            "the serving node changed".to_owned()
        });
        let forwarding = Forwarding { body, cut, welcome: None, ending: Ending::Broken };
        let mut answer = Body::new(forwarding).into_data_stream();
        chunks_tx.send(Ok(Bytes::from_static(b"event one"))).expect("sent");
        assert_eq!(answer.next().await.expect("a chunk").expect("data"), Bytes::from_static(b"event one"));
        cut_tx.send(()).expect("cut");
        chunks_tx.send(Ok(Bytes::from_static(b"event two"))).expect("sent");
        let ended = answer.next().await.expect("an end");
        assert!(ended.is_err(), "the cut ends the answer with an error, whatever else is ready: {ended:?}");
    }

    async fn next_frame(body: &mut Body) -> Option<Result<http_body::Frame<Bytes>, axum::Error>> {
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
    }

    /// A forwarded body over `chunks`, cut when `cut` is sent, ending as `ending` says.
    fn cut_body(ending: Ending) -> (tokio::sync::mpsc::UnboundedSender<Bytes>, tokio::sync::oneshot::Sender<()>, Body) {
        let (chunks_tx, chunks) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let stream = futures::StreamExt::map(
            tokio_stream::wrappers::UnboundedReceiverStream::new(chunks),
            Ok::<_, std::io::Error>,
        );
        let (cut_tx, cut_rx) = tokio::sync::oneshot::channel::<()>();
        let cut: Cut = Box::pin(async move {
            let _ = cut_rx.await;
            "this node (n-2) is stopping".to_owned()
        });
        (chunks_tx, cut_tx, Body::new(Forwarding { body: Body::from_stream(stream), cut, welcome: None, ending }))
    }

    #[tokio::test]
    async fn a_cut_event_stream_ends_with_an_unavailable_event_and_a_cut_grpc_answer_with_its_status() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        let (chunks, cut, mut body) = cut_body(Ending::of(&headers));
        chunks.send(Bytes::from_static(b"id: cvei_1\nevent: round_started\ndata: {}\n\n")).expect("sent");
        assert!(next_frame(&mut body).await.expect("a frame").expect("data").is_data());
        cut.send(()).expect("cut");
        let last = next_frame(&mut body).await.expect("a last frame").expect("data").into_data().expect("data");
        let last = String::from_utf8(last.to_vec()).expect("text");
        assert!(last.starts_with("event: error\ndata: {") && last.ends_with("\n\n"), "{last}");
        assert!(last.contains("\"code\":\"unavailable\"") && last.contains("is stopping"), "{last}");
        assert!(next_frame(&mut body).await.is_none(), "then the stream ends cleanly");

        // Cut inside an event: an error, not a second event glued to half of one.
        let (chunks, cut, mut body) = cut_body(Ending::of(&headers));
        chunks.send(Bytes::from_static(b"id: cvei_1\ndata: {\"half")).expect("sent");
        assert!(next_frame(&mut body).await.expect("a frame").is_ok());
        cut.send(()).expect("cut");
        assert!(next_frame(&mut body).await.expect("an end").is_err());

        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        let (_chunks, cut, mut body) = cut_body(Ending::of(&headers));
        cut.send(()).expect("cut");
        let trailers =
            next_frame(&mut body).await.expect("trailers").expect("a frame").into_trailers().expect("trailers");
        assert_eq!(trailers.get("grpc-status").map(|v| v.to_str().ok()), Some(Some("14")));
        assert_eq!(trailers.get("nexus-error-code").map(|v| v.to_str().ok()), Some(Some("unavailable")));
        assert_eq!(
            trailers.get("grpc-message").map(|v| v.to_str().ok()),
            Some(Some("this%20node%20(n-2)%20is%20stopping"))
        );
        assert!(next_frame(&mut body).await.is_none());
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
