//! Opening one stream: TCP/HTTP2 channel (plaintext, or TLS verified against `--tls-ca`),
//! `Connect`, `hello`, and waiting for `welcome`.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use nexus_proto::Refusal;
use nexus_proto::runner::v1::runner_service_client::RunnerServiceClient;
use nexus_proto::runner::v1::{Hello, NexusFrame, Pong, RunnerFrame, Welcome, nexus_frame, runner_frame};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::{ClientTlsConfig, Endpoint, Identity};

use crate::config::{AgentConfig, ConfigError, TlsOptions};
use crate::retry;

/// The request id of `hello`; `welcome` or the refusal repeats it.
pub(super) const HELLO_REQUEST_ID: u64 = 1;
/// Largest frame either side may send.
const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;
/// Frames queued for sending on one stream; a full queue means nexus stopped reading.
const OUTBOUND_CAPACITY: usize = 1_024;

/// A stream past its handshake.
pub(super) struct Connected {
    pub(super) outbound: mpsc::Sender<RunnerFrame>,
    pub(super) inbound: Streaming<NexusFrame>,
    pub(super) welcome: Welcome,
    /// Frames that followed the welcome inside the same `NexusBatch`, for the loop.
    pub(super) after_welcome: Vec<NexusFrame>,
    /// The address the stream went to, when the URL's name resolved to several and one of them
    /// was picked ([`Target`]); `None` when the connector resolved the URL itself.
    pub(super) address: Option<SocketAddr>,
}

/// How to reach one URL of `nexus_urls` (`docs/cluster.md`, "Runners"): its endpoint, and, when
/// its host is a DNS name, how to reach each address that name resolves to. A name that resolves
/// to several addresses (one per node) is tried address by address within one attempt, so a
/// standby that closes the connection, or a dead node, never hides the node that serves: the
/// connector alone would take the first address that accepts TCP, every time.
#[derive(Clone, Debug)]
pub(super) struct Target {
    endpoint: Endpoint,
    name: Option<NamedHost>,
}

/// A URL whose host is a name: what a connection to one of its addresses keeps of the URL.
#[derive(Clone, Debug)]
struct NamedHost {
    /// `http` or `https`.
    scheme: String,
    host: String,
    port: u16,
    /// The URL itself, the `:authority` every request names.
    origin: tonic::codegen::http::Uri,
    /// TLS settings without a server name of their own: the URL's host is the one verified.
    tls: Option<ClientTlsConfig>,
    connect_timeout: Duration,
}

impl Target {
    /// The endpoint that connects to `address`, one of what the URL's name resolves to, while
    /// naming the URL's host in `:authority` and, over TLS, verifying nexus's certificate
    /// against it (or against `--tls-server-name`).
    fn pinned(&self, address: SocketAddr) -> Option<Endpoint> {
        let name = self.name.as_ref()?;
        let endpoint = Endpoint::from_shared(format!("{}://{address}", name.scheme)).ok()?.origin(name.origin.clone());
        let endpoint = tune(endpoint, name.connect_timeout);
        match &name.tls {
            None => Some(endpoint),
            Some(tls) => endpoint.tls_config(tls.clone()).ok(),
        }
    }
}

/// Why a stream could not be opened.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnectError {
    #[error("could not connect: {}", chain(.0))]
    Transport(tonic::transport::Error),
    #[error("the stream failed: {0}")]
    Status(tonic::Status),
    #[error("nexus refused the hello: {0}")]
    Refused(Refusal),
    #[error("nexus did not answer the hello within {0:?}")]
    Timeout(Duration),
    #[error("the connection to nexus did not open within {0:?}")]
    ConnectTimeout(Duration),
    #[error("nexus closed the stream before welcome")]
    Closed,
    #[error("nexus sent {0} before welcome")]
    Unexpected(&'static str),
}

impl ConnectError {
    /// The refusal that makes retrying pointless (the credential was rejected, or another final
    /// word), if this is one.
    pub(super) fn fatal(&self) -> Option<Refusal> {
        match self {
            ConnectError::Refused(refusal) if !retry::is_retryable_refusal(refusal.code) => Some(refusal.clone()),
            // A status without a nexus word takes its gRPC code's: unauthorized or not_authorized.
            ConnectError::Status(status) if retry::is_fatal_status(status) => Some(Refusal::from_status(status)),
            _ => None,
        }
    }

