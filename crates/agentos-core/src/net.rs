//! Nets: a model's places and transitions as one document, the inscription of each transition,
//! and the validation that refuses a bad document with the path of every fault in it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::CoreError;
use crate::expr::{Expr, Template};
use crate::name::is_valid_id;

/// A net document: what `agentos net apply` sends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetDoc {
    /// The model the net belongs to (the API path or `--model` may name it instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default)]
    pub places: Vec<PlaceDecl>,
    #[serde(default)]
    pub transitions: Vec<Inscription>,
}

/// A place: its id, or `{id, description}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PlaceDecl {
    Id(String),
    Full {
        id: String,
        #[serde(default)]
        description: String,
    },
}

impl PlaceDecl {
    pub fn id(&self) -> &str {
        match self {
            PlaceDecl::Id(id) | PlaceDecl::Full { id, .. } => id,
        }
    }
}

/// A transition's runtime configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Inscription {
    pub id: String,
    /// `pass`, `map`, `command`, `http`, `link` (`llm`, `agent`, `user`: not supported yet).
    pub kind: String,
    /// Named input arcs.
    #[serde(default)]
    pub presets: BTreeMap<String, Preset>,
    /// Named output arcs.
    #[serde(default)]
    pub postsets: BTreeMap<String, Postset>,
    /// Kind-specific: `map` {template}, `command` {from?, executor?, credentials?, timeoutMs?},
    /// `http` {method, url, headers?, body?, timeoutMs?, successStatus?} or {tool, operation,
    /// input?, timeoutMs?} (an operation of a registered http service).
    #[serde(default)]
    pub action: Value,
    /// Ordered routing rules; the first that matches emits.
    #[serde(default)]
    pub emit: Vec<EmitRule>,
    /// `auto`: fires whenever enabled while started. `manual`: only by fire-once or its schedule.
    #[serde(default)]
    pub mode: Mode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
    /// Fires of this transition in flight at once.
    #[serde(default = "one")]
    pub concurrency: u32,
    /// `keep`: a result no rule matches leaves the inputs in place (otherwise a catch-all rule is required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_unmatched: Option<String>,
    /// Fire failed inputs again, up to `maxAttempts` fires in all, `backoffMs` apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    /// After the last attempt, move the inputs to this postset as one token
    /// `{input, error, attempts, transition}` instead of parking them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_error: Option<OnError>,
    /// `link` only: the two ends and the relation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<PlaceRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<PlaceRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relation: Option<String>,
}

fn one() -> u32 {
    1
}

/// How a transition fires failed inputs again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Retry {
    /// Fires of the same inputs in all, the first included.
    pub max_attempts: u32,
    /// Wait before each new attempt, in ms.
    #[serde(default)]
    pub backoff_ms: u64,
}

/// Where the inputs of a fire that failed its last attempt go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OnError {
    /// A postset name.
    pub to: String,
}

