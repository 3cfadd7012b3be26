//! The catalog on the wire: entries and their views, search pages, history, models, and the
//! commands of `POST /api/commands`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use agentos_core::{entry, event, search, state, time};

/// One tool as the catalog stores it (wire shape of DESIGN.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CatalogEntry {
    #[schema(example = "forum-sentinel")]
    pub id: String,
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub capabilities: Vec<String>,
    pub status: Status,
    #[schema(value_type = Contract)]
    pub contract: ContractJson,
    pub binding: Binding,
}

impl From<entry::CatalogEntry> for CatalogEntry {
    fn from(e: entry::CatalogEntry) -> Self {
        let entry::CatalogEntry { id, name, version, description, capabilities, status, contract, binding } = e;
        CatalogEntry {
            id,
            name,
            version,
            description,
            capabilities,
            status: status.into(),
            contract: ContractJson::of(&contract),
            binding: binding.into(),
        }
    }
}

/// `approved`: pinned and validated by the platform. `registered`: described, never validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Approved,
    Registered,
}

impl From<entry::Status> for Status {
    fn from(s: entry::Status) -> Self {
        match s {
            entry::Status::Approved => Status::Approved,
            entry::Status::Registered => Status::Registered,
        }
    }
}

/// A [`Contract`] as JSON text: an entry's contract is kept as text and written out as it is,
/// never parsed to answer a read.
#[derive(Debug, Clone)]
pub struct ContractJson(Arc<RawValue>);

impl ContractJson {
    fn of(contract: &entry::Contract) -> Self {
        ContractJson(Arc::from(serde_json::value::to_raw_value(contract).expect("a contract always serializes")))
    }
}

impl PartialEq for ContractJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Serialize for ContractJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (*self.0).serialize(s)
    }
}

impl<'de> Deserialize<'de> for ContractJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Through a value: a raw value reads only from text, and answers are also read from values.
        let value = Value::deserialize(d)?;
        let raw = serde_json::value::to_raw_value(&value).map_err(serde::de::Error::custom)?;
        Ok(ContractJson(Arc::from(raw)))
    }
}

/// What can be called: named operations with their input (and output) JSON Schemas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Contract {
    #[serde(rename = "type")]
    #[schema(example = "script-io")]
    pub kind: String,
    pub operations: BTreeMap<String, Operation>,
}

