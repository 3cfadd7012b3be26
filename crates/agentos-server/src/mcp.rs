//! MCP over Streamable HTTP at `/mcp`: the catalog's operations as MCP tools, for the principal
//! whose bearer token the request carries, with the same flags as every other read and call.
//!
//! - Tools: every operation of every entry the caller sees from its home model (local first, a
//!   shadowed global entry left out) and may call (`BindingKind::callable_by`), named
//!   `{toolkit}_{operation}` (see [`tool_name`]); the input schema is the operation's. Platform
//!   tools, under the reserved prefix `agentos_`, search and read the catalog.
//! - A call answers the operation's output as structured content (an object as it is, anything
//!   else as `{"result": …}`) and as text; a failed call is `isError: true` with the one line an
//!   agent can act on, the same line a shell command prints.
//! - `notifications/tools/list_changed` goes to each session whose visible set changed, when the
//!   log shows a registration, a removal or a model grant.
//! - A session belongs to the principal whose `initialize` opened it (`SessionOwners`): under
//!   any other token its id answers as an unknown one does. A principal holds at most 100, the
//!   master 10,000, whatever the client does mid-handshake; revoking a principal ends its own.
//! - A session lives while it is used: it ends when no request has come and no answer or event
//!   stream of it has been open for `--mcp-session-idle-ms` (5 minutes). A client that only
//!   listens, on an open `GET` stream, keeps its session.
//! - A body that is not one JSON-RPC message (a batch, a `jsonrpc` other than "2.0", not JSON)
//!   is answered HTTP 400 with a JSON-RPC error that says what is wrong; a request whose required
//!   params are missing or malformed is -32602 (Invalid params), not rmcp's -32601.
//!
//! `agentos mcp` (the CLI) serves the same over stdio by relaying to this endpoint; a line it
//! cannot read it sends here as a body, to answer with the error this endpoint gives it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ClientRequest, ContentBlock,
    CustomRequest, CustomResult, ErrorCode, Implementation, InitializeRequestParams, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, SubscriptionFilter, SubscriptionsListenRequestParams,
    Tool,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, SubscriptionContext};
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::broadcast;

use agentos_core::event::{EventBody, PrincipalKind};
use agentos_core::search::SearchQuery;
use agentos_engine::{Engine, Principal};

use crate::error::ApiError;
use crate::state::AppState;
use agentos_core::message_id::{id_of, top_level_id};

/// The prefix of the platform's own tools; no toolkit id can take it (ids hold no `_`).
pub const PLATFORM_PREFIX: &str = "agentos_";

/// The MCP name of a toolkit's operation: `{toolkit}_{operation}`; past 64 characters, its first
/// 55, `-`, and 8 hex characters of the whole name's sha256. Toolkit ids hold no `_`, so the
/// first `_` of a name that fits always splits it back.
pub fn tool_name(toolkit: &str, operation: &str) -> String {
    let name = format!("{toolkit}_{operation}");
    if name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return name;
    }
    let digest = hex::encode(&Sha256::digest(name.as_bytes())[..4]);
    let keep: String = name.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-').take(55).collect();
    format!("{keep}-{digest}")
}

/// What one MCP tool calls.
#[derive(Clone)]
enum Target {
    Operation { toolkit: String, operation: String },
    Platform(Platform),
}

/// The platform's own tools, each behind the flag its API route needs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Platform {
    SearchCatalog,
    GetEntry,
    RegisterScript,
    ApplyNet,
    PutToken,
    ListTokens,
    StartTransition,
    StopTransition,
    FireTransition,
    /// The three tools of search mode, offered instead of a long list.
    SearchTools,
    DescribeTool,
    CallTool,
}

const PLATFORM: [Platform; 9] = [
    Platform::SearchCatalog,
    Platform::GetEntry,
    Platform::RegisterScript,
    Platform::ApplyNet,
    Platform::PutToken,
    Platform::ListTokens,
    Platform::StartTransition,
    Platform::StopTransition,
    Platform::FireTransition,
];

const SEARCH_MODE: [Platform; 3] = [Platform::SearchTools, Platform::DescribeTool, Platform::CallTool];

fn model_field() -> Value {
    json!({"type": "string", "description": "The model (default: your home model)"})
}

impl Platform {
    fn name(self) -> String {
        let short = match self {
            Platform::SearchCatalog => "search_catalog",
            Platform::GetEntry => "get_entry",
            Platform::RegisterScript => "register_script",
            Platform::ApplyNet => "apply_net",
            Platform::PutToken => "put_token",
            Platform::ListTokens => "list_tokens",
            Platform::StartTransition => "start_transition",
            Platform::StopTransition => "stop_transition",
            Platform::FireTransition => "fire_transition",
            Platform::SearchTools => "search_tools",
            Platform::DescribeTool => "describe_tool",
            Platform::CallTool => "call_tool",
        };
        format!("{PLATFORM_PREFIX}{short}")
    }

    /// Whether `flags` may use it: the flag of the API route it stands for.
    fn allowed(self, flags: agentos_core::flags::Flags) -> bool {
        use agentos_core::flags::Flag;
        match self {
            Platform::SearchCatalog | Platform::GetEntry => {
                agentos_core::entry::CATALOG_READ_FLAGS.iter().any(|f| flags.has(*f))
            }
            Platform::RegisterScript => flags.has(Flag::Scripts),
            Platform::ApplyNet | Platform::PutToken => flags.has(Flag::Write),
            Platform::ListTokens => flags.has(Flag::Read),
            Platform::StartTransition | Platform::StopTransition | Platform::FireTransition => flags.has(Flag::Execute),
            Platform::SearchTools | Platform::DescribeTool | Platform::CallTool => true,
        }
    }

    fn tool(self) -> Tool {
        let transition = || {
            json!({"type": "object", "required": ["transition"], "properties": {
                "model": model_field(), "transition": {"type": "string"}}, "additionalProperties": false})
        };
        let (description, input) = match self {
            Platform::SearchCatalog => (
                "Search the tool catalog (local entries of your model first, then global ones)",
                json!({"type": "object", "properties": {
                    "q": {"type": "string", "description": "Free text, matched against id, name, description and capabilities"},
                    "kind": {"enum": ["script", "http", "docker", "toolnet", "host", "mcp"]},
                    "capability": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
                    "offset": {"type": "integer", "minimum": 0, "default": 0}
                }, "additionalProperties": false}),
            ),
            Platform::GetEntry => (
                "Read one catalog entry: its contract (operations and their input schemas) and binding",
                json!({"type": "object", "required": ["id"], "properties": {
                    "id": {"type": "string", "description": "The toolkit id"}, "model": model_field()
                }, "additionalProperties": false}),
            ),
            Platform::RegisterScript => (
                "Register a script tool (the body of TOOL_CATALOG_REGISTER_SCRIPT: id, name, runtime, content, and optionally description, input, model)",
                json!({"type": "object", "required": ["id", "name", "runtime"],
                    "oneOf": [{"required": ["content"]}, {"required": ["contentBase64"]}], "properties": {
                    "id": {"type": "string"}, "name": {"type": "string"},
                    "runtime": {"enum": ["sh", "bash", "python3", "node"]},
                    "content": {"type": "string", "description": "The script"},
                    "contentBase64": {"type": "string", "description": "The script's bytes in base64, when they are not text"},
                    "description": {"type": "string"},
                    "input": {"type": "object", "description": "The input's JSON Schema"},
                    "model": model_field()
                }}),
            ),
            Platform::ApplyNet => (
                "Apply a net document to a model",
                json!({"type": "object", "required": ["net"], "properties": {
                    "model": model_field(), "net": {"type": "object", "description": "The net document"}
                }, "additionalProperties": false}),
            ),
            Platform::PutToken => (
                "Put a token into a place of a model's net",
                json!({"type": "object", "required": ["place", "data"], "properties": {
                    "model": model_field(), "place": {"type": "string"}, "data": {"description": "The token's data"},
                    "name": {"type": "string"}
                }, "additionalProperties": false}),
            ),
            Platform::ListTokens => (
                "List the tokens of a place",
                json!({"type": "object", "required": ["place"], "properties": {
                    "model": model_field(), "place": {"type": "string"}
                }, "additionalProperties": false}),
            ),
            Platform::StartTransition => ("Start a transition", transition()),
            Platform::StopTransition => ("Stop a transition", transition()),
            Platform::FireTransition => ("Fire a transition once", transition()),
            Platform::SearchTools => (
                "Find tools among all you can call (there are too many to list): by words of their name or description",
                json!({"type": "object", "properties": {
                    "q": {"type": "string", "description": "Words, all of which must match"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}
                }, "additionalProperties": false}),
            ),
            Platform::DescribeTool => (
                "A tool's description and input schema, before calling it with agentos_call_tool",
                json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}},
                       "additionalProperties": false}),
            ),
            Platform::CallTool => (
                "Call a tool found with agentos_search_tools",
                json!({"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string"}, "arguments": {"type": "object", "default": {}}
                }, "additionalProperties": false}),
            ),
        };
        Tool::new(self.name(), description, schema(input))
    }
}

