//! Principals, capability flags and secrets, proven by attacking them: the authorization
//! matrix over every route, flag-limited agents, revocation, and a canary secret.

mod common;

use agentos_core::flags::Flag;
use agentos_server::routes::{Permission, ROUTES, commands};
use common::{Api, Master, wait_for};
use serde_json::{Value, json};

/// A concrete request for a route: placeholders filled with values that fail fast (bad ids,
/// missing things), so an allowed call answers 4xx from its handler, never 401/403.
fn sample(method: &str, path: &str) -> (String, Option<Value>) {
    let p = path
        .replace("{*urn}", "urn:agentos:blob:x/BAD")
        .replace("{id}", "NO-SUCH")
        .replace("{model}", "no-such-model")
        .replace("{place}", "p-none")
        .replace("{transition}", "t-none")
        .replace("{name}", "no-such-name");
    let body = match (method, path) {
        ("POST", "/api/executor/poll") => Some(json!({"waitMs": 1})),
        ("POST", "/api/tools/{id}/invoke") | ("POST", "/api/tools/{id}/call") => Some(json!({"timeoutMs": 1})),
        ("POST", _) | ("PUT", _) => Some(json!({"unexpected": true})),
        _ => None,
    };
    (p, body)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Who {
    Anonymous,
    Agent(Option<Flag>),
    Operator,
    Executor,
}

fn allowed(perm: Permission, who: Who) -> bool {
    match (perm, who) {
        (Permission::Public, _) => true,
        (_, Who::Anonymous) => false,
        (Permission::Executor, w) => w == Who::Executor,
        (_, Who::Executor) => false,
        (Permission::Operator, w) => w == Who::Operator,
        (_, Who::Operator) => true,
        (Permission::Authenticated, _) => true,
        (Permission::Flag(f), Who::Agent(g)) => g == Some(f),
        (Permission::AnyOf(fs), Who::Agent(g)) => g.is_some_and(|g| fs.contains(&g)),
    }
}

fn flag_string(f: Flag) -> String {
    (0..11).map(|i| if i == f as usize { f.letter() } else { '-' }).collect()
}

#[test]
fn every_route_answers_exactly_who_the_table_allows() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    // Each caller with the model its requests name: an agent's own (home) model, so that what
    // is checked here is the flags; other models are the security tests' matrix.
    let mut callers: Vec<(Who, Api, String)> = vec![
        (Who::Anonymous, op.with_token(None), "no-such-model".into()),
        (Who::Operator, op.clone(), "no-such-model".into()),
        (Who::Agent(None), op.agent("no-flags", "-"), "no-flags".into()),
    ];
    for f in Flag::ALL {
        let name = format!("only-{}", f.letter());
        callers.push((Who::Agent(Some(f)), op.agent(&name, &flag_string(f)), name));
    }
    let (_, t) = op.post("/api/executor-tokens", json!({"name": "exec"}));
    callers.push((Who::Executor, op.with_token(t["token"].as_str()), "no-such-model".into()));

    // The catalog is read by every flag that reveals a kind of tool: `x` host tools, `w` the tool
    // nets it authors, besides `d h t s m`; `r`, `l` and the rest reveal none.
    let catalog = ROUTES.iter().find(|r| r.path == "/api/tool-catalog").unwrap().permission;
    let readers: Vec<char> =
        Flag::ALL.into_iter().filter(|f| allowed(catalog, Who::Agent(Some(*f)))).map(Flag::letter).collect();
    assert_eq!(readers.iter().collect::<String>(), "wxhdtsm");

    let mut checked = 0;
    for route in ROUTES {
        let (path, body) = sample(route.method, route.path);
        if route.path.ends_with("/watch") {
            continue; // a stream: checked below with a bounded read
        }
        for (who, api, model) in &callers {
            let path = path.replace("no-such-model", model);
            let (status, v) = api.request(route.method, &path, body.clone());
            let expect = allowed(route.permission, *who);
            if expect {
                assert!(
                    status != 401 && status != 403,
                    "{who:?} was refused {} {}: {status} {v}",
                    route.method,
                    route.path
                );
            } else {
                let want = if *who == Who::Anonymous { 401 } else { 403 };
                assert_eq!(status, want, "{who:?} on {} {}: {v}", route.method, route.path);
            }
            checked += 1;
        }
    }
    // Each command type declares its own permission, checked before its fields are.
    for (kind, perm) in &commands() {
        for (who, api, _) in &callers {
            let (status, v) = api.command(json!({"type": kind}));
            let route_ok = *who != Who::Anonymous && *who != Who::Executor;
            if route_ok && allowed(*perm, *who) {
                assert!(status != 401 && status != 403, "{who:?} refused {kind}: {v}");
            } else {
                assert!(status == 401 || status == 403, "{who:?} ran {kind}: {status} {v}");
            }
            checked += 1;
        }
    }
    assert!(checked > 400, "only {checked} checks");
}

