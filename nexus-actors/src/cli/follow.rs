//! Following one execution for a person (`nexus run --follow`, `nexus executions watch`; README
//! "The command line"): its answer as it streams, each call with its runner and result, the
//! runners' progress, and at a terminal the questions only a person can answer (approve or deny
//! a parked call, answer a question of `ask`).
//!
//! The stream is read while a question waits at the terminal, so a call decided elsewhere (or
//! an execution paused or ended meanwhile) takes the question back instead of leaving it
//! standing. A cut stream is followed again from its last cursor; what a person reads is never
//! shown twice, and an answer whose start this watch did not see is shown again in full.

use std::collections::{HashMap, VecDeque};
use std::io::IsTerminal;
use std::time::Duration;

use serde_json::{Value, json};

use super::client::{Client, ClientError, EventStream, StreamEvent};
use super::people::{clean, preview, say, say_inline, text_of};

/// How long a follow tries to reach the server again after its stream broke.
const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// How often one task's progress is shown, at most.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

const QUIET: [&str; 3] = ["completed", "canceled", "needs_attention"];

/// Lines typed at the terminal, read on one thread for the whole follow: a question taken back
/// leaves no read pending that would swallow the answer to the next one.
struct Terminal {
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Terminal {
    fn open() -> Terminal {
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            while matches!(std::io::stdin().read_line(&mut line), Ok(n) if n > 0) {
                if tx.send(std::mem::take(&mut line)).is_err() {
                    break;
                }
            }
        });
        Terminal { lines }
    }

    /// The next line; `None` once standard input ended.
    async fn line(&mut self) -> Option<String> {
        self.lines.recv().await
    }

    /// Drops what was typed before the question was asked.
    fn forget_typed_ahead(&mut self) {
        while self.lines.try_recv().is_ok() {}
    }
}

/// A question for the person: approve a parked call, or answer a call of `ask`.
#[derive(Clone, Debug)]
enum Question {
    Approval { key: String },
    Answer { key: String, options: Vec<String>, multi: bool, tries: u32 },
}

impl Question {
    fn key(&self) -> &str {
        match self {
            Question::Approval { key } | Question::Answer { key, .. } => key,
        }
    }

    /// The status its task has while the question stands.
    fn waiting_status(&self) -> &'static str {
        match self {
            Question::Approval { .. } => "needs_approval",
            Question::Answer { .. } => "awaiting_input",
        }
    }
}

enum Next {
    Event(Result<Option<StreamEvent>, ClientError>),
    Line(Option<String>),
}

/// Follows one execution's events to its end.
pub(super) struct Follower<'a> {
    client: &'a Client,
    execution: String,
    /// The last durable cursor seen: a new stream starts after it.
    cursor: String,
    json: bool,
    terminal: Option<Terminal>,
    /// The question shown at the terminal, and those waiting their turn.
    asking: Option<Question>,
    queued: VecDeque<Question>,
    /// The round whose text this follow printed from its deltas, and that text.
    spoken: Option<(i64, String)>,
    /// Whether the last thing printed to stdout left the line open.
    open_line: bool,
    /// The last round whose `round_started` was shown.
    round: i64,
    /// Deltas of a later round than [`Follower::round`]: the feed may send a round's deltas
    /// before the durable events saved ahead of them (the settlements of the round before, its
    /// `round_started`), so they wait for their round to be shown.
    early: Vec<(i64, String)>,
    /// When each task's progress was last shown.
    progress_shown: HashMap<String, tokio::time::Instant>,
    /// Whether the last attempt to follow failed (said once per outage).
    failing: bool,
}

