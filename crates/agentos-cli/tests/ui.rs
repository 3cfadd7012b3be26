//! The web page in a real browser: headless Chromium (Debian's package) driven by Playwright's
//! playwright-core (npm), both installed by `scripts/ui-env`. The master is prepared here
//! through the API; `tests/ui/flows.mjs` signs in, searches, opens an entry, sees shadowing,
//! watches a token move live, fires from the page and sees the fire disabled for an agent without
//! `x`, with the flag it takes, opens a place with more tokens than the page shows, loads a job's
//! whole stdout (as an agent without `r` too) and sees the read of a damaged one refused, cancels
//! a running job (and is told why when another was cancelled first), and fails on any JavaScript
//! error or `console.error` but the refusals it provokes. Screenshots of each page go to
//! `target/ui-screenshots/`.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{Executor, Master};
use serde_json::{Value, json};

/// Runs `tests/ui/{script}` under node against `m` with `env` (besides the master's URL, the
/// screenshots' folder and playwright-core), and asserts it succeeded; answers its stdout.
fn browse(m: &Master, playwright: &str, script: &str, env: &[(&str, &str)]) -> String {
    let shots = shots();
    let out = Command::new("node")
        .arg(PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ui")).join(script))
        .env("URL", &m.url)
        .envs(env.iter().copied())
        .env("SCREENSHOTS", &shots)
        .env("PLAYWRIGHT_CORE", playwright)
        .output()
        .expect("node");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the browser flows failed:\n{stdout}\n{stderr}");
    stdout
}

/// Where the scripts write their screenshots.
fn shots() -> PathBuf {
    let shots = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/ui-screenshots"));
    std::fs::create_dir_all(&shots).unwrap();
    shots
}

fn ui_env() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/ui-env");
    let out = Command::new(script).output().expect("scripts/ui-env");
    assert!(out.status.success(), "scripts/ui-env failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn the_page_shows_the_platform_live_and_never_more_than_the_token_may() {
    let playwright = ui_env();
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();

    // A global greet, and team's own greet (defined twice) that shadows it for team.
    let greet = |model: Option<&str>, content: &str| {
        let mut body = json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": "greet", "name": "Greet",
            "runtime": "sh", "content": content, "description": "Says hello",
            "input": {"type": "object", "properties": {"name": {"type": "string", "description": "who"}}, "required": ["name"]}});
        if let Some(m) = model {
            body["model"] = Value::from(m);
        }
        let (status, v) = api.command(body);
        assert_eq!(status, 200, "{v}");
    };
    greet(None, "echo hello");
    let (status, v) = api.post("/api/models", json!({"name": "team"}));
    assert!(status == 200 || status == 201, "{v}");
    greet(Some("team"), "echo hello team");
    greet(Some("team"), "echo hello team, again");

    let net = json!({"places": ["p-in", "p-out"], "transitions": [{"id": "move", "kind": "pass",
        "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]});
    let (status, v) = api.put("/api/models/flow/net", net);
    assert_eq!(status, 200, "{v}");

    // A token parked by a rule that matches nothing.
    let park = json!({"places": ["p-in", "p-big"], "transitions": [{"id": "sort", "kind": "pass",
        "presets": {"x": {"place": "p-in"}}, "postsets": {"big": {"place": "p-big"}},
        "emit": [{"to": "big", "when": ".v > 10"}], "onUnmatched": "keep"}]});
    assert_eq!(api.put("/api/models/park/net", park).0, 200);
    let (status, v) = api.put("/api/models/empty/net", json!({"places": [], "transitions": []}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(api.post("/api/models/park/transitions/sort/start", json!({})).0, 200);
    assert_eq!(api.post("/api/models/park/places/p-in/tokens", json!({"data": {"v": 11}})).0, 200);
    common::wait_for("the token to park", || !api.get("/api/models/park/parked").1.as_array().unwrap().is_empty());

    // A job with output, run by an executor the page lists. It runs two jobs at once, so that
    // the two sleeps the page cancels run side by side.
    assert_eq!(api.register("hello", "sh", "echo hello from the job", None).0, 200);
    assert_eq!(api.register("sleeper", "sh", "sleep 60", None).0, 200);
    let _e = Executor::start_args(&m, &dir.path().join("executor"), "e1", &[], &["--concurrency", "2"]);
    let (status, r) = api.invoke("hello", json!({}));
    assert_eq!(status, 200, "{r}");
    // A job whose stdout (150,000 bytes) passes the 128 KiB kept inline: its result holds the
    // first 2,000 characters and the blob with the whole. Run by an agent that may call scripts
    // but not read (no `r`), as `agentos invoke` does it: the page shows it its own job, and
    // the whole stdout, read by the job's id (the blob route itself needs `r`).
    let loud = |id: &str, c: char| {
        let script = format!("import sys\nsys.stdout.write('{c}' * 149999 + 'z')");
        assert_eq!(api.register(id, "python3", &script, None).0, 200);
    };
    loud("loud", 'a');
    loud("broken", 'b');
    let caller = api.agent("caller", "--x------s");
    let (status, r) = caller.invoke("loud", json!({}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdoutBlob"]["sizeBytes"], 150_000, "{r}");
    assert_eq!(r["stdout"].as_str().map(str::len), Some(2000), "{r}");
    let loud_job = r["jobId"].as_str().unwrap().to_string();
    let (status, v) = caller.get(&format!("/api/blobs/{}", r["stdoutBlob"]["urn"].as_str().unwrap()));
    assert_eq!(status, 403, "{v}");
    // Another, whose stored output is then damaged on disk: the master refuses to serve it.
    let (status, r) = caller.invoke("broken", json!({}));
    assert_eq!(status, 200, "{r}");
    let broken_job = r["jobId"].as_str().unwrap().to_string();
    let urn = r["stdoutBlob"]["urn"].as_str().unwrap();
    let (namespace, sha) = urn.trim_start_matches("urn:agentos:blob:").rsplit_once('/').unwrap();
    std::fs::write(m.blob_file(namespace, sha), "damaged").unwrap();

    // A place holding more tokens than the page shows at once (200), which nothing takes from.
    let (status, v) = api.put("/api/models/many/net", json!({"places": ["p-many"], "transitions": []}));
    assert_eq!(status, 200, "{v}");
    for i in 0..205 {
        assert_eq!(api.post("/api/models/many/places/p-many/tokens", json!({"data": {"i": i}})).0, 200);
    }

    let (status, v) = api.put("/api/secrets/API_KEY", json!({"value": "secret-value-0123456789"}));
    assert_eq!(status, 200, "{v}");
    // An agent that may read and see tool nets and scripts, but not execute.
    let viewer = api.agent("viewer", "r-------ts");
    let (status, v) = api.post("/api/agents/viewer/grants", json!({"model": "flow"}));
    assert_eq!(status, 200, "{v}");
    // One to revoke from the page.
    let temp = api.agent("temp", "r");
    // More entries than the catalog page shows at once (200): it pages through them. Their
    // 300 events also put the agents' creation further back than the audit page's last 300.
    for i in 0..300 {
        assert_eq!(api.register(&format!("bulk-{i:03}"), "sh", "echo bulk", None).0, 200);
    }

    // Two jobs started asynchronously and left running: the page cancels one, and tries to
    // cancel the other after it was cancelled behind its back.
    let start_sleeper = || api.invoke_async("sleeper", json!({"timeoutMs": 120000}));
    let sleep_job = start_sleeper();
    let raced_job = start_sleeper();
    for job in [&sleep_job, &raced_job] {
        common::wait_for("the sleep to run", || api.get(&format!("/api/jobs/{job}")).1["state"] == "running");
    }
    common::wait_for("the executor to list the sleeps", || {
        let held = api.get("/api/executors").1[0]["jobs"].clone();
        [&sleep_job, &raced_job].iter().all(|j| held.as_array().is_some_and(|l| l.iter().any(|x| x == j.as_str())))
    });

    let stdout = browse(
        &m,
        &playwright,
        "flows.mjs",
        &[
            ("OPERATOR_TOKEN", &m.token),
            ("VIEWER_TOKEN", viewer.token.as_deref().unwrap()),
            ("TEMP_TOKEN", temp.token.as_deref().unwrap()),
            ("CALLER_TOKEN", caller.token.as_deref().unwrap()),
            ("LOUD_JOB", &loud_job),
            ("BROKEN_JOB", &broken_job),
            ("SLEEP_JOB", &sleep_job),
            ("RACED_JOB", &raced_job),
        ],
    );
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or("{}")).unwrap();
    let bytes = report["figures"]["firstViewBytes"].as_u64().unwrap();
    // Figures, not timed assertions: the size is a property of the files, the paint is printed.
    println!("first view: {bytes} bytes transferred, first paint at {} ms", report["figures"]["firstPaintMs"]);
    assert!(bytes > 0 && bytes < 150 * 1024, "the first view transfers {bytes} bytes (goal under 150 KB)");
    for page in [
        "sign-in",
        "catalog",
        "entry",
        "net",
        "tokens",
        "parked",
        "executors",
        "whole-output",
        "audit",
        "agents",
        "secrets",
        "refused",
        "own-output",
        "output-refused",
        "cancelled",
    ] {
        assert!(shots().join(format!("{page}.png")).exists(), "no screenshot of {page}");
    }
    // The cancelled sleeps are stopped at the executor's next heartbeat (a third of the lease):
    // none outlives the test.
    common::wait_for("the executor to stop the cancelled sleeps", || api.get("/api/executors").1[0]["state"] != "busy");
}

/// An agent holding one flag lands, after sign-in, on the first view that flag opens (`r` alone
/// on the nets; it used to land on the catalog and be shown the catalog's 403), is offered only
/// the views it may use, and, holding a flag that opens none (`u`, `c`), is told what it holds
/// and what each view needs. `tests/ui/landing.mjs` fails on any refused request.
#[test]
fn a_token_lands_on_a_view_its_flags_open_or_is_told_which_flag_it_lacks() {
    let playwright = ui_env();
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    let net = json!({"places": ["p-in"], "transitions": []});
    let (status, v) = api.put("/api/models/flow/net", net);
    assert_eq!(status, 200, "{v}");
    let mut agents = serde_json::Map::new();
    for (i, letter) in "rwxhludcts".chars().chain(['m']).enumerate() {
        let flags = format!("{}{letter}", "-".repeat(i));
        let agent = api.agent(&format!("only-{letter}"), &flags);
        let (status, v) = api.post(&format!("/api/agents/only-{letter}/grants"), json!({"model": "flow"}));
        assert_eq!(status, 200, "{v}");
        agents.insert(letter.to_string(), Value::from(agent.token.as_deref().unwrap()));
    }
    browse(&m, &playwright, "landing.mjs", &[("AGENTS", &Value::Object(agents).to_string())]);
}

/// A control whose route the token's flags cannot pass is offered disabled, with the flag it
/// takes said beside it and read to a screen reader: an agent holding `r` alone sees the net's
/// start, stop, fire and put-token disabled (they used to be offered and answer a 403), one
/// holding `r` and `l` (with or without `x`) the cancel of a running job another invoked, and
/// one holding `rwx` and `s` uses them all: fires, starts, stops, puts a token and
/// cancels the job it invoked. `tests/ui/controls.mjs` fails on any refused request.
#[test]
fn a_control_the_flags_cannot_pass_is_offered_disabled_with_the_flag_it_takes() {
    let playwright = ui_env();
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    let net = json!({"places": ["p-in", "p-out"], "transitions": [{"id": "move", "kind": "pass",
        "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]});
    let (status, v) = api.put("/api/models/flow/net", net);
    assert_eq!(status, 200, "{v}");
    assert_eq!(api.post("/api/models/flow/places/p-in/tokens", json!({"data": {"n": 1}})).0, 200);
    assert_eq!(api.register("sleeper", "sh", "sleep 60", None).0, 200);
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    // Each at home in flow: the job the full agent invokes is in flow, where the others may see it.
    let agent = |name: &str, flags: &str| {
        let (status, v) = api.post("/api/agents", json!({"name": name, "flags": flags, "model": "flow"}));
        assert_eq!(status, 200, "{v}");
        v["token"].as_str().unwrap().to_string()
    };
    let reader = agent("reader", "r");
    let watcher = agent("watcher", "r---l");
    let other = agent("other", "r-x-l");
    let full = agent("full", "rwx------s");
    let job = api.with_token(Some(&full)).invoke_async("sleeper", json!({"timeoutMs": 120000}));
    common::wait_for("the executor to hold the sleep", || {
        let held = api.get("/api/executors").1[0]["jobs"].clone();
        held.as_array().is_some_and(|l| l.iter().any(|x| x == job.as_str()))
    });

    browse(
        &m,
        &playwright,
        "controls.mjs",
        &[
            ("READER_TOKEN", &reader),
            ("WATCHER_TOKEN", &watcher),
            ("OTHER_TOKEN", &other),
            ("FULL_TOKEN", &full),
            ("JOB", &job),
        ],
    );
    let (status, v) = api.get(&format!("/api/jobs/{job}"));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["results"][0]["cancelledBy"], "full", "{v}");
    // Stopped at the executor's next heartbeat: the sleep does not outlive the test.
    common::wait_for("the executor to stop the cancelled sleep", || api.get("/api/executors").1[0]["state"] != "busy");
}
