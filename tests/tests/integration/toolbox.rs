//! The runner's toolbox end to end (issue 15): a real `runner-agent` serving tools from a tools
//! file (commands in any language, MCP servers) and its daily built-in tools, to a real server
//! whose scripted models call them (`docs/runner-tools.md`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::Child;

use nexus_proto::{ExecutionId, RunStatus};
use nexus_tests::processes::RunnerAgentProcess;
use nexus_tests::{Http, Minted, TestServer, wait_until};

const WAIT: Duration = Duration::from_secs(30);

const READ_ONLY: &str = r#"{ kind = "read_only", destructive = false, effect_scope = "closed", idempotency = "intrinsic", reconciliation = "none" }"#;

/// A server with scripted models, one Agent, and a runner-agent serving a tools file.
struct Bed {
    server: TestServer,
    http: Http,
    runner: Minted,
    dirs: tempfile::TempDir,
    child: Option<Child>,
    log: Option<std::sync::Arc<std::sync::Mutex<Vec<String>>>>,
}

impl Bed {
    async fn start(scripts: &[(&str, Value)]) -> Bed {
        let server = TestServer::start(scripts).await;
        let agent = server.agent("agent").await;
        let runner = server.runner("worker").await;
        let http = Http::new(&server.url(), Some(&agent.token));
        let dirs = tempfile::tempdir().expect("dirs");
        for dir in ["work", "state", "tools"] {
            std::fs::create_dir_all(dirs.path().join(dir)).expect("dir");
        }
        Bed { server, http, runner, dirs, child: None, log: None }
    }

    fn workdir(&self) -> PathBuf {
        self.dirs.path().join("work")
    }

    fn tools_dir(&self) -> PathBuf {
        self.dirs.path().join("tools")
    }

    fn tools_file(&self) -> PathBuf {
        self.tools_dir().join("tools.toml")
    }

    /// Writes `name` next to the tools file.
    fn write_tool_file(&self, name: &str, text: &str) {
        std::fs::write(self.tools_dir().join(name), text).expect("tool file");
    }

    /// Starts runner-agent with the tools file and waits until nexus stores an announcement that
    /// serves every tool in `expect`.
    async fn spawn(&mut self, expect: &[&str]) {
        let process = RunnerAgentProcess {
            nexus_url: self.server.url(),
            runner: self.runner.clone(),
            token_file: self.dirs.path().join("token"),
            workdir: self.workdir(),
            state_dir: self.dirs.path().join("state"),
            tool_timeout_ms: 30_000,
        };
        let tools_file = self.tools_file();
        let (child, log) =
            process.spawn_announced(&self.server, &["--tools-file", tools_file.to_str().expect("utf-8 path")]).await;
        self.child = Some(child);
        self.log = Some(log);
        self.served(expect).await;
    }

    /// The announced tool names, once every name in `expect` is among them.
    async fn served(&self, expect: &[&str]) -> Vec<String> {
        wait_until(&format!("the runner to announce {expect:?}"), WAIT, || async {
            let names = self.announced_names().await;
            expect.iter().all(|name| names.iter().any(|n| n == name)).then_some(names)
        })
        .await
    }

