//! Catalog entries: the contract (what can be called) and the binding (how it runs).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::flags::{Flag, Flags};

/// One tool as the catalog stores it (wire shape of DESIGN.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogEntry {
    pub id: String,
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub capabilities: Vec<String>,
    pub status: Status,
    pub contract: Contract,
    pub binding: Binding,
}

/// `approved`: pinned and validated by the platform. `registered`: described, never validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Approved,
    Registered,
}

/// What can be called: named operations with their input (and output) JSON Schemas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Contract {
    #[serde(rename = "type")]
    pub kind: String,
    pub operations: BTreeMap<String, Operation>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the operation's input.
    pub input: Value,
    /// JSON Schema of the operation's output, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Sample calls, shown in `--help` and the system prompt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<Example>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Example {
    pub description: String,
    pub input: Value,
}

/// How a tool runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Binding {
    Script(ScriptBinding),
    Toolnet(ToolnetBinding),
    /// Rust functions registered by whoever embeds the master; they run inside it.
    Host(HostBinding),
    /// An HTTP service described by an OpenAPI document: one operation per tool.
    Http(HttpBinding),
    /// An MCP server: each of the tools it lists is one operation.
    Mcp(McpBinding),
    /// A container image of the local registry that serves HTTP and advertises an OpenAPI
    /// document: one operation per tool, run in a container of the pinned digest.
    Docker(DockerBinding),
}

/// A container image: the reference it was imported by, the registry digest it is pinned to
/// (a call fails once the tag points elsewhere), the document it served when validated (pinned
/// as a blob), and how each operation is called, as for an http service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DockerBinding {
    /// `127.0.0.1:5001/tools/echo:1`.
    pub image: String,
    /// `sha256:<64 hex>`, the registry's digest of the tag at import.
    pub digest: String,
    /// `urn:agentos:blob:tool-catalog/openapi/<sha256>.json`.
    pub openapi_urn: String,
    pub sha256: String,
    pub size_bytes: u64,
    /// Where the container serves its document (label `agentos.openapi`).
    pub openapi_path: String,
    /// The path the document's first server puts before every operation (`/v1`), or empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub base_path: String,
    pub operations: Vec<HttpOperation>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<agentos_openapi::Skipped>,
    /// Secrets the container receives as environment variables, each granted to this entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// An MCP server: how the master reaches it, the tool list it gave when registered or when it
/// last said its list changed (pinned as a blob: the contract was drawn from it), and which
/// operation is which of its tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpBinding {
    pub server: McpServer,
    /// `urn:agentos:blob:tool-catalog/mcp/<sha256>.json`: the `tools` the server listed.
    pub tools_urn: String,
    pub sha256: String,
    pub size_bytes: u64,
    /// Each operation and the server's name of its tool.
    pub tools: Vec<McpTool>,
    /// Only these of the server's tools, by operation or server name, as registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<Vec<String>>,
    /// How long one call may take, in milliseconds; the master's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Tools the server listed that were left out, each with why (`pointer`: `/tools/3`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<agentos_openapi::Skipped>,
}

/// Where an MCP server is: a program the master starts and talks to over stdio (`command`,
/// registered by the operator only), or a streamable HTTP endpoint (`url`). Secrets are named,
/// never given: `env` maps a variable to a secret's name, `auth` names the credential's secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpServer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variable → the name of the secret whose value it gets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<HttpAuth>,
}

/// One tool of an MCP server as an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpTool {
    /// The operation's name: the tool's name in kebab-case.
    pub name: String,
    /// The tool's name on the server.
    pub tool: String,
}

/// An HTTP service: where it is, the document it was imported from (pinned like a script), the
/// credential it takes (a secret's name, never a value) and how to call each operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpBinding {
    /// Replaces the document's `servers`: every operation's path is appended to it.
    pub base_url: String,
    /// `urn:agentos:blob:tool-catalog/openapi/<sha256>.json|.yaml`.
    pub openapi_urn: String,
    pub sha256: String,
    pub size_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<HttpAuth>,
    /// How each operation (tool) is called; its input schema is the contract's.
    pub operations: Vec<HttpOperation>,
    /// Operations of the document that were left out, each with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<agentos_openapi::Skipped>,
    /// How long one call may take, in milliseconds; the master's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// The credential an HTTP service takes, injected at call time from the secret store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpAuth {
    #[serde(rename = "type")]
    pub kind: HttpAuthKind,
    /// The header or query parameter name (`header` and `query` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The secret's name.
    pub secret: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HttpAuthKind {
    /// `Authorization: Bearer <secret>`.
    Bearer,
    /// `<name>: <secret>`.
    Header,
    /// `?<name>=<secret>`.
    Query,
    /// `Authorization: Basic base64(<secret>)`, the secret being `user:password`.
    Basic,
}

