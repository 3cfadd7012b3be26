//! `agentos mcp`: MCP over stdio for clients that spawn a command. It relays to the master's
//! `/mcp` (reached through `AGENTOS_URL` and `AGENTOS_TOKEN`, like a shim), so the tools, the
//! flags that filter them, the answers and the change notifications are the master's own, and
//! a line that is not a message MCP reads is answered with the error `/mcp` gives that body.
//! The relay's session at the master ends when the relay does.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, ClientJsonRpcMessage, ClientRequest,
    CustomRequest, CustomResult, ErrorCode, Implementation, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, ServerJsonRpcMessage, ServerResult, SubscriptionFilter,
};
use rmcp::service::{ClientInitializeError, NotificationContext, Peer, RequestContext, SubscriptionContext};
use rmcp::transport::streamable_http_client::{StreamableHttpClientTransportConfig, StreamableHttpError};
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use rmcp::{ClientHandler, ErrorData as McpError, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::{broadcast, mpsc};

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
    master: Peer<RoleClient>,
    changes: Changes,
}

/// The HTTP status the master refused a request with, where rmcp's client kept it: a 401 and a
/// 403 it turns into errors of their own, which name no status.
fn refused_with(e: &StreamableHttpError<reqwest::Error>) -> Option<u16> {
    match e {
        StreamableHttpError::HttpStatus(s) => Some(s.status),
        StreamableHttpError::AuthRequired(_) => Some(401),
        StreamableHttpError::InsufficientScope(_) => Some(403),
        _ => None,
    }
}

/// The status and the master's words of a request it refused as the client's fault (a 4xx
/// other than 401 and 403, which say the token is at fault): rmcp keeps them only as the text
/// of an unexpected answer, `HTTP 413 Payload Too Large: {"error": …}`.
fn refused_request(e: &(dyn std::error::Error + 'static)) -> Option<(u16, String)> {
    let Some(StreamableHttpError::UnexpectedServerResponse(text)) =
        e.downcast_ref::<StreamableHttpError<reqwest::Error>>()
    else {
        return None;
    };
    let rest = text.strip_prefix("HTTP ")?;
    let status: u16 = rest.get(..3)?.parse().ok()?;
    if !(400..500).contains(&status) || status == 401 || status == 403 {
        return None;
    }
    let body = rest.split_once(": ").map_or("", |(_, body)| body);
    Some((status, words_of(body)))
}

fn relayed(e: rmcp::ServiceError) -> McpError {
    match e {
        rmcp::ServiceError::McpError(e) => e,
        // The session's token revoked since it opened: every request from now on is refused.
        rmcp::ServiceError::TransportSend(t)
            if t.error.downcast_ref::<StreamableHttpError<reqwest::Error>>().and_then(refused_with) == Some(401) =>
        {
            McpError::new(
                ErrorCode::INTERNAL_ERROR,
                "the master answered HTTP 401 Unauthorized: it no longer takes this token (revoked since the \
                 session opened?); start agentos mcp again with a valid AGENTOS_TOKEN",
                Some(json!({"status": 401})),
            )
        }
        // The master refused the request itself (a body over its limit: 413): the client's
        // request is at fault, and the master's words say why.
        rmcp::ServiceError::TransportSend(t) if refused_request(t.error.as_ref()).is_some() => {
            let (status, words) = refused_request(t.error.as_ref()).unwrap_or_default();
            McpError::invalid_request(
                format!("the master refused the request (HTTP {status}): {words}"),
                Some(json!({"status": status})),
            )
        }
        // The transport's own words and causes, without rmcp's type name for the transport: the
        // master may have answered (a 401), which is not "did not answer".
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
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // A client's `notifications/cancelled` only cancels the request's token here: the relayed
        // call is dropped with it, and rmcp then tells the master, which stops the call's job.
        let mut result = tokio::select! {
            relayed_call = self.master.call_tool(request) => relayed_call.map_err(relayed)?,
            () = context.ct.cancelled() => {
                return Err(McpError::new(ErrorCode::INTERNAL_ERROR, "the call was cancelled by the client", None));
            }
        };
        result.result_type.get_or_insert(rmcp::model::ResultType::COMPLETE);
        Ok(result.into())
    }

    /// A request rmcp does not read as one of the methods above: the master's answer, which for
    /// a method it serves whose params do not parse (a `tools/call` without them) is -32602
    /// with the params it takes, where rmcp's own here would be -32601 (Method not found).
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        match self.master.send_request(ClientRequest::CustomRequest(request)).await.map_err(relayed)? {
            ServerResult::CustomResult(result) => Ok(result),
            other => serde_json::to_value(other)
                .map(CustomResult::new)
                .map_err(|e| McpError::internal_error(e.to_string(), None)),
        }
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

/// `agentos mcp`: serves stdio until the client closes it or the relay is told to stop.
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
    let outcome = runtime.block_on(serve(url, token));
    // tokio reads stdin on a thread of its own, and a read under way (after SIGTERM, say) would
    // hold the runtime's end until the client writes again: nothing read now is wanted.
    runtime.shutdown_background();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failed::Said) => ExitCode::from(1),
        Err(Failed::Unreachable) => ExitCode::from(crate::client::EXIT_UNREACHABLE),
        Err(Failed::Because(e)) => {
            // stdout is the protocol's: the reason goes to stderr, on one line.
            errln!("agentos mcp: {e}");
            ExitCode::from(1)
        }
    }
}

