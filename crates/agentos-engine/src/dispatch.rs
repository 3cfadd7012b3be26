//! Command dispatch on the master: queue a job, resolve and verify its script at hand-out time
//! only, shape and record the one result, and fail jobs whose leases ran out.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;

use agentos_core::event::{EventBody, PrincipalKind, PrincipalRecord};
use agentos_core::flags::{Flag, Flags};
use agentos_core::job::{CommandToken, ExecutorResult, ExecutorView, JobResult, LeasedJob, OutputBlob};
use agentos_core::name::is_valid_id;
use agentos_core::name::shown;
use agentos_core::urn::BlobUrn;
use agentos_core::{CoreError, DEFAULT_MODEL, sha256_hex};
use agentos_store::{BlobStore, JobStore};

use crate::engine::NetStepOf;
use crate::jobs::{Finished, LeaseError, OUTPUT_NAMESPACE};
use crate::principal::new_token;
use crate::{Dispatch, EngineError, Principal};

/// A finished job as the log records it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    pub job_id: String,
    pub model: String,
    /// `queued`, `running` (handed to an executor), or `finished` (`results` holds its result).
    pub state: String,
    pub invoker: Invoker,
    pub results: Vec<JobResult>,
}

/// How [`Dispatch::end_open`] went.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ended {
    /// Its failed result is in the log: the job's results as the log now reads them.
    Recorded(Vec<JobResult>),
    /// Taken off the queue, but the log refused its result: it runs again, as any job whose
    /// result could not be recorded.
    NotRecorded,
    /// It was not open: its result was taken meanwhile.
    NotOpen,
}

/// Who invoked a job, as the caller reading it sees it. Whether the caller may cancel it
/// follows: its invoker or the operator may, a net's step is not cancelled alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Invoker {
    /// The caller itself.
    You,
    /// Another principal.
    Another,
    /// A net: the job is a step of a fire.
    Net,
}

impl Invoker {
    /// Whose a job invoked by `invoker` (a principal id; none for a net's step) is, as `reader`
    /// sees it.
    pub fn seen_by(invoker: Option<&str>, reader: &Principal) -> Self {
        match invoker {
            Some(id) if id == reader.id => Invoker::You,
            Some(_) => Invoker::Another,
            None => Invoker::Net,
        }
    }
}

/// Characters of an offloaded output kept inline.
const PREVIEW_CHARS: usize = 2000;

/// How long a direct job's removal from the job store may wait for a put to share its
/// transaction.
const FORGET_AFTER: Duration = Duration::from_millis(200);

impl LeaseError {
    fn into_error(self, job_id: &str) -> EngineError {
        match self {
            LeaseError::UnknownJob => {
                CoreError::not_found(format!("no job {} is open (it finished, failed, or was never queued)", shown(job_id)))
                    .into()
            }
            LeaseError::LeaseLost => CoreError::conflict(format!(
                "the lease on job {} is not yours: the lease id is not the job's current one (it expired and the job was handed out again, or it was never this job's)",
                shown(job_id)
            ))
            .into(),
            LeaseError::NotHolder => CoreError::forbidden(format!(
                "job {} is leased to another executor: only the executor that took it may renew, hand back or finish it",
                shown(job_id)
            ))
            .into(),
            LeaseError::Storage(why) => CoreError::new(
                agentos_core::ErrorKind::StorageDown,
                "storage_unavailable",
                format!("the job queue cannot be reached ({why}); try again"),
            )
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
        Some(n) => Err(CoreError::bad_input(
            "invalid_name",
            format!("executor name {}: use a-z, 0-9 and '-', at most 64", shown(n)),
        )
        .into()),
    }
}

/// An executor process's instance id as sent, checked: 16 lower-case hex characters.
pub fn checked_instance<'a>(field: &str, id: Option<&'a str>) -> Result<Option<&'a str>, EngineError> {
    match id {
        Some(i) if !agentos_core::job::is_valid_instance(i) => Err(CoreError::bad_input(
            "invalid_instance",
            format!(
                "{field} {}: an executor's instance id is 16 lower-case hex characters",
                agentos_core::name::shown(i)
            ),
        )
        .into()),
        other => Ok(other),
    }
}

/// The most of a result's `error` that is kept: it is a reason, recorded in the log and kept in
/// the list of recent jobs, not output (which goes to the blob store past 128 KiB).
pub const MAX_ERROR_BYTES: usize = 8 * 1024;

/// `error` cut to [`MAX_ERROR_BYTES`], at a character's edge, saying how much went. Cut after
/// the secrets were scrubbed, so that no cut leaves part of one that the scrub would not know.
fn cut_error(error: String) -> String {
    if error.len() <= MAX_ERROR_BYTES {
        return error;
    }
    let mut end = MAX_ERROR_BYTES;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes of this error were dropped)", &error[..end], error.len() - end)
}

/// The longest a job may be said to have run: a year. A result claiming more is not one an
/// executor measured.
const MAX_DURATION_MS: u64 = 366 * 24 * 3600 * 1000;

