//! Catalog benchmark: drives the real `agentos` binary over loopback HTTP and prints its registration rate, search and get latency, memory and restart time.
//!
//! Run with `cargo bench -p agentos-cli --bench catalog`; `AGENTOS_BENCH_ENTRIES` sets the
//! catalog size (default 100000). It prints figures beside the goals and never fails on speed:
//! timings depend on the machine, so only correctness (every entry survives a restart) is checked.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serde_json::{Value, json};

/// Passed to the master explicitly so the SIGKILL restart replays a known worst-case log tail.
const SNAPSHOT_EVERY: usize = 10_000;
const CLIENT_THREADS: usize = 16;
const SEARCH_REQUESTS: usize = 2_000;
const GET_REQUESTS: usize = 5_000;
/// Requests before each timed series, so connection set-up and first-touch costs are not counted.
const WARMUP: usize = 50;
/// Every 10th entry goes to one of these local models, so local-first search is exercised.
const TEAMS: usize = 5;
const SEARCH_P99_GOAL_MS: f64 = 5.0;
const RESTART_GOAL: Duration = Duration::from_secs(2);
/// Generous: a restart that has not answered by then is broken, not slow.
const START_TIMEOUT: Duration = Duration::from_secs(300);

/// Description words: a verb and a noun per entry, so `q=<noun>` matches about a tenth of the catalog.
const VERBS: [&str; 8] =
    ["fetches", "parses", "summarizes", "archives", "translates", "validates", "renders", "notifies"];
const NOUNS: [&str; 10] =
    ["invoice", "weather", "forum", "ticket", "metric", "calendar", "ledger", "sitemap", "digest", "inventory"];

