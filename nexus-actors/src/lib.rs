//! nexus: hosts Agent profiles and runs their executions over a fabric of runners.
//!
//! Owns: the declaration grammar and tool assembly ([`declaration`]), the actors ([`root`],
//! [`profile`], [`executor`], [`connection`], [`execution`]), the durable store ([`store`]), model
//! providers ([`model`]), and the gRPC and HTTP/JSON doors ([`grpc`], [`http`]) served on one
//! port, in plaintext or over TLS ([`tls`]). Does not own: tools that run on workers (that is
//! `runner-agent`).
//!
//! Main entry points: [`serve`] runs a server until a shutdown future resolves; [`start`] returns
//! a [`RunningServer`] handle (tests and `nexus quickstart` use it); [`admin`] mints credentials.

pub mod actors;
pub mod auth;
pub mod budget;
pub mod cli;
pub mod clock;
pub mod config;
pub mod declaration;
pub mod doors;
pub mod eligibility;
#[doc(hidden)]
pub mod fuzzing;
pub mod json;
#[cfg(test)]
mod layers;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod schedule;
pub mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::service::Routes;
use tonic::service::interceptor::InterceptedService;

use nexus_proto::FILE_DESCRIPTOR_SET;
use nexus_proto::agent::v1::agent_service_server::AgentServiceServer;
use nexus_proto::runner::v1::runner_service_server::RunnerServiceServer;

use crate::actors::fabric::{EventBus, Fabric, FrozenDeclarations};
use crate::actors::root::{RootActor, RootArgs, RootHandle};
use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::doors::api::Api;
use crate::doors::tls::Acceptor;
pub use crate::doors::tls::install_crypto_provider;
use crate::model::ModelRegistry;
use crate::store::Store;

/// The largest answer of the client API, in bytes (4 MiB): the default message size every gRPC
/// client decodes, so a stock client reads every reply. What one reply carries is bounded to fit
/// (`docs/executions.md`, "Reply bounds"): an execution's final text (1 MiB) and a page of its
/// tasks (2 MiB), or one event (a `round_result`'s text and at most 32 calls' inputs).
pub const AGENT_REPLY_BOUND: usize = 4 * 1024 * 1024;

/// The listen backlog of [`listen`]: connections the kernel completes before nexus accepts them.
/// Linux caps it at `net.core.somaxconn` (4096 by default). A flood of connections fills a short
/// backlog while nexus is descheduled for a few milliseconds, and every connection attempt the
/// kernel then drops waits a second for its SYN to be sent again, runners' and members' alike.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds the doors' listener on `addr` with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, so that a
/// restarted nexus binds beside its predecessor's closing connections).
///
/// # Errors
/// When the address cannot be bound (in use, not local, not permitted).
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Why the server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The store could not be opened or migrated.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The provider table is invalid.
    #[error(transparent)]
    Models(#[from] model::ConfigError),
    /// An actor could not be spawned.
    #[error("actor start-up failed: {0}")]
    Actor(String),
    /// The transport failed.
    #[error("transport: {0}")]
    Transport(String),
    /// A TLS file or setting cannot be used.
    #[error(transparent)]
    Tls(#[from] doors::tls::TlsError),
    /// The listener has no local address.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    /// Another node serves the same data dir (or SQLite store), or the PostgreSQL serve lease
    /// cannot be taken (`store::lock`, `store::lease`).
    #[error(transparent)]
    StoreInUse(#[from] store::LockError),
    /// The serve lease was lost while serving (another node took the work over, or the
    /// database could not be reached for a whole term): the node stopped rather than drive work
    /// it no longer owns (`store::lease`). Started again, it waits as a standby.
    #[error(
        "lost the serve lease ({0}); stopped serving so that no two nodes drive the same work: start nexus again (it waits as a standby while another node serves)"
    )]
    StoreLockLost(String),
    /// The node was stopped while it waited as a standby ([`serve`]'s shutdown): it served
    /// nothing.
    #[error("stopped while a standby")]
    StoppedAsStandby,
}

