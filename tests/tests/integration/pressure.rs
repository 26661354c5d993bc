//! A runner-agent against a nexus out of file descriptors (issue 9's cut-stream failure, whose
//! runner said nothing after it lost its stream): `nexus serve` runs under a low `ulimit -n`, and
//! idle connections held against it use up what is left, so it cannot accept. runner-agent's
//! connections then sit in the listen backlog and are never answered. Each attempt must still end
//! at its bound, be logged with its reason, and be followed by the next one; nexus must say it
//! cannot accept, without spinning; and once the idle connections go, the runner connects.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpStream;

use nexus_actors::store::StoreBackend;
use nexus_tests::processes::{NexusProcess, RunnerAgentProcess, StoreLocation, admin_runner, free_loopback_addr};
use nexus_tests::{TestDatabase, test_store_backend, wait_until};

const WAIT: Duration = Duration::from_secs(60);
/// Low enough that a few hundred idle sockets exhaust it, high enough for nexus to start on either
/// store (the PostgreSQL pool holds up to 16 connections).
const FD_LIMIT: u64 = 128;
const FAILED_ATTEMPT: &str = "could not open the stream to nexus";

fn lines_with(log: &Arc<Mutex<Vec<String>>>, needle: &str) -> Vec<String> {
    log.lock().expect("log").iter().filter(|line| line.contains(needle)).cloned().collect()
}

async fn store_location(dir: &Path) -> (StoreLocation, Option<TestDatabase>) {
    let data_dir = dir.join("data");
    std::fs::create_dir(&data_dir).expect("data dir");
    let database = match test_store_backend() {
        StoreBackend::Postgres => Some(TestDatabase::create().await),
        _ => None,
    };
    (StoreLocation { data_dir, database_url: database.as_ref().map(|d| d.url().to_owned()) }, database)
}

#[tokio::test]
async fn a_runner_keeps_trying_and_logging_while_nexus_cannot_accept_and_connects_once_it_can() {
    let dir = tempfile::tempdir().expect("dir");
    let (at, _database) = store_location(dir.path()).await;
    let config = dir.path().join("nexus.toml");
    // A cap above the descriptor limit and deadlines far off: an operator's misconfiguration,
    // the one way nexus still runs out of descriptors (the default cap, 3/4 of `ulimit -n`, and
    // the first-byte bound would shed or close these idle sockets first; `resources.rs` pins
    // that).
    std::fs::write(
        &config,
        "[connections]\nmax_connections = 100000\nfirst_byte_timeout_ms = 600000\n\
         request_head_timeout_ms = 600000\nidle_timeout_ms = 600000\n",
    )
    .expect("config");
    let nexus = NexusProcess::serve_with_fd_limit(&at, free_loopback_addr(), &config, FD_LIMIT).await;
    let runner = admin_runner(&at, "worker").await;

    // Idle connections until nexus says it cannot accept: each accepted one holds a descriptor.
    let mut idle = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while lines_with_log(&nexus, "cannot accept connections").is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "nexus never ran out; log:\n{}", nexus.log().join("\n"));
        if idle.len() < 2 * usize::try_from(FD_LIMIT).expect("small") {
            idle.push(
                TcpStream::connect(nexus.addr)
                    .await
                    .expect("the backlog takes the connection (this test holds up to 256 sockets itself)"),
            );
        } else {
            // Every connection is made; poll for nexus's log line.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let workdir = tempfile::tempdir().expect("workdir");
    let state = tempfile::tempdir().expect("state");
    let spec = RunnerAgentProcess {
        nexus_url: nexus.url(),
        token_file: dir.path().join("token"),
        runner: runner.clone(),
        workdir: workdir.path().to_owned(),
        state_dir: state.path().to_owned(),
        tool_timeout_ms: 60_000,
    };
    let (_child, log) = spec.spawn_logged(&["--connect-timeout-ms", "500", "--handshake-timeout-ms", "500"]);
    // Every attempt ends at its bound and is logged with its reason, and the next one follows.
    wait_until("three failed attempts, each logged", WAIT, || async {
        (lines_with(&log, FAILED_ATTEMPT).len() >= 3).then_some(())
    })
    .await;
    let failed = lines_with(&log, FAILED_ATTEMPT);
    assert!(
        failed.iter().all(|line| line.contains("within 500ms")),
        "each failure names the bound it hit: {failed:#?}"
    );
    let connected = lines_with(&log, "connected to nexus");
    assert!(connected.is_empty(), "nothing could connect: {connected:#?}");
    let warned = lines_with_log(&nexus, "cannot accept connections");
    assert_eq!(warned.len(), 1, "nexus warns once per outage, not once per retry: {warned:#?}");

    // The pressure goes: the runner connects on a later attempt.
    drop(idle);
    wait_until("the runner to connect", WAIT, || async {
        (!lines_with(&log, "connected to nexus").is_empty()).then_some(())
    })
    .await;
    wait_until("nexus to say it accepts again", WAIT, || async {
        (!lines_with_log(&nexus, "accepting connections again").is_empty()).then_some(())
    })
    .await;
    wait_until("the announcement to be accepted", WAIT, || async {
        (!lines_with(&log, "nexus accepted the announcement").is_empty()).then_some(())
    })
    .await;
    let _ = nexus.sigterm(Duration::from_secs(20)).await;
}

fn lines_with_log(nexus: &NexusProcess, needle: &str) -> Vec<String> {
    nexus.log().into_iter().filter(|line| line.contains(needle)).collect()
}
