//! The single writer: decides commands against the current state, commits their events in
//! batches (group commit) and folds them in, in sequence order. It runs on a thread of its own
//! and commits there, so a commit costs no hand-off to a blocking pool and back; it publishes
//! the committed events to watchers in sequence order, then answers each command.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, OnceLock, RwLock};

use std::sync::mpsc;

use tokio::sync::broadcast;

use agentos_core::CoreError;
use agentos_core::event::{EVENT_SCHEMA_VERSION, Event, EventBody};
use agentos_core::state::State;
use agentos_store::{EventLog, NewEvent, StoreError};

use crate::EngineError;

/// Decides the events of one command from the state at the moment it is its turn.
pub(crate) type Decide = Box<dyn Fn(&State) -> Result<Vec<(String, EventBody)>, CoreError> + Send>;

/// Told the outcome of one command, on the committer's thread: it must be quick and never block.
pub(crate) type Reply = Box<dyn FnOnce(Result<Vec<Event>, EngineError>) + Send>;

pub(crate) struct Pending {
    pub principal: String,
    pub time: i64,
    pub decide: Decide,
    pub reply: Reply,
}

/// Most commands taken into one transaction.
const MAX_BATCH: usize = 256;

thread_local! {
    /// The sequence number the first event of the command being decided will get, while it is
    /// decided on the committer's thread; 0 elsewhere.
    static NEXT_SEQ: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The time the command being decided will be committed with (milliseconds), likewise.
    static NEXT_TIME: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
    /// From which of its events on the command being decided records the master's own fires.
    static SYSTEM_FROM: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// Called from a [`Decide`]: the events it returns from the `n`-th (0-based) on are the
/// master's own (fires that follow the command's event in its commit), recorded under `system`
/// rather than under the principal whose command it is.
pub(crate) fn system_from(n: usize) {
    SYSTEM_FROM.with(|s| s.set(n));
}

/// The time the events a [`Decide`] returns will be committed with, when called from a
/// `Decide` (0 otherwise).
pub(crate) fn next_time() -> i64 {
    NEXT_TIME.with(|n| n.get())
}

/// The sequence number the first event a [`Decide`] returns will be committed as, when called
/// from a `Decide` (0 otherwise). Events that name others made in the same commit (a token by
/// its id, which comes from its event's number) are decided with it.
pub(crate) fn next_seq() -> u64 {
    NEXT_SEQ.with(|n| n.get())
}

/// How many times in a row one batch may lose the race for a shared log's end to another
/// master before its commands are answered "try again".
const MAX_CONFLICTS: u32 = 64;

struct Staged {
    pending: Pending,
    events: Vec<NewEvent>,
    bodies: Vec<EventBody>,
}

/// Called on the committer's thread with each committed event, in sequence order, after it is
/// folded and before its command is answered. It must be quick and must not block: every
/// commit waits for it.
pub(crate) type Listener = Box<dyn Fn(&Event) + Send + Sync>;

/// Who hears of committed events: the listener, set once the engine is up, and the broadcast
/// for watchers, written to only while one listens.
pub(crate) struct Publish {
    pub events: broadcast::Sender<Arc<Event>>,
    pub listener: Arc<OnceLock<Listener>>,
}

impl Publish {
    fn publish<'a>(&self, committed: impl Iterator<Item = &'a Event> + Clone) {
        if let Some(listen) = self.listener.get() {
            for e in committed.clone() {
                listen(e);
            }
        }
        if self.events.receiver_count() > 0 {
            for e in committed {
                let _ = self.events.send(Arc::new(e.clone()));
            }
        }
    }
}

/// Where committed events go, besides the log and the state.
pub(crate) struct Outlets<F: Fn(u64)> {
    pub publish: Publish,
    /// Called with the last sequence number after each batch.
    pub after_commit: F,
}

/// Runs until every sender is dropped. Blocks: call it on a thread of its own.
pub(crate) fn run<F: Fn(u64)>(
    rx: mpsc::Receiver<Pending>,
    state: Arc<RwLock<State>>,
    log: Arc<dyn EventLog>,
    out: Outlets<F>,
) {
    // Whether the last catch-up failed: an outage is logged when it starts and when it ends,
    // not at every command or announcement during it.
    let mut out_of_reach = false;
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        // Other masters may have appended to a shared log: their events are folded first, so
        // the batch is decided on the log as it is.
        let caught_up = if log.shared() { catch_up(&state, &log, &out.publish) } else { Ok(()) };
        match caught_up {
            Ok(()) => {
                if std::mem::take(&mut out_of_reach) {
                    tracing::info!("the shared log is reachable again");
                }
                commit_batch(batch, &state, &log, &out.publish)
            }
            Err(e) => {
                if !std::mem::replace(&mut out_of_reach, true) {
                    tracing::error!(error = %e, "folding other masters' events failed; commands are refused with 503 until the log is back");
                } else {
                    tracing::debug!(error = %e, "folding other masters' events failed again");
                }
                let err = EngineError::from(e);
                for p in batch {
                    (p.reply)(Err(err.duplicate()));
                }
            }
        }
        let last = state.read().map(|s| s.last_seq).unwrap_or(0);
        (out.after_commit)(last);
    }
}

