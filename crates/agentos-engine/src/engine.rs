//! The engine a master runs: one handle over its subsystems, each owning its state and all
//! committing through the one ledger:
//! - the ledger (`ledger`): the event log, the state folded from it, the committer, snapshots;
//! - the catalog (`catalog`): entries, their pinned blobs, search and history;
//! - dispatch (`dispatch`, `jobs`): the job queue, executors, direct jobs;
//! - the net runtime (`nets`): compiled transitions, the fire loop, outgoing requests;
//! - principals and secrets (`admin`, `slots`): agents, grants, the secrets key, invocation slots;
//! - host tools (`host`): the embedder's toolkits.
//!
//! Bindings (`bindings`) run each kind of tool over these. `open` starts them all.

use std::sync::{Arc, Mutex, OnceLock};

use tokio::task::JoinHandle;

use agentos_core::command::Limits;
use agentos_core::event::Event;
use agentos_core::sha256_hex;
use agentos_core::state::State;
use agentos_store::VerifyBlobStore;

use crate::committer::{Decide, Reply};
use crate::jobs::{DispatchConfig, DurableJobs, JobConfig, JobQueue};
use crate::ledger::{Ledger, Restored};
use crate::{EngineError, Principal};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub limits: Limits,
    /// A snapshot is taken after this many events since the last one.
    pub snapshot_every: u64,
    pub jobs: JobConfig,
    pub dispatch: DispatchConfig,
    /// The key secrets are encrypted with; `None`: secrets cannot be set.
    pub secret_key: Option<[u8; 32]>,
    /// Invocations one principal may have in flight.
    pub max_concurrent_invocations: usize,
    /// Which addresses requests made on a principal's behalf may connect to.
    pub outbound: crate::outbound::OutboundPolicy,
    /// Unreadable events the operator chose to skip (`agentos serve --skip-event SEQ`): each is
    /// recorded in the log at open, and every fold from then on treats it as never written.
    pub skip_events: Vec<u64>,
    /// What one net may hold and do, and where the crash-loop marker lives.
    pub nets: crate::nets::runtime::NetLimits,
    /// Where the jq expressions of nets run. A master serving agents runs them in a sandbox
    /// (`crate::sandbox`); in process, one runaway expression can take the master down.
    pub expressions: agentos_core::expr::Runner,
    /// How MCP servers are run: the user command servers run as, when idle ones stop.
    pub mcp: crate::bindings::mcp::McpConfig,
    /// The local registry, the engine's socket and the limits of tool containers.
    pub docker: crate::bindings::docker::DockerConfig,
    /// What this master shares with other masters on one log: the fires of models, the queue.
    pub sharing: Sharing,
}

/// What a master shares with others on one log. Alone on its log (the default), it runs every
/// model's fires and keeps its job queue in memory; beside others, it runs the fires of the
/// models whose lock it holds (`agentos_store::PgModelLocks`) and its jobs are rows of a shared
/// queue (`agentos_store::PgJobQueue`) any master hands out.
#[derive(Clone, Default)]
pub struct Sharing {
    pub locks: Option<Arc<dyn agentos_store::ModelLocks>>,
    /// This master's mark in the names of its tool-net instances and jobs, the same across its
    /// restarts (so it finds what an earlier run of it left on a shared log); random when not
    /// given.
    pub tag: Option<String>,
    pub jobs: Option<Arc<dyn agentos_store::SharedJobs>>,
}

impl std::fmt::Debug for Sharing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sharing")
            .field("locks", &self.locks.is_some())
            .field("tag", &self.tag)
            .field("jobs", &self.jobs.is_some())
            .finish()
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            limits: Limits::default(),
            snapshot_every: 10_000,
            jobs: JobConfig::default(),
            dispatch: DispatchConfig::default(),
            secret_key: None,
            max_concurrent_invocations: 32,
            outbound: Default::default(),
            skip_events: Vec::new(),
            nets: Default::default(),
            expressions: Default::default(),
            mcp: Default::default(),
            docker: Default::default(),
            sharing: Default::default(),
        }
    }
}

