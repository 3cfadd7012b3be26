//! This executor process's instance id, and those of predecessors that died on the same
//! workspace. The master's lease ids start with the instance id of the process they were
//! handed to; a process that finds predecessors dead names them in its polls, and the master
//! ends the leases they held at once instead of waiting for them to run out.
//!
//! Each process keeps `executor.<instance>.instance` in the workspace, locked (`flock`) for as
//! long as it lives: the kernel drops the lock when the process dies, however it dies, so a
//! file that can be locked is a dead process's. Process ids are not used to tell: they are
//! reused, and an executor in a container has the same one (often 1) at every start.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A dead process's file of another executor is kept this long after it was found dead, for
/// that executor's own successor, then removed.
const KEEP_OTHERS: Duration = Duration::from_secs(30 * 24 * 3600);
/// `<pid> <instance>`: what executors wrote before the file per process, one per workspace.
const LEGACY: &str = "executor.instance";
/// The most of a file that is read: an instance id, a space, an identity and a newline.
const MAX_FILE: u64 = 256;

/// What makes an executor one executor to the master, hashed (the credential is secret): its
/// credential and its display name.
pub fn identity(token: &str, name: Option<&str>) -> String {
    agentos_core::sha256_hex(format!("{token}\n{}", name.unwrap_or("")).as_bytes())[..16].to_string()
}

/// This process's claim on its workspace.
pub struct Claim {
    /// This process's instance id (16 lower-case hex characters, 64 random bits).
    pub instance: String,
    /// Instance ids of processes that ran an executor on this workspace and died: this
    /// executor's first, then the newest; at most as many as one poll may name.
    pub replaces: Vec<String>,
    /// The files of this executor's dead processes among them, to remove once a master has
    /// heard `replaces` (until then a successor of this process finds them again).
    pub heard: Vec<PathBuf>,
    path: PathBuf,
    /// Locked while this process lives.
    _file: File,
}

impl Claim {
    /// Removes this process's file when it stops in good order (its leases are handed back).
    pub fn release(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Draws this process's instance id, writes and locks its file, and finds the processes that
/// died on the workspace. Naming another executor's dead process takes nothing from it: the
/// master ends only the leases the poller's own executor handed out.
pub fn claim(workspace: &Path, identity: &str) -> std::io::Result<Claim> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(format!("no randomness for an instance id: {e}")))?;
    let instance = hex::encode(bytes);
    // Written whole, locked, then renamed in place: a file under its final name is always whole
    // and locked from its first moment. A process killed before the rename leaves the
    // temporary file, unlocked, which the next start removes.
    let tmp = workspace.join(format!("executor.{instance}.instance.tmp"));
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    std::io::Write::write_all(&mut file, format!("{instance} {identity}\n").as_bytes())?;
    if !try_lock(&file) {
        return Err(std::io::Error::other(format!("cannot lock {}", tmp.display())));
    }
    let path = workspace.join(format!("executor.{instance}.instance"));
    std::fs::rename(&tmp, &path)?;

    let now = SystemTime::now();
    let mut dead: Vec<Dead> = Vec::new();
    for entry in std::fs::read_dir(workspace)?.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let entry_path = entry.path();
        if name == LEGACY {
            if let Some(id) = legacy(&entry_path) {
                let when = entry.metadata().and_then(|m| m.modified()).unwrap_or(now);
                dead.push(Dead { own: true, when, id, file: Some(entry_path) });
            }
            continue;
        }
        let Some(rest) = name.strip_prefix("executor.") else { continue };
        if rest.ends_with(".instance.tmp") {
            if open_unlocked(&entry_path).is_some() {
                let _ = std::fs::remove_file(&entry_path);
            }
        } else if rest.ends_with(".instance") {
            // Locked: its process lives (this one's own file among them).
            let Some(mut f) = open_unlocked(&entry_path) else { continue };
            let Some((id, of)) = read_claim(&mut f) else { continue };
            if of == identity {
                dead.push(Dead { own: true, when: now, id, file: Some(entry_path) });
            } else {
                // Another executor's: kept for its successor, named as found dead now.
                let kept = workspace.join(format!("executor.{id}.dead"));
                if std::fs::rename(&entry_path, &kept).is_ok() {
                    let _ = f.set_modified(now);
                }
                dead.push(Dead { own: false, when: now, id, file: None });
            }
        } else if rest.ends_with(".dead") {
            let Some(mut f) = open_unlocked(&entry_path) else { continue };
            let Some((id, of)) = read_claim(&mut f) else { continue };
            let found = f.metadata().and_then(|m| m.modified()).unwrap_or(now);
            if of == identity {
                dead.push(Dead { own: true, when: found, id, file: Some(entry_path) });
            } else if now.duration_since(found).is_ok_and(|age| age > KEEP_OTHERS) {
                let _ = std::fs::remove_file(&entry_path);
            } else {
                dead.push(Dead { own: false, when: found, id, file: None });
            }
        }
    }
    // This executor's own first, then the newest, as many as one poll may name.
    dead.sort_by(|a, b| b.own.cmp(&a.own).then(b.when.cmp(&a.when)));
    dead.dedup_by(|a, b| a.id == b.id);
    dead.truncate(agentos_core::job::MAX_REPLACES);
    // A file is removed only once the id it names has gone out: those cut above stay.
    let (replaces, heard) = dead.into_iter().map(|d| (d.id, d.file)).unzip::<_, _, Vec<_>, Vec<_>>();
    Ok(Claim { instance, replaces, heard: heard.into_iter().flatten().collect(), path, _file: file })
}

