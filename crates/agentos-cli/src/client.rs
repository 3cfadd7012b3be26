//! The API client behind the `catalog` and `models` commands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};

pub use crate::call::{ClientError, EXIT_FAILURE, EXIT_UNREACHABLE, EXIT_USAGE};
use crate::call::{SeenSeq, Target, fail, refusal};
use crate::output;

/// Where the master is and who we are.
#[derive(Args, Clone)]
pub struct Conn {
    /// The master's URL.
    #[arg(long, env = "AGENTOS_URL", default_value = "http://127.0.0.1:7420", global = true)]
    pub url: String,
    /// Bearer token. Without it the operator token of --data is used.
    #[arg(long, env = "AGENTOS_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Data folder whose operator.token is used when no token is given.
    #[arg(long, env = "AGENTOS_DATA", default_value = "./.agentos", global = true)]
    pub data: PathBuf,
}

#[derive(Args)]
pub struct RegisterScriptArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Tool id: a-z, 0-9 and '-', at most 64.
    #[arg(long)]
    pub id: String,
    /// node, sh, bash or python3.
    #[arg(long)]
    pub runtime: String,
    /// The script file.
    #[arg(long)]
    pub file: PathBuf,
    /// Display name (defaults to the id).
    #[arg(long)]
    pub name: Option<String>,
    /// Model to register into; `default` is the global catalog.
    #[arg(long)]
    pub model: Option<String>,
    /// File holding the JSON Schema of the script's input.
    #[arg(long)]
    pub input_schema: Option<PathBuf>,
    /// The tool's version, shown in the catalog.
    #[arg(long)]
    pub version: Option<String>,
    /// What the tool does, shown in search, --help and the prompt.
    #[arg(long)]
    pub description: Option<String>,
    /// A capability tag; repeat for several.
    #[arg(long = "capability")]
    pub capabilities: Vec<String>,
    /// File name the executor gives the script (defaults to the file's name).
    #[arg(long)]
    pub filename: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
#[command(group = clap::ArgGroup::new("document").required(true).args(["openapi", "openapi_url"]))]
pub struct RegisterHttpArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Toolkit id: a-z, 0-9 and '-', at most 64.
    #[arg(long)]
    pub id: String,
    /// The service's base URL; it replaces the document's servers.
    #[arg(long)]
    pub base_url: String,
    /// The OpenAPI document (3.0 or 3.1, JSON or YAML).
    #[arg(long)]
    pub openapi: Option<PathBuf>,
    /// Where the master fetches the OpenAPI document.
    #[arg(long)]
    pub openapi_url: Option<String>,
    /// The credential: bearer:SECRET, header:NAME:SECRET, query:NAME:SECRET or basic:SECRET,
    /// naming a secret granted to the service's origin.
    #[arg(long)]
    pub auth: Option<String>,
    /// Keep only this operation (by tool name); repeat for several.
    #[arg(long = "include")]
    pub include: Vec<String>,
    /// Display name (defaults to the id).
    #[arg(long)]
    pub name: Option<String>,
    /// What the service does, shown in search, --help and the prompt.
    #[arg(long)]
    pub description: Option<String>,
    /// A capability tag; repeat for several.
    #[arg(long = "capability")]
    pub capabilities: Vec<String>,
    /// How long one call may take, in milliseconds.
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
#[command(group = clap::ArgGroup::new("server").required(true).args(["command", "server_url"]))]
pub struct RegisterMcpArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Toolkit id: a-z, 0-9 and '-', at most 64.
    #[arg(long)]
    pub id: String,
    /// The program of a stdio server (the operator's to register); it runs as the sandbox user.
    #[arg(long)]
    pub command: Option<String>,
    /// An argument of the command; repeat for several.
    #[arg(long = "arg", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// VAR=SECRET: the command's environment variable VAR gets the value of secret SECRET;
    /// repeat for several.
    #[arg(long = "env")]
    pub env: Vec<String>,
    /// The streamable HTTP endpoint of a url server (`--url` is the master's, as on every
    /// command).
    #[arg(long)]
    pub server_url: Option<String>,
    /// A url server's credential: bearer:SECRET, header:NAME:SECRET or basic:SECRET, naming a
    /// secret granted to the server's origin.
    #[arg(long)]
    pub auth: Option<String>,
    /// The model whose catalog holds it (default: your home model).
    #[arg(long)]
    pub model: Option<String>,
    /// Keep only this tool (by the server's name or the operation's); repeat for several.
    #[arg(long = "include")]
    pub include: Vec<String>,
    /// Display name (defaults to the id).
    #[arg(long)]
    pub name: Option<String>,
    /// What the server does, shown in search, --help and the prompt.
    #[arg(long)]
    pub description: Option<String>,
    /// A capability tag; repeat for several.
    #[arg(long = "capability")]
    pub capabilities: Vec<String>,
    /// How long one call may take, in milliseconds.
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ImportImageArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The image, in the local registry: 127.0.0.1:5001/NAME[:TAG].
    pub image: String,
    /// Toolkit id: a-z, 0-9 and '-', at most 64.
    #[arg(long)]
    pub id: String,
    /// Display name (defaults to the id).
    #[arg(long)]
    pub name: Option<String>,
    /// A secret the container receives as an environment variable of its name, once the
    /// operator grants it to this toolkit; repeat for several.
    #[arg(long = "secret")]
    pub secrets: Vec<String>,
    /// What the toolkit does, shown in search, --help and the prompt.
    #[arg(long)]
    pub description: Option<String>,
    /// A capability tag; repeat for several.
    #[arg(long = "capability")]
    pub capabilities: Vec<String>,
    /// How long one call may take, in milliseconds.
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub struct ListArgs {
    pub kind: Option<String>,
    pub model: Option<String>,
    pub q: Option<String>,
    pub capability: Option<String>,
    pub limit: Option<usize>,
    pub offset: Option<usize>,
}

pub fn exit(r: Result<(), ClientError>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match e.status {
                Some(status) => errln!("error: {} (HTTP {status})", e.message),
                None => errln!("error: {}", e.message),
            }
            ExitCode::from(e.code)
        }
    }
}

impl SeenSeq {
    fn ask(&self, req: reqwest::blocking::RequestBuilder) -> reqwest::blocking::RequestBuilder {
        match self.seen {
            Some(n) => req.header("Agentos-Min-Seq", n.to_string()),
            None => req,
        }
    }

