//! `web_fetch {url, max_bytes?}`: an HTTP(S) GET whose body comes back as text. Served only when
//! the tools file's `[builtin.web_fetch]` table gives it an `allow_hosts` list
//! ([`WebFetchConfig`]).
//!
//! - Only `http` and `https` URLs whose host is allowed: an exact host (`docs.rs`, `127.0.0.1`)
//!   or `*.suffix`, which allows every host below the suffix but not the suffix itself. The
//!   host is checked before any connection, and so is each redirect's target: a redirect to a
//!   host outside the list is not followed (the answer names it), nor is a sixth redirect.
//! - The body is read as it arrives and reading stops at `max_bytes` (the answer says so); the
//!   whole fetch ends at `timeout_ms`, or when the call is stopped.
//! - `text/*`, JSON, XML, JavaScript, YAML and TOML come back as text (decoded as UTF-8, invalid
//!   bytes replaced); HTML is turned into readable text (html2text, on a thread a timeout can
//!   abandon); any other type is refused before its body is read.
//! - No proxy is used (`HTTP_PROXY` and the like are ignored). Hosts are allowed by name: the
//!   list does not stop a name that resolves to a private address.

use std::sync::Arc;
use std::time::Duration;

use reqwest013::header::{CONTENT_TYPE, LOCATION};
use reqwest013::{Client, StatusCode, Url, redirect};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::time::Instant;

mod html;

use super::args::{optional_positive, required_str};
use super::blocking::{self, Ended, Strays};
use super::{ToolContext, ToolOutcome};

/// `max_bytes` when the table does not set it (2 MiB).
pub(crate) const DEFAULT_MAX_BYTES: u64 = 2 * 1024 * 1024;
/// The largest `max_bytes` the table may set (10 MiB).
pub(crate) const MAX_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// `timeout_ms` when the table does not set it.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 20_000;
/// The largest `timeout_ms` the table may set (5 minutes).
pub(crate) const MAX_TIMEOUT_MS: u64 = 300_000;
/// Redirects followed at most.
pub(crate) const MAX_REDIRECTS: usize = 5;
/// The text returned keeps at most this many bytes (the commit bound is 1 MB).
pub(crate) const TEXT_CAP_BYTES: usize = 512 * 1024;
/// The announced `timeout_ms` is the fetch's plus this, for the HTML conversion.
const CONVERSION_MARGIN_MS: u64 = 5_000;

/// The `[builtin.web_fetch]` table of the tools file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebFetchConfig {
    /// Hosts that may be fetched: exact names or addresses (`docs.rs`, `127.0.0.1`, `[::1]`), or
    /// `*.suffix` for every host below `suffix`. Compared without case. Must not be empty.
    pub(crate) allow_hosts: Vec<String>,
    /// The most body bytes read, 1..=10 MiB; default 2 MiB. A call's `max_bytes` may lower it.
    #[serde(default = "default_max_bytes")]
    pub(crate) max_bytes: u64,
    /// Milliseconds the whole fetch (connect, redirects, body) may take, 1..=300000; default
    /// 20000.
    #[serde(default = "default_timeout_ms")]
    pub(crate) timeout_ms: u64,
}

fn default_max_bytes() -> u64 {
    DEFAULT_MAX_BYTES
}

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}

/// What is wrong with a [`WebFetchConfig`]; each names its field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum WebFetchConfigError {
    #[error("allow_hosts: must list at least one host; remove [builtin.web_fetch] to serve no web_fetch")]
    NoHosts,
    #[error("allow_hosts: {0:?} is not a host name, an IP address or `*.suffix` (no scheme, port, path or other `*`)")]
    BadHost(String),
    #[error("max_bytes: must be between 1 and {MAX_MAX_BYTES}, not {0}")]
    MaxBytes(u64),
    #[error("timeout_ms: must be between 1 and {MAX_TIMEOUT_MS}, not {0}")]
    TimeoutMs(u64),
}

