//! Working folders: every job starts in an empty folder that only the user scripts run as may
//! enter. A folder its job left empty, with its mode and owner as they were made, is kept for
//! a later job; anything else is removed. A sealed job's folder is always new and always removed. Making and removing a folder per job costs the file
//! system a block allocation and a free (with a discard on SSDs) each time, which showed as
//! a sixth of the executor's CPU per job; looking into an empty folder costs a few system calls.

use std::ffi::{CStr, CString};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The mode every working folder is made with: its owner only.
const MODE: u32 = 0o700;

pub struct Folders {
    root: PathBuf,
    /// Owner and group of every folder: the user scripts run as.
    owner: (u32, u32),
    /// `Some`: folders are handed to this user after they are made.
    chown: Option<(u32, u32)>,
    spare: Mutex<Vec<PathBuf>>,
    next: AtomicU64,
}

impl Folders {
    /// Folders under `root`, for scripts running as `run_as` (the executor's own user when `None`).
    pub fn new(root: &Path, run_as: Option<(u32, u32)>) -> Self {
        // SAFETY: geteuid and getegid have no preconditions and cannot fail.
        let own = unsafe { (libc::geteuid(), libc::getegid()) };
        Folders {
            root: root.to_path_buf(),
            owner: run_as.unwrap_or(own),
            chown: run_as,
            spare: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
        }
    }

    /// Removes the folders of executors that are no longer running (one killed mid-job leaves
    /// its folders behind). Folders of a live executor sharing the workspace are left alone.
    pub fn sweep(&self) {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix('w')).and_then(|n| n.split_once('-')) else {
                continue;
            };
            let Ok(pid) = pid.0.parse::<u32>() else { continue };
            if pid != std::process::id()
                && !Path::new(&format!("/proc/{pid}")).exists()
                && let Err(e) = remove_tree(&entry.path())
            {
                tracing::warn!(folder = %entry.path().display(), error = %e, "cannot remove a dead executor's job folder");
            }
        }
    }

    fn spare(&self) -> std::sync::MutexGuard<'_, Vec<PathBuf>> {
        self.spare.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An empty folder for one job.
    pub fn take(&self) -> std::io::Result<PathBuf> {
        if let Some(p) = self.spare().pop() {
            return Ok(p);
        }
        self.make(self.chown)
    }

    /// A new folder for one sealed job, owned by `owner` (the executor's own user when `None`).
    /// It is never a spare and never becomes one: hand it to [`Folders::discard`] after the job.
    pub fn take_sealed(&self, owner: Option<(u32, u32)>) -> std::io::Result<PathBuf> {
        self.make(owner)
    }

    fn make(&self, owner: Option<(u32, u32)>) -> std::io::Result<PathBuf> {
        let path = self.root.join(format!("w{}-{}", std::process::id(), self.next.fetch_add(1, Ordering::Relaxed)));
        // A leftover of an earlier executor with the same process id goes first.
        remove_tree(&path)?;
        std::fs::create_dir(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(MODE))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
        }
        Ok(path)
    }

    /// Removes a folder after its job, whatever it holds (links inside are removed, never followed).
    pub fn discard(&self, path: PathBuf) {
        discard(&path)
    }

    /// Takes a folder back after its job: kept when the job left it as it was given; otherwise
    /// handed back, to be removed with [`discard_off_thread`].
    #[must_use = "a folder handed back must be removed"]
    pub fn give_back(&self, path: PathBuf) -> Option<PathBuf> {
        if self.pristine(&path) {
            self.spare().push(path);
            None
        } else {
            Some(path)
        }
    }

    /// Empty, a real folder (not a link), with the mode and owner it was made with.
    fn pristine(&self, path: &Path) -> bool {
        let Ok(meta) = std::fs::symlink_metadata(path) else { return false };
        meta.is_dir()
            && meta.mode() & 0o7777 == MODE
            && (meta.uid(), meta.gid()) == self.owner
            && std::fs::read_dir(path).is_ok_and(|mut entries| entries.next().is_none())
    }
}

/// Removes a job's folder, saying why in the log when it cannot.
fn discard(path: &Path) {
    if let Err(e) = remove_tree(path) {
        tracing::warn!(folder = %path.display(), error = %e, "cannot remove a job folder");
    }
}

