//! Net engine benchmark: fires per second of a `pass` transition with every fire a durable
//! event, the end-to-end latency of a three-step net with script steps (run by a separate
//! executor, and by `agentos up`'s own), and a commit into a large place watched by a filtered
//! transition against the same commit on an empty one. Prints figures; asserts nothing. Run:
//! `cargo bench -p agentos-cli --bench nets`.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

mod common;

use common::{Api, pct, start_executor};

impl Api {
    fn count(&self, model: &str, place: &str) -> usize {
        self.get(&format!("/api/models/{model}/places/{place}/tokens")).as_array().unwrap().len()
    }
}

fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    common::wait_until(what, Duration::from_secs(120), cond)
}

/// The three-step chain `p0 → c1 → r1 → c2 → r2 → c3 → r3` of map and command transitions,
/// each command running the script tool `noop` (`cat`), in the model `chain` of one master; the
/// time a token reaches r3 is when the watch stream tells of the fire that put it there (no
/// polling, which added up to 2 ms and load of its own).
struct Chain<'a> {
    api: &'a Api,
    arrivals: std::sync::mpsc::Receiver<Instant>,
    in_r3: usize,
}

impl<'a> Chain<'a> {
    fn new(api: &'a Api) -> Self {
        api.call(reqwest::Method::POST, "/api/commands", Some(json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": "noop", "name": "noop", "runtime": "sh", "content": "cat"})));
        let cmd = |from: &str| json!({"executor": "script", "command": "invoke", "args": {"toolId": "noop", "input": format!("${{.{from}.data}}")}});
        let mut transitions = Vec::new();
        let places = ["p0", "c1", "r1", "c2", "r2", "c3", "r3"];
        for step in 1..=3 {
            let (input, cmd_place, result) = (places[(step - 1) * 2], places[step * 2 - 1], places[step * 2]);
            transitions.push(json!({"id": format!("build{step}"), "kind": "map", "presets": {"i": {"place": input}},
                "postsets": {"o": {"place": cmd_place}}, "action": {"template": cmd("i")}, "emit": [{"to": "o"}]}));
            transitions
                .push(json!({"id": format!("run{step}"), "kind": "command", "presets": {"c": {"place": cmd_place}},
                "postsets": {"o": {"place": result}}, "emit": [{"to": "o"}]}));
        }
        let ids: Vec<String> = transitions.iter().map(|t| t["id"].as_str().unwrap().to_string()).collect();
        api.call(
            reqwest::Method::PUT,
            "/api/models/chain/net",
            Some(json!({"places": places, "transitions": transitions})),
        );
        for id in &ids {
            api.call(reqwest::Method::POST, &format!("/api/models/chain/transitions/{id}/start"), Some(json!({})));
        }
        let arrivals = {
            use std::io::BufRead;
            let (tx, rx) = std::sync::mpsc::channel();
            let watch = reqwest::blocking::Client::builder()
                .timeout(None)
                .build()
                .unwrap()
                .get(format!("{}/api/models/chain/watch", api.url))
                .bearer_auth(&api.token)
                .send()
                .unwrap();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(watch).lines().map_while(Result::ok) {
                    if line.starts_with("data:") && line.contains("fireCompleted") && line.contains("\"place\":\"r3\"")
                    {
                        let _ = tx.send(Instant::now());
                    }
                }
            });
            rx
        };
        Chain { api, arrivals, in_r3: 0 }
    }

    /// One token at a time through the chain, after five to warm up; the sorted latencies from
    /// the put to the last fire, in ms.
    fn through(&mut self, tokens: usize) -> Vec<f64> {
        let mut lat = Vec::new();
        for i in 0..tokens + 5 {
            let t = Instant::now();
            self.api.call(reqwest::Method::POST, "/api/models/chain/places/p0/tokens", Some(json!({"data": {"i": i}})));
            let done = self.arrivals.recv_timeout(Duration::from_secs(60)).expect("the chain's output");
            self.in_r3 += 1;
            assert_eq!(self.api.count("chain", "r3"), self.in_r3);
            if i >= 5 {
                lat.push(done.duration_since(t).as_secs_f64() * 1000.0);
            }
        }
        lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
        lat
    }

