//! Script tools: content pinned by sha256 in the blob store, run by executors. The master
//! verifies the content against its pin when it hands the job out; the executor again before
//! it runs it.

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use agentos_core::command::{HeaderFields, Limits, Plan, fields, input_schema};
use agentos_core::entry::{Binding, BindingKind, Contract, Runtime, ScriptBinding, Status};
use agentos_core::flags::Flag;
use agentos_core::job::{CommandToken, InvokeRequest, JobResult, ResolvedScript};
use agentos_core::name::safe_filename;
use agentos_core::urn::BlobUrn;
use agentos_core::{CoreError, ErrorKind, sha256_hex};
use agentos_store::StoredJob;

use super::{Binder, Call, Outcome};
use crate::dispatch::Ended;
use crate::{Engine, EngineError, Principal};

/// The blob namespace of script content.
pub const SCRIPT_NAMESPACE: &str = "tool-catalog/scripts";

/// The registration command of script tools.
pub const REGISTER_SCRIPT: &str = "TOOL_CATALOG_REGISTER_SCRIPT";

pub struct Script;

#[async_trait]
impl Binder for Script {
    fn kind(&self) -> BindingKind {
        BindingKind::Script
    }

    fn register_command(&self) -> Option<&'static str> {
        Some(REGISTER_SCRIPT)
    }

    fn registering(&self) -> &'static str {
        "register scripts"
    }

    async fn plan(&self, engine: &Engine, p: &Principal, body: Value) -> Result<Plan, EngineError> {
        let cmd: RegisterScript = fields(REGISTER_SCRIPT, body)?;
        Ok(cmd.plan(&p.home_model, &engine.inner.catalog.limits)?)
    }

    fn pinned_blob<'b>(&self, binding: &'b Binding) -> Option<&'b str> {
        match binding {
            Binding::Script(s) => Some(&s.script_urn),
            _ => None,
        }
    }

    fn secret_pin(&self, binding: &Binding) -> Option<String> {
        match binding {
            Binding::Script(s) => Some(s.sha256.clone()),
            _ => None,
        }
    }

    async fn invoke(&self, engine: &Engine, call: Call<'_>) -> Result<Outcome, EngineError> {
        let flags = call.principal.flags;
        if !flags.has(Flag::Execute) && flags.has(Flag::ToolNets) {
            // A tool net caller without `x` sees no other kind of tool at all.
            return Err(CoreError::not_found(format!(
                "no tool net {:?} in model {:?} nor in the global catalog",
                call.id, call.model
            ))
            .into());
        }
        Ok(Outcome::Job(Box::new(invoke_script(engine, call).await?)))
    }

    async fn queue(&self, engine: &Engine, call: Call<'_>) -> Result<String, EngineError> {
        let principal = call.principal;
        let job = script_job(engine, call)?;
        // An asynchronous job holds no invocation slot while it waits, so the same limit counts
        // open jobs instead: a caller cannot flood the durable queue either.
        let max = engine.inner.principals.slots.max();
        if engine.inner.dispatch.jobs.open_jobs_of(&principal.id).await? >= max {
            // Waiting helps only while an executor serves the queue: with none, the open jobs
            // stay queued until one comes.
            let advice = match engine.inner.dispatch.jobs.serving().await {
                Ok(true) => "wait for one to finish".to_string(),
                Ok(false) => format!(
                    "{}, so none will finish until one starts: start one with `agentos executor`",
                    nobody_serves(engine)
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "reading who serves the queue failed");
                    "wait for one to finish (whether an executor serves the queue could not be read; the master's log says why)".to_string()
                }
            };
            return Err(CoreError::new(
                ErrorKind::TooMany,
                "too_many_invocations",
                format!("{} has {max} jobs open, the limit; {advice}", principal.name),
            )
            .into());
        }
        let job_id = engine.inner.dispatch.jobs.new_id();
        queue_storing(engine, principal, job_id.clone(), job, true).await?;
        Ok(job_id)
    }
}

