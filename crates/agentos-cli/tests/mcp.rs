//! The catalog over MCP, to the official Python SDK's client (`mcp` 2.x, installed by
//! `scripts/py-env`): Streamable HTTP at `/mcp` and stdio through `agentos mcp`, under both the
//! initialize handshake (2025-11-25) and 2026-07-28; each principal sees what its flags allow.
//! Plain HTTP where the exact answer matters: a session serves only the principal that opened it,
//! and a message that cannot be read, or lacks the params its method needs, is told why.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{BIN, Executor, Master};
use serde_json::{Value, json};

/// The venv's python, made by `scripts/py-env` when missing.
fn python() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/py-env");
    let out = Command::new(script).output().expect("scripts/py-env");
    assert!(out.status.success(), "scripts/py-env failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Runs `tests/mcp_client.py` with `config`; answers what it printed.
fn client(config: Value) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_client.py");
    let out = Command::new(python()).arg(script).arg(config.to_string()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)))
}

fn script(id: &str, content: &str, input: Value) -> Value {
    json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": id, "name": id, "runtime": "sh", "content": content,
           "description": format!("The {id} script"), "input": input})
}

fn call<'a>(answer: &'a Value, name: &str) -> &'a Value {
    answer["calls"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("{answer}"))
}

#[test]
fn mcp_clients_list_and_call_what_their_flags_allow_over_http_and_stdio() {
    let dir = tempfile::tempdir().unwrap();
    // The host tools example: the `weather` host toolkit, beside scripts run by an executor.
    let m = Master::start_example(&dir.path().join("master"));
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let api = m.client();
    let greet = script(
        "greet",
        r#"read -r input; printf '{"greeting":"hello %s"}' "$(printf '%s' "$input" | sed 's/.*"name":"\([^"]*\)".*/\1/')""#,
        json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}),
    );
    assert_eq!(api.command(greet).0, 200);
    assert_eq!(api.command(script("broken", "echo 'the disk is full' >&2; exit 3", json!({}))).0, 200);
    let echo = script(
        "echo",
        "cat",
        json!({"type": "object", "properties": {"name": {"type": "string"}, "greeting": {"type": "string", "default": "hello"}}}),
    );
    assert_eq!(api.command(echo).0, 200);
    let caller = api.agent("caller", "--x------s");
    let reader = api.agent("reader", "r");
    let caller_token = caller.token.clone().unwrap();
    let reader_token = reader.token.clone().unwrap();

    for (transport, mode) in [("http", "legacy"), ("http", "auto"), ("stdio", "legacy"), ("stdio", "auto")] {
        let later = format!("later-{transport}-{mode}");
        let v = client(json!({
            "transport": transport, "mode": mode, "bin": BIN, "url": m.url, "token": caller_token,
            "operator": m.token,
            "calls": [
                ["greet_run", {"name": "Ada"}],
                ["weather_forecast", {"city": "Paris", "days": 2}],
                ["broken_run", {}],
                ["greet_run", {}],
                ["nothing_here_run", {}],
                ["agentos_search_catalog", {"q": "greet"}],
                ["echo_run", {"name": "Ada"}],
            ],
            "register": script(&later, "echo '{}'", json!({})),
        }));
        let what = format!("{transport} {mode}");
        let want_protocol = if mode == "legacy" { "2025-11-25" } else { "2026-07-28" };
        assert_eq!(v["protocol"], want_protocol, "{what}");
        let tools: Vec<&str> = v["tools"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        for t in ["greet_run", "broken_run", "weather_forecast", "weather_ping", "agentos_search_catalog"] {
            assert!(tools.contains(&t), "{what}: {t} in {tools:?}");
        }
        // The input schema is the operation's.
        assert_eq!(v["schemas"]["greet_run"]["required"], json!(["name"]), "{what}");
        // A script through an executor, and a host tool: structured content and text.
        let c = call(&v, "greet_run");
        assert_eq!(
            (c["isError"].as_bool(), &c["structured"]),
            (Some(false), &json!({"greeting": "hello Ada"})),
            "{what}: {c}"
        );
        assert_eq!(c["text"][0], r#"{"greeting":"hello Ada"}"#, "{what}");
        // A default the caller left out is filled in, as a shim's flags fill it in.
        let c = call(&v, "echo_run");
        assert_eq!(c["structured"], json!({"name": "Ada", "greeting": "hello"}), "{what}: {c}");
        let c = call(&v, "weather_forecast");
        assert_eq!(c["isError"], false, "{what}: {c}");
        assert_eq!(c["structured"]["city"], "Paris", "{what}: {c}");
        // A failing tool: isError with the line an agent acts on.
        let c = &v["calls"][2];
        assert_eq!(c["isError"], true, "{what}: {c}");
        assert_eq!(c["text"][0], "broken run failed with exit code 3: the disk is full", "{what}");
        let c = &v["calls"][3];
        assert_eq!(c["isError"], true, "{what}: {c}");
        assert!(c["text"][0].as_str().unwrap().contains("\"name\" is a required property"), "{what}: {c}");
        let c = &v["calls"][4];
        assert_eq!(
            (c["isError"].as_bool(), c["text"][0].as_str()),
            (Some(true), Some("no tool \"nothing_here_run\" (tools/list shows the tools you can call)")),
            "{what}"
        );
        let c = call(&v, "agentos_search_catalog");
        assert_eq!(c["structured"]["items"][0]["tools"], json!(["greet_run"]), "{what}: {c}");
        // A registration the caller can see: told, and listed.
        assert_eq!(v["changed"], true, "{what}: no tools/list_changed");
        assert!(v["tools_after"].as_array().unwrap().contains(&json!(format!("{later}_run"))), "{what}: {v}");
    }

    // An agent whose flags reveal no tool sees none and calls none, over either transport: `r`
    // gives it the platform's token listing alone.
    for transport in ["http", "stdio"] {
        let v = client(json!({
            "transport": transport, "mode": "legacy", "bin": BIN, "url": m.url, "token": reader_token,
            "calls": [["greet_run", {"name": "x"}], ["weather_ping", {}]],
        }));
        assert_eq!(v["tools"], json!(["agentos_list_tokens"]), "{transport}: {v}");
        for c in v["calls"].as_array().unwrap() {
            assert_eq!(c["isError"], true, "{transport}: {c}");
            assert!(c["text"][0].as_str().unwrap().starts_with("no tool"), "{transport}: {c}");
        }
    }
}

#[test]
fn the_mcp_endpoint_refuses_missing_bad_and_executor_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--max-body-bytes", "65536"]);
    let (_, exec) = m.client().post("/api/executor-tokens", json!({"name": "e9"}));
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let post = |token: Option<&str>, body: Vec<u8>| {
        let mut req = common::http()
            .post(format!("{}/mcp", m.url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().unwrap();
        (resp.status().as_u16(), resp.text().unwrap())
    };
    let body = init.to_string().into_bytes();
    let (status, text) = post(None, body.clone());
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("missing bearer token"), "{text}");
    assert_eq!(post(Some("not-a-token"), body.clone()).0, 401);
    let (status, text) = post(exec["token"].as_str(), body.clone());
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("executor credential"), "{text}");
    // A body past the API's limit is refused before anything reads it as a message.
    let (status, text) = post(Some(&m.token), vec![b' '; 70_000]);
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("body_too_large"), "{text}");
    let (status, text) = post(Some(&m.token), body);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"agentos\""), "the server names itself: {text}");
}