impl Inscription {
    /// Fires of the same inputs in all before they park or go to the error place.
    pub fn max_attempts(&self) -> u32 {
        self.retry.map_or(1, |r| r.max_attempts.max(1))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Auto,
    Manual,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Take {
    #[default]
    First,
    All,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Preset {
    pub place: String,
    /// `first`: one token; `all`: every token that binds (up to `limit`).
    #[serde(default)]
    pub take: Take,
    /// False for a read arc: the token binds but stays.
    #[serde(default = "yes")]
    pub consume: bool,
    /// jq over the token (`{id, name, createdAt, data}`): only tokens for which it is true bind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Postset {
    pub place: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EmitRule {
    /// A postset name.
    pub to: String,
    /// `@result`, `@response` or `@input.<preset>`.
    #[serde(default = "at_result")]
    pub from: String,
    /// jq over `{result, response, input}`; a rule without one is a catch-all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
}

fn at_result() -> String {
    "@result".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Schedule {
    /// Fire every this many milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<u64>,
    /// Or on a cron expression with seconds: `sec min hour day-of-month month day-of-week`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlaceRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub place: String,
}

/// Kinds that fire.
pub const FIRING_KINDS: [&str; 5] = ["pass", "map", "command", "http", "mcp"];
/// Kinds that are known but not built yet.
pub const LATER_KINDS: [&str; 3] = ["llm", "agent", "user"];

/// `map` action.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MapAction {
    pub template: Value,
}

/// `command` action.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandAction {
    /// The preset whose token holds the command (default: the first consuming preset).
    #[serde(default)]
    pub from: Option<String>,
    /// Only this executor may run it.
    #[serde(default)]
    pub executor: Option<String>,
    /// Credentials injected into the process environment at fire time, by name.
    #[serde(default)]
    pub credentials: Vec<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// `http` action.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpAction {
    pub method: String,
    pub url: Value,
    #[serde(default)]
    pub headers: BTreeMap<String, Value>,
    #[serde(default)]
    pub body: Option<Value>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Status codes that count as success (default: 200-299).
    #[serde(default)]
    pub success_status: Option<Vec<u16>>,
}

/// `http` action naming an operation of a registered http service instead of a URL: the
/// request, the credential and the redirects are the entry's, as for a shell command's call.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationAction {
    /// The http entry's id, resolved local first in the model the fire acts for.
    pub tool: String,
    /// The operation's tool name: `get-item`.
    pub operation: String,
    /// A template of the operation's input: its flags as an object.
    #[serde(default)]
    pub input: Option<Value>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

impl OperationAction {
    /// Whether an `http` action names an operation (it has `tool`) rather than a URL.
    pub fn named_in(action: &Value) -> bool {
        action.get("tool").is_some()
    }
}

/// One fault in a document, at a JSON path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetFault {
    pub path: String,
    pub message: String,
}

impl NetDoc {
    /// Parses a document from JSON or YAML text, naming the path of a shape error.
    pub fn parse(text: &str) -> Result<NetDoc, CoreError> {
        let value: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(json_err) => serde_yaml_ng::from_str(text).map_err(|yaml_err| {
                CoreError::bad_input(
                    "malformed_net",
                    format!("the net document is neither JSON ({json_err}) nor YAML ({yaml_err})"),
                )
            })?,
        };
        Self::from_value(value)
    }

    pub fn from_value(value: Value) -> Result<NetDoc, CoreError> {
        // Serde reads a struct from an array too, field by field: `["m", ["a"], []]` would be
        // a net of place a, and `[]` an empty net that replaces the model's.
        if !value.is_object() {
            let what = agentos_openapi::json_kind(&value);
            return Err(CoreError::bad_input(
                "invalid_net",
                format!(
                    "the net document must be a JSON object ({{\"places\": [...], \"transitions\": [...]}}), not {what}"
                ),
            ));
        }
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            CoreError::bad_input("invalid_net", format!("invalid net document at {path}: {}", e.inner()))
        })
    }

    pub fn place_ids(&self) -> BTreeSet<&str> {
        self.places.iter().map(PlaceDecl::id).collect()
    }

    /// Every fault of the document; empty when it may be applied.
    pub fn faults(&self) -> Vec<NetFault> {
        let mut f = Vec::new();
        let mut fault = |path: String, message: String| f.push(NetFault { path, message });
        let mut places = BTreeSet::new();
        for (i, p) in self.places.iter().enumerate() {
            let id = p.id();
            if !is_valid_id(id) {
                fault(
                    format!("/places/{i}"),
                    format!("place id {} is not valid: use a-z, 0-9 and '-', at most 64", crate::name::shown(id)),
                );
            } else if !places.insert(id) {
                fault(format!("/places/{i}"), format!("place {} is declared twice", crate::name::shown(id)));
            }
        }
        let mut ids = BTreeSet::new();
        for (i, t) in self.transitions.iter().enumerate() {
            let at = format!("/transitions/{i}");
            if !is_valid_id(&t.id) {
                fault(
                    format!("{at}/id"),
                    format!(
                        "transition id {} is not valid: use a-z, 0-9 and '-', at most 64",
                        crate::name::shown(&t.id)
                    ),
                );
            } else if !ids.insert(t.id.as_str()) {
                fault(format!("{at}/id"), format!("transition {} is declared twice", crate::name::shown(&t.id)));
            }
            check_transition(t, &at, &places, &mut fault);
        }
        f
    }

    /// Parses nothing more: refuses the document when it has any fault, listing them all.
    pub fn validate(&self) -> Result<(), CoreError> {
        let faults = self.faults();
        if faults.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = faults.iter().map(|f| format!("{}: {}", f.path, f.message)).collect();
        Err(CoreError::bad_input("invalid_net", format!("the net has {} fault(s): {}", faults.len(), list.join("; "))))
    }
}

