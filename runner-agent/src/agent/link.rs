//! Opening one stream: TCP/HTTP2 channel (plaintext, or TLS verified against `--tls-ca`),
//! `Connect`, `hello`, and waiting for `welcome`.

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

/// The endpoint for `url` (one of `nexus_urls`), with keepalive on (HTTP/2 PINGs only prove the next hop alive;
/// the application ping proves nexus), and TLS when the URL is `https://`: nexus is verified
/// against `--tls-ca` only, and `--tls-cert`/`--tls-key` are presented for mutual TLS. The TLS
/// files are read here, once.
pub(super) fn endpoint(config: &AgentConfig, url: &str) -> Result<Endpoint, ConfigError> {
    let invalid_url =
        |error: tonic::transport::Error| ConfigError::InvalidUrl { url: url.to_owned(), reason: chain(&error) };
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(invalid_url)?
        .connect_timeout(config.connect_timeout)
        .http2_keep_alive_interval(Duration::from_secs(15))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    let Some(tls) = client_tls(config)? else { return Ok(endpoint) };
    // The files parsed, so what rustls can still refuse is the pair (a key of another certificate).
    endpoint.tls_config(tls).map_err(|error| {
        let reason = match (&config.tls.cert, &config.tls.key) {
            (Some(cert), Some(key)) => {
                format!("cannot use --tls-cert {} with --tls-key {}: {}", cert.display(), key.display(), chain(&error))
            }
            _ => chain(&error),
        };
        ConfigError::Tls { reason }
    })
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
pub(super) async fn open(
    endpoint: Endpoint,
    hello: Hello,
    (connect_timeout, handshake_timeout): (Duration, Duration),
    delay: Duration,
) -> Result<Connected, ConnectError> {
    tokio::time::sleep(delay).await;
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
                    return Ok(Connected { outbound, inbound, welcome, after_welcome: frames.collect() });
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
    use std::io;

    use super::*;

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
        let Err(error) = open(endpoint, Hello::default(), bounds, Duration::ZERO).await else {
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
            let Err(error) = open(
                endpoint.clone(),
                Hello::default(),
                (Duration::from_secs(5), Duration::from_secs(5)),
                Duration::ZERO,
            )
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
            open(endpoint, Hello::default(), (Duration::from_secs(5), Duration::from_secs(5)), Duration::ZERO).await
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
