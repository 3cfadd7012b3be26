//! Tools as shell commands: shims, flags, host tools, list-tools and the system prompt, end to end.

mod common;

use std::path::Path;
use std::process::Command;

use common::{BIN, Executor, Master, Out, run_as};
use serde_json::{Value, json};

fn run(m: &Master, program: &Path, args: &[&str], stdin: Option<&str>) -> Out {
    run_as(m, &m.token, program, args, stdin)
}

fn install(m: &Master, dir: &Path) {
    common::install_shims(m, &m.token, dir);
}

fn greet_script(api: &common::Api) {
    let (status, e) = api.command(json!({
        "type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": "greet", "name": "Greeter", "runtime": "python3",
        "description": "Greet someone",
        "content": "import sys,json\nd=json.load(sys.stdin)\nif d['name']=='fail':\n    sys.stderr.write('cannot greet fail\\n'); sys.exit(3)\nprint(json.dumps({'greeting': 'Hello, ' + d['name'] + ('!' if d.get('excited') else '.')}))",
        "input": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "description": "Who to greet"},
            "excited": {"type": "boolean", "description": "End with an exclamation mark"}}}
    }));
    assert_eq!(status, 200, "{e}");
}

#[test]
fn a_host_tool_runs_through_its_shim_and_times_out_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    let bin = dir.path().join("bin");
    install(&m, &bin);
    let weather = bin.join("agentos-weather");
    assert!(weather.exists());

    let out = run(&m, &weather, &["forecast", "--city", "Paris", "--days", "2"], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["result"]["city"], "Paris");
    assert_eq!(v["result"]["days"].as_array().unwrap().len(), 2);
    assert_eq!(out.stdout.lines().count(), 1, "nothing else on stdout: {}", out.stdout);

    // The default of --days is honoured; --name=value works; booleans take --x.
    let out = run(&m, &weather, &["forecast", "--city=Oslo", "--fahrenheit"], None);
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["result"]["days"].as_array().unwrap().len(), 3);
    assert!(v["result"]["days"][0]["temperature"].as_f64().unwrap() > 40.0);

    let out = run(&m, &weather, &["slow", "--seconds", "30"], None);
    assert_eq!(out.code, 6, "timed out: {}", out.stderr);
    assert!(out.stdout.is_empty());
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("timed out after 500 ms"), "{}", out.stderr);

    for (args, code, words) in [
        (vec!["forecast"], 2, "agentos-weather forecast: Missing required flag: --city"),
        (vec!["forecast", "--city", "Rome", "--dayz", "2"], 2, "did you mean --days?"),
        (vec!["forecast", "--city", "Rome", "--days", "three"], 2, "--days: expected an integer, got \"three\""),
        (vec!["forecast", "Rome"], 2, "unexpected argument"),
        (vec!["nowcast"], 4, "no tool \"nowcast\" in weather; its tools: forecast, ping, slow"),
    ] {
        let out = run(&m, &weather, &args, None);
        assert_eq!(out.code, code, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(words), "{args:?}: {}", out.stderr);
        // Agents act on the message and the exit code; the HTTP status is not theirs to parse.
        assert!(!out.stderr.contains("HTTP"), "{args:?}: {}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1);
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn a_shim_called_with_json_reports_a_failure_as_json_with_the_http_status() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    let bin = dir.path().join("bin");
    install(&m, &bin);
    let weather = bin.join("agentos-weather");
    let out = run(&m, &weather, &["forecast", "--json", r#"{"days": 2}"#], None);
    assert_eq!(out.code, 2, "{}", out.stderr);
    // The line for people and agents stays without the status.
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(!out.stderr.contains("HTTP"), "{}", out.stderr);
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    assert_eq!(
        (v["ok"].as_bool(), v["error"]["status"].as_u64(), v["error"]["exitCode"].as_u64()),
        (Some(false), Some(400), Some(2)),
        "{v}"
    );
    assert!(v["error"]["code"].is_string(), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("city"), "{v}");
    // Without --json a failure leaves stdout empty.
    let out = run(&m, &weather, &["forecast", "--days", "2"], None);
    assert_eq!((out.code, out.stdout.as_str()), (2, ""), "{}", out.stderr);
    // A usage error found before anything is sent has the master's code for one, `usage`, and
    // no status (it had `"code": null`, unlike the same mistake found by the master).
    let missing = dir.path().join("no-such-input.json");
    let out = run(&m, &weather, &["forecast", "--json-file", missing.to_str().unwrap()], None);
    assert_eq!(out.code, 2, "{}", out.stderr);
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    assert_eq!((v["error"]["code"].as_str(), v["error"]["status"].as_u64()), (Some("usage"), None), "{v}");
}

/// Regressions: a boolean flag whose name ends in `-file` could not be set from a shim (the next
/// argument was read as a path); a device or a pipe passed as `--x-file` was read to its end
/// however large (`/dev/zero` filled the memory), since the size a file reports was the bound;
/// `--x-file -` did not read standard input.
#[test]
fn flag_files_are_bounded_and_a_boolean_named_file_is_a_boolean() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let (status, e) = m.client().command(json!({
        "type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": "bf", "name": "bf", "runtime": "sh", "content": "cat",
        "input": {"type": "object", "properties": {"overwriteFile": {"type": "boolean"}, "name": {"type": "string"}}}
    }));
    assert_eq!(status, 200, "{e}");
    let bin = dir.path().join("bin");
    install(&m, &bin);
    let bf = bin.join("agentos-bf");
    let result = |args: &[&str], stdin: Option<&str>| {
        let out = run(&m, &bf, args, stdin);
        assert_eq!(out.code, 0, "{args:?}: {}", out.stderr);
        serde_json::from_str::<Value>(out.stdout.trim()).unwrap()["result"].clone()
    };
    assert_eq!(result(&["run", "--overwrite-file", "--name", "x"], None), json!({"overwriteFile": true, "name": "x"}));
    assert_eq!(result(&["run", "--name", "x", "--overwrite-file"], None), json!({"overwriteFile": true, "name": "x"}));
    assert_eq!(result(&["run", "--no-overwrite-file"], None), json!({"overwriteFile": false}));
    assert_eq!(result(&["run", "--overwrite-file=false"], None), json!({"overwriteFile": false}));
    assert_eq!(result(&["run", "--name-file", "-"], Some("from stdin")), json!({"name": "from stdin"}));
    // A path left out is said as such.
    let out = run(&m, &bf, &["run", "--name-file", "--overwrite-file"], None);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--name-file needs a path"), "{}", out.stderr);
    // A device that never ends is read up to the bound, then refused.
    let out = run(&m, &bf, &["run", "--name-file", "/dev/zero"], None);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("more than the 64 MiB a flag's file may hold"), "{}", out.stderr);
    let out = run(&m, &bf, &["run", "--json-file", "/dev/zero"], None);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("more than the 64 MiB"), "{}", out.stderr);
    // A file under the master's body limit on disk but not once encoded: said why.
    let big = dir.path().join("big.txt");
    std::fs::write(&big, "x".repeat(7 << 20)).unwrap();
    let out = run(&m, &bf, &["run", "--name-file", big.to_str().unwrap()], None);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("travel base64-encoded, a third larger"), "{}", out.stderr);
}

