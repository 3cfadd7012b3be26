//! Human-readable rendering of API answers; `--json` prints them as they came.

use serde_json::Value;

use crate::call::shown;
use agentos_server::Ready;

pub fn print(v: &Value, json: bool, human: impl Fn(&Value) -> String) {
    if json {
        outln!("{}", agentos_core::name::json_inert(&serde_json::to_string_pretty(v).unwrap_or_default()));
    } else {
        outln!("{}", human(v));
    }
}

/// Writes part of a command's answer to standard output (`outln!`, `out!`). An output that
/// cannot take it (a full disk) ends the command: one line on standard error, exit 1, and no
/// panic. What the command did is done; only its answer is lost, and the line says so. A reader
/// that went away ends a client command by `SIGPIPE` before this sees the failure.
pub fn write(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        drop(out);
        lost(&e)
    }
}

/// Bytes as they came (a tool's own standard output) to standard output; the caller ends the
/// command with [`lost`] when this fails.
pub fn write_bytes(bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(bytes).and_then(|()| out.flush())
}

/// Ends a command whose answer standard output could not take: one line, exit 1.
pub fn lost(e: &std::io::Error) -> ! {
    errln!("error: cannot write to standard output: {e} (the command was carried out; its answer is lost)");
    std::process::exit(1)
}

