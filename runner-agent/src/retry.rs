//! The one place that decides what is retried and how long to wait: the reconnect backoff (backon,
//! exponential with jitter) and the explicit lists of retryable refusal codes.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use nexus_proto::ErrorCode;

use crate::config::AgentConfig;

/// Refusal codes that describe a passing condition on the server side. A hello refused with one of
/// these is retried with backoff; a commit refused with one of these stays in the journal and is
/// sent again. Every other refusal is final.
const RETRYABLE_REFUSALS: &[ErrorCode] = &[ErrorCode::Unavailable, ErrorCode::Internal, ErrorCode::RateLimited];

/// Whether a refusal with this code is worth repeating unchanged.
pub(crate) fn is_retryable_refusal(code: ErrorCode) -> bool {
    RETRYABLE_REFUSALS.contains(&code)
}

/// Whether a gRPC status ending a stream means the credential itself was rejected: reconnecting
/// cannot help.
pub(crate) fn is_fatal_status(status: &tonic::Status) -> bool {
    matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied)
}

/// Reconnect delays: exponential (factor 2) from `reconnect_min_delay`, each delay jittered up to
/// twice its base, never above `reconnect_max_delay`, with no limit on attempts.
pub(crate) struct ReconnectBackoff {
    builder: ExponentialBuilder,
    max_delay: Duration,
    current: ExponentialBackoff,
}

impl ReconnectBackoff {
    pub(crate) fn new(config: &AgentConfig) -> Self {
        ReconnectBackoff::between(config.reconnect_min_delay, config.reconnect_max_delay)
    }

    /// The same policy between any two bounds: also the restart delays of a failed MCP server.
    pub(crate) fn between(min_delay: Duration, max_delay: Duration) -> Self {
        // backon adds jitter in [0, base): halving the cap keeps jittered delays under it.
        let builder = ExponentialBuilder::new()
            .with_min_delay(min_delay)
            .with_max_delay((max_delay / 2).max(min_delay))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        ReconnectBackoff { builder, max_delay, current: fresh(builder) }
    }

    /// The delay before the next reconnect attempt.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.current.next().unwrap_or(self.max_delay).min(self.max_delay)
    }

    /// Starts over from the minimum delay, after a healthy connection.
    pub(crate) fn reset(&mut self) {
        self.current = fresh(self.builder);
    }
}

/// backon is built without `std`, where every process would share one fixed jitter seed and
/// runners cut off together would retry in lockstep: seed each sequence ourselves.
fn fresh(builder: ExponentialBuilder) -> ExponentialBackoff {
    builder.with_jitter_seed(rand::random()).build()
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::config::Credential;

    fn config() -> AgentConfig {
        AgentConfig::new("http://127.0.0.1:1", Uuid::nil(), Credential::new("t"), "/")
    }

    #[test]
    fn backoff_grows_from_min_with_jitter_capped_at_max_and_never_ends() {
        let mut backoff = ReconnectBackoff::new(&config());
        let delays: Vec<Duration> = (0..500).map(|_| backoff.next_delay()).collect();
        let (min, max) = (Duration::from_millis(200), Duration::from_secs(10));
        assert!(delays[0] >= min && delays[0] < 2 * min, "first delay {:?}", delays[0]);
        assert!(delays.iter().all(|d| *d >= min && *d <= max));
        // Past the ramp every delay sits in the jittered band [max/2, max].
        assert!(delays[20..].iter().all(|d| *d >= max / 2));
        // Jitter: the capped band is not one repeated value.
        let distinct: std::collections::HashSet<_> = delays[20..].iter().collect();
        assert!(distinct.len() > 10, "only {} distinct delays", distinct.len());

        backoff.reset();
        let after_reset = backoff.next_delay();
        assert!(after_reset >= min && after_reset < 2 * min, "after reset {after_reset:?}");
    }

    #[test]
    fn only_server_side_conditions_are_retryable() {
        let code = |word: &str, http_status: u16| nexus_proto::Refusal::from_wire(word, "", http_status).code;
        assert!(is_retryable_refusal(code("unavailable", 503)));
        assert!(is_retryable_refusal(code("rate_limited", 429)));
        assert!(is_retryable_refusal(code("internal", 500)));
        assert!(!is_retryable_refusal(code("unauthorized", 401)));
        assert!(!is_retryable_refusal(code("stale_claim", 409)));
        // A newer nexus's word is judged by its status: a conflict is final, an outage passes.
        assert!(!is_retryable_refusal(code("some_future_word", 409)));
        assert!(is_retryable_refusal(code("some_future_word", 503)));
        assert!(is_fatal_status(&tonic::Status::unauthenticated("bad token")));
        assert!(!is_fatal_status(&tonic::Status::unavailable("restarting")));
    }
}
