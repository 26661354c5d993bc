//! Several nodes on one PostgreSQL (`docs/cluster.md`): three `nexus serve` processes on one
//! database, two real runner-agents given every node's URL, each list starting at a standby (its
//! stream is forwarded to the node that serves), executions admitted on all three nodes in turn. Each scenario breaks the serving node one way: SIGKILL in
//! mid-round, SIGSTOP past its lease then SIGCONT, its database connection black-holed through
//! a TCP proxy, and a rolling SIGTERM restart of all three. Afterwards every execution has
//! completed, each tool ran once (the side-effect log), the runners' journals are empty, and the
//! invariant checker holds over the store every node wrote.
//!
//! On SQLite there is one node per store (the data dir's lock; the integration suite shows the
//! refusal), so these scenarios run with `NEXUS_TEST_STORE=postgres` only.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::*;

/// The serve lease's term in these scenarios: short, so fail-over is quick.
const LEASE_MS: u64 = 2_000;
/// Executions admitted before the fault, and again after it on the node that then serves.
const EXECUTIONS_BEFORE: usize = 4;
const EXECUTIONS_AFTER: usize = 2;
/// The scripted turn: rounds of calls, each call a bash line in the side-effect log.
const ROUNDS: usize = 4;
const CALLS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// SIGKILL of the serving node once a call of round 2 is claimed.
    Sigkill,
    /// SIGSTOP of the serving node for longer than its lease, then SIGCONT.
    Sigstop,
    /// Every byte between the serving node and the database dropped, both ways.
    DatabaseBlackHole,
    /// SIGTERM of each node in turn, each restarted as a standby before the next.
    RollingSigterm,
}

/// One node: its process (while it runs), its store location and address.
struct Node {
    process: Option<NexusProcess>,
    at: StoreLocation,
    addr: SocketAddr,
}

struct Cluster {
    tag: String,
    dir: tempfile::TempDir,
    config: PathBuf,
    nodes: Vec<Node>,
    /// A reader beside the nodes, on the database directly.
    store: Store,
    agent: Minted,
    runners: Vec<(Minted, tempfile::TempDir, tempfile::TempDir, Child)>,
    runs: Vec<(ExecutionId, usize)>,
    /// The proxy between the first node and the database (the black-hole scenario only).
    proxy: Option<TcpProxy>,
    _database: TestDatabase,
}

