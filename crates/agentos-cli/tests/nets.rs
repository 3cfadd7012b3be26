//! The net engine end to end: durable firing through crashes, command and http transitions,
//! emit rules, schedules, tool nets, and the validation of net documents.

mod common;

use std::time::{Duration, Instant};

use common::{Api, Executor, Master, error_code, free_port, wait_for};
use serde_json::{Value, json};

fn apply(api: &Api, model: &str, doc: Value) -> Value {
    let (status, v) = api.put(&format!("/api/models/{model}/net"), doc);
    assert_eq!(status, 200, "{v}");
    v
}

/// A map transition from `p-in` to `p-out` whose token is `{"v": template}`.
fn map(id: &str, template: &str) -> Value {
    json!({"id": id, "kind": "map", "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}},
           "action": {"template": {"v": template}}, "emit": [{"to": "o"}]})
}

fn start_all(api: &Api, model: &str, transitions: &[&str]) {
    for t in transitions {
        let (status, v) = api.post(&format!("/api/models/{model}/transitions/{t}/start"), json!({}));
        assert_eq!(status, 200, "{v}");
    }
}

fn put(api: &Api, model: &str, place: &str, data: Value) -> (u16, Value) {
    api.post(&format!("/api/models/{model}/places/{place}/tokens"), json!({"data": data}))
}

/// map → command (script tool) → map.
fn three_step_net() -> Value {
    json!({
        "places": ["p-in", "p-cmd", "p-res", "p-out"],
        "transitions": [
            {"id": "build", "kind": "map",
             "presets": {"input": {"place": "p-in"}}, "postsets": {"cmd": {"place": "p-cmd"}},
             "action": {"template": {"executor": "script", "command": "invoke", "args": {"toolId": "shout", "input": "${.input.data}"}}},
             "emit": [{"to": "cmd"}]},
            {"id": "run", "kind": "command",
             "presets": {"cmd": {"place": "p-cmd"}}, "postsets": {"res": {"place": "p-res"}},
             "emit": [{"to": "res"}]},
            {"id": "summarise", "kind": "map",
             "presets": {"r": {"place": "p-res"}}, "postsets": {"out": {"place": "p-out"}},
             "action": {"template": {"summary": "${.r.data.text}", "length": "${.r.data.text | length}"}},
             "emit": [{"to": "out"}]}
        ]
    })
}

#[test]
fn map_command_map_turns_an_input_into_the_output_through_a_master_restart() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let m = Master::start_full(&dir.path().join("master"), &listen, &["--lease-ms", "1500"], &[]);
    let api = m.client();
    // Slow enough that the master can be killed while the command runs.
    let script =
        "import sys,json,time\nd=json.load(sys.stdin)\ntime.sleep(1)\nprint(json.dumps({'text': d['title'].upper()}))";
    assert_eq!(api.register("shout", "python3", script, None).0, 200);
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    apply(&api, "flow", three_step_net());
    start_all(&api, "flow", &["build", "run", "summarise"]);
    assert_eq!(put(&api, "flow", "p-in", json!({"title": "hello nets"})).0, 200);

    wait_for("the command to be in flight", || {
        let (_, net) = api.get("/api/models/flow/net");
        net["transitions"][1]["inFlight"] == 1
    });
    let m = m.restart();
    let api = m.client();
    wait_for("the output token", || !api.token_data("flow", "p-out").is_empty());
    assert_eq!(api.token_data("flow", "p-out"), vec![json!({"summary": "HELLO NETS", "length": 10})]);
    for place in ["p-in", "p-cmd", "p-res"] {
        assert!(api.token_data("flow", place).is_empty(), "{place} still holds tokens");
    }
}

#[test]
fn no_token_is_lost_or_duplicated_when_the_master_is_killed_during_200_fires() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Master::start(&dir.path().join("master"));
    let doc = json!({
        "places": ["p-a", "p-b", "p-c"],
        "transitions": [
            {"id": "tag", "kind": "map", "presets": {"x": {"place": "p-a"}}, "postsets": {"y": {"place": "p-b"}},
             "action": {"template": {"n": "${.x.data.n}", "tagged": true}}, "emit": [{"to": "y"}]},
            {"id": "move", "kind": "pass", "presets": {"y": {"place": "p-b"}}, "postsets": {"z": {"place": "p-c"}},
             "emit": [{"to": "z"}]}
        ]
    });
    apply(&m.client(), "crash", doc);
    start_all(&m.client(), "crash", &["tag", "move"]);
    let mut acked = Vec::new();
    let mut n = 0u64;
    let mut seed: u64 = 0x5DEECE66D;
    while n < 200 {
        let api = m.client();
        let through = api.token_data("crash", "p-c").len();
        // A pseudo-random number of puts before the next kill: the kill lands mid-stream.
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let burst = 20 + (seed >> 33) % 40;
        for _ in 0..burst {
            if n >= 200 {
                break;
            }
            let (status, _) = put(&api, "crash", "p-a", json!({"n": n}));
            assert_eq!(status, 200);
            acked.push(n);
            n += 1;
        }
        std::thread::sleep(Duration::from_millis((seed >> 40) % 20));
        // Each run ends a fire of both transitions before it is killed: a master that dies twice
        // while the same transition's fire is under way, with none ending between, starts it
        // stopped (crash-loop protection), and under load the first fire after a start can be slow.
        wait_for("a fire of both transitions in this run", || api.token_data("crash", "p-c").len() > through);
        m = m.restart();
    }
    let api = m.client();
    wait_for("every token through", || {
        api.token_data("crash", "p-c").len() >= 200
            && api.token_data("crash", "p-a").is_empty()
            && api.token_data("crash", "p-b").is_empty()
    });
    let mut seen: Vec<u64> = api.token_data("crash", "p-c").iter().map(|d| d["n"].as_u64().unwrap()).collect();
    assert!(api.token_data("crash", "p-c").iter().all(|d| d["tagged"] == true));
    seen.sort();
    assert_eq!(seen, acked, "lost or duplicated tokens");
}

#[test]
fn a_result_no_emit_rule_matches_leaves_the_input_in_place_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    apply(
        &api,
        "route",
        json!({
            "places": ["p-in", "p-ok"],
            "transitions": [{"id": "check", "kind": "map", "presets": {"i": {"place": "p-in"}}, "postsets": {"ok": {"place": "p-ok"}},
                "action": {"template": {"ok": "${.i.data.ok}"}}, "emit": [{"to": "ok", "when": ".result.ok == true"}], "onUnmatched": "keep"}]
        }),
    );
    put(&api, "route", "p-in", json!({"ok": false}));
    let (status, o) = api.post("/api/models/route/transitions/check/fire", json!({}));
    assert_eq!(status, 200);
    assert_eq!(o["outcome"], "failed", "{o}");
    assert!(o["reason"].as_str().unwrap().contains("no emit rule matched"), "{o}");
    assert_eq!(api.token_data("route", "p-in"), vec![json!({"ok": false})]);
    assert!(api.token_data("route", "p-ok").is_empty());
    let (_, net) = api.get("/api/models/route/net");
    assert!(net["transitions"][0]["lastError"].as_str().unwrap().contains("no emit rule matched"));
    // Started, it does not spin on the token it cannot route; a routable one goes through.
    start_all(&api, "route", &["check"]);
    put(&api, "route", "p-in", json!({"ok": true}));
    wait_for("the routable token", || api.token_data("route", "p-ok").len() == 1);
    assert_eq!(api.token_data("route", "p-in"), vec![json!({"ok": false})]);
    let (_, net) = api.get("/api/models/route/net");
    assert!(net["transitions"][0]["fires"].as_u64().unwrap() >= 1);
}

#[test]
fn an_interval_scheduled_transition_fires_on_time_and_stops_when_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    apply(
        &api,
        "clock",
        json!({
            "places": ["p-ticks"],
            "transitions": [{"id": "tick", "kind": "map", "mode": "manual", "schedule": {"everyMs": 200},
                "postsets": {"t": {"place": "p-ticks"}}, "action": {"template": {"tick": true}}, "emit": [{"to": "t"}]}]
        }),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(api.token_data("clock", "p-ticks").is_empty(), "a stopped transition fired");
    let started = Instant::now();
    start_all(&api, "clock", &["tick"]);
    wait_for("five ticks", || api.token_data("clock", "p-ticks").len() >= 5);
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_millis(4000),
        "five ticks of 200 ms took {elapsed:?}"
    );
    // A tick the loop chose just before the stop is refused at its commit: none lands after
    // the stop is answered.
    api.post("/api/models/clock/transitions/tick/stop", json!({}));
    let after_stop = api.token_data("clock", "p-ticks").len();
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(api.token_data("clock", "p-ticks").len(), after_stop, "it fired after it was stopped");
}

