//! Shim benchmark: a shim call to a trivial host tool and to a trivial script tool (run by a
//! separate executor, and by `agentos up`'s own), beside a Node.js client making the same
//! request; a shim call of an HTTP operation beside `curl` making the operation's request
//! itself; and the system prompt's size per tool on a 50-tool catalog. Prints figures; asserts
//! nothing. Run: `cargo bench -p agentos-cli --bench shims` (`-- prompt` for the prompt's size
//! alone).

use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};

mod common;

use common::{Api, BIN, start_executor, start_master_with, start_program, start_up};

const EXAMPLE: &str = env!("CARGO_BIN_EXE_host-tools-example");

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Wall time of `n` runs of a command, in ms, after a few warm-up runs.
fn time_runs(n: usize, mut make: impl FnMut() -> Command) -> Vec<f64> {
    for _ in 0..3 {
        make().output().unwrap();
    }
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let out = make().output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect()
}

fn main() {
    // `cargo bench` passes `--bench`; a bare `prompt` asks for the prompt's size alone.
    let prompt_only = std::env::args().skip(1).any(|a| a == "prompt");
    let dir = tempfile::tempdir().unwrap();
    let (_master, api) = start_program(EXAMPLE, &[], &dir.path().join("master"));
    api.register_script("nothing", "sh", "echo '{}'");
    if !prompt_only {
        time_calls(&api, dir.path());
        time_http_operation(dir.path());
    }
    prompt_size(&api);
}

