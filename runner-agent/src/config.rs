//! The agent's configuration: every field, its unit and its default, validated once by [`run`].
//!
//! [`run`]: crate::run

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use uuid::Uuid;

/// Default number of tools that run at once ([`AgentConfig::slots`]).
pub const DEFAULT_SLOTS: usize = 4;
/// Default `timeout_ms` announced for `bash`, in milliseconds (10 minutes).
pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 600_000;
/// The largest `--tool-timeout-ms`, in milliseconds (7 days): nexus bounds an announced
/// `timeout_ms` there.
pub const MAX_TOOL_TIMEOUT_MS: u64 = 604_800_000;

/// The transport credential a runner presents in `Hello`.
///
/// Its `Debug` and `Display` never show the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(String);

impl Credential {
    /// Wraps a credential, trimming surrounding whitespace.
    pub fn new(secret: impl Into<String>) -> Self {
        Credential(secret.into().trim().to_owned())
    }

    /// Reads a credential from a token file and trims surrounding whitespace.
    ///
    /// # Errors
    /// [`ConfigError::TokenFile`] when the file cannot be read, and
    /// [`ConfigError::EmptyCredential`] when it holds only whitespace.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|error| ConfigError::TokenFile { path: path.to_owned(), error })?;
        let credential = Credential::new(text);
        if credential.0.is_empty() {
            return Err(ConfigError::EmptyCredential);
        }
        Ok(credential)
    }

    /// The secret, for the `Hello` frame only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

/// Everything the agent needs to run. Build it with [`AgentConfig::new`], then adjust fields.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The nexus gRPC endpoints, e.g. `http://127.0.0.1:7300`, or `https://nexus.example:7740`
    /// with [`AgentConfig::tls`]: one, or up to [`NEXUS_URLS_MAX`] nodes of one cluster sharing
    /// a database (`docs/cluster.md`). The agent starts with the first, and when a stream drops
    /// or cannot be opened it moves on to the next in the list, round after round. Every URL
    /// uses the same scheme, since the TLS options apply to all. Required.
    pub nexus_urls: Vec<String>,
    /// This runner's executor public id (`Hello.executor_public_id`). Required.
    pub runner_id: Uuid,
    /// The executor-transport credential (`Hello.credential`). Required.
    pub credential: Credential,
    /// The directory tools run in and that the file tools are confined to. Required; it must
    /// exist.
    pub workdir: PathBuf,
    /// Where the journal lives. Default: [`default_state_dir`] for `runner_id`; created if
    /// missing. [`run`](crate::run) locks it for its lifetime, so one agent at a time uses it.
    pub state_dir: PathBuf,
    /// How many tools run at once; the agent claims no more than it can start. Default 4, at
    /// least 1.
    pub slots: usize,
    /// The `timeout_ms` announced for `bash`, in milliseconds; a call's own `timeout_ms` can only
    /// lower it. Default 600000 (10 minutes), at least 1.
    pub tool_timeout_ms: u64,
    /// How long a stream may stay silent (no frame, not even a ping) before it counts as dead.
    /// Raised to three ping intervals when nexus announces a slower ping. Default 45 s.
    pub liveness_timeout: Duration,
    /// Bound on opening the connection: TCP and the HTTP/2 handshake. Default 10 s
    /// (`--connect-timeout-ms`).
    pub connect_timeout: Duration,
    /// Bound on getting `welcome` (or a refusal) after opening the stream. Default 10 s
    /// (`--handshake-timeout-ms`).
    pub handshake_timeout: Duration,
    /// Bound on nexus answering any request on a live stream; past it the stream is dropped and
    /// reopened. Default 30 s.
    pub request_timeout: Duration,
    /// First reconnect delay, before jitter. Default 200 ms.
    pub reconnect_min_delay: Duration,
    /// Largest reconnect delay, jitter included. Default 10 s.
    pub reconnect_max_delay: Duration,
    /// A connection that lasted this long resets the reconnect backoff. Default 30 s.
    pub healthy_after: Duration,
    /// Period of the maintenance pass: claim-status probes for running tasks (cancellation
    /// detection), re-sending unacknowledged commits, pruning expired journal entries.
    /// Default 5 s.
    pub poll_interval: Duration,
    /// A running tool is stopped this long before its claim deadline so that its commit can still
    /// land in time. Default 1 s.
    pub commit_margin: Duration,
    /// After shutdown is requested: how long to wait for stopped tools to be journaled and their
    /// commits answered before exiting anyway. Default 5 s.
    pub shutdown_grace: Duration,
    /// TLS towards nexus; needs an `https://` URL. Default: none (plaintext `http://`).
    pub tls: TlsOptions,
    /// A directory of skills (`--skills-dir`): each `<name>/SKILL.md` is announced as a document,
    /// with the `skill` tool that returns its content (`docs/kernel-tools.md`, "skill"). Read
    /// again at every connect. Default: none (no documents, no `skill`); when set it must be a
    /// directory.
    pub skills_dir: Option<PathBuf>,
    /// The tools file (`--tools-file`, TOML): command tools, MCP servers and settings of the
    /// built-ins (`docs/runner-tools.md`). Read when [`run`](crate::run) starts (a bad file stops
    /// it with [`ConfigError::ToolsFile`] before anything connects), again on SIGHUP and when
    /// its content changes (checked every `poll_interval`). Default: none (the built-ins only).
    pub tools_file: Option<PathBuf>,
}

