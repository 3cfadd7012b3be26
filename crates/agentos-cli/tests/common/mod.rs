//! Test support: the real `agentos` binary run as a master on port 0 in a fresh temp folder.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_agentos");

/// `agentos serve` as tests run it: their masters call listeners on this machine, and a master
/// refuses loopback addresses unless told.
const SERVE: &[&str] = &["serve", "--http-allow", "127.0.0.1"];

/// A running master. Killed when dropped.
pub struct Master {
    pub child: Child,
    pub url: String,
    pub data: PathBuf,
    pub token: String,
    extra: Vec<String>,
    listen: String,
    env: Vec<(String, String)>,
}

impl Master {
    pub fn start(data: &Path) -> Master {
        Self::start_with(data, &[])
    }

    pub fn start_with(data: &Path, extra: &[&str]) -> Master {
        Self::start_full(data, "127.0.0.1:0", extra, &[])
    }

    /// The host tools example: an embedded master with the `weather` toolkit.
    pub fn start_example(data: &Path) -> Master {
        Self::start_program(env!("CARGO_BIN_EXE_host-tools-example"), &[], data, "127.0.0.1:0", &[], &[])
    }

    /// A master on a fixed address (restarts keep it, so executors find it again) with extra environment.
    pub fn start_full(data: &Path, listen: &str, extra: &[&str], env: &[(&str, &str)]) -> Master {
        Self::start_program(BIN, SERVE, data, listen, extra, env)
    }

    /// A master whose address space is capped at `kib` KiB (`ulimit -v`), as an operator may.
    pub fn start_address_limited(data: &Path, kib: u64) -> Master {
        let script = format!("ulimit -v {kib} && exec \"$0\" \"$@\"");
        let pre: Vec<&str> = ["-c", &script, BIN].into_iter().chain(SERVE.iter().copied()).collect();
        Self::start_program("/bin/sh", &pre, data, "127.0.0.1:0", &[], &[])
    }

    /// A master whose log (stderr) goes to `log` at debug level, to check what it writes.
    pub fn start_logged(data: &Path, log: &Path, env: &[(&str, &str)]) -> Master {
        let file = std::fs::File::create(log).unwrap();
        Self::start_program_with(BIN, SERVE, data, "127.0.0.1:0", &[], env, Stdio::from(file), "debug")
    }

    /// A master with the default outbound policy: loopback and the rest refused.
    pub fn start_default_policy(data: &Path) -> Master {
        Self::start_default_policy_with(data, &[])
    }

    /// As [`Master::start_default_policy`], with extra arguments.
    pub fn start_default_policy_with(data: &Path, extra: &[&str]) -> Master {
        Self::start_program(BIN, &["serve"], data, "127.0.0.1:0", extra, &[])
    }

    fn start_program(
        bin: &str,
        pre: &[&str],
        data: &Path,
        listen: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Master {
        Self::start_program_with(bin, pre, data, listen, extra, env, Stdio::inherit(), "warn")
    }

    #[allow(clippy::too_many_arguments)]
    fn start_program_with(
        bin: &str,
        pre: &[&str],
        data: &Path,
        listen: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        stderr: Stdio,
        level: &str,
    ) -> Master {
        close_to_others(data);
        // AGENTOS_TEST_STORAGE=shared: every master of a suite keeps its log on PostgreSQL and
        // its blobs on S3, a fresh database and bucket each (kept across its restarts).
        let shared = (bin == BIN
            && std::env::var("AGENTOS_TEST_STORAGE").as_deref() == Ok("shared")
            && !extra.contains(&"--database"))
        .then(SharedStorage::fresh);
        let mut extra: Vec<&str> = extra.to_vec();
        let mut env: Vec<(&str, &str)> = env.to_vec();
        if let Some(s) = &shared {
            extra.extend(["--database", &s.database, "--blobs", &s.blobs]);
            env.extend(S3_ENV);
        }
        let (extra, env) = (&extra[..], &env[..]);
        let mut cmd = Command::new(bin);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .args(pre)
            .args(["--listen", listen, "--data"])
            .arg(data)
            .args(extra)
            .env("AGENTOS_LOG", level)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn agentos serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().expect("the master printed nothing").expect("read stdout");
        let url = first
            .strip_prefix("agentos master listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .to_string();
        // Keep draining stdout so the master never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let token = std::fs::read_to_string(data.join("operator.token")).expect("operator token").trim().to_string();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Master {
            child,
            url,
            data: data.to_path_buf(),
            token,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            listen: listen.to_string(),
            env,
        }
    }

    /// Where the file of a blob (`namespace`, `sha256`) is: in the data folder's `blobs`, or
    /// in the S3 server's folder for the master's bucket (`--blobs s3://BUCKET/PREFIX`).
    pub fn blob_file(&self, namespace: &str, sha256: &str) -> PathBuf {
        let root = match self.extra.iter().position(|a| a == "--blobs") {
            Some(i) => {
                let url = self.extra[i + 1].strip_prefix("s3://").expect("an s3:// URL");
                Path::new(&script_lines("s3-env")[1]).join(url)
            }
            None => self.data.join("blobs"),
        };
        root.join(namespace).join(&sha256[..2]).join(sha256)
    }

    /// SIGKILL: no chance to flush or snapshot.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn terminate(&mut self) {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "master exited with {status}");
    }