#[test]
fn flag_limited_agents_see_and_do_only_what_their_flags_grant() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    op.register("global-script", "sh", "echo", Some("default"));
    let net = json!({"places": ["p-a", "p-b"], "transitions": [{"id": "t", "kind": "pass", "presets": {"i": {"place": "p-a"}}, "postsets": {"o": {"place": "p-b"}}, "emit": [{"to": "o"}]}]});
    let (s, v) = op.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": "a-toolnet", "name": "T", "model": "default", "net": net, "inputPlace": "p-a", "outputPlace": "p-b"}));
    assert_eq!(s, 200, "{v}");

    let scripts = op.agent("scripter", "---------s");
    let (status, e) = scripts.register("mine", "sh", "echo mine", None);
    assert_eq!(status, 200, "{e}");
    assert_eq!(e["model"], "scripter", "scripts go to the agent's home model");
    assert_eq!(e["scope"], "local");
    let (_, page) = scripts.get("/api/tool-catalog?model=scripter");
    let kinds: Vec<&str> =
        page["items"].as_array().unwrap().iter().map(|e| e["binding"]["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, vec!["script", "script"], "{page}");
    assert_eq!(scripts.get("/api/tool-catalog/a-toolnet").0, 404, "a tool net is invisible to scripts-only");
    assert_eq!(scripts.register("elsewhere", "sh", "echo", Some("someone-else")).0, 403);
    assert_eq!(scripts.register("shared", "sh", "echo", Some("default")).0, 200, "default is allowed");

    let docker = op.agent("docker-only", "------d");
    let (status, page) = docker.get("/api/tool-catalog");
    assert_eq!(status, 200);
    assert_eq!(page["total"], 0, "docker-only sees no script or tool net: {page}");
    assert_eq!(docker.register("x", "sh", "echo", None).0, 403);

    let reader = op.agent("reader", "r");
    assert_eq!(reader.get("/api/tool-catalog").0, 403);
    assert_eq!(reader.get("/api/models").0, 200);

    // Revoked: the token stops working at once.
    assert_eq!(op.request("DELETE", "/api/agents/reader", None).0, 200);
    assert_eq!(reader.get("/api/models").0, 401);

    // The audit names who did what, in the models the reader may use.
    let auditor = op.agent("auditor", "r---l");
    let (_, events) = auditor.get("/api/events?principal=scripter");
    assert!(
        !events.as_array().unwrap().iter().any(|e| e["model"] == "scripter"),
        "another model's events are not the auditor's to read: {events}"
    );
    assert_eq!(op.post("/api/agents/auditor/grants", json!({"model": "scripter"})).0, 200);
    let (status, events) = auditor.get("/api/events?principal=scripter");
    assert_eq!(status, 200);
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "ToolRegistered" && e["payload"]["entry"]["id"] == "mine")
    );
    assert!(events.as_array().unwrap().iter().all(|e| e["principal"] == "scripter"));
    assert_eq!(scripts.get("/api/events").0, 403);
}

