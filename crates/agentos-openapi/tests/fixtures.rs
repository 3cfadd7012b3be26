//! Every document in the shared fixtures (`../shared/fixtures/openapi/`, 17 real documents)
//! either imports, with its tool and skipped counts held to the snapshot, or is refused with the
//! reason held there; and what imports is well formed: names unique and of the allowed letters,
//! each input property a valid flag, every schema one the flag generator reads without two flags
//! of one name.

use std::collections::BTreeSet;
use std::path::PathBuf;

use agentos_core::flagmap::{flag_table, kebab};
use agentos_openapi::{ImportOptions, Imported, Location, import};

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/openapi")
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
