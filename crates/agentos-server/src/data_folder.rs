//! The data folder's privacy: made 0700, and checked (or tightened) before the master opens
//! anything in it, so no other user of the machine can read its log, blobs or keys.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::serve_error::ServeError;

/// What a master does with a data folder that other users can read or enter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LooseDataFolder {
    /// Refuse to start, naming the command that fixes it: the operator chose this folder and
    /// should see what was open, rather than have a master change it behind their back.
    Refuse,
    /// Take away group and others' access (folders 0700, files 0600) and say so once in the
    /// log: `agentos up` owns its folder, and a first run should just work.
    Tighten,
}

/// Bits that let group or others read, write or enter.
const OPEN_TO_OTHERS: u32 = 0o077;

/// Creates the data folder (0700) if it does not exist, then makes sure neither it nor anything
/// in it is open to other users. Folders above it are created with the usual mode: `agentos up`
/// puts its executor's workspace beside the data folder, where the scripts' user must reach it.
pub(crate) fn prepare(data: &Path, loose: LooseDataFolder) -> Result<(), ServeError> {
    let io = |context: String| move |e| ServeError::Io { context, source: e };
    if let Some(parent) = data.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(data) {
        // Set again: the umask can only take bits away, and a fresh folder needs none taken.
        Ok(()) => std::fs::set_permissions(data, std::fs::Permissions::from_mode(0o700))
            .map_err(io(format!("setting the mode of {}", data.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(format!("creating {}", data.display()))(e)),
    }
    // The folder a link given as --data points at is the one to check (links under it are not followed).
    let data = &std::fs::canonicalize(data).map_err(io(format!("resolving {}", data.display())))?;
    // A file given as --data is refused before anything is read or changed (tightening would
    // otherwise make someone's file 0600 before the master failed to open anything in it).
    if !std::fs::metadata(data).map_err(io(format!("reading {}", data.display())))?.is_dir() {
        return Err(ServeError::NotAFolder(data.to_path_buf()));
    }
    let open = open_to_others(data).map_err(io(format!("reading {}", data.display())))?;
    if open.is_empty() {
        return Ok(());
    }
    let owned = std::fs::metadata(data).is_ok_and(|m| m.uid() == effective_uid());
    if loose == LooseDataFolder::Tighten && owned {
        for (path, meta) in &open {
            let mode = if meta.is_dir() { 0o700 } else { 0o600 };
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .map_err(io(format!("tightening {}", path.display())))?;
        }
        tracing::warn!(
            data = %data.display(),
            tightened = open.len(),
            "the data folder was open to other users: its folders are now 0700 and its files 0600"
        );
        return Ok(());
    }
    Err(ServeError::OpenToOthers { dir: data.to_path_buf(), found: describe(&open), fix: fix_command(data) })
}

/// The folder itself and every folder and file under it that group or others may read,
/// write or enter. Links are not followed (nor changed): what they point at is not ours.
fn open_to_others(data: &Path) -> std::io::Result<Vec<(PathBuf, std::fs::Metadata)>> {
    let mut open = Vec::new();
    let mut pending = vec![data.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                pending.push(entry?.path());
            }
        }
        if meta.mode() & OPEN_TO_OTHERS != 0 {
            open.push((path, meta));
        }
    }
    open.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(open)
}

/// The first few open paths with their modes, and how many more there are.
fn describe(open: &[(PathBuf, std::fs::Metadata)]) -> String {
    const SHOWN: usize = 3;
    let mut parts: Vec<String> =
        open.iter().take(SHOWN).map(|(p, m)| format!("{} is {:o}", p.display(), m.mode() & 0o777)).collect();
    if open.len() > SHOWN {
        parts.push(format!("{} more", open.len() - SHOWN));
    }
    parts.join(", ")
}

