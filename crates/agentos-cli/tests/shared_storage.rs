//! Several masters on one PostgreSQL database and one S3 bucket (real servers, started by
//! `scripts/pg-env` and `scripts/s3-env`): one catalog, each master's answers carrying the
//! last event it folded, `Agentos-Min-Seq` to read one's own writes anywhere, registrations
//! through both at once with no event lost or numbered twice, a master killed -9 losing no
//! acknowledged write, and a database outage answered 503 and outlived; one job queue any
//! master hands out from, executors moving to the survivor when a master dies, and two
//! masters with three executors under load losing nothing when one is killed -9.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Executor, Master, S3_ENV, SharedStorage};
use serde_json::{Value, json};

struct Shared {
    storage: SharedStorage,
    key: PathBuf,
}

impl Shared {
    fn new(dir: &Path) -> Shared {
        let key = dir.join("secrets.key");
        std::fs::write(&key, [7u8; 32]).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        Shared { storage: SharedStorage::fresh(), key }
    }

    /// A master on the shared log and bucket; a second one is given the first one's operator
    /// token file, as an operator would copy it.
    fn master(&self, data: &Path, token_from: Option<&Master>) -> Master {
        self.master_with(data, token_from, &[])
    }

    fn master_with(&self, data: &Path, token_from: Option<&Master>, extra: &[&str]) -> Master {
        if let Some(first) = token_from {
            std::fs::create_dir_all(data).unwrap();
            std::fs::copy(first.data.join("operator.token"), data.join("operator.token")).unwrap();
        }
        let key = self.key.to_str().unwrap();
        let mut args =
            vec!["--database", &self.storage.database, "--blobs", &self.storage.blobs, "--secrets-key-file", key];
        args.extend_from_slice(extra);
        Master::start_full(data, "127.0.0.1:0", &args, &S3_ENV)
    }
}

/// A request's status, answer and `Agentos-Seq`.
fn send(m: &Master, method: &str, path: &str, body: Option<Value>, min_seq: Option<u64>) -> (u16, Value, u64) {
    let mut req = common::http()
        .request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), format!("{}{path}", m.url))
        .bearer_auth(&m.token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    if let Some(n) = min_seq {
        req = req.header("Agentos-Min-Seq", n.to_string());
    }
    let resp = req.send().expect("request");
    let status = resp.status().as_u16();
    let seq = resp.headers()["agentos-seq"].to_str().unwrap().parse().unwrap();
    let text = resp.text().unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)), seq)
}

fn register(m: &Master, id: &str, content: &str) -> (u16, Value, u64) {
    let body =
        json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": id, "name": id, "runtime": "sh", "content": content});
    send(m, "POST", "/api/commands", Some(body), None)
}

