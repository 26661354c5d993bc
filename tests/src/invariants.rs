//! The invariants every chaos scenario ends with, checked against the durable store and what the
//! fake runners observed.
//!
//! [`collect`] reads a [`History`] through `nexus_actors::store::Store` (`tasks_of`,
//! `events_after`); [`check`] is pure, so a test can hand it a deliberately broken history and
//! see the violation reported. The invariants (issue 4, item 6):
//!
//! - [`Invariant::SettlesOnce`]: every task settles exactly once: its row is in a settled status
//!   with `settled_at`, exactly one settled `task_status` event narrates it (with the row's
//!   status; a later event naming its `failure_resolution` narrates a repair, not a settlement),
//!   and no runner saw two non-idle commit acknowledgements for it.
//! - [`Invariant::ClaimGrantedOnce`]: no `(run, task_key)` was granted to two claim requests; the
//!   token a runner was granted is the one the row holds; a runner task never completes
//!   unclaimed.
//! - [`Invariant::ResultKept`]: every commit a runner saw acknowledged is what the row says:
//!   a non-idle `completed` acknowledgement's body is the stored result, and every answer's
//!   status is the row's status.
//! - [`Invariant::OwnWorkOnly`]: every offer, grant and acknowledgement a runner received is for a
//!   task addressed to that runner, and each run's tasks go to the runner it selected.
//! - [`Invariant::DeadlineKept`]: no runner task stays live past its deadline plus the slack.
//! - [`Invariant::CursorContiguous`]: each run's events are numbered 1, 2, 3, … with no gap
//!   and no number twice, wherever they were written (one node or several), so a follower's
//!   cursor never skips one.
//! - [`Invariant::CensusBaseline`]: actor and stream counts return to their baseline
//!   ([`census_settles`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use uuid::Uuid;

use nexus_actors::actors::root::{Census, RootHandle};
use nexus_actors::auth::digest;
use nexus_actors::store::{EventRow, Store, TaskRow};
use nexus_proto::{ExecutionId, TaskStatus};

/// A `work_available` push a runner received.
#[derive(Clone, Debug, PartialEq)]
pub struct Offer {
    /// The receiving runner.
    pub runner: Uuid,
    /// The run.
    pub run: Uuid,
    /// The task key.
    pub task_key: String,
}

/// A claim granted to a runner.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    /// The receiving runner.
    pub runner: Uuid,
    /// The run.
    pub run: Uuid,
    /// The task key.
    pub task_key: String,
    /// The claim token it received.
    pub token: String,
    /// The row's `addressed_to.executor_public_id`, as granted.
    pub addressed_to: Option<Uuid>,
    /// When the grant arrived, Unix milliseconds.
    pub at_ms: i64,
}

/// A commit acknowledged to a runner (`committed`).
#[derive(Clone, Debug, PartialEq)]
pub struct Ack {
    /// The receiving runner.
    pub runner: Uuid,
    /// The run.
    pub run: Uuid,
    /// The task key.
    pub task_key: String,
    /// The token the commit carried.
    pub token: String,
    /// The body the commit carried.
    pub body: Value,
    /// Whether nexus called it idle (already settled).
    pub idle: bool,
    /// The status nexus answered.
    pub status: String,
    /// When the answer arrived, Unix milliseconds.
    pub at_ms: i64,
}

/// What the fake runners of a scenario observed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observations {
    /// Offers received.
    pub offers: Vec<Offer>,
    /// Claims granted.
    pub grants: Vec<Grant>,
    /// Commits acknowledged.
    pub acks: Vec<Ack>,
    /// Refusal words received, with counts.
    pub refusals: BTreeMap<String, usize>,
}

/// The invariants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Invariant {
    /// Each task settles exactly once.
    SettlesOnce,
    /// A claim is never granted twice.
    ClaimGrantedOnce,
    /// A committed result is never lost.
    ResultKept,
    /// Runner B never receives runner A's work.
    OwnWorkOnly,
    /// No task stays live past its deadline plus the slack.
    DeadlineKept,
    /// Actor and connection counts return to baseline.
    CensusBaseline,
    /// A run's event sequence numbers run 1, 2, 3, … without a gap or a repeat.
    CursorContiguous,
}

/// One broken invariant, with what broke it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which invariant.
    pub invariant: Invariant,
    /// The evidence.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.invariant, self.detail)
    }
}

fn violation(invariant: Invariant, detail: String) -> Violation {
    Violation { invariant, detail }
}

