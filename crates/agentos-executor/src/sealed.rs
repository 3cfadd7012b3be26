//! Sealed runs: a job that carries a credential runs as a uid that no other job uses while it
//! runs, and whatever is still running under that uid when the job ends is killed before the
//! uid is handed to another job. Scripts of one user can read each other's environment
//! (`/proc/<pid>/environ`) and memory; a uid of its own is what keeps a secret to its job.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How an executor runs jobs that carry credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SealedPolicy {
    /// Each sealed job runs as a uid (and gid of the same number) of this range, one job per uid
    /// at a time. Needs an executor running as root; the uids need no `/etc/passwd` entry.
    Uids(RangeInclusive<u32>),
    /// Sealed jobs run as the executor's own user, as every other job does: the operator chose
    /// `--run-as current`, and accepts that such a job's secret is readable by the other jobs.
    CurrentUser,
    /// Sealed jobs fail: this executor cannot change user and was not told to run them as its own.
    Refuse,
}

/// Why a sealed job cannot run here.
const NEEDS_ROOT: &str = "sealed jobs need an executor running as root with --sealed-uids; this one cannot change user, so the job's credential would be readable by every other job it runs (start it as root, or with --run-as current to accept that)";

/// Why a job waiting for a sealed uid did not start: the executor stopped taking work. Its
/// worker hands such a job back to the queue.
pub(crate) const STOPPED_WAITING: &str =
    "the executor stopped before the script started, while it waited for a sealed uid";

/// Why a sealed job got no uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoUid {
    /// It cannot run here, or its wait was cancelled: the reason is its result.
    Refused(String),
    /// The executor stopped taking work while it waited ([`STOPPED_WAITING`]): it never started,
    /// and its worker hands it back to the queue.
    Stopped(String),
}

impl std::fmt::Display for NoUid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoUid::Refused(why) | NoUid::Stopped(why) => f.write_str(why),
        }
    }
}

/// Rounds of scan-and-kill before a uid is given up on. A fork loop is outrun after a few
/// rounds (a process that was sent SIGKILL forks no more); one stuck in the kernel (state D)
/// may outlast them all, and its uid is then never used again by this executor.
const KILL_ROUNDS: u32 = 50;

/// The sealed uids of one executor: which are free, and the policy.
pub struct Sealed {
    policy: SealedPolicy,
    pool: Mutex<Pool>,
    /// Woken whenever a job's uid comes back or is held back.
    returned: tokio::sync::Notify,
    /// Cancelled when the executor stops taking work: a job still waiting for a uid then goes
    /// back to the queue rather than starting within the grace period.
    stopping: CancellationToken,
    warned: AtomicBool,
}

#[derive(Default)]
struct Pool {
    /// Free uids; the one used longest ago is taken first, so a uid rests between jobs.
    free: std::collections::VecDeque<u32>,
    /// Uids out with a job: each comes back, or is held back, when its job ends.
    taken: usize,
}

/// A uid taken for one sealed job. Dropping it kills every process left under the uid, removes
/// the job's folder if it was given one, and only then returns the uid to the pool: never while
/// any of those processes runs, nor while anything of the folder is left for the next job of
/// the uid to read. Call [`UidLease::release`] or [`UidLease::release_removing`] from async code
/// so the waiting happens off the runtime's thread.
pub struct UidLease {
    pool: Arc<Sealed>,
    uid: u32,
    folder: Option<PathBuf>,
}

impl Sealed {
    pub fn new(policy: SealedPolicy) -> Arc<Sealed> {
        let free = match &policy {
            SealedPolicy::Uids(r) => r.clone().collect(),
            _ => Default::default(),
        };
        Arc::new(Sealed {
            policy,
            pool: Mutex::new(Pool { free, taken: 0 }),
            returned: tokio::sync::Notify::new(),
            stopping: CancellationToken::new(),
            warned: AtomicBool::new(false),
        })
    }

    pub fn policy(&self) -> &SealedPolicy {
        &self.policy
    }

