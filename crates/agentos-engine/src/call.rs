//! Calling a tool, whatever its kind: the id is resolved once (local first), and the kind's
//! binder runs it. `invoke` takes raw input and answers the outcome as it is; `call_tool` is
//! the shell command's way: flags in, parsed here by the same table that draws `--help` (so
//! the shim needs one round trip), and `{"ok":true,"result":...}` or one error line out.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use agentos_core::CoreError;
use agentos_core::entry::{BindingKind, StoredEntry};
use agentos_core::job::InvokeRequest;
use agentos_core::name::{check_model_name, check_tool_id};

use crate::bindings::{Binder, Call, FoundOperation, binder};
use crate::{Dispatch, EngineError, Principal};

/// A call of one tool of a toolkit, with the flags typed after its name.
#[derive(Debug, Clone, Deserialize, Serialize)]
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

/// A tool id resolved in a model: its entry, if any, and the binder that runs it.
struct Resolved {
    model: String,
    entry: Option<Arc<StoredEntry>>,
    binder: &'static dyn Binder,
}

impl Dispatch<'_> {
    /// Resolves `id` for `p` in `model` (its home model when absent), local first. An id that
    /// resolves to nothing goes to the script binder, which checks the caller's flags first and
    /// then answers 404, so that a caller who may not invoke learns nothing of what exists.
    fn resolve_call(&self, p: &Principal, id: &str, model: Option<&str>) -> Result<Resolved, EngineError> {
        check_tool_id(id)?;
        let model = model.map(str::to_string).unwrap_or_else(|| p.home_model.clone());
        check_model_name(&model)?;
        let entry = {
            let st = self.read_state();
            crate::access::check_catalog_read(&st, p, &model)?;
            st.resolve(&model, id).map(|(e, _)| e.clone())
        };
        let kind = entry.as_ref().map(|e| e.entry.binding.kind()).unwrap_or(BindingKind::Script);
        let binder = binder(kind).ok_or_else(|| {
            CoreError::bad_input(
                "not_invocable",
                format!("{id:?} is a {} tool, which this master cannot run", kind.as_str()),
            )
        })?;
        Ok(Resolved { model, entry, binder })
    }

    /// Runs a tool's one operation and waits: a script's job result, or `{<kind>: id, output}`.
    pub async fn invoke(
        &self,
        principal: &Principal,
        id: &str,
        model: Option<&str>,
        req: InvokeRequest,
    ) -> Result<Value, EngineError> {
        let Resolved { model, entry, binder } = self.resolve_call(principal, id, model)?;
        let kind = binder.kind();
        let call = Call { principal, id, model: &model, entry, operation: None, req };
        binder.invoke(self, call).await?.into_answer(kind, id)
    }

    /// `Prefer: respond-async`: queues a tool's job and answers its id at once; the invoker
    /// reads the result with `GET /api/jobs/{id}`. Kinds that answer synchronously refuse.
    pub async fn invoke_async(
        &self,
        principal: &Principal,
        id: &str,
        model: Option<&str>,
        req: InvokeRequest,
    ) -> Result<String, EngineError> {
        let Resolved { model, entry, binder } = self.resolve_call(principal, id, model)?;
        binder.queue(self, Call { principal, id, model: &model, entry, operation: None, req }).await
    }

    /// One operation of a toolkit, called with the flags of its shell command.
    pub async fn call_tool(
        &self,
        p: &Principal,
        toolkit: &str,
        model: Option<&str>,
        req: CallRequest,
    ) -> Result<Value, EngineError> {
        self.call_operation(p, toolkit, model, OperationCall { tool: req.tool, args: CallArgs::Flags(req.args) }).await
    }

    async fn call_operation(
        &self,
        p: &Principal,
        toolkit: &str,
        model: Option<&str>,
        req: OperationCall,
    ) -> Result<Value, EngineError> {
        let Resolved { model, entry, binder } = self.resolve_call(p, toolkit, model)?;
        let Some(entry) = entry.filter(|e| e.entry.binding.kind().visible_to(p.flags)) else {
            return Err(CoreError::not_found(format!("no toolkit {toolkit:?} (see `agentos list-tools`)")).into());
        };
        let op = self.inner.catalog.prepared.find(&entry, toolkit, &req.tool)?;
        let input = match req.args {
            CallArgs::Flags(args) => op.table.parse(&args).map_err(|e| usage(e.0))?,
            // The same defaults as flags get: a tool gets the same input however it is called.
            CallArgs::Input(Value::Object(input)) => Value::Object(op.table.with_defaults(input)),
            CallArgs::Input(input) => input,
        };
        op.validate(&input).map_err(|e| usage(e.0))?;
        let call = Call {
            principal: p,
            id: toolkit,
            model: &model,
            entry: Some(entry.clone()),
            operation: Some(FoundOperation { name: &req.tool, prepared: op }),
            req: InvokeRequest { input: Some(input), ..Default::default() },
        };
        let outcome = binder.invoke(self, call).await?;
        self.with_whole_stdout(outcome, toolkit, &req.tool).await?.into_output(toolkit, &req.tool)
    }

    /// A job's outcome with its whole stdout: output past the size kept inline went to a blob,
    /// and the job's `stdout` holds only its preview, which a caller given the operation's
    /// output must never take for the output (a cut JSON document read as a string).
    async fn with_whole_stdout(
        &self,
        outcome: crate::bindings::Outcome,
        toolkit: &str,
        tool: &str,
    ) -> Result<crate::bindings::Outcome, EngineError> {
        let crate::bindings::Outcome::Job(mut r) = outcome else { return Ok(outcome) };
        let Some(blob) = r.stdout_blob.as_ref().filter(|_| r.exit_code == Some(0) && r.error.is_none()) else {
            return Ok(crate::bindings::Outcome::Job(r));
        };
        let failed = |why: String| -> EngineError {
            CoreError::new(agentos_core::ErrorKind::ToolFailed, "tool_failed", format!("{toolkit} {tool}: {why}"))
                .into()
        };
        // Cut at the executor's output limit: what was kept is not the output, and read as it
        // would pass for it. (The mark covers both streams; a large stdout is the likely one.)
        if r.output_truncated {
            return Err(failed(format!(
                "its output passed the executor's limit and was cut; the {} bytes kept are in {} (GET /api/jobs/{}/stdout)",
                blob.size_bytes, blob.urn, r.job_id
            )));
        }
        let bytes = self
            .dispatch()
            .read_output(&blob.urn, blob.size_bytes)
            .await
            .map_err(|e| failed(format!("reading its output back from {}: {e}", blob.urn)))?;
        r.stdout = String::from_utf8(bytes).map_err(|_| {
            failed(format!(
                "its output is {} bytes that are not text; they are in {} (GET /api/jobs/{}/stdout)",
                blob.size_bytes, blob.urn, r.job_id
            ))
        })?;
        Ok(crate::bindings::Outcome::Job(r))
    }

    /// One operation of a toolkit, called with its input as JSON (an MCP client's way).
    pub async fn call_with_input(
        &self,
        p: &Principal,
        toolkit: &str,
        tool: &str,
        input: Value,
    ) -> Result<Value, EngineError> {
        self.call_operation(p, toolkit, None, OperationCall { tool: tool.to_string(), args: CallArgs::Input(input) })
            .await
    }
}

/// A call of one operation, by its flags or by its input.
struct OperationCall {
    tool: String,
    args: CallArgs,
}

enum CallArgs {
    Flags(Vec<String>),
    Input(Value),
}