/// `agentos mcp` relaying to a master under a token, driven a line at a time over its stdin
/// and stdout. Killed when dropped.
struct Relay {
    child: std::process::Child,
    /// `None` once closed.
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Relay {
    /// Started, and through the initialize handshake.
    fn start(m: &Master, token: &str) -> Relay {
        let mut relay = Relay::spawn(m, token, std::process::Stdio::null());
        relay.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}));
        assert!(relay.answer(1)["result"]["serverInfo"].is_object());
        relay.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        relay
    }

    /// Started, and nothing sent yet.
    fn spawn(m: &Master, token: &str, stderr: std::process::Stdio) -> Relay {
        use std::io::BufRead;
        let mut child = Command::new(BIN)
            .arg("mcp")
            .env("AGENTOS_URL", &m.url)
            .env("AGENTOS_TOKEN", token)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Relay { child, stdin, lines }
    }

    fn send(&mut self, v: Value) {
        self.send_line(&v.to_string());
    }

    /// Writes `line` and a newline, as it is.
    fn send_line(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// The next message the relay writes that is not a notification.
    fn next_answer(&self) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(std::time::Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("no answer: {e}"));
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            if v.get("method").is_none() {
                return v;
            }
        }
    }

    /// The answer to request `id`, passing over notifications.
    fn answer(&self, id: u64) -> Value {
        loop {
            let v = self.next_answer();
            if v["id"] == id {
                return v;
            }
        }
    }

    /// Closes stdin, as a client that is done does, and waits for the relay to exit.
    /// That the relay still lists tools, asked with `id`.
    fn assert_lists(&mut self, id: u64) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}));
        let listed = self.answer(id);
        assert!(listed["result"]["tools"].as_array().is_some_and(|t| !t.is_empty()), "{listed}");
    }

    fn close(&mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.exit()
    }

    /// Sends `signal`, as a client that stops its servers does, and waits for the relay to exit.
    fn stop(&mut self, signal: i32) -> std::process::ExitStatus {
        // SAFETY: a signal to a child this test started and has not yet waited for.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
        self.exit()
    }

    fn exit(&mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "the relay did not exit");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `tools/call` of `agentos_search_catalog` whose query is `size` bytes.
fn search_of(id: u64, size: usize) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "agentos_search_catalog", "arguments": {"q": "x".repeat(size)}}})
}

#[test]
fn agentos_mcp_outlives_a_request_the_master_refuses_as_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--max-body-bytes", "65536"]);
    let mut relay = Relay::start(&m, &m.token);
    // Far past the master's limit and the socket's buffers, and under the stdio line limit of
    // 16 MiB: the master refuses it while the relay writes.
    relay.send(search_of(2, 12 << 20));
    let refused = relay.answer(2);
    // The master's answer, in words, without the MCP library's type names or the master's raw
    // JSON, and as the client's fault (it was an internal error, -32603).
    let said = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        said.starts_with("the master refused the request (HTTP 413): the request body is larger than"),
        "{refused}"
    );
    assert!(!said.contains("rmcp::") && !said.contains('{'), "{refused}");
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    // The session goes on.
    relay.assert_lists(3);
}

/// Regression: a line over the 16 MiB stdio bound was answered with `"id": null`, which no
/// client matches to its request: it waited for an answer that never came.
#[test]
fn agentos_mcp_answers_a_line_over_its_bound_with_the_lines_id() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let mut relay = Relay::start(&m, &m.token);
    let big = "x".repeat(17 << 20);
    // The id written last, as some clients do, after an `id` nested in the arguments.
    let line = format!(
        r#"{{"jsonrpc":"2.0","method":"tools/call","params":{{"name":"agentos_search_catalog","arguments":{{"q":"{big}","id":99}}}},"id":7}}"#
    );
    relay.send_line(&line);
    assert_error(&relay.next_answer(), -32600, &json!(7), "the message is longer than 16 MiB");
    // Written first, a string, with a quote escaped in it.
    relay.send_line(&format!(r#"{{"id": "a\"b", "jsonrpc":"2.0","method":"ping","params":{{"pad":"{big}"}}}}"#));
    assert_error(&relay.next_answer(), -32600, &json!("a\"b"), "longer than 16 MiB");
    // No id a JSON-RPC answer could carry: null.
    relay.send_line(&format!(r#"{{"jsonrpc":"2.0","method":"ping","id":{{"n":1}},"params":{{"pad":"{big}"}}}}"#));
    assert_error(&relay.next_answer(), -32600, &json!(null), "longer than 16 MiB");
    // An integer in float form, read as `/mcp` reads it: the integer.
    relay.send_line(&format!(r#"{{"jsonrpc":"2.0","method":"ping","id":5.0,"params":{{"pad":"{big}"}}}}"#));
    assert_error(&relay.next_answer(), -32600, &json!(5), "longer than 16 MiB");
    relay.assert_lists(8);
}

#[test]
fn agentos_mcp_tells_its_client_in_words_why_the_master_refused_a_call_as_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--max-body-bytes", "65536"]);
    let mut relay = Relay::start(&m, &m.token);
    relay.send(search_of(2, 100_000));
    let refused = relay.answer(2);
    // The relay's words, then the master's: its status and its error's message, as the
    // client's fault.
    assert_eq!(
        refused["error"]["message"],
        "the master refused the request (HTTP 413): the request body is larger than 65536 bytes \
         (the master's --max-body-bytes)",
        "{refused}"
    );
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
}

/// What `/mcp` answered one request.
#[derive(Debug, PartialEq)]
struct Answer {
    status: u16,
    content_type: Option<String>,
    /// The session an `initialize` answer names.
    session: Option<String>,
    /// Empty for an event stream that stays open (a `GET` answered 200).
    body: String,
}

/// One request to `/mcp` under `token`, in `session` when given.
fn exchange(m: &Master, method: &str, token: &str, session: Option<&str>, body: Option<Value>) -> Answer {
    let mut headers = vec![("mcp-protocol-version", "2025-11-25")];
    if let Some(s) = session {
        headers.push(("mcp-session-id", s));
    }
    send(m, method, token, &headers, body.map(|b| b.to_string()))
}

/// One request to `/mcp` under `token` with `headers`, its body sent as it is, as JSON.
fn send(m: &Master, method: &str, token: &str, headers: &[(&str, &str)], body: Option<String>) -> Answer {
    // One client for every exchange: a blocking client starts a runtime of its own.
    static HTTP: std::sync::LazyLock<reqwest::blocking::Client> = std::sync::LazyLock::new(common::http);
    let mut req = HTTP
        .request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), format!("{}/mcp", m.url))
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b);
    }
    let resp = req.send().unwrap();
    let header = |name: &str| resp.headers().get(name).map(|v| v.to_str().unwrap().to_string());
    let (status, content_type, session) = (resp.status().as_u16(), header("content-type"), header("mcp-session-id"));
    let body = if method == "GET" && status == 200 { String::new() } else { resp.text().unwrap() };
    Answer { status, content_type, session, body }
}

