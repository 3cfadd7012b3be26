//! OpenAPI documents (JSON or YAML) never panic or hang the importer, and whatever it imports
//! is well formed: tool names unique and of `[a-z0-9-]`, one binding per input property, and a
//! request built for each operation without panicking, whatever the input.
#![no_main]

use agentos_openapi::{ImportOptions, Limits, build_request, import};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

fuzz_target!(|data: &[u8]| {
    // Small limits: the fuzzer looks for panics and blow-ups, not for big documents.
    let limits = Limits {
        max_bytes: 64 << 10,
        max_depth: 64,
        max_nodes: 100_000,
        max_operations: 200,
        max_schema_nodes: 200_000,
    };
    let Ok(imported) = import(data, &ImportOptions { include: None, limits }) else {
        return;
    };
    let mut names = std::collections::BTreeSet::new();
    for op in &imported.operations {
        let n = op.name.as_bytes();
        assert!(
            !n.is_empty()
                && n.len() <= 64
                && n[0] != b'-'
                && n.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-'),
            "bad tool name {:?}",
            op.name
        );
        assert!(names.insert(op.name.clone()), "tool name {:?} twice", op.name);
        let props = op.input_schema["properties"].as_object().expect("an object schema");
        assert_eq!(props.len(), op.bindings.len(), "one binding per property in {}", op.name);
        // Every property set to a string that tries to escape its place, then to nothing.
        let hostile: Map<String, Value> =
            op.bindings.iter().map(|b| (b.property.clone(), Value::String("../a/b?c=d#e\r\n".into()))).collect();
        if let Ok(request) = build_request("https://example.com/base", op, &Value::Object(hostile)) {
            assert!(request.url.starts_with("https://example.com/base/"), "{}", request.url);
            let path = request.url.split('?').next().unwrap_or_default();
            assert!(!path.contains("/../") && !path.ends_with("/.."), "{}", request.url);
        }
        let _ = build_request("https://example.com", op, &Value::Object(Map::new()));
    }
});
