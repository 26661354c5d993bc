//! Server configuration, loaded and validated once: defaults, then the TOML file, then flags.
//!
//! Every field documents its unit and default. The file's sections map one to one onto
//! [`ServerConfig`]; unknown keys are refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::ProviderTable;

/// The whole server configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Where the embedded SQLite store lives. Default: `./nexus-data`.
    pub data_dir: PathBuf,
    /// Runner stream timing.
    pub runner: RunnerStreamConfig,
    /// Execution timing.
    pub execution: ExecutionConfig,
    /// Request budgets of the member doors (HTTP and gRPC).
    pub doors: DoorsConfig,
    /// The model provider table (see README, "Model providers").
    pub providers: ProviderTable,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            data_dir: PathBuf::from("nexus-data"),
            runner: RunnerStreamConfig::default(),
            execution: ExecutionConfig::default(),
            doors: DoorsConfig::default(),
            providers: ProviderTable::default(),
        }
    }
}

/// Timing of the runner stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunnerStreamConfig {
    /// Interval of application Ping frames, in milliseconds. Default 15000.
    pub ping_interval_ms: u64,
    /// A stream with no inbound frame for this long is closed as dead, in milliseconds.
    /// Default 45000 (three missed pings).
    pub liveness_timeout_ms: u64,
    /// HTTP/2 keepalive interval on the server side, in milliseconds. Default 20000.
    pub http2_keepalive_interval_ms: u64,
    /// HTTP/2 keepalive ack timeout, in milliseconds. Default 10000.
    pub http2_keepalive_timeout_ms: u64,
    /// Largest frame accepted or sent, in bytes. Default 8 MiB.
    pub max_frame_bytes: usize,
}

impl Default for RunnerStreamConfig {
    fn default() -> Self {
        RunnerStreamConfig {
            ping_interval_ms: 15_000,
            liveness_timeout_ms: 45_000,
            http2_keepalive_interval_ms: 20_000,
            http2_keepalive_timeout_ms: 10_000,
            max_frame_bytes: 8 * 1024 * 1024,
        }
    }
}

impl RunnerStreamConfig {
    /// The ping interval as a duration.
    pub fn ping_interval(&self) -> Duration {
        Duration::from_millis(self.ping_interval_ms.max(1))
    }

    /// The liveness bound as a duration.
    pub fn liveness_timeout(&self) -> Duration {
        Duration::from_millis(self.liveness_timeout_ms.max(1))
    }
}

/// Timing of executions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExecutionConfig {
    /// Attempts of one model call on retryable failures (transport, 429, 5xx). Default 3.
    pub model_attempts: usize,
    /// First retry delay of a model call, in milliseconds; doubles with full jitter. Default 500.
    pub model_retry_min_delay_ms: u64,
    /// Cap of the model retry delay, in milliseconds. Default 10000.
    pub model_retry_max_delay_ms: u64,
    /// Park of a runner task whose tool announced no `timeout_ms`, in milliseconds.
    /// Default 600000 (the kernel default of 10 minutes).
    pub default_task_timeout_ms: u64,
}

impl Default for ExecutionConfig {
    fn default() -> Self {
        ExecutionConfig {
            model_attempts: 3,
            model_retry_min_delay_ms: 500,
            model_retry_max_delay_ms: 10_000,
            default_task_timeout_ms: crate::declaration::DEFAULT_TIMEOUT_MS,
        }
    }
}

/// Request budgets of the member doors: a token bucket per member credential. A spent budget is
/// 429 `rate_limited` with `Retry-After` in whole seconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DoorsConfig {
    /// Sustained requests per minute per member. Default 1200.
    pub requests_per_minute: u32,
    /// Requests a member may make at once above the sustained rate. Default 120.
    pub burst: u32,
}

impl Default for DoorsConfig {
    fn default() -> Self {
        DoorsConfig { requests_per_minute: 1200, burst: 120 }
    }
}

/// A configuration that failed to load.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path tried.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A value is out of its range.
    #[error("invalid config: {field} {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is allowed.
        reason: &'static str,
    },
    /// The file is not valid configuration.
    #[error("invalid config file {path}: {source}")]
    Parse {
        /// The path tried.
        path: PathBuf,
        /// The TOML error, with its line.
        source: toml::de::Error,
    },
}

impl ServerConfig {
    /// Loads the defaults overlaid by a TOML file, when one is given.
    ///
    /// # Errors
    /// [`ConfigError`] when the file is unreadable or invalid (unknown keys included).
    pub fn load(path: Option<&Path>) -> Result<ServerConfig, ConfigError> {
        let Some(path) = path else { return Ok(ServerConfig::default()) };
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let config = Self::from_toml(&text).map_err(|source| ConfigError::Parse { path: path.to_owned(), source })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the relations between fields that the types cannot express.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let runner = &self.runner;
        let invalid = |field: &'static str, reason: &'static str| Err(ConfigError::Invalid { field, reason });
        if runner.ping_interval_ms == 0 {
            return invalid("runner.ping_interval_ms", "must be positive");
        }
        if runner.liveness_timeout_ms < 2 * runner.ping_interval_ms {
            return invalid("runner.liveness_timeout_ms", "must be at least twice runner.ping_interval_ms");
        }
        if runner.http2_keepalive_interval_ms == 0 || runner.http2_keepalive_timeout_ms == 0 {
            return invalid("runner.http2_keepalive_*", "must be positive");
        }
        if runner.max_frame_bytes < 1_100_000 {
            return invalid("runner.max_frame_bytes", "must hold a 1 MB result (at least 1100000)");
        }
        if self.execution.model_attempts == 0 {
            return invalid("execution.model_attempts", "must be at least 1");
        }
        if self.execution.default_task_timeout_ms == 0 {
            return invalid("execution.default_task_timeout_ms", "must be positive");
        }
        if self.doors.requests_per_minute == 0 || self.doors.burst == 0 {
            return invalid("doors", "requests_per_minute and burst must be positive");
        }
        Ok(())
    }

    /// Parses a TOML document over the defaults.
    ///
    /// # Errors
    /// The TOML error, naming the line and the key.
    pub fn from_toml(text: &str) -> Result<ServerConfig, toml::de::Error> {
        toml::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_parses_and_overrides_the_defaults() {
        let config = ServerConfig::from_toml(include_str!("../../deploy/examples/nexus.toml")).expect("example parses");
        assert_eq!(config.runner, RunnerStreamConfig::default());
        assert_eq!(config.execution, ExecutionConfig::default());
        assert_eq!(config.doors, DoorsConfig::default());
        assert_eq!(config.data_dir, PathBuf::from("nexus-data"));
        let names: Vec<&str> = config.providers.providers.keys().map(String::as_str).collect();
        assert_eq!(names, ["local", "openrouter", "scripted"]);
        assert!(!config.providers.providers["local"].enabled);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let error = ServerConfig::from_toml("[runner]\nping_every = 5\n").expect_err("refused");
        assert!(error.to_string().contains("ping_every"), "{error}");
        assert_eq!(ServerConfig::from_toml("").expect("empty is the defaults"), ServerConfig::default());
        assert!(ServerConfig::default().validate().is_ok());
        let dead = ServerConfig::from_toml("[runner]\nliveness_timeout_ms = 0\n").expect("parses");
        assert!(matches!(dead.validate(), Err(ConfigError::Invalid { field: "runner.liveness_timeout_ms", .. })));
    }
}
