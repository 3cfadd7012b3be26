//! Container images from the local registry: an image that serves HTTP and advertises an
//! OpenAPI document is imported once (pulled, started in a throwaway container, its document
//! read and imported as an http service's is), pinned by its registry digest, and cataloged as
//! an approved global toolkit. A call starts a container of `image@digest` on first use, keeps
//! it warm, stops it when idle, and sends the operation to it as an http service's call.
//!
//! The master never builds images, never pulls from another registry, and runs every container
//! with a non-root user, no capabilities, `no-new-privileges`, and pids and memory limits, on the
//! host's network (the engine here has no bridge), listening on a port the master chose (`PORT`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, ListContainersOptions, LogsOptions, RemoveContainerOptions,
};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use agentos_core::command::{HeaderFields, Plan, fields};
use agentos_core::entry::{Binding, BindingKind, DockerBinding, Status};
use agentos_core::event::GrantTarget;
use agentos_core::flags::Flag;
use agentos_core::urn::BlobUrn;
use agentos_core::{CoreError, DEFAULT_MODEL, ErrorKind, sha256_hex};

use super::http::OPENAPI_NAMESPACE;
use super::{Binder, Call, Outcome, ValueCall, ValueKind};
use crate::{Engine, EngineError, Principal};

/// The command that imports an image.
pub const IMPORT_IMAGE: &str = "TOOL_CATALOG_IMPORT_IMAGE";

/// The label of every container the master starts, naming the master's own label value, so a
/// restarted master removes what an earlier run of it left.
const OWNER_LABEL: &str = "agentos.owner";

/// The image label that says where the document is served.
const DOCUMENT_LABEL: &str = "agentos.openapi";

/// The largest document an image may serve.
const MAX_DOCUMENT: usize = 16 << 20;

/// How long a registry's answer about a tag is trusted.
const DIGEST_CACHE: Duration = Duration::from_secs(5);

/// How the master reaches Docker and runs containers.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The one registry images are imported from: `127.0.0.1:5001`.
    pub registry: String,
    /// The engine's socket.
    pub socket: String,
    /// Names the containers this master starts (label `agentos.owner`); a master removes those
    /// with its own value when it starts.
    pub owner: String,
    /// How long a container may take to listen, at import and at a call's start.
    pub start_timeout: Duration,
    /// A container unused this long is stopped.
    pub idle_stop: Duration,
    /// Containers running at once, at most.
    pub max_containers: usize,
    /// `--user` of every container.
    pub user: String,
    pub memory_bytes: i64,
    pub pids_limit: i64,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            registry: "127.0.0.1:5001".into(),
            socket: "/var/run/docker.sock".into(),
            owner: "agentos".into(),
            start_timeout: Duration::from_secs(10),
            idle_stop: Duration::from_secs(300),
            max_containers: 8,
            user: "65534:65534".into(),
            memory_bytes: 256 << 20,
            pids_limit: 128,
        }
    }
}

pub struct DockerKind;

#[async_trait]
impl Binder for DockerKind {
    fn kind(&self) -> BindingKind {
        BindingKind::Docker
    }

    fn register_command(&self) -> Option<&'static str> {
        Some(IMPORT_IMAGE)
    }

    fn global_only(&self) -> bool {
        true
    }

    fn registering(&self) -> &'static str {
        "import container images"
    }

    async fn plan(&self, engine: &Engine, _p: &Principal, body: Value) -> Result<Plan, EngineError> {
        let cmd: ImportImage = fields(IMPORT_IMAGE, body)?;
        cmd.plan(engine).await
    }

    fn pinned_blob<'b>(&self, binding: &'b Binding) -> Option<&'b str> {
        match binding {
            Binding::Docker(d) => Some(&d.openapi_urn),
            _ => None,
        }
    }

    fn secret_pin(&self, binding: &Binding) -> Option<String> {
        match binding {
            Binding::Docker(d) => Some(d.digest.trim_start_matches("sha256:").to_string()),
            _ => None,
        }
    }

    async fn invoke(&self, engine: &Engine, call: Call<'_>) -> Result<Outcome, EngineError> {
        let c = KIND.call(call)?;
        Ok(Outcome::Value(call_operation(engine, &c).await?))
    }

    async fn queue(&self, _engine: &Engine, call: Call<'_>) -> Result<String, EngineError> {
        Err(KIND.queue(&call))
    }
}

/// Calling needs `x` and the flag that reveals the kind.
const KIND: ValueKind = ValueKind { flag: Flag::Docker, plural: "containers", one: "a container", parts: "operations" };

/// `TOOL_CATALOG_IMPORT_IMAGE`: an image of the local registry, by reference.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImportImage {
    /// `127.0.0.1:5001/tools/echo:1`.
    pub image: String,
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    /// Secrets the container may receive as environment variables (each granted to this entry
    /// by the operator, `agentos secret grant NAME --tool ID`).
    #[serde(default)]
    pub secrets: Option<Vec<String>>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub capabilities: Option<Vec<String>>,
    /// How long one call may take, in milliseconds (the master's default and maximum apply).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// An image reference of the local registry: `registry/name:tag`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ImageRef {
    name: String,
    tag: String,
}

impl ImageRef {
    fn parse(image: &str, registry: &str) -> Result<ImageRef, CoreError> {
        let refused = |why: String| CoreError::bad_input("invalid_image", why);
        let Some(rest) = image.strip_prefix(registry).and_then(|r| r.strip_prefix('/')) else {
            return Err(CoreError::new(
                ErrorKind::Forbidden,
                "foreign_registry",
                format!(
                    "image {image:?} is not in the local registry {registry}: images are imported from it alone (push the image to {registry}/NAME:TAG first)"
                ),
            ));
        };
        if rest.contains('@') {
            return Err(refused(format!(
                "image {image:?}: name a tag, not a digest; the import pins the tag's digest"
            )));
        }
        let (name, tag) = match rest.rsplit_once(':') {
            Some((n, t)) if !n.is_empty() && !t.contains('/') => (n, t),
            _ => (rest, "latest"),
        };
        let name_ok = !name.is_empty()
            && name.split('/').all(|part| {
                !part.is_empty()
                    && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                    && part.as_bytes()[0].is_ascii_alphanumeric()
            });
        let tag_ok = !tag.is_empty()
            && tag.len() <= 128
            && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && tag.as_bytes()[0] != b'.'
            && tag.as_bytes()[0] != b'-';
        if !name_ok || !tag_ok {
            return Err(refused(format!("image {image:?} is not a valid reference: use {registry}/NAME[:TAG]")));
        }
        Ok(ImageRef { name: name.to_string(), tag: tag.to_string() })
    }
}

