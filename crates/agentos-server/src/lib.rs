//! The master's HTTP face: the API (axum), its OpenAPI document, bearer auth with a permission per route, and `run`.

mod admin_api;
mod api;
mod auth;
mod connections;
mod data_folder;
mod error;
mod extract;
mod nets_api;
mod openapi;
pub mod routes;
mod run;

pub use connections::ConnectionLimits;
pub use error::ApiError;
pub use run::{LooseDataFolder, Ready, ServeConfig, ServeError, run};

/// Builds the router over an engine.
pub fn router(engine: agentos_engine::Engine, max_body_bytes: usize, max_result_bytes: usize) -> axum::Router {
    api::router(api::AppState { engine, max_body_bytes, max_result_bytes })
}
