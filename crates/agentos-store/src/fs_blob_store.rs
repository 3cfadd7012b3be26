//! Blobs as files in a local folder: `<root>/<namespace>/<sha[0..2]>/<sha>`, written by temp file, fsync and rename.

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use agentos_core::sha256_hex;
use agentos_core::urn::BlobUrn;

use crate::{BlobStore, StoreError};

/// Blobs up to this size are read on the calling thread.
const INLINE_READ_BYTES: u64 = 64 * 1024;

pub struct FsBlobStore {
    root: PathBuf,
}

impl FsBlobStore {
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        create_private_dir(&root)?;
        Ok(FsBlobStore { root })
    }

    /// Every blob stored, by namespace and digest (the extension of a URN is not part of where
    /// a blob lives). Temp files of writes under way are left out.
    pub fn list(&self) -> Result<Vec<BlobUrn>, StoreError> {
        let mut out = Vec::new();
        list_under(&self.root, &self.root, &mut out)?;
        out.sort_by_key(|u| u.to_string());
        Ok(out)
    }

    /// The file of a blob. Namespace and digest are validated by [`BlobUrn`], so no
    /// component can climb out of the root.
    pub fn path_of(&self, urn: &BlobUrn) -> PathBuf {
        let sha = urn.sha256();
        self.root.join(urn.namespace()).join(&sha[..2]).join(sha)
    }
}

/// Collects the blobs under `dir`: files `<namespace>/<sha[0..2]>/<sha>`.
fn list_under(root: &Path, dir: &Path, out: &mut Vec<BlobUrn>) -> Result<(), StoreError> {
    let entries = std::fs::read_dir(dir).map_err(|e| StoreError::io(format!("listing {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io(format!("listing {}", dir.display()), e))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| StoreError::io(format!("reading {}", path.display()), e))?;
        if kind.is_dir() {
            list_under(root, &path, out)?;
            continue;
        }
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        let is_digest = name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        let Some(fan) = path.parent().filter(|p| p.file_name().and_then(|f| f.to_str()) == name.get(..2)) else {
            continue;
        };
        let Some(namespace) = fan.parent().and_then(|ns| ns.strip_prefix(root).ok()).and_then(|ns| ns.to_str()) else {
            continue;
        };
        if is_digest && let Ok(urn) = BlobUrn::new(namespace, name, None) {
            out.push(urn);
        }
    }
    Ok(())
}

/// Folders of blobs are their owner's alone (0700), whatever the umask: blobs hold scripts and
/// command output that other users of the machine must not read. (Blob files need no such
/// step: temp files are created 0600 and the rename keeps that mode.)
fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| StoreError::io(format!("creating {}", dir.display()), e))
}

fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    create_private_dir(dir)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .map_err(|e| StoreError::io(format!("creating a temp file in {}", dir.display()), e))?;
    tmp.write_all(bytes).map_err(|e| StoreError::io("writing blob", e))?;
    tmp.as_file().sync_all().map_err(|e| StoreError::io("syncing blob", e))?;
    tmp.persist(path).map_err(|e| StoreError::io(format!("renaming into {}", path.display()), e.error))?;
    // The rename is durable only once the folder entry is.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(format!("syncing {}", dir.display()), e))?;
    Ok(())
}

#[async_trait]
impl BlobStore for FsBlobStore {
    async fn put(&self, urn: &BlobUrn, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.path_of(urn);
        let dir = path.parent().expect("blob paths have a parent").to_path_buf();
        let bytes = bytes.to_vec();
        let sha = urn.sha256().to_string();
        tokio::task::spawn_blocking(move || {
            // Deduplicate: an intact copy is left alone; a damaged one is replaced.
            if let Ok(existing) = std::fs::read(&path)
                && sha256_hex(&existing) == sha
            {
                return Ok(());
            }
            write_atomically(&dir, &path, &bytes)
        })
        .await
        .map_err(|e| StoreError::io("blob writer", std::io::Error::other(e)))?
    }

    async fn get(&self, urn: &BlobUrn) -> Result<Vec<u8>, StoreError> {
        let path = self.path_of(urn);
        let read = {
            let urn = urn.clone();
            move || match std::fs::read(&path) {
                Ok(b) => Ok(b),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(StoreError::BlobNotFound(urn)),
                Err(e) => Err(StoreError::io(format!("reading {}", path.display()), e)),
            }
        };
        // Scripts are mostly small and read at every fire: a small read costs less than the
        // hand-off to a blocking thread, so it happens in place. Large blobs go to the pool.
        let small = std::fs::metadata(self.path_of(urn)).is_ok_and(|m| m.len() <= INLINE_READ_BYTES);
        if small {
            return read();
        }
        tokio::task::spawn_blocking(read).await.map_err(|e| StoreError::io("blob reader", std::io::Error::other(e)))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VerifyBlobStore;

    #[tokio::test]
    async fn altered_bytes_are_reported_corrupt_and_rewrite_repairs() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FsBlobStore::open(dir.path()).unwrap();
        let content = b"echo hello";
        let urn = BlobUrn::new("tool-catalog/scripts", &sha256_hex(content), Some("sh")).unwrap();
        let path = fs.path_of(&urn);
        let store = VerifyBlobStore::new(std::sync::Arc::new(fs));
        store.put(&urn, content).await.unwrap();
        assert_eq!(store.get(&urn).await.unwrap(), content);

        std::fs::write(&path, b"echo HACKED").unwrap();
        let err = store.get(&urn).await.unwrap_err();
        assert!(matches!(err, StoreError::BlobCorrupt { .. }), "{err}");
        let err = store.get_checked(&urn, Some(3)).await.unwrap_err();
        assert!(err.to_string().contains("expected"), "{err}");

        store.put(&urn, content).await.unwrap();
        assert_eq!(store.get(&urn).await.unwrap(), content);

        let wrong = BlobUrn::new("x", &sha256_hex(b"other"), None).unwrap();
        assert!(store.put(&wrong, content).await.is_err());
        assert!(matches!(store.get(&wrong).await.unwrap_err(), StoreError::BlobNotFound(_)));
    }

    #[tokio::test]
    async fn every_stored_blob_is_listed_and_temp_files_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path()).unwrap();
        let a = BlobUrn::new("tool-catalog/scripts", &sha256_hex(b"a"), Some("sh")).unwrap();
        let b = BlobUrn::new("job-output/default", &sha256_hex(b"b"), None).unwrap();
        store.put(&a, b"a").await.unwrap();
        store.put(&b, b"b").await.unwrap();
        let fan = store.path_of(&a).parent().unwrap().to_path_buf();
        std::fs::write(fan.join(".tmp-half-written"), b"x").unwrap();
        let listed: Vec<String> = store.list().unwrap().iter().map(|u| u.to_string()).collect();
        let without_ext = BlobUrn::new("tool-catalog/scripts", &sha256_hex(b"a"), None).unwrap();
        assert_eq!(listed, vec![b.to_string(), without_ext.to_string()]);
    }

    #[tokio::test]
    async fn blobs_and_their_folders_are_private_to_their_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        let fs = FsBlobStore::open(&root).unwrap();
        let urn = BlobUrn::new("tool-catalog/scripts", &sha256_hex(b"echo"), Some("sh")).unwrap();
        fs.put(&urn, b"echo").await.unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let file = fs.path_of(&urn);
        assert_eq!(mode(&file), 0o600);
        for folder in file.ancestors().skip(1).take_while(|p| p.starts_with(&root)) {
            assert_eq!(mode(folder), 0o700, "{}", folder.display());
        }
    }
}