fn check_transition(t: &Inscription, at: &str, places: &BTreeSet<&str>, fault: &mut impl FnMut(String, String)) {
    let kind = t.kind.as_str();
    if LATER_KINDS.contains(&kind) {
        fault(
            format!("{at}/kind"),
            format!(
                "kind {} is not supported yet; use pass, map, command, http, mcp or link",
                crate::name::shown(kind)
            ),
        );
        return;
    }
    if kind == "link" {
        check_link(t, at, places, fault);
        return;
    }
    if !FIRING_KINDS.contains(&kind) {
        fault(
            format!("{at}/kind"),
            format!("unknown kind {}; use pass, map, command, http, mcp or link", crate::name::shown(kind)),
        );
        return;
    }
    for (field, present) in [("from", t.from.is_some()), ("to", t.to.is_some()), ("relation", t.relation.is_some())] {
        if present {
            fault(format!("{at}/{field}"), format!("{field} belongs to link transitions only"));
        }
    }
    for (name, p) in &t.presets {
        let pat = format!("{at}/presets/{name}");
        // The catalog place is implicit in every net, and read-only: its tokens are the catalog's.
        if p.place == crate::CATALOG_PLACE {
            if p.consume {
                fault(
                    format!("{pat}/consume"),
                    format!("{} is read-only (the catalog's entries): read it with consume: false", p.place),
                );
            }
        } else if !places.contains(p.place.as_str()) {
            fault(
                format!("{pat}/place"),
                format!("unknown place {} (dangling arc): declare it under places", crate::name::shown(&p.place)),
            );
        }
        if let Some(src) = &p.filter
            && let Err(e) = Expr::compile(src)
        {
            fault(format!("{pat}/filter"), format!("bad expression: {e}"));
        }
        if p.limit == Some(0) {
            fault(format!("{pat}/limit"), "limit must be at least 1".into());
        }
    }
    for (name, p) in &t.postsets {
        if p.place == crate::CATALOG_PLACE {
            fault(
                format!("{at}/postsets/{name}/place"),
                format!("{} is read-only: its tokens are the catalog's entries; register a tool instead", p.place),
            );
        } else if !places.contains(p.place.as_str()) {
            fault(
                format!("{at}/postsets/{name}/place"),
                format!("unknown place {} (dangling arc): declare it under places", crate::name::shown(&p.place)),
            );
        }
    }
    if t.concurrency == 0 {
        fault(format!("{at}/concurrency"), "concurrency must be at least 1".into());
    }
    let consuming = t.presets.values().any(|p| p.consume);
    if !consuming && t.mode == Mode::Auto && t.schedule.is_none() {
        fault(
            format!("{at}/presets"),
            "an auto transition needs a consuming preset, or a schedule, or mode manual (it would fire without end)"
                .into(),
        );
    }
    if let Some(s) = &t.schedule {
        match (s.every_ms, &s.cron) {
            (Some(0), _) => fault(format!("{at}/schedule/everyMs"), "everyMs must be at least 1".into()),
            (Some(_), Some(_)) | (None, None) => {
                fault(format!("{at}/schedule"), "give exactly one of everyMs and cron".into())
            }
            (None, Some(c)) => match c.parse::<cron::Schedule>() {
                Err(e) => fault(format!("{at}/schedule/cron"), cron_fault(c, &e)),
                // A schedule with no next time would otherwise need a fallback rhythm, and any
                // rhythm fires a transition its author meant never (or rarely) to fire.
                Ok(s) if s.upcoming(chrono::Utc).next().is_none() => fault(
                    format!("{at}/schedule/cron"),
                    format!(
                        "cron expression {} never comes due (no such date ahead, e.g. 30 February)",
                        crate::name::shown(c)
                    ),
                ),
                Ok(_) => {}
            },
            (Some(_), None) => {}
        }
    }
    for (i, r) in t.emit.iter().enumerate() {
        let rat = format!("{at}/emit/{i}");
        if !t.postsets.contains_key(&r.to) {
            fault(format!("{rat}/to"), format!("{} is not a postset of this transition", crate::name::shown(&r.to)));
        }
        let from_ok = r.from == "@result"
            || r.from == "@response"
            || r.from.strip_prefix("@input.").is_some_and(|p| t.presets.contains_key(p));
        if !from_ok {
            fault(
                format!("{rat}/from"),
                format!("{}: use @result, @response or @input.<preset>", crate::name::shown(&r.from)),
            );
        }
        if let Some(w) = &r.when
            && let Err(e) = Expr::compile(w)
        {
            fault(format!("{rat}/when"), format!("bad expression: {e}"));
        }
    }
    if let Some(r) = &t.retry {
        if r.max_attempts == 0 {
            fault(format!("{at}/retry/maxAttempts"), "maxAttempts must be at least 1 (the first fire counts)".into());
        }
        if r.backoff_ms > 24 * 3600 * 1000 {
            fault(format!("{at}/retry/backoffMs"), "backoffMs is at most a day".into());
        }
    }
    if let Some(e) = &t.on_error
        && !t.postsets.contains_key(&e.to)
    {
        fault(format!("{at}/onError/to"), format!("{} is not a postset of this transition", crate::name::shown(&e.to)));
    }
    let has_catch_all = t.emit.last().is_some_and(|r| r.when.is_none());
    match t.on_unmatched.as_deref() {
        None if !t.postsets.is_empty() && !has_catch_all => fault(
            format!("{at}/emit"),
            "missing catch-all: end emit with a rule without `when`, or set onUnmatched: keep".into(),
        ),
        None | Some("keep") => {}
        Some(other) => {
            fault(format!("{at}/onUnmatched"), format!("{}: the only value is keep", crate::name::shown(other)))
        }
    }
    match kind {
        "pass" if !t.action.is_null() && t.action != Value::Object(Default::default()) => {
            fault(format!("{at}/action"), "pass takes no action".into());
        }
        "map" => match serde_json::from_value::<MapAction>(t.action.clone()) {
            Err(e) => fault(format!("{at}/action"), format!("map needs {{\"template\": ...}}: {e}")),
            Ok(m) => match Template::compile(&m.template) {
                Err((path, why)) => fault(format!("{at}/action/template{path}"), format!("bad expression: {why}")),
                // What a map renders becomes a token, an event and a line in the log: no secret may go there.
                Ok(tpl) if !tpl.credentials().is_empty() => fault(
                    format!("{at}/action/template"),
                    format!(
                        "a map template cannot read credentials ({}); secrets go only in http headers and to granted scripts",
                        tpl.credentials().join(", ")
                    ),
                ),
                Ok(_) => {}
            },
        },
        "command" => match serde_json::from_value::<CommandAction>(if t.action.is_null() {
            Value::Object(Default::default())
        } else {
            t.action.clone()
        }) {
            Err(e) => fault(format!("{at}/action"), format!("command action: {e}")),
            Ok(c) => {
                if let Some(from) = &c.from
                    && !t.presets.contains_key(from)
                {
                    fault(
                        format!("{at}/action/from"),
                        format!("{} is not a preset of this transition", crate::name::shown(from)),
                    );
                }
                if c.from.is_none() && !consuming {
                    fault(
                        format!("{at}/presets"),
                        "a command transition takes its command from a consuming preset".into(),
                    );
                }
                for (i, name) in c.credentials.iter().enumerate() {
                    if !valid_credential(name) {
                        fault(
                            format!("{at}/action/credentials/{i}"),
                            format!("credential name {}: use A-Z, a-z, 0-9, '_' and '-'", crate::name::shown(name)),
                        );
                    }
                }
            }
        },
        "http" | "mcp" if OperationAction::named_in(&t.action) || kind == "mcp" => {
            match serde_json::from_value::<OperationAction>(t.action.clone()) {
                Err(e) => fault(
                    format!("{at}/action"),
                    format!("an {kind} operation needs {{\"tool\", \"operation\", \"input\"?, \"timeoutMs\"?}}: {e}"),
                ),
                Ok(o) => {
                    if !is_valid_id(&o.tool) {
                        fault(
                            format!("{at}/action/tool"),
                            format!("tool id {} is not valid", crate::name::shown(&o.tool)),
                        );
                    }
                    if o.operation.trim().is_empty() {
                        fault(format!("{at}/action/operation"), "name the operation: its tool name".into());
                    } else if o.operation.contains("${") {
                        fault(
                            format!("{at}/action/operation"),
                            "an operation is named, not computed: a template cannot choose it (one transition per operation)"
                                .into(),
                        );
                    }
                    match o.input.as_ref().map(Template::compile).transpose() {
                        Err((path, why)) => fault(format!("{at}/action/input{path}"), format!("bad expression: {why}")),
                        Ok(Some(tpl)) if !tpl.credentials().is_empty() => fault(
                            format!("{at}/action/input"),
                            "an operation's credential is its entry's auth; its input cannot read credentials".into(),
                        ),
                        Ok(_) => {}
                    }
                }
            }
        }
        "http" => match serde_json::from_value::<HttpAction>(t.action.clone()) {
            Err(e) => fault(format!("{at}/action"), format!("http needs {{\"method\", \"url\", ...}}: {e}")),
            Ok(h) => {
                if !["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"].contains(&h.method.to_uppercase().as_str()) {
                    fault(format!("{at}/action/method"), format!("unknown method {}", crate::name::shown(&h.method)));
                }
                let mut parts = vec![("/url".to_string(), h.url.clone())];
                parts.extend(h.headers.iter().map(|(k, v)| (format!("/headers/{k}"), v.clone())));
                if let Some(b) = &h.body {
                    parts.push(("/body".into(), b.clone()));
                }
                let mut uses_credentials = false;
                for (p, v) in parts {
                    match Template::compile(&v) {
                        Err((path, why)) => fault(format!("{at}/action{p}{path}"), format!("bad expression: {why}")),
                        Ok(tpl) if !tpl.credentials().is_empty() => {
                            uses_credentials = true;
                            // A URL is logged, shown in errors and sent on by redirects; a body is echoed back.
                            if !p.starts_with("/headers/") {
                                fault(
                                    format!("{at}/action{p}"),
                                    "credentials go only in headers (a query parameter only where a registered http entry declares it)"
                                        .into(),
                                );
                            }
                        }
                        Ok(_) => {}
                    }
                }
                if uses_credentials {
                    for k in h.headers.keys() {
                        let lower = k.to_ascii_lowercase();
                        if lower == "host" || lower == "forwarded" || lower.starts_with("x-forwarded-") {
                            fault(
                                format!("{at}/action/headers/{k}"),
                                format!("{k} cannot be set on a request that carries credentials"),
                            );
                        }
                    }
                }
            }
        },
        _ => {}
    }
}

