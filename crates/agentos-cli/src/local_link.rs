//! How `agentos up`'s local executor reaches the master it runs beside: by calling the engine
//! directly, with the same credential and the same checks as over HTTP, but without two HTTP
//! exchanges and their JSON per job.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;

use agentos_core::job::LeasedJob;
use agentos_engine::{Engine, EngineError, Principal};
use agentos_executor::protocol::{Link, PollCall, ProtocolError, ResultCall};
use agentos_server::ApiError;

/// The longest poll the master holds over HTTP; a direct one is held no longer.
const MAX_POLL: Duration = Duration::from_secs(60);

pub struct LocalLink {
    engine: Engine,
    token: String,
    /// The master's `--max-result-bytes`, which a result over HTTP may not exceed either.
    max_result_bytes: usize,
}

impl LocalLink {
    pub fn new(engine: Engine, token: String, max_result_bytes: usize) -> Self {
        LocalLink { engine, token, max_result_bytes }
    }

    /// Who the executor is, looked up at every call as an HTTP request's bearer token is: a
    /// credential rotated or revoked meanwhile stops the local executor the same way.
    fn principal(&self) -> Result<Principal, ProtocolError> {
        self.engine.authenticate(&self.token).ok_or_else(|| ProtocolError::Refused {
            status: 401,
            message: "the bearer token is not valid (revoked, mistyped, or from another data folder)".into(),
        })
    }
}

/// Runs one call, for at most `limit` (the HTTP client's timeout for the same request). A panic
/// in the master's code ends this call, not the executor's worker that made it: the worker sees
/// the master unreachable and retries, as it does when a request over HTTP loses its connection
/// or times out.
async fn guarded<T>(limit: Duration, call: impl Future<Output = Result<T, ProtocolError>>) -> Result<T, ProtocolError> {
    match tokio::time::timeout(limit, AssertUnwindSafe(call).catch_unwind()).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(failed()),
        Err(_) => Err(ProtocolError::Unreachable(format!("the master did not answer within {limit:?}"))),
    }
}

fn failed() -> ProtocolError {
    ProtocolError::Unreachable("the master failed on this request; its log has the details".into())
}

/// What the HTTP client allows a heartbeat or a release, and a result.
const SHORT_CALL: Duration = Duration::from_secs(10);
const RESULT_CALL: Duration = Duration::from_secs(120);

/// Says the master's `--max-result-bytes` with a job, as the HTTP answer does.
fn with_limit(job: LeasedJob, max_result_bytes: usize) -> LeasedJob {
    LeasedJob { max_result_bytes: Some(max_result_bytes as u64), ..job }
}

/// The status and message the same refusal has over HTTP.
fn refused(e: EngineError) -> ProtocolError {
    let e = ApiError::from(e);
    ProtocolError::Refused { status: e.status.as_u16(), message: e.message }
}

#[async_trait::async_trait]
impl Link for LocalLink {
    fn describe(&self) -> String {
        "the master in this process".into()
    }

    async fn poll(&self, call: PollCall<'_>) -> Result<Option<LeasedJob>, ProtocolError> {
        let p = self.principal()?;
        let wait = call.wait.min(MAX_POLL);
        guarded(wait + SHORT_CALL, async {
            let job = self.engine.dispatch().poll_job(&p, call.name, call.instance, call.replaces, wait).await;
            job.map(|j| j.map(|j| with_limit(j, self.max_result_bytes))).map_err(refused)
        })
        .await
    }

    async fn heartbeat(&self, name: Option<&str>, job_id: &str, lease_id: &str) -> Result<(), ProtocolError> {
        let p = self.principal()?;
        guarded(SHORT_CALL, async {
            self.engine.dispatch().heartbeat_job(&p, name, job_id, lease_id).await.map(|_| ()).map_err(refused)
        })
        .await
    }

    async fn release(&self, name: Option<&str>, job_id: &str, lease_id: &str) -> Result<(), ProtocolError> {
        let p = self.principal()?;
        guarded(SHORT_CALL, async {
            self.engine.dispatch().release_job(&p, name, job_id, lease_id).await.map_err(refused)
        })
        .await
    }

    async fn result(&self, call: ResultCall<'_>) -> Result<Option<LeasedJob>, ProtocolError> {
        let p = self.principal()?;
        let r = call.result;
        // What the post's body would carry: its output, in base64, and the error line.
        let size = r.stdout_base64.len() + r.stderr_base64.len() + r.error.as_ref().map_or(0, String::len);
        if size > self.max_result_bytes {
            return Err(ProtocolError::Refused {
                status: 413,
                message: format!(
                    "the request body is larger than {} bytes (the master's --max-result-bytes)",
                    self.max_result_bytes
                ),
            });
        }
        // As over HTTP: the instance is only sent, and checked, with a request for the next job,
        // and checked before the result is taken.
        let instance = if call.take_next { call.instance } else { None };
        agentos_engine::dispatch::checked_instance("instance", instance).map_err(refused)?;
        // On a task of its own, as a request's handler is: a result taken is recorded even when
        // the executor stops waiting for the answer.
        let (engine, limit) = (self.engine.clone(), self.max_result_bytes);
        let (name, job_id, result) = (call.name.map(str::to_string), call.job_id.to_string(), r.clone());
        let (instance, take_next) = (instance.map(str::to_string), call.take_next);
        let task = tokio::spawn(async move {
            let dispatch = engine.dispatch();
            dispatch.complete_job(&p, name.as_deref(), &job_id, result).await.map_err(refused)?;
            if !take_next {
                return Ok(None);
            }
            let job = dispatch.next_job_now(&p, name.as_deref(), instance.as_deref()).await.map_err(refused)?;
            Ok(job.map(|j| with_limit(j, limit)))
        });
        match tokio::time::timeout(RESULT_CALL, task).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(failed()),
            Err(_) => Err(ProtocolError::Unreachable(format!("the master did not answer within {RESULT_CALL:?}"))),
        }
    }
}
