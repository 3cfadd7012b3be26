//! The job queue of a master that shares it with others (PostgreSQL): jobs are rows any master
//! hands out, renews and finishes; who waits for a job's result waits on the master that queued
//! it, and hears of it when the result is folded from the log, whichever master recorded it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use agentos_core::CoreError;
use agentos_core::job::{CommandToken, ExecutorView, JobResult};
use agentos_store::StoreError;
use agentos_store::pg_job_queue::{JobRow, LeaseRefusal, NewJobRow, SharedJobs};

use crate::jobs::{Finished, Handout, JobConfig, LeaseError, OpenJob, Waiter};

/// How often a waiting poll looks at the table even when no queueing was announced (a notice
/// lost with a connection).
const RECHECK: Duration = Duration::from_secs(1);

/// How often one master writes down that it saw an executor.
const SEEN_EVERY: Duration = Duration::from_secs(1);

/// What a job row carries: the token, and the credential values the job needs (then the row is
/// sealed with the secrets key, so the database never holds a secret in the clear).
#[derive(Serialize, Deserialize)]
struct Body {
    token: CommandToken,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    secrets: Vec<String>,
}

/// The row body of a job that carries no credential (a direct invocation), as the shared queue
/// stores it: what `agentos import` queues for the open jobs of a single-machine installation.
pub fn plain_body(token: CommandToken) -> Result<Vec<u8>, CoreError> {
    serde_json::to_vec(&Body { token, secrets: Vec::new() }).map_err(|e| CoreError::internal(e.to_string()))
}

/// The callers waiting on this master for their jobs' results, by job id. Shared with the
/// ledger's listener, which answers each on the committer's thread as the job's result is folded
/// from the log, whichever master recorded it: in sequence order, and none missed.
#[derive(Clone, Default)]
pub struct ResultWaiters(Arc<Mutex<HashMap<String, Waiter>>>);

impl ResultWaiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiter>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A job's result was folded from the log: whoever waits for it here hears it. Quick and
    /// never blocks (a map removal and a send), as the listener must be.
    pub fn resolve(&self, job_id: &str, result: &JobResult) {
        if let Some(w) = self.lock().remove(job_id) {
            let _ = w.send(result.clone());
        }
    }
}

pub struct SharedQueue {
    rows: Arc<dyn SharedJobs>,
    /// This run of the master in the queue (who queued a job, who records a result).
    master: String,
    key: Option<[u8; 32]>,
    config: JobConfig,
    work: Notify,
    /// The master is stopping: a waiting poll ends now (see [`SharedQueue::end_polls`]).
    ending: std::sync::atomic::AtomicBool,
    waiters: ResultWaiters,
    /// When this master last wrote down each executor, and whether as polling.
    seen: Arc<Mutex<HashMap<String, (Instant, bool)>>>,
    /// Polls each executor has open through this master (a stop is written down only when no
    /// poll followed within a second).
    polls: Arc<Mutex<OpenPolls>>,
    /// Until when "an executor serves the queue" holds without asking again.
    serving_until: Mutex<Option<Instant>>,
    /// When this master last removed the executors gone for a day.
    pruned: Mutex<Option<Instant>>,
}

/// How often a master removes the executors gone for a day from the shared list.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// The token of a job whose row does not read (sealed with another key, say).
fn unreadable_token() -> CommandToken {
    CommandToken { executor: "unreadable".into(), command: "invoke".into(), args: serde_json::json!({}) }
}

impl From<LeaseRefusal> for LeaseError {
    fn from(r: LeaseRefusal) -> Self {
        match r {
            LeaseRefusal::UnknownJob => LeaseError::UnknownJob,
            LeaseRefusal::LeaseLost => LeaseError::LeaseLost,
            LeaseRefusal::NotHolder => LeaseError::NotHolder,
        }
    }
}

fn storage(e: StoreError) -> LeaseError {
    LeaseError::Storage(e.to_string())
}

impl SharedQueue {
    pub fn new(rows: Arc<dyn SharedJobs>, master: String, key: Option<[u8; 32]>, config: JobConfig) -> Self {
        SharedQueue {
            rows,
            master,
            key,
            config,
            work: Notify::new(),
            ending: std::sync::atomic::AtomicBool::new(false),
            waiters: ResultWaiters::default(),
            seen: Arc::new(Mutex::new(HashMap::new())),
            polls: Arc::default(),
            serving_until: Mutex::new(None),
            pruned: Mutex::new(None),
        }
    }

