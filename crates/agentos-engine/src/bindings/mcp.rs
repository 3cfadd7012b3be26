//! MCP servers: each tool a server lists is one operation of the entry. Registration connects,
//! lists the tools and pins that list as a blob (the contract is drawn from it); a call goes to
//! the server through a connection the master keeps ([`McpServers`]): started on first use,
//! restarted with backoff after it dies, closed when idle. A server that says its list changed
//! is listed again, and a different list is recorded as a new definition of the entry.
//!
//! A `command` server is a program the master starts, so only the operator registers one, and
//! it runs as the sandbox user (never as the master's user) with a clean environment plus the
//! secrets its `env` names. A `url` server is reached through the outbound policy's client, its
//! credential a secret granted to its origin, as for http services.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation, PaginatedRequestParams,
    Tool,
};
use rmcp::service::{ClientInitializeError, NotificationContext, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::io::AsyncReadExt;

use agentos_core::command::{HeaderFields, Plan, fields};
use agentos_core::entry::{
    Binding, BindingKind, CatalogEntry, Contract, HttpAuth, HttpAuthKind, McpBinding, McpServer, McpTool, Operation,
    Status,
};
use agentos_core::flags::Flag;
use agentos_core::urn::BlobUrn;
use agentos_core::{CoreError, ErrorKind, sha256_hex};

use super::{Binder, Call, Outcome, ValueCall, ValueKind};
use crate::engine::Inner;
use crate::outbound::origin_of;
use crate::redact::Redactor;
use crate::{Engine, EngineError, Principal};

/// The blob namespace of MCP servers' tool lists.
pub const MCP_NAMESPACE: &str = "tool-catalog/mcp";

/// The registration command of MCP servers.
pub const REGISTER_MCP: &str = "TOOL_CATALOG_REGISTER_MCP";

/// Tools one server may list; past it the registration is refused.
const MAX_TOOLS: usize = 2_000;

/// Pages of `tools/list` read at most.
const MAX_PAGES: usize = 200;

/// Bytes of a server's stderr kept, for the error that says why it died.
const STDERR_TAIL: usize = 4096;

/// Characters of a failed tool's message in the error line.
const MESSAGE_CHARS: usize = 300;

/// The longest wait before a dead server is started again.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Who command servers run as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ServerUser {
    /// None chosen: command servers are refused (a master not running as root has no other
    /// user to run them as, and running them as its own needs asking).
    #[default]
    Refused,
    /// The master's own user, asked for (`--mcp-run-as current`): a server can then read the
    /// master's data folder.
    Current,
    /// This uid and gid.
    Uid(u32, u32),
}

/// How the master runs MCP servers.
#[derive(Debug, Clone)]
pub struct McpConfig {
    pub run_as: ServerUser,
    /// A connection unused this long is closed (a command server's process ends with it).
    pub idle_stop: Duration,
    /// How long starting a server and its `initialize` may take.
    pub start_timeout: Duration,
    /// `PATH` of a command server's clean environment.
    pub path: String,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            run_as: ServerUser::Refused,
            idle_stop: Duration::from_secs(300),
            start_timeout: Duration::from_secs(30),
            path: "/usr/local/bin:/usr/bin:/bin".into(),
        }
    }
}

pub struct Mcp;

#[async_trait]
impl Binder for Mcp {
    fn kind(&self) -> BindingKind {
        BindingKind::Mcp
    }

    fn register_command(&self) -> Option<&'static str> {
        Some(REGISTER_MCP)
    }

    fn registering(&self) -> &'static str {
        "register MCP servers"
    }

    async fn plan(&self, engine: &Engine, p: &Principal, body: Value) -> Result<Plan, EngineError> {
        let cmd: RegisterMcp = fields(REGISTER_MCP, body)?;
        cmd.plan(engine, p).await
    }

    fn pinned_blob<'b>(&self, binding: &'b Binding) -> Option<&'b str> {
        match binding {
            Binding::Mcp(m) => Some(&m.tools_urn),
            _ => None,
        }
    }

    async fn invoke(&self, engine: &Engine, call: Call<'_>) -> Result<Outcome, EngineError> {
        let c = KIND.call(call)?;
        Ok(Outcome::Value(call_operation(engine, &c).await?))
    }

    async fn queue(&self, _engine: &Engine, call: Call<'_>) -> Result<String, EngineError> {
        Err(KIND.queue(&call))
    }
}

/// Calling needs `x` and the flag that reveals the kind.
const KIND: ValueKind = ValueKind { flag: Flag::Mcp, plural: "MCP servers", one: "an MCP server", parts: "tools" };

/// Calls one tool of an MCP entry with `input` (an object of its input schema). Flags are the
/// caller's to check (a shell command's principal, a fire's authority).
pub(crate) async fn call_operation(engine: &Engine, c: &ValueCall<'_>) -> Result<Value, EngineError> {
    let ValueCall { id, model, tool, ref input, timeout_ms, ref entry, .. } = *c;
    let Binding::Mcp(b) = &entry.entry.binding else {
        return Err(CoreError::bad_input("not_mcp", format!("{id:?} is not an MCP server")).into());
    };
    let server_tool = b.tools.iter().find(|t| t.name == tool).map(|t| t.tool.clone()).ok_or_else(|| {
        let names: Vec<&str> = b.tools.iter().map(|t| t.name.as_str()).collect();
        CoreError::not_found(agentos_core::toolhelp::unknown_tool(id, tool, &names))
    })?;
    let arguments = match input {
        Value::Object(m) => m.clone(),
        Value::Null => Map::new(),
        _ => return Err(CoreError::bad_input("usage", format!("{id} {tool}: the input must be an object")).into()),
    };
    let cfg = engine.inner.dispatch.config;
    let timeout_ms = timeout_ms.or(b.timeout_ms).unwrap_or(cfg.default_timeout_ms).min(cfg.max_timeout_ms);
    let key = ServerKey { model: model.to_string(), id: id.to_string() };
    let server = engine.inner.mcp.server(&key, &b.server);
    let failed =
        |kind, code, why: String| -> EngineError { CoreError::new(kind, code, format!("{id} {tool}: {why}")).into() };
    let conn = server.connection(engine).await.map_err(|why| failed(ErrorKind::Unavailable, "mcp_unavailable", why))?;
    let _busy = server.busy();
    let params = CallToolRequestParams::new(server_tool).with_arguments(arguments);
    let timeout = Duration::from_millis(timeout_ms);
    let result = match tokio::time::timeout(timeout, conn.client.call_tool(params)).await {
        Err(_) => {
            return Err(failed(
                ErrorKind::Unavailable,
                "timed_out",
                format!("the MCP server did not answer within {timeout_ms} ms"),
            ));
        }
        Ok(Err(e)) => {
            // Redacted as an answer is: an error's text can quote what the server wrote.
            let why = engine.principals().redactor(&conn.secrets).text(&server.lost(&conn, &e).await);
            return Err(failed(ErrorKind::ToolFailed, "mcp_failed", why));
        }
        Ok(Ok(r)) => r,
    };
    server.answered();
    let redactor = engine.principals().redactor(&conn.secrets);
    if result.is_error == Some(true) {
        let text = redactor.text(&message_of(&result));
        return Err(failed(ErrorKind::ToolFailed, "tool_failed", text));
    }
    Ok(redactor.value(output_of(result)))
}

