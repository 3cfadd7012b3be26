//! From the document's `paths` to operations: parameters merged and flattened with the body's
//! fields into one input schema, with the bindings that say where each property goes.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::naming::{self, flag_name};
use crate::pointer;
use crate::schema::{Converter, SchemaError, follow};
use crate::security;

use crate::{
    Binding, BodyEncoding, ImportError, ImportOptions, Imported, Location, Operation, RequestBody, Skipped, Style,
};

/// The operations of a path item, in the order tools are listed within one path.
const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/// Flags the tool command line keeps for itself; an input property may not be spelled as one.
const RESERVED_FLAGS: [&str; 3] = ["json", "json-file", "help"];

/// Why an operation cannot be imported.
enum OpError {
    /// The operation is left out, with this reason.
    Skip(String),
    /// The whole import's schema budget is spent: the document is refused.
    Budget,
}

impl From<SchemaError> for OpError {
    fn from(e: SchemaError) -> Self {
        match e {
            SchemaError::Unresolved(reason) => OpError::Skip(reason),
            SchemaError::Budget => OpError::Budget,
        }
    }
}

pub(crate) fn import_value(doc: &Value, options: &ImportOptions) -> Result<Imported, ImportError> {
    let limits = &options.limits;
    let Some(root) = doc.as_object() else {
        return Err(ImportError::NotAnObject { found: json_kind(doc) });
    };
    let openapi = check_version(root)?;
    pointer::refuse_external_refs(doc)?;

    let Some(paths) = root.get("paths").and_then(Value::as_object) else {
        let webhooks = root.get("webhooks").and_then(Value::as_object).map_or(0, Map::len);
        let reason = if webhooks > 0 {
            format!(
                "the document has no `paths`, only {webhooks} webhook(s), which the service calls rather than \
                 being called"
            )
        } else {
            "the document has no `paths` object".to_string()
        };
        return Err(ImportError::NoOperations { pointer: "/paths".into(), reason });
    };

    let count: usize = paths.values().map(|item| path_item(doc, item).map_or(0, count_operations)).sum();
    if count > limits.max_operations {
        return Err(ImportError::TooManyOperations { count, limit: limits.max_operations });
    }

    let mut total = 0usize;
    let mut built: Vec<(Option<&str>, Operation)> = Vec::new();
    let mut skipped = Vec::new();
    for (path, item) in paths {
        let item_pointer = pointer::join("/paths", path);
        let Some(item) = path_item(doc, item) else {
            skipped.push(Skipped { pointer: item_pointer, reason: "the path item is not an object".into() });
            continue;
        };
        for method in METHODS {
            let Some(op) = item.get(method) else { continue };
            let op_pointer = pointer::join(&item_pointer, method);
            let operation_id = op.get("operationId").and_then(Value::as_str);
            match build(doc, path, method, item, op, &mut total, limits.max_schema_nodes) {
                Ok(o) => built.push((operation_id, o)),
                Err(OpError::Skip(reason)) => skipped.push(Skipped { pointer: op_pointer, reason }),
                Err(OpError::Budget) => {
                    return Err(ImportError::TooManySchemaNodes { limit: limits.max_schema_nodes });
                }
            }
        }
    }

    let keys: Vec<(Option<&str>, &str, &str)> =
        built.iter().map(|(id, o)| (*id, o.method.as_str(), o.path.as_str())).collect();
    let names = naming::assign(&keys);
    let mut operations = Vec::new();
    for ((_, mut op), name) in built.into_iter().zip(names) {
        match name {
            Some(n) => {
                op.name = n;
                operations.push(op);
            }
            None => skipped.push(Skipped {
                pointer: pointer::join(&pointer::join("/paths", &op.path), &op.method.to_ascii_lowercase()),
                reason: "its tool name collides with another even with the hash of its method and path".into(),
            }),
        }
    }
    skipped.sort_by(|a, b| a.pointer.cmp(&b.pointer));

    if operations.is_empty() {
        let (pointer, reason) = match skipped.first() {
            Some(s) => (s.pointer.clone(), format!("every operation was skipped; the first because {}", s.reason)),
            None => ("/paths".to_string(), "`paths` has no operations".to_string()),
        };
        return Err(ImportError::NoOperations { pointer, reason });
    }

    if let Some(include) = &options.include {
        let unknown: Vec<String> =
            include.iter().filter(|n| !operations.iter().any(|o| &o.name == *n)).cloned().collect();
        if !unknown.is_empty() {
            return Err(ImportError::UnknownInclude { names: unknown });
        }
        operations.retain(|o| include.contains(&o.name));
        if operations.is_empty() {
            return Err(ImportError::NoOperations { pointer: "/paths".into(), reason: "include keeps none".into() });
        }
    }

    let method_rank = |m: &str| METHODS.iter().position(|x| x.eq_ignore_ascii_case(m)).unwrap_or(METHODS.len());
    operations
        .sort_by(|a, b| (a.path.as_str(), method_rank(&a.method)).cmp(&(b.path.as_str(), method_rank(&b.method))));

    let info = root.get("info");
    let text = |v: Option<&Value>| match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(v) => v.to_string(),
    };
    Ok(Imported {
        title: text(info.and_then(|i| i.get("title"))),
        version: text(info.and_then(|i| i.get("version"))),
        openapi,
        operations,
        skipped,
        security: security::schemes(doc),
    })
}