/// A server running in this process.
#[derive(Debug)]
pub struct RunningServer {
    /// The bound address.
    pub addr: SocketAddr,
    /// The shared API (the same one the doors use).
    pub api: Arc<Api>,
    /// Whether the port speaks TLS.
    pub tls: bool,
    /// The port's open connections under their rules (`[connections]`).
    pub sockets: Arc<doors::sockets::Sockets>,
    shutdown: Option<oneshot::Sender<()>>,
    transport: JoinHandle<Result<(), tonic::transport::Error>>,
    /// Held for the server's life: one node per store.
    lock: store::ServeLock,
}

impl RunningServer {
    /// The base URL, e.g. `http://127.0.0.1:7740`, or `https://...` when TLS is on.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Resolves when the server lost its database lock (PostgreSQL only), with why: by then it
    /// has stopped its actors and stopped accepting; [`RunningServer::shutdown`] finishes.
    pub fn lock_lost(&self) -> impl Future<Output = String> + Send + 'static {
        self.lock.lost()
    }

    /// Stops accepting, drains the transport, stops every actor, then releases the store's
    /// locks (a node started next takes them at once).
    ///
    /// # Errors
    /// [`ServeError::Transport`] when the transport ended with an error.
    pub async fn shutdown(mut self) -> Result<(), ServeError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        // Long-lived runner streams would hold the drain open: close them (runners reconnect to
        // the next server and are offered their inbox again), then let the rest drain.
        self.api.fabric.closing.send_replace(true);
        // Under a serve lease (PostgreSQL), the work is handed over first: the actors stop and
        // the lease is given up, so a standby takes over at its next poll instead of after the
        // drain. A write still in flight then is refused by the fence, never committed twice
        // (`docs/cluster.md`, "Rolling restarts").
        if self.lock.generation().is_some() {
            self.api.root.stop();
            self.lock.release().await;
        }
        let transport = tokio::time::timeout(Duration::from_secs(10), &mut self.transport).await;
        self.api.root.stop();
        let ended = match transport {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(ServeError::Transport(e.to_string())),
            Ok(Err(e)) => Err(ServeError::Transport(e.to_string())),
            Err(_) => {
                self.transport.abort();
                Ok(())
            }
        };
        self.lock.release().await;
        ended
    }
}

impl RunningServer {
    /// Stops at once, without a drain: for a node that lost its serve lease, whose every write
    /// is refused and whose doors can answer nothing true. Runner streams and requests are cut,
    /// so runners and clients move to the node that took over.
    pub fn abandon(self) {
        self.api.fabric.closing.send_replace(true);
        self.api.root.stop();
        self.transport.abort();
    }
}

/// Opens the store, starts the actors, serves gRPC and HTTP on `listener` until
/// [`RunningServer::shutdown`], and recovers live work beside the doors (see `recover`).
///
/// # Errors
/// [`ServeError`] when the store, the provider table or the actors fail to start.
pub async fn start(listener: TcpListener, config: ServerConfig) -> Result<RunningServer, ServeError> {
    start_with_models(listener, config, None, Clock::system()).await
}

/// [`start`] with a prepared model registry (the quickstart installs its script this way) and the
/// clock every deadline, hold and timestamp reads (tests pass one they move; a restarted test
/// server passes its predecessor's, so stored times never run backwards).
///
/// # Errors
/// As [`start`].
pub async fn start_with_models(
    listener: TcpListener,
    config: ServerConfig,
    models: Option<ModelRegistry>,
    clock: Clock,
) -> Result<RunningServer, ServeError> {
    start_stoppable(listener, config, models, clock, None).await
}