/// What a tool answered, as JSON: its structured content, else its one text block (as JSON when
/// it parses), else its content blocks. A value FastMCP wrapped as `{"result": v}` (it says so
/// in `_meta`) is `v`.
fn output_of(result: CallToolResult) -> Value {
    let wrapped =
        result.meta.as_ref().and_then(|m| m.get("fastmcp")).and_then(|f| f.get("wrap_result")).and_then(Value::as_bool)
            == Some(true);
    if let Some(v) = result.structured_content {
        return match v {
            Value::Object(mut o) if wrapped && o.len() == 1 && o.contains_key("result") => {
                o.remove("result").unwrap_or(Value::Null)
            }
            v => v,
        };
    }
    let mut blocks = result.content;
    if blocks.len() == 1
        && let Some(t) = blocks[0].as_text()
    {
        let text = t.text.clone();
        return serde_json::from_str(text.trim()).unwrap_or(Value::String(text));
    }
    Value::Array(blocks.drain(..).filter_map(|b| serde_json::to_value(b).ok()).collect())
}

/// A failed tool's text, on one line.
fn message_of(result: &CallToolResult) -> String {
    let text: Vec<String> = result.content.iter().filter_map(|b| b.as_text().map(|t| t.text.clone())).collect();
    let line = text.join(" ").split_whitespace().collect::<Vec<_>>().join(" ");
    let line: String = line.chars().take(MESSAGE_CHARS).collect();
    if line.is_empty() { "the tool failed and said nothing more".into() } else { line }
}

/// `TOOL_CATALOG_REGISTER_MCP`: an MCP server by its command or URL.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterMcp {
    pub id: String,
    pub name: String,
    /// The model whose catalog holds the entry (default: the caller's home model).
    #[serde(default)]
    pub model: Option<String>,
    pub server: McpServer,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub capabilities: Option<Vec<String>>,
    /// Keep only these tools, by the server's name or the operation's.
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// How long one call may take, in milliseconds (the master's default and maximum apply).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

impl RegisterMcp {
    async fn plan(self, engine: &Engine, p: &Principal) -> Result<Plan, EngineError> {
        super::check_timeout(engine, self.timeout_ms)?;
        let header = HeaderFields {
            id: self.id,
            name: self.name,
            model: self.model,
            version: None,
            description: self.description,
            capabilities: self.capabilities,
        }
        .check(&p.home_model)?;
        check_server(engine, p, &self.server)?;
        let key = ServerKey { model: header.model.clone(), id: header.id.clone() };
        crate::progress::report("starting the server and its initialize");
        let conn = Conn::start(engine, &key, &self.server, None).await.map_err(|why| {
            CoreError::bad_input("mcp_unreachable", format!("the MCP server could not be reached: {why}"))
        })?;
        crate::progress::report("listing its tools");
        let listed = conn.list_tools().await;
        conn.stop().await;
        let listed = listed.map_err(|why| {
            CoreError::bad_input("mcp_unreachable", format!("the MCP server did not list its tools: {why}"))
        })?;
        let drawn = Drawn::from_tools(&listed, self.include.as_deref())?;
        let binding = Binding::Mcp(McpBinding {
            server: self.server,
            tools_urn: drawn.urn.to_string(),
            sha256: drawn.sha256.clone(),
            size_bytes: drawn.bytes.len() as u64,
            tools: drawn.tools,
            include: self.include,
            timeout_ms: self.timeout_ms,
            skipped: drawn.skipped,
        });
        let (model, entry) = header.into_entry(Status::Registered, drawn.contract, binding);
        Ok(Plan { model, entry, blobs: vec![(drawn.urn, drawn.bytes)] })
    }
}

