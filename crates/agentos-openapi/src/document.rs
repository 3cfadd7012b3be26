//! Reading document text into a JSON value within the limits: size first, then depth and the
//! number of values counted while the parser produces them, so that a YAML alias bomb stops at
//! the limit instead of filling memory.
//!
//! serde_yaml_ng expands aliases itself and only caps alias jumps at 100 per parsed event: on a
//! document of a million events that still allows far more values than memory holds. Counting
//! values as they are built is what bounds it.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::{ImportError, Limits};

/// Which limit a parse ran into; the parser's own error only carries text.
#[derive(Clone, Copy)]
enum Exceeded {
    Depth,
    Nodes,
}

struct Budget<'a> {
    limits: &'a Limits,
    nodes: Cell<usize>,
    exceeded: Cell<Option<Exceeded>>,
}

impl Budget<'_> {
    fn count<E: de::Error>(&self, depth: usize) -> Result<(), E> {
        if depth > self.limits.max_depth {
            self.exceeded.set(Some(Exceeded::Depth));
            return Err(E::custom("max_depth"));
        }
        let n = self.nodes.get() + 1;
        self.nodes.set(n);
        if n > self.limits.max_nodes {
            self.exceeded.set(Some(Exceeded::Nodes));
            return Err(E::custom("max_nodes"));
        }
        Ok(())
    }

    fn error(&self) -> Option<ImportError> {
        self.exceeded.get().map(|e| match e {
            Exceeded::Depth => ImportError::TooDeep { limit: self.limits.max_depth },
            Exceeded::Nodes => ImportError::TooManyNodes { limit: self.limits.max_nodes },
        })
    }
}

/// Builds a `Value`, counting each one at its depth.
struct ValueSeed<'b, 'a> {
    budget: &'b Budget<'a>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_, '_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON-compatible value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.budget.count(self.depth)?;
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.budget.count(self.depth)?;
        Ok(Value::from(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.budget.count(self.depth)?;
        Ok(Value::from(v))
    }
    /// YAML integers past 64 bits (`-9223372036854776000` in the OpenAI document): kept as the
    /// nearest float, as JSON readers do.
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        self.visit_f64(v as f64)
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        self.visit_f64(v as f64)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.budget.count(self.depth)?;
        // YAML's `.nan` and `.inf` have no JSON form.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.budget.count(self.depth)?;
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.budget.count(self.depth)?;
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.budget.count(self.depth)?;
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.budget.count(self.depth + 1)?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(ValueSeed { budget: self.budget, depth: self.depth + 1 })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.budget.count(self.depth + 1)?;
        let mut out = Map::new();
        while let Some(k) = map.next_key_seed(KeySeed)? {
            let v = map.next_value_seed(ValueSeed { budget: self.budget, depth: self.depth + 1 })?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

/// A map key as text: YAML writes response codes as numbers (`200:`).
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = String;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string, number or boolean key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Ok("null".to_string())
    }
}

/// Parses document text. Text whose first character is `{` is read as JSON; YAML otherwise (and
/// when the JSON parser refuses it, since `{openapi: 3.1.0}` is YAML too).
pub(crate) fn read(doc: &[u8], limits: &Limits) -> Result<Value, ImportError> {
    if doc.len() > limits.max_bytes {
        return Err(ImportError::TooLarge { size: doc.len(), limit: limits.max_bytes });
    }
    let text = doc.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(doc);
    let looks_json = text.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let json_error = if looks_json {
        let budget = Budget { limits, nodes: Cell::new(0), exceeded: Cell::new(None) };
        let mut de = serde_json::Deserializer::from_slice(text);
        let parsed = ValueSeed { budget: &budget, depth: 0 }.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
        match parsed {
            Ok(v) => return Ok(v),
            Err(e) => match budget.error() {
                Some(limit) => return Err(limit),
                None => e.to_string(),
            },
        }
    } else {
        String::new()
    };
    let budget = Budget { limits, nodes: Cell::new(0), exceeded: Cell::new(None) };
    let de = serde_yaml_ng::Deserializer::from_slice(text);
    let parsed = ValueSeed { budget: &budget, depth: 0 }.deserialize(de);
    match parsed {
        Ok(v) => Ok(v),
        Err(e) => Err(budget.error().unwrap_or_else(|| {
            if looks_json {
                ImportError::Syntax { format: "JSON", message: json_error }
            } else {
                let message = e.to_string();
                // serde_yaml_ng's own bound: 100 alias expansions per event of the document. On a
                // small document it trips before `max_nodes` does.
                if message.starts_with("repetition limit exceeded") {
                    ImportError::YamlAliases { reason: message }
                } else {
                    ImportError::Syntax { format: "YAML", message }
                }
            }
        })),
    }
}

/// Holds a value given already parsed to the depth and node limits.
pub(crate) fn check_value(doc: &Value, limits: &Limits) -> Result<(), ImportError> {
    let mut nodes = 0usize;
    // Iterative: the value may be deeper than recursion allows.
    let mut stack: Vec<(&Value, usize)> = vec![(doc, 0)];
    while let Some((v, depth)) = stack.pop() {
        nodes += 1;
        if nodes > limits.max_nodes {
            return Err(ImportError::TooManyNodes { limit: limits.max_nodes });
        }
        match v {
            Value::Array(a) => {
                if depth + 1 > limits.max_depth {
                    return Err(ImportError::TooDeep { limit: limits.max_depth });
                }
                stack.extend(a.iter().map(|c| (c, depth + 1)));
            }
            Value::Object(o) => {
                if depth + 1 > limits.max_depth {
                    return Err(ImportError::TooDeep { limit: limits.max_depth });
                }
                stack.extend(o.values().map(|c| (c, depth + 1)));
            }
            _ => {}
        }
    }
    Ok(())
}
