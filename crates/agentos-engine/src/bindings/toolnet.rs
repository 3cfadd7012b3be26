//! Tool nets: a net definition in the blob store, run as one call in an instance of its own,
//! from its input place to its output place.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use agentos_core::command::{HeaderFields, Plan, fields, input_schema};
use agentos_core::entry::{Binding, BindingKind, Contract, Status, ToolnetBinding};
use agentos_core::flags::Flag;
use agentos_core::urn::BlobUrn;
use agentos_core::{CoreError, ErrorKind, sha256_hex};

use super::{Binder, Call, Outcome};
use crate::{Engine, EngineError, Principal};

/// The blob namespace of tool net definitions.
pub const TOOLNET_NAMESPACE: &str = "tool-catalog/toolnets";

/// The registration command of tool nets.
pub const REGISTER_TOOLNET: &str = "TOOL_CATALOG_REGISTER_TOOLNET";

pub struct Toolnet;

#[async_trait]
impl Binder for Toolnet {
    fn kind(&self) -> BindingKind {
        BindingKind::Toolnet
    }

    fn register_command(&self) -> Option<&'static str> {
        Some(REGISTER_TOOLNET)
    }

    fn registering(&self) -> &'static str {
        "author tool nets"
    }

    async fn plan(&self, _engine: &Engine, p: &Principal, body: Value) -> Result<Plan, EngineError> {
        let cmd: RegisterToolnet = fields(REGISTER_TOOLNET, body)?;
        Ok(cmd.plan(&p.home_model)?)
    }

    fn pinned_blob<'b>(&self, binding: &'b Binding) -> Option<&'b str> {
        match binding {
            Binding::Toolnet(t) => Some(&t.net_urn),
            _ => None,
        }
    }

    async fn invoke(&self, engine: &Engine, call: Call<'_>) -> Result<Outcome, EngineError> {
        let Call { principal, id, model, entry, req, .. } = call;
        let Some((Binding::Toolnet(b), author)) = entry.as_ref().map(|e| (&e.entry.binding, e.owner.to_string()))
        else {
            return Err(CoreError::internal("a tool net call without its entry").into());
        };
        if !principal.flags.has(Flag::ToolNets) {
            // Without `t` a tool net is not visible at all.
            if !principal.flags.has(Flag::Execute) {
                return Err(CoreError::forbidden(format!(
                    "{} may not invoke tools: that needs 'x' or 't'",
                    principal.name
                ))
                .into());
            }
            return Err(
                CoreError::not_found(format!("no tool {id:?} in model {model:?} nor in the global catalog")).into()
            );
        }
        let urn: BlobUrn = b.net_urn.parse()?;
        let bytes = engine.inner.catalog.blobs.get_checked(&urn, Some(b.size_bytes)).await?;
        let doc: agentos_core::net::NetDoc = serde_json::from_slice(&bytes).map_err(|e| {
            CoreError::new(
                ErrorKind::Corrupt,
                "toolnet_corrupt",
                format!("the stored net of {id:?} does not parse: {e}"),
            )
        })?;
        let cfg = engine.inner.dispatch.config;
        let timeout = Duration::from_millis(req.timeout_ms.unwrap_or(cfg.default_timeout_ms).min(cfg.max_timeout_ms));
        let call = crate::nets::ToolnetCall {
            id,
            author,
            resolve_model: model,
            doc,
            input_place: &b.input_place,
            output_place: &b.output_place,
            input: req.input.unwrap_or(Value::Null),
            timeout,
        };
        Ok(Outcome::Value(engine.nets().invoke_toolnet(principal, call).await?))
    }

    async fn queue(&self, engine: &Engine, call: Call<'_>) -> Result<String, EngineError> {
        if call.principal.flags.has(Flag::ToolNets) {
            return Err(super::answers_synchronously(call.id, "a tool net"));
        }
        // Without `t` a tool net is not visible: refused as a script call would be.
        super::script::Script.queue(engine, call).await
    }
}

/// `TOOL_CATALOG_REGISTER_TOOLNET`: a net run as one tool, from its input place to its output place.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterToolnet {
    pub id: String,
    pub name: String,
    /// The net document (places and transitions).
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
    pub input: Option<Value>,
}

impl RegisterToolnet {
    /// Validates every field and the net, and derives the entry. Nothing is written.
    pub fn plan(self, home_model: &str) -> Result<Plan, CoreError> {
        let header = HeaderFields {
            id: self.id,
            name: self.name,
            model: self.model,
            version: self.version,
            description: self.description,
            capabilities: self.capabilities,
        }
        .check(home_model)?;
        let doc = agentos_core::net::NetDoc::from_value(self.net)?;
        doc.validate()?;
        let places = doc.place_ids();
        for (field, p) in [("inputPlace", &self.input_place), ("outputPlace", &self.output_place)] {
            if !places.contains(p.as_str()) {
                return Err(CoreError::bad_input("invalid_net", format!("{field} {p:?} is not a place of the net")));
            }
        }
        let input = input_schema(self.input)?;
        let bytes = serde_json::to_vec(&doc).map_err(|e| CoreError::internal(e.to_string()))?;
        let sha256 = sha256_hex(&bytes);
        let urn = BlobUrn::new(TOOLNET_NAMESPACE, &sha256, Some("json"))?;
        let contract = Contract { kind: "toolnet".into(), operations: header.run_operation(input) };
        let binding = Binding::Toolnet(ToolnetBinding {
            net_urn: urn.to_string(),
            sha256,
            size_bytes: bytes.len() as u64,
            input_place: self.input_place,
            output_place: self.output_place,
        });
        let (model, entry) = header.into_entry(Status::Approved, contract, binding);
        Ok(Plan { model, entry, blobs: vec![(urn, bytes)] })
    }
}