/// Refuses a result no process could have produced, before it is taken: an exit status
/// outside 0–255, a signal outside 1–64, or a duration past [`MAX_DURATION_MS`].
fn check_result(result: &ExecutorResult) -> Result<(), EngineError> {
    let wrong = |what: String| CoreError::bad_input("invalid_result", what).into();
    if let Some(code) = result.exit_code.filter(|c| !(0..=255).contains(c)) {
        return Err(wrong(format!("exitCode {code}: a process exits with 0 to 255 (null when a signal ended it)")));
    }
    if let Some(signal) = result.signal.filter(|s| !(1..=64).contains(s)) {
        return Err(wrong(format!(
            "signal {signal}: a signal is a number from 1 to 64 (null when the process exited)"
        )));
    }
    if result.duration_ms > MAX_DURATION_MS {
        return Err(wrong(format!(
            "durationMs {}: more than a year ({MAX_DURATION_MS} ms); send the run's measured time",
            result.duration_ms
        )));
    }
    Ok(())
}

/// Which worker of which executor process asks for a job.
#[derive(Debug, Clone, Copy, Default)]
pub struct Worker<'a> {
    /// The process's instance id (16 lower-case hex characters): its lease ids start with it.
    pub instance: Option<&'a str>,
    /// Which of the process's workers asks: its lease ids start with `{instance}-{slot}-`.
    pub slot: Option<u16>,
    /// The worker holds no job, and an earlier request of its that could have brought one got
    /// no answer: the leases it still has end now (a poll needs `instance` and `slot` for this),
    /// and their jobs go back to the queue, or fail after their last attempt.
    pub reclaim: bool,
}

impl Worker<'_> {
    /// What its lease ids start with, before their random part: `None` without an instance.
    fn taker(&self) -> Result<Option<String>, EngineError> {
        let instance = checked_instance("instance", self.instance)?;
        if self.reclaim && (instance.is_none() || self.slot.is_none()) {
            return Err(CoreError::bad_input(
                "invalid_slot",
                "a reclaiming poll names the worker whose jobs go back: send its instance and its slot",
            )
            .into());
        }
        Ok(instance.map(|i| match self.slot {
            Some(s) => format!("{i}-{s}"),
            None => i.to_string(),
        }))
    }
}

