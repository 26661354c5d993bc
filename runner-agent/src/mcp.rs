//! MCP servers as runner tools (issue 15, item 2; `docs/runner-tools.md`, "MCP servers").
//!
//! Owns: the connection to every MCP server of the tools file — a stdio child in its own process
//! group, or a streamable-HTTP endpoint — through `rmcp`; the list of their tools, mapped to
//! announced names ([`names`]) and effect profiles ([`profile`]); forwarding calls and shaping
//! their results ([`result`]); and each server's health. One supervisor task per server connects,
//! lists, watches, and on a crash, an end of stream or a hang drops only that server's tools and
//! connects again with jittered, capped backoff ([`server`]).
//!
//! Does not own: the announcement. [`McpHub::tools`] gives the tools of the healthy servers and
//! [`McpHub::subscribe`] says when they change; the catalog merges them with the other tools, and
//! the agent announces the whole list again.
//!
//! Main types: [`McpServerConfig`] (one `[[mcp_server]]` table), [`McpHub`]; each tool it serves is a [`ToolSpec`] of the catalog.

mod names;
mod profile;
mod result;
mod server;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::watch;
use tokio::time::Instant;

use self::server::{ServerShared, Supervisor};
use crate::tools::catalog::ExtraCall;
use crate::tools::reap::Owner;
use crate::tools::{EffectKind, ExtraTool, StopReason, ToolContext, ToolOutcome, ToolSpec};

pub(crate) use self::profile::CAREFUL_DEFAULT;
pub(crate) use crate::toolsfile::{McpServerConfig, McpTransport};

/// Bounds of the hub's own waits; each one ends a wait that would otherwise be unbounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct McpTiming {
    /// Starting a server and its `initialize` exchange. Default 20 s.
    pub(crate) connect_timeout: Duration,
    /// One `tools/list` (all pages). Default 20 s.
    pub(crate) list_timeout: Duration,
    /// A healthy connection is pinged this often. Default 30 s.
    pub(crate) ping_interval: Duration,
    /// A ping unanswered this long marks the server hung: it is dropped and restarted. Also
    /// the probe after a call that ran out of time. Default 10 s.
    pub(crate) ping_timeout: Duration,
    /// First restart delay; each failure doubles it, with jitter. Default 200 ms.
    pub(crate) restart_min_delay: Duration,
    /// Largest restart delay. Default 30 s.
    pub(crate) restart_max_delay: Duration,
    /// Stopping a server: its stdio child gets this long to exit after its stdin closes, then
    /// its process group is killed. Default 2 s.
    pub(crate) stop_grace: Duration,
}

impl Default for McpTiming {
    fn default() -> Self {
        McpTiming {
            connect_timeout: Duration::from_secs(20),
            list_timeout: Duration::from_secs(20),
            ping_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(10),
            restart_min_delay: Duration::from_millis(200),
            restart_max_delay: Duration::from_secs(30),
            stop_grace: Duration::from_secs(2),
        }
    }
}

/// Where a published name leads.
#[derive(Clone, Debug)]
struct Route {
    /// The server's name.
    server: String,
    /// The tool's name on the server.
    tool: String,
    timeout_ms: u64,
    kind: EffectKind,
}

/// What the hub announces now, and which names it ever announced for which server.
#[derive(Default)]
struct Published {
    entries: Vec<ToolSpec>,
    routes: HashMap<String, Route>,
    /// Announced name -> server, for every name announced since the server was configured: a
    /// call of a tool whose server is down is a tool error naming the server, not an unknown tool.
    known: HashMap<String, String>,
}

struct HubInner {
    workdir: PathBuf,
    owner: Owner,
    timing: McpTiming,
    /// The running supervisors, by server name.
    supervisors: tokio::sync::Mutex<BTreeMap<String, Supervisor>>,
    /// What each configured server offers now, by server name.
    servers: Mutex<BTreeMap<String, Arc<ServerShared>>>,
    published: Mutex<Published>,
    version: watch::Sender<u64>,
}

/// The MCP servers of the tools file and their tools. Cheap to clone; every clone is the same hub.
#[derive(Clone)]
pub(crate) struct McpHub {
    inner: Arc<HubInner>,
}

