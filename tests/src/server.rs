//! The in-process server and credential helpers.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;
use tokio::net::TcpListener;
use uuid::Uuid;

use nexus_actors::admin::{MemberKind, create_member, create_runner};
use nexus_actors::api::Caller;
use nexus_actors::config::ServerConfig;
use nexus_actors::model::{ModelRegistry, Script};
use nexus_actors::store::Store;
use nexus_actors::{RunningServer, start_with_models};

/// A credential minted for a test: the subject's id and its bearer token.
#[derive(Clone, Debug)]
pub struct Minted {
    /// The member's or runner's UUID.
    pub id: Uuid,
    /// The bearer token.
    pub token: String,
}

/// nexus running in this process on 127.0.0.1:0 with its own temporary data dir.
#[derive(Debug)]
pub struct TestServer {
    /// The running server.
    pub server: RunningServer,
    /// Keeps the data dir alive for the test's duration.
    pub data_dir: TempDir,
}

/// Installs a quiet tracing subscriber once (set `RUST_LOG` to see logs).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

impl TestServer {
    /// Starts a server whose `scripted/<name>` models follow the given scripts.
    pub async fn start(scripts: &[(&str, Value)]) -> TestServer {
        Self::start_with(scripts, |_| {}).await
    }

    /// Starts a server after `adjust` edits its configuration.
    pub async fn start_with(scripts: &[(&str, Value)], adjust: impl FnOnce(&mut ServerConfig)) -> TestServer {
        init_tracing();
        let data_dir = tempfile::tempdir().expect("temp dir");
        let mut config = ServerConfig { data_dir: data_dir.path().to_owned(), ..ServerConfig::default() };
        adjust(&mut config);
        let mut models = ModelRegistry::new(config.providers.clone(), |_| None).expect("provider table");
        for (name, script) in scripts {
            let script = Script::from_json(&script.to_string()).expect("script");
            models = models.with_script("scripted", name, script);
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let server = start_with_models(listener, config, Some(models)).await.expect("server starts");
        TestServer { server, data_dir }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.server.api.fabric.store
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

    /// Mints a runner.
    pub async fn runner(&self, name: &str) -> Minted {
        let value = create_runner(self.store(), name).await.expect("runner");
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