/// `agentos install-shims` of `api`'s catalog into `bin`.
fn install_shims(api: &Api, bin: &std::path::Path) {
    let out = Command::new(&*BIN)
        .args(["install-shims", "--dir"])
        .arg(bin)
        .env("AGENTOS_URL", &api.url)
        .env("AGENTOS_TOKEN", &api.token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn time_calls(api: &Api, dir: &std::path::Path) {
    let Api { url, token, .. } = api;
    let _executor = start_executor(api, &dir.join("executor"), "bench", 1);
    let bin = dir.join("bin");
    install_shims(api, &bin);
    // The same script tool on `agentos up`, whose executor runs in the master's process.
    let (_up, up_api) = start_up(&dir.join("up"));
    up_api.register_script("nothing", "sh", "echo '{}'");
    let up_bin = dir.join("up-bin");
    install_shims(&up_api, &up_bin);

    // The same toolkits linked to `agentos-shim-full`, the `std` program the lean shim hands
    // the calls it does not make itself (when this build has one).
    let full_bin = dir.join("full-bin");
    let full = std::path::Path::new(&*BIN).with_file_name("agentos-shim-full");
    let has_full = full.is_file() && std::fs::read_link(bin.join("agentos-nothing")).is_ok_and(|t| t != full);
    if has_full {
        std::fs::create_dir_all(&full_bin).unwrap();
        for name in ["agentos-weather", "agentos-nothing"] {
            std::os::unix::fs::symlink(&full, full_bin.join(name)).unwrap();
        }
    }
    let full_shim = |name: &str, args: &[&str]| {
        let mut c = Command::new(full_bin.join(name));
        c.args(args).env("AGENTOS_URL", url).env("AGENTOS_TOKEN", token);
        c
    };
    let shim = |name: &str, args: &[&str]| {
        let mut c = Command::new(bin.join(name));
        c.args(args).env("AGENTOS_URL", url).env("AGENTOS_TOKEN", token);
        c
    };
    let up_shim = || {
        let mut c = Command::new(up_bin.join("agentos-nothing"));
        c.arg("run").env("AGENTOS_URL", &up_api.url).env("AGENTOS_TOKEN", &up_api.token);
        c
    };
    let node = |toolkit: &str, tool: &str| {
        let script = format!(
            "fetch(process.env.U + '/api/tools/{toolkit}/call', {{method: 'POST', headers: {{'authorization': 'Bearer ' + process.env.T, 'content-type': 'application/json'}}, body: JSON.stringify({{tool: '{tool}', args: []}})}}).then(r => r.text()).then(t => process.stdout.write(t + '\\n'))"
        );
        let mut c = Command::new("node");
        c.args(["-e", &script]).env("U", url).env("T", token);
        c
    };
    // The same request a shim makes, from a C program that does nothing else: connect, write
    // the request, copy the answer to stdout.
    let client = c_client(dir);
    let port = url.rsplit(':').next().unwrap().trim_end_matches('/').to_string();
    let body = r#"{"tool":"ping","args":[]}"#;
    let request = format!(
        "POST /api/tools/weather/call HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let has_client = client.is_some();
    let c_call = || {
        let mut c = Command::new(client.as_ref().unwrap());
        c.args([&port, &request]);
        c
    };
    let bare = || {
        let mut c = Command::new("sh");
        c.args(["-c", "echo {}"]);
        c
    };
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    println!("shim benchmark: {cores} cores, release build, loopback; wall time of whole processes");
    println!("(each side beside its baseline, interleaved in 10 rounds, so both meet the same machine)");
    println!();
    println!("{:<44} {:>9} {:>9}", "call", "p50 ms", "p95 ms");
    let (mut host, mut host_c, mut script, mut spawn) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut script_up, mut host_full, mut script_full) = (Vec::new(), Vec::new(), Vec::new());
    // An answer with floats in it (four days of temperatures).
    let forecast = ["forecast", "--city", "Paris", "--days", "4", "--fahrenheit"];
    let (mut floats, mut floats_full) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        host.extend(time_runs(20, || shim("agentos-weather", &["ping"])));
        if has_client {
            host_c.extend(time_runs(20, &c_call));
        }
        script.extend(time_runs(10, || shim("agentos-nothing", &["run"])));
        spawn.extend(time_runs(10, bare));
        script_up.extend(time_runs(10, up_shim));
        floats.extend(time_runs(10, || shim("agentos-weather", &forecast)));
        if has_full {
            host_full.extend(time_runs(20, || full_shim("agentos-weather", &["ping"])));
            script_full.extend(time_runs(10, || full_shim("agentos-nothing", &["run"])));
            floats_full.extend(time_runs(10, || full_shim("agentos-weather", &forecast)));
        }
    }
    let has_node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    let (hp50, hp95) = (pct(&mut host, 0.5), pct(&mut host, 0.95));
    println!("{:<44} {:>9.2} {:>9.2}", "shim → host tool (agentos-weather ping)", hp50, hp95);
    if has_client {
        let cp50 = pct(&mut host_c, 0.5);
        println!("{:<44} {:>9.2} {:>9.2}", "C client → the same request", cp50, pct(&mut host_c, 0.95));
        println!(
            "host tool: shim p50 {hp50:.2} ms (goal < 1.5 ms), {:.2} ms above the C client ({:.2}×)",
            hp50 - cp50,
            hp50 / cp50
        );
    } else {
        println!("no C compiler (cc): no C client baseline");
    }
    let (sp50, bp50) = (pct(&mut script, 0.5), pct(&mut spawn, 0.5));
    println!("{:<44} {:>9.2} {:>9.2}", "shim → script tool (agentos-nothing run)", sp50, pct(&mut script, 0.95));
    println!("{:<44} {:>9.2} {:>9.2}", "sh -c 'echo {}' (bare spawn)", bp50, pct(&mut spawn, 0.95));
    println!("script tool: {:.2} ms above a bare spawn at p50 (goal < 2 ms)", sp50 - bp50);
    let up50 = pct(&mut script_up, 0.5);
    println!("{:<44} {:>9.2} {:>9.2}", "shim → script tool through `agentos up`", up50, pct(&mut script_up, 0.95));
    println!(
        "script tool through `agentos up` (its executor in the master's process): {:.2} ms above a bare spawn at p50",
        up50 - bp50
    );
    if has_full {
        let (fh50, fs50) = (pct(&mut host_full, 0.5), pct(&mut script_full, 0.5));
        println!("{:<44} {:>9.2} {:>9.2}", "agentos-shim-full → host tool", fh50, pct(&mut host_full, 0.95));
        println!("{:<44} {:>9.2} {:>9.2}", "agentos-shim-full → script tool", fs50, pct(&mut script_full, 0.95));
        println!(
            "lean shim against agentos-shim-full: host tool {:.2}×, script tool {:.2}× ({:.2} ms above a bare spawn)",
            hp50 / fh50,
            sp50 / fs50,
            fs50 - bp50
        );
    }
    let fl50 = pct(&mut floats, 0.5);
    println!("{:<44} {:>9.2} {:>9.2}", "shim → host tool, floats in the answer", fl50, pct(&mut floats, 0.95));
    if has_full {
        let ff50 = pct(&mut floats_full, 0.5);
        println!("{:<44} {:>9.2} {:>9.2}", "agentos-shim-full → the same", ff50, pct(&mut floats_full, 0.95));
        println!("answer with floats: lean shim {:.2}× agentos-shim-full", fl50 / ff50);
    }
    if has_node {
        let mut nh = time_runs(40, || node("weather", "ping"));
        let mut ns = time_runs(40, || node("nothing", "run"));
        let np50 = pct(&mut nh, 0.5);
        println!("{:<44} {:>9.2} {:>9.2}", "node -e fetch → host tool", np50, pct(&mut nh, 0.95));
        println!("{:<44} {:>9.2} {:>9.2}", "node -e fetch → script tool", pct(&mut ns, 0.5), pct(&mut ns, 0.95));
        println!("host tool: shim {:.1}× below Node (goal ≥ 10×)", np50 / hp50);
    } else {
        println!("node is not installed: no Node.js baseline");
    }
}

/// A C program that makes one HTTP/1.1 request on loopback (`PORT REQUEST`) and copies the
/// answer to stdout: the least a process that calls the master can do. `None` without `cc`.
fn c_client(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    const SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/socket.h>
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(atoi(argv[1]));
    a.sin_addr.s_addr = htonl(0x7f000001);
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) return 1;
    size_t n = strlen(argv[2]);
    if (write(s, argv[2], n) != (ssize_t)n) return 1;
    char buf[65536];
    ssize_t r;
    while ((r = read(s, buf, sizeof buf)) > 0) fwrite(buf, 1, r, stdout);
    return 0;
}
"#;
    let src = dir.join("client.c");
    let bin = dir.join("c-client");
    std::fs::write(&src, SOURCE).ok()?;
    let ok = Command::new("cc").args(["-O2", "-o"]).arg(&bin).arg(&src).status().is_ok_and(|s| s.success());
    ok.then_some(bin)
}