impl Cluster {
    async fn start(sc: &Scenario, fault: Fault) -> Cluster {
        let tag = sc.tag();
        let database = TestDatabase::create().await;
        let url = database.url().to_owned();
        let dir = tempfile::tempdir().expect("dir");
        let script = dir.path().join("cluster.json");
        std::fs::write(&script, bash_script(ROUNDS, CALLS, "0.3").to_string()).expect("script");
        let config = dir.path().join("nexus.toml");
        std::fs::write(
            &config,
            format!(
                "[cluster]\nlease_ms = {LEASE_MS}\n\n[runner]\nping_interval_ms = 300\nliveness_timeout_ms = 1500\n\n\
                 [providers.scripted]\nkind = \"scripted\"\n\n[providers.scripted.models.cluster]\nscript = {:?}\n",
                script.display().to_string()
            ),
        )
        .expect("config");
        // The first node reaches the database through a proxy when the scenario cuts it off.
        let proxy = if fault == Fault::DatabaseBlackHole {
            let target: SocketAddr = "127.0.0.1:5432".parse().expect("addr");
            assert!(url.contains("127.0.0.1:5432"), "{tag} the test database is not on 127.0.0.1:5432: {url}");
            Some(TcpProxy::start(target).await)
        } else {
            None
        };
        let mut nodes = Vec::new();
        for index in 0..3 {
            let data_dir = dir.path().join(format!("node{index}"));
            std::fs::create_dir(&data_dir).expect("data dir");
            let database_url = match (&proxy, index) {
                (Some(proxy), 0) => url.replace("127.0.0.1:5432", &proxy.addr.to_string()),
                _ => url.clone(),
            };
            let at = StoreLocation { data_dir, database_url: Some(database_url) };
            let addr = free_loopback_addr();
            let process = if index == 0 {
                NexusProcess::serve(&at, addr, &config).await
            } else {
                NexusProcess::standby(&at, addr, &config).await
            };
            nodes.push(Node { process: Some(process), at, addr });
        }
        let direct = StoreLocation { data_dir: nodes[1].at.data_dir.clone(), database_url: Some(url.clone()) };
        let agent = admin_agent(&direct, "agent").await;
        let store_config =
            StoreConfig { database_url: Some(url.clone()), max_connections: Some(2), ..StoreConfig::default() };
        let store = Store::connect_existing(&nodes[1].at.data_dir, &store_config).await.expect("open the store");
        let mut cluster = Cluster {
            tag,
            dir,
            config,
            nodes,
            store,
            agent,
            runners: Vec::new(),
            runs: Vec::new(),
            proxy,
            _database: database,
        };
        let mut urls: Vec<String> = cluster.nodes.iter().map(|node| format!("http://{}", node.addr)).collect();
        for index in 0..2 {
            // Runner 0 starts at node 1, runner 1 at node 2: both first reach a standby.
            urls.rotate_left(1);
            let runner = admin_runner(&direct, &format!("worker{index}")).await;
            let (workdir, state) = (tempfile::tempdir().expect("workdir"), tempfile::tempdir().expect("state"));
            let spec = RunnerAgentProcess {
                nexus_url: urls.join(","),
                token_file: cluster.dir.path().join(format!("runner{index}.token")),
                runner: runner.clone(),
                workdir: workdir.path().to_owned(),
                state_dir: state.path().to_owned(),
                tool_timeout_ms: 20_000,
            };
            // Above the lease, as docs/cluster.md asks: a runner never leaves a node that still
            // holds its lease.
            let (child, _log) = spec.spawn_logged(&["--liveness-timeout-ms", "2500", "--connect-timeout-ms", "2000"]);
            wait_until(&format!("{} runner {index} announces", cluster.tag), WAIT, || async {
                cluster.store.executor(runner.runner()).await.ok().flatten().and_then(|r| r.announced_at)
            })
            .await;
            cluster.runners.push((runner, workdir, state, child));
        }
        let ids: Vec<String> = cluster.runners.iter().map(|(runner, ..)| runner.id.to_string()).collect();
        let body = json!({"configuration": {
            "runner_executor_public_ids": ids, "approval_mode": "bypass", "default_model": "scripted/cluster",
        }});
        let mut client = agent_client(&cluster.serving_url().await).await;
        client
            .declare_profile(authed(DeclareProfileRequest { body_json: body.to_string() }, &cluster.agent))
            .await
            .expect("declare");
        cluster
    }

    /// The index of the node that holds the serve lease now, by its pid in `cluster_nodes`.
    async fn holder(&self) -> Option<usize> {
        let (lease, nodes) = self.store.cluster().await.ok()?;
        let holder = lease?.holder?;
        let row = nodes.into_iter().find(|node| node.node_id == holder)?;
        self.nodes.iter().position(|node| {
            node.process.as_ref().and_then(NexusProcess::pid).is_some_and(|pid| i64::from(pid) == row.pid)
        })
    }

    async fn generation(&self) -> i64 {
        let (lease, _) = self.store.cluster().await.expect("cluster");
        lease.expect("a lease row").generation
    }

    /// Waits until a node other than `not` holds the lease at a generation past `after`, and
    /// its doors answer; returns its index.
    async fn wait_for_holder(&self, not: Option<usize>, after: i64, limit: Duration) -> usize {
        let index = wait_until(&format!("{} another node to take the lease", self.tag), limit, || async {
            let generation = self.generation().await;
            self.holder().await.filter(|index| Some(*index) != not && generation > after)
        })
        .await;
        let node = self.nodes[index].process.as_ref().expect("the holder runs");
        node.wait_for_log("the take-over", WAIT, |line| line.contains("nexus serving")).await;
        index
    }