/// `TOOL_CATALOG_REGISTER_SCRIPT`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterScript {
    pub id: String,
    pub name: String,
    /// One of `node`, `sh`, `bash`, `python3`.
    pub runtime: String,
    /// The script as text. Exactly one of `content` and `contentBase64`.
    #[serde(default)]
    pub content: Option<String>,
    /// The script as base64, for content that is not UTF-8.
    #[serde(default)]
    pub content_base64: Option<String>,
    /// Where to register: a model name, or `default` for the global catalog. Defaults to the caller's home model.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub capabilities: Option<Vec<String>>,
    /// File name the executor gives the script; reduced to a safe base name.
    #[serde(default)]
    pub filename: Option<String>,
    /// JSON Schema of the script's input (sent as JSON on stdin).
    #[serde(default)]
    pub input: Option<Value>,
    /// Environment variable names the script takes from its caller in a run that carries a
    /// secret; other names are dropped there. At most 32; `PATH`, `HOME`, `LANG`, `LD_*`,
    /// `NODE_*`, `PYTHON*`, `BASH_ENV` and `ENV` are refused.
    #[serde(default)]
    pub env: Option<Vec<String>>,
}

impl RegisterScript {
    /// Validates every field and derives the entry. Nothing is written.
    pub fn plan(self, home_model: &str, limits: &Limits) -> Result<Plan, CoreError> {
        let runtime = Runtime::parse(&self.runtime).ok_or_else(|| {
            CoreError::bad_input(
                "unknown_runtime",
                format!("unknown runtime {:?}; use one of node, sh, bash, python3", self.runtime),
            )
        })?;
        let header = HeaderFields {
            id: self.id,
            name: self.name,
            model: self.model,
            version: self.version,
            description: self.description,
            capabilities: self.capabilities,
        }
        .check(home_model)?;
        let bytes = match (self.content, self.content_base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(b64)) => {
                // A base64 body larger than 4/3 of the cap cannot decode under it: refuse before decoding.
                if b64.len() / 4 * 3 > limits.max_script_bytes + 3 {
                    return Err(too_large(b64.len() / 4 * 3, limits));
                }
                base64::engine::general_purpose::STANDARD.decode(b64.trim()).map_err(|e| {
                    CoreError::bad_input("invalid_base64", format!("contentBase64 is not valid base64: {e}"))
                })?
            }
            (Some(_), Some(_)) => {
                return Err(CoreError::bad_input("invalid_command", "give either content or contentBase64, not both"));
            }
            (None, None) => {
                return Err(CoreError::bad_input(
                    "missing_field",
                    "the script has no content: give content (text) or contentBase64",
                ));
            }
        };
        if bytes.is_empty() {
            return Err(CoreError::bad_input("empty_content", "the script content is empty"));
        }
        if bytes.len() > limits.max_script_bytes {
            return Err(too_large(bytes.len(), limits));
        }
        let input = input_schema(self.input)?;
        let ext = runtime.extension();
        let filename = match self.filename.as_deref() {
            Some(raw) if raw.split(['/', '\\']).any(|c| c == "..") => {
                return Err(CoreError::bad_input(
                    "invalid_filename",
                    format!(
                        "filename {raw:?} climbs out of its folder with '..'; give a plain file name such as \"{}.{ext}\"",
                        header.id
                    ),
                ));
            }
            Some(raw) => safe_filename(raw).ok_or_else(|| {
                CoreError::bad_input(
                    "invalid_filename",
                    format!("filename {raw:?} has no usable base name; use letters, digits, '.', '_' and '-'"),
                )
            })?,
            None => format!("{}.{ext}", header.id),
        };
        let env = self.env.unwrap_or_default();
        if env.len() > 32 {
            return Err(CoreError::bad_input("invalid_env", "env names at most 32 variables"));
        }
        for name in &env {
            let shaped = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.len() <= 128
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !shaped {
                return Err(CoreError::bad_input(
                    "invalid_env",
                    format!("env name {name:?}: use letters, digits and '_', not starting with a digit"),
                ));
            }
            if agentos_core::entry::reserved_env_name(name) {
                return Err(CoreError::bad_input(
                    "invalid_env",
                    format!("env name {name:?} is reserved: the runtime reads it before the script runs"),
                ));
            }
        }
        let sha256 = sha256_hex(&bytes);
        let urn = BlobUrn::new(SCRIPT_NAMESPACE, &sha256, Some(ext))?;
        let contract = Contract { kind: "script-io".into(), operations: header.run_operation(input) };
        let binding = Binding::Script(ScriptBinding {
            runtime,
            script_urn: urn.to_string(),
            sha256,
            filename,
            size_bytes: bytes.len() as u64,
            env,
        });
        let (model, entry) = header.into_entry(Status::Approved, contract, binding);
        Ok(Plan { model, entry, blobs: vec![(urn, bytes)] })
    }
}

