//! One job on the executor: decode, verify against the sha256, cache, run, report.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use agentos_core::entry::Runtime;
use agentos_core::job::{ExecutorResult, LeasedJob, ResolvedScript};
use agentos_core::sha256_hex;

use crate::cache::ScriptCache;
use crate::cgroup::JobCgroups;
use crate::folders::Folders;
use crate::runner::{self, RunSpec};
use crate::sealed::{NoUid, Sealed, SealedPolicy};

/// What the executor brings to every job.
#[derive(Debug, Clone)]
pub struct JobLimits {
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    pub max_output: usize,
    /// PATH given to scripts, and where runtimes are looked up.
    pub path: String,
    /// The user and group scripts run as; `None`: the executor's own.
    pub run_as: Option<(u32, u32)>,
    /// How jobs that carry credentials run.
    pub sealed: SealedPolicy,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(600),
            max_output: 16 * 1024 * 1024,
            path: "/usr/local/bin:/usr/bin:/bin".into(),
            run_as: None,
            sealed: SealedPolicy::Refuse,
        }
    }
}

/// The line added to a job's stderr when a process the script left running held its output
/// open past the drain (`runner::DRAIN_AFTER_EXIT`): its output is what was read until then.
pub const PIPES_LEFT_OPEN: &str = "\nagentos: the script exited but a process it started still held stdout or stderr open; the output read until then is kept\n";

fn refused(lease_id: &str, error: String) -> (ExecutorResult, Ended) {
    (ExecutorResult { lease_id: lease_id.to_string(), error: Some(error), ..Default::default() }, Ended::Done)
}

/// How a job's run ended, as its worker must know it: the result says it in words, for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It ran to its end, timed out, or was refused: its result is posted.
    Done,
    /// The executor stopped it before it finished (its process group was killed).
    Stopped,
    /// The executor stopped taking work while the job waited for a sealed uid: it never
    /// started, and goes back to the queue.
    StoppedWaiting,
}

/// What runs: a pinned script through its runtime, or a bash command string.
enum Source {
    Script { runtime: Runtime, content: Vec<u8>, sha256: String, filename: String },
    Bash { command: String },
}

/// A job, checked and ready to run.
struct Script {
    source: Source,
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    input: Option<Vec<u8>>,
    timeout: Duration,
}