/// Regression: a `w` agent could register a tool net (authoring one is writing a net) but not
/// see it (only `t` revealed tool nets) nor remove it (that needed `t`).
#[test]
fn a_writer_sees_and_removes_the_tool_net_it_registered() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    let writer = op.agent("writer", "-w");
    let net = json!({"places": ["p-a", "p-b"], "transitions": [{"id": "t", "kind": "pass", "presets": {"i": {"place": "p-a"}}, "postsets": {"o": {"place": "p-b"}}, "emit": [{"to": "o"}]}]});
    let (s, v) = writer.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": "relay", "name": "Relay", "net": net, "inputPlace": "p-a", "outputPlace": "p-b"}));
    assert_eq!(s, 200, "{v}");
    let (s, e) = writer.get("/api/tool-catalog/relay");
    assert_eq!((s, e["model"].as_str()), (200, Some("writer")), "{e}");
    let (s, page) = writer.get("/api/tool-catalog");
    assert_eq!((s, page["total"].as_u64()), (200, Some(1)), "{page}");
    // `t` runs tool nets but does not author them, so it removes none.
    let runner = op.agent("runner", "--------t");
    assert_eq!(op.post("/api/agents/runner/grants", json!({"model": "writer"})).0, 200);
    let (s, v) = runner.command(json!({"type": "TOOL_CATALOG_REMOVE", "id": "relay", "model": "writer"}));
    assert_eq!(s, 403, "{v}");
    let (s, v) = writer.command(json!({"type": "TOOL_CATALOG_REMOVE", "id": "relay"}));
    assert_eq!(s, 200, "{v}");
    assert_eq!(writer.get("/api/tool-catalog/relay").0, 404);
}

#[test]
fn invalid_flag_strings_are_refused_with_an_explanation() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    for (flags, words) in [
        ("rwt", "position 3 must be 'x'"),
        ("rwxhludctsmm", "at most 11"),
        ("", "empty"),
        ("RWX", "position 1 must be 'r'"),
    ] {
        let (status, v) = m.client().post("/api/agents", json!({"name": "a", "flags": flags}));
        assert_eq!(status, 400, "{flags:?}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(words), "{flags:?}: {v}");
    }
    let out = std::process::Command::new(common::BIN)
        .args(["agent", "create", "b", "--flags", "rwt"])
        .env("AGENTOS_URL", &m.url)
        .env("AGENTOS_TOKEN", &m.token)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("position 3 must be 'x'"));

    // Regression: a flag string starting with `-` (the README's `---------s`) was taken for an
    // option and refused before it reached the master.
    let out = std::process::Command::new(common::BIN)
        .args(["agent", "create", "scripter", "--flags", "---------s", "--json"])
        .env("AGENTOS_URL", &m.url)
        .env("AGENTOS_TOKEN", &m.token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let created: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(created["flags"], "---------s-", "{created}");
}

