//! A toolkit as a shell command: called as `agentos-{toolkit}`, a process runs that toolkit's
//! tools (`agentos-weather forecast --city Paris`). Shared by the `agentos` binary and the small
//! `agentos-shim` that shims link to.

use std::path::Path;

use serde_json::{Value, json};

use agentos_core::entry::CatalogEntry;
use agentos_core::name::json_inert;
use agentos_core::{flagmap, toolhelp};

use crate::call::{ClientError, EXIT_NOT_FOUND, EXIT_USAGE, Target, fail};

/// The toolkit this process stands for, when it was started as `agentos-{toolkit}`.
pub fn toolkit_of_argv0() -> Option<String> {
    let arg0 = std::env::args_os().next()?;
    let name = Path::new(&arg0).file_name()?.to_str()?.to_string();
    name.strip_prefix("agentos-").filter(|tk| !tk.is_empty()).map(str::to_string)
}

/// How a request reaches a master that a plain exchange does not (`https://`, a proxy): what
/// the binary has for it.
pub type Fallback = fn(&Target, &str, &str, &[(&str, String)], Option<Value>) -> Result<Value, ClientError>;

/// The master, and how to reach it.
pub(crate) struct Master {
    pub target: Target,
    pub fallback: Fallback,
}

impl Master {
    fn request(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> Result<Value, ClientError> {
        match self.target.request(method, path, query, body.as_ref()) {
            Some(answer) => answer,
            None => (self.fallback)(&self.target, method, path, query, body),
        }
    }
}

fn model_query() -> Vec<(&'static str, String)> {
    std::env::var("AGENTOS_MODEL").ok().filter(|m| !m.is_empty()).map(|m| vec![("model", m)]).unwrap_or_default()
}

/// Largest file `--x-file` sends; past it the master hears why instead.
const MAX_FLAG_FILE: u64 = 64 << 20;

/// `--x-file PATH` for a string flag `--x`: the file is read here, where it is, and sent marked
/// with its path (see `flagmap::FILE_MARK`). The master makes it the value of `--x`: text, or a
/// data URL for bytes. (A flag `--x-file` of the tool's own is never read: see
/// [`inline_json_files`].)
fn read_flag_file(path: &str) -> String {
    let read = || -> Result<String, String> {
        if path == "-" {
            let bytes = read_bounded(std::io::stdin().lock())?;
            return Ok(flagmap::DataUrl::encode("application/octet-stream", None, &bytes));
        }
        let p = std::path::Path::new(path);
        let len = std::fs::metadata(p).map_err(|e| e.to_string())?.len();
        if len > MAX_FLAG_FILE {
            return Err(format!("{len} bytes, more than the {} MiB a flag's file may hold", MAX_FLAG_FILE >> 20));
        }
        let bytes = read_bounded(std::fs::File::open(p).map_err(|e| e.to_string())?)?;
        let name = p.file_name().and_then(|n| n.to_str());
        Ok(flagmap::DataUrl::encode(media_type_of(path), name, &bytes))
    };
    flagmap::mark_file(path, read())
}

/// At most [`MAX_FLAG_FILE`] bytes of `from`, or why not. The size a file reports bounds
/// nothing for a device or a pipe (`/dev/zero` says 0): the read itself stops.
fn read_bounded(from: impl std::io::Read) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(from, MAX_FLAG_FILE + 1), &mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_FLAG_FILE {
        return Err(format!("more than the {} MiB a flag's file may hold", MAX_FLAG_FILE >> 20));
    }
    Ok(bytes)
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

/// The flag of an argument `--x-file` or `--x-file=PATH` (`x-file`), other than `--json-file`:
/// one that may give a string flag `--x` its file.
fn file_flag_of(arg: &str) -> Option<&str> {
    let flag = arg.strip_prefix("--")?;
    let flag = flag.split_once('=').map_or(flag, |(name, _)| name);
    Some(flag).filter(|f| f.ends_with("-file") && *f != "json-file" && f.len() > 5)
}

/// Whether the arguments hold an `--x-file` with a path after it, a file this process may have
/// to read.
fn names_flag_files(args: &[String]) -> bool {
    args.iter().enumerate().any(|(i, a)| {
        file_flag_of(a).is_some() && (a.contains('=') || args.get(i + 1).is_some_and(|next| !next.starts_with("--")))
    })
}

/// Whether the arguments after a tool's name ask for its help: `--help` or `-h` where a flag
/// stands, not where a flag's value is expected, as the master's parser reads them. A value
/// after a space never starts with `--`, so `--help` always asks (`--name=--help` is a value);
/// `-h` after a flag that takes a value is that value (`--name -h`), which only the tool's
/// `table` tells. Without it (a tool the toolkit lacks), `-h` asks, and the help says so.
/// `--json` beside a help flag asks for the help as JSON, so it takes no `-h` as its value.
fn asks_help(rest: &[String], table: Option<&flagmap::FlagTable>) -> bool {
    let mut args = rest.iter().peekable();
    while let Some(a) = args.next() {
        if a == "--help" || a == "-h" {
            return true;
        }
        let Some(name) = a.strip_prefix("--").filter(|n| !n.contains('=')) else { continue };
        let takes_value = match name {
            "json" => false,
            "json-file" => true,
            _ => table.is_some_and(|t| t.takes_value(name)),
        };
        if takes_value {
            args.next_if(|next| !next.starts_with("--"));
        }
    }
    false
}

/// `--json-file PATH` (or `-` for stdin) is read here, where the file is, and sent as `--json`;
/// so is the file of any other `--x-file PATH` that gives a string flag `--x` its file, as the
/// tool's flag `table` says. An `--x-file` that is a flag of the tool's own (or one the table
/// does not know) is sent as written: the master gives it the path, or says what is wrong, and
/// nothing here is read (a large file, a pipe that never ends, a file the tool was not given).
fn inline_json_files(args: Vec<String>, table: Option<&flagmap::FlagTable>) -> Result<Vec<String>, ClientError> {
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.into_iter().peekable();
    while let Some(a) = it.next() {
        let read_here = file_flag_of(&a).filter(|f| table.is_some_and(|t| t.file_flag(f).is_some()));
        if let Some(flag) = read_here {
            let flag = flag.to_string();
            let path = match a.split_once('=') {
                Some((_, p)) => p.to_string(),
                // No path follows: a path left out, which the master says. Nothing is read.
                None => match it.next_if(|next| !next.starts_with("--")) {
                    Some(p) => p,
                    None => {
                        out.push(a);
                        continue;
                    }
                },
            };
            out.push(format!("--{flag}={}", read_flag_file(&path)));
            continue;
        }
        let path = if a == "--json-file" {
            Some(it.next().ok_or_else(|| fail(EXIT_USAGE, "--json-file needs a path, or - for stdin"))?)
        } else {
            a.strip_prefix("--json-file=").map(str::to_string)
        };
        match path {
            None => out.push(a),
            Some(p) => {
                let bytes = if p == "-" {
                    read_bounded(std::io::stdin().lock())
                } else {
                    std::fs::File::open(&p).map_err(|e| e.to_string()).and_then(read_bounded)
                }
                .map_err(|e| fail(EXIT_USAGE, format!("--json-file {p}: {e}")))?;
                let text = String::from_utf8(bytes)
                    .map_err(|_| fail(EXIT_USAGE, format!("--json-file {p}: not UTF-8 text, so not JSON")))?;
                // Checked here, where what was read is known: sent as `--json`, the master's
                // words would name `--json`, which the caller never typed.
                let v: Value = serde_json::from_str(&text)
                    .map_err(|e| fail(EXIT_USAGE, format!("--json-file {p}: not valid JSON: {e}")))?;
                if !v.is_object() {
                    return Err(fail(EXIT_USAGE, format!("--json-file {p}: expected a JSON object")));
                }
                out.push("--json".into());
                out.push(text);
            }
        }
    }
    Ok(out)
}

/// A toolkit's catalog entry, in `AGENTOS_MODEL` when set (`agentos list-tools <toolkit>` too).
pub(crate) fn entry(master: &Master, toolkit: &str) -> Result<CatalogEntry, ClientError> {
    let v = master.request("GET", &format!("/api/tool-catalog/{toolkit}"), &model_query(), None)?;
    serde_json::from_value(v).map_err(|e| fail(1, format!("unreadable catalog entry: {e}")))
}

/// `agentos-{toolkit} ...` with the process's arguments after its name: its exit status.
pub fn run(toolkit: String, args: Vec<std::ffi::OsString>, fallback: Fallback) -> u8 {
    let lossy: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let label = match lossy.first() {
        Some(t) if !t.starts_with('-') => format!("agentos-{toolkit} {t}"),
        _ => format!("agentos-{toolkit}"),
    };
    let json_in = lossy.iter().any(|a| a == "--json" || a.starts_with("--json=") || a.starts_with("--json-file"));
    let outcome = crate::call::take_handed_over()
        .and_then(|()| utf8_args(args))
        .and_then(|args| run_inner(&toolkit, args, fallback));
    match outcome {
        Ok(()) => 0,
        Err(e) => {
            // One line: the caller is often a script or an agent reading stderr. The master
            // names the toolkit and tool too (`probe get-status: …`), which the label already says.
            let line = e.message.lines().next().unwrap_or("");
            let named = lossy.first().map(|t| format!("{toolkit} {t}: "));
            let line = named.as_deref().and_then(|n| line.strip_prefix(n)).unwrap_or(line);
            // A file read here travels base64-encoded, a third larger than on disk: a file under
            // the master's body limit can still be refused as over it.
            let grown = if e.status == Some(413) && names_flag_files(&lossy) {
                "; files read by --…-file travel base64-encoded, a third larger than on disk"
            } else {
                ""
            };
            errln!("{label}: {line}{grown}");
            if json_in || e.response.is_some() {
                // A caller that speaks JSON reads stdout: the failure in the answer's shape, with
                // the master's status and code, which the line leaves off. So does one whose
                // service answered with an error: its body (a validation error's details) is
                // more than the line's excerpt.
                let _ = write_out(&format!("{}\n", json_inert(&failure_json(&e).to_string())));
            }
            e.code
        }
    }
}

/// The arguments as text: a tool's flags and values are JSON strings, so an argument that is not
/// UTF-8 is refused by its place, before anything is sent.
fn utf8_args(args: Vec<std::ffi::OsString>) -> Result<Vec<String>, ClientError> {
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            a.into_string().map_err(|a| {
                fail(EXIT_USAGE, format!("argument {} ({a:?}) is not UTF-8 text; tools take UTF-8 arguments", i + 1))
            })
        })
        .collect()
}