fn main() {
    let n: usize = match std::env::var("AGENTOS_BENCH_ENTRIES") {
        Ok(v) => v.trim().parse().expect("AGENTOS_BENCH_ENTRIES must be a whole number"),
        Err(_) => 100_000,
    };
    // The selective query needs a decade of ids above 10; smaller catalogs measure nothing anyway.
    assert!(n >= 100, "AGENTOS_BENCH_ENTRIES must be at least 100");
    println!(
        "environment: {} cores (nproc), {n} entries, {CLIENT_THREADS} registration threads, snapshot every {SNAPSHOT_EVERY} events, binary {}",
        cores(),
        common::BIN.as_str()
    );

    // Declared before the master so it is removed only after the master's guard has killed it.
    let data = tempfile::tempdir().expect("temp data folder");
    // A master refuses a data folder others may enter; a temp folder has the umask's mode.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o700)).expect("close the data folder");
    }
    let first = Master::start(data.path());
    println!("cold start (empty data folder): {:.0} ms", ms(first.to_healthz));
    let mut master = first.master;

    println!("\n== 1. registration: {n} script entries, {CLIENT_THREADS} concurrent clients");
    let (wall, lat) = register(&master, n, |i| register_body(i, 0), true);
    let reg = Stats::of(lat);
    let rate = n as f64 / wall.as_secs_f64();
    println!("  {n} entries in {:.1} s = {rate:.0} entries/s", wall.as_secs_f64());
    println!(
        "  latency per registration: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms(reg.p50),
        ms(reg.p99),
        ms(reg.max)
    );
    let seq_loaded = health_seq(&master);
    let counts = verify_counts(&master, n);
    println!("  catalog: {counts}, event log at seq {seq_loaded}");

    println!(
        "\n== 2. search over the full catalog, {SEARCH_REQUESTS} requests per class, one client (goal: filtered p99 < {SEARCH_P99_GOAL_MS} ms)"
    );
    let client = http_client();
    let mut worst_filtered: Option<(String, Duration)> = None;
    println!("  {:<34} {:>8} {:>9} {:>9} {:>9}  goal", "class", "matches", "p50 ms", "p99 ms", "max ms");
    for class in search_classes(n) {
        let (total, s) = measure_search(&client, &master, &class);
        let goal = if class.filtered {
            verdict(ms(s.p99) < SEARCH_P99_GOAL_MS, &format!("p99 < {SEARCH_P99_GOAL_MS} ms"))
        } else {
            "(unfiltered; no goal)".into()
        };
        println!("  {:<34} {total:>8} {:>9.2} {:>9.2} {:>9.2}  {goal}", class.name, ms(s.p50), ms(s.p99), ms(s.max));
        if class.filtered && worst_filtered.as_ref().is_none_or(|(_, w)| s.p99 > *w) {
            worst_filtered = Some((class.name.clone(), s.p99));
        }
    }

    println!("\n== 3. get by id, {GET_REQUESTS} random ids, one client");
    let get = measure_get(&client, &master, n);
    println!("  p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms", ms(get.p50), ms(get.p99), ms(get.max));

    println!("\n== 4. master memory after loading {n} entries (the process that registered them)");
    let mem_loaded = Memory::of(master.pid());
    println!("  {mem_loaded}");

    println!(
        "\n== 4b. a page of 100 tokens of the default model's {CATALOG_PLACE}, {PAGE_REQUESTS} requests, one client"
    );
    for (what, offset) in [("first page", 0), ("last page", n.saturating_sub(n / 10).saturating_sub(100))] {
        let page = measure_page(&client, &master, offset);
        println!("  {what:<11} p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms", ms(page.p50), ms(page.p99), ms(page.max));
    }
    println!("  master memory after the pages: {}", Memory::of(master.pid()));

    println!(
        "\n== 4c. a fire by hand of a map that reads the first token of the default model's {CATALOG_PLACE}, {FIRE_REQUESTS} fires, one client"
    );
    let fire = measure_catalog_fire(&client, &master);
    println!("  p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms", ms(fire.p50), ms(fire.p99), ms(fire.max));
    // The net and its fires are events of their own.
    let seq_loaded = health_seq(&master);

    println!("\n== 5a. restart after SIGTERM (graceful: the master writes a final snapshot)");
    let shutdown = master.stop(libc::SIGTERM);
    println!("  graceful shutdown took {:.0} ms", ms(shutdown));
    let graceful = Master::start(data.path());
    master = graceful.master;
    report_start(&graceful.to_first_line, &graceful.to_healthz);
    let seq_after = health_seq(&master);
    assert_eq!(seq_after, seq_loaded, "the event log lost or gained events across a graceful restart");
    println!("  verified: {}, seq {seq_after}", verify_counts(&master, n));
    let mem_restarted = Memory::of(master.pid());
    println!("  memory of the restarted master: {mem_restarted}");

    println!("\n== 5b. restart after SIGKILL (replay: the last snapshot plus the log tail)");
    // Just under one snapshot interval of updates: the longest tail a crash can leave to replay.
    let tail = SNAPSHOT_EVERY - 1;
    let (tail_wall, _) = register(&master, tail, |j| register_body(j % n, j / n + 1), false);
    println!("  wrote a tail of {tail} updates ({:.0} updates/s), then kill -9", tail as f64 / tail_wall.as_secs_f64());
    let seq_killed = health_seq(&master);
    master.stop(libc::SIGKILL);
    let crashed = Master::start(data.path());
    master = crashed.master;
    report_start(&crashed.to_first_line, &crashed.to_healthz);
    let seq_replayed = health_seq(&master);
    assert_eq!(seq_replayed, seq_killed, "an acknowledged write was lost across kill -9");
    println!(
        "  verified: {}, seq {seq_replayed} ({} events replayed past the snapshot)",
        verify_counts(&master, n),
        seq_killed - seq_after
    );

    drop(master);
    let worst = worst_filtered.expect("at least one filtered class");
    println!("\n== summary ({n} entries, {} cores)", cores());
    let rows = [
        (
            "registration rate",
            format!("{rate:.0} entries/s (p50 {:.2} ms, p99 {:.2} ms)", ms(reg.p50), ms(reg.p99)),
            "none named".to_string(),
        ),
        (
            "filtered search p99 (worst class)",
            format!("{:.2} ms ({})", ms(worst.1), worst.0),
            verdict(ms(worst.1) < SEARCH_P99_GOAL_MS, "< 5 ms"),
        ),
        ("get-by-id p99", format!("{:.2} ms (p50 {:.2} ms)", ms(get.p99), ms(get.p50)), "none named".to_string()),
        (
            "fire reading the catalog, p50",
            format!("{:.2} ms (p99 {:.2} ms)", ms(fire.p50), ms(fire.p99)),
            "none named".to_string(),
        ),
        ("master memory after loading", mem_loaded.to_string(), "none named".to_string()),
        ("master memory after restart", mem_restarted.to_string(), "none named".to_string()),
        (
            "restart after SIGTERM",
            format!("{:.2} s", graceful.to_healthz.as_secs_f64()),
            verdict(graceful.to_healthz < RESTART_GOAL, "< 2 s"),
        ),
        (
            "restart after SIGKILL",
            format!("{:.2} s", crashed.to_healthz.as_secs_f64()),
            verdict(crashed.to_healthz < RESTART_GOAL, "< 2 s"),
        ),
    ];
    for (what, measured, goal) in rows {
        println!("  {what:<34} {measured:<44} {goal}");
    }
}

