//! Sealed runs and lease holders end to end: a job that carries a secret runs as a uid of its
//! own and leaves nothing running; a caller cannot steer the loader or a runtime through `env`;
//! and one executor cannot finish another's job. Real master, real executors, run as root.

mod common;

use std::collections::BTreeSet;
use std::ops::RangeInclusive;

use base64::Engine as _;
use common::{Api, Executor, Master, wait_for};
use serde_json::{Value, json};

/// The uid scripts of a root executor run as by default (`nobody`).
const NOBODY: u32 = 65534;

/// A master and a root executor with sealed uids of its own (answered).
fn setup(executor_args: &[&str]) -> (tempfile::TempDir, Master, Executor, RangeInclusive<u32>) {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let (start, end) = common::own_sealed_uids();
    let range = format!("{start}-{end}");
    let args: Vec<&str> = executor_args.iter().copied().chain(["--sealed-uids", &range]).collect();
    let e = Executor::start_args(&m, &dir.path().join("executor"), "e1", &[], &args);
    (dir, m, e, start..=end)
}

/// Makes `model`'s transition `run` turn each bash command token put into `p-cmd` into a job
/// that carries a secret, at most `concurrency` at once, its response emitted into `p-out`.
///
/// Today a job carries a secret when a net `command` transition names a credential; the value
/// comes from the secrets store (`PUT /api/secrets/{name}`). All of that is here, so that a
/// change to how credentials reach command fires is made in one place.
fn sealed_net(api: &Api, model: &str, concurrency: usize) {
    let (status, v) = api.put("/api/secrets/SEALED_KEY", json!({"value": "sealed-secret-value-4711"}));
    assert_eq!(status, 200, "{v}");
    let net = json!({
        "places": ["p-cmd", "p-out"],
        "transitions": [{"id": "run", "kind": "command", "concurrency": concurrency,
            "presets": {"c": {"place": "p-cmd"}}, "postsets": {"o": {"place": "p-out"}},
            "action": {"credentials": ["SEALED_KEY"]}, "emit": [{"to": "o", "from": "@response"}]}]
    });
    let (status, v) = api.put(&format!("/api/models/{model}/net"), net);
    assert_eq!(status, 200, "{v}");
    let (status, v) = api.post(&format!("/api/models/{model}/transitions/run/start"), json!({}));
    assert_eq!(status, 200, "{v}");
}

/// Each command becomes a registered script the secret is granted to (a secret goes to nothing
/// else), run by a token that names it.
fn put_commands(api: &Api, model: &str, commands: &[&str]) {
    for (i, c) in commands.iter().enumerate() {
        let id = format!("{model}-{i}");
        let (status, v) = api.register(&id, "sh", c, Some("default"));
        assert_eq!(status, 200, "{v}");
        let (status, v) = api.post("/api/secrets/SEALED_KEY/grants", json!({"tool": id}));
        assert_eq!(status, 200, "{v}");
        let token =
            json!({"data": {"executor": "script", "command": "invoke", "args": {"toolId": id, "timeoutMs": 30000}}});
        let (status, v) = api.post(&format!("/api/models/{model}/places/p-cmd/tokens"), token);
        assert_eq!(status, 200, "{v}");
    }
}

/// Runs each bash `command` as a job that carries a secret, all at once, and answers their job
/// results (in any order) once every one of them succeeded.
fn sealed_jobs(api: &Api, model: &str, commands: &[&str]) -> Vec<Value> {
    sealed_net(api, model, commands.len());
    put_commands(api, model, commands);
    wait_for("the sealed jobs' results", || {
        let (_, net) = api.get(&format!("/api/models/{model}/net"));
        let error = &net["transitions"][0]["lastError"];
        assert!(error.is_null(), "a sealed job failed: {error}");
        api.token_data(model, "p-out").len() == commands.len()
    });
    api.token_data(model, "p-out")
}

/// Runs `command` as a job that carries a secret, and answers why its fire failed.
fn sealed_job_failure(api: &Api, model: &str, command: &str) -> String {
    sealed_net(api, model, 1);
    put_commands(api, model, &[command]);
    let mut error = String::new();
    wait_for("the sealed job's failure", || {
        let (_, net) = api.get(&format!("/api/models/{model}/net"));
        error = net["transitions"][0]["lastError"].as_str().unwrap_or("").to_string();
        !error.is_empty()
    });
    error
}

/// Processes alive (not zombies) whose real, effective, saved or file system uid is `uid`.
fn live_processes_of(uid: u32) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).unwrap_or("").trim().to_string();
        let zombie = field("State:").starts_with('Z');
        let ours = field("Uid:").split_whitespace().any(|u| u == uid.to_string());
        if ours && !zombie {
            pids.push(pid);
        }
    }
    pids
}

