//! Command dispatch on the master: queue a job, resolve and verify its script at hand-out time
//! only, shape and record the one result, and fail jobs whose leases ran out.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use agentos_core::entry::{Binding, BindingKind};
use agentos_core::event::{EventBody, PrincipalKind, PrincipalRecord};
use agentos_core::flags::{Flag, Flags};
use agentos_core::job::{CommandToken, ExecutorResult, ExecutorView, InvokeRequest, JobResult, LeasedJob, OutputBlob};
use agentos_core::name::{check_model_name, check_tool_id, is_valid_id};
use agentos_core::urn::BlobUrn;
use agentos_core::{CoreError, DEFAULT_MODEL, ErrorKind, sha256_hex};
use agentos_store::{BlobStore, JobStore, StoredJob};

use crate::jobs::{Finished, LeaseError};
use crate::principal::new_token;
use crate::{Engine, EngineError, Principal};

/// Limits of command dispatch; configurable on the master.
#[derive(Debug, Clone, Copy)]
pub struct DispatchConfig {
    /// Output above this many bytes goes to the blob store; the result keeps a preview.
    pub inline_output_bytes: usize,
    pub default_timeout_ms: u64,
    pub max_timeout_ms: u64,
    /// How long an invocation waits for an executor beyond its own timeout.
    pub queue_grace: Duration,
    /// How long an invocation waits for an executor to appear when none serves the queue.
    pub no_executor_grace: Duration,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            inline_output_bytes: 128 * 1024,
            default_timeout_ms: 120_000,
            max_timeout_ms: 600_000,
            queue_grace: Duration::from_secs(30),
            no_executor_grace: Duration::from_secs(10),
        }
    }
}

/// A finished job as the log records it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    pub job_id: String,
    pub model: String,
    /// `queued`, `running` (handed to an executor), or `finished` (`results` holds its result).
    pub state: String,
    pub results: Vec<JobResult>,
}

/// A direct invocation's job, checked and ready to queue.
struct ScriptJob {
    model: String,
    token: CommandToken,
    timeout_ms: u64,
}

/// Characters of an offloaded output kept inline.
const PREVIEW_CHARS: usize = 2000;

impl LeaseError {
    fn into_error(self, job_id: &str) -> EngineError {
        match self {
            LeaseError::UnknownJob => {
                CoreError::not_found(format!("no job {job_id:?} is open (it finished, failed, or was never queued)"))
                    .into()
            }
            LeaseError::LeaseLost => CoreError::conflict(format!(
                "the lease on job {job_id:?} is not yours: the lease id is not the job's current one (it expired and the job was handed out again, or it was never this job's)"
            ))
            .into(),
            LeaseError::NotHolder => CoreError::forbidden(format!(
                "job {job_id:?} is leased to another executor: only the executor that took it may renew, hand back or finish it"
            ))
            .into(),
        }
    }
}

fn executor_name(p: &Principal, requested: Option<&str>) -> Result<String, EngineError> {
    if p.kind != PrincipalKind::Executor {
        return Err(CoreError::forbidden("only an executor credential may use the executor protocol").into());
    }
    match requested {
        None => Ok(p.name.clone()),
        Some(n) if is_valid_id(n) => Ok(if n == p.name { n.to_string() } else { format!("{}/{n}", p.name) }),
        Some(n) => {
            Err(CoreError::bad_input("invalid_name", format!("executor name {n:?}: use a-z, 0-9 and '-', at most 64"))
                .into())
        }
    }
}

/// The blob namespace of job output that is too large to inline; the model follows.
pub(crate) const OUTPUT_NAMESPACE: &str = "job-output";