impl WebFetchConfig {
    /// Checks the bounds and the host patterns (the tools-file parser calls it).
    ///
    /// # Errors
    /// The first problem found, naming its field.
    pub(crate) fn check(&self) -> Result<(), WebFetchConfigError> {
        if self.allow_hosts.is_empty() {
            return Err(WebFetchConfigError::NoHosts);
        }
        for host in &self.allow_hosts {
            let bare = host.strip_prefix("*.").unwrap_or(host);
            // A `:` belongs to an IPv6 address only (`::1` or `[::1]`): `host:port` never
            // matches a URL's host, so it is refused rather than kept as a dead entry.
            let unbracketed = bare.strip_prefix('[').and_then(|rest| rest.strip_suffix(']'));
            let ipv6 = unbracketed.unwrap_or(bare).parse::<std::net::Ipv6Addr>().is_ok();
            let name_like = !bare.is_empty()
                && unbracketed.is_none()
                && bare.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
            let valid = ipv6 && !host.starts_with("*.") || name_like;
            if !valid {
                return Err(WebFetchConfigError::BadHost(host.clone()));
            }
        }
        if !(1..=MAX_MAX_BYTES).contains(&self.max_bytes) {
            return Err(WebFetchConfigError::MaxBytes(self.max_bytes));
        }
        if !(1..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(WebFetchConfigError::TimeoutMs(self.timeout_ms));
        }
        Ok(())
    }
}

/// Allowed hosts, normalized: lowercase, no brackets, no trailing dot.
#[derive(Debug)]
struct AllowList {
    exact: Vec<String>,
    /// `.suffix` for each `*.suffix`.
    below: Vec<String>,
}

fn normal_host(host: &str) -> String {
    host.trim_start_matches('[').trim_end_matches(']').trim_end_matches('.').to_ascii_lowercase()
}

impl AllowList {
    fn new(patterns: &[String]) -> AllowList {
        let mut list = AllowList { exact: Vec::new(), below: Vec::new() };
        for pattern in patterns {
            match pattern.strip_prefix("*.") {
                Some(suffix) => list.below.push(format!(".{}", normal_host(suffix))),
                None => list.exact.push(normal_host(pattern)),
            }
        }
        list
    }

    fn allows(&self, url: &Url) -> bool {
        let Some(host) = url.host_str() else {
            return false;
        };
        let host = normal_host(host);
        matches!(url.scheme(), "http" | "https")
            && (self.exact.contains(&host) || self.below.iter().any(|suffix| host.ends_with(suffix.as_str())))
    }
}

/// web_fetch's configuration and its client, built once.
#[derive(Debug)]
pub(crate) struct WebFetch {
    config: WebFetchConfig,
    allow: Arc<AllowList>,
    /// The client, or why it could not be built (then every call says so).
    client: Result<Client, String>,
}

impl WebFetch {
    /// Builds the client: the redirect policy keeps to the allowlist and [`MAX_REDIRECTS`].
    /// A configuration that fails [`WebFetchConfig::check`] (which the tools-file parser runs
    /// first) builds no client: every call fails, saying why. Bounds are clamped into range.
    pub(crate) fn new(mut config: WebFetchConfig) -> WebFetch {
        let checked = config.check();
        config.max_bytes = config.max_bytes.clamp(1, MAX_MAX_BYTES);
        config.timeout_ms = config.timeout_ms.clamp(1, MAX_TIMEOUT_MS);
        let allow = Arc::new(AllowList::new(&config.allow_hosts));
        let policy_allow = Arc::clone(&allow);
        let policy = redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
            } else if policy_allow.allows(attempt.url()) {
                attempt.follow()
            } else {
                // The redirect itself is the answer; the call names its target.
                attempt.stop()
            }
        });
        // reqwest is built without a crypto provider of its own; ring is the process's.
        crate::install_crypto_provider();
        let client = Client::builder()
            .redirect(policy)
            .no_proxy()
            // A backstop: the call's own timeout comes first, with its own sentence.
            .timeout(Duration::from_millis(config.timeout_ms + CONVERSION_MARGIN_MS))
            .user_agent(concat!("nexus-runner-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| format!("the HTTP client could not be built: {err}"));
        let client = match checked {
            Ok(()) => client,
            Err(err) => Err(format!("web_fetch is misconfigured in [builtin.web_fetch]: {err}")),
        };
        WebFetch { config, allow, client }
    }

    /// The `timeout_ms` announced for web_fetch.
    pub(crate) fn announced_timeout_ms(&self) -> u64 {
        self.config.timeout_ms + CONVERSION_MARGIN_MS
    }
}

