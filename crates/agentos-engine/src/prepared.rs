//! Operations made ready to call, kept for the ones called lately.
//!
//! The catalog keeps each contract as text (`CompactEntry`). A call of one operation needs
//! that operation's input schema parsed, its flag table drawn and its validator compiled; an
//! http service's call also needs the operation's request description. Done at every call,
//! for a large schema (`create-call` of Twilio's API, 11 KB) that was half the master's own
//! work on the call.
//! [`PreparedOps`] keeps that work for the operations called most lately, within a budget of
//! schema size and a number of operations, so that what it holds does not grow with the
//! catalog. The operations of an entry gone from the catalog are dropped first.
//!
//! An entry is only ever replaced, never changed in place, and the replacement is a new `Arc`:
//! what is kept is found by the entry's address, and a `Weak` of it is kept beside, so that
//! the address cannot be taken by another entry while anything is kept for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use serde_json::Value;

use agentos_core::CoreError;
use agentos_core::entry::StoredEntry;
use agentos_core::flagmap::{FlagTable, UsageError, Validator, compile, flag_table, validate_with};

/// Schema size kept at most, summed over the operations kept (see [`weight`]). What is kept of
/// an operation, its parsed schema and its validator, takes up to about fifteen times its
/// weight for a schema without patterns, less with them (Twilio's 197 operations, their 425
/// patterns compiled: 2.1 MB of weight, 6.0 MB kept): some 30 MB at most, unless patterns
/// compile far beyond their usual size.
const BUDGET: usize = 2 << 20;

/// What a `pattern` adds to its schema's weight: a regex compiled, about 0.7 KB for Twilio's,
/// counted generously. One may compile to far more (the `regex` crate allows 10 MB), as it did
/// for the time of each call before operations were kept.
const PATTERN_WEIGHT: usize = 4 << 10;

/// Operations kept at most, whatever their size.
const MOST: usize = 1024;

/// One operation of one entry, ready to call.
pub(crate) struct PreparedOp {
    form: Form,
    pub(crate) table: FlagTable,
    /// Compiled at the first validation: a call by input that fails before it (an unknown
    /// flag) never pays for it.
    validator: OnceLock<Option<Validator>>,
}

enum Form {
    Schema(Value),
    /// An http service's or a container's operation: its request's description, which holds
    /// the input schema.
    Request(Box<agentos_openapi::Operation>),
}

impl PreparedOp {
    /// `name` of `entry`; `None` when it has no such operation.
    pub(crate) fn new(entry: &StoredEntry, name: &str) -> Option<PreparedOp> {
        let op = entry.entry.operation(name)?;
        let table = flag_table(&op.input);
        let form = match entry.entry.binding.http_operation(name) {
            Some(call) => Form::Request(Box::new(call.to_openapi(op.input))),
            None => Form::Schema(op.input),
        };
        Some(PreparedOp { form, table, validator: OnceLock::new() })
    }

    /// The operation's input schema.
    pub(crate) fn schema(&self) -> &Value {
        match &self.form {
            Form::Schema(s) => s,
            Form::Request(r) => &r.input_schema,
        }
    }

    /// The request's description, for an http service's or a container's operation.
    pub(crate) fn request(&self) -> Option<&agentos_openapi::Operation> {
        match &self.form {
            Form::Request(r) => Some(r),
            Form::Schema(_) => None,
        }
    }

    /// `input` against the whole schema; errors name the flag when one maps to the path.
    pub(crate) fn validate(&self, input: &Value) -> Result<(), UsageError> {
        let validator = self.validator.get_or_init(|| compile(self.schema()));
        validate_with(validator.as_ref(), &self.table, input)
    }
}

/// What an operation's schema costs to keep, in about the bytes of its text: each value and
/// key counts 8, plus the length of each string, plus [`PATTERN_WEIGHT`] for each regex.
fn weight(v: &Value) -> usize {
    8 + match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(weight).sum(),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| {
                let regexes = match (k.as_str(), v) {
                    ("pattern", Value::String(_)) => 1,
                    ("patternProperties", Value::Object(p)) => p.len(),
                    _ => 0,
                };
                8 + k.len() + weight(v) + regexes * PATTERN_WEIGHT
            })
            .sum(),
        _ => 0,
    }
}

