//! The engine a master runs: opens the log, folds it into state, and serves catalog commands.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use agentos_core::command::{Limits, RegisterScript, RegisterToolnet, RemoveArgs, decide_register, decide_remove};
use agentos_core::entry::{Binding, EntryView, Scope};
use agentos_core::event::{Event, EventBody, EventView, PrincipalKind, PrincipalRecord};
use agentos_core::flags::{Flag, Flags};
use agentos_core::name::{check_model_name, check_tool_id};
use agentos_core::search::{SearchPage, SearchQuery, search};
use agentos_core::state::{ModelView, STATE_SCHEMA_VERSION, State};
use agentos_core::urn::BlobUrn;
use agentos_core::{CoreError, DEFAULT_MODEL, sha256_hex};
use agentos_store::{BlobStore, EventLog, Snapshot, StoreError, VerifyBlobStore};

use crate::access::{check_catalog_read, check_catalog_write, require};
use crate::committer::{self, Decide, Outlets, Pending, Reply};
use crate::dispatch::DispatchConfig;
use crate::jobs::{JobConfig, JobQueue};
use crate::principal::new_token;
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
    pub nets: crate::nets::NetLimits,
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
        }
    }
}

/// The definitions an entry has had, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct History {
    pub id: String,
    /// The model whose catalog the history belongs to.
    pub model: String,
    pub scope: Scope,
    pub events: Vec<EventView>,
}

#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    state: Arc<RwLock<State>>,
    pub(crate) log: Arc<dyn EventLog>,
    pub(crate) blobs: VerifyBlobStore,
    pub(crate) config: EngineConfig,
    pub(crate) jobs: Arc<JobQueue>,
    pub(crate) dispatch: DispatchConfig,
    reaper: Mutex<Option<JoinHandle<()>>>,
    tx: Mutex<Option<std::sync::mpsc::Sender<Pending>>>,
    committer: Mutex<Option<std::thread::JoinHandle<()>>>,
    snapshots: Arc<SnapshotControl>,
    restored: Restored,
    /// Every committed event, for the fire loop and for watchers.
    pub(crate) events: tokio::sync::broadcast::Sender<Arc<Event>>,
    pub(crate) nets: crate::nets::NetRuntime,
    pub(crate) http: reqwest::Client,
    /// For requests that carry a secret: redirects are followed within the origin only.
    pub(crate) sealed_http: reqwest::Client,
    net_loop: Mutex<Option<JoinHandle<()>>>,
    pub(crate) host: RwLock<std::collections::HashMap<String, Arc<crate::host::HostToolkit>>>,
    pub(crate) secret_key: Option<[u8; 32]>,
    pub(crate) slots: crate::admin::Slots,
    /// Sequence numbers of the events skipped by `--skip-event`, left out of every read.
    pub(crate) skipped: BTreeSet<u64>,
    /// Where direct invocations' jobs are kept while open; unset: they live in memory only.
    pub(crate) durable: std::sync::OnceLock<DurableJobs>,
}

/// The job store of direct invocations, and the queue of finished jobs to remove from it.
pub(crate) struct DurableJobs {
    pub(crate) store: Arc<dyn agentos_store::JobStore>,
    pub(crate) forget: tokio::sync::mpsc::UnboundedSender<String>,
}

/// How the state was rebuilt at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// Sequence number of the snapshot used (0: none).
    pub snapshot_seq: u64,
    /// Events folded in after the snapshot.
    pub replayed: u64,
}

