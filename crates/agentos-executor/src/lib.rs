//! The executor: polls the master over an egress-only connection, verifies every script
//! against its sha256 again, caches it by digest, and runs it in a clean, bounded process.

pub mod cache;
pub mod cgroup;
pub mod folders;
mod instance;
pub mod job;
pub mod protocol;
pub mod runner;
pub mod sealed;
mod spawn;
mod worker;

pub use worker::{
    ExecutorConfig, ExecutorError, folders_closed_to, forbid_inspection, run, workspace_reachable, workspace_unsafe,
};
