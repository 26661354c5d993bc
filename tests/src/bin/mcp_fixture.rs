//! `mcp-fixture`: an MCP server written for the tests with rmcp's server side.
//!
//! `mcp-fixture` speaks MCP on stdin/stdout; `mcp-fixture --http` serves streamable HTTP on
//! 127.0.0.1 (a free port) at `/mcp` and prints its URL as the first line of stdout.
//!
//! Tools (all on one current-thread runtime, so `hang` stalls the whole server):
//! - `echo {text}` (readOnlyHint): answers `text`.
//! - `add {a, b}` (additive, idempotent, closed world): `structuredContent: {sum}`.
//! - `fail` (no annotations): `isError: true`.
//! - `protocol_error`: answers a JSON-RPC error instead of a result.
//! - `slow {ms, marker?}`: sleeps `ms`; writes `done` or, when the call is canceled, `cancelled`
//!   to the file `marker` (relative to its working directory).
//! - `crash`: exits the process with status 3.
//! - `hang`: blocks the server's only thread forever: it answers nothing any more.
//! - `grow`: adds the tool `extra` and sends `notifications/tools/list_changed`.
//! - `whoami`: `structuredContent: {pid, pgid, owner, cwd, token}` (`owner` from
//!   `NEXUS_RUNNER_OWNER`, `token` the HTTP header `x-fixture-token`).
//!
//! With `FIXTURE_DOWN_WHILE=FILE` in its environment it exits at once (status 4) while `FILE`
//! exists, so a test can hold it down across restarts.
//!
//! With `FIXTURE_ODD_NAMES=1` in its environment it also lists two echoes with names outside
//! the provider rule: [`LONG_NAME`] (100 characters) and [`UNICODE_NAME`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// A tool name of 100 characters.
const LONG_NAME: &str =
    "long_nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn";
/// A tool name with characters outside `[a-zA-Z0-9_-]`.
const UNICODE_NAME: &str = "añadir.número";

#[derive(Clone, Default)]
struct Fixture {
    grown: Arc<AtomicBool>,
}

fn schema(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

fn text(content: impl Into<String>) -> CallToolResponse {
    CallToolResult::success(vec![ContentBlock::text(content)]).into()
}

impl Fixture {
    fn tools(&self) -> Vec<Tool> {
        let empty = || schema(json!({"type": "object"}));
        let mut tools = vec![
            Tool::new(
                "echo",
                "Answer the text",
                schema(json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})),
            )
            .with_annotations(ToolAnnotations::new().read_only(true)),
            Tool::new(
                "add",
                "Add two numbers",
                schema(json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}})),
            )
            .with_annotations(
                ToolAnnotations::new().read_only(false).destructive(false).idempotent(true).open_world(false),
            ),
            Tool::new("fail", "Fail on purpose", empty()),
            Tool::new("protocol_error", "Answer a JSON-RPC error", empty()),
            Tool::new(
                "slow",
                "Sleep",
                schema(
                    json!({"type": "object", "properties": {"ms": {"type": "integer"}, "marker": {"type": "string"}}}),
                ),
            ),
            Tool::new("crash", "Exit the server", empty()),
            Tool::new("hang", "Stop answering", empty()),
            Tool::new("grow", "Add the tool extra", empty()),
            Tool::new("whoami", "Describe the server process", empty())
                .with_annotations(ToolAnnotations::new().read_only(true).open_world(false)),
        ];
        if std::env::var("FIXTURE_ODD_NAMES").is_ok_and(|value| value == "1") {
            let echo_schema = || schema(json!({"type": "object", "properties": {"text": {"type": "string"}}}));
            tools.push(Tool::new(LONG_NAME, "Echo, with a long name", echo_schema()));
            tools.push(Tool::new(UNICODE_NAME, "Echo, with a unicode name", echo_schema()));
        }
        if self.grown.load(Ordering::SeqCst) {
            tools.push(Tool::new("extra", "Appears after grow", empty()));
        }
        tools
    }
}

fn number(args: &JsonObject, key: &str) -> f64 {
    args.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

/// The process group, from `/proc/self/stat` (the field after the parenthesized name's ppid).
fn pgid() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(2)?.parse().ok()
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult { tools: self.tools(), ..Default::default() })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        match request.name.as_ref() {
            "echo" | LONG_NAME | UNICODE_NAME => Ok(text(args.get("text").and_then(Value::as_str).unwrap_or_default())),
            "add" => {
                let sum = number(&args, "a") + number(&args, "b");
                let mut result = CallToolResult::success(vec![ContentBlock::text(format!("the sum is {sum}"))]);
                result.structured_content = Some(json!({"sum": sum}));
                Ok(result.into())
            }
            "fail" => Ok(CallToolResult::error(vec![ContentBlock::text("failed on purpose")]).into()),
            "protocol_error" => Err(ErrorData::internal_error("the fixture refuses", None)),
            "slow" => {
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
                let marker = args.get("marker").and_then(Value::as_str).map(str::to_owned);
                let word = tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(ms)) => "done",
                    () = context.ct.cancelled() => "cancelled",
                };
                if let Some(marker) = marker {
                    let _ = std::fs::write(marker, word);
                }
                Ok(text(format!("slept {ms} ms")))
            }
            "crash" => {
                eprintln!("mcp-fixture: crashing on purpose");
                std::process::exit(3);
            }
            "hang" => hang(),
            "grow" => {
                self.grown.store(true, Ordering::SeqCst);
                let _ = context.peer.notify_tool_list_changed().await;
                Ok(text("grown"))
            }
            "extra" if self.grown.load(Ordering::SeqCst) => Ok(text("extra!")),
            "whoami" => {
                let token = context
                    .extensions
                    .get::<axum::http::request::Parts>()
                    .and_then(|parts| parts.headers.get("x-fixture-token"))
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned);
                let cwd = std::env::current_dir().map(|dir| dir.display().to_string()).unwrap_or_default();
                let who = json!({
                    "pid": std::process::id(),
                    "pgid": pgid(),
                    "owner": std::env::var("NEXUS_RUNNER_OWNER").ok(),
                    "cwd": cwd,
                    "token": token,
                });
                Ok(CallToolResult::structured(who).into())
            }
            other => Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        }
    }
}

/// Blocks the only runtime thread for good: nothing is answered any more, pings included.
#[expect(clippy::disallowed_methods, reason = "hanging the whole server is this tool's purpose")]
fn hang() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    if let Some(file) = std::env::var_os("FIXTURE_DOWN_WHILE")
        && std::path::Path::new(&file).exists()
    {
        eprintln!("mcp-fixture: down while {} exists", std::path::Path::new(&file).display());
        std::process::exit(4);
    }
    if std::env::args().any(|arg| arg == "--http") {
        return serve_http().await;
    }
    let running = Fixture::default()
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|error| std::io::Error::other(error.to_string()))?;
    let _ = running.waiting().await;
    Ok(())
}

async fn serve_http() -> std::io::Result<()> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

    let service = StreamableHttpService::new(
        || Ok(Fixture::default()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let mut stdout = tokio::io::stdout();
    stdout.write_all(format!("http://{addr}/mcp\n").as_bytes()).await?;
    stdout.flush().await?;
    axum::serve(listener, router).await
}
