//! Reading one's own writes across masters: every answer carries `Agentos-Seq`, the last event
//! this master has folded; a request with `Agentos-Min-Seq: N` waits until this master has
//! folded event N (at most [`MIN_SEQ_WAIT`], then 503), so a client that wrote through one
//! master reads the write through any other.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;

pub const SEQ_HEADER: &str = "agentos-seq";
pub const MIN_SEQ_HEADER: &str = "agentos-min-seq";

/// How long a request waits for the event its `Agentos-Min-Seq` names.
pub const MIN_SEQ_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Adds `Agentos-Seq` to every answer, refusals included.
pub async fn seq_header(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    with_seq(&mut resp, state.engine.last_seq());
    resp
}

/// Waits for the event `Agentos-Min-Seq` names. Runs after authentication and the route's
/// permission: a caller the request is refused to never holds a connection waiting.
pub async fn read_your_writes(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(v) = req.headers().get(MIN_SEQ_HEADER) {
        let Some(min) = v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) else {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_header",
                "Agentos-Min-Seq must be an event's sequence number (a whole number), as an earlier answer's Agentos-Seq gave it",
            )
            .into_response();
        };
        if state.engine.last_seq() < min {
            let folded = state.engine.wait_for_seq(min, MIN_SEQ_WAIT).await;
            if folded < min {
                let mut resp = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "seq_not_reached",
                    format!(
                        "this master has folded the log up to event {folded}, and event {min} (Agentos-Min-Seq) did not reach it within {} s: retry, or ask another master",
                        MIN_SEQ_WAIT.as_secs()
                    ),
                )
                .into_response();
                with_seq(&mut resp, folded);
                return resp;
            }
        }
    }
    next.run(req).await
}

fn with_seq(resp: &mut Response, seq: u64) {
    resp.headers_mut().insert(SEQ_HEADER, HeaderValue::from(seq));
}