impl From<entry::Contract> for Contract {
    fn from(c: entry::Contract) -> Self {
        let entry::Contract { kind, operations } = c;
        Contract { kind, operations: operations.into_iter().map(|(k, op)| (k, op.into())).collect() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Operation {
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the operation's input.
    #[schema(value_type = Object)]
    pub input: Value,
    /// JSON Schema of the operation's output, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
    /// Sample calls, shown in `--help` and the system prompt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<Example>,
}

impl From<entry::Operation> for Operation {
    fn from(op: entry::Operation) -> Self {
        let entry::Operation { description, input, output, examples } = op;
        Operation { description, input, output, examples: examples.into_iter().map(Example::from).collect() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Example {
    pub description: String,
    #[schema(value_type = Object)]
    pub input: Value,
}

impl From<entry::Example> for Example {
    fn from(e: entry::Example) -> Self {
        let entry::Example { description, input } = e;
        Example { description, input }
    }
}

/// How a tool runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Binding {
    Script(ScriptBinding),
    Toolnet(ToolnetBinding),
    /// Rust functions registered by whoever embeds the master; they run inside it.
    Host(HostBinding),
    /// An HTTP service described by an OpenAPI document: one operation per tool.
    Http(HttpBinding),
    /// An MCP server: each tool it lists is one operation.
    Mcp(McpBinding),
    /// A container image of the local registry serving an OpenAPI document: one operation per
    /// tool, run in a container of the pinned digest.
    Docker(DockerBinding),
}

/// A container image: its reference, the registry digest it is pinned to, its pinned document
/// and how each operation is called.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DockerBinding {
    #[schema(example = "127.0.0.1:5001/tools/echo:1")]
    pub image: String,
    /// The registry digest of the tag at import; a call fails once the tag points elsewhere.
    #[schema(example = "sha256:df6ff312a2c0955727f8735dcc93686f684fb8fc3eac8a87288c87f4596af6d1")]
    pub digest: String,
    pub openapi_urn: String,
    pub sha256: String,
    pub size_bytes: u64,
    /// Where the container serves its document (image label `agentos.openapi`).
    pub openapi_path: String,
    /// The path the document's first server puts before every operation (`/v1`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub base_path: String,
    #[schema(value_type = Vec<Object>)]
    pub operations: Vec<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Object>)]
    pub skipped: Vec<Value>,
    /// Secrets the container receives as environment variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl From<entry::DockerBinding> for DockerBinding {
    fn from(d: entry::DockerBinding) -> Self {
        let entry::DockerBinding {
            image,
            digest,
            openapi_urn,
            sha256,
            size_bytes,
            openapi_path,
            base_path,
            operations,
            skipped,
            secrets,
            timeout_ms,
        } = d;
        let values = |v: Vec<_>| v.into_iter().filter_map(|o| serde_json::to_value(o).ok()).collect();
        let skipped = skipped.into_iter().filter_map(|o| serde_json::to_value(o).ok()).collect();
        DockerBinding {
            image,
            digest,
            openapi_urn,
            sha256,
            size_bytes,
            openapi_path,
            base_path,
            operations: values(operations),
            skipped,
            secrets,
            timeout_ms,
        }
    }
}

/// An MCP server: how the master reaches it, its pinned tool list, and which operation is
/// which of its tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpBinding {
    pub server: McpServer,
    /// The `tools` the server listed, as it listed them.
    #[schema(
        example = "urn:agentos:blob:tool-catalog/mcp/df6ff312a2c0955727f8735dcc93686f684fb8fc3eac8a87288c87f4596af6d1.json"
    )]
    pub tools_urn: String,
    pub sha256: String,
    pub size_bytes: u64,
    /// Each operation and the server's name of its tool.
    pub tools: Vec<McpTool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Tools the server listed that were left out, each with its `pointer` (`/tools/3`) and
    /// `reason`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Object>)]
    pub skipped: Vec<Value>,
}

impl From<entry::McpBinding> for McpBinding {
    fn from(m: entry::McpBinding) -> Self {
        let entry::McpBinding { server, tools_urn, sha256, size_bytes, tools, include, timeout_ms, skipped } = m;
        McpBinding {
            server: server.into(),
            tools_urn,
            sha256,
            size_bytes,
            tools: tools.into_iter().map(|t| McpTool { name: t.name, tool: t.tool }).collect(),
            include,
            timeout_ms,
            skipped: skipped.into_iter().filter_map(|o| serde_json::to_value(o).ok()).collect(),
        }
    }
}

/// Where an MCP server is: exactly one of `command` (a program the master starts and talks to
/// over stdio; the operator's to register) and `url` (a streamable HTTP endpoint). Secrets are
/// named, never given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpServer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "python3")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variable → the name of the secret whose value it gets (command servers).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "https://mcp.example.com/mcp")]
    pub url: Option<String>,
    /// The credential of a url server, by the name of a secret granted to its origin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<HttpAuth>,
}