/// Removes a job's folder on a blocking thread, and waits for it. A job may leave millions of
/// files: removed on the executor's one runtime thread, they held up every other job of the
/// executor, their output and their leases' heartbeats, for as long as the removal took.
pub async fn discard_off_thread(path: PathBuf) {
    if let Err(e) = tokio::task::spawn_blocking(move || discard(&path)).await {
        tracing::error!(error = %e, "removing a job folder failed");
    }
}

/// Removes `path` and everything under it without recursion: however deep the tree, the stack
/// stays the same size and at most three descriptors are open. Links are removed, never
/// followed; a folder moved away while it is being emptied stops the removal with an error
/// rather than letting it go on somewhere else. Missing already counts as removed.
pub(crate) fn remove_tree(path: &Path) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) if !m.is_dir() => return std::fs::remove_file(path),
        Ok(_) => {}
    }
    let top = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::new(ErrorKind::InvalidInput, "a folder path holds a NUL byte"))?;
    // SAFETY: `top` is NUL-terminated; open returns a new descriptor or -1.
    let mut dir = Level::new(unsafe { libc::open(top.as_ptr(), DIR_FLAGS) }, None)?;
    dir.read()?;
    // The folders above the one open now (their descriptors closed), each with what is left in it.
    let mut above: Vec<Level> = Vec::new();
    // Times a folder was found filled again after it was emptied: something still writes in it.
    let mut refilled = 0;
    loop {
        if let Some(name) = dir.pending.pop() {
            // SAFETY: `dir.fd` is open and `name` is NUL-terminated.
            let fd = unsafe { libc::openat(dir.fd, name.as_ptr(), DIR_FLAGS) };
            if fd < 0 {
                let e = Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::ENOENT) => {}
                    // Replaced by a file or a link since it was listed: removed as such.
                    Some(libc::ENOTDIR | libc::ELOOP) => dir.unlink(&name, 0)?,
                    _ => return Err(e),
                }
                continue;
            }
            let mut child = Level::new(fd, Some(name))?;
            child.read()?;
            dir.close();
            above.push(std::mem::replace(&mut dir, child));
            continue;
        }
        let Some(mut parent) = above.pop() else { break };
        // Back up through `..`, which must be the very folder this one was entered from.
        // SAFETY: `dir.fd` is open and the name is a NUL-terminated literal.
        let up = Level::new(unsafe { libc::openat(dir.fd, c"..".as_ptr(), DIR_FLAGS) }, None)?;
        if up.id != parent.id {
            return Err(Error::other(format!(
                "a folder under {} was moved while it was being removed",
                path.display()
            )));
        }
        parent.fd = up.into_fd();
        let name = dir.name.take().expect("a folder below the top has a name");
        dir = parent;
        match dir.unlink(&name, libc::AT_REMOVEDIR) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) && refilled < REFILLS => {
                refilled += 1;
                dir.pending.push(name);
            }
            r => r?,
        }
    }
    drop(dir);
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// How every folder is opened for removal: never through a link.
const DIR_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;

/// Folders found filled again after they were emptied, before the removal gives up.
const REFILLS: u32 = 100;

/// One folder being emptied: what is not a folder goes as it is listed, and the folders in it
/// wait in `pending`.
struct Level {
    /// Open while this is the folder being worked in; -1 above it.
    fd: libc::c_int,
    /// Device and inode, to know it again when coming back up.
    id: (u64, u64),
    /// Its name in the folder above (none for the top).
    name: Option<CString>,
    pending: Vec<CString>,
}

impl Level {
    /// Takes `fd` (closed on every path from here on; -1 gives the last OS error).
    fn new(fd: libc::c_int, name: Option<CString>) -> std::io::Result<Level> {
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut level = Level { fd, id: (0, 0), name, pending: Vec::new() };
        // SAFETY: an all-zero stat is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` is a valid stat to write.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        level.id = (st.st_dev, st.st_ino);
        Ok(level)
    }

