//! Server configuration, loaded and validated once: defaults, then the TOML file, then flags.
//!
//! Every field documents its unit and default. The file's sections map one to one onto
//! [`ServerConfig`]; unknown keys are refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::TIMEOUT_BOUND_MS;
use crate::model::ProviderTable;
pub use crate::store::StoreConfig;

/// The whole server configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// The data dir: the embedded SQLite store (`nexus.db`, unless `store.database_url` names
    /// PostgreSQL) and the lock file (`nexus.lock`) that keeps a second nexus off it. Default:
    /// `./nexus-data`.
    pub data_dir: PathBuf,
    /// The durable store: embedded SQLite in `data_dir` (the default) or PostgreSQL.
    pub store: StoreConfig,
    /// Runner stream timing.
    pub runner: RunnerStreamConfig,
    /// Execution timing.
    pub execution: ExecutionConfig,
    /// Request budgets of the member doors (HTTP and gRPC).
    pub doors: DoorsConfig,
    /// Bounds on the port's connections: how many, and how long each may stay silent.
    pub connections: ConnectionsConfig,
    /// How long one actor waits for another's answer.
    pub actors: ActorsConfig,
    /// The model provider table (see README, "Model providers").
    pub providers: ProviderTable,
    /// TLS on the one port (gRPC and HTTP alike). Default: off, plaintext.
    pub tls: TlsConfig,
    /// Several nodes on one PostgreSQL database: the serve lease's term.
    pub cluster: ClusterConfig,
}

/// Several nodes on one PostgreSQL database (`docs/cluster.md`). Ignored on SQLite, which one
/// node serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// The serve lease's term, in milliseconds: the holder renews it every quarter of this, a
    /// standby takes over once it lapses, and a holder that could not renew for this long stops
    /// driving work. A node that dies is replaced within about this time plus a quarter of it.
    /// Default 5000; 500 to 60000.
    pub lease_ms: u64,
    /// The address other machines reach this node's port at, `HOST:PORT` (at most 255 bytes),
    /// as the cluster listing shows it. Default: unset, the address the node listens on (which
    /// says little when that is `0.0.0.0`). Per node: set it with `--advertise-address` or
    /// `NEXUS_ADVERTISE_ADDRESS` where one config file serves every node.
    pub advertise_address: Option<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig { lease_ms: crate::store::lease::LEASE_MS_DEFAULT, advertise_address: None }
    }
}

/// Whether `address` is `HOST:PORT`: a non-empty host without whitespace, `/` or `@`, and a
/// port from 1 to 65535; at most 255 bytes.
fn is_host_and_port(address: &str) -> bool {
    let Some((host, port)) = address.rsplit_once(':') else { return false };
    address.len() <= 255
        && !host.is_empty()
        && !host.contains(|c: char| c.is_whitespace() || c.is_control() || c == '/' || c == '@')
        && port.parse::<u16>().is_ok_and(|port| port > 0)
}

impl ClusterConfig {
    /// The lease's term as a duration.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            data_dir: PathBuf::from("nexus-data"),
            store: StoreConfig::default(),
            runner: RunnerStreamConfig::default(),
            execution: ExecutionConfig::default(),
            doors: DoorsConfig::default(),
            connections: ConnectionsConfig::default(),
            actors: ActorsConfig::default(),
            providers: ProviderTable::default(),
            tls: TlsConfig::default(),
            cluster: ClusterConfig::default(),
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
    /// The interval between two `task_progress` items of one task on its execution's feed, in
    /// milliseconds; progress frames in between are coalesced, the newest winning
    /// (`docs/executions.md`, "Events"). Default 1000; at least 250 (smaller values act as 250).
    pub progress_interval_ms: u64,
}