fn too_large(len: usize, limits: &Limits) -> CoreError {
    CoreError::new(
        ErrorKind::TooLarge,
        "content_too_large",
        format!(
            "the script is {len} bytes; the limit is {} bytes (the master's --max-script-bytes)",
            limits.max_script_bytes
        ),
    )
}

/// A direct invocation's job, checked and ready to queue.
pub(crate) struct ScriptJob {
    model: String,
    token: CommandToken,
    timeout_ms: u64,
}

/// Checks a direct invocation of a script and builds its command token.
fn script_job(engine: &Engine, call: Call<'_>) -> Result<ScriptJob, EngineError> {
    let Call { principal, id, model, entry, req, .. } = call;
    if !principal.flags.has(Flag::Execute) {
        return Err(CoreError::forbidden(format!(
            "{} may not invoke tools: that needs the 'x' (execute) flag",
            principal.name
        ))
        .into());
    }
    let cfg = engine.inner.dispatch.config;
    super::check_timeout(engine, req.timeout_ms)?;
    let timeout_ms = req.timeout_ms.unwrap_or(cfg.default_timeout_ms);
    for k in req.env.keys() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(CoreError::bad_input(
                "invalid_env",
                format!("environment variable name {} is not valid", agentos_core::name::shown(k)),
            )
            .into());
        }
        agentos_core::job::check_env_name(k).map_err(|why| CoreError::bad_input("invalid_env", why))?;
    }
    // No process can be given a NUL byte in an argument or a variable's value: refused here,
    // before a job is queued, rather than failing on the executor with a misleading reason.
    if let Some(i) = req.argv.iter().position(|a| a.contains('\0')) {
        return Err(CoreError::bad_input(
            "invalid_argv",
            format!("argv[{i}] holds a NUL byte, which no process can be given"),
        )
        .into());
    }
    if let Some(k) = req.env.iter().find_map(|(k, v)| v.contains('\0').then_some(k)) {
        return Err(CoreError::bad_input(
            "invalid_env",
            format!(
                "the value of environment variable {} holds a NUL byte, which no process can be given",
                agentos_core::name::shown(k)
            ),
        )
        .into());
    }
    // The input travels inside the job's token, stored and handed out in envelopes of their
    // own: as deep as a net's token may be, so that every reader of those reads it back.
    if let Some(input) = &req.input {
        agentos_core::depth::check_depth("input", input)?;
    }
    // The caller must be able to see the tool, and it must be there now: an invocation of a
    // tool that is not is answered 404 before a job is queued (a net's command still ships and
    // fails at hand-out with the reason, like any fire).
    let unknown = || -> EngineError {
        CoreError::not_found(format!(
            "no tool {} in model {model:?} nor in the global catalog (see `agentos list-tools`)",
            agentos_core::name::shown(id)
        ))
        .into()
    };
    let Some(e) = &entry else { return Err(unknown()) };
    {
        let kind = e.entry.binding.kind();
        if !kind.visible_to(principal.flags) {
            return Err(unknown());
        }
        if kind != BindingKind::Script {
            return Err(CoreError::bad_input(
                "not_invocable",
                format!("{id:?} is a {} tool; only script tools run on executors", kind.as_str()),
            )
            .into());
        }
    }
    let InvokeRequest { argv, env, input, .. } = req;
    let mut args = json!({"toolId": id, "argv": argv, "env": env, "timeoutMs": timeout_ms});
    if let Some(input) = input {
        args["input"] = input;
    }
    let token = CommandToken { executor: "script".into(), command: "invoke".into(), args };
    Ok(ScriptJob { model: model.to_string(), token, timeout_ms })
}