/// What a JSON value is, as a refusal says it: `an array`, `null`.
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The `openapi` version, when it is one this importer reads.
fn check_version(root: &Map<String, Value>) -> Result<String, ImportError> {
    let as_text = |v: &Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
    if let Some(v) = root.get("swagger") {
        return Err(ImportError::Swagger2 { version: as_text(v) });
    }
    let Some(v) = root.get("openapi") else {
        let mut keys: Vec<&str> = root.keys().map(String::as_str).collect();
        keys.sort_unstable();
        keys.truncate(6);
        if root.len() > keys.len() {
            keys.push("…");
        }
        let found = if keys.is_empty() { "an empty object".to_string() } else { format!("keys {}", keys.join(", ")) };
        return Err(ImportError::NotOpenApi { found });
    };
    // YAML reads `openapi: 3.0` as a number.
    let version = as_text(v);
    let supported = ["3.0", "3.1"].iter().any(|p| version == *p || version.starts_with(&format!("{p}.")));
    if supported {
        Ok(version)
    } else if version.starts_with('2') {
        Err(ImportError::Swagger2 { version })
    } else {
        Err(ImportError::UnsupportedVersion { version })
    }
}

/// A path item, through a `$ref` inside the document.
fn path_item<'d>(doc: &'d Value, item: &'d Value) -> Option<&'d Map<String, Value>> {
    match item.get("$ref").and_then(Value::as_str) {
        Some(r) => follow(doc, r).ok()?.1.as_object(),
        None => item.as_object(),
    }
}

fn count_operations(item: &Map<String, Value>) -> usize {
    METHODS.iter().filter(|m| item.contains_key(**m)).count()
}

/// One input property before its name is settled.
struct Field {
    name: String,
    location: Location,
    schema: Value,
    required: bool,
    style: Option<Style>,
    explode: bool,
    json: bool,
}

impl Field {
    /// The field as the input property `property`: its schema, and how its value is sent.
    fn bound_as(self, property: String) -> (Value, Binding) {
        let binding = Binding {
            property,
            location: self.location,
            name: self.name,
            style: self.style,
            explode: self.explode,
            json: self.json,
        };
        (self.schema, binding)
    }
}

