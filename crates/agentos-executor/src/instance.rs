//! This executor process's instance id, and the one of a predecessor that died on the same
//! workspace. The master's lease ids start with the instance id of the process they were
//! handed to; a process that finds its predecessor dead names it in its first poll, and the
//! master ends that process's leases at once instead of waiting for them to run out.

use std::path::Path;

/// The file in the workspace that names the process using it and its instance id.
const FILE: &str = "executor.instance";

/// This process's instance id (16 lower-case hex characters, 64 random bits) and, when the
/// workspace names another process that is no longer alive, that process's instance id.
pub fn claim(workspace: &Path) -> std::io::Result<(String, Option<String>)> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(format!("no randomness for an instance id: {e}")))?;
    let mine = hex::encode(bytes);
    let path = workspace.join(FILE);
    let me = std::process::id();
    let replaces = std::fs::read_to_string(&path).ok().and_then(|text| dead_predecessor(&text, me));
    // Written whole or not at all: a process killed while writing leaves the old file.
    let tmp = workspace.join(format!("{FILE}.{me}"));
    std::fs::write(&tmp, format!("{me} {mine}\n"))?;
    std::fs::rename(&tmp, &path)?;
    Ok((mine, replaces))
}

/// The instance id the file names, when its process is another one and is not alive. A pid
/// taken since by an unrelated process reads as alive: the leases then run out as before.
fn dead_predecessor(text: &str, me: u32) -> Option<String> {
    let (pid, id) = text.trim().split_once(' ')?;
    let pid: u32 = pid.parse().ok()?;
    (agentos_core::job::is_valid_instance(id) && pid != me && !Path::new(&format!("/proc/{pid}")).exists())
        .then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_predecessor_is_named_and_a_live_one_or_a_damaged_file_is_not() {
        let ws = tempfile::tempdir().unwrap();
        let (first, none) = claim(ws.path()).unwrap();
        assert_eq!((first.len(), none), (16, None));
        // The file names this (live) process: nothing to replace.
        let (second, none) = claim(ws.path()).unwrap();
        assert_ne!(first, second);
        assert_eq!(none, None);
        // A process that ended: a child, waited for.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        std::fs::write(ws.path().join(FILE), format!("{dead} 0123456789abcdef\n")).unwrap();
        let (third, replaces) = claim(ws.path()).unwrap();
        assert_eq!(replaces.as_deref(), Some("0123456789abcdef"));
        assert_eq!(std::fs::read_to_string(ws.path().join(FILE)).unwrap(), format!("{} {third}\n", std::process::id()));
        // A live process other than this one (pid 1), and files that do not read.
        for text in
            ["1 0123456789abcdef\n".to_string(), format!("{dead} NOT-HEX-AT-ALL!!\n"), "garbage".into(), String::new()]
        {
            std::fs::write(ws.path().join(FILE), text.as_bytes()).unwrap();
            assert_eq!(claim(ws.path()).unwrap().1, None, "{text:?}");
        }
    }
}
