//! `run` against a scripted nexus on 127.0.0.1:0: each test plays the server side of the stream
//! frame by frame (hello, announce, claim, commit, a dropped stream, a silent stream, shutdown,
//! a stream fenced again and again, batches both ways), and a second runner-agent on a state dir
//! already held.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nexus_proto::runner::v1::runner_service_server::{RunnerService, RunnerServiceServer};
use nexus_proto::runner::v1::{
    Announced, ClaimGranted, Committed, NexusBatch, NexusFrame, Ping, Refusal, RunnerFrame, Welcome, WorkAvailable,
    nexus_frame, runner_frame,
};
use nexus_runner_agent::journal::{Journal, JournalError};
use nexus_runner_agent::{AgentConfig, AgentError, Credential};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};
use uuid::Uuid;

const RUNNER: Uuid = Uuid::from_u128(0x5eed);
/// Bound on every wait for the agent to do something.
const PATIENCE: Duration = Duration::from_secs(10);

/// One accepted stream, driven by the test.
struct Conn {
    inbound: Streaming<RunnerFrame>,
    outbound: mpsc::UnboundedSender<Result<NexusFrame, Status>>,
    /// Frames of a batch already read, not yet taken.
    unbatched: VecDeque<RunnerFrame>,
}

impl Conn {
    /// The next frame on the wire, a batch whole.
    async fn recv_raw(&mut self) -> RunnerFrame {
        tokio::time::timeout(PATIENCE, self.inbound.message())
            .await
            .expect("the agent sent a frame in time")
            .expect("the stream is healthy")
            .expect("the stream is open")
    }

    /// The next frame, a batch's frames one by one (each as if sent alone).
    async fn recv_any(&mut self) -> (u64, runner_frame::Frame) {
        loop {
            if let Some(frame) = self.unbatched.pop_front() {
                return (frame.request_id, frame.frame.expect("a frame body"));
            }
            let frame = self.recv_raw().await;
            match frame.frame.expect("a frame body") {
                runner_frame::Frame::Batch(batch) => {
                    assert_eq!(frame.request_id, 0, "a batch's own request id is 0");
                    assert!((2..=256).contains(&batch.frames.len()), "a batch of {} frames", batch.frames.len());
                    self.unbatched.extend(batch.frames);
                }
                body => return (frame.request_id, body),
            }
        }
    }

    /// The next frame that is not progress.
    async fn recv(&mut self) -> (u64, runner_frame::Frame) {
        loop {
            match self.recv_any().await {
                (_, runner_frame::Frame::Progress(_)) => continue,
                received => return received,
            }
        }
    }

    fn send(&self, request_id: u64, frame: nexus_frame::Frame) {
        self.outbound.send(Ok(NexusFrame { request_id, frame: Some(frame) })).expect("stream open");
    }

    /// Sends several frames as one `NexusBatch`.
    fn send_batch(&self, frames: Vec<(u64, nexus_frame::Frame)>) {
        let frames =
            frames.into_iter().map(|(request_id, frame)| NexusFrame { request_id, frame: Some(frame) }).collect();
        self.send(0, nexus_frame::Frame::Batch(NexusBatch { frames }));
    }

    /// Reads hello and answers welcome; returns the hello's credential.
    async fn welcome(&mut self, ping_interval_ms: u64) -> String {
        self.welcome_with(ping_interval_ms, true).await
    }

    /// [`Conn::welcome`], saying in the welcome whether this nexus reads batches.
    async fn welcome_with(&mut self, ping_interval_ms: u64, batches: bool) -> String {
        let (request_id, frame) = self.recv().await;
        let runner_frame::Frame::Hello(hello) = frame else { panic!("expected hello, got {frame:?}") };
        assert_eq!(request_id, 1);
        assert_eq!(hello.executor_public_id, RUNNER.to_string());
        assert_eq!(hello.protocol_version, nexus_proto::RUNNER_PROTOCOL_VERSION);
        assert!(hello.batches, "runner-agent reads batches");
        let nexus_frame::Frame::Welcome(mut answer) = welcome(ping_interval_ms) else { unreachable!() };
        answer.batches = batches;
        self.send(1, nexus_frame::Frame::Welcome(answer));
        hello.credential
    }