    async fn announced_names(&self) -> Vec<String> {
        let row = self.server.store().executor(self.runner.runner()).await.ok().flatten();
        let tools = row.map(|row| row.announcement["tools"].clone()).unwrap_or(Value::Null);
        tools
            .as_array()
            .map(|tools| tools.iter().filter_map(|t| t["name"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    }

    fn log_has(&self, needle: &str) -> bool {
        self.log.as_ref().is_some_and(|log| log.lock().expect("log").iter().any(|line| line.contains(needle)))
    }

    async fn declare(&self, model: &str, extra: Value) {
        let mut configuration = json!({
            "runner_executor_public_ids": [self.runner.id], "approval_mode": "bypass", "default_model": model,
        });
        if let (Some(configuration), Value::Object(extra)) = (configuration.as_object_mut(), extra) {
            configuration.extend(extra);
        }
        let declared = self.http.declare(&json!({ "configuration": configuration })).await;
        assert_eq!(declared.status, 200, "{declared:?}");
    }

    async fn turn(&self, text: &str) -> ExecutionId {
        let admitted = self.http.post("/agent_api/v1/inputs", &json!({"text": text})).await;
        assert_eq!(admitted.status, 201, "{admitted:?}");
        admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("execution id")
    }

    async fn ended(&self, run: ExecutionId) -> nexus_actors::store::ExecutionRow {
        self.server.settled(run, WAIT).await
    }

    /// Sends SIGHUP to runner-agent.
    async fn sighup(&self) {
        let pid = self.child.as_ref().and_then(Child::id).expect("runner-agent runs");
        let status = tokio::process::Command::new("kill").args(["-HUP", &pid.to_string()]).status().await;
        assert!(status.is_ok_and(|status| status.success()), "kill -HUP {pid}");
    }
}

/// A word counter in Python: reads the call's input from stdin and answers a structured result.
const WORDCOUNT_PY: &str = r#"
import json, os, sys
call = json.load(sys.stdin)
assert json.loads(os.environ["NEXUS_TOOL_INPUT"]) == call, "the small input is in the environment too"
words = len(call["text"].split())
print(json.dumps({"content": f"words: {words}", "structured_content": {"words": words, "tool": os.environ["NEXUS_TOOL_NAME"]}}))
"#;

/// A stop hook in Python: asks for one more round the first time, then accepts. It counts its
/// calls in a file of the workdir (its working directory).
const REVIEW_PY: &str = r#"
import json, os, sys
event = json.load(sys.stdin)
seen = int(open("reviews").read()) if os.path.exists("reviews") else 0
open("reviews", "w").write(str(seen + 1))
if seen == 0:
    decision = {"continue": True, "feedback": "add detail: " + event["output_preview"]}
else:
    decision = {"continue": False}
print(json.dumps({"content": json.dumps(decision), "structured_content": decision}))
"#;

fn python_tools_file() -> String {
    format!(
        r#"
[[tool]]
name = "wordcount"
description = "Count the words of a text."
command = ["python3", "wordcount.py"]
timeout_ms = 20000
input_schema = {{ type = "object", properties = {{ text = {{ type = "string" }} }}, required = ["text"] }}
effect_profile = {READ_ONLY}

[[tool]]
name = "review"
description = "Review a candidate answer (a stop hook)."
command = ["python3", "review.py"]
effect_profile = {READ_ONLY}
"#
    )
}

#[tokio::test]
async fn a_python_command_tool_answers_structured_content_and_serves_as_a_stop_hook() {
    let count = json!({"rounds": [
        {"tool_calls": [{"id": "wc", "name": "wordcount", "arguments": {"text": "one two three"}}]},
        {"final": "words={{tool:wc.words}}"}
    ]});
    let echo = json!({"rounds": [{"final": "draft: {{input}}"}]});
    let mut bed = Bed::start(&[("count", count), ("echo", echo)]).await;
    bed.write_tool_file("tools.toml", &python_tools_file());
    bed.write_tool_file("wordcount.py", WORDCOUNT_PY);
    bed.write_tool_file("review.py", REVIEW_PY);
    bed.spawn(&["wordcount", "review", "bash"]).await;

    // A model calls the Python tool; its structured result is kept, its content read.
    bed.declare("scripted/count", json!({})).await;
    let run = bed.turn("count these").await;
    let row = bed.ended(run).await;
    assert_eq!((row.status, row.final_text.as_deref()), (RunStatus::Completed, Some("words=3")), "{row:?}");
    let task = bed.server.store().task(run, nexus_tests::key("r1t0")).await.expect("task").expect("row");
    let result = task.result.expect("a result");
    assert_eq!(result["structured_content"], json!({"words": 3, "tool": "wordcount"}), "{result}");
    assert_eq!(result["is_error"], false);

    // The same runner's Python script as the stop hook: it continues once, then accepts.
    bed.declare(
        "scripted/echo",
        json!({"lifecycle_hooks": {"stop": {"tool": "review", "timeout_ms": 20_000, "max_continuations": 2}}}),
    )
    .await;
    let run = bed.turn("first ask").await;
    let row = bed.ended(run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert_eq!(row.final_text.as_deref(), Some("draft: add detail: draft: first ask"));
    assert_eq!(row.round, 2, "one continuation, then accepted");
    assert_eq!(std::fs::read_to_string(bed.workdir().join("reviews")).expect("reviews"), "2");
}

#[tokio::test]
async fn the_tools_file_is_announced_again_on_sighup_and_on_change_and_a_bad_one_keeps_the_old_tools() {
    let mut bed = Bed::start(&[]).await;
    let tool = |name: &str| {
        format!(
            "[[tool]]\nname = \"{name}\"\ndescription = \"{name}\"\ncommand = [\"true\"]\neffect_profile = {READ_ONLY}\n"
        )
    };
    bed.write_tool_file("tools.toml", &tool("first"));
    bed.spawn(&["first"]).await;

    // SIGHUP reads the file again and announces the new list.
    bed.write_tool_file("tools.toml", &format!("{}{}", tool("first"), tool("second")));
    bed.sighup().await;
    bed.served(&["first", "second"]).await;

    // A bad file is logged with its line and field, and the announced tools stay.
    bed.write_tool_file("tools.toml", &format!("{}[[tool]]\nname = \"third\"\nbogus = 1\n", tool("first")));
    bed.sighup().await;
    wait_until("the bad file to be logged", WAIT, || async { bed.log_has("bogus").then_some(()) }).await;
    assert!(bed.log_has("line=8"), "the log names the line: {:?}", bed.log);
    let names = bed.announced_names().await;
    assert!(names.contains(&"second".to_owned()) && !names.contains(&"third".to_owned()), "{names:?}");

    // A changed file is noticed without a signal.
    bed.write_tool_file("tools.toml", &tool("fourth"));
    let names = wait_until("the change to be announced", WAIT, || async {
        let names = bed.announced_names().await;
        (names.contains(&"fourth".to_owned()) && !names.contains(&"first".to_owned())).then_some(names)
    })
    .await;
    assert!(names.contains(&"bash".to_owned()), "the built-ins stay: {names:?}");
}

#[tokio::test]
async fn runner_agent_tools_prints_the_announcement_and_refuses_a_bad_file_by_line() {
    let dirs = tempfile::tempdir().expect("dirs");
    let tools_file = dirs.path().join("tools.toml");
    std::fs::write(
        &tools_file,
        format!(
            "[[tool]]\nname = \"lint\"\ndescription = \"Lint.\"\ncommand = [\"true\"]\nmax_concurrency = 2\neffect_profile = {READ_ONLY}\n"
        ),
    )
    .expect("tools file");
    let printed = tools_command(&tools_file, dirs.path()).await;
    assert!(printed.status.success(), "{printed:?}");
    let tools: Value = serde_json::from_slice(&printed.stdout).expect("json");
    let lint = tools.as_array().and_then(|tools| tools.iter().find(|t| t["name"] == "lint")).expect("lint listed");
    assert_eq!(
        (lint["max_concurrency"].as_u64(), lint["effect_profile"]["kind"].as_str()),
        (Some(2), Some("read_only"))
    );
    assert!(tools.as_array().is_some_and(|tools| tools.iter().any(|t| t["name"] == "bash")), "built-ins listed");

    std::fs::write(&tools_file, "[[tool]]\nname = \"lint\"\ncommand = []\n").expect("tools file");
    let refused = tools_command(&tools_file, dirs.path()).await;
    assert!(!refused.status.success(), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("tools.toml:1:") && stderr.contains("description"), "names file, line, field: {stderr}");
}

async fn tools_command(tools_file: &Path, workdir: &Path) -> std::process::Output {
    tokio::process::Command::new(nexus_tests::runner_agent_binary())
        .arg("tools")
        .arg("--tools-file")
        .arg(tools_file)
        .arg("--workdir")
        .arg(workdir)
        .output()
        .await
        .expect("runner-agent tools runs")
}

/// A tools file with MCP servers `alpha` and `beta`, both the test's `mcp-fixture` over stdio;
/// `alpha` stays down while `hold` exists.
fn mcp_tools_file(hold: &Path) -> String {
    let fixture = nexus_tests::mcp_fixture_binary();
    format!(
        r#"
[[mcp_server]]
name = "alpha"
command = [{fixture:?}]
env = {{ FIXTURE_DOWN_WHILE = {hold:?} }}
timeout_ms = 20000

[[mcp_server]]
name = "beta"
command = [{fixture:?}]
"#,
        fixture = fixture.display().to_string(),
        hold = hold.display().to_string(),
    )
}

#[tokio::test]
async fn a_model_calls_mcp_tools_and_a_killed_server_takes_only_its_own_tools_away_until_it_is_back() {
    let both = json!({"rounds": [
        {"tool_calls": [{"id": "s", "name": "alpha_add", "arguments": {"a": 2, "b": 3}},
                        {"id": "e", "name": "beta_echo", "arguments": {"text": "hi from beta"}}]},
        {"final": "{{tool:s}} / {{tool:e}}"}
    ]});
    let crash = json!({"rounds": [
        {"tool_calls": [{"id": "c", "name": "alpha_crash", "arguments": {}}]},
        {"final": "crashed: {{tool:c}}"}
    ]});
    let beta = json!({"rounds": [
        {"tool_calls": [{"id": "e", "name": "beta_echo", "arguments": {"text": "still here"}}]},
        {"final": "{{tool:e}}"}
    ]});
    let mut bed = Bed::start(&[("both", both), ("crash", crash), ("beta", beta)]).await;
    let hold = bed.dirs.path().join("hold-alpha-down");
    bed.write_tool_file("tools.toml", &mcp_tools_file(&hold));
    bed.spawn(&["alpha_add", "alpha_crash", "beta_echo"]).await;

    // Announced with the profiles their annotations give.
    let row = bed.server.store().executor(bed.runner.runner()).await.expect("row").expect("executor");
    let tool = |name: &str| {
        row.announcement["tools"].as_array().and_then(|t| t.iter().find(|t| t["name"] == name).cloned()).expect(name)
    };
    assert_eq!(tool("beta_echo")["effect_profile"]["kind"], "read_only");
    assert_eq!(tool("alpha_add")["effect_profile"]["idempotency"], "intrinsic");
    assert_eq!(tool("alpha_fail")["effect_profile"]["destructive"], true, "no annotations: the careful default");

    // A model calls a tool of each server, end to end.
    bed.declare("scripted/both", json!({})).await;
    let run = bed.turn("add and echo").await;
    let row = bed.ended(run).await;
    assert_eq!((row.status, row.final_text.as_deref()), (RunStatus::Completed, Some("the sum is 5 / hi from beta")));
    let add = bed.server.store().task(run, nexus_tests::key("r1t0")).await.expect("task").expect("row");
    assert_eq!(add.result.as_ref().map(|r| r["structured_content"].clone()), Some(json!({"sum": 5.0})), "{add:?}");

    // alpha dies (and is held down): only its tools go away; beta's keep working.
    std::fs::write(&hold, "down").expect("hold");
    bed.declare("scripted/crash", json!({})).await;
    let run = bed.turn("crash alpha").await;
    let row = bed.ended(run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert!(row.final_text.as_deref().is_some_and(|text| text.contains("alpha")), "a tool error naming the server");
    let names = wait_until("alpha's tools to be withdrawn", WAIT, || async {
        let names = bed.announced_names().await;
        names.iter().all(|name| !name.starts_with("alpha_")).then_some(names)
    })
    .await;
    assert!(names.contains(&"beta_echo".to_owned()) && names.contains(&"bash".to_owned()), "{names:?}");
    bed.declare("scripted/beta", json!({})).await;
    let run = bed.turn("echo on beta").await;
    let row = bed.ended(run).await;
    assert_eq!((row.status, row.final_text.as_deref()), (RunStatus::Completed, Some("still here")));

    // Let alpha start again: its tools come back, found by the restart's backoff.
    std::fs::remove_file(&hold).expect("release");
    bed.served(&["alpha_add", "alpha_echo", "beta_echo"]).await;
}

#[tokio::test]
async fn five_hundred_command_tools_and_three_mcp_servers_are_announced_within_the_provider_rule() {
    let mut bed = Bed::start(&[]).await;
    let fixture = nexus_tests::mcp_fixture_binary().display().to_string();
    let mut text = String::new();
    for n in 0..500 {
        text.push_str(&format!(
            "[[tool]]\nname = \"tool_{n:03}\"\ndescription = \"Tool number {n}: does one thing well.\"\n\
             command = [\"cat\"]\ninput_schema = {{ type = \"object\", properties = {{ path = {{ type = \"string\" }} }} }}\n\
             effect_profile = {READ_ONLY}\n"
        ));
    }
    for (name, prefix) in [("one", "one"), ("two", "a_rather_long_server_prefix_x"), ("three", "three")] {
        text.push_str(&format!(
            "[[mcp_server]]\nname = \"{name}\"\nprefix = \"{prefix}\"\ncommand = [{fixture:?}]\nenv = {{ FIXTURE_ODD_NAMES = \"1\" }}\n"
        ));
    }
    bed.write_tool_file("tools.toml", &text);
    bed.spawn(&["tool_000", "tool_499", "one_echo", "three_echo", "a_rather_long_server_prefix_x_whoami"]).await;
    let names = bed.announced_names().await;
    // The provider rule, ^[a-zA-Z0-9_-]{1,64}$.
    let fits = |name: &str| {
        (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    assert!(names.iter().all(|name| fits(name)), "every name fits the rule: {names:?}");
    let unique: std::collections::BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "every name unique");
    assert_eq!(names.iter().filter(|name| name.starts_with("tool_")).count(), 500);
    // Each server lists its odd names too (a 100-character one and a unicode one): mapped, not dropped.
    for prefix in ["one_", "a_rather_long_server_prefix_x_", "three_"] {
        let served = names.iter().filter(|name| name.starts_with(prefix)).count();
        let listed = names.iter().filter(|name| name.starts_with("one_")).count();
        assert_eq!(served, listed, "{prefix}: every server serves the same tools");
    }
    assert!(names.iter().filter(|name| name.starts_with("one_")).count() >= 10, "{names:?}");
}

#[tokio::test]
async fn the_daily_tools_edit_search_and_patch_and_a_failing_hunk_leaves_every_file_untouched() {
    let patch_ok = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1,2 +1,2 @@\n alpha\n-beta\n+BETA\n";
    let patch_bad = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1 +1 @@\n-alpha\n+ALPHA\n\
                     --- a/other.txt\n+++ b/other.txt\n@@ -1 +1 @@\n-no such line\n+x\n";
    let work = json!({"rounds": [
        {"tool_calls": [{"id": "ed", "name": "edit", "arguments": {"path": "notes.txt", "old_text": "gamma", "new_text": "GAMMA"}}]},
        {"tool_calls": [{"id": "bad", "name": "apply_patch", "arguments": {"patch": patch_bad}}]},
        {"tool_calls": [{"id": "ok", "name": "apply_patch", "arguments": {"patch": patch_ok}}]},
        {"tool_calls": [{"id": "gr", "name": "grep", "arguments": {"pattern": "BETA|GAMMA"}},
                        {"id": "gl", "name": "glob", "arguments": {"pattern": "*.txt"}}]},
        {"final": "done"}
    ]});
    let mut bed = Bed::start(&[("work", work)]).await;
    std::fs::write(bed.workdir().join("notes.txt"), "alpha\nbeta\ngamma\n").expect("notes");
    std::fs::write(bed.workdir().join("other.txt"), "one line\n").expect("other");
    std::fs::write(bed.workdir().join(".gitignore"), "ignored.txt\n").expect("gitignore");
    std::fs::write(bed.workdir().join("ignored.txt"), "BETA GAMMA\n").expect("ignored");
    bed.write_tool_file("tools.toml", "");
    bed.spawn(&["edit", "apply_patch", "grep", "glob"]).await;
    bed.declare("scripted/work", json!({})).await;
    let run = bed.turn("edit the notes").await;
    let row = bed.ended(run).await;
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    let result = |key: &'static str| {
        let store = bed.server.store();
        async move {
            let task = store.task(run, nexus_tests::key(key)).await.expect("task").expect("row");
            task.result.expect("a result")
        }
    };
    assert_eq!(result("r1t0").await["is_error"], false, "edit");
    let bad = result("r2t0").await;
    assert_eq!(bad["is_error"], true, "{bad}");
    assert_eq!(bad["structured_content"]["applied"], json!([]), "{bad}");
    let ok = result("r3t0").await;
    assert_eq!(ok["is_error"], false, "{ok}");
    // The failed patch changed neither file; the good one and the edit did their part.
    assert_eq!(std::fs::read_to_string(bed.workdir().join("notes.txt")).expect("notes"), "alpha\nBETA\nGAMMA\n");
    assert_eq!(std::fs::read_to_string(bed.workdir().join("other.txt")).expect("other"), "one line\n");
    let grep = result("r4t0").await;
    let found = grep["content"].as_str().expect("content");
    assert!(found.contains("notes.txt") && !found.contains("ignored.txt"), ".gitignore honoured: {found}");
    let glob = result("r4t1").await;
    let listed = glob["content"].as_str().expect("content");
    assert!(listed.contains("other.txt") && !listed.contains("ignored.txt"), "{listed}");
}

#[tokio::test]
async fn an_mcp_tool_named_like_a_command_tool_is_held_back_alone_and_a_failing_server_says_why() {
    let mut bed = Bed::start(&[]).await;
    let fixture = nexus_tests::mcp_fixture_binary().display().to_string();
    bed.write_tool_file(
        "tools.toml",
        &format!(
            "[[tool]]\nname = \"solo_echo\"\ndescription = \"The command tool.\"\ncommand = [\"cat\"]\neffect_profile = {READ_ONLY}\n\
             [[mcp_server]]\nname = \"solo\"\ncommand = [{fixture:?}]\n"
        ),
    );
    bed.spawn(&["solo_add", "solo_echo"]).await;
    let row = bed.server.store().executor(bed.runner.runner()).await.expect("row").expect("executor");
    let echo = row.announcement["tools"].as_array().and_then(|t| t.iter().find(|t| t["name"] == "solo_echo").cloned());
    assert_eq!(echo.map(|t| t["description"].clone()), Some(json!("The command tool.")), "the command tool stays");
    wait_until("the collision to be logged", WAIT, || async { bed.log_has("solo_echo").then_some(()) }).await;
    // `runner-agent tools` lists what the daemon serves: the same tool held back, with a warning.
    let listed = tools_command(&bed.tools_file(), &bed.workdir()).await;
    assert!(listed.status.success(), "{listed:?}");
    let tools: Value = serde_json::from_slice(&listed.stdout).expect("json");
    let names: Vec<&str> = tools.as_array().expect("list").iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"solo_add") && names.iter().filter(|n| **n == "solo_echo").count() == 1, "{names:?}");
    assert!(String::from_utf8_lossy(&listed.stderr).contains("solo_echo"), "{listed:?}");

    // `runner-agent tools` reports a server that dies at start with the end of its stderr.
    let dirs = tempfile::tempdir().expect("dirs");
    let tools_file = dirs.path().join("tools.toml");
    std::fs::write(
        &tools_file,
        "[[mcp_server]]\nname = \"broken\"\ncommand = [\"sh\", \"-c\", \"echo boom: no such module >&2; exit 1\"]\n",
    )
    .expect("tools file");
    let printed = tools_command(&tools_file, dirs.path()).await;
    assert!(printed.status.success(), "{printed:?}");
    let stderr = String::from_utf8_lossy(&printed.stderr);
    assert!(stderr.contains("broken") && stderr.contains("boom: no such module"), "{stderr}");
}