/// [`start_with_models`], stopped while it waits as a standby once `stop` turns `true`: the
/// standby's doors cut what they forward (each client told why) and drain, and the answer is
/// [`ServeError::StoppedAsStandby`].
async fn start_stoppable(
    listener: TcpListener,
    config: ServerConfig,
    models: Option<ModelRegistry>,
    clock: Clock,
    stop: Option<tokio::sync::watch::Receiver<bool>>,
) -> Result<RunningServer, ServeError> {
    install_crypto_provider();
    // Bad TLS files fail before the store is touched.
    let acceptor = Acceptor::from_config(&config.tls)?;
    let addr = listener.local_addr()?;
    let listener = Arc::new(listener);
    // Before the store is opened: a refused node changes nothing, not even the schema.
    let mut lock = store::ServeLock::acquire(&config.data_dir, addr)?;
    let store = Store::connect(&config.data_dir, &config.store).await?.with_clock(clock.clone());
    let advertised = config.cluster.advertise_address.clone().unwrap_or_else(|| addr.to_string());
    if config.store.database_url.is_some() && doors::forward::names_no_host(&advertised) {
        tracing::warn!(
            %advertised,
            "this node advertises an address with no host: the other nodes cannot forward requests to it while it \
             serves (docs/cluster.md, \"Any node answers\"); set [cluster] advertise_address (--advertise-address) \
             to the address they reach it at"
        );
    }
    let node = store::lease::NodeIdentity::of(&config.data_dir, advertised)?
        .with_settings(config.cluster.lease_ms, &config.providers);
    let mut forward_key = doors::forward::ForwardKey::default();
    if let Some(url) = &config.store.database_url {
        let lease = standby(&listener, acceptor.clone(), url, &config, node.clone(), stop).await?;
        tracing::info!(node = %lease.holder, generation = lease.generation, "holding the serve lease");
        store.fence_with(lease.fence());
        // Over TLS nothing is forwarded (`doors::forward`), so no forwarded request is taken.
        if acceptor.is_none() {
            forward_key = doors::forward::ForwardKey(Some(lease.forward_key.as_str().into()));
        }
        lock.hold(lease);
    }
    let models = match models {
        Some(models) => models,
        None => ModelRegistry::new(config.providers.clone(), |name| std::env::var(name).ok())?,
    };
    let fabric = Arc::new(Fabric {
        store,
        clock,
        config,
        models,
        events: EventBus::default(),
        connections: Default::default(),
        closing: tokio::sync::watch::channel(false).0,
        declarations: FrozenDeclarations::default(),
        node,
        metrics: metrics::Metrics::default(),
    });
    let registry = Arc::new(actors::root::Registry::default());
    let (root_ref, _) =
        ractor::Actor::spawn(None, RootActor, RootArgs { fabric: fabric.clone(), registry: registry.clone() })
            .await
            .map_err(|e| ServeError::Actor(e.to_string()))?;
    let root = RootHandle::new(root_ref, registry, fabric.config.actors.call_timeout());
    // Recovery runs beside the doors: a runner's inbox and an execution load from the store on
    // first use anyway, so a reconnecting runner's claims are taken at once while the other park
    // clocks and executions resume in the background.
    tokio::spawn({
        let (fabric, root) = (fabric.clone(), root.clone());
        async move {
            let started = tokio::time::Instant::now();
            match recover(&fabric, &root).await {
                Ok(()) => tracing::info!(elapsed_ms = started.elapsed().as_millis(), "recovery done"),
                Err(e) => tracing::error!(error = %e, "recovery stopped; the rest loads on first use"),
            }
        }
    });
    let api = Arc::new(Api::new(fabric.clone(), root));

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<RunnerServiceServer<doors::grpc::RunnerGrpc>>().await;
    health_reporter.set_serving::<AgentServiceServer<doors::grpc::AgentGrpc>>().await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServeError::Transport(e.to_string()))?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| ServeError::Transport(e.to_string()))?;
    let max_frame = fabric.config.runner.max_frame_bytes;
    // An oversize frame ends the stream with `content_too_large` (`actors::connection`); the
    // Hello's answer is a frame, so `Worded` is not needed here.
    let runner_service = RunnerServiceServer::new(doors::grpc::RunnerGrpc::new(api.clone()))
        .max_decoding_message_size(max_frame)
        .max_encoding_message_size(max_frame);
    let routes = Routes::from(doors::http::router(api.clone()).merge(doors::console::router()));
    let routes = if acceptor.as_ref().is_some_and(|acceptor| acceptor.gate_runner_stream) {
        routes.add_service(InterceptedService::new(runner_service, doors::tls::require_client_certificate))
    } else {
        routes.add_service(runner_service)
    };
    let sockets = doors::sockets::Sockets::from_config(&fabric.config.connections);
    let routes = routes
        .add_service(
            // A request message has the HTTP body's bound (one bound per door kind), refused with
            // its word (`Worded`); every reply fits a stock client's decoding limit.
            doors::grpc::Worded::new(
                AgentServiceServer::new(doors::grpc::AgentGrpc::new(api.clone()))
                    .max_decoding_message_size(doors::http::BODY_LIMIT)
                    .max_encoding_message_size(AGENT_REPLY_BOUND),
            ),
        )
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
    // Outermost, so that every door (gRPC, HTTP, health, reflection, the fallback) counts its
    // requests on their connection; inside it, a request a standby forwarded takes the address
    // of the client that sent it (`doors::forward::admit`).
    let routes = Routes::from(
        routes
            .into_axum_router()
            .layer(axum::middleware::from_fn_with_state(fabric.metrics.clone(), metrics::count_answers))
            .layer(axum::middleware::from_fn_with_state(forward_key, doors::forward::admit))
            .layer(axum::middleware::from_fn_with_state(sockets.clone(), doors::sockets::track)),
    );

    let runner = &fabric.config.runner;
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let lock_lost = lock.lost();
    let stop_accepting = {
        let (root, fabric) = (api.root.clone(), fabric.clone());
        async move {
            tokio::select! {
                _ = shutdown_rx => {}
                reason = lock_lost => {
                    // Another node may own the work now: stop driving it first, then accepting.
                    tracing::error!(reason, "lost the serve lease; stopping");
                    root.stop();
                    fabric.closing.send_replace(true);
                }
            }
        }
    };
    let router = tonic::transport::Server::builder()
        .accept_http1(true)
        .http2_keepalive_interval(Some(Duration::from_millis(runner.http2_keepalive_interval_ms)))
        .http2_keepalive_timeout(Some(Duration::from_millis(runner.http2_keepalive_timeout_ms)))
        .add_routes(routes);
    // serve_with_incoming ignores the builder's TCP_NODELAY: both accept paths set it on every
    // accepted socket, the TLS one before its handshake.
    let tls = acceptor.is_some();
    let transport = tokio::spawn(serve_on(router, listener, acceptor, sockets.clone(), stop_accepting));
    tracing::info!(
        %addr,
        tls,
        max_connections = sockets.cap(),
        data_dir = %fabric.config.data_dir.display(),
        store = fabric.store.backend().as_str(),
        "nexus serving gRPC and HTTP"
    );
    Ok(RunningServer { addr, api, tls, sockets, shutdown: Some(shutdown_tx), transport, lock })
}

