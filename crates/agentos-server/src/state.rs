//! `AppState`: what every handler, extractor and the auth layer share.

use agentos_engine::Engine;

#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub max_body_bytes: usize,
    pub max_result_bytes: usize,
}