#[test]
fn a_tool_net_of_two_scripts_runs_as_one_call_and_local_scripts_shadow_global_ones() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let step = |suffix: &str| {
        format!("import sys,json\nd=json.load(sys.stdin)\nprint(json.dumps({{'s': d['s'] + '{suffix}'}}))")
    };
    api.register("step-a", "python3", &step("-a"), Some("default"));
    api.register("step-b", "python3", &step("-b-global"), Some("default"));
    api.register("step-b", "python3", &step("-b-local"), Some("team"));
    let command = |tool: &str, from: &str| json!({"executor": "script", "command": "invoke", "args": {"toolId": tool, "input": format!("${{.{from}.data}}")}});
    let net = json!({
        "places": ["p-in", "p-c1", "p-r1", "p-c2", "p-out"],
        "transitions": [
            {"id": "a-cmd", "kind": "map", "presets": {"in": {"place": "p-in"}}, "postsets": {"o": {"place": "p-c1"}},
             "action": {"template": command("step-a", "in")}, "emit": [{"to": "o"}]},
            {"id": "a-run", "kind": "command", "presets": {"c": {"place": "p-c1"}}, "postsets": {"o": {"place": "p-r1"}}, "emit": [{"to": "o"}]},
            {"id": "b-cmd", "kind": "map", "presets": {"r": {"place": "p-r1"}}, "postsets": {"o": {"place": "p-c2"}},
             "action": {"template": command("step-b", "r")}, "emit": [{"to": "o"}]},
            {"id": "b-run", "kind": "command", "presets": {"c": {"place": "p-c2"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}
        ]
    });
    let (status, e) = api.command(
        json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": "pipeline", "name": "Pipeline", "model": "default",
        "net": net, "inputPlace": "p-in", "outputPlace": "p-out"}),
    );
    assert_eq!(status, 200, "{e}");
    assert_eq!(e["binding"]["type"], "toolnet");
    assert_eq!(api.get("/api/tool-catalog?type=toolnet").1["total"], 1);

    let (status, r) = api.invoke("pipeline", json!({"input": {"s": "x"}, "timeoutMs": 20000}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["output"], json!({"s": "x-a-b-global"}));
    let (status, r) =
        api.post("/api/tools/pipeline/invoke?model=team", json!({"input": {"s": "x"}, "timeoutMs": 20000}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["output"], json!({"s": "x-a-b-local"}), "the local step-b shadows the global one");
    // Instances are gone once they answered.
    let (_, models) = api.get("/api/models");
    assert!(
        models
            .as_array()
            .unwrap()
            .iter()
            .all(|m| !m["name"].as_str().unwrap().starts_with("tni-") || m["places"][0]["tokens"] == 0)
    );
}

/// Regression: a tool net whose step failed made its caller wait the whole timeout (120 s by
/// default), then told it "try again later" (504) with the exit status in Rust's words. A
/// failed step that leaves nothing to run now fails the call at once, as the tool failing.
#[test]
fn a_tool_net_whose_step_fails_fails_its_call_at_once_with_the_steps_error() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    api.register("boom", "sh", "echo boom >&2; exit 3", Some("default"));
    let command =
        json!({"executor": "script", "command": "invoke", "args": {"toolId": "boom", "input": "${.in.data}"}});
    let net = json!({
        "places": ["p-in", "p-c", "p-out"],
        "transitions": [
            {"id": "cmd", "kind": "map", "presets": {"in": {"place": "p-in"}}, "postsets": {"o": {"place": "p-c"}},
             "action": {"template": command}, "emit": [{"to": "o"}]},
            {"id": "run", "kind": "command", "presets": {"c": {"place": "p-c"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}
        ]
    });
    let (status, e) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": "tnfail", "name": "Fails",
        "net": net, "inputPlace": "p-in", "outputPlace": "p-out"}));
    assert_eq!(status, 200, "{e}");
    let asked = Instant::now();
    let (status, r) = api.invoke("tnfail", json!({"input": {"s": "x"}, "timeoutMs": 60000}));
    let took = asked.elapsed();
    assert_eq!(r["error"]["code"], "toolnet_failed", "{status} {r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("run: command exited with 3: boom"), "{message}");
    assert!(took < Duration::from_secs(15), "the caller waited {took:?}");
}

#[test]
fn a_tool_net_that_stalls_times_out_naming_the_place_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    // No executor: the command waits in its place.
    let net = json!({"places": ["p-in", "p-out"], "transitions": [
        {"id": "run", "kind": "command", "presets": {"c": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]});
    api.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": "stuck", "name": "Stuck", "net": net, "inputPlace": "p-in", "outputPlace": "p-out"}));
    let (status, r) =
        api.invoke("stuck", json!({"input": {"executor": "bash", "command": "true", "args": {}}, "timeoutMs": 800}));
    assert_eq!(error_code(&(status, r.clone()), 504), "toolnet_timeout");
    assert!(r["error"]["message"].as_str().unwrap().contains("p-in"), "{r}");
}

#[test]
fn an_http_transition_calls_a_real_server_with_a_credential_that_is_stored_nowhere() {
    let secret = "sekrit-canary-4242";
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 65536];
        let mut req = Vec::new();
        // Read the head and the body (small, one JSON object).
        loop {
            let n = s.read(&mut buf).unwrap();
            req.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&req);
            if let Some(head_end) = text.find("\r\n\r\n") {
                let len: usize = text[..head_end]
                    .lines()
                    .find_map(|l| l.to_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                    .unwrap_or(0);
                if req.len() >= head_end + 4 + len {
                    break;
                }
            }
        }
        let text = String::from_utf8_lossy(&req).to_string();
        let authorized =
            text.lines().any(|l| l.eq_ignore_ascii_case(&format!("authorization: Bearer {}", "sekrit-canary-4242")));
        let body = if authorized { r#"{"ok":true,"forecast":"sunny"}"# } else { r#"{"ok":false}"# };
        let status = if authorized { "200 OK" } else { "401 Unauthorized" };
        write!(s, "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).unwrap();
        text
    });
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    assert_eq!(api.put("/api/secrets/WEATHER_KEY", json!({"value": secret})).0, 200);
    let (s, v) = api.post("/api/secrets/WEATHER_KEY/grants", json!({"origin": format!("http://127.0.0.1:{port}")}));
    assert_eq!(s, 200, "{v}");
    apply(
        &api,
        "weather",
        json!({
            "places": ["p-req", "p-resp"],
            "transitions": [{"id": "call", "kind": "http", "presets": {"req": {"place": "p-req"}}, "postsets": {"o": {"place": "p-resp"}},
                "action": {"method": "POST", "url": format!("http://127.0.0.1:{port}/forecast"),
                           "headers": {"Authorization": "Bearer ${credentials.WEATHER_KEY}"},
                           "body": {"city": "${.req.data.city}"}},
                "emit": [{"to": "o"}]}]
        }),
    );
    start_all(&api, "weather", &["call"]);
    put(&api, "weather", "p-req", json!({"city": "Paris"}));
    wait_for("the response token", || !api.token_data("weather", "p-resp").is_empty());
    assert_eq!(api.token_data("weather", "p-resp"), vec![json!({"ok": true, "forecast": "sunny"})]);
    let request = server.join().unwrap();
    assert!(request.contains("\"city\":\"Paris\""), "{request}");

    // The value is nowhere: not in answers, not in the log, not on disk.
    for path in [
        "/api/models/weather/net",
        "/api/models/weather/places/p-resp/tokens",
        "/api/models/weather/places/p-req/tokens",
    ] {
        assert!(!api.get(path).1.to_string().contains(secret), "{path} shows the credential");
    }
    drop(m);
    for entry in walk(dir.path()) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{} holds the credential",
            entry.display()
        );
    }
}

/// An http transition's answer is read as a named operation's is: an endless body fails the
/// fire at 32 MiB instead of filling the master, and bytes that are not text go to the blob
/// store whole (the token is the blob's reference) instead of being mangled into a string.
#[test]
fn an_http_transition_stops_an_endless_answer_and_keeps_bytes_that_are_not_text_whole() {
    let binary: Vec<u8> = (0..10).flat_map(|_| 0..=255u8).collect();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = binary.clone();
    let server = std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Write};
        let mut written = 0usize;
        for _ in 0..2 {
            let (s, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            while {
                let mut h = String::new();
                reader.read_line(&mut h).unwrap();
                h != "\r\n"
            } {}
            let mut s = s;
            if line.contains("/endless") {
                write!(
                    s,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                .unwrap();
                let chunk = vec![b'x'; 65536];
                // Until the master hangs up.
                while write!(s, "{:x}\r\n", chunk.len())
                    .and_then(|_| s.write_all(&chunk))
                    .and_then(|_| s.write_all(b"\r\n"))
                    .is_ok()
                {
                    written += chunk.len();
                    assert!(written < 1 << 30, "the master read a gigabyte of an endless answer");
                }
            } else {
                write!(
                    s,
                    "HTTP/1.1 200 OK\r\ncontent-type: image/png\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    served.len()
                )
                .unwrap();
                s.write_all(&served).unwrap();
            }
        }
        written
    });
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let call = |id: &str, path: &str| {
        json!({"id": id, "kind": "http", "mode": "manual", "presets": {"r": {"place": format!("p-{id}")}},
               "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}],
               "action": {"method": "GET", "url": format!("http://127.0.0.1:{port}{path}"), "timeoutMs": 60000}})
    };
    apply(
        &api,
        "answers",
        json!({"places": ["p-endless", "p-binary", "p-out"], "transitions": [call("endless", "/endless"), call("binary", "/binary")]}),
    );
    for place in ["p-endless", "p-binary"] {
        put(&api, "answers", place, json!({}));
    }
    let (status, o) = api.post("/api/models/answers/transitions/endless/fire", json!({}));
    assert_eq!((status, o["outcome"].as_str()), (200, Some("started")), "{o}");
    wait_for("the endless fire to fail", || !transition(&api, "answers", "endless")["lastError"].is_null());
    let t = transition(&api, "answers", "endless");
    assert!(t["lastError"].as_str().unwrap().contains("the answer is over 33554432 bytes"), "{t}");
    let rss = resident_mib(m.child.id());
    assert!(rss < 512, "the master grew to {rss} MiB");
    let (status, o) = api.post("/api/models/answers/transitions/binary/fire", json!({}));
    assert_eq!((status, o["outcome"].as_str()), (200, Some("started")), "{o}");
    wait_for("the binary answer's token", || !api.token_data("answers", "p-out").is_empty());
    let out = api.token_data("answers", "p-out");
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0]["sizeBytes"], 2560, "{out:?}");
    assert_eq!(out[0]["sha256"], agentos_core::sha256_hex(&binary), "{out:?}");
    let (status, bytes) = api.get_bytes(&format!("/api/blobs/{}", out[0]["urn"].as_str().unwrap()));
    assert_eq!((status, bytes), (200, binary), "the blob holds the answer as it came");
    let written = server.join().unwrap();
    assert!(written < 64 << 20, "the master read {written} bytes of the endless answer");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