/// What a registration may name: one of `command` and `url`, and for a command the operator
/// and a sandbox user to run it as.
fn check_server(engine: &Engine, p: &Principal, s: &McpServer) -> Result<(), EngineError> {
    let bad = |why: String| -> EngineError { CoreError::bad_input("invalid_server", why).into() };
    match (&s.command, &s.url) {
        (Some(command), None) => {
            if !p.is_operator() {
                return Err(CoreError::forbidden(format!(
                    "{} may not register a command MCP server: it runs a program on the master's machine, which only the operator may; register a url server instead",
                    p.name
                ))
                .into());
            }
            if command.trim().is_empty() || command.contains('\0') || s.args.iter().any(|a| a.contains('\0')) {
                return Err(bad(
                    "server.command must be a program's name or path, and no argument may hold a NUL".into()
                ));
            }
            if s.auth.is_some() {
                return Err(bad(
                    "server.auth belongs to url servers; a command server takes secrets through env".into()
                ));
            }
            for (var, secret) in &s.env {
                let ok_var = !var.is_empty()
                    && !var.starts_with(|c: char| c.is_ascii_digit())
                    && var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                if !ok_var {
                    return Err(bad(format!("server.env: {var:?} is not an environment variable name")));
                }
                if !agentos_core::net::valid_credential(secret) {
                    return Err(bad(format!("server.env.{var}: {secret:?} is not a secret name")));
                }
            }
            if engine.inner.mcp.config.run_as == ServerUser::Refused {
                return Err(CoreError::new(
                    ErrorKind::Forbidden,
                    "no_sandbox_user",
                    "this master has no user to run command MCP servers as (it never runs them as its own): start it as root, where they run as nobody, or with --mcp-run-as UID:GID (or current, which lets them read the master's data folder)",
                )
                .into());
            }
            Ok(())
        }
        (None, Some(url)) => {
            if !s.args.is_empty() || !s.env.is_empty() {
                return Err(bad("server.args and server.env belong to command servers".into()));
            }
            let (_, origin) = super::service_url("server.url", url, "invalid_server")?;
            if let Some(auth) = &s.auth {
                super::http::check_auth(auth)?;
                if auth.kind == HttpAuthKind::Query {
                    return Err(bad(
                        "server.auth: an MCP server takes its credential in a header (bearer, basic or header)".into(),
                    ));
                }
                if !engine.principals().secret_granted_to_origin(&auth.secret, &origin, None) {
                    return Err(super::http::not_granted(&auth.secret, &origin).into());
                }
            }
            Ok(())
        }
        _ => Err(bad("server needs exactly one of command and url".into())),
    }
}

/// The contract, the operations and the pinned list drawn from what a server listed.
struct Drawn {
    contract: Contract,
    tools: Vec<McpTool>,
    skipped: Vec<agentos_openapi::Skipped>,
    urn: BlobUrn,
    sha256: String,
    bytes: Vec<u8>,
}

impl Drawn {
    fn from_tools(listed: &[Tool], include: Option<&[String]>) -> Result<Drawn, EngineError> {
        let bytes = serde_json::to_vec(listed).map_err(|e| CoreError::internal(e.to_string()))?;
        let sha256 = sha256_hex(&bytes);
        let urn = BlobUrn::new(MCP_NAMESPACE, &sha256, Some("json"))?;
        // A name listed again names no tool a call could reach: the first keeps it.
        let mut seen: HashSet<&str> = HashSet::new();
        let repeated: Vec<bool> = listed.iter().map(|t| !seen.insert(t.name.as_ref())).collect();
        let mut names =
            operation_names(listed.iter().zip(&repeated).filter(|(_, again)| !**again).map(|(t, _)| t.name.as_ref()))
                .into_iter();
        let mut operations = BTreeMap::new();
        let mut tools = Vec::new();
        let mut skipped = Vec::new();
        let mut wanted: HashSet<&str> = include.unwrap_or_default().iter().map(String::as_str).collect();
        for (i, (t, again)) in listed.iter().zip(&repeated).enumerate() {
            let name = if *again { String::new() } else { names.next().unwrap_or_default() };
            if let Some(list) = include
                && !list.iter().any(|i| i == t.name.as_ref() || (!again && *i == name))
            {
                continue;
            }
            wanted.remove(t.name.as_ref());
            wanted.remove(name.as_str());
            // A tool left out says why, beside the entry: never dropped or merged in silence.
            if let Some(reason) = unusable_tool(t, *again) {
                skipped.push(agentos_openapi::Skipped { pointer: format!("/tools/{i}"), reason });
                continue;
            }
            let description = [t.description.as_deref(), t.title.as_deref()]
                .into_iter()
                .flatten()
                .map(str::trim)
                .find(|s| !s.is_empty())
                .unwrap_or(t.name.as_ref())
                .to_string();
            let input = Value::Object((*t.input_schema).clone());
            let output = t.output_schema.as_ref().map(|o| Value::Object((**o).clone()));
            operations.insert(name.clone(), Operation { description, input, output, examples: Vec::new() });
            tools.push(McpTool { name, tool: t.name.to_string() });
        }
        if !wanted.is_empty() {
            let mut missing: Vec<&str> = wanted.into_iter().collect();
            missing.sort_unstable();
            let offered: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
            return Err(CoreError::bad_input(
                "unknown_tool",
                format!(
                    "include names tools the server does not list: {}; it lists: {}",
                    missing.join(", "),
                    offered.join(", ")
                ),
            )
            .into());
        }
        if tools.is_empty() {
            let why = skipped.iter().map(|s| format!("{}: {}", s.pointer, s.reason)).collect::<Vec<_>>().join("; ");
            let message = if why.is_empty() {
                "the MCP server lists no tools to register".to_string()
            } else {
                format!("the MCP server lists no tools that can be registered: {why}")
            };
            return Err(CoreError::bad_input("no_tools", message).into());
        }
        Ok(Drawn { contract: Contract { kind: "mcp".into(), operations }, tools, skipped, urn, sha256, bytes })
    }
}

/// A key put into the input schema of a listed tool that has none ([`ChildLines`]), so that the
/// tool is left out with its reason rather than the whole list failing to read.
const NO_INPUT_SCHEMA: &str = "x-agentos-no-input-schema";

/// The stdio of a command MCP server, one JSON-RPC message a line, read here rather than by
/// rmcp's child-process transport, which drops a line it cannot parse and leaves the request
/// it answered waiting for its whole timeout (an answer nested deeper than serde_json's 128
/// levels, say), and fails a whole `tools/list` over one tool without `inputSchema`. Here:
/// - a line that does not parse is answered, to the request it names (its `"id"`, found as
///   `/mcp` finds one, [`agentos_core::message_id::top_level_id`]), with a JSON-RPC error that
///   says why, so the call fails at once and truthfully;
/// - a listed tool without `inputSchema` gets a marked one, and is left out of the entry with
///   its reason ([`unusable_tool`]);
/// - a line past [`MAX_SERVER_LINE`] is skipped to its end and answered the same way.
struct ChildLines {
    child: tokio::process::Child,
    /// The server's stdout, lines of at most [`MAX_SERVER_LINE`].
    read: crate::lines::BoundedLines<tokio::process::ChildStdout>,
    write: Arc<tokio::sync::Mutex<tokio::process::ChildStdin>>,
}

