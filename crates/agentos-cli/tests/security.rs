//! The security model, tried as an attacker would with agents of limited flags against the real
//! binary: models have owners, a fire acts with the authority of everyone behind it, secrets go
//! only where the operator granted them, and entries belong to whoever registered them.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agentos_core::entry::CATALOG_READ_FLAGS;
use agentos_core::flags::Flag;
use agentos_server::routes::{ModelRule, Permission, ROUTES};
use common::{Api, Executor, Master, wait_for};
use serde_json::{Value, json};

/// An agent with `flags` and home model `model`.
fn agent(op: &Api, name: &str, flags: &str, model: &str) -> Api {
    let (status, v) = op.post("/api/agents", json!({"name": name, "flags": flags, "model": model}));
    assert_eq!(status, 200, "{v}");
    op.with_token(v["token"].as_str())
}

/// The positional flag string holding exactly these flags.
fn flags(of: &[Flag]) -> String {
    Flag::ALL.iter().map(|f| if of.contains(f) { f.letter() } else { '-' }).collect()
}

/// A listener on 127.0.0.1 that stands in for an attacker's server: it counts requests and
/// answers each with `{"ok":true}`.
fn listener() -> (u16, Arc<AtomicUsize>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            h.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 8192];
            let _ = s.read(&mut buf);
            let body = r#"{"ok":true}"#;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, hits)
}

fn pass_net() -> Value {
    json!({"places": ["p-a", "p-b"], "transitions": [{"id": "t", "kind": "pass",
        "presets": {"i": {"place": "p-a"}}, "postsets": {"o": {"place": "p-b"}}, "emit": [{"to": "o"}]}]})
}

fn command_net(credentials: &[&str]) -> Value {
    json!({"places": ["p-cmd", "p-out"], "transitions": [{"id": "run", "kind": "command",
        "presets": {"c": {"place": "p-cmd"}}, "postsets": {"o": {"place": "p-out"}},
        "action": {"credentials": credentials}, "emit": [{"to": "o", "from": "@response"}]}]})
}

fn http_net(url: &str, headers: Value) -> Value {
    json!({"places": ["p-in", "p-out"], "transitions": [{"id": "call", "kind": "http",
        "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}},
        "action": {"method": "GET", "url": url, "headers": headers}, "emit": [{"to": "o"}]}]})
}

/// The last error of a transition once it has one.
fn last_error(api: &Api, model: &str, transition: &str) -> String {
    let mut error = String::new();
    wait_for(&format!("an error on {model}/{transition}"), || {
        let (_, net) = api.get(&format!("/api/models/{model}/net"));
        let t = net["transitions"].as_array().and_then(|ts| ts.iter().find(|t| t["id"] == transition).cloned());
        match t.and_then(|t| t["lastError"].as_str().map(str::to_string)) {
            Some(e) => {
                error = e;
                true
            }
            None => false,
        }
    });
    error
}

/// The name of the tool-net instance running now, once there is one.
fn running_instance(op: &Api) -> String {
    let mut instance = String::new();
    wait_for("a tool-net instance", || {
        let (_, models) = op.get("/api/models");
        match models.as_array().unwrap().iter().find(|m| m["name"].as_str().unwrap().starts_with("tni-")) {
            Some(m) => {
                instance = m["name"].as_str().unwrap().to_string();
                true
            }
            None => false,
        }
    });
    instance
}

/// Ends a `stall` invocation still waiting on `instance`: the operator puts a token into its
/// output place, and the invocation answers it (so it was alive until now).
fn end_stall(op: &Api, instance: &str, waiting: std::thread::JoinHandle<(u16, Value)>) {
    let (s, v) = op.post(&format!("/api/models/{instance}/places/p-out/tokens"), json!({"data": {"ended": true}}));
    assert_eq!(s, 200, "{v}");
    let (s, v) = waiting.join().unwrap();
    assert_eq!((s, &v["output"]), (200, &json!({"ended": true})), "{v}");
}

fn status_of(r: (u16, Value)) -> u16 {
    r.0
}

#[test]
fn an_agent_acts_only_in_its_home_model_and_the_models_granted_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    assert_eq!(op.put("/api/models/mb/net", pass_net()).0, 200);
    assert_eq!(op.post("/api/models/mb/transitions/t/start", json!({})).0, 200);
    op.register("mb-local", "sh", "echo mb", Some("mb"));
    let a = agent(&op, "a", "rwx------s", "ma");
    assert_eq!(a.put("/api/models/ma/net", pass_net()).0, 200, "its own model");

    // Writes to another model are refused before anything is written.
    for (method, path, body) in [
        ("PUT", "/api/models/mb/net", Some(pass_net())),
        ("POST", "/api/models/mb/places/p-a/tokens", Some(json!({"data": {"x": 1}}))),
        ("POST", "/api/models/mb/transitions/t/stop", Some(json!({}))),
        ("POST", "/api/models/mb/transitions/t/fire", Some(json!({}))),
        ("PUT", "/api/models/default/net", Some(pass_net())),
        ("GET", "/api/models/mb/net", None),
        ("GET", "/api/models/mb/places/p-a/tokens", None),
        ("GET", "/api/models/mb/links", None),
        ("GET", "/api/models/mb/watch", None),
        ("GET", "/api/tool-catalog?model=mb", None),
        ("GET", "/api/tool-catalog/mb-local?model=mb", None),
        ("POST", "/api/tools/mb-local/invoke?model=mb", Some(json!({"timeoutMs": 1000}))),
    ] {
        let (status, v) = a.request(method, path, body);
        assert_eq!(status, 403, "{method} {path}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("agent grant a --model"), "{v}");
    }
    let (_, events) = op.get("/api/events?principal=a&limit=1000");
    assert!(
        events.as_array().unwrap().iter().all(|e| e["model"] == "ma"),
        "a refused request wrote something: {events}"
    );
    assert_eq!(status_of(a.post("/api/models", json!({"name": "elsewhere"}))), 403);
    let (_, models) = a.get("/api/models");
    let names: Vec<&str> = models.as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["default", "ma"], "{models}");
    // The script blob of mb's local entry is not a's to read.
    let (_, entry) = op.get("/api/tool-catalog/mb-local?model=mb");
    let urn = entry["binding"]["scriptUrn"].as_str().unwrap();
    assert_eq!(a.get(&format!("/api/blobs/{urn}")).0, 404);
    assert_eq!(op.get(&format!("/api/blobs/{urn}")).0, 200);

    // Granted, then revoked: each an event, listed.
    let out = std::process::Command::new(common::BIN)
        .args(["agent", "grant", "a", "--model", "mb"])
        .env("AGENTOS_URL", &m.url)
        .env("AGENTOS_TOKEN", &m.token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (_, agents) = op.get("/api/agents");
    assert_eq!(agents.as_array().unwrap().iter().find(|p| p["name"] == "a").unwrap()["granted"], json!(["mb"]));
    assert_eq!(a.get("/api/models/mb/net").0, 200);
    assert_eq!(a.post("/api/models/mb/places/p-a/tokens", json!({"data": {"x": 1}})).0, 200);
    wait_for("the pass transition to move a's token", || op.token_data("mb", "p-b").len() == 1);
    assert_eq!(a.get(&format!("/api/blobs/{urn}")).0, 200);
    assert_eq!(op.request("DELETE", "/api/agents/a/grants/mb", None).0, 200);
    assert_eq!(a.get("/api/models/mb/net").0, 403);
    // Revoking a grant the agent does not hold (a mistyped model, or twice) is said as such.
    let (status, v) = op.request("DELETE", "/api/agents/a/grants/mb", None);
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"]["message"], "a has no grant in model \"mb\" to revoke (its grants: none)", "{v}");
    let (_, events) = op.get("/api/events?limit=1000");
    let kinds: Vec<&str> = events.as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"ModelGranted") && kinds.contains(&"ModelGrantRevoked"), "{kinds:?}");
}