/// Regression: a shim read every `--x-file PATH` as a file and sent it, even when `x-file` is a
/// flag of the tool's own, which takes the path: a 20 MB file failed the call as a request too
/// large, a pipe hung it, and any file was sent to the master, which gave the tool only its path.
#[test]
fn a_flag_of_the_tool_s_own_named_x_file_takes_its_path_and_nothing_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let (status, e) = m.client().command(json!({
        "type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": "echo", "name": "echo", "runtime": "sh", "content": "cat",
        "input": {"type": "object", "properties": {
            "name": {"type": "string"}, "name-file": {"type": "string"}, "note": {"type": "string"}}}
    }));
    assert_eq!(status, 200, "{e}");
    let bin = dir.path().join("bin");
    install(&m, &bin);
    let echo = bin.join("agentos-echo");
    let result = |args: &[&str]| {
        let out = run(&m, &echo, args, None);
        assert_eq!(out.code, 0, "{args:?}: {}", out.stderr);
        out.json()["result"].clone()
    };
    let big = dir.path().join("big.bin");
    std::fs::write(&big, vec![7u8; 20 << 20]).unwrap();
    let big = big.to_str().unwrap();
    assert_eq!(result(&["run", "--name", "x", "--name-file", big]), json!({"name": "x", "name-file": big}));
    assert_eq!(result(&["run", &format!("--name-file={big}")]), json!({"name-file": big}));
    // A pipe no one writes to: never opened. Should it be, a writer comes after 20 s, so that
    // the test fails rather than hangs.
    let fifo = dir.path().join("fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path, read by the call only.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (fifo, done) = (fifo.clone(), done.clone());
        std::thread::spawn(move || {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while !done.load(std::sync::atomic::Ordering::SeqCst) && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            // Opened only when a reader waits on it (else refused at once): nothing blocks here.
            let _ = std::os::unix::fs::OpenOptionsExt::custom_flags(
                std::fs::OpenOptions::new().write(true),
                libc::O_NONBLOCK,
            )
            .open(&fifo);
        })
    };
    let started = std::time::Instant::now();
    let fifo = fifo.to_str().unwrap();
    assert_eq!(result(&["run", "--name-file", fifo]), json!({"name-file": fifo}));
    assert!(started.elapsed() < std::time::Duration::from_secs(15), "the pipe was opened");
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.join().unwrap();
    // A string flag's file form still reads the file, the own flag's too (`--name-file-file`).
    let small = dir.path().join("small.txt");
    std::fs::write(&small, "from a file").unwrap();
    let small = small.to_str().unwrap();
    assert_eq!(result(&["run", "--note-file", small]), json!({"note": "from a file"}));
    assert_eq!(result(&["run", "--name-file-file", small]), json!({"name-file": "from a file"}));
}

/// Regressions: `-h` or `--help` anywhere asked for help, even as a flag's value (`--name -h`
/// showed help and called nothing); a `--json-file` that held no JSON object was named
/// `--json`, which the caller never typed.
#[test]
fn help_is_asked_for_where_a_flag_stands_and_json_file_errors_name_json_file() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let (status, e) = m.client().command(json!({
        "type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": "echo", "name": "echo", "runtime": "sh", "content": "cat",
        "input": {"type": "object", "properties": {"name": {"type": "string"}, "verbose": {"type": "boolean"}}}
    }));
    assert_eq!(status, 200, "{e}");
    let bin = dir.path().join("bin");
    install(&m, &bin);
    let echo = bin.join("agentos-echo");
    for (args, want) in [
        (&["run", "--name", "-h"][..], json!({"name": "-h"})),
        (&["run", "--name=--help"], json!({"name": "--help"})),
        (&["run", "--name=-h"], json!({"name": "-h"})),
        (&["run", "--verbose", "--name", "-h"], json!({"verbose": true, "name": "-h"})),
    ] {
        let out = run(&m, &echo, args, None);
        assert_eq!(out.code, 0, "{args:?}: {}", out.stderr);
        assert_eq!(out.json()["result"], want, "{args:?}");
    }
    for args in [
        &["run", "--help"][..],
        &["run", "-h"],
        &["run", "--name", "x", "--help"],
        &["run", "--name", "x", "-h"],
        &["run", "--name", "--help"],
        &["run", "--verbose", "-h"],
    ] {
        let out = run(&m, &echo, args, None);
        assert_eq!(out.code, 0, "{args:?}: {}", out.stderr);
        assert!(out.stdout.contains("\nUsage: agentos-echo run"), "{args:?}: {}", out.stdout);
    }
    for (stdin, says) in [
        ("[1]", "agentos-echo run: --json-file -: expected a JSON object\n"),
        ("", "agentos-echo run: --json-file -: not valid JSON: "),
    ] {
        let out = run(&m, &echo, &["run", "--json-file", "-"], Some(stdin));
        assert_eq!(out.code, 2, "{stdin:?}: {}", out.stderr);
        assert!(out.stderr.starts_with(says), "{stdin:?}: {}", out.stderr);
    }
}

#[test]
fn a_sh_script_calls_two_shims_in_a_row() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    let api = m.client();
    greet_script(&api);
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let bin = dir.path().join("bin");
    install(&m, &bin);
    let script = dir.path().join("chain.sh");
    std::fs::write(
        &script,
        "set -e\ncity=$(agentos-weather forecast --city Lima --days 1 | python3 -c 'import sys,json; print(json.load(sys.stdin)[\"result\"][\"city\"])')\nagentos-greet run --name \"$city\" --excited\necho '{\"name\": \"stdin\"}' | agentos-greet run --json-file -\n",
    )
    .unwrap();
    let out = Command::new("sh")
        .arg(&script)
        .env("PATH", format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()))
        .env("AGENTOS_URL", &m.url)
        .env("AGENTOS_TOKEN", &m.token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        lines,
        vec![
            json!({"ok": true, "result": {"greeting": "Hello, Lima!"}}),
            json!({"ok": true, "result": {"greeting": "Hello, stdin."}})
        ]
    );

    // A failing script is a tool failure with its last stderr line.
    let out = run(&m, &bin.join("agentos-greet"), &["run", "--name", "fail"], None);
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert!(out.stderr.contains("exit code 3") && out.stderr.contains("cannot greet fail"), "{}", out.stderr);
}