/// The hub's tools as catalog entries: each call goes through [`McpHub::call`]
/// (`docs/runner-tools.md`, "MCP servers"). A `tool_input` that is not an object fails without
/// reaching the server.
pub(crate) fn extra_tools(hub: &McpHub) -> Vec<ExtraTool> {
    hub.tools()
        .into_iter()
        .map(|entry| {
            let (caller, name) = (hub.clone(), entry.name.clone());
            let call: ExtraCall = Arc::new(move |input: Value, mut ctx: ToolContext| {
                let (hub, name) = (caller.clone(), name.clone());
                Box::pin(async move {
                    let Value::Object(input) = input else {
                        return ToolOutcome::Failed { content: "tool_input must be a JSON object".to_owned() };
                    };
                    hub.call(&name, input, &mut ctx).await.unwrap_or_else(|| ToolOutcome::Failed {
                        content: format!("{name} is no longer served by this runner's MCP servers"),
                    })
                })
            });
            ExtraTool { spec: entry, call }
        })
        .collect()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one still holds consistent data.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl McpHub {
    /// Starts one supervisor per server; returns at once. Tools appear as servers come up (watch
    /// [`McpHub::subscribe`]). Stdio children run in `workdir`, each in its own process group, with
    /// `owner`'s mark in their environment so that the start-up sweep of a later runner-agent
    /// finds any that outlived a crash. Must be called inside a tokio runtime.
    pub(crate) fn start(configs: Vec<McpServerConfig>, workdir: PathBuf, owner: Owner, timing: McpTiming) -> McpHub {
        // reqwest is built without a provider of its own: it uses the process default (ring).
        crate::install_crypto_provider();
        let (version, _) = watch::channel(0);
        let hub = McpHub {
            inner: Arc::new(HubInner {
                workdir,
                owner,
                timing,
                supervisors: tokio::sync::Mutex::new(BTreeMap::new()),
                servers: Mutex::new(BTreeMap::new()),
                published: Mutex::new(Published::default()),
                version,
            }),
        };
        let mut supervisors = BTreeMap::new();
        for config in configs {
            let name = config.name.clone();
            supervisors.insert(name, hub.spawn_supervisor(config));
        }
        // Nobody else can hold the lock yet.
        if let Ok(mut slot) = hub.inner.supervisors.try_lock() {
            *slot = supervisors;
        }
        hub
    }

    fn spawn_supervisor(&self, config: McpServerConfig) -> Supervisor {
        let shared = Arc::new(ServerShared::new(&config));
        lock(&self.inner.servers).insert(config.name.clone(), shared.clone());
        let weak = Arc::downgrade(&self.inner);
        let publish = move || {
            if let Some(inner) = weak.upgrade() {
                McpHub { inner }.publish();
            }
        };
        Supervisor::spawn(
            config,
            shared,
            self.inner.workdir.clone(),
            self.inner.owner.clone(),
            self.inner.timing,
            Box::new(publish),
        )
    }

    /// The tools of every healthy server, ordered by server name and then as the server lists
    /// them. Every name is unique and fits `^[a-zA-Z0-9_-]{1,64}$`; the catalog still checks them
    /// against the names of the other tools.
    pub(crate) fn tools(&self) -> Vec<ToolSpec> {
        lock(&self.inner.published).entries.clone()
    }

    /// The names of the configured servers whose tools are not listed now (starting, restarting
    /// or failing), in name order.
    pub(crate) fn not_listed(&self) -> Vec<String> {
        lock(&self.inner.servers)
            .values()
            .filter(|server| server.snapshot().is_none())
            .map(|server| server.name().to_owned())
            .collect()
    }

    /// The names of the configured servers that have neither listed their tools nor failed yet
    /// (still starting for the first time), in name order.
    pub(crate) fn starting(&self) -> Vec<String> {
        lock(&self.inner.servers)
            .values()
            .filter(|server| server.snapshot().is_none() && !server.has_failed())
            .map(|server| server.name().to_owned())
            .collect()
    }

    /// A receiver whose value goes up whenever [`McpHub::tools`] changes.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.version.subscribe()
    }

    /// Recomputes the published tools from every server's current list; bumps the version only
    /// when they changed.
    fn publish(&self) {
        let servers: Vec<Arc<ServerShared>> = lock(&self.inner.servers).values().cloned().collect();
        // Held while computing, so two supervisors publishing at once cannot store out of order.
        let mut published = lock(&self.inner.published);
        let mut listed = Vec::new();
        for shared in &servers {
            if let Some(snapshot) = shared.snapshot() {
                listed.push((shared.name().to_owned(), snapshot));
            }
        }
        let pairs = listed
            .iter()
            .flat_map(|(_, snapshot)| snapshot.tools.iter().map(|tool| (snapshot.prefix.as_str(), tool.name.as_ref())));
        let mut announced = names::announced_names(pairs).into_iter();
        let mut entries = Vec::new();
        let mut routes = HashMap::new();
        for (server, snapshot) in &listed {
            for tool in &snapshot.tools {
                let Some(name) = announced.next().flatten() else {
                    tracing::warn!(server = %server, tool = %tool.name, "mcp tool not announced: its name is already taken");
                    continue;
                };
                let Some(input_schema) = object_schema(&tool.input_schema) else {
                    tracing::warn!(server = %server, tool = %tool.name, "mcp tool not announced: its input schema is not of type object");
                    continue;
                };
                let description = tool
                    .description
                    .as_deref()
                    .filter(|text| !text.trim().is_empty())
                    .map(str::to_owned)
                    .or_else(|| tool.title.clone().filter(|text| !text.trim().is_empty()))
                    .unwrap_or_else(|| format!("The tool {} of the MCP server {server}.", tool.name));
                debug_assert!(names::is_valid_name(&name), "{name}");
                let effect_profile =
                    profile::effect_profile(tool.annotations.as_ref(), snapshot.default_effect_profile);
                routes.insert(
                    name.clone(),
                    Route {
                        server: server.clone(),
                        tool: tool.name.to_string(),
                        timeout_ms: snapshot.timeout_ms,
                        kind: effect_profile.kind,
                    },
                );
                entries.push(ToolSpec {
                    name,
                    description: Some(description),
                    input_schema: Some(input_schema),
                    effect_profile,
                    timeout_ms: snapshot.timeout_ms,
                    max_concurrency: snapshot.max_concurrency,
                });
            }
        }
        // A listed server's names are exactly what it lists now; a server that is down keeps
        // the names it had, so that a call of one is told the server is restarting.
        published.known.retain(|_, server| !listed.iter().any(|(listed_server, _)| listed_server == server));
        for (name, route) in &routes {
            published.known.insert(name.clone(), route.server.clone());
        }
        let changed = published.entries != entries;
        published.entries = entries;
        published.routes = routes;
        drop(published);
        if changed {
            self.inner.version.send_modify(|version| *version += 1);
        }
    }

    /// Forwards a call of `announced_name`; `None` when no MCP server ever announced that name
    /// (the caller tries its other tools).
    ///
    /// The call gets the shortest of the server's `timeout_ms`, the task's `timeout_ms` and the
    /// claim deadline (`ctx.clamp_at`); when time runs out or `ctx` is stopped it is abandoned (rmcp
    /// sends `notifications/cancelled`) and the result is a tool error. A call that ran out of
    /// time also has the server pinged: a server that does not answer is restarted. An MCP error
    /// response, a server that is down or a connection lost during the call are tool errors that
    /// name the server; a result is [`ToolOutcome::Completed`] with the server's `isError`.
    pub(crate) async fn call(
        &self,
        announced_name: &str,
        input: Map<String, Value>,
        ctx: &mut ToolContext,
    ) -> Option<ToolOutcome> {
        let (route, server_name) = {
            let published = lock(&self.inner.published);
            let server_name = published.known.get(announced_name)?.clone();
            (published.routes.get(announced_name).cloned(), server_name)
        };
        let shared = lock(&self.inner.servers).get(&server_name).cloned();
        let (Some(route), Some(shared)) = (route, shared) else {
            return Some(ToolOutcome::error(format!(
                "the MCP server {server_name} is not connected now (it is starting or restarting); \
                 {announced_name} was not called, try again later"
            )));
        };
        let Some(peer) = shared.peer() else {
            return Some(ToolOutcome::error(format!(
                "the MCP server {server_name} is not connected now (it is restarting); {announced_name} was not \
                 called, try again later"
            )));
        };
        let timeout_ms = ctx.task_timeout_ms.map_or(route.timeout_ms, |ms| ms.min(route.timeout_ms));
        let started = Instant::now();
        let budget = started + Duration::from_millis(timeout_ms);
        let until = ctx.clamp_at.map_or(budget, |clamp| clamp.min(budget));
        let effect = match route.kind {
            EffectKind::Write => "; whether it took effect is unknown",
            EffectKind::ReadOnly | EffectKind::Pure => "",
        };
        let server = &route.server;
        let params = rmcp::model::CallToolRequestParams::new(route.tool.clone()).with_arguments(input);
        let outcome = tokio::select! {
            answered = peer.call_tool(params) => match answered {
                Ok(result) => result::outcome(result),
                Err(rmcp::ServiceError::McpError(error)) => ToolOutcome::error(format!(
                    "the MCP server {server} refused the call of {}: {} (JSON-RPC error {})",
                    route.tool, error.message, error.code.0
                )),
                Err(error @ (rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_))) => {
                    if lock(&self.inner.servers).contains_key(&server_name) {
                        shared.probe();
                        ToolOutcome::error(format!(
                            "the MCP server {server} went away during the call of {} ({error}){effect}; it is being restarted",
                            route.tool
                        ))
                    } else {
                        ToolOutcome::error(format!(
                            "the MCP server {server} was removed from the tools file during the call of {}, and stopped{effect}",
                            route.tool
                        ))
                    }
                }
                Err(error) => ToolOutcome::error(format!(
                    "the MCP server {server} gave no usable answer to the call of {} ({error}){effect}",
                    route.tool
                )),
            },
            () = tokio::time::sleep_until(until) => {
                shared.probe();
                ToolOutcome::error(format!(
                    "the MCP server {server} did not answer the call of {} within its timeout of {timeout_ms} ms{effect}",
                    route.tool
                ))
            }
            reason = ctx.stopped() => match reason {
                StopReason::Canceled => ToolOutcome::error(format!(
                    "the call of {} on the MCP server {server} was abandoned because its task was canceled{effect}",
                    route.tool
                )),
                StopReason::Shutdown => ToolOutcome::error(format!(
                    "the call of {} on the MCP server {server} was abandoned because the runner shut down{effect}",
                    route.tool
                )),
            },
        };
        Some(outcome)
    }

    /// Applies a reloaded tools file: servers no longer listed are stopped, changed ones
    /// restarted, new ones started; unchanged ones keep their connection. Bounded by the stop
    /// grace of the servers it stops.
    pub(crate) async fn reconfigure(&self, configs: Vec<McpServerConfig>) {
        let mut supervisors = self.inner.supervisors.lock().await;
        let wanted: BTreeMap<String, McpServerConfig> =
            configs.into_iter().map(|config| (config.name.clone(), config)).collect();
        let stale: Vec<String> = supervisors
            .iter()
            .filter(|(name, running)| wanted.get(*name) != Some(running.config()))
            .map(|(name, _)| name.clone())
            .collect();
        let mut stopping = Vec::new();
        for name in &stale {
            if let Some(running) = supervisors.remove(name) {
                lock(&self.inner.servers).remove(name);
                stopping.push(running.stop());
            }
        }
        futures::future::join_all(stopping).await;
        {
            let mut published = lock(&self.inner.published);
            published.known.retain(|_, server| !stale.contains(server));
        }
        self.publish();
        for (name, config) in wanted {
            supervisors.entry(name).or_insert_with(|| self.spawn_supervisor(config));
        }
    }

    /// Stops every server: closes each connection, gives stdio children the stop grace to exit
    /// and then kills their process groups. Returns when all are stopped.
    pub(crate) async fn shutdown(self) {
        let supervisors = std::mem::take(&mut *self.inner.supervisors.lock().await);
        lock(&self.inner.servers).clear();
        futures::future::join_all(supervisors.into_values().map(Supervisor::stop)).await;
        {
            let mut published = lock(&self.inner.published);
            published.known.clear();
        }
        self.publish();
    }
}

