//! Host tools: Rust functions registered by whoever embeds the master, run inside it
//! (`crate::host` holds the embedder's side: the toolkits it builds). Their entries are written
//! at start, on the operator's behalf.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use agentos_core::entry::{Binding, BindingKind};
use agentos_core::flags::Flag;
use agentos_core::name::check_tool_id;
use agentos_core::{CoreError, DEFAULT_MODEL, ErrorKind};

use crate::host::{HostContext, HostToolkit};

use super::{Binder, Call, Outcome};
use crate::{Engine, EngineError, HostToolkits, Principal};

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
        let Some(tool) = call.operation.map(|o| o.name) else {
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
        Ok(Outcome::Value(engine.host().call(&h.toolkit, tool, input).await?))
    }

    async fn queue(&self, _engine: &Engine, call: Call<'_>) -> Result<String, EngineError> {
        may_call(call.principal)?;
        Err(super::answers_synchronously(call.id, "a host tool"))
    }
}

impl HostToolkits<'_> {
    /// Makes toolkits callable and writes (or refreshes) their global catalog entries.
    pub async fn register_toolkits(&self, toolkits: Vec<HostToolkit>) -> Result<(), EngineError> {
        for tk in toolkits {
            check_tool_id(&tk.name)?;
            for name in tk.tools.keys() {
                check_tool_id(name)?;
            }
            let entry = tk.entry();
            self.inner.host.insert(tk);
            self.submit(
                "system",
                Box::new(move |st| agentos_core::command::decide_register(st, DEFAULT_MODEL, entry.clone(), &MASTER)),
            )
            .await?;
        }
        Ok(())
    }

    /// Runs a host tool with its timeout; a timeout cancels the call.
    pub(crate) async fn call(&self, toolkit: &str, tool: &str, input: Value) -> Result<Value, EngineError> {
        let t = self.inner.host.tool(toolkit, tool)?;
        let engine = self.0.clone();
        let ctx = HostContext { secrets: Arc::new(move |name: &str| engine.principals().secret(name)) };
        // Its own task: a panic in the tool becomes an error, not a dead request.
        let task = tokio::spawn((t.call)(input, ctx));
        let abort = task.abort_handle();
        let redactor = self.principals().redactor(&[]);
        match tokio::time::timeout(t.timeout, task).await {
            Ok(Ok(Ok(v))) => Ok(redactor.value(v)),
            Ok(Ok(Err(msg))) => {
                let msg = redactor.text(&msg);
                Err(CoreError::new(ErrorKind::ToolFailed, "tool_failed", format!("{toolkit} {tool}: {msg}")).into())
            }
            Ok(Err(e)) => {
                Err(CoreError::new(ErrorKind::ToolFailed, "tool_failed", format!("{toolkit} {tool} crashed: {e}"))
                    .into())
            }
            Err(_) => {
                abort.abort();
                Err(CoreError::new(
                    ErrorKind::Unavailable,
                    "timed_out",
                    format!("{toolkit} {tool} timed out after {} ms and was cancelled", t.timeout.as_millis()),
                )
                .into())
            }
        }
    }
}

/// Host toolkits are registered by the master itself, on the operator's behalf.
const MASTER: agentos_core::command::Actor<'static> =
    agentos_core::command::Actor { id: agentos_core::event::OPERATOR_ID, name: "system", operator: true };