#[test]
fn help_list_tools_and_the_prompt_are_stable_text() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    greet_script(&m.client());
    let bin = dir.path().join("bin");
    install(&m, &bin);
    let weather = bin.join("agentos-weather");
    let out = run(&m, &weather, &["forecast", "--help"], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    insta::assert_snapshot!("forecast_help", out.stdout);
    let out = run(&m, &weather, &["--help"], None);
    insta::assert_snapshot!("weather_help", out.stdout);
    let out = run(&m, Path::new(BIN), &["list-tools"], None);
    insta::assert_snapshot!("list_tools", out.stdout);
    let out = run(&m, Path::new(BIN), &["prompt"], None);
    insta::assert_snapshot!("prompt", out.stdout);
    let out = run(&m, Path::new(BIN), &["prompt", "--format", "json"], None);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["tools"].as_array().unwrap().len(), 4);
    assert!(v["estimatedTokens"].as_u64().unwrap() > 0);
}

#[test]
fn install_shims_removes_stale_links_and_shows_only_what_the_caller_may_use() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    let api = m.client();
    greet_script(&api);
    let bin = dir.path().join("bin");
    install(&m, &bin);
    assert!(bin.join("agentos-greet").exists());
    api.command(json!({"type": "TOOL_CATALOG_REMOVE", "id": "greet"}));
    std::fs::write(bin.join("agentos-mine"), "not a link of ours").unwrap();
    // Links a user made: the shims themselves onto the PATH, and a build of their own.
    let shim = std::path::Path::new(BIN).with_file_name("agentos-shim");
    std::os::unix::fs::symlink(&shim, bin.join("agentos-shim")).unwrap();
    std::os::unix::fs::symlink(shim.with_file_name("agentos-shim-full"), bin.join("agentos-shim-full")).unwrap();
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::copy(BIN, elsewhere.join("agentos")).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("agentos"), bin.join("agentos-dev")).unwrap();
    // An earlier installation's link to an `agentos` since moved is stale.
    std::os::unix::fs::symlink("/no/longer/here/agentos", bin.join("agentos-old")).unwrap();
    install(&m, &bin);
    assert!(std::fs::symlink_metadata(bin.join("agentos-old")).is_err(), "a link to a gone agentos stayed");
    assert!(!bin.join("agentos-greet").exists(), "a stale link stayed");
    assert!(bin.join("agentos-weather").exists());
    assert!(bin.join("agentos-mine").exists(), "a file that is not our link was removed");
    for own in ["agentos-shim", "agentos-shim-full", "agentos-dev"] {
        assert!(std::fs::symlink_metadata(bin.join(own)).is_ok(), "the user's link {own} was removed");
    }
}