/// Writes to standard output and flushes it, so that an output that cannot take the text (a
/// full disk, a closed terminal) is reported as this call's failure, in one line, rather than a
/// panic. A reader that went away ends the process by `SIGPIPE` first, as for other tools.
fn write_out(text: &str) -> Result<(), ClientError> {
    use std::io::Write;
    if let Some(e) = crate::call::stdout_failed() {
        return Err(fail(crate::call::EXIT_FAILURE, format!("cannot write to standard output: {e}")));
    }
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| fail(crate::call::EXIT_FAILURE, format!("cannot write to standard output: {e}")))
}

/// A failure as a caller that passed `--json` reads it on stdout, in the shape of an answer.
fn failure_json(e: &ClientError) -> Value {
    let mut v = json!({"ok": false, "error": {"code": e.error_code, "message": e.message, "status": e.status, "exitCode": e.code}});
    if let Some(response) = &e.response {
        v["error"]["response"] = response.clone();
    }
    v
}

fn run_inner(toolkit: &str, args: Vec<String>, fallback: Fallback) -> Result<(), ClientError> {
    if !agentos_core::name::is_valid_id(toolkit) {
        return Err(fail(EXIT_USAGE, format!("{toolkit:?} is not a toolkit name")));
    }
    // Environment only: a shim takes no connection flags, so every flag is the tool's.
    let conn = Master { target: Target::from_env(), fallback };
    conn.target.check_url("AGENTOS_URL")?;
    let json_out = args.iter().any(|a| a == "--json") && args.iter().any(|a| a == "--help" || a == "-h");
    match args.first().map(String::as_str) {
        None | Some("--help") | Some("-h") => {
            let e = entry(&conn, toolkit)?;
            if json_out {
                write_out(&format!("{}\n", json_inert(&serde_json::to_string_pretty(&e.contract).unwrap_or_default())))
            } else {
                write_out(&toolhelp::toolkit_help(&e))
            }
        }
        Some(tool) if tool.starts_with('-') => {
            Err(fail(EXIT_USAGE, format!("name a tool first: agentos-{toolkit} <tool> ... (see --help)")))
        }
        Some(tool) => {
            let rest: Vec<String> = args[1..].to_vec();
            // Whether `--x-file` is a flag of the tool's own or gives `--x` a file, and whether
            // `-h` is a value or asks for help, is in the tool's schema, which only the master
            // has. Its entry is read first only when the arguments hold one of these: one more
            // request for those calls alone (help reads the entry anyway). Reading every
            // `--x-file` as a file sent files the tool never reads, and could hang on a pipe;
            // sending the call first and the files when the master asked for them would send a
            // call twice.
            let known = if rest.iter().any(|a| a == "-h") || names_flag_files(&rest) {
                Some(entry(&conn, toolkit)?)
            } else {
                None
            };
            let table =
                known.as_ref().and_then(|e| e.contract.operations.get(tool)).map(|op| flagmap::flag_table(&op.input));
            if asks_help(&rest, table.as_ref()) {
                let e = match known {
                    Some(e) => e,
                    None => entry(&conn, toolkit)?,
                };
                let op = e.contract.operations.get(tool).ok_or_else(|| {
                    let tools: Vec<&str> = e.contract.operations.keys().map(String::as_str).collect();
                    fail(EXIT_NOT_FOUND, toolhelp::unknown_tool(toolkit, tool, &tools))
                })?;
                return if json_out {
                    write_out(&format!("{}\n", json_inert(&serde_json::to_string_pretty(op).unwrap_or_default())))
                } else {
                    write_out(&toolhelp::tool_help(toolkit, tool, op))
                };
            }
            let rest = inline_json_files(rest, table.as_ref())?;
            let answer = conn.request(
                "POST",
                &format!("/api/tools/{toolkit}/call"),
                &model_query(),
                Some(json!({"tool": tool, "args": rest})),
            )?;
            // The call has run: an answer that cannot be written says so, as the call's failure.
            write_out(&format!("{}\n", json_inert(&serde_json::to_string(&answer).unwrap_or_default())))
                .map_err(|e| fail(e.code, format!("the call ran, but its answer is lost: {}", e.message)))
        }
    }
}