/// Waits as a standby until this node holds the serve lease of the PostgreSQL store at `url`
/// (`store::lease`). Meanwhile the port passes every request on to the node that serves, or
/// refuses it with `unavailable` naming that node when it cannot (`doors::standby`), so a
/// runner-agent or a client may be given any node's address. Once the lease is held, those doors stop
/// accepting and finish what they were answering (at most [`STANDBY_DOORS_DRAIN`]) before the
/// serving doors take the port.
async fn standby(
    listener: &Arc<TcpListener>,
    acceptor: Option<Acceptor>,
    url: &str,
    config: &ServerConfig,
    identity: store::lease::NodeIdentity,
    mut stop: Option<tokio::sync::watch::Receiver<bool>>,
) -> Result<store::lease::Lease, ServeError> {
    let node = identity.node_id.clone();
    let this_node = identity.node_id.clone();
    let (holder_tx, holder_rx) = tokio::sync::watch::channel(None);
    let acquire = store::lease::Lease::acquire(
        url,
        identity,
        config.cluster.lease(),
        config.store.acquire_timeout(),
        move |holder| {
            // Before the log line: whoever waits for it finds the doors naming the holder.
            holder_tx.send_replace(Some(doors::standby::Holder {
                node_id: holder.node_id.clone(),
                address: holder.address.clone(),
                forward_key: holder.forward_key.clone(),
            }));
            if holder.node_id == node {
                tracing::warn!(
                    %node,
                    lapses_in_ms = holder.remaining_ms,
                    "standby: the serve lease names this node's own id: either this node stopped without giving it \
                     up (it lapses within a term) or another process serves with a copy of this data dir (its \
                     node-id); give every node a data dir of its own"
                );
                return;
            }
            tracing::info!(
                %node,
                holder = %holder.node_id,
                holder_address = holder.address.as_deref().unwrap_or("unknown"),
                lapses_in_ms = holder.remaining_ms,
                "standby: another node holds the serve lease; this node takes over when it lapses"
            );
        },
    );
    // The same HTTP/2 keep-alive as the serving doors: a runner whose stream a standby carries
    // is found gone as soon.
    let keepalive_interval = Duration::from_millis(config.runner.http2_keepalive_interval_ms);
    let keepalive_timeout = Duration::from_millis(config.runner.http2_keepalive_timeout_ms);
    // Over TLS a standby refuses instead (`doors::forward`).
    let forwarder = acceptor.is_none().then(|| {
        doors::forward::Forwarder::new(this_node.clone(), config.cluster.lease(), config.connections.idle_timeout() / 2)
    });
    let (closing_tx, closing_rx) = tokio::sync::watch::channel(None);
    let routes = doors::standby::routes(this_node.clone(), holder_rx, forwarder, closing_rx).await;
    let sockets = doors::sockets::Sockets::from_config(&config.connections);
    // A forwarded runner stream or event stream is in flight for its whole life: counted, its
    // connection is not cut as idle.
    let routes = Routes::from(
        routes.into_axum_router().layer(axum::middleware::from_fn_with_state(sockets.clone(), doors::sockets::track)),
    );
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let stopped = async {
        let _ = stop_rx.await;
    };
    let router = tonic::transport::Server::builder()
        .accept_http1(true)
        .http2_keepalive_interval(Some(keepalive_interval))
        .http2_keepalive_timeout(Some(keepalive_timeout))
        .add_routes(routes);
    let doors = async {
        if let Err(error) = serve_on(router, listener.clone(), acceptor, sockets, stopped).await {
            tracing::warn!(%error, "the standby's doors stopped");
        }
    };
    let mut doors = std::pin::pin!(doors);
    let stopped = async {
        let asked = match stop.as_mut() {
            Some(stop) => stop.wait_for(|stop| *stop).await.is_ok(),
            None => false,
        };
        if !asked {
            std::future::pending::<()>().await;
        }
    };
    let lease = tokio::select! {
        lease = acquire => lease?,
        () = &mut doors => std::future::pending().await,
        () = stopped => {
            // Stopped as a standby: what it forwards is cut with a last word (an event stream's
            // `error` event, a gRPC status), so its clients follow again elsewhere.
            closing_tx.send_replace(Some(format!(
                "this node ({this_node}) is stopping: ask again on another node (a follow: from the last cursor you received)"
            )));
            let _ = stop_tx.send(());
            if tokio::time::timeout(STANDBY_DOORS_DRAIN, doors).await.is_err() {
                tracing::debug!("the standby's doors had connections open as it stopped; they are cut");
            }
            return Err(ServeError::StoppedAsStandby);
        }
    };
    // Taken: the standby's doors stop accepting at once, cut every request they forwarded, and
    // close their connections as they finish (a client kept alive there is told to go, and
    // comes back to the serving doors). Dropping the doors after their drain ends no connection
    // task, so the cut is what ends a forwarded runner stream or event stream.
    closing_tx.send_replace(Some(format!(
        "this node ({this_node}) took the serving over: ask again (a follow: from the last cursor you received)"
    )));
    let _ = stop_tx.send(());
    if tokio::time::timeout(STANDBY_DOORS_DRAIN, doors).await.is_err() {
        tracing::debug!("the standby's doors had connections open at the take-over; they are cut");
    }
    Ok(lease)
}

