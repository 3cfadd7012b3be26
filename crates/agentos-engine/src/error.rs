//! The one error type of the engine crate.

use agentos_core::{CoreError, ErrorKind};
use agentos_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Core(#[from] CoreError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl EngineError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::Core(e) => e.kind,
            EngineError::Store(StoreError::BlobNotFound(_)) => ErrorKind::NotFound,
            EngineError::Store(StoreError::BlobCorrupt { .. }) => ErrorKind::Corrupt,
            EngineError::Store(StoreError::Unavailable(_) | StoreError::Conflict { .. }) => ErrorKind::StorageDown,
            EngineError::Store(_) => ErrorKind::Internal,
        }
    }
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::Core(e) => e.code,
            EngineError::Store(StoreError::BlobNotFound(_)) => "blob_not_found",
            EngineError::Store(StoreError::BlobCorrupt { .. }) => "blob_corrupt",
            EngineError::Store(StoreError::Unavailable(_) | StoreError::Conflict { .. }) => "storage_unavailable",
            EngineError::Store(_) => "storage_fault",
        }
    }
    /// Same error, for handing one failure to several waiters.
    pub fn duplicate(&self) -> EngineError {
        if let EngineError::Core(e) = self {
            return EngineError::Core(e.clone());
        }
        EngineError::Core(CoreError::new(self.kind(), self.code(), self.to_string()))
    }
}
