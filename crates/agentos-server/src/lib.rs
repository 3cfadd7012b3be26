//! The master's HTTP face: the API (axum), its wire types and OpenAPI document, bearer auth with a permission per route, and `run`.

mod admin_api;
mod api;
mod auth;
mod connections;
pub mod consistency;
mod data_folder;
mod error;
mod extract;
mod mcp;
pub mod migrate;
mod nets_api;
mod openapi;
mod router;
pub mod routes;
mod run;
mod serve_error;
mod state;
mod ui;
pub mod wire;

pub use agentos_core::message_id::IdScan;
pub use connections::ConnectionLimits;
pub use data_folder::LooseDataFolder;
pub use error::ApiError;
pub use mcp::McpEndpoint;
pub use router::router;
pub use run::{Expressions, Ready, ServeConfig, Storage, run};
pub use serve_error::ServeError;