#[test]
fn a_tool_net_instance_belongs_to_its_invoker_alone() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    // A tool net that never answers: its instance stays while the invocation waits.
    let stall = json!({"places": ["p-in", "p-mid", "p-out"], "transitions": [{"id": "t", "kind": "pass",
        "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-mid"}}, "emit": [{"to": "o"}]}]});
    let (s, v) = op.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": "stall", "name": "stall",
        "model": "default", "net": stall, "inputPlace": "p-in", "outputPlace": "p-out"}));
    assert_eq!(s, 200, "{v}");
    let b = agent(&op, "b", &flags(&[Flag::Read, Flag::ToolNets]), "mb");
    let a = agent(&op, "a", &flags(&[Flag::Read, Flag::Write, Flag::Execute]), "ma");
    let waiting = {
        let b = b.clone();
        std::thread::spawn(move || b.invoke("stall", json!({"input": {"q": 1}, "timeoutMs": 8000})))
    };
    let instance = running_instance(&op);
    let (_, seen) = a.get("/api/models");
    assert!(!seen.to_string().contains("tni-"), "another principal's instance is listed: {seen}");
    assert_eq!(
        a.post(&format!("/api/models/{instance}/places/p-out/tokens"), json!({"data": {"forged": true}})).0,
        403
    );
    assert_eq!(a.get(&format!("/api/models/{instance}/net")).0, 403);
    assert_eq!(b.get(&format!("/api/models/{instance}/net")).0, 200, "the invoker may look at its own");
    let (status, v) = waiting.join().unwrap();
    assert_eq!(status, 504, "the forged answer was not taken: {v}");
}

#[test]
fn w_and_t_alone_run_no_command_and_reach_no_url() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let op = m.client();
    let _e = Executor::start(&m, &dir.path().join("exec"), "e1", &[]);
    let (port, hits) = listener();
    let url = format!("http://127.0.0.1:{port}/steal");
    let register = |id: &str, mut net: Value| {
        let input = if id == "runner" { "p-cmd" } else { "p-in" };
        net["places"] = json!([input, "p-out"]);
        let (s, v) = op.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": id, "name": id,
            "model": "default", "net": net, "inputPlace": input, "outputPlace": "p-out"}));
        assert_eq!(s, 200, "{v}");
    };
    register("runner", command_net(&[]));
    register("fetcher", http_net(&url, json!({})));
    // The operator's own call runs: the refusals below are the flags, not a broken net.
    let (s, v) = op.invoke("runner", json!({"input": {"executor": "bash", "command": "id -u", "args": {}}}));
    assert_eq!(s, 200, "{v}");
    assert!(v["output"]["stdout"].as_str().unwrap().trim().parse::<u32>().is_ok(), "{v}");

    let wt = agent(&op, "wt", &flags(&[Flag::Write, Flag::ToolNets]), "wt");
    // A refused step leaves nothing to run: the call fails as the tool failing, with the reason.
    let (s, v) =
        wt.invoke("runner", json!({"input": {"executor": "bash", "command": "id", "args": {}}, "timeoutMs": 20000}));
    assert_eq!((s, v["error"]["code"].as_str()), (422, Some("toolnet_failed")), "{v}");
    let why = v["error"]["message"].as_str().unwrap();
    assert!(why.contains("refused") && why.contains("'x'"), "{v}");
    let (s, v) = wt.invoke("fetcher", json!({"input": {}, "timeoutMs": 20000}));
    assert_eq!((s, v["error"]["code"].as_str()), (422, Some("toolnet_failed")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("refused"), "{v}");

    // rwx without s or h, in its own model.
    let rwx = agent(&op, "rwx", "rwx", "rwx");
    assert_eq!(rwx.put("/api/models/rwx/net", command_net(&[])).0, 200);
    assert_eq!(rwx.post("/api/models/rwx/transitions/run/start", json!({})).0, 200);
    assert_eq!(
        rwx.post(
            "/api/models/rwx/places/p-cmd/tokens",
            json!({"data": {"executor": "bash", "command": "id", "args": {}}})
        )
        .0,
        200
    );
    let e = last_error(&op, "rwx", "run");
    assert!(e.contains("'s'") && e.contains("rwx"), "{e}");
    // A refusal for want of a flag is not attempted again: with retries a minute apart, the
    // inputs reach the error place at once, after one attempt.
    let mut retried = command_net(&[]);
    retried["places"] = json!(["p-cmd", "p-out", "p-err"]);
    retried["transitions"][0]["postsets"]["err"] = json!({"place": "p-err"});
    retried["transitions"][0]["retry"] = json!({"maxAttempts": 5, "backoffMs": 60000});
    retried["transitions"][0]["onError"] = json!({"to": "err"});
    assert_eq!(rwx.put("/api/models/rwx/net", retried).0, 200);
    assert_eq!(rwx.post("/api/models/rwx/transitions/run/start", json!({})).0, 200);
    let cmd = json!({"data": {"executor": "bash", "command": "id", "args": {}}});
    assert_eq!(rwx.post("/api/models/rwx/places/p-cmd/tokens", cmd).0, 200);
    wait_for("the error token", || !rwx.token_data("rwx", "p-err").is_empty());
    let error = rwx.token_data("rwx", "p-err").remove(0);
    assert_eq!(error["attempts"], 1, "{error}");
    assert!(error["error"].as_str().unwrap().contains("'s'"), "{error}");
    assert_eq!(rwx.put("/api/models/rwx2/net", http_net(&url, json!({}))).0, 403, "not its model");
    let net = json!({"places": ["p-cmd", "p-out", "p-err", "p-in"], "transitions": [
        command_net(&[])["transitions"][0].clone(), http_net(&url, json!({}))["transitions"][0].clone()]});
    assert_eq!(rwx.put("/api/models/rwx/net", net).0, 200);
    assert_eq!(rwx.post("/api/models/rwx/transitions/call/start", json!({})).0, 200);
    assert_eq!(rwx.post("/api/models/rwx/places/p-in/tokens", json!({"data": {}})).0, 200);
    let e = last_error(&op, "rwx", "call");
    assert!(e.contains("'h'"), "{e}");
    // An operator's started command transition does not run a token another agent put there.
    let granted = agent(&op, "granted", "rwx", "granted");
    assert_eq!(op.put("/api/models/shared/net", command_net(&[])).0, 200);
    assert_eq!(op.post("/api/models/shared/transitions/run/start", json!({})).0, 200);
    assert_eq!(op.post("/api/agents/granted/grants", json!({"model": "shared"})).0, 200);
    let cmd = json!({"data": {"executor": "bash", "command": format!("curl -s {url}"), "args": {}}});
    assert_eq!(granted.post("/api/models/shared/places/p-cmd/tokens", cmd).0, 200);
    let e = last_error(&op, "shared", "run");
    assert!(e.contains("'s'") && e.contains("granted"), "{e}");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "a request reached the listener");
}

