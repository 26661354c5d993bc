//! The ConnectionActor: one per live runner stream; transient (`docs/architecture.md`,
//! "Actors"; `docs/protocol.md`, "Hello and Welcome").
//!
//! A reader task forwards inbound frames as messages (tonic gives the server no disconnect
//! event, so the reader's end is the disconnect). The first frame must be Hello: it is
//! authenticated on the executor-transport plane and the stream is attached to its
//! [`ExecutorActor`](crate::actors::executor::ExecutorActor), which fences any older stream. That
//! check reads the store and may load a cold inbox, so it runs in a task this actor owns, and
//! frames that arrive meanwhile wait for it in order. Later frames go to the executor; Pong is
//! handled here. Application Ping/Pong detects a half-open stream, because proxies answer HTTP/2
//! pings themselves. A drop stops only this actor.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use nexus_proto::runner::v1::{Hello, NexusFrame, Ping, RunnerFrame, nexus_frame, runner_frame::Frame};
use nexus_proto::{ErrorCode, ExecutionId, ExecutorStatus, Refusal, RunnerId, TaskKey};

use crate::actors::executor::{Attach, ExecutorHandle, Outbound, RunnerRequest, TaskId, no_task, refusal_frame};
use crate::actors::fabric::Fabric;
use crate::actors::root::RootHandle;
use crate::auth::Plane;
use crate::store::PresenceEvent;

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// Frames buffered towards one runner before the stream is dropped as too slow. Offers take at
/// most [`OFFER_WINDOW`](crate::actors::executor::OFFER_WINDOW) of them (checked at compile time), so the
/// rest is always free for answers, Welcome and `work_canceled`; only a runner that stops reading
/// its answers fills it.
pub const OUTBOUND_BUFFER: usize = 1024;
/// Frames a runner may send before its Hello is answered; more is a protocol violation.
pub const FRAMES_BEFORE_WELCOME_BOUND: usize = 1_024;

/// The ConnectionActor's messages.
pub enum ConnectionMsg {
    /// A frame from the runner.
    Inbound(RunnerFrame),
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
}