fn check_link(t: &Inscription, at: &str, places: &BTreeSet<&str>, fault: &mut impl FnMut(String, String)) {
    if !t.presets.is_empty() || !t.postsets.is_empty() || !t.emit.is_empty() || t.schedule.is_some() {
        fault(at.to_string(), "a link never fires: it has from, to and relation, no arcs, emit or schedule".into());
    }
    for (field, end) in [("from", &t.from), ("to", &t.to)] {
        match end {
            None => fault(format!("{at}/{field}"), format!("a link needs {field}: {{model?, place}}")),
            // A place of this net must be declared; one in another model is checked when the link is listed.
            Some(r) if r.model.is_none() && !places.contains(r.place.as_str()) => {
                fault(format!("{at}/{field}/place"), format!("unknown place {}", crate::name::shown(&r.place)))
            }
            Some(r) => {
                if let Some(m) = &r.model
                    && !is_valid_id(m)
                {
                    fault(format!("{at}/{field}/model"), format!("model name {} is not valid", crate::name::shown(m)));
                }
            }
        }
    }
    if t.relation.as_deref().is_none_or(|r| r.trim().is_empty()) {
        fault(format!("{at}/relation"), "a link needs a relation, e.g. \"feeds\"".into());
    } else if t.relation.as_deref().is_some_and(|r| r.chars().any(char::is_control) || r.chars().count() > 200) {
        fault(format!("{at}/relation"), "a relation is one line of at most 200 characters, e.g. \"feeds\"".into());
    }
}