/// Opens a session under `token` through the initialize handshake; answers its id.
fn open_session(m: &Master, token: &str) -> Result<String, Answer> {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let opened = exchange(m, "POST", token, None, Some(init));
    let Some(session) = opened.session.clone().filter(|_| opened.status == 200) else { return Err(opened) };
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(exchange(m, "POST", token, Some(&session), Some(initialized)).status, 202);
    Ok(session)
}

fn tools_list() -> Value {
    json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
}

/// The one JSON-RPC message an answer carries: its JSON body, or the message among the events
/// of its stream (rmcp answers a request in a session as a stream).
fn message_of(a: &Answer) -> Value {
    match a.content_type.as_deref() {
        Some("application/json") => serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("{e}: {a:?}")),
        Some("text/event-stream") => a
            .body
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .find_map(|data| serde_json::from_str::<Value>(data).ok())
            .unwrap_or_else(|| panic!("no message in the stream: {a:?}")),
        _ => panic!("neither JSON nor an event stream: {a:?}"),
    }
}

/// Asserts that `message` is a JSON-RPC error with `code`, for `id`, whose message contains
/// `says`.
fn assert_error(message: &Value, code: i64, id: &Value, says: &str) {
    assert_eq!(message["jsonrpc"], "2.0", "{message}");
    // Written out even when null: a client reads no error without it.
    assert_eq!(message.get("id"), Some(id), "{message}");
    assert_eq!(message["error"]["code"], code, "{message}");
    let text = message["error"]["message"].as_str().unwrap_or_default();
    assert!(text.contains(says), "{says:?} in {message}");
}

/// That the session still answers `tools/list` and `tools/call`, and a new one still opens.
fn assert_serves(m: &Master, session: &str) {
    let listed = message_of(&exchange(m, "POST", &m.token, Some(session), Some(tools_list())));
    assert!(listed["result"]["tools"].as_array().is_some_and(|t| !t.is_empty()), "{listed}");
    let called = message_of(&exchange(m, "POST", &m.token, Some(session), Some(search_of(3, 1))));
    assert_eq!(called["result"]["isError"], false, "{called}");
    open_session(m, &m.token).unwrap();
}

