//! Jobs on the wire: invoking and calling a tool, a job's record and result, executors, and the
//! executor protocol's requests and answers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use agentos_core::job;

/// A command token, as DESIGN.md shapes it:
/// `{"executor":"script","command":"invoke","args":{"toolId":..., "argv":[], "env":{}, "timeoutMs":...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandToken {
    #[schema(example = "script")]
    pub executor: String,
    #[schema(example = "invoke")]
    pub command: String,
    #[schema(value_type = Object)]
    pub args: Value,
}

impl From<job::CommandToken> for CommandToken {
    fn from(t: job::CommandToken) -> Self {
        let job::CommandToken { executor, command, args } = t;
        CommandToken { executor, command, args }
    }
}

/// What an executor is handed: the job, its lease, and the token to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeasedJob {
    pub job_id: String,
    pub lease_id: String,
    /// The lease lasts this long from now unless renewed by a heartbeat.
    pub lease_ms: u64,
    /// 1 for the first hand-out, more after leases expired.
    pub attempt: u32,
    /// The model the command belongs to.
    pub model: String,
    pub token: CommandToken,
    /// The job carries credential values (a secret in its `env`): the executor runs it as a user
    /// of its own that no other job uses meanwhile, in a folder nobody else may enter.
    #[serde(default)]
    pub sealed: bool,
    /// Why the master could not resolve the tool, when it could not. The token then ships untouched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution_error: Option<String>,
    /// The largest result post the master takes (its `--max-result-bytes`): a result above it
    /// is posted without its output, saying why. Absent from masters before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_result_bytes: Option<u64>,
}

impl LeasedJob {
    /// Says the master's `--max-result-bytes` to the executor.
    pub fn with_limit(mut self, max_result_bytes: usize) -> Self {
        self.max_result_bytes = Some(max_result_bytes as u64);
        self
    }
}

impl From<job::LeasedJob> for LeasedJob {
    fn from(j: job::LeasedJob) -> Self {
        let job::LeasedJob {
            job_id,
            lease_id,
            lease_ms,
            attempt,
            model,
            token,
            sealed,
            resolution_error,
            max_result_bytes,
        } = j;
        LeasedJob {
            job_id,
            lease_id,
            lease_ms,
            attempt,
            model,
            token: token.into(),
            sealed,
            resolution_error,
            max_result_bytes,
        }
    }
}

/// `POST /api/executor/poll`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PollRequest {
    /// The executor's display name (defaults to its credential's name).
    #[serde(default)]
    pub name: Option<String>,
    /// How long the master may hold the request open waiting for work, at most 60 000.
    #[serde(default)]
    pub wait_ms: Option<u64>,
    /// The executor process's id, 16 lower-case hex characters drawn at its start: the lease
    /// ids it is handed start with it.
    #[serde(default)]
    pub instance: Option<String>,
    /// The instance ids of processes that died on the same workspace, at most 64 (one string
    /// is read as a list of one). The leases this executor handed to them end now, and their
    /// jobs go back to the queue at once; another executor's leases are left alone.
    #[serde(default, deserialize_with = "agentos_core::job::one_or_many", skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 64)]
    pub replaces: Vec<String>,
}

/// `POST /api/executor/stopped`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoppedRequest {
    /// The stopping process's instance id, as sent with its polls: a lease it still holds
    /// (a job it could not hand back) ends now, and its job goes back to the queue.
    #[serde(default)]
    pub instance: Option<String>,
}

/// `POST /api/executor/jobs/{id}/heartbeat` and `/release`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseRef {
    pub lease_id: String,
}

/// What an executor reports for one job. Output travels as base64 so that bytes are exact.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecutorResult {
    pub lease_id: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    #[serde(default)]
    pub stdout_base64: String,
    #[serde(default)]
    pub stderr_base64: String,
    pub duration_ms: u64,
    #[serde(default)]
    pub timed_out: bool,
    /// Output beyond the executor's capture limit was dropped.
    #[serde(default)]
    pub output_truncated: bool,
    /// Set when the executor refused the job or could not run it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<ExecutorResult> for job::ExecutorResult {
    fn from(r: ExecutorResult) -> Self {
        let ExecutorResult {
            lease_id,
            exit_code,
            signal,
            stdout_base64,
            stderr_base64,
            duration_ms,
            timed_out,
            output_truncated,
            error,
        } = r;
        job::ExecutorResult {
            lease_id,
            exit_code,
            signal,
            stdout_base64,
            stderr_base64,
            duration_ms,
            timed_out,
            output_truncated,
            error,
        }
    }
}

/// Output too large to keep inline: the whole of it is in the blob store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutputBlob {
    pub urn: String,
    pub size_bytes: u64,
    pub sha256: String,
}

impl From<job::OutputBlob> for OutputBlob {
    fn from(b: job::OutputBlob) -> Self {
        let job::OutputBlob { urn, size_bytes, sha256 } = b;
        OutputBlob { urn, size_bytes, sha256 }
    }
}

/// The result of a command, shaped like a shell command's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobResult {
    pub job_id: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The output, or its first 2,000 characters when `stdoutBlob` is set.
    pub stdout: String,
    pub stderr: String,
    pub duration_ms: u64,
    pub timed_out: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_blob: Option<OutputBlob>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_blob: Option<OutputBlob>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_truncated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub attempt: u32,
    /// The executor that ran it (empty when none did).
    pub executor: String,
    /// The principal (by name) that cancelled the job before it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_by: Option<String>,
}

