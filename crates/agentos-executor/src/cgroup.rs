//! A cgroup (v2) per job. Everything a script starts stays in its job's cgroup, `setsid`
//! children and double forks included, so the executor kills all of it when the job ends, a
//! guard process kills all of it when the executor dies (SIGKILL included), and an executor
//! starting on a workspace kills what a predecessor on that workspace left. A process group
//! or a parent-death signal reaches none of those that left: `setsid` leaves the group, and a
//! parent-death signal goes to the direct child only.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Why jobs cannot have cgroups here.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted (looked in /proc/self/mountinfo)")]
    NotMounted,
    #[error("cannot read this process's cgroup from /proc/self/cgroup")]
    OwnCgroup,
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io { path: path.to_path_buf(), source }
}

/// Rounds of waiting for a killed cgroup to empty before giving up on removing it. SIGKILL is
/// delivered at once; exiting takes a moment, longer for a process stuck in the kernel.
const EMPTY_ROUNDS: u32 = 50;

/// The prefix of an executor's cgroup: `agentos-executor-<pid>-<n>`.
const PREFIX: &str = "agentos-executor-";

/// This executor's cgroup, under which each job gets one of its own.
pub struct JobCgroups {
    dir: PathBuf,
    next: AtomicU64,
    guard: Option<Guard>,
    /// Job cgroups their last job left empty, kept for the next job: making and removing a
    /// cgroup costs the kernel far more than the job's own spawn.
    free: Free,
}

/// Empty job cgroups, ready for a job.
type Free = Arc<Mutex<Vec<(PathBuf, Files)>>>;

/// The files of a job cgroup that every job reads or writes, kept open with it: a path lookup
/// in the cgroup file system costs more than the read or write itself.
struct Files {
    /// `cgroup.procs`, opened by the executor's user and written in the child before it
    /// changes user.
    procs: OwnedFd,
    /// `cgroup.events` and `cgroup.stat`, read from their start each time (the kernel makes
    /// them anew for a read at offset 0); `None` on kernels without them (before 4.5 and
    /// 4.14), where a cgroup is never kept for another job.
    events: Option<File>,
    stat: Option<File>,
    /// `cgroup.kill`; `None` on kernels before 5.14, which have none.
    kill: Option<File>,
}

impl Files {
    fn open(dir: &Path) -> std::io::Result<Files> {
        let procs = std::fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?;
        Ok(Files {
            procs: procs.into(),
            events: File::open(dir.join("cgroup.events")).ok(),
            stat: File::open(dir.join("cgroup.stat")).ok(),
            kill: std::fs::OpenOptions::new().write(true).open(dir.join("cgroup.kill")).ok(),
        })
    }

    /// Whether any process is in the cgroup or below it; `true` unless the file says
    /// `populated 0`.
    fn populated(&self) -> bool {
        self.events.as_ref().and_then(read_from_start).is_none_or(|e| !e.lines().any(|l| l == "populated 0"))
    }

    /// How many cgroups are below it, dying ones included; `None` when unreadable.
    fn descendants(&self) -> Option<u64> {
        stat_descendants(&read_from_start(self.stat.as_ref()?)?)
    }

    /// Neither a process nor a cgroup in it: fit for the next job.
    fn empty(&self) -> bool {
        !self.populated() && self.descendants() == Some(0)
    }
}

/// The whole of a small cgroup file, read from offset 0 through an open descriptor. A read of
/// such a file fills the buffer or reaches the end, so one read usually does.
fn read_from_start(file: &File) -> Option<String> {
    use std::os::unix::fs::FileExt;
    let mut text = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match file.read_at(&mut buf, text.len() as u64) {
            Ok(n) => {
                text.extend_from_slice(&buf[..n]);
                if n < buf.len() {
                    return String::from_utf8(text).ok();
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// Most empty job cgroups kept; one per slot is what a busy executor uses.
const MAX_FREE: usize = 64;

/// The guard process and the write end of its pipe: never written, closed when this process
/// ends (or the executor stops and closes its cgroups).
struct Guard {
    _pipe: OwnedFd,
    child: std::process::Child,
}

/// The guard's script: ignore what a terminal sends, wait for end of file on stdin, kill the
/// cgroup named by `$1`.
const GUARD_SCRIPT: &str = "trap '' INT TERM HUP QUIT PIPE; while read -r _; do :; done; echo 1 > \"$1\"";

/// One job's cgroup. The runner puts the script in it before it runs, kills it when the main
/// process exits, and removes it.
pub struct JobCgroup {
    dir: PathBuf,
    files: Files,
    free: Free,
}

/// Where cgroup v2 is mounted, and where in it this process sits.
fn own_cgroup() -> Result<PathBuf, CgroupError> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").map_err(io(Path::new("/proc/self/mountinfo")))?;
    // `36 35 0:30 / /sys/fs/cgroup rw,... shared:9 - cgroup2 cgroup2 rw`: root, mount point,
    // and the file system type after the ` - `.
    let (root, mount) = mounts
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            (right.split_whitespace().next() == Some("cgroup2")).then_some(())?;
            let mut f = left.split_whitespace().skip(3);
            Some((f.next()?.to_string(), PathBuf::from(f.next()?)))
        })
        .ok_or(CgroupError::NotMounted)?;
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|_| CgroupError::OwnCgroup)?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::")).ok_or(CgroupError::OwnCgroup)?;
    let path = path.strip_prefix(root.trim_end_matches('/')).unwrap_or(path);
    Ok(mount.join(path.trim_start_matches('/')))
}

