//! The one place that decides what a model step retries, how long it waits, and what its failure
//! means for the fallback chain (`docs/executions.md`, "Models").
//!
//! One model step is up to [`RetryPolicy::attempts`] calls of one route (backon, exponential
//! with full jitter, capped). Per attempt:
//!
//! | failure | retried | the step's key when it stands | the chain |
//! |---|---|---|---|
//! | `Refused` (classifier) | no | `model_refused` | advances, reason `model_refused` |
//! | `Blocked` (content block) | no | `provider_error` | never |
//! | `Provider` (abnormal finish, malformed) | no | `provider_error` | never |
//! | `ModelUnavailable` (401/403/404) | no | `provider_model_unavailable` | never |
//! | `ContextOverflow` | no | `provider_context_overflow` | never |
//! | `Http` 4xx (a request error) | no | `provider_http_error` | never |
//! | `Overloaded` (503, 529, `overloaded_error`) | yes | see below | see below |
//! | `RateLimited` (429) | yes, after `Retry-After` | see below | see below |
//! | `Http` 5xx, `Transport` (incl. a cut stream) | yes | see below | see below |
//!
//! When every attempt failed retryably, the budget is spent:
//! - every attempt overloaded -> `provider_overloaded`, and the chain advances with reason
//!   `provider_overloaded` (category `overloaded`);
//! - any attempt answered 429 -> `attempt_budget_spent`, and the chain never advances (a 429
//!   waits out the lane's floor and retries within budget; it is never a reason to switch);
//! - otherwise (5xx and transport failures, overloaded or not) -> `attempt_budget_spent`, and the
//!   chain advances on this exhausted retryable transport/server failure with reason
//!   `provider_overloaded` and the last attempt's category (`overloaded`, `server_error` or
//!   `transport`), since `model_change.reason` has only the two words.
//!
//! A 429's wait is the larger of the backoff and its `Retry-After`, the latter capped by
//! [`RetryPolicy::retry_after_cap`]. When an attempt that streamed deltas fails, a
//! `stream_reset` follows: `retry` before the next attempt, `refused` after a refusal, `failed`
//! when the step fails otherwise.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

use super::{DeltaSink, ModelError, ModelProvider, ModelRequest, ModelResponse, ResetReason, TranscriptDelta};

/// The key of a model step whose attempts were all spent on retryable failures that were not all
/// overloads (`docs/executions.md`, "Models").
pub const ATTEMPT_BUDGET_SPENT: &str = "attempt_budget_spent";

/// The attempt budget of one model step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Calls of one route per model step, at least 1 (`execution.model_attempts`, default 3).
    pub attempts: usize,
    /// First retry delay, doubled per retry with full jitter (`execution.model_retry_min_delay_ms`,
    /// default 500 ms).
    pub min_delay: Duration,
    /// Cap of the backoff delay (`execution.model_retry_max_delay_ms`, default 10 s).
    pub max_delay: Duration,
    /// Longest `Retry-After` of a 429 that is honoured (`execution.model_retry_after_max_ms`,
    /// default 60 s); a longer one waits this long.
    pub retry_after_cap: Duration,
}

nexus_proto::words! {
    /// Why the fallback chain advances: `model_change.reason`.
    pub enum SwitchReason("fallback reason") {
        /// The classifier declined.
        ModelRefused => "model_refused",
        /// The retryable transport/server failures spent the budget.
        ProviderOverloaded => "provider_overloaded",
    }
}

/// A model step that failed: its key, and whether the fallback chain may advance (module docs).
#[derive(Debug)]
pub struct ModelFailure {
    /// The last attempt's error.
    pub error: ModelError,
    /// The step's error key: the last error's [`ModelError::key`], `provider_overloaded`, or
    /// [`ATTEMPT_BUDGET_SPENT`].
    pub key: &'static str,
    /// `Some` when the chain may advance to the next available candidate.
    pub advance: Option<SwitchReason>,
    /// `model_change.category` for a `provider_overloaded` switch: `overloaded`, `server_error` or
    /// `transport`; `None` otherwise.
    pub category: Option<&'static str>,
    /// Calls made, at least 1.
    pub attempts: usize,
}

/// What one retryable failure was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FailureClass {
    Overloaded,
    RateLimited,
    ServerError,
    Transport,
}

impl FailureClass {
    fn of(error: &ModelError) -> Option<Self> {
        match error {
            ModelError::Overloaded { .. } => Some(Self::Overloaded),
            ModelError::RateLimited { .. } => Some(Self::RateLimited),
            ModelError::Http { status: 429, .. } => Some(Self::RateLimited),
            ModelError::Http { status, .. } if *status >= 500 => Some(Self::ServerError),
            ModelError::Transport { .. } => Some(Self::Transport),
            _ => None,
        }
    }

