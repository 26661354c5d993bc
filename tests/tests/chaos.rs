//! The chaos suite (issue 4, item 6): faults from the in-process proxy, frame-level fake runners
//! and process kills, each scenario ending in the invariant checks of `nexus_tests::invariants`.
//!
//! | scenario | faults |
//! |---|---|
//! | `the_checker_reports_every_broken_invariant` | none: broken histories fed to the checker |
//! | `proxy_faults_at_every_protocol_step` | cut, black hole, delay: before the claim answer (claim lost, answer lost), after the claim, during the commit, after the commit before its acknowledgement; black-hole detection bound |
//! | `runner_agent_through_proxy_faults` | the same steps against a real runner-agent (in-process, short liveness), detection bounds on both ends |
//! | `runner_agent_sigkill_mid_task_and_restart` | SIGKILL of runner-agent processes mid-task, restart on the same state dir |
//! | `nexus_sigkill_and_restart_on_the_same_data_dir` | SIGKILL of the `nexus` binary mid-execution, restart on the same data dir and port |
//! | `nexus_sigkill_with_a_turn_queued_and_between_turns` | SIGKILL of `nexus` while turn 1 runs with turn 2 queued, and again between the two turns (or during turn 2) |
//! | `nexus_sigkill_in_the_middle_of_each_join` | SIGKILL of `nexus` while a join waits under each policy (children parked on `ask`, some ended with their results unconsumed) and before a join exists; then again mid-join |
//! | `duplicated_reordered_and_stale_frames_change_nothing` | duplicated claims and commits, reordered frames, stale, forged and foreign tokens |
//! | `soak_20_runners_2000_tasks_under_random_faults` | 20 fast runners, 2,000 tasks, random cuts, drops, duplicate and stale commits |
//! | `cluster::cluster_*` (PostgreSQL only) | three nodes on one database: SIGKILL of the serving node mid-round, SIGSTOP past its lease then SIGCONT, its database connection black-holed, a rolling SIGTERM restart |
//!
//! Scenarios run one at a time (a suite-wide lock) and print their seed at the start and the end;
//! every assertion message carries it. Replay one with
//! `NEXUS_CHAOS_SEED=<seed> cargo test -p nexus-tests --test chaos <scenario>` (after
//! `cargo build --bins`, for the scenarios that start the binaries). The seed fixes the fault plan;
//! thread and socket timing still vary, which is why the checks are invariants. On PostgreSQL:
//! `NEXUS_TEST_STORE=postgres`, as for the other suites.

use nexus_proto::{ExecutionId, RunStatus, TaskStatus};
use nexus_tests::key;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::Child;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use uuid::Uuid;

use nexus_actors::actors::root::Census;
use nexus_actors::auth::digest;
use nexus_actors::config::StoreConfig;
use nexus_actors::doors::api::{Caller, CreateInput};
use nexus_actors::store::event::TaskNarration;
use nexus_actors::store::{Event, EventRow, ExecutionRow, Store, StoreBackend, TaskRow};
use nexus_proto::agent::v1::agent_service_client::AgentServiceClient;
use nexus_proto::agent::v1::{CreateInputRequest, DeclareProfileRequest};
use nexus_proto::runner::v1::{WorkAvailable, nexus_frame};
use nexus_proto::{RunnerId, TaskKey, TaskKind};
use nexus_runner_agent::journal::{EntryState, Journal};
use nexus_tests::chaos::{ChaosRng, Ledger, ObservedRunner, Push, Scenario};
use nexus_tests::invariants::{
    self, Ack, CensusBound, DEFAULT_DEADLINE_SLACK_MS, Grant, History, Invariant, Observations, Offer, assert_holds,
    census_settles, census_within, check, status_counts,
};
use nexus_tests::processes::{
    NexusProcess, RunnerAgentProcess, StoreLocation, admin_agent, admin_runner, free_loopback_addr, sigkill,
};
use nexus_tests::{Direction, Minted, Reply, TcpProxy, TestDatabase, TestServer, test_store_backend, wait_until};

#[path = "chaos/cluster.rs"]
mod cluster;

/// The bound on any one wait for the system to reach a state.
const WAIT: Duration = Duration::from_secs(30);
/// Slack on detection bounds for a loaded 2-core machine running a debug build.
const DETECTION_SLACK: Duration = Duration::from_millis(1_500);

// ---- shared helpers ------------------------------------------------------------------------

fn effect(kind: &str, idempotency: &str) -> Value {
    json!({
        "kind": kind, "destructive": kind == "write", "effect_scope": "closed",
        "idempotency": idempotency, "reconciliation": "none",
    })
}

/// `probe`: read-only and replayable (expiry after a claim is `timed_out`).
fn probe(timeout_ms: u64) -> Value {
    json!({"name": "probe", "description": "Read the machine.", "input_schema": {"type": "object"},
           "effect_profile": effect("read_only", "intrinsic"), "timeout_ms": timeout_ms})
}

/// `poke`: a write that is not replayable (expiry after a claim is `uncertain`).
fn poke(timeout_ms: u64) -> Value {
    json!({"name": "poke", "description": "Change the machine.", "input_schema": {"type": "object"},
           "effect_profile": effect("write", "none"), "timeout_ms": timeout_ms})
}

/// A script whose rounds call bash; each call appends its id to `side.log` when it starts, so
/// the workdir records every run of every tool.
fn bash_script(rounds: usize, calls: usize, sleep: &str) -> Value {
    let mut script: Vec<Value> = (1..=rounds)
        .map(|round| {
            let calls: Vec<Value> = (0..calls)
                .map(|i| {
                    let id = format!("r{round}c{i}");
                    let command = format!("echo {id} >> side.log; sleep {sleep}; echo {id}");
                    json!({"id": id, "name": "bash", "arguments": {"command": command}})
                })
                .collect();
            json!({"tool_calls": calls})
        })
        .collect();
    script.push(json!({"final": "all rounds done"}));
    json!({"rounds": script})
}

async fn declare(server: &TestServer, agent: &Minted, runners: &[Uuid], model: &str) {
    let caller = server.caller(agent).await;
    let body = json!({"configuration": {
        "runner_executor_public_ids": runners, "approval_mode": "bypass", "default_model": model,
    }});
    server.server.api.declare(&caller, body).await.expect("declared");
}

async fn admit(server: &TestServer, caller: &Caller, text: &str, runner: Option<RunnerId>) -> ExecutionId {
    let input = CreateInput { text: text.to_owned(), runner_executor_public_id: runner, ..CreateInput::default() };
    server.server.api.create_input(caller, input).await.expect("admitted").execution_public_id
}

async fn task(store: &Store, run: ExecutionId, task_key: &str) -> TaskRow {
    store.task(run, key(task_key)).await.expect("store").unwrap_or_else(|| panic!("no task {run}/{task_key}"))
}

/// Waits until the task satisfies `ready`.
async fn wait_task(
    tag: &str,
    store: &Store,
    run: ExecutionId,
    key: &str,
    what: &str,
    ready: impl Fn(&TaskRow) -> bool,
) -> TaskRow {
    wait_until(&format!("{tag} {key} {what}"), WAIT, || async {
        store.task(run, nexus_tests::key(key)).await.ok().flatten().filter(|t| ready(t))
    })
    .await
}

