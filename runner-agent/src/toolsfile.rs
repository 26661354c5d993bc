//! The tools file (`--tools-file`, TOML): command tools, MCP servers and the settings of the
//! built-in tools, parsed and validated into typed configuration (`docs/runner-tools.md`, "The
//! tools file").
//!
//! Everything is checked here, before anything runs or is announced: names (the provider rule
//! `^[a-zA-Z0-9_-]{1,64}$`, unique across the built-ins and the file, outside nexus's reserved
//! namespaces), timeouts (1 to 604,800,000 ms), schemas (`type = "object"`), commands (a
//! non-empty argv whose program exists), and no key the grammar does not know. A refusal is a
//! [`ToolsFileError`] naming the file, the line and column, and the field.
//!
//! Owns: the grammar and its validation. Does not own: running command tools (`tools`), talking
//! to MCP servers (the MCP hub reads `McpServerConfig`), or what `[builtin.web_fetch]`'s other
//! keys mean (passed through as a [`toml::Table`]).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io::Read;
use std::num::NonZeroUsize;
use std::ops::Range;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use toml::Spanned;

use crate::tools::{Builtin, CatalogError, EffectProfile, WebFetchConfig};

/// The `timeout_ms` of a command tool or MCP server that names none, in milliseconds (1 minute).
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// The largest `timeout_ms`, in milliseconds (7 days): nexus refuses an announced one above it.
pub const MAX_TIMEOUT_MS: u64 = 604_800_000;
/// A tools file larger than this many bytes (16 MiB) is refused unread.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// The longest tool name, in characters (the provider rule).
pub const MAX_TOOL_NAME_CHARS: usize = 64;
/// The longest MCP server name or prefix, in characters.
pub const MAX_SERVER_NAME_CHARS: usize = 32;
/// The pseudo-tool a skills directory serves; never a command tool's name.
const SKILL: &str = "skill";
/// Environment variables the runner sets for every call; a tool's `env` may not set them.
const RESERVED_ENV: [&str; 6] = [
    crate::tools::reap::OWNER_VAR,
    crate::tools::reap::CALL_VAR,
    "NEXUS_TOOL_INPUT",
    "NEXUS_TOOL_NAME",
    "NEXUS_RUN_ID",
    "NEXUS_TASK_KEY",
];

/// Why a tools file was refused: the problem's kind, the file, where in it (when known) and
/// which field. `Display` gives `tools file PATH:LINE:COLUMN: FIELD: REASON`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub struct ToolsFileError {
    /// The file, as configured.
    pub path: PathBuf,
    /// What is wrong, as a kind.
    pub problem: Problem,
    /// The 1-based line and column of the offending key or value; `None` when the file could not
    /// be read at all.
    pub location: Option<(usize, usize)>,
    /// The field, as a path such as `tool[2].timeout_ms`, `mcp_server[0].url` or
    /// `builtin.bash.max_concurrency`; `None` for the file as a whole.
    pub field: Option<String>,
    /// What is wrong and what to do, in words.
    pub reason: String,
}

impl ToolsFileError {
    /// A refusal of the file as a whole (no line or field).
    pub(crate) fn whole_file(path: &Path, problem: Problem, reason: String) -> ToolsFileError {
        ToolsFileError { path: path.to_owned(), problem, location: None, field: None, reason }
    }

    /// A file whose tools do not fit the catalog beside the built-ins and the tools fed in from
    /// outside (a name taken, a tool list over nexus's bound), as a refusal of the file.
    pub(crate) fn of_catalog(path: &Path, err: &CatalogError) -> ToolsFileError {
        let problem = match err {
            CatalogError::TooLarge(_) => Problem::TooLarge,
            CatalogError::Duplicate(_) => Problem::DuplicateName,
            CatalogError::InvalidName(_) => Problem::InvalidName,
        };
        ToolsFileError::whole_file(path, problem, err.to_string())
    }
}