fn psql(database: &str, sql: &str) -> String {
    let out = Command::new("psql").args([database, "-qXAtc", sql]).output().expect("psql");
    assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A master joining a shared log makes no operator token of its own (the first master's is the
/// installation's): its greeting says where to copy that one, instead of naming a file that is
/// not there.
#[test]
fn a_master_joining_a_shared_log_without_the_token_says_where_to_copy_it() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let _first = shared.master(&dir.path().join("a"), None);
    let data = dir.path().join("b");
    let mut cmd = Command::new(common::BIN);
    cmd.envs(S3_ENV);
    let mut child = cmd
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .args(["--database", &shared.storage.database, "--blobs", &shared.storage.blobs, "--secrets-key-file"])
        .arg(&shared.key)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines: Vec<String> = BufReader::new(child.stdout.take().unwrap()).lines().take(2).map(|l| l.unwrap()).collect();
    let _ = child.kill();
    let _ = child.wait();
    assert!(lines[0].starts_with("agentos master listening on http://127.0.0.1:"), "{lines:?}");
    assert_eq!(
        lines[1],
        format!(
            "operator token: none in this data folder; copy operator.token from the master that made the shared log to {}",
            data.join("operator.token").display()
        )
    );
    assert!(!data.join("operator.token").exists());
}

#[test]
fn two_masters_share_one_catalog_and_a_client_reads_its_own_writes_through_either() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let a = shared.master(&dir.path().join("a"), None);
    let b = shared.master(&dir.path().join("b"), Some(&a));

    let (status, v, seq) = register(&a, "hello", "echo hello from the bucket");
    assert_eq!(status, 200, "{v}");
    // Through the other master, waiting for the write if it has not folded it yet.
    let (status, entry, seen) = send(&b, "GET", "/api/tool-catalog/hello", None, Some(seq));
    assert_eq!(status, 200, "{entry}");
    assert!(seen >= seq);
    assert_eq!(entry["binding"]["sha256"], v["binding"]["sha256"]);
    // A sequence number the log does not reach: 503 after the wait, saying how far it got.
    let (status, v, _) = send(&b, "GET", "/api/tool-catalog/hello", None, Some(seq + 1000));
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "seq_not_reached", "{v}");
    let (status, v, _) = send(&b, "GET", "/api/models", None, Some(u64::MAX));
    assert_eq!(status, 503, "{v}");
    // Refused callers are refused at once, never held waiting.
    let anonymous = common::http().get(format!("{}/api/models", b.url)).header("Agentos-Min-Seq", u64::MAX.to_string());
    assert_eq!(anonymous.send().unwrap().status().as_u16(), 401);
    let bad = common::http()
        .get(format!("{}/api/models", b.url))
        .bearer_auth(&b.token)
        .header("Agentos-Min-Seq", "soon")
        .send()
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);

    // The CLI keeps the last Agentos-Seq it saw and sends it as Agentos-Min-Seq, to any master.
    let seq_file = dir.path().join("seen-seq");
    let cli = |m: &Master, args: &[&str]| {
        let out = Command::new(common::BIN)
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("AGENTOS_URL", &m.url)
            .env("AGENTOS_TOKEN", &m.token)
            .env("AGENTOS_SEQ_FILE", &seq_file)
            .output()
            .unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let script = dir.path().join("greet.sh");
    std::fs::write(&script, "echo hi").unwrap();
    let (code, err) = cli(
        &a,
        &["catalog", "register-script", "--id", "greet", "--runtime", "sh", "--file", script.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{err}");
    let written: u64 = std::fs::read_to_string(&seq_file).unwrap().trim().parse().unwrap();
    let (_, entry, _) = send(&a, "GET", "/api/tool-catalog/greet", None, None);
    assert_eq!(written, entry["revision"].as_u64().unwrap(), "the registration's event is remembered");
    let (code, err) = cli(&b, &["catalog", "get", "greet"]);
    assert_eq!(code, 0, "{err}");
    std::fs::write(&seq_file, (written + 1000).to_string()).unwrap();
    let (code, err) = cli(&b, &["catalog", "get", "greet"]);
    assert_ne!(code, 0);
    assert!(err.contains("did not reach it"), "the CLI sent the seq it remembered: {err}");
    std::fs::write(&seq_file, written.to_string()).unwrap();

    // The script registered through a runs through b: its content comes from the bucket.
    let e = Executor::start(&b, &dir.path().join("executor"), "e1", &[]);
    let (status, r, _) = send(&b, "POST", "/api/tools/hello/invoke", Some(json!({})), None);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "hello from the bucket\n", "{r}");
    drop(e);

    // A secret set through b is there for a, encrypted with the key both were given.
    let (status, v, seq) =
        send(&b, "PUT", "/api/secrets/SHARED", Some(json!({"value": "shared-secret-0123456789"})), None);
    assert_eq!(status, 200, "{v}");
    let (status, list, _) = send(&a, "GET", "/api/secrets", None, Some(seq));
    assert_eq!(status, 200, "{list}");
    assert!(list.to_string().contains("SHARED"), "{list}");
    let stored = psql(&shared.storage.database, "SELECT string_agg(payload, '') FROM agentos_events");
    assert!(!stored.contains("shared-secret-0123456789"), "the secret's value is in the log");
}

#[test]
fn registrations_through_two_masters_at_once_are_each_committed_once_and_a_killed_master_loses_no_acknowledged_one() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let mut a = shared.master(&dir.path().join("a"), None);
    let b = shared.master(&dir.path().join("b"), Some(&a));
    let per_master = 60;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, u64)>::new()));
    let writers: Vec<_> = [(&a, "a"), (&b, "b")]
        .into_iter()
        .map(|(m, name)| {
            let (url, token, acked) = (m.url.clone(), m.token.clone(), acked.clone());
            std::thread::spawn(move || {
                let client = common::http();
                for i in 0..per_master {
                    let id = format!("{name}-{i}");
                    let body = json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": id, "name": id, "runtime": "sh",
                        "content": format!("echo {id}")});
                    let resp = client.post(format!("{url}/api/commands")).bearer_auth(&token).json(&body).send();
                    // The master may be killed under this writer: what it acknowledged counts.
                    let Ok(resp) = resp else { return };
                    if resp.status().as_u16() != 200 {
                        continue;
                    }
                    let seq: u64 = resp.headers()["agentos-seq"].to_str().unwrap().parse().unwrap();
                    acked.lock().unwrap().push((id, seq));
                }
            })
        })
        .collect();
    common::wait_for("some registrations through a", || {
        acked.lock().unwrap().iter().filter(|(id, _)| id.starts_with("a-")).count() >= 20
    });
    a.kill9();
    for w in writers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let through_b = acked.iter().filter(|(id, _)| id.starts_with("b-")).count();
    assert_eq!(through_b, per_master, "every registration through b went through");
    let last = acked.iter().map(|(_, s)| *s).max().unwrap();
    for (id, seq) in &acked {
        let (status, v, _) = send(&b, "GET", &format!("/api/tool-catalog/{id}"), None, Some(*seq));
        assert_eq!(status, 200, "{id}, acknowledged at {seq}, is lost: {v}");
    }
    // One log: every event once, numbered without a hole.
    let (count, max) = (
        psql(&shared.storage.database, "SELECT count(*) FROM agentos_events"),
        psql(&shared.storage.database, "SELECT max(seq) FROM agentos_events"),
    );
    assert_eq!(count, max, "the log's numbers have a hole or a double");
    let registered = psql(
        &shared.storage.database,
        "SELECT count(*) FROM agentos_events WHERE type = 'ToolRegistered' AND key LIKE 'tool:%-%'",
    );
    // Each acknowledged registration once; the one in flight at the kill may have committed unanswered.
    let registered: usize = registered.parse().unwrap();
    assert!(
        (acked.len()..=acked.len() + 1).contains(&registered),
        "{registered} registered, {} acknowledged",
        acked.len()
    );
    // The killed master comes back and folds what b wrote meanwhile.
    let a = a.restart();
    let (status, v, seen) = send(&a, "GET", "/api/tool-catalog/b-59", None, Some(last));
    assert_eq!(status, 200, "{v}");
    assert!(seen >= last);
}

