//! Every document in the shared fixtures (`fixtures/openapi/`, 17 real documents)
//! either imports, with its tool and skipped counts held to the snapshot, or is refused with the
//! reason held there; and what imports is well formed: names unique and of the allowed letters,
//! each input property a valid flag, every schema one the flag generator reads without two flags
//! of one name.

use std::collections::BTreeSet;
use std::path::PathBuf;

use agentos_core::flagmap::{flag_table, kebab};
use agentos_openapi::{ImportOptions, Imported, Location, import};

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/openapi")
}

fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn check_well_formed(file: &str, imported: &Imported) {
    let mut names = BTreeSet::new();
    for op in &imported.operations {
        assert!(valid_name(&op.name), "{file}: tool name {:?} is not [a-z0-9][a-z0-9-]{{0,63}}", op.name);
        assert!(names.insert(op.name.clone()), "{file}: tool name {:?} twice", op.name);
        let props = op.input_schema["properties"].as_object().expect("properties");
        assert_eq!(props.len(), op.bindings.len(), "{file} {}: one binding per property", op.name);
        for b in &op.bindings {
            assert!(props.contains_key(&b.property), "{file} {}: binding {:?} without property", op.name, b.property);
            assert_eq!(
                kebab(&b.property),
                b.property,
                "{file} {}: property {:?} is not its own flag",
                op.name,
                b.property
            );
            assert!(valid_name(&b.property), "{file} {}: property {:?}", op.name, b.property);
            if b.location != Location::Body {
                assert!(!b.name.is_empty(), "{file} {}: binding {:?} without a name", op.name, b.property);
            }
        }
        let table = flag_table(&op.input_schema);
        let mut flags = BTreeSet::new();
        for f in &table.flags {
            assert!(flags.insert(f.flag.clone()), "{file} {}: flag --{} twice", op.name, f.flag);
            assert!(
                !["json", "json-file", "help"].contains(&f.flag.as_str()),
                "{file} {}: reserved flag --{}",
                op.name,
                f.flag
            );
        }
    }
    // Stored inside a catalog entry: it must read back as it was written.
    let text = serde_json::to_string(imported).expect("serializes");
    let back: Imported = serde_json::from_str(&text).expect("reads back");
    assert_eq!(&back, imported, "{file}: serde round trip");
}

#[test]
fn every_fixture_imports_or_is_refused_as_recorded() {
    let dir = fixtures_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the shared OpenAPI fixtures are missing at {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n != "MANIFEST.md"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 17, "MANIFEST.md lists 17 documents");
    let mut table = String::new();
    for path in &files {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let bytes = std::fs::read(path).expect("read fixture");
        match import(&bytes, &ImportOptions::default()) {
            Ok(imported) => {
                check_well_formed(&file, &imported);
                table.push_str(&format!(
                    "{file}: {} tools, {} skipped\n",
                    imported.operations.len(),
                    imported.skipped.len()
                ));
                for s in &imported.skipped {
                    table.push_str(&format!("  skipped {}: {}\n", s.pointer, s.reason));
                }
            }
            Err(e) => table.push_str(&format!("{file}: refused: {e}\n")),
        }
    }
    insta::assert_snapshot!(table);
}

fn fixture(file: &str) -> Imported {
    let path = fixtures_dir().join(file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    import(&bytes, &ImportOptions::default()).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn bindings(imported: &Imported, tool: &str) -> Vec<(String, Location, String)> {
    let op = imported.operations.iter().find(|o| o.name == tool).unwrap_or_else(|| panic!("no tool {tool}"));
    op.bindings.iter().map(|b| (b.property.clone(), b.location, b.name.clone())).collect()
}

/// What MANIFEST.md points out about the documents, checked where it shapes the tools.
#[test]
fn the_notable_features_of_the_fixtures_become_the_right_flags() {
    // Path `AccountSid` and form field `AccountSid`: both prefixed.
    let twilio = fixture("twilio-api-v2010-3.0.json");
    let b = bindings(&twilio, "update-incoming-phone-number");
    assert!(b.contains(&("path-account-sid".into(), Location::Path, "AccountSid".into())), "{b:?}");
    assert!(b.contains(&("body-account-sid".into(), Location::BodyField, "AccountSid".into())), "{b:?}");

    // Query `flow` and `flow` inside the oneOf branches of the body.
    let kratos = fixture("ory-kratos-3.0.json");
    let b = bindings(&kratos, "update-settings-flow");
    assert!(b.contains(&("query-flow".into(), Location::Query, "flow".into())), "{b:?}");
    assert!(b.contains(&("body-flow".into(), Location::BodyField, "flow".into())), "{b:?}");

    // UpdateAPIKey's body `key` is readOnly: not input, so the path's `key` keeps its name.
    let datadog = fixture("datadog-v1-3.0.yaml");
    let b = bindings(&datadog, "update-api-key");
    assert_eq!(b, [("key".into(), Location::Path, "key".into()), ("name".into(), Location::BodyField, "name".into())]);

    // Planet ↔ Satellite stays recursive.
    let galaxy = fixture("scalar-galaxy-3.1.yaml");
    let planet = &galaxy.operations.iter().find(|o| o.name == "create-planet").expect("create-planet").input_schema;
    assert!(planet["$defs"]["Planet"].is_object() && planet["$defs"]["Satellite"].is_object(), "{planet}");
    assert!(galaxy.security.iter().any(
        |s| s.kind == agentos_openapi::SecurityKind::ApiKey { location: Location::Cookie, name: "api_key".into() }
    ));

    // A multipart upload: the file is a binary field, required with the model.
    let openai = fixture("openai-3.1.yaml");
    let op = openai.operations.iter().find(|o| o.name == "create-transcription").expect("create-transcription");
    assert_eq!(op.body.as_ref().map(|b| b.encoding), Some(agentos_openapi::BodyEncoding::Multipart));
    assert_eq!(op.input_schema["properties"]["file"]["format"], "binary");
    assert_eq!(op.input_schema["required"], serde_json::json!(["file", "model"]));

    // No operationId anywhere: names from the method and path.
    let overseerr = fixture("overseerr-3.0.yaml");
    assert!(overseerr.operations.iter().any(|o| o.name == "get-auth-me"));
    assert!(overseerr.operations.iter().any(|o| o.name == "post-auth-reset-password-by-guid"));
}

/// Damaged documents (cut short anywhere, or with bytes changed) are refused or imported, never
/// a panic: the importer's answer to anything is a value.
#[test]
fn damaged_fixtures_never_panic() {
    for file in ["petstore-expanded-3.0.json", "scalar-galaxy-3.1.yaml", "link-example-3.0.yaml"] {
        let bytes = std::fs::read(fixtures_dir().join(file)).expect("read fixture");
        let step = (bytes.len() / 200).max(1);
        for cut in (0..bytes.len()).step_by(step) {
            let _ = import(&bytes[..cut], &ImportOptions::default());
        }
        // A fixed-seed generator: the same damage on every run.
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let specials = b"{}[]:,\"'&*!#-|>$~/ \n";
        for _ in 0..150 {
            let mut damaged = bytes.clone();
            for _ in 0..4 {
                let at = (next() % damaged.len() as u64) as usize;
                damaged[at] = specials[(next() % specials.len() as u64) as usize];
            }
            if let Ok(imported) = import(&damaged, &ImportOptions::default()) {
                check_well_formed(file, &imported);
            }
        }
    }
}