struct SnapshotControl {
    last_seq: AtomicU64,
    running: AtomicBool,
    task: Mutex<Option<JoinHandle<()>>>,
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Everything the engine needs from a recorded event to fold it.
pub(crate) fn to_event(rec: agentos_store::RecordedEvent) -> Result<Event, EngineError> {
    let body = EventBody::from_parts(&rec.event.kind, &rec.event.payload)?;
    Ok(with_body(rec, body))
}

/// A recorded event with its body already decoded.
pub(crate) fn with_body(rec: agentos_store::RecordedEvent, body: EventBody) -> Event {
    Event {
        seq: rec.seq,
        model: rec.event.model,
        body,
        principal: rec.event.principal,
        time: rec.event.time,
        schema: rec.event.schema,
    }
}

/// The error for an event the master cannot read at start: it names the event and the way on.
fn unreadable_at_start(seq: u64, e: &EngineError) -> EngineError {
    CoreError::new(
        agentos_core::ErrorKind::Corrupt,
        "event_corrupt",
        format!(
            "event {seq} of the log cannot be read ({e}); the master will not fold a log with a hole it did not choose. \
             To go on without it, start with `agentos serve --skip-event {seq}` (recorded in the log; see the README \
             for what skipping an event can leave inconsistent)"
        ),
    )
    .into()
}

/// The events skipped so far, after recording those the operator asks to skip now. Only an
/// event that exists and cannot be read may be skipped: skipping a readable one would rewrite
/// history that the state depends on.
async fn record_skips(log: &Arc<dyn EventLog>, asked: &[u64]) -> Result<BTreeSet<u64>, EngineError> {
    let mut skipped = BTreeSet::new();
    for rec in log.read_key_any_model(agentos_core::event::SKIP_KEY).await? {
        if let EventBody::EventSkipped { seq, .. } = to_event(rec)?.body {
            skipped.insert(seq);
        }
    }
    for &seq in asked {
        if skipped.contains(&seq) {
            tracing::info!(seq, "event already skipped by an earlier start");
            continue;
        }
        let rec = log.read_after(seq.saturating_sub(1), 1).await?.into_iter().next().filter(|r| r.seq == seq);
        let Some(rec) = rec else {
            return Err(CoreError::bad_input(
                "no_such_event",
                format!("--skip-event {seq}: the log has no event {seq}"),
            )
            .into());
        };
        let model = rec.event.model.clone();
        let reason = match to_event(rec) {
            Ok(_) => {
                return Err(CoreError::bad_input(
                    "event_readable",
                    format!("--skip-event {seq}: event {seq} reads fine; only an unreadable event may be skipped"),
                )
                .into());
            }
            Err(e) => e.to_string(),
        };
        let body = EventBody::EventSkipped { seq, reason: reason.clone() };
        let (kind, payload) = body.to_parts();
        let record = agentos_store::NewEvent {
            model,
            kind: kind.to_string(),
            key: body.key(),
            payload,
            principal: "operator".into(),
            time: now_ms(),
            schema: agentos_core::event::EVENT_SCHEMA_VERSION,
        };
        let log = log.clone();
        // Before the committer starts: this is the only writer yet.
        tokio::task::spawn_blocking(move || log.append_blocking(vec![record]))
            .await
            .map_err(|e| CoreError::internal(format!("recording a skip: {e}")))??;
        tracing::warn!(seq, %reason, "event skipped by --skip-event: the state is folded as if it were never written");
        skipped.insert(seq);
    }
    Ok(skipped)
}

impl Engine {
    /// Opens the engine: the newest usable snapshot, then every event after it.
    pub async fn open(
        config: EngineConfig,
        log: Arc<dyn EventLog>,
        blobs: Arc<dyn BlobStore>,
    ) -> Result<Engine, EngineError> {
        let skipped = record_skips(&log, &config.skip_events).await?;
        let mut state = State::new();
        let snapshot = log.load_snapshot().await.unwrap_or_else(|e| {
            // The snapshot only saves time; the log is the truth.
            tracing::warn!(error = %e, "snapshot unreadable; ignoring it and replaying the whole log");
            None
        });
        if let Some(snap) = snapshot {
            if snap.schema == STATE_SCHEMA_VERSION {
                let decoded = tokio::task::spawn_blocking(move || {
                    let text = std::str::from_utf8(&snap.data).map_err(|e| e.to_string())?;
                    agentos_core::depth::from_str_any_depth::<State>(text).map_err(|e| e.to_string())
                })
                .await;
                match decoded {
                    Ok(Ok(s)) => state = s,
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "snapshot unreadable; replaying the whole log")
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "snapshot load failed; replaying the whole log")
                    }
                }
            } else {
                tracing::info!(found = snap.schema, "snapshot of another version; replaying the whole log");
            }
        }
        state.after_load();
        let snapshot_seq = state.last_seq;
        loop {
            let page = log.read_after(state.last_seq, 10_000).await?;
            if page.is_empty() {
                break;
            }
            for rec in page {
                if skipped.contains(&rec.seq) {
                    state.last_seq = rec.seq;
                    continue;
                }
                let seq = rec.seq;
                let ev = to_event(rec).map_err(|e| unreadable_at_start(seq, &e))?;
                state.apply(&ev);
            }
        }
        let replayed = state.last_seq - snapshot_seq;
        tracing::info!(seq = state.last_seq, snapshot = snapshot_seq, replayed, "state restored");
        // The snapshot's text and the log pages read are freed by now.
        release_free_memory();

        let state = Arc::new(RwLock::new(state));
        // Unbounded: every sender waits for its answer, so what is queued is bounded by the
        // callers in flight.
        let (tx, rx) = std::sync::mpsc::channel();
        let snapshots = Arc::new(SnapshotControl {
            last_seq: AtomicU64::new(snapshot_seq),
            running: AtomicBool::new(false),
            task: Mutex::new(None),
        });
        let events = tokio::sync::broadcast::channel(4096).0;
        let committer = {
            let (state, log, snapshots) = (state.clone(), log.clone(), snapshots.clone());
            let every = config.snapshot_every.max(1);
            let runtime = tokio::runtime::Handle::current();
            let after_commit = {
                let (state, log) = (state.clone(), log.clone());
                move |seq: u64| {
                    if seq >= snapshots.last_seq.load(Ordering::Relaxed) + every {
                        start_snapshot(&runtime, &state, &log, &snapshots);
                    }
                }
            };
            let out = Outlets { events: events.clone(), after_commit };
            std::thread::Builder::new()
                .name("agentos-committer".into())
                .spawn(move || committer::run(rx, state, log, out))
                .map_err(|e| CoreError::internal(format!("cannot start the committer thread: {e}")))?
        };
        let secret_key = config.secret_key;
        let http = config.outbound.client().map_err(|e| CoreError::internal(e.to_string()))?;
        let sealed_http = config.outbound.sealed_client().map_err(|e| CoreError::internal(e.to_string()))?;
        let nets = crate::nets::NetRuntime::new(&config.nets);
        let engine = Engine {
            inner: Arc::new(Inner {
                state,
                log,
                blobs: VerifyBlobStore::new(blobs),
                jobs: Arc::new(JobQueue::new(config.jobs)),
                dispatch: config.dispatch,
                reaper: Mutex::new(None),
                config,
                tx: Mutex::new(Some(tx)),
                committer: Mutex::new(Some(committer)),
                snapshots,
                restored: Restored { snapshot_seq, replayed },
                events,
                nets,
                http,
                sealed_http,
                net_loop: Mutex::new(None),
                host: RwLock::new(Default::default()),
                secret_key,
                slots: Default::default(),
                skipped,
                durable: Default::default(),
            }),
        };
        engine.stop_crash_looping().await;
        let weak_nets = Arc::downgrade(&engine.inner);
        let net_loop = tokio::spawn(crate::nets::net_loop(weak_nets));
        *engine.inner.net_loop.lock().unwrap_or_else(|p| p.into_inner()) = Some(net_loop);
        // The reaper holds a weak handle so that dropping every Engine ends it.
        let weak = Arc::downgrade(&engine.inner);
        let tick = (engine.inner.config.jobs.lease / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let reaper = tokio::spawn(async move {
            let mut interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                Engine { inner }.reap_jobs().await;
            }
        });
        *engine.inner.reaper.lock().unwrap_or_else(|p| p.into_inner()) = Some(reaper);
        Ok(engine)
    }

    pub(crate) fn read_state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.inner.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides and commits one command; answers its committed events.
    pub(crate) async fn submit(&self, principal: &str, decide: Decide) -> Result<Vec<Event>, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.submit_then(
            principal,
            decide,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )
        .await;
        rx.await.map_err(|_| CoreError::internal("the commit task ended"))?
    }

    /// Queues one command without waiting for its commit: `reply` hears the outcome (on the
    /// committer's thread, or at once when the engine is shutting down).
    pub(crate) async fn submit_then(&self, principal: &str, decide: Decide, reply: Reply) {
        let tx = self.inner.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(tx) = tx else {
            return reply(Err(CoreError::internal("the engine is shutting down").into()));
        };
        if let Err(e) = tx.send(Pending { principal: principal.to_string(), time: now_ms(), decide, reply }) {
            (e.0.reply)(Err(CoreError::internal("the engine is shutting down").into()));
        }
    }

    pub fn restored(&self) -> Restored {
        self.inner.restored
    }

    pub fn limits(&self) -> Limits {
        self.inner.config.limits
    }

    /// The operator, for work the master does on its own behalf.
    pub fn operator(&self) -> Option<Principal> {
        self.read_state().principals.get("operator").map(|r| Principal::from_record(r))
    }

    /// The principal a bearer token belongs to.
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let sha = sha256_hex(token.as_bytes());
        self.read_state().principal_by_token_sha256(&sha).map(|r| Principal::from_record(r))
    }

    /// Makes sure an operator exists and its token is in `token_file` (mode 0600). A missing
    /// file means the token is lost, so a new one replaces it. Returns true when a token was written.
    pub async fn ensure_operator(&self, token_file: &Path) -> Result<bool, EngineError> {
        let has_operator = self.read_state().principals.contains_key("operator");
        if has_operator && token_file.exists() {
            return Ok(false);
        }
        let token = new_token().map_err(|e| CoreError::internal(format!("no randomness for a token: {e}")))?;
        write_secret_file(token_file, &token)
            .map_err(|e| StoreError::io(format!("writing {}", token_file.display()), e))?;
        let record = PrincipalRecord {
            id: agentos_core::event::OPERATOR_ID.into(),
            name: "operator".into(),
            kind: PrincipalKind::Operator,
            flags: Flags::all().to_string(),
            home_model: DEFAULT_MODEL.into(),
            token_sha256: sha256_hex(token.as_bytes()),
        };
        self.submit(
            "system",
            Box::new(move |_| Ok(vec![(DEFAULT_MODEL.to_string(), EventBody::PrincipalCreated(record.clone()))])),
        )
        .await?;
        Ok(true)
    }

    /// `TOOL_CATALOG_REGISTER_SCRIPT`: stores the content, then commits the entry.
    pub async fn register_script(&self, principal: &Principal, cmd: RegisterScript) -> Result<EntryView, EngineError> {
        require(principal, Flag::Scripts, "register scripts")?;
        let plan = cmd.plan(&principal.home_model, &self.inner.config.limits)?;
        check_catalog_write(&self.read_state(), principal, &plan.model)?;
        self.store_entry(principal, plan.model, &plan.urn, &plan.bytes, plan.entry).await
    }

    /// `TOOL_CATALOG_REGISTER_TOOLNET`: authoring a tool net needs `w`.
    pub async fn register_toolnet(
        &self,
        principal: &Principal,
        cmd: RegisterToolnet,
    ) -> Result<EntryView, EngineError> {
        require(principal, Flag::Write, "author tool nets")?;
        let plan = cmd.plan(&principal.home_model)?;
        check_catalog_write(&self.read_state(), principal, &plan.model)?;
        self.store_entry(principal, plan.model, &plan.urn, &plan.bytes, plan.entry).await
    }

    /// Stores an entry's content, then commits the entry, and answers it as stored.
    async fn store_entry(
        &self,
        principal: &Principal,
        model: String,
        urn: &BlobUrn,
        bytes: &[u8],
        entry: agentos_core::entry::CatalogEntry,
    ) -> Result<EntryView, EngineError> {
        // The blob is durable before the event that names it; an orphan blob after a crash is harmless.
        self.inner.blobs.put(urn, bytes).await?;
        let id = entry.id.clone();
        let m = model.clone();
        let who = principal.clone();
        let events = self
            .submit(&principal.name, Box::new(move |st| decide_register(st, &m, entry.clone(), &who.actor())))
            .await?;
        let scope = if model == DEFAULT_MODEL { Scope::Global } else { Scope::Local };
        let st = self.read_state();
        let current = st.catalog(&model).and_then(|c| c.get(&id));
        // No event: the same definition was already current.
        let Some(ev) = events.last() else {
            return current
                .map(|s| s.view(scope, false))
                .ok_or_else(|| CoreError::internal("an unchanged entry is missing from the state").into());
        };
        if let Some(stored) = current.filter(|s| s.revision == ev.seq) {
            return Ok(stored.view(scope, false));
        }
        // Another command changed the entry since: answer what this one committed.
        let EventBody::ToolRegistered { entry, owner } = &ev.body else {
            return Err(CoreError::internal("a registration committed another kind of event").into());
        };
        let created_at = current.map(|s| s.created_at).unwrap_or(ev.time);
        let mut stored = agentos_core::entry::StoredEntry::new(
            entry.clone(),
            model,
            ev.seq,
            created_at,
            ev.time,
            ev.principal.clone(),
        );
        if let Some(o) = owner {
            stored.owner = o.as_str().into();
        }
        Ok(stored.view(scope, false))
    }

    /// `TOOL_CATALOG_REMOVE`.
    pub async fn remove(&self, principal: &Principal, args: RemoveArgs) -> Result<(), EngineError> {
        check_tool_id(&args.id)?;
        let model = args.model.unwrap_or_else(|| principal.home_model.clone());
        check_model_name(&model)?;
        check_catalog_write(&self.read_state(), principal, &model)?;
        let kind = self.read_state().catalog(&model).and_then(|c| c.get(&args.id)).map(|e| e.entry.binding.kind());
        match kind {
            Some(k) if k.visible_to(principal.flags) => {
                require(principal, k.registering_flag(), "remove this kind of tool")?;
            }
            _ => {
                return Err(
                    CoreError::not_found(format!("no tool {:?} in the catalog of model {model:?}", args.id)).into()
                );
            }
        }
        let id = args.id;
        let who = principal.clone();
        self.submit(&principal.name, Box::new(move |st| decide_remove(st, &model, &id, &who.actor()))).await?;
        Ok(())
    }

    /// Catalog search, local first, showing only the kinds the caller's flags reveal. Without a
    /// model it searches the caller's home model, as register, invoke and call do.
    pub fn search(&self, principal: &Principal, query: &SearchQuery) -> Result<SearchPage, EngineError> {
        let model = query.model.clone().unwrap_or_else(|| principal.home_model.clone());
        check_model_name(&model)?;
        let st = self.read_state();
        check_catalog_read(&st, principal, &model)?;
        Ok(search(&st, &SearchQuery { model: Some(model), ..query.clone() }, principal.flags))
    }

    /// One entry, local first (in the caller's home model when no model is given).
    pub fn get(&self, principal: &Principal, id: &str, model: Option<&str>) -> Result<EntryView, EngineError> {
        check_tool_id(id)?;
        let model = model.unwrap_or(&principal.home_model);
        check_model_name(model)?;
        let st = self.read_state();
        check_catalog_read(&st, principal, model)?;
        match st.resolve(model, id) {
            Some((e, scope)) if e.entry.binding.kind().visible_to(principal.flags) => Ok(e.view(scope, false)),
            _ => Err(not_found(id, model).into()),
        }
    }

    /// Every definition `id` has had in the scope it resolves to from `model`.
    pub async fn history(&self, principal: &Principal, id: &str, model: Option<&str>) -> Result<History, EngineError> {
        check_tool_id(id)?;
        let model = model.unwrap_or(&principal.home_model);
        check_model_name(model)?;
        check_catalog_read(&self.read_state(), principal, model)?;
        let key = format!("tool:{id}");
        let mut found = None;
        if model != DEFAULT_MODEL {
            let local = self.inner.log.read_key(model, &key).await?;
            if !local.is_empty() {
                found = Some((model.to_string(), Scope::Local, local));
            }
        }
        if found.is_none() {
            let global = self.inner.log.read_key(DEFAULT_MODEL, &key).await?;
            if !global.is_empty() {
                found = Some((DEFAULT_MODEL.to_string(), Scope::Global, global));
            }
        }
        let Some((owner, scope, recs)) = found else {
            return Err(not_found(id, model).into());
        };
        let skipped = &self.inner.skipped;
        let events =
            recs.into_iter().filter(|r| !skipped.contains(&r.seq)).map(to_event).collect::<Result<Vec<_>, _>>()?;
        // Shown only to a caller who may see the kind the entry had.
        let visible = events.iter().all(|e| match &e.body {
            EventBody::ToolRegistered { entry, .. } => entry.binding.kind().visible_to(principal.flags),
            _ => true,
        });
        if !visible {
            return Err(not_found(id, model).into());
        }
        Ok(History { id: id.to_string(), model: owner, scope, events: events.iter().map(Event::view).collect() })
    }

    /// A blob's bytes, verified against its digest.
    pub async fn read_blob(&self, urn: &BlobUrn) -> Result<Vec<u8>, EngineError> {
        Ok(self.inner.blobs.get_checked(urn, None).await?)
    }

    /// A blob's bytes for `p`: job output of a model it may use, or the content of an entry it
    /// can see in the global catalog or a model it may use. Anything else is as absent as a blob
    /// never stored, so names do not leak.
    pub async fn read_blob_as(&self, p: &Principal, urn: &BlobUrn) -> Result<Vec<u8>, EngineError> {
        if !p.is_operator() && !self.may_read_blob(p, urn) {
            return Err(CoreError::not_found(format!("no blob {urn} that {} may read", p.name)).into());
        }
        self.read_blob(urn).await
    }

    fn may_read_blob(&self, p: &Principal, urn: &BlobUrn) -> bool {
        let st = self.read_state();
        if let Some(model) =
            urn.namespace().strip_prefix(crate::dispatch::OUTPUT_NAMESPACE).and_then(|m| m.strip_prefix('/'))
        {
            return crate::access::may_use_model(&st, p, model);
        }
        let wanted = urn.to_string();
        st.catalogs.iter().filter(|(m, _)| *m == DEFAULT_MODEL || crate::access::may_use_model(&st, p, m)).any(
            |(_, c)| {
                c.values().any(|e| {
                    e.entry.binding.kind().visible_to(p.flags)
                        && match &e.entry.binding {
                            Binding::Script(s) => s.script_urn == wanted,
                            Binding::Toolnet(t) => t.net_urn == wanted,
                            Binding::Host(_) => false,
                        }
                })
            },
        )
    }

    /// The script of an entry, verified against the pinned size and sha256.
    pub async fn read_script(&self, model: &str, id: &str) -> Result<Vec<u8>, EngineError> {
        let binding = {
            let st = self.read_state();
            let (e, _) = st.resolve(model, id).ok_or_else(|| not_found(id, model))?;
            e.entry.binding.clone()
        };
        let Binding::Script(s) = binding else {
            return Err(CoreError::bad_input("not_a_script", format!("{id:?} is not a script tool")).into());
        };
        let urn: BlobUrn = s.script_urn.parse()?;
        if urn.sha256() != s.sha256 {
            return Err(CoreError::new(
                agentos_core::ErrorKind::Corrupt,
                "pin_mismatch",
                "the entry's URN and pin disagree",
            )
            .into());
        }
        Ok(self.inner.blobs.get_checked(&urn, Some(s.size_bytes)).await?)
    }

    pub fn models(&self) -> Vec<ModelView> {
        self.read_state().model_views()
    }

    /// The models `p` may use, and the global catalog's `default`.
    pub fn models_for(&self, p: &Principal) -> Vec<ModelView> {
        let st = self.read_state();
        st.model_views()
            .into_iter()
            .filter(|m| m.name == DEFAULT_MODEL || crate::access::may_use_model(&st, p, &m.name))
            .collect()
    }

    /// Number of entries in every catalog.
    pub fn entry_count(&self) -> usize {
        self.read_state().catalogs.values().map(|c| c.len()).sum()
    }

    pub fn last_seq(&self) -> u64 {
        self.read_state().last_seq
    }

    /// Stops taking commands, lets the committed ones finish, and writes a final snapshot.
    pub async fn shutdown(&self) {
        if let Some(r) = self.inner.reaper.lock().unwrap_or_else(|p| p.into_inner()).take() {
            r.abort();
        }
        if let Some(n) = self.inner.net_loop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            n.abort();
        }
        self.inner.nets.clean_stop();
        drop(self.inner.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        let committer = self.inner.committer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(c) = committer {
            // The committer ends once every command queued before the channel closed is answered.
            let _ = tokio::task::spawn_blocking(move || c.join()).await;
        }
        let running = self.inner.snapshots.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = running {
            let _ = t.await;
        }
        if self.last_seq() > self.inner.snapshots.last_seq.load(Ordering::Relaxed)
            && let Err(e) = write_snapshot(&self.inner.state, &self.inner.log).await
        {
            tracing::warn!(error = %e, "final snapshot failed");
        }
    }

    /// Writes a snapshot now (used by tests and benchmarks).
    pub async fn snapshot_now(&self) -> Result<u64, EngineError> {
        let seq = write_snapshot(&self.inner.state, &self.inner.log).await?;
        self.inner.snapshots.last_seq.store(seq, Ordering::Relaxed);
        Ok(seq)
    }
}