#[test]
fn bad_definitions_are_refused_with_the_path_in_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let check = |doc: Value, path: &str, words: &str| {
        let (status, v) = api.put("/api/models/bad/net", doc);
        assert_eq!(status, 400, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(path) && msg.contains(words), "expected {path} / {words} in: {msg}");
    };
    let t = |extra: Value| {
        let mut base = json!({"id": "t", "kind": "map", "presets": {"i": {"place": "p-a"}}, "postsets": {"o": {"place": "p-b"}},
            "action": {"template": {"x": 1}}, "emit": [{"to": "o"}]});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        json!({"places": ["p-a", "p-b"], "transitions": [base]})
    };
    check(t(json!({"presets": {"i": {"place": "p-nowhere"}}})), "/transitions/0/presets/i/place", "unknown place");
    check(t(json!({"postsets": {"o": {"place": "p-dangling"}}})), "/transitions/0/postsets/o/place", "dangling arc");
    check(t(json!({"action": {"template": {"x": "${.a +}"}}})), "/transitions/0/action/template/x", "bad expression");
    check(
        t(json!({"presets": {"i": {"place": "p-a", "filter": ".data |||"}}})),
        "/transitions/0/presets/i/filter",
        "bad expression",
    );
    check(t(json!({"kind": "teleport"})), "/transitions/0/kind", "unknown kind");
    check(t(json!({"kind": "llm"})), "/transitions/0/kind", "not supported yet");
    check(t(json!({"emit": [{"to": "o", "when": ".result.ok"}]})), "/transitions/0/emit", "missing catch-all");
    check(t(json!({"emit": [{"to": "nope"}]})), "/transitions/0/emit/0/to", "not a postset");
    check(t(json!({"schedule": {"cron": "every tuesday"}})), "/transitions/0/schedule/cron", "bad cron");
    // 30 February: it used to fire every second.
    check(t(json!({"schedule": {"cron": "0 0 0 30 2 *"}})), "/transitions/0/schedule/cron", "never comes due");
    check(json!({"places": ["p-a"], "transitions": [], "surprise": 1}), "surprise", "unknown field");
    let (_, models) = api.get("/api/models");
    assert!(models.as_array().unwrap().iter().all(|m| m["name"] != "bad"), "a refused net created its model");
}

#[test]
fn links_are_listed_from_both_ends_and_never_fire() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    apply(&api, "other", json!({"places": ["p-inbox"]}));
    apply(
        &api,
        "home",
        json!({"places": ["p-outbox"], "transitions": [
        {"id": "feeds", "kind": "link", "from": {"place": "p-outbox"}, "to": {"model": "other", "place": "p-inbox"}, "relation": "feeds"}]}),
    );
    for model in ["home", "other"] {
        let (status, links) = api.get(&format!("/api/models/{model}/links"));
        assert_eq!(status, 200);
        assert_eq!(links.as_array().unwrap().len(), 1, "{model}: {links}");
        assert_eq!(links[0]["relation"], "feeds");
        assert_eq!(links[0]["to"]["model"], "other");
    }
    put(&api, "home", "p-outbox", json!({"x": 1}));
    assert_eq!(api.post("/api/models/home/transitions/feeds/fire", json!({})).0, 400);
    assert_eq!(api.token_data("home", "p-outbox").len(), 1);
    // Nor is it started: a start promises fires (it answered "started" and said so for ever).
    let (status, v) = api.post("/api/models/home/transitions/feeds/start", json!({}));
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("not_firing")), "{v}");
    let (_, view) = api.get("/api/models/home/net");
    let feeds = view["transitions"].as_array().unwrap().iter().find(|t| t["id"] == "feeds").unwrap().clone();
    assert_eq!(feeds["started"], false, "{view}");
}

#[test]
fn a_changed_inscription_stops_its_transition_and_watch_streams_changes() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let net = |tagged: bool| {
        json!({"places": ["p-a", "p-b", "p-c"], "transitions": [
        {"id": "t", "kind": "map", "presets": {"i": {"place": "p-a"}}, "postsets": {"o": {"place": "p-b"}},
         "action": {"template": {"tagged": tagged}}, "emit": [{"to": "o"}]},
        {"id": "u", "kind": "pass", "presets": {"i": {"place": "p-b"}}, "postsets": {"o": {"place": "p-c"}}, "emit": [{"to": "o"}]}]})
    };
    apply(&api, "w", net(true));
    start_all(&api, "w", &["t", "u"]);
    let (_, v) = apply_and_get(&api, net(true));
    assert!(
        v["transitions"].as_array().unwrap().iter().all(|t| t["started"] == true),
        "an unchanged net keeps its run state: {v}"
    );
    let (_, v) = apply_and_get(&api, net(false));
    assert_eq!(v["transitions"][0]["started"], false, "the changed one stops: {v}");
    assert_eq!(v["transitions"][1]["started"], true, "the unchanged one runs on: {v}");

    // A model that was never made is not found, rather than watched or listed as empty.
    for what in ["watch", "links"] {
        let (status, v) = api.get(&format!("/api/models/no-such-model/{what}"));
        assert_eq!(status, 404, "{what}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("no model \"no-such-model\""), "{v}");
    }
    assert_eq!(api.get("/api/models/w/links").0, 200, "a made model with no links lists none");

    // The event stream shows a put as it is committed.
    let resp = api
        .http
        .get(format!("{}/api/models/w/watch", api.url))
        .bearer_auth(api.token.as_ref().unwrap())
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    put(&api, "w", "p-a", json!({"hello": "stream"}));
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(resp);
    let mut line = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line.starts_with("data:") && line.contains("\"hello\":\"stream\"") {
            break;
        }
        assert!(Instant::now() < deadline, "no event in the stream");
    }
}

fn apply_and_get(api: &Api, doc: Value) -> (u16, Value) {
    apply(api, "w", doc);
    api.get("/api/models/w/net")
}

#[test]
fn a_command_goes_to_the_named_executor_with_its_credential_which_no_token_keeps() {
    let secret = "cmd-secret-5150";
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    // A secret goes only to a registered script the operator granted it to.
    assert_eq!(api.put("/api/secrets/DEPLOY_KEY", json!({"value": secret})).0, 200);
    assert_eq!(api.register("deploy", "sh", "echo \"len=${#DEPLOY_KEY} value=$DEPLOY_KEY\"", Some("default")).0, 200);
    let (s, v) = api.post("/api/secrets/DEPLOY_KEY/grants", json!({"tool": "deploy"}));
    assert_eq!(s, 200, "{v}");
    let _a = Executor::start(&m, &dir.path().join("a"), "exec-a", &[]);
    let _b = Executor::start(&m, &dir.path().join("b"), "exec-b", &[]);
    apply(
        &api,
        "cmds",
        json!({
            "places": ["p-cmd", "p-out"],
            "transitions": [{"id": "run", "kind": "command", "presets": {"c": {"place": "p-cmd"}}, "postsets": {"o": {"place": "p-out"}},
                "action": {"executor": "exec-b", "credentials": ["DEPLOY_KEY"]}, "emit": [{"to": "o", "from": "@response"}]}]
        }),
    );
    start_all(&api, "cmds", &["run"]);
    for _ in 0..3 {
        put(&api, "cmds", "p-cmd", json!({"executor": "script", "command": "invoke", "args": {"toolId": "deploy"}}));
    }
    wait_for("three results", || api.token_data("cmds", "p-out").len() == 3);
    for r in api.token_data("cmds", "p-out") {
        assert_eq!(r["executor"], "exec-b", "{r}");
        assert_eq!(r["stdout"], format!("len={} value=[redacted]\n", secret.len()), "{r}");
    }
    let (_, events) = api.get("/api/events?limit=1000");
    assert!(!events.to_string().contains(secret));
}

/// Regression: mimalloc reserved 1 GiB of address space at its first allocation, and a master
/// under `ulimit -v` of 1.25 GiB then had too little left to start the expression compiler's
/// thread: every net with an expression was refused (a lower limit made mimalloc reserve less,
/// and passed).
#[test]
fn a_master_under_an_address_space_limit_takes_and_fires_nets_with_expressions() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_address_limited(dir.path(), 1_310_720);
    let api = m.client();
    apply(
        &api,
        "lim",
        json!({"places": ["p-in", "p-out"], "transitions": [
            {"id": "t", "kind": "map", "presets": {"i": {"place": "p-in", "filter": ".data.n > 1"}},
             "postsets": {"o": {"place": "p-out"}}, "action": {"template": {"v": "${.i.data.n + 1}"}}, "emit": [{"to": "o"}]},
        ]}),
    );
    put(&api, "lim", "p-in", json!({"n": 2}));
    let (status, o) = api.post("/api/models/lim/transitions/t/fire", json!({}));
    assert_eq!((status, o["outcome"].as_str()), (200, Some("fired")), "{o}");
    assert_eq!(api.token_data("lim", "p-out"), vec![json!({"v": 3})]);
}

/// Regression: under an allocator that reserves address space ahead and keeps it, a worker that
/// had once built a large value kept most of its 1 GiB cap, and every expression it had not
/// compiled yet failed ("cannot start the expression compiler") until the master restarted.
#[test]
fn an_expression_worker_that_built_a_large_value_still_compiles_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(dir.path(), &["--expr-timeout-ms", "20000"]);
    let api = m.client();
    apply(
        &api,
        "big",
        json!({"places": ["p-in", "p-out"], "transitions": [
            // 128 MiB, then 256 MiB: both fit in a worker's 1 GiB.
            map("m128", "${\"x\" * 134217728 | length}"),
            map("m256", "${\"x\" * 268435456 | length}"),
            map("fresh1", "${.i.data.n + 1}"),
            map("fresh2", "${.i.data.n * 10}"),
        ]}),
    );
    // One fire at a time: the same worker, kept idle between them, answers each.
    for (t, v) in [("m128", 134217728), ("fresh1", 2), ("m256", 268435456), ("fresh2", 10)] {
        put(&api, "big", "p-in", json!({"n": 1}));
        let (status, o) = api.post(&format!("/api/models/big/transitions/{t}/fire"), json!({}));
        assert_eq!((status, o["outcome"].as_str()), (200, Some("fired")), "{t}: {o}");
        assert!(api.token_data("big", "p-out").contains(&json!({"v": v})), "{t}");
    }
}