    /// Lists the folder: removes what is not a folder, and keeps the folders for later.
    fn read(&mut self) -> std::io::Result<()> {
        // The listing gets a descriptor of its own, so that closing it leaves `fd` open.
        // SAFETY: `self.fd` is open; F_DUPFD_CLOEXEC returns a new descriptor or -1.
        let own = unsafe { libc::fcntl(self.fd, libc::F_DUPFD_CLOEXEC, 0) };
        if own < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `own` is an open folder descriptor, owned by the stream once this succeeds.
        let stream = unsafe { libc::fdopendir(own) };
        if stream.is_null() {
            let e = std::io::Error::last_os_error();
            // SAFETY: fdopendir failed, so `own` is still ours to close, once.
            unsafe { libc::close(own) };
            return Err(e);
        }
        let listed = loop {
            // SAFETY: `stream` is open; the entry is valid until the next readdir or closedir.
            let entry = unsafe { libc::readdir(stream) };
            if entry.is_null() {
                break Ok(());
            }
            // SAFETY: `entry` is non-null and its name is NUL-terminated.
            let (name, kind) = unsafe { (CStr::from_ptr((*entry).d_name.as_ptr()), (*entry).d_type) };
            if matches!(name.to_bytes(), b"." | b"..") {
                continue;
            }
            let folder = match kind {
                libc::DT_DIR => true,
                libc::DT_UNKNOWN => {
                    // SAFETY: an all-zero stat is a valid value to be overwritten.
                    let mut st: libc::stat = unsafe { std::mem::zeroed() };
                    // SAFETY: `self.fd` is open, `name` NUL-terminated, `st` writable; a link
                    // is looked at, not followed.
                    let r = unsafe { libc::fstatat(self.fd, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
                    r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFDIR
                }
                _ => false,
            };
            if folder {
                self.pending.push(name.to_owned());
            } else if let Err(e) = self.unlink(name, 0) {
                break Err(e);
            }
        };
        // SAFETY: `stream` is open and closed once, with its descriptor.
        unsafe { libc::closedir(stream) };
        listed
    }

    /// Removes `name` in this folder (`AT_REMOVEDIR`: an empty folder); gone already is fine.
    fn unlink(&self, name: &CStr, flags: libc::c_int) -> std::io::Result<()> {
        // SAFETY: `self.fd` is open and `name` is NUL-terminated.
        if unsafe { libc::unlinkat(self.fd, name.as_ptr(), flags) } == 0 {
            return Ok(());
        }
        match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            e => Err(e),
        }
    }

    fn close(&mut self) {
        if self.fd >= 0 {
            // SAFETY: `fd` is open and owned by this level; it is closed once.
            unsafe { libc::close(self.fd) };
            self.fd = -1;
        }
    }

    /// Gives up this level's descriptor without closing it.
    fn into_fd(mut self) -> libc::c_int {
        std::mem::replace(&mut self.fd, -1)
    }
}

impl Drop for Level {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_folder_is_reused_and_anything_left_behind_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let folders = Folders::new(dir.path(), None);
        let a = folders.take().unwrap();
        assert_eq!(std::fs::metadata(&a).unwrap().mode() & 0o7777, MODE);
        assert_eq!(folders.give_back(a.clone()), None);
        assert_eq!(folders.take().unwrap(), a, "an untouched folder is used again");

        // A file left behind: the folder goes, and the next job gets a new, empty one.
        std::fs::write(a.join(".hidden"), b"left by a job").unwrap();
        folders.discard(folders.give_back(a.clone()).unwrap());
        assert!(!a.exists());
        let b = folders.take().unwrap();
        assert_ne!(b, a);
        assert_eq!(std::fs::read_dir(&b).unwrap().count(), 0);