    /// Kill -9, then start again on the same data folder and address.
    pub fn restart(mut self) -> Master {
        self.kill9();
        let extra: Vec<String> = self.extra.clone();
        let refs: Vec<&str> = extra.iter().map(String::as_str).collect();
        let env: Vec<(String, String)> = self.env.clone();
        let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let listen = if self.listen.ends_with(":0") {
            self.listen.clone()
        } else {
            self.url.trim_start_matches("http://").to_string()
        };
        Master::start_full(&self.data.clone(), &listen, &refs, &env_refs)
    }

    pub fn client(&self) -> Api {
        Api { url: self.url.clone(), token: Some(self.token.clone()), http: http() }
    }
}

/// A master refuses a data folder that group or others may enter, or that holds a file they
/// may read. Many tests hand their temp folder (made with the umask's 0755) over as the data
/// folder, some with their own files in it, as an operator would after `chmod -R go-rwx`.
fn close_to_others(data: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(data) else { return };
    if meta.is_dir() {
        for entry in std::fs::read_dir(data).unwrap() {
            close_to_others(&entry.unwrap().path());
        }
    }
    if !meta.file_type().is_symlink() {
        let mode = meta.permissions().mode() & 0o700;
        std::fs::set_permissions(data, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap()
}

/// A thin API client that returns (status, JSON body).
#[derive(Clone)]
pub struct Api {
    pub url: String,
    pub token: Option<String>,
    pub http: reqwest::blocking::Client,
}

impl Api {
    pub fn with_token(&self, token: Option<&str>) -> Api {
        Api { url: self.url.clone(), token: token.map(str::to_string), http: self.http.clone() }
    }

    fn send(&self, req: reqwest::blocking::RequestBuilder) -> (u16, Value) {
        let req = match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let resp = req.send().expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.http.get(format!("{}{}", self.url, path)))
    }

    pub fn get_bytes(&self, path: &str) -> (u16, Vec<u8>) {
        let mut req = self.http.get(format!("{}{}", self.url, path));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().expect("request");
        (resp.status().as_u16(), resp.bytes().unwrap().to_vec())
    }

    pub fn command(&self, body: Value) -> (u16, Value) {
        self.send(self.http.post(format!("{}/api/commands", self.url)).json(&body))
    }

    pub fn post_raw(&self, path: &str, body: Vec<u8>) -> (u16, Value) {
        self.send(self.http.post(format!("{}{}", self.url, path)).header("content-type", "application/json").body(body))
    }

    pub fn register(&self, id: &str, runtime: &str, content: &str, model: Option<&str>) -> (u16, Value) {
        let mut body = serde_json::json!({
            "type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": id, "name": id, "runtime": runtime, "content": content,
        });
        if let Some(m) = model {
            body["model"] = Value::from(m);
        }
        self.command(body)
    }
}

pub fn sha256_hex(b: &[u8]) -> String {
    agentos_core::sha256_hex(b)
}

/// Asserts a status and the error shape, and returns the error code.
pub fn error_code(resp: &(u16, Value), status: u16) -> String {
    assert_eq!(resp.0, status, "unexpected answer {resp:?}");
    let code =
        resp.1.pointer("/error/code").and_then(Value::as_str).unwrap_or_else(|| panic!("no error code in {resp:?}"));
    let message = resp.1.pointer("/error/message").and_then(Value::as_str).unwrap_or("");
    assert!(!message.is_empty(), "empty error message in {resp:?}");
    code.to_string()
}

/// A running `agentos executor`. Killed when dropped.
pub struct Executor {
    pub child: Child,
    pub workspace: PathBuf,
}

impl Executor {
    pub fn start(master: &Master, workspace: &Path, name: &str, extra_env: &[(&str, &str)]) -> Executor {
        Self::start_args(master, workspace, name, extra_env, &[])
    }

    /// Like `start`, with extra `agentos executor` arguments.
    pub fn start_args(
        master: &Master,
        workspace: &Path,
        name: &str,
        extra_env: &[(&str, &str)],
        extra_args: &[&str],
    ) -> Executor {
        let token = Self::credential(master, name);
        let exec = Self::spawn(master, workspace, &token, extra_env, extra_args);
        exec.wait_until_polling(master, name);
        exec
    }

    /// A new credential for executor `name` (one made before under that name stops working).
    pub fn credential(master: &Master, name: &str) -> String {
        let (status, body) = master
            .client()
            .post_raw("/api/executor-tokens", serde_json::json!({"name": name}).to_string().into_bytes());
        assert_eq!(status, 200, "{body}");
        body["token"].as_str().unwrap().to_string()
    }

    /// Starts a process with `token` and does not wait for it: several processes may share
    /// one credential, and so one name, which the list of executors shows once.
    pub fn spawn(
        master: &Master,
        workspace: &Path,
        token: &str,
        extra_env: &[(&str, &str)],
        extra_args: &[&str],
    ) -> Executor {
        // Run as root, the executor runs scripts as nobody, who must be able to enter the
        // test's private temp folder.
        use std::os::unix::fs::PermissionsExt;
        let parent = workspace.parent().unwrap();
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg("executor");
        // Several masters may be given instead (`--master A,B`).
        if !extra_args.contains(&"--master") {
            cmd.args(["--master", &master.url]);
        }
        cmd.arg("--workspace")
            .arg(workspace)
            .args(["--grace-ms", "10000"])
            .args(extra_args)
            .env("AGENTOS_EXECUTOR_TOKEN", token)
            .env("AGENTOS_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let (start, end) = own_sealed_uids();
            cmd.env("AGENTOS_SEALED_UIDS", format!("{start}-{end}"));
        }
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn agentos executor");
        Executor { child, workspace: workspace.to_path_buf() }
    }

    /// Waits (bounded) until the master lists this executor as polling.
    pub fn wait_until_polling(&self, master: &Master, name: &str) {
        wait_for(&format!("executor {name} polling"), || {
            let (_, list) = master.client().get("/api/executors");
            list.as_array().is_some_and(|l| l.iter().any(|e| e["name"] == name && e["state"] == "polling"))
        });
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        self.child.wait().expect("wait")
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sealed uids no other executor uses: each executor kills whatever runs under its sealed uids
/// (at start, and after each sealed job), and tests run in parallel on one machine. A test
/// process holds a block of 32 uids (a lock on a file named after it, released when the process
/// ends) and gives each executor it starts four of them; all below 61000 (the default range)
/// and 65534 (user namespaces may map no more).
pub fn own_sealed_uids() -> (u32, u32) {
    use std::os::unix::io::AsRawFd;
    static BLOCK: std::sync::OnceLock<(u32, std::fs::File)> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let (block, _lock) = BLOCK.get_or_init(|| {
        let dir = std::env::temp_dir().join("agentos-test-sealed-uids");
        std::fs::create_dir_all(&dir).unwrap();
        (0..1250)
            .find_map(|b| {
                let f = std::fs::File::create(dir.join(b.to_string())).ok()?;
                // SAFETY: flock on a descriptor this function owns.
                let locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
                locked.then_some((b, f))
            })
            .expect("a free block of sealed uids")
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 8;
    let start = 20_000 + block * 32 + n * 4;
    (start, start + 3)
}

/// Polls `cond` every 20 ms for up to 20 s: for conditions another process brings about.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Api {
    pub fn invoke(&self, id: &str, body: Value) -> (u16, Value) {
        self.send(self.http.post(format!("{}/api/tools/{id}/invoke", self.url)).json(&body))
    }

    /// Invokes a tool with `Prefer: respond-async` and answers the id of the job it queued.
    pub fn invoke_async(&self, id: &str, body: Value) -> String {
        let req = self.http.post(format!("{}/api/tools/{id}/invoke", self.url)).header("Prefer", "respond-async");
        let (status, v) = self.send(req.json(&body));
        assert_eq!(status, 202, "{v}");
        v["jobId"].as_str().expect("a job id").to_string()
    }
}

/// A loopback port free right now, for a master that must keep its address across restarts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Api {
    pub fn put(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(self.http.put(format!("{}{}", self.url, path)).json(&body))
    }

    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(self.http.post(format!("{}{}", self.url, path)).json(&body))
    }

    /// The data of every token in a place.
    pub fn token_data(&self, model: &str, place: &str) -> Vec<Value> {
        let (status, v) = self.get(&format!("/api/models/{model}/places/{place}/tokens"));
        assert_eq!(status, 200, "{v}");
        v.as_array().unwrap().iter().map(|t| t["data"].clone()).collect()
    }
}

impl Api {
    /// Creates an agent with `flags` and answers a client holding its token.
    pub fn agent(&self, name: &str, flags: &str) -> Api {
        let (status, v) = self.post("/api/agents", serde_json::json!({"name": name, "flags": flags}));
        assert_eq!(status, 200, "{v}");
        self.with_token(v["token"].as_str())
    }

    pub fn request(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.http.request(m, format!("{}{}", self.url, path));
        if let Some(b) = body {
            req = req.json(&b);
        }
        self.send(req)
    }
}

/// A loopback port that listens and never answers: whether anything connected to it tells
/// whether the master contacted it.
pub struct Watched {
    listener: std::net::TcpListener,
    pub origin: String,
}

impl Watched {
    pub fn start() -> Watched {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        Watched { listener, origin }
    }

    /// Whether a connection has come in since the start.
    pub fn contacted(&self) -> bool {
        self.listener.accept().is_ok()
    }
}

/// What a command run by a test printed, and its exit code.
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// Standard output as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {} / {}", self.stdout, self.stderr))
    }
}