/// `schema` without the null it allows at its top: `null` out of a type list (one type left is
/// that type), `{"type": "null"}` out of an `anyOf`/`oneOf` (one branch left is merged into the
/// schema where it adds keys), and null out of an `enum`. A schema that is only null is left.
fn without_null(schema: &mut Value) {
    let Value::Object(s) = schema else { return };
    let mut stripped = false;
    if let Some(Value::Array(ts)) = s.get_mut("type")
        && ts.len() > 1
        && ts.iter().any(|t| t == "null")
    {
        ts.retain(|t| t != "null");
        if ts.len() == 1 {
            let t = ts.remove(0);
            s.insert("type".into(), t);
        }
        stripped = true;
    }
    if let Some(Value::Array(vs)) = s.get_mut("enum")
        && vs.len() > 1
        && vs.iter().any(Value::is_null)
    {
        vs.retain(|v| !v.is_null());
        stripped = true;
    }
    for key in ["anyOf", "oneOf"] {
        let Some(Value::Array(mut branches)) = s.remove(key) else { continue };
        let is_null = |b: &Value| b.get("type").and_then(Value::as_str) == Some("null");
        let strip = branches.len() > 1 && branches.iter().any(is_null) && !branches.iter().all(is_null);
        if strip {
            branches.retain(|b| !is_null(b));
            // A branch that allows null itself (`{type: [string, null]}`) is read the same way.
            branches.iter_mut().for_each(without_null);
            stripped = true;
        }
        match branches.as_slice() {
            [Value::Object(only)] if strip && only.keys().all(|k| !s.contains_key(k)) => {
                let only = only.clone();
                s.extend(only);
            }
            _ => {
                s.insert(key.into(), Value::Array(branches));
            }
        }
    }
    // A null default would fill in the null just taken out, for a flag nobody gave.
    if stripped && s.get("default").is_some_and(Value::is_null) {
        s.remove("default");
    }
}

/// Whether `name` is an HTTP token (RFC 9110, 5.6.2), as a header's or a cookie's name must be.
fn is_token(name: &str) -> bool {
    name.bytes().all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c))
}

