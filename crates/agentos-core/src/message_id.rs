//! The id of a JSON-RPC message that cannot be read whole: one nested too deeply for serde_json
//! (`/mcp`), or a line too long to keep (`agentos mcp` on stdio). Both are answered with the
//! message's own id when it has a valid one, found the same way: the first `"id":` at the top
//! level of the object, read from its bytes as they go by.

use serde_json::{Value, json};

/// An id as rmcp reads it: a string, or an integer that fits an i64, also in float form (`1.0`)
/// while a float tells it exactly (below 2^53); `None` for any other value.
pub fn id_of(id: &Value) -> Option<Value> {
    match id {
        Value::String(_) => Some(id.clone()),
        Value::Number(n) if n.is_i64() => Some(id.clone()),
        Value::Number(n) => n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 2f64.powi(53)).map(|f| json!(f as i64)),
        _ => None,
    }
}

/// The `id` member at the top level of a JSON object, found as its bytes are fed in, in as
/// many pieces as they come: the first `"id":` at the top level, wherever it stands.
#[derive(Default)]
pub struct IdScan {
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// The start of the string being read at the top level: enough to tell `id` from the rest.
    key: Vec<u8>,
    stage: IdStage,
    /// The id's bytes, read so far.
    value: Vec<u8>,
}

#[derive(Default, PartialEq)]
enum IdStage {
    #[default]
    Looking,
    /// The top level's string `id` was read: a colon next makes it the key.
    AfterKey,
    Value,
    /// The id was read to its end, or is no id the answer could carry.
    Done,
}

/// The longest id kept: a longer one is answered as none, so that a scan holds little whatever
/// it is fed.
const MAX_ID_BYTES: usize = 1024;

impl IdScan {
    pub fn feed(&mut self, bytes: &[u8]) {
        for &c in bytes {
            match self.stage {
                IdStage::Done => return,
                IdStage::Value if !self.in_string && self.depth == 1 && matches!(c, b',' | b'}') => {
                    self.stage = IdStage::Done;
                    return;
                }
                IdStage::Value if self.value.len() >= MAX_ID_BYTES => {
                    self.value.clear();
                    self.stage = IdStage::Done;
                    return;
                }
                IdStage::Value => self.value.push(c),
                _ => {}
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if c == b'\\' {
                    self.escaped = true;
                } else if c == b'"' {
                    self.in_string = false;
                    if self.depth == 1 && self.key == b"id" && self.stage == IdStage::Looking {
                        self.stage = IdStage::AfterKey;
                    }
                    continue;
                }
                if self.depth == 1 && self.key.len() < 3 {
                    self.key.push(c);
                }
                continue;
            }
            if self.stage == IdStage::AfterKey && !c.is_ascii_whitespace() {
                self.stage = if c == b':' { IdStage::Value } else { IdStage::Looking };
                if c == b':' {
                    continue;
                }
            }
            match c {
                b'"' => {
                    self.in_string = true;
                    self.key.clear();
                }
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
    }

    /// The id read, when it is one JSON-RPC allows (see [`id_of`]); `None` when the id is not
    /// valid, was not read to its end, or there is none.
    pub fn id(&self) -> Option<Value> {
        if self.stage != IdStage::Done {
            return None;
        }
        id_of(&serde_json::from_slice::<Value>(self.value.trim_ascii()).ok()?)
    }
}

/// The id of a whole message's bytes, read as [`IdScan`] reads them.
pub fn top_level_id(body: &[u8]) -> Option<Value> {
    let mut scan = IdScan::default();
    scan.feed(body);
    scan.id()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_of_a_message_nested_too_deeply_is_found_at_its_top_level() {
        let deep =
            |before: &str, after: &str| format!("{{{before}\"params\":{}{}{after}}}", "[".repeat(200), "]".repeat(200));
        let check = |body: String, expected: Option<Value>| {
            assert_eq!(top_level_id(body.as_bytes()), expected, "{body}");
            // The same, fed a byte at a time.
            let mut scan = IdScan::default();
            for b in body.as_bytes() {
                scan.feed(std::slice::from_ref(b));
            }
            assert_eq!(scan.id(), expected, "{body}, a byte at a time");
        };
        check(deep(r#""id": 7,"#, ""), Some(json!(7)));
        check(deep("", r#", "id" : "late""#), Some(json!("late")));
        check(deep(r#""id":"a \"quoted\" }, id","#, ""), Some(json!("a \"quoted\" }, id")));
        // Not the top level's, not a key, not a valid id: none.
        check(deep(r#""p":{"id":1},"#, ""), None);
        check(deep(r#""method":"id","#, ""), None);
        check(deep(r#""i\"d":1,"#, ""), None);
        check(deep(r#""id":{"a":1},"#, ""), None);
        check(deep(r#""id":[1],"#, ""), None);
        check(deep(r#""id":1.5,"#, ""), None);
        check(deep(r#""id":2.0,"#, ""), Some(json!(2)));
        check(deep(r#""id":9223372036854775808,"#, ""), None);
        check(deep(r#""x":"a \"id\": 3","#, ""), None);
        check(deep(&format!(r#""id":"{}","#, "x".repeat(MAX_ID_BYTES)), ""), None);
        check(r#"{"id":"#.to_owned(), None);
        check(r#"{"unterminated\"#.to_owned(), None);
    }
}