    /// A TLS failure that retrying cannot mend (nexus's certificate is not trusted, or nexus
    /// refused this runner's certificate or its lack of one), described for the operator.
    pub(super) fn tls_failure(&self, tls: &TlsOptions) -> Option<String> {
        let error = match self {
            ConnectError::Transport(error) => certificate_error(error),
            ConnectError::Status(status) => certificate_error(status),
            _ => None,
        }?;
        let ca = tls.ca.as_deref().map_or_else(|| "(none)".to_owned(), |path| path.display().to_string());
        let cert = tls.cert.as_deref().map_or_else(|| "(none)".to_owned(), |path| path.display().to_string());
        match error {
            rustls::Error::InvalidCertificate(reason) => Some(format!(
                "nexus's certificate was refused ({reason}): it must chain to a CA in --tls-ca {ca} and name the URL's host (or --tls-server-name)"
            )),
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired) => {
                Some("nexus requires a client certificate: start runner-agent with --tls-cert and --tls-key".to_owned())
            }
            rustls::Error::AlertReceived(alert) => Some(format!(
                "nexus refused this runner's client certificate --tls-cert {cert} (alert {alert:?}): it must chain to nexus's tls.client_ca"
            )),
            _ => None,
        }
    }
}

/// What to tell the operator when a plaintext connection fails the way a TLS port fails it.
pub(super) const PLAINTEXT_TO_TLS_HINT: &str = "if nexus serves TLS, use an https:// URL and --tls-ca";

impl ConnectError {
    /// Whether this failure is what a TLS port does to plaintext HTTP/2: it resets or closes the
    /// connection during the handshake (broken pipe, connection reset, connection closed), or its
    /// TLS alert record reads as an oversized HTTP/2 frame (`FRAME_SIZE_ERROR`). Nothing
    /// listening (refused) and timeouts are not it. Only a hint: a plaintext nexus going down
    /// mid-handshake looks the same.
    pub(super) fn looks_like_a_tls_port(&self) -> bool {
        let error: &(dyn std::error::Error + 'static) = match self {
            ConnectError::Transport(error) => error,
            ConnectError::Status(status) => status,
            _ => return false,
        };
        let mut cause = Some(error);
        while let Some(current) = cause {
            if let Some(io) = current.downcast_ref::<std::io::Error>()
                && matches!(
                    io.kind(),
                    std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::UnexpectedEof
                )
            {
                return true;
            }
            // hyper and h2 keep their kinds private; their renderings name them.
            let text = format!("{current} {current:?}").to_lowercase();
            if ["frame_size_error", "broken pipe", "connection reset", "connection closed"]
                .iter()
                .any(|sign| text.contains(sign))
            {
                return true;
            }
            cause = current.source();
        }
        false
    }
}

/// Alerts from nexus that refuse this runner's certificate, or its lack of one.
const CERTIFICATE_ALERTS: [rustls::AlertDescription; 8] = [
    rustls::AlertDescription::CertificateRequired,
    rustls::AlertDescription::BadCertificate,
    rustls::AlertDescription::UnsupportedCertificate,
    rustls::AlertDescription::CertificateRevoked,
    rustls::AlertDescription::CertificateExpired,
    rustls::AlertDescription::CertificateUnknown,
    rustls::AlertDescription::UnknownCA,
    rustls::AlertDescription::AccessDenied,
];

/// The certificate error somewhere in `error`'s causes: an untrusted server certificate, or a
/// certificate alert from nexus. An `io::Error` hides the error it wraps from `source()`, so each
/// one is opened too. An alert that arrives after the client's half of a TLS 1.3 handshake (how
/// a refused client certificate shows) passes through h2, which keeps only its text, so that
/// text is compared with rustls's own rendering of each certificate alert.
fn certificate_error(error: &(dyn std::error::Error + 'static)) -> Option<rustls::Error> {
    let mut cause = Some(error);
    while let Some(current) = cause {
        if let Some(found) = current.downcast_ref::<rustls::Error>() {
            return is_certificate_error(found).then(|| found.clone());
        }
        if let Some(inner) = current.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            if let Some(found) = certificate_error(inner) {
                return Some(found);
            }
            let text = inner.to_string();
            if let Some(alert) =
                CERTIFICATE_ALERTS.into_iter().find(|alert| rustls::Error::AlertReceived(*alert).to_string() == text)
            {
                return Some(rustls::Error::AlertReceived(alert));
            }
        }
        cause = current.source();
    }
    None
}