    /// Reads the announcement and accepts it; returns its body.
    async fn announced(&mut self) -> Value {
        let (request_id, frame) = self.recv().await;
        let runner_frame::Frame::Announce(announce) = frame else { panic!("expected announce, got {frame:?}") };
        self.send(request_id, nexus_frame::Frame::Announced(Announced { executor_json: "{}".into() }));
        serde_json::from_str(&announce.body_json).unwrap()
    }

    fn work(&self, task_key: &str) {
        self.send(0, work(task_key));
    }

    /// Reads a claim for `task_key` and grants it.
    async fn grant(&mut self, task_key: &str, command: &str, claim_token: &str) {
        let (request_id, frame) = self.recv().await;
        let runner_frame::Frame::Claim(claim) = frame else { panic!("expected claim, got {frame:?}") };
        assert_eq!((claim.run_public_id.as_str(), claim.task_key.as_str()), ("run-1", task_key));
        self.send(request_id, granted(task_key, command, claim_token));
    }

    /// Reads a commit; returns its request id, token and body.
    async fn commit(&mut self) -> (u64, String, Value) {
        let (request_id, frame) = self.recv().await;
        let runner_frame::Frame::Commit(commit) = frame else { panic!("expected commit, got {frame:?}") };
        (request_id, commit.claim_token, serde_json::from_str(&commit.body_json).unwrap())
    }

    fn committed(&self, request_id: u64) {
        self.send(request_id, nexus_frame::Frame::Committed(Committed { idle: false, status: "completed".into() }));
    }
}

fn welcome(ping_interval_ms: u64) -> nexus_frame::Frame {
    nexus_frame::Frame::Welcome(Welcome {
        executor_public_id: RUNNER.to_string(),
        credential_epoch: 1,
        protocol_version: nexus_proto::RUNNER_PROTOCOL_VERSION,
        ping_interval_ms,
        batches: true,
    })
}

fn work(task_key: &str) -> nexus_frame::Frame {
    nexus_frame::Frame::WorkAvailable(WorkAvailable {
        kind: "tool_call".into(),
        run_public_id: "run-1".into(),
        task_key: task_key.into(),
        tool_name: "bash".into(),
    })
}

fn granted(task_key: &str, command: &str, claim_token: &str) -> nexus_frame::Frame {
    let task = json!({
        "kind": "tool_call", "run_public_id": "run-1", "task_key": task_key, "tool_name": "bash",
        "tool_input": {"command": command}, "timeout_ms": 60_000,
    });
    nexus_frame::Frame::ClaimGranted(ClaimGranted {
        task_json: task.to_string(),
        claim_token: claim_token.into(),
        deadline_at_ms: now_ms() + 60_000,
    })
}

struct FakeNexus {
    connections: mpsc::UnboundedSender<Conn>,
}

#[tonic::async_trait]
impl RunnerService for FakeNexus {
    type ConnectStream = UnboundedReceiverStream<Result<NexusFrame, Status>>;

    async fn connect(&self, request: Request<Streaming<RunnerFrame>>) -> Result<Response<Self::ConnectStream>, Status> {
        let (outbound, frames) = mpsc::unbounded_channel();
        let conn = Conn { inbound: request.into_inner(), outbound, unbatched: VecDeque::new() };
        self.connections.send(conn).map_err(|_| Status::unavailable("test over"))?;
        Ok(Response::new(UnboundedReceiverStream::new(frames)))
    }
}

struct Harness {
    _dir: tempfile::TempDir,
    config: AgentConfig,
    connections: mpsc::UnboundedReceiver<Conn>,
    server: JoinHandle<()>,
}

impl Harness {
    async fn start() -> Harness {
        let (address, connections, server) = serve().await;
        let dir = tempfile::tempdir().unwrap();
        let workdir = dir.path().join("work");
        std::fs::create_dir(&workdir).unwrap();
        let mut config =
            AgentConfig::new(format!("http://{address}"), RUNNER, Credential::new(" secret-token\n"), workdir);
        config.state_dir = dir.path().join("state");
        config.reconnect_min_delay = Duration::from_millis(20);
        config.reconnect_max_delay = Duration::from_millis(100);
        Harness { _dir: dir, config, connections, server }
    }

