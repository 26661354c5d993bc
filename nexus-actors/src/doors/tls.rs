//! TLS on the one port: the rustls server configuration built from [`TlsConfig`], the accept
//! stream that hands tonic finished TLS connections, and the runner-stream gate of mutual TLS.
//!
//! tonic's own `ServerTlsConfig` offers ALPN `h2` only, which a client that speaks HTTP/1.1
//! alone (curl --http1.1, most HTTP libraries) cannot negotiate; so nexus runs its own acceptor
//! with `h2` and `http/1.1`, and the connection builder picks the protocol from the first bytes.
//! Handshakes run concurrently, each bounded by `tls.handshake_timeout_ms`, in a `JoinSet` owned
//! by the accept stream, so dropping the stream (shutdown) aborts those still in flight.
//!
//! ring is the only crypto provider of this build; [`install_crypto_provider`] makes it the
//! process default once, and is safe to call again.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::Instrument;

use nexus_proto::{ErrorCode, Refusal};

use crate::config::{ClientAuth, TlsConfig};
use crate::doors::accept;
use crate::doors::sockets::{Guarded, Sockets};

/// ALPN protocols offered, in order of preference.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A TLS file or setting that cannot be used; nothing was started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which setting named the file (`tls.cert`, `tls.key`, `tls.client_ca`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file holds no usable PEM item of the expected kind.
    #[error("invalid {what} {path}: {reason}")]
    Pem {
        /// Which setting named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused the combination (for example a key that does not match the certificate).
    #[error("cannot use tls.cert {cert} with tls.key {key}: {source}")]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason.
        source: rustls::Error,
    },
    /// `tls.client_auth` is set without `tls.client_ca`: there is nothing to verify client
    /// certificates against, and serving anyway would check none.
    #[error(
        "tls.client_auth = \"{}\" needs tls.client_ca: set client_ca (or --tls-client-ca) to the CA that client certificates must chain to, or remove client_auth",
        .0.as_str()
    )]
    ClientAuthWithoutCa(ClientAuth),
    /// The client CA file cannot verify client certificates.
    #[error("cannot verify client certificates with tls.client_ca {path}: {reason}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Makes ring the process-wide rustls crypto provider. Binaries call it first thing; the library
