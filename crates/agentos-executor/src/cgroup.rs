//! A cgroup (v2) per job. Everything a script starts stays in its job's cgroup, `setsid`
//! children and double forks included, so the executor kills all of it when the job ends, a
//! guard process kills all of it when the executor dies (SIGKILL included), and an executor
//! starting on a workspace kills what a predecessor on that workspace left. A process group
//! or a parent-death signal reaches none of those that left: `setsid` leaves the group, and a
//! parent-death signal goes to the direct child only.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// The write end of the guard's pipe: never written, closed only when this process ends.
    guard: Option<OwnedFd>,
}

/// One job's cgroup. The runner puts the script in it before it runs, kills it when the main
/// process exits, and removes it.
pub struct JobCgroup {
    dir: PathBuf,
    procs: OwnedFd,
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
                Ok(()) => return Ok(JobCgroups { dir, next: AtomicU64::new(0), guard: None }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(CgroupError::Io { path: dir, source: e }),
            }
        }
    }

    /// This executor's cgroup.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new cgroup for one job.
    pub fn job(&self) -> std::io::Result<JobCgroup> {
        let dir = self.dir.join(format!("job-{}", self.next.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&dir)?;
        // Opened here, as the executor's user, and written in the child before it changes user.
        let procs = std::fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?;
        Ok(JobCgroup { dir, procs: procs.into() })
    }

    /// Starts the guard: a process forked from this one that waits on a pipe only this process
    /// holds open and, when it closes (this process ended, however it ended), kills every
    /// process in this executor's cgroup and exits. Forked rather than run from a program so
    /// that it needs nothing on disk; between fork and exit it makes only system calls that are
    /// safe in the child of a threaded process.
    pub fn start_guard(&mut self) -> std::io::Result<()> {
        let kill = CString::new(self.dir.join("cgroup.kill").as_os_str().as_bytes())?;
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (read, write) = (fds[0], fds[1]);
        // SAFETY: fork has no preconditions; the child below calls only async-signal-safe
        // functions and never returns into Rust code.
        match unsafe { libc::fork() } {
            -1 => {
                let e = std::io::Error::last_os_error();
                // SAFETY: both descriptors were opened above and are closed once.
                unsafe {
                    libc::close(read);
                    libc::close(write);
                }
                Err(e)
            }
            0 => {
                // SAFETY: in the child: signal, prctl, close_range, close, read, open, write and
                // _exit are async-signal-safe; `kill` was allocated before the fork.
                unsafe { guard(read, &kill) }
            }
            pid => {
                // SAFETY: the read end belongs to the guard now; this process keeps the write end.
                unsafe { libc::close(read) };
                // SAFETY: `write` was opened above and is owned from here on.
                self.guard = Some(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(write) });
                tracing::debug!(guard = pid, cgroup = %self.dir.display(), "job guard started");
                Ok(())
            }
        }
    }

    /// Kills whatever still runs in this executor's cgroup and removes it: the executor is
    /// stopping and its jobs are over.
    pub fn close(self) {
        let left = kill_and_remove(&self.dir);
        if left > 0 {
            tracing::error!(cgroup = %self.dir.display(), left, "processes of this executor's jobs survived SIGKILL");
        }
    }
}

/// The guard's whole life, in the forked child.
unsafe fn guard(read: RawFd, kill: &CString) -> ! {
    // SAFETY: see the caller; every call below is async-signal-safe.
    unsafe {
        // A terminal's Ctrl-C or a hang-up reaches the executor's whole group; the guard must
        // outlive the executor, so it ignores them and ends only when the pipe closes.
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
        libc::prctl(libc::PR_SET_NAME, c"agentos-guard".as_ptr(), 0, 0, 0);
        // Nothing of the executor stays open in the guard: a listening socket or a lock held
        // here would outlive the executor.
        // Above all the pipe's write end: held here, it would never close. (The pipe is made
        // just before the fork, so its ends are the two highest descriptors but for a race.)
        let read_u = read as libc::c_uint;
        let below = read_u == 0 || libc::syscall(libc::SYS_close_range, 0 as libc::c_uint, read_u - 1, 0) == 0;
        let above = libc::syscall(libc::SYS_close_range, read_u + 1, libc::c_uint::MAX, 0) == 0;
        if !(below && above) {
            // No close_range (a kernel before 5.9): one by one, as far as descriptors go here.
            for fd in (0..65_536).filter(|fd| *fd != read) {
                libc::close(fd);
            }
        }
        let mut buf = [0u8; 16];
        loop {
            let n = libc::read(read, buf.as_mut_ptr().cast(), buf.len());
            if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                break;
            }
        }
        let fd = libc::open(kill.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, b"1".as_ptr().cast(), 1);
        }
        libc::_exit(0)
    }
}

impl JobCgroup {
    /// The open `cgroup.procs` of the job: a process that writes `0` to it joins the cgroup.
    pub fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }

    /// Sends SIGKILL to every process in the job's cgroup; does not wait.
    pub fn kill(&self) {
        kill(&self.dir);
    }

    /// Kills what is left, waits (bounded) for the cgroup to empty and removes it. Returns how
    /// many processes were still in it; blocking.
    pub fn remove(self) -> usize {
        kill_and_remove(&self.dir)
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
