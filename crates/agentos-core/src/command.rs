//! Commands sent to `POST /api/commands`: parsing, validation, and the decision of which events they produce.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::entry::{Binding, BindingKind, CatalogEntry, Contract, Operation, Runtime, ScriptBinding, Status};
use crate::event::EventBody;
use crate::name::{check_capability, check_model_name, check_text, check_tool_id, safe_filename};
use crate::state::State;
use crate::urn::BlobUrn;
use crate::{CoreError, ErrorKind, sha256_hex};

/// The blob namespace of script content.
pub const SCRIPT_NAMESPACE: &str = "tool-catalog/scripts";

/// Limits that registration enforces; configurable on the master.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_script_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_script_bytes: 1024 * 1024 }
    }
}

/// Every command the API accepts, by its `type`.
#[derive(Debug, Clone)]
pub enum Command {
    RegisterScript(RegisterScript),
    Search(SearchArgs),
    Get(GetArgs),
    Remove(RemoveArgs),
    RegisterToolnet(RegisterToolnet),
}

pub const COMMAND_TYPES: [&str; 5] = [
    "TOOL_CATALOG_REGISTER_SCRIPT",
    "TOOL_CATALOG_REGISTER_TOOLNET",
    "TOOL_CATALOG_SEARCH",
    "TOOL_CATALOG_GET",
    "TOOL_CATALOG_REMOVE",
];

impl Command {
    /// Parses a command body. Errors name the command type and the offending field.
    pub fn parse(mut body: Value) -> Result<Command, CoreError> {
        let obj = body.as_object_mut().ok_or_else(|| {
            CoreError::bad_input("invalid_command", "a command must be a JSON object with a \"type\" field")
        })?;
        let kind = match obj.remove("type") {
            Some(Value::String(s)) => s,
            Some(_) => {
                return Err(CoreError::bad_input("invalid_command", "the command \"type\" must be a string"));
            }
            None => {
                return Err(CoreError::bad_input(
                    "invalid_command",
                    format!("the command has no \"type\"; expected one of {}", COMMAND_TYPES.join(", ")),
                ));
            }
        };
        match kind.as_str() {
            "TOOL_CATALOG_REGISTER_SCRIPT" => Ok(Command::RegisterScript(fields(&kind, body)?)),
            "TOOL_CATALOG_SEARCH" => Ok(Command::Search(fields(&kind, body)?)),
            "TOOL_CATALOG_GET" => Ok(Command::Get(fields(&kind, body)?)),
            "TOOL_CATALOG_REMOVE" => Ok(Command::Remove(fields(&kind, body)?)),
            "TOOL_CATALOG_REGISTER_TOOLNET" => Ok(Command::RegisterToolnet(fields(&kind, body)?)),
            other => Err(CoreError::bad_input(
                "unknown_command",
                format!("unknown command type {other:?}; expected one of {}", COMMAND_TYPES.join(", ")),
            )),
        }
    }
}

fn fields<T: DeserializeOwned>(kind: &str, body: Value) -> Result<T, CoreError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." { String::new() } else { format!(" at {path}") };
        CoreError::bad_input("invalid_command", format!("invalid {kind} command{at}: {}", e.inner()))
    })
}

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

/// A validated registration: the entry to write, the bytes to store, the model it goes to.
#[derive(Debug, Clone)]
pub struct ScriptPlan {
    pub model: String,
    pub entry: CatalogEntry,
    pub urn: BlobUrn,
    pub bytes: Vec<u8>,
}

