//! The ledger: the event log, the state folded from it, and the one committer that writes
//! both. Every subsystem commits through it and reads the state from it; it knows nothing of
//! what the events mean beyond folding them.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use agentos_core::CoreError;
use agentos_core::event::{Event, EventBody};
use agentos_core::state::{STATE_SCHEMA_VERSION, State};
use agentos_store::{EventLog, Snapshot};

use crate::EngineError;
use crate::committer::{self, Decide, Listener, Outlets, Pending, Publish, Reply};
pub(crate) use crate::records::{now_ms, to_event};

pub(crate) struct Ledger {
    state: Arc<RwLock<State>>,
    pub(crate) log: Arc<dyn EventLog>,
    tx: Mutex<Option<std::sync::mpsc::Sender<Pending>>>,
    committer: Mutex<Option<std::thread::JoinHandle<()>>>,
    snapshots: Arc<SnapshotControl>,
    pub(crate) restored: Restored,
    /// Every committed event, for watchers.
    pub(crate) events: tokio::sync::broadcast::Sender<Arc<Event>>,
    /// Hears every committed event on the committer's thread, before its command is answered
    /// (the list of recent jobs, the fire loop's wake-up): set once by the engine.
    pub(crate) listener: Arc<std::sync::OnceLock<Listener>>,
    /// Sequence numbers of the events skipped by `--skip-event`, left out of every read.
    pub(crate) skipped: BTreeSet<u64>,
    /// The last sequence number folded, after each batch.
    folded: tokio::sync::watch::Receiver<u64>,
}

/// How the state was rebuilt at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// Sequence number of the snapshot used (0: none).
    pub snapshot_seq: u64,
    /// Events folded in after the snapshot.
    pub replayed: u64,
}

struct SnapshotControl {
    last_seq: AtomicU64,
    running: AtomicBool,
    task: Mutex<Option<JoinHandle<()>>>,
}

/// The error for an event the master cannot read at start: it names the event and the way on.
fn unreadable_at_start(seq: u64, e: &EngineError) -> EngineError {
    CoreError::new(
        agentos_core::ErrorKind::Corrupt,
        "event_corrupt",
        format!(
            "event {seq} of the log cannot be read ({e}); the master will not fold a log with a hole it did not choose. \
             To go on without it, start with `agentos serve --skip-event {seq}` (recorded in the log; see the README \
             for what skipping an event can leave inconsistent)"
        ),
    )
    .into()
}

/// The events skipped so far, after recording those the operator asks to skip now. Only an
/// event that exists and cannot be read may be skipped: skipping a readable one would rewrite
/// history that the state depends on.
async fn record_skips(log: &Arc<dyn EventLog>, asked: &[u64]) -> Result<BTreeSet<u64>, EngineError> {
    let mut skipped = BTreeSet::new();
    for rec in log.read_key_any_model(agentos_core::event::SKIP_KEY).await? {
        if let EventBody::EventSkipped { seq, .. } = to_event(rec)?.body {
            skipped.insert(seq);
        }
    }
    for &seq in asked {
        if skipped.contains(&seq) {
            tracing::info!(seq, "event already skipped by an earlier start");
            continue;
        }
        let rec = log.read_after(seq.saturating_sub(1), 1).await?.into_iter().next().filter(|r| r.seq == seq);
        let Some(rec) = rec else {
            return Err(CoreError::bad_input(
                "no_such_event",
                format!("--skip-event {seq}: the log has no event {seq}"),
            )
            .into());
        };
        let model = rec.event.model.clone();
        let reason = match to_event(rec) {
            Ok(_) => {
                return Err(CoreError::bad_input(
                    "event_readable",
                    format!("--skip-event {seq}: event {seq} reads fine; only an unreadable event may be skipped"),
                )
                .into());
            }
            Err(e) => e.to_string(),
        };
        let body = EventBody::EventSkipped { seq, reason: reason.clone() };
        let (kind, payload) = body.to_parts();
        let record = agentos_store::NewEvent {
            model,
            kind: kind.to_string(),
            key: body.key(),
            payload,
            principal: "operator".into(),
            time: now_ms(),
            schema: agentos_core::event::EVENT_SCHEMA_VERSION,
        };
        let log = log.clone();
        let after = log.last_seq().await?;
        // Before the committer starts: this is the only writer yet.
        tokio::task::spawn_blocking(move || log.append_blocking(after, vec![record]))
            .await
            .map_err(|e| CoreError::internal(format!("recording a skip: {e}")))??;
        tracing::warn!(seq, %reason, "event skipped by --skip-event: the state is folded as if it were never written");
        skipped.insert(seq);
    }
    Ok(skipped)
}