#[test]
fn a_canary_secret_appears_in_no_answer_log_event_or_file() {
    let canary = "canary-7f3a9e1b-do-not-leak";
    // A real server that the http transition calls with the secret, and that echoes it back.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming().take(2) {
            let mut s = stream.unwrap();
            let mut buf = [0u8; 8192];
            let n = s.read(&mut buf).unwrap();
            let req = String::from_utf8_lossy(&buf[..n]).to_string();
            let auth = req.lines().find(|l| l.to_lowercase().starts_with("authorization:")).unwrap_or("").to_string();
            let body = json!({"echo": auth}).to_string();
            write!(s, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).unwrap();
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("master.log");
    let m = Master::start_logged(&data, &log, &[]);
    let op = m.client();
    let mut answers = Vec::new();
    let mut keep = |r: (u16, Value)| {
        answers.push(r.1.to_string());
        r
    };
    assert_eq!(keep(op.request("PUT", "/api/secrets/API_KEY", Some(json!({"value": canary})))).0, 200);
    let (_, list) = keep(op.get("/api/secrets"));
    assert_eq!(list[0]["name"], "API_KEY");
    let grant = json!({"origin": format!("http://127.0.0.1:{port}")});
    assert_eq!(keep(op.post("/api/secrets/API_KEY/grants", grant)).0, 200);
    keep(op.put("/api/models/leak/net", json!({
        "places": ["p-in", "p-out"],
        "transitions": [{"id": "call", "kind": "http", "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}},
            "action": {"method": "GET", "url": format!("http://127.0.0.1:{port}/x"), "headers": {"Authorization": "Bearer ${credentials.API_KEY}"}},
            "emit": [{"to": "o"}]}]
    })));
    keep(op.post("/api/models/leak/transitions/call/start", json!({})));
    keep(op.post("/api/models/leak/places/p-in/tokens", json!({"data": {"go": true}})));
    wait_for("the echo", || !op.token_data("leak", "p-out").is_empty());
    let out = keep(op.get("/api/models/leak/places/p-out/tokens"));
    assert!(
        out.1.to_string().contains("Bearer [redacted]"),
        "the server saw the secret and its echo was redacted: {}",
        out.1
    );
    keep(op.get("/api/events?limit=1000"));
    keep(op.get("/api/models/leak/net"));
    keep(op.get("/api/openapi.json"));
    for a in &answers {
        assert!(!a.contains(canary), "an answer holds the secret: {a}");
    }
    drop(m);
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(!log_text.contains(canary), "the log holds the secret");
    fn walk(d: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() { walk(&p, out) } else { out.push(p) }
        }
    }
    let mut files = Vec::new();
    walk(&data, &mut files);
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        assert!(
            !bytes.windows(canary.len()).any(|w| w == canary.as_bytes()),
            "{} holds the secret in clear text",
            f.display()
        );
    }
}

/// Regression: redaction replaced the secret's text inside serialized JSON, so a secret with
/// `"` or `\` echoed back stayed in clear (its escaped form differs), and one that looked like
/// JSON corrupted the text and the token's data became null.
#[test]
fn a_secret_with_json_syntax_echoed_back_is_redacted_in_every_form_and_the_data_kept() {
    let secret = r#"q"uo\te{"a":1}-long"#;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use base64::Engine as _;
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 8192];
        let n = s.read(&mut buf).unwrap();
        let req = String::from_utf8_lossy(&buf[..n]).to_string();
        let key = req.lines().find_map(|l| l.strip_prefix("x-key: ")).unwrap_or("").to_string();
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{key}\n"));
        let body = json!({"echo": format!("key={key}"), "b64": b64, "kept": [1, {"n": true}]}).to_string();
        write!(s, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    assert_eq!(op.request("PUT", "/api/secrets/ODD_KEY", Some(json!({"value": secret}))).0, 200);
    let grant = json!({"origin": format!("http://127.0.0.1:{port}")});
    assert_eq!(op.post("/api/secrets/ODD_KEY/grants", grant).0, 200);
    let (status, v) = op.put("/api/models/odd/net", json!({
        "places": ["p-in", "p-out"],
        "transitions": [{"id": "call", "kind": "http", "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}},
            "action": {"method": "GET", "url": format!("http://127.0.0.1:{port}/x"), "headers": {"X-Key": "${credentials.ODD_KEY}"}},
            "emit": [{"to": "o"}]}]
    }));
    assert_eq!(status, 200, "{v}");
    assert_eq!(op.post("/api/models/odd/transitions/call/start", json!({})).0, 200);
    assert_eq!(op.post("/api/models/odd/places/p-in/tokens", json!({"data": {}})).0, 200);
    wait_for("the echo", || !op.token_data("odd", "p-out").is_empty());
    let out = op.token_data("odd", "p-out");
    assert_eq!(out[0]["echo"], "key=[redacted]", "{out:?}");
    assert!(out[0]["b64"].as_str().unwrap().starts_with("[redacted]"), "{out:?}");
    assert_eq!(out[0]["kept"], json!([1, {"n": true}]), "{out:?}");
}

