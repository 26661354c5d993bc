//! The ConnectionActor: one per live runner stream; transient.
//!
//! A reader task forwards inbound frames as messages (tonic gives the server no disconnect
//! event, so the reader's end is the disconnect). The first frame must be Hello: it is
//! authenticated on the executor-transport plane and the stream is attached to its
//! [`ExecutorActor`](crate::actors::executor::ExecutorActor), which fences any older stream. Later frames
//! go to the executor; Pong is handled here. Application Ping/Pong detects a half-open stream,
//! because proxies answer HTTP/2 pings themselves. A drop stops only this actor.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

use nexus_proto::runner::v1::{NexusFrame, Ping, RunnerFrame, nexus_frame, runner_frame::Frame};
use nexus_proto::{ErrorCode, Refusal};

use crate::actors::executor::{ExecutorMsg, Outbound, RunnerRequest};
use crate::actors::root::{Fabric, RootHandle};
use crate::auth::{Plane, authenticate};

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// The ConnectionActor's messages.
pub enum ConnectionMsg {
    /// A frame from the runner.
    Inbound(RunnerFrame),
    /// The inbound stream ended (cleanly or with an error).
    Closed(Option<String>),
    /// Ping timer.
    Tick,
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

/// The ConnectionActor's state.
pub struct ConnectionState {
    fabric: Arc<Fabric>,
    root: RootHandle,
    id: u64,
    outbound: Outbound,
    executor: Option<(Uuid, ActorRef<ExecutorMsg>)>,
    /// The epoch of the credential that said Hello.
    credential_epoch: i64,
    last_inbound: Instant,
    nonce: u64,
    reader: JoinHandle<()>,
    ticker: JoinHandle<()>,
}

/// The ConnectionActor.
pub struct ConnectionActor;

fn uuid_field(value: &str, field: &str) -> Result<Uuid, Refusal> {
    Uuid::parse_str(value).map_err(|_| Refusal::new(ErrorCode::ParameterMissing, format!("{field} must be a UUID")))
}

fn refuse(state: &ConnectionState, request_id: u64, refusal: &Refusal) {
    let http_status = refusal.error_code().map_or(500, ErrorCode::http_status);
    let frame = NexusFrame {
        request_id,
        frame: Some(nexus_frame::Frame::Refusal(nexus_proto::runner::v1::Refusal {
            code: refusal.code.clone(),
            message: refusal.message.clone(),
            http_status: u32::from(http_status),
        })),
    };
    let _ = state.outbound.try_send(Ok(frame));
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
            executor: None,
            credential_epoch: 0,
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
        if let Some((_, executor)) = &state.executor {
            let _ = executor.cast(ExecutorMsg::Detach { conn_id: state.id });
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
                inbound(&myself, state, frame).await;
            }
            ConnectionMsg::Closed(error) => {
                match error {
                    Some(error) => tracing::info!(conn = state.id, error = %error, "runner stream broke"),
                    None => tracing::debug!(conn = state.id, "runner stream ended"),
                }
                myself.stop(None);
            }
            ConnectionMsg::Tick => {
                if state.last_inbound.elapsed() > state.fabric.config.runner.liveness_timeout() {
                    tracing::warn!(conn = state.id, "no frame within the liveness bound; closing the stream as dead");
                    myself.stop(Some("liveness timeout".into()));
                    return Ok(());
                }
                if let Some((runner, executor)) = state.executor.clone() {
                    // Presence is refreshed each ping, and a re-pairing or revocation done by
                    // `nexus admin` in another process fences this stream within one interval.
                    let store = &state.fabric.store;
                    if let Err(e) = store.touch_executor(runner, crate::store::PresenceEvent::Seen).await {
                        tracing::debug!(error = %e, "could not record presence");
                    }
                    if let Ok(Some(row)) = store.executor(runner).await
                        && (row.credential_epoch != state.credential_epoch || row.status != "active")
                    {
                        tracing::info!(conn = state.id, runner_id = %runner, "stream fenced: the runner was paired again or revoked");
                        let _ = executor.cast(ExecutorMsg::Refresh);
                        myself.stop(Some("fenced".into()));
                        return Ok(());
                    }
                }
                state.nonce += 1;
                let ping =
                    NexusFrame { request_id: 0, frame: Some(nexus_frame::Frame::Ping(Ping { nonce: state.nonce })) };
                if state.outbound.try_send(Ok(ping)).is_err() {
                    myself.stop(Some("outbound closed".into()));
                }
            }
        }
        Ok(())
    }
}

