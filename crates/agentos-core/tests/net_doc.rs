//! Net documents through their public API: what is refused as a document, and the one-line
//! messages that say why.

use agentos_core::net::NetDoc;
use serde_json::{Value, json};

/// The faults of a net whose one transition has `schedule: {cron}`.
fn cron_faults(cron: &str) -> String {
    let doc = NetDoc::from_value(json!({
        "places": ["a"],
        "transitions": [{"id": "t", "kind": "pass", "mode": "manual", "schedule": {"cron": cron}}]
    }))
    .expect("the document has the shape of a net");
    doc.validate().expect_err("the cron expression is refused").to_string()
}

#[test]
fn a_bad_cron_expression_is_refused_in_one_line_that_says_why_and_what_is_valid() {
    for (cron, why) in [
        ("bogus", "The 'Seconds' field does not support using names. 'bogus' specified. (at character 1)"),
        ("61 * * * * *", "Seconds must be less than 59. ('61' specified.) (at character 1)"),
        ("0 0 0 32 * *", "Days of Month must be less than 31. ('32' specified.) (at character 7)"),
        ("0 0 0 * * * * *", "unexpected text at character 15"),
        ("* * *", "unexpected text at character 6"),
        ("", "it is empty"),
        ("a\nb", "The 'Seconds' field does not support using names. 'a' specified."),
    ] {
        let msg = cron_faults(cron);
        assert!(!msg.contains('\n') && !msg.contains('\r'), "{cron:?}: the message is not one line: {msg:?}");
        assert!(msg.contains(&format!("bad cron expression {cron:?}: {why}; ")), "{cron:?}: {msg}");
        assert!(msg.contains("six fields") && msg.contains("\"0 */5 * * * *\""), "{cron:?}: {msg}");
    }
}

#[test]
fn the_examples_a_cron_fault_names_are_valid() {
    for cron in ["0 */5 * * * *", "0 30 9 * * Mon-Fri"] {
        let doc = NetDoc::from_value(json!({
            "places": ["a"],
            "transitions": [{"id": "t", "kind": "pass", "mode": "manual", "schedule": {"cron": cron}}]
        }))
        .unwrap();
        assert_eq!(doc.validate().map_err(|e| e.to_string()), Ok(()), "{cron}");
    }
}

#[test]
fn a_huge_cron_expression_is_shown_cut() {
    let msg = cron_faults(&"x".repeat(100_000));
    assert!(msg.len() < 2_000, "{} bytes: {}", msg.len(), &msg[..300]);
    assert!(msg.contains("(100000 characters)"), "{msg}");
}

#[test]
fn only_a_json_object_is_a_net_document() {
    // Serde reads a struct from an array field by field: this was a net of places a and b.
    for doc in [json!(["n4", ["a", "b"], []]), json!([]), json!(null), json!("net"), json!(3), json!(true)] {
        let e = NetDoc::from_value(doc.clone()).expect_err("not an object");
        assert_eq!(e.code, "invalid_net", "{doc}");
        assert!(e.to_string().contains("must be a JSON object"), "{doc}: {e}");
    }
    // YAML text is read as the same value.
    let e = NetDoc::parse("- n4\n- [a, b]\n- []\n").expect_err("a YAML sequence is not a net");
    assert!(e.message.contains("must be a JSON object") && e.message.ends_with("not an array"), "{e}");
    let empty: Value = json!({});
    assert_eq!(NetDoc::from_value(empty).unwrap(), NetDoc::default());
}

/// Regression: a net's faults echoed the names they refused whole: a place or transition id of
/// 100,000 characters came back whole in each message that named it.
#[test]
fn a_huge_name_in_a_net_is_shown_cut_in_its_fault() {
    let huge = "p".repeat(100_000);
    let doc = NetDoc::from_value(json!({
        "places": [huge.clone(), huge.clone()],
        "transitions": [{"id": huge.clone(), "kind": "pass", "presets": {"i": {"place": huge.clone()}},
            "postsets": {"o": {"place": format!("x{huge}")}}}]
    }))
    .expect("the document has the shape of a net");
    let msg = doc.validate().expect_err("the ids are refused").to_string();
    assert!(msg.len() < 4_000, "a {}-byte message: {}…", msg.len(), &msg[..300]);
    assert!(msg.contains("(100000 characters)") && msg.contains("(100001 characters)"), "{msg}");
}
