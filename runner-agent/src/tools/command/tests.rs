use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tokio::sync::{mpsc, watch};

use super::*;
use crate::claim::ClaimHandle;
use crate::journal::TaskKey;
use crate::tools::reap::Owner;
use crate::tools::{EffectProfile, StopReason};

use crate::tools::test_processes::{pids, wait_dead};
use crate::tools::test_workdir as workdir;

/// A command tool running `program args...`, with a 10 s timeout.
fn tool(program: &str, args: &[&str]) -> CommandTool {
    CommandTool {
        name: "probe".to_owned(),
        description: "a test tool".to_owned(),
        program: PathBuf::from(program),
        args: args.iter().map(|arg| (*arg).to_owned()).collect(),
        timeout_ms: 10_000,
        max_concurrency: None,
        env: BTreeMap::from([("PROBE_ENV".to_owned(), "from-the-file".to_owned())]),
        input_schema: json!({"type": "object"}),
        effect_profile: EffectProfile::UNKNOWN_WRITE,
    }
}

/// A script in `dir`, run with `interpreter`.
fn script(dir: &Path, name: &str, interpreter: &str, body: &str) -> CommandTool {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    tool(interpreter, &[path.to_str().unwrap()])
}

fn context(
    workdir: &Path,
) -> (watch::Sender<Option<StopReason>>, mpsc::Receiver<crate::claim::ControlRequest>, ToolContext) {
    let (stop_tx, stop) = watch::channel(None);
    let (control_tx, control_rx) = mpsc::channel(64);
    let key = TaskKey { run_public_id: "run-7".into(), task_key: "call-3".into() };
    let ctx = ToolContext {
        workdir: workdir.to_owned(),
        bash_timeout_ms: 60_000,
        task_timeout_ms: None,
        clamp_at: None,
        stop,
        claim: Some(ClaimHandle::new(key, "tok".into(), control_tx)),
        owner: Owner::of_state_dir(workdir),
    };
    (stop_tx, control_rx, ctx)
}

async fn call(tool: &CommandTool, workdir: &Path, input: Value) -> (String, Value, bool) {
    let (_stop, _control, mut ctx) = context(workdir);
    let Value::Object(input) = input else { panic!("an object") };
    run(tool, input, &mut ctx).await.into_parts()
}

const ECHO_PY: &str = r#"
import json, os, sys
data = json.load(sys.stdin)
print(json.dumps({
    "content": "got " + data["path"],
    "structured_content": {
        "input": data,
        "env_input": json.loads(os.environ["NEXUS_TOOL_INPUT"]),
        "name": os.environ["NEXUS_TOOL_NAME"],
        "run": os.environ["NEXUS_RUN_ID"],
        "task": os.environ["NEXUS_TASK_KEY"],
        "file_env": os.environ["PROBE_ENV"],
        "cwd": os.getcwd(),
    },
}))
"#;