#[test]
fn secrets_reach_only_the_uses_the_operator_granted() {
    let secret = "s3cr3t-value-0042";
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_full(
        &dir.path().join("master"),
        "127.0.0.1:0",
        &[],
        &[("AGENTOS_CREDENTIAL_ENV_KEY", "from-the-environment-1")],
    );
    let op = m.client();
    let _e = Executor::start(&m, &dir.path().join("exec"), "e1", &[]);
    let (port, hits) = listener();
    assert_eq!(op.put("/api/secrets/API_KEY", json!({"value": secret})).0, 200);

    // Templates that would put a secret into a token, an event or a URL are refused outright.
    let map = json!({"places": ["p-a", "p-b"], "transitions": [{"id": "m", "kind": "map",
        "presets": {"i": {"place": "p-a"}}, "postsets": {"o": {"place": "p-b"}},
        "action": {"template": {"k": "${credentials.API_KEY}"}}, "emit": [{"to": "o"}]}]});
    let (s, v) = op.put("/api/models/leak/net", map);
    assert_eq!(s, 400, "{v}");
    assert!(v.to_string().contains("cannot read credentials"), "{v}");
    let url = format!("http://127.0.0.1:{port}/steal?k=${{credentials.API_KEY}}");
    let (s, v) = op.put("/api/models/leak/net", http_net(&url, json!({})));
    assert_eq!(s, 400, "{v}");
    let spoof = json!({"Authorization": "Bearer ${credentials.API_KEY}", "Host": "elsewhere"});
    assert_eq!(op.put("/api/models/leak/net", http_net(&format!("http://127.0.0.1:{port}/"), spoof)).0, 400);

    // A header credential without an origin grant, and one from the environment, go nowhere.
    for name in ["API_KEY", "ENV_KEY"] {
        let model = format!("hdr-{}", name.to_lowercase().replace('_', "-"));
        let headers = json!({"Authorization": format!("Bearer ${{credentials.{name}}}")});
        assert_eq!(
            op.put(&format!("/api/models/{model}/net"), http_net(&format!("http://127.0.0.1:{port}/"), headers)).0,
            200
        );
        assert_eq!(op.post(&format!("/api/models/{model}/transitions/call/start"), json!({})).0, 200);
        assert_eq!(op.post(&format!("/api/models/{model}/places/p-in/tokens"), json!({"data": {}})).0, 200);
        let e = last_error(&op, &model, "call");
        // Held by the master or not, it is not granted: which secrets exist is not told to
        // whoever reads the net's errors; the way out names setting it too.
        assert!(e.contains("not granted") && e.contains(&format!("after `agentos secret set {name}`")), "{e}");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0, "a request carrying no granted secret went out");

    // Scripts: the granted one receives its secret; others, a changed one and bash do not.
    let show = "printf 'len=%s\\n' \"${#API_KEY}\"";
    assert_eq!(op.register("show", "sh", show, Some("default")).0, 200);
    assert_eq!(op.register("other", "sh", show, Some("default")).0, 200);
    let grant = std::process::Command::new(common::BIN)
        .args(["secret", "grant", "API_KEY", "--tool", "show"])
        .env("AGENTOS_URL", &m.url)
        .env("AGENTOS_TOKEN", &m.token)
        .output()
        .unwrap();
    assert!(grant.status.success(), "{}", String::from_utf8_lossy(&grant.stderr));
    // Each case in a model of its own, so one parked failure is not retried into another's.
    let run = |model: &str, data: Value| {
        assert_eq!(op.put(&format!("/api/models/{model}/net"), command_net(&["API_KEY"])).0, 200);
        assert_eq!(op.post(&format!("/api/models/{model}/transitions/run/start"), json!({})).0, 200);
        assert_eq!(op.post(&format!("/api/models/{model}/places/p-cmd/tokens"), json!({"data": data})).0, 200);
    };
    let script = |tool: &str| json!({"executor": "script", "command": "invoke", "args": {"toolId": tool}});
    run("granted", script("show"));
    wait_for("the granted script's result", || op.token_data("granted", "p-out").len() == 1);
    let out = &op.token_data("granted", "p-out")[0];
    assert_eq!(out["stdout"], format!("len={}\n", secret.len()), "{out}");

    run("ungranted", script("other"));
    assert!(last_error(&op, "ungranted", "run").contains("not granted"));
    run("bash", json!({"executor": "bash", "command": "echo $API_KEY", "args": {}}));
    let e = last_error(&op, "bash", "run");
    assert!(e.contains("registered script"), "{e}");
    // A changed pin loses the grant.
    assert_eq!(op.register("show", "sh", "echo changed; printf 'len=%s\\n' \"${#API_KEY}\"", Some("default")).0, 200);
    run("changed", script("show"));
    assert!(last_error(&op, "changed", "run").contains("not granted"));
    for model in ["ungranted", "bash", "changed"] {
        assert!(op.token_data(model, "p-out").is_empty(), "{model} produced a result");
    }
    // A sealed run takes from the caller's environment only the names its script declared.
    let envy = json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": "envy", "name": "envy", "runtime": "sh",
        "model": "default", "env": ["KEEP"], "content": "echo \"keep=$KEEP drop=$DROP len=${#API_KEY}\""});
    assert_eq!(op.command(envy).0, 200);
    let (s, v) = op.command(json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": "bad-env", "name": "b",
        "runtime": "sh", "content": "true", "env": ["LD_PRELOAD"]}));
    assert_eq!(s, 400, "{v}");
    assert_eq!(op.post("/api/secrets/API_KEY/grants", json!({"tool": "envy"})).0, 200);
    run(
        "declared",
        json!({"executor": "script", "command": "invoke",
        "args": {"toolId": "envy", "env": {"KEEP": "kept", "DROP": "dropped"}}}),
    );
    wait_for("the sealed run's result", || op.token_data("declared", "p-out").len() == 1);
    let out = &op.token_data("declared", "p-out")[0];
    assert_eq!(out["stdout"], format!("keep=kept drop= len={}\n", secret.len()), "{out}");
    let (_, grants) = op.get("/api/secret-grants");
    let envy_grant = grants.as_array().unwrap().iter().find(|g| g["to"]["id"] == "envy").unwrap()["id"].clone();
    assert_eq!(op.request("DELETE", &format!("/api/secret-grants/{}", envy_grant.as_str().unwrap()), None).0, 200);
    let (_, grants) = op.get("/api/secret-grants");
    assert_eq!(grants.as_array().unwrap().len(), 1, "{grants}");
    let id = grants[0]["id"].as_str().unwrap();
    assert_eq!(op.request("DELETE", &format!("/api/secret-grants/{id}"), None).0, 200);
    assert_eq!(op.get("/api/secret-grants").1, json!([]));
}

#[test]
fn a_revoked_author_s_transitions_stop_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    let c = agent(&op, "c", "rwx", "mc");
    assert_eq!(c.put("/api/models/mc/net", pass_net()).0, 200);
    assert_eq!(c.post("/api/models/mc/transitions/t/start", json!({})).0, 200);
    assert_eq!(c.post("/api/models/mc/places/p-a/tokens", json!({"data": {"n": 1}})).0, 200);
    wait_for("the first token to pass", || op.token_data("mc", "p-b").len() == 1);
    assert_eq!(op.request("DELETE", "/api/agents/c", None).0, 200);
    // A new agent of the same name inherits nothing.
    let _c2 = agent(&op, "c", "rwx", "mc");
    assert_eq!(op.post("/api/models/mc/places/p-a/tokens", json!({"data": {"n": 2}})).0, 200);
    let e = last_error(&op, "mc", "t");
    assert!(e.contains("revoked"), "{e}");
    let (_, net) = op.get("/api/models/mc/net");
    assert_eq!(net["transitions"][0]["started"], false, "{net}");
    assert_eq!(op.token_data("mc", "p-a"), vec![json!({"n": 2})]);
}

#[test]
fn hidden_entries_do_not_show_through_shadowed() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    op.register("dup", "sh", "echo global", Some("default"));
    let net = json!({"places": ["p-a", "p-b"], "transitions": []});
    let (s, v) = op.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": "dup", "name": "dup",
        "model": "mb", "net": net, "inputPlace": "p-a", "outputPlace": "p-b"}));
    assert_eq!(s, 200, "{v}");
    let scripts = agent(&op, "s", "---------s", "mb");
    let (_, page) = scripts.get("/api/tool-catalog?model=mb");
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{page}");
    assert_eq!((items[0]["scope"].as_str(), items[0]["shadowed"].as_bool()), (Some("global"), Some(false)), "{page}");
    let (_, page) = op.get("/api/tool-catalog?model=mb");
    assert!(page["items"].as_array().unwrap().iter().any(|i| i["scope"] == "global" && i["shadowed"] == true));
}