impl fmt::Display for ToolsFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tools file {}", self.path.display())?;
        if let Some((line, column)) = self.location {
            write!(f, ":{line}:{column}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// The kinds of refusal of a tools file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The file cannot be read, or is larger than [`MAX_FILE_BYTES`].
    Unreadable,
    /// Not TOML, or not the grammar's shape: an unknown key, a missing one, a wrong type or
    /// value (an effect profile's words included).
    Syntax,
    /// A name breaks its rule, or is reserved (a built-in's, `skill`, a nexus namespace).
    InvalidName,
    /// A name is used twice.
    DuplicateName,
    /// A `timeout_ms` outside 1..=604800000.
    InvalidTimeout,
    /// A `max_concurrency` below 1.
    InvalidConcurrency,
    /// An empty `description`.
    InvalidDescription,
    /// An `input_schema` that is not a table with `type = "object"`.
    InvalidSchema,
    /// An empty argv, an empty argument, or a program that does not exist.
    InvalidCommand,
    /// An `env` or `headers_from_env` entry that cannot be used.
    InvalidEnv,
    /// An MCP server with both or neither of `command` and `url`, or a URL that is not http(s).
    InvalidTransport,
    /// A `[builtin.NAME]` table for no built-in tool, or a key it does not take.
    UnknownBuiltin,
    /// The whole tool list would pass nexus's bound on an announcement.
    TooLarge,
    /// A `[builtin.web_fetch]` table with an unknown key, no `allow_hosts`, a bad host pattern or
    /// a bound out of range.
    InvalidWebFetch,
}

/// A tools file, validated.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ToolsFile {
    /// The `[[tool]]` entries, in file order.
    pub(crate) commands: Vec<Arc<CommandTool>>,
    /// The `[[mcp_server]]` entries, in file order.
    pub(crate) mcp_servers: Vec<McpServerConfig>,
    /// The `[builtin.NAME]` tables.
    pub(crate) builtins: BuiltinSettings,
}

/// One `[[tool]]`: a program that gets the call's input on stdin and answers on stdout.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CommandTool {
    /// Its announced name, within the provider rule.
    pub(crate) name: String,
    /// Its announced description, non-empty.
    pub(crate) description: String,
    /// The program: an absolute path when it was found next to the tools file, else a bare name
    /// looked up in `PATH` when the call starts.
    pub(crate) program: PathBuf,
    /// Its arguments; each one naming a file next to the tools file is that file's absolute path.
    pub(crate) args: Vec<String>,
    /// Its announced timeout and the bound of each call, in milliseconds, 1..=[`MAX_TIMEOUT_MS`].
    pub(crate) timeout_ms: u64,
    /// At most this many of its calls claimed or running at once; `None`: only the slots bound.
    pub(crate) max_concurrency: Option<NonZeroUsize>,
    /// Set in its environment, over runner-agent's own.
    pub(crate) env: BTreeMap<String, String>,
    /// Its announced input schema, a JSON object with `"type": "object"`.
    pub(crate) input_schema: Value,
    /// Its announced effect profile.
    pub(crate) effect_profile: EffectProfile,
}

/// One `[[mcp_server]]`, as plain data for the MCP hub; its tools are announced as
/// `<prefix>_<tool>`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct McpServerConfig {
    /// Its name, `^[a-zA-Z0-9_-]{1,32}$`, unique among the servers.
    pub(crate) name: String,
    /// The prefix of its tools' names (default: `name`), same rule, unique among the servers.
    pub(crate) prefix: String,
    /// How to reach it.
    pub(crate) transport: McpTransport,
    /// Bound on each call, and the announced `timeout_ms` of its tools, in milliseconds
    /// (default [`DEFAULT_TIMEOUT_MS`]).
    pub(crate) timeout_ms: u64,
    /// Applies to each of its tools; `None`: only the slots bound.
    pub(crate) max_concurrency: Option<NonZeroUsize>,
    /// The profile of a tool that carries no MCP annotations (default
    /// [`EffectProfile::UNKNOWN_WRITE`]).
    pub(crate) default_effect_profile: EffectProfile,
}

/// How an MCP server is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum McpTransport {
    /// A child process speaking MCP on stdin and stdout.
    Stdio {
        /// Its argv, resolved as a command tool's (program first, never empty).
        command: Vec<String>,
        /// Set in its environment, over runner-agent's own.
        env: BTreeMap<String, String>,
    },
    /// Streamable HTTP.
    Http {
        /// An `http://` or `https://` URL.
        url: String,
        /// Header name to the environment variable holding its value (read when connecting, so
        /// a secret never sits in the file).
        headers_from_env: BTreeMap<String, String>,
    },
}