/// One operation of an HTTP service as a call needs it (from `agentos_openapi::Operation`, less
/// the input schema, which the contract holds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpOperation {
    pub name: String,
    pub method: String,
    pub path: String,
    pub bindings: Vec<agentos_openapi::Binding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<agentos_openapi::RequestBody>,
}

impl HttpOperation {
    /// The operation as `agentos_openapi::build_request` takes it, with its input schema.
    pub fn to_openapi(&self, input_schema: Value) -> agentos_openapi::Operation {
        agentos_openapi::Operation {
            name: self.name.clone(),
            method: self.method.clone(),
            path: self.path.clone(),
            summary: None,
            description: None,
            input_schema,
            bindings: self.bindings.clone(),
            body: self.body.clone(),
            deprecated: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostBinding {
    pub toolkit: String,
}

impl Binding {
    pub fn kind(&self) -> BindingKind {
        match self {
            Binding::Script(_) => BindingKind::Script,
            Binding::Toolnet(_) => BindingKind::Toolnet,
            Binding::Host(_) => BindingKind::Host,
            Binding::Http(_) => BindingKind::Http,
            Binding::Mcp(_) => BindingKind::Mcp,
            Binding::Docker(_) => BindingKind::Docker,
        }
    }

    /// How operation `name` is sent as an HTTP request, for the bindings that call over HTTP
    /// (an http service, a container); `None` for the others and for a name they lack.
    pub fn http_operation(&self, name: &str) -> Option<&HttpOperation> {
        let ops = match self {
            Binding::Http(b) => &b.operations,
            Binding::Docker(b) => &b.operations,
            _ => return None,
        };
        ops.iter().find(|o| o.name == name)
    }
}

/// The kinds of binding, as named in the `type` search filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BindingKind {
    Script,
    Http,
    Docker,
    Toolnet,
    Host,
    Mcp,
}

/// Every flag that reveals some kind of entry: holding any of them lets a principal search and
/// read the catalog (it then sees the kinds its flags reveal).
pub const CATALOG_READ_FLAGS: &[Flag] =
    &[Flag::Docker, Flag::Http, Flag::ToolNets, Flag::Scripts, Flag::Mcp, Flag::Execute, Flag::Write];

impl BindingKind {
    pub const ALL: [BindingKind; 6] = [
        BindingKind::Script,
        BindingKind::Http,
        BindingKind::Docker,
        BindingKind::Toolnet,
        BindingKind::Host,
        BindingKind::Mcp,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            BindingKind::Script => "script",
            BindingKind::Http => "http",
            BindingKind::Docker => "docker",
            BindingKind::Toolnet => "toolnet",
            BindingKind::Host => "host",
            BindingKind::Mcp => "mcp",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
    /// The flags that reveal entries of this kind in search, get and history: the kind's own
    /// flag, and for tool nets also `w`, the flag that authors them, so whoever may register a
    /// tool net sees what it registered.
    pub fn revealing_flags(self) -> &'static [Flag] {
        match self {
            BindingKind::Script => &[Flag::Scripts],
            BindingKind::Http => &[Flag::Http],
            BindingKind::Docker => &[Flag::Docker],
            BindingKind::Toolnet => &[Flag::ToolNets, Flag::Write],
            BindingKind::Host => &[Flag::Execute],
            BindingKind::Mcp => &[Flag::Mcp],
        }
    }
    /// The flag that registers (and so removes) entries of this kind.
    pub fn registering_flag(self) -> Flag {
        match self {
            BindingKind::Script => Flag::Scripts,
            BindingKind::Http => Flag::Http,
            BindingKind::Docker => Flag::Docker,
            // Authoring a tool net is writing a net.
            BindingKind::Toolnet => Flag::Write,
            // Host toolkits are the embedder's; their entries belong to the operator.
            BindingKind::Host => Flag::Execute,
            BindingKind::Mcp => Flag::Mcp,
        }
    }
    pub fn visible_to(self, flags: Flags) -> bool {
        flags.any_of(self.revealing_flags())
    }
    /// Whether `flags` may call entries of this kind: seen, and `t` for a tool net (a tool net
    /// caller needs no `x`), `x` for every other kind.
    pub fn callable_by(self, flags: Flags) -> bool {
        self.visible_to(flags) && flags.has(self.call_flag())
    }
    /// The flag a call of this kind takes beside seeing it: `t` for a tool net, `x` for every
    /// other kind.
    pub fn call_flag(self) -> Flag {
        match self {
            BindingKind::Toolnet => Flag::ToolNets,
            _ => Flag::Execute,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Node,
    Sh,
    Bash,
    Python3,
}

impl Runtime {
    pub const ALL: [Runtime; 4] = [Runtime::Node, Runtime::Sh, Runtime::Bash, Runtime::Python3];
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Node => "node",
            Runtime::Sh => "sh",
            Runtime::Bash => "bash",
            Runtime::Python3 => "python3",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
    /// The extension used in the script's URN and default filename. It depends on the
    /// runtime alone so that the same content gives the same URN on every install.
    pub fn extension(self) -> &'static str {
        match self {
            Runtime::Node => "cjs",
            Runtime::Sh | Runtime::Bash => "sh",
            Runtime::Python3 => "py",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScriptBinding {
    pub runtime: Runtime,
    pub script_urn: String,
    pub sha256: String,
    pub filename: String,
    pub size_bytes: u64,
    /// The environment variables the script takes from its caller when a run carries a secret
    /// (a sealed run); every other name the caller sets is dropped there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
}

/// Names a caller may never set in a script's environment: they change what the runtime loads
/// or runs before the script's first line.
pub fn reserved_env_name(name: &str) -> bool {
    const EXACT: [&str; 8] = ["PATH", "HOME", "LANG", "BASH_ENV", "ENV", "IFS", "SHELLOPTS", "PS4"];
    const PREFIXES: [&str; 6] = ["LD_", "NODE_", "PYTHON", "BASH_FUNC_", "PERL5", "RUBY"];
    EXACT.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A tool net: a net definition in the blob store, run as one call from its input place to its output place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolnetBinding {
    pub net_urn: String,
    pub sha256: String,
    pub size_bytes: u64,
    pub input_place: String,
    pub output_place: String,
}

/// Where an entry was found relative to the model asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Local,
    Global,
}

/// An entry as the catalog holds it: the definition plus where and when it was written.
///
/// The master holds every entry of every catalog for as long as it runs, so this is the one
/// compact in-memory form of an entry: the definition as [`CompactEntry`], text that many
/// entries repeat (model, principals) shared through the state's interner, and no derived
/// copies (the free-text haystack lives only in the search index). Its serialized form (the
/// snapshot's) is the one it had as plain fields: `entry` is written as a [`CatalogEntry`].
#[derive(Debug, Clone)]
pub struct StoredEntry {
    pub entry: CompactEntry,
    pub model: Arc<str>,
    /// Sequence number of the event that wrote this definition.
    pub revision: u64,
    pub created_at: i64,
    pub updated_at: i64,
    pub updated_by: Arc<str>,
    /// The id of the principal that owns the entry: only it or the operator may replace or remove it.
    pub owner: Arc<str>,
}

fn operator_id() -> String {
    crate::OPERATOR_ID.to_string()
}

impl StoredEntry {
    /// An entry owned by the operator; its text is not shared with other entries (see [`StoredEntry::interned`]).
    pub fn new(
        entry: CatalogEntry,
        model: String,
        revision: u64,
        created_at: i64,
        updated_at: i64,
        updated_by: String,
    ) -> Self {
        let mut own = Interner::default();
        StoredEntry::interned(&mut own, entry, &model, revision, created_at, updated_at, &updated_by, None)
    }

    /// An entry whose repeated text is shared through `strings`; `owner` defaults to the operator.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn interned(
        strings: &mut Interner,
        entry: CatalogEntry,
        model: &str,
        revision: u64,
        created_at: i64,
        updated_at: i64,
        updated_by: &str,
        owner: Option<&str>,
    ) -> Self {
        StoredEntry {
            entry: CompactEntry::new(entry, strings),
            model: strings.intern(model),
            revision,
            created_at,
            updated_at,
            updated_by: strings.intern(updated_by),
            owner: strings.intern(owner.unwrap_or(crate::OPERATOR_ID)),
        }
    }

    /// Shares this entry's repeated text through `strings` (an entry read from a snapshot holds its own copies).
    pub(crate) fn intern(&mut self, strings: &mut Interner) {
        self.model = strings.intern(&self.model);
        self.updated_by = strings.intern(&self.updated_by);
        self.owner = strings.intern(&self.owner);
        self.entry.intern(strings);
    }

    pub fn view(self: &Arc<Self>, scope: Scope, shadowed: bool) -> EntryView {
        EntryView { stored: self.clone(), scope, shadowed }
    }
}

/// The snapshot form of [`StoredEntry`], unchanged from when its fields were plain.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StoredEntryOut<'a> {
    entry: CatalogEntry,
    model: &'a str,
    revision: u64,
    created_at: i64,
    updated_at: i64,
    updated_by: &'a str,
    owner: &'a str,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredEntryIn {
    entry: CatalogEntryIn,
    model: String,
    revision: u64,
    created_at: i64,
    updated_at: i64,
    updated_by: String,
    #[serde(default = "operator_id")]
    owner: String,
}

impl Serialize for StoredEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        StoredEntryOut {
            entry: self.entry.to_entry(),
            model: &self.model,
            revision: self.revision,
            created_at: self.created_at,
            updated_at: self.updated_at,
            updated_by: &self.updated_by,
            owner: &self.owner,
        }
        .serialize(s)
    }
}

/// A [`CatalogEntry`] as a snapshot holds it, its contract read as text: a snapshot is read
/// from JSON text, and the contract is kept as text.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CatalogEntryIn {
    id: String,
    name: String,
    version: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    capabilities: Vec<String>,
    status: Status,
    contract: Box<RawValue>,
    binding: Binding,
}

/// Checks that `contract` is the text of a [`Contract`]. A snapshot repeats a few contracts over
/// many entries: a text already checked on this thread (by its hash) is not parsed again.
fn check_contract(contract: &RawValue) -> Result<(), serde_json::Error> {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    thread_local! {
        static CHECKED: std::cell::RefCell<HashSet<u64>> = std::cell::RefCell::new(HashSet::new());
    }
    const MAX_CHECKED: usize = 1 << 16;
    let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(contract.get());
    if CHECKED.with(|c| c.borrow().contains(&hash)) {
        return Ok(());
    }
    crate::depth::from_str_any_depth::<Contract>(contract.get())?;
    CHECKED.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= MAX_CHECKED {
            c.clear();
        }
        c.insert(hash);
    });
    Ok(())
}

