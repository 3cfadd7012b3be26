//! Container images as a binding, on a real Docker engine and a real registry (started by
//! `scripts/docker-env`): the test images (`scripts/tool-image`, one static binary in FROM
//! scratch images) imported, validated in a throwaway container, pinned by digest and called
//! through a shim and a net; a re-pushed tag refused, a deleted one said gone; images that do not validate refused with
//! their reason and no container left; a master killed mid-import leaving nothing behind.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{BIN, Master, Out, run};
use serde_json::{Value, json};

/// The test images' prefix (`127.0.0.1:5001/agentos-test`), built and pushed when missing.
fn images() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/tool-image");
    let out = Command::new(script).output().expect("scripts/tool-image");
    assert!(out.status.success(), "scripts/tool-image failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("docker");
    assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The owner label of the containers a master on `data` starts.
fn owner_of(data: &Path) -> String {
    let place = std::path::absolute(data).unwrap();
    format!("agentos-{}", &common::sha256_hex(place.to_string_lossy().as_bytes())[..16])
}

/// The engine's clock now, to bound a window of [`created_between`].
fn engine_now() -> String {
    docker(&["info", "--format", "{{.SystemTime}}"])
}

/// The containers a master on `data` created between two of the engine's times, one line each.
fn created_between(data: &Path, since: &str, until: &str) -> String {
    let owner = format!("label=agentos.owner={}", owner_of(data));
    docker(&["events", "--since", since, "--until", until, "--filter", "event=create", "--filter", &owner])
}

/// The containers a master on `data` started and has not removed.
fn containers_of(data: &Path) -> Vec<String> {
    let out = docker(&["ps", "-a", "-q", "--filter", &format!("label=agentos.owner={}", owner_of(data))]);
    out.lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
}

/// Removes the containers a master on its data folder left, when dropped: a test's master is
/// killed, not stopped, and its warm containers would outlive it. Declared before the master,
/// so it goes after it.
struct Leftovers(PathBuf);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for id in containers_of(&self.0) {
            let _ = Command::new("docker").args(["rm", "-f", &id]).output();
        }
    }
}

/// Removes a test's own tag from the engine when dropped, also when an assertion failed first.
struct Untag(String);

impl Drop for Untag {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", &self.0]).output();
    }
}

fn import(api: &common::Api, image: &str, id: &str) -> (u16, Value) {
    api.command(json!({"type": "TOOL_CATALOG_IMPORT_IMAGE", "image": image, "id": id}))
}

fn call(api: &common::Api, id: &str, tool: &str, args: &[&str]) -> (u16, Value) {
    api.post(&format!("/api/tools/{id}/call"), json!({"tool": tool, "args": args}))
}

fn message(v: &Value) -> String {
    v["error"]["message"].as_str().unwrap_or_default().to_string()
}

/// The registry's digest of `repo:tag`.
fn registry_digest(image: &str) -> String {
    let (host, rest) = image.split_once('/').unwrap();
    let (repo, tag) = rest.rsplit_once(':').unwrap();
    let resp = common::http()
        .head(format!("http://{host}/v2/{repo}/manifests/{tag}"))
        .header("accept", "application/vnd.docker.distribution.manifest.v2+json")
        .send()
        .unwrap();
    resp.headers()["docker-content-digest"].to_str().unwrap().to_string()
}