    async fn accept(&mut self) -> Conn {
        tokio::time::timeout(PATIENCE, self.connections.recv())
            .await
            .expect("the agent connected in time")
            .expect("server running")
    }

    fn state_dir(&self) -> &Path {
        &self.config.state_dir
    }
}

/// A scripted nexus on 127.0.0.1:0: its address, the streams it accepts, and its task.
async fn serve() -> (std::net::SocketAddr, mpsc::UnboundedReceiver<Conn>, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (tx, connections) = mpsc::unbounded_channel();
    let server = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RunnerServiceServer::new(FakeNexus { connections: tx }))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (address, connections, server)
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Runs the agent in a task; dropping or firing the sender shuts it down.
fn spawn_agent(config: AgentConfig) -> (oneshot::Sender<()>, JoinHandle<Result<(), AgentError>>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let agent = tokio::spawn(nexus_runner_agent::run(config, async move {
        let _ = stopped.await;
    }));
    (stop, agent)
}

async fn finished(agent: JoinHandle<Result<(), AgentError>>) -> Result<(), AgentError> {
    tokio::time::timeout(PATIENCE, agent).await.expect("run returned in time").unwrap()
}

/// Unix milliseconds, as the scripted nexus grants deadlines.
#[expect(clippy::disallowed_methods, reason = "a fake nexus grants deadlines in Unix time, as nexus does")]
fn now_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

fn journal_tasks(state_dir: &Path) -> Vec<String> {
    Journal::open(state_dir, RUNNER).unwrap().entries().map(|e| e.key.task_key.clone()).collect()
}

