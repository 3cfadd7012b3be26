//! The web page for people: `/` and its two files, compiled into the binary (nothing fetched
//! from elsewhere, no build step). The page holds no data of its own: it signs in with a token
//! and reads the same API as any client, so it never shows more than the token may see.

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

/// Scripts and styles from this origin only, no inline script, connections to this origin only,
/// no framing, no form posting elsewhere.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The routes of the page, outside the API's authorization (they carry no data).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|h: HeaderMap| async move { serve(&h, INDEX, "text/html; charset=utf-8") }))
        .route("/ui/app.js", get(|h: HeaderMap| async move { serve(&h, SCRIPT, "text/javascript; charset=utf-8") }))
        .route("/ui/app.css", get(|h: HeaderMap| async move { serve(&h, STYLE, "text/css; charset=utf-8") }))
}

/// A file with its validator: the binary's files change only with the binary, so a browser
/// asks again (`no-cache`) and is answered 304 while it has them.
fn serve(request: &HeaderMap, body: &'static str, kind: &'static str) -> Response {
    let etag = format!("\"{}\"", &agentos_core::sha256_hex(body.as_bytes())[..16]);
    let fresh = request.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).is_some_and(|v| v == etag);
    let mut resp = if fresh { StatusCode::NOT_MODIFIED.into_response() } else { body.into_response() };
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    resp
}