/// Regression: search and get without a model read the global catalog only, so an agent's own
/// (local) scripts were missing from `list-tools`, `install-shims`, `prompt` and `--help`
/// although calling them worked; and an `x`-only agent, who may call host tools, was refused
/// all four (403).
#[test]
fn an_agent_sees_its_home_model_and_host_tools_without_naming_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    let op = m.client();
    greet_script(&op);
    let agent = op.agent("scripter", "--x------s");
    greet_script(&agent);
    let (status, e) = agent.register("mine", "sh", "echo mine", None);
    assert_eq!(status, 200, "{e}");
    let token = agent.token.clone().unwrap();

    // The API: the home model first, the global catalog behind it, shadowing shown.
    let (status, page) = agent.get("/api/tool-catalog");
    assert_eq!(status, 200, "{page}");
    let got: Vec<(String, String, bool)> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_str().unwrap().into(), e["scope"].as_str().unwrap().into(), e["shadowed"] == true))
        .collect();
    let want =
        [("greet", "local", false), ("greet", "global", true), ("mine", "local", false), ("weather", "global", false)];
    assert_eq!(got, want.map(|(i, s, d)| (i.to_string(), s.to_string(), d)), "{page}");
    assert_eq!(agent.get("/api/tool-catalog/mine").1["scope"], "local");
    assert_eq!(agent.get("/api/tool-catalog/mine/history").0, 200);
    let (status, page) = agent.command(json!({"type": "TOOL_CATALOG_SEARCH"}));
    assert_eq!((status, page["total"].as_u64()), (200, Some(4)), "{page}");
    let (status, e) = agent.command(json!({"type": "TOOL_CATALOG_GET", "id": "greet"}));
    assert_eq!((status, e["scope"].as_str()), (200, Some("local")), "{e}");
    // The operator's home model is `default`: the agent's local entries are not its.
    assert_eq!(op.get("/api/tool-catalog/mine").0, 404);

    // The command line, with the agent's token alone.
    let bin = dir.path().join("bin");
    let out = run_as(&m, &token, Path::new(BIN), &["install-shims", "--dir", bin.to_str().unwrap()], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(bin.join("agentos-mine").exists() && bin.join("agentos-weather").exists());
    let out = run_as(&m, &token, Path::new(BIN), &["list-tools"], None);
    assert!(out.stdout.contains("mine run"), "{}{}", out.stdout, out.stderr);
    let out = run_as(&m, &token, Path::new(BIN), &["prompt"], None);
    assert!(out.stdout.contains("agentos-mine"), "{}{}", out.stdout, out.stderr);
    let out = run_as(&m, &token, &bin.join("agentos-mine"), &["--help"], None);
    assert_eq!(out.code, 0, "{}", out.stderr);

    // `x` alone: host tools show, and nothing else.
    let caller = op.agent("caller", "--x");
    let token = caller.token.clone().unwrap();
    let bin = dir.path().join("caller-bin");
    let out = run_as(&m, &token, Path::new(BIN), &["install-shims", "--dir", bin.to_str().unwrap()], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let linked: Vec<String> =
        std::fs::read_dir(&bin).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    assert_eq!(linked, ["agentos-weather"]);
    let out = run_as(&m, &token, Path::new(BIN), &["list-tools"], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("weather forecast") && !out.stdout.contains("greet"), "{}", out.stdout);
    let out = run_as(&m, &token, Path::new(BIN), &["prompt"], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("agentos-weather forecast --city"), "{}", out.stdout);
    let weather = bin.join("agentos-weather");
    for args in [&["--help"][..], &["forecast", "--help"]] {
        let out = run_as(&m, &token, &weather, args, None);
        assert_eq!(out.code, 0, "{args:?}: {}", out.stderr);
    }
    let out = run_as(&m, &token, &weather, &["forecast", "--city", "Oslo"], None);
    assert_eq!(out.code, 0, "{}", out.stderr);

    // `s` without `x`: scripts are seen in the catalog, and none is offered as a tool to call.
    let reader = op.agent("reader", "---------s");
    let token = reader.token.clone().unwrap();
    assert!(reader.get("/api/tool-catalog/greet").0 == 200, "the script is seen");
    let out = run_as(&m, &token, Path::new(BIN), &["list-tools"], None);
    assert_eq!((out.code, out.stdout.as_str()), (0, ""), "{}", out.stderr);
    let out = run_as(&m, &token, Path::new(BIN), &["prompt"], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stdout.contains("agentos-greet"), "{}", out.stdout);
    // Named, the toolkit it sees is listed, with a note of the flag a call takes.
    let out = run_as(&m, &token, Path::new(BIN), &["list-tools", "greet"], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("agentos-greet"), "{}", out.stdout);
    assert_eq!(
        out.stderr.trim(),
        "note: your flags (---------s-) show toolkit greet but do not call it: a call takes the 'x' flag"
    );
    // A caller that may call it gets no note.
    let out = run_as(&m, &m.token, Path::new(BIN), &["list-tools", "greet"], None);
    assert_eq!((out.code, out.stderr.as_str()), (0, ""), "{}", out.stdout);
}

#[test]
fn shims_link_to_the_small_shim_which_hands_https_and_proxied_masters_to_the_whole_agentos() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    let bin = dir.path().join("bin");
    install(&m, &bin);
    let weather = bin.join("agentos-weather");
    let target = std::fs::read_link(&weather).unwrap();
    assert_eq!(target.file_name().unwrap(), "agentos-shim", "{}", target.display());
    assert_eq!(target.parent(), Path::new(BIN).parent(), "the shim beside the agentos binary");
    let out = run(&m, &weather, &["ping"], None);
    assert_eq!(out.code, 0, "{}", out.stderr);

    // A proxy in the environment: the request goes through it, as `reqwest` in the whole
    // agentos sends it (the absolute URL on the request line), never straight to the master.
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let seen = std::thread::spawn(move || {
        let (mut s, _) = proxy.accept().unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        s.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nContent-Length: 44\r\n\r\n{\"error\":{\"message\":\"the proxy said no ok\"}}").unwrap();
        String::from_utf8_lossy(&got).into_owned()
    });
    let out = Command::new(&weather)
        .arg("ping")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AGENTOS_URL", &m.url)
        .env("AGENTOS_TOKEN", &m.token)
        .env("HTTP_PROXY", &proxy_url)
        .output()
        .unwrap();
    let request = seen.join().unwrap();
    assert!(request.starts_with(&format!("POST {}/api/tools/weather/call HTTP/1.1", m.url)), "{request}");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the proxy said no ok"));

    // An https:// master: the whole agentos speaks TLS, and says it cannot reach it.
    let out = Command::new(&weather)
        .arg("ping")
        .env_clear()
        .env("AGENTOS_URL", m.url.replace("http://", "https://"))
        .env("AGENTOS_TOKEN", &m.token)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(err.starts_with("agentos-weather ping: cannot reach the master at https://"), "{err}");
    assert!(!err.contains("plain HTTP"), "the small shim answered instead of the whole agentos: {err}");

    // A shim copied rather than linked has neither agentos-shim-full nor agentos beside it: it
    // takes the first on PATH, and says where it looked when there is none.
    let copied = dir.path().join("copied");
    std::fs::create_dir(&copied).unwrap();
    std::fs::copy(&target, copied.join("agentos-weather")).unwrap();
    let on_path = dir.path().join("on-path");
    std::fs::create_dir(&on_path).unwrap();
    std::os::unix::fs::symlink(BIN, on_path.join("agentos")).unwrap();
    for (path, code, words) in [
        (&on_path, 7, "agentos-weather ping: cannot reach the master at https://"),
        (
            &copied,
            7,
            "agentos-shim: this call needs agentos-shim-full or the agentos binary, and neither is beside this one nor on PATH",
        ),
    ] {
        let out = Command::new(copied.join("agentos-weather"))
            .arg("ping")
            .env_clear()
            .env("PATH", path)
            .env("AGENTOS_URL", m.url.replace("http://", "https://"))
            .env("AGENTOS_TOKEN", &m.token)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "PATH={}: {err}", path.display());
        assert!(err.contains(words), "PATH={}: {err}", path.display());
    }
}

#[test]
fn install_shims_never_replaces_a_file_that_is_not_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // As `agentos-shim` itself would be, installing into the binaries' folder a toolkit `shim`.
    std::fs::write(bin.join("agentos-weather"), "a program of its own").unwrap();
    let out = run_as(&m, &m.token, Path::new(BIN), &["install-shims", "--dir", bin.to_str().unwrap()], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stderr.contains("is a file, not a link"), "{}", out.stderr);
    assert_eq!(std::fs::read_to_string(bin.join("agentos-weather")).unwrap(), "a program of its own");
    // A file given as the folder: refused, saying so (it was "cannot create …: File exists").
    let file = bin.join("agentos-weather");
    let out = run_as(&m, &m.token, Path::new(BIN), &["install-shims", "--dir", file.to_str().unwrap()], None);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("is not a folder; give --dir a folder"), "{}", out.stderr);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "a program of its own");
    // Nor a link someone made to another program; a link to an earlier installation's shim is
    // ours, and replaced.
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::os::unix::fs::symlink("/bin/true", other.join("agentos-weather")).unwrap();
    let out = run_as(&m, &m.token, Path::new(BIN), &["install-shims", "--dir", other.to_str().unwrap()], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stderr.contains("links to /bin/true, not to agentos"), "{}", out.stderr);
    assert!(out.stdout.contains("1 not linked"), "{}", out.stdout);
    assert_eq!(std::fs::read_link(other.join("agentos-weather")).unwrap(), Path::new("/bin/true"));
    std::fs::remove_file(other.join("agentos-weather")).unwrap();
    std::os::unix::fs::symlink("/opt/old/agentos-shim", other.join("agentos-weather")).unwrap();
    let out = run_as(&m, &m.token, Path::new(BIN), &["install-shims", "--dir", other.to_str().unwrap()], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_ne!(std::fs::read_link(other.join("agentos-weather")).unwrap(), Path::new("/opt/old/agentos-shim"));
}