    fn category(self) -> &'static str {
        match self {
            Self::Overloaded => "overloaded",
            Self::RateLimited => "rate_limited",
            Self::ServerError => "server_error",
            Self::Transport => "transport",
        }
    }
}

/// The wait before the next attempt: `proposed` (the backoff's; `None` when the budget is spent),
/// raised to a 429's `Retry-After` capped at `retry_after_cap`.
#[must_use]
pub fn retry_delay(error: &ModelError, proposed: Option<Duration>, retry_after_cap: Duration) -> Option<Duration> {
    let proposed = proposed?;
    match error {
        ModelError::RateLimited { retry_after: Some(wait), .. } => Some(proposed.max((*wait).min(retry_after_cap))),
        _ => Some(proposed),
    }
}

/// Runs one model step on `client`: up to `policy.attempts` calls, classified as the module docs
/// say. Deltas go to `request.deltas`, with a `stream_reset` after an attempt that streamed and
/// failed.
///
/// # Errors
/// [`ModelFailure`] when the step failed.
pub async fn call_with_retries(
    client: Arc<dyn ModelProvider>,
    request: ModelRequest,
    policy: &RetryPolicy,
) -> Result<ModelResponse, ModelFailure> {
    let outer = request.deltas.clone();
    let streamed = Arc::new(AtomicBool::new(false));
    let deltas = outer.as_ref().map(|sink| {
        let sink = sink.clone();
        let streamed = Arc::clone(&streamed);
        DeltaSink::new(move |delta| {
            streamed.store(true, Ordering::Relaxed);
            sink.send(delta);
        })
    });
    let request = ModelRequest { deltas, ..request };
    let history: Mutex<Vec<FailureClass>> = Mutex::new(Vec::new());
    let reset = |reason: ResetReason| {
        if streamed.swap(false, Ordering::Relaxed)
            && let Some(sink) = &outer
        {
            sink.send(TranscriptDelta::StreamReset { reason });
        }
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(policy.min_delay)
        .with_max_delay(policy.max_delay.max(policy.min_delay))
        .with_max_times(policy.attempts.max(1) - 1)
        .with_jitter()
        .with_jitter_seed(rand::random());
    let call = || {
        let client = Arc::clone(&client);
        let request = request.clone();
        let history = &history;
        async move {
            // Every answer passes its bounds before anything reads it ([`super::bounds`]).
            let result = client.complete(request).await.and_then(super::bounds::bound_answer);
            if let Err(error) = &result {
                history.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(FailureClass::of(error));
            }
            result
        }
    };
    let result = call
        .retry(backoff)
        .when(ModelError::retryable)
        .adjust(|error, proposed| retry_delay(error, proposed, policy.retry_after_cap))
        .notify(|error, wait| {
            reset(ResetReason::Retry);
            tracing::info!(error = %error, ?wait, "model call failed; retrying");
        })
        .await;
    let error = match result {
        Ok(response) => return Ok(response),
        Err(error) => error,
    };
    reset(if matches!(error, ModelError::Refused { .. }) { ResetReason::Refused } else { ResetReason::Failed });
    let history = history.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    Err(classify(error, &history))
}

/// The step's failure from its last error and the retryable failures before it (module docs).
fn classify(error: ModelError, history: &[FailureClass]) -> ModelFailure {
    // A non-retryable error ends the step at once; a retryable one means the budget is spent, and
    // the history already holds it.
    let attempts = if error.retryable() { history.len().max(1) } else { history.len() + 1 };
    let Some(last) = FailureClass::of(&error).filter(|_| error.retryable()) else {
        let advance = matches!(error, ModelError::Refused { .. }).then_some(SwitchReason::ModelRefused);
        return ModelFailure { key: error.key(), advance, category: None, attempts, error };
    };
    if history.iter().all(|class| *class == FailureClass::Overloaded) {
        return ModelFailure {
            key: "provider_overloaded",
            advance: Some(SwitchReason::ProviderOverloaded),
            category: Some(last.category()),
            attempts,
            error,
        };
    }
    if history.contains(&FailureClass::RateLimited) {
        return ModelFailure { key: ATTEMPT_BUDGET_SPENT, advance: None, category: None, attempts, error };
    }
    ModelFailure {
        key: ATTEMPT_BUDGET_SPENT,
        advance: Some(SwitchReason::ProviderOverloaded),
        category: Some(last.category()),
        attempts,
        error,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::model::{BoxFuture, ChatMessage};

    /// Answers queued results in order; each may stream a text delta first.
    #[derive(Debug, Default)]
    struct Queue {
        answers: Mutex<VecDeque<(bool, Result<ModelResponse, ModelError>)>>,
        calls: Mutex<usize>,
    }

    impl ModelProvider for Queue {
        fn complete<'a>(&'a self, request: ModelRequest) -> BoxFuture<'a, Result<ModelResponse, ModelError>> {
            *self.calls.lock().expect("lock") += 1;
            let (stream, answer) = self.answers.lock().expect("lock").pop_front().expect("an answer is queued");
            if stream && let Some(sink) = &request.deltas {
                sink.send(TranscriptDelta::Text { text: "partial".into() });
            }
            Box::pin(async move { answer })
        }
    }

    fn ok() -> Result<ModelResponse, ModelError> {
        Ok(ModelResponse { text: Some("done".into()), tool_calls: vec![], finish_reason: "stop".into(), usage: None })
    }

    fn overloaded() -> Result<ModelResponse, ModelError> {
        Err(ModelError::Overloaded { status: Some(529), message: String::new() })
    }

    fn status(status: u16) -> Result<ModelResponse, ModelError> {
        Err(ModelError::Http { status, message: String::new() })
    }

    fn limited() -> Result<ModelResponse, ModelError> {
        Err(ModelError::RateLimited { retry_after: Some(Duration::from_secs(2)), message: String::new() })
    }

    fn transport() -> Result<ModelResponse, ModelError> {
        Err(ModelError::Transport { message: "the stream ended before message_stop".into() })
    }

    /// Three attempts with millisecond waits (a 429's two seconds are capped to one millisecond).
    fn policy() -> RetryPolicy {
        RetryPolicy {
            attempts: 3,
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
            retry_after_cap: Duration::from_millis(1),
        }
    }

    fn request(sink: Option<DeltaSink>) -> ModelRequest {
        ModelRequest {
            model: "m".into(),
            messages: vec![ChatMessage::User { content: "hi".into() }],
            deltas: sink,
            ..ModelRequest::default()
        }
    }

    /// (row, answers, Ok(calls) or Err((key, advance, category, calls))).
    type Row = (
        &'static str,
        Vec<Result<ModelResponse, ModelError>>,
        Result<usize, (&'static str, Option<&'static str>, Option<&'static str>, usize)>,
    );

    #[tokio::test]
    async fn classification_rows() {
        let refused = || Err(ModelError::Refused { message: String::new() });
        let blocked = || Err(ModelError::Blocked { message: String::new() });
        let rows: Vec<Row> = vec![
            ("ok_first_time", vec![ok()], Ok(1)),
            ("429_waits_then_succeeds", vec![limited(), ok()], Ok(2)),
            ("transport_then_ok", vec![transport(), ok()], Ok(2)),
            ("500_then_ok", vec![status(500), ok()], Ok(2)),
            (
                "overloaded_on_every_attempt",
                vec![overloaded(), overloaded(), overloaded()],
                Err(("provider_overloaded", Some("provider_overloaded"), Some("overloaded"), 3)),
            ),
            (
                "429_on_every_attempt_never_falls_back",
                vec![limited(), limited(), limited()],
                Err((ATTEMPT_BUDGET_SPENT, None, None, 3)),
            ),
            (
                "overloaded_then_429_never_falls_back",
                vec![overloaded(), limited(), overloaded()],
                Err((ATTEMPT_BUDGET_SPENT, None, None, 3)),
            ),
            (
                "server_errors_spend_the_budget_and_advance",
                vec![status(500), overloaded(), status(502)],
                Err((ATTEMPT_BUDGET_SPENT, Some("provider_overloaded"), Some("server_error"), 3)),
            ),
            (
                "cut_streams_spend_the_budget_and_advance",
                vec![transport(), transport(), transport()],
                Err((ATTEMPT_BUDGET_SPENT, Some("provider_overloaded"), Some("transport"), 3)),
            ),
            ("refusal_advances_at_once", vec![refused()], Err(("model_refused", Some("model_refused"), None, 1))),
            (
                "refusal_after_an_overload",
                vec![overloaded(), refused()],
                Err(("model_refused", Some("model_refused"), None, 2)),
            ),
            ("content_block_never_advances", vec![blocked()], Err(("provider_error", None, None, 1))),
            ("request_error_never_advances", vec![status(400)], Err(("provider_http_error", None, None, 1))),
            (
                "overloaded_then_request_error",
                vec![overloaded(), status(422)],
                Err(("provider_http_error", None, None, 2)),
            ),
            (
                "unavailable_model_never_advances",
                vec![Err(ModelError::ModelUnavailable { status: 404, message: String::new() })],
                Err(("provider_model_unavailable", None, None, 1)),
            ),
            (
                "abnormal_finish_never_advances",
                vec![Err(ModelError::Provider { message: "finish_reason error".into() })],
                Err(("provider_error", None, None, 1)),
            ),
            (
                "context_overflow_never_advances",
                vec![Err(ModelError::ContextOverflow { status: 400, message: String::new() })],
                Err(("provider_context_overflow", None, None, 1)),
            ),
        ];
        for (name, answers, expected) in rows {
            let queue = Arc::new(Queue::default());
            queue.answers.lock().expect("lock").extend(answers.into_iter().map(|a| (false, a)));
            let result = call_with_retries(queue.clone(), request(None), &policy()).await;
            let calls = *queue.calls.lock().expect("lock");
            match (result, expected) {
                (Ok(_), Ok(expected_calls)) => assert_eq!(calls, expected_calls, "{name}"),
                (Err(failure), Err((key, advance, category, expected_calls))) => {
                    assert_eq!(failure.key, key, "{name}");
                    assert_eq!(failure.advance.map(SwitchReason::as_str), advance, "{name}");
                    assert_eq!(failure.category, category, "{name}");
                    assert_eq!(failure.attempts, expected_calls, "{name}: attempts");
                    assert_eq!(calls, expected_calls, "{name}: calls");
                }
                (actual, expected) => panic!("{name}: got {actual:?}, expected {expected:?}"),
            }
            assert!(queue.answers.lock().expect("lock").is_empty(), "{name}: every queued answer was asked for");
        }
    }

    #[tokio::test]
    async fn a_failed_attempt_that_streamed_is_reset() {
        /// (whether the attempt streams a delta first, its answer).
        type Attempt = (bool, Result<ModelResponse, ModelError>);
        let rows: Vec<(&str, Vec<Attempt>, Vec<&str>)> = vec![
            (
                "retry_then_success",
                vec![(true, transport()), (true, ok())],
                vec!["text_delta", "stream_reset:retry", "text_delta"],
            ),
            ("silent_failure_needs_no_reset", vec![(false, overloaded()), (true, ok())], vec!["text_delta"]),
            (
                "refused",
                vec![(true, Err(ModelError::Refused { message: String::new() }))],
                vec!["text_delta", "stream_reset:refused"],
            ),
            (
                "failed",
                vec![(true, Err(ModelError::Blocked { message: String::new() }))],
                vec!["text_delta", "stream_reset:failed"],
            ),
            (
                "exhausted",
                vec![(true, overloaded()), (false, overloaded()), (true, overloaded())],
                vec!["text_delta", "stream_reset:retry", "text_delta", "stream_reset:failed"],
            ),
        ];
        for (name, answers, expected) in rows {
            let queue = Arc::new(Queue::default());
            queue.answers.lock().expect("lock").extend(answers);
            let seen = Arc::new(Mutex::new(Vec::new()));
            let keep = Arc::clone(&seen);
            let sink = DeltaSink::new(move |delta: TranscriptDelta| {
                let word = match &delta {
                    TranscriptDelta::StreamReset { reason } => format!("stream_reset:{}", reason.word()),
                    other => other.event_type().as_str().to_owned(),
                };
                keep.lock().expect("lock").push(word);
            });
            let _ = call_with_retries(queue, request(Some(sink)), &policy()).await;
            assert_eq!(*seen.lock().expect("lock"), expected, "{name}");
        }
    }

    #[test]
    fn a_429_waits_at_least_its_retry_after_within_the_cap() {
        let cap = Duration::from_secs(60);
        let limited = |secs: u64| ModelError::RateLimited {
            retry_after: Some(Duration::from_secs(secs)),
            message: String::new(),
        };
        let second = Duration::from_secs(1);
        assert_eq!(retry_delay(&limited(5), Some(second), cap), Some(Duration::from_secs(5)));
        assert_eq!(retry_delay(&limited(600), Some(second), cap), Some(cap));
        assert_eq!(retry_delay(&limited(1), Some(Duration::from_secs(3)), cap), Some(Duration::from_secs(3)));
        assert_eq!(retry_delay(&limited(5), None, cap), None, "a spent budget stays spent");
        let plain = ModelError::RateLimited { retry_after: None, message: String::new() };
        assert_eq!(retry_delay(&plain, Some(second), cap), Some(second));
        let overloaded = ModelError::Overloaded { status: Some(503), message: String::new() };
        assert_eq!(retry_delay(&overloaded, Some(second), cap), Some(second));
    }
}