fn build<'d>(
    doc: &'d Value,
    path: &str,
    method: &str,
    item: &'d Map<String, Value>,
    op: &'d Value,
    total: &mut usize,
    max_total: usize,
) -> Result<Operation, OpError> {
    let Some(op) = op.as_object() else {
        return Err(OpError::Skip("the operation is not an object".into()));
    };
    if let Some(reason) = unusable_path(path) {
        return Err(OpError::Skip(reason));
    }
    let mut conv = Converter::new(doc, total, max_total);
    let template = template_variables(path);
    let mut fields = Vec::new();

    for param in merged_parameters(doc, item, op)? {
        let name = param.get("name").and_then(Value::as_str).unwrap_or_default();
        let location = match param.get("in").and_then(Value::as_str) {
            Some("path") => Location::Path,
            Some("query") => Location::Query,
            Some("header") => Location::Header,
            Some("cookie") => Location::Cookie,
            other => {
                return Err(OpError::Skip(format!(
                    "parameter {name:?} has `in: {}`, not path, query, header or cookie",
                    other.unwrap_or("(none)")
                )));
            }
        };
        if name.is_empty() {
            return Err(OpError::Skip("a parameter has no name".into()));
        }
        // A header's or a cookie's name goes on the wire as it is, and must be an HTTP token:
        // one that is not would fail every call.
        if matches!(location, Location::Header | Location::Cookie) && !is_token(name) {
            return Err(OpError::Skip(format!(
                "the {} parameter {name:?} is not a valid {} name (letters, digits and !#$%&'*+-.^_`|~ only)",
                if location == Location::Header { "header" } else { "cookie" },
                if location == Location::Header { "HTTP header" } else { "cookie" },
            )));
        }
        // OpenAPI: Accept, Content-Type and Authorization "SHALL be ignored"; the request sets
        // them itself. So it does the headers that frame the request or say where it goes: a
        // caller's Content-Length would cut the body short, a Host send it elsewhere.
        if location == Location::Header
            && (["accept", "content-type", "authorization"].contains(&name.to_ascii_lowercase().as_str())
                || crate::clients_header(name))
        {
            continue;
        }
        if location == Location::Path && !template.iter().any(|v| v == name) {
            continue;
        }
        let (mut schema, json) = match (param.get("schema"), param.get("content").and_then(Value::as_object)) {
            (Some(s), _) => (conv.convert(s)?, false),
            (None, Some(content)) => match content.values().next().and_then(|m| m.get("schema")) {
                Some(s) => (conv.convert(s)?, true),
                None => (json!({}), true),
            },
            (None, None) => (json!({"type": "string"}), false),
        };
        if let Value::Object(s) = &mut schema {
            if let Some(d) = param.get("description").filter(|d| d.is_string()) {
                s.insert("description".into(), d.clone());
            }
            if param.get("deprecated") == Some(&Value::Bool(true)) {
                s.insert("deprecated".into(), Value::Bool(true));
            }
        }
        let style = match param.get("style").and_then(Value::as_str) {
            Some("simple") => Style::Simple,
            Some("label") => Style::Label,
            Some("matrix") => Style::Matrix,
            Some("form") => Style::Form,
            Some("spaceDelimited") => Style::SpaceDelimited,
            Some("pipeDelimited") => Style::PipeDelimited,
            Some("deepObject") => Style::DeepObject,
            _ => match location {
                Location::Query | Location::Cookie => Style::Form,
                _ => Style::Simple,
            },
        };
        let explode = param.get("explode").and_then(Value::as_bool).unwrap_or(style == Style::Form);
        fields.push(Field {
            name: name.to_string(),
            location,
            schema,
            required: location == Location::Path || param.get("required") == Some(&Value::Bool(true)),
            style: Some(style),
            explode,
            json,
        });
    }
    // A path variable the document forgot to declare is still part of the URL.
    for var in &template {
        if !fields.iter().any(|f| f.location == Location::Path && &f.name == var) {
            fields.push(Field {
                name: var.clone(),
                location: Location::Path,
                schema: json!({"type": "string"}),
                required: true,
                style: Some(Style::Simple),
                explode: false,
                json: false,
            });
        }
    }

    let body = match op.get("requestBody") {
        Some(rb) => request_body(&mut conv, doc, rb, &mut fields)?,
        None => None,
    };
    // A required value that its place cannot send as null (all but a JSON body's field: a call
    // refuses it, "cannot carry null") is not offered null: no `--no-x`, no `|null`, no null in
    // the tool's schema, whatever the document's `nullable` says.
    let json_body = body.as_ref().is_some_and(|b| b.encoding == BodyEncoding::Json);
    for f in fields.iter_mut().filter(|f| f.required) {
        if !(f.location == Location::BodyField && json_body) {
            without_null(&mut f.schema);
        }
    }

    // The document's own names are settled first: a body's extra keys take whatever name is
    // left, so that they never rename a field the document has.
    let extra = fields.iter().position(|f| f.location == Location::BodyExtra).map(|i| fields.remove(i));
    let (mut properties, required, mut bindings) = settle_names(fields);
    if let Some(f) = extra {
        let free = |n: &String| !properties.contains_key(n) && !RESERVED_FLAGS.contains(&n.as_str());
        let property = ["extra-fields".to_string(), "body-extra-fields".to_string()]
            .into_iter()
            .chain((2..).map(|k| format!("body-extra-fields-{k}")))
            .find(free)
            .unwrap_or_default();
        let (schema, binding) = f.bound_as(property);
        properties.insert(binding.property.clone(), schema);
        bindings.push(binding);
    }
    let mut input_schema = json!({
        "type": "object",
        "properties": properties,
        "additionalProperties": false,
    });
    if !required.is_empty() {
        input_schema["required"] = json!(required);
    }
    conv.finish(&mut input_schema)?;

    let text = |k: &str| op.get(k).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
    Ok(Operation {
        name: String::new(),
        method: method.to_ascii_uppercase(),
        path: path.to_string(),
        summary: text("summary"),
        description: text("description"),
        input_schema,
        bindings,
        body,
        deprecated: op.get("deprecated") == Some(&Value::Bool(true)),
    })
}