/// Waits until every run is quiescent (completed, canceled or needs attention) and returns the
/// rows. Polls gently: these stores are busy.
async fn wait_runs_quiet(tag: &str, store: &Store, runs: &[ExecutionId], limit: Duration) -> Vec<ExecutionRow> {
    let deadline = Instant::now() + limit;
    loop {
        let mut rows = Vec::new();
        for run in runs {
            rows.push(store.execution(*run).await.expect("store").expect("execution row"));
        }
        if rows.iter().all(|r| r.status.is_quiescent()) {
            return rows;
        }
        if Instant::now() >= deadline {
            let open: Vec<(ExecutionId, RunStatus)> =
                rows.iter().filter(|r| !r.status.is_quiescent()).map(|r| (r.public_id, r.status)).collect();
            panic!("{tag} {} run(s) still live after {limit:?}: {open:?}", open.len());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn census(server: &TestServer) -> Census {
    server.server.api.root.census().await.expect("census")
}

/// The scenario's closing checks: the census returns to its bound, then every invariant holds.
async fn closing_checks(
    sc: &Scenario,
    server: &TestServer,
    bound: CensusBound,
    runs: &[ExecutionId],
    observations: Observations,
    targets: BTreeMap<ExecutionId, Uuid>,
) -> History {
    let tag = sc.tag();
    if let Err(violation) = census_settles(&server.server.api.root, bound, WAIT).await {
        assert_holds(&tag, &[violation]);
    }
    let mut history = invariants::collect(server.store(), runs, observations).await;
    history.targets = targets;
    assert_holds(&tag, &check(&history));
    history
}

/// Reads a workdir's `side.log`: how many times each call id's tool started.
fn side_effects(workdir: &Path) -> HashMap<String, usize> {
    let text = std::fs::read_to_string(workdir.join("side.log")).unwrap_or_default();
    let mut runs = HashMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        *runs.entry(line.to_owned()).or_default() += 1;
    }
    runs
}

/// No tool ran twice, and every completed task's tool ran (exactly once).
fn assert_side_effects(tag: &str, tasks: &[TaskRow], workdir: &Path) {
    let runs = side_effects(workdir);
    for (id, count) in &runs {
        assert_eq!(*count, 1, "{tag} the tool of call {id} ran {count} times");
    }
    for t in tasks.iter().filter(|t| t.status == TaskStatus::Completed) {
        assert_eq!(runs.get(&t.tool_call_id), Some(&1), "{tag} {} completed but its tool never ran", t.task_key);
        let content = t.result.as_ref().and_then(|r| r["content"].as_str()).unwrap_or_default();
        assert!(content.contains(&t.tool_call_id), "{tag} {} stored another call's output: {content}", t.task_key);
    }
}

/// Results the runner journaled and nexus never acknowledged.
fn unacknowledged(state_dir: &Path, runner: Uuid) -> usize {
    let journal = Journal::open(state_dir, runner).expect("journal");
    journal.entries().filter(|e| matches!(e.state, EntryState::CommitPending { .. })).count()
}

/// The next offer of `run`/`key`, skipping others.
async fn await_offer(tag: &str, runner: &mut ObservedRunner, run: ExecutionId, key: &str) -> WorkAvailable {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let work = runner.next_work(left).await.unwrap_or_else(|| panic!("{tag} {run}/{key} was not offered"));
        if work.task_key == key && work.run_public_id == run.to_string() {
            return work;
        }
    }
}

fn body(text: &str) -> Value {
    json!({"content": text, "is_error": false})
}

// ---- the checker itself ------------------------------------------------------------------

const RUN: ExecutionId = ExecutionId::from_uuid(Uuid::from_u128(0x5eed));
const RUNNER_A: Uuid = Uuid::from_u128(0xa);
const RUNNER_B: Uuid = Uuid::from_u128(0xb);

fn row(key: &str, status: &str, claimed: Option<&str>, settled_at: i64) -> TaskRow {
    TaskRow {
        run_public_id: RUN,
        task_key: nexus_tests::key(key),
        kind: TaskKind::ToolTask,
        round: 1,
        callable_name: "probe".into(),
        tool_name: "probe".into(),
        tool_input: json!({}),
        tool_call_id: key.to_owned(),
        target_executor_public_id: Some(RunnerId::from_uuid(RUNNER_A)),
        effect_profile: Some(effect("write", "none")),
        timeout_ms: 5_000,
        status: status.parse().expect("a task status"),
        claimed: claimed.is_some(),
        claim_token_digest: claimed.map(digest),
        started_at: 5_000,
        deadline_at: 10_000,
        result: None,
        error_key: None,
        settled_at: Some(settled_at),
        approval: None,
    }
}

fn status_event(seq: i64, task_key: TaskKey, status: TaskStatus) -> EventRow {
    let narration = TaskNarration {
        task_key,
        kind: TaskKind::ToolTask,
        status,
        tool_name: "probe".into(),
        served_name: "probe".into(),
        tool_call_id: task_key.to_string(),
        runner_executor_public_id: Some(RunnerId::from_uuid(RUNNER_A)),
        error_key: None,
        approval: None,
        hook: None,
        content: None,
        is_error: None,
        compaction: None,
        decision: None,
        failure_resolution: None,
        retried_as: None,
    };
    EventRow { seq, event: Event::TaskStatus(Box::new(narration)), at: 0 }
}

/// The narration of the `index`th event of the history's run, to break.
fn narration(h: &mut History, index: usize) -> &mut TaskNarration {
    match &mut h.events.get_mut(&RUN.uuid()).expect("events")[index].event {
        Event::TaskStatus(narration) => narration,
        other => panic!("not a task_status: {other:?}"),
    }
}

/// Whether `event` narrates `task_key`.
fn narrates(event: &EventRow, task_key: &str) -> bool {
    event.event.as_task_status().is_some_and(|n| n.task_key == nexus_tests::key(task_key))
}

/// A consistent history: a completed task acknowledged twice (once idle), a claimed task that
/// expired `uncertain`, an unclaimed one that expired `timed_out`, and a kernel task.
fn clean_history() -> History {
    let mut completed = row("r1t0", "completed", Some("T0"), 6_000);
    completed.result = Some(json!({"content": "zero", "is_error": false, "outcome": "completed"}));
    let uncertain = row("r1t1", "uncertain", Some("T1"), 10_050);
    let timed_out = row("r1t2", "timed_out", None, 10_010);
    let mut kernel = row("r1t3", "completed", None, 5_000);
    kernel.target_executor_public_id = None;
    let mut events = Vec::new();
    for (i, t) in [&completed, &uncertain, &timed_out, &kernel].into_iter().enumerate() {
        let seq = i64::try_from(i).expect("small") * 2;
        events.push(status_event(seq + 1, t.task_key, TaskStatus::Dispatched));
        events.push(status_event(seq + 2, t.task_key, t.status));
    }
    let offer = |key: &str| Offer { runner: RUNNER_A, run: RUN.uuid(), task_key: key.into() };
    let grant = |key: &str, token: &str| Grant {
        runner: RUNNER_A,
        run: RUN.uuid(),
        task_key: key.into(),
        token: token.into(),
        addressed_to: Some(RUNNER_A),
        at_ms: 5_500,
    };
    let ack = |text: &str, idle: bool| Ack {
        runner: RUNNER_A,
        run: RUN.uuid(),
        task_key: "r1t0".into(),
        token: "T0".into(),
        body: body(text),
        idle,
        status: "completed".into(),
        at_ms: 6_000,
    };
    History {
        tasks: vec![completed, uncertain, timed_out, kernel],
        events: BTreeMap::from([(RUN.uuid(), events)]),
        observations: Observations {
            offers: vec![offer("r1t0"), offer("r1t1"), offer("r1t2")],
            grants: vec![grant("r1t0", "T0"), grant("r1t1", "T1")],
            acks: vec![ack("zero", false), ack("again", true)],
            refusals: BTreeMap::new(),
        },
        targets: BTreeMap::from([(RUN, RUNNER_A)]),
        checked_at_ms: 20_000,
        deadline_slack_ms: DEFAULT_DEADLINE_SLACK_MS,
    }
}

type Breakage = fn(&mut History);

#[test]
fn the_checker_reports_every_broken_invariant() {
    let clean = clean_history();
    assert_eq!(check(&clean), vec![], "a consistent history passes");
    let cases: Vec<(&str, Breakage, Invariant)> = vec![
        (
            "a claim granted twice",
            |h| {
                let mut again = h.observations.grants[0].clone();
                again.token = "T0-again".into();
                h.observations.grants.push(again);
            },
            Invariant::ClaimGrantedOnce,
        ),
        (
            "a runner task completed without a claim",
            |h| {
                h.observations.grants.remove(0);
                h.observations.acks.clear();
                h.tasks[0].claimed = false;
                h.tasks[0].claim_token_digest = None;
            },
            Invariant::ClaimGrantedOnce,
        ),
        (
            "an acknowledged result lost",
            |h| h.tasks[0].result = Some(json!({"content": "something else", "is_error": false})),
            Invariant::ResultKept,
        ),
        (
            "an acknowledged completion settled otherwise",
            |h| {
                h.tasks[0].status = TaskStatus::TimedOut;
                narration(h, 1).status = TaskStatus::TimedOut;
            },
            Invariant::ResultKept,
        ),
        (
            "a task settled twice",
            |h| {
                let events = h.events.get_mut(&RUN.uuid()).expect("events");
                events.push(status_event(99, nexus_tests::key("r1t1"), TaskStatus::Uncertain));
            },
            Invariant::SettlesOnce,
        ),
        (
            "a task never settled",
            |h| {
                h.tasks[2].status = TaskStatus::Dispatched;
                h.tasks[2].settled_at = None;
                h.events.get_mut(&RUN.uuid()).expect("events").retain(|e| !(narrates(e, "r1t2") && e.seq > 5));
            },
            Invariant::SettlesOnce,
        ),
        (
            "a write-once commit taken twice",
            |h| {
                let mut twice = h.observations.acks[0].clone();
                twice.body = body("overwritten");
                h.observations.acks.push(twice);
            },
            Invariant::SettlesOnce,
        ),
        (
            "runner B offered runner A's work",
            |h| h.observations.offers.push(Offer { runner: RUNNER_B, run: RUN.uuid(), task_key: "r1t2".into() }),
            Invariant::OwnWorkOnly,
        ),
        (
            "runner B granted runner A's work",
            |h| {
                h.observations.grants[1].runner = RUNNER_B;
                h.observations.grants[1].addressed_to = Some(RUNNER_B);
            },
            Invariant::OwnWorkOnly,
        ),
        (
            "a run's tasks sent to a runner it did not select",
            |h| {
                h.targets.insert(RUN, RUNNER_B);
            },
            Invariant::OwnWorkOnly,
        ),
        (
            "a task live past its deadline",
            |h| h.tasks[1].settled_at = Some(10_000 + DEFAULT_DEADLINE_SLACK_MS + 1),
            Invariant::DeadlineKept,
        ),
        (
            "an open task past its deadline",
            |h| {
                h.tasks[1].status = TaskStatus::Dispatched;
                h.tasks[1].settled_at = None;
                h.events.get_mut(&RUN.uuid()).expect("events").retain(|e| !(narrates(e, "r1t1") && e.seq > 3));
            },
            Invariant::DeadlineKept,
        ),
        (
            "a gap in a run's event cursor",
            |h| {
                h.events.get_mut(&RUN.uuid()).expect("events").remove(4);
            },
            Invariant::CursorContiguous,
        ),
        (
            "an event number written twice",
            |h| {
                let events = h.events.get_mut(&RUN.uuid()).expect("events");
                events[5].seq = events[4].seq;
            },
            Invariant::CursorContiguous,
        ),
    ];
    for (case, breaks, invariant) in cases {
        let mut history = clean.clone();
        breaks(&mut history);
        let found = check(&history);
        assert!(found.iter().any(|v| v.invariant == invariant), "{case}: expected {invariant:?}, found {found:?}");
    }

    // The census must come back to its baseline.
    let baseline = Census { executors: 0, executions: 0, profiles: 0, connections: 0 };
    let bound = CensusBound::after(baseline, 2, 1);
    assert_eq!(census_within(Census { executors: 2, profiles: 1, ..baseline }, bound), None);
    for leaked in [
        Census { connections: 1, ..baseline },
        Census { executions: 1, ..baseline },
        Census { executors: 3, ..baseline },
    ] {
        let found = census_within(leaked, bound).map(|v| v.invariant);
        assert_eq!(found, Some(Invariant::CensusBaseline), "{leaked:?}");
    }

    // And a broken history fails the scenario, naming the invariant and the seed.
    let mut broken = clean.clone();
    broken.observations.grants.push(Grant { token: "T0-again".into(), ..broken.observations.grants[0].clone() });
    let failed = std::panic::catch_unwind(|| assert_holds("[chaos self-test seed=7]", &check(&broken)))
        .expect_err("a claim granted twice fails the check");
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("ClaimGrantedOnce") && message.contains("seed=7"), "{message}");
}

// ---- proxy faults at each protocol step, with a frame-level runner ---------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The claim is lost on its way to nexus.
    ClaimLostUpstream,
    /// nexus grants the claim, and the answer is lost on its way back.
    ClaimAnswerLost,
    /// The stream is cut after the runner received the claim.
    AfterClaim,
    /// The stream is cut at a random point while the commit and its answer are in flight.
    DuringCommit,
    /// nexus stores the commit, and the acknowledgement is lost.
    AfterCommitBeforeAck,
    /// The stream is black-holed: nexus must notice within its liveness bound.
    BlackHole,
    /// Every byte is delayed both ways; the protocol still completes.
    Delay,
}

struct StepRig {
    tag: String,
    server: TestServer,
    proxy: TcpProxy,
    runner: Minted,
    ledger: Ledger,
    raw: ObservedRunner,
    run: ExecutionId,
}

impl StepRig {
    async fn reconnect(&mut self) {
        self.proxy.heal();
        self.raw = ObservedRunner::connect_welcomed(&self.proxy.url(), &self.runner, &self.ledger, WAIT).await;
    }

    fn store(&self) -> &Store {
        self.server.store()
    }

    async fn claim(&self, key: &str) -> String {
        let reply = self.raw.claim(&self.run.to_string(), key).await;
        reply.granted().unwrap_or_else(|| panic!("{} claim of {key}: {reply:?}", self.tag)).0
    }
}

const STEP_PING_MS: u64 = 200;
const STEP_LIVENESS_MS: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_faults_at_every_protocol_step() {
    let mut sc = Scenario::begin("proxy_faults_at_every_protocol_step").await;
    let tag = sc.tag();
    let calls: Vec<Value> =
        (0..5).map(|i| json!({"id": format!("p{i}"), "name": "probe", "arguments": {"i": i}})).collect();
    let script = json!({"rounds": [{"tool_calls": calls}, {"final": "steps done"}]});
    // The lost-answer step gets its own execution, dispatched when the step starts: an unclaimed
    // task's park runs from dispatch.
    let lost =
        json!({"rounds": [{"tool_calls": [{"id": "w", "name": "poke", "arguments": {}}]}, {"final": "lost done"}]});
    let server = TestServer::start_with(&[("steps", script), ("lost", lost)], |c| {
        c.runner.ping_interval_ms = STEP_PING_MS;
        c.runner.liveness_timeout_ms = STEP_LIVENESS_MS;
    })
    .await;
    let baseline = census(&server).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("runner-a").await;
    let proxy = TcpProxy::start(server.server.addr).await;
    let ledger = Ledger::new();
    let raw = ObservedRunner::connect_welcomed(&proxy.url(), &runner, &ledger, WAIT).await;
    let announced = raw.announce(&json!({"tools": [probe(30_000), poke(1_500)]})).await;
    assert!(announced.code().is_none(), "{tag} {announced:?}");
    declare(&server, &agent, &[runner.id], "scripted/steps").await;
    // Minted before any execution writes: see the report on read-then-write store transactions.
    let lost_agent = server.agent("lost-agent").await;
    declare(&server, &lost_agent, &[runner.id], "scripted/lost").await;
    let lost_caller = server.caller(&lost_agent).await;
    let caller = server.caller(&agent).await;
    let run = admit(&server, &caller, "step through the faults", None).await;
    let mut rig = StepRig { tag: tag.clone(), server, proxy, runner, ledger, raw, run };
    for i in 0..5 {
        await_offer(&tag, &mut rig.raw, run, &format!("r1t{i}")).await;
    }

    let mut steps = vec![
        Step::ClaimLostUpstream,
        Step::ClaimAnswerLost,
        Step::AfterClaim,
        Step::DuringCommit,
        Step::AfterCommitBeforeAck,
        Step::BlackHole,
        Step::Delay,
    ];
    sc.rng.shuffle(&mut steps);
    let mut probes = (0..5).map(|i| format!("r1t{i}"));
    let mut expected: Vec<(ExecutionId, String, TaskStatus)> = Vec::new();
    let mut lost_run = None;
    for step in steps {
        eprintln!("{tag} step {step:?}");
        match step {
            Step::BlackHole => {
                step_fault(&mut rig, &mut sc.rng, step, "").await;
            }
            Step::ClaimAnswerLost => {
                let steps_run = rig.run;
                rig.run = admit(&rig.server, &lost_caller, "lose the grant", None).await;
                await_offer(&tag, &mut rig.raw, rig.run, "r1t0").await;
                let outcome = step_fault(&mut rig, &mut sc.rng, step, "r1t0").await.expect("a task step");
                expected.push((rig.run, "r1t0".into(), outcome));
                lost_run = Some(rig.run);
                rig.run = steps_run;
            }
            _ => {
                let key = probes.next().expect("a probe task per step");
                let outcome = step_fault(&mut rig, &mut sc.rng, step, &key).await.expect("a task step");
                expected.push((run, key, outcome));
            }
        }
    }

    let runs = [run, lost_run.expect("the lost-answer run")];
    let rows = wait_runs_quiet(&tag, rig.store(), &runs, WAIT).await;
    let finals: Vec<(RunStatus, Option<&str>)> = rows.iter().map(|r| (r.status, r.final_text.as_deref())).collect();
    let done = RunStatus::Completed;
    assert_eq!(finals, [(done, Some("steps done")), (done, Some("lost done"))], "{tag}");
    for (run, key, status) in &expected {
        assert_eq!(task(rig.store(), *run, key).await.status, *status, "{tag} {key}");
    }
    let StepRig { server, proxy, runner, ledger, raw, .. } = rig;
    drop(raw);
    drop(proxy);
    let bound = CensusBound::after(baseline, 1, 2);
    let targets = runs.iter().map(|r| (*r, runner.id)).collect();
    closing_checks(&sc, &server, bound, &runs, ledger.snapshot(), targets).await;
}

