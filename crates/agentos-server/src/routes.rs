//! The one table of routes and the permission each needs. The auth layer reads it; tests walk it.

use agentos_core::flags::{Flag, Flags};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// No token needed.
    Public,
    /// Any valid token.
    Authenticated,
    /// This flag.
    Flag(Flag),
    /// Any one of these flags.
    AnyOf(&'static [Flag]),
    /// The operator only.
    Operator,
    /// An executor credential only: the executor protocol.
    Executor,
}

impl Permission {
    pub fn allows(self, flags: Flags) -> bool {
        match self {
            Permission::Public | Permission::Authenticated => true,
            // Decided on the principal's kind, not its flags (see `auth`).
            Permission::Operator | Permission::Executor => false,
            Permission::Flag(f) => flags.has(f),
            Permission::AnyOf(fs) => flags.any_of(fs),
        }
    }
    pub fn describe(self) -> String {
        match self {
            Permission::Public => "nothing".into(),
            Permission::Authenticated => "a valid token".into(),
            Permission::Operator => "the operator".into(),
            Permission::Executor => "an executor credential".into(),
            Permission::Flag(f) => format!("the '{}' ({}) flag", f.letter(), f.word()),
            Permission::AnyOf(fs) => {
                let letters: Vec<String> = fs.iter().map(|f| format!("'{}'", f.letter())).collect();
                format!("one of the flags {}", letters.join(", "))
            }
        }
    }
}

/// Catalog search and get: granted by any flag that reveals a kind of tool (`x` reveals host
/// tools, `w` the tool nets it authors); the engine then shows only the kinds the caller's flags reveal.
pub const CATALOG_READ: &[Flag] = agentos_core::entry::CATALOG_READ_FLAGS;

/// Which model a route touches, and so which model the caller must be allowed to use
/// (its home model, one the operator granted it, its own tool-net instance; the operator any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelRule {
    /// No model's data.
    None,
    /// The `{model}` path parameter: checked by the auth layer before the handler runs, so a
    /// refused request writes nothing.
    Path,
    /// The `?model=` query parameter (absent: the caller's home model or the global catalog),
    /// checked by the engine where it resolves the model.
    Query,
    /// Decided per resource by the engine: a blob by the entry or job output it belongs to, a
    /// job by its model, events and models listed only for the models the caller may use.
    Resource,
}

pub struct RouteSpec {
    pub method: &'static str,
    /// The path as axum matches it.
    pub path: &'static str,
    pub permission: Permission,
    pub model: ModelRule,
}

const fn route(method: &'static str, path: &'static str, permission: Permission) -> RouteSpec {
    let model = if has_model_param(path) { ModelRule::Path } else { ModelRule::None };
    RouteSpec { method, path, permission, model }
}

const fn with_model(method: &'static str, path: &'static str, permission: Permission, model: ModelRule) -> RouteSpec {
    RouteSpec { method, path, permission, model }
}

/// Whether `path` holds `{model}`.
const fn has_model_param(path: &str) -> bool {
    let (p, n) = (path.as_bytes(), b"{model}");
    let mut i = 0;
    while i + n.len() <= p.len() {
        let mut j = 0;
        while j < n.len() && p[i + j] == n[j] {
            j += 1;
        }
        if j == n.len() {
            return true;
        }
        i += 1;
    }
    false
}