/// Why a path template cannot be called under a base URL: one that does not start at `/`, or
/// one with a `.` or `..` segment, which URL parsers collapse, leaving the base URL's path.
fn unusable_path(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return Some(format!("the path {path:?} does not start with /"));
    }
    let template = path.split(['#', '?']).next().unwrap_or("");
    // Every `{` closed by a `}` before the next `{`, and no `}` alone: `/k/{id` names no variable
    // a call could fill, yet its parameter would be asked for.
    let mut open = false;
    for c in template.chars() {
        match (c, open) {
            ('{', false) => open = true,
            ('}', true) => open = false,
            ('{', true) | ('}', false) => return Some(format!("the path {path:?} has unbalanced braces")),
            _ => {}
        }
    }
    if open {
        return Some(format!("the path {path:?} has unbalanced braces"));
    }
    let dot = template.split('/').any(|segment| {
        let s = segment.to_ascii_lowercase().replace("%2e", ".");
        s == "." || s == ".."
    });
    dot.then(|| format!("the path {path:?} has a `.` or `..` segment"))
}

/// `/users/{id}/posts/{postId}` → `["id", "postId"]`.
pub(crate) fn template_variables(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else { break };
        out.push(after[..close].to_string());
        rest = &after[close + 1..];
    }
    out
}

/// The path item's parameters with the operation's over them: the operation wins by name and
/// location. Parameter `$ref`s are followed.
fn merged_parameters<'d>(
    doc: &'d Value,
    item: &'d Map<String, Value>,
    op: &'d Map<String, Value>,
) -> Result<Vec<&'d Map<String, Value>>, OpError> {
    let list = |v: Option<&'d Value>| -> Result<Vec<&'d Map<String, Value>>, OpError> {
        let Some(v) = v else { return Ok(Vec::new()) };
        let Some(items) = v.as_array() else {
            return Err(OpError::Skip("`parameters` is not an array".into()));
        };
        items
            .iter()
            .map(|p| {
                let p = match p.get("$ref").and_then(Value::as_str) {
                    Some(r) => follow(doc, r)?.1,
                    None => p,
                };
                p.as_object().ok_or_else(|| OpError::Skip("a parameter is not an object".into()))
            })
            .collect()
    };
    let key = |p: &Map<String, Value>| {
        (
            p.get("name").and_then(Value::as_str).map(str::to_string),
            p.get("in").and_then(Value::as_str).map(str::to_string),
        )
    };
    let own = list(op.get("parameters"))?;
    let mut out: Vec<&Map<String, Value>> = Vec::new();
    for p in list(item.get("parameters"))? {
        if !own.iter().any(|o| key(o) == key(p)) {
            out.push(p);
        }
    }
    out.extend(own);
    Ok(out)
}

/// How a media type is written, and how much it is preferred (lower first).
fn classify(media_type: &str) -> (BodyEncoding, u8) {
    let essence = media_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if essence == "application/json" {
        (BodyEncoding::Json, if media_type.contains(';') { 1 } else { 0 })
    } else if essence.ends_with("+json") || essence.ends_with("/json") {
        (BodyEncoding::Json, 2)
    } else if essence == "application/x-www-form-urlencoded" {
        (BodyEncoding::Form, 3)
    } else if essence.starts_with("multipart/") {
        (BodyEncoding::Multipart, 4)
    } else {
        (BodyEncoding::Raw, 5)
    }
}