/// The schema as announced: an object schema, with `"type": "object"` added when absent;
/// `None` for a schema of another type.
fn object_schema(schema: &Map<String, Value>) -> Option<Value> {
    let mut schema = schema.clone();
    match schema.get("type") {
        None => {
            schema.insert("type".to_owned(), Value::String("object".to_owned()));
        }
        Some(Value::String(kind)) if kind == "object" => {}
        Some(_) => return None,
    }
    Some(Value::Object(schema))
}

/// A small door for the integration tests in `nexus-tests`, which drive a hub against real MCP
/// servers. Not an API: it mirrors the hub with plain types and may change with it.
#[doc(hidden)]
pub mod testing {
    use std::collections::BTreeMap;
    use std::future::Future;
    use std::num::NonZeroUsize;
    use std::path::Path;
    use std::time::Duration;

    use serde_json::{Value, json};
    use tokio::sync::watch;

    use super::{McpHub, McpServerConfig, McpTiming, McpTransport};
    use crate::tools::reap::Owner;
    use crate::tools::{EffectProfile, StopReason, ToolContext};

    /// One server, as a tools file would declare it.
    #[derive(Clone, Debug)]
    pub struct Server {
        pub name: String,
        pub prefix: String,
        /// Stdio argv; `None` means HTTP at `url`.
        pub command: Option<Vec<String>>,
        pub env: BTreeMap<String, String>,
        pub url: Option<String>,
        pub headers_from_env: BTreeMap<String, String>,
        pub timeout_ms: u64,
        pub max_concurrency: Option<u32>,
        /// The `default_effect_profile` table as JSON; `None` is the careful default.
        pub default_effect_profile: Option<Value>,
    }