/// The operations kept, by entry.
pub(crate) struct PreparedOps {
    kept: Mutex<Kept>,
    budget: usize,
}

#[derive(Default)]
struct Kept {
    /// By the entry's address.
    entries: HashMap<usize, KeptEntry>,
    /// Summed over every operation kept.
    weight: usize,
    count: usize,
    /// Counts look-ups; an operation's last look-up orders the evictions.
    clock: u64,
}

struct KeptEntry {
    /// Holds the address (see the module's note), and tells whether the entry is still in use.
    entry: Weak<StoredEntry>,
    ops: Vec<KeptOp>,
}

struct KeptOp {
    name: Box<str>,
    op: Arc<PreparedOp>,
    weight: usize,
    used: u64,
}

impl Default for PreparedOps {
    fn default() -> Self {
        PreparedOps::with_budget(BUDGET)
    }
}

impl PreparedOps {
    pub(crate) fn with_budget(budget: usize) -> PreparedOps {
        PreparedOps { kept: Mutex::new(Kept::default()), budget }
    }

    /// Operation `name` of `entry`, from what is kept or prepared now (and then kept, when it
    /// fits the budget); `None` when the entry has no such operation.
    pub(crate) fn get(&self, entry: &Arc<StoredEntry>, name: &str) -> Option<Arc<PreparedOp>> {
        let key = Arc::as_ptr(entry) as usize;
        {
            let mut kept = self.lock();
            kept.clock += 1;
            let now = kept.clock;
            if let Some(op) = kept.entries.get_mut(&key).and_then(|e| e.ops.iter_mut().find(|o| &*o.name == name)) {
                op.used = now;
                return Some(op.op.clone());
            }
        }
        // Prepared outside the lock: parsing a large schema takes a while.
        let op = Arc::new(PreparedOp::new(entry, name)?);
        let weight = weight(op.schema());
        if weight > self.budget / 4 {
            return Some(op);
        }
        let mut kept = self.lock();
        let kept = &mut *kept;
        let now = kept.clock;
        let e = kept.entries.entry(key).or_insert_with(|| KeptEntry { entry: Arc::downgrade(entry), ops: Vec::new() });
        // Another call may have prepared it meanwhile.
        if let Some(o) = e.ops.iter().find(|o| &*o.name == name) {
            return Some(o.op.clone());
        }
        e.ops.push(KeptOp { name: name.into(), op: op.clone(), weight, used: now });
        kept.weight += weight;
        kept.count += 1;
        while (kept.weight > self.budget || kept.count > MOST) && kept.evict_one() {}
        Some(op)
    }