/// A script's output is scrubbed of every secret in the store, in any letter case, reversed or
/// spelled out, and a secret changed or set later is scrubbed from the next answer on (the
/// redactor is built once per change of the store, not per answer).
#[test]
fn a_script_echoing_a_secret_reversed_or_upper_cased_is_redacted_and_a_new_value_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let op = m.client();
    let _e = common::Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    // The script prints its input's `v` as it is, upper-cased, reversed, one letter per space
    // and in base32 (the last character and the padding hold bits past the value's own).
    let script = r#"v=$(sed 's/.*"v":"\([^"]*\)".*/\1/'); echo "plain=$v upper=$(echo "$v" | tr a-z A-Z) rev=$(echo "$v" | rev) spaced=$(echo "$v" | sed 's/./& /g') b32=$(printf %s "$v" | base32)""#;
    assert_eq!(op.register("echo-v", "sh", script, None).0, 200);
    let echo = |v: &str| {
        let (status, r) = op.invoke("echo-v", json!({"input": {"v": v}}));
        assert_eq!(status, 200, "{r}");
        r["stdout"].as_str().unwrap().to_string()
    };
    assert_eq!(
        echo("first-value-1"),
        "plain=first-value-1 upper=FIRST-VALUE-1 rev=1-eulav-tsrif spaced=f i r s t - v a l u e - 1  b32=MZUXE43UFV3GC3DVMUWTC===\n"
    );
    assert_eq!(op.request("PUT", "/api/secrets/API_KEY", Some(json!({"value": "first-value-1"}))).0, 200);
    assert_eq!(
        echo("first-value-1"),
        "plain=[redacted] upper=[redacted] rev=[redacted] spaced=[redacted]  b32=[redacted]C===\n"
    );
    // A new value: redacted from the next answer on, and the old one is ordinary text again.
    assert_eq!(op.request("PUT", "/api/secrets/API_KEY", Some(json!({"value": "second-value-2"}))).0, 200);
    assert_eq!(
        echo("second-value-2"),
        "plain=[redacted] upper=[redacted] rev=[redacted] spaced=[redacted]  b32=[redacted]Q=\n"
    );
    assert!(echo("first-value-1").starts_with("plain=first-value-1 "));
    // A second secret set later joins the first.
    assert_eq!(op.request("PUT", "/api/secrets/OTHER_KEY", Some(json!({"value": "third-value-3"}))).0, 200);
    assert!(echo("third-value-3").starts_with("plain=[redacted] "));
    assert!(echo("second-value-2").starts_with("plain=[redacted] "));
}

#[test]
fn a_secret_shorter_than_8_bytes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    for (value, status) in [("", 400), ("1234567", 400), ("12345678", 200)] {
        let r = op.request("PUT", "/api/secrets/SHORT", Some(json!({"value": value})));
        assert_eq!(r.0, status, "{value:?}: {r:?}");
        if status == 400 {
            assert_eq!(r.1["error"]["code"], "invalid_secret", "{r:?}");
            assert!(r.1["error"]["message"].as_str().unwrap().contains("at least 8 bytes"), "{r:?}");
        }
    }
    // Nor can a value hold a NUL byte: no environment variable can carry it.
    let r = op.request("PUT", "/api/secrets/NUL", Some(json!({"value": "12345678\0zz"})));
    assert_eq!((r.0, r.1["error"]["code"].as_str()), (400, Some("invalid_secret")), "{r:?}");
    assert!(r.1["error"]["message"].as_str().unwrap().contains("NUL"), "{r:?}");
}