/// Runs one step on `key` and returns the status the task must end in (`None` for a step that
/// runs no task).
async fn step_fault(rig: &mut StepRig, rng: &mut ChaosRng, step: Step, key: &str) -> Option<TaskStatus> {
    let tag = rig.tag.clone();
    let run = rig.run;
    let run_id = run.to_string();
    match step {
        Step::ClaimLostUpstream => {
            rig.proxy.black_hole(Direction::Upstream);
            let (reply, ()) = tokio::join!(rig.raw.claim(&run_id, key), async {
                wait_until(&format!("{tag} the claim inside the proxy"), WAIT, || async {
                    (rig.proxy.in_transit(Direction::Upstream) > 0).then_some(())
                })
                .await;
                rig.proxy.cut();
            });
            assert_eq!(reply, Reply::Lost, "{tag} a held claim gets no answer");
            assert!(!task(rig.store(), run, key).await.claimed, "{tag} the held claim reached nexus");
            rig.reconnect().await;
            // Never claimed, so the level-triggered inbox offers it again.
            await_offer(&tag, &mut rig.raw, run, key).await;
            let token = rig.claim(key).await;
            let reply = rig.raw.commit(&run_id, key, &token, body("after a lost claim")).await;
            assert_eq!(reply.committed(), Some((false, "completed".into())), "{tag} {reply:?}");
            Some(TaskStatus::Completed)
        }
        Step::ClaimAnswerLost => {
            rig.proxy.black_hole(Direction::Downstream);
            let (reply, ()) = tokio::join!(rig.raw.claim(&run_id, key), async {
                wait_task(&tag, rig.store(), run, key, "claimed", |t| t.claimed).await;
                rig.proxy.cut();
            });
            assert_eq!(reply, Reply::Lost, "{tag} the grant was held");
            rig.reconnect().await;
            let held = task(rig.store(), run, key).await;
            let again = rig.raw.claim(&run_id, key).await;
            assert_eq!(again.code(), Some("already_claimed"), "{tag} a claim is never re-granted");
            let forged = rig.raw.commit(&run_id, key, "forged", body("x")).await;
            assert_eq!(forged.code(), Some("stale_claim"), "{tag}");
            assert_eq!(task(rig.store(), run, key).await, held, "{tag} refusals change nothing");
            // The holder never got its token: the deadline settles a write it may have done.
            let settled = wait_task(&tag, rig.store(), run, key, "settled", TaskRow::is_settled).await;
            assert_eq!(settled.error_key.as_deref(), Some("tool_uncertain"), "{tag}");
            assert_eq!(settled.result, None, "{tag}");
            Some(TaskStatus::Uncertain)
        }
        Step::AfterClaim => {
            let token = rig.claim(key).await;
            assert!(rig.proxy.cut() >= 1, "{tag} a live stream was cut");
            rig.reconnect().await;
            // The claim outlives the stream: the same token commits on the new one.
            let reply = rig.raw.commit(&run_id, key, &token, body("after the cut")).await;
            assert_eq!(reply.committed(), Some((false, "completed".into())), "{tag} {reply:?}");
            Some(TaskStatus::Completed)
        }
        Step::DuringCommit => {
            let token = rig.claim(key).await;
            let delay = rng.millis(100, 300);
            let cut_after = rng.millis(0, 2 * u64::try_from(delay.as_millis()).unwrap_or(0) + 100);
            rig.proxy.delay(Direction::Both, delay);
            let sent = body("during the commit");
            let (reply, ()) = tokio::join!(rig.raw.commit(&run_id, key, &token, sent.clone()), async {
                wait_until(&format!("{tag} the commit inside the proxy"), WAIT, || async {
                    (rig.proxy.in_transit(Direction::Upstream) > 0).then_some(())
                })
                .await;
                // The cut point is the fault plan: before delivery, between delivery and answer,
                // or after the answer.
                tokio::time::sleep(cut_after).await;
                rig.proxy.cut();
            });
            rig.reconnect().await;
            let again = rig.raw.commit(&run_id, key, &token, sent.clone()).await;
            let (idle, status) = again.committed().unwrap_or_else(|| panic!("{tag} {again:?}"));
            assert_eq!(status, "completed", "{tag}");
            eprintln!("{tag} cut {cut_after:?} into a {delay:?} delay: first answer {reply:?}, repeat idle {idle}");
            Some(TaskStatus::Completed)
        }
        Step::AfterCommitBeforeAck => {
            let token = rig.claim(key).await;
            rig.proxy.black_hole(Direction::Downstream);
            let (reply, ()) = tokio::join!(rig.raw.commit(&run_id, key, &token, body("first")), async {
                wait_task(&tag, rig.store(), run, key, "settled", TaskRow::is_settled).await;
                rig.proxy.cut();
            });
            assert_eq!(reply, Reply::Lost, "{tag} the acknowledgement was held");
            rig.reconnect().await;
            let again = rig.raw.commit(&run_id, key, &token, body("second")).await;
            assert_eq!(again.committed(), Some((true, "completed".into())), "{tag} the repeat is idle");
            let stored = task(rig.store(), run, key).await.result.expect("result");
            assert_eq!(stored["content"], "first", "{tag} write-once keeps the first result");
            Some(TaskStatus::Completed)
        }
        Step::BlackHole => {
            wait_until(&format!("{tag} one live stream"), WAIT, || async {
                (rig.server.server.api.root.census().await.ok()?.connections == 1).then_some(())
            })
            .await;
            rig.proxy.black_hole(Direction::Both);
            let started = Instant::now();
            let bound = Duration::from_millis(STEP_LIVENESS_MS + STEP_PING_MS) + DETECTION_SLACK;
            wait_until(&format!("{tag} nexus to drop the black-holed stream within {bound:?}"), bound, || async {
                (rig.server.server.api.root.census().await.ok()?.connections == 0).then_some(())
            })
            .await;
            let took = started.elapsed();
            eprintln!("{tag} nexus dropped the black-holed stream after {took:?} (bound {bound:?})");
            // A stream is only dropped for silence: not before the liveness bound, less the
            // last pong's age.
            let earliest = Duration::from_millis(STEP_LIVENESS_MS - STEP_PING_MS - 100);
            assert!(took >= earliest, "{tag} dropped after {took:?}, before the liveness bound");
            rig.proxy.cut();
            rig.reconnect().await;
            None
        }
        Step::Delay => {
            let delay = rng.millis(80, 200);
            rig.proxy.delay(Direction::Both, delay);
            let started = Instant::now();
            let token = rig.claim(key).await;
            let round_trip = started.elapsed();
            assert!(round_trip >= 2 * delay, "{tag} a {delay:?} delay each way, yet the claim took {round_trip:?}");
            let reply = rig.raw.commit(&run_id, key, &token, body("delayed")).await;
            assert_eq!(reply.committed(), Some((false, "completed".into())), "{tag} {reply:?}");
            rig.proxy.heal();
            Some(TaskStatus::Completed)
        }
    }
}

// ---- a real runner-agent through the proxy ---------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AgentFault {
    /// Cut the stream while the tool runs (after the claim).
    CutAfterClaim,
    /// Black-hole both ways while the tool runs: both ends must notice within their bounds.
    BlackHoleWhileRunning,
    /// Hold everything the runner sends while it commits.
    CommitIntoUpstreamHole,
    /// Hold everything nexus sends: the first call's acknowledgement and the second call's grant
    /// (one slot, so the second is claimed only after the first finishes).
    AckAndGrantLostDownstream,
    /// Delay every byte both ways.
    Delay,
}

const AGENT_PING_MS: u64 = 250;
const AGENT_LIVENESS_MS: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_agent_through_proxy_faults() {
    let mut sc = Scenario::begin("runner_agent_through_proxy_faults").await;
    let tag = sc.tag();
    let mut faults = vec![
        AgentFault::CutAfterClaim,
        AgentFault::BlackHoleWhileRunning,
        AgentFault::CommitIntoUpstreamHole,
        AgentFault::AckAndGrantLostDownstream,
        AgentFault::Delay,
    ];
    sc.rng.shuffle(&mut faults);
    let sleep = format!("0.{}", sc.rng.range(3, 7));
    let server = TestServer::start_with(&[("agent", bash_script(faults.len(), 2, &sleep))], |c| {
        c.runner.ping_interval_ms = AGENT_PING_MS;
        c.runner.liveness_timeout_ms = AGENT_LIVENESS_MS;
    })
    .await;
    let baseline = census(&server).await;
    let agent = server.agent("agent").await;
    let runner = server.runner("worker").await;
    let proxy = TcpProxy::start(server.server.addr).await;
    let workdir = tempfile::tempdir().expect("workdir");
    let state_dir = tempfile::tempdir().expect("state");
    let mut config = nexus_tests::agent_config(proxy.url(), &runner, workdir.path(), state_dir.path());
    config.slots = 1;
    config.tool_timeout_ms = 5_000;
    config.liveness_timeout = Duration::from_millis(AGENT_LIVENESS_MS);
    config.connect_timeout = Duration::from_secs(1);
    config.handshake_timeout = Duration::from_secs(1);
    config.request_timeout = Duration::from_secs(1);
    config.reconnect_min_delay = Duration::from_millis(50);
    config.reconnect_max_delay = Duration::from_millis(250);
    config.poll_interval = Duration::from_millis(250);
    config.commit_margin = Duration::from_millis(500);
    // The runner's own bound: its liveness (never below three of nexus's pings), then a reconnect.
    let runner_bound = config.liveness_timeout.max(Duration::from_millis(3 * AGENT_PING_MS))
        + config.reconnect_max_delay
        + DETECTION_SLACK;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent_task = tokio::spawn(nexus_runner_agent::run(config, async {
        let _ = stop_rx.await;
    }));
    wait_until(&format!("{tag} the announcement"), WAIT, || async {
        server.store().executor(runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
    })
    .await;
    declare(&server, &agent, &[runner.id], "scripted/agent").await;
    let caller = server.caller(&agent).await;
    let run = admit(&server, &caller, "run through the faults", Some(runner.runner())).await;

    let started = |id: String| {
        let workdir = workdir.path().to_owned();
        let tag = tag.clone();
        async move {
            wait_until(&format!("{tag} the tool of {id} to start"), WAIT, || async {
                side_effects(&workdir).contains_key(&id).then_some(())
            })
            .await;
        }
    };
    let mut never_ran = Vec::new();
    let mut racing_claims: Vec<(String, String)> = Vec::new();
    for (index, fault) in faults.iter().enumerate() {
        let round = index + 1;
        let (first, second) = (format!("r{round}t0"), format!("r{round}t1"));
        eprintln!("{tag} round {round}: {fault:?}");
        // The first call's tool started: its grant reached the runner.
        started(format!("r{round}c0")).await;
        match fault {
            AgentFault::CutAfterClaim => {
                assert!(proxy.cut() >= 1, "{tag} a live stream was cut");
            }
            AgentFault::BlackHoleWhileRunning => {
                let accepted = proxy.accepted();
                proxy.black_hole(Direction::Both);
                let since = Instant::now();
                let nexus_bound = Duration::from_millis(AGENT_LIVENESS_MS + AGENT_PING_MS) + DETECTION_SLACK;
                let (nexus_took, runner_took) = tokio::join!(
                    async {
                        wait_until(
                            &format!("{tag} nexus to drop the black-holed stream within {nexus_bound:?}"),
                            nexus_bound,
                            || async { (server.server.api.root.census().await.ok()?.connections == 0).then_some(()) },
                        )
                        .await;
                        since.elapsed()
                    },
                    async {
                        wait_until(
                            &format!("{tag} the runner to redial within {runner_bound:?}"),
                            runner_bound,
                            || async { (proxy.accepted() > accepted).then_some(()) },
                        )
                        .await;
                        since.elapsed()
                    }
                );
                eprintln!(
                    "{tag} black hole noticed by nexus after {nexus_took:?} (bound {nexus_bound:?}), by the runner after {runner_took:?} (bound {runner_bound:?})"
                );
                proxy.heal();
            }
            AgentFault::CommitIntoUpstreamHole => {
                let accepted = proxy.accepted();
                proxy.black_hole(Direction::Upstream);
                // On a loaded machine the second call's claim can reach nexus before the hole
                // opens and its grant be lost with the stream the runner then gives up: that
                // call settles `uncertain` at its deadline and must never have run.
                racing_claims.push((second.clone(), format!("r{round}c1")));
                // The tool finishes and commits into the hole; the runner gives the stream up
                // (no answer within its request bound, or nexus closed it for silence).
                wait_until(&format!("{tag} the runner to redial"), WAIT, || async {
                    (proxy.accepted() > accepted).then_some(())
                })
                .await;
                proxy.heal();
            }
            AgentFault::AckAndGrantLostDownstream => {
                let accepted = proxy.accepted();
                proxy.black_hole(Direction::Downstream);
                wait_task(&tag, server.store(), run, &first, "settled", TaskRow::is_settled).await;
                wait_task(&tag, server.store(), run, &second, "claimed", |t| t.claimed).await;
                wait_until(&format!("{tag} the runner to redial"), WAIT, || async {
                    (proxy.accepted() > accepted).then_some(())
                })
                .await;
                proxy.heal();
                never_ran.push((second.clone(), format!("r{round}c1")));
            }
            AgentFault::Delay => {
                proxy.delay(Direction::Both, sc.rng.millis(50, 150));
            }
        }
        for key in [&first, &second] {
            wait_task(&tag, server.store(), run, key, "settled", TaskRow::is_settled).await;
        }
        proxy.heal();
    }
    let rows = wait_runs_quiet(&tag, server.store(), &[run], WAIT).await;
    assert_eq!(rows[0].status, RunStatus::Completed, "{tag}");
    let tasks = server.store().tasks_of(run).await.expect("tasks");
    for t in &tasks {
        let key = t.task_key.to_string();
        let lost_grant = never_ran.iter().any(|(lost, _)| *lost == key);
        let racing = racing_claims.iter().find(|(raced, _)| *raced == key);
        if let (Some(raced), TaskStatus::Uncertain) = (racing, t.status) {
            never_ran.push(raced.clone());
            continue;
        }
        let expected = if lost_grant { TaskStatus::Uncertain } else { TaskStatus::Completed };
        assert_eq!(t.status, expected, "{tag} {} ({:?})", t.task_key, t.error_key);
    }
    for (key, id) in &never_ran {
        assert!(!side_effects(workdir.path()).contains_key(id), "{tag} {key} ran although its grant was lost");
    }
    assert_side_effects(&tag, &tasks, workdir.path());
    let _ = stop_tx.send(());
    agent_task.await.expect("agent joins").expect("agent stops cleanly");
    assert_eq!(unacknowledged(state_dir.path(), runner.id), 0, "{tag} every result was acknowledged");
    drop(proxy);
    let bound = CensusBound::after(baseline, 1, 1);
    closing_checks(&sc, &server, bound, &[run], Observations::default(), BTreeMap::from([(run, runner.id)])).await;
}

// ---- SIGKILL of runner-agent processes --------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_agent_sigkill_mid_task_and_restart() {
    let sc = Scenario::begin("runner_agent_sigkill_mid_task_and_restart").await;
    let tag = sc.tag();
    let server = TestServer::start_with(&[("kills", bash_script(3, 4, "0.3"))], |c| {
        c.runner.ping_interval_ms = 500;
        c.runner.liveness_timeout_ms = 2_000;
    })
    .await;
    let baseline = census(&server).await;
    let agent = server.agent("agent").await;
    let mut specs = Vec::new();
    let mut dirs = Vec::new();
    let mut children = Vec::new();
    for i in 0..2 {
        let runner = server.runner(&format!("worker-{i}")).await;
        let workdir = tempfile::tempdir().expect("workdir");
        let state = tempfile::tempdir().expect("state");
        let spec = RunnerAgentProcess {
            nexus_url: server.url(),
            token_file: server.token_file(&runner),
            runner,
            workdir: workdir.path().to_owned(),
            state_dir: state.path().to_owned(),
            tool_timeout_ms: 3_000,
        };
        children.push(spec.spawn());
        specs.push(spec);
        dirs.push((workdir, state));
    }
    for spec in &specs {
        wait_until(&format!("{tag} the announcement"), WAIT, || async {
            server.store().executor(spec.runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
        })
        .await;
    }
    let ids: Vec<Uuid> = specs.iter().map(|spec| spec.runner.id).collect();
    declare(&server, &agent, &ids, "scripted/kills").await;
    let caller = server.caller(&agent).await;
    let mut runs = Vec::new();
    for id in &ids {
        runs.push(admit(&server, &caller, "run, and survive a kill", Some(RunnerId::from_uuid(*id))).await);
    }

    // The plan: each runner is killed once its run has had k claims, and the second runner once
    // more later; each comes back after a pause, on the same state dir.
    let mut plans = Vec::new();
    for i in 0..specs.len() {
        let mut rng = sc.rng_for(&format!("runner-{i}"));
        let first = usize::try_from(rng.range(1, 8)).expect("small");
        let mut kills = vec![(first, rng.millis(0, 600))];
        if i == 1 {
            kills.push((first + usize::try_from(rng.range(2, 4)).expect("small"), rng.millis(0, 600)));
        }
        eprintln!("{tag} runner {i}: kill after claims {kills:?}");
        plans.push(kills);
    }
    let store = server.store();
    let kill_and_restart = |run: ExecutionId,
                            spec: RunnerAgentProcess,
                            mut child: Child,
                            kills: Vec<(usize, Duration)>| {
        let tag = tag.clone();
        async move {
            for (claims, pause) in kills {
                let (claimed, running) = wait_until(&format!("{tag} {claims} claims"), WAIT, || async {
                    let tasks = store.tasks_of(run).await.ok()?;
                    let claimed = tasks.iter().filter(|t| t.claimed).count();
                    let running = tasks.iter().filter(|t| t.claimed && !t.is_settled()).count();
                    let finished = tasks.len() == 12 && tasks.iter().all(TaskRow::is_settled);
                    (claimed >= claims || finished).then_some((claimed, running))
                })
                .await;
                sigkill(&mut child).await;
                eprintln!("{tag} SIGKILL runner-agent with {claimed} claimed, {running} running; back in {pause:?}");
                tokio::time::sleep(pause).await;
                child = spec.spawn();
            }
            child
        }
    };
    let mut children = children.into_iter();
    let (first, second) = tokio::join!(
        kill_and_restart(runs[0], specs[0].clone(), children.next().expect("child"), plans[0].clone()),
        kill_and_restart(runs[1], specs[1].clone(), children.next().expect("child"), plans[1].clone())
    );
    let rows = wait_runs_quiet(&tag, store, &runs, Duration::from_secs(60)).await;
    for row in &rows {
        assert_eq!(row.status, RunStatus::Completed, "{tag} {}", row.public_id);
    }
    for (((mut child, spec), run), (workdir, state)) in [first, second].into_iter().zip(&specs).zip(&runs).zip(&dirs) {
        let tasks = store.tasks_of(*run).await.expect("tasks");
        assert_side_effects(&tag, &tasks, workdir.path());
        wait_until(&format!("{tag} the journal to empty"), WAIT, || async {
            (unacknowledged(state.path(), spec.runner.id) == 0).then_some(())
        })
        .await;
        sigkill(&mut child).await;
    }
    let targets = runs.iter().copied().zip(ids.iter().copied()).collect();
    let history =
        closing_checks(&sc, &server, CensusBound::after(baseline, 2, 1), &runs, Observations::default(), targets).await;
    eprintln!("{tag} statuses {:?}", status_counts(&history));
}

// ---- SIGKILL of nexus, and a restart on the same data dir ------------------------------------

fn authed<T>(message: T, member: &Minted) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {}", member.token).parse().expect("header"));
    request
}

