//! The content-addressed script cache: `<workspace>/scripts/sha256/<digest>/<filename>`.

use std::io::Write;
use std::path::{Path, PathBuf};

use agentos_core::name::safe_filename;
use agentos_core::sha256_hex;

pub struct ScriptCache {
    root: PathBuf,
}

impl ScriptCache {
    pub fn new(workspace: &Path) -> Self {
        ScriptCache { root: workspace.join("scripts").join("sha256") }
    }

    /// The file of a script. `digest` must already be a verified lower-case hex sha256.
    pub fn path_of(&self, digest: &str, filename: &str) -> PathBuf {
        let name = safe_filename(filename).unwrap_or_else(|| "script".to_string());
        self.root.join(digest).join(name)
    }

    /// Makes sure the cached file holds exactly `content` (already verified against `digest`):
    /// the cached bytes are re-hashed before every run, and rewritten when they differ.
    /// Returns the path and whether the file was (re)written.
    pub fn materialize(&self, digest: &str, filename: &str, content: &[u8]) -> std::io::Result<(PathBuf, bool)> {
        let path = self.path_of(digest, filename);
        if let Ok(cached) = std::fs::read(&path)
            && sha256_hex(&cached) == digest
        {
            return Ok((path, false));
        }
        let dir = path.parent().expect("cache paths have a parent");
        std::fs::create_dir_all(dir)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        let mut tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir)?;
        tmp.write_all(content)?;
        // Readable by the user scripts run as, which need not be the executor's.
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o644))?;
        tmp.as_file().sync_all()?;
        tmp.persist(&path).map_err(|e| e.error)?;
        Ok((path, true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_altered_cached_file_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ScriptCache::new(dir.path());
        let content = b"echo pinned";
        let digest = sha256_hex(content);
        let (path, written) = cache.materialize(&digest, "run.sh", content).unwrap();
        assert!(written);
        assert_eq!(path, dir.path().join("scripts/sha256").join(&digest).join("run.sh"));
        assert!(!cache.materialize(&digest, "run.sh", content).unwrap().1, "an intact copy is reused");
        std::fs::write(&path, b"echo tampered").unwrap();
        assert!(cache.materialize(&digest, "run.sh", content).unwrap().1);
        assert_eq!(std::fs::read(&path).unwrap(), content);
        assert_eq!(cache.path_of(&digest, "../../x").file_name().unwrap(), "x");
    }
}