/// start path calls it too, so tests need not. A second call (or a provider some embedding
/// program installed first) leaves the installed one in place and never panics.
pub fn install_crypto_provider() {
    // Err means a default is already installed; keeping it is the point.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The server side of TLS, ready to accept.
#[derive(Clone)]
pub(crate) struct Acceptor {
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
    /// Whether the runner stream needs a client certificate that the handshake did not demand.
    pub(crate) gate_runner_stream: bool,
}

impl Acceptor {
    /// Reads the PEM files named by `config` and builds the rustls server configuration, or
    /// `None` when TLS is off.
    pub(crate) fn from_config(config: &TlsConfig) -> Result<Option<Acceptor>, TlsError> {
        if let (Some(client_auth), None) = (config.client_auth, &config.client_ca) {
            return Err(TlsError::ClientAuthWithoutCa(client_auth));
        }
        let (Some(cert_path), Some(key_path)) = (&config.cert, &config.key) else { return Ok(None) };
        install_crypto_provider();
        let provider = CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let chain = read_certificates("tls.cert", cert_path)?;
        let key = read_key("tls.key", key_path)?;
        let config_error = |source| TlsError::Config { cert: cert_path.clone(), key: key_path.clone(), source };
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(config_error)?;
        let builder = match &config.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca_path) => {
                let roots = read_roots("tls.client_ca", ca_path)?;
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let verifier = match config.client_auth() {
                    ClientAuth::Runners => verifier.allow_unauthenticated(),
                    ClientAuth::Required => verifier,
                };
                let verifier = verifier
                    .build()
                    .map_err(|e| TlsError::ClientCa { path: ca_path.clone(), reason: e.to_string() })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut server = builder.with_single_cert(chain, key).map_err(config_error)?;
        server.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(Some(Acceptor {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            handshake_timeout: config.handshake_timeout(),
            gate_runner_stream: config.client_ca.is_some() && config.client_auth() == ClientAuth::Runners,
        }))
    }

    /// The connections accepted on `listener` ([`accept::next_admitted`]: TCP_NODELAY set before
    /// the handshake, accept errors logged and retried with a pause, and each socket under the
    /// connection rules from its first byte, handshake included), past their handshake. Failed
    /// handshakes are logged and skipped.
    pub(crate) fn incoming(
        self,
        listener: Arc<TcpListener>,
        sockets: Arc<Sockets>,
    ) -> impl Stream<Item = io::Result<TlsStream<Guarded<TcpStream>>>> {
        let handshakes: JoinSet<Option<TlsStream<Guarded<TcpStream>>>> = JoinSet::new();
        futures::stream::unfold(
            (self, listener, handshakes, accept::Pressure::default(), sockets),
            |(acceptor, listener, mut handshakes, mut pressure, sockets)| async move {
                loop {
                    tokio::select! {
                        socket = accept::next_admitted(&listener, &mut pressure, &sockets) => {
                            let peer = socket.tcp().peer_addr().map_or_else(|_| "unknown".to_owned(), |peer| peer.to_string());
                            let span = tracing::info_span!("tls_handshake", %peer);
                            handshakes.spawn(acceptor.clone().handshake(socket).instrument(span));
                        },
                        Some(joined) = handshakes.join_next() => {
                            if let Ok(Some(stream)) = joined {
                                return Some((Ok(stream), (acceptor, listener, handshakes, pressure, sockets)));
                            }
                        }
                    }
                }
            },
        )
    }

    async fn handshake(self, socket: Guarded<TcpStream>) -> Option<TlsStream<Guarded<TcpStream>>> {
        match tokio::time::timeout(self.handshake_timeout, self.acceptor.accept(socket)).await {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(error)) => {
                // A refused client certificate is worth an operator's attention; probes and
                // plaintext clients on the TLS port are not.
                if is_certificate_error(&error) {
                    tracing::info!(%error, "tls handshake refused");
                } else {
                    tracing::debug!(%error, "tls handshake failed");
                }
                None
            }
            Err(_) => {
                tracing::debug!(timeout_ms = self.handshake_timeout.as_millis(), "tls handshake timed out");
                None
            }
        }
    }
}

/// The gate in front of `RunnerService` under `client_auth = "runners"`: a connection that
/// presented no client certificate (the handshake verified any that was presented) is refused
/// with `unauthorized`, which a runner-agent treats as final.
pub(crate) fn require_client_certificate(request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    if request.peer_certs().is_some_and(|certs| !certs.is_empty()) {
        return Ok(request);
    }
    let refusal = Refusal::new(
        ErrorCode::Unauthorized,
        "the runner stream needs a client certificate that chains to nexus's tls.client_ca; start runner-agent with --tls-cert and --tls-key",
    );
    Err(refusal.to_status())
}

/// Accept errors that concern one connection only (it was reset before `accept` returned).
/// Whether a failed handshake was about certificates (a missing or untrusted client
/// certificate, or the client refusing ours).
fn is_certificate_error(error: &io::Error) -> bool {
    let Some(rustls_error) = error.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else {
        return false;
    };
    matches!(
        rustls_error,
        rustls::Error::NoCertificatesPresented
            | rustls::Error::InvalidCertificate(_)
            | rustls::Error::AlertReceived(
                rustls::AlertDescription::BadCertificate
                    | rustls::AlertDescription::UnknownCA
                    | rustls::AlertDescription::CertificateUnknown
                    | rustls::AlertDescription::CertificateExpired
            )
    )
}

fn read_file(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { what, path: path.to_owned(), source })
}