/// Queues a direct invocation's job. When jobs are durable it is stored before it is queued
/// (`store_first`, for a caller answered with the job's id at once); for a caller who waits for
/// the result, as it is queued when `store_after` is 0, and otherwise the job to store if it
/// runs long comes back (see `result_storing_late`).
async fn queue_storing(
    engine: &Engine,
    principal: &Principal,
    job_id: String,
    job: ScriptJob,
    store_first: bool,
) -> Result<(Option<StoredJob>, tokio::sync::oneshot::Receiver<JobResult>), EngineError> {
    let mut later = None;
    if let Some(d) = engine.inner.dispatch.durable.get() {
        let token = serde_json::to_string(&job.token).map_err(|e| CoreError::internal(e.to_string()))?;
        let stored = StoredJob {
            job_id: job_id.clone(),
            model: job.model.clone(),
            invoker: principal.id.clone(),
            token,
            queued_at: crate::records::now_ms(),
        };
        let stopped = || CoreError::internal("the job store's writer stopped");
        let (done, stored_rx) = tokio::sync::oneshot::channel();
        if store_first {
            d.writes.send(crate::jobs::StoreWrite::Put(stored, done)).map_err(|_| stopped())?;
            stored_rx.await.map_err(|_| stopped())??;
        } else if engine.inner.dispatch.config.store_after.is_zero() {
            // Nobody waits for this store to be durable: a failure is logged by the writer.
            d.writes.send(crate::jobs::StoreWrite::Put(stored, done)).map_err(|_| stopped())?;
        } else {
            d.unstored.lock().unwrap_or_else(|e| e.into_inner()).insert(job_id.clone());
            later = Some(stored);
        }
    }
    let rx = engine.inner.dispatch.jobs.enqueue_direct(job_id, job.model, job.token, principal.id.clone()).await?;
    Ok((later, rx))
}

/// The result of a job whose caller waits for it. A job without one after `store_after` is
/// stored then, so that a master that dies from there on runs it again at its next start (it
/// is removed once its result is recorded, by `Dispatch::finish`); a job that ends sooner never
/// touches the store. Until its result the caller has been told nothing, not even the job's id:
/// a master that dies before the job is stored leaves a job that may have run and is not run
/// again, which the caller sees as a broken connection.
async fn result_storing_late(
    engine: &Engine,
    job_id: &str,
    later: Option<StoredJob>,
    mut rx: tokio::sync::oneshot::Receiver<JobResult>,
) -> Result<JobResult, tokio::sync::oneshot::error::RecvError> {
    let (Some(job), Some(d)) = (later, engine.inner.dispatch.durable.get()) else { return rx.await };
    tokio::select! {
        // A result that is there already wins over a timer that is up.
        biased;
        r = &mut rx => return r,
        _ = tokio::time::sleep(engine.inner.dispatch.config.store_after) => {}
    }
    {
        // Still not stored and not ended (whoever ends it takes it out of the set first): the
        // put goes on the channel under the lock, before any removal can.
        let mut unstored = d.unstored.lock().unwrap_or_else(|e| e.into_inner());
        if unstored.remove(job_id) {
            // Nobody waits for this store to be durable: a failure is logged by the writer, and
            // the job runs on (its result is recorded in the log all the same).
            let (done, _) = tokio::sync::oneshot::channel();
            let _ = d.writes.send(crate::jobs::StoreWrite::Put(job, done));
        }
    }
    rx.await
}

