//! A runner with one read-only tool, `probe`, for the suites that need a call to run somewhere
//! and look at what happens around it (the console, the command line, the metrics).

use std::time::Duration;

use serde_json::{Value, json};

use nexus_proto::runner::v1::nexus_frame;

use crate::{Minted, RawRunner, Reply, TestServer};

/// `probe`'s announcement: read-only, intrinsically idempotent, a ten-minute budget.
pub fn probe_tool() -> Value {
    json!({"name": "probe", "description": "Probe.", "input_schema": {"type": "object"},
           "effect_profile": {"kind": "read_only", "destructive": false, "effect_scope": "closed",
                              "idempotency": "intrinsic", "reconciliation": "none"},
           "timeout_ms": 600_000})
}

/// An Agent, and a runner connected over a [`RawRunner`] that announced [`probe_tool`].
pub struct Probe {
    /// The Agent `agent`.
    pub agent: Minted,
    /// The runner `worker` (account-wide).
    pub runner: Minted,
    /// Its stream.
    pub raw: RawRunner,
}

impl Probe {
    /// Mints the Agent and the runner, connects and announces, and declares the Agent's profile
    /// with that runner, `approval_mode` and `model` (`scripted/...`).
    ///
    /// # Panics
    /// When any step is refused.
    pub async fn start(server: &TestServer, approval_mode: &str, model: &str) -> Probe {
        let agent = server.agent("agent").await;
        let runner = server.runner("worker").await;
        let (raw, hello) = RawRunner::connect(&server.url(), runner.id, &runner.token).await;
        assert!(matches!(hello, Reply::Frame(nexus_frame::Frame::Welcome(_))), "{hello:?}");
        let announced = raw.announce(&json!({"tools": [probe_tool()]})).await;
        assert!(matches!(announced, Reply::Frame(nexus_frame::Frame::Announced(_))), "{announced:?}");
        let caller = server.caller(&agent).await;
        let body = json!({"configuration": {"runner_executor_public_ids": [runner.id],
                                            "approval_mode": approval_mode, "default_model": model}});
        server.server.api.declare(&caller, body).await.expect("declared");
        Probe { agent, runner, raw }
    }

    /// Hands the stream to a task that claims every call offered and commits
    /// `{"content": answer(task_key)}`, until it is aborted.
    pub fn serve(mut raw: RawRunner, answer: impl Fn(&str) -> String + Send + 'static) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            while let Some(work) = raw.next_work(Duration::from_secs(600)).await {
                if let Some((token, _)) = raw.claim(&work.run_public_id, &work.task_key).await.granted() {
                    let content = answer(&work.task_key);
                    raw.commit(&work.run_public_id, &work.task_key, &token, &json!({"content": content})).await;
                }
            }
        })
    }
}