impl Default for RunnerStreamConfig {
    fn default() -> Self {
        RunnerStreamConfig {
            ping_interval_ms: 15_000,
            liveness_timeout_ms: 45_000,
            http2_keepalive_interval_ms: 20_000,
            http2_keepalive_timeout_ms: 10_000,
            max_frame_bytes: 8 * 1024 * 1024,
            progress_interval_ms: 1_000,
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

/// The default of `[execution] approval_hold_ms`: a parked call waits 24 hours for a decision.
pub const APPROVAL_HOLD_MS: u64 = 86_400_000;
/// The default of `[execution] ask_hold_ms`: a call of `ask` waits 24 hours for an answer.
pub const ASK_HOLD_MS: u64 = 86_400_000;
/// The default of `[execution] stop_drain_ms`: a forced stop waits 30 s for its runners' tasks.
pub const STOP_DRAIN_MS: u64 = 30_000;
/// The default of `[execution] compaction_threshold_percent`: compaction runs when the next
/// request would fill more than 80 % of the model's context window.
pub const COMPACTION_THRESHOLD_PERCENT: u64 = 80;
/// The default of `[execution] request_bytes_bound`: the byte bound of one model request's
/// canonical JSON, 8 MiB.
pub const REQUEST_BYTES_BOUND: u64 = 8 * 1024 * 1024;

/// The default of `[execution] workspace_name`.
pub const DEFAULT_WORKSPACE_NAME: &str = "default";
/// The longest `[execution] workspace_name`, in bytes.
pub const WORKSPACE_NAME_BOUND: usize = 128;

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
    /// Longest `Retry-After` of a provider's 429 that a model call waits out before its next
    /// attempt, in milliseconds; a longer one waits this long (`docs/executions.md`, "Models": a
    /// 429 retries within budget and never falls back). Default 60000.
    pub model_retry_after_max_ms: u64,
    /// Park of a runner task whose tool announced no `timeout_ms`, in milliseconds.
    /// Default 600000 (the kernel default of 10 minutes).
    pub default_task_timeout_ms: u64,
    /// How long a task parked in `needs_approval` waits for a decision before it settles
    /// `timed_out` with `approval_expired`, in milliseconds (`docs/executions.md`, "Approval").
    /// Default 86400000 (24 hours, [`APPROVAL_HOLD_MS`]).
    pub approval_hold_ms: u64,
    /// How long a call of the `ask` kernel tool waits `awaiting_input` for a person's answer
    /// before it settles `timed_out` with `ask_expired`, in milliseconds (`docs/kernel-tools.md`,
    /// "ask"). The hold starts when the call is asked (after its approval, when it needed one)
    /// and freezes while the execution is paused. Default 86400000 (24 hours, [`ASK_HOLD_MS`]).
    pub ask_hold_ms: u64,
    /// How long a forced stop waits in `canceling` for the runners' tasks to settle before the
    /// execution ends `canceled` anyway, in milliseconds (`docs/executions.md`, "Control").
    /// A graceful stop waits for its dispatched tasks' own deadlines instead. Default 30000.
    pub stop_drain_ms: u64,
    /// How much of the model's context window (`context_window_tokens` of its provider table entry)
    /// the next request may fill before compaction runs first, in percent, 1 to 100
    /// (`docs/executions.md`, "Compaction", trigger `usage`: the provider's own input token count
    /// of the last round plus the estimated tail). Default 80.
    pub compaction_threshold_percent: u64,
    /// The byte bound of one model request's canonical JSON (messages and tools), in bytes; a
    /// larger request is compacted first (`docs/executions.md`, "Compaction", trigger `wall`).
    /// Default 8388608 (8 MiB).
    pub request_bytes_bound: u64,
    /// The workspace's name, rendered for `{{workspace}}` in prompt documents
    /// (`docs/prompt.md`, "Macros"): 1 to 128 bytes of printable text. Default `default`.
    pub workspace_name: String,
}

impl Default for ExecutionConfig {
    fn default() -> Self {
        ExecutionConfig {
            model_attempts: 3,
            model_retry_min_delay_ms: 500,
            model_retry_max_delay_ms: 10_000,
            model_retry_after_max_ms: 60_000,
            default_task_timeout_ms: crate::declaration::DEFAULT_TIMEOUT_MS,
            approval_hold_ms: APPROVAL_HOLD_MS,
            ask_hold_ms: ASK_HOLD_MS,
            stop_drain_ms: STOP_DRAIN_MS,
            compaction_threshold_percent: COMPACTION_THRESHOLD_PERCENT,
            request_bytes_bound: REQUEST_BYTES_BOUND,
            workspace_name: DEFAULT_WORKSPACE_NAME.to_owned(),
        }
    }
}

impl ExecutionConfig {
    /// The retry policy of one model call.
    #[must_use]
    pub fn retry_policy(&self) -> crate::model::RetryPolicy {
        crate::model::RetryPolicy {
            attempts: self.model_attempts.max(1),
            min_delay: Duration::from_millis(self.model_retry_min_delay_ms),
            max_delay: Duration::from_millis(self.model_retry_max_delay_ms),
            retry_after_cap: Duration::from_millis(self.model_retry_after_max_ms),
        }
    }
}

/// How long a caller waits for an actor's answer (`docs/architecture.md`, "Handles").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ActorsConfig {
    /// The deadline of every call to an actor (a door asking an execution to stop, a stream's
    /// hello waiting for its inbox), in milliseconds. A call past it answers `unavailable`; what
    /// the actor did is then unknown, and the caller reads the state again. Default 30000.
    pub call_timeout_ms: u64,
}

impl Default for ActorsConfig {
    fn default() -> Self {
        ActorsConfig { call_timeout_ms: 30_000 }
    }
}

impl ActorsConfig {
    /// The call deadline as a duration.
    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms.max(1))
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
    /// Failed credentials (unknown, expired, revoked, of the other plane) one source address (an
    /// IPv4 address, an IPv6 /64) may present at once, on every door and the runner stream; past
    /// it, its credentials are refused 429 `rate_limited` unread, except one that already
    /// succeeded from there ([`crate::auth::throttle`]). Default 20.
    pub credential_failure_burst: u32,
    /// How many failures a source's budget gets back per minute. Default 10 (one every 6 s).
    pub credential_failures_per_minute: u32,
}

