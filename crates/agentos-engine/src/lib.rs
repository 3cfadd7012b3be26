//! The engine: the catalog as the fold of the event log, commands that commit events, principals, snapshots.

mod committer;
pub mod engine;
pub mod error;
pub mod principal;

pub use engine::{Engine, EngineConfig, History, Restored};
pub use error::EngineError;
pub use principal::Principal;