    /// Kills every process running as a uid of the range: the leftovers of a predecessor that
    /// was killed mid-job. Returns how many are still running after the last round.
    pub fn sweep(&self) -> usize {
        let SealedPolicy::Uids(r) = &self.policy else { return 0 };
        let left = kill_users(|uid| r.contains(&uid));
        if left > 0 {
            // Those uids are held back, as after a job whose processes could not be killed.
            let held = live_uids(|uid| r.contains(&uid));
            self.pool().free.retain(|u| !held.contains(u));
        }
        left
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The executor stops taking work: jobs waiting for a uid stop waiting ([`STOPPED_WAITING`]).
    pub fn stop_waiting(&self) {
        self.stopping.cancel();
    }

    /// As [`Sealed::take`], waiting while every uid is out with a running job: one comes back
    /// when that job ends (within its timeout). Fails at once when no uid is out and none is
    /// free (all held back), and when `cancel` fires or the executor stops while it waits (then
    /// with [`STOPPED_WAITING`], and the job goes back to the queue).
    pub async fn take_waiting(self: &Arc<Self>, cancel: &CancellationToken) -> Result<Option<UidLease>, NoUid> {
        loop {
            // Registered before the pool is looked at, so a uid coming back in between wakes it.
            let returned = self.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            match self.take_or_wait() {
                Err((e, true)) => {
                    tokio::select! {
                        _ = returned => {}
                        _ = cancel.cancelled() => {
                            return Err(NoUid::Refused(format!("stopped while waiting for a sealed uid: {e}")));
                        }
                        _ = self.stopping.cancelled() => return Err(NoUid::Stopped(format!("{STOPPED_WAITING}: {e}"))),
                    }
                }
                Err((e, false)) => return Err(NoUid::Refused(e)),
                Ok(taken) => return Ok(taken),
            }
        }
    }

    /// The user a sealed job runs as: `Ok(Some)` a uid of its own, `Ok(None)` the executor's own
    /// user (`--run-as current`, warned about once), `Err` why it cannot run here. Jobs take
    /// theirs with [`Sealed::take_waiting`].
    #[cfg(test)]
    pub(crate) fn take(self: &Arc<Self>) -> Result<Option<UidLease>, String> {
        self.take_or_wait().map_err(|(e, _)| e)
    }

    /// As [`Sealed::take`]; an error says too whether a uid is out with a job, to wait for.
    fn take_or_wait(self: &Arc<Self>) -> Result<Option<UidLease>, (String, bool)> {
        match &self.policy {
            SealedPolicy::Refuse => Err((NEEDS_ROOT.into(), false)),
            SealedPolicy::CurrentUser => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "a sealed job (one carrying a credential) runs as the executor's own user (--run-as current): other jobs of this executor can read its credential; run the executor as root for a uid per sealed job"
                    );
                }
                Ok(None)
            }
            SealedPolicy::Uids(r) => {
                let mut pool = self.pool();
                let Some(uid) = pool.free.pop_front() else {
                    let (start, end, out) = (r.start(), r.end(), pool.taken);
                    let why = if out > 0 {
                        format!(
                            "no sealed uid is free: {out} of {start}-{end} are in use by running jobs, the rest (if any) held back"
                        )
                    } else {
                        format!(
                            "no sealed uid is free: all of {start}-{end} are held back because a process under them could not be killed or their last job's folder could not be removed (the executor's log names which); restart the executor once that is mended"
                        )
                    };
                    return Err((why, out > 0));
                };
                pool.taken += 1;
                Ok(Some(UidLease { pool: self.clone(), uid, folder: None }))
            }
        }
    }
}

impl UidLease {
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Kills what is left under the uid and returns it to the pool, on a blocking thread.
    pub async fn release(self) {
        if let Err(e) = tokio::task::spawn_blocking(move || drop(self)).await {
            tracing::error!(error = %e, "releasing a sealed uid failed");
        }
    }

    /// As [`UidLease::release`], and removes `folder` (the job's, which the uid owns) once nothing
    /// runs under the uid and before the uid goes back.
    pub async fn release_removing(mut self, folder: PathBuf) {
        self.folder = Some(folder);
        self.release().await
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        let uid = self.uid;
        let left = kill_users(|u| u == uid);
        // Removed once nothing of the uid runs: nothing can write in it any more.
        let removed = self.folder.take().map_or(Ok(()), |f| crate::folders::remove_tree(&f).map_err(|e| (e, f)));
        let mut pool = self.pool.pool();
        // Back or held back, it is no longer out: a job waiting for a uid looks again.
        pool.taken -= 1;
        if left == 0 && removed.is_ok() {
            pool.free.push_back(uid);
        } else if let (0, Err((e, folder))) = (left, removed) {
            // What is left of it is the uid's to read: the uid goes to no other job.
            tracing::error!(
                uid,
                folder = %folder.display(),
                error = %e,
                "a sealed job's folder cannot be removed; the uid is held back until the executor restarts"
            );
        } else {
            // A uid with a live process is never handed to another job: that process could read
            // the next job's secret. Held back until the executor restarts (and sweeps).
            tracing::error!(
                uid,
                left,
                "processes of a sealed job survived {KILL_ROUNDS} rounds of SIGKILL; the uid is held back"
            );
        }
        drop(pool);
        self.pool.returned.notify_waiters();
    }
}