/// The tools `p` may call, by name, with what each calls: every operation, and the platform
/// tools its flags allow (not the search mode's).
fn tools_of(engine: &Engine, p: &Principal) -> BTreeMap<String, (Tool, Target)> {
    let mut out = BTreeMap::new();
    for t in PLATFORM.into_iter().filter(|t| t.allowed(p.flags)) {
        out.insert(t.name(), (t.tool(), Target::Platform(t)));
    }
    for view in engine.catalog().visible(p) {
        let entry = &view.stored.entry;
        if !entry.binding.kind().callable_by(p.flags) {
            continue;
        }
        for (operation, op) in &entry.contract().operations {
            let name = tool_name(&entry.id, operation);
            let mut schema = match &op.input {
                Value::Object(o) => o.clone(),
                _ => JsonObject::new(),
            };
            schema.entry("type").or_insert_with(|| json!("object"));
            let description =
                if op.description.is_empty() { entry.description.to_string() } else { op.description.clone() };
            let target = Target::Operation { toolkit: entry.id.to_string(), operation: operation.clone() };
            out.insert(name.clone(), (Tool::new(name, description, Arc::new(schema)), target));
        }
    }
    out
}

fn schema(v: Value) -> Arc<JsonObject> {
    Arc::new(match v {
        Value::Object(o) => o,
        _ => JsonObject::new(),
    })
}

/// A sorted digest of the names `p` sees: a session is told of a change when it moves.
fn names_digest(engine: &Engine, p: &Principal) -> Vec<u8> {
    let mut h = Sha256::new();
    for (name, (tool, _)) in tools_of(engine, p) {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(serde_json::to_vec(&tool.input_schema).unwrap_or_default());
        h.update(tool.description.as_deref().unwrap_or_default().as_bytes());
        h.update([0]);
    }
    h.finalize().to_vec()
}

/// A session that began with `initialize`, to be told when its tools change.
struct Session {
    peer: Peer<RoleServer>,
    principal: Principal,
    digest: Vec<u8>,
    /// A `list_changed` is on its way to it ([`tell_list_changed`]).
    telling: Arc<AtomicBool>,
}

/// How long a `list_changed` may wait for its session to take it: a client that does not read
/// its stream fills the session's channel, and the notification is dropped after this.
const TELL_TIMEOUT: Duration = Duration::from_secs(10);

/// Tells `peer` its tools changed, on a task of its own, unless a notification is already on
/// its way there (one tells the client to list again; a second adds nothing). Never waits: a
/// client that reads nothing holds up no other session, and no revocation.
fn tell_list_changed(peer: &Peer<RoleServer>, telling: &Arc<AtomicBool>) {
    if telling.swap(true, Ordering::AcqRel) {
        return;
    }
    let (peer, telling) = (peer.clone(), telling.clone());
    tokio::spawn(async move {
        match tokio::time::timeout(TELL_TIMEOUT, peer.notify_tool_list_changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "an MCP session could not be told its tools changed"),
            Err(_) => tracing::debug!("an MCP session took no list_changed for 10 s: its client reads nothing"),
        }
        telling.store(false, Ordering::Release);
    });
}

/// What every session handler shares.
struct Shared {
    engine: Engine,
    /// Past this many operations, `tools/list` offers the search mode instead.
    list_limit: usize,
    sessions: Mutex<Vec<Session>>,
    /// Rung when the catalog may have changed for someone.
    changed: broadcast::Sender<()>,
    /// Who opened each session, to close a revoked principal's.
    owners: Arc<SessionOwners>,
}

/// The handler of one MCP session (or one request, for stateless protocol versions).
#[derive(Clone)]
pub struct McpServer {
    shared: Arc<Shared>,
}

fn principal_of(extensions: &rmcp::model::Extensions) -> Result<Principal, McpError> {
    extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>())
        .cloned()
        .ok_or_else(|| McpError::invalid_request("no principal: the request carried no valid bearer token", None))
}

/// The output of a call as MCP gives it: structured content is an object.
fn answer(output: Value) -> CallToolResult {
    let text = match &output {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let structured = match output {
        Value::Object(_) => output,
        other => json!({"result": other}),
    };
    let mut r = CallToolResult::structured(structured);
    r.content = vec![ContentBlock::text(text)];
    r
}

fn failed(message: String) -> CallToolResult {
    // One line, as a shell command prints it: a tool's stderr keeps no colour codes or
    // characters that do not show as themselves.
    let line = agentos_core::name::terminal_line(message.lines().next().unwrap_or_default());
    CallToolResult::error(vec![ContentBlock::text(line)])
}

/// A platform tool's input schema, compiled once: its validator, its required arguments and
/// every argument it takes.
struct ArgumentCheck {
    validator: agentos_core::flagmap::Validator,
    required: Vec<String>,
    known: String,
}

/// The platform tools of both modes.
fn every_platform_tool() -> impl Iterator<Item = Platform> {
    PLATFORM.into_iter().chain(SEARCH_MODE)
}

/// The compiled check of `tool`; `None` when its schema does not compile (a defect the unit
/// tests catch: every platform schema is a literal above).
fn argument_check(tool: Platform) -> Option<&'static ArgumentCheck> {
    static CHECKS: std::sync::OnceLock<Vec<Option<ArgumentCheck>>> = std::sync::OnceLock::new();
    let checks = CHECKS.get_or_init(|| {
        every_platform_tool()
            .map(|t| {
                let schema = Value::Object((*t.tool().input_schema).clone());
                let validator = agentos_core::flagmap::compile(&schema)?;
                let names = |key: &str| -> Vec<String> {
                    match &schema[key] {
                        Value::Array(a) => a.iter().filter_map(Value::as_str).map(str::to_string).collect(),
                        Value::Object(o) => o.keys().cloned().collect(),
                        _ => Vec::new(),
                    }
                };
                Some(ArgumentCheck { validator, required: names("required"), known: names("properties").join(", ") })
            })
            .collect()
    });
    let at = every_platform_tool().position(|t| t == tool)?;
    checks[at].as_ref()
}

/// A platform tool's arguments against its input schema: an unknown argument, a value of the
/// wrong type or out of range is refused with the reason, never dropped or clamped in silence.
/// An argument given as `null` and not required is taken as absent, as the handlers read it
/// (clients that fill every field send `null` for the ones they leave out).
fn check_arguments(tool: Platform, args: &JsonObject) -> Result<(), String> {
    let Some(check) = argument_check(tool) else {
        return Err(format!("{}: its input schema does not compile", tool.name()));
    };
    let input: JsonObject = args
        .iter()
        .filter(|(k, v)| !v.is_null() || check.required.iter().any(|r| r == *k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let input = Value::Object(input);
    let Some(error) = check.validator.iter_errors(&input).next() else { return Ok(()) };
    let at = error.instance_path().to_string();
    let at = if at.is_empty() { String::new() } else { format!(" (at {at})") };
    let message = format!("{}: {error}{at}; its arguments: {}", tool.name(), check.known);
    Err(message.replace('\n', "\\n").replace('\r', "\\r"))
}

/// A platform tool's field, or the one line that says it is missing or of the wrong type.
fn field<T: serde::de::DeserializeOwned>(tool: Platform, args: &JsonObject, key: &str) -> Result<T, String> {
    let v = args.get(key).cloned().unwrap_or(Value::Null);
    serde_json::from_value(v).map_err(|e| format!("{}: \"{key}\": {e}", tool.name()))
}

fn optional<T: serde::de::DeserializeOwned>(tool: Platform, args: &JsonObject, key: &str) -> Result<Option<T>, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => field(tool, args, key).map(Some),
    }
}

