//! The in-process server and credential helpers.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use sqlx::{Connection, Executor, PgConnection};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use uuid::Uuid;

use nexus_actors::cli::admin::{MemberKind, RunnerAssignment, create_member, create_runner};
use nexus_actors::clock::Clock;
use nexus_actors::config::ServerConfig;
use nexus_actors::doors::api::{Caller, CreateInput};
use nexus_actors::model::{ModelRegistry, Script};
use nexus_actors::store::{ExecutionRow, Store, StoreBackend, TaskRow, TranscriptWrite};
use nexus_actors::{RunningServer, start_with_models};
use nexus_proto::{ExecutionId, MemberId, RunnerId, TaskKey, TaskStatus};

/// A credential minted for a test: the subject's id and its bearer token.
#[derive(Clone, Debug)]
pub struct Minted {
    /// The member's or runner's UUID.
    pub id: Uuid,
    /// The bearer token.
    pub token: String,
}

impl Minted {
    /// The id as a runner's.
    pub fn runner(&self) -> RunnerId {
        RunnerId::from_uuid(self.id)
    }

    /// The id as a member's.
    pub fn member(&self) -> MemberId {
        MemberId::from_uuid(self.id)
    }
}

/// A task key written as text in a test.
///
/// # Panics
/// When `key` is in none of the task-key grammars.
pub fn key(key: &str) -> TaskKey {
    key.parse().unwrap_or_else(|e| panic!("{e}"))
}

/// nexus running in this process on 127.0.0.1:0 with its own temporary data dir, and its own
/// PostgreSQL database when the suite runs on PostgreSQL (see [`test_store_backend`]).
#[derive(Debug)]
pub struct TestServer {
    /// The running server.
    pub server: RunningServer,
    /// Keeps the data dir alive for the test's duration.
    pub data_dir: TempDir,
    /// The server's PostgreSQL database, dropped after the server (fields drop in order);
    /// `None` on SQLite.
    pub database: Option<TestDatabase>,
}

/// The backend the integration suites run on: `NEXUS_TEST_STORE=postgres` selects PostgreSQL,
/// a fresh database per [`TestServer`] on the server that `NEXUS_TEST_POSTGRES_URL` names
/// (default [`DEFAULT_TEST_POSTGRES_URL`]); unset, or `sqlite`, is the embedded SQLite store in
/// the server's temporary data dir.
///
/// # Panics
/// On any other value, so that a typo never runs the suite on the wrong backend silently.
pub fn test_store_backend() -> StoreBackend {
    match std::env::var("NEXUS_TEST_STORE").as_deref() {
        Err(_) | Ok("" | "sqlite") => StoreBackend::Sqlite,
        Ok("postgres" | "postgresql") => StoreBackend::Postgres,
        Ok(other) => panic!("NEXUS_TEST_STORE={other}: expected sqlite or postgres"),
    }
}

/// The PostgreSQL server the suites use unless `NEXUS_TEST_POSTGRES_URL` names another; the
/// role must be allowed to create databases.
pub const DEFAULT_TEST_POSTGRES_URL: &str = "postgres://root@127.0.0.1:5432/postgres";

