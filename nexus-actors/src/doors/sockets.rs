//! Every connection of the one port under its bounds (`docs/architecture.md`, "Doors under
//! pressure"): a cap on how many are open, shedding of the ones that never authenticated when it
//! is reached, and deadlines for a connection that sends nothing, sends its first request too
//! slowly, or sits idle between requests.
//!
//! The rules live below the protocols, on the socket itself: [`Guarded`] wraps each accepted
//! stream (before any TLS handshake, which is then bounded too) and ends it by reading end of
//! file once its deadline passes or it is shed, so hyper closes it whatever it was doing (the
//! HTTP/1-or-2 sniffing of the first bytes included, which has no bound of its own). What the
//! socket cannot see, whether a request is in flight and whether one was authenticated, the
//! doors tell it: [`track`] is the outermost layer of every door and counts each request until
//! its response body ends (a runner's stream or a followed event stream stays in flight for its
//! whole life), and the code that verifies a credential calls [`authenticated`] (members) or
//! [`Socket::authenticated`] (a runner's Hello, which the connection actor verifies).
//!
//! The doors find their socket by the peer address tonic records for each request (peer
//! addresses are unique among open connections), so `remote_addr()` and `peer_certs()` keep
//! working on every request.
//!
//! Deadlines run on tokio's clock, not the server's [`Clock`](crate::clock::Clock): moving the
//! server's clock (tests do, by hours) must not drop every idle client at once.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

use crate::config::ConnectionsConfig;
use crate::doors::accept::WARN_EVERY;

tokio::task_local! {
    /// The socket of the request being served, for [`authenticated`] and [`current`].
    static CURRENT: Socket;
    /// Set by [`authenticated`] while [`verifying`] runs: whether the request verified a credential.
    static VERIFIED: Arc<AtomicBool>;
}

/// The deadlines of one connection, from [`ConnectionsConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounds {
    first_byte: Duration,
    request_head: Duration,
    idle: Duration,
}

impl Bounds {
    pub(crate) fn from_config(config: &ConnectionsConfig) -> Bounds {
        Bounds {
            first_byte: config.first_byte_timeout(),
            request_head: config.request_head_timeout(),
            idle: config.idle_timeout(),
        }
    }
}

/// What one connection shares with the registry and the doors.
#[derive(Debug)]
struct SocketState {
    /// Accept order: the oldest unauthenticated connection is shed first.
    id: u64,
    peer: Option<SocketAddr>,
    authenticated: AtomicBool,
    shed: AtomicBool,
    /// The task reading the connection, woken when it is shed.
    reader: AtomicWaker,
    /// Requests begun on this connection, ever.
    requests: AtomicU64,
    /// Requests whose response body has not ended.
    in_flight: AtomicUsize,
}

/// One open connection, as the doors see it: a handle to mark it authenticated.
#[derive(Clone, Debug)]
pub struct Socket {
    state: Arc<SocketState>,
    sockets: Arc<Sockets>,
}

impl Socket {
    /// Marks the connection as one that presented a valid credential: it is never shed for the
    /// cap from now on (its deadlines still hold).
    pub fn authenticated(&self) {
        if !self.state.authenticated.swap(true, Ordering::AcqRel) {
            self.sockets.lock().unprotected.remove(&self.state.id);
        }
    }
}

/// Marks the connection of the request being served as authenticated (see
/// [`Socket::authenticated`]); does nothing outside a request (a test calling the API directly).
pub fn authenticated() {
    let _ = CURRENT.try_with(Socket::authenticated);
    let _ = VERIFIED.try_with(|verified| verified.store(true, Ordering::Release));
}

/// Runs `request`, and says whether it verified a credential ([`authenticated`]) on the way: the
/// holder tells a standby so of a request it forwarded (`doors::forward`), since the connection
/// it came on is the standby's, not its client's.
pub(crate) async fn verifying<F: Future>(request: F) -> (F::Output, bool) {
    let verified = Arc::new(AtomicBool::new(false));
    let output = VERIFIED.scope(verified.clone(), request).await;
    (output, verified.load(Ordering::Acquire))
}