impl ImportImage {
    async fn plan(self, engine: &Engine) -> Result<Plan, EngineError> {
        super::check_timeout(engine, self.timeout_ms)?;
        let header = HeaderFields {
            name: self.name.unwrap_or_else(|| self.id.clone()),
            id: self.id,
            // Always global: an image is one thing for every model.
            model: Some(DEFAULT_MODEL.to_string()),
            version: None,
            description: self.description,
            capabilities: self.capabilities,
        }
        .check(DEFAULT_MODEL)?;
        let secrets = self.secrets.unwrap_or_default();
        if secrets.len() > 32 {
            return Err(CoreError::bad_input("invalid_secret", "secrets: at most 32").into());
        }
        for s in &secrets {
            if !agentos_core::net::valid_credential(s) {
                return Err(
                    CoreError::bad_input("invalid_secret", format!("secrets: {s:?} is not a secret name")).into()
                );
            }
        }
        let docker = &engine.inner.docker;
        let image = ImageRef::parse(&self.image, &docker.config.registry)?;
        let digest = docker.registry_digest(&image).await?.ok_or_else(|| {
            CoreError::bad_input(
                "unknown_image",
                format!("no image {} in the local registry: push it first", self.image),
            )
        })?;
        let client = docker.client().await?;
        let pinned = format!("{}/{}@{digest}", docker.config.registry, image.name);
        crate::progress::report(format!("pulling {pinned}"));
        pull(&client, &pinned).await?;
        let inspected = client
            .inspect_image(&pinned)
            .await
            .map_err(|e| CoreError::internal(format!("inspecting {pinned}: {}", docker_error(&e))))?;
        let path = inspected
            .config
            .and_then(|c| c.labels)
            .and_then(|l| l.get(DOCUMENT_LABEL).cloned())
            .unwrap_or_else(|| "/openapi.json".into());
        if !path.starts_with('/') || path.contains(char::is_whitespace) {
            return Err(CoreError::bad_input(
                "invalid_image",
                format!("the image's {DOCUMENT_LABEL} label {path:?} is not a path"),
            )
            .into());
        }
        // The throwaway container goes in every outcome, whatever validation answered.
        let _room = docker.validating().await?;
        let lease = free_port()?;
        let port = lease.port;
        let name =
            format!("agentos-validate-{}-{}", header.id, &sha256_hex(format!("{:?}", Instant::now()).as_bytes())[..8]);
        // Removed, its port held until then, however this ends: below, or when the request
        // that imports goes away mid-way (this future is then dropped).
        let throwaway = Throwaway { engine: engine.clone(), name: name.clone(), lease: Some(lease) };
        crate::progress::report(format!("starting a validation container on port {port}"));
        let started = docker.start(&client, &name, &pinned, port, "validate", &[]).await;
        let outcome = match started {
            Ok(()) => validate(&client, &name, port, &path, docker.config.start_timeout).await,
            Err(e) => Err(e),
        };
        throwaway.remove().await;
        let bytes = outcome?;
        let refused = |e: agentos_openapi::ImportError| {
            CoreError::bad_input("invalid_openapi", format!("the image's document at {path} is not usable: {e}"))
        };
        let imported = agentos_openapi::import(&bytes, &Default::default()).map_err(refused)?;
        // A document served by the image says where its operations are relative to the
        // container's own address: `servers: [{url: /v1}]` is kept.
        let base_path = agentos_openapi::server_path(&bytes, &Default::default()).map_err(refused)?;
        let sha256 = sha256_hex(&bytes);
        let urn = BlobUrn::new(OPENAPI_NAMESPACE, &sha256, Some("json"))?;
        let (contract, calls) = super::http::contract_of(imported.operations);
        let binding = Binding::Docker(DockerBinding {
            image: self.image,
            digest,
            openapi_urn: urn.to_string(),
            sha256,
            size_bytes: bytes.len() as u64,
            openapi_path: path,
            base_path,
            operations: calls,
            skipped: imported.skipped,
            secrets,
            timeout_ms: self.timeout_ms,
        });
        let (model, mut entry) = header.into_entry(Status::Approved, contract, binding);
        if agentos_core::name::check_label("version", &imported.version, 64).is_ok() {
            entry.version = imported.version;
        }
        Ok(Plan { model, entry, blobs: vec![(urn, bytes)] })
    }
}

/// A validation container, removed when its import is done with it or gone.
struct Throwaway {
    engine: Engine,
    name: String,
    /// `None` once removed.
    lease: Option<PortLease>,
}

impl Throwaway {
    async fn remove(mut self) {
        let lease = self.lease.take();
        self.engine.inner.docker.remove(&self.name, lease).await;
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else { return };
        let (engine, name) = (self.engine.clone(), std::mem::take(&mut self.name));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { engine.inner.docker.remove(&name, Some(lease)).await });
        }
    }
}

/// Pulls `reference` from the local registry, to the end of the engine's progress stream.
async fn pull(client: &Docker, reference: &str) -> Result<(), EngineError> {
    let options = CreateImageOptions { from_image: Some(reference.to_string()), ..Default::default() };
    let mut progress = client.create_image(Some(options), None, None);
    while let Some(step) = progress.next().await {
        if let Err(e) = step {
            return Err(CoreError::new(
                ErrorKind::Unavailable,
                if engine_answered(&e) { "pull_failed" } else { "docker_unavailable" },
                format!("pulling {reference} failed: {}", docker_error(&e)),
            )
            .into());
        }
    }
    Ok(())
}

