//! `run`: opens a data folder, restores the engine and serves the API until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use agentos_core::command::Limits;
use agentos_engine::outbound::{IpRange, OutboundPolicy};
use agentos_engine::{Engine, EngineConfig};
use agentos_store::{BlobStore, EventLog, FsBlobStore, PgEventLog, S3BlobStore, SqliteEventLog, SqliteJobStore};

use crate::data_folder::LooseDataFolder;
use crate::serve_error::ServeError;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    pub listen: String,
    pub max_script_bytes: usize,
    pub max_body_bytes: usize,
    pub snapshot_every: u64,
    /// Largest executor result post (it carries captured output).
    pub max_result_bytes: usize,
    pub jobs: agentos_engine::JobConfig,
    pub dispatch: agentos_engine::DispatchConfig,
    /// Invocations one principal may have in flight.
    pub max_concurrent_invocations: usize,
    /// Host toolkits of whoever embeds the master; they join the global catalog at start.
    pub host_toolkits: Vec<agentos_engine::host::HostToolkit>,
    /// Addresses requests on a principal's behalf may reach though the policy refuses them
    /// (`--http-allow`).
    pub http_allow: Vec<IpRange>,
    /// Refuse private ranges too (`--http-deny-private`).
    pub http_deny_private: bool,
    /// What to do when the data folder, or anything in it, is open to other users.
    pub loose_data_folder: LooseDataFolder,
    /// The connection cap and the header/idle timeout.
    pub connections: crate::connections::ConnectionLimits,
    /// Unreadable events to skip (`--skip-event SEQ`), each recorded in the log.
    pub skip_events: Vec<u64>,
    /// Where the log, the blobs and the secrets' key live when not in the data folder.
    pub storage: Storage,
    /// What one net may hold and do (the crash-loop marker is put in the data folder).
    pub net_limits: agentos_engine::NetLimits,
    /// Where the jq expressions of nets run.
    pub expressions: Expressions,
    /// What `/mcp` offers and how long its sessions live.
    pub mcp_endpoint: crate::mcp::McpEndpoint,
    /// How MCP servers registered as tools are run.
    pub mcp: agentos_engine::bindings::mcp::McpConfig,
    /// The local registry and the limits of tool containers; `owner` is set from the data
    /// folder when left at its default.
    pub docker: agentos_engine::bindings::docker::DockerConfig,
}

/// Where a master keeps what it shares with other masters. Each `None` is the data folder's
/// embedded default: `events.db` (SQLite), `blobs/` and `secrets.key`.
#[derive(Debug, Clone, Default)]
pub struct Storage {
    /// A PostgreSQL URL: the event log, shared by every master given it.
    pub database: Option<String>,
    /// An `s3://bucket/prefix` URL: the blobs.
    pub blobs: Option<String>,
    /// The secrets' key file, which masters sharing a database must share.
    pub secrets_key_file: Option<PathBuf>,
}

/// Where a master runs the jq expressions of nets.
#[derive(Debug, Clone)]
pub enum Expressions {
    /// In worker processes of this same program, each evaluation bounded by `timeout` (and
    /// each worker's memory by the sandbox): the program's `main` must first call
    /// `agentos_engine::sandbox::worker_if_asked()`. What `agentos serve` does.
    Workers { timeout: std::time::Duration },
    /// Through a runner the embedder built (`agentos_engine::sandbox::runner`, say).
    Runner(agentos_core::expr::Runner),
    /// In the master's own process: one runaway expression can take it down. For trusted nets only.
    InProcess,
}

impl Default for Expressions {
    fn default() -> Self {
        Expressions::Workers { timeout: std::time::Duration::from_secs(1) }
    }
}

impl Expressions {
    fn runner(&self) -> Result<agentos_core::expr::Runner, ServeError> {
        match self {
            Expressions::Workers { timeout } => {
                if agentos_engine::sandbox::started_as_worker() {
                    // Started by a pool as a worker, this program went on to start a master:
                    // refused, or every evaluation would start one more.
                    return Err(ServeError::Expressions(
                        "this process was started as an expression worker but is starting a master: call agentos_engine::sandbox::worker_if_asked() first in main".into(),
                    ));
                }
                agentos_engine::sandbox::runner_for_this_program(*timeout).map_err(ServeError::Expressions)
            }
            Expressions::Runner(r) => Ok(r.clone()),
            Expressions::InProcess => Ok(agentos_core::expr::Runner::in_process()),
        }
    }
}