impl Dispatch<'_> {
    /// Creates (or rotates) an executor credential. Operator only. Returns the token.
    pub async fn create_executor_token(&self, principal: &Principal, name: &str) -> Result<String, EngineError> {
        if !principal.is_operator() {
            return Err(CoreError::forbidden("only the operator creates executor credentials").into());
        }
        if !is_valid_id(name) {
            return Err(CoreError::bad_input(
                "invalid_name",
                format!("executor name {}: use a-z, 0-9 and '-', at most 64", shown(name)),
            )
            .into());
        }
        if let Some(existing) = self.read_state().principals.get(name)
            && existing.kind != PrincipalKind::Executor
        {
            return Err(CoreError::conflict(format!(
                "{} already names a principal that is not an executor",
                shown(name)
            ))
            .into());
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

    /// Drops a direct job nobody waits for any more; one running is stopped at its executor's
    /// next heartbeat, freeing the slot it held.
    pub(crate) async fn cancel_direct(&self, job_id: &str) {
        if self.inner.dispatch.jobs.cancel(job_id).await
            && let Some(d) = self.inner.dispatch.durable.get()
            && !d.take_unstored(job_id)
        {
            // It has no result: a removal lost now would run it again at the next start.
            let _ = d.writes.send(crate::jobs::StoreWrite::ForgetNow(job_id.to_string()));
        }
    }

    /// Removes a direct job whose result is recorded from the job store, if it was stored
    /// (without waiting: the store is written off this thread, which may be the committer's).
    /// One left behind by a crash is found finished in the log at the next start.
    fn forget_direct(&self, job_id: &str) {
        if let Some(d) = self.inner.dispatch.durable.get()
            && !d.take_unstored(job_id)
        {
            let _ = d.writes.send(crate::jobs::StoreWrite::Forget(job_id.to_string()));
        }
    }

    /// Long poll for an executor: the next job, resolved and verified now, or `None` after `wait`.
    /// `worker` says which worker of which process asks (see [`Worker`]); `replaces` names the
    /// instance ids of processes that died on the same workspace: the leases this executor
    /// handed to them end now, and their jobs go back to the queue (or fail after their last
    /// attempt) at once rather than when the leases would have run out. A process of another
    /// executor named there loses nothing: its leases are not this executor's.
    pub async fn poll_job(
        &self,
        principal: &Principal,
        name: Option<&str>,
        worker: Worker<'_>,
        replaces: &[String],
        wait: Duration,
    ) -> Result<Option<LeasedJob>, EngineError> {
        let executor = executor_name(principal, name)?;
        let instance = checked_instance("instance", worker.instance)?;
        let taker = worker.taker()?;
        if replaces.len() > agentos_core::job::MAX_REPLACES {
            return Err(CoreError::bad_input(
                "invalid_instance",
                format!(
                    "replaces names {} instance ids: at most {} may be named in one poll",
                    replaces.len(),
                    agentos_core::job::MAX_REPLACES
                ),
            )
            .into());
        }
        let mut dead: Vec<&str> = Vec::with_capacity(replaces.len());
        for old in replaces {
            let old = checked_instance("replaces", Some(old))?.expect("given");
            if Some(old) == instance {
                return Err(CoreError::bad_input(
                    "invalid_instance",
                    "replaces names this process's own instance id: name the ones of processes that died",
                )
                .into());
            }
            dead.push(old);
        }
        dead.sort_unstable();
        dead.dedup();
        let ended =
            if dead.is_empty() { 0 } else { self.inner.dispatch.jobs.expire_instances(&executor, &dead).await? };
        if ended > 0 {
            tracing::warn!(executor = %executor, instances = ?replaces, jobs = ended, "an executor process died holding jobs: their leases end now");
            self.reap_jobs().await;
        }
        if worker.reclaim
            && let Some(taker) = &taker
        {
            // This worker holds no job when it polls: one leased to it is one whose hand-out it
            // never received (an answer lost on the way). Its lease ends now rather than when it
            // would have run out. The attempt counts, so that a job whose hand-outs never
            // arrive fails after the last one rather than going round for ever.
            let lost = self.inner.dispatch.jobs.expire_instances(&executor, &[taker.as_str()]).await?;
            if lost > 0 {
                tracing::warn!(executor = %executor, worker = %taker, jobs = lost, "jobs handed to an executor in answers it never received go back to the queue");
                self.reap_jobs().await;
            }
        }
        match self.inner.dispatch.jobs.poll(&executor, taker.as_deref(), wait).await? {
            Some(h) => Ok(self.hand_out(&executor, h).await),
            None => Ok(None),
        }
    }

    /// The next job if one is queued right now. Lets an executor take its next job in the same
    /// round trip that delivers a result.
    pub async fn next_job_now(
        &self,
        principal: &Principal,
        name: Option<&str>,
        worker: Worker<'_>,
    ) -> Result<Option<LeasedJob>, EngineError> {
        let executor = executor_name(principal, name)?;
        let taker = worker.taker()?;
        match self.inner.dispatch.jobs.take_now(&executor, taker.as_deref()).await? {
            Some(h) => Ok(self.hand_out(&executor, h).await),
            None => Ok(None),
        }
    }

    /// The job as it ships, its script resolved and verified. `None` when the blob store is out
    /// for now: the job goes back to the head of the queue, its attempt not counted, to wait for
    /// the store as it would for an executor, rather than failing for good ("cannot run").
    async fn hand_out(&self, executor: &str, h: crate::jobs::Handout) -> Option<LeasedJob> {
        let (token, resolution_error) = match h.unreadable {
            Some(why) => (h.token, Some(why)),
            None => crate::bindings::script::resolve_token(self, &h.model, h.token).await,
        };
        if let Some(why) = resolution_error.as_deref().filter(|w| w.starts_with(crate::bindings::script::STORAGE_OUT)) {
            tracing::warn!(job = %h.job_id, %why, "the job's script cannot be read now: it goes back to the queue");
            if let Err(e) = self.inner.dispatch.jobs.release(executor, &h.job_id, &h.lease_id).await {
                tracing::warn!(job = %h.job_id, error = ?e, "handing the job back failed; its lease will end");
            }
            // Not asked again at once: the store is out.
            tokio::time::sleep(Duration::from_millis(500)).await;
            return None;
        }
        Some(LeasedJob {
            job_id: h.job_id,
            lease_id: h.lease_id,
            lease_ms: self.inner.dispatch.jobs.config().lease.as_millis() as u64,
            attempt: h.attempt,
            model: h.model,
            token,
            sealed: h.sealed,
            resolution_error,
            // The HTTP edge knows its body limit and says it.
            max_result_bytes: None,
        })
    }

    pub async fn heartbeat_job(
        &self,
        principal: &Principal,
        name: Option<&str>,
        job_id: &str,
        lease_id: &str,
    ) -> Result<Duration, EngineError> {
        let executor = executor_name(principal, name)?;
        self.inner.dispatch.jobs.heartbeat(&executor, job_id, lease_id).await.map_err(|e| e.into_error(job_id))
    }

    /// An executor process says it stopped in good order, its jobs finished or handed back: it
    /// is listed `stopped` and no longer counted as serving the queue until it is heard from
    /// again. A lease its `instance` still holds (a hand-back that failed) ends now.
    pub async fn executor_stopped(
        &self,
        principal: &Principal,
        name: Option<&str>,
        instance: Option<&str>,
    ) -> Result<(), EngineError> {
        let executor = executor_name(principal, name)?;
        if let Some(instance) = checked_instance("instance", instance)? {
            let ended = self.inner.dispatch.jobs.expire_instances(&executor, &[instance]).await?;
            if ended > 0 {
                tracing::warn!(executor = %executor, instance, jobs = ended, "an executor stopped holding jobs: their leases end now");
                self.reap_jobs().await;
            }
        }
        self.inner.dispatch.jobs.stopped(&executor).await
    }

    pub async fn release_job(
        &self,
        principal: &Principal,
        name: Option<&str>,
        job_id: &str,
        lease_id: &str,
    ) -> Result<(), EngineError> {
        let executor = executor_name(principal, name)?;
        self.inner.dispatch.jobs.release(&executor, job_id, lease_id).await.map_err(|e| e.into_error(job_id))
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
        check_result(&result)?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let stdout = b64
            .decode(&result.stdout_base64)
            .map_err(|e| CoreError::bad_input("invalid_result", format!("stdoutBase64: {e}")))?;
        let stderr = b64
            .decode(&result.stderr_base64)
            .map_err(|e| CoreError::bad_input("invalid_result", format!("stderrBase64: {e}")))?;
        let finished = self
            .inner
            .dispatch
            .jobs
            .complete(&executor, job_id, &result.lease_id)
            .await
            .map_err(|e| e.into_error(job_id))?;
        // Output may echo a credential the job carried or any secret: scrubbed before it is
        // stored, recorded or answered.
        let redactor = self.principals().redactor(&finished.secrets);
        let (stdout, stderr) = (redactor.bytes(stdout), redactor.bytes(stderr));
        let error = result.error.map(|e| cut_error(redactor.text(&e)));
        // Output that cannot be kept (the blob store refused it, or is out) does not lose the
        // run: its result is recorded with the start of each stream that could not be stored,
        // saying why, and the exit status stands.
        let mut lost = Vec::new();
        let mut shape = async |name: &str, bytes: Vec<u8>| {
            let size = bytes.len();
            let start: String =
                String::from_utf8_lossy(&bytes[..size.min(PREVIEW_CHARS * 4)]).chars().take(PREVIEW_CHARS).collect();
            match self.shape_output(&finished.model, bytes).await {
                Ok(shaped) => shaped,
                Err(e) => {
                    tracing::error!(job = %job_id, stream = name, error = %e, "storing a job's output failed; its result keeps the start of it");
                    lost.push(format!("{name} ({size} bytes) past its first {PREVIEW_CHARS} characters: {e}"));
                    (start, None)
                }
            }
        };
        let (stdout, stdout_blob) = shape("stdout", stdout).await;
        let (stderr, stderr_blob) = shape("stderr", stderr).await;
        let dropped = !lost.is_empty();
        let error = if dropped {
            let why = format!("the job ran, but the master could not store its output: {}", lost.join("; "));
            Some(error.map_or(why.clone(), |earlier| format!("{earlier}; {why}")))
        } else {
            error
        };
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
            output_truncated: result.output_truncated || dropped,
            error,
            attempt: finished.attempt,
            executor,
            cancelled_by: None,
        };
        // The result is taken (no other can be); recording it need not hold up the executor,
        // which goes back to polling while the commit happens. `finish` reports its own failure.
        self.finish(finished, shaped).await;
        Ok(())
    }

    /// Output past the inline threshold goes to a blob under `job-output/<model>`, so that who may
    /// read it is the model's question.
    pub(crate) async fn shape_output(
        &self,
        model: &str,
        bytes: Vec<u8>,
    ) -> Result<(String, Option<OutputBlob>), EngineError> {
        self.shape_output_kept(model, bytes, false).await
    }

    /// As [`Self::shape_output`], and with `keep`, stored as a blob whatever its size.
    pub(crate) async fn shape_output_kept(
        &self,
        model: &str,
        bytes: Vec<u8>,
        keep: bool,
    ) -> Result<(String, Option<OutputBlob>), EngineError> {
        // Kept inline only as the text it is: bytes that are not UTF-8 would lose what they are
        // in a string, so they go to a blob whatever their size, which keeps them as they came.
        let bytes = if !keep && bytes.len() <= self.inner.dispatch.config.inline_output_bytes {
            match String::from_utf8(bytes) {
                Ok(text) => return Ok((text, None)),
                Err(e) => e.into_bytes(),
            }
        } else {
            bytes
        };
        let sha = sha256_hex(&bytes);
        let urn = BlobUrn::new(&format!("{OUTPUT_NAMESPACE}/{model}"), &sha, None)?;
        self.inner.catalog.blobs.put(&urn, &bytes).await?;
        let preview: String =
            String::from_utf8_lossy(&bytes[..bytes.len().min(PREVIEW_CHARS * 4)]).chars().take(PREVIEW_CHARS).collect();
        Ok((preview, Some(OutputBlob { urn: urn.to_string(), size_bytes: bytes.len() as u64, sha256: sha })))
    }

    /// The bytes of an output [`Self::shape_output`] stored as a blob, checked against its
    /// sha256 and size (a damaged one is refused as corrupt, and names its blob).
    pub(crate) async fn read_output(&self, urn: &str, size_bytes: u64) -> Result<Vec<u8>, EngineError> {
        Ok(self.inner.catalog.blobs.get_checked(&urn.parse::<BlobUrn>()?, Some(size_bytes)).await?)
    }

    /// The whole of one output stream of a finished job (its bytes as stored, read back from
    /// its blob when it was offloaded), for whoever may read the job: its invoker needs no `r`,
    /// which `GET /api/blobs` takes.
    pub async fn job_output(&self, principal: &Principal, job_id: &str, stderr: bool) -> Result<Vec<u8>, EngineError> {
        let record = self.job(principal, job_id).await?;
        let Some(result) = record.results.last() else {
            return Err(CoreError::new(
                agentos_core::ErrorKind::Conflict,
                "job_not_finished",
                format!(
                    "job {} is {}: its output is readable once it has finished (GET /api/jobs/{job_id} says when; `agentos job wait {job_id}` waits for it)",
                    shown(job_id),
                    record.state
                ),
            )
            .into());
        };
        let (inline, blob) =
            if stderr { (&result.stderr, &result.stderr_blob) } else { (&result.stdout, &result.stdout_blob) };
        match blob {
            None => Ok(inline.as_bytes().to_vec()),
            // Gone from the store: the job has its result, and its output is lost, which is a
            // fault of the master's, not a job that is not there.
            Some(b) => self.read_output(&b.urn, b.size_bytes).await.map_err(|e| match e.kind() {
                agentos_core::ErrorKind::NotFound => CoreError::new(
                    agentos_core::ErrorKind::Corrupt,
                    "output_lost",
                    format!(
                        "job {}'s {} was stored as {}, which the blob store no longer holds: that output is lost",
                        shown(job_id),
                        if stderr { "stderr" } else { "stdout" },
                        b.urn
                    ),
                )
                .into(),
                _ => e,
            }),
        }
    }

    /// Queues the one result of a job for recording; once it is committed, whoever waits gets
    /// it. Waits only for the queue, never for the commit.
    ///
    /// Except a net's job on this master's own queue whose fire still waits: the fire gets the
    /// result at once and records it in the same commit as its own outcome (one sync to the
    /// disk for both instead of one each). A fire that stopped waiting closed its receiver, so the
    /// send fails and the result is recorded here.
    async fn finish(&self, mut finished: Finished, result: JobResult) {
        let result = match finished.waiter.take() {
            Some(w) if finished.invoker.is_none() && !self.inner.dispatch.jobs.is_shared() => match w.send(result) {
                // The fire records it with its outcome; the job reads as running until then
                // (the fire's commit takes the mark off).
                Ok(()) => return,
                Err(result) => result,
            },
            w => {
                finished.waiter = w;
                result
            }
        };
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
        let engine = self.0.clone();
        // The reply runs on the committer's thread: the row's removal goes back to the runtime.
        let shared = self.inner.dispatch.jobs.is_shared().then(tokio::runtime::Handle::current);
        let reply = Box::new(move |r: Result<_, EngineError>| {
            engine.inner.dispatch.jobs.recorded_here(&job_id);
            match r {
                // Recorded: the shared queue's row goes. Until then a crash leaves it, and the
                // reaper finds the result in the log.
                Ok(_) if shared.is_some() => {
                    let (engine, job_id) = (engine.clone(), job_id.clone());
                    if let Some(rt) = &shared {
                        rt.spawn(async move { engine.inner.dispatch.jobs.recorded(&job_id).await });
                    }
                }
                // Recorded: a stored job has done its work. Until this point a crash re-runs it.
                Ok(_) if direct => engine.dispatch().forget_direct(&job_id),
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(job = %job_id, error = %e, "recording a job result failed");
                    // Not recorded: a stored job stays to run again at the next start; one not
                    // stored stays so.
                    if let Some(d) = engine.inner.dispatch.durable.get() {
                        d.take_unstored(&job_id);
                    }
                }
            }
            if let Some(w) = waiter {
                let _ = w.send(result);
            }
        });
        self.submit_then("system", Box::new(move |_| Ok(vec![(model.clone(), body.clone())])), reply).await;
    }

    /// Fails the jobs whose every lease expired. Called periodically by the reaper.
    pub(crate) async fn reap_jobs(&self) {
        let jobs = &self.inner.dispatch.jobs;
        // A shared queue's row whose result was being recorded by a master that stopped: gone
        // when the result is in the log; else its lease ran out and it is reaped below.
        for job_id in jobs.stale_completions().await {
            match self.inner.ledger.log.read_key_any_model(&format!("job:{job_id}")).await {
                Ok(recs) if !recs.is_empty() => jobs.recorded(&job_id).await,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "reading the log for a stale result failed");
                    return;
                }
            }
        }
        for (finished, why) in jobs.reap().await {
            tracing::warn!(job = %finished.job_id, %why, "job failed");
            let mut result = JobResult::failed(&finished.job_id, finished.attempt, why);
            // Where it ran last, and for how long that lease held, as a cancelled job says.
            result.executor = finished.holder.clone().unwrap_or_default();
            result.duration_ms = finished.held_ms.unwrap_or(0);
            self.finish(finished, result).await;
        }
    }

    /// A job: its one result once it ended (a list, so a breach of that rule would show), or
    /// that it is queued or running. Readable with `l` in the job's model, or by the principal
    /// that invoked it directly.
    pub async fn job(&self, principal: &Principal, job_id: &str) -> Result<JobRecord, EngineError> {
        let (mut model, mut invoker, mut results) = self.recorded_results(job_id).await?;
        let mut state = if !results.is_empty() { "finished" } else { "" };
        if state.is_empty() {
            if let Some(open) = self.inner.dispatch.jobs.open_job(job_id).await? {
                (model, invoker) = (open.model, open.invoker);
                state = if open.running { "running" } else { "queued" };
            } else {
                // Its result may have been committed between the two reads above: a job
                // leaves the queue only once its result is in the log.
                (model, invoker, results) = self.recorded_results(job_id).await?;
                state = if !results.is_empty() { "finished" } else { "" };
            }
        }
        // Absent, like one never run, unless the caller invoked it or may read logs in its
        // model: whether a job exists says something about another principal's work.
        if state.is_empty() || !self.may_read_job(principal, &model, invoker.as_deref()) {
            return Err(unreadable_job(job_id));
        }
        let invoker = Invoker::seen_by(invoker.as_deref(), principal);
        Ok(JobRecord { job_id: job_id.to_string(), model, state: state.to_string(), invoker, results })
    }

    /// Whether `principal` may read a job of `model` that `invoker` (a principal id) invoked:
    /// its own, or one of a model it may read logs of.
    fn may_read_job(&self, principal: &Principal, model: &str, invoker: Option<&str>) -> bool {
        invoker == Some(principal.id.as_str())
            || (principal.flags.has(Flag::Logs) && crate::access::may_use_model(&self.read_state(), principal, model))
    }

    /// Cancels a job invoked directly that has not finished: a queued one never runs, and one
    /// an executor holds is stopped at that executor's next heartbeat (its processes killed,
    /// its result refused). The one result recorded for it, before this answers, says who
    /// cancelled it, and a caller waiting on the job gets that result. Only its invoker or the
    /// operator may cancel it; a net's job ends with its fire, so it is not cancelled alone.
    pub async fn cancel_job(&self, principal: &Principal, job_id: &str) -> Result<JobRecord, EngineError> {
        let Some(open) = self.inner.dispatch.jobs.open_job(job_id).await? else {
            // Finished (told so, to whoever may read it), or absent.
            return Err(not_cancelled(&self.job(principal, job_id).await?));
        };
        if !self.may_read_job(principal, &open.model, open.invoker.as_deref()) && !principal.is_operator() {
            return Err(unreadable_job(job_id));
        }
        if open.invoker.is_none() {
            // A net's step: nobody cancels it alone, whoever asks.
            return Err(self.net_step_refusal(job_id, &open.model).into());
        }
        if open.invoker.as_deref() != Some(principal.id.as_str()) && !principal.is_operator() {
            return Err(CoreError::forbidden(format!(
                "job {} was invoked by another principal: only its invoker or the operator may cancel it",
                shown(job_id)
            ))
            .into());
        }
        let by = principal.name.clone();
        let why = format!("cancelled by {by} before it finished");
        match self.end_open(job_id, Some(by), why).await? {
            Ended::Recorded(results) => Ok(JobRecord {
                job_id: job_id.to_string(),
                model: open.model,
                state: "finished".to_string(),
                invoker: Invoker::seen_by(open.invoker.as_deref(), principal),
                results,
            }),
            // Its result was taken meanwhile (an executor's, or another cancel).
            Ended::NotOpen => Err(not_cancelled(&self.job(principal, job_id).await?)),
            Ended::NotRecorded => Err(CoreError::internal(format!(
                "job {} was taken off the queue, but its cancellation could not be recorded (the master's log says why)",
                shown(job_id)
            ))
            .into()),
        }
    }

    /// Why a net's step is not cancelled alone, and what ends it: its fire ends with the
    /// command (at its timeout at the latest); stopping the transition keeps it from firing
    /// again. Named when this master runs the fire (another master of a shared log may).
    fn net_step_refusal(&self, job_id: &str, model: &str) -> CoreError {
        let step = self.inner.dispatch.net_steps.lock().unwrap_or_else(|p| p.into_inner()).get(job_id).cloned();
        let message = match step {
            Some(NetStepOf { model, transition, instance: false }) => format!(
                "job {} is a step of transition {} of model {}: it ends with its fire, when its command ends or times out; to keep the transition from firing again, stop it (`agentos net stop {transition} --model {model}`, or POST /api/models/{model}/transitions/{transition}/stop)",
                shown(job_id),
                shown(&transition),
                shown(&model),
            ),
            Some(NetStepOf { transition, instance: true, .. }) => format!(
                "job {} is a step of transition {} of a tool net's run, invoked in model {}: it ends with that run, when its command ends or times out",
                shown(job_id),
                shown(&transition),
                shown(model),
            ),
            // Fired by another master of a shared log: its net's state says which.
            None => format!(
                "job {} is a step of a net in model {}: it ends with its fire, when its command ends or times out; `agentos net show --model {model}` shows the transitions, and stopping one keeps it from firing again",
                shown(job_id),
                shown(model),
            ),
        };
        CoreError::new(agentos_core::ErrorKind::Conflict, "net_job", message)
    }

    /// Ends an open job with a failed result that says `why` (and who cancelled it, when
    /// someone did), committed before this returns: a queued job never runs, one an executor
    /// holds is stopped at its next heartbeat. [`Ended::NotOpen`] when the job was not open (its
    /// result was taken meanwhile, an executor's or another end's); [`Ended::NotRecorded`] when
    /// the log refused the commit (the job then runs again, as any job whose result could not be
    /// recorded). Taken and recorded on a task of its own: an end whose caller goes away half
    /// way (its connection closed) still records the job it took, and answers whoever waits.
    pub(crate) async fn end_open(
        &self,
        job_id: &str,
        cancelled_by: Option<String>,
        why: String,
    ) -> Result<Ended, EngineError> {
        let (engine, id) = (self.0.clone(), job_id.to_string());
        let ended = tokio::spawn(async move {
            let dispatch = engine.dispatch();
            let Some(mut finished) = dispatch.inner.dispatch.jobs.take_cancelled(&id).await? else {
                return Ok(Ended::NotOpen);
            };
            let (recorded, is_recorded) = tokio::sync::oneshot::channel();
            let caller = finished.waiter.replace(recorded);
            let mut result = JobResult::failed(&id, finished.attempt, why);
            result.cancelled_by = cancelled_by;
            // Where it was running, if it was, and for how long: its process is stopped there.
            result.executor = finished.holder.clone().unwrap_or_default();
            result.duration_ms = finished.held_ms.unwrap_or(0);
            dispatch.finish(finished, result).await;
            let result = is_recorded.await.map_err(|_| CoreError::internal("recording the job's end stopped"))?;
            if let Some(caller) = caller {
                let _ = caller.send(result);
            }
            // The answer comes whether or not the commit went through: the log says which.
            let (_, _, results) = dispatch.recorded_results(&id).await?;
            Ok::<_, EngineError>(if results.is_empty() { Ended::NotRecorded } else { Ended::Recorded(results) })
        });
        ended.await.map_err(|e| CoreError::internal(format!("ending the job stopped: {e}")))?
    }

    /// A job's results in the log, with its model and invoker.
    async fn recorded_results(&self, job_id: &str) -> Result<(String, Option<String>, Vec<JobResult>), EngineError> {
        let recs = self.inner.ledger.log.read_key_any_model(&format!("job:{job_id}")).await?;
        let mut model = String::new();
        let mut invoker = None;
        let mut results = Vec::new();
        for rec in recs.into_iter().filter(|r| !self.inner.ledger.skipped.contains(&r.seq)) {
            model = rec.event.model.clone();
            if let EventBody::JobFinished { result, invoker: by, .. } =
                EventBody::from_parts(&rec.event.kind, &rec.event.payload)?
            {
                invoker = by;
                results.push(result);
            }
        }
        Ok((model, invoker, results))
    }

    /// Makes direct invocations' jobs durable in `store`, and queues again those a previous
    /// run of the master left open. A stored job whose result is already in the log (the
    /// master died between recording it and forgetting it) is forgotten, never run again, so
    /// each job has exactly one result. Returns how many were queued again.
    pub async fn recover_jobs(&self, store: Arc<dyn JobStore>) -> Result<usize, EngineError> {
        if self.inner.dispatch.jobs.is_shared() {
            // The shared queue keeps its jobs itself, across every master's restarts.
            return Ok(0);
        }
        let (writes, pending) = tokio::sync::mpsc::unbounded_channel::<crate::jobs::StoreWrite>();
        tokio::spawn(write_jobs(store.clone(), pending));
        let mut requeued = 0;
        for job in store.all().await? {
            if !self.inner.ledger.log.read_key_any_model(&format!("job:{}", job.job_id)).await?.is_empty() {
                store.forget(&job.job_id).await?;
                continue;
            }
            let token: CommandToken = match serde_json::from_str(&job.token) {
                Ok(t) => t,
                Err(e) => {
                    // Recorded as failed, so that its caller, reading the job by its id, learns
                    // why it never ran. Its stored form goes once that is recorded, or at the
                    // next start, when its result is found in the log.
                    tracing::error!(job = %job.job_id, error = %e, "a stored job's token does not parse; recorded as failed");
                    let why = format!(
                        "the job was stored by an earlier run of the master and does not read back ({e}); it was not run: invoke the tool again"
                    );
                    let result = JobResult::failed(&job.job_id, 0, why);
                    let finished = crate::jobs::Finished {
                        job_id: job.job_id,
                        model: job.model,
                        token: CommandToken {
                            executor: "unreadable".into(),
                            command: "invoke".into(),
                            args: serde_json::json!({}),
                        },
                        attempt: 0,
                        waiter: None,
                        secrets: Vec::new(),
                        invoker: Some(job.invoker),
                        holder: None,
                        held_ms: None,
                    };
                    self.finish(finished, result).await;
                    continue;
                }
            };
            tracing::info!(job = %job.job_id, model = %job.model, "queued again after a restart");
            // Nobody waits on this run's receiver: the caller reads the result by job id.
            drop(self.inner.dispatch.jobs.enqueue_direct(job.job_id, job.model, token, job.invoker).await?);
            requeued += 1;
        }
        if self.inner.dispatch.durable.set(crate::jobs::DurableJobs { writes, unstored: Default::default() }).is_err() {
            return Err(CoreError::internal("jobs were already made durable").into());
        }
        Ok(requeued)
    }

    /// Executors with their state and the jobs they hold. Job ids lead to jobs' output, so a
    /// principal other than the operator sees only those of jobs in models it may use (and of
    /// jobs it invoked); the others are counted.
    pub async fn executors(&self, p: &Principal) -> Result<Vec<ExecutorView>, EngineError> {
        if p.is_operator() {
            return self.inner.dispatch.jobs.executors_shown(|_| true).await;
        }
        self.inner
            .dispatch
            .jobs
            .executors_shown(|job| {
                job.invoker.as_deref() == Some(p.id.as_str())
                    || crate::access::may_use_model(&self.read_state(), p, &job.model)
            })
            .await
    }
}