/// The `[builtin.NAME]` tables.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct BuiltinSettings {
    /// `max_concurrency` of each built-in that names one.
    pub(crate) max_concurrency: BTreeMap<Builtin, NonZeroUsize>,
    /// `[builtin.web_fetch]`, checked; `web_fetch` is served only with it.
    pub(crate) web_fetch: Option<WebFetchConfig>,
}

/// The SHA-256 of a tools file's bytes: a changed digest means a changed file.
pub(crate) type FileDigest = [u8; 32];

/// Reads and validates the tools file at `path`, answering it with the digest of its bytes.
/// Blocking: it reads the file and looks for each command's program.
///
/// # Errors
/// A [`ToolsFileError`] for an unreadable or oversized file and for every refusal of
/// [`parse`].
pub(crate) fn load(path: &Path) -> Result<(ToolsFile, FileDigest), ToolsFileError> {
    let (text, digest) = read(path)?;
    Ok((parse(path, &text)?, digest))
}

/// Reads the file whole (a regular file of at most [`MAX_FILE_BYTES`]) and its digest; never
/// blocks on a FIFO and never reads more than the bound.
pub(crate) fn read(path: &Path) -> Result<(String, FileDigest), ToolsFileError> {
    let unreadable = |reason: String| ToolsFileError {
        path: path.to_owned(),
        problem: Problem::Unreadable,
        location: None,
        field: None,
        reason,
    };
    // Opened without blocking (a FIFO would wait for a writer), then checked on the descriptor:
    // only a regular file is read, and never more than the bound, whatever its size says.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|err| unreadable(format!("cannot read it: {err}")))?;
    let metadata = file.metadata().map_err(|err| unreadable(format!("cannot read it: {err}")))?;
    if !metadata.is_file() {
        return Err(unreadable("it is not a regular file (a device, FIFO or directory is refused)".to_owned()));
    }
    let too_large = || unreadable(format!("it has more than the {MAX_FILE_BYTES} bytes a tools file may have"));
    if metadata.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| unreadable(format!("cannot read it: {err}")))?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let digest: FileDigest = Sha256::digest(&bytes).into();
    let text = String::from_utf8(bytes).map_err(|err| unreadable(format!("it is not UTF-8 text: {err}")))?;
    Ok((text, digest))
}

/// Validates `text`, the content of the tools file at `path` (whose directory relative commands
/// resolve against).
///
/// # Errors
/// A [`ToolsFileError`] for the first problem found, in file order.
pub(crate) fn parse(path: &Path, text: &str) -> Result<ToolsFile, ToolsFileError> {
    // Relative commands resolve against the file's directory, made absolute here so that they
    // do not depend on the directory runner-agent runs in.
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let base = absolute.parent().map_or_else(|| PathBuf::from("/"), Path::to_owned);
    let checker = Checker { path, text, base: &base };
    let raw = checker.deserialize()?;
    checker.validate(raw)
}

/// Why `name` cannot be a tool's name, if it cannot: the provider rule, a built-in's name,
/// `skill`, or a name in one of nexus's reserved namespaces (which nexus would refuse the whole
/// announcement for).
pub(crate) fn tool_name_problem(name: &str) -> Option<String> {
    if let Some(problem) = name_rule_problem(name, MAX_TOOL_NAME_CHARS) {
        return Some(problem);
    }
    if Builtin::from_name(name).is_some() || name == SKILL {
        return Some(format!("`{name}` is the name of a built-in tool; choose another"));
    }
    nexus_kernel_tools::reserved_namespace_of(name)
        .map(|namespace| format!("`{name}` is in nexus's reserved namespace {namespace}; choose another"))
}

/// `^[a-zA-Z0-9_-]{1,max}$`.
fn name_rule_problem(name: &str, max: usize) -> Option<String> {
    let valid = !name.is_empty()
        && name.chars().count() <= max
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    (!valid).then(|| format!("{name:?} must match ^[a-zA-Z0-9_-]{{1,{max}}}$"))
}

// ---- the grammar, as serde reads it ----