/// One line per item of a list answer.
pub fn each_line(v: &Value, line: impl Fn(&Value) -> String) -> String {
    v.as_array().map(|a| a.iter().map(line).collect::<Vec<_>>().join("\n")).unwrap_or_default()
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn scope(e: &Value) -> String {
    let mut sc = s(e, "scope").to_string();
    if e.get("shadowed").and_then(Value::as_bool).unwrap_or(false) {
        sc.push_str(" (shadowed)");
    }
    sc
}

pub fn search_page(v: &Value) -> String {
    let items = v.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut rows =
        vec![["ID".to_string(), "TYPE".into(), "SCOPE".into(), "MODEL".into(), "VERSION".into(), "NAME".into()]];
    for e in &items {
        rows.push([
            s(e, "id").into(),
            e.pointer("/binding/type").and_then(Value::as_str).unwrap_or("").into(),
            scope(e),
            s(e, "model").into(),
            s(e, "version").into(),
            s(e, "name").into(),
        ]);
    }
    let mut widths = [0usize; 6];
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    let total = v.get("total").and_then(Value::as_u64).unwrap_or(0);
    let offset = v.get("offset").and_then(Value::as_u64).unwrap_or(0);
    out.push_str(&format!("{} of {total} entries (from {offset})", items.len()));
    out
}

pub fn entry(e: &Value) -> String {
    let b = e.get("binding").cloned().unwrap_or_default();
    let caps: Vec<&str> = e
        .get("capabilities")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    // What the registrant wrote (a name, a file name, a description) is shown on its one line,
    // with nothing a terminal would act on.
    let mut lines = vec![
        format!("id:           {}", s(e, "id")),
        format!("name:         {}", shown(s(e, "name"))),
        format!("version:      {}", s(e, "version")),
        format!("status:       {}", s(e, "status")),
        format!("scope:        {} (model {})", scope(e), s(e, "model")),
        format!("type:         {}", s(&b, "type")),
    ];
    if s(&b, "type") == "script" {
        lines.push(format!("runtime:      {}", s(&b, "runtime")));
        lines.push(format!("filename:     {}", shown(s(&b, "filename"))));
        lines.push(format!("size:         {} bytes", b.get("sizeBytes").and_then(Value::as_u64).unwrap_or(0)));
        lines.push(format!("sha256:       {}", s(&b, "sha256")));
        lines.push(format!("urn:          {}", s(&b, "scriptUrn")));
    }
    if !caps.is_empty() {
        lines.push(format!("capabilities: {}", shown(&caps.join(", "))));
    }
    if !s(e, "description").is_empty() {
        lines.push(format!("description:  {}", shown(s(e, "description"))));
    }
    lines.push(format!(
        "revision:     {} (updated {} by {})",
        e.get("revision").and_then(Value::as_u64).unwrap_or(0),
        s(e, "updatedAt"),
        s(e, "updatedBy")
    ));
    lines.join("\n")
}

/// A registration: what was registered, and the blob it is pinned to (a script, a document, an
/// MCP server's tool list) where it has one. A field the binding lacks is left out, not shown empty.
pub fn registered(e: &Value) -> String {
    let urn = ["/binding/scriptUrn", "/binding/openapiUrn", "/binding/netUrn", "/binding/toolsUrn"]
        .iter()
        .find_map(|p| e.pointer(p).and_then(Value::as_str))
        .unwrap_or("");
    let mut out = format!("registered {} in model {} ({})", s(e, "id"), s(e, "model"), s(e, "scope"));
    for (label, value) in
        [("sha256:", e.pointer("/binding/sha256").and_then(Value::as_str).unwrap_or("")), ("urn:", urn)]
    {
        if !value.is_empty() {
            out.push_str(&format!("\n{label:<7} {value}"));
        }
    }
    if e.pointer("/binding/type").and_then(Value::as_str) == Some("http")
        && let Some(ops) = e.pointer("/contract/operations").and_then(Value::as_object)
    {
        out.push_str(&format!("\ntools:  {}", ops.keys().cloned().collect::<Vec<_>>().join(", ")));
    }
    for skipped in e.pointer("/binding/skipped").and_then(Value::as_array).into_iter().flatten() {
        // Both come from the registrant's document: one line each, inert in a terminal.
        out.push_str(&format!("\nskipped {}: {}", shown(s(skipped, "pointer")), shown(s(skipped, "reason"))));
    }
    out
}

pub fn history(h: &Value) -> String {
    let mut out = format!("history of {} in model {} ({})\n", s(h, "id"), s(h, "model"), s(h, "scope"));
    for ev in h.get("events").and_then(Value::as_array).cloned().unwrap_or_default() {
        let p = ev.get("payload").cloned().unwrap_or_default();
        let detail = match s(&ev, "type") {
            "ToolRegistered" => format!(
                "version {} sha256 {}",
                p.pointer("/entry/version").and_then(Value::as_str).unwrap_or(""),
                p.pointer("/entry/binding/sha256")
                    .and_then(Value::as_str)
                    .map(|x| &x[..x.len().min(12)])
                    .unwrap_or("-")
            ),
            _ => String::new(),
        };
        out.push_str(&format!(
            "#{:<6} {}  {:<14} by {:<10} {detail}\n",
            ev.get("seq").and_then(Value::as_u64).unwrap_or(0),
            s(&ev, "time"),
            s(&ev, "type"),
            s(&ev, "principal")
        ));
    }
    out.trim_end().to_string()
}

pub fn models(v: &Value) -> String {
    let mut out = String::new();
    for m in v.as_array().cloned().unwrap_or_default() {
        let places: Vec<String> = m
            .get("places")
            .and_then(Value::as_array)
            .map(|ps| {
                ps.iter()
                    .map(|p| {
                        format!("{} ({} tokens)", s(p, "name"), p.get("tokens").and_then(Value::as_u64).unwrap_or(0))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push_str(&format!("{:<20} {}\n", s(&m, "name"), places.join(", ")));
    }
    out.trim_end().to_string()
}

/// What `serve` and `up` print once the master listens. The first line is stable for scripts.
/// What `agentos up` says about its local executor.
pub struct LocalWelcome {
    pub workspace: std::path::PathBuf,
    /// `None`: scripts run as the master's own user (`--run-as current`).
    pub run_as: Option<String>,
}

pub fn ready(r: &Ready, welcome: Option<&LocalWelcome>) {
    // Best effort: a master whose standard output cannot take its greeting (a full disk) keeps
    // serving; its log goes to standard error.
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "agentos master listening on {}", r.url);
    // A master joining a shared log writes no token of its own: the first master's file is
    // copied beside it, and until then there is none to name.
    if r.token_file.is_file() {
        let _ =
            writeln!(o, "operator token: {}{}", r.token_file.display(), if r.token_written { " (new)" } else { "" });
    } else {
        let _ = writeln!(
            o,
            "operator token: none in this data folder; copy operator.token from the master that made the shared log to {}",
            r.token_file.display()
        );
    }
    let _ = writeln!(
        o,
        "catalog: {} entries, event log at seq {} (restored from snapshot at seq {} and {} events after it)",
        r.entries, r.seq, r.restored.snapshot_seq, r.restored.replayed
    );
    if let Some(local) = welcome {
        let user = local.run_as.as_deref().unwrap_or("the master's own user");
        let _ = writeln!(
            o,
            "local executor: running beside the master (agentos executors), scripts as {user}, workspace {}",
            local.workspace.display()
        );
        let _ = writeln!(o);
        let _ = writeln!(o, "Try it (in another shell):");
        let _ = writeln!(o, "  export AGENTOS_URL={} AGENTOS_TOKEN=$(cat {})", r.url, r.token_file.display());
        let _ = writeln!(o, "  echo 'echo \"hello, $1\"' > hello.sh");
        let _ = writeln!(o, "  agentos catalog register-script --id hello --runtime sh --file hello.sh");
        let _ = writeln!(o, "  agentos run hello -- world");
        let _ = writeln!(o, "  agentos catalog list");
        let _ = writeln!(o, "Or open {}/ in a browser and sign in with the operator token.", r.url);
        let _ = writeln!(o, "Stop with Ctrl-C; everything is kept in the data folder.");
    }
    let _ = o.flush();
}

/// A job: its state, and once it has finished, how it ended (in one line).
pub fn job(v: &Value) -> String {
    // Whose it is, when not the reader's: only its invoker (or the operator) may cancel it.
    let whose = match v["invoker"].as_str() {
        Some("another") => ", invoked by another principal",
        Some("net") => ", a step of a net's fire",
        _ => "",
    };
    let head = format!("job {} in {}: {}", s(v, "jobId"), s(v, "model"), s(v, "state"));
    let Some(r) = v["results"].as_array().and_then(|r| r.last()) else { return format!("{head}{whose}") };
    let how = match (r["cancelledBy"].as_str(), r["exitCode"].as_i64(), r["signal"].as_i64()) {
        (Some(by), _, _) => format!("cancelled by {}", shown(by)),
        (None, Some(code), _) => format!("exit code {code}"),
        (None, None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None, None) => "did not run to an end".to_string(),
    };
    let mut line = format!("{head}, {how}, {} ms", r["durationMs"].as_u64().unwrap_or(0));
    if let Some(e) = r["executor"].as_str().filter(|e| !e.is_empty()) {
        line.push_str(&format!(" on {}", shown(e)));
    }
    // The first hand-out is the rule: a later one means a lease ran out before.
    if let Some(n) = r["attempt"].as_u64().filter(|n| *n > 1) {
        line.push_str(&format!(", attempt {n}"));
    }
    if r["timedOut"].as_bool() == Some(true) {
        line.push_str(", timed out");
    }
    line.push_str(whose);
    if let Some(err) = r["error"].as_str().filter(|_| r["cancelledBy"].is_null()) {
        line.push_str(&format!("\nerror: {}", shown(err)));
    }
    line
}

pub fn executors(v: &Value) -> String {
    let list = v.as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        return "no executor has polled this master: queued jobs wait until one does (agentos executor --help)".into();
    }
    let mut out = format!("{:<24} {:<8} {:<26} JOBS\n", "NAME", "STATE", "LAST SEEN");
    for e in list {
        let jobs: Vec<&str> =
            e["jobs"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let mut held = jobs.join(",");
        // Jobs in models the caller may not use are counted, never named.
        if let Some(n) = e["otherJobs"].as_u64().filter(|n| *n > 0) {
            held =
                if held.is_empty() { format!("{n} in other models") } else { format!("{held} (+{n} in other models)") };
        }
        out.push_str(&format!("{:<24} {:<8} {:<26} {held}\n", s(&e, "name"), s(&e, "state"), s(&e, "lastSeen")));
    }
    out.trim_end().to_string()
}

pub fn net(v: &Value) -> String {
    let mut out = format!("net of model {}\n", s(v, "model"));
    out.push_str("places:\n");
    for p in v["places"].as_array().cloned().unwrap_or_default() {
        out.push_str(&format!(
            "  {:<24} {} token(s), {} reserved\n",
            s(&p, "id"),
            p["tokens"].as_u64().unwrap_or(0),
            p["reserved"].as_u64().unwrap_or(0)
        ));
    }
    out.push_str("transitions:\n");
    for t in v["transitions"].as_array().cloned().unwrap_or_default() {
        let state = if t["started"].as_bool() == Some(true) { "started" } else { "stopped" };
        // The master's words, which may quote a tool's or an expression's text: one line, inert.
        let err = t["lastError"].as_str().map(|e| format!("  last error: {}", shown(e))).unwrap_or_default();
        out.push_str(&format!(
            "  {:<24} {:<8} {:<8} fires {} in flight {}{err}\n",
            s(&t, "id"),
            s(&t, "kind"),
            state,
            t["fires"].as_u64().unwrap_or(0),
            t["inFlight"].as_u64().unwrap_or(0)
        ));
    }
    out.trim_end().to_string()
}

pub fn tokens(v: &Value) -> String {
    if v.as_array().is_none_or(|a| a.is_empty()) {
        return "no tokens".into();
    }
    each_line(v, |t| format!("{}  {}", s(t, "id"), agentos_core::name::json_inert(&t["data"].to_string())))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn token_data_is_inert_in_a_terminal() {
        let v = json!([{"id": "t1", "data": {"x": "a\u{9b}2J\u{202e}b"}}]);
        assert_eq!(super::tokens(&v), r#"t1  {"x":"a\u009b2J\u202eb"}"#);
    }

    #[test]
    fn a_job_line_names_its_attempt_only_when_it_ran_again() {
        let job = |attempt: u64| {
            json!({"jobId": "job-1", "model": "m", "state": "finished",
                "results": [{"exitCode": 0, "durationMs": 12, "executor": "b", "attempt": attempt}]})
        };
        assert_eq!(super::job(&job(1)), "job job-1 in m: finished, exit code 0, 12 ms on b");
        assert_eq!(super::job(&job(2)), "job job-1 in m: finished, exit code 0, 12 ms on b, attempt 2");
    }

    /// Whose a job is, said when it is not the reader's: only its invoker may cancel it.
    #[test]
    fn a_job_line_says_whose_the_job_is_when_not_the_readers() {
        let job = |invoker: &str, state: &str| {
            let mut v = json!({"jobId": "job-1", "model": "m", "state": state, "invoker": invoker, "results": []});
            if state == "finished" {
                v["results"] = json!([{"exitCode": 0, "durationMs": 12, "executor": "b", "attempt": 1}]);
            }
            v
        };
        assert_eq!(super::job(&job("you", "running")), "job job-1 in m: running");
        assert_eq!(super::job(&job("another", "running")), "job job-1 in m: running, invoked by another principal");
        assert_eq!(
            super::job(&job("net", "finished")),
            "job job-1 in m: finished, exit code 0, 12 ms on b, a step of a net's fire"
        );
    }

    /// Regression: an MCP server's registration printed an empty `urn:` line (its blob is its
    /// `toolsUrn`); a field a binding lacks is left out.
    #[test]
    fn a_registration_shows_the_blob_it_is_pinned_to_and_no_empty_field() {
        let mcp = json!({"id": "tools", "model": "m", "scope": "local", "binding": {"type": "mcp",
            "toolsUrn": "urn:agentos:blob:tool-catalog/mcp/ab.json", "sha256": "ab"}});
        assert_eq!(
            super::registered(&mcp),
            "registered tools in model m (local)\nsha256: ab\nurn:    urn:agentos:blob:tool-catalog/mcp/ab.json"
        );
        let bare = json!({"id": "t", "model": "m", "scope": "local", "binding": {"type": "other"}});
        assert_eq!(super::registered(&bare), "registered t in model m (local)");
        let skipped = json!({"id": "h", "model": "m", "scope": "local", "binding": {"type": "http",
            "openapiUrn": "urn:x", "sha256": "cd", "skipped": [{"pointer": "/paths/~1x", "reason": "bad\n\u{1b}[31mred"}]}});
        assert!(
            super::registered(&skipped).ends_with("\nskipped /paths/~1x: bad red"),
            "{}",
            super::registered(&skipped)
        );
    }

    /// Regression: an entry's description (and name, file name) was printed as registered, line
    /// breaks and escape codes with it.
    #[test]
    fn an_entry_shows_what_its_registrant_wrote_on_one_inert_line() {
        let e = json!({"id": "t", "name": "T\u{1b}[2J", "version": "1.0.0", "status": "active", "model": "m",
            "description": "Reads.\n## System\u{202e}", "binding": {"type": "script", "filename": "a\nb.sh"}});
        let text = super::entry(&e);
        assert!(text.contains("\nname:         T\n"), "{text}");
        assert!(text.contains("\nfilename:     a b.sh\n"), "{text}");
        assert!(text.contains("\ndescription:  Reads. ## System\n"), "{text}");
        assert!(!text.contains('\u{1b}') && !text.contains('\u{202e}'), "{text}");
    }

    /// A transition's last error is the master's text, which may quote a tool's: one line,
    /// with nothing a terminal acts on.
    #[test]
    fn a_transition_s_last_error_is_one_inert_line() {
        let view = json!({"model": "m", "places": [], "transitions": [{"id": "t", "kind": "map", "started": false,
            "fires": 0, "inFlight": 0, "lastError": "bad\nSECOND LINE\u{1b}[31mred\u{202e}"}]});
        let text = super::net(&view);
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(text.ends_with("last error: bad SECOND LINEred"), "{text:?}");
    }
}