impl RegisterScript {
    /// Validates every field and derives the entry. Nothing is written.
    pub fn plan(self, home_model: &str, limits: &Limits) -> Result<ScriptPlan, CoreError> {
        check_tool_id(&self.id)?;
        check_text("name", &self.name, 200, true)?;
        let runtime = Runtime::parse(&self.runtime).ok_or_else(|| {
            CoreError::bad_input(
                "unknown_runtime",
                format!("unknown runtime {:?}; use one of node, sh, bash, python3", self.runtime),
            )
        })?;
        let model = self.model.unwrap_or_else(|| home_model.to_string());
        check_model_name(&model)?;
        let version = self.version.unwrap_or_else(|| "1.0.0".to_string());
        check_text("version", &version, 64, true)?;
        let description = self.description.unwrap_or_default();
        check_text("description", &description, 4096, false)?;
        let capabilities = self.capabilities.unwrap_or_default();
        if capabilities.len() > 32 {
            return Err(CoreError::bad_input("too_many_capabilities", "at most 32 capabilities are allowed"));
        }
        for c in &capabilities {
            check_capability(c)?;
        }
        let bytes = match (self.content, self.content_base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(b64)) => {
                // A base64 body larger than 4/3 of the cap cannot decode under it: refuse before decoding.
                if b64.len() / 4 * 3 > limits.max_script_bytes + 3 {
                    return Err(too_large(b64.len() / 4 * 3, limits));
                }
                base64::engine::general_purpose::STANDARD.decode(b64.trim()).map_err(|e| {
                    CoreError::bad_input("invalid_base64", format!("contentBase64 is not valid base64: {e}"))
                })?
            }
            (Some(_), Some(_)) => {
                return Err(CoreError::bad_input("invalid_command", "give either content or contentBase64, not both"));
            }
            (None, None) => {
                return Err(CoreError::bad_input(
                    "missing_field",
                    "the script has no content: give content (text) or contentBase64",
                ));
            }
        };
        if bytes.is_empty() {
            return Err(CoreError::bad_input("empty_content", "the script content is empty"));
        }
        if bytes.len() > limits.max_script_bytes {
            return Err(too_large(bytes.len(), limits));
        }
        let input = self.input.unwrap_or_else(|| serde_json::json!({"type": "object"}));
        if !input.is_object() {
            return Err(CoreError::bad_input(
                "invalid_schema",
                "input must be a JSON Schema object, e.g. {\"type\":\"object\",\"properties\":{...}}",
            ));
        }
        let ext = runtime.extension();
        let filename = match self.filename.as_deref() {
            Some(raw) if raw.split(['/', '\\']).any(|c| c == "..") => {
                return Err(CoreError::bad_input(
                    "invalid_filename",
                    format!(
                        "filename {raw:?} climbs out of its folder with '..'; give a plain file name such as \"{}.{ext}\"",
                        self.id
                    ),
                ));
            }
            Some(raw) => safe_filename(raw).ok_or_else(|| {
                CoreError::bad_input(
                    "invalid_filename",
                    format!("filename {raw:?} has no usable base name; use letters, digits, '.', '_' and '-'"),
                )
            })?,
            None => format!("{}.{ext}", self.id),
        };
        let env = self.env.unwrap_or_default();
        if env.len() > 32 {
            return Err(CoreError::bad_input("invalid_env", "env names at most 32 variables"));
        }
        for name in &env {
            let shaped = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.len() <= 128
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !shaped {
                return Err(CoreError::bad_input(
                    "invalid_env",
                    format!("env name {name:?}: use letters, digits and '_', not starting with a digit"),
                ));
            }
            if crate::entry::reserved_env_name(name) {
                return Err(CoreError::bad_input(
                    "invalid_env",
                    format!("env name {name:?} is reserved: the runtime reads it before the script runs"),
                ));
            }
        }
        let sha256 = sha256_hex(&bytes);
        let urn = BlobUrn::new(SCRIPT_NAMESPACE, &sha256, Some(ext))?;
        let mut operations = BTreeMap::new();
        operations.insert(
            "run".to_string(),
            Operation {
                description: if description.is_empty() { self.name.clone() } else { description.clone() },
                input,
                output: None,
                examples: Vec::new(),
            },
        );
        let entry = CatalogEntry {
            id: self.id,
            name: self.name,
            version,
            description,
            capabilities,
            status: Status::Approved,
            contract: Contract { kind: "script-io".into(), operations },
            binding: Binding::Script(ScriptBinding {
                runtime,
                script_urn: urn.to_string(),
                sha256,
                filename,
                size_bytes: bytes.len() as u64,
                env,
            }),
        };
        Ok(ScriptPlan { model, entry, urn, bytes })
    }
}

fn too_large(len: usize, limits: &Limits) -> CoreError {
    CoreError::new(
        ErrorKind::TooLarge,
        "content_too_large",
        format!(
            "the script is {len} bytes; the limit is {} bytes (the master's --max-script-bytes)",
            limits.max_script_bytes
        ),
    )
}

