//! Command jobs: the token a command transition (or a direct invocation) dispatches, and the
//! wire shapes of the executor protocol.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Arguments the master merges into a script job at fire time; a caller may not set them.
pub const RESOLVED_ARGS: [&str; 4] = ["content", "sha256", "runtime", "filename"];

/// The script a master resolved for a job, carried in the command's `args` beside what the
/// caller gave: written by the master, read and verified by the executor, by this one type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedScript {
    /// The content as base64.
    pub content_base64: String,
    /// The pin the content must hash to.
    pub sha256: String,
    pub runtime: String,
    pub filename: String,
}

impl ResolvedScript {
    /// Writes the script into `args` (made an object if it is not one).
    pub fn put_into(self, args: &mut Value) {
        if !args.is_object() {
            *args = Value::Object(Default::default());
        }
        let Some(a) = args.as_object_mut() else { return };
        let [content, sha256, runtime, filename] = RESOLVED_ARGS;
        a.insert(content.into(), Value::String(self.content_base64));
        a.insert(sha256.into(), Value::String(self.sha256));
        a.insert(runtime.into(), Value::String(self.runtime));
        a.insert(filename.into(), Value::String(self.filename));
    }

    /// Reads the script from a job's `args`; `Err` names the first field missing. A missing
    /// file name is `script`.
    pub fn read_from(args: &serde_json::Map<String, Value>) -> Result<ResolvedScript, &'static str> {
        let [content, sha256, runtime, filename] = RESOLVED_ARGS;
        let s = |k: &'static str| args.get(k).and_then(Value::as_str).map(str::to_string).ok_or(k);
        Ok(ResolvedScript {
            runtime: s(runtime)?,
            sha256: s(sha256)?,
            content_base64: s(content)?,
            filename: s(filename).unwrap_or_else(|_| "script".into()),
        })
    }
}

/// The sha256 a job's script must still have when it is handed out: set by the master when the
/// job carries secrets granted to that pin, never taken from a caller.
pub const PINNED_SHA256: &str = "pinnedSha256";

/// A command token, as DESIGN.md shapes it:
/// `{"executor":"script","command":"invoke","args":{"toolId":..., "argv":[], "env":{}, "timeoutMs":...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandToken {
    pub executor: String,
    pub command: String,
    pub args: Value,
}

/// What an executor is handed: the job, its lease, and the token to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

/// An executor process's instance id: 16 lower-case hex characters (64 random bits it draws
/// at start). Lease ids carry it, and its successor on the same workspace names it.
pub fn is_valid_instance(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// An executor asking for work.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PollRequest {
    /// The executor's display name (defaults to its credential's name).
    #[serde(default)]
    pub name: Option<String>,
    /// How long the master may hold the request open waiting for work, at most 60 000.
    #[serde(default)]
    pub wait_ms: Option<u64>,
    /// The executor process's id (16 lower-case hex characters): its lease ids start with it.
    #[serde(default)]
    pub instance: Option<String>,
    /// The instance ids of processes that died on the same workspace (one string is read as a
    /// list of one, as executors before the list sent it).
    #[serde(default, deserialize_with = "one_or_many", skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<String>,
}

/// The most instance ids one poll may name as dead predecessors.
pub const MAX_REPLACES: usize = 64;

/// A list of strings, or one string read as a list of one; `null` is an empty list.
pub fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct OneOrMany;
    impl<'de> serde::de::Visitor<'de> for OneOrMany {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of instance ids (or one id as a string)")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(vec![v.to_string()])
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(s) = seq.next_element::<String>()? {
                out.push(s);
            }
            Ok(out)
        }
    }
    d.deserialize_option(OneOrMany)
}

/// The lease an executor holds on a job, named to renew it or hand the job back.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseRef {
    pub lease_id: String,
}

/// What an executor reports for one job. Output travels as base64 so that bytes are exact.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

/// Output too large to keep inline: the whole of it is in the blob store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputBlob {
    pub urn: String,
    pub size_bytes: u64,
    pub sha256: String,
}

/// The result of a command, shaped like a shell command's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// The principal (by name) that cancelled the job before it finished; its result says no
    /// more than that, where it was running and for how long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_by: Option<String>,
}

impl JobResult {
    /// A result for a job no executor finished.
    pub fn failed(job_id: &str, attempt: u32, error: String) -> Self {
        JobResult {
            job_id: job_id.to_string(),
            exit_code: None,
            signal: None,
            stdout: String::new(),
            stderr: String::new(),
            duration_ms: 0,
            timed_out: false,
            stdout_blob: None,
            stderr_blob: None,
            output_truncated: false,
            error: Some(error),
            attempt,
            executor: String::new(),
            cancelled_by: None,
        }
    }
}

/// One direct invocation of a script tool: its arguments, environment, input and timeout.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InvokeRequest {
    #[serde(default)]
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Sent to the script as JSON on stdin.
    #[serde(default)]
    pub input: Option<Value>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// An executor as listed: its state, when it was last seen, and the jobs it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorView {
    pub name: String,
    /// `polling`, `busy`, `idle` (between two polls), `silent` (neither polling nor holding a
    /// job for 5 s: stopped, killed or cut off) or `gone`.
    pub state: String,
    pub last_seen: String,
    /// The ids of the jobs it holds that the reader may see (in models it may use).
    pub jobs: Vec<String>,
    /// How many jobs it holds besides those: in models the reader may not use.
    #[serde(default)]
    pub other_jobs: usize,
}

/// Names a caller's `env` may not set, exactly.
pub const FORBIDDEN_ENV: [&str; 10] =
    ["PATH", "HOME", "LANG", "BASH_ENV", "ENV", "IFS", "SHELLOPTS", "BASHOPTS", "PS4", "GLIBC_TUNABLES"];

/// Prefixes of names a caller's `env` may not set.
pub const FORBIDDEN_ENV_PREFIXES: [&str; 6] = ["LD_", "NODE_", "PYTHON", "BASH_FUNC_", "PERL5", "RUBY"];

/// Refuses a caller's environment variable that would decide what runs rather than what the
/// script reads: the loader (`LD_PRELOAD`, `GLIBC_TUNABLES`), a runtime's start-up code
/// (`NODE_OPTIONS`, `PYTHONSTARTUP`, `PERL5OPT`, `RUBYOPT`, `BASH_ENV`, `ENV`, exported bash
/// functions), the shell's parsing (`IFS`, `SHELLOPTS`, `PS4`), or what the executor itself sets
/// (`PATH`, `HOME`, `LANG`). Such a job fails with the variable named rather than running with
/// it dropped: a script that silently runs without what its caller asked for does something
/// nobody asked for, and the caller learns of the refusal only from an error. The master checks
/// a direct invocation's names with it before the job is queued; every executor checks again.
pub fn check_env_name(name: &str) -> Result<(), String> {
    if FORBIDDEN_ENV.contains(&name) || FORBIDDEN_ENV_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return Err(format!(
            "args.env.{name} may not be set by a caller: it changes how the loader, the runtime or the shell starts, or is set by the executor (refused: {}, and names starting with {})",
            FORBIDDEN_ENV.join(", "),
            FORBIDDEN_ENV_PREFIXES.join(", ")
        ));
    }
    Ok(())
}