/// Drops the job of a caller that went away while it waited (its connection closed, so the
/// future answering it was dropped), as its timeout would: a job is not run for nobody, nor run
/// again from the job store after a restart, and one an executor holds is stopped at its next
/// heartbeat, freeing the slot. A caller dropped because the master is stopping did not go
/// away: its job is left, to run again after the restart like any job open at a crash. (A
/// caller gone while its job is being queued is dealt with where it is queued.)
struct CallerGone {
    /// `None` once the caller is answered, or its job dealt with.
    engine: Option<Engine>,
    job_id: String,
}

impl CallerGone {
    /// The caller is still there and the job goes: dropped on a task of its own, which a
    /// caller that goes away meanwhile does not stop half way.
    async fn cancel(mut self) {
        if let Some(engine) = self.engine.take() {
            let job_id = std::mem::take(&mut self.job_id);
            let _ = tokio::spawn(async move { engine.dispatch().cancel_direct(&job_id).await }).await;
        }
    }
}

impl Drop for CallerGone {
    fn drop(&mut self) {
        let Some(engine) = self.engine.take() else { return };
        if engine.inner.dispatch.stopping.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let job_id = std::mem::take(&mut self.job_id);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { engine.dispatch().cancel_direct(&job_id).await });
        }
    }
}

