//! An in-process TCP proxy between a runner and nexus that can cut, black-hole or delay every
//! connection through it.
//!
//! Faults apply per direction: *upstream* is runner to nexus, *downstream* is nexus to runner.
//! - [`TcpProxy::cut`] closes both sides of every live connection at once, like a cut cable.
//! - [`TcpProxy::black_hole`] stops forwarding (bytes and end-of-stream alike) but keeps both
//!   sockets open, as a half-open path through a broken middlebox does, until
//!   [`TcpProxy::heal`]; connections accepted meanwhile are held the same way. Held bytes are
//!   delivered on heal, as TCP would retransmit them, if both ends still listen.
//! - [`TcpProxy::delay`] holds every chunk for a fixed time before forwarding it; order is kept.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Which way bytes travel through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Runner to nexus.
    Upstream,
    /// Nexus to runner.
    Downstream,
    /// Both ways.
    Both,
}

impl Direction {
    fn covers(self, way: Direction) -> bool {
        self == Direction::Both || self == way
    }
}

/// The faults in force, per direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Faults {
    hole_up: bool,
    hole_down: bool,
    delay_up: Duration,
    delay_down: Duration,
}

impl Faults {
    fn hole(&self, way: Direction) -> bool {
        if way == Direction::Upstream { self.hole_up } else { self.hole_down }
    }

    fn delay(&self, way: Direction) -> Duration {
        if way == Direction::Upstream { self.delay_up } else { self.delay_down }
    }
}

/// Forwards 127.0.0.1:<port> to a target; see the module docs for the faults.
#[derive(Debug)]
pub struct TcpProxy {
    /// The proxy's address.
    pub addr: SocketAddr,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    faults: watch::Sender<Faults>,
    accepted: Arc<AtomicUsize>,
    in_transit: Arc<InTransit>,
    acceptor: JoinHandle<()>,
}

/// Bytes read from one side and not yet written to the other, per direction.
#[derive(Debug, Default)]
struct InTransit {
    upstream: AtomicI64,
    downstream: AtomicI64,
}

impl InTransit {
    fn of(&self, way: Direction) -> &AtomicI64 {
        if way == Direction::Upstream { &self.upstream } else { &self.downstream }
    }
}

impl TcpProxy {
    /// Starts a proxy to `target`.
    pub async fn start(target: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (faults, _) = watch::channel(Faults::default());
        let accepted = Arc::new(AtomicUsize::new(0));
        let in_transit: Arc<InTransit> = Arc::default();
        let counted = in_transit.clone();
        let held = links.clone();
        let link_faults = faults.clone();
        let counter = accepted.clone();
        let acceptor = tokio::spawn(async move {
            loop {
                let inbound = match listener.accept().await {
                    Ok((inbound, _)) => inbound,
                    // Out of file descriptors (or a connection reset before it was taken): the
                    // listener is fine, so the proxy keeps accepting, as nexus does.
                    Err(error) => {
                        tracing::warn!(%error, "the test proxy cannot accept; retrying");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = inbound.set_nodelay(true);
                counter.fetch_add(1, Ordering::SeqCst);
                let faults = link_faults.subscribe();
                let in_transit = counted.clone();
                let link = tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else { return };
                    let _ = outbound.set_nodelay(true);
                    forward(inbound, outbound, faults, in_transit).await;
                });
                let mut links = held.lock().expect("links");
                links.retain(|l| !l.is_finished());
                links.push(link);
            }
        });
        TcpProxy { addr, links, faults, accepted, in_transit, acceptor }
    }

    /// `http://<proxy addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Drops every live connection (both directions at once, like a cut cable with RSTs).
    /// Returns how many were live.
    pub fn cut(&self) -> usize {
        let mut links = self.links.lock().expect("links");
        let count = links.iter().filter(|l| !l.is_finished()).count();
        for link in links.drain(..) {
            link.abort();
        }
        // What the cut connections held is gone with them.
        self.in_transit.upstream.store(0, Ordering::SeqCst);
        self.in_transit.downstream.store(0, Ordering::SeqCst);
        count
    }

    /// Stops forwarding in `direction` on every connection, live or future, until [`heal`]:
    /// the sockets stay open and silent.
    ///
    /// [`heal`]: TcpProxy::heal
    pub fn black_hole(&self, direction: Direction) {
        self.faults.send_modify(|f| {
            f.hole_up |= direction.covers(Direction::Upstream);
            f.hole_down |= direction.covers(Direction::Downstream);
        });
    }