impl<'de> Deserialize<'de> for StoredEntry {
    /// Each entry owns its text here; `State::after_load` shares it again. The contract is
    /// kept as the snapshot's text, once checked to be a contract. Read from JSON text only.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let StoredEntryIn { entry, model, revision, created_at, updated_at, updated_by, owner } =
            StoredEntryIn::deserialize(d)?;
        let CatalogEntryIn { id, name, version, description, capabilities, status, contract, binding } = entry;
        check_contract(&contract).map_err(|e| serde::de::Error::custom(format!("the contract of {id}: {e}")))?;
        let mut own = Interner::default();
        let entry = CompactEntry {
            id: id.into_boxed_str(),
            name: name.into_boxed_str(),
            version: own.intern(&version),
            description: description.into_boxed_str(),
            capabilities: capabilities.iter().map(|c| own.intern(c)).collect(),
            status,
            contract: own.intern_contract(contract),
            binding,
            operations: Default::default(),
        };
        Ok(StoredEntry {
            entry,
            model: own.intern(&model),
            revision,
            created_at,
            updated_at,
            updated_by: own.intern(&updated_by),
            owner: own.intern(&owner),
        })
    }
}

/// A [`CatalogEntry`] as the master keeps it in memory. Strings are boxed (no spare capacity),
/// capabilities and the version are shared with every entry that names the same, and the contract
/// is kept as its JSON text, shared with every entry whose contract is the same: as a tree of
/// `serde_json` values a one-operation contract took about 2 KiB in two B-tree nodes, as text it
/// takes its length once per distinct contract. [`CompactEntry::to_entry`] gives the definition
/// back whole; the fields search and calls read stay typed.
#[derive(Debug, Clone)]
pub struct CompactEntry {
    pub id: Box<str>,
    pub name: Box<str>,
    pub version: Arc<str>,
    pub description: Box<str>,
    pub capabilities: Box<[Arc<str>]>,
    pub status: Status,
    /// The [`Contract`] serialized by serde_json, written out as it is when the entry is answered.
    contract: Arc<RawValue>,
    pub binding: Binding,
    /// Where each operation is in `contract`'s text, found at the first call that needs one.
    operations: std::sync::OnceLock<Option<Arc<[OperationSpan]>>>,
}

