//! The web console's assets at `/console` (`docs/console.md`): one page, its script and its
//! style sheet, built into the binary, so `nexus serve` is all a person needs. They hold no data:
//! the page signs in with a member token kept in the tab's `sessionStorage` and reads everything
//! through the same doors as every client, the token sent as a bearer header (never in a cookie
//! or a URL). Served to anyone, like any static file; the doors decide what a token may see.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

const INDEX: &str = include_str!("../../console/index.html");
const SCRIPT: &str = include_str!("../../console/app.js");
const STYLE: &str = include_str!("../../console/app.css");

/// What the page may load: its own script, style and doors only; no inline script, no frames.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /console` (and `/console/`), `/console/app.js`, `/console/app.css`.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/console", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/console/", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/console/app.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/console/app.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // A new nexus serves its own page: never a cached one of an older binary.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_assets_and_never_puts_server_text_in_as_markup() {
        assert!(INDEX.contains(r#"<script src="/console/app.js"></script>"#));
        assert!(!INDEX.contains("<script>"), "no inline script: the policy forbids it");
        for forbidden in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "localStorage",
            "document.cookie",
        ] {
            assert!(!SCRIPT.contains(forbidden), "the script uses {forbidden}");
        }
        assert!(SCRIPT.contains("sessionStorage"));
    }
}