/// Waits for the validation container to listen, then reads its document.
async fn validate(client: &Docker, name: &str, port: u16, path: &str, limit: Duration) -> Result<Vec<u8>, EngineError> {
    let refused = |code: &'static str, why: String| -> EngineError { CoreError::bad_input(code, why).into() };
    crate::progress::report(format!("waiting for it to listen on 127.0.0.1:{port}"));
    match wait_listening(client, name, port, limit).await {
        Listening::Yes => {}
        Listening::Exited(code, tail) => {
            return Err(refused(
                "image_crashed",
                format!("the container exited with code {code} during validation{tail}"),
            ));
        }
        Listening::TimedOut => {
            return Err(refused(
                "image_silent",
                format!(
                    "the container did not listen on 127.0.0.1:$PORT within {} s (it must serve HTTP on the port given in PORT)",
                    limit.as_secs()
                ),
            ));
        }
    }
    crate::progress::report(format!("validating its document at {path}"));
    let url = format!("http://127.0.0.1:{port}{path}");
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| CoreError::internal(e.to_string()))?;
    let resp = http.get(&url).send().await.map_err(|e| {
        refused("invalid_openapi", format!("GET {path} of the container failed: {}", crate::outbound::describe(&e)))
    })?;
    let status = resp.status().as_u16();
    if !(200..300).contains(&status) {
        return Err(refused(
            "no_openapi",
            format!(
                "the container answered {status} for its document at {path} (label {DOCUMENT_LABEL} says where it is)"
            ),
        ));
    }
    // Read up to the limit and no further: the whole of a document of gigabytes would be held
    // in the master's memory before its size was checked.
    let too_big = || refused("invalid_openapi", format!("the document is over {} MiB", MAX_DOCUMENT >> 20));
    if resp.content_length().is_some_and(|n| n > MAX_DOCUMENT as u64) {
        return Err(too_big());
    }
    let mut resp = resp;
    let mut bytes = Vec::new();
    while let Some(chunk) =
        resp.chunk().await.map_err(|e| refused("invalid_openapi", format!("reading the document: {e}")))?
    {
        if bytes.len() + chunk.len() > MAX_DOCUMENT {
            return Err(too_big());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

enum Listening {
    Yes,
    /// The exit code and `: <its last log line>`.
    Exited(i64, String),
    TimedOut,
}

/// Polls the port until the container listens, exits, or `limit` passes.
async fn wait_listening(client: &Docker, name: &str, port: u16, limit: Duration) -> Listening {
    let deadline = Instant::now() + limit;
    let mut n = 0u32;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            // Something listens: the container, unless it failed to bind (a process outside
            // the port locks took the port first) and that other process is what answered.
            return match client.inspect_container(name, None).await.ok().and_then(|i| i.state) {
                Some(state) if state.running == Some(false) => {
                    Listening::Exited(state.exit_code.unwrap_or(-1), last_log_line(client, name).await)
                }
                _ => Listening::Yes,
            };
        }
        n += 1;
        // The engine is asked now and then, not on every poll.
        if n % 10 == 1
            && let Ok(info) = client.inspect_container(name, None).await
            && let Some(state) = info.state
            && state.running == Some(false)
        {
            return Listening::Exited(state.exit_code.unwrap_or(-1), last_log_line(client, name).await);
        }
        if Instant::now() >= deadline {
            return Listening::TimedOut;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn last_log_line(client: &Docker, name: &str) -> String {
    let options = LogsOptions { stdout: true, stderr: true, tail: "5".into(), ..Default::default() };
    let mut logs = client.logs(name, Some(options));
    let mut text = String::new();
    while let Some(Ok(chunk)) = logs.next().await {
        text.push_str(&chunk.to_string());
    }
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| format!(": {}", l.trim().chars().take(300).collect::<String>()))
        .unwrap_or_default()
}

/// A loopback port a container is to listen on, kept from every other master on this host (and
/// from this master's other starts) for as long as it is held. The kernel gives a port free right
/// now; nothing binds it until the container does, so without a lock two masters on one host
/// (containers share the host's network) could be given the same port in those moments, and the
/// calls of one entry would reach the other's container. Worse, a container that never listens
/// leaves its port free for its whole start, and whatever listens there meanwhile would be taken
/// for it. Each master therefore locks `<temp dir>/agentos-ports/<port>` (`flock`, released when
/// the process dies) and passes over a port another holds. Held by the validation container for
/// its run and by a warm container for its life.
pub(crate) struct PortLease {
    port: u16,
    /// `None` when the lock folder cannot be used: the port is then the kernel's alone (warned).
    _lock: Option<std::fs::File>,
}

impl std::fmt::Debug for PortLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PortLease({})", self.port)
    }
}

/// A port the kernel says is free and no other master holds.
fn free_port() -> Result<PortLease, EngineError> {
    lease_among(std::iter::repeat_with(kernel_port))
}

/// The first of `ports` no other master holds (at most 64 tried).
fn lease_among(ports: impl Iterator<Item = Result<u16, EngineError>>) -> Result<PortLease, EngineError> {
    let mut ports = ports;
    let Some(dir) = lock_folder() else {
        let port = ports.next().unwrap_or_else(|| Err(CoreError::internal("no free port").into()))?;
        return Ok(PortLease { port, _lock: None });
    };
    for port in ports.take(64) {
        let port = port?;
        match lock_port(dir, port) {
            Ok(Some(file)) => return Ok(PortLease { port, _lock: Some(file) }),
            Ok(None) => continue,
            Err(e) => {
                unlocked_once(&format!("the port lock folder refuses a lock file ({e})"));
                return Ok(PortLease { port, _lock: None });
            }
        }
    }
    Err(CoreError::new(
        ErrorKind::Unavailable,
        "no_free_port",
        "every free port the kernel offered is held by another master's container; try again",
    )
    .into())
}

/// Warns, once per process, that ports are used without their locks.
fn unlocked_once(why: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "{why}: container ports are used unlocked, so two masters on this host could give two containers one port"
        );
    }
}

/// A loopback port free right now.
fn kernel_port() -> Result<u16, EngineError> {
    let l =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| CoreError::internal(format!("no free port: {e}")))?;
    Ok(l.local_addr().map_err(|e| CoreError::internal(e.to_string()))?.port())
}

