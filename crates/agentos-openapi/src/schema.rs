//! From OpenAPI schema objects to the JSON Schema of a tool's input.
//!
//! `$ref`s are inlined, because the flag generator only sees properties written out in place
//! (`--where.lat` needs `where` to be an object with `properties`). Three things stop inlining and
//! keep the reference instead, pointing into the input schema's own `$defs`: a cycle (a recursive
//! schema stays recursive), more than [`MAX_INLINE_REFS`] references inlined inside one another,
//! and an operation past [`INLINE_BUDGET`] schema objects. Each definition is converted once, with
//! every reference inside it kept, so the work per operation is bounded by the budget plus the
//! document's own schemas.
//!
//! OpenAPI 3.0 dialect is rewritten into JSON Schema 2020-12, which the validator reads:
//! `nullable` becomes a `null` type, boolean `exclusiveMinimum` a number. `allOf` is merged
//! (properties and required), `oneOf` and `anyOf` are kept. Keywords that only describe
//! (`example`, `xml`, `discriminator`, `x-…`) are dropped: they cost prompt tokens and say nothing
//! about the input. Properties marked `readOnly` are left out: a client never sends them.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value, json};

use crate::pointer;

/// References inlined inside one another before the rest are kept as `$ref`.
const MAX_INLINE_REFS: usize = 8;
/// How deep a schema may nest where a reference is inlined; deeper ones are kept as `$ref`.
/// Without it, eight inlined references each as deep as the document allows would nest (and
/// recurse, here, in the flag generator and in the validator) eight times that deep.
const MAX_INLINE_DEPTH: usize = 32;
/// Schema objects one operation may inline; past it, references are kept as `$ref`.
const INLINE_BUDGET: usize = 2_000;
/// `$ref` → `$ref` chains followed before one is called a loop.
const MAX_REF_CHAIN: usize = 32;

/// Keywords copied as they are.
const KEPT: &[&str] = &[
    "type",
    "enum",
    "const",
    "default",
    "description",
    "title",
    "format",
    "minimum",
    "maximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
    "required",
    "dependentRequired",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentEncoding",
    "contentMediaType",
];

/// Keywords holding one schema.
const ONE_SCHEMA: &[&str] = &[
    "additionalProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
    "not",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
];

/// Why a schema cannot be converted.
#[derive(Debug)]
pub(crate) enum SchemaError {
    /// The operation is skipped.
    Unresolved(String),
    /// The whole document is refused: the total budget is spent.
    Budget,
}

/// Converts the schemas of one operation; [`Converter::finish`] adds the `$defs` they refer to.
pub(crate) struct Converter<'d, 't> {
    doc: &'d Value,
    /// Schema objects converted across the whole import, held to `max_total`.
    total: &'t mut usize,
    max_total: usize,
    /// This operation's.
    nodes: usize,
    /// How deep the schema being converted is.
    depth: usize,
    /// References being inlined, innermost last.
    stack: Vec<&'d str>,
    /// Reference → its key in `$defs`.
    keys: HashMap<String, String>,
    used_keys: HashSet<String>,
    /// References given a key whose definition is still to be converted.
    pending: Vec<(&'d str, String)>,
    defs: Map<String, Value>,
    /// Converting a definition: every reference is kept.
    keep_refs: bool,
}

impl<'d, 't> Converter<'d, 't> {
    pub(crate) fn new(doc: &'d Value, total: &'t mut usize, max_total: usize) -> Self {
        Converter {
            doc,
            total,
            max_total,
            nodes: 0,
            depth: 0,
            stack: Vec::new(),
            keys: HashMap::new(),
            used_keys: HashSet::new(),
            pending: Vec::new(),
            defs: Map::new(),
            keep_refs: false,
        }
    }

    /// Converts one schema; a reference it cannot follow skips the operation.
    pub(crate) fn convert(&mut self, schema: &'d Value) -> Result<Value, SchemaError> {
        self.depth += 1;
        let out = self.convert_at_depth(schema);
        self.depth -= 1;
        out
    }

