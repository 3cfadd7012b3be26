//! JSON pointers (RFC 6901) into the document: writing them for errors, following `$ref`s, and
//! finding any `$ref` that leaves the document.

use serde_json::Value;

use crate::ImportError;

/// One pointer token: `~` → `~0`, `/` → `~1`.
pub(crate) fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// `parent` + `/` + the escaped token.
pub(crate) fn join(parent: &str, token: &str) -> String {
    format!("{parent}/{}", escape(token))
}

/// The value a local reference (`#/components/schemas/Pet`) points to. `None` when it is not a
/// JSON pointer fragment or points nowhere.
pub(crate) fn resolve<'a>(doc: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    let pointer = percent_decode(pointer)?;
    if pointer.is_empty() {
        return Some(doc);
    }
    if !pointer.starts_with('/') {
        return None;
    }
    let mut cur = doc;
    for raw in pointer[1..].split('/') {
        let token = raw.replace("~1", "/").replace("~0", "~");
        cur = match cur {
            Value::Object(o) => o.get(&token)?,
            Value::Array(a) => a.get(token.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Percent-decoded text, `None` when an escape is broken or the bytes are not UTF-8. A
/// fragment is a URI fragment: `#/components/schemas/My%20Pet`.
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_string());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Refuses the document when any `$ref` names another document or a URL. Example values
/// (`example`) and extensions (`x-…`) are data, not references, and are not looked into.
/// Recursive: the document's depth is already held to `max_depth`.
pub(crate) fn refuse_external_refs(doc: &Value) -> Result<(), ImportError> {
    let mut path = Vec::new();
    match find_external(doc, &mut path) {
        Some(reference) => {
            let mut pointer: String = path.iter().map(|t| format!("/{}", escape(t))).collect();
            pointer.push_str("/$ref");
            Err(ImportError::ExternalRef { pointer, reference: reference.to_string() })
        }
        None => Ok(()),
    }
}

/// The first external reference with keys taken in byte order, so the one reported does not
/// hang on whether maps keep the document's order; `path` is left pointing at its object.
fn find_external<'a>(v: &'a Value, path: &mut Vec<String>) -> Option<&'a str> {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get("$ref")
                && !r.starts_with('#')
            {
                return Some(r);
            }
            let mut entries: Vec<(&String, &Value)> = o.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            for (k, c) in entries {
                if k == "example" || k.starts_with("x-") || !(c.is_object() || c.is_array()) {
                    continue;
                }
                path.push(k.clone());
                if let Some(r) = find_external(c, path) {
                    return Some(r);
                }
                path.pop();
            }
            None
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                if !(c.is_object() || c.is_array()) {
                    continue;
                }
                path.push(i.to_string());
                if let Some(r) = find_external(c, path) {
                    return Some(r);
                }
                path.pop();
            }
            None
        }
        _ => None,
    }
}
