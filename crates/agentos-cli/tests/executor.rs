//! Executors and the script pipeline end to end: real master, real executor processes, real runtimes.

mod common;

use common::{Executor, Master, sha256_hex, wait_for};
use serde_json::{Value, json};

fn setup() -> (tempfile::TempDir, Master, Executor) {
    setup_with(&[], &[])
}

fn setup_with(master_args: &[&str], executor_env: &[(&str, &str)]) -> (tempfile::TempDir, Master, Executor) {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), master_args);
    let e = Executor::start(&m, &dir.path().join("executor"), "e1", executor_env);
    (dir, m, e)
}

fn ok_result(resp: &(u16, Value)) -> &Value {
    assert_eq!(resp.0, 200, "{resp:?}");
    assert!(resp.1.get("error").is_none(), "unexpected error: {}", resp.1);
    &resp.1
}

#[test]
fn all_four_runtimes_run_with_argv_and_input_on_stdin() {
    let (_d, m, _e) = setup();
    let api = m.client();
    let scripts = [
        ("sh", "read line; echo \"sh:$1:$line\""),
        ("bash", "read -r line; echo \"bash:${1}:${line}\""),
        (
            "node",
            "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>console.log('node:'+process.argv[2]+':'+JSON.parse(s).n))",
        ),
        ("python3", "import sys,json\nprint('python3:'+sys.argv[1]+':'+str(json.load(sys.stdin)['n']))"),
    ];
    for (runtime, content) in scripts {
        assert_eq!(api.register(&format!("t-{runtime}"), runtime, content, None).0, 200);
        let r = api.invoke(&format!("t-{runtime}"), json!({"argv": ["a1"], "input": {"n": 7}}));
        let r = ok_result(&r);
        let expected_line = if matches!(runtime, "sh" | "bash") {
            format!("{runtime}:a1:{{\"n\":7}}")
        } else {
            format!("{runtime}:a1:7")
        };
        assert_eq!(r["stdout"], format!("{expected_line}\n"), "{runtime}: {r}");
        assert_eq!((r["exitCode"].as_i64(), r["timedOut"].as_bool()), (Some(0), Some(false)), "{runtime}: {r}");
        assert_eq!(r["executor"], "e1");
    }
    // Without input, stdin is closed: a script that reads it sees end of file at once.
    api.register("reads-stdin", "sh", "cat; echo eof-seen", None);
    let r = api.invoke("reads-stdin", json!({"timeoutMs": 10000}));
    let r = ok_result(&r);
    assert_eq!(r["stdout"], "eof-seen\n");
    assert!(r["durationMs"].as_u64().unwrap() < 5000);
}

#[test]
fn a_blob_altered_under_the_catalog_is_refused_at_the_master_and_never_ships() {
    let (d, m, _e) = setup();
    let api = m.client();
    let (_, e) = api.register("victim", "sh", "echo pinned", None);
    let sha = e["binding"]["sha256"].as_str().unwrap().to_string();
    let blob = m.blob_file("tool-catalog/scripts", &sha);
    std::fs::write(&blob, "echo TAMPERED").unwrap();

    let (status, r) = api.invoke("victim", json!({}));
    assert_eq!(status, 200);
    let err = r["error"].as_str().unwrap();
    assert!(err.contains("\"victim\"") && err.contains("\"default\"") && err.contains("hash mismatch"), "{err}");
    assert!(!r["stdout"].as_str().unwrap().contains("TAMPERED"));
    assert!(!d.path().join("executor/scripts/sha256").join(&sha).exists(), "the executor received the script");
}

#[test]
fn a_cached_script_altered_on_disk_is_rewritten_and_the_pinned_content_runs() {
    let (d, m, _e) = setup();
    let api = m.client();
    let (_, e) = api.register("cached", "sh", "echo pinned", None);
    let sha = e["binding"]["sha256"].as_str().unwrap();
    assert_eq!(ok_result(&api.invoke("cached", json!({})))["stdout"], "pinned\n");
    let cached = d.path().join("executor/scripts/sha256").join(sha).join("cached.sh");
    assert_eq!(std::fs::read_to_string(&cached).unwrap(), "echo pinned");
    std::fs::write(&cached, "echo TAMPERED").unwrap();
    assert_eq!(ok_result(&api.invoke("cached", json!({})))["stdout"], "pinned\n");
    assert_eq!(std::fs::read_to_string(&cached).unwrap(), "echo pinned");
}

#[test]
fn a_timeout_kills_the_whole_process_group_grandchildren_included() {
    let (d, m, _e) = setup();
    let api = m.client();
    let shared = shared_folder(d.path());
    let pidfile = shared.join("grandchild.pid");
    // The job sleeps only once the grandchild has written its pid, so the pid is there to read
    // however late the grandchild starts on a loaded machine.
    let script = format!(
        "sh -c 'echo $$ > {0}; exec sleep 300' &\nuntil [ -s {0} ]; do sleep 0.01; done\nsleep 300\n",
        pidfile.display()
    );
    api.register("sleeper", "sh", &script, None);
    // A timeout no job could keep is refused before anything runs.
    for bad in [json!(0), json!(86_400_001)] {
        let (status, r) = api.invoke("sleeper", json!({"timeoutMs": bad}));
        assert_eq!((status, r["error"]["code"].as_str()), (400, Some("invalid_timeout")), "{bad}: {r}");
    }
    let (status, r) = api.invoke("sleeper", json!({"timeoutMs": 1500}));
    assert_eq!(status, 200);
    assert_eq!(r["timedOut"], true, "{r}");
    assert!(r["error"].as_str().unwrap().contains("timed out after 1500 ms"), "{r}");
    let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_string();
    wait_for("the grandchild to be gone", || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |s| s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
    });
}

#[test]
fn an_executor_killed_mid_job_loses_nothing_and_one_result_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--lease-ms", "1000"]);
    let api = m.client();
    let mut a = Executor::start(&m, &dir.path().join("a"), "a", &[]);
    api.register("slow", "sh", "sleep 2; echo finished", None);
    let caller = {
        let api = api.clone();
        std::thread::spawn(move || api.invoke("slow", json!({"timeoutMs": 10000})))
    };
    wait_for("executor a to take the job", || {
        let (_, list) = api.get("/api/executors");
        list[0]["state"] == "busy"
    });
    a.kill9();
    let _b = Executor::start(&m, &dir.path().join("b"), "b", &[]);
    let (status, r) = caller.join().unwrap();
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "finished\n", "{r}");
    assert_eq!(r["executor"], "b");
    assert_eq!(r["attempt"], 2);
    let (status, job) = api.get(&format!("/api/jobs/{}", r["jobId"].as_str().unwrap()));
    assert_eq!(status, 200, "{job}");
    assert_eq!(job["results"].as_array().unwrap().len(), 1, "{job}");
    // The list of recent jobs says which hand-out ran it.
    let (_, recent) = api.get("/api/jobs");
    assert_eq!((recent[0]["jobId"].clone(), recent[0]["attempt"].clone()), (r["jobId"].clone(), json!(2)), "{recent}");
}

/// A caller that goes away (an agent's Ctrl-C, a closed connection) does not leave its job
/// holding the executor's slot: the job is dropped, the executor's next heartbeat is told so and
/// kills the process, and the slot serves the next call.
#[test]
fn a_running_job_whose_caller_went_away_is_stopped_and_frees_its_slot() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--lease-ms", "900"]);
    let api = m.client();
    let _e = Executor::start(&m, &dir.path().join("e"), "e", &[]);
    api.register("hang", "sh", "sleep 60", None);
    api.register("quick", "sh", "echo quick", None);
    let addr = m.url.trim_start_matches("http://");
    let mut caller = std::net::TcpStream::connect(addr).unwrap();
    let body = r#"{"timeoutMs": 120000}"#;
    write!(
        caller,
        "POST /api/tools/hang/invoke HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        m.token,
        body.len()
    )
    .unwrap();
    wait_for("the executor to take the job", || api.get("/api/executors").1[0]["state"] == "busy");
    drop(caller);
    let started = std::time::Instant::now();
    wait_for("the executor to be free again", || api.get("/api/executors").1[0]["state"] != "busy");
    let (status, r) = api.invoke("quick", json!({"timeoutMs": 10000}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "quick\n");
    // Well before the sleep would have ended: the slot was free, not waited out.
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "{:?}", started.elapsed());
}