/// Why the relay ends with a failure.
enum Failed {
    /// The reason is on stderr already.
    Said,
    /// The master could not be reached (said on stderr already): the exit code a shell command
    /// gives for it.
    Unreachable,
    Because(String),
}

/// How long the relay waits for the master to end its session when the relay ends; rmcp's
/// client gives the `DELETE` 5 seconds of its own.
const SESSION_END_TIMEOUT: Duration = Duration::from_secs(6);

async fn serve(url: String, token: String) -> Result<(), Failed> {
    let changes = Changes { session: Arc::new(Mutex::new(None)), listeners: broadcast::channel(16).0 };
    let endpoint = format!("{}/mcp", url.trim_end_matches('/'));
    let http = reqwest::Client::builder().timeout(ASK_TIMEOUT).build().map_err(|e| Failed::Because(e.to_string()))?;
    let asked = Master { http, endpoint: endpoint.clone(), token: token.clone() };
    let (stdio, writer) = StdioLines::start(asked.clone());
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(endpoint).auth_header(token),
    );
    let mut master = match (Upstream { changes: changes.clone() }).serve(transport).await {
        Ok(master) => master,
        Err(e) => {
            let refusal = asked.not_opened(e).await;
            // Said at once, for someone who ran the relay by hand; then the client's
            // `initialize` is told the same as its answer.
            errln!("agentos mcp: {}", refusal.message);
            let unreachable = refusal.data.as_ref().is_some_and(|d| d["unreachable"] == true);
            refuse_first_request(stdio, refusal).await;
            let _ = writer.await;
            return Err(if unreachable { Failed::Unreachable } else { Failed::Said });
        }
    };
    let relay = Relay { master: master.peer().clone(), changes };
    let serving = async {
        let running = relay.serve(stdio).await.map_err(|e| e.to_string())?;
        running.waiting().await.map(drop).map_err(|e| e.to_string())
    };
    let outcome = tokio::select! {
        outcome = serving => outcome.map_err(Failed::Because),
        // Told to stop: ended as when stdin closes, the master's session with it.
        () = stop_signal() => Ok(()),
    };
    // Ends the session at the master (rmcp's client sends the `DELETE` as it closes), which
    // would otherwise count toward the agent's sessions until it went idle.
    let _ = master.close_with_timeout(SESSION_END_TIMEOUT).await;
    // Every answer written before the relay exits.
    let _ = writer.await;
    outcome
}