async fn invoke_script(engine: &Engine, call: Call<'_>) -> Result<JobResult, EngineError> {
    let (principal, id) = (call.principal, call.id.to_string());
    let cfg = engine.inner.dispatch.config;
    let job = script_job(engine, call)?;
    let timeout_ms = job.timeout_ms;
    let job_id = engine.inner.dispatch.jobs.new_id();
    let (later, rx) = if engine.inner.dispatch.jobs.is_shared() {
        // The shared queue's insert goes to the database: a caller dropped while it is in
        // flight would leave a row that a cancel sent then does not find yet. So it is queued
        // on a task of its own, which drops the job itself when its caller is gone by then.
        let (queued, answer) = tokio::sync::oneshot::channel();
        let (e, p, id) = (engine.clone(), principal.clone(), job_id.clone());
        tokio::spawn(async move {
            let outcome = queue_storing(&e, &p, id.clone(), job, false).await;
            if let Err(Ok(_)) = queued.send(outcome) {
                e.dispatch().cancel_direct(&id).await;
            }
        });
        answer.await.map_err(|_| CoreError::internal("queueing the job stopped"))??
    } else {
        // This master's own queue takes the job without waiting on anything: nothing can stop
        // it half way.
        queue_storing(engine, principal, job_id.clone(), job, false).await?
    };
    let mut gone = CallerGone { engine: Some(engine.clone()), job_id: job_id.clone() };
    let mut result = std::pin::pin!(result_storing_late(engine, &job_id, later, rx));
    let wait = Duration::from_millis(timeout_ms) + cfg.queue_grace;
    let deadline = tokio::time::Instant::now() + wait;
    let mut early = None;
    // Whether an executor serves the queue decides how long the caller waits. A queue that
    // cannot tell refuses the caller with why, rather than say "none", and keeps no job for them.
    let mut serving = engine.inner.dispatch.jobs.serving().await;
    if serving.as_ref().is_ok_and(|s| !s) {
        // Nobody serves the queue: wait a little for an executor (one reconnecting after a
        // master restart, say), then say so rather than hold the caller for the whole wait.
        let grace = cfg.no_executor_grace.min(wait);
        early = tokio::time::timeout(grace, result.as_mut()).await.ok();
        serving = match early {
            Some(_) => Ok(true),
            None => engine.inner.dispatch.jobs.serving().await,
        };
    }
    let unserved = || {
        CoreError::new(
            ErrorKind::Unavailable,
            "no_executor",
            format!(
                "{}, so {id:?} cannot run; start one with `agentos executor` (`agentos up` starts one beside the master)",
                nobody_serves(engine)
            ),
        )
    };
    match serving {
        Ok(true) => {}
        Ok(false) => {
            gone.cancel().await;
            return Err(unserved().into());
        }
        Err(e) => {
            gone.cancel().await;
            return Err(e);
        }
    }
    let outcome = match early {
        Some(r) => Ok(r),
        None => match wait_while_served(engine, result.as_mut(), deadline, cfg.no_executor_grace).await {
            Waited::Done(r) => Ok(r),
            Waited::TimedOut => {
                let serving = engine
                    .inner
                    .dispatch
                    .jobs
                    .executors_shown(|_| true)
                    .await
                    .map(|all| {
                        all.iter().filter(|e| !matches!(e.state.as_str(), "gone" | "stopped" | "silent")).count()
                    })
                    .unwrap_or(0);
                Err(CoreError::new(
                    ErrorKind::Unavailable,
                    "job_timeout",
                    format!(
                        "job {job_id} got no result within {} ms; {serving} executor(s) serve the queue (see `agentos executors`)",
                        wait.as_millis()
                    ),
                ))
            }
            // Every executor went away while the job waited (killed, or stopped beside a killed
            // sibling's lease that has since ended): said now, not at the deadline.
            Waited::Unserved => Err(CoreError::new(
                ErrorKind::Unavailable,
                "no_executor",
                format!(
                    "every executor that served the queue has gone (killed, or stopped: none polls it, holds a job or was heard from in the last {} s) and none came in the {} s after, so job {job_id} of {id:?} was cancelled (if an executor took it, it may have run there in part); start one with `agentos executor`",
                    engine.inner.dispatch.jobs.config().serving_within().as_secs(),
                    cfg.no_executor_grace.as_secs()
                ),
            )),
        },
    };
    // From here every way out answers the caller, who is still there.
    let unanswered = match outcome {
        Ok(Ok(result)) => {
            gone.engine = None;
            return Ok(result);
        }
        Ok(Err(_)) => {
            gone.engine = None;
            return Err(CoreError::internal("the job ended without a result").into());
        }
        Err(e) => e,
    };
    // The job goes with its answer, recorded with the same words, so that the job the caller
    // is told of reads back (`agentos job show`), with where it was running and for how long.
    gone.engine = None;
    let not_ended = |why: &str| {
        let mut e = unanswered.clone();
        e.message = format!("{}; but job {job_id} could not be ended ({why}): it may still run", e.message);
        e
    };
    match engine.dispatch().end_open(&job_id, None, unanswered.message.clone()).await {
        Ok(Ended::Recorded(_)) => Err(unanswered.into()),
        // Its result came meanwhile: that is the answer.
        Ok(Ended::NotOpen) => match tokio::time::timeout(Duration::from_secs(5), result.as_mut()).await {
            Ok(Ok(r)) => Ok(r),
            _ => Err(not_ended("its result was being recorded; `agentos job show` reads it").into()),
        },
        Ok(Ended::NotRecorded) => Err(not_ended("the master's log refused the commit; its log says why").into()),
        Err(e) => {
            tracing::warn!(job = %job_id, error = %e, "ending an unanswered job failed: it is dropped");
            engine.dispatch().cancel_direct(&job_id).await;
            Err(not_ended(&e.to_string()).into())
        }
    }
}

/// Why no executor counts as serving the queue, in words.
fn nobody_serves(engine: &Engine) -> String {
    format!(
        "no executor serves the queue (none polls it, holds a job or was heard from in the last {} s, or each one that was has since stopped)",
        engine.inner.dispatch.jobs.config().serving_within().as_secs()
    )
}