/// Everything the checks read.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// Every task of the checked runs, from the store.
    pub tasks: Vec<TaskRow>,
    /// Every event of the checked runs, from the store, by run.
    pub events: BTreeMap<Uuid, Vec<EventRow>>,
    /// What the fake runners observed (empty when only real runners ran).
    pub observations: Observations,
    /// The runner each run selected (`CreateInput.runner_executor_public_id`), when known.
    pub targets: BTreeMap<ExecutionId, Uuid>,
    /// When the history was read, Unix milliseconds.
    pub checked_at_ms: i64,
    /// How long past its deadline a task may take to settle: the expiry timer's scheduling lag,
    /// plus any time nexus was down.
    pub deadline_slack_ms: i64,
}

/// The default slack on deadlines: expiry is a timer per task, so this covers only the timer
/// and the store write on a loaded 2-core machine in a debug build.
pub const DEFAULT_DEADLINE_SLACK_MS: i64 = 2_000;

/// Reads the tasks and events of `runs` from the store.
///
/// # Panics
/// When the store cannot be read.
pub async fn collect(store: &Store, runs: &[ExecutionId], observations: Observations) -> History {
    let mut history = History { observations, deadline_slack_ms: DEFAULT_DEADLINE_SLACK_MS, ..History::default() };
    for &run in runs {
        let execution = run;
        history.tasks.extend(store.tasks_of(execution).await.expect("read tasks"));
        let mut events = Vec::new();
        let mut after = 0;
        loop {
            let page = store.events_after(execution, after, 1_000).await.expect("read events");
            let Some(last) = page.last() else { break };
            after = last.seq;
            events.extend(page);
        }
        history.events.insert(run.uuid(), events);
    }
    history.checked_at_ms = store.clock().now_ms();
    history
}

type Key = (Uuid, String);

fn key_of(run: Uuid, task_key: &str) -> Key {
    (run, task_key.to_owned())
}

fn name(key: &Key) -> String {
    format!("{}/{}", key.0, key.1)
}

/// Checks every invariant but the census against `history`; empty means all hold.
pub fn check(history: &History) -> Vec<Violation> {
    let rows: HashMap<Key, &TaskRow> =
        history.tasks.iter().map(|t| (key_of(t.run_public_id.uuid(), &t.task_key.to_string()), t)).collect();
    let mut found = Vec::new();
    settles_once(history, &rows, &mut found);
    claims_granted_once(history, &rows, &mut found);
    results_kept(history, &rows, &mut found);
    own_work_only(history, &rows, &mut found);
    deadlines_kept(history, &mut found);
    cursors_contiguous(history, &mut found);
    found
}

fn settles_once(history: &History, rows: &HashMap<Key, &TaskRow>, found: &mut Vec<Violation>) {
    use Invariant::SettlesOnce;
    let mut settled_events: HashMap<Key, Vec<TaskStatus>> = HashMap::new();
    for (run, events) in &history.events {
        // An event with a `failure_resolution` (a retried or abandoned task) narrates the
        // repair of a settled task, not another settlement.
        let narrations = events.iter().filter_map(|e| e.event.as_task_status());
        for narration in narrations.filter(|n| n.failure_resolution.is_none() && n.status.is_settled()) {
            let key = key_of(*run, &narration.task_key.to_string());
            settled_events.entry(key).or_default().push(narration.status);
        }
    }
    for (key, statuses) in &settled_events {
        if !rows.contains_key(key) {
            found.push(violation(SettlesOnce, format!("{} has settled events {statuses:?} but no row", name(key))));
        }
    }
    for (key, task) in rows {
        let statuses = settled_events.get(key).map(Vec::as_slice).unwrap_or_default();
        if !task.is_settled() {
            found.push(violation(SettlesOnce, format!("{} never settled: it is still {}", name(key), task.status)));
            if !statuses.is_empty() {
                found.push(violation(
                    SettlesOnce,
                    format!("{} is {} but events say it settled {statuses:?}", name(key), task.status),
                ));
            }
            continue;
        }
        if task.settled_at.is_none() {
            found.push(violation(SettlesOnce, format!("{} is {} without settled_at", name(key), task.status)));
        }
        match statuses {
            [one] if *one == task.status => {}
            [one] => found.push(violation(
                SettlesOnce,
                format!("{} settled {} but its event says {one}", name(key), task.status),
            )),
            _ => found.push(violation(
                SettlesOnce,
                format!("{} settled {} with {} settled events {statuses:?}", name(key), task.status, statuses.len()),
            )),
        }
    }
    let mut fresh: HashMap<Key, usize> = HashMap::new();
    for ack in history.observations.acks.iter().filter(|a| !a.idle) {
        *fresh.entry(key_of(ack.run, &ack.task_key)).or_default() += 1;
    }
    for (key, count) in fresh.into_iter().filter(|(_, n)| *n > 1) {
        found.push(violation(SettlesOnce, format!("{} was committed non-idle {count} times", name(&key))));
    }
}