fn json_of<T: serde::Serialize>(v: T) -> Result<Value, agentos_engine::EngineError> {
    serde_json::to_value(v).map_err(|e| agentos_core::CoreError::internal(e.to_string()).into())
}

/// The tools whose name or description holds every word of `q` (any case), by name.
fn matching<'a>(tools: &'a BTreeMap<String, (Tool, Target)>, q: &str) -> impl Iterator<Item = &'a Tool> {
    let words: Vec<String> = q.split_whitespace().map(str::to_lowercase).collect();
    tools.values().map(|(t, _)| t).filter(move |t| {
        let text = format!("{} {}", t.name, t.description.as_deref().unwrap_or_default()).to_lowercase();
        words.iter().all(|w| text.contains(w.as_str()))
    })
}

impl McpServer {
    /// What `p` is offered: every tool it may call, or, past the list limit, the platform tools
    /// and the search mode's three instead of the operations (which stay callable by name).
    fn offered(&self, p: &Principal) -> BTreeMap<String, (Tool, Target)> {
        let mut tools = tools_of(&self.shared.engine, p);
        let operations = tools.values().filter(|(_, t)| matches!(t, Target::Operation { .. })).count();
        if operations > self.shared.list_limit {
            for t in SEARCH_MODE {
                tools.insert(t.name(), (t.tool(), Target::Platform(t)));
            }
        }
        tools
    }

    /// The tools `tools/list` shows `p`. In search mode the operations are counted, not built.
    fn listed(&self, p: &Principal) -> Vec<Tool> {
        let operations: usize = (self.shared.engine.catalog().visible(p).iter())
            .filter(|v| v.stored.entry.binding.kind().callable_by(p.flags))
            .map(|v| v.stored.entry.operation_count())
            .sum();
        if operations <= self.shared.list_limit {
            return tools_of(&self.shared.engine, p).into_values().map(|(t, _)| t).collect();
        }
        let mut tools: Vec<Tool> =
            PLATFORM.into_iter().chain(SEARCH_MODE).filter(|t| t.allowed(p.flags)).map(Platform::tool).collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }

    /// The tool `name` names for `p`, if `p` may call it. An operation's name is split at its
    /// first `_` and its entry resolved alone (a call does not build the whole list); a shortened
    /// name, or a search-mode tool, is looked up in what `p` is offered.
    fn resolve(&self, p: &Principal, name: &str) -> Option<Target> {
        if name.starts_with(PLATFORM_PREFIX) {
            if let Some(t) = PLATFORM.into_iter().find(|t| t.name() == name) {
                return t.allowed(p.flags).then_some(Target::Platform(t));
            }
            // The search mode's tools, when it is on.
            return self.offered(p).remove(name).map(|(_, t)| t);
        }
        if let Some((toolkit, operation)) = name.split_once('_')
            && tool_name(toolkit, operation) == name
        {
            let view = self.shared.engine.catalog().get(p, toolkit, None).ok()?;
            let entry = &view.stored.entry;
            let callable = entry.binding.kind().callable_by(p.flags) && entry.has_operation(operation);
            return callable
                .then(|| Target::Operation { toolkit: toolkit.to_string(), operation: operation.to_string() });
        }
        self.offered(p).remove(name).map(|(_, t)| t)
    }

    /// Calls `target` for `p`.
    async fn call(&self, p: &Principal, target: Target, args: JsonObject) -> CallToolResult {
        if let Target::Platform(tool) = target
            && let Err(usage) = check_arguments(tool, &args)
        {
            return failed(usage);
        }
        let outcome = match target {
            Target::Operation { toolkit, operation } => {
                // The caller's invocation slots bound its calls here as on the API (429 there).
                let _slot = match self.shared.engine.principals().invocation_slot(p) {
                    Ok(slot) => slot,
                    Err(e) => return failed(e.to_string()),
                };
                self.shared.engine.dispatch().call_with_input(p, &toolkit, &operation, Value::Object(args)).await
            }
            Target::Platform(Platform::CallTool) => {
                let (name, arguments) = match (
                    field::<String>(Platform::CallTool, &args, "name"),
                    optional::<JsonObject>(Platform::CallTool, &args, "arguments"),
                ) {
                    (Ok(n), Ok(a)) => (n, a.unwrap_or_default()),
                    (Err(e), _) | (_, Err(e)) => return failed(e),
                };
                return match self.resolve(p, &name) {
                    Some(Target::Platform(Platform::CallTool)) | None => {
                        failed(format!("no tool {name:?} (agentos_search_tools finds the tools you can call)"))
                    }
                    Some(target) => Box::pin(self.call(p, target, arguments)).await,
                };
            }
            Target::Platform(tool) => match self.platform(p, tool, &args).await {
                Ok(outcome) => outcome,
                Err(usage) => return failed(usage),
            },
        };
        match outcome {
            Ok(v) => answer(v),
            Err(agentos_engine::EngineError::Core(e)) if e.response.is_some() => {
                let mut r = failed(e.message);
                // What the service answered (a validation error's details), as a second block of
                // text: structured content is kept for results, which an output schema describes.
                r.content.extend(e.response.map(|v| ContentBlock::text(v.to_string())));
                r
            }
            Err(e) => failed(e.to_string()),
        }
    }

