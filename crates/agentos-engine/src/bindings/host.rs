//! Host tools: Rust functions registered by whoever embeds the master, run inside it
//! (`crate::host` holds the embedder's side: toolkits and their registration at start).

use async_trait::async_trait;
use serde_json::Value;

use agentos_core::CoreError;
use agentos_core::entry::{Binding, BindingKind};
use agentos_core::flags::Flag;

use super::{Binder, Call, Outcome};
use crate::{Engine, EngineError, Principal};

pub struct Host;

fn may_call(p: &Principal) -> Result<(), EngineError> {
    if p.flags.has(Flag::Execute) {
        return Ok(());
    }
    Err(CoreError::forbidden(format!("{} may not call tools: that needs the 'x' flag", p.name)).into())
}

#[async_trait]
impl Binder for Host {
    fn kind(&self) -> BindingKind {
        BindingKind::Host
    }

    async fn invoke(&self, engine: &Engine, call: Call<'_>) -> Result<Outcome, EngineError> {
        may_call(call.principal)?;
        let Some(Binding::Host(h)) = call.entry.as_ref().map(|e| &e.entry.binding) else {
            return Err(CoreError::internal("a host tool call without its entry").into());
        };
        let Some(tool) = call.operation else {
            return Err(CoreError::bad_input(
                "not_invocable",
                format!(
                    "{:?} is a host toolkit of several tools: call one with `agentos-{} TOOL` (POST /api/tools/{}/call)",
                    call.id, call.id, call.id
                ),
            )
            .into());
        };
        let input = call.req.input.unwrap_or(Value::Null);
        Ok(Outcome::Value(engine.call_host(&h.toolkit, tool, input).await?))
    }

    async fn queue(&self, _engine: &Engine, call: Call<'_>) -> Result<String, EngineError> {
        may_call(call.principal)?;
        Err(CoreError::bad_input(
            "async_unsupported",
            format!("{:?} is a host tool: it answers synchronously; invoke it without Prefer: respond-async", call.id),
        )
        .into())
    }
}
