//! The server's resources under hostile peers (issue 11, items 4 and 12): connections that send
//! nothing, send slowly or pile up to the cap cannot starve members and runners; and a second
//! node on a store that a node serves refuses to start, leaving the first one's work untouched.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use nexus_actors::store::{StoreBackend, StoreConfig};
use nexus_proto::agent::v1::agent_service_client::AgentServiceClient;
use nexus_proto::agent::v1::{CreateInputRequest, DeclareProfileRequest, GetExecutionRequest, GetProfileRequest};
use nexus_tests::processes::{
    NexusProcess, RunnerAgentProcess, StoreLocation, admin_agent, admin_runner, free_loopback_addr,
};
use nexus_tests::{
    Http, Minted, RawRunner, TestDatabase, TestServer, authed, nexus_binary, test_store_backend, wait_until,
};

const WAIT: Duration = Duration::from_secs(30);

/// Reads `socket` until the server closes it; answers how long that took. Bytes the server
/// sends first (an HTTP/2 SETTINGS frame, a response) are read and dropped.
async fn closed_by_server(socket: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(started + limit, socket.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the server did not close the connection within {limit:?}"),
        }
    }
}

/// Reads one HTTP/1.1 response with a `content-length` body from `socket`; answers its head.
async fn read_response(socket: &mut TcpStream) -> String {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(WAIT, socket.read(&mut buf)).await.expect("a response").expect("reads");
        assert!(read > 0, "the connection closed before its response; got {:?}", String::from_utf8_lossy(&bytes));
        bytes.extend_from_slice(&buf[..read]);
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let Some(end) = text.find("\r\n\r\n") else { continue };
        let head = &text[..end];
        let length: usize = head
            .lines()
            .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
            .and_then(|v| v.parse().ok())
            .expect("a content-length");
        if bytes.len() >= end + 4 + length {
            return head.to_owned();
        }
    }
}

