//! Accepting connections on the doors' listener, plaintext and TLS alike, without ever giving up
//! and without spinning (`docs/architecture.md`, "Doors under pressure").
//!
//! An accept error is either about one connection (it was reset or aborted before it was taken:
//! skipped) or about the process (no file descriptors left, `EMFILE`/`ENFILE`, or no buffers): the
//! listener is fine, but every accept fails until something is freed. The loop then warns once,
//! pauses [`ACCEPT_ERROR_PAUSE`] between attempts instead of retrying at once (which would keep a
//! core busy and say nothing), and says when it accepts again. tonic's own loop for an `incoming`
//! stream skips errors with no pause and logs them at trace level, so both doors hand it a stream
//! that never yields one.

use std::io;
use std::time::Duration;

use futures::Stream;
use tokio::net::{TcpListener, TcpStream};

/// How long the accept loop waits after an error that is not about one connection.
pub(crate) const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Waits for the next connection on `listener`, with `TCP_NODELAY` set (the runner protocol is
/// small frames that wait for answers). Errors are handled as the module says; this never fails.
pub(crate) async fn next(listener: &TcpListener) -> TcpStream {
    let mut failing = 0_u64;
    loop {
        match listener.accept().await {
            Ok((socket, peer)) => {
                if failing > 0 {
                    tracing::warn!(failed_attempts = failing, "accepting connections again");
                }
                if let Err(error) = socket.set_nodelay(true) {
                    tracing::debug!(%peer, %error, "cannot set tcp_nodelay");
                }
                return socket;
            }
            Err(error) if is_per_connection(&error) => {
                tracing::debug!(%error, "a connection failed before it was accepted");
            }
            Err(error) => {
                if failing == 0 {
                    tracing::warn!(
                        %error,
                        pause_ms = u64::try_from(ACCEPT_ERROR_PAUSE.as_millis()).unwrap_or(u64::MAX),
                        "cannot accept connections; retrying until the process has file descriptors again \
                         (raise `ulimit -n`, or close idle connections)"
                    );
                }
                failing += 1;
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
}

/// The plaintext door's connections: [`next`] forever, as a stream tonic can serve.
pub(crate) fn plaintext(listener: TcpListener) -> impl Stream<Item = io::Result<TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let socket = next(&listener).await;
        Some((Ok(socket), listener))
    })
}

/// Whether an accept error concerns only the connection being accepted.
fn is_per_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lost_connection_is_skipped_without_a_pause() {
        assert!(is_per_connection(&io::Error::from(io::ErrorKind::ConnectionReset)));
        assert!(is_per_connection(&io::Error::from(io::ErrorKind::ConnectionAborted)));
        // EMFILE: the process is out of descriptors, which pauses the loop.
        assert!(!is_per_connection(&io::Error::from_raw_os_error(24)));
    }
}