/// The longest line read from a server, as rmcp's stdio transport bounds it.
const MAX_SERVER_LINE: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

impl ChildLines {
    /// Starts `cmd` with its stdin and stdout piped to the transport; its stderr is handed back.
    fn spawn(mut cmd: tokio::process::Command) -> std::io::Result<(ChildLines, Option<tokio::process::ChildStderr>)> {
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(std::io::Error::other("the server's stdin or stdout could not be piped"));
        };
        let stderr = child.stderr.take();
        let lines = ChildLines {
            child,
            read: crate::lines::BoundedLines::new(stdout, MAX_SERVER_LINE),
            write: Arc::new(tokio::sync::Mutex::new(stdin)),
        };
        Ok((lines, stderr))
    }

    fn id(&self) -> Option<u32> {
        self.child.id()
    }
}

/// The error answering request `id` of a line that could not be read.
fn unreadable_answer(id: Option<Value>, why: String) -> Option<rmcp::model::ServerJsonRpcMessage> {
    let id: rmcp::model::RequestId = serde_json::from_value(id?).ok()?;
    let error = rmcp::ErrorData::new(rmcp::model::ErrorCode::PARSE_ERROR, why, None);
    Some(rmcp::model::ServerJsonRpcMessage::error(error, Some(id)))
}

/// A command server's line or a url server's event as a message: read (see [`server_message`]),
/// or, when it does not read, the error answering the request it names, so that request fails
/// now with the reason instead of waiting for its answer until the stream ends.
///
/// A message naming no request of ours has no one to answer: a notification, a request of the
/// server's own (its id is in the server's numbering, and could name one of ours), or not
/// JSON-RPC at all. `None` leaves it to be dropped, as rmcp drops it; so, erring that way, is
/// any message that holds `"method"`.
fn read_or_answer(text: &[u8]) -> Option<rmcp::model::ServerJsonRpcMessage> {
    match server_message(text) {
        Ok(message) => Some(message),
        Err(e) => {
            tracing::debug!(error = %e, "an MCP server sent a message that does not read");
            let why = format!("the server's answer could not be read: {}", agentos_core::name::cut(&e, 200));
            let request = text.windows(8).any(|w| w == b"\"method\"");
            let id = if request { None } else { agentos_core::message_id::top_level_id(text) };
            unreadable_answer(id, why)
        }
    }
}

