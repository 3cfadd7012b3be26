//! The job queue between the master and its executors: long-poll hand-out, leases with
//! heartbeats, bounded attempts, and the view of who is serving the queue.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use agentos_core::job::{CommandToken, ExecutorView, JobResult};

#[derive(Debug, Clone, Copy)]
pub struct JobConfig {
    /// How long a lease lasts without a heartbeat.
    pub lease: Duration,
    /// Hand-outs of one job before it fails.
    pub max_attempts: u32,
    /// An executor not seen for this long is shown as gone.
    pub gone_after: Duration,
}

/// An executor gone this long is no longer listed: one that comes back is listed anew.
pub const FORGET_EXECUTOR_AFTER: Duration = Duration::from_secs(24 * 3600);

/// A live executor with a free slot always has a poll open, but for the moment between two: one
/// neither polling nor holding a job and not heard from for this long is listed `silent`
/// (killed, frozen or cut off) rather than `idle`, until it is `gone`. One that said it stopped
/// is listed `stopped` at once, and stays so until it is heard from again or forgotten.
pub const SILENT_AFTER: Duration = Duration::from_secs(5);

/// The least an executor neither polling nor holding a job serves the queue for after it was
/// last heard from (see [`JobConfig::serving_within`]): a live one polls again at once, or
/// within its backoff of at most 5 s while its master is away.
pub const SERVING_WITHIN: Duration = Duration::from_secs(15);

impl JobConfig {
    /// How long an executor neither polling nor holding a job serves the queue after it was
    /// last heard from: [`SERVING_WITHIN`], or a heartbeat's interval (a third of the lease) and
    /// 5 s when that is longer, since a job's run may go on after its lease was taken away
    /// (cancelled, or ended early), heard only at its heartbeats. One silent longer was killed,
    /// frozen or cut off, and a caller waiting on it is told `no_executor` after the grace that
    /// follows, rather than after `gone_after` (which only says how it is listed).
    pub fn serving_within(&self) -> Duration {
        SERVING_WITHIN.max(self.lease / 3 + Duration::from_secs(5))
    }
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig { lease: Duration::from_secs(30), max_attempts: 3, gone_after: Duration::from_secs(90) }
    }
}

/// Who waits for a job's result.
pub type Waiter = oneshot::Sender<JobResult>;

/// A job taken out of the queue for good, to be recorded by the engine.
#[derive(Debug)]
pub struct Finished {
    pub job_id: String,
    pub model: String,
    pub token: CommandToken,
    pub attempt: u32,
    pub waiter: Option<Waiter>,
    /// Credential values the job carries; its output is scrubbed of them before it is recorded.
    pub secrets: Vec<String>,
    /// The principal (id) that invoked it directly; `None` for a net's job.
    pub invoker: Option<String>,
    /// The executor that held it when it was taken, if one did: a cancelled job's result
    /// names where it was running.
    pub holder: Option<String>,
    /// How long that executor had held it, in ms: a cancelled job's result says how long it ran.
    pub held_ms: Option<u64>,
}

/// A job the queue handed to an executor.
#[derive(Debug, Clone)]
pub struct Handout {
    pub job_id: String,
    pub lease_id: String,
    pub attempt: u32,
    pub model: String,
    pub token: CommandToken,
    /// The job carries credential values: the executor runs it sealed (a user of its own).
    pub sealed: bool,
    /// Why the job cannot be read back (a shared queue's row sealed with another key): the
    /// executor fails it with this reason.
    pub unreadable: Option<String>,
}

struct Job {
    /// Its place in the queue: jobs are handed out lowest first. A job whose lease expires goes
    /// back to its place, ahead of those queued after it, as the shared queue's `position`.
    order: i64,
    model: String,
    /// Only this executor may take it.
    target: Option<String>,
    token: CommandToken,
    attempt: u32,
    lease: Option<Lease>,
    waiter: Option<Waiter>,
    secrets: Vec<String>,
    invoker: Option<String>,
}

/// Where an open job is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenJob {
    pub model: String,
    pub invoker: Option<String>,
    /// Handed to an executor and not back yet.
    pub running: bool,
}

struct Lease {
    /// 128 random bits: job ids are shown to agents (in the list of executors), lease ids never are,
    /// and nobody can guess one.
    id: String,
    /// The executor that took the job; only it may renew, hand back or finish it.
    executor: String,
    expires: Instant,
    /// When the executor took it.
    taken: Instant,
}

struct Seen {
    last: Instant,
    last_wall: i64,
    polls: u32,
    /// It said it stopped, and has not been heard from since.
    stopped: bool,
}

impl Seen {
    /// Not polling, and not seen for longer than `gone_after`.
    fn gone(&self, now: Instant, gone_after: Duration) -> bool {
        self.polls == 0 && now.duration_since(self.last) > gone_after
    }

    /// Serving the queue: polling, or heard from `within` and not stopped since.
    fn serving(&self, now: Instant, within: Duration) -> bool {
        self.polls > 0 || (!self.stopped && now.duration_since(self.last) <= within)
    }
}

#[derive(Default)]
struct QueueState {
    queued: VecDeque<String>,
    jobs: HashMap<String, Job>,
    executors: HashMap<String, Seen>,
    next: u64,
    /// The order of the last job queued.
    next_order: i64,
    /// The order of the last job handed back, below every other.
    first_order: i64,
    /// How many of `jobs` each invoker has, kept with `jobs` by [`QueueState::add_job`] and
    /// [`QueueState::remove_job`]: counting them at each asynchronous call walked every job.
    open_of: HashMap<String, usize>,
    /// Jobs taken off the queue (a result came, or every lease expired) whose result is not yet
    /// committed: still running as a reader of the job sees it, never unknown.
    recording: HashMap<String, OpenJob>,
    /// No lease runs out before this (a renewal may have put the one it was set from later): a
    /// hand-out looks for leases that ran out only from then on.
    next_expiry: Option<Instant>,
}

/// What [`QueueState::requeue_expired`] did and found.
struct Swept {
    /// Jobs put back in the queue.
    requeued: usize,
    /// Jobs whose lease ran out with no attempt left.
    exhausted: Vec<String>,
    /// When the earliest lease still running runs out.
    next: Option<Instant>,
}

impl QueueState {
    fn add_job(&mut self, id: String, job: Job) {
        if let Some(invoker) = &job.invoker {
            *self.open_of.entry(invoker.clone()).or_default() += 1;
        }
        if let Some(old) = self.jobs.insert(id, job) {
            self.forget_invoker(&old);
        }
    }

    fn remove_job(&mut self, id: &str) -> Option<Job> {
        let job = self.jobs.remove(id)?;
        self.forget_invoker(&job);
        Some(job)
    }

    fn forget_invoker(&mut self, job: &Job) {
        if let Some(invoker) = &job.invoker
            && let Some(n) = self.open_of.get_mut(invoker)
        {
            *n -= 1;
            if *n == 0 {
                self.open_of.remove(invoker);
            }
        }
    }

