//! Starts a job's process without copying the executor: `clone(CLONE_VM | CLONE_VFORK)`, as
//! `posix_spawn` does, with the steps `posix_spawn` cannot take (joining the job's cgroup and
//! changing user, before anything of the job runs) done in the child before `exec`.
//!
//! A `fork` copied the executor's page tables and then took a copy-on-write fault for every page
//! either side touched before the `exec`: about a fifth of the executor's CPU per job. Here the
//! child borrows the executor's memory until it calls `execve`; the executor's thread waits
//! (`CLONE_VFORK`) until then. The child only makes system calls (through libc wrappers that
//! are nothing more; the user and groups through `syscall` itself) on values prepared before
//! the clone, and all signals are blocked around it, so no handler of the executor ever runs on
//! the child's stack.
//!
//! The exit is awaited on a pidfd, so waiting costs no thread and no `SIGCHLD` handling.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// What to start.
pub struct Spawn<'a> {
    pub program: &'a Path,
    pub args: &'a [String],
    /// The whole environment of the process.
    pub env: &'a BTreeMap<String, String>,
    pub cwd: &'a Path,
    /// What the process reads on stdin, through a pipe; `None`: it reads from /dev/null.
    pub stdin: Option<&'a [u8]>,
    /// Written "0" to (`cgroup.procs` of the job's cgroup) first: the child joins it.
    pub cgroup_procs: Option<RawFd>,
    /// Run as this user and group instead of the executor's own.
    pub run_as: Option<(u32, u32)>,
    /// A sealed job's own view of the machine (see [`private_view`]); needs root.
    pub private: bool,
    /// The script the program runs, which a private view must keep in reach.
    pub script: Option<&'a Path>,
}

/// A started process in a process group of its own (its pid is the group's id).
pub struct Spawned {
    pub pid: i32,
    /// The pipe to write the rest of the input to, and how many bytes of it are written.
    /// `None` when the whole input fitted in the pipe before the process started (the pipe is
    /// closed then, and the process reads the input, then end of file), or when there was none.
    pub stdin: Option<(pipe::Sender, usize)>,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

/// Everything the child reads, prepared before the clone: it allocates nothing.
struct ChildPlan {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    fds: [RawFd; 3],
    cgroup_procs: RawFd,
    run_as: Option<(u32, u32)>,
    root: bool,
    /// In new mount and IPC namespaces: the steps of [`private_view`].
    private: bool,
    /// A sealed job: keyrings of its own (see [`fresh_keyrings`]).
    sealed: bool,
    /// The folders that get a fresh tmpfs in a private view (null: not this one).
    tmp: [*const libc::c_char; 3],
    /// The entries of the `tmp` folders that hold the job's folder and its script, carried into
    /// the fresh tmpfs that would hide them; null where they lie in none of them, or twice.
    keep: [*const libc::c_char; 2],
    /// Set by the child to the errno of the step that failed; read once the clone returned.
    error: libc::c_int,
    /// Set by the child when the kernel could not make the file system read-only (no
    /// `mount_setattr`, before Linux 5.12).
    writable: libc::c_int,
}

/// What a sealed job (one carrying a credential, run as a uid of its own) sees, so that nothing it
/// leaves outside its folder reaches the next job given the same uid: new mount and IPC
/// namespaces, the whole file system read-only but for its folder, a fresh tmpfs on each of
/// [`PRIVATE_TMP`] (the entry of one that holds the job's folder carried into it), and System V
/// IPC and POSIX message queues of its own. All of it goes with the job's last process. A uid of its own kept the job's
/// processes apart, but not its files: one sealed job wrote `/tmp/x` (mode 600), or a System V
/// shared memory segment, and the next job of the uid read it.
pub const PRIVATE_TMP: [&std::ffi::CStr; 3] = [c"/tmp", c"/var/tmp", c"/dev/shm"];

/// Each of a sealed job's own tmp folders is memory, and may hold a tenth of the machine's: no
/// job fills memory through them, where before it wrote to disk.
const TMPFS_OPTIONS: &std::ffi::CStr = c"mode=1777,size=10%";

/// A sealed job's keyrings, after it changed user: a new session keyring (not the executor's),
/// and the uid's user keyrings emptied. The kernel keeps a uid's user keyrings after its last
/// process ends, and a sealed job added a key to `@u` that the next job of the uid read. A kernel
/// without keys (`ENOSYS`) has nothing to keep.
///
/// # Safety
/// Only system calls: callable in the child of a `CLONE_VM` clone.
unsafe fn fresh_keyrings() -> Result<(), libc::c_int> {
    const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
    const KEYCTL_CLEAR: libc::c_long = 7;
    const KEY_SPEC_USER_KEYRING: libc::c_long = -4;
    const KEY_SPEC_USER_SESSION_KEYRING: libc::c_long = -5;
    let steps = [
        (KEYCTL_JOIN_SESSION_KEYRING, 0),
        (KEYCTL_CLEAR, KEY_SPEC_USER_KEYRING),
        (KEYCTL_CLEAR, KEY_SPEC_USER_SESSION_KEYRING),
    ];
    for (op, arg) in steps {
        // SAFETY: keyctl with a null name (a new anonymous session keyring) or a special id.
        if unsafe { libc::syscall(libc::SYS_keyctl, op, arg) } < 0 {
            match io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL) {
                libc::ENOSYS => return Ok(()),
                e => return Err(e),
            }
        }
    }
    Ok(())
}