fn cores() -> usize {
    Command::new("nproc")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(0)
}

fn verdict(met: bool, goal: &str) -> String {
    format!("{goal}: {}", if met { "met" } else { "MISSED" })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn report_start(to_line: &Duration, to_health: &Duration) {
    println!(
        "  spawn -> ready line {:.0} ms, spawn -> /healthz answers {:.0} ms   (goal < {} s: {})",
        ms(*to_line),
        ms(*to_health),
        RESTART_GOAL.as_secs(),
        if *to_health < RESTART_GOAL { "met" } else { "MISSED" }
    );
}

/// splitmix64: deterministic spread of ids without a rand dependency, so runs are comparable.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn model_of(i: usize) -> String {
    if i.is_multiple_of(10) { format!("team-{}", (i / 10) % TEAMS) } else { "default".to_string() }
}

/// The registration of entry `i`; a non-zero `revision` changes the description so it writes a new event.
fn register_body(i: usize, revision: usize) -> Value {
    let mut description =
        format!("{} {} records for scheduled jobs", VERBS[i % VERBS.len()], NOUNS[(i / VERBS.len()) % NOUNS.len()]);
    if revision > 0 {
        description.push_str(&format!(" (revision {revision})"));
    }
    json!({
        "type": "TOOL_CATALOG_REGISTER_SCRIPT",
        "id": format!("tool-{i}"),
        "name": format!("Tool {i}"),
        "runtime": "sh",
        "content": format!("echo {i}"),
        "model": model_of(i),
        "description": description,
        "capabilities": [format!("cap-{}", i % 100), format!("group-{}", i % 7)],
    })
}

fn http_client() -> Client {
    // no_proxy: a proxy from the environment must never sit between the bench and loopback.
    Client::builder().no_proxy().timeout(Duration::from_secs(120)).build().expect("http client")
}

/// The master under test. Dropping it kills the process, so a panic anywhere leaves no orphan.
struct Master {
    child: Child,
    url: String,
    token: String,
}

struct Started {
    master: Master,
    to_first_line: Duration,
    to_healthz: Duration,
}

