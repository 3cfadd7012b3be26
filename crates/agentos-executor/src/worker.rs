//! The executor process: K workers, each running one job at a time (long-polling for it, or
//! holding it ahead while the queue is busy), with a heartbeat per running job and a two-step
//! stop (finish what runs within a grace period, hand back the rest).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentos_core::job::{ExecutorResult, LeasedJob};

use crate::cache::ScriptCache;
use crate::cgroup::JobCgroups;
use crate::folders::Folders;
use crate::job::{Ended, JobLimits, execute};
use crate::protocol::{Master, ProtocolError};
use crate::sealed::{Sealed, SealedPolicy};

#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    pub master: String,
    pub token: String,
    pub workspace: PathBuf,
    pub name: Option<String>,
    pub concurrency: usize,
    pub limits: JobLimits,
    /// How long a stopping executor lets running jobs finish before it kills and hands them back.
    pub grace: Duration,
    /// How long one poll may be held by the master.
    pub poll_wait: Duration,
    /// Reach a master in this same process directly rather than over HTTP to `master`.
    pub direct: Option<crate::protocol::Direct>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error("cannot prepare the workspace {path}: {source}")]
    Workspace { path: PathBuf, source: std::io::Error },
    #[error("the master refused this executor's credential: {0}")]
    Credential(String),
    #[error(
        "scripts run as uid {uid} but could not reach the workspace {path}: {why}; choose a --workspace under a folder others may enter, or --run-as current"
    )]
    Unreachable { path: PathBuf, uid: u32, why: String },
    #[error("the workspace {path} is not safe to use: {why}")]
    UnsafeWorkspace { path: PathBuf, why: String },
    #[error("sealed uids: {0}")]
    Sealed(String),
}

/// Checks that sealed uids can be used here: the executor is root (only root changes user), and
/// the range holds neither its own uid nor the one other scripts run as (the end-of-job kill of
/// a sealed uid would kill those too).
fn check_sealed(policy: &SealedPolicy, run_as: Option<(u32, u32)>) -> Result<(), ExecutorError> {
    let SealedPolicy::Uids(range) = policy else { return Ok(()) };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if me != 0 {
        return Err(ExecutorError::Sealed(format!(
            "{}-{} need an executor running as root (this one runs as uid {me}); without root, start it with --run-as current to run sealed jobs as its own user",
            range.start(),
            range.end()
        )));
    }
    for (uid, who) in [(Some(me), "the executor's own uid"), (run_as.map(|r| r.0), "the uid scripts run as")] {
        if let Some(uid) = uid.filter(|u| range.contains(u)) {
            return Err(ExecutorError::Sealed(format!(
                "{}-{} holds {uid}, {who}: choose a range that holds neither",
                range.start(),
                range.end()
            )));
        }
    }
    Ok(())
}

