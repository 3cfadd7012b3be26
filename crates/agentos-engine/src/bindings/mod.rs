//! Bindings: how each kind of tool is registered and run. One module per kind, each one
//! [`Binder`]; [`BINDERS`] lists them. The rest of the engine reaches a kind only through this
//! table, so adding a kind is its entry variant in core, its module here and its row below
//! (ARCHITECTURE.md, "Adding a binding").

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use agentos_core::command::Plan;
use agentos_core::entry::{Binding, BindingKind, StoredEntry};
use agentos_core::flags::Flag;
use agentos_core::job::{InvokeRequest, JobResult};
use agentos_core::{CoreError, ErrorKind};

use crate::prepared::PreparedOp;
use crate::{Engine, EngineError, Principal};

pub mod docker;
pub mod host;
pub mod http;
pub mod mcp;
pub mod script;
pub mod toolnet;

/// Every binding kind this master can register or run, one row each.
pub static BINDERS: &[&dyn Binder] =
    &[&script::Script, &toolnet::Toolnet, &host::Host, &http::Http, &mcp::Mcp, &docker::DockerKind];

/// The module of a kind; `None` for a kind this master does not implement.
pub fn binder(kind: BindingKind) -> Option<&'static dyn Binder> {
    BINDERS.iter().copied().find(|b| b.kind() == kind)
}

/// The module whose registration command is `command`.
pub fn by_command(command: &str) -> Option<&'static dyn Binder> {
    BINDERS.iter().copied().find(|b| b.register_command() == Some(command))
}

/// One kind of binding: validates and plans a registration, and runs one operation.
///
/// What an entry offers (its operations, with their input schemas and examples, from which
/// `--help`, the prompt and MCP are drawn) is its contract, the same for every kind; a binder
/// makes it at registration.
#[async_trait]
pub trait Binder: Send + Sync {
    fn kind(&self) -> BindingKind;

    /// The `POST /api/commands` type that registers entries of this kind; `None` when they are
    /// registered some other way (host toolkits, by whoever embeds the master).
    fn register_command(&self) -> Option<&'static str> {
        None
    }

    /// What registering entries of this kind is, for a refusal: "register scripts".
    fn registering(&self) -> &'static str {
        "register this kind of tool"
    }

    /// Whether entries of this kind always go to the global catalog, whatever the command's
    /// `model` says (http services, images: one thing for every model).
    fn global_only(&self) -> bool {
        false
    }

    /// Validates a registration command's fields (`body` without its `type`) and derives the
    /// entry and the blobs it pins. Nothing is written.
    async fn plan(&self, _engine: &Engine, _p: &Principal, _body: Value) -> Result<Plan, EngineError> {
        Err(CoreError::bad_input(
            "unknown_command",
            format!("{} tools are not registered by a command", self.kind().as_str()),
        )
        .into())
    }

    /// The blob an entry of this kind pins (its script, its net), readable by whoever sees the entry.
    fn pinned_blob<'b>(&self, _binding: &'b Binding) -> Option<&'b str> {
        None
    }

    /// The digest a secret granted to this entry is bound to; `None`: such entries are not
    /// pinned, and secrets reach them only through origin grants.
    fn secret_pin(&self, _binding: &Binding) -> Option<String> {
        None
    }

    /// Runs one operation and waits for its outcome. `call.entry` is what the tool resolved
    /// to in the caller's model, already checked visible to the caller.
    async fn invoke(&self, engine: &Engine, call: Call<'_>) -> Result<Outcome, EngineError>;

    /// Queues one operation and answers its job id at once (`Prefer: respond-async`). Kinds
    /// that answer synchronously refuse.
    async fn queue(&self, _engine: &Engine, call: Call<'_>) -> Result<String, EngineError> {
        Err(answers_synchronously(call.id, &format!("a {} tool", self.kind().as_str())))
    }
}

/// A kind whose operations answer a value at once (http services, MCP servers, containers),
/// as its refusals name it.
pub(crate) struct ValueKind {
    /// The flag that reveals the kind; calling needs it and `x`.
    pub flag: Flag,
    /// "http services".
    pub plural: &'static str,
    /// "an http service".
    pub one: &'static str,
    /// What it has several of: "operations", "tools".
    pub parts: &'static str,
}

