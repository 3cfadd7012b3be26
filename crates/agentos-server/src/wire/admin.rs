//! Principals and secrets on the wire: agents, model grants, secrets and their grants, executor
//! credentials.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use agentos_core::event;
use agentos_engine::admin;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAgent {
    pub name: String,
    /// Positional `rwxhludcts` plus `m`: a prefix (`rwx`) or with `-` gaps (`r-x------s`).
    pub flags: String,
    /// Home model (default: the agent's name).
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantModel {
    /// The model the agent may act in besides its home model.
    pub model: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetSecret {
    pub value: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutorTokenRequest {
    /// a-z, 0-9 and '-'. Creating a name that exists gives it a new token; the old one stops working.
    pub name: String,
}

/// A principal as listed: never its token or the token's hash.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrincipalView {
    pub name: String,
    pub kind: String,
    pub flags: String,
    pub model: String,
    /// Models the operator granted besides the home model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub granted: Vec<String>,
}

impl From<admin::PrincipalView> for PrincipalView {
    fn from(p: admin::PrincipalView) -> Self {
        let admin::PrincipalView { name, kind, flags, model, granted } = p;
        PrincipalView { name, kind, flags, model, granted }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretView {
    pub name: String,
    pub updated_at: String,
}

impl From<admin::SecretView> for SecretView {
    fn from(s: admin::SecretView) -> Self {
        let admin::SecretView { name, updated_at } = s;
        SecretView { name, updated_at }
    }
}

/// `POST /api/secrets/{name}/grants`: one use for a secret.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretGrantRequest {
    #[serde(default)]
    pub secret: String,
    /// A pinned tool, resolved in `model` (or the global catalog) when granted.
    #[serde(default)]
    pub tool: Option<String>,
    /// `scheme://host[:port]`: the secret may go in headers of requests to this origin.
    #[serde(default)]
    pub origin: Option<String>,
    /// Only in this model.
    #[serde(default)]
    pub model: Option<String>,
}

impl From<SecretGrantRequest> for admin::SecretGrantRequest {
    fn from(r: SecretGrantRequest) -> Self {
        let SecretGrantRequest { secret, tool, origin, model } = r;
        admin::SecretGrantRequest { secret, tool, origin, model }
    }
}

/// What a secret may be used for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum GrantTarget {
    /// One pinned tool: a script by its sha256. A changed pin loses the grant.
    Tool {
        id: String,
        /// The catalog (model) the tool was resolved in when granted.
        model: String,
        sha256: String,
    },
    /// Requests to one origin (`scheme://host[:port]`), in headers.
    Origin { origin: String },
}

impl From<event::GrantTarget> for GrantTarget {
    fn from(t: event::GrantTarget) -> Self {
        match t {
            event::GrantTarget::Tool { id, model, sha256 } => GrantTarget::Tool { id, model, sha256 },
            event::GrantTarget::Origin { origin } => GrantTarget::Origin { origin },
        }
    }
}

/// A secret granted to a use, optionally only in one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretGrant {
    /// Derived from the rest, so granting the same thing twice is one grant.
    pub id: String,
    pub secret: String,
    pub to: GrantTarget,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl From<event::SecretGrant> for SecretGrant {
    fn from(g: event::SecretGrant) -> Self {
        let event::SecretGrant { id, secret, to, model } = g;
        SecretGrant { id, secret, to: to.into(), model }
    }
}

/// Who a token belongs to.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Me {
    pub name: String,
    /// `operator`, `agent` or `executor`.
    pub kind: String,
    /// Capability flags, `rwxhludcts` then `m`, a `-` for each not held.
    pub flags: String,
    /// The home model.
    pub model: String,
}