/// A line as rmcp reads it, with what [`ChildLines`] mends first: a listed tool without
/// `inputSchema` gets a marked one.
fn server_message(line: &[u8]) -> Result<rmcp::model::ServerJsonRpcMessage, String> {
    let mut value: Value = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    if let Some(tools) = value.pointer_mut("/result/tools").and_then(Value::as_array_mut) {
        for tool in tools.iter_mut().filter_map(Value::as_object_mut) {
            if !tool.contains_key("inputSchema") {
                tool.insert("inputSchema".into(), serde_json::json!({"type": "object", NO_INPUT_SCHEMA: true}));
            }
        }
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

impl rmcp::transport::Transport<RoleClient> for ChildLines {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: rmcp::model::ClientJsonRpcMessage,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = self.write.clone();
        async move {
            use tokio::io::AsyncWriteExt;
            let mut line = serde_json::to_vec(&item)?;
            line.push(b'\n');
            let mut stdin = write.lock().await;
            stdin.write_all(&line).await?;
            stdin.flush().await
        }
    }

    async fn receive(&mut self) -> Option<rmcp::model::ServerJsonRpcMessage> {
        loop {
            match self.read.read_line().await {
                Ok(true) => {}
                Ok(false) | Err(_) => return None,
            }
            let line = std::mem::take(&mut self.read.line);
            if let Some(scan) = self.read.too_long.take() {
                let why = format!(
                    "the server's answer is longer than {} MiB, the most a line may hold",
                    MAX_SERVER_LINE >> 20
                );
                match unreadable_answer(scan.id(), why) {
                    Some(answer) => return Some(answer),
                    None => continue,
                }
            }
            let line = line.strip_suffix(b"\n").unwrap_or(&line);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.trim_ascii().is_empty() {
                continue;
            }
            if let Some(message) = read_or_answer(line) {
                return Some(message);
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // Its stdin closed, a server ends by itself; one that does not within a second is
        // killed (and its process group with it, when its [`Conn`] goes).
        {
            use tokio::io::AsyncWriteExt;
            let _ = self.write.lock().await.shutdown().await;
        }
        if tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await.is_err() {
            let _ = self.child.start_kill();
        }
        Ok(())
    }
}

/// The largest input schema one MCP tool may have: its schema goes to every MCP client in
/// `tools/list`, and clients cap what one message may hold (the Python SDK: 1 MiB in all).
const MAX_TOOL_SCHEMA_BYTES: usize = 64 * 1024;

/// Why a listed tool cannot be offered: a name already listed (a call names one tool, so the
/// second could never be reached), or an input schema too large or not a schema (its checks
/// would not run).
fn unusable_tool(t: &Tool, repeated: bool) -> Option<String> {
    if repeated {
        return Some(format!("the server lists a tool named {:?} before it; a call names one", t.name.as_ref()));
    }
    if t.input_schema.contains_key(NO_INPUT_SCHEMA) {
        return Some(format!(
            "tool {:?}: it has no inputSchema, which MCP requires of every tool, so its input cannot be checked",
            t.name.as_ref()
        ));
    }
    let schema = Value::Object((*t.input_schema).clone());
    let size = serde_json::to_vec(&schema).map_or(usize::MAX, |b| b.len());
    if size > MAX_TOOL_SCHEMA_BYTES {
        return Some(format!(
            "tool {:?}: its input schema is {size} bytes, over the {MAX_TOOL_SCHEMA_BYTES} an MCP client is offered",
            t.name.as_ref()
        ));
    }
    if agentos_core::flagmap::compile(&schema).is_none() {
        return Some(format!(
            "tool {:?}: its input schema is not a valid JSON Schema (an unknown type, a $ref to nothing, a pattern that is no regex), so its checks could not run",
            t.name.as_ref()
        ));
    }
    None
}

/// Operation names for the server's tool names, in order: kebab-case (`get_weather` →
/// `get-weather`); names that come out the same or empty get 6 hex characters of the sha256
/// of the server's name, and none is longer than 64 characters.
fn operation_names<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let names: Vec<&str> = names.collect();
    let base: Vec<String> = names.iter().map(|n| agentos_openapi::flag_name(n)).collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for b in &base {
        *count.entry(b.as_str()).or_default() += 1;
    }
    names
        .iter()
        .zip(&base)
        .map(|(raw, b)| {
            if !b.is_empty() && count[b.as_str()] == 1 && b.len() <= 64 {
                return b.clone();
            }
            let suffix = &sha256_hex(raw.as_bytes())[..6];
            let keep: String = b.chars().take(57).collect();
            let keep = keep.trim_end_matches('-');
            if keep.is_empty() { format!("tool-{suffix}") } else { format!("{keep}-{suffix}") }
        })
        .collect()
}

/// Which connection: an entry's, in the model it was resolved in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ServerKey {
    model: String,
    id: String,
}

/// The MCP servers a master keeps connections to, one per entry.
pub(crate) struct McpServers {
    pub(crate) config: McpConfig,
    /// Set once the engine is open: what a server's list-changed notice reaches.
    engine: std::sync::OnceLock<Weak<Inner>>,
    live: Mutex<HashMap<ServerKey, Arc<Server>>>,
}

impl McpServers {
    pub(crate) fn new(config: McpConfig) -> Self {
        McpServers { config, engine: Default::default(), live: Default::default() }
    }

    pub(crate) fn set_engine(&self, inner: Weak<Inner>) {
        let _ = self.engine.set(inner);
    }

    /// The entry's server; a new one when the entry now names another server.
    fn server(&self, key: &ServerKey, spec: &McpServer) -> Arc<Server> {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        match live.get(key) {
            Some(s) if s.spec == *spec => s.clone(),
            _ => {
                let s = Arc::new(Server {
                    key: key.clone(),
                    spec: spec.clone(),
                    slot: tokio::sync::Mutex::new(Slot::default()),
                    last_used: Mutex::new(Instant::now()),
                    in_flight: AtomicUsize::new(0),
                });
                live.insert(key.clone(), s.clone());
                s
            }
        }
    }

    /// Closes every connection (the master is stopping).
    pub(crate) fn stop_all(&self) {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// One entry's server: its connection, started and restarted here.
struct Server {
    key: ServerKey,
    spec: McpServer,
    slot: tokio::sync::Mutex<Slot>,
    last_used: Mutex<Instant>,
    in_flight: AtomicUsize,
}

#[derive(Default)]
struct Slot {
    conn: Option<Arc<Conn>>,
    /// Starts or connections lost in a row, since the last answered call.
    failures: u32,
    /// No start before then.
    retry_at: Option<Instant>,
    last_error: Option<String>,
}

/// A call in flight: keeps an idle server from being stopped under it.
struct Busy<'a>(&'a Server);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        *self.0.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }
}

impl Server {
    fn busy(&self) -> Busy<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(self)
    }

    /// The live connection, started when there is none (unless a failed start is still
    /// backing off).
    async fn connection(self: &Arc<Self>, engine: &Engine) -> Result<Arc<Conn>, String> {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        let mut slot = self.slot.lock().await;
        if let Some(c) = &slot.conn {
            if !c.client.is_transport_closed() {
                return Ok(c.clone());
            }
            let why = c.died_because();
            slot.conn = None;
            Self::failed(&mut slot, why);
        }
        if let Some(at) = slot.retry_at
            && let Some(wait) = at.checked_duration_since(Instant::now())
        {
            let last = slot.last_error.clone().unwrap_or_default();
            return Err(format!(
                "the MCP server is down ({last}); it is started again in {:.1} s",
                wait.as_secs_f64().max(0.1)
            ));
        }
        let listener = Listener { engine: engine.inner.mcp.engine.get().cloned(), key: self.key.clone() };
        match Conn::start(engine, &self.key, &self.spec, Some(listener)).await {
            Ok(c) => {
                let c = Arc::new(c);
                slot.conn = Some(c.clone());
                slot.retry_at = None;
                tokio::spawn(watch_idle(Arc::downgrade(self), Arc::downgrade(&c), engine.inner.mcp.config.idle_stop));
                Ok(c)
            }
            Err(why) => {
                Self::failed(&mut slot, why.clone());
                Err(why)
            }
        }
    }

    /// Counts a failure and sets when the next start may be: at once after the first, then
    /// 1, 2, 4 ... seconds, at most a minute.
    fn failed(slot: &mut Slot, why: String) {
        slot.failures += 1;
        let wait = if slot.failures <= 1 {
            Duration::ZERO
        } else {
            Duration::from_secs(1u64 << (slot.failures - 2).min(6)).min(MAX_BACKOFF)
        };
        slot.retry_at = Some(Instant::now() + wait);
        slot.last_error = Some(why);
    }

    /// A call failed on `conn`: when the connection is gone, drops it (the next call starts
    /// the server again) and answers why, with what the server last wrote to stderr.
    async fn lost(&self, conn: &Arc<Conn>, e: &ServiceError) -> String {
        let closed = conn.client.is_transport_closed()
            || matches!(e, ServiceError::TransportClosed | ServiceError::TransportSend(_));
        if !closed {
            return match e {
                // An answer the server sent that could not be read ([`unreadable_answer`]): the
                // server refused nothing.
                ServiceError::McpError(err)
                    if err.code == rmcp::model::ErrorCode::PARSE_ERROR
                        && err.message.starts_with("the server's answer") =>
                {
                    err.message.to_string()
                }
                // The server's words: one line, cut, with nothing a terminal acts on.
                ServiceError::McpError(err) => format!(
                    "the MCP server answered the call with error {}: {}",
                    err.code.0,
                    agentos_core::name::cut(&agentos_core::name::terminal_line(&err.message), 500)
                ),
                other => format!("the MCP server refused the call: {other}"),
            };
        }
        let why = conn.died_because();
        let mut slot = self.slot.lock().await;
        if slot.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            slot.conn = None;
            Self::failed(&mut slot, why.clone());
        }
        format!("the connection to the MCP server was lost mid-call ({why}); the next call starts it again")
    }

    /// A call was answered: the server is healthy again.
    fn answered(&self) {
        if let Ok(mut slot) = self.slot.try_lock() {
            slot.failures = 0;
            slot.last_error = None;
        }
    }
}