#[tokio::test]
async fn a_call_runs_and_its_unacknowledged_commit_is_resent_after_reconnect() {
    let mut nexus = Harness::start().await;
    let (stop, agent) = spawn_agent(nexus.config.clone());

    let mut first = nexus.accept().await;
    assert_eq!(first.welcome(15_000).await, "secret-token");
    let announcement = first.announced().await;
    let names: Vec<&str> =
        announcement["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(&names[..4], ["bash", "read_file", "write_file", "list_dir"]);
    for daily in ["edit", "apply_patch", "grep", "glob", "process_start", "process_read", "process_list"] {
        assert!(names.contains(&daily), "{daily} is announced: {names:?}");
    }
    assert!(!names.contains(&"web_fetch"), "web_fetch is off unless configured");
    assert_eq!(
        announcement["environment"]["workdir"],
        nexus.config.workdir.canonicalize().unwrap().display().to_string()
    );

    first.work("t1");
    first.work("t1"); // duplicates are claimed once
    first.grant("t1", "echo hi; pwd", "tok-1").await;
    let (_, token, body) = first.commit().await;
    assert_eq!(token, "tok-1");
    let workdir = nexus.config.workdir.canonicalize().unwrap();
    assert_eq!(body["content"], format!("exit_code: 0\nstdout:\nhi\n{}\nstderr: (empty)\n", workdir.display()));
    assert_eq!(body["is_error"], false);
    assert_eq!(journal_tasks(nexus.state_dir()), ["t1"]);

    // The stream dies before the commit is acknowledged: the same commit comes again.
    drop(first);
    let mut second = nexus.accept().await;
    second.welcome(15_000).await;
    second.announced().await;
    let (request_id, token, resent) = second.commit().await;
    assert_eq!(token, "tok-1");
    assert_eq!(resent, body);
    second.committed(request_id);

    stop.send(()).unwrap();
    assert!(finished(agent).await.is_ok());
    assert!(journal_tasks(nexus.state_dir()).is_empty());
}

#[tokio::test]
async fn with_several_nodes_the_agent_skips_a_dead_one_and_moves_on_when_its_node_goes_away() {
    let mut first = Harness::start().await;
    let (second_address, mut second_streams, second_server) = serve().await;
    // A port nobody listens on any more: the first URL is refused at once.
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let mut config = first.config.clone();
    let first_url = config.nexus_urls[0].clone();
    config.nexus_urls = vec![format!("http://{dead}"), first_url, format!("http://{second_address}")];
    let marks = config.workdir.join("runs");
    let (stop, agent) = spawn_agent(config);

    let mut stream = first.accept().await;
    stream.welcome(15_000).await;
    stream.announced().await;
    stream.work("t1");
    stream.grant("t1", &format!("echo ran >> {}", marks.display()), "tok-1").await;
    let (_, token, body) = stream.commit().await;
    assert_eq!(token, "tok-1");

    // The node goes away before it acknowledges the commit: the agent moves to the next node
    // and commits the same result there, without running the tool again.
    drop(stream);
    first.server.abort();
    let mut moved = tokio::time::timeout(PATIENCE, second_streams.recv()).await.expect("moved in time").unwrap();
    moved.welcome(15_000).await;
    moved.announced().await;
    let (request_id, token, resent) = moved.commit().await;
    assert_eq!((token.as_str(), &resent), ("tok-1", &body));
    moved.committed(request_id);
    assert_eq!(std::fs::read_to_string(&marks).unwrap(), "ran\n", "the tool ran once");

    stop.send(()).unwrap();
    assert!(finished(agent).await.is_ok());
    second_server.abort();
}

fn unauthorized() -> nexus_frame::Frame {
    nexus_frame::Frame::Refusal(Refusal { code: "unauthorized".into(), message: "bad token".into(), http_status: 401 })
}

#[tokio::test]
async fn with_several_nodes_one_that_refuses_the_runner_is_skipped_and_all_refusing_ends_run() {
    let mut first = Harness::start().await;
    let (second_address, mut second_streams, second_server) = serve().await;
    let mut config = first.config.clone();
    config.nexus_urls.push(format!("http://{second_address}"));
    let (stop, agent) = spawn_agent(config.clone());

    // The first node does not know this runner: the agent moves on to the second.
    let mut refusing = first.accept().await;
    let (request_id, _) = refusing.recv().await;
    refusing.send(request_id, unauthorized());
    let mut serving = tokio::time::timeout(PATIENCE, second_streams.recv()).await.expect("moved on").unwrap();
    serving.welcome(15_000).await;
    serving.announced().await;
    assert!(!agent.is_finished(), "one node's refusal ended the agent");
    stop.send(()).unwrap();
    assert!(finished(agent).await.is_ok());

    // Every node refuses: the agent stops with the refusal.
    let (_stop, agent) = spawn_agent(config);
    let mut refusing = first.accept().await;
    let (request_id, _) = refusing.recv().await;
    refusing.send(request_id, unauthorized());
    let mut refusing_too = tokio::time::timeout(PATIENCE, second_streams.recv()).await.expect("moved on").unwrap();
    let (request_id, _) = refusing_too.recv().await;
    refusing_too.send(request_id, unauthorized());
    match finished(agent).await {
        Err(AgentError::Refused(refusal)) => assert_eq!(refusal.code, nexus_proto::ErrorCode::Unauthorized),
        other => panic!("expected the unauthorized refusal, got {other:?}"),
    }
    second_server.abort();
}

#[tokio::test]
async fn an_unauthorized_hello_ends_run_with_the_refusal() {
    let mut nexus = Harness::start().await;
    let (_stop, agent) = spawn_agent(nexus.config.clone());
    let mut conn = nexus.accept().await;
    let (request_id, frame) = conn.recv().await;
    assert!(matches!(frame, runner_frame::Frame::Hello(_)));
    conn.send(
        request_id,
        nexus_frame::Frame::Refusal(Refusal {
            code: "unauthorized".into(),
            message: "bad token".into(),
            http_status: 401,
        }),
    );
    match finished(agent).await {
        Err(AgentError::Refused(refusal)) => assert_eq!(refusal.code, nexus_proto::ErrorCode::Unauthorized),
        other => panic!("expected the unauthorized refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_silent_stream_is_abandoned_and_reopened() {
    let mut nexus = Harness::start().await;
    nexus.config.liveness_timeout = Duration::from_millis(300);
    let (stop, agent) = spawn_agent(nexus.config.clone());
    let mut first = nexus.accept().await;
    first.welcome(0).await;
    first.announced().await;
    // No ping, no frame at all: the agent gives up on this stream and opens another.
    let mut second = nexus.accept().await;
    second.welcome(0).await;
    second.announced().await;
    stop.send(()).unwrap();
    assert!(finished(agent).await.is_ok());
    drop(first);
}

#[tokio::test]
async fn shutdown_kills_a_running_tool_and_commits_what_happened() {
    let mut nexus = Harness::start().await;
    let (stop, agent) = spawn_agent(nexus.config.clone());
    let mut conn = nexus.accept().await;
    conn.welcome(15_000).await;
    conn.announced().await;
    conn.work("t1");
    conn.grant("t1", "echo started; sleep 30", "tok-1").await;

    // Wait until the command has started (its output shows in a progress frame), then stop.
    let progress = loop {
        if let (_, runner_frame::Frame::Progress(progress)) = conn.recv_any().await {
            break progress;
        }
    };
    assert_eq!(progress.claim_token, "tok-1");
    let tail: Value = serde_json::from_str(&progress.frame_json).unwrap();
    assert_eq!(tail["text_tail"], "started\n");

    let started = tokio::time::Instant::now();
    stop.send(()).unwrap();
    let (request_id, token, body) = conn.commit().await;
    assert_eq!(token, "tok-1");
    assert_eq!(body["content"], "the command was killed because the runner shut down");
    assert_eq!(body["is_error"], true);
    conn.committed(request_id);
    assert!(finished(agent).await.is_ok());
    assert!(started.elapsed() < Duration::from_secs(5), "shutdown took {:?}", started.elapsed());
    assert!(journal_tasks(nexus.state_dir()).is_empty());
}

/// Log lines written while the guard lives, on this thread (the agent's loop runs on the test's
/// current-thread runtime).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn count(&self, needle: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap()).matches(needle).count()
    }
}

#[tokio::test]
async fn a_stream_fenced_again_and_again_warns_once_of_a_second_agent() {
    const SIGN: &str = "another runner-agent may be using this runner's credential";
    let logs = Logs::default();
    let _guard = logs.capture();
    let mut nexus = Harness::start().await;
    let (stop, agent) = spawn_agent(nexus.config.clone());

    // nexus closes each stream (as it does when a newer stream of the runner says hello) and
    // welcomes the next connection at once.
    let mut conn = nexus.accept().await;
    conn.welcome(15_000).await;
    conn.announced().await;
    drop(conn);
    let mut conn = nexus.accept().await;
    conn.welcome(15_000).await;
    conn.announced().await;
    assert_eq!(logs.count(SIGN), 0, "one clean close is not a pattern (a restart looks the same)");
    for _ in 0..3 {
        drop(conn);
        conn = nexus.accept().await;
        conn.welcome(15_000).await;
        conn.announced().await;
    }
    assert_eq!(logs.count(SIGN), 1, "warned once: {}", String::from_utf8_lossy(&logs.0.lock().unwrap()));

    stop.send(()).unwrap();
    assert!(finished(agent).await.is_ok());
}

#[tokio::test]
async fn a_second_agent_on_a_held_state_dir_stops_at_once() {
    let mut nexus = Harness::start().await;
    let (stop, agent) = spawn_agent(nexus.config.clone());
    let mut conn = nexus.accept().await;
    conn.welcome(15_000).await;

    // In this process: the second run names the state dir and the holder's pid.
    let second = finished(spawn_agent(nexus.config.clone()).1).await;
    match second {
        Err(AgentError::Journal(JournalError::InUse { path, pid })) => {
            assert_eq!(path, nexus.config.state_dir);
            assert_eq!(pid, Some(std::process::id()));
        }
        other => panic!("expected the state dir in use, got {other:?}"),
    }
    // The binary, as an operator starts it, exits at once without connecting.
    let token_file = nexus.config.state_dir.parent().unwrap().join("token");
    std::fs::write(&token_file, "secret-token").unwrap();
    let started = tokio::time::Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_runner-agent"))
        .arg("--nexus")
        .arg(&nexus.config.nexus_urls[0])
        .arg("--runner-id")
        .arg(RUNNER.to_string())
        .arg("--token-file")
        .arg(&token_file)
        .arg("--workdir")
        .arg(&nexus.config.workdir)
        .arg("--state-dir")
        .arg(&nexus.config.state_dir)
        // An operator who exported it for another program still gets the message alone.
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(started.elapsed() < PATIENCE);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("pid {}", std::process::id())), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(last.starts_with("error: ") && last.contains("pid"), "the refusal is the last line: {stderr}");
    assert!(!stderr.to_lowercase().contains("backtrace"), "no backtrace after a refusal: {stderr}");
    assert!(nexus.connections.try_recv().is_err(), "the second agent never connected");

    stop.send(()).unwrap();
    assert!(finished(agent).await.is_ok());
    drop(conn);
}