    /// Puts tokens into r3, which nothing reads, until it holds `n`.
    fn pile(&mut self, n: usize) {
        for i in self.in_r3..n {
            self.api.call(
                reqwest::Method::POST,
                "/api/models/chain/places/r3/tokens",
                Some(json!({"data": {"old": i}})),
            );
        }
        self.in_r3 = self.in_r3.max(n);
    }
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    // Without the limit on fires per second (default 1,000 per transition): the bench measures
    // how fast a transition can fire, and a fast machine would stop it at the limit.
    let (_master, api) =
        common::start_program(&common::BIN, &["serve", "--max-fires-per-second", "0"], &dir.path().join("master"));
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    println!(
        "net benchmark: {cores} cores, release build, loopback; every fire is a committed event (SQLite WAL, synchronous=FULL)"
    );

    // 1. pass fires per second: tokens put first (transition stopped), then started, timed to drain.
    let n = 2000;
    api.call(
        reqwest::Method::PUT,
        "/api/models/bench/net",
        Some(json!({
            "places": ["p-a", "p-b"],
            "transitions": [{"id": "move", "kind": "pass", "concurrency": 1,
                "presets": {"x": {"place": "p-a"}}, "postsets": {"y": {"place": "p-b"}}, "emit": [{"to": "y"}]}]
        })),
    );
    for i in 0..n {
        api.call(reqwest::Method::POST, "/api/models/bench/places/p-a/tokens", Some(json!({"data": {"i": i}})));
    }
    let t = Instant::now();
    api.call(reqwest::Method::POST, "/api/models/bench/transitions/move/start", Some(json!({})));
    wait_until("all pass fires", || api.count("bench", "p-b") == n);
    let secs = t.elapsed().as_secs_f64();
    println!();
    println!("(1) {n} fires of one `pass` transition, one durable event each");
    println!("    {:>8.0} fires/s   ({:.3} ms per fire)", n as f64 / secs, secs * 1000.0 / n as f64);

