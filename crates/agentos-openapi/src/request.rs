//! One tool call's input → the HTTP request it makes: path templating, query, headers, cookies
//! and the body, each serialized as the operation's bindings say.
//!
//! Every value placed in the path is percent-escaped on its own, so no value can add a `/` or
//! a query; a value that is a whole `.` or `..` segment is refused, since URL parsers (WHATWG, and
//! the `url` crate behind reqwest) collapse such segments, and `%2e%2e` too.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::dataurl::DataUrl;
use crate::{Binding, BodyEncoding, CallError, Location, Operation, Request, Style};

/// Builds the request of one call. `base_url` replaces the document's servers: its path is kept
/// and the operation's path is appended to it.
pub fn build_request(base_url: &str, op: &Operation, input: &Value) -> Result<Request, CallError> {
    let Some(input) = input.as_object() else {
        return Err(CallError::NotAnObject);
    };
    for key in input.keys() {
        if !op.bindings.iter().any(|b| &b.property == key) {
            return Err(CallError::UnknownFlag { flag: key.clone() });
        }
    }
    if let Some(required) = op.input_schema.get("required").and_then(Value::as_array) {
        for r in required.iter().filter_map(Value::as_str) {
            // A null is a value only where it can be sent: in a JSON body (a field the schema
            // lets be null, `Optional[int]` with no default, says so).
            let sent = match input.get(r) {
                None => false,
                Some(Value::Null) => {
                    let Some(b) = op.bindings.iter().find(|b| b.property == r) else {
                        return Err(CallError::MissingFlag { flag: r.to_string() });
                    };
                    if !null_sent(op, b) {
                        // Given as null, which its place cannot carry: said as such, not as
                        // a flag left out (the schema may well allow null).
                        let place = match (b.location, op.body.as_ref().map(|rb| rb.encoding)) {
                            (Location::Path, _) => "the path",
                            (Location::Query, _) => "a query",
                            (Location::Header, _) => "a header",
                            (Location::Cookie, _) => "a cookie",
                            (Location::BodyField, Some(BodyEncoding::Form | BodyEncoding::Multipart)) => "a form body",
                            _ => "this body",
                        };
                        return Err(CallError::BadValue {
                            flag: r.to_string(),
                            reason: format!("{place} cannot carry null, and the service requires a value: give one"),
                        });
                    }
                    true
                }
                Some(_) => true,
            };
            if !sent {
                return Err(CallError::MissingFlag { flag: r.to_string() });
            }
        }
    }
    let present = |b: &Binding| input.get(&b.property).filter(|v| !v.is_null());

    // The document's path may carry a fragment that only told two operations apart
    // (`/oauth2/token#refresh`) and a fixed query (`/search?type=user`).
    let template = op.path.split('#').next().unwrap_or("");
    let (template, fixed_query) = match template.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (template, None),
    };
    let mut path = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        path.push_str(&literal(&rest[..open]));
        let after = &rest[open + 1..];
        let close = after.find('}').unwrap_or(after.len());
        let var = &after[..close];
        let binding = op
            .bindings
            .iter()
            .find(|b| b.location == Location::Path && b.name == var)
            .ok_or_else(|| CallError::MissingFlag { flag: crate::flag_name(var) })?;
        let value = present(binding).ok_or_else(|| CallError::MissingFlag { flag: binding.property.clone() })?;
        path.push_str(&path_value(binding, value)?);
        rest = after.get(close + 1..).unwrap_or("");
    }
    path.push_str(&literal(rest));

    let mut url = join_base(base_url, &path)?;
    let mut query: Vec<String> = fixed_query.filter(|q| !q.is_empty()).map(|q| vec![literal(q)]).unwrap_or_default();
    let mut headers = Vec::new();
    let mut cookies = Vec::new();
    for b in &op.bindings {
        let Some(value) = present(b) else { continue };
        match b.location {
            Location::Query => query.extend(query_pairs(b, value)),
            Location::Header => {
                let text = header_value(b, value)?;
                headers.push((b.name.clone(), text));
            }
            Location::Cookie => {
                let text = if b.json { value.to_string() } else { joined(value, ",", false) };
                cookies.push(format!("{}={}", b.name, encode(&text, COOKIE_SAFE)));
            }
            _ => {}
        }
    }
    if !query.is_empty() {
        url.push('?');
        url.push_str(&query.join("&"));
    }
    if !cookies.is_empty() {
        headers.push(("Cookie".to_string(), cookies.join("; ")));
    }
    let (body, content_type) = body(op, input)?;
    Ok(Request { method: op.method.clone(), url, headers, body, content_type })
}