    /// Keeps an answer's `Agentos-Seq` when it is further than what was seen. Best effort: a
    /// file that cannot be written only costs the wait.
    fn note(&self, resp: &reqwest::blocking::Response) {
        if let Some(seq) = resp.headers().get("agentos-seq").and_then(|v| v.to_str().ok()?.parse::<u64>().ok()) {
            self.note_seq(seq);
        }
    }
}

impl Conn {
    /// The master and the credentials, for a plain exchange.
    /// The master to ask; a URL that names none is refused here, before anything is sent.
    pub(crate) fn target(&self) -> Result<Target, ClientError> {
        let target = Target { url: self.url.clone(), token: self.token.clone(), data: self.data.clone() };
        target.check_url("--url (or AGENTOS_URL)")?;
        Ok(target)
    }

    pub(crate) fn token(&self) -> Result<String, ClientError> {
        self.target()?.token()
    }

    fn bytes(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        let token = self.token()?;
        let url = format!("{}{}", self.url.trim_end_matches('/'), path);
        let seen = SeenSeq::of(&token);
        let resp = seen
            .ask(reqwest::blocking::Client::new().get(&url).bearer_auth(token))
            .send()
            .map_err(|e| fail(EXIT_UNREACHABLE, format!("cannot reach the master at {}: {e}", self.url)))?;
        seen.note(&resp);
        let status = resp.status();
        let bytes = resp.bytes().map_err(|e| fail(EXIT_FAILURE, format!("reading {path}: {e}")))?;
        if !status.is_success() {
            // The master's refusal, with its exit code (3 not allowed, 4 not found, ...).
            let value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
            return Err(refusal(status.as_u16(), &value));
        }
        Ok(bytes.to_vec())
    }

    pub(crate) fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> Result<Value, ClientError> {
        let target = self.target()?;
        if let Some(answer) = target.request(method.as_str(), path, query, body.as_ref()) {
            return answer;
        }
        self.request_with(method, path, query, body, &[])
    }

    /// As [`Conn::request`], with `headers` sent besides.
    pub(crate) fn request_with(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Result<Value, ClientError> {
        let target = self.target()?;
        let token = self.token()?;
        let url = format!("{}{}", self.url.trim_end_matches('/'), path);
        let seen = SeenSeq::of(&token);
        let client = reqwest::blocking::Client::builder()
            .timeout(crate::call::REQUEST_TIMEOUT)
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| fail(EXIT_FAILURE, format!("http client: {e}")))?;
        let mut req = seen.ask(client.request(method, &url).bearer_auth(token).query(query));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .map_err(|e| if e.is_timeout() && !e.is_connect() { target.no_answer() } else { target.unreachable(&e) })?;
        seen.note(&resp);
        let status = resp.status();
        let text = resp.text().map_err(|e| fail(EXIT_FAILURE, format!("reading the answer: {e}")))?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            return Ok(value);
        }
        Err(refusal(status.as_u16(), &value))
    }

    /// POSTs a registration command and follows it: each step the master reports goes to
    /// `step` as it comes (`Accept: application/x-ndjson`); answers the stored entry.
    pub(crate) fn register_following(&self, body: Value, mut step: impl FnMut(&str)) -> Result<Value, ClientError> {
        use std::io::BufRead;
        let token = self.token()?;
        let client = reqwest::blocking::Client::builder()
            .timeout(std::time::Duration::from_secs(600))
            .build()
            .map_err(|e| fail(EXIT_FAILURE, format!("http client: {e}")))?;
        let url = format!("{}/api/commands", self.url.trim_end_matches('/'));
        let seen = SeenSeq::of(&token);
        let resp = seen
            .ask(client.post(&url).bearer_auth(token))
            .header("accept", "application/x-ndjson")
            .json(&body)
            .send()
            .map_err(|e| {
                fail(
                    EXIT_UNREACHABLE,
                    format!("cannot reach the master at {}: {e} (is `agentos up` running? set AGENTOS_URL)", self.url),
                )
            })?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().unwrap_or_default();
            let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            return Err(refusal(status.as_u16(), &value));
        }
        for line in std::io::BufReader::new(resp).lines() {
            let line = line.map_err(|e| fail(EXIT_FAILURE, format!("reading the answer: {e}")))?;
            let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
            if let Some(s) = v.get("progress").and_then(Value::as_str) {
                step(s);
            } else if let Some(entry) = v.get("entry") {
                // A streamed answer's headers left before the commit: the entry's revision is
                // the event that stored it.
                if let Some(rev) = entry.get("revision").and_then(Value::as_u64) {
                    seen.note_seq(rev);
                }
                return Ok(entry.clone());
            } else if let Some(e) = v.get("error") {
                let status = e.get("status").and_then(Value::as_u64).unwrap_or(500) as u16;
                return Err(refusal(status, &v));
            }
        }
        Err(fail(EXIT_FAILURE, "the master ended the answer before saying how the registration went"))
    }
}