fn is_certificate_error(error: &rustls::Error) -> bool {
    match error {
        rustls::Error::InvalidCertificate(_) => true,
        rustls::Error::AlertReceived(alert) => CERTIFICATE_ALERTS.contains(alert),
        _ => false,
    }
}

/// An error with its causes, `outer: inner: innermost` (tonic's own message is only "transport
/// error"). A cause that repeats what is already said is said once: some layers print their
/// source inside their own message, and some wrap one without a word of their own.
fn chain(error: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![error.to_string()];
    let mut cause = error.source();
    while let Some(inner) = cause {
        let text = inner.to_string();
        let last = parts.last_mut().expect("one part at least");
        if text.starts_with(last.as_str()) {
            // The cause says the same and more: it replaces the shorter part.
            *last = text;
        } else if !last.contains(&text) {
            parts.push(text);
        }
        cause = inner.source();
    }
    parts.join(": ")
}

/// The [`Target`] for `url` (one of `nexus_urls`): its endpoint ([`tune`]d), with TLS when the
/// URL is `https://`: nexus is verified against `--tls-ca` only, and `--tls-cert`/`--tls-key`
/// are presented for mutual TLS. The TLS files are read here, once.
pub(super) fn target(config: &AgentConfig, url: &str) -> Result<Target, ConfigError> {
    let invalid_url =
        |error: tonic::transport::Error| ConfigError::InvalidUrl { url: url.to_owned(), reason: chain(&error) };
    let endpoint = tune(Endpoint::from_shared(url.to_owned()).map_err(invalid_url)?, config.connect_timeout);
    let tls = client_tls(config)?;
    let origin = endpoint.uri().clone();
    let name = match (origin.scheme_str(), origin.host(), origin.port_u16()) {
        (Some(scheme), Some(host), port) if !is_ip_literal(host) => {
            let https = scheme.eq_ignore_ascii_case("https");
            Some(NamedHost {
                scheme: scheme.to_ascii_lowercase(),
                host: host.to_owned(),
                port: port.unwrap_or(if https { 443 } else { 80 }),
                origin: origin.clone(),
                tls: tls.clone().map(|tls| match &config.tls.server_name {
                    Some(_) => tls,
                    None => tls.domain_name(host.to_owned()),
                }),
                connect_timeout: config.connect_timeout,
            })
        }
        _ => None,
    };
    let Some(tls) = tls else { return Ok(Target { endpoint, name }) };
    // The files parsed, so what rustls can still refuse is the pair (a key of another certificate).
    let endpoint = endpoint.tls_config(tls).map_err(|error| {
        let reason = match (&config.tls.cert, &config.tls.key) {
            (Some(cert), Some(key)) => {
                format!("cannot use --tls-cert {} with --tls-key {}: {}", cert.display(), key.display(), chain(&error))
            }
            _ => chain(&error),
        };
        ConfigError::Tls { reason }
    })?;
    Ok(Target { endpoint, name })
}

/// The endpoint options every connection shares: keepalive on (HTTP/2 PINGs only prove the next
/// hop alive; the application ping proves nexus), the connect bound, no Nagle.
fn tune(endpoint: Endpoint, connect_timeout: Duration) -> Endpoint {
    endpoint
        .connect_timeout(connect_timeout)
        .http2_keep_alive_interval(Duration::from_secs(15))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true)
}

/// Whether a URI host is an IP address (`127.0.0.1`, `[::1]`) rather than a name to resolve.
fn is_ip_literal(host: &str) -> bool {
    host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok()
}

/// The addresses `host` resolves to at `port`, each once, in the resolver's order.
async fn resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    #[cfg(test)]
    if let Some(addresses) = tests::resolved(host, port) {
        return Ok(addresses);
    }
    let mut addresses: Vec<SocketAddr> = Vec::new();
    for address in tokio::net::lookup_host((host, port)).await? {
        if !addresses.contains(&address) {
            addresses.push(address);
        }
    }
    Ok(addresses)
}

