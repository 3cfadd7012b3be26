//! The `agentos` binary as a toolkit: called as `agentos-{toolkit}` it runs that toolkit's tools
//! (`agentos-weather forecast --city Paris`), plus `list-tools`, `install-shims` and `prompt`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Value, json};

use agentos_core::entry::CatalogEntry;
use agentos_core::search::MAX_LIMIT;
use agentos_core::{flagmap, toolhelp};

use crate::client::{ClientError, Conn, EXIT_NOT_FOUND, EXIT_USAGE, exit};

/// The toolkit this process stands for, when it was started as `agentos-{toolkit}`.
pub fn toolkit_of_argv0() -> Option<String> {
    let arg0 = std::env::args_os().next()?;
    let name = Path::new(&arg0).file_name()?.to_str()?.to_string();
    name.strip_prefix("agentos-").filter(|tk| !tk.is_empty()).map(str::to_string)
}

/// Environment only: a shim takes no connection flags, so every flag is the tool's.
fn conn() -> Conn {
    Conn {
        url: std::env::var("AGENTOS_URL").unwrap_or_else(|_| "http://127.0.0.1:7420".into()),
        token: std::env::var("AGENTOS_TOKEN").ok(),
        data: std::env::var("AGENTOS_DATA").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from("./.agentos")),
    }
}

fn model_query() -> Vec<(&'static str, String)> {
    std::env::var("AGENTOS_MODEL").ok().filter(|m| !m.is_empty()).map(|m| vec![("model", m)]).unwrap_or_default()
}

fn fail(code: u8, message: String) -> ClientError {
    ClientError { code, message, status: None, error_code: None }
}

/// Largest file `--x-file` sends; past it the master hears why instead.
const MAX_FLAG_FILE: u64 = 64 << 20;

/// `--x-file PATH`: the file is read here, where it is, and sent marked with its path (see
/// `flagmap::FILE_MARK`). The master decides what it is for: the value of a string flag `--x`
/// (text, or a data URL for bytes), or the path itself when the tool has a flag `--x-file`.
fn read_flag_file(path: &str) -> String {
    let read = || -> Result<String, String> {
        let p = std::path::Path::new(path);
        let len = std::fs::metadata(p).map_err(|e| e.to_string())?.len();
        if len > MAX_FLAG_FILE {
            return Err(format!("{len} bytes, more than the {} MiB a flag's file may hold", MAX_FLAG_FILE >> 20));
        }
        let bytes = std::fs::read(p).map_err(|e| e.to_string())?;
        let name = p.file_name().and_then(|n| n.to_str());
        Ok(flagmap::DataUrl::encode(media_type_of(path), name, &bytes))
    };
    flagmap::mark_file(path, read())
}

/// The media type a file's name suggests, for a file part's `Content-Type`.
fn media_type_of(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/x-ndjson",
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "wav" => "audio/wav",
        "mp3" => "audio/mpeg",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        _ => "application/octet-stream",
    }
}

/// `--json-file PATH` (or `-` for stdin) is read here, where the file is, and sent as `--json`;
/// so is the file of any other `--x-file PATH`.
fn inline_json_files(args: Vec<String>) -> Result<Vec<String>, ClientError> {
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let other_file = a.strip_prefix("--").and_then(|f| f.split_once('=').map_or(Some(f), |(n, _)| Some(n)));
        if let Some(flag) = other_file.filter(|f| f.ends_with("-file") && *f != "json-file" && f.len() > 5) {
            let flag = flag.to_string();
            let path = match a.split_once('=') {
                Some((_, p)) => p.to_string(),
                None => it.next().ok_or_else(|| fail(EXIT_USAGE, format!("--{flag} needs a path")))?,
            };
            out.push(format!("--{flag}={}", read_flag_file(&path)));
            continue;
        }
        let path = if a == "--json-file" {
            Some(it.next().ok_or_else(|| fail(EXIT_USAGE, "--json-file needs a path, or - for stdin".into()))?)
        } else {
            a.strip_prefix("--json-file=").map(str::to_string)
        };
        match path {
            None => out.push(a),
            Some(p) => {
                let text = if p == "-" {
                    let mut s = String::new();
                    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                        .map_err(|e| fail(EXIT_USAGE, format!("--json-file -: {e}")))?;
                    s
                } else {
                    std::fs::read_to_string(&p).map_err(|e| fail(EXIT_USAGE, format!("--json-file {p}: {e}")))?
                };
                out.push("--json".into());
                out.push(text);
            }
        }
    }
    Ok(out)
}

fn entry(conn: &Conn, toolkit: &str) -> Result<CatalogEntry, ClientError> {
    let v = conn.request(reqwest::Method::GET, &format!("/api/tool-catalog/{toolkit}"), &model_query(), None)?;
    serde_json::from_value(v).map_err(|e| fail(1, format!("unreadable catalog entry: {e}")))
}