/// `<linux/mount.h>`: `open_tree` makes a detached copy; `move_mount` from its descriptor.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

/// Whether the NUL-terminated path `path` lies in the folder `dir` (`dir/...`). Reads bytes
/// only: callable in the child.
///
/// # Safety
/// Both are NUL-terminated.
unsafe fn under(path: *const libc::c_char, dir: *const libc::c_char) -> bool {
    let mut i = 0;
    // SAFETY: both strings are read up to their NUL, no further.
    unsafe {
        while *dir.add(i) != 0 {
            if *path.add(i) != *dir.add(i) {
                return false;
            }
            i += 1;
        }
        *path.add(i) == b'/' as libc::c_char
    }
}

/// `struct mount_attr` of `<linux/mount.h>`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// The steps of [`PRIVATE_TMP`]'s view, in the child, before it changes user. `Err` is the
/// errno of the step that failed.
///
/// # Safety
/// Only system calls on the plan's values: callable in the child of a `CLONE_VM` clone.
unsafe fn private_view(plan: &mut ChildPlan) -> Result<(), libc::c_int> {
    let errno = || io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
    // SAFETY: system calls on NUL-terminated literals and the plan's prepared paths.
    unsafe {
        // Nothing mounted here reaches the executor's namespace.
        let none = std::ptr::null::<libc::c_char>();
        if libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0 {
            return Err(errno());
        }
        let ro = MountAttr { attr_set: libc::MOUNT_ATTR_RDONLY, attr_clr: 0, propagation: 0, userns_fd: 0 };
        let size = std::mem::size_of::<MountAttr>();
        let r = libc::syscall(libc::SYS_mount_setattr, libc::AT_FDCWD, c"/".as_ptr(), libc::AT_RECURSIVE, &ro, size);
        if r != 0 && errno() == libc::ENOSYS {
            plan.writable = 1;
        } else if r != 0 {
            return Err(errno());
        } else {
            // /proc itself writable again (`/proc/self/comm`, `oom_score_adj`, the maps of a
            // user namespace): it holds nothing one job can leave for another, and what in it
            // is the system's needs root. Mounts below it (`/proc/sys` in a container) stay.
            let rw = MountAttr { attr_set: 0, attr_clr: libc::MOUNT_ATTR_RDONLY, propagation: 0, userns_fd: 0 };
            if libc::syscall(libc::SYS_mount_setattr, libc::AT_FDCWD, c"/proc".as_ptr(), 0, &rw, size) != 0 {
                return Err(errno());
            }
            // The job's folder writable again: a mount of its own, then made writable.
            let flags = libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV;
            if libc::mount(plan.cwd, plan.cwd, none, libc::MS_BIND, std::ptr::null()) != 0
                || libc::mount(none, plan.cwd, none, libc::MS_REMOUNT | flags, std::ptr::null()) != 0
            {
                return Err(errno());
            }
        }
        for dir in plan.tmp.into_iter().filter(|d| !d.is_null()) {
            // The trees that hold the job's folder and its script, taken before the tmpfs hides
            // them (mounts below come along: the folder's own writable one).
            let mut trees: [(libc::c_int, *const libc::c_char); 2] = [(-1, std::ptr::null()); 2];
            let mut failed = None;
            for (slot, keep) in trees.iter_mut().zip(plan.keep) {
                if keep.is_null() || !under(keep, dir) {
                    continue;
                }
                let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint;
                match libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, keep, flags) {
                    fd if fd < 0 => failed = failed.or(Some(errno())),
                    fd => *slot = (fd as libc::c_int, keep),
                }
            }
            let flags = libc::MS_NOSUID | libc::MS_NODEV;
            if failed.is_none()
                && libc::mount(c"tmpfs".as_ptr(), dir, c"tmpfs".as_ptr(), flags, TMPFS_OPTIONS.as_ptr().cast()) != 0
            {
                failed = Some(errno());
            }
            for (tree, keep) in trees {
                if tree < 0 {
                    continue;
                }
                if failed.is_none()
                    && (libc::mkdir(keep, 0o755) != 0
                        || libc::syscall(
                            libc::SYS_move_mount,
                            tree,
                            c"".as_ptr(),
                            libc::AT_FDCWD,
                            keep,
                            MOVE_MOUNT_F_EMPTY_PATH,
                        ) != 0)
                {
                    failed = Some(errno());
                }
                libc::close(tree);
            }
            if let Some(e) = failed {
                return Err(e);
            }
        }
    }
    Ok(())
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in an argument"))
}

fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Writes as much of `input` as `w` takes without waiting, and returns how much that was. `w`
/// is left non-blocking (the process reads the other end, which stays blocking).
fn fill(w: &OwnedFd, input: &[u8]) -> io::Result<usize> {
    // SAFETY: fcntl on a descriptor we own.
    if unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut written = 0;
    while written < input.len() {
        let rest = &input[written..];
        // SAFETY: writes from a live slice of `rest.len()` bytes.
        let n = unsafe { libc::write(w.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => break,
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
        written += n as usize;
    }
    Ok(written)
}

/// The child, between the clone and `execve`. Only system calls, on the plan's values.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the plan, alive on the parent's stack while the parent waits (CLONE_VFORK).
    let plan = unsafe { &mut *(arg as *mut ChildPlan) };
    let fail = |plan: &mut ChildPlan| -> libc::c_int {
        plan.error = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
        // SAFETY: _exit ends the child without running anything of the parent's.
        unsafe { libc::_exit(127) }
    };
    // SAFETY: every call below is a system call on prepared values; the signal table is the
    // child's own copy (no CLONE_SIGHAND), so resetting it leaves the executor's alone.
    unsafe {
        // Every caught signal back to its default, before any is unblocked: a handler of the
        // executor must never run here. SIGPIPE too, which the executor ignores.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..=libc::SIGRTMAX() {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && (old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
                && old.sa_sigaction != libc::SIG_DFL
            {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        // The cgroup first, as the executor's user: once the user changed, the child may no
        // longer move itself, and nothing runs before it is in.
        if plan.cgroup_procs >= 0 && libc::write(plan.cgroup_procs, b"0".as_ptr().cast(), 1) != 1 {
            return fail(plan);
        }
        if plan.private
            && let Err(e) = private_view(plan)
        {
            plan.error = e;
            libc::_exit(127);
        }
        if libc::setpgid(0, 0) != 0 || libc::chdir(plan.cwd) != 0 {
            return fail(plan);
        }
        if let Some((uid, gid)) = plan.run_as {
            // As root, drop the supplementary groups, then the group, then the user. The system
            // calls themselves: glibc's wrappers change every thread of a process (signalling
            // and locking in the executor's memory, which this child shares), where the call
            // changes only the caller.
            if plan.root && libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0 {
                return fail(plan);
            }
            if libc::syscall(libc::SYS_setgid, gid) != 0 || libc::syscall(libc::SYS_setuid, uid) != 0 {
                return fail(plan);
            }
        }
        if plan.sealed
            && let Err(e) = fresh_keyrings()
        {
            plan.error = e;
            libc::_exit(127);
        }
        for (target, fd) in plan.fds.into_iter().enumerate() {
            let target = target as RawFd;
            if fd == target {
                // Already in place: only its close-on-exec flag goes.
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return fail(plan);
                }
            } else if libc::dup2(fd, target) != target {
                return fail(plan);
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execve(plan.path, plan.argv, plan.envp);
        fail(plan)
    }
}

static WARNED_WRITABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process may make mount and IPC namespaces (root with `CAP_SYS_ADMIN`, and
/// namespaces not turned off), found out once with a child that only exits. Without them a
/// sealed job runs as before, sharing world-writable folders with later jobs of its uid, and
/// the executor says so once.
fn namespaces() -> bool {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAN.get_or_init(|| {
        extern "C" fn exit_at_once(_: *mut libc::c_void) -> libc::c_int {
            0
        }
        let mut stack = vec![0u8; 16 * 1024];
        // SAFETY: a child on its own stack that returns at once (CLONE_VFORK: the parent waits
        // until it has), with every signal blocked so no handler runs on its stack; then it is
        // reaped.
        unsafe {
            let top = stack.as_mut_ptr().add(stack.len());
            let top = top.sub(top as usize % 16);
            let (mut all, mut old): (libc::sigset_t, libc::sigset_t) = (std::mem::zeroed(), std::mem::zeroed());
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::SIGCHLD;
            let pid = libc::clone(exit_at_once, top.cast(), flags, std::ptr::null_mut());
            let error = io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            if pid <= 0 {
                tracing::warn!(
                    %error,
                    "this executor cannot make mount and IPC namespaces (CAP_SYS_ADMIN): a sealed job's files in /tmp, /var/tmp, /dev/shm and other world-writable folders, and its System V IPC, can be read by a later job of its uid"
                );
            }
            if pid > 0 {
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0);
            }
            pid > 0
        }
    })
}

/// The folders of [`PRIVATE_TMP`] that get a fresh tmpfs (real folders, not links), and the
/// entries of them that hold `cwd` and `script`, carried into their new tmpfs (`dir/entry`).
fn private_tmp(cwd: &Path, script: Option<&Path>) -> ([*const libc::c_char; 3], [Option<CString>; 2]) {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let needed = [Some(real(cwd)), script.map(real)];
    let mut keep: [Option<CString>; 2] = [None, None];
    let dirs = PRIVATE_TMP.map(|dir| {
        let path = Path::new(OsStr::from_bytes(dir.to_bytes()));
        if !std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
            return std::ptr::null();
        }
        for (slot, p) in keep.iter_mut().zip(&needed) {
            let entry = p.as_deref().and_then(|p| p.strip_prefix(path).ok()).and_then(|r| r.components().next());
            if let Some(first) = entry {
                *slot = cstring(path.join(first).as_os_str()).ok();
            }
        }
        dir.as_ptr()
    });
    // One entry holding both is carried once.
    if keep[0].is_some() && keep[0] == keep[1] {
        keep[1] = None;
    }
    (dirs, keep)
}

/// The child's stack: it needs little (a few system calls), and is only used until `execve`.
const CHILD_STACK: usize = 64 * 1024;

/// Starts the process. On `Err` nothing was left running.
pub fn spawn(s: &Spawn<'_>) -> io::Result<Spawned> {
    let path = cstring(s.program.as_os_str())?;
    let args: Vec<CString> = std::iter::once(Ok(path.clone()))
        .chain(s.args.iter().map(|a| cstring(OsStr::new(a))))
        .collect::<io::Result<_>>()?;
    let env: Vec<CString> =
        s.env.iter().map(|(k, v)| cstring(OsStr::new(&format!("{k}={v}")))).collect::<io::Result<_>>()?;
    let cwd = cstring(s.cwd.as_os_str())?;
    let argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).chain([std::ptr::null()]).collect();
    let envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).chain([std::ptr::null()]).collect();

    let (stdin_child, stdin_parent) = if let Some(input) = s.stdin {
        let (r, w) = pipe_pair()?;
        // As much of the input as the pipe holds goes in now: a pipe holds 64 KiB unless the
        // system's limits shrank it, and most inputs are far smaller. Then the pipe is closed
        // here, and no task is started to feed it.
        let written = fill(&w, input)?;
        (r, (written < input.len()).then_some((w, written)))
    } else {
        let null = std::fs::File::open("/dev/null")?;
        (OwnedFd::from(null), None)
    };
    let (stdout_parent, stdout_child) = pipe_pair()?;
    let (stderr_parent, stderr_child) = pipe_pair()?;

    let (tmp, keep) = if s.private { private_tmp(s.cwd, s.script) } else { ([std::ptr::null(); 3], [None, None]) };
    let mut plan = ChildPlan {
        path: path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: cwd.as_ptr(),
        fds: [stdin_child.as_raw_fd(), stdout_child.as_raw_fd(), stderr_child.as_raw_fd()],
        cgroup_procs: s.cgroup_procs.unwrap_or(-1),
        run_as: s.run_as,
        // SAFETY: geteuid has no preconditions.
        root: unsafe { libc::geteuid() } == 0,
        private: s.private && namespaces(),
        sealed: s.private,
        tmp,
        keep: [&keep[0], &keep[1]].map(|k| k.as_ref().map_or(std::ptr::null(), |k| k.as_ptr())),
        error: 0,
        writable: 0,
    };
    // Not zeroed: the child writes its stack before it reads it.
    let mut stack: Vec<std::mem::MaybeUninit<u8>> = Vec::with_capacity(CHILD_STACK);
    // SAFETY: the stack grows down from its end, aligned to 16 bytes; the plan and the stack
    // outlive the child's use of them, since CLONE_VFORK returns only once the child called
    // execve or ended. All signals are blocked around the clone and restored after.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(CHILD_STACK);
        let top = top.sub(top as usize % 16);
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let private = if plan.private { libc::CLONE_NEWNS | libc::CLONE_NEWIPC } else { 0 };
        let pid = libc::clone(
            child,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD | private,
            (&mut plan as *mut ChildPlan).cast(),
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        pid
    };
    drop(stack);
    // The child's ends are the child's now.
    drop((stdin_child, stdout_child, stderr_child));
    // SAFETY: reading the fields the child wrote before it ended; it has ended or exec'd.
    let (error, writable) = unsafe { (std::ptr::read_volatile(&plan.error), std::ptr::read_volatile(&plan.writable)) };
    if writable != 0 && !WARNED_WRITABLE.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            "this kernel cannot make a sealed job's file system read-only (mount_setattr, Linux 5.12): its /tmp, /var/tmp and /dev/shm are its own, but a file it leaves in another world-writable folder can be read by a later job of its uid"
        );
    }
    if error != 0 {
        let mut status = 0;
        // SAFETY: reaps our own child, which has ended with _exit.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(io::Error::from_raw_os_error(error));
    }
    let mut spawned = Spawned { pid, stdin: None, stdout: None, stderr: None, pidfd: None, status: None };
    // From here a failure kills and reaps the child (Drop).
    // SAFETY: pidfd_open on our own child, which is not reaped yet.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd >= 0 {
        // SAFETY: the descriptor was just made and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
        // SAFETY: the AsyncFd owns the descriptor and nothing replaces or closes it meanwhile.
        spawned.pidfd = Some(unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)? });
    }
    if let Some((w, written)) = stdin_parent {
        spawned.stdin = Some((pipe::Sender::from_owned_fd(w)?, written));
    }
    spawned.stdout = Some(pipe::Receiver::from_owned_fd(stdout_parent)?);
    spawned.stderr = Some(pipe::Receiver::from_owned_fd(stderr_parent)?);
    Ok(spawned)
}

