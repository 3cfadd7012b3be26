//! Blobs as objects of an S3-compatible store: `<prefix>/<namespace>/<sha[0..2]>/<sha>`, the
//! same layout as [`crate::FsBlobStore`]. A PUT of S3 is atomic (an object is whole or absent)
//! and durable when it answers, so no temp object is needed. Wrap it in
//! [`crate::VerifyBlobStore`] like any store: every read is hashed again, a changed object refused.

use async_trait::async_trait;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path;
use object_store::{BackoffConfig, ClientConfigKey, RetryConfig};
use object_store::{ObjectStoreExt, PutPayload};

use agentos_core::urn::BlobUrn;

use crate::{BlobStore, StoreError};

pub struct S3BlobStore {
    store: AmazonS3,
    prefix: String,
}

impl S3BlobStore {
    /// The store at `url` (`s3://bucket/prefix`), with credentials, region and endpoint from the
    /// usual AWS variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
    /// `AWS_ENDPOINT_URL`, and `AWS_ALLOW_HTTP=true` for an endpoint without TLS).
    pub fn open(url: &str) -> Result<S3BlobStore, StoreError> {
        let bad = |why: &str| {
            StoreError::Config(format!("--blobs {url:?}: {why}; give s3://BUCKET/PREFIX (or a folder for local blobs)"))
        };
        let rest = url.strip_prefix("s3://").ok_or_else(|| bad("not an s3:// URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|p| p == "." || p == "..") {
            return Err(bad("the prefix may not hold . or .."));
        }
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        // Standard AWS names the endpoint AWS_ENDPOINT_URL; object_store reads AWS_ENDPOINT.
        if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL")
            && std::env::var_os("AWS_ENDPOINT").is_none()
        {
            builder = builder.with_endpoint(endpoint);
        }
        // A store that stops answering is said so within seconds: the client's defaults wait 30 s
        // a request and retry for three minutes, and every registration, hand-out and read of
        // a blob waited that long (a stalled store held a registration for 180 s). A request
        // waits at most 15 s (`AWS_TIMEOUT` sets another limit, for large blobs on a slow
        // link), a connection 2 s (`AWS_CONNECT_TIMEOUT`), and a failed one is tried again at
        // most 3 times within 10 s.
        if std::env::var_os("AWS_TIMEOUT").is_none() {
            builder = builder.with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), REQUEST_TIMEOUT);
        }
        if std::env::var_os("AWS_CONNECT_TIMEOUT").is_none() {
            builder = builder.with_config(AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout), "2s");
        }
        builder = builder.with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(1),
                base: 2.0,
            },
            max_retries: 3,
            retry_timeout: Duration::from_secs(10),
        });
        let store = builder.build().map_err(|e| bad(&e.to_string()))?;
        Ok(S3BlobStore { store, prefix: prefix.to_string() })
    }

    /// Asks the store for one listing of the prefix, so that a master given a bucket that does
    /// not exist or credentials it refuses says so when it starts, in one line, rather than at
    /// the first registration as an outage. A store that does not answer is unavailable.
    pub async fn check(&self, url: &str) -> Result<(), StoreError> {
        use object_store::ObjectStore;
        let prefix = (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()));
        let Err(e) = self.store.list_with_delimiter(prefix.as_ref()).await else { return Ok(()) };
        let text = e.to_string();
        let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(400).collect();
        let refused =
            matches!(e, object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. })
                || ["NoSuchBucket", "SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied"]
                    .iter()
                    .any(|c| text.contains(c));
        if refused {
            return Err(StoreError::Config(format!(
                "--blobs {url:?}: the object store refused this master ({line}); check the bucket and the AWS_* credentials"
            )));
        }
        let why: String = said(&e).split_whitespace().collect::<Vec<_>>().join(" ").chars().take(400).collect();
        Err(StoreError::Unavailable(format!("--blobs {url:?}: the object store did not answer: {why}")))
    }

    /// The object of a blob. Namespace and digest are validated by [`BlobUrn`].
    pub fn key_of(&self, urn: &BlobUrn) -> Path {
        let sha = urn.sha256();
        let key = format!("{}/{}/{sha}", urn.namespace(), &sha[..2]);
        if self.prefix.is_empty() { Path::from(key) } else { Path::from(format!("{}/{key}", self.prefix)) }
    }
}

/// How long one request to the store may take, unless `AWS_TIMEOUT` says otherwise.
const REQUEST_TIMEOUT: &str = "15s";

fn failed(what: &str, urn: &BlobUrn, e: object_store::Error) -> StoreError {
    StoreError::Unavailable(format!("{what} blob {urn} in the object store: {}", said(&e)))
}

/// An object store's error in words: one that could not be reached or did not answer in time
/// says so and what to do, rather than the client's report of its retries ("Generic S3 error:
/// Error performing PUT … after 10 retries, max_retries: 10, retry_timeout: 180s - HTTP
/// error: error sending request"). Anything else is the store's own words.
fn said(e: &object_store::Error) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(h) = c.downcast_ref::<HttpError>() {
            let limit = std::env::var("AWS_TIMEOUT").unwrap_or_else(|_| REQUEST_TIMEOUT.to_string());
            match h.kind() {
                HttpErrorKind::Connect => {
                    return format!("the store cannot be reached ({}); try again when it is back", deepest(h));
                }
                HttpErrorKind::Timeout => {
                    return format!(
                        "the store did not answer within {limit} (AWS_TIMEOUT sets the limit); try again when it is back"
                    );
                }
                _ => {}
            }
        }
        cause = c.source();
    }
    e.to_string()
}

/// The innermost cause of an error: "Connection refused (os error 111)".
fn deepest(e: &(dyn std::error::Error + 'static)) -> String {
    let mut e = e;
    while let Some(inner) = e.source() {
        e = inner;
    }
    e.to_string()
}

#[async_trait]
impl BlobStore for S3BlobStore {
    async fn put(&self, urn: &BlobUrn, bytes: &[u8]) -> Result<(), StoreError> {
        // Writing again is cheaper than reading to compare, and repairs a damaged copy.
        self.store
            .put(&self.key_of(urn), PutPayload::from(bytes.to_vec()))
            .await
            .map_err(|e| failed("storing", urn, e))?;
        Ok(())
    }

    fn remote(&self) -> bool {
        true
    }

    async fn get(&self, urn: &BlobUrn) -> Result<Vec<u8>, StoreError> {
        match self.store.get(&self.key_of(urn)).await {
            Ok(r) => Ok(r.bytes().await.map_err(|e| failed("reading", urn, e))?.to_vec()),
            Err(object_store::Error::NotFound { .. }) => Err(StoreError::BlobNotFound(urn.clone())),
            Err(e) => Err(failed("reading", urn, e)),
        }
    }
}

impl std::fmt::Debug for S3BlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3BlobStore({}, prefix {:?})", self.store, self.prefix)
    }
}