/// A shim calling a GET operation of a registered OpenAPI document, against `curl` making the
/// same request to the same server directly: what the master in between adds.
fn time_http_operation(dir: &std::path::Path) {
    let server = common::StaticServer::start(b"{\"pong\":true}");
    let (_master, api) = start_master_with(&["--http-allow", "127.0.0.1"], &dir.join("http-master"));
    let doc = json!({
        "openapi": "3.0.3",
        "info": {"title": "ping", "version": "1"},
        "paths": {"/ping": {"get": {"operationId": "ping", "responses": {"200": {"description": "pong"}}}}}
    });
    let r = api.post(
        "/api/commands",
        json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "svc", "name": "svc", "baseUrl": server.url, "openapi": doc}),
    );
    assert_eq!(r["entry"]["status"].as_str().or(r["status"].as_str()), Some("registered"), "{r}");
    let bin = dir.join("http-bin");
    install_shims(&api, &bin);
    let has_curl = Command::new("curl").arg("--version").output().is_ok_and(|o| o.status.success());
    if !has_curl {
        println!("curl is not installed: no baseline for the HTTP operation");
        return;
    }
    let url = format!("{}/ping", server.url);
    // Interleaved, so both sides meet the same machine.
    let (mut shim, mut curl) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        shim.extend(time_runs(20, || {
            let mut c = Command::new(bin.join("agentos-svc"));
            c.arg("ping").env("AGENTOS_URL", &api.url).env("AGENTOS_TOKEN", &api.token);
            c
        }));
        curl.extend(time_runs(20, || {
            let mut c = Command::new("curl");
            c.args(["-sf", &url]);
            c
        }));
    }
    let (sp50, cp50) = (pct(&mut shim, 0.5), pct(&mut curl, 0.5));
    println!();
    println!("{:<44} {:>9} {:>9}", "HTTP operation (GET, loopback server)", "p50 ms", "p95 ms");
    println!("{:<44} {:>9.2} {:>9.2}", "shim → master → server (agentos-svc ping)", sp50, pct(&mut shim, 0.95));
    println!("{:<44} {:>9.2} {:>9.2}", "curl → server (the same request)", cp50, pct(&mut curl, 0.95));
    println!("http operation: the shim adds {:.2} ms at p50 over curl (goal < 1.5 ms)", sp50 - cp50);
}

/// The prompt of a 51-tool catalog: the example's host tools, `nothing`, and 47 realistic
/// script tools with five flags each.
fn prompt_size(api: &Api) {
    let Api { url, token, .. } = api;

    let words = ["ledger", "invoice", "forum", "digest", "deploy", "backup", "metrics", "ticket", "report", "calendar"];
    for i in 0..47 {
        let w = words[i % words.len()];
        api.post(
            "/api/commands",
            json!({
                "type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": format!("{w}-{i}"), "name": format!("{w} {i}"), "runtime": "sh", "content": format!("echo {i}"),
                "description": format!("Summarise the {w} entries of a project"),
                "input": {"type": "object", "required": ["project"], "properties": {
                    "project": {"type": "string", "description": "Project name"},
                    "since": {"type": "string", "description": "ISO date"},
                    "limit": {"type": "integer", "default": 20},
                    "format": {"enum": ["text", "json"]},
                    "includeArchived": {"type": "boolean"}}}
            }),
        );
    }
    let out = Command::new(&*BIN)
        .args(["prompt", "--format", "json"])
        .env("AGENTOS_URL", url)
        .env("AGENTOS_TOKEN", token)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tools = v["tools"].as_array().unwrap().len();
    println!();
    println!(
        "prompt: {tools} tools, {} tokens in all, {:.1} tokens per tool (estimate: characters / 4)",
        v["estimatedTokens"],
        v["tokensPerTool"].as_f64().unwrap()
    );
}