/// Why `workspace` is not safe for an executor of this user, if it is not: it, or a folder above
/// it, could be replaced or filled by another user, and the executor (root, often) would then
/// change the mode of, and write into, whatever that user pointed it at.
///
/// - Every folder on the path must belong to root or to this user, and may be written by others
///   only with the sticky bit (as `/tmp`), where nobody renames what is not theirs.
/// - A link on the path must belong to root or to this user: `ln -s /root /tmp/agentos-executor`
///   by anyone else is refused.
/// - The workspace itself, if it exists, must belong to this user and must not be writable by
///   every user: one such as `/tmp` is refused rather than having its mode changed.
///
/// Folders not made yet are not checked: the executor makes them itself (0755).
pub fn workspace_unsafe(workspace: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let trusted = |uid: u32| uid == 0 || uid == me;
    let absolute = match std::path::absolute(workspace) {
        Ok(a) => a,
        Err(e) => return Some(e.to_string()),
    };
    // The path as given: links on it.
    let mut at = PathBuf::new();
    for part in absolute.components() {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() && !trusted(m.uid()) => {
                return Some(format!(
                    "{} is a link that uid {} owns and may point anywhere; give a path without links others own",
                    at.display(),
                    m.uid()
                ));
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    // The folders it leads to: above the workspace, or above where it will be made.
    let existing = absolute.ancestors().find(|a| a.exists())?;
    let Ok(real) = std::fs::canonicalize(existing) else { return None };
    let made_here = existing != absolute.as_path();
    for dir in real.ancestors().skip(usize::from(!made_here)) {
        let Ok(m) = std::fs::metadata(dir) else { continue };
        let mode = m.mode() & 0o7777;
        if !trusted(m.uid()) {
            return Some(format!(
                "{} above it belongs to uid {}, who could replace the workspace with a link; give a folder whose parents only root or this user own",
                dir.display(),
                m.uid()
            ));
        }
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Some(format!(
                "{} above it (mode {mode:o}) may be written by other users, who could replace the workspace with a link; give a folder whose parents only root or this user may write",
                dir.display()
            ));
        }
    }
    if made_here {
        return None;
    }
    let m = match std::fs::metadata(&real) {
        Ok(m) => m,
        Err(e) => return Some(e.to_string()),
    };
    let mode = m.mode() & 0o7777;
    if !m.is_dir() {
        Some("it is not a folder; give a folder, or a path where one can be made".into())
    } else if m.uid() != me {
        Some(format!(
            "it belongs to uid {}, not to this executor's uid {me}, who could put links and files where the executor keeps scripts and job folders; give a folder this user owns",
            m.uid()
        ))
    } else if mode & 0o002 != 0 {
        Some(format!(
            "it (mode {mode:o}) may be written by every user, who could put links and files where the executor keeps scripts and job folders; give a folder of its own, e.g. {}",
            real.join("agentos-executor").display()
        ))
    } else {
        None
    }
}

/// Makes the workspace usable by the user scripts run as: its own folders open to enter
/// (never to write: each job gets a folder of its own), every folder above enterable. The
/// script cache may be entered but not listed: a script reaches its own file by its digest,
/// and does not learn which scripts of other models this executor has run.
fn prepare_for_user(workspace: &std::path::Path, uid: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    for (dir, mode) in [
        (workspace.to_path_buf(), 0o755),
        (workspace.join("jobs"), 0o755),
        (workspace.join("scripts"), 0o711),
        (workspace.join("scripts/sha256"), 0o711),
    ] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    workspace_reachable(workspace, uid)
}

/// Whether user `uid` may enter every folder above `workspace` (which need not exist yet).
pub fn workspace_reachable(workspace: &std::path::Path, uid: u32) -> Result<(), String> {
    match folders_closed_to(workspace, uid)?.last() {
        Some((dir, mode)) => Err(format!("{} (mode {mode:o}) may not be entered by others", dir.display())),
        None => Ok(()),
    }
}

/// The folders above `workspace` that user `uid` may not enter, outermost last, with their
/// modes: what `chmod o+x` would have to open for scripts of that user to reach it.
pub fn folders_closed_to(workspace: &std::path::Path, uid: u32) -> Result<Vec<(PathBuf, u32)>, String> {
    use std::os::unix::fs::MetadataExt;
    let absolute = std::path::absolute(workspace).map_err(|e| format!("{}: {e}", workspace.display()))?;
    let mut closed = Vec::new();
    for dir in absolute.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else { continue };
        if meta.uid() != uid && meta.mode() & 0o001 == 0 {
            closed.push((dir.to_path_buf(), meta.mode() & 0o777));
        }
    }
    Ok(closed)
}