/// The status of `pid` when it has ended (and is reaped now), `None` while it runs.
fn reap(pid: i32) -> io::Result<Option<ExitStatus>> {
    let mut status = 0;
    // SAFETY: waitpid on our own child.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    match r {
        r if r < 0 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        _ => Ok(Some(ExitStatus::from_raw(status))),
    }
}

impl Spawned {
    /// Waits for the process to end. Cancel-safe: dropped and called again, it goes on waiting.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(s) = self.status {
                return Ok(s);
            }
            let pid = self.pid;
            match &self.pidfd {
                Some(fd) => {
                    // Readable once the process ended.
                    let mut ready = fd.readable().await?;
                    match reap(pid)? {
                        Some(s) => self.status = Some(s),
                        None => ready.clear_ready(),
                    }
                }
                // No pidfd (a kernel before 5.3): looked at every 2 ms.
                None => match reap(pid)? {
                    Some(s) => self.status = Some(s),
                    None => tokio::time::sleep(std::time::Duration::from_millis(2)).await,
                },
            }
        }
    }
}

impl Drop for Spawned {
    /// A process not waited for is killed and reaped, as `kill_on_drop` did.
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        // SAFETY: kill and waitpid on our own child, not reaped yet.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        if matches!(reap(self.pid), Ok(None)) {
            let pid = self.pid;
            // Reaped off this thread: a killed process may take a moment to end.
            let _ = std::thread::Builder::new().name("reap".into()).spawn(move || {
                let mut status = 0;
                // SAFETY: as above.
                unsafe { libc::waitpid(pid, &mut status, 0) };
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use tokio::io::AsyncReadExt;

    fn sh() -> PathBuf {
        crate::runner::find_program("sh", "/usr/bin:/bin").unwrap()
    }

    async fn output(mut s: Spawned) -> (ExitStatus, String) {
        let mut out = String::new();
        s.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
        (s.wait().await.unwrap(), out)
    }

    fn run<'a>(program: &'a Path, args: &'a [String], env: &'a BTreeMap<String, String>, cwd: &'a Path) -> Spawn<'a> {
        Spawn { program, args, env, cwd, stdin: None, cgroup_procs: None, run_as: None, private: false, script: None }
    }

    #[test]
    fn the_entries_of_a_tmp_folder_that_hold_the_jobs_folder_and_script_are_carried_into_its_new_tmpfs() {
        let (dirs, keep) = private_tmp(Path::new("/tmp/ws/jobs/w1"), Some(Path::new("/tmp/ws/scripts/a/t.sh")));
        assert!(dirs.iter().all(|d| !d.is_null()));
        assert_eq!(keep, [Some(c"/tmp/ws".into()), None], "one entry holding both is carried once");
        // A workspace that is /tmp itself: its two entries, not the whole of /tmp.
        let (_, keep) = private_tmp(Path::new("/tmp/jobs/w1"), Some(Path::new("/tmp/scripts/a/t.sh")));
        assert_eq!(keep, [Some(c"/tmp/jobs".into()), Some(c"/tmp/scripts".into())]);
        let (_, keep) = private_tmp(Path::new("/var/lib/ws/w1"), Some(Path::new("/dev/shm/s/t.sh")));
        assert_eq!(keep, [None, Some(c"/dev/shm/s".into())]);
        assert_eq!(private_tmp(Path::new("/var/tmpfs/ws"), None).1, [None, None]);
        // SAFETY: NUL-terminated literals.
        unsafe {
            assert!(under(c"/tmp/ws".as_ptr(), c"/tmp".as_ptr()));
            assert!(!under(c"/tmpfs/ws".as_ptr(), c"/tmp".as_ptr()));
            assert!(!under(c"/tmp".as_ptr(), c"/tmp".as_ptr()));
            assert!(!under(c"/var/tmp/x".as_ptr(), c"/tmp".as_ptr()));
        }
    }

    #[tokio::test]
    async fn the_child_starts_with_no_signal_blocked_and_sigpipe_default_in_a_group_of_its_own() {
        // This process ignores SIGPIPE (Rust does) and catches SIGCHLD once tokio waited for a
        // process: neither may reach the job.
        let _ = tokio::process::Command::new("true").status().await;
        let sh = sh();
        let args = vec!["-c".to_string(), "exec cat /proc/self/status".into()];
        let env = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
        let (status, out) = output(spawn(&run(&sh, &args, &env, Path::new("/"))).unwrap()).await;
        assert!(status.success(), "{out}");
        let mask = |name: &str| {
            let line = out.lines().find(|l| l.starts_with(&format!("{name}:"))).expect(name);
            u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
        };
        // (Caught signals are reset by execve itself; the child resets them before, so that none
        // runs on its stack, which no test can see from after the exec.)
        assert_eq!(mask("SigBlk"), 0, "{out}");
        assert_eq!(mask("SigIgn") & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE is ignored: {out}");
        let args = vec!["-c".to_string(), "cut -d' ' -f1,5 /proc/$$/stat".into()];
        let (_, out) = output(spawn(&run(&sh, &args, &env, Path::new("/"))).unwrap()).await;
        let ids: Vec<&str> = out.split_whitespace().collect();
        assert_eq!((ids.len(), ids[0]), (2, ids[1]), "the process leads its own group: {out}");
    }

    #[tokio::test]
    async fn a_step_that_fails_before_exec_is_an_error_that_leaves_nothing_running() {
        let sh = sh();
        let env = BTreeMap::new();
        let missing = Path::new("/nonexistent/agentos-no-such-program");
        let e = spawn(&run(missing, &[], &env, Path::new("/"))).err().expect("no such program");
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        let e = spawn(&run(&sh, &[], &env, Path::new("/nonexistent-folder"))).err().expect("no such folder");
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        let not_executable = tempfile::NamedTempFile::new().unwrap();
        let e = spawn(&run(not_executable.path(), &[], &env, Path::new("/"))).err().expect("not executable");
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
        let nul = vec!["a\0b".to_string()];
        let e = spawn(&run(&sh, &nul, &env, Path::new("/"))).err().expect("a NUL byte");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[tokio::test]
    async fn a_dropped_process_is_killed_and_reaped_and_a_cancelled_wait_goes_on() {
        let sh = sh();
        let env = BTreeMap::new();
        let args = vec!["-c".to_string(), "sleep 0.3; exit 7".into()];
        let mut s = spawn(&run(&sh, &args, &env, Path::new("/"))).unwrap();
        // A wait given up half way (as a timeout's select! does) and begun again.
        assert!(tokio::time::timeout(Duration::from_millis(50), s.wait()).await.is_err());
        assert_eq!(s.wait().await.unwrap().code(), Some(7));
        let args = vec!["-c".to_string(), "sleep 100".into()];
        let s = spawn(&run(&sh, &args, &env, Path::new("/"))).unwrap();
        let pid = s.pid;
        drop(s);
        assert!(!crate::runner::tests::alive(pid), "a dropped process still runs");
        // Reaped too, not left a zombie: its /proc entry goes.
        let gone = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(5));
            !Path::new(&format!("/proc/{pid}")).exists()
        });
        assert!(gone, "a dropped process was not reaped");
    }

    #[tokio::test]
    async fn as_root_the_child_changes_user_and_drops_its_groups_after_entering_its_folder() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: changing user cannot be tried here");
            return;
        }
        let folder = tempfile::tempdir().unwrap();
        // Only root may enter: the folder is entered before the user changes, as before.
        std::fs::set_permissions(folder.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let sh = sh();
        let args = vec!["-c".to_string(), "id -u; id -g; id -G; pwd".into()];
        let env = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
        let mut spec = run(&sh, &args, &env, folder.path());
        spec.run_as = Some((65534, 65533));
        let (status, out) = output(spawn(&spec).unwrap()).await;
        assert!(status.success(), "{out}");
        let want = format!("65534\n65533\n65533\n{}\n", folder.path().display());
        assert_eq!(out, want);
    }

    use std::time::Duration;
}