/// `agentos-{toolkit} ...`
pub fn run(toolkit: String, args: Vec<String>) -> ExitCode {
    let label = match args.first() {
        Some(t) if !t.starts_with('-') => format!("agentos-{toolkit} {t}"),
        _ => format!("agentos-{toolkit}"),
    };
    let json_in = args.iter().any(|a| a == "--json" || a.starts_with("--json=") || a.starts_with("--json-file"));
    match run_inner(&toolkit, args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the caller is often a script or an agent reading stderr.
            eprintln!("{label}: {}", e.message.lines().next().unwrap_or(""));
            if json_in {
                // A caller that speaks JSON reads stdout: the failure in the answer's shape, with
                // the master's status and code, which the line leaves off.
                println!("{}", failure_json(&e));
            }
            ExitCode::from(e.code)
        }
    }
}

/// A failure as a caller that passed `--json` reads it on stdout, in the shape of an answer.
fn failure_json(e: &ClientError) -> Value {
    json!({"ok": false, "error": {"code": e.error_code, "message": e.message, "status": e.status, "exitCode": e.code}})
}

fn run_inner(toolkit: &str, args: Vec<String>) -> Result<(), ClientError> {
    if !agentos_core::name::is_valid_id(toolkit) {
        return Err(fail(EXIT_USAGE, format!("{toolkit:?} is not a toolkit name")));
    }
    let conn = conn();
    let json_out = args.iter().any(|a| a == "--json") && args.iter().any(|a| a == "--help" || a == "-h");
    match args.first().map(String::as_str) {
        None | Some("--help") | Some("-h") => {
            let e = entry(&conn, toolkit)?;
            if json_out {
                println!("{}", serde_json::to_string_pretty(&e.contract).unwrap_or_default());
            } else {
                print!("{}", toolhelp::toolkit_help(&e));
            }
            Ok(())
        }
        Some(tool) if tool.starts_with('-') => {
            Err(fail(EXIT_USAGE, format!("name a tool first: agentos-{toolkit} <tool> ... (see --help)")))
        }
        Some(tool) => {
            let rest: Vec<String> = args[1..].to_vec();
            if rest.iter().any(|a| a == "--help" || a == "-h") {
                let e = entry(&conn, toolkit)?;
                let op = e.contract.operations.get(tool).ok_or_else(|| {
                    let tools: Vec<&str> = e.contract.operations.keys().map(String::as_str).collect();
                    fail(EXIT_NOT_FOUND, format!("no tool {tool:?} in {toolkit}; its tools: {}", tools.join(", ")))
                })?;
                if json_out {
                    println!("{}", serde_json::to_string_pretty(op).unwrap_or_default());
                } else {
                    print!("{}", toolhelp::tool_help(toolkit, tool, op));
                }
                return Ok(());
            }
            let rest = inline_json_files(rest)?;
            let answer = conn.request(
                reqwest::Method::POST,
                &format!("/api/tools/{toolkit}/call"),
                &model_query(),
                Some(json!({"tool": tool, "args": rest})),
            )?;
            println!("{}", serde_json::to_string(&answer).unwrap_or_default());
            Ok(())
        }
    }
}

/// The entries the caller can see, one per id (a shadowed global one is left out), from every
/// page of the search: one page holds at most `MAX_LIMIT` entries.
fn visible(conn: &Conn, model: Option<&str>) -> Result<Vec<CatalogEntry>, ClientError> {
    let items = all_pages(MAX_LIMIT, |offset, limit| {
        let mut q = vec![("limit", limit.to_string()), ("offset", offset.to_string())];
        if let Some(m) = model {
            q.push(("model", m.to_string()));
        }
        conn.request(reqwest::Method::GET, "/api/tool-catalog", &q, None)
    })?;
    Ok(items
        .into_iter()
        .filter(|e| e["shadowed"].as_bool() != Some(true))
        .filter_map(|e| serde_json::from_value(e).ok())
        .collect())
}

/// Every item of a paged search (`{items, total}` pages fetched by offset and limit), in order.
/// An entry registered or removed between two pages can shift the rest by one: a repeated
/// (id, scope) is kept once, and the walk ends at the first short page rather than at a `total`
/// that may have moved.
fn all_pages(
    page_size: usize,
    mut fetch: impl FnMut(usize, usize) -> Result<Value, ClientError>,
) -> Result<Vec<Value>, ClientError> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let page = fetch(offset, page_size)?;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        let n = items.len();
        for e in items {
            let key = (e["id"].as_str().unwrap_or_default().to_string(), e["scope"].to_string());
            if seen.insert(key) {
                out.push(e);
            }
        }
        offset += n;
        if n < page_size || offset >= page["total"].as_u64().unwrap_or(0) as usize {
            return Ok(out);
        }
    }
}