#[tokio::test]
async fn offers_in_one_batch_are_claimed_in_one_batch_and_answers_in_one_are_handled() {
    let mut nexus = Harness::start().await;
    let (stop, agent) = spawn_agent(nexus.config.clone());
    let mut conn = nexus.accept().await;
    conn.welcome(15_000).await;
    conn.announced().await;

    conn.send_batch(vec![(0, work("t1")), (0, work("t2")), (0, work("t3"))]);
    let claims = conn.recv_raw().await;
    let Some(runner_frame::Frame::Batch(batch)) = claims.frame else { panic!("expected one batch, got {claims:?}") };
    assert_eq!(claims.request_id, 0);
    let claimed: Vec<(u64, String)> = batch
        .frames
        .into_iter()
        .map(|frame| match frame.frame {
            Some(runner_frame::Frame::Claim(claim)) => (frame.request_id, claim.task_key),
            other => panic!("expected claims, got {other:?}"),
        })
        .collect();
    let tasks: Vec<&str> = claimed.iter().map(|(_, task)| task.as_str()).collect();
    assert_eq!(tasks, ["t1", "t2", "t3"]);

    // The answers come back in one batch: each is handled as if it came alone.
    conn.send_batch(vec![
        (claimed[0].0, granted("t1", "echo one", "tok-1")),
        (claimed[1].0, granted("t2", "echo two", "tok-2")),
        (
            claimed[2].0,
            nexus_frame::Frame::Refusal(Refusal {
                code: "already_claimed".into(),
                message: "taken".into(),
                http_status: 409,
            }),
        ),
    ]);
    let mut commits = Vec::new();
    while commits.len() < 2 {
        let (request_id, token, body) = conn.commit().await;
        commits.push((request_id, token, body["content"].as_str().unwrap().to_owned()));
    }
    commits.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(commits[0].1, "tok-1");
    assert!(commits[0].2.contains("one"), "{}", commits[0].2);
    assert_eq!(commits[1].1, "tok-2");
    let committed = || nexus_frame::Frame::Committed(Committed { idle: false, status: "completed".into() });
    conn.send_batch(commits.iter().map(|(request_id, _, _)| (*request_id, committed())).collect());

    // The agent drains only once both acknowledgements are in, then its journal is empty.
    stop.send(()).unwrap();
    assert!(finished(agent).await.is_ok());
    assert!(journal_tasks(nexus.state_dir()).is_empty());
}

