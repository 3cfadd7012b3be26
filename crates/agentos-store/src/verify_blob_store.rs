//! A blob store wrapper that checks size and hash on every read and refuses to store bytes under the wrong name.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use agentos_core::sha256_hex;
use agentos_core::urn::BlobUrn;

use crate::{BlobStore, StoreError};

/// Verification is a decorator, not a duty of each backend: wrap any store in this.
///
/// Over a remote store it also keeps the blobs up to [`CACHED_BLOB_BYTES`] it has verified
/// (at most [`CACHE_BYTES`] in all, the oldest let go first), keyed by their digest: a script
/// is read from the object store once, not at every hand-out of a job (a GET of S3 takes
/// milliseconds). What it keeps was hashed when read, and a blob's name is its hash, so the
/// bytes it answers are the pinned ones; a copy changed in the store afterwards is refused at
/// the next read that misses the cache.
pub struct VerifyBlobStore {
    inner: Arc<dyn BlobStore>,
    cache: Option<Mutex<Cache>>,
}

/// Largest blob kept by the cache of a remote store.
pub const CACHED_BLOB_BYTES: usize = 256 * 1024;
/// Bytes the cache of a remote store keeps at most.
pub const CACHE_BYTES: usize = 64 * 1024 * 1024;

#[derive(Default)]
struct Cache {
    blobs: HashMap<String, Arc<Vec<u8>>>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Cache {
    fn insert(&mut self, key: String, bytes: Arc<Vec<u8>>) {
        if self.blobs.contains_key(&key) {
            return;
        }
        self.bytes += bytes.len();
        self.blobs.insert(key.clone(), bytes);
        self.order.push_back(key);
        while self.bytes > CACHE_BYTES {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(b) = self.blobs.remove(&old) {
                self.bytes -= b.len();
            }
        }
    }
}

impl VerifyBlobStore {
    pub fn new(inner: Arc<dyn BlobStore>) -> Self {
        let cache = inner.remote().then(|| Mutex::new(Cache::default()));
        VerifyBlobStore { inner, cache }
    }

    fn cached(&self, urn: &BlobUrn) -> Option<Arc<Vec<u8>>> {
        let cache = self.cache.as_ref()?.lock().unwrap_or_else(|p| p.into_inner());
        cache.blobs.get(&urn.to_string()).cloned()
    }

    /// Reads and checks the size (when known) and the sha256. Corrupt bytes are never returned.
    pub async fn get_checked(&self, urn: &BlobUrn, expected_size: Option<u64>) -> Result<Vec<u8>, StoreError> {
        if let Some(bytes) = self.cached(urn)
            && expected_size.is_none_or(|s| s == bytes.len() as u64)
        {
            return Ok(bytes.to_vec());
        }
        let bytes = self.checked_read(urn, expected_size).await?;
        if let Some(cache) = &self.cache
            && bytes.len() <= CACHED_BLOB_BYTES
        {
            cache.lock().unwrap_or_else(|p| p.into_inner()).insert(urn.to_string(), Arc::new(bytes.clone()));
        }
        Ok(bytes)
    }

    async fn checked_read(&self, urn: &BlobUrn, expected_size: Option<u64>) -> Result<Vec<u8>, StoreError> {
        let bytes = self.inner.get(urn).await?;
        if let Some(size) = expected_size
            && bytes.len() as u64 != size
        {
            return Err(StoreError::BlobCorrupt {
                urn: urn.clone(),
                why: format!("{} bytes stored, {size} expected", bytes.len()),
            });
        }
        let actual = sha256_hex(&bytes);
        if actual != urn.sha256() {
            return Err(StoreError::BlobCorrupt { urn: urn.clone(), why: format!("stored bytes hash to {actual}") });
        }
        Ok(bytes)
    }
}

#[async_trait]
impl BlobStore for VerifyBlobStore {
    async fn put(&self, urn: &BlobUrn, bytes: &[u8]) -> Result<(), StoreError> {
        let actual = sha256_hex(bytes);
        if actual != urn.sha256() {
            return Err(StoreError::BlobCorrupt {
                urn: urn.clone(),
                why: format!("refusing to store bytes that hash to {actual}"),
            });
        }
        self.inner.put(urn, bytes).await
    }

    async fn get(&self, urn: &BlobUrn) -> Result<Vec<u8>, StoreError> {
        self.get_checked(urn, None).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Blobs in memory that say they are remote, counting reads; `corrupt` damages every read.
    #[derive(Default)]
    struct Remote {
        blobs: Mutex<HashMap<String, Vec<u8>>>,
        reads: AtomicUsize,
        corrupt: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl BlobStore for Remote {
        async fn put(&self, urn: &BlobUrn, bytes: &[u8]) -> Result<(), StoreError> {
            self.blobs.lock().unwrap().insert(urn.to_string(), bytes.to_vec());
            Ok(())
        }
        async fn get(&self, urn: &BlobUrn) -> Result<Vec<u8>, StoreError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let mut b = self
                .blobs
                .lock()
                .unwrap()
                .get(&urn.to_string())
                .cloned()
                .ok_or(StoreError::BlobNotFound(urn.clone()))?;
            if self.corrupt.load(Ordering::SeqCst) {
                b.push(b'!');
            }
            Ok(b)
        }
        fn remote(&self) -> bool {
            true
        }
    }

    #[tokio::test]
    async fn a_remote_stores_verified_blobs_are_read_once_and_a_damaged_one_is_never_kept() {
        let remote = Arc::new(Remote::default());
        let store = VerifyBlobStore::new(remote.clone());
        let (good, bad) = (b"echo pinned".to_vec(), b"echo other".to_vec());
        let urn = |b: &[u8]| BlobUrn::new("tool-catalog/scripts", &sha256_hex(b), Some("sh")).unwrap();
        store.put(&urn(&good), &good).await.unwrap();
        store.put(&urn(&bad), &bad).await.unwrap();
        // Damaged at its first read: refused, and not kept.
        remote.corrupt.store(true, Ordering::SeqCst);
        assert!(matches!(store.get(&urn(&bad)).await, Err(StoreError::BlobCorrupt { .. })));
        remote.corrupt.store(false, Ordering::SeqCst);
        assert_eq!(store.get(&urn(&bad)).await.unwrap(), bad);
        // Read once, then answered from what was verified, even once the store's copy changes.
        assert_eq!(store.get_checked(&urn(&good), Some(good.len() as u64)).await.unwrap(), good);
        let reads = remote.reads.load(Ordering::SeqCst);
        remote.corrupt.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            assert_eq!(store.get(&urn(&good)).await.unwrap(), good);
        }
        assert_eq!(remote.reads.load(Ordering::SeqCst), reads, "no read of the store");
    }
}
