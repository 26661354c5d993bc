//! `nexus quickstart`: the main job on one machine, in one command.
//!
//! It starts nexus on a free loopback port with a data dir under the system temp dir, mints an
//! Agent and a runner, starts a real `runner-agent` child process whose workdir is the current
//! directory, declares a profile that imports the runner's tools, admits the input "How many
//! lines of Rust are in this repository?", and follows the execution's events to its final
//! answer. The model is the scripted one from `deploy/quickstart/script.json`, or the real model
//! named by `NEXUS_MODEL` when its provider's key is set.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use nexus_proto::{MemberId, RunStatus};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use uuid::Uuid;

use crate::cli::admin::{MemberKind, RunnerAssignment, create_member, create_runner};
use crate::config::ServerConfig;
use crate::doors::api::FeedType;
use crate::doors::api::{Caller, CreateInput};
use crate::model::{ModelRegistry, Script};
use crate::store::EventType;

/// The display name of the quickstart's runner.
pub const RUNNER_NAME: &str = "quickstart-runner";
/// The question the quickstart asks.
pub const QUESTION: &str = "How many lines of Rust are in this repository?";
/// The scripted model the quickstart installs.
pub const SCRIPTED_MODEL: &str = "scripted/quickstart";
/// The script shipped with the repository, compiled in so the binary works from any directory.
pub const BUNDLED_SCRIPT: &str = include_str!("../../../deploy/quickstart/script.json");

/// Options of `nexus quickstart`.
#[derive(Clone, Debug)]
pub struct QuickstartOptions {
    /// The runner's workdir. Default: the current directory.
    pub workdir: PathBuf,
    /// The `runner-agent` binary. Default: next to this executable, built with cargo if absent.
    pub runner_agent: Option<PathBuf>,
    /// A script file instead of the bundled `deploy/quickstart/script.json`.
    pub script: Option<PathBuf>,
    /// A real model reference (`provider/model`) instead of the scripted one (`NEXUS_MODEL`).
    pub model: Option<String>,
    /// Keep the data dir afterwards instead of removing it.
    pub keep_data: bool,
    /// How long to wait for the runner and for the answer. Default 10 minutes.
    pub timeout: Duration,
}

/// Why the quickstart failed; each message says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuickstartError {
    /// A step failed.
    #[error("{0}")]
    Step(String),
    /// The execution ended without a final answer.
    #[error("the execution ended {status}: {error_key}")]
    NoAnswer {
        /// The run status.
        status: String,
        /// Its error key.
        error_key: String,
    },
}

fn step(what: &str) -> impl FnOnce(String) -> QuickstartError + '_ {
    move |detail| QuickstartError::Step(format!("{what}: {detail}"))
}

/// The outcome: the final answer and the execution that produced it.
#[derive(Clone, Debug, PartialEq)]
pub struct QuickstartOutcome {
    /// The final text.
    pub final_text: String,
    /// The execution.
    pub execution_public_id: nexus_proto::ExecutionId,
}

/// Runs the quickstart, printing each round, each tool call with its runner and result, and the
/// final answer to stdout, and progress to stderr.
///
/// # Errors
/// [`QuickstartError`] when a step fails or the execution ends without an answer.
pub async fn run(options: QuickstartOptions) -> Result<QuickstartOutcome, QuickstartError> {
    let data_dir = std::env::temp_dir().join(format!("nexus-quickstart-{}", Uuid::new_v4()));
    let result = run_in(&options, &data_dir).await;
    if options.keep_data {
        eprintln!("data dir kept at {}", data_dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    result
}

async fn run_in(options: &QuickstartOptions, data_dir: &Path) -> Result<QuickstartOutcome, QuickstartError> {
    let config = ServerConfig { data_dir: data_dir.to_owned(), ..ServerConfig::default() };
    let script_text = match &options.script {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| step("read the script")(format!("{}: {e}", path.display())))?
        }
        None => BUNDLED_SCRIPT.to_owned(),
    };
    let script = Script::from_json(&script_text).map_err(|e| step("parse the script")(e.to_string()))?;
    let models = ModelRegistry::new(config.providers.clone(), |name| std::env::var(name).ok())
        .map_err(|e| step("load the provider table")(e.to_string()))?
        .with_script("scripted", "quickstart", script);
    let model = options.model.clone().unwrap_or_else(|| SCRIPTED_MODEL.to_owned());
    if let Err(e) = models.resolve(&model) {
        return Err(step("resolve the model")(format!("{model}: {}: {e}", e.word())));
    }

    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| step("bind a loopback port")(e.to_string()))?;
    let server = crate::start_with_models(listener, config, Some(models), crate::clock::Clock::system())
        .await
        .map_err(|e| step("start nexus")(e.to_string()))?;
    println!("nexus listening on {} (data dir {})", server.url(), data_dir.display());
    let outcome = drive(options, &server, data_dir, &model).await;
    if let Err(e) = server.shutdown().await {
        tracing::warn!(error = %e, "shutdown was not clean");
    }
    outcome
}

