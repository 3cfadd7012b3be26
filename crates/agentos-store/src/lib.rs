//! Storage behind two small traits: the append-only [`EventLog`] and the content-addressed [`BlobStore`].

pub mod blob_store;
pub mod error;
pub mod event_log;
pub mod fs_blob_store;
pub mod sqlite_event_log;
pub mod verify_blob_store;

pub use blob_store::BlobStore;
pub use error::StoreError;
pub use event_log::{EventLog, NewEvent, RecordedEvent, Snapshot};
pub use fs_blob_store::FsBlobStore;
pub use sqlite_event_log::SqliteEventLog;
pub use verify_blob_store::VerifyBlobStore;
