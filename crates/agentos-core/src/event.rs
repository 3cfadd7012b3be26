//! Events: one per change, appended to the log; the state is their fold.

use serde::{Deserialize, Serialize};

use crate::entry::CatalogEntry;
use crate::flags::Flags;
// Defined apart so that entries and net state need not import events; re-exported here for
// the callers that know them from here.
pub use crate::OPERATOR_ID;
pub use crate::time::format_time;
use crate::{CoreError, ErrorKind};

/// Bumped whenever an event payload changes shape; every event records the version it was written with.
pub const EVENT_SCHEMA_VERSION: u32 = 1;

/// The typed body of an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "payload")]
pub enum EventBody {
    /// A model came into being (by its first registration).
    ModelCreated { name: String },
    /// A catalog entry was written (upsert by id within the event's model).
    ToolRegistered {
        entry: CatalogEntry,
        /// The id of the principal that owns the entry; only it or the operator may replace or remove it.
        /// Absent in events written before owners were recorded: such entries belong to the operator.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
    },
    /// A catalog entry was removed from the event's model.
    ToolRemoved { id: String },
    /// A principal was created. Only the sha256 of its token is kept.
    PrincipalCreated(PrincipalRecord),
    /// A principal's token stops working.
    PrincipalRevoked { name: String },
    /// A secret was set. Only its ciphertext is kept; the key is not in the log.
    SecretSet(SecretRecord),
    /// A change to a model's net or the tokens in its places.
    Net(crate::net_state::NetEvent),
    /// The operator let an agent act in a model besides its home model.
    ModelGranted(ModelGrant),
    /// A model grant ends.
    ModelGrantRevoked(ModelGrant),
    /// The operator let a secret be used by one pinned tool or for requests to one origin.
    SecretGranted(SecretGrant),
    /// A secret grant ends.
    SecretGrantRevoked { id: String },
    /// A command job ended: the one result recorded for it.
    JobFinished {
        #[serde(rename = "jobId")]
        job_id: String,
        #[serde(rename = "toolId", default, skip_serializing_if = "Option::is_none")]
        tool_id: Option<String>,
        result: crate::job::JobResult,
        /// The principal (id) that invoked the job directly: it may read the result without `l`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        invoker: Option<String>,
    },
    /// The operator started the master with `--skip-event SEQ`: the event at `seq` could not be
    /// read, and every fold treats it as never written.
    EventSkipped {
        seq: u64,
        /// Why it could not be read, as the master reported it.
        reason: String,
    },
}

/// The key all skip records share, so a fold finds them in one lookup before it starts.
pub const SKIP_KEY: &str = "log:skipped";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrincipalRecord {
    /// Stable and never reused: authority recorded on nets and tokens names principals by id, so an
    /// agent created later under a revoked agent's name inherits nothing. Records written before ids
    /// existed get one derived from their token hash when folded.
    #[serde(default)]
    pub id: String,
    pub name: String,
    pub kind: PrincipalKind,
    /// Flags in their full positional form.
    pub flags: String,
    pub home_model: String,
    pub token_sha256: String,
}

/// An agent may act in `model` (its net, tokens, watch stream, jobs) as in its home model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelGrant {
    /// The principal's id.
    pub principal: String,
    /// Its name when granted, for people reading the log.
    pub name: String,
    pub model: String,
}

/// What a secret may be used for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// A secret granted to a use, optionally only in one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretGrant {
    /// Derived from the rest, so granting the same thing twice is one grant.
    pub id: String,
    pub secret: String,
    pub to: GrantTarget,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl SecretGrant {
    pub fn new(secret: &str, to: GrantTarget, model: Option<String>) -> SecretGrant {
        let target = match &to {
            GrantTarget::Tool { id, model, sha256 } => format!("tool|{model}|{id}|{sha256}"),
            GrantTarget::Origin { origin } => format!("origin|{origin}"),
        };
        let key = format!("{secret}|{target}|{}", model.as_deref().unwrap_or(""));
        let id = format!("sg-{}", &crate::sha256_hex(key.as_bytes())[..12]);
        SecretGrant { id, secret: secret.to_string(), to, model }
    }
}

/// A secret at rest: XChaCha20-Poly1305 with a key kept outside the log, the name as associated data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretRecord {
    pub name: String,
    /// base64
    pub nonce: String,
    /// base64
    pub ciphertext: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrincipalKind {
    Operator,
    Agent,
    /// Good for the executor protocol and nothing else.
    Executor,
}

impl EventBody {
    /// Every event type's name, as [`EventBody::type_name`] gives it and the log reads it (a
    /// test holds this list to the types the log reads; `type_name` writes the same names, or
    /// no event would read back).
    pub const TYPE_NAMES: [&'static str; 13] = [
        "ModelCreated",
        "ToolRegistered",
        "ToolRemoved",
        "PrincipalCreated",
        "PrincipalRevoked",
        "SecretSet",
        "ModelGranted",
        "ModelGrantRevoked",
        "SecretGranted",
        "SecretGrantRevoked",
        "JobFinished",
        "Net",
        "EventSkipped",
    ];