impl From<entry::McpServer> for McpServer {
    fn from(s: entry::McpServer) -> Self {
        let entry::McpServer { command, args, env, url, auth } = s;
        McpServer { command, args, env, url, auth: auth.map(Into::into) }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpTool {
    /// The operation's name.
    pub name: String,
    /// The tool's name on the server.
    pub tool: String,
}

impl From<entry::Binding> for Binding {
    fn from(b: entry::Binding) -> Self {
        match b {
            entry::Binding::Script(s) => Binding::Script(s.into()),
            entry::Binding::Toolnet(t) => Binding::Toolnet(t.into()),
            entry::Binding::Host(h) => Binding::Host(h.into()),
            entry::Binding::Http(h) => Binding::Http(h.into()),
            entry::Binding::Mcp(m) => Binding::Mcp(m.into()),
            entry::Binding::Docker(d) => Binding::Docker(d.into()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostBinding {
    pub toolkit: String,
}

impl From<entry::HostBinding> for HostBinding {
    fn from(h: entry::HostBinding) -> Self {
        let entry::HostBinding { toolkit } = h;
        HostBinding { toolkit }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Node,
    Sh,
    Bash,
    Python3,
}

impl From<entry::Runtime> for Runtime {
    fn from(r: entry::Runtime) -> Self {
        match r {
            entry::Runtime::Node => Runtime::Node,
            entry::Runtime::Sh => Runtime::Sh,
            entry::Runtime::Bash => Runtime::Bash,
            entry::Runtime::Python3 => Runtime::Python3,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScriptBinding {
    pub runtime: Runtime,
    #[schema(
        example = "urn:agentos:blob:tool-catalog/scripts/df6ff312a2c0955727f8735dcc93686f684fb8fc3eac8a87288c87f4596af6d1.cjs"
    )]
    pub script_urn: String,
    pub sha256: String,
    pub filename: String,
    pub size_bytes: u64,
    /// The environment variables the script takes from its caller when a run carries a secret
    /// (a sealed run); every other name the caller sets is dropped there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
}

impl From<entry::ScriptBinding> for ScriptBinding {
    fn from(s: entry::ScriptBinding) -> Self {
        let entry::ScriptBinding { runtime, script_urn, sha256, filename, size_bytes, env } = s;
        ScriptBinding { runtime: runtime.into(), script_urn, sha256, filename, size_bytes, env }
    }
}

/// A tool net: a net definition in the blob store, run as one call from its input place to its output place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolnetBinding {
    pub net_urn: String,
    pub sha256: String,
    pub size_bytes: u64,
    pub input_place: String,
    pub output_place: String,
}

impl From<entry::ToolnetBinding> for ToolnetBinding {
    fn from(t: entry::ToolnetBinding) -> Self {
        let entry::ToolnetBinding { net_urn, sha256, size_bytes, input_place, output_place } = t;
        ToolnetBinding { net_urn, sha256, size_bytes, input_place, output_place }
    }
}

/// An HTTP service: where it is, its pinned OpenAPI document, the credential it takes (a
/// secret's name, never a value) and how each operation is called.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpBinding {
    #[schema(example = "https://api.example.com/v1")]
    pub base_url: String,
    #[schema(
        example = "urn:agentos:blob:tool-catalog/openapi/df6ff312a2c0955727f8735dcc93686f684fb8fc3eac8a87288c87f4596af6d1.json"
    )]
    pub openapi_urn: String,
    pub sha256: String,
    pub size_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<HttpAuth>,
    /// How each operation is called: method, path, where each input property goes, the body.
    #[schema(value_type = Vec<Object>)]
    pub operations: Vec<Value>,
    /// Operations of the document left out, each with its JSON pointer and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Object>)]
    pub skipped: Vec<Value>,
    /// How long one call may take, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// The operations are shown as the engine writes them: what the importer made of the document
/// is `agentos_openapi`'s to shape, and the API passes it through.
impl From<entry::HttpBinding> for HttpBinding {
    fn from(h: entry::HttpBinding) -> Self {
        let entry::HttpBinding { base_url, openapi_urn, sha256, size_bytes, auth, operations, skipped, timeout_ms } = h;
        let values = |v: Vec<_>| v.into_iter().filter_map(|o| serde_json::to_value(o).ok()).collect();
        let skipped = skipped.into_iter().filter_map(|o| serde_json::to_value(o).ok()).collect();
        HttpBinding {
            base_url,
            openapi_urn,
            sha256,
            size_bytes,
            auth: auth.map(Into::into),
            operations: values(operations),
            skipped,
            timeout_ms,
        }
    }
}

/// The credential an HTTP service takes: a secret by name, injected at call time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpAuth {
    /// `bearer` (`Authorization: Bearer`), `header` (the header `name`), `query` (the query
    /// parameter `name`) or `basic` (`Authorization: Basic`, the secret being `user:password`).
    #[serde(rename = "type")]
    #[schema(example = "bearer")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The name of a secret granted to the service's origin (`agentos secret grant NAME --origin ORIGIN`).
    #[schema(example = "GITHUB_TOKEN")]
    pub secret: String,
}

impl From<entry::HttpAuth> for HttpAuth {
    fn from(a: entry::HttpAuth) -> Self {
        let entry::HttpAuth { kind, name, secret } = a;
        let kind = match kind {
            entry::HttpAuthKind::Bearer => "bearer",
            entry::HttpAuthKind::Header => "header",
            entry::HttpAuthKind::Query => "query",
            entry::HttpAuthKind::Basic => "basic",
        };
        HttpAuth { kind: kind.into(), name, secret }
    }
}

/// Where an entry was found relative to the model asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Local,
    Global,
}

impl From<entry::Scope> for Scope {
    fn from(s: entry::Scope) -> Self {
        match s {
            entry::Scope::Local => Scope::Local,
            entry::Scope::Global => Scope::Global,
        }
    }
}

/// An entry as answered by get and search.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EntryView {
    #[serde(flatten)]
    pub entry: CatalogEntry,
    /// The model whose catalog holds the entry (`default` for global entries).
    pub model: String,
    pub scope: Scope,
    /// True for a global entry hidden by a local entry with the same id.
    #[serde(default)]
    pub shadowed: bool,
    /// Sequence number of the event that wrote this definition.
    pub revision: u64,
    pub created_at: String,
    pub updated_at: String,
    pub updated_by: String,
}

impl From<entry::EntryView> for EntryView {
    fn from(v: entry::EntryView) -> Self {
        let entry::EntryView { stored, scope, shadowed } = v;
        let e = &stored.entry;
        EntryView {
            entry: CatalogEntry {
                id: e.id.to_string(),
                name: e.name.to_string(),
                version: e.version.to_string(),
                description: e.description.to_string(),
                capabilities: e.capabilities.iter().map(|c| c.to_string()).collect(),
                status: e.status.into(),
                contract: ContractJson(e.contract_json().clone()),
                binding: e.binding.clone().into(),
            },
            model: stored.model.to_string(),
            scope: scope.into(),
            shadowed,
            revision: stored.revision,
            created_at: time::format_time(stored.created_at),
            updated_at: time::format_time(stored.updated_at),
            updated_by: stored.updated_by.to_string(),
        }
    }
}

/// The answer of get and search for one entry, in the shape of [`EntryView`] (the document's
/// schema, which a test holds it to), written straight from the entry the catalog holds: a
/// page of entries is copied nowhere on its way out.
#[derive(Debug, Clone)]
pub struct EntryAnswer(entry::EntryView);

impl From<entry::EntryView> for EntryAnswer {
    fn from(v: entry::EntryView) -> Self {
        EntryAnswer(v)
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EntryAnswerOut<'a> {
    id: &'a str,
    name: &'a str,
    version: &'a str,
    description: &'a str,
    capabilities: Vec<&'a str>,
    status: Status,
    contract: &'a RawValue,
    binding: Binding,
    model: &'a str,
    scope: Scope,
    shadowed: bool,
    revision: u64,
    created_at: String,
    updated_at: String,
    updated_by: &'a str,
}

impl Serialize for EntryAnswer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let entry::EntryView { stored, scope, shadowed } = &self.0;
        let e = &stored.entry;
        EntryAnswerOut {
            id: &e.id,
            name: &e.name,
            version: &e.version,
            description: &e.description,
            capabilities: e.capabilities.iter().map(|c| &**c).collect(),
            status: e.status.into(),
            contract: e.contract_json(),
            binding: e.binding.clone().into(),
            model: &stored.model,
            scope: (*scope).into(),
            shadowed: *shadowed,
            revision: stored.revision,
            created_at: time::format_time(stored.created_at),
            updated_at: time::format_time(stored.updated_at),
            updated_by: &stored.updated_by,
        }
        .serialize(s)
    }
}

/// The answer of a search, in the shape of [`SearchPage`].
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SearchAnswer {
    items: Vec<EntryAnswer>,
    total: usize,
    limit: usize,
    offset: usize,
}

impl From<search::SearchPage> for SearchAnswer {
    fn from(p: search::SearchPage) -> Self {
        let search::SearchPage { items, total, limit, offset } = p;
        SearchAnswer { items: items.into_iter().map(EntryAnswer).collect(), total, limit, offset }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchPage {
    pub items: Vec<EntryView>,
    /// Number of matching entries in all pages.
    pub total: usize,
    pub limit: usize,
    pub offset: usize,
}

impl From<search::SearchPage> for SearchPage {
    fn from(p: search::SearchPage) -> Self {
        let search::SearchPage { items, total, limit, offset } = p;
        SearchPage { items: items.into_iter().map(EntryView::from).collect(), total, limit, offset }
    }
}

/// The definitions an entry has had, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct History {
    pub id: String,
    /// The model whose catalog the history belongs to.
    pub model: String,
    pub scope: Scope,
    pub events: Vec<EventView>,
}

impl From<agentos_engine::History> for History {
    fn from(h: agentos_engine::History) -> Self {
        let agentos_engine::History { id, model, scope, events } = h;
        History { id, model, scope: scope.into(), events: events.into_iter().map(EventView::from).collect() }
    }
}

/// An event as answered by the API (history, audit).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    pub seq: u64,
    pub model: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    pub principal: String,
    pub time: String,
    /// Schema version the event was written with.
    pub v: u32,
}

impl From<event::EventView> for EventView {
    fn from(e: event::EventView) -> Self {
        let event::EventView { seq, model, kind, payload, principal, time, v } = e;
        EventView { seq, model, kind, payload, principal, time, v }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelView {
    pub name: String,
    pub created_at: String,
    pub created_by: String,
    pub places: Vec<PlaceView>,
}

impl From<state::ModelView> for ModelView {
    fn from(m: state::ModelView) -> Self {
        let state::ModelView { name, created_at, created_by, places } = m;
        ModelView { name, created_at, created_by, places: places.into_iter().map(PlaceView::from).collect() }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlaceView {
    pub name: String,
    /// Number of tokens in the place.
    pub tokens: usize,
}

impl From<state::PlaceView> for PlaceView {
    fn from(p: state::PlaceView) -> Self {
        let state::PlaceView { name, tokens } = p;
        PlaceView { name, tokens }
    }
}

// The commands below document `POST /api/commands` only: its body is parsed by
// `agentos_engine::commands::Command::parse` and the binders, and a test holds both to one JSON shape. (A `///`
// line here would change the document's description.)

/// `TOOL_CATALOG_REGISTER_SCRIPT`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterScript {
    #[schema(example = "nightly-digest")]
    pub id: String,
    pub name: String,
    /// One of `node`, `sh`, `bash`, `python3`.
    #[schema(example = "node")]
    pub runtime: String,
    /// The script as text. Exactly one of `content` and `contentBase64`.
    #[serde(default)]
    pub content: Option<String>,
    /// The script as base64, for content that is not UTF-8.
    #[serde(default)]
    pub content_base64: Option<String>,
    /// Where to register: a model name, or `default` for the global catalog. Defaults to the caller's home model.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub capabilities: Option<Vec<String>>,
    /// File name the executor gives the script; reduced to a safe base name.
    #[serde(default)]
    pub filename: Option<String>,
    /// JSON Schema of the script's input (sent as JSON on stdin).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub input: Option<Value>,
    /// Environment variable names the script takes from its caller in a run that carries a
    /// secret; other names are dropped there. At most 32; `PATH`, `HOME`, `LANG`, `LD_*`,
    /// `NODE_*`, `PYTHON*`, `BASH_ENV` and `ENV` are refused.
    #[serde(default)]
    pub env: Option<Vec<String>>,
}

/// `TOOL_CATALOG_REGISTER_TOOLNET`: a net run as one tool, from its input place to its output place.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterToolnet {
    #[schema(example = "triage-flow")]
    pub id: String,
    pub name: String,
    /// The net document (places and transitions), as `PUT /api/models/{model}/net` takes it.
    #[schema(value_type = super::NetDoc)]
    pub net: Value,
    /// The place an invocation's input is put into.
    pub input_place: String,
    /// The place whose first token is the invocation's answer.
    pub output_place: String,
    /// Where to register: a model name, or `default` for the global catalog. Defaults to the caller's home model.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub capabilities: Option<Vec<String>>,
    /// JSON Schema of the input token's data.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub input: Option<Value>,
}

/// `TOOL_CATALOG_REGISTER_HTTP`: an HTTP service by its base URL and OpenAPI document (3.0 or
/// 3.1); every operation becomes a tool. Global, `registered`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterHttp {
    #[schema(example = "petstore")]
    pub id: String,
    pub name: String,
    /// Replaces the document's `servers`: `https://api.example.com/v1`.
    pub base_url: String,
    /// The document: a JSON or YAML string, or a JSON object. Exactly one of `openapi` and `openapiUrl`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub openapi: Option<Value>,
    /// Where the master fetches the document (through its outbound policy; redirects within the same origin only).
    #[serde(default)]
    pub openapi_url: Option<String>,
    /// The credential, by the name of a secret granted to the service's origin.
    #[serde(default)]
    pub auth: Option<HttpAuth>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub capabilities: Option<Vec<String>>,
    /// Keep only these operations, by tool name.
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// How long one call may take, in milliseconds (the master's default and maximum apply).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// `TOOL_CATALOG_REGISTER_MCP`: an MCP server; the master connects, lists its tools, pins the
/// list, and each tool becomes an operation of toolkit `id`. Needs `m`; a `command` server
/// needs the operator.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterMcp {
    #[schema(example = "weather")]
    pub id: String,
    pub name: String,
    /// Where to register: a model name, or `default` for the global catalog. Defaults to the caller's home model.
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

/// `TOOL_CATALOG_IMPORT_IMAGE`: an image already in the local registry; the master pulls it,
/// validates it in a throwaway container, reads and pins its OpenAPI document and the tag's
/// digest, and catalogs it as an approved global toolkit. Needs `d`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImportImage {
    #[schema(example = "127.0.0.1:5001/tools/echo:1")]
    pub image: String,
    #[schema(example = "echo")]
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    /// Secrets the container may receive as environment variables, each granted to this entry by
    /// the operator.
    #[serde(default)]
    pub secrets: Option<Vec<String>>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub capabilities: Option<Vec<String>>,
    /// How long one call may take, in milliseconds (the master's default and maximum apply).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// `TOOL_CATALOG_SEARCH`: the same filters as `GET /api/tool-catalog`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SearchArgs {
    #[serde(default, rename = "toolType", alias = "bindingType")]
    pub tool_type: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub q: Option<String>,
    #[serde(default)]
    pub capability: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub offset: Option<usize>,
}

/// `TOOL_CATALOG_GET`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GetArgs {
    pub id: String,
    #[serde(default)]
    pub model: Option<String>,
}

/// `TOOL_CATALOG_REMOVE`: removes an entry from one model's catalog (`default` for the global one).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemoveArgs {
    pub id: String,
    #[serde(default)]
    pub model: Option<String>,
}

/// How an entry is called as a shell command: `agentos-{id} {operation} --flag value`, with the
/// `--help` text of each operation, as the shim prints it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EntryHelp {
    /// `agentos-{id}`.
    pub command: String,
    /// Each operation's `--help`.
    pub operations: std::collections::BTreeMap<String, String>,
}