/// A job that is not there, or that the caller may not read: told alike, since whether a job
/// exists says something about another principal's work.
fn unreadable_job(job_id: &str) -> EngineError {
    CoreError::not_found(format!("no job {} that you may read", shown(job_id))).into()
}

/// Why a job that is no longer open cannot be cancelled: it finished, or its result is being
/// recorded.
fn not_cancelled(record: &JobRecord) -> EngineError {
    let id = shown(&record.job_id);
    let how = match record.results.last() {
        None => {
            return CoreError::new(
                agentos_core::ErrorKind::Conflict,
                "job_finishing",
                format!(
                    "job {id} is finishing (its result is being recorded): read it with GET /api/jobs/{}",
                    record.job_id
                ),
            )
            .into();
        }
        Some(r) => match (&r.cancelled_by, r.exit_code, &r.error) {
            (Some(by), _, _) => format!("cancelled by {by}"),
            (None, Some(code), _) => format!("exit code {code}"),
            (None, None, Some(e)) => format!("failed: {}", e.chars().take(200).collect::<String>()),
            (None, None, None) => "no exit code".to_string(),
        },
    };
    CoreError::new(
        agentos_core::ErrorKind::Conflict,
        "job_finished",
        format!(
            "job {id} has already finished ({how}): there is nothing to cancel; its result is at GET /api/jobs/{}",
            record.job_id
        ),
    )
    .into()
}

