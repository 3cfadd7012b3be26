//! Durability: what the master acknowledged survives kill -9 and restart, with and without snapshots.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::{Master, sha256_hex};

#[test]
fn acknowledged_registrations_survive_kill_9_mid_stream() {
    let dir = tempfile::tempdir().unwrap();
    // Snapshots every few events, so a kill also lands between and during snapshots.
    let mut master = Master::start_with(dir.path(), &["--snapshot-every", "25"]);
    let api = master.client();
    let acked: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (api, acked, stop) = (api.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) && i < 5000 {
                    let id = format!("w{w}-t{i}");
                    let model = if i % 3 == 0 { "default".to_string() } else { format!("team-{w}") };
                    let content = format!("echo writer {w} tool {i}");
                    // A request cut by the kill is simply not acknowledged.
                    let mut req = api.http.post(format!("{}/api/commands", api.url)).bearer_auth(api.token.as_ref().unwrap());
                    req = req.json(&serde_json::json!({"type":"TOOL_CATALOG_REGISTER_SCRIPT","id":id,"name":id,"runtime":"sh","content":content,"model":model}));
                    match req.send() {
                        Ok(r) if r.status().as_u16() == 200 => acked.lock().unwrap().push((id, model, content)),
                        Ok(r) => panic!("registration refused: {}", r.status()),
                        Err(_) => break,
                    }
                    i += 1;
                }
            })
        })
        .collect();
    // Let a stream build up, then kill while writers are mid-request.
    while acked.lock().unwrap().len() < 300 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    master.kill9();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 300);

    let master = Master::start_with(dir.path(), &["--snapshot-every", "25"]);
    let api = master.client();
    for (id, model, content) in &acked {
        let (status, e) = api.get(&format!("/api/tool-catalog/{id}?model={model}"));
        assert_eq!(status, 200, "acknowledged {id} in {model} was lost: {e}");
        assert_eq!(e["model"], model.as_str());
        assert_eq!(e["binding"]["sha256"], sha256_hex(content.as_bytes()));
        let (status, bytes) = api.get_bytes(&format!("/api/blobs/{}", e["binding"]["scriptUrn"].as_str().unwrap()));
        assert_eq!(status, 200, "blob of {id} lost");
        assert_eq!(bytes, content.as_bytes());
    }
    // The state after restart is the fold of the log: every event once, nothing invented.
    let (_, h) = api.get(&format!("/api/tool-catalog/{}/history?model={}", acked[0].0, acked[0].1));
    assert_eq!(h["events"].as_array().unwrap().len(), 1);
}

#[test]
fn restart_restores_from_snapshot_and_log_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut master = Master::start_with(dir.path(), &["--snapshot-every", "10"]);
    let api = master.client();
    for i in 0..37 {
        assert_eq!(
            api.register(&format!("t{i}"), "sh", &format!("echo {i}"), Some(if i % 2 == 0 { "default" } else { "m" }))
                .0,
            200
        );
    }
    api.register("t0", "sh", "echo changed", None);
    let (_, before_global) = api.get("/api/tool-catalog?limit=1000");
    let (_, before_local) = api.get("/api/tool-catalog?model=m&limit=1000");
    let (_, before_models) = api.get("/api/models");

    // Graceful stop writes a final snapshot; a kill leaves only the periodic ones.
    master.terminate();
    for _ in 0..2 {
        let mut m = Master::start_with(dir.path(), &["--snapshot-every", "10"]);
        let api = m.client();
        assert_eq!(api.get("/api/tool-catalog?limit=1000").1, before_global);
        assert_eq!(api.get("/api/tool-catalog?model=m&limit=1000").1, before_local);
        assert_eq!(api.get("/api/models").1, before_models);
        assert_eq!(api.get("/api/tool-catalog/t0").1["binding"]["sha256"], sha256_hex(b"echo changed"));
        api.register("after-restart", "sh", "echo", Some("m"));
        api.command(serde_json::json!({"type":"TOOL_CATALOG_REMOVE","id":"after-restart","model":"m"}));
        m.kill9();
    }
}

#[test]
fn a_lost_operator_token_is_replaced_and_the_old_one_stops_working() {
    let dir = tempfile::tempdir().unwrap();
    let master = Master::start(dir.path());
    let old = master.token.clone();
    master.client().register("keep", "sh", "echo", None);
    drop(master);
    std::fs::remove_file(dir.path().join("operator.token")).unwrap();
    let master = Master::start(dir.path());
    assert_ne!(master.token, old);
    let api = master.client();
    assert_eq!(api.get("/api/tool-catalog/keep").0, 200);
    assert_eq!(api.with_token(Some(&old)).get("/api/tool-catalog/keep").0, 401);
}