fn opt(q: &mut Vec<(&'static str, String)>, k: &'static str, v: Option<String>) {
    if let Some(v) = v {
        q.push((k, v));
    }
}

pub fn list(conn: &Conn, a: ListArgs, json: bool) -> Result<(), ClientError> {
    let mut q = Vec::new();
    opt(&mut q, "type", a.kind);
    opt(&mut q, "model", a.model);
    opt(&mut q, "q", a.q);
    opt(&mut q, "capability", a.capability);
    opt(&mut q, "limit", a.limit.map(|l| l.to_string()));
    opt(&mut q, "offset", a.offset.map(|l| l.to_string()));
    let page = conn.request(reqwest::Method::GET, "/api/tool-catalog", &q, None)?;
    output::print(&page, json, output::search_page);
    Ok(())
}

fn model_query(model: Option<&str>) -> Vec<(&'static str, String)> {
    model.map(|m| vec![("model", m.to_string())]).unwrap_or_default()
}

fn path_id(id: &str) -> Result<&str, ClientError> {
    if agentos_core::name::is_valid_id(id) {
        Ok(id)
    } else {
        Err(fail(EXIT_USAGE, format!("invalid tool id {id:?}: use a-z, 0-9 and '-', at most 64 characters")))
    }
}

pub fn get(conn: &Conn, id: &str, model: Option<&str>, json: bool) -> Result<(), ClientError> {
    let e =
        conn.request(reqwest::Method::GET, &format!("/api/tool-catalog/{}", path_id(id)?), &model_query(model), None)?;
    output::print(&e, json, output::entry);
    Ok(())
}

pub fn history(conn: &Conn, id: &str, model: Option<&str>, json: bool) -> Result<(), ClientError> {
    let h = conn.request(
        reqwest::Method::GET,
        &format!("/api/tool-catalog/{}/history", path_id(id)?),
        &model_query(model),
        None,
    )?;
    output::print(&h, json, output::history);
    Ok(())
}

pub fn remove(conn: &Conn, id: &str, model: Option<&str>, json: bool) -> Result<(), ClientError> {
    let mut body = json!({"type": "TOOL_CATALOG_REMOVE", "id": id});
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    let r = conn.request(reqwest::Method::POST, "/api/commands", &[], Some(body))?;
    output::print(&r, json, |v| {
        format!("removed {} from model {}", v["id"].as_str().unwrap_or(""), v["model"].as_str().unwrap_or(""))
    });
    Ok(())
}

pub fn models(conn: &Conn, json: bool) -> Result<(), ClientError> {
    let m = conn.request(reqwest::Method::GET, "/api/models", &[], None)?;
    output::print(&m, json, output::models);
    Ok(())
}

pub fn register_script(a: RegisterScriptArgs) -> Result<(), ClientError> {
    let bytes =
        std::fs::read(&a.file).map_err(|e| fail(EXIT_USAGE, format!("cannot read {}: {e}", a.file.display())))?;
    let mut body = json!({
        "type": "TOOL_CATALOG_REGISTER_SCRIPT",
        "id": a.id,
        "name": a.name.clone().unwrap_or_else(|| a.id.clone()),
        "runtime": a.runtime,
    });
    match String::from_utf8(bytes) {
        Ok(text) => body["content"] = json!(text),
        Err(e) => {
            use base64::Engine as _;
            body["contentBase64"] = json!(base64::engine::general_purpose::STANDARD.encode(e.into_bytes()));
        }
    }
    let filename = a.filename.clone().or_else(|| a.file.file_name().and_then(|n| n.to_str()).map(str::to_string));
    for (k, v) in [("model", a.model), ("version", a.version), ("description", a.description), ("filename", filename)] {
        if let Some(v) = v {
            body[k] = json!(v);
        }
    }
    if !a.capabilities.is_empty() {
        body["capabilities"] = json!(a.capabilities);
    }
    if let Some(path) = &a.input_schema {
        let text = std::fs::read_to_string(path)
            .map_err(|e| fail(EXIT_USAGE, format!("cannot read {}: {e}", path.display())))?;
        let schema: Value = serde_json::from_str(&text)
            .map_err(|e| fail(EXIT_USAGE, format!("{} is not JSON: {e}", path.display())))?;
        body["input"] = schema;
    }
    let e = a.conn.request(reqwest::Method::POST, "/api/commands", &[], Some(body))?;
    output::print(&e, a.json, output::registered);
    Ok(())
}

/// `--auth` as the command takes it: `bearer:SECRET`, `header:NAME:SECRET`, `query:NAME:SECRET`, `basic:SECRET`.
fn http_auth(spec: &str) -> Result<Value, ClientError> {
    let bad = || {
        fail(
            EXIT_USAGE,
            format!("--auth {spec:?}: use bearer:SECRET, header:NAME:SECRET, query:NAME:SECRET or basic:SECRET"),
        )
    };
    let parts: Vec<&str> = spec.split(':').collect();
    match parts.as_slice() {
        [kind @ ("bearer" | "basic"), secret] if !secret.is_empty() => Ok(json!({"type": kind, "secret": secret})),
        [kind @ ("header" | "query"), name, secret] if !name.is_empty() && !secret.is_empty() => {
            Ok(json!({"type": kind, "name": name, "secret": secret}))
        }
        _ => Err(bad()),
    }
}

pub fn register_http(a: RegisterHttpArgs) -> Result<(), ClientError> {
    let mut body = json!({
        "type": "TOOL_CATALOG_REGISTER_HTTP",
        "id": a.id,
        "name": a.name.clone().unwrap_or_else(|| a.id.clone()),
        "baseUrl": a.base_url,
    });
    if let Some(path) = &a.openapi {
        let text = std::fs::read_to_string(path)
            .map_err(|e| fail(EXIT_USAGE, format!("cannot read {}: {e}", path.display())))?;
        body["openapi"] = json!(text);
    }
    if let Some(url) = a.openapi_url {
        body["openapiUrl"] = json!(url);
    }
    if let Some(spec) = &a.auth {
        body["auth"] = http_auth(spec)?;
    }
    if let Some(d) = a.description {
        body["description"] = json!(d);
    }
    if !a.include.is_empty() {
        body["include"] = json!(a.include);
    }
    if !a.capabilities.is_empty() {
        body["capabilities"] = json!(a.capabilities);
    }
    if let Some(ms) = a.timeout_ms {
        body["timeoutMs"] = json!(ms);
    }
    let e = a.conn.request(reqwest::Method::POST, "/api/commands", &[], Some(body))?;
    output::print(&e, a.json, output::registered);
    Ok(())
}

pub fn register_mcp(a: RegisterMcpArgs) -> Result<(), ClientError> {
    let mut server = serde_json::Map::new();
    if let Some(command) = a.command {
        server.insert("command".into(), json!(command));
        if !a.args.is_empty() {
            server.insert("args".into(), json!(a.args));
        }
    }
    if !a.env.is_empty() {
        let mut env = serde_json::Map::new();
        for pair in &a.env {
            let (var, secret) = pair.split_once('=').ok_or_else(|| {
                fail(EXIT_USAGE, format!("--env {pair:?}: use VAR=SECRET, naming the secret whose value VAR gets"))
            })?;
            env.insert(var.to_string(), json!(secret));
        }
        server.insert("env".into(), Value::Object(env));
    }
    if let Some(url) = a.server_url {
        server.insert("url".into(), json!(url));
    }
    if let Some(spec) = &a.auth {
        server.insert("auth".into(), http_auth(spec)?);
    }
    let mut body = json!({
        "type": "TOOL_CATALOG_REGISTER_MCP",
        "id": a.id,
        "name": a.name.clone().unwrap_or_else(|| a.id.clone()),
        "server": server,
    });
    if let Some(m) = a.model {
        body["model"] = json!(m);
    }
    if let Some(d) = a.description {
        body["description"] = json!(d);
    }
    if !a.include.is_empty() {
        body["include"] = json!(a.include);
    }
    if !a.capabilities.is_empty() {
        body["capabilities"] = json!(a.capabilities);
    }
    if let Some(ms) = a.timeout_ms {
        body["timeoutMs"] = json!(ms);
    }
    let e = a.conn.request(reqwest::Method::POST, "/api/commands", &[], Some(body))?;
    output::print(&e, a.json, output::registered);
    Ok(())
}

pub fn import_image(a: ImportImageArgs) -> Result<(), ClientError> {
    use std::io::{IsTerminal, Write as _};
    let mut body = json!({"type": "TOOL_CATALOG_IMPORT_IMAGE", "image": a.image, "id": a.id});
    if let Some(n) = a.name {
        body["name"] = json!(n);
    }
    if !a.secrets.is_empty() {
        body["secrets"] = json!(a.secrets);
    }
    if let Some(d) = a.description {
        body["description"] = json!(d);
    }
    if !a.capabilities.is_empty() {
        body["capabilities"] = json!(a.capabilities);
    }
    if let Some(ms) = a.timeout_ms {
        body["timeoutMs"] = json!(ms);
    }
    // The master's steps as it reports them: on a terminal one status line, rewritten in place
    // and cleared at the end; otherwise a line each.
    let terminal = std::io::stderr().is_terminal();
    let image = a.image.clone();
    let mut shown = false;
    let answer = a.conn.register_following(body, |step| {
        if a.json {
            return;
        }
        if terminal {
            let _ = write!(std::io::stderr(), "\r\x1b[2K{image}: {step} ...");
            shown = true;
        } else {
            errln!("{image}: {step}");
        }
    });
    if shown {
        let _ = write!(std::io::stderr(), "\r\x1b[2K");
    }
    let e = answer?;
    output::print(&e, a.json, output::registered);
    Ok(())
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// The tool id.
    pub id: String,
    /// The model the call belongs to (its local catalog first). Defaults to the caller's home model.
    #[arg(long)]
    pub model: Option<String>,
    /// JSON sent to the script on stdin.
    #[arg(long)]
    pub input: Option<String>,
    /// An environment variable for the script, NAME=VALUE; repeat for several.
    #[arg(long = "env")]
    pub env: Vec<String>,
    /// How long the script may run, in ms (the master caps it).
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Print the whole result as JSON instead of the script's output.
    #[arg(long)]
    pub json: bool,
    /// Queue the job and print its id at once, without waiting for it (`agentos job wait`,
    /// `output` and `cancel` take the id).
    #[arg(long = "async")]
    pub detach: bool,
    /// Arguments for the script, after `--`.
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// Exit code of `agentos run` when the job timed out (as `timeout(1)`).
pub const EXIT_TIMED_OUT: u8 = 124;

/// `agentos run`: the script's stdout and stderr as they were, and its exit code.
pub fn run_tool(a: RunArgs) -> ExitCode {
    match run_tool_inner(a) {
        Ok(code) => ExitCode::from(code),
        Err(e) => exit(Err(e)),
    }
}

fn run_tool_inner(a: RunArgs) -> Result<u8, ClientError> {
    let mut body = json!({"argv": a.args});
    if let Some(input) = &a.input {
        let v: Value =
            serde_json::from_str(input).map_err(|e| fail(EXIT_USAGE, format!("--input is not JSON: {e}")))?;
        body["input"] = v;
    }
    let mut env = serde_json::Map::new();
    for pair in &a.env {
        let (k, v) = pair.split_once('=').ok_or_else(|| fail(EXIT_USAGE, format!("--env {pair:?}: use NAME=VALUE")))?;
        env.insert(k.to_string(), Value::from(v));
    }
    body["env"] = Value::Object(env);
    if let Some(t) = a.timeout_ms {
        body["timeoutMs"] = json!(t);
    }
    let path = format!("/api/tools/{}/invoke", path_id(&a.id)?);
    let query = model_query(a.model.as_deref());
    if a.detach {
        let queued =
            a.conn.request_with(reqwest::Method::POST, &path, &query, Some(body), &[("prefer", "respond-async")])?;
        match (a.json, queued["jobId"].as_str()) {
            (false, Some(id)) => outln!("{id}"),
            _ => {
                outln!("{}", agentos_core::name::json_inert(&serde_json::to_string_pretty(&queued).unwrap_or_default()))
            }
        }
        return Ok(0);
    }
    let result = a.conn.request(reqwest::Method::POST, &path, &query, Some(body))?;
    print_result(&a.conn, &result, a.json)
}

/// A job's result as `agentos run` prints it: its whole stdout and stderr as they were (read
/// by the job's id when the result keeps only their start), or the result as JSON; answers the
/// exit code to end with (the script's own, 124 timed out, 1 when it could not run).
fn print_result(conn: &Conn, result: &Value, json: bool) -> Result<u8, ClientError> {
    if json {
        outln!("{}", agentos_core::name::json_inert(&serde_json::to_string_pretty(result).unwrap_or_default()));
    } else {
        use std::io::Write;
        let job = result["jobId"].as_str().unwrap_or_default();
        let whole = |stream: &str| -> Result<Vec<u8>, ClientError> {
            match result.get(format!("{stream}Blob")) {
                Some(b) if !b.is_null() => conn.bytes(&format!("/api/jobs/{}/{stream}", path_part("job id", job)?)),
                _ => Ok(result[stream].as_str().unwrap_or("").as_bytes().to_vec()),
            }
        };
        let (stdout, stderr) = (whole("stdout")?, whole("stderr")?);
        let wrote = output::write_bytes(&stdout);
        let _ = std::io::stderr().write_all(&stderr);
        if let Err(e) = wrote {
            output::lost(&e);
        }
    }
    if let Some(err) = result["error"].as_str() {
        if !json {
            errln!("error: {err}");
        }
        return Ok(if result["timedOut"].as_bool() == Some(true) { EXIT_TIMED_OUT } else { EXIT_FAILURE });
    }
    Ok(match (result["exitCode"].as_i64(), result["signal"].as_i64()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        _ => EXIT_FAILURE,
    })
}

/// `agentos job ...`: a job invoked directly, by the id `agentos run --async` printed.
#[derive(clap::Subcommand)]
pub enum JobCmd {
    /// Show a job: queued, running, or finished with how it ended.
    Show {
        #[command(flatten)]
        conn: Conn,
        /// The job id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Wait until a job has finished, then print its output and exit as `agentos run` does.
    Wait {
        #[command(flatten)]
        conn: Conn,
        /// The job id.
        id: String,
        /// Print the result as JSON instead of the script's output.
        #[arg(long)]
        json: bool,
    },
    /// Print the whole stdout of a finished job, as its bytes (or its stderr).
    Output {
        #[command(flatten)]
        conn: Conn,
        /// The job id.
        id: String,
        /// Its stderr instead.
        #[arg(long)]
        stderr: bool,
    },
    /// Cancel a job that has not finished: a queued one never runs, a running one is stopped.
    /// Your own jobs; the operator, any.
    Cancel {
        #[command(flatten)]
        conn: Conn,
        /// The job id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The most tokens the master answers in one page.
const TOKENS_PAGE_MAX: u32 = 10_000;

/// How often `agentos job wait` asks, at most.
const JOB_WAIT_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

pub fn job(cmd: JobCmd) -> ExitCode {
    let code = match cmd {
        JobCmd::Show { conn, id, json } => (|| {
            let v =
                conn.request(reqwest::Method::GET, &format!("/api/jobs/{}", path_part("job id", &id)?), &[], None)?;
            output::print(&v, json, output::job);
            Ok(0)
        })(),
        JobCmd::Wait { conn, id, json } => (|| {
            let path = format!("/api/jobs/{}", path_part("job id", &id)?);
            let mut every = std::time::Duration::from_millis(50);
            loop {
                let v = conn.request(reqwest::Method::GET, &path, &[], None)?;
                if let Some(result) = v["results"].as_array().and_then(|r| r.last()) {
                    return print_result(&conn, result, json);
                }
                std::thread::sleep(every);
                every = (every * 2).min(JOB_WAIT_EVERY);
            }
        })(),
        JobCmd::Output { conn, id, stderr } => (|| {
            let stream = if stderr { "stderr" } else { "stdout" };
            let bytes = conn.bytes(&format!("/api/jobs/{}/{stream}", path_part("job id", &id)?))?;
            if let Err(e) = output::write_bytes(&bytes) {
                output::lost(&e);
            }
            Ok(0)
        })(),
        JobCmd::Cancel { conn, id, json } => (|| {
            let v = conn.request(
                reqwest::Method::POST,
                &format!("/api/jobs/{}/cancel", path_part("job id", &id)?),
                &[],
                None,
            )?;
            output::print(&v, json, output::job);
            Ok(0)
        })(),
    };
    match code {
        Ok(code) => ExitCode::from(code),
        Err(e) => exit(Err(e)),
    }
}

pub fn create_executor_token(conn: &Conn, name: &str) -> Result<(), ClientError> {
    let v = conn.request(reqwest::Method::POST, "/api/executor-tokens", &[], Some(json!({"name": name})))?;
    outln!("executor credential for {name:?} (good for the executor protocol only; shown once):");
    outln!("{}", v["token"].as_str().unwrap_or(""));
    Ok(())
}

pub fn executors(conn: &Conn, json: bool) -> Result<(), ClientError> {
    let v = conn.request(reqwest::Method::GET, "/api/executors", &[], None)?;
    output::print(&v, json, output::executors);
    Ok(())
}

/// `agentos net ...`: nets, tokens and transitions of one model.
#[derive(clap::Subcommand)]
pub enum NetCmd {
    /// Validate a net document (JSON or YAML) and make it the model's net.
    Apply {
        #[command(flatten)]
        conn: Conn,
        /// The net document, JSON or YAML.
        file: PathBuf,
        /// The model (default: the document's `model`, else your home model).
        #[arg(long)]
        model: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the model's net: places with token counts, transitions with their state.
    Show {
        #[command(flatten)]
        conn: Conn,
        /// The model whose net this is (default: your home model).
        #[arg(long)]
        model: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the tokens in a place.
    Tokens {
        #[command(flatten)]
        conn: Conn,
        /// The place, e.g. p-in.
        place: String,
        /// The model whose net this is (default: your home model).
        #[arg(long)]
        model: Option<String>,
        /// At most this many tokens, oldest first; a line on stderr says when the place holds more.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=i64::from(TOKENS_PAGE_MAX)))]
        limit: u32,
        /// Skip this many tokens first (read on from where a page ended).
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put a token (JSON data) into a place.
    Put {
        #[command(flatten)]
        conn: Conn,
        /// The place, e.g. p-in.
        place: String,
        /// The token's data, as JSON.
        #[arg(value_name = "JSON")]
        token_data: String,
        /// The model whose net this is (default: your home model).
        #[arg(long)]
        model: Option<String>,
        /// A name for the token.
        #[arg(long)]
        name: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start a transition: it fires whenever enabled.
    Start {
        #[command(flatten)]
        conn: Conn,
        /// The transition's id.
        transition: String,
        /// The model whose net this is (default: your home model).
        #[arg(long)]
        model: Option<String>,
    },
    /// Stop a transition.
    Stop {
        #[command(flatten)]
        conn: Conn,
        /// The transition's id.
        transition: String,
        /// The model whose net this is (default: your home model).
        #[arg(long)]
        model: Option<String>,
    },
    /// Fire a transition once.
    Fire {
        #[command(flatten)]
        conn: Conn,
        /// The transition's id.
        transition: String,
        /// The model whose net this is (default: your home model).
        #[arg(long)]
        model: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the tokens transitions parked (their fire failed or matched no rule), with the reason.
    Parked {
        #[command(flatten)]
        conn: Conn,
        /// Only the tokens this transition parked.
        transition: Option<String>,
        /// The model (default: your home model).
        #[arg(long)]
        model: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Release a parked token so transitions bind it again (its attempts are forgotten).
    Retry {
        #[command(flatten)]
        conn: Conn,
        /// The token's id (from `agentos net parked`).
        #[arg(value_name = "TOKEN")]
        token_id: String,
        /// The model (default: your home model).
        #[arg(long)]
        model: Option<String>,
    },
    /// Remove a parked token from its place.
    Discard {
        #[command(flatten)]
        conn: Conn,
        /// The token's id (from `agentos net parked`).
        #[arg(value_name = "TOKEN")]
        token_id: String,
        /// The model (default: your home model).
        #[arg(long)]
        model: Option<String>,
    },
    /// Print every change to the model's net as it happens (one JSON line each).
    Watch {
        #[command(flatten)]
        conn: Conn,
        /// The model whose net this is (default: your home model).
        #[arg(long)]
        model: Option<String>,
    },
}

/// The model named, else the caller's home model (`GET /api/me`), as every command resolves an
/// absent one.
fn model_or_home(conn: &Conn, model: Option<String>) -> Result<String, ClientError> {
    if let Some(m) = model {
        return Ok(m);
    }
    let me = conn.request(reqwest::Method::GET, "/api/me", &[], None)?;
    me["model"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| fail(EXIT_FAILURE, "the master did not say which model is yours; name one with --model"))
}

fn model_path(model: &str) -> Result<&str, ClientError> {
    path_part("model name", model)
}

/// A name that goes into a request's path as it is: one the master could hold (a-z, 0-9 and
/// '-'), so that nothing typed (`../`, `?`, `%2F`) can make the path another route's.
fn path_part<'a>(what: &str, name: &'a str) -> Result<&'a str, ClientError> {
    if agentos_core::name::is_valid_id(name) {
        Ok(name)
    } else {
        Err(fail(
            EXIT_USAGE,
            format!("invalid {what} {}: use a-z, 0-9 and '-', at most 64 characters", agentos_core::name::shown(name)),
        ))
    }
}

/// `net fire`'s answer. The master answers 200 with the outcome (the request was sound); here
/// a fire that did not happen is an error, so a script can tell without reading the output:
/// 5 the fire failed (inputs kept) or a limit stopped its transition, 6 nothing was enabled
/// (try again later, or release what is parked: the reason says). With `--json` the answer is
/// printed whatever it says, and the exit code and error line are the same.
fn fire_outcome(v: &Value, json: bool) -> Result<(), ClientError> {
    let transition = v["transition"].as_str().unwrap_or("");
    let outcome = v["outcome"].as_str().unwrap_or("");
    // The reason may quote a tool's or an expression's text (an `error("...")`): one line with
    // nothing a terminal would act on, as the error line must be.
    let reason = crate::call::shown(v["reason"].as_str().unwrap_or("no reason given"));
    let code = match outcome {
        "fired" | "started" => None,
        "not-enabled" => Some(crate::call::EXIT_TIMED_OUT_CALL),
        // `failed`, `stopped`, and an outcome this client does not know: not a success.
        _ => Some(crate::call::EXIT_TOOL_FAILED),
    };
    let Some(code) = code else {
        output::print(v, json, |o| match o["fire"].as_str() {
            Some(fire) => format!("{transition} {outcome} ({fire})"),
            None => format!("{transition} {outcome}"),
        });
        return Ok(());
    };
    if json {
        output::print(v, json, |_| String::new());
    }
    let what = match outcome {
        "not-enabled" => "is not enabled".to_string(),
        "failed" => "failed".to_string(),
        "stopped" => "stopped at a limit".to_string(),
        other => format!("answered {other:?}"),
    };
    Err(fail(code, format!("transition {transition} {what}: {reason}")))
}

pub fn net(cmd: NetCmd) -> Result<(), ClientError> {
    match cmd {
        NetCmd::Apply { conn, file, model, json } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| fail(EXIT_USAGE, format!("cannot read {}: {e}", file.display())))?;
            let doc: Value = match serde_json::from_str(&text) {
                Ok(v) => v,
                Err(_) => serde_yaml_ng::from_str(&text)
                    .map_err(|e| fail(EXIT_USAGE, format!("{} is neither JSON nor YAML: {e}", file.display())))?,
            };
            let model =
                model_or_home(&conn, model.or_else(|| doc.get("model").and_then(Value::as_str).map(str::to_string)))?;
            let view = conn.request(
                reqwest::Method::PUT,
                &format!("/api/models/{}/net", model_path(&model)?),
                &[],
                Some(doc),
            )?;
            output::print(&view, json, output::net);
        }
        NetCmd::Show { conn, model, json } => {
            let model = model_or_home(&conn, model)?;
            let view =
                conn.request(reqwest::Method::GET, &format!("/api/models/{}/net", model_path(&model)?), &[], None)?;
            output::print(&view, json, output::net);
        }
        NetCmd::Tokens { conn, place, model, limit, offset, json } => {
            let model = model_or_home(&conn, model)?;
            // One more than asked for, where the master allows it, tells whether more follow.
            let ask = (limit + 1).min(TOKENS_PAGE_MAX);
            let mut v = conn.request(
                reqwest::Method::GET,
                &format!("/api/models/{}/places/{}/tokens", model_path(&model)?, path_part("place", &place)?),
                &[("limit", ask.to_string()), ("offset", offset.to_string())],
                None,
            )?;
            let got = v.as_array().map_or(0, Vec::len);
            if let Some(tokens) = v.as_array_mut() {
                tokens.truncate(limit as usize);
            }
            output::print(&v, json, output::tokens);
            let next = offset + u64::from(limit);
            if got > limit as usize {
                errln!("{place} holds more tokens than these {limit}: --offset {next} reads on");
            } else if got == ask as usize && ask == limit {
                // A whole page of the largest size: whether more follow, the next one says.
                errln!("{place} may hold more tokens than these {limit}: --offset {next} reads on");
            }
        }
        NetCmd::Put { conn, place, token_data, model, name, json } => {
            let model = model_or_home(&conn, model)?;
            let data: Value = serde_json::from_str(&token_data)
                .map_err(|e| fail(EXIT_USAGE, format!("the data is not JSON: {e}")))?;
            let v = conn.request(
                reqwest::Method::POST,
                &format!("/api/models/{}/places/{}/tokens", model_path(&model)?, path_part("place", &place)?),
                &[],
                Some(json!({"data": data, "name": name})),
            )?;
            output::print(&v, json, |t| format!("put {} into {place}", t["id"].as_str().unwrap_or("")));
        }
        NetCmd::Start { conn, transition, model } => {
            let model = model_or_home(&conn, model)?;
            conn.request(
                reqwest::Method::POST,
                &format!(
                    "/api/models/{}/transitions/{}/start",
                    model_path(&model)?,
                    path_part("transition", &transition)?
                ),
                &[],
                Some(json!({})),
            )?;
            outln!("started {transition}");
        }
        NetCmd::Stop { conn, transition, model } => {
            let model = model_or_home(&conn, model)?;
            conn.request(
                reqwest::Method::POST,
                &format!(
                    "/api/models/{}/transitions/{}/stop",
                    model_path(&model)?,
                    path_part("transition", &transition)?
                ),
                &[],
                Some(json!({})),
            )?;
            outln!("stopped {transition}");
        }
        NetCmd::Fire { conn, transition, model, json } => {
            let model = model_or_home(&conn, model)?;
            let v = conn.request(
                reqwest::Method::POST,
                &format!(
                    "/api/models/{}/transitions/{}/fire",
                    model_path(&model)?,
                    path_part("transition", &transition)?
                ),
                &[],
                Some(json!({})),
            )?;
            fire_outcome(&v, json)?;
        }
        NetCmd::Parked { conn, transition, model, json } => {
            let model = model_or_home(&conn, model)?;
            let query: Vec<(&str, String)> = transition.map(|t| ("transition", t)).into_iter().collect();
            let v = conn.request(
                reqwest::Method::GET,
                &format!("/api/models/{}/parked", model_path(&model)?),
                &query,
                None,
            )?;
            output::print(&v, json, |list| {
                let lines: Vec<String> = list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        format!(
                            "{}  {} in {}  attempts {}  {}",
                            p["token"]["id"].as_str().unwrap_or(""),
                            p["transition"].as_str().unwrap_or(""),
                            p["place"].as_str().unwrap_or(""),
                            p["attempts"],
                            // Why it was parked, which may quote a tool's text: one line, inert.
                            crate::call::shown(p["reason"].as_str().unwrap_or(""))
                        )
                    })
                    .collect();
                if lines.is_empty() { "no parked tokens".to_string() } else { lines.join("\n") }
            });
        }
        NetCmd::Retry { conn, token_id: token, model } => {
            let model = model_or_home(&conn, model)?;
            conn.request(
                reqwest::Method::POST,
                &format!("/api/models/{}/parked/{}/retry", model_path(&model)?, path_part("token id", &token)?),
                &[],
                Some(json!({})),
            )?;
            outln!("released {token}");
        }
        NetCmd::Discard { conn, token_id: token, model } => {
            let model = model_or_home(&conn, model)?;
            conn.request(
                reqwest::Method::POST,
                &format!("/api/models/{}/parked/{}/discard", model_path(&model)?, path_part("token id", &token)?),
                &[],
                Some(json!({})),
            )?;
            outln!("discarded {token}");
        }
        NetCmd::Watch { conn, model } => {
            let model = model_or_home(&conn, model)?;
            let token = conn.token()?;
            let url = format!("{}/api/models/{}/watch", conn.url.trim_end_matches('/'), model_path(&model)?);
            let resp = reqwest::blocking::Client::builder()
                .timeout(None)
                .build()
                .map_err(|e| fail(EXIT_FAILURE, e.to_string()))?
                .get(&url)
                .bearer_auth(token)
                .send()
                .map_err(|e| fail(EXIT_UNREACHABLE, format!("cannot reach the master at {}: {e}", conn.url)))?;
            if !resp.status().is_success() {
                return Err(fail(EXIT_FAILURE, format!("watch answered HTTP {}", resp.status().as_u16())));
            }
            use std::io::BufRead;
            for line in std::io::BufReader::new(resp).lines() {
                let line = line.map_err(|e| fail(EXIT_FAILURE, e.to_string()))?;
                if let Some(data) = line.strip_prefix("data:") {
                    // JSON, as it came; what does not show as itself is escaped.
                    outln!("{}", agentos_core::name::json_inert(data.trim()));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        crate::Cli::command().debug_assert();
    }
}

/// `agentos agent ...` (operator only).
#[derive(clap::Subcommand)]
pub enum AgentCmd {
    /// Create an agent and print its token once.
    Create {
        #[command(flatten)]
        conn: Conn,
        /// The agent's name.
        name: String,
        /// Capability flags: positional `rwxhludcts` plus `m`, e.g. `rwx` or `---------s`
        /// (a string may start with `-`).
        #[arg(long, allow_hyphen_values = true)]
        flags: String,
        /// Home model (default: the agent's name).
        #[arg(long)]
        model: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List principals (never their tokens).
    List {
        #[command(flatten)]
        conn: Conn,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke an agent's (or executor's) token.
    Revoke {
        #[command(flatten)]
        conn: Conn,
        /// The agent's name.
        name: String,
    },
    /// Let an agent act in another model besides its home model (its net, tokens, watch stream, jobs).
    Grant {
        #[command(flatten)]
        conn: Conn,
        /// The agent's name.
        name: String,
        /// The model to grant.
        #[arg(long)]
        model: String,
    },
    /// End a model grant.
    Ungrant {
        #[command(flatten)]
        conn: Conn,
        /// The agent's name.
        name: String,
        /// The model to take back.
        #[arg(long)]
        model: String,
    },
}

pub fn agent(cmd: AgentCmd) -> Result<(), ClientError> {
    match cmd {
        AgentCmd::Create { conn, name, flags, model, json } => {
            let v = conn.request(
                reqwest::Method::POST,
                "/api/agents",
                &[],
                Some(json!({"name": name, "flags": flags, "model": model})),
            )?;
            if json {
                outln!("{}", agentos_core::name::json_inert(&serde_json::to_string(&v).unwrap_or_default()));
            } else {
                outln!(
                    "agent {} (flags {}, home model {}); its token, shown once:",
                    v["name"].as_str().unwrap_or(""),
                    v["flags"].as_str().unwrap_or(""),
                    v["model"].as_str().unwrap_or("")
                );
                outln!("{}", v["token"].as_str().unwrap_or(""));
            }
        }
        AgentCmd::List { conn, json } => {
            let v = conn.request(reqwest::Method::GET, "/api/agents", &[], None)?;
            output::print(&v, json, |v| {
                output::each_line(v, |p| {
                    let granted: Vec<&str> = p["granted"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    let granted =
                        if granted.is_empty() { String::new() } else { format!(" (granted {})", granted.join(", ")) };
                    format!(
                        "{:<24} {:<9} {} {}{granted}",
                        p["name"].as_str().unwrap_or(""),
                        p["kind"].as_str().unwrap_or(""),
                        p["flags"].as_str().unwrap_or(""),
                        p["model"].as_str().unwrap_or("")
                    )
                })
            });
        }
        AgentCmd::Revoke { conn, name } => {
            conn.request(reqwest::Method::DELETE, &format!("/api/agents/{}", model_path(&name)?), &[], None)?;
            outln!("revoked {name}");
        }
        AgentCmd::Grant { conn, name, model } => {
            let path = format!("/api/agents/{}/grants", model_path(&name)?);
            conn.request(reqwest::Method::POST, &path, &[], Some(json!({"model": model})))?;
            outln!("{name} may now act in model {model}");
        }
        AgentCmd::Ungrant { conn, name, model } => {
            let path = format!("/api/agents/{}/grants/{}", model_path(&name)?, model_path(&model)?);
            conn.request(reqwest::Method::DELETE, &path, &[], None)?;
            outln!("{name} may no longer act in model {model}");
        }
    }
    Ok(())
}

/// `agentos secret ...` (operator only).
#[derive(clap::Subcommand)]
pub enum SecretCmd {
    /// Set a secret; the value is read from stdin (a trailing newline is dropped).
    Set {
        #[command(flatten)]
        conn: Conn,
        /// The secret's name.
        name: String,
    },
    /// List secret names (never values).
    List {
        #[command(flatten)]
        conn: Conn,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Grant a secret to one use: a pinned tool (a changed pin loses the grant) or an origin.
    #[command(group = clap::ArgGroup::new("use").required(true).args(["tool", "origin"]))]
    Grant {
        #[command(flatten)]
        conn: Conn,
        /// The secret's name.
        name: String,
        /// A script tool, as it is pinned now (resolved in --model, else the global catalog).
        #[arg(long)]
        tool: Option<String>,
        /// Requests to this origin (scheme://host[:port]) may carry the secret in a header.
        #[arg(long)]
        origin: Option<String>,
        /// Only for fires in this model.
        #[arg(long)]
        model: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List secret grants.
    Grants {
        #[command(flatten)]
        conn: Conn,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// End a secret grant, by the id `secret grants` shows.
    Ungrant {
        #[command(flatten)]
        conn: Conn,
        /// The grant's id (from `agentos secret grants`).
        id: String,
    },
}

/// One line for a secret grant.
fn grant_line(g: &Value) -> String {
    let to = &g["to"];
    let target = match to["kind"].as_str() {
        Some("tool") => format!(
            "tool {} in {} (sha256 {})",
            to["id"].as_str().unwrap_or(""),
            to["model"].as_str().unwrap_or(""),
            &to["sha256"].as_str().unwrap_or("")[..12.min(to["sha256"].as_str().unwrap_or("").len())]
        ),
        _ => format!("origin {}", to["origin"].as_str().unwrap_or("")),
    };
    let only = g["model"].as_str().map(|m| format!(" only in model {m}")).unwrap_or_default();
    format!("{:<16} {:<24} {target}{only}", g["id"].as_str().unwrap_or(""), g["secret"].as_str().unwrap_or(""))
}

pub fn secret(cmd: SecretCmd) -> Result<(), ClientError> {
    match cmd {
        SecretCmd::Set { conn, name } => {
            let mut value = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut value)
                .map_err(|e| fail(EXIT_USAGE, format!("reading stdin: {e}")))?;
            let value = value.strip_suffix('\n').unwrap_or(&value).to_string();
            if !agentos_core::net::valid_credential(&name) {
                return Err(fail(
                    EXIT_USAGE,
                    format!("secret name {}: use A-Z, a-z, 0-9, '_' and '-'", agentos_core::name::shown(&name)),
                ));
            }
            conn.request(reqwest::Method::PUT, &format!("/api/secrets/{name}"), &[], Some(json!({"value": value})))?;
            outln!("secret {name} set");
        }
        SecretCmd::List { conn, json } => {
            let v = conn.request(reqwest::Method::GET, "/api/secrets", &[], None)?;
            output::print(&v, json, |v| {
                output::each_line(v, |s| {
                    format!("{:<32} {}", s["name"].as_str().unwrap_or(""), s["updatedAt"].as_str().unwrap_or(""))
                })
            });
        }
        SecretCmd::Grant { conn, name, tool, origin, model, json } => {
            if !agentos_core::net::valid_credential(&name) {
                return Err(fail(
                    EXIT_USAGE,
                    format!("secret name {}: use A-Z, a-z, 0-9, '_' and '-'", agentos_core::name::shown(&name)),
                ));
            }
            let v = conn.request(
                reqwest::Method::POST,
                &format!("/api/secrets/{name}/grants"),
                &[],
                Some(json!({"tool": tool, "origin": origin, "model": model})),
            )?;
            output::print(&v, json, grant_line);
        }
        SecretCmd::Grants { conn, json } => {
            let v = conn.request(reqwest::Method::GET, "/api/secret-grants", &[], None)?;
            output::print(&v, json, |v| output::each_line(v, grant_line));
        }
        SecretCmd::Ungrant { conn, id } => {
            conn.request(
                reqwest::Method::DELETE,
                &format!("/api/secret-grants/{}", path_part("grant id", &id)?),
                &[],
                None,
            )?;
            outln!("secret grant {id} revoked");
        }
    }
    Ok(())
}

/// `agentos audit`
pub fn audit(
    conn: &Conn,
    principal: Option<String>,
    after: Option<u64>,
    limit: Option<usize>,
    json: bool,
) -> Result<(), ClientError> {
    let mut q = Vec::new();
    opt(&mut q, "principal", principal);
    opt(&mut q, "after", after.map(|a| a.to_string()));
    opt(&mut q, "limit", limit.map(|l| l.to_string()));
    let v = conn.request(reqwest::Method::GET, "/api/events", &q, None)?;
    // A full page (the master's is 100 unless `--limit` says) may have more after it: said, with
    // the command that reads on, on stderr so the page itself stays as it is.
    let events = v.as_array().map_or(0, Vec::len);
    let last = v.as_array().and_then(|a| a.last()).and_then(|e| e["seq"].as_u64());
    output::print(&v, json, |v| {
        output::each_line(v, |e| {
            format!(
                "#{:<6} {}  {:<12} {:<18} {}",
                e["seq"],
                e["time"].as_str().unwrap_or(""),
                e["principal"].as_str().unwrap_or(""),
                e["type"].as_str().unwrap_or(""),
                e["model"].as_str().unwrap_or("")
            )
        })
    });
    if let Some(last) = last.filter(|_| events == limit.unwrap_or(100)) {
        errln!("{events} events shown, the oldest first; more may follow: agentos audit --after {last}");
    }
    Ok(())
}