/// `agentos-weather` twice: a link to the small shim (installed), and one to the whole `agentos`
/// called as a toolkit. The same code answers both.
fn small_and_whole(m: &Master, dir: &Path) -> [std::path::PathBuf; 2] {
    let bin = dir.join("bin");
    install(m, &bin);
    let whole = dir.join("whole").join("agentos-weather");
    std::fs::create_dir(whole.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(BIN, &whole).unwrap();
    [bin.join("agentos-weather"), whole]
}

#[test]
fn an_argument_that_is_not_utf8_and_an_output_that_cannot_take_the_answer_each_fail_in_one_line() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    for program in small_and_whole(&m, dir.path()) {
        let shown = program.display();
        let command = |args: &[&std::ffi::OsStr], stdout: std::process::Stdio| {
            Command::new(&program)
                .args(args)
                .env_clear()
                .env("AGENTOS_URL", &m.url)
                .env("AGENTOS_TOKEN", &m.token)
                .stdout(stdout)
                .output()
                .unwrap()
        };
        let city = std::ffi::OsStr::from_bytes(b"Par\xffis");
        let out = command(&["forecast".as_ref(), "--city".as_ref(), city], std::process::Stdio::piped());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{shown}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{shown}: {stderr}");
        assert!(stderr.contains("argument 3 (\"Par\\xFFis\") is not UTF-8 text"), "{shown}: {stderr}");
        assert!(out.stdout.is_empty(), "{shown}");

        // An answer with characters that do not show as themselves (a C1 control a terminal may
        // take for the start of a command, a bidirectional override, a line separator): written
        // as their JSON escapes, the same value, inert in a terminal.
        let city = "Par\u{9b}2Jis\u{202e}gpj.exe\u{2028}";
        let out = command(&["forecast".as_ref(), "--city".as_ref(), city.as_ref()], std::process::Stdio::piped());
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{shown}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!stdout.trim_end().chars().any(agentos_core::name::unseen), "{shown}: {stdout:?}");
        assert!(stdout.contains(r"Par\u009b2Jis\u202egpj.exe\u2028"), "{shown}: {stdout}");
        let v: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["result"]["city"], city, "{shown}");

        // A full output: the call ran, and its answer could not be written.
        let full = || std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap().into();
        let out = command(&["ping".as_ref()], full());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{shown}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{shown}: {stderr}");
        assert!(
            stderr.starts_with(
                "agentos-weather ping: the call ran, but its answer is lost: cannot write to standard output:"
            ),
            "{shown}: {stderr}"
        );
        // Help as well, which calls nothing.
        let out = command(&["--help".as_ref()], full());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{shown}: {stderr}");
        assert!(stderr.starts_with("agentos-weather: cannot write to standard output:"), "{shown}: {stderr}");
    }
}

#[test]
fn an_agentos_url_that_names_no_master_is_refused_in_one_line_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    for program in small_and_whole(&m, dir.path()) {
        for (url, why) in [
            ("http://127.0.0.1:99999", "(invalid port number)"),
            ("ftp://127.0.0.1", "(its scheme is \"ftp\", not http or https)"),
            ("127.0.0.1:7420", "(relative URL without a base)"),
            ("http://", "(empty host)"),
        ] {
            let out = Command::new(&program)
                .arg("ping")
                .env_clear()
                .env("AGENTOS_URL", url)
                .env("AGENTOS_TOKEN", &m.token)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let shown = format!("{} with {url}", program.display());
            assert_eq!(out.status.code(), Some(2), "{shown}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{shown}: {stderr}");
            assert!(
                stderr.contains(&format!("AGENTOS_URL {url:?} is not a master's address {why}")),
                "{shown}: {stderr}"
            );
            assert!(out.stdout.is_empty(), "{shown}");
        }
    }
}

/// The program headers' types of the ELF file at `path`, and its type (2 `ET_EXEC`, 3 `ET_DYN`).
fn elf_kinds(path: &Path) -> (u16, Vec<u32>) {
    let elf = std::fs::read(path).unwrap();
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap());
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap());
    assert_eq!(&elf[..5], b"\x7fELF\x02", "{} is a 64-bit ELF file", path.display());
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36) as usize, u16_at(0x38) as usize);
    (u16_at(16), (0..phnum).map(|i| u32_at(phoff + i * phentsize)).collect())
}

const PT_INTERP: u32 = 3;
const PT_DYNAMIC: u32 = 2;

/// On x86_64 Linux with glibc `agentos-shim-full` is linked as a static PIE (`scripts/linker`):
/// no program interpreter, so no dynamic loader runs at each call. A build that lost the link
/// rule (a moved `.cargo/config.toml`, a renamed binary) would still work, only slower: this
/// says so. The lean `agentos-shim` (build.rs) is a plain static program: no interpreter, no
/// dynamic section, no C library.
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
#[test]
fn the_shims_are_static_programs_with_no_program_interpreter() {
    let full = Path::new(BIN).with_file_name("agentos-shim-full");
    let (kind, types) = elf_kinds(&full);
    // ET_DYN: position independent, as a static PIE is (a plain static binary is ET_EXEC).
    assert_eq!(kind, 3, "{} is position independent", full.display());
    assert!(
        !types.contains(&PT_INTERP),
        "{} names a program interpreter: it is linked dynamically (does the C library have its static archive, libc.a?)",
        full.display()
    );
    // A static PIE relocates itself, from its own dynamic section, and needs no library.
    assert!(types.contains(&PT_DYNAMIC), "{}", full.display());
    let lean = Path::new(BIN).with_file_name("agentos-shim");
    let (kind, types) = elf_kinds(&lean);
    assert_eq!(kind, 2, "{} is a plain static program", lean.display());
    assert!(!types.contains(&PT_INTERP) && !types.contains(&PT_DYNAMIC), "{}: {types:?}", lean.display());
    let size = std::fs::metadata(&lean).unwrap().len();
    assert!(size < 256 << 10, "{} is {size} bytes: it carries more than its own code", lean.display());
    let whole = std::fs::read(BIN).unwrap();
    let interp = |e: &[u8]| e.windows(b"ld-linux-x86-64".len()).any(|w| w == b"ld-linux-x86-64");
    assert!(interp(&whole), "the whole agentos stays dynamically linked");
}