async fn drive(
    options: &QuickstartOptions,
    server: &crate::RunningServer,
    data_dir: &Path,
    model: &str,
) -> Result<QuickstartOutcome, QuickstartError> {
    let api = &server.api;
    let store = &api.fabric.store;
    let agent =
        create_member(store, MemberKind::Agent, "quickstart").await.map_err(|r| step("mint the agent")(r.message))?;
    // The quickstart's runner serves its Agent and no one else.
    let agent_id: MemberId = agent["public_id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| step("mint the agent")("the minted agent has no public_id".to_owned()))?;
    let runner = create_runner(store, RUNNER_NAME, &RunnerAssignment::Agents(vec![agent_id]))
        .await
        .map_err(|r| step("mint the runner")(r.message))?;
    let runner_id = runner["runner_executor_public_id"].as_str().unwrap_or_default().to_owned();
    let token_file = data_dir.join("runner.token");
    write_secret(&token_file, runner["token"].as_str().unwrap_or_default()).map_err(step("write the runner token"))?;
    println!("minted agent {} and runner {runner_id}", agent["public_id"].as_str().unwrap_or_default());

    let binary = locate_runner_agent(options.runner_agent.as_deref()).await?;
    let mut child = spawn_runner(&binary, &server.url(), &runner_id, &token_file, &options.workdir, data_dir)?;
    println!("started runner-agent (pid {}) in {}", child.id().unwrap_or(0), options.workdir.display());

    let result = async {
        wait_for_announcement(server, &runner_id, &mut child, options.timeout).await?;
        let caller = api
            .member(agent["token"].as_str().unwrap_or_default())
            .await
            .map_err(|r| step("authenticate the agent")(r.message))?;
        let declaration = json!({
            "configuration": {
                "runner_executor_public_ids": [runner_id],
                "approval_mode": "bypass",
                "default_model": model,
            },
            "prompt_documents": {"system_prompt": {"content": "You answer questions about the repository in the runner's workdir. Use the runner's tools to look; quote the numbers they return."}},
        });
        api.declare(&caller, declaration)
            .await
            .map_err(|r| step("declare the profile")(format!("{}: {}", r.code, r.message)))?;
        println!("declared a profile importing the runner's tools, model {model}");
        let admitted = api
            .create_input(&caller, CreateInput { text: QUESTION.to_owned(), ..CreateInput::default() })
            .await
            .map_err(|r| step("admit the input")(format!("{}: {}", r.code, r.message)))?;
        println!("input: {QUESTION}\nexecution {}", admitted.execution_public_id);
        follow(api, &caller, admitted.execution_public_id, &runner_id, options.timeout).await
    };
    let result = tokio::select! {
        result = result => result,
        _ = tokio::signal::ctrl_c() => Err(QuickstartError::Step("interrupted; stopping the runner and cleaning up".into())),
    };
    stop_child(&mut child).await;
    result
}

fn write_secret(path: &Path, token: &str) -> Result<(), String> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(|e| e.to_string())?;
    file.write_all(token.as_bytes()).map_err(|e| e.to_string())
}