/// A master's engine: a thin facade over its subsystems. Each subsystem's operations are on its
/// handle (`engine.catalog()`, `engine.dispatch()`, `engine.nets()`, `engine.principals()`,
/// `engine.host()`); the engine itself opens, stops, authenticates, and tells where the log is.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

/// Declares a subsystem's handle: a borrow of the engine (free to make) whose `impl` block, in
/// the subsystem's own module, holds the subsystem's operations. It derefs to the engine for
/// what every subsystem shares: the ledger (`submit`, `read_state`) and the other handles.
macro_rules! subsystem {
    ($(#[$doc:meta])* $handle:ident, $accessor:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $handle<'e>(pub(crate) &'e Engine);

        impl std::ops::Deref for $handle<'_> {
            type Target = Engine;
            fn deref(&self) -> &Engine {
                self.0
            }
        }

        impl Engine {
            $(#[$doc])*
            pub fn $accessor(&self) -> $handle<'_> {
                $handle(self)
            }
        }
    };
}

subsystem!(
    /// The catalog: registering and removing entries, search, get, history, pinned blobs, models.
    Catalog,
    catalog
);
subsystem!(
    /// Dispatch: calls through each kind's binding, the job queue, executors and their jobs.
    Dispatch,
    dispatch
);
subsystem!(
    /// The net runtime: models' nets, tokens, transitions and their fires, tool-net instances.
    Nets,
    nets
);
subsystem!(
    /// Principals and secrets: agents and their flags, model and secret grants, the audit log.
    Principals,
    principals
);
subsystem!(
    /// Host tools: the toolkits the embedder registers and runs in the master.
    HostToolkits,
    host
);

pub(crate) struct Inner {
    pub(crate) ledger: Ledger,
    pub(crate) catalog: CatalogState,
    pub(crate) dispatch: DispatchState,
    pub(crate) nets: crate::nets::runtime::NetRuntime,
    pub(crate) principals: PrincipalState,
    pub(crate) host: crate::host::HostTools,
    pub(crate) mcp: crate::bindings::mcp::McpServers,
    pub(crate) docker: crate::bindings::docker::Containers,
    /// The jobs that finished lately, for `GET /api/jobs`.
    pub(crate) recent: Arc<crate::recent::RecentJobs>,
}

/// The catalog's state beside the ledger's: the blob store of pinned content and the limits of
/// registration.
pub(crate) struct CatalogState {
    pub(crate) blobs: VerifyBlobStore,
    pub(crate) limits: Limits,
    /// The operations called lately, ready to call again.
    pub(crate) prepared: crate::prepared::PreparedOps,
}

/// Dispatch: the job queue, its limits, where direct jobs are kept while open, and the reaper
/// of expired leases.
pub(crate) struct DispatchState {
    pub(crate) jobs: Arc<JobQueue>,
    pub(crate) config: DispatchConfig,
    /// Unset: direct jobs live in memory only.
    pub(crate) durable: OnceLock<DurableJobs>,
    pub(crate) reaper: Mutex<Option<JoinHandle<()>>>,
    /// Set when the master is asked to stop: callers dropped from then on are the stop's doing,
    /// not theirs, and their running jobs are left to run again after the restart.
    pub(crate) stopping: std::sync::atomic::AtomicBool,
    /// The jobs this master's fires have out, with the net's model and transition of each.
    pub(crate) net_steps: NetSteps,
}

/// Job id -> where the net's step it is runs, for the steps this master's fires have out.
pub(crate) type NetSteps = Arc<Mutex<std::collections::HashMap<String, NetStepOf>>>;

/// Where a net's step runs: the net's model and transition, and whether that net is a tool
/// net's run (an instance of its own, invoked from another model).
#[derive(Debug, Clone)]
pub(crate) struct NetStepOf {
    pub(crate) model: String,
    pub(crate) transition: String,
    pub(crate) instance: bool,
}

/// A net's step known as its transition's while this lives: until its fire's outcome is
/// committed with its result, as long as the job reads as open.
pub(crate) struct NetStep {
    steps: NetSteps,
    job_id: String,
}