    /// A platform tool: a usage error as `Err`, the engine's answer as `Ok`.
    async fn platform(
        &self,
        p: &Principal,
        tool: Platform,
        args: &JsonObject,
    ) -> Result<Result<Value, agentos_engine::EngineError>, String> {
        let engine = &self.shared.engine;
        let model = optional::<String>(tool, args, "model")?.unwrap_or_else(|| p.home_model.clone());
        Ok(match tool {
            Platform::SearchCatalog => {
                let query = SearchQuery {
                    model: Some(model),
                    kind: optional::<String>(tool, args, "kind")?
                        .and_then(|k| agentos_core::entry::BindingKind::parse(&k)),
                    capability: optional(tool, args, "capability")?,
                    q: optional(tool, args, "q")?,
                    limit: optional::<usize>(tool, args, "limit")?.unwrap_or(20),
                    offset: optional::<usize>(tool, args, "offset")?.unwrap_or(0),
                };
                engine.catalog().search(p, &query).map(|page| {
                    json!({
                        "total": page.total,
                        "items": page.items.iter().map(|e| {
                            let entry = &e.stored.entry;
                            json!({
                                "id": entry.id, "name": entry.name, "kind": entry.binding.kind().as_str(),
                                "description": entry.description, "scope": e.scope, "shadowed": e.shadowed,
                                "tools": entry.operation_names().iter()
                                    .map(|op| tool_name(&entry.id, op)).collect::<Vec<_>>(),
                            })
                        }).collect::<Vec<_>>(),
                    })
                })
            }
            Platform::GetEntry => {
                let id: String = field(tool, args, "id")?;
                engine.catalog().get(p, &id, Some(&model)).and_then(json_of)
            }
            Platform::RegisterScript => {
                let mut body = args.clone();
                body.insert("model".into(), json!(model));
                engine
                    .catalog()
                    .register(p, "TOOL_CATALOG_REGISTER_SCRIPT", Value::Object(body))
                    .await
                    .and_then(json_of)
            }
            Platform::ApplyNet => {
                let net: Value = field(tool, args, "net")?;
                match agentos_core::net::NetDoc::from_value(net) {
                    Err(e) => Err(e.into()),
                    Ok(doc) => {
                        engine.nets().apply_net(p, &model, doc).await.map(crate::wire::NetView::from).and_then(json_of)
                    }
                }
            }
            Platform::PutToken => {
                let place: String = field(tool, args, "place")?;
                let data: Value = field(tool, args, "data")?;
                let name = optional(tool, args, "name")?;
                engine
                    .nets()
                    .put_token(p, &model, &place, data, name)
                    .await
                    .map(crate::wire::Token::from)
                    .and_then(json_of)
            }
            Platform::ListTokens => {
                let place: String = field(tool, args, "place")?;
                engine
                    .nets()
                    .tokens(p, &model, &place)
                    .and_then(|ts| json_of(ts.into_iter().map(crate::wire::Token::from).collect::<Vec<_>>()))
            }
            Platform::StartTransition | Platform::StopTransition => {
                let transition: String = field(tool, args, "transition")?;
                let start = tool == Platform::StartTransition;
                engine
                    .nets()
                    .set_started(p, &model, &transition, start)
                    .await
                    .map(|()| json!({"transition": transition, "started": start}))
            }
            Platform::FireTransition => {
                let transition: String = field(tool, args, "transition")?;
                engine
                    .nets()
                    .fire_once(p, &model, &transition)
                    .await
                    .map(crate::wire::FireOutcome::from)
                    .and_then(json_of)
            }
            Platform::SearchTools => {
                let q = optional::<String>(tool, args, "q")?.unwrap_or_default();
                let limit = optional::<usize>(tool, args, "limit")?.unwrap_or(20);
                let tools = self.offered(p);
                let found: Vec<Value> = matching(&tools, &q)
                    .take(limit)
                    .map(|t| json!({"name": t.name, "description": t.description}))
                    .collect();
                Ok(json!({"tools": found, "total": matching(&tools, &q).count()}))
            }
            Platform::DescribeTool => {
                let name: String = field(tool, args, "name")?;
                match self.offered(p).get(&name) {
                    None => {
                        return Err(format!("no tool {name:?} (agentos_search_tools finds the tools you can call)"));
                    }
                    Some((t, _)) => {
                        Ok(json!({"name": t.name, "description": t.description, "inputSchema": t.input_schema}))
                    }
                }
            }
            Platform::CallTool => unreachable!("handled by call"),
        })
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build())
            .with_server_info(Implementation::new("agentos", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "The agentos tool catalog: each tool is one operation of a toolkit, named toolkit_operation. agentos_search_catalog finds tools; agentos_get_entry shows a toolkit.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let p = principal_of(&context.extensions)?;
        Ok(ListToolsResult::with_all_items(self.listed(&p)))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let p = principal_of(&context.extensions)?;
        let name = request.name.to_string();
        // Any tool the caller may call, listed or found through search mode.
        let Some(target) = self.resolve(&p, &name) else {
            // Not seen: the same answer whether it does not exist or is hidden.
            return Ok(failed(format!("no tool {name:?} (tools/list shows the tools you can call)")).into());
        };
        // rmcp only cancels the request's token on `notifications/cancelled`: the call itself
        // runs on unless it is dropped here. Dropped, it goes as a caller that went away does:
        // its job leaves the queue or is stopped where it runs, and its invocation slot is free.
        tokio::select! {
            answer = self.call(&p, target, request.arguments.unwrap_or_default()) => Ok(answer.into()),
            () = context.ct.cancelled() => Err(McpError::new(
                ErrorCode::INTERNAL_ERROR,
                format!("the call of {name} was cancelled by the client; its job is stopped"),
                None,
            )),
        }
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let Ok(principal) = principal_of(&context.extensions) else { return };
        let digest = names_digest(&self.shared.engine, &principal);
        let mut sessions = self.shared.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|s| !s.peer.is_transport_closed());
        sessions.push(Session { peer: context.peer.clone(), principal, digest, telling: Arc::default() });
    }

    /// rmcp passes on a request whose method it does not know, and also one whose method it knows
    /// but whose params do not parse (a `tools/call` without them). Its own answer to both is
    /// -32601 (Method not found), which sends a client looking for a method that is there: the
    /// second is told -32602 (Invalid params) instead, with the params the method takes.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        let CustomRequest { method, params, .. } = request;
        // Served only where a request carries its own protocol version (2026-07-28 on); rmcp
        // answers it -32601 in a session opened by `initialize`, whatever its params.
        let listens = context.protocol_version().is_some_and(|v| !v.has_initialize());
        match RequiredParams::of(&method) {
            Some(needs) if method != "subscriptions/listen" || listens => {
                Err(McpError::invalid_params(needs.refusal(params), None))
            }
            // rmcp's own answer.
            _ => Err(McpError::new(ErrorCode::METHOD_NOT_FOUND, method, None)),
        }
    }

    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(requested.supported_by(&self.get_info().capabilities))
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let p = principal_of(&context.request_context().extensions)?;
        let mut digest = names_digest(&self.shared.engine, &p);
        let mut changed = self.shared.changed.subscribe();
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                r = changed.recv() => {
                    if let Err(broadcast::error::RecvError::Closed) = r {
                        return Ok(());
                    }
                    let now = names_digest(&self.shared.engine, &p);
                    if now != digest {
                        digest = now;
                        context.sink().notify_tool_list_changed().await
                            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
                    }
                }
            }
        }
    }
}

/// The params a method this server serves cannot go without.
struct RequiredParams {
    method: &'static str,
    /// What they look like, for a client that sent none or others.
    shape: &'static str,
    /// Parses them, to say in serde's words why they do not fit.
    parse: fn(Value) -> Result<(), serde_json::Error>,
}

/// The methods this server serves whose params are required. rmcp reads a request for one of
/// them whose params do not parse as a request for a method it does not know.
const REQUIRED_PARAMS: [RequiredParams; 3] = [
    RequiredParams {
        method: "tools/call",
        shape: r#"{"name": <a tool from tools/list>, "arguments": {...}}"#,
        parse: parses::<CallToolRequestParams>,
    },
    INITIALIZE_PARAMS,
    RequiredParams {
        method: "subscriptions/listen",
        shape: r#"{"notifications": {...}}"#,
        parse: parses::<SubscriptionsListenRequestParams>,
    },
];

const INITIALIZE_PARAMS: RequiredParams = RequiredParams {
    method: "initialize",
    shape: r#"{"protocolVersion": ..., "capabilities": {...}, "clientInfo": {"name": ..., "version": ...}}"#,
    parse: parses::<InitializeRequestParams>,
};

fn parses<T: serde::de::DeserializeOwned>(params: Value) -> Result<(), serde_json::Error> {
    serde_json::from_value::<T>(params).map(drop)
}

impl RequiredParams {
    fn of(method: &str) -> Option<&'static RequiredParams> {
        REQUIRED_PARAMS.iter().find(|p| p.method == method)
    }

    /// The message that refuses `params` (none, or the ones given).
    fn refusal(&self, params: Option<Value>) -> String {
        let why = match params.map(self.parse) {
            None => "none were given".to_owned(),
            Some(Err(e)) => e.to_string(),
            Some(Ok(())) => "they were not understood".to_owned(),
        };
        format!("{} needs params {}: {why}", self.method, self.shape)
    }
}