/// Adds the body's fields (or the one `body` property) and answers how the body is sent.
fn request_body<'d>(
    conv: &mut Converter<'d, '_>,
    doc: &'d Value,
    rb: &'d Value,
    fields: &mut Vec<Field>,
) -> Result<Option<RequestBody>, OpError> {
    let rb = match rb.get("$ref").and_then(Value::as_str) {
        Some(r) => follow(doc, r)?.1,
        None => rb,
    };
    let Some(content) = rb.get("content").and_then(Value::as_object) else {
        return Ok(None);
    };
    // The most preferred; ties go to the first name in byte order, so the choice does not hang on
    // whether maps keep the document's order.
    let Some((media_type, media)) = content.iter().min_by_key(|(mt, _)| (classify(mt).1, mt.as_str())) else {
        return Ok(None);
    };
    let (encoding, _) = classify(media_type);
    let required = rb.get("required") == Some(&Value::Bool(true));
    let description = rb.get("description").filter(|d| d.is_string()).cloned();
    let schema = match media.get("schema") {
        Some(s) => conv.convert(s)?,
        None => json!({}),
    };
    let whole = |schema: Value| {
        let mut schema = schema;
        if let (Value::Object(s), Some(d)) = (&mut schema, &description) {
            s.entry("description").or_insert(d.clone());
        }
        Field {
            name: String::new(),
            location: Location::Body,
            schema,
            required,
            style: None,
            explode: false,
            json: false,
        }
    };
    if encoding == BodyEncoding::Raw {
        let mut s = json!({"type": "string"});
        if schema.get("format").and_then(Value::as_str) == Some("binary") || !media_type.starts_with("text/") {
            s["format"] = json!("binary");
        }
        fields.push(whole(s));
    } else {
        match object_fields(&schema) {
            Some((mut props, req)) => {
                // By name: a collision's numbering must not hang on map order either.
                props.sort_by(|a, b| a.0.cmp(&b.0));
                // A multipart part's name is written in its quoted header: one that holds a quote
                // or a line break cannot be sent, and would fail every call.
                if encoding == BodyEncoding::Multipart
                    && let Some((name, _)) = props.iter().find(|(n, _)| n.contains(['"', '\r', '\n']))
                {
                    return Err(OpError::Skip(format!(
                        "the multipart body's field {name:?} holds a quote or line break, which a part's name cannot"
                    )));
                }
                for (name, s) in props {
                    fields.push(Field {
                        required: required && req.contains(&name),
                        name,
                        location: Location::BodyField,
                        schema: s,
                        style: None,
                        explode: false,
                        json: false,
                    });
                }
                // Keys beyond the named ones, where the body takes them (`additionalProperties`
                // true or a schema; left out, it is not taken as an invitation): one object
                // field, merged into a JSON or form body.
                let extra = schema.get("additionalProperties").filter(|a| a.is_object() || **a == Value::Bool(true));
                if let Some(extra) = extra.filter(|_| matches!(encoding, BodyEncoding::Json | BodyEncoding::Form)) {
                    fields.push(Field {
                        name: String::new(),
                        location: Location::BodyExtra,
                        schema: json!({
                            "type": "object",
                            "additionalProperties": extra,
                            "description": "More fields of the body, beyond its named ones, as one JSON object: {\"key\": value}",
                        }),
                        required: false,
                        style: None,
                        explode: false,
                        json: false,
                    });
                }
            }
            None => fields.push(whole(schema)),
        }
    }
    Ok(Some(RequestBody { media_type: media_type.clone(), encoding, required }))
}

/// A property's name and schema.
type Property = (String, Value);

