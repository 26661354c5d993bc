//! Prometheus metrics, served at `GET /metrics` (`docs/metrics.md`).
//!
//! Two kinds of series. What the store holds (tasks and executions by status, each runner's open
//! and unclaimed tasks) is read from the store at each scrape ([`crate::store::Tally`]), so it
//! matches the store by construction and survives restarts. What only happens in this process
//! (model calls and their tokens, the time from a task's dispatch to its settlement, the group
//! commit's batches, the doors' answers) is counted here as it happens, from this process's
//! start. No label carries an execution, conversation or task id: every label takes its values
//! from a closed vocabulary (a status, an error word, a task kind), from the configuration (a
//! provider's name), or from the runners an operator registered (a runner's id).

use std::sync::atomic::Ordering;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use nexus_proto::{ErrorCode, RunStatus, TaskStatus};

use crate::actors::fabric::Fabric;
use crate::model::Usage;
use crate::store::{StoreResult, TaskRow};

/// The `Content-Type` of a scrape's answer: the OpenMetrics text format, which Prometheus reads.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The prefix of every series name.
pub const PREFIX: &str = "nexus";

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// A model call's labels: the provider's name from `[providers]`, and `ok` or `error`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelCall {
    provider: String,
    outcome: &'static str,
}

/// A token count's labels: the provider, and `input` or `output`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelTokens {
    provider: String,
    kind: &'static str,
}

/// A settlement's labels: `runner` (a runner's inbox) or `kernel` (in-process), and the
/// settled status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Settlement {
    route: &'static str,
    status: &'static str,
}

/// A door answer's labels: `http` or `grpc`, and its code ([`Metrics::door_answered`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DoorAnswer {
    door: &'static str,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunnerLabel {
    runner: String,
}

/// Seconds from 1 ms to about 65 s, doubling: model calls and task round trips.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The series this process counts as things happen. Clones share them.
#[derive(Clone, Debug)]
pub struct Metrics {
    model_calls: HistogramFamily<ModelCall>,
    model_tokens: Family<ModelTokens, Counter>,
    settlements: HistogramFamily<Settlement>,
    door_answers: Family<DoorAnswer, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            model_calls: Family::new_with_constructor(latency_histogram),
            model_tokens: Family::default(),
            settlements: Family::new_with_constructor(latency_histogram),
            door_answers: Family::default(),
        }
    }
}

/// The provider part of a `provider/model` reference.
fn provider_of(reference: &str) -> &str {
    reference.split_once('/').map_or(reference, |(provider, _)| provider)
}

impl Metrics {
    /// One model step of `reference` (`provider/model`) ended after `seconds`, its retries
    /// included: `ok` with the tokens the provider reported, or an error.
    pub fn model_called(&self, reference: &str, ok: bool, seconds: f64, usage: Option<Usage>) {
        let provider = provider_of(reference).to_owned();
        let outcome = if ok { "ok" } else { "error" };
        self.model_calls.get_or_create(&ModelCall { provider: provider.clone(), outcome }).observe(seconds);
        if let Some(usage) = usage {
            for (kind, tokens) in [("input", usage.input_tokens), ("output", usage.output_tokens)] {
                self.model_tokens.get_or_create(&ModelTokens { provider: provider.clone(), kind }).inc_by(tokens);
            }
        }
    }

    /// A tool call settled: its time from dispatch (`started_at`) to settlement (`settled_at`),
    /// both on the store's clock. An unsettled row is not counted.
    pub fn task_settled(&self, task: &TaskRow) {
        let Some(settled_at) = task.settled_at.filter(|_| task.is_settled()) else { return };
        let route = if task.target_executor_public_id.is_some() { "runner" } else { "kernel" };
        let seconds = (settled_at - task.started_at).max(0) as f64 / 1000.0;
        self.settlements.get_or_create(&Settlement { route, status: task.status.as_str() }).observe(seconds);
    }

    /// A door answered: on `grpc` or `http`, with `code`, which is `ok` for a success, the
    /// refusal's word (`not_found`, `unavailable`, ...) when it carried one, else the HTTP status
    /// (for an answer without a word) or the gRPC status number (`grpc_12`).
    pub fn door_answered(&self, grpc: bool, code: String) {
        let door = if grpc { "grpc" } else { "http" };
        self.door_answers.get_or_create(&DoorAnswer { door, code }).inc();
    }
}

/// The code [`Metrics::door_answered`] counts for an answer: the refusal's word (from the answer's
/// extensions, or gRPC's `nexus-error-code`), else a failing status, else `ok`.
pub fn answer_code(response: &axum::response::Response) -> String {
    if let Some(code) = response.extensions().get::<ErrorCode>() {
        return code.as_str().to_owned();
    }
    let headers = response.headers();
    let word = headers.get("nexus-error-code").and_then(|v| v.to_str().ok()).and_then(ErrorCode::from_word);
    if let Some(code) = word {
        return code.as_str().to_owned();
    }
    match headers.get("grpc-status").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u8>().ok()) {
        Some(0) | None if response.status().as_u16() < 400 => "ok".to_owned(),
        Some(status) if status != 0 => format!("grpc_{status}"),
        _ => response.status().as_u16().to_string(),
    }
}

/// One gauge per word of `all`: its count in `counted`, zero when absent.
fn by_status<T: Copy + PartialEq>(
    all: &[T],
    counted: &[(T, i64)],
    word: fn(T) -> &'static str,
) -> Family<StatusLabel, Gauge> {
    let family = Family::<StatusLabel, Gauge>::default();
    for status in all {
        let count = counted.iter().find(|(s, _)| s == status).map_or(0, |(_, n)| *n);
        family.get_or_create(&StatusLabel { status: word(*status) }).set(count);
    }
    family
}