fn parse(job: &LeasedJob, limits: &JobLimits) -> Result<Script, String> {
    if let Some(why) = &job.resolution_error {
        return Err(format!("cannot run: {why}"));
    }
    let t = &job.token;
    let empty = serde_json::Map::new();
    let args = if t.args.is_null() { &empty } else { t.args.as_object().ok_or("args must be an object")? };
    let bash = match (t.executor.as_str(), t.command.as_str()) {
        ("script", "invoke") => false,
        ("bash", _) => true,
        (e, c) => return Err(format!("this executor runs script invocations and bash commands, not {e:?}/{c:?}")),
    };
    let tool = args.get("toolId").and_then(Value::as_str).unwrap_or("(unnamed)");
    let source = if bash {
        Source::Bash { command: t.command.clone() }
    } else {
        let resolved = ResolvedScript::read_from(args)
            .map_err(|k| format!("tool {tool:?}: args.{k} is missing; the master did not resolve this job"))?;
        let ResolvedScript { content_base64, sha256, runtime: runtime_name, filename } = resolved;
        let runtime = Runtime::parse(&runtime_name).ok_or_else(|| format!("unknown runtime {runtime_name:?}"))?;
        let content = base64::engine::general_purpose::STANDARD
            .decode(content_base64)
            .map_err(|e| format!("tool {tool:?}: args.content is not valid base64: {e}"))?;
        let actual = sha256_hex(&content);
        if actual != sha256 {
            return Err(format!(
                "tool {tool:?}: refusing to run: the content hashes to {actual} but the job pins {sha256}"
            ));
        }
        Source::Script { runtime, content, sha256, filename }
    };
    let argv = match args.get("argv") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or("args.argv must be a list of strings"))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("args.argv must be a list of strings".into()),
    };
    let env: BTreeMap<String, String> = match args.get("env") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(o)) => o
            .iter()
            .map(|(k, v)| {
                v.as_str().map(|v| (k.clone(), v.to_string())).ok_or(format!("args.env.{k} must be a string"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("args.env must be an object of strings".into()),
    };
    env.keys().try_for_each(|k| agentos_core::job::check_env_name(k))?;
    let input = match args.get("input") {
        None | Some(Value::Null) => None,
        Some(v) => Some(serde_json::to_vec(v).map_err(|e| e.to_string())?),
    };
    let timeout = args
        .get("timeoutMs")
        .and_then(Value::as_u64)
        .map(Duration::from_millis)
        .unwrap_or(limits.default_timeout)
        .min(limits.max_timeout);
    Ok(Script { source, argv, env, input, timeout })
}

/// Runs one leased job to its result, and says how it ended. Never fails: every refusal is a
/// result with `error`.
pub async fn execute(
    job: &LeasedJob,
    cache: &ScriptCache,
    folders: &Folders,
    sealed: &Arc<Sealed>,
    cgroups: Option<&JobCgroups>,
    limits: &JobLimits,
    cancel: &CancellationToken,
) -> (ExecutorResult, Ended) {
    let script = match parse(job, limits) {
        Ok(s) => s,
        Err(e) => return refused(&job.lease_id, e),
    };
    let (runtime, mut args, script_path) = match &script.source {
        Source::Script { runtime, content, sha256, filename } => match cache.materialize(sha256, filename, content) {
            Ok((path, rewritten)) => {
                if rewritten {
                    tracing::debug!(%sha256, "script written to the cache");
                }
                (runtime.as_str(), vec![path.display().to_string()], Some(path))
            }
            Err(e) => return refused(&job.lease_id, format!("cannot write the script to the cache: {e}")),
        },
        Source::Bash { command } => ("bash", vec!["-c".to_string(), command.clone(), "bash".to_string()], None),
    };
    let Some(program) = runner::find_program(runtime, &limits.path) else {
        return refused(
            &job.lease_id,
            format!("runtime {runtime} is not installed on this executor (looked in {})", limits.path),
        );
    };
    // Made before anything else the job holds, so a refusal leaves nothing to undo.
    let cgroup = match cgroups.map(JobCgroups::job).transpose() {
        Ok(c) => c,
        Err(e) => return refused(&job.lease_id, format!("cannot create the job's cgroup: {e}")),
    };
    // A sealed job: a uid of its own (or the executor's, if so configured), a new folder.
    let uid = if job.sealed {
        match sealed.take_waiting(cancel).await {
            Ok(u) => u,
            Err(e) => {
                if let Some(cg) = cgroup {
                    cg.release().await;
                }
                let (result, _) = refused(&job.lease_id, e.to_string());
                return (result, if matches!(e, NoUid::Stopped(_)) { Ended::StoppedWaiting } else { Ended::Done });
            }
        }
    } else {
        None
    };
    let run_as = match &uid {
        Some(u) => Some((u.uid(), u.uid())),
        None if job.sealed => None,
        None => limits.run_as,
    };
    let cwd = if job.sealed { folders.take_sealed(run_as) } else { folders.take() };
    let cwd = match cwd {
        Ok(p) => p,
        Err(e) => {
            if let Some(u) = uid {
                u.release().await;
            }
            if let Some(cg) = cgroup {
                cg.release().await;
            }
            return refused(&job.lease_id, format!("cannot create a job folder: {e}"));
        }
    };
    let mut env = BTreeMap::from([
        ("PATH".to_string(), limits.path.clone()),
        ("HOME".to_string(), cwd.display().to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ]);
    env.extend(script.env);
    args.extend(script.argv);
    let spec = RunSpec {
        program,
        args,
        env,
        cwd: cwd.clone(),
        stdin: script.input,
        timeout: script.timeout,
        max_output: limits.max_output,
        run_as,
        cgroup,
        // A uid of its own is the executor's root: the view of its own comes with it.
        private: uid.is_some(),
        script: script_path,
    };
    let outcome = runner::run(spec, cancel).await;
    if job.sealed {
        // Whatever still runs as the uid (a `setsid` child outside the group) dies, then the
        // folder goes, and only then does the uid go back to the pool, whatever the outcome.
        match uid {
            Some(u) => u.release_removing(cwd).await,
            None => crate::folders::discard_off_thread(cwd).await,
        }
    } else if let Some(left) = folders.give_back(cwd) {
        crate::folders::discard_off_thread(left).await;
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    match outcome {
        Err(e) => refused(&job.lease_id, format!("cannot start {runtime}: {e}")),
        Ok(mut o) => (
            ExecutorResult {
                lease_id: job.lease_id.clone(),
                exit_code: o.exit_code,
                signal: o.signal,
                stdout_base64: b64.encode(&o.stdout),
                stderr_base64: {
                    if o.pipes_left_open {
                        // Said in stderr, not in `error`: the script did what it did and its exit
                        // code stands; the note only explains why the output may stop short.
                        o.stderr.extend_from_slice(PIPES_LEFT_OPEN.as_bytes());
                    }
                    b64.encode(&o.stderr)
                },
                duration_ms: o.duration.as_millis() as u64,
                timed_out: o.timed_out,
                output_truncated: o.truncated,
                error: if o.timed_out {
                    Some(format!("timed out after {} ms; the process group was killed", script.timeout.as_millis()))
                } else if o.cancelled {
                    Some("the executor stopped before the script finished; the process group was killed".into())
                } else {
                    None
                },
            },
            if o.cancelled && !o.timed_out { Ended::Stopped } else { Ended::Done },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentos_core::job::CommandToken;
    use serde_json::json;

    fn job(args: Value) -> LeasedJob {
        LeasedJob {
            job_id: "job-1".into(),
            lease_id: "lease-1".into(),
            lease_ms: 30_000,
            attempt: 1,
            model: "default".into(),
            token: CommandToken { executor: "script".into(), command: "invoke".into(), args },
            sealed: false,
            resolution_error: None,
            max_result_bytes: None,
        }
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    /// The result alone, as most tests need it.
    async fn execute(
        job: &LeasedJob,
        cache: &ScriptCache,
        folders: &Folders,
        sealed: &Arc<Sealed>,
        cgroups: Option<&JobCgroups>,
        limits: &JobLimits,
        cancel: &CancellationToken,
    ) -> ExecutorResult {
        super::execute(job, cache, folders, sealed, cgroups, limits, cancel).await.0
    }

    async fn exec(j: &LeasedJob) -> (ExecutorResult, tempfile::TempDir) {
        let ws = tempfile::tempdir().unwrap();
        let r = execute(
            j,
            &ScriptCache::new(ws.path()),
            &Folders::new(ws.path(), None),
            &Sealed::new(SealedPolicy::Refuse),
            None,
            &JobLimits::default(),
            &CancellationToken::new(),
        )
        .await;
        (r, ws)
    }

    /// Its worker hands a job back by how it ended, told apart by kind rather than by the words
    /// of its error: stopped by the executor mid-run, or while it waited for a sealed uid.
    #[tokio::test]
    async fn a_run_says_whether_the_executor_stopped_it_or_it_ended_by_itself() {
        let ws = tempfile::tempdir_in("/var/tmp").unwrap();
        let (cache, folders, limits) =
            (ScriptCache::new(ws.path()), Folders::new(ws.path(), None), JobLimits::default());
        let refuse = Sealed::new(SealedPolicy::Refuse);
        let run = |j: LeasedJob, sealed: Arc<Sealed>, cancel: CancellationToken| {
            let (cache, folders, limits) = (&cache, &folders, &limits);
            async move { super::execute(&j, cache, folders, &sealed, None, limits, &cancel).await }
        };
        let (r, ended) = run(sh("exit 3", json!({})), refuse.clone(), CancellationToken::new()).await;
        assert_eq!((r.exit_code, ended), (Some(3), Ended::Done));
        let mut slow = sh("sleep 5", json!({}));
        slow.token.args["timeoutMs"] = json!(200);
        let (r, ended) = run(slow, refuse.clone(), CancellationToken::new()).await;
        assert_eq!((r.timed_out, ended), (true, Ended::Done), "{r:?}");
        let cancel = CancellationToken::new();
        let stop = {
            let cancel = cancel.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                cancel.cancel();
            }
        };
        let ((r, ended), ()) = tokio::join!(run(sh("sleep 5", json!({})), refuse.clone(), cancel), stop);
        assert_eq!(ended, Ended::Stopped, "{r:?}");
        if !can_take_sealed_uids() {
            return;
        }
        let pool = Sealed::new(SealedPolicy::Uids(3_999_999_151..=3_999_999_151));
        let held = pool.take().unwrap().unwrap();
        let stop = {
            let pool = pool.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                pool.stop_waiting();
            }
        };
        let ((r, ended), ()) =
            tokio::join!(run(sealed_sh("echo ran", json!({})), pool.clone(), CancellationToken::new()), stop);
        assert_eq!((ended, r.exit_code), (Ended::StoppedWaiting, None), "{r:?}");
        assert!(r.error.as_deref().is_some_and(|e| e.starts_with(crate::sealed::STOPPED_WAITING)), "{r:?}");
        drop(held);
    }

    #[tokio::test]
    async fn a_crafted_job_whose_content_does_not_match_its_sha256_is_refused() {
        let pinned = sha256_hex(b"echo pinned");
        let (r, ws) = exec(&job(json!({"toolId": "t", "runtime": "sh", "filename": "t.sh", "sha256": pinned, "content": b64("echo evil; touch /tmp/pwned")}))).await;
        let err = r.error.unwrap();
        assert!(err.contains("refusing to run") && err.contains(&pinned), "{err}");
        assert_eq!(r.exit_code, None);
        assert!(!ws.path().join("scripts/sha256").join(&pinned).exists(), "refused content reached the cache");
    }

    #[tokio::test]
    async fn an_unresolved_job_fails_with_the_masters_reason() {
        let mut j = job(json!({"toolId": "nope"}));
        j.resolution_error = Some("tool \"nope\" in model \"m\": not found".into());
        let (r, _) = exec(&j).await;
        assert_eq!(r.error.as_deref(), Some("cannot run: tool \"nope\" in model \"m\": not found"));
    }

    #[tokio::test]
    async fn runs_with_argv_input_and_a_clean_environment() {
        let content = "echo \"args:$*\"; cat; echo; env | sort";
        let (r, _) = exec(&job(
            json!({"toolId": "t", "runtime": "sh", "filename": "t.sh", "sha256": sha256_hex(content.as_bytes()),
            "content": b64(content), "argv": ["a", "b"], "input": {"k": 1}, "env": {"GREETING": "hi"}}),
        ))
        .await;
        assert_eq!(r.error, None);
        let out =
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(r.stdout_base64).unwrap()).unwrap();
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("args:a b"));
        assert_eq!(lines.next(), Some("{\"k\":1}"));
        let env: Vec<&str> = lines.map(|l| l.split('=').next().unwrap()).collect();
        assert_eq!(env, vec!["GREETING", "HOME", "LANG", "PATH", "PWD"]);
    }

    /// Whether this test runs as root, which sealed uids need; says so when it does not.
    fn can_take_sealed_uids() -> bool {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            eprintln!("not root: a sealed uid cannot be taken here");
        }
        root
    }

    /// A result's stdout or stderr as text.
    fn text(base64: &str) -> String {
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(base64).unwrap()).unwrap()
    }

    fn sh(content: &str, env: Value) -> LeasedJob {
        job(json!({"toolId": "t", "runtime": "sh", "filename": "t.sh", "sha256": sha256_hex(content.as_bytes()),
            "content": b64(content), "env": env}))
    }

    /// As [`sh`], a job that carries a credential.
    fn sealed_sh(content: &str, env: Value) -> LeasedJob {
        LeasedJob { sealed: true, ..sh(content, env) }
    }

    #[tokio::test]
    async fn a_caller_env_that_steers_the_loader_runtime_or_shell_fails_the_job_naming_it() {
        for name in [
            "PATH",
            "HOME",
            "LANG",
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "NODE_OPTIONS",
            "PYTHONSTARTUP",
            "PYTHONPATH",
            "BASH_ENV",
            "ENV",
            "BASH_FUNC_echo%%",
            "IFS",
            "SHELLOPTS",
            "PS4",
            "PERL5OPT",
            "RUBYOPT",
            "GLIBC_TUNABLES",
        ] {
            let (r, _) = exec(&sh("echo ran", json!({"OK": "1", name: "x"}))).await;
            let err = r.error.unwrap_or_default();
            assert!(err.starts_with(&format!("args.env.{name} may not be set")), "{name}: {err}");
            assert_eq!(r.exit_code, None, "{name}: the script ran");
        }
        // Names that merely look alike are the caller's to set.
        let (r, _) = exec(&sh(
            "echo \"$PATHS $LANGUAGE $MY_LD_FLAGS\"",
            json!({"PATHS": "a", "LANGUAGE": "b", "MY_LD_FLAGS": "c"}),
        ))
        .await;
        assert_eq!(r.error, None);
        assert_eq!(base64::engine::general_purpose::STANDARD.decode(r.stdout_base64).unwrap(), b"a b c\n");
    }

    #[tokio::test]
    async fn a_sealed_job_is_refused_by_an_executor_that_cannot_change_user() {
        let j = sealed_sh("echo ran", json!({"KEY": "s3cret"}));
        let (r, ws) = exec(&j).await;
        let err = r.error.unwrap_or_default();
        assert!(err.starts_with("sealed jobs need an executor running as root with --sealed-uids"), "{err}");
        assert_eq!(r.exit_code, None);
        let folders = std::fs::read_dir(ws.path()).unwrap().flatten();
        assert_eq!(folders.filter(|e| e.file_name().to_string_lossy().starts_with('w')).count(), 0);
    }

    #[tokio::test]
    async fn a_sealed_job_as_the_current_user_gets_a_new_folder_that_is_removed_after() {
        let ws = tempfile::tempdir().unwrap();
        let folders = Folders::new(ws.path(), None);
        let spare = folders.take().unwrap();
        assert_eq!(folders.give_back(spare.clone()), None);
        let j = sealed_sh("pwd; touch left-behind", json!({}));
        let sealed = Sealed::new(SealedPolicy::CurrentUser);
        let r = execute(
            &j,
            &ScriptCache::new(ws.path()),
            &folders,
            &sealed,
            None,
            &JobLimits::default(),
            &CancellationToken::new(),
        )
        .await;
        assert_eq!((r.error.as_deref(), r.exit_code), (None, Some(0)));
        let out =
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(r.stdout_base64).unwrap()).unwrap();
        let cwd = std::path::PathBuf::from(out.trim());
        assert_ne!(cwd, spare, "a sealed job ran in a reused folder");
        assert!(!cwd.exists(), "the sealed job's folder was kept");
        assert_eq!(folders.take().unwrap(), spare);
    }

    #[tokio::test]
    async fn a_sealed_uid_goes_back_to_the_pool_only_once_its_jobs_folder_is_gone() {
        if !can_take_sealed_uids() {
            return;
        }
        let ws = tempfile::tempdir().unwrap();
        // One uid, far above anything this machine uses: the next sealed job would get it.
        let sealed = Sealed::new(SealedPolicy::Uids(3_999_999_101..=3_999_999_101));
        // Files left behind, so that removing the folder takes a while.
        let j = sealed_sh("for i in $(seq 3000); do : > f$i; done; echo secret > key", json!({}));
        // Takes the uid the moment it is free again, and looks for the job's folder then.
        let watcher = {
            let (sealed, root) = (sealed.clone(), ws.path().to_path_buf());
            std::thread::spawn(move || {
                let folders = || -> Vec<_> {
                    std::fs::read_dir(&root)
                        .unwrap()
                        .flatten()
                        .filter(|e| e.file_name().to_string_lossy().starts_with('w'))
                        .map(|e| e.path())
                        .collect()
                };
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                // The job holds the uid once its folder is there.
                while folders().is_empty() {
                    assert!(std::time::Instant::now() < deadline, "the job's folder never appeared");
                    std::thread::yield_now();
                }
                loop {
                    if let Ok(Some(_lease)) = sealed.take() {
                        return folders();
                    }
                    assert!(std::time::Instant::now() < deadline, "the uid never came back");
                    std::thread::yield_now();
                }
            })
        };
        let r = execute(
            &j,
            &ScriptCache::new(ws.path()),
            &Folders::new(ws.path(), None),
            &sealed,
            None,
            &JobLimits::default(),
            &CancellationToken::new(),
        )
        .await;
        assert_eq!((r.error.as_deref(), r.exit_code), (None, Some(0)), "{r:?}");
        let seen = watcher.join().unwrap();
        assert!(seen.is_empty(), "the next job of the uid could have read this one's folder: {seen:?}");
    }

    /// Regression: the folder of a job that left many files was removed on the executor's one
    /// runtime thread, and every other job of the executor waited for it: its exit went unseen,
    /// its output unread, its lease's heartbeats unsent.
    #[tokio::test]
    async fn a_folder_full_of_files_is_removed_while_the_executors_other_jobs_go_on() {
        let ws = tempfile::tempdir().unwrap();
        let marks = tempfile::tempdir().unwrap();
        let m = marks.path().display();
        // `big` says where it runs and waits while the test fills its folder, then exits. `other`
        // exits once the file on top of `big`'s folder is gone: the first thing its removal
        // takes, with the 40,000 files below still to go.
        let big = sh(
            &format!("pwd > {m}/cwd.tmp; mv {m}/cwd.tmp {m}/cwd; while [ ! -e {m}/go ]; do sleep 0.01; done"),
            json!({}),
        );
        let other = sh(
            &format!(
                "until [ -e {m}/go ]; do sleep 0.005; done; while [ -e \"$(cat {m}/cwd)/top\" ]; do sleep 0.005; done"
            ),
            json!({}),
        );
        let filler = {
            let marks = marks.path().to_path_buf();
            std::thread::spawn(move || {
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                let cwd = loop {
                    if let Ok(c) = std::fs::read_to_string(marks.join("cwd")) {
                        break std::path::PathBuf::from(c.trim());
                    }
                    assert!(std::time::Instant::now() < deadline, "the job never said where it runs");
                    std::thread::sleep(Duration::from_millis(5));
                };
                std::fs::write(cwd.join("top"), b"").unwrap();
                for d in 0..40 {
                    let sub = cwd.join(format!("d{d}"));
                    std::fs::create_dir(&sub).unwrap();
                    for f in 0..1000 {
                        std::fs::File::create(sub.join(f.to_string())).unwrap();
                    }
                }
                std::fs::write(marks.join("go"), b"").unwrap();
            })
        };
        let (cache, folders, sealed) =
            (ScriptCache::new(ws.path()), Folders::new(ws.path(), None), Sealed::new(SealedPolicy::Refuse));
        let (limits, cancel) = (JobLimits::default(), CancellationToken::new());
        let order = std::sync::Mutex::new(Vec::new());
        let run = |j: LeasedJob, name: &'static str| {
            let (cache, folders, sealed, limits, cancel, order) = (&cache, &folders, &sealed, &limits, &cancel, &order);
            async move {
                let r = execute(&j, cache, folders, sealed, None, limits, cancel).await;
                assert_eq!((r.error.as_deref(), r.exit_code), (None, Some(0)), "{name}: {r:?}");
                order.lock().unwrap().push(name);
            }
        };
        tokio::join!(run(big, "big"), run(other, "other"));
        filler.join().unwrap();
        assert_eq!(*order.lock().unwrap(), ["other", "big"], "the other job waited for the removal of 40,000 files");
        let left = std::fs::read_dir(ws.path()).unwrap().flatten();
        assert_eq!(
            left.filter(|e| e.file_name().to_string_lossy().starts_with('w')).count(),
            1,
            "only the other job's empty folder is kept"
        );
    }

    /// Regression: a uid of its own kept a sealed job's processes apart, not its files. One
    /// sealed job left a file in /tmp (mode 600), one in /dev/shm, a System V shared memory
    /// segment and keys in the uid's keyrings, and the next job given the uid read them all.
    #[tokio::test]
    async fn a_sealed_job_leaves_nothing_outside_its_folder_for_the_next_job_of_its_uid() {
        if !can_take_sealed_uids() {
            return;
        }
        // Under /tmp, which the jobs get a tmpfs of their own on: the workspace is carried into
        // it. A folder anyone may write in, as the rest of the machine may hold.
        let ws = tempfile::tempdir().unwrap();
        let open = ws.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
        let sealed = Sealed::new(SealedPolicy::Uids(3_999_999_121..=3_999_999_121));
        let (cache, folders) = (ScriptCache::new(ws.path()), Folders::new(ws.path(), None));
        let (limits, cancel) = (JobLimits::default(), CancellationToken::new());
        let name = "agentos-sealed-leak-test";
        let run = |script: String| {
            let j = sealed_sh(&script, json!({}));
            let (cache, folders, sealed, limits, cancel) = (&cache, &folders, &sealed, &limits, &cancel);
            async move {
                let r = execute(&j, cache, folders, sealed, None, limits, cancel).await;
                assert_eq!((r.error.as_deref(), r.exit_code), (None, Some(0)), "{r:?} {}", text(&r.stderr_base64));
                text(&r.stdout_base64)
            }
        };
        // Keys in the uid's user keyrings (`@u`, `@us`), which the kernel keeps after the job.
        let (add_key, keyctl) = (libc::SYS_add_key, libc::SYS_keyctl);
        let keys = format!(
            "python3 -c 'import ctypes; c = ctypes.CDLL(None); \
             print(\"keys added\", sum(c.syscall({add_key}, b\"user\", b\"{name}\", b\"secret\", 6, r) > 0 for r in (-4, -5)))'"
        );
        let first = run(format!(
            "echo secret > /tmp/{name} && chmod 600 /tmp/{name} && echo secret > /dev/shm/{name} && \
             echo secret > /var/tmp/{name} && ipcmk -M 4096 -p 0600 > /dev/null && echo wrote; {keys}; \
             if touch {open}/{name} 2> /dev/null; then echo the rest is writable; fi; \
             echo renamed > /proc/self/comm && echo /proc is writable; \
             touch in-its-folder && echo its folder is writable",
            open = open.display()
        ))
        .await;
        assert_eq!(first, "wrote\nkeys added 2\n/proc is writable\nits folder is writable\n");
        let second = run(format!(
            "cat /tmp/{name} /var/tmp/{name} /dev/shm/{name} 2> /dev/null; ipcs -m | grep -c '^0x'; \
             python3 -c 'import ctypes; c = ctypes.CDLL(None); \
             print(\"keys found\", sum(c.syscall({keyctl}, 10, r, b\"user\", b\"{name}\", 0) > 0 for r in (-4, -5)))'"
        ))
        .await;
        assert_eq!(second, "0\nkeys found 0\n", "the next job of the uid read what the last one left");
        for dir in
            [std::path::Path::new("/tmp"), std::path::Path::new("/dev/shm"), std::path::Path::new("/var/tmp"), &open]
        {
            assert!(!dir.join(name).exists(), "the job wrote in the executor's {}", dir.display());
        }
    }

    /// Each sealed job joins a keyring of its own, counted against its uid's quota of keys (200
    /// by default): more jobs than that, one after another on one uid, all run.
    #[tokio::test]
    async fn more_sealed_jobs_than_a_uid_may_hold_keys_run_one_after_another() {
        if !can_take_sealed_uids() {
            return;
        }
        let ws = tempfile::tempdir_in("/var/tmp").unwrap();
        let sealed = Sealed::new(SealedPolicy::Uids(3_999_999_131..=3_999_999_131));
        let (cache, folders) = (ScriptCache::new(ws.path()), Folders::new(ws.path(), None));
        let (limits, cancel) = (JobLimits::default(), CancellationToken::new());
        let j = sealed_sh("exit 0", json!({}));
        for n in 0..250 {
            let r = execute(&j, &cache, &folders, &sealed, None, &limits, &cancel).await;
            assert_eq!((r.error.as_deref(), r.exit_code), (None, Some(0)), "job {n}: {r:?}");
        }
    }

    /// Regression: with more sealed jobs at once than uids, the jobs beyond the pool failed at
    /// once ("no sealed uid is free") instead of waiting for a uid to come back.
    #[tokio::test]
    async fn sealed_jobs_beyond_the_pool_of_uids_wait_for_one_and_run() {
        if !can_take_sealed_uids() {
            return;
        }
        let ws = tempfile::tempdir_in("/var/tmp").unwrap();
        let sealed = Sealed::new(SealedPolicy::Uids(3_999_999_141..=3_999_999_141));
        let (cache, folders) = (ScriptCache::new(ws.path()), Folders::new(ws.path(), None));
        let (limits, cancel) = (JobLimits::default(), CancellationToken::new());
        let j = sealed_sh("sleep 0.2; id -u", json!({}));
        let run = || execute(&j, &cache, &folders, &sealed, None, &limits, &cancel);
        let (a, b, c) = tokio::join!(run(), run(), run());
        for r in [a, b, c] {
            assert_eq!((r.error.as_deref(), r.exit_code), (None, Some(0)), "{r:?}");
            assert_eq!(text(&r.stdout_base64), "3999999141\n");
        }
    }

    /// Regression: with the workspace /tmp itself, the tmpfs on /tmp hid the job's script, and
    /// every sealed job failed ("cannot open /tmp/scripts/…"). The test's thread gets a mount
    /// namespace and a /tmp of its own first, so the machine's /tmp is left alone.
    #[tokio::test]
    async fn a_sealed_job_runs_when_the_workspace_is_a_tmp_folder_itself() {
        if !can_take_sealed_uids() {
            return;
        }
        let none = std::ptr::null::<libc::c_char>();
        // SAFETY: this thread (the runtime's only one) leaves the machine's mounts behind.
        unsafe {
            assert_eq!(libc::unshare(libc::CLONE_NEWNS), 0, "{}", std::io::Error::last_os_error());
            assert_eq!(libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()), 0);
            assert_eq!(libc::mount(c"tmpfs".as_ptr(), c"/tmp".as_ptr(), c"tmpfs".as_ptr(), 0, std::ptr::null()), 0);
        }
        let ws = std::path::Path::new("/tmp");
        let sealed = Sealed::new(SealedPolicy::Uids(3_999_999_141..=3_999_999_141));
        let (cache, folders) = (ScriptCache::new(ws), Folders::new(&ws.join("jobs"), None));
        std::fs::create_dir(ws.join("jobs")).unwrap();
        let j = sealed_sh("echo ran; touch /tmp/mine && echo its own /tmp", json!({}));
        let r = execute(&j, &cache, &folders, &sealed, None, &JobLimits::default(), &CancellationToken::new()).await;
        assert_eq!(
            (r.exit_code, text(&r.stdout_base64).as_str()),
            (Some(0), "ran\nits own /tmp\n"),
            "{}",
            text(&r.stderr_base64)
        );
        assert!(!ws.join("mine").exists());
    }
}
