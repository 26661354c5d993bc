//! The command line's client of the HTTP doors (`nexus run`, `nexus executions ...`, `nexus
//! login`; README "The command line"). It is a client like any other: the doors decide, and a
//! refusal comes back with its word and message.
//!
//! Where the server and the token come from, first found wins: the flags `--url` and `--token`,
//! the environment (`NEXUS_URL`, `NEXUS_TOKEN`), then the credentials file that `nexus login`
//! writes ([`credentials_path`]). Without any, the URL is `http://127.0.0.1:7740`.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use nexus_proto::{ErrorCode, Refusal};

/// The server a command talks to when nothing names one.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7740";

/// How long one request may take before the command gives up (a follow is not bounded: it
/// lasts as long as the execution).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What a command failed with: a refusal of the doors (its word and message), or no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server refused: `{code, message}` as its doors answer.
    #[error("{0}")]
    Refused(Refusal),
    /// The server could not be reached, or answered something that is not a door's answer.
    #[error("{0}")]
    Transport(String),
    /// The command cannot run as asked (no token, a file that cannot be read, ...).
    #[error("{0}")]
    Usage(String),
}

impl ClientError {
    /// The word a `--json` caller reads: the refusal's, else `unavailable` for a transport
    /// failure and `parameter_invalid` for a usage error.
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Refused(refusal) => refusal.code,
            ClientError::Transport(_) => ErrorCode::Unavailable,
            ClientError::Usage(_) => ErrorCode::ParameterInvalid,
        }
    }
}

/// The saved login: `{url, token}`, as `nexus login` writes it (mode 0600).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Credentials {
    /// The server's base URL.
    pub url: Option<String>,
    /// The member's bearer token.
    pub token: Option<String>,
}

/// Where `nexus login` keeps the credentials: `$NEXUS_CREDENTIALS`, else
/// `$XDG_CONFIG_HOME/nexus/credentials.json`, else `~/.config/nexus/credentials.json`.
pub fn credentials_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("NEXUS_CREDENTIALS") {
        return Some(PathBuf::from(path));
    }
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(config.join("nexus").join("credentials.json"))
}

/// The saved credentials, or none when no file is there.
///
/// # Errors
/// [`ClientError::Usage`] for a file that cannot be read or is not `{url, token}` JSON.
pub fn saved_credentials() -> Result<Credentials, ClientError> {
    let Some(path) = credentials_path() else { return Ok(Credentials::default()) };
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| {
            ClientError::Usage(format!("{} is not a credentials file ({e}); run `nexus login` again", path.display()))
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Credentials::default()),
        Err(error) => Err(ClientError::Usage(format!("cannot read {}: {error}", path.display()))),
    }
}

/// Writes `credentials` where [`credentials_path`] says, readable by this user only.
///
/// # Errors
/// [`ClientError::Usage`] when the file cannot be written.
pub fn save_credentials(credentials: &Credentials) -> Result<PathBuf, ClientError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = credentials_path()
        .ok_or_else(|| ClientError::Usage("no home directory: set NEXUS_CREDENTIALS to a file path".to_owned()))?;
    let cannot = |e: std::io::Error| ClientError::Usage(format!("cannot write {}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(cannot)?;
    }
    let text = serde_json::to_string_pretty(credentials).map_err(|e| ClientError::Usage(e.to_string()))?;
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&path).map_err(cannot)?;
    file.write_all(text.as_bytes()).map_err(cannot)?;
    file.write_all(b"\n").map_err(cannot)?;
    Ok(path)
}

/// A client of one server, with one member's token.
#[derive(Clone, Debug)]
pub struct Client {
    url: String,
    token: String,
    http: reqwest::Client,
}