/// `program` run against `m` with `token` and nothing else of the test's environment but
/// `PATH`, as an agent given only its token would run it; `stdin` fed in, or closed.
pub fn run_as(m: &Master, token: &str, program: &Path, args: &[&str], stdin: Option<&str>) -> Out {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AGENTOS_URL", &m.url)
        .env("AGENTOS_TOKEN", token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// [`run_as`] with standard input closed.
pub fn run(m: &Master, token: &str, program: &Path, args: &[&str]) -> Out {
    run_as(m, token, program, args, None)
}

/// The shims of every toolkit `token` sees, installed into `dir`.
pub fn install_shims(m: &Master, token: &str, dir: &Path) {
    let out = run_as(m, token, Path::new(BIN), &["install-shims", "--dir", dir.to_str().unwrap()], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
}

/// The key, region and endpoint of the S3 server `scripts/s3-env` starts.
pub const S3_ENV: [(&str, &str); 5] = [
    ("AWS_ACCESS_KEY_ID", "agentos-test"),
    ("AWS_SECRET_ACCESS_KEY", "agentos-test-secret"),
    ("AWS_REGION", "us-east-1"),
    ("AWS_ENDPOINT_URL", "http://127.0.0.1:59000"),
    ("AWS_ALLOW_HTTP", "true"),
];

/// A fresh PostgreSQL database and S3 bucket, on the servers `scripts/pg-env` and
/// `scripts/s3-env` start (when they are not running yet).
pub struct SharedStorage {
    /// `postgres://…/agentos_t_…`.
    pub database: String,
    /// `s3://agentos-t-…/blobs`.
    pub blobs: String,
    /// The bucket's folder on the S3 server, to look at (or damage) what it stores.
    pub bucket_dir: PathBuf,
}

fn script_lines(name: &str) -> Vec<String> {
    let script = format!("{}/../../scripts/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&script).output().unwrap_or_else(|e| panic!("{script}: {e}"));
    assert!(out.status.success(), "scripts/{name} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

impl SharedStorage {
    pub fn fresh() -> SharedStorage {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stamp = format!("{:?}-{}-{n}", std::time::SystemTime::now(), std::process::id());
        let name = format!("agentos_t_{}", &sha256_hex(stamp.as_bytes())[..16]);
        let server = script_lines("pg-env").remove(0);
        let out =
            Command::new("psql").args([&server, "-qXc", &format!("CREATE DATABASE {name}")]).output().expect("psql");
        assert!(out.status.success(), "creating a database: {}", String::from_utf8_lossy(&out.stderr));
        let database = format!("{}/{name}", server.rsplit_once('/').unwrap().0);
        let s3 = script_lines("s3-env");
        let bucket = name.replace('_', "-");
        let bucket_dir = Path::new(&s3[1]).join(&bucket);
        std::fs::create_dir_all(&bucket_dir).unwrap();
        SharedStorage { database, blobs: format!("s3://{bucket}/blobs"), bucket_dir }
    }
}

/// How [`proxy_losing_one_answer`] loses the answer.
#[derive(Clone, Copy, Debug)]
pub enum Lose {
    /// The connection closes before the answer reaches the client.
    Connection,
    /// The client gets a gateway's 502 in its place, as from a proxy whose upstream dropped.
    BadGateway,
    /// Not an answer: the request itself reaches the master with `"exitCode":0` in its body
    /// made `-1`, a status no process has, which the master refuses.
    SpoiledRequest,
}

/// Forwards HTTP/1.1 connections from a port of its own to `upstream`, one exchange at a time,
/// and loses the first 200 answer to a request whose target contains `lose`, as `how` says: the
/// master handles that request in full, and its answer never reaches the executor. A fake
/// proxy, for an answer lost on the way back, which nothing else on one machine produces on
/// demand.
pub fn proxy_losing_one_answer(upstream: &str, lose: &'static str, how: Lose) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    /// One message's head and body: the head up to its empty line, the body by its length.
    fn message(r: &mut BufReader<TcpStream>, no_body: bool) -> Option<(String, Vec<u8>)> {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).ok()? == 0 {
                return None;
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        let length = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
            .unwrap_or(0);
        let mut body = vec![0; if no_body { 0 } else { length }];
        r.read_exact(&mut body).ok()?;
        Some((head, body))
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let upstream = upstream.trim_start_matches("http://").to_string();
    let lost = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let (Ok(client), upstream, lost) = (client, upstream.clone(), lost.clone()) else { continue };
            std::thread::spawn(move || {
                let master = TcpStream::connect(&upstream).unwrap();
                let (mut to_client, mut to_master) = (client.try_clone().unwrap(), master.try_clone().unwrap());
                let (mut from_client, mut from_master) = (BufReader::new(client), BufReader::new(master));
                while let Some((mut head, mut body)) = message(&mut from_client, false) {
                    let target = head.split_whitespace().nth(1).unwrap_or_default().to_string();
                    let spoiled = matches!(how, Lose::SpoiledRequest)
                        .then(|| String::from_utf8_lossy(&body).replacen("\"exitCode\":0", "\"exitCode\":-1", 1))
                        .filter(|s| s.len() != body.len() && target.contains(lose));
                    if let Some(spoiled) = spoiled
                        && !lost.swap(true, Ordering::SeqCst)
                    {
                        let length = format!("content-length: {}", spoiled.len());
                        head = head
                            .lines()
                            .map(|l| if l.to_ascii_lowercase().starts_with("content-length:") { &length } else { l })
                            .collect::<Vec<_>>()
                            .join("\r\n")
                            + "\r\n";
                        body = spoiled.into_bytes();
                    }
                    to_master.write_all(head.as_bytes()).and_then(|_| to_master.write_all(&body)).unwrap();
                    let Some((answer, answer_body)) = message(&mut from_master, head.starts_with("HEAD")) else {
                        return;
                    };
                    if !matches!(how, Lose::SpoiledRequest)
                        && target.contains(lose)
                        && answer.starts_with("HTTP/1.1 200")
                        && !lost.swap(true, Ordering::SeqCst)
                    {
                        if let Lose::BadGateway = how {
                            let gateway = "HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                            let _ = to_client.write_all(gateway.as_bytes());
                        }
                        let _ = to_client.shutdown(std::net::Shutdown::Both);
                        return;
                    }
                    if to_client.write_all(answer.as_bytes()).and_then(|_| to_client.write_all(&answer_body)).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}