#[tokio::test]
async fn a_nexus_that_reads_no_batches_gets_one_frame_per_request() {
    let mut nexus = Harness::start().await;
    let (stop, agent) = spawn_agent(nexus.config.clone());
    let mut conn = nexus.accept().await;
    conn.welcome_with(15_000, false).await;
    conn.announced().await;

    conn.send_batch(vec![(0, work("t1")), (0, work("t2"))]);
    let mut claimed = Vec::new();
    while claimed.len() < 2 {
        let frame = conn.recv_raw().await;
        match frame.frame {
            Some(runner_frame::Frame::Claim(claim)) => claimed.push((frame.request_id, claim.task_key)),
            other => panic!("expected a claim alone, got {other:?}"),
        }
    }
    let tasks: Vec<&str> = claimed.iter().map(|(_, task)| task.as_str()).collect();
    assert_eq!(tasks, ["t1", "t2"]);
    for (request_id, _) in &claimed {
        let refusal = Refusal { code: "already_claimed".into(), message: "taken".into(), http_status: 409 };
        conn.send(*request_id, nexus_frame::Frame::Refusal(refusal));
    }
    stop.send(()).unwrap();
    assert!(finished(agent).await.is_ok());
}

#[tokio::test]
async fn a_welcome_inside_a_batch_is_taken_with_the_frames_around_it() {
    let mut nexus = Harness::start().await;
    let (stop, agent) = spawn_agent(nexus.config.clone());
    let mut conn = nexus.accept().await;
    let (request_id, hello) = conn.recv().await;
    assert!(matches!(hello, runner_frame::Frame::Hello(_)));
    conn.send_batch(vec![
        (0, nexus_frame::Frame::Ping(Ping { nonce: 3 })),
        (request_id, welcome(15_000)),
        (0, work("t1")),
    ]);
    let (pong_id, pong) = conn.recv().await;
    assert_eq!(pong_id, 0);
    assert!(matches!(pong, runner_frame::Frame::Pong(ref pong) if pong.nonce == 3), "{pong:?}");
    conn.announced().await;
    conn.grant("t1", "echo hi", "tok-1").await;
    let (commit_id, token, _) = conn.commit().await;
    assert_eq!(token, "tok-1");
    conn.committed(commit_id);
    stop.send(()).unwrap();
    assert!(finished(agent).await.is_ok());
    assert!(journal_tasks(nexus.state_dir()).is_empty());
}

