//! `ServeError`: why a master could not open its data folder or start serving.

use std::path::PathBuf;

use agentos_engine::EngineError;
use agentos_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the data folder {0} is in use by another master (its LOCK file is held)")]
    Locked(PathBuf),
    #[error("the data folder {0} is not a folder; give --data (or AGENTOS_DATA) a folder, which is made if missing")]
    NotAFolder(PathBuf),
    #[error(
        "the data folder {dir} is open to other users ({found}); its event log, blobs, secrets key and operator token must be the master's alone. Close it with: {fix}"
    )]
    OpenToOthers { dir: PathBuf, found: String, fix: String },
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("{0}")]
    Expressions(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Engine(#[from] EngineError),
}
