//! MCP servers as a binding: a FastMCP server (`tests/mcp_server.py`, FastMCP 4.x from
//! `scripts/py-env`) registered over stdio and over streamable HTTP, called through its shim,
//! the call API and a net; its tool list followed when it changes; killed mid-call and
//! started again; a hanging tool cut by its timeout. A command server runs as the sandbox
//! user with a clean environment, and stops when idle.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{BIN, Master, run};
use serde_json::{Value, json};

/// The venv's python, made by `scripts/py-env` when missing.
fn python() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/py-env");
    let out = Command::new(script).output().expect("scripts/py-env");
    assert!(out.status.success(), "scripts/py-env failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

const SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_server.py");

fn shims(m: &Master, dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    common::install_shims(m, &m.token, &bin);
    bin
}

fn call(api: &common::Api, id: &str, tool: &str, args: &[&str]) -> (u16, Value) {
    api.post(&format!("/api/tools/{id}/call"), json!({"tool": tool, "args": args}))
}

fn message(v: &Value) -> String {
    v["error"]["message"].as_str().unwrap_or_default().to_string()
}

#[test]
fn a_stdio_server_is_a_toolkit_called_through_its_shim_the_call_api_and_a_net() {
    let dir = tempfile::tempdir().unwrap();
    // The venv lives in the build folder, which the sandbox user may not reach: the operator
    // runs this server as the master's own user, which it must ask for. Its own API is one of
    // its http services below: `--http-allow 127.0.0.1` leaves the master's own port refused,
    // which only an entry naming that port opens.
    let port = common::free_port();
    let own = format!("127.0.0.1:{port}");
    let m =
        Master::start_full(&dir.path().join("master"), &own, &["--mcp-run-as", "current", "--http-allow", &own], &[]);
    let api = m.client();
    let py = python();
    let out = run(
        &m,
        &m.token,
        Path::new(BIN),
        &[
            "catalog",
            "register-mcp",
            "--id",
            "tools",
            "--command",
            &py,
            "--arg",
            SERVER,
            "--timeout-ms",
            "20000",
            "--json",
        ],
    );
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let (status, entry) = api.get("/api/tool-catalog/tools");
    assert_eq!(status, 200, "{entry}");
    let ops: Vec<&str> = entry["contract"]["operations"].as_object().unwrap().keys().map(String::as_str).collect();
    for op in ["add", "get-weather", "fail", "slow", "whoami", "grow"] {
        assert!(ops.contains(&op), "{op} in {ops:?}");
    }
    assert_eq!(entry["binding"]["type"], "mcp", "{entry}");
    let urn = entry["binding"]["toolsUrn"].as_str().unwrap();
    assert!(urn.starts_with("urn:agentos:blob:tool-catalog/mcp/"), "{urn}");
    assert_eq!(entry["contract"]["operations"]["add"]["description"], "Adds two integers.");

    // Through the shim: flags from the tool's input schema, a JSON envelope, one error line.
    let bin = shims(&m, dir.path());
    let tools = bin.join("agentos-tools");
    let out = run(&m, &m.token, &tools, &["add", "--a", "2", "--b", "40"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("42"), "{}", out.stdout);
    let out = run(&m, &m.token, &tools, &["get-weather", "--city", "Paris"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("\"sky\"") && out.stdout.contains("clear"), "{}", out.stdout);
    let out = run(&m, &m.token, &tools, &["fail", "--reason", "no-such-city"]);
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(out.stderr.contains("refused: no-such-city"), "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "one error line: {}", out.stderr);
    let out = run(&m, &m.token, &tools, &["add", "--a", "two"]);
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("--a"), "a usage error names the flag: {}", out.stderr);

    // Calling needs `x` and `m`; an agent without `m` does not even see the toolkit, and one
    // with `m` registers url servers only.
    let no_m = api.agent("no-m", "--x");
    let (status, v) = call(&no_m, "tools", "add", &["--a", "1", "--b", "1"]);
    assert_eq!(status, 404, "{v}");
    let with_m = api.agent("with-m", "--x-------m");
    let (status, v) = call(&with_m, "tools", "add", &["--a", "1", "--b", "1"]);
    assert_eq!(status, 200, "{v}");
    let (status, v) = with_m.command(json!({"type": "TOOL_CATALOG_REGISTER_MCP", "id": "mine", "name": "Mine",
        "server": {"command": "/bin/sh", "args": ["-c", "id"]}}));
    assert_eq!(status, 403, "{v}");
    assert!(message(&v).contains("only the operator"), "{v}");

    // To MCP clients of ours (the official Python SDK at /mcp): `{toolkit}_{operation}`, beside
    // an http service's operation (the master's own model list, with a granted credential).
    let doc = json!({"openapi": "3.1.0", "info": {"title": "self", "version": "1.0.0"}, "paths": {"/api/models": {
        "get": {"operationId": "models", "summary": "The models", "responses": {"200": {"description": "ok"}}}}}});
    assert_eq!(api.put("/api/secrets/SELF_TOKEN", json!({"value": m.token})).0, 200);
    assert_eq!(api.post("/api/secrets/SELF_TOKEN/grants", json!({"origin": m.url})).0, 200);
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "self", "name": "Self",
        "baseUrl": m.url, "openapi": doc, "auth": {"type": "bearer", "secret": "SELF_TOKEN"}}));
    assert_eq!(status, 200, "{v}");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py");
    let config = json!({"transport": "http", "mode": "legacy", "url": m.url, "token": m.token,
        "calls": [["tools_add", {"a": 5, "b": 6}], ["tools_fail", {"reason": "over MCP"}], ["self_models", {}]]});
    let out = Command::new(&py).arg(script).arg(config.to_string()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap();
    assert!(v["tools"].as_array().unwrap().contains(&json!("tools_get-weather")), "{v}");
    assert_eq!(v["calls"][0]["isError"], false, "{v}");
    assert!(v["calls"][0]["text"].to_string().contains("11"), "{v}");
    assert_eq!(v["calls"][1]["isError"], true, "{v}");
    assert!(v["calls"][1]["text"].to_string().contains("refused: over MCP"), "{v}");
    assert_eq!(v["calls"][2]["isError"], false, "{v}");
    assert_eq!(v["calls"][2]["structured"]["status"], 200, "{v}");

    // From a net: an `mcp` action names the toolkit and the tool; its output is the result.
    let (status, v) = api.put(
        "/api/models/trip/net",
        json!({"places": ["p-req", "p-resp"], "transitions": [{"id": "ask", "kind": "mcp",
            "presets": {"req": {"place": "p-req"}}, "postsets": {"o": {"place": "p-resp"}},
            "action": {"tool": "tools", "operation": "get-weather", "input": {"city": "${.req.data.city}"}},
            "emit": [{"to": "o"}]}]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(api.post("/api/models/trip/transitions/ask/start", json!({})).0, 200);
    let (status, v) = api.post("/api/models/trip/places/p-req/tokens", json!({"data": {"city": "Oslo"}}));
    assert_eq!(status, 200, "{v}");
    common::wait_for("the weather token", || !api.token_data("trip", "p-resp").is_empty());
    assert_eq!(api.token_data("trip", "p-resp")[0], json!({"city": "Oslo", "sky": "clear"}));

    // The server says its list changed: the new list is a new definition in history.
    let (status, v) = call(&api, "tools", "grow", &[]);
    assert_eq!(status, 200, "{v}");
    common::wait_for("the grown tool list", || {
        api.get("/api/tool-catalog/tools").1["contract"]["operations"].get("extra").is_some()
    });
    let (status, h) = api.get("/api/tool-catalog/tools/history");
    assert_eq!(status, 200, "{h}");
    assert_eq!(h["events"].as_array().unwrap().len(), 2, "{h}");
    let (status, v) = call(&api, "tools", "extra", &["--text", "hi"]);
    assert_eq!(status, 200, "{v}");

    // Killed mid-call: that call fails with the reason, the next one starts the server again.
    let (status, who) = call(&api, "tools", "whoami", &[]);
    assert_eq!(status, 200, "{who}");
    let pid = who["result"]["pid"].as_i64().unwrap_or_else(|| panic!("{who}"));
    let slow_api = api.clone();
    let slow = std::thread::spawn(move || call(&slow_api, "tools", "slow", &["--ms", "15000"]));
    // Time for the call to reach the server even on a loaded machine (it sleeps 15 s there).
    std::thread::sleep(Duration::from_millis(2000));
    // SAFETY: a plain signal to the server's pid.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    let (status, v) = slow.join().unwrap();
    assert_ne!(status, 200, "{v}");
    assert!(message(&v).contains("lost mid-call"), "{v}");
    let (status, v) = call(&api, "tools", "add", &["--a", "1", "--b", "2"]);
    assert_eq!(status, 200, "the server started again: {v}");
    let (_, again) = call(&api, "tools", "whoami", &[]);
    assert_ne!(again.to_string(), who.to_string(), "a new process");
}

#[test]
fn a_hanging_tool_fails_at_its_timeout_and_holds_up_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--mcp-run-as", "current"]);
    let api = m.client();
    let py = python();
    let register = |id: &str, timeout: u64| {
        api.command(json!({"type": "TOOL_CATALOG_REGISTER_MCP", "id": id, "name": id,
            "server": {"command": py, "args": [SERVER]}, "timeoutMs": timeout}))
    };
    // Short against the 30 s it hangs, long enough for a quick call on a loaded machine.
    let (status, v) = register("hangs", 2000);
    assert_eq!(status, 200, "{v}");
    let (status, v) = register("quick", 20_000);
    assert_eq!(status, 200, "{v}");
    // A program that is no MCP server: refused with what it wrote before it ended.
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_MCP", "id": "broken", "name": "Broken",
        "server": {"command": "/bin/sh", "args": ["-c", "echo 'cannot open config.toml' >&2; exit 3"]}}));
    assert_eq!(status, 400, "{v}");
    assert!(message(&v).contains("before answering initialize: cannot open config.toml"), "{v}");
    let hang_api = api.clone();
    let hanging = std::thread::spawn(move || call(&hang_api, "hangs", "slow", &["--ms", "30000"]));
    // Meanwhile another server's tools answer.
    let (status, v) = call(&api, "quick", "add", &["--a", "1", "--b", "1"]);
    assert_eq!(status, 200, "{v}");
    let started = std::time::Instant::now();
    let (status, v) = hanging.join().unwrap();
    assert_eq!(status, 504, "{v}");
    assert!(message(&v).contains("did not answer within 2000 ms"), "{v}");
    assert!(started.elapsed() < Duration::from_secs(20), "cut at its timeout");
    // The same server answers its next call.
    let (status, v) = call(&api, "hangs", "add", &["--a", "2", "--b", "2"]);
    assert_eq!(status, 200, "{v}");
}