const READ_ONLY: &str = r#"effect_profile = { kind = "read_only", destructive = false, effect_scope = "closed", idempotency = "intrinsic", reconciliation = "none" }"#;

/// A tools file serving one command tool `name` that answers `answer` as its structured result.
fn tools_file_text(name: &str, answer: &str) -> String {
    format!(
        "[[tool]]\nname = \"{name}\"\ndescription = \"Say {answer}\"\ncommand = [\"python3\", \"say.py\", \"{answer}\"]\n{READ_ONLY}\n"
    )
}

/// The built-ins a runner without `[builtin.web_fetch]` announces, in order, before the file's tools.
const BUILTINS: [&str; 13] = [
    "bash",
    "read_file",
    "write_file",
    "list_dir",
    "edit",
    "apply_patch",
    "grep",
    "glob",
    "process_start",
    "process_read",
    "process_write",
    "process_kill",
    "process_list",
];

fn file_tools(body: &Value) -> Vec<String> {
    let names: Vec<String> =
        body["tools"].as_array().unwrap().iter().map(|tool| tool["name"].as_str().unwrap().to_owned()).collect();
    assert_eq!(names[..BUILTINS.len()], BUILTINS, "the built-ins come first");
    names[BUILTINS.len()..].to_vec()
}

#[tokio::test]
async fn tools_from_a_file_are_served_and_announced_again_when_it_changes_and_on_sighup() {
    let mut nexus = Harness::start().await;
    let dir = nexus._dir.path().to_owned();
    let path = dir.join("tools.toml");
    std::fs::write(
        dir.join("say.py"),
        "import json, sys\ndata = json.load(sys.stdin)\nprint(json.dumps({'content': sys.argv[1], 'structured_content': data}))\n",
    )
    .unwrap();
    std::fs::write(&path, tools_file_text("say", "hi")).unwrap();
    let mut config = nexus.config.clone();
    config.tools_file = Some(path.clone());
    config.poll_interval = Duration::from_millis(100);
    let (stop, agent) = spawn_agent(config);

    let mut conn = nexus.accept().await;
    conn.welcome(60_000).await;
    let body = conn.announced().await;
    assert_eq!(file_tools(&body), ["say"]);
    assert_eq!(body["tools"][BUILTINS.len()]["description"], "Say hi");

    // The command tool runs end to end: stdin in, the structured answer out.
    conn.send(
        0,
        nexus_frame::Frame::WorkAvailable(WorkAvailable {
            kind: "tool_call".into(),
            run_public_id: "run-1".into(),
            task_key: "s1".into(),
            tool_name: "say".into(),
        }),
    );
    let (claim_id, frame) = conn.recv().await;
    assert!(matches!(frame, runner_frame::Frame::Claim(_)), "{frame:?}");
    let task = json!({"kind": "tool_call", "run_public_id": "run-1", "task_key": "s1", "tool_name": "say",
        "tool_input": {"n": 1}, "timeout_ms": 60_000});
    conn.send(
        claim_id,
        nexus_frame::Frame::ClaimGranted(ClaimGranted {
            task_json: task.to_string(),
            claim_token: "tok-s1".into(),
            deadline_at_ms: now_ms() + 60_000,
        }),
    );
    // The 100 ms tick reads the claim's status meanwhile.
    let (commit_id, token, result) = loop {
        match conn.recv().await {
            (id, runner_frame::Frame::ClaimStatus(_)) => {
                conn.send(id, nexus_frame::Frame::ClaimState(nexus_proto::runner::v1::ClaimState { active: true }));
            }
            (id, runner_frame::Frame::Commit(commit)) => {
                break (id, commit.claim_token, serde_json::from_str::<Value>(&commit.body_json).unwrap());
            }
            (_, other) => panic!("expected a commit, got {other:?}"),
        }
    };
    assert_eq!(token, "tok-s1");
    assert_eq!(result, json!({"content": "hi", "structured_content": {"n": 1}, "is_error": false}));
    conn.committed(commit_id);

    // A change of content is announced again at the next tick, without a restart.
    std::fs::write(&path, tools_file_text("say", "hello") + &tools_file_text("shout", "HEY")).unwrap();
    let body = conn.announced().await;
    assert_eq!(file_tools(&body), ["say", "shout"]);
    assert_eq!(body["tools"][BUILTINS.len()]["description"], "Say hello");

    // SIGHUP reads it again and announces, even unchanged. The agent listens for it: it
    // announced, so its loop runs.
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGHUP).unwrap();
    let body = conn.announced().await;
    assert_eq!(file_tools(&body), ["say", "shout"]);

    // A bad file is refused and the tools stay; the next good one is announced.
    std::fs::write(&path, "[[tool]]\nname = \"broken\"\n").unwrap();
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGHUP).unwrap();
    std::fs::write(&path, tools_file_text("calm", "ok")).unwrap();
    let body = conn.announced().await;
    assert_eq!(file_tools(&body), ["calm"], "the bad file was never announced");

    stop.send(()).unwrap();
    assert!(finished(agent).await.is_ok());
}