/// Tells the sessions whose tools changed, on every event that can change what someone sees,
/// and ends the sessions of a principal revoked.
async fn watch(shared: std::sync::Weak<Shared>, mut events: broadcast::Receiver<Arc<agentos_core::event::Event>>) {
    loop {
        let (relevant, revoked) = match events.recv().await {
            Ok(ev) => match &ev.body {
                EventBody::PrincipalRevoked { name } => (true, Revoked::Named(name.clone())),
                body => (
                    matches!(
                        body,
                        EventBody::ToolRegistered { .. }
                            | EventBody::ToolRemoved { .. }
                            | EventBody::ModelGranted(_)
                            | EventBody::ModelGrantRevoked(_)
                    ),
                    Revoked::None,
                ),
            },
            // Missed some: any of them may have been one.
            Err(broadcast::error::RecvError::Lagged(_)) => (true, Revoked::Unknown),
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if !relevant {
            continue;
        }
        let Some(shared) = shared.upgrade() else { return };
        match revoked {
            Revoked::None => {}
            Revoked::Named(name) => shared.owners.close_where(|owner| owner.name == name).await,
            Revoked::Unknown => {
                // The names that still hold a token; the operator's is always among them.
                let names: Option<std::collections::HashSet<String>> = shared.engine.operator().and_then(|op| {
                    let listed = shared.engine.principals().list_principals(&op).ok()?;
                    Some(listed.into_iter().map(|p| p.name).collect())
                });
                if let Some(names) = names {
                    shared.owners.close_where(|owner| !names.contains(&owner.name)).await;
                }
            }
        }
        let _ = shared.changed.send(());
        let mut notify = Vec::new();
        {
            let mut sessions = shared.sessions.lock().unwrap_or_else(|e| e.into_inner());
            sessions.retain(|s| !s.peer.is_transport_closed());
            for s in sessions.iter_mut() {
                let now = names_digest(&shared.engine, &s.principal);
                if now != s.digest {
                    s.digest = now;
                    notify.push((s.peer.clone(), s.telling.clone()));
                }
            }
        }
        for (peer, telling) in &notify {
            tell_list_changed(peer, telling);
        }
    }
}

/// Which principal's sessions an event ends.
enum Revoked {
    None,
    Named(String),
    /// Events were missed: any principal may have been revoked.
    Unknown,
}

/// An MCP request declared larger than the master's limit, up to this size, is read to its end
/// (and dropped) before it is refused; a larger one is refused at once.
const DRAIN_REFUSED_BYTES: usize = 64 << 20;

/// What `/mcp` offers, and how long its sessions live.
#[derive(Debug, Clone, Copy)]
pub struct McpEndpoint {
    /// Past this many tools a caller may call, `tools/list` offers search instead.
    pub list_limit: usize,
    /// A session with no request in, and no answer or event stream out, for this long ends.
    pub session_idle: Duration,
}

impl Default for McpEndpoint {
    fn default() -> Self {
        McpEndpoint { list_limit: 64, session_idle: Duration::from_secs(300) }
    }
}

/// The `/mcp` service over an engine: rmcp's Streamable HTTP server, behind `keep_to_owner` and
/// then `explain_unread_message`. It runs inside [`authenticate`], which the router puts around it.
pub fn service(engine: Engine, endpoint: McpEndpoint) -> MethodRouter {
    let mut rmcp_sessions = LocalSessionManager::default();
    // rmcp ends a session a fixed time after the last message through it, while a client that
    // only listens on its `GET` stream sends none: the idle time is `SessionOwners`' to keep,
    // which counts a stream still open as use.
    rmcp_sessions.session_config.keep_alive = None;
    let rmcp_sessions = Arc::new(rmcp_sessions);
    let owners = Arc::new(SessionOwners {
        rmcp: rmcp_sessions.clone(),
        owners: Mutex::new(HashMap::new()),
        idle: endpoint.session_idle,
    });
    let shared = Arc::new(Shared {
        sessions: Mutex::new(Vec::new()),
        changed: broadcast::channel(16).0,
        engine,
        list_limit: endpoint.list_limit,
        owners: owners.clone(),
    });
    tokio::spawn(watch(Arc::downgrade(&shared), shared.engine.nets().subscribe()));
    tokio::spawn(end_idle_sessions(Arc::downgrade(&owners)));
    let config = StreamableHttpServerConfig::default()
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        // The master answers on whatever name it is reached by; the bearer token is the gate.
        .with_allowed_hosts(Vec::<String>::new())
        // `authenticate` has bounded the body by the master's --max-body-bytes already.
        .with_max_request_body_bytes(usize::MAX);
    let rmcp = StreamableHttpService::new(move || Ok(McpServer { shared: shared.clone() }), rmcp_sessions, config);
    axum::routing::any_service(rmcp)
        .layer(axum::middleware::from_fn(explain_unread_message))
        .layer(axum::middleware::from_fn_with_state(owners, keep_to_owner))
}

/// The header that names a session, in requests and in the answer to `initialize`.
const SESSION_HEADER: &str = "mcp-session-id";

/// How many sessions one principal may hold open: more than the clients one agent runs, and few
/// enough that one token cannot take the whole of `MAX_SESSIONS` from the others.
const SESSIONS_PER_PRINCIPAL: usize = 100;

/// How many sessions the master holds open at once. rmcp sets no bound of its own, and each
/// session is a task with its own channels until it is closed or goes idle. Counted over rmcp's
/// own sessions, so that one rmcp holds without an owner recorded counts too.
const MAX_SESSIONS: usize = 10_000;

/// Which principal opened each MCP session. rmcp knows a session by its id alone, and serves
/// whoever presents the id; this record lets only the principal whose `initialize` opened it
/// use it or close it.
///
/// It also ends the sessions gone idle ([`end_idle_sessions`]), which rmcp is told not to do.
///
/// It follows rmcp's own sessions: an id is dropped when its session is closed, when rmcp
/// answers 404 for it (its worker ended), and, for any session rmcp no longer holds, each time
/// a session opens. So it never holds more than rmcp does, plus the sessions that ended since
/// the last one opened.
struct SessionOwners {
    rmcp: Arc<LocalSessionManager>,
    /// Session id → the principal that opened it.
    owners: Mutex<HashMap<String, Owner>>,
    /// A session unused this long ends.
    idle: Duration,
}

/// The principal that opened a session, and how the session is used.
struct Owner {
    /// Its stable id, which a session is kept to.
    id: String,
    /// Its name, which the log names it by when it is revoked.
    name: String,
    /// Answers of the session still being written: event streams, `GET` ones included.
    streams: usize,
    /// When a request of the session last came in or one of its answers last ended.
    used: Instant,
    /// The ids of the session's requests still being answered, as JSON text (`5`, `"a"`).
    answering: HashSet<String>,
}

impl Owner {
    fn idle_for(&self, idle: Duration) -> bool {
        self.streams == 0 && self.used.elapsed() >= idle
    }
}

impl SessionOwners {
    /// The record, locked. A std Mutex is fine: nothing awaits while it is held.
    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, Owner>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn owned_by(&self, session: &str, principal: &Principal) -> bool {
        self.owners().get(session).is_some_and(|o| o.id == principal.id)
    }

    async fn held_by_rmcp(&self, session: &str) -> bool {
        self.rmcp.sessions.read().await.contains_key(session)
    }

    fn forget(&self, session: &str) {
        self.owners().remove(session);
    }

    /// Drops `session` when rmcp no longer holds it.
    async fn forget_if_closed(&self, session: &str) {
        if !self.held_by_rmcp(session).await {
            self.forget(session);
        }
    }

    /// Records the session rmcp has just opened for `principal`; past a bound, closes it again
    /// and answers why.
    async fn open(&self, session: &str, principal: &Principal) -> Result<(), ApiError> {
        let refused = {
            let held = self.rmcp.sessions.read().await;
            let mut owners = self.owners();
            owners.retain(|id, _| held.contains_key(id.as_str()));
            if owners.values().filter(|owner| owner.id == principal.id).count() >= SESSIONS_PER_PRINCIPAL {
                Some(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_sessions",
                    format!(
                        "{} has {SESSIONS_PER_PRINCIPAL} MCP sessions open, the limit; close one (DELETE /mcp with its Mcp-Session-Id) or let it go idle for {}",
                        principal.name,
                        shown_duration(self.idle)
                    ),
                ))
            } else if held.len() > MAX_SESSIONS {
                // `held` counts this session too.
                Some(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too_many_sessions",
                    format!("the master holds {MAX_SESSIONS} MCP sessions, its limit; try again when some have closed"),
                ))
            } else {
                owners.insert(
                    session.to_owned(),
                    Owner {
                        id: principal.id.clone(),
                        name: principal.name.clone(),
                        streams: 0,
                        used: Instant::now(),
                        answering: HashSet::new(),
                    },
                );
                None
            }
        };
        let Some(refusal) = refused else { return Ok(()) };
        self.close_in_rmcp([session.to_owned()], "past the limit").await;
        Err(refusal)
    }

    /// Closes the sessions whose owner `ends` picks, in rmcp too: their event streams end, and
    /// their ids answer as unknown ones do.
    async fn close_where(&self, ends: impl Fn(&Owner) -> bool) {
        let ended = take_where(&mut self.owners(), ends);
        self.close_in_rmcp(ended, "of a revoked principal").await;
    }

    /// Ends `sessions` in rmcp (their records already gone); `which` says which in the log.
    async fn close_in_rmcp(&self, sessions: impl IntoIterator<Item = String>, which: &str) {
        for session in sessions {
            if let Err(e) = self.rmcp.close_session(&session.as_str().into()).await {
                tracing::warn!(error = %e, "an MCP session {which} could not be closed");
            }
        }
    }

    /// A request of `session` came in; its answer is written until the returned guard drops.
    fn in_use(self: &Arc<Self>, session: &str) -> InUse {
        if let Some(owner) = self.owners().get_mut(session) {
            owner.streams += 1;
            owner.used = Instant::now();
        }
        InUse { owners: Arc::downgrade(self), session: session.to_owned(), request: None }
    }

    /// Marks request `id` of `session` as being answered until `in_use` drops; `false`, and
    /// nothing marked, when a request with the same id is being answered already.
    fn answering(&self, in_use: &mut InUse, id: String) -> bool {
        let mut owners = self.owners();
        let Some(owner) = owners.get_mut(&in_use.session) else { return true };
        if !owner.answering.insert(id.clone()) {
            return false;
        }
        in_use.request = Some(id);
        true
    }

    /// Ends the sessions unused for the idle time, and those rmcp holds with no owner recorded
    /// that were already ownerless at the last look (`ownerless`, updated): an `initialize`
    /// whose session is being recorded is ownerless for a moment only.
    async fn end_idle(&self, ownerless: &mut HashSet<String>) {
        let held: Vec<String> = self.rmcp.sessions.read().await.keys().map(|id| id.to_string()).collect();
        let ended: Vec<String> = {
            let mut owners = self.owners();
            let idle = take_where(&mut owners, |owner| owner.idle_for(self.idle));
            let now_ownerless: HashSet<String> = held.into_iter().filter(|id| !owners.contains_key(id)).collect();
            let stray = now_ownerless.intersection(ownerless).cloned().collect::<Vec<_>>();
            *ownerless = now_ownerless;
            idle.into_iter().chain(stray).collect()
        };
        for session in &ended {
            ownerless.remove(session);
        }
        self.close_in_rmcp(ended, "gone idle").await;
    }
}