/// Finds `runner-agent`: the given path, `NEXUS_RUNNER_AGENT`, or next to this executable. When
/// it is missing and nexus runs under cargo, it is built with the same cargo.
async fn locate_runner_agent(explicit: Option<&Path>) -> Result<PathBuf, QuickstartError> {
    if let Some(path) =
        explicit.map(Path::to_path_buf).or_else(|| std::env::var_os("NEXUS_RUNNER_AGENT").map(PathBuf::from))
    {
        return if path.is_file() {
            Ok(path)
        } else {
            Err(QuickstartError::Step(format!("runner-agent not found at {}", path.display())))
        };
    }
    let exe = std::env::current_exe().map_err(|e| step("find this executable")(e.to_string()))?;
    let sibling = exe.with_file_name(format!("runner-agent{}", std::env::consts::EXE_SUFFIX));
    if sibling.is_file() {
        return Ok(sibling);
    }
    let Some(cargo) = std::env::var_os("CARGO") else {
        return Err(QuickstartError::Step(format!(
            "runner-agent not found next to {}; build it with `cargo build --bin runner-agent` or pass --runner-agent",
            exe.display()
        )));
    };
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new("."));
    eprintln!("runner-agent is not built yet; building it with cargo (once)...");
    let profile_flag =
        if exe.parent().and_then(Path::file_name).is_some_and(|d| d == "release") { vec!["--release"] } else { vec![] };
    let status = Command::new(cargo)
        .args(["build", "--locked", "-p", "nexus-runner-agent", "--bin", "runner-agent"])
        .args(profile_flag)
        .current_dir(workspace)
        .status()
        .await
        .map_err(|e| step("run cargo")(e.to_string()))?;
    if !status.success() || !sibling.is_file() {
        return Err(QuickstartError::Step(format!(
            "building runner-agent failed ({status}); run `cargo build --bin runner-agent`"
        )));
    }
    Ok(sibling)
}

fn spawn_runner(
    binary: &Path,
    url: &str,
    runner_id: &str,
    token_file: &Path,
    workdir: &Path,
    data_dir: &Path,
) -> Result<Child, QuickstartError> {
    Command::new(binary)
        .arg("--nexus")
        .arg(url)
        .arg("--runner-id")
        .arg(runner_id)
        .arg("--token-file")
        .arg(token_file)
        .arg("--workdir")
        .arg(workdir)
        .arg("--state-dir")
        .arg(data_dir.join("runner-state"))
        .arg("--log")
        .arg("warn")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| step("start runner-agent")(format!("{}: {e}", binary.display())))
}

/// How long runner-agent gets to stop its tools and commit after SIGTERM before it is killed.
const RUNNER_STOP_GRACE: Duration = Duration::from_secs(8);

/// Stops runner-agent the way an operator would: SIGTERM lets it kill its tools' process groups
/// and journal their results; SIGKILL follows only if it does not exit in time.
async fn stop_child(child: &mut Child) {
    if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
        if tokio::time::timeout(RUNNER_STOP_GRACE, child.wait()).await.is_ok() {
            return;
        }
    }
    if let Err(e) = child.start_kill() {
        tracing::debug!(error = %e, "runner-agent already gone");
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
}

