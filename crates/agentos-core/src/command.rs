//! Catalog commands: the checks every registration shares, the plan a registration makes, the
//! arguments of search, get and remove, and the decisions of which events they produce.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::CoreError;
use crate::entry::{Binding, CatalogEntry, Contract, Operation, Status};
use crate::event::EventBody;
use crate::name::{check_capability, check_label, check_model_name, check_text, check_tool_id};
use crate::state::State;
use crate::urn::BlobUrn;

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

/// Parses a command's fields into `T`. Errors name the command type and the offending field.
pub fn fields<T: DeserializeOwned>(kind: &str, body: Value) -> Result<T, CoreError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." { String::new() } else { format!(" at {path}") };
        CoreError::bad_input("invalid_command", format!("invalid {kind} command{at}: {}", e.inner()))
    })
}

/// A validated registration of any binding kind: the entry to write, the model it goes to, and
/// the blobs it pins (stored before the entry is committed).
#[derive(Debug, Clone)]
pub struct Plan {
    pub model: String,
    pub entry: CatalogEntry,
    pub blobs: Vec<(BlobUrn, Vec<u8>)>,
}

/// What every registration says about its entry besides the binding, checked one way for
/// every kind.
#[derive(Debug, Clone)]
pub struct Header {
    pub id: String,
    pub name: String,
    pub model: String,
    pub version: String,
    pub description: String,
    pub capabilities: Vec<String>,
}

/// The fields of [`Header`] as a registration command carries them.
#[derive(Debug, Clone, Default)]
pub struct HeaderFields {
    pub id: String,
    pub name: String,
    pub model: Option<String>,
    pub version: Option<String>,
    pub description: Option<String>,
    pub capabilities: Option<Vec<String>>,
}

impl HeaderFields {
    /// Checks every field; a missing model is the caller's home model.
    pub fn check(self, home_model: &str) -> Result<Header, CoreError> {
        check_tool_id(&self.id)?;
        check_label("name", &self.name, 200)?;
        let model = self.model.unwrap_or_else(|| home_model.to_string());
        check_model_name(&model)?;
        let version = self.version.unwrap_or_else(|| "1.0.0".to_string());
        check_label("version", &version, 64)?;
        let description = self.description.unwrap_or_default();
        check_text("description", &description, 4096, false)?;
        let capabilities = self.capabilities.unwrap_or_default();
        if capabilities.len() > MAX_CAPABILITIES {
            return Err(CoreError::bad_input(
                "too_many_capabilities",
                format!("at most {MAX_CAPABILITIES} capabilities are allowed"),
            ));
        }
        for c in &capabilities {
            check_capability(c)?;
        }
        Ok(Header { id: self.id, name: self.name, model, version, description, capabilities })
    }
}

/// Capabilities one entry may list.
pub const MAX_CAPABILITIES: usize = 32;

impl Header {
    /// The one operation of a single-operation tool (`run`), described by the entry's
    /// description or else its name.
    pub fn run_operation(&self, input: Value) -> BTreeMap<String, Operation> {
        let description = if self.description.is_empty() { self.name.clone() } else { self.description.clone() };
        BTreeMap::from([("run".to_string(), Operation { description, input, output: None, examples: Vec::new() })])
    }

    /// The entry this header describes, with its contract and binding; and the model it goes to.
    pub fn into_entry(self, status: Status, contract: Contract, binding: Binding) -> (String, CatalogEntry) {
        let entry = CatalogEntry {
            id: self.id,
            name: self.name,
            version: self.version,
            description: self.description,
            capabilities: self.capabilities,
            status,
            contract,
            binding,
        };
        (self.model, entry)
    }
}

/// An input schema as a registration gives it: absent means any object.
pub fn input_schema(input: Option<Value>) -> Result<Value, CoreError> {
    let input = input.unwrap_or_else(|| serde_json::json!({"type": "object"}));
    if !input.is_object() {
        return Err(CoreError::bad_input(
            "invalid_schema",
            "input must be a JSON Schema object, e.g. {\"type\":\"object\",\"properties\":{...}}",
        ));
    }
    // A schema the validator cannot read would check nothing at every call: said now, to the
    // one who can mend it, rather than never.
    if let Err(e) = jsonschema::validator_for(&input) {
        let at = e.instance_path().to_string();
        let at = if at.is_empty() { String::new() } else { format!(" at {at}") };
        return Err(CoreError::bad_input(
            "invalid_schema",
            format!(
                "input is not a valid JSON Schema{at}: {} (an unknown type, a pattern that is no regex, a $ref to nothing)",
                crate::name::cut(&crate::name::inert(&e.to_string()), 300)
            ),
        ));
    }
    Ok(input)
}

/// `TOOL_CATALOG_SEARCH`: the filters of a catalog search (type, model, text, capability, page).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
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
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GetArgs {
    pub id: String,
    #[serde(default)]
    pub model: Option<String>,
}

/// `TOOL_CATALOG_REMOVE`: removes an entry from one model's catalog (`default` for the global one).
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    check_may_register(state, model, &entry.id, entry.binding.kind(), actor)?;
    if let Some(existing) = state.catalog(model).and_then(|c| c.get(&entry.id))
        && existing.entry == entry
    {
        // The same definition again changes nothing, so it writes nothing.
        return Ok(events);
    }
    events.push((model.to_string(), EventBody::ToolRegistered { entry, owner: Some(actor.id.to_string()) }));
    Ok(events)
}

/// Whether `actor` may register an entry of `kind` under `id` in `model`: an existing entry
/// there must be the actor's own (or the actor the operator) and of the same kind. Checked again
/// when the registration commits; checked first, before a binder does any outside work (an MCP
/// connection, an image pull), so a refused registration contacts nothing.
pub fn check_may_register(
    state: &State,
    model: &str,
    id: &str,
    kind: crate::entry::BindingKind,
    actor: &Actor,
) -> Result<(), CoreError> {
    let Some(existing) = state.catalog(model).and_then(|c| c.get(id)) else {
        return Ok(());
    };
    check_owner(state, model, existing, actor, "replace")?;
    let old = existing.entry.binding.kind();
    if old != kind {
        return Err(CoreError::conflict(format!(
            "tool {id:?} in model {model:?} is a {} tool; it cannot become a {} tool. Remove it first (TOOL_CATALOG_REMOVE) or choose another id",
            old.as_str(),
            kind.as_str()
        )));
    }
    Ok(())
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