#[test]
fn mcp_answers_a_batch_a_wrong_version_and_a_body_that_is_not_json_with_a_json_rpc_error() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let session = open_session(&m, &m.token).unwrap();
    // Valid JSON, past serde_json's 128 levels of nesting.
    let deep = format!(
        r#"{{"jsonrpc":"2.0","method":"tools/list","params":{{"a":{}{}}},"id":"deep"}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let marked = format!("\u{feff}{}", tools_list());
    // rmcp answered each with a 415 in plain text ("fail to deserialize request body ..."),
    // which reads as a wrong Content-Type and which no MCP client reads as an error.
    let cases = [
        (
            r#"[{"jsonrpc":"2.0","id":5,"method":"tools/list"}]"#,
            -32600,
            json!(null),
            "a batch (JSON array) is not accepted",
        ),
        ("[]", -32600, json!(null), "send one JSON-RPC message per request"),
        (r#"{"jsonrpc":"1.0","id":6,"method":"tools/list"}"#, -32600, json!(6), r#"jsonrpc must be "2.0", not "1.0""#),
        (r#"{"id":"seven","method":"tools/list"}"#, -32600, json!("seven"), r#"jsonrpc must be "2.0", and is missing"#),
        (r#"{"jsonrpc":"1.0","method":"notifications/initialized"}"#, -32600, json!(null), r#"jsonrpc must be "2.0""#),
        ("hello", -32700, json!(null), "the body is not JSON (expected value at line 1 column 1)"),
        (r#"{"jsonrpc":"2.0","id":8,"#, -32700, json!(null), "the body is not JSON (EOF while parsing"),
        ("", -32700, json!(null), "the body is not JSON"),
        ("5", -32600, json!(null), "a JSON-RPC message is a JSON object, not 5"),
        (
            r#"{"jsonrpc":"2.0","id":{},"method":"tools/list"}"#,
            -32600,
            json!(null),
            "id must be a string or an integer",
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"method":"tools/list","params":[1]}"#,
            -32602,
            json!(9),
            "params must be an object",
        ),
        // These three were told "id must be a string or an integer" and "the body is not JSON".
        (
            r#"{"jsonrpc":"2.0","id":9223372036854775808,"method":"tools/list"}"#,
            -32600,
            json!(null),
            "an integer id must fit a signed 64-bit integer, and 9223372036854775808 does not",
        ),
        (r#"{"jsonrpc":"1.0","id":2.0,"method":"tools/list"}"#, -32600, json!(2), r#"jsonrpc must be "2.0""#),
        (
            r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}"#,
            -32600,
            json!(null),
            "id must be a string or an integer, not 1.5",
        ),
        (&deep, -32600, json!("deep"), "the message is nested more than 128 levels deep"),
        (&marked, -32700, json!(null), "the body begins with a UTF-8 byte order mark: send the JSON without it"),
    ];
    for (body, code, id, says) in cases {
        // Alike before a session and in one: rmcp reads the body before it looks for a session.
        for session in [None, Some(session.as_str())] {
            let mut headers = vec![("mcp-protocol-version", "2025-11-25")];
            headers.extend(session.map(|s| ("mcp-session-id", s)));
            let a = send(&m, "POST", &m.token, &headers, Some(body.to_string()));
            let what = format!("{body:?} in session {session:?}");
            assert_eq!((a.status, a.content_type.as_deref()), (400, Some("application/json")), "{what}: {a:?}");
            assert_error(&message_of(&a), code, &id, says);
        }
    }
    // A Content-Type other than JSON is refused by rmcp before it reads the body, as before.
    let a = send(&m, "POST", &m.token, &[("content-type", "text/plain")], None);
    assert_eq!(a.status, 415, "{a:?}");
    assert_serves(&m, &session);
}

#[test]
fn tools_call_without_params_is_invalid_params_not_method_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let session = open_session(&m, &m.token).unwrap();
    // rmcp answered each -32601 (Method not found) with the method's name alone: it reads a
    // `tools/call` whose params do not parse as a request for a method it does not know.
    let shape = r#"tools/call needs params {"name": <a tool from tools/list>, "arguments": {...}}"#;
    let cases = [
        (None, "none were given"),
        (Some(json!(null)), "none were given"),
        (Some(json!({})), "missing field `name`"),
        (Some(json!({"nam": "agentos_search_catalog"})), "missing field `name`"),
        (Some(json!({"name": 5})), "invalid type: integer `5`, expected a string"),
        (Some(json!({"name": "agentos_search_catalog", "arguments": [1]})), "invalid type: sequence, expected a map"),
    ];
    for (i, (params, says)) in cases.into_iter().enumerate() {
        let id = json!(format!("call-{i}"));
        let mut call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call"});
        if let Some(p) = params {
            call["params"] = p;
        }
        // In the session's own form: a 200 event stream, as rmcp answers every request in it.
        let a = exchange(&m, "POST", &m.token, Some(&session), Some(call.clone()));
        assert_eq!((a.status, a.content_type.as_deref()), (200, Some("text/event-stream")), "{call}: {a:?}");
        let answer = message_of(&a);
        assert_error(&answer, -32602, &id, shape);
        assert_error(&answer, -32602, &id, says);
    }
    // The same for `initialize`, in a session and before one (where rmcp answered 400 "Session
    // ID is required" in plain text); a method this server does not serve is still not found.
    let init = json!({"jsonrpc": "2.0", "id": 4, "method": "initialize"});
    let a = exchange(&m, "POST", &m.token, Some(&session), Some(init.clone()));
    assert_error(&message_of(&a), -32602, &json!(4), r#"initialize needs params {"protocolVersion""#);
    let a = exchange(&m, "POST", &m.token, None, Some(init));
    assert_eq!((a.status, a.content_type.as_deref()), (400, Some("application/json")), "{a:?}");
    assert_error(&message_of(&a), -32602, &json!(4), "none were given");
    for method in ["resources/read", "prompts/get", "no/such/method"] {
        let a =
            exchange(&m, "POST", &m.token, Some(&session), Some(json!({"jsonrpc": "2.0", "id": 5, "method": method})));
        assert_error(&message_of(&a), -32601, &json!(5), method);
    }

    // Without a session, at 2026-07-28 (a request carries its version): answered alike, where
    // rmcp answered -32601 with HTTP 404; `subscriptions/listen` is served there too.
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}});
    for (method, says) in
        [("tools/call", "missing field `name`"), ("subscriptions/listen", "missing field `notifications`")]
    {
        let body = json!({"jsonrpc": "2.0", "id": 6, "method": method, "params": {"_meta": meta}});
        let headers = [("mcp-protocol-version", "2026-07-28"), ("mcp-method", method)];
        let a = send(&m, "POST", &m.token, &headers, Some(body.to_string()));
        assert_eq!(a.status, 200, "{method}: {a:?}");
        let answer = message_of(&a);
        assert_error(&answer, -32602, &json!(6), &format!("{method} needs params"));
        assert_error(&answer, -32602, &json!(6), says);
    }
    assert_serves(&m, &session);
}

#[test]
fn an_mcp_session_serves_only_the_principal_that_opened_it() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    // Two agents with the same flags: what tells them apart is the token alone.
    let a = api.agent("alice", "r").token.unwrap();
    let b = api.agent("bob", "r").token.unwrap();
    let session = open_session(&m, &a).unwrap();
    let listed = exchange(&m, "POST", &a, Some(&session), Some(tools_list()));
    assert_eq!(listed.status, 200, "{listed:?}");
    assert!(listed.body.contains("agentos_list_tokens"), "{listed:?}");
    let made_up = "0b5e55ed-0000-4000-8000-000000000000";

    // Under another token the session answers as one that does not exist: rmcp's own 404, word
    // for word, for a message and for the event stream.
    let unknown =
        Answer { status: 404, content_type: None, session: None, body: "Not Found: Session not found".to_string() };
    for (method, body) in [("POST", Some(tools_list())), ("GET", None)] {
        assert_eq!(exchange(&m, method, &b, Some(&session), body.clone()), unknown, "{method} under another token");
        assert_eq!(exchange(&m, method, &b, Some(made_up), body), unknown, "{method} of a made-up session");
    }
    // Nor can it end the session: refused as the end of a session that does not exist is.
    let refused = exchange(&m, "DELETE", &b, Some(&session), None);
    assert_eq!(refused, exchange(&m, "DELETE", &b, Some(made_up), None));
    assert_eq!((refused.status, refused.content_type.as_deref()), (404, Some("application/json")), "{refused:?}");
    let error: Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(error["error"]["code"], "not_found", "{error}");
    assert!(error["error"]["message"].as_str().unwrap().contains("no MCP session of yours"), "{error}");

    // The session lives on for its own principal, its event stream too.
    assert_eq!(exchange(&m, "POST", &a, Some(&session), Some(tools_list())).status, 200);
    assert_eq!(exchange(&m, "GET", &a, Some(&session), None).status, 200);
    // It ends once, as rmcp ends it; after that it is as unknown to its principal as to anyone.
    let ended = exchange(&m, "DELETE", &a, Some(&session), None);
    assert_eq!(ended.status, 202, "{ended:?}");
    assert_eq!(exchange(&m, "DELETE", &a, Some(&session), None), refused);
    assert_eq!(exchange(&m, "POST", &a, Some(&session), Some(tools_list())), unknown);
    assert_eq!(exchange(&m, "DELETE", &a, Some(made_up), None), refused);
}

#[test]
fn one_principal_holds_at_most_a_hundred_mcp_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    let a = api.agent("alice", "r").token.unwrap();
    let sessions: Vec<String> = (0..100).map(|_| open_session(&m, &a).unwrap()).collect();
    let refused = open_session(&m, &a).unwrap_err();
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(refused.body.contains("too_many_sessions") && refused.body.contains("alice has 100 MCP sessions open"));
    // Another principal is not held to alice's count, and an ended session makes room.
    open_session(&m, &api.agent("bob", "r").token.unwrap()).unwrap();
    assert_eq!(exchange(&m, "DELETE", &a, Some(&sessions[0]), None).status, 202);
    open_session(&m, &a).unwrap();
}

