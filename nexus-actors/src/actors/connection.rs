//! The ConnectionActor: one per live runner stream; transient (`docs/architecture.md`,
//! "Actors"; `docs/protocol.md`, "Hello and Welcome").
//!
//! A reader task owns the inbound half (tonic gives the server no disconnect event, so the
//! reader's end is the disconnect). The first frame must be Hello: the reader hands it to this
//! actor, which authenticates it on the executor-transport plane and attaches the stream to its
//! [`ExecutorActor`](crate::actors::executor::ExecutorActor), fencing any older stream. That check
//! reads the store and may load a cold inbox, so it runs in a task this actor owns; frames that
//! arrive meanwhile wait in the reader, in order. Once attached, the reader decodes frames and
//! sends them straight to the executor (issue 10, item 3): every frame already read off the
//! socket goes in one message, and a `RunnerBatch` is answered as one `NexusBatch`
//! (`docs/protocol.md`, "Batches"). This actor keeps liveness and fencing only: application
//! Ping/Pong detects a half-open stream (proxies answer HTTP/2 pings themselves), and each ping
//! tick rereads the runner's row. A drop stops only this actor.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use nexus_proto::runner::v1::{Hello, NexusFrame, Ping, RunnerFrame, nexus_frame, runner_frame::Frame};
use nexus_proto::{ErrorCode, ExecutionId, ExecutorStatus, Refusal, RunnerId, TaskKey};

use crate::actors::executor::{
    Attach, ExecutorHandle, Outbound, Requests, RunnerRequest, TaskId, no_task, refusal_frame,
};
use crate::actors::fabric::Fabric;
use crate::actors::root::RootHandle;
use crate::auth::Plane;
use crate::auth::throttle::{CredentialThrottle, Source};
use crate::store::PresenceEvent;

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// Frames buffered towards one runner before the stream is dropped as too slow. Offers take at
/// most [`OFFER_WINDOW`](crate::actors::executor::OFFER_WINDOW) of them (checked at compile time), so the
/// rest is always free for answers, Welcome and `work_canceled`; only a runner that stops reading
/// its answers fills it.
pub const OUTBOUND_BUFFER: usize = 1024;
/// Frames a runner may send before its Hello is answered; more is a protocol violation.
pub const FRAMES_BEFORE_WELCOME_BOUND: usize = 1_024;
/// The most frames one `RunnerBatch` may hold (`docs/protocol.md`, "Batches"); every frame of a
/// longer batch is refused `protocol_violation`.
pub const BATCH_BOUND: usize = 256;
/// The reader stops gathering frames already read off the socket into one message to the
/// executor once it holds this many.
const FRAMES_PER_MESSAGE: usize = BATCH_BOUND;

/// The ConnectionActor's messages.
pub enum ConnectionMsg {
    /// The stream's first frame (it must be Hello).
    First(RunnerFrame),
    /// The inbound stream ended (cleanly or with an error).
    Closed(Option<String>),
    /// Ping timer.
    Tick,
    /// The Hello, checked in a task this actor owns: the runner and the credential's epoch it
    /// attached with, or why it was refused.
    HelloDone {
        /// The Hello's request id.
        request_id: u64,
        /// The attached runner and the credential's epoch, or the refusal.
        result: Result<(RunnerId, i64), Refusal>,
    },
}

/// The typed handle on one runner stream.
#[derive(Clone, Debug)]
pub struct ConnectionHandle {
    actor: ActorRef<ConnectionMsg>,
}

impl ConnectionHandle {
    /// Closes the stream (a newer stream fenced it, or its outbound buffer is full); the runner
    /// reconnects.
    pub fn close(&self, reason: &str) {
        self.actor.stop(Some(reason.to_owned()));
    }
}

/// Arguments: the two halves of the stream.
pub struct ConnectionArgs {
    /// Shared context.
    pub fabric: Arc<Fabric>,
    /// Root, to find the executor.
    pub root: RootHandle,
    /// Frames from the runner.
    pub inbound: tonic::Streaming<RunnerFrame>,
    /// Frames to the runner.
    pub outbound: Outbound,
    /// Called once when a Hello is accepted: the door marks the stream's connection
    /// authenticated, so that it is never shed for the connection cap (`docs/architecture.md`,
    /// "Doors under pressure"). `None` when the stream came from no socket.
    pub on_authenticated: Option<OnAuthenticated>,
    /// The failed-credential budgets the Hello's credential is checked through.
    pub credentials: Arc<CredentialThrottle>,
    /// The peer's source address, when the transport knows it.
    pub source: Option<Source>,
}

