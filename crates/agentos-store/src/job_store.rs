//! The trait of the store of open direct jobs: invocations queued or running, kept so that a
//! master that restarts queues them again. A job leaves the store once its one result is in
//! the event log; the log, not this store, says whether a job finished.

use async_trait::async_trait;

use crate::StoreError;

/// One open job as stored. Never holds a secret value: only jobs without credentials (direct
/// invocations) are stored; jobs carrying secrets come from net fires, whose tokens are durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredJob {
    pub job_id: String,
    pub model: String,
    /// The id of the principal that invoked it: it may read the job's result.
    pub invoker: String,
    /// The command token, as JSON text; the store does not interpret it.
    pub token: String,
    /// Milliseconds since the epoch.
    pub queued_at: i64,
}

/// One change to the store, in a batch of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobWrite {
    Put(StoredJob),
    Forget(String),
}

#[async_trait]
pub trait JobStore: Send + Sync {
    /// Applies changes in order, durably and at once: when this returns, a crash loses none
    /// of them; when it fails, none was made. Several changes share one sync to the disk.
    async fn write(&self, writes: Vec<JobWrite>) -> Result<(), StoreError>;
    /// Stores a job durably: when this returns, a crash does not lose it.
    async fn put(&self, job: StoredJob) -> Result<(), StoreError>;
    /// Removes a job (it finished, or its caller gave up before it was handed out). Removing
    /// one that is not there is not an error.
    async fn forget(&self, job_id: &str) -> Result<(), StoreError>;
    /// One job, if it is open.
    async fn get(&self, job_id: &str) -> Result<Option<StoredJob>, StoreError>;
    /// Every open job, oldest first.
    async fn all(&self) -> Result<Vec<StoredJob>, StoreError>;
}
