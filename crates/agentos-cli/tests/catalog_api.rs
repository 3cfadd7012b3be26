//! The catalog API end to end against the real master: registration, shadowing, history, blobs, errors.

mod common;

use common::{Master, error_code, sha256_hex};
use serde_json::{Value, json};

fn ids_and_scopes(page: &Value) -> Vec<(String, String, bool)> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].as_str().unwrap().to_string(),
                e["scope"].as_str().unwrap().to_string(),
                e["shadowed"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

#[test]
fn registration_answers_the_pinned_entry() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let content = "console.log(JSON.stringify({ok:true}))";
    let (status, e) = api.command(json!({
        "type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": "digest", "name": "Repo digest", "runtime": "node",
        "content": content, "capabilities": ["repo"], "description": "Digests a repo",
        "input": {"type": "object", "properties": {"repo": {"type": "string"}}}
    }));
    assert_eq!(status, 200, "{e}");
    let sha = sha256_hex(content.as_bytes());
    assert_eq!(e["status"], "approved");
    assert_eq!(e["model"], "default", "the operator's home model is default");
    assert_eq!(e["scope"], "global");
    assert_eq!(e["binding"]["type"], "script");
    assert_eq!(e["binding"]["runtime"], "node");
    assert_eq!(e["binding"]["sha256"], sha);
    assert_eq!(e["binding"]["scriptUrn"], format!("urn:agentos:blob:tool-catalog/scripts/{sha}.cjs"));
    assert_eq!(e["binding"]["filename"], "digest.cjs");
    assert_eq!(e["binding"]["sizeBytes"], content.len());
    assert_eq!(e["contract"]["operations"]["run"]["input"]["properties"]["repo"]["type"], "string");

    let (status, bytes) = api.get_bytes(&format!("/api/blobs/{}", e["binding"]["scriptUrn"].as_str().unwrap()));
    assert_eq!(status, 200);
    assert_eq!(bytes, content.as_bytes());

    let (status, got) = api.get("/api/tool-catalog/digest");
    assert_eq!(status, 200);
    assert_eq!(got["binding"], e["binding"]);
}

#[test]
fn reregistering_replaces_and_keeps_history() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    assert_eq!(api.register("x", "sh", "echo one", None).0, 200);
    assert_eq!(api.register("x", "sh", "echo two", None).0, 200);
    // The same definition again writes nothing new.
    assert_eq!(api.register("x", "sh", "echo two", None).0, 200);

    let (_, got) = api.get("/api/tool-catalog/x");
    assert_eq!(got["binding"]["sha256"], sha256_hex(b"echo two"));
    let (_, page) = api.get("/api/tool-catalog?q=x");
    assert_eq!(page["total"], 1, "one current definition: {page}");

    let (status, h) = api.get("/api/tool-catalog/x/history");
    assert_eq!(status, 200);
    let events = h["events"].as_array().unwrap();
    let shas: Vec<&str> = events.iter().map(|e| e["payload"]["entry"]["binding"]["sha256"].as_str().unwrap()).collect();
    assert_eq!(shas, vec![sha256_hex(b"echo one"), sha256_hex(b"echo two")]);
    assert!(events.iter().all(|e| e["principal"] == "operator" && e["v"] == 1 && e["type"] == "ToolRegistered"));
    // Every earlier definition stays readable, blob included.
    let old_urn = events[0]["payload"]["entry"]["binding"]["scriptUrn"].as_str().unwrap();
    assert_eq!(api.get_bytes(&format!("/api/blobs/{old_urn}")).1, b"echo one");
}

#[test]
fn same_content_gives_the_same_urn_on_a_fresh_data_folder() {
    let urn_on_fresh_install = |id: &str| {
        let dir = tempfile::tempdir().unwrap();
        let m = Master::start(dir.path());
        let (_, e) = m.client().register(id, "python3", "print('same')", Some("team-a"));
        e["binding"]["scriptUrn"].as_str().unwrap().to_string()
    };
    assert_eq!(urn_on_fresh_install("a"), urn_on_fresh_install("b"));
}