/// One process seen in `/proc`: its uids (real, effective, saved, file system) and whether it is
/// dead: a zombie waiting to be reaped, with no other thread left running.
fn status(pid: &str) -> Option<([u32; 4], bool)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut uids = None;
    let mut zombie = false;
    let mut threads = 1;
    for line in text.lines() {
        if let Some(s) = line.strip_prefix("State:") {
            zombie = matches!(s.trim_start().chars().next(), Some('Z' | 'X'));
        } else if let Some(t) = line.strip_prefix("Threads:") {
            threads = t.trim().parse().unwrap_or(1);
        } else if let Some(u) = line.strip_prefix("Uid:") {
            let mut it = u.split_whitespace().filter_map(|n| n.parse().ok());
            uids = Some([it.next()?, it.next()?, it.next()?, it.next()?]);
        }
    }
    // A leader that exited while its other threads run shows as a zombie: it is not dead.
    Some((uids?, zombie && threads <= 1))
}

/// Sends SIGKILL to process `pid` if it runs as a uid that `matches`; `Some(alive)` when it did.
/// The process is pinned with a pidfd and its uid read again before the signal, so a pid reused
/// in between is never signalled.
fn kill_if(pid: i32, matches: &impl Fn(u32) -> bool) -> Option<bool> {
    let ours = |pid: i32| status(&pid.to_string()).filter(|(uids, _)| uids.iter().any(|u| matches(*u)));
    ours(pid)?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    let Some((_, dead)) = ours(pid) else {
        if fd >= 0 {
            // SAFETY: fd was opened above and is closed once.
            unsafe { libc::close(fd) };
        }
        return None;
    };
    if fd >= 0 {
        // SAFETY: fd is the pidfd opened above; a process that already died gives ESRCH.
        unsafe {
            libc::syscall(libc::SYS_pidfd_send_signal, fd, libc::SIGKILL, std::ptr::null::<libc::siginfo_t>(), 0);
            libc::close(fd);
        }
    } else {
        // No pidfds (a kernel before 5.3): a plain kill, with the small reuse window it has.
        // SAFETY: kill only sends a signal.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    // A dead process is signalled too (harmless) but not waited for: only its parent can reap it.
    Some(!dead)
}

/// The uids (those that `matches`) of processes alive now.
fn live_uids(matches: impl Fn(u32) -> bool) -> std::collections::BTreeSet<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Default::default() };
    entries
        .flatten()
        .filter_map(|e| status(e.file_name().to_str()?).filter(|(_, dead)| !dead))
        .flat_map(|(uids, _)| uids)
        .filter(|u| matches(*u))
        .collect()
}