/// `https://api.example.com/v1/` + `/users` → `https://api.example.com/v1/users`.
fn join_base(base_url: &str, path: &str) -> Result<String, CallError> {
    let bad = |reason: &str| CallError::BaseUrl { url: base_url.to_string(), reason: reason.to_string() };
    let Some((scheme, rest)) = base_url.split_once("://") else {
        return Err(bad("expected http:// or https://"));
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(bad("expected http:// or https://"));
    }
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad("no host"));
    }
    if base_url.contains(['?', '#']) {
        return Err(bad("a base URL has no query or fragment"));
    }
    let base = base_url.trim_end_matches('/');
    let path = path.trim_start_matches('/');
    Ok(if path.is_empty() { format!("{base}/") } else { format!("{base}/{path}") })
}

/// The document's own text of a path, as a URL path: what may stand in a path as it is (`/`,
/// sub-delimiters, `:`, `@`, escapes already written) is kept; a space or a non-ASCII letter is
/// escaped.
fn literal(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    for (i, &c) in b.iter().enumerate() {
        let escape_written =
            c == b'%' && b.len() > i + 2 && b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit();
        if c.is_ascii_alphanumeric() || b"-._~/!$&'()*+,;=:@".contains(&c) || escape_written {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// RFC 3986 unreserved characters: everything else is escaped.
const UNRESERVED: &[u8] = b"-._~";
/// deepObject names keep their brackets.
const BRACKETS: &[u8] = b"-._~[]";
/// Cookie values may also hold these without escaping, but escaping them costs nothing and keeps
/// one rule.
const COOKIE_SAFE: &[u8] = b"-._~";

fn encode(text: &str, safe: &[u8]) -> String {
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if b.is_ascii_alphanumeric() || safe.contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A scalar as text: strings as they are, other values as JSON writes them.
fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// An array or object as one text, unescaped: `a,b` or `k,v,k2,v2` (`k=v,k2=v2` exploded).
fn joined(v: &Value, sep: &str, explode: bool) -> String {
    match v {
        Value::Array(a) => a.iter().map(scalar_text).collect::<Vec<_>>().join(sep),
        Value::Object(o) => o
            .iter()
            .map(
                |(k, v)| {
                    if explode { format!("{k}={}", scalar_text(v)) } else { format!("{k}{sep}{}", scalar_text(v)) }
                },
            )
            .collect::<Vec<_>>()
            .join(sep),
        v => scalar_text(v),
    }
}

fn path_value(b: &Binding, value: &Value) -> Result<String, CallError> {
    let bad = |reason: &str| CallError::BadValue { flag: b.property.clone(), reason: reason.to_string() };
    let escaped_items = |sep: &str, explode: bool| -> String {
        match value {
            Value::Array(a) => a.iter().map(|i| encode(&scalar_text(i), UNRESERVED)).collect::<Vec<_>>().join(sep),
            Value::Object(o) => o
                .iter()
                .map(|(k, v)| {
                    let (k, v) = (encode(k, UNRESERVED), encode(&scalar_text(v), UNRESERVED));
                    if explode { format!("{k}={v}") } else { format!("{k}{sep}{v}") }
                })
                .collect::<Vec<_>>()
                .join(sep),
            v if b.json => encode(&v.to_string(), UNRESERVED),
            v => encode(&scalar_text(v), UNRESERVED),
        }
    };
    let text = match b.style.unwrap_or(Style::Simple) {
        Style::Label => format!(".{}", escaped_items(if b.explode { "." } else { "," }, b.explode)),
        Style::Matrix => {
            let name = encode(&b.name, UNRESERVED);
            match value {
                Value::Array(a) if b.explode => {
                    a.iter().map(|i| format!(";{name}={}", encode(&scalar_text(i), UNRESERVED))).collect()
                }
                Value::Object(_) if b.explode => format!(";{}", escaped_items(";", true)),
                _ => format!(";{name}={}", escaped_items(",", false)),
            }
        }
        _ => escaped_items(",", b.explode),
    };
    if text.is_empty() {
        return Err(bad("a path parameter cannot be empty"));
    }
    if text == "." || text == ".." {
        return Err(bad("a path parameter cannot be `.` or `..`"));
    }
    Ok(text)
}

/// `name=value` pairs, escaped, for one query parameter. The delimiters of the unexploded styles
/// (`,` `|` and the space as `%20`) stay literal, so a server splits on them before decoding the
/// items.
fn query_pairs(b: &Binding, value: &Value) -> Vec<String> {
    let name = encode(&b.name, UNRESERVED);
    let items = |sep: &str| -> String {
        match value {
            Value::Array(a) => a.iter().map(|i| encode(&scalar_text(i), UNRESERVED)).collect::<Vec<_>>().join(sep),
            Value::Object(o) => o
                .iter()
                .map(|(k, v)| format!("{}{sep}{}", encode(k, UNRESERVED), encode(&scalar_text(v), UNRESERVED)))
                .collect::<Vec<_>>()
                .join(sep),
            v => encode(&scalar_text(v), UNRESERVED),
        }
    };
    if b.json {
        return vec![format!("{name}={}", encode(&value.to_string(), UNRESERVED))];
    }
    let style = b.style.unwrap_or(Style::Form);
    match value {
        Value::Object(_) if style == Style::DeepObject => {
            let mut out = Vec::new();
            deep_object(&b.name, value, &mut out);
            out
        }
        Value::Array(a) if b.explode => {
            a.iter().map(|i| format!("{name}={}", encode(&scalar_text(i), UNRESERVED))).collect()
        }
        Value::Object(o) if b.explode => o
            .iter()
            .map(|(k, v)| format!("{}={}", encode(k, UNRESERVED), encode(&scalar_text(v), UNRESERVED)))
            .collect(),
        Value::Array(_) | Value::Object(_) => {
            let sep = match style {
                Style::SpaceDelimited => "%20",
                Style::PipeDelimited => "|",
                _ => ",",
            };
            vec![format!("{name}={}", items(sep))]
        }
        v => vec![format!("{name}={}", encode(&scalar_text(v), UNRESERVED))],
    }
}

/// `filter[name]=x&filter[tags][]=a`, nested objects recursively; the brackets stay literal, as
/// the servers that read this style expect.
fn deep_object(prefix: &str, value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(o) => {
            for (k, v) in o {
                deep_object(&format!("{prefix}[{k}]"), v, out);
            }
        }
        Value::Array(a) => {
            for v in a {
                out.push(format!(
                    "{}={}",
                    encode(&format!("{prefix}[]"), BRACKETS),
                    encode(&scalar_text(v), UNRESERVED)
                ));
            }
        }
        v => out.push(format!("{}={}", encode(prefix, BRACKETS), encode(&scalar_text(v), UNRESERVED))),
    }
}

fn header_value(b: &Binding, value: &Value) -> Result<String, CallError> {
    let text = if b.json { value.to_string() } else { joined(value, ",", b.explode) };
    // A line break would end the header and start another one of the caller's choosing; no
    // other control character may stand in a header either (a tab may).
    if text.bytes().any(|c| (c < 0x20 && c != b'\t') || c == 0x7f) {
        return Err(CallError::BadValue {
            flag: b.property.clone(),
            reason: "a header value cannot hold a line break, NUL or other control character".into(),
        });
    }
    Ok(text)
}

/// Whether a null given for `b` is sent as such: a field of a JSON body, unless null is the
/// field's default and the field is optional (filled in where the caller gave nothing: sent,
/// it would ask a service that tells a null from an absent field, as a partial update does,
/// to clear what the caller never named). Elsewhere (a query, a header, a form) null has no
/// form, and the value is left out.
fn null_sent(op: &Operation, b: &Binding) -> bool {
    if b.location != Location::BodyField || op.body.as_ref().is_none_or(|rb| rb.encoding != BodyEncoding::Json) {
        return false;
    }
    let required = op
        .input_schema
        .get("required")
        .and_then(Value::as_array)
        .is_some_and(|r| r.iter().any(|n| n.as_str() == Some(b.property.as_str())));
    let default_null = op
        .input_schema
        .pointer(&format!("/properties/{}/default", escape_token(&b.property)))
        .is_some_and(Value::is_null);
    required || !default_null
}

/// The body fields given, by the document's names, in binding order. A null goes in a JSON
/// body (the schema, checked before, lets that field be null), and is left out of the others.
fn body_fields<'a>(op: &'a Operation, input: &'a Map<String, Value>) -> Vec<(&'a Binding, &'a Value)> {
    op.bindings
        .iter()
        .filter(|b| b.location == Location::BodyField)
        .filter_map(|b| input.get(&b.property).filter(|v| !v.is_null() || null_sent(op, b)).map(|v| (b, v)))
        .collect()
}

/// The body's keys beyond its named fields (`additionalProperties`), in their object's order. A
/// key that is one of the named fields is refused: its own flag sets it, and one value each.
fn body_extra<'a>(
    op: &'a Operation,
    input: &'a Map<String, Value>,
    fields: &[(&Binding, &Value)],
) -> Result<Vec<(&'a String, &'a Value)>, CallError> {
    let Some(b) = op.bindings.iter().find(|b| b.location == Location::BodyExtra) else { return Ok(Vec::new()) };
    let Some(Value::Object(extra)) = input.get(&b.property) else { return Ok(Vec::new()) };
    for k in extra.keys() {
        if let Some(named) = op.bindings.iter().find(|n| n.location == Location::BodyField && &n.name == k) {
            let given = if fields.iter().any(|(f, _)| f.name == *k) { " (and it is given)" } else { "" };
            return Err(CallError::BadValue {
                flag: b.property.clone(),
                reason: format!("{k:?} is a named field of the body{given}: set it with --{}", named.property),
            });
        }
    }
    Ok(extra.iter().collect())
}

fn body(op: &Operation, input: &Map<String, Value>) -> Result<(Vec<u8>, Option<String>), CallError> {
    let Some(rb) = &op.body else { return Ok((Vec::new(), None)) };
    let whole = op.bindings.iter().find(|b| b.location == Location::Body).and_then(|b| input.get(&b.property));
    let fields = body_fields(op, input);
    let extra = body_extra(op, input, &fields)?;
    // An optional body left out is not sent; a required one is, even empty (`{}` for JSON), since
    // the server expects its content type.
    if whole.is_none() && fields.is_empty() && extra.is_empty() && !rb.required {
        return Ok((Vec::new(), None));
    }
    // A wildcard media type (`application/*`) is not a Content-Type.
    let declared = |fallback: &str| {
        if rb.media_type.contains('*') { fallback.to_string() } else { rb.media_type.clone() }
    };
    Ok(match rb.encoding {
        BodyEncoding::Raw => {
            let binary = op.bindings.iter().find(|b| b.location == Location::Body).is_some_and(|b| {
                is_binary(op.input_schema.pointer(&format!("/properties/{}", escape_token(&b.property))))
            });
            match whole {
                // Bytes, as `--body-file` sends them: the document's type, or the file's when the
                // document allows any (`*/*`, `image/*`).
                Some(Value::String(s)) if binary && let Some(d) = DataUrl::parse(s) => {
                    let ct = if rb.media_type.contains('*') { d.media_type } else { rb.media_type.clone() };
                    (d.bytes, Some(ct))
                }
                Some(Value::String(s)) => (s.clone().into_bytes(), Some(declared("application/octet-stream"))),
                Some(v) => (v.to_string().into_bytes(), Some(declared("application/octet-stream"))),
                None => (Vec::new(), Some(declared("application/octet-stream"))),
            }
        }
        BodyEncoding::Json => {
            let value = match whole {
                Some(v) => v.clone(),
                None => Value::Object(
                    fields
                        .iter()
                        .map(|(b, v)| {
                            let schema = op.input_schema.pointer(&format!("/properties/{}", escape_token(&b.property)));
                            (b.name.clone(), if is_binary(schema) { json_bytes(v) } else { (*v).clone() })
                        })
                        .chain(extra.iter().map(|(k, v)| ((*k).clone(), (*v).clone())))
                        .collect(),
                ),
            };
            (value.to_string().into_bytes(), Some(declared("application/json")))
        }
        BodyEncoding::Form => {
            let pairs: Vec<(String, String)> = match whole {
                Some(Value::Object(o)) => o.iter().flat_map(|(k, v)| form_pairs(k, v)).collect(),
                Some(v) => vec![("body".to_string(), scalar_text(v))],
                None => fields
                    .iter()
                    .flat_map(|(b, v)| form_pairs(&b.name, v))
                    .chain(extra.iter().flat_map(|(k, v)| extra_form_pairs(k, v)))
                    .collect(),
            };
            let text = pairs
                .iter()
                .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
                .collect::<Vec<_>>()
                .join("&");
            (text.into_bytes(), Some("application/x-www-form-urlencoded".to_string()))
        }
        BodyEncoding::Multipart => {
            let mut parts: Vec<Part> = Vec::new();
            match whole {
                Some(v) => {
                    let flag =
                        op.bindings.iter().find(|b| b.location == Location::Body).map_or("body", |b| &b.property);
                    match v {
                        Value::Object(o) => {
                            for (k, v) in o {
                                multipart_parts(k, flag, v, false, &mut parts);
                            }
                        }
                        v => multipart_parts("body", flag, v, false, &mut parts),
                    }
                }
                None => {
                    for (b, v) in &fields {
                        let binary =
                            is_binary(op.input_schema.pointer(&format!("/properties/{}", escape_token(&b.property))));
                        multipart_parts(&b.name, &b.property, v, binary, &mut parts);
                    }
                }
            }
            multipart(parts).map_err(|(flag, reason)| CallError::BadValue { flag, reason })?
        }
    })
}

fn escape_token(t: &str) -> String {
    t.replace('~', "~0").replace('/', "~1")
}

/// A file field's value inside a JSON body: a file given as a `data:` URL goes as the base64 of
/// its bytes (what JSON can carry of bytes), not as the URL, which is this side's own wrapping.
fn json_bytes(v: &Value) -> Value {
    use base64::Engine as _;
    match v {
        Value::String(s) => match DataUrl::parse(s) {
            Some(d) => Value::String(base64::engine::general_purpose::STANDARD.encode(d.bytes)),
            None => v.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(json_bytes).collect()),
        other => other.clone(),
    }
}

/// A field the document marks as a file (`format: binary`, or an array of them).
fn is_binary(schema: Option<&Value>) -> bool {
    let Some(s) = schema else { return false };
    let binary =
        |s: &Value| s.get("format").and_then(Value::as_str) == Some("binary") || s.get("contentMediaType").is_some();
    binary(s) || s.get("items").is_some_and(binary)
}

/// An extra key of a form body: as a named field's value goes, except that an object goes as its
/// JSON text under the key, not as fields of its own, whose names could be any field's.
fn extra_form_pairs(name: &str, v: &Value) -> Vec<(String, String)> {
    match v {
        Value::Object(_) => vec![(name.to_string(), v.to_string())],
        _ => form_pairs(name, v),
    }
}

/// Form fields: arrays repeat the name; an object's properties are fields of their own (style
/// `form`, exploded, the OpenAPI default for form bodies); anything deeper goes as JSON text.
fn form_pairs(name: &str, v: &Value) -> Vec<(String, String)> {
    let text = |i: &Value| if i.is_object() || i.is_array() { i.to_string() } else { scalar_text(i) };
    match v {
        Value::Array(a) => a.iter().map(|i| (name.to_string(), text(i))).collect(),
        Value::Object(o) => o.iter().map(|(k, i)| (k.clone(), text(i))).collect(),
        v => vec![(name.to_string(), scalar_text(v))],
    }
}

/// `application/x-www-form-urlencoded`: unreserved as is, space as `+`, the rest escaped.
fn form_encode(text: &str) -> String {
    encode(text, b"-._~ ").replace(' ', "+")
}

struct Part {
    name: String,
    /// The input property (named as its flag) the part was made from, for an error to name.
    flag: String,
    /// A file part: sent with this file name, as bytes.
    file: Option<String>,
    content_type: Option<String>,
    data: Vec<u8>,
}

fn multipart_parts(name: &str, flag: &str, v: &Value, binary: bool, parts: &mut Vec<Part>) {
    let part = |v: &Value| match v {
        Value::Object(_) | Value::Array(_) => Part {
            name: name.to_string(),
            flag: flag.to_string(),
            file: None,
            content_type: Some("application/json".into()),
            data: v.to_string().into_bytes(),
        },
        // A file's bytes, its type and its name, as `--x-file` sends them.
        Value::String(s) if binary && let Some(d) = DataUrl::parse(s) => Part {
            name: name.to_string(),
            flag: flag.to_string(),
            file: Some(d.name.unwrap_or_else(|| name.to_string())),
            content_type: Some(d.media_type),
            data: d.bytes,
        },
        v => Part {
            name: name.to_string(),
            flag: flag.to_string(),
            file: binary.then(|| name.to_string()),
            content_type: binary.then(|| "application/octet-stream".into()),
            data: scalar_text(v).into_bytes(),
        },
    };
    match v {
        Value::Array(a) if binary || a.iter().all(|i| !i.is_object() && !i.is_array()) => {
            parts.extend(a.iter().map(part))
        }
        v => parts.push(part(v)),
    }
}

/// `multipart/form-data` with a boundary drawn from the parts themselves (a hash of their bytes),
/// so the request is a function of the input and the boundary cannot occur in it by accident.
/// A part that cannot be written is refused with the flag it came from.
fn multipart(parts: Vec<Part>) -> Result<(Vec<u8>, Option<String>), (String, String)> {
    let mut hasher = Sha256::new();
    for p in &parts {
        hasher.update(p.name.as_bytes());
        hasher.update(&p.data);
    }
    let boundary = format!("agentos-{}", hex::encode(&hasher.finalize()[..16]));
    let mut out = Vec::new();
    for p in &parts {
        if p.name.bytes().any(|c| c == b'\r' || c == b'\n' || c == b'"') {
            return Err((
                p.flag.clone(),
                format!("a multipart field name cannot hold a quote or line break: {:?}", p.name),
            ));
        }
        if let Some(f) = p.file.as_deref().filter(|f| f.contains('\0')) {
            return Err((p.flag.clone(), format!("a file name cannot hold a NUL byte: {f:?}")));
        }
        out.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"", p.name).as_bytes(),
        );
        if let Some(f) = &p.file {
            // Written as browsers write it (the HTML standard's form encoding): a quote and line
            // breaks percent-encoded, so `we"ird.bin` arrives as `we%22ird.bin`.
            let f = f.replace('"', "%22").replace('\r', "%0D").replace('\n', "%0A");
            out.extend_from_slice(format!("; filename=\"{f}\"").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        if let Some(ct) = &p.content_type {
            out.extend_from_slice(format!("Content-Type: {ct}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&p.data);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    Ok((out, Some(format!("multipart/form-data; boundary={boundary}"))))
}