#[test]
fn an_agent_cannot_replace_or_remove_another_principal_s_entry() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    assert_eq!(op.register("shared-tool", "sh", "echo operator", Some("default")).0, 200);
    let s1 = agent(&op, "s1", "---------s", "s1");
    let s2 = agent(&op, "s2", "---------s", "s2");
    let (s, v) = s1.register("shared-tool", "sh", "echo pwned", Some("default"));
    assert_eq!(s, 403, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("the operator"), "{v}");
    assert_eq!(s1.register("s1-tool", "sh", "echo s1", Some("default")).0, 200);
    assert_eq!(s1.register("s1-tool", "sh", "echo s1 again", Some("default")).0, 200, "its own");
    let (s, v) = s2.register("s1-tool", "sh", "echo s2", Some("default"));
    assert_eq!(s, 403, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("\"s1\""), "{v}");
    let (s, _) = s2.command(json!({"type": "TOOL_CATALOG_REMOVE", "id": "s1-tool", "model": "default"}));
    assert_eq!(s, 403);
    let (_, e) = op.get("/api/tool-catalog/shared-tool");
    assert_eq!(e["updatedBy"], "operator", "{e}");
    assert_eq!(op.register("s1-tool", "sh", "echo operator", Some("default")).0, 200, "the operator may");
}

/// Every route with a `{model}` parameter, for each single flag it allows: the caller's own
/// model and a granted one pass the model check; another model, `default` and another
/// principal's tool-net instance are refused.
#[test]
fn every_model_route_answers_by_model_for_each_flag() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    let stall = json!({"places": ["p-in", "p-out"], "transitions": []});
    let (s, v) = op.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": "stall", "name": "stall",
        "model": "default", "net": stall, "inputPlace": "p-in", "outputPlace": "p-out"}));
    assert_eq!(s, 200, "{v}");
    let waiting = {
        let op = op.clone();
        // Ended below by a token put into its output place, not by its timeout, however long
        // the checks take on a loaded machine.
        std::thread::spawn(move || op.invoke("stall", json!({"input": {}, "timeoutMs": 600000})))
    };
    let instance = running_instance(&op);
    let mut checked = 0;
    for f in Flag::ALL {
        let name = format!("only-{}", f.letter());
        let api = agent(&op, &name, &flags(&[f]), &name);
        assert_eq!(op.post(&format!("/api/agents/{name}/grants"), json!({"model": "granted-m"})).0, 200);
        for route in ROUTES.iter().filter(|r| r.model == ModelRule::Path) {
            let allowed = match route.permission {
                Permission::Flag(g) => g == f,
                Permission::AnyOf(gs) => gs.contains(&f),
                _ => false,
            };
            if !allowed {
                continue;
            }
            let body = if route.method == "GET" { None } else { Some(json!({"unexpected": true})) };
            for (model, ok) in [
                (name.as_str(), true),
                ("granted-m", true),
                ("someone-else", false),
                ("default", false),
                (&instance, false),
            ] {
                if ok && route.path.ends_with("/watch") {
                    continue; // an allowed stream does not end; its refusals are checked
                }
                let path =
                    route.path.replace("{model}", model).replace("{place}", "p-none").replace("{transition}", "t-none");
                let (status, v) = api.request(route.method, &path, body.clone());
                if ok {
                    assert!(status != 401 && status != 403, "{name} refused {} {path}: {status} {v}", route.method);
                } else {
                    assert_eq!(status, 403, "{name} on {} {path}: {v}", route.method);
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 40, "only {checked} checks");
    end_stall(&op, &instance, waiting);
}

/// Where a matrix request points, seen from the agent that sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Own,
    Granted,
    Other,
    Default,
    /// A tool-net instance of another principal, granted to the agent all the same.
    Instance,
}

/// What a matrix request must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// 200.
    Ok,
    /// Past the model check: whatever it answers, not a refusal for the model.
    Passes,
    /// 403 naming the model rule.
    Refused,
    /// 404: not the caller's, and not said to exist.
    Absent,
    /// 400: a name no caller may create.
    Invalid,
}

/// Checks one matrix answer.
fn check_answer(who: &str, what: &str, (status, v): &(u16, Value), want: Expect) {
    let refused_by_model = *status == 403 && v.to_string().contains("may act only in its home model");
    let ok = match want {
        Expect::Ok => *status == 200,
        Expect::Passes => *status != 401 && !refused_by_model,
        Expect::Refused => refused_by_model,
        Expect::Absent => *status == 404,
        Expect::Invalid => *status == 400,
    };
    assert!(ok, "{who} {what}: want {want:?}, got {status} {v}");
}

