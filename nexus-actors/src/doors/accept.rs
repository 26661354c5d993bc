//! Accepting connections on the doors' listener, plaintext and TLS alike, without ever giving up
//! and without spinning (`docs/architecture.md`, "Doors under pressure").
//!
//! An accept error is either about one connection (it was reset or aborted before it was taken:
//! skipped) or about the process (no file descriptors left, `EMFILE`/`ENFILE`, or no buffers): the
//! listener is fine, but every accept fails until something is freed. The loop then warns,
//! pauses [`ACCEPT_ERROR_PAUSE`] between attempts instead of retrying at once (which would keep a
//! core busy and say nothing), and says when it accepts again: one such pair per outage, and at
//! most one per [`WARN_EVERY`] however often descriptors come and go ([`Pressure`]). tonic's own loop for an `incoming`
//! stream skips errors with no pause and logs them at trace level, so both doors hand it a stream
//! that never yields one.
//!
//! Each accepted socket is admitted under the port's connection rules ([`Sockets`]) before
//! anything reads it.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::doors::sockets::{Guarded, Sockets};

/// How long the accept loop waits after an error that is not about one connection.
pub(crate) const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
/// At most one warning pair (cannot accept, accepting again) per this long: under churn, where
/// each freed descriptor is taken at once and the next accept fails again, the log stays quiet.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(30);

/// The accept loop's account of running out: what it warned, and when.
#[derive(Debug, Default)]
pub(crate) struct Pressure {
    /// Failed accepts since the last warning (or since the outage began).
    failures: u64,
    /// The current outage, if accepts are failing now: whether it was warned about.
    outage: Option<bool>,
    warned_at: Option<Instant>,
}

/// What the loop says about a change of pressure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Say {
    Nothing,
    /// The first failure of an outage, when no warning was given within [`WARN_EVERY`]: with the
    /// failures not warned about before it.
    CannotAccept {
        failures: u64,
    },
    /// The first accept after an outage that was warned about, with its failed attempts.
    AcceptingAgain {
        failures: u64,
    },
}

impl Pressure {
    fn failed(&mut self, now: Instant) -> Say {
        self.failures += 1;
        let quiet = self.warned_at.is_some_and(|at| now.duration_since(at) < WARN_EVERY);
        match self.outage {
            Some(_) => Say::Nothing,
            None if quiet => {
                self.outage = Some(false);
                Say::Nothing
            }
            None => {
                self.outage = Some(true);
                self.warned_at = Some(now);
                Say::CannotAccept { failures: std::mem::take(&mut self.failures) }
            }
        }
    }

    fn accepted(&mut self) -> Say {
        match self.outage.take() {
            Some(true) => Say::AcceptingAgain { failures: std::mem::take(&mut self.failures) },
            _ => Say::Nothing,
        }
    }
}

/// Waits for the next connection on `listener`, with `TCP_NODELAY` set (the runner protocol is
/// small frames that wait for answers). Errors are handled as the module says; this never fails.
pub(crate) async fn next(listener: &TcpListener, pressure: &mut Pressure) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((socket, peer)) => {
                if let Say::AcceptingAgain { failures } = pressure.accepted() {
                    tracing::warn!(failed_attempts = failures, "accepting connections again");
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
                match pressure.failed(Instant::now()) {
                    Say::CannotAccept { failures } => tracing::warn!(
                        %error,
                        failed_attempts = failures,
                        pause_ms = u64::try_from(ACCEPT_ERROR_PAUSE.as_millis()).unwrap_or(u64::MAX),
                        "cannot accept connections; retrying until the process has file descriptors again \
                         (raise `ulimit -n`, or close idle connections)"
                    ),
                    _ => tracing::debug!(%error, "cannot accept connections"),
                }
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
}

/// The next connection on `listener` admitted by `sockets` ([`Sockets::admit`]): a connection
/// refused at the cap is closed at once and the loop goes on.
pub(crate) async fn next_admitted(
    listener: &TcpListener,
    pressure: &mut Pressure,
    sockets: &Arc<Sockets>,
) -> Guarded<TcpStream> {
    loop {
        let socket = next(listener, pressure).await;
        let peer = socket.peer_addr().ok();
        if let Some(admitted) = sockets.admit(socket, peer) {
            return admitted;
        }
    }
}

/// The plaintext door's connections: [`next_admitted`] forever, as a stream tonic can serve. The
/// listener is shared: a standby's doors take it first, the serving doors after them.
pub(crate) fn plaintext(
    listener: Arc<TcpListener>,
    sockets: Arc<Sockets>,
) -> impl Stream<Item = io::Result<Guarded<TcpStream>>> {
    futures::stream::unfold((listener, Pressure::default(), sockets), |(listener, mut pressure, sockets)| async move {
        let socket = next_admitted(&listener, &mut pressure, &sockets).await;
        Some((Ok(socket), (listener, pressure, sockets)))
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

    #[test]
    fn one_warning_pair_per_outage_and_at_most_one_per_period_under_churn() {
        let mut pressure = Pressure::default();
        let start = Instant::now();
        assert_eq!(pressure.accepted(), Say::Nothing, "no outage, nothing to say");
        assert_eq!(pressure.failed(start), Say::CannotAccept { failures: 1 });
        for _ in 0..50 {
            assert_eq!(pressure.failed(start), Say::Nothing, "one warning per outage");
        }
        assert_eq!(pressure.accepted(), Say::AcceptingAgain { failures: 50 });
        // Churn: each freed descriptor is taken, and the next accept fails again.
        for second in 1..29 {
            assert_eq!(pressure.failed(start + Duration::from_secs(second)), Say::Nothing);
            assert_eq!(pressure.accepted(), Say::Nothing);
        }
        // A period later the next outage is warned about again, with what went unsaid.
        assert_eq!(pressure.failed(start + WARN_EVERY), Say::CannotAccept { failures: 29 });
        assert_eq!(pressure.accepted(), Say::AcceptingAgain { failures: 0 });
    }
}
