//! Docker binding benchmark, on the real engine and registry (`scripts/tool-image` starts them
//! and pushes the test images): (a) cold start, from a call with no container to its answer,
//! each round a fresh entry of the FROM scratch test image; (b) a warm call through the master
//! against the same request sent straight to the container's port, both by one lean keep-alive
//! client, in one run. Prints figures; asserts nothing.
//! Run: `cargo bench -p agentos-cli --bench docker`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;

use common::{ms, pct, start_master};

/// One kept-alive HTTP/1.1 connection, written out by hand so that the client's own cost is
/// the same on both sides and small.
struct Lean {
    conn: BufReader<TcpStream>,
    request: Vec<u8>,
}

impl Lean {
    fn new(addr: &str, request: String) -> Lean {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).unwrap();
        Lean { conn: BufReader::new(stream), request: request.into_bytes() }
    }

    /// Sends the request once; answers the body.
    fn send(&mut self) -> Vec<u8> {
        self.conn.get_mut().write_all(&self.request).unwrap();
        let mut line = String::new();
        self.conn.read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 200"), "{line}");
        let mut length = 0;
        loop {
            line.clear();
            self.conn.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; length];
        self.conn.read_exact(&mut body).unwrap();
        body
    }
}

fn images() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/tool-image");
    let out = Command::new(script).output().expect("scripts/tool-image");
    assert!(out.status.success(), "scripts/tool-image: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn summary(label: &str, mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let p50 = pct(&v, 0.5);
    println!("    {label:<44}: p50 {p50:>8.3} ms   p95 {:>8.3} ms   ({} runs)", pct(&v, 0.95), v.len());
    p50
}

fn main() {
    let image = format!("{}/ok:2", images());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("master");
    let (master, api) = start_master(&data);
    let owner = {
        let place = std::path::absolute(&data).unwrap();
        format!("agentos-{}", &agentos_core::sha256_hex(place.to_string_lossy().as_bytes())[..16])
    };
    let rounds: usize = std::env::var("AGENTOS_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let calls: usize = std::env::var("AGENTOS_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    println!(
        "environment: {} cores (nproc), image {image}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    // (a) Cold start: each round a new entry, so its first call starts a container.
    let mut cold = Vec::new();
    for i in 0..rounds {
        let id = format!("cold-{i}");
        api.post("/api/commands", json!({"type": "TOOL_CATALOG_IMPORT_IMAGE", "image": image, "id": id}));
        let started = Instant::now();
        let v = api.post(&format!("/api/tools/{id}/call"), json!({"tool": "echo", "args": ["--text", "hi"]}));
        cold.push(ms(started.elapsed()));
        assert_eq!(v["result"]["body"]["text"], "hi", "{v}");
    }
    println!("(a) cold start of a FROM scratch tool container to its first answer");
    let cold_p50 = summary("first call through the master", cold);
    println!("    goal: under 500 ms at p50 -> {}", if cold_p50 < 500.0 { "met" } else { "missed" });

    // (b) Warm: the same request through the master and straight to the container.
    api.post("/api/commands", json!({"type": "TOOL_CATALOG_IMPORT_IMAGE", "image": image, "id": "warm"}));
    api.post("/api/tools/warm/call", json!({"tool": "echo", "args": ["--text", "hi"]}));
    let port = container_port(&owner);
    let addr = api.url.trim_start_matches("http://").to_string();
    let body = r#"{"tool":"echo","args":["--text","hi"]}"#;
    let mut through = Lean::new(
        &addr,
        format!(
            "POST /api/tools/warm/call HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            api.token,
            body.len()
        ),
    );
    let direct_addr = format!("127.0.0.1:{port}");
    let mut direct = Lean::new(&direct_addr, format!("GET /echo?text=hi HTTP/1.1\r\nhost: {direct_addr}\r\n\r\n"));
    let check: Value = serde_json::from_slice(&through.send()).unwrap();
    assert_eq!(check["result"]["body"]["text"], "hi", "{check}");
    let (mut via, mut straight) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
    for _ in 0..calls {
        let t = Instant::now();
        through.send();
        via.push(ms(t.elapsed()));
        let t = Instant::now();
        direct.send();
        straight.push(ms(t.elapsed()));
    }
    println!("(b) warm call, interleaved, one keep-alive connection each");
    let via_p50 = summary("through the master (POST /api/tools/{id}/call)", via);
    let direct_p50 = summary("straight to the container's port", straight);
    let overhead = via_p50 - direct_p50;
    println!(
        "    warm overhead at p50                        : {overhead:>8.3} ms   (goal under 1.5 ms -> {})",
        if overhead < 1.5 { "met" } else { "missed" }
    );
    drop(master);
    // The master was killed: its containers go by its owner label.
    let ids = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=agentos.owner={owner}")])
        .output()
        .unwrap();
    for id in String::from_utf8_lossy(&ids.stdout).lines() {
        let _ = Command::new("docker").args(["rm", "-f", id]).output();
    }
    std::thread::sleep(Duration::from_millis(10));
}

/// The port the newest container of this master listens on (its name ends with it).
fn container_port(owner: &str) -> u16 {
    let out = Command::new("docker")
        .args(["ps", "--filter", &format!("label=agentos.owner={owner}"), "--format", "{{.Names}} {{.CreatedAt}}"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // The newest run container is the warm entry's (names end with its port).
    let newest = text.lines().next().expect("a warm container");
    newest.split_whitespace().next().unwrap().rsplit('-').next().unwrap().parse().unwrap()
}