impl Ledger {
    /// Folds the newest usable snapshot and every event after it (recording the skips asked
    /// for first), then starts the committer; a snapshot is taken every `snapshot_every` events.
    pub(crate) async fn open(
        log: Arc<dyn EventLog>,
        skip_events: &[u64],
        snapshot_every: u64,
    ) -> Result<Ledger, EngineError> {
        let skipped = record_skips(&log, skip_events).await?;
        let mut state = State::new();
        let snapshot = log.load_snapshot().await.unwrap_or_else(|e| {
            // The snapshot only saves time; the log is the truth.
            tracing::warn!(error = %e, "snapshot unreadable; ignoring it and replaying the whole log");
            None
        });
        if let Some(snap) = snapshot {
            if snap.schema == STATE_SCHEMA_VERSION {
                let decoded = tokio::task::spawn_blocking(move || {
                    let text = std::str::from_utf8(&snap.data).map_err(|e| e.to_string())?;
                    agentos_core::depth::from_str_any_depth::<State>(text).map_err(|e| e.to_string())
                })
                .await;
                match decoded {
                    Ok(Ok(s)) => state = s,
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "snapshot unreadable; replaying the whole log")
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "snapshot load failed; replaying the whole log")
                    }
                }
            } else {
                tracing::info!(found = snap.schema, "snapshot of another version; replaying the whole log");
            }
        }
        state.after_load();
        let snapshot_seq = state.last_seq;
        loop {
            let page = log.read_after(state.last_seq, 10_000).await?;
            if page.is_empty() {
                break;
            }
            for rec in page {
                if skipped.contains(&rec.seq) {
                    state.last_seq = rec.seq;
                    continue;
                }
                let seq = rec.seq;
                let ev = to_event(rec).map_err(|e| unreadable_at_start(seq, &e))?;
                state.apply(&ev);
            }
        }
        let replayed = state.last_seq - snapshot_seq;
        tracing::info!(seq = state.last_seq, snapshot = snapshot_seq, replayed, "state restored");
        // The snapshot's text and the log pages read are freed by now.
        release_free_memory();

        let state = Arc::new(RwLock::new(state));
        // Unbounded: every sender waits for its answer, so what is queued is bounded by the
        // callers in flight.
        let (tx, rx) = std::sync::mpsc::channel();
        let snapshots = Arc::new(SnapshotControl {
            last_seq: AtomicU64::new(snapshot_seq),
            running: AtomicBool::new(false),
            task: Mutex::new(None),
        });
        let events = tokio::sync::broadcast::channel(4096).0;
        let listener = Arc::new(std::sync::OnceLock::new());
        let (folded_tx, folded) = tokio::sync::watch::channel(snapshot_seq + replayed);
        let committer = {
            let (state, log, snapshots) = (state.clone(), log.clone(), snapshots.clone());
            let every = snapshot_every.max(1);
            let runtime = tokio::runtime::Handle::current();
            let after_commit = {
                let (state, log) = (state.clone(), log.clone());
                move |seq: u64| {
                    folded_tx.send_if_modified(|s| {
                        let moved = seq > *s;
                        *s = seq.max(*s);
                        moved
                    });
                    if seq >= snapshots.last_seq.load(Ordering::Relaxed) + every {
                        start_snapshot(&runtime, &state, &log, &snapshots);
                    }
                }
            };
            let out = Outlets { publish: Publish { events: events.clone(), listener: listener.clone() }, after_commit };
            std::thread::Builder::new()
                .name("agentos-committer".into())
                .spawn(move || committer::run(rx, state, log, out))
                .map_err(|e| CoreError::internal(format!("cannot start the committer thread: {e}")))?
        };
        Ok(Ledger {
            state,
            log,
            tx: Mutex::new(Some(tx)),
            committer: Mutex::new(Some(committer)),
            snapshots,
            restored: Restored { snapshot_seq, replayed },
            events,
            listener,
            skipped,
            folded,
        })
    }

    pub(crate) fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides and commits one command; answers its committed events.
    pub(crate) async fn submit(&self, principal: &str, decide: Decide) -> Result<Vec<Event>, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.submit_then(
            principal,
            decide,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.await.map_err(|_| CoreError::internal("the commit task ended"))?
    }

    /// Queues one command without waiting for its commit: `reply` hears the outcome (on the
    /// committer's thread, or at once when the ledger is closing).
    pub(crate) fn submit_then(&self, principal: &str, decide: Decide, reply: Reply) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(tx) = tx else {
            return reply(Err(CoreError::internal("the engine is shutting down").into()));
        };
        if let Err(e) = tx.send(Pending { principal: principal.to_string(), time: now_ms(), decide, reply }) {
            (e.0.reply)(Err(CoreError::internal("the engine is shutting down").into()));
        }
    }

    pub(crate) fn last_seq(&self) -> u64 {
        self.read_state().last_seq
    }

    /// Has the committer fold what other masters appended to a shared log, without waiting;
    /// false once the ledger is closing.
    pub(crate) fn fold_others(&self) -> bool {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(tx) = tx else {
            return false;
        };
        tx.send(Pending {
            principal: "system".into(),
            time: now_ms(),
            decide: Box::new(|_| Ok(Vec::new())),
            reply: Box::new(|_| {}),
        })
        .is_ok()
    }

    /// Waits until the state has folded event `seq`, at most `within`; answers the last
    /// sequence number folded.
    pub(crate) async fn wait_for(&self, seq: u64, within: std::time::Duration) -> u64 {
        let mut folded = self.folded.clone();
        if *folded.borrow() >= seq {
            return *folded.borrow();
        }
        if self.log.shared() {
            self.fold_others();
        }
        let _ = tokio::time::timeout(within, folded.wait_for(|s| *s >= seq)).await;
        self.last_seq()
    }

    /// Stops taking commands, lets the queued ones commit, and writes a final snapshot.
    pub(crate) async fn close(&self) {
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        let committer = self.committer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(c) = committer {
            // The committer ends once every command queued before the channel closed is answered.
            let _ = tokio::task::spawn_blocking(move || c.join()).await;
        }
        let running = self.snapshots.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = running {
            let _ = t.await;
        }
        if self.last_seq() > self.snapshots.last_seq.load(Ordering::Relaxed)
            && let Err(e) = write_snapshot(&self.state, &self.log).await
        {
            tracing::warn!(error = %e, "final snapshot failed");
        }
    }

    /// Writes a snapshot now (used by tests and benchmarks).
    pub(crate) async fn snapshot_now(&self) -> Result<u64, EngineError> {
        let seq = write_snapshot(&self.state, &self.log).await?;
        self.snapshots.last_seq.store(seq, Ordering::Relaxed);
        Ok(seq)
    }
}