/// The routes whose model is a query parameter, the body or the resource itself (catalog reads,
/// invoke and call, commands, blobs, jobs, events, models), for each single flag and two
/// pairs: the caller's own model and a granted one pass; another model and another principal's
/// tool-net instance (even granted) are refused, and a refused request writes nothing. `default`
/// is the global catalog: readable and registrable by all, its jobs and events the operator's.
#[test]
fn every_query_and_resource_route_answers_by_model_for_each_flag() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--inline-output-bytes", "16"]);
    let op = m.client();
    let _e = Executor::start(&m, &dir.path().join("exec"), "e1", &[]);
    let mut principals: Vec<Vec<Flag>> = Flag::ALL.iter().map(|f| vec![*f]).collect();
    principals.push(vec![Flag::Read, Flag::Scripts]);
    principals.push(vec![Flag::Read, Flag::Logs]);
    principals.push(vec![Flag::Execute, Flag::Scripts]);
    let name_of = |fs: &[Flag]| format!("only-{}", fs.iter().map(|f| f.letter()).collect::<String>());
    let owns: Vec<String> = principals.iter().map(|fs| name_of(fs)).collect();

    // A local script in each model (its content names the model, so each has its own blob), and
    // one job run in each by the operator, whose output is long enough to be a blob.
    let mut entry_urn = std::collections::BTreeMap::new();
    let mut job = std::collections::BTreeMap::new();
    for model in owns.iter().map(String::as_str).chain(["granted-m", "someone-else", "default"]) {
        let content = format!("echo 'the output of a job in model {model}'");
        assert_eq!(op.register("loc", "sh", &content, Some(model)).0, 200);
        let (_, e) = op.get(&format!("/api/tool-catalog/loc?model={model}"));
        entry_urn.insert(model.to_string(), e["binding"]["scriptUrn"].as_str().unwrap().to_string());
        let (s, r) = op.post(&format!("/api/tools/loc/invoke?model={model}"), json!({"timeoutMs": 20000}));
        assert_eq!(s, 200, "{r}");
        let blob = r["stdoutBlob"]["urn"].as_str().unwrap_or_else(|| panic!("no output blob: {r}")).to_string();
        job.insert(model.to_string(), (r["jobId"].as_str().unwrap().to_string(), blob));
    }
    let stall = json!({"places": ["p-in", "p-out"], "transitions": []});
    let (s, v) = op.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": "stall", "name": "stall",
        "model": "default", "net": stall, "inputPlace": "p-in", "outputPlace": "p-out"}));
    assert_eq!(s, 200, "{v}");
    let waiting = {
        let op = op.clone();
        // Ended below by a token put into its output place, not by its timeout.
        std::thread::spawn(move || op.invoke("stall", json!({"input": {}, "timeoutMs": 600000})))
    };
    let instance = running_instance(&op);

    let mut checked = 0;
    for fs in &principals {
        let name = name_of(fs);
        let api = agent(&op, &name, &flags(fs), &name);
        for granted in ["granted-m", instance.as_str()] {
            let (s, v) = op.post(&format!("/api/agents/{name}/grants"), json!({"model": granted}));
            assert_eq!(s, 200, "granting {granted}: {v}");
        }
        let has = |f: Flag| fs.contains(&f);
        let (_, before) = op.get(&format!("/api/events?principal={name}&limit=1000"));
        let before = before.as_array().unwrap().len();
        let mut registered_in_default = 0;
        for place in [Place::Own, Place::Granted, Place::Other, Place::Default, Place::Instance] {
            let model = match place {
                Place::Own => name.as_str(),
                Place::Granted => "granted-m",
                Place::Other => "someone-else",
                Place::Default => "default",
                Place::Instance => instance.as_str(),
            };
            let usable = matches!(place, Place::Own | Place::Granted);
            let catalog = usable || place == Place::Default;
            let by_model = |pass: Expect| if catalog { pass } else { Expect::Refused };
            let mut cases: Vec<(String, (u16, Value), Expect)> = Vec::new();
            let mut ask = |what: String, resp: (u16, Value), want: Expect| cases.push((what, resp, want));

            if fs.iter().any(|f| CATALOG_READ_FLAGS.contains(f)) {
                let path = format!("/api/tool-catalog?model={model}");
                ask(path.clone(), api.get(&path), by_model(Expect::Ok));
                let shown = if has(Flag::Scripts) { Expect::Ok } else { Expect::Passes };
                for path in [
                    format!("/api/tool-catalog/loc?model={model}"),
                    format!("/api/tool-catalog/loc/history?model={model}"),
                ] {
                    ask(path.clone(), api.get(&path), by_model(shown));
                }
            }
            if has(Flag::Execute) || has(Flag::ToolNets) {
                // A script runs for who may see it ('s') and run it ('x').
                let ran = if has(Flag::Execute) && has(Flag::Scripts) { Expect::Ok } else { Expect::Passes };
                let path = format!("/api/tools/loc/invoke?model={model}");
                ask(path.clone(), api.post(&path, json!({"timeoutMs": 20000})), by_model(ran));
                let path = format!("/api/tools/loc/call?model={model}");
                ask(path.clone(), api.post(&path, json!({"tool": "run", "args": []})), by_model(ran));
            }
            if has(Flag::Scripts) {
                let id = format!("reg-{name}");
                let body = json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": id, "name": id, "runtime": "sh",
                    "content": format!("echo {name}"), "model": model});
                ask(format!("register a script in {model}"), api.command(body), by_model(Expect::Ok));
                let remove = json!({"type": "TOOL_CATALOG_REMOVE", "id": id, "model": model});
                ask(format!("remove its script from {model}"), api.command(remove), by_model(Expect::Ok));
                registered_in_default += 2 * usize::from(place == Place::Default);
                // The operator's entry: refused for its owner where the model passes.
                let remove = json!({"type": "TOOL_CATALOG_REMOVE", "id": "loc", "model": model});
                ask(format!("remove the operator's loc from {model}"), api.command(remove), by_model(Expect::Passes));
            }
            if has(Flag::Write) {
                let id = format!("net-{name}");
                let body = json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": id, "name": id, "model": model,
                    "net": {"places": ["p-in", "p-out"], "transitions": []}, "inputPlace": "p-in", "outputPlace": "p-out"});
                ask(format!("register a tool net in {model}"), api.command(body), by_model(Expect::Ok));
                registered_in_default += usize::from(place == Place::Default);
                let want = match place {
                    Place::Own | Place::Granted => Expect::Passes,
                    Place::Other | Place::Default => Expect::Refused,
                    Place::Instance => Expect::Invalid,
                };
                ask(format!("create model {model}"), api.post("/api/models", json!({"name": model})), want);
            }
            if has(Flag::Read) && place != Place::Instance {
                // Entry content: where the caller may read the catalog and sees scripts.
                let want = if catalog && has(Flag::Scripts) { Expect::Ok } else { Expect::Absent };
                let path = format!("/api/blobs/{}", entry_urn[model]);
                let (s, bytes) = api.get_bytes(&path);
                ask(path, (s, Value::from(bytes.len())), want);
                // Job output: the job's model decides.
                let path = format!("/api/blobs/{}", job[model].1);
                let (s, bytes) = api.get_bytes(&path);
                ask(path, (s, Value::from(bytes.len())), if usable { Expect::Ok } else { Expect::Absent });
            }
            if place != Place::Instance {
                // Any token: `l` in the job's model, or the job's invoker (the operator here).
                let path = format!("/api/jobs/{}", job[model].0);
                let want = if usable && has(Flag::Logs) { Expect::Ok } else { Expect::Absent };
                ask(path.clone(), api.get(&path), want);
            }
            if has(Flag::Logs) {
                let (s, events) = api.get("/api/events?limit=1000");
                assert_eq!(s, 200, "{events}");
                let seen = events.as_array().unwrap().iter().any(|e| e["model"] == model);
                assert_eq!(seen, usable, "{name} sees the events of {model}: {seen}");
            }
            if has(Flag::Read) {
                let (s, models) = api.get("/api/models");
                assert_eq!(s, 200, "{models}");
                let listed = models.as_array().unwrap().iter().any(|m| m["name"] == model);
                assert_eq!(listed, catalog, "{name} has {model} listed: {listed}");
            }
            for (what, resp, want) in cases {
                check_answer(&name, &what, &resp, want);
                checked += 1;
            }
        }
        // Refused requests wrote nothing: everything this agent wrote is in a model it may use,
        // or its own entries in the global catalog.
        let (_, events) = op.get(&format!("/api/events?principal={name}&limit=1000"));
        let events = &events.as_array().unwrap()[before..];
        let elsewhere: Vec<&Value> = events
            .iter()
            .filter(|e| e["model"] != name.as_str() && e["model"] != "granted-m")
            .filter(|e| !(e["model"] == "default" && (e["type"] == "ToolRegistered" || e["type"] == "ToolRemoved")))
            .collect();
        assert!(elsewhere.is_empty(), "{name} wrote outside its models: {elsewhere:?}");
        let in_default = events.iter().filter(|e| e["model"] == "default").count();
        assert_eq!(in_default, registered_in_default, "{name}'s catalog changes in default: {events:?}");
    }
    assert!(checked >= 150, "only {checked} checks");
    // The instance lived through every check: its refusals were for it, not for a model gone.
    let (_, models) = op.get("/api/models");
    assert!(models.as_array().unwrap().iter().any(|m| m["name"] == instance.as_str()), "{models}");
    end_stall(&op, &instance, waiting);
}

/// Item 6 of the audit: a `w`-only agent's apply was answered 403 ("may not read nets") after
/// the net was written. A valid apply to its own model answers 200 with the net written; a
/// refused one (another model, an invalid document) leaves no `Net applied` event.
#[test]
fn a_w_only_agent_s_apply_answers_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    let w = agent(&op, "w", &flags(&[Flag::Write]), "mw");
    let (s, v) = w.put("/api/models/mw/net", pass_net());
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["transitions"][0]["id"], "t", "{v}");
    let (_, net) = op.get("/api/models/mw/net");
    assert_eq!(net["doc"]["transitions"][0]["id"], "t", "the net was not written: {net}");
    assert_eq!(w.get("/api/models/mw/net").0, 403, "reading still needs 'r'");

    assert_eq!(w.put("/api/models/other/net", pass_net()).0, 403);
    let invalid = json!({"places": ["p-a"], "transitions": [{"id": "t", "kind": "pass",
        "presets": {"i": {"place": "p-missing"}}, "postsets": {}, "emit": []}]});
    assert_eq!(w.put("/api/models/mw/net", invalid).0, 400);
    assert_eq!(op.get("/api/models/other/net").0, 404, "the refused apply made a model");
    let (_, events) = op.get("/api/events?principal=w&limit=1000");
    let applied: Vec<&Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "Net" && e["payload"].get("applied").is_some())
        .collect();
    assert_eq!(applied.len(), 1, "one apply happened: {applied:?}");
    assert_eq!(applied[0]["model"], "mw");
}

/// A listener on 127.0.0.1 that keeps the head of every request it gets and answers each with
/// `answer` (a whole HTTP response).
fn recording_listener(answer: String) -> (u16, Arc<std::sync::Mutex<Vec<String>>>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&req).contains("\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(n) if n > 0 => req.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            s2.lock().unwrap().push(String::from_utf8_lossy(&req).into_owned());
            let _ = s.write_all(answer.as_bytes());
        }
    });
    (port, seen)
}