/// Decides and commits the commands of one batch, in order, as few transactions as the
/// commands allow.
fn commit_batch(batch: Vec<Pending>, state: &RwLock<State>, log: &Arc<dyn EventLog>, publish: &Publish) {
    let mut queue: VecDeque<Pending> = batch.into();
    let mut conflicts = 0;
    while !queue.is_empty() {
        let mut staged: Vec<Staged> = Vec::new();
        let mut keys: HashSet<(String, String)> = HashSet::new();
        // Events are numbered from the log's end, in the order they are staged.
        let mut next = state.read().map(|s| s.last_seq).unwrap_or(0) + 1;
        while let Some(p) = queue.pop_front() {
            NEXT_SEQ.with(|n| n.set(next));
            NEXT_TIME.with(|n| n.set(p.time));
            SYSTEM_FROM.with(|s| s.set(usize::MAX));
            let decided = decide(state, &p);
            NEXT_SEQ.with(|n| n.set(0));
            NEXT_TIME.with(|n| n.set(0));
            let system_from = SYSTEM_FROM.with(|s| s.replace(usize::MAX));
            match decided {
                // A command that touches what an earlier one in this transaction touched must
                // see its effect: it waits for the next transaction, and is decided again.
                Ok(evs) if evs.iter().any(|(m, b)| keys.contains(&(m.clone(), b.key()))) => {
                    queue.push_front(p);
                    break;
                }
                Err(e) => (p.reply)(Err(e.into())),
                Ok(evs) => match stored_form(evs, &p, system_from) {
                    Err(e) => (p.reply)(Err(e.into())),
                    Ok((events, bodies)) => {
                        next += events.len() as u64;
                        keys.extend(events.iter().map(|e| (e.model.clone(), e.key.clone())));
                        staged.push(Staged { pending: p, events, bodies });
                    }
                },
            }
        }
        let Err(lost) = flush(staged, state, log, publish) else {
            continue;
        };
        // Another master appended first: fold what it wrote, then decide these again.
        conflicts += 1;
        let refolded = catch_up(state, log, publish);
        if conflicts > MAX_CONFLICTS || refolded.is_err() {
            let err: EngineError = match refolded {
                Err(e) => e.into(),
                Ok(()) => CoreError::new(
                    agentos_core::ErrorKind::StorageDown,
                    "log_contended",
                    format!("other masters kept appending to the shared log ({MAX_CONFLICTS} tries); try again"),
                )
                .into(),
            };
            for p in lost.into_iter().chain(queue.drain(..)) {
                (p.reply)(Err(err.duplicate()));
            }
            return;
        }
        for p in lost.into_iter().rev() {
            queue.push_front(p);
        }
    }
}

/// Folds the events other masters appended to a shared log since this one's last, and
/// publishes them as its own would be.
fn catch_up(state: &RwLock<State>, log: &Arc<dyn EventLog>, publish: &Publish) -> Result<(), StoreError> {
    loop {
        let after = state.read().map(|s| s.last_seq).unwrap_or(0);
        let page = log.read_after_blocking(after, 1000)?;
        if page.is_empty() {
            return Ok(());
        }
        let mut folded = Vec::with_capacity(page.len());
        {
            let mut st = state.write().unwrap_or_else(|p| p.into_inner());
            for rec in page {
                if rec.seq <= st.last_seq {
                    continue;
                }
                let seq = rec.seq;
                let ev = crate::records::to_event(rec).map_err(|e| {
                    StoreError::Log(format!("event {seq}, appended by another master, cannot be read: {e}"))
                })?;
                st.apply(&ev);
                folded.push(ev);
            }
        }
        publish.publish(folded.iter());
    }
}