/// One call of a [`ValueKind`], the caller's flags checked, the operation found and its input
/// checked against its schema.
pub(crate) struct ValueCall<'a> {
    pub id: &'a str,
    pub model: &'a str,
    pub entry: Arc<StoredEntry>,
    pub tool: &'a str,
    pub op: Arc<PreparedOp>,
    pub input: Value,
    pub timeout_ms: Option<u64>,
}

impl ValueKind {
    /// Calling needs `x` and the kind's flag.
    pub(crate) fn may_call(&self, p: &Principal) -> Result<(), EngineError> {
        for flag in [Flag::Execute, self.flag] {
            if !p.flags.has(flag) {
                return Err(CoreError::forbidden(format!(
                    "{} may not call {}: that needs the 'x' and '{}' flags, and '{}' ({}) is missing",
                    p.name,
                    self.plural,
                    self.flag.letter(),
                    flag.letter(),
                    flag.word()
                ))
                .into());
            }
        }
        Ok(())
    }

    /// A call's parts, once the caller may make it and names one operation.
    pub(crate) fn call<'a>(&self, call: Call<'a>) -> Result<ValueCall<'a>, EngineError> {
        let Call { principal, id, model, entry, operation, req } = call;
        self.may_call(principal)?;
        let Some(entry) = entry else {
            return Err(CoreError::internal(format!("a call of {} without its entry", self.one)).into());
        };
        let Some(FoundOperation { name: tool, prepared: op }) = operation else {
            let placeholder = self.parts.trim_end_matches('s').to_uppercase();
            return Err(CoreError::bad_input(
                "not_invocable",
                format!(
                    "{id:?} is {} of several {}: call one with `agentos-{id} {placeholder}` (a command `agentos install-shims` makes; `agentos list-tools {id}` lists them) or POST /api/tools/{id}/call",
                    self.one, self.parts
                ),
            )
            .into());
        };
        let input = req.input.unwrap_or_else(|| json!({}));
        Ok(ValueCall { id, model, entry, tool, op, input, timeout_ms: req.timeout_ms })
    }

    /// `Prefer: respond-async` refused, once the caller may call at all.
    pub(crate) fn queue(&self, call: &Call<'_>) -> EngineError {
        match self.may_call(call.principal) {
            Err(e) => e,
            Ok(()) => answers_synchronously(call.id, self.one),
        }
    }
}

/// A `timeoutMs`, when given (an invocation's, a registration's): from 1 to the master's maximum.
pub(crate) fn check_timeout(engine: &Engine, timeout_ms: Option<u64>) -> Result<(), EngineError> {
    let max = engine.inner.dispatch.config.max_timeout_ms;
    match timeout_ms {
        Some(t) if t == 0 || t > max => {
            Err(CoreError::bad_input("invalid_timeout", format!("timeoutMs must be between 1 and {max}")).into())
        }
        _ => Ok(()),
    }
}

/// A service's URL as a registration names it (`field`: `baseUrl`, `server.url`): http or https
/// with a host, and no user name or password. A credential in the URL would be stored and shown
/// in plain text and sent with no grant; it belongs in a secret, named by `auth`. Returns the
/// URL and its origin, as grants hold it.
pub(crate) fn service_url(field: &str, url: &str, code: &'static str) -> Result<(reqwest::Url, String), CoreError> {
    let parsed = reqwest::Url::parse(url).ok().filter(|u| matches!(u.scheme(), "http" | "https"));
    let Some((parsed, origin)) = parsed.and_then(|u| crate::outbound::origin_of(&u).map(|o| (u, o))) else {
        // Repeated unless it may hold a password, which nothing here can tell apart.
        let shown = if url.contains('@') { String::new() } else { format!(" {url:?}") };
        return Err(CoreError::bad_input(code, format!("{field}{shown} is not an http or https URL with a host")));
    };
    if !parsed.username().is_empty() || parsed.password().is_some() {
        let mut shown = parsed.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        return Err(CoreError::bad_input(
            code,
            format!(
                "{field} {shown} holds a user name or password: keep the credential in a secret granted to {origin} and name it in auth (basic:SECRET for a user and password, sent as user:password)"
            ),
        ));
    }
    Ok((parsed, origin))
}

