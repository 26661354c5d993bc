//! Opening one stream: TCP/HTTP2 channel, `Connect`, `hello`, and waiting for `welcome`.

use std::time::Duration;

use nexus_proto::runner::v1::runner_service_client::RunnerServiceClient;
use nexus_proto::runner::v1::{Hello, NexusFrame, Pong, RunnerFrame, Welcome, nexus_frame, runner_frame};
use nexus_proto::{ErrorCode, Refusal};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Endpoint;

use crate::config::AgentConfig;
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
            ConnectError::Refused(refusal) if !retry::is_retryable_refusal(&refusal.code) => Some(refusal.clone()),
            ConnectError::Status(status) if retry::is_fatal_status(status) => {
                let refusal = Refusal::from_status(status);
                Some(if refusal.error_code().is_some() {
                    refusal
                } else {
                    Refusal::new(ErrorCode::Unauthorized, status.message())
                })
            }
            _ => None,
        }
    }
}

/// An error with its causes, `outer: inner: innermost` (tonic's own message is only "transport
/// error").
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// The endpoint for `nexus_url`, with keepalive on (HTTP/2 PINGs only prove the next hop alive;
/// the application ping proves nexus).
pub(super) fn endpoint(config: &AgentConfig) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(config.nexus_url.clone())?
        .connect_timeout(config.connect_timeout)
        .http2_keep_alive_interval(Duration::from_secs(15))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true))
}

/// Waits `delay`, opens a stream, says hello and waits for `welcome`, answering pings meanwhile.
pub(super) async fn open(
    endpoint: Endpoint,
    hello: Hello,
    handshake_timeout: Duration,
    delay: Duration,
) -> Result<Connected, ConnectError> {
    tokio::time::sleep(delay).await;
    let channel = endpoint.connect().await.map_err(ConnectError::Transport)?;
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
        let frame = tokio::time::timeout_at(deadline, inbound.message())
            .await
            .map_err(timed_out)?
            .map_err(ConnectError::Status)?
            .ok_or(ConnectError::Closed)?;
        match frame.frame {
            Some(nexus_frame::Frame::Ping(ping)) => {
                let pong =
                    RunnerFrame { request_id: 0, frame: Some(runner_frame::Frame::Pong(Pong { nonce: ping.nonce })) };
                outbound.try_send(pong).map_err(|_| ConnectError::Closed)?;
            }
            Some(nexus_frame::Frame::Welcome(welcome)) if frame.request_id == HELLO_REQUEST_ID => {
                return Ok(Connected { outbound, inbound, welcome });
            }
            Some(nexus_frame::Frame::Refusal(refusal)) if frame.request_id == HELLO_REQUEST_ID => {
                return Err(ConnectError::Refused(Refusal {
                    code: refusal.code,
                    message: refusal.message,
                    retry_after: None,
                }));
            }
            Some(_) => return Err(ConnectError::Unexpected("another frame")),
            None => return Err(ConnectError::Unexpected("an empty frame")),
        }
    }
}
