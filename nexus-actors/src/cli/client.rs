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

/// How long an event stream may stay silent before it is taken as broken and followed again:
/// the server sends a keep-alive comment every 15 s.
pub const STREAM_SILENCE: Duration = Duration::from_secs(45);

/// What a command failed with: a refusal of the doors (its word and message), or no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server refused: `{code, message}` as its doors answer.
    #[error("{}", said(.0))]
    Refused(Refusal),
    /// The server could not be reached, or its answer broke off.
    #[error("{0}")]
    Transport(String),
    /// What answered is not a nexus door (a wrong URL, a proxy's error page).
    #[error("{0}")]
    NotNexus(String),
    /// The command cannot run as asked (no token, a file that cannot be read, ...).
    #[error("{0}")]
    Usage(String),
}

/// A refusal as a person reads it: its word, then its message (once, when the message already
/// starts with the word).
fn said(refusal: &Refusal) -> String {
    let word = refusal.code.as_str();
    if refusal.message.starts_with(word) { refusal.message.clone() } else { format!("{word}: {}", refusal.message) }
}

impl ClientError {
    /// The word a `--json` caller reads: the refusal's, else `unavailable` for a transport
    /// failure and `parameter_invalid` for a usage error.
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Refused(refusal) => refusal.code,
            ClientError::Transport(_) | ClientError::NotNexus(_) => ErrorCode::Unavailable,
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
    // `mode` applies only to a file it creates: one that was there is made private too.
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).map_err(cannot)?;
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
    /// The saved login is read only for what the flags and the environment leave out, and its
    /// token goes only to its own server: with another `--url`, a token must be given too.
    ///
    /// # Errors
    /// [`ClientError::Usage`] when no token is found, or the saved one is for another server.
    pub fn resolve(url: Option<String>, token: Option<String>) -> Result<Client, ClientError> {
        if let (Some(url), Some(token)) = (&url, &token) {
            return Client::new(url, token);
        }
        let saved = saved_credentials()?;
        let same =
            |saved: &str| url.as_deref().is_none_or(|url| url.trim_end_matches('/') == saved.trim_end_matches('/'));
        let token = match (token, saved.token, saved.url.as_deref()) {
            (Some(token), _, _) => token,
            (None, Some(token), Some(saved_url)) if same(saved_url) => token,
            (None, Some(_), Some(saved_url)) => {
                return Err(ClientError::Usage(format!(
                    "the saved login is for {saved_url}, not {}: pass --token (or NEXUS_TOKEN) for that server, or `nexus login --url` it",
                    url.as_deref().unwrap_or_default()
                )));
            }
            _ => {
                return Err(ClientError::Usage(
                    "no token: pass --token, set NEXUS_TOKEN, or run `nexus login --url URL --token TOKEN` once"
                        .to_owned(),
                ));
            }
        };
        let url = url.or(saved.url).unwrap_or_else(|| DEFAULT_URL.to_owned());
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

    /// `PUT path` with `body`, JSON text sent as it is.
    ///
    /// # Errors
    /// As [`Client::get`].
    pub async fn put_raw(&self, path: &str, body: String) -> Result<Value, ClientError> {
        let request =
            self.http.put(format!("{}{path}", self.url)).header(reqwest::header::CONTENT_TYPE, "application/json");
        self.send(request.body(body)).await
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, ClientError> {
        let answer =
            request.bearer_auth(&self.token).timeout(REQUEST_TIMEOUT).send().await.map_err(|e| self.unreachable(&e))?;
        let status = answer.status();
        let body = answer.bytes().await.map_err(|e| self.unreachable(&e))?;
        let value: Value = serde_json::from_slice(&body).map_err(|_| self.not_nexus(status))?;
        if status.is_success() {
            return Ok(value);
        }
        Err(refusal_of(&value).map_or_else(|| self.not_nexus(status), ClientError::Refused))
    }

    fn not_nexus(&self, status: reqwest::StatusCode) -> ClientError {
        ClientError::NotNexus(format!(
            "{} answered {status} with something that is not a nexus door's answer: is it a nexus server?",
            self.url
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
    /// transcript deltas and the runners' progress when `live` is set.
    ///
    /// # Errors
    /// The door's refusal, [`ClientError::NotNexus`], or [`ClientError::Transport`] (no answer
    /// within [`REQUEST_TIMEOUT`] included).
    pub async fn follow(&self, execution: &str, after: &str, live: bool) -> Result<EventStream, ClientError> {
        let mut path =
            format!("{}/agent_api/v1/executions/{execution}/events/stream?transcript={live}&progress={live}", self.url);
        if !after.is_empty() {
            path.push_str(&format!("&after={after}"));
        }
        let request = self.http.get(path).bearer_auth(&self.token).send();
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, request)
            .await
            .map_err(|_| {
                ClientError::Transport(format!("no answer from {} within {} s", self.url, REQUEST_TIMEOUT.as_secs()))
            })?
            .map_err(|e| self.unreachable(&e))?;
        if !answer.status().is_success() {
            let status = answer.status();
            let value: Value = answer.json().await.unwrap_or(Value::Null);
            return Err(match refusal_of(&value) {
                Some(refusal) => ClientError::Refused(refusal),
                // A 5xx without a word (a proxy between, a node restarting): followed again.
                None if status.is_server_error() => ClientError::Transport(format!("{} answered {status}", self.url)),
                None => self.not_nexus(status),
            });
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
            match tokio::time::timeout(STREAM_SILENCE, self.answer.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buffer.extend_from_slice(&chunk),
                Ok(Ok(None)) => return Ok(None),
                Ok(Err(_)) => return Err(ClientError::Transport("the event stream broke off".to_owned())),
                Err(_) => {
                    return Err(ClientError::Transport(format!(
                        "no word from nexus for {} s on the event stream",
                        STREAM_SILENCE.as_secs()
                    )));
                }
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