    // 2. three-step net with script steps, end to end, one token at a time.
    let _e = start_executor(&api, &dir.path().join("executor"), "bench", 2);
    let mut chain = Chain::new(&api);
    // 100 tokens: enough for a p50 that one hiccup does not move.
    let rounds = 100;
    let lat = chain.through(rounds);
    // The same net after it has run a while: 300 results piled up in r3, which nothing reads
    // (a chain used to stop at 128 tokens anywhere in the model).
    chain.pile(300);
    let piled = chain.through(rounds);
    // The same net on `agentos up`, whose executor runs in the master's process.
    let (_up, up_api) = common::start_up(&dir.path().join("up"));
    let up_lat = Chain::new(&up_api).through(rounds);
    let bare = {
        let t = Instant::now();
        for _ in 0..30 {
            Command::new("sh").args(["-c", "exit 0"]).status().unwrap();
        }
        t.elapsed().as_secs_f64() * 1000.0 / 30.0
    };
    // The step's own process, without master or executor: `sh` running the script `cat` with
    // the token's data on stdin and its stdout read, in the environment the executor gives a job
    // (`LANG=C.UTF-8` alone costs `cat` a locale load, about 0.1 ms here).
    let script = dir.path().join("noop.sh");
    std::fs::write(&script, "cat").unwrap();
    let own = {
        use std::io::{Read, Write};
        let t = Instant::now();
        for _ in 0..30 {
            let mut child = Command::new("sh")
                .arg(&script)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("HOME", dir.path())
                .env("LANG", "C.UTF-8")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child.stdin.take().unwrap().write_all(br#"{"i":0}"#).unwrap();
            let mut out = Vec::new();
            child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
            assert!(child.wait().unwrap().success() && out == br#"{"i":0}"#);
        }
        t.elapsed().as_secs_f64() * 1000.0 / 30.0
    };
    let p50 = pct(&lat, 0.5);
    println!();
    println!("(2) a three-step net (map → command → … ×3, each command a script tool), {rounds} tokens one at a time");
    println!(
        "    end to end p50 {p50:.2} ms, p95 {:.2} ms, max {:.2} ms (from the put to the watch stream's event of the last fire)",
        pct(&lat, 0.95),
        lat[lat.len() - 1]
    );
    println!(
        "    per script step: {:.2} ms (goal < 2 ms), of which a bare sh spawn is {bare:.2} ms → overhead ≈ {:.2} ms per step",
        p50 / 3.0,
        p50 / 3.0 - bare
    );
    println!(
        "    with 300 results piled up in r3: per script step {:.2} ms (p50 {:.2} ms end to end)",
        pct(&piled, 0.5) / 3.0,
        pct(&piled, 0.5)
    );
    println!(
        "    the step's own process alone (sh running `cat`, stdin and stdout piped, LANG=C.UTF-8): {own:.2} ms → master and executor ≈ {:.2} ms per step",
        p50 / 3.0 - own
    );
    let up50 = pct(&up_lat, 0.5);
    println!(
        "    through `agentos up` (its executor in the master's process): per script step {:.2} ms (p50 {up50:.2} ms end to end) → master and executor ≈ {:.2} ms per step",
        up50 / 3.0,
        up50 / 3.0 - own
    );
    println!(
        "    published per-task overheads: Windmill default 86 ms, dedicated 9.8 ms; tuned Temporal ~19 ms; reference executors poll every 2 s"
    );

    // 3. A token the filter binds, put into a place of 3,000 tokens it does not bind, watched by
    //    a started transition: from the put to the fire's output, against the same on an empty
    //    place. Every commit to the model has the fire loop look at the place again.
    let watched = |model: &str| {
        api.call(
            reqwest::Method::PUT,
            &format!("/api/models/{model}/net"),
            Some(json!({"places": ["p-big", "p-out"], "transitions": [{"id": "pick", "kind": "pass",
                "presets": {"x": {"place": "p-big", "filter": ".data.n < 0"}},
                "postsets": {"y": {"place": "p-out"}}, "emit": [{"to": "y"}]}]})),
        );
        api.call(reqwest::Method::POST, &format!("/api/models/{model}/transitions/pick/start"), Some(json!({})));
    };
    watched("full");
    watched("empty");
    for i in 0..3000 {
        api.call(reqwest::Method::POST, "/api/models/full/places/p-big/tokens", Some(json!({"data": {"n": i}})));
    }
    let fires = |model: &str, done: &mut usize| {
        let mut lat = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            api.call(
                reqwest::Method::POST,
                &format!("/api/models/{model}/places/p-big/tokens"),
                Some(json!({"data": {"n": -1}})),
            );
            *done += 1;
            let want = *done;
            wait_until("the filtered fire", || api.count(model, "p-out") == want);
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        lat
    };
    // Alternating rounds, so both see the same machine.
    let (mut full, mut empty, mut full_done, mut empty_done) = (Vec::new(), Vec::new(), 0, 0);
    for _ in 0..3 {
        full.extend(fires("full", &mut full_done));
        empty.extend(fires("empty", &mut empty_done));
    }
    full.sort_by(|a, b| a.partial_cmp(b).unwrap());
    empty.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (f50, e50) = (pct(&full, 0.5), pct(&empty, 0.5));
    println!();
    println!("(3) a token a filter binds, put beside 3,000 it does not, until its fire's output is in place; 60 fires");
    println!(
        "    p50 {f50:.2} ms, p95 {:.2} ms; the same on an empty place of a model with the same net: p50 {e50:.2} ms, p95 {:.2} ms → {:.2}× (goal < 2×)",
        pct(&full, 0.95),
        pct(&empty, 0.95),
        f50 / e50
    );
}