#[test]
fn a_database_restarted_under_load_is_answered_503_meanwhile_and_both_masters_go_on() {
    // A cluster of its own: stopping the suite's one would fail every other test.
    let env = [("AGENTOS_PG_PORT", "55433"), ("AGENTOS_PG_DIR", "/tmp/agentos-pg-55433")];
    let pg = |arg: Option<&str>| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/pg-env");
        let out = Command::new(script).args(arg).envs(env).output().unwrap();
        assert!(out.status.success(), "pg-env {arg:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let server = pg(None);
    let name = format!("agentos_outage_{}", std::process::id());
    psql(&server, &format!("DROP DATABASE IF EXISTS {name}"));
    psql(&server, &format!("CREATE DATABASE {name}"));
    let dir = tempfile::tempdir().unwrap();
    let mut shared = Shared::new(dir.path());
    shared.storage.database = format!("{}/{name}", server.rsplit_once('/').unwrap().0);
    let a = shared.master(&dir.path().join("a"), None);
    let b = shared.master(&dir.path().join("b"), Some(&a));
    let (status, v, _) = register(&a, "before", "echo 1");
    assert_eq!(status, 200, "{v}");
    let (status, v, _) = register(&a, "slow", "sleep 1; echo done");
    assert_eq!(status, 200, "{v}");
    let urls = format!("{},{}", a.url, b.url);
    let _e = Executor::start_args(&a, &dir.path().join("executor"), "e1", &[], &["--master", &urls]);
    let invoke = |m: &Master| send(m, "POST", "/api/tools/before/invoke", Some(json!({"timeoutMs": 5000})), None);
    for m in [&a, &b] {
        let (status, v, _) = invoke(m);
        assert_eq!((status, v["stdout"].as_str()), (200, Some("1\n")), "{v}");
    }

    // Registrations and reads through both masters, before, during and after the outage:
    // each answered right, or 503 with the reason; never a wrong answer.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let masters = [(a.url.clone(), a.token.clone()), (b.url.clone(), b.token.clone())];
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut acked, mut refused) = (Vec::new(), 0);
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (url, token) = &masters[(i % 2) as usize];
                let body = json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": format!("l-{i}"), "name": "l",
                    "runtime": "sh", "content": format!("echo {i}")});
                let r = common::http().post(format!("{url}/api/commands")).bearer_auth(token).json(&body).send();
                let (status, v) = r.map(|r| (r.status().as_u16(), r.json::<Value>().unwrap())).unwrap();
                match status {
                    200 => acked.push(i),
                    503 => {
                        assert_eq!(v["error"]["code"], "storage_unavailable", "{v}");
                        refused += 1;
                    }
                    _ => panic!("registration {i}: {status} {v}"),
                }
                let read = common::http().get(format!("{url}/api/tool-catalog/before")).bearer_auth(token).send();
                let (status, v) = read.map(|r| (r.status().as_u16(), r.json::<Value>().unwrap())).unwrap();
                assert!(status == 200 && v["id"] == "before", "a read during the outage: {status} {v}");
                i += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            (acked, refused)
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // A job that ends while the database is out: its result waits for it, and is recorded once
    // from this run (it used to be dropped after 3 s of refusals, and the job ran again).
    let queued = common::http()
        .post(format!("{}/api/tools/slow/invoke", a.url))
        .bearer_auth(&a.token)
        .header("Prefer", "respond-async")
        .json(&json!({}))
        .send()
        .unwrap();
    assert_eq!(queued.status().as_u16(), 202);
    let slow_job = queued.json::<Value>().unwrap()["jobId"].as_str().unwrap().to_string();
    common::wait_for("the slow job to start", || {
        send(&a, "GET", &format!("/api/jobs/{slow_job}"), None, None).1["state"] == "running"
    });
    pg(Some("stop"));
    let (status, v, _) = register(&a, "during", "echo 2");
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "storage_unavailable", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("storage unavailable"), "{v}");
    // Invocations during the outage: refused with the reason.
    for m in [&a, &b] {
        let (status, v, _) = invoke(m);
        assert_eq!((status, v["error"]["code"].as_str()), (503, Some("storage_unavailable")), "{v}");
    }
    // Longer than the executor's old retries of a result (about 3 s).
    std::thread::sleep(Duration::from_millis(5000));
    pg(None);
    for (m, id) in [(&a, "after-a"), (&b, "after-b")] {
        common::wait_for("registrations to go through again", || register(m, id, "echo 3").0 == 200);
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (acked, refused) = load.join().unwrap();
    assert!(refused > 0, "the load met the outage");
    // Nothing acknowledged is lost, both masters see it all, and nothing refused got in.
    let (_, _, seq) = send(&a, "GET", "/api/models", None, None);
    for m in [&a, &b] {
        for i in &acked {
            let (status, v, _) = send(m, "GET", &format!("/api/tool-catalog/l-{i}"), None, Some(seq));
            assert_eq!(status, 200, "acknowledged registration l-{i} is missing: {v}");
        }
        let (status, _, _) = send(m, "GET", "/api/tool-catalog/during", None, None);
        assert_eq!(status, 404);
    }
    common::wait_for("the slow job's result", || {
        send(&a, "GET", &format!("/api/jobs/{slow_job}"), None, None).1["state"] == "finished"
    });
    let (_, job, _) = send(&b, "GET", &format!("/api/jobs/{slow_job}"), None, None);
    let results = job["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{job}");
    assert_eq!((results[0]["attempt"].as_u64(), results[0]["stdout"].as_str()), (Some(1), Some("done\n")), "{job}");
    // The queue is back too: the executor, which kept polling through the outage, runs jobs.
    for m in [&a, &b] {
        let (status, v, _) = invoke(m);
        assert_eq!((status, v["stdout"].as_str()), (200, Some("1\n")), "{v}");
    }
}

#[test]
fn each_models_fires_run_on_one_master_and_a_survivor_takes_over_a_killed_masters_models() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let mut a = shared.master(&dir.path().join("a"), None);
    let net = json!({"places": ["p-in", "p-out"], "transitions": [{"id": "move", "kind": "pass",
        "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]});
    let (status, v, _) = send(&a, "PUT", "/api/models/flow/net", Some(net), None);
    assert_eq!(status, 200, "{v}");
    let (status, v, _) = send(&a, "POST", "/api/models/flow/transitions/move/start", Some(json!({})), None);
    assert_eq!(status, 200, "{v}");
    let put = |m: &Master, n: u64| {
        let (status, v, seq) =
            send(m, "POST", "/api/models/flow/places/p-in/tokens", Some(json!({"data": {"n": n}})), None);
        assert_eq!(status, 200, "{v}");
        seq
    };
    let out = |m: &Master, seq: u64| {
        let (status, v, _) = send(m, "GET", "/api/models/flow/places/p-out/tokens", None, Some(seq));
        assert_eq!(status, 200, "{v}");
        v.as_array().unwrap().iter().map(|t| t["data"]["n"].as_u64().unwrap()).collect::<Vec<_>>()
    };
    put(&a, 1);
    common::wait_for("a to run the model", || out(&a, 0) == [1]);
    // b comes after a took the model: tokens put through b are fired by a, once each.
    let b = shared.master(&dir.path().join("b"), Some(&a));
    for n in 2..=20 {
        put(if n % 2 == 0 { &b } else { &a }, n);
    }
    common::wait_for("every token to move once", || out(&b, 0).len() == 20);
    let mut moved = out(&b, 0);
    moved.sort();
    assert_eq!(moved, (1..=20).collect::<Vec<_>>(), "each token fired once");

    // a dies: b takes its model over and fires what is put next.
    a.kill9();
    put(&b, 21);
    common::wait_for("b to take the model over", || out(&b, 0).contains(&21));
}

#[test]
fn a_job_queued_through_one_master_runs_through_another_and_an_executor_moves_to_the_survivor() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let mut a = shared.master(&dir.path().join("a"), None);
    let b = shared.master(&dir.path().join("b"), Some(&a));
    let (status, v, _) = register(&a, "echo-in", "cat");
    assert_eq!(status, 200, "{v}");
    // The executor polls a (the first URL); the job is queued through b.
    let urls = format!("{},{}", a.url, b.url);
    let _e = Executor::start_args(&a, &dir.path().join("executor"), "e1", &[], &["--master", &urls]);
    let (status, listed, _) = send(&b, "GET", "/api/executors", None, None);
    assert_eq!((status, listed[0]["name"].as_str()), (200, Some("e1")), "b sees the executor polling a: {listed}");
    let (status, r, _) = send(&b, "POST", "/api/tools/echo-in/invoke", Some(json!({"input": {"via": "b"}})), None);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "{\"via\":\"b\"}", "{r}");
    // A recorded job leaves the queue: its row goes once the result is committed, which may be
    // just after the caller has its answer.
    common::wait_for("the recorded job's row to leave the queue", || {
        psql(&shared.storage.database, "SELECT count(*) FROM agentos_jobs") == "0"
    });

    // a dies: the executor's next poll fails and it moves to b, which hands out the next job.
    a.kill9();
    let (status, r, _) = send(&b, "POST", "/api/tools/echo-in/invoke", Some(json!({"input": {"after": 1}})), None);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "{\"after\":1}", "{r}");
    let job = r["jobId"].as_str().unwrap();
    let finished = psql(
        &shared.storage.database,
        &format!("SELECT count(*) FROM agentos_events WHERE type = 'JobFinished' AND key = 'job:{job}'"),
    );
    assert_eq!(finished, "1");
}