/// An operation's name and where its value is in a contract's text.
#[derive(Debug)]
struct OperationSpan {
    name: Box<str>,
    at: std::ops::Range<usize>,
}

impl CompactEntry {
    fn new(e: CatalogEntry, strings: &mut Interner) -> Self {
        let contract = serde_json::value::to_raw_value(&e.contract).expect("a contract always serializes");
        CompactEntry {
            id: e.id.into_boxed_str(),
            name: e.name.into_boxed_str(),
            version: strings.intern(&e.version),
            description: e.description.into_boxed_str(),
            capabilities: e.capabilities.iter().map(|c| strings.intern(c)).collect(),
            status: e.status,
            contract: strings.intern_contract(contract),
            binding: e.binding,
            operations: Default::default(),
        }
    }

    fn intern(&mut self, strings: &mut Interner) {
        self.version = strings.intern(&self.version);
        for c in self.capabilities.iter_mut() {
            *c = strings.intern(c);
        }
        self.contract = strings.share_contract(&self.contract);
    }

    /// The contract, parsed from its text.
    pub fn contract(&self) -> Contract {
        // Any depth: the text is what a contract of any depth serialized to.
        crate::depth::from_str_any_depth(self.contract.get()).expect("a serialized contract parses back")
    }

    /// One operation of the contract, read from its own part of the text: a call of one tool of
    /// a toolkit with hundreds (an OpenAPI document's) reads that tool's schemas, not all of them.
    pub fn operation(&self, name: &str) -> Option<Operation> {
        let Some(spans) = self.spans() else { return self.contract().operations.remove(name) };
        let i = spans.binary_search_by(|s| (*s.name).cmp(name)).ok()?;
        let text = &self.contract.get()[spans[i].at.clone()];
        Some(crate::depth::from_str_any_depth(text).expect("a serialized operation parses back"))
    }

