//! Working folders: every job starts in an empty folder that only the user scripts run as may
//! enter. A folder its job left empty, with its mode and owner as they were made, is kept for
//! a later job; anything else is removed. A sealed job's folder is always new and always removed. Making and removing a folder per job costs the file
//! system a block allocation and a free (with a discard on SSDs) each time, which showed as
//! a sixth of the executor's CPU per job; looking into an empty folder costs a few system calls.

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
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
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
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(MODE))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
        }
        Ok(path)
    }

    /// Removes a folder after its job, whatever it holds (links inside are removed, never followed).
    pub fn discard(&self, path: PathBuf) {
        if let Err(e) = std::fs::remove_dir_all(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(folder = %path.display(), error = %e, "cannot remove a job folder");
        }
    }

    /// Takes a folder back after its job: kept when the job left it as it was given, removed
    /// otherwise.
    pub fn give_back(&self, path: PathBuf) {
        if self.pristine(&path) {
            self.spare().push(path);
        } else {
            self.discard(path);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_folder_is_reused_and_anything_left_behind_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let folders = Folders::new(dir.path(), None);
        let a = folders.take().unwrap();
        assert_eq!(std::fs::metadata(&a).unwrap().mode() & 0o7777, MODE);
        folders.give_back(a.clone());
        assert_eq!(folders.take().unwrap(), a, "an untouched folder is used again");

        // A file left behind: the folder goes, and the next job gets a new, empty one.
        std::fs::write(a.join(".hidden"), b"left by a job").unwrap();
        folders.give_back(a.clone());
        assert!(!a.exists());
        let b = folders.take().unwrap();
        assert_ne!(b, a);
        assert_eq!(std::fs::read_dir(&b).unwrap().count(), 0);

        // A changed mode: not reused either.
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o777)).unwrap();
        folders.give_back(b.clone());
        assert!(!b.exists());

        // A folder replaced by a link is removed, never followed.
        let c = folders.take().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), b"not the executor's").unwrap();
        std::fs::remove_dir(&c).unwrap();
        std::os::unix::fs::symlink(&target, &c).unwrap();
        folders.give_back(c.clone());
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
        folders.give_back(spare.clone());
        let sealed = folders.take_sealed(None).unwrap();
        assert_ne!(sealed, spare, "a spare folder went to a sealed job");
        assert_eq!(std::fs::metadata(&sealed).unwrap().mode() & 0o7777, MODE);
        assert_eq!(std::fs::read_dir(&sealed).unwrap().count(), 0);
        folders.discard(sealed.clone());
        assert!(!sealed.exists());
        assert_eq!(folders.take().unwrap(), spare);
        assert!(!dir.path().join(sealed.file_name().unwrap()).exists());
    }
}
