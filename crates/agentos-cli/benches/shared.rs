//! Several masters on PostgreSQL and S3 against one master on its embedded SQLite log, in one
//! run: registrations per second and direct invocations per second (SQLite single master,
//! PostgreSQL single master, PostgreSQL two masters), with the CPU each process spends, and the
//! failover time from killing a master to its model firing on another.
//!
//! Needs the servers `scripts/pg-env` and `scripts/s3-env` start (it runs both).
//!
//!   cargo bench -p agentos-cli --bench shared

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Api, BIN, Proc, ms, pct, start_executor, wait_until};
use serde_json::json;

const S3_ENV: [(&str, &str); 5] = [
    ("AWS_ACCESS_KEY_ID", "agentos-test"),
    ("AWS_SECRET_ACCESS_KEY", "agentos-test-secret"),
    ("AWS_REGION", "us-east-1"),
    ("AWS_ENDPOINT_URL", "http://127.0.0.1:59000"),
    ("AWS_ALLOW_HTTP", "true"),
];

fn script(name: &str) -> Vec<String> {
    let path = format!("{}/../../scripts/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&path).output().expect(name);
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

/// A fresh database and bucket: `--database URL --blobs s3://…` arguments.
fn shared_storage(tag: &str) -> Vec<String> {
    let server = script("pg-env").remove(0);
    let name = format!("agentos_bench_{tag}_{}", std::process::id());
    for sql in [format!("DROP DATABASE IF EXISTS {name}"), format!("CREATE DATABASE {name}")] {
        assert!(Command::new("psql").args([&server, "-qXc", &sql]).status().unwrap().success());
    }
    let root = script("s3-env").remove(1);
    let bucket = name.replace('_', "-");
    std::fs::create_dir_all(Path::new(&root).join(&bucket)).unwrap();
    let database = format!("{}/{name}", server.rsplit_once('/').unwrap().0);
    vec!["--database".into(), database, "--blobs".into(), format!("s3://{bucket}/b")]
}

fn start(data: &Path, storage: &[String], key: &Path, token_from: Option<&Path>) -> (Proc, Api) {
    if let Some(first) = token_from {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(data).unwrap();
        std::fs::copy(first.join("operator.token"), data.join("operator.token")).unwrap();
    }
    let mut args: Vec<&str> = vec!["serve"];
    args.extend(storage.iter().map(String::as_str));
    let key = key.to_str().unwrap();
    let env: &[(&str, &str)] = if storage.is_empty() {
        &[]
    } else {
        args.extend(["--secrets-key-file", key]);
        &S3_ENV
    };
    common::start_program_env(&BIN, &args, data, env)
}

/// CPU time (user + system) a process has used.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks: u64 = fields.get(11).and_then(|u| u.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|s| s.parse().ok()).unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// CPU time of every PostgreSQL server process (as `ps` sees them).
fn postgres_cpu() -> Duration {
    let out = Command::new("pgrep").args(["-x", "postgres"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.parse().ok()).map(cpu).sum()
}

const CLIENTS: usize = 8;

/// Runs `each` from CLIENTS threads, client `c` on master `c % masters`; answers ops/s.
fn drive(apis: &[&Api], per_client: usize, each: impl Fn(&Api, usize, usize) + Sync) -> f64 {
    let started = Instant::now();
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            let (api, each) = (apis[c % apis.len()], &each);
            s.spawn(move || {
                for i in 0..per_client {
                    each(api, c, i);
                }
            });
        }
    });
    (CLIENTS * per_client) as f64 / started.elapsed().as_secs_f64()
}

struct Row {
    setup: &'static str,
    registrations: f64,
    reg_cpu: Vec<(String, f64)>,
    invocations: f64,
    inv_cpu: Vec<(String, f64)>,
}