impl Default for DoorsConfig {
    fn default() -> Self {
        DoorsConfig {
            requests_per_minute: 1200,
            burst: 120,
            credential_failure_burst: 20,
            credential_failures_per_minute: 10,
        }
    }
}

/// The default of `[connections] first_byte_timeout_ms`: 10 s from accept to the first byte.
pub const FIRST_BYTE_TIMEOUT_MS: u64 = 10_000;
/// The default of `[connections] request_head_timeout_ms`: 30 s from accept to a whole request.
pub const REQUEST_HEAD_TIMEOUT_MS: u64 = 30_000;
/// The default of `[connections] idle_timeout_ms`: 120 s without a request in flight.
pub const IDLE_TIMEOUT_MS: u64 = 120_000;
/// The largest `[connections] max_connections` that defaults to (and may be set): a million.
pub const MAX_CONNECTIONS_BOUND: u32 = 1_000_000;

/// Bounds on the connections of the one port, plaintext and TLS, HTTP/1 and HTTP/2 alike
/// (`docs/architecture.md`, "Doors under pressure"). A connection is *authenticated* once one of
/// its requests presented a valid credential (a member's bearer token, or a runner's Hello); the
/// others are shed first when the cap is reached. The flag `--max-connections` (or
/// `NEXUS_MAX_CONNECTIONS`) overrides `max_connections`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionsConfig {
    /// Most connections open at once, a count from 1 to 1000000. At the cap, a new connection
    /// closes the oldest one that has not authenticated yet; when every open one has, the new
    /// one is closed at once. Default: unset, which is three quarters of the process's
    /// open-file limit (`ulimit -n`) read at start, the rest left to the store, the log and
    /// files: 768 under the common limit of 1024, 15000 under 20000.
    pub max_connections: Option<u32>,
    /// A connection that sends no byte this long after it was accepted is closed, in
    /// milliseconds. Default 10000.
    pub first_byte_timeout_ms: u64,
    /// A connection whose first request has not fully arrived this long after it was accepted
    /// is closed, in milliseconds: the TLS handshake, the HTTP/2 preface and the request's head
    /// all count (the HTTP/1 head of each later request is bounded to 30 s by the HTTP library
    /// besides). At least `first_byte_timeout_ms`. Default 30000.
    pub request_head_timeout_ms: u64,
    /// A connection that has been served, with no request in flight for this long, is closed, in
    /// milliseconds (a runner's stream and a followed event stream are requests in flight; a
    /// keep-alive connection between requests is not). Default 120000.
    pub idle_timeout_ms: u64,
}

impl Default for ConnectionsConfig {
    fn default() -> Self {
        ConnectionsConfig {
            max_connections: None,
            first_byte_timeout_ms: FIRST_BYTE_TIMEOUT_MS,
            request_head_timeout_ms: REQUEST_HEAD_TIMEOUT_MS,
            idle_timeout_ms: IDLE_TIMEOUT_MS,
        }
    }
}

impl ConnectionsConfig {
    /// The cap in force: `max_connections`, else three quarters of `open_file_limit` (the soft
    /// `RLIMIT_NOFILE`; `None` when it cannot be read, taken as 1024), at least 1 and at most
    /// [`MAX_CONNECTIONS_BOUND`].
    pub fn cap(&self, open_file_limit: Option<u64>) -> usize {
        let derived = || {
            let limit = open_file_limit.unwrap_or(1024);
            let cap = limit.saturating_mul(3) / 4;
            u32::try_from(cap).unwrap_or(u32::MAX).clamp(1, MAX_CONNECTIONS_BOUND)
        };
        usize::try_from(self.max_connections.unwrap_or_else(derived)).unwrap_or(usize::MAX)
    }