/// A process that died on the workspace.
struct Dead {
    /// It ran as this executor.
    own: bool,
    /// When it was found dead (now, for a file first found so at this start), or its file's time.
    when: SystemTime,
    id: String,
    /// Its file, to remove once a master has heard `id` (this executor's only).
    file: Option<PathBuf>,
}

/// Opens a regular file (never through a link, never blocking on a pipe) and locks it: `Some`
/// when no live process holds it.
fn open_unlocked(path: &Path) -> Option<File> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).ok()?;
    (f.metadata().ok()?.is_file() && try_lock(&f)).then_some(f)
}

fn try_lock(f: &File) -> bool {
    // SAFETY: flock on a descriptor this function borrows; the lock lives as long as the file.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// `<instance> <identity>`, when the file holds them.
fn read_claim(f: &mut File) -> Option<(String, String)> {
    let mut text = String::new();
    f.take(MAX_FILE).read_to_string(&mut text).ok()?;
    let (id, of) = text.trim().split_once(' ')?;
    agentos_core::job::is_valid_instance(id).then(|| (id.to_string(), of.to_string()))
}

/// The instance id in the file executors before the file per process wrote, when the process
/// it names (by pid: all those executors had) is gone.
fn legacy(path: &Path) -> Option<String> {
    let mut f = open_unlocked(path)?;
    let mut text = String::new();
    (&mut f).take(MAX_FILE).read_to_string(&mut text).ok()?;
    let (pid, id) = text.trim().split_once(' ')?;
    let pid: u32 = pid.parse().ok()?;
    let gone = pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists();
    (gone && agentos_core::job::is_valid_instance(id)).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(ws: &Path, name: &str, text: &str) -> PathBuf {
        let p = ws.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_process_that_died_is_named_and_a_live_one_is_not() {
        let ws = tempfile::tempdir().unwrap();
        let me = identity("t", None);
        let first = claim(ws.path(), &me).unwrap();
        assert_eq!((first.instance.len(), first.replaces.clone()), (16, vec![]));
        assert_eq!(std::fs::read_to_string(&first.path).unwrap(), format!("{} {me}\n", first.instance));
        // A second process while the first lives (holds its lock): nothing to replace.
        let second = claim(ws.path(), &me).unwrap();
        assert_ne!(first.instance, second.instance);
        assert!(second.replaces.is_empty());
        // The first dies, and its lock with it: named, and its file removed once heard.
        let (id, path) = (first.instance.clone(), first.path.clone());
        drop(first);
        let third = claim(ws.path(), &me).unwrap();
        assert_eq!((third.replaces.clone(), third.heard.clone()), (vec![id], vec![path]));
        // One that stops in good order leaves nothing to name.
        second.release();
        assert_eq!(claim(ws.path(), &me).unwrap().replaces, third.replaces);
    }

    #[test]
    fn files_that_do_not_read_or_are_not_files_are_passed_over() {
        for text in ["NOT-HEX-AT-ALL!! x\n", "garbage", "", &"0".repeat(10_000)] {
            let ws = tempfile::tempdir().unwrap();
            write(ws.path(), "executor.0000000000000001.instance", text);
            assert!(claim(ws.path(), "x").unwrap().replaces.is_empty(), "{text:?}");
        }
        let ws = tempfile::tempdir().unwrap();
        let target = write(ws.path(), "elsewhere", "00000000000000aa x\n");
        std::os::unix::fs::symlink(&target, ws.path().join("executor.00000000000000aa.instance")).unwrap();
        std::fs::create_dir(ws.path().join("executor.00000000000000bb.instance")).unwrap();
        let fifo = std::ffi::CString::new(
            ws.path().join("executor.00000000000000cc.dead").into_os_string().into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: mkfifo with a valid, NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(claim(ws.path(), "x").unwrap().replaces.is_empty(), "a link, a folder and a pipe are no claims");
    }

    #[test]
    fn executors_sharing_a_workspace_each_find_their_own_predecessor() {
        let ws = tempfile::tempdir().unwrap();
        let (a, b) = (identity("token-a", None), identity("token-b", Some("b")));
        write(ws.path(), "executor.00000000000000aa.instance", &format!("00000000000000aa {a}\n"));
        write(ws.path(), "executor.00000000000000bb.instance", &format!("00000000000000bb {b}\n"));
        // `a` restarted names both, its own first (the master ends only a's leases); b's file
        // is kept, as found dead now.
        let ca = claim(ws.path(), &a).unwrap();
        assert_eq!(ca.replaces, ["00000000000000aa", "00000000000000bb"]);
        assert_eq!(ca.heard, [ws.path().join("executor.00000000000000aa.instance")]);
        assert!(ws.path().join("executor.00000000000000bb.dead").exists());
        // So `b`, restarted after it, still finds its own, first.
        let cb = claim(ws.path(), &b).unwrap();
        assert_eq!(cb.replaces.first().map(String::as_str), Some("00000000000000bb"));
        assert_eq!(cb.heard, [ws.path().join("executor.00000000000000bb.dead")]);
        // The credential is in no file.
        assert!(!a.contains("token") && a.len() == 16);
        assert_ne!(identity("t", Some("a")), identity("t", Some("b")));
    }

    #[test]
    fn another_executors_dead_file_goes_thirty_days_after_it_was_found_dead() {
        let ws = tempfile::tempdir().unwrap();
        let old = write(ws.path(), "executor.00000000000000aa.dead", "00000000000000aa other\n");
        let recent = write(ws.path(), "executor.00000000000000bb.dead", "00000000000000bb other\n");
        File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(SystemTime::now() - KEEP_OTHERS - Duration::from_secs(60))
            .unwrap();
        assert_eq!(claim(ws.path(), "me").unwrap().replaces, ["00000000000000bb"]);
        assert!(!old.exists() && recent.exists());
    }

    #[test]
    fn the_file_of_an_executor_before_the_file_per_process_is_read_once() {
        let ws = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let legacy = write(ws.path(), LEGACY, &format!("{dead} 00000000000000aa\n"));
        let c = claim(ws.path(), "x").unwrap();
        assert_eq!((c.replaces.clone(), c.heard.clone()), (vec!["00000000000000aa".to_string()], vec![legacy]));
        // One that names a live process (an executor of the earlier version still running) is not.
        let ws = tempfile::tempdir().unwrap();
        write(ws.path(), LEGACY, "1 00000000000000aa\n");
        assert!(claim(ws.path(), "x").unwrap().replaces.is_empty());
    }

    #[test]
    fn a_temporary_file_left_by_a_killed_process_is_removed_and_a_live_ones_is_not() {
        let ws = tempfile::tempdir().unwrap();
        let left = write(ws.path(), "executor.00000000000000aa.instance.tmp", "00000000000000aa x\n");
        let writing = write(ws.path(), "executor.00000000000000bb.instance.tmp", "00000000000000bb x\n");
        let other = write(ws.path(), "notes.00000000000000cc.instance.tmp", "00000000000000cc x\n");
        let held = File::open(&writing).unwrap();
        assert!(try_lock(&held));
        assert!(claim(ws.path(), "x").unwrap().replaces.is_empty());
        assert!(!left.exists());
        assert!(writing.exists(), "its writer lives: it may be mid-write");
        assert!(other.exists(), "not one of ours");
    }
}