/// TLS towards nexus. The files are read once, when [`run`](crate::run) starts; an unreadable or
/// invalid one stops it with [`ConfigError::TlsFile`] naming the path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// CA certificates, PEM, that nexus's certificate must chain to (`--tls-ca`). Required for an
    /// `https://` URL: there is no implicit trust in the platform's roots (for a publicly signed
    /// nexus, pass the system bundle, e.g. `/etc/ssl/certs/ca-certificates.crt`). Default: none.
    pub ca: Option<PathBuf>,
    /// This runner's certificate chain, PEM, leaf first, for mutual TLS (`--tls-cert`). Set
    /// together with `key`. Default: none (no client certificate).
    pub cert: Option<PathBuf>,
    /// This runner's private key, PEM: PKCS#8, PKCS#1 or SEC1 (`--tls-key`). Default: none.
    pub key: Option<PathBuf>,
    /// The name nexus's certificate must carry, when it is not the URL's host
    /// (`--tls-server-name`). Default: the URL's host.
    pub server_name: Option<String>,
}

impl TlsOptions {
    /// Whether any TLS option is set.
    fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some() || self.server_name.is_some()
    }
}

impl AgentConfig {
    /// A configuration for one nexus node at `nexus_url`, with every optional field at its
    /// default.
    pub fn new(
        nexus_url: impl Into<String>,
        runner_id: Uuid,
        credential: Credential,
        workdir: impl Into<PathBuf>,
    ) -> Self {
        Self::with_urls(vec![nexus_url.into()], runner_id, credential, workdir)
    }

    /// A configuration for the nodes at `nexus_urls` (tried in this order; checked when
    /// the agent starts: 1 to [`NEXUS_URLS_MAX`], each once, one scheme), with every
    /// optional field at its default (`docs/cluster.md`, "Runners").
    pub fn with_urls(
        nexus_urls: Vec<String>,
        runner_id: Uuid,
        credential: Credential,
        workdir: impl Into<PathBuf>,
    ) -> Self {
        AgentConfig {
            nexus_urls,
            runner_id,
            credential,
            workdir: workdir.into(),
            state_dir: default_state_dir(runner_id),
            slots: DEFAULT_SLOTS,
            tool_timeout_ms: DEFAULT_TOOL_TIMEOUT_MS,
            liveness_timeout: Duration::from_secs(45),
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            reconnect_min_delay: Duration::from_millis(200),
            reconnect_max_delay: Duration::from_secs(10),
            healthy_after: Duration::from_secs(30),
            poll_interval: Duration::from_secs(5),
            commit_margin: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(5),
            tls: TlsOptions::default(),
            skills_dir: None,
            tools_file: None,
        }
    }

