//! The data folder is the master's alone: made 0700 with 0600 files, refused by `serve` when
//! open to others, tightened by `up`, and out of reach of the scripts `up` runs (as nobody,
//! from a workspace beside the data folder, never as the master's user unless asked for).

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Api, BIN, Master};
use serde_json::json;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o777
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every path under `dir` (itself included) with its mode.
fn modes_under(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = vec![(dir.to_path_buf(), mode(dir))];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            out.extend(modes_under(&path));
        } else {
            out.push((path.clone(), mode(&path)));
        }
    }
    out
}

fn assert_private(data: &Path) {
    for (path, m) in modes_under(data) {
        let want = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(m, want, "{} is {m:o}", path.display());
    }
}

/// A data folder as a master before this change left it: folder 0755, files 0644.
fn loosen(data: &Path) {
    for (path, _) in modes_under(data) {
        chmod(&path, if path.is_dir() { 0o755 } else { 0o644 });
    }
}

/// Runs `agentos ARGS` that is expected to exit by itself (a refusal); at most 20 s.
fn exits(args: &[&str], data: &Path) -> (i32, String) {
    let log = data.with_extension("refusal.log");
    let mut child = Command::new(BIN)
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .env("AGENTOS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stderr = || std::fs::read_to_string(&log).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("agentos {args:?} started instead of refusing: {}", stderr());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code().unwrap_or(-1), stderr())
}

/// A running `agentos up`, its log (at warn) in a file. Killed when dropped.
struct Up {
    child: Child,
    api: Api,
    log: PathBuf,
    /// The welcome's line about the local executor.
    executor_line: String,
}

impl Up {
    fn start(data: &Path, extra: &[&str]) -> Up {
        let log = data.with_extension("log");
        let mut child = Command::new(BIN)
            .args(["up", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .args(extra)
            .env("AGENTOS_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let Some(Ok(first)) = lines.next() else {
            panic!("up printed nothing: {}", std::fs::read_to_string(&log).unwrap());
        };
        let url = first.rsplit(' ').next().unwrap().to_string();
        let executor_line =
            lines.by_ref().take(4).map(Result::unwrap).find(|l| l.starts_with("local executor")).unwrap();
        std::thread::spawn(move || for _ in lines {});
        let token = std::fs::read_to_string(data.join("operator.token")).unwrap().trim().to_string();
        Up { child, api: Api { url, token: Some(token), http: common::http() }, log, executor_line }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temp folder that nobody may enter (whatever the umask), as the parent of a data folder (and of `up`'s
/// workspace beside it) would be on a machine.
fn enterable_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    dir
}

#[test]
fn serve_makes_the_folder_0700_and_every_file_in_it_0600() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let m = Master::start(&data);
    let api = m.client();
    assert_eq!(api.register("hello", "sh", "echo hello", None).0, 200);
    let (status, v) = api.put("/api/models/team/net", json!({"places": ["p-in"], "transitions": []}));
    assert_eq!(status, 200, "{v}");
    let (status, v) = api.post("/api/models/team/places/p-in/tokens", json!({"data": {"secret": "token data"}}));
    assert_eq!(status, 200, "{v}");

    let names: Vec<String> =
        std::fs::read_dir(&data).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    for expected in ["events.db", "events.db-wal", "events.db-shm", "LOCK", "secrets.key", "operator.token", "blobs"] {
        assert!(names.iter().any(|n| n == expected), "no {expected} in {names:?}");
    }
    assert!(modes_under(&data).iter().any(|(p, _)| p.starts_with(data.join("blobs/tool-catalog"))), "no blob written");
    assert_private(&data);
}

#[test]
fn serve_refuses_a_data_folder_others_can_enter_and_names_the_chmod_that_fixes_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    chmod(&data, 0o755);
    let (code, stderr) = exits(&["serve"], &data);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains(&format!("chmod -R go-rwx {}", data.display())), "{stderr}");
    assert_eq!(mode(&data), 0o755, "serve changed the folder it refused");
    assert!(!data.join("events.db").exists(), "serve opened the log of a folder it refused");

    // A private folder with one file others may read is refused too.
    chmod(&data, 0o700);
    std::fs::write(data.join("operator.token"), "x\n").unwrap();
    chmod(&data.join("operator.token"), 0o644);
    let (code, stderr) = exits(&["serve"], &data);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("operator.token is 644"), "{stderr}");

    // The command it names is enough.
    let fix = Command::new("chmod").args(["-R", "go-rwx"]).arg(&data).status().unwrap();
    assert!(fix.success());
    let _m = Master::start(&data);
}

#[test]
fn up_tightens_a_loose_data_folder_it_owns_and_starts() {
    let dir = enterable_tempdir();
    let data = dir.path().join("data");
    // A folder an older master left open: run one, stop it, open everything up.
    let mut m = Master::start(&data);
    assert_eq!(m.client().register("hello", "sh", "echo hello", None).0, 200);
    m.terminate();
    loosen(&data);
    assert_eq!(mode(&data.join("events.db")), 0o644);

    let up = Up::start(&data, &[]);
    assert_private(&data);
    let log = up.log();
    assert_eq!(log.lines().filter(|l| l.contains("open to other users")).count(), 1, "{log}");
    let (status, r) = up.api.invoke("hello", json!({}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "hello\n");
}

#[test]
fn scripts_run_by_up_cannot_read_the_data_folder() {
    let dir = enterable_tempdir();
    let data = dir.path().join("data");
    let up = Up::start(&data, &[]);
    assert!(up.executor_line.contains("scripts as nobody"), "{}", up.executor_line);
    let (status, v) = up.api.put("/api/models/team/net", json!({"places": ["p-in"], "transitions": []}));
    assert_eq!(status, 200, "{v}");
    let (status, v) = up.api.post("/api/models/team/places/p-in/tokens", json!({"data": {"secret": "token data"}}));
    assert_eq!(status, 200, "{v}");

    let script = r#"id -u
cat "$1/events.db" "$1/events.db-wal" "$1/operator.token" "$1/secrets.key" 2>&1 >/dev/null
ls "$1" 2>&1 >/dev/null
ls "$1.work/scripts/sha256" 2>&1 >/dev/null
pwd"#;
    assert_eq!(up.api.register("snoop", "sh", script, None).0, 200);
    let (status, r) = up.api.invoke("snoop", json!({"argv": [data.to_str().unwrap()]}));
    assert_eq!(status, 200, "{r}");
    let stdout = r["stdout"].as_str().unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "65534", "scripts do not run as nobody: {stdout}");
    // Four files and the folder of the data, and the list of cached scripts.
    assert_eq!(lines.iter().filter(|l| l.contains("Permission denied")).count(), 6, "{stdout}");
    assert!(!stdout.contains("token data"), "{stdout}");

    let cwd = Path::new(lines.last().unwrap());
    let data = std::fs::canonicalize(&data).unwrap();
    assert!(!cwd.starts_with(&data), "the job ran inside the data folder: {stdout}");
    assert!(cwd.starts_with(data.with_extension("work")), "the job ran outside {}.work: {stdout}", data.display());
    assert!(!data.join("executor").exists(), "the local executor's workspace is inside the data folder");
}

#[test]
fn up_refuses_to_run_scripts_as_its_own_user_unless_asked_to() {
    // Run as root here, so scripts would run as nobody, who cannot enter this private folder.
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o700);
    assert_eq!(std::fs::metadata(dir.path()).unwrap().uid(), 0, "this test runs as root");
    let data = dir.path().join("data");
    let (code, stderr) = exits(&["up"], &data);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains(&format!("chmod o+x {}", dir.path().display())), "{stderr}");
    assert!(stderr.contains("--run-as current"), "{stderr}");

    let up = Up::start(&data, &["--run-as", "current"]);
    assert!(up.executor_line.contains("the master's own user"), "{}", up.executor_line);
    let log = up.log();
    assert!(log.contains("can read everything in its data folder"), "{log}");
    assert_eq!(up.api.register("whoami", "sh", "id -u", None).0, 200);
    let (status, r) = up.api.invoke("whoami", json!({}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "0\n");
}