#[test]
fn an_async_invocation_survives_a_master_killed_before_any_executor_ran_it() {
    // Issue 11: a direct invocation's job lived in memory; a master crash lost it.
    use common::{Executor, free_port, wait_for};
    use serde_json::{Value, json};
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let master = Master::start_full(&dir.path().join("master"), &listen, &[], &[]);
    let api = master.client();
    // Every run of the script leaves a line here, whichever user it runs as.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let runs = shared.join("runs");
    let script = format!("echo ran >> {}; echo done", runs.display());
    assert_eq!(api.register("once", "sh", &script, Some("default")).0, 200);
    // `x` and `s` but not `l`: it may invoke scripts, and read its own job, not others'.
    let invoker = api.agent("invoker", "--x------s");
    let other = api.agent("other", "--x------s");
    let resp = invoker
        .http
        .post(format!("{}/api/tools/once/invoke", invoker.url))
        .bearer_auth(invoker.token.as_ref().unwrap())
        .header("Prefer", "respond-async")
        .json(&json!({"timeoutMs": 10000}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    assert_eq!(resp.headers()["preference-applied"], "respond-async");
    let body: Value = resp.json().unwrap();
    let job_id = body["jobId"].as_str().unwrap().to_string();
    let path = format!("/api/jobs/{job_id}");
    assert_eq!(body["location"], path.as_str());
    let (status, job) = invoker.get(&path);
    assert_eq!((status, job["state"].as_str()), (200, Some("queued")), "{job}");
    assert_eq!(other.get(&path).0, 404, "another principal without l sees the job");

    let master = master.restart();
    let (status, job) = invoker.get(&path);
    assert_eq!((status, job["state"].as_str()), (200, Some("queued")), "the job did not survive the crash: {job}");
    let _e = Executor::start(&master, &dir.path().join("executor"), "e1", &[]);
    let mut job = Value::Null;
    wait_for("the job to finish", || {
        job = invoker.get(&path).1;
        job["state"] == "finished"
    });
    let results = job["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{job}");
    assert_eq!(results[0]["stdout"], "done\n", "{job}");
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "ran\n", "the job ran more than once");
    // Once recorded, the job is not queued again by another restart.
    let master = master.restart();
    let _e2 = Executor::start(&master, &dir.path().join("executor2"), "e2", &[]);
    assert_eq!(master.client().get("/api/executors").0, 200);
    let (status, job) = invoker.get(&path);
    assert_eq!((status, job["results"].as_array().map(Vec::len)), (200, Some(1)), "{job}");
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "ran\n");
}

#[test]
fn a_direct_job_running_when_the_master_is_killed_finishes_after_the_restart_with_one_result() {
    use common::{Executor, free_port, wait_for};
    use serde_json::{Value, json};
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // A fixed address: the executor finds the master again after the restart.
    let listen = format!("127.0.0.1:{}", free_port());
    let master = Master::start_full(&dir.path().join("master"), &listen, &[], &[]);
    let api = master.client();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let runs = shared.join("runs");
    let script = format!("echo ran >> {}; sleep 2; echo done", runs.display());
    assert_eq!(api.register("slow", "sh", &script, Some("default")).0, 200);
    let _e = Executor::start(&master, &dir.path().join("executor"), "e1", &[]);
    let resp = api
        .http
        .post(format!("{}/api/tools/slow/invoke", api.url))
        .bearer_auth(api.token.as_ref().unwrap())
        .header("Prefer", "respond-async")
        .json(&json!({"timeoutMs": 20000}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let job_id = resp.json::<Value>().unwrap()["jobId"].as_str().unwrap().to_string();
    let path = format!("/api/jobs/{job_id}");
    wait_for("the job to run", || {
        api.get(&path).1["state"] == "running" && std::fs::read_to_string(&runs).is_ok_and(|r| r == "ran\n")
    });

    let master = master.restart();
    let api = master.client();
    let mut job = Value::Null;
    wait_for("the job to finish after the restart", || {
        job = api.get(&path).1;
        job["state"] == "finished"
    });
    let results = job["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{job}");
    assert_eq!(results[0]["stdout"], "done\n", "{job}");
    // Handed out again after the restart: the run the master did not see the end of is not
    // recorded, the one after it is, once.
    let (_, page) = api.get("/api/events?limit=1000");
    let events = page["events"].as_array().or(page.as_array()).cloned().unwrap_or_default();
    let finished = events.iter().filter(|e| e["type"] == "JobFinished" && e.to_string().contains(&job_id)).count();
    assert_eq!(finished, 1, "{events:?}");
    // The run cut off by the crash (its result refused: its lease died with the master) and
    // the one recorded; both ended before the second could finish.
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "ran\nran\n");
}
