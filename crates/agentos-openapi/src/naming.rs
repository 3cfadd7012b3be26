//! Tool names and flag names: kebab-case words of `[a-z0-9]`, so that a name never depends on
//! anything but the operation it names.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The longest tool name.
pub(crate) const MAX_NAME: usize = 64;

/// Kebab-case words: camelCase split as the flag generator splits it (`listPets` → `list-pets`,
/// `URLParser` → `url-parser`), anything not an ASCII letter or digit a separator
/// (`echo_Word.v2` → `echo-word-v2`), no leading, trailing or doubled `-`. Already kebab-cased
/// text is unchanged, so the flag generator's own kebab-casing leaves these names as they are.
pub fn flag_name(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    let mut pending_dash = false;
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_ascii_alphanumeric() {
            pending_dash = true;
            continue;
        }
        if c.is_ascii_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if prev.is_ascii_lowercase() || prev.is_ascii_digit() || (prev.is_ascii_uppercase() && next_lower) {
                pending_dash = true;
            }
        }
        if pending_dash && !out.is_empty() {
            out.push('-');
        }
        pending_dash = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The name of an operation without an operationId: `GET /users/{id}` → `get-users-by-id`.
fn from_method_path(method: &str, path: &str) -> String {
    let mut words = vec![method.to_ascii_lowercase()];
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        // A segment may mix text and variables: `{name}.json`, `v1:{id}`.
        let mut rest = segment;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(open) => {
                    words.push(flag_name(&rest[..open]));
                    let after = &rest[open + 1..];
                    let close = after.find('}').unwrap_or(after.len());
                    words.push(format!("by-{}", flag_name(&after[..close])));
                    rest = after.get(close + 1..).unwrap_or("");
                }
                None => {
                    words.push(flag_name(rest));
                    rest = "";
                }
            }
        }
    }
    flag_name(&words.join("-"))
}

/// The name an operation asks for, before collisions and length are settled.
fn wanted(operation_id: Option<&str>, method: &str, path: &str) -> String {
    match operation_id.map(flag_name) {
        Some(n) if !n.is_empty() => n,
        _ => from_method_path(method, path),
    }
}

/// 6 hex characters of sha256(`GET /users/{id}`): what tells apart names that would collide.
fn suffix(method: &str, path: &str) -> String {
    let digest = Sha256::digest(format!("{} {path}", method.to_ascii_uppercase()).as_bytes());
    hex::encode(&digest[..3])
}

fn with_suffix(base: &str, method: &str, path: &str) -> String {
    let keep = &base[..base.len().min(MAX_NAME - 7)];
    let keep = keep.trim_end_matches('-');
    if keep.is_empty() { format!("op-{}", suffix(method, path)) } else { format!("{keep}-{}", suffix(method, path)) }
}

/// Names for operations given as (operationId, method, path). Every name that is too long, or
/// wanted by more than one operation, keeps a prefix plus `-` and the hash of its method and
/// path; so a name depends only on the set of names wanted, never on the document's order.
/// Returns `None` for an operation whose hashed name still collides (a 24-bit hash may).
pub(crate) fn assign(ops: &[(Option<&str>, &str, &str)]) -> Vec<Option<String>> {
    let wanted: Vec<String> = ops.iter().map(|(id, m, p)| wanted(*id, m, p)).collect();
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for w in &wanted {
        *count.entry(w.as_str()).or_default() += 1;
    }
    let names: Vec<String> = wanted
        .iter()
        .zip(ops)
        .map(
            |(w, (_, m, p))| if w.len() > MAX_NAME || count[w.as_str()] > 1 { with_suffix(w, m, p) } else { w.clone() },
        )
        .collect();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &names {
        *seen.entry(n.as_str()).or_default() += 1;
    }
    names.iter().map(|n| (seen[n.as_str()] == 1).then(|| n.clone())).collect()
}