    /// The names of the contract's operations, in order, without reading their schemas.
    pub fn operation_names(&self) -> Vec<String> {
        match self.spans() {
            Some(spans) => spans.iter().map(|s| s.name.to_string()).collect(),
            None => self.contract().operations.into_keys().collect(),
        }
    }

    /// How many operations the contract has, without reading their schemas.
    pub fn operation_count(&self) -> usize {
        match self.spans() {
            Some(spans) => spans.len(),
            None => self.contract().operations.len(),
        }
    }

    /// Whether the contract has an operation of that name, without reading its schemas.
    pub fn has_operation(&self, name: &str) -> bool {
        match self.spans() {
            Some(spans) => spans.binary_search_by(|s| (*s.name).cmp(name)).is_ok(),
            None => self.contract().operations.contains_key(name),
        }
    }

    /// Where each operation is in the contract's text, sorted by name; `None` when the text is
    /// not laid out as expected (then the whole contract is read instead).
    fn spans(&self) -> Option<&[OperationSpan]> {
        self.operations.get_or_init(|| operation_spans(self.contract.get()).map(Arc::from)).as_deref()
    }

    /// The contract as its JSON text, which an answer writes out without parsing it.
    pub fn contract_json(&self) -> &Arc<RawValue> {
        &self.contract
    }

    /// The whole definition, as registered.
    pub fn to_entry(&self) -> CatalogEntry {
        CatalogEntry {
            id: self.id.to_string(),
            name: self.name.to_string(),
            version: self.version.to_string(),
            description: self.description.to_string(),
            capabilities: self.capabilities.iter().map(|c| c.to_string()).collect(),
            status: self.status,
            contract: self.contract(),
            binding: self.binding.clone(),
        }
    }

    /// Lower-cased id, name, description and capabilities, one per line, for free-text search.
    pub fn haystack(&self) -> String {
        let mut h = String::with_capacity(self.haystack_len());
        h.push_str(&self.id);
        h.push('\n');
        h.push_str(&self.name);
        h.push('\n');
        h.push_str(&self.description);
        for c in self.capabilities.iter() {
            h.push('\n');
            h.push_str(c);
        }
        h.to_lowercase()
    }

    /// The length of [`CompactEntry::haystack`] before lower-casing, which changes it only for some non-ASCII text.
    pub fn haystack_len(&self) -> usize {
        let caps: usize = self.capabilities.iter().map(|c| c.len() + 1).sum();
        self.id.len() + self.name.len() + self.description.len() + 2 + caps
    }
}

