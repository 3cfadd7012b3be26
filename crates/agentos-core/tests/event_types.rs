//! The list of event types readers may filter by is the list the log reads.

use agentos_core::event::EventBody;

/// The log names every type it knows when it meets one it does not: that list and
/// `EventBody::TYPE_NAMES` are the same, so a type added to one is added to the other.
#[test]
fn the_type_names_are_every_type_the_log_reads() {
    let e = EventBody::from_parts("NoSuchType", "null").unwrap_err().to_string();
    let known = e.split_once("expected one of ").unwrap_or_else(|| panic!("{e}")).1;
    let mut known: Vec<&str> = known.split(", ").map(|t| t.trim_matches(|c: char| !c.is_alphanumeric())).collect();
    known.sort();
    let mut names = EventBody::TYPE_NAMES.to_vec();
    names.sort();
    assert_eq!(names, known, "{e}");
}