/// The blob namespace of tool net definitions.
pub const TOOLNET_NAMESPACE: &str = "tool-catalog/toolnets";

/// `TOOL_CATALOG_REGISTER_TOOLNET`: a net run as one tool, from its input place to its output place.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterToolnet {
    pub id: String,
    pub name: String,
    /// The net document (places and transitions).
    #[schema(value_type = Object)]
    pub net: Value,
    pub input_place: String,
    pub output_place: String,
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

/// A validated tool net registration.
#[derive(Debug, Clone)]
pub struct ToolnetPlan {
    pub model: String,
    pub entry: CatalogEntry,
    pub urn: BlobUrn,
    pub bytes: Vec<u8>,
}

impl RegisterToolnet {
    pub fn plan(self, home_model: &str) -> Result<ToolnetPlan, CoreError> {
        check_tool_id(&self.id)?;
        check_text("name", &self.name, 200, true)?;
        let model = self.model.unwrap_or_else(|| home_model.to_string());
        check_model_name(&model)?;
        let version = self.version.unwrap_or_else(|| "1.0.0".to_string());
        check_text("version", &version, 64, true)?;
        let description = self.description.unwrap_or_default();
        check_text("description", &description, 4096, false)?;
        let capabilities = self.capabilities.unwrap_or_default();
        for c in &capabilities {
            check_capability(c)?;
        }
        let doc = crate::net::NetDoc::from_value(self.net)?;
        doc.validate()?;
        let places = doc.place_ids();
        for (field, p) in [("inputPlace", &self.input_place), ("outputPlace", &self.output_place)] {
            if !places.contains(p.as_str()) {
                return Err(CoreError::bad_input("invalid_net", format!("{field} {p:?} is not a place of the net")));
            }
        }
        let input = self.input.unwrap_or_else(|| serde_json::json!({"type": "object"}));
        if !input.is_object() {
            return Err(CoreError::bad_input("invalid_schema", "input must be a JSON Schema object"));
        }
        let bytes = serde_json::to_vec(&doc).map_err(|e| CoreError::internal(e.to_string()))?;
        let sha256 = sha256_hex(&bytes);
        let urn = BlobUrn::new(TOOLNET_NAMESPACE, &sha256, Some("json"))?;
        let mut operations = BTreeMap::new();
        operations.insert(
            "run".to_string(),
            Operation {
                description: if description.is_empty() { self.name.clone() } else { description.clone() },
                input,
                output: None,
                examples: Vec::new(),
            },
        );
        let entry = CatalogEntry {
            id: self.id,
            name: self.name,
            version,
            description,
            capabilities,
            status: Status::Approved,
            contract: Contract { kind: "toolnet".into(), operations },
            binding: Binding::Toolnet(crate::entry::ToolnetBinding {
                net_urn: urn.to_string(),
                sha256,
                size_bytes: bytes.len() as u64,
                input_place: self.input_place,
                output_place: self.output_place,
            }),
        };
        Ok(ToolnetPlan { model, entry, urn, bytes })
    }
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

/// Decides the events that write `entry` into `model`'s catalog.
pub fn decide_register(
    state: &State,
    model: &str,
    entry: CatalogEntry,
    actor: &Actor,
) -> Result<Vec<(String, EventBody)>, CoreError> {
    let mut events = Vec::with_capacity(2);
    if !state.model_exists(model) {
        events.push((model.to_string(), EventBody::ModelCreated { name: model.to_string() }));
    }
    if let Some(existing) = state.catalog(model).and_then(|c| c.get(&entry.id)) {
        check_owner(state, model, existing, actor, "replace")?;
        let (old, new) = (existing.entry.binding.kind(), entry.binding.kind());
        if old != new {
            return Err(CoreError::conflict(format!(
                "tool {:?} in model {model:?} is a {} tool; it cannot become a {} tool. Remove it first (TOOL_CATALOG_REMOVE) or choose another id",
                entry.id,
                old.as_str(),
                new.as_str()
            )));
        }
        if existing.entry == entry {
            // The same definition again changes nothing, so it writes nothing.
            return Ok(events);
        }
    }
    events.push((model.to_string(), EventBody::ToolRegistered { entry, owner: Some(actor.id.to_string()) }));
    Ok(events)
}

/// Who asks for a change, as the core decides about it.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    /// The principal's id.
    pub id: &'a str,
    pub name: &'a str,
    pub operator: bool,
}