pub const ROUTES: &[RouteSpec] = &[
    route("GET", "/healthz", Permission::Public),
    route("GET", "/api/openapi.json", Permission::Authenticated),
    with_model("GET", "/api/models", Permission::Flag(Flag::Read), ModelRule::Resource),
    with_model("GET", "/api/tool-catalog", Permission::AnyOf(CATALOG_READ), ModelRule::Query),
    with_model("GET", "/api/tool-catalog/{id}", Permission::AnyOf(CATALOG_READ), ModelRule::Query),
    with_model("GET", "/api/tool-catalog/{id}/history", Permission::AnyOf(CATALOG_READ), ModelRule::Query),
    with_model("GET", "/api/tool-catalog/{id}/help", Permission::AnyOf(CATALOG_READ), ModelRule::Query),
    route("GET", "/api/me", Permission::Authenticated),
    // Each command type declares its own permission: see `commands`.
    with_model("POST", "/api/commands", Permission::Authenticated, ModelRule::Query),
    with_model("GET", "/api/blobs/{*urn}", Permission::Flag(Flag::Read), ModelRule::Resource),
    // Scripts need 'x', tool nets 't': the engine checks the kind it finds.
    with_model("POST", "/api/tools/{id}/invoke", Permission::AnyOf(&[Flag::Execute, Flag::ToolNets]), ModelRule::Query),
    with_model("POST", "/api/tools/{id}/call", Permission::AnyOf(&[Flag::Execute, Flag::ToolNets]), ModelRule::Query),
    route("POST", "/api/agents", Permission::Operator),
    route("GET", "/api/agents", Permission::Operator),
    route("DELETE", "/api/agents/{name}", Permission::Operator),
    route("POST", "/api/agents/{name}/grants", Permission::Operator),
    route("DELETE", "/api/agents/{name}/grants/{model}", Permission::Operator),
    route("PUT", "/api/secrets/{name}", Permission::Operator),
    route("GET", "/api/secrets", Permission::Operator),
    route("POST", "/api/secrets/{name}/grants", Permission::Operator),
    route("GET", "/api/secret-grants", Permission::Operator),
    route("DELETE", "/api/secret-grants/{id}", Permission::Operator),
    with_model("GET", "/api/events", Permission::Flag(Flag::Logs), ModelRule::Resource),
    // The new model's name is in the body: the engine checks it is the caller's to create.
    with_model("POST", "/api/models", Permission::Flag(Flag::Write), ModelRule::Resource),
    route("GET", "/api/models/{model}/net", Permission::Flag(Flag::Read)),
    route("PUT", "/api/models/{model}/net", Permission::Flag(Flag::Write)),
    route("GET", "/api/models/{model}/places/{place}/tokens", Permission::Flag(Flag::Read)),
    route("POST", "/api/models/{model}/places/{place}/tokens", Permission::Flag(Flag::Write)),
    route("GET", "/api/models/{model}/links", Permission::Flag(Flag::Read)),
    route("GET", "/api/models/{model}/watch", Permission::Flag(Flag::Read)),
    route("POST", "/api/models/{model}/transitions/{transition}/start", Permission::Flag(Flag::Execute)),
    route("POST", "/api/models/{model}/transitions/{transition}/stop", Permission::Flag(Flag::Execute)),
    route("POST", "/api/models/{model}/transitions/{transition}/fire", Permission::Flag(Flag::Execute)),
    route("GET", "/api/models/{model}/parked", Permission::Flag(Flag::Read)),
    route("POST", "/api/models/{model}/parked/{token}/retry", Permission::Flag(Flag::Execute)),
    route("POST", "/api/models/{model}/parked/{token}/discard", Permission::Flag(Flag::Write)),
    route("GET", "/api/executors", Permission::Flag(Flag::Read)),
    // The engine decides: `l` in the job's model, or the job's own invoker (`job`).
    with_model("GET", "/api/jobs/{id}", Permission::Authenticated, ModelRule::Resource),
    // The engine decides, as for the job itself (`job_output`).
    with_model("GET", "/api/jobs/{id}/stdout", Permission::Authenticated, ModelRule::Resource),
    with_model("GET", "/api/jobs/{id}/stderr", Permission::Authenticated, ModelRule::Resource),
    // The engine decides: the job's own invoker, or the operator (`cancel_job`).
    with_model("POST", "/api/jobs/{id}/cancel", Permission::Authenticated, ModelRule::Resource),
    // Each job listed is one the caller invoked, or one of a model it may read logs of.
    with_model("GET", "/api/jobs", Permission::Authenticated, ModelRule::Resource),
    route("POST", "/api/executor-tokens", Permission::Operator),
    route("POST", "/api/executor/poll", Permission::Executor),
    route("POST", "/api/executor/stopped", Permission::Executor),
    route("POST", "/api/executor/jobs/{id}/heartbeat", Permission::Executor),
    route("POST", "/api/executor/jobs/{id}/release", Permission::Executor),
    route("POST", "/api/executor/jobs/{id}/result", Permission::Executor),
];

/// The permission of each command type sent to `POST /api/commands`, from the engine's one
/// command table (each binding kind's registration, then the catalog's own commands).
pub fn commands() -> Vec<(&'static str, Permission)> {
    agentos_engine::commands::commands().into_iter().map(|c| (c.name, permission_of(c.needs))).collect()
}

fn permission_of(needs: agentos_engine::commands::Needs) -> Permission {
    match needs {
        agentos_engine::commands::Needs::Flag(f) => Permission::Flag(f),
        agentos_engine::commands::Needs::AnyOf(fs) => Permission::AnyOf(fs),
    }
}

pub fn route_spec(method: &str, path: &str) -> Option<&'static RouteSpec> {
    ROUTES.iter().find(|r| r.method == method && r.path == path)
}

pub fn command_permission(kind: &str) -> Option<Permission> {
    agentos_engine::commands::command(kind).map(|c| permission_of(c.needs))
}
