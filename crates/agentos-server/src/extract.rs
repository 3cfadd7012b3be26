//! Extractors that fail with an `ApiError` instead of axum's plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

/// The request body as JSON, bounded by the master's body limit.
pub struct JsonValue(pub serde_json::Value);

/// An executor's result post: JSON bounded by the larger result limit (it carries captured output).
pub struct ResultBody(pub serde_json::Value);

/// The longest a body may go without a byte arriving, whatever its size: a sender that stops
/// is let go after this rather than at the whole body's deadline.
const BODY_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// The shortest pause allowed, however short the header timeout: a result of megabytes on a
/// link that stalls for a second or two is not cut.
const BODY_IDLE_FLOOR: std::time::Duration = std::time::Duration::from_secs(5);

/// The most a body's buffer reserves ahead of what arrived: a sender that declares the limit
/// and sends little reserves little.
const RESERVE_AHEAD: usize = 1024 * 1024;

/// Reads a request's body whole: at most `limit` bytes (413 past it, naming `flag`), within the
/// connection's header timeout plus a second for every 256 KiB it may hold, and with no pause
/// longer than the header timeout, kept between [`BODY_IDLE_FLOOR`] and [`BODY_IDLE`] (408
/// past either). A body that stalls half way would otherwise hold its connection, and one of
/// the master's `--max-connections`, for as long as its sender liked.
/// The refusal of a body over `limit` bytes, the master's `flag`.
pub fn too_large(limit: usize, flag: &str) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("the request body is larger than {limit} bytes (the master's {flag})"),
    )
}

pub async fn read_body(
    body: axum::body::Body,
    declared: Option<usize>,
    limit: usize,
    flag: &str,
    timeout: std::time::Duration,
) -> Result<Bytes, ApiError> {
    let too_large = || too_large(limit, flag);
    if declared.is_some_and(|len| len > limit) {
        return Err(too_large());
    }
    let share = std::time::Duration::from_secs((declared.unwrap_or(limit) / (256 * 1024)) as u64);
    let (deadline, idle) = (timeout + share, timeout.clamp(BODY_IDLE_FLOOR, BODY_IDLE));
    let stalled = |why: String| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!("the request body {why}; send it whole, at once, after its headers"),
        )
    };
    let read = async {
        let mut chunks = body.into_data_stream();
        // One chunk is handed on as it came; several are joined.
        let (mut first, mut joined) = (None::<Bytes>, None::<Vec<u8>>);
        let mut length = 0usize;
        loop {
            let chunk = match tokio::time::timeout(idle, chunks.next()).await {
                Err(_) => {
                    let why =
                        format!("stopped arriving: nothing came for {} ms after {length} bytes", idle.as_millis());
                    return Err(stalled(why));
                }
                Ok(None) => break,
                // The connection broke, or the body was refused on the way.
                Ok(Some(Err(_))) => return Err(too_large()),
                Ok(Some(Ok(chunk))) => chunk,
            };
            length += chunk.len();
            if length > limit {
                return Err(too_large());
            }
            match (&mut first, &mut joined) {
                (_, Some(all)) => all.extend_from_slice(&chunk),
                (Some(one), None) => {
                    let mut all = Vec::with_capacity(declared.unwrap_or(0).clamp(length, length + RESERVE_AHEAD));
                    all.extend_from_slice(one);
                    all.extend_from_slice(&chunk);
                    joined = Some(all);
                }
                (None, None) => first = Some(chunk),
            }
        }
        Ok(joined.map(Bytes::from).or(first).unwrap_or_default())
    };
    match tokio::time::timeout(deadline, read).await {
        Ok(read) => read,
        Err(_) => Err(stalled(format!("did not arrive within {} ms", deadline.as_millis()))),
    }
}

/// The `Content-Length` a request declares, if any.
pub fn declared_length(headers: &axum::http::HeaderMap) -> Option<usize> {
    headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok())
}

async fn read_json(
    req: Request,
    limit: usize,
    flag: &str,
    timeout: std::time::Duration,
) -> Result<serde_json::Value, ApiError> {
    let declared = declared_length(req.headers());
    let bytes = read_body(req.into_body(), declared, limit, flag, timeout).await?;
    if bytes.is_empty() {
        return Err(ApiError::bad_request("malformed_json", "the request body is empty; send a JSON object"));
    }
    serde_json::from_slice(&bytes).map_err(body_refused)
}