/// The refusal of `Prefer: respond-async` by a kind that answers at once; `what` names it with
/// its article ("a host tool", "an http service").
pub(crate) fn answers_synchronously(id: &str, what: &str) -> EngineError {
    CoreError::bad_input(
        "async_unsupported",
        format!("{id:?} is {what}: it answers synchronously; invoke it without Prefer: respond-async"),
    )
    .into()
}

/// One operation to run.
pub struct Call<'a> {
    pub principal: &'a Principal,
    /// The toolkit's id as the caller named it.
    pub id: &'a str,
    /// The model the id was resolved in (local first, then the global catalog).
    pub model: &'a str,
    /// What the id resolved to; `None` when nothing did (a script job then ships anyway and
    /// fails at the executor with the reason, like any fire).
    pub entry: Option<Arc<StoredEntry>>,
    /// The operation, as the caller named it, its input already checked against its schema;
    /// `None` from `POST /api/tools/{id}/invoke`, which runs a tool's one operation (`run`).
    pub operation: Option<FoundOperation<'a>>,
    pub req: InvokeRequest,
}

/// An operation of the call's entry, found in its contract.
pub struct FoundOperation<'a> {
    /// As the caller named it.
    pub name: &'a str,
    /// Its schema, flag table and, for a request sent over HTTP, the request's description.
    pub(crate) prepared: Arc<PreparedOp>,
}

/// What one operation gave.
#[derive(Debug)]
pub enum Outcome {
    /// A job an executor ran: its one result, whatever its exit.
    Job(Box<JobResult>),
    /// The value the operation answered.
    Value(Value),
}

impl Outcome {
    /// As `POST /api/tools/{id}/invoke` answers it: a job's result, or `{<kind>: id, output}`.
    pub fn into_answer(self, kind: BindingKind, id: &str) -> Result<Value, EngineError> {
        match self {
            Outcome::Job(r) => Ok(serde_json::to_value(*r).map_err(|e| CoreError::internal(e.to_string()))?),
            Outcome::Value(v) => Ok(json!({kind.as_str(): id, "output": v})),
        }
    }

    /// As a shell command or an MCP client gets it: the operation's output, or the one-line
    /// error an agent can act on. A job's stdout is its output, as JSON when it parses.
    pub fn into_output(self, toolkit: &str, tool: &str) -> Result<Value, EngineError> {
        let out = match self {
            Outcome::Value(v) => return Ok(v),
            Outcome::Job(r) => r,
        };
        if out.timed_out {
            return Err(
                CoreError::new(ErrorKind::Unavailable, "timed_out", format!("{toolkit} {tool}: timed out")).into()
            );
        }
        if let Some(e) = &out.error {
            return Err(CoreError::new(ErrorKind::ToolFailed, "tool_failed", format!("{toolkit} {tool}: {e}")).into());
        }
        if out.exit_code != Some(0) {
            let how = match (out.exit_code, out.signal) {
                (Some(c), _) => format!("exit code {c}"),
                (None, Some(s)) => format!("signal {s}"),
                _ => "no exit code".into(),
            };
            let tail =
                out.stderr.lines().rev().find(|l| !l.trim().is_empty()).map(|l| format!(": {l}")).unwrap_or_default();
            return Err(CoreError::new(
                ErrorKind::ToolFailed,
                "tool_failed",
                format!("{toolkit} {tool} failed with {how}{tail}"),
            )
            .into());
        }
        let stdout = out.stdout.trim();
        Ok(serde_json::from_str(stdout).unwrap_or_else(|_| Value::String(out.stdout.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_at_most_one_module_and_each_command_one_kind() {
        for (i, a) in BINDERS.iter().enumerate() {
            for b in &BINDERS[i + 1..] {
                assert_ne!(a.kind(), b.kind(), "two modules bind {}", a.kind().as_str());
                if let Some(c) = a.register_command() {
                    assert_ne!(Some(c), b.register_command(), "two modules register with {c}");
                }
            }
        }
        assert!(binder(BindingKind::Script).is_some() && by_command("TOOL_CATALOG_REGISTER_TOOLNET").is_some());
    }
}