/// `chmod -R go-rwx <dir>`, with the folder's absolute path quoted for a POSIX shell when it
/// needs to be, so the line can be pasted as it is from any folder.
fn fix_command(data: &Path) -> String {
    let absolute = std::path::absolute(data).unwrap_or_else(|_| data.to_path_buf());
    let text = absolute.display().to_string();
    let plain = text.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+,:@%".contains(c));
    let quoted = if plain { text } else { format!("'{}'", text.replace('\'', r"'\''")) };
    format!("chmod -R go-rwx {quoted}")
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o777
    }

    /// A data folder as an older master left it: folder 0755, files 0644, blob folders 0755.
    fn loose_folder(root: &Path) -> PathBuf {
        let data = root.join("data");
        std::fs::create_dir_all(data.join("blobs/ns")).unwrap();
        std::fs::write(data.join("events.db"), b"").unwrap();
        std::fs::write(data.join("blobs/ns/blob"), b"").unwrap();
        for (p, m) in
            [("", 0o755), ("blobs", 0o755), ("blobs/ns", 0o755), ("events.db", 0o644), ("blobs/ns/blob", 0o644)]
        {
            std::fs::set_permissions(data.join(p), std::fs::Permissions::from_mode(m)).unwrap();
        }
        data
    }

    #[test]
    fn a_fresh_folder_is_its_owners_alone() {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("a/b/data");
        prepare(&data, LooseDataFolder::Refuse).unwrap();
        assert_eq!(mode(&data), 0o700);
        // The folders above keep the usual mode: a workspace beside the data folder must be reachable.
        assert_ne!(mode(&root.path().join("a/b")) & 0o005, 0);
    }

    #[test]
    fn a_loose_folder_is_refused_with_the_command_that_fixes_it() {
        let root = tempfile::tempdir().unwrap();
        let data = loose_folder(root.path());
        let err = prepare(&data, LooseDataFolder::Refuse).unwrap_err().to_string();
        assert!(err.contains(&format!("chmod -R go-rwx {}", data.display())), "{err}");
        assert!(err.contains(&format!("{} is 755", data.display())), "{err}");
        assert!(err.contains("2 more"), "{err}");
        assert_eq!(mode(&data), 0o755, "a refusing master changes nothing");
    }

    #[test]
    fn a_loose_folder_is_tightened_when_asked() {
        let root = tempfile::tempdir().unwrap();
        let data = loose_folder(root.path());
        prepare(&data, LooseDataFolder::Tighten).unwrap();
        for (p, m) in
            [("", 0o700), ("blobs", 0o700), ("blobs/ns", 0o700), ("events.db", 0o600), ("blobs/ns/blob", 0o600)]
        {
            assert_eq!(mode(&data.join(p)), m, "{p}");
        }
        prepare(&data, LooseDataFolder::Refuse).expect("a tightened folder is accepted");
    }

    #[test]
    fn a_data_folder_given_as_a_link_is_checked_where_it_points() {
        let root = tempfile::tempdir().unwrap();
        let data = loose_folder(root.path());
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&data, &link).unwrap();
        assert!(prepare(&link, LooseDataFolder::Refuse).is_err());
        prepare(&link, LooseDataFolder::Tighten).unwrap();
        assert_eq!(mode(&data), 0o700);
    }

    #[test]
    fn a_file_given_as_the_data_folder_is_refused_and_left_as_it_was() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("notes.txt");
        std::fs::write(&file, b"mine").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        for loose in [LooseDataFolder::Refuse, LooseDataFolder::Tighten] {
            let err = prepare(&file, loose).unwrap_err();
            assert!(matches!(err, ServeError::NotAFolder(_)), "{err}");
            assert!(err.to_string().contains("is not a folder"), "{err}");
            assert_eq!(mode(&file), 0o644, "{loose:?} changed the file's mode");
            assert_eq!(std::fs::read(&file).unwrap(), b"mine");
        }
    }

    #[test]
    fn the_fix_is_quoted_for_the_shell_when_needed() {
        assert_eq!(fix_command(Path::new("/srv/agentos")), "chmod -R go-rwx /srv/agentos");
        assert_eq!(fix_command(Path::new("/srv/it's mine")), r"chmod -R go-rwx '/srv/it'\''s mine'");
    }
}