fn ok_answer() -> String {
    let body = r#"{"ok":true}"#;
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Registers a tool net in the global catalog whose input place is the first of its places.
fn register_toolnet(op: &Api, id: &str, net: Value) {
    let input = net["places"][0].clone();
    let (s, v) = op.command(json!({"type": "TOOL_CATALOG_REGISTER_TOOLNET", "id": id, "name": id,
        "model": "default", "net": net, "inputPlace": input, "outputPlace": "p-out"}));
    assert_eq!(s, 200, "{v}");
}

/// A grant narrowed with `--model ma` applies to the fires of a tool-net instance invoked from
/// `ma` (whose own model is `tni-…`), for an http header and a script alike, and nowhere else.
#[test]
fn a_secret_grant_narrowed_to_a_model_holds_in_tool_net_instances_invoked_from_it() {
    let secret = "narrowed-secret-0042";
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let op = m.client();
    let _e = Executor::start(&m, &dir.path().join("exec"), "e1", &[]);
    let (port, seen) = recording_listener(ok_answer());
    let origin = format!("http://127.0.0.1:{port}");
    assert_eq!(op.put("/api/secrets/API_KEY", json!({"value": secret})).0, 200);
    assert_eq!(op.post("/api/secrets/API_KEY/grants", json!({"origin": origin, "model": "ma"})).0, 200);
    assert_eq!(op.register("show", "sh", "printf 'len=%s\\n' \"${#API_KEY}\"", Some("default")).0, 200);
    assert_eq!(op.post("/api/secrets/API_KEY/grants", json!({"tool": "show", "model": "ma"})).0, 200);
    register_toolnet(
        &op,
        "fetch",
        http_net(&format!("{origin}/x"), json!({"Authorization": "Bearer ${credentials.API_KEY}"})),
    );
    register_toolnet(&op, "runner", command_net(&["API_KEY"]));

    let (s, v) = op.post("/api/tools/fetch/invoke?model=ma", json!({"input": {}, "timeoutMs": 10000}));
    assert_eq!(s, 200, "{v}");
    let requests = seen.lock().unwrap().clone();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert!(requests[0].to_lowercase().contains(&format!("authorization: bearer {secret}")), "{requests:?}");
    let show = json!({"executor": "script", "command": "invoke", "args": {"toolId": "show"}});
    let (s, v) = op.post("/api/tools/runner/invoke?model=ma", json!({"input": show, "timeoutMs": 10000}));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["output"]["stdout"], format!("len={}\n", secret.len()), "{v}");

    // From another model, neither is granted.
    let (s, v) = op.post("/api/tools/fetch/invoke?model=mb", json!({"input": {}, "timeoutMs": 20000}));
    assert_eq!((s, v["error"]["code"].as_str()), (422, Some("toolnet_failed")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("not granted"), "{v}");
    let (s, v) = op.post("/api/tools/runner/invoke?model=mb", json!({"input": show, "timeoutMs": 20000}));
    assert_eq!((s, v["error"]["code"].as_str()), (422, Some("toolnet_failed")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("not granted"), "{v}");
    assert_eq!(seen.lock().unwrap().len(), 1, "a request went out without its grant");
}

/// A request that carries a secret to its granted origin is not followed to another origin
/// (`OutboundPolicy::sealed_client`): the redirect is the answer. The same request without the
/// secret is followed, so the other origin is reachable.
#[test]
fn a_secret_carrying_request_is_not_redirected_to_another_origin() {
    let secret = "redirect-secret-0042";
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    let (other_port, other_seen) = recording_listener(ok_answer());
    let redirect = format!(
        "HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:{other_port}/elsewhere\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    let (port, seen) = recording_listener(redirect);
    let origin = format!("http://127.0.0.1:{port}");
    assert_eq!(op.put("/api/secrets/API_KEY", json!({"value": secret})).0, 200);
    assert_eq!(op.post("/api/secrets/API_KEY/grants", json!({"origin": origin})).0, 200);
    let run = |model: &str, headers: Value| {
        assert_eq!(op.put(&format!("/api/models/{model}/net"), http_net(&format!("{origin}/start"), headers)).0, 200);
        assert_eq!(op.post(&format!("/api/models/{model}/transitions/call/start"), json!({})).0, 200);
        assert_eq!(op.post(&format!("/api/models/{model}/places/p-in/tokens"), json!({"data": {}})).0, 200);
    };
    run("sealed", json!({"Authorization": "Bearer ${credentials.API_KEY}"}));
    let e = last_error(&op, "sealed", "call");
    assert!(e.contains("answered 302"), "{e}");
    assert!(seen.lock().unwrap()[0].contains(secret), "the granted origin got the secret");
    assert!(other_seen.lock().unwrap().is_empty(), "the redirect was followed: {:?}", other_seen.lock().unwrap());

    run("plain", json!({}));
    wait_for("the plain request's answer", || op.token_data("plain", "p-out").len() == 1);
    let other = other_seen.lock().unwrap().clone();
    assert_eq!(other.len(), 1, "{other:?}");
    assert!(!other[0].contains(secret), "{other:?}");
}

/// An invocation of a tool that does not exist is answered 404 without queuing a job, but only
/// to a caller who may invoke: one without `x` is refused 403 whether the tool exists or not,
/// and learns nothing of the catalog from the difference.
#[test]
fn an_unknown_tool_is_404_to_an_invoker_and_403_to_a_caller_who_may_not_invoke() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    assert_eq!(op.register("real", "sh", "echo ok", Some("default")).0, 200);
    let (status, v) = op.invoke("no-such-tool", json!({}));
    assert_eq!((status, v["error"]["code"].as_str()), (404, Some("not_found")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("no tool \"no-such-tool\""), "{v}");
    assert_eq!(op.get("/api/jobs").1, json!([]), "a job was queued for a tool that is not there");
    let reader = op.agent("reader", "r");
    for id in ["real", "no-such-tool"] {
        let (status, v) = reader.invoke(id, json!({}));
        assert_eq!(status, 403, "{id}: {v}");
    }
}

/// A sealed run ignores a caller-set `BASH_ENV` and `LD_PRELOAD` (a hook that would copy the
/// secret out never runs), and a script printing its secret base64- and URL-encoded has both
/// redacted in what is stored.
#[test]
fn a_sealed_run_takes_no_hook_from_the_caller_and_its_encoded_secret_is_redacted() {
    use std::os::unix::fs::PermissionsExt;
    let secret = "s3cr3t/v@lue+0042 x";
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let op = m.client();
    let _e = Executor::start(&m, &dir.path().join("exec"), "e1", &[]);
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let leaked = shared.join("leaked");
    let hook = shared.join("hook.sh");
    std::fs::write(&hook, format!("echo \"$API_KEY\" > {}\n", leaked.display())).unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(op.put("/api/secrets/API_KEY", json!({"value": secret})).0, 200);
    let script = r#"printf 'bash_env=%s ld=%s len=%s\n' "$BASH_ENV" "$LD_PRELOAD" "${#API_KEY}"
printf 'b64=%s\n' "$(printf '%s' "$API_KEY" | base64 -w0)"
printf 'url=%s\n' "$(jq -rn --arg v "$API_KEY" '$v|@uri')"
"#;
    assert_eq!(op.register("show", "bash", script, Some("default")).0, 200);
    assert_eq!(op.post("/api/secrets/API_KEY/grants", json!({"tool": "show"})).0, 200);
    assert_eq!(op.put("/api/models/m/net", command_net(&["API_KEY"])).0, 200);
    assert_eq!(op.post("/api/models/m/transitions/run/start", json!({})).0, 200);
    let env = json!({"BASH_ENV": hook.display().to_string(), "LD_PRELOAD": "/nonexistent/hook.so"});
    let token = json!({"executor": "script", "command": "invoke", "args": {"toolId": "show", "env": env}});
    assert_eq!(op.post("/api/models/m/places/p-cmd/tokens", json!({"data": token})).0, 200);
    wait_for("the sealed run's result", || op.token_data("m", "p-out").len() == 1);
    let out = &op.token_data("m", "p-out")[0];
    let stdout = out["stdout"].as_str().unwrap();
    assert_eq!(stdout, format!("bash_env= ld= len={}\nb64=[redacted]\nurl=[redacted]\n", secret.len()), "{out}");
    assert!(!leaked.exists(), "the caller's BASH_ENV ran in the sealed run");
    // Nothing the log keeps holds the secret in any of the forms printed.
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, secret);
    let (_, events) = op.get("/api/events?limit=1000");
    let text = events.to_string();
    for form in [secret, b64.as_str(), "s3cr3t%2Fv%40lue%2B0042%20x"] {
        assert!(!text.contains(form), "the log holds {form:?}");
    }
}

/// A scheduled fire in a tool-net instance binds none of its invoker's tokens; the invoker is
/// behind it all the same, so it does no more than the invoker and the author both may.
#[test]
fn a_scheduled_fire_in_a_tool_net_instance_acts_with_its_invoker_s_authority() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    let (port, hits) = listener();
    let net = json!({"places": ["p-in", "p-out"], "transitions": [{"id": "tick", "kind": "http", "mode": "manual",
        "schedule": {"everyMs": 100}, "presets": {}, "postsets": {"o": {"place": "p-out"}},
        "action": {"method": "GET", "url": format!("http://127.0.0.1:{port}/tick")}, "emit": [{"to": "o"}]}]});
    register_toolnet(&op, "ticker", net);
    // The operator's own call answers: the refusal below is the invoker, not a broken net.
    let (s, v) = op.invoke("ticker", json!({"input": {}, "timeoutMs": 10000}));
    assert_eq!(s, 200, "{v}");
    let after_operator = hits.load(Ordering::SeqCst);
    assert!(after_operator >= 1);

    let t = agent(&op, "t", &flags(&[Flag::ToolNets]), "mt");
    let (s, v) = t.invoke("ticker", json!({"input": {}, "timeoutMs": 2000}));
    assert_eq!(s, 504, "{v}");
    let why = v["error"]["message"].as_str().unwrap();
    assert!(why.contains("refused") && why.contains("'x'") && why.contains('t'), "{v}");
    assert_eq!(hits.load(Ordering::SeqCst), after_operator, "the scheduled fire reached the listener for t");
}

/// `GET /api/executors` names to an agent only the jobs in models it may use; the others an
/// executor holds are counted. The operator sees every job.
#[test]
fn the_executor_list_names_only_the_jobs_a_reader_may_see() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let op = m.client();
    let _e = Executor::start(&m, &dir.path().join("exec"), "e1", &[]);
    assert_eq!(op.register("slow", "sh", "sleep 30", Some("default")).0, 200);
    let resp = op
        .http
        .post(format!("{}/api/tools/slow/invoke?model=mb", m.url))
        .bearer_auth(&m.token)
        .header("Prefer", "respond-async")
        .json(&json!({"timeoutMs": 60000}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let job_id = resp.json::<Value>().unwrap()["jobId"].as_str().unwrap().to_string();
    let e1 = |api: &Api| {
        let (s, list) = api.get("/api/executors");
        assert_eq!(s, 200, "{list}");
        list.as_array().unwrap().iter().find(|e| e["name"] == "e1").cloned().unwrap()
    };
    wait_for("the job to be leased", || e1(&op)["state"] == "busy");
    assert_eq!(e1(&op)["jobs"], json!([job_id]));
    let outsider = agent(&op, "outsider", "r", "ma");
    let view = e1(&outsider);
    assert_eq!(
        (view["state"].clone(), view["jobs"].clone(), view["otherJobs"].clone()),
        (json!("busy"), json!([]), json!(1))
    );
    let out = std::process::Command::new(common::BIN)
        .args(["executors"])
        .env("AGENTOS_URL", &m.url)
        .env("AGENTOS_TOKEN", outsider.token.as_deref().unwrap())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("1 in other models") && !shown.contains(&job_id), "{shown}");
    let insider = agent(&op, "insider", "r", "mb");
    let view = e1(&insider);
    assert_eq!((view["jobs"].clone(), view["otherJobs"].clone()), (json!([job_id]), json!(0)), "{view}");
}

/// `Host`, `Forwarded` and `X-Forwarded-*` cannot be set on a request that carries a secret
/// (they would let the far end be told the request came from elsewhere); the net is refused when
/// applied, naming the header. Without a secret they are allowed.
#[test]
fn forwarding_headers_are_refused_on_a_request_that_carries_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    assert_eq!(op.put("/api/secrets/API_KEY", json!({"value": "forwarded-secret-0042"})).0, 200);
    for header in ["Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "x-forwarded-proto", "Host"] {
        let mut headers = json!({"Authorization": "Bearer ${credentials.API_KEY}"});
        headers[header] = json!("for=203.0.113.9");
        let (s, v) = op.put("/api/models/m/net", http_net("http://127.0.0.1:9/", headers));
        assert_eq!(s, 400, "{header}: {v}");
        let text = v.to_string();
        assert!(text.contains(&format!("{header} cannot be set on a request that carries credentials")), "{v}");
        assert!(text.contains(&format!("/action/headers/{header}")), "{v}");
        let (s, v) = op.put("/api/models/m/net", http_net("http://127.0.0.1:9/", json!({header: "for=203.0.113.9"})));
        assert_eq!(s, 200, "{header} without a secret: {v}");
    }
}