#[test]
fn local_entries_shadow_global_ones() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    assert_eq!(api.register("x", "sh", "echo global", Some("default")).0, 200);
    assert_eq!(api.register("only-global", "sh", "echo g", Some("default")).0, 200);
    let (status, local) = api.register("x", "sh", "echo local", Some("m"));
    assert_eq!(status, 200);
    assert_eq!(local["scope"], "local");
    assert_eq!(local["model"], "m");

    let (_, got) = api.get("/api/tool-catalog/x?model=m");
    assert_eq!(got["binding"]["sha256"], sha256_hex(b"echo local"));
    assert_eq!(got["scope"], "local");
    let (_, got) = api.get("/api/tool-catalog/x");
    assert_eq!(got["binding"]["sha256"], sha256_hex(b"echo global"));
    assert_eq!(got["scope"], "global");
    // A model without its own x falls back to the global one.
    let (_, got) = api.get("/api/tool-catalog/only-global?model=m");
    assert_eq!(got["scope"], "global");

    let (_, page) = api.get("/api/tool-catalog?model=m");
    assert_eq!(
        ids_and_scopes(&page),
        vec![
            ("only-global".into(), "global".into(), false),
            ("x".into(), "local".into(), false),
            ("x".into(), "global".into(), true),
        ]
    );

    let (_, before) = api.get("/api/models");
    let (status, page) = api.get("/api/tool-catalog?model=never-used");
    assert_eq!(status, 200);
    assert_eq!(
        ids_and_scopes(&page),
        vec![("only-global".into(), "global".into(), false), ("x".into(), "global".into(), false)]
    );
    assert_eq!(api.get("/api/tool-catalog/x?model=never-used").1["scope"], "global");
    assert_eq!(api.get("/api/tool-catalog/x/history?model=never-used").0, 200);
    let (_, after) = api.get("/api/models");
    assert_eq!(before, after, "reading created something");
    let names: Vec<&str> = after.as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["default", "m"]);
    assert_eq!(after[1]["places"][0]["name"], "p-tool-catalog");
    assert_eq!(after[1]["places"][0]["tokens"], 1);

    // The local history is the local entry's; the global one is separate.
    let (_, h) = api.get("/api/tool-catalog/x/history?model=m");
    assert_eq!(h["scope"], "local");
    assert_eq!(h["events"].as_array().unwrap().len(), 1);
}

#[test]
fn search_filters_by_type_capability_and_text() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    for (id, caps, desc) in [
        ("forum-sentinel", vec!["forum"], "Watches the forum"),
        ("nightly-digest", vec!["digest", "repo"], "Summarises the repository"),
        ("weather", vec![], "Forecast for a city"),
    ] {
        let (s, e) = api.command(json!({"type":"TOOL_CATALOG_REGISTER_SCRIPT","id":id,"name":id.replace('-', " "),
            "runtime":"sh","content":format!("echo {id}"),"capabilities":caps,"description":desc}));
        assert_eq!(s, 200, "{e}");
    }
    let ids = |q: &str| -> Vec<String> {
        let (s, page) = api.get(&format!("/api/tool-catalog?{q}"));
        assert_eq!(s, 200, "{page}");
        page["items"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(ids("capability=repo"), vec!["nightly-digest"]);
    assert_eq!(ids("q=FORUM"), vec!["forum-sentinel"]);
    assert_eq!(ids("q=repository"), vec!["nightly-digest"]);
    assert_eq!(ids("q=city"), vec!["weather"]);
    assert_eq!(ids("type=script").len(), 3);
    assert!(ids("type=docker").is_empty());
    assert_eq!(ids("limit=1&offset=1"), vec!["nightly-digest"]);
    let (_, page) = api.command(json!({"type":"TOOL_CATALOG_SEARCH","q":"digest"}));
    assert_eq!(page["total"], 1);
    let (_, e) = api.command(json!({"type":"TOOL_CATALOG_GET","id":"weather"}));
    assert_eq!(e["id"], "weather");
    assert_eq!(error_code(&api.get("/api/tool-catalog?type=ftp"), 400), "invalid_type");
    assert_eq!(error_code(&api.get("/api/tool-catalog?tpye=script"), 400), "invalid_query");
    assert_eq!(error_code(&api.get("/api/tool-catalog?limit=0"), 400), "invalid_limit");
    assert_eq!(error_code(&api.get("/api/tool-catalog?model=Bad..Model"), 400), "invalid_model");
}

#[test]
fn remove_takes_an_entry_out_and_keeps_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    api.register("gone", "sh", "echo", None);
    let (s, r) = api.command(json!({"type":"TOOL_CATALOG_REMOVE","id":"gone"}));
    assert_eq!(s, 200, "{r}");
    assert_eq!(error_code(&api.get("/api/tool-catalog/gone"), 404), "not_found");
    let (_, h) = api.get("/api/tool-catalog/gone/history");
    let kinds: Vec<&str> = h["events"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, vec!["ToolRegistered", "ToolRemoved"]);
    assert_eq!(error_code(&api.command(json!({"type":"TOOL_CATALOG_REMOVE","id":"gone"})), 404), "not_found");
}