/// What [`ConnectionArgs::on_authenticated`] runs.
pub type OnAuthenticated = Box<dyn FnOnce() + Send>;

/// Where an attached stream's frames go, handed to the reader once its Hello is through.
struct Route {
    executor: ExecutorHandle,
    conn_id: u64,
}

/// Where the stream stands with its Hello.
enum Standing {
    /// No Hello yet.
    Fresh,
    /// The Hello is being checked; the reader holds the frames that arrive meanwhile and waits
    /// for its route.
    Hello { task: JoinHandle<()> },
    /// Attached to the runner's inbox under the credential's epoch.
    Attached { executor: ExecutorHandle, credential_epoch: i64 },
}

/// The ConnectionActor's state.
pub struct ConnectionState {
    fabric: Arc<Fabric>,
    root: RootHandle,
    id: u64,
    outbound: Outbound,
    standing: Standing,
    /// The reader's route, sent once the Hello is through.
    route: Option<oneshot::Sender<Route>>,
    /// When the stream opened; [`ConnectionState::last_inbound`] counts from it.
    opened: Instant,
    /// Milliseconds after `opened` at which the reader last read a frame.
    last_inbound: Arc<AtomicU64>,
    nonce: u64,
    reader: JoinHandle<()>,
    ticker: JoinHandle<()>,
    on_authenticated: Option<OnAuthenticated>,
    credentials: Arc<CredentialThrottle>,
    source: Option<Source>,
}

/// The ConnectionActor.
pub struct ConnectionActor;

/// The task a frame names: its `run_public_id` must be a UUID (`parameter_missing`), and a task
/// key in none of the grammars names no task (`not_found`).
fn task_field(run: &str, task_key: &str) -> Result<TaskId, Refusal> {
    let run: ExecutionId =
        run.parse().map_err(|_| Refusal::new(ErrorCode::ParameterMissing, "run_public_id must be a UUID"))?;
    let task_key: TaskKey = task_key.parse().map_err(|_| no_task(run, &task_key))?;
    Ok((run, task_key))
}

fn refuse(outbound: &Outbound, request_id: u64, refusal: &Refusal) {
    let _ = outbound.try_send(Ok(refusal_frame(request_id, refusal)));
}

fn violation(message: &str) -> Refusal {
    Refusal::new(ErrorCode::ProtocolViolation, message)
}

impl Actor for ConnectionActor {
    type Msg = ConnectionMsg;
    type State = ConnectionState;
    type Arguments = ConnectionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ConnectionMsg>,
        args: ConnectionArgs,
    ) -> Result<ConnectionState, ActorProcessingErr> {
        let opened = Instant::now();
        let last_inbound = Arc::new(AtomicU64::new(0));
        let (route_tx, route_rx) = oneshot::channel();
        let reader = tokio::spawn(read(
            args.inbound,
            myself.clone(),
            route_rx,
            args.outbound.clone(),
            Seen { opened, at: last_inbound.clone() },
        ));
        let interval = args.fabric.config.runner.ping_interval();
        let ticker_target = myself.clone();
        let mut closing = args.fabric.closing.subscribe();
        let ticker = tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(Instant::now() + interval, interval);
            loop {
                tokio::select! {
                    _ = ticks.tick() => {
                        if ticker_target.cast(ConnectionMsg::Tick).is_err() {
                            return;
                        }
                    }
                    changed = closing.wait_for(|closing| *closing) => {
                        if changed.is_ok() {
                            ticker_target.stop(Some("server shutting down".into()));
                        }
                        return;
                    }
                }
            }
        });
        args.fabric.connections.fetch_add(1, Ordering::Relaxed);
        Ok(ConnectionState {
            fabric: args.fabric,
            root: args.root,
            id: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
            outbound: args.outbound,
            standing: Standing::Fresh,
            route: Some(route_tx),
            opened,
            last_inbound,
            nonce: 0,
            reader,
            ticker,
            on_authenticated: args.on_authenticated,
            credentials: args.credentials,
            source: args.source,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ConnectionMsg>,
        state: &mut ConnectionState,
    ) -> Result<(), ActorProcessingErr> {
        state.reader.abort();
        state.ticker.abort();
        state.fabric.connections.fetch_sub(1, Ordering::Relaxed);
        match &state.standing {
            Standing::Attached { executor, .. } => {
                let _ = executor.detach(state.id);
            }
            Standing::Hello { task, .. } => task.abort(),
            Standing::Fresh => {}
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ConnectionMsg>,
        msg: ConnectionMsg,
        state: &mut ConnectionState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ConnectionMsg::First(frame) => first(&myself, state, frame),
            ConnectionMsg::HelloDone { request_id, result } => hello_done(&myself, state, request_id, result),
            ConnectionMsg::Closed(error) => {
                match error {
                    Some(error) => tracing::info!(conn = state.id, error = %error, "runner stream broke"),
                    None => tracing::debug!(conn = state.id, "runner stream ended"),
                }
                myself.stop(None);
            }
            ConnectionMsg::Tick => tick(&myself, state).await,
        }
        Ok(())
    }
}