impl Client {
    /// A client of `url` (no trailing slash needed) presenting `token`.
    ///
    /// # Errors
    /// [`ClientError::Usage`] for a URL that is not `http://` or `https://`.
    pub fn new(url: &str, token: &str) -> Result<Client, ClientError> {
        let url = url.trim_end_matches('/').to_owned();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ClientError::Usage(format!("--url {url:?} is not an http:// or https:// URL")));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        Ok(Client { url, token: token.to_owned(), http })
    }

    /// A client from the flags, the environment or the saved login ([`Client`] module docs).
    ///
    /// # Errors
    /// [`ClientError::Usage`] when no token is found anywhere.
    pub fn resolve(url: Option<String>, token: Option<String>) -> Result<Client, ClientError> {
        let saved = saved_credentials()?;
        let url = url.or(saved.url).unwrap_or_else(|| DEFAULT_URL.to_owned());
        let token = token.or(saved.token).ok_or_else(|| {
            ClientError::Usage(
                "no token: pass --token, set NEXUS_TOKEN, or run `nexus login --url URL --token TOKEN` once".to_owned(),
            )
        })?;
        Client::new(&url, &token)
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `GET path` (with its query), answered as JSON.
    ///
    /// # Errors
    /// The door's refusal, or [`ClientError::Transport`].
    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        self.send(self.http.get(format!("{}{path}", self.url))).await
    }

    /// `POST path` with `body` as JSON.
    ///
    /// # Errors
    /// As [`Client::get`].
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.send(self.http.post(format!("{}{path}", self.url)).json(body)).await
    }

    /// `PUT path` with `body` as JSON.
    ///
    /// # Errors
    /// As [`Client::get`].
    pub async fn put(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.send(self.http.put(format!("{}{path}", self.url)).json(body)).await
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, ClientError> {
        let answer =
            request.bearer_auth(&self.token).timeout(REQUEST_TIMEOUT).send().await.map_err(|e| self.unreachable(&e))?;
        let status = answer.status();
        let body = answer.bytes().await.map_err(|e| self.unreachable(&e))?;
        let value: Value = serde_json::from_slice(&body).map_err(|_| {
            ClientError::Transport(format!(
                "{} answered {status} with a body that is not JSON: is it a nexus server?",
                self.url
            ))
        })?;
        if status.is_success() {
            return Ok(value);
        }
        Err(refusal_of(&value).map_or_else(
            || ClientError::Transport(format!("{} answered {status}: {value}", self.url)),
            ClientError::Refused,
        ))
    }

    fn unreachable(&self, error: &reqwest::Error) -> ClientError {
        let mut reason = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            reason = format!("{reason}: {cause}");
            source = cause.source();
        }
        ClientError::Transport(format!("cannot reach nexus at {}: {reason}", self.url))
    }

    /// Opens the live event stream of `execution` after `after` (a cursor, or empty), with the
    /// transcript deltas when `transcript` is set.
    ///
    /// # Errors
    /// The door's refusal, or [`ClientError::Transport`].
    pub async fn follow(&self, execution: &str, after: &str, transcript: bool) -> Result<EventStream, ClientError> {
        let mut path =
            format!("{}/agent_api/v1/executions/{execution}/events/stream?transcript={transcript}", self.url);
        if !after.is_empty() {
            path.push_str(&format!("&after={after}"));
        }
        let answer = self.http.get(path).bearer_auth(&self.token).send().await.map_err(|e| self.unreachable(&e))?;
        if !answer.status().is_success() {
            let status = answer.status();
            let value: Value = answer.json().await.unwrap_or(Value::Null);
            return Err(refusal_of(&value).map_or_else(
                || ClientError::Transport(format!("{} answered {status}", self.url)),
                ClientError::Refused,
            ));
        }
        Ok(EventStream { answer, buffer: Vec::new() })
    }
}

/// The refusal in a door's error body `{code, message}`, if it is one.
fn refusal_of(value: &Value) -> Option<Refusal> {
    let code = value["code"].as_str().and_then(ErrorCode::from_word)?;
    Some(Refusal::new(code, value["message"].as_str().unwrap_or_default()))
}