    impl Server {
        /// A stdio server `name` (prefix = name) running `command`, 60 s per call.
        pub fn stdio(name: &str, command: Vec<String>) -> Server {
            Server {
                name: name.to_owned(),
                prefix: name.to_owned(),
                command: Some(command),
                env: BTreeMap::new(),
                url: None,
                headers_from_env: BTreeMap::new(),
                timeout_ms: 60_000,
                max_concurrency: None,
                default_effect_profile: None,
            }
        }

        /// An HTTP server `name` at `url`.
        pub fn http(name: &str, url: &str) -> Server {
            Server { command: None, url: Some(url.to_owned()), ..Server::stdio(name, Vec::new()) }
        }

        fn config(self) -> McpServerConfig {
            let transport = match self.command {
                Some(command) => McpTransport::Stdio { command, env: self.env },
                None => {
                    McpTransport::Http { url: self.url.unwrap_or_default(), headers_from_env: self.headers_from_env }
                }
            };
            let default_effect_profile = self
                .default_effect_profile
                .and_then(|value| serde_json::from_value::<EffectProfile>(value).ok())
                .unwrap_or(super::CAREFUL_DEFAULT);
            McpServerConfig {
                name: self.name,
                prefix: self.prefix,
                transport,
                timeout_ms: self.timeout_ms,
                max_concurrency: self.max_concurrency.and_then(|n| NonZeroUsize::new(usize::try_from(n).ok()?)),
                default_effect_profile,
            }
        }
    }