/// The folder of the host's port locks (`<temp dir>/agentos-ports`), shared by every user
/// (sticky, like `/tmp`), opened once: lock files are opened relative to it, so that the folder
/// renamed and replaced by a link later leads nowhere else. `None` (warned) when it cannot be
/// made or is not a plain folder (a link).
fn lock_folder() -> Option<&'static std::fs::File> {
    static FOLDER: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    FOLDER
        .get_or_init(|| {
            use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
            let dir = std::env::temp_dir().join("agentos-ports");
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    unlocked_once(&format!("no port lock folder at {} ({e})", dir.display()));
                    return None;
                }
            }
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
                .open(&dir);
            match opened {
                Ok(folder) => {
                    // SAFETY: geteuid has no preconditions.
                    let me = unsafe { libc::geteuid() };
                    if let Ok(m) = folder.metadata()
                        && m.uid() != me
                        && m.uid() != 0
                    {
                        tracing::warn!(path = %dir.display(), owner = m.uid(), "the port lock folder belongs to another user, who could undo its locks");
                    }
                    Some(folder)
                }
                Err(e) => {
                    unlocked_once(&format!("the port lock folder {} is not a plain folder ({e})", dir.display()));
                    None
                }
            }
        })
        .as_ref()
}

/// Locks `port`'s file in `dir`: `Some` when this master now holds it, `None` when another does,
/// or the file cannot be opened (another user's that this one may not read, or a link: taken as
/// held, since whoever made it may hold it), an error when the folder refuses a new file. Never
/// through a link; an existing file is opened without `O_CREAT` (which a sticky folder refuses
/// on another user's file), for reading, which is all a lock needs.
fn lock_port(dir: &std::fs::File, port: u16) -> std::io::Result<Option<std::fs::File>> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let name = std::ffi::CString::new(port.to_string()).expect("digits");
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid folder descriptor and a NUL-terminated name.
    let mut fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
    let mut made = false;
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOENT) {
            return match e.raw_os_error() {
                Some(libc::ELOOP | libc::EACCES | libc::EPERM) => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: as above, with the mode `O_CREAT` needs.
        fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CREAT, 0o644 as libc::c_uint) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            // Made meanwhile by another master, as a link, or refused as another's file.
            return match e.raw_os_error() {
                Some(libc::ELOOP | libc::EEXIST) => Ok(None),
                Some(libc::EACCES | libc::EPERM) if dir_has(dir, &name) => Ok(None),
                _ => Err(e),
            };
        }
        made = true;
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    if made {
        // Readable by every user's master whatever the umask, so that each can take its lock.
        // SAFETY: a valid descriptor this process owns.
        unsafe { libc::fchmod(fd, 0o644) };
    }
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Whether `name` is in `dir` (as anything).
fn dir_has(dir: &std::fs::File, name: &std::ffi::CStr) -> bool {
    use std::os::fd::AsRawFd;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a valid folder descriptor, a NUL-terminated name and room for the answer.
    unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) == 0 }
}

/// An engine error as the plain error a warm start records for the calls waiting on it.
fn core(e: EngineError) -> CoreError {
    CoreError::new(e.kind(), e.code(), e.to_string())
}

fn docker_error(e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerResponseServerError { message, .. } => message.clone(),
        bollard::errors::Error::DockerStreamError { error } => error.clone(),
        other if engine_answered(other) => other.to_string(),
        other => {
            format!("the Docker engine did not answer (is dockerd running?): {}", crate::outbound::describe(other))
        }
    }
}

/// Whether the engine itself answered `e` (it refused something, or its answer said what went
/// wrong: a pull's manifest unknown, a full disk), rather than not answering at all.
fn engine_answered(e: &bollard::errors::Error) -> bool {
    use bollard::errors::Error;
    matches!(
        e,
        Error::DockerResponseServerError { .. }
            | Error::DockerStreamError { .. }
            | Error::DockerContainerWaitError { .. }
            | Error::JsonDataError { .. }
            | Error::JsonSerdeError { .. }
    )
}

/// Calls one operation of a container entry: the tag still at its pinned digest, a warm
/// container of it (started when there is none), and the request sent as an http service's.
pub(crate) async fn call_operation(engine: &Engine, c: &ValueCall<'_>) -> Result<Value, EngineError> {
    let ValueCall { id, model, tool, ref input, timeout_ms, ref entry, .. } = *c;
    let Binding::Docker(b) = &entry.entry.binding else {
        return Err(CoreError::bad_input("not_docker", format!("{id:?} is not a container")).into());
    };
    let op = c.op.request().ok_or_else(|| CoreError::internal(format!("{id} {tool}: no request description")))?;
    let docker = &engine.inner.docker;
    let failed =
        |kind, code, why: String| -> EngineError { CoreError::new(kind, code, format!("{id} {tool}: {why}")).into() };
    let image = ImageRef::parse(&b.image, &docker.config.registry)?;
    match docker.registry_digest(&image).await {
        Ok(Some(d)) if d == b.digest => {}
        // Gone, or pointing elsewhere: the warm containers of the pinned digest stop either way.
        Ok(now) => {
            docker.stop_digest(&b.digest).await;
            let (code, why) = match now {
                None => (
                    "image_gone",
                    format!(
                        "the tag {} is no longer in the local registry: push the image again, then re-import it",
                        b.image
                    ),
                ),
                Some(_) => ("image_repushed", "image re-pushed since import: re-import it".to_string()),
            };
            return Err(failed(
                ErrorKind::Conflict,
                code,
                format!("{why} (agentos catalog import-image {} --id {id})", b.image),
            ));
        }
        Err(e) => return Err(failed(ErrorKind::Unavailable, "registry_unreachable", e.to_string())),
    }
    let mut secrets = Vec::new();
    for s in &b.secrets {
        let pin = b.digest.trim_start_matches("sha256:");
        if !granted_to_entry(engine, s, id, &entry.model, pin) {
            return Err(failed(
                ErrorKind::Forbidden,
                "secret_not_granted",
                format!(
                    "secret {s:?} is not granted to {id}; the operator grants it with `agentos secret grant {s} --tool {id}`"
                ),
            ));
        }
        let value = engine.principals().secret(s).ok_or_else(|| {
            failed(ErrorKind::ToolFailed, "secret_missing", format!("secret {s:?} is not set on the master"))
        })?;
        secrets.push((s.clone(), value));
    }
    let cfg = engine.inner.dispatch.config;
    let timeout_ms = timeout_ms.or(b.timeout_ms).unwrap_or(cfg.default_timeout_ms).min(cfg.max_timeout_ms);
    let timeout = Duration::from_millis(timeout_ms);
    let began = Instant::now();
    let key = format!("{}/{id}@{}", entry.model, b.digest);
    // The start runs on a task of its own: a call whose time runs out leaves it to finish (or
    // fail) and be recorded for the next call, rather than a container nobody knows of.
    let values: Vec<String> = secrets.iter().map(|(_, v)| v.clone()).collect();
    let starting = {
        let (engine, key, image, b) = (engine.clone(), key.clone(), image.clone(), b.clone());
        tokio::spawn(async move { engine.inner.docker.warm(&engine, &key, &image, &b, &secrets, began).await })
    };
    let warm = match tokio::time::timeout(timeout, starting).await {
        Ok(Ok(Ok(warm))) => warm,
        Ok(Ok(Err(e))) => return Err(failed(e.kind, e.code, e.message)),
        Ok(Err(e)) => return Err(failed(ErrorKind::Internal, "container_failed", e.to_string())),
        Err(_) => {
            return Err(failed(
                ErrorKind::Unavailable,
                "container_unavailable",
                format!(
                    "no container of {} was ready within the call's {timeout_ms} ms; it goes on starting for the next call",
                    b.image
                ),
            ));
        }
    };
    let base = format!("http://127.0.0.1:{}{}", warm.0.port, b.base_path);
    let request =
        agentos_openapi::build_request(&base, op, input).map_err(|e| CoreError::bad_input("usage", e.to_string()))?;
    let left = timeout.saturating_sub(began.elapsed()).max(Duration::from_millis(1));
    super::http::send_local(engine, id, tool, model, request, left, &docker.http, &values).await
}