#[tokio::test]
async fn silent_sockets_slow_heads_and_idle_keep_alives_are_closed_at_their_bounds() {
    const FIRST_BYTE: Duration = Duration::from_millis(300);
    const HEAD: Duration = Duration::from_millis(1_500);
    const IDLE: Duration = Duration::from_millis(1_000);
    let server = TestServer::start_with(&[], |config| {
        config.connections.first_byte_timeout_ms = 300;
        config.connections.request_head_timeout_ms = 1_500;
        config.connections.idle_timeout_ms = 1_000;
    })
    .await;
    let agent = server.agent("agent").await;
    let runner = server.runner("runner").await;
    let addr = server.server.addr;
    // A runner's stream is a request in flight: no bound below cuts it.
    let raw = RawRunner::connect_announced(&server.url(), &runner, &json!({"tools": []})).await;

    // Each bound counts from the server's accept (or the end of a response), which comes after
    // `began`: the time since `began` is at least the bound.
    // Nothing at all: closed at the first-byte bound.
    let began = Instant::now();
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    closed_by_server(&mut silent, WAIT).await;
    assert!(began.elapsed() >= FIRST_BYTE, "closed after {:?}, before the first-byte bound", began.elapsed());

    // An HTTP/1 head that never ends, a header every 100 ms: closed at the head bound.
    let began = Instant::now();
    let mut slow = TcpStream::connect(addr).await.expect("connect");
    slow.write_all(b"GET /agent_api/v1/profile HTTP/1.1\r\nhost: x\r\n").await.expect("write");
    let (mut reader, mut writer) = slow.into_split();
    let dribble = tokio::spawn(async move {
        while writer.write_all(b"x-slow: 1\r\n").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut buf = [0u8; 1024];
    while !matches!(tokio::time::timeout(WAIT, reader.read(&mut buf)).await.expect("closed in time"), Ok(0) | Err(_)) {}
    assert!(began.elapsed() >= HEAD, "a slow head was cut after {:?}", began.elapsed());
    dribble.abort();

    // The HTTP/2 preface and nothing more: closed at the head bound too.
    let began = Instant::now();
    let mut preface = TcpStream::connect(addr).await.expect("connect");
    preface.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await.expect("write");
    closed_by_server(&mut preface, WAIT).await;
    assert!(began.elapsed() >= HEAD, "an HTTP/2 client with no request was cut after {:?}", began.elapsed());

    // Served once, then idle: kept for the idle bound after its response, then closed.
    let mut keep_alive = TcpStream::connect(addr).await.expect("connect");
    let request =
        format!("GET /agent_api/v1/profile HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\r\n", agent.token);
    let began = Instant::now();
    keep_alive.write_all(request.as_bytes()).await.expect("write");
    let head = read_response(&mut keep_alive).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    closed_by_server(&mut keep_alive, WAIT).await;
    assert!(began.elapsed() >= IDLE, "an idle keep-alive connection was closed after {:?}", began.elapsed());

    let counts = server.server.sockets.counts();
    assert!(counts.timed_out >= 4, "{counts:?}");
    // Longer than every bound above, the runner's stream still answers.
    assert!(raw.is_open(), "the runner's stream was cut");
    let announced = raw.announce(&json!({"tools": []})).await;
    assert_eq!(announced.code(), None, "{announced:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn at_the_cap_the_oldest_unauthenticated_connections_are_shed_and_members_and_runners_stay() {
    const CAP: usize = 8;
    let server = TestServer::start_with(&[], |config| config.connections.max_connections = Some(8)).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("runner").await;
    let member = Http::new(&server.url(), Some(&agent.token));
    assert_eq!(member.profile().await.status, 200);
    let raw = RawRunner::connect_announced(&server.url(), &runner, &json!({"tools": []})).await;
    wait_until("the member and the runner to be authenticated", WAIT, || async {
        (server.server.sockets.counts().authenticated == 2).then_some(())
    })
    .await;

    // Three times the cap of idle sockets, one after the other.
    let mut idle = Vec::new();
    for _ in 0..3 * CAP {
        idle.push(TcpStream::connect(server.server.addr).await.expect("connect"));
    }
    let counts = wait_until("the cap to shed", WAIT, || async {
        let counts = server.server.sockets.counts();
        (counts.shed >= 3 * CAP as u64 - (CAP as u64 - 2) && counts.open <= CAP).then_some(counts)
    })
    .await;
    assert_eq!(counts.refused, 0, "{counts:?}");
    assert_eq!(counts.authenticated, 2, "{counts:?}");
    // The oldest went first: the first idle socket is closed, the last one is still open.
    closed_by_server(&mut idle[0], WAIT).await;
    let mut probe = [0u8; 1];
    let last = idle.last_mut().expect("sockets");
    assert!(
        tokio::time::timeout(Duration::from_millis(200), last.read(&mut probe)).await.is_err(),
        "the newest idle socket was shed before older ones"
    );

    // The member and the runner are still served, and a new client gets in (shedding one more).
    assert_eq!(member.profile().await.status, 200);
    assert_eq!(raw.announce(&json!({"tools": []})).await.code(), None);
    let mut client = grpc(&server.url()).await;
    client.get_profile(authed(GetProfileRequest {}, &agent)).await.expect("a new gRPC client is served");
    assert!(server.server.sockets.counts().open <= CAP);
    server.shutdown().await;
}

async fn grpc(url: &str) -> AgentServiceClient<Channel> {
    let channel = Endpoint::from_shared(url.to_owned()).expect("url").connect().await.expect("connect");
    AgentServiceClient::new(channel)
}

/// A store for `nexus` children: a data dir under `dir`, and a fresh database on PostgreSQL.
async fn store_location(dir: &Path, name: &str) -> (StoreLocation, Option<TestDatabase>) {
    let data_dir = dir.join(name);
    std::fs::create_dir(&data_dir).expect("data dir");
    let database = match test_store_backend() {
        StoreBackend::Postgres => Some(TestDatabase::create().await),
        _ => None,
    };
    (StoreLocation { data_dir, database_url: database.as_ref().map(|d| d.url().to_owned()) }, database)
}

/// A config file with `extra` and a scripted model `scripted/work` that runs one `bash` call
/// (`echo ran >> side.log`) and then answers "done".
fn config_file(dir: &Path, extra: &str) -> std::path::PathBuf {
    let script = dir.join("work.json");
    let rounds = json!({"rounds": [
        {"tool_calls": [{"id": "c1", "name": "bash", "arguments": {"command": "echo ran >> side.log; echo ran"}}]},
        {"final": "done"},
    ]});
    std::fs::write(&script, rounds.to_string()).expect("script");
    let path = dir.join("nexus.toml");
    let text = format!(
        "{extra}\n[providers.scripted]\nkind = \"scripted\"\n\n[providers.scripted.models.work]\nscript = {:?}\n",
        script.display().to_string()
    );
    std::fs::write(&path, text).expect("config");
    path
}

/// Runs one execution through the nexus at `url` on `runner` (whose runner-agent works in
/// `workdir`): its bash call runs there and it completes.
/// Runs one execution admitted at `url` to completion; returns its public id.
async fn run_one_execution(url: &str, agent: &Minted, runner: &Minted, workdir: &Path) -> String {
    let mut client = grpc(url).await;
    let body = json!({"configuration": {
        "runner_executor_public_ids": [runner.id], "approval_mode": "bypass", "default_model": "scripted/work",
    }});
    client
        .declare_profile(authed(DeclareProfileRequest { body_json: body.to_string() }, agent))
        .await
        .expect("declare");
    let request = CreateInputRequest {
        text: "work".into(),
        runner_executor_public_id: runner.id.to_string(),
        ..CreateInputRequest::default()
    };
    let execution = client.create_input(authed(request, agent)).await.expect("create input").into_inner();
    let id = execution.execution_public_id;
    let done = wait_until("the execution to complete", Duration::from_secs(60), || {
        let (mut client, id) = (client.clone(), id.clone());
        async move {
            let row = client
                .get_execution(authed(
                    GetExecutionRequest { execution_public_id: id, tasks_after: String::new() },
                    agent,
                ))
                .await;
            row.ok()
                .map(tonic::Response::into_inner)
                .filter(|row| matches!(row.status.as_str(), "completed" | "needs_attention" | "canceled"))
        }
    })
    .await;
    assert_eq!(done.status, "completed", "{done:?}");
    assert_eq!(done.final_text, "done");
    // The call ran once (the log is taken, so the next execution on this workdir starts empty).
    let side = std::fs::read_to_string(workdir.join("side.log")).expect("the bash call ran on the runner");
    std::fs::remove_file(workdir.join("side.log")).expect("the side-effect log is removed");
    assert_eq!(side, "ran\n");
    id
}

/// Waits until a runner's announcement is stored (it connected and said Hello).
async fn announced(at: &StoreLocation, runner: &Minted) {
    let config =
        StoreConfig { database_url: at.database_url.clone(), max_connections: Some(1), ..StoreConfig::default() };
    let store = nexus_actors::store::Store::connect_existing(&at.data_dir, &config).await.expect("store beside nexus");
    wait_until("the runner's announcement", Duration::from_secs(60), || async {
        store.executor(runner.runner()).await.ok().flatten().and_then(|row| row.announced_at)
    })
    .await;
}

fn runner_spec(dir: &Path, url: String, runner: &Minted, workdir: &Path) -> RunnerAgentProcess {
    let state = dir.join("runner-state");
    std::fs::create_dir_all(&state).expect("state dir");
    RunnerAgentProcess {
        nexus_url: url,
        token_file: dir.join("runner.token"),
        runner: runner.clone(),
        workdir: workdir.to_owned(),
        state_dir: state,
        tool_timeout_ms: 30_000,
    }
}

/// Holds `count` idle connections to `addr` from a child process (each child has its own
/// descriptor limit): it prints `held N failed M` once they are open and holds them until its
/// stdin closes.
fn idle_socket_holder(addr: std::net::SocketAddr, count: usize) -> Child {
    const HOLDER: &str = r#"
import socket, sys
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held, failed = [], 0
for _ in range(count):
    s = socket.socket()
    s.settimeout(20)
    try:
        s.connect((host, port))
        held.append(s)
    except OSError:
        failed += 1
        s.close()
print("held %d failed %d" % (len(held), failed), flush=True)
sys.stdin.read()
"#;
    Command::new("python3")
        .arg("-c")
        .arg(HOLDER)
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .arg(count.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 starts")
}

#[tokio::test]
async fn twenty_thousand_idle_sockets_beside_a_member_and_a_runner_who_are_still_served() {
    const HOLDERS: usize = 4;
    const PER_HOLDER: usize = 5_000;
    let dir = tempfile::tempdir().expect("dir");
    let (at, _database) = store_location(dir.path(), "data").await;
    // The deadlines are set far off, so that only the cap stands between the flood and the
    // members; the default cap (3/4 of `ulimit -n`) is in force.
    let config = config_file(
        dir.path(),
        "[connections]\nfirst_byte_timeout_ms = 600000\nrequest_head_timeout_ms = 600000\nidle_timeout_ms = 600000\n",
    );
    let nexus = NexusProcess::serve(&at, free_loopback_addr(), &config).await;
    let agent = admin_agent(&at, "agent").await;
    let runner = admin_runner(&at, "worker").await;
    // The member has been served before the flood: its keep-alive connection is protected.
    let member = Http::new(&nexus.url(), Some(&agent.token));
    assert_eq!(member.profile().await.status, 200);

    let started = Instant::now();
    let mut holders: Vec<Child> = (0..HOLDERS).map(|_| idle_socket_holder(nexus.addr, PER_HOLDER)).collect();
    let mut held = 0;
    for holder in &mut holders {
        let stdout = holder.stdout.take().expect("stdout");
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(60), BufReader::new(stdout).read_line(&mut line))
            .await
            .expect("the holder opened its sockets within a minute")
            .expect("reads");
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("held"), "{line}");
        held += words.next().and_then(|n| n.parse::<usize>().ok()).expect("a count");
    }
    eprintln!("{held} idle sockets opened in {:?}", started.elapsed());
    assert!(held >= HOLDERS * PER_HOLDER * 9 / 10, "only {held} idle sockets were opened");
    wait_until("nexus to say it reached the cap", WAIT, || async {
        nexus.log().iter().any(|line| line.contains("connection cap reached")).then_some(())
    })
    .await;

    // With 20,000 idle sockets against it: the member's HTTP request, a new gRPC client, and a
    // runner that connects now and runs a call.
    assert_eq!(member.profile().await.status, 200, "the member's HTTP request");
    let mut client = grpc(&nexus.url()).await;
    client.get_profile(authed(GetProfileRequest {}, &agent)).await.expect("a new gRPC client's call");
    let workdir = tempfile::tempdir().expect("workdir");
    let _runner_agent = runner_spec(dir.path(), nexus.url(), &runner, workdir.path()).spawn();
    announced(&at, &runner).await;
    run_one_execution(&nexus.url(), &agent, &runner, workdir.path()).await;

    let log = nexus.log();
    assert!(
        !log.iter().any(|line| line.contains("cannot accept connections")),
        "nexus ran out of descriptors:\n{}",
        log.join("\n")
    );
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
    drop(holders);
    let exit = nexus.sigterm(Duration::from_secs(20)).await;
    assert!(exit.success(), "nexus exited {exit}");
}

/// `nexus serve` on `at`, expected to refuse: answers its exit status and stderr.
async fn serve_refused(at: &StoreLocation, config: &Path) -> (std::process::ExitStatus, String) {
    let mut command = Command::new(nexus_binary());
    command
        .arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--listen")
        .arg(free_loopback_addr().to_string())
        .arg("--data-dir")
        .arg(&at.data_dir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(url) = &at.database_url {
        command.arg("--database-url").arg(url);
    }
    let out = tokio::time::timeout(Duration::from_secs(20), command.output())
        .await
        .expect("a refused nexus exits at once")
        .expect("nexus runs");
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The serve lease's term the node tests run with: short, so fail-over is quick.
const LEASE_MS: u64 = 2_000;

#[tokio::test]
async fn a_second_node_is_refused_on_sqlite_and_forwards_to_the_serving_node_on_postgres() {
    let dir = tempfile::tempdir().expect("dir");
    let (at, _database) = store_location(dir.path(), "data").await;
    let config = config_file(dir.path(), &format!("[cluster]\nlease_ms = {LEASE_MS}\n"));
    let first = NexusProcess::serve(&at, free_loopback_addr(), &config).await;
    let pid = first.pid().expect("running");
    let agent = admin_agent(&at, "agent").await;
    let runner = admin_runner(&at, "worker").await;

    let Some(url) = at.database_url.clone() else {
        // SQLite: the data dir is the store, and one node serves it.
        let started = Instant::now();
        let (status, stderr) = serve_refused(&at, &config).await;
        assert!(!status.success(), "the second node served: {stderr}");
        assert!(stderr.contains(&format!("pid {pid}")), "the refusal does not name the node that serves:\n{stderr}");
        assert!(stderr.contains("PostgreSQL"), "the refusal does not say how to run several nodes:\n{stderr}");
        assert!(!stderr.contains("nexus serving"), "the second node started serving:\n{stderr}");
        eprintln!("refused in {:?}: {stderr}", started.elapsed());
        // `nexus admin` works beside the serving node, and the first node's work goes on.
        let workdir = tempfile::tempdir().expect("workdir");
        let _runner_agent = runner_spec(dir.path(), first.url(), &runner, workdir.path()).spawn();
        announced(&at, &runner).await;
        run_one_execution(&first.url(), &agent, &runner, workdir.path()).await;
        let exit = first.sigterm(Duration::from_secs(20)).await;
        assert!(exit.success(), "the first node exited {exit}");
        let again = NexusProcess::serve(&at, free_loopback_addr(), &config).await;
        let exit = again.sigterm(Duration::from_secs(20)).await;
        assert!(exit.success(), "the next node exited {exit}");
        return;
    };

    // PostgreSQL: a second node with its own data dir, as on another host, waits as a standby.
    let data_dir = dir.path().join("second");
    std::fs::create_dir(&data_dir).expect("data dir");
    let second_at = StoreLocation { data_dir: data_dir.clone(), database_url: Some(url) };
    // Its provider table differs from the first node's (one provider more, its own script
    // path): it starts, and warns that a fail-over onto it could halt executions.
    let second_config = config_file(
        &data_dir,
        &format!("[cluster]\nlease_ms = {LEASE_MS}\n\n[providers.other]\nkind = \"scripted\"\n"),
    );
    let second = NexusProcess::standby(&second_at, free_loopback_addr(), &second_config).await;
    let warned = second
        .log()
        .iter()
        .any(|line| line.contains("another [providers] table") && line.contains(&first.addr.to_string()));
    assert!(warned, "the standby did not warn of the other provider table:\n{}", second.log().join("\n"));
    // The standby passes every request on to the node that serves: a person, a client or a
    // load balancer may use either address. The cluster listing, asked of the standby from
    // loopback, is the serving node's (forwarded with the client's own address, so the loopback
    // rule holds), and the gRPC health service answers SERVING for it.
    let first_id = wait_until("the standby to forward to the serving node", WAIT, || {
        let (url, token) = (second.url(), agent.token.clone());
        async move {
            let answer = Http::new(&url, Some(&token)).get("/agent_api/v1/cluster").await;
            (answer.status == 200).then_some(answer.body)
        }
    })
    .await;
    assert_eq!(first_id["lease"]["holder"], first_id["this_node"], "{first_id}");
    let first_id = first_id["this_node"].as_str().expect("the serving node's id").to_owned();
    // Over HTTP/1.1 each answer closes its connection, so none is kept alive across a take-over;
    // without a credential the serving node's own refusal comes back.
    let mut probe = TcpStream::connect(second.addr).await.expect("the standby's port accepts");
    probe.write_all(b"GET /agent_api/v1/profile HTTP/1.1\r\nhost: nexus\r\n\r\n").await.expect("sent");
    let answer = read_response(&mut probe).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.to_lowercase().contains("connection: close"), "{answer}");
    closed_by_server(&mut probe, WAIT).await;
    let channel = Endpoint::from_shared(second.url()).expect("url").connect().await.expect("the standby speaks gRPC");
    let health = tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await
        .expect("the health service answers")
        .into_inner();
    assert_eq!(health.status(), tonic_health::pb::health_check_response::ServingStatus::Serving);
    let profile = AgentServiceClient::new(channel.clone())
        .get_profile(authed(GetProfileRequest::default(), &agent))
        .await
        .expect("the serving node answers through the standby");
    assert!(profile.into_inner().profile_json.contains("agent"), "the profile names its agent");
    let refused =
        AgentServiceClient::new(channel).get_profile(GetProfileRequest::default()).await.expect_err("no credential");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    // Only a standby may say it forwarded a request: one that claims it without the serving
    // node's key of this term is refused, and a client cannot borrow loopback that way.
    let spoofed = reqwest::Client::new()
        .get(format!("{}/agent_api/v1/cluster", first.url()))
        .bearer_auth(&agent.token)
        .header("nexus-forwarded", format!("key={};for=127.0.0.1;by=intruder", "0".repeat(64)))
        .send()
        .await
        .expect("an answer");
    assert_eq!(spoofed.status().as_u16(), 503);
    assert_eq!(spoofed.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));

    // The listing, asked on the active node, names both: one active, one standby.
    let listing = wait_until("the listing to show both nodes", WAIT, || {
        let (url, token) = (first.url(), agent.token.clone());
        async move {
            let answer = Http::new(&url, Some(&token)).get("/agent_api/v1/cluster").await;
            assert_eq!(answer.status, 200, "{:?}", answer.body);
            (answer.body["nodes"].as_array().map_or(0, Vec::len) == 2).then_some(answer.body)
        }
    })
    .await;
    let nodes = listing["nodes"].as_array().expect("nodes");
    let active: Vec<_> = nodes.iter().filter(|node| node["role"] == "active").collect();
    assert_eq!(active.len(), 1, "{listing}");
    assert_eq!(active[0]["this_node"], true, "{listing}");
    assert_eq!(active[0]["pid"], i64::from(pid), "{listing}");
    assert_eq!(listing["lease"]["holder"], active[0]["node_id"], "{listing}");
    assert!(active[0]["owns"]["executions"].is_i64(), "{listing}");
    let standby: Vec<_> = nodes.iter().filter(|node| node["role"] == "standby").collect();
    assert_eq!(standby.len(), 1, "{listing}");
    assert!(standby[0]["owns"].is_null(), "{listing}");
    assert_eq!(standby[0]["alive"], true, "{listing}");
    assert_eq!(
        (active[0]["settings_match"].as_bool(), standby[0]["settings_match"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(standby[0]["lease_ms"], active[0]["lease_ms"], "{listing}");
    assert_ne!(standby[0]["providers_digest"], active[0]["providers_digest"], "{listing}");

    // A runner-agent given only the standby's address: its stream is forwarded to the serving
    // node, and an execution admitted through the standby runs on it.
    let workdir = tempfile::tempdir().expect("workdir");
    let _runner_agent = runner_spec(dir.path(), second.url(), &runner, workdir.path()).spawn();
    announced(&at, &runner).await;
    let run = run_one_execution(&second.url(), &agent, &runner, workdir.path()).await;
    // Its event stream, followed through the standby over HTTP/1.1, is the serving node's: every
    // frame, in order, ending at the completion; resumed from a cursor, only what came after.
    let stream = format!("{}/agent_api/v1/executions/{run}/events/stream", second.url());
    let follow = |last: Option<String>| {
        let mut request = reqwest::Client::new().get(&stream).bearer_auth(&agent.token);
        if let Some(last) = last {
            request = request.header("last-event-id", last);
        }
        async move {
            let answer = tokio::time::timeout(WAIT, request.send()).await.expect("in time").expect("followed");
            assert_eq!(answer.status().as_u16(), 200);
            let body = tokio::time::timeout(WAIT, answer.text()).await.expect("the stream ends").expect("body");
            body.lines().filter_map(|line| line.strip_prefix("id:").map(|id| id.trim().to_owned())).collect::<Vec<_>>()
        }
    };
    let ids = follow(None).await;
    assert!(ids.len() >= 3, "the followed stream carried its events: {ids:?}");
    let resumed = follow(Some(ids[1].clone())).await;
    assert_eq!(resumed, ids[2..], "resumed after the second cursor");
    assert!(
        !second.log().iter().any(|line| line.contains("nexus serving")),
        "the standby served beside the active node"
    );

    // The active node dies: the standby takes over within two terms and serves the store.
    let generation = listing["lease"]["generation"].as_i64().expect("generation");
    let killed = Instant::now();
    first.sigkill().await;
    second
        .wait_for_log("the take-over", Duration::from_millis(4 * LEASE_MS), |line| line.contains("nexus serving"))
        .await;
    let took = killed.elapsed();
    eprintln!("fail-over took {took:?}");
    // The take-over names the node whose term ran out.
    assert_eq!(listing["lease"]["holder"], first_id.as_str(), "{listing}");
    second
        .wait_for_log("the take-over's origin", WAIT, |line| {
            line.contains("whose term ran out") && line.contains(&first_id)
        })
        .await;
    assert!(took < Duration::from_millis(2 * LEASE_MS), "fail-over took {took:?}, over two terms");
    let listing = Http::new(&second.url(), Some(&agent.token)).get("/agent_api/v1/cluster").await.body;
    assert_eq!(listing["lease"]["holder"], listing["this_node"], "{listing}");
    assert_eq!(listing["lease"]["generation"], generation + 1, "{listing}");

    // The same runner-agent reconnects to the node it was given, which serves now.
    run_one_execution(&second.url(), &agent, &runner, workdir.path()).await;
    let exit = second.sigterm(Duration::from_secs(20)).await;
    assert!(exit.success(), "the second node exited {exit}");
}

#[tokio::test]
async fn a_stopped_standby_ends_the_follows_it_forwards_with_a_last_word() {
    if test_store_backend() != StoreBackend::Postgres {
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let (at, _database) = store_location(dir.path(), "data").await;
    // A model that asks the person a question: the execution waits, live, with nothing to run.
    let script = dir.path().join("ask.json");
    let rounds =
        json!({"rounds": [{"tool_calls": [{"id": "q", "name": "ask", "arguments": {"prompt": "Still there?"}}]}]});
    std::fs::write(&script, rounds.to_string()).expect("script");
    let config = dir.path().join("ask.toml");
    let text = format!(
        "[cluster]\nlease_ms = {LEASE_MS}\n\n[providers.scripted]\nkind = \"scripted\"\n\n[providers.scripted.models.ask]\nscript = {:?}\n",
        script.display().to_string()
    );
    std::fs::write(&config, text).expect("config");
    let first = NexusProcess::serve(&at, free_loopback_addr(), &config).await;
    let agent = admin_agent(&at, "agent").await;
    let data_dir = dir.path().join("second");
    std::fs::create_dir(&data_dir).expect("data dir");
    let second_at = StoreLocation { data_dir, database_url: at.database_url.clone() };
    let second = NexusProcess::standby(&second_at, free_loopback_addr(), &config).await;
    let http = Http::new(&first.url(), Some(&agent.token));
    let body = json!({"configuration": {"approval_mode": "bypass", "default_model": "scripted/ask",
                                        "kernel_tools": ["nexus.human.ask"]}});
    assert_eq!(http.declare(&body).await.status, 200);
    let admitted = http.post("/agent_api/v1/inputs", &json!({"text": "wait for me"})).await;
    assert_eq!(admitted.status, 201, "{admitted:?}");
    let run = admitted.body["execution_public_id"].as_str().expect("execution").to_owned();

    // Followed through the standby, on HTTP and on gRPC, up to the question.
    let stream = format!("{}/agent_api/v1/executions/{run}/events/stream", second.url());
    let mut followed = reqwest::Client::new().get(&stream).bearer_auth(&agent.token).send().await.expect("followed");
    assert_eq!(followed.status().as_u16(), 200);
    let mut sse = String::new();
    while !sse.contains("event: input_required") {
        let chunk = tokio::time::timeout(WAIT, followed.chunk()).await.expect("in time").expect("read");
        sse.push_str(&String::from_utf8_lossy(&chunk.expect("the question comes")));
    }
    let mut client = grpc(&second.url()).await;
    let request = nexus_proto::agent::v1::StreamEventsRequest {
        execution_public_id: run.clone(),
        after: String::new(),
        follow: true,
        transcript: false,
        progress: false,
    };
    let mut events = client.stream_events(authed(request, &agent)).await.expect("follow").into_inner();
    loop {
        let event = tokio::time::timeout(WAIT, events.message()).await.expect("in time").expect("an event");
        if event.expect("open").r#type == "input_required" {
            break;
        }
    }

    // The standby stops: each follow it carries ends with a last word, not a broken stream.
    let exit = second.sigterm(Duration::from_secs(20)).await;
    assert!(exit.success(), "the standby exited {exit}");
    loop {
        match tokio::time::timeout(WAIT, followed.chunk()).await.expect("in time") {
            Ok(Some(chunk)) => sse.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(None) => break,
            Err(error) => panic!("the follow broke instead of ending: {error}; read:\n{sse}"),
        }
    }
    let last = sse.split("\n\n").filter(|block| block.contains("event:")).last().expect("events");
    assert!(last.contains("event: error") && last.contains("\"code\":\"unavailable\""), "{last}");
    assert!(last.contains("is stopping"), "{last}");
    let ended = loop {
        match tokio::time::timeout(WAIT, events.message()).await.expect("in time") {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the gRPC follow ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
    assert_eq!(nexus_proto::Refusal::from_status(&ended).code, nexus_proto::ErrorCode::Unavailable);
    assert!(ended.message().contains("is stopping"), "{ended:?}");
    let exit = first.sigterm(Duration::from_secs(20)).await;
    assert!(exit.success(), "the serving node exited {exit}");
}

#[tokio::test]
async fn a_standby_polls_a_live_lease_without_locking_it() {
    if test_store_backend() != StoreBackend::Postgres {
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let (at, _database) = store_location(dir.path(), "data").await;
    let config = config_file(dir.path(), &format!("[cluster]\nlease_ms = {LEASE_MS}\n"));
    let first = NexusProcess::serve(&at, free_loopback_addr(), &config).await;
    let url = at.database_url.clone().expect("postgres");
    // A write of the serving node in flight holds the lease row FOR KEY SHARE (its fence). A
    // standby's poll of a live lease takes no lock that conflicts with it: it reads the holder
    // at once, and so never holds a lock the serving node's writes would wait on (a standby
    // frozen mid-poll used to stall them until the holder lost its lease).
    let mut writer = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut writer).await.expect("begin");
    sqlx::query("SELECT generation FROM cluster_lease WHERE name = 'serve' FOR KEY SHARE")
        .execute(&mut writer)
        .await
        .expect("the fence's lock");
    let data_dir = dir.path().join("second");
    std::fs::create_dir(&data_dir).expect("data dir");
    let second_at = StoreLocation { data_dir, database_url: Some(url) };
    let second = NexusProcess::standby(&second_at, free_loopback_addr(), &config).await;
    // It has read the holder while the lock is held (its first poll would have waited on the
    // lock otherwise), and no node waits on the row now.
    let locked: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name LIKE 'nexus node%' AND wait_event_type = 'Lock'",
    )
    .fetch_one(&mut writer)
    .await
    .expect("activity");
    assert_eq!(locked, 0, "a node waits on the lease row's lock");
    sqlx::query("COMMIT").execute(&mut writer).await.expect("commit");
    assert!(!second.log().iter().any(|line| line.contains("nexus serving")), "the standby took a live lease");
    assert!(!first.log().iter().any(|line| line.contains("lost the serve lease")), "{}", first.log().join("\n"));
    let _ = sqlx::Connection::close(writer).await;
    let exit = second.sigterm(Duration::from_secs(20)).await;
    assert!(exit.success(), "the standby exited {exit}");
    let exit = first.sigterm(Duration::from_secs(20)).await;
    assert!(exit.success(), "the serving node exited {exit}");
}

#[tokio::test]
async fn a_standby_hears_a_stopped_node_give_the_lease_up_and_takes_over_at_once() {
    if test_store_backend() != StoreBackend::Postgres {
        return;
    }
    // The longest term: a standby polls only every 15 s, so a take-over within a few seconds of
    // the holder's exit comes from the notification, as the standby's log says.
    let dir = tempfile::tempdir().expect("dir");
    let (at, _database) = store_location(dir.path(), "data").await;
    let config = config_file(dir.path(), "[cluster]\nlease_ms = 60000\n");
    let first = NexusProcess::serve(&at, free_loopback_addr(), &config).await;
    let data_dir = dir.path().join("second");
    std::fs::create_dir(&data_dir).expect("data dir");
    let second_at = StoreLocation { data_dir, database_url: at.database_url.clone() };
    let second = NexusProcess::standby(&second_at, free_loopback_addr(), &config).await;
    second
        .wait_for_log("the standby to listen", WAIT, |line| {
            line.contains("listening for the serve lease to change hands")
        })
        .await;
    let exit = first.sigterm(Duration::from_secs(20)).await;
    assert!(exit.success(), "the first node exited {exit}");
    let stopped = Instant::now();
    second.wait_for_log("the take-over", WAIT, |line| line.contains("nexus serving")).await;
    let took = stopped.elapsed();
    let log = second.log().join("\n");
    assert!(log.contains("heard that the serve lease changed hands"), "no notification was heard:\n{log}");
    assert!(log.contains("gave it up"), "{log}");
    assert!(took < Duration::from_secs(10), "the take-over took {took:?}, as long as a poll period");
    let exit = second.sigterm(Duration::from_secs(20)).await;
    assert!(exit.success(), "the second node exited {exit}");
}

#[tokio::test]
async fn a_node_whose_lease_is_taken_over_commits_nothing_and_stops_serving() {
    if test_store_backend() != StoreBackend::Postgres {
        // SQLite has no lease: its file lock is held until the process ends.
        return;
    }
    let server = TestServer::start_with(&[], |config| config.cluster.lease_ms = LEASE_MS).await;
    let agent = server.agent("agent").await;
    let member = Http::new(&server.url(), Some(&agent.token));
    assert_eq!(member.profile().await.status, 200);
    let url = server.config().store.database_url.expect("postgres");
    let lost = server.server.lock_lost();

    // Another node takes the lease over, as after this one froze past its term.
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await.expect("connect");
    let stolen = sqlx::query(
        "UPDATE cluster_lease SET holder = 'another-node', generation = generation + 1, \
         lease_until_ms = lease_until_ms + 600000 WHERE name = 'serve'",
    )
    .execute(&mut admin)
    .await
    .expect("take over");
    assert_eq!(stolen.rows_affected(), 1);
    let inputs_before: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM inputs").fetch_one(&mut admin).await.expect("count");

    // A write after the take-over is refused by the fence: nothing reaches the store.
    let declared =
        member.declare(&json!({"configuration": {"approval_mode": "bypass", "default_model": "scripted/none"}})).await;
    let posted = member.post("/agent_api/v1/inputs", &json!({"text": "after the take-over"})).await;
    assert_ne!(posted.status / 100, 2, "admitted after the take-over: {:?} (declare {})", posted.body, declared.status);
    let inputs_after: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM inputs").fetch_one(&mut admin).await.expect("count");
    assert_eq!(inputs_after, inputs_before, "a fenced node committed an input");

    let reason = tokio::time::timeout(Duration::from_millis(2 * LEASE_MS), lost)
        .await
        .expect("the node noticed within two terms");
    assert!(reason.contains("lease"), "{reason}");
    wait_until("the node to stop accepting", WAIT, || async {
        TcpStream::connect(server.server.addr).await.is_err().then_some(())
    })
    .await;
    let _ = sqlx::Connection::close(admin).await;
    server.shutdown().await;
}

#[tokio::test]
async fn the_cluster_listing_names_this_node_and_is_served_to_loopback_only() {
    let server =
        TestServer::start_with(&[], |config| config.cluster.advertise_address = Some("node1.internal:7740".into()))
            .await;
    let agent = server.agent("agent").await;
    let anonymous = Http::new(&server.url(), None).get("/agent_api/v1/cluster").await;
    assert_eq!(anonymous.status, 401, "{:?}", anonymous.body);
    let listing = Http::new(&server.url(), Some(&agent.token)).get("/agent_api/v1/cluster").await;
    assert_eq!(listing.status, 200, "{:?}", listing.body);
    let body = &listing.body;
    let nodes = body["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 1, "{body}");
    assert_eq!(nodes[0]["role"], "active", "{body}");
    assert_eq!(nodes[0]["this_node"], true, "{body}");
    assert_eq!(nodes[0]["node_id"], body["this_node"], "{body}");
    assert_eq!(nodes[0]["pid"], i64::from(std::process::id()), "{body}");
    assert_eq!(nodes[0]["address"], "node1.internal:7740", "the advertised address is listed: {body}");
    assert_eq!(nodes[0]["owns"]["runner_streams"], 0, "{body}");
    if test_store_backend() == StoreBackend::Postgres {
        assert_eq!(body["lease"]["holder"], body["this_node"], "{body}");
        assert!(body["lease"]["remaining_ms"].as_i64().is_some_and(|ms| ms > 0), "{body}");
    } else {
        assert!(body["lease"].is_null(), "{body}");
    }
    // The node id is kept in the data dir: the same id after a restart.
    let id = std::fs::read_to_string(server.config().data_dir.join("node-id")).expect("node-id");
    assert_eq!(id.lines().next(), body["this_node"].as_str(), "{id}");
    server.shutdown().await;
}