#[test]
fn an_expression_that_recurses_deep_or_spins_fails_its_fire_and_the_master_lives_on() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(dir.path(), &["--expr-timeout-ms", "500"]);
    let api = m.client();
    apply(
        &api,
        "jq",
        json!({"places": ["p-in", "p-out"], "transitions": [
            // Recursion that is not a tail call, and a value a million levels deep: each
            // overflows the stack of whatever process evaluates it.
            map("deep", "${def f: 1 + f; f}"),
            map("nested", "${reduce range(1000000) as $i ([]; [.]) | tojson | length}"),
            // Tail recursion: spins for ever.
            map("spin", "${def f: f; f}"),
            map("fine", "${.i.data.n + 1}"),
        ]}),
    );
    put(&api, "jq", "p-in", json!({"n": 1}));
    // The deep value is built in a loop: depending on the build's speed it is stopped by its
    // time limit or overflows its worker's stack first.
    let died = ["stopped its evaluator"];
    let either = ["stopped its evaluator", "longer than 500 ms"];
    let slow = ["longer than 500 ms"];
    for (t, why) in [("deep", &died[..]), ("nested", &either[..]), ("spin", &slow[..])] {
        let (status, o) = api.post(&format!("/api/models/jq/transitions/{t}/fire"), json!({}));
        assert_eq!(status, 200, "{t}: {o}");
        assert_eq!(o["outcome"], "failed", "{t}: {o}");
        let reason = o["reason"].as_str().unwrap();
        assert!(why.iter().any(|w| reason.contains(w)), "{t}: {o}");
    }
    // Deep nesting in the source is compiled on a stack made for it; past the length limit the
    // definition is refused. Either way the master answers.
    let deep = format!("${{{}.n{}}}", "(".repeat(4000), ")".repeat(4000));
    let (status, v) =
        api.put("/api/models/jq/net", json!({"places": ["p-in", "p-out"], "transitions": [map("parens", &deep)]}));
    assert_eq!(status, 200, "{v}");
    let long = format!("${{{}}}", vec!["."; 9000].join("|"));
    let (status, v) =
        api.put("/api/models/jq2/net", json!({"places": ["p-in", "p-out"], "transitions": [map("long", &long)]}));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("at most 16384"), "{v}");
    apply(
        &api,
        "jq",
        json!({"places": ["p-in", "p-out"], "transitions": [map("deep", "${def f: 1 + f; f}"), map("fine", "${.i.data.n + 1}")]}),
    );

    // The master lives on, the token is still there, and a sound expression runs.
    let (status, o) = api.post("/api/models/jq/transitions/fine/fire", json!({}));
    assert_eq!((status, o["outcome"].as_str()), (200, Some("fired")), "{o}");
    assert_eq!(api.token_data("jq", "p-out"), vec![json!({"v": 2})]);
}

/// A map that reads its whole place without consuming it and emits every token back: the place
/// doubles on each fire.
fn doubling_net(every_ms: u64) -> Value {
    json!({"places": ["p"], "transitions": [
        {"id": "double", "kind": "map", "schedule": {"everyMs": every_ms},
         "presets": {"all": {"place": "p", "take": "all", "consume": false}}, "postsets": {"back": {"place": "p"}},
         "action": {"template": {}}, "emit": [{"to": "back", "from": "@input.all"}]}]})
}

fn transition(api: &Api, model: &str, id: &str) -> Value {
    let (status, net) = api.get(&format!("/api/models/{model}/net"));
    assert_eq!(status, 200, "{net}");
    net["transitions"].as_array().unwrap().iter().find(|t| t["id"] == id).cloned().unwrap()
}

fn resident_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024
}

#[test]
fn a_doubling_net_stops_at_a_limit_with_the_reason_and_stays_stopped_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    apply(&api, "grow", doubling_net(20));
    assert_eq!(put(&api, "grow", "p", json!({"n": 1})).0, 200);
    start_all(&api, "grow", &["double"]);
    wait_for("the transition to stop", || transition(&api, "grow", "double")["started"] == false);
    let t = transition(&api, "grow", "double");
    let reason = t["lastError"].as_str().unwrap_or_default().to_string();
    // 1, 2, 4 … 1024 tokens: the fire that would emit 1,024 at once is over the default 1,000.
    assert!(reason.contains("--max-outputs-per-fire"), "{t}");
    assert_eq!(api.token_data("grow", "p").len(), 1024);
    let rss = resident_mib(m.child.id());
    assert!(rss < 256, "the master grew to {rss} MiB");

    let m = m.restart();
    let api = m.client();
    let t = transition(&api, "grow", "double");
    assert_eq!((t["started"].as_bool(), t["lastError"].as_str()), (Some(false), Some(reason.as_str())), "{t}");
    let fires = t["fires"].clone();
    // The schedule (every 20 ms) would have fired it many times by now had it started.
    wait_for("a few schedule periods", || {
        let net = api.get("/api/models/grow/net").1;
        net["transitions"][0]["fires"] == fires
    });
    assert_eq!(api.token_data("grow", "p").len(), 1024);
}

#[test]
fn the_limits_refuse_puts_and_stop_a_transition_that_exceeds_them() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--max-tokens-per-place", "100", "--max-token-bytes", "1000", "--max-fires-per-second", "5"];
    let m = Master::start_with(dir.path(), &flags);
    let api = m.client();
    // Slow enough to stay under 5 fires a second.
    apply(&api, "grow", doubling_net(300));
    put(&api, "grow", "p", json!({"n": 1}));
    start_all(&api, "grow", &["double"]);
    wait_for("the transition to stop", || transition(&api, "grow", "double")["started"] == false);
    let t = transition(&api, "grow", "double");
    assert!(t["lastError"].as_str().unwrap().contains("would hold 128 tokens, more than 100"), "{t}");
    assert_eq!(api.token_data("grow", "p").len(), 64);
    for _ in 64..100 {
        assert_eq!(put(&api, "grow", "p", json!({})).0, 200);
    }
    assert_eq!(error_code(&put(&api, "grow", "p", json!({})), 409), "place_full");
    assert_eq!(error_code(&put(&api, "grow", "p", json!({"s": "x".repeat(1000)})), 413), "token_too_large");

    // A pass that feeds its own place fires without end: past 5 fires in a second it stops.
    apply(
        &api,
        "loop",
        json!({"places": ["p"], "transitions": [{"id": "spin", "kind": "pass",
            "presets": {"i": {"place": "p"}}, "postsets": {"o": {"place": "p"}}, "emit": [{"to": "o"}]}]}),
    );
    put(&api, "loop", "p", json!({}));
    start_all(&api, "loop", &["spin"]);
    wait_for("the loop to stop", || transition(&api, "loop", "spin")["started"] == false);
    let t = transition(&api, "loop", "spin");
    assert!(t["lastError"].as_str().unwrap().contains("more than 5 fires within one second"), "{t}");
    assert_eq!(api.token_data("loop", "p").len(), 1, "the loop lost or doubled its token");
}