fn claims_granted_once(history: &History, rows: &HashMap<Key, &TaskRow>, found: &mut Vec<Violation>) {
    use Invariant::ClaimGrantedOnce;
    let mut grants: HashMap<Key, Vec<Uuid>> = HashMap::new();
    for grant in &history.observations.grants {
        let key = key_of(grant.run, &grant.task_key);
        grants.entry(key.clone()).or_default().push(grant.runner);
        let Some(task) = rows.get(&key) else {
            found.push(violation(ClaimGrantedOnce, format!("{} was granted but has no row", name(&key))));
            continue;
        };
        if !task.claimed || task.claim_token_digest.as_deref() != Some(digest(&grant.token).as_str()) {
            found.push(violation(
                ClaimGrantedOnce,
                format!(
                    "{} was granted to {} but the row holds another claim (claimed: {})",
                    name(&key),
                    grant.runner,
                    task.claimed
                ),
            ));
        }
    }
    for (key, runners) in grants.into_iter().filter(|(_, r)| r.len() > 1) {
        found.push(violation(
            ClaimGrantedOnce,
            format!("{} was granted {} times, to {runners:?}", name(&key), runners.len()),
        ));
    }
    for (key, task) in rows {
        if !task.claimed && task.claim_token_digest.is_some() {
            found.push(violation(ClaimGrantedOnce, format!("{} holds a token but was never claimed", name(key))));
        }
        if task.target_executor_public_id.is_some() && task.status == TaskStatus::Completed && !task.claimed {
            found.push(violation(ClaimGrantedOnce, format!("{} completed on a runner without a claim", name(key))));
        }
    }
}

fn results_kept(history: &History, rows: &HashMap<Key, &TaskRow>, found: &mut Vec<Violation>) {
    use Invariant::ResultKept;
    for ack in &history.observations.acks {
        let key = key_of(ack.run, &ack.task_key);
        let Some(task) = rows.get(&key) else {
            found.push(violation(ResultKept, format!("{} was acknowledged but has no row", name(&key))));
            continue;
        };
        if task.claim_token_digest.as_deref() != Some(digest(&ack.token).as_str()) {
            found.push(violation(
                ResultKept,
                format!("{} acknowledged a commit whose token does not hold the claim", name(&key)),
            ));
        }
        let acknowledged = ack.status.parse::<TaskStatus>().ok();
        if acknowledged != Some(task.status) {
            found.push(violation(
                ResultKept,
                format!(
                    "{} was acknowledged {} (idle: {}) but the row is {}",
                    name(&key),
                    ack.status,
                    ack.idle,
                    task.status
                ),
            ));
            continue;
        }
        if ack.idle || acknowledged != Some(TaskStatus::Completed) {
            continue;
        }
        let stored = task.result.as_ref().unwrap_or(&Value::Null);
        let sent = ack.body.as_object().into_iter().flatten();
        let differs: Vec<&String> =
            sent.filter(|(field, value)| stored.get(field.as_str()) != Some(*value)).map(|(f, _)| f).collect();
        if !differs.is_empty() {
            found.push(violation(
                ResultKept,
                format!("{} acknowledged {} but stored {stored} (fields {differs:?} differ)", name(&key), ack.body),
            ));
        }
    }
}

fn own_work_only(history: &History, rows: &HashMap<Key, &TaskRow>, found: &mut Vec<Violation>) {
    use Invariant::OwnWorkOnly;
    let target = |run: Uuid, task_key: &str| {
        rows.get(&key_of(run, task_key)).and_then(|t| t.target_executor_public_id).map(nexus_proto::RunnerId::uuid)
    };
    for offer in &history.observations.offers {
        if target(offer.run, &offer.task_key) != Some(offer.runner) {
            found.push(violation(
                OwnWorkOnly,
                format!(
                    "{}/{} was offered to {} but is addressed to {:?}",
                    offer.run,
                    offer.task_key,
                    offer.runner,
                    target(offer.run, &offer.task_key)
                ),
            ));
        }
    }
    for grant in &history.observations.grants {
        let addressed = target(grant.run, &grant.task_key);
        if addressed != Some(grant.runner) || grant.addressed_to != Some(grant.runner) {
            found.push(violation(
                OwnWorkOnly,
                format!(
                    "{}/{} was granted to {} but is addressed to {addressed:?} (row sent: {:?})",
                    grant.run, grant.task_key, grant.runner, grant.addressed_to
                ),
            ));
        }
    }
    for ack in &history.observations.acks {
        if target(ack.run, &ack.task_key) != Some(ack.runner) {
            found.push(violation(
                OwnWorkOnly,
                format!(
                    "{}/{} took a commit from {} but is addressed to {:?}",
                    ack.run,
                    ack.task_key,
                    ack.runner,
                    target(ack.run, &ack.task_key)
                ),
            ));
        }
    }
    for task in &history.tasks {
        let (Some(expected), Some(actual)) = (history.targets.get(&task.run_public_id), task.target_executor_public_id)
        else {
            continue;
        };
        if *expected != actual.uuid() {
            found.push(violation(
                OwnWorkOnly,
                format!("{}/{} went to {actual} but its run selected {expected}", task.run_public_id, task.task_key),
            ));
        }
    }
}

