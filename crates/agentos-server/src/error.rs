//! `ApiError`: every failure at the HTTP edge becomes `{"error":{"code","message"}}` with the right status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use agentos_core::{CoreError, ErrorKind};
use agentos_engine::EngineError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// The service's answer when that is the failure (see [`ErrorDetail::response`]).
    pub response: Option<serde_json::Value>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable, e.g. `invalid_id`.
    pub code: String,
    /// What was wrong and what to do.
    pub message: String,
    /// What the service behind the tool answered, when that answer is the failure (an http
    /// operation's status outside 2xx): `{status, contentType, headers, body}`, as a success
    /// answer is shaped, with the body cut to the inline limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub response: Option<serde_json::Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into(), response: None }
    }
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::BadInput => StatusCode::BAD_REQUEST,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Unavailable => StatusCode::GATEWAY_TIMEOUT,
        ErrorKind::StorageDown => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::ToolFailed => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::TooMany => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Corrupt | ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> Self {
        ApiError::from(EngineError::Core(e))
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let kind = e.kind();
        if kind == ErrorKind::Internal {
            // Internal details go to the log, not to the caller.
            tracing::error!(error = %e, "internal error");
            return ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                e.code(),
                "internal error; the master's log has the details",
            );
        }
        if kind == ErrorKind::Corrupt {
            tracing::error!(error = %e, "integrity check failed");
        }
        let response = match &e {
            EngineError::Core(c) => c.response.as_deref().cloned(),
            EngineError::Store(_) => None,
        };
        ApiError { response, ..ApiError::new(status_of(kind), e.code(), e.to_string()) }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail { code: self.code.to_string(), message: self.message, response: self.response },
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
        }
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body is never read, so the connection cannot carry another request:
            // say so, or a client that reuses it races the close.
            resp.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
        }
        resp
    }
}