/// How often a caller waiting on its job asks whether an executor still serves the queue.
const RECHECK_SERVING: Duration = Duration::from_secs(5);

/// How a wait for a job's result ended.
enum Waited<T> {
    Done(T),
    TimedOut,
    /// No executor served the queue for `grace` on end.
    Unserved,
}

/// Waits for `result` until `deadline`, asking every [`RECHECK_SERVING`] whether an executor
/// still serves the queue: one that stops serving for `grace` on end ends the wait, since no job
/// runs until one starts. A queue that cannot tell is taken as served (the deadline still holds).
async fn wait_while_served<T>(
    engine: &Engine,
    mut result: std::pin::Pin<&mut impl std::future::Future<Output = T>>,
    deadline: tokio::time::Instant,
    grace: Duration,
) -> Waited<T> {
    let mut unserved_since: Option<tokio::time::Instant> = None;
    loop {
        let check_at = (tokio::time::Instant::now() + RECHECK_SERVING).min(deadline);
        tokio::select! {
            // The result first, as a timeout would poll it: one ready on the tick the timer fires
            // is taken, not dropped.
            biased;
            r = result.as_mut() => return Waited::Done(r),
            () = tokio::time::sleep_until(check_at) => {}
        }
        let now = tokio::time::Instant::now();
        // A result that came while the queue was asked about is taken before giving up.
        let given_up = if now >= deadline {
            Waited::TimedOut
        } else if matches!(engine.inner.dispatch.jobs.serving().await, Ok(false)) {
            // On a shared queue a "no" is not cached: each waiter reads the database every
            // `RECHECK_SERVING` until the grace ends, a bounded number of reads.
            let since = *unserved_since.get_or_insert(now);
            if now.duration_since(since) < grace {
                continue;
            }
            Waited::Unserved
        } else {
            unserved_since = None;
            continue;
        };
        return match futures_util::FutureExt::now_or_never(result.as_mut()) {
            Some(r) => Waited::Done(r),
            None => given_up,
        };
    }
}

/// Fire-time resolution: local first, blob read and checked against the pin, the script put
/// beside `args`. On any failure the token ships untouched, with the reason beside it.
/// How [`resolve_token`]'s reason starts when the blob store was out, not the job at fault.
pub(crate) const STORAGE_OUT: &str = "storage unavailable: ";