/// The lean `agentos-shim` makes a plain call itself and hands every other to
/// `agentos-shim-full`: before sending, as if that had been called; after, with the answer it
/// got. Whichever does it, a caller sees the same output, line and exit code, and a call that
/// was sent is never sent again (a failing tool that counts its runs ran once).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[test]
fn the_lean_shim_makes_plain_calls_itself_and_hands_the_rest_over_without_sending_twice() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    let api = m.client();
    greet_script(&api);
    // Where the job's user may write, whoever the executor runs jobs as.
    let runs_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(runs_dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let runs = runs_dir.path().join("runs");
    let (status, e) = api.command(json!({
        "type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": "counted", "name": "Counted", "runtime": "sh",
        "content": format!("echo ran >> {}\necho 'no luck' >&2\nexit 3", runs.display()),
    }));
    assert_eq!(status, 200, "{e}");
    let _e = Executor::start(&m, &dir.path().join("executor"), "e1", &[]);
    let bin = dir.path().join("bin");
    install(&m, &bin);
    assert_eq!(std::fs::read_link(bin.join("agentos-greet")).unwrap(), Path::new(BIN).with_file_name("agentos-shim"));
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    for t in ["greet", "weather", "counted"] {
        std::os::unix::fs::symlink(
            Path::new(BIN).with_file_name("agentos-shim-full"),
            full.join(format!("agentos-{t}")),
        )
        .unwrap();
    }
    let file = dir.path().join("name.txt");
    std::fs::write(&file, "from a file").unwrap();
    let file = file.to_str().unwrap();
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("greet", vec!["run", "--name", "Zoë \"the\" \\ one\n"], m.token.as_str()),
        ("greet", vec!["run", "--name", "x", "--excited"], &m.token),
        ("greet", vec!["run", "--json", r#"{"name": "json"}"#], &m.token),
        ("greet", vec!["run", "--name-file", file], &m.token),
        ("greet", vec!["run", "--name", "fail"], &m.token),
        ("greet", vec!["run", "--name", "fail", "--json"], &m.token),
        ("greet", vec!["run"], &m.token),
        ("greet", vec!["nope", "--json"], &m.token),
        ("greet", vec!["--help"], &m.token),
        ("greet", vec!["run", "--help"], &m.token),
        ("greet", vec!["run", "--name", "x"], "not-a-token"),
        ("weather", vec!["ping"], &m.token),
        ("weather", vec!["slow", "--seconds", "30"], &m.token),
    ];
    for (toolkit, args, token) in &cases {
        let name = format!("agentos-{toolkit}");
        let lean = run_as(&m, token, &bin.join(&name), args, None);
        let whole = run_as(&m, token, &full.join(&name), args, None);
        let shown = format!("{toolkit} {args:?}");
        assert_eq!((lean.code, &lean.stdout, &lean.stderr), (whole.code, &whole.stdout, &whole.stderr), "{shown}");
    }
    // Standard output closed: the memory file the answer is handed over in must not take its
    // number (and be read as standard output, or refused).
    for args in [&["nope"][..], &["run", "--name", "x"]] {
        let closed = |program: &Path| {
            let mut cmd = Command::new(program);
            cmd.args(args).env_clear().env("AGENTOS_URL", &m.url).env("AGENTOS_TOKEN", &m.token);
            // SAFETY: only closes a descriptor in the child before it runs the program.
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(|| {
                    libc::close(1);
                    Ok(())
                });
            }
            let out = cmd.output().unwrap();
            (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
        };
        let lean = closed(&bin.join("agentos-greet"));
        assert_eq!(lean, closed(&full.join("agentos-greet")), "{args:?}");
        assert!(!lean.1.contains("AGENTOS_SHIM_ANSWER_FD"), "{lean:?}");
    }

    // Sent once, failed, handed over with its answer: the tool ran once.
    let out = run(&m, &bin.join("agentos-counted"), &["run"], None);
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert_eq!(out.stderr, "agentos-counted run: counted run failed with exit code 3: no luck\n");
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "ran\n", "the call ran once");

    // The last sequence seen is kept where the whole shim keeps it (`HOME`, `XDG_RUNTIME_DIR`,
    // `AGENTOS_SEQ_FILE`), and sent as `Agentos-Min-Seq` from there.
    let homes = tempfile::tempdir().unwrap();
    let seq_call = |program: &Path, var: &str, value: &Path| {
        let out = Command::new(program)
            .args(["run", "--name", "seq"])
            .env_clear()
            .env("AGENTOS_URL", &m.url)
            .env("AGENTOS_TOKEN", &m.token)
            .env(var, value)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let name = format!("seq-{}", &agentos_core::sha256_hex(m.token.as_bytes())[..16]);
    let seen = |file: &Path| -> u64 {
        std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display())).trim().parse().unwrap()
    };
    let (lean_home, full_home) = (homes.path().join("lean"), homes.path().join("full"));
    assert_eq!(seq_call(&bin.join("agentos-greet"), "HOME", &lean_home).0, Some(0));
    assert_eq!(seq_call(&full.join("agentos-greet"), "HOME", &full_home).0, Some(0));
    let (lean_seen, full_seen) =
        (seen(&lean_home.join(".cache/agentos").join(&name)), seen(&full_home.join(".cache/agentos").join(&name)));
    assert!(lean_seen > 0 && lean_seen <= full_seen, "{lean_seen} {full_seen}");
    let xdg = homes.path().join("xdg");
    assert_eq!(seq_call(&bin.join("agentos-greet"), "XDG_RUNTIME_DIR", &xdg).0, Some(0));
    assert!(seen(&xdg.join("agentos").join(&name)) >= full_seen);
    let ahead = homes.path().join("ahead");
    std::fs::write(&ahead, format!("{}\n", full_seen + 1000)).unwrap();
    let lean = seq_call(&bin.join("agentos-greet"), "AGENTOS_SEQ_FILE", &ahead);
    let whole = seq_call(&full.join("agentos-greet"), "AGENTOS_SEQ_FILE", &ahead);
    assert_ne!(lean.0, Some(0), "the sequence ahead of the master was sent: {lean:?}");
    assert_eq!(lean, whole);
    assert_eq!(seen(&ahead), full_seen + 1000, "a sequence behind what was seen leaves the file alone");

    // Alone, without agentos-shim-full or agentos beside it or on PATH: a plain call succeeds
    // (it never needed them); a failure, which it hands over, says what is missing.
    let alone = dir.path().join("alone");
    std::fs::create_dir(&alone).unwrap();
    std::fs::copy(Path::new(BIN).with_file_name("agentos-shim"), alone.join("agentos-shim")).unwrap();
    std::os::unix::fs::symlink(alone.join("agentos-shim"), alone.join("agentos-greet")).unwrap();
    let call = |args: &[&str]| {
        Command::new(alone.join("agentos-greet"))
            .args(args)
            .env_clear()
            .env("AGENTOS_URL", &m.url)
            .env("AGENTOS_TOKEN", &m.token)
            .output()
            .unwrap()
    };
    let out = call(&["run", "--name", "alone"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "{\"ok\":true,\"result\":{\"greeting\":\"Hello, alone.\"}}\n");
    // An answer with floats in it is printed by the lean shim too, as the whole shim prints it.
    std::os::unix::fs::symlink(alone.join("agentos-shim"), alone.join("agentos-weather")).unwrap();
    let forecast = |program: &Path| {
        Command::new(program)
            .args(["forecast", "--city", "Paris", "--days", "4", "--fahrenheit"])
            .env_clear()
            .env("AGENTOS_URL", &m.url)
            .env("AGENTOS_TOKEN", &m.token)
            .output()
            .unwrap()
    };
    let (lean, whole) = (forecast(&alone.join("agentos-weather")), forecast(&full.join("agentos-weather")));
    assert_eq!(lean.status.code(), Some(0), "{}", String::from_utf8_lossy(&lean.stderr));
    assert_eq!((&lean.stdout, &lean.stderr), (&whole.stdout, &whole.stderr));
    assert!(
        String::from_utf8_lossy(&lean.stdout).contains("\"temperature\":68.0"),
        "{}",
        String::from_utf8_lossy(&lean.stdout)
    );
    let out = call(&["nope"]);
    assert_eq!(
        (out.status.code(), String::from_utf8_lossy(&out.stderr).as_ref()),
        (
            Some(1),
            "agentos-shim: the call was sent and answered with HTTP 404, but this call needs agentos-shim-full or the agentos binary, and neither is beside this one nor on PATH\n"
        )
    );
    let out = call(&["--help"]);
    assert_eq!(out.status.code(), Some(7), "nothing was sent: {}", String::from_utf8_lossy(&out.stderr));
}