async fn tick(myself: &ActorRef<ConnectionMsg>, state: &mut ConnectionState) {
    let quiet_ms = u64::try_from(state.opened.elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .saturating_sub(state.last_inbound.load(Ordering::Relaxed));
    if quiet_ms > u64::try_from(state.fabric.config.runner.liveness_timeout().as_millis()).unwrap_or(u64::MAX) {
        tracing::warn!(conn = state.id, "no frame within the liveness bound; closing the stream as dead");
        myself.stop(Some("liveness timeout".into()));
        return;
    }
    if let Standing::Attached { executor, credential_epoch } = &state.standing {
        // Presence is refreshed each ping, and a re-pairing or revocation done by `nexus admin`
        // in another process fences this stream within one interval.
        let runner = executor.runner();
        let store = &state.fabric.store;
        if let Err(e) = store.touch_executor(runner, PresenceEvent::Seen).await {
            tracing::debug!(error = %e, "could not record presence");
        }
        if let Ok(Some(row)) = store.executor(runner).await
            && (row.credential_epoch != *credential_epoch || row.status != ExecutorStatus::Active)
        {
            tracing::info!(conn = state.id, runner_id = %runner, "stream fenced: the runner was paired again or revoked");
            let _ = executor.refresh();
            myself.stop(Some("fenced".into()));
            return;
        }
    }
    state.nonce += 1;
    let ping = NexusFrame { request_id: 0, frame: Some(nexus_frame::Frame::Ping(Ping { nonce: state.nonce })) };
    if state.outbound.try_send(Ok(ping)).is_err() {
        myself.stop(Some("outbound closed".into()));
    }
}

/// The stream's first frame: a Hello starts its check; anything else ends the stream.
fn first(myself: &ActorRef<ConnectionMsg>, state: &mut ConnectionState, frame: RunnerFrame) {
    let request_id = frame.request_id;
    match (&state.standing, frame.frame) {
        (Standing::Fresh, Some(Frame::Hello(hello))) => start_hello(myself, state, request_id, hello),
        (Standing::Fresh, Some(_)) => {
            refuse(&state.outbound, request_id, &violation("the first frame must be hello"));
            myself.stop(Some("no hello".into()));
        }
        (Standing::Fresh, None) => {
            refuse(&state.outbound, request_id, &violation("an empty frame; the first frame must be hello"));
            myself.stop(Some("no hello".into()));
        }
        // The reader hands over one first frame; a second is a bug, never acted on.
        _ => tracing::warn!(conn = state.id, "a second first frame; ignored"),
    }
}

/// Checks a Hello in a task this actor owns: authenticate, then attach to the runner's inbox
/// (loading it when cold). The answer comes back as [`ConnectionMsg::HelloDone`].
fn start_hello(myself: &ActorRef<ConnectionMsg>, state: &mut ConnectionState, request_id: u64, hello: Hello) {
    let (fabric, root, outbound, conn_id) =
        (state.fabric.clone(), state.root.clone(), state.outbound.clone(), state.id);
    let (credentials, source) = (state.credentials.clone(), state.source);
    let connection = ConnectionHandle { actor: myself.clone() };
    let actor = myself.clone();
    let task = tokio::spawn(tracing::Instrument::instrument(
        async move {
            let presented = Presented { hello, throttle: credentials.as_ref(), source };
            let result = check_hello(&fabric, &root, conn_id, request_id, presented, connection, outbound).await;
            let _ = actor.cast(ConnectionMsg::HelloDone { request_id, result });
        },
        tracing::info_span!("hello", conn = conn_id),
    ));
    state.standing = Standing::Hello { task };
}

/// A Hello as it was presented: the frame, and the failed-credential budget of its source.
struct Presented<'a> {
    hello: Hello,
    throttle: &'a CredentialThrottle,
    source: Option<Source>,
}