impl JobCgroups {
    /// Makes this executor's cgroup beside its own, after killing and removing those that
    /// executors that are no longer running left behind. Every dead executor's, not only one
    /// that ran on the same workspace: nothing in them has anyone to report to, and a cgroup is
    /// never reused, so leaving them would only let them pile up.
    pub fn open() -> Result<JobCgroups, CgroupError> {
        let parent = own_cgroup()?;
        let entries = std::fs::read_dir(&parent).map_err(io(&parent))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)?.split_once('-')) else { continue };
            let Ok(pid) = pid.0.parse::<u32>() else { continue };
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let left = kill_and_remove(&entry.path());
                if left > 0 {
                    tracing::error!(cgroup = %entry.path().display(), left, "processes a dead executor left survived SIGKILL");
                } else {
                    tracing::debug!(cgroup = %entry.path().display(), "swept the cgroup of a dead executor");
                }
            }
        }
        // Numbered within the process, which may run more than one executor. A name that is
        // taken belongs to a live executor of this process or to a dead one that had this
        // process id (swept by the next executor to start after this process ends): skipped.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        loop {
            let dir = parent.join(format!("{PREFIX}{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    return Ok(JobCgroups { dir, next: AtomicU64::new(0), guard: None, free: Free::default() });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(CgroupError::Io { path: dir, source: e }),
            }
        }
    }

    /// This executor's cgroup.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A cgroup for one job: one an earlier job left empty, or a new one.
    pub fn job(&self) -> std::io::Result<JobCgroup> {
        while let Some((dir, files)) = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            // Looked at again: a process of the executor's own user may have moved itself in
            // since (jobs that run as that user can write `cgroup.procs`).
            let cg = JobCgroup { dir, files, free: self.free.clone() };
            if cg.files.empty() {
                return Ok(cg);
            }
            let left = kill_and_remove(&cg.dir);
            if left > 0 {
                tracing::error!(cgroup = %cg.dir.display(), left, "processes in a kept job cgroup survived SIGKILL");
            }
        }
        let dir = self.dir.join(format!("job-{}", self.next.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&dir)?;
        match Files::open(&dir) {
            Ok(files) => Ok(JobCgroup { dir, files, free: self.free.clone() }),
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    /// Starts the guard: a shell (`sh`, run as `agentos-guard`) whose stdin is a pipe only
    /// this process holds the other end of. When the pipe closes (this process ended, however
    /// it ended) its `read` sees end of file, and it kills every process in this executor's
    /// cgroup and exits. A program of its own rather than a fork of this process: a fork would
    /// keep a copy-on-write image of the whole executor (of the whole master, under `up`)
    /// alive, and a fork of a threaded process may call nothing but async-signal-safe code.
    /// It ignores the signals a terminal sends and runs in a process group of its own, so a
    /// Ctrl-C that stops the executor does not stop it first.
    pub fn start_guard(&mut self, sh: &Path) -> std::io::Result<()> {
        // Both ends are close-on-exec: no script inherits the write end, which would keep the
        // pipe open after the executor died.
        let (read, write) = pipe()?;
        let child = std::process::Command::new(sh)
            .args(["-c", GUARD_SCRIPT, "agentos-guard"])
            .arg(self.dir.join("cgroup.kill"))
            .env_clear()
            .current_dir("/")
            .stdin(std::process::Stdio::from(read))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()?;
        tracing::debug!(guard = child.id(), cgroup = %self.dir.display(), "job guard started");
        self.guard = Some(Guard { _pipe: write, child });
        Ok(())
    }

    /// Kills whatever still runs in this executor's cgroup and removes it: the executor is
    /// stopping and its jobs are over.
    pub fn close(mut self) {
        if let Some(Guard { _pipe, mut child }) = self.guard.take() {
            // Closing the pipe ends the guard (after its kill, which finds nothing left to do).
            drop(_pipe);
            let _ = child.wait();
        }
        self.free.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let left = kill_and_remove(&self.dir);
        if left > 0 {
            tracing::error!(cgroup = %self.dir.display(), left, "processes of this executor's jobs survived SIGKILL");
        }
    }
}

/// A pipe, both ends close-on-exec: (read, write).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two new descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just opened and are owned from here on, once each.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl JobCgroup {
    /// The job's cgroup.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The open `cgroup.procs` of the job: a process that writes `0` to it joins the cgroup.
    pub fn procs_fd(&self) -> RawFd {
        self.files.procs.as_raw_fd()
    }

    /// Sends SIGKILL to every process in the job's cgroup; does not wait.
    pub fn kill(&self) {
        use std::io::Write;
        if let Some(mut file) = self.files.kill.as_ref()
            && file.write_all(b"1").is_ok()
        {
            return;
        }
        kill(&self.dir);
    }

    /// Keeps the cgroup for the next job when it is over: no process in it (the job's main
    /// process was reaped and `kill` found nothing else) and no cgroup below it (a script made
    /// none). Otherwise it is handed back, for `remove`. Does not block: two reads of the
    /// cgroup's own files.
    pub fn reuse(self) -> Result<(), JobCgroup> {
        if !self.files.empty() {
            return Err(self);
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() >= MAX_FREE {
            drop(free);
            return Err(self);
        }
        free.push((self.dir, self.files));
        Ok(())
    }

    /// Kills what is left, waits (bounded) for the cgroup to empty and removes it. Returns how
    /// many processes were still in it; blocking.
    pub fn remove(self) -> usize {
        kill_and_remove(&self.dir)
    }

    /// Done with: kept for the next job when empty, else removed off the runtime's threads.
    pub async fn release(self) {
        if let Err(cg) = self.reuse() {
            match tokio::task::spawn_blocking(move || cg.remove()).await {
                Ok(0) => {}
                Ok(left) => tracing::error!(left, "processes of a job survived SIGKILL in its cgroup"),
                Err(e) => tracing::error!(error = %e, "removing a job's cgroup failed"),
            }
        }
    }
}

/// SIGKILLs every process in the cgroup `dir` and its descendants.
fn kill(dir: &Path) {
    if std::fs::write(dir.join("cgroup.kill"), b"1").is_ok() {
        return;
    }
    // Kernels before 5.14 have no `cgroup.kill`: signal each process found, children first.
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
            kill(&e.path());
        }
    }
    for pid in procs(dir) {
        // SAFETY: kill only sends a signal. The pid was just read from the job's cgroup.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// The processes in the cgroup `dir` itself.
fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Whether any process is in `dir` or below it.
fn populated(dir: &Path) -> bool {
    match std::fs::read_to_string(dir.join("cgroup.events")) {
        Ok(events) => events.lines().any(|l| l == "populated 1"),
        Err(_) => !procs(dir).is_empty(),
    }
}

/// How many cgroups are below, dying ones included, from the text of a `cgroup.stat`; `None`
/// when it does not say.
fn stat_descendants(stat: &str) -> Option<u64> {
    let count = |key: &str| stat.lines().find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok());
    Some(count("nr_descendants ")? + count("nr_dying_descendants ").unwrap_or(0))
}

/// Kills everything in `dir` (a cgroup, with its children), waits for it to empty, and removes
/// it, children first. Returns how many processes were left when it gave up; 0 when `dir` does
/// not exist.
fn kill_and_remove(dir: &Path) -> usize {
    if !dir.exists() {
        return 0;
    }
    for round in 0..EMPTY_ROUNDS {
        kill(dir);
        if !populated(dir) {
            break;
        }
        std::thread::sleep(Duration::from_millis(2 + 2 * u64::from(round.min(10))));
    }
    if populated(dir) {
        return procs(dir).len().max(1);
    }
    remove_tree(dir);
    0
}

/// Removes the empty cgroup `dir` and the cgroups below it (a cgroup's files go with it).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
            remove_tree(&e.path());
        }
    }
    if let Err(e) = std::fs::remove_dir(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(cgroup = %dir.display(), error = %e, "cannot remove a job cgroup");
    }
}