fn start_snapshot(
    runtime: &tokio::runtime::Handle,
    state: &Arc<RwLock<State>>,
    log: &Arc<dyn EventLog>,
    ctl: &Arc<SnapshotControl>,
) {
    if ctl.running.swap(true, Ordering::AcqRel) {
        return;
    }
    let (state, log, ctl2) = (state.clone(), log.clone(), ctl.clone());
    let task = runtime.spawn(async move {
        match write_snapshot(&state, &log).await {
            Ok(seq) => ctl2.last_seq.store(seq, Ordering::Relaxed),
            Err(e) => {
                tracing::warn!(error = %e, "snapshot failed; the log stays the source of truth")
            }
        }
        ctl2.running.store(false, Ordering::Release);
    });
    *ctl.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
}

async fn write_snapshot(state: &Arc<RwLock<State>>, log: &Arc<dyn EventLog>) -> Result<u64, EngineError> {
    // Entries are shared, so the copy under the lock is cheap; serializing happens outside it.
    let copy = state.read().unwrap_or_else(|p| p.into_inner()).clone();
    let seq = copy.last_seq;
    let data = tokio::task::spawn_blocking(move || serde_json::to_vec(&copy))
        .await
        .map_err(|e| CoreError::internal(format!("snapshot task: {e}")))?
        .map_err(|e| CoreError::internal(format!("snapshot encoding: {e}")))?;
    log.save_snapshot(Snapshot { seq, schema: STATE_SCHEMA_VERSION, data }).await?;
    tracing::debug!(seq, "snapshot written");
    // The encoded snapshot and the entries decoded to encode it are freed by now. Off the runtime's
    // threads: trimming walks the allocator's free lists, a few milliseconds on a large heap.
    let _ = tokio::task::spawn_blocking(release_free_memory).await;
    Ok(seq)
}

/// Caps glibc's heaps ("arenas") at two. glibc gives a thread that finds the heaps busy a heap
/// of its own, up to eight per core, and each keeps what is freed in it for reuse: the tokio
/// workers and the blocking threads of commits and snapshots spread the catalog's memory over a
/// dozen heaps, each with its own free and fragmented pages. At 100,000 entries the master held
/// 203 MiB resident with the default and 131 MiB with two heaps, registering at the same rate
/// (BENCHMARKS.md). Called once when a master starts; it changes only heaps made afterwards.
/// An operator who sets `MALLOC_ARENA_MAX` (or the `glibc.malloc.arena_max` tunable) chooses
/// for the master: the setting is left as they made it. The `agentos` binary gives Rust's own
/// allocations to mimalloc; glibc's heaps then hold what C code linked in (SQLite) allocates,
/// which the cap and [`release_free_memory`] still keep in bounds.
pub fn limit_allocator_arenas() {
    let chosen = std::env::var_os("MALLOC_ARENA_MAX").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.arena_max"));
    if chosen {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and changes a setting of the allocator.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Hands the memory the allocator holds free back to the system. glibc keeps what a thread frees in
/// that thread's heap for reuse, and a snapshot read or written frees tens of MiB at once (its text, and
/// the values decoded or encoded on the way): without a trim, that much stayed resident for the life of
/// the master. Measured in BENCHMARKS.md (resident memory at 100,000 entries).
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and only returns free pages of the allocator's own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}
