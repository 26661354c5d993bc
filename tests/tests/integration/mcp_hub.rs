//! runner-agent's MCP hub against real MCP servers (`mcp-fixture`, written with rmcp's server
//! side): tools listed with their names and effect profiles, calls and results forwarded, MCP
//! errors as tool errors, a crashed or hung server taking only its own tools away and coming back
//! with backoff, `notifications/tools/list_changed`, several servers at once, a reloaded server
//! list, and the streamable-HTTP transport with headers from the environment (issue 15, item 2).

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use nexus_runner_agent::testing::mcp::{Hub, Server};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::time::Instant;

use nexus_tests::{mcp_fixture_binary, wait_until};

const WAIT: Duration = Duration::from_secs(30);
/// The tools every fixture lists before `grow`.
const FIXTURE_TOOLS: [&str; 9] = ["echo", "add", "fail", "protocol_error", "slow", "crash", "hang", "grow", "whoami"];

fn fixture(name: &str) -> Server {
    Server::stdio(name, vec![mcp_fixture_binary().display().to_string()])
}

fn names(tools: &[Value]) -> Vec<String> {
    tools.iter().filter_map(|tool| tool["name"].as_str().map(str::to_owned)).collect()
}

fn has(hub: &Hub, name: &str) -> bool {
    names(&hub.tools()).iter().any(|have| have == name)
}

async fn until_listed(hub: &Hub, name: &str) {
    wait_until(&format!("{name} to be listed"), WAIT, || async { has(hub, name).then_some(()) }).await;
}

/// Waits, change by change, until `name` is no longer listed.
async fn until_withdrawn(hub: &Hub, name: &str) {
    let mut changes = hub.subscribe();
    let deadline = Instant::now() + WAIT;
    while has(hub, name) {
        let changed = tokio::time::timeout_at(deadline, changes.changed()).await;
        assert!(matches!(changed, Ok(Ok(()))), "{name} was never withdrawn");
    }
}

async fn call(hub: &Hub, name: &str, input: Value) -> Value {
    hub.call(name, input, None).await.unwrap_or_else(|| panic!("{name} is not an MCP tool"))
}

/// The fixture's `whoami` through the tool `<prefix>_whoami`.
async fn whoami(hub: &Hub, prefix: &str) -> Value {
    let body = call(hub, &format!("{prefix}_whoami"), json!({})).await;
    assert_eq!(body["is_error"], false, "{body}");
    body["structured_content"].clone()
}

fn pid_of(who: &Value) -> i32 {
    who["pid"].as_i64().and_then(|pid| i32::try_from(pid).ok()).expect("a pid")
}

/// Gone, or a zombie nobody has reaped yet: either way it runs no more.
fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

async fn until_dead(pid: i32, what: &str) {
    wait_until(what, WAIT, || async { dead(pid).then_some(()) }).await;
}

fn dirs() -> (tempfile::TempDir, tempfile::TempDir) {
    (tempfile::tempdir().expect("workdir"), tempfile::tempdir().expect("state dir"))
}