impl<'a> Follower<'a> {
    pub(super) fn new(client: &'a Client, execution: &str, json: bool) -> Follower<'a> {
        let interactive = !json && std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
        Follower {
            client,
            execution: execution.to_owned(),
            cursor: String::new(),
            json,
            terminal: interactive.then(Terminal::open),
            asking: None,
            queued: VecDeque::new(),
            spoken: None,
            open_line: false,
            round: 0,
            early: Vec::new(),
            progress_shown: HashMap::new(),
            failing: false,
        }
    }

    /// Follows to the end: 0 when the execution completed, 1 when it ended otherwise.
    ///
    /// # Errors
    /// A refusal of the doors other than `unavailable`, an answer that is not nexus's, or no
    /// answer at all for [`RECONNECT_FOR`].
    pub(super) async fn follow(mut self) -> Result<i32, ClientError> {
        let mut broken_since: Option<tokio::time::Instant> = None;
        loop {
            match self.client.follow(&self.execution, &self.cursor, !self.json).await {
                Ok(stream) => {
                    broken_since = None;
                    if self.failing {
                        self.failing = false;
                        self.note(&format!("following again after {}", self.shown_cursor()));
                    }
                    if let Some(code) = self.read(stream).await? {
                        return Ok(code);
                    }
                }
                Err(ClientError::Refused(refusal)) if refusal.code != nexus_proto::ErrorCode::Unavailable => {
                    return Err(ClientError::Refused(refusal));
                }
                Err(error @ ClientError::NotNexus(_)) => return Err(error),
                Err(error) => {
                    let since = *broken_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() > RECONNECT_FOR {
                        return Err(error);
                    }
                    if !self.failing {
                        self.failing = true;
                        self.note(&format!("{error}; trying again for up to {} s", RECONNECT_FOR.as_secs()));
                    }
                }
            }
            // The stream ended: the execution may be over, or the node went away.
            if let Ok(shown) = self.client.get(&format!("/agent_api/v1/executions/{}", self.execution)).await
                && let Some(code) = self.finished(&shown)
            {
                return Ok(code);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// A line of progress on standard error.
    fn note(&mut self, text: &str) {
        self.end_line();
        eprintln!("· {}", clean(text));
    }

    fn shown_cursor(&self) -> String {
        if self.cursor.is_empty() { "the start".to_owned() } else { format!("cursor {}", self.cursor) }
    }

    /// Reads one stream to its end: `Some(exit code)` once the execution is over, `None` when
    /// the stream was cut before.
    async fn read(&mut self, mut stream: EventStream) -> Result<Option<i32>, ClientError> {
        loop {
            let next = match (&self.asking, self.terminal.as_mut()) {
                (Some(_), Some(terminal)) => tokio::select! {
                    line = terminal.line() => Next::Line(line),
                    event = stream.next() => Next::Event(event),
                },
                _ => Next::Event(stream.next().await),
            };
            let event = match next {
                Next::Line(line) => {
                    self.typed(line).await?;
                    continue;
                }
                Next::Event(Ok(Some(event))) => event,
                Next::Event(Ok(None)) => return Ok(None),
                Next::Event(Err(error)) => {
                    self.note(&format!("{error}; following again after {}", self.shown_cursor()));
                    return Ok(None);
                }
            };
            if !event.id.is_empty() {
                self.cursor.clone_from(&event.id);
            }
            if event.event == "error" {
                self.note(&text_of(&event.data["message"]));
                if event.data["code"] == "unavailable" {
                    return Ok(None);
                }
                return Err(ClientError::Transport(format!("the event stream ended: {}", event.data)));
            }
            if self.json {
                say(&json!({"id": event.id, "event": event.event, "data": event.data}).to_string());
            } else {
                self.show(&event);
            }
            self.after(&event).await?;
        }
    }

    /// What an event changes for the questions: a new one to ask, one taken back.
    async fn after(&mut self, event: &StreamEvent) -> Result<(), ClientError> {
        let data = &event.data["data"];
        match event.event.as_str() {
            "approval_required" => {
                self.queue(Question::Approval { key: text_of(&data["task_key"]) }).await?;
            }
            "input_required" => {
                let options = data["options"].as_array().into_iter().flatten().map(text_of).collect();
                let multi = data["multi"].as_bool().unwrap_or(false);
                self.queue(Question::Answer { key: text_of(&data["task_key"]), options, multi, tries: 0 }).await?;
            }
            "task_status" => {
                let key = text_of(&data["task_key"]);
                let status = data["status"].as_str().unwrap_or_default();
                if let Some(asking) = &self.asking
                    && asking.key() == key
                    && status != asking.waiting_status()
                {
                    self.asking = None;
                    say(&format!("\n  decided meanwhile: {key} is {status}"));
                    self.ask_next().await?;
                }
                self.queued.retain(|q| q.key() != key || status == q.waiting_status());
            }
            "turn_status" => {
                let status = data["status"].as_str().unwrap_or_default();
                if status != "running" {
                    // Paused, stopping or ended: nothing can be decided now.
                    if let Some(asking) = self.asking.take() {
                        self.queued.push_front(asking);
                        say(&format!("\n  the execution is {status}: decide once it runs again"));
                    }
                    if QUIET.contains(&status) || status == "canceling" {
                        self.queued.clear();
                    }
                } else if self.asking.is_none() {
                    // Resumed: what waited is asked again.
                    self.ask_next().await?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Asks `question` now, or after the one standing; without a terminal, says how to answer.
    async fn queue(&mut self, question: Question) -> Result<(), ClientError> {
        // A watch replays past events: only a call that still waits is asked about.
        if !self.still(&question).await {
            return Ok(());
        }
        if self.terminal.is_none() {
            if !self.json {
                self.hint(&question);
            }
            return Ok(());
        }
        self.queued.push_back(question);
        if self.asking.is_none() {
            self.ask_next().await?;
        }
        Ok(())
    }

    /// The command that answers `question`, printed where no terminal can.
    fn hint(&mut self, question: &Question) {
        self.end_line();
        let execution = &self.execution;
        match question {
            Question::Approval { key } => say(&format!(
                "  decide with: nexus approve {execution} {key}   or: nexus deny {execution} {key} --reason TEXT"
            )),
            Question::Answer { key, .. } => say(&format!("  answer with: nexus answer {execution} {key} TEXT")),
        }
    }

    /// Whether `question`'s task still waits in a running execution (as far as the execution's
    /// first page of tasks shows; a task past it is taken to).
    async fn still(&self, question: &Question) -> bool {
        let Ok(shown) = self.client.get(&format!("/agent_api/v1/executions/{}", self.execution)).await else {
            return true;
        };
        let tasks = shown["tasks"].as_array().cloned().unwrap_or_default();
        let waits = tasks
            .iter()
            .find(|task| task["task_key"] == question.key())
            .is_none_or(|task| task["status"] == question.waiting_status());
        waits && !QUIET.contains(&shown["status"].as_str().unwrap_or_default())
    }

    /// Shows the next question that still waits, if any.
    async fn ask_next(&mut self) -> Result<(), ClientError> {
        while let Some(question) = self.queued.pop_front() {
            if !self.still(&question).await {
                continue;
            }
            if let Some(terminal) = self.terminal.as_mut() {
                terminal.forget_typed_ahead();
            }
            self.prompt(&question);
            self.asking = Some(question);
            return Ok(());
        }
        Ok(())
    }

    fn prompt(&mut self, question: &Question) {
        self.end_line();
        match question {
            Question::Approval { key } => say_inline(&format!("  approve {key}? [y/n] ")),
            Question::Answer { options, multi, .. } => say_inline(if options.is_empty() {
                "  answer: "
            } else if *multi {
                "  choose (1,2,...): "
            } else {
                "  choose: "
            }),
        }
    }

    /// A line typed for the standing question.
    async fn typed(&mut self, line: Option<String>) -> Result<(), ClientError> {
        let Some(question) = self.asking.take() else { return Ok(()) };
        let Some(line) = line else {
            // Standard input ended: nothing more can be asked here.
            self.terminal = None;
            say("");
            for question in std::iter::once(question).chain(std::mem::take(&mut self.queued)) {
                self.hint(&question);
            }
            return Ok(());
        };
        let base = format!("/agent_api/v1/executions/{}/tasks/{}", self.execution, question.key());
        match &question {
            Question::Approval { key } => {
                let (door, body) = match line.trim().to_ascii_lowercase().as_str() {
                    "y" | "yes" => ("approve", json!({})),
                    "n" | "no" => ("deny", json!({"reason": "denied at the terminal"})),
                    _ => {
                        self.prompt(&question);
                        self.asking = Some(question);
                        return Ok(());
                    }
                };
                match self.client.post(&format!("{base}/{door}"), &body).await {
                    Ok(_) => say(if door == "approve" { "  approved" } else { "  denied" }),
                    // Decided elsewhere meanwhile, or the hold ran out: the events tell.
                    Err(ClientError::Refused(refusal)) => {
                        say(&format!("  {key} was not {door}d: {}", clean(&refusal.message)))
                    }
                    Err(error) => return Err(error),
                }
            }
            Question::Answer { options, multi, tries, .. } => {
                let answer = answer_of(line.trim(), options, *multi);
                match self.client.post(&format!("{base}/answer"), &json!({"answer": answer})).await {
                    Ok(_) => say("  answered"),
                    Err(ClientError::Refused(refusal))
                        if refusal.code == nexus_proto::ErrorCode::ValidationFailed && *tries < 4 =>
                    {
                        say(&format!("  not taken: {}", clean(&refusal.message)));
                        let mut again = question.clone();
                        if let Question::Answer { tries, .. } = &mut again {
                            *tries += 1;
                        }
                        self.prompt(&again);
                        self.asking = Some(again);
                        return Ok(());
                    }
                    Err(ClientError::Refused(refusal)) => say(&format!("  not answered: {}", clean(&refusal.message))),
                    Err(error) => return Err(error),
                }
            }
        }
        self.ask_next().await
    }

    /// The exit code once `shown` (the execution's view) is quiet, else `None`.
    fn finished(&mut self, shown: &Value) -> Option<i32> {
        let status = shown["status"].as_str()?;
        let code = match status {
            "completed" => 0,
            "canceled" | "needs_attention" => 1,
            _ => return None,
        };
        if !self.json && status != "completed" {
            let key = shown["error_key"].as_str().map(|key| format!(" ({key})")).unwrap_or_default();
            self.note(&format!("execution {}: {status}{key}", self.execution));
        }
        self.end_line();
        Some(code)
    }

    fn end_line(&mut self) {
        if self.open_line {
            say("");
            self.open_line = false;
        }
    }

    fn print_delta(&mut self, round: i64, text: &str) {
        say_inline(&clean(text));
        self.open_line = true;
        match &mut self.spoken {
            Some((spoken, said)) if *spoken == round => said.push_str(text),
            _ => self.spoken = Some((round, text.to_owned())),
        }
    }

    /// Prints one event for a person.
    fn show(&mut self, event: &StreamEvent) {
        let data = &event.data["data"];
        match event.event.as_str() {
            "text_delta" => {
                let text = data["text"].as_str().unwrap_or_default().to_owned();
                let round = data["round"].as_i64().unwrap_or(self.round);
                if round > self.round {
                    self.early.push((round, text));
                } else {
                    self.print_delta(round, &text);
                }
            }
            "round_started" => {
                let round = data["round"].as_i64().unwrap_or(self.round);
                self.note(&format!("round {round} ({})", text_of(&data["model"])));
                self.round = round;
                let (now, later): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut self.early).into_iter().partition(|(r, _)| *r <= round);
                self.early = later;
                for (round, text) in now {
                    self.print_delta(round, &text);
                }
            }
            "round_result" => {
                let text = data["text"].as_str().unwrap_or_default();
                let round = data["round"].as_i64();
                let spoken = self.spoken.take().filter(|(r, _)| Some(*r) == round).map(|(_, said)| said);
                match spoken {
                    // Streamed whole: only the line to end.
                    Some(said) if said == text => self.end_line(),
                    // This watch joined, or the stream was cut, in the middle of the answer.
                    Some(_) if !text.is_empty() => {
                        self.end_line();
                        self.note("the answer in full:");
                        say(&clean(text));
                    }
                    Some(_) => self.end_line(),
                    None if !text.is_empty() => {
                        self.end_line();
                        say(&clean(text));
                    }
                    None => {}
                }
            }
            "task_status" => {
                let tool = text_of(&data["tool_name"]);
                let key = text_of(&data["task_key"]);
                let runner = match &data["runner_executor_public_id"] {
                    Value::Null => "in nexus".to_owned(),
                    runner => format!("on runner {}", text_of(runner)),
                };
                match data["status"].as_str().unwrap_or_default() {
                    "dispatched" | "running" => {
                        self.end_line();
                        say(&clean(&format!("→ {tool} [{key}] {runner}")));
                    }
                    "needs_approval" | "awaiting_input" | "waiting" => {}
                    status => {
                        self.end_line();
                        let content = data["content"].as_str().map(|c| format!(": {}", preview(c, 200)));
                        say(&clean(&format!("← {tool} [{key}] {status}{}", content.unwrap_or_default())));
                    }
                }
            }
            "task_progress" => {
                let key = text_of(&data["task_key"]);
                let due = self.progress_shown.get(&key).is_none_or(|at| at.elapsed() >= PROGRESS_EVERY);
                if due {
                    self.progress_shown.insert(key.clone(), tokio::time::Instant::now());
                    let frame = &data["frame"];
                    let tail = frame["text_tail"].as_str().and_then(|t| t.lines().next_back()).unwrap_or_default();
                    let bytes = frame["bytes"].as_u64().map(|b| format!(" ({b} bytes of output)")).unwrap_or_default();
                    self.note(&format!(
                        "… {} [{key}] running{bytes} {}",
                        text_of(&data["tool_name"]),
                        preview(tail, 100)
                    ));
                }
            }
            "approval_required" => {
                self.end_line();
                say(&clean(&format!(
                    "? {} [{}] on runner {} waits for approval; input {}",
                    text_of(&data["tool_name"]),
                    text_of(&data["task_key"]),
                    text_of(&data["runner_executor_public_id"]),
                    preview(&data["tool_input"].to_string(), 300)
                )));
            }
            "input_required" => {
                self.end_line();
                say(&clean(&format!("? {}", text_of(&data["prompt"]))));
                for (n, option) in data["options"].as_array().into_iter().flatten().enumerate() {
                    say(&clean(&format!("  {}. {}", n + 1, text_of(option))));
                }
            }
            "attention_required" => {
                self.end_line();
                say(&clean(&format!("! needs attention: {}", text_of(&data["message"]))));
            }
            "model_change" => {
                let (from, to, why) = (text_of(&data["from"]), text_of(&data["to"]), text_of(&data["reason"]));
                self.note(&format!("model {from} → {to} ({why})"));
            }
            "turn_status" => {
                let status = data["status"].as_str().unwrap_or_default();
                let key = data["error_key"].as_str().map(|k| format!(" ({k})")).unwrap_or_default();
                match status {
                    "paused" | "canceling" | "canceled" | "failed" | "needs_attention" => {
                        self.note(&format!("{status}{key}"));
                    }
                    "running" if data["resumed"] == true => self.note("running again"),
                    _ => {}
                }
            }
            "stream_reset" => {
                if let Some((_, said)) = &mut self.spoken {
                    said.clear();
                }
                self.note(&format!(
                    "the model's answer starts again ({}); what it said so far is void",
                    text_of(&data["reason"])
                ));
            }
            _ => {}
        }
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
}