#[test]
fn a_fire_is_refused_while_the_master_is_above_its_memory_cap() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(dir.path(), &["--max-memory-mb", "1"]);
    let api = m.client();
    apply(
        &api,
        "mem",
        json!({"places": ["p-in", "p-out"], "transitions": [{"id": "move", "kind": "pass",
            "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]}),
    );
    put(&api, "mem", "p-in", json!({"n": 1}));
    let (status, o) = api.post("/api/models/mem/transitions/move/fire", json!({}));
    assert_eq!(status, 200, "{o}");
    assert_eq!(o["outcome"], "failed", "{o}");
    assert!(o["reason"].as_str().unwrap().contains("above its cap of 1 MiB"), "{o}");
    assert_eq!(api.token_data("mem", "p-in"), vec![json!({"n": 1})]);
}

#[test]
fn a_transition_firing_at_two_deaths_in_a_row_starts_stopped() {
    // An http server that takes requests and never answers: the fire is under way until the kill.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in server.incoming() {
            if tx.send(conn).is_err() {
                return;
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let mut m = Master::start(dir.path());
    let api = m.client();
    apply(
        &api,
        "hang",
        json!({"places": ["p-in", "p-out"], "transitions": [{"id": "call", "kind": "http",
            "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}},
            "action": {"method": "GET", "url": format!("http://127.0.0.1:{port}/"), "timeoutMs": 60000},
            "emit": [{"to": "o"}]}]}),
    );
    start_all(&api, "hang", &["call"]);
    put(&api, "hang", "p-in", json!({"n": 1}));
    let mut held = Vec::new();
    for death in 1..=2 {
        // The first request, then the one the restarted master sends again for the fire in flight.
        held.push(rx.recv_timeout(Duration::from_secs(20)).expect("the http request"));
        m = m.restart();
        let t = transition(&m.client(), "hang", "call");
        if death == 1 {
            assert_eq!(t["started"], true, "one death is not a loop: {t}");
        }
    }
    let api = m.client();
    let t = transition(&api, "hang", "call");
    assert_eq!(t["started"], false, "{t}");
    assert_eq!(t["inFlight"], 0, "{t}");
    assert!(t["lastError"].as_str().unwrap().contains("died 2 times in a row"), "{t}");
    // The way out it names: the inputs are parked, and released one by one.
    assert!(t["lastError"].as_str().unwrap().contains("agentos net retry TOKEN --model hang"), "{t}");
    assert_eq!(api.token_data("hang", "p-in"), vec![json!({"n": 1})]);
    drop(held);
}

#[test]
fn finished_tool_net_instances_leave_no_model_behind() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let net = json!({"places": ["p-in", "p-out"], "transitions": [
        {"id": "move", "kind": "pass", "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]});
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": "echo", "name": "Echo", "net": net, "inputPlace": "p-in", "outputPlace": "p-out"}));
    assert_eq!(status, 200, "{v}");
    for i in 0..20 {
        let (status, r) = api.invoke("echo", json!({"input": {"i": i}, "timeoutMs": 10000}));
        assert_eq!(status, 200, "{r}");
    }
    let instances = |api: &Api| {
        let (_, models) = api.get("/api/models");
        models.as_array().unwrap().iter().filter(|m| m["name"].as_str().unwrap().starts_with("tni-")).count()
    };
    assert_eq!(instances(&api), 0);
    let m = m.restart();
    assert_eq!(instances(&m.client()), 0, "instances came back from the log");
}

#[test]
fn a_poison_token_among_a_hundred_lands_in_the_error_place_after_its_attempts_through_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    apply(
        &api,
        "work",
        json!({"places": ["p-in", "p-out", "p-err"], "transitions": [{"id": "inc", "kind": "map",
            "presets": {"i": {"place": "p-in"}}, "postsets": {"out": {"place": "p-out"}, "err": {"place": "p-err"}},
            "action": {"template": {"n": "${.i.data.n}", "next": "${.i.data.n + 1}"}},
            "retry": {"maxAttempts": 3, "backoffMs": 100}, "onError": {"to": "err"},
            "emit": [{"to": "out"}]}]}),
    );
    start_all(&api, "work", &["inc"]);
    for n in 0..50 {
        assert_eq!(put(&api, "work", "p-in", json!({"n": n})).0, 200);
    }
    // A string plus a number fails the template on every attempt.
    assert_eq!(put(&api, "work", "p-in", json!({"n": "poison"})).0, 200);
    let m = m.restart();
    let api = m.client();
    for n in 50..100 {
        assert_eq!(put(&api, "work", "p-in", json!({"n": n})).0, 200);
    }
    wait_for("every token through", || {
        api.token_data("work", "p-out").len() >= 100 && !api.token_data("work", "p-err").is_empty()
    });
    let mut seen: Vec<u64> = api.token_data("work", "p-out").iter().map(|d| d["n"].as_u64().unwrap()).collect();
    seen.sort();
    assert_eq!(seen, (0..100).collect::<Vec<_>>(), "lost or duplicated answers");
    let errors = api.token_data("work", "p-err");
    assert_eq!(errors.len(), 1, "{errors:?}");
    let e = &errors[0];
    assert_eq!((e["attempts"].as_u64(), e["transition"].as_str()), (Some(3), Some("inc")), "{e}");
    assert_eq!(e["input"]["i"]["data"]["n"], "poison", "{e}");
    assert!(e["error"].as_str().unwrap().contains("the template failed"), "{e}");
    assert!(api.token_data("work", "p-in").is_empty());
    assert_eq!(api.get("/api/models/work/parked").1, json!([]));
}

#[test]
fn a_parked_token_is_listed_with_its_reason_then_retried_or_discarded_by_id() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    // The rule reads `.v` at the top, where a rule sees {result, response, input}.
    apply(
        &api,
        "park",
        json!({"places": ["p-in", "p-big"], "transitions": [{"id": "sort", "kind": "pass",
            "presets": {"x": {"place": "p-in"}}, "postsets": {"big": {"place": "p-big"}},
            "emit": [{"to": "big", "when": ".v > 10"}], "onUnmatched": "keep"}]}),
    );
    start_all(&api, "park", &["sort"]);
    put(&api, "park", "p-in", json!({"v": 11}));
    wait_for("the token to park", || !api.get("/api/models/park/parked").1.as_array().unwrap().is_empty());
    let (_, parked) = api.get("/api/models/park/parked?transition=sort");
    let p = &parked[0];
    assert_eq!(
        (p["transition"].as_str(), p["place"].as_str(), p["attempts"].as_u64()),
        (Some("sort"), Some("p-in"), Some(1))
    );
    let reason = p["reason"].as_str().unwrap();
    assert!(
        reason.contains(
            "`.v` is null here; rules see {result, response, input}: did you mean `.result.v` or `.input.x.data.v`?"
        ),
        "{reason}"
    );
    let id = p["token"]["id"].as_str().unwrap().to_string();
    assert_eq!(error_code(&api.get("/api/models/park/parked?transition=nope"), 404), "not_found");

    // The CLI lists the same.
    let out = std::process::Command::new(common::BIN)
        .args(["net", "parked", "sort", "--model", "park", "--url", &m.url, "--token", &m.token])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(&id) && text.contains("did you mean"), "{text}");

    // Retried: it binds again (and parks again, the rule being still wrong).
    let (status, v) = api.post(&format!("/api/models/park/parked/{id}/retry"), json!({}));
    assert_eq!(status, 200, "{v}");
    wait_for("the retried token to park again", || {
        let (_, events) = api.get("/api/events?limit=1000");
        let failed = events["events"]
            .as_array()
            .or(events.as_array())
            .map(|e| e.iter().filter(|e| e.to_string().contains("fireFailed")).count())
            .unwrap_or(0);
        failed >= 2
    });
    // Discarded: the token is gone, with an event.
    let (status, v) = api.post(&format!("/api/models/park/parked/{id}/discard"), json!({}));
    assert_eq!(status, 200, "{v}");
    assert!(api.token_data("park", "p-in").is_empty());
    assert_eq!(api.get("/api/models/park/parked").1, json!([]));
    assert_eq!(error_code(&api.post(&format!("/api/models/park/parked/{id}/retry"), json!({})), 404), "not_found");
}

#[test]
fn a_filter_binds_the_tokens_it_is_true_for_and_names_the_token_it_fails_on() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    apply(
        &api,
        "pick",
        json!({"places": ["p-in", "p-out"], "transitions": [{"id": "big", "kind": "map", "mode": "manual",
            "presets": {"xs": {"place": "p-in", "take": "all", "limit": 2, "filter": "(.data.n + 0) > 5 # a comment"}},
            "postsets": {"o": {"place": "p-out"}},
            "action": {"template": {"picked": "${[.xs[].data.n]}"}}, "emit": [{"to": "o"}]}]}),
    );
    for n in [1, 7, 3, 9, 8] {
        put(&api, "pick", "p-in", json!({"n": n}));
    }
    let (_, o) = api.post("/api/models/pick/transitions/big/fire", json!({}));
    assert_eq!(o["outcome"], "fired", "{o}");
    assert_eq!(api.token_data("pick", "p-out"), vec![json!({"picked": [7, 9]})]);
    let mut left: Vec<i64> = api.token_data("pick", "p-in").iter().map(|d| d["n"].as_i64().unwrap()).collect();
    left.sort();
    assert_eq!(left, vec![1, 3, 8]);
    // A filter that fails on one token says which.
    let (_, t) = put(&api, "pick", "p-in", json!({"n": {"not": "a number"}}));
    let (_, o) = api.post("/api/models/pick/transitions/big/fire", json!({}));
    assert_eq!(o["outcome"], "not-enabled", "{o}");
    let reason = o["reason"].as_str().unwrap();
    assert!(reason.contains("filter failed on token") && reason.contains(t["id"].as_str().unwrap()), "{reason}");
}

#[test]
fn the_catalog_is_read_only_tokens_of_p_tool_catalog_that_a_net_reads_with_a_read_arc() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    api.register("alpha", "sh", "echo a", Some("cat"));
    api.register("beta", "sh", "echo b", Some("cat"));
    let net = json!({"places": ["p-a", "p-b"], "transitions": []});
    let (s, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": "gamma", "name": "gamma",
        "model": "cat", "net": net, "inputPlace": "p-a", "outputPlace": "p-b"}));
    assert_eq!(s, 200, "{v}");

    // Served as tokens, filtered by the reader's flags like search.
    let (s, tokens) = api.get("/api/models/cat/places/p-tool-catalog/tokens");
    assert_eq!(s, 200, "{tokens}");
    let names: Vec<&str> = tokens.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alpha", "beta", "gamma"], "{tokens}");
    assert_eq!(tokens[0]["data"]["binding"]["type"], "script");
    let (s, v) = api.post("/api/agents", json!({"name": "reader", "flags": "r--------s", "model": "cat"}));
    assert_eq!(s, 200, "{v}");
    let reader = api.with_token(v["token"].as_str());
    let (_, seen) = reader.get("/api/models/cat/places/p-tool-catalog/tokens");
    assert_eq!(seen.as_array().unwrap().len(), 2, "a scripts-only reader sees no tool net: {seen}");
    // Pages of it, counted after the reader's flags (the operator sees every kind).
    let page = |token: &str, query: &str| {
        let res = reqwest::blocking::Client::new()
            .get(format!("{}/api/models/cat/places/p-tool-catalog/tokens?{query}", m.url))
            .bearer_auth(token)
            .send()
            .unwrap();
        let total = res.headers().get("x-total-count").unwrap().to_str().unwrap().to_string();
        let names: Vec<String> = res
            .json::<Value>()
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().into())
            .collect();
        (total, names)
    };
    assert_eq!(page(v["token"].as_str().unwrap(), "offset=1&limit=1"), ("2".into(), vec!["beta".into()]));
    assert_eq!(page(v["token"].as_str().unwrap(), "offset=2&limit=5"), ("2".into(), vec![]));
    assert_eq!(page(&m.token, "offset=1&limit=5"), ("3".into(), vec!["beta".into(), "gamma".into()]));
    assert_eq!(page(&m.token, "offset=7"), ("3".into(), vec![]));

    // Read-only: no put, no consuming arc, no output into it.
    let (s, v) = put(&api, "cat", "p-tool-catalog", json!({"id": "forged"}));
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["code"], "read_only_place");
    let arc = |consume: bool, to_catalog: bool| {
        json!({"places": ["p-go", "p-out"], "transitions": [{"id": "count", "kind": "map",
            "presets": {"go": {"place": "p-go"},
                        "cat": {"place": "p-tool-catalog", "take": "all", "consume": consume,
                                "filter": ".data.binding.type == \"script\""}},
            "postsets": {"o": {"place": if to_catalog { "p-tool-catalog" } else { "p-out" }}},
            "action": {"template": {"n": "${.cat | length}", "ids": "${[.cat[].name]}"}},
            "emit": [{"to": "o"}]}]})
    };
    assert_eq!(api.put("/api/models/cat/net", arc(true, false)).0, 400);
    assert_eq!(api.put("/api/models/cat/net", arc(false, true)).0, 400);

    // A net reads the catalog with a read arc and a filter; the catalog is unchanged after.
    apply(&api, "cat", arc(false, false));
    start_all(&api, "cat", &["count"]);
    assert_eq!(put(&api, "cat", "p-go", json!({})).0, 200);
    wait_for("the count", || !api.token_data("cat", "p-out").is_empty());
    assert_eq!(api.token_data("cat", "p-out"), vec![json!({"n": 2, "ids": ["alpha", "beta"]})]);
    assert_eq!(api.get("/api/models/cat/places/p-tool-catalog/tokens").1.as_array().unwrap().len(), 3);
}