/// The connection of the request being served, for work that authenticates later elsewhere (a
/// runner's Hello, in its connection actor); `None` outside a request.
pub fn current() -> Option<Socket> {
    CURRENT.try_with(Socket::clone).ok()
}

/// Counts of the registry, for logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketCounts {
    /// Connections open now (shed ones included until they close).
    pub open: usize,
    /// Connections open now that have authenticated.
    pub authenticated: usize,
    /// Connections shed for the cap since start.
    pub shed: u64,
    /// New connections closed at once since start, because every open one had authenticated.
    pub refused: u64,
    /// Connections closed by a deadline since start.
    pub timed_out: u64,
}

/// Every open connection of the port: the cap, the shedding order, and the peer-address index
/// the doors look sockets up by.
#[derive(Debug)]
pub struct Sockets {
    cap: usize,
    bounds: Bounds,
    inner: Mutex<Registry>,
    timed_out: AtomicU64,
}

#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    open: usize,
    /// Shed connections that have not closed yet: they no longer count against the cap.
    closing: usize,
    by_peer: HashMap<SocketAddr, Arc<SocketState>>,
    /// Open, unauthenticated and not shed: oldest first.
    unprotected: BTreeMap<u64, Arc<SocketState>>,
    shed: u64,
    refused: u64,
    log: ShedLog,
}

/// At most one warning per [`WARN_EVERY`] about the cap, with what went unsaid in between.
#[derive(Debug, Default)]
struct ShedLog {
    warned_at: Option<Instant>,
    shed: u64,
    refused: u64,
}

impl ShedLog {
    /// Records one shed (or refused) connection; answers the counts to warn about, when a warning
    /// is due.
    fn note(&mut self, refused: bool, now: Instant) -> Option<(u64, u64)> {
        if refused {
            self.refused += 1;
        } else {
            self.shed += 1;
        }
        if self.warned_at.is_some_and(|at| now.duration_since(at) < WARN_EVERY) {
            return None;
        }
        self.warned_at = Some(now);
        Some((std::mem::take(&mut self.shed), std::mem::take(&mut self.refused)))
    }
}

impl Sockets {
    /// A registry for at most `cap` connections under `bounds`.
    pub(crate) fn new(cap: usize, bounds: Bounds) -> Arc<Sockets> {
        Arc::new(Sockets { cap: cap.max(1), bounds, inner: Mutex::default(), timed_out: AtomicU64::new(0) })
    }

    /// The registry of `config`, its cap derived from this process's open-file limit when unset.
    pub(crate) fn from_config(config: &ConnectionsConfig) -> Arc<Sockets> {
        Sockets::new(config.cap(open_file_limit()), Bounds::from_config(config))
    }