/// A job queued and running through one master is cancelled through another: the shared
/// queue's row goes, the executor stops the job and is free, and one result is recorded.
#[test]
fn a_running_job_in_the_shared_queue_is_cancelled_through_another_master() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let a = shared.master_with(&dir.path().join("a"), None, &["--lease-ms", "900"]);
    let b = shared.master_with(&dir.path().join("b"), Some(&a), &["--lease-ms", "900"]);
    assert_eq!(register(&a, "hang", "sleep 60").0, 200);
    let _e = Executor::start(&a, &dir.path().join("executor"), "e1", &[]);
    let job = a.client().invoke_async("hang", json!({"timeoutMs": 120000}));
    common::wait_for("the job to run", || {
        send(&b, "GET", &format!("/api/jobs/{job}"), None, None).1["state"] == "running"
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (status, v, _) = send(&b, "POST", &format!("/api/jobs/{job}/cancel"), None, None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["results"][0]["cancelledBy"], "operator", "{v}");
    assert_eq!(v["results"][0]["executor"], "e1", "{v}");
    // How long it ran on e1, by the database's clock.
    let ran = v["results"][0]["durationMs"].as_u64().unwrap();
    assert!((300..60_000).contains(&ran), "ran {ran} ms: {v}");
    common::wait_for("the cancelled job's row to leave the queue", || {
        psql(&shared.storage.database, "SELECT count(*) FROM agentos_jobs") == "0"
    });
    common::wait_for("the executor to be free", || {
        send(&a, "GET", "/api/executors", None, None).1[0]["state"] != "busy"
    });
    let (status, v, _) = send(&a, "POST", &format!("/api/jobs/{job}/cancel"), None, None);
    assert_eq!((status, v["error"]["code"].as_str()), (409, Some("job_finished")), "{v}");
    let finished = psql(
        &shared.storage.database,
        &format!("SELECT count(*) FROM agentos_events WHERE type = 'JobFinished' AND key = 'job:{job}'"),
    );
    assert_eq!(finished, "1");
}

/// An executor killed mid-job and started again on its workspace, polling another master, has
/// its predecessor's lease in the shared queue ended at once: the job runs again, through b,
/// long before the lease (a minute) would have run out.
#[test]
fn a_restarted_executor_hands_back_its_killed_predecessors_job_in_the_shared_queue() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let lease = ["--lease-ms", "60000"];
    let a = shared.master_with(&dir.path().join("a"), None, &lease);
    let b = shared.master_with(&dir.path().join("b"), Some(&a), &lease);
    let (status, v, _) = register(&a, "slow", "sleep 2; echo finished");
    assert_eq!(status, 200, "{v}");
    let workspace = dir.path().join("executor");
    let mut e = Executor::start_args(&a, &workspace, "e1", &[], &["--master", &a.url]);
    let caller = {
        let a_url = a.url.clone();
        let token = a.token.clone();
        std::thread::spawn(move || {
            let resp = common::http()
                .post(format!("{a_url}/api/tools/slow/invoke"))
                .bearer_auth(token)
                .json(&json!({"timeoutMs": 5000}))
                .send()
                .expect("request");
            (resp.status().as_u16(), resp.json::<Value>().unwrap_or_default())
        })
    };
    common::wait_for("e1 to take the job", || {
        psql(&shared.storage.database, "SELECT count(*) FROM agentos_jobs WHERE executor = 'e1'") == "1"
    });
    e.kill9();
    let _e = Executor::start_args(&a, &workspace, "e1", &[], &["--master", &b.url]);
    let (status, r) = caller.join().unwrap();
    assert_eq!(status, 200, "{r}");
    assert_eq!((r["stdout"].as_str(), r["attempt"].as_u64()), (Some("finished\n"), Some(2)), "{r}");
}

/// Whether an executor serves a shared queue is read from the database. When that read fails,
/// the caller is refused with the failure (not told that no executor serves the queue, which may
/// be false), and the queue keeps no job for them. The failure is a real one: the table of
/// executors is renamed away under the master, then back, after which calls run again.
#[test]
fn a_failed_read_of_who_serves_the_queue_is_said_as_such_and_keeps_no_job() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let a = shared.master(&dir.path().join("a"), None);
    let (status, v, _) = register(&a, "echo-in", "cat");
    assert_eq!(status, 200, "{v}");
    let database = &shared.storage.database;
    psql(database, "ALTER TABLE agentos_executors RENAME TO agentos_executors_away");
    let (status, r, _) = send(&a, "POST", "/api/tools/echo-in/invoke", Some(json!({"input": {"n": 1}})), None);
    assert_eq!((status, r["error"]["code"].as_str()), (500, Some("storage_fault")), "{r}");
    assert_eq!(psql(database, "SELECT count(*) FROM agentos_jobs"), "0", "the refused caller's job is not kept");

    psql(database, "ALTER TABLE agentos_executors_away RENAME TO agentos_executors");
    let _e = Executor::start(&a, &dir.path().join("executor"), "e1", &[]);
    let (status, r, _) = send(&a, "POST", "/api/tools/echo-in/invoke", Some(json!({"input": {"n": 2}})), None);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "{\"n\":2}", "{r}");
}

/// The executor polls a through a proxy that loses the answer carrying a job; it moves to b,
/// and its poll there takes that job back from the shared queue: the job runs at once, not
/// when its lease (a minute) would have run out.
#[test]
fn a_job_handed_out_by_a_master_whose_answer_was_lost_runs_at_once_through_the_next_master() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let lease = ["--lease-ms", "60000"];
    let a = shared.master_with(&dir.path().join("a"), None, &lease);
    let b = shared.master_with(&dir.path().join("b"), Some(&a), &lease);
    let (status, v, _) = register(&a, "only", "echo only");
    assert_eq!(status, 200, "{v}");
    // The answer dropped with its connection, and replaced by a proxy's 502.
    for (n, lose) in [common::Lose::Connection, common::Lose::BadGateway].into_iter().enumerate() {
        let lossy_a = common::proxy_losing_one_answer(&a.url, "/api/executor/poll", lose);
        let urls = format!("{lossy_a},{}", b.url);
        let name = format!("e{n}");
        let e = Executor::start_args(&a, &dir.path().join(&name), &name, &[], &["--master", &urls]);
        let asked = std::time::Instant::now();
        let (status, r, _) = send(&b, "POST", "/api/tools/only/invoke", Some(json!({"timeoutMs": 20000})), None);
        let took = asked.elapsed();
        assert_eq!(
            (status, r["stdout"].as_str(), r["attempt"].as_u64()),
            (200, Some("only\n"), Some(2)),
            "{lose:?}: {r}"
        );
        assert!(took < Duration::from_secs(15), "{lose:?}: the job waited {took:?}, its lease's time");
        drop(e);
    }
}