fn granted_to_entry(engine: &Engine, secret: &str, id: &str, model: &str, pin: &str) -> bool {
    engine.read_state().secret_grants.values().any(|g| {
        g.secret == secret
            && matches!(&g.to, GrantTarget::Tool { id: i, model: m, sha256 } if i == id && m == model && sha256 == pin)
    })
}

/// Containers: the engine's client, the registry's recent answers, the warm containers.
pub(crate) struct Containers {
    pub(crate) config: DockerConfig,
    client: tokio::sync::OnceCell<Docker>,
    /// Plain HTTP to the master's own containers on loopback (not the outbound policy's).
    pub(crate) http: reqwest::Client,
    digests: Mutex<HashMap<ImageRef, (Instant, Option<String>)>>,
    /// Warm containers by entry and digest (`model/id@digest`): entries of one image do not
    /// share a container, since each has its own secrets. Each entry has a lock of its own, held
    /// while its container starts, so a slow start holds up only that entry's calls.
    warm: Mutex<HashMap<String, WarmSlot>>,
    /// The last failed start of each slot, for the calls that waited on it.
    failed: Mutex<HashMap<String, (Instant, CoreError)>>,
    /// Validation containers running or about to start (see [`Containers::validating`]).
    validating: AtomicUsize,
    /// Containers whose removal failed (the engine was down): removed at the next start, and
    /// when the master stops. Each keeps its port's lease until then: it may still listen.
    leftovers: Mutex<Vec<(String, Option<PortLease>)>>,
    /// Containers out of their slots, waiting for their calls in flight to end before they are
    /// removed: counted against the limit, and removed when the master stops.
    retiring: Mutex<HashMap<String, Arc<Warm>>>,
}

/// One entry's container, or none; locked while it is checked or started.
type WarmSlot = Arc<tokio::sync::Mutex<Option<Arc<Warm>>>>;

/// A running container of one digest.
pub(crate) struct Warm {
    name: String,
    port: u16,
    /// Keeps `port` from other masters' containers while this one lives (and after it died,
    /// until it is replaced): a call checks the port to tell whether it still runs. Taken by
    /// whoever removes the container, and let go once it is removed.
    lease: Mutex<Option<PortLease>>,
    /// The sha256 of the secrets it was started with (names and values): a call whose secrets
    /// differ (one rotated, dropped or added) gets a new container, since a running one keeps
    /// the environment it started with.
    env: String,
    last_used: Mutex<Instant>,
    in_flight: AtomicUsize,
}

/// A call under way in a warm container: counted from the moment the container is handed to
/// the call under its slot's lock, so that nothing stops it as idle in between.
struct WarmBusy(Arc<Warm>);

/// One validation container counted against the limit, for as long as it is held.
struct Validating<'a>(&'a AtomicUsize);

impl Drop for Validating<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for WarmBusy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        *self.0.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }
}

impl Warm {
    /// The port's lease, for the removal of this container to hold until it is done.
    fn lease(&self) -> Option<PortLease> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn busy(self: &Arc<Self>) -> WarmBusy {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        WarmBusy(self.clone())
    }
}

impl Containers {
    pub(crate) fn new(config: DockerConfig) -> Self {
        let http = reqwest::Client::builder().no_proxy().tcp_nodelay(true).build().unwrap_or_default();
        Containers {
            config,
            client: Default::default(),
            http,
            digests: Default::default(),
            warm: Default::default(),
            failed: Default::default(),
            validating: AtomicUsize::new(0),
            leftovers: Default::default(),
            retiring: Default::default(),
        }
    }

    /// The engine's client, its API version negotiated (Debian's engine is older than bollard).
    async fn client(&self) -> Result<Docker, EngineError> {
        let socket = self.config.socket.clone();
        let client = self
            .client
            .get_or_try_init(|| async move {
                // Said once, by the refusal below: not "cannot be reached: … did not answer".
                let why = |e: bollard::errors::Error| {
                    if engine_answered(&e) { docker_error(&e) } else { crate::outbound::describe(&e) }
                };
                let d = Docker::connect_with_unix(&socket, 120, bollard::API_DEFAULT_VERSION).map_err(why)?;
                d.negotiate_version().await.map_err(why)
            })
            .await
            .map_err(|why| {
                CoreError::new(
                    ErrorKind::Unavailable,
                    "docker_unavailable",
                    format!("the Docker engine at {} cannot be reached: {why}", self.config.socket),
                )
            })?;
        Ok(client.clone())
    }