/// A FastMCP server over streamable HTTP on a free loopback port; killed when dropped.
struct HttpServer {
    child: std::process::Child,
    url: String,
}

impl HttpServer {
    fn start() -> HttpServer {
        let port = common::free_port();
        let child = Command::new(python())
            .args([SERVER, "http", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        common::wait_for("the MCP server's port", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        HttpServer { child, url: format!("http://127.0.0.1:{port}/mcp") }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_url_server_is_reached_through_the_outbound_policy_with_the_credential_granted_to_its_origin() {
    let server = HttpServer::start();
    let origin = server.url.trim_end_matches("/mcp").to_string();
    let dir = tempfile::tempdir().unwrap();

    // The default policy refuses loopback, and says how to allow it.
    let strict = Master::start_default_policy(&dir.path().join("strict"));
    let (status, v) = strict.client().command(json!({"type": "TOOL_CATALOG_REGISTER_MCP", "id": "remote",
        "name": "Remote", "server": {"url": server.url}}));
    assert_eq!(status, 400, "{v}");
    assert!(message(&v).contains("--http-allow"), "{v}");
    drop(strict);

    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    let secret = "mcp-tok-8c1f4e2a-canary";
    assert_eq!(api.put("/api/secrets/MCP_TOKEN", json!({"value": secret})).0, 200);
    let agent = api.agent("integrator", "--x-------m");
    let register = json!({"type": "TOOL_CATALOG_REGISTER_MCP", "id": "remote", "name": "Remote",
        "server": {"url": server.url, "auth": {"type": "bearer", "secret": "MCP_TOKEN"}}});
    // Not granted to the server's origin: refused, saying how to grant it.
    let (status, v) = agent.command(register.clone());
    assert_eq!(status, 403, "{v}");
    assert!(message(&v).contains(&format!("agentos secret grant MCP_TOKEN --origin {origin}")), "{v}");
    let (status, v) = api.post("/api/secrets/MCP_TOKEN/grants", json!({"origin": origin}));
    assert_eq!(status, 200, "{v}");
    // An agent with `m` registers a url server.
    let (status, v) = agent.command(register);
    assert_eq!(status, 200, "{v}");
    let (status, v) = call(&agent, "remote", "add", &["--a", "20", "--b", "22"]);
    assert_eq!(status, 200, "{v}");
    assert!(v.to_string().contains("42"), "{v}");
    let (status, v) = call(&agent, "remote", "auth-seen", &[]);
    assert_eq!(status, 200, "{v}");
    let want = common::sha256_hex(format!("Bearer {secret}").as_bytes());
    assert!(v.to_string().contains(&want), "the server got the credential: {v}");

    // The server goes away: a clear error; it comes back: calls answer again.
    let url = server.url.clone();
    drop(server);
    let (status, v) = call(&agent, "remote", "add", &["--a", "1", "--b", "1"]);
    assert_ne!(status, 200, "{v}");
    assert!(message(&v).contains("remote add"), "{v}");
    let port: u16 = url.trim_end_matches("/mcp").rsplit(':').next().unwrap().parse().unwrap();
    let child = Command::new(python())
        .args([SERVER, "http", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _back = HttpServer { child, url };
    common::wait_for("the MCP server's port", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    common::wait_for("calls to answer again", || call(&agent, "remote", "add", &["--a", "1", "--b", "1"]).0 == 200);
    drop(m);
    for file in walk(&dir.path().join("master")) {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{} holds the credential",
            file.display()
        );
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

/// A stdio MCP server in plain Node.js (no packages, so any user can run it): its one tool
/// answers who runs it and the environment it was given.
const WHO_SERVER: &str = r#"
const crypto = require('crypto');
const send = (m) => process.stdout.write(JSON.stringify(m) + '\n');
require('readline').createInterface({ input: process.stdin }).on('line', (line) => {
  const m = JSON.parse(line);
  if (m.id === undefined) return;
  if (m.method === 'initialize') {
    send({ jsonrpc: '2.0', id: m.id, result: { protocolVersion: m.params.protocolVersion,
      capabilities: { tools: {} }, serverInfo: { name: 'who', version: '1.0.0' } } });
  } else if (m.method === 'tools/list') {
    send({ jsonrpc: '2.0', id: m.id, result: { tools: [{ name: 'whoami', description: 'Who runs this server',
      inputSchema: { type: 'object', properties: {} } }] } });
  } else if (m.method === 'tools/call') {
    const key = process.env.WEATHER_KEY || '';
    const out = { uid: process.getuid(), pid: process.pid, cwd: process.cwd(), env: Object.keys(process.env).sort(),
      key: key, keySha256: crypto.createHash('sha256').update(key).digest('hex') };
    send({ jsonrpc: '2.0', id: m.id, result: { content: [{ type: 'text', text: JSON.stringify(out) }] } });
  } else {
    send({ jsonrpc: '2.0', id: m.id, error: { code: -32601, message: 'no such method' } });
  }
});
"#;

#[test]
fn a_command_server_runs_as_the_sandbox_user_with_a_clean_environment_and_stops_when_idle() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let code = dir.path().join("code");
    std::fs::create_dir(&code).unwrap();
    std::fs::set_permissions(&code, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = code.join("who.js");
    std::fs::write(&script, WHO_SERVER).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let m = Master::start_full(
        &dir.path().join("master"),
        "127.0.0.1:0",
        &["--mcp-idle-ms", "500"],
        &[("WEATHER_KEY", "from-the-masters-environment"), ("AGENTOS_PROBE", "leak")],
    );
    let api = m.client();
    let key = "wk-3a9d1c-canary";
    assert_eq!(api.put("/api/secrets/WKEY", json!({"value": key})).0, 200);
    let register = json!({"type": "TOOL_CATALOG_REGISTER_MCP", "id": "who", "name": "Who",
        "server": {"command": "node", "args": [script], "env": {"WEATHER_KEY": "WKEY"}}});
    let (status, v) = api.command(register);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Not root: no user to run it as but the master's own, which must be asked for.
        assert_eq!(status, 403, "{v}");
        assert!(message(&v).contains("--mcp-run-as"), "{v}");
        return;
    }
    assert_eq!(status, 200, "{v}");
    let (status, v) = call(&api, "who", "whoami", &[]);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["uid"], 65534, "nobody, never the master's user: {v}");
    assert_eq!(v["result"]["env"], json!(["PATH", "WEATHER_KEY"]), "a clean environment plus its secrets: {v}");
    assert_eq!(v["result"]["keySha256"], common::sha256_hex(key.as_bytes()), "the secret's value: {v}");
    assert_eq!(v["result"]["key"], "[redacted]", "kept out of what the tool answers: {v}");
    let pid = v["result"]["pid"].as_i64().unwrap() as i32;

    // Idle past --mcp-idle-ms: the process ends; the next call starts it again.
    // SAFETY: signal 0 only checks that the pid exists.
    common::wait_for("the idle server to stop", || unsafe { libc::kill(pid, 0) } != 0);
    let (status, v) = call(&api, "who", "whoami", &[]);
    assert_eq!(status, 200, "{v}");
    assert_ne!(v["result"]["pid"].as_i64().unwrap() as i32, pid);
}

#[test]
fn a_registration_the_caller_may_not_make_is_refused_before_the_server_is_contacted() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    let watched = common::Watched::start();
    let server = json!({"url": format!("{}/mcp", watched.origin)});
    // The operator's entry, to be replaced: its server is never reached either, as the refusal
    // comes first and nothing listens behind the watched port.
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": "owned", "name": "Owned",
        "runtime": "sh", "content": "echo hi"}));
    assert_eq!(status, 200, "{v}");
    let mallory = api.agent("mallory", "--x-------m");
    let (status, v) = mallory.command(json!({"type": "TOOL_CATALOG_REGISTER_MCP", "id": "spy", "name": "Spy",
        "model": "elsewhere", "server": server}));
    assert_eq!(status, 403, "a model not granted: {v}");
    let (status, v) = mallory.command(json!({"type": "TOOL_CATALOG_REGISTER_MCP", "id": "owned", "name": "Owned",
        "model": "default", "server": server}));
    assert_eq!(status, 403, "another's id: {v}");
    assert!(message(&v).contains("it belongs to \"operator\""), "{v}");
    assert!(!watched.contacted(), "the master connected to the server of a refused registration");
}

/// A server whose list cannot all be offered, over stdio (one JSON line each) or over
/// streamable HTTP (`http PORT`: each answer one server-sent event): initialize, then
/// tools/list and tools/call.
const LISTING_SERVER: &str = r#"import json, sys
big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 40} for i in range(2000)}}
tools = [
    {"name": "dup", "description": "first", "inputSchema": {"type": "object"}},
    {"name": "dup", "description": "second", "inputSchema": {"type": "object"}},
    {"name": "bad", "inputSchema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}},
    {"name": "huge", "inputSchema": big},
    {"name": "fine", "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}}},
    {"name": "noschema", "description": "lists no inputSchema"},
    {"name": "deep", "inputSchema": {"type": "object"}},
]

def answer(msg):
    method, result = msg.get("method"), {}
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "listing", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": tools}
    elif method == "tools/call" and msg["params"]["name"] == "deep":
        # Deeper than a JSON reader's 128 levels: the answer cannot be read as a message.
        nested = '{"a":' * 3000 + '1' + '}' * 3000
        return '{"jsonrpc":"2.0","id":' + json.dumps(msg["id"]) + ',"result":{"content":[],"structuredContent":' + nested + '}}'
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "called " + msg["params"]["name"]}]}
    return json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result})