/// Runs `agentos` as the operator of `m`; answers stdout, asserting success.
fn cli(m: &Master, args: &[&str]) -> String {
    let out = std::process::Command::new(common::BIN)
        .args(args)
        .env("AGENTOS_URL", &m.url)
        .env("AGENTOS_TOKEN", &m.token)
        .output()
        .unwrap();
    assert!(out.status.success(), "agentos {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// `agentos secret grant`, `secret grants`, `secret ungrant`, `agent grant` and `agent ungrant`
/// end to end: each change is an event the log shows, and the lists follow.
#[test]
fn secret_and_model_grants_are_listed_revoked_and_logged_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    assert_eq!(op.put("/api/secrets/API_KEY", json!({"value": "cli-secret-0042"})).0, 200);
    let line = cli(&m, &["secret", "grant", "API_KEY", "--origin", "https://API.example.com:443", "--model", "ma"]);
    assert!(line.contains("origin https://api.example.com only in model ma"), "{line}");
    let id = line.split_whitespace().next().unwrap().to_string();
    let listed = cli(&m, &["secret", "grants"]);
    assert!(listed.contains(&id) && listed.contains("API_KEY"), "{listed}");
    // A grant with no use names both uses it could have.
    let none = common::run(&m, &m.token, std::path::Path::new(common::BIN), &["secret", "grant", "API_KEY"]);
    assert_eq!(none.code, 2, "{}", none.stderr);
    assert!(none.stderr.contains("<--tool <TOOL>|--origin <ORIGIN>>"), "{}", none.stderr);
    let json_list: Value = serde_json::from_str(&cli(&m, &["secret", "grants", "--json"])).unwrap();
    assert_eq!(json_list[0]["id"], id.as_str(), "{json_list}");
    assert!(cli(&m, &["secret", "ungrant", &id]).contains(&format!("secret grant {id} revoked")));
    assert_eq!(cli(&m, &["secret", "grants"]).trim(), "", "the grant is still listed");

    let _a = agent(&op, "a", "r", "ma");
    assert!(cli(&m, &["agent", "grant", "a", "--model", "mb"]).contains("a may now act in model mb"));
    assert!(cli(&m, &["agent", "list"]).contains("(granted mb)"));
    assert!(cli(&m, &["agent", "ungrant", "a", "--model", "mb"]).contains("a may no longer act in model mb"));
    assert!(!cli(&m, &["agent", "list"]).contains("granted"));

    let (_, events) = op.get("/api/events?limit=1000");
    let kinds: Vec<(&str, &str)> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"].as_str().unwrap().contains("Grant"))
        .map(|e| (e["type"].as_str().unwrap(), e["principal"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("SecretGranted", "operator"),
            ("SecretGrantRevoked", "operator"),
            ("ModelGranted", "operator"),
            ("ModelGrantRevoked", "operator")
        ]
    );
    let granted = events.as_array().unwrap().iter().find(|e| e["type"] == "SecretGranted").unwrap();
    assert_eq!(granted["payload"]["id"], id.as_str(), "{granted}");
    assert!(!events.to_string().contains("cli-secret-0042"), "the log holds the secret in clear");
}

/// At start the master names secrets set before the 8-byte minimum, with the command that
/// replaces them, and every `AGENTOS_CREDENTIAL_*` variable it ignores, with the commands that
/// make it a granted secret.
#[test]
fn the_master_reports_short_secrets_and_ignored_credential_variables_at_start() {
    use chacha20poly1305::aead::{Aead, KeyInit, Payload};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("master");
    let log = dir.path().join("master.log");
    let mut m = Master::start_logged(&data, &log, &[]);
    assert_eq!(m.client().put("/api/secrets/LONG_ONE", json!({"value": "long-enough-0042"})).0, 200);
    let (s, v) = m.client().put("/api/secrets/SHORT", json!({"value": "short"}));
    assert_eq!(s, 400, "a new short secret is refused: {v}");
    m.terminate();
    // A secret written before the minimum: the same record an older master wrote.
    let key: [u8; 32] = std::fs::read(data.join("secrets.key")).unwrap().try_into().unwrap();
    let nonce = [7u8; 24];
    let ciphertext = chacha20poly1305::XChaCha20Poly1305::new(&key.into())
        .encrypt(&nonce.into(), Payload { msg: b"short", aad: b"SHORT" })
        .unwrap();
    let b64 = |b: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b);
    let payload = json!({"name": "SHORT", "nonce": b64(&nonce), "ciphertext": b64(&ciphertext)}).to_string();
    let conn = rusqlite::Connection::open(data.join("events.db")).unwrap();
    conn.execute(
        "INSERT INTO events (model, type, key, payload, principal, time, v) \
         SELECT model, type, 'secret:SHORT', ?1, principal, time, v FROM events WHERE type = 'SecretSet' LIMIT 1",
        [payload],
    )
    .unwrap();
    drop(conn);

    let log = dir.path().join("restarted.log");
    let _m = Master::start_logged(&data, &log, &[("AGENTOS_CREDENTIAL_OLD_KEY", "from-the-environment-1")]);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("secret SHORT is shorter than 8 bytes") && text.contains("agentos secret set SHORT"),
        "{text}"
    );
    assert!(!text.contains("secret LONG_ONE is shorter"), "{text}");
    assert!(
        text.contains("AGENTOS_CREDENTIAL_OLD_KEY is ignored")
            && text.contains("agentos secret set OLD_KEY")
            && text.contains("agentos secret grant OLD_KEY"),
        "{text}"
    );
    assert!(!text.contains("from-the-environment-1"), "the log holds the variable's value");
}

