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
//!
//! `agentos mcp` (the CLI) serves the same over stdio by relaying to this endpoint.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, SubscriptionFilter, Tool,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, SubscriptionContext};
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
    Search,
    Get,
}

/// The tools `p` sees, by name, with what each calls.
fn tools_of(engine: &Engine, p: &Principal) -> BTreeMap<String, (Tool, Target)> {
    let mut out = BTreeMap::new();
    if agentos_core::entry::CATALOG_READ_FLAGS.iter().any(|f| p.flags.has(*f)) {
        out.insert(format!("{PLATFORM_PREFIX}search_catalog"), (search_tool(), Target::Search));
        out.insert(format!("{PLATFORM_PREFIX}get_entry"), (get_tool(), Target::Get));
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

fn search_tool() -> Tool {
    Tool::new(
        format!("{PLATFORM_PREFIX}search_catalog"),
        "Search the tool catalog (local entries of your model first, then global ones)",
        schema(json!({"type": "object", "properties": {
            "q": {"type": "string", "description": "Free text, matched against id, name, description and capabilities"},
            "kind": {"enum": ["script", "http", "docker", "toolnet", "host", "mcp"]},
            "capability": {"type": "string"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
            "offset": {"type": "integer", "minimum": 0, "default": 0}
        }, "additionalProperties": false})),
    )
}

fn get_tool() -> Tool {
    Tool::new(
        format!("{PLATFORM_PREFIX}get_entry"),
        "Read one catalog entry: its contract (operations and their input schemas) and binding",
        schema(json!({"type": "object", "required": ["id"], "properties": {
            "id": {"type": "string", "description": "The toolkit id"},
            "model": {"type": "string", "description": "Whose catalog (default: your home model)"}
        }, "additionalProperties": false})),
    )
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
}

/// What every session handler shares.
struct Shared {
    engine: Engine,
    sessions: Mutex<Vec<Session>>,
    /// Rung when the catalog may have changed for someone.
    changed: broadcast::Sender<()>,
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
    // One line, as a shell command prints it.
    let line = message.lines().next().unwrap_or_default().to_string();
    CallToolResult::error(vec![ContentBlock::text(line)])
}

impl McpServer {
    async fn call(&self, p: &Principal, target: Target, args: JsonObject) -> CallToolResult {
        let engine = &self.shared.engine;
        let outcome = match target {
            Target::Operation { toolkit, operation } => {
                engine.dispatch().call_with_input(p, &toolkit, &operation, Value::Object(args)).await
            }
            Target::Search => {
                let query = SearchQuery {
                    model: None,
                    kind: args.get("kind").and_then(Value::as_str).and_then(agentos_core::entry::BindingKind::parse),
                    capability: args.get("capability").and_then(Value::as_str).map(str::to_string),
                    q: args.get("q").and_then(Value::as_str).map(str::to_string),
                    limit: args.get("limit").and_then(Value::as_u64).unwrap_or(20).clamp(1, 100) as usize,
                    offset: args.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize,
                };
                engine.catalog().search(p, &query).map(|page| {
                    json!({
                        "total": page.total,
                        "items": page.items.iter().map(|e| {
                            let entry = &e.stored.entry;
                            json!({
                                "id": entry.id, "name": entry.name, "kind": entry.binding.kind().as_str(),
                                "description": entry.description, "scope": e.scope, "shadowed": e.shadowed,
                                "tools": entry.contract().operations.keys()
                                    .map(|op| tool_name(&entry.id, op)).collect::<Vec<_>>(),
                            })
                        }).collect::<Vec<_>>(),
                    })
                })
            }
            Target::Get => match args.get("id").and_then(Value::as_str) {
                None => return failed("agentos_get_entry: give the toolkit's id as \"id\"".into()),
                Some(id) => engine.catalog().get(p, id, args.get("model").and_then(Value::as_str)).and_then(|e| {
                    serde_json::to_value(&e).map_err(|e| agentos_core::CoreError::internal(e.to_string()).into())
                }),
            },
        };
        match outcome {
            Ok(v) => answer(v),
            Err(e) => failed(e.to_string()),
        }
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
        let tools = tools_of(&self.shared.engine, &p).into_values().map(|(t, _)| t).collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let p = principal_of(&context.extensions)?;
        let name = request.name.to_string();
        let target = tools_of(&self.shared.engine, &p).remove(&name).map(|(_, t)| t);
        let Some(target) = target else {
            // Not seen: the same answer whether it does not exist or is hidden.
            return Ok(failed(format!("no tool {name:?} (tools/list shows the tools you can call)")).into());
        };
        Ok(self.call(&p, target, request.arguments.unwrap_or_default()).await.into())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let Ok(principal) = principal_of(&context.extensions) else { return };
        let digest = names_digest(&self.shared.engine, &principal);
        let mut sessions = self.shared.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|s| !s.peer.is_transport_closed());
        sessions.push(Session { peer: context.peer.clone(), principal, digest });
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

/// Tells the sessions whose tools changed, on every event that can change what someone sees.
async fn watch(shared: std::sync::Weak<Shared>, mut events: broadcast::Receiver<Arc<agentos_core::event::Event>>) {
    loop {
        let relevant = match events.recv().await {
            Ok(ev) => matches!(
                ev.body,
                EventBody::ToolRegistered { .. }
                    | EventBody::ToolRemoved { .. }
                    | EventBody::ModelGranted(_)
                    | EventBody::ModelGrantRevoked(_)
                    | EventBody::PrincipalRevoked { .. }
            ),
            // Missed some: any of them may have been one.
            Err(broadcast::error::RecvError::Lagged(_)) => true,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if !relevant {
            continue;
        }
        let Some(shared) = shared.upgrade() else { return };
        let _ = shared.changed.send(());
        let mut notify = Vec::new();
        {
            let mut sessions = shared.sessions.lock().unwrap_or_else(|e| e.into_inner());
            sessions.retain(|s| !s.peer.is_transport_closed());
            for s in sessions.iter_mut() {
                let now = names_digest(&shared.engine, &s.principal);
                if now != s.digest {
                    s.digest = now;
                    notify.push(s.peer.clone());
                }
            }
        }
        for peer in notify {
            if let Err(e) = peer.notify_tool_list_changed().await {
                tracing::debug!(error = %e, "an MCP session could not be told its tools changed");
            }
        }
    }
}

/// The `/mcp` service over an engine.
pub fn service(engine: Engine) -> StreamableHttpService<McpServer, LocalSessionManager> {
    let shared = Arc::new(Shared { sessions: Mutex::new(Vec::new()), changed: broadcast::channel(16).0, engine });
    tokio::spawn(watch(Arc::downgrade(&shared), shared.engine.nets().subscribe()));
    let config = StreamableHttpServerConfig::default()
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        // The master answers on whatever name it is reached by; the bearer token is the gate.
        .with_allowed_hosts(Vec::<String>::new());
    StreamableHttpService::new(
        move || Ok(McpServer { shared: shared.clone() }),
        Arc::new(LocalSessionManager::default()),
        config,
    )
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
    let bytes = axum::body::to_bytes(body, app.max_body_bytes).await.map_err(|_| {
        ApiError::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("an MCP message may hold at most {} bytes", app.max_body_bytes),
        )
    })?;
    Ok(next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await)
}

#[cfg(test)]
mod tests {
    use super::*;

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