    /// The cap in force.
    pub fn cap(&self) -> usize {
        self.cap
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        // A panic while holding it leaves plain counts behind, still usable.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The counts now.
    pub fn counts(&self) -> SocketCounts {
        let registry = self.lock();
        SocketCounts {
            open: registry.open,
            authenticated: registry.by_peer.values().filter(|s| s.authenticated.load(Ordering::Acquire)).count(),
            shed: registry.shed,
            refused: registry.refused,
            timed_out: self.timed_out.load(Ordering::Relaxed),
        }
    }

    /// Takes an accepted stream under the rules, shedding the oldest unauthenticated connection
    /// when the cap is reached; `None` (the stream is closed) when every open one has
    /// authenticated.
    pub(crate) fn admit<S>(self: &Arc<Self>, io: S, peer: Option<SocketAddr>) -> Option<Guarded<S>> {
        let now = Instant::now();
        let mut registry = self.lock();
        if registry.open - registry.closing >= self.cap {
            let oldest = registry.unprotected.pop_first();
            let refused = oldest.is_none();
            if let Some((_, victim)) = oldest {
                victim.shed.store(true, Ordering::Release);
                victim.reader.wake();
                registry.closing += 1;
                registry.shed += 1;
            } else {
                registry.refused += 1;
            }
            if let Some((shed, refused_count)) = registry.log.note(refused, now) {
                tracing::warn!(
                    max_connections = self.cap,
                    open = registry.open,
                    shed,
                    refused = refused_count,
                    "connection cap reached; closing the oldest connections that have not authenticated \
                     (raise [connections] max_connections and `ulimit -n` if these are real clients)"
                );
            }
            if refused {
                return None;
            }
        }
        registry.next_id += 1;
        let state = Arc::new(SocketState {
            id: registry.next_id,
            peer,
            authenticated: AtomicBool::new(false),
            shed: AtomicBool::new(false),
            reader: AtomicWaker::new(),
            requests: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        });
        registry.open += 1;
        registry.unprotected.insert(state.id, state.clone());
        if let Some(peer) = peer {
            registry.by_peer.insert(peer, state.clone());
        }
        drop(registry);
        Some(Guarded {
            io,
            state,
            sockets: self.clone(),
            bounds: self.bounds,
            accepted_at: now,
            first_byte: false,
            idle: None,
            timer: None,
            closed: false,
        })
    }

    fn lookup(self: &Arc<Self>, request: &Request) -> Option<Socket> {
        let extensions = request.extensions();
        let peer = extensions.get::<TcpConnectInfo>().and_then(TcpConnectInfo::remote_addr).or_else(|| {
            extensions.get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|info| info.get_ref().remote_addr())
        })?;
        let state = self.lock().by_peer.get(&peer)?.clone();
        Some(Socket { state, sockets: self.clone() })
    }

    fn closed(&self, state: &SocketState) {
        let mut registry = self.lock();
        registry.open -= 1;
        if state.shed.load(Ordering::Acquire) {
            registry.closing -= 1;
        }
        registry.unprotected.remove(&state.id);
        if let Some(peer) = state.peer
            && registry.by_peer.get(&peer).is_some_and(|entry| entry.id == state.id)
        {
            registry.by_peer.remove(&peer);
        }
    }
}

/// The soft open-file limit of this process (`ulimit -n`), when it can be read.
fn open_file_limit() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok().map(|(soft, _)| soft)
}

/// The outermost layer of every door: counts the request as in flight on its connection until
/// its response body ends, and serves it with the connection as [`current`].
pub(crate) async fn track(State(sockets): State<Arc<Sockets>>, request: Request, next: Next) -> Response {
    let Some(socket) = sockets.lookup(&request) else { return next.run(request).await };
    let in_flight = InFlight::begin(socket.state.clone());
    let response = CURRENT.scope(socket, next.run(request)).await;
    response.map(|body| Body::new(Tracked { body, _in_flight: in_flight }))
}

/// One request in flight on its connection, from its head to the end of its response body.
#[derive(Debug)]
struct InFlight(Arc<SocketState>);

impl InFlight {
    fn begin(state: Arc<SocketState>) -> InFlight {
        state.in_flight.fetch_add(1, Ordering::AcqRel);
        state.requests.fetch_add(1, Ordering::AcqRel);
        InFlight(state)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        // The connection's reader arms its idle deadline when it next reads.
        self.0.reader.wake();
    }
}

/// A response body that keeps its request in flight until it ends or is dropped.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl HttpBody for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// An accepted stream under its connection's rules: it reads end of file once shed or past its
/// deadline (and refuses writes from then on), and leaves the registry when dropped.
#[derive(Debug)]
pub(crate) struct Guarded<S> {
    io: S,
    state: Arc<SocketState>,
    sockets: Arc<Sockets>,
    bounds: Bounds,
    accepted_at: Instant,
    first_byte: bool,
    /// Since when no request has been in flight, and the request count then.
    idle: Option<(Instant, u64)>,
    timer: Option<(Instant, Pin<Box<Sleep>>)>,
    closed: bool,
}