/// What a started master tells whoever launched it.
#[derive(Clone)]
pub struct Ready {
    pub url: String,
    pub addr: SocketAddr,
    pub token_file: PathBuf,
    /// True when this start wrote a new operator token.
    pub token_written: bool,
    pub entries: usize,
    pub seq: u64,
    pub restored: agentos_engine::Restored,
    /// The engine, for whoever runs more beside the master (e.g. `agentos up`'s local executor).
    pub engine: Engine,
}

pub async fn run(
    config: ServeConfig,
    on_ready: impl FnOnce(&Ready),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    agentos_engine::limit_allocator_arenas();
    let data = &config.data_dir;
    let expressions = config.expressions.runner()?;
    // Checked before anything is opened in it. Every file the master creates there is given
    // mode 0600 where it is created (the umask is left alone: it is the whole process's, and
    // `agentos up` runs an executor in this process whose workspace another user must read).
    crate::data_folder::prepare(data, config.loose_data_folder)?;
    // One master per data folder: a second one would fold a log it does not own.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(data.join("LOCK"))
        .map_err(|e| ServeError::Io { context: "opening the LOCK file".into(), source: e })?;
    if lock.try_lock().is_err() {
        return Err(ServeError::Locked(data.clone()));
    }

    // Bound before the engine opens: the outbound policy refuses the master's own address, and
    // fires resumed at open already make requests. Connections wait in the backlog meanwhile.
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|e| ServeError::Listen { addr: config.listen.clone(), source: e })?;
    let addr =
        listener.local_addr().map_err(|e| ServeError::Io { context: "reading the bound address".into(), source: e })?;

    // The secrets' key lives beside the log, never in it.
    let key_file = config.storage.secrets_key_file.clone().unwrap_or_else(|| data.join("secrets.key"));
    if config.storage.database.is_some() && config.storage.blobs.is_none() {
        tracing::warn!(
            "the log is shared (--database) but the blobs are this data folder's own: masters sharing a database need shared blobs too (--blobs s3://BUCKET/PREFIX), or a tool registered through one master cannot run through another"
        );
    }
    if config.storage.database.is_some() && config.storage.secrets_key_file.is_none() {
        tracing::warn!(
            "the log is shared (--database) but the secrets key is this data folder's own: every master sharing the database needs the same key, given by --secrets-key-file"
        );
    }
    let secret_key = agentos_engine::admin::load_or_create_secret_key(&key_file)
        .map_err(|e| ServeError::Io { context: format!("the secrets key {}", key_file.display()), source: e })?;
    let mut shared_log = None;
    let mut shared_queue = None;
    let mut sharing = agentos_engine::Sharing::default();
    let log: Arc<dyn EventLog> = match &config.storage.database {
        None => Arc::new(SqliteEventLog::open(&data.join("events.db"))?),
        Some(url) => {
            let pg = Arc::new(PgEventLog::open(url).await?);
            shared_log = Some(pg.clone());
            // Jobs are rows any master hands out, so an executor may poll any master.
            let queue = Arc::new(agentos_store::PgJobQueue::open(url).await?);
            shared_queue = Some(queue.clone());
            // Each model's fires run on one master at a time: the one holding its lock.
            sharing = agentos_engine::Sharing {
                locks: Some(Arc::new(agentos_store::PgModelLocks::open(url).await?)),
                tag: Some(master_tag(data)?),
                jobs: Some(queue),
            };
            pg
        }
    };
    let blobs: Arc<dyn BlobStore> = match &config.storage.blobs {
        None => Arc::new(FsBlobStore::open(data.join("blobs"))?),
        Some(url) => {
            let store = S3BlobStore::open(url)?;
            store.check(url).await?;
            Arc::new(store)
        }
    };
    let engine = Engine::open(
        EngineConfig {
            limits: Limits { max_script_bytes: config.max_script_bytes },
            snapshot_every: config.snapshot_every,
            jobs: config.jobs,
            dispatch: config.dispatch,
            secret_key: Some(secret_key),
            max_concurrent_invocations: config.max_concurrent_invocations.max(1),
            outbound: OutboundPolicy::new(config.http_allow.clone())
                .listening_on(addr)
                .deny_private(config.http_deny_private),
            skip_events: config.skip_events.clone(),
            nets: agentos_engine::NetLimits {
                firing_marker: Some(data.join("nets.firing")),
                ..config.net_limits.clone()
            },
            expressions,
            mcp: config.mcp.clone(),
            docker: {
                let mut d = config.docker.clone();
                if d.owner == agentos_engine::bindings::docker::DockerConfig::default().owner {
                    // One data folder, one owner: a master removes only what its own runs left.
                    let place = std::path::absolute(data).unwrap_or_else(|_| data.to_path_buf());
                    d.owner =
                        format!("agentos-{}", &agentos_core::sha256_hex(place.to_string_lossy().as_bytes())[..16]);
                }
                d
            },
            sharing,
        },
        log,
        blobs,
    )
    .await?;
    // Other masters' appends are folded as the database announces them (and every half
    // second besides, should an announcement be lost with a connection).
    let follower = shared_log.map(|pg| {
        let engine = engine.clone();
        tokio::spawn(
            async move { pg.listen(std::time::Duration::from_millis(500), move || engine.fold_others()).await },
        )
    });
    // Jobs queued through any master wake this master's waiting polls at once (and every
    // second besides, should an announcement be lost); a goodbye through another master has
    // the polls of that name open here written down again.
    let queue_follower = shared_queue.map(|q| {
        let engine = engine.clone();
        tokio::spawn(async move {
            q.listen(engine.job_queue_run(), std::time::Duration::from_secs(1), move |stopped| {
                engine.jobs_announced();
                if !stopped.is_empty() {
                    let engine = engine.clone();
                    tokio::spawn(async move { engine.executors_stopped_elsewhere(&stopped).await });
                }
                true
            })
            .await
        })
    });
    // Direct invocations' jobs survive a crash: those left open are queued again.
    let job_store = Arc::new(SqliteJobStore::open(&data.join("jobs.db"))?);
    let requeued = engine.dispatch().recover_jobs(job_store).await?;
    if requeued > 0 {
        tracing::info!(requeued, "direct jobs left open by the last run are queued again");
    }
    for name in engine.principals().short_secrets() {
        tracing::warn!(
            secret = %name,
            "secret {name} is shorter than {} bytes, too short to redact reliably; replace it with `agentos secret set {name}` (the value is read from stdin)",
            agentos_engine::redact::MIN_SECRET_BYTES
        );
    }
    // Credentials once came from the environment; now a secret goes only where it is granted.
    for (key, _) in std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v))) {
        if let Some(name) = key.strip_prefix("AGENTOS_CREDENTIAL_") {
            tracing::warn!(
                variable = %key,
                "{key} is ignored: credentials are secrets granted to a use. Set it with `agentos secret set {name}` and grant it with `agentos secret grant {name} --origin URL` or `--tool ID`"
            );
        }
    }
    let token_file = data.join("operator.token");
    let token_written = engine.principals().ensure_operator(&token_file).await?;
    engine.host().register_toolkits(config.host_toolkits.clone()).await?;

    let ready = Ready {
        url: format!("http://{addr}"),
        addr,
        token_file,
        token_written,
        entries: engine.catalog().entry_count(),
        seq: engine.last_seq(),
        restored: engine.restored(),
        engine: engine.clone(),
    };
    on_ready(&ready);

    let app = crate::router::router(
        engine.clone(),
        config.max_body_bytes,
        config.max_result_bytes,
        config.mcp_endpoint,
        config.connections.header_timeout,
    );
    // The stop is the engine's to know before any connection closes: a call dropped by it is
    // not a caller that went away.
    let stopping = engine.clone();
    let shutdown = async move {
        shutdown.await;
        stopping.begin_stop();
    };
    crate::connections::serve(listener, app, config.connections, shutdown).await;
    engine.shutdown().await;
    for f in [follower, queue_follower].into_iter().flatten() {
        f.abort();
    }
    drop(lock);
    Ok(())
}

/// The data folder's mark for its master's tool-net instances (`master.id`, made once): the
/// same across restarts, so a master of a shared log finds the instances an earlier run of it
/// left, and only those.
fn master_tag(data: &std::path::Path) -> Result<String, ServeError> {
    let file = data.join("master.id");
    if let Ok(t) = std::fs::read_to_string(&file) {
        let t = t.trim();
        if t.len() == 8 && t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(t.to_string());
        }
    }
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).map_err(|e| ServeError::Io {
        context: "making master.id".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let tag: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&file)
        .and_then(|mut f| std::io::Write::write_all(&mut f, tag.as_bytes()).and_then(|_| f.sync_all()))
        .map_err(|e| ServeError::Io { context: format!("writing {}", file.display()), source: e })?;
    Ok(tag)
}
