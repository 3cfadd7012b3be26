//! Query parameters on the wire. Unknown ones are refused (see `extract::QueryParams`).

use serde::Deserialize;
use utoipa::IntoParams;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SearchParams {
    /// Binding type: script, http, docker, toolnet, host, mcp.
    #[serde(rename = "type")]
    #[param(rename = "type")]
    pub kind: Option<String>,
    /// Search this model's local catalog first, then the global one (default: the caller's home model).
    pub model: Option<String>,
    /// Free text over id, name, description and capabilities.
    pub q: Option<String>,
    /// Only entries with this capability.
    pub capability: Option<String>,
    /// Page size, 1 to 1000 (default 50).
    pub limit: Option<usize>,
    /// Entries to skip.
    pub offset: Option<usize>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ModelParam {
    /// Look in this model's local catalog first, then the global one (default: the caller's home model).
    pub model: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct InvokeParams {
    /// The model the command belongs to: its local catalog is looked up first. Defaults to the caller's home model.
    pub model: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ResultParams {
    /// Also hand out the next job, when one is queued right now (`next`: a LeasedJob or null).
    pub next: Option<bool>,
    /// The executor process's instance id, as in its polls: the next job's lease id starts with it.
    pub instance: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventParams {
    /// Only events after this sequence number.
    pub after: Option<u64>,
    /// At most this many (1 to 1000, default 100).
    pub limit: Option<usize>,
    /// Only events of this principal (its name).
    pub principal: Option<String>,
    /// Only events of this model.
    pub model: Option<String>,
    /// Only events of this type (`ToolRegistered`, `Net`, `JobFinished`, …).
    #[serde(rename = "type")]
    #[param(rename = "type")]
    pub kind: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RecentJobsParams {
    /// At most this many, newest first (1 to 500, default 50).
    pub limit: Option<usize>,
}

/// A page of a place's tokens, oldest first; without `limit`, every token.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct TokensQuery {
    /// At most this many tokens (1 to 10000); the answer's `X-Total-Count` says how many the
    /// place holds.
    pub limit: Option<usize>,
    /// Skip this many first.
    pub offset: Option<usize>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ParkedQuery {
    /// Only the tokens this transition parked.
    pub transition: Option<String>,
}
