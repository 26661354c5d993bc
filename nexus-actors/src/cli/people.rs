//! The command line for people: `nexus run`, `nexus executions ...`, `nexus approve|deny|answer`,
//! `nexus conversations ...`, `nexus runners list`, `nexus profile get|put` and `nexus login`
//! (README "The command line"). Each command is one or a few requests to the HTTP doors
//! ([`super::client`]); `--json` prints the doors' own JSON for scripts, one value per line.
//!
//! Following an execution (`nexus run --follow`, `nexus executions watch`) prints the answer as
//! it streams, each tool call with its runner and result, and, when standard input and output
//! are a terminal, asks the person to approve or deny a parked call and to answer a question of
//! `ask`; it never asks otherwise, and prints the command that decides instead. A stream cut
//! (a node stopping, a dropped connection) is followed again from its last cursor, so nothing is
//! missed or shown twice.

use std::io::{IsTerminal, Write};

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::client::{Client, ClientError, Credentials, save_credentials};
use super::follow::Follower;

/// Where the command's server and token come from (flags, then `NEXUS_URL`/`NEXUS_TOKEN`, then
/// the saved login), and how it prints.
#[derive(Clone, Debug, Args)]
pub struct ClientArgs {
    /// The server's base URL (default: the saved login's, else http://127.0.0.1:7740).
    #[arg(long, env = "NEXUS_URL")]
    pub url: Option<String>,
    /// A member's bearer token (default: the saved login's).
    #[arg(long, env = "NEXUS_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the doors' JSON, one value per line, for scripts.
    #[arg(long)]
    pub json: bool,
}