    /// Puts the jobs whose lease ran out by `now` and that have attempts left back in their
    /// places in the queue (they waited their turn once already); answers how many, and the ids
    /// of the jobs whose lease ran out with no attempt left, which keep their ended lease for
    /// [`MemoryQueue::reap`] to fail. One walk over the jobs, which also sets `next_expiry`:
    /// `now` while such a job is left, else the earliest lease still running (`next`).
    fn requeue_expired(&mut self, now: Instant, max_attempts: u32) -> Swept {
        let mut expired = Vec::new();
        let mut exhausted = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, job) in &self.jobs {
            let Some(lease) = &job.lease else { continue };
            if lease.expires > now {
                next = Some(next.map_or(lease.expires, |t| t.min(lease.expires)));
            } else if job.attempt < max_attempts {
                expired.push(id.clone());
            } else {
                exhausted.push(id.clone());
            }
        }
        for id in &expired {
            let job = self.jobs.get_mut(id).expect("listed above");
            job.lease = None;
            let order = job.order;
            let at = self.queued.partition_point(|queued| self.jobs.get(queued).is_some_and(|j| j.order < order));
            self.queued.insert(at, id.clone());
        }
        self.next_expiry = if exhausted.is_empty() { next } else { Some(now) };
        Swept { requeued: expired.len(), exhausted, next }
    }

    /// `job`, taken off the queue for good, marked as having its result recorded (readers see
    /// it as `running` or `queued`, as it was, until [`MemoryQueue::recorded`]); answers it for
    /// the engine to record.
    fn recording(&mut self, job_id: &str, mut job: Job, running: bool) -> Finished {
        let open = OpenJob { model: job.model.clone(), invoker: job.invoker.clone(), running };
        self.recording.insert(job_id.to_string(), open);
        Finished {
            job_id: job_id.to_string(),
            model: job.model,
            token: job.token,
            attempt: job.attempt,
            waiter: job.waiter.take(),
            secrets: std::mem::take(&mut job.secrets),
            invoker: job.invoker.take(),
            held_ms: job.lease.as_ref().map(|l| l.taken.elapsed().as_millis() as u64),
            holder: job.lease.take().map(|l| l.executor),
        }
    }
}

/// The job queue of a master that is alone on its log: in memory.
pub struct MemoryQueue {
    inner: Mutex<QueueState>,
    work: Notify,
    /// The master is stopping: a waiting poll ends now (see [`MemoryQueue::end_polls`]).
    ending: std::sync::atomic::AtomicBool,
    config: JobConfig,
    /// A per-process prefix so job ids never repeat across restarts.
    epoch: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseError {
    /// No such job (finished, failed, or never queued).
    UnknownJob,
    /// The job is held under another lease (this one expired and it was handed out again).
    LeaseLost,
    /// The lease is right but another executor took the job: a lease is bound to its holder.
    NotHolder,
    /// The shared queue cannot be reached now.
    Storage(String),
}

/// A fresh lease id: 128 random bits as 32 hex characters, after the taking executor process's
/// instance id and a `-` when it sent one (so that its successor can have them expired at once,
/// [`JobQueue::expire_instance`]).
pub(crate) fn new_lease_id(instance: Option<&str>) -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(match instance {
        Some(i) => format!("{i}-{}", hex::encode(bytes)),
        None => hex::encode(bytes),
    })
}

/// Whether `executor` holds `job` under `lease_id`. A wrong lease id is a lost lease (the holder
/// of an expired lease hears the same), the right id from another executor is refused as such.
fn check_holder(lease: Option<&Lease>, executor: &str, lease_id: &str) -> Result<(), LeaseError> {
    match lease {
        Some(l) if l.id != lease_id => Err(LeaseError::LeaseLost),
        Some(l) if l.executor != executor => Err(LeaseError::NotHolder),
        Some(_) => Ok(()),
        None => Err(LeaseError::LeaseLost),
    }
}

fn unseen() -> Seen {
    Seen { last: Instant::now(), last_wall: wall_ms(), polls: 0, stopped: false }
}

/// Notes that `executor` was heard from now (and how its open polls changed). A request, not the
/// end of a poll, undoes a goodbye: a poll the executor left behind may end after it.
fn mark_seen(q: &mut QueueState, executor: &str, poll_delta: i32) {
    let seen = q.executors.entry(executor.to_string()).or_insert_with(unseen);
    seen.last = Instant::now();
    seen.last_wall = wall_ms();
    seen.polls = (seen.polls as i32 + poll_delta).max(0) as u32;
    if poll_delta >= 0 {
        seen.stopped = false;
    }
}