/// How the body is turned into text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    Text,
    Html,
}

/// The [`Body`] of a `Content-Type`, or `None` for a type that is not text.
fn body_kind(content_type: Option<&str>) -> Option<Body> {
    let Some(content_type) = content_type else {
        return Some(Body::Text);
    };
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let (kind, subtype) = essence.split_once('/')?;
    match (kind, subtype) {
        ("text", "html") | ("application", "xhtml+xml") => Some(Body::Html),
        ("text", _) => Some(Body::Text),
        ("application", sub)
            if matches!(
                sub,
                "json" | "xml" | "javascript" | "ecmascript" | "yaml" | "x-yaml" | "toml" | "x-ndjson" | "ld+json"
            ) || sub.ends_with("+json")
                || sub.ends_with("+xml") =>
        {
            Some(Body::Text)
        }
        _ => None,
    }
}

/// The body read, within its bound.
struct Fetched {
    final_url: Url,
    status: StatusCode,
    content_type: Option<String>,
    kind: Body,
    bytes: Vec<u8>,
    /// Reading stopped at `max_bytes`.
    cut: bool,
}

async fn fetch_body(client: &Client, allow: &AllowList, url: Url, max_bytes: u64) -> Result<Fetched, String> {
    let mut response = client.get(url).send().await.map_err(|err| request_error(&err))?;
    let status = response.status();
    let final_url = response.url().clone();
    if status.is_redirection() {
        let target = response.headers().get(LOCATION).and_then(|value| value.to_str().ok()).unwrap_or("(none)");
        let resolved = final_url.join(target).map_or_else(|_| target.to_owned(), |url| url.to_string());
        let why = match final_url.join(target) {
            Ok(next) if !allow.allows(&next) => "its host is not in allow_hosts".to_owned(),
            Ok(_) => "it was not followed".to_owned(),
            Err(err) => format!("it is not a valid URL ({err})"),
        };
        return Err(format!("{final_url} redirects ({status}) to {resolved}, which was not fetched: {why}"));
    }
    let content_type = response.headers().get(CONTENT_TYPE).and_then(|value| value.to_str().ok()).map(str::to_owned);
    let Some(kind) = body_kind(content_type.as_deref()) else {
        return Err(format!(
            "{final_url} is {}, not text; web_fetch returns text, HTML, JSON or XML only",
            content_type.as_deref().unwrap_or("untyped")
        ));
    };
    let limit = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let mut bytes = Vec::new();
    let mut cut = false;
    while let Some(chunk) = response.chunk().await.map_err(|err| request_error(&err))? {
        if bytes.len() == limit {
            // Full, and more came: it is not read.
            cut = !chunk.is_empty();
            break;
        }
        let room = limit - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            cut = true;
            break;
        }
        bytes.extend_from_slice(&chunk);
        if bytes.len() == limit && response.content_length().is_some_and(|len| len <= max_bytes) {
            break;
        }
    }
    Ok(Fetched { final_url, status, content_type, kind, bytes, cut })
}