    /// The first-byte bound as a duration.
    pub fn first_byte_timeout(&self) -> Duration {
        Duration::from_millis(self.first_byte_timeout_ms.max(1))
    }

    /// The request-head bound as a duration.
    pub fn request_head_timeout(&self) -> Duration {
        Duration::from_millis(self.request_head_timeout_ms.max(1))
    }

    /// The idle bound as a duration.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms.max(1))
    }
}

/// TLS on the one port. With `cert` and `key` set, every connection (runners, gRPC clients and
/// the HTTP/JSON doors) is TLS, offering ALPN `h2` and `http/1.1`; without them nexus serves
/// plaintext, for development on a trusted network. A relative path in the config file is
/// relative to the file's directory (one given by flag, to the working directory); the files are
/// read once at start-up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// The server's certificate chain, PEM, leaf first. Set together with `key`. Default: none
    /// (plaintext).
    pub cert: Option<PathBuf>,
    /// The server's private key, PEM (PKCS#8, PKCS#1 or SEC1). Set together with `cert`.
    /// Default: none.
    pub key: Option<PathBuf>,
    /// CA certificates, PEM, that client certificates must chain to (mutual TLS). Needs `cert`
    /// and `key`. Default: none (no client certificate is asked for).
    pub client_ca: Option<PathBuf>,
    /// Who must present a client certificate that chains to `client_ca`. Default: unset, which
    /// means `runners` once `client_ca` is set. It means nothing without `client_ca` (there is
    /// nothing to verify a certificate against), so setting either value without `client_ca` is
    /// refused rather than serving with no client-certificate check; use [`Self::client_auth`]
    /// for the value in force.
    pub client_auth: Option<ClientAuth>,
    /// Bound on one TLS handshake, in milliseconds; a client still handshaking after it is
    /// dropped. Default 10000.
    pub handshake_timeout_ms: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig { cert: None, key: None, client_ca: None, client_auth: None, handshake_timeout_ms: 10_000 }
    }
}

impl TlsConfig {
    /// Whether TLS is on (`cert` and `key` are set).
    pub fn enabled(&self) -> bool {
        self.cert.is_some() && self.key.is_some()
    }

    /// Who must present a client certificate under mutual TLS: `client_auth`, else `runners`.
    pub fn client_auth(&self) -> ClientAuth {
        self.client_auth.unwrap_or_default()
    }

    /// The handshake bound as a duration.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms.max(1))
    }
}

/// Who must present a client certificate that chains to `tls.client_ca`. A certificate that is
/// presented is always verified; one that does not chain fails the handshake. Either value needs
/// `tls.client_ca`: without it nexus would check no certificate at all, so it refuses to start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// The runner stream (`nexus.runner.v1.RunnerService`) is refused with `unauthorized` on a
    /// connection without a client certificate; the member doors (HTTP/JSON and
    /// `nexus.agent.v1.AgentService`), health and reflection need none, so clients keep their
    /// bearer tokens only.
    #[default]
    Runners,
    /// Every connection must present one: a handshake without it is refused, members included.
    Required,
}