impl Engine {
    /// Creates (or rotates) an executor credential. Operator only. Returns the token.
    pub async fn create_executor_token(&self, principal: &Principal, name: &str) -> Result<String, EngineError> {
        if !principal.is_operator() {
            return Err(CoreError::forbidden("only the operator creates executor credentials").into());
        }
        if !is_valid_id(name) {
            return Err(CoreError::bad_input(
                "invalid_name",
                format!("executor name {name:?}: use a-z, 0-9 and '-', at most 64"),
            )
            .into());
        }
        if let Some(existing) = self.read_state().principals.get(name)
            && existing.kind != PrincipalKind::Executor
        {
            return Err(
                CoreError::conflict(format!("{name:?} already names a principal that is not an executor")).into()
            );
        }
        let token = new_token().map_err(|e| CoreError::internal(format!("no randomness for a token: {e}")))?;
        let record = PrincipalRecord {
            id: crate::principal::new_principal_id()
                .map_err(|e| CoreError::internal(format!("no randomness for an id: {e}")))?,
            name: name.to_string(),
            kind: PrincipalKind::Executor,
            flags: Flags::empty().to_string(),
            home_model: DEFAULT_MODEL.into(),
            token_sha256: sha256_hex(token.as_bytes()),
        };
        self.submit(
            &principal.name,
            Box::new(move |_| Ok(vec![(DEFAULT_MODEL.to_string(), EventBody::PrincipalCreated(record.clone()))])),
        )
        .await?;
        Ok(token)
    }

    /// Runs a script tool once: queues exactly the command token of DESIGN.md and waits for its result.
    /// Runs a tool once: a script through an executor (needs `x`), a tool net as an isolated
    /// instance (needs `t`). Answers the job result, or `{toolnet, output}`.
    pub async fn invoke(
        &self,
        principal: &Principal,
        id: &str,
        model: Option<&str>,
        req: InvokeRequest,
    ) -> Result<Value, EngineError> {
        check_tool_id(id)?;
        let m = model.map(str::to_string).unwrap_or_else(|| principal.home_model.clone());
        check_model_name(&m)?;
        let toolnet = {
            let st = self.read_state();
            crate::access::check_catalog_read(&st, principal, &m)?;
            match st.resolve(&m, id).map(|(e, _)| (e.entry.binding.clone(), e.owner.to_string())) {
                Some((Binding::Toolnet(b), owner)) => Some((b, owner)),
                _ => None,
            }
        };
        if let Some((b, author)) = toolnet {
            if !principal.flags.has(Flag::ToolNets) {
                // Without `t` a tool net is not visible at all.
                if !principal.flags.has(Flag::Execute) {
                    return Err(CoreError::forbidden(format!(
                        "{} may not invoke tools: that needs 'x' or 't'",
                        principal.name
                    ))
                    .into());
                }
                return Err(
                    CoreError::not_found(format!("no tool {id:?} in model {m:?} nor in the global catalog")).into()
                );
            }
            let urn: BlobUrn = b.net_urn.parse()?;
            let bytes = self.inner.blobs.get_checked(&urn, Some(b.size_bytes)).await?;
            let doc: agentos_core::net::NetDoc = serde_json::from_slice(&bytes).map_err(|e| {
                CoreError::new(
                    ErrorKind::Corrupt,
                    "toolnet_corrupt",
                    format!("the stored net of {id:?} does not parse: {e}"),
                )
            })?;
            let timeout = Duration::from_millis(
                req.timeout_ms
                    .unwrap_or(self.inner.dispatch.default_timeout_ms)
                    .min(self.inner.dispatch.max_timeout_ms),
            );
            let input = req.input.unwrap_or(Value::Null);
            let call = crate::nets::ToolnetCall {
                id,
                author,
                resolve_model: &m,
                doc,
                input_place: &b.input_place,
                output_place: &b.output_place,
                input,
                timeout,
            };
            let output = self.invoke_toolnet(principal, call).await?;
            return Ok(json!({"toolnet": id, "output": output}));
        }
        if !principal.flags.has(Flag::Execute) && principal.flags.has(Flag::ToolNets) {
            // A tool net caller without `x` sees no other kind of tool at all.
            return Err(
                CoreError::not_found(format!("no tool net {id:?} in model {m:?} nor in the global catalog")).into()
            );
        }
        let result = self.invoke_script(principal, id, Some(&m), req).await?;
        Ok(serde_json::to_value(result).map_err(|e| CoreError::internal(e.to_string()))?)
    }