/// Calls about jobs that are not theirs, under names nobody polled with, are refused and make
/// no executor known in the shared queue: a caller with no executor is told so at once rather
/// than waiting for made-up names to serve it. An executor gone for a day leaves the list.
#[test]
fn refused_executor_calls_make_no_executor_known_and_long_gone_ones_leave_the_shared_list() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let a = shared.master(&dir.path().join("a"), None);
    let (status, v, _) = send(&a, "POST", "/api/executor-tokens", Some(json!({"name": "e1"})), None);
    assert_eq!(status, 200, "{v}");
    let token = v["token"].as_str().unwrap().to_string();
    for n in 0..20 {
        for call in ["heartbeat", "release", "result"] {
            let body = match call {
                "result" => {
                    json!({"leaseId": "x", "exitCode": 0, "stdoutBase64": "", "stderrBase64": "", "durationMs": 1})
                }
                _ => json!({"leaseId": "x"}),
            };
            let resp = common::http()
                .post(format!("{}/api/executor/jobs/nope/{call}", a.url))
                .bearer_auth(&token)
                .header("x-agentos-executor-name", format!("ghost-{n}"))
                .json(&body)
                .send()
                .unwrap();
            assert_eq!(resp.status().as_u16(), 404, "{call}");
        }
        // A goodbye under a name nobody polled with is taken, and notes nothing.
        let resp = common::http()
            .post(format!("{}/api/executor/stopped", a.url))
            .bearer_auth(&token)
            .header("x-agentos-executor-name", format!("ghost-{n}"))
            .json(&json!({}))
            .send()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "stopped");
    }
    let (status, listed, _) = send(&a, "GET", "/api/executors", None, None);
    assert_eq!((status, listed.as_array().map(Vec::len)), (200, Some(0)), "{listed}");
    assert_eq!(psql(&shared.storage.database, "SELECT count(*) FROM agentos_executors"), "0");
    // An executor gone for more than a day leaves the list; one gone for less stays.
    psql(
        &shared.storage.database,
        "INSERT INTO agentos_executors VALUES ('e1/long-gone', 0, 0), ('e1/recent', \
         (extract(epoch from clock_timestamp()) * 1000)::bigint - 3600000, 0)",
    );
    let b = shared.master(&dir.path().join("b"), Some(&a));
    common::wait_for("b to forget the executor gone for a day", || {
        psql(&shared.storage.database, "SELECT string_agg(name, ',') FROM agentos_executors") == "e1/recent"
    });
    // One heard from just now, between two polls, is idle; one not heard from for 10 s, silent.
    psql(
        &shared.storage.database,
        "INSERT INTO agentos_executors VALUES ('e1/between', (extract(epoch from clock_timestamp()) * 1000)::bigint, 0), \
         ('e1/quiet', (extract(epoch from clock_timestamp()) * 1000)::bigint - 10000, 0)",
    );
    let (_, listed, _) = send(&a, "GET", "/api/executors", None, None);
    assert_eq!(states(&listed), [("e1/between", "idle"), ("e1/quiet", "silent"), ("e1/recent", "gone")], "{listed}");
    // One that says it stopped, through either master, is listed stopped by both, at once; so
    // is one long gone that says so.
    for (master, name) in [(&b, "between"), (&a, "recent")] {
        let resp = common::http()
            .post(format!("{}/api/executor/stopped", master.url))
            .bearer_auth(&token)
            .header("x-agentos-executor-name", name)
            .json(&json!({}))
            .send()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
    }
    for master in [&a, &b] {
        let (_, listed, _) = send(master, "GET", "/api/executors", None, None);
        let want = [("e1/between", "stopped"), ("e1/quiet", "silent"), ("e1/recent", "stopped")];
        assert_eq!(states(&listed), want, "{listed}");
    }
}

