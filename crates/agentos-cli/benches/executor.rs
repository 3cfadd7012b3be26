//! Executor benchmark: per-task overhead of a script job through master and executor, job
//! throughput with two executors, and sha256 verification speed, each beside its baseline.
//! Prints figures; asserts nothing. Run: `cargo bench -p agentos-cli --bench executor`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Instant;

use base64::Engine as _;
use serde_json::Value;

mod common;

use common::{Api, ms, start_executor, start_master};

/// A caller on one kept-alive HTTP/1.1 connection, written out by hand: a lean client, so that
/// the figures are those of the master and executors rather than of the benchmark's own client
/// (a blocking reqwest client costs about 0.1 ms of CPU per request, in a thread of its own).
struct Caller {
    conn: BufReader<TcpStream>,
    head: String,
}

impl Caller {
    fn new(url: &str, token: &str, tool: &str) -> Caller {
        let addr = url.trim_start_matches("http://");
        let stream = TcpStream::connect(addr).expect("connect to the master");
        stream.set_nodelay(true).unwrap();
        let head = format!(
            "POST /api/tools/{tool}/invoke HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}"
        );
        Caller { conn: BufReader::new(stream), head }
    }

    /// Invokes the tool once and checks that it exited 0.
    fn invoke(&mut self) {
        self.conn.get_mut().write_all(self.head.as_bytes()).unwrap();
        let mut line = String::new();
        self.conn.read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 200"), "{line}");
        let mut length = None;
        loop {
            line.clear();
            self.conn.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse::<usize>().ok();
            }
        }
        let mut body = vec![0u8; length.expect("a content-length")];
        self.conn.read_exact(&mut body).unwrap();
        let r: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(r["exitCode"], 0, "{r}");
    }
}

/// CPU seconds (user + system) a process has used so far.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum());
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// (busy, all) CPU seconds of the whole machine so far, from /proc/stat.
fn machine_cpu_secs() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> =
        stat.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let all: f64 = ticks.iter().sum();
    let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ((all - idle) / hz, all / hz)
}

/// Busy CPU milliseconds of the whole machine per job, over `run`.
fn machine_ms_per_job(jobs: usize, run: impl FnOnce()) -> f64 {
    let before = machine_cpu_secs().0;
    run();
    (machine_cpu_secs().0 - before) * 1000.0 / jobs as f64
}

fn self_cpu_secs() -> f64 {
    cpu_secs(std::process::id())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Best of five rounds of `n` sequential calls, and of `n` bare `sh -c 'exit 0'` spawns taken in
/// turns with them, in ms per task: a stray hiccup of the machine does not decide the figure.
fn sequential(caller: &mut Caller, n: usize) -> (f64, f64) {
    let (mut best_through, mut best_bare) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..n {
            caller.invoke();
        }
        best_through = best_through.min(ms(t.elapsed()) / n as f64);
        let t = Instant::now();
        for _ in 0..n {
            assert!(Command::new("sh").args(["-c", "exit 0"]).status().unwrap().success());
        }
        best_bare = best_bare.min(ms(t.elapsed()) / n as f64);
    }
    (best_through, best_bare)
}