/// The commands for people.
#[derive(Debug, Subcommand)]
pub enum PeopleCommand {
    /// Check a server URL and token, and save them for the commands below.
    Login {
        /// The server's base URL.
        #[arg(long, env = "NEXUS_URL", default_value = super::client::DEFAULT_URL)]
        url: String,
        /// The member's token (default: read from standard input).
        #[arg(long, env = "NEXUS_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Post an input; with --follow, print the answer as it streams and ask at the terminal
    /// when a call waits for a decision.
    Run {
        /// The input's text.
        text: String,
        /// Post it to this conversation (default: a new one).
        #[arg(long)]
        conversation: Option<String>,
        /// For a Human steward: the Agent whose profile answers.
        #[arg(long)]
        agent: Option<String>,
        /// Follow the execution to its end.
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Executions: list, show, watch, and control them.
    Executions {
        #[command(subcommand)]
        command: ExecutionsCommand,
    },
    /// Approve a call parked for approval: it runs on its runner.
    Approve {
        /// The execution's id.
        execution: String,
        /// The task's key (e.g. r1t0).
        task: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Deny a parked call: it fails approval_denied, and the model reads why.
    Deny {
        /// The execution's id.
        execution: String,
        /// The task's key.
        task: String,
        /// Why (the model reads its first 256 bytes).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Answer a question the model asked with `ask`: one text, or several options for a
    /// multiple-choice question.
    Answer {
        /// The execution's id.
        execution: String,
        /// The task's key.
        task: String,
        /// The answer (several for a multiple choice).
        #[arg(required = true)]
        answer: Vec<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Conversations: list them, or show one with its turns.
    Conversations {
        #[command(subcommand)]
        command: ConversationsCommand,
    },
    /// Runners: list them with their presence and tools.
    Runners {
        #[command(subcommand)]
        command: RunnersCommand,
    },
    /// The Agent's profile: read it, or declare its configuration from a JSON file.
    Profile {
        #[command(subcommand)]
        command: ProfileCommand,
    },
}

/// `nexus executions ...`.
#[derive(Debug, Subcommand)]
pub enum ExecutionsCommand {
    /// The newest executions (at most 200).
    List {
        /// Only this conversation's.
        #[arg(long)]
        conversation: Option<String>,
        /// Only those in this status (running, paused, completed, ...).
        #[arg(long)]
        status: Option<String>,
        /// How many (1 to 200).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// One execution with its tasks.
    Show {
        /// The execution's id.
        execution: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Follow an execution's events to its end, asking at the terminal for decisions.
    Watch {
        /// The execution's id.
        execution: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Stop it: settle what is open and end `canceled` (--force: at once).
    Stop {
        /// The execution's id.
        execution: String,
        /// Cancel open calls instead of letting them drain.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Pause it: its deadlines freeze until it resumes.
    Pause {
        /// The execution's id.
        execution: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Resume a paused execution.
    Resume {
        /// The execution's id.
        execution: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Run an ended execution's input again, as a new execution.
    Regenerate {
        /// The execution's id.
        execution: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// `nexus conversations ...`.
#[derive(Debug, Subcommand)]
pub enum ConversationsCommand {
    /// The newest conversations.
    List {
        /// How many (1 to 200).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// One conversation with its turns.
    Show {
        /// The conversation's id.
        conversation: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// `nexus runners ...`.
#[derive(Debug, Subcommand)]
pub enum RunnersCommand {
    /// The runners this member may use, with presence and tools.
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// `nexus profile ...`.
#[derive(Debug, Subcommand)]
pub enum ProfileCommand {
    /// The Agent's profile.
    Get {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Declare the configuration from a JSON file `{"configuration": {...}}` (as `PUT
    /// /agent_api/v1/profile/configuration` takes it).
    Put {
        /// The JSON file.
        file: std::path::PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// Runs `command`; the process's exit code: 0 on success (a followed execution `completed`), 1
/// when a followed execution ended otherwise, 2 when the command failed (its error printed on
/// standard error, or as `{"code", "message"}` with `--json`).
pub async fn run(command: PeopleCommand) -> i32 {
    let json = json_flag(&command);
    match dispatch(command).await {
        Ok(code) => code,
        Err(error) => {
            if json {
                say(&json!({"code": error.code(), "message": error.to_string()}).to_string());
            } else {
                eprintln!("nexus: {error}");
            }
            2
        }
    }
}

fn json_flag(command: &PeopleCommand) -> bool {
    use ExecutionsCommand as E;
    let client = match command {
        PeopleCommand::Login { .. } => return false,
        PeopleCommand::Run { client, .. }
        | PeopleCommand::Approve { client, .. }
        | PeopleCommand::Deny { client, .. }
        | PeopleCommand::Answer { client, .. } => client,
        PeopleCommand::Executions { command } => match command {
            E::List { client, .. }
            | E::Show { client, .. }
            | E::Watch { client, .. }
            | E::Stop { client, .. }
            | E::Pause { client, .. }
            | E::Resume { client, .. }
            | E::Regenerate { client, .. } => client,
        },
        PeopleCommand::Conversations { command } => match command {
            ConversationsCommand::List { client, .. } | ConversationsCommand::Show { client, .. } => client,
        },
        PeopleCommand::Runners { command: RunnersCommand::List { client } } => client,
        PeopleCommand::Profile { command } => match command {
            ProfileCommand::Get { client } | ProfileCommand::Put { client, .. } => client,
        },
    };
    client.json
}

fn connect(args: &ClientArgs) -> Result<Client, ClientError> {
    Client::resolve(args.url.clone(), args.token.clone())
}

/// Prints `value` as one JSON line (`--json`), else `human`'s text, its control characters
/// made visible ([`clean`]).
fn print(json: bool, value: &Value, human: impl FnOnce(&Value) -> String) {
    if json {
        say(&value.to_string());
    } else {
        say(&clean(&human(value)));
    }
}

/// Writes `text` and a newline to standard output. A reader that went away (`| head -1`) ends
/// the command quietly; any other failure to write (a full disk) ends it with exit code 2.
pub(super) fn say(text: &str) {
    say_inline(&format!("{text}\n"));
}

/// [`say`] without the newline, flushed.
pub(super) fn say_inline(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(error) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("nexus: cannot write the output: {error}");
        std::process::exit(2);
    }
}

/// `text` for a terminal: control characters other than newline and tab (an escape sequence in
/// a tool's output or a model's answer could recolour, retitle or clear the screen, or draw a
/// fake prompt) shown as `\u{1b}` instead of acted on.
pub(super) fn clean(text: &str) -> String {
    if !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return text.to_owned();
    }
    text.chars()
        .map(|c| if c.is_control() && c != '\n' && c != '\t' { c.escape_unicode().to_string() } else { c.to_string() })
        .collect()
}

/// `id` checked as a UUID before it goes into a path.
fn id(what: &str, value: &str) -> Result<String, ClientError> {
    uuid::Uuid::parse_str(value)
        .map(|id| id.to_string())
        .map_err(|_| ClientError::Usage(format!("{what} {value:?} is not a UUID")))
}

/// A task key checked before it goes into a path: `r1t0`, `r2h1`, ... (letters and digits).
fn task_key(value: &str) -> Result<String, ClientError> {
    if !value.is_empty() && value.len() <= 64 && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Ok(value.to_owned());
    }
    Err(ClientError::Usage(format!("task {value:?} is not a task key (like r1t0)")))
}

async fn dispatch(command: PeopleCommand) -> Result<i32, ClientError> {
    match command {
        PeopleCommand::Login { url, token } => login(&url, token).await,
        PeopleCommand::Run { text, conversation, agent, follow, client } => {
            let http = connect(&client)?;
            let mut body = json!({"text": text});
            if let Some(conversation) = conversation {
                body["conversation_public_id"] = json!(id("--conversation", &conversation)?);
            }
            if let Some(agent) = agent {
                body["agent_public_id"] = json!(id("--agent", &agent)?);
            }
            let admitted = http.post("/agent_api/v1/inputs", &body).await?;
            let execution = admitted["execution_public_id"].as_str().unwrap_or_default().to_owned();
            if !follow {
                print(client.json, &admitted, |a| {
                    format!(
                        "execution {} in conversation {}\nfollow it: nexus executions watch {}",
                        text_of(&a["execution_public_id"]),
                        text_of(&a["conversation_public_id"]),
                        text_of(&a["execution_public_id"])
                    )
                });
                return Ok(0);
            }
            if client.json {
                say(&admitted.to_string());
            } else {
                eprintln!("· execution {execution} in conversation {}", text_of(&admitted["conversation_public_id"]));
            }
            Follower::new(&http, &execution, client.json).follow().await
        }
        PeopleCommand::Executions { command } => executions(command).await,
        PeopleCommand::Approve { execution, task, client } => {
            let http = connect(&client)?;
            let path =
                format!("/agent_api/v1/executions/{}/tasks/{}/approve", id("execution", &execution)?, task_key(&task)?);
            let task = http.post(&path, &json!({})).await?;
            print(client.json, &task, |t| format!("approved {}: {}", text_of(&t["task_key"]), text_of(&t["status"])));
            Ok(0)
        }
        PeopleCommand::Deny { execution, task, reason, client } => {
            let http = connect(&client)?;
            let path =
                format!("/agent_api/v1/executions/{}/tasks/{}/deny", id("execution", &execution)?, task_key(&task)?);
            let body = reason.map_or_else(|| json!({}), |reason| json!({"reason": reason}));
            let task = http.post(&path, &body).await?;
            print(client.json, &task, |t| format!("denied {}: {}", text_of(&t["task_key"]), text_of(&t["status"])));
            Ok(0)
        }
        PeopleCommand::Answer { execution, task, mut answer, client } => {
            let http = connect(&client)?;
            let path =
                format!("/agent_api/v1/executions/{}/tasks/{}/answer", id("execution", &execution)?, task_key(&task)?);
            let answer = if answer.len() == 1 { json!(answer.remove(0)) } else { json!(answer) };
            let task = http.post(&path, &json!({"answer": answer})).await?;
            print(client.json, &task, |t| format!("answered {}: {}", text_of(&t["task_key"]), text_of(&t["status"])));
            Ok(0)
        }
        PeopleCommand::Conversations { command } => conversations(command).await,
        PeopleCommand::Runners { command: RunnersCommand::List { client } } => {
            let http = connect(&client)?;
            let listed = http.get("/agent_api/v1/executors?kind=runner").await?;
            print(client.json, &listed, |l| runners_table(&l["executors"]));
            Ok(0)
        }
        PeopleCommand::Profile { command: ProfileCommand::Get { client } } => {
            let http = connect(&client)?;
            let profile = http.get("/agent_api/v1/profile").await?;
            print(client.json, &profile, pretty);
            Ok(0)
        }
        PeopleCommand::Profile { command: ProfileCommand::Put { file, client } } => {
            let http = connect(&client)?;
            let text = std::fs::read_to_string(&file)
                .map_err(|e| ClientError::Usage(format!("cannot read {}: {e}", file.display())))?;
            // Checked here for a clear message, then sent as written: the door judges it (a key
            // given twice is refused there, not silently collapsed here).
            serde_json::from_str::<Value>(&text)
                .map_err(|e| ClientError::Usage(format!("{} is not JSON: {e}", file.display())))?;
            let profile = http.put_raw("/agent_api/v1/profile/configuration", text).await?;
            print(client.json, &profile, pretty);
            Ok(0)
        }
    }
}

async fn login(url: &str, token: Option<String>) -> Result<i32, ClientError> {
    let token =
        match token {
            Some(token) => token,
            None => {
                if std::io::stdin().is_terminal() {
                    eprint!("token: ");
                    let _ = std::io::stderr().flush();
                }
                read_line().await.map(|line| line.trim().to_owned()).filter(|line| !line.is_empty()).ok_or_else(
                    || ClientError::Usage("no token: pass --token, or type it on standard input".to_owned()),
                )?
            }
        };
    let client = Client::new(url, &token)?;
    // Any readable listing proves the URL and the token, for an Agent and a Human alike.
    client.get("/agent_api/v1/conversations?limit=1").await?;
    let path = save_credentials(&Credentials { url: Some(client.url().to_owned()), token: Some(token) })?;
    say(&format!("logged in to {}; saved in {}", client.url(), path.display()));
    Ok(0)
}

async fn executions(command: ExecutionsCommand) -> Result<i32, ClientError> {
    match command {
        ExecutionsCommand::List { conversation, status, limit, client } => {
            let http = connect(&client)?;
            let mut path = format!("/agent_api/v1/executions?limit={limit}");
            if let Some(conversation) = conversation {
                path.push_str(&format!("&conversation={}", id("--conversation", &conversation)?));
            }
            if let Some(status) = status {
                let status: nexus_proto::RunStatus =
                    status.parse().map_err(|e| ClientError::Usage(format!("--status: {e}")))?;
                path.push_str(&format!("&status={status}"));
            }
            let listed = http.get(&path).await?;
            print(client.json, &listed, |l| executions_table(&l["executions"]));
            Ok(0)
        }
        ExecutionsCommand::Show { execution, client } => {
            let http = connect(&client)?;
            let shown = http.get(&format!("/agent_api/v1/executions/{}", id("execution", &execution)?)).await?;
            print(client.json, &shown, execution_text);
            Ok(0)
        }
        ExecutionsCommand::Watch { execution, client } => {
            let http = connect(&client)?;
            let execution = id("execution", &execution)?;
            Follower::new(&http, &execution, client.json).follow().await
        }
        ExecutionsCommand::Stop { execution, force, client } => {
            control(&client, &execution, "stop", json!({"force": force})).await
        }
        ExecutionsCommand::Pause { execution, client } => control(&client, &execution, "pause", json!({})).await,
        ExecutionsCommand::Resume { execution, client } => control(&client, &execution, "resume", json!({})).await,
        ExecutionsCommand::Regenerate { execution, client } => {
            let http = connect(&client)?;
            let path = format!("/agent_api/v1/executions/{}/regenerate", id("execution", &execution)?);
            let made = http.post(&path, &json!({})).await?;
            print(client.json, &made, |m| {
                format!(
                    "execution {} regenerates {}\nfollow it: nexus executions watch {}",
                    text_of(&m["execution_public_id"]),
                    text_of(&m["regenerated_from"]),
                    text_of(&m["execution_public_id"])
                )
            });
            Ok(0)
        }
    }
}

async fn control(client: &ClientArgs, execution: &str, door: &str, body: Value) -> Result<i32, ClientError> {
    let http = connect(client)?;
    let path = format!("/agent_api/v1/executions/{}/{door}", id("execution", execution)?);
    let answered = http.post(&path, &body).await?;
    print(client.json, &answered, |a| {
        format!("execution {}: {}", text_of(&a["execution_public_id"]), text_of(&a["status"]))
    });
    Ok(0)
}

async fn conversations(command: ConversationsCommand) -> Result<i32, ClientError> {
    match command {
        ConversationsCommand::List { limit, client } => {
            let http = connect(&client)?;
            let listed = http.get(&format!("/agent_api/v1/conversations?limit={limit}")).await?;
            print(client.json, &listed, |l| conversations_table(&l["conversations"]));
            Ok(0)
        }
        ConversationsCommand::Show { conversation, client } => {
            let http = connect(&client)?;
            let shown =
                http.get(&format!("/agent_api/v1/conversations/{}", id("conversation", &conversation)?)).await?;
            print(client.json, &shown, conversation_text);
            Ok(0)
        }
    }
}

/// A JSON value as text: a string as it is, null as `-`, anything else as JSON.
pub(super) fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// `text` cut to `chars` characters on one line, with `…` when cut.
pub(super) fn preview(text: &str, chars: usize) -> String {
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line,
    }
}

/// How long ago `at` (Unix ms) was: `42s`, `5m`, `3h`, `2d`.
fn age(at: &Value) -> String {
    let Some(at) = at.as_i64() else { return "-".to_owned() };
    let now = crate::clock::Clock::system().now_ms();
    let seconds = (now - at).max(0) / 1000;
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Rows as aligned columns under `header`.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> =
            cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}", width = *width)).collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut out = vec![line(header.iter().map(|h| (*h).to_owned()).collect())];
    out.extend(rows.into_iter().map(line));
    out.join("\n")
}

fn executions_table(executions: &Value) -> String {
    let rows = executions
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            vec![
                text_of(&e["execution_public_id"]),
                text_of(&e["status"]),
                text_of(&e["round"]),
                text_of(&e["conversation_public_id"]),
                age(&e["updated_at"]),
            ]
        })
        .collect();
    table(&["EXECUTION", "STATUS", "ROUND", "CONVERSATION", "UPDATED"], rows)
}

fn conversations_table(conversations: &Value) -> String {
    let rows = conversations
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            vec![
                text_of(&c["conversation_public_id"]),
                text_of(&c["turn_count"]),
                text_of(&c["last_status"]),
                text_of(&c["last_execution_public_id"]),
                age(&c["last_turn_at"]),
            ]
        })
        .collect();
    table(&["CONVERSATION", "TURNS", "LAST STATUS", "LAST EXECUTION", "LAST TURN"], rows)
}

fn runners_table(executors: &Value) -> String {
    let rows = executors
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let tools: Vec<String> = r["served_tools"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| t["name"].as_str().map_or_else(|| text_of(t), str::to_owned))
                .collect();
            vec![
                text_of(&r["public_id"]),
                text_of(&r["display_name"]),
                text_of(&r["presence"]),
                age(&r["last_seen_at"]),
                preview(&tools.join(","), 60),
            ]
        })
        .collect();
    table(&["RUNNER", "NAME", "PRESENCE", "LAST SEEN", "TOOLS"], rows)
}

fn execution_text(e: &Value) -> String {
    let mut out = vec![
        format!("execution     {}", text_of(&e["execution_public_id"])),
        format!("conversation  {}", text_of(&e["conversation_public_id"])),
        format!("status        {}", text_of(&e["status"])),
        format!("round         {}", text_of(&e["round"])),
    ];
    if !e["error_key"].is_null() {
        out.push(format!("error         {}", text_of(&e["error_key"])));
    }
    let rows = e["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            vec![
                text_of(&t["task_key"]),
                text_of(&t["tool_name"]),
                text_of(&t["status"]),
                text_of(&t["runner_executor_public_id"]),
            ]
        })
        .collect::<Vec<_>>();
    if !rows.is_empty() {
        out.push(String::new());
        out.push(table(&["TASK", "TOOL", "STATUS", "RUNNER"], rows));
    }
    if let Some(text) = e["final_text"].as_str() {
        out.push(String::new());
        out.push(text.to_owned());
    }
    out.join("\n")
}

fn conversation_text(c: &Value) -> String {
    let mut out = vec![format!("conversation  {}", text_of(&c["conversation_public_id"]))];
    for turn in c["turns"].as_array().into_iter().flatten() {
        out.push(String::new());
        out.push(format!(
            "turn {} ({}, execution {})",
            text_of(&turn["turn"]),
            text_of(&turn["status"]),
            text_of(&turn["execution_public_id"])
        ));
        out.push(format!("> {}", text_of(&turn["text"])));
        if let Some(answer) = turn["final_text"].as_str() {
            out.push(answer.to_owned());
        }
    }
    out.join("\n")
}

/// One line of standard input, or `None` at its end.
pub(super) async fn read_line() -> Option<String> {
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        match std::io::stdin().read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line),
        }
    })
    .await
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_previews_cut() {
        let text = table(&["A", "BB"], vec![vec!["long".into(), "x".into()]]);
        assert_eq!(text, "A     BB\nlong  x");
        assert_eq!(preview("a\nb   c", 10), "a b c");
        assert_eq!(preview("abcdef", 3), "abc…");
        assert_eq!(text_of(&Value::Null), "-");
        assert_eq!(clean("red \u{1b}[31mRED\u{7} ok\n"), "red \\u{1b}[31mRED\\u{7} ok\n");
        assert_eq!(clean("plain\ttext"), "plain\ttext");
    }

    #[test]
    fn ids_and_task_keys_are_checked_before_they_go_into_a_path() {
        assert!(id("execution", "../../etc").is_err());
        assert!(task_key("r1t0").is_ok());
        assert!(task_key("r1t0/../x").is_err());
        assert!(task_key("").is_err());
    }
}