pub(crate) async fn resolve_token(engine: &Engine, model: &str, token: CommandToken) -> (CommandToken, Option<String>) {
    if token.executor != "script" || token.command != "invoke" {
        return (token, None);
    }
    let Some(tool_id) = token.args.get("toolId").and_then(Value::as_str).map(str::to_string) else {
        return (token, Some("the command names no tool: args.toolId is missing".into()));
    };
    let fail = |why: String| Some(format!("tool {tool_id:?} in model {model:?}: {why}"));
    let binding = {
        let st = engine.read_state();
        st.resolve(model, &tool_id).map(|(e, _)| e.entry.binding.clone())
    };
    let Some(Binding::Script(s)) = binding else {
        return (token, fail("not found in the model's catalog nor in the global one".into()));
    };
    if let Some(pin) = token.args.get(agentos_core::job::PINNED_SHA256).and_then(Value::as_str).map(str::to_string)
        && pin != s.sha256
    {
        // The secrets in this job were granted to another version of the script: they do not ship.
        let mut token = token;
        if let Some(args) = token.args.as_object_mut() {
            args.remove("env");
        }
        return (
            token,
            fail(format!(
                "the script changed since its secrets were granted (pinned {pin}, now {}); the grant does not cover it",
                s.sha256
            )),
        );
    }
    let urn: BlobUrn = match s.script_urn.parse() {
        Ok(u) => u,
        Err(e) => return (token, fail(format!("the entry's URN is not valid: {e}"))),
    };
    if urn.sha256() != s.sha256 {
        return (
            token,
            fail(format!("hash mismatch: the entry's URN names {} but it is pinned to {}", urn.sha256(), s.sha256)),
        );
    }
    let bytes = match engine.inner.catalog.blobs.get_checked(&urn, Some(s.size_bytes)).await {
        Ok(b) => b,
        Err(agentos_store::StoreError::BlobNotFound(_)) => {
            return (token, fail(format!("blob missing: {urn} is not in the blob store")));
        }
        Err(agentos_store::StoreError::BlobCorrupt { why, .. }) => {
            tracing::error!(tool = %tool_id, model, %urn, %why, "script refused at the master: hash mismatch");
            return (
                token,
                fail(format!("hash mismatch: the stored script no longer matches its pin {} ({why})", s.sha256)),
            );
        }
        // The store out for now (a database or object store restarting) is no fault of the job:
        // said apart, so that the job waits for it rather than failing for good.
        Err(agentos_store::StoreError::Unavailable(why)) => {
            return (token, Some(format!("{STORAGE_OUT}tool {tool_id:?} in model {model:?}: {why}")));
        }
        Err(e) => return (token, fail(format!("blob unreadable: {e}"))),
    };
    let mut resolved = token;
    ResolvedScript {
        content_base64: base64::engine::general_purpose::STANDARD.encode(&bytes),
        sha256: s.sha256,
        runtime: s.runtime.as_str().to_string(),
        filename: s.filename,
    }
    .put_into(&mut resolved.args);
    (resolved, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(mut v: Value) -> Result<Plan, CoreError> {
        match v.as_object_mut().and_then(|o| o.remove("type")).as_ref().and_then(Value::as_str) {
            Some(REGISTER_SCRIPT) => {}
            Some(_) => return Err(CoreError::bad_input("unknown_command", "not a script registration")),
            None => return Err(CoreError::bad_input("invalid_command", "no type")),
        }
        let r: RegisterScript = fields(REGISTER_SCRIPT, v)?;
        r.plan("default", &Limits { max_script_bytes: 16 })
    }

    fn check(v: Value, code: &str) {
        let err = plan(v).unwrap_err();
        assert_eq!(err.code, code, "{}", err.message);
    }

    #[test]
    fn refuses_bad_registrations() {
        let base = json!({"type":"TOOL_CATALOG_REGISTER_SCRIPT","id":"x","name":"X","runtime":"sh","content":"echo"});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            b
        };
        check(with("runtime", json!("ruby")), "unknown_runtime");
        check(with("id", json!("Bad_Id")), "invalid_id");
        check(with("content", json!("x".repeat(17))), "content_too_large");
        check(with("filename", json!("../..")), "invalid_filename");
        check(with("filename", json!("../../etc/passwd")), "invalid_filename");
        check(with("filename", json!("a\\..\\b.sh")), "invalid_filename");
        check(with("filename", json!("/")), "invalid_filename");
        check(with("model", json!("../m")), "invalid_model");
        check(with("input", json!(3)), "invalid_schema");
        check(with("surprise", json!(1)), "invalid_command");
        check(json!({"type":"NOPE"}), "unknown_command");
        check(json!({"id":"x"}), "invalid_command");
    }

    #[test]
    fn same_content_same_urn_and_safe_filename() {
        let a = plan(json!({"type":"TOOL_CATALOG_REGISTER_SCRIPT","id":"a","name":"A","runtime":"node","content":"1","filename":"/opt/tools/x.cjs"})).unwrap();
        let b = plan(json!({"type":"TOOL_CATALOG_REGISTER_SCRIPT","id":"b","name":"B","runtime":"node","content":"1"}))
            .unwrap();
        assert_eq!(a.blobs[0].0, b.blobs[0].0);
        let Binding::Script(s) = &a.entry.binding else { panic!("a script entry") };
        assert_eq!(s.filename, "x.cjs");
        assert_eq!(s.script_urn, format!("urn:agentos:blob:tool-catalog/scripts/{}.cjs", sha256_hex(b"1")));
    }
}