/// `[builtin.NAME]` tables with every key's and value's span.
type RawBuiltins = BTreeMap<Spanned<String>, Spanned<BTreeMap<Spanned<String>, Spanned<toml::Value>>>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    tool: Vec<RawTool>,
    #[serde(default)]
    mcp_server: Vec<RawMcpServer>,
    #[serde(default)]
    builtin: RawBuiltins,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    name: Spanned<String>,
    description: Spanned<String>,
    command: Spanned<Vec<Spanned<String>>>,
    timeout_ms: Option<Spanned<i64>>,
    max_concurrency: Option<Spanned<i64>>,
    #[serde(default)]
    env: BTreeMap<Spanned<String>, String>,
    input_schema: Option<Spanned<Value>>,
    effect_profile: EffectProfile,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcpServer {
    name: Spanned<String>,
    prefix: Option<Spanned<String>>,
    command: Option<Spanned<Vec<Spanned<String>>>>,
    env: Option<Spanned<BTreeMap<Spanned<String>, String>>>,
    url: Option<Spanned<String>>,
    headers_from_env: Option<Spanned<BTreeMap<Spanned<String>, Spanned<String>>>>,
    timeout_ms: Option<Spanned<i64>>,
    max_concurrency: Option<Spanned<i64>>,
    default_effect_profile: Option<EffectProfile>,
}

// ---- validation ----

struct Checker<'a> {
    path: &'a Path,
    text: &'a str,
    base: &'a Path,
}