    /// Quick bounds for tests: ping every 200 ms, a hung server found within 500 ms, restarts
    /// after 50..400 ms.
    fn test_timing() -> McpTiming {
        McpTiming {
            connect_timeout: Duration::from_secs(20),
            list_timeout: Duration::from_secs(5),
            ping_interval: Duration::from_millis(200),
            ping_timeout: Duration::from_millis(500),
            restart_min_delay: Duration::from_millis(50),
            restart_max_delay: Duration::from_millis(400),
            stop_grace: Duration::from_millis(500),
        }
    }

    /// A hub over the real [`McpHub`].
    pub struct Hub {
        hub: McpHub,
        workdir: std::path::PathBuf,
        owner: Owner,
    }

    impl Hub {
        /// Starts `servers` with children in `workdir`, marked with the owner mark of `state_dir`.
        pub fn start(servers: Vec<Server>, workdir: &Path, state_dir: &Path) -> Hub {
            let owner = Owner::of_state_dir(state_dir);
            let configs = servers.into_iter().map(Server::config).collect();
            let hub = McpHub::start(configs, workdir.to_owned(), owner.clone(), test_timing());
            Hub { hub, workdir: workdir.to_owned(), owner }
        }

        /// The owner mark its children carry in `NEXUS_RUNNER_OWNER`.
        pub fn owner_mark(&self) -> String {
            self.owner.as_str().to_owned()
        }