    pub fn config(&self) -> JobConfig {
        self.config
    }

    fn waiters(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiter>> {
        self.waiters.lock()
    }

    /// Who waits here for a job's result, for the ledger's listener to answer as results are
    /// folded from the log.
    pub fn result_waiters(&self) -> ResultWaiters {
        self.waiters.clone()
    }

    fn encode(&self, job_id: &str, token: CommandToken, secrets: Vec<String>) -> Result<(Vec<u8>, bool), CoreError> {
        let sealed = !secrets.is_empty();
        let plain = serde_json::to_vec(&Body { token, secrets }).map_err(|e| CoreError::internal(e.to_string()))?;
        if !sealed {
            return Ok((plain, false));
        }
        let key = self.key.ok_or_else(|| {
            CoreError::internal("a job carrying credentials cannot be queued: this master has no secrets key")
        })?;
        Ok((crate::admin::seal(&key, job_id.as_bytes(), &plain)?, true))
    }

    fn decode(&self, row: &JobRow) -> Result<Body, String> {
        let plain = if row.sealed {
            let key = self.key.ok_or("the job is sealed and this master has no secrets key")?;
            crate::admin::unseal(&key, row.job_id.as_bytes(), &row.body).ok_or(
                "the job is sealed with another secrets key, or was changed in the database: every master needs the same --secrets-key-file",
            )?
        } else {
            row.body.clone()
        };
        serde_json::from_slice(&plain).map_err(|e| format!("the stored job does not read: {e}"))
    }

    pub async fn enqueue(
        &self,
        job_id: String,
        model: String,
        token: CommandToken,
        target: Option<String>,
        secrets: Vec<String>,
        invoker: Option<String>,
    ) -> Result<oneshot::Receiver<JobResult>, crate::EngineError> {
        let (body, sealed) = self.encode(&job_id, token, secrets)?;
        let (tx, rx) = oneshot::channel();
        // Waiting before the row exists: another master may finish it at once.
        self.waiters().insert(job_id.clone(), tx);
        let row =
            NewJobRow { job_id: job_id.clone(), model, target, invoker, owner: self.master.clone(), body, sealed };
        if let Err(e) = self.rows.insert(row).await {
            self.waiters().remove(&job_id);
            return Err(e.into());
        }
        self.work.notify_waiters();
        Ok(rx)
    }

    /// Another master (or this one) queued or returned a job: pollers look again.
    pub fn announced(&self) {
        self.work.notify_waiters();
    }

    pub async fn open_jobs_of(&self, invoker: &str) -> Result<usize, StoreError> {
        self.rows.open_jobs_of(invoker).await
    }

    pub async fn open_job(&self, job_id: &str) -> Result<Option<OpenJob>, StoreError> {
        Ok(self.rows.open_job(job_id).await?.map(|r| OpenJob {
            model: r.model,
            invoker: r.invoker,
            running: r.running,
        }))
    }

    pub async fn cancel(&self, job_id: &str) -> bool {
        self.waiters().remove(job_id);
        match self.rows.cancel(job_id).await {
            Ok(dropped) => dropped,
            Err(e) => {
                tracing::warn!(job = %job_id, error = %e, "dropping a job nobody waits for failed");
                false
            }
        }
    }

    async fn seen(&self, executor: &str, polling: Option<Duration>) {
        {
            let mut seen = lock(&self.seen);
            let now = Instant::now();
            if let Some((at, was_polling)) = seen.get(executor)
                && now.duration_since(*at) < SEEN_EVERY
                && (polling.is_none() || *was_polling)
            {
                return;
            }
            seen.insert(executor.to_string(), (now, polling.is_some()));
        }
        let ms = polling.map(|d| d.as_millis().min(u64::MAX as u128) as u64);
        if let Err(e) = self.rows.seen(executor, ms).await {
            tracing::debug!(executor, error = %e, "noting an executor failed");
        }
    }

    async fn try_take(&self, executor: &str, instance: Option<&str>) -> Result<Option<Handout>, StoreError> {
        let lease_id = match crate::jobs::new_lease_id(instance) {
            Ok(id) => id,
            Err(e) => {
                tracing::error!(error = %e, "no randomness for a lease id: no job handed out");
                return Ok(None);
            }
        };
        let mut names = vec![executor.to_string()];
        names.extend(executor.split('/').map(str::to_string));
        let lease_ms = self.config.lease.as_millis() as u64;
        let Some(row) = self.rows.take(executor, &names, &lease_id, lease_ms).await? else { return Ok(None) };
        let (token, sealed, unreadable) = match self.decode(&row) {
            Ok(b) => {
                let sealed = !b.secrets.is_empty();
                (b.token, sealed, None)
            }
            Err(why) => {
                // Handed out with the reason: the executor fails it with that, like an unresolved tool.
                tracing::error!(job = %row.job_id, %why, "a queued job does not read");
                (unreadable_token(), false, Some(why))
            }
        };
        Ok(Some(Handout {
            job_id: row.job_id,
            lease_id,
            attempt: row.attempt,
            model: row.model,
            token,
            sealed,
            unreadable,
        }))
    }

    pub async fn take_now(&self, executor: &str, instance: Option<&str>) -> Result<Option<Handout>, StoreError> {
        // At a stop no job goes out through this master: its result could no longer be posted here.
        if self.ending.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(None);
        }
        self.seen(executor, None).await;
        self.try_take(executor, instance).await
    }

