//! The two ways this crate fails: a document refused whole, and a call whose input cannot make a
//! request.

/// Why a whole document is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    #[error("the document is {size} bytes, over the limit max_bytes = {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("the document nests deeper than the limit max_depth = {limit}")]
    TooDeep { limit: usize },
    #[error(
        "the document has more than max_nodes = {limit} values once YAML aliases are expanded \
         (an alias repeats its anchor's whole subtree)"
    )]
    TooManyNodes { limit: usize },
    #[error(
        "the document's YAML aliases repeat more than the YAML reader allows ({reason}): an alias \
         repeats its anchor's whole subtree"
    )]
    YamlAliases { reason: String },
    #[error("the document has {count} operations, over the limit max_operations = {limit}")]
    TooManyOperations { count: usize, limit: usize },
    #[error(
        "the input schemas need more than max_schema_nodes = {limit} schema objects once $refs are \
         resolved"
    )]
    TooManySchemaNodes { limit: usize },
    #[error("the document is not valid {format}: {message}")]
    Syntax { format: &'static str, message: String },
    #[error("the document is {found}, not an object")]
    NotAnObject { found: &'static str },
    #[error("Swagger {version} is not supported: convert it to OpenAPI 3 first (for example with swagger2openapi)")]
    Swagger2 { version: String },
    #[error("not an OpenAPI document: it has no `openapi` field (found {found})")]
    NotOpenApi { found: String },
    #[error("OpenAPI {version} is not supported: only 3.0.x and 3.1.x are")]
    UnsupportedVersion { version: String },
    #[error(
        "the document refers to another document at {pointer} ({reference:?}); only references inside \
         the document (#/...) are followed, and nothing is fetched"
    )]
    ExternalRef { pointer: String, reference: String },
    #[error("no usable operation at {pointer}: {reason}")]
    NoOperations { pointer: String, reason: String },
    #[error("include names tools the document does not have: {}", names.join(", "))]
    UnknownInclude { names: Vec<String> },
}

/// Why one call's input cannot become a request. Input properties are named as the flags that
/// set them (`--path-id`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("the input must be a JSON object")]
    NotAnObject,
    #[error("unknown flag --{flag}")]
    UnknownFlag { flag: String },
    #[error("Missing required flag: --{flag}")]
    MissingFlag { flag: String },
    #[error("--{flag}: {reason}")]
    BadValue { flag: String, reason: String },
    #[error("base URL {url:?}: {reason}")]
    BaseUrl { url: String, reason: String },
}