/// Each operation's name and the bytes of its value in a contract's JSON text, sorted by name: one
/// scan of the text, brackets matched outside strings, no value built. `None` for text that is not
/// an object whose `operations` member is an object with distinct names.
fn operation_spans(text: &str) -> Option<Vec<OperationSpan>> {
    let b = text.as_bytes();
    let space = |mut i: usize| {
        while b.get(i).is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r')) {
            i += 1;
        }
        i
    };
    // The index just past a string that opens at `i`.
    let string_end = |mut i: usize| {
        i += 1;
        loop {
            match b.get(i)? {
                b'\\' => i += 2,
                b'"' => return Some(i + 1),
                _ => i += 1,
            }
        }
    };
    // The index just past the value that starts at `i`.
    let value_end = |mut i: usize| match b.get(i)? {
        b'"' => string_end(i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            loop {
                match b.get(i)? {
                    b'"' => {
                        i = string_end(i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            while b.get(i).is_some_and(|c| !matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')) {
                i += 1;
            }
            Some(i)
        }
    };
    // The members of the object that opens at `i`: each key, decoded, and its value's bytes.
    let members = |i: usize| -> Option<Vec<(String, std::ops::Range<usize>)>> {
        let mut out = Vec::new();
        if b.get(i) != Some(&b'{') {
            return None;
        }
        let mut i = space(i + 1);
        if b.get(i) == Some(&b'}') {
            return Some(out);
        }
        loop {
            if b.get(i) != Some(&b'"') {
                return None;
            }
            let key_end = string_end(i)?;
            let key: String = serde_json::from_str(&text[i..key_end]).ok()?;
            i = space(key_end);
            if b.get(i) != Some(&b':') {
                return None;
            }
            let start = space(i + 1);
            let end = value_end(start)?;
            out.push((key, start..end));
            i = space(end);
            match b.get(i)? {
                b',' => i = space(i + 1),
                b'}' => return Some(out),
                _ => return None,
            }
        }
    };
    let top = members(space(0))?;
    let (_, at) = top.into_iter().find(|(k, _)| k == "operations")?;
    let mut spans: Vec<OperationSpan> =
        members(at.start)?.into_iter().map(|(name, at)| OperationSpan { name: name.into(), at }).collect();
    spans.sort_by(|a, b| a.name.cmp(&b.name));
    if spans.windows(2).any(|w| w[0].name == w[1].name) {
        return None;
    }
    Some(spans)
}

/// The same definition as `other`; the contract is compared as values, as [`CatalogEntry`] compares it.
impl PartialEq<CatalogEntry> for CompactEntry {
    fn eq(&self, other: &CatalogEntry) -> bool {
        *self.id == *other.id
            && *self.name == *other.name
            && *self.version == *other.version
            && *self.description == *other.description
            && self.capabilities.len() == other.capabilities.len()
            && self.capabilities.iter().zip(&other.capabilities).all(|(a, b)| **a == **b)
            && self.status == other.status
            && self.binding == other.binding
            && self.contract() == other.contract
    }
}

/// Text held once however many entries repeat it. An entry keeps an `Arc` to what it uses; text no
/// entry uses any more is dropped by a purge, run whenever the set has doubled since the last one, so
/// the set stays within about twice what is in use at a constant cost per call.
#[derive(Debug, Default)]
pub(crate) struct Interner {
    strings: Pool<str>,
    contracts: Pool<RawValue>,
}

/// A copy starts empty: the one copy made is the snapshot's, which never interns, and sharing the
/// set would hold every text it names alive in both.
impl Clone for Interner {
    fn clone(&self) -> Self {
        Interner::default()
    }
}

impl Interner {
    pub(crate) fn intern(&mut self, s: &str) -> Arc<str> {
        self.strings.get(s).unwrap_or_else(|| self.strings.insert(Arc::from(s)))
    }

    /// The contract text `c` holds, shared with every entry whose contract is the same.
    fn intern_contract(&mut self, c: Box<RawValue>) -> Arc<RawValue> {
        self.contracts.get(c.get()).unwrap_or_else(|| self.contracts.insert(Arc::from(c)))
    }

    fn share_contract(&mut self, c: &Arc<RawValue>) -> Arc<RawValue> {
        self.contracts.get(c.get()).unwrap_or_else(|| self.contracts.insert(c.clone()))
    }
}

/// Shared values found by their text: a value the pool alone holds is dropped at the next purge.
struct Pool<T: ?Sized + Text> {
    set: HashSet<ByText<T>>,
    /// The size of the set after the last purge.
    purged: usize,
}

impl<T: ?Sized + Text> std::fmt::Debug for Pool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("len", &self.set.len()).finish()
    }
}

impl<T: ?Sized + Text> Default for Pool<T> {
    fn default() -> Self {
        Pool { set: HashSet::new(), purged: 0 }
    }
}

impl<T: ?Sized + Text> Pool<T> {
    /// Purges wait for at least this many values, so a small catalog never purges.
    const MIN_PURGE: usize = 1024;

    fn get(&self, text: &str) -> Option<Arc<T>> {
        self.set.get(text).map(|v| v.0.clone())
    }

    fn insert(&mut self, value: Arc<T>) -> Arc<T> {
        self.set.insert(ByText(value.clone()));
        if self.set.len() > (2 * self.purged).max(Self::MIN_PURGE) {
            // Only the set holds what is counted once.
            self.set.retain(|t| Arc::strong_count(&t.0) > 1);
            self.purged = self.set.len();
        }
        value
    }
}

/// A value with a text that identifies it.
trait Text {
    fn text(&self) -> &str;
}

impl Text for str {
    fn text(&self) -> &str {
        self
    }
}

impl Text for RawValue {
    fn text(&self) -> &str {
        self.get()
    }
}

/// Hashed and compared by its text, so a pool is searched with a `&str`.
struct ByText<T: ?Sized + Text>(Arc<T>);

impl<T: ?Sized + Text> std::hash::Hash for ByText<T> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.0.text().hash(h)
    }
}

impl<T: ?Sized + Text> PartialEq for ByText<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.text() == other.0.text()
    }
}

impl<T: ?Sized + Text> Eq for ByText<T> {}

impl<T: ?Sized + Text> std::borrow::Borrow<str> for ByText<T> {
    fn borrow(&self) -> &str {
        self.0.text()
    }
}

/// An entry as answered by get and search: the stored entry, shared with the catalog, and how
/// the reader finds it. It serializes as the definition's fields with `model`, `scope`,
/// `shadowed`, `revision`, `createdAt`, `updatedAt` and `updatedBy` beside them; the contract is
/// written out as the text it is kept as.
#[derive(Debug, Clone)]
pub struct EntryView {
    pub stored: Arc<StoredEntry>,
    pub scope: Scope,
    /// True for a global entry hidden by a local entry with the same id.
    pub shadowed: bool,
}

