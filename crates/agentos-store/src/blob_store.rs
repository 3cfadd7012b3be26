//! The content-addressed blob store: immutable bytes named by their sha256.

use async_trait::async_trait;

use agentos_core::urn::BlobUrn;

use crate::StoreError;

#[async_trait]
pub trait BlobStore: Send + Sync + 'static {
    /// Stores `bytes` under `urn`, atomically and durably. Storing the same content again is a no-op
    /// (or a repair, when the stored copy no longer matches).
    async fn put(&self, urn: &BlobUrn, bytes: &[u8]) -> Result<(), StoreError>;
    /// The stored bytes, as they are. Use [`crate::VerifyBlobStore`] to have them checked.
    async fn get(&self, urn: &BlobUrn) -> Result<Vec<u8>, StoreError>;
    /// Whether a read crosses the network (an object store): [`crate::VerifyBlobStore`] then
    /// keeps the small blobs it has verified, by digest, instead of reading them at every use.
    fn remote(&self) -> bool {
        false
    }
}