/// Takes the records whose owner `picks` out of `owners`; answers their session ids.
fn take_where(owners: &mut HashMap<String, Owner>, picks: impl Fn(&Owner) -> bool) -> Vec<String> {
    let taken: Vec<String> = owners.iter().filter(|(_, owner)| picks(owner)).map(|(id, _)| id.clone()).collect();
    for id in &taken {
        owners.remove(id);
    }
    taken
}

/// Holds a session in use while one of its answers is written ([`SessionOwners::in_use`]).
struct InUse {
    owners: Weak<SessionOwners>,
    session: String,
    /// The id of the request being answered, if the answer is to one.
    request: Option<String>,
}

impl Drop for InUse {
    fn drop(&mut self) {
        let Some(owners) = self.owners.upgrade() else { return };
        if let Some(owner) = owners.owners().get_mut(&self.session) {
            owner.streams = owner.streams.saturating_sub(1);
            owner.used = Instant::now();
            if let Some(request) = &self.request {
                owner.answering.remove(request);
            }
        }
    }
}

/// Looks for idle sessions a few times per idle time (at most every 30 seconds, at least every
/// second), for as long as the endpoint lives.
async fn end_idle_sessions(owners: Weak<SessionOwners>) {
    let Some(every) = owners.upgrade().map(|o| (o.idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(30)))
    else {
        return;
    };
    let mut ownerless = HashSet::new();
    loop {
        tokio::time::sleep(every).await;
        let Some(owners) = owners.upgrade() else { return };
        owners.end_idle(&mut ownerless).await;
    }
}

/// A duration as the refusals write it: "5 minutes", "90 s", "1500 ms".
fn shown_duration(d: Duration) -> String {
    match (d.as_millis(), d.as_secs()) {
        (ms, _) if ms % 1000 != 0 => format!("{ms} ms"),
        (_, 60) => "1 minute".to_owned(),
        (_, s) if s % 60 == 0 => format!("{} minutes", s / 60),
        (_, s) => format!("{s} s"),
    }
}

/// What rmcp 3.11 answers a `POST` or `GET` naming a session it does not hold, word for word
/// (`handle_post`, `handle_get`): a session of another principal answers the same, so that its
/// existence shows to no one else. A test holds it to rmcp's.
fn unknown_session() -> Response {
    let mut answer = Response::new(axum::body::Body::from("Not Found: Session not found"));
    *answer.status_mut() = StatusCode::NOT_FOUND;
    answer
}

/// rmcp answers 202 to a `DELETE` of any id, held or not; this says that there was nothing to
/// end, the same for an unknown id and for another principal's session.
fn no_session_to_end(idle: Duration) -> Response {
    ApiError::not_found(format!(
        "no MCP session of yours has this Mcp-Session-Id: it was ended, it went idle for {}, or it never existed",
        shown_duration(idle)
    ))
    .into_response()
}

/// Keeps each session to the principal that opened it: records the session an `initialize`
/// answer names, and answers a request naming a session the caller did not open, or one not
/// recorded at all, as rmcp answers an unknown session, without passing it to rmcp. Refused
/// before rmcp looks at anything else, so that no other header tells the two cases apart.
async fn keep_to_owner(State(owners): State<Arc<SessionOwners>>, req: Request, next: Next) -> Response {
    let Some(principal) = req.extensions().get::<Principal>().cloned() else {
        // `authenticate` puts it there on every request that gets this far: closed, if not.
        tracing::error!("an MCP request reached the session check without a principal");
        return ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; the master's log has the details",
        )
        .into_response();
    };
    let session = req.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let Some(session) = session else {
        // No session yet (rmcp reads a header that is not text as none, too): this may be an
        // `initialize`, whose answer names the session it opened.
        let (parts, body) = req.into_parts();
        // `authenticate` has read the body to its end, bounded: this takes its bytes, not a copy.
        let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
            return body_lost();
        };
        let req = Request::from_parts(parts, axum::body::Body::from(body.clone()));
        if !opens_a_session(&body) {
            return next.run(req).await;
        }
        // rmcp opens the session before it answers, and this request is dropped if its client
        // goes away: on a task of its own, the session rmcp opened is recorded (or closed, past
        // a bound) whatever the client does. Recorded here instead, a reset right after the
        // `initialize` left a session no bound counted until it went idle.
        let opening = tokio::spawn(async move {
            let answer = next.run(req).await;
            let opened = answer.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
            if let Some(opened) = opened
                && let Err(refusal) = owners.open(&opened, &principal).await
            {
                return refusal.into_response();
            }
            answer
        });
        return match opening.await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::error!(error = %e, "an MCP initialize failed");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error; the master's log has the details",
                )
                .into_response()
            }
        };
    };
    let ending = req.method() == Method::DELETE;
    if !owners.owned_by(&session, &principal) {
        return if ending { no_session_to_end(owners.idle) } else { unknown_session() };
    }
    if ending && !owners.held_by_rmcp(&session).await {
        // Its worker ended: rmcp would answer 202 to ending it.
        owners.forget(&session);
        return no_session_to_end(owners.idle);
    }
    let mut in_use = owners.in_use(&session);
    let req = if req.method() == Method::POST {
        let (parts, body) = req.into_parts();
        // `authenticate` has read the body to its end, bounded: this takes its bytes, not a copy.
        let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
            return body_lost();
        };
        // rmcp routes an answer to the stream of the request with its id: a second request with
        // the id of one still being answered took the first one's answer, and neither stream
        // was answered in full. MCP forbids it; it is refused, and the first goes on.
        if let Some(id) = request_id(&body)
            && !owners.answering(&mut in_use, id.to_string())
        {
            let refusal = Refusal::new(
                Some(id.clone()),
                ErrorCode::INVALID_REQUEST,
                format!(
                    "a request with id {} is still being answered in this session: give each request an id of its own",
                    shown(&id)
                ),
            );
            return (StatusCode::BAD_REQUEST, axum::Json(refusal)).into_response();
        }
        Request::from_parts(parts, axum::body::Body::from(body))
    } else {
        req
    };
    let answer = next.run(req).await;
    // Ended, or its worker gone: rmcp holds it no more. A 404 can also be a JSON-RPC "method not
    // found" in a session that lives on, hence the question to rmcp rather than the status alone.
    if ending || answer.status() == StatusCode::NOT_FOUND {
        owners.forget_if_closed(&session).await;
    }
    // The session is in use until its answer (an event stream, for a `GET` as long as the client
    // listens) has been written or dropped.
    answer.map(|body| {
        axum::body::Body::new(http_body_util::BodyExt::map_frame(body, move |frame| {
            let _ = &in_use;
            frame
        }))
    })
}