/// The job store's one writer; ends when the engine (the sender's holder) is dropped.
///
/// What is pending when the store is free goes in one transaction (one sync to the disk), in
/// order. A failed put is answered to its caller (the writer logs it either way); a failed
/// removal is logged, and the job is found finished in the log at the next start.
///
/// A removal (`Forget`) needs no sync of its own: one lost in a crash leaves a record whose
/// result is in the log, dropped at the next start. So it waits for the next transaction, or
/// `FORGET_AFTER` without one: sequential calls sync the store once per job instead of twice.
async fn write_jobs(
    store: Arc<dyn JobStore>,
    mut pending: tokio::sync::mpsc::UnboundedReceiver<crate::jobs::StoreWrite>,
) {
    use crate::jobs::StoreWrite;
    use agentos_store::JobWrite;
    let mut incoming = Vec::new();
    let mut held: Vec<String> = Vec::new();
    // When the oldest held removal must be written, with a put or not.
    let mut held_due = tokio::time::Instant::now();
    loop {
        let closed = if held.is_empty() {
            pending.recv_many(&mut incoming, 256).await == 0
        } else {
            matches!(tokio::time::timeout_at(held_due, pending.recv_many(&mut incoming, 256)).await, Ok(0))
        };
        // Each write, with who waits for it when it is a put.
        let mut writes: Vec<(JobWrite, Option<Done>)> = Vec::new();
        for write in incoming.drain(..) {
            match write {
                StoreWrite::Put(job, done) => writes.push((JobWrite::Put(job), Some(done))),
                StoreWrite::Forget(id) => {
                    if held.is_empty() {
                        held_due = tokio::time::Instant::now() + FORGET_AFTER;
                    }
                    held.push(id);
                }
                StoreWrite::ForgetNow(id) => writes.push((JobWrite::Forget(id), None)),
            }
        }
        let due = !held.is_empty() && (closed || held_due <= tokio::time::Instant::now() || held.len() >= 256);
        if !writes.is_empty() || due {
            // Held removals go after the puts: a job's put may have come in this same batch
            // (the channel keeps each job's put before its removal), and a removed job is never
            // put again.
            writes.extend(held.drain(..).map(|id| (JobWrite::Forget(id), None)));
            write_together(store.as_ref(), writes).await;
        }
        if closed {
            break;
        }
    }
}