/// Two processes under one name, one polling through master a while the other says goodbye
/// through master b (which has no poll of that name open, so it ends the name's polls): a hears
/// of the goodbye on the jobs channel and writes its open poll down again at once, so the name
/// is listed polling (and serves the queue) while that poll waits, not `stopped` until it ends.
#[test]
fn a_goodbye_through_one_master_leaves_a_process_of_the_same_name_polling_through_another() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let a = shared.master(&dir.path().join("a"), None);
    let b = shared.master(&dir.path().join("b"), Some(&a));
    let (status, v, _) = send(&a, "POST", "/api/executor-tokens", Some(json!({"name": "e1"})), None);
    assert_eq!(status, 200, "{v}");
    let token = v["token"].as_str().unwrap().to_string();
    let listed = |m: &Master| states(&send(m, "GET", "/api/executors", None, None).1).contains(&("e1/twin", "polling"));
    let poller = {
        let (url, token) = (a.url.clone(), token.clone());
        std::thread::spawn(move || {
            common::http()
                .post(format!("{url}/api/executor/poll"))
                .bearer_auth(&token)
                .header("x-agentos-executor-name", "twin")
                .json(&json!({"waitMs": 15000}))
                .send()
                .map(|r| r.status().as_u16())
        })
    };
    common::wait_for("the twin listed polling", || listed(&b));
    let resp = common::http()
        .post(format!("{}/api/executor/stopped", b.url))
        .bearer_auth(&token)
        .header("x-agentos-executor-name", "twin")
        .json(&json!({}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    // Well within the poll's 15 s: without the notice, the name reads `stopped` until it ends.
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    while !(listed(&a) && listed(&b)) {
        let (_, now, _) = send(&b, "GET", "/api/executors", None, None);
        assert!(std::time::Instant::now() < deadline, "the twin's open poll is not written down again: {now}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(poller.join().unwrap().unwrap(), 204, "no job: the poll ran its time");
}

/// Each executor listed by `GET /api/executors`, as its name and state.
fn states(listed: &Value) -> Vec<(&str, &str)> {
    listed.as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap(), e["state"].as_str().unwrap())).collect()
}

/// What one load thread saw: the values whose request was acknowledged, and every answer of
/// the survivor that was not.
#[derive(Default)]
struct Acked {
    values: Vec<String>,
    survivor_failures: Vec<String>,
}

#[test]
fn two_masters_and_three_executors_under_load_lose_nothing_when_one_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let lease = ["--lease-ms", "3000"];
    let mut a = shared.master_with(&dir.path().join("a"), None, &lease);
    let b = shared.master_with(&dir.path().join("b"), Some(&a), &lease);
    let (status, v, _) = register(&a, "work", "cat");
    assert_eq!(status, 200, "{v}");
    let net = json!({
        "places": ["p-in", "p-cmd", "p-out"],
        "transitions": [
            {"id": "build", "kind": "map", "presets": {"i": {"place": "p-in"}}, "postsets": {"c": {"place": "p-cmd"}},
             "action": {"template": {"executor": "script", "command": "invoke", "args": {"toolId": "work", "input": "${.i.data}"}}},
             "emit": [{"to": "c"}]},
            {"id": "run", "kind": "command", "presets": {"c": {"place": "p-cmd"}}, "postsets": {"o": {"place": "p-out"}},
             "emit": [{"to": "o"}]}
        ]
    });
    let (status, v, _) = send(&a, "PUT", "/api/models/flow/net", Some(net), None);
    assert_eq!(status, 200, "{v}");
    for t in ["build", "run"] {
        let (status, v, _) =
            send(&a, "POST", &format!("/api/models/flow/transitions/{t}/start"), Some(json!({})), None);
        assert_eq!(status, 200, "{v}");
    }
    let (ab, ba) = (format!("{},{}", a.url, b.url), format!("{},{}", b.url, a.url));
    let _executors: Vec<Executor> = [("e1", &ab), ("e2", &ba), ("e3", &ab)]
        .into_iter()
        .map(|(name, urls)| {
            let args = ["--master", urls.as_str(), "--concurrency", "2"];
            Executor::start_args(&a, &dir.path().join(name), name, &[], &args)
        })
        .collect();

    // Four kinds of load, each alternating between the masters, while a is killed.
    let masters = [(a.url.clone(), a.token.clone()), (b.url.clone(), b.token.clone())];
    let load = |kind: &'static str| {
        let masters = masters.clone();
        std::thread::spawn(move || {
            let mut acked = Acked::default();
            for i in 0..60u32 {
                let (url, token) = &masters[(i % 2) as usize];
                let survivor = i % 2 == 1;
                let client = common::http();
                let (path, body) = match kind {
                    "register" => (
                        "/api/commands".to_string(),
                        json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": format!("reg-{i}"), "name": "r", "runtime": "sh", "content": format!("echo {i}")}),
                    ),
                    "token" => ("/api/models/flow/places/p-in/tokens".to_string(), json!({"data": {"i": i}})),
                    _ => ("/api/tools/work/invoke".to_string(), json!({"input": {"i": i}})),
                };
                let mut req = client.post(format!("{url}{path}")).bearer_auth(token).json(&body);
                if kind == "async" {
                    req = req.header("Prefer", "respond-async");
                }
                let answer = req.send().and_then(|r| {
                    let status = r.status().as_u16();
                    r.json::<Value>().map(|v| (status, v))
                });
                match answer {
                    Ok((200, v)) if kind == "invoke" => {
                        assert_eq!(v["stdout"], format!("{{\"i\":{i}}}"), "{v}");
                        acked.values.push(i.to_string());
                    }
                    Ok((202, v)) if kind == "async" => acked.values.push(v["jobId"].as_str().unwrap().to_string()),
                    Ok((200, _)) => acked.values.push(i.to_string()),
                    Ok((status, v)) if survivor => acked.survivor_failures.push(format!("{kind} {i}: {status} {v}")),
                    Err(e) if survivor => acked.survivor_failures.push(format!("{kind} {i}: {e}")),
                    _ => {}
                }
                std::thread::sleep(Duration::from_millis(40));
            }
            acked
        })
    };
    let threads: Vec<_> = ["register", "token", "invoke", "async"].into_iter().map(|k| (k, load(k))).collect();
    std::thread::sleep(Duration::from_millis(1200));
    a.kill9();
    let results: Vec<(&str, Acked)> = threads.into_iter().map(|(k, t)| (k, t.join().unwrap())).collect();
    for (kind, acked) in &results {
        assert!(
            acked.survivor_failures.is_empty(),
            "the survivor failed {kind} requests: {:?}",
            acked.survivor_failures
        );
        assert!(acked.values.len() >= 30, "{kind}: only {} acknowledged", acked.values.len());
    }
    let acked = |kind: &str| results.iter().find(|(k, _)| *k == kind).map(|(_, a)| a.values.clone()).unwrap();

    // No acknowledged registration lost.
    for i in acked("register") {
        let (status, v, _) = send(&b, "GET", &format!("/api/tool-catalog/reg-{i}"), None, None);
        assert_eq!(status, 200, "reg-{i}: {v}");
    }
    // No acknowledged job lost: each finishes, with one result.
    for job in acked("async") {
        common::wait_for(&format!("job {job} to finish"), || {
            send(&b, "GET", &format!("/api/jobs/{job}"), None, None).1["state"] == "finished"
        });
        let (_, v, _) = send(&b, "GET", &format!("/api/jobs/{job}"), None, None);
        assert_eq!(v["results"].as_array().unwrap().len(), 1, "{v}");
    }
    // b took the model over: every acknowledged token comes out, once.
    let tokens = acked("token");
    let out = || -> Vec<u64> {
        let (_, v, _) = send(&b, "GET", "/api/models/flow/places/p-out/tokens", None, None);
        v.as_array().unwrap().iter().map(|t| t["data"]["i"].as_u64().unwrap()).collect()
    };
    common::wait_for("every acknowledged token to come out", || {
        let got = out();
        tokens.iter().all(|n| got.contains(&n.parse().unwrap()))
    });
    let mut got = out();
    let total = got.len();
    got.sort();
    got.dedup();
    assert_eq!(got.len(), total, "a fire's result was recorded twice: {got:?}");
    // Nothing left in the queue, and no job recorded twice.
    common::wait_for("the queue to drain", || {
        psql(&shared.storage.database, "SELECT count(*) FROM agentos_jobs") == "0"
    });
    let twice = psql(
        &shared.storage.database,
        "SELECT count(*) FROM (SELECT key FROM agentos_events WHERE type = 'JobFinished' GROUP BY key HAVING count(*) > 1) t",
    );
    assert_eq!(twice, "0", "a job's result was recorded twice");
}