fn canonical(path: &Path) -> String {
    path.canonicalize().expect("canonical").display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_listed_with_their_profiles_and_calls_are_forwarded() {
    let (workdir, state) = dirs();
    let mut server = fixture("fx");
    server.timeout_ms = 7_000;
    server.max_concurrency = Some(3);
    let lookup_default = json!({"kind": "read_only", "destructive": false, "effect_scope": "closed", "idempotency": "intrinsic", "reconciliation": "lookup"});
    server.default_effect_profile = Some(lookup_default.clone());
    let hub = Hub::start(vec![server], workdir.path(), state.path());
    until_listed(&hub, "fx_whoami").await;

    let tools = hub.tools();
    let expected: Vec<String> = FIXTURE_TOOLS.iter().map(|tool| format!("fx_{tool}")).collect();
    assert_eq!(names(&tools), expected);
    let tool = |name: &str| tools.iter().find(|tool| tool["name"] == name).cloned().expect(name);
    let echo = tool("fx_echo");
    assert_eq!(echo["description"], "Answer the text");
    assert_eq!(echo["input_schema"]["required"], json!(["text"]));
    assert_eq!(echo["timeout_ms"], 7_000);
    assert_eq!(echo["max_concurrency"], 3);
    // readOnlyHint, and openWorldHint left at its MCP default (true).
    assert_eq!(
        echo["effect_profile"],
        json!({"kind": "read_only", "destructive": false, "effect_scope": "open", "idempotency": "intrinsic", "reconciliation": "none"})
    );
    assert_eq!(
        tool("fx_add")["effect_profile"],
        json!({"kind": "write", "destructive": false, "effect_scope": "closed", "idempotency": "intrinsic", "reconciliation": "none"})
    );
    // No annotations: the server's declared default.
    assert_eq!(tool("fx_fail")["effect_profile"], lookup_default);
    assert_eq!(tool("fx_fail")["input_schema"], json!({"type": "object"}));

    let echo = call(&hub, "fx_echo", json!({"text": "héllo"})).await;
    assert_eq!(echo, json!({"content": "héllo", "structured_content": null, "is_error": false}));
    let add = call(&hub, "fx_add", json!({"a": 2, "b": 3.5})).await;
    assert_eq!(add["content"], "the sum is 5.5");
    assert_eq!(add["structured_content"], json!({"sum": 5.5}));
    assert_eq!(add["is_error"], false);
    let fail = call(&hub, "fx_fail", json!({})).await;
    assert_eq!((fail["content"].as_str(), fail["is_error"].as_bool()), (Some("failed on purpose"), Some(true)));
    // A JSON-RPC error is a tool error the model reads, naming the server.
    let refused = call(&hub, "fx_protocol_error", json!({})).await;
    assert_eq!(refused["is_error"], true);
    let text = refused["content"].as_str().unwrap_or_default();
    assert!(text.contains("MCP server fx") && text.contains("the fixture refuses"), "{text}");
    assert!(hub.call("fx_nope", json!({}), None).await.is_none(), "an unknown name is not the hub's");

    // The child runs in the workdir, leads its own process group, and carries the owner mark.
    let who = whoami(&hub, "fx").await;
    assert_eq!(who["pgid"], who["pid"]);
    assert_eq!(who["owner"].as_str(), Some(hub.owner_mark().as_str()));
    assert_eq!(who["cwd"].as_str(), Some(canonical(workdir.path()).as_str()));

    // A task timeout shorter than the server's ends the call, and a server that still answers
    // pings is not restarted for it: its tools do not change over several ping rounds (200 ms).
    let mut changes = hub.subscribe();
    changes.borrow_and_update();
    let started = Instant::now();
    let slow = hub.call("fx_slow", json!({"ms": 20_000}), Some(300)).await.expect("mcp tool");
    assert!(started.elapsed() >= Duration::from_millis(300) && started.elapsed() < Duration::from_secs(10));
    assert_eq!(slow["is_error"], true);
    assert!(slow["content"].as_str().is_some_and(|text| text.contains("within its timeout of 300 ms")), "{slow}");
    let changed = tokio::time::timeout(Duration::from_millis(1_500), changes.changed()).await;
    assert!(changed.is_err(), "the tools changed after a slow call: {:?}", names(&hub.tools()));
    assert_eq!(pid_of(&whoami(&hub, "fx").await), pid_of(&who), "a slow call restarted a healthy server");

    // A canceled call is abandoned at once, and the server hears of it (notifications/cancelled).
    let marker = workdir.path().join("slow.marker");
    let started = Instant::now();
    let canceled = hub
        .call_until(
            "fx_slow",
            json!({"ms": 20_000, "marker": "slow.marker"}),
            None,
            tokio::time::sleep(Duration::from_millis(200)),
        )
        .await
        .expect("mcp tool");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(canceled["is_error"], true);
    assert!(canceled["content"].as_str().is_some_and(|text| text.contains("canceled")), "{canceled}");
    wait_until("the server to see the cancellation", WAIT, || async {
        std::fs::read_to_string(&marker).ok().filter(|word| word == "cancelled")
    })
    .await;

    let pid = pid_of(&who);
    hub.shutdown().await;
    until_dead(pid, "the fixture to be stopped by shutdown").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_server_takes_only_its_tools_and_comes_back() {
    let (workdir, state) = dirs();
    let hub = Hub::start(vec![fixture("a"), fixture("b")], workdir.path(), state.path());
    until_listed(&hub, "a_whoami").await;
    until_listed(&hub, "b_whoami").await;
    assert_eq!(hub.tools().len(), 2 * FIXTURE_TOOLS.len());
    let first = pid_of(&whoami(&hub, "a").await);
    let b_pid = pid_of(&whoami(&hub, "b").await);

    let crashed = call(&hub, "a_crash", json!({})).await;
    assert_eq!(crashed["is_error"], true);
    assert!(crashed["content"].as_str().is_some_and(|text| text.contains("MCP server a")), "{crashed}");
    until_withdrawn(&hub, "a_echo").await;
    // Only a's tools went away; b's keep working meanwhile.
    assert!(has(&hub, "b_echo"));
    let echo = call(&hub, "b_echo", json!({"text": "still here"})).await;
    assert_eq!(echo["content"], "still here");

    until_listed(&hub, "a_echo").await;
    let second = pid_of(&whoami(&hub, "a").await);
    assert_ne!(first, second, "a was restarted as a new process");
    assert!(dead(first));
    assert_eq!(call(&hub, "a_echo", json!({"text": "back"})).await["content"], "back");
    assert_eq!(pid_of(&whoami(&hub, "b").await), b_pid, "b was never restarted");
    assert_eq!(hub.tools().len(), 2 * FIXTURE_TOOLS.len());

    // Killed from outside (not through a call): the same.
    nix_kill(second);
    until_withdrawn(&hub, "a_echo").await;
    until_listed(&hub, "a_echo").await;
    assert_ne!(pid_of(&whoami(&hub, "a").await), second);

    hub.shutdown().await;
    until_dead(b_pid, "b to be stopped by shutdown").await;
}

/// SIGKILL, through the `kill` program (the tests crate has no signal bindings of its own).
fn nix_kill(pid: i32) {
    let status = std::process::Command::new("kill").arg("-KILL").arg(pid.to_string()).status().expect("kill runs");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_fails_the_call_at_its_timeout_and_is_restarted() {
    let (workdir, state) = dirs();
    let mut hung = fixture("h");
    hung.timeout_ms = 300;
    let hub = Hub::start(vec![hung, fixture("ok")], workdir.path(), state.path());
    until_listed(&hub, "h_hang").await;
    until_listed(&hub, "ok_echo").await;
    let first = pid_of(&whoami(&hub, "h").await);

    let started = Instant::now();
    let body = call(&hub, "h_hang", json!({})).await;
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(5), "the call took {took:?}");
    assert_eq!(body["is_error"], true);
    let text = body["content"].as_str().unwrap_or_default();
    assert!(text.contains("MCP server h") && text.contains("within its timeout of 300 ms"), "{text}");
    // No answer to a ping: withdrawn, killed, and started again.
    until_withdrawn(&hub, "h_echo").await;
    assert!(has(&hub, "ok_echo"));
    assert_eq!(call(&hub, "ok_echo", json!({"text": "fine"})).await["content"], "fine");
    until_dead(first, "the hung server to be killed").await;
    until_listed(&hub, "h_echo").await;
    let second = whoami(&hub, "h").await;
    assert_ne!(pid_of(&second), first);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_announces_the_new_tool() {
    let (workdir, state) = dirs();
    let hub = Hub::start(vec![fixture("x")], workdir.path(), state.path());
    until_listed(&hub, "x_grow").await;
    assert!(!has(&hub, "x_extra"));
    let before = *hub.subscribe().borrow();
    assert!(hub.call("x_extra", json!({}), None).await.is_none(), "not announced yet");

    assert_eq!(call(&hub, "x_grow", json!({})).await["content"], "grown");
    until_listed(&hub, "x_extra").await;
    assert!(*hub.subscribe().borrow() > before, "the version went up");
    assert_eq!(hub.tools().len(), FIXTURE_TOOLS.len() + 1);
    assert_eq!(call(&hub, "x_extra", json!({})).await["content"], "extra!");
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_at_once_and_a_reloaded_list() {
    let (workdir, state) = dirs();
    let mut odd = fixture("c");
    odd.env.insert("FIXTURE_ODD_NAMES".to_owned(), "1".to_owned());
    let hub = Hub::start(vec![fixture("a"), fixture("b"), odd], workdir.path(), state.path());
    let all = 3 * FIXTURE_TOOLS.len() + 2;
    wait_until("three servers' tools", WAIT, || async { (hub.tools().len() == all).then_some(()) }).await;
    let tools = hub.tools();
    let listed = names(&tools);
    assert_eq!(listed.iter().collect::<HashSet<_>>().len(), listed.len(), "names are unique");
    // ^[a-zA-Z0-9_-]{1,64}$
    let fits = |name: &str| {
        (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    assert!(listed.iter().all(|name| fits(name)), "{listed:?}");
    let by_description = |description: &str| {
        tools
            .iter()
            .find(|tool| tool["description"] == description)
            .and_then(|tool| tool["name"].as_str())
            .map(str::to_owned)
    };
    let long = by_description("Echo, with a long name").expect("the long-named tool");
    assert_eq!(long.len(), 64, "{long}");
    assert!(long.starts_with("c_long_nnnn"), "{long}");
    let unicode = by_description("Echo, with a unicode name").expect("the unicode-named tool");
    assert_eq!(unicode, "c_a_adir_n_mero");
    // Calls go to the server's own names.
    assert_eq!(call(&hub, &long, json!({"text": "long"})).await["content"], "long");
    assert_eq!(call(&hub, &unicode, json!({"text": "ñ"})).await["content"], "ñ");
    assert_eq!(call(&hub, "c_add", json!({"a": 2, "b": 2})).await["structured_content"], json!({"sum": 4.0}));
    let a_pid = pid_of(&whoami(&hub, "a").await);
    let b_pid = pid_of(&whoami(&hub, "b").await);
    let c_pid = pid_of(&whoami(&hub, "c").await);

    // Reload: a unchanged, b changed (restarted), c removed, d added.
    let mut b = fixture("b");
    b.timeout_ms = 9_000;
    hub.reconfigure(vec![fixture("a"), b, fixture("d")]).await;
    until_listed(&hub, "d_echo").await;
    until_listed(&hub, "b_echo").await;
    let listed = names(&hub.tools());
    assert!(!listed.iter().any(|name| name.starts_with("c_")), "c's tools are gone: {listed:?}");
    assert_eq!(listed.len(), 3 * FIXTURE_TOOLS.len());
    assert!(hub.call("c_echo", json!({"text": "x"}), None).await.is_none(), "a removed server's names are no one's");
    assert_eq!(pid_of(&whoami(&hub, "a").await), a_pid, "an unchanged server keeps its connection");
    assert_ne!(pid_of(&whoami(&hub, "b").await), b_pid, "a changed server is restarted");
    assert!(hub.tools().iter().any(|tool| tool["name"] == "b_echo" && tool["timeout_ms"] == 9_000));
    until_dead(b_pid, "the old b to be stopped").await;
    until_dead(c_pid, "the removed c to be stopped").await;

    let d_pid = pid_of(&whoami(&hub, "d").await);
    hub.shutdown().await;
    for pid in [a_pid, d_pid] {
        until_dead(pid, "every server to be stopped by shutdown").await;
    }
}

/// Starts `mcp-fixture --http` and reads the URL it prints.
async fn http_fixture() -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(mcp_fixture_binary())
        .arg("--http")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the http fixture starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let url = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("the http fixture prints its url in time")
        .expect("stdout readable")
        .expect("a url line");
    (child, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_transport_lists_calls_and_sends_headers_from_the_environment() {
    let (workdir, state) = dirs();
    let (mut child, url) = http_fixture().await;
    // The header's value comes from a variable of this process (tests may not set any).
    let (var, value) = ["CARGO_PKG_NAME", "PATH", "HOME"]
        .iter()
        .find_map(|var| std::env::var(var).ok().map(|value| ((*var).to_owned(), value)))
        .expect("some environment variable");
    let mut good = Server::http("web", &url);
    good.headers_from_env.insert("x-fixture-token".to_owned(), var);
    let mut unset = Server::http("nokey", &url);
    unset.headers_from_env.insert("x-fixture-token".to_owned(), "NEXUS_H2_TEST_VARIABLE_NOBODY_SETS".to_owned());
    let hub = Hub::start(vec![good, unset], workdir.path(), state.path());
    until_listed(&hub, "web_echo").await;
    assert!(!has(&hub, "nokey_echo"), "a server whose header variable is unset does not connect");

    assert_eq!(call(&hub, "web_echo", json!({"text": "over http"})).await["content"], "over http");
    let add = call(&hub, "web_add", json!({"a": 1, "b": 2})).await;
    assert_eq!(add["structured_content"], json!({"sum": 3.0}));
    let who = whoami(&hub, "web").await;
    assert_eq!(who["token"].as_str(), Some(value.as_str()), "the header carried the variable's value");
    assert_eq!(call(&hub, "web_fail", json!({})).await["is_error"], true);

    // The server goes away: its tools are withdrawn (pings fail), and stay so while it is down.
    child.kill().await.expect("kill the http fixture");
    until_withdrawn(&hub, "web_echo").await;
    let gone = call(&hub, "web_echo", json!({"text": "x"})).await;
    assert_eq!(gone["is_error"], true);
    assert!(gone["content"].as_str().is_some_and(|text| text.contains("MCP server web")), "{gone}");
    hub.shutdown().await;
}