/// Regression: a `tools/call` held no invocation slot, so one principal's MCP calls ran past
/// `--max-concurrent-invocations`, where the same calls over the API were refused with 429.
#[test]
fn mcp_tool_calls_are_held_to_the_callers_invocation_slots() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--max-concurrent-invocations", "1"]);
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let api = m.client();
    let go = dir.path().join("go");
    let slow = format!("until [ -e {} ]; do sleep 0.02; done; echo slow", go.display());
    assert_eq!(api.register("slow", "sh", &slow, None).0, 200);
    assert_eq!(api.register("quick", "sh", "echo quick", None).0, 200);
    let session = open_session(&m, &m.token).unwrap();
    let call = |id: u64, name: &str| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": {}}});
    let first = std::thread::scope(|s| {
        let running =
            s.spawn(|| message_of(&exchange(&m, "POST", &m.token, Some(&session), Some(call(2, "slow_run")))));
        common::wait_for("the first call to run", || api.get("/api/executors").1[0]["state"] == "busy");
        let refused = message_of(&exchange(&m, "POST", &m.token, Some(&session), Some(call(3, "quick_run"))));
        assert_eq!(refused["result"]["isError"], true, "{refused}");
        let text = refused["result"]["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.contains("the limit"), "{refused}");
        std::fs::write(&go, b"").unwrap();
        running.join().unwrap()
    });
    assert_eq!(first["result"]["isError"], false, "{first}");
    // The slot came back with the first call's end.
    let again = message_of(&exchange(&m, "POST", &m.token, Some(&session), Some(call(4, "quick_run"))));
    assert_eq!(again["result"]["isError"], false, "{again}");
}

/// Regression: `notifications/cancelled` stopped only the answer; the call ran on to its end and
/// held the caller's invocation slot meanwhile. Now the call goes as a caller that went away:
/// its slot is free at once and its running job is stopped at the executor's next heartbeat.
#[test]
fn a_cancelled_mcp_call_frees_its_slot_and_stops_its_job() {
    let dir = tempfile::tempdir().unwrap();
    let m =
        Master::start_with(&dir.path().join("master"), &["--max-concurrent-invocations", "1", "--lease-ms", "3000"]);
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let api = m.client();
    let go = dir.path().join("go");
    let ran = dir.path().join("ran");
    let slow = format!("until [ -e {} ]; do sleep 0.02; done; touch {}", go.display(), ran.display());
    assert_eq!(api.register("slow", "sh", &slow, None).0, 200);
    assert_eq!(api.register("quick", "sh", "echo quick", None).0, 200);
    let session = open_session(&m, &m.token).unwrap();
    let call = |id: u64, name: &str| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": {}}});
    std::thread::scope(|s| {
        let running = s.spawn(|| exchange(&m, "POST", &m.token, Some(&session), Some(call(2, "slow_run"))));
        common::wait_for("the slow call to run", || api.get("/api/executors").1[0]["state"] == "busy");
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2, "reason": "enough"}});
        assert_eq!(exchange(&m, "POST", &m.token, Some(&session), Some(cancel)).status, 202);
        // The slot is free: the caller's next call runs rather than being told the limit.
        let mut next = Value::Null;
        common::wait_for("the cancelled call's slot to come back", || {
            next = message_of(&exchange(&m, "POST", &m.token, Some(&session), Some(call(3, "quick_run"))));
            next["result"]["isError"] == false
        });
        assert!(next["result"]["content"][0]["text"].as_str().unwrap_or_default().contains("quick"), "{next}");
        common::wait_for("the slow job to be stopped", || api.get("/api/executors").1[0]["state"] != "busy");
        running.join().unwrap();
    });
    // The same through `agentos mcp`: the relay passes the cancel on to the master.
    let mut relay = Relay::start(&m, &m.token);
    relay.send(call(2, "slow_run"));
    common::wait_for("the slow call to run", || api.get("/api/executors").1[0]["state"] == "busy");
    relay.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}));
    // The cancelled call's id is free at once, and a request that reuses it gets its own
    // answer, never the cancelled call's.
    relay.send(call(2, "quick_run"));
    let reused = relay.answer(2);
    assert!(reused["result"].is_object(), "{reused}");
    let mut id = 3;
    loop {
        relay.send(call(id, "quick_run"));
        let next = relay.answer(id);
        if next["result"]["isError"] == false {
            break;
        }
        assert!(id < 200, "the cancelled call's slot never came back: {next}");
        std::thread::sleep(std::time::Duration::from_millis(50));
        id += 1;
    }
    // The slow job is stopped, not left running beside the quick one.
    common::wait_for("the relayed slow job to be stopped", || api.get("/api/executors").1[0]["state"] != "busy");
    std::fs::write(&go, b"").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!ran.exists(), "a cancelled job ran on to its end");
}

/// Regression: a second request with the id of one still being answered in the same session
/// took the first one's answer in rmcp's routing, and was never answered itself: its stream stayed
/// open on keep-alives until the client gave up.
#[test]
fn a_request_whose_id_is_still_being_answered_in_its_session_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    // Room for the quick calls beside the slow one.
    let _e = Executor::start_args(&m, &dir.path().join("executor"), "e1", &[], &["--concurrency", "3"]);
    let api = m.client();
    let go = dir.path().join("go");
    let slow = format!("until [ -e {} ]; do sleep 0.02; done; echo slow", go.display());
    assert_eq!(api.register("slow", "sh", &slow, None).0, 200);
    assert_eq!(api.register("quick", "sh", "echo quick", None).0, 200);
    let session = open_session(&m, &m.token).unwrap();
    let call = |id: Value, name: &str| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": {}}});
    let text = |v: &Value| v["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    std::thread::scope(|s| {
        let running =
            s.spawn(|| message_of(&exchange(&m, "POST", &m.token, Some(&session), Some(call(json!(5), "slow_run")))));
        common::wait_for("the first call to run", || api.get("/api/executors").1[0]["state"] == "busy");
        // The same id, also in its float form, which JSON-RPC reads as the same.
        for id in [json!(5), json!(5.0)] {
            let refused = exchange(&m, "POST", &m.token, Some(&session), Some(call(id, "quick_run")));
            assert_eq!(refused.status, 400, "{refused:?}");
            assert_error(&message_of(&refused), -32600, &json!(5), "a request with id 5 is still being answered");
        }
        // Another id in the same session, and the same id in another session, are served.
        let other = message_of(&exchange(&m, "POST", &m.token, Some(&session), Some(call(json!("5"), "quick_run"))));
        assert!(other["result"]["isError"] == false && text(&other).contains("quick"), "{other}");
        let elsewhere = open_session(&m, &m.token).unwrap();
        let other = message_of(&exchange(&m, "POST", &m.token, Some(&elsewhere), Some(call(json!(5), "quick_run"))));
        assert_eq!(other["result"]["isError"], false, "{other}");
        std::fs::write(&go, b"").unwrap();
        // The first call gets its own answer.
        let first = running.join().unwrap();
        assert_eq!(first["id"], json!(5), "{first}");
        assert!(text(&first).contains("slow") && !text(&first).contains("quick"), "{first}");
    });
    // Once answered, an id is free again: a client that numbers every request 5 is served.
    for _ in 0..20 {
        let again = message_of(&exchange(&m, "POST", &m.token, Some(&session), Some(call(json!(5), "quick_run"))));
        assert_eq!(again["result"]["isError"], false, "{again}");
    }

    // The same through `agentos mcp`, whose own ids upstream hid the clash from the master:
    // the second request took the first one's answer and the first was never answered.
    std::fs::remove_file(&go).unwrap();
    let mut relay = Relay::start(&m, &m.token);
    relay.send(call(json!(5), "slow_run"));
    common::wait_for("the relayed call to run", || api.get("/api/executors").1[0]["state"] == "busy");
    relay.send(call(json!(5), "quick_run"));
    let refused = relay.answer(5);
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().starts_with("a request with id 5 is still being answered"));
    relay.send(call(json!(6), "quick_run"));
    assert!(text(&relay.answer(6)).contains("quick"));
    std::fs::write(&go, b"").unwrap();
    let first = relay.answer(5);
    assert!(text(&first).contains("slow"), "{first}");
    // Answered: the id is free again.
    relay.send(call(json!(5), "quick_run"));
    assert!(text(&relay.answer(5)).contains("quick"));
}