/// SIGTERM or SIGINT; never, where neither can be listened for.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

/// How long the relay waits for the master's answer to a request of its own (not one it relays).
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// The master's `/mcp`, for the questions the relay asks it in plain HTTP, outside any session.
#[derive(Clone)]
struct Master {
    http: reqwest::Client,
    endpoint: String,
    token: String,
}

impl Master {
    fn post(&self, body: Vec<u8>) -> reqwest::RequestBuilder {
        self.http
            .post(&self.endpoint)
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body)
    }

    /// The answer to `line`, one the relay cannot read as a JSON-RPC message MCP accepts: the
    /// master's, which is the JSON-RPC error `/mcp` gives that body, with the id kept when it
    /// has a valid one. Sent outside any session, it opens none: no session serves such a
    /// body, and an `initialize` among them is one whose params do not parse.
    async fn refusal(&self, line: Vec<u8>) -> Vec<u8> {
        let said = match self.post(line).send().await {
            Err(e) => agentos_engine::outbound::describe(&e),
            Ok(answer) => {
                let status = answer.status();
                let text = answer.text().await.unwrap_or_default();
                match serde_json::from_str::<Value>(&text) {
                    Ok(error) if status == reqwest::StatusCode::BAD_REQUEST && error["error"]["code"].is_i64() => {
                        let mut line = error.to_string().into_bytes();
                        line.push(b'\n');
                        return line;
                    }
                    _ => format!("HTTP {status}: {}", words_of(&text)),
                }
            }
        };
        let error = json!({"jsonrpc": "2.0", "id": null, "error": {"code": ErrorCode::INVALID_REQUEST.0,
            "message": format!("not a JSON-RPC message MCP reads (asked what is wrong with it, the master answered {said})")}});
        let mut line = error.to_string().into_bytes();
        line.push(b'\n');
        line
    }

    /// Why the master opened no session for the relay, as the client's `initialize` is answered.
    ///
    /// rmcp's client keeps only the status of a 429 or 5xx answer: the master's words (that the
    /// agent holds its 100 sessions, say) are read from a second `initialize`, sent as plain
    /// HTTP. Refused as the first was, it opens nothing; if it is not, its session is ended at
    /// once.
    async fn not_opened(&self, e: ClientInitializeError) -> McpError {
        let reason = match &e {
            ClientInitializeError::TransportError { error, .. } => error.error.as_ref(),
            other => other as &(dyn std::error::Error + 'static),
        };
        let transport = reason.downcast_ref::<StreamableHttpError<reqwest::Error>>();
        // No answer at all (nothing listens there, the name does not resolve): said as a shell
        // command says it, with the cause rmcp's own message leaves out.
        if let Some(StreamableHttpError::Client(e)) = transport
            && (e.is_connect() || e.is_timeout())
        {
            return McpError::new(
                ErrorCode::INTERNAL_ERROR,
                format!(
                    "cannot reach the master at {}: {} (is `agentos up` running? set AGENTOS_URL)",
                    self.endpoint.trim_end_matches("/mcp"),
                    agentos_engine::outbound::describe(e)
                ),
                Some(json!({"unreachable": true})),
            );
        }
        let status = transport.and_then(refused_with);
        let said = match status {
            Some(status) => {
                let status =
                    reqwest::StatusCode::from_u16(status).map_or(format!("HTTP {status}"), |s| format!("HTTP {s}"));
                match self.refused_initialize().await {
                    Some(words) => format!("{status}: {words}"),
                    None => status,
                }
            }
            None => agentos_engine::outbound::describe(reason),
        };
        McpError::new(
            ErrorCode::INTERNAL_ERROR,
            format!("the master's MCP endpoint {} opened no session: {said}", self.endpoint),
            status.map(|status| json!({"status": status})),
        )
    }

    /// What the master says to an `initialize` it refuses; `None` if it did not refuse it.
    async fn refused_initialize(&self) -> Option<String> {
        let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": rmcp::model::ProtocolVersion::LATEST_WITH_INITIALIZE,
            "capabilities": {}, "clientInfo": {"name": "agentos-mcp", "version": env!("CARGO_PKG_VERSION")}}});
        let answer = self.post(initialize.to_string().into_bytes()).send().await.ok()?;
        if answer.status().is_success() {
            if let Some(session) = answer.headers().get("mcp-session-id").cloned() {
                let end = self.http.delete(&self.endpoint).bearer_auth(&self.token).header("mcp-session-id", session);
                let _ = end.send().await;
            }
            return None;
        }
        Some(words_of(&answer.text().await.ok()?))
    }
}

