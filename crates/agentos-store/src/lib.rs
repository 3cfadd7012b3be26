//! Storage behind small traits: the append-only [`EventLog`], the content-addressed
//! [`BlobStore`], and the [`JobStore`] of open direct jobs. Embedded: SQLite and a folder;
//! shared by several masters: PostgreSQL (the log [`PgEventLog`], the job queue [`PgJobQueue`])
//! and S3 ([`S3BlobStore`]).

pub mod blob_store;
pub mod error;
pub mod event_log;
pub mod fs_blob_store;
pub mod job_store;
pub mod model_locks;
mod pg;
pub mod pg_event_log;
pub mod pg_job_queue;
pub mod s3_blob_store;
pub mod sqlite_event_log;
pub mod sqlite_job_store;
pub mod verify_blob_store;

pub use blob_store::BlobStore;
pub use error::StoreError;
pub use event_log::{EventLog, NewEvent, RecordedEvent, Snapshot};
pub use fs_blob_store::FsBlobStore;
pub use job_store::{JobStore, JobWrite, StoredJob};
pub use model_locks::{ModelLocks, PgModelLocks};
pub use pg::redact_url;
pub use pg_event_log::PgEventLog;
pub use pg_job_queue::{PgJobQueue, SharedJobs};
pub use s3_blob_store::S3BlobStore;
pub use sqlite_event_log::SqliteEventLog;
pub use sqlite_job_store::SqliteJobStore;
pub use verify_blob_store::VerifyBlobStore;
