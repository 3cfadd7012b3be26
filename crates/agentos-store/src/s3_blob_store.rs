//! Blobs as objects of an S3-compatible store: `<prefix>/<namespace>/<sha[0..2]>/<sha>`, the
//! same layout as [`crate::FsBlobStore`]. A PUT of S3 is atomic (an object is whole or absent)
//! and durable when it answers, so no temp object is needed. Wrap it in
//! [`crate::VerifyBlobStore`] like any store: every read is hashed again, a changed object refused.

use async_trait::async_trait;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path;
use object_store::{BackoffConfig, ClientConfigKey, MultipartUpload, RetryConfig};
use object_store::{ObjectStoreExt, PutPayload};

use agentos_core::urn::BlobUrn;

use crate::{BlobStore, StoreError};

pub struct S3BlobStore {
    /// Writes and listings: each request ends within its limit (`AWS_TIMEOUT`, 15 s).
    store: AmazonS3,
    /// Reads: the body of a large blob on a slow link may take longer than that, so a read
    /// ends when the store goes silent for 15 s (`AWS_READ_TIMEOUT`), not at a total limit.
    reader: AmazonS3,
    prefix: String,
}

/// The size of each part of a blob written in parts: S3's smallest. A blob larger than one part
/// is written part by part, each its own request within the request limit, so that a large
/// blob needs no longer limit (one PUT of 64 MiB needs 4.5 MB/s to end within 15 s).
const PART: usize = 5 << 20;

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
        // a blob waited that long (a stalled store held a registration for 180 s). A write or
        // listing waits at most 15 s (`AWS_TIMEOUT`; a large blob goes in parts, each within
        // it), a read at most 15 s without a byte (`AWS_READ_TIMEOUT`), a connection 2 s
        // (`AWS_CONNECT_TIMEOUT`), and a failed request is tried again at most 3 times within
        // 10 s.
        let unset = |name: &str| std::env::var_os(name).is_none();
        if unset("AWS_CONNECT_TIMEOUT") {
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
        // Each variable applies to its own client only, though the environment gives both to each.
        let var = |name: &str| std::env::var(name).unwrap_or_else(|_| REQUEST_TIMEOUT.to_string());
        let key = |k| AmazonS3ConfigKey::Client(k);
        // A write's read timeout runs from its start until the answer's headers (a total limit
        // per request, part by part): the same as its total limit, never shorter.
        let writer = builder
            .clone()
            .with_config(key(ClientConfigKey::Timeout), var("AWS_TIMEOUT"))
            .with_config(key(ClientConfigKey::ReadTimeout), var("AWS_TIMEOUT"));
        // A read: only what no read should outlast as a total; silence is what `read_timeout` ends.
        let reader = builder
            .with_config(key(ClientConfigKey::Timeout), "1h")
            .with_config(key(ClientConfigKey::ReadTimeout), var("AWS_READ_TIMEOUT"));
        let store = writer.build().map_err(|e| bad(&e.to_string()))?;
        let reader = reader.build().map_err(|e| bad(&e.to_string()))?;
        Ok(S3BlobStore { store, reader, prefix: prefix.to_string() })
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
        let why: String =
            said(&e, Limit::Request).split_whitespace().collect::<Vec<_>>().join(" ").chars().take(400).collect();
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

/// Which limit a request that timed out was under.
#[derive(Clone, Copy)]
enum Limit {
    /// A write's or listing's whole request (`AWS_TIMEOUT`).
    Request,
    /// A read's silence (`AWS_READ_TIMEOUT`).
    Read,
}

fn failed(what: &str, urn: &BlobUrn, e: object_store::Error, limit: Limit) -> StoreError {
    StoreError::Unavailable(format!("{what} blob {urn} in the object store: {}", said(&e, limit)))
}

/// An object store's error in words: one that could not be reached or did not answer in time
/// says so, under which limit, and what to do, rather than the client's report of its retries
/// ("Generic S3 error: Error performing PUT … after 10 retries, max_retries: 10, retry_timeout:
/// 180s - HTTP error: error sending request"). Anything else is the store's own words.
fn said(e: &object_store::Error, limit: Limit) -> String {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| REQUEST_TIMEOUT.to_string());
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        // The HTTP client's own error says best what happened: a connection that timed out is
        // both a timeout and a failed connection (the store's client calls it a timeout).
        if let Some(r) = c.downcast_ref::<reqwest::Error>() {
            if r.is_connect() && r.is_timeout() {
                return format!(
                    "the store cannot be reached: no connection within {} (AWS_CONNECT_TIMEOUT sets the limit); try again when it is back",
                    std::env::var("AWS_CONNECT_TIMEOUT").unwrap_or_else(|_| "2s".into())
                );
            }
            if r.is_connect() {
                return format!("the store cannot be reached ({}); try again when it is back", deepest(r));
            }
            if r.is_timeout() {
                return match limit {
                    Limit::Request => format!(
                        "the store did not answer within {} (AWS_TIMEOUT sets the limit); try again when it is back",
                        var("AWS_TIMEOUT")
                    ),
                    Limit::Read => format!(
                        "the store sent nothing for {} (AWS_READ_TIMEOUT sets the limit); try again when it is back",
                        var("AWS_READ_TIMEOUT")
                    ),
                };
            }
        }
        if let Some(h) = c.downcast_ref::<HttpError>()
            && h.kind() == HttpErrorKind::Connect
        {
            return format!("the store cannot be reached ({}); try again when it is back", deepest(h));
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
        let key = self.key_of(urn);
        if bytes.len() <= PART {
            self.store
                .put(&key, PutPayload::from(bytes.to_vec()))
                .await
                .map_err(|e| failed("storing", urn, e, Limit::Request))?;
            return Ok(());
        }
        // In parts, one after another: the object appears whole when the last is in, or not
        // at all (an upload that failed is aborted, its parts dropped).
        let mut upload = self.store.put_multipart(&key).await.map_err(|e| failed("storing", urn, e, Limit::Request))?;
        let sent = async {
            for part in bytes.chunks(PART) {
                upload.put_part(PutPayload::from(part.to_vec())).await?;
            }
            upload.complete().await
        }
        .await;
        if let Err(e) = sent {
            // Aborted on its own time: the caller is answered now, not after another request
            // to a store that may be stalled.
            tokio::spawn(async move {
                let _ = upload.abort().await;
            });
            return Err(failed("storing", urn, e, Limit::Request));
        }
        Ok(())
    }

    fn remote(&self) -> bool {
        true
    }

    async fn get(&self, urn: &BlobUrn) -> Result<Vec<u8>, StoreError> {
        match self.reader.get(&self.key_of(urn)).await {
            Ok(r) => Ok(r.bytes().await.map_err(|e| failed("reading", urn, e, Limit::Read))?.to_vec()),
            Err(object_store::Error::NotFound { .. }) => Err(StoreError::BlobNotFound(urn.clone())),
            Err(e) => Err(failed("reading", urn, e, Limit::Read)),
        }
    }
}

impl std::fmt::Debug for S3BlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3BlobStore({}, prefix {:?})", self.store, self.prefix)
    }
}