/// A fire builds only the catalog tokens its presets can bind (it used to build every entry of
/// the catalog, three times a fire): several catalog presets each bind their own, in order.
#[test]
fn catalog_presets_bind_the_first_entries_each_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    for id in ["a1", "a2", "a3", "a4", "a5"] {
        api.register(id, "sh", "echo", Some("cat"));
    }
    let read = |take: &str, limit: Option<usize>| {
        let mut p = json!({"place": "p-tool-catalog", "take": take, "consume": false});
        if let Some(l) = limit {
            p["limit"] = json!(l);
        }
        p
    };
    let doc = json!({"places": ["p-go", "p-out"], "transitions": [{"id": "pick", "kind": "map",
        "presets": {"go": {"place": "p-go"}, "one": read("first", None), "some": read("all", Some(2)),
                    "two": read("first", None)},
        "postsets": {"o": {"place": "p-out"}},
        "action": {"template": {"one": "${.one.name}", "some": "${[.some[].name]}", "two": "${.two.name}"}},
        "emit": [{"to": "o"}]}]});
    let (s, v) = api.post("/api/agents", json!({"name": "author", "flags": "rwx------s", "model": "cat"}));
    assert_eq!(s, 200, "{v}");
    let as_author = api.with_token(v["token"].as_str());
    let (s, v) = as_author.put("/api/models/cat/net", doc);
    assert_eq!(s, 200, "{v}");
    assert_eq!(put(&as_author, "cat", "p-go", json!({})).0, 200);
    let (_, o) = as_author.post("/api/models/cat/transitions/pick/fire", json!({}));
    assert_eq!(o["outcome"], "fired", "{o}");
    assert_eq!(api.token_data("cat", "p-out"), vec![json!({"one": "a1", "some": ["a2", "a3"], "two": "a4"})]);
}

/// The events the operator reads, up to the first 1000.
fn events(api: &Api) -> Vec<Value> {
    let (status, page) = api.get("/api/events?limit=1000");
    assert_eq!(status, 200, "{page}");
    page["events"].as_array().or(page.as_array()).cloned().unwrap_or_default()
}

fn instances(api: &Api) -> Vec<String> {
    let (_, models) = api.get("/api/models");
    models
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str().filter(|n| n.starts_with("tni-")).map(str::to_string))
        .collect()
}

fn register_toolnet(api: &Api, id: &str, net: Value) {
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": id, "name": id,
        "net": net, "inputPlace": "p-in", "outputPlace": "p-out"}));
    assert_eq!(status, 200, "{v}");
}

fn nested(levels: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..levels {
        v = json!([v]);
    }
    v
}

