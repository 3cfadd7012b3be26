//! Net documents (JSON or YAML) never panic the parser or the validation.
#![no_main]

use agentos_core::net::NetDoc;
use libfuzzer_sys::fuzz_target;

fn check(doc: &NetDoc) {
    let faults = doc.faults();
    let valid = doc.validate();
    assert_eq!(faults.is_empty(), valid.is_ok(), "faults() and validate() disagree: {faults:?} vs {valid:?}");
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(doc) = NetDoc::parse(s) {
        check(&doc);
    }
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(s)
        && let Ok(doc) = NetDoc::from_value(value)
    {
        check(&doc);
    }
});