/// Marks this process non-dumpable, so that a script running as the same user cannot read
/// its environment or memory through /proc (where the credential lives).
pub fn forbid_inspection() {
    // SAFETY: prctl with PR_SET_DUMPABLE only changes a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

struct Shared {
    master: Master,
    cache: ScriptCache,
    folders: Folders,
    sealed: Arc<Sealed>,
    /// `None`: this machine gives the executor no cgroups, and a script's detached processes
    /// can outlive their job and the executor (warned about at start).
    cgroups: Option<JobCgroups>,
    limits: JobLimits,
}

/// Runs until `shutdown` resolves, then stops in two steps.
pub async fn run(config: ExecutorConfig, shutdown: impl Future<Output = ()>) -> Result<(), ExecutorError> {
    let ws_err = |e| ExecutorError::Workspace { path: config.workspace.clone(), source: e };
    let unsafe_ws = |path: &std::path::Path| match workspace_unsafe(path) {
        Some(why) => Err(ExecutorError::UnsafeWorkspace { path: path.to_path_buf(), why }),
        None => Ok(()),
    };
    // Checked before anything is made in it, and again once it exists; folders made here are 0755
    // whatever the umask, so none of them opens the path to others.
    unsafe_ws(&config.workspace)?;
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o755).create(&config.workspace).map_err(ws_err)?;
    }
    // Scripts run in their own folders, so every path handed to them must be absolute.
    let workspace = std::fs::canonicalize(&config.workspace).map_err(ws_err)?;
    unsafe_ws(&workspace)?;
    let jobs_dir = workspace.join("jobs");
    std::fs::create_dir_all(&jobs_dir).map_err(ws_err)?;
    std::fs::create_dir_all(workspace.join("scripts/sha256")).map_err(ws_err)?;
    check_sealed(&config.limits.sealed, config.limits.run_as)?;
    let sealed_uid = match &config.limits.sealed {
        SealedPolicy::Uids(range) => Some(*range.start()),
        _ => None,
    };
    // Sealed uids are not the owner of anything above their folders, like any other user: one
    // of them stands for all.
    for uid in config.limits.run_as.map(|r| r.0).into_iter().chain(sealed_uid) {
        prepare_for_user(&workspace, uid).map_err(|why| ExecutorError::Unreachable {
            path: workspace.clone(),
            uid,
            why,
        })?;
    }
    forbid_inspection();
    let sealed = Sealed::new(config.limits.sealed.clone());
    // A predecessor killed mid-job leaves processes under sealed uids; none may meet a new job.
    let left = sealed.sweep();
    if left > 0 {
        tracing::error!(left, "processes under sealed uids survived the start-up sweep");
    }
    let sh =
        crate::runner::find_program("sh", &config.limits.path).unwrap_or_else(|| std::path::PathBuf::from("/bin/sh"));
    let cgroups = match JobCgroups::open() {
        Ok(mut c) => match c.start_guard(&sh) {
            Ok(()) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the job guard: scripts would outlive a killed executor; running jobs without cgroups");
                c.close();
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "jobs run without a cgroup of their own: processes a script detaches (setsid) can outlive their job, and every script outlives an executor that is killed; run the executor as root where cgroup v2 is writable");
            None
        }
    };
    // Jobs a predecessor killed on this workspace still held go back to the queue at once.
    // A master's own executor (`agentos up`) gets a new credential at every start, so its
    // identity is not the credential: it is the one executor of that master, whose workspace
    // no other master shares.
    let credential = if config.direct.is_some() { "" } else { config.token.as_str() };
    let mut claim = crate::instance::claim(&workspace, &crate::instance::identity(credential, config.name.as_deref()))
        .map_err(ws_err)?;
    if !claim.replaces.is_empty() {
        tracing::info!(predecessors = ?claim.replaces, "executors died on this workspace: the jobs they held are handed back");
    }
    let shared = Arc::new(Shared {
        master: match &config.direct {
            Some(direct) => Master::over(direct.0.clone(), config.name.clone()),
            None => Master::new(&config.master, &config.token, config.name.clone()),
        }
        .with_instance(
            claim.instance.clone(),
            std::mem::take(&mut claim.replaces),
            std::mem::take(&mut claim.heard),
        ),
        cache: ScriptCache::new(&workspace),
        folders: {
            let folders = Folders::new(&jobs_dir, config.limits.run_as);
            folders.sweep();
            folders
        },
        sealed,
        cgroups,
        limits: config.limits.clone(),
    });
    // Stop taking work, then (after the grace period) stop running work.
    let stop_polling = CancellationToken::new();
    let kill_running = CancellationToken::new();
    let (fatal_tx, mut fatal_rx) = tokio::sync::mpsc::channel::<String>(1);
    let mut workers = tokio::task::JoinSet::new();
    for slot in 0..config.concurrency.clamp(1, usize::from(u16::MAX) + 1) {
        let (shared, stop, kill, fatal) =
            (shared.clone(), stop_polling.clone(), kill_running.clone(), fatal_tx.clone());
        let wait = config.poll_wait;
        let slot = slot as u16;
        workers.spawn(async move { worker(shared, stop, kill, fatal, wait, slot).await });
    }
    drop(fatal_tx);
    tracing::info!(master = %shared.master.describe(), concurrency = config.concurrency, "executor polling");
    let fatal = tokio::select! {
        _ = shutdown => None,
        Some(why) = fatal_rx.recv() => Some(why),
    };
    stop_polling.cancel();
    shared.sealed.stop_waiting();
    let grace = tokio::time::sleep(config.grace);
    tokio::pin!(grace);
    loop {
        tokio::select! {
            joined = workers.join_next() => {
                if joined.is_none() { break; }
            }
            _ = &mut grace, if !kill_running.is_cancelled() => {
                tracing::warn!("grace period over: killing running jobs and handing them back");
                kill_running.cancel();
            }
        }
    }
    // Every job was finished or handed back: said to the master, which lists this executor
    // `stopped` rather than, after a while, `silent` as a killed one. A refused credential has
    // nothing to say it with.
    if fatal.is_none() {
        match shared.master.stopped().await {
            Ok(()) => {}
            // A master from before the goodbye: it lists the executor silent, then gone.
            Err(ProtocolError::Refused { status: 404 | 405, .. }) => {}
            Err(e) => tracing::warn!(error = %e, "telling the master this executor stopped failed"),
        }
    }
    // Every worker has ended, so `shared` is the last reference.
    if let Some(cgroups) = Arc::into_inner(shared).and_then(|s| s.cgroups) {
        tokio::task::spawn_blocking(move || cgroups.close()).await.ok();
    }
    // Every job was finished or handed back: nothing for a successor to name.
    claim.release();
    match fatal {
        Some(why) => Err(ExecutorError::Credential(why)),
        None => Ok(()),
    }
}

