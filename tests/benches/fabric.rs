//! The fabric's figures side by side from one run (issue 4, item 7): latency, throughput, memory
//! and recovery, and the bytes a save of a long execution writes early and late (issue 10, item
//! 2), each beside its target.
//!
//! A benchmark, not a test: it prints a table and which targets hold, and it never fails on a
//! target. `cargo test` does not run it; run it with `cargo bench -p nexus-tests --bench fabric`.
//!
//! Knobs (environment):
//! - `NEXUS_BENCH_POSTGRES_URL`: also measure throughput on PostgreSQL, in a fresh database made
//!   on that server (e.g. `postgres://root@127.0.0.1:5432/postgres`) and dropped afterwards; the
//!   same with two `nexus serve` standbys beside the serving node, with the runners on the serving
//!   node and spread over all three (a standby forwards their streams); and fail-over between two
//!   `nexus serve` processes (from a SIGKILL until the standby serves and a turn on it completes).
//! - `NEXUS_BENCH_SECONDS`: the timed throughput window per backend (default 5).
//! - `NEXUS_BENCH_RECOVERY_TASKS`: open tasks before the restart (default 100,000), spread over
//!   runners with `NEXUS_BENCH_RECOVERY_PER_RUNNER` each (default 500, one execution per runner).
//! - `NEXUS_BENCH_IDLE_RUNNERS` / `NEXUS_BENCH_IDLE_EXECUTIONS`: how many idle runners (default
//!   1,000) and idle executions (default 1,000) the memory figures divide by.
//!
//! Latency, bytes per save, throughput and recovery run in this one process: the server, its store, and the fake
//! runners (a lean state machine on the runner stream: claim on `work_available`, commit on the
//! grant, at most `slots` tasks in flight). The memory figures are read off a `nexus serve` child
//! process (its VmRSS before and after), so the clients' half of each connection is not counted;
//! build it first with `cargo build --release -p nexus-actors --bin nexus`.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use serde_json::{Value, json};
use sqlx::{Connection, Executor, PgConnection};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::transport::Endpoint;
use uuid::Uuid;

use nexus_actors::config::StoreConfig;
use nexus_actors::doors::api::{Caller, CreateInput};
use nexus_actors::store::{IoStats, SaveBytes, Store, TranscriptWrite};
use nexus_proto::runner::v1::runner_service_client::RunnerServiceClient;
use nexus_proto::runner::v1::runner_service_server::{RunnerService, RunnerServiceServer};
use nexus_proto::runner::v1::{
    Announce, Claim, Commit, Hello, NexusFrame, Ping, Pong, RunnerBatch, RunnerFrame, nexus_frame, runner_frame,
};
use nexus_tests::processes::{NexusProcess, StoreLocation, free_loopback_addr};
use nexus_tests::{Http, Minted, RawRunner, TestServer};

/// Sequential samples for each latency row.
const ECHO_SAMPLES: usize = 2_000;
const FSYNC_SAMPLES: usize = 2_000;
const FABRIC_SAMPLES: usize = 300;
const RUNNERS: usize = 64;
const SLOTS: usize = 8;
/// Tool calls each throughput execution fans out in its one tool round.
const FAN_OUT: usize = 8;
/// Calls admitted but not yet settled, per runner, that the throughput driver keeps.
const WINDOW: u64 = 32;
/// The most frames in one `RunnerBatch` (the protocol's bound).
const BATCH_BOUND: usize = 256;
/// Two-round turns (one call, then the final answer) each turn driver keeps in flight.
const TURNS_IN_FLIGHT: usize = 8;
/// Tool rounds of the long execution whose saves are measured, and the early round they are
/// compared with.
const LONG_ROUNDS: usize = 200;
const EARLY_ROUND: i64 = 10;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn noop_tool(timeout_ms: u64) -> Value {
    json!({"name": "noop", "description": "Does nothing.", "input_schema": {"type": "object"},
           "effect_profile": {"kind": "read_only", "destructive": false, "effect_scope": "closed",
                              "idempotency": "intrinsic", "reconciliation": "none"},
           "timeout_ms": timeout_ms})
}

fn fan_script(calls: usize) -> Value {
    let calls: Vec<Value> = (0..calls).map(|i| json!({"id": format!("c{i}"), "name": "noop"})).collect();
    json!({"rounds": [{"tool_calls": calls}, {"final": "done"}]})
}

/// `rounds` rounds of one `noop` call each, then a final answer. Each call's arguments name its
/// round, so no two rounds repeat (the repeat brake would stop a run of identical ones).
fn long_script(rounds: usize) -> Value {
    let mut all: Vec<Value> = (1..=rounds)
        .map(|round| json!({"tool_calls": [{"id": format!("c{round}"), "name": "noop", "arguments": {"step": round}}]}))
        .collect();
    all.push(json!({"final": "done"}));
    json!({"rounds": all})
}

fn scripts() -> Vec<(&'static str, Value)> {
    vec![("one", fan_script(1)), ("fan", fan_script(FAN_OUT)), ("long", long_script(LONG_ROUNDS))]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// `(p50, p99)` in microseconds.
fn p50_p99(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(percentile(&samples, 0.50)), us(percentile(&samples, 0.99)))
}

// ---- a raw tonic bidi echo ---------------------------------------------------------------------

struct Echo;

