//! The append-only event log: the one source of truth that state is folded from.

use async_trait::async_trait;

use crate::StoreError;

/// An event before it has a sequence number. The payload is JSON text; the log does not interpret it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub model: String,
    pub kind: String,
    /// The entity the event is about (e.g. `tool:forum-sentinel`), indexed for history lookups.
    pub key: String,
    pub payload: String,
    pub principal: String,
    /// Milliseconds since the Unix epoch.
    pub time: i64,
    /// Event schema version.
    pub schema: u32,
}

/// An event as committed, with its sequence number.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedEvent {
    pub seq: u64,
    pub event: NewEvent,
}

/// A serialized fold of the log up to and including `seq`.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub seq: u64,
    /// Version of the state's snapshot form.
    pub schema: u32,
    pub data: Vec<u8>,
}

#[async_trait]
pub trait EventLog: Send + Sync + 'static {
    /// Appends `events` in one transaction, durably, before returning them with their sequence
    /// numbers. `after` is the sequence number the writer has folded up to: a log several
    /// masters share numbers the events from `after + 1` and refuses the append with
    /// [`StoreError::Conflict`] when another master appended first; a log only one master
    /// writes may ignore it. Blocks: the engine's committer calls it on a thread of its own, so
    /// a commit costs no hand-off to a blocking pool.
    fn append_blocking(&self, after: u64, events: Vec<NewEvent>) -> Result<Vec<RecordedEvent>, StoreError>;
    /// Whether other masters may append to this log too, so a master must fold their events
    /// before it decides.
    fn shared(&self) -> bool {
        false
    }
    /// [`EventLog::read_after`], blocking, for the committer's thread; only shared logs are
    /// read from there.
    fn read_after_blocking(&self, _after: u64, _limit: usize) -> Result<Vec<RecordedEvent>, StoreError> {
        Ok(Vec::new())
    }
    /// Up to `limit` events with a sequence number above `after`, in order.
    async fn read_after(&self, after: u64, limit: usize) -> Result<Vec<RecordedEvent>, StoreError>;
    /// Every event of one entity in one model, in order.
    async fn read_key(&self, model: &str, key: &str) -> Result<Vec<RecordedEvent>, StoreError>;
    /// Every event of one entity, in whichever model, in order.
    async fn read_key_any_model(&self, key: &str) -> Result<Vec<RecordedEvent>, StoreError>;
    /// The highest sequence number committed, 0 for an empty log.
    async fn last_seq(&self) -> Result<u64, StoreError>;
    /// Stores a snapshot; older ones may be dropped.
    async fn save_snapshot(&self, snapshot: Snapshot) -> Result<(), StoreError>;
    /// The newest snapshot, if any.
    async fn load_snapshot(&self) -> Result<Option<Snapshot>, StoreError>;
}
