//! Work: offers, claims, running tools and their results (`docs/protocol.md`, "Offers",
//! "Claim").

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use nexus_proto::InboxKind;
use nexus_proto::runner::v1::runner_frame::Frame as Request;
use nexus_proto::runner::v1::{Claim, ClaimGranted, WorkAvailable, WorkCanceled};
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::claim::ClaimHandle;
use crate::journal::{EntryState, Flushed, JournalEntry, TaskKey};
use crate::tools::{StopReason, ToolContext, ToolOutcome};

use super::*;

impl Agent {
    pub(super) fn on_work_available(&mut self, work: WorkAvailable) {
        let key = TaskKey { run_public_id: work.run_public_id, task_key: work.task_key };
        // Only tool calls are claimable; another kind (a newer nexus's) is not this runner's.
        if work.kind.parse::<InboxKind>() != Ok(InboxKind::ToolCall) {
            debug!(kind = %work.kind, task_key = %key.task_key, "ignoring work that is not a tool call");
            return;
        }
        let held = self.running.contains_key(&key)
            || self.journal.contains(&key)
            || self.claiming.contains_key(&key)
            || self.hinted.contains(&key);
        if self.draining || held {
            debug!(run_public_id = %key.run_public_id, task_key = %key.task_key, "ignoring a hint for a task already held");
            return;
        }
        debug!(run_public_id = %key.run_public_id, task_key = %key.task_key, tool = %work.tool_name, "work available");
        self.hinted.insert(key.clone());
        self.hints.push_back(Hint { key, tool: work.tool_name });
        self.pump_claims();
    }

    pub(super) fn on_work_canceled(&mut self, canceled: WorkCanceled) {
        let key = TaskKey { run_public_id: canceled.run_public_id, task_key: canceled.task_key };
        if self.hinted.remove(&key) {
            self.hints.retain(|hint| hint.key != key);
        }
        self.stop_task(&key, "nexus canceled the task");
    }

    pub(super) fn stop_task(&self, key: &TaskKey, why: &str) {
        if let Some(running) = self.running.get(key) {
            info!(run_public_id = %key.run_public_id, task_key = %key.task_key, why, "stopping a running tool");
            running.stop.send_replace(Some(StopReason::Canceled));
        }
    }

    /// Claims hinted tasks, oldest first, while a slot is free: nothing is claimed that cannot
    /// start at once. A hint whose tool already has its `max_concurrency` claimed or running
    /// stays queued, in its place, and the hints after it are claimed meanwhile
    /// (`docs/runner-tools.md`, "Concurrency per tool").
    pub(super) fn pump_claims(&mut self) {
        let mut at = 0;
        let mut full: HashSet<String> = HashSet::new();
        while self.link.is_some() && !self.draining && self.running.len() + self.claiming.len() < self.config.slots {
            let Some(hint) = self.hints.get(at) else {
                break;
            };
            if full.contains(&hint.tool) || self.at_concurrency_bound(&hint.tool) {
                full.insert(hint.tool.clone());
                at += 1;
                continue;
            }
            let Some(Hint { key, tool }) = self.hints.remove(at) else {
                break;
            };
            self.hinted.remove(&key);
            if self.journal.contains(&key) || self.running.contains_key(&key) {
                continue;
            }
            let frame =
                Request::Claim(Claim { run_public_id: key.run_public_id.clone(), task_key: key.task_key.clone() });
            self.send_request(frame, Pending::Claim(key, tool));
        }
    }

    /// Whether `tool` has as many calls claimed or running as its `max_concurrency` allows.
    fn at_concurrency_bound(&self, tool: &str) -> bool {
        let Some(limit) = self.toolbox.max_concurrency(tool) else {
            return false;
        };
        let claiming = self.claiming.values().filter(|claimed| *claimed == tool).count();
        let running = self.running.values().filter(|running| running.tool == tool).count();
        claiming + running >= limit.get()
    }

