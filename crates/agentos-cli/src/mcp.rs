//! `agentos mcp`: MCP over stdio for clients that spawn a command. It relays to the master's
//! `/mcp` (reached through `AGENTOS_URL` and `AGENTOS_TOKEN`, like a shim), so the tools, the
//! flags that filter them, the answers and the change notifications are the master's own.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, SubscriptionFilter,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, RunningService, SubscriptionContext};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ErrorData as McpError, RoleClient, RoleServer, ServerHandler, ServiceExt};
use tokio::sync::broadcast;

/// Where a change the master announces goes: the stdio client's session, and its listeners.
#[derive(Clone)]
struct Changes {
    session: Arc<Mutex<Option<Peer<RoleServer>>>>,
    listeners: broadcast::Sender<()>,
}

/// The client side, facing the master.
#[derive(Clone)]
struct Upstream {
    changes: Changes,
}

impl ClientHandler for Upstream {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("agentos-mcp", env!("CARGO_PKG_VERSION")))
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.changes.listeners.send(());
        let session = self.changes.session.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(peer) = session {
            let _ = peer.notify_tool_list_changed().await;
        }
    }
}

/// The server side, facing the stdio client.
#[derive(Clone)]
struct Relay {
    master: Arc<RunningService<RoleClient, Upstream>>,
    changes: Changes,
}

fn relayed(e: rmcp::ServiceError) -> McpError {
    match e {
        rmcp::ServiceError::McpError(e) => e,
        // The transport's own words and causes, without rmcp's type name for the transport: the
        // master may have answered (a 413, a 401), which is not "did not answer".
        rmcp::ServiceError::TransportSend(t) => McpError::internal_error(
            format!("the request to the master failed: {}", agentos_engine::outbound::describe(t.error.as_ref())),
            None,
        ),
        rmcp::ServiceError::TransportClosed => {
            McpError::internal_error("the connection to the master closed; start agentos mcp again", None)
        }
        other => McpError::internal_error(format!("the master did not answer: {other}"), None),
    }
}

impl ServerHandler for Relay {
    fn get_info(&self) -> ServerConfig {
        let instructions = self.master.peer_info().and_then(|i| i.instructions.clone()).unwrap_or_default();
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build())
            .with_server_info(Implementation::new("agentos", env!("CARGO_PKG_VERSION")))
            .with_instructions(instructions)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        // Rebuilt for the protocol the stdio client speaks (the master's answer may carry a
        // version's fields that this client's version requires differently).
        let page = self.master.list_tools(request).await.map_err(relayed)?;
        let mut out = ListToolsResult::with_all_items(page.tools);
        out.next_cursor = page.next_cursor;
        Ok(out)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let mut result = self.master.call_tool(request).await.map_err(relayed)?;
        result.result_type.get_or_insert(rmcp::model::ResultType::COMPLETE);
        Ok(result.into())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        *self.changes.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(context.peer.clone());
    }

    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(requested.supported_by(&self.get_info().capabilities))
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let mut changed = self.changes.listeners.subscribe();
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                r = changed.recv() => {
                    if let Err(broadcast::error::RecvError::Closed) = r {
                        return Ok(());
                    }
                    context.sink().notify_tool_list_changed().await
                        .map_err(|e| McpError::internal_error(e.to_string(), None))?;
                }
            }
        }
    }
}

/// `agentos mcp`: serves stdio until the client closes it.
pub fn run() -> ExitCode {
    let url = std::env::var("AGENTOS_URL").unwrap_or_else(|_| "http://127.0.0.1:7420".into());
    let Some(token) = std::env::var("AGENTOS_TOKEN").ok().filter(|t| !t.is_empty()) else {
        errln!("agentos mcp: set AGENTOS_TOKEN to the agent's token (and AGENTOS_URL to the master)");
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            errln!("agentos mcp: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(serve(url, token)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // stdout is the protocol's: the reason goes to stderr, on one line.
            errln!("agentos mcp: {e}");
            ExitCode::from(1)
        }
    }
}

async fn serve(url: String, token: String) -> Result<(), String> {
    let changes = Changes { session: Arc::new(Mutex::new(None)), listeners: broadcast::channel(16).0 };
    let endpoint = format!("{}/mcp", url.trim_end_matches('/'));
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(endpoint.clone()).auth_header(token),
    );
    let master = Upstream { changes: changes.clone() }
        .serve(transport)
        .await
        .map_err(|e| format!("cannot reach the master's MCP endpoint {endpoint}: {e}"))?;
    let relay = Relay { master: Arc::new(master), changes };
    let running = relay.serve(rmcp::transport::stdio()).await.map_err(|e| e.to_string())?;
    running.waiting().await.map_err(|e| e.to_string())?;
    Ok(())
}
