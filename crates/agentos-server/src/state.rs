//! `AppState`: what every handler, extractor and the auth layer share.

use agentos_engine::Engine;

#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub max_body_bytes: usize,
    pub max_result_bytes: usize,
    /// How long a request's body may take to arrive, before its length's share (see
    /// [`crate::extract::read_body`]): the connection's header timeout.
    pub body_timeout: std::time::Duration,
}