    /// Checks the values that need no I/O.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.credential.0.is_empty() {
            return Err(ConfigError::EmptyCredential);
        }
        let positive = [
            ("slots", self.slots > 0),
            ("tool_timeout_ms", self.tool_timeout_ms > 0),
            ("liveness_timeout", !self.liveness_timeout.is_zero()),
            ("connect_timeout", !self.connect_timeout.is_zero()),
            ("handshake_timeout", !self.handshake_timeout.is_zero()),
            ("request_timeout", !self.request_timeout.is_zero()),
            ("reconnect_min_delay", !self.reconnect_min_delay.is_zero()),
            ("poll_interval", !self.poll_interval.is_zero()),
        ];
        if let Some((field, _)) = positive.iter().find(|(_, ok)| !ok) {
            return Err(ConfigError::Invalid { field, reason: "must be positive" });
        }
        if self.tool_timeout_ms > MAX_TOOL_TIMEOUT_MS {
            // nexus refuses an announced `timeout_ms` above it (`docs/protocol.md`, "Announce").
            return Err(ConfigError::Invalid {
                field: "tool_timeout_ms",
                reason: "must be at most 604800000 (7 days)",
            });
        }
        if self.reconnect_max_delay < self.reconnect_min_delay {
            return Err(ConfigError::Invalid {
                field: "reconnect_max_delay",
                reason: "must not be below reconnect_min_delay",
            });
        }
        if self.tls.cert.is_some() != self.tls.key.is_some() {
            return Err(ConfigError::Invalid { field: "tls.cert", reason: "and tls.key must be set together" });
        }
        check_urls(&self.nexus_urls, &self.tls)
    }
}

/// The most nexus URLs one agent takes (`--nexus` given several times or comma-separated).
pub const NEXUS_URLS_MAX: usize = 16;

/// One to [`NEXUS_URLS_MAX`] URLs, none listed twice, all of one scheme, each valid on its own.
fn check_urls(urls: &[String], tls: &TlsOptions) -> Result<(), ConfigError> {
    let invalid = |url: &str, reason: String| Err(ConfigError::InvalidUrl { url: url.to_owned(), reason });
    let Some(first) = urls.first() else {
        return invalid("", "no nexus URL is given; pass --nexus http://HOST:PORT".to_owned());
    };
    if let Some(over) = urls.get(NEXUS_URLS_MAX) {
        return invalid(
            over,
            format!(
                "{} nexus URLs are given and this is number {}; at most {NEXUS_URLS_MAX} are taken",
                urls.len(),
                NEXUS_URLS_MAX + 1
            ),
        );
    }
    let scheme = |url: &str| url.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
    for (index, url) in urls.iter().enumerate() {
        if scheme(url) != scheme(first) && !url.is_empty() {
            return invalid(
                url,
                format!("every nexus URL must use the scheme of the first ({first}); the TLS options apply to all"),
            );
        }
        check_url(url, tls)?;
        let same = |other: &String| other.trim_end_matches('/') == url.trim_end_matches('/');
        if urls[..index].iter().any(same) {
            return invalid(url, "this nexus URL is listed twice".to_owned());
        }
    }
    Ok(())
}

/// The nexus URL must name its scheme, and the scheme must agree with the TLS options: `https://`
/// needs the CA to verify nexus against, and TLS options beside an `http://` URL are refused
/// rather than silently ignored while the stream goes in the clear.
fn check_url(url: &str, tls: &TlsOptions) -> Result<(), ConfigError> {
    let invalid = |reason: &str| Err(ConfigError::InvalidUrl { url: url.to_owned(), reason: reason.to_owned() });
    match url.split_once("://") {
        Some(("http", rest)) if !rest.is_empty() => {
            if tls.any() {
                return invalid(
                    "the TLS options (--tls-ca, --tls-cert, --tls-key, --tls-server-name) need an https:// URL",
                );
            }
            Ok(())
        }
        Some(("https", rest)) if !rest.is_empty() => {
            if tls.ca.is_none() {
                return invalid(
                    "an https:// URL needs --tls-ca FILE, the PEM CA certificates nexus's certificate chains to",
                );
            }
            Ok(())
        }
        Some(_) => invalid("the scheme must be http:// or https://"),
        None => invalid("the scheme is missing; write http://HOST:PORT or https://HOST:PORT"),
    }
}

