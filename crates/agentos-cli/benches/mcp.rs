//! MCP benchmark. (1) `tools/call` of a trivial host tool over Streamable HTTP, against the same
//! tool served by FastMCP (4.x), both driven by one lean client: a keep-alive HTTP client
//! speaking JSON-RPC itself, one session each, calls interleaved in blocks. (2) `tools/list` with
//! 1,000 visible tools: time, bytes and tokens (characters / 4), listed whole and in search mode.
//! Prints figures; asserts nothing. Run: `cargo bench -p agentos-cli --bench mcp`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;

use common::{Proc, pct, start_master_with, start_program, wait_until};

const EXAMPLE: &str = env!("CARGO_BIN_EXE_host-tools-example");

/// One MCP session over a kept-alive connection.
struct Session {
    http: reqwest::blocking::Client,
    url: String,
    token: Option<String>,
    id: Option<String>,
    next: u64,
}

impl Session {
    fn open(url: &str, token: Option<&str>) -> Session {
        let http = reqwest::blocking::Client::builder().tcp_nodelay(true).build().unwrap();
        let mut s = Session { http, url: format!("{url}/mcp"), token: token.map(str::to_string), id: None, next: 1 };
        let init = s.post(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}));
        assert!(init.contains("\"result\""), "{init}");
        s.post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s
    }

    /// Posts one message; answers the body (JSON, or the event stream carrying the answer).
    fn post(&mut self, body: Value) -> String {
        let mut req = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string());
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(id) = &self.id {
            req = req.header("mcp-session-id", id);
        }
        let resp = req.send().unwrap();
        if let Some(id) = resp.headers().get("mcp-session-id") {
            self.id = Some(id.to_str().unwrap().to_string());
        }
        let status = resp.status();
        let text = resp.text().unwrap();
        assert!(status.is_success(), "{status}: {text}");
        text
    }

    fn request(&mut self, method: &str, params: Value) -> String {
        let id = self.next;
        self.next += 1;
        self.post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
    }
}

/// The JSON-RPC answer inside a body, whether plain JSON or an event stream.
fn answer(body: &str) -> Value {
    // An event stream may open with an empty priming event.
    let json = body.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).rfind(|d| !d.is_empty());
    serde_json::from_str(json.unwrap_or(body)).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn time_calls(s: &mut Session, tool: &str, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let body = s.request("tools/call", json!({"name": tool, "arguments": {}}));
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            let v = answer(&body);
            assert!(!v["result"]["isError"].as_bool().unwrap_or(false), "{v}");
            ms
        })
        .collect()
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    println!("MCP benchmark: {cores} cores, release build, loopback");
    call_latency(dir.path());
    list_size(dir.path());
}

fn python() -> Option<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/py-env");
    let out = Command::new(script).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn call_latency(dir: &std::path::Path) {
    let (_master, api) = start_program(EXAMPLE, &[], &dir.join("master"));
    let mut ours = Session::open(&api.url, Some(&api.token));
    let fastmcp = python().map(|py| {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let server = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/mcp/fastmcp_server.py");
        let child =
            Command::new(py).arg(server).arg(port.to_string()).stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        let proc = Proc(child.expect("python"));
        let url = format!("http://127.0.0.1:{port}");
        wait_until("FastMCP listening", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        (proc, Session::open(&url, None))
    });
    for _ in 0..50 {
        time_calls(&mut ours, "weather_ping", 1);
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut theirs = fastmcp.map(|(p, mut s)| {
        time_calls(&mut s, "ping", 50);
        (p, s)
    });
    for _ in 0..10 {
        a.extend(time_calls(&mut ours, "weather_ping", 50));
        if let Some((_, s)) = theirs.as_mut() {
            b.extend(time_calls(s, "ping", 50));
        }
    }
    a.sort_by(|x, y| x.partial_cmp(y).unwrap());
    b.sort_by(|x, y| x.partial_cmp(y).unwrap());
    println!();
    println!("(1) tools/call of a trivial tool, Streamable HTTP, one kept-alive session, {} calls", a.len());
    println!("{:<44} {:>9} {:>9}", "", "p50 ms", "p95 ms");
    println!("{:<44} {:>9.3} {:>9.3}", "agentos /mcp → host tool (weather_ping)", pct(&a, 0.5), pct(&a, 0.95));
    if b.is_empty() {
        println!("FastMCP is not installed (scripts/py-env): no baseline");
        return;
    }
    println!("{:<44} {:>9.3} {:>9.3}", "FastMCP 4.x → ping", pct(&b, 0.5), pct(&b, 0.95));
    println!("agentos p50 is {:.1}x lower than FastMCP's (goal >= 3x)", pct(&b, 0.5) / pct(&a, 0.5));
}

/// 1,000 script tools with a two-field input and a description, on a master that lists them
/// whole and on one in search mode (the default limit).
fn list_size(dir: &std::path::Path) {
    println!();
    println!("(2) tools/list with 1,000 visible tools");
    println!("{:<32} {:>8} {:>10} {:>9} {:>10}", "", "tools", "bytes", "tokens", "p50 ms");
    for (label, limit) in [("listed whole", "100000"), ("search mode (limit 64)", "64")] {
        let (_master, api) = start_master_with(&["--mcp-list-limit", limit], &dir.join(format!("list-{limit}")));
        for i in 0..1000 {
            api.post(
                "/api/commands",
                json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": format!("tool-{i:04}"), "name": format!("tool {i}"),
                       "runtime": "sh", "content": "echo '{}'",
                       "description": format!("Summarise the entries of project {i} since a date"),
                       "input": {"type": "object", "required": ["project"], "properties": {
                           "project": {"type": "string", "description": "Project name"},
                           "since": {"type": "string", "description": "ISO date"}}}}),
            );
        }
        let mut s = Session::open(&api.url, Some(&api.token));
        let mut times = Vec::new();
        let mut body = String::new();
        for _ in 0..20 {
            let t = Instant::now();
            body = s.request("tools/list", json!({}));
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(|x, y| x.partial_cmp(y).unwrap());
        let v = answer(&body);
        let tools = v["result"]["tools"].as_array().map_or(0, Vec::len);
        let text = v["result"].to_string();
        println!(
            "{:<32} {:>8} {:>10} {:>9} {:>10.2}",
            label,
            tools,
            body.len(),
            text.chars().count().div_ceil(4),
            pct(&times, 0.5)
        );
    }
}