/// The door layer that counts every answer of the HTTP and gRPC doors by its code
/// (`nexus_door_requests_total`, [`answer_code`]).
pub async fn count_answers(
    axum::extract::State(metrics): axum::extract::State<Metrics>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let grpc = crate::doors::forward::is_grpc(request.headers());
    let response = next.run(request).await;
    metrics.door_answered(grpc, answer_code(&response));
    response
}

/// The whole scrape: the store's census read now, this process's series, and the group commit's.
///
/// # Errors
/// The store's error when its census cannot be read.
pub async fn render(fabric: &Fabric) -> StoreResult<String> {
    let tally = fabric.store.tally().await?;
    let mut registry = Registry::with_prefix(PREFIX);

    let tasks = by_status(TaskStatus::ALL, &tally.tasks, TaskStatus::as_str);
    registry.register(
        "tasks",
        "Tasks in the store by status (needs_approval: parked approvals; awaiting_input: questions; uncertain: outcomes nobody knows)",
        tasks,
    );
    let executions = by_status(RunStatus::ALL, &tally.executions, RunStatus::as_str);
    registry.register("executions", "Executions in the store by status", executions);
    let open = Family::<RunnerLabel, Gauge>::default();
    let unclaimed = Family::<RunnerLabel, Gauge>::default();
    for runner in &tally.runners {
        let label = RunnerLabel { runner: runner.runner.to_string() };
        open.get_or_create(&label).set(runner.open);
        unclaimed.get_or_create(&label).set(runner.unclaimed);
    }
    registry.register("runner_open_tasks", "Dispatched tasks in each runner's inbox, claimed or not", open);
    registry.register(
        "runner_unclaimed_tasks",
        "Dispatched tasks in each runner's inbox that nobody claimed yet",
        unclaimed,
    );
    let online = Gauge::<i64>::default();
    online.set(i64::try_from(fabric.connections.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
    registry.register("runners_online", "Runner streams connected to this node", online);

    let counted = &fabric.metrics;
    registry.register(
        "model_call_duration_seconds",
        "Model steps by provider and outcome, retries included",
        counted.model_calls.clone(),
    );
    registry.register(
        "model_tokens",
        "Tokens the providers reported, by provider and kind",
        counted.model_tokens.clone(),
    );
    registry.register(
        "task_settle_duration_seconds",
        "Tool calls from dispatch to settlement, by route and settled status",
        counted.settlements.clone(),
    );
    registry.register(
        "door_requests",
        "Answers of the HTTP and gRPC doors, by door and code",
        counted.door_answers.clone(),
    );
    let commit = fabric.store.commit_metrics();
    registry.register("store_commit_batch_size", "Writes per group-committed transaction", commit.batch_size);
    registry.register(
        "store_commit_duration_seconds",
        "Seconds from BEGIN to durable COMMIT of each group-committed transaction",
        commit.flush_seconds,
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .map_err(|_| crate::store::StoreError::Corrupt("the metrics could not be written as text".to_owned()))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, headers: &[(&'static str, &'static str)]) -> axum::response::Response {
        let mut response = axum::response::Response::new(axum::body::Body::empty());
        *response.status_mut() = axum::http::StatusCode::from_u16(status).expect("status");
        for (name, value) in headers {
            response.headers_mut().insert(*name, axum::http::HeaderValue::from_static(value));
        }
        response
    }

    #[test]
    fn answers_are_counted_by_word_then_status() {
        assert_eq!(answer_code(&answer(200, &[])), "ok");
        assert_eq!(answer_code(&answer(404, &[])), "404");
        let mut refused = answer(404, &[]);
        refused.extensions_mut().insert(ErrorCode::NotFound);
        assert_eq!(answer_code(&refused), "not_found");
        assert_eq!(answer_code(&answer(200, &[("grpc-status", "0")])), "ok");
        assert_eq!(answer_code(&answer(200, &[("grpc-status", "12")])), "grpc_12");
        assert_eq!(answer_code(&answer(200, &[("grpc-status", "5"), ("nexus-error-code", "not_found")])), "not_found");
        // A word nexus does not know is not a label value: the status stands.
        assert_eq!(answer_code(&answer(200, &[("grpc-status", "5"), ("nexus-error-code", "made_up")])), "grpc_5");
    }

    #[test]
    fn providers_are_the_first_part_of_a_reference() {
        assert_eq!(provider_of("openrouter/anthropic/claude"), "openrouter");
        assert_eq!(provider_of("scripted"), "scripted");
    }

    #[test]
    fn counted_series_are_encoded_with_their_labels() {
        let metrics = Metrics::default();
        metrics.model_called("scripted/work", true, 0.02, Some(Usage { input_tokens: 7, output_tokens: 3 }));
        metrics.model_called("scripted/work", false, 0.5, None);
        metrics.door_answered(false, "ok".into());
        let mut registry = Registry::with_prefix(PREFIX);
        registry.register("model_tokens", "tokens", metrics.model_tokens.clone());
        registry.register("model_call_duration_seconds", "calls", metrics.model_calls.clone());
        registry.register("door_requests", "answers", metrics.door_answers.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("text");
        assert!(text.contains(r#"nexus_model_tokens_total{provider="scripted",kind="input"} 7"#), "{text}");
        assert!(text.contains(r#"nexus_model_tokens_total{provider="scripted",kind="output"} 3"#), "{text}");
        assert!(
            text.contains(r#"nexus_model_call_duration_seconds_count{provider="scripted",outcome="error"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"nexus_door_requests_total{door="http",code="ok"} 1"#), "{text}");
    }
}