/// SIGKILLs every process running as a uid that `matches` (any of its real, effective, saved or
/// file system uid), scanning `/proc` again until a scan finds none alive or the rounds run
/// out. This finds what left the job's process group (`setsid`, a double fork) too. Returns how
/// many were still alive in the last round.
pub fn kill_users(matches: impl Fn(u32) -> bool) -> usize {
    let mut alive = 0;
    for round in 0..KILL_ROUNDS {
        alive = 0;
        let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            if kill_if(pid, &matches) == Some(true) {
                alive += 1;
            }
        }
        if alive == 0 {
            return 0;
        }
        // A killed process takes a moment to exit; later rounds wait a little longer.
        std::thread::sleep(Duration::from_millis(2 + 2 * u64::from(round.min(10))));
    }
    alive
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_is_taken_by_one_job_at_a_time_and_comes_back_last_in_line() {
        // Uids far above anything this machine uses, so the kill scan finds nothing of theirs.
        let pool = Sealed::new(SealedPolicy::Uids(3_999_999_001..=3_999_999_002));
        let a = pool.take().unwrap().unwrap();
        let b = pool.take().unwrap().unwrap();
        assert_ne!(a.uid(), b.uid());
        let err = pool.take().err().unwrap();
        assert!(err.contains("3999999001-3999999002"), "{err}");
        let first = a.uid();
        drop(a);
        drop(b);
        assert_eq!(pool.take().unwrap().unwrap().uid(), first, "the uid used longest ago comes first");
    }

    /// A sealed job finding every uid out with a running job waits for one, rather than failing
    /// (it used to fail at once, and its net retried it slowly); one whose job is cancelled, or
    /// whose executor stops taking work, stops waiting. (One finding every uid held back fails at
    /// once: see the next test.)
    #[tokio::test]
    async fn a_job_waits_for_a_uid_out_with_another_job_until_it_comes_back_or_the_wait_is_stopped() {
        let pool = Sealed::new(SealedPolicy::Uids(3_999_999_021..=3_999_999_021));
        let cancel = CancellationToken::new();
        let first = pool.take().unwrap().unwrap();
        let waiting = tokio::spawn({
            let (pool, cancel) = (pool.clone(), cancel.clone());
            async move { pool.take_waiting(&cancel).await.map(|l| l.map(|l| l.uid())) }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "the job did not wait for the uid: {:?}", waiting.await);
        first.release().await;
        let got = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("still waiting").unwrap();
        assert_eq!(got, Ok(Some(3_999_999_021)));

        // Cancelled while it waits.
        let held = pool.take().unwrap().unwrap();
        let stopping = CancellationToken::new();
        let waiting = tokio::spawn({
            let (pool, stopping) = (pool.clone(), stopping.clone());
            async move { pool.take_waiting(&stopping).await.map(|l| l.map(|l| l.uid())) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        stopping.cancel();
        let err = waiting.await.unwrap().unwrap_err();
        assert!(
            matches!(&err, NoUid::Refused(e) if e.starts_with("stopped while waiting for a sealed uid: no sealed uid is free")),
            "{err}"
        );

        // The executor stops taking work: a job still waiting does not start within the grace
        // period (its worker hands it back), and later ones do not wait either.
        let waiting = tokio::spawn({
            let (pool, cancel) = (pool.clone(), cancel.clone());
            async move { pool.take_waiting(&cancel).await.map(|l| l.map(|l| l.uid())) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        pool.stop_waiting();
        let err = waiting.await.unwrap().unwrap_err();
        assert!(matches!(&err, NoUid::Stopped(e) if e.starts_with(STOPPED_WAITING)), "{err}");
        let err = pool.take_waiting(&cancel).await.err().unwrap();
        assert!(matches!(&err, NoUid::Stopped(e) if e.starts_with(STOPPED_WAITING)), "{err}");
        drop(held);
    }

    #[test]
    fn without_root_a_sealed_job_is_refused_unless_the_current_user_was_chosen() {
        let err = Sealed::new(SealedPolicy::Refuse).take().err().unwrap();
        assert!(err.starts_with("sealed jobs need an executor running as root with --sealed-uids"), "{err}");
        assert!(Sealed::new(SealedPolicy::CurrentUser).take().unwrap().is_none());
    }

    #[test]
    fn the_status_of_this_process_names_its_uids() {
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() };
        let (uids, dead) = status(&std::process::id().to_string()).unwrap();
        assert_eq!(uids[0], me);
        assert!(!dead);
    }
    /// Sets or clears the immutable attribute of `path`; false where the file system has none.
    fn immutable(path: &std::path::Path, on: bool) -> bool {
        use std::os::fd::AsRawFd;
        let Ok(f) = std::fs::File::open(path) else { return false };
        let mut flags: libc::c_long = 0;
        // SAFETY: FS_IOC_GETFLAGS and FS_IOC_SETFLAGS read and write one long through the pointer.
        unsafe {
            if libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) != 0 {
                return false;
            }
            // FS_IMMUTABLE_FL of <linux/fs.h>.
            let immutable: libc::c_long = 0x10;
            flags = if on { flags | immutable } else { flags & !immutable };
            libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) == 0
        }
    }

    #[test]
    fn a_uid_whose_jobs_folder_cannot_be_removed_goes_to_no_other_job_nor_is_waited_for() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: the immutable attribute cannot be set here");
            return;
        }
        let ws = tempfile::tempdir().unwrap();
        let pool = Sealed::new(SealedPolicy::Uids(3_999_999_011..=3_999_999_011));
        let (kept, left) = (ws.path().join("kept"), ws.path().join("kept/secret"));
        std::fs::create_dir(&kept).unwrap();
        std::fs::write(&left, b"the last job's").unwrap();
        // Not even root removes an immutable file: the removal fails as it would on a bad disk.
        if !immutable(&left, true) {
            eprintln!("this file system has no immutable attribute");
            return;
        }
        let mut lease = pool.take().unwrap().unwrap();
        lease.folder = Some(kept.clone());
        drop(lease);
        let taken = pool.take();
        // No uid is out with a job, so none can come back: a sealed job does not wait.
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let waited = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), pool.take_waiting(&CancellationToken::new())).await
        });
        immutable(&left, false);
        assert!(
            waited
                .expect("waited for a uid that cannot come back")
                .is_err_and(|e| matches!(&e, NoUid::Refused(why) if why.starts_with("no sealed uid")))
        );
        assert!(left.exists());
        let err = taken.err().expect("the uid went to another job with the last one's folder still there");
        assert!(err.starts_with("no sealed uid is free"), "{err}");

        // A folder that goes: the uid comes back.
        let pool = Sealed::new(SealedPolicy::Uids(3_999_999_012..=3_999_999_012));
        let mut lease = pool.take().unwrap().unwrap();
        lease.folder = Some(kept.clone());
        drop(lease);
        assert!(!kept.exists());
        assert_eq!(pool.take().unwrap().unwrap().uid(), 3_999_999_012);
    }
}