if sys.argv[1:2] == ["http"]:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if "id" not in msg:
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = ("event: message\ndata: " + answer(msg) + "\n\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Mcp-Session-Id", "listing-1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            self.send_response(405)
            self.send_header("Content-Length", "0")
            self.end_headers()
        def do_DELETE(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        def log_message(self, *args):
            pass
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Handler).serve_forever()
else:
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" in msg:
            sys.stdout.write(answer(msg) + "\n")
            sys.stdout.flush()
"#;

/// The tools of [`LISTING_SERVER`] that cannot be offered are left out, each saying why, and an
/// answer that cannot be read fails its call at once, whichever way the server is reached.
fn check_listing(api: &common::Api, server: Value) {
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_MCP", "id": "listing", "name": "Listing",
        "server": server}));
    assert_eq!(status, 200, "{v}");
    let ops: Vec<&String> = v["contract"]["operations"].as_object().unwrap().keys().collect();
    assert_eq!(ops, ["deep", "dup", "fine"], "{v}");
    assert_eq!(v["contract"]["operations"]["dup"]["description"], "first", "the first of a name is kept");
    let skipped: Vec<(&str, &str)> = v["binding"]["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["pointer"].as_str().unwrap(), s["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(skipped.len(), 4, "{skipped:?}");
    assert!(skipped[0].0 == "/tools/1" && skipped[0].1.contains("lists a tool named \"dup\" before it"), "{skipped:?}");
    assert!(skipped[1].0 == "/tools/2" && skipped[1].1.contains("not a valid JSON Schema"), "{skipped:?}");
    assert!(skipped[2].0 == "/tools/3" && skipped[2].1.contains("over the 65536"), "{skipped:?}");
    // One tool without inputSchema used to fail the whole registration ("Unexpected response type").
    assert!(skipped[3].0 == "/tools/5" && skipped[3].1.contains("has no inputSchema"), "{skipped:?}");
    let (status, v) = call(api, "listing", "fine", &["--n", "1"]);
    assert_eq!(status, 200, "{v}");
    // An answer that cannot be read fails its call at once, saying so, where it used to be
    // dropped and the call wait its whole timeout (120 s) to be told the server did not answer,
    // or (over HTTP) be told the stream closed before its final response.
    let asked = std::time::Instant::now();
    let (status, v) = call(api, "listing", "deep", &[]);
    assert!(status >= 400, "{status} {v}");
    assert!(message(&v).contains("the server's answer could not be read: recursion limit exceeded"), "{v}");
    assert!(asked.elapsed() < std::time::Duration::from_secs(20), "the call waited {:?}", asked.elapsed());
    // The connection goes on.
    let (status, v) = call(api, "listing", "fine", &["--n", "2"]);
    assert_eq!(status, 200, "{v}");
}

#[test]
fn tools_a_server_lists_that_cannot_be_offered_are_skipped_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--mcp-run-as", "current"]);
    let server = dir.path().join("listing.py");
    std::fs::write(&server, LISTING_SERVER).unwrap();
    check_listing(&m.client(), json!({"command": python(), "args": [server]}));
}

/// The same over streamable HTTP, each answer a server-sent event: rmcp skipped an event it
/// could not read, and failed a whole list over one tool without `inputSchema`.
#[test]
fn a_url_server_s_tools_that_cannot_be_offered_are_skipped_and_its_unreadable_answers_fail_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let script = dir.path().join("listing.py");
    std::fs::write(&script, LISTING_SERVER).unwrap();
    let port = common::free_port();
    let child = Command::new(python()).args([script.to_str().unwrap(), "http", &port.to_string()]).spawn().unwrap();
    let server = HttpServer { child, url: format!("http://127.0.0.1:{port}/mcp") };
    common::wait_for("the MCP server's port", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    check_listing(&m.client(), json!({"url": server.url}));
}