    /// The tag's digest in the registry now (`None`: no such tag), answered from a cache of at
    /// most five seconds.
    async fn registry_digest(&self, image: &ImageRef) -> Result<Option<String>, EngineError> {
        if let Some((at, d)) = self.digests.lock().unwrap_or_else(|p| p.into_inner()).get(image)
            && at.elapsed() < DIGEST_CACHE
        {
            return Ok(d.clone());
        }
        let url = format!("http://{}/v2/{}/manifests/{}", self.config.registry, image.name, image.tag);
        let accept = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json";
        let resp = self.http.head(&url).header("accept", accept).timeout(Duration::from_secs(5)).send().await.map_err(
            |e| {
                CoreError::new(
                    ErrorKind::Unavailable,
                    "registry_unreachable",
                    format!(
                        "the local registry {} cannot be reached (HEAD {url}): {}",
                        self.config.registry,
                        crate::outbound::describe(&e)
                    ),
                )
            },
        )?;
        let digest = match resp.status().as_u16() {
            404 => None,
            s if (200..300).contains(&s) => {
                resp.headers().get("docker-content-digest").and_then(|v| v.to_str().ok()).map(str::to_string)
            }
            s => {
                return Err(CoreError::new(
                    ErrorKind::Unavailable,
                    "registry_error",
                    format!("the local registry answered {s} for {}:{}", image.name, image.tag),
                )
                .into());
            }
        };
        self.digests.lock().unwrap_or_else(|p| p.into_inner()).insert(image.clone(), (Instant::now(), digest.clone()));
        Ok(digest)
    }

    /// Creates and starts a container of `image` listening on `port`, with the limits every
    /// container gets.
    async fn start(
        &self,
        client: &Docker,
        name: &str,
        image: &str,
        port: u16,
        role: &str,
        env: &[(String, String)],
    ) -> Result<(), EngineError> {
        let mut vars = vec![format!("PORT={port}")];
        vars.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        let labels = HashMap::from([
            (OWNER_LABEL.to_string(), self.config.owner.clone()),
            ("agentos.role".to_string(), role.to_string()),
        ]);
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            env: Some(vars),
            user: Some(self.config.user.clone()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                network_mode: Some("host".into()),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                pids_limit: Some(self.config.pids_limit),
                memory: Some(self.config.memory_bytes),
                // No swap beyond the memory limit (the engine's default doubles it), and a
                // bounded log: what a container prints is never read past its last lines.
                memory_swap: Some(self.config.memory_bytes),
                log_config: Some(bollard::models::HostConfigLogConfig {
                    typ: Some("json-file".into()),
                    config: Some(HashMap::from([
                        ("max-size".to_string(), "1m".to_string()),
                        ("max-file".to_string(), "1".to_string()),
                    ])),
                }),
                readonly_rootfs: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptions { name: Some(name.to_string()), ..Default::default() };
        // The engine refusing the container is the image's or its settings' fault: the tool
        // failed. The engine not answering is not the tool's.
        let unavailable = |what: &str, e: &bollard::errors::Error| -> EngineError {
            let (kind, code) = if engine_answered(e) {
                (ErrorKind::ToolFailed, "container_failed")
            } else {
                (ErrorKind::Unavailable, "docker_unavailable")
            };
            CoreError::new(kind, code, format!("{what} {image}: {}", docker_error(e))).into()
        };
        client.create_container(Some(options), body).await.map_err(|e| unavailable("creating a container of", &e))?;
        if let Err(e) = client.start_container(name, None).await {
            let _ =
                client.remove_container(name, Some(RemoveContainerOptions { force: true, ..Default::default() })).await;
            return Err(unavailable("starting a container of", &e));
        }
        Ok(())
    }

    /// Room for a validation container, counted against the container limit until the guard
    /// is dropped: imports started at once would otherwise run any number of them.
    async fn validating(&self) -> Result<Validating<'_>, CoreError> {
        self.validating.fetch_add(1, Ordering::AcqRel);
        let guard = Validating(&self.validating);
        self.make_room("", 1).await?;
        Ok(guard)
    }

    /// The slot of `key`, made empty when there is none.
    fn slot(&self, key: &str) -> WarmSlot {
        self.warm.lock().unwrap_or_else(|p| p.into_inner()).entry(key.to_string()).or_default().clone()
    }

    /// Every slot but `key`'s.
    fn other_slots(&self, key: &str) -> Vec<WarmSlot> {
        let all = self.warm.lock().unwrap_or_else(|p| p.into_inner());
        all.iter().filter(|(k, _)| k.as_str() != key).map(|(_, s)| s.clone()).collect()
    }