/// [`check_holder`] for `job_id`, noting the executor as seen when its lease checked out or
/// when it is known already: a refused call (an unknown job, a made-up name) makes no executor
/// known, or every name sent with one would be listed as serving the queue.
fn checked_holder(q: &mut QueueState, executor: &str, job_id: &str, lease_id: &str) -> Result<(), LeaseError> {
    let checked = match q.jobs.get(job_id) {
        Some(job) => check_holder(job.lease.as_ref(), executor, lease_id),
        None => Err(LeaseError::UnknownJob),
    };
    if checked.is_ok() || q.executors.contains_key(executor) {
        mark_seen(q, executor, 0);
    }
    checked
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl MemoryQueue {
    pub fn new(config: JobConfig) -> Self {
        let epoch = format!("{:x}", wall_ms());
        MemoryQueue {
            inner: Mutex::new(QueueState::default()),
            work: Notify::new(),
            ending: std::sync::atomic::AtomicBool::new(false),
            config,
            epoch,
        }
    }

    pub fn config(&self) -> JobConfig {
        self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A std Mutex: every critical section is short and none awaits.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a job and wakes one waiting poller. The receiver yields the outcome.
    pub fn enqueue(&self, model: String, token: CommandToken) -> (String, oneshot::Receiver<JobResult>) {
        self.enqueue_for(model, token, None, Vec::new())
    }

    /// Queues a job that only the executor named `target` may take (any, when `None`).
    pub fn enqueue_for(
        &self,
        model: String,
        token: CommandToken,
        target: Option<String>,
        secrets: Vec<String>,
    ) -> (String, oneshot::Receiver<JobResult>) {
        let id = self.new_id();
        let rx = self.insert(id.clone(), model, token, target, secrets, None);
        (id, rx)
    }

    /// A job id never given before, across restarts too (the epoch is this process's start).
    pub fn new_id(&self) -> String {
        let mut q = self.lock();
        q.next += 1;
        format!("job-{}-{}", self.epoch, q.next)
    }

    /// Queues a direct invocation's job under `id` (new, or one recovered after a restart):
    /// any executor may take it, it carries no secrets, and `invoker` may read its result.
    pub fn enqueue_direct(
        &self,
        id: String,
        model: String,
        token: CommandToken,
        invoker: String,
    ) -> oneshot::Receiver<JobResult> {
        self.insert(id, model, token, None, Vec::new(), Some(invoker))
    }

    fn insert(
        &self,
        id: String,
        model: String,
        token: CommandToken,
        target: Option<String>,
        secrets: Vec<String>,
        invoker: Option<String>,
    ) -> oneshot::Receiver<JobResult> {
        let (tx, rx) = oneshot::channel();
        let targeted = target.is_some();
        {
            let mut q = self.lock();
            q.next_order += 1;
            let order = q.next_order;
            let job = Job { order, model, target, token, attempt: 0, lease: None, waiter: Some(tx), secrets, invoker };
            q.add_job(id.clone(), job);
            q.queued.push_back(id);
        }
        if targeted {
            // Only one executor may take it: wake every poller so that one is sure to look.
            self.work.notify_waiters();
        } else {
            self.work.notify_one();
        }
        rx
    }

    /// How many direct jobs `invoker` has open (queued or running).
    pub fn open_jobs_of(&self, invoker: &str) -> usize {
        self.lock().open_of.get(invoker).copied().unwrap_or(0)
    }

    /// An open job: queued, or handed out and not finished.
    pub fn open_job(&self, job_id: &str) -> Option<OpenJob> {
        let q = self.lock();
        let open = q.jobs.get(job_id).map(|j| OpenJob {
            model: j.model.clone(),
            invoker: j.invoker.clone(),
            running: j.lease.is_some(),
        });
        open.or_else(|| q.recording.get(job_id).cloned())
    }

    /// The result of a job taken off the queue is committed, or will not be: readers find it
    /// in the log from now on, or nowhere.
    pub fn recorded(&self, job_id: &str) {
        self.lock().recording.remove(job_id);
    }

    /// Drops a job whose caller stopped waiting, queued or handed out: a job handed out holds an
    /// executor's slot, and its executor's next heartbeat finds the job gone and stops it. A job
    /// whose result is being recorded is no longer here. Returns whether it was dropped.
    pub fn cancel(&self, job_id: &str) -> bool {
        let mut q = self.lock();
        let Some(job) = q.remove_job(job_id) else { return false };
        if job.lease.is_none() {
            q.queued.retain(|j| j != job_id);
        }
        true
    }

    /// Takes a queued or handed-out job to record as cancelled, as [`MemoryQueue::complete`]
    /// takes an executor's result: a job handed out is stopped at its executor's next
    /// heartbeat. `None` when no such job is open (or its result is being recorded).
    pub fn take_cancelled(&self, job_id: &str) -> Option<Finished> {
        let mut q = self.lock();
        let job = q.remove_job(job_id)?;
        if job.lease.is_none() {
            q.queued.retain(|j| j != job_id);
        }
        let running = job.lease.is_some();
        Some(q.recording(job_id, job, running))
    }

    /// A job if one is queued right now, without waiting.
    pub fn take_now(&self, executor: &str, instance: Option<&str>) -> Option<Handout> {
        // At a stop no job goes out: its result could no longer be posted here.
        if self.ending.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        self.touch(executor, 0);
        self.try_take(executor, instance)
    }

    fn try_take(&self, executor: &str, instance: Option<&str>) -> Option<Handout> {
        // Drawn before the lock, so the critical section stays short. Without randomness no job is
        // handed out (a guessable lease would let any executor finish it); the job stays queued.
        let lease_id = match new_lease_id(instance) {
            Ok(id) => id,
            Err(e) => {
                tracing::error!(error = %e, "no randomness for a lease id: no job handed out");
                return None;
            }
        };
        let mut guard = self.lock();
        let q = &mut *guard;
        q.executors.entry(executor.to_string()).or_insert_with(unseen);
        // A job whose lease ran out goes back to its place before anything is handed out, as in
        // the shared queue, rather than at the reaper's next round: a hand-out in between took
        // the job behind it first.
        let now = Instant::now();
        if q.next_expiry.is_some_and(|t| t <= now) {
            // The first may be the one taken now; the rest wake other pollers.
            for _ in 1..q.requeue_expired(now, self.config.max_attempts).requeued {
                self.work.notify_one();
            }
        }
        // A cancelled job's id leaves the queue with it; should one be left behind, it goes when it
        // reaches the front. (This used to sweep the whole queue at every hand-out: a queue of
        // thousands cost each hand-out a lookup per queued job.) A targeted job waits for its
        // executor.
        while q.queued.front().is_some_and(|id| !q.jobs.contains_key(id)) {
            q.queued.pop_front();
        }
        let pos =
            q.queued.iter().position(|id| q.jobs.get(id).is_some_and(|j| may_take(j.target.as_deref(), executor)));
        if let Some(id) = pos.and_then(|p| q.queued.remove(p)) {
            let job = q.jobs.get_mut(&id)?;
            job.attempt += 1;
            let expires = now + self.config.lease;
            job.lease = Some(Lease { id: lease_id.clone(), executor: executor.to_string(), expires, taken: now });
            q.next_expiry = Some(q.next_expiry.map_or(expires, |t| t.min(expires)));
            return Some(Handout {
                job_id: id,
                lease_id,
                attempt: job.attempt,
                model: job.model.clone(),
                token: job.token.clone(),
                sealed: !job.secrets.is_empty(),
                unreadable: None,
            });
        }
        None
    }

    fn touch(&self, executor: &str, poll_delta: i32) {
        mark_seen(&mut self.lock(), executor, poll_delta);
    }

    /// Long poll: a job as soon as one is queued, or `None` after `wait`.
    pub async fn poll(&self, executor: &str, instance: Option<&str>, wait: Duration) -> Option<Handout> {
        if self.ending.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        self.touch(executor, 1);
        let _done = PollGuard { queue: self, executor };
        let deadline = Instant::now() + wait;
        loop {
            // Register interest before looking, so a job queued in between is not missed.
            let notified = self.work.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.ending.load(std::sync::atomic::Ordering::Acquire) {
                return None;
            }
            if let Some(h) = self.try_take(executor, instance) {
                return Some(h);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// The master is stopping: every poll waiting ends now with no job, and one that comes
    /// later gets none, rather than holding its connection (and the stop) until its wait ends.
    pub fn end_polls(&self) {
        self.ending.store(true, std::sync::atomic::Ordering::Release);
        self.work.notify_waiters();
    }

    /// Notes that `executor` said it stopped in good order: listed `stopped`, and no longer
    /// counted as serving the queue, until it is heard from again. One never heard from is
    /// not noted.
    pub fn stopped(&self, executor: &str) {
        if let Some(seen) = self.lock().executors.get_mut(executor) {
            seen.stopped = true;
            seen.last = Instant::now();
            seen.last_wall = wall_ms();
        }
    }

    /// Renews a lease; only its holder may.
    pub fn heartbeat(&self, executor: &str, job_id: &str, lease_id: &str) -> Result<Duration, LeaseError> {
        let mut q = self.lock();
        checked_holder(&mut q, executor, job_id, lease_id)?;
        let job = q.jobs.get_mut(job_id).expect("checked above");
        if let Some(l) = &mut job.lease {
            l.expires = Instant::now() + self.config.lease;
        }
        Ok(self.config.lease)
    }

    /// Hands a job back to the queue (an executor stopping); only its holder may. The attempt is
    /// not counted.
    pub fn release(&self, executor: &str, job_id: &str, lease_id: &str) -> Result<(), LeaseError> {
        {
            let mut q = self.lock();
            checked_holder(&mut q, executor, job_id, lease_id)?;
            // First in line, ahead of every job (the shared queue does the same): orders handed
            // back count down from 0, those of new jobs up from 1.
            q.first_order -= 1;
            let first = q.first_order;
            let job = q.jobs.get_mut(job_id).expect("checked above");
            job.lease = None;
            job.attempt = job.attempt.saturating_sub(1);
            job.order = first;
            q.queued.push_front(job_id.to_string());
        }
        self.work.notify_one();
        Ok(())
    }

    /// Takes the result of a job from its current lease holder (that lease, that executor); any
    /// other result is refused and changes nothing, so exactly one result is recorded per job.
    pub fn complete(&self, executor: &str, job_id: &str, lease_id: &str) -> Result<Finished, LeaseError> {
        let mut q = self.lock();
        checked_holder(&mut q, executor, job_id, lease_id)?;
        let job = q.remove_job(job_id).expect("checked above");
        Ok(q.recording(job_id, job, true))
    }

    /// Ends now every lease `executor` took through one of its processes `instances` (ones that
    /// died: their successor on the same workspace says so), so that the next
    /// [`MemoryQueue::reap`] deals with those jobs as with any expired lease. Answers how many.
    pub fn expire_instances(&self, executor: &str, instances: &[&str]) -> usize {
        let prefixes: Vec<String> = instances.iter().map(|i| format!("{i}-")).collect();
        let now = Instant::now();
        let mut q = self.lock();
        let mut n = 0;
        for l in q.jobs.values_mut().filter_map(|j| j.lease.as_mut()) {
            if l.executor == executor && prefixes.iter().any(|p| l.id.starts_with(p.as_str())) {
                l.expires = now;
                n += 1;
            }
        }
        if n > 0 {
            q.next_expiry = Some(now);
        }
        n
    }

    /// Puts jobs whose lease expired back in the queue, or fails them after the last attempt.
    /// Returns the failed ones with their waiters. Walks the jobs only once a lease may have run
    /// out (`next_expiry`), rather than every round.
    pub fn reap(&self) -> Vec<(Finished, String)> {
        let now = Instant::now();
        let mut failed = Vec::new();
        let mut requeued = 0;
        {
            let mut q = self.lock();
            if q.next_expiry.is_some_and(|t| t <= now) {
                let swept = q.requeue_expired(now, self.config.max_attempts);
                requeued = swept.requeued;
                for id in swept.exhausted {
                    let job = q.remove_job(&id).expect("listed above");
                    let holder = job.lease.as_ref().map(|l| l.executor.clone()).unwrap_or_default();
                    let why = format!(
                        "the job was handed out {} times and every lease expired without a result (last held by executor {holder:?}, which stopped sending heartbeats)",
                        job.attempt
                    );
                    // The last holder and how long it held the job go with it.
                    failed.push((q.recording(&id, job, true), why));
                }
                // Those failed, the earliest lease left running is the next to look at.
                q.next_expiry = swept.next;
            }
        }
        for _ in 0..requeued {
            self.work.notify_one();
        }
        // Executors gone for a day leave the list, which would otherwise keep every name that
        // ever served (one per process for executors named by their host, say).
        self.lock().executors.retain(|_, seen| !seen.gone(now, FORGET_EXECUTOR_AFTER));
        failed
    }

    pub fn queued_len(&self) -> usize {
        self.lock().queued.len()
    }

    /// Whether any executor serves the queue: one is polling, or holds a job's lease, or was
    /// heard from within [`JobConfig::serving_within`] and has not stopped.
    pub fn serving(&self) -> bool {
        let q = self.lock();
        let now = Instant::now();
        let within = self.config.serving_within();
        if q.executors.values().any(|s| s.serving(now, within)) {
            return true;
        }
        // A lease held: its holder may still post the result, whenever it was last heard from (a
        // long lease is renewed seldom, past `gone_after`), and under whatever name (a process
        // that stopped beside a sibling still running). Held until it ends, then reaped.
        // Looked for only when nothing else serves.
        q.jobs.values().any(|j| j.lease.is_some())
    }

    /// Executors with their state, longest-known first.
    pub fn executors(&self) -> Vec<ExecutorView> {
        self.executors_shown(|_| true)
    }

    /// Executors with their state, naming only the jobs for which `shown(job)` holds; the others
    /// an executor holds are counted in `other_jobs`.
    pub fn executors_shown(&self, shown: impl Fn(&OpenJob) -> bool) -> Vec<ExecutorView> {
        let q = self.lock();
        let now = Instant::now();
        let mut out: Vec<ExecutorView> = q
            .executors
            .iter()
            .map(|(name, seen)| {
                let held: Vec<(&String, &Job)> =
                    q.jobs.iter().filter(|(_, j)| j.lease.as_ref().is_some_and(|l| &l.executor == name)).collect();
                let busy = !held.is_empty();
                let mut jobs: Vec<String> = held
                    .iter()
                    .filter(|(_, j)| {
                        shown(&OpenJob { model: j.model.clone(), invoker: j.invoker.clone(), running: true })
                    })
                    .map(|(id, _)| (*id).clone())
                    .collect();
                let other_jobs = held.len() - jobs.len();
                jobs.sort();
                let state = if seen.stopped && seen.polls == 0 && !busy {
                    "stopped"
                } else if busy {
                    // Holding a lease, however long since its last heartbeat (a long lease is
                    // renewed seldom): busy, as it counts as serving.
                    "busy"
                } else if seen.gone(now, self.config.gone_after) {
                    "gone"
                } else if seen.polls > 0 {
                    "polling"
                } else if now.duration_since(seen.last) > SILENT_AFTER {
                    "silent"
                } else {
                    "idle"
                };
                ExecutorView {
                    name: name.clone(),
                    state: state.into(),
                    last_seen: agentos_core::event::format_time(seen.last_wall),
                    jobs,
                    other_jobs,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

/// The body of a shared queue's row for a job without credentials (see `agentos import`).
pub fn shared_row_body(token: CommandToken) -> Result<Vec<u8>, agentos_core::CoreError> {
    crate::shared_jobs::plain_body(token)
}

/// The job queue: in memory for a master alone on its log, or shared with other masters on
/// PostgreSQL. Who waits for a job waits on the master that queued it.
pub enum JobQueue {
    Memory(Box<MemoryQueue>),
    Shared(Box<crate::shared_jobs::SharedQueue>, SharedIds),
}

/// Job ids of a master sharing its queue: its start and its name keep them apart from every
/// other master's.
pub struct SharedIds {
    prefix: String,
    next: std::sync::atomic::AtomicU64,
}

fn store_lease_error(e: agentos_store::StoreError) -> crate::EngineError {
    e.into()
}

impl JobQueue {
    pub fn memory(config: JobConfig) -> Self {
        JobQueue::Memory(Box::new(MemoryQueue::new(config)))
    }

    pub fn shared(
        rows: std::sync::Arc<dyn agentos_store::SharedJobs>,
        master: String,
        key: Option<[u8; 32]>,
        config: JobConfig,
    ) -> Self {
        // This run's name in the queue too: the net jobs of a run that stopped are told apart
        // from this one's, even on a master that restarted under the same tag.
        let prefix = format!("job-{:x}-{master}", wall_ms());
        let queue = crate::shared_jobs::SharedQueue::new(rows, prefix.clone(), key, config);
        JobQueue::Shared(Box::new(queue), SharedIds { prefix, next: Default::default() })
    }

    pub fn config(&self) -> JobConfig {
        match self {
            JobQueue::Memory(q) => q.config(),
            JobQueue::Shared(q, _) => q.config(),
        }
    }

    pub fn is_shared(&self) -> bool {
        matches!(self, JobQueue::Shared(..))
    }

    /// The master is stopping: polls waiting here end now with no job (see
    /// [`MemoryQueue::end_polls`]).
    pub fn end_polls(&self) {
        match self {
            JobQueue::Memory(q) => q.end_polls(),
            JobQueue::Shared(q, _) => q.end_polls(),
        }
    }

    /// This run's name in a shared queue (the owner of the jobs it queues).
    pub fn run_name(&self) -> Option<String> {
        match self {
            JobQueue::Memory(_) => None,
            JobQueue::Shared(_, ids) => Some(ids.prefix.clone()),
        }
    }

    /// A job id never given before, across restarts and masters too.
    pub fn new_id(&self) -> String {
        match self {
            JobQueue::Memory(q) => q.new_id(),
            JobQueue::Shared(_, ids) => {
                let n = ids.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                format!("{}-{n}", ids.prefix)
            }
        }
    }

    /// Queues a job that only the executor named `target` may take (any, when `None`).
    pub async fn enqueue_for(
        &self,
        model: String,
        token: CommandToken,
        target: Option<String>,
        secrets: Vec<String>,
    ) -> Result<(String, oneshot::Receiver<JobResult>), crate::EngineError> {
        match self {
            JobQueue::Memory(q) => Ok(q.enqueue_for(model, token, target, secrets)),
            JobQueue::Shared(q, _) => {
                let id = self.new_id();
                let rx = q.enqueue(id.clone(), model, token, target, secrets, None).await?;
                Ok((id, rx))
            }
        }
    }

    /// Queues a direct invocation's job under `id`: any executor may take it, it carries no
    /// secrets, and `invoker` may read its result.
    pub async fn enqueue_direct(
        &self,
        id: String,
        model: String,
        token: CommandToken,
        invoker: String,
    ) -> Result<oneshot::Receiver<JobResult>, crate::EngineError> {
        match self {
            JobQueue::Memory(q) => Ok(q.enqueue_direct(id, model, token, invoker)),
            JobQueue::Shared(q, _) => q.enqueue(id, model, token, None, Vec::new(), Some(invoker)).await,
        }
    }

    pub async fn open_jobs_of(&self, invoker: &str) -> Result<usize, crate::EngineError> {
        match self {
            JobQueue::Memory(q) => Ok(q.open_jobs_of(invoker)),
            JobQueue::Shared(q, _) => q.open_jobs_of(invoker).await.map_err(store_lease_error),
        }
    }

    pub async fn open_job(&self, job_id: &str) -> Result<Option<OpenJob>, crate::EngineError> {
        match self {
            JobQueue::Memory(q) => Ok(q.open_job(job_id)),
            JobQueue::Shared(q, _) => q.open_job(job_id).await.map_err(store_lease_error),
        }
    }

    /// Drops a job whose caller stopped waiting; one handed out is stopped at its executor's
    /// next heartbeat.
    pub async fn cancel(&self, job_id: &str) -> bool {
        match self {
            JobQueue::Memory(q) => q.cancel(job_id),
            JobQueue::Shared(q, _) => q.cancel(job_id).await,
        }
    }

    /// A job if one is queued right now; `instance` is the taking executor process's id.
    pub async fn take_now(
        &self,
        executor: &str,
        instance: Option<&str>,
    ) -> Result<Option<Handout>, crate::EngineError> {
        match self {
            JobQueue::Memory(q) => Ok(q.take_now(executor, instance)),
            JobQueue::Shared(q, _) => q.take_now(executor, instance).await.map_err(store_lease_error),
        }
    }

    pub async fn poll(
        &self,
        executor: &str,
        instance: Option<&str>,
        wait: Duration,
    ) -> Result<Option<Handout>, crate::EngineError> {
        match self {
            JobQueue::Memory(q) => Ok(q.poll(executor, instance, wait).await),
            JobQueue::Shared(q, _) => q.poll(executor, instance, wait).await.map_err(store_lease_error),
        }
    }

    /// Ends now the leases `executor` took through its processes `instances`, which died (their
    /// successor says so): the next reap requeues those jobs (or fails them after their last
    /// attempt) instead of waiting out the lease. Answers how many.
    pub async fn expire_instances(&self, executor: &str, instances: &[&str]) -> Result<usize, crate::EngineError> {
        match self {
            JobQueue::Memory(q) => Ok(q.expire_instances(executor, instances)),
            JobQueue::Shared(q, _) => q.expire_instances(executor, instances).await.map_err(store_lease_error),
        }
    }

    pub async fn heartbeat(&self, executor: &str, job_id: &str, lease_id: &str) -> Result<Duration, LeaseError> {
        match self {
            JobQueue::Memory(q) => q.heartbeat(executor, job_id, lease_id),
            JobQueue::Shared(q, _) => q.heartbeat(executor, job_id, lease_id).await,
        }
    }

    pub async fn release(&self, executor: &str, job_id: &str, lease_id: &str) -> Result<(), LeaseError> {
        match self {
            JobQueue::Memory(q) => q.release(executor, job_id, lease_id),
            JobQueue::Shared(q, _) => q.release(executor, job_id, lease_id).await,
        }
    }

    pub async fn complete(&self, executor: &str, job_id: &str, lease_id: &str) -> Result<Finished, LeaseError> {
        match self {
            JobQueue::Memory(q) => q.complete(executor, job_id, lease_id),
            JobQueue::Shared(q, _) => q.complete(executor, job_id, lease_id).await,
        }
    }

    /// Takes a queued or handed-out job to record as cancelled; `None` when none is open.
    pub async fn take_cancelled(&self, job_id: &str) -> Result<Option<Finished>, crate::EngineError> {
        match self {
            JobQueue::Memory(q) => Ok(q.take_cancelled(job_id)),
            JobQueue::Shared(q, _) => q.take_cancelled(job_id).await.map_err(store_lease_error),
        }
    }

    /// A job's result is in the log: a shared queue lets its row go. (The memory queue's mark
    /// goes with [`JobQueue::recorded_here`], on the committer's thread.)
    pub async fn recorded(&self, job_id: &str) {
        if let JobQueue::Shared(q, _) = self {
            q.recorded(job_id).await
        }
    }

    /// A job taken off the memory queue has its result committed, or it will not be: readers
    /// stop seeing it as running. A shared queue keeps its row until [`JobQueue::recorded`].
    pub fn recorded_here(&self, job_id: &str) {
        if let JobQueue::Memory(q) = self {
            q.recorded(job_id)
        }
    }

    /// Jobs of a shared queue whose result was being recorded by a master that stopped.
    pub async fn stale_completions(&self) -> Vec<String> {
        match self {
            JobQueue::Memory(_) => Vec::new(),
            JobQueue::Shared(q, _) => q.stale_completions().await,
        }
    }

    /// Puts jobs whose lease expired back in the queue, or fails them after the last attempt.
    pub async fn reap(&self) -> Vec<(Finished, String)> {
        match self {
            JobQueue::Memory(q) => q.reap(),
            JobQueue::Shared(q, _) => q.reap().await,
        }
    }

    /// On a shared queue, who waits on this master for a job's result (answered as results
    /// are folded from the log); none on a queue of this master alone, which answers its
    /// waiters as it records each result.
    pub fn result_waiters(&self) -> Option<crate::shared_jobs::ResultWaiters> {
        match self {
            JobQueue::Memory(_) => None,
            JobQueue::Shared(q, _) => Some(q.result_waiters()),
        }
    }

    /// A shared queue announced a queued job: pollers look again.
    pub fn announced(&self) {
        if let JobQueue::Shared(q, _) = self {
            q.announced()
        }
    }

    /// Models this master took over: the net jobs other masters queued for them and nobody
    /// took go (the fires resume here and queue their own).
    pub async fn drop_orphans(&self, models: &[String]) {
        if let JobQueue::Shared(q, _) = self {
            q.drop_orphans(models).await
        }
    }

    /// Notes that `executor` said it stopped in good order (see [`MemoryQueue::stopped`]).
    pub async fn stopped(&self, executor: &str) -> Result<(), crate::EngineError> {
        match self {
            JobQueue::Memory(q) => {
                q.stopped(executor);
                Ok(())
            }
            JobQueue::Shared(q, _) => q.stopped(executor).await.map_err(store_lease_error),
        }
    }

    /// `executor` said goodbye through another master sharing the queue (see
    /// [`crate::shared_jobs::SharedQueue::stopped_elsewhere`]).
    pub async fn stopped_elsewhere(&self, executor: &str) {
        if let JobQueue::Shared(q, _) = self {
            q.stopped_elsewhere(executor).await
        }
    }

    /// Whether any executor serves the queue (through any master, when shared). A shared
    /// queue whose database cannot tell answers why, in words a caller can act on.
    pub async fn serving(&self) -> Result<bool, crate::EngineError> {
        match self {
            JobQueue::Memory(q) => Ok(q.serving()),
            JobQueue::Shared(q, _) => q.serving().await.map_err(|e| {
                let e = crate::EngineError::from(e);
                agentos_core::CoreError::new(
                    e.kind(),
                    e.code(),
                    format!("cannot tell whether an executor serves the queue: {e}; try again"),
                )
                .into()
            }),
        }
    }

    /// Executors with their state, naming only the jobs for which `shown(job)` holds.
    pub async fn executors_shown(
        &self,
        shown: impl Fn(&OpenJob) -> bool,
    ) -> Result<Vec<ExecutorView>, crate::EngineError> {
        match self {
            JobQueue::Memory(q) => Ok(q.executors_shown(shown)),
            JobQueue::Shared(q, _) => q.executors_shown(shown).await.map_err(store_lease_error),
        }
    }
}

/// Whether `executor` (`credential` or `credential/name`) may take a job meant for `target`.
fn may_take(target: Option<&str>, executor: &str) -> bool {
    match target {
        None => true,
        Some(t) => executor == t || executor.split('/').any(|part| part == t),
    }
}

struct PollGuard<'a> {
    queue: &'a MemoryQueue,
    executor: &'a str,
}

impl Drop for PollGuard<'_> {
    fn drop(&mut self) {
        self.queue.touch(self.executor, -1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> CommandToken {
        CommandToken { executor: "script".into(), command: "invoke".into(), args: serde_json::json!({"toolId": "t"}) }
    }

    fn queue() -> MemoryQueue {
        MemoryQueue::new(JobConfig {
            lease: Duration::from_secs(10),
            max_attempts: 2,
            gone_after: Duration::from_secs(60),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_poll_is_answered_the_moment_a_job_is_queued() {
        let q = std::sync::Arc::new(queue());
        let q2 = q.clone();
        let poller = tokio::spawn(async move { q2.poll("e1", None, Duration::from_secs(30)).await });
        tokio::task::yield_now().await;
        let start = Instant::now();
        let (id, _rx) = q.enqueue("default".into(), token());
        let h = poller.await.unwrap().expect("a job");
        assert_eq!(h.job_id, id);
        assert_eq!(start.elapsed(), Duration::ZERO, "no time passed: nobody slept");
        assert!(q.poll("e1", None, Duration::from_secs(5)).await.is_none());
    }

    /// Regression: a lease renewed seldom (a long one: heartbeats come every third of it) left its
    /// holder unheard past `gone_after`, so nothing counted as serving while the job ran, and a
    /// caller waiting on it was told no executor serves the queue, its job cancelled.
    #[tokio::test(start_paused = true)]
    async fn a_held_lease_serves_the_queue_however_long_since_its_holder_was_heard() {
        let q = MemoryQueue::new(JobConfig {
            lease: Duration::from_secs(600),
            max_attempts: 2,
            gone_after: Duration::from_secs(60),
        });
        let (id, _rx) = q.enqueue("default".into(), token());
        let held = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
        tokio::time::advance(Duration::from_secs(200)).await;
        assert!(q.serving(), "e1 holds the job's lease");
        assert_eq!(q.executors()[0].state, "busy", "not gone: it holds a lease");
        q.complete("e1", &id, &held.lease_id).unwrap();
        // Its window is a heartbeat's interval (200 s) and 5 s.
        tokio::time::advance(Duration::from_secs(206)).await;
        assert!(!q.serving(), "e1 holds nothing and was last heard 206 s ago");
    }

    /// At a stop, a poll waiting ends at once with no job, and a later poll or a take with a
    /// result gets none, though a job is queued: its result could not be posted here.
    #[tokio::test(start_paused = true)]
    async fn at_a_stop_waiting_polls_end_and_no_job_goes_out() {
        let q = std::sync::Arc::new(queue());
        let q2 = q.clone();
        let waiting = tokio::spawn(async move { q2.poll("e1", None, Duration::from_secs(60)).await });
        tokio::task::yield_now().await;
        let start = Instant::now();
        q.end_polls();
        assert!(waiting.await.unwrap().is_none());
        assert_eq!(start.elapsed(), Duration::ZERO, "the poll was held");
        let (_id, _rx) = q.enqueue("default".into(), token());
        assert!(q.poll("e1", None, Duration::from_secs(60)).await.is_none(), "a job went out at the stop");
        assert!(q.take_now("e1", None).is_none(), "a job went out with a result at the stop");
        assert_eq!(start.elapsed(), Duration::ZERO, "a later poll waited");
    }

    /// An executor that holds nothing and polls no more (killed between two polls) serves the
    /// queue for `serving_within` after it was last heard, not until it is listed gone; with a
    /// long lease, for a heartbeat's interval and 5 s, since a job whose lease was taken away
    /// may still be running there, heard only at its heartbeats.
    #[tokio::test(start_paused = true)]
    async fn a_silent_executor_serves_the_queue_for_its_window_only() {
        for (lease, within) in [(10, 15), (30, 15), (120, 45)] {
            let q = MemoryQueue::new(JobConfig {
                lease: Duration::from_secs(lease),
                max_attempts: 2,
                gone_after: Duration::from_secs(90),
            });
            assert_eq!(q.config().serving_within(), Duration::from_secs(within), "lease {lease} s");
            assert!(q.poll("e1", None, Duration::from_millis(1)).await.is_none());
            tokio::time::advance(Duration::from_secs(within - 1)).await;
            assert!(q.serving(), "lease {lease} s: heard {} s ago", within - 1);
            tokio::time::advance(Duration::from_secs(2)).await;
            assert!(!q.serving(), "lease {lease} s: heard {} s ago", within + 1);
            assert_eq!(q.executors()[0].state, "silent", "listed silent, not yet gone");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_lease_requeues_then_fails_after_the_last_attempt() {
        let q = queue();
        let (id, rx) = q.enqueue("default".into(), token());
        let first = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(q.heartbeat("e1", &id, &first.lease_id), Ok(Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(q.reap().is_empty(), "the heartbeat renewed the lease");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(q.reap().is_empty());
        let second = q.poll("e2", None, Duration::from_secs(1)).await.unwrap();
        assert_eq!(second.attempt, 2);
        // The first holder's result is refused: exactly one result per job.
        assert_eq!(q.complete("e1", &id, &first.lease_id).unwrap_err(), LeaseError::LeaseLost);
        tokio::time::advance(Duration::from_secs(11)).await;
        let failed = q.reap();
        assert_eq!(failed.len(), 1);
        assert!(failed[0].1.contains("handed out 2 times"), "{}", failed[0].1);
        drop(rx);
        assert_eq!(q.heartbeat("e2", &id, &second.lease_id), Err(LeaseError::UnknownJob));
    }

    /// Regression: a job whose lease expired went to the back of the queue, behind every job
    /// queued while it ran, and waited its turn a second time. It goes back to its place, as in
    /// the shared queue; one handed back by a stopping executor goes first.
    #[tokio::test(start_paused = true)]
    async fn a_job_whose_lease_expired_goes_back_to_its_place_in_the_queue() {
        let q = queue();
        let (a, _ra) = q.enqueue("default".into(), token());
        let (b, _rb) = q.enqueue("default".into(), token());
        let first = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
        assert_eq!(first.job_id, a);
        let (c, _rc) = q.enqueue("default".into(), token());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(q.reap().is_empty());
        let mut order = Vec::new();
        for _ in 0..3 {
            order.push(q.poll("e2", None, Duration::from_secs(1)).await.unwrap());
        }
        let ids: Vec<_> = order.iter().map(|h| h.job_id.clone()).collect();
        assert_eq!(ids, [a.clone(), b.clone(), c.clone()], "a reaped job went behind those queued after it");
        assert_eq!(order[0].attempt, 2);
        // Handed back by its executor: first, ahead of older jobs still queued.
        let (d, _rd) = q.enqueue("default".into(), token());
        q.release("e2", &c, &order[2].lease_id).unwrap();
        assert_eq!(q.poll("e3", None, Duration::from_secs(1)).await.unwrap().job_id, c);
        assert_eq!(q.poll("e3", None, Duration::from_secs(1)).await.unwrap().job_id, d);
        // Several reaped at once go back to their places, ahead of a job queued after them; the
        // one handed back keeps its place at the front. `a`'s second lease was its last.
        let (e, _re) = q.enqueue("default".into(), token());
        tokio::time::advance(Duration::from_secs(11)).await;
        let failed = q.reap();
        assert_eq!(failed.iter().map(|f| f.0.job_id.as_str()).collect::<Vec<_>>(), [a.as_str()]);
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(q.poll("e4", None, Duration::from_secs(1)).await.unwrap().job_id);
        }
        assert_eq!(got, [c, b, d, e]);
    }

    /// Regression: a job whose lease ran out waited for the reaper's next round (up to half a
    /// second) to go back to its place, and a hand-out in between took the job queued after it.
    #[tokio::test(start_paused = true)]
    async fn a_job_whose_lease_ran_out_is_handed_out_again_before_the_reaper_runs() {
        let q = queue();
        let (a, _ra) = q.enqueue("default".into(), token());
        let first = q.take_now("e1", None).unwrap();
        let (b, _rb) = q.enqueue("default".into(), token());
        let (c, _rc) = q.enqueue("default".into(), token());
        let renewed = q.take_now("e1", None).unwrap();
        assert_eq!((first.job_id.as_str(), renewed.job_id.as_str()), (a.as_str(), b.as_str()));
        tokio::time::advance(Duration::from_secs(6)).await;
        q.heartbeat("e1", &b, &renewed.lease_id).unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
        // `a`'s lease ran out, `b`'s was renewed: `a` comes before `c`, with no reaper.
        let again = q.take_now("e2", None).unwrap();
        assert_eq!((again.job_id.as_str(), again.attempt), (a.as_str(), 2));
        assert_eq!(q.complete("e1", &a, &first.lease_id).err(), Some(LeaseError::LeaseLost));
        assert_eq!(q.take_now("e2", None).unwrap().job_id, c);
        assert!(q.take_now("e2", None).is_none(), "b's renewed lease still holds");
        // `a`'s second lease was its last: when it runs out, the job is not handed out again
        // but failed by the reaper.
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(q.take_now("e3", None).map(|h| h.job_id).is_none_or(|id| id != a), "a went out a third time");
        let failed = q.reap();
        let ids: Vec<_> = failed.iter().map(|f| f.0.job_id.clone()).collect();
        let last = failed.into_iter().find(|f| f.0.job_id == a).unwrap_or_else(|| panic!("a not failed: {ids:?}"));
        assert_eq!((last.0.holder.as_deref(), last.0.held_ms), (Some("e2"), Some(11_000)), "its last holder");
    }

    /// The open jobs of an invoker are counted as they come and go (the count used to walk every
    /// job at each asynchronous call): finished, cancelled, taken to be recorded as cancelled, or
    /// failed when their last lease ran out.
    #[tokio::test(start_paused = true)]
    async fn an_invokers_open_jobs_are_counted_as_they_come_and_go() {
        let q = queue();
        let direct = |n: u32, who: &str| {
            let id = q.new_id();
            let rx = q.enqueue_direct(id.clone(), "default".into(), token(), who.into());
            assert_eq!(q.open_jobs_of(who), n as usize, "after queueing {id}");
            (id, rx)
        };
        let (a, _ra) = direct(1, "p1");
        let (b, _rb) = direct(2, "p1");
        let (c, _rc) = direct(3, "p1");
        let (d, _rd) = direct(4, "p1");
        let (_e, _re) = direct(1, "p2");
        let (_, _anonymous) = q.enqueue("default".into(), token());
        assert_eq!((q.open_jobs_of("p1"), q.open_jobs_of("p2"), q.open_jobs_of("nobody")), (4, 1, 0));
        let h = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
        assert_eq!(h.job_id, a);
        q.complete("e1", &a, &h.lease_id).unwrap();
        assert_eq!(q.open_jobs_of("p1"), 3, "finished");
        assert!(q.cancel(&b));
        assert!(!q.cancel(&b), "cancelled twice");
        assert_eq!(q.open_jobs_of("p1"), 2, "cancelled");
        assert!(q.take_cancelled(&c).is_some());
        assert_eq!(q.open_jobs_of("p1"), 1, "taken to be recorded as cancelled");
        // `d`'s two leases run out: it fails, and is no longer open.
        for _ in 0..2 {
            let h = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
            assert_eq!(h.job_id, d);
            tokio::time::advance(Duration::from_secs(11)).await;
            q.reap();
        }
        assert_eq!((q.open_jobs_of("p1"), q.open_jobs_of("p2")), (0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_call_makes_no_executor_known_and_a_known_one_is_seen_alive() {
        let q = queue();
        let names = |q: &MemoryQueue| q.executors().into_iter().map(|e| e.name).collect::<Vec<_>>();
        // Calls about jobs that are not theirs, under names nobody polled with.
        for n in 0..50 {
            let ghost = format!("ghost-{n}");
            assert_eq!(q.heartbeat(&ghost, "nope", "x"), Err(LeaseError::UnknownJob));
            assert_eq!(q.release(&ghost, "nope", "x"), Err(LeaseError::UnknownJob));
            assert!(q.complete(&ghost, "nope", "x").is_err());
        }
        assert_eq!(names(&q), Vec::<String>::new(), "refused calls listed executors");
        let (id, _rx) = q.enqueue("default".into(), token());
        let h = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
        assert_eq!(q.heartbeat("ghost", &id, &h.lease_id), Err(LeaseError::NotHolder));
        assert_eq!(names(&q), ["e1"], "a name that does not hold the lease was listed");
        // A known executor's refused call is still a sign of life.
        tokio::time::advance(Duration::from_secs(61)).await;
        // Its lease long ended, as the reaper finds (a held lease would keep it busy).
        q.reap();
        assert_eq!(q.executors()[0].state, "gone");
        assert_eq!(q.heartbeat("e1", "nope", "x"), Err(LeaseError::UnknownJob));
        assert_ne!(q.executors()[0].state, "gone");
    }

    #[tokio::test(start_paused = true)]
    async fn an_executor_gone_for_a_day_leaves_the_list() {
        let q = queue();
        assert!(q.poll("e1", None, Duration::from_millis(10)).await.is_none());
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(q.poll("e2", None, Duration::from_millis(10)).await.is_none());
        tokio::time::advance(FORGET_EXECUTOR_AFTER - Duration::from_secs(3600 + 60)).await;
        q.reap();
        let names = |q: &MemoryQueue| q.executors().into_iter().map(|e| (e.name, e.state)).collect::<Vec<_>>();
        assert_eq!(names(&q), [("e1".to_string(), "gone".to_string()), ("e2".into(), "gone".into())]);
        tokio::time::advance(Duration::from_secs(120)).await;
        q.reap();
        assert_eq!(names(&q), [("e2".to_string(), "gone".to_string())], "e1 was gone for a day");
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_taken_off_the_queue_reads_as_running_until_its_result_is_recorded() {
        let q = queue();
        let running = |id: &str| q.open_job(id).map(|o| o.running);
        let (done, _rd) = q.enqueue("default".into(), token());
        let (failing, _rf) = q.enqueue("default".into(), token());
        let a = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
        q.complete("e1", &done, &a.lease_id).unwrap();
        assert_eq!(running(&done), Some(true), "its result is not committed yet");
        q.recorded(&done);
        assert_eq!(running(&done), None);
        for _ in 0..2 {
            q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
            tokio::time::advance(Duration::from_secs(11)).await;
            q.reap();
        }
        assert_eq!(running(&failing), Some(true), "a job failed by the reaper is recorded like any result");
        q.recorded(&failing);
        assert_eq!(running(&failing), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_leases_of_a_dead_instance_end_at_once_and_only_those() {
        let q = queue();
        let (a, _ra) = q.enqueue("default".into(), token());
        let (b, _rb) = q.enqueue("default".into(), token());
        let (c, _rc) = q.enqueue("default".into(), token());
        let dead = q.poll("e1", Some("00000000000000aa"), Duration::from_secs(1)).await.unwrap();
        assert!(dead.lease_id.starts_with("00000000000000aa-") && dead.lease_id.len() == 17 + 32, "{}", dead.lease_id);
        let live = q.poll("e1", Some("00000000000000bb"), Duration::from_secs(1)).await.unwrap();
        // Another executor's process that happens to carry the same instance id keeps its lease.
        let other = q.poll("e2", Some("00000000000000aa"), Duration::from_secs(1)).await.unwrap();
        assert_eq!(
            (dead.job_id.as_str(), live.job_id.as_str(), other.job_id.as_str()),
            (a.as_str(), b.as_str(), c.as_str())
        );
        assert_eq!(q.expire_instances("e1", &["00000000000000aa", "00000000000000dd"]), 1);
        // No time passed: the ended lease is reaped now, and its job handed out again.
        assert!(q.reap().is_empty());
        let again = q.poll("e1", Some("00000000000000cc"), Duration::from_secs(1)).await.unwrap();
        assert_eq!((again.job_id.as_str(), again.attempt), (a.as_str(), 2));
        assert_eq!(q.complete("e1", &a, &dead.lease_id).unwrap_err(), LeaseError::LeaseLost);
        assert!(q.heartbeat("e1", &b, &live.lease_id).is_ok());
        assert!(q.heartbeat("e2", &c, &other.lease_id).is_ok());
        assert_eq!(q.expire_instances("e1", &["00000000000000aa"]), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn released_jobs_go_first_and_executors_are_visible() {
        let q = queue();
        let (a, _ra) = q.enqueue("default".into(), token());
        let (_b, _rb) = q.enqueue("default".into(), token());
        let h = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
        assert_eq!(q.executors()[0].state, "busy");
        q.release("e1", &a, &h.lease_id).unwrap();
        let again = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
        assert_eq!((again.job_id.as_str(), again.attempt), (a.as_str(), 1));
        assert!(q.complete("e1", &a, &again.lease_id).is_ok());
        // Between two polls it is idle; not heard from for longer, silent, then gone.
        assert_eq!(q.executors()[0].state, "idle");
        tokio::time::advance(SILENT_AFTER + Duration::from_millis(1)).await;
        assert_eq!(q.executors()[0].state, "silent");
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(q.executors()[0].state, "gone");
    }

    #[tokio::test(start_paused = true)]
    async fn an_executor_that_said_it_stopped_is_listed_stopped_and_serves_no_more() {
        let q = queue();
        let state =
            |q: &MemoryQueue| q.executors().iter().map(|e| (e.name.clone(), e.state.clone())).collect::<Vec<_>>();
        let (a, _ra) = q.enqueue("default".into(), token());
        let h = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
        assert!(q.poll("e2", None, Duration::from_millis(1)).await.is_none());
        q.stopped("e0");
        assert_eq!(
            state(&q),
            [("e1".into(), "busy".into()), ("e2".into(), "idle".into())],
            "one never seen is not noted"
        );
        q.stopped("e2");
        assert!(q.serving(), "e1 holds a job");
        // One that holds a job is listed busy, whatever it said (another process of the same name).
        q.stopped("e1");
        assert_eq!(state(&q), [("e1".into(), "busy".into()), ("e2".into(), "stopped".into())]);
        assert!(q.serving(), "another process of e1 runs its job, and will poll after");
        q.complete("e1", &a, &h.lease_id).unwrap();
        assert_eq!(state(&q)[0].1, "idle", "heard from again");
        assert!(q.serving());
        q.stopped("e1");
        assert!(!q.serving(), "neither polls nor holds a job, and both said they stopped");
        // Stopped stays stopped (not silent, not gone) until it is forgotten.
        tokio::time::advance(Duration::from_secs(120)).await;
        assert_eq!(state(&q)[1].1, "stopped");
        // A poll open when the goodbye came keeps the executor listed polling and serving; its
        // end does not undo the goodbye, a new request does.
        let polling = q.poll("e2", None, Duration::from_secs(5));
        tokio::pin!(polling);
        assert!(tokio::time::timeout(Duration::from_millis(1), polling.as_mut()).await.is_err(), "no job");
        q.stopped("e2");
        assert_eq!(state(&q)[1].1, "polling");
        assert!(polling.await.is_none());
        assert_eq!(state(&q)[1].1, "stopped");
        assert!(q.take_now("e2", None).is_none());
        assert_eq!(state(&q)[1].1, "idle");
    }

    #[tokio::test(start_paused = true)]
    async fn another_executor_cannot_heartbeat_release_or_finish_a_job_even_with_its_lease_id() {
        let q = queue();
        let (id, mut rx) = q.enqueue("default".into(), token());
        let a = q.poll("exec-a", None, Duration::from_secs(1)).await.unwrap();
        for wrong in [a.lease_id.as_str(), "00000000000000000000000000000000"] {
            let expected = if wrong == a.lease_id { LeaseError::NotHolder } else { LeaseError::LeaseLost };
            assert_eq!(q.heartbeat("exec-b", &id, wrong), Err(expected.clone()));
            assert_eq!(q.release("exec-b", &id, wrong), Err(expected.clone()));
            assert_eq!(q.complete("exec-b", &id, wrong).unwrap_err(), expected);
        }
        // A display name under another credential is another executor too.
        assert_eq!(q.heartbeat("exec-b/exec-a", &id, &a.lease_id), Err(LeaseError::NotHolder));
        // Nothing changed: the job is still A's, not queued again, and A's result is taken.
        assert_eq!(q.queued_len(), 0);
        let a_view = q.executors().into_iter().find(|e| e.name == "exec-a").unwrap();
        assert_eq!(a_view.jobs, vec![id.clone()]);
        assert!(rx.try_recv().is_err(), "the waiter heard nothing");
        assert_eq!(q.heartbeat("exec-a", &id, &a.lease_id), Ok(Duration::from_secs(10)));
        let finished = q.complete("exec-a", &id, &a.lease_id).unwrap();
        assert_eq!((finished.job_id.as_str(), finished.attempt), (id.as_str(), 1));
    }

    #[tokio::test(start_paused = true)]
    async fn lease_ids_are_128_random_bits_and_differ_between_jobs() {
        let q = queue();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            let (_id, _rx) = q.enqueue("default".into(), token());
            let h = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
            assert_eq!(h.lease_id.len(), 32, "{}", h.lease_id);
            assert!(h.lease_id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{}", h.lease_id);
            assert!(!h.lease_id.contains(&h.job_id) && !h.job_id.contains(&h.lease_id));
            assert!(seen.insert(h.lease_id.clone()), "lease id {} given twice", h.lease_id);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_job_carrying_secrets_is_handed_out_sealed() {
        let q = queue();
        q.enqueue_for("default".into(), token(), None, vec!["s3cret".into()]);
        q.enqueue("default".into(), token());
        let first = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
        let second = q.poll("e1", None, Duration::from_secs(1)).await.unwrap();
        assert_eq!((first.sealed, second.sealed), (true, false));
    }
}

/// Limits of command dispatch; configurable on the master.
#[derive(Debug, Clone, Copy)]
pub struct DispatchConfig {
    /// Output above this many bytes goes to the blob store; the result keeps a preview.
    pub inline_output_bytes: usize,
    pub default_timeout_ms: u64,
    pub max_timeout_ms: u64,
    /// How long an invocation waits for an executor beyond its own timeout.
    pub queue_grace: Duration,
    /// How long an invocation waits for an executor to appear when none serves the queue.
    pub no_executor_grace: Duration,
    /// How long a job whose caller waits for its result runs before it is stored (one that
    /// ends sooner is never written to the job store).
    pub store_after: Duration,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            inline_output_bytes: 128 * 1024,
            default_timeout_ms: 120_000,
            max_timeout_ms: 600_000,
            queue_grace: Duration::from_secs(30),
            no_executor_grace: Duration::from_secs(10),
            store_after: Duration::from_millis(100),
        }
    }
}

/// The job store of direct invocations, written in order by one task: a job's removal can
/// never overtake its storing.
pub(crate) struct DurableJobs {
    pub(crate) writes: tokio::sync::mpsc::UnboundedSender<StoreWrite>,
    /// Waited-for jobs not stored (yet; see `script::result_storing_late`). Whoever takes a
    /// job out of here decides, under this lock, whether it is stored: the caller's wait when
    /// `store_after` is up (it sends the put), or whoever ends the job first (then it never
    /// is). So a job's put, when there is one, is on the channel before its removal.
    pub(crate) unstored: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl DurableJobs {
    /// Takes a job out of the not-stored set: true when it was there (never stored).
    pub(crate) fn take_unstored(&self, job_id: &str) -> bool {
        self.unstored.lock().unwrap_or_else(|e| e.into_inner()).remove(job_id)
    }
}

/// One write to the job store of direct invocations.
pub(crate) enum StoreWrite {
    /// Store a job; the sender hears when it is durable (or why not).
    Put(agentos_store::StoredJob, tokio::sync::oneshot::Sender<Result<(), agentos_store::StoreError>>),
    /// Remove a job whose result is in the log: it may wait for the next put's transaction,
    /// since one lost in a crash is dropped at the next start.
    Forget(String),
    /// Remove a job that has no result (nobody waits for it any more): at once, since one lost
    /// in a crash would run again at the next start.
    ForgetNow(String),
}

/// The blob namespace of job output that is too large to inline; the model follows.
pub const OUTPUT_NAMESPACE: &str = "job-output";