    /// Ends now the leases `executor` took through its processes `instances` (see
    /// [`crate::jobs::JobQueue::expire_instances`]).
    pub async fn expire_instances(&self, executor: &str, instances: &[&str]) -> Result<usize, StoreError> {
        let prefixes: Vec<String> = instances.iter().map(|i| format!("{i}-")).collect();
        self.rows.expire_leases(executor, &prefixes).await
    }

    pub async fn poll(
        &self,
        executor: &str,
        instance: Option<&str>,
        wait: Duration,
    ) -> Result<Option<Handout>, StoreError> {
        // At a stop a poll is not written down as open: the note that it ended would be left to
        // a runtime about to exit, and the executor counted as polling here after it.
        if self.ending.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(None);
        }
        lock(&self.polls).open(executor, Instant::now() + wait);
        let _open = PollGuard { queue: self, executor };
        // A poll that does not wait (a worker asking for a job ahead) is a sign of life, not a
        // wait: noted as polling, it would spare the note of a long poll that follows within
        // `SEEN_EVERY`, and the executor would be listed as not polling for that poll's length.
        self.seen(executor, (!wait.is_zero()).then_some(wait)).await;
        let deadline = Instant::now() + wait;
        loop {
            let notified = self.work.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.ending.load(std::sync::atomic::Ordering::Acquire) {
                return Ok(None);
            }
            if let Some(h) = self.try_take(executor, instance).await? {
                return Ok(Some(h));
            }
            let until = deadline.min(Instant::now() + RECHECK);
            let _ = tokio::time::timeout_at(until, notified).await;
            if Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// The master is stopping: every poll waiting here ends now with no job, and one that comes
    /// later gets none (the other masters of the queue go on handing out its jobs).
    pub fn end_polls(&self) {
        self.ending.store(true, std::sync::atomic::Ordering::Release);
        self.work.notify_waiters();
    }

    /// Notes that `executor` said it stopped in good order: listed `stopped`, and no longer
    /// counted as serving the queue, until it is heard from again.
    pub async fn stopped(&self, executor: &str) -> Result<(), StoreError> {
        // A poll of the name still open here is another process's (or the stopping one's, not
        // yet seen to close): it ends as any poll does, and is noted then.
        let end_polls = !lock(&self.polls).polling(executor);
        let written = self.rows.stopped(executor, end_polls, &self.master).await;
        // The name's next request is written whatever this master noted lately, before the
        // goodbye too: one noted while the goodbye was on its way may have been written first.
        lock(&self.seen).remove(executor);
        *lock(&self.serving_until) = None;
        written
    }

    /// `executor` said goodbye through another master, which could not know of the polls of
    /// that name open here: another process's, which still serves the queue. They are written
    /// down again at once (rather than at the name's next request after [`SEEN_EVERY`], or not
    /// before the next poll when one is open), so the name is not listed `stopped`, nor the
    /// queue left unserved, while they wait.
    pub async fn stopped_elsewhere(&self, executor: &str) {
        lock(&self.seen).remove(executor);
        *lock(&self.serving_until) = None;
        let Some(until) = lock(&self.polls).open_until(executor) else { return };
        let left = until.saturating_duration_since(Instant::now());
        self.seen(executor, (!left.is_zero()).then_some(left)).await;
    }

    /// Notes `executor` as seen after a call about a lease: when the lease checked out, or when
    /// this master knows the executor already (its refused call is still a sign of life). A
    /// refused call makes no executor known, or every name sent with one would be listed as
    /// serving the queue.
    async fn seen_after<T>(&self, executor: &str, outcome: &Result<T, LeaseError>) {
        if outcome.is_ok() || lock(&self.seen).contains_key(executor) {
            self.seen(executor, None).await;
        }
    }

    pub async fn heartbeat(&self, executor: &str, job_id: &str, lease_id: &str) -> Result<Duration, LeaseError> {
        let lease_ms = self.config.lease.as_millis() as u64;
        let outcome =
            self.rows.heartbeat(executor, job_id, lease_id, lease_ms).await.map_err(storage).and_then(|r| Ok(r?));
        self.seen_after(executor, &outcome).await;
        outcome.map(|()| self.config.lease)
    }

    pub async fn release(&self, executor: &str, job_id: &str, lease_id: &str) -> Result<(), LeaseError> {
        let outcome = self.rows.release(executor, job_id, lease_id).await.map_err(storage).and_then(|r| Ok(r?));
        self.seen_after(executor, &outcome).await;
        outcome?;
        self.work.notify_waiters();
        Ok(())
    }

    fn finished(&self, row: JobRow) -> Finished {
        let waiter = self.waiters().remove(&row.job_id);
        let (token, secrets) = match self.decode(&row) {
            Ok(b) => (b.token, b.secrets),
            Err(_) => (unreadable_token(), Vec::new()),
        };
        Finished {
            job_id: row.job_id,
            model: row.model,
            token,
            attempt: row.attempt,
            waiter,
            secrets,
            invoker: row.invoker,
            holder: row.executor,
            held_ms: row.held_ms,
        }
    }

    /// Takes a queued or handed-out job to record as cancelled; `Ok(None)` when none is open
    /// (or its result is being recorded).
    pub async fn take_cancelled(&self, job_id: &str) -> Result<Option<Finished>, StoreError> {
        let lease_ms = self.config.lease.as_millis() as u64;
        Ok(self.rows.take_cancelled(job_id, &self.master, lease_ms).await?.map(|row| self.finished(row)))
    }

    pub async fn complete(&self, executor: &str, job_id: &str, lease_id: &str) -> Result<Finished, LeaseError> {
        let lease_ms = self.config.lease.as_millis() as u64;
        let outcome = self.rows.complete(executor, job_id, lease_id, &self.master, lease_ms).await;
        let outcome = outcome.map_err(storage).and_then(|r| Ok(r?));
        self.seen_after(executor, &outcome).await;
        Ok(self.finished(outcome?))
    }

    /// The job's result is in the log: its row goes.
    pub async fn recorded(&self, job_id: &str) {
        if let Err(e) = self.rows.forget(job_id).await {
            // Its lease runs out, and the reaper finds the result in the log and removes it.
            tracing::warn!(job = %job_id, error = %e, "removing a finished job from the queue failed");
        }
    }

    pub async fn stale_completions(&self) -> Vec<String> {
        self.rows.stale_completions().await.unwrap_or_else(|e| {
            tracing::debug!(error = %e, "reading stale results failed");
            Vec::new()
        })
    }

    pub async fn reap(&self) -> Vec<(Finished, String)> {
        let due = {
            let mut pruned = lock(&self.pruned);
            let due = pruned.is_none_or(|at| at.elapsed() >= PRUNE_EVERY);
            if due {
                *pruned = Some(Instant::now());
            }
            due
        };
        if due {
            // This master's own notes of when it last wrote each executor down go too.
            lock(&self.seen).retain(|_, (at, _)| at.elapsed() < crate::jobs::FORGET_EXECUTOR_AFTER);
            let gone = crate::jobs::FORGET_EXECUTOR_AFTER.as_millis() as u64;
            if let Err(e) = self.rows.forget_executors(gone).await {
                tracing::debug!(error = %e, "forgetting executors long gone failed");
            }
        }
        let lease_ms = self.config.lease.as_millis() as u64;
        let reaped = match self.rows.reap(self.config.max_attempts, &self.master, lease_ms).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "reaping expired leases failed");
                return Vec::new();
            }
        };
        reaped
            .failed
            .into_iter()
            .map(|row| {
                let why = format!(
                    "the job was handed out {} times and every lease expired without a result (last held by executor {:?}, which stopped sending heartbeats)",
                    row.attempt,
                    row.executor.clone().unwrap_or_default()
                );
                (self.finished(row), why)
            })
            .collect()
    }

    pub async fn drop_orphans(&self, models: &[String]) {
        match self.rows.drop_orphans(models, &self.master).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                dropped = n,
                "queued net jobs of models taken over are dropped; their fires queue them again"
            ),
            Err(e) => tracing::warn!(error = %e, "dropping another master's queued net jobs failed"),
        }
    }

    /// Whether any executor serves the queue, through any master; an error when the database
    /// cannot tell (which must not read as "none": a caller would be told to start an executor
    /// that may well be running).
    pub async fn serving(&self) -> Result<bool, StoreError> {
        if self.serving_until.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|t| Instant::now() < t) {
            return Ok(true);
        }
        let within = self.config.serving_within().as_millis() as i64;
        let (rows, now) = self.rows.executors().await?;
        // One that holds jobs, whenever last heard from: its lease may still bring a result (a
        // long lease is renewed seldom, past `gone_after`; a name that stopped may hold a
        // sibling's). Held until it ends, then reaped.
        let serving = rows
            .iter()
            .any(|e| e.polling_until > now || !e.held.is_empty() || (!e.stopped && now - e.last_seen <= within));
        if serving {
            *self.serving_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + SEEN_EVERY);
        }
        Ok(serving)
    }

    pub async fn executors_shown(&self, shown: impl Fn(&OpenJob) -> bool) -> Result<Vec<ExecutorView>, StoreError> {
        let (rows, now) = self.rows.executors().await?;
        let gone_after = self.config.gone_after.as_millis() as i64;
        Ok(rows
            .into_iter()
            .map(|e| {
                let total = e.held.len();
                let mut jobs: Vec<String> = e
                    .held
                    .into_iter()
                    .filter(|(_, model, invoker)| {
                        shown(&OpenJob { model: model.clone(), invoker: invoker.clone(), running: true })
                    })
                    .map(|(id, _, _)| id)
                    .collect();
                jobs.sort();
                let polling = e.polling_until > now;
                let state = if e.stopped && !polling && total == 0 {
                    "stopped"
                } else if total > 0 {
                    // Holding a lease, however long since its last heartbeat: as it serves.
                    "busy"
                } else if !polling && now - e.last_seen > gone_after {
                    "gone"
                } else if polling {
                    "polling"
                } else if now - e.last_seen > crate::jobs::SILENT_AFTER.as_millis() as i64 {
                    "silent"
                } else {
                    "idle"
                };
                ExecutorView {
                    name: e.name,
                    state: state.into(),
                    last_seen: agentos_core::event::format_time(e.last_seen),
                    other_jobs: total - jobs.len(),
                    jobs,
                }
            })
            .collect())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counts a poll open until it ends (answered, timed out, or dropped with its connection). When
/// an executor's last poll ends and none follows within a second, it is written down as no
/// longer polling; a busy executor polling again at once costs no write.
struct PollGuard<'a> {
    queue: &'a SharedQueue,
    executor: &'a str,
}