/// Serves `router` on `listener` until `shutdown` resolves: over TLS when `acceptor` is set,
/// plaintext otherwise, each socket under `sockets`' rules (`doors::accept`). The serving doors
/// and a standby's doors both start here.
async fn serve_on(
    router: tonic::transport::server::Router,
    listener: Arc<TcpListener>,
    acceptor: Option<Acceptor>,
    sockets: Arc<doors::sockets::Sockets>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    match acceptor {
        Some(acceptor) => router.serve_with_incoming_shutdown(acceptor.incoming(listener, sockets), shutdown).await,
        None => router.serve_with_incoming_shutdown(doors::accept::plaintext(listener, sockets), shutdown).await,
    }
}

/// The longest the standby's doors may take to finish after this node took the lease.
const STANDBY_DOORS_DRAIN: Duration = Duration::from_millis(500);

/// How long a node stopped before it serves may take to close (a standby's doors drain within
/// [`STANDBY_DOORS_DRAIN`]; a node past its standby wait finishes starting first).
const STANDBY_STOP_BOUND: Duration = Duration::from_secs(10);

/// Serves until `shutdown` resolves, then stops in order: stop accepting, drain, stop actors,
/// release the store's locks. Also stops, with [`ServeError::StoreLockLost`], when the database
/// lock's connection is lost.
///
/// # Errors
/// As [`start`] and [`RunningServer::shutdown`]; [`ServeError::StoreInUse`] when another node
/// serves the store.
pub async fn serve(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let mut shutdown = std::pin::pin!(shutdown);
    // A standby waits inside `start`: a shutdown closes its doors (cutting what they forward with
    // a last word to each client) and ends it, having served nothing.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let starting = start_stoppable(listener, config, None, Clock::system(), Some(stop_rx));
    let mut starting = std::pin::pin!(starting);
    let server = tokio::select! {
        server = &mut starting => server?,
        () = &mut shutdown => {
            stop_tx.send_replace(true);
            match tokio::time::timeout(STANDBY_STOP_BOUND, starting).await {
                Ok(Err(ServeError::StoppedAsStandby)) | Err(_) => {
                    tracing::info!("shut down while a standby");
                    return Ok(());
                }
                // It was past waiting (opening the store, recovering): stop it in order.
                Ok(Ok(server)) => {
                    tracing::info!("shutting down");
                    return server.shutdown().await;
                }
                Ok(Err(error)) => return Err(error),
            }
        }
    };
    let lost = tokio::select! {
        () = shutdown => None,
        reason = server.lock_lost() => Some(reason),
    };
    match lost {
        None => {
            tracing::info!("shutting down");
            server.shutdown().await
        }
        Some(reason) => {
            server.abandon();
            Err(ServeError::StoreLockLost(reason))
        }
    }
}