#[test]
fn a_job_carrying_a_credential_is_sealed_in_the_shared_queue_and_runs_through_another_master() {
    let secret = "queued-secret-8080";
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared::new(dir.path());
    let a = shared.master(&dir.path().join("a"), None);
    let b = shared.master(&dir.path().join("b"), Some(&a));
    let (status, v, _) = send(&a, "PUT", "/api/secrets/DEPLOY_KEY", Some(json!({"value": secret})), None);
    assert_eq!(status, 200, "{v}");
    let (status, v, _) = register(&a, "deploy", "echo \"len=${#DEPLOY_KEY} value=$DEPLOY_KEY\"");
    assert_eq!(status, 200, "{v}");
    let (status, v, _) = send(&a, "POST", "/api/secrets/DEPLOY_KEY/grants", Some(json!({"tool": "deploy"})), None);
    assert_eq!(status, 200, "{v}");
    let net = json!({"places": ["p-cmd", "p-out"], "transitions": [{"id": "run", "kind": "command",
        "presets": {"c": {"place": "p-cmd"}}, "postsets": {"o": {"place": "p-out"}},
        "action": {"executor": "late", "credentials": ["DEPLOY_KEY"]}, "emit": [{"to": "o", "from": "@response"}]}]});
    let (status, v, _) = send(&a, "PUT", "/api/models/cmds/net", Some(net), None);
    assert_eq!(status, 200, "{v}");
    let (status, v, _) = send(&a, "POST", "/api/models/cmds/transitions/run/start", Some(json!({})), None);
    assert_eq!(status, 200, "{v}");
    let cmd = json!({"data": {"executor": "script", "command": "invoke", "args": {"toolId": "deploy"}}});
    let (status, v, _) = send(&a, "POST", "/api/models/cmds/places/p-cmd/tokens", Some(cmd), None);
    assert_eq!(status, 200, "{v}");
    // Nobody named `late` polls yet: the job waits in the table, its credential sealed.
    common::wait_for("the job to be queued", || {
        psql(&shared.storage.database, "SELECT count(*) FROM agentos_jobs WHERE sealed") == "1"
    });
    let clear = psql(
        &shared.storage.database,
        &format!("SELECT count(*) FROM agentos_jobs WHERE position('{secret}'::bytea in body) > 0"),
    );
    assert_eq!(clear, "0", "the credential is in the database in the clear");
    // The executor polls b, which unseals the job a queued, with the key both were given.
    let _e = Executor::start(&b, &dir.path().join("late"), "late", &[]);
    let out = || send(&b, "GET", "/api/models/cmds/places/p-out/tokens", None, None).1;
    common::wait_for("the result", || out().as_array().is_some_and(|t| !t.is_empty()));
    let r = &out()[0]["data"];
    assert_eq!(r["stdout"], format!("len={} value=[redacted]\n", secret.len()), "{r}");
}

