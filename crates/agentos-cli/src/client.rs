//! The API client behind the `catalog` and `models` commands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};

use crate::output;

/// Where the master is and who we are.
#[derive(Args, Clone)]
pub struct Conn {
    /// The master's URL.
    #[arg(
        long,
        env = "AGENTOS_URL",
        default_value = "http://127.0.0.1:7420",
        global = true
    )]
    pub url: String,
    /// Bearer token. Without it the operator token of --data is used.
    #[arg(long, env = "AGENTOS_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Data folder whose operator.token is used when no token is given.
    #[arg(
        long,
        env = "AGENTOS_DATA",
        default_value = "./.agentos",
        global = true
    )]
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
    #[arg(long)]
    pub version: Option<String>,
    #[arg(long)]
    pub description: Option<String>,
    /// A capability tag; repeat for several.
    #[arg(long = "capability")]
    pub capabilities: Vec<String>,
    /// File name the executor gives the script (defaults to the file's name).
    #[arg(long)]
    pub filename: Option<String>,
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

/// A failure, with the exit code it maps to.
#[derive(Debug)]
pub struct ClientError {
    pub code: u8,
    pub message: String,
}

pub const EXIT_FAILURE: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
pub const EXIT_DENIED: u8 = 3;
pub const EXIT_NOT_FOUND: u8 = 4;
pub const EXIT_UNREACHABLE: u8 = 5;

fn fail(code: u8, message: impl Into<String>) -> ClientError {
    ClientError {
        code,
        message: message.into(),
    }
}

pub fn exit(r: Result<(), ClientError>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

impl Conn {
    fn token(&self) -> Result<String, ClientError> {
        if let Some(t) = &self.token {
            return Ok(t.trim().to_string());
        }
        let file = self.data.join("operator.token");
        std::fs::read_to_string(&file).map(|t| t.trim().to_string()).map_err(|_| {
            fail(EXIT_USAGE, format!("no token: set AGENTOS_TOKEN or --token (the operator's token is in <data>/operator.token; {} was not readable)", file.display()))
        })
    }

    fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> Result<Value, ClientError> {
        let token = self.token()?;
        let client = reqwest::blocking::Client::builder()
            .timeout(std::time::Duration::from_secs(120))
            .build()
            .map_err(|e| fail(EXIT_FAILURE, format!("http client: {e}")))?;
        let url = format!("{}{}", self.url.trim_end_matches('/'), path);
        let mut req = client.request(method, &url).bearer_auth(token).query(query);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().map_err(|e| {
            fail(
                EXIT_UNREACHABLE,
                format!(
                    "cannot reach the master at {}: {e} (is `agentos up` running? set AGENTOS_URL)",
                    self.url
                ),
            )
        })?;
        let status = resp.status();
        let text = resp
            .text()
            .map_err(|e| fail(EXIT_FAILURE, format!("reading the answer: {e}")))?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            return Ok(value);
        }
        let message = value
            .pointer("/error/message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| value.to_string());
        let code = match status.as_u16() {
            400 | 413 => EXIT_USAGE,
            401 | 403 => EXIT_DENIED,
            404 => EXIT_NOT_FOUND,
            _ => EXIT_FAILURE,
        };
        Err(fail(code, format!("{message} (HTTP {})", status.as_u16())))
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
    model
        .map(|m| vec![("model", m.to_string())])
        .unwrap_or_default()
}

fn path_id(id: &str) -> Result<&str, ClientError> {
    if agentos_core::name::is_valid_id(id) {
        Ok(id)
    } else {
        Err(fail(
            EXIT_USAGE,
            format!("invalid tool id {id:?}: use a-z, 0-9 and '-', at most 64 characters"),
        ))
    }
}

pub fn get(conn: &Conn, id: &str, model: Option<&str>, json: bool) -> Result<(), ClientError> {
    let e = conn.request(
        reqwest::Method::GET,
        &format!("/api/tool-catalog/{}", path_id(id)?),
        &model_query(model),
        None,
    )?;
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
        format!(
            "removed {} from model {}",
            v["id"].as_str().unwrap_or(""),
            v["model"].as_str().unwrap_or("")
        )
    });
    Ok(())
}

pub fn models(conn: &Conn, json: bool) -> Result<(), ClientError> {
    let m = conn.request(reqwest::Method::GET, "/api/models", &[], None)?;
    output::print(&m, json, output::models);
    Ok(())
}

pub fn register_script(a: RegisterScriptArgs) -> Result<(), ClientError> {
    let bytes = std::fs::read(&a.file)
        .map_err(|e| fail(EXIT_USAGE, format!("cannot read {}: {e}", a.file.display())))?;
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
            body["contentBase64"] =
                json!(base64::engine::general_purpose::STANDARD.encode(e.into_bytes()));
        }
    }
    let filename = a.filename.clone().or_else(|| {
        a.file
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
    });
    for (k, v) in [
        ("model", a.model),
        ("version", a.version),
        ("description", a.description),
        ("filename", filename),
    ] {
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
    let e = a
        .conn
        .request(reqwest::Method::POST, "/api/commands", &[], Some(body))?;
    output::print(&e, a.json, output::registered);
    Ok(())
}