/// Reads `stream` until its text holds `want`, or its answer ends (the chunked body's last,
/// empty chunk, or the connection closed); what came, and whether it ended.
fn read_watch(stream: &mut std::net::TcpStream, got: &mut String, want: &str) -> bool {
    stream.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 4096];
    while !got.contains(want) {
        if got.ends_with("\r\n0\r\n\r\n") {
            return true;
        }
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Err(e) => panic!("the watch stream neither answered nor ended: {e}; {got}"),
            Ok(n) => got.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
    false
}

fn open_watch(m: &Master, token: &str, model: &str) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(m.url.trim_start_matches("http://")).unwrap();
    write!(s, "GET /api/models/{model}/watch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n").unwrap();
    s
}

/// Regression: access to a watch stream was checked once, when it opened, so a revoked agent's
/// open stream (or one whose grant of the model was taken back) went on receiving the model's
/// tokens. It now ends, saying why, before anything else is sent.
#[test]
fn a_watch_stream_ends_when_its_agent_is_revoked_or_its_grant_taken_back() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    for model in ["watcher", "shared"] {
        let (status, v) = op.put(&format!("/api/models/{model}/net"), json!({"places": ["p-a"], "transitions": []}));
        assert_eq!(status, 200, "{v}");
    }
    let put = |model: &str, data: &str| {
        let (status, v) = op.post(&format!("/api/models/{model}/places/p-a/tokens"), json!({"data": data}));
        assert_eq!(status, 200, "{v}");
    };

    // Revoked: its stream ends.
    let watcher = op.agent("watcher", "r");
    let mut watch = open_watch(&m, watcher.token.as_deref().unwrap(), "watcher");
    let mut got = String::new();
    put("watcher", "before-revoke");
    assert!(!read_watch(&mut watch, &mut got, "before-revoke"), "{got}");
    assert_eq!(op.request("DELETE", "/api/agents/watcher", None).0, 200);
    put("watcher", "after-revoke");
    read_watch(&mut watch, &mut got, "event: ended");
    assert!(got.contains("watcher was revoked"), "{got}");
    // Nothing after it: the stream is closed.
    assert!(read_watch(&mut watch, &mut got, "after-revoke"), "the stream stayed open: {got}");
    assert!(!got.contains("after-revoke"), "{got}");

    // Its grant of the model taken back: its stream of that model ends.
    let guest = op.agent("guest", "r");
    assert_eq!(op.post("/api/agents/guest/grants", json!({"model": "shared"})).0, 200);
    let mut watch = open_watch(&m, guest.token.as_deref().unwrap(), "shared");
    let mut got = String::new();
    put("shared", "before-grant-revoked");
    assert!(!read_watch(&mut watch, &mut got, "before-grant-revoked"), "{got}");
    assert_eq!(op.request("DELETE", "/api/agents/guest/grants/shared", None).0, 200);
    read_watch(&mut watch, &mut got, "event: ended");
    assert!(got.contains("guest may act only in its home model"), "{got}");
    put("shared", "after-grant-revoked");
    assert!(read_watch(&mut watch, &mut got, "after-grant-revoked"), "the stream stayed open: {got}");
    assert!(!got.contains("after-grant-revoked"), "{got}");
}

/// Regression: listing models showed every agent the places and token counts of `default`'s
/// net, which is the operator's unless granted; only its catalog (the global one, open to every
/// reader) is listed to an agent without a grant.
#[test]
fn an_agent_lists_default_s_catalog_but_not_its_net() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    let net = json!({"places": ["p-secret-plans"], "transitions": []});
    assert_eq!(op.put("/api/models/default/net", net).0, 200);
    assert_eq!(op.post("/api/models/default/places/p-secret-plans/tokens", json!({"data": 1})).0, 200);
    let places = |api: &Api| -> Value {
        let (status, models) = api.get("/api/models");
        assert_eq!(status, 200, "{models}");
        models.as_array().unwrap().iter().find(|m| m["name"] == "default").unwrap()["places"].clone()
    };
    let agent = op.agent("reader", "r");
    assert_eq!(places(&agent), json!([{"name": "p-tool-catalog", "tokens": 0}]));
    assert_eq!(places(&op), json!([{"name": "p-tool-catalog", "tokens": 0}, {"name": "p-secret-plans", "tokens": 1}]));
    // Granted, the agent sees the net too.
    assert_eq!(op.post("/api/agents/reader/grants", json!({"model": "default"})).0, 200);
    assert_eq!(places(&agent), places(&op));
}

/// Regression: an agent could declare links to models it may not use, and every reader of
/// that model's links (the operator among them) was shown them; a relation could hold line
/// breaks.
#[test]
fn a_link_reaches_only_models_its_author_may_use() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let op = m.client();
    assert_eq!(op.put("/api/models/c1/net", json!({"places": ["p-in"], "transitions": []})).0, 200);
    let agent = op.agent("noh", "rwx");
    let link = |model: &str, relation: &str| {
        json!({"places": ["p-out"], "transitions": [{"id": "l", "kind": "link", "from": {"place": "p-out"},
            "to": {"model": model, "place": "p-in"}, "relation": relation}]})
    };
    let (status, v) = agent.put("/api/models/noh/net", link("c1", "feeds"));
    assert_eq!(status, 403, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().starts_with("link \"l\": noh may act only in"), "{v}");
    assert_eq!(op.get("/api/models/c1/links").1, json!([]));
    // Granted the model, it may.
    assert_eq!(op.post("/api/agents/noh/grants", json!({"model": "c1"})).0, 200);
    assert_eq!(agent.put("/api/models/noh/net", link("c1", "feeds")).0, 200);
    assert_eq!(op.get("/api/models/c1/links").1.as_array().unwrap().len(), 1);
    let (status, v) = agent.put("/api/models/noh/net", link("c1", "x\ny"));
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_net")), "{v}");
}