    /// Operation `name` of `entry`, or the refusal that names the nearest tools of `toolkit`
    /// (the id its caller used).
    pub(crate) fn find(
        &self,
        entry: &Arc<StoredEntry>,
        toolkit: &str,
        name: &str,
    ) -> Result<Arc<PreparedOp>, CoreError> {
        self.get(entry, name).ok_or_else(|| {
            let names = entry.entry.operation_names();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            CoreError::not_found(agentos_core::toolhelp::unknown_tool(toolkit, name, &names))
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        // Nothing below panics with the lock held but an allocation failure; what is kept is
        // whole at every step either way.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn counts(&self) -> (usize, usize, usize) {
        let kept = self.lock();
        (kept.entries.len(), kept.count, kept.weight)
    }
}

impl Kept {
    /// Drops one operation: of an entry gone from the catalog first, else the one looked up
    /// least lately; and its entry's place once it has none. `false` when nothing was left.
    fn evict_one(&mut self) -> bool {
        let first = self
            .entries
            .iter()
            .flat_map(|(key, e)| {
                let alive = e.entry.strong_count() > 0;
                e.ops.iter().enumerate().map(move |(i, o)| (alive, o.used, *key, i))
            })
            .min();
        let Some((_, _, key, i)) = first else { return false };
        let Some(e) = self.entries.get_mut(&key) else { return false };
        let gone = e.ops.swap_remove(i);
        self.weight -= gone.weight;
        self.count -= 1;
        if e.ops.is_empty() {
            self.entries.remove(&key);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentos_core::entry::CatalogEntry;
    use serde_json::json;

    fn stored(model: &str, ops: &[(&str, Value)], binding: Value) -> Arc<StoredEntry> {
        let operations: serde_json::Map<String, Value> =
            ops.iter().map(|(n, s)| (n.to_string(), json!({"description": "", "input": s}))).collect();
        let e: CatalogEntry = serde_json::from_value(json!({
            "id": "t", "name": "T", "version": "1", "status": "approved",
            "contract": {"type": "x", "operations": operations},
            "binding": binding,
        }))
        .expect("an entry");
        Arc::new(StoredEntry::new(e, model.into(), 1, 0, 0, "op".into()))
    }

    fn entry(model: &str, ops: &[(&str, Value)]) -> Arc<StoredEntry> {
        let script = json!({"type": "script", "runtime": "sh", "scriptUrn": "urn:agentos:blob:tool-catalog/scripts/0.sh",
            "sha256": "0", "filename": "run.sh", "sizeBytes": 4});
        stored(model, ops, script)
    }

    fn schema(required: &str) -> Value {
        json!({"type": "object", "properties": {required: {"type": "string", "minLength": 2}}, "required": [required]})
    }

    #[test]
    fn an_operation_is_prepared_once_and_checks_what_its_schema_says() {
        let ops = PreparedOps::default();
        let e = entry("m", &[("a", schema("x")), ("b", schema("y"))]);
        let a = ops.get(&e, "a").expect("a");
        assert!(Arc::ptr_eq(&a, &ops.get(&e, "a").expect("a again")), "the second look-up finds the first");
        assert!(a.validate(&json!({"x": "ok"})).is_ok());
        let refused = a.validate(&json!({"x": "o"})).expect_err("too short");
        assert!(refused.0.starts_with("--x: "), "{}", refused.0);
        assert!(a.validate(&json!({})).is_err(), "x is required");
        let b = ops.get(&e, "b").expect("b");
        assert!(b.validate(&json!({"y": "ok"})).is_ok() && b.validate(&json!({"x": "ok"})).is_err());
        assert!(ops.get(&e, "c").is_none(), "no such operation");
        assert_eq!(ops.counts().1, 2, "nothing kept for a name the entry lacks");
    }

    #[test]
    fn a_replaced_entry_is_prepared_anew() {
        let ops = PreparedOps::default();
        let old = entry("m", &[("a", schema("x"))]);
        let old_a = ops.get(&old, "a").expect("a");
        let new = entry("m", &[("a", schema("z"))]);
        let new_a = ops.get(&new, "a").expect("a of the new entry");
        assert!(!Arc::ptr_eq(&old_a, &new_a));
        assert!(new_a.validate(&json!({"z": "ok"})).is_ok() && new_a.validate(&json!({"x": "ok"})).is_err());
        // The old entry gone from the catalog: nothing can be found at its address but what
        // was kept for it, which holds that address until it is dropped.
        drop(old);
        let again = entry("m", &[("a", schema("w"))]);
        let again_a = ops.get(&again, "a").expect("a");
        assert!(again_a.validate(&json!({"w": "ok"})).is_ok(), "never what was kept for the old entry");
    }

    #[test]
    fn the_budget_drops_the_operations_used_least_lately() {
        let small = weight(&schema("x"));
        // Room for four; one operation may take up to a quarter of it.
        let ops = PreparedOps::with_budget(small * 4 + small / 2);
        let names = ["a", "b", "c", "d", "e"];
        let e = entry("m", &names.map(|n| (n, schema("x"))));
        let a = ops.get(&e, "a").expect("a");
        ops.get(&e, "b").expect("b");
        ops.get(&e, "c").expect("c");
        let d = ops.get(&e, "d").expect("d");
        assert_eq!(ops.counts(), (1, 4, small * 4));
        // `a` used again: `b` is now the one used least lately, and goes for `e`.
        assert!(Arc::ptr_eq(&a, &ops.get(&e, "a").expect("a")));
        let c = ops.get(&e, "c").expect("c");
        ops.get(&e, "e").expect("e");
        assert_eq!(ops.counts(), (1, 4, small * 4));
        assert!(Arc::ptr_eq(&a, &ops.get(&e, "a").expect("a")), "a kept");
        assert!(Arc::ptr_eq(&c, &ops.get(&e, "c").expect("c")), "c kept");
        // `b` was dropped: asked again, it is prepared anew, and `d` goes.
        let b = ops.get(&e, "b").expect("b");
        assert!(Arc::ptr_eq(&b, &ops.get(&e, "b").expect("b")), "b kept now");
        assert_eq!(ops.counts(), (1, 4, small * 4));
        assert!(!Arc::ptr_eq(&d, &ops.get(&e, "d").expect("d")), "d was dropped");
        // An operation above a quarter of the budget is prepared for its call and not kept.
        let big = entry("m", &[("big", json!({"type": "object", "description": "x".repeat(small * 2)}))]);
        let first = ops.get(&big, "big").expect("big");
        assert!(!Arc::ptr_eq(&first, &ops.get(&big, "big").expect("big")));
        assert_eq!(ops.counts(), (1, 4, small * 4));
        // Every operation of an entry dropped: its place goes too.
        let other = entry("n", &names.map(|n| (n, schema("x"))));
        for n in &names[..4] {
            ops.get(&other, n).expect("op");
        }
        assert_eq!(ops.counts(), (1, 4, small * 4), "only the other entry's four are left");
    }

    #[test]
    fn an_entry_gone_from_the_catalog_is_dropped_first_and_patterns_weigh_more() {
        let small = weight(&schema("x"));
        let ops = PreparedOps::with_budget(small * 4 + small / 2);
        let kept = entry("m", &[("a", schema("x")), ("b", schema("x"))]);
        let gone = entry("n", &[("a", schema("x")), ("b", schema("x"))]);
        let kept_a = ops.get(&kept, "a").expect("a");
        ops.get(&kept, "b").expect("b");
        ops.get(&gone, "a").expect("a");
        ops.get(&gone, "b").expect("b");
        assert_eq!(ops.counts(), (2, 4, small * 4));
        // The second entry replaced: its operations go before those looked up less lately.
        drop(gone);
        let other = entry("o", &[("a", schema("x")), ("b", schema("x"))]);
        ops.get(&other, "a").expect("a");
        ops.get(&other, "b").expect("b");
        assert_eq!(ops.counts(), (2, 4, small * 4));
        assert!(Arc::ptr_eq(&kept_a, &ops.get(&kept, "a").expect("a")), "the live entry's kept");

        let plain = json!({"type": "string"});
        let one = json!({"type": "string", "pattern": "^a$"});
        let two = json!({"type": "object", "patternProperties": {"^a": {}, "^b": {}}});
        assert_eq!(weight(&one), weight(&plain) + 8 + "pattern".len() + 8 + 3 + PATTERN_WEIGHT);
        assert!(weight(&two) > 2 * PATTERN_WEIGHT);
    }

    #[test]
    fn an_http_operation_keeps_its_request_with_the_schema() {
        let ops = PreparedOps::default();
        let script = entry("m", &[("a", schema("x"))]);
        assert!(ops.get(&script, "a").expect("a").request().is_none(), "a script's operation has no request");
        let binding = json!({"type": "http", "baseUrl": "http://127.0.0.1:9", "openapiUrn": "urn:agentos:blob:tool-catalog/openapi/0.json",
            "sha256": "0", "sizeBytes": 1, "operations": [
                {"name": "get-x", "method": "GET", "path": "/x/{x}", "bindings": [{"property": "x", "location": "path", "name": "x"}]}]});
        let http = stored("m", &[("get-x", schema("x"))], binding);
        let op = ops.get(&http, "get-x").expect("get-x");
        let request = op.request().expect("an http operation has its request");
        assert_eq!(&request.input_schema, &schema("x"));
        assert_eq!(op.schema(), &schema("x"));
        let built = agentos_openapi::build_request("http://127.0.0.1:9", request, &json!({"x": "ab"})).expect("built");
        assert_eq!((built.method.as_str(), built.url.as_str()), ("GET", "http://127.0.0.1:9/x/ab"));
    }
}