#[tokio::test]
async fn a_structured_answer_is_the_result_and_the_input_arrives_on_stdin_and_in_the_environment() {
    let (_dir, workdir) = workdir();
    let echo = script(&workdir, "echo.py", "python3", ECHO_PY);
    let (content, structured, is_error) = call(&echo, &workdir, json!({"path": "a.py"})).await;
    assert!(!is_error, "{content}");
    assert_eq!(content, "got a.py");
    assert_eq!(structured["input"], json!({"path": "a.py"}));
    assert_eq!(structured["env_input"], json!({"path": "a.py"}));
    assert_eq!(structured["name"], "probe");
    assert_eq!((structured["run"].as_str(), structured["task"].as_str()), (Some("run-7"), Some("call-3")));
    assert_eq!(structured["file_env"], "from-the-file");
    assert_eq!(structured["cwd"], workdir.display().to_string());

    // A hook's answer: is_error as the tool says, structured_content as it gives it.
    let hook = tool(
        "sh",
        &[
            "-c",
            r#"cat >/dev/null; echo '{"content": "no", "is_error": true, "structured_content": {"continue": false}}'"#,
        ],
    );
    let (content, structured, is_error) = call(&hook, &workdir, json!({})).await;
    assert_eq!((content.as_str(), is_error), ("no", true));
    assert_eq!(structured, json!({"continue": false}));

    // Without structured_content it is null.
    let bare = tool("sh", &["-c", r#"echo '{"content": "fine"}'"#]);
    assert_eq!(call(&bare, &workdir, json!({})).await, ("fine".to_owned(), Value::Null, false));
}

#[tokio::test]
async fn other_stdout_is_plain_text_and_large_input_skips_the_environment() {
    let (_dir, workdir) = workdir();
    let plain = tool("sh", &["-c", "printf 'line one\\nline two\\n'"]);
    assert_eq!(call(&plain, &workdir, json!({})).await, ("line one\nline two\n".to_owned(), Value::Null, false));
    // JSON that is not the result's shape stays text.
    for stdout in [
        r#"{"content": 5}"#,
        r#"{"content": "x", "is_error": "yes"}"#,
        r#"[1]"#,
        r#"{"content": "a"} {"content": "b"}"#,
    ] {
        let command = format!("echo '{stdout}'");
        let odd = tool("sh", &["-c", &command]);
        let (content, structured, is_error) = call(&odd, &workdir, json!({})).await;
        assert_eq!((content.trim_end(), structured, is_error), (stdout, Value::Null, false));
    }

    // Over 32 KiB the input comes on stdin only.
    let big = "x".repeat(MAX_INPUT_ENV_BYTES);
    let measure = tool("sh", &["-c", "printf '%s:' \"${NEXUS_TOOL_INPUT-unset}\" | head -c 6; wc -c"]);
    let (content, _, _) = call(&measure, &workdir, json!({"blob": big})).await;
    let expected = Value::Object(Map::from_iter([("blob".to_owned(), json!(big))])).to_string().len();
    assert_eq!(content.trim(), format!("unset:{expected}"));
    let (content, _, _) = call(&measure, &workdir, json!({"small": 1})).await;
    assert!(content.starts_with("{\"smal"), "a small input is in the environment: {content}");

    // A program that never reads its stdin is not waited for, however large the input.
    let deaf = tool("sh", &["-c", "echo done"]);
    let huge = "y".repeat(4 * 1024 * 1024);
    assert_eq!(call(&deaf, &workdir, json!({"blob": huge})).await.0, "done\n");

    // stdout past the cap is cut, with a note.
    let loud = tool("sh", &["-c", "head -c 300000 /dev/zero | tr '\\0' a"]);
    let (content, _, is_error) = call(&loud, &workdir, json!({})).await;
    assert!(!is_error);
    assert!(
        content.ends_with(&format!("[stdout cut: showing the first {} of 300000 bytes]", process::OUTPUT_CAP_BYTES))
    );
}

#[tokio::test]
async fn a_non_zero_exit_is_an_error_naming_the_code_and_the_tail_of_stderr() {
    let (_dir, workdir) = workdir();
    let failing = tool(
        "python3",
        &["-c", "import sys; print('partial'); sys.stderr.write('E' * 10000 + 'the end'); sys.exit(3)"],
    );
    let (content, structured, is_error) = call(&failing, &workdir, json!({})).await;
    assert!(is_error);
    assert!(content.starts_with("`probe` exited with code 3\nstderr"), "{content}");
    assert!(content.ends_with("the end"), "the tail, not the head: {content}");
    assert!(content.len() < 5_000, "only the tail: {} bytes", content.len());
    assert_eq!(structured["exit_code"], 3);
    assert_eq!(structured["stdout"], "partial\n");

    // A structured answer with a non-zero exit is still the exit's error.
    let both = tool("sh", &["-c", r#"echo '{"content": "ok"}'; exit 1"#]);
    let (content, _, is_error) = call(&both, &workdir, json!({})).await;
    assert!(is_error);
    assert!(content.starts_with("`probe` exited with code 1\nstdout"), "stdout's tail when stderr is empty: {content}");

    // A program that cannot start is a failed call.
    let (_stop, _control, mut ctx) = context(&workdir);
    let missing = tool("/nonexistent/nexus-tool", &[]);
    let outcome = run(&missing, Map::new(), &mut ctx).await;
    assert!(
        matches!(&outcome, ToolOutcome::Failed { content } if content.contains("/nonexistent/nexus-tool")),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn the_timeout_kills_the_whole_group_and_a_cancel_stops_the_call() {
    let (_dir, workdir) = workdir();
    let mut slow = tool(
        "sh",
        &["-c", "sleep 1000 & echo $! > bg.pid; setsid sleep 1000 & echo $! >> bg.pid; echo started >&2; sleep 1000"],
    );
    slow.timeout_ms = 300;
    let started = tokio::time::Instant::now();
    let (content, structured, is_error) = call(&slow, &workdir, json!({})).await;
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert!(is_error);
    assert!(
        content.starts_with("`probe` was killed after its timeout of 300 ms; whether it took effect is unknown"),
        "{content}"
    );
    assert!(content.ends_with("started\n"), "stderr's tail: {content}");
    assert_eq!((structured["killed"].as_bool(), structured["timeout_ms"].as_u64()), (Some(true), Some(300)));
    let pids = pids(&workdir, "bg.pid");
    assert_eq!(pids.len(), 2);
    wait_dead(&pids, "after the timeout").await;

    // The task's lower timeout wins.
    let (_stop, _control, mut ctx) = context(&workdir);
    ctx.task_timeout_ms = Some(200);
    let mut sleeper = tool("sleep", &["1000"]);
    sleeper.effect_profile.kind = EffectKind::ReadOnly;
    let outcome = run(&sleeper, Map::new(), &mut ctx).await;
    assert!(
        matches!(&outcome, ToolOutcome::Completed { content, is_error: true, .. } if content == "`probe` was killed after its timeout of 200 ms"),
        "{outcome:?}"
    );

    // A cancel kills it at once.
    let (stop_tx, _control, mut ctx) = context(&workdir);
    let task = tokio::spawn(async move { run(&tool("sleep", &["1000"]), Map::new(), &mut ctx).await });
    stop_tx.send_replace(Some(StopReason::Canceled));
    let outcome = tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
    assert!(
        matches!(&outcome, ToolOutcome::Completed { content, is_error: true, .. } if content.starts_with("`probe` was killed because its task was canceled")),
        "{outcome:?}"
    );
}