/// Answers a `POST` whose body rmcp cannot read as one JSON-RPC message (a batch, a `jsonrpc`
/// other than "2.0", a body that is not JSON) with a JSON-RPC error that says what is wrong.
/// rmcp answers 415 in plain text ("fail to deserialize request body unrecognized JSON-RPC
/// message"), which reads as a wrong Content-Type and which no MCP client takes for an error.
/// So too an `initialize` whose params do not parse: rmcp takes it for another request and
/// refuses it as sent without a session. Anything rmcp reads, or refuses for another reason,
/// goes to the client as rmcp answers it; a body is parsed again only when rmcp refused it.
async fn explain_unread_message(req: Request, next: Next) -> Response {
    if req.method() != Method::POST || !sends_json(req.headers()) {
        // rmcp refuses a Content-Type other than JSON before it reads the body, and says so.
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    // `authenticate` has read the body to its end, bounded: this takes its bytes, not a copy.
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return body_lost();
    };
    let answer = next.run(Request::from_parts(parts, axum::body::Body::from(body.clone()))).await;
    // rmcp's refusals in plain text; those in JSON-RPC already say what is wrong.
    let plain_refusal = matches!(answer.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE | StatusCode::BAD_REQUEST)
        && answer.headers().get(axum::http::header::CONTENT_TYPE).is_none();
    if !plain_refusal {
        return answer;
    }
    match read_message(&body) {
        // Read, and refused for what rmcp's answer says (no session, say).
        Ok(_) => answer,
        // As rmcp answers a message it refuses before any session serves it: HTTP 400 with
        // the error as a JSON body.
        Err(refusal) => (StatusCode::BAD_REQUEST, axum::Json(refusal)).into_response(),
    }
}

/// The id of a JSON-RPC request (a message with a method and an id) as rmcp reads it; `None`
/// for a notification, a response, or a body rmcp will refuse.
fn request_id(body: &[u8]) -> Option<Value> {
    #[derive(serde::Deserialize)]
    struct Head {
        id: Option<Value>,
        method: Option<serde::de::IgnoredAny>,
    }
    let head = serde_json::from_slice::<Head>(body).ok()?;
    head.method?;
    id_of(&head.id?)
}

/// The answer when a body `authenticate` has read already cannot be read again (it always can).
fn body_lost() -> Response {
    tracing::error!("an MCP request's body, read once already, could not be read again");
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error; the master's log has the details")
        .into_response()
}

/// Whether a body sent without a session is an `initialize`, the one message rmcp opens a
/// session for. Read for its method alone; anything else rmcp refuses or serves on its own.
fn opens_a_session(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Method {
        method: Option<String>,
    }
    serde_json::from_slice::<Method>(body).is_ok_and(|m| m.method.as_deref() == Some(INITIALIZE_PARAMS.method))
}

/// Whether a request says its body is JSON, as rmcp reads its Content-Type.
fn sends_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

/// A JSON-RPC error for a message no session can serve, answered at once. An id it cannot name
/// is written as `"id": null`, where rmcp leaves it out: JSON-RPC 2.0 requires the member, and
/// the Python SDK's client (2.x) reads no error without it.
#[derive(serde::Serialize)]
struct Refusal {
    /// Always "2.0"; a struct rather than `json!`, for the members in the order JSON-RPC writes them.
    jsonrpc: &'static str,
    id: Option<Value>,
    error: RefusalError,
}

/// The `error` member of a [`Refusal`].
#[derive(serde::Serialize)]
struct RefusalError {
    code: i32,
    message: String,
}

impl Refusal {
    fn new(id: Option<Value>, code: ErrorCode, message: impl Into<String>) -> Refusal {
        Refusal { jsonrpc: "2.0", id, error: RefusalError { code: code.0, message: message.into() } }
    }
}

/// One JSON-RPC message as MCP reads it: the message rmcp serves, or the error that says why it
/// cannot be served. Refused: a body that is not one JSON-RPC message MCP accepts, and an
/// `initialize` whose params do not parse (rmcp reads it as a request for a method it does not
/// know, and outside a session refuses it for lacking one).
fn read_message(body: &[u8]) -> Result<ClientJsonRpcMessage, Refusal> {
    let message = serde_json::from_slice::<ClientJsonRpcMessage>(body).map_err(|_| unread_message(body))?;
    if let ClientJsonRpcMessage::Request(request) = &message
        && let ClientRequest::CustomRequest(custom) = &request.request
        && custom.method == INITIALIZE_PARAMS.method
    {
        return Err(Refusal::new(
            serde_json::to_value(&request.id).ok(),
            ErrorCode::INVALID_PARAMS,
            INITIALIZE_PARAMS.refusal(custom.params.clone()),
        ));
    }
    Ok(message)
}