/// The default state directory for a runner:
/// `$XDG_STATE_HOME/nexus-runner-agent/<runner-id>`, else
/// `$HOME/.local/state/nexus-runner-agent/<runner-id>`, else
/// `<system temp>/nexus-runner-agent/<runner-id>`. Relative or empty variables are ignored.
pub fn default_state_dir(runner_id: Uuid) -> PathBuf {
    state_dir_from(std::env::var_os("XDG_STATE_HOME"), std::env::var_os("HOME"), runner_id)
}

fn state_dir_from(xdg_state_home: Option<OsString>, home: Option<OsString>, runner_id: Uuid) -> PathBuf {
    let absolute = |value: Option<OsString>| value.map(PathBuf::from).filter(|p| p.is_absolute());
    let base = absolute(xdg_state_home)
        .or_else(|| absolute(home).map(|home| home.join(".local").join("state")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("nexus-runner-agent").join(runner_id.to_string())
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The token file could not be read.
    #[error("cannot read the token file {path}: {error}")]
    TokenFile {
        /// The file named by `--token-file`.
        path: PathBuf,
        /// The I/O failure.
        error: std::io::Error,
    },
    /// The credential is empty.
    #[error("the credential is empty")]
    EmptyCredential,
    /// A URL of `nexus_urls` is not a valid endpoint URI, or the list breaks its bounds.
    #[error("invalid nexus url {url:?}: {reason}")]
    InvalidUrl {
        /// The rejected value.
        url: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The skills directory does not exist or is not a directory.
    #[error("unusable skills directory {path}: {reason}")]
    SkillsDir {
        /// The configured skills directory.
        path: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
    /// The workdir does not exist or is not a directory.
    #[error("unusable workdir {path}: {reason}")]
    Workdir {
        /// The configured workdir.
        path: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
    /// A TLS file cannot be read or holds no usable PEM item.
    #[error("cannot use the {what} file {path}: {reason}")]
    TlsFile {
        /// The option that named it (`--tls-ca`, `--tls-cert`, `--tls-key`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The TLS options do not fit together (for example a key that does not match the
    /// certificate).
    #[error("invalid TLS options: {reason}")]
    Tls {
        /// Why.
        reason: String,
    },
    /// The tools file cannot be read or is refused; the error names the file, the line and
    /// column, and the field.
    #[error(transparent)]
    ToolsFile {
        /// What is wrong with it.
        #[from]
        source: crate::toolsfile::ToolsFileError,
    },
    /// A numeric field is out of range.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field's name in [`AgentConfig`].
        field: &'static str,
        /// What the value must satisfy.
        reason: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_dir_prefers_xdg_then_home_then_temp() {
        let id = Uuid::from_u128(7);
        let tail = Path::new("nexus-runner-agent").join(id.to_string());
        assert_eq!(state_dir_from(Some("/xdg".into()), Some("/home/u".into()), id), Path::new("/xdg").join(&tail));
        assert_eq!(state_dir_from(None, Some("/home/u".into()), id), Path::new("/home/u/.local/state").join(&tail));
        assert_eq!(state_dir_from(Some("relative".into()), Some("".into()), id), std::env::temp_dir().join(&tail));
    }

    #[test]
    fn credential_is_trimmed_and_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  sk-secret-value \n").unwrap();
        let credential = Credential::from_file(&path).unwrap();
        assert_eq!(credential.expose(), "sk-secret-value");
        let config = AgentConfig::new("http://127.0.0.1:1", Uuid::nil(), credential, "/");
        assert!(!format!("{config:?}").contains("sk-secret"));

        std::fs::write(&path, " \n").unwrap();
        assert!(matches!(Credential::from_file(&path), Err(ConfigError::EmptyCredential)));
    }

    #[test]
    fn check_rejects_zero_slots_and_inverted_delays() {
        let mut config = AgentConfig::new("http://127.0.0.1:1", Uuid::nil(), Credential::new("t"), "/");
        assert!(config.check().is_ok());
        assert_eq!(config.slots, 4);
        assert_eq!(config.tool_timeout_ms, 600_000);
        config.slots = 0;
        assert!(matches!(config.check(), Err(ConfigError::Invalid { field: "slots", .. })));
        config.slots = 1;
        config.tool_timeout_ms = MAX_TOOL_TIMEOUT_MS;
        assert!(config.check().is_ok(), "the bound itself is a valid timeout");
        config.tool_timeout_ms = MAX_TOOL_TIMEOUT_MS + 1;
        assert!(matches!(config.check(), Err(ConfigError::Invalid { field: "tool_timeout_ms", .. })));
        config.tool_timeout_ms = DEFAULT_TOOL_TIMEOUT_MS;
        config.reconnect_max_delay = Duration::from_millis(1);
        assert!(matches!(config.check(), Err(ConfigError::Invalid { field: "reconnect_max_delay", .. })));
    }

    #[test]
    fn several_urls_are_bounded_distinct_and_of_one_scheme() {
        let plain = TlsOptions::default();
        let with_ca = TlsOptions { ca: Some("ca.pem".into()), ..TlsOptions::default() };
        let urls = |list: &[&str]| list.iter().map(|url| (*url).to_owned()).collect::<Vec<_>>();
        let refusal = |list: &[&str], tls: &TlsOptions| match check_urls(&urls(list), tls) {
            Err(ConfigError::InvalidUrl { url, reason }) => (url, reason),
            other => panic!("{list:?} should be refused, got {other:?}"),
        };
        assert!(check_urls(&urls(&["http://a:1", "http://b:1", "http://c:1"]), &plain).is_ok());
        assert!(check_urls(&urls(&["https://a:1", "https://b:1"]), &with_ca).is_ok());
        assert!(refusal(&[], &plain).1.contains("no nexus URL"));
        let (url, reason) = refusal(&["http://a:1", "http://b:1", "http://a:1"], &plain);
        assert_eq!((url.as_str(), reason.as_str()), ("http://a:1", "this nexus URL is listed twice"));
        let (url, _) = refusal(&["http://a:1/", "http://a:1"], &plain);
        assert_eq!(url, "http://a:1", "a trailing slash makes no other node");
        let (url, reason) = refusal(&["https://a:1", "http://b:1"], &with_ca);
        assert_eq!(url, "http://b:1");
        assert!(reason.contains("scheme of the first"), "{reason}");
        assert!(refusal(&["http://a:1", ""], &plain).1.contains("scheme is missing"));
        let many: Vec<String> = (0..=NEXUS_URLS_MAX).map(|port| format!("http://a:{port}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let (url, reason) = refusal(&many, &plain);
        assert_eq!(url, "http://a:16", "the first URL over the bound is named");
        assert!(reason.contains("at most 16"), "{reason}");
        assert!(check_urls(&urls(&many[..NEXUS_URLS_MAX]), &plain).is_ok());
    }

    #[test]
    fn the_url_scheme_agrees_with_the_tls_options() {
        let plain = TlsOptions::default();
        let with_ca = TlsOptions { ca: Some("ca.pem".into()), ..TlsOptions::default() };
        let table = [
            ("http://127.0.0.1:7740", &plain, true),
            ("https://127.0.0.1:7740", &with_ca, true),
            // https without a CA to verify nexus against
            ("https://127.0.0.1:7740", &plain, false),
            // TLS options beside a plaintext URL
            ("http://127.0.0.1:7740", &with_ca, false),
            ("127.0.0.1:7740", &plain, false),
            ("ftp://x", &plain, false),
            ("http://", &plain, false),
            ("https://", &with_ca, false),
        ];
        for (url, tls, ok) in table {
            let checked = check_url(url, tls);
            assert_eq!(checked.is_ok(), ok, "{url} {tls:?}: {checked:?}");
            if !ok {
                assert!(matches!(checked, Err(ConfigError::InvalidUrl { .. })), "{url}");
            }
        }
        let mut config = AgentConfig::new("https://127.0.0.1:1", Uuid::nil(), Credential::new("t"), "/");
        config.tls = TlsOptions { ca: Some("ca.pem".into()), cert: Some("c.pem".into()), ..TlsOptions::default() };
        assert!(matches!(config.check(), Err(ConfigError::Invalid { field: "tls.cert", .. })));
        config.tls.key = Some("c.key".into());
        assert!(config.check().is_ok());
    }
}
