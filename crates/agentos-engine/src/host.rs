//! Host tools: Rust functions that whoever embeds the master registers as a toolkit. They join
//! the catalog with a `host` binding and run inside the master, with its credentials.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use agentos_core::CoreError;
use agentos_core::entry::{Binding, CatalogEntry, Contract, Example, HostBinding, Operation, Status};

type HostFuture = Pin<Box<dyn Future<Output = Result<Value, String>> + Send>>;
type HostFn = Arc<dyn Fn(Value, HostContext) -> HostFuture + Send + Sync>;

/// What a host tool may use of the master: its secrets, by name. The agent never sees them;
/// any value of theirs in a result or error is redacted before it leaves the master.
#[derive(Clone)]
pub struct HostContext {
    pub(crate) secrets: SecretLookup,
}

type SecretLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

impl HostContext {
    pub fn secret(&self, name: &str) -> Option<String> {
        (self.secrets)(name)
    }
}

/// One tool of a toolkit.
#[derive(Clone)]
pub struct HostTool {
    name: String,
    description: String,
    input: Value,
    examples: Vec<Example>,
    pub(crate) timeout: Duration,
    pub(crate) call: HostFn,
}

impl HostTool {
    /// A tool whose input is `I` (its JSON Schema comes from `schemars`) and whose function
    /// answers any serializable value, or an error message.
    pub fn new<I, O, F, Fut>(name: &str, description: &str, f: F) -> HostTool
    where
        I: schemars::JsonSchema + DeserializeOwned + Send + 'static,
        O: Serialize + Send + 'static,
        F: Fn(I, HostContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, String>> + Send + 'static,
    {
        let mut input =
            serde_json::to_value(schemars::schema_for!(I)).unwrap_or_else(|_| serde_json::json!({"type": "object"}));
        if let Some(o) = input.as_object_mut() {
            // The catalog is the context: these only add tokens to prompts.
            o.remove("$schema");
            o.remove("title");
        }
        let f = Arc::new(f);
        let call: HostFn = Arc::new(move |v: Value, ctx: HostContext| {
            let f = f.clone();
            Box::pin(async move {
                let input: I = serde_json::from_value(v).map_err(|e| format!("input does not fit the tool: {e}"))?;
                let out = f(input, ctx).await?;
                serde_json::to_value(out).map_err(|e| format!("the result does not serialize: {e}"))
            })
        });
        HostTool {
            name: name.to_string(),
            description: description.to_string(),
            input,
            examples: Vec::new(),
            timeout: Duration::from_secs(30),
            call,
        }
    }

    /// The call is cancelled and reported after this long.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// A sample call, shown in `--help` and the system prompt.
    pub fn example(mut self, description: &str, input: Value) -> Self {
        self.examples.push(Example { description: description.to_string(), input });
        self
    }
}

impl std::fmt::Debug for HostToolkit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostToolkit")
            .field("name", &self.name)
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A named set of host tools: one catalog entry, one shim `agentos-{name}`.
#[derive(Clone)]
pub struct HostToolkit {
    pub(crate) name: String,
    description: String,
    pub(crate) tools: BTreeMap<String, HostTool>,
}

impl HostToolkit {
    pub fn new(name: &str, description: &str) -> HostToolkit {
        HostToolkit { name: name.to_string(), description: description.to_string(), tools: BTreeMap::new() }
    }

    pub fn tool(mut self, tool: HostTool) -> Self {
        self.tools.insert(tool.name.clone(), tool);
        self
    }

    pub(crate) fn entry(&self) -> CatalogEntry {
        CatalogEntry {
            id: self.name.clone(),
            name: self.name.clone(),
            version: "1.0.0".into(),
            description: self.description.clone(),
            capabilities: Vec::new(),
            status: Status::Approved,
            contract: Contract {
                kind: "host".into(),
                operations: self
                    .tools
                    .values()
                    .map(|t| {
                        (
                            t.name.clone(),
                            Operation {
                                description: t.description.clone(),
                                input: t.input.clone(),
                                output: None,
                                examples: t.examples.clone(),
                            },
                        )
                    })
                    .collect(),
            },
            binding: Binding::Host(HostBinding { toolkit: self.name.clone() }),
        }
    }
}

/// The toolkits this master serves, by name.
#[derive(Default)]
pub(crate) struct HostTools {
    toolkits: std::sync::RwLock<std::collections::HashMap<String, Arc<HostToolkit>>>,
}

impl HostTools {
    pub(crate) fn insert(&self, tk: HostToolkit) {
        self.toolkits.write().unwrap_or_else(|p| p.into_inner()).insert(tk.name.clone(), Arc::new(tk));
    }

    /// The tool `tool` of toolkit `toolkit`.
    pub(crate) fn tool(&self, toolkit: &str, tool: &str) -> Result<HostTool, CoreError> {
        let host = self.toolkits.read().unwrap_or_else(|p| p.into_inner());
        let tk = host.get(toolkit).ok_or_else(|| {
            CoreError::not_found(format!(
                "toolkit {toolkit:?} is in the catalog but not served by this master (it registers host tools at start)"
            ))
        })?;
        tk.tools
            .get(tool)
            .cloned()
            .ok_or_else(|| CoreError::not_found(format!("no tool {tool:?} in toolkit {toolkit:?}")))
    }
}