    /// Holds each chunk travelling in `direction` for `by` before forwarding it (zero: no delay).
    pub fn delay(&self, direction: Direction, by: Duration) {
        self.faults.send_modify(|f| {
            if direction.covers(Direction::Upstream) {
                f.delay_up = by;
            }
            if direction.covers(Direction::Downstream) {
                f.delay_down = by;
            }
        });
    }

    /// Lifts every black hole and delay; held bytes flow again.
    pub fn heal(&self) {
        self.faults.send_replace(Faults::default());
    }

    /// How many connections the proxy has accepted since it started: a runner's reconnect
    /// attempt shows here even while a black hole keeps it from reaching nexus.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Bytes travelling `way` (upstream or downstream) that the proxy has read and not yet
    /// delivered: held by a black hole or a delay. Lets a test wait until a frame it sent is
    /// inside the proxy.
    pub fn in_transit(&self, way: Direction) -> usize {
        let count = |counter: &AtomicI64| usize::try_from(counter.load(Ordering::SeqCst)).unwrap_or(0);
        match way {
            Direction::Both => count(&self.in_transit.upstream) + count(&self.in_transit.downstream),
            one => count(self.in_transit.of(one)),
        }
    }

    /// How many connections are live now.
    pub fn live(&self) -> usize {
        self.links.lock().expect("links").iter().filter(|l| !l.is_finished()).count()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.cut();
    }
}

/// One chunk read from a socket, with the time it may be written; `None` bytes is end of stream.
type Chunk = (Instant, Option<Vec<u8>>);

/// Pumps both directions of one connection until both ends close or a write fails. Aborting the
/// task that runs this drops both sockets (the JoinSet aborts its pumps).
async fn forward(inbound: TcpStream, outbound: TcpStream, faults: watch::Receiver<Faults>, in_transit: Arc<InTransit>) {
    let (runner_read, runner_write) = inbound.into_split();
    let (nexus_read, nexus_write) = outbound.into_split();
    let mut pumps = JoinSet::new();
    let (up_tx, up_rx) = mpsc::unbounded_channel();
    let (down_tx, down_rx) = mpsc::unbounded_channel();
    let up = Pump { way: Direction::Upstream, faults: faults.clone(), in_transit: in_transit.clone() };
    let down = Pump { way: Direction::Downstream, faults, in_transit };
    pumps.spawn(up.clone().read(runner_read, up_tx));
    pumps.spawn(up.write(nexus_write, up_rx));
    pumps.spawn(down.clone().read(nexus_read, down_tx));
    pumps.spawn(down.write(runner_write, down_rx));
    while let Some(done) = pumps.join_next().await {
        // A failed write means one end is gone: close everything, as a reset would.
        if matches!(done, Ok(false)) {
            return;
        }
    }
}

/// One direction of one connection.
#[derive(Clone)]
struct Pump {
    way: Direction,
    faults: watch::Receiver<Faults>,
    in_transit: Arc<InTransit>,
}

impl Pump {
    /// Reads chunks and stamps each with the time it may leave. Returns `true` at end of stream.
    async fn read(self, mut from: OwnedReadHalf, to: mpsc::UnboundedSender<Chunk>) -> bool {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let read = from.read(&mut buffer).await;
            let due = Instant::now() + self.faults.borrow().delay(self.way);
            match read {
                Ok(0) | Err(_) => {
                    let _ = to.send((due, None));
                    return true;
                }
                Ok(n) => {
                    self.in_transit.of(self.way).fetch_add(i64::try_from(n).unwrap_or(i64::MAX), Ordering::SeqCst);
                    if to.send((due, Some(buffer[..n].to_vec()))).is_err() {
                        return true;
                    }
                }
            }
        }
    }

    /// Writes chunks when due and while no black hole covers this direction. Returns `false`
    /// when a write fails.
    async fn write(mut self, mut to: OwnedWriteHalf, mut from: mpsc::UnboundedReceiver<Chunk>) -> bool {
        while let Some((due, bytes)) = from.recv().await {
            tokio::time::sleep_until(due).await;
            while self.faults.borrow_and_update().hole(self.way) {
                if self.faults.changed().await.is_err() {
                    return true;
                }
            }
            let Some(bytes) = bytes else {
                let _ = to.shutdown().await;
                return true;
            };
            let written = to.write_all(&bytes).await;
            self.in_transit.of(self.way).fetch_sub(i64::try_from(bytes.len()).unwrap_or(i64::MAX), Ordering::SeqCst);
            if written.is_err() {
                return false;
            }
        }
        true
    }
}