/// An entry belongs to whoever registered it: another principal's entry is replaced or removed
/// by the operator only, so no agent can swap the code behind a tool every model runs.
fn check_owner(
    state: &State,
    model: &str,
    existing: &crate::entry::StoredEntry,
    actor: &Actor,
    what: &str,
) -> Result<(), CoreError> {
    if actor.operator || *existing.owner == *actor.id {
        return Ok(());
    }
    let owner = match state.principal_by_id(&existing.owner) {
        Some(p) => format!("{:?}", p.name),
        None if *existing.owner == *crate::event::OPERATOR_ID => "the operator".to_string(),
        None => format!("a revoked principal ({})", existing.owner),
    };
    Err(CoreError::forbidden(format!(
        "{} may not {what} tool {:?} in model {model:?}: it belongs to {owner}; only its owner or the operator may. Choose another id",
        actor.name, existing.entry.id
    )))
}

/// Decides the event that removes `id` from `model`'s catalog.
pub fn decide_remove(
    state: &State,
    model: &str,
    id: &str,
    actor: &Actor,
) -> Result<Vec<(String, EventBody)>, CoreError> {
    match state.catalog(model).and_then(|c| c.get(id)) {
        Some(existing) => {
            check_owner(state, model, existing, actor, "remove")?;
            Ok(vec![(model.to_string(), EventBody::ToolRemoved { id: id.to_string() })])
        }
        None => Err(CoreError::not_found(format!("no tool {id:?} in the catalog of model {model:?}"))),
    }
}

/// The binding kind an entry would have, for permission checks before a command runs.
pub fn binding_kind_of(cmd: &Command) -> Option<BindingKind> {
    match cmd {
        Command::RegisterScript(_) => Some(BindingKind::Script),
        Command::RegisterToolnet(_) => Some(BindingKind::Toolnet),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(v: Value) -> Result<ScriptPlan, CoreError> {
        match Command::parse(v)? {
            Command::RegisterScript(r) => r.plan("default", &Limits { max_script_bytes: 16 }),
            other => panic!("parsed as {other:?}"),
        }
    }

    fn check(v: Value, code: &str) {
        let err = plan(v).unwrap_err();
        assert_eq!(err.code, code, "{}", err.message);
    }

    #[test]
    fn refuses_bad_registrations() {
        let base = json!({"type":"TOOL_CATALOG_REGISTER_SCRIPT","id":"x","name":"X","runtime":"sh","content":"echo"});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            b
        };
        check(with("runtime", json!("ruby")), "unknown_runtime");
        check(with("id", json!("Bad_Id")), "invalid_id");
        check(with("content", json!("x".repeat(17))), "content_too_large");
        check(with("filename", json!("../..")), "invalid_filename");
        check(with("filename", json!("../../etc/passwd")), "invalid_filename");
        check(with("filename", json!("a\\..\\b.sh")), "invalid_filename");
        check(with("filename", json!("/")), "invalid_filename");
        check(with("model", json!("../m")), "invalid_model");
        check(with("input", json!(3)), "invalid_schema");
        check(with("surprise", json!(1)), "invalid_command");
        check(json!({"type":"NOPE"}), "unknown_command");
        check(json!({"id":"x"}), "invalid_command");
    }

    #[test]
    fn same_content_same_urn_and_safe_filename() {
        let a = plan(json!({"type":"TOOL_CATALOG_REGISTER_SCRIPT","id":"a","name":"A","runtime":"node","content":"1","filename":"/opt/tools/x.cjs"})).unwrap();
        let b = plan(json!({"type":"TOOL_CATALOG_REGISTER_SCRIPT","id":"b","name":"B","runtime":"node","content":"1"}))
            .unwrap();
        assert_eq!(a.urn, b.urn);
        let Binding::Script(s) = &a.entry.binding else { panic!("a script entry") };
        assert_eq!(s.filename, "x.cjs");
        assert_eq!(s.script_urn, format!("urn:agentos:blob:tool-catalog/scripts/{}.cjs", sha256_hex(b"1")));
    }
}
