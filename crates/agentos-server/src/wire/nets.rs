//! Nets on the wire: the net document, tokens, a net's view, links, fires and parked tokens.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use agentos_core::net_state;
use agentos_engine::nets;

// The net document below documents `PUT /api/models/{model}/net` only: its body is parsed by
// `agentos_core::net::NetDoc::from_value`, and a test holds both to one JSON shape. (A `///`
// line here would change the document's description.)

/// A net document: what `agentos net apply` sends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum PlaceDecl {
    Id(String),
    Full {
        id: String,
        #[serde(default)]
        description: String,
    },
}

/// A transition's runtime configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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
    /// `http` {method, url, headers?, body?, timeoutMs?, successStatus?} or, naming an operation
    /// of a registered http service, {tool, operation, input?, timeoutMs?}.
    #[serde(default)]
    #[schema(value_type = Object)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Retry {
    /// Fires of the same inputs in all, the first included.
    pub max_attempts: u32,
    /// Wait before each new attempt, in ms.
    #[serde(default)]
    pub backoff_ms: u64,
}

/// Where the inputs of a fire that failed its last attempt go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OnError {
    /// A postset name.
    pub to: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Auto,
    Manual,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Take {
    #[default]
    First,
    All,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Postset {
    pub place: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Schedule {
    /// Fire every this many milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<u64>,
    /// Or on a cron expression with seconds: `sec min hour day-of-month month day-of-week`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlaceRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub place: String,
}

/// A token: JSON data with metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Token {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub created_at: String,
    #[schema(value_type = Object)]
    pub data: Value,
    /// The ids of the principals behind the token: who put it, or the author of the transition
    /// that produced it plus everyone behind that fire's inputs. A fire acts with the flags they
    /// all hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by: Vec<String>,
}

impl From<net_state::Token> for Token {
    fn from(t: net_state::Token) -> Self {
        let net_state::Token { id, name, created_at, data, by } = t;
        Token { id, name, created_at, data, by }
    }
}

/// Where a net stands, for `GET /api/models/{m}/net`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetView {
    pub model: String,
    #[schema(value_type = Object)]
    pub doc: Value,
    pub places: Vec<PlaceSummary>,
    pub transitions: Vec<TransitionSummary>,
}

impl From<nets::NetView> for NetView {
    fn from(v: nets::NetView) -> Self {
        let nets::NetView { model, doc, places, transitions } = v;
        NetView {
            model,
            doc,
            places: places.into_iter().map(PlaceSummary::from).collect(),
            transitions: transitions.into_iter().map(TransitionSummary::from).collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlaceSummary {
    pub id: String,
    pub tokens: usize,
    pub reserved: usize,
}

impl From<nets::PlaceSummary> for PlaceSummary {
    fn from(p: nets::PlaceSummary) -> Self {
        let nets::PlaceSummary { id, tokens, reserved } = p;
        PlaceSummary { id, tokens, reserved }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransitionSummary {
    pub id: String,
    pub kind: String,
    pub started: bool,
    pub in_flight: usize,
    pub fires: u64,
    pub parked: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl From<nets::TransitionSummary> for TransitionSummary {
    fn from(t: nets::TransitionSummary) -> Self {
        let nets::TransitionSummary { id, kind, started, in_flight, fires, parked, last_error } = t;
        TransitionSummary { id, kind, started, in_flight, fires, parked, last_error }
    }
}

/// A link, as listed from either end.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkView {
    pub id: String,
    /// The model whose net declares it.
    pub model: String,
    pub relation: String,
    pub from: Value,
    pub to: Value,
}

impl From<nets::LinkView> for LinkView {
    fn from(l: nets::LinkView) -> Self {
        let nets::LinkView { id, model, relation, from, to } = l;
        LinkView { id, model, relation, from, to }
    }
}

/// What a manual fire did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FireOutcome {
    pub transition: String,
    /// `fired` (done), `started` (a command or http action runs), `failed` (inputs kept),
    /// `stopped` (a limit was hit: the transition stopped, inputs kept), `not-enabled`.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fire: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<nets::FireOutcome> for FireOutcome {
    fn from(f: nets::FireOutcome) -> Self {
        let nets::FireOutcome { transition, outcome, fire, reason } = f;
        FireOutcome { transition, outcome, fire, reason }
    }
}

/// A token a transition will not bind again by itself, for `GET /api/models/{m}/parked`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParkedToken {
    pub transition: String,
    pub place: String,
    pub token: Token,
    /// Why the fire that parked it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Failed fires of this transition on it.
    pub attempts: u32,
}

impl From<nets::ParkedToken> for ParkedToken {
    fn from(p: nets::ParkedToken) -> Self {
        let nets::ParkedToken { transition, place, token, reason, attempts } = p;
        ParkedToken { transition, place, token: token.into(), reason, attempts }
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateModel {
    pub name: String,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutToken {
    #[schema(value_type = Object)]
    pub data: Value,
    #[serde(default)]
    pub name: Option<String>,
}
