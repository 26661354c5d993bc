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
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::client::{Client, ClientError, Credentials, EventStream, StreamEvent, save_credentials};

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
                println!("{}", json!({"code": error.code(), "message": error.to_string()}));
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

/// Prints `value` as one JSON line (`--json`), else `human`'s text.
fn print(json: bool, value: &Value, human: impl FnOnce(&Value) -> String) {
    if json {
        println!("{value}");
    } else {
        println!("{}", human(value));
    }
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
                println!("{admitted}");
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
            let body: Value = serde_json::from_str(&text)
                .map_err(|e| ClientError::Usage(format!("{} is not JSON: {e}", file.display())))?;
            let profile = http.put("/agent_api/v1/profile/configuration", &body).await?;
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
    println!("logged in to {}; saved in {}", client.url(), path.display());
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
fn text_of(value: &Value) -> String {
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
fn preview(text: &str, chars: usize) -> String {
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
async fn read_line() -> Option<String> {
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

/// How long a follow tries to reach the server again after its stream broke.
const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// Follows one execution's events to its end ([`PeopleCommand::Run`] with `--follow`,
/// [`ExecutionsCommand::Watch`]).
struct Follower<'a> {
    client: &'a Client,
    execution: String,
    /// The last durable cursor seen: a new stream starts after it.
    cursor: String,
    json: bool,
    /// Whether the person can be asked: standard input and output are a terminal, and not
    /// `--json`.
    interactive: bool,
    /// The round whose text was printed from its deltas (so its `round_result` is not printed
    /// again).
    streamed: Option<i64>,
    /// Whether the last thing printed to stdout left the line open.
    open_line: bool,
    /// The last round whose `round_started` was shown.
    round: i64,
    /// Deltas of a later round than [`Follower::round`]: the feed may send a round's deltas
    /// before the durable events saved ahead of them (the settlements of the round before, its
    /// `round_started`), so they wait for their round to be shown.
    early: Vec<(i64, String)>,
}

impl<'a> Follower<'a> {
    fn new(client: &'a Client, execution: &str, json: bool) -> Follower<'a> {
        let interactive = !json && std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
        Follower {
            client,
            execution: execution.to_owned(),
            cursor: String::new(),
            json,
            interactive,
            streamed: None,
            open_line: false,
            round: 0,
            early: Vec::new(),
        }
    }

    /// Follows to the end: 0 when the execution completed, 1 when it ended otherwise.
    async fn follow(mut self) -> Result<i32, ClientError> {
        let mut broken_since: Option<tokio::time::Instant> = None;
        loop {
            match self.client.follow(&self.execution, &self.cursor, !self.json).await {
                Ok(stream) => {
                    broken_since = None;
                    if let Some(code) = self.read(stream).await? {
                        return Ok(code);
                    }
                }
                // Refusals other than `unavailable` are final (not found, not authorized, ...).
                Err(ClientError::Refused(refusal)) if refusal.code != nexus_proto::ErrorCode::Unavailable => {
                    return Err(ClientError::Refused(refusal));
                }
                Err(error) => {
                    let since = *broken_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() > RECONNECT_FOR {
                        return Err(error);
                    }
                    self.end_line();
                    eprintln!("· {error}; trying again");
                }
            }
            // The stream ended: the execution may be over, or the node went away.
            let shown = self.client.get(&format!("/agent_api/v1/executions/{}", self.execution)).await;
            if let Ok(shown) = &shown
                && let Some(code) = self.finished(shown)
            {
                return Ok(code);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Reads one stream to its end: `Some(exit code)` once the execution is over, `None` when
    /// the stream was cut before.
    async fn read(&mut self, mut stream: EventStream) -> Result<Option<i32>, ClientError> {
        loop {
            let event = match stream.next().await {
                Ok(Some(event)) => event,
                Ok(None) => return Ok(None),
                Err(error) => {
                    self.end_line();
                    eprintln!("· {error}; following again from {}", self.shown_cursor());
                    return Ok(None);
                }
            };
            if !event.id.is_empty() {
                self.cursor.clone_from(&event.id);
            }
            if event.event == "error" {
                self.end_line();
                let code = event.data["code"].as_str().unwrap_or_default();
                eprintln!("· {}", text_of(&event.data["message"]));
                if code == "unavailable" {
                    return Ok(None);
                }
                return Err(ClientError::Transport(format!("the event stream ended: {}", event.data)));
            }
            if self.json {
                println!("{}", json!({"id": event.id, "event": event.event, "data": event.data}));
            } else {
                self.show(&event);
            }
            match event.event.as_str() {
                "approval_required" => self.decide(&event.data["data"]).await?,
                "input_required" => self.answer(&event.data["data"]).await?,
                _ => {}
            }
        }
    }

    fn shown_cursor(&self) -> &str {
        if self.cursor.is_empty() { "the start" } else { &self.cursor }
    }

    /// The exit code once `shown` (the execution's view) is quiet, else `None`.
    fn finished(&mut self, shown: &Value) -> Option<i32> {
        let status = shown["status"].as_str()?;
        let code = match status {
            "completed" => 0,
            "canceled" | "needs_attention" => 1,
            _ => return None,
        };
        self.end_line();
        if !self.json && status != "completed" {
            eprintln!(
                "· execution {}: {status}{}",
                self.execution,
                shown["error_key"].as_str().map(|key| format!(" ({key})")).unwrap_or_default()
            );
        }
        Some(code)
    }

    fn print_delta(&mut self, round: Option<i64>, text: &str) {
        print!("{text}");
        let _ = std::io::stdout().flush();
        self.open_line = true;
        self.streamed = round;
    }

    fn end_line(&mut self) {
        if self.open_line {
            println!();
            self.open_line = false;
        }
    }

    /// Prints one event for a person.
    fn show(&mut self, event: &StreamEvent) {
        let data = &event.data["data"];
        match event.event.as_str() {
            "text_delta" => {
                let text = data["text"].as_str().unwrap_or_default().to_owned();
                match data["round"].as_i64() {
                    Some(round) if round > self.round => self.early.push((round, text)),
                    round => self.print_delta(round, &text),
                }
            }
            "round_started" => {
                self.end_line();
                eprintln!("· round {} ({})", text_of(&data["round"]), text_of(&data["model"]));
                self.round = data["round"].as_i64().unwrap_or(self.round);
                let (now, later): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut self.early).into_iter().partition(|(round, _)| *round <= self.round);
                self.early = later;
                for (round, text) in now {
                    self.print_delta(Some(round), &text);
                }
            }
            "round_result" => {
                let calls = data["tool_calls"].as_array().is_some_and(|calls| !calls.is_empty());
                let text = data["text"].as_str().unwrap_or_default();
                if self.streamed != data["round"].as_i64() && !text.is_empty() {
                    self.end_line();
                    println!("{text}");
                } else if !calls {
                    self.end_line();
                }
                self.end_line();
            }
            "task_status" => {
                self.end_line();
                let tool = text_of(&data["tool_name"]);
                let key = text_of(&data["task_key"]);
                let runner = match &data["runner_executor_public_id"] {
                    Value::Null => "in nexus".to_owned(),
                    runner => format!("on runner {}", text_of(runner)),
                };
                match data["status"].as_str().unwrap_or_default() {
                    "dispatched" | "running" => println!("→ {tool} [{key}] {runner}"),
                    "needs_approval" | "awaiting_input" | "waiting" => {}
                    status => {
                        let content = data["content"].as_str().map(|c| format!(": {}", preview(c, 200)));
                        println!("← {tool} [{key}] {status}{}", content.unwrap_or_default());
                    }
                }
            }
            "approval_required" => {
                self.end_line();
                println!(
                    "? {} [{}] on runner {} waits for approval; input {}",
                    text_of(&data["tool_name"]),
                    text_of(&data["task_key"]),
                    text_of(&data["runner_executor_public_id"]),
                    preview(&data["tool_input"].to_string(), 300)
                );
            }
            "input_required" => {
                self.end_line();
                println!("? {}", text_of(&data["prompt"]));
                for (n, option) in data["options"].as_array().into_iter().flatten().enumerate() {
                    println!("  {}. {}", n + 1, text_of(option));
                }
            }
            "attention_required" => {
                self.end_line();
                println!("! needs attention: {}", text_of(&data["message"]));
            }
            "model_change" => {
                self.end_line();
                eprintln!(
                    "· model {} → {} ({})",
                    text_of(&data["from"]),
                    text_of(&data["to"]),
                    text_of(&data["reason"])
                );
            }
            "turn_status" => {
                let status = data["status"].as_str().unwrap_or_default();
                if matches!(status, "paused" | "canceling" | "canceled" | "failed" | "needs_attention") {
                    self.end_line();
                    eprintln!(
                        "· {status}{}",
                        data["error_key"].as_str().map(|k| format!(" ({k})")).unwrap_or_default()
                    );
                }
            }
            "stream_reset" => {
                self.end_line();
                eprintln!("· the model's answer started again ({})", text_of(&data["reason"]));
            }
            _ => {}
        }
    }

    /// Whether task `key` is still in `status` (as far as the execution's first page of tasks
    /// shows; a task past it is taken to be).
    async fn still(&self, key: &str, status: &str) -> bool {
        let Ok(shown) = self.client.get(&format!("/agent_api/v1/executions/{}", self.execution)).await else {
            return true;
        };
        let tasks = shown["tasks"].as_array().cloned().unwrap_or_default();
        tasks.iter().find(|task| task["task_key"] == key).is_none_or(|task| task["status"] == status)
    }

    /// Asks the person to approve or deny a parked call; without a terminal, says how to.
    async fn decide(&mut self, data: &Value) -> Result<(), ClientError> {
        let key = text_of(&data["task_key"]);
        let base = format!("/agent_api/v1/executions/{}/tasks/{key}", self.execution);
        if !self.interactive {
            if !self.json {
                println!(
                    "  decide with: nexus approve {0} {key}   or: nexus deny {0} {key} --reason TEXT",
                    self.execution
                );
            }
            return Ok(());
        }
        // A watch replays past events: ask only for a call that still waits.
        if !self.still(&key, "needs_approval").await {
            return Ok(());
        }
        loop {
            print!("  approve? [y/n] ");
            let _ = std::io::stdout().flush();
            let Some(line) = read_line().await else {
                println!("\n  left waiting; decide with: nexus approve {} {key}", self.execution);
                return Ok(());
            };
            let (door, body) = match line.trim().to_ascii_lowercase().as_str() {
                "y" | "yes" => ("approve", json!({})),
                "n" | "no" => ("deny", json!({"reason": "denied at the terminal"})),
                _ => continue,
            };
            return match self.client.post(&format!("{base}/{door}"), &body).await {
                Ok(_) => {
                    println!("  {}", if door == "approve" { "approved" } else { "denied" });
                    Ok(())
                }
                // Decided elsewhere meanwhile, or the hold ran out: the events tell what happened.
                Err(ClientError::Refused(refusal)) => {
                    println!("  not {door}d: {}", refusal.message);
                    Ok(())
                }
                Err(error) => Err(error),
            };
        }
    }

    /// Asks the person to answer a question of `ask`; without a terminal, says how to.
    async fn answer(&mut self, data: &Value) -> Result<(), ClientError> {
        let key = text_of(&data["task_key"]);
        if !self.interactive {
            if !self.json {
                println!("  answer with: nexus answer {} {key} TEXT", self.execution);
            }
            return Ok(());
        }
        if !self.still(&key, "awaiting_input").await {
            return Ok(());
        }
        let options: Vec<String> = data["options"].as_array().into_iter().flatten().map(text_of).collect();
        let multi = data["multi"].as_bool().unwrap_or(false);
        for _ in 0..5 {
            print!(
                "  {} ",
                if options.is_empty() {
                    "answer:"
                } else if multi {
                    "choose (1,2,...):"
                } else {
                    "choose:"
                }
            );
            let _ = std::io::stdout().flush();
            let Some(line) = read_line().await else {
                println!("\n  left waiting; answer with: nexus answer {} {key} TEXT", self.execution);
                return Ok(());
            };
            let answer = answer_of(line.trim(), &options, multi);
            let path = format!("/agent_api/v1/executions/{}/tasks/{key}/answer", self.execution);
            match self.client.post(&path, &json!({"answer": answer})).await {
                Ok(_) => {
                    println!("  answered");
                    return Ok(());
                }
                Err(ClientError::Refused(refusal)) if refusal.code == nexus_proto::ErrorCode::ValidationFailed => {
                    println!("  {}", refusal.message);
                }
                Err(ClientError::Refused(refusal)) => {
                    println!("  not answered: {}", refusal.message);
                    return Ok(());
                }
                Err(error) => return Err(error),
            }
        }
        println!("  left waiting; answer with: nexus answer {} {key} TEXT", self.execution);
        Ok(())
    }
}

/// What a typed line answers: an option by its number or its text; several, comma-separated,
/// for a multiple choice; any text without options.
fn answer_of(line: &str, options: &[String], multi: bool) -> Value {
    let pick = |part: &str| -> String {
        part.parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| options.get(i).cloned())
            .unwrap_or_else(|| part.to_owned())
    };
    if options.is_empty() {
        return json!(line);
    }
    if multi {
        return json!(line.split(',').map(str::trim).filter(|p| !p.is_empty()).map(pick).collect::<Vec<_>>());
    }
    json!(pick(line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_answers_pick_options_by_number_or_text() {
        let options = vec!["red".to_owned(), "blue".to_owned()];
        assert_eq!(answer_of("2", &options, false), json!("blue"));
        assert_eq!(answer_of("red", &options, false), json!("red"));
        assert_eq!(answer_of("1, blue", &options, true), json!(["red", "blue"]));
        assert_eq!(answer_of("3", &options, false), json!("3"), "out of range stays as typed; the door judges it");
        assert_eq!(answer_of("anything at all", &[], false), json!("anything at all"));
    }

    #[test]
    fn tables_align_and_previews_cut() {
        let text = table(&["A", "BB"], vec![vec!["long".into(), "x".into()]]);
        assert_eq!(text, "A     BB\nlong  x");
        assert_eq!(preview("a\nb   c", 10), "a b c");
        assert_eq!(preview("abcdef", 3), "abc…");
        assert_eq!(text_of(&Value::Null), "-");
    }

    #[test]
    fn ids_and_task_keys_are_checked_before_they_go_into_a_path() {
        assert!(id("execution", "../../etc").is_err());
        assert!(task_key("r1t0").is_ok());
        assert!(task_key("r1t0/../x").is_err());
        assert!(task_key("").is_err());
    }
}