/// The JSON-RPC error for a body that is not one JSON-RPC message MCP accepts: -32700 (Parse
/// error) for one that is not JSON, -32602 (Invalid params) for params that are not an object,
/// -32600 (Invalid Request) for the rest. The message's id is kept when it has a valid one.
fn unread_message(body: &[u8]) -> Refusal {
    if body.starts_with(b"\xEF\xBB\xBF") {
        return Refusal::new(
            None,
            ErrorCode::PARSE_ERROR,
            "the body begins with a UTF-8 byte order mark: send the JSON without it",
        );
    }
    let message = match serde_json::from_slice::<Value>(body) {
        // serde_json's bound on nesting, not a fault in the JSON.
        Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
            return Refusal::new(
                top_level_id(body),
                ErrorCode::INVALID_REQUEST,
                "the message is nested more than 128 levels deep, more than the master reads",
            );
        }
        Err(e) => {
            return Refusal::new(
                None,
                ErrorCode::PARSE_ERROR,
                format!("the body is not JSON ({e}): send one JSON-RPC message, a JSON object"),
            );
        }
        Ok(Value::Array(_)) => {
            // MCP took batches in 2025-03-26 only; rmcp reads none.
            return Refusal::new(
                None,
                ErrorCode::INVALID_REQUEST,
                "a batch (JSON array) is not accepted: send one JSON-RPC message per request",
            );
        }
        Ok(Value::Object(message)) => message,
        Ok(other) => {
            return Refusal::new(
                None,
                ErrorCode::INVALID_REQUEST,
                format!("a JSON-RPC message is a JSON object, not {}", shown(&other)),
            );
        }
    };
    let id = match message.get("id") {
        None => None,
        Some(id) if let Some(id) = id_of(id) => Some(id),
        Some(Value::Number(n)) if beyond_i64(n) => {
            return Refusal::new(
                None,
                ErrorCode::INVALID_REQUEST,
                format!("an integer id must fit a signed 64-bit integer, and {n} does not"),
            );
        }
        Some(other) => {
            return Refusal::new(
                None,
                ErrorCode::INVALID_REQUEST,
                format!("id must be a string or an integer, not {}", shown(other)),
            );
        }
    };
    let (code, problem) = match (message.get("jsonrpc"), message.get("method"), message.get("params")) {
        (None, ..) => (ErrorCode::INVALID_REQUEST, r#"jsonrpc must be "2.0", and is missing"#.to_owned()),
        (Some(v), ..) if v != "2.0" => {
            (ErrorCode::INVALID_REQUEST, format!(r#"jsonrpc must be "2.0", not {}"#, shown(v)))
        }
        (_, Some(m), _) if !m.is_string() => {
            (ErrorCode::INVALID_REQUEST, format!("method must be a string, not {}", shown(m)))
        }
        (_, None, _) if !message.contains_key("result") && !message.contains_key("error") => (
            ErrorCode::INVALID_REQUEST,
            "a message needs a method (a request or a notification), or a result or an error (a response)".to_owned(),
        ),
        (_, Some(_), Some(p)) if !p.is_object() && !p.is_null() => {
            (ErrorCode::INVALID_PARAMS, format!("params must be an object of named params, not {}", shown(p)))
        }
        _ => (
            ErrorCode::INVALID_REQUEST,
            "not a JSON-RPC request, notification or response as MCP defines them".to_owned(),
        ),
    };
    Refusal::new(id, code, problem)
}

/// Whether `n` is an integer too large, either way, for an i64: past u64 too, serde_json reads
/// it as a float with no fraction.
fn beyond_i64(n: &serde_json::Number) -> bool {
    n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() >= 2f64.powi(63))
}

/// A JSON value in an error message: itself when short, else what kind of value it is.
fn shown(v: &Value) -> String {
    let text = v.to_string();
    if text.len() <= 40 {
        return text;
    }
    match v {
        Value::String(_) => "a long string".to_owned(),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
        Value::Null | Value::Bool(_) | Value::Number(_) => text,
    }
}

/// Bearer authentication for `/mcp`: the principal goes into the request for the handler, which
/// shows it what its flags allow. An executor credential is refused, as everywhere but the
/// executor protocol.
pub async fn authenticate(State(app): State<AppState>, mut req: Request, next: Next) -> Result<Response, ApiError> {
    let token = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
        .map(str::trim)
        .ok_or_else(|| ApiError::unauthorized("missing bearer token: send 'Authorization: Bearer <token>'"))?;
    let principal = app.engine.authenticate(token).ok_or_else(|| {
        ApiError::unauthorized("the bearer token is not valid (revoked, mistyped, or from another data folder)")
    })?;
    if principal.kind == PrincipalKind::Executor {
        return Err(ApiError::forbidden(format!(
            "{} holds an executor credential, which is good for the executor protocol only, not MCP",
            principal.name
        )));
    }
    req.extensions_mut().insert(principal);
    // A message is a JSON-RPC request of modest size: bounded like every body of the API.
    let (parts, body) = req.into_parts();
    let declared = crate::extract::declared_length(&parts.headers);
    if let Some(len) = declared.filter(|len| *len > app.max_body_bytes && *len <= DRAIN_REFUSED_BYTES) {
        // Read to its end before the refusal: a client still writing when the master answers
        // and closes gets a broken pipe instead of the 413, and an MCP client (the stdio relay)
        // then never learns why its call went unanswered.
        use futures_util::StreamExt as _;
        let mut rest = body.into_data_stream();
        let _ = tokio::time::timeout(app.body_timeout + std::time::Duration::from_secs((len >> 20) as u64), async {
            while let Some(Ok(_)) = rest.next().await {}
        })
        .await;
        return Err(crate::extract::too_large(app.max_body_bytes, "--max-body-bytes"));
    }
    let bytes =
        crate::extract::read_body(body, declared, app.max_body_bytes, "--max-body-bytes", app.body_timeout).await?;
    Ok(next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a failed call's text kept the colour codes of the tool's stderr, which the
    /// shell command drops.
    #[test]
    fn a_failed_call_s_line_keeps_no_colour_codes_or_unseen_characters() {
        let r = failed("command exited with 3: line two\u{1b}[31m red\u{202e}\nsecond".into());
        let text = serde_json::to_value(&r.content).unwrap()[0]["text"].clone();
        assert_eq!(text, "command exited with 3: line two red");
        assert_eq!(r.is_error, Some(true));
    }

    #[test]
    fn every_platform_tool_checks_its_arguments_and_takes_null_for_absent() {
        for tool in every_platform_tool() {
            assert!(argument_check(tool).is_some(), "{}: its schema compiles", tool.name());
            let err = check_arguments(tool, &json!({"bogus": 1}).as_object().unwrap().clone()).unwrap_err();
            // An unknown argument, or first a required one missing.
            assert!(err.contains("'bogus' was unexpected") || err.contains("is a required property"), "{err}");
        }
        let args = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(check_arguments(Platform::SearchTools, &args(json!({"q": "x", "limit": null}))), Ok(()));
        assert!(check_arguments(Platform::CallTool, &args(json!({"name": null}))).is_err(), "a required one stays");
        // The handlers take `limit` as given: the schema's bounds are the only ones.
        for (limit, says) in [(0, "less than the minimum of 1"), (101, "greater than the maximum of 100")] {
            for tool in [Platform::SearchTools, Platform::SearchCatalog] {
                let err = check_arguments(tool, &args(json!({"q": "x", "limit": limit}))).unwrap_err();
                assert!(err.contains(says) && err.contains("(at /limit)"), "{err}");
            }
        }
        assert_eq!(check_arguments(Platform::SearchCatalog, &args(json!({"limit": 100}))), Ok(()));
        let script = |v: Value| check_arguments(Platform::RegisterScript, &args(v));
        assert_eq!(script(json!({"id": "a", "name": "a", "runtime": "sh", "contentBase64": "ZWNobyAx"})), Ok(()));
        assert_eq!(script(json!({"id": "a", "name": "a", "runtime": "sh", "content": "echo 1"})), Ok(()));
        assert!(script(json!({"id": "a", "name": "a", "runtime": "sh"})).is_err());
    }

    /// The answer to another principal's session is a copy of rmcp's to an unknown one: the
    /// copy must not drift from it when rmcp changes.
    #[tokio::test]
    async fn another_principals_session_answers_as_rmcp_answers_an_unknown_one() {
        struct Nothing;
        impl ServerHandler for Nothing {}
        let rmcp = StreamableHttpService::new(
            || Ok(Nothing),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default().with_allowed_hosts(Vec::<String>::new()),
        );
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
        for method in [Method::POST, Method::GET] {
            let request = axum::http::Request::builder()
                .method(method.clone())
                .uri("/mcp")
                .header("host", "127.0.0.1")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header(SESSION_HEADER, "no-such-session")
                .body(axum::body::Body::from(body.clone()))
                .unwrap();
            let theirs = rmcp.handle(request).await.into_response();
            let ours = unknown_session();
            assert_eq!((theirs.status(), theirs.headers()), (ours.status(), ours.headers()), "{method}");
            let text = |r: Response| async { axum::body::to_bytes(r.into_body(), usize::MAX).await.unwrap() };
            assert_eq!(text(theirs).await, text(ours).await, "{method}");
        }
    }

    /// Regression: the task that tells sessions their tools changed waited on each session in
    /// turn, so one client that read nothing from its stream stopped every other session's
    /// `list_changed`, and the closing of a revoked principal's sessions, for as long as it
    /// held on. A notification now goes on a task of its own, one at a time per session, and is
    /// given up after `TELL_TIMEOUT`.
    #[tokio::test(start_paused = true)]
    async fn a_session_whose_client_reads_nothing_holds_up_no_one() {
        use rmcp::ServiceExt;
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        struct Quiet;
        impl ServerHandler for Quiet {}
        let (server_io, client_io) = tokio::io::duplex(64);
        let (client_read, mut client_write) = tokio::io::split(client_io);
        let serving = tokio::spawn(Quiet.serve(tokio::io::split(server_io)));
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
        client_write.write_all(format!("{init}\n").as_bytes()).await.unwrap();
        let mut lines = tokio::io::BufReader::new(client_read).lines();
        assert!(lines.next_line().await.unwrap().unwrap().contains("\"result\""));
        client_write.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n").await.unwrap();
        let server = serving.await.unwrap().unwrap();
        // The client reads nothing more: the pipe fills, then the session's channel, and a
        // notification waits. Each tell returns at once all the same (it is not async).
        let telling = Arc::new(AtomicBool::new(false));
        let mut tells = 0;
        let stuck = loop {
            tell_list_changed(server.peer(), &telling);
            tells += 1;
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
            if telling.load(Ordering::Acquire) || tells == 100_000 {
                break telling.load(Ordering::Acquire);
            }
        };
        assert!(stuck, "no notification waited after {tells} tells");
        // Given up after its time: the next change is told again.
        tokio::time::sleep(TELL_TIMEOUT + Duration::from_secs(1)).await;
        assert!(!telling.load(Ordering::Acquire), "the notification was not given up");
        drop(lines);
    }

    #[test]
    fn a_tool_name_is_toolkit_and_operation_within_64_characters() {
        assert_eq!(tool_name("weather", "forecast"), "weather_forecast");
        assert_eq!(tool_name("api-v2", "get-users-by-id"), "api-v2_get-users-by-id");
        let long =
            tool_name("a-very-long-toolkit-name-for-a-service", "list-sip-auth-calls-ip-access-control-list-mapping");
        assert_eq!(long.len(), 64);
        assert_eq!(&long[..55], &"a-very-long-toolkit-name-for-a-service_list-sip-auth-calls-ip"[..55]);
        assert_eq!(long.as_bytes()[55], b'-');
        assert_ne!(
            long,
            tool_name("a-very-long-toolkit-name-for-a-service", "list-sip-auth-calls-ip-access-control-list-mappinh")
        );
        for n in [long, tool_name("k", "op.with.dots")] {
            assert!(n.len() <= 64 && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'), "{n}");
        }
    }
}
