//! This executor process's instance id, and the one of a predecessor that died on the same
//! workspace. The master's lease ids start with the instance id of the process they were
//! handed to; a process that finds its predecessor dead names it in its first poll, and the
//! master ends that process's leases at once instead of waiting for them to run out.

use std::path::Path;

/// The file in the workspace that names the process running as executor `name` on it, and
/// its instance id. One file per name: executors of different names may share a workspace,
/// and each must find its own predecessor. The name goes in hashed, as it may hold any
/// character and any length; no name (the executor token's own) keeps the plain file.
fn file(name: Option<&str>) -> String {
    match name {
        None => "executor.instance".to_string(),
        Some(n) => format!("executor.{}.instance", &agentos_core::sha256_hex(n.as_bytes())[..16]),
    }
}

/// This process's instance id (16 lower-case hex characters, 64 random bits) and, when the
/// workspace names another process of executor `name` that is no longer alive, that
/// process's instance id.
pub fn claim(workspace: &Path, name: Option<&str>) -> std::io::Result<(String, Option<String>)> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(format!("no randomness for an instance id: {e}")))?;
    let mine = hex::encode(bytes);
    let file = file(name);
    let path = workspace.join(&file);
    let me = std::process::id();
    let replaces = std::fs::read_to_string(&path).ok().and_then(|text| dead_predecessor(&text, me));
    sweep_unfinished(workspace);
    // Written whole or not at all: a process killed while writing leaves the old file.
    let tmp = workspace.join(format!("{file}.tmp-{me}"));
    std::fs::write(&tmp, format!("{me} {mine}\n"))?;
    std::fs::rename(&tmp, &path)?;
    Ok((mine, replaces))
}

/// Removes the temporary files of processes killed between writing and renaming them.
fn sweep_unfinished(workspace: &Path) {
    let Ok(entries) = std::fs::read_dir(workspace) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.starts_with("executor."))
            .and_then(|n| n.rsplit_once(".instance.tmp-"))
            .and_then(|(_, pid)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !alive(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The instance id the file names, when its process is another one and is not alive. A pid
/// taken since by an unrelated process reads as alive: the leases then run out as before.
fn dead_predecessor(text: &str, me: u32) -> Option<String> {
    let (pid, id) = text.trim().split_once(' ')?;
    let pid: u32 = pid.parse().ok()?;
    (agentos_core::job::is_valid_instance(id) && pid != me && !alive(pid)).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_predecessor_is_named_and_a_live_one_or_a_damaged_file_is_not() {
        let ws = tempfile::tempdir().unwrap();
        let (first, none) = claim(ws.path(), None).unwrap();
        assert_eq!((first.len(), none), (16, None));
        // The file names this (live) process: nothing to replace.
        let (second, none) = claim(ws.path(), None).unwrap();
        assert_ne!(first, second);
        assert_eq!(none, None);
        // A process that ended: a child, waited for.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        std::fs::write(ws.path().join(file(None)), format!("{dead} 0123456789abcdef\n")).unwrap();
        let (third, replaces) = claim(ws.path(), None).unwrap();
        assert_eq!(replaces.as_deref(), Some("0123456789abcdef"));
        assert_eq!(
            std::fs::read_to_string(ws.path().join(file(None))).unwrap(),
            format!("{} {third}\n", std::process::id())
        );
        // A live process other than this one (pid 1), and files that do not read.
        for text in
            ["1 0123456789abcdef\n".to_string(), format!("{dead} NOT-HEX-AT-ALL!!\n"), "garbage".into(), String::new()]
        {
            std::fs::write(ws.path().join(file(None)), text.as_bytes()).unwrap();
            assert_eq!(claim(ws.path(), None).unwrap().1, None, "{text:?}");
        }
    }
    #[test]
    fn executors_of_different_names_on_one_workspace_each_find_their_own_predecessor() {
        let ws = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        // `a` died; `b`, started after it on the same workspace, lives (this process).
        std::fs::write(ws.path().join(file(Some("a"))), format!("{dead} 0123456789abcdef\n")).unwrap();
        let (b, none) = claim(ws.path(), Some("b")).unwrap();
        assert_eq!(none, None);
        // `a` restarted still finds its own predecessor, not `b`'s live process.
        assert_eq!(claim(ws.path(), Some("a")).unwrap().1.as_deref(), Some("0123456789abcdef"));
        assert_eq!(
            std::fs::read_to_string(ws.path().join(file(Some("b")))).unwrap(),
            format!("{} {b}\n", std::process::id())
        );
        // Names that are not file names are hashed into one.
        assert_eq!(file(Some("../../etc/passwd")).len(), "executor.0123456789abcdef.instance".len());
    }

    #[test]
    fn a_temporary_file_left_by_a_killed_process_is_removed_and_a_live_ones_is_not() {
        let ws = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let left = ws.path().join(format!("{}.tmp-{dead}", file(Some("a"))));
        let writing = ws.path().join(format!("{}.tmp-1", file(None)));
        let other = ws.path().join(format!("notes.instance.tmp-{dead}"));
        for f in [&left, &writing, &other] {
            std::fs::write(f, "1 0123456789abcdef\n").unwrap();
        }
        claim(ws.path(), Some("b")).unwrap();
        assert!(!left.exists());
        assert!(writing.exists(), "pid 1 is alive: its file may be mid-write");
        assert!(other.exists(), "not one of ours");
    }
}