#[test]
fn agentos_mcp_without_a_token_says_what_to_set() {
    let out = Command::new(BIN).arg("mcp").env_remove("AGENTOS_TOKEN").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("set AGENTOS_TOKEN"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "stdout belongs to the protocol");
}

/// Regression: a master that was not there was said as rmcp's "Client error: error sending
/// request", with no cause and exit 1; a shell command says "cannot reach the master", exit 7.
#[test]
fn agentos_mcp_with_no_master_there_says_it_cannot_reach_it() {
    use std::io::Write;
    let url = format!("http://127.0.0.1:{}", common::free_port());
    let mut child = Command::new(BIN)
        .arg("mcp")
        .env("AGENTOS_URL", &url)
        .env("AGENTOS_TOKEN", "t")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}});
    writeln!(child.stdin.take().unwrap(), "{initialize}").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach the master at {url}")) && stderr.contains("Connection refused"),
        "{stderr}"
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["id"], 1, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().starts_with("cannot reach the master"), "{answer}");
}

#[test]
fn a_large_catalog_is_offered_as_search_and_the_platform_tools_follow_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--mcp-list-limit", "3"]);
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let api = m.client();
    for id in ["alpha", "beta", "gamma", "delta"] {
        let body = script(id, &format!("printf '{{\"from\":\"{id}\"}}'"), json!({}));
        assert_eq!(api.command(body).0, 200);
    }
    assert_eq!(api.post("/api/models", json!({"name": "author"})).0, 200);
    let author = api.agent("author", "rwx------s");
    let viewer = api.agent("viewer", "r");
    let net = json!({"places": ["p-a", "p-b"], "transitions": [
        {"id": "move", "kind": "pass", "presets": {"x": {"place": "p-a"}}, "postsets": {"y": {"place": "p-b"}},
         "emit": [{"to": "y"}]}]});
    let v = client(json!({
        "transport": "http", "mode": "legacy", "url": m.url, "token": author.token,
        "calls": [
            ["agentos_search_tools", {"q": "GAMMA script"}],
            ["agentos_describe_tool", {"name": "gamma_run"}],
            ["agentos_call_tool", {"name": "gamma_run", "arguments": {}}],
            ["delta_run", {}],
            ["agentos_call_tool", {"name": "nope_run"}],
            ["agentos_apply_net", {"net": net}],
            ["agentos_put_token", {"place": "p-a", "data": {"n": 1}}],
            ["agentos_fire_transition", {"transition": "move"}],
            ["agentos_list_tokens", {"place": "p-b"}],
            ["agentos_register_script", {"id": "mine", "name": "mine", "runtime": "sh", "content": "echo 1"}],
            ["agentos_put_token", {"data": 1}],
            ["agentos_call_tool", {"name": "gamma_run", "args": {}}],
            ["agentos_search_tools", {"q": "gamma", "limit": 0}],
        ],
    }));
    // Four operations are past the limit of three: the list offers search instead of them.
    assert_eq!(
        v["tools"],
        json!([
            "agentos_apply_net",
            "agentos_call_tool",
            "agentos_describe_tool",
            "agentos_fire_transition",
            "agentos_get_entry",
            "agentos_list_tokens",
            "agentos_put_token",
            "agentos_register_script",
            "agentos_search_catalog",
            "agentos_search_tools",
            "agentos_start_transition",
            "agentos_stop_transition"
        ]),
        "{v}"
    );
    let calls = v["calls"].as_array().unwrap();
    for c in &calls[..4] {
        assert_eq!(c["isError"], false, "{c}");
    }
    assert_eq!(calls[0]["structured"]["tools"], json!([{"name": "gamma_run", "description": "The gamma script"}]));
    assert_eq!(calls[1]["structured"]["inputSchema"]["type"], "object", "{}", calls[1]);
    assert_eq!(calls[2]["structured"], json!({"from": "gamma"}));
    assert_eq!(calls[3]["structured"], json!({"from": "delta"}), "listed or not, a tool is callable by name");
    assert_eq!(calls[4]["isError"], true);
    assert!(calls[4]["text"][0].as_str().unwrap().starts_with("no tool \"nope_run\""), "{}", calls[4]);
    for c in &calls[5..10] {
        assert_eq!(c["isError"], false, "{c}");
    }
    assert_eq!(calls[8]["structured"]["result"][0]["data"], json!({"n": 1}), "the token moved: {}", calls[8]);
    assert_eq!(calls[9]["structured"]["id"], "mine", "{}", calls[9]);
    assert_eq!(calls[10]["isError"], true);
    assert!(calls[10]["text"][0].as_str().unwrap().starts_with("agentos_put_token: \"place\""), "{}", calls[10]);
    // A misnamed or out-of-range argument of a platform tool is refused, not dropped or clamped.
    assert_eq!(calls[11]["isError"], true, "{}", calls[11]);
    assert_eq!(
        calls[11]["text"][0],
        "agentos_call_tool: Additional properties are not allowed ('args' was unexpected); its arguments: arguments, name"
    );
    assert_eq!(calls[12]["isError"], true, "{}", calls[12]);
    assert_eq!(
        calls[12]["text"][0],
        "agentos_search_tools: 0 is less than the minimum of 1 (at /limit); its arguments: limit, q"
    );

    // `r` alone: tokens can be listed, nothing else is offered; what it may not do is refused as unknown.
    let v = client(json!({
        "transport": "http", "mode": "legacy", "url": m.url, "token": viewer.token,
        "calls": [["agentos_put_token", {"model": "author", "place": "p-a", "data": 2}]],
    }));
    assert_eq!(v["tools"], json!(["agentos_list_tokens"]), "{v}");
    assert_eq!(v["calls"][0]["isError"], true, "{v}");
    assert_eq!(api.token_data("author", "p-a").len(), 0, "nothing was put");
}