impl EntryView {
    /// The entry's definition, whole.
    pub fn entry(&self) -> &CompactEntry {
        &self.stored.entry
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EntryViewOut<'a> {
    id: &'a str,
    name: &'a str,
    version: &'a str,
    description: &'a str,
    capabilities: Vec<&'a str>,
    status: Status,
    contract: &'a RawValue,
    binding: &'a Binding,
    model: &'a str,
    scope: Scope,
    shadowed: bool,
    revision: u64,
    created_at: String,
    updated_at: String,
    updated_by: &'a str,
}

impl Serialize for EntryView {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (st, e) = (&*self.stored, &self.stored.entry);
        EntryViewOut {
            id: &e.id,
            name: &e.name,
            version: &e.version,
            description: &e.description,
            capabilities: e.capabilities.iter().map(|c| &**c).collect(),
            status: e.status,
            contract: &e.contract,
            binding: &e.binding,
            model: &st.model,
            scope: self.scope,
            shadowed: self.shadowed,
            revision: st.revision,
            created_at: crate::time::format_time(st.created_at),
            updated_at: crate::time::format_time(st.updated_at),
            updated_by: &st.updated_by,
        }
        .serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_auth_with_a_field_it_does_not_know_is_refused() {
        let ok: HttpAuth = serde_json::from_value(json!({"type": "bearer", "secret": "TOKEN"})).unwrap();
        assert_eq!(ok.kind, HttpAuthKind::Bearer);
        // A raw `value` beside the secret's name used to be dropped without a word.
        let e = serde_json::from_value::<HttpAuth>(json!({"type": "bearer", "secret": "TOKEN", "value": "raw"}))
            .unwrap_err();
        assert!(e.to_string().contains("unknown field `value`"), "{e}");
    }

    fn script(id: &str, contract: Value) -> CatalogEntry {
        serde_json::from_value(json!({
            "id": id,
            "name": "A Tool",
            "version": "1.0.0",
            "description": "Fetches ÄRGER",
            "capabilities": ["cap-1", "group-2"],
            "status": "approved",
            "contract": contract,
            "binding": {
                "type": "script",
                "runtime": "sh",
                "scriptUrn": "urn:agentos:blob:tool-catalog/scripts/0.sh",
                "sha256": "0",
                "filename": "run.sh",
                "sizeBytes": 4,
                "env": ["TOKEN"]
            }
        }))
        .unwrap()
    }

    /// The contract survives the compact form whole, and compares as values do.
    #[test]
    fn a_compact_entry_gives_back_the_definition_it_was_made_of() {
        let deep = (0..200).fold(json!({"type": "object"}), |v, _| json!({"not": v}));
        let contracts = [
            json!({"type": "script-io", "operations": {}}),
            json!({"type": "script-io", "operations": {"run": {"description": "", "input": {"type": "object"}}}}),
            json!({"type": "x", "operations": {
                "b": {"description": "d", "input": {"type": "object", "properties": {"n": {"type": "number", "maximum": 1.5e300}}},
                      "output": {"type": "array"}, "examples": [{"description": "e", "input": {"n": -0.25}}]},
                "a": {"description": "d", "input": null}
            }}),
            json!({"type": "deep", "operations": {"run": {"description": "", "input": deep}}}),
        ];
        let mut strings = Interner::default();
        for contract in contracts {
            let entry = script("t", contract.clone());
            let compact = CompactEntry::new(entry.clone(), &mut strings);
            assert_eq!(compact.to_entry(), entry, "{contract}");
            assert!(compact == entry);
            let mut other = entry.clone();
            other.contract.kind.push('!');
            assert!(compact != other, "a changed contract compares unequal");
            let mut other = entry.clone();
            other.capabilities.pop();
            assert!(compact != other, "a changed capability list compares unequal");
        }
    }