/// Who waits to hear whether a put is durable.
type Done = tokio::sync::oneshot::Sender<Result<(), agentos_store::StoreError>>;

/// Writes in one transaction, or each on its own when that fails (one bad write must not fail
/// the others), and tells each put's waiter how its write went.
async fn write_together(store: &dyn JobStore, writes: Vec<(agentos_store::JobWrite, Option<Done>)>) {
    let answer = |done: Option<Done>, r: &Result<(), agentos_store::StoreError>| {
        if let Some(done) = done {
            let _ = done.send(r.as_ref().map(|_| ()).map_err(|e| agentos_store::StoreError::Jobs(e.to_string())));
        }
    };
    let n = writes.len();
    let (batch, waiting): (Vec<_>, Vec<_>) = writes.into_iter().unzip();
    let r = store.write(batch.clone()).await;
    let Err(e) = &r else {
        waiting.into_iter().for_each(|done| answer(done, &r));
        return;
    };
    tracing::warn!(writes = n, error = %e, "writing to the job store failed");
    if n == 1 {
        waiting.into_iter().for_each(|done| answer(done, &r));
        return;
    }
    for (write, done) in batch.into_iter().zip(waiting) {
        let job_id = match &write {
            agentos_store::JobWrite::Put(job) => job.job_id.clone(),
            agentos_store::JobWrite::Forget(id) => id.clone(),
        };
        let r = store.write(vec![write]).await;
        if let Err(e) = &r {
            tracing::warn!(job = %job_id, error = %e, "writing a job to the job store failed");
        }
        answer(done, &r);
    }
}