/// The properties (and required names) an object body is flattened into. A `oneOf`/`anyOf` of
/// objects is flattened into the union of its branches' properties, required where every branch
/// requires it; a property the branches fix to different constants becomes their `enum`.
fn object_fields(schema: &Value) -> Option<(Vec<Property>, Vec<String>)> {
    let s = schema.as_object()?;
    let required_of = |s: &Map<String, Value>| -> Vec<String> {
        s.get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default()
    };
    let is_object = |s: &Map<String, Value>| {
        !s.contains_key("$ref")
            && match s.get("type") {
                None => true,
                Some(Value::String(t)) => t == "object",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
                _ => false,
            }
    };
    if !is_object(s) {
        return None;
    }
    let mut props: Vec<Property> = Vec::new();
    let mut required = required_of(s);
    if let Some(p) = s.get("properties").and_then(Value::as_object) {
        props.extend(p.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let branches = s.get("oneOf").or_else(|| s.get("anyOf")).and_then(Value::as_array);
    if let Some(branches) = branches {
        let objects: Option<Vec<&Map<String, Value>>> = branches
            .iter()
            .map(|b| b.as_object().filter(|b| is_object(b) && b.get("properties").is_some_and(Value::is_object)))
            .collect();
        let objects = objects?;
        if objects.is_empty() {
            return None;
        }
        let mut common: Option<Vec<String>> = None;
        let mut union: BTreeMap<String, usize> = BTreeMap::new();
        for b in &objects {
            let req = required_of(b);
            common = Some(match common {
                None => req,
                Some(c) => c.into_iter().filter(|r| req.contains(r)).collect(),
            });
            for (name, p) in b.get("properties").and_then(Value::as_object).into_iter().flatten() {
                match union.get(name) {
                    Some(&i) => merge_constants(&mut props[i].1, p),
                    None => {
                        if let Some(i) = props.iter().position(|(n, _)| n == name) {
                            union.insert(name.clone(), i);
                            merge_constants(&mut props[i].1, p);
                        } else {
                            union.insert(name.clone(), props.len());
                            props.push((name.clone(), p.clone()));
                        }
                    }
                }
            }
        }
        for r in common.unwrap_or_default() {
            if !required.contains(&r) {
                required.push(r);
            }
        }
    }
    if props.is_empty() {
        return None;
    }
    Some((props, required))
}

/// Two branches' versions of one property: constants and enums are united, so that a
/// discriminator (`method: password` in one branch, `method: oidc` in another) takes either.
fn merge_constants(have: &mut Value, other: &Value) {
    let values = |v: &Value| -> Option<Vec<Value>> {
        v.get("const").map(|c| vec![c.clone()]).or_else(|| v.get("enum").and_then(Value::as_array).cloned())
    };
    let (Some(mut a), Some(b)) = (values(have), values(other)) else { return };
    for v in b {
        if !a.contains(&v) {
            a.push(v);
        }
    }
    if let Value::Object(h) = have {
        h.remove("const");
        h.insert("enum".into(), Value::Array(a));
    }
}

/// Gives every field its property name: its flag name, or, when that name is taken by another
/// location or is a reserved flag, the name with its location in front (`path-id`, `body-id`).
fn settle_names(fields: Vec<Field>) -> (Map<String, Value>, Vec<String>, Vec<Binding>) {
    let base: Vec<String> = fields
        .iter()
        .map(|f| match f.location {
            Location::Body => "body".to_string(),
            _ => flag_name(&f.name),
        })
        .collect();
    let mut uses: BTreeMap<&str, usize> = BTreeMap::new();
    for b in &base {
        *uses.entry(b.as_str()).or_default() += 1;
    }
    let mut names: Vec<String> = fields
        .iter()
        .zip(&base)
        .map(|(f, b)| {
            if b.is_empty() {
                f.location.prefix().to_string()
            } else if uses[b.as_str()] > 1 || RESERVED_FLAGS.contains(&b.as_str()) {
                format!("{}-{b}", f.location.prefix())
            } else {
                b.clone()
            }
        })
        .collect();
    // Names still equal (two headers differing in case, a field called `path-id` beside a
    // prefixed `id`) are numbered in field order.
    let mut taken: BTreeMap<String, usize> = BTreeMap::new();
    for n in &mut names {
        let count = taken.entry(n.clone()).or_default();
        *count += 1;
        if *count > 1 {
            let mut k = *count;
            let mut candidate = format!("{n}-{k}");
            while taken.contains_key(&candidate) {
                k += 1;
                candidate = format!("{n}-{k}");
            }
            taken.insert(candidate.clone(), 1);
            *n = candidate;
        }
    }
    let mut properties = Map::new();
    let mut required = Vec::new();
    let mut bindings = Vec::new();
    for (f, property) in fields.into_iter().zip(names) {
        if f.required {
            required.push(property.clone());
        }
        let (schema, binding) = f.bound_as(property);
        properties.insert(binding.property.clone(), schema);
        bindings.push(binding);
    }
    (properties, required, bindings)
}