    fn convert_at_depth(&mut self, schema: &'d Value) -> Result<Value, SchemaError> {
        self.nodes += 1;
        *self.total += 1;
        if *self.total > self.max_total {
            return Err(SchemaError::Budget);
        }
        let o = match schema {
            Value::Object(o) => o,
            Value::Bool(_) => return Ok(schema.clone()),
            // Not a schema: anything goes.
            _ => return Ok(json!({})),
        };
        let Some(reference) = o.get("$ref").and_then(Value::as_str) else {
            return self.convert_object(o.iter());
        };
        let (reference, target) = follow(self.doc, reference)?;
        let keep = self.keep_refs
            || self.stack.contains(&reference)
            || self.stack.len() >= MAX_INLINE_REFS
            || self.depth > MAX_INLINE_DEPTH
            || self.nodes > INLINE_BUDGET;
        let mut out = if keep {
            json!({ "$ref": format!("#/$defs/{}", self.key(reference)) })
        } else {
            self.stack.push(reference);
            let inlined = self.convert(target);
            self.stack.pop();
            inlined?
        };
        // 3.1 allows keywords beside `$ref` (a description, a default); 3.0 documents write them
        // too. They refine the referenced schema, so they win.
        if o.len() == 1 {
            return Ok(out);
        }
        let nullable = o.get("nullable") == Some(&Value::Bool(true));
        let extra = self.convert_object(o.iter().filter(|(k, _)| *k != "$ref"))?;
        if let (Value::Object(out_map), Value::Object(extra)) = (&mut out, extra) {
            for (k, v) in extra {
                match (k.as_str(), out_map.get_mut(&k), v) {
                    ("properties", Some(Value::Object(have)), Value::Object(add)) => have.extend(add),
                    ("required", Some(Value::Array(have)), Value::Array(add)) => {
                        have.extend(add.into_iter().filter(|r| !have.contains(r)).collect::<Vec<_>>());
                    }
                    (_, _, v) => {
                        out_map.insert(k, v);
                    }
                }
            }
            if nullable && !out_map.contains_key("$ref") {
                make_nullable(out_map);
            }
        }
        if nullable && out.get("$ref").is_some() {
            out = json!({ "anyOf": [out, { "type": "null" }] });
        }
        Ok(out)
    }

    fn convert_object(&mut self, entries: impl Iterator<Item = (&'d String, &'d Value)>) -> Result<Value, SchemaError> {
        let mut out = Map::new();
        let mut nullable = false;
        for (k, v) in entries {
            match k.as_str() {
                "properties" | "patternProperties" | "dependentSchemas" => {
                    let Some(props) = v.as_object() else { continue };
                    let mut converted = Map::new();
                    for (name, p) in props {
                        let c = self.convert(p)?;
                        // A client never sends what the server alone writes.
                        if k == "properties" && c.get("readOnly") == Some(&Value::Bool(true)) {
                            continue;
                        }
                        converted.insert(name.clone(), c);
                    }
                    out.insert(k.clone(), Value::Object(converted));
                }
                "items" => match v {
                    // The older tuple form.
                    Value::Array(items) => {
                        let items: Result<Vec<Value>, _> = items.iter().map(|i| self.convert(i)).collect();
                        out.insert("prefixItems".into(), Value::Array(items?));
                    }
                    _ => {
                        out.insert(k.clone(), self.convert(v)?);
                    }
                },
                "allOf" | "oneOf" | "anyOf" | "prefixItems" => {
                    let Some(items) = v.as_array() else { continue };
                    let items: Result<Vec<Value>, _> = items.iter().map(|i| self.convert(i)).collect();
                    out.insert(k.clone(), Value::Array(items?));
                }
                "nullable" => nullable = v == &Value::Bool(true),
                "exclusiveMinimum" | "exclusiveMaximum" => {
                    out.insert(k.clone(), v.clone());
                }
                _ if ONE_SCHEMA.contains(&k.as_str()) => {
                    out.insert(k.clone(), self.convert(v)?);
                }
                _ if KEPT.contains(&k.as_str()) => {
                    out.insert(k.clone(), v.clone());
                }
                _ => {}
            }
        }
        finish_object(&mut out, nullable);
        Ok(Value::Object(out))
    }

    /// The key of a reference in `$defs`, converted later by [`Converter::finish`].
    fn key(&mut self, reference: &'d str) -> String {
        if let Some(k) = self.keys.get(reference) {
            return k.clone();
        }
        let last = reference.rsplit('/').next().unwrap_or("def").replace("~1", "/").replace("~0", "~");
        let mut base: String =
            last.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
        if base.is_empty() {
            base = "def".into();
        }
        let mut key = base.clone();
        let mut n = 2;
        while self.used_keys.contains(&key) {
            key = format!("{base}-{n}");
            n += 1;
        }
        self.used_keys.insert(key.clone());
        self.keys.insert(reference.to_string(), key.clone());
        self.pending.push((reference, key.clone()));
        key
    }