        /// The current tools, each `{name, description, input_schema, effect_profile, timeout_ms,
        /// max_concurrency}`.
        pub fn tools(&self) -> Vec<Value> {
            self.hub
                .tools()
                .into_iter()
                .map(|entry| {
                    json!({
                        "name": entry.name,
                        "description": entry.description,
                        "input_schema": entry.input_schema,
                        "effect_profile": entry.effect_profile,
                        "timeout_ms": entry.timeout_ms,
                        "max_concurrency": entry.max_concurrency.map(NonZeroUsize::get),
                    })
                })
                .collect()
        }

        /// Bumps whenever [`Hub::tools`] changes.
        pub fn subscribe(&self) -> watch::Receiver<u64> {
            self.hub.subscribe()
        }

        /// Calls `name` with `input` (a JSON object); the commit body, or `None` when no MCP
        /// server announced `name`.
        pub async fn call(&self, name: &str, input: Value, task_timeout_ms: Option<u64>) -> Option<Value> {
            self.call_until(name, input, task_timeout_ms, std::future::pending()).await
        }

        /// [`Hub::call`], canceled (as nexus cancels a task) when `cancel` resolves first.
        pub async fn call_until(
            &self,
            name: &str,
            input: Value,
            task_timeout_ms: Option<u64>,
            cancel: impl Future<Output = ()>,
        ) -> Option<Value> {
            let Value::Object(input) = input else {
                return None;
            };
            let (stop_tx, stop) = watch::channel(None);
            let mut ctx = ToolContext {
                workdir: self.workdir.clone(),
                bash_timeout_ms: 60_000,
                task_timeout_ms,
                clamp_at: None,
                stop,
                claim: None,
                owner: self.owner.clone(),
            };
            let call = self.hub.call(name, input, &mut ctx);
            tokio::pin!(call);
            tokio::pin!(cancel);
            let outcome = tokio::select! {
                outcome = &mut call => outcome,
                () = &mut cancel => {
                    let _ = stop_tx.send(Some(StopReason::Canceled));
                    call.await
                }
            };
            outcome.map(crate::tools::ToolOutcome::into_commit_body)
        }

        /// Applies a new server list.
        pub async fn reconfigure(&self, servers: Vec<Server>) {
            self.hub.reconfigure(servers.into_iter().map(Server::config).collect()).await;
        }