/// A PostgreSQL database made for one test, `nexus_test_<uuid>`, dropped (connections and all)
/// when this value drops.
#[derive(Debug)]
pub struct TestDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl TestDatabase {
    /// Creates a fresh, empty database on the test PostgreSQL server.
    ///
    /// # Panics
    /// When the server cannot be reached or refuses; the message names the URL and the variable
    /// that changes it.
    pub async fn create() -> TestDatabase {
        let admin_url =
            std::env::var("NEXUS_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_TEST_POSTGRES_URL.to_owned());
        let name = format!("nexus_test_{}", Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(&admin_url).await.unwrap_or_else(|e| {
            panic!("NEXUS_TEST_STORE=postgres: cannot connect to {admin_url} (set NEXUS_TEST_POSTGRES_URL): {e}")
        });
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .await
            .unwrap_or_else(|e| panic!("cannot create the test database {name} on {admin_url}: {e}"));
        let _ = admin.close().await;
        let url = with_database(&admin_url, &name);
        TestDatabase { admin_url, name, url }
    }

    /// The database's URL, for `store.database_url`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop runs inside the test's runtime, which cannot be blocked on: a short-lived thread
        // with its own runtime does the work. FORCE ends the sessions a server left open.
        let admin_url = self.admin_url.clone();
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let mut admin = PgConnection::connect(&admin_url).await?;
                admin.execute(sqlx::AssertSqlSafe(sql)).await?;
                admin.close().await?;
                Ok::<_, anyhow::Error>(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop the test database {}; drop it by hand", self.name);
        }
    }
}

/// `url` with its database (the path) replaced by `database`; the query is kept.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(base, query)| (base, Some(query)));
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let authority_end = base[authority_start..].find('/').map_or(base.len(), |i| authority_start + i);
    let mut out = format!("{}/{database}", &base[..authority_end]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// Installs a quiet tracing subscriber once (set `RUST_LOG` to choose what is logged). By default
/// it keeps warnings, and runner-agent's own account of its stream (connects, claims, commits) at
/// info, which a failing test prints beside its panic.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,nexus_runner_agent::agent=info".into()),
        )
        .with_test_writer()
        .try_init();
}

impl TestServer {
    /// Starts a server whose `scripted/<name>` models follow the given scripts.
    pub async fn start(scripts: &[(&str, Value)]) -> TestServer {
        Self::start_with(scripts, |_| {}).await
    }

    /// Starts a server after `adjust` edits its configuration. On PostgreSQL
    /// ([`test_store_backend`]) the configuration already names the server's fresh database.
    pub async fn start_with(scripts: &[(&str, Value)], adjust: impl FnOnce(&mut ServerConfig)) -> TestServer {
        Self::start_with_env(scripts, |_| None, adjust).await
    }

    /// As [`TestServer::start_with`], with `env` standing for the process environment when the
    /// providers' `api_key_env` variables are read (the tests never read or set the real one).
    pub async fn start_with_env(
        scripts: &[(&str, Value)],
        env: impl Fn(&str) -> Option<String>,
        adjust: impl FnOnce(&mut ServerConfig),
    ) -> TestServer {
        init_tracing();
        let data_dir = tempfile::tempdir().expect("temp dir");
        let mut config = ServerConfig { data_dir: data_dir.path().to_owned(), ..ServerConfig::default() };
        let database = match test_store_backend() {
            StoreBackend::Postgres => Some(TestDatabase::create().await),
            _ => None,
        };
        config.store.database_url = database.as_ref().map(|d| d.url().to_owned());
        // Tests poll the doors freely; the budget tests set their own.
        config.doors.requests_per_minute = 1_000_000;
        config.doors.burst = 100_000;
        adjust(&mut config);
        let models = scripted_models(&config, scripts, env);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let server = start_with_models(listener, config, Some(models), Clock::system()).await.expect("server starts");
        TestServer { server, data_dir, database }
    }

    /// A server whose `fake/<model>` models are answered by `fake` (its OpenAI-compatible
    /// wire, any model name), with no scripted models.
    pub async fn start_with_fake(fake: &crate::FakeProvider) -> TestServer {
        let url = fake.openai_base_url();
        TestServer::start_with(&[], move |config| {
            config.providers.providers.insert(
                "fake".into(),
                nexus_actors::model::ProviderConfig {
                    base_url: Some(url),
                    allow_any_model: true,
                    ..nexus_actors::model::ProviderConfig::new(nexus_actors::model::ProviderKind::OpenAiCompatible)
                },
            );
        })
        .await
    }

    /// Stops this server cleanly and starts another on the same store and configuration, its
    /// `scripted/<name>` models following `scripts` again.
    pub async fn restart(self, scripts: &[(&str, Value)]) -> TestServer {
        self.restart_with_env(scripts, |_| None).await
    }