fn stdout_lines(result: &Value) -> Vec<String> {
    assert!(result.get("error").is_none_or(Value::is_null), "the job failed: {result}");
    assert_eq!(result["exitCode"], 0, "{result}");
    result["stdout"].as_str().unwrap().lines().map(str::to_string).collect()
}

/// A caller's `env` that sets what decides how the script starts is refused by the master,
/// 400 naming the variable, before a job is queued (it used to be queued and fail at the
/// executor, answered 200 with the reason; each executor still refuses such a job).
#[test]
fn a_caller_env_that_sets_ld_preload_or_bash_env_is_refused_naming_the_variable() {
    let (_d, m, _e, _) = setup(&[]);
    let api = m.client();
    assert_eq!(api.register("hello", "bash", "echo ran", None).0, 200);
    let (_, before) = api.get("/api/jobs");
    for name in ["LD_PRELOAD", "BASH_ENV", "PATH"] {
        let (status, r) = api.invoke("hello", json!({"env": {"GREETING": "hi", name: "/tmp/evil"}}));
        assert_eq!(status, 400, "{name} was accepted: {r}");
        assert_eq!(r["error"]["code"], "invalid_env", "{r}");
        let err = r["error"]["message"].as_str().unwrap();
        assert!(err.contains(&format!("args.env.{name} may not be set")), "{name}: {err}");
    }
    assert_eq!(api.get("/api/jobs").1, before, "a refused invocation left a job behind");
    let (_, r) = api.invoke("hello", json!({"env": {"GREETING": "hi"}}));
    assert_eq!(r["stdout"], "ran\n", "{r}");
}

#[test]
fn concurrent_sealed_jobs_run_as_uids_of_their_own_in_private_folders() {
    let (d, m, _e, sealed_uids) = setup(&["--concurrency", "3"]);
    let api = m.client();
    // Both jobs run at once: each starts a marker process and waits for `go`, which the test
    // makes once it sees both markers alive in /proc (a sealed job can write nowhere but in its
    // own folder and its own /tmp, but it can read).
    let go = d.path().join("go");
    let command = format!(
        "sleep 1000.25 & until [ -e {go} ]; do sleep 0.02; done; kill $!; \
         id -u; id -g; stat -c '%u %a' \"$HOME\"; [ \"$PWD\" = \"$HOME\" ] && echo home-is-cwd",
        go = go.display()
    );
    sealed_net(&api, "sealed", 2);
    put_commands(&api, "sealed", &[&command, &command]);
    wait_for("both sealed jobs running at once", || {
        let markers = std::fs::read_dir("/proc").unwrap().flatten().filter(|p| {
            std::fs::read(p.path().join("cmdline")).is_ok_and(|c| c == b"sleep\x001000.25\x00")
                && std::fs::metadata(p.path())
                    .is_ok_and(|m| sealed_uids.contains(&std::os::unix::fs::MetadataExt::uid(&m)))
        });
        markers.count() == 2
    });
    std::fs::write(&go, b"").unwrap();
    wait_for("the sealed jobs' results", || api.token_data("sealed", "p-out").len() == 2);
    let results = api.token_data("sealed", "p-out");
    let mut uids = BTreeSet::new();
    for r in &results {
        let lines = stdout_lines(r);
        let uid: u32 = lines[0].parse().unwrap();
        assert!(sealed_uids.contains(&uid), "uid {uid} is not a sealed uid: {r}");
        assert_eq!(lines[1], lines[0], "gid is the uid's number");
        assert_eq!(lines[2], format!("{uid} 700"), "the job folder is the sealed uid's alone");
        assert_eq!(lines[3], "home-is-cwd");
        uids.insert(uid);
    }
    assert_eq!(uids.len(), 2, "two concurrent sealed jobs shared a uid: {results:?}");

    // A job without a secret runs as the uid every normal job runs as: none of the sealed ones.
    assert_eq!(api.register("who", "sh", "id -u", None).0, 200);
    let (_, r) = api.invoke("who", json!({}));
    let normal: u32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert_eq!(normal, NOBODY, "{r}");
    assert!(!uids.contains(&normal));

    // Sealed folders are removed after their jobs.
    let left: Vec<_> = std::fs::read_dir(d.path().join("executor/jobs"))
        .unwrap()
        .flatten()
        .filter(|e| std::fs::metadata(e.path()).is_ok_and(|m| uids.contains(&std::os::unix::fs::MetadataExt::uid(&m))))
        .collect();
    assert!(left.is_empty(), "sealed job folders were kept: {left:?}");
}