impl Checker<'_> {
    fn error(
        &self,
        problem: Problem,
        span: Option<Range<usize>>,
        field: Option<String>,
        reason: String,
    ) -> ToolsFileError {
        ToolsFileError {
            path: self.path.to_owned(),
            problem,
            location: Some(line_column(self.text, span.map_or(0, |span| span.start))),
            field,
            reason,
        }
    }

    fn at(&self, problem: Problem, span: Range<usize>, field: impl Into<String>, reason: String) -> ToolsFileError {
        self.error(problem, Some(span), Some(field.into()), reason)
    }

    fn deserialize(&self) -> Result<RawFile, ToolsFileError> {
        let syntax = |err: toml::de::Error, field: Option<String>| {
            self.error(Problem::Syntax, err.span(), field, err.message().to_owned())
        };
        let deserializer = toml::Deserializer::parse(self.text).map_err(|err| syntax(err, None))?;
        serde_path_to_error::deserialize(deserializer).map_err(|err| {
            let field = field_path(err.path());
            syntax(err.into_inner(), field)
        })
    }

    fn validate(&self, raw: RawFile) -> Result<ToolsFile, ToolsFileError> {
        let mut names: HashSet<String> = HashSet::new();
        let mut commands = Vec::with_capacity(raw.tool.len());
        for (index, tool) in raw.tool.into_iter().enumerate() {
            let field = |key: &str| format!("tool[{index}].{key}");
            let name = tool.name.get_ref();
            if let Some(problem) = tool_name_problem(name) {
                return Err(self.at(Problem::InvalidName, tool.name.span(), field("name"), problem));
            }
            if !names.insert(name.clone()) {
                let reason = format!("the tool `{name}` is declared twice; tool names must be unique");
                return Err(self.at(Problem::DuplicateName, tool.name.span(), field("name"), reason));
            }
            if tool.description.get_ref().trim().is_empty() {
                let reason = "must not be empty: the model reads it to choose the tool".to_owned();
                return Err(self.at(
                    Problem::InvalidDescription,
                    tool.description.span(),
                    field("description"),
                    reason,
                ));
            }
            let env = self.env(&tool.env, &field("env"))?;
            let argv = self.command(&tool.command, &field("command"), env.get("PATH").map(String::as_str))?;
            let input_schema = match tool.input_schema {
                None => serde_json::json!({"type": "object"}),
                Some(schema) => {
                    let span = schema.span();
                    let schema = schema.into_inner();
                    if schema.get("type").and_then(Value::as_str) != Some("object") {
                        let reason = "must be a table with type = \"object\" (a tool's input is a JSON object)";
                        return Err(self.at(Problem::InvalidSchema, span, field("input_schema"), reason.to_owned()));
                    }
                    schema
                }
            };
            let mut argv = argv.into_iter();
            let program = PathBuf::from(argv.next().unwrap_or_default());
            commands.push(Arc::new(CommandTool {
                name: tool.name.into_inner(),
                description: tool.description.into_inner(),
                program,
                args: argv.collect(),
                timeout_ms: self.timeout(tool.timeout_ms.as_ref(), &field("timeout_ms"))?,
                max_concurrency: self.concurrency(tool.max_concurrency.as_ref(), &field("max_concurrency"))?,
                env,
                input_schema,
                effect_profile: tool.effect_profile,
            }));
        }
        let mcp_servers = self.mcp_servers(raw.mcp_server)?;
        let builtins = self.builtins(raw.builtin)?;
        Ok(ToolsFile { commands, mcp_servers, builtins })
    }

    fn mcp_servers(&self, raw: Vec<RawMcpServer>) -> Result<Vec<McpServerConfig>, ToolsFileError> {
        let mut names = HashSet::new();
        let mut prefixes = HashSet::new();
        let mut servers = Vec::with_capacity(raw.len());
        for (index, server) in raw.into_iter().enumerate() {
            let field = |key: &str| format!("mcp_server[{index}].{key}");
            let name = server.name.get_ref();
            if let Some(problem) = name_rule_problem(name, MAX_SERVER_NAME_CHARS) {
                return Err(self.at(Problem::InvalidName, server.name.span(), field("name"), problem));
            }
            if !names.insert(name.clone()) {
                let reason = format!("the MCP server `{name}` is declared twice; server names must be unique");
                return Err(self.at(Problem::DuplicateName, server.name.span(), field("name"), reason));
            }
            let (prefix, prefix_span) = match &server.prefix {
                Some(prefix) => (prefix.get_ref().clone(), prefix.span()),
                None => (name.clone(), server.name.span()),
            };
            if let Some(problem) = name_rule_problem(&prefix, MAX_SERVER_NAME_CHARS) {
                return Err(self.at(Problem::InvalidName, prefix_span, field("prefix"), problem));
            }
            if !prefixes.insert(prefix.clone()) {
                let reason =
                    format!("the prefix `{prefix}` is used by two MCP servers; give one a `prefix` of its own");
                return Err(self.at(Problem::DuplicateName, prefix_span, field("prefix"), reason));
            }
            let transport = match (&server.command, &server.url) {
                (Some(command), None) => {
                    if let Some(headers) = &server.headers_from_env {
                        let reason = "is only for a server reached by `url`".to_owned();
                        return Err(self.at(
                            Problem::InvalidTransport,
                            headers.span(),
                            field("headers_from_env"),
                            reason,
                        ));
                    }
                    let env = match &server.env {
                        Some(env) => self.env(env.get_ref(), &field("env"))?,
                        None => BTreeMap::new(),
                    };
                    let command = self.command(command, &field("command"), env.get("PATH").map(String::as_str))?;
                    McpTransport::Stdio { command, env }
                }
                (None, Some(url)) => {
                    if let Some(env) = &server.env {
                        let reason = "is only for a server started by `command`; an HTTP server's secrets go in \
                                      `headers_from_env`"
                            .to_owned();
                        return Err(self.at(Problem::InvalidTransport, env.span(), field("env"), reason));
                    }
                    let text = url.get_ref();
                    let has_host = |scheme: &str| {
                        text.get(..scheme.len()).is_some_and(|s| s.eq_ignore_ascii_case(scheme))
                            && text.len() > scheme.len()
                    };
                    if !has_host("http://") && !has_host("https://") {
                        let reason = format!("{text:?} must be an http:// or https:// URL");
                        return Err(self.at(Problem::InvalidTransport, url.span(), field("url"), reason));
                    }
                    let headers_from_env = match &server.headers_from_env {
                        Some(headers) => self.headers(headers.get_ref(), &field("headers_from_env"))?,
                        None => BTreeMap::new(),
                    };
                    McpTransport::Http { url: text.clone(), headers_from_env }
                }
                (Some(_), Some(url)) => {
                    let reason = "an MCP server has either `command` (stdio) or `url` (HTTP), not both".to_owned();
                    return Err(self.at(Problem::InvalidTransport, url.span(), field("url"), reason));
                }
                (None, None) => {
                    let reason = "an MCP server needs `command` (stdio) or `url` (HTTP)".to_owned();
                    return Err(self.at(Problem::InvalidTransport, server.name.span(), field("command"), reason));
                }
            };
            servers.push(McpServerConfig {
                name: name.clone(),
                prefix,
                transport,
                timeout_ms: self.timeout(server.timeout_ms.as_ref(), &field("timeout_ms"))?,
                max_concurrency: self.concurrency(server.max_concurrency.as_ref(), &field("max_concurrency"))?,
                default_effect_profile: server.default_effect_profile.unwrap_or(EffectProfile::UNKNOWN_WRITE),
            });
        }
        Ok(servers)
    }

    fn builtins(&self, raw: RawBuiltins) -> Result<BuiltinSettings, ToolsFileError> {
        let mut settings = BuiltinSettings::default();
        for (name, table) in raw {
            let Some(builtin) = Builtin::from_name(name.get_ref()) else {
                let known: Vec<&str> = Builtin::ALL.iter().map(|b| b.name()).collect();
                let reason =
                    format!("`{}` is no built-in tool; the built-ins are {}", name.get_ref(), known.join(", "));
                return Err(self.at(
                    Problem::UnknownBuiltin,
                    name.span(),
                    format!("builtin.{}", name.get_ref()),
                    reason,
                ));
            };
            let is_web_fetch = builtin == Builtin::WebFetch;
            let mut rest = toml::Table::new();
            for (key, value) in table.into_inner() {
                let field = format!("builtin.{}.{}", name.get_ref(), key.get_ref());
                if key.get_ref() == "max_concurrency" {
                    let span = value.span();
                    let Some(n) = value.get_ref().as_integer() else {
                        let reason = "must be an integer of at least 1".to_owned();
                        return Err(self.at(Problem::InvalidConcurrency, span, field, reason));
                    };
                    if let Some(n) = self.concurrency(Some(&Spanned::new(span, n)), &field)? {
                        settings.max_concurrency.insert(builtin, n);
                    }
                } else if is_web_fetch {
                    rest.insert(key.into_inner(), value.into_inner());
                } else {
                    let reason = format!("`{}` takes only `max_concurrency`", name.get_ref());
                    return Err(self.at(Problem::UnknownBuiltin, key.span(), field, reason));
                }
            }
            if is_web_fetch {
                let field = format!("builtin.{}", name.get_ref());
                let config: WebFetchConfig = toml::Value::Table(rest)
                    .try_into()
                    .map_err(|err| self.at(Problem::InvalidWebFetch, name.span(), field.clone(), err.to_string()))?;
                config.check().map_err(|err| self.at(Problem::InvalidWebFetch, name.span(), field, err.to_string()))?;
                settings.web_fetch = Some(config);
            }
        }
        Ok(settings)
    }

    fn timeout(&self, value: Option<&Spanned<i64>>, field: &str) -> Result<u64, ToolsFileError> {
        let Some(value) = value else { return Ok(DEFAULT_TIMEOUT_MS) };
        match u64::try_from(*value.get_ref()) {
            Ok(ms) if (1..=MAX_TIMEOUT_MS).contains(&ms) => Ok(ms),
            _ => Err(self.at(
                Problem::InvalidTimeout,
                value.span(),
                field,
                format!("{} must be between 1 and {MAX_TIMEOUT_MS} milliseconds (7 days)", value.get_ref()),
            )),
        }
    }

    fn concurrency(&self, value: Option<&Spanned<i64>>, field: &str) -> Result<Option<NonZeroUsize>, ToolsFileError> {
        let Some(value) = value else { return Ok(None) };
        match usize::try_from(*value.get_ref()).ok().and_then(NonZeroUsize::new) {
            Some(n) => Ok(Some(n)),
            None => Err(self.at(
                Problem::InvalidConcurrency,
                value.span(),
                field,
                format!("{} must be at least 1 (leave it out for no bound but the slots)", value.get_ref()),
            )),
        }
    }

    fn env(
        &self,
        env: &BTreeMap<Spanned<String>, String>,
        field: &str,
    ) -> Result<BTreeMap<String, String>, ToolsFileError> {
        let mut out = BTreeMap::new();
        for (key, value) in env {
            let name = key.get_ref();
            let field = format!("{field}.{name}");
            let reason = if name.is_empty() || name.contains(['=', '\0']) {
                Some(format!("{name:?} is not an environment variable name"))
            } else if value.contains('\0') {
                Some("a value cannot hold a NUL character".to_owned())
            } else if RESERVED_ENV.contains(&name.as_str()) {
                Some(format!("`{name}` is set by runner-agent for every call; choose another name"))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(self.at(Problem::InvalidEnv, key.span(), field, reason));
            }
            out.insert(name.clone(), value.clone());
        }
        Ok(out)
    }

    fn headers(
        &self,
        headers: &BTreeMap<Spanned<String>, Spanned<String>>,
        field: &str,
    ) -> Result<BTreeMap<String, String>, ToolsFileError> {
        let token = |text: &str| {
            !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        };
        let mut out = BTreeMap::new();
        for (header, variable) in headers {
            let field = format!("{field}.{}", header.get_ref());
            if !token(header.get_ref()) {
                let reason = format!("{:?} is not an HTTP header name", header.get_ref());
                return Err(self.at(Problem::InvalidEnv, header.span(), field, reason));
            }
            if variable.get_ref().is_empty() || variable.get_ref().contains(['=', '\0']) {
                let reason = format!("{:?} is not an environment variable name", variable.get_ref());
                return Err(self.at(Problem::InvalidEnv, variable.span(), field, reason));
            }
            out.insert(header.get_ref().clone(), variable.get_ref().clone());
        }
        Ok(out)
    }

    /// The argv, resolved: a program given as a relative path with a `/`, or as a bare name of a
    /// file next to the tools file, becomes that file's absolute path (and must exist); another
    /// bare name must be found in `PATH` (the tool's own, when its `env` sets one). An argument
    /// naming an existing file next to the tools file becomes its absolute path.
    fn command(
        &self,
        command: &Spanned<Vec<Spanned<String>>>,
        field: &str,
        path_var: Option<&str>,
    ) -> Result<Vec<String>, ToolsFileError> {
        let Some(program) = command.get_ref().first() else {
            let reason = "must name a program: command = [\"program\", \"arg\", ...]".to_owned();
            return Err(self.at(Problem::InvalidCommand, command.span(), field, reason));
        };
        for (index, arg) in command.get_ref().iter().enumerate() {
            if arg.get_ref().contains('\0') || (index == 0 && arg.get_ref().is_empty()) {
                let reason = "cannot be empty or hold a NUL character".to_owned();
                return Err(self.at(Problem::InvalidCommand, arg.span(), format!("{field}[{index}]"), reason));
            }
        }
        let text = program.get_ref();
        let as_path = Path::new(text);
        let resolved = if as_path.is_absolute() {
            as_path.to_owned()
        } else if text.contains('/') || self.base.join(as_path).is_file() {
            self.base.join(as_path)
        } else {
            match find_in_path(text, path_var) {
                Some(_) => as_path.to_owned(),
                None => {
                    let reason = format!(
                        "the program `{text}` is neither next to the tools file ({}) nor in PATH; give its path",
                        self.base.display()
                    );
                    return Err(self.at(Problem::InvalidCommand, program.span(), format!("{field}[0]"), reason));
                }
            }
        };
        if resolved.is_absolute() && !resolved.is_file() {
            let reason = format!("the program {} does not exist or is not a file", resolved.display());
            return Err(self.at(Problem::InvalidCommand, program.span(), format!("{field}[0]"), reason));
        }
        let mut argv = vec![resolved.display().to_string()];
        for arg in &command.get_ref()[1..] {
            let text = arg.get_ref();
            let next_to_file = self.base.join(text);
            let is_file_here =
                !text.is_empty() && !text.starts_with('-') && Path::new(text).is_relative() && next_to_file.exists();
            argv.push(if is_file_here { next_to_file.display().to_string() } else { text.clone() });
        }
        Ok(argv)
    }
}

/// The first executable regular file named `program` in `path_var` (or the process's `PATH`).
fn find_in_path(program: &str, path_var: Option<&str>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let var = match path_var {
        Some(value) => Some(std::ffi::OsString::from(value)),
        None => std::env::var_os("PATH"),
    }?;
    std::env::split_paths(&var).map(|dir| dir.join(program)).find(|candidate| {
        std::fs::metadata(candidate).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    })
}

/// A serde path as the field names it: `tool[2].timeout_ms`, with the spans' own keys left out.
fn field_path(path: &serde_path_to_error::Path) -> Option<String> {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } if !key.starts_with("$__") => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            _ => {}
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |last| last.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests;
