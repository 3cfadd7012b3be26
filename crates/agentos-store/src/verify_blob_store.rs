//! A blob store wrapper that checks size and hash on every read and refuses to store bytes under the wrong name.

use std::sync::Arc;

use async_trait::async_trait;

use agentos_core::sha256_hex;
use agentos_core::urn::BlobUrn;

use crate::{BlobStore, StoreError};

/// Verification is a decorator, not a duty of each backend: wrap any store in this.
pub struct VerifyBlobStore {
    inner: Arc<dyn BlobStore>,
}

impl VerifyBlobStore {
    pub fn new(inner: Arc<dyn BlobStore>) -> Self {
        VerifyBlobStore { inner }
    }

    /// Reads and checks the size (when known) and the sha256. Corrupt bytes are never returned.
    pub async fn get_checked(&self, urn: &BlobUrn, expected_size: Option<u64>) -> Result<Vec<u8>, StoreError> {
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