/// The client TLS settings, or `None` for a plaintext URL. Each file is checked here so that a
/// bad one is named (tonic skips certificates it cannot parse).
fn client_tls(config: &AgentConfig) -> Result<Option<ClientTlsConfig>, ConfigError> {
    let options = &config.tls;
    let Some(ca_path) = &options.ca else { return Ok(None) };
    let mut roots = RootCertStore::empty();
    for (index, certificate) in read_certificates("--tls-ca", ca_path)?.into_iter().enumerate() {
        roots.add(certificate).map_err(|error| ConfigError::TlsFile {
            what: "--tls-ca",
            path: ca_path.clone(),
            reason: format!("certificate {} is not a usable CA certificate: {error}", index + 1),
        })?;
    }
    let mut tls = ClientTlsConfig::new().trust_anchors(roots.roots).timeout(config.connect_timeout);
    if let Some(name) = &options.server_name {
        ServerName::try_from(name.as_str()).map_err(|error| ConfigError::Tls {
            reason: format!("--tls-server-name {name:?} is not a DNS name or IP address: {error}"),
        })?;
        tls = tls.domain_name(name.clone());
    }
    if let (Some(cert_path), Some(key_path)) = (&options.cert, &options.key) {
        read_certificates("--tls-cert", cert_path)?;
        let key = read_file("--tls-key", key_path)?;
        PrivateKeyDer::from_pem_slice(&key).map_err(|error| ConfigError::TlsFile {
            what: "--tls-key",
            path: key_path.clone(),
            reason: match error {
                rustls::pki_types::pem::Error::NoItemsFound => {
                    "no PRIVATE KEY block (PKCS#8, PKCS#1 or SEC1)".to_owned()
                }
                other => format!("not PEM: {other}"),
            },
        })?;
        let cert = read_file("--tls-cert", cert_path)?;
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(Some(tls))
}

fn read_file(what: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|error| ConfigError::TlsFile { what, path: path.to_owned(), reason: error.to_string() })
}

/// Every certificate of a PEM file (at least one).
fn read_certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let pem = read_file(what, path)?;
    let invalid = |reason: String| ConfigError::TlsFile { what, path: path.to_owned(), reason };
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| invalid(format!("not PEM: {error}")))?;
    if certificates.is_empty() {
        return Err(invalid("no CERTIFICATE block".to_owned()));
    }
    Ok(certificates)
}

/// Waits `delay`, opens a stream, says hello and waits for `welcome`, answering pings meanwhile.
/// Every step is bounded: the connection (TCP and the HTTP/2 handshake) by `connect_timeout`,
/// everything from the stream's request to `welcome` by `handshake_timeout`, so an attempt always
/// ends, and the caller logs it and tries again.
///
/// When the target's host is a name that resolves to several addresses, each is tried in turn
/// within this attempt, starting after `after` (the address of the stream just lost, so it comes
/// last), until one welcomes this runner. What it returns then: the first error that no other
/// address can mend (a refusal or a TLS failure, `is_final`) only when every address gave one;
/// else the last other error, so the caller retries.
pub(super) async fn open(
    target: Target,
    hello: Hello,
    bounds: (Duration, Duration),
    delay: Duration,
    after: Option<SocketAddr>,
    is_final: impl Fn(&ConnectError) -> bool,
) -> Result<Connected, ConnectError> {
    tokio::time::sleep(delay).await;
    let addresses = match &target.name {
        Some(name) => resolve(&name.host, name.port).await.unwrap_or_default(),
        None => Vec::new(),
    };
    if addresses.len() < 2 {
        // One address, or none (the connector resolves again and says why it failed).
        return open_one(target.endpoint, hello, bounds, None).await;
    }
    let start = after.and_then(|lost| addresses.iter().position(|address| *address == lost)).map_or(0, |at| at + 1);
    let mut final_error = None;
    let mut other_error = None;
    for address in addresses.iter().cycle().skip(start).take(addresses.len()) {
        let Some(endpoint) = target.pinned(*address) else { continue };
        match open_one(endpoint, hello.clone(), bounds, Some(*address)).await {
            Ok(connected) => return Ok(connected),
            Err(error) => {
                tracing::info!(%address, %error, "this address of the name did not welcome the runner; trying the next");
                if is_final(&error) {
                    final_error.get_or_insert(error);
                } else {
                    other_error = Some(error);
                }
            }
        }
    }
    Err(other_error.or(final_error).unwrap_or(ConnectError::Closed))
}

