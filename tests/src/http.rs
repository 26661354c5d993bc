//! A small HTTP client for the spec's JSON doors.

use reqwest::Method;
use serde_json::Value;

/// One answer: the status, the JSON body (or `null`) and the `Retry-After` header.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// JSON body, `Value::Null` when empty or not JSON.
    pub body: Value,
    /// `Retry-After`, when present.
    pub retry_after: Option<String>,
}

impl Answer {
    /// The error body's `code`, when there is one.
    pub fn code(&self) -> Option<&str> {
        self.body["code"].as_str()
    }

    /// The error body's `message`, or "".
    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_default()
    }
}

/// A client bound to one server and one bearer token.
#[derive(Clone, Debug)]
pub struct Http {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Http {
    /// A client of `base` (e.g. `http://127.0.0.1:1234`) sending `token` as the bearer.
    pub fn new(base: &str, token: Option<&str>) -> Http {
        Http { client: reqwest::Client::new(), base: base.to_owned(), token: token.map(str::to_owned) }
    }

    /// Sends a request with an optional raw body.
    pub async fn send(&self, method: Method, path: &str, body: Option<String>) -> Answer {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body);
        }
        let response = request.send().await.expect("http request");
        let status = response.status().as_u16();
        let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let text = response.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Answer { status, body, retry_after }
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, None).await
    }

    /// `PUT path` with a JSON body.
    pub async fn put(&self, path: &str, body: &Value) -> Answer {
        self.send(Method::PUT, path, Some(body.to_string())).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Answer {
        self.send(Method::POST, path, Some(body.to_string())).await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> Answer {
        self.send(Method::DELETE, path, None).await
    }

    /// `PUT /agent_api/v1/profile/configuration`.
    pub async fn declare(&self, body: &Value) -> Answer {
        self.put("/agent_api/v1/profile/configuration", body).await
    }

    /// `GET /agent_api/v1/profile`.
    pub async fn profile(&self) -> Answer {
        self.get("/agent_api/v1/profile").await
    }
}