/// Closes `conn` once its server has had no call for `idle`.
async fn watch_idle(server: Weak<Server>, conn: Weak<Conn>, idle: Duration) {
    loop {
        tokio::time::sleep(idle.max(Duration::from_millis(100)) / 4).await;
        let (Some(server), Some(c)) = (server.upgrade(), conn.upgrade()) else { return };
        let quiet = server.last_used.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
        if server.in_flight.load(Ordering::Acquire) > 0 || quiet < idle {
            continue;
        }
        let mut slot = server.slot.lock().await;
        if slot.conn.as_ref().is_some_and(|s| Arc::ptr_eq(s, &c)) && server.in_flight.load(Ordering::Acquire) == 0 {
            slot.conn = None;
            drop(slot);
            tracing::info!(model = %server.key.model, id = %server.key.id, "MCP server idle: stopped");
            if let Some(c) = Arc::into_inner(c) {
                c.stop().await;
            }
            return;
        }
        if slot.conn.is_none() {
            return;
        }
    }
}

/// One connection to a server.
struct Conn {
    client: RunningService<RoleClient, Listener>,
    /// What a command server wrote to stderr last.
    stderr: Arc<Mutex<Vec<u8>>>,
    /// A command server's process group, killed with the connection.
    pgid: Option<i32>,
    /// Secret values this connection carries, kept out of what it answers.
    secrets: Vec<String>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            // SAFETY: killpg only sends a signal; a group already gone gives ESRCH.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

impl Conn {
    /// Starts (a command) or reaches (a url) the server and runs `initialize`.
    async fn start(
        engine: &Engine,
        key: &ServerKey,
        spec: &McpServer,
        listener: Option<Listener>,
    ) -> Result<Conn, String> {
        let listener = listener.unwrap_or(Listener { engine: None, key: key.clone() });
        let config = &engine.inner.mcp.config;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut secrets = Vec::new();
        let timeout = config.start_timeout;
        let (client, pgid) = match (&spec.command, &spec.url) {
            (Some(command), _) => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(&spec.args)
                    .env_clear()
                    .env("PATH", &config.path)
                    .current_dir("/")
                    .process_group(0)
                    .kill_on_drop(true);
                match config.run_as {
                    ServerUser::Refused => {
                        return Err("this master has no user to run command MCP servers as".into());
                    }
                    ServerUser::Current => {}
                    ServerUser::Uid(uid, gid) => {
                        cmd.uid(uid).gid(gid);
                    }
                }
                for (var, secret) in &spec.env {
                    let value = engine
                        .principals()
                        .secret(secret)
                        .ok_or_else(|| format!("secret {secret:?} (for {var}) is not set on the master"))?;
                    secrets.push(value.clone());
                    cmd.env(var, value);
                }
                let (transport, err) = ChildLines::spawn(cmd).map_err(|e| format!("cannot start {command:?}: {e}"))?;
                let pgid = transport.id().map(|p| p as i32);
                let mut reader = None;
                if let Some(mut err) = err {
                    let tail = stderr.clone();
                    reader = Some(tokio::spawn(async move {
                        let mut buf = [0u8; 1024];
                        while let Ok(n) = err.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                            t.extend_from_slice(&buf[..n]);
                            let over = t.len().saturating_sub(STDERR_TAIL);
                            t.drain(..over);
                        }
                    }));
                }
                let started = tokio::time::timeout(timeout, listener.serve(transport)).await;
                let client = match started {
                    Err(_) => {
                        if let Some(g) = pgid {
                            // SAFETY: as in Drop.
                            unsafe {
                                libc::killpg(g, libc::SIGKILL);
                            }
                        }
                        return Err(format!("{command:?} did not answer initialize within {} s", timeout.as_secs()));
                    }
                    Ok(Err(e)) => {
                        // What it wrote before it ended says why.
                        if let Some(r) = reader {
                            let _ = tokio::time::timeout(Duration::from_millis(500), r).await;
                        }
                        let tail = last_line(&stderr);
                        return Err(match e {
                            ClientInitializeError::TransportError { .. }
                            | ClientInitializeError::ConnectionClosed(_) => {
                                format!("{command:?} ended or closed its output before answering initialize{tail}")
                            }
                            other => format!("{command:?} failed to initialize: {}{tail}", init_error(&other)),
                        });
                    }
                    Ok(Ok(c)) => c,
                };
                (client, pgid)
            }
            (None, Some(url)) => {
                let parsed = reqwest::Url::parse(url).map_err(|e| format!("server.url {url:?}: {e}"))?;
                engine.inner.nets.outbound.check_url(&parsed).map_err(|e| format!("{url} refused: {e}"))?;
                let mut transport_config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                if let Some(auth) = &spec.auth {
                    let value = credential(engine, auth, &parsed)?;
                    secrets.push(value.clone());
                    transport_config = with_credential(transport_config, auth, &value)?;
                }
                let client = PortedClient { http: engine.inner.nets.sealed_http.clone(), url: parsed.clone() };
                let transport = StreamableHttpClientTransport::with_client(client, transport_config);
                let client = match tokio::time::timeout(timeout, listener.serve(transport)).await {
                    Err(_) => return Err(format!("{url} did not answer initialize within {} s", timeout.as_secs())),
                    Ok(Err(e)) => return Err(Redactor::new(&secrets).text(&format!("{url}: {}", init_error(&e)))),
                    Ok(Ok(c)) => c,
                };
                (client, None)
            }
            _ => return Err("the server names neither a command nor a url".into()),
        };
        Ok(Conn { client, stderr, pgid, secrets })
    }

    /// Every tool the server lists, page after page.
    async fn list_tools(&self) -> Result<Vec<Tool>, String> {
        let mut tools = Vec::new();
        let mut cursor = None;
        for _ in 0..MAX_PAGES {
            let params = cursor.take().map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
            let page = tokio::time::timeout(Duration::from_secs(30), self.client.list_tools(params))
                .await
                .map_err(|_| "tools/list was not answered within 30 s".to_string())?
                .map_err(|e| format!("tools/list failed: {e}{}", last_line(&self.stderr)))?;
            tools.extend(page.tools);
            if tools.len() > MAX_TOOLS {
                return Err(format!("the server lists more than {MAX_TOOLS} tools"));
            }
            match page.next_cursor {
                Some(c) if !c.is_empty() => cursor = Some(c),
                _ => return Ok(tools),
            }
        }
        Err(format!("tools/list gave more than {MAX_PAGES} pages"))
    }

    /// Why the connection ended, as far as can be told.
    fn died_because(&self) -> String {
        let tail = last_line(&self.stderr);
        if self.pgid.is_some() {
            format!("the server process ended{tail}")
        } else {
            // The client cannot tell a stream the server closed from one it gave up on: an
            // answer over the 16 MiB an event of the stream may hold ends it too.
            format!("the server's stream ended: it closed it, or sent an answer over the 16 MiB one may hold{tail}")
        }
    }

    async fn stop(self) {
        let mut this = self;
        let _ = this.client.close_with_timeout(Duration::from_secs(2)).await;
    }
}