#[tokio::test]
async fn a_bad_tools_file_stops_run_before_it_connects() {
    let mut nexus = Harness::start().await;
    let path = nexus._dir.path().join("tools.toml");
    std::fs::write(&path, "[[tool]]\nname = \"x\"\ndescription = \"d\"\ncommand = [\"sh\"]\ntimeout_ms = -1\n")
        .unwrap();
    let mut config = nexus.config.clone();
    config.tools_file = Some(path);
    let outcome = tokio::time::timeout(PATIENCE, nexus_runner_agent::run(config, std::future::pending())).await;
    let Ok(Err(AgentError::Config(nexus_runner_agent::ConfigError::ToolsFile { source }))) = outcome else {
        panic!("a bad tools file did not stop run: {outcome:?}");
    };
    assert_eq!(source.field.as_deref(), Some("tool[0]"), "a missing effect profile: {source}");
    assert_eq!(source.location.map(|(line, _)| line), Some(1));
    assert!(nexus.connections.try_recv().is_err(), "nothing connected");
}

#[tokio::test]
async fn describe_tools_lists_what_would_be_announced_without_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    std::fs::write(dir.path().join("say.py"), "print('hi')\n").unwrap();
    std::fs::write(&path, tools_file_text("say", "hi") + "max_concurrency = 2\n[builtin.bash]\nmax_concurrency = 1\n")
        .unwrap();
    let listed = nexus_runner_agent::describe_tools(dir.path(), 30_000, None, Some(&path)).await.unwrap();
    assert!(listed.mcp_not_listed.is_empty());
    let tools = listed.tools.as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|tool| tool["name"].as_str().unwrap()).collect();
    assert_eq!(names[..BUILTINS.len()], BUILTINS);
    assert_eq!(names[BUILTINS.len()..], ["say"]);
    assert_eq!((tools[0]["timeout_ms"].as_u64(), tools[0]["max_concurrency"].as_u64()), (Some(30_000), Some(1)));
    assert_eq!(tools[1]["max_concurrency"], Value::Null);
    let say = &tools[BUILTINS.len()];
    assert_eq!((say["max_concurrency"].as_u64(), say["description"].as_str()), (Some(2), Some("Say hi")));
    assert_eq!(say["effect_profile"]["kind"], "read_only");

    std::fs::write(&path, "[builtin.bash]\nmax_concurrency = 0\n").unwrap();
    let Err(nexus_runner_agent::ConfigError::ToolsFile { source }) =
        nexus_runner_agent::describe_tools(dir.path(), 30_000, None, Some(&path)).await
    else {
        panic!("a bad file was described");
    };
    assert_eq!((source.field.as_deref(), source.location), (Some("builtin.bash.max_concurrency"), Some((2, 19))));
}