    pub fn type_name(&self) -> &'static str {
        match self {
            EventBody::ModelCreated { .. } => "ModelCreated",
            EventBody::ToolRegistered { .. } => "ToolRegistered",
            EventBody::ToolRemoved { .. } => "ToolRemoved",
            EventBody::PrincipalCreated(_) => "PrincipalCreated",
            EventBody::PrincipalRevoked { .. } => "PrincipalRevoked",
            EventBody::SecretSet(_) => "SecretSet",
            EventBody::ModelGranted(_) => "ModelGranted",
            EventBody::ModelGrantRevoked(_) => "ModelGrantRevoked",
            EventBody::SecretGranted(_) => "SecretGranted",
            EventBody::SecretGrantRevoked { .. } => "SecretGrantRevoked",
            EventBody::JobFinished { .. } => "JobFinished",
            EventBody::Net(_) => "Net",
            EventBody::EventSkipped { .. } => "EventSkipped",
        }
    }
    /// The entity the event is about, indexed by the log so one entity's history is one lookup.
    pub fn key(&self) -> String {
        match self {
            EventBody::ModelCreated { name } => format!("model:{name}"),
            EventBody::ToolRegistered { entry, .. } => format!("tool:{}", entry.id),
            EventBody::ToolRemoved { id } => format!("tool:{id}"),
            EventBody::PrincipalCreated(p) => format!("principal:{}", p.name),
            EventBody::PrincipalRevoked { name } => format!("principal:{name}"),
            EventBody::SecretSet(s) => format!("secret:{}", s.name),
            EventBody::ModelGranted(g) | EventBody::ModelGrantRevoked(g) => format!("principal:{}", g.name),
            EventBody::SecretGranted(g) => format!("secret:{}", g.secret),
            EventBody::SecretGrantRevoked { id } => format!("secret-grant:{id}"),
            EventBody::JobFinished { job_id, .. } => format!("job:{job_id}"),
            EventBody::Net(_) => "net".to_string(),
            EventBody::EventSkipped { .. } => SKIP_KEY.to_string(),
        }
    }
    /// Splits into the log's `type` and `payload` columns.
    pub fn to_parts(&self) -> (&'static str, String) {
        let mut v = serde_json::to_value(self).expect("event bodies always serialize");
        // Taken out, not copied: a job's result or a net's tokens can be large.
        let payload = v.get_mut("payload").map_or(serde_json::Value::Null, serde_json::Value::take);
        (self.type_name(), payload.to_string())
    }
    /// Rebuilds a body from the log's columns.
    pub fn from_parts(kind: &str, payload: &str) -> Result<Self, CoreError> {
        // Any depth: an older version wrote payloads deeper than serde_json reads by default, and
        // a log that cannot be read keeps the master from starting.
        let payload: serde_json::Value = crate::depth::from_str_any_depth(payload).map_err(|e| {
            CoreError::new(
                ErrorKind::Corrupt,
                "event_corrupt",
                format!("event payload of type {kind} is not JSON: {e}"),
            )
        })?;
        crate::depth::from_value_any_depth(serde_json::json!({"type": kind, "payload": payload})).map_err(|e| {
            CoreError::new(
                ErrorKind::Corrupt,
                "event_corrupt",
                format!("event of type {kind} does not match its schema: {e}"),
            )
        })
    }
}

/// An event as committed to the log.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub seq: u64,
    pub model: String,
    pub body: EventBody,
    pub principal: String,
    /// Milliseconds since the Unix epoch.
    pub time: i64,
    pub schema: u32,
}

/// An event as its readers see it (history, audit): the payload without secrets, the time in RFC 3339.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    pub seq: u64,
    pub model: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub payload: serde_json::Value,
    pub principal: String,
    pub time: String,
    /// Schema version the event was written with.
    pub v: u32,
}

impl Event {
    pub fn view(&self) -> EventView {
        let mut v = serde_json::to_value(&self.body).expect("event bodies always serialize");
        // Even ciphertext stays inside: the name is what a reader of the log needs.
        if let EventBody::SecretSet(s) = &self.body {
            v = serde_json::json!({"payload": {"name": s.name}});
        }
        EventView {
            seq: self.seq,
            model: self.model.clone(),
            kind: self.body.type_name().to_string(),
            payload: v.get("payload").cloned().unwrap_or_default(),
            principal: self.principal.clone(),
            time: format_time(self.time),
            v: self.schema,
        }
    }
}

impl PrincipalRecord {
    pub fn parsed_flags(&self) -> Flags {
        self.flags.parse().unwrap_or_default()
    }
    /// The id of a record written before ids existed: the operator keeps one id across token
    /// rotations; anyone else's comes from the token hash, which no later principal shares.
    pub fn legacy_id(&self) -> String {
        match self.kind {
            PrincipalKind::Operator => OPERATOR_ID.to_string(),
            _ => format!("p-{}", &self.token_sha256[..self.token_sha256.len().min(16)]),
        }
    }
}
