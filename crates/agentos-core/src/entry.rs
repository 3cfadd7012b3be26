//! Catalog entries: the contract (what can be called) and the binding (how it runs).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
        }
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
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredEntry {
    pub entry: CatalogEntry,
    pub model: String,
    /// Sequence number of the event that wrote this definition.
    pub revision: u64,
    pub created_at: i64,
    pub updated_at: i64,
    pub updated_by: String,
    /// The id of the principal that owns the entry: only it or the operator may replace or remove it.
    #[serde(default = "operator_id")]
    pub owner: String,
    /// Lower-cased id, name, description and capabilities, for free-text search. Derived.
    #[serde(skip)]
    pub haystack: String,
}

fn operator_id() -> String {
    crate::OPERATOR_ID.to_string()
}

impl StoredEntry {
    pub fn new(
        entry: CatalogEntry,
        model: String,
        revision: u64,
        created_at: i64,
        updated_at: i64,
        updated_by: String,
    ) -> Self {
        let mut s = StoredEntry {
            entry,
            model,
            revision,
            created_at,
            updated_at,
            updated_by,
            owner: operator_id(),
            haystack: String::new(),
        };
        s.rebuild_haystack();
        s
    }
    pub fn rebuild_haystack(&mut self) {
        let e = &self.entry;
        let mut h = String::with_capacity(e.id.len() + e.name.len() + e.description.len() + 16);
        h.push_str(&e.id);
        h.push('\n');
        h.push_str(&e.name);
        h.push('\n');
        h.push_str(&e.description);
        for c in &e.capabilities {
            h.push('\n');
            h.push_str(c);
        }
        self.haystack = h.to_lowercase();
    }
    pub fn view(&self, scope: Scope, shadowed: bool) -> EntryView {
        EntryView {
            entry: self.entry.clone(),
            model: self.model.clone(),
            scope,
            shadowed,
            revision: self.revision,
            created_at: crate::time::format_time(self.created_at),
            updated_at: crate::time::format_time(self.updated_at),
            updated_by: self.updated_by.clone(),
        }
    }
}

/// An entry as answered by get and search.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