/// `AGENTOS_SHIM_ANSWER_FD` set by anyone but the lean shim names no answer it left: the call
/// it stands for may have run, so it is refused rather than sent.
#[test]
fn a_handed_answer_that_is_not_the_lean_shims_is_refused_and_nothing_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_example(&dir.path().join("master"));
    let full = dir.path().join("agentos-weather");
    std::os::unix::fs::symlink(Path::new(BIN).with_file_name("agentos-shim-full"), &full).unwrap();
    let bogus = dir.path().join("bogus");
    std::fs::write(&bogus, "not an answer").unwrap();
    for (value, stdin) in [("0", None), ("x", None), ("3", Some(&bogus))] {
        let mut cmd = Command::new(&full);
        cmd.arg("ping").env_clear().env("AGENTOS_URL", &m.url).env("AGENTOS_TOKEN", &m.token);
        cmd.env("AGENTOS_SHIM_ANSWER_FD", value);
        if let Some(f) = stdin {
            // The file as descriptor 3 of the child, as the lean shim's memory file would be.
            let f = std::fs::File::open(f).unwrap();
            use std::os::fd::IntoRawFd;
            let fd = f.into_raw_fd();
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(move || if libc::dup2(fd, 3) < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) });
            }
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{value}: {err}");
        assert!(err.starts_with("agentos-weather ping: AGENTOS_SHIM_ANSWER_FD="), "{value}: {err}");
        assert!(err.contains("names no answer agentos-shim left; the call may have run"), "{value}: {err}");
    }
}

/// A server at an `http://` IPv4 address that answers every request with `answer`, and the
/// requests it got (head and body).
fn answering(answer: &'static str) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .map_or(0, |n| n.parse::<usize>().unwrap());
                    if body.len() >= len {
                        break;
                    }
                }
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            log.lock().unwrap().push(String::from_utf8_lossy(&got).into_owned());
            let _ = s.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                    answer.len()
                )
                .as_bytes(),
            );
        }
    });
    (url, seen)
}