/// Why `initialize` failed, in words: a transport's failure by its own message and causes,
/// without rmcp's name for the transport.
fn init_error(e: &ClientInitializeError) -> String {
    let ClientInitializeError::TransportError { error, .. } = e else { return e.to_string() };
    type HttpError = rmcp::transport::streamable_http_client::StreamableHttpError<reqwest::Error>;
    match error.error.downcast_ref::<HttpError>() {
        // reqwest's own causes (connection refused, a refused address) are its sources.
        Some(HttpError::Client(e)) => crate::outbound::describe(e),
        _ => crate::outbound::describe(error.error.as_ref()),
    }
}

/// `: <the last line the server wrote to stderr>`, or nothing.
fn last_line(stderr: &Mutex<Vec<u8>>) -> String {
    let t = stderr.lock().unwrap_or_else(|p| p.into_inner());
    let text = String::from_utf8_lossy(&t);
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| format!(": {}", l.trim().chars().take(MESSAGE_CHARS).collect::<String>()))
        .unwrap_or_default()
}

/// The credential's value, when granted to the server's origin.
fn credential(engine: &Engine, auth: &HttpAuth, url: &reqwest::Url) -> Result<String, String> {
    let origin = origin_of(url).unwrap_or_default();
    if !engine.principals().secret_granted_to_origin(&auth.secret, &origin, None) {
        return Err(super::http::not_granted(&auth.secret, &origin).message);
    }
    engine.principals().secret(&auth.secret).ok_or_else(|| format!("secret {:?} is not set on the master", auth.secret))
}

fn with_credential(
    config: StreamableHttpClientTransportConfig,
    auth: &HttpAuth,
    value: &str,
) -> Result<StreamableHttpClientTransportConfig, String> {
    let (name, header) = match auth.kind {
        HttpAuthKind::Bearer => return Ok(config.auth_header(value.to_string())),
        HttpAuthKind::Basic => (
            "authorization".to_string(),
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(value.as_bytes())),
        ),
        HttpAuthKind::Header => (auth.name.clone().unwrap_or_default(), value.to_string()),
        HttpAuthKind::Query => return Err("an MCP server takes its credential in a header".into()),
    };
    let name = reqwest::header::HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("auth.name: {e}"))?;
    let value = reqwest::header::HeaderValue::from_str(&header)
        .map_err(|_| "the secret is not a valid header value".to_string())?;
    Ok(config.custom_headers(HashMap::from([(name, value)])))
}

/// The client side of a connection: names the master, and lists again when the server says
/// its list changed.
#[derive(Clone)]
struct Listener {
    engine: Option<Weak<Inner>>,
    key: ServerKey,
}

impl ClientHandler for Listener {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("agentos", env!("CARGO_PKG_VERSION")))
    }

    async fn on_tool_list_changed(&self, _ctx: NotificationContext<RoleClient>) {
        let Some(inner) = self.engine.as_ref().and_then(Weak::upgrade) else { return };
        let key = self.key.clone();
        tokio::spawn(async move {
            let engine = Engine { inner };
            if let Err(e) = relist(&engine, &key).await {
                tracing::warn!(model = %key.model, id = %key.id, error = %e, "MCP server's new tool list not recorded");
            }
        });
    }
}