    /// Journals the claim `running`, then starts its tool once that is on disk
    /// ([`Agent::on_journal_flushed`]). The task takes its slot at once.
    pub(super) fn on_claim_granted(&mut self, key: TaskKey, grant: ClaimGranted) {
        let task: Value = serde_json::from_str(&grant.task_json).unwrap_or(Value::Null);
        let tool_name = task.get("tool_name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let tool_input = task.get("tool_input").cloned().unwrap_or(Value::Null);
        let task_timeout_ms = task.get("timeout_ms").and_then(Value::as_u64);
        let deadline_at_ms = if grant.deadline_at_ms > 0 {
            grant.deadline_at_ms
        } else {
            warn!(task_key = %key.task_key, "the claim came without a deadline; assuming the task's timeout");
            let budget = task_timeout_ms.unwrap_or(self.config.tool_timeout_ms);
            unix_now_ms().saturating_add(i64::try_from(budget).unwrap_or(i64::MAX))
        };
        info!(run_public_id = %key.run_public_id, task_key = %key.task_key, tool = %tool_name, "claimed");
        let ticket = self.journal.insert(JournalEntry {
            key: key.clone(),
            tool_name: tool_name.clone(),
            claim_token: grant.claim_token.clone(),
            deadline_at_ms,
            state: EntryState::Running,
        });
        if self.draining {
            let content = "the runner was shutting down and did not start the tool".to_owned();
            self.record_result(&key, ToolOutcome::Failed { content });
            return;
        }
        let (stop_tx, stop) = watch::channel(None);
        self.running.insert(key.clone(), RunningTool { stop: stop_tx, tool: tool_name.clone() });
        let start =
            Start { key, tool_name, tool_input, task_timeout_ms, deadline_at_ms, claim_token: grant.claim_token, stop };
        self.after_durable.push_back((ticket, AfterDurable::Start(Box::new(start))));
    }

    /// A flush of the journal ended: what waited for it goes ahead. When the write failed, a
    /// claimed tool is not started (a `failed` outcome is committed instead) and a result is
    /// committed all the same.
    pub(super) fn on_journal_flushed(&mut self, flushed: Flushed) {
        let journaled = match &flushed.result {
            Ok(()) => true,
            Err(err) => {
                error!(error = %err, "could not write the journal");
                false
            }
        };
        while self.after_durable.front().is_some_and(|(ticket, _)| *ticket <= flushed.through) {
            let Some((_, action)) = self.after_durable.pop_front() else { break };
            match action {
                AfterDurable::Start(start) => self.start_tool(*start, journaled),
                AfterDurable::Commit(key) => {
                    if !journaled {
                        warn!(task_key = %key.task_key, "committing a result the journal could not keep");
                    }
                    self.send_commit(&key);
                }
                AfterDurable::Extended { reply, deadline_at_ms } => drop(reply.send(Ok(deadline_at_ms))),
            }
        }
        self.pump_claims();
    }

    /// Starts a claimed tool whose `running` entry is on disk (`journaled`), unless it was
    /// stopped meanwhile.
    fn start_tool(&mut self, start: Start, journaled: bool) {
        let Start { key, tool_name, tool_input, task_timeout_ms, deadline_at_ms, claim_token, stop } = start;
        let stopped = *stop.borrow();
        let not_started = match (journaled, stopped) {
            (false, _) => Some("the runner could not record the claim in its journal, so it did not start the tool"),
            (true, Some(StopReason::Shutdown)) => Some("the runner was shutting down and did not start the tool"),
            (true, Some(StopReason::Canceled)) => Some("the task was canceled before its tool started"),
            (true, None) => None,
        };
        if let Some(content) = not_started {
            self.running.remove(&key);
            self.probing.remove(&key);
            self.record_result(&key, ToolOutcome::Failed { content: content.to_owned() });
            return;
        }
        let until_deadline = Duration::from_millis(u64::try_from(deadline_at_ms - unix_now_ms()).unwrap_or(0));
        let ctx = ToolContext {
            workdir: self.toolbox.workdir().clone(),
            bash_timeout_ms: self.toolbox.bash_timeout_ms(),
            task_timeout_ms,
            clamp_at: Some(Instant::now() + until_deadline.saturating_sub(self.config.commit_margin)),
            stop,
            claim: Some(ClaimHandle::new(key.clone(), claim_token, self.control_tx.clone())),
            owner: self.toolbox.owner().clone(),
        };
        let span = info_span!(
            "task",
            runner_id = %self.config.runner_id,
            run_public_id = %key.run_public_id,
            task_key = %key.task_key,
            tool = %tool_name,
        );
        let toolbox = Arc::clone(&self.toolbox);
        // The tool is the one served now, whatever a reload does before the task first runs.
        let catalog = toolbox.catalog();
        let task_key = key.clone();
        let handle = self.tasks.spawn(
            async move {
                let outcome = AssertUnwindSafe(toolbox.run_in(&catalog, &tool_name, tool_input, ctx))
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|_| ToolOutcome::error("the tool crashed; its effect is unknown"));
                Finished { key, outcome }
            }
            .instrument(span),
        );
        self.task_keys.insert(handle.id(), task_key);
    }

    pub(super) fn on_tool_finished(&mut self, finished: Finished) {
        let Finished { key, outcome } = finished;
        self.running.remove(&key);
        self.probing.remove(&key);
        let is_error = !matches!(outcome, ToolOutcome::Completed { is_error: false, .. });
        info!(run_public_id = %key.run_public_id, task_key = %key.task_key, is_error, "tool finished");
        self.record_result(&key, outcome);
        self.pump_claims();
    }

    /// Journals the result `commit_pending`; it is committed once that is on disk.
    pub(super) fn record_result(&mut self, key: &TaskKey, outcome: ToolOutcome) {
        let body = outcome.into_commit_body();
        let journaled =
            self.journal.update(key, move |entry| entry.state = EntryState::CommitPending { body, fallback: false });
        let Some(ticket) = journaled else {
            warn!(task_key = %key.task_key, "a tool finished for a task the journal does not hold");
            return;
        };
        self.after_durable.push_back((ticket, AfterDurable::Commit(key.clone())));
    }
}

/// A claimed tool waiting for its `running` entry to reach the disk.
pub(super) struct Start {
    key: TaskKey,
    tool_name: String,
    tool_input: Value,
    task_timeout_ms: Option<u64>,
    deadline_at_ms: i64,
    claim_token: String,
    stop: watch::Receiver<Option<StopReason>>,
}