#[test]
fn a_blob_altered_on_disk_is_refused_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let (_, e) = api.register("victim", "sh", "echo safe", None);
    let sha = e["binding"]["sha256"].as_str().unwrap();
    let urn = e["binding"]["scriptUrn"].as_str().unwrap();
    let path = m.blob_file("tool-catalog/scripts", sha);
    assert_eq!(std::fs::read(&path).unwrap(), b"echo safe");
    std::fs::write(&path, b"rm -rf / # tampered").unwrap();

    let (status, body) = api.get_bytes(&format!("/api/blobs/{urn}"));
    assert_eq!(status, 500);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "blob_corrupt", "{body}");
    assert!(!body.to_string().contains("tampered"), "corrupt bytes were served: {body}");

    // Registering the pinned content again repairs the stored copy.
    api.register("victim-again", "sh", "echo safe", None);
    assert_eq!(api.get_bytes(&format!("/api/blobs/{urn}")), (200, b"echo safe".to_vec()));
}

#[test]
fn bad_input_gets_a_clear_4xx() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(dir.path(), &["--max-script-bytes", "1024", "--max-body-bytes", "65536"]);
    let api = m.client();
    let reg = |patch: Value| {
        let mut body =
            json!({"type":"TOOL_CATALOG_REGISTER_SCRIPT","id":"ok","name":"Ok","runtime":"sh","content":"echo"});
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        api.command(body)
    };
    assert_eq!(error_code(&reg(json!({"runtime":"ruby"})), 400), "unknown_runtime");
    assert_eq!(error_code(&reg(json!({"id":"Bad_ID"})), 400), "invalid_id");
    assert_eq!(error_code(&reg(json!({"id":"a".repeat(65)})), 400), "invalid_id");
    assert_eq!(error_code(&reg(json!({"content":"x".repeat(1025)})), 413), "content_too_large");
    assert_eq!(error_code(&reg(json!({"filename":"../../etc/passwd"})), 400), "invalid_filename");
    assert_eq!(error_code(&reg(json!({"model":"../escape"})), 400), "invalid_model");
    assert_eq!(error_code(&reg(json!({"surprise":true})), 400), "invalid_command");
    assert_eq!(error_code(&reg(json!({"name":7})), 400), "invalid_command");
    assert_eq!(error_code(&reg(json!({"contentBase64":"aGk="})), 400), "invalid_command");
    assert_eq!(error_code(&reg(json!({"input":"not a schema"})), 400), "invalid_schema");
    // A schema the validator cannot read would check nothing at any call: refused, saying where.
    for bad in [
        json!({"type": "foo"}),
        json!({"properties": {"m": {"type": "string", "pattern": "("}}}),
        json!({"minimum": "x"}),
    ] {
        let (status, v) = reg(json!({"input": bad}));
        assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_schema")), "{bad}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("not a valid JSON Schema"), "{v}");
    }
    assert_eq!(error_code(&api.post_raw("/api/commands", b"{\"type\": ".to_vec()), 400), "malformed_json");
    assert_eq!(error_code(&api.post_raw("/api/commands", Vec::new()), 400), "malformed_json");
    assert_eq!(error_code(&api.command(json!({"type":"TOOL_CATALOG_FROBNICATE"})), 400), "unknown_command");
    assert_eq!(error_code(&api.command(json!(["not", "an", "object"])), 400), "invalid_command");
    // A typed body that is not an object is refused as such: serde would read `["m"]` as
    // `{"name": "m"}` and make a model.
    for (path, body) in [("/api/models", "[\"m\"]"), ("/api/tools/x/invoke", "[{}]"), ("/api/agents", "null")] {
        let (status, v) = api.post_raw(path, body.as_bytes().to_vec());
        assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_body")), "{path} {body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().ends_with(": send a JSON object"), "{v}");
    }
    assert_eq!(api.get("/api/models").1.as_array().map(|m| m.iter().any(|m| m["name"] == "m")), Some(false));
    assert_eq!(error_code(&api.post_raw("/api/commands", vec![b' '; 70_000]), 413), "body_too_large");
    assert_eq!(error_code(&api.get("/api/tool-catalog/NOPE"), 400), "invalid_id");
    assert_eq!(error_code(&api.get("/api/blobs/urn:agentos:blob:../../etc/passwd"), 400), "invalid_urn");
    assert_eq!(error_code(&api.get("/api/no-such-route"), 404), "not_found");
    // A bad query parameter is named.
    let (status, v) = api.get("/api/tool-catalog?limit=-1");
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_query")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("limit: "), "{v}");
    // An MCP server's URL with a password in it is refused, without repeating the password.
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_MCP", "id": "m", "name": "M",
        "server": {"url": "http://me:hunter2-pw@127.0.0.1:1/mcp"}}));
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_server")), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("holds a user name or password") && !msg.contains("hunter2"), "{msg}");
    // A timeout no call could keep is refused before a server is started or a registry asked,
    // for an MCP server and an image as for an http service (tested in http_binding).
    for timeout in [json!(0), json!(99_999_999_999u64)] {
        let mcp = json!({"type": "TOOL_CATALOG_REGISTER_MCP", "id": "m", "name": "M",
            "server": {"command": "/bin/false"}, "timeoutMs": timeout});
        let image = json!({"type": "TOOL_CATALOG_IMPORT_IMAGE", "image": "127.0.0.1:1/nothing:1", "id": "i",
            "timeoutMs": timeout});
        for command in [mcp, image] {
            let (status, v) = api.command(command);
            assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_timeout")), "{timeout}: {v}");
        }
    }

    // A filename with folders is reduced to its base name.
    let (s, e) = reg(json!({"filename":"/opt/tools/run me.sh"}));
    assert_eq!(s, 200, "{e}");
    assert_eq!(e["binding"]["filename"], "run_me.sh");

    // Nothing refused was written.
    let (_, page) = api.get("/api/tool-catalog");
    assert_eq!(page["total"], 1, "{page}");
}