    /// Checks a direct invocation of a script and builds its command token.
    fn script_job(
        &self,
        principal: &Principal,
        id: &str,
        model: Option<&str>,
        req: InvokeRequest,
    ) -> Result<ScriptJob, EngineError> {
        if !principal.flags.has(Flag::Execute) {
            return Err(CoreError::forbidden(format!(
                "{} may not invoke tools: that needs the 'x' (execute) flag",
                principal.name
            ))
            .into());
        }
        check_tool_id(id)?;
        let model = model.map(str::to_string).unwrap_or_else(|| principal.home_model.clone());
        check_model_name(&model)?;
        crate::access::check_catalog_read(&self.read_state(), principal, &model)?;
        let cfg = self.inner.dispatch;
        let timeout_ms = req.timeout_ms.unwrap_or(cfg.default_timeout_ms);
        if timeout_ms == 0 || timeout_ms > cfg.max_timeout_ms {
            return Err(CoreError::bad_input(
                "invalid_timeout",
                format!("timeoutMs must be between 1 and {}", cfg.max_timeout_ms),
            )
            .into());
        }
        for k in req.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(CoreError::bad_input(
                    "invalid_env",
                    format!("environment variable name {k:?} is not valid"),
                )
                .into());
            }
        }
        {
            // The caller must be able to see the tool. One it cannot resolve ships anyway and
            // fails at the executor with the reason, like any fire.
            let st = self.read_state();
            if let Some((e, _)) = st.resolve(&model, id) {
                let kind = e.entry.binding.kind();
                if !kind.visible_to(principal.flags) {
                    return Err(CoreError::not_found(format!(
                        "no tool {id:?} in model {model:?} nor in the global catalog"
                    ))
                    .into());
                }
                if kind != BindingKind::Script {
                    return Err(CoreError::bad_input(
                        "not_invocable",
                        format!("{id:?} is a {} tool; only script tools run on executors", kind.as_str()),
                    )
                    .into());
                }
            }
        }
        let mut args = json!({"toolId": id, "argv": req.argv, "env": req.env, "timeoutMs": timeout_ms});
        if let Some(input) = req.input {
            args["input"] = input;
        }
        let token = CommandToken { executor: "script".into(), command: "invoke".into(), args };
        Ok(ScriptJob { model, token, timeout_ms })
    }

    /// Queues a direct invocation's job, stored first when jobs are durable (the caller hears
    /// of the job only once a crash can no longer lose it).
    async fn queue_direct(
        &self,
        principal: &Principal,
        job: ScriptJob,
    ) -> Result<(String, tokio::sync::oneshot::Receiver<JobResult>), EngineError> {
        let job_id = self.inner.jobs.new_id();
        if let Some(d) = self.inner.durable.get() {
            let token = serde_json::to_string(&job.token).map_err(|e| CoreError::internal(e.to_string()))?;
            let stored = StoredJob {
                job_id: job_id.clone(),
                model: job.model.clone(),
                invoker: principal.id.clone(),
                token,
                queued_at: crate::engine::now_ms(),
            };
            d.store.put(stored).await?;
        }
        let rx = self.inner.jobs.enqueue_direct(job_id.clone(), job.model, job.token, principal.id.clone());
        Ok((job_id, rx))
    }

    /// Drops a direct job nobody waits for any more, if no executor took it yet.
    fn cancel_direct(&self, job_id: &str) {
        if self.inner.jobs.cancel(job_id) {
            self.forget_direct(job_id);
        }
    }

    /// Removes a direct job from the job store (without waiting: the store is written off this
    /// thread, which may be the committer's). One left behind by a crash is found finished in
    /// the log at the next start.
    fn forget_direct(&self, job_id: &str) {
        if let Some(d) = self.inner.durable.get() {
            let _ = d.forget.send(job_id.to_string());
        }
    }

    /// `Prefer: respond-async`: queues a script's job and answers its id at once. The invoker
    /// reads the result with `GET /api/jobs/{id}`. Queued whether or not an executor serves
    /// the queue: the job is durable and waits for one.
    pub async fn invoke_async(
        &self,
        principal: &Principal,
        id: &str,
        model: Option<&str>,
        req: InvokeRequest,
    ) -> Result<String, EngineError> {
        check_tool_id(id)?;
        let m = model.map(str::to_string).unwrap_or_else(|| principal.home_model.clone());
        check_model_name(&m)?;
        let is_toolnet = {
            let st = self.read_state();
            crate::access::check_catalog_read(&st, principal, &m)?;
            matches!(st.resolve(&m, id).map(|(e, _)| &e.entry.binding), Some(Binding::Toolnet(_)))
        };
        if is_toolnet && principal.flags.has(Flag::ToolNets) {
            return Err(CoreError::bad_input(
                "async_unsupported",
                format!("{id:?} is a tool net: it answers synchronously; invoke it without Prefer: respond-async"),
            )
            .into());
        }
        let job = self.script_job(principal, id, Some(&m), req)?;
        // An asynchronous job holds no invocation slot while it waits, so the same limit counts
        // open jobs instead: a caller cannot flood the durable queue either.
        let max = self.inner.config.max_concurrent_invocations;
        if self.inner.jobs.open_jobs_of(&principal.id) >= max {
            return Err(CoreError::new(
                ErrorKind::TooMany,
                "too_many_invocations",
                format!("{} has {max} jobs open, the limit; wait for one to finish", principal.name),
            )
            .into());
        }
        Ok(self.queue_direct(principal, job).await?.0)
    }

    async fn invoke_script(
        &self,
        principal: &Principal,
        id: &str,
        model: Option<&str>,
        req: InvokeRequest,
    ) -> Result<JobResult, EngineError> {
        let cfg = self.inner.dispatch;
        let job = self.script_job(principal, id, model, req)?;
        let timeout_ms = job.timeout_ms;
        let (job_id, mut rx) = self.queue_direct(principal, job).await?;
        let wait = Duration::from_millis(timeout_ms) + cfg.queue_grace;
        let deadline = tokio::time::Instant::now() + wait;
        let mut early = None;
        if !self.inner.jobs.serving() {
            // Nobody serves the queue: wait a little for an executor (one reconnecting after a
            // master restart, say), then say so rather than hold the caller for the whole wait.
            let grace = cfg.no_executor_grace.min(wait);
            early = tokio::time::timeout(grace, &mut rx).await.ok();
            if early.is_none() && !self.inner.jobs.serving() {
                self.cancel_direct(&job_id);
                return Err(CoreError::new(
                    ErrorKind::Unavailable,
                    "no_executor",
                    format!(
                        "no executor serves the queue (none has polled the master in the last {} s), so {id:?} cannot run; start one with `agentos executor` (`agentos up` starts one beside the master)",
                        self.inner.jobs.config().gone_after.as_secs()
                    ),
                )
                .into());
            }
        }
        let outcome = match early {
            Some(r) => Ok(r),
            None => tokio::time::timeout_at(deadline, rx).await,
        };
        match outcome {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(_)) => Err(CoreError::internal("the job ended without a result").into()),
            Err(_) => {
                self.cancel_direct(&job_id);
                let serving = self.inner.jobs.executors().iter().filter(|e| e.state != "gone").count();
                Err(CoreError::new(
                    ErrorKind::Unavailable,
                    "job_timeout",
                    format!(
                        "job {job_id} got no result within {} ms; {serving} executor(s) serve the queue (see `agentos executors`)",
                        wait.as_millis()
                    ),
                )
                .into())
            }
        }
    }

    /// Long poll for an executor: the next job, resolved and verified now, or `None` after `wait`.
    pub async fn poll_job(
        &self,
        principal: &Principal,
        name: Option<&str>,
        wait: Duration,
    ) -> Result<Option<LeasedJob>, EngineError> {
        let executor = executor_name(principal, name)?;
        match self.inner.jobs.poll(&executor, wait).await {
            Some(h) => Ok(Some(self.hand_out(h).await)),
            None => Ok(None),
        }
    }

    /// The next job if one is queued right now. Lets an executor take its next job in the same
    /// round trip that delivers a result.
    pub async fn next_job_now(
        &self,
        principal: &Principal,
        name: Option<&str>,
    ) -> Result<Option<LeasedJob>, EngineError> {
        let executor = executor_name(principal, name)?;
        match self.inner.jobs.take_now(&executor) {
            Some(h) => Ok(Some(self.hand_out(h).await)),
            None => Ok(None),
        }
    }

    async fn hand_out(&self, h: crate::jobs::Handout) -> LeasedJob {
        let (token, resolution_error) = self.resolve_token(&h.model, h.token).await;
        LeasedJob {
            job_id: h.job_id,
            lease_id: h.lease_id,
            lease_ms: self.inner.jobs.config().lease.as_millis() as u64,
            attempt: h.attempt,
            model: h.model,
            token,
            sealed: h.sealed,
            resolution_error,
        }
    }

    /// Fire-time resolution: local first, blob read and checked against the pin, content merged
    /// into `args`. On any failure the token ships untouched, with the reason beside it.
    async fn resolve_token(&self, model: &str, token: CommandToken) -> (CommandToken, Option<String>) {
        if token.executor != "script" || token.command != "invoke" {
            return (token, None);
        }
        let Some(tool_id) = token.args.get("toolId").and_then(Value::as_str).map(str::to_string) else {
            return (token, Some("the command names no tool: args.toolId is missing".into()));
        };
        let fail = |why: String| Some(format!("tool {tool_id:?} in model {model:?}: {why}"));
        let binding = {
            let st = self.read_state();
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
        let bytes = match self.inner.blobs.get_checked(&urn, Some(s.size_bytes)).await {
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
            Err(e) => return (token, fail(format!("blob unreadable: {e}"))),
        };
        let mut resolved = token;
        if let Some(args) = resolved.args.as_object_mut() {
            args.insert("content".into(), Value::from(base64::engine::general_purpose::STANDARD.encode(&bytes)));
            args.insert("sha256".into(), Value::from(s.sha256.clone()));
            args.insert("runtime".into(), Value::from(s.runtime.as_str()));
            args.insert("filename".into(), Value::from(s.filename.clone()));
        }
        (resolved, None)
    }

    pub fn heartbeat_job(
        &self,
        principal: &Principal,
        name: Option<&str>,
        job_id: &str,
        lease_id: &str,
    ) -> Result<Duration, EngineError> {
        let executor = executor_name(principal, name)?;
        self.inner.jobs.heartbeat(&executor, job_id, lease_id).map_err(|e| e.into_error(job_id))
    }

    pub fn release_job(
        &self,
        principal: &Principal,
        name: Option<&str>,
        job_id: &str,
        lease_id: &str,
    ) -> Result<(), EngineError> {
        let executor = executor_name(principal, name)?;
        self.inner.jobs.release(&executor, job_id, lease_id).map_err(|e| e.into_error(job_id))
    }

    /// Takes an executor's result: only from the current lease holder, once. Large output goes
    /// to the blob store; the result is recorded in the log before the waiter hears of it.
    pub async fn complete_job(
        &self,
        principal: &Principal,
        name: Option<&str>,
        job_id: &str,
        result: ExecutorResult,
    ) -> Result<(), EngineError> {
        let executor = executor_name(principal, name)?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let stdout = b64
            .decode(&result.stdout_base64)
            .map_err(|e| CoreError::bad_input("invalid_result", format!("stdoutBase64: {e}")))?;
        let stderr = b64
            .decode(&result.stderr_base64)
            .map_err(|e| CoreError::bad_input("invalid_result", format!("stderrBase64: {e}")))?;
        let finished =
            self.inner.jobs.complete(&executor, job_id, &result.lease_id).map_err(|e| e.into_error(job_id))?;
        // Output may echo a credential the job carried or any secret: scrubbed before it is
        // stored, recorded or answered.
        let mut secrets = finished.secrets.clone();
        secrets.extend(self.secret_values());
        let redactor = crate::redact::Redactor::new(&secrets);
        let (stdout, stderr) = (redactor.bytes(stdout), redactor.bytes(stderr));
        let error = result.error.map(|e| redactor.text(&e));
        let (stdout, stdout_blob) = self.shape_output(&finished.model, stdout).await?;
        let (stderr, stderr_blob) = self.shape_output(&finished.model, stderr).await?;
        let shaped = JobResult {
            job_id: job_id.to_string(),
            exit_code: result.exit_code,
            signal: result.signal,
            stdout,
            stderr,
            duration_ms: result.duration_ms,
            timed_out: result.timed_out,
            stdout_blob,
            stderr_blob,
            output_truncated: result.output_truncated,
            error,
            attempt: finished.attempt,
            executor,
        };
        // The result is taken (no other can be); recording it need not hold up the executor,
        // which goes back to polling while the commit happens. `finish` reports its own failure.
        self.finish(finished, shaped).await;
        Ok(())
    }

    /// Output past the inline threshold goes to a blob under `job-output/<model>`, so that who may
    /// read it is the model's question.
    async fn shape_output(&self, model: &str, bytes: Vec<u8>) -> Result<(String, Option<OutputBlob>), EngineError> {
        if bytes.len() <= self.inner.dispatch.inline_output_bytes {
            return Ok((String::from_utf8_lossy(&bytes).into_owned(), None));
        }
        let sha = sha256_hex(&bytes);
        let urn = BlobUrn::new(&format!("{OUTPUT_NAMESPACE}/{model}"), &sha, None)?;
        self.inner.blobs.put(&urn, &bytes).await?;
        let preview: String =
            String::from_utf8_lossy(&bytes[..bytes.len().min(PREVIEW_CHARS * 4)]).chars().take(PREVIEW_CHARS).collect();
        Ok((preview, Some(OutputBlob { urn: urn.to_string(), size_bytes: bytes.len() as u64, sha256: sha })))
    }

    /// Queues the one result of a job for recording; once it is committed, whoever waits gets
    /// it. Waits only for the queue, never for the commit.
    async fn finish(&self, finished: Finished, result: JobResult) {
        let tool_id = finished.token.args.get("toolId").and_then(Value::as_str).map(str::to_string);
        let body = EventBody::JobFinished {
            job_id: finished.job_id.clone(),
            tool_id,
            result: result.clone(),
            invoker: finished.invoker.clone(),
        };
        let model = finished.model;
        let (job_id, waiter) = (finished.job_id, finished.waiter);
        let direct = finished.invoker.is_some();
        let engine = self.clone();
        let reply = Box::new(move |r: Result<_, EngineError>| {
            match r {
                // Recorded: the stored job has done its work. Until this point a crash re-runs it.
                Ok(_) if direct => engine.forget_direct(&job_id),
                Ok(_) => {}
                Err(e) => tracing::error!(job = %job_id, error = %e, "recording a job result failed"),
            }
            if let Some(w) = waiter {
                let _ = w.send(result);
            }
        });
        self.submit_then("system", Box::new(move |_| Ok(vec![(model.clone(), body.clone())])), reply).await;
    }

    /// Fails the jobs whose every lease expired. Called periodically by the reaper.
    pub(crate) async fn reap_jobs(&self) {
        for (finished, why) in self.inner.jobs.reap() {
            tracing::warn!(job = %finished.job_id, %why, "job failed");
            let result = JobResult::failed(&finished.job_id, finished.attempt, why);
            self.finish(finished, result).await;
        }
    }

    /// A job: its one result once it ended (a list, so a breach of that rule would show), or
    /// that it is queued or running. Readable with `l` in the job's model, or by the principal
    /// that invoked it directly.
    pub async fn job(&self, principal: &Principal, job_id: &str) -> Result<JobRecord, EngineError> {
        let recs = self.inner.log.read_key_any_model(&format!("job:{job_id}")).await?;
        let mut model = String::new();
        let mut invoker = None;
        let mut results = Vec::new();
        for rec in recs.into_iter().filter(|r| !self.inner.skipped.contains(&r.seq)) {
            model = rec.event.model.clone();
            if let EventBody::JobFinished { result, invoker: by, .. } =
                EventBody::from_parts(&rec.event.kind, &rec.event.payload)?
            {
                invoker = by;
                results.push(result);
            }
        }
        let state = if !results.is_empty() {
            "finished"
        } else if let Some(open) = self.inner.jobs.open_job(job_id) {
            model = open.model;
            invoker = open.invoker;
            if open.running { "running" } else { "queued" }
        } else {
            ""
        };
        // Absent, like one never run, unless the caller invoked it or may read logs in its
        // model: whether a job exists says something about another principal's work.
        let own = invoker.as_deref() == Some(principal.id.as_str());
        let readable = own
            || (principal.flags.has(Flag::Logs) && crate::access::may_use_model(&self.read_state(), principal, &model));
        if state.is_empty() || !readable {
            return Err(CoreError::not_found(format!("no job {job_id:?} (a job is recorded when it ends)")).into());
        }
        Ok(JobRecord { job_id: job_id.to_string(), model, state: state.to_string(), results })
    }

    /// Makes direct invocations' jobs durable in `store`, and queues again those a previous
    /// run of the master left open. A stored job whose result is already in the log (the
    /// master died between recording it and forgetting it) is forgotten, never run again, so
    /// each job has exactly one result. Returns how many were queued again.
    pub async fn recover_jobs(&self, store: Arc<dyn JobStore>) -> Result<usize, EngineError> {
        let (forget, mut forgotten) = tokio::sync::mpsc::unbounded_channel::<String>();
        let janitor = store.clone();
        // Ends when the engine (the sender's holder) is dropped; a failed removal is logged, and
        // the job is found finished in the log at the next start.
        tokio::spawn(async move {
            while let Some(id) = forgotten.recv().await {
                if let Err(e) = janitor.forget(&id).await {
                    tracing::warn!(job = %id, error = %e, "removing a finished job from the job store failed");
                }
            }
        });
        let mut requeued = 0;
        for job in store.all().await? {
            if !self.inner.log.read_key_any_model(&format!("job:{}", job.job_id)).await?.is_empty() {
                store.forget(&job.job_id).await?;
                continue;
            }
            let token: CommandToken = match serde_json::from_str(&job.token) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(job = %job.job_id, error = %e, "a stored job's token does not parse; dropped");
                    store.forget(&job.job_id).await?;
                    continue;
                }
            };
            tracing::info!(job = %job.job_id, model = %job.model, "queued again after a restart");
            // Nobody waits on this run's receiver: the caller reads the result by job id.
            drop(self.inner.jobs.enqueue_direct(job.job_id, job.model, token, job.invoker));
            requeued += 1;
        }
        if self.inner.durable.set(crate::engine::DurableJobs { store, forget }).is_err() {
            return Err(CoreError::internal("jobs were already made durable").into());
        }
        Ok(requeued)
    }

    pub fn executors(&self) -> Vec<ExecutorView> {
        self.inner.jobs.executors()
    }
}