/// The message of the master's JSON error, or else the first line of what it answered.
fn words_of(text: &str) -> String {
    match serde_json::from_str::<Value>(text) {
        Ok(body) if body["error"]["message"].is_string() => {
            body["error"]["message"].as_str().unwrap_or_default().into()
        }
        _ => text.lines().next().unwrap_or_default().chars().take(500).collect(),
    }
}

/// Answers the client's first request (its `initialize`) with `error`, for a relay that has
/// no session to serve it in; lines before it are read as always.
async fn refuse_first_request(mut stdio: StdioLines, error: McpError) {
    while let Some(message) = stdio.receive().await {
        if let ClientJsonRpcMessage::Request(request) = message {
            let _ = stdio.send(ServerJsonRpcMessage::error(error, Some(request.id))).await;
            return;
        }
    }
}

/// The stdio side of the relay: the client's lines in, the relay's messages out, one JSON-RPC
/// message a line. rmcp's own stdio transport answers a line it cannot read with a bare
/// -32600 "Invalid request" without the id, or with nothing at all (a line that is not JSON,
/// an id that is an object); here each is answered as `/mcp` answers the same body
/// ([`Master::refusal`]).
struct StdioLines {
    /// Stdin, lines of at most [`MAX_LINE`]: a longer one is skipped to its end, its id looked
    /// for on the way.
    read: agentos_engine::lines::BoundedLines<tokio::io::Stdin>,
    master: Master,
    /// The master's answer to a line that could not be read, on its way. A task of its own:
    /// rmcp drops a `receive` under way whenever it has something to send, and the question
    /// goes on meanwhile.
    asking: Option<tokio::task::JoinHandle<Vec<u8>>>,
    /// The answer to a line that could not be read, not yet handed to the writer.
    refusal: Option<Vec<u8>>,
    /// Lines for stdout, written in order by one task.
    out: mpsc::Sender<Vec<u8>>,
    /// The client opened its session: an `initialize`, or a request carrying the protocol
    /// version and what else a request without one needs (2026-07-28 on). Until then rmcp
    /// answers requests itself, but ends the whole relay on a notification or a response, so
    /// those are dropped here.
    opened: bool,
    /// The client's requests not answered yet: the id each was handed to rmcp under, by the
    /// client's id. rmcp's server routes an answer by id, so a second request with the id of
    /// one still being answered took the first one's answer and the first was never answered:
    /// such a request is refused here, as `/mcp` refuses it. And each request is handed on
    /// under an id of the relay's own ([`InFlight`]), so that a client that reuses the id of a
    /// request it cancelled, before rmcp has dropped that request's late answer, is not given
    /// that answer.
    in_flight: InFlight,
}

/// Where a notification names the subscription it belongs to.
const SUBSCRIPTION_ID: &str = "/params/_meta/io.modelcontextprotocol~1subscriptionId";

/// The client's requests in flight, each under an id of the relay's own.
#[derive(Default)]
struct InFlight {
    /// The relay's id of each, by the client's.
    by_client: std::collections::HashMap<rmcp::model::RequestId, i64>,
    /// The client's id of each, by the relay's.
    by_own: std::collections::HashMap<i64, rmcp::model::RequestId>,
    next: i64,
}