/// A sealed job that waits for a uid (every one out with a running job) when its executor is
/// told to stop goes back to the queue at once, and runs later on another executor; the job
/// that holds the uid ends within the grace period.
#[test]
fn a_sealed_job_waiting_for_a_uid_when_its_executor_stops_goes_back_and_runs_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    let (uid, _) = common::own_sealed_uids();
    let one = format!("{uid}-{uid}");
    let mut e1 =
        Executor::start_args(&m, &dir.path().join("e1"), "e1", &[], &["--concurrency", "2", "--sealed-uids", &one]);
    let go = dir.path().join("go");
    let command = format!("until [ -e {} ]; do sleep 0.02; done; id -u; pwd", go.display());
    sealed_net(&api, "back", 2);
    put_commands(&api, "back", &[&command, &command]);
    let held = |name: &str| {
        let (_, list) = api.get("/api/executors");
        let e = list.as_array().unwrap().iter().find(|e| e["name"] == name).cloned().unwrap_or(Value::Null);
        e["jobs"].as_array().map_or(0, Vec::len)
    };
    // One job runs and holds the only uid; the other, leased too, waits for it.
    wait_for("both jobs leased to e1, one running as the sealed uid", || {
        held("e1") == 2 && !live_processes_of(uid).is_empty()
    });
    // SAFETY: a signal to the executor this test started.
    assert_eq!(unsafe { libc::kill(e1.child.id() as i32, libc::SIGTERM) }, 0);
    wait_for("the waiting job handed back", || held("e1") == 1);
    std::fs::write(&go, b"").unwrap();
    let status = e1.child.wait().unwrap();
    assert!(status.success(), "e1 ended with {status}");
    let results = api.token_data("back", "p-out");
    assert_eq!(results.len(), 1, "{results:?}");
    let e1_dir = dir.path().join("e1").display().to_string();
    assert_eq!(stdout_lines(&results[0])[0], uid.to_string());
    assert!(stdout_lines(&results[0])[1].starts_with(&e1_dir), "{}", results[0]);
    let (_, net) = api.get("/api/models/back/net");
    assert!(net["transitions"][0]["lastError"].is_null(), "the handed-back job failed: {net}");

    let _e2 = Executor::start_args(&m, &dir.path().join("e2"), "e2", &[], &["--sealed-uids", &one]);
    wait_for("the handed-back job's result", || api.token_data("back", "p-out").len() == 2);
    let results = api.token_data("back", "p-out");
    let e2_dir = dir.path().join("e2").display().to_string();
    let ran_on_e2: Vec<_> = results.iter().filter(|r| stdout_lines(r)[1].starts_with(&e2_dir)).collect();
    assert_eq!(ran_on_e2.len(), 1, "{results:?}");
    assert_eq!(stdout_lines(ran_on_e2[0])[0], uid.to_string());
    let (_, net) = api.get("/api/models/back/net");
    assert!(net["transitions"][0]["lastError"].is_null(), "{net}");
}

#[test]
fn a_sealed_job_that_leaves_a_setsid_child_behind_leaves_no_process_of_its_uid() {
    let (_d, m, _e, sealed_uids) = setup(&[]);
    let api = m.client();
    // `setsid` leaves the job's process group, so killing the group does not reach it.
    let results =
        sealed_jobs(&api, "leftover", &["setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!; id -u; sleep 0.2"]);
    let lines = stdout_lines(&results[0]);
    let (pid, uid): (i32, u32) = (lines[0].parse().unwrap(), lines[1].parse().unwrap());
    assert!(sealed_uids.contains(&uid), "not a sealed uid: {uid}");
    // The result is posted only after the uid's processes were killed.
    assert_eq!(live_processes_of(uid), Vec::<i32>::new(), "processes of sealed uid {uid} survived the job");
    assert!(!live_processes_of(uid).contains(&pid), "the setsid sleep {pid} survived");
}

#[test]
fn an_executor_sweeps_sealed_uids_left_running_by_a_predecessor() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    // A process under a sealed uid, as a killed executor would leave it.
    let (start, end) = common::own_sealed_uids();
    let uid = end;
    let mut orphan = std::process::Command::new("setsid");
    std::os::unix::process::CommandExt::uid(&mut orphan, uid);
    std::os::unix::process::CommandExt::gid(&mut orphan, uid);
    let mut orphan = orphan.args(["sleep", "300"]).spawn().unwrap();
    wait_for("the orphan to run as its uid", || !live_processes_of(uid).is_empty());
    let range = format!("{start}-{end}");
    let _e = Executor::start_args(&m, &dir.path().join("executor"), "e1", &[], &["--sealed-uids", &range]);
    // The sweep ran before the executor first polled.
    let status = orphan.try_wait().unwrap();
    assert!(status.is_some_and(|s| std::os::unix::process::ExitStatusExt::signal(&s) == Some(9)), "{status:?}");
    assert_eq!(live_processes_of(uid), Vec::<i32>::new());
}