        /// Stops every server.
        pub async fn shutdown(self) {
            self.hub.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use rmcp::model::{Tool, ToolAnnotations};
    use serde_json::json;

    use super::*;

    fn config(name: &str, prefix: &str) -> McpServerConfig {
        McpServerConfig {
            name: name.to_owned(),
            prefix: prefix.to_owned(),
            transport: McpTransport::Stdio { command: vec!["true".to_owned()], env: BTreeMap::new() },
            timeout_ms: 1_234,
            max_concurrency: NonZeroUsize::new(2),
            default_effect_profile: CAREFUL_DEFAULT,
        }
    }

    fn tool(name: &str, description: Option<&str>, schema: Value) -> Tool {
        let schema = Arc::new(schema.as_object().cloned().unwrap_or_default());
        let mut tool = Tool::new_with_raw(name.to_owned(), description.map(|d| d.to_owned().into()), schema);
        if name == "look" {
            tool = tool.with_annotations(ToolAnnotations::new().read_only(true));
        }
        tool
    }

    /// A hub with no supervisors, and servers whose tool lists the test sets by hand.
    fn hub_with(servers: &[(&McpServerConfig, Option<Vec<Tool>>)]) -> (McpHub, Vec<Arc<ServerShared>>) {
        let dir = std::env::temp_dir();
        let hub = McpHub::start(Vec::new(), dir.clone(), Owner::of_state_dir(&dir), McpTiming::default());
        let mut shared = Vec::new();
        for (config, tools) in servers {
            let server = Arc::new(ServerShared::new(config));
            server.set(None, tools.clone());
            lock(&hub.inner.servers).insert(config.name.clone(), server.clone());
            shared.push(server);
        }
        hub.publish();
        (hub, shared)
    }

    #[tokio::test]
    async fn publishing_maps_names_schemas_descriptions_and_profiles() {
        let (one, two) = (config("one", "p"), config("two", "p_a"));
        let object = json!({"type": "object"});
        let tools_one = vec![
            tool("a.b", Some("dotted"), object.clone()),
            tool("look", None, json!({})),
            tool("list", Some("  "), json!({"type": "array"})),
        ];
        let tools_two = vec![tool("b", Some("from two"), object.clone())];
        let (hub, shared) = hub_with(&[(&one, Some(tools_one)), (&two, Some(tools_two))]);
        let version = *hub.subscribe().borrow();
        assert!(version > 0, "publishing tools bumps the version");
        let tools = hub.tools();
        let names: Vec<&str> = tools.iter().map(|entry| entry.name.as_str()).collect();
        // `p_a.b` and `p_a_b` collide after mapping: both hashed. `list` is not an object schema.
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names[0].starts_with("p_a_b_") && names[2].starts_with("p_a_b_") && names[0] != names[2], "{names:?}");
        assert_eq!(names[1], "p_look");
        let look = &tools[1];
        assert_eq!(look.description.as_deref(), Some("The tool look of the MCP server one."));
        assert_eq!(look.input_schema, Some(json!({"type": "object"})));
        assert_eq!(look.effect_profile.kind, EffectKind::ReadOnly);
        assert_eq!((look.timeout_ms, look.max_concurrency.map(NonZeroUsize::get)), (1_234, Some(2)));
        assert_eq!(tools[2].description.as_deref(), Some("from two"));
        assert_eq!(tools[0].effect_profile, CAREFUL_DEFAULT, "no annotations: the server's default");

        // Publishing the same again changes nothing; a server going down withdraws only its tools,
        // and a call of one of them is a tool error naming the server, not an unknown tool.
        hub.publish();
        assert_eq!(*hub.subscribe().borrow(), version);
        shared[1].set(None, None);
        hub.publish();
        assert!(*hub.subscribe().borrow() > version);
        let now: Vec<String> = hub.tools().into_iter().map(|entry| entry.name).collect();
        assert_eq!(now.len(), 2);
        // Alone, `p_a.b` no longer collides.
        assert_eq!(now[0], "p_a_b");
        let (_stop_tx, stop) = watch::channel(None);
        let mut ctx = ToolContext {
            workdir: std::env::temp_dir(),
            bash_timeout_ms: 1_000,
            task_timeout_ms: None,
            clamp_at: None,
            stop,
            claim: None,
            owner: Owner::of_state_dir(&std::env::temp_dir()),
        };
        let down = hub.call(names[2], Map::new(), &mut ctx).await;
        assert!(
            matches!(&down, Some(ToolOutcome::Completed { is_error: true, content, .. }) if content.contains("MCP server two")),
            "{down:?}"
        );
        assert!(hub.call("p_nothing", Map::new(), &mut ctx).await.is_none());
    }

    #[test]
    fn schemas_are_announced_as_objects() {
        let map = |value: Value| value.as_object().cloned().expect("object");
        assert_eq!(object_schema(&map(json!({}))), Some(json!({"type": "object"})));
        assert_eq!(
            object_schema(&map(json!({"type": "object", "properties": {"a": {"type": "string"}}}))),
            Some(json!({"type": "object", "properties": {"a": {"type": "string"}}}))
        );
        assert_eq!(object_schema(&map(json!({"type": "array"}))), None);
    }
}
