//! Calling a tool the way a shell command does: flags in, `{"ok":true,"result":...}` out. The
//! flags are parsed here, by the same table that draws `--help`, so the shim needs one round trip.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use agentos_core::entry::Binding;
use agentos_core::flagmap::{flag_table, validate};
use agentos_core::flags::Flag;
use agentos_core::job::InvokeRequest;
use agentos_core::name::{check_model_name, check_tool_id};
use agentos_core::{CoreError, ErrorKind};

use crate::{Engine, EngineError, Principal};

/// `POST /api/tools/{id}/call`.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CallRequest {
    /// The operation: `run` for a script.
    pub tool: String,
    /// The flags, as typed after the tool's name.
    #[serde(default)]
    pub args: Vec<String>,
}

fn usage(message: String) -> EngineError {
    CoreError::bad_input("usage", message).into()
}

impl Engine {
    pub async fn call_tool(
        &self,
        p: &Principal,
        toolkit: &str,
        model: Option<&str>,
        req: CallRequest,
    ) -> Result<Value, EngineError> {
        check_tool_id(toolkit)?;
        let model = model.map(str::to_string).unwrap_or_else(|| p.home_model.clone());
        check_model_name(&model)?;
        let entry = {
            let st = self.read_state();
            crate::access::check_catalog_read(&st, p, &model)?;
            match st.resolve(&model, toolkit) {
                Some((e, _)) if e.entry.binding.kind().visible_to(p.flags) => e.entry.to_entry(),
                _ => {
                    return Err(
                        CoreError::not_found(format!("no toolkit {toolkit:?} (see `agentos list-tools`)")).into()
                    );
                }
            }
        };
        let op = entry.contract.operations.get(&req.tool).ok_or_else(|| {
            let tools: Vec<&str> = entry.contract.operations.keys().map(String::as_str).collect();
            EngineError::from(CoreError::not_found(format!(
                "no tool {:?} in {toolkit}; its tools: {}",
                req.tool,
                tools.join(", ")
            )))
        })?;
        let table = flag_table(&op.input);
        let input = table.parse(&req.args).map_err(|e| usage(e.0))?;
        validate(&op.input, &table, &input).map_err(|e| usage(e.0))?;
        match &entry.binding {
            Binding::Host(h) => {
                if !p.flags.has(Flag::Execute) {
                    return Err(CoreError::forbidden(format!(
                        "{} may not call tools: that needs the 'x' flag",
                        p.name
                    ))
                    .into());
                }
                self.call_host(&h.toolkit, &req.tool, input).await
            }
            Binding::Toolnet(_) => {
                let out = self
                    .invoke(p, toolkit, Some(&model), InvokeRequest { input: Some(input), ..Default::default() })
                    .await?;
                Ok(out.get("output").cloned().unwrap_or(Value::Null))
            }
            Binding::Script(_) => {
                let out = self
                    .invoke(p, toolkit, Some(&model), InvokeRequest { input: Some(input), ..Default::default() })
                    .await?;
                let stderr_tail = || {
                    out["stderr"]
                        .as_str()
                        .and_then(|s| s.lines().rev().find(|l| !l.trim().is_empty()))
                        .map(|l| format!(": {l}"))
                        .unwrap_or_default()
                };
                if out["timedOut"].as_bool() == Some(true) {
                    return Err(CoreError::new(
                        ErrorKind::Unavailable,
                        "timed_out",
                        format!("{toolkit} {}: timed out", req.tool),
                    )
                    .into());
                }
                if let Some(e) = out["error"].as_str() {
                    return Err(CoreError::new(
                        ErrorKind::ToolFailed,
                        "tool_failed",
                        format!("{toolkit} {}: {e}", req.tool),
                    )
                    .into());
                }
                if out["exitCode"].as_i64() != Some(0) {
                    let how = match (out["exitCode"].as_i64(), out["signal"].as_i64()) {
                        (Some(c), _) => format!("exit code {c}"),
                        (None, Some(s)) => format!("signal {s}"),
                        _ => "no exit code".into(),
                    };
                    return Err(CoreError::new(
                        ErrorKind::ToolFailed,
                        "tool_failed",
                        format!("{toolkit} {} failed with {how}{}", req.tool, stderr_tail()),
                    )
                    .into());
                }
                let stdout = out["stdout"].as_str().unwrap_or("");
                Ok(serde_json::from_str(stdout.trim()).unwrap_or_else(|_| Value::String(stdout.to_string())))
            }
        }
    }
}