impl ClientAuth {
    /// The word the config file uses: `runners` or `required`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientAuth::Runners => "runners",
            ClientAuth::Required => "required",
        }
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
    /// Loads the defaults overlaid by a TOML file, when one is given. The relations between
    /// fields are not checked here: flags and the environment may still complete the file (a
    /// `client_auth` whose `client_ca` comes from `--tls-client-ca`), so the caller runs
    /// [`Self::validate`] once every layer is applied.
    ///
    /// # Errors
    /// [`ConfigError`] when the file is unreadable or not valid TOML for this struct (unknown
    /// keys included).
    pub fn load(path: Option<&Path>) -> Result<ServerConfig, ConfigError> {
        let Some(path) = path else { return Ok(ServerConfig::default()) };
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let mut config =
            Self::from_toml(&text).map_err(|source| ConfigError::Parse { path: path.to_owned(), source })?;
        let base = path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
        config.resolve_paths(base, text_sets_data_dir(&text));
        Ok(config)
    }

    /// Makes every relative path the file names relative to `base`, the directory the file is in,
    /// so a config file means the same whichever directory nexus runs in: `data_dir` (only when
    /// the file sets it; the default `./nexus-data` stays relative to the working directory), the
    /// `[tls]` files and each scripted model's `script`. Paths given by flags or the environment
    /// are applied after this and stay relative to the working directory.
    fn resolve_paths(&mut self, base: &Path, data_dir_from_file: bool) {
        let resolve = |path: &mut PathBuf| {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        };
        if data_dir_from_file {
            resolve(&mut self.data_dir);
        }
        for path in [&mut self.tls.cert, &mut self.tls.key, &mut self.tls.client_ca].into_iter().flatten() {
            resolve(path);
        }
        for provider in self.providers.providers.values_mut() {
            for model in provider.models.values_mut() {
                if let Some(script) = model.script.as_mut() {
                    resolve(script);
                }
            }
        }
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
        // Bounded like an announced `timeout_ms`: no deadline computed from them can overflow or
        // reach the frozen range (`docs/architecture.md`, "Time").
        for (field, ms) in [
            ("execution.default_task_timeout_ms", self.execution.default_task_timeout_ms),
            ("execution.approval_hold_ms", self.execution.approval_hold_ms),
            ("execution.ask_hold_ms", self.execution.ask_hold_ms),
            ("execution.stop_drain_ms", self.execution.stop_drain_ms),
        ] {
            if !(1..=TIMEOUT_BOUND_MS).contains(&ms) {
                return invalid(field, "must be from 1 to 604800000 milliseconds (7 days)");
            }
        }
        if !(1..=100).contains(&self.execution.compaction_threshold_percent) {
            return invalid("execution.compaction_threshold_percent", "must be a percentage from 1 to 100");
        }
        if self.execution.request_bytes_bound == 0 {
            return invalid("execution.request_bytes_bound", "must be positive");
        }
        let workspace = &self.execution.workspace_name;
        if workspace.trim().is_empty()
            || workspace.len() > WORKSPACE_NAME_BOUND
            || workspace.chars().any(char::is_control)
        {
            return invalid("execution.workspace_name", "must be 1 to 128 bytes of printable text");
        }
        if self.actors.call_timeout_ms == 0 {
            return invalid("actors.call_timeout_ms", "must be positive");
        }
        let lease = crate::store::lease::LEASE_MS_MIN..=crate::store::lease::LEASE_MS_MAX;
        if !lease.contains(&self.cluster.lease_ms) {
            return invalid("cluster.lease_ms", "must be from 500 to 60000 milliseconds");
        }
        if self.cluster.advertise_address.as_deref().is_some_and(|address| !is_host_and_port(address)) {
            return invalid(
                "cluster.advertise_address",
                "must be HOST:PORT (e.g. 10.0.0.11:7740 or node1.internal:7740), at most 255 bytes",
            );
        }
        if self.doors.requests_per_minute == 0 || self.doors.burst == 0 {
            return invalid("doors", "requests_per_minute and burst must be positive");
        }
        if self.doors.credential_failure_burst == 0 || self.doors.credential_failures_per_minute == 0 {
            return invalid("doors", "credential_failure_burst and credential_failures_per_minute must be positive");
        }
        let connections = &self.connections;
        if connections.max_connections.is_some_and(|max| !(1..=MAX_CONNECTIONS_BOUND).contains(&max)) {
            return invalid("connections.max_connections", "must be from 1 to 1000000 (unset: 3/4 of `ulimit -n`)");
        }
        for (field, ms) in [
            ("connections.first_byte_timeout_ms", connections.first_byte_timeout_ms),
            ("connections.request_head_timeout_ms", connections.request_head_timeout_ms),
            ("connections.idle_timeout_ms", connections.idle_timeout_ms),
        ] {
            if !(1..=TIMEOUT_BOUND_MS).contains(&ms) {
                return invalid(field, "must be from 1 to 604800000 milliseconds (7 days)");
            }
        }
        if connections.request_head_timeout_ms < connections.first_byte_timeout_ms {
            return invalid(
                "connections.request_head_timeout_ms",
                "must be at least connections.first_byte_timeout_ms",
            );
        }
        let store = &self.store;
        if store.database_url.as_deref().is_some_and(|url| !crate::store::is_postgres_url(url)) {
            return invalid(
                "store.database_url",
                "must be a postgres:// or postgresql:// URL (leave it unset for SQLite in data_dir)",
            );
        }
        if store.max_connections == Some(0) || store.acquire_timeout_ms == 0 {
            return invalid("store", "max_connections and acquire_timeout_ms must be positive");
        }
        let tls = &self.tls;
        if tls.cert.is_some() != tls.key.is_some() {
            return invalid("tls.cert", "and tls.key must be set together");
        }
        if tls.client_auth.is_some() && tls.client_ca.is_none() {
            return invalid(
                "tls.client_auth",
                "needs tls.client_ca: set client_ca (or --tls-client-ca) to the CA that client certificates must chain to, or remove client_auth",
            );
        }
        if tls.client_ca.is_some() && !tls.enabled() {
            return invalid("tls.client_ca", "needs tls.cert and tls.key (mutual TLS runs over TLS)");
        }
        if tls.handshake_timeout_ms == 0 {
            return invalid("tls.handshake_timeout_ms", "must be positive");
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

/// Whether a configuration text sets the top-level `data_dir` key (it parsed as a
/// [`ServerConfig`] already, so it is a valid TOML table).
fn text_sets_data_dir(text: &str) -> bool {
    text.parse::<toml::Table>().is_ok_and(|table| table.contains_key("data_dir"))
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
        assert_eq!(config.connections, ConnectionsConfig::default());
        assert_eq!(config.tls, TlsConfig::default());
        assert_eq!(config.store, StoreConfig::default());
        assert!(!config.tls.enabled());
        assert!(config.validate().is_ok(), "the example must start as shipped");
        assert_eq!(config.data_dir, PathBuf::from("nexus-data"));
        let names: Vec<&str> = config.providers.providers.keys().map(String::as_str).collect();
        assert_eq!(names, ["anthropic", "local", "openrouter", "scripted"]);
        assert!(!config.providers.providers["local"].enabled);
        assert_eq!(config.providers.providers["anthropic"].kind, crate::model::ProviderKind::Anthropic);
    }

    #[test]
    fn the_cluster_example_config_parses_and_sets_the_lease() {
        let config =
            ServerConfig::from_toml(include_str!("../../deploy/cluster/nexus.toml")).expect("cluster example parses");
        assert_eq!(config.cluster.lease_ms, 5_000);
        assert_eq!(config.cluster.lease(), Duration::from_millis(5_000));
        assert_eq!(config.store.backend(), crate::store::StoreBackend::Postgres);
        assert_eq!(config.store.database_url.as_deref(), Some("postgres://nexus@db.internal:5432/nexus"));
        assert_eq!(config.store.pool_size(), 16);
        assert_eq!(config.runner, RunnerStreamConfig { ping_interval_ms: 2_000, ..RunnerStreamConfig::default() });
        assert!(config.validate().is_ok(), "the cluster example must start as shipped");
        assert_eq!(config.data_dir, PathBuf::from("nexus-data"), "each node's data dir comes from its unit");
        assert_eq!(config.providers, ProviderTable::default());
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

    #[test]
    fn the_park_hold_and_drain_are_bounded_like_an_announced_timeout() {
        for field in ["default_task_timeout_ms", "approval_hold_ms", "ask_hold_ms", "stop_drain_ms"] {
            for (ms, accepted) in [(0, false), (1, true), (TIMEOUT_BOUND_MS, true), (TIMEOUT_BOUND_MS + 1, false)] {
                let config = ServerConfig::from_toml(&format!("[execution]\n{field} = {ms}\n")).expect("parses");
                match config.validate() {
                    Ok(()) => assert!(accepted, "{field} = {ms} was accepted"),
                    Err(ConfigError::Invalid { field: named, .. }) => {
                        assert!(!accepted, "{field} = {ms} was refused");
                        assert_eq!(named, format!("execution.{field}"));
                    }
                    Err(other) => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn store_settings_select_the_backend_and_validate() {
        let default = ServerConfig::default();
        assert_eq!(default.store.backend(), crate::store::StoreBackend::Sqlite);
        assert_eq!(default.store.pool_size(), 4);
        let table = [
            ("[store]\ndatabase_url = \"postgres://nexus@127.0.0.1:5432/nexus\"\n", None),
            ("[store]\ndatabase_url = \"postgresql://db/nexus?sslmode=require\"\nmax_connections = 32\n", None),
            ("[store]\ndatabase_url = \"sqlite://nexus.db\"\n", Some("store.database_url")),
            ("[store]\nmax_connections = 0\n", Some("store")),
            ("[store]\nacquire_timeout_ms = 0\n", Some("store")),
        ];
        for (text, refused) in table {
            let config = ServerConfig::from_toml(text).expect(text);
            match (config.validate(), refused) {
                (Ok(()), None) => assert_eq!(config.store.backend(), crate::store::StoreBackend::Postgres, "{text}"),
                (Err(ConfigError::Invalid { field, .. }), Some(expected)) => assert_eq!(field, expected, "{text}"),
                (other, _) => panic!("{text}: {other:?}"),
            }
        }
        let postgres =
            ServerConfig::from_toml("[store]\ndatabase_url = \"postgres://u:secret@h/d\"\n").expect("parses");
        assert_eq!(postgres.store.pool_size(), 16);
        assert!(!format!("{postgres:?}").contains("secret"), "the password reached Debug output");
        assert!(ServerConfig::from_toml("[store]\nurl = \"postgres://h/d\"\n").is_err());
    }

    #[test]
    fn the_lease_term_is_bounded() {
        for (text, valid) in [
            ("[cluster]\nlease_ms = 5000\n", true),
            ("[cluster]\nlease_ms = 500\n", true),
            ("[cluster]\nlease_ms = 60000\n", true),
            ("[cluster]\nlease_ms = 499\n", false),
            ("[cluster]\nlease_ms = 60001\n", false),
        ] {
            let config = ServerConfig::from_toml(text).expect(text);
            match config.validate() {
                Ok(()) => assert!(valid, "{text}"),
                Err(ConfigError::Invalid { field, .. }) => {
                    assert!(!valid, "{text}");
                    assert_eq!(field, "cluster.lease_ms");
                }
                Err(other) => panic!("{text}: {other:?}"),
            }
        }
        for (address, ok) in [
            ("10.0.0.11:7740", true),
            ("node1.internal:7740", true),
            ("[fd00::11]:7740", true),
            ("10.0.0.11", false),
            ("10.0.0.11:0", false),
            ("10.0.0.11:70000", false),
            (":7740", false),
            ("http://10.0.0.11:7740", false),
            ("node one:7740", false),
        ] {
            let mut config = ServerConfig::default();
            config.cluster.advertise_address = Some(address.to_owned());
            match config.validate() {
                Ok(()) => assert!(ok, "{address} was accepted"),
                Err(ConfigError::Invalid { field, .. }) => {
                    assert!(!ok, "{address} was refused");
                    assert_eq!(field, "cluster.advertise_address");
                }
                Err(other) => panic!("{address}: {other}"),
            }
        }
        let long = format!("{}:7740", "h".repeat(251));
        let mut config = ServerConfig::default();
        config.cluster.advertise_address = Some(long);
        assert!(config.validate().is_err(), "an address over 255 bytes was accepted");
        assert_eq!(ServerConfig::default().cluster.lease_ms, 5_000);
        assert!(ServerConfig::from_toml("[cluster]\nlease = 5000\n").is_err(), "an unknown key was accepted");
    }

    #[test]
    fn tls_settings_parse_and_validate() {
        let table = [
            ("[tls]\ncert = \"s.pem\"\nkey = \"s.key\"\n", None),
            ("[tls]\ncert = \"s.pem\"\nkey = \"s.key\"\nclient_ca = \"ca.pem\"\nclient_auth = \"required\"\n", None),
            ("[tls]\ncert = \"s.pem\"\n", Some("tls.cert")),
            ("[tls]\nkey = \"s.key\"\n", Some("tls.cert")),
            ("[tls]\nclient_ca = \"ca.pem\"\n", Some("tls.client_ca")),
            // client_auth without client_ca would serve TLS with no client-certificate check.
            ("[tls]\ncert = \"s.pem\"\nkey = \"s.key\"\nclient_auth = \"required\"\n", Some("tls.client_auth")),
            ("[tls]\ncert = \"s.pem\"\nkey = \"s.key\"\nclient_auth = \"runners\"\n", Some("tls.client_auth")),
            ("[tls]\nclient_auth = \"required\"\n", Some("tls.client_auth")),
            ("[tls]\nhandshake_timeout_ms = 0\n", Some("tls.handshake_timeout_ms")),
        ];
        for (text, refused) in table {
            let config = ServerConfig::from_toml(text).expect(text);
            match (config.validate(), refused) {
                (Ok(()), None) => {}
                (Err(ConfigError::Invalid { field, .. }), Some(expected)) => assert_eq!(field, expected, "{text}"),
                (other, _) => panic!("{text}: {other:?}"),
            }
        }
        let mutual = ServerConfig::from_toml("[tls]\ncert = \"a\"\nkey = \"b\"\nclient_ca = \"c\"\n").expect("parses");
        assert!(mutual.tls.enabled());
        assert_eq!(mutual.tls.client_auth(), ClientAuth::Runners);
        assert!(ServerConfig::from_toml("[tls]\nclient_auth = \"sometimes\"\n").is_err());
        assert!(ServerConfig::from_toml("[tls]\ncertificate = \"a\"\n").is_err());
    }

    #[test]
    fn relative_paths_in_a_config_file_are_relative_to_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = dir.path().join("conf");
        std::fs::create_dir(&conf).expect("mkdir");
        let file = conf.join("nexus.toml");
        std::fs::write(
            &file,
            "data_dir = \"data\"\n[tls]\ncert = \"tls/server.pem\"\nkey = \"/etc/nexus/server.key\"\n\
             [providers.scripted]\nkind = \"scripted\"\n[providers.scripted.models.slow]\nscript = \"../slow.json\"\n",
        )
        .expect("write");
        let config = ServerConfig::load(Some(&file)).expect("loads");
        assert_eq!(config.data_dir, conf.join("data"));
        assert_eq!(config.tls.cert, Some(conf.join("tls/server.pem")));
        assert_eq!(config.tls.key, Some(PathBuf::from("/etc/nexus/server.key")), "absolute paths stay");
        let script = config.providers.providers["scripted"].models["slow"].script.clone();
        assert_eq!(script, Some(conf.join("../slow.json")));

        // A file that leaves data_dir out keeps the default, relative to the working directory.
        std::fs::write(&file, "[doors]\nburst = 5\n").expect("write");
        assert_eq!(ServerConfig::load(Some(&file)).expect("loads").data_dir, PathBuf::from("nexus-data"));
    }

    #[test]
    fn the_example_config_names_scripts_that_exist_beside_it() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/nexus.toml");
        let config = ServerConfig::load(Some(&file)).expect("example loads");
        let scripted = &config.providers.providers["scripted"];
        for (name, model) in &scripted.models {
            if let Some(script) = &model.script {
                let text = std::fs::read_to_string(script)
                    .unwrap_or_else(|error| panic!("scripted/{name}: {}: {error}", script.display()));
                crate::model::scripted::Script::from_json(&text)
                    .unwrap_or_else(|error| panic!("scripted/{name}: {error}"));
            }
        }
        assert!(scripted.models["slow"].script.is_some() && scripted.models["quickstart"].script.is_some());
    }

    #[test]
    fn the_connection_cap_defaults_to_three_quarters_of_the_fd_limit_and_bounds_validate() {
        let default = ConnectionsConfig::default();
        assert_eq!(default.cap(Some(1024)), 768);
        assert_eq!(default.cap(Some(20_000)), 15_000);
        assert_eq!(default.cap(None), 768, "an unreadable limit reads as 1024");
        assert_eq!(default.cap(Some(u64::MAX)), 1_000_000, "an unlimited process is bounded anyway");
        assert_eq!(default.cap(Some(1)), 1);
        let set = ConnectionsConfig { max_connections: Some(50), ..ConnectionsConfig::default() };
        assert_eq!(set.cap(Some(20_000)), 50, "a configured cap wins");
        let table = [
            ("[connections]\nmax_connections = 100\nidle_timeout_ms = 5000\n", None),
            ("[connections]\nfirst_byte_timeout_ms = 500\nrequest_head_timeout_ms = 500\n", None),
            ("[connections]\nmax_connections = 0\n", Some("connections.max_connections")),
            ("[connections]\nmax_connections = 1000001\n", Some("connections.max_connections")),
            ("[connections]\nfirst_byte_timeout_ms = 0\n", Some("connections.first_byte_timeout_ms")),
            ("[connections]\nidle_timeout_ms = 0\n", Some("connections.idle_timeout_ms")),
            ("[connections]\nidle_timeout_ms = 604800001\n", Some("connections.idle_timeout_ms")),
            ("[connections]\nrequest_head_timeout_ms = 5000\n", Some("connections.request_head_timeout_ms")),
        ];
        for (text, refused) in table {
            let config = ServerConfig::from_toml(text).expect(text);
            match (config.validate(), refused) {
                (Ok(()), None) => {}
                (Err(ConfigError::Invalid { field, .. }), Some(expected)) => assert_eq!(field, expected, "{text}"),
                (other, _) => panic!("{text}: {other:?}"),
            }
        }
        assert!(ServerConfig::from_toml("[connections]\nmax = 5\n").is_err(), "unknown keys are refused");
    }
}