type EchoStream = Pin<Box<dyn Stream<Item = Result<NexusFrame, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl RunnerService for Echo {
    type ConnectStream = EchoStream;

    async fn connect(
        &self,
        request: tonic::Request<tonic::Streaming<RunnerFrame>>,
    ) -> Result<tonic::Response<EchoStream>, tonic::Status> {
        let inbound = request.into_inner();
        let outbound = inbound.map(|frame| {
            frame.map(|f| {
                let nonce = match f.frame {
                    Some(runner_frame::Frame::Pong(p)) => p.nonce,
                    _ => 0,
                };
                NexusFrame { request_id: f.request_id, frame: Some(nexus_frame::Frame::Ping(Ping { nonce })) }
            })
        });
        Ok(tonic::Response::new(Box::pin(outbound)))
    }
}

async fn echo_latency() -> Vec<Duration> {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = TcpListenerStream::new(listener).map(|socket| {
        if let Ok(socket) = &socket {
            let _ = socket.set_nodelay(true);
        }
        socket
    });
    let server = tokio::spawn(
        tonic::transport::Server::builder().add_service(RunnerServiceServer::new(Echo)).serve_with_incoming(incoming),
    );
    let channel = Endpoint::from_shared(format!("http://{addr}")).expect("url").connect().await.expect("connect");
    let mut client = RunnerServiceClient::new(channel);
    let (tx, rx) = mpsc::unbounded_channel();
    let mut inbound = client.connect(UnboundedReceiverStream::new(rx)).await.expect("stream").into_inner();
    let mut samples = Vec::with_capacity(ECHO_SAMPLES);
    for i in 0..(ECHO_SAMPLES + 200) {
        let nonce = i as u64;
        let started = Instant::now();
        let frame = RunnerFrame { request_id: nonce + 1, frame: Some(runner_frame::Frame::Pong(Pong { nonce })) };
        tx.send(frame).expect("send");
        let reply = inbound.message().await.expect("echo").expect("frame");
        assert_eq!(reply.request_id, nonce + 1);
        if i >= 200 {
            samples.push(started.elapsed());
        }
    }
    drop(tx);
    server.abort();
    samples
}

// ---- fdatasync of a 512 B append on the data disk ----------------------------------------------

fn fsync_latency(dir: &std::path::Path) -> Vec<Duration> {
    let path = dir.join("fsync-probe");
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("probe file");
    let block = [0x5a_u8; 512];
    let mut samples = Vec::with_capacity(FSYNC_SAMPLES);
    for i in 0..(FSYNC_SAMPLES + 50) {
        let started = Instant::now();
        file.write_all(&block).expect("append");
        file.sync_data().expect("fdatasync");
        if i >= 50 {
            samples.push(started.elapsed());
        }
    }
    let _ = std::fs::remove_file(path);
    samples
}

// ---- a lean fake runner ------------------------------------------------------------------------

/// Counters a [`FastRunner`] shares with the driver.
#[derive(Default)]
struct Counters {
    /// `work_available` pushes received.
    received: AtomicU64,
    /// Commits answered `committed` (settled and durable).
    settled: AtomicU64,
    /// Claims or commits refused.
    refused: AtomicU64,
    /// Push-to-committed times, when recording.
    latencies: Mutex<Vec<Duration>>,
    /// Signalled on each settle.
    notify: Notify,
}