    /// The warm container of `key` (an entry and its digest), started when there is none, when
    /// it died, or when it holds other secrets than `secrets`. A start that failed while this
    /// call waited for the slot (it came at `arrived`) fails this call too, with the same reason,
    /// rather than being tried again by each call in line.
    async fn warm(
        &self,
        engine: &Engine,
        key: &str,
        image: &ImageRef,
        b: &DockerBinding,
        secrets: &[(String, String)],
        arrived: Instant,
    ) -> Result<WarmBusy, CoreError> {
        let env = {
            let mut all = Vec::new();
            for (k, v) in secrets {
                all.extend_from_slice(k.as_bytes());
                all.push(0);
                all.extend_from_slice(v.as_bytes());
                all.push(0);
            }
            sha256_hex(&all)
        };
        let slot = self.slot(key);
        let mut held = slot.lock().await;
        if let Some(w) = held.as_ref() {
            if w.env == env && tokio::net::TcpStream::connect(("127.0.0.1", w.port)).await.is_ok() {
                return Ok(w.busy());
            }
            // Crashed, stopped, or started with secrets that changed since: replaced below.
            // Calls still under way in it finish first.
            let gone = held.take().expect("present");
            Self::retire(Arc::downgrade(&engine.inner), gone);
        }
        if let Some((at, why)) = self.failed_start(key)
            && at >= arrived
        {
            return Err(why);
        }
        // A failure is recorded for the calls waiting on the slot, redacted with the values this
        // start had: a container's last log line may print its environment.
        let started = self.start_warm(engine, key, image, b, secrets, env).await.map_err(|e| {
            let values: Vec<String> = secrets.iter().map(|(_, v)| v.clone()).collect();
            CoreError::new(e.kind, e.code, crate::redact::Redactor::new(&values).text(&e.message))
        });
        match started {
            Ok(w) => {
                let busy = w.busy();
                *held = Some(w);
                self.failed.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
                Ok(busy)
            }
            Err(e) => {
                self.failed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.to_string(), (Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    /// The last start of `key` that failed, and when.
    fn failed_start(&self, key: &str) -> Option<(Instant, CoreError)> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned()
    }

    /// Starts a container for `key`, making room for it first.
    async fn start_warm(
        &self,
        engine: &Engine,
        key: &str,
        image: &ImageRef,
        b: &DockerBinding,
        secrets: &[(String, String)],
        env: String,
    ) -> Result<Arc<Warm>, CoreError> {
        self.make_room(key, 0).await?;
        let client = self.client().await.map_err(core)?;
        self.remove_leftovers(&client).await;
        let pinned = format!("{}/{}@{}", self.config.registry, image.name, b.digest);
        // Pulled at import; pulled again if the engine lost it.
        if client.inspect_image(&pinned).await.is_err() {
            pull(&client, &pinned).await.map_err(core)?;
        }
        let lease = free_port().map_err(core)?;
        let port = lease.port;
        let name = format!("agentos-run-{}-{}", &b.digest.trim_start_matches("sha256:")[..12], port);
        self.start(&client, &name, &pinned, port, "run", secrets).await.map_err(core)?;
        match wait_listening(&client, &name, port, self.config.start_timeout).await {
            Listening::Yes => {}
            Listening::Exited(code, tail) => {
                self.remove(&name, Some(lease)).await;
                return Err(CoreError::new(
                    ErrorKind::ToolFailed,
                    "container_failed",
                    format!("the container exited with code {code} at start{tail}"),
                ));
            }
            Listening::TimedOut => {
                self.remove(&name, Some(lease)).await;
                return Err(CoreError::new(
                    ErrorKind::Unavailable,
                    "container_unavailable",
                    format!("the container did not listen within {} s", self.config.start_timeout.as_secs()),
                ));
            }
        }
        let w = Arc::new(Warm {
            name,
            port,
            lease: Mutex::new(Some(lease)),
            env,
            last_used: Mutex::new(Instant::now()),
            in_flight: AtomicUsize::new(0),
        });
        tokio::spawn(watch_idle(Arc::downgrade(&engine.inner), key.to_string(), Arc::downgrade(&w)));
        Ok(w)
    }

    /// Removes a container taken out of its slot once the calls under way in it have ended.
    fn retire(engine: std::sync::Weak<crate::engine::Inner>, gone: Arc<Warm>) {
        let Some(inner) = engine.upgrade() else { return };
        inner.docker.retiring.lock().unwrap_or_else(|p| p.into_inner()).insert(gone.name.clone(), gone.clone());
        drop(inner);
        tokio::spawn(async move {
            while gone.in_flight.load(Ordering::Acquire) > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if let Some(inner) = engine.upgrade()
                && inner.docker.retiring.lock().unwrap_or_else(|p| p.into_inner()).remove(&gone.name).is_some()
            {
                inner.docker.remove(&gone.name, gone.lease()).await;
            }
        });
    }

    /// Below the container limit, or brought below it by stopping the least recently used
    /// idle container of another entry. A slot being started counts as running.
    /// Validation containers count as running; `validating` is how many of them the caller's
    /// own is (1 for an import's, counted before it asks, 0 for a call's).
    async fn make_room(&self, key: &str, validating: usize) -> Result<(), CoreError> {
        let others = self.other_slots(key);
        let retiring = self.retiring.lock().unwrap_or_else(|p| p.into_inner()).len();
        let mut running = self.validating.load(Ordering::Acquire).saturating_sub(validating) + retiring;
        let mut idle: Vec<(Instant, tokio::sync::OwnedMutexGuard<Option<Arc<Warm>>>)> = Vec::new();
        for s in others {
            match s.try_lock_owned() {
                Err(_) => running += 1,
                Ok(g) => {
                    if let Some(w) = g.as_ref() {
                        running += 1;
                        if w.in_flight.load(Ordering::Acquire) == 0 {
                            let used = *w.last_used.lock().unwrap_or_else(|p| p.into_inner());
                            idle.push((used, g));
                        }
                    }
                }
            }
        }
        if running < self.config.max_containers {
            return Ok(());
        }
        let Some((_, mut oldest)) = idle.into_iter().min_by_key(|(used, _)| *used) else {
            return Err(CoreError::new(
                ErrorKind::Unavailable,
                "containers_busy",
                format!(
                    "the limit of {} containers (--max-containers) is reached and every one is busy; try again when a call ends",
                    self.config.max_containers
                ),
            ));
        };
        if let Some(w) = oldest.take() {
            self.remove(&w.name, w.lease()).await;
        }
        Ok(())
    }

    /// Removes container `name`; when the engine cannot, it is kept to be removed at the next
    /// start, since nothing else would remove it before the master's next run.
    async fn remove(&self, name: &str, lease: Option<PortLease>) {
        let removed = match self.client().await {
            Ok(client) => client
                .remove_container(name, Some(RemoveContainerOptions { force: true, ..Default::default() }))
                .await
                .map_or_else(
                    |e| matches!(e, bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }),
                    |()| true,
                ),
            Err(_) => false,
        };
        if !removed {
            tracing::warn!(container = %name, "the container could not be removed now; it will be at the next start");
            self.leftovers.lock().unwrap_or_else(|p| p.into_inner()).push((name.to_string(), lease));
        }
    }

    /// Removes the containers an earlier [`Containers::remove`] could not.
    async fn remove_leftovers(&self, client: &Docker) {
        let left = std::mem::take(&mut *self.leftovers.lock().unwrap_or_else(|p| p.into_inner()));
        for (name, lease) in left {
            let options = Some(RemoveContainerOptions { force: true, ..Default::default() });
            match client.remove_container(&name, options).await {
                Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
                Err(_) => self.leftovers.lock().unwrap_or_else(|p| p.into_inner()).push((name, lease)),
            }
        }
    }

    /// Stops the containers of the slots whose key `pick` chooses.
    async fn stop_where(&self, pick: impl Fn(&str) -> bool) {
        let slots: Vec<WarmSlot> = {
            let all = self.warm.lock().unwrap_or_else(|p| p.into_inner());
            all.iter().filter(|(k, _)| pick(k)).map(|(_, s)| s.clone()).collect()
        };
        for s in slots {
            let gone = s.lock().await.take();
            if let Some(w) = gone {
                self.remove(&w.name, w.lease()).await;
            }
        }
    }

    /// Stops the warm containers of `digest`.
    async fn stop_digest(&self, digest: &str) {
        let suffix = format!("@{digest}");
        self.stop_where(|k| k.ends_with(&suffix)).await;
    }

    /// Stops every warm container (the master is stopping), those retiring, and those an
    /// earlier removal missed.
    pub(crate) async fn stop_all(&self) {
        self.stop_where(|_| true).await;
        let retiring: Vec<(String, Arc<Warm>)> =
            self.retiring.lock().unwrap_or_else(|p| p.into_inner()).drain().collect();
        for (name, w) in retiring {
            self.remove(&name, w.lease()).await;
        }
        if let Ok(client) = self.client().await {
            self.remove_leftovers(&client).await;
        }
    }

    /// Removes every container an earlier run of this master left (killed mid-import, say).
    pub(crate) async fn sweep(&self) {
        let Ok(client) = self.client().await else { return };
        let filters = HashMap::from([("label".to_string(), vec![format!("{OWNER_LABEL}={}", self.config.owner)])]);
        let options = ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
        let Ok(left) = client.list_containers(Some(options)).await else { return };
        for c in left {
            if let Some(id) = c.id {
                tracing::info!(container = %id, "removing a container an earlier run left");
                let _ = client
                    .remove_container(&id, Some(RemoveContainerOptions { force: true, ..Default::default() }))
                    .await;
            }
        }
    }
}

/// How often a warm container's watcher checks that its entry is still in the catalog.
const CATALOG_CHECK: Duration = Duration::from_secs(2);

/// Whether the warm container of `key` (`model/id@digest`) may go on serving: its entry is
/// still cataloged at that digest, and each of its secrets is still set and granted to it. One
/// removed, imported again at another digest, or holding a secret revoked since, is stopped by
/// its watcher, on whichever master ran it, rather than running until it is idle.
fn still_serves(engine: &Engine, key: &str) -> bool {
    let Some((entry, digest)) = key.rsplit_once('@') else { return false };
    let Some((model, id)) = entry.split_once('/') else { return false };
    let secrets = {
        let st = engine.read_state();
        match st.catalog(model).and_then(|c| c.get(id)).map(|e| &e.entry.binding) {
            Some(Binding::Docker(b)) if b.digest == digest => b.secrets.clone(),
            _ => return false,
        }
    };
    let pin = digest.trim_start_matches("sha256:");
    secrets.iter().all(|s| granted_to_entry(engine, s, id, model, pin) && engine.principals().secret(s).is_some())
}

/// Stops a warm container once it has had no call for the configured idle time, or once its
/// entry left the catalog (after the calls under way in it).
async fn watch_idle(engine: std::sync::Weak<crate::engine::Inner>, key: String, warm: std::sync::Weak<Warm>) {
    loop {
        let Some(idle) = engine.upgrade().map(|e| e.docker.config.idle_stop) else { return };
        tokio::time::sleep((idle / 4).clamp(Duration::from_millis(100), CATALOG_CHECK)).await;
        let (Some(inner), Some(w)) = (engine.upgrade(), warm.upgrade()) else { return };
        let kept = still_serves(&Engine { inner: inner.clone() }, &key);
        let quiet = w.last_used.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
        if kept && (w.in_flight.load(Ordering::Acquire) > 0 || quiet < idle) {
            continue;
        }
        let slot = inner.docker.slot(&key);
        let mut held = slot.lock().await;
        if !held.as_ref().is_some_and(|x| Arc::ptr_eq(x, &w)) {
            // Replaced or stopped by someone else, who removes it.
            return;
        }
        if !kept {
            held.take();
            drop(held);
            tracing::info!(container = %w.name, "container of an entry no longer cataloged, or of a secret revoked, stopped");
            Containers::retire(engine, w);
            return;
        }
        if w.in_flight.load(Ordering::Acquire) == 0 {
            held.take();
            drop(held);
            tracing::info!(container = %w.name, "idle container stopped");
            inner.docker.remove(&w.name, w.lease()).await;
            return;
        }
        // A call came in meanwhile: watched on.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_another_master_holds_is_passed_over_and_free_again_once_let_go() {
        assert!(lock_folder().is_some(), "the port lock folder is usable here");
        let held = free_port().unwrap();
        // A lock is per open file: another master's attempt, made here through a file of its own.
        let offered = [Ok(held.port)].into_iter().chain(std::iter::repeat_with(kernel_port));
        let other = lease_among(offered).unwrap();
        assert_ne!(other.port, held.port, "the held port was given twice");
        let e = lease_among(std::iter::repeat_with(|| Ok(held.port))).unwrap_err();
        assert_eq!(e.code(), "no_free_port", "{e}");
        let port = held.port;
        drop(held);
        let again = lease_among(std::iter::once(Ok(port))).unwrap();
        assert_eq!(again.port, port, "a port let go is free to the next start");
    }

    #[test]
    fn only_the_local_registrys_tags_are_imported() {
        let r = "127.0.0.1:5001";
        assert_eq!(
            ImageRef::parse("127.0.0.1:5001/tools/echo:1", r).unwrap(),
            ImageRef { name: "tools/echo".into(), tag: "1".into() }
        );
        assert_eq!(ImageRef::parse("127.0.0.1:5001/echo", r).unwrap().tag, "latest");
        for (image, words) in [
            ("docker.io/library/alpine:3", "not in the local registry"),
            ("alpine", "not in the local registry"),
            ("127.0.0.1:50011/echo:1", "not in the local registry"),
            ("127.0.0.1:5001/echo@sha256:00", "name a tag, not a digest"),
            ("127.0.0.1:5001/Echo:1", "not a valid reference"),
            ("127.0.0.1:5001/../x:1", "not a valid reference"),
            ("127.0.0.1:5001/echo:-x", "not a valid reference"),
        ] {
            let e = ImageRef::parse(image, r).unwrap_err();
            assert!(e.message.contains(words), "{image}: {}", e.message);
        }
    }
}