/// Why a body did not read. Nesting past the reader's limit is not a syntax error: it is said as
/// such, with what may be stored.
fn body_refused(e: serde_json::Error) -> ApiError {
    if agentos_core::depth::is_recursion_limit(&e) {
        return ApiError::bad_request(
            "too_deep",
            format!(
                "the request body nests more than {} levels deep (at line {} column {}); token data may nest at most {} levels",
                agentos_core::depth::READER_DEPTH,
                e.line(),
                e.column(),
                agentos_core::depth::MAX_TOKEN_DEPTH
            ),
        );
    }
    ApiError::bad_request("malformed_json", format!("the request body is not valid JSON: {e}"))
}

impl FromRequest<AppState> for JsonValue {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        read_json(req, state.max_body_bytes, "--max-body-bytes", state.body_timeout).await.map(JsonValue)
    }
}

impl FromRequest<AppState> for ResultBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        read_json(req, state.max_result_bytes, "--max-result-bytes", state.body_timeout).await.map(ResultBody)
    }
}

/// The body of a request that takes none (fire a transition, cancel a job): empty, or `{}` as
/// clients that always send JSON do. Anything else is refused (400 `unexpected_body`) rather
/// than ignored: a caller who sends tokens or options with a fire would otherwise believe they
/// were used.
pub struct NoBody;

impl FromRequest<AppState> for NoBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let what = format!("{} {}", req.method(), req.uri().path());
        let declared = declared_length(req.headers());
        let bytes =
            read_body(req.into_body(), declared, state.max_body_bytes, "--max-body-bytes", state.body_timeout).await?;
        let text = bytes.trim_ascii();
        if text.is_empty()
            || serde_json::from_slice::<serde_json::Value>(text).is_ok_and(|v| v == serde_json::json!({}))
        {
            return Ok(NoBody);
        }
        Err(ApiError::bad_request(
            "unexpected_body",
            format!(
                "{what} takes no body, and {} bytes came: send none (or {{}}); it reads nothing from one",
                bytes.len()
            ),
        ))
    }
}

/// Parses a JSON value into a typed body, naming the field at fault.
pub fn typed<T: DeserializeOwned>(v: serde_json::Value) -> Result<T, ApiError> {
    // Every body read here is an object. serde's derive reads a struct from an array too
    // (`["l1"]` as `{"leaseId": "l1"}`), so any other value is refused here, as what it is.
    let kind = match &v {
        serde_json::Value::Object(_) => None,
        serde_json::Value::Array(_) => Some("an array"),
        serde_json::Value::String(_) => Some("a string"),
        serde_json::Value::Number(_) => Some("a number"),
        serde_json::Value::Bool(_) => Some("a boolean"),
        serde_json::Value::Null => Some("null"),
    };
    if let Some(kind) = kind {
        return Err(ApiError::bad_request("invalid_body", format!("the request body is {kind}: send a JSON object")));
    }
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." { String::new() } else { format!(" at {path}") };
        ApiError::bad_request("invalid_body", format!("invalid request body{at}: {}", e.inner()))
    })
}

/// Path parameters, refused as the API's JSON error (`invalid_path`) rather than axum's plain
/// text when they do not read (a segment that is not UTF-8 once decoded, say).
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(rejection) => Err(ApiError::new(rejection.status(), "invalid_path", rejection.body_text())),
        }
    }
}

/// Query parameters; unknown ones are refused so a typo never silently widens a search.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let q = parts.uri.query().unwrap_or("");
        // Through the path so that a refusal names the parameter (`limit=-1`: "limit: invalid
        // digit found in string" rather than the bare reason).
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(q.as_bytes()));
        serde_path_to_error::deserialize(de).map(QueryParams).map_err(|e| {
            let at = e.path().to_string();
            let at = if at == "." { String::new() } else { format!("{at}: ") };
            ApiError::bad_request("invalid_query", format!("invalid query parameters: {at}{}", e.inner()))
        })
    }
}