    /// As [`TestServer::restart`], with `env` standing for the process environment (see
    /// [`TestServer::start_with_env`]).
    pub async fn restart_with_env(self, scripts: &[(&str, Value)], env: impl Fn(&str) -> Option<String>) -> TestServer {
        self.restart_after(scripts, env, Duration::ZERO).await
    }

    /// As [`TestServer::restart`], the clock moved `down_for` while no server runs: whatever fell
    /// due meanwhile is due at the next start.
    pub async fn restart_down_for(self, scripts: &[(&str, Value)], down_for: Duration) -> TestServer {
        self.restart_after(scripts, |_| None, down_for).await
    }

    async fn restart_after(
        self,
        scripts: &[(&str, Value)],
        env: impl Fn(&str) -> Option<String>,
        down_for: Duration,
    ) -> TestServer {
        let config = self.config();
        let clock = self.clock().clone();
        let TestServer { server: running, data_dir, database } = self;
        running.shutdown().await.expect("clean shutdown");
        clock.advance(down_for);
        // The data dir's flock goes with the old server's file; a process another test forks
        // meanwhile holds a copy of every descriptor until it execs, so the lock can outlive the
        // shutdown by the length of that window on a loaded machine: take it once it is free.
        let deadline = tokio::time::Instant::now() + WAIT;
        let server = loop {
            let models = scripted_models(&config, scripts, &env);
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            match start_with_models(listener, config.clone(), Some(models), clock.clone()).await {
                Err(nexus_actors::ServeError::StoreInUse(nexus_actors::store::LockError::DataDirInUse { .. }))
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                started => break started.expect("restarts"),
            }
        };
        TestServer { server, data_dir, database }
    }

    /// The running server's configuration: start another server with it (after this one stops)
    /// to restart on the same store, SQLite data dir or PostgreSQL database alike.
    pub fn config(&self) -> ServerConfig {
        self.server.api.fabric.config.clone()
    }