fn deadlines_kept(history: &History, found: &mut Vec<Violation>) {
    for task in history.tasks.iter().filter(|t| t.target_executor_public_id.is_some()) {
        let limit = task.deadline_at + history.deadline_slack_ms;
        let live_until = match task.settled_at {
            Some(at) if task.is_settled() => at,
            _ => history.checked_at_ms,
        };
        if live_until > limit {
            found.push(violation(
                Invariant::DeadlineKept,
                format!(
                    "{}/{} was live {} ms past its deadline (slack {} ms; status {})",
                    task.run_public_id,
                    task.task_key,
                    live_until - task.deadline_at,
                    history.deadline_slack_ms,
                    task.status
                ),
            ));
        }
    }
}

fn cursors_contiguous(history: &History, found: &mut Vec<Violation>) {
    for (run, events) in &history.events {
        let broken = events.iter().zip(1_i64..).find(|(event, expected)| event.seq != *expected);
        if let Some((event, expected)) = broken {
            found.push(violation(
                Invariant::CursorContiguous,
                format!("{run}: event {} of {} has seq {} where {expected} was due", expected, events.len(), event.seq),
            ));
        }
    }
}

/// Panics with every violation and the scenario's tag (name and seed) when any invariant broke.
///
/// # Panics
/// When `violations` is not empty.
pub fn assert_holds(tag: &str, violations: &[Violation]) {
    if violations.is_empty() {
        return;
    }
    let shown: Vec<String> = violations.iter().take(40).map(|v| format!("  - {v}")).collect();
    panic!(
        "{tag} {} invariant violation(s){}:\n{}",
        violations.len(),
        if violations.len() > shown.len() { format!(" (first {})", shown.len()) } else { String::new() },
        shown.join("\n")
    );
}

/// What the census must return to: the stream and execution counts exactly, and at most this
/// many executor and profile actors (those are durable identities that stay loaded once used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CensusBound {
    /// Live runner streams.
    pub connections: usize,
    /// Live execution actors.
    pub executions: usize,
    /// At most this many executor actors.
    pub executors_max: usize,
    /// At most this many profile actors.
    pub profiles_max: usize,
}

impl CensusBound {
    /// The baseline `census` plus `runners` executors and `agents` profiles that the scenario
    /// may leave loaded.
    pub fn after(census: Census, runners: usize, agents: usize) -> CensusBound {
        CensusBound {
            connections: census.connections,
            executions: census.executions,
            executors_max: census.executors + runners,
            profiles_max: census.profiles + agents,
        }
    }
}

/// Whether `census` is within `bound`.
pub fn census_within(census: Census, bound: CensusBound) -> Option<Violation> {
    let ok = census.connections == bound.connections
        && census.executions == bound.executions
        && census.executors <= bound.executors_max
        && census.profiles <= bound.profiles_max;
    (!ok).then(|| violation(Invariant::CensusBaseline, format!("census {census:?} is not back to {bound:?}")))
}

/// Waits up to `limit` for the census to return within `bound`.
///
/// # Errors
/// The last census's violation when it did not.
pub async fn census_settles(root: &RootHandle, bound: CensusBound, limit: Duration) -> Result<Census, Violation> {
    let deadline = Instant::now() + limit;
    loop {
        let census =
            root.census().await.map_err(|e| violation(Invariant::CensusBaseline, format!("no census: {e}")))?;
        match census_within(census, bound) {
            None => return Ok(census),
            Some(v) if Instant::now() >= deadline => {
                return Err(violation(v.invariant, format!("{} after {limit:?}", v.detail)));
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Counts the runs' tasks by status, for the scenario's report.
pub fn status_counts(history: &History) -> BTreeMap<TaskStatus, usize> {
    let mut counts = BTreeMap::new();
    for task in &history.tasks {
        *counts.entry(task.status).or_default() += 1;
    }
    counts
}