async fn check_hello(
    fabric: &Fabric,
    root: &RootHandle,
    conn_id: u64,
    request_id: u64,
    Presented { hello, throttle, source }: Presented<'_>,
    connection: ConnectionHandle,
    outbound: Outbound,
) -> Result<(RunnerId, i64), Refusal> {
    let claimed: RunnerId = hello
        .executor_public_id
        .parse()
        .map_err(|_| Refusal::new(ErrorCode::Unauthorized, "executor_public_id must be the runner's UUID"))?;
    let (subject, credential_epoch) =
        fabric.store.authenticate_from(&hello.credential, Plane::ExecutorTransport, throttle, source).await?;
    if subject != claimed.uuid() {
        // Answered as an unknown token: a runner's token never confirms another runner's id.
        return Err(crate::auth::not_accepted(Plane::ExecutorTransport));
    }
    if hello.protocol_version != nexus_proto::RUNNER_PROTOCOL_VERSION {
        return Err(Refusal::new(
            ErrorCode::ProtocolViolation,
            format!("protocol_version {} is not spoken here; upgrade runner-agent", hello.protocol_version),
        ));
    }
    let attach = Attach {
        conn_id,
        hello_request_id: request_id,
        connection,
        outbound,
        credential_epoch,
        batches: hello.batches,
    };
    root.executor(claimed).attach(attach).await?;
    Ok((claimed, credential_epoch))
}

fn hello_done(
    myself: &ActorRef<ConnectionMsg>,
    state: &mut ConnectionState,
    request_id: u64,
    result: Result<(RunnerId, i64), Refusal>,
) {
    if !matches!(state.standing, Standing::Hello { .. }) {
        return;
    }
    let (runner, credential_epoch) = match result {
        Ok(attached) => attached,
        Err(refusal) => {
            tracing::info!(conn = state.id, code = %refusal.code, "hello refused");
            refuse(&state.outbound, request_id, &refusal);
            myself.stop(Some("hello refused".into()));
            return;
        }
    };
    if let Some(authenticated) = state.on_authenticated.take() {
        authenticated();
    }
    let executor = state.root.executor(runner);
    state.standing = Standing::Attached { executor: executor.clone(), credential_epoch };
    let route = Route { executor, conn_id: state.id };
    if state.route.take().is_none_or(|reader| reader.send(route).is_err()) {
        // The reader is gone: the stream ended while the Hello was checked.
        myself.stop(Some("stream ended during hello".into()));
    }
}

/// When the reader last read a frame, for the liveness check.
struct Seen {
    opened: Instant,
    at: Arc<AtomicU64>,
}

impl Seen {
    fn now(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.at.store(ms, Ordering::Relaxed);
    }
}

type Read = Result<Option<RunnerFrame>, tonic::Status>;

/// The inbound stream ended with `end`. A frame over the stream's bound (tonic refuses it before
/// we see it) ends the stream with a status that carries `content_too_large`, as every oversize
/// message on a gRPC door does (`docs/protocol.md`, "Refusals"), never with a bare OK.
fn closed(actor: &ActorRef<ConnectionMsg>, outbound: &Outbound, end: Read) {
    let error = match end {
        Err(status) => {
            if status.code() == tonic::Code::OutOfRange {
                let refusal = Refusal::new(
                    ErrorCode::ContentTooLarge,
                    format!(
                        "a frame is over this stream's bound ({}); send smaller frames ([runner] max_frame_bytes)",
                        status.message()
                    ),
                );
                let _ = outbound.try_send(Err(refusal.to_status()));
            }
            Some(status.message().to_owned())
        }
        Ok(_) => None,
    };
    let _ = actor.cast(ConnectionMsg::Closed(error));
}