/// A request error as a sentence, with its causes.
fn request_error(err: &reqwest013::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// `text` cut to at most `bound` bytes on a character boundary.
fn cut_text(text: &mut String, bound: usize) -> bool {
    if text.len() <= bound {
        return false;
    }
    let mut end = bound;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    true
}

/// `web_fetch {url, max_bytes?}`.
pub(super) async fn web_fetch(
    web: &WebFetch,
    strays: &Strays,
    input: &Map<String, Value>,
    ctx: &mut ToolContext,
) -> ToolOutcome {
    let parsed = required_str(input, "url").and_then(|url| Ok((url, optional_positive(input, "max_bytes")?)));
    let (requested, max_bytes) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return ToolOutcome::error(message),
    };
    let url = match Url::parse(requested) {
        Ok(url) => url,
        Err(err) => return ToolOutcome::error(format!("`url` is not a valid URL: {err}")),
    };
    if !matches!(url.scheme(), "http" | "https") {
        return ToolOutcome::error(format!("{url}: only http and https URLs are fetched"));
    }
    if !web.allow.allows(&url) {
        return ToolOutcome::error(format!(
            "{url}: its host is not in this runner's allow_hosts ({}); nothing was fetched",
            web.config.allow_hosts.join(", ")
        ));
    }
    let client = match &web.client {
        Ok(client) => client,
        Err(message) => return ToolOutcome::Failed { content: message.clone() },
    };
    let max_bytes = max_bytes.unwrap_or(web.config.max_bytes).min(web.config.max_bytes);
    let timeout_ms = ctx.task_timeout_ms.map_or(web.config.timeout_ms, |ms| ms.min(web.config.timeout_ms));
    let until = Instant::now() + Duration::from_millis(timeout_ms);
    let until = ctx.clamp_at.map_or(until, |clamp| clamp.min(until));
    let fetched = tokio::select! {
        fetched = fetch_body(client, &web.allow, url.clone(), max_bytes) => fetched,
        () = tokio::time::sleep_until(until) => {
            return ToolOutcome::error(format!("{url}: the fetch did not finish within its timeout of {timeout_ms} ms"));
        }
        _ = ctx.stopped() => return ToolOutcome::error(format!("{url}: the fetch was stopped")),
    };
    let fetched = match fetched {
        Ok(fetched) => fetched,
        Err(message) => return ToolOutcome::error(message),
    };
    let Fetched { final_url, status, content_type, kind, bytes, cut } = fetched;
    let read = bytes.len();
    let mut text = match kind {
        Body::Text => String::from_utf8_lossy(&bytes).into_owned(),
        Body::Html => {
            let budget = Instant::now() + Duration::from_millis(CONVERSION_MARGIN_MS);
            let converted = blocking::run(strays, budget, ctx.stopped(), move |_| html::to_text(&bytes)).await;
            match converted {
                Ended::Done(text) => text,
                _ => return ToolOutcome::error(format!("{final_url}: the HTML was not turned into text in time")),
            }
        }
    };
    let text_cut = cut_text(&mut text, TEXT_CAP_BYTES);
    let mut content = format!(
        "url: {final_url}\nstatus: {}\ncontent_type: {}\n---\n{text}",
        status.as_u16(),
        content_type.as_deref().unwrap_or("(none)")
    );
    if !content.ends_with('\n') {
        content.push('\n');
    }
    if cut {
        content.push_str(&format!("[body cut after {max_bytes} bytes]\n"));
    }
    if text_cut {
        content.push_str(&format!("[text cut after {TEXT_CAP_BYTES} bytes]\n"));
    }
    ToolOutcome::Completed {
        content,
        structured_content: json!({
            "url": final_url.as_str(),
            "status": status.as_u16(),
            "content_type": content_type,
            "bytes_read": read,
            "body_truncated": cut,
            "text_truncated": text_cut,
        }),
        is_error: !status.is_success(),
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::tools::reap::Owner;

    /// A tiny HTTP/1.1 server on 127.0.0.1: one response per connection, chosen by path.
    async fn serve() -> (u16, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else { return };
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head);
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    let respond = |status: &str, headers: &str, body: &[u8]| {
                        let mut out = format!(
                            "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        )
                        .into_bytes();
                        out.extend_from_slice(body);
                        out
                    };
                    let out = match path.as_str() {
                        "/text" => respond("200 OK", "Content-Type: text/plain; charset=utf-8\r\n", b"hello, world"),
                        "/html" => respond(
                            "200 OK",
                            "Content-Type: text/html\r\n",
                            b"<html><head><title>T</title><style>p{}</style></head><body><h1>Heading</h1>\
                              <p>Some <b>bold</b> text.</p><script>var hidden = 1;</script></body></html>",
                        ),
                        "/json" => respond("200 OK", "Content-Type: application/json\r\n", br#"{"a": 1}"#),
                        "/big" => respond("200 OK", "Content-Type: text/plain\r\n", &vec![b'z'; 100_000]),
                        "/binary" => respond("200 OK", "Content-Type: application/octet-stream\r\n", b"\0\x01"),
                        "/missing" => respond("404 Not Found", "Content-Type: text/plain\r\n", b"no such page"),
                        "/redirect-in" => respond("302 Found", "Location: /text\r\n", b""),
                        "/redirect-out" => {
                            respond("302 Found", &format!("Location: http://localhost:{port}/text\r\n"), b"")
                        }
                        "/loop" => respond("302 Found", "Location: /loop\r\n", b""),
                        "/slow" => {
                            let _ = socket
                                .write_all(
                                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\nab",
                                )
                                .await;
                            // Never sends the rest.
                            std::future::pending::<()>().await;
                            return;
                        }
                        _ => respond("404 Not Found", "", b""),
                    };
                    let _ = socket.write_all(&out).await;
                });
            }
        });
        (port, server)
    }

    fn config(timeout_ms: u64) -> WebFetchConfig {
        WebFetchConfig { allow_hosts: vec!["127.0.0.1".to_owned()], max_bytes: DEFAULT_MAX_BYTES, timeout_ms }
    }

    async fn fetch(web: &WebFetch, input: Value) -> (String, Value, bool) {
        let dir = tempfile::tempdir().unwrap();
        let (_stop_tx, mut ctx) = ToolContext::for_test(dir.path(), &Owner::of_state_dir(dir.path()), 10_000);
        web_fetch(web, &Strays::default(), input.as_object().unwrap(), &mut ctx).await.into_parts()
    }

    #[tokio::test]
    async fn allowed_hosts_are_fetched_as_text_and_html_is_made_readable() {
        let (port, _server) = serve().await;
        let web = WebFetch::new(config(10_000));
        let base = format!("http://127.0.0.1:{port}");
        let (content, structured, is_error) = fetch(&web, json!({"url": format!("{base}/text")})).await;
        assert!(!is_error, "{content}");
        assert!(content.ends_with("---\nhello, world\n"), "{content}");
        assert_eq!(structured["status"], 200);
        assert_eq!(structured["content_type"], "text/plain; charset=utf-8");

        let (content, _, is_error) = fetch(&web, json!({"url": format!("{base}/html")})).await;
        assert!(!is_error, "{content}");
        assert!(content.contains("Heading") && content.contains("bold"), "{content}");
        assert!(!content.contains("<p>") && !content.contains("var hidden"), "tags and scripts are gone: {content}");

        let (content, _, _) = fetch(&web, json!({"url": format!("{base}/json")})).await;
        assert!(content.ends_with("{\"a\": 1}\n"), "{content}");

        let (content, structured, _) = fetch(&web, json!({"url": format!("{base}/redirect-in")})).await;
        assert!(content.contains("hello, world"), "a redirect inside the list is followed: {content}");
        assert_eq!(structured["url"], format!("{base}/text"));

        let (content, structured, is_error) = fetch(&web, json!({"url": format!("{base}/missing")})).await;
        assert!(is_error && content.contains("no such page"), "{content}");
        assert_eq!(structured["status"], 404);
    }

    #[tokio::test]
    async fn hosts_redirects_types_sizes_and_time_are_bounded() {
        let (port, _server) = serve().await;
        let web = WebFetch::new(config(500));
        let base = format!("http://127.0.0.1:{port}");

        let (content, _, is_error) = fetch(&web, json!({"url": format!("http://localhost:{port}/text")})).await;
        assert!(is_error && content.contains("not in this runner's allow_hosts"), "{content}");
        let (content, _, is_error) = fetch(&web, json!({"url": "file:///etc/passwd"})).await;
        assert!(is_error && content.contains("only http and https"), "{content}");

        let (content, _, is_error) = fetch(&web, json!({"url": format!("{base}/redirect-out")})).await;
        assert!(is_error, "{content}");
        assert!(content.contains(&format!("to http://localhost:{port}/text")), "{content}");
        assert!(content.contains("not in allow_hosts"), "{content}");

        let (content, _, is_error) = fetch(&web, json!({"url": format!("{base}/loop")})).await;
        assert!(is_error && content.contains("more than 5 redirects"), "{content}");

        let (content, _, is_error) = fetch(&web, json!({"url": format!("{base}/binary")})).await;
        assert!(is_error && content.contains("application/octet-stream, not text"), "{content}");

        let (content, structured, is_error) =
            fetch(&web, json!({"url": format!("{base}/big"), "max_bytes": 1000})).await;
        assert!(!is_error, "{content}");
        assert_eq!(structured["bytes_read"], 1000);
        assert_eq!(structured["body_truncated"], true);
        assert!(content.ends_with("[body cut after 1000 bytes]\n"), "{content}");

        let started = Instant::now();
        let (content, _, is_error) = fetch(&web, json!({"url": format!("{base}/slow")})).await;
        assert!(is_error && content.contains("within its timeout of 500 ms"), "{content}");
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    }

    #[test]
    fn allow_lists_match_exact_hosts_and_suffixes_only() {
        let allow = AllowList::new(&["Docs.rs".to_owned(), "*.python.org".to_owned(), "[::1]".to_owned()]);
        let allowed = |url: &str| allow.allows(&Url::parse(url).unwrap());
        assert!(allowed("https://docs.rs/serde"));
        assert!(allowed("https://DOCS.RS./x"));
        assert!(allowed("https://docs.python.org/3/"));
        assert!(allowed("http://a.b.python.org/"));
        assert!(allowed("http://[::1]:8080/"));
        assert!(!allowed("https://python.org/"), "*.suffix does not allow the suffix itself");
        assert!(!allowed("https://evilpython.org/"));
        assert!(!allowed("https://docs.rs.evil.com/"));
        assert!(!allowed("ftp://docs.rs/"));
    }

    #[test]
    fn the_config_table_is_checked_field_by_field() {
        let parsed: WebFetchConfig = serde_json::from_value(json!({"allow_hosts": ["docs.rs"]})).unwrap();
        assert_eq!(parsed.max_bytes, DEFAULT_MAX_BYTES);
        assert_eq!(parsed.timeout_ms, DEFAULT_TIMEOUT_MS);
        assert_eq!(parsed.check(), Ok(()));
        assert!(serde_json::from_value::<WebFetchConfig>(json!({"allow_hosts": [], "follow": true})).is_err());
        let with = |value: Value| serde_json::from_value::<WebFetchConfig>(value).unwrap().check();
        assert_eq!(with(json!({"allow_hosts": []})), Err(WebFetchConfigError::NoHosts));
        assert!(matches!(with(json!({"allow_hosts": ["https://x.org"]})), Err(WebFetchConfigError::BadHost(_))));
        assert!(matches!(with(json!({"allow_hosts": ["a.*.org"]})), Err(WebFetchConfigError::BadHost(_))));
        for never_matches in ["docs.rs:443", "127.0.0.1:8080", "[docs.rs]", "*.[::1]", "[::1"] {
            let refused = with(json!({"allow_hosts": [never_matches]}));
            assert!(matches!(refused, Err(WebFetchConfigError::BadHost(_))), "{never_matches}: {refused:?}");
        }
        for address in ["[::1]", "::1", "127.0.0.1", "*.docs.rs"] {
            assert_eq!(with(json!({"allow_hosts": [address]})), Ok(()), "{address}");
        }
        assert_eq!(with(json!({"allow_hosts": ["x"], "max_bytes": 0})), Err(WebFetchConfigError::MaxBytes(0)));
        assert!(with(json!({"allow_hosts": ["x"], "max_bytes": MAX_MAX_BYTES + 1})).is_err());
        assert_eq!(with(json!({"allow_hosts": ["x"], "timeout_ms": 0})), Err(WebFetchConfigError::TimeoutMs(0)));
    }

    #[test]
    fn content_types_sort_into_text_html_and_refused() {
        assert_eq!(body_kind(Some("text/html; charset=utf-8")), Some(Body::Html));
        assert_eq!(body_kind(Some("application/xhtml+xml")), Some(Body::Html));
        assert_eq!(body_kind(Some("text/markdown")), Some(Body::Text));
        assert_eq!(body_kind(Some("application/vnd.api+json")), Some(Body::Text));
        assert_eq!(body_kind(Some("application/json")), Some(Body::Text));
        assert_eq!(body_kind(None), Some(Body::Text));
        assert_eq!(body_kind(Some("image/png")), None);
        assert_eq!(body_kind(Some("application/pdf")), None);
    }
}