/// Every certificate of a PEM file (at least one).
fn read_certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_file(what, path)?;
    let invalid = |reason: String| TlsError::Pem { what, path: path.to_owned(), reason };
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("not PEM: {e}")))?;
    if certificates.is_empty() {
        return Err(invalid("no CERTIFICATE block".to_owned()));
    }
    Ok(certificates)
}

/// The first private key of a PEM file.
fn read_key(what: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read_file(what, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        what,
        path: path.to_owned(),
        reason: match e {
            rustls::pki_types::pem::Error::NoItemsFound => "no PRIVATE KEY block (PKCS#8, PKCS#1 or SEC1)".to_owned(),
            other => format!("not PEM: {other}"),
        },
    })
}

/// The trust anchors of a PEM file of CA certificates.
fn read_roots(what: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for (index, certificate) in read_certificates(what, path)?.into_iter().enumerate() {
        roots.add(certificate).map_err(|e| TlsError::Pem {
            what,
            path: path.to_owned(),
            reason: format!("certificate {} is not a usable CA certificate: {e}", index + 1),
        })?;
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use rustls::pki_types::ServerName;

    use super::*;

    #[tokio::test]
    async fn accepted_sockets_have_nodelay_and_negotiate_h2_or_http1() {
        let dir = tempfile::tempdir().expect("temp dir");
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
        let (cert, key) = (dir.path().join("server.pem"), dir.path().join("server.key"));
        std::fs::write(&cert, certified.cert.pem()).expect("write");
        std::fs::write(&key, certified.signing_key.serialize_pem()).expect("write");
        let config = TlsConfig { cert: Some(cert), key: Some(key), ..TlsConfig::default() };
        let acceptor = Acceptor::from_config(&config).expect("valid").expect("on");
        assert!(!acceptor.gate_runner_stream);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let sockets = Sockets::from_config(&crate::config::ConnectionsConfig::default());
        let mut incoming = Box::pin(acceptor.incoming(Arc::new(listener), sockets));

        let mut roots = RootCertStore::empty();
        roots.add(certified.cert.der().clone()).expect("root");
        for protocol in [&b"h2"[..], b"http/1.1"] {
            let mut client =
                rustls::ClientConfig::builder().with_root_certificates(roots.clone()).with_no_client_auth();
            client.alpn_protocols = vec![protocol.to_vec()];
            let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
            let dialing = tokio::spawn(async move {
                let socket = TcpStream::connect(addr).await.expect("connect");
                connector.connect(ServerName::try_from("localhost").expect("name"), socket).await.expect("handshake")
            });
            let accepted = incoming.next().await.expect("a connection").expect("accepted");
            let (socket, session) = accepted.get_ref();
            assert!(socket.tcp().nodelay().expect("nodelay"), "TCP_NODELAY on the accepted socket");
            assert_eq!(session.alpn_protocol(), Some(protocol));
            drop(dialing.await.expect("client"));
        }
    }

    #[test]
    fn unreadable_and_invalid_files_name_their_path() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("missing.pem");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").expect("write");
        let config = |cert: &Path, key: &Path| TlsConfig {
            cert: Some(cert.to_owned()),
            key: Some(key.to_owned()),
            ..TlsConfig::default()
        };
        let error = Acceptor::from_config(&config(&missing, &garbage)).err().expect("refused");
        assert!(matches!(&error, TlsError::Read { what: "tls.cert", path, .. } if *path == missing), "{error}");
        assert!(error.to_string().contains("missing.pem"), "{error}");
        let error = Acceptor::from_config(&config(&garbage, &garbage)).err().expect("refused");
        assert!(matches!(&error, TlsError::Pem { what: "tls.cert", path, .. } if *path == garbage), "{error}");
        install_crypto_provider();
        install_crypto_provider();
        assert!(CryptoProvider::get_default().is_some());
        assert!(Acceptor::from_config(&TlsConfig::default()).expect("off").is_none());
    }
}