/// The reader: the first frame to the actor; after a Hello, the frames that arrive wait here
/// until the Hello is through; then every frame goes straight to the executor, gathered with
/// the frames already read off the socket into one message.
async fn read(
    mut inbound: tonic::Streaming<RunnerFrame>,
    actor: ActorRef<ConnectionMsg>,
    mut route: oneshot::Receiver<Route>,
    outbound: Outbound,
    seen: Seen,
) {
    let first = match inbound.message().await {
        Ok(Some(frame)) => frame,
        end => return closed(&actor, &outbound, end),
    };
    seen.now();
    let hello = matches!(first.frame, Some(Frame::Hello(_)));
    if actor.cast(ConnectionMsg::First(first)).is_err() || !hello {
        return;
    }
    let mut pending: Vec<RunnerFrame> = Vec::new();
    let route = loop {
        tokio::select! {
            biased;
            answer = &mut route => match answer {
                Ok(route) => break route,
                // Refused: the actor stops, and this task with it.
                Err(_) => return,
            },
            read = inbound.message() => match read {
                Ok(Some(frame)) => {
                    seen.now();
                    if pending.len() >= FRAMES_BEFORE_WELCOME_BOUND {
                        let refusal = Refusal::new(
                            ErrorCode::ProtocolViolation,
                            format!("more than {FRAMES_BEFORE_WELCOME_BOUND} frames before welcome; wait for welcome"),
                        );
                        refuse(&outbound, frame.request_id, &refusal);
                        actor.stop(Some("too many frames before welcome".into()));
                        return;
                    }
                    pending.push(frame);
                }
                end => return closed(&actor, &outbound, end),
            },
        }
    };
    let mut end = None;
    loop {
        if pending.is_empty() {
            match inbound.message().await {
                Ok(Some(frame)) => pending.push(frame),
                other => return closed(&actor, &outbound, other),
            }
        }
        // Frames already read off the socket join this message; reading them never waits.
        while pending.len() < FRAMES_PER_MESSAGE {
            match inbound.message().now_or_never() {
                Some(Ok(Some(frame))) => pending.push(frame),
                Some(other) => {
                    end = Some(other);
                    break;
                }
                None => break,
            }
        }
        seen.now();
        let (requests, batched) = decode(std::mem::take(&mut pending));
        if !requests.is_empty() && route.executor.requests(route.conn_id, requests, batched).is_err() {
            actor.stop(Some("executor gone".into()));
            return;
        }
        if let Some(end) = end.take() {
            return closed(&actor, &outbound, end);
        }
    }
}

/// The requests `frames` carry, in order, each with the request id its answer repeats (a frame
/// refused here keeps its place as its refusal); and whether any came in a `RunnerBatch`, whose
/// answers then go back in one `NexusBatch`.
pub(crate) fn decode(frames: Vec<RunnerFrame>) -> (Requests, bool) {
    let mut requests = Vec::with_capacity(frames.len());
    let mut batched = false;
    for frame in frames {
        match frame.frame {
            Some(Frame::Batch(batch)) => {
                batched = true;
                if batch.frames.len() > BATCH_BOUND {
                    let refusal = Refusal::new(
                        ErrorCode::ProtocolViolation,
                        format!("a batch holds at most {BATCH_BOUND} frames; send fewer in each"),
                    );
                    requests.extend(batch.frames.iter().map(|inner| (inner.request_id, Err(refusal.clone()))));
                    continue;
                }
                for inner in batch.frames {
                    if let Some(request) = request_of(inner.frame, true) {
                        requests.push((inner.request_id, request));
                    }
                }
            }
            body => {
                if let Some(request) = request_of(body, false) {
                    requests.push((frame.request_id, request));
                }
            }
        }
    }
    (requests, batched)
}

/// The request one frame of an attached stream makes, its refusal, or `None` (a pong, which
/// only proves the stream alive).
fn request_of(body: Option<Frame>, in_batch: bool) -> Option<Result<RunnerRequest, Refusal>> {
    let Some(body) = body else { return Some(Err(violation("an empty frame"))) };
    Some(match body {
        Frame::Pong(_) => return None,
        Frame::Hello(_) if in_batch => Err(violation("hello is never batched; it is the stream's first frame")),
        Frame::Hello(_) => Err(violation("hello was already said on this stream")),
        Frame::Batch(_) => Err(violation("a batch never holds another batch")),
        Frame::Announce(_) if in_batch => Err(violation("announce is never batched; send it alone")),
        Frame::Announce(announce) => Ok(RunnerRequest::Announce(announce.body_json)),
        Frame::Claim(c) => task_field(&c.run_public_id, &c.task_key).map(|task| RunnerRequest::Claim { task }),
        Frame::ClaimStatus(c) => task_field(&c.run_public_id, &c.task_key)
            .map(|task| RunnerRequest::ClaimStatus { task, claim_token: c.claim_token }),
        Frame::Extend(e) => task_field(&e.run_public_id, &e.task_key).map(|task| RunnerRequest::Extend {
            task,
            claim_token: e.claim_token,
            timeout_ms: e.timeout_ms,
        }),
        Frame::Commit(c) => task_field(&c.run_public_id, &c.task_key).map(|task| RunnerRequest::Commit {
            task,
            claim_token: c.claim_token,
            body_json: c.body_json,
        }),
        // Progress names a live claim or nothing: a key of no task has none.
        Frame::Progress(p) => task_field(&p.run_public_id, &p.task_key)
            .map_err(|refusal| match refusal.code {
                ErrorCode::NotFound => Refusal::new(ErrorCode::NotClaimant, "no live claim on this task"),
                _ => refusal,
            })
            .map(|task| RunnerRequest::Progress { task, claim_token: p.claim_token, frame_json: p.frame_json }),
    })
}