#[test]
fn auth_is_required_everywhere_but_healthz() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let anon = api.with_token(None);
    let wrong = api.with_token(Some("aos_not-the-token"));
    assert_eq!(anon.get("/healthz").0, 200);
    for path in [
        "/api/models",
        "/api/tool-catalog",
        "/api/tool-catalog/x",
        "/api/tool-catalog/x/history",
        "/api/openapi.json",
        &format!("/api/blobs/urn:agentos:blob:x/{}", sha256_hex(b"x")),
    ] {
        assert_eq!(error_code(&anon.get(path), 401), "unauthorized", "{path}");
        assert_eq!(error_code(&wrong.get(path), 401), "unauthorized", "{path}");
    }
    assert_eq!(error_code(&anon.register("x", "sh", "echo", None), 401), "unauthorized");
    assert_eq!(error_code(&wrong.register("x", "sh", "echo", None), 401), "unauthorized");
    assert_eq!(api.get("/api/tool-catalog").1["total"], 0, "a refused call wrote something");

    // Answers, a new agent's token among them, are kept by no cache and sniffed by no browser.
    let http = reqwest::blocking::Client::new();
    let agents = http
        .post(format!("{}/api/agents", m.url))
        .bearer_auth(&m.token)
        .json(&serde_json::json!({"name": "cached", "flags": "r"}))
        .send()
        .unwrap();
    assert_eq!(agents.status(), 200);
    let refused = http.get(format!("{}/api/models", m.url)).send().unwrap();
    for res in [&agents, &refused] {
        assert_eq!(res.headers()["cache-control"], "no-store", "{}", res.url());
        assert_eq!(res.headers()["x-content-type-options"], "nosniff", "{}", res.url());
    }

    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("operator.token")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn the_api_describes_itself() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let (status, doc) = m.client().get("/api/openapi.json");
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/healthz",
        "/api/models",
        "/api/tool-catalog",
        "/api/tool-catalog/{id}",
        "/api/tool-catalog/{id}/history",
        "/api/commands",
        "/api/blobs/{urn}",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} missing from the OpenAPI document");
    }
    assert!(doc["components"]["schemas"].get("RegisterScript").is_some());
}

