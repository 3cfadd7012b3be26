//! The engine: the catalog as the fold of the event log, commands that commit events, principals,
//! snapshots, dispatch to executors, and the net runtime. `engine` maps its subsystems.

pub mod access;
pub mod admin;
pub mod bindings;
pub mod call;
pub mod catalog;
pub mod commands;
mod committer;
pub mod dispatch;
pub mod engine;
pub mod error;
mod firing_marker;
pub mod host;
pub mod jobs;
mod ledger;
pub mod lines;
mod shared_jobs;
pub use ledger::limit_allocator_arenas;
pub mod nets;
mod open;
pub mod outbound;
mod prepared;
pub mod principal;
pub mod progress;
pub mod recent;
mod records;
pub mod redact;
pub mod sandbox;
mod slots;

pub use catalog::History;
pub use engine::{Catalog, Dispatch, Engine, EngineConfig, HostToolkits, Nets, Principals, Sharing};
pub use error::EngineError;
pub use jobs::DispatchConfig;
pub use jobs::JobConfig;
pub use ledger::Restored;
pub use nets::NetLimits;
pub use principal::Principal;
pub use slots::SlotGuard;