/// An answer the lean shim would print otherwise than the whole shim (not `serde_json`'s own
/// text: spaces, keys out of order, an escape it does not write) is handed over, and printed as
/// the whole shim prints it; a sequence file of 4 KiB or more is left to the whole shim to read.
/// Either way the request is sent once.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[test]
fn the_lean_shim_hands_over_an_answer_it_would_print_otherwise_and_a_sequence_file_it_does_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let lean = dir.path().join("lean").join("agentos-greet");
    let full = dir.path().join("full").join("agentos-greet");
    for (link, to) in [(&lean, "agentos-shim"), (&full, "agentos-shim-full")] {
        std::fs::create_dir(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(Path::new(BIN).with_file_name(to), link).unwrap();
    }
    let (url, seen) = answering(r#"{ "ok": true, "result": {"b": 1.50, "a": "\u00e9"} }"#);
    let padded = dir.path().join("seq");
    std::fs::write(&padded, format!("{}42\n", " ".repeat(5000))).unwrap();
    let call = |program: &Path| {
        let out = Command::new(program)
            .args(["run", "--name", "x"])
            .env_clear()
            .env("AGENTOS_URL", &url)
            .env("AGENTOS_TOKEN", "t")
            .env("AGENTOS_SEQ_FILE", &padded)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let from_lean = call(&lean);
    assert_eq!(from_lean, call(&full));
    assert_eq!(from_lean.1, "{\"ok\":true,\"result\":{\"a\":\"é\",\"b\":1.5}}\n");
    let requests = seen.lock().unwrap().clone();
    assert_eq!(requests.len(), 2, "one request from each shim: {requests:?}");
    assert!(requests.iter().all(|r| r.contains("\r\nAgentos-Min-Seq: 42\r\n")), "{requests:?}");
}

/// Answers as they come off the wire (chunks, pieces with pauses between them, a body that ends
/// with the connection, one cut short, trailers, a server that is not HTTP): the lean shim,
/// whether it prints the answer itself or hands it over, says what the whole shim says, with the
/// same exit code, and leaves the same sequence file.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[test]
fn the_lean_shim_reads_answers_off_the_wire_as_the_whole_shim_does() {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let lean = dir.path().join("lean").join("agentos-greet");
    let full = dir.path().join("full").join("agentos-greet");
    for (link, to) in [(&lean, "agentos-shim"), (&full, "agentos-shim-full")] {
        std::fs::create_dir(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(Path::new(BIN).with_file_name(to), link).unwrap();
    }
    // What the server writes for each connection: pieces, with a pause after each but the last.
    let pieces: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let serving = pieces.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") || !got.ends_with(b"}") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            for piece in serving.lock().unwrap().clone() {
                if s.write_all(&piece).is_err() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(15));
            }
        }
    });
    let chunked = |parts: &[&str]| {
        let mut raw =
            String::from("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n");
        for p in parts {
            raw.push_str(&format!("{:X}\r\n{p}\r\n", p.len()));
        }
        raw + "0\r\n\r\n"
    };
    let ok = r#"{"ok":true,"result":{"celsius":21.5,"list":[1,2,3],"name":"Zoë"}}"#;
    let with_length = |status: &str, body: &str| {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\nagentos-seq: 9\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("chunks, upper-case sizes", vec![chunked(&[&ok[..10], &ok[10..40], &ok[40..]])]),
        (
            "chunks with an extension and a trailer",
            vec![{
                let raw = chunked(&[ok]);
                let at = raw.find("\r\n\r\n").unwrap() + 4;
                let size_end = at + raw[at..].find("\r\n").unwrap();
                format!("{};x=y{}", &raw[..size_end], &raw[size_end..raw.len() - 2]) + "x-trailer: 1\r\n\r\n"
            }],
        ),
        ("a head and body in pieces", {
            let raw = with_length("200 OK", ok);
            vec![
                raw[..7].to_string(),
                raw[7..60].to_string(),
                raw[60..raw.len() - 5].to_string(),
                raw[raw.len() - 5..].to_string(),
            ]
        }),
        ("a chunked answer split inside a size", {
            let raw = chunked(&[ok]);
            let at = raw.find("\r\n\r\n").unwrap() + 5;
            vec![raw[..at].to_string(), raw[at..].to_string()]
        }),
        (
            "a body that ends with the connection",
            vec![format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{ok}")],
        ),
        ("a body cut short", vec![format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{}", ok.len() + 10, ok)]),
        ("a chunked body cut short", vec![chunked(&[ok])[..90].to_string()]),
        ("a float not in its shortest form", vec![with_length("200 OK", r#"{"ok":true,"result":{"x":1.50}}"#)]),
        ("a float halfway between two", vec![with_length("200 OK", r#"{"ok":true,"result":{"x":767892885155262.2}}"#)]),
        ("floats of 17 digits", vec![with_length("200 OK", SEVENTEEN)]),
        (
            "a float of 17 digits halfway between two",
            vec![with_length("200 OK", r#"{"ok":true,"result":{"x":1125899906842624.3}}"#)],
        ),
        (
            "17 digits that no float is written as",
            vec![with_length("200 OK", r#"{"ok":true,"result":{"x":3.0000000000000004e+17}}"#)],
        ),
        (
            "a tool's failure",
            vec![with_length(
                "422 Unprocessable Entity",
                r#"{"ok":false,"error":{"code":"tool_failed","message":"no luck"}}"#,
            )],
        ),
        ("a server error with no body", vec!["HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n".into()]),
        ("not HTTP", vec!["SSH-2.0-OpenSSH_9.2\r\n\r\n".into()]),
        (
            "a size that is not hex",
            vec!["HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n".into()],
        ),
        ("nothing at all", vec![String::new()]),
    ];
    let seq_dir = dir.path().join("seqs");
    std::fs::create_dir(&seq_dir).unwrap();
    for (what, raw) in cases {
        *pieces.lock().unwrap() = raw.into_iter().map(String::into_bytes).collect();
        let call = |program: &Path, seq: &Path| {
            let out = Command::new(program)
                .args(["run", "--name", "x"])
                .env_clear()
                .env("AGENTOS_URL", &url)
                .env("AGENTOS_TOKEN", "t")
                .env("AGENTOS_SEQ_FILE", seq)
                .output()
                .unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
                std::fs::read_to_string(seq).ok(),
            )
        };
        let from_lean = call(&lean, &seq_dir.join(format!("{what}.lean")));
        let from_full = call(&full, &seq_dir.join(format!("{what}.full")));
        assert_eq!(from_lean, from_full, "{what}");
        assert!(from_lean.0.is_some(), "{what}: {from_lean:?}");
        if what == "a server error with no body" {
            assert_eq!(from_lean.2, "agentos-greet run: the master's address answered HTTP 500 with an empty body\n");
        }
    }
    // A sequence file that is a folder: the same either way.
    *pieces.lock().unwrap() = vec![with_length("200 OK", ok).into_bytes()];
    let at_root = |program: &Path| {
        let out = Command::new(program)
            .args(["run", "--name", "x"])
            .env_clear()
            .env("AGENTOS_URL", &url)
            .env("AGENTOS_TOKEN", "t")
            .env("AGENTOS_SEQ_FILE", "/")
            .output()
            .unwrap();
        (out.status.code(), out.stdout, out.stderr)
    };
    assert_eq!(at_root(&lean), at_root(&full));

    // Floats of 17 digits are printed by the lean shim itself: a copy with nothing beside it
    // prints them as the whole shim does.
    let alone = dir.path().join("alone");
    std::fs::create_dir(&alone).unwrap();
    std::fs::copy(Path::new(BIN).with_file_name("agentos-shim"), alone.join("agentos-greet")).unwrap();
    *pieces.lock().unwrap() = vec![with_length("200 OK", SEVENTEEN).into_bytes()];
    let seventeen = |program: &Path| {
        let out = Command::new(program)
            .args(["run", "--name", "x"])
            .env_clear()
            .env("AGENTOS_URL", &url)
            .env("AGENTOS_TOKEN", "t")
            .env("AGENTOS_SEQ_FILE", dir.path().join("seventeen"))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let from_alone = seventeen(&alone.join("agentos-greet"));
    assert_eq!(from_alone, seventeen(&full));
    assert_eq!(from_alone.0, Some(0), "{from_alone:?}");
    assert!(from_alone.1.contains("0.30000000000000004"), "{from_alone:?}");
}

/// An answer whose floats take 17 digits, as a tool's computed values often do.
const SEVENTEEN: &str = r#"{"ok":true,"result":{"a":0.30000000000000004,"b":-2.2250738585072014e-308,"c":1.7976931348623157e+308,"d":5e-324,"e":123.45678901234568}}"#;