/// FastMCP's client (4.x) with its bearer auth against `/mcp`.
#[test]
fn a_fastmcp_client_lists_and_calls_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fastmcp_client.py");
    let run = |tool: &str, args: Value| -> Value {
        let out =
            Command::new(python()).arg(script).args([&m.url, &m.token, tool, &args.to_string()]).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
    };
    let v = run("weather_forecast", json!({"city": "Oslo", "days": 1}));
    assert!(v["tools"].as_array().unwrap().contains(&json!("weather_ping")), "{v}");
    assert_eq!(v["isError"], false, "{v}");
    assert_eq!(v["structured"]["city"], "Oslo", "{v}");
    let v = run("weather_forecast", json!({"days": 1}));
    assert_eq!(v["isError"], true, "{v}");
    assert!(v["text"][0].as_str().unwrap().contains("\"city\" is a required property"), "{v}");
}

/// Sends an `initialize` under `token` on a connection of its own and resets the connection as
/// soon as the request is written (SO_LINGER 0, then close), as a client that goes away during
/// the handshake does.
fn abort_initialize(m: &Master, token: &str) {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let address = m.url.trim_start_matches("http://");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    .to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\naccept: application/json, text/event-stream\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut socket = std::net::TcpStream::connect(address).unwrap();
    let reset = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a socket this function owns, and an option value of the size given.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&reset as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
    socket.write_all(request.as_bytes()).unwrap();
    drop(socket);
}

/// Regression: rmcp opens a session before the master records its owner, and a client that
/// reset the connection right after sending `initialize` left a session with no owner, counted
/// by neither cap, for rmcp's 5 minutes of idle time; each such initialize also logged two
/// ERROR lines. One agent held 18,000 sessions that way against a cap of 10,000.
#[test]
fn an_initialize_whose_client_went_away_still_counts_toward_the_session_caps() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("master.log");
    let m = Master::start_logged(&dir.path().join("master"), &log, &[]);
    let alice = m.client().agent("alice", "r").token.unwrap();
    // rmcp logs each session it opens; nothing else opens one here.
    let opened = || std::fs::read_to_string(&log).unwrap().matches("create new session").count();
    let mut attempts = 0;
    while opened() < 110 {
        assert!(attempts < 5_000, "rmcp opened {} sessions in {attempts} aborted initializes", opened());
        abort_initialize(&m, &alice);
        attempts += 1;
    }
    // Every session rmcp opened has alice for its owner: the cap is reached.
    let refused = open_session(&m, &alice).unwrap_err();
    assert_eq!(refused.status, 429, "{refused:?} after {attempts} aborted initializes");
    let text = std::fs::read_to_string(&log).unwrap();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

/// Regression: the relay never ended its session at the master when it exited, so a hundred
/// relay starts locked the agent out of MCP for the 5 minutes rmcp keeps an idle session.
#[test]
fn agentos_mcp_ends_its_session_at_the_master_when_it_exits() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let alice = m.client().agent("alice", "r").token.unwrap();
    let ping = |relay: &mut Relay| {
        relay.send(json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}));
        assert_eq!(relay.answer(2)["result"], json!({}));
    };
    for n in 0..105 {
        let mut relay = Relay::start(&m, &alice);
        ping(&mut relay);
        assert!(relay.close().success(), "relay {n}");
    }
    open_session(&m, &alice).unwrap();
    // Stopped by a signal, too: with 99 sessions held, each relay's is the 100th, and the next
    // relay opens none unless it was ended.
    for _ in 0..98 {
        open_session(&m, &alice).unwrap();
    }
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGTERM] {
        let mut relay = Relay::start(&m, &alice);
        ping(&mut relay);
        assert!(relay.stop(signal).success(), "signal {signal}");
    }
    open_session(&m, &alice).unwrap();
}

/// Regression: a relay the master refused a session (an agent at its 100) exited 1 with "cannot
/// reach the master's MCP endpoint … error: HTTP 429, when send initialize request": the
/// master's words were lost, and the client's `initialize` went unanswered.
#[test]
fn agentos_mcp_answers_an_initialize_the_master_refuses_with_the_masters_words() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let bob = m.client().agent("bob", "r").token.unwrap();
    for _ in 0..100 {
        open_session(&m, &bob).unwrap();
    }
    let mut relay = Relay::spawn(&m, &bob, std::process::Stdio::piped());
    relay.send(json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}));
    let refused = relay.next_answer();
    let says = "opened no session: HTTP 429 Too Many Requests: bob has 100 MCP sessions open, the limit; \
                close one (DELETE /mcp with its Mcp-Session-Id) or let it go idle for 5 minutes";
    assert_error(&refused, -32603, &json!("init"), says);
    assert_eq!(refused["error"]["data"], json!({"status": 429}), "{refused}");
    let status = relay.close();
    assert_eq!(status.code(), Some(1), "{status}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut relay.child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("agentos mcp: the master's MCP endpoint") && stderr.contains(says), "{stderr}");
    // The probe that read the master's words left nothing open: bob still holds 100.
    assert_eq!(open_session(&m, &bob).unwrap_err().status, 429);
}

/// Regression: a relay whose token the master refused answered the client's `initialize` with
/// "opened no session: Auth required", without the 401 or the master's words; one whose token was
/// revoked mid-session answered each request "the request to the master failed: Auth required".
#[test]
fn agentos_mcp_says_the_master_refused_its_token_with_the_401_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let initialize = json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}});
    let mut relay = Relay::spawn(&m, "not-a-token", std::process::Stdio::piped());
    relay.send(initialize);
    let refused = relay.next_answer();
    let says = "opened no session: HTTP 401 Unauthorized: the bearer token is not valid (revoked, mistyped, \
                or from another data folder)";
    assert_error(&refused, -32603, &json!("init"), says);
    assert_eq!(refused["error"]["data"], json!({"status": 401}), "{refused}");
    assert_eq!(relay.close().code(), Some(1));
    // Revoked while its session is open: the next request says so, and how to go on.
    let api = m.client();
    let alice = api.agent("alice", "r").token.unwrap();
    let mut relay = Relay::start(&m, &alice);
    relay.assert_lists(2);
    assert_eq!(api.request("DELETE", "/api/agents/alice", None).0, 200);
    relay.send(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}));
    let refused = relay.answer(9);
    assert_error(&refused, -32603, &json!(9), "the master answered HTTP 401 Unauthorized");
    assert!(refused["error"]["message"].as_str().unwrap().contains("valid AGENTOS_TOKEN"), "{refused}");
}