impl InFlight {
    /// The relay's id for a request of the client's; `None` when one with its id is in flight.
    fn open(&mut self, client: &rmcp::model::RequestId) -> Option<rmcp::model::RequestId> {
        if self.by_client.contains_key(client) {
            return None;
        }
        self.next += 1;
        self.by_client.insert(client.clone(), self.next);
        self.by_own.insert(self.next, client.clone());
        Some(rmcp::model::RequestId::Number(self.next))
    }

    /// The client's id of an answer under the relay's `own`, the request closed; `None` for an
    /// answer to nothing in flight (a request the client cancelled).
    fn close(&mut self, own: &rmcp::model::RequestId) -> Option<rmcp::model::RequestId> {
        let rmcp::model::RequestId::Number(own) = own else { return None };
        let client = self.by_own.remove(own)?;
        self.by_client.remove(&client);
        Some(client)
    }

    /// The relay's id of the client's request it cancels, the request closed: its id is free
    /// again, and its answer, should rmcp send one, goes nowhere.
    fn cancel(&mut self, client: &rmcp::model::RequestId) -> Option<rmcp::model::RequestId> {
        let own = self.by_client.remove(client)?;
        self.by_own.remove(&own);
        Some(rmcp::model::RequestId::Number(own))
    }
}

/// The longest line read, as rmcp's stdio transport bounds it: a message that fits over HTTP
/// fits here.
const MAX_LINE: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

impl StdioLines {
    /// The transport, and the task that writes its lines to stdout; the task ends when the
    /// transport is dropped and every line is written.
    fn start(master: Master) -> (StdioLines, tokio::task::JoinHandle<()>) {
        let (out, mut lines) = mpsc::channel::<Vec<u8>>(64);
        let writer = tokio::spawn(async move {
            let mut stdout = tokio::io::stdout();
            while let Some(line) = lines.recv().await {
                if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                    // The client is gone; what it would have read goes nowhere.
                    return;
                }
            }
        });
        let lines = StdioLines {
            read: agentos_engine::lines::BoundedLines::new(tokio::io::stdin(), MAX_LINE),
            master,
            asking: None,
            refusal: None,
            out,
            opened: false,
            in_flight: InFlight::default(),
        };
        (lines, writer)
    }
}

/// A line rmcp's client reads as a message, or the line to ask the master about: one rmcp
/// cannot parse, or an `initialize` whose params do not parse (rmcp reads it as a request of a
/// method it does not know, and the master says what the params must be).
fn message_of(line: &[u8]) -> Option<ClientJsonRpcMessage> {
    let message = serde_json::from_slice::<ClientJsonRpcMessage>(line).ok()?;
    match &message {
        ClientJsonRpcMessage::Request(request) if matches!(&request.request, ClientRequest::CustomRequest(c) if c.method == "initialize") => {
            None
        }
        _ => Some(message),
    }
}

/// Whether rmcp opens a session on `request`, as its server reads a client's first messages:
/// an `initialize`, or a request other than a ping or a discovery that carries the protocol
/// version and every other key a request without a session needs.
fn opens_session(request: &ClientRequest) -> bool {
    use rmcp::model::{GetMeta, ProtocolVersion};
    match request {
        ClientRequest::InitializeRequest(_) => true,
        ClientRequest::PingRequest(_) | ClientRequest::DiscoverRequest(_) => false,
        other => {
            let meta = other.get_meta();
            meta.protocol_version().is_some() && meta.missing_required_keys(&ProtocolVersion::V_2026_07_28).is_empty()
        }
    }
}

impl Transport<RoleServer> for StdioLines {
    type Error = std::io::Error;