#[test]
fn an_executor_without_root_fails_sealed_jobs_with_the_reason_and_runs_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let (status, body) = m.client().post("/api/executor-tokens", json!({"name": "plain"}));
    assert_eq!(status, 200, "{body}");
    // The executor itself runs as nobody, in a workspace of its own (an executor refuses one
    // under a folder others may write).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let workspace = dir.path().join("executor");
    std::fs::create_dir(&workspace).unwrap();
    std::os::unix::fs::chown(&workspace, Some(NOBODY), Some(NOBODY)).unwrap();
    let mut cmd = std::process::Command::new(common::BIN);
    std::os::unix::process::CommandExt::uid(&mut cmd, NOBODY);
    std::os::unix::process::CommandExt::gid(&mut cmd, NOBODY);
    let child = cmd
        .args(["executor", "--master", &m.url, "--workspace"])
        .arg(&workspace)
        .env("AGENTOS_EXECUTOR_TOKEN", body["token"].as_str().unwrap())
        .env("AGENTOS_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let e = Executor { child, workspace };
    e.wait_until_polling(&m, "plain");
    let err = sealed_job_failure(&m.client(), "refused", "echo ran");
    assert!(err.contains("sealed jobs need an executor running as root with --sealed-uids"), "{err}");
    assert!(m.client().token_data("refused", "p-out").is_empty());
    assert_eq!(m.client().register("who", "sh", "id -u", None).0, 200);
    let (_, r) = m.client().invoke("who", json!({}));
    assert_eq!(r["stdout"], format!("{NOBODY}\n"), "{r}");
}