/// Brings back live work after a restart: each runner inbox with open tasks (their park clocks
/// resume), each execution that had not ended, and each scheduled input's delivery timer.
async fn recover(fabric: &Fabric, root: &RootHandle) -> Result<(), ServeError> {
    let closing = || *fabric.closing.borrow();
    for runner in fabric.store.executors_with_open_tasks().await? {
        if closing() {
            return Ok(());
        }
        if let Err(refusal) = root.load_executor(runner).await {
            tracing::error!(runner_id = %runner, code = %refusal.code, "could not recover a runner inbox");
        }
    }
    let executions = fabric.store.live_executions().await?;
    if !executions.is_empty() {
        tracing::info!(count = executions.len(), "recovering live executions");
    }
    for execution in executions {
        if closing() {
            return Ok(());
        }
        if let Err(refusal) = root.load_execution(execution).await {
            tracing::error!(execution_id = %execution, code = %refusal.code, "could not recover an execution");
        }
    }
    // A conversation whose execution ended without handing off (the node died in between) moves
    // on now: its waiting steers become turns and its next turn is woken
    // (`docs/executions.md`, "Conversations: one turn at a time").
    for conversation in fabric.store.conversations_with_waiting_steers().await? {
        if closing() {
            return Ok(());
        }
        actors::execution::queue::hand_off(fabric, root, conversation).await?;
    }
    // Every held input's delivery timer is armed again from the store; one whose time passed
    // while nexus was down is delivered now (`docs/executions.md`, "Scheduled inputs").
    let held = fabric.store.held_inputs().await?;
    if !held.is_empty() {
        tracing::info!(count = held.len(), "re-arming scheduled inputs");
    }
    for (input, deliver_at) in held {
        if closing() {
            return Ok(());
        }
        if let Err(error) = root.schedule_delivery(input, deliver_at) {
            tracing::error!(%input, %error, "could not re-arm a scheduled input");
        }
    }
    // A child's result nobody consumed, or an ended parent's children not disposed of (the node
    // died in between), is looked at again (`docs/delegation.md`, "Durability").
    actors::execution::delegation::reconcile_all(fabric, root).await?;
    Ok(())
}