#[test]
fn an_image_is_imported_validated_and_called_through_its_shim_and_a_net() {
    let prefix = images();
    let image = format!("{prefix}/ok:2");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("master");
    let _leftovers = Leftovers(data.clone());
    // Long enough that no container goes idle between two calls of a loaded machine, short
    // enough to wait for once.
    let m = Master::start_with(&data, &["--docker-idle-ms", "5000"]);
    let api = m.client();

    let Out { code, stdout: out, stderr: err } =
        run(&m, &m.token, Path::new(BIN), &["catalog", "import-image", &image, "--id", "echo", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let (status, entry) = api.get("/api/tool-catalog/echo");
    assert_eq!(status, 200, "{entry}");
    assert_eq!(entry["status"], "approved");
    assert_eq!(entry["scope"], "global");
    assert_eq!(entry["binding"]["type"], "docker", "{entry}");
    assert_eq!(entry["binding"]["digest"], registry_digest(&image), "pinned to the tag's digest");
    assert_eq!(entry["version"], "1.2.0", "the document's version");
    let ops: Vec<&str> = entry["contract"]["operations"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(ops, ["add", "echo", "whoami"]);
    assert!(containers_of(&data).is_empty(), "the validation container is gone");
    // Without --json the CLI shows the master's steps as they happen (a line each off a
    // terminal), and a refusal as one line with its exit code.
    let Out { code, stderr: err, .. } =
        run(&m, &m.token, Path::new(BIN), &["catalog", "import-image", &image, "--id", "shown"]);
    assert_eq!(code, 0, "{err}");
    for step in [
        "pulling 127.0.0.1:5001/agentos-test/ok@sha256:",
        "starting a validation container",
        "waiting for it to listen",
        "validating its document at /openapi.json",
    ] {
        assert!(err.contains(step), "{step:?} in {err}");
    }
    let Out { code, stderr: err, .. } = run(
        &m,
        &m.token,
        Path::new(BIN),
        &["catalog", "import-image", &format!("{prefix}/crash:2"), "--id", "crashes"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.lines().last().unwrap().contains("exited with code 3 during validation"), "{err}");

    // A shim: the first call starts a container, the next ones reuse it.
    let bin = dir.path().join("bin");
    let Out { code, stderr: err, .. } =
        run(&m, &m.token, Path::new(BIN), &["install-shims", "--dir", bin.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let Out { code, stdout: out, stderr: err } =
        run(&m, &m.token, &bin.join("agentos-echo"), &["add", "--a", "2", "--b", "40"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"sum\":42"), "{out}");
    assert_eq!(containers_of(&data).len(), 1, "one warm container");
    let Out { code, stdout: out, .. } = run(&m, &m.token, &bin.join("agentos-echo"), &["echo", "--text", "hello"]);
    assert_eq!(code, 0);
    assert!(out.contains("hello"), "{out}");
    assert_eq!(containers_of(&data).len(), 1, "the same container");

    // Idle past --docker-idle-ms: the container stops.
    common::wait_for("the idle container to stop", || containers_of(&data).is_empty());
    let (status, v) = call(&api, "echo", "whoami", &[]);
    assert_eq!(status, 200, "{v}");
    let who = &v["result"]["body"];
    assert_eq!(who["uid"], "65534", "never root: {who}");
    assert!(!who["env"].as_array().unwrap().contains(&json!("TOOL_KEY")), "{who}");

    // Secrets reach a container only as declared at import and granted to the entry, and never
    // come back out. The same image under another id runs in a container of its own.
    let key = "tk-91c2e7-canary";
    assert_eq!(api.put("/api/secrets/TOOL_KEY", json!({"value": key})).0, 200);
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_IMPORT_IMAGE", "image": image, "id": "keyed",
        "secrets": ["TOOL_KEY"]}));
    assert_eq!(status, 200, "{v}");
    let (status, v) = call(&api, "keyed", "whoami", &[]);
    assert_eq!(status, 403, "{v}");
    assert!(message(&v).contains("agentos secret grant TOOL_KEY --tool keyed"), "{v}");
    let (status, v) = api.post("/api/secrets/TOOL_KEY/grants", json!({"tool": "keyed"}));
    assert_eq!(status, 200, "{v}");
    let (status, v) = call(&api, "keyed", "whoami", &[]);
    assert_eq!(status, 200, "{v}");
    let who = &v["result"]["body"];
    assert!(who["env"].as_array().unwrap().contains(&json!("TOOL_KEY")), "{who}");
    assert_eq!(who["key"], "[redacted]", "{who}");
    let (status, v) = call(&api, "echo", "whoami", &[]);
    assert_eq!(status, 200, "{v}");
    assert!(!v["result"]["body"]["env"].as_array().unwrap().contains(&json!("TOOL_KEY")), "{v}");
    assert_eq!(containers_of(&data).len(), 2, "a container per entry");
    let inspect = docker(&["inspect", &containers_of(&data)[0]]);
    let inspect: Value = serde_json::from_str(&inspect).unwrap();
    let host = &inspect[0]["HostConfig"];
    assert_eq!(host["CapDrop"], json!(["ALL"]), "{host}");
    assert_eq!(host["SecurityOpt"], json!(["no-new-privileges"]), "{host}");
    assert_eq!(host["ReadonlyRootfs"], true);
    assert!(host["PidsLimit"].as_i64().unwrap() > 0 && host["Memory"].as_i64().unwrap() > 0, "{host}");
    assert_eq!(host["MemorySwap"], host["Memory"], "no swap past the memory limit: {host}");
    assert_eq!(host["LogConfig"]["Config"]["max-size"], "1m", "a bounded log: {host}");

    // A rotated secret reaches the entry's next call in a container of its own: a running
    // one keeps the environment it started with, and its old value would come back unredacted.
    let before = containers_of(&data);
    let rotated = "tk-5d0a33-rotated";
    assert_eq!(api.put("/api/secrets/TOOL_KEY", json!({"value": rotated})).0, 200);
    let (status, v) = call(&api, "keyed", "whoami", &[]);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["body"]["key"], "[redacted]", "{v}");
    common::wait_for("the container with the old value to go", || {
        let now = containers_of(&data);
        now.len() == 2 && before.iter().any(|c| !now.contains(c))
    });
    // A secret's grant taken back stops the container that holds it, rather than leaving it
    // running with the value until it is idle.
    let (status, grant) = api.get("/api/secret-grants");
    assert_eq!(status, 200, "{grant}");
    let grant_id = grant.as_array().unwrap().iter().find(|g| g["secret"] == "TOOL_KEY").unwrap()["id"].clone();
    let (status, v) = api.request("DELETE", &format!("/api/secret-grants/{}", grant_id.as_str().unwrap()), None);
    assert_eq!(status, 200, "{v}");
    common::wait_for("the container with a revoked secret to stop", || containers_of(&data).len() == 1);
    let (status, v) = api.post("/api/secrets/TOOL_KEY/grants", json!({"tool": "keyed"}));
    assert_eq!(status, 200, "{v}");
    let (status, v) = call(&api, "keyed", "whoami", &[]);
    assert_eq!(status, 200, "{v}");
    assert_eq!(containers_of(&data).len(), 2);
    // A removed entry's container stops, rather than holding a place until it is idle.
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REMOVE", "id": "keyed", "model": "default"}));
    assert_eq!(status, 200, "{v}");
    common::wait_for("the removed entry's container to stop", || containers_of(&data).len() == 1);

    // From a net: an http action naming the container's operation.
    let (status, v) = api.put(
        "/api/models/calc/net",
        json!({"places": ["p-req", "p-resp"], "transitions": [{"id": "sum", "kind": "http",
            "presets": {"req": {"place": "p-req"}}, "postsets": {"o": {"place": "p-resp"}},
            "action": {"tool": "echo", "operation": "add", "input": {"a": "${.req.data.a}", "b": 1}},
            "emit": [{"to": "o"}]}]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(api.post("/api/models/calc/transitions/sum/start", json!({})).0, 200);
    assert_eq!(api.post("/api/models/calc/places/p-req/tokens", json!({"data": {"a": 41}})).0, 200);
    common::wait_for("the sum token", || !api.token_data("calc", "p-resp").is_empty());
    assert_eq!(api.token_data("calc", "p-resp")[0], json!({"sum": 42}));

    // A crashed container is started again by the next call.
    for id in containers_of(&data) {
        docker(&["kill", &id]);
    }
    let (status, v) = call(&api, "echo", "add", &["--a", "1", "--b", "1"]);
    assert_eq!(status, 200, "started again: {v}");
    assert_eq!(v["result"]["body"]["sum"], 2, "{v}");

    // Calling needs `x` and `d`; importing needs `d`; `d` registers no scripts and `s` imports
    // no images.
    let no_d = api.agent("no-d", "--x------s");
    let (status, v) = call(&no_d, "echo", "add", &["--a", "1", "--b", "1"]);
    assert_eq!(status, 404, "{v}");
    let (status, v) = import(&no_d, &image, "mine");
    assert_eq!(status, 403, "{v}");
    let d_only = api.agent("d-only", "--x---d");
    let (status, v) = d_only.register("sneaky", "sh", "echo hi", None);
    assert_eq!(status, 403, "{v}");
    let (status, v) = call(&d_only, "echo", "add", &["--a", "1", "--b", "1"]);
    assert_eq!(status, 200, "{v}");
    // A master stopped cleanly stops its containers.
    assert!(!containers_of(&data).is_empty());
    let mut m = m;
    m.terminate();
    assert!(containers_of(&data).is_empty(), "stopped with the master");
    for file in walk(&data) {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            ![key, rotated].iter().any(|k| bytes.windows(k.len()).any(|w| w == k.as_bytes()))
                || file.ends_with("secrets.key"),
            "{}",
            file.display()
        );
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

/// A tag of a test's own (`{prefix}/{name}-{pid}:1`, a copy of `ok:2`) pushed to the registry,
/// imported as `id` on a master of its own and called once: one warm container. Its own tag, so
/// no other test's import sees it move or go. Dropped in field order: the master is killed, then
/// its containers are removed, then the tag, then the data folder.
struct Warm {
    master: Master,
    data: PathBuf,
    _leftovers: Leftovers,
    _untag: Untag,
    dir: tempfile::TempDir,
    prefix: String,
    tag: String,
}

fn warm(name: &str, id: &str) -> Warm {
    let prefix = images();
    let tag = format!("{prefix}/{name}-{}:1", std::process::id());
    docker(&["tag", &format!("{prefix}/ok:2"), &tag]);
    let untag = Untag(tag.clone());
    docker(&["push", "-q", &tag]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("master");
    let leftovers = Leftovers(data.clone());
    let master = Master::start(&data);
    let api = master.client();
    let (status, v) = import(&api, &tag, id);
    assert_eq!(status, 200, "{v}");
    let (status, v) = call(&api, id, "add", &["--a", "1", "--b", "2"]);
    assert_eq!(status, 200, "{v}");
    assert_eq!(containers_of(&data).len(), 1);
    Warm { master, data, _leftovers: leftovers, _untag: untag, dir, prefix, tag }
}

#[test]
fn a_repushed_tag_is_refused_and_its_warm_container_stopped() {
    let w = warm("repush", "moving");
    let (api, data, prefix, tag) = (w.master.client(), &w.data, &w.prefix, &w.tag);

    // The same tag, other content: another digest.
    let ctx = w.dir.path().join("ctx");
    std::fs::create_dir(&ctx).unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        format!("FROM {prefix}/ok:2\nLABEL agentos.test.nonce=\"{}\"\n", std::process::id()),
    )
    .unwrap();
    docker(&["build", "-q", "-t", tag, ctx.to_str().unwrap()]);
    docker(&["push", "-q", tag]);
    // The registry's answer is trusted for five seconds at most.
    let mut last = Value::Null;
    common::wait_for("the re-push to be seen", || {
        let (status, v) = call(&api, "moving", "add", &["--a", "1", "--b", "2"]);
        last = v;
        status == 409
    });
    assert!(message(&last).contains("image re-pushed since import: re-import it"), "{last}");
    assert!(containers_of(data).is_empty(), "the old digest's container is stopped");
    // Imported again, it is pinned to the new digest and answers.
    let (status, v) = import(&api, tag, "moving");
    assert_eq!(status, 200, "{v}");
    let (status, v) = call(&api, "moving", "add", &["--a", "1", "--b", "2"]);
    assert_eq!(status, 200, "{v}");
}

/// A tag deleted from the registry after its import: the call says `image_gone` and how to
/// mend it, and the warm container of the pinned digest is stopped.
#[test]
fn a_tag_deleted_from_the_registry_is_said_gone_and_its_warm_container_stopped() {
    let w = warm("gone", "going");
    let (api, data, tag) = (w.master.client(), &w.data, &w.tag);

    // Deleted by its digest, as a registry's own API deletes: the tag goes with it.
    let digest = registry_digest(tag);
    let (host, rest) = tag.split_once('/').unwrap();
    let repo = rest.rsplit_once(':').unwrap().0;
    let resp = common::http().delete(format!("http://{host}/v2/{repo}/manifests/{digest}")).send().unwrap();
    assert_eq!(resp.status().as_u16(), 202, "the registry refused the delete: {}", resp.text().unwrap_or_default());
    // The registry's answer is trusted for five seconds at most.
    let mut last = Value::Null;
    common::wait_for("the delete to be seen", || {
        let (status, v) = call(&api, "going", "add", &["--a", "1", "--b", "2"]);
        last = v;
        status == 409
    });
    assert_eq!(last["error"]["code"], "image_gone", "{last}");
    assert!(
        message(&last).contains("no longer in the local registry: push the image again, then re-import it"),
        "{last}"
    );
    assert!(containers_of(data).is_empty(), "the gone digest's container is stopped");
}

#[test]
fn images_that_do_not_validate_are_refused_with_the_reason_and_leave_no_container() {
    let prefix = images();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("master");
    let _leftovers = Leftovers(data.clone());
    let m = Master::start_with(&data, &["--docker-start-timeout-ms", "1500"]);
    let api = m.client();
    for (mode, status, words) in [
        ("no-doc", 400, "answered 404 for its document at /openapi.json"),
        ("bad-doc", 400, "not an OpenAPI document"),
        ("silent", 400, "did not listen on 127.0.0.1:$PORT within 1 s"),
        ("crash", 400, "exited with code 3 during validation: tool-image: cannot read /config.toml"),
    ] {
        let (s, v) = import(&api, &format!("{prefix}/{mode}:2"), mode);
        assert_eq!(s, status, "{mode}: {v}");
        assert!(message(&v).contains(words), "{mode}: {v}");
        assert_eq!(api.get(&format!("/api/tool-catalog/{mode}")).0, 404, "{mode}: no entry");
        assert!(containers_of(&data).is_empty(), "{mode}: no container left");
    }
    let (s, v) = import(&api, "docker.io/library/alpine:3", "alpine");
    assert_eq!(s, 403, "{v}");
    assert!(message(&v).contains("not in the local registry 127.0.0.1:5001"), "{v}");
    let (s, v) = import(&api, &format!("{prefix}/never-pushed:1"), "never");
    assert_eq!(s, 400, "{v}");
    assert!(message(&v).contains("no image"), "{v}");
}

#[test]
fn a_master_killed_during_an_import_leaves_no_half_entry_and_no_container() {
    let prefix = images();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("master");
    let _leftovers = Leftovers(data.clone());
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut m = Master::start_full(&data, &listen, &["--docker-start-timeout-ms", "30000"], &[]);
    let api = m.client();
    let image = format!("{prefix}/silent:2");
    let importing = std::thread::spawn(move || import(&api, &image, "halfway"));
    common::wait_for("the validation container", || !containers_of(&data).is_empty());
    m.kill9();
    let _ = importing.join();
    let m = m.restart();
    common::wait_for("the left container to be removed", || containers_of(&data).is_empty());
    let (status, v) = m.client().get("/api/tool-catalog/halfway");
    assert_eq!(status, 404, "no half entry: {v}");
    std::thread::sleep(Duration::from_millis(10));
}

/// A caller that goes away during an import (its connection closed while the image is being
/// validated) leaves no container behind: the validation container used to run on, its port
/// let go, until the master's next start.
#[test]
fn an_import_whose_caller_went_away_leaves_no_container() {
    use std::io::Write;
    let prefix = images();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("master");
    let _leftovers = Leftovers(data.clone());
    let m = Master::start_with(&data, &["--docker-start-timeout-ms", "60000"]);
    let body =
        json!({"type": "TOOL_CATALOG_IMPORT_IMAGE", "image": format!("{prefix}/silent:2"), "id": "gone"}).to_string();
    let addr = m.url.strip_prefix("http://").unwrap().to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        conn,
        "POST /api/commands HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        m.token,
        body.len()
    )
    .unwrap();
    common::wait_for("the validation container", || !containers_of(&data).is_empty());
    drop(conn);
    // Well within the 60 s the container had to listen (`wait_for` gives 20 s).
    common::wait_for("the validation container to be removed", || containers_of(&data).is_empty());
    assert_eq!(m.client().get("/api/tool-catalog/gone").0, 404, "no entry");
}

#[test]
fn an_image_whose_document_names_a_server_path_is_called_under_it() {
    let prefix = images();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("master");
    let _leftovers = Leftovers(data.clone());
    let m = Master::start(&data);
    let api = m.client();
    let (status, v) = import(&api, &format!("{prefix}/prefixed:2"), "prefixed");
    assert_eq!(status, 200, "{v}");
    let (_, entry) = api.get("/api/tool-catalog/prefixed");
    assert_eq!(entry["binding"]["basePath"], "/v1", "{entry}");
    // The image answers 404 at the bare paths: the call reached /v1/add.
    let (status, v) = call(&api, "prefixed", "add", &["--a", "2", "--b", "3"]);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["body"]["sum"], 5, "{v}");
}

#[test]
fn at_the_container_limit_the_least_recently_used_idle_container_makes_room() {
    let prefix = images();
    let image = format!("{prefix}/ok:2");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("master");
    let _leftovers = Leftovers(data.clone());
    let m = Master::start_with(&data, &["--max-containers", "1"]);
    let api = m.client();
    for id in ["first", "second"] {
        let (status, v) = import(&api, &image, id);
        assert_eq!(status, 200, "{v}");
    }
    let (status, v) = call(&api, "first", "whoami", &[]);
    assert_eq!(status, 200, "{v}");
    let first = containers_of(&data);
    assert_eq!(first.len(), 1);
    let (status, v) = call(&api, "second", "whoami", &[]);
    assert_eq!(status, 200, "{v}");
    let second = containers_of(&data);
    assert_eq!(second.len(), 1, "still one container: {second:?}");
    assert_ne!(first, second, "the first entry's container made room");
    let (status, v) = call(&api, "first", "add", &["--a", "1", "--b", "1"]);
    assert_eq!(status, 200, "{v}");
}

#[test]
fn a_container_that_hangs_at_start_holds_up_only_its_own_entry() {
    let prefix = images();
    let image = format!("{prefix}/ok:2");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("master");
    let _leftovers = Leftovers(data.clone());
    let m = Master::start_with(&data, &["--docker-start-timeout-ms", "3000"]);
    let api = m.client();
    // Validated without the secret; the containers that run calls get it, and never listen.
    let (status, v) = api.put("/api/secrets/TOOL_HANG", json!({"value": "hang-at-start"}));
    assert_eq!(status, 200, "{v}");
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_IMPORT_IMAGE", "image": image, "id": "hangs",
        "secrets": ["TOOL_HANG"]}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(api.post("/api/secrets/TOOL_HANG/grants", json!({"tool": "hangs"})).0, 200);
    let (status, v) = import(&api, &image, "quick");
    assert_eq!(status, 200, "{v}");
    let (status, v) = call(&api, "quick", "add", &["--a", "1", "--b", "1"]);
    assert_eq!(status, 200, "{v}");

    let since = engine_now();
    let hanging: Vec<_> = (0..3)
        .map(|_| {
            let hang_api = api.clone();
            std::thread::spawn(move || call(&hang_api, "hangs", "add", &["--a", "1", "--b", "1"]))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // While that container fails to start, the other entry answers at once.
    let started = std::time::Instant::now();
    let (status, v) = call(&api, "quick", "add", &["--a", "2", "--b", "2"]);
    assert_eq!(status, 200, "{v}");
    assert!(started.elapsed() < Duration::from_millis(1500), "not held up: {:?}", started.elapsed());
    // The three calls waited on one start and fail with its reason, together: each used to
    // wait its turn and try a start of its own, 3 s more each.
    for call in hanging {
        let (status, v) = call.join().unwrap();
        assert_eq!(status, 504, "{v}");
        assert!(message(&v).contains("did not listen within 3 s"), "{v}");
    }
    let created = created_between(&data, &since, &engine_now());
    assert_eq!(created.lines().count(), 1, "one start, not one per call: {created}");
    common::wait_for("the hung container to be removed", || containers_of(&data).len() == 1);

    // A call's own timeout covers the start: it ends when it is due, and the start goes on.
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_IMPORT_IMAGE", "image": image, "id": "hangs-briefly",
        "secrets": ["TOOL_HANG"], "timeoutMs": 1000}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(api.post("/api/secrets/TOOL_HANG/grants", json!({"tool": "hangs-briefly"})).0, 200);
    let (status, v) = call(&api, "hangs-briefly", "add", &["--a", "1", "--b", "1"]);
    assert_eq!(status, 504, "{v}");
    assert!(message(&v).contains("within the call's 1000 ms"), "{v}");
    // Its start went on after the call's answer, and failed in its own time.
    assert_eq!(containers_of(&data).len(), 2, "the start went on");
    common::wait_for("the second hung container to be removed", || containers_of(&data).len() == 1);
}

#[test]
fn an_import_over_another_owners_entry_is_refused_before_any_container_starts() {
    let prefix = images();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("master");
    let _leftovers = Leftovers(data.clone());
    let m = Master::start(&data);
    let api = m.client();
    let (s, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_SCRIPT", "id": "payroll", "name": "Payroll",
        "runtime": "sh", "content": "echo paid"}));
    assert_eq!(s, 200, "{v}");
    let since = engine_now();
    let mallory = api.agent("mallory", "--x---d---m");
    let (s, v) = import(&mallory, &format!("{prefix}/ok:2"), "payroll");
    assert_eq!(s, 403, "{v}");
    assert!(message(&v).contains("it belongs to \"operator\""), "{v}");
    let (s, v) = import(&api, &format!("{prefix}/ok:2"), "payroll");
    assert_eq!(s, 409, "a script cannot become an image: {v}");
    // Neither refused import created a container, not even one it removed again.
    let until = engine_now();
    let created = created_between(&data, &since, &until);
    assert_eq!(created, "", "containers created for refused imports");
    // The same watch sees the validation container of an import that goes through.
    let (s, v) = import(&api, &format!("{prefix}/ok:2"), "payroll-image");
    assert_eq!(s, 200, "{v}");
    let created = created_between(&data, &until, &engine_now());
    assert_eq!(created.lines().count(), 1, "{created}");
}