/// What a cron expression looks like, for the message that refuses one.
const CRON_SHAPE: &str = "a cron expression is six fields, sec min hour day-of-month month day-of-week, and an \
     optional seventh, year: e.g. \"0 */5 * * * *\" (every five minutes) or \"0 30 9 * * Mon-Fri\"";

/// One line saying why `expr` is not a cron expression. The cron crate's message is several
/// lines (the expression, a caret under the fault, then why, which may be empty): the reason is
/// kept, and the caret becomes the character it points at.
fn cron_fault(expr: &str, e: &cron::error::Error) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text.lines().collect();
    let why = lines.last().map(|l| l.trim()).filter(|l| !l.is_empty() && !l.ends_with('^')).unwrap_or_default();
    // The simple form: the expression, then a line of spaces and one caret under the fault.
    let at = match lines.as_slice() {
        [first, caret, ..] if *first == expr && caret.trim() == "^" => caret.find('^'),
        _ => None,
    };
    let why = match (why, at) {
        _ if expr.trim().is_empty() => "it is empty".to_string(),
        ("", Some(at)) => format!("unexpected text at character {}", at + 1),
        ("", None) => "it does not parse".to_string(),
        (why, Some(at)) => format!("{} (at character {})", crate::name::cut(&crate::name::inert(why), 200), at + 1),
        (why, None) => crate::name::cut(&crate::name::inert(why), 200),
    };
    format!("bad cron expression {}: {why}; {CRON_SHAPE}", crate::name::shown(expr))
}

/// Credential names: `[A-Za-z0-9_-]+`.
pub fn valid_credential(name: &str) -> bool {
    !name.is_empty() && name.len() <= 128 && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}
