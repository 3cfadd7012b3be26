//! From an OpenAPI document to tools, and from one tool call to the HTTP request it makes.
//!
//! Pure: no I/O, no clock, nothing fetched. [`import`] reads a document (JSON or YAML, OpenAPI 3.0
//! or 3.1) into [`Imported`]: one [`Operation`] per usable operation, with its tool name, its input
//! JSON Schema (the flags) and the [`Binding`]s that say where each input property goes.
//! [`build_request`] turns one call's input into a [`Request`].

pub mod dataurl;
mod document;
mod error;
mod naming;
mod operation;
mod pointer;
mod request;
mod schema;
mod security;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use error::{CallError, ImportError};
pub use naming::flag_name;
pub use operation::json_kind;
pub use request::build_request;

/// How much of a document the importer is willing to read. Every refusal names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of the document text.
    pub max_bytes: usize,
    /// How deep the document nests (`{"a": [1]}` is 2).
    pub max_depth: usize,
    /// Values in the document once YAML aliases are expanded: an alias repeats its anchor's
    /// whole subtree, so a few hundred bytes can stand for billions of values.
    pub max_nodes: usize,
    /// Operations under `paths`.
    pub max_operations: usize,
    /// Schema objects produced for all input schemas together, once `$ref`s are resolved.
    pub max_schema_nodes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 8 << 20,
            max_depth: 100,
            max_nodes: 4_000_000,
            max_operations: 5_000,
            max_schema_nodes: 1_000_000,
        }
    }
}

/// What to import.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// Keep only these tools (by tool name); every name must exist.
    pub include: Option<Vec<String>>,
    pub limits: Limits,
}

/// A document turned into tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Imported {
    /// `info.title`.
    pub title: String,
    /// `info.version`.
    pub version: String,
    /// The `openapi` field (`3.0.3`, `3.1.0`).
    pub openapi: String,
    /// Ordered by path, then method.
    pub operations: Vec<Operation>,
    /// Operations that could not be imported, each with why.
    pub skipped: Vec<Skipped>,
    /// The security schemes the document declares, by name.
    pub security: Vec<SecurityScheme>,
}

/// One operation: one tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// `[a-z0-9][a-z0-9-]{0,63}`, unique in the document.
    pub name: String,
    /// Upper case: `GET`.
    pub method: String,
    /// The path template as the document writes it: `/users/{id}`.
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema of type object; its property names are the flags.
    pub input_schema: Value,
    /// Where each input property goes, one per property.
    pub bindings: Vec<Binding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<RequestBody>,
    #[serde(default)]
    pub deprecated: bool,
}

/// The request body an operation sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestBody {
    /// The media type chosen among those the document offers: `application/json`.
    pub media_type: String,
    pub encoding: BodyEncoding,
    pub required: bool,
}

/// How the body is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BodyEncoding {
    Json,
    /// `application/x-www-form-urlencoded`.
    Form,
    /// `multipart/form-data`.
    Multipart,
    /// Text or bytes, sent as given.
    Raw,
}

/// Where one input property goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Binding {
    /// The input property (and flag): `id`, `path-id`.
    pub property: String,
    pub location: Location,
    /// The name the document gives it: the parameter's or the body field's (empty for the whole
    /// body).
    pub name: String,
    /// How a parameter's value is serialized; none for the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub style: Option<Style>,
    #[serde(default)]
    pub explode: bool,
    /// A parameter described by `content` rather than `schema`: its value is sent as JSON text.
    #[serde(default)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Location {
    Path,
    Query,
    Header,
    Cookie,
    /// One field of an object body.
    BodyField,
    /// Keys of an object body beyond its named properties, as its `additionalProperties` allows,
    /// given as one object (`--extra-fields '{"color": "red"}'`) and merged into the body.
    BodyExtra,
    /// The whole body.
    Body,
}

impl Location {
    /// The prefix that tells apart properties of the same name: `path-id`, `body-id`.
    pub fn prefix(self) -> &'static str {
        match self {
            Location::Path => "path",
            Location::Query => "query",
            Location::Header => "header",
            Location::Cookie => "cookie",
            Location::BodyField | Location::Body | Location::BodyExtra => "body",
        }
    }
}

/// OpenAPI's parameter styles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Style {
    Simple,
    Label,
    Matrix,
    Form,
    SpaceDelimited,
    PipeDelimited,
    DeepObject,
}

/// An operation left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// JSON pointer to the operation (or the path item): `/paths/~1users~1{id}/get`.
    pub pointer: String,
    pub reason: String,
}

/// A security scheme the document declares, for checking the credential a registration names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecurityScheme {
    /// Its key under `components.securitySchemes`.
    pub name: String,
    pub kind: SecurityKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum SecurityKind {
    Bearer,
    Basic,
    /// Another `http` scheme (`digest`, ...).
    Http {
        scheme: String,
    },
    ApiKey {
        location: Location,
        name: String,
    },
    OAuth2,
    OpenIdConnect,
    MutualTls,
    Unknown {
        declared: String,
    },
}

/// A request ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub content_type: Option<String>,
}

/// Imports a document given as text: JSON or YAML, told apart by its first character.
/// A header the client writes itself, which neither a caller's value nor a credential may set:
/// those that frame the request or its connection (`Content-Length`, `Transfer-Encoding`,
/// `Connection`, `Proxy-*` …) and those that say where it goes or came from (`Host`,
/// `Forwarded`, `X-Forwarded-*`), which a proxy or the service may follow.
pub fn clients_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    ["content-length", "transfer-encoding", "connection", "te", "upgrade", "keep-alive", "trailer", "host", "forwarded"]
        .contains(&lower.as_str())
        || lower.starts_with("proxy-")
        || lower.starts_with("x-forwarded-")
}

/// The path the document's first server puts before every operation's path: `/v1` for a
/// server `/v1` or `http://localhost:8080/v1/` (a variable taking its default), empty for none,
/// for `/`, and for a URL that is not a path's. What a service that runs where it is told (a
/// container) is called at.
pub fn server_path(doc: &[u8], options: &ImportOptions) -> Result<String, ImportError> {
    let value = document::read(doc, &options.limits)?;
    let mut url = value.pointer("/servers/0/url").and_then(Value::as_str).unwrap_or("").to_string();
    // A variable takes its default (`http://localhost:{port}/{version}`).
    if let Some(vars) = value.pointer("/servers/0/variables").and_then(Value::as_object) {
        for (name, var) in vars {
            if let Some(default) = var.get("default").and_then(Value::as_str) {
                url = url.replace(&format!("{{{name}}}"), default);
            }
        }
    }
    // What is left unknown, or is not a path's (a query, spaces), is not guessed at.
    if url.contains(['{', '}', '?', '#']) || url.chars().any(char::is_whitespace) {
        return Ok(String::new());
    }
    let url = url.as_str();
    let path = match url.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("", |i| &rest[i..]),
        None if url.starts_with('/') => url,
        None => "",
    };
    Ok(path.trim_end_matches('/').to_string())
}

pub fn import(doc: &[u8], options: &ImportOptions) -> Result<Imported, ImportError> {
    let value = document::read(doc, &options.limits)?;
    operation::import_value(&value, options)
}

/// Imports a document already parsed (a JSON object sent inline). The same limits apply, but
/// the size of the text it came from.
pub fn import_value(doc: &Value, options: &ImportOptions) -> Result<Imported, ImportError> {
    document::check_value(doc, &options.limits)?;
    operation::import_value(doc, options)
}