/// Why a connection is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    Shed,
    FirstByte,
    RequestHead,
    Idle,
}

impl Cut {
    fn as_str(self) -> &'static str {
        match self {
            Cut::Shed => "shed at the connection cap",
            Cut::FirstByte => "no byte within first_byte_timeout_ms",
            Cut::RequestHead => "no whole request within request_head_timeout_ms",
            Cut::Idle => "idle for idle_timeout_ms",
        }
    }
}

impl<S> Guarded<S> {
    /// The deadline in force and what passing it means; `None` while a request is in flight.
    fn deadline(&mut self, now: Instant) -> Option<(Instant, Cut)> {
        let requests = self.state.requests.load(Ordering::Acquire);
        if requests == 0 {
            return Some(if self.first_byte {
                (self.accepted_at + self.bounds.request_head, Cut::RequestHead)
            } else {
                (self.accepted_at + self.bounds.first_byte, Cut::FirstByte)
            });
        }
        if self.state.in_flight.load(Ordering::Acquire) > 0 {
            self.idle = None;
            return None;
        }
        let since = match self.idle {
            Some((since, seen)) if seen == requests => since,
            _ => {
                self.idle = Some((now, requests));
                now
            }
        };
        Some((since + self.bounds.idle, Cut::Idle))
    }

    /// Whether the connection must end now; arms the timer for its deadline otherwise.
    fn check(&mut self, cx: &mut Context<'_>) -> Option<Cut> {
        if self.closed {
            return Some(Cut::Shed);
        }
        self.state.reader.register(cx.waker());
        if self.state.shed.load(Ordering::Acquire) {
            return Some(self.close(Cut::Shed));
        }
        let now = Instant::now();
        let (deadline, cut) = self.deadline(now)?;
        if deadline <= now {
            return Some(self.close(cut));
        }
        let timer = match &mut self.timer {
            Some((at, timer)) if *at == deadline => timer,
            slot => &mut slot.insert((deadline, Box::pin(tokio::time::sleep_until(deadline)))).1,
        };
        if timer.as_mut().poll(cx).is_ready() {
            return Some(self.close(cut));
        }
        None
    }

    fn close(&mut self, cut: Cut) -> Cut {
        if !self.closed {
            self.closed = true;
            self.timer = None;
            if cut != Cut::Shed {
                self.sockets.timed_out.fetch_add(1, Ordering::Relaxed);
            }
            tracing::debug!(peer = ?self.state.peer, reason = cut.as_str(), "closing a connection");
        }
        cut
    }
}