async fn wait_for_announcement(
    server: &crate::RunningServer,
    runner_id: &str,
    child: &mut Child,
    timeout: Duration,
) -> Result<(), QuickstartError> {
    let id: nexus_proto::RunnerId =
        runner_id.parse().map_err(|e: nexus_proto::MalformedId| step("read the runner id")(e.to_string()))?;
    let started = Instant::now();
    let mut last_note = Instant::now();
    loop {
        let row = server.api.fabric.store.executor(id).await.map_err(|e| step("read the runner")(e.to_string()))?;
        if let Some(row) = row.filter(|r| r.announced_at.is_some()) {
            let tools: Vec<&str> =
                row.announcement["tools"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect();
            println!("runner connected and announced: {}", tools.join(", "));
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(QuickstartError::Step(format!(
                "runner-agent exited before announcing ({status}); see its log above"
            )));
        }
        if started.elapsed() > timeout {
            return Err(QuickstartError::Step("the runner did not connect in time".into()));
        }
        if last_note.elapsed() > Duration::from_secs(2) {
            eprintln!("  waiting for the runner to connect ({}s)", started.elapsed().as_secs());
            last_note = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn indent(text: &str) -> String {
    text.trim_end().lines().map(|l| format!("      {l}")).collect::<Vec<_>>().join("\n")
}

async fn follow(
    api: &crate::doors::api::Api,
    caller: &Caller,
    execution: nexus_proto::ExecutionId,
    runner_id: &str,
    timeout: Duration,
) -> Result<QuickstartOutcome, QuickstartError> {
    let mut events = Box::pin(
        api.events(caller, execution, "", true)
            .await
            .map_err(|r| step("follow the events")(format!("{}: {}", r.code, r.message)))?,
    );
    let started = Instant::now();
    let mut waiting_on = String::from("the model");
    loop {
        let next = tokio::time::timeout(Duration::from_secs(2), events.next()).await;
        let event = match next {
            Err(_) => {
                if started.elapsed() > timeout {
                    return Err(QuickstartError::Step(
                        "no answer in time; stop the execution and inspect its events".into(),
                    ));
                }
                eprintln!("  ... waiting for {waiting_on} ({}s)", started.elapsed().as_secs());
                continue;
            }
            Ok(None) => break,
            Ok(Some(Err(refusal))) => {
                return Err(step("read an event")(format!("{}: {}", refusal.code, refusal.message)));
            }
            Ok(Some(Ok(event))) => event,
        };
        let data = &event.data;
        match event.event_type {
            FeedType::Durable(EventType::RoundStarted) => {
                println!("round {} ({})", data["round"], data["model"].as_str().unwrap_or_default());
                waiting_on = "the model".into();
            }
            FeedType::Durable(EventType::RoundResult) => {
                let calls = data["tool_calls"].as_array().cloned().unwrap_or_default();
                for call in &calls {
                    println!(
                        "  tool call {} {} {}",
                        call["task_key"].as_str().unwrap_or_default(),
                        call["name"].as_str().unwrap_or_default(),
                        call["input"]
                    );
                }
                if !calls.is_empty() {
                    waiting_on = format!("runner {RUNNER_NAME} ({runner_id}) to run {} call(s)", calls.len());
                }
            }
            FeedType::Durable(EventType::TaskStatus) if data.get("content").is_some() => {
                let runner = data["runner_executor_public_id"]
                    .as_str()
                    .map_or_else(|| "no runner".to_owned(), |r| format!("runner {RUNNER_NAME} ({r})"));
                println!(
                    "  {} {} on {runner}: {}{}",
                    data["task_key"].as_str().unwrap_or_default(),
                    data["tool_name"].as_str().unwrap_or_default(),
                    data["status"].as_str().unwrap_or_default(),
                    data["error_key"].as_str().map(|k| format!(" ({k})")).unwrap_or_default(),
                );
                println!("{}", indent(data["content"].as_str().unwrap_or_default()));
            }
            FeedType::Durable(EventType::AttentionRequired) => {
                println!(
                    "  needs attention: {} {}",
                    data["reason"].as_str().unwrap_or_default(),
                    data["message"].as_str().map(|m| format!("({m})")).unwrap_or_default()
                );
            }
            FeedType::Durable(EventType::TurnStatus)
                if data["status"].as_str().and_then(|s| s.parse::<RunStatus>().ok()) != Some(RunStatus::Running) =>
            {
                let detail = data["error_key"].as_str().map(|k| format!(": {k}")).unwrap_or_default();
                let message = data["message"].as_str().map(|m| format!(" ({m})")).unwrap_or_default();
                println!("turn {}{detail}{message}", data["status"].as_str().unwrap_or_default());
            }
            _ => {}
        }
    }
    let row = api.execution(caller, execution).await.map_err(|r| step("read the execution")(r.message))?;
    finish(&row, execution)
}

fn finish(row: &Value, execution: nexus_proto::ExecutionId) -> Result<QuickstartOutcome, QuickstartError> {
    match (row["status"].as_str(), row["final_text"].as_str()) {
        (Some("completed"), Some(text)) => {
            println!("\nfinal answer: {text}");
            Ok(QuickstartOutcome { final_text: text.to_owned(), execution_public_id: execution })
        }
        (status, _) => Err(QuickstartError::NoAnswer {
            status: status.unwrap_or("unknown").to_owned(),
            error_key: row["error_key"].as_str().unwrap_or("none").to_owned(),
        }),
    }
}