#[test]
fn a_master_killed_during_a_tool_net_invocation_leaves_no_instance_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    // No executor: the command waits in its place, and the invocation with it.
    register_toolnet(
        &api,
        "stuck",
        json!({"places": ["p-in", "p-out"], "transitions": [
            {"id": "run", "kind": "command", "presets": {"c": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]}),
    );
    let caller = api.clone();
    let call = std::thread::spawn(move || {
        // Its connection drops with the master: any answer, or none, will do.
        let _ = caller
            .http
            .post(format!("{}/api/tools/stuck/invoke", caller.url))
            .bearer_auth(caller.token.as_deref().unwrap())
            .json(&json!({"input": {"executor": "bash", "command": "true", "args": {}}, "timeoutMs": 60000}))
            .send();
    });
    wait_for("the instance to exist", || instances(&api).len() == 1);
    let instance = instances(&api)[0].clone();
    let m = m.restart();
    call.join().unwrap();
    let api = m.client();
    assert_eq!(instances(&api), Vec::<String>::new(), "the instance outlived its master");
    let deleted = events(&api).into_iter().any(|e| e["model"] == instance.as_str() && e["payload"] == "deleted");
    assert!(deleted, "no Deleted event for {instance}: {:?}", events(&api));
    // The master still runs tool nets after the sweep.
    register_toolnet(
        &api,
        "echo",
        json!({"places": ["p-in", "p-out"], "transitions": [
            {"id": "move", "kind": "pass", "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]}),
    );
    let (status, r) = api.invoke("echo", json!({"input": {"n": 1}, "timeoutMs": 10000}));
    assert_eq!((status, &r["output"]), (200, &json!({"n": 1})), "{r}");
}

/// Regression: a caller that gave up on a tool net (its connection closed) left the instance
/// behind, its steps running and its transitions started, until the master's next start.
#[test]
fn a_tool_net_whose_caller_goes_away_leaves_no_instance() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    // No executor: the command waits in its place, and the invocation with it.
    register_toolnet(
        &api,
        "stuck",
        json!({"places": ["p-in", "p-out"], "transitions": [
            {"id": "run", "kind": "command", "presets": {"c": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]}),
    );
    let gone = api
        .http
        .post(format!("{}/api/tools/stuck/invoke", api.url))
        .bearer_auth(api.token.as_deref().unwrap())
        .timeout(std::time::Duration::from_millis(1500))
        .json(&json!({"input": {"executor": "bash", "command": "true", "args": {}}, "timeoutMs": 60000}))
        .send();
    assert!(gone.is_err(), "the call answered: {gone:?}");
    wait_for("the abandoned instance to go", || instances(&api).is_empty());
    let deleted = events(&api).into_iter().filter(|e| e["payload"] == "deleted").count();
    assert_eq!(deleted, 1, "{:?}", events(&api));
}

#[test]
fn a_tool_net_input_is_held_to_the_token_limits_of_a_put() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(dir.path(), &["--max-token-bytes", "1000"]);
    let api = m.client();
    register_toolnet(
        &api,
        "echo",
        json!({"places": ["p-in", "p-out"], "transitions": [
            {"id": "move", "kind": "pass", "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]}),
    );
    apply(&api, "plain", json!({"places": ["p"], "transitions": []}));
    let big = json!({"s": "x".repeat(2000)});
    for (input, status, code) in
        [(nested(101), 400, "too_deep"), (nested(119), 400, "too_deep"), (big, 413, "token_too_large")]
    {
        let invoked = api.invoke("echo", json!({"input": input, "timeoutMs": 10000}));
        let put = put(&api, "plain", "p", input);
        assert_eq!(error_code(&invoked, status), code, "{}", invoked.1);
        assert_eq!(invoked.1["error"]["message"], put.1["error"]["message"], "a put and an invocation say the same");
    }
    assert!(
        events(&api).iter().all(|e| !e["model"].as_str().unwrap_or("").starts_with("tni-")),
        "an instance was made"
    );
    // At the limits it runs.
    let (status, r) = api.invoke("echo", json!({"input": nested(99), "timeoutMs": 10000}));
    assert_eq!((status, &r["output"]), (200, &nested(99)), "{r}");
}

#[test]
fn an_error_token_the_limits_would_refuse_leaves_its_inputs_parked_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(dir.path(), &["--max-token-bytes", "1000"]);
    let api = m.client();
    apply(
        &api,
        "work",
        json!({"places": ["p-in", "p-out", "p-err"], "transitions": [{"id": "inc", "kind": "map",
            "presets": {"i": {"place": "p-in"}}, "postsets": {"out": {"place": "p-out"}, "err": {"place": "p-err"}},
            "action": {"template": {"next": "${.i.data.n + 1}"}}, "onError": {"to": "err"}, "emit": [{"to": "out"}]}]}),
    );
    start_all(&api, "work", &["inc"]);
    // Each fails its template. The error token wraps the input three levels deeper: 900 bytes
    // become more than 1000, 99 levels more than 100. A small one goes to the error place.
    assert_eq!(put(&api, "work", "p-in", json!({"n": "x".repeat(900)})).0, 200);
    assert_eq!(put(&api, "work", "p-in", json!({"n": nested(98)})).0, 200);
    assert_eq!(put(&api, "work", "p-in", json!({"n": "small"})).0, 200);
    wait_for("two parked and one error token", || {
        api.get("/api/models/work/parked").1.as_array().map(Vec::len) == Some(2)
            && api.token_data("work", "p-err").len() == 1
    });
    assert_eq!(api.token_data("work", "p-err")[0]["input"]["i"]["data"]["n"], "small");
    let (_, parked) = api.get("/api/models/work/parked");
    let mut reasons: Vec<String> =
        parked.as_array().unwrap().iter().map(|p| p["reason"].as_str().unwrap().to_string()).collect();
    reasons.sort();
    for r in &reasons {
        assert!(
            r.contains("the template failed")
                && r.contains("the inputs stay parked: the error token for p-err would be refused"),
            "{r}"
        );
    }
    assert!(reasons.iter().any(|r| r.contains("--max-token-bytes")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("levels deep; at most 100")), "{reasons:?}");
    assert_eq!(api.token_data("work", "p-in").len(), 2);
    // The master reads its log back.
    let m = m.restart();
    assert_eq!(m.client().token_data("work", "p-in").len(), 2);
}

#[test]
fn a_map_firing_at_two_deaths_in_a_row_starts_stopped() {
    let dir = tempfile::tempdir().unwrap();
    // Long enough that each death comes while the template still spins.
    let mut m = Master::start_with(dir.path(), &["--expr-timeout-ms", "120000"]);
    let api = m.client();
    apply(
        &api,
        "spin",
        json!({"places": ["p-in", "p-out"], "transitions": [{"id": "spin", "kind": "map",
            "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}},
            "action": {"template": {"v": "${def f: f; f}"}}, "emit": [{"to": "o"}]}]}),
    );
    start_all(&api, "spin", &["spin"]);
    put(&api, "spin", "p-in", json!({"n": 1}));
    let marker = dir.path().join("nets.firing");
    let firing = || {
        let record: Value =
            std::fs::read(&marker).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        record["firing"].as_array().is_some_and(|f| f.contains(&json!(["spin", "spin"])))
    };
    for death in 1..=2 {
        wait_for("the map to be firing", firing);
        m = m.restart();
        let t = transition(&m.client(), "spin", "spin");
        if death == 1 {
            assert_eq!(t["started"], true, "one death is not a loop: {t}");
        }
    }
    let api = m.client();
    let t = transition(&api, "spin", "spin");
    assert_eq!(t["started"], false, "{t}");
    assert!(t["lastError"].as_str().unwrap().contains("died 2 times in a row"), "{t}");
    assert_eq!(api.token_data("spin", "p-in"), vec![json!({"n": 1})]);
    assert!(!firing(), "the stopped map fires again");
}

#[test]
fn parked_tokens_are_retried_and_discarded_with_the_cli_each_an_event() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    apply(
        &api,
        "park",
        json!({"places": ["p-in", "p-big"], "transitions": [{"id": "sort", "kind": "pass",
            "presets": {"x": {"place": "p-in"}}, "postsets": {"big": {"place": "p-big"}},
            "emit": [{"to": "big", "when": ".result.v > 10"}], "onUnmatched": "keep"}]}),
    );
    start_all(&api, "park", &["sort"]);
    put(&api, "park", "p-in", json!({"v": 1}));
    put(&api, "park", "p-in", json!({"v": 2}));
    let parked = || -> Vec<String> {
        let (_, p) = api.get("/api/models/park/parked");
        p.as_array().unwrap().iter().map(|p| p["token"]["id"].as_str().unwrap().to_string()).collect()
    };
    wait_for("both tokens to park", || parked().len() == 2);
    let ids = parked();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(common::BIN)
            .args(["net"])
            .args(args)
            .args(["--model", "park", "--url", &m.url, "--token", &m.token])
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let failures = |id: &str| {
        events(&api)
            .iter()
            .filter(|e| e["model"] == "park" && e["payload"]["fireFailed"].to_string().contains(id))
            .count()
    };
    assert_eq!(failures(&ids[0]), 1);
    assert_eq!(cli(&["retry", &ids[0]]).trim(), format!("released {}", ids[0]));
    // Retried, it binds again, fails again (v is not above 10) and parks again.
    wait_for("the retried token to park again", || failures(&ids[0]) == 2 && parked().len() == 2);
    assert_eq!(cli(&["discard", &ids[1]]).trim(), format!("discarded {}", ids[1]));
    assert_eq!(parked(), vec![ids[0].clone()]);
    assert_eq!(api.token_data("park", "p-in"), vec![json!({"v": 1})]);
    let logged = |kind: &str, id: &str| {
        events(&api).iter().any(|e| e["model"] == "park" && e["payload"][kind].to_string().contains(id))
    };
    assert!(logged("unparked", &ids[0]), "{:?}", events(&api));
    assert!(logged("discarded", &ids[1]), "{:?}", events(&api));
    // An id that is not parked is refused, exit code 4.
    let out = std::process::Command::new(common::BIN)
        .args(["net", "discard", &ids[1], "--model", "park", "--url", &m.url, "--token", &m.token])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Hostile testing found a fire by hand binding a parked poison token again and again (its
/// attempts 1, 2, 3) while the good token behind it never ran, `net fire` exiting 0 on a failed
/// fire, and `net start` of a manual transition answering "started" for fires that never came.
#[test]
fn a_fire_by_hand_skips_a_parked_poison_token_and_net_fire_exits_by_its_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    apply(
        &api,
        "poison",
        json!({"places": ["p-in", "p-out"], "transitions": [{"id": "t", "kind": "map", "mode": "manual",
            "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}},
            "action": {"template": "${if .i.data.bad then error(\"poison\") else .i.data end}"},
            "emit": [{"to": "o"}]}]}),
    );
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(common::BIN)
            .arg("net")
            .args(args)
            .args(["--model", "poison", "--url", &m.url, "--token", &m.token])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (_, bad) = put(&api, "poison", "p-in", json!({"bad": true}));
    let bad = bad["id"].as_str().unwrap().to_string();
    // The fire failed: exit 5 (as a tool that failed), one error line with the reason.
    let (code, _, err) = cli(&["fire", "t"]);
    assert_eq!(code, Some(5), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: transition t failed: ") && err.contains("poison"), "{err}");

    put(&api, "poison", "p-in", json!({"v": "good"}));
    let (code, out, err) = cli(&["fire", "t"]);
    assert_eq!((code, out.trim()), (Some(0), "t fired"), "{err}");
    assert_eq!(api.token_data("poison", "p-out"), vec![json!({"v": "good"})]);

    // Only the parked token is left: not enabled, exit 6, and the line says how to release it.
    let (code, out, err) = cli(&["fire", "t", "--json"]);
    assert_eq!(code, Some(6), "{err}");
    let answer: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answer["outcome"], "not-enabled", "{answer}");
    assert!(err.starts_with("error: transition t is not enabled: ") && err.lines().count() == 1, "{err}");
    assert!(err.contains(&format!("agentos net retry {bad} --model poison")), "{err}");
    let (_, parked) = api.get("/api/models/poison/parked");
    assert_eq!(parked.as_array().map(Vec::len), Some(1), "{parked}");
    assert_eq!((parked[0]["token"]["id"].as_str(), parked[0]["attempts"].as_u64()), (Some(bad.as_str()), Some(1)));

    // A manual transition is not started: a start would promise fires that never come.
    let (code, _, err) = cli(&["start", "t"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("manual") && err.contains("agentos net fire t"), "{err}");
    assert_eq!(error_code(&api.post("/api/models/poison/transitions/t/start", json!({})), 400), "manual_transition");
    assert_eq!(transition(&api, "poison", "t")["started"], false);
    assert_eq!(
        api.get("/api/models/poison/parked").1.as_array().map(Vec::len),
        Some(1),
        "the refused start released it"
    );
}

/// Regression: a fire's failure reason was printed as the master gave it, so an expression's
/// `error("...")` with a line break and an escape made `net fire` print two error lines and
/// `net parked` and `net show` write the raw escape into the operator's terminal.
#[test]
fn a_fire_failure_reason_is_printed_on_one_line_with_nothing_a_terminal_acts_on() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    apply(
        &api,
        "pk",
        json!({"places": ["p-in", "p-out"], "transitions": [{"id": "t", "kind": "map", "mode": "manual",
            "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}},
            "action": {"template": {"v": "${error(\"bad\\nSECOND LINE\\u001b[31mred\\u202eevil\")}"}},
            "emit": [{"to": "o"}]}]}),
    );
    // Each fire parks the token it failed on: one for the master's answer, one for the CLI's.
    put(&api, "pk", "p-in", json!({"n": 1}));
    put(&api, "pk", "p-in", json!({"n": 2}));
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(common::BIN)
            .arg("net")
            .args(args)
            .args(["--model", "pk", "--url", &m.url, "--token", &m.token])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    // The master's reason holds them: the test is of what the CLI makes of it.
    let (_, o) = api.post("/api/models/pk/transitions/t/fire", json!({}));
    assert_eq!(o["outcome"], "failed", "{o}");
    let reason = o["reason"].as_str().unwrap();
    assert!(reason.contains("bad\nSECOND LINE\u{1b}[31mred"), "{reason:?}");
    let inert = |text: &str| !text.chars().any(|c| (c.is_control() && c != '\n') || c == '\u{202e}');
    let (code, _, err) = cli(&["fire", "t"]);
    assert_eq!(code, Some(5), "{err}");
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.contains("bad SECOND LINEredevil") && inert(&err), "{err:?}");
    let (code, out, err) = cli(&["parked"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 2, "{out:?}");
    assert!(out.lines().all(|l| l.ends_with("bad SECOND LINEredevil")) && inert(&out), "{out:?}");
    let (code, out, err) = cli(&["show"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("last error: ") && inert(&out), "{out:?}");
    assert!(out.lines().any(|l| l.contains("last error: ") && l.contains("bad SECOND LINEredevil")), "{out:?}");
}

#[test]
fn a_token_a_fire_makes_over_max_token_bytes_stops_its_transition_in_the_map_and_command_paths() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--max-token-bytes", "1000"]);
    let api = m.client();
    // A map whose output is an array of 400 numbers: about 1,500 bytes.
    apply(
        &api,
        "big",
        json!({"places": ["p-in", "p-out"], "transitions": [{"id": "grow", "kind": "map",
            "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}},
            "action": {"template": {"v": "${[range(400)]}"}}, "emit": [{"to": "o"}]}]}),
    );
    put(&api, "big", "p-in", json!({"n": 1}));
    let (status, o) = api.post("/api/models/big/transitions/grow/fire", json!({}));
    assert_eq!((status, o["outcome"].as_str()), (200, Some("stopped")), "{o}");
    assert!(o["reason"].as_str().unwrap().contains("more than 1000 (the master's --max-token-bytes)"), "{o}");
    let t = transition(&api, "big", "grow");
    assert_eq!((t["started"].as_bool(), t["lastError"].as_str()), (Some(false), o["reason"].as_str()), "{t}");
    assert_eq!(api.token_data("big", "p-in"), vec![json!({"n": 1})]);
    assert!(api.token_data("big", "p-out").is_empty());

    // A command whose result is 2,000 bytes of stdout: the fire ends failed, its input parked,
    // and the transition stops.
    assert_eq!(api.register("loud", "sh", "head -c 2000 /dev/zero | tr '\\0' x", Some("default")).0, 200);
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    apply(
        &api,
        "cmd",
        json!({"places": ["p-cmd", "p-out"], "transitions": [{"id": "run", "kind": "command",
            "presets": {"c": {"place": "p-cmd"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]}),
    );
    start_all(&api, "cmd", &["run"]);
    put(&api, "cmd", "p-cmd", json!({"executor": "script", "command": "invoke", "args": {"toolId": "loud"}}));
    wait_for("the command transition to stop", || transition(&api, "cmd", "run")["started"] == false);
    let t = transition(&api, "cmd", "run");
    assert!(t["lastError"].as_str().unwrap().contains("(the master's --max-token-bytes)"), "{t}");
    assert_eq!(t["inFlight"], 0, "{t}");
    assert!(api.token_data("cmd", "p-out").is_empty());
    let (_, parked) = api.get("/api/models/cmd/parked");
    assert_eq!(parked.as_array().map(Vec::len), Some(1), "{parked}");
    assert!(parked[0]["reason"].as_str().unwrap().contains("--max-token-bytes"), "{parked}");
}

#[test]
fn a_filters_kept_verdicts_go_with_the_net_that_asked_and_new_tokens_are_asked_once_they_come() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let net = |filter: &str| {
        json!({"places": ["p-in", "p-out"], "transitions": [{"id": "pick", "kind": "pass",
            "presets": {"x": {"place": "p-in", "filter": filter}}, "postsets": {"o": {"place": "p-out"}},
            "emit": [{"to": "o"}]}]})
    };
    apply(&api, "keep", net(".data.n > 5"));
    start_all(&api, "keep", &["pick"]);
    for n in [1, 3] {
        put(&api, "keep", "p-in", json!({"n": n}));
    }
    // Asked about 1 and 3 (no), then about 9 alone: it moves, the others stay.
    put(&api, "keep", "p-in", json!({"n": 9}));
    wait_for("9 to move", || api.token_data("keep", "p-out") == vec![json!({"n": 9})]);
    assert_eq!(api.token_data("keep", "p-in").len(), 2);
    // Another filter is another question: the kept "no" for 3 is not its answer.
    apply(&api, "keep", net(".data.n > 2"));
    // A net applied again starts stopped.
    start_all(&api, "keep", &["pick"]);
    wait_for("3 to move under the new filter", || api.token_data("keep", "p-out").contains(&json!({"n": 3})));
    assert_eq!(api.token_data("keep", "p-in"), vec![json!({"n": 1})]);
}

#[test]
fn a_command_fires_result_is_recorded_in_the_same_commit_as_the_fires_outcome_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    assert_eq!(api.register("echo-ok", "sh", "cat", None).0, 200);
    assert_eq!(api.register("fails", "sh", "echo no >&2; exit 4", None).0, 200);
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let net = json!({
        "places": ["p-cmd", "p-out"],
        "transitions": [{"id": "run", "kind": "command", "presets": {"c": {"place": "p-cmd"}},
            "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]
    });
    apply(&api, "rec", net);
    start_all(&api, "rec", &["run"]);
    let cmd =
        |tool: &str| json!({"executor": "script", "command": "invoke", "args": {"toolId": tool, "input": {"n": 1}}});
    assert_eq!(put(&api, "rec", "p-cmd", cmd("echo-ok")).0, 200);
    wait_for("the output", || !api.token_data("rec", "p-out").is_empty());
    assert_eq!(put(&api, "rec", "p-cmd", cmd("fails")).0, 200);
    wait_for("the failed fire", || {
        let (_, e) = api.get("/api/events?type=Net&model=rec");
        e.to_string().contains("fireFailed")
    });

    let (_, page) = api.get("/api/events?limit=1000");
    let events = page.as_array().unwrap();
    let finished: Vec<&Value> = events.iter().filter(|e| e["type"] == "JobFinished").collect();
    assert_eq!(finished.len(), 2, "{events:?}");
    // On a shared queue the master that takes a result records it (the fire may wait on another
    // master), so there the outcome follows in a commit of its own.
    let shared_queue = std::env::var("AGENTOS_TEST_STORAGE").as_deref() == Ok("shared");
    for (job, outcome) in finished.iter().zip(["fireCompleted", "fireFailed"]) {
        // The fire's outcome is the next event, committed at the same moment as the result.
        let seq = job["seq"].as_u64().unwrap();
        let next = events
            .iter()
            .filter(|e| e["seq"].as_u64() > Some(seq))
            .min_by_key(|e| e["seq"].as_u64())
            .expect("an event after the result");
        assert!(next.to_string().contains(outcome), "after {job}: {next}");
        if !shared_queue {
            assert_eq!(next["time"], job["time"], "one commit: {job} {next}");
        }
        let job_id = job.to_string().split("job-").nth(1).map(|s| format!("job-{}", s.split('"').next().unwrap()));
        let (status, read) = api.get(&format!("/api/jobs/{}", job_id.unwrap()));
        assert_eq!(status, 200, "{read}");
        assert_eq!(read["state"], "finished", "{read}");
        assert_eq!(read["invoker"], "net", "a step of a fire: {read}");
    }
    // Each result once, also after a restart.
    let m = m.restart();
    let api = m.client();
    let (_, again) = api.get("/api/events?type=JobFinished");
    assert_eq!(again.as_array().unwrap().len(), 2);
    let (_, jobs) = api.get("/api/jobs");
    assert_eq!(jobs.as_array().map(Vec::len).or(jobs["jobs"].as_array().map(Vec::len)), Some(2), "{jobs}");
}

/// A place read a page at a time: a place may hold far more tokens than one answer should carry.
#[test]
fn a_place_s_tokens_are_read_whole_or_a_page_at_a_time_with_their_count() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    apply(&api, "default", json!({"places": ["p"], "transitions": []}));
    for i in 0..5 {
        assert_eq!(put(&api, "default", "p", json!({"i": i})).0, 200);
    }
    let tokens = "/api/models/default/places/p/tokens";
    assert_eq!(api.token_data("default", "p").len(), 5, "without a limit, every token");
    let page = |query: &str| {
        let res = reqwest::blocking::Client::new()
            .get(format!("{}{tokens}?{query}", m.url))
            .bearer_auth(&m.token)
            .send()
            .unwrap();
        let status = res.status().as_u16();
        let total = res.headers().get("x-total-count").map(|v| v.to_str().unwrap().to_string());
        (status, total, res.json::<Value>().unwrap())
    };
    let (status, total, v) = page("limit=2");
    assert_eq!((status, total.as_deref()), (200, Some("5")), "{v}");
    let data: Vec<&Value> = v.as_array().unwrap().iter().map(|t| &t["data"]).collect();
    assert_eq!(data, [&json!({"i": 0}), &json!({"i": 1})]);
    let (_, _, v) = page("offset=4&limit=10");
    assert_eq!(v.as_array().unwrap().iter().map(|t| &t["data"]).collect::<Vec<_>>(), [&json!({"i": 4})]);
    for bad in ["limit=0", "limit=10001", "limit=-1", "lmit=2"] {
        let (status, _, v) = page(bad);
        assert_eq!(status, 400, "{bad}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("limit"), "{bad}: {v}");
    }
}

/// An http transition whose service answers outside `successStatus` goes to `onError` with
/// what the service answered: the error token carries `response` (`{status, contentType,
/// body}`), as a success's answer reaches the emit rules, so a net can route on a validation
/// error's details.
#[test]
fn an_http_transition_refused_by_its_service_hands_the_answer_to_on_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Read, Write};
        let (s, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(s.try_clone().unwrap());
        let mut len = 0usize;
        let mut seen = String::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).unwrap();
            if let Some(v) = h.to_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if h.to_lowercase().starts_with("authorization:") {
                seen = h["authorization:".len()..].trim().to_string();
            }
            if h == "\r\n" {
                break;
            }
        }
        let mut body = vec![0u8; len];
        reader.read_exact(&mut body).unwrap();
        // The credential echoed back, as a careless service does in its errors.
        let answer = format!(r#"{{"errors":[{{"field":"city","message":"no such city"}}],"seen":"{}"}}"#, seen.trim());
        let mut s = s;
        write!(
            s,
            "HTTP/1.1 422 Unprocessable Entity\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
            answer.len()
        )
        .unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let secret = "err-echo-canary-7c1d";
    assert_eq!(api.put("/api/secrets/WEATHER_KEY", json!({"value": secret})).0, 200);
    let (s, v) = api.post("/api/secrets/WEATHER_KEY/grants", json!({"origin": format!("http://127.0.0.1:{port}")}));
    assert_eq!(s, 200, "{v}");
    apply(
        &api,
        "weather",
        json!({
            "places": ["p-req", "p-resp", "p-err"],
            "transitions": [{"id": "call", "kind": "http", "presets": {"req": {"place": "p-req"}},
                "postsets": {"o": {"place": "p-resp"}, "e": {"place": "p-err"}},
                "action": {"method": "POST", "url": format!("http://127.0.0.1:{port}/forecast"),
                           "headers": {"Authorization": "Bearer ${credentials.WEATHER_KEY}"},
                           "body": {"city": "${.req.data.city}"}},
                "emit": [{"to": "o"}], "onError": {"to": "e"}}]
        }),
    );
    start_all(&api, "weather", &["call"]);
    put(&api, "weather", "p-req", json!({"city": "Atlantis"}));
    wait_for("the error token", || !api.token_data("weather", "p-err").is_empty());
    server.join().unwrap();
    let err = api.token_data("weather", "p-err").remove(0);
    assert!(err["error"].as_str().unwrap().contains("answered 422"), "{err}");
    assert_eq!(
        err["response"],
        json!({"status": 422, "contentType": "application/json",
            "body": {"errors": [{"field": "city", "message": "no such city"}], "seen": "Bearer [redacted]"}}),
        "{err}"
    );
    assert!(!api.get("/api/models/weather/places/p-err/tokens").1.to_string().contains(secret));
    assert_eq!(err["input"]["req"]["data"]["city"], "Atlantis", "{err}");
    assert!(api.token_data("weather", "p-resp").is_empty());
}