/// Where the stream stands with its Hello.
enum Standing {
    /// No Hello yet.
    Fresh,
    /// The Hello is being checked; the frames that arrived since wait here, in order.
    Hello { task: JoinHandle<()>, waiting: Vec<RunnerFrame> },
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
    last_inbound: Instant,
    nonce: u64,
    reader: JoinHandle<()>,
    ticker: JoinHandle<()>,
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

fn refuse(state: &ConnectionState, request_id: u64, refusal: &Refusal) {
    let _ = state.outbound.try_send(Ok(refusal_frame(request_id, refusal)));
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
        let mut inbound = args.inbound;
        let reader_target = myself.clone();
        let reader = tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(frame)) => {
                        if reader_target.cast(ConnectionMsg::Inbound(frame)).is_err() {
                            return;
                        }
                    }
                    Ok(None) => {
                        let _ = reader_target.cast(ConnectionMsg::Closed(None));
                        return;
                    }
                    Err(status) => {
                        let _ = reader_target.cast(ConnectionMsg::Closed(Some(status.message().to_owned())));
                        return;
                    }
                }
            }
        });
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
            last_inbound: Instant::now(),
            nonce: 0,
            reader,
            ticker,
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
            ConnectionMsg::Inbound(frame) => {
                state.last_inbound = Instant::now();
                inbound(&myself, state, frame);
            }
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
    if state.last_inbound.elapsed() > state.fabric.config.runner.liveness_timeout() {
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

fn inbound(myself: &ActorRef<ConnectionMsg>, state: &mut ConnectionState, frame: RunnerFrame) {
    let request_id = frame.request_id;
    match &mut state.standing {
        Standing::Fresh => match frame.frame {
            Some(Frame::Hello(hello)) => start_hello(myself, state, request_id, hello),
            Some(_) => {
                refuse(state, request_id, &Refusal::new(ErrorCode::ProtocolViolation, "the first frame must be hello"));
                myself.stop(Some("no hello".into()));
            }
            None => refuse(state, request_id, &Refusal::new(ErrorCode::ProtocolViolation, "an empty frame")),
        },
        Standing::Hello { waiting, .. } => {
            if waiting.len() >= FRAMES_BEFORE_WELCOME_BOUND {
                let refusal = Refusal::new(
                    ErrorCode::ProtocolViolation,
                    format!("more than {FRAMES_BEFORE_WELCOME_BOUND} frames before welcome; wait for welcome"),
                );
                refuse(state, request_id, &refusal);
                myself.stop(Some("too many frames before welcome".into()));
                return;
            }
            waiting.push(frame);
        }
        Standing::Attached { executor, .. } => {
            let executor = executor.clone();
            forward(myself, state, &executor, frame);
        }
    }
}

/// Checks a Hello in a task this actor owns: authenticate, then attach to the runner's inbox
/// (loading it when cold). The answer comes back as [`ConnectionMsg::HelloDone`].
fn start_hello(myself: &ActorRef<ConnectionMsg>, state: &mut ConnectionState, request_id: u64, hello: Hello) {
    let (fabric, root, outbound, conn_id) =
        (state.fabric.clone(), state.root.clone(), state.outbound.clone(), state.id);
    let connection = ConnectionHandle { actor: myself.clone() };
    let actor = myself.clone();
    let task = tokio::spawn(tracing::Instrument::instrument(
        async move {
            let result = check_hello(&fabric, &root, conn_id, request_id, hello, connection, outbound).await;
            let _ = actor.cast(ConnectionMsg::HelloDone { request_id, result });
        },
        tracing::info_span!("hello", conn = conn_id),
    ));
    state.standing = Standing::Hello { task, waiting: Vec::new() };
}

async fn check_hello(
    fabric: &Fabric,
    root: &RootHandle,
    conn_id: u64,
    request_id: u64,
    hello: Hello,
    connection: ConnectionHandle,
    outbound: Outbound,
) -> Result<(RunnerId, i64), Refusal> {
    let claimed: RunnerId = hello
        .executor_public_id
        .parse()
        .map_err(|_| Refusal::new(ErrorCode::Unauthorized, "executor_public_id must be the runner's UUID"))?;
    let (subject, credential_epoch) = fabric.store.authenticate(&hello.credential, Plane::ExecutorTransport).await?;
    if subject != claimed.uuid() {
        return Err(Refusal::new(ErrorCode::Unauthorized, "this credential belongs to another runner"));
    }
    if hello.protocol_version != nexus_proto::RUNNER_PROTOCOL_VERSION {
        return Err(Refusal::new(
            ErrorCode::ProtocolViolation,
            format!("protocol_version {} is not spoken here; upgrade runner-agent", hello.protocol_version),
        ));
    }
    let attach = Attach { conn_id, hello_request_id: request_id, connection, outbound, credential_epoch };
    root.executor(claimed).attach(attach).await?;
    Ok((claimed, credential_epoch))
}

fn hello_done(
    myself: &ActorRef<ConnectionMsg>,
    state: &mut ConnectionState,
    request_id: u64,
    result: Result<(RunnerId, i64), Refusal>,
) {
    let waiting = match std::mem::replace(&mut state.standing, Standing::Fresh) {
        Standing::Hello { waiting, .. } => waiting,
        other => {
            state.standing = other;
            return;
        }
    };
    let (runner, credential_epoch) = match result {
        Ok(attached) => attached,
        Err(refusal) => {
            tracing::info!(conn = state.id, code = %refusal.code, "hello refused");
            refuse(state, request_id, &refusal);
            myself.stop(Some("hello refused".into()));
            return;
        }
    };
    let executor = state.root.executor(runner);
    state.standing = Standing::Attached { executor: executor.clone(), credential_epoch };
    for frame in waiting {
        forward(myself, state, &executor, frame);
    }
}

/// Hands a frame of an attached stream to its inbox, or answers it here.
fn forward(myself: &ActorRef<ConnectionMsg>, state: &ConnectionState, executor: &ExecutorHandle, frame: RunnerFrame) {
    let request_id = frame.request_id;
    let Some(body) = frame.frame else {
        refuse(state, request_id, &Refusal::new(ErrorCode::ProtocolViolation, "an empty frame"));
        return;
    };
    let request = match body {
        Frame::Pong(_) => return,
        Frame::Hello(_) => {
            refuse(
                state,
                request_id,
                &Refusal::new(ErrorCode::ProtocolViolation, "hello was already said on this stream"),
            );
            return;
        }
        Frame::Announce(announce) => Ok(RunnerRequest::Announce(announce.body_json)),
        // Batches (issue 10, item 4) have their frames in the contract but are not served yet.
        Frame::Batch(_) => Err(Refusal::new(ErrorCode::ProtocolViolation, "batches are not served yet")),
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
    };
    match request {
        Ok(request) => {
            if executor.request(state.id, request_id, request).is_err() {
                myself.stop(Some("executor gone".into()));
            }
        }
        Err(refusal) => refuse(state, request_id, &refusal),
    }
}