impl Drop for PollGuard<'_> {
    fn drop(&mut self) {
        let Some(generation) = lock(&self.queue.polls).close(self.executor) else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let (rows, polls, seen) = (self.queue.rows.clone(), self.queue.polls.clone(), self.queue.seen.clone());
        let executor = self.executor.to_string();
        rt.spawn(async move {
            tokio::time::sleep(SEEN_EVERY).await;
            if !lock(&polls).settle(&executor, generation) {
                return;
            }
            lock(&seen).remove(&executor);
            if let Err(e) = rows.stopped_polling(&executor).await {
                tracing::debug!(executor, error = %e, "noting an executor failed");
            }
        });
    }
}

/// The polls each executor has open through this master. An executor whose last poll ended
/// gets a generation; if it is still the executor's a second later, no poll followed, and the
/// executor leaves the map: names that stopped polling (an executor per restarted container,
/// say) are not kept for the master's life.
#[derive(Default)]
struct OpenPolls {
    open: HashMap<String, (u32, u64)>,
    /// Until when the open polls of each executor wait at the latest (while any is open).
    until: HashMap<String, Instant>,
    /// Never reused, even for a name that left and came back, so a late check of a generation
    /// that ended cannot match a newer one.
    generations: u64,
}

impl OpenPolls {
    /// A poll of `executor` that waits until `until` at the latest.
    fn open(&mut self, executor: &str, until: Instant) {
        match self.open.get_mut(executor) {
            Some(e) => e.0 += 1,
            None => {
                self.open.insert(executor.to_string(), (1, 0));
            }
        }
        let latest = self.until.entry(executor.to_string()).or_insert(until);
        *latest = (*latest).max(until);
    }