/// One Server-Sent Event of an execution's stream: its `id` (the durable cursor; empty for a
/// delta), its `event` type and its JSON `data`.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamEvent {
    /// The cursor, `cvei_N`, or empty.
    pub id: String,
    /// The event's type (`task_status`, `text_delta`, `error`, ...).
    pub event: String,
    /// `{cursor?, data, at}` as the door sends it, or `{code, message}` for `error`.
    pub data: Value,
}

/// An open event stream ([`Client::follow`]).
#[derive(Debug)]
pub struct EventStream {
    answer: reqwest::Response,
    buffer: Vec<u8>,
}

impl EventStream {
    /// The next event; `None` once the stream ended.
    ///
    /// # Errors
    /// [`ClientError::Transport`] when the connection breaks.
    pub async fn next(&mut self) -> Result<Option<StreamEvent>, ClientError> {
        loop {
            if let Some(end) = find_blank_line(&self.buffer) {
                let block: Vec<u8> = self.buffer.drain(..end.0).collect();
                self.buffer.drain(..end.1 - end.0);
                if let Some(event) = parse_block(&String::from_utf8_lossy(&block)) {
                    return Ok(Some(event));
                }
                continue;
            }
            match self.answer.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) => return Ok(None),
                Err(error) => return Err(ClientError::Transport(format!("the event stream broke: {error}"))),
            }
        }
    }
}

/// Where the first event block of `buffer` ends: `(end of the block, start of the next)`.
fn find_blank_line(buffer: &[u8]) -> Option<(usize, usize)> {
    let lf = buffer.windows(2).position(|w| w == b"\n\n").map(|at| (at, at + 2));
    let crlf = buffer.windows(4).position(|w| w == b"\r\n\r\n").map(|at| (at, at + 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// One SSE block as an event; `None` for a comment (a keep-alive) or a block without data.
fn parse_block(block: &str) -> Option<StreamEvent> {
    let (mut id, mut event, mut data) = (String::new(), String::from("message"), String::new());
    let mut any = false;
    for line in block.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => id = value.to_owned(),
            "event" => event = value.to_owned(),
            "data" => {
                if any {
                    data.push('\n');
                }
                data.push_str(value);
                any = true;
            }
            _ => {}
        }
    }
    any.then(|| StreamEvent { id, event, data: serde_json::from_str(&data).unwrap_or(Value::String(data)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_blocks_parse_and_comments_are_skipped() {
        let event = parse_block("id: cvei_3\nevent: task_status\ndata: {\"cursor\":\"cvei_3\"}").expect("event");
        assert_eq!((event.id.as_str(), event.event.as_str()), ("cvei_3", "task_status"));
        assert_eq!(event.data["cursor"], "cvei_3");
        assert_eq!(parse_block(": keep-alive"), None);
        let delta = parse_block("event:text_delta\ndata:{\"data\":{\"text\":\"hi\"}}").expect("delta");
        assert_eq!((delta.id.as_str(), delta.data["data"]["text"].as_str()), ("", Some("hi")));
        assert_eq!(find_blank_line(b"a\n\nb"), Some((1, 3)));
        assert_eq!(find_blank_line(b"a\r\n\r\nb"), Some((1, 5)));
        assert_eq!(find_blank_line(b"a\n"), None);
    }

    #[test]
    fn refusals_are_read_from_error_bodies() {
        let refusal = refusal_of(&serde_json::json!({"code": "not_found", "message": "no such execution"}));
        assert_eq!(refusal.map(|r| r.code), Some(ErrorCode::NotFound));
        assert!(refusal_of(&serde_json::json!({"code": "made_up"})).is_none());
        assert!(refusal_of(&serde_json::json!([1])).is_none());
    }

    #[test]
    fn urls_must_be_http() {
        assert!(matches!(Client::new("127.0.0.1:7740", "t"), Err(ClientError::Usage(_))));
        assert_eq!(Client::new("http://127.0.0.1:7740/", "t").expect("client").url(), "http://127.0.0.1:7740");
    }
}
