//! Bench support: the real release binaries run as a master and as executors on loopback.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The `agentos` binary under test: this build's, or the one `AGENTOS_BENCH_BIN` names (to run
/// the same bench against another build of the program, side by side).
pub static BIN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    std::env::var("AGENTOS_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_agentos").to_string())
});

/// Kills the process when dropped, so no run leaves one behind.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The operator's view of a master.
pub struct Api {
    pub url: String,
    pub token: String,
    pub http: reqwest::blocking::Client,
}

impl Api {
    /// Answers the JSON body; any status but a success stops the bench.
    pub fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.url)).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().unwrap();
        let status = resp.status();
        let v: Value = resp.json().unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {v}");
        v
    }

    pub fn get(&self, path: &str) -> Value {
        self.call(reqwest::Method::GET, path, None)
    }

    pub fn post(&self, path: &str, body: Value) -> Value {
        self.call(reqwest::Method::POST, path, Some(body))
    }

    /// Registers a script tool in the global catalog.
    pub fn register_script(&self, id: &str, runtime: &str, content: &str) {
        let r = self.post(
            "/api/commands",
            json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": id, "name": id, "runtime": runtime, "content": content}),
        );
        assert_eq!(r["status"], "approved", "{r}");
    }
}

/// `agentos serve` on a free port with its data in `data`.
pub fn start_master(data: &Path) -> (Proc, Api) {
    start_program(&BIN, &["serve"], data)
}

/// `agentos serve ARGS..` on a free port with its data in `data`.
pub fn start_master_with(args: &[&str], data: &Path) -> (Proc, Api) {
    let mut all = vec!["serve"];
    all.extend_from_slice(args);
    start_program(&BIN, &all, data)
}

/// `agentos up --run-as current` on a free port with its data in `data`: a master with its own
/// executor in its process, on the direct link. Ready once that executor polls.
pub fn start_up(data: &Path) -> (Proc, Api) {
    let (up, api) = start_program(&BIN, &["up", "--run-as", "current"], data);
    wait_until("the local executor polling", Duration::from_secs(10), || {
        api.get("/api/executors").as_array().unwrap().iter().any(|e| e["name"] == "local" && e["state"] == "polling")
    });
    (up, api)
}

/// A loopback HTTP/1.1 server answering every request with the same JSON body, keeping
/// connections alive: the far side of an HTTP tool, as cheap as it can be.
pub struct StaticServer {
    pub url: String,
}

impl StaticServer {
    pub fn start(body: &'static [u8]) -> StaticServer {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                std::thread::spawn(move || {
                    let _ = conn.set_nodelay(true);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        // One answer per request head; requests here carry no body.
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            if conn.write_all(head.as_bytes()).and_then(|_| conn.write_all(body)).is_err() {
                                return;
                            }
                        }
                        match conn.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        StaticServer { url }
    }
}

/// A master program (`agentos serve`, or an embedding such as the host tools example) run as
/// `program args.. --listen 127.0.0.1:0 --data DATA`; ready once it prints its URL.
pub fn start_program(program: &str, args: &[&str], data: &Path) -> (Proc, Api) {
    start_program_env(program, args, data, &[])
}

/// [`start_program`] with `env` added to the master's environment.
pub fn start_program_env(program: &str, args: &[&str], data: &Path, env: &[(&str, &str)]) -> (Proc, Api) {
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .args(["--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .env("AGENTOS_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn master");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = lines.next().unwrap().unwrap().rsplit(' ').next().unwrap().to_string();
    std::thread::spawn(move || for _ in lines {});
    let token = std::fs::read_to_string(data.join("operator.token")).unwrap().trim().to_string();
    let http = reqwest::blocking::Client::builder().tcp_nodelay(true).build().unwrap();
    (Proc(child), Api { url, token, http })
}

/// An executor named `name` running `concurrency` jobs at once; ready once the master lists it
/// as polling.
pub fn start_executor(api: &Api, ws: &Path, name: &str, concurrency: usize) -> Proc {
    let t = api.post("/api/executor-tokens", json!({"name": name}));
    let child = Command::new(&*BIN)
        .args(["executor", "--master", &api.url, "--workspace"])
        .arg(ws)
        .args(["--run-as", "current", "--concurrency", &concurrency.to_string()])
        .env("AGENTOS_EXECUTOR_TOKEN", t["token"].as_str().unwrap())
        .env("AGENTOS_LOG", "warn")
        .spawn()
        .expect("spawn executor");
    wait_until(&format!("executor {name} polling"), Duration::from_secs(10), || {
        api.get("/api/executors").as_array().unwrap().iter().any(|e| e["name"] == name && e["state"] == "polling")
    });
    Proc(child)
}

pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The `p` quantile (0 to 1) of sorted figures.
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