/// `jobs` calls of `exit0` from `callers` threads, each on its own connection and waiting for its
/// answer before it calls again.
fn drive(url: &str, token: &str, callers: usize, jobs: usize) {
    let handles: Vec<_> = (0..callers)
        .map(|_| {
            let mut caller = Caller::new(url, token, "exit0");
            std::thread::spawn(move || {
                for _ in 0..jobs / callers {
                    caller.invoke();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// `xargs -P2` spawning `jobs` bare `sh -c 'exit 0'`: the throughput baseline.
fn xargs(jobs: usize) {
    let script = format!("seq {jobs} | xargs -P2 -I{{}} sh -c 'exit 0'");
    assert!(Command::new("sh").args(["-c", &script]).status().unwrap().success());
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let (_master, api) = start_master(&dir.path().join("master"));
    api.register_script("exit0", "sh", "exit 0");
    let Api { url, token, .. } = &api;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    println!("executor benchmark: {cores} cores, release build, loopback");

    // (a) 40 sequential jobs through master and one executor against 40 bare spawns.
    let e1 = start_executor(&api, &dir.path().join("e1"), "e1", 1);
    let mut caller = Caller::new(url, token, "exit0");
    for _ in 0..10 {
        caller.invoke();
    }
    let n = 40;
    let (best_master, best_bare) = sequential(&mut caller, n);
    println!();
    println!("(a) {n} sequential `exit 0` sh jobs (best of 5 rounds)");
    println!("    through master + executor : {best_master:>7.3} ms per task");
    println!("    bare sh -c 'exit 0' spawn : {best_bare:>7.3} ms per task");
    println!(
        "    overhead per task         : {:>7.3} ms   (goal < 0.4 ms; Windmill default 86 ms, dedicated 9.8 ms; Temporal ~19 ms)",
        best_master - best_bare
    );
    let best_master_bare = best_bare;

    // (b) throughput with two executors against xargs -P2.
    // AGENTOS_BENCH_SLOTS runs each executor with that many slots from here on (1 by default, as
    // `xargs -P2` runs two at a time).
    let slots: usize = std::env::var("AGENTOS_BENCH_SLOTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let e1 = if slots == 1 {
        e1
    } else {
        drop(e1);
        start_executor(&api, &dir.path().join("e1b"), "e1b", slots)
    };
    let e2 = start_executor(&api, &dir.path().join("e2"), "e2", slots);
    // AGENTOS_BENCH_JOBS lengthens the run, for profiling.
    let jobs: usize = std::env::var("AGENTOS_BENCH_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(400);
    // xargs always has its next spawn ready; the like for the executors is a queue that is never
    // empty, which 8 callers keep so (each waits for its result before it asks again). 4 callers
    // leave the executors idle at moments, waiting for work: that figure is shown as well.
    let (light, saturated) = (4usize, 8usize);
    let pids = [("master", _master.0.id()), ("executor e1", e1.0.id()), ("executor e2", e2.0.id())];
    let before: Vec<f64> = pids.iter().map(|(_, p)| cpu_secs(*p)).collect();
    let self_before = self_cpu_secs();
    let mut rates: [Vec<f64>; 3] = Default::default();
    let mut busy = [0.0f64; 3];
    let mut ratios: [Vec<f64>; 2] = Default::default();
    // Rounds taken in turns, so that no side gets the quieter moments of the machine; medians
    // are reported, and each ratio is the median of the rounds' ratios.
    let rounds = 5;
    let through_us = |callers: usize| drive(url, token, callers, jobs);
    for _ in 0..rounds {
        for (i, callers) in [light, saturated].into_iter().enumerate() {
            let t = Instant::now();
            busy[i] += machine_ms_per_job(jobs, || through_us(callers)) / rounds as f64;
            rates[i].push(jobs as f64 / t.elapsed().as_secs_f64());
        }
        let t = Instant::now();
        busy[2] += machine_ms_per_job(jobs, || xargs(jobs)) / rounds as f64;
        rates[2].push(jobs as f64 / t.elapsed().as_secs_f64());
        let bare = rates[2][rates[2].len() - 1];
        ratios[0].push(rates[0][rates[0].len() - 1] / bare);
        ratios[1].push(rates[1][rates[1].len() - 1] / bare);
    }
    let per_job = |secs: f64| secs * 1000.0 / (jobs * rounds * 2) as f64;
    let cpu: Vec<String> = pids
        .iter()
        .zip(&before)
        .map(|((name, pid), b)| format!("{name} {:.2} ms", per_job(cpu_secs(*pid) - b)))
        .chain([format!("callers {:.2} ms", per_job(self_cpu_secs() - self_before))])
        .collect();
    let [r_light, r_saturated, r_bare] = rates.map(median);
    let [q_light, q_saturated] = ratios.map(median);
    println!();
    println!("(b) {jobs} `exit 0` jobs per round, median of {rounds} rounds (machine CPU: busy ms per job)");
    println!("    master + 2 executors, {saturated} callers : {r_saturated:>6.0} jobs/s   CPU {:.2} ms", busy[1]);
    println!("    master + 2 executors, {light} callers : {r_light:>6.0} jobs/s   CPU {:.2} ms", busy[0]);
    println!("    xargs -P2 bare spawns          : {r_bare:>6.0} jobs/s   CPU {:.2} ms", busy[2]);
    println!(
        "    ratio                          : {:>6.0} %        (goal >= 90 %; {:.0} % with {light} callers)",
        q_saturated * 100.0,
        q_light * 100.0
    );
    println!("    CPU per job, by process        : {} (children of executors not counted)", cpu.join(", "));
    drop(e2);

    // (a2) (a) again with ten secrets in the store: every result is scrubbed of each of them.
    for k in 0..10 {
        api.call(
            reqwest::Method::PUT,
            &format!("/api/secrets/BENCH_KEY_{k}"),
            Some(serde_json::json!({"value": format!("sk-bench-{k}-aZ09xYqweRTy12345678")})),
        );
    }
    for _ in 0..10 {
        caller.invoke();
    }
    let (best_secrets, best_bare) = sequential(&mut caller, n);
    println!();
    println!("(a2) (a) with 10 secrets in the store, each scrubbed from every result (best of 5 rounds)");
    println!("    through master + executor : {best_secrets:>7.3} ms per task");
    println!("    bare sh -c 'exit 0' spawn : {best_bare:>7.3} ms per task");
    println!(
        "    overhead per task         : {:>7.3} ms   ({:+.3} ms against (a)'s overhead)",
        best_secrets - best_bare,
        (best_secrets - best_bare) - (best_master - best_master_bare)
    );
    drop(e1);

    // (a3) (a) through `agentos up`, whose own executor runs in the master's process.
    let up_data = dir.path().join("up");
    let (up, up_api) = common::start_up(&up_data);
    up_api.register_script("exit0", "sh", "exit 0");
    let mut up_caller = Caller::new(&up_api.url, &up_api.token, "exit0");
    for _ in 0..10 {
        up_caller.invoke();
    }
    let (best_up, best_bare) = sequential(&mut up_caller, n);
    println!();
    println!("(a3) (a) through `agentos up`'s own executor, in the master's process (best of 5 rounds)");
    println!("    through agentos up        : {best_up:>7.3} ms per task");
    println!("    bare sh -c 'exit 0' spawn : {best_bare:>7.3} ms per task");
    println!(
        "    overhead per task         : {:>7.3} ms   ({:+.3} ms against (a)'s overhead)",
        best_up - best_bare,
        (best_up - best_bare) - (best_master - best_master_bare)
    );

    // (b3) (b) through `agentos up` on its defaults: one process, its executor's two slots.
    let up_before = cpu_secs(up.0.id());
    let (mut up_rates, mut bare_rates, mut up_ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        drive(&up_api.url, &up_api.token, saturated, jobs);
        up_rates.push(jobs as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        xargs(jobs);
        bare_rates.push(jobs as f64 / t.elapsed().as_secs_f64());
        up_ratios.push(up_rates[up_rates.len() - 1] / bare_rates[bare_rates.len() - 1]);
    }
    let up_cpu = (cpu_secs(up.0.id()) - up_before) * 1000.0 / (jobs * rounds) as f64;
    println!();
    println!(
        "(b3) (b) through `agentos up` (its executor's 2 slots), {jobs} jobs per round, median of {rounds} rounds"
    );
    println!(
        "    agentos up, {saturated} callers         : {:>6.0} jobs/s   CPU of its process {up_cpu:.2} ms per job",
        median(up_rates)
    );
    println!("    xargs -P2 bare spawns          : {:>6.0} jobs/s", median(bare_rates));
    println!("    ratio                          : {:>6.0} %", median(up_ratios) * 100.0);
    drop(up);

    // (c) sha256 verification of a 1 MiB script against openssl.
    let mut script = vec![0u8; 1024 * 1024];
    let mut x: u64 = 0x9E3779B97F4A7C15;
    for b in script.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let pinned = agentos_core::sha256_hex(&script);
    let encoded = base64::engine::general_purpose::STANDARD.encode(&script);
    let rounds = 200;
    let t = Instant::now();
    for _ in 0..rounds {
        assert_eq!(agentos_core::sha256_hex(std::hint::black_box(&script)), pinned);
    }
    let hash_ms = ms(t.elapsed()) / rounds as f64;
    let t = Instant::now();
    for _ in 0..rounds {
        let bytes = base64::engine::general_purpose::STANDARD.decode(std::hint::black_box(&encoded)).unwrap();
        assert_eq!(agentos_core::sha256_hex(&bytes), pinned);
    }
    let verify_ms = ms(t.elapsed()) / rounds as f64;
    let file = dir.path().join("script.bin");
    std::fs::write(&file, &script).unwrap();
    let mut openssl_dgst = f64::NAN;
    let mut openssl_speed = f64::NAN;
    if Command::new("openssl").arg("version").output().is_ok_and(|o| o.status.success()) {
        let t = Instant::now();
        for _ in 0..20 {
            let o = Command::new("openssl").args(["dgst", "-sha256"]).arg(&file).output().unwrap();
            assert!(String::from_utf8_lossy(&o.stdout).contains(&pinned));
        }
        openssl_dgst = ms(t.elapsed()) / 20.0;
        // `openssl speed` reports pure hashing throughput, without process start.
        let o = Command::new("openssl")
            .args(["speed", "-bytes", "1048576", "-seconds", "2", "sha256"])
            .stderr(Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        let line = text.lines().rev().find(|l| l.starts_with("sha256"));
        if let Some(k) =
            line.and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.trim_end_matches('k').parse::<f64>().ok())
        {
            // kB/s of 1000 bytes: time for one MiB.
            openssl_speed = 1048576.0 / (k * 1000.0) * 1000.0;
        }
    }
    println!();
    println!("(c) sha256 of a 1 MiB script");
    println!("    agentos sha256 (in process)         : {hash_ms:>7.3} ms   ({:.0} MB/s)", 1.048576 / hash_ms * 1000.0);
    println!("    agentos executor verify (b64+sha256): {verify_ms:>7.3} ms");
    println!(
        "    openssl speed sha256 (1 MiB blocks) : {openssl_speed:>7.3} ms   ({:.0} MB/s)",
        1.048576 / openssl_speed * 1000.0
    );
    println!("    openssl dgst -sha256 (whole process): {openssl_dgst:>7.3} ms");
    println!("    agentos vs openssl speed            : {:>7.0} %     (goal >= 90 %)", openssl_speed / hash_ms * 100.0);
}