impl From<job::JobResult> for JobResult {
    fn from(r: job::JobResult) -> Self {
        let job::JobResult {
            job_id,
            exit_code,
            signal,
            stdout,
            stderr,
            duration_ms,
            timed_out,
            stdout_blob,
            stderr_blob,
            output_truncated,
            error,
            attempt,
            executor,
            cancelled_by,
        } = r;
        JobResult {
            job_id,
            exit_code,
            signal,
            stdout,
            stderr,
            duration_ms,
            timed_out,
            stdout_blob: stdout_blob.map(OutputBlob::from),
            stderr_blob: stderr_blob.map(OutputBlob::from),
            output_truncated,
            error,
            attempt,
            executor,
            cancelled_by,
        }
    }
}

/// `POST /api/tools/{id}/invoke`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InvokeRequest {
    #[serde(default)]
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Sent to the script as JSON on stdin.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub input: Option<Value>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

impl From<InvokeRequest> for job::InvokeRequest {
    fn from(r: InvokeRequest) -> Self {
        let InvokeRequest { argv, env, input, timeout_ms } = r;
        job::InvokeRequest { argv, env, input, timeout_ms }
    }
}

/// `POST /api/tools/{id}/call`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CallRequest {
    /// The operation: `run` for a script.
    pub tool: String,
    /// The flags, as typed after the tool's name.
    #[serde(default)]
    pub args: Vec<String>,
}

impl From<CallRequest> for agentos_engine::call::CallRequest {
    fn from(r: CallRequest) -> Self {
        let CallRequest { tool, args } = r;
        agentos_engine::call::CallRequest { tool, args }
    }
}

/// How an executor appears in `GET /api/executors`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorView {
    pub name: String,
    /// `polling`; `busy` (holds jobs); `idle` (between two polls); `stopped` (said it stopped in
    /// good order, its jobs finished or handed back, and not heard from since); `silent`
    /// (neither polling nor holding a job, and not heard from for 5 s: killed, frozen or cut
    /// off); `gone` (so for the master's `gone_after`, 90 s).
    pub state: String,
    pub last_seen: String,
    /// The ids of the jobs it holds in models the caller may use.
    pub jobs: Vec<String>,
    /// How many jobs it holds in models the caller may not use: counted, not named.
    pub other_jobs: usize,
}

impl From<job::ExecutorView> for ExecutorView {
    fn from(e: job::ExecutorView) -> Self {
        let job::ExecutorView { name, state, last_seen, jobs, other_jobs } = e;
        ExecutorView { name, state, last_seen, jobs, other_jobs }
    }
}

/// A finished job as the log records it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    pub job_id: String,
    pub model: String,
    /// `queued`, `running` (handed to an executor), or `finished` (`results` holds its result).
    pub state: String,
    pub invoker: Invoker,
    pub results: Vec<JobResult>,
}

/// Who invoked a job, as the caller sees it: `you`, `another` principal, or a `net` (the job is
/// a step of a fire). Its invoker or the operator may cancel it; a net's step is not cancelled
/// alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Invoker {
    You,
    Another,
    Net,
}

impl From<agentos_engine::dispatch::Invoker> for Invoker {
    fn from(i: agentos_engine::dispatch::Invoker) -> Self {
        use agentos_engine::dispatch::Invoker as I;
        match i {
            I::You => Invoker::You,
            I::Another => Invoker::Another,
            I::Net => Invoker::Net,
        }
    }
}

impl From<agentos_engine::dispatch::JobRecord> for JobRecord {
    fn from(r: agentos_engine::dispatch::JobRecord) -> Self {
        let agentos_engine::dispatch::JobRecord { job_id, model, state, invoker, results } = r;
        JobRecord {
            job_id,
            model,
            state,
            invoker: invoker.into(),
            results: results.into_iter().map(JobResult::from).collect(),
        }
    }
}

/// A job that finished lately, as listed: its outcome and the first characters of its output.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecentJob {
    pub job_id: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_id: Option<String>,
    /// The event that recorded it.
    pub seq: u64,
    pub finished_at: String,
    /// The executor that ran it (empty when none did).
    pub executor: String,
    /// Which hand-out to an executor it finished in: 1 for the first, more when a lease ran out
    /// (its executor stopped sending heartbeats) and the job was handed out again.
    pub attempt: u32,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The first 300 characters of stdout; the whole is at `GET /api/jobs/{id}` (or its blob).
    pub stdout: String,
    pub stderr: String,
    /// The blob holding the whole stdout, when it was offloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_blob: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_blob: Option<String>,
    /// Whose it is, as the caller sees it (as `GET /api/jobs/{id}` says).
    pub invoker: Invoker,
}

impl From<(agentos_engine::recent::RecentJob, agentos_engine::dispatch::Invoker)> for RecentJob {
    fn from((j, invoker): (agentos_engine::recent::RecentJob, agentos_engine::dispatch::Invoker)) -> Self {
        RecentJob {
            invoker: invoker.into(),
            job_id: j.job_id,
            model: j.model,
            tool_id: j.tool_id,
            seq: j.seq,
            finished_at: j.finished_at,
            executor: j.executor,
            attempt: j.attempt,
            exit_code: j.exit_code,
            signal: j.signal,
            timed_out: j.timed_out,
            duration_ms: j.duration_ms,
            error: j.error,
            stdout: j.stdout,
            stderr: j.stderr,
            stdout_blob: j.stdout_blob,
            stderr_blob: j.stderr_blob,
        }
    }
}