    fn send(
        &mut self,
        mut item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // An answer goes out under the client's id; one to a request cancelled goes nowhere.
        let answers = match &mut item {
            ServerJsonRpcMessage::Response(r) => self.in_flight.close(&r.id).map(|client| r.id = client).is_some(),
            ServerJsonRpcMessage::Error(e) => match &e.id {
                Some(id) => self.in_flight.close(id).map(|client| e.id = Some(client)).is_some(),
                None => true,
            },
            _ => true,
        };
        // A notification of a subscription names it by the id of the request that opened it
        // (`subscriptions/listen`): the client's.
        let subscription = match &item {
            ServerJsonRpcMessage::Notification(_) => {
                let own =
                    serde_json::to_value(&item).ok().and_then(|v| v.pointer(SUBSCRIPTION_ID).and_then(Value::as_i64));
                own.and_then(|own| self.in_flight.by_own.get(&own).cloned())
            }
            _ => None,
        };
        let out = self.out.clone();
        async move {
            if !answers {
                return Ok(());
            }
            let mut line = match subscription {
                Some(client) => {
                    let mut v = serde_json::to_value(&item)?;
                    if let Some(id) = v.pointer_mut(SUBSCRIPTION_ID) {
                        *id = serde_json::to_value(&client)?;
                    }
                    serde_json::to_vec(&v)?
                }
                None => serde_json::to_vec(&item)?,
            };
            line.push(b'\n');
            out.send(line).await.map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdout is closed"))
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            if let Some(asking) = &mut self.asking {
                let answer = asking.await.unwrap_or_default();
                self.asking = None;
                self.refusal = Some(answer).filter(|a| !a.is_empty());
            }
            if self.refusal.is_some() {
                // Taken only once the writer has room, so that a cancelled wait loses nothing.
                let room = self.out.reserve().await.ok()?;
                room.send(self.refusal.take()?);
            }
            match self.read.read_line().await {
                Ok(true) => {}
                // The end of stdin: a last line without its newline is not a message.
                Ok(false) => return None,
                Err(e) => {
                    errln!("agentos mcp: cannot read stdin: {e}");
                    return None;
                }
            }
            let line = std::mem::take(&mut self.read.line);
            if let Some(scan) = self.read.too_long.take() {
                let error = json!({"jsonrpc": "2.0", "id": scan.id(), "error": {"code": ErrorCode::INVALID_REQUEST.0,
                    "message": format!("the message is longer than {} MiB, the most a line may hold", MAX_LINE >> 20)}});
                let mut answer = error.to_string().into_bytes();
                answer.push(b'\n');
                self.refusal = Some(answer);
                continue;
            }
            let line = line.strip_suffix(b"\n").unwrap_or(&line);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            // As rmcp's stdio transport reads a line: a byte order mark before it is dropped.
            let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
            if line.trim_ascii().is_empty() {
                continue;
            }
            if let Some(message) = message_of(line) {
                match &message {
                    _ if self.opened => {}
                    ClientJsonRpcMessage::Request(r) => self.opened |= opens_session(&r.request),
                    // A notification, or a response to nothing asked: nothing to answer.
                    _ => continue,
                }
                let mut message = message;
                match &mut message {
                    ClientJsonRpcMessage::Request(r) => match self.in_flight.open(&r.id) {
                        Some(own) => r.id = own,
                        None => {
                            let error = json!({"jsonrpc": "2.0", "id": r.id, "error": {"code": ErrorCode::INVALID_REQUEST.0,
                            "message": format!("a request with id {} is still being answered in this session: give each request an id of its own", r.id)}});
                            let mut answer = error.to_string().into_bytes();
                            answer.push(b'\n');
                            self.refusal = Some(answer);
                            continue;
                        }
                    },
                    // A cancel names the client's id: handed on with the relay's, the request
                    // closed.
                    ClientJsonRpcMessage::Notification(n) => {
                        if let rmcp::model::ClientNotification::CancelledNotification(c) = &mut n.notification
                            && let Some(id) = &c.params.request_id
                        {
                            c.params.request_id = self.in_flight.cancel(id);
                        }
                    }
                    _ => {}
                }
                return Some(message);
            }
            let (master, line) = (self.master.clone(), line.to_vec());
            self.asking = Some(tokio::spawn(async move { master.refusal(line).await }));
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}