/// The events of one command as the log will store them. A command with an event that would not
/// read back (nested past what JSON readers accept) is refused whole, before anything is
/// written: one such event once answered 200 and then kept the master from starting.
/// Events from the `system_from`-th on are recorded under `system` (see [`system_from`]).
fn stored_form(
    evs: Vec<(String, EventBody)>,
    p: &Pending,
    system_from: usize,
) -> Result<(Vec<NewEvent>, Vec<EventBody>), CoreError> {
    let mut events = Vec::with_capacity(evs.len());
    let mut bodies = Vec::with_capacity(evs.len());
    for (i, (model, body)) in evs.into_iter().enumerate() {
        let (kind, payload) = body.to_parts();
        agentos_core::depth::check_stored_depth(kind, &payload)?;
        events.push(NewEvent {
            model,
            kind: kind.to_string(),
            key: body.key(),
            payload,
            principal: if i >= system_from { "system".to_string() } else { p.principal.clone() },
            time: p.time,
            schema: EVENT_SCHEMA_VERSION,
        });
        bodies.push(body);
    }
    Ok((events, bodies))
}

fn decide(state: &RwLock<State>, p: &Pending) -> Result<Vec<(String, EventBody)>, CoreError> {
    let guard = state.read().map_err(|_| CoreError::internal("state lock poisoned"))?;
    (p.decide)(&guard)
}

/// Commits the staged commands in one transaction, folds and publishes their events, and
/// answers them. When another master appended to the shared log first, nothing is committed
/// and the commands come back, to be decided again.
fn flush(
    staged: Vec<Staged>,
    state: &RwLock<State>,
    log: &Arc<dyn EventLog>,
    publish: &Publish,
) -> Result<(), Vec<Pending>> {
    if staged.is_empty() {
        return Ok(());
    }
    let all: Vec<NewEvent> = staged.iter().flat_map(|s| s.events.iter().cloned()).collect();
    if all.is_empty() {
        for s in staged {
            (s.pending.reply)(Ok(Vec::new()));
        }
        return Ok(());
    }
    let after = state.read().map(|s| s.last_seq).unwrap_or(0);
    match log.append_blocking(after, all) {
        Err(StoreError::Conflict { .. }) => Err(staged.into_iter().map(|s| s.pending).collect()),
        Err(e) => {
            tracing::error!(error = %e, "committing events failed");
            let err = EngineError::from(e);
            for s in staged {
                (s.pending.reply)(Err(err.duplicate()));
            }
            Ok(())
        }
        Ok(recorded) => {
            // Decided with the numbers `next_seq` gave: the log numbers on from its end.
            if recorded.iter().enumerate().any(|(i, r)| r.seq != after + 1 + i as u64) {
                tracing::error!(after, "the log numbered a commit's events other than from its end");
            }
            let mut recorded = recorded.into_iter();
            let mut replies = Vec::with_capacity(staged.len());
            {
                // A std lock: held only while folding, never across an await.
                let mut st = state.write().unwrap_or_else(|p| p.into_inner());
                for s in staged {
                    let mut committed = Vec::with_capacity(s.bodies.len());
                    for (body, rec) in s.bodies.into_iter().zip(recorded.by_ref()) {
                        let ev = crate::records::with_body(rec, body);
                        st.apply(&ev);
                        committed.push(ev);
                    }
                    replies.push((s.pending.reply, committed));
                }
            }
            publish.publish(replies.iter().flat_map(|(_, c)| c));
            for (reply, committed) in replies {
                reply(Ok(committed));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentos_core::net_state::{NetEvent, NewToken};
    use serde_json::{Value, json};

    fn pending() -> Pending {
        Pending { principal: "operator".into(), time: 1, decide: Box::new(|_| Ok(Vec::new())), reply: Box::new(|_| {}) }
    }

    fn put_of(levels: usize) -> (String, EventBody) {
        let mut data = json!(1);
        for _ in 0..levels {
            data = Value::Array(vec![data]);
        }
        let tokens = vec![NewToken { place: "p".into(), name: None, data, by: Vec::new() }];
        ("m".to_string(), EventBody::Net(NetEvent::TokensPut { tokens }))
    }

    #[test]
    fn a_command_with_an_event_too_deep_to_read_back_is_refused_whole() {
        // The first event alone would be fine; the command is refused for its second.
        let refused = stored_form(vec![put_of(1), put_of(125)], &pending(), usize::MAX).unwrap_err();
        assert_eq!(refused.code, "too_deep");
        assert!(refused.message.contains("nothing was written"), "{}", refused.message);
        let (events, _) = stored_form(vec![put_of(100)], &pending(), usize::MAX).unwrap();
        // What is stored reads back with serde_json's default limit, in its envelope.
        let e = &events[0];
        assert!(EventBody::from_parts(&e.kind, &e.payload).is_ok());
        let envelope = format!("{{\"type\":\"Net\",\"payload\":{}}}", e.payload);
        assert!(serde_json::from_str::<Value>(&envelope).is_ok());
    }
}