/// An asynchronous job can be cancelled by its invoker (or the operator), running or queued:
/// the running one's process is stopped and its slot freed, the queued one never runs, and
/// each has one recorded result saying who cancelled it, which outlives a restart.
#[test]
fn an_async_job_is_cancelled_by_its_invoker_running_or_queued_and_never_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--lease-ms", "900"]);
    let api = m.client();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let ran = shared.join("ran");
    api.register("hang", "sh", "sleep 60", None);
    api.register("quick", "sh", "echo quick", None);
    api.register("mark", "sh", &format!("echo ran >> {}", ran.display()), None);
    let invoker = api.agent("invoker", "--x------s");
    let other = api.agent("other", "--x------s");
    // `l` in the invoker's home model, where its jobs run: it may read them, not cancel them.
    let (status, v) = api.post("/api/agents", json!({"name": "reader", "flags": "--x-l----s", "model": "invoker"}));
    assert_eq!(status, 200, "{v}");
    let reader = api.with_token(v["token"].as_str());
    let start = |tool: &str| invoker.invoke_async(tool, json!({"timeoutMs": 120000}));

    // Running.
    let e = Executor::start(&m, &dir.path().join("e"), "e", &[]);
    let job = start("hang");
    let path = format!("/api/jobs/{job}");
    wait_for("the job to run", || invoker.get(&path).1["state"] == "running");
    let running = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let cancel = format!("{path}/cancel");
    let (status, v) = other.post(&cancel, json!({}));
    assert_eq!(status, 404, "a principal that may not read the job finds none: {v}");
    let (status, v) = reader.post(&cancel, json!({}));
    assert_eq!((status, v["error"]["code"].as_str()), (403, Some("forbidden")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("only its invoker or the operator"), "{v}");
    // Each reader is told whose the job is, so that nobody is offered a cancel bound to fail.
    assert_eq!(reader.get(&path).1["invoker"], "another");
    assert_eq!(invoker.get(&path).1["invoker"], "you");
    assert_eq!(api.get(&path).1["invoker"], "another", "the operator did not invoke it, and may cancel it");
    let (status, v) = invoker.get(&format!("{path}/stdout"));
    assert_eq!((status, v["error"]["code"].as_str()), (409, Some("job_not_finished")), "{v}");
    let started = std::time::Instant::now();
    let (status, v) = invoker.post(&cancel, json!({}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state"], "finished", "{v}");
    let result = &v["results"][0];
    assert_eq!(result["cancelledBy"], "invoker", "{v}");
    assert_eq!(result["executor"], "e", "where it was running: {v}");
    // How long it ran there: at least since it was seen running, at most since it was invoked.
    let held = result["durationMs"].as_u64().unwrap();
    assert!(held >= 300 && held as u128 <= running.elapsed().as_millis() + 5_000, "ran {held} ms: {v}");
    assert!(result["error"].as_str().unwrap().contains("cancelled by invoker"), "{v}");
    assert_eq!(v["results"].as_array().unwrap().len(), 1, "{v}");
    // The list of recent jobs says whose each is, as the job read alone does.
    let listed = |who: &common::Api| {
        let (_, list) = who.get("/api/jobs");
        list.as_array().unwrap().iter().find(|j| j["jobId"] == job.as_str()).map(|j| j["invoker"].clone())
    };
    assert_eq!(listed(&invoker), Some(json!("you")));
    assert_eq!(listed(&reader), Some(json!("another")));
    assert_eq!(listed(&other), None, "listed to a principal that may not read it");
    wait_for("the executor to be free again", || api.get("/api/executors").1[0]["state"] != "busy");
    let (status, r) = api.invoke("quick", json!({"timeoutMs": 10000}));
    assert_eq!((status, r["stdout"].as_str()), (200, Some("quick\n")), "{r}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "the sleep was waited out");
    let (status, v) = invoker.post(&cancel, json!({}));
    assert_eq!((status, v["error"]["code"].as_str()), (409, Some("job_finished")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("cancelled by invoker"), "{v}");

    // A caller waiting on its job gets the cancelled result.
    let waiting = {
        let invoker = api.with_token(invoker.token.as_deref());
        std::thread::spawn(move || invoker.post("/api/tools/hang/invoke", json!({"timeoutMs": 120000})))
    };
    let mut held = Value::Null;
    wait_for("the waited-on job to run", || {
        held = api.get("/api/executors").1[0]["jobs"][0].clone();
        held.is_string()
    });
    let (status, v) = invoker.post(&format!("/api/jobs/{}/cancel", held.as_str().unwrap()), json!({}));
    assert_eq!(status, 200, "{v}");
    let (status, r) = waiting.join().unwrap();
    assert_eq!(r["cancelledBy"], "invoker", "{status} {r}");

    // Queued, with no executor; the operator cancels it.
    drop(e);
    let queued = start("mark");
    let queued_path = format!("/api/jobs/{queued}");
    assert_eq!(invoker.get(&queued_path).1["state"], "queued");
    let (status, v) = api.post(&format!("{queued_path}/cancel"), json!({}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["results"][0]["cancelledBy"], "operator", "{v}");
    assert_eq!(v["results"][0]["executor"], "", "it ran nowhere: {v}");
    assert_eq!(v["results"][0]["durationMs"], 0, "{v}");
    let (status, v) = api.post("/api/jobs/no-such-job/cancel", json!({}));
    assert_eq!(status, 404, "{v}");

    // After a restart, neither runs again and both stay cancelled.
    let m = m.restart();
    let api = m.client();
    let invoker = api.with_token(invoker.token.as_deref());
    let _e = Executor::start(&m, &dir.path().join("e2"), "e2", &[]);
    let (status, r) = api.invoke("quick", json!({"timeoutMs": 10000}));
    assert_eq!(status, 200, "{r}");
    for (p, by) in [(&path, "invoker"), (&queued_path, "operator")] {
        let (status, v) = invoker.get(p);
        assert_eq!(status, 200, "{v}");
        assert_eq!((v["state"].as_str(), v["results"][0]["cancelledBy"].as_str()), (Some("finished"), Some(by)));
        assert_eq!(v["results"].as_array().unwrap().len(), 1, "{v}");
    }
    assert!(!ran.exists(), "the cancelled queued job ran");
}

/// An executor killed mid-job and started again on its workspace hands the job back at once:
/// the lease (a minute here) would otherwise hold it past the caller's wait. Another executor
/// started on the same workspace meanwhile does not hide the killed one from its successor.
#[test]
fn an_executor_restarted_on_its_workspace_hands_back_the_job_its_killed_predecessor_held() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--lease-ms", "60000"]);
    let api = m.client();
    let workspace = dir.path().join("a");
    let mut a = Executor::start(&m, &workspace, "a", &[]);
    api.register("slow", "sh", "sleep 2; echo finished", None);
    let caller = {
        let api = api.clone();
        // Waits 5 s plus the master's queue grace (30 s): less than the lease.
        std::thread::spawn(move || api.invoke("slow", json!({"timeoutMs": 5000})))
    };
    wait_for("executor a to take the job", || api.get("/api/executors").1[0]["state"] == "busy");
    let _b = Executor::start(&m, &workspace, "b", &[]);
    a.kill9();
    let _a = Executor::start(&m, &workspace, "a", &[]);
    let (status, r) = caller.join().unwrap();
    assert_eq!(status, 200, "{r}");
    assert_eq!((r["stdout"].as_str(), r["attempt"].as_u64()), (Some("finished\n"), Some(2)), "{r}");
    let (status, job) = api.get(&format!("/api/jobs/{}", r["jobId"].as_str().unwrap()));
    assert_eq!(status, 200, "{job}");
    assert_eq!(job["results"].as_array().unwrap().len(), 1, "{job}");
}

#[test]
fn a_job_whose_every_lease_expires_fails_with_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--lease-ms", "300", "--max-attempts", "1"]);
    let api = m.client();
    let mut a = Executor::start(&m, &dir.path().join("a"), "a", &[]);
    api.register("slow", "sh", "sleep 5", None);
    let caller = {
        let api = api.clone();
        std::thread::spawn(move || api.invoke("slow", json!({"timeoutMs": 10000})))
    };
    wait_for("executor a to take the job", || api.get("/api/executors").1[0]["state"] == "busy");
    a.kill9();
    let (status, r) = caller.join().unwrap();
    assert_eq!(status, 200);
    let err = r["error"].as_str().unwrap();
    assert!(err.contains("every lease expired") && err.contains("\"a\""), "{err}");
    // Where it ran last, and how long that lease held (the lease, 300 ms, at least).
    assert_eq!(r["executor"], "a", "{r}");
    assert!(r["durationMs"].as_u64().is_some_and(|d| d >= 300), "{r}");
}

/// Regression: a result larger than the master's `--max-result-bytes` was refused (413) at every
/// post, and the job ended only when its leases ran out, as "stopped sending heartbeats". The
/// executor now posts it without its output, saying why, and the caller hears that at once.
#[test]
fn a_result_too_large_for_the_master_comes_back_without_its_output_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--max-result-bytes", "100000", "--lease-ms", "2000"]);
    let api = m.client();
    let _e = Executor::start(&m, &dir.path().join("e"), "e", &[]);
    // Output near the limit and far above it: a refusal of a post of megabytes arrived as a
    // reset connection rather than a 413, so the executor reads the limit from the job.
    for (id, bytes) in [("near", 80_000), ("far", 3_000_000)] {
        api.register(id, "sh", &format!("head -c {bytes} /dev/zero | tr '\\0' x; exit 3"), None);
        let (status, r) = api.invoke(id, json!({}));
        assert_eq!(status, 200, "{r}");
        // Attempt 1: answered at once, not after three leases ran out.
        let got = (r["exitCode"].as_i64(), r["attempt"].as_u64(), r["stdout"].as_str());
        assert_eq!(got, (Some(3), Some(1), Some("")), "{id}: {r}");
        assert_eq!(r["outputTruncated"], true, "{r}");
        let err = r["error"].as_str().unwrap();
        assert!(err.contains("--max-result-bytes (100000)") && err.contains("was dropped"), "{err}");
    }
    // Within the limit, the output comes back whole.
    api.register("fits", "sh", "head -c 60000 /dev/zero | tr '\\0' x", None);
    let (status, r) = api.invoke("fits", json!({}));
    assert_eq!((status, r["stdout"].as_str().map(str::len), r.get("error")), (200, Some(60000), None), "{r}");
}

/// A direct invocation of a tool that is not there is answered 404 before a job is queued; a
/// net's command naming one ships and fails at hand-out, that command only.
#[test]
fn an_unknown_tool_fails_that_command_only() {
    let (_d, m, _e) = setup();
    let api = m.client();
    api.register("fine", "sh", "echo fine", None);
    let bad = {
        let api = api.clone();
        std::thread::spawn(move || api.invoke("no-such-tool", json!({})))
    };
    assert_eq!(ok_result(&api.invoke("fine", json!({})))["stdout"], "fine\n");
    let (status, r) = bad.join().unwrap();
    assert_eq!(status, 404, "{r}");
    let err = r["error"]["message"].as_str().unwrap();
    assert!(err.contains("\"no-such-tool\"") && err.contains("\"default\""), "{err}");
    let (status, v) = api.put(
        "/api/models/default/net",
        json!({"places": ["p-cmd", "p-out"], "transitions": [{"id": "run", "kind": "command",
            "presets": {"c": {"place": "p-cmd"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(api.post("/api/models/default/transitions/run/start", json!({})).0, 200);
    for tool in ["no-such-tool", "fine"] {
        let token = json!({"executor": "script", "command": "invoke", "args": {"toolId": tool}});
        assert_eq!(api.post("/api/models/default/places/p-cmd/tokens", json!({"data": token})).0, 200);
    }
    // The failed fire parks its token with the reason; `lastError` would not do here, as the
    // other command's fire clears it when it completes.
    let parked = || api.get("/api/models/default/parked").1.as_array().cloned().unwrap_or_default();
    common::wait_for("the unknown tool's token to park", || !parked().is_empty());
    let parked = parked();
    assert_eq!(parked.len(), 1, "{parked:?}");
    let err = parked[0]["reason"].as_str().unwrap();
    assert!(err.contains("\"no-such-tool\"") && err.contains("not found"), "{err}");
    common::wait_for("the other command's result", || api.token_data("default", "p-out").len() == 1);
    // A command's output is its standard output.
    assert_eq!(api.token_data("default", "p-out"), vec![json!("fine\n")]);
    assert_eq!(ok_result(&api.invoke("fine", json!({})))["stdout"], "fine\n");
}

/// Output cut at the executor's limit is not passed off as the operation's output.
#[test]
fn an_operation_whose_output_was_cut_at_the_executor_s_limit_fails_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let _e = Executor::start_args(&m, &dir.path().join("e"), "e1", &[], &["--max-output-bytes", "200000"]);
    let api = m.client();
    api.register("rows", "python3", "import json\nprint(json.dumps({'rows': ['x' * 100] * 3000}))", None);
    let (status, v) = api.post("/api/tools/rows/call", json!({"tool": "run", "args": []}));
    assert_eq!(status, 422, "{}", v.to_string().chars().take(300).collect::<String>());
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("passed the executor's limit and was cut; the 200000 bytes kept are in urn:"), "{msg}");
}

#[test]
fn a_mebibyte_of_stdout_is_offloaded_to_the_blob_store() {
    let (_d, m, _e) = setup();
    let api = m.client();
    api.register("loud", "python3", "import sys\nsys.stdout.write('a' * 1048575 + 'z')", None);
    let resp = api.invoke("loud", json!({}));
    let r = ok_result(&resp);
    assert!(serde_json::to_vec(r).unwrap().len() < 8 * 1024, "the result is not small");
    assert_eq!(r["stdout"].as_str().unwrap().len(), 2000);
    let blob = &r["stdoutBlob"];
    assert_eq!(blob["sizeBytes"], 1048576);
    let mut expected = vec![b'a'; 1048575];
    expected.push(b'z');
    assert_eq!(blob["sha256"], sha256_hex(&expected));
    let blob_path = format!("/api/blobs/{}", blob["urn"].as_str().unwrap());
    let (status, bytes) = api.get_bytes(&blob_path);
    assert_eq!(status, 200);
    assert_eq!(bytes, expected);
    // A browser keeps no copy of a job's output, and keys any blob's copy on the token.
    let resp = api.http.get(format!("{}{blob_path}", api.url)).bearer_auth(&m.token).send().unwrap();
    assert_eq!(resp.headers()["cache-control"], "private, no-store");
    assert_eq!(resp.headers()["vary"], "authorization");

    // The invoker reads its job's whole output by the job's id, with no `r`; another agent
    // finds no such job.
    let caller = api.agent("caller", "--x------s");
    let other = api.agent("other", "--x------s");
    let job = caller.invoke_async("loud", json!({}));
    wait_for("the job to finish", || caller.get(&format!("/api/jobs/{job}")).1["state"] == "finished");
    assert_eq!(caller.get_bytes(&blob_path).0, 403, "the blob route takes r");
    let (status, bytes) = caller.get_bytes(&format!("/api/jobs/{job}/stdout"));
    assert_eq!(status, 200);
    assert!(bytes == expected, "the whole stdout, {} bytes", bytes.len());
    assert_eq!(caller.get_bytes(&format!("/api/jobs/{job}/stderr")), (200, Vec::new()));
    assert_eq!(other.get_bytes(&format!("/api/jobs/{job}/stdout")).0, 404);
    // HEAD asks what GET asks, and needs what GET needs.
    let head = |path: &str, token: &str| {
        let resp = api.http.head(format!("{}{path}", api.url)).bearer_auth(token).send().unwrap();
        (resp.status().as_u16(), resp.headers().get("content-length").map(|v| v.to_str().unwrap().to_string()))
    };
    let caller_token = caller.token.clone().unwrap();
    assert_eq!(head(&format!("/api/jobs/{job}/stdout"), &caller_token), (200, Some("1048576".into())));
    assert_eq!(head(&format!("/api/jobs/{job}/stdout"), other.token.as_deref().unwrap()).0, 404);
    assert_eq!(head("/healthz", "").0, 200);

    // A short output that is not text is kept as its bytes, in a blob, not made text.
    api.register("bytes", "sh", "printf '\\377\\376\\000\\001ok\\n'", None);
    let (status, r) = api.invoke("bytes", json!({}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdoutBlob"]["sizeBytes"], 7, "{r}");
    let (status, bytes) = api.get_bytes(&format!("/api/jobs/{}/stdout", r["jobId"].as_str().unwrap()));
    assert_eq!((status, bytes), (200, b"\xff\xfe\x00\x01ok\n".to_vec()));
    // An output whose blob is gone is a fault of the master's, said as such. (Over S3 the
    // master keeps the small blobs it verified in memory, so one gone from the bucket is not
    // gone from it.)
    if std::env::var("AGENTOS_TEST_STORAGE").as_deref() != Ok("shared") {
        let urn = r["stdoutBlob"]["urn"].as_str().unwrap();
        let (namespace, sha) = urn.trim_start_matches("urn:agentos:blob:").rsplit_once('/').unwrap();
        std::fs::remove_file(m.blob_file(namespace, sha)).unwrap();
        let (status, v) = api.get(&format!("/api/jobs/{}/stdout", r["jobId"].as_str().unwrap()));
        assert_eq!((status, v["error"]["code"].as_str()), (500, Some("output_lost")), "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("that output is lost"), "{v}");
    }

    // Called as an operation (a shell command, an MCP client), the output is the whole of it,
    // read back from the blob, never the preview.
    api.register("rows", "python3", "import json\nprint(json.dumps({'rows': ['x' * 100] * 2000}))", None);
    let (status, v) = api.post("/api/tools/rows/call", json!({"tool": "run", "args": []}));
    assert_eq!(status, 200, "{}", v.to_string().chars().take(300).collect::<String>());
    assert_eq!(v["result"]["rows"].as_array().map(Vec::len), Some(2000));
    let (status, v) = api.post("/api/tools/loud/call", json!({"tool": "run", "args": []}));
    assert_eq!(status, 200);
    assert_eq!(v["result"].as_str().map(str::len), Some(1048576));
    // Bytes that are not text are not passed off as text: the error says where they are.
    api.register("binary", "python3", "import sys\nsys.stdout.buffer.write(bytes(range(256)) * 1024)", None);
    let (status, v) = api.post("/api/tools/binary/call", json!({"tool": "run", "args": []}));
    assert_eq!(status, 422, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("262144 bytes that are not text") && msg.contains("urn:agentos:blob:"), "{msg}");
}

#[test]
fn scripts_see_neither_the_executors_environment_nor_its_credential() {
    let (_d, m, e) = setup_with(&[], &[("CANARY_SECRET", "canary-1234")]);
    let api = m.client();
    api.register("env-dump", "sh", "env; cat /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n'", None);
    let resp = api.invoke("env-dump", json!({"env": {"MINE": "yes"}}));
    let r = ok_result(&resp);
    let out = r["stdout"].as_str().unwrap();
    assert!(out.contains("MINE=yes"), "{out}");
    assert!(!out.contains("canary-1234"), "the executor's environment leaked: {out}");
    assert!(!out.contains("aos_"), "a credential leaked: {out}");
    let names: std::collections::BTreeSet<&str> =
        out.lines().filter_map(|l| l.split_once('=')).map(|(k, _)| k).collect();
    assert!(names.iter().all(|k| ["HOME", "LANG", "MINE", "PATH", "PWD"].contains(k)), "{names:?}");
    // An executor run as root runs scripts as nobody.
    api.register("whoami", "sh", "id -u", None);
    let resp = api.invoke("whoami", json!({}));
    let expected = if unsafe { libc::geteuid() } == 0 {
        "65534\n".to_string()
    } else {
        format!("{}\n", unsafe { libc::geteuid() })
    };
    assert_eq!(ok_result(&resp)["stdout"], expected);
    drop(e);
}

#[test]
fn an_executor_credential_is_good_for_the_executor_protocol_only() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let (_, t) = api.post_raw("/api/executor-tokens", br#"{"name":"x1"}"#.to_vec());
    let exec = api.with_token(t["token"].as_str());
    api.register("s", "sh", "echo", None);
    let sha = sha256_hex(b"echo");
    for path in [
        "/api/tool-catalog",
        "/api/tool-catalog/s",
        "/api/tool-catalog/s/history",
        "/api/models",
        "/api/executors",
        &format!("/api/blobs/urn:agentos:blob:tool-catalog/scripts/{sha}.sh"),
    ] {
        assert_eq!(common::error_code(&exec.get(path), 403), "forbidden", "{path}");
    }
    assert_eq!(exec.register("x", "sh", "echo", None).0, 403);
    assert_eq!(exec.invoke("s", json!({})).0, 403);
    assert_eq!(exec.post_raw("/api/executor-tokens", br#"{"name":"x2"}"#.to_vec()).0, 403);
    // The protocol itself answers it, and nobody else.
    assert_eq!(exec.post_raw("/api/executor/poll", br#"{"waitMs":1}"#.to_vec()).0, 204);
    assert_eq!(api.post_raw("/api/executor/poll", br#"{"waitMs":1}"#.to_vec()).0, 403);
}

#[test]
fn an_executor_stopped_with_sigterm_finishes_its_job() {
    let (_d, m, mut e) = setup();
    let api = m.client();
    api.register("slowish", "sh", "sleep 1; echo done", None);
    let caller = {
        let api = api.clone();
        std::thread::spawn(move || api.invoke("slowish", json!({})))
    };
    wait_for("the job to start", || api.get("/api/executors").1[0]["state"] == "busy");
    let status = e.terminate();
    assert!(status.success(), "{status}");
    let (status, r) = caller.join().unwrap();
    assert_eq!(status, 200);
    assert_eq!(r["stdout"], "done\n", "{r}");
}

#[test]
fn an_executor_stopped_while_it_polls_runs_the_job_it_got_and_takes_no_more() {
    let (d, m, mut e) = setup();
    let api = m.client();
    let shared = shared_folder(d.path());
    let ran = shared.join("ran");
    api.register("slowish", "sh", &format!("echo x >> {}; sleep 1; echo done", ran.display()), None);
    // Stopped while its poll waits; work queued right after reaches that poll, whose answer the
    // stopping executor still takes (else the job would wait out its lease).
    unsafe {
        libc::kill(e.child.id() as i32, libc::SIGTERM);
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    let callers: Vec<_> = (0..3)
        .map(|_| {
            let api = api.clone();
            std::thread::spawn(move || api.invoke("slowish", json!({"timeoutMs": 60000})))
        })
        .collect();
    let status = e.child.wait().unwrap();
    assert!(status.success(), "{status}");
    // It ran the job its last poll brought (none, if the poll ran out first) and took no other
    // from the full queue.
    let ran_here = std::fs::read_to_string(&ran).map(|s| s.lines().count()).unwrap_or(0);
    assert!(ran_here <= 1, "the stopping executor ran {ran_here} jobs");
    let _e2 = Executor::start(&m, &d.path().join("executor-2"), "e2", &[]);
    for c in callers {
        let (status, r) = c.join().unwrap();
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["stdout"], "done\n", "{r}");
    }
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 3);
}

#[test]
fn executors_are_listed_with_their_state() {
    let (d, m, mut e) = setup_with(&[], &[]);
    let mut e2 = Executor::start(&m, &d.path().join("executor-2"), "e2", &[]);
    let states = || -> Vec<String> {
        let (_, list) = m.client().get("/api/executors");
        list.as_array().unwrap().iter().map(|e| format!("{}:{}", e["name"], e["state"]).replace('"', "")).collect()
    };
    wait_for("both to poll", || states() == ["e1:polling", "e2:polling"]);
    // One stopped in good order said so before it exited: stopped (at once on a master alone;
    // once its poll's end is written, about a second, on a shared queue), and it stays so.
    assert!(e2.terminate().success());
    wait_for("e2 to be listed stopped", || states() == ["e1:polling", "e2:stopped"]);
    e.kill9();
    // Without a poll outstanding the executor is no longer polling, and once it has not been
    // heard from for 5 s it is silent (it was listed idle until gone, 90 s later).
    wait_for("e1 to stop polling", || m.client().get("/api/executors").1[0]["state"] != "polling");
    let killed = std::time::Instant::now();
    wait_for("e1 to be listed silent", || m.client().get("/api/executors").1[0]["state"] == "silent");
    assert!(killed.elapsed() > std::time::Duration::from_secs(4), "silent too soon");
    assert_eq!(states(), ["e1:silent", "e2:stopped"]);
    // Started again, it is heard from: polling.
    let _e2 = Executor::start(&m, &d.path().join("executor-2"), "e2", &[]);
    wait_for("e2 to poll again", || states() == ["e1:silent", "e2:polling"]);
}

#[test]
fn an_invocation_nobody_serves_is_answered_no_executor_and_one_that_arrives_in_time_runs() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--no-executor-grace-ms", "300"]);
    let api = m.client();
    api.register("fine", "sh", "echo fine", None);
    // No executor at all: answered after the short grace, not after timeoutMs + 30 s.
    let (status, r) = api.invoke("fine", json!({"timeoutMs": 60000}));
    assert_eq!(status, 504, "{r}");
    assert_eq!(r["error"]["code"], "no_executor", "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("agentos executor"), "{r}");

    // The only executor stopped in good order: it serves no more, and a call is told so after
    // the same grace, not after the 90 s in which a silent one might still come back.
    let mut e = Executor::start(&m, &dir.path().join("executor-0"), "e1", &[]);
    assert_eq!(ok_result(&api.invoke("fine", json!({"timeoutMs": 60000})))["stdout"], "fine\n");
    assert!(e.terminate().success());
    wait_for("e1 to be listed stopped", || api.get("/api/executors").1[0]["state"] == "stopped");
    let (status, r) = api.invoke("fine", json!({"timeoutMs": 60000}));
    assert_eq!((status, r["error"]["code"].as_str()), (504, Some("no_executor")), "{r}");

    // An executor that comes while a call waits (within the default grace) picks the job up.
    let m = Master::start(&dir.path().join("master-2"));
    let api = m.client();
    api.register("fine", "sh", "echo fine", None);
    let call = {
        let api = api.clone();
        std::thread::spawn(move || api.invoke("fine", json!({"timeoutMs": 60000})))
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let resp = call.join().unwrap();
    assert_eq!(ok_result(&resp)["stdout"], "fine\n");
}

/// The pids of live processes (zombies count as gone) whose command line is exactly `argv`.
fn processes(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        })
        .collect()
}

/// Registers and invokes (from a thread that is never joined: its answer does not matter) a
/// script that starts `sleep SECONDS` twice, once detached with `setsid`, and waits until both
/// run. A marker file makes a second run (after the lease expires) exit at once.
/// `dir/shared`: a folder a script may write to whichever user it runs as.
fn shared_folder(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    shared
}

fn start_sleepers(dir: &std::path::Path, m: &Master, seconds: &str) {
    let shared = shared_folder(dir);
    let marker = shared.join("ran");
    let script =
        format!("[ -e {m} ] && exit 0; touch {m}; setsid sleep {seconds} & sleep {seconds}\n", m = marker.display());
    let api = m.client();
    assert_eq!(api.register("sleepers", "sh", &script, None).0, 200);
    std::thread::spawn(move || api.invoke("sleepers", json!({"timeoutMs": 3000})));
    wait_for("both sleepers to run", || processes(&["sleep", seconds]).len() == 2);
}

#[test]
fn a_script_and_its_setsid_child_die_with_an_executor_killed_9() {
    // Issue 11: `sleep 313` ran on long past its 3 s timeout once its executor was killed -9.
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let mut e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    start_sleepers(dir.path(), &m, "313");
    e.kill9();
    wait_for("no sleep 313 to be left", || processes(&["sleep", "313"]).is_empty());
}

#[test]
fn an_executor_starting_on_a_workspace_kills_what_its_dead_predecessor_left() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let workspace = dir.path().join("executor");
    let mut e = Executor::start(&m, &workspace, "e1", &[]);
    start_sleepers(dir.path(), &m, "317");
    // The guard goes first, as when the whole process group is killed at once.
    let executor = e.child.id().to_string();
    let guard = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|d| d.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let parent = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit_once(") ").and_then(|(_, rest)| rest.split_whitespace().nth(1)) == Some(executor.as_str())
            });
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            parent && cmdline.split(|b| *b == 0).any(|arg| arg == b"agentos-guard")
        })
        .expect("the executor's guard process");
    // SAFETY: kill only sends a signal, to the guard found above.
    unsafe { libc::kill(guard, libc::SIGKILL) };
    e.kill9();
    // With the executor and its guard dead, only a starting executor's sweep kills the
    // sleepers (this one, or one another test starts meanwhile: every executor sweeps the
    // cgroups of all dead ones).
    let _e = Executor::start(&m, &workspace, "e2", &[]);
    wait_for("no sleep 317 to be left", || processes(&["sleep", "317"]).is_empty());
}

#[test]
fn a_script_with_a_detached_child_keeps_its_output_and_says_when_the_pipe_stayed_open() {
    let (_dir, m, _e) = setup();
    let api = m.client();
    // `echo hello; (setsid sleep 30 &); echo bye`, waiting until the child has left the group
    // (a child killed with the group before its setsid holds nothing), and sleeping only long
    // enough to outlast the 2 s the executor drains for.
    let script = "echo hello; (setsid sh -c 'echo $$ > started; exec sleep 5' &); until [ -s started ]; do sleep 0.01; done; echo bye";
    assert_eq!(api.register("detach", "sh", script, Some("default")).0, 200);
    let resp = api.invoke("detach", json!({"timeoutMs": 20000}));
    let r = ok_result(&resp);
    // The whole output used to be dropped.
    assert_eq!((r["stdout"].as_str(), r["exitCode"].as_i64()), (Some("hello\nbye\n"), Some(0)), "{r}");
    let stderr = r["stderr"].as_str().unwrap_or_default();
    let note = "a process it started still held stdout or stderr open; the output read until then is kept";
    // Where the executor runs jobs in cgroups (v2, writable) the detached sleep dies with its
    // job and the pipe closes at once; elsewhere it outlives the script and holds the pipe.
    // (The runner's own tests hold both cases on every machine.)
    if cgroup_v2_writable() {
        assert!(!stderr.contains(note), "{r}");
    } else {
        assert!(stderr.ends_with(&format!("{note}\n")), "{r}");
    }
}

/// Whether an executor started now runs its jobs in cgroups, by its own rule: a cgroup v2
/// mount holding this process's cgroup, which this process may write.
fn cgroup_v2_writable() -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Some((root, mount)) = mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next() == Some("cgroup2")).then_some(())?;
        let mut f = left.split_whitespace().skip(3);
        Some((f.next()?.to_string(), f.next()?.to_string()))
    }) else {
        return false;
    };
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) else { return false };
    let path = path.strip_prefix(root.trim_end_matches('/')).unwrap_or(path);
    let dir = std::path::Path::new(&mount).join(path.trim_start_matches('/'));
    let dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: access only reads the path it is given.
    unsafe { libc::access(dir.as_ptr(), libc::W_OK) == 0 }
}

#[test]
fn finished_jobs_are_listed_newest_first_to_whom_may_see_them_and_outlive_a_restart() {
    let (dir, m, _e) = setup();
    let api = m.client();
    assert_eq!(api.register("hi", "sh", "echo hi; echo oops >&2", None).0, 200);
    let alice = api.agent("alice", "--x------s");
    let bob = api.agent("bob", "r---l-----");
    ok_result(&api.invoke("hi", json!({})));
    ok_result(&api.invoke("hi", json!({})));
    ok_result(&alice.invoke("hi", json!({})));

    let (status, all) = api.get("/api/jobs");
    assert_eq!(status, 200, "{all}");
    let all = all.as_array().unwrap().clone();
    assert_eq!(all.len(), 3, "{all:?}");
    let seqs: Vec<u64> = all.iter().map(|j| j["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] > w[1]), "newest first: {seqs:?}");
    assert_eq!((all[0]["toolId"].as_str(), all[0]["exitCode"].as_i64()), (Some("hi"), Some(0)));
    assert_eq!((all[0]["stdout"].as_str(), all[0]["stderr"].as_str()), (Some("hi\n"), Some("oops\n")));
    assert_eq!((all[0]["executor"].as_str(), all[0]["attempt"].as_u64()), (Some("e1"), Some(1)));
    // An agent sees the jobs it invoked; one with `l` sees those of models it may use, not others'.
    let (_, mine) = alice.get("/api/jobs");
    assert_eq!(mine.as_array().unwrap().len(), 1, "{mine}");
    assert_eq!(mine[0]["model"], "alice");
    assert_eq!(bob.get("/api/jobs").1, json!([]));
    assert_eq!(api.get("/api/jobs?limit=1").1.as_array().unwrap().len(), 1);
    for bad in ["0", "501", "x"] {
        assert_eq!(api.get(&format!("/api/jobs?limit={bad}")).0, 400, "limit={bad}");
    }

    // Events by type and model, and who a token is.
    let (_, finished) = api.get("/api/events?type=JobFinished");
    assert_eq!(finished.as_array().unwrap().len(), 3, "{finished}");
    let (_, in_alice) = api.get("/api/events?type=JobFinished&model=alice");
    assert_eq!(in_alice.as_array().unwrap().len(), 1, "{in_alice}");
    assert_eq!(
        alice.get("/api/me").1,
        json!({"name": "alice", "kind": "agent", "flags": "--x------s-", "model": "alice"})
    );
    let (status, help) = alice.get("/api/tool-catalog/hi/help");
    assert_eq!(status, 200, "{help}");
    assert_eq!(help["command"], "agentos-hi");
    assert!(help["operations"]["run"].as_str().unwrap().contains("Usage: agentos-hi run"), "{help}");
    assert_eq!(bob.get("/api/tool-catalog/hi/help").0, 403, "bob holds no flag that reveals tools");

    // The list is read back from the log at start.
    let m = m.restart();
    let (_, again) = m.client().get("/api/jobs");
    assert_eq!(again.as_array().unwrap().len(), 3, "{again}");
    drop(dir);
}

/// The answer that hands an executor its next job (here with the previous job's result) is
/// lost on the way, with its connection or replaced by a proxy's 502: the master recorded the
/// result and leased the next job to the executor, which never heard of it. Its next poll says
/// so, and the job runs at once rather than when its lease (a minute here) would have run out.
#[test]
fn a_job_handed_out_in_an_answer_that_never_arrived_runs_at_once_not_when_its_lease_runs_out() {
    for lose in [common::Lose::Connection, common::Lose::BadGateway] {
        let dir = tempfile::tempdir().unwrap();
        let m = Master::start_with(&dir.path().join("master"), &["--lease-ms", "60000"]);
        let api = m.client();
        let proxy = common::proxy_losing_one_answer(&m.url, "result?next=true", lose);
        let _e =
            Executor::start_args(&m, &dir.path().join("e"), "e1", &[], &["--master", &proxy, "--concurrency", "1"]);
        api.register("first", "sh", "sleep 1; echo first", None);
        api.register("second", "sh", "echo second", None);
        let call = |tool: &'static str| {
            let api = api.clone();
            std::thread::spawn(move || (std::time::Instant::now(), api.invoke(tool, json!({"timeoutMs": 20000}))))
        };
        let first = call("first");
        wait_for("the executor to take the first job", || api.get("/api/executors").1[0]["state"] == "busy");
        // Queued behind the first: handed out with the first's result, in the answer that is lost.
        let second = call("second");
        let (_, r) = first.join().unwrap();
        assert_eq!(ok_result(&r)["stdout"], "first\n", "{lose:?}: {r:?}");
        let (asked, r) = second.join().unwrap();
        let took = asked.elapsed();
        let ran = (ok_result(&r)["stdout"].as_str(), r.1["attempt"].as_u64());
        assert_eq!(ran, (Some("second\n"), Some(2)), "{lose:?}: {r:?}");
        assert!(
            took < std::time::Duration::from_secs(15),
            "{lose:?}: the second job waited {took:?}, its lease's time"
        );
        let (status, job) = api.get(&format!("/api/jobs/{}", r.1["jobId"].as_str().unwrap()));
        assert_eq!((status, job["results"].as_array().map(Vec::len)), (200, Some(1)), "{lose:?}: {job}");
    }
}

/// The same for a poll's answer: the job it carried runs at once, on the executor's next poll,
/// whether the answer was lost with its connection or replaced by a proxy's 502.
#[test]
fn a_job_handed_out_in_a_poll_answer_that_never_arrived_runs_at_once() {
    for lose in [common::Lose::Connection, common::Lose::BadGateway] {
        let dir = tempfile::tempdir().unwrap();
        let m = Master::start_with(&dir.path().join("master"), &["--lease-ms", "60000"]);
        let api = m.client();
        let proxy = common::proxy_losing_one_answer(&m.url, "/api/executor/poll", lose);
        let _e =
            Executor::start_args(&m, &dir.path().join("e"), "e1", &[], &["--master", &proxy, "--concurrency", "1"]);
        api.register("only", "sh", "echo only", None);
        let asked = std::time::Instant::now();
        let r = api.invoke("only", json!({"timeoutMs": 20000}));
        let took = asked.elapsed();
        let ran = (ok_result(&r)["stdout"].as_str(), r.1["attempt"].as_u64());
        assert_eq!(ran, (Some("only\n"), Some(2)), "{lose:?}: {r:?}");
        assert!(took < std::time::Duration::from_secs(15), "{lose:?}: the job waited {took:?}, its lease's time");
    }
}

/// A result the master refuses as malformed (here an exit status of -1, spoiled on the way) is
/// not posted again until its lease runs out and the job runs again: the executor posts in its
/// place a result saying the master refused it, and the caller hears that at once.
#[test]
fn a_result_the_master_refuses_as_malformed_ends_the_job_saying_so_not_a_second_run() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--lease-ms", "60000"]);
    let api = m.client();
    let proxy = common::proxy_losing_one_answer(&m.url, "/result", common::Lose::SpoiledRequest);
    let _e = Executor::start_args(&m, &dir.path().join("e"), "e1", &[], &["--master", &proxy, "--concurrency", "1"]);
    api.register("once", "sh", "echo once", None);
    let asked = std::time::Instant::now();
    let r = api.invoke("once", json!({"timeoutMs": 20000}));
    let took = asked.elapsed();
    assert_eq!(r.0, 200, "{r:?}");
    let error = r.1["error"].as_str().unwrap_or_default();
    assert!(error.contains("the master refused its result") && error.contains("exitCode -1"), "{r:?}");
    assert_eq!((r.1["attempt"].as_u64(), r.1["exitCode"].as_i64()), (Some(1), None), "{r:?}");
    // A second run would have waited for the first's lease (a minute), and been attempt 2.
    assert!(took < std::time::Duration::from_secs(15), "the job waited {took:?}, its lease's time");
}

/// A goodbye names the stopping process: a lease it still holds (a job it could not hand back)
/// ends at once and the job goes out again; another process's lease is left alone. A goodbye
/// that cannot be read is refused with why.
#[test]
fn a_goodbye_ends_the_leases_its_process_still_holds_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    let (status, body) = api.post_raw("/api/executor-tokens", json!({"name": "e1"}).to_string().into_bytes());
    assert_eq!(status, 200, "{body}");
    let exec = api.with_token(body["token"].as_str());
    api.register("s", "sh", "echo", None);
    let call = {
        let api = api.clone();
        std::thread::spawn(move || api.invoke("s", json!({"timeoutMs": 30000})))
    };
    let poll = |instance: &str, wait: u64| {
        exec.post_raw("/api/executor/poll", json!({"waitMs": wait, "instance": instance}).to_string().into_bytes())
    };
    let (status, first) = poll("00000000000000aa", 10_000);
    assert_eq!((status, first["attempt"].as_u64()), (200, Some(1)), "{first}");
    for (body, why) in [
        (json!({"instance": "not-hex"}), "16 lower-case hex characters"),
        (json!({"instance": "00000000000000aa", "jobs": []}), "jobs"),
    ] {
        let resp = exec.post_raw("/api/executor/stopped", body.to_string().into_bytes());
        assert_eq!(resp.0, 400, "{body}: {resp:?}");
        assert!(resp.1["error"]["message"].as_str().unwrap().contains(why), "{body}: {resp:?}");
    }
    // Another process of the same executor says goodbye: the job stays with the first.
    let stopped =
        |instance: &str| exec.post_raw("/api/executor/stopped", json!({"instance": instance}).to_string().into_bytes());
    assert_eq!(stopped("00000000000000bb"), (200, json!({"stopped": true})));
    assert_eq!(poll("00000000000000cc", 300).0, 204, "the job is still held");
    // The holder says goodbye: its lease ends, and the job goes out again at once.
    assert_eq!(stopped("00000000000000aa").0, 200);
    let (status, again) = poll("00000000000000cc", 10_000);
    assert_eq!((status, &again["jobId"], again["attempt"].as_u64()), (200, &first["jobId"], Some(2)), "{again}");
    let result = json!({"leaseId": again["leaseId"], "exitCode": 0, "stdoutBase64": "aGkK", "stderrBase64": "", "durationMs": 1});
    let path = format!("/api/executor/jobs/{}/result", again["jobId"].as_str().unwrap());
    assert_eq!(exec.post_raw(&path, result.to_string().into_bytes()).0, 200);
    let answer = call.join().unwrap();
    assert_eq!(ok_result(&answer)["stdout"], "hi\n");
}

/// Two processes under one name (one credential: a restart beside a live process, or replicas
/// given the same credential) on workspaces of their own, so neither can name the other dead.
/// The goodbye of one ends only its own leases: the sibling's job stays with the sibling while it
/// lives (run once, attempt 1). Once the sibling is killed -9, its job goes back to the queue no
/// later than its lease's deadline, goodbye or not, and runs once more elsewhere, after the
/// killed run's process is gone; the name, stopped, is then listed `stopped` with nothing held.
#[test]
fn a_goodbye_ends_only_its_own_leases_and_a_killed_siblings_job_comes_back_by_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let lease = std::time::Duration::from_millis(3000);
    let m = Master::start_with(&dir.path().join("master"), &["--lease-ms", "3000"]);
    let api = m.client();
    let ran = shared_folder(dir.path()).join("ran");
    // Each run notes its shell's pid, then outlasts the goodbye beside it.
    api.register("slow", "sh", &format!("echo $$ >> {}; sleep 4; echo done", ran.display()), None);
    api.register("quick", "sh", "echo quick", None);
    let runs = || std::fs::read_to_string(&ran).unwrap_or_default().lines().map(str::to_string).collect::<Vec<_>>();
    let job = |id: &str| api.get(&format!("/api/jobs/{id}")).1;
    let one = ["--concurrency", "1"];
    let e1 = Executor::credential(&m, "e1");
    let start = |ws: &str| Executor::spawn(&m, &dir.path().join(ws), &e1, &[], &one);
    // A second process of e1 beside one busy with the slow job, waited for until it serves: the
    // quick job can only be its.
    let sibling = |ws: &str| {
        let s = start(ws);
        let (status, r) = api.invoke("quick", json!({"timeoutMs": 20000}));
        assert_eq!((status, r["stdout"].as_str(), r["executor"].as_str()), (200, Some("quick\n"), Some("e1")), "{r}");
        s
    };
    let e1_state = || {
        let (_, list) = api.get("/api/executors");
        let e1 = list.as_array().unwrap().iter().find(|e| e["name"] == "e1").cloned().unwrap();
        (e1["state"].as_str().unwrap().to_string(), e1["jobs"].as_array().unwrap().len())
    };

    // The goodbye of a process holding nothing, beside a live one holding a job.
    let mut a = start("a");
    let first = api.invoke_async("slow", json!({"timeoutMs": 20000}));
    wait_for("a to run the first job", || runs().len() == 1);
    let mut b = sibling("b");
    assert!(b.terminate().success());
    assert_eq!(e1_state(), ("busy".to_string(), 1), "a still holds its job");
    // Would the goodbye have ended a's lease, this one would take the job at once.
    let mut c = Executor::start_args(&m, &dir.path().join("c"), "e2", &[], &one);
    wait_for("the first job to finish", || job(&first)["state"] == "finished");
    let v = job(&first);
    assert_eq!(v["results"].as_array().unwrap().len(), 1, "{v}");
    let r = &v["results"][0];
    assert_eq!(
        (r["executor"].as_str(), r["attempt"].as_u64(), r["stdout"].as_str()),
        (Some("e1"), Some(1), Some("done\n")),
        "{v}"
    );
    assert_eq!(runs().len(), 1, "the first job ran twice");
    assert!(c.terminate().success());

    // A process killed -9 holding a job, and its sibling's goodbye after.
    let second = api.invoke_async("slow", json!({"timeoutMs": 20000}));
    wait_for("a to run the second job", || runs().len() == 2);
    let mut b = sibling("b2");
    // Polling before the kill, so that what is measured is when the job comes back.
    let _d = Executor::start_args(&m, &dir.path().join("d"), "e2", &[], &one);
    let killed_run = runs()[1].clone();
    a.kill9();
    let killed = std::time::Instant::now();
    wait_for("the killed run's shell to be gone", || {
        std::fs::read_to_string(format!("/proc/{killed_run}/stat"))
            .map_or(true, |s| s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
    });
    assert_eq!(runs().len(), 2, "the job ran again while its runner lived");
    assert!(b.terminate().success());
    wait_for("the second job to run again", || runs().len() == 3);
    let back = killed.elapsed();
    wait_for("the second job to finish", || job(&second)["state"] == "finished");
    let v = job(&second);
    assert_eq!(v["results"].as_array().unwrap().len(), 1, "{v}");
    let r = &v["results"][0];
    assert_eq!(
        (r["executor"].as_str(), r["attempt"].as_u64(), r["stdout"].as_str()),
        (Some("e2"), Some(2), Some("done\n")),
        "{v}"
    );
    assert_eq!(runs().len(), 3, "{v}");
    // By the lease's deadline (its last heartbeat came before the kill), plus a reaper's round
    // (a quarter of the lease) and a hand-out: well before a second lease (6 s) or the 90 s
    // after which a name is gone.
    println!(
        "the killed process's job ran again {} ms after the kill (lease {} ms)",
        back.as_millis(),
        lease.as_millis()
    );
    // A wide bound, for a busy machine: what it tells apart is the lease's end from the 90 s a
    // killed name takes to be counted gone, the wrong mechanism.
    assert!(back < std::time::Duration::from_secs(30), "the job came back {back:?} after the kill");
    assert_eq!(e1_state(), ("stopped".to_string(), 0));
}

/// A caller waiting on its job is told when no executor serves the queue any more, not held to
/// its timeout: here the process running the job is killed -9 and its sibling under the same
/// name says goodbye, so once the job's lease ends nothing will run it.
#[test]
fn a_waiting_caller_is_told_when_every_executor_went_away_mid_wait() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--lease-ms", "3000", "--no-executor-grace-ms", "1000"]);
    let api = m.client();
    let ran = shared_folder(dir.path()).join("ran");
    api.register("slow", "sh", &format!("echo $$ >> {}; sleep 60", ran.display()), None);
    api.register("quick", "sh", "echo quick", None);
    let one = ["--concurrency", "1"];
    let e1 = Executor::credential(&m, "e1");
    let mut a = Executor::spawn(&m, &dir.path().join("a"), &e1, &[], &one);
    let waiting = {
        let api = m.client();
        std::thread::spawn(move || api.invoke("slow", json!({"timeoutMs": 120000})))
    };
    wait_for("a to run the job", || std::fs::read_to_string(&ran).is_ok_and(|r| !r.is_empty()));
    let mut b = Executor::spawn(&m, &dir.path().join("b"), &e1, &[], &one);
    let (status, r) = api.invoke("quick", json!({"timeoutMs": 20000}));
    assert_eq!((status, r["stdout"].as_str()), (200, Some("quick\n")), "{r}");
    a.kill9();
    assert!(b.terminate().success());
    let told = std::time::Instant::now();
    let (status, v) = waiting.join().unwrap();
    // Without asking again, the caller waited its 120 s and the queue's grace, and heard of a
    // timeout.
    assert_eq!((status, v["error"]["code"].as_str()), (504, Some("no_executor")), "{v}");
    assert!(told.elapsed() < std::time::Duration::from_secs(60), "told after {:?}", told.elapsed());
}

/// A caller waiting on its job is told when the only executor was killed -9 running it: once
/// the job's lease has ended and the executor has been silent for 15 s, it no longer counts as
/// serving, rather than for the 90 s after which it is listed gone.
#[test]
fn a_waiting_caller_is_told_soon_after_its_only_executor_was_killed() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--lease-ms", "3000", "--no-executor-grace-ms", "1000"]);
    let api = m.client();
    let ran = shared_folder(dir.path()).join("ran");
    api.register("slow", "sh", &format!("echo $$ >> {}; sleep 60", ran.display()), None);
    let e1 = Executor::credential(&m, "e1");
    let mut a = Executor::spawn(&m, &dir.path().join("a"), &e1, &[], &["--concurrency", "1"]);
    let waiting = {
        let api = m.client();
        std::thread::spawn(move || api.invoke("slow", json!({"timeoutMs": 180000})))
    };
    wait_for("the executor to run the job", || std::fs::read_to_string(&ran).is_ok_and(|r| !r.is_empty()));
    a.kill9();
    let killed = std::time::Instant::now();
    let (status, v) = waiting.join().unwrap();
    let told = killed.elapsed();
    println!("the caller was told {} ms after the kill", told.as_millis());
    assert_eq!((status, v["error"]["code"].as_str()), (504, Some("no_executor")), "{v}");
    // 15 s of silence (the 3 s lease ends within them), the grace (1 s) and a recheck (up to
    // 5 s): 16–21 s. Counted serving until it was gone, the caller heard after 90 s at the
    // earliest (and the client gives up at 60 s). A wide bound, for a loaded machine.
    assert!(told < std::time::Duration::from_secs(45), "told {told:?} after the kill");
    let listed = m.client().get("/api/executors").1;
    assert_eq!(listed[0]["state"], "silent", "{listed}");
    // The job the caller is told of reads back, ended with the same words.
    let message = v["error"]["message"].as_str().unwrap();
    let job = message.split_whitespace().find(|w| w.starts_with("job-")).expect("a job named");
    let (status, j) = api.get(&format!("/api/jobs/{job}"));
    assert_eq!((status, j["state"].as_str()), (200, Some("finished")), "{j}");
    assert!(
        j["results"][0]["error"].as_str().unwrap().contains("every executor that served the queue has gone"),
        "{j}"
    );
}

/// The worker headers of the executor protocol: a bad value is refused before anything is
/// taken, with what to send instead.
#[test]
fn a_bad_worker_slot_or_reclaim_is_refused_with_what_to_send() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let (status, body) = m.client().post_raw("/api/executor-tokens", json!({"name": "e1"}).to_string().into_bytes());
    assert_eq!(status, 200, "{body}");
    let token = body["token"].as_str().unwrap().to_string();
    let post = |path: &str, headers: &[(&str, &str)], body: Value| {
        let mut req = common::http().post(format!("{}{path}", m.url)).bearer_auth(&token).json(&body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().unwrap();
        let status = resp.status().as_u16();
        (status, resp.json::<Value>().unwrap_or_default())
    };
    let instance = "00000000000000aa";
    let poll = json!({"waitMs": 50, "instance": instance});
    for headers in [
        &[("x-agentos-executor-slot", "-1")][..],
        &[("x-agentos-executor-slot", "65536")],
        &[("x-agentos-executor-slot", "+1")],
        &[("x-agentos-executor-slot", "")],
        &[("x-agentos-executor-slot", "1"), ("x-agentos-executor-reclaim", "yes")],
    ] {
        let resp = post("/api/executor/poll", headers, poll.clone());
        assert_eq!(common::error_code(&resp, 400), "invalid_slot", "{headers:?}: {resp:?}");
    }
    // Reclaiming names the worker: without an instance or a slot there is none.
    let resp = post("/api/executor/poll", &[("x-agentos-executor-reclaim", "true")], poll.clone());
    assert_eq!(common::error_code(&resp, 400), "invalid_slot", "{resp:?}");
    let resp = post(
        "/api/executor/poll",
        &[("x-agentos-executor-slot", "1"), ("x-agentos-executor-reclaim", "true")],
        json!({"waitMs": 50}),
    );
    assert_eq!(common::error_code(&resp, 400), "invalid_slot", "{resp:?}");
    // A worker posting a result holds that job: a reclaim there is a mistake, refused before
    // the result is looked at.
    let result =
        json!({"leaseId": "x", "exitCode": 0, "signal": null, "stdoutBase64": "", "stderrBase64": "", "durationMs": 1});
    let resp = post("/api/executor/jobs/job-x/result", &[("x-agentos-executor-reclaim", "true")], result);
    assert_eq!(common::error_code(&resp, 400), "invalid_slot", "{resp:?}");
    // Good values are taken: no work, so 204.
    let ok =
        post("/api/executor/poll", &[("x-agentos-executor-slot", "3"), ("x-agentos-executor-reclaim", "true")], poll);
    assert_eq!(ok.0, 204, "{ok:?}");
    // The name in the header alone, as the other executor calls send it, is the poll's name;
    // two different names are one too many.
    let named = post("/api/executor/poll", &[("x-agentos-executor-name", "box-1")], json!({"waitMs": 50}));
    assert_eq!(named.0, 204, "{named:?}");
    let (_, list) = m.client().get("/api/executors");
    assert!(list.as_array().unwrap().iter().any(|e| e["name"] == "e1/box-1"), "{list}");
    let both =
        post("/api/executor/poll", &[("x-agentos-executor-name", "box-1")], json!({"waitMs": 50, "name": "box-2"}));
    assert_eq!(common::error_code(&both, 400), "invalid_name", "{both:?}");
}

/// What no job could carry is refused before a job is queued, 400 naming it: a NUL byte in an
/// argument or a variable's value (no process can be given one), and input nested deeper than
/// the job's envelopes let every reader read back. Input as deep as allowed runs whole.
#[test]
fn an_argument_or_value_with_a_nul_byte_or_input_nested_too_deep_is_refused_before_a_job_is_queued() {
    let (_d, m, _e) = setup();
    let api = m.client();
    assert_eq!(api.register("echo", "sh", "cat", None).0, 200);
    let nested = |depth: usize| (0..depth).fold(json!(1), |v, _| json!([v]));
    let (_, before) = api.get("/api/jobs");
    let cases = [
        (json!({"argv": ["fine", "a\u{0}b"]}), "invalid_argv", "argv[1]"),
        (json!({"env": {"GREETING": "hi\u{0}"}}), "invalid_env", "GREETING"),
        (json!({"input": nested(101)}), "too_deep", "101 levels"),
    ];
    for (body, code, named) in cases {
        for prefer in [None, Some("respond-async")] {
            let mut req =
                common::http().post(format!("{}/api/tools/echo/invoke", m.url)).bearer_auth(&m.token).json(&body);
            if let Some(p) = prefer {
                req = req.header("prefer", p);
            }
            let resp = req.send().unwrap();
            let r = (resp.status().as_u16(), resp.json::<Value>().unwrap());
            assert_eq!(common::error_code(&r, 400), code, "{prefer:?} {body}: {r:?}");
            assert!(r.1["error"]["message"].as_str().unwrap().contains(named), "{r:?}");
        }
    }
    assert_eq!(api.get("/api/jobs").1, before, "a refused invocation left a job behind");
    let deepest = nested(100);
    let r = api.invoke("echo", json!({"input": deepest}));
    let out: Value = serde_json::from_str(ok_result(&r)["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(out, deepest);
}

/// Regression: a poll that does not wait (a worker asking for a job ahead) was noted as polling
/// on the shared queue, which spared the note of a long poll that followed within a second: the
/// executor was then listed as not polling for as long as that long poll lasted (a shared-queue
/// run of `an_executor_stopped_while_it_polls_runs_the_job_it_got_and_takes_no_more` waited 20 s
/// for it). On both queues, an executor whose long poll follows a poll without a wait is listed
/// as polling.
#[test]
fn an_executor_long_polling_just_after_a_poll_without_a_wait_is_listed_as_polling() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let (status, body) = m.client().post_raw("/api/executor-tokens", json!({"name": "e1"}).to_string().into_bytes());
    assert_eq!(status, 200, "{body}");
    let token = body["token"].as_str().unwrap().to_string();
    let poll = |wait_ms: u64| {
        let resp = common::http()
            .post(format!("{}/api/executor/poll", m.url))
            .bearer_auth(&token)
            .json(&json!({"waitMs": wait_ms}))
            .send()
            .unwrap();
        resp.status().as_u16()
    };
    assert_eq!(poll(0), 204, "an empty queue answers a poll without a wait at once");
    std::thread::scope(|s| {
        let long = s.spawn(|| poll(3_000));
        let listed = |state: &str| {
            let (_, list) = m.client().get("/api/executors");
            list.as_array().is_some_and(|l| l.iter().any(|e| e["name"] == "e1" && e["state"] == state))
        };
        wait_for("the long poll to be open", || listed("polling") || long.is_finished());
        assert!(!long.is_finished(), "the executor was not listed as polling during its long poll");
        assert_eq!(long.join().unwrap(), 204);
    });
}

/// The output of `child`, which must exit by itself within 10 s (refusing what it was given):
/// one that does not is killed, and the test fails saying `otherwise`.
fn refused_at_start(mut child: std::process::Child, otherwise: &str) -> std::process::Output {
    let exited = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        child.try_wait().unwrap().is_some()
    });
    if !exited {
        child.kill().unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(exited, "{otherwise}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// A workspace every user may write (`/tmp`'s mode) or another user owns is refused at start,
/// saying why, and its mode is left as it was: a root executor used to make such a folder 0755,
/// which took `/tmp` from every other user of the machine.
#[test]
fn a_workspace_every_user_may_write_or_another_user_owns_is_refused_and_left_as_it_was() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let executor = |workspace: &std::path::Path| {
        let mut cmd = std::process::Command::new(common::BIN);
        // Nothing listens there: an executor that starts polls it until killed.
        cmd.args(["executor", "--master", "http://127.0.0.1:9", "--token", "t", "--workspace"])
            .arg(workspace)
            .env("AGENTOS_LOG", "error");
        cmd
    };
    let start = |workspace: &std::path::Path| {
        let child = executor(workspace).stderr(std::process::Stdio::piped()).spawn().unwrap();
        refused_at_start(child, &format!("the executor took {}", workspace.display()))
    };
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let out = start(&shared);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("(mode 1777) may be written by every user"), "{stderr}");
    assert!(stderr.contains("/shared/agentos-executor"), "{stderr}");
    assert_eq!(std::fs::metadata(&shared).unwrap().mode() & 0o7777, 0o1777);
    assert!(!shared.join("jobs").exists(), "nothing is made in a refused workspace");
    // A folder of its own inside it is taken.
    let own = shared.join("agentos-executor");
    let mut child = executor(&own).stderr(std::process::Stdio::null()).spawn().unwrap();
    wait_for("the executor to make its job folders", || own.join("jobs").is_dir());
    assert_eq!(child.try_wait().unwrap(), None, "the executor runs");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(std::fs::metadata(&shared).unwrap().mode() & 0o7777, 0o1777);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return; // Only root can give a folder to another user.
    }
    let foreign = dir.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
    let out = start(&foreign);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("belongs to uid 65534, not to this executor's uid 0"), "{stderr}");
    assert!(!foreign.join("jobs").exists());

    // A link another user planted where the workspace is to be, pointing at root's own folder.
    let victim = dir.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o700)).unwrap();
    let planted = shared.join("planted");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    let out = start(&planted);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is a link that uid 65534 owns"), "{stderr}");
    assert_eq!(std::fs::metadata(&victim).unwrap().mode() & 0o7777, 0o700, "the link's target was changed");
    assert!(!victim.join("jobs").exists());

    // A folder above it that others may write (no sticky bit): another user could swap the
    // workspace for a link between two starts.
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = start(&open.join("ws"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("(mode 777) may be written by other users"), "{stderr}");
    assert!(!open.join("ws").exists(), "nothing is made under a refused folder");

    // Folders it makes are 0755 whatever the umask: none opens the path to the next start.
    let nested = dir.path().join("new/a/b");
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"umask 000; exec "$@""#)
        .arg("sh")
        .arg(common::BIN)
        .args(["executor", "--master", "http://127.0.0.1:9", "--token", "t", "--workspace"])
        .arg(&nested)
        .env("AGENTOS_LOG", "error")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the executor to make its job folders", || nested.join("jobs").is_dir());
    child.kill().unwrap();
    child.wait().unwrap();
    for made in ["new", "new/a", "new/a/b"] {
        let mode = std::fs::metadata(dir.path().join(made)).unwrap().mode() & 0o777;
        assert_eq!(mode & 0o022, 0, "{made} is {mode:o}");
    }

    // `agentos up` refuses such a workspace before its master starts, rather than serving without
    // its executor.
    let data = dir.path().join("up");
    let work = dir.path().join("up.work");
    std::fs::create_dir(&work).unwrap();
    std::os::unix::fs::chown(&work, Some(65534), Some(65534)).unwrap();
    let port = common::free_port().to_string();
    let child = std::process::Command::new(common::BIN)
        .arg("up")
        .arg("--data")
        .arg(&data)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("AGENTOS_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = refused_at_start(child, "agentos up served with a workspace it cannot use");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the local executor's workspace") && stderr.contains("belongs to uid 65534"), "{stderr}");
}