    /// Whether a poll of `executor` is open.
    fn polling(&self, executor: &str) -> bool {
        self.open.get(executor).is_some_and(|e| e.0 > 0)
    }

    /// Until when the open polls of `executor` wait at the latest; `None` when none is open.
    fn open_until(&self, executor: &str) -> Option<Instant> {
        if !self.polling(executor) {
            return None;
        }
        self.until.get(executor).copied()
    }

    /// A poll ended; the generation to settle a second later when it was the executor's last.
    fn close(&mut self, executor: &str) -> Option<u64> {
        let e = self.open.get_mut(executor)?;
        e.0 = e.0.saturating_sub(1);
        if e.0 > 0 {
            return None;
        }
        self.until.remove(executor);
        self.generations += 1;
        e.1 = self.generations;
        Some(e.1)
    }

    /// True, and the executor forgotten, when no poll came since `generation` ended.
    fn settle(&mut self, executor: &str, generation: u64) -> bool {
        if self.open.get(executor) != Some(&(0, generation)) {
            return false;
        }
        self.open.remove(executor);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::OpenPolls;
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn an_executor_whose_last_poll_ended_leaves_once_settled() {
        let mut p = OpenPolls::default();
        p.open("e1", Instant::now());
        p.open("e1", Instant::now());
        assert_eq!(p.close("e1"), None, "one poll still open");
        let g = p.close("e1").expect("the last poll ended");
        assert!(p.settle("e1", g));
        assert!(p.open.is_empty(), "a stopped executor is not kept");
        assert!(!p.settle("e1", g), "settled once");
    }

    #[test]
    fn a_poll_after_the_last_one_ended_keeps_the_executor() {
        let mut p = OpenPolls::default();
        p.open("e1", Instant::now());
        let first = p.close("e1").unwrap();
        p.open("e1", Instant::now());
        assert!(!p.settle("e1", first), "polling again");
        let second = p.close("e1").unwrap();
        assert!(!p.settle("e1", first), "a late check of the first end");
        assert!(p.settle("e1", second));
        // Back after leaving: the generation of its first life never matches its second.
        p.open("e1", Instant::now());
        let third = p.close("e1").unwrap();
        assert!(!p.settle("e1", first) && !p.settle("e1", second));
        assert!(third > second && p.settle("e1", third));
    }

    #[test]
    fn the_open_polls_of_an_executor_tell_until_when_they_wait() {
        let mut p = OpenPolls::default();
        assert_eq!(p.open_until("e1"), None, "none open");
        let now = Instant::now();
        p.open("e1", now + Duration::from_secs(20));
        p.open("e1", now + Duration::from_secs(5));
        assert_eq!(p.open_until("e1"), Some(now + Duration::from_secs(20)), "the latest of the two");
        assert_eq!(p.close("e1"), None);
        assert_eq!(p.open_until("e1"), Some(now + Duration::from_secs(20)), "one still open");
        p.close("e1").unwrap();
        assert_eq!(p.open_until("e1"), None, "all ended");
        p.open("e1", now + Duration::from_secs(1));
        assert_eq!(p.open_until("e1"), Some(now + Duration::from_secs(1)), "a new poll starts afresh");
    }
}