/// Regression: over stdio a malformed line was answered by rmcp's own transport, not as `/mcp`
/// answers the same body: a `tools/call` without params was -32601 (Method not found), a batch
/// or a wrong `jsonrpc` a bare "Invalid request" without the id, an object id nothing at all.
#[test]
fn agentos_mcp_answers_a_line_it_cannot_read_as_the_http_endpoint_does() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let mut relay = Relay::start(&m, &m.token);
    let cases = [
        (r#"{"jsonrpc":"2.0","id":4,"method":"tools/call"}"#, -32602, json!(4), "tools/call needs params"),
        (
            r#"[{"jsonrpc":"2.0","id":5,"method":"tools/list"}]"#,
            -32600,
            json!(null),
            "a batch (JSON array) is not accepted",
        ),
        ("not json", -32700, json!(null), "the body is not JSON (expected ident at line 1 column 2)"),
        (r#"{"jsonrpc":"1.0","id":3,"method":"tools/list"}"#, -32600, json!(3), r#"jsonrpc must be "2.0", not "1.0""#),
        (
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}"#,
            -32600,
            json!(null),
            "id must be a string or an integer",
        ),
        (r#"{"jsonrpc":"2.0","id":"again","method":"initialize"}"#, -32602, json!("again"), "initialize needs params"),
        (
            r#"{"jsonrpc":"2.0","id":9223372036854775808,"method":"ping"}"#,
            -32600,
            json!(null),
            "must fit a signed 64-bit integer",
        ),
    ];
    for (line, code, id, says) in cases {
        relay.send_line(line);
        assert_error(&relay.next_answer(), code, &id, says);
    }
    // The session goes on.
    relay.assert_lists(6);
}

/// Regression: a notification sent before `initialize` made `agentos mcp` exit 1 with a debug
/// dump, the `initialize` that followed never answered. Now it is dropped (there is nothing to
/// answer), and a request before it is told what it lacks, as before.
#[test]
fn agentos_mcp_serves_a_client_that_speaks_before_it_initializes() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let mut relay = Relay::spawn(&m, &m.token, std::process::Stdio::null());
    relay.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    relay.send(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}));
    assert_eq!(relay.next_answer()["id"], 7);
    relay.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}));
    relay.send(json!({"jsonrpc": "2.0", "id": 8, "result": {}}));
    relay.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}));
    assert!(relay.answer(1)["result"]["serverInfo"].is_object());
    relay.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    relay.assert_lists(2);
}

/// Regression: revoking an agent left its MCP sessions open: its event stream went on, still
/// told of tool changes, and its sessions counted toward the master's bound until idle.
#[test]
fn revoking_an_agent_ends_its_mcp_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    let alice = api.agent("alice", "r").token.unwrap();
    let session = open_session(&m, &alice).unwrap();
    let stream = common::http()
        .get(format!("{}/mcp", m.url))
        .bearer_auth(&alice)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .unwrap();
    assert_eq!(stream.status(), 200);
    let (ended, end) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut stream = stream;
        let _ = std::io::copy(&mut stream, &mut std::io::sink());
        let _ = ended.send(());
    });
    assert_eq!(api.request("DELETE", "/api/agents/alice", None).0, 200);
    // rmcp sends a keep-alive every 15 seconds: a stream still open would outlast this.
    end.recv_timeout(std::time::Duration::from_secs(10)).expect("the revoked agent's event stream ended");
}

/// Regression: rmcp ended a session 5 minutes after the last message through it, so a client
/// that only listened on its `GET` stream for server notifications lost its session without a
/// word. A session now ends when it has had no request, and no answer or stream open, for the
/// idle time; one whose client keeps listening lives on.
#[test]
fn an_mcp_session_lives_while_its_client_listens_and_ends_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--mcp-session-idle-ms", "1500"]);
    let alice = m.client().agent("alice", "r").token.unwrap();
    let (listening, quiet) = (open_session(&m, &alice).unwrap(), open_session(&m, &alice).unwrap());
    let stream = common::http()
        .get(format!("{}/mcp", m.url))
        .bearer_auth(&alice)
        .header("accept", "text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("mcp-session-id", &listening)
        .send()
        .unwrap();
    assert_eq!(stream.status(), 200);
    // Past the idle time and the looks for idle sessions (every second at this idle time).
    std::thread::sleep(Duration::from_millis(4_000));
    let list = |session: &str| exchange(&m, "POST", &alice, Some(session), Some(tools_list()));
    let gone = list(&quiet);
    assert_eq!((gone.status, gone.body.as_str()), (404, "Not Found: Session not found"));
    let ended = exchange(&m, "DELETE", &alice, Some(&quiet), None);
    assert_eq!(ended.status, 404, "{ended:?}");
    assert!(ended.body.contains("it went idle for 1500 ms"), "{ended:?}");
    let listed = message_of(&list(&listening));
    assert!(listed["result"]["tools"].is_array(), "{listed}");
    // The stream closed, the session goes idle too.
    drop(stream);
    std::thread::sleep(Duration::from_millis(4_000));
    assert_eq!(list(&listening).status, 404);
    // Both are gone from alice's count: a hundred open again.
    for _ in 0..100 {
        open_session(&m, &alice).unwrap();
    }
}

/// Regression: MCP saw only the first 1,000 entries of a catalog (the bound of one page of the
/// search), so a tool past them answered "no tool", and its changes told no session.
#[test]
fn mcp_offers_every_entry_of_a_catalog_past_a_thousand() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    for i in 0..1_000 {
        assert_eq!(api.command(script(&format!("a{i:04}"), "echo", json!({}))).0, 200);
    }
    assert_eq!(api.command(script("zzz-late", "echo", json!({}))).0, 200);
    let session = open_session(&m, &m.token).unwrap();
    let describe = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "agentos_describe_tool", "arguments": {"name": "zzz-late_run"}}});
    let v = message_of(&exchange(&m, "POST", &m.token, Some(&session), Some(describe)));
    assert_eq!(v["result"]["isError"], false, "{v}");
    assert_eq!(v["result"]["structuredContent"]["name"], "zzz-late_run", "{v}");
}