async fn inbound(myself: &ActorRef<ConnectionMsg>, state: &mut ConnectionState, frame: RunnerFrame) {
    let request_id = frame.request_id;
    let Some(body) = frame.frame else {
        refuse(state, request_id, &Refusal::new(ErrorCode::ProtocolViolation, "an empty frame"));
        return;
    };
    let Some((_, executor)) = state.executor.clone() else {
        match body {
            Frame::Hello(hello) => {
                if let Err(refusal) = hello_frame(myself, state, request_id, hello).await {
                    tracing::info!(conn = state.id, code = %refusal.code, "hello refused");
                    refuse(state, request_id, &refusal);
                    myself.stop(Some("hello refused".into()));
                }
            }
            _ => {
                refuse(state, request_id, &Refusal::new(ErrorCode::ProtocolViolation, "the first frame must be hello"));
                myself.stop(Some("no hello".into()));
            }
        }
        return;
    };
    let request =
        match body {
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
            Frame::Claim(c) => uuid_field(&c.run_public_id, "run_public_id")
                .map(|run| RunnerRequest::Claim { run, task_key: c.task_key }),
            Frame::ClaimStatus(c) => uuid_field(&c.run_public_id, "run_public_id")
                .map(|run| RunnerRequest::ClaimStatus { run, task_key: c.task_key, claim_token: c.claim_token }),
            Frame::Extend(e) => uuid_field(&e.run_public_id, "run_public_id").map(|run| RunnerRequest::Extend {
                run,
                task_key: e.task_key,
                claim_token: e.claim_token,
                timeout_ms: e.timeout_ms,
            }),
            Frame::Commit(c) => uuid_field(&c.run_public_id, "run_public_id").map(|run| RunnerRequest::Commit {
                run,
                task_key: c.task_key,
                claim_token: c.claim_token,
                body_json: c.body_json,
            }),
            Frame::Progress(p) => uuid_field(&p.run_public_id, "run_public_id").map(|run| RunnerRequest::Progress {
                run,
                task_key: p.task_key,
                claim_token: p.claim_token,
                frame_json: p.frame_json,
            }),
        };
    match request {
        Ok(request) => {
            if executor.cast(ExecutorMsg::Request { conn_id: state.id, request_id, request }).is_err() {
                myself.stop(Some("executor gone".into()));
            }
        }
        Err(refusal) => refuse(state, request_id, &refusal),
    }
}

async fn hello_frame(
    myself: &ActorRef<ConnectionMsg>,
    state: &mut ConnectionState,
    request_id: u64,
    hello: nexus_proto::runner::v1::Hello,
) -> Result<(), Refusal> {
    let claimed_id = Uuid::parse_str(&hello.executor_public_id)
        .map_err(|_| Refusal::new(ErrorCode::Unauthorized, "executor_public_id must be the runner's UUID"))?;
    let (subject, epoch) = authenticate(&state.fabric.store, &hello.credential, Plane::ExecutorTransport).await?;
    if subject != claimed_id {
        return Err(Refusal::new(ErrorCode::Unauthorized, "this credential belongs to another runner"));
    }
    if hello.protocol_version != nexus_proto::RUNNER_PROTOCOL_VERSION {
        return Err(Refusal::new(
            ErrorCode::ProtocolViolation,
            format!("protocol_version {} is not spoken here; upgrade runner-agent", hello.protocol_version),
        ));
    }
    let executor = state.root.executor(subject).await?;
    let attached = ractor::call!(executor, |reply| ExecutorMsg::Attach {
        conn_id: state.id,
        hello_request_id: request_id,
        connection: myself.clone(),
        outbound: state.outbound.clone(),
        credential_epoch: epoch,
        reply,
    })
    .map_err(|_| Refusal::new(ErrorCode::Unavailable, "the runner's inbox is restarting; reconnect"))?;
    attached?;
    state.credential_epoch = epoch;
    state.executor = Some((subject, executor));
    Ok(())
}