    /// Adds to `schema` (the input schema) the definitions its references need.
    pub(crate) fn finish(mut self, schema: &mut Value) -> Result<(), SchemaError> {
        self.keep_refs = true;
        while let Some((reference, key)) = self.pending.pop() {
            let (_, target) = follow(self.doc, reference)?;
            let converted = self.convert(target)?;
            self.defs.insert(key, converted);
        }
        if !self.defs.is_empty() {
            let mut defs: Vec<(String, Value)> = std::mem::take(&mut self.defs).into_iter().collect();
            defs.sort_by(|a, b| a.0.cmp(&b.0));
            if let Value::Object(o) = schema {
                o.insert("$defs".into(), Value::Object(defs.into_iter().collect()));
            }
        }
        Ok(())
    }
}

/// Follows `reference` through objects that are only a `$ref`; answers the last reference and
/// the schema it names.
pub(crate) fn follow<'d>(doc: &'d Value, reference: &'d str) -> Result<(&'d str, &'d Value), SchemaError> {
    let mut reference = reference;
    for _ in 0..MAX_REF_CHAIN {
        let target = pointer::resolve(doc, reference)
            .ok_or_else(|| SchemaError::Unresolved(format!("$ref {reference:?} points nowhere in the document")))?;
        match target.as_object().filter(|o| o.len() == 1).and_then(|o| o.get("$ref")).and_then(Value::as_str) {
            Some(next) => reference = next,
            None => return Ok((reference, target)),
        }
    }
    Err(SchemaError::Unresolved(format!("$ref {reference:?} is a chain of references that never reaches a schema")))
}

/// The rewrites that need the whole converted object: 3.0's `nullable` and boolean exclusive
/// bounds, `allOf` merged, malformed keywords dropped rather than failing the validator.
fn finish_object(out: &mut Map<String, Value>, nullable: bool) {
    for (flag, bound) in [("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")] {
        match out.get(flag) {
            Some(Value::Bool(true)) => match out.remove(bound) {
                Some(b) => {
                    out.insert(flag.into(), b);
                }
                None => {
                    out.remove(flag);
                }
            },
            Some(Value::Bool(false)) => {
                out.remove(flag);
            }
            _ => {}
        }
    }
    if !out.get("required").is_none_or(|r| r.as_array().is_some_and(|a| a.iter().all(Value::is_string))) {
        out.remove("required");
    }
    if out.get("enum").is_some_and(|e| !e.is_array()) {
        out.remove("enum");
    }
    if let Some(t) = out.get("type") {
        let ok = t.is_string() || t.as_array().is_some_and(|a| a.iter().all(Value::is_string));
        if !ok {
            out.remove("type");
        }
    }
    if let Some(Value::Array(parts)) = out.remove("allOf") {
        merge_all_of(out, parts);
    }
    // A property left out as readOnly is not required either.
    if let (Some(Value::Object(props)), Some(Value::Array(req))) = (out.get("properties"), out.get("required")) {
        let kept: Vec<Value> =
            req.iter().filter(|r| r.as_str().is_some_and(|r| props.contains_key(r))).cloned().collect();
        if kept.len() != req.len() {
            out.insert("required".into(), Value::Array(kept));
        }
    }
    if nullable {
        make_nullable(out);
    }
}

fn make_nullable(out: &mut Map<String, Value>) {
    let with_null = match out.get("type") {
        Some(Value::String(t)) if t != "null" => Some(json!([t, "null"])),
        Some(Value::Array(ts)) if !ts.iter().any(|t| t == "null") => {
            let mut ts = ts.clone();
            ts.push(json!("null"));
            Some(Value::Array(ts))
        }
        _ => None,
    };
    if let Some(t) = with_null {
        out.insert("type".into(), t);
    }
    if let Some(Value::Array(e)) = out.get_mut("enum")
        && !e.contains(&Value::Null)
    {
        e.push(Value::Null);
    }
}

/// Merges the parts of an `allOf` into `out`: properties and `required` are united; other
/// keywords are taken where `out` has none. A part that cannot be merged (a kept `$ref`, a
/// second `oneOf`) stays under `allOf`.
fn merge_all_of(out: &mut Map<String, Value>, parts: Vec<Value>) {
    let mut rest = Vec::new();
    for part in parts {
        let Value::Object(p) = part else {
            if part == Value::Bool(false) {
                rest.push(part);
            }
            continue;
        };
        let conflicting = p.contains_key("$ref")
            || ["oneOf", "anyOf", "not"].iter().any(|k| p.contains_key(*k) && out.contains_key(*k))
            || p.contains_key("allOf");
        if conflicting {
            rest.push(Value::Object(p));
            continue;
        }
        for (k, v) in p {
            match (k.as_str(), out.get_mut(&k), v) {
                ("properties", Some(Value::Object(have)), Value::Object(add)) => {
                    for (name, s) in add {
                        have.entry(name).or_insert(s);
                    }
                }
                ("required", Some(Value::Array(have)), Value::Array(add)) => {
                    for r in add {
                        if !have.contains(&r) {
                            have.push(r);
                        }
                    }
                }
                (_, Some(_), _) => {}
                (_, None, v) => {
                    out.insert(k, v);
                }
            }
        }
    }
    if !rest.is_empty() {
        out.insert("allOf".into(), Value::Array(rest));
    }
}