fn measure(setup: &'static str, masters: usize, shared: bool, dir: &Path) -> Row {
    std::fs::create_dir_all(dir).unwrap();
    let key = dir.join("secrets.key");
    std::fs::write(&key, [9u8; 32]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let storage = if shared { shared_storage(&setup.replace(' ', "")[..6].to_lowercase()) } else { Vec::new() };
    let first = dir.join("m0");
    let mut procs = vec![start(&first, &storage, &key, None)];
    for i in 1..masters {
        procs.push(start(&dir.join(format!("m{i}")), &storage, &key, Some(&first)));
    }
    let apis: Vec<&Api> = procs.iter().map(|(_, a)| a).collect();
    let pids: Vec<u32> = procs.iter().map(|(p, _)| p.0.id()).collect();
    let per_client = 150;
    let cpu_of = |pids: &[u32]| -> Vec<Duration> {
        let mut v: Vec<Duration> = pids.iter().map(|p| cpu(*p)).collect();
        if shared {
            v.push(postgres_cpu());
        }
        v
    };
    let names = |extra: &[String]| -> Vec<String> {
        let mut n: Vec<String> = (0..masters).map(|i| format!("master {i}")).collect();
        n.extend(extra.iter().cloned());
        if shared {
            n.push("postgres".into());
        }
        n
    };

    let before = cpu_of(&pids);
    let registrations = drive(&apis, per_client, |api, c, i| {
        let id = format!("r-{c}-{i}");
        api.post(
            "/api/commands",
            json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": id, "name": id, "runtime": "sh", "content": format!("echo {id}")}),
        );
    });
    let after = cpu_of(&pids);
    let n = (CLIENTS * per_client) as f64;
    let reg_cpu =
        names(&[]).into_iter().zip(after.iter().zip(&before)).map(|(k, (a, b))| (k, ms(*a - *b) / n)).collect();

    // Direct invocations of a trivial script, one executor per master.
    apis[0].register_script("noop", "sh", "exit 0");
    let ws = dir.join("ws");
    let executors: Vec<Proc> =
        apis.iter().enumerate().map(|(i, a)| start_executor(a, &ws.join(i.to_string()), &format!("e{i}"), 1)).collect();
    let mut all_pids = pids.clone();
    all_pids.extend(executors.iter().map(|e| e.0.id()));
    // Every master sees the tool before the clock starts.
    for a in &apis {
        wait_until("the tool on every master", Duration::from_secs(10), || {
            a.http
                .get(format!("{}/api/tool-catalog/noop", a.url))
                .bearer_auth(&a.token)
                .send()
                .unwrap()
                .status()
                .is_success()
        });
    }
    let before = cpu_of(&all_pids);
    let invocations = drive(&apis, 60, |api, _, _| {
        let r = api.post("/api/tools/noop/invoke", json!({}));
        assert_eq!(r["exitCode"], 0, "{r}");
    });
    let after = cpu_of(&all_pids);
    let n = (CLIENTS * 60) as f64;
    let exec_names: Vec<String> = (0..masters).map(|i| format!("executor {i}")).collect();
    let inv_cpu =
        names(&exec_names).into_iter().zip(after.iter().zip(&before)).map(|(k, (a, b))| (k, ms(*a - *b) / n)).collect();
    drop(executors);
    Row { setup, registrations, reg_cpu, invocations, inv_cpu }
}

fn failover(dir: &Path) -> Vec<f64> {
    std::fs::create_dir_all(dir).unwrap();
    let key = dir.join("secrets.key");
    std::fs::write(&key, [9u8; 32]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut took = Vec::new();
    for round in 0..5 {
        let storage = shared_storage(&format!("fo{round}"));
        let a_dir = dir.join(format!("fo{round}-a"));
        let (mut a, api_a) = start(&a_dir, &storage, &key, None);
        api_a.call(
            reqwest::Method::PUT,
            "/api/models/flow/net",
            Some(json!({"places": ["p-in", "p-out"], "transitions": [{"id": "move", "kind": "pass",
                "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]})),
        );
        api_a.post("/api/models/flow/transitions/move/start", json!({}));
        api_a.post("/api/models/flow/places/p-in/tokens", json!({"data": 0}));
        let out = |api: &Api| api.get("/api/models/flow/places/p-out/tokens").as_array().unwrap().len();
        wait_until("a to fire", Duration::from_secs(10), || out(&api_a) == 1);
        let (_b, api_b) = start(&dir.join(format!("fo{round}-b")), &storage, &key, Some(&a_dir));
        let _ = a.0.kill();
        let killed = Instant::now();
        let _ = a.0.wait();
        api_b.post("/api/models/flow/places/p-in/tokens", json!({"data": 1}));
        wait_until("b to take over", Duration::from_secs(30), || out(&api_b) == 2);
        took.push(ms(killed.elapsed()));
    }
    took.sort_by(f64::total_cmp);
    took
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        measure("SQLite, one master", 1, false, &dir.path().join("sqlite")),
        measure("PostgreSQL + S3, one master", 1, true, &dir.path().join("pg1")),
        measure("PostgreSQL + S3, two masters", 2, true, &dir.path().join("pg2")),
    ];
    println!("shared storage ({CLIENTS} clients; 2 cores: two masters cannot add cores)");
    for r in &rows {
        println!("  {}", r.setup);
        println!("    registrations/s                        {:>9.0}", r.registrations);
        for (who, c) in &r.reg_cpu {
            println!("      CPU per registration, {who:<16} {c:>7.3} ms");
        }
        println!("    direct invocations/s                   {:>9.0}", r.invocations);
        for (who, c) in &r.inv_cpu {
            println!("      CPU per invocation, {who:<18} {c:>7.3} ms");
        }
    }
    let took = failover(&dir.path().join("failover"));
    println!(
        "  failover: kill -9 of a master to its model firing on the other, 5 rounds: p50 {:.0} ms, max {:.0} ms (goal < 5000 ms)",
        pct(&took, 0.5),
        took[took.len() - 1]
    );
}