        // A changed mode: not reused either.
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o777)).unwrap();
        folders.discard(folders.give_back(b.clone()).unwrap());
        assert!(!b.exists());

        // A folder replaced by a link is removed, never followed.
        let c = folders.take().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), b"not the executor's").unwrap();
        std::fs::remove_dir(&c).unwrap();
        std::os::unix::fs::symlink(&target, &c).unwrap();
        folders.discard(folders.give_back(c.clone()).unwrap());
        assert!(target.join("keep").exists(), "the link was followed");
        assert_ne!(folders.take().unwrap(), c);

        // The folders of an executor that is gone are swept; a live one's are not.
        let gone = dir.path().join(format!("w{}-0", u32::MAX - 1));
        std::fs::create_dir(&gone).unwrap();
        std::fs::write(gone.join("left"), b"x").unwrap();
        let live = folders.take().unwrap();
        folders.sweep();
        assert!(!gone.exists());
        assert!(live.exists() && target.exists());
    }

    #[test]
    fn a_sealed_folder_is_new_and_never_used_again_even_when_left_empty() {
        let dir = tempfile::tempdir().unwrap();
        let folders = Folders::new(dir.path(), None);
        let spare = folders.take().unwrap();
        assert_eq!(folders.give_back(spare.clone()), None);
        let sealed = folders.take_sealed(None).unwrap();
        assert_ne!(sealed, spare, "a spare folder went to a sealed job");
        assert_eq!(std::fs::metadata(&sealed).unwrap().mode() & 0o7777, MODE);
        assert_eq!(std::fs::read_dir(&sealed).unwrap().count(), 0);
        folders.discard(sealed.clone());
        assert!(!sealed.exists());
        assert_eq!(folders.take().unwrap(), spare);
        assert!(!dir.path().join(sealed.file_name().unwrap()).exists());
    }
    /// Makes `depth` folders one inside the other under `top`, a file in each, without ever
    /// naming the whole path (it is far longer than a path may be).
    fn nest(top: &Path, depth: usize) {
        let c = CString::new(top.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: plain system calls on descriptors opened and closed here.
        unsafe {
            let mut fd = libc::open(c.as_ptr(), DIR_FLAGS);
            assert!(fd >= 0);
            for _ in 0..depth {
                assert_eq!(libc::mkdirat(fd, c"d".as_ptr(), 0o700), 0);
                let f = libc::openat(fd, c"f".as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC, 0o600);
                assert!(f >= 0);
                libc::close(f);
                let next = libc::openat(fd, c"d".as_ptr(), DIR_FLAGS);
                assert!(next >= 0);
                libc::close(fd);
                fd = next;
            }
            libc::close(fd);
        }
    }

    #[test]
    fn a_folder_of_any_depth_goes_on_a_small_stack_with_few_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("deep");
        std::fs::create_dir(&deep).unwrap();
        nest(&deep, 20_000);
        let open_before = std::fs::read_dir("/proc/self/fd").unwrap().count();
        // 64 KiB of stack: a removal that recursed per level would overflow it many times over.
        let removed = {
            let deep = deep.clone();
            std::thread::Builder::new().stack_size(64 * 1024).spawn(move || remove_tree(&deep)).unwrap().join().unwrap()
        };
        removed.unwrap();
        assert!(!deep.exists());
        assert_eq!(std::fs::read_dir("/proc/self/fd").unwrap().count(), open_before, "a descriptor was left open");
    }

    #[test]
    fn a_removed_tree_takes_what_it_holds_and_never_what_its_links_point_to() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(outside.join("inner")).unwrap();
        std::fs::write(outside.join("inner/keep"), b"not the job's").unwrap();
        let job = dir.path().join("job");
        for d in ["a/b/c", "a/e", "wide"] {
            std::fs::create_dir_all(job.join(d)).unwrap();
        }
        for i in 0..500 {
            std::fs::create_dir(job.join(format!("wide/{i}"))).unwrap();
            std::fs::write(job.join(format!("wide/{i}/x")), b"x").unwrap();
        }
        std::fs::write(job.join("a/b/c/file"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, job.join("a/link")).unwrap();
        std::os::unix::fs::symlink(outside.join("inner"), job.join("a/b/c/link")).unwrap();
        std::os::unix::fs::symlink("/nowhere", job.join("dangling")).unwrap();
        let fifo = CString::new(job.join("a/e/fifo").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo only makes a node at a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        remove_tree(&job).unwrap();
        assert!(!job.exists());
        assert_eq!(std::fs::read(outside.join("inner/keep")).unwrap(), b"not the job's");

        // A link or file in place of the folder is removed itself; a missing one is no error.
        std::os::unix::fs::symlink(&outside, &job).unwrap();
        remove_tree(&job).unwrap();
        assert!(std::fs::symlink_metadata(&job).is_err() && outside.join("inner/keep").exists());
        remove_tree(&job).unwrap();
    }
}