#[test]
fn a_sealed_uid_range_that_holds_the_uid_of_normal_scripts_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let (status, body) = m.client().post("/api/executor-tokens", json!({"name": "e2"}));
    assert_eq!(status, 200, "{body}");
    let out = std::process::Command::new(common::BIN)
        .args(["executor", "--master", &m.url, "--workspace"])
        .arg(dir.path().join("w"))
        .args(["--run-as", "nobody", "--sealed-uids", "65000-65534"])
        .env("AGENTOS_EXECUTOR_TOKEN", body["token"].as_str().unwrap())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("65000-65534 holds 65534, the uid scripts run as"), "{err}");
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
fn a_job_leased_to_one_executor_cannot_be_renewed_released_or_finished_by_another() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let op = m.client();
    let token = |name: &str| {
        let (status, v) = op.post("/api/executor-tokens", json!({"name": name}));
        assert_eq!(status, 200, "{v}");
        op.with_token(v["token"].as_str())
    };
    let (a, b) = (token("exec-a"), token("exec-b"));
    assert_eq!(op.register("work", "sh", "echo real", None).0, 200);

    // A polls (so the queue is served), then the job is queued by an invocation that waits.
    let poller = {
        let a = a.clone();
        std::thread::spawn(move || {
            a.post("/api/executor/poll", json!({"waitMs": 20000, "instance": "00000000000000aa"}))
        })
    };
    wait_for("exec-a polling", || {
        let (_, list) = op.get("/api/executors");
        list.as_array().is_some_and(|l| l.iter().any(|e| e["name"] == "exec-a" && e["state"] == "polling"))
    });
    let invocation = {
        let op = op.clone();
        std::thread::spawn(move || op.invoke("work", json!({"timeoutMs": 20000})))
    };
    let (status, job) = poller.join().unwrap();
    assert_eq!(status, 200, "{job}");
    let (job_id, lease) = (job["jobId"].as_str().unwrap().to_string(), job["leaseId"].as_str().unwrap().to_string());
    assert!(lease.len() == 17 + 32 && lease.starts_with("00000000000000aa-"), "{lease}");

    let forged = json!({"leaseId": lease, "exitCode": 0, "signal": null, "stdoutBase64": b64("forged by b\n"),
        "stderrBase64": "", "durationMs": 1});
    for (path, body) in
        [("heartbeat", json!({"leaseId": lease})), ("release", json!({"leaseId": lease})), ("result", forged.clone())]
    {
        let resp = b.post(&format!("/api/executor/jobs/{job_id}/{path}"), body);
        assert_eq!(common::error_code(&resp, 403), "forbidden", "{path}: {resp:?}");
        let msg = resp.1["error"]["message"].as_str().unwrap();
        assert!(msg.contains("leased to another executor"), "{path}: {msg}");
    }
    // A guessed lease id is as good as none.
    let mut guessed = forged;
    guessed["leaseId"] = json!("0".repeat(32));
    assert_eq!(b.post(&format!("/api/executor/jobs/{job_id}/result"), guessed).0, 409);

    // Nothing changed: still A's job, not queued again for B, and A's result is the one taken.
    let (_, list) = op.get("/api/executors");
    let held = |name: &str| list.as_array().unwrap().iter().find(|e| e["name"] == name).map(|e| e["jobs"].clone());
    assert_eq!(held("exec-a"), Some(json!([job_id])), "{list}");
    assert_eq!(b.post("/api/executor/poll", json!({"waitMs": 100})).0, 204, "the job went back to the queue");
    // B naming A's process as its own dead predecessor ends nothing of A's.
    let named =
        json!({"waitMs": 100, "instance": "00000000000000bb", "replaces": ["00000000000000aa", "00000000000000cc"]});
    assert_eq!(b.post("/api/executor/poll", named).0, 204, "the job is still A's");
    let (status, v) = a.post(&format!("/api/executor/jobs/{job_id}/heartbeat"), json!({"leaseId": lease}));
    assert_eq!(status, 200, "{v}");
    let real = json!({"leaseId": lease, "exitCode": 0, "signal": null, "stdoutBase64": b64("from a\n"),
        "stderrBase64": "", "durationMs": 1});
    // An instance id that is not 16 lower-case hex characters is refused before anything is
    // taken: the result is still A's to post.
    for (path, body) in [
        (format!("/api/executor/jobs/{job_id}/result?next=true&instance=NOT-HEX"), real.clone()),
        ("/api/executor/poll".to_string(), json!({"waitMs": 100, "instance": "0123456789ABCDEF"})),
        ("/api/executor/poll".to_string(), json!({"waitMs": 100, "replaces": "0123"})),
        ("/api/executor/poll".to_string(), json!({"waitMs": 100, "replaces": ["00000000000000aa", "0123"]})),
        ("/api/executor/poll".to_string(), json!({"waitMs": 100, "replaces": vec!["00000000000000aa"; 65]})),
        (
            "/api/executor/poll".to_string(),
            json!({"waitMs": 100, "instance": "00000000000000aa", "replaces": ["00000000000000bb", "00000000000000aa"]}),
        ),
    ] {
        let resp = a.post(&path, body);
        assert_eq!(common::error_code(&resp, 400), "invalid_instance", "{path}: {resp:?}");
    }
    let (status, v) = a.post(&format!("/api/executor/jobs/{job_id}/result"), real);
    assert_eq!(status, 200, "{v}");
    let (status, r) = invocation.join().unwrap();
    assert_eq!(status, 200, "{r}");
    assert_eq!((r["stdout"].as_str(), r["executor"].as_str()), (Some("from a\n"), Some("exec-a")), "{r}");
}

#[test]
fn a_script_running_beside_a_sealed_job_cannot_read_its_secret() {
    let (_d, m, _e, _) = setup(&["--concurrency", "3"]);
    let api = m.client();
    // The sealed job can read its own environment (so the scan below is able to find it), then
    // stays alive while the other script looks; the test sees it start in /proc, since a sealed
    // job can write nowhere but in its own folder and its own /tmp.
    let sealed = "tr '\\0' '\\n' < /proc/$$/environ | grep -q '^SEALED_KEY=' && echo self-has-it; sleep 3.25";
    sealed_net(&api, "beside", 1);
    put_commands(&api, "beside", &[sealed]);
    wait_for("the sealed job to start", || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .any(|p| std::fs::read(p.path().join("cmdline")).is_ok_and(|c| c == b"sleep\x003.25\x00"))
    });
    let scan = "n=0; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$f\" 2>/dev/null | grep -q '^SEALED_KEY=' && n=$((n+1)); done; echo found=$n";
    assert_eq!(api.register("scan", "sh", scan, None).0, 200);
    let (status, r) = api.invoke("scan", json!({}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "found=0\n", "a concurrent script read the sealed job's environment: {r}");
    wait_for("the sealed job's result", || api.token_data("beside", "p-out").len() == 1);
    let out = &api.token_data("beside", "p-out")[0];
    assert!(stdout_lines(out).contains(&"self-has-it".to_string()), "{out}");
}
