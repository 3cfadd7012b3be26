//! The `agentos` command line against a real master: human output, `--json`, exit codes.

mod common;

use std::path::Path;
use std::process::Command;

use common::{BIN, Master};
use serde_json::{Value, json};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `agentos` as the operator (its token read from the master's data folder).
fn agentos(m: &Master, args: &[&str]) -> Run {
    run(Command::new(BIN)
        .args(args)
        .env("AGENTOS_URL", &m.url)
        .env("AGENTOS_DATA", &m.data)
        .env_remove("AGENTOS_TOKEN"))
}

/// `agentos` with an agent's token rather than the operator's.
fn agentos_as(m: &Master, token: &str, args: &[&str]) -> Run {
    run(Command::new(BIN).args(args).env("AGENTOS_URL", &m.url).env("AGENTOS_TOKEN", token))
}

fn run(cmd: &mut Command) -> Run {
    let out = cmd.output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn register_list_get_history_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let script = dir.path().join("hello.py");
    std::fs::write(&script, "print('hello')\n").unwrap();
    let schema = dir.path().join("input.json");
    std::fs::write(&schema, r#"{"type":"object","properties":{"name":{"type":"string"}}}"#).unwrap();

    let r = agentos(
        &m,
        &[
            "catalog",
            "register-script",
            "--id",
            "hello",
            "--runtime",
            "python3",
            "--file",
            script.to_str().unwrap(),
            "--model",
            "team",
            "--input-schema",
            schema.to_str().unwrap(),
            "--capability",
            "greeting",
            "--description",
            "Says hello",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.starts_with("registered hello in model team (local)"), "{}", r.stdout);

    let r = agentos(&m, &["catalog", "list", "--model", "team"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines[0].starts_with("ID") && lines[0].contains("SCOPE"), "{}", r.stdout);
    assert!(lines[1].starts_with("hello") && lines[1].contains("local") && lines[1].contains("team"), "{}", r.stdout);
    assert_eq!(lines.last().unwrap(), &"1 of 1 entries (from 0)");

    let r = agentos(&m, &["catalog", "get", "hello", "--model", "team", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let e: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(e["binding"]["filename"], "hello.py");
    assert_eq!(e["contract"]["operations"]["run"]["input"]["properties"]["name"]["type"], "string");
    assert_eq!(e["capabilities"][0], "greeting");

    let r = agentos(&m, &["catalog", "get", "hello", "--model", "team"]);
    assert!(
        r.stdout.contains("runtime:      python3") && r.stdout.contains("scope:        local (model team)"),
        "{}",
        r.stdout
    );

    std::fs::write(&script, "print('hello again')\n").unwrap();
    assert_eq!(
        agentos(
            &m,
            &[
                "catalog",
                "register-script",
                "--id",
                "hello",
                "--runtime",
                "python3",
                "--file",
                script.to_str().unwrap(),
                "--model",
                "team"
            ]
        )
        .code,
        0
    );
    let r = agentos(&m, &["catalog", "history", "hello", "--model", "team"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout.lines().filter(|l| l.contains("ToolRegistered")).count(), 2, "{}", r.stdout);

    let r = agentos(&m, &["models", "--json"]);
    let models: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(models.as_array().unwrap().len(), 2);

    // A full page of the audit says how to read on; the last one does not.
    let r = agentos(&m, &["audit", "--limit", "2"]);
    assert_eq!((r.code, r.stdout.lines().count()), (0, 2), "{}", r.stderr);
    let second: u64 = r.stdout.lines().nth(1).unwrap()[1..].split_whitespace().next().unwrap().parse().unwrap();
    assert!(r.stderr.contains(&format!("more may follow: agentos audit --after {second}")), "{}", r.stderr);
    let r = agentos(&m, &["audit", "--after", "2", "--limit", "1000"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stdout.is_empty() && !r.stderr.contains("more may follow"), "{}", r.stderr);
}

#[test]
fn failures_print_one_line_and_exit_with_a_distinct_code() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let script = dir.path().join("x.sh");
    std::fs::write(&script, "echo").unwrap();

    let r = agentos(&m, &["catalog", "get", "missing"]);
    assert_eq!(r.code, 4);
    assert!(r.stdout.is_empty());
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.starts_with("error: no tool \"missing\""), "{}", r.stderr);

    let r = agentos(
        &m,
        &["catalog", "register-script", "--id", "x", "--runtime", "perl", "--file", script.to_str().unwrap()],
    );
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("unknown runtime \"perl\""), "{}", r.stderr);

    let r = agentos(&m, &["catalog", "list", "--token", "aos_wrong"]);
    assert_eq!(r.code, 3, "{}", r.stderr);

    let r = agentos(&m, &["catalog", "list", "--url", "http://127.0.0.1:9"]);
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert!(r.stderr.contains("cannot reach the master"), "{}", r.stderr);
}

#[test]
fn run_and_executors_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let r = agentos(&m, &["executor-token", "create", "w1"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let token = r.stdout.lines().last().unwrap().to_string();
    assert!(token.starts_with("aos_"), "{}", r.stdout);
    let token_file = dir.path().join("w1.token");
    std::fs::write(&token_file, &token).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut executor = Command::new(BIN)
        .args(["executor", "--master", &m.url, "--workspace"])
        .arg(dir.path().join("ws"))
        .arg("--token-file")
        .arg(&token_file)
        .env("AGENTOS_LOG", "warn")
        .spawn()
        .unwrap();
    common::wait_for("w1 polling", || agentos(&m, &["executors"]).stdout.contains("w1"));
    let r = agentos(&m, &["executors"]);
    assert!(r.stdout.lines().any(|l| l.starts_with("w1") && l.contains("polling")), "{}", r.stdout);

    let script = dir.path().join("greet.sh");
    std::fs::write(&script, "read -r input; echo \"hi $1 $input\"; echo warn >&2; exit 7").unwrap();
    assert_eq!(
        agentos(
            &m,
            &["catalog", "register-script", "--id", "greet", "--runtime", "sh", "--file", script.to_str().unwrap()]
        )
        .code,
        0
    );
    let r = agentos(&m, &["run", "greet", "--input", "{\"a\":1}", "--", "bob"]);
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert_eq!(r.stdout, "hi bob {\"a\":1}\n");
    assert_eq!(r.stderr, "warn\n");
    let r = agentos(&m, &["run", "greet", "--json"]);
    assert_eq!(r.code, 7);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["exitCode"], 7);
    assert_eq!(v["executor"], "w1");
    // A tool that is not there: 404 before any job is queued, exit 4 as for a shim (it was a
    // job that failed at hand-out, answered 200, exit 1).
    let r = agentos(&m, &["run", "missing-tool"]);
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(r.stderr.contains("no tool \"missing-tool\"") && r.stderr.contains("HTTP 404"), "{}", r.stderr);
    let r = agentos(&m, &["run", "greet", "--env", "LD_PRELOAD=/x.so"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("args.env.LD_PRELOAD may not be set") && r.stderr.contains("HTTP 400"), "{}", r.stderr);
    let r = agentos(&m, &["run", "greet", "--input", "{not json"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    // The tool's own output, which standard output cannot take: the run is reported as failed
    // in one line after the tool's own stderr (its output went nowhere before, with exit 7).
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = Command::new(BIN)
        .args(["run", "greet", "--", "bob"])
        .env("AGENTOS_URL", &m.url)
        .env("AGENTOS_DATA", &m.data)
        .env_remove("AGENTOS_TOKEN")
        .stdin(std::process::Stdio::null())
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert_eq!(lines[0], "warn");
    assert!(lines[1].starts_with("error: cannot write to standard output: "), "{stderr}");

    unsafe {
        libc::kill(executor.id() as i32, libc::SIGTERM);
    }
    assert!(executor.wait().unwrap().success());
}

/// Regression: `agentos up` gives its local executor a new credential at every start, and the
/// executor's file on the workspace named it by that credential; after a kill -9 the next start
/// took its predecessor for another executor's and kept its file as `.dead` for 30 days.
#[test]
fn up_killed_and_started_again_takes_its_own_executors_file_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let start = || {
        let mut up = Command::new(BIN)
            .args(["up", "--run-as", "current", "--listen", "127.0.0.1:0", "--data"])
            .arg(&data)
            .env("AGENTOS_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(up.stdout.take().unwrap()).lines();
        let url = lines.next().unwrap().unwrap().rsplit(' ').next().unwrap().to_string();
        std::thread::spawn(move || for _ in lines {});
        let token = std::fs::read_to_string(data.join("operator.token")).unwrap().trim().to_string();
        (up, common::Api { url, token: Some(token), http: common::http() })
    };
    let files = || {
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join("data.work"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("executor."))
            .collect();
        names.sort();
        names
    };
    let (mut first, api) = start();
    assert_eq!(api.register("hi", "sh", "echo hi", None).0, 200);
    assert_eq!(api.invoke("hi", serde_json::json!({})).1["stdout"], "hi\n");
    let before = files();
    assert_eq!(before.len(), 1, "{before:?}");
    first.kill().unwrap();
    first.wait().unwrap();
    let (mut second, api) = start();
    // A job, so that the new executor's first poll is answered and its predecessor's file goes.
    assert_eq!(api.invoke("hi", serde_json::json!({})).1["stdout"], "hi\n");
    let after = files();
    assert_eq!(after.len(), 1, "the predecessor's file is gone, not kept as another's: {after:?}");
    assert!(after[0].ends_with(".instance") && after != before, "{before:?} → {after:?}");
    unsafe {
        libc::kill(second.id() as i32, libc::SIGTERM);
    }
    assert!(second.wait().unwrap().success());
}

#[test]
fn up_runs_a_master_with_a_local_executor() {
    let dir = tempfile::tempdir().unwrap();
    // Scripts run as nobody (this test runs as root), from a workspace beside the data folder.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("data");
    // A lease of 1 s: the 2.5 s job below finishes only if its heartbeats reach the master.
    let mut up = Command::new(BIN)
        .args(["up", "--listen", "127.0.0.1:0", "--lease-ms", "1000", "--data"])
        .arg(&data)
        .env("AGENTOS_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let log = {
        let stderr = up.stderr.take().unwrap();
        std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default())
    };
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(up.stdout.take().unwrap()).lines();
    let url = lines.next().unwrap().unwrap().rsplit(' ').next().unwrap().to_string();
    let rest: Vec<String> = lines.by_ref().take(5).map(|l| l.unwrap()).collect();
    assert!(rest.iter().any(|l| l.contains("local executor")), "{rest:?}");
    std::thread::spawn(move || for _ in lines {});
    let api = common::Api {
        url,
        token: Some(std::fs::read_to_string(data.join("operator.token")).unwrap().trim().to_string()),
        http: common::http(),
    };
    assert_eq!(api.register("hello", "sh", "echo \"hello, $1\"", None).0, 200);
    let (status, r) = api.invoke("hello", serde_json::json!({"argv": ["world"]}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "hello, world\n");
    assert_eq!(r["executor"], "local");
    assert_eq!(api.register("slow", "sh", "sleep 2.5; echo done", None).0, 200);
    let (status, r) = api.invoke("slow", serde_json::json!({}));
    assert_eq!(status, 200, "{r}");
    assert_eq!((r["stdout"].as_str(), r["attempt"].as_u64()), (Some("done\n"), Some(1)), "{r}");
    // The executor sits in the master's process and calls it directly, not over HTTP.
    let executors = api.get("/api/executors");
    assert!(executors.1.to_string().contains("\"local\""), "{executors:?}");
    unsafe {
        libc::kill(up.id() as i32, libc::SIGTERM);
    }
    assert!(up.wait().unwrap().success());
    let log = log.join().unwrap();
    assert!(log.contains("executor polling") && log.contains("the master in this process"), "{log}");
}

#[test]
fn nets_from_the_command_line_with_a_yaml_document() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let doc = dir.path().join("net.yaml");
    std::fs::write(
        &doc,
        "model: greet\nplaces: [p-in, p-out]\ntransitions:\n  - id: hello\n    kind: map\n    presets: {who: {place: p-in}}\n    postsets: {out: {place: p-out}}\n    action: {template: {greeting: 'hello ${.who.data.name}'}}\n    emit: [{to: out}]\n",
    )
    .unwrap();
    let r = agentos(&m, &["net", "apply", doc.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("hello") && r.stdout.contains("stopped"), "{}", r.stdout);
    assert_eq!(agentos(&m, &["net", "put", "p-in", "{\"name\":\"ada\"}", "--model", "greet"]).code, 0);
    let r = agentos(&m, &["net", "fire", "hello", "--model", "greet"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("fired"), "{}", r.stdout);
    let r = agentos(&m, &["net", "tokens", "p-out", "--model", "greet", "--json"]);
    let tokens: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(tokens[0]["data"]["greeting"], "hello ada");
    std::fs::write(
        &doc,
        "model: greet\nplaces: [p-in]\ntransitions:\n  - {id: x, kind: map, presets: {a: {place: nowhere}}}\n",
    )
    .unwrap();
    let r = agentos(&m, &["net", "apply", doc.to_str().unwrap()]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("/transitions/0/presets/a/place"), "{}", r.stderr);

    // With no --model (and none in the document), the commands act in the caller's home model,
    // the operator's `default`, as the README says of every command.
    std::fs::write(&doc, "places: [p-home]\ntransitions: []\n").unwrap();
    let r = agentos(&m, &["net", "apply", doc.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(agentos(&m, &["net", "put", "p-home", "{\"n\":1}"]).code, 0);
    let r = agentos(&m, &["net", "tokens", "p-home", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let tokens: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(tokens[0]["data"], json!({"n": 1}));
    assert_eq!(m.client().token_data("default", "p-home"), vec![json!({"n": 1})]);
    // A place is read a page at a time, and the page says when more follow.
    for n in 2..=5 {
        assert_eq!(agentos(&m, &["net", "put", "p-home", &format!("{{\"n\":{n}}}")]).code, 0);
    }
    let r = agentos(&m, &["net", "tokens", "p-home", "--limit", "2", "--offset", "1", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let tokens: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(tokens.as_array().unwrap().iter().map(|t| t["data"]["n"].clone()).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(r.stderr.trim(), "p-home holds more tokens than these 2: --offset 3 reads on");
    let r = agentos(&m, &["net", "tokens", "p-home", "--limit", "2", "--offset", "3"]);
    assert_eq!((r.code, r.stdout.lines().count(), r.stderr.as_str()), (0, 2, ""), "{}", r.stdout);
    let r = agentos(&m, &["net", "tokens", "p-home", "--limit", "0"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
}

/// Regression: log lines written to a file (`agentos up 2> log`) carried colour codes.
#[test]
fn logs_written_to_a_file_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("master.log");
    let mut m = common::Master::start_logged(&dir.path().join("data"), &log, &[]);
    assert_eq!(m.client().get("/api/tool-catalog").0, 200);
    m.terminate();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.lines().count() > 2, "the master logged nothing: {text}");
    assert!(!text.contains('\u{1b}'), "colour codes in a log file: {text:?}");
}

/// Regression: `agentos prompt | head` panicked ("failed printing to stdout: Broken pipe") when
/// the reader left before the output was written; a command ends quietly there.
#[test]
fn a_command_whose_reader_has_left_ends_without_a_panic() {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let mut m = Master::start(&dir.path().join("data"));
    let mut fds = [0; 2];
    // SAFETY: a pipe's two ends, each owned below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    let out = Command::new(BIN)
        .args(["prompt", "--url", &m.url, "--token", &m.token])
        .stdout(std::process::Stdio::from(write))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "ended by the closed pipe: {:?} {stderr}", out.status);
    m.terminate();
}

/// Regression: a command whose standard output cannot take its answer (`> /dev/full`) panicked
/// ("failed printing to stdout: No space left on device"); it now says so in one line and exits 1.
#[test]
fn a_command_whose_output_cannot_be_written_fails_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Master::start(&dir.path().join("data"));
    // A tool, so that every listing below has a line to write.
    let script = dir.path().join("hello.sh");
    std::fs::write(&script, "echo hello").unwrap();
    let reg = agentos(
        &m,
        &[
            "catalog",
            "register-script",
            "--id",
            "hello",
            "--runtime",
            "sh",
            "--file",
            script.to_str().unwrap(),
            "--token",
            &m.token,
        ],
    );
    assert_eq!(reg.code, 0, "{}", reg.stderr);
    let commands: [&[&str]; 5] =
        [&["catalog", "list"], &["models", "--json"], &["prompt"], &["list-tools"], &["executors"]];
    for args in commands {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out =
            Command::new(BIN).args(args).args(["--url", &m.url, "--token", &m.token]).stdout(full).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: cannot write to standard output: "), "{args:?}: {stderr}");
        assert!(stderr.contains("its answer is lost"), "{args:?}: {stderr}");
    }
    m.terminate();
}

/// Regression: a message standard error could not take (`2>/dev/full`) panicked, and the
/// command ended with a panic's 101 instead of its own code. The message is lost either way;
/// the exit code still says what happened, for `agentos` and for a shim alike.
#[test]
fn a_message_standard_error_cannot_take_leaves_the_exit_code_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let shim = dir.path().join("agentos-nothing");
    std::os::unix::fs::symlink(Path::new(BIN).with_file_name("agentos-shim"), &shim).unwrap();
    // A port nothing listens on: bound, then closed.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let cases: [(&Path, Vec<&str>, i32); 5] = [
        (Path::new(BIN), vec!["catalog", "list", "--url", "http://127.0.0.1:99999", "--token", "t"], 2),
        (Path::new(BIN), vec!["catalog", "list", "--url", &down, "--token", "t"], 7),
        (Path::new(BIN), vec!["catalog", "no-such-command"], 2),
        (&shim, vec!["run"], 7),
        (&shim, vec!["run", "--no-such-flag"], 7),
    ];
    for (program, args, code) in cases {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = Command::new(program)
            .args(&args)
            .env("AGENTOS_URL", &down)
            .env("AGENTOS_TOKEN", "t")
            .stderr(full)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{} {args:?}", program.display());
    }
}

/// Regression: a client command given a URL that names no master tried it and failed as
/// "cannot reach the master at …: builder error" (exit 7, as if the master were down); it is
/// now refused before anything is sent, saying what is wrong (exit 2), as a shim's is.
#[test]
fn a_url_that_names_no_master_is_refused_in_one_line_before_anything_is_sent() {
    let cases: [(&str, &[&str], &str); 5] = [
        ("http://127.0.0.1:99999", &["catalog", "list"], "invalid port number"),
        ("ftp://127.0.0.1:7420", &["models"], "its scheme is \"ftp\""),
        ("127.0.0.1:7420", &["prompt"], "relative URL without a base"),
        ("http://", &["list-tools", "weather"], "empty host"),
        ("http://127.0.0.1:99999", &["run", "hello"], "invalid port number"),
    ];
    for (url, args, why) in cases {
        for by_flag in [false, true] {
            let mut cmd = Command::new(BIN);
            cmd.args(args).env_remove("AGENTOS_URL").env("AGENTOS_TOKEN", "aos_anything");
            if by_flag {
                cmd.args(["--url", url]);
            } else {
                cmd.env("AGENTOS_URL", url);
            }
            let out = cmd.output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{url} {args:?}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{url} {args:?}: {stderr}");
            assert!(stderr.contains(&format!("{url:?} is not a master's address")), "{url} {args:?}: {stderr}");
            assert!(stderr.contains(why), "{url} {args:?}: {stderr}");
            assert!(stderr.contains("set it like http://127.0.0.1:7420"), "{url} {args:?}: {stderr}");
        }
    }
}

/// Regression: an executor given a master's address that can never work polled it for ever,
/// logging "cannot reach the master: builder error" each time; it now refuses it at start.
#[test]
fn an_executor_refuses_at_start_a_master_address_that_names_no_master() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("http://127.0.0.1:99999", "invalid port number"),
        ("ftp://127.0.0.1:7420", "its scheme is \"ftp\""),
        ("http://127.0.0.1:7420, 127.0.0.1:7421", "\"127.0.0.1:7421\" is not a master's address"),
        (" , ", "names no master"),
    ];
    for (master, why) in cases {
        let (code, stderr) = exit_within(
            Command::new(BIN)
                .args(["executor", "--master", master, "--token", "aos_anything", "--workspace"])
                .arg(dir.path().join("ws"))
                .env_remove("AGENTOS_URL")
                .env("AGENTOS_LOG", "warn"),
        );
        assert_eq!(code, Some(2), "{master:?} still running or wrong code: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{master:?}: {stderr}");
        assert!(stderr.starts_with("error: --master (or AGENTOS_URL) "), "{master:?}: {stderr}");
        assert!(stderr.contains(why), "{master:?}: {stderr}");
    }
}

/// Regression: an executor took options that could never work and started anyway:
/// `--concurrency 1000000` held gigabytes before it first polled (a slot each, each a request
/// held open at the master), `--default-timeout-ms 0` timed every job out at once, a default
/// above the largest timeout could never be given, and `--max-output-bytes 0` kept no result.
/// Each is now refused at start in one line, exit 2, before anything is made or polled.
#[test]
fn an_executor_refuses_at_start_options_that_could_never_work() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 9] = [
        (&["--concurrency", "0"], "0 is not in 1..=1024"),
        (&["--concurrency", "1000000"], "1000000 is not in 1..=1024"),
        (&["--default-timeout-ms", "0"], "use 1 or more"),
        (&["--max-timeout-ms", "0"], "use 1 or more"),
        (&["--default-timeout-ms", "60000", "--max-timeout-ms", "1000"], "is above --max-timeout-ms 1000"),
        (&["--max-output-bytes", "0"], "use 1 or more"),
        (&["--run-as", "no-such-user"], "use nobody, current, or UID:GID"),
        (&["--path", "/usr/bin:bin"], "\"bin\" is not an absolute folder"),
        (&["--path", "/usr/bin::/bin"], "\"\" is not an absolute folder"),
    ];
    for (options, why) in cases {
        let workspace = dir.path().join("ws");
        let (code, stderr) = exit_within(
            Command::new(BIN)
                .args(["executor", "--master", "http://127.0.0.1:9", "--token", "aos_anything", "--workspace"])
                .arg(&workspace)
                .args(options)
                .env("AGENTOS_LOG", "warn"),
        );
        assert_eq!(code, Some(2), "{options:?} still running or wrong code: {stderr}");
        assert!(stderr.starts_with("error: "), "{options:?}: {stderr}");
        assert!(stderr.contains(why), "{options:?}: {stderr}");
        assert!(!workspace.exists(), "{options:?} made the workspace before refusing");
    }
    // `up`'s local executor likewise.
    let data = dir.path().join("data");
    let (code, stderr) = exit_within(
        Command::new(BIN).args(["up", "--executor-concurrency", "0", "--listen", "127.0.0.1:0", "--data"]).arg(&data),
    );
    assert_eq!(code, Some(2), "still running or wrong code: {stderr}");
    assert!(stderr.contains("0 is not in 1..=1024"), "{stderr}");
    assert!(!data.exists(), "the data folder was made before refusing");
}

/// Regression: `serve --listen 127.0.0.1:99999` created the data folder and its LOCK file, then
/// failed to bind with exit 1. A `--listen` that names no port or host is now refused at once,
/// exit 2, before the data folder is made; so is a `--max-result-bytes` below 16384, with which
/// a result stripped of its output could still be refused.
#[test]
fn serve_and_up_refuse_a_listen_address_that_cannot_exist_before_making_the_data_folder() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("127.0.0.1:99999", "port \"99999\" is not a number from 0 to 65535"),
        ("127.0.0.1", "no port"),
        (":7420", "host \"\" is not an address or a host name"),
        ("[::1:7420", "host \"[::1\" is not an address or a host name"),
        ("127.0.0.1:http", "port \"http\" is not a number"),
    ];
    for command in ["serve", "up"] {
        // A result limit no result could meet once its output is dropped.
        let data = dir.path().join("data");
        let (code, stderr) = exit_within(
            Command::new(BIN)
                .args([command, "--max-result-bytes", "100", "--listen", "127.0.0.1:0", "--data"])
                .arg(&data),
        );
        assert_eq!(code, Some(2), "{command} --max-result-bytes 100: {stderr}");
        assert!(stderr.contains("use 16384 or more"), "{command} --max-result-bytes 100: {stderr}");
        assert!(!data.exists(), "{command} --max-result-bytes 100 made the data folder");
        for (listen, why) in cases {
            let data = dir.path().join("data");
            let (code, stderr) =
                exit_within(Command::new(BIN).args([command, "--listen", listen, "--data"]).arg(&data));
            assert_eq!(code, Some(2), "{command} --listen {listen}: {stderr}");
            assert!(stderr.contains(why) && stderr.contains("use HOST:PORT"), "{command} --listen {listen}: {stderr}");
            assert!(!data.exists(), "{command} --listen {listen} made the data folder");
        }
    }
    // A host name still starts.
    for listen in ["localhost:0"] {
        let data = dir.path().join(format!("ok-{}", listen.len()));
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", listen, "--data"])
            .arg(&data)
            .env("AGENTOS_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !data.join("operator.token").exists() && std::time::Instant::now() < deadline {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let started = data.join("operator.token").exists() && child.try_wait().unwrap().is_none();
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        assert!(started, "serve --listen {listen} did not start: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Runs a command that should end at once and kills it after 20 s if it does not: its exit code
/// (`None` when it had to be killed) and its standard error.
fn exit_within(cmd: &mut Command) -> (Option<i32>, String) {
    let mut child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let _ = child.wait();
    (status.and_then(|s| s.code()), stderr)
}

/// A job run with `--async` is waited for, read and cancelled by its id, by an agent that may
/// run scripts and nothing else (no `r`): its whole output, past what a result keeps inline, is
/// read by the job's id.
#[test]
fn an_async_run_is_waited_for_read_and_cancelled_by_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_with(&dir.path().join("master"), &["--lease-ms", "900"]);
    let api = m.client();
    let _e = common::Executor::start(&m, &dir.path().join("e"), "e1", &[]);
    api.register("greet", "sh", "echo \"hi $1\"; echo warn >&2; exit 7", None);
    api.register("loud", "python3", "import sys\nsys.stdout.write('a' * 149999 + 'z')", None);
    api.register("hang", "sh", "sleep 60", None);
    let agent = api.agent("runner", "--x------s");
    let token = agent.token.as_deref().unwrap();

    let r = agentos_as(&m, token, &["run", "loud"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.len() == 150_000 && r.stdout.ends_with("az"), "{} bytes", r.stdout.len());

    let r = agentos_as(&m, token, &["run", "greet", "--async", "--", "bob"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let id = r.stdout.trim().to_string();
    assert!(id.starts_with("job-"), "{}", r.stdout);
    let r = agentos_as(&m, token, &["job", "wait", &id]);
    assert_eq!((r.code, r.stdout.as_str(), r.stderr.as_str()), (7, "hi bob\n", "warn\n"));
    let r = agentos_as(&m, token, &["job", "show", &id]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains(&format!("job {id} in runner: finished, exit code 7")), "{}", r.stdout);
    assert!(r.stdout.contains("on e1"), "{}", r.stdout);
    let r = agentos_as(&m, token, &["job", "output", &id, "--stderr"]);
    assert_eq!((r.code, r.stdout.as_str()), (0, "warn\n"), "{}", r.stderr);

    let r = agentos_as(&m, token, &["run", "loud", "--async"]);
    let loud = r.stdout.trim().to_string();
    let r = agentos_as(&m, token, &["job", "wait", &loud]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout.len(), 150_000);
    let r = agentos_as(&m, token, &["job", "output", &loud]);
    assert_eq!((r.code, r.stdout.len()), (0, 150_000), "{}", r.stderr);

    let r = agentos_as(&m, token, &["run", "hang", "--async"]);
    let hang = r.stdout.trim().to_string();
    let r = agentos_as(&m, token, &["job", "output", &hang]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("its output is readable once it has finished"), "{}", r.stderr);
    let r = agentos_as(&m, token, &["job", "cancel", &hang]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("finished, cancelled by runner"), "{}", r.stdout);
    let r = agentos_as(&m, token, &["job", "wait", &hang]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stderr.contains("error: cancelled by runner before it finished"), "{}", r.stderr);
    let r = agentos_as(&m, token, &["job", "cancel", &hang]);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.stderr.contains("has already finished (cancelled by runner)") && r.stderr.contains("HTTP 409"),
        "{}",
        r.stderr
    );
    let r = agentos_as(&m, token, &["job", "show", "job-none"]);
    assert_eq!(r.code, 4, "{}", r.stderr);
    // A name typed into a request's path cannot make it another route's path.
    for (args, says) in [
        (&["job", "cancel", "../../agents"][..], "invalid job id \"../../agents\""),
        (&["net", "tokens", "../../../agents"][..], "invalid place \"../../../agents\""),
        (&["net", "start", "x?y=1"][..], "invalid transition \"x?y=1\""),
    ] {
        let r = agentos_as(&m, token, args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{args:?}: {}", r.stderr);
    }
}