#[test]
fn a_second_master_on_the_same_data_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _m = Master::start(dir.path());
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use by another master"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn models_list_the_places_of_their_net_with_token_counts() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let net = json!({"places": ["p-in", "p-out"], "transitions": []});
    assert_eq!(api.put("/api/models/shop/net", net).0, 200);
    assert_eq!(api.post("/api/models/shop/places/p-in/tokens", json!({"data": {"n": 1}})).0, 200);
    assert_eq!(api.post("/api/models/shop/places/p-in/tokens", json!({"data": {"n": 2}})).0, 200);
    let (status, models) = api.get("/api/models");
    assert_eq!(status, 200, "{models}");
    let shop = models.as_array().unwrap().iter().find(|m| m["name"] == "shop").expect("the model is listed");
    assert_eq!(
        shop["places"],
        json!([
            {"name": "p-tool-catalog", "tokens": 0},
            {"name": "p-in", "tokens": 2},
            {"name": "p-out", "tokens": 0},
        ]),
        "{shop}"
    );
    // A model without a net has only its catalog.
    let default = models.as_array().unwrap().iter().find(|m| m["name"] == "default").unwrap();
    assert_eq!(default["places"], json!([{"name": "p-tool-catalog", "tokens": 0}]), "{default}");

    // A net that names the catalog's place counts the catalog's entries there, as its tokens
    // list them (it said 0).
    assert_eq!(api.register("counted", "sh", "echo {}", Some("shop")).0, 200);
    let net = json!({"places": ["p-tool-catalog", "p-in", "p-out"], "transitions": []});
    assert_eq!(api.put("/api/models/shop/net", net).0, 200);
    let (_, listed) = api.get("/api/models/shop/places/p-tool-catalog/tokens");
    let (status, view) = api.get("/api/models/shop/net");
    assert_eq!(status, 200, "{view}");
    let catalog = view["places"].as_array().unwrap().iter().find(|p| p["id"] == "p-tool-catalog").unwrap();
    assert_eq!(catalog["tokens"], 1, "{view}");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
}

/// `PUT path` with `body` as it is, and the answer as JSON.
fn put_raw(api: &common::Api, path: &str, body: &str) -> (u16, Value) {
    let mut req =
        api.http.put(format!("{}{path}", api.url)).header("content-type", "application/json").body(body.to_string());
    if let Some(t) = &api.token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().expect("request");
    (resp.status().as_u16(), resp.json().unwrap_or(Value::Null))
}

#[test]
fn a_net_document_that_is_not_an_object_or_has_a_bad_cron_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    // Serde reads a struct from an array field by field: the first applied places a and b, the
    // second an empty net.
    for body in [r#"["n4",["a","b"],[]]"#, "[]", "null", "\"net\""] {
        let (status, v) = put_raw(&api, "/api/models/n4/net", body);
        assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_net")), "{body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("must be a JSON object"), "{body}: {v}");
    }
    assert_eq!(api.get("/api/models/n4/net").0, 404, "a refused document applied a net");

    let net = json!({"places": ["a"], "transitions": [
        {"id": "t", "kind": "pass", "mode": "manual", "schedule": {"cron": "bogus"}}
    ]});
    let (status, v) = api.put("/api/models/sch/net", net);
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_net")), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(!msg.contains('\n'), "the message is not one line: {msg:?}");
    assert!(
        msg.contains("/transitions/0/schedule/cron: bad cron expression \"bogus\": The 'Seconds' field does not support using names."),
        "{msg}"
    );
    assert!(msg.contains("six fields") && msg.contains("e.g. \"0 */5 * * * *\""), "{msg}");
}