/// How long a stopping executor waits for the answer of a poll already under way.
const IN_FLIGHT_POLL: Duration = Duration::from_millis(500);

/// How long a job handed to a worker ahead of time may wait behind the job that worker runs.
/// When the running job outlasts it, the job ahead goes back to the queue, where a free worker
/// takes it at once, and the worker takes no job ahead until one of its jobs ends within this
/// time again. Jobs of a millisecond or two gain from a job ahead; longer ones gain nothing.
pub const AHEAD_HOLD: Duration = Duration::from_millis(10);

/// How long a finished job's result waits for the answer to a request under way before it is
/// posted anyway.
const SETTLE_WAIT: Duration = Duration::from_millis(100);

/// What a request that may bring a job brought: the job, and whether its answer was lost (the
/// master may have handed a job out in it).
type Brought = (Option<LeasedJob>, bool);

/// A request under way that may bring the worker its next job: a result posted with `next`,
/// or a poll that asks for a job ahead without waiting.
type Pending = tokio::task::JoinHandle<Brought>;

async fn settle(pending: Pending) -> Brought {
    pending.await.unwrap_or_else(|e| {
        tracing::error!(error = %e, "a request for the next job ended abnormally");
        (None, true)
    })
}

async fn hand_back(shared: &Shared, job: &LeasedJob) {
    if let Err(e) = shared.master.release(&job.job_id, &job.lease_id).await {
        tracing::warn!(job = %job.job_id, error = %e, "handing the job back failed; its lease will expire");
    }
}