    /// One operation read from its own part of the contract's text is the one the whole contract
    /// holds, however the text is laid out; text that is not laid out as a contract's is read whole.
    #[test]
    fn an_operation_read_alone_is_the_one_the_whole_contract_holds() {
        let deep = (0..300).fold(json!({"type": "object"}), |v, _| json!({"not": v}));
        let contract = json!({"type": "x", "operations": {
            "b": {"description": "brackets } ] { [ and \"quotes\" \\", "input": {"type": "object", "properties": {"n": {"type": "number", "maximum": 1.5e300}}},
                  "output": {"type": "array"}, "examples": [{"description": "e", "input": {"n": -0.25, "s": "}\\"}}]},
            "a": {"description": "d", "input": null},
            "é \" \\ ünïcode": {"description": "", "input": true},
            "deep": {"description": "", "input": deep},
            "z": {"description": "", "input": {"type": "object"}}
        }});
        let whole: Contract = serde_json::from_value(contract.clone()).unwrap();
        let pretty = serde_json::to_string_pretty(&contract).unwrap();
        // The same contract as texts a snapshot may hold: compact, spaced out, keys in another order.
        let texts = [
            serde_json::to_string(&whole).unwrap(),
            pretty.clone(),
            pretty.replace("\n", "\r\n\t "),
            format!(r#"{{ "operations" : {} , "type":"x" }}"#, serde_json::to_string(&contract["operations"]).unwrap()),
        ];
        for text in texts {
            let spans = operation_spans(&text).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(spans.len(), whole.operations.len());
            let mut entry =
                CompactEntry::new(script("t", json!({"type": "x", "operations": {}})), &mut Interner::default());
            entry.contract = RawValue::from_string(text.clone()).unwrap().into();
            assert_eq!(entry.operation_names(), whole.operations.keys().cloned().collect::<Vec<_>>());
            assert_eq!(entry.operation_count(), whole.operations.len());
            for (name, op) in &whole.operations {
                assert_eq!(entry.operation(name).as_ref(), Some(op), "{name}");
                assert!(entry.has_operation(name));
            }
            assert_eq!(entry.operation("nope"), None);
            assert!(!entry.has_operation("nope") && !entry.has_operation("b "));
        }
        for (text, spans) in [
            (r#"{"type":"x","operations":{}}"#, Some(0)),
            (r#"{"type":"x"}"#, None),
            (r#"{"type":"x","operations":[]}"#, None),
            (r#"{"type":"x","operations":{"a":{},"a":{}}}"#, None),
            (r#"{"type":"x","operations":{"a":{"input":"unterminated}}"#, None),
            (r#"[]"#, None),
        ] {
            assert_eq!(operation_spans(text).map(|s| s.len()), spans, "{text}");
        }
    }

    /// A view is the definition's fields with where and when beside them, the contract as registered.
    #[test]
    fn a_view_serializes_as_the_definition_with_its_place_and_times() {
        let entry = script(
            "t",
            json!({"type": "script-io", "operations": {"run": {"description": "d", "input": {"type": "object", "b": 1, "a": [2.5, null]}}}}),
        );
        let stored = StoredEntry::new(entry.clone(), "m1".into(), 9, 0, 1_000, "ann".into());
        let mut want = serde_json::to_value(&entry).unwrap();
        let extra = json!({"model": "m1", "scope": "local", "shadowed": false, "revision": 9,
            "createdAt": "1970-01-01T00:00:00.000Z", "updatedAt": "1970-01-01T00:00:01.000Z", "updatedBy": "ann"});
        want.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        assert_eq!(serde_json::to_value(Arc::new(stored).view(Scope::Local, false)).unwrap(), want);
    }

    /// Snapshots written before the compact form load, and snapshots written now read the same.
    #[test]
    fn the_snapshot_form_of_a_stored_entry_is_unchanged() {
        /// `StoredEntry` as it was declared before the compact form (`haystack` was never serialized).
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Before {
            entry: CatalogEntry,
            model: String,
            revision: u64,
            created_at: i64,
            updated_at: i64,
            updated_by: String,
            owner: String,
        }
        let entry = script("t", json!({"type": "script-io", "operations": {"run": {"description": "", "input": {}}}}));
        let before = Before {
            entry,
            model: "m".into(),
            revision: 7,
            created_at: 1,
            updated_at: 2,
            updated_by: "alice".into(),
            owner: "p-1".into(),
        };
        let old = serde_json::to_string(&before).unwrap();
        let stored: StoredEntry = serde_json::from_str(&old).unwrap();
        assert_eq!(serde_json::to_string(&stored).unwrap(), old);
        let mut without_owner = serde_json::to_value(&before).unwrap();
        without_owner.as_object_mut().unwrap().remove("owner");
        let stored: StoredEntry = serde_json::from_str(&without_owner.to_string()).unwrap();
        assert_eq!(&*stored.owner, crate::OPERATOR_ID);
        let mut not_a_contract = serde_json::to_value(&before).unwrap();
        not_a_contract["entry"]["contract"] = json!({"operations": 3});
        let err = serde_json::from_str::<StoredEntry>(&not_a_contract.to_string()).unwrap_err();
        assert!(err.to_string().contains("the contract of t"), "{err}");
    }

    #[test]
    fn the_interner_shares_text_and_drops_what_no_entry_uses() {
        let mut strings = Interner::default();
        let kept = strings.intern("kept");
        assert!(Arc::ptr_eq(&kept, &strings.intern("kept")));
        const MIN: usize = Pool::<str>::MIN_PURGE;
        for i in 0..10 * MIN {
            strings.intern(&format!("gone-{i}"));
            assert!(strings.strings.set.len() <= 2 * MIN, "{} texts after {i}", strings.strings.set.len());
        }
        assert!(Arc::ptr_eq(&kept, &strings.intern("kept")), "text in use survives purges");
        let contract =
            |i: usize| serde_json::value::to_raw_value(&json!({"type": "x", "operations": {}, "n": i})).unwrap();
        let shared = strings.intern_contract(contract(0));
        assert!(Arc::ptr_eq(&shared, &strings.intern_contract(contract(0))), "the same contract text is held once");
        for i in 1..10 * MIN {
            strings.intern_contract(contract(i));
            assert!(strings.contracts.set.len() <= 2 * MIN, "{} contracts after {i}", strings.contracts.set.len());
        }
        assert!(Arc::ptr_eq(&shared, &strings.intern_contract(contract(0))), "a contract in use survives purges");
    }
}