fn start_snapshot(
    runtime: &tokio::runtime::Handle,
    state: &Arc<RwLock<State>>,
    log: &Arc<dyn EventLog>,
    ctl: &Arc<SnapshotControl>,
) {
    if ctl.running.swap(true, Ordering::AcqRel) {
        return;
    }
    let (state, log, ctl2) = (state.clone(), log.clone(), ctl.clone());
    let task = runtime.spawn(async move {
        match write_snapshot(&state, &log).await {
            Ok(seq) => ctl2.last_seq.store(seq, Ordering::Relaxed),
            Err(e) => {
                tracing::warn!(error = %e, "snapshot failed; the log stays the source of truth")
            }
        }
        ctl2.running.store(false, Ordering::Release);
    });
    *ctl.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
}

async fn write_snapshot(state: &Arc<RwLock<State>>, log: &Arc<dyn EventLog>) -> Result<u64, EngineError> {
    // Entries are shared, so the copy under the lock is cheap; serializing happens outside it.
    let copy = state.read().unwrap_or_else(|p| p.into_inner()).clone();
    let seq = copy.last_seq;
    let data = tokio::task::spawn_blocking(move || serde_json::to_vec(&copy))
        .await
        .map_err(|e| CoreError::internal(format!("snapshot task: {e}")))?
        .map_err(|e| CoreError::internal(format!("snapshot encoding: {e}")))?;
    log.save_snapshot(Snapshot { seq, schema: STATE_SCHEMA_VERSION, data }).await?;
    tracing::debug!(seq, "snapshot written");
    // The encoded snapshot and the entries decoded to encode it are freed by now. Off the runtime's
    // threads: trimming walks the allocator's free lists, a few milliseconds on a large heap.
    let _ = tokio::task::spawn_blocking(release_free_memory).await;
    Ok(seq)
}

/// Hands the memory the allocator holds free back to the system. glibc keeps what a thread frees in
/// that thread's heap for reuse, and a snapshot read or written frees tens of MiB at once (its text, and
/// the values decoded or encoded on the way): without a trim, that much stayed resident for the life of
/// the master. Measured in BENCHMARKS.md (resident memory at 100,000 entries).
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and only returns free pages of the allocator's own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn not_found(id: &str, model: &str) -> CoreError {
    if model == DEFAULT_MODEL {
        CoreError::not_found(format!("no tool {id:?} in the global catalog"))
    } else {
        CoreError::not_found(format!("no tool {id:?} in model {model:?} nor in the global catalog"))
    }
}

fn write_secret_file(path: &Path, content: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("secret")));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.write_all(content.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}