/// Lists the entry's server's tools again and records a different list as a new definition of
/// the entry, by the principal that owns it.
async fn relist(engine: &Engine, key: &ServerKey) -> Result<(), EngineError> {
    let (stored, owner) = {
        let st = engine.read_state();
        let Some(stored) = st.catalog(&key.model).and_then(|c| c.get(&key.id)).cloned() else { return Ok(()) };
        let owner = st.principal_by_id(&stored.owner).map(|r| Principal::from_record(r));
        (stored, owner)
    };
    let Binding::Mcp(b) = &stored.entry.binding else { return Ok(()) };
    let Some(owner) = owner else {
        return Err(CoreError::internal("the entry's owner is gone").into());
    };
    let server = engine.inner.mcp.server(key, &b.server);
    let conn = server.connection(engine).await.map_err(CoreError::internal)?;
    let listed = conn.list_tools().await.map_err(CoreError::internal)?;
    let drawn = Drawn::from_tools(&listed, b.include.as_deref())?;
    if drawn.sha256 == b.sha256 {
        return Ok(());
    }
    let e = &stored.entry;
    let entry = CatalogEntry {
        id: e.id.to_string(),
        name: e.name.to_string(),
        version: e.version.to_string(),
        description: e.description.to_string(),
        capabilities: e.capabilities.iter().map(|c| c.to_string()).collect(),
        status: e.status,
        binding: Binding::Mcp(McpBinding {
            tools_urn: drawn.urn.to_string(),
            sha256: drawn.sha256.clone(),
            size_bytes: drawn.bytes.len() as u64,
            tools: drawn.tools,
            skipped: drawn.skipped,
            ..b.clone()
        }),
        contract: drawn.contract,
    };
    let plan = Plan { model: key.model.clone(), entry, blobs: vec![(drawn.urn, drawn.bytes)] };
    engine.catalog().store_plan(&owner, plan).await?;
    tracing::info!(model = %key.model, id = %key.id, "MCP server's tool list changed: recorded");
    Ok(())
}

/// The outbound client as rmcp's transport calls it: each request is sent with the server's port
/// known to the policy's resolver ([`crate::outbound::sending`]), so a server named by a host name
/// is judged on its port as one named by its IP is. Every request goes to the server's one URL.
#[derive(Clone)]
struct PortedClient {
    http: reqwest::Client,
    url: reqwest::Url,
}

type PortedError = rmcp::transport::streamable_http_client::StreamableHttpError<reqwest::Error>;

impl rmcp::transport::streamable_http_client::StreamableHttpClient for PortedClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: rmcp::model::ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>,
    ) -> Result<rmcp::transport::streamable_http_client::StreamableHttpPostResponse, PortedError> {
        let send = self.http.post_message(uri, message, session_id, auth_header, custom_headers);
        match crate::outbound::sending(&self.url, send).await? {
            StreamablePost::Sse(stream, session) => Ok(StreamablePost::Sse(mended_stream(stream), session)),
            answer => Ok(answer),
        }
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: rmcp::model::ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>,
        limits: rmcp::transport::streamable_http_client::StreamableHttpResponseLimits,
    ) -> Result<rmcp::transport::streamable_http_client::StreamableHttpPostResponse, PortedError> {
        let send =
            self.http.post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits);
        match crate::outbound::sending(&self.url, send).await? {
            StreamablePost::Sse(stream, session) => Ok(StreamablePost::Sse(mended_stream(stream), session)),
            answer => Ok(answer),
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>,
    ) -> Result<(), PortedError> {
        let send = self.http.delete_session(uri, session_id, auth_header, custom_headers);
        crate::outbound::sending(&self.url, send).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>,
    ) -> Result<futures_util::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>, PortedError> {
        let send = self.http.get_stream(uri, session_id, last_event_id, auth_header, custom_headers);
        crate::outbound::sending(&self.url, send).await.map(mended_stream)
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<futures_util::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>, PortedError> {
        let send = self.http.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            max_sse_event_size,
        );
        crate::outbound::sending(&self.url, send).await.map(mended_stream)
    }
}

type StreamablePost = rmcp::transport::streamable_http_client::StreamableHttpPostResponse;
type SseEvents = futures_util::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>;

/// A url server's event stream with each message mended as [`ChildLines`] mends a command
/// server's lines, before rmcp reads it: rmcp skips an event it cannot read, so the request it
/// answered waited for its stream to end and failed as "closed before its final response", and
/// one listed tool without `inputSchema` failed the whole `tools/list`. Here an event that does
/// not read is answered, to the request it names, with an error that says why; a listed tool
/// without `inputSchema` gets the marked one that leaves it out with its reason. (An answer sent
/// as one JSON body rather than as events is read by rmcp alone: one it cannot read fails its
/// request with rmcp's reason.)
fn mended_stream(events: SseEvents) -> SseEvents {
    use futures_util::StreamExt;
    events.map(|event| event.map(mended_event)).boxed()
}

/// One event, as [`mended_stream`] hands it on.
fn mended_event(mut event: sse_stream::Sse) -> sse_stream::Sse {
    // Only message events carry JSON-RPC, as rmcp reads them.
    if !matches!(event.event.as_deref(), None | Some("") | Some("message")) {
        return event;
    }
    let Some(data) = event.data.as_deref() else { return event };
    if data.trim().is_empty() {
        return event;
    }
    // Read here whatever rmcp would read it as: a tool list missing a schema still reads, as
    // another kind of answer, which rmcp then refuses ("Unexpected response type"). One that
    // names no request of ours is left as it came, for rmcp to drop.
    if let Some(text) = read_or_answer(data.as_bytes()).and_then(|m| serde_json::to_string(&m).ok()) {
        event.data = Some(text);
    }
    event
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_server_is_started_again_at_once_then_after_doubling_waits_of_at_most_a_minute() {
        let mut slot = Slot::default();
        let mut waits = Vec::new();
        for _ in 0..10 {
            let before = Instant::now();
            Server::failed(&mut slot, "it ended".into());
            waits.push(slot.retry_at.unwrap().saturating_duration_since(before).as_secs());
        }
        assert_eq!(waits, [0, 1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(slot.last_error.as_deref(), Some("it ended"));
    }

    #[test]
    fn operation_names_are_kebab_case_and_never_collide() {
        let names = operation_names(["get_weather", "getWeather", "echo", "", "a.b/c"].into_iter());
        assert_eq!(names[2], "echo");
        assert_eq!(names[4], "a-b-c");
        assert!(names[0].starts_with("get-weather-") && names[1].starts_with("get-weather-"), "{names:?}");
        assert_ne!(names[0], names[1]);
        assert!(names[3].starts_with("tool-"), "{names:?}");
        let long = "x".repeat(100);
        let n = operation_names([long.as_str()].into_iter());
        assert!(n[0].len() <= 64, "{n:?}");
    }
}
