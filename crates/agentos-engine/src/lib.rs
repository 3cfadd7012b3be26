//! The engine: the catalog as the fold of the event log, commands that commit events, principals, snapshots.

pub mod access;
pub mod admin;
pub mod bindings;
pub mod call;
pub mod commands;
mod committer;
pub mod dispatch;
pub mod engine;
pub mod error;
mod firing_marker;
pub mod host;
pub mod jobs;
pub mod nets;
pub mod outbound;
pub mod principal;
pub mod redact;
pub mod sandbox;

pub use dispatch::DispatchConfig;
pub use engine::{Engine, EngineConfig, History, Restored};
pub use error::EngineError;
pub use jobs::JobConfig;
pub use nets::NetLimits;
pub use principal::Principal;