async fn agent_client(url: &str) -> AgentServiceClient<Channel> {
    let channel = Endpoint::from_shared(url.to_owned()).expect("url").connect().await.expect("connect");
    AgentServiceClient::new(channel)
}

#[derive(Clone, Copy, Debug)]
enum KillPoint {
    /// A task of the round is claimed (its tool is running).
    FirstClaim(i64),
    /// A task of the round has settled.
    FirstSettle(i64),
    /// A task of the round has settled in its row, and its execution has not yet written the
    /// `task_status` event that narrates it (a window of a store write or two).
    SettledUnnarrated(i64),
}

impl KillPoint {
    fn round(self) -> i64 {
        match self {
            KillPoint::FirstClaim(r) | KillPoint::FirstSettle(r) | KillPoint::SettledUnnarrated(r) => r,
        }
    }
}

/// The tasks as `key:status` (`*` when claimed) once `point` is reached, or once the round is
/// past it (then the kill still happens, later than planned).
async fn kill_point_reached(store: &Store, run: ExecutionId, point: KillPoint) -> Option<Vec<String>> {
    let tasks = store.tasks_of(run).await.ok()?;
    let mut in_round = tasks.iter().filter(|t| t.round == point.round());
    let hit = match point {
        KillPoint::FirstClaim(_) => in_round.any(|t| t.claimed),
        KillPoint::FirstSettle(_) => in_round.any(TaskRow::is_settled),
        KillPoint::SettledUnnarrated(_) => {
            let events = store.events_after(run, 0, 10_000).await.ok()?;
            let narrated = |task_key: TaskKey| {
                events
                    .iter()
                    .filter_map(|e| e.event.as_task_status())
                    .any(|n| n.task_key == task_key && n.status.is_settled())
            };
            in_round.any(|t| t.is_settled() && !narrated(t.task_key))
        }
    };
    let later = tasks.iter().any(|t| t.round > point.round());
    (hit || later).then(|| {
        tasks.iter().map(|t| format!("{}:{}{}", t.task_key, t.status, if t.claimed { "*" } else { "" })).collect()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nexus_sigkill_and_restart_on_the_same_data_dir() {
    let mut sc = Scenario::begin("nexus_sigkill_and_restart_on_the_same_data_dir").await;
    let tag = sc.tag();
    let dir = tempfile::tempdir().expect("dir");
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).expect("data dir");
    let database = match test_store_backend() {
        StoreBackend::Postgres => Some(TestDatabase::create().await),
        _ => None,
    };
    let at = StoreLocation { data_dir, database_url: database.as_ref().map(|d| d.url().to_owned()) };
    let script = dir.path().join("restart.json");
    std::fs::write(&script, bash_script(4, 3, "0.4").to_string()).expect("script");
    let config = dir.path().join("nexus.toml");
    std::fs::write(
        &config,
        format!(
            "[runner]\nping_interval_ms = 300\nliveness_timeout_ms = 1500\n\n[providers.scripted]\nkind = \"scripted\"\n\n\
             [providers.scripted.models.restart]\nscript = {:?}\n",
            script.display().to_string()
        ),
    )
    .expect("config");
    let addr = free_loopback_addr();
    let mut nexus = Some(NexusProcess::serve(&at, addr, &config).await);
    let agent = admin_agent(&at, "agent").await;
    let runner = admin_runner(&at, "worker").await;
    let workdir = tempfile::tempdir().expect("workdir");
    let state = tempfile::tempdir().expect("state");
    let spec = RunnerAgentProcess {
        nexus_url: format!("http://{addr}"),
        token_file: dir.path().join("runner.token"),
        runner: runner.clone(),
        workdir: workdir.path().to_owned(),
        state_dir: state.path().to_owned(),
        tool_timeout_ms: 6_000,
    };
    let mut runner_child = spec.spawn();
    // A reader of the same store, beside the server (as `nexus admin` is).
    let store_config =
        StoreConfig { database_url: at.database_url.clone(), max_connections: Some(2), ..StoreConfig::default() };
    let store = Store::connect_existing(&at.data_dir, &store_config).await.expect("open the store beside nexus");
    wait_until(&format!("{tag} the announcement"), WAIT, || async {
        store.executor(runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
    })
    .await;
    let mut client = agent_client(&format!("http://{addr}")).await;
    let body = json!({"configuration": {
        "runner_executor_public_ids": [runner.id], "approval_mode": "bypass", "default_model": "scripted/restart",
    }});
    client
        .declare_profile(authed(DeclareProfileRequest { body_json: body.to_string() }, &agent))
        .await
        .expect("declare");
    let request = CreateInputRequest {
        text: "survive a crash".into(),
        runner_executor_public_id: runner.id.to_string(),
        ..CreateInputRequest::default()
    };
    let execution = client.create_input(authed(request, &agent)).await.expect("create input").into_inner();
    let run: ExecutionId = execution.execution_public_id.parse().expect("uuid");
    drop(client);

    let first_round = i64::try_from(sc.rng.range(1, 3)).expect("small");
    let second_round = first_round + i64::try_from(sc.rng.range(1, 3)).expect("small");
    let pick = |rng: &mut ChaosRng, round| match rng.index(3) {
        0 => KillPoint::FirstClaim(round),
        1 => KillPoint::FirstSettle(round),
        _ => KillPoint::SettledUnnarrated(round),
    };
    let kills = [
        (pick(&mut sc.rng, first_round), sc.rng.millis(0, 800)),
        (pick(&mut sc.rng, second_round), sc.rng.millis(0, 800)),
    ];
    eprintln!("{tag} kills: {kills:?}");
    let mut longest_outage = Duration::ZERO;
    for (point, pause) in kills {
        // The narrow window is polled tightly; the others every 20 ms.
        let every = if matches!(point, KillPoint::SettledUnnarrated(_)) { 2 } else { 20 };
        let deadline = Instant::now() + WAIT;
        let seen = loop {
            if let Some(seen) = kill_point_reached(&store, run, point).await {
                break seen;
            }
            assert!(Instant::now() < deadline, "{tag} {point:?} never came");
            tokio::time::sleep(Duration::from_millis(every)).await;
        };
        nexus.take().expect("running").sigkill().await;
        let down = Instant::now();
        eprintln!("{tag} SIGKILL nexus at {point:?} with tasks (claimed*) {seen:?}; restarting in {pause:?}");
        tokio::time::sleep(pause).await;
        nexus = Some(NexusProcess::serve(&at, addr, &config).await);
        longest_outage = longest_outage.max(down.elapsed());
    }
    let rows = wait_runs_quiet(&tag, &store, &[run], Duration::from_secs(60)).await;
    assert_eq!(rows[0].status, RunStatus::Completed, "{tag}");
    assert_eq!(rows[0].final_text.as_deref(), Some("all rounds done"), "{tag}");
    wait_until(&format!("{tag} the journal to empty"), WAIT, || async {
        (unacknowledged(state.path(), runner.id) == 0).then_some(())
    })
    .await;
    let exit = nexus.take().expect("running").sigterm(Duration::from_secs(20)).await;
    assert!(exit.success(), "{tag} nexus exited {exit} after SIGTERM");
    sigkill(&mut runner_child).await;

    let tasks = store.tasks_of(run).await.expect("tasks");
    assert_eq!(tasks.len(), 12, "{tag}");
    assert_side_effects(&tag, &tasks, workdir.path());
    let mut history = invariants::collect(&store, &[run], Observations::default()).await;
    history.targets = BTreeMap::from([(run, runner.id)]);
    // A deadline that passed while nexus was down is settled when it comes back.
    history.deadline_slack_ms =
        DEFAULT_DEADLINE_SLACK_MS + i64::try_from(longest_outage.as_millis()).unwrap_or(i64::MAX);
    assert_holds(&tag, &check(&history));
    eprintln!("{tag} statuses {:?}, longest outage {longest_outage:?}", status_counts(&history));
    store.close().await;
}

// ---- SIGKILL of nexus with a conversation's turns queued ---------------------------------------

/// Whether a recorded model request belongs to the turn whose user text is `text`: it carries
/// that user message (a later turn's request may also carry earlier turns as history).
fn carries_user_text(request: &nexus_tests::FakeRequest, text: &str) -> bool {
    request.body["messages"]
        .as_array()
        .is_some_and(|messages| messages.iter().any(|m| m["role"] == "user" && m["content"] == text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nexus_sigkill_with_a_turn_queued_and_between_turns() {
    let mut sc = Scenario::begin("nexus_sigkill_with_a_turn_queued_and_between_turns").await;
    let tag = sc.tag();
    let dir = tempfile::tempdir().expect("dir");
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).expect("data dir");
    let database = match test_store_backend() {
        StoreBackend::Postgres => Some(TestDatabase::create().await),
        _ => None,
    };
    let at = StoreLocation { data_dir, database_url: database.as_ref().map(|d| d.url().to_owned()) };
    // The model is a fake provider in this process, so it outlives every nexus and records what
    // each turn's requests carried (`FakeProvider::requests_for("chat")`).
    let fake = nexus_tests::FakeProvider::start().await;
    let bash = |id: &str| {
        nexus_tests::Act::ToolCalls(vec![(
            id.to_owned(),
            "bash".to_owned(),
            json!({"command": format!("echo {id} >> side.log; sleep 1; echo {id}")}),
        )])
    };
    // A model call lost to a kill is asked again and takes the next answer: the spare final keeps
    // turn 2 answerable however its calls fell.
    fake.script(
        "chat",
        [
            bash("t1c1"),
            nexus_tests::Act::Text("turn one done".into()),
            bash("t2c1"),
            nexus_tests::Act::Text("turn two done".into()),
            nexus_tests::Act::Text("turn two done".into()),
        ],
    );
    let config = dir.path().join("nexus.toml");
    std::fs::write(
        &config,
        format!(
            "[runner]\nping_interval_ms = 300\nliveness_timeout_ms = 1500\n\n[providers.fake]\nkind = \"openai_compatible\"\n\
             base_url = {:?}\nallow_any_model = true\n",
            fake.openai_base_url()
        ),
    )
    .expect("config");
    let addr = free_loopback_addr();
    let mut nexus = Some(NexusProcess::serve(&at, addr, &config).await);
    let agent = admin_agent(&at, "agent").await;
    let runner = admin_runner(&at, "worker").await;
    let workdir = tempfile::tempdir().expect("workdir");
    let state = tempfile::tempdir().expect("state");
    let spec = RunnerAgentProcess {
        nexus_url: format!("http://{addr}"),
        token_file: dir.path().join("runner.token"),
        runner: runner.clone(),
        workdir: workdir.path().to_owned(),
        state_dir: state.path().to_owned(),
        tool_timeout_ms: 8_000,
    };
    let mut runner_child = spec.spawn();
    let store_config =
        StoreConfig { database_url: at.database_url.clone(), max_connections: Some(2), ..StoreConfig::default() };
    let store = Store::connect_existing(&at.data_dir, &store_config).await.expect("open the store beside nexus");
    wait_until(&format!("{tag} the announcement"), WAIT, || async {
        store.executor(runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
    })
    .await;
    let mut client = agent_client(&format!("http://{addr}")).await;
    let body = json!({"configuration": {
        "runner_executor_public_ids": [runner.id], "approval_mode": "bypass", "default_model": "fake/chat",
    }});
    client
        .declare_profile(authed(DeclareProfileRequest { body_json: body.to_string() }, &agent))
        .await
        .expect("declare");
    let first = client
        .create_input(authed(CreateInputRequest { text: "first".into(), ..CreateInputRequest::default() }, &agent))
        .await
        .expect("turn 1")
        .into_inner();
    let second = client
        .create_input(authed(
            CreateInputRequest {
                text: "second".into(),
                conversation_public_id: first.conversation_public_id.clone(),
                ..CreateInputRequest::default()
            },
            &agent,
        ))
        .await
        .expect("turn 2")
        .into_inner();
    drop(client);
    assert_eq!((second.turn, second.status.as_str(), second.queue_position), (2, "pending", 1), "{tag}");
    let run1: ExecutionId = first.execution_public_id.parse().expect("uuid");
    let run2: ExecutionId = second.execution_public_id.parse().expect("uuid");
    assert_eq!(second.waits_for_execution_public_id, run1.to_string(), "{tag}");

    // Kill 1: turn 1's call is running at the runner and turn 2 is queued.
    wait_task(&tag, &store, run1, "r1t0", "claimed", |t| t.claimed).await;
    let queued = store.execution(run2).await.expect("store").expect("row");
    assert_eq!((queued.status, queued.event_seq), (RunStatus::Pending, 0), "{tag} turn 2 waits, unmaterialized");
    nexus.take().expect("running").sigkill().await;
    let pause = sc.rng.millis(0, 800);
    eprintln!("{tag} SIGKILL nexus during turn 1 with turn 2 queued; restarting in {pause:?}");
    tokio::time::sleep(pause).await;
    nexus = Some(NexusProcess::serve(&at, addr, &config).await);

    // Kill 2: between the turns (turn 1 ended, turn 2 not started), or, when that window is
    // missed, while turn 2's call runs; never while a model call is out.
    let deadline = Instant::now() + WAIT;
    let point = loop {
        let one = store.execution(run1).await.ok().flatten().map(|r| r.status);
        let two = store.execution(run2).await.ok().flatten().map(|r| r.status);
        if one == Some(RunStatus::Completed) && two == Some(RunStatus::Pending) {
            break "between the turns";
        }
        if store.task(run2, key("r1t0")).await.ok().flatten().is_some_and(|t| t.claimed) {
            break "during turn 2's call";
        }
        assert!(Instant::now() < deadline, "{tag} turn 2 never came: turn 1 {one:?}, turn 2 {two:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    nexus.take().expect("running").sigkill().await;
    let pause = sc.rng.millis(0, 800);
    eprintln!("{tag} SIGKILL nexus {point}; restarting in {pause:?}");
    tokio::time::sleep(pause).await;
    nexus = Some(NexusProcess::serve(&at, addr, &config).await);

    let rows = wait_runs_quiet(&tag, &store, &[run1, run2], Duration::from_secs(60)).await;
    assert_eq!(
        rows.iter().map(|r| (r.status, r.final_text.as_deref())).collect::<Vec<_>>(),
        [(RunStatus::Completed, Some("turn one done")), (RunStatus::Completed, Some("turn two done"))],
        "{tag}"
    );
    // Turn 2 asked the model only after turn 1's last request, and each turn's input arrived.
    // `requests[seconds[0]].body["messages"]` is turn 2's first request as the model got it: the
    // place to assert the history it carries (turn 1's input, calls, results and answer).
    let requests = fake.requests_for("chat");
    let firsts: Vec<usize> = (0..requests.len()).filter(|&i| !carries_user_text(&requests[i], "second")).collect();
    let seconds: Vec<usize> = (0..requests.len()).filter(|&i| carries_user_text(&requests[i], "second")).collect();
    assert!(!seconds.is_empty() && firsts.iter().all(|&i| carries_user_text(&requests[i], "first")), "{tag}");
    assert!(firsts.iter().max() < seconds.iter().min(), "{tag} the turns overlapped: {firsts:?} / {seconds:?}");
    let started = store.events_after(run2, 0, 10_000).await.expect("events");
    let ended = store.events_after(run1, 0, 10_000).await.expect("events");
    let end = ended.iter().find(|e| {
        e.event.as_turn_status().is_some_and(|s| matches!(s, nexus_actors::store::event::TurnStatus::Completed {}))
    });
    let begin = started.iter().find(|e| e.event.event_type() == nexus_actors::store::EventType::InputMaterialized);
    assert!(end.zip(begin).is_some_and(|(end, begin)| begin.at >= end.at), "{tag} turn 2 began before turn 1 ended");
    wait_until(&format!("{tag} the journal to empty"), WAIT, || async {
        (unacknowledged(state.path(), runner.id) == 0).then_some(())
    })
    .await;
    let exit = nexus.take().expect("running").sigterm(Duration::from_secs(20)).await;
    assert!(exit.success(), "{tag} nexus exited {exit} after SIGTERM");
    sigkill(&mut runner_child).await;
    let mut tasks = store.tasks_of(run1).await.expect("tasks");
    tasks.extend(store.tasks_of(run2).await.expect("tasks"));
    assert_side_effects(&tag, &tasks, workdir.path());
    let mut history = invariants::collect(&store, &[run1, run2], Observations::default()).await;
    history.targets = BTreeMap::from([(run1, runner.id), (run2, runner.id)]);
    history.deadline_slack_ms = DEFAULT_DEADLINE_SLACK_MS + 5_000;
    assert_holds(&tag, &check(&history));
    store.close().await;
}

// ---- duplicated, reordered and stale frames ---------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_reordered_and_stale_frames_change_nothing() {
    let sc = Scenario::begin("duplicated_reordered_and_stale_frames_change_nothing").await;
    let tag = sc.tag();
    let calls: Vec<Value> =
        (0..8).map(|i| json!({"id": format!("f{i}"), "name": "probe", "arguments": {"i": i}})).collect();
    let script = json!({"rounds": [{"tool_calls": calls}, {"final": "frames done"}]});
    let server = TestServer::start(&[("frames", script)]).await;
    let baseline = census(&server).await;
    let agent = server.agent("agent").await;
    let minted_a = server.runner("runner-a").await;
    let minted_b = server.runner("runner-b").await;
    let ledger = Ledger::new();
    let mut a = ObservedRunner::connect_welcomed(&server.url(), &minted_a, &ledger, WAIT).await;
    let b = ObservedRunner::connect_welcomed(&server.url(), &minted_b, &ledger, WAIT).await;
    for runner in [&a, &b] {
        assert!(runner.announce(&json!({"tools": [probe(30_000)]})).await.code().is_none(), "{tag}");
    }
    declare(&server, &agent, &[minted_a.id], "scripted/frames").await;
    let caller = server.caller(&agent).await;
    let run = admit(&server, &caller, "frames", None).await;
    let r = run.to_string();
    for i in 0..8 {
        await_offer(&tag, &mut a, run, &format!("r1t{i}")).await;
    }
    let store = server.store();
    let completed = |reply: &Reply| reply.committed() == Some((false, "completed".to_owned()));

    // A claim sent twice at once is granted once.
    let (one, two) = tokio::join!(a.claim(&r, "r1t0"), a.claim(&r, "r1t0"));
    let grants = [&one, &two].iter().filter(|reply| reply.granted().is_some()).count();
    assert_eq!(grants, 1, "{tag} {one:?} {two:?}");
    let loser = if one.granted().is_some() { &two } else { &one };
    assert_eq!(loser.code(), Some("already_claimed"), "{tag}");
    let token0 = one.granted().or_else(|| two.granted()).expect("granted").0;
    assert!(completed(&a.commit(&r, "r1t0", &token0, body("zero")).await), "{tag}");

    // A commit sent twice at once settles once; the repeat is idle and keeps the first body.
    let token1 = a.claim(&r, "r1t1").await.granted().expect("granted").0;
    let (first, again) =
        tokio::join!(a.commit(&r, "r1t1", &token1, body("one")), a.commit(&r, "r1t1", &token1, body("uno")));
    assert_eq!(first.committed(), Some((false, "completed".into())), "{tag}");
    assert_eq!(again.committed(), Some((true, "completed".into())), "{tag}");
    assert_eq!(task(store, run, "r1t1").await.result.expect("result")["content"], "one", "{tag}");

    // A commit that overtakes its claim is task_not_running, and changes nothing.
    let before = task(store, run, "r1t2").await;
    let (early, claim) = tokio::join!(a.commit(&r, "r1t2", "guessed", body("early")), a.claim(&r, "r1t2"));
    assert_eq!(early.code(), Some("task_not_running"), "{tag}");
    let (token2, _) = claim.granted().unwrap_or_else(|| panic!("{tag} {claim:?}"));
    let after = task(store, run, "r1t2").await;
    assert_eq!((after.result, after.status, after.settled_at), (None, TaskStatus::Dispatched, None), "{tag}");
    assert_eq!(after.claim_token_digest, Some(digest(&token2)), "{tag}");
    assert_eq!(before.result, None);
    assert!(completed(&a.commit(&r, "r1t2", &token2, body("two")).await), "{tag}");

    // A commit pipelined right behind its claim, without the token, is stale_claim.
    let (claim, blind) = tokio::join!(a.claim(&r, "r1t3"), a.commit(&r, "r1t3", "", body("blind")));
    let (token3, _) = claim.granted().unwrap_or_else(|| panic!("{tag} {claim:?}"));
    assert_eq!(blind.code(), Some("stale_claim"), "{tag}");
    let after = task(store, run, "r1t3").await;
    assert_eq!((after.result, after.status), (None, TaskStatus::Dispatched), "{tag} a refused commit changes nothing");
    assert!(completed(&a.commit(&r, "r1t3", &token3, body("three")).await), "{tag}");

    // Extend and claim status before the claim are not_claimant, and change nothing.
    let before = task(store, run, "r1t4").await;
    assert_eq!(a.raw.extend(&r, "r1t4", "early", 1_000).await.code(), Some("not_claimant"), "{tag}");
    assert_eq!(a.raw.claim_status(&r, "r1t4", "early").await.code(), Some("not_claimant"), "{tag}");
    assert_eq!(task(store, run, "r1t4").await, before, "{tag}");
    let token4 = a.claim(&r, "r1t4").await.granted().expect("granted").0;
    assert!(completed(&a.commit(&r, "r1t4", &token4, body("four")).await), "{tag}");

    // Another task's token, and a forged one, are stale_claim.
    let token5 = a.claim(&r, "r1t5").await.granted().expect("granted").0;
    let held = task(store, run, "r1t5").await;
    assert_eq!(a.commit(&r, "r1t5", &token4, body("wrong")).await.code(), Some("stale_claim"), "{tag}");
    assert_eq!(a.commit(&r, "r1t5", "forged", body("forged")).await.code(), Some("stale_claim"), "{tag}");
    assert_eq!(task(store, run, "r1t5").await, held, "{tag}");
    assert!(completed(&a.commit(&r, "r1t5", &token5, body("five")).await), "{tag}");
    assert_eq!(a.commit(&r, "r1t5", "forged", body("late")).await.code(), Some("stale_claim"), "{tag}");

    // Runner B can neither claim nor commit runner A's task, even with A's token.
    let before = task(store, run, "r1t6").await;
    assert_eq!(b.claim(&r, "r1t6").await.code(), Some("not_addressed_here"), "{tag}");
    let token6 = a.claim(&r, "r1t6").await.granted().expect("granted").0;
    let held = task(store, run, "r1t6").await;
    assert_ne!(held, before);
    assert_eq!(b.commit(&r, "r1t6", &token6, body("b")).await.code(), Some("not_addressed_here"), "{tag}");
    assert_eq!(task(store, run, "r1t6").await, held, "{tag}");
    assert!(completed(&a.commit(&r, "r1t6", &token6, body("six")).await), "{tag}");

    // A second Hello on a live stream is a protocol violation.
    let hello = a
        .raw
        .request(nexus_proto::runner::v1::runner_frame::Frame::Hello(nexus_proto::runner::v1::Hello {
            executor_public_id: minted_a.id.to_string(),
            credential: minted_a.token.clone(),
            protocol_version: nexus_proto::RUNNER_PROTOCOL_VERSION,
            batches: false,
        }))
        .await;
    assert_eq!(hello.code(), Some("protocol_violation"), "{tag}");

    // A token from before a reconnect: the fenced stream changes nothing, the new stream commits.
    let token7 = a.claim(&r, "r1t7").await.granted().expect("granted").0;
    let held = task(store, run, "r1t7").await;
    let fresh = ObservedRunner::connect_welcomed(&server.url(), &minted_a, &ledger, WAIT).await;
    assert_eq!(a.commit(&r, "r1t7", &token7, body("fenced")).await, Reply::Lost, "{tag} the fenced stream is closed");
    assert_eq!(task(store, run, "r1t7").await, held, "{tag}");
    assert!(completed(&fresh.commit(&r, "r1t7", &token7, body("seven")).await), "{tag}");
    assert_eq!(fresh.commit(&r, "r1t7", &token7, body("seven")).await.committed(), Some((true, "completed".into())));

    let rows = wait_runs_quiet(&tag, store, &[run], WAIT).await;
    assert_eq!(rows[0].final_text.as_deref(), Some("frames done"), "{tag}");
    drop((a, b, fresh));
    let observations = ledger.snapshot();
    assert_eq!(observations.refusals.get("stale_claim"), Some(&4), "{tag} {:?}", observations.refusals);
    let history = closing_checks(
        &sc,
        &server,
        CensusBound::after(baseline, 2, 1),
        &[run],
        observations,
        BTreeMap::from([(run, minted_a.id)]),
    )
    .await;
    assert_eq!(status_counts(&history).get(&TaskStatus::Completed), Some(&8), "{tag}");
}

// ---- the soak: 20 runners, 2,000 tasks, random faults -----------------------------------------

const SOAK_RUNNERS: usize = 20;
const SOAK_RUNS: usize = 40;
const SOAK_ROUNDS: usize = 5;
const SOAK_CALLS: usize = 10;
const SOAK_TIMEOUT_MS: u64 = 10_000;

/// What a soak runner does with one task, drawn from the seed per (run ordinal, task key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum SoakFault {
    Normal,
    /// Commit twice at once: one settles, the other is idle.
    Duplicate,
    /// Commit first with another task's token (stale_claim), then with its own.
    StaleFirst,
    /// Claim again after the grant (already_claimed), then commit.
    Reclaim,
    /// Cut the stream after the claim; commit from the journal after reconnecting.
    CutAfterClaim,
    /// Cut the stream while the commit is in flight; commit again after reconnecting.
    CutDuringCommit,
    /// Claim and never commit: the deadline settles it.
    Abandon,
    /// Never claim: the deadline settles it.
    Ignore,
}

fn soak_fault(seed: u64, ordinal: usize, task_key: &str) -> SoakFault {
    let mut rng = ChaosRng::derive(seed, &format!("soak/{ordinal}/{task_key}"));
    match rng.range(0, 100) {
        0..62 => SoakFault::Normal,
        62..70 => SoakFault::Duplicate,
        70..78 => SoakFault::StaleFirst,
        78..82 => SoakFault::Reclaim,
        82..88 => SoakFault::CutAfterClaim,
        88..94 => SoakFault::CutDuringCommit,
        94..97 => SoakFault::Abandon,
        _ => SoakFault::Ignore,
    }
}

fn soak_body(run: &str, key: &str) -> Value {
    body(&format!("{run}/{key}"))
}

/// A fast in-process runner over [`ObservedRunner`], with its own journal of granted,
/// unacknowledged tasks that it commits again after every reconnect.
struct SoakRunner {
    minted: Minted,
    proxy: Arc<TcpProxy>,
    ledger: Ledger,
    seed: u64,
    ordinals: Arc<Mutex<HashMap<ExecutionId, usize>>>,
    journal: BTreeMap<(String, String), String>,
    last_token: Option<String>,
    stop: Arc<AtomicBool>,
    surprises: Arc<Mutex<Vec<String>>>,
    faults: BTreeMap<SoakFault, usize>,
}

impl SoakRunner {
    async fn run(mut self) -> BTreeMap<SoakFault, usize> {
        let mut raw = self.connect().await;
        while !self.stop.load(Ordering::SeqCst) {
            let healthy = match raw.poll_push(Duration::from_millis(200)).await {
                Push::Frame(nexus_frame::Frame::WorkAvailable(work)) => self.work(&raw, work).await,
                Push::Frame(_) | Push::Quiet => true,
                Push::Ended => false,
            };
            if !healthy {
                raw = self.reconnect().await;
            }
        }
        self.faults
    }

    async fn connect(&self) -> ObservedRunner {
        ObservedRunner::connect_welcomed(&self.proxy.url(), &self.minted, &self.ledger, WAIT).await
    }

    /// Reconnects and commits every journaled result again.
    async fn reconnect(&mut self) -> ObservedRunner {
        'again: loop {
            let raw = self.connect().await;
            let journaled: Vec<((String, String), String)> = self.journal.clone().into_iter().collect();
            for ((run, key), token) in journaled {
                if self.commit(&raw, &run, &key, &token).await.is_none() {
                    continue 'again;
                }
            }
            return raw;
        }
    }

    fn surprise(&self, what: String) {
        self.surprises.lock().expect("surprises").push(what);
    }

    /// Commits the task's result with its own token; `None` when the stream died first.
    async fn commit(&mut self, raw: &ObservedRunner, run: &str, key: &str, token: &str) -> Option<()> {
        let reply = raw.commit(run, key, token, soak_body(run, key)).await;
        self.settle_journal(run, key, &reply)
    }

    fn settle_journal(&mut self, run: &str, key: &str, reply: &Reply) -> Option<()> {
        match reply {
            Reply::Lost => return None,
            Reply::Frame(_) if reply.committed().is_some() => {}
            other => self.surprise(format!("{run}/{key}: the holder's commit was answered {other:?}")),
        }
        self.journal.remove(&(run.to_owned(), key.to_owned()));
        Some(())
    }

    async fn ordinal(&self, run: &str) -> usize {
        let run: ExecutionId = run.parse().expect("uuid");
        wait_until("the run's ordinal", WAIT, || async { self.ordinals.lock().expect("ordinals").get(&run).copied() })
            .await
    }

    /// Handles one offer; `false` when the stream must be reopened.
    async fn work(&mut self, raw: &ObservedRunner, work: WorkAvailable) -> bool {
        let (run, key) = (work.run_public_id, work.task_key);
        let fault = soak_fault(self.seed, self.ordinal(&run).await, &key);
        if fault == SoakFault::Ignore {
            *self.faults.entry(fault).or_default() += 1;
            return true;
        }
        let reply = raw.claim(&run, &key).await;
        let token = match &reply {
            Reply::Lost => return false,
            Reply::Refused { code, .. } => {
                // An offer repeated after a reconnect, or one the deadline beat.
                if !matches!(code.as_str(), "already_claimed" | "task_not_claimable") {
                    self.surprise(format!("{run}/{key}: claim refused {code}"));
                }
                return true;
            }
            Reply::Frame(_) => match reply.granted() {
                Some((token, _)) => token,
                None => {
                    self.surprise(format!("{run}/{key}: claim answered {reply:?}"));
                    return true;
                }
            },
        };
        *self.faults.entry(fault).or_default() += 1;
        self.journal.insert((run.clone(), key.clone()), token.clone());
        let stale = self.last_token.replace(token.clone()).unwrap_or_else(|| "forged".to_owned());
        match fault {
            SoakFault::Normal => self.commit(raw, &run, &key, &token).await.is_some(),
            SoakFault::Duplicate => {
                let (first, second) = tokio::join!(
                    raw.commit(&run, &key, &token, soak_body(&run, &key)),
                    raw.commit(&run, &key, &token, body("a duplicate"))
                );
                match (first.committed(), second.committed()) {
                    (Some((false, a)), Some((true, b))) if a == b => {}
                    _ if first == Reply::Lost || second == Reply::Lost => {}
                    _ => {
                        self.surprise(format!("{run}/{key}: a duplicate commit was answered {first:?} then {second:?}"))
                    }
                }
                let acked = first.committed().is_some() || second.committed().is_some();
                if acked {
                    self.journal.remove(&(run.clone(), key.clone()));
                }
                first != Reply::Lost && second != Reply::Lost
            }
            SoakFault::StaleFirst => {
                let reply = raw.commit(&run, &key, &stale, body("stale")).await;
                match reply.code() {
                    Some("lost") => false,
                    Some("stale_claim") => self.commit(raw, &run, &key, &token).await.is_some(),
                    _ => {
                        self.surprise(format!("{run}/{key}: a stale token was answered {reply:?}"));
                        true
                    }
                }
            }
            SoakFault::Reclaim => {
                let again = raw.claim(&run, &key).await;
                match again.code() {
                    Some("lost") => false,
                    Some("already_claimed") => self.commit(raw, &run, &key, &token).await.is_some(),
                    _ => {
                        self.surprise(format!("{run}/{key}: a second claim was answered {again:?}"));
                        true
                    }
                }
            }
            SoakFault::CutAfterClaim => {
                self.proxy.cut();
                false
            }
            SoakFault::CutDuringCommit => {
                let proxy = self.proxy.clone();
                let (reply, _) =
                    tokio::join!(raw.commit(&run, &key, &token, soak_body(&run, &key)), async move { proxy.cut() });
                let _ = self.settle_journal(&run, &key, &reply);
                false
            }
            SoakFault::Abandon => {
                self.journal.remove(&(run, key));
                true
            }
            SoakFault::Ignore => true,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_20_runners_2000_tasks_under_random_faults() {
    let sc = Scenario::begin("soak_20_runners_2000_tasks_under_random_faults").await;
    let tag = sc.tag();
    let rounds: Vec<Value> = (1..=SOAK_ROUNDS)
        .map(|round| {
            let calls: Vec<Value> = (0..SOAK_CALLS)
                .map(|i| {
                    let name = if i % 2 == 0 { "probe" } else { "poke" };
                    json!({"id": format!("s{round}_{i}"), "name": name, "arguments": {"i": i}})
                })
                .collect();
            json!({"tool_calls": calls})
        })
        .chain([json!({"final": "soaked"})])
        .collect();
    let server = TestServer::start_with(&[("soak", json!({"rounds": rounds}))], |c| {
        c.runner.ping_interval_ms = 500;
        c.runner.liveness_timeout_ms = 2_000;
    })
    .await;
    let baseline = census(&server).await;
    let agent = server.agent("agent").await;
    let ledger = Ledger::new();
    let stop = Arc::new(AtomicBool::new(false));
    let surprises: Arc<Mutex<Vec<String>>> = Arc::default();
    let ordinals: Arc<Mutex<HashMap<ExecutionId, usize>>> = Arc::default();
    let mut minted = Vec::new();
    let mut proxies = Vec::new();
    for i in 0..SOAK_RUNNERS {
        let runner = server.runner(&format!("soak-{i}")).await;
        let proxy = Arc::new(TcpProxy::start(server.server.addr).await);
        let raw = ObservedRunner::connect_welcomed(&proxy.url(), &runner, &ledger, WAIT).await;
        let announced = raw.announce(&json!({"tools": [probe(SOAK_TIMEOUT_MS), poke(SOAK_TIMEOUT_MS)]})).await;
        assert!(announced.code().is_none(), "{tag} {announced:?}");
        minted.push(runner);
        proxies.push(proxy);
    }
    let ids: Vec<Uuid> = minted.iter().map(|m| m.id).collect();
    declare(&server, &agent, &ids, "scripted/soak").await;
    let mut runners = tokio::task::JoinSet::new();
    for (runner, proxy) in minted.iter().zip(&proxies) {
        let soak = SoakRunner {
            minted: runner.clone(),
            proxy: proxy.clone(),
            ledger: ledger.clone(),
            seed: sc.seed,
            ordinals: ordinals.clone(),
            journal: BTreeMap::new(),
            last_token: None,
            stop: stop.clone(),
            surprises: surprises.clone(),
            faults: BTreeMap::new(),
        };
        runners.spawn(soak.run());
    }
    // Random cuts of random runners' streams, on top of the runners' own faults.
    let cuts = Arc::new(AtomicUsize::new(0));
    let chaos = {
        let (stop, cuts, proxies) = (stop.clone(), cuts.clone(), proxies.clone());
        let mut rng = sc.rng_for("cuts");
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(rng.millis(100, 400)).await;
                if proxies[rng.index(proxies.len())].cut() > 0 {
                    cuts.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };

    let started = Instant::now();
    let caller = server.caller(&agent).await;
    let mut runs = Vec::new();
    let mut targets = BTreeMap::new();
    for ordinal in 0..SOAK_RUNS {
        let runner = ids[ordinal % SOAK_RUNNERS];
        let run = admit(&server, &caller, &format!("soak {ordinal}"), Some(RunnerId::from_uuid(runner))).await;
        ordinals.lock().expect("ordinals").insert(run, ordinal);
        targets.insert(run, runner);
        runs.push(run);
    }
    let rows = wait_runs_quiet(&tag, server.store(), &runs, Duration::from_secs(150)).await;
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    chaos.await.expect("chaos driver");
    let mut faults: BTreeMap<SoakFault, usize> = BTreeMap::new();
    while let Some(done) = runners.join_next().await {
        for (fault, n) in done.expect("a soak runner") {
            *faults.entry(fault).or_default() += n;
        }
    }
    drop(proxies);
    for row in &rows {
        assert_eq!(
            (row.status, row.final_text.as_deref()),
            (RunStatus::Completed, Some("soaked")),
            "{tag} {}",
            row.public_id
        );
    }
    let surprises = surprises.lock().expect("surprises").clone();
    assert!(surprises.is_empty(), "{tag} answers outside the spec's words:\n{}", surprises.join("\n"));
    let observations = ledger.snapshot();
    let idle_acks = observations.acks.iter().filter(|a| a.idle).count();
    let refusals = observations.refusals.clone();
    let (grants, acks) = (observations.grants.len(), observations.acks.len());
    let history =
        closing_checks(&sc, &server, CensusBound::after(baseline, SOAK_RUNNERS, 1), &runs, observations, targets).await;
    let statuses = status_counts(&history);
    // How each planned fault ended: (fault, status, claimed) -> tasks.
    let ordinal_of = ordinals.lock().expect("ordinals").clone();
    let mut outcomes: BTreeMap<(SoakFault, TaskStatus, bool), usize> = BTreeMap::new();
    for t in &history.tasks {
        let fault = soak_fault(sc.seed, ordinal_of[&t.run_public_id], &t.task_key.to_string());
        *outcomes.entry((fault, t.status, t.claimed)).or_default() += 1;
    }
    eprintln!("{tag} outcomes by planned fault (fault, status, claimed): {outcomes:?}");
    for t in &history.tasks {
        let fault = soak_fault(sc.seed, ordinal_of[&t.run_public_id], &t.task_key.to_string());
        // The inbox is level-triggered: an offer lost to a cut comes again after the reconnect,
        // so only a task its runner chose to ignore can end unclaimed.
        assert!(
            t.claimed || fault == SoakFault::Ignore,
            "{tag} {}/{} ({fault:?}) was never claimed: its offer was lost",
            t.run_public_id,
            t.task_key
        );
        // The expiry rule: unclaimed or replayable is timed_out, otherwise uncertain.
        if matches!(t.status, TaskStatus::TimedOut | TaskStatus::Uncertain) {
            let expected =
                if t.claimed && t.tool_name == "poke" { TaskStatus::Uncertain } else { TaskStatus::TimedOut };
            assert_eq!(
                t.status, expected,
                "{tag} {}/{} ({fault:?}, claimed {})",
                t.run_public_id, t.task_key, t.claimed
            );
        }
    }
    eprintln!(
        "{tag} {} tasks in {took:?}: statuses {statuses:?}; runner faults {faults:?}; {} proxy cuts; {grants} grants, {acks} acks ({idle_acks} idle); refusals {refusals:?}",
        history.tasks.len(),
        cuts.load(Ordering::SeqCst)
    );
    assert_eq!(history.tasks.len(), SOAK_RUNS * SOAK_ROUNDS * SOAK_CALLS, "{tag}");
    let ends = [TaskStatus::Completed, TaskStatus::TimedOut, TaskStatus::Uncertain];
    for status in statuses.keys() {
        assert!(ends.contains(status), "{tag} a task ended {status}");
    }
    // The faults really happened.
    for status in &ends {
        assert!(statuses.contains_key(status), "{tag} no task ended {status}: {statuses:?}");
    }
    assert!(idle_acks > 0 && cuts.load(Ordering::SeqCst) > 0, "{tag} no idle repeats or no cuts");
    for word in ["stale_claim", "already_claimed"] {
        assert!(refusals.contains_key(word), "{tag} no {word} seen: {refusals:?}");
    }
}

// ---- SIGKILL of nexus in the middle of each join (issue 14) ------------------------------------

/// The bound on one wait in the delegation scenario: three trees of four executions each on a
/// loaded 2-core machine.
const TREE_WAIT: Duration = Duration::from_secs(90);

/// One parent of the delegation scenario: its policy (or `gate`), execution and children.
struct Tree {
    name: &'static str,
    run: ExecutionId,
    /// The children's executions, by the key of the call that started each (`r1t0`..`r1t2`).
    children: Vec<ExecutionId>,
}

/// A `delegate_task` round starting three children of `name`, child `i` on model `fake/<name>-i`.
fn delegate_three(name: &str) -> nexus_tests::Act {
    nexus_tests::Act::ToolCalls(
        (0..3)
            .map(|i| {
                let input = json!({"prompt": format!("part {i} of {name}"), "model": format!("fake/{name}-{i}")});
                (format!("d{i}"), "delegate_task".to_owned(), input)
            })
            .collect(),
    )
}

fn one_call(id: &str, name: &str, input: Value) -> nexus_tests::Act {
    nexus_tests::Act::ToolCalls(vec![(id.to_owned(), name.to_owned(), input)])
}

/// A bash call that appends `line` to `<workdir>/<line>.log`: the record of every run of the tool.
fn append_line(workdir: &Path, line: &str) -> nexus_tests::Act {
    let file = workdir.join(format!("{line}.log"));
    one_call("b", "bash", json!({"command": format!("echo {line} >> {}; echo wrote {line}", file.display())}))
}

/// The lines of `<workdir>/<name>.log`.
fn lines_of(workdir: &Path, name: &str) -> Vec<String> {
    std::fs::read_to_string(workdir.join(format!("{name}.log")))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Answers the child `child`'s `ask` (its round-2 call) through the door.
async fn answer_ask(tag: &str, http: &nexus_tests::Http, child: ExecutionId) {
    let answered =
        http.post(&format!("/agent_api/v1/executions/{child}/tasks/r2t0/answer"), &json!({"answer": "yes"})).await;
    assert_eq!(answered.status, 200, "{tag} answering {child}: {answered:?}");
}

/// Waits until the execution `run` has ended, and returns its row.
async fn ended(tag: &str, store: &Store, run: ExecutionId) -> ExecutionRow {
    wait_until(&format!("{tag} {run} ends"), TREE_WAIT, || async {
        store.execution(run).await.ok().flatten().filter(|r| r.status.is_terminal())
    })
    .await
}

/// Waits until `nexus` logs that its recovery is done: every recovered execution is loaded and
/// every parent with a result nobody consumed has been told to look at its children again.
async fn recovered(tag: &str, nexus: &NexusProcess) {
    wait_until(&format!("{tag} recovery is done"), TREE_WAIT, || async {
        nexus.log().iter().any(|line| line.contains("recovery done")).then_some(())
    })
    .await;
}

/// What every tree stands at: each parent's and child's status with its tasks, and each child's
/// consumption and disposition; for a failing scenario's message.
async fn trees_now(store: &Store, trees: &[Tree]) -> String {
    let mut out = String::new();
    let tasks_of = |run: ExecutionId| async move {
        let tasks = store.tasks_of(run).await.unwrap_or_default();
        tasks.iter().map(|t| format!("{}:{}", t.task_key, t.status)).collect::<Vec<_>>().join(" ")
    };
    for tree in trees {
        let row = store.execution(tree.run).await.ok().flatten();
        let status = row.as_ref().map(|r| format!("{} {:?}", r.status, r.attention_reason));
        out.push_str(&format!("\n  {} {} {status:?} [{}]", tree.name, tree.run, tasks_of(tree.run).await));
        for child in store.children_of(tree.run).await.unwrap_or_default() {
            out.push_str(&format!(
                "\n    {} {} {} consumed_by={:?} disposition={:?} [{}]",
                child.task_key,
                child.child_execution_public_id,
                child.status,
                child.consumed_by,
                child.disposition,
                tasks_of(child.child_execution_public_id).await
            ));
        }
    }
    out
}

/// SIGKILLs `nexus` and starts it again on the same store and address; answers once its
/// recovery is done.
async fn kill_and_restart(tag: &str, nexus: NexusProcess, at: &StoreLocation, config: &Path) -> NexusProcess {
    let addr = nexus.addr;
    nexus.sigkill().await;
    let nexus = NexusProcess::serve(at, addr, config).await;
    recovered(tag, &nexus).await;
    nexus
}

/// Issue 14's acceptance: a SIGKILL of the real `nexus` in the middle of each join, then a
/// restart, and every join ends as it would have. Three parents delegate three children each and
/// join them, one per policy; each child calls bash on a real runner-agent (appending a line to
/// its own file) and then asks a person. A fourth parent (`gate`) delegates three children, then
/// calls a bash that waits for a gate file, and only then joins: its first child ends before the
/// join exists.
///
/// Kill 1 comes with every join waiting: `first_success`'s children all parked on their ask,
/// `all_required`'s and `best_effort`'s first child already ended with its result unconsumed,
/// and the gate parent's first child ended while the parent's bash waits (no join call yet).
/// After the restart the gate opens (its first child's result is read at the parent's next
/// boundary, as without a kill), `first_success`'s third child answers first (the selection; the
/// others are canceled; its parent ends), `all_required`'s second child answers; kill 2 comes with that join
/// holding two unconsumed results, `best_effort` still one short of its `min_successes: 2`, and
/// the gate's join waiting. After the second restart the rest answer. Then: each join's outcome,
/// every child consumed once by its join (the gate's first child by the parent's boundary), each
/// model asked exactly as scripted, each bash file holding one line, and the invariant checker
/// over the parents and all the children.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nexus_sigkill_in_the_middle_of_each_join() {
    use nexus_tests::Act;
    let sc = Scenario::begin("nexus_sigkill_in_the_middle_of_each_join").await;
    let tag = sc.tag();
    let dir = tempfile::tempdir().expect("dir");
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).expect("data dir");
    let database = match test_store_backend() {
        StoreBackend::Postgres => Some(TestDatabase::create().await),
        _ => None,
    };
    let at = StoreLocation { data_dir, database_url: database.as_ref().map(|d| d.url().to_owned()) };
    let fake = nexus_tests::FakeProvider::start().await;
    let config = dir.path().join("nexus.toml");
    std::fs::write(
        &config,
        format!(
            "[runner]\nping_interval_ms = 300\nliveness_timeout_ms = 1500\n\n[providers.fake]\nkind = \"openai_compatible\"\n\
             base_url = {:?}\nallow_any_model = true\n",
            fake.openai_base_url()
        ),
    )
    .expect("config");
    let workdir = tempfile::tempdir().expect("workdir");
    let work = workdir.path();
    let gate = work.join("gate.open");

    // The scripts: one model per parent and per child, so every answer is scripted in order.
    let policies: [(&'static str, Value); 3] =
        [("all_required", json!({})), ("first_success", json!({})), ("best_effort", json!({"min_successes": 2}))];
    for (policy, extra) in &policies {
        let mut join = json!({"tasks": ["r1t0", "r1t1", "r1t2"], "policy": policy});
        for (field, value) in extra.as_object().expect("object") {
            join[field] = value.clone();
        }
        fake.script(policy, [delegate_three(policy), one_call("j", "join", join), Act::EchoLastToolResult]);
        for i in 0..3 {
            let name = format!("{policy}-{i}");
            fake.script(
                &name,
                [
                    append_line(work, &name),
                    one_call("q", "ask", json!({"prompt": format!("go on with {name}?")})),
                    Act::Text(format!("{name} done")),
                ],
            );
        }
    }
    let wait_for_gate = format!(
        "echo gate >> {}; while [ ! -f {} ]; do sleep 0.1; done; echo the gate is open",
        work.join("gate.log").display(),
        gate.display()
    );
    fake.script(
        "gate",
        [
            delegate_three("gate"),
            one_call("g", "bash", json!({"command": wait_for_gate})),
            one_call("j", "join", json!({"tasks": ["r1t0", "r1t1", "r1t2"], "policy": "all_required"})),
            Act::EchoLastToolResult,
        ],
    );
    fake.script("gate-0", [append_line(work, "gate-0"), Act::Text("gate-0 done".into())]);
    for i in 1..3 {
        let name = format!("gate-{i}");
        fake.script(
            &name,
            [
                append_line(work, &name),
                one_call("q", "ask", json!({"prompt": format!("go on with {name}?")})),
                Act::Text(format!("{name} done")),
            ],
        );
    }

    let addr = free_loopback_addr();
    let nexus = NexusProcess::serve(&at, addr, &config).await;
    let agent = admin_agent(&at, "agent").await;
    let runner = admin_runner(&at, "worker").await;
    let state = tempfile::tempdir().expect("state");
    let spec = RunnerAgentProcess {
        nexus_url: format!("http://{addr}"),
        token_file: dir.path().join("runner.token"),
        runner: runner.clone(),
        workdir: work.to_owned(),
        state_dir: state.path().to_owned(),
        tool_timeout_ms: 120_000,
    };
    let mut runner_child = spec.spawn();
    let store_config =
        StoreConfig { database_url: at.database_url.clone(), max_connections: Some(2), ..StoreConfig::default() };
    let store = Store::connect_existing(&at.data_dir, &store_config).await.expect("open the store beside nexus");
    wait_until(&format!("{tag} the announcement"), TREE_WAIT, || async {
        store.executor(runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
    })
    .await;
    let http = nexus_tests::Http::new(&format!("http://{addr}"), Some(&agent.token));
    let mut trees = Vec::new();
    for name in ["all_required", "first_success", "best_effort", "gate"] {
        let declaration = json!({
            "approval_mode": "bypass", "default_model": format!("fake/{name}"),
            "runner_executor_public_ids": [runner.id],
            "kernel_tools": ["nexus.graph.delegate_task", "nexus.graph.join", "nexus.human.ask"],
        });
        let admitted = http
            .post(
                "/agent_api/v1/inputs",
                &json!({"text": format!("split the work ({name})"), "execution_declaration": declaration,
                        "runner_executor_public_id": runner.id}),
            )
            .await;
        assert_eq!(admitted.status, 201, "{tag} {name}: {admitted:?}");
        let run: ExecutionId =
            admitted.body["execution_public_id"].as_str().and_then(|s| s.parse().ok()).expect("execution id");
        trees.push(Tree { name, run, children: Vec::new() });
    }
    for tree in &mut trees {
        let children = wait_until(&format!("{tag} {} starts three children", tree.name), TREE_WAIT, || async {
            let mut children = store.children_of(tree.run).await.ok()?;
            children.sort_by_key(|c| c.task_key);
            (children.len() == 3).then_some(children)
        })
        .await;
        assert_eq!(
            children.iter().map(|c| c.task_key.to_string()).collect::<Vec<_>>(),
            ["r1t0", "r1t1", "r1t2"],
            "{tag} {}",
            tree.name
        );
        tree.children = children.iter().map(|c| c.child_execution_public_id).collect();
    }
    let [all_required, first_success, best_effort, gated] = &trees[..] else { unreachable!("four trees") };
    let parked = |run: ExecutionId| {
        let store = &store;
        let tag = &tag;
        async move {
            wait_task(tag, store, run, "r2t0", "awaits its answer", |t| t.status == TaskStatus::AwaitingInput).await;
        }
    };

    // Before kill 1: every join waits; two have a child that ended with its result unconsumed;
    // the gate parent's first child ended while no join exists yet.
    for tree in [all_required, first_success, best_effort] {
        wait_task(&tag, &store, tree.run, "r2t0", "(the join) waits", |t| t.status == TaskStatus::Running).await;
        for child in &tree.children {
            parked(*child).await;
        }
    }
    for tree in [all_required, best_effort] {
        answer_ask(&tag, &http, tree.children[0]).await;
        let row = ended(&tag, &store, tree.children[0]).await;
        assert_eq!(row.status, RunStatus::Completed, "{tag} {}: {row:?}", tree.name);
    }
    wait_task(&tag, &store, gated.run, "r2t0", "(the gate's bash) runs", |t| t.claimed).await;
    let first = ended(&tag, &store, gated.children[0]).await;
    assert_eq!(first.status, RunStatus::Completed, "{tag} gate-0: {first:?}");
    for child in &gated.children[1..] {
        parked(*child).await;
    }
    for tree in [all_required, best_effort, gated] {
        let row = store.child(tree.run, key("r1t0")).await.expect("store").expect("child");
        assert_eq!(row.consumed_by, None, "{tag} {}: the ended child's result waits for its consumer", tree.name);
    }
    assert!(
        store.task(gated.run, key("r3t0")).await.expect("store").is_none(),
        "{tag} the gate's join is not called yet"
    );
    eprintln!("{tag} SIGKILL 1: every join waits; the gate parent's first child ended before its join");
    let nexus = kill_and_restart(&tag, nexus, &at, &config).await;

    // Between the kills: the gate opens; first_success's third child answers first;
    // all_required's second child answers.
    std::fs::write(&gate, "open").expect("the gate");
    answer_ask(&tag, &http, first_success.children[2]).await;
    answer_ask(&tag, &http, all_required.children[1]).await;
    wait_task(&tag, &store, first_success.run, "r2t0", "(the join) settles", TaskRow::is_settled).await;
    // Its parent's next model call and its losers' cancellations land before kill 2: a model call
    // lost to a kill is asked again, and this scenario kills only while joins wait.
    for child in &first_success.children {
        ended(&tag, &store, *child).await;
    }
    ended(&tag, &store, first_success.run).await;
    let second = ended(&tag, &store, all_required.children[1]).await;
    assert_eq!(second.status, RunStatus::Completed, "{tag} all_required-1: {second:?}");
    wait_task(&tag, &store, gated.run, "r3t0", "(the join) waits", |t| t.status == TaskStatus::Running).await;
    let read = store.child(gated.run, key("r1t0")).await.expect("store").expect("child");
    assert_eq!(
        read.consumed_by,
        Some(format!("execution:{}", gated.run)),
        "{tag} the gate's first result is read at the parent's boundary, as without a kill"
    );
    for at_key in ["r1t0", "r1t1"] {
        let row = store.child(all_required.run, key(at_key)).await.expect("store").expect("child");
        assert_eq!(row.consumed_by, None, "{tag} all_required {at_key} waits for its join");
    }
    assert!(
        !store.task(all_required.run, key("r2t0")).await.expect("store").expect("join").is_settled(),
        "{tag} all_required still waits for its third child"
    );
    eprintln!("{tag} SIGKILL 2: all_required holds two results, best_effort one, the gate's join waits");
    let nexus = kill_and_restart(&tag, nexus, &at, &config).await;

    // After kill 2: the rest answer.
    answer_ask(&tag, &http, all_required.children[2]).await;
    answer_ask(&tag, &http, best_effort.children[2]).await;
    for child in &gated.children[1..] {
        answer_ask(&tag, &http, *child).await;
    }
    let parents: Vec<ExecutionId> = trees.iter().map(|t| t.run).collect();
    let deadline = Instant::now() + TREE_WAIT;
    let rows = loop {
        let mut rows = Vec::new();
        for run in &parents {
            rows.push(store.execution(*run).await.expect("store").expect("execution row"));
        }
        if rows.iter().all(|r| r.status.is_quiescent()) {
            break rows;
        }
        if Instant::now() >= deadline {
            let log: Vec<String> =
                nexus.log().into_iter().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
            panic!(
                "{tag} a parent is still live after {TREE_WAIT:?}:{}\nlog:\n{}",
                trees_now(&store, &trees).await,
                log.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let now = trees_now(&store, &trees).await;
    for (tree, row) in trees.iter().zip(&rows) {
        assert_eq!(row.status, RunStatus::Completed, "{tag} {}: {row:?}{now}", tree.name);
        assert!(row.final_text.as_deref().is_some_and(|t| t.starts_with("tool said:")), "{tag} {}: {row:?}", tree.name);
    }
    let mut everyone = parents.clone();
    for tree in &trees {
        for child in &tree.children {
            ended(&tag, &store, *child).await;
            everyone.push(*child);
        }
    }

    // Each join ended as it would have.
    let join_of = |tree: &Tree| if tree.name == "gate" { "r3t0" } else { "r2t0" };
    for tree in &trees {
        let join = task(&store, tree.run, join_of(tree)).await;
        assert_eq!(join.status, TaskStatus::Completed, "{tag} {}: {join:?}", tree.name);
        let result = join.result.clone().unwrap_or_default()["structured_content"].clone();
        let statuses: Vec<&str> =
            result["tasks"].as_array().into_iter().flatten().filter_map(|t| t["status"].as_str()).collect();
        let expected: [&str; 3] = match tree.name {
            "first_success" => ["canceled", "canceled", "completed"],
            "best_effort" => ["completed", "canceled", "completed"],
            _ => ["completed", "completed", "completed"],
        };
        assert_eq!(statuses, expected, "{tag} {}: {result}", tree.name);
        if tree.name == "first_success" {
            assert_eq!(result["selection"], "r1t2", "{tag} the first to answer is the selection: {result}");
        }
        for (i, entry) in result["tasks"].as_array().expect("tasks").iter().enumerate() {
            if expected[i] == "completed" {
                assert_eq!(entry["result"], format!("{}-{i} done", tree.name), "{tag} {}: {result}", tree.name);
            }
        }
    }

    // Every child's result was consumed once, by its join (the gate's first by the boundary),
    // and the losers were canceled and recorded; the children door says the same.
    for tree in &trees {
        let mut children = store.children_of(tree.run).await.expect("children");
        children.sort_by_key(|c| c.task_key);
        let listed = http.get(&format!("/agent_api/v1/executions/{}/children", tree.run)).await;
        assert_eq!(listed.status, 200, "{tag} {listed:?}");
        for (i, child) in children.iter().enumerate() {
            let consumer = if tree.name == "gate" && i == 0 {
                format!("execution:{}", tree.run)
            } else {
                format!("task:{}", join_of(tree))
            };
            assert_eq!(child.consumed_by.as_ref(), Some(&consumer), "{tag} {} child {i}: {child:?}", tree.name);
            let loser = matches!((tree.name, i), ("first_success", 0 | 1) | ("best_effort", 1));
            let (status, disposition) = if loser {
                (RunStatus::Canceled, Some(nexus_proto::ChildDisposition::Canceled))
            } else {
                (RunStatus::Completed, None)
            };
            assert_eq!((child.status, child.disposition), (status, disposition), "{tag} {} child {i}{now}", tree.name);
            let door = listed.body["children"]
                .as_array()
                .and_then(|all| all.iter().find(|c| c["task_key"] == child.task_key.to_string()))
                .cloned()
                .unwrap_or_else(|| panic!("{tag} the door lists {}", child.task_key));
            assert_eq!(door["consumed_by"], json!(consumer), "{tag} {door}");
            assert_eq!(door["disposition"], json!(disposition.map(|d| d.as_str())), "{tag} {door}");
        }
    }
    // The gate parent read its first child's result once, as a task_result message.
    let last = fake.requests_for("gate").pop().expect("the gate's requests");
    let envelopes = last.body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["role"] == "user" && m["content"].as_str().is_some_and(|t| t.contains("<task_result task=\"r1t0\""))
        })
        .count();
    assert_eq!(envelopes, 1, "{tag} {}", last.body);

    // No model was asked more than scripted, and no tool ran twice.
    for tree in &trees {
        let parent = if tree.name == "gate" { 4 } else { 3 };
        assert_eq!(fake.count(tree.name), parent, "{tag} {}", tree.name);
        for i in 0..3 {
            let name = format!("{}-{i}", tree.name);
            let loser = matches!((tree.name, i), ("first_success", 0 | 1) | ("best_effort", 1));
            let asked = match (tree.name, i) {
                ("gate", 0) => 2,
                _ if loser => 2,
                _ => 3,
            };
            assert_eq!(fake.count(&name), asked, "{tag} {name}");
            assert_eq!(lines_of(work, &name), std::slice::from_ref(&name), "{tag} {name}'s bash ran once");
        }
    }
    assert_eq!(lines_of(work, "gate"), ["gate"], "{tag} the gate's bash ran once");
    wait_until(&format!("{tag} the journal to empty"), TREE_WAIT, || async {
        (unacknowledged(state.path(), runner.id) == 0).then_some(())
    })
    .await;
    let exit = nexus.sigterm(Duration::from_secs(20)).await;
    assert!(exit.success(), "{tag} nexus exited {exit} after SIGTERM");
    sigkill(&mut runner_child).await;

    let mut history = invariants::collect(&store, &everyone, Observations::default()).await;
    history.targets = everyone.iter().map(|run| (*run, runner.id)).collect();
    history.deadline_slack_ms = DEFAULT_DEADLINE_SLACK_MS + 5_000;
    assert_holds(&tag, &check(&history));
    eprintln!("{tag} statuses {:?}", status_counts(&history));
    store.close().await;
}
