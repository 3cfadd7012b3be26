//! The one error type of the storage crate.

use agentos_core::urn::BlobUrn;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("blob {0} not found")]
    BlobNotFound(BlobUrn),
    #[error("blob {urn} is corrupt: {why}")]
    BlobCorrupt { urn: BlobUrn, why: String },
    #[error("event log: {0}")]
    Log(String),
    /// Another master appended to a shared log after sequence number `after`, the one this
    /// append was decided on.
    #[error("event log: another master appended after event {after}")]
    Conflict { after: u64 },
    /// The database or object store cannot be reached now; the request may be retried.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error("job store: {0}")]
    Jobs(String),
    /// The storage as configured cannot work (a bucket that does not exist, credentials
    /// refused, a URL that is not one): retrying will not help.
    #[error("{0}")]
    Config(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        StoreError::Io { context: context.into(), source }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Log(e.to_string())
    }
}