/// `agentos list-tools [toolkit]`
pub fn list_tools(conn: &Conn, toolkit: Option<&str>, model: Option<&str>, json_out: bool) -> ExitCode {
    exit((|| {
        let entries = match toolkit {
            Some(tk) => vec![entry(conn, tk)?],
            None => visible(conn, model)?,
        };
        let tools = toolhelp::prompt_tools(&entries);
        if json_out {
            println!("{}", serde_json::to_string_pretty(&tools).unwrap_or_default());
        } else if toolkit.is_some() {
            for t in &tools {
                println!("{}\n    {}", t.usage, t.description);
            }
        } else {
            let width = tools.iter().map(|t| t.toolkit.len() + t.tool.len() + 1).max().unwrap_or(0);
            for t in &tools {
                println!("{:<width$}  {}", format!("{} {}", t.toolkit, t.tool), t.description);
            }
        }
        Ok(())
    })())
}

/// `agentos install-shims --dir DIR`: links every visible toolkit, removes stale links.
pub fn install_shims(conn: &Conn, dir: &Path, model: Option<&str>) -> ExitCode {
    exit((|| {
        let me = std::env::current_exe().map_err(|e| fail(1, format!("cannot find this program: {e}")))?;
        std::fs::create_dir_all(dir).map_err(|e| fail(EXIT_USAGE, format!("cannot create {}: {e}", dir.display())))?;
        let wanted: Vec<String> = visible(conn, model)?.into_iter().map(|e| e.id).collect();
        let mut linked = 0;
        for id in &wanted {
            let link = dir.join(format!("agentos-{id}"));
            if std::fs::read_link(&link).is_ok_and(|t| t == me) {
                continue;
            }
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&me, &link)
                .map_err(|e| fail(1, format!("cannot link {}: {e}", link.display())))?;
            linked += 1;
        }
        let mut removed = 0;
        for e in std::fs::read_dir(dir).map_err(|e| fail(1, e.to_string()))?.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(id) = name.strip_prefix("agentos-") else { continue };
            // Only links to this program are ours to remove.
            if !wanted.iter().any(|w| w == id) && std::fs::read_link(e.path()).is_ok_and(|t| t == me) {
                std::fs::remove_file(e.path()).map_err(|err| fail(1, err.to_string()))?;
                removed += 1;
            }
        }
        println!("{} toolkit(s) in {}: {linked} linked, {removed} stale link(s) removed", wanted.len(), dir.display());
        Ok(())
    })())
}

/// `agentos prompt`
pub fn prompt(conn: &Conn, model: Option<&str>, format: &str) -> ExitCode {
    exit((|| {
        let tools = toolhelp::prompt_tools(&visible(conn, model)?);
        let markdown = toolhelp::prompt_markdown(&tools);
        match format {
            "markdown" | "md" => print!("{markdown}"),
            "json" => {
                let tokens = toolhelp::estimate_tokens(&markdown);
                let v: Value = json!({
                    "tools": tools,
                    "markdown": markdown,
                    "estimatedTokens": tokens,
                    "tokensPerTool": if tools.is_empty() { 0.0 } else { tokens as f64 / tools.len() as f64 },
                    "estimate": "characters / 4",
                });
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            }
            other => return Err(fail(EXIT_USAGE, format!("--format {other:?}: use markdown or json"))),
        }
        Ok(())
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A catalog of `n` entries served in pages the way the master serves them.
    fn catalog(n: usize) -> impl FnMut(usize, usize) -> Result<Value, ClientError> {
        move |offset, limit| {
            let items: Vec<Value> = (offset..n.min(offset + limit))
                .map(|i| json!({"id": format!("tool-{i:05}"), "scope": "global"}))
                .collect();
            Ok(json!({"items": items, "total": n, "limit": limit, "offset": offset}))
        }
    }

    fn check(n: usize, page_size: usize) {
        let got = all_pages(page_size, catalog(n)).unwrap();
        assert_eq!(got.len(), n, "{n} entries in pages of {page_size}");
        let ids: Vec<&str> = got.iter().map(|e| e["id"].as_str().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "out of order or repeated");
    }

    /// Regression: `list-tools`, `install-shims` and `prompt` read one page of at most 1,000
    /// entries and dropped the rest.
    #[test]
    fn every_page_is_read() {
        check(0, MAX_LIMIT);
        check(1, MAX_LIMIT);
        check(MAX_LIMIT, MAX_LIMIT);
        check(MAX_LIMIT + 1, MAX_LIMIT);
        check(2_500, MAX_LIMIT);
        check(7, 3);
    }

    #[test]
    fn an_entry_shifted_into_the_next_page_is_kept_once() {
        // Between the first two fetches `a0` is registered before the page boundary, so the
        // second page starts with the first page's last entry again.
        let got = all_pages(2, |offset, _| {
            let ids: &[&str] = match offset {
                0 => &["a", "b"],
                2 => &["b", "c"],
                _ => &["d"],
            };
            let items: Vec<Value> = ids.iter().map(|i| json!({"id": i, "scope": "global"})).collect();
            Ok(json!({"items": items, "total": if offset == 0 { 4 } else { 5 }}))
        })
        .unwrap();
        let ids: Vec<&str> = got.iter().map(|e| e["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["a", "b", "c", "d"]);
    }
}