/// One worker: runs one job at a time. While the queue is busy it holds the next job ahead of
/// time, handed out with the last result's answer, so that no time passes between one job's
/// end and the next one's start (see [`AHEAD_HOLD`]).
async fn worker(
    shared: Arc<Shared>,
    stop: CancellationToken,
    kill: CancellationToken,
    fatal: tokio::sync::mpsc::Sender<String>,
    wait: Duration,
    slot: u16,
) {
    let mut backoff = Duration::from_millis(100);
    // The job to run next: handed over with a result, ahead of time, or by a poll.
    let mut ready: Option<LeasedJob> = None;
    // The request under way that may bring one.
    let mut pending: Option<Pending> = None;
    // The job to run came from a busy queue (with a result, or ahead): one more is asked for
    // ahead while it runs.
    let mut busy = false;
    // The worker takes jobs ahead: until one goes back behind a job that ran on, and again
    // once a job ends within the hold.
    let mut ahead = true;
    // The last request that could have brought a job got no answer: the master may have handed
    // one out in it, leased to this worker, which the next poll hands back.
    let mut reclaim = false;
    loop {
        if stop.is_cancelled() {
            // Stopping: no new work is taken, and a job already handed over goes straight back.
            // A request under way is let finish (it may be a result); a job it brings goes back.
            if let Some(job) = ready.take() {
                hand_back(&shared, &job).await;
            }
            if let Some(p) = pending.take() {
                let (job, lost) = settle(p).await;
                reclaim |= lost;
                if let Some(job) = job {
                    hand_back(&shared, &job).await;
                }
            }
            if reclaim {
                // A job handed out in an answer that was lost would wait out its lease: one
                // last poll, without a wait, ends that lease, and what it brings goes back.
                if let Ok(Some(job)) = shared.master.poll(Duration::ZERO, slot, true).await {
                    hand_back(&shared, &job).await;
                }
            }
            return;
        }
        if ready.is_none()
            && let Some(p) = pending.take()
        {
            let (job, lost) = settle(p).await;
            reclaim |= lost;
            busy = job.is_some();
            ready = job;
            continue;
        }
        if let Some(job) = ready.take() {
            // A request whose answer was lost may have brought a job, leased to this worker: it
            // goes back with the next long poll, which the worker makes once it holds nothing,
            // so no more jobs are taken until then.
            if busy && ahead && !reclaim && pending.is_none() {
                // The queue had work a moment ago: ask for the job after this one now, without
                // waiting, so that it is here when this one ends.
                let shared = shared.clone();
                pending = Some(tokio::spawn(async move {
                    match shared.master.poll_ahead(slot).await {
                        Ok(job) => (job, false),
                        Err(e) => (None, e.answer_lost()),
                    }
                }));
            }
            let ran = run_one(&shared, job, &kill, &mut pending).await;
            reclaim |= ran.lost;
            ahead = !ran.held_back && (ahead || ran.within_hold);
            ready = ran.ahead;
            busy = ready.is_some();
            let Some(post) = ran.post else { continue };
            let take_next = !stop.is_cancelled() && !reclaim;
            if ready.is_some() {
                // Posted while the job ahead runs, asking for the one after it. (A job ahead
                // comes only in the answer to the request under way, so none is left.)
                debug_assert!(pending.is_none(), "a job ahead while a request is under way");
                let take_next = take_next && ahead;
                let shared = shared.clone();
                pending = Some(tokio::spawn(async move { post_result(&shared, post, take_next, slot).await }));
            } else {
                // Nothing to run meanwhile: the answer is waited for here, and the next job is
                // asked for with the result, unless a request under way (the last result's
                // post, still retrying) may bring one.
                let (job, lost) = post_result(&shared, post, take_next && pending.is_none(), slot).await;
                reclaim |= lost;
                busy = job.is_some();
                ready = job;
            }
            continue;
        }
        let poll = shared.master.poll(wait, slot, reclaim);
        tokio::pin!(poll);
        let polled = tokio::select! {
            r = &mut poll => r,
            _ = stop.cancelled() => {
                // The master may have handed a job out just before the stop, its answer on the
                // way: dropping the poll would strand that job until its lease expired. An
                // answer that comes at once is taken (and its job run, within the grace);
                // an idle long poll is let go.
                match tokio::time::timeout(IN_FLIGHT_POLL, &mut poll).await {
                    Ok(r) => r,
                    Err(_) => return,
                }
            }
        };
        if polled.is_ok() {
            reclaim = false;
        }
        match polled {
            Ok(Some(job)) => {
                backoff = Duration::from_millis(100);
                if stop.is_cancelled() {
                    // Taken at the stop: it runs (within the grace), as the stop says above.
                    let ran = run_one(&shared, job, &kill, &mut None).await;
                    if let Some(post) = ran.post {
                        post_result(&shared, post, false, slot).await;
                    }
                    return;
                }
                busy = false;
                ready = Some(job);
            }
            Ok(None) => backoff = Duration::from_millis(100),
            Err(ProtocolError::Refused { status: 401 | 403, message }) => {
                let _ = fatal.send(message).await;
                return;
            }
            Err(e) => {
                // The master is away (restarting, say): retry with a bounded backoff, never a busy
                // loop. A poll that reached it may have been handed a job whose answer was lost
                // (no answer, a proxy's 502 or 504, or one that cannot be read).
                reclaim |= e.answer_lost();
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "poll failed");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// A job's result, to be posted.
struct Post {
    job_id: String,
    result: ExecutorResult,
    max_result_bytes: Option<u64>,
    /// The job's lease: how long its result may still be taken after the job ended.
    lease_ms: u64,
}

/// How one job went.
struct Ran {
    /// Its result, unless the job was handed back or its lease lost.
    post: Option<Post>,
    /// The job handed over ahead of time while it ran, kept.
    ahead: Option<LeasedJob>,
    /// It ended within [`AHEAD_HOLD`] of starting.
    within_hold: bool,
    /// It ran on past the hold, and the job ahead went back to the queue.
    held_back: bool,
    /// A request that could have brought a job got no answer.
    lost: bool,
}

/// Runs one job. `pending`, a request for the next job under way, is settled if it ends while
/// the job runs: the job it brings is kept ahead of time while the job ends within
/// [`AHEAD_HOLD`] of its arrival, and handed back to the queue otherwise.
async fn run_one(shared: &Shared, job: LeasedJob, kill: &CancellationToken, pending: &mut Option<Pending>) -> Ran {
    let lease_lost = CancellationToken::new();
    // Stopped by the executor's kill, or by a lost lease.
    let cancel = kill.child_token();
    // The heartbeat renews the lease at a third of its length; a lost lease stops the run. It
    // runs beside the job in this task and never ends by itself.
    let heartbeat = async {
        let every = Duration::from_millis((job.lease_ms / 3).max(50));
        loop {
            tokio::time::sleep(every).await;
            match shared.master.heartbeat(&job.job_id, &job.lease_id).await {
                Ok(()) => {}
                Err(e) if e.lease_lost() => {
                    tracing::warn!(job = %job.job_id, error = %e, "lease lost; stopping the job");
                    lease_lost.cancel();
                    cancel.cancel();
                    return std::future::pending::<()>().await;
                }
                Err(e) => tracing::warn!(job = %job.job_id, error = %e, "heartbeat failed"),
            }
        }
    };
    let started = tokio::time::Instant::now();
    let execution =
        execute(&job, &shared.cache, &shared.folders, &shared.sealed, shared.cgroups.as_ref(), &shared.limits, &cancel);
    tokio::pin!(execution, heartbeat);
    let (mut ahead, mut lost, mut held_back) = (None::<(LeasedJob, tokio::time::Instant)>, false, false);
    let result = loop {
        let hold_over = ahead.as_ref().map(|(_, since)| *since + AHEAD_HOLD);
        tokio::select! {
            r = &mut execution => break r,
            _ = &mut heartbeat => unreachable!("the heartbeat never ends"),
            brought = async { pending.as_mut().expect("checked").await }, if pending.is_some() => {
                *pending = None;
                let (job, answer_lost) = brought.unwrap_or((None, true));
                lost |= answer_lost;
                ahead = job.map(|j| (j, tokio::time::Instant::now()));
            }
            _ = tokio::time::sleep_until(hold_over.unwrap_or(started)), if hold_over.is_some() => {
                // This job runs on: the one ahead goes to a worker that is free.
                let (back, _) = ahead.take().expect("checked");
                hand_back(shared, &back).await;
                held_back = true;
            }
        }
    };
    let within_hold = started.elapsed() < AHEAD_HOLD;
    // A request still under way is waited for a moment: its answer is near, and may bring the
    // job to run next, after which this result asks for the one after. One that takes longer
    // (a post retrying while its master restarts) goes on, and this result is posted meanwhile:
    // its lease, no longer renewed, does not wait on the other's retries.
    if let Some(p) = pending.as_mut()
        && let Ok(brought) = tokio::time::timeout(SETTLE_WAIT, p).await
    {
        *pending = None;
        let (job, answer_lost) = brought.unwrap_or((None, true));
        lost |= answer_lost;
        ahead = job.map(|j| (j, tokio::time::Instant::now()));
    }
    let ahead = ahead.map(|(j, _)| j);
    let ran = |post| Ran { post, ahead, within_hold, held_back, lost };
    if lease_lost.is_cancelled() {
        return ran(None);
    }
    // Stopped by the executor before it ended, or before it started (waiting for a sealed uid
    // when the executor stopped taking work): it goes back to the queue, to run elsewhere.
    let (result, ended) = result;
    if (kill.is_cancelled() && ended == Ended::Stopped) || ended == Ended::StoppedWaiting {
        hand_back(shared, &job).await;
        return ran(None);
    }
    ran(Some(Post {
        job_id: job.job_id.clone(),
        result,
        max_result_bytes: job.max_result_bytes,
        lease_ms: job.lease_ms,
    }))
}

/// Posts a job's result. With `take_next`, the answer may carry the next job, which is returned;
/// also whether a post that asked for one got no answer (the next poll then hands back a job
/// the master may have handed out in it).
async fn post_result(shared: &Shared, post: Post, take_next: bool, slot: u16) -> Brought {
    let Post { job_id, result, max_result_bytes, lease_ms } = post;
    let (mut result, mut dropped) = (result, false);
    // A master that says its limit is spared a post it would refuse: a refusal of a body of
    // megabytes often arrives as a reset connection rather than as its 413.
    if let Some(max) = max_result_bytes
        && let Some(size) = too_large(&result, max)
    {
        let why = format!("the result would be {size} bytes, above the master's --max-result-bytes ({max})");
        tracing::warn!(job = %job_id, %why, "posting the result without its output");
        result = without_output(result, &why);
        dropped = true;
    }
    // The master may be restarting, or its storage out for a while (a 503): the post is tried
    // again for as long as the lease may hold, after which the job is another executor's. A
    // result dropped sooner ran the job a second time once the storage was back.
    let (mut unanswered, mut refused) = (false, false);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(lease_ms.max(1_000));
    for attempt in 0u32.. {
        // Only the first try asks for the next job: a retry may follow a post the master took.
        let asks = take_next && attempt == 0;
        match shared.master.result(&job_id, &result, asks, slot).await {
            Ok(next) => return (next, false),
            Err(e) if e.lease_lost() && unanswered => {
                // Most likely the post whose answer was lost: the master took the result then.
                tracing::warn!(job = %job_id, error = %e, "the result was taken by an earlier post whose answer was lost, or the job went to another executor");
                return (None, take_next);
            }
            Err(e) if e.lease_lost() => {
                tracing::warn!(job = %job_id, error = %e, "result refused: the job went to another executor");
                return (None, false);
            }
            Err(ProtocolError::Refused { status: 400, message }) if !refused => {
                // The master found the result malformed (a status no process has, say): posted
                // again it would be refused again, and the job would run again once its lease
                // ran out. The caller hears why instead, with nothing of what was refused.
                tracing::warn!(job = %job_id, %message, "the master refused the result: posting why in its place");
                result = refused_result(&result, &message);
                refused = true;
            }
            Err(ProtocolError::Refused { status: 413, message }) if !dropped => {
                // Posted again it would be refused again, and the job would end only when its
                // leases ran out, with a misleading reason: the caller hears this one instead.
                tracing::warn!(job = %job_id, %message, "the result is larger than the master takes: posting it without its output");
                result = without_output(result, &message);
                dropped = true;
            }
            Err(e) => {
                unanswered |= e.answer_lost();
                let wait = Duration::from_millis(200u64 << attempt.min(3));
                if tokio::time::Instant::now() + wait >= deadline {
                    tracing::error!(job = %job_id, error = %e, attempt, "posting the result failed until its lease ran out: the job will run again");
                    break;
                }
                tracing::warn!(job = %job_id, error = %e, attempt, "posting the result failed; trying again");
                tokio::time::sleep(wait).await;
            }
        }
    }
    (None, take_next && unanswered)
}

/// The size of the result's post when it is above `max`. Counted exactly (as JSON) only when
/// the output alone comes near the limit.
fn too_large(result: &ExecutorResult, max: u64) -> Option<u64> {
    let output = (result.stdout_base64.len() + result.stderr_base64.len()) as u64;
    if output + 64 * 1024 < max {
        return None;
    }
    let size = serde_json::to_vec(result).map_or(output, |body| body.len() as u64);
    (size > max).then_some(size)
}

/// A result whose output the master refused as too large, kept to what it can take: the exit
/// status, and why the output is gone.
fn without_output(result: ExecutorResult, refusal: &str) -> ExecutorResult {
    let bytes = result.stdout_base64.len() + result.stderr_base64.len();
    let why = format!(
        "the job ran, but its output ({bytes} bytes in base64) was dropped: {refusal}; raise the master's --max-result-bytes or lower the executor's --max-output-bytes"
    );
    ExecutorResult {
        stdout_base64: String::new(),
        stderr_base64: String::new(),
        output_truncated: true,
        error: Some(match &result.error {
            Some(earlier) => format!("{earlier}; {why}"),
            None => why,
        }),
        ..result
    }
}

/// What is posted in place of a result the master refused as malformed (400): that the job ran,
/// and why its result was not taken.
fn refused_result(result: &ExecutorResult, refusal: &str) -> ExecutorResult {
    ExecutorResult {
        lease_id: result.lease_id.clone(),
        error: Some(format!("the job ran, but the master refused its result: {refusal}")),
        ..Default::default()
    }
}