impl NetStep {
    pub(crate) fn enter(steps: &NetSteps, job_id: &str, of: NetStepOf) -> Self {
        steps.lock().unwrap_or_else(|p| p.into_inner()).insert(job_id.to_string(), of);
        NetStep { steps: steps.clone(), job_id: job_id.to_string() }
    }
}

impl Drop for NetStep {
    fn drop(&mut self) {
        self.steps.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.job_id);
    }
}

/// Principals and secrets beyond the ledger's records: the key secrets are sealed with, and the
/// invocations each principal has in flight.
pub(crate) struct PrincipalState {
    /// `None`: secrets cannot be set.
    pub(crate) secret_key: Option<[u8; 32]>,
    pub(crate) slots: Arc<crate::slots::Slots>,
    /// The redactor of the store's secrets, rebuilt when they change.
    pub(crate) redactor: Mutex<Option<Arc<crate::admin::CachedRedactor>>>,
}

impl Engine {
    pub(crate) fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.inner.ledger.read_state()
    }

    /// Decides and commits one command; answers its committed events.
    pub(crate) async fn submit(&self, principal: &str, decide: Decide) -> Result<Vec<Event>, EngineError> {
        self.inner.ledger.submit(principal, decide).await
    }

    /// Queues one command without waiting for its commit: `reply` hears the outcome (on the
    /// committer's thread, or at once when the engine is shutting down).
    pub(crate) async fn submit_then(&self, principal: &str, decide: Decide, reply: Reply) {
        self.inner.ledger.submit_then(principal, decide, reply)
    }

    pub fn restored(&self) -> Restored {
        self.inner.ledger.restored
    }

    pub fn limits(&self) -> Limits {
        self.inner.catalog.limits
    }

    pub fn last_seq(&self) -> u64 {
        self.inner.ledger.last_seq()
    }

    /// Has this master fold what other masters appended to the shared log (called when the
    /// database announces an append); false once the engine is shutting down.
    pub fn fold_others(&self) -> bool {
        self.inner.ledger.fold_others()
    }

    /// A shared job queue announced a queued job (through any master): this master's waiting
    /// polls look again.
    pub fn jobs_announced(&self) {
        self.inner.dispatch.jobs.announced()
    }

    /// Executors said goodbye through other masters sharing the queue: the polls of those
    /// names open here (other processes') are written down again.
    pub async fn executors_stopped_elsewhere(&self, executors: &[String]) {
        for executor in executors {
            self.inner.dispatch.jobs.stopped_elsewhere(executor).await
        }
    }

    /// This master's run in a shared job queue: the owner its queued jobs carry, and the
    /// payload of their announcements.
    pub fn job_queue_run(&self) -> Option<String> {
        self.inner.dispatch.jobs.run_name()
    }

    /// Waits until this master has folded event `seq` (so a client reads its own writes made
    /// through another master), at most `within`; answers the last sequence number folded.
    pub async fn wait_for_seq(&self, seq: u64, within: std::time::Duration) -> u64 {
        self.inner.ledger.wait_for(seq, within).await
    }

    /// Writes a snapshot now (used by tests and benchmarks).
    pub async fn snapshot_now(&self) -> Result<u64, EngineError> {
        self.inner.ledger.snapshot_now().await
    }

    /// The operator, for work the master does on its own behalf.
    pub fn operator(&self) -> Option<Principal> {
        self.read_state().principals.get("operator").map(|r| Principal::from_record(r))
    }

    /// Whether `p` still holds its token: not revoked since it was authenticated (a name is not
    /// reused until revoked, and a new principal of the name has another id).
    pub fn is_current(&self, p: &Principal) -> bool {
        self.read_state().principals.get(&p.name).is_some_and(|r| r.id == p.id)
    }

    /// The principal a bearer token belongs to.
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let sha = sha256_hex(token.as_bytes());
        self.read_state().principal_by_token_sha256(&sha).map(|r| Principal::from_record(r))
    }
}