impl Master {
    /// Spawns the master and times it until it has printed its ready line and answers /healthz.
    fn start(data: &Path) -> Started {
        // Built before the clock starts: only the master's own start-up is timed.
        let probe = http_client();
        let t0 = Instant::now();
        let mut child = Command::new(common::BIN.as_str())
            .arg("serve")
            .arg("--data")
            .arg(data)
            .args(["--listen", "127.0.0.1:0", "--snapshot-every", &SNAPSHOT_EVERY.to_string()])
            .env("AGENTOS_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning the agentos binary");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut master = Master { child, url: String::new(), token: String::new() };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            // Keep reading: a closed pipe would make the master's later prints fail.
            lines.for_each(drop);
        });
        let line =
            rx.recv_timeout(START_TIMEOUT).expect("the master exited or printed no ready line (its stderr is above)");
        let to_first_line = t0.elapsed();
        let url = line
            .strip_prefix("agentos master listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .trim();
        assert!(url.starts_with("http://127.0.0.1:"), "the master must listen on loopback only, got {url}");
        master.url = url.to_string();
        loop {
            match probe.get(format!("{}/healthz", master.url)).send() {
                Ok(r) if r.status().is_success() => break,
                _ if t0.elapsed() > START_TIMEOUT => panic!("/healthz never answered"),
                _ => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        let to_healthz = t0.elapsed();
        master.token = std::fs::read_to_string(data.join("operator.token")).expect("operator.token").trim().to_string();
        Started { master, to_first_line, to_healthz }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `signal` and waits for the process to end; returns how long it took to exit.
    fn stop(&mut self, signal: i32) -> Duration {
        let t0 = Instant::now();
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill({}, {signal}) failed", self.pid());
        self.child.wait().expect("waiting for the master");
        t0.elapsed()
    }

    fn get(&self, client: &Client, path: &str, query: &[(&str, String)]) -> reqwest::blocking::Response {
        let resp = client
            .get(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .query(query)
            .send()
            .expect("request to the master");
        assert!(resp.status().is_success(), "GET {path} {query:?}: HTTP {}", resp.status());
        resp
    }

    fn get_json(&self, client: &Client, path: &str, query: &[(&str, String)]) -> Value {
        self.get(client, path, query).json().expect("a JSON answer")
    }

    /// `method` `path` with a JSON body; its JSON answer, which must be a success.
    fn send(&self, client: &Client, method: &str, path: &str, body: &Value) -> Value {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let resp = client
            .request(method.clone(), format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .expect("request to the master");
        let status = resp.status();
        let answer: Value = resp.json().unwrap_or(Value::Null);
        assert!(status.is_success(), "{method} {path}: HTTP {status}: {answer}");
        answer
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        // Already reaped after stop(): then kill is a no-op and wait returns the saved status.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn health_seq(master: &Master) -> u64 {
    master.get_json(&http_client(), "/healthz", &[])["seq"].as_u64().expect("seq in /healthz")
}

/// Registers `count` bodies from `body(j)` over CLIENT_THREADS keep-alive clients; returns the
/// wall time and the latency of each registration.
fn register(
    master: &Master,
    count: usize,
    body: impl Fn(usize) -> Value + Sync,
    progress: bool,
) -> (Duration, Vec<Duration>) {
    let next = AtomicUsize::new(0);
    let step = (count / 10).max(1);
    let t0 = Instant::now();
    let latencies = std::thread::scope(|s| {
        let workers: Vec<_> = (0..CLIENT_THREADS)
            .map(|_| {
                s.spawn(|| {
                    let client = http_client();
                    let url = format!("{}/api/commands", master.url);
                    let mut lat = Vec::with_capacity(count / CLIENT_THREADS + 1);
                    loop {
                        let j = next.fetch_add(1, Ordering::Relaxed);
                        if j >= count {
                            break lat;
                        }
                        let b = body(j);
                        let t = Instant::now();
                        let resp =
                            client.post(&url).bearer_auth(&master.token).json(&b).send().expect("registration request");
                        let status = resp.status();
                        let text = resp.text().expect("registration answer");
                        lat.push(t.elapsed());
                        assert!(status.is_success(), "registering {}: HTTP {status}: {text}", b["id"]);
                        if progress && (j + 1).is_multiple_of(step) {
                            println!("  .. {}/{count} sent ({:.1} s)", j + 1, t0.elapsed().as_secs_f64());
                        }
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("registration thread")).collect::<Vec<_>>()
    });
    (t0.elapsed(), latencies)
}

struct Stats {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

impl Stats {
    fn of(mut v: Vec<Duration>) -> Stats {
        assert!(!v.is_empty());
        v.sort_unstable();
        // Nearest rank: the smallest sample at or above the fraction p of all samples.
        let at = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Stats { p50: at(0.50), p99: at(0.99), max: *v.last().expect("non-empty") }
    }
}

struct SearchClass {
    name: String,
    filtered: bool,
    /// The query of request `j`; most classes repeat one query, the selective one varies its id.
    query: Box<dyn Fn(usize) -> Vec<(&'static str, String)>>,
}

fn search_classes(n: usize) -> Vec<SearchClass> {
    // Ids with the most digits cannot be a substring of another id, so `q=tool-<k>` matches only k.
    let lo = 10usize.pow((n - 1).ilog10());
    let selective = move |j: usize| {
        let k = lo + (mix(j as u64) as usize) % (n - lo);
        // Multiples of 10 live in a team model, so they are searched from there (local first).
        let model = model_of(k);
        let mut q = vec![("q", format!("tool-{k}"))];
        if model != "default" {
            q.push(("model", model));
        }
        q
    };
    vec![
        SearchClass { name: "unfiltered first page".into(), filtered: false, query: Box::new(|_| vec![]) },
        SearchClass {
            name: "type=script&q=ledger".into(),
            filtered: true,
            query: Box::new(|_| vec![("type", "script".into()), ("q", "ledger".into())]),
        },
        SearchClass {
            name: "capability=cap-7".into(),
            filtered: true,
            query: Box::new(|_| vec![("capability", "cap-7".into())]),
        },
        SearchClass {
            name: "model=team-3&q=weather".into(),
            filtered: true,
            query: Box::new(|_| vec![("model", "team-3".into()), ("q", "weather".into())]),
        },
        SearchClass { name: "q=tool-<k> (one match)".into(), filtered: true, query: Box::new(selective) },
    ]
}

/// Times SEARCH_REQUESTS searches (to the last byte of the answer); returns the match count of the first.
fn measure_search(client: &Client, master: &Master, class: &SearchClass) -> (u64, Stats) {
    let total = master.get_json(client, "/api/tool-catalog", &(class.query)(0))["total"].as_u64().expect("total");
    for j in 0..WARMUP {
        master.get(client, "/api/tool-catalog", &(class.query)(j)).bytes().expect("body");
    }
    let mut lat = Vec::with_capacity(SEARCH_REQUESTS);
    for j in 0..SEARCH_REQUESTS {
        let q = (class.query)(j);
        let t = Instant::now();
        master.get(client, "/api/tool-catalog", &q).bytes().expect("body");
        lat.push(t.elapsed());
    }
    (total, Stats::of(lat))
}

const CATALOG_PLACE: &str = "p-tool-catalog";
const PAGE_REQUESTS: usize = 200;

const FIRE_REQUESTS: usize = 200;

/// Fires by hand of a map whose read arc takes the first token of the catalog place: a token
/// goes into its input place, then the fire is timed to its answer (the fire committed).
fn measure_catalog_fire(client: &Client, master: &Master) -> Stats {
    let net = json!({"places": ["p-go", "p-out"], "transitions": [{"id": "peek", "kind": "map",
        "presets": {"go": {"place": "p-go"}, "cat": {"place": CATALOG_PLACE, "consume": false}},
        "postsets": {"o": {"place": "p-out"}}, "action": {"template": {"name": "${.cat.name}"}},
        "emit": [{"to": "o"}]}]});
    master.send(client, "PUT", "/api/models/default/net", &net);
    let mut lat = Vec::with_capacity(FIRE_REQUESTS);
    for i in 0..WARMUP + FIRE_REQUESTS {
        master.send(client, "POST", "/api/models/default/places/p-go/tokens", &json!({"data": {}}));
        let t = Instant::now();
        let fired = master.send(client, "POST", "/api/models/default/transitions/peek/fire", &json!({}));
        let took = t.elapsed();
        assert_eq!(fired["outcome"], "fired", "{fired}");
        if i >= WARMUP {
            lat.push(took);
        }
    }
    Stats::of(lat)
}

/// Pages of 100 of the catalog place's tokens from `offset`.
fn measure_page(client: &Client, master: &Master, offset: usize) -> Stats {
    let path = format!("/api/models/default/places/{CATALOG_PLACE}/tokens");
    let query = [("offset", offset.to_string()), ("limit", "100".to_string())];
    let page = master.get_json(client, &path, &query);
    assert_eq!(page.as_array().map(Vec::len), Some(100), "a page of the catalog place");
    let mut lat = Vec::with_capacity(PAGE_REQUESTS);
    for _ in 0..PAGE_REQUESTS {
        let t = Instant::now();
        master.get(client, &path, &query).bytes().expect("body");
        lat.push(t.elapsed());
    }
    Stats::of(lat)
}

fn measure_get(client: &Client, master: &Master, n: usize) -> Stats {
    let request = |j: usize| {
        let i = (mix(0xC0FFEE ^ j as u64) as usize) % n;
        let model = model_of(i);
        // A local entry is found only through its model; asking there also exercises local-first lookup.
        let query = if model == "default" { vec![] } else { vec![("model", model)] };
        (format!("/api/tool-catalog/tool-{i}"), query)
    };
    for j in 0..WARMUP {
        let (path, q) = request(GET_REQUESTS + j);
        master.get(client, &path, &q).bytes().expect("body");
    }
    let mut lat = Vec::with_capacity(GET_REQUESTS);
    for j in 0..GET_REQUESTS {
        let (path, q) = request(j);
        let t = Instant::now();
        master.get(client, &path, &q).bytes().expect("body");
        lat.push(t.elapsed());
    }
    Stats::of(lat)
}

/// Checks the catalog holds exactly the `n` generated entries, per model and through search.
/// Search totals count only what a query can see (global, plus one model's local entries), so
/// each is checked against the count expected for that view.
fn verify_counts(master: &Master, n: usize) -> String {
    let client = http_client();
    let local = |t: usize| (0..n).filter(|i| i.is_multiple_of(10) && (i / 10) % TEAMS == t).count();
    let global = (0..n).filter(|i| !i.is_multiple_of(10)).count();
    let models = master.get_json(&client, "/api/models", &[]);
    let stored: u64 = models
        .as_array()
        .expect("models")
        .iter()
        .filter_map(|m| m.pointer("/places/0/tokens").and_then(Value::as_u64))
        .sum();
    assert_eq!(stored as usize, n, "entries across all models");
    let total = |q: &[(&str, String)]| {
        master.get_json(&client, "/api/tool-catalog", q)["total"].as_u64().expect("total") as usize
    };
    assert_eq!(total(&[("limit", "1".into())]), global, "global entries visible to a default search");
    assert_eq!(
        total(&[("limit", "1".into()), ("model", "team-3".into())]),
        global + local(3),
        "entries visible from team-3"
    );
    format!("{n} entries ({global} global + {} local in {TEAMS} team models)", n - global)
}

struct Memory {
    rss_kib: u64,
    hwm_kib: u64,
}

impl Memory {
    fn of(pid: i32) -> Memory {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading /proc/<pid>/status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        };
        Memory { rss_kib: field("VmRSS:"), hwm_kib: field("VmHWM:") }
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VmRSS {:.0} MiB, VmHWM (peak) {:.0} MiB", self.rss_kib as f64 / 1024.0, self.hwm_kib as f64 / 1024.0)
    }
}
