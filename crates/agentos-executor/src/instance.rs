//! This executor process's instance id, and those of predecessors that died on the same
//! workspace. The master's lease ids start with the instance id of the process they were
//! handed to; a process that finds predecessors dead names them in its first poll, and the
//! master ends the leases they held at once instead of waiting for them to run out.

use std::path::Path;
use std::time::{Duration, SystemTime};

/// A dead process's file of another executor is kept this long for that executor's own
/// successor, then removed.
const KEEP_OTHERS: Duration = Duration::from_secs(30 * 24 * 3600);

/// `<pid> <instance>`: what executors wrote before the file per process, one per workspace.
const LEGACY: &str = "executor.instance";

/// The file in which process `pid` names its instance id and the executor it runs as.
fn file(pid: u32) -> String {
    format!("executor.{pid}.instance")
}

/// What makes an executor one executor to the master, hashed (the credential is secret): its
/// credential and its display name.
pub fn identity(token: &str, name: Option<&str>) -> String {
    agentos_core::sha256_hex(format!("{token}\n{}", name.unwrap_or("")).as_bytes())[..16].to_string()
}

/// This process's instance id (16 lower-case hex characters, 64 random bits), and the instance
/// ids of every process that ran an executor on this workspace and is no longer alive: the
/// master ends only the leases its own executor handed them, so naming another executor's
/// dead process takes nothing from anyone. The files of dead processes of this executor
/// (`identity`) are removed: this process now names them until a master has heard it.
/// Those of other executors are left for their own successors (or for `KEEP_OTHERS`).
pub fn claim(workspace: &Path, identity: &str) -> std::io::Result<(String, Vec<String>)> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(format!("no randomness for an instance id: {e}")))?;
    let mine = hex::encode(bytes);
    let me = std::process::id();
    let mut dead: Vec<(SystemTime, String)> = Vec::new();
    for entry in std::fs::read_dir(workspace)?.flatten() {
        let name = entry.file_name();
        let Some((pid, unfinished)) = name.to_str().and_then(parse_name) else { continue };
        if pid == me || alive(pid) {
            continue;
        }
        if unfinished {
            // Killed between writing and renaming its file: nothing was claimed by it.
            let _ = std::fs::remove_file(entry.path());
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
        let Some((instance, of)) = text.trim().split_once(' ') else { continue };
        let written = entry.metadata().and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
        if agentos_core::job::is_valid_instance(instance) {
            dead.push((written, instance.to_string()));
        }
        let stale = written.elapsed().is_ok_and(|age| age > KEEP_OTHERS);
        if of == identity || stale {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    // The one file per workspace that executors before the file per process wrote.
    let legacy = workspace.join(LEGACY);
    if let Ok(text) = std::fs::read_to_string(&legacy)
        && let Some((pid, instance)) = text.trim().split_once(' ')
        && let Ok(pid) = pid.parse::<u32>()
        && pid != me
        && !alive(pid)
    {
        if agentos_core::job::is_valid_instance(instance) {
            let written = std::fs::metadata(&legacy).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
            dead.push((written, instance.to_string()));
        }
        let _ = std::fs::remove_file(&legacy);
    }
    // The newest first, as many as one poll may name.
    dead.sort_by_key(|d| std::cmp::Reverse(d.0));
    dead.truncate(agentos_core::job::MAX_REPLACES);
    // Written whole or not at all: a process killed while writing leaves only the temporary file.
    let tmp = workspace.join(format!("{}.tmp", file(me)));
    std::fs::write(&tmp, format!("{mine} {identity}\n"))?;
    std::fs::rename(&tmp, workspace.join(file(me)))?;
    Ok((mine, dead.into_iter().map(|(_, id)| id).collect()))
}

/// `executor.<pid>.instance` → (pid, false); `executor.<pid>.instance.tmp` → (pid, true).
fn parse_name(name: &str) -> Option<(u32, bool)> {
    let rest = name.strip_prefix("executor.")?;
    let (pid, unfinished) = match rest.strip_suffix(".instance.tmp") {
        Some(pid) => (pid, true),
        None => (rest.strip_suffix(".instance")?, false),
    };
    Some((pid.parse().ok()?, unfinished))
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pid of a process that has ended (a child, waited for).
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn dead_predecessors_are_named_and_live_ones_or_damaged_files_are_not() {
        let ws = tempfile::tempdir().unwrap();
        let me = identity("t", None);
        let (first, none) = claim(ws.path(), &me).unwrap();
        assert_eq!((first.len(), none), (16, vec![]));
        assert_eq!(
            std::fs::read_to_string(ws.path().join(file(std::process::id()))).unwrap(),
            format!("{first} {me}\n")
        );
        // This process's own file names nothing to replace, and is written again.
        let (second, none) = claim(ws.path(), &me).unwrap();
        assert_ne!(first, second);
        assert_eq!(none, Vec::<String>::new());
        // A process that ended, of this executor: named, and its file removed.
        let dead = dead_pid();
        std::fs::write(ws.path().join(file(dead)), format!("0123456789abcdef {me}\n")).unwrap();
        assert_eq!(claim(ws.path(), &me).unwrap().1, vec!["0123456789abcdef".to_string()]);
        assert!(!ws.path().join(file(dead)).exists());
        // A live process other than this one (pid 1), and files that do not read.
        std::fs::write(ws.path().join(file(1)), format!("0123456789abcdef {me}\n")).unwrap();
        for text in ["NOT-HEX-AT-ALL!! x\n".to_string(), "garbage".into(), String::new()] {
            std::fs::write(ws.path().join(file(dead)), text.as_bytes()).unwrap();
            assert_eq!(claim(ws.path(), &me).unwrap().1, Vec::<String>::new(), "{text:?}");
        }
    }

    #[test]
    fn executors_sharing_a_workspace_each_find_their_own_predecessor() {
        let ws = tempfile::tempdir().unwrap();
        let (a, b) = (identity("token-a", None), identity("token-b", Some("b")));
        let (dead_a, dead_b) = (dead_pid(), dead_pid());
        std::fs::write(ws.path().join(file(dead_a)), format!("00000000000000aa {a}\n")).unwrap();
        std::fs::write(ws.path().join(file(dead_b)), format!("00000000000000bb {b}\n")).unwrap();
        // `a` restarted names both (the master ends only a's leases), and keeps b's file.
        let mut named = claim(ws.path(), &a).unwrap().1;
        named.sort();
        assert_eq!(named, ["00000000000000aa", "00000000000000bb"]);
        assert!(!ws.path().join(file(dead_a)).exists());
        // So `b`, restarted after it, still finds its own.
        assert_eq!(claim(ws.path(), &b).unwrap().1, ["00000000000000bb"]);
        assert!(!ws.path().join(file(dead_b)).exists());
        // The credential is not in any file.
        assert!(!a.contains("token") && a.len() == 16);
        assert_ne!(identity("t", Some("a")), identity("t", Some("b")));
    }

    #[test]
    fn the_file_of_an_executor_before_the_file_per_process_is_read_once() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join(LEGACY), format!("{} 00000000000000aa\n", dead_pid())).unwrap();
        assert_eq!(claim(ws.path(), "x").unwrap().1, ["00000000000000aa"]);
        assert!(!ws.path().join(LEGACY).exists());
        // One that names a live process (an executor of the earlier version still running) stays.
        std::fs::write(ws.path().join(LEGACY), "1 00000000000000aa\n").unwrap();
        assert_eq!(claim(ws.path(), "x").unwrap().1, Vec::<String>::new());
        assert!(ws.path().join(LEGACY).exists());
    }

    #[test]
    fn a_temporary_file_left_by_a_killed_process_is_removed_and_a_live_ones_is_not() {
        let ws = tempfile::tempdir().unwrap();
        let left = ws.path().join(format!("{}.tmp", file(dead_pid())));
        let writing = ws.path().join(format!("{}.tmp", file(1)));
        let other = ws.path().join(format!("notes.{}.instance.tmp", dead_pid()));
        for f in [&left, &writing, &other] {
            std::fs::write(f, "0123456789abcdef x\n").unwrap();
        }
        assert_eq!(claim(ws.path(), "x").unwrap().1, Vec::<String>::new());
        assert!(!left.exists());
        assert!(writing.exists(), "pid 1 is alive: its file may be mid-write");
        assert!(other.exists(), "not one of ours");
    }
}
