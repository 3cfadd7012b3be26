//! How deep JSON may nest: the limits on what is written, and reading what an older version
//! wrote deeper than serde_json's default limit allows.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::CoreError;

/// The deepest token data (`[[1]]` is 2 deep; a scalar is 0). Room is left below
/// [`MAX_STORED_DEPTH`] for the event and API envelopes a token travels in.
pub const MAX_TOKEN_DEPTH: usize = 100;

/// The deepest an event's payload may nest, counting the `{"type", "payload"}` envelope it is
/// read back in. serde_json refuses 128 levels by default; a payload past that answered 200
/// when put, then made every reader of the log (the master at start included) fail.
pub const MAX_STORED_DEPTH: usize = 120;

/// Stack reserved for reading a value deeper than serde_json's default limit. It is address
/// space, committed only as used; about 1 KB a level, so values millions deep still fit.
const DEEP_READ_STACK: usize = 1 << 30;

/// How deep a value nests, without recursing (a value from an old log may be deeper than the
/// stack allows recursion).
pub fn value_depth(v: &Value) -> usize {
    let mut max = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(v, 0)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Array(a) => {
                max = max.max(d + 1);
                stack.extend(a.iter().map(|c| (c, d + 1)));
            }
            Value::Object(o) => {
                max = max.max(d + 1);
                stack.extend(o.values().map(|c| (c, d + 1)));
            }
            _ => max = max.max(d),
        }
    }
    max
}

/// How deep JSON text nests, by one scan of its bytes (brackets outside strings). For text that
/// serde_json wrote, so no validation beyond that.
pub fn text_depth(text: &str) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in text.as_bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Refuses token data deeper than [`MAX_TOKEN_DEPTH`] (400 `too_deep`).
pub fn check_token_depth(data: &Value) -> Result<(), CoreError> {
    check_depth("token data", data)
}

/// Refuses `data` (named `what` in the error) nested deeper than a token may be: what travels
/// inside a token (a job's input, say) is held to the same limit.
pub fn check_depth(what: &str, data: &Value) -> Result<(), CoreError> {
    let depth = value_depth(data);
    if depth > MAX_TOKEN_DEPTH {
        return Err(CoreError::bad_input(
            "too_deep",
            format!("{what} nests {depth} levels deep; at most {MAX_TOKEN_DEPTH} are allowed"),
        ));
    }
    Ok(())
}

/// Refuses an event payload that, in its envelope, would nest deeper than [`MAX_STORED_DEPTH`]:
/// what is committed must read back with any JSON reader's default limits.
pub fn check_stored_depth(kind: &str, payload: &str) -> Result<(), CoreError> {
    let depth = text_depth(payload) + 1;
    if depth > MAX_STORED_DEPTH {
        return Err(CoreError::bad_input(
            "too_deep",
            format!(
                "the {kind} event would nest {depth} levels deep as stored; at most {MAX_STORED_DEPTH} are allowed, so nothing was written"
            ),
        ));
    }
    Ok(())
}

/// Parses JSON text of any depth. The usual parse runs first; only text deeper than
/// serde_json's recursion limit is parsed again, without the limit, on a thread with a stack big
/// enough for it, where the value is also turned into `T` (that recurses as deep).
pub fn from_str_any_depth<T: DeserializeOwned + Send>(text: &str) -> Result<T, serde_json::Error> {
    match serde_json::from_str(text) {
        Err(e) if is_recursion_limit(&e) => on_big_stack(|| {
            let mut de = serde_json::Deserializer::from_str(text);
            de.disable_recursion_limit();
            let v = T::deserialize(&mut de)?;
            de.end()?;
            Ok(v)
        }),
        other => other,
    }
}

/// Like `serde_json::from_value`, for a value of any depth.
pub fn from_value_any_depth<T: DeserializeOwned + Send>(v: Value) -> Result<T, serde_json::Error> {
    if value_depth(&v) < MAX_STORED_DEPTH {
        return serde_json::from_value(v);
    }
    on_big_stack(move || serde_json::from_value(v))
}

/// Nesting serde_json's reader follows at most, by default.
pub const READER_DEPTH: usize = 128;

/// Whether `e` is serde_json's refusal of input nested past [`READER_DEPTH`].
pub fn is_recursion_limit(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("recursion limit exceeded")
}

fn on_big_stack<T: Send>(f: impl FnOnce() -> Result<T, serde_json::Error> + Send) -> Result<T, serde_json::Error> {
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new().stack_size(DEEP_READ_STACK).spawn_scoped(s, f);
        match handle {
            Ok(h) => h.join().unwrap_or_else(|_| Err(serde::de::Error::custom("reading a deep value panicked"))),
            Err(e) => Err(serde::de::Error::custom(format!("cannot start a thread to read a deep value: {e}"))),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(levels: usize) -> String {
        format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
    }

    fn check(text: &str, expected: usize) {
        assert_eq!(text_depth(text), expected, "text {text:?}");
        let v: Value = from_str_any_depth(text).unwrap();
        assert_eq!(value_depth(&v), expected, "value of {text:?}");
    }

    #[test]
    fn depths_count_brackets_outside_strings() {
        check("1", 0);
        check("\"[[[\"", 0);
        check("[]", 1);
        check(r#"{"a":[{"b":"\"]}"}]}"#, 3);
        check(r#"["\\",[2]]"#, 2);
        check(&nested(3), 3);
    }

    #[test]
    fn values_past_serde_jsons_recursion_limit_are_read() {
        let text = nested(5000);
        assert!(serde_json::from_str::<Value>(&text).is_err());
        let v: Value = from_str_any_depth(&text).unwrap();
        assert_eq!(value_depth(&v), 5000);
        let back: Value = from_value_any_depth(v).unwrap();
        assert_eq!(value_depth(&back), 5000);
        // Dropping recurses too: leave a deep value to the thread that has the stack for it.
        std::thread::Builder::new().stack_size(DEEP_READ_STACK).spawn(move || drop(back)).unwrap().join().unwrap();
    }

    #[test]
    fn invalid_json_stays_an_error() {
        assert!(from_str_any_depth::<Value>(&format!("{}x", "[".repeat(200))).is_err());
        assert!(from_str_any_depth::<Value>("{").is_err());
    }

    #[test]
    fn token_depth_is_limited_at_one_hundred() {
        let ok: Value = serde_json::from_str(&nested(MAX_TOKEN_DEPTH)).unwrap();
        assert!(check_token_depth(&ok).is_ok());
        let deep: Value = serde_json::from_str(&nested(MAX_TOKEN_DEPTH + 1)).unwrap();
        assert_eq!(check_token_depth(&deep).unwrap_err().code, "too_deep");
    }

    #[test]
    fn stored_depth_counts_the_envelope() {
        assert!(check_stored_depth("Net", &nested(MAX_STORED_DEPTH - 1)).is_ok());
        assert_eq!(check_stored_depth("Net", &nested(MAX_STORED_DEPTH)).unwrap_err().code, "too_deep");
    }
}