    async fn serving_url(&self) -> String {
        let index = wait_until(&format!("{} a node to serve", self.tag), WAIT, || async { self.holder().await }).await;
        self.nodes[index].process.as_ref().expect("the holder runs").url()
    }

    /// Admits `count` executions, alternating the runners and the live nodes: a standby passes
    /// its admission on to the node that serves. A node that has not yet read who serves (just
    /// restarted, or a take-over under way) refuses with `unavailable` before anything is
    /// admitted, and the admission is sent again after the second its refusal asks for.
    async fn admit(&mut self, count: usize) {
        self.serving_url().await;
        for _ in 0..count {
            let live: Vec<String> =
                self.nodes.iter().filter_map(|node| node.process.as_ref()).map(NexusProcess::url).collect();
            let url = &live[self.runs.len() % live.len()];
            let runner = self.runs.len() % self.runners.len();
            let request = CreateInputRequest {
                text: format!("cluster turn {}", self.runs.len()),
                runner_executor_public_id: self.runners[runner].0.id.to_string(),
                ..CreateInputRequest::default()
            };
            let deadline = Instant::now() + WAIT;
            let answer = loop {
                let mut client = agent_client(url).await;
                match client.create_input(authed(request.clone(), &self.agent)).await {
                    Ok(answer) => break answer.into_inner(),
                    Err(status) if status.code() == tonic::Code::Unavailable && Instant::now() < deadline => {
                        eprintln!("{} admission on {url} refused for now: {}", self.tag, status.message());
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(status) => panic!("{} create input on {url}: {status:?}", self.tag),
                }
            };
            self.runs.push((answer.execution_public_id.parse().expect("uuid"), runner));
        }
    }

    /// Waits until a call of `round` of the first execution is claimed (its tool running).
    async fn mid_round(&self, round: i64) {
        let run = self.runs[0].0;
        let deadline = Instant::now() + WAIT;
        while kill_point_reached(&self.store, run, KillPoint::FirstClaim(round)).await.is_none() {
            assert!(Instant::now() < deadline, "{} round {round} never started", self.tag);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts node `index` again on its data dir and address, as a standby.
    async fn restart_as_standby(&mut self, index: usize) {
        let node = &self.nodes[index];
        let process = NexusProcess::standby(&node.at, node.addr, &self.config).await;
        self.nodes[index].process = Some(process);
    }

    fn pid(&self, index: usize) -> u32 {
        self.nodes[index].process.as_ref().and_then(NexusProcess::pid).expect("a live node")
    }

    /// Every execution completes; each tool ran once; the journals empty; the invariants hold
    /// over the store. `outage` widens the deadline slack by the time no node served.
    async fn closing_checks(mut self, outage: Duration) {
        let tag = self.tag.clone();
        let runs: Vec<ExecutionId> = self.runs.iter().map(|(run, _)| *run).collect();
        let rows = wait_runs_quiet(&tag, &self.store, &runs, Duration::from_secs(120)).await;
        for row in &rows {
            assert_eq!(row.status, RunStatus::Completed, "{tag} {}", row.public_id);
            assert_eq!(row.final_text.as_deref(), Some("all rounds done"), "{tag} {}", row.public_id);
        }
        for (runner, _, state, _) in &self.runners {
            wait_until(&format!("{tag} runner {} to empty its journal", runner.id), WAIT, || async {
                (unacknowledged(state.path(), runner.id) == 0).then_some(())
            })
            .await;
        }
        let mut targets = BTreeMap::new();
        let mut by_runner: Vec<Vec<TaskRow>> = vec![Vec::new(); self.runners.len()];
        for (run, runner) in &self.runs {
            let tasks = self.store.tasks_of(*run).await.expect("tasks");
            assert_eq!(tasks.len(), ROUNDS * CALLS, "{tag} {run}");
            targets.insert(*run, self.runners[*runner].0.id);
            by_runner[*runner].extend(tasks);
        }
        for ((_, workdir, ..), tasks) in self.runners.iter().zip(&by_runner) {
            assert_side_effects_of(&tag, tasks, workdir.path());
        }
        let mut history = invariants::collect(&self.store, &runs, Observations::default()).await;
        history.targets = targets;
        history.deadline_slack_ms = DEFAULT_DEADLINE_SLACK_MS + i64::try_from(outage.as_millis()).unwrap_or(i64::MAX);
        assert_holds(&tag, &check(&history));
        eprintln!("{tag} statuses {:?}", status_counts(&history));
        for (_, _, _, child) in &mut self.runners {
            sigkill(child).await;
        }
        for node in &mut self.nodes {
            if let Some(process) = node.process.take() {
                let exit = process.sigterm(Duration::from_secs(30)).await;
                assert!(exit.success(), "{tag} a node exited {exit} after SIGTERM");
            }
        }
        self.store.close().await;
    }
}

/// A runner's side-effect log holds one line per tool run of its executions' calls; the call ids
/// repeat across executions (one script), so for each id the lines must number exactly the
/// completed tasks of that id: a tool run twice, or a completed call whose tool never ran, breaks
/// the count. Every completed task stored its own call's output.
fn assert_side_effects_of(tag: &str, tasks: &[TaskRow], workdir: &Path) {
    let runs = side_effects(workdir);
    let mut completed: HashMap<String, usize> = HashMap::new();
    for task in tasks.iter().filter(|t| t.status == TaskStatus::Completed) {
        *completed.entry(task.tool_call_id.clone()).or_default() += 1;
        let content = task.result.as_ref().and_then(|r| r["content"].as_str()).unwrap_or_default();
        assert!(content.contains(&task.tool_call_id), "{tag} {} stored another call's output", task.task_key);
    }
    for id in runs.keys().chain(completed.keys()) {
        let (ran, done) = (runs.get(id).copied().unwrap_or(0), completed.get(id).copied().unwrap_or(0));
        assert_eq!(ran, done, "{tag} call {id}: its tool ran {ran} times for {done} completed tasks");
    }
}

/// Signals a process (`kill -STOP`, `kill -CONT`).
async fn signal(pid: u32, name: &str) {
    let sent =
        tokio::process::Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status().await.expect("kill");
    assert!(sent.success(), "kill -{name} {pid} failed");
}

async fn scenario(name: &'static str, fault: Fault) {
    if test_store_backend() != StoreBackend::Postgres {
        eprintln!("{name}: several nodes share a PostgreSQL store only; run with NEXUS_TEST_STORE=postgres");
        return;
    }
    let sc = Scenario::begin(name).await;
    let tag = sc.tag();
    let mut cluster = Cluster::start(&sc, fault).await;
    cluster.admit(EXECUTIONS_BEFORE).await;
    cluster.mid_round(2).await;
    let term = Duration::from_millis(LEASE_MS);
    let first = cluster.holder().await.expect("a holder");
    let generation = cluster.generation().await;
    let mut outage = Duration::ZERO;
    match fault {
        Fault::Sigkill => {
            let killed = Instant::now();
            cluster.nodes[first].process.take().expect("running").sigkill().await;
            let next = cluster.wait_for_holder(Some(first), generation, WAIT).await;
            outage = killed.elapsed();
            eprintln!("{tag} fail-over after SIGKILL took {outage:?} (node {first} -> node {next})");
            assert!(outage < 2 * term + DETECTION_SLACK, "{tag} fail-over took {outage:?}, over two terms");
        }
        Fault::Sigstop => {
            let pid = cluster.pid(first);
            signal(pid, "STOP").await;
            let stopped = Instant::now();
            let next = cluster.wait_for_holder(Some(first), generation, WAIT).await;
            let took = stopped.elapsed();
            eprintln!("{tag} fail-over after SIGSTOP took {took:?} (node {first} -> node {next})");
            assert!(took < 2 * term + DETECTION_SLACK, "{tag} fail-over took {took:?}, over two terms");
            // Frozen past its lease, then woken: it finds the lease taken, commits nothing and stops.
            tokio::time::sleep_until(stopped + term + term / 2).await;
            signal(pid, "CONT").await;
            let process = cluster.nodes[first].process.take().expect("running");
            let exit = process.exits_within(WAIT).await;
            assert!(!exit.success(), "{tag} the stale node exited {exit}: it should stop as fenced");
            outage = stopped.elapsed();
        }
        Fault::DatabaseBlackHole => {
            assert_eq!(first, 0, "{tag} the node behind the proxy serves first");
            cluster.proxy.as_ref().expect("proxy").black_hole(Direction::Both);
            let cut = Instant::now();
            let process = cluster.nodes[first].process.take().expect("running");
            // It stops driving (and exits) once it has gone a whole term without renewing: at
            // most a term after its last renewal, itself at most a quarter term before the cut.
            let exit = process.exits_within(2 * term + DETECTION_SLACK).await;
            let stopped = cut.elapsed();
            assert!(!exit.success(), "{tag} the cut-off node exited {exit}");
            eprintln!("{tag} the cut-off node stopped after {stopped:?}");
            let next = cluster.wait_for_holder(Some(first), generation, WAIT).await;
            outage = cut.elapsed();
            eprintln!("{tag} node {next} took over {outage:?} after the cut");
            assert!(outage < 2 * term + DETECTION_SLACK, "{tag} fail-over took {outage:?}, over two terms");
        }
        Fault::RollingSigterm => {
            let mut generation = generation;
            let mut holder = first;
            for step in 0..3 {
                let asked = Instant::now();
                signal(cluster.pid(holder), "TERM").await;
                let next = cluster.wait_for_holder(Some(holder), generation, WAIT).await;
                let took = asked.elapsed();
                eprintln!("{tag} hand-over {step}: node {holder} -> node {next} in {took:?}");
                // A node that gives its lease up is followed at the next poll, well within a term;
                // its doors' drain comes after.
                assert!(took < term + DETECTION_SLACK, "{tag} the hand-over took {took:?}");
                // The new holder says from whom it took the lease, and that it was given up.
                let taker = cluster.nodes[next].process.as_ref().expect("the holder runs");
                taker
                    .wait_for_log("the hand-over's origin", WAIT, |line| line.contains("from a node that gave it up"))
                    .await;
                outage = outage.max(took);
                let process = cluster.nodes[holder].process.take().expect("running");
                let exit = process.exits_within(Duration::from_secs(30)).await;
                assert!(exit.success(), "{tag} node {holder} exited {exit} after SIGTERM");
                cluster.restart_as_standby(holder).await;
                generation = cluster.generation().await;
                holder = next;
                cluster.admit(1).await;
            }
        }
    }
    cluster.admit(EXECUTIONS_AFTER).await;
    cluster.closing_checks(outage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_sigkill_of_the_serving_node_mid_round() {
    scenario("cluster_sigkill_of_the_serving_node_mid_round", Fault::Sigkill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_sigstop_of_the_serving_node_past_its_lease() {
    scenario("cluster_sigstop_of_the_serving_node_past_its_lease", Fault::Sigstop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_serving_node_cut_off_from_the_database() {
    scenario("cluster_serving_node_cut_off_from_the_database", Fault::DatabaseBlackHole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_rolling_sigterm_restart_of_every_node() {
    scenario("cluster_rolling_sigterm_restart_of_every_node", Fault::RollingSigterm).await;
}