impl<S> Drop for Guarded<S> {
    fn drop(&mut self) {
        self.sockets.closed(&self.state);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.check(cx).is_some() {
            // End of file: hyper ends the connection, whatever it was reading.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.first_byte = true;
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        if self.closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        Pin::new(&mut self.io).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, data)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Connected for Guarded<TcpStream> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

impl Guarded<TcpStream> {
    /// The TCP stream underneath.
    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.io
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    const FIRST_BYTE: Duration = Duration::from_secs(10);
    const HEAD: Duration = Duration::from_secs(30);
    const IDLE: Duration = Duration::from_secs(120);

    fn sockets(cap: usize) -> Arc<Sockets> {
        Sockets::new(cap, Bounds { first_byte: FIRST_BYTE, request_head: HEAD, idle: IDLE })
    }

    fn peer(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// An admitted server end and the client end that talks to it.
    fn admit(sockets: &Arc<Sockets>, port: u16) -> Option<(Guarded<DuplexStream>, DuplexStream)> {
        let (client, server) = tokio::io::duplex(1024);
        sockets.admit(server, peer(port)).map(|guarded| (guarded, client))
    }

    fn socket_of(guarded: &Guarded<DuplexStream>, sockets: &Arc<Sockets>) -> Socket {
        Socket { state: guarded.state.clone(), sockets: sockets.clone() }
    }

    /// Reads until end of file, answering how long it took on tokio's (paused) clock.
    async fn read_to_eof(guarded: &mut Guarded<DuplexStream>) -> Duration {
        let started = Instant::now();
        let mut buf = [0u8; 64];
        loop {
            if guarded.read(&mut buf).await.expect("reads") == 0 {
                return started.elapsed();
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_oldest_unauthenticated_connection_is_shed_and_authenticated_ones_never_are() {
        let sockets = sockets(3);
        let (mut member, _member_client) = admit(&sockets, 1).expect("admitted");
        socket_of(&member, &sockets).authenticated();
        let (mut oldest, _c2) = admit(&sockets, 2).expect("admitted");
        let (younger, _c3) = admit(&sockets, 3).expect("admitted");
        assert_eq!(sockets.counts().open, 3);
        assert_eq!(sockets.counts().authenticated, 1);

        // The fourth sheds the oldest that has not authenticated, not the member.
        let (fourth, _c4) = admit(&sockets, 4).expect("admitted by shedding");
        assert!(oldest.state.shed.load(Ordering::Acquire));
        assert!(!member.state.shed.load(Ordering::Acquire) && !younger.state.shed.load(Ordering::Acquire));
        assert_eq!(read_to_eof(&mut oldest).await, Duration::ZERO, "a shed connection ends at once");
        assert!(oldest.write_all(b"x").await.is_err(), "and takes no more writes");
        drop(oldest);
        assert_eq!(sockets.counts().open, 3);
        assert_eq!(sockets.counts().shed, 1);

        // Once every open connection has authenticated, a new one is refused instead.
        socket_of(&younger, &sockets).authenticated();
        socket_of(&fourth, &sockets).authenticated();
        assert!(admit(&sockets, 5).is_none(), "refused: nothing left to shed");
        assert_eq!(sockets.counts().refused, 1);
        assert_eq!(sockets.counts().open, 3);
        // The protected ones still read their bytes.
        let (mut tail, mut client) = tokio::io::duplex(64);
        std::mem::swap(&mut member.io, &mut tail);
        client.write_all(b"GET").await.expect("write");
        let mut buf = [0u8; 3];
        member.read_exact(&mut buf).await.expect("the member is still served");
        drop((member, younger, fourth));
        assert_eq!(sockets.counts(), SocketCounts { open: 0, authenticated: 0, shed: 1, refused: 1, timed_out: 0 });
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_socket_ends_at_the_first_byte_bound_and_a_slow_head_at_the_head_bound() {
        let sockets = sockets(10);
        let (mut silent, _client) = admit(&sockets, 1).expect("admitted");
        assert_eq!(read_to_eof(&mut silent).await, FIRST_BYTE);

        let (mut slow, mut client) = admit(&sockets, 2).expect("admitted");
        client.write_all(b"G").await.expect("one byte");
        let mut buf = [0u8; 1];
        slow.read_exact(&mut buf).await.expect("the first byte arrives");
        // A byte every few seconds never completes a head: the head bound cuts it.
        let started = Instant::now();
        let dribble = tokio::spawn(async move {
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_secs(5)).await;
                if client.write_all(b"E").await.is_err() {
                    return;
                }
            }
        });
        let elapsed = started.elapsed() + read_to_eof(&mut slow).await;
        assert_eq!(elapsed, HEAD, "cut 30 s after accept, not at the first-byte bound");
        assert_eq!(sockets.counts().timed_out, 2);
        drop(slow);
        dribble.await.expect("dribble");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_holds_the_connection_and_idleness_after_it_ends_it() {
        let sockets = sockets(10);
        let (mut served, _client) = admit(&sockets, 1).expect("admitted");
        let request = InFlight::begin(served.state.clone());
        // In flight for ten minutes (a runner's stream): no deadline cuts it.
        let outcome = tokio::time::timeout(Duration::from_secs(600), read_to_eof(&mut served)).await;
        assert!(outcome.is_err(), "a connection with a request in flight was cut");
        drop(request);
        assert_eq!(read_to_eof(&mut served).await, IDLE, "idle for the idle bound after its request ended");
    }
}