    /// `http://127.0.0.1:<port>`, or `https://...` when the config turned TLS on.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.server.api.fabric.store
    }

    /// The server's clock: [`Clock::advance`] moves every deadline and hold of the server at
    /// once. A restart keeps it.
    pub fn clock(&self) -> &Clock {
        &self.server.api.fabric.clock
    }

    /// Mints an Agent member.
    pub async fn agent(&self, handle: &str) -> Minted {
        let value = create_member(self.store(), MemberKind::Agent, handle).await.expect("agent");
        minted(&value, "public_id")
    }

    /// Mints a Human member.
    pub async fn human(&self, handle: &str) -> Minted {
        let value = create_member(self.store(), MemberKind::Human, handle).await.expect("human");
        minted(&value, "public_id")
    }

    /// Mints an account-wide runner: every Agent of the server may use it (what every suite that
    /// is not about assignment wants).
    pub async fn runner(&self, name: &str) -> Minted {
        let value = create_runner(self.store(), name, &RunnerAssignment::AccountWide).await.expect("runner");
        minted(&value, "runner_executor_public_id")
    }

    /// Mints a runner assigned to `agents` only (`docs/protocol.md`, "Assignment").
    pub async fn runner_for(&self, name: &str, agents: &[&Minted]) -> Minted {
        let agents = RunnerAssignment::Agents(agents.iter().map(|agent| agent.member()).collect());
        let value = create_runner(self.store(), name, &agents).await.expect("runner");
        minted(&value, "runner_executor_public_id")
    }

    /// The API caller for a minted member.
    pub async fn caller(&self, member: &Minted) -> Caller {
        self.server.api.member(&member.token).await.expect("member")
    }

    /// Writes a token file for runner-agent and returns its path.
    pub fn token_file(&self, runner: &Minted) -> PathBuf {
        let path = self.data_dir.path().join(format!("{}.token", runner.id));
        std::fs::write(&path, &runner.token).expect("token file");
        path
    }

    /// Admits `text` for `member` through the Api with an inline execution declaration and
    /// answers the execution.
    pub async fn run_declared(&self, member: &Minted, text: &str, declaration: Value) -> ExecutionId {
        let caller = self.caller(member).await;
        let input =
            CreateInput { text: text.to_owned(), execution_declaration: Some(declaration), ..CreateInput::default() };
        self.server.api.create_input(&caller, input).await.expect("admitted").execution_public_id
    }

    /// Waits up to `limit` for the execution to be quiescent (completed, canceled or
    /// needs_attention) and answers its row.
    pub async fn settled(&self, run: ExecutionId, limit: Duration) -> ExecutionRow {
        wait_until("the execution to settle", limit, || async {
            self.store().execution(run).await.ok().flatten().filter(|row| row.status.is_quiescent())
        })
        .await
    }

    /// Waits up to [`WAIT`] for task `run`/`task_key` to reach `status` and answers its row.
    pub async fn task_in(&self, run: ExecutionId, task_key: &str, status: TaskStatus) -> TaskRow {
        wait_until(&format!("{task_key} to be {status}"), WAIT, || async {
            self.store().task(run, key(task_key)).await.ok().flatten().filter(|t| t.status == status)
        })
        .await
    }

    /// Task `run`/`task_key` as the store has it now.
    ///
    /// # Panics
    /// When the store fails.
    pub async fn task(&self, run: ExecutionId, task_key: &str) -> Option<TaskRow> {
        self.store().task(run, key(task_key)).await.expect("the store reads")
    }

    /// Starts `runner-agent` as `runner` against this server (killed when the handle drops),
    /// with `--tool-timeout-ms` when `tool_timeout_ms` is given.
    ///
    /// # Panics
    /// When the process cannot start.
    pub fn spawn_runner_agent(
        &self,
        runner: &Minted,
        workdir: &Path,
        state_dir: &Path,
        tool_timeout_ms: Option<u64>,
    ) -> Child {
        let mut command = Command::new(runner_agent_binary());
        command
            .arg("--nexus")
            .arg(self.url())
            .arg("--runner-id")
            .arg(runner.id.to_string())
            .arg("--token-file")
            .arg(self.token_file(runner))
            .arg("--workdir")
            .arg(workdir)
            .arg("--state-dir")
            .arg(state_dir);
        if let Some(timeout_ms) = tool_timeout_ms {
            command.arg("--tool-timeout-ms").arg(timeout_ms.to_string());
        }
        command.arg("--log").arg("warn").stdin(Stdio::null()).kill_on_drop(true).spawn().expect("runner-agent starts")
    }

    /// Gives the runner of the open task `run`/`template` `count` more open tasks, the cheap way:
    /// copies of the template written to the store in a few transactions (as one round's fan-out
    /// is), then each offered to the runner's inbox as the execution offers its tasks (a burst of
    /// `count` offers). The copies take the next keys of the template's round (`r<round>t<n>`) and
    /// `started_at` two to a millisecond after the template's, so that offer order ties are broken
    /// by `task_key`. The execution does not wait for the copies; its own tasks still decide when
    /// it goes on. Returns the copies in key order.
    ///
    /// # Panics
    /// When the template is missing, is not addressed to a runner, or a write fails.
    pub async fn dispatch_copies(&self, run: ExecutionId, template: &str, count: usize) -> Vec<TaskRow> {
        let store = self.store();
        let execution = store.execution(run).await.expect("execution").expect("the execution exists");
        let template = store.task(run, key(template)).await.expect("task").expect("the template task exists");
        let runner = template.target_executor_public_id.expect("the template is addressed to a runner");
        let first = store.tasks_of(run).await.expect("tasks").len();
        let copies: Vec<TaskRow> = (0..count)
            .map(|i| {
                let n = first + i;
                let mut copy = template.clone();
                let index = u32::try_from(n).expect("count fits u32");
                copy.task_key = TaskKey::Call { round: template.round, index };
                copy.tool_call_id = format!("copy-{n}");
                copy.started_at = template.started_at + i64::try_from(i / 2 + 1).expect("count fits i64");
                copy
            })
            .collect();
        for chunk in copies.chunks(1_000) {
            store.save_execution(&execution, TranscriptWrite::Unchanged, chunk, &[]).await.expect("copies written");
        }
        let inbox = self.server.api.root.executor(runner);
        for copy in &copies {
            inbox.offer(vec![copy.clone()]).expect("the runner's inbox takes offers");
        }
        copies
    }

    /// Stops the server.
    pub async fn shutdown(self) {
        self.server.shutdown().await.expect("clean shutdown");
    }
}