/// One connection attempt to `endpoint` (at `address`, when picked from a name's addresses).
async fn open_one(
    endpoint: Endpoint,
    hello: Hello,
    (connect_timeout, handshake_timeout): (Duration, Duration),
    address: Option<SocketAddr>,
) -> Result<Connected, ConnectError> {
    // tonic's connect_timeout bounds the TCP connect alone.
    let channel = tokio::time::timeout(connect_timeout, endpoint.connect())
        .await
        .map_err(|_| ConnectError::ConnectTimeout(connect_timeout))?
        .map_err(ConnectError::Transport)?;
    let mut client = RunnerServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let (outbound, requests) = mpsc::channel(OUTBOUND_CAPACITY);
    let hello = RunnerFrame { request_id: HELLO_REQUEST_ID, frame: Some(runner_frame::Frame::Hello(hello)) };
    outbound.try_send(hello).map_err(|_| ConnectError::Closed)?;

    let deadline = tokio::time::Instant::now() + handshake_timeout;
    let timed_out = |_| ConnectError::Timeout(handshake_timeout);
    let response = tokio::time::timeout_at(deadline, client.connect(ReceiverStream::new(requests)))
        .await
        .map_err(timed_out)?
        .map_err(ConnectError::Status)?;
    let mut inbound = response.into_inner();
    loop {
        let received = tokio::time::timeout_at(deadline, inbound.message())
            .await
            .map_err(timed_out)?
            .map_err(ConnectError::Status)?
            .ok_or(ConnectError::Closed)?;
        // A batch is read frame by frame, each as if it came alone.
        let mut frames = match received.frame {
            Some(nexus_frame::Frame::Batch(batch)) => batch.frames.into_iter(),
            frame => vec![NexusFrame { request_id: received.request_id, frame }].into_iter(),
        };
        while let Some(frame) = frames.next() {
            match frame.frame {
                Some(nexus_frame::Frame::Ping(ping)) => {
                    let pong = RunnerFrame {
                        request_id: 0,
                        frame: Some(runner_frame::Frame::Pong(Pong { nonce: ping.nonce })),
                    };
                    outbound.try_send(pong).map_err(|_| ConnectError::Closed)?;
                }
                Some(nexus_frame::Frame::Welcome(welcome)) if frame.request_id == HELLO_REQUEST_ID => {
                    return Ok(Connected { outbound, inbound, welcome, after_welcome: frames.collect(), address });
                }
                Some(nexus_frame::Frame::Refusal(refusal)) if frame.request_id == HELLO_REQUEST_ID => {
                    let http_status = u16::try_from(refusal.http_status).unwrap_or(500);
                    return Err(ConnectError::Refused(Refusal::from_wire(
                        &refusal.code,
                        &refusal.message,
                        http_status,
                    )));
                }
                Some(nexus_frame::Frame::Batch(_)) => return Err(ConnectError::Unexpected("a batch inside a batch")),
                Some(_) => return Err(ConnectError::Unexpected("another frame")),
                None => return Err(ConnectError::Unexpected("an empty frame")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io;
    use std::sync::Mutex;

    use nexus_proto::runner::v1::runner_service_server::{RunnerService, RunnerServiceServer};
    use tokio_stream::wrappers::TcpListenerStream;

    use super::*;

    /// Names the tests make resolve to addresses of their choosing (no test touches DNS).
    static NAMES: Mutex<Option<HashMap<String, Vec<IpAddr>>>> = Mutex::new(None);

    /// What `host` resolves to in a test that registered it.
    pub(super) fn resolved(host: &str, port: u16) -> Option<Vec<SocketAddr>> {
        let names = NAMES.lock().unwrap();
        let addresses = names.as_ref()?.get(host)?;
        Some(addresses.iter().map(|ip| SocketAddr::new(*ip, port)).collect())
    }

    fn register(host: &str, addresses: &[IpAddr]) {
        NAMES.lock().unwrap().get_or_insert_with(HashMap::new).insert(host.to_owned(), addresses.to_vec());
    }

    /// A nexus that welcomes every hello, and reports each stream it takes.
    struct Welcoming(mpsc::UnboundedSender<()>);

    #[tonic::async_trait]
    impl RunnerService for Welcoming {
        type ConnectStream = ReceiverStream<Result<NexusFrame, tonic::Status>>;

        async fn connect(
            &self,
            request: tonic::Request<Streaming<RunnerFrame>>,
        ) -> Result<tonic::Response<Self::ConnectStream>, tonic::Status> {
            let _ = self.0.send(());
            let mut inbound = request.into_inner();
            let (frames, stream) = mpsc::channel(4);
            tokio::spawn(async move {
                if let Ok(Some(_hello)) = inbound.message().await {
                    let welcome = Welcome { ping_interval_ms: 15_000, ..Welcome::default() };
                    let frame =
                        NexusFrame { request_id: HELLO_REQUEST_ID, frame: Some(nexus_frame::Frame::Welcome(welcome)) };
                    let _ = frames.send(Ok(frame)).await;
                }
                // Held open until the runner goes.
                while let Ok(Some(_)) = inbound.message().await {}
            });
            Ok(tonic::Response::new(ReceiverStream::new(stream)))
        }
    }

    /// A name that resolves to three nodes: one that takes each connection and closes it (a
    /// standby of an older nexus), one where nothing listens (a dead node), and one that serves.
    /// One attempt reaches the node that serves, whichever address it starts from, with one
    /// stream there.
    #[tokio::test]
    async fn a_name_of_several_addresses_is_tried_address_by_address() {
        let ips: Vec<IpAddr> = ["127.0.0.2", "127.0.0.3", "127.0.0.4"].iter().map(|ip| ip.parse().unwrap()).collect();
        // One port on all three: a port free on the first and the third (the second stays empty).
        let (closer, serving) = loop {
            let closer = tokio::net::TcpListener::bind((ips[0], 0)).await.unwrap();
            let port = closer.local_addr().unwrap().port();
            if let Ok(serving) = tokio::net::TcpListener::bind((ips[2], port)).await {
                break (closer, serving);
            }
        };
        let port = closer.local_addr().unwrap().port();
        let closing = tokio::spawn(async move {
            while let Ok((socket, _)) = closer.accept().await {
                drop(socket);
            }
        });
        let (streams, mut seen) = mpsc::unbounded_channel();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RunnerServiceServer::new(Welcoming(streams)))
                .serve_with_incoming(TcpListenerStream::new(serving)),
        );
        let host = "three-nodes.nexus.test";
        register(host, &ips);
        let config =
            AgentConfig::new(format!("http://{host}:{port}"), uuid::Uuid::nil(), crate::Credential::new("t"), "/");
        let named = target(&config, &config.nexus_urls[0]).unwrap();
        let bounds = (Duration::from_secs(5), Duration::from_secs(5));
        let serving_address = SocketAddr::new(ips[2], port);
        for after in [None, Some(SocketAddr::new(ips[0], port)), Some(serving_address)] {
            let connected = open(named.clone(), Hello::default(), bounds, Duration::ZERO, after, |_| false)
                .await
                .unwrap_or_else(|error| panic!("starting after {after:?}: {error}"));
            assert_eq!(connected.address, Some(serving_address), "starting after {after:?}");
            seen.recv().await.unwrap();
            assert!(seen.try_recv().is_err(), "one stream per attempt, starting after {after:?}");
        }

        // An IP literal is never resolved: the connector takes it as it is.
        let literal =
            AgentConfig::new(format!("http://{serving_address}"), uuid::Uuid::nil(), crate::Credential::new("t"), "/");
        let connected = open(
            target(&literal, &literal.nexus_urls[0]).unwrap(),
            Hello::default(),
            bounds,
            Duration::ZERO,
            None,
            |_| false,
        )
        .await
        .unwrap();
        assert_eq!(connected.address, None);

        // No address serves any more: the attempt ends with an error (the agent retries later).
        server.abort();
        let _ = server.await;
        let attempt = open(named, Hello::default(), bounds, Duration::ZERO, None, |_| false).await;
        assert!(attempt.is_err(), "no node serves any more");
        closing.abort();
    }

    fn io_error(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, error)
    }

    #[test]
    fn certificate_failures_are_final_and_other_failures_are_not() {
        let untrusted = io_error(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer));
        assert!(matches!(certificate_error(&untrusted), Some(rustls::Error::InvalidCertificate(_))));
        // h2 hands an alert on as text only.
        let required =
            io_error(rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired).to_string());
        let status = ConnectError::Status(tonic::Status::from_error(Box::new(required)));
        let options = TlsOptions { ca: Some("ca.pem".into()), ..TlsOptions::default() };
        assert!(status.tls_failure(&options).is_some_and(|reason| reason.contains("--tls-cert")));
        let unknown_ca = io_error(rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA).to_string());
        assert!(certificate_error(&unknown_ca).is_some());

        for transient in [
            io::Error::new(io::ErrorKind::ConnectionReset, "connection reset by peer"),
            io_error(rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure)),
            io_error("received corrupt message of type InvalidContentType"),
        ] {
            assert!(certificate_error(&transient).is_none(), "{transient}");
        }
        let status = ConnectError::Status(tonic::Status::unavailable("nexus is restarting"));
        assert!(status.tls_failure(&options).is_none());
    }

    /// A peer that takes the connection and then never answers (a server out of file
    /// descriptors whose backlog holds it, a wedged middlebox): the attempt still ends, with the
    /// bound named, so the caller logs it and tries again.
    #[tokio::test]
    async fn an_attempt_against_a_silent_peer_ends_at_its_bound() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent = listener.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut sockets = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                sockets.push(socket);
            }
        });
        let endpoint = Endpoint::from_shared(format!("http://{silent}")).unwrap();
        let bounds = (Duration::from_millis(300), Duration::from_millis(300));
        let Err(error) = open_one(endpoint, Hello::default(), bounds, None).await else {
            panic!("a silent peer welcomed the runner");
        };
        assert!(
            matches!(error, ConnectError::Timeout(_) | ConnectError::ConnectTimeout(_)),
            "the attempt ended at a bound: {error}"
        );
        assert!(error.to_string().contains("300ms"), "the message names the bound: {error}");
        held.abort();
    }

    #[tokio::test]
    async fn plaintext_to_a_tls_port_is_recognized_and_other_failures_are_not() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        // A TLS port as rustls runs one: bytes that are no ClientHello get a fatal alert, then
        // the connection is closed.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tls_port = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut preface = [0u8; 64];
                let _ = socket.read(&mut preface).await;
                let _ = socket.write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]).await;
            }
        });
        let endpoint = Endpoint::from_shared(format!("http://{tls_port}")).unwrap();
        for _ in 0..3 {
            let Err(error) =
                open_one(endpoint.clone(), Hello::default(), (Duration::from_secs(5), Duration::from_secs(5)), None)
                    .await
            else {
                panic!("a TLS port welcomed plaintext");
            };
            assert!(error.looks_like_a_tls_port(), "{error}");
        }
        server.abort();

        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let endpoint = Endpoint::from_shared(format!("http://{closed}")).unwrap();
        let Err(refused) =
            open_one(endpoint, Hello::default(), (Duration::from_secs(5), Duration::from_secs(5)), None).await
        else {
            panic!("nothing listens there");
        };
        assert!(!refused.looks_like_a_tls_port(), "{refused}");

        let broken = io::Error::new(io::ErrorKind::BrokenPipe, "broken pipe");
        assert!(ConnectError::Status(tonic::Status::from_error(Box::new(broken))).looks_like_a_tls_port());
        for other in [
            ConnectError::Status(tonic::Status::unavailable("nexus is restarting")),
            ConnectError::Timeout(Duration::from_secs(1)),
            ConnectError::Closed,
        ] {
            assert!(!other.looks_like_a_tls_port(), "{other}");
        }
    }

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|inner| inner as &(dyn std::error::Error + 'static))
        }
    }

    #[test]
    fn a_cause_is_said_once() {
        let refused = || Some(Box::new(Layer("Connection refused", None)));
        // A layer that prints its source in its own message, wrapped by one with a prefix of it.
        let repeated = Layer(
            "transport error",
            Some(Box::new(Layer(
                "tcp connect error",
                Some(Box::new(Layer("tcp connect error: Connection refused", refused()))),
            ))),
        );
        assert_eq!(chain(&repeated), "transport error: tcp connect error: Connection refused");
        let plain = Layer("transport error", Some(Box::new(Layer("dns error", refused()))));
        assert_eq!(chain(&plain), "transport error: dns error: Connection refused");
    }
}