/// `agentos export` or `agentos import` with `args`: exit code, stdout, stderr.
fn migrate(args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(common::BIN);
    cmd.args(args).env_remove("AGENTOS_DATABASE").env_remove("AGENTOS_BLOBS");
    for (k, v) in S3_ENV {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[test]
fn a_single_machine_installation_moves_into_postgresql_and_s3_with_every_blob_verified() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("single");
    let mut single = Master::start(&data);
    let api = single.client();
    assert_eq!(api.register("greet", "sh", "echo greetings from the export", None).0, 200);
    assert_eq!(api.put("/api/secrets/MOVED", json!({"value": "moved-secret-0123456789"})).0, 200);
    // A job queued with no executor: open when the master stops, it runs after the move.
    let resp = common::http()
        .post(format!("{}/api/tools/greet/invoke", single.url))
        .bearer_auth(&single.token)
        .header("Prefer", "respond-async")
        .json(&json!({}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let job = resp.json::<Value>().unwrap()["jobId"].as_str().unwrap().to_string();

    let file = dir.path().join("move.jsonl");
    let data_arg = data.to_str().unwrap();
    let file_arg = file.to_str().unwrap();
    let (code, _, err) = migrate(&["export", "--data", data_arg, "--out", file_arg]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("a master is running"), "{err}");
    assert!(!file.exists(), "nothing is written while the master runs");
    single.kill9();
    let (code, out, err) = migrate(&["export", "--data", data_arg, "--out", file_arg]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 open jobs"), "{out}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains("moved-secret-0123456789"), "a secret's value is in the export");
    let key = std::fs::read(data.join("secrets.key")).unwrap();
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&key);
    assert!(!text.contains(&hex) && !text.contains(&b64), "the secrets key is in the export");

    let storage = SharedStorage::fresh();
    let import = |f: &Path| {
        migrate(&["import", f.to_str().unwrap(), "--database", &storage.database, "--blobs", &storage.blobs])
    };
    let events = || psql(&storage.database, "SELECT count(*) FROM agentos_events");
    // A changed blob and a cut file are refused before anything is written.
    let blob_line = text.lines().position(|l| l.starts_with("{\"blob\"")).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let damaged = dir.path().join("damaged.jsonl");
    let original = lines[blob_line].clone();
    let at = original.find("\"base64\":\"").unwrap() + 10;
    let flipped = if &original[at..at + 1] == "A" { "B" } else { "A" };
    lines[blob_line] = format!("{}{flipped}{}", &original[..at], &original[at + 1..]);
    std::fs::write(&damaged, lines.join("\n") + "\n").unwrap();
    let (code, _, err) = import(&damaged);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("does not hash to its name") || err.contains("base64"), "{err}");
    let cut = dir.path().join("cut.jsonl");
    let whole: Vec<&str> = text.lines().collect();
    std::fs::write(&cut, whole[..whole.len() - 1].join("\n") + "\n").unwrap();
    let (code, _, err) = import(&cut);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cut short"), "{err}");
    assert_eq!(psql(&storage.database, "SELECT count(*) FROM pg_tables WHERE tablename = 'agentos_events'"), "0");

    let (code, out, err) = import(&file);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 open jobs"), "{out}");
    let imported = events();
    // Run again (an import stopped half way is): nothing is added twice.
    let (code, out, err) = import(&file);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("imported 0 events") && out.contains("0 open jobs"), "{out}");
    assert_eq!(events(), imported);

    // A master on the imported storage, with the source's key and operator token.
    let moved_data = dir.path().join("moved");
    std::fs::create_dir_all(&moved_data).unwrap();
    std::fs::copy(data.join("operator.token"), moved_data.join("operator.token")).unwrap();
    let key_file = data.join("secrets.key");
    let args =
        ["--database", &storage.database, "--blobs", &storage.blobs, "--secrets-key-file", key_file.to_str().unwrap()];
    let moved = Master::start_full(&moved_data, "127.0.0.1:0", &args, &S3_ENV);
    let (status, secrets, _) = send(&moved, "GET", "/api/secrets", None, None);
    assert_eq!(status, 200, "{secrets}");
    assert!(secrets.to_string().contains("MOVED"), "{secrets}");
    let _e = Executor::start(&moved, &dir.path().join("executor"), "e1", &[]);
    common::wait_for("the open job to run", || {
        send(&moved, "GET", &format!("/api/jobs/{job}"), None, None).1["state"] == "finished"
    });
    let (_, j, _) = send(&moved, "GET", &format!("/api/jobs/{job}"), None, None);
    assert_eq!(j["results"][0]["stdout"], "greetings from the export\n", "{j}");
    let (status, r, _) = send(&moved, "POST", "/api/tools/greet/invoke", Some(json!({})), None);
    assert_eq!((status, r["stdout"].as_str()), (200, Some("greetings from the export\n")), "{r}");

    // Another installation's export does not go on top of this log.
    let other_data = dir.path().join("other");
    let mut other = Master::start(&other_data);
    other.kill9();
    let other_file = dir.path().join("other.jsonl");
    let (code, _, err) =
        migrate(&["export", "--data", other_data.to_str().unwrap(), "--out", other_file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = import(&other_file);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not this export's") || err.contains("more than the export's"), "{err}");
}

/// A bucket that does not exist is said when the master starts, in one line, as the storage's
/// configuration; it used to start, and its first registration was answered as an outage.
#[test]
fn a_master_given_a_bucket_that_does_not_exist_says_so_when_it_starts() {
    let storage = SharedStorage::fresh();
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("s3://agentos-t-missing-{}/blobs", std::process::id());
    let out = Command::new(common::BIN)
        .args(["serve", "--data", dir.path().join("m").to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .args(["--database", &storage.database, "--blobs", &missing])
        .envs(S3_ENV)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: --blobs") && last.contains("NoSuchBucket") && last.contains("check the bucket"),
        "{stderr}"
    );
}

/// An S3 server of the test's own (the same `s3s-fs` as `scripts/s3-env`'s, on another port
/// and folder), to stop, kill and start again without touching the other tests' server.
struct OwnS3 {
    child: std::process::Child,
    folder: PathBuf,
}

impl OwnS3 {
    fn start(folder: &Path, port: u16) -> OwnS3 {
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
        let bin = target.join("tools/bin/s3s-fs");
        assert!(bin.exists(), "{} (installed by scripts/s3-env)", bin.display());
        std::fs::create_dir_all(folder.join("bkt")).unwrap();
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", "agentos-test", "--secret-key", "agentos-test-secret"])
            .arg(folder)
            .current_dir(folder)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        common::wait_for("the test's own S3 server", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        OwnS3 { child, folder: folder.to_path_buf() }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: a signal to a child this test started and has not waited for.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }
}

impl Drop for OwnS3 {
    fn drop(&mut self) {
        // A stopped process is killed too; one already reaped has nothing to signal.
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGCONT);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An object store that stalls (its process stopped) or is gone (killed) is told to the caller
/// within seconds, 503 with what to do, and nothing is half written: the client's defaults
/// held a registration for three minutes. A script whose blob this master already verified
/// runs meanwhile; once the store is back, writing goes on.
#[test]
fn a_stalled_or_stopped_object_store_is_answered_503_within_seconds_and_nothing_is_half_written() {
    let dir = tempfile::tempdir().unwrap();
    let database = SharedStorage::fresh().database;
    let port = common::free_port();
    let mut s3 = OwnS3::start(&dir.path().join("s3"), port);
    let endpoint = format!("http://127.0.0.1:{port}");
    let env: Vec<(&str, &str)> =
        S3_ENV.iter().map(|&(k, v)| if k == "AWS_ENDPOINT_URL" { (k, endpoint.as_str()) } else { (k, v) }).collect();
    let m = Master::start_full(
        &dir.path().join("m"),
        "127.0.0.1:0",
        &["--database", &database, "--blobs", "s3://bkt/blobs"],
        &env,
    );
    let (status, v, _) = register(&m, "early", "echo early");
    assert_eq!(status, 200, "{v}");
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let invoke = |id: &str| send(&m, "POST", &format!("/api/tools/{id}/invoke"), Some(json!({})), None);
    let (status, r, _) = invoke("early");
    assert_eq!((status, r["stdout"].as_str()), (200, Some("early\n")), "{r}");

    // A blob of more than one part (6 MiB of output) is written in parts, and read back whole
    // from the store by a master that never had it.
    let (status, v, _) = register(&m, "loud", "head -c 6291456 /dev/zero | tr '\\0' a");
    assert_eq!(status, 200, "{v}");
    let (status, r, _) = invoke("loud");
    assert_eq!((status, &r["stdoutBlob"]["sizeBytes"]), (200, &json!(6291456)), "{r}");
    let data2 = dir.path().join("m2");
    std::fs::create_dir_all(&data2).unwrap();
    std::fs::copy(m.data.join("operator.token"), data2.join("operator.token")).unwrap();
    let m2 = Master::start_full(&data2, "127.0.0.1:0", &["--database", &database, "--blobs", "s3://bkt/blobs"], &env);
    let urn = r["stdoutBlob"]["urn"].as_str().unwrap();
    let resp = common::http().get(format!("{}/api/blobs/{urn}", m2.url)).bearer_auth(&m2.token).send().unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let bytes = resp.bytes().unwrap();
    assert!(bytes.len() == 6291456 && bytes.iter().all(|&b| b == b'a'), "{} bytes", bytes.len());
    drop(m2);

    // Stalled: the server's process stopped, its connections accepted by the kernel and never answered.
    s3.signal(libc::SIGSTOP);
    let began = std::time::Instant::now();
    let (status, v, _) = register(&m, "late", "echo late");
    let took = began.elapsed();
    assert_eq!((status, v["error"]["code"].as_str()), (503, Some("storage_unavailable")), "{v}");
    let said = v["error"]["message"].as_str().unwrap();
    assert!(said.contains("the store did not answer within 15s (AWS_TIMEOUT sets the limit); try again"), "{said}");
    assert!(took < Duration::from_secs(40), "answered after {took:?}");
    assert_eq!(send(&m, "GET", "/api/tool-catalog/late", None, None).0, 404, "no entry without its blob");
    let (status, r, _) = invoke("early");
    assert_eq!((status, r["stdout"].as_str()), (200, Some("early\n")), "a verified blob needs no store: {r}");
    s3.signal(libc::SIGCONT);
    let (status, v, _) = register(&m, "late", "echo late");
    assert_eq!(status, 200, "{v}");

    // Gone: nothing listens.
    s3.signal(libc::SIGKILL);
    let _ = s3.child.wait();
    let began = std::time::Instant::now();
    let (status, v, _) = register(&m, "later", "echo later");
    assert_eq!((status, v["error"]["code"].as_str()), (503, Some("storage_unavailable")), "{v}");
    let said = v["error"]["message"].as_str().unwrap();
    assert!(said.contains("the store cannot be reached (") && said.ends_with("try again when it is back"), "{said}");
    assert!(!said.contains("retries"), "the client's report of its retries: {said}");
    assert!(began.elapsed() < Duration::from_secs(15), "answered after {:?}", began.elapsed());
    assert_eq!(send(&m, "GET", "/api/tool-catalog/later", None, None).0, 404);

    // Back, on its folder: the late script's blob is there, and writing goes on.
    let folder = s3.folder.clone();
    drop(s3);
    let _s3 = OwnS3::start(&folder, port);
    let (status, v, _) = register(&m, "later", "echo later");
    assert_eq!(status, 200, "{v}");
    let (status, r, _) = invoke("later");
    assert_eq!((status, r["stdout"].as_str()), (200, Some("later\n")), "{r}");
}