fn minted(value: &Value, id_field: &str) -> Minted {
    Minted {
        id: Uuid::parse_str(value[id_field].as_str().expect("id")).expect("uuid"),
        token: value["token"].as_str().expect("token").to_owned(),
    }
}

/// The model registry a [`TestServer`] starts with: `config`'s providers, and `scripted/<name>`
/// following each of `scripts`.
fn scripted_models(
    config: &ServerConfig,
    scripts: &[(&str, Value)],
    env: impl Fn(&str) -> Option<String>,
) -> ModelRegistry {
    let mut models = ModelRegistry::new(config.providers.clone(), env).expect("provider table");
    for (name, script) in scripts {
        let script = Script::from_json(&script.to_string()).expect("script");
        models = models.with_script("scripted", name, script);
    }
    models
}

/// How long [`TestServer`]'s waiting helpers wait before they panic.
pub const WAIT: Duration = Duration::from_secs(30);

/// Waits until `check` returns `Some`, polling every 20 ms, or panics after `limit` naming `what`.
pub async fn wait_until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `runner-agent` binary cargo built beside this test binary (`target/<profile>/`).
pub fn runner_agent_binary() -> PathBuf {
    workspace_binary("runner-agent")
}

/// The `mcp-fixture` binary (the test MCP server, `src/bin/mcp_fixture.rs`) cargo built beside
/// this test binary (`target/<profile>/`).
pub fn mcp_fixture_binary() -> PathBuf {
    workspace_binary("mcp-fixture")
}

/// The `nexus` binary cargo built beside this test binary (`target/<profile>/`).
pub fn nexus_binary() -> PathBuf {
    workspace_binary("nexus")
}

/// A binary of the workspace; `cargo test --workspace` builds every one of them, because each
/// binary's package has integration tests.
fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target dir");
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(path.is_file(), "{} is missing; run the tests with `cargo test --workspace`", path.display());
    path
}

/// The configuration of an in-process runner-agent for `runner` against `url`, working in
/// `workdir` with its journal in `state_dir`, reconnecting quickly (50 ms, at most 200 ms apart).
pub fn agent_config(url: String, runner: &Minted, workdir: &Path, state_dir: &Path) -> nexus_runner_agent::AgentConfig {
    let credential = nexus_runner_agent::Credential::new(runner.token.clone());
    let mut config = nexus_runner_agent::AgentConfig::new(url, runner.id, credential, workdir.to_owned());
    config.state_dir = state_dir.to_owned();
    config.reconnect_min_delay = Duration::from_millis(50);
    config.reconnect_max_delay = Duration::from_millis(200);
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_database_url_keeps_everything_but_the_database() {
        let rows = [
            ("postgres://root@127.0.0.1:5432/postgres", "postgres://root@127.0.0.1:5432/nexus_test_x"),
            ("postgres://u:p@h/db?sslmode=disable", "postgres://u:p@h/nexus_test_x?sslmode=disable"),
            ("postgres://root@127.0.0.1:5432", "postgres://root@127.0.0.1:5432/nexus_test_x"),
        ];
        for (url, expected) in rows {
            assert_eq!(with_database(url, "nexus_test_x"), expected, "{url}");
        }
    }
}