#[test]
fn the_concurrent_invocations_of_one_principal_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--max-concurrent-invocations", "1"]);
    let op = m.client();
    op.register("slow", "sh", "sleep 1", None);
    let _e = common::Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let first = {
        let op = op.clone();
        std::thread::spawn(move || op.invoke("slow", json!({})))
    };
    wait_for("the first invocation to run", || op.get("/api/executors").1[0]["state"] == "busy");
    let (status, v) = op.invoke("slow", json!({}));
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "too_many_invocations");
    assert_eq!(first.join().unwrap().0, 200);
    assert_eq!(op.invoke("slow", json!({})).0, 200, "the slot came back");
}

/// Regression: the README's API table left out routes, `TOOL_CATALOG_REGISTER_TOOLNET` and the
/// 405, 422, 429 and 504 answers. It names every route of the table and every command type.
#[test]
fn the_readme_api_table_names_every_route_command_and_status() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let api = &readme[readme.find("\n## API\n").expect("an API section")..];
    let api = &api[..api[1..].find("\n## ").map_or(api.len(), |i| i + 1)];
    let mut missing = Vec::new();
    for route in ROUTES {
        let row = format!("| `{} {}", route.method, route.path.replace("{*urn}", "{urn}"));
        let named =
            api.match_indices(&row).any(|(i, _)| matches!(api[i + row.len()..].chars().next(), Some('`' | '?')));
        if !named {
            missing.push(row);
        }
    }
    for (kind, _) in &commands() {
        if !api.contains(&format!("`{kind}`")) {
            missing.push(kind.to_string());
        }
    }
    for status in [400, 401, 403, 404, 405, 409, 413, 422, 429, 500, 504] {
        if !api.split_whitespace().any(|w| w == status.to_string()) {
            missing.push(status.to_string());
        }
    }
    assert!(missing.is_empty(), "the README's API section lacks:\n{}", missing.join("\n"));
}

#[test]
fn a_huge_name_is_shown_cut_in_the_error_that_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    let (status, t) = op.post("/api/executor-tokens", json!({"name": "x1"}));
    assert_eq!(status, 200, "{t}");
    let exec = op.with_token(t["token"].as_str());
    let huge = "N".repeat(100_000);
    for (who, path, body) in [
        (&op, "/api/executor-tokens", json!({"name": huge})),
        (&op, "/api/agents", json!({"name": huge, "flags": "r"})),
        (&exec, "/api/executor/poll", json!({"name": huge, "waitMs": 1})),
    ] {
        let (status, v) = who.post(path, body);
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (400, Some("invalid_name")),
            "{path}: {}",
            &v.to_string()[..300]
        );
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.len() < 500, "{path}: a {}-byte message: {}…", msg.len(), &msg[..300]);
        assert!(msg.contains(&format!("\"{}\"… (100000 characters)", "N".repeat(64))), "{path}: {msg}");
    }
}

#[test]
fn an_event_page_over_1000_is_refused_as_one_of_0_is() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    for limit in ["0", "1001", "100000000000"] {
        let (status, v) = op.get(&format!("/api/events?limit={limit}"));
        assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_limit")), "limit={limit}: {v}");
        assert_eq!(v["error"]["message"], "limit must be between 1 and 1000", "limit={limit}");
    }
    for limit in ["1", "1000"] {
        let (status, v) = op.get(&format!("/api/events?limit={limit}"));
        assert_eq!(status, 200, "limit={limit}: {v}");
    }
    // A type no event has is refused, naming the types, rather than read as none such.
    let (status, v) = op.get("/api/events?type=ToolRegister");
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_type")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("ToolRegistered, ToolRemoved"), "{v}");
    op.agent("listed", "r");
    let (status, v) = op.get("/api/events?type=PrincipalCreated");
    assert_eq!(status, 200, "{v}");
    assert!(
        v.as_array().unwrap().iter().any(|e| e["type"] == "PrincipalCreated"),
        "the agent's creation is listed: {v}"
    );
}