/// A runner stream driven by a state machine in its reader task: claim on each push (at most
/// `slots` tasks in flight; with 0 slots it only counts pushes), commit on each grant. With
/// `batches` it says so in its Hello, unpacks `NexusBatch` frames, and sends every frame one
/// turn of its loop makes ready (each frame already read is handled first) in one
/// `RunnerBatch`, as runner-agent does; without, one frame per request.
struct FastRunner {
    counters: Arc<Counters>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for FastRunner {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

enum Stage {
    Claim { run: String, key: String, at: Instant },
    Commit { at: Instant },
}

impl FastRunner {
    async fn connect(url: &str, runner: &Minted, tool: &Value, slots: usize, record: bool) -> FastRunner {
        FastRunner::connect_with(url, runner, tool, slots, record, true).await
    }

    async fn connect_with(
        url: &str,
        runner: &Minted,
        tool: &Value,
        slots: usize,
        record: bool,
        batches: bool,
    ) -> FastRunner {
        let channel = Endpoint::from_shared(url.to_owned()).expect("url").connect().await.expect("connect");
        let mut client = RunnerServiceClient::new(channel);
        let (tx, rx) = mpsc::unbounded_channel();
        let hello = Hello {
            executor_public_id: runner.id.to_string(),
            credential: runner.token.clone(),
            protocol_version: nexus_proto::RUNNER_PROTOCOL_VERSION,
            batches,
        };
        tx.send(RunnerFrame { request_id: 1, frame: Some(runner_frame::Frame::Hello(hello)) }).expect("hello");
        let mut inbound = client.connect(UnboundedReceiverStream::new(rx)).await.expect("stream").into_inner();
        let welcome = inbound.message().await.expect("welcome").expect("frame");
        assert!(matches!(welcome.frame, Some(nexus_frame::Frame::Welcome(_))), "{welcome:?}");
        let announce = Announce { body_json: json!({"tools": [tool]}).to_string() };
        tx.send(RunnerFrame { request_id: 2, frame: Some(runner_frame::Frame::Announce(announce)) }).expect("announce");
        loop {
            let frame = inbound.message().await.expect("announced").expect("frame");
            if frame.request_id == 2 {
                assert!(matches!(frame.frame, Some(nexus_frame::Frame::Announced(_))), "{frame:?}");
                break;
            }
        }
        let counters = Arc::new(Counters::default());
        let shared = counters.clone();
        let reader = tokio::spawn(async move {
            let mut next_id = 3_u64;
            let mut queue: VecDeque<(String, String, Instant)> = VecDeque::new();
            let mut inflight: HashMap<u64, Stage> = HashMap::new();
            let mut out: Vec<RunnerFrame> = Vec::new();
            while let Ok(Some(frame)) = inbound.message().await {
                // Every frame already read is handled before anything is sent.
                let mut incoming = vec![frame];
                while let Some(Ok(Some(next))) = inbound.message().now_or_never() {
                    incoming.push(next);
                }
                let frames = incoming.into_iter().flat_map(|frame| match frame.frame {
                    Some(nexus_frame::Frame::Batch(batch)) => batch.frames,
                    _ => vec![frame],
                });
                for frame in frames {
                    let Some(body) = frame.frame else { continue };
                    match (frame.request_id, body) {
                        (0, nexus_frame::Frame::Ping(ping)) => {
                            let pong = runner_frame::Frame::Pong(Pong { nonce: ping.nonce });
                            out.push(RunnerFrame { request_id: 0, frame: Some(pong) });
                        }
                        (0, nexus_frame::Frame::WorkAvailable(work)) => {
                            shared.received.fetch_add(1, Ordering::Relaxed);
                            if slots > 0 {
                                queue.push_back((work.run_public_id, work.task_key, Instant::now()));
                            }
                        }
                        (0, _) => {}
                        (id, body) => match (inflight.remove(&id), body) {
                            (Some(Stage::Claim { run, key, at }), nexus_frame::Frame::ClaimGranted(grant)) => {
                                let commit = Commit {
                                    run_public_id: run,
                                    task_key: key,
                                    claim_token: grant.claim_token,
                                    body_json: r#"{"content":"ok"}"#.to_owned(),
                                };
                                let id = next_id;
                                next_id += 1;
                                inflight.insert(id, Stage::Commit { at });
                                out.push(RunnerFrame {
                                    request_id: id,
                                    frame: Some(runner_frame::Frame::Commit(commit)),
                                });
                            }
                            (Some(Stage::Commit { at }), nexus_frame::Frame::Committed(_)) => {
                                if record {
                                    shared.latencies.lock().expect("latencies").push(at.elapsed());
                                }
                                shared.settled.fetch_add(1, Ordering::Relaxed);
                                shared.notify.notify_one();
                            }
                            (Some(_), _) => {
                                shared.refused.fetch_add(1, Ordering::Relaxed);
                                shared.notify.notify_one();
                            }
                            (None, _) => {}
                        },
                    }
                }
                while inflight.len() < slots {
                    let Some((run, key, at)) = queue.pop_front() else { break };
                    let id = next_id;
                    next_id += 1;
                    let claim = Claim { run_public_id: run.clone(), task_key: key.clone() };
                    inflight.insert(id, Stage::Claim { run, key, at });
                    out.push(RunnerFrame { request_id: id, frame: Some(runner_frame::Frame::Claim(claim)) });
                }
                if batches && out.len() > 1 {
                    while !out.is_empty() {
                        let frames: Vec<RunnerFrame> = out.drain(..out.len().min(BATCH_BOUND)).collect();
                        let batch = runner_frame::Frame::Batch(RunnerBatch { frames });
                        let _ = tx.send(RunnerFrame { request_id: 0, frame: Some(batch) });
                    }
                } else {
                    for frame in out.drain(..) {
                        let _ = tx.send(frame);
                    }
                }
            }
        });
        FastRunner { counters, reader }
    }
}

/// An Agent whose profile names one runner and whose default model is `scripted/<model>`.
async fn agent_for(server: &TestServer, handle: &str, runner: Uuid, model: &str) -> Caller {
    let agent = server.agent(handle).await;
    let caller = server.caller(&agent).await;
    let body = json!({"configuration": {"runner_executor_public_ids": [runner], "approval_mode": "bypass",
                                         "default_model": format!("scripted/{model}")}});
    server.server.api.declare(&caller, body).await.expect("declared");
    caller
}

async fn admit(server: &TestServer, caller: &Caller) -> nexus_proto::ExecutionId {
    let input = CreateInput { text: "go".to_owned(), ..CreateInput::default() };
    server.server.api.create_input(caller, input).await.expect("admitted").execution_public_id
}

async fn wait_count(counter: &AtomicU64, notify: &Notify, target: u64, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while counter.load(Ordering::Relaxed) < target {
        if Instant::now() > deadline {
            return false;
        }
        let _ = tokio::time::timeout(Duration::from_millis(5), notify.notified()).await;
    }
    true
}

// ---- fabric latency ----------------------------------------------------------------------------

/// Dispatch-to-settled times of sequential one-call turns, and the store's writes and reads per
/// settled call (everything of the turn: admission, two model rounds, the call).
async fn fabric_latency(server: &TestServer) -> (Vec<Duration>, (f64, f64)) {
    let runner = server.runner("latency").await;
    let fast = FastRunner::connect(&server.url(), &runner, &noop_tool(60_000), 1, true).await;
    let caller = agent_for(server, "latency", runner.id, "one").await;
    let mut io_start = server.store().io_stats();
    for i in 0..(FABRIC_SAMPLES + 20) as u64 {
        if i == 20 {
            io_start = server.store().io_stats();
        }
        admit(server, &caller).await;
        assert!(
            wait_count(&fast.counters.settled, &fast.counters.notify, i + 1, Duration::from_secs(10)).await,
            "fabric latency: call {i} did not settle"
        );
    }
    // Let the last turn finish its final save before counting.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let io = per_call(io_start, server.store().io_stats(), FABRIC_SAMPLES as u64);
    let all = fast.counters.latencies.lock().expect("latencies").clone();
    (all[20..].to_vec(), io)
}

// ---- bytes per save ----------------------------------------------------------------------------

/// What the saves of one execution of [`LONG_ROUNDS`] tool rounds wrote at [`EARLY_ROUND`] and at
/// its last tool round, a [`FastRunner`] serving its calls; `None` when it did not complete.
async fn save_bytes(server: &TestServer) -> Option<(SaveBytes, SaveBytes)> {
    let runner = server.runner("long").await;
    let fast = FastRunner::connect(&server.url(), &runner, &noop_tool(60_000), 1, false).await;
    let caller = agent_for(server, "long", runner.id, "long").await;
    let run = admit(server, &caller).await;
    let settled =
        wait_count(&fast.counters.settled, &fast.counters.notify, LONG_ROUNDS as u64, Duration::from_secs(300)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let completed = loop {
        let row = server.store().execution(run).await.expect("execution").expect("row");
        if row.status.is_quiescent() || Instant::now() > deadline {
            break row.status == nexus_proto::RunStatus::Completed;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    if !(settled && completed) {
        eprintln!("bytes per save: the long execution did not complete");
        return None;
    }
    let store = server.store();
    Some((store.round_save_bytes(run, EARLY_ROUND)?, store.round_save_bytes(run, LONG_ROUNDS as i64)?))
}

// ---- throughput --------------------------------------------------------------------------------

/// One throughput window's figures.
#[derive(Clone, Copy)]
struct Throughput {
    /// Settled calls per second.
    rate: f64,
    /// Claims or commits refused during the run.
    refused: u64,
    /// Store writes per settled call in the window (everything: admission, model rounds, saves).
    writes: f64,
    /// Store reads per settled call in the window.
    reads: f64,
}

/// The store's writes and reads per settled call between two snapshots.
fn per_call(before: IoStats, after: IoStats, settled: u64) -> (f64, f64) {
    let settled = settled.max(1) as f64;
    ((after.writes - before.writes) as f64 / settled, (after.reads - before.reads) as f64 / settled)
}

/// Settled calls per second with [`RUNNERS`] runners of [`SLOTS`] slots (batching runners, or
/// one frame per request), refusals seen, and the store's traffic per call.
async fn throughput(server: &TestServer, seconds: u64, batches: bool) -> Throughput {
    throughput_through(server, seconds, batches, &[]).await
}

/// [`throughput`] with runner `i` connected to `nodes[i % nodes.len()]` (a standby passes its
/// stream on to `server`, `docs/cluster.md`, "Any node answers"); `server` itself when empty.
async fn throughput_through(server: &TestServer, seconds: u64, batches: bool, nodes: &[String]) -> Throughput {
    let own = [server.url()];
    let urls = if nodes.is_empty() { &own[..] } else { nodes };
    let tag = match (batches, nodes.is_empty()) {
        (true, true) => "tp",
        (false, true) => "tp1",
        (_, false) => "tpn",
    };
    let mut runners = Vec::with_capacity(RUNNERS);
    for i in 0..RUNNERS {
        let runner = server.runner(&format!("{tag}-{i}")).await;
        let url = &urls[i % urls.len()];
        let fast = FastRunner::connect_with(url, &runner, &noop_tool(60_000), SLOTS, false, batches).await;
        let caller = agent_for(server, &format!("{tag}-{i}"), runner.id, "fan").await;
        runners.push((fast, caller));
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let api_server: &TestServer = server;
    let drivers = runners.iter().map(|(fast, caller)| {
        let stop = stop.clone();
        async move {
            let mut admitted = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                let done =
                    fast.counters.settled.load(Ordering::Relaxed) + fast.counters.refused.load(Ordering::Relaxed);
                if admitted.saturating_sub(done) + FAN_OUT as u64 > WINDOW {
                    let _ = tokio::time::timeout(Duration::from_millis(5), fast.counters.notify.notified()).await;
                    continue;
                }
                admit(api_server, caller).await;
                admitted += FAN_OUT as u64;
            }
        }
    });
    let total = || runners.iter().map(|(f, _)| f.counters.settled.load(Ordering::Relaxed)).sum::<u64>();
    let timer = async {
        // One second of warm-up, then the timed window.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (start, io_start, at) = (total(), server.store().io_stats(), Instant::now());
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let (end, io_end, elapsed) = (total(), server.store().io_stats(), at.elapsed());
        stop.store(true, Ordering::Relaxed);
        let (writes, reads) = per_call(io_start, io_end, end - start);
        ((end - start) as f64 / elapsed.as_secs_f64(), writes, reads)
    };
    let ((rate, writes, reads), _) = tokio::join!(timer, futures::future::join_all(drivers));
    let refused = runners.iter().map(|(f, _)| f.counters.refused.load(Ordering::Relaxed)).sum();
    Throughput { rate, refused, writes, reads }
}

/// Two-round agent turns (one tool call, then the final answer) completed per second, admission
/// to `completed`: [`RUNNERS`] drivers, each with its own runner and [`TURNS_IN_FLIGHT`] turns in
/// flight.
async fn turns(server: &TestServer, seconds: u64) -> f64 {
    let url = server.url();
    let mut drivers = Vec::with_capacity(RUNNERS);
    for i in 0..RUNNERS {
        let runner = server.runner(&format!("turn-{i}")).await;
        let fast = FastRunner::connect(&url, &runner, &noop_tool(60_000), SLOTS, false).await;
        let caller = agent_for(server, &format!("turn-{i}"), runner.id, "one").await;
        drivers.push((fast, caller));
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let completed = Arc::new(AtomicU64::new(0));
    let api_server: &TestServer = server;
    let runs = drivers.iter().map(|(_, caller)| {
        let (stop, completed) = (stop.clone(), completed.clone());
        async move {
            let mut in_flight: Vec<nexus_proto::ExecutionId> = Vec::with_capacity(TURNS_IN_FLIGHT);
            while !stop.load(Ordering::Relaxed) {
                while in_flight.len() < TURNS_IN_FLIGHT {
                    in_flight.push(admit(api_server, caller).await);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                let mut still = Vec::with_capacity(in_flight.len());
                for run in in_flight.drain(..) {
                    let row = api_server.store().execution(run).await.expect("execution").expect("row");
                    if row.status == nexus_proto::RunStatus::Completed {
                        completed.fetch_add(1, Ordering::Relaxed);
                    } else {
                        assert!(!row.status.is_terminal(), "a turn ended {}", row.status);
                        still.push(run);
                    }
                }
                in_flight = still;
            }
        }
    });
    let timer = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (start, at) = (completed.load(Ordering::Relaxed), Instant::now());
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let (end, elapsed) = (completed.load(Ordering::Relaxed), at.elapsed());
        stop.store(true, Ordering::Relaxed);
        (end - start) as f64 / elapsed.as_secs_f64()
    };
    let (rate, _) = tokio::join!(timer, futures::future::join_all(runs));
    rate
}

/// A fresh database on the PostgreSQL server `admin_url` names; returns its URL and name.
async fn create_database(admin_url: &str) -> (String, String) {
    let name = format!("nexus_bench_{}", Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(admin_url).await.expect("NEXUS_BENCH_POSTGRES_URL: connect");
    admin.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\""))).await.expect("create database");
    let _ = admin.close().await;
    let (base, query) = admin_url.split_once('?').map_or((admin_url, None), |(b, q)| (b, Some(q)));
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let authority_end = base[authority_start..].find('/').map_or(base.len(), |i| authority_start + i);
    let mut url = format!("{}/{name}", &base[..authority_end]);
    if let Some(query) = query {
        url.push('?');
        url.push_str(query);
    }
    (url, name)
}

async fn drop_database(admin_url: &str, name: &str) {
    if let Ok(mut admin) = PgConnection::connect(admin_url).await {
        let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
        if admin.execute(sqlx::AssertSqlSafe(sql)).await.is_err() {
            eprintln!("could not drop {name}; drop it by hand");
        }
        let _ = admin.close().await;
    }
}

// ---- memory ------------------------------------------------------------------------------------

/// VmRSS of process `pid`, in KiB.
fn rss_kib_of(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(f64::NAN)
}

/// `(KiB per idle connected runner, KiB per idle execution)` of a `nexus serve` child process.
///
/// The identities are minted in this process on the child's store first; then the child serves
/// them. Idle runners are Hello'd streams that announce nothing more; an idle execution is parked
/// on a call its runner (0 slots) never claims.
async fn memory_of_a_nexus_process(runners: usize, executions: usize) -> (f64, f64) {
    let mint = TestServer::start(&scripts()).await;
    let mut idle = Vec::with_capacity(runners);
    for i in 0..runners {
        idle.push(mint.runner(&format!("idle-{i}")).await);
    }
    let parked = mint.runner("parked").await;
    let agent = mint.agent("parked").await;
    let caller = mint.caller(&agent).await;
    let body = json!({"configuration": {"runner_executor_public_ids": [parked.id], "approval_mode": "bypass",
                                         "default_model": "scripted/one"}});
    mint.server.api.declare(&caller, body).await.expect("declared");
    let TestServer { server, data_dir, database } = mint;
    server.shutdown().await.expect("shutdown");

    let script = data_dir.path().join("one.json");
    std::fs::write(&script, fan_script(1).to_string()).expect("script");
    let config = data_dir.path().join("bench.toml");
    std::fs::write(
        &config,
        format!(
            "[doors]\nrequests_per_minute = 1000000\nburst = 100000\n\n[providers.scripted]\nkind = \"scripted\"\n\n\
             [providers.scripted.models.one]\nscript = {script:?}\n"
        ),
    )
    .expect("config");
    let at = StoreLocation {
        data_dir: data_dir.path().to_owned(),
        database_url: database.as_ref().map(|d| d.url().to_owned()),
    };
    let nexus = NexusProcess::serve(&at, free_loopback_addr(), &config).await;
    let pid = nexus.pid().expect("nexus runs");
    let url = nexus.url();
    let http = Http::new(&url, Some(&agent.token));
    let fast = FastRunner::connect(&url, &parked, &noop_tool(3_600_000), 0, false).await;
    let input = json!({"text": "go"});
    let admit = |n: usize| {
        let (http, input) = (&http, &input);
        async move {
            for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
                let answers =
                    futures::future::join_all(chunk.iter().map(|_| http.post("/agent_api/v1/inputs", input))).await;
                for answer in answers {
                    assert_eq!(answer.status, 201, "admission: {answer:?}");
                }
            }
        }
    };
    // One first, so one-time costs (the model, caches, the HTTP stack) are not counted.
    admit(1).await;
    assert!(wait_until_count(&fast.counters.received, 1, Duration::from_secs(10)).await, "no dispatch");
    tokio::time::sleep(Duration::from_millis(500)).await;

    let before = rss_kib_of(pid);
    admit(executions).await;
    // Parked: every call is an open task in the runner's inbox (the runner, with no free slot, is
    // offered only a window of them).
    let store = Store::connect_existing(
        &at.data_dir,
        &StoreConfig { database_url: at.database_url.clone(), ..StoreConfig::default() },
    )
    .await
    .expect("the child's store");
    let deadline = Instant::now() + Duration::from_secs(120);
    while store.open_tasks_for(parked.runner()).await.expect("open tasks").len() < executions + 1 {
        assert!(Instant::now() < deadline, "not every execution parked");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    store.close().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib_of(pid);
    let per_execution = (after - before) / executions as f64;

    let before = rss_kib_of(pid);
    let mut connected = Vec::with_capacity(runners);
    for chunk in idle.chunks(50) {
        let batch = futures::future::join_all(chunk.iter().map(|m| RawRunner::connect(&url, m.id, &m.token))).await;
        for (raw, hello) in batch {
            assert!(hello.code().is_none(), "{hello:?}");
            connected.push(raw);
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib_of(pid);
    let per_runner = (after - before) / runners as f64;
    drop(connected);
    drop(fast);
    nexus.sigterm(Duration::from_secs(30)).await;
    drop(data_dir);
    drop(database);
    (per_runner, per_execution)
}

async fn wait_until_count(counter: &AtomicU64, target: u64, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while counter.load(Ordering::Relaxed) < target {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

// ---- recovery ----------------------------------------------------------------------------------

/// `(server start, start until a claim is granted or refused, granted)` after a restart with
/// `open` open tasks spread over runners of at most `per_runner` each (one execution per runner).
async fn recovery(open: usize, per_runner: usize) -> (Duration, Duration, bool) {
    let first = TestServer::start(&scripts()).await;
    let store = first.store().clone();
    let mut seeded = Vec::new();
    let mut left = open;
    let mut index = 0;
    while left > 0 {
        let count = left.min(per_runner.max(1));
        left -= count;
        let runner = first.runner(&format!("recovery-{index}")).await;
        let fast = FastRunner::connect(&first.url(), &runner, &noop_tool(3_600_000), 0, false).await;
        let caller = agent_for(&first, &format!("recovery-{index}"), runner.id, "one").await;
        let run = admit(&first, &caller).await;
        assert!(wait_until_count(&fast.counters.received, 1, Duration::from_secs(10)).await, "recovery: no dispatch");
        let execution = store.execution(run).await.expect("execution").expect("row");
        let task = store.task(run, nexus_tests::key("r1t0")).await.expect("task").expect("row");
        let clones: Vec<_> = (1..count)
            .map(|i| {
                let mut t = task.clone();
                t.task_key = nexus_proto::TaskKey::Call { round: 1, index: u32::try_from(i).expect("fits") };
                t.tool_call_id = format!("c{i}");
                t
            })
            .collect();
        for chunk in clones.chunks(5_000) {
            store.save_execution(&execution, TranscriptWrite::Unchanged, chunk, &[]).await.expect("seed tasks");
        }
        seeded.push((runner, run, count));
        index += 1;
    }
    eprintln!("recovery: seeded {open} open tasks over {} runners", seeded.len());
    let config = first.config();
    let TestServer { server, data_dir, database } = first;
    server.shutdown().await.expect("shutdown");

    let started = Instant::now();
    let second = TestServer::start_with(&scripts(), |c| *c = config).await;
    let start = started.elapsed();
    let (runner, run, count) = &seeded[0];
    let (raw, hello) = RawRunner::connect(&second.url(), runner.id, &runner.token).await;
    let granted = if hello.code().is_none() {
        let reply = raw.claim(&run.to_string(), &format!("r1t{}", count / 2)).await;
        if reply.granted().is_none() {
            eprintln!("recovery: claim after restart: {reply:?}");
        }
        reply.granted().is_some()
    } else {
        eprintln!("recovery: hello after restart: {hello:?}");
        false
    };
    let until_claim = started.elapsed();
    drop(raw);
    second.shutdown().await;
    drop(data_dir);
    drop(database);
    (start, until_claim, granted)
}

// ---- the table ---------------------------------------------------------------------------------

/// The serve lease's term in the fail-over row.
const FAIL_OVER_LEASE_MS: u64 = 2_000;

/// Starts two `nexus serve` standbys on the PostgreSQL database at `url`, beside a node that
/// serves it: the three-node row's extra nodes (`docs/cluster.md`).
async fn standbys(url: &str, dir: &std::path::Path) -> Vec<NexusProcess> {
    let config = dir.join("standby.toml");
    std::fs::write(&config, "").expect("config");
    let mut nodes = Vec::new();
    for index in 0..2 {
        let data_dir = dir.join(format!("standby{index}"));
        std::fs::create_dir_all(&data_dir).expect("data dir");
        let at = StoreLocation { data_dir, database_url: Some(url.to_owned()) };
        nodes.push(NexusProcess::standby(&at, free_loopback_addr(), &config).await);
    }
    nodes
}

/// Posts one input whose turn is a final answer and waits until it completes; `false` when
/// it is refused or has not completed within `limit`.
async fn one_turn(http: &Http, limit: Duration) -> bool {
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "are you there"})).await;
    let Some(run) = admitted.body["execution_public_id"].as_str().map(str::to_owned) else { return false };
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if http.get(&format!("/agent_api/v1/executions/{run}")).await.body["status"] == "completed" {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// Fail-over on PostgreSQL with two `nexus serve` processes and `[cluster] lease_ms` of
/// [`FAIL_OVER_LEASE_MS`]: from the serving node's SIGKILL until the standby serves, and until
/// a turn admitted on it has completed (work advances again). `None` when a step failed (said
/// on stderr).
async fn fail_over(admin_url: &str) -> Option<(Duration, Duration)> {
    let (url, name) = create_database(admin_url).await;
    let dir = tempfile::tempdir().expect("dir");
    let script = dir.path().join("final.json");
    std::fs::write(&script, json!({"rounds": [{"final": "here"}]}).to_string()).expect("script");
    let config = dir.path().join("cluster.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nlease_ms = {FAIL_OVER_LEASE_MS}\n\n[providers.scripted]\nkind = \"scripted\"\n\n\
             [providers.scripted.models.final]\nscript = {script:?}\n"
        ),
    )
    .expect("config");
    let location = |node: &str| {
        let data_dir = dir.path().join(node);
        std::fs::create_dir_all(&data_dir).expect("data dir");
        StoreLocation { data_dir, database_url: Some(url.clone()) }
    };
    let (first_at, second_at) = (location("first"), location("second"));
    let first = NexusProcess::serve(&first_at, free_loopback_addr(), &config).await;
    let agent = nexus_tests::processes::admin_agent(&first_at, "fail-over").await;
    let declared = Http::new(&first.url(), Some(&agent.token))
        .declare(&json!({"configuration": {"approval_mode": "bypass", "default_model": "scripted/final"}}))
        .await;
    let second = NexusProcess::standby(&second_at, free_loopback_addr(), &config).await;
    let on_second = Http::new(&second.url(), Some(&agent.token));
    let warm = one_turn(&Http::new(&first.url(), Some(&agent.token)), Duration::from_secs(30)).await;
    let measured = if declared.status == 200 && warm {
        let killed = Instant::now();
        first.sigkill().await;
        second.wait_for_log("the take-over", Duration::from_secs(30), |line| line.contains("nexus serving")).await;
        let serving = killed.elapsed();
        let advanced = one_turn(&on_second, Duration::from_secs(30)).await;
        advanced.then(|| (serving, killed.elapsed()))
    } else {
        eprintln!("fail-over: the first node did not serve a turn (declare {})", declared.status);
        None
    };
    let _ = second.sigterm(Duration::from_secs(20)).await;
    drop_database(admin_url, &name).await;
    measured
}

fn verdict(ok: bool) -> &'static str {
    if ok { "holds" } else { "MISSED" }
}

async fn run() {
    let seconds = env_usize("NEXUS_BENCH_SECONDS", 5) as u64;
    let open = env_usize("NEXUS_BENCH_RECOVERY_TASKS", 100_000);
    let recovery_per_runner = env_usize("NEXUS_BENCH_RECOVERY_PER_RUNNER", 500);
    let idle_runners = env_usize("NEXUS_BENCH_IDLE_RUNNERS", 1_000);
    let idle_executions = env_usize("NEXUS_BENCH_IDLE_EXECUTIONS", 1_000);
    let postgres = std::env::var("NEXUS_BENCH_POSTGRES_URL").ok().filter(|u| !u.is_empty());

    // Memory first, while the heap has no freed space from other phases to reuse (which would
    // hide growth from VmRSS); executions before runners for the same reason.
    eprintln!("memory (a nexus serve child process)...");
    let (per_runner, per_execution) = memory_of_a_nexus_process(idle_runners, idle_executions).await;

    eprintln!("latency...");
    let (echo50, echo99) = p50_p99(echo_latency().await);
    let server = TestServer::start(&scripts()).await;
    let (fsync50, fsync99) = p50_p99(fsync_latency(server.data_dir.path()));
    let (fabric_samples, (turn_writes, turn_reads)) = fabric_latency(&server).await;
    let (fabric50, fabric99) = p50_p99(fabric_samples);
    eprintln!("bytes per save of one execution of {LONG_ROUNDS} tool rounds...");
    let long = save_bytes(&server).await;
    eprintln!("throughput on SQLite ({seconds} s)...");
    let sqlite = throughput(&server, seconds, true).await;
    server.shutdown().await;
    eprintln!("throughput on SQLite, one frame per request ({seconds} s)...");
    let server = TestServer::start(&scripts()).await;
    let single = throughput(&server, seconds, false).await;
    server.shutdown().await;
    eprintln!("two-round turns on SQLite ({seconds} s)...");
    let server = TestServer::start(&scripts()).await;
    let turn_rate = turns(&server, seconds).await;
    server.shutdown().await;

    let pg_rate = match &postgres {
        Some(admin_url) => {
            eprintln!("throughput on PostgreSQL ({seconds} s)...");
            let (url, name) = create_database(admin_url).await;
            let pg_url = url.clone();
            let server = TestServer::start_with(&scripts(), move |c| c.store.database_url = Some(pg_url)).await;
            let rate = throughput(&server, seconds, true).await;
            server.shutdown().await;
            drop_database(admin_url, &name).await;
            Some(rate)
        }
        None => None,
    };
    let cluster = match &postgres {
        Some(admin_url) => {
            eprintln!("throughput on PostgreSQL with three nodes ({seconds} s)...");
            let (url, name) = create_database(admin_url).await;
            let pg_url = url.clone();
            let server = TestServer::start_with(&scripts(), move |c| c.store.database_url = Some(pg_url)).await;
            let dir = tempfile::tempdir().expect("dir");
            let nodes = standbys(&url, dir.path()).await;
            let rate = throughput(&server, seconds, true).await;
            // The same load with the runners spread over the three nodes: two thirds of the
            // streams pass through a standby.
            let mut urls = vec![server.url()];
            urls.extend(nodes.iter().map(NexusProcess::url));
            let spread = throughput_through(&server, seconds, true, &urls).await;
            for node in nodes {
                let _ = node.sigterm(Duration::from_secs(20)).await;
            }
            server.shutdown().await;
            drop_database(admin_url, &name).await;
            eprintln!("fail-over on PostgreSQL (two nodes, lease {FAIL_OVER_LEASE_MS} ms)...");
            Some((rate, spread, fail_over(admin_url).await))
        }
        None => None,
    };

    eprintln!("recovery with {open} open tasks...");
    let (start, until_claim, granted) = recovery(open, recovery_per_runner).await;

    let fabric_target = 2.0 * (echo50 + fsync50);
    println!();
    println!("nexus fabric benchmark (one process, release build; µs unless marked)");
    println!();
    println!("| figure | p50 | p99 | target | verdict |");
    println!("| --- | ---: | ---: | --- | --- |");
    println!("| tonic bidi echo, one stream | {echo50:.0} | {echo99:.0} | | |");
    println!("| fdatasync, 512 B append, data dir | {fsync50:.0} | {fsync99:.0} | | |");
    println!(
        "| fabric tool call, dispatch to settled (SQLite) | {fabric50:.0} | {fabric99:.0} | p50 <= {fabric_target:.0} = 2 x (echo + fdatasync) | {} |",
        verdict(fabric50 <= fabric_target)
    );
    println!();
    println!("| figure | value | target | verdict |");
    println!("| --- | ---: | --- | --- |");
    println!(
        "| settled calls/s, SQLite, {RUNNERS} runners x {SLOTS} slots, no-op, batching runners | {:.0} | >= 20000 | {} |",
        sqlite.rate,
        verdict(sqlite.rate >= 20_000.0)
    );
    println!("| settled calls/s, SQLite, same, one frame per request | {:.0} | | |", single.rate);
    match pg_rate {
        Some(pg) => println!(
            "| settled calls/s, PostgreSQL, {RUNNERS} runners x {SLOTS} slots, no-op, batching runners | {:.0} | >= 10000 | {} |",
            pg.rate,
            verdict(pg.rate >= 10_000.0)
        ),
        None => println!("| settled calls/s, PostgreSQL | not run (set NEXUS_BENCH_POSTGRES_URL) | >= 10000 | |"),
    }
    match &cluster {
        Some((three, spread, fail)) => {
            println!(
                "| settled calls/s, PostgreSQL, 3 nodes on the database (1 serving, 2 standbys), same load | {:.0} | | |",
                three.rate
            );
            println!(
                "| settled calls/s, PostgreSQL, 3 nodes, runners spread over the nodes (2/3 forwarded by a standby) | {:.0} | | |",
                spread.rate
            );
            match fail {
                Some((serving, advanced)) => println!(
                    "| fail-over, SIGKILL of the serving node until the standby serves / until a turn on it completed (lease {FAIL_OVER_LEASE_MS} ms) | {:.2} s / {:.2} s | <= {:.1} s (2 x lease) | {} |",
                    serving.as_secs_f64(),
                    advanced.as_secs_f64(),
                    2.0 * FAIL_OVER_LEASE_MS as f64 / 1000.0,
                    verdict(*advanced <= Duration::from_millis(2 * FAIL_OVER_LEASE_MS))
                ),
                None => println!("| fail-over | NOT MEASURED (see stderr) | | MISSED |"),
            }
        }
        None => println!("| 3 nodes, fail-over | not run (set NEXUS_BENCH_POSTGRES_URL) | | |"),
    }
    println!(
        "| store writes / reads per settled call, throughput run (SQLite, {FAN_OUT} calls per turn, all included) | {:.2} / {:.2} | <= 4 / 0 | {} |",
        sqlite.writes,
        sqlite.reads,
        verdict(sqlite.writes <= 4.0 && sqlite.reads < 0.005)
    );
    println!(
        "| store writes / reads per settled call, one call per turn (latency run, all included) | {turn_writes:.2} / {turn_reads:.2} | | |"
    );
    println!(
        "| two-round turns completed/s, admission to completed (SQLite, {RUNNERS} x {TURNS_IN_FLIGHT} in flight) | {turn_rate:.0} | | |"
    );
    println!(
        "| RSS per idle connected runner ({idle_runners}) | {per_runner:.1} KiB | <= 32 KiB | {} |",
        verdict(per_runner <= 32.0)
    );
    println!(
        "| RSS per idle execution ({idle_executions}) | {per_execution:.1} KiB | <= 16 KiB | {} |",
        verdict(per_execution <= 16.0)
    );
    match long {
        Some((early, late)) => {
            println!(
                "| bytes per save, one execution, round {EARLY_ROUND} of {LONG_ROUNDS} tool rounds (SQLite) | {:.0} B ({} saves, {} B) | | |",
                early.per_save(),
                early.saves,
                early.bytes
            );
            println!(
                "| bytes per save, the same execution, round {LONG_ROUNDS} | {:.0} B ({} saves, {} B) | <= 1.2 x round {EARLY_ROUND} | {} |",
                late.per_save(),
                late.saves,
                late.bytes,
                verdict(late.per_save() <= 1.2 * early.per_save())
            );
        }
        None => println!(
            "| bytes per save, round {LONG_ROUNDS} | NOT MEASURED (see stderr) | <= 1.2 x round {EARLY_ROUND} | MISSED |"
        ),
    }
    let scaled = if open < 100_000 { " (SCALED DOWN from 100000)" } else { "" };
    println!(
        "| restart with {open} open tasks{scaled}, {recovery_per_runner} per runner: server up | {:.2} s | | |",
        start.as_secs_f64()
    );
    println!(
        "| restart with {open} open tasks{scaled}: until a claim is {} | {:.2} s | < 3 s | {} |",
        if granted { "granted" } else { "answered: NOT GRANTED (see stderr)" },
        until_claim.as_secs_f64(),
        verdict(granted && until_claim < Duration::from_secs(3))
    );
    println!();
    println!(
        "Throughput window {seconds} s after 1 s of warm-up; refusals during it: SQLite {}{}.",
        sqlite.refused,
        pg_rate.map(|pg| format!(", PostgreSQL {}", pg.refused)).unwrap_or_default()
    );
    println!("Memory is the VmRSS delta of a `nexus serve` child process (server only, store cache included).");
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(run());
}
