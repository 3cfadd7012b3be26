//! Validation of the names users choose: tool ids, model names, capabilities, script filenames.

use crate::CoreError;

/// How much of a name an error message shows.
const SHOWN_CHARS: usize = 64;

/// `s` quoted for an error message, cut after 64 characters with the length it had: an error
/// line about a 5,000-character name stays one readable line.
pub fn shown(s: &str) -> String {
    match s.char_indices().nth(SHOWN_CHARS) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}… ({} characters)", &s[..cut], s.chars().count()),
    }
}

/// `s` with each character that does not show as itself ([`unseen`]: a line break, a tab, an
/// escape, a line separator, a bidirectional override) written out as Rust writes it (`\n`,
/// `\u{1b}`, `\u{202e}`): text a registrant wrote into a schema (a property's name, an enum's
/// value, a description) stays on its own line of a list an agent reads (no `## System` of its
/// own, no forged tool), reads in the order it was written, and is inert in a terminal.
pub fn inert(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(unseen) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(
        s.chars()
            .map(|c| match c {
                c if c.is_control() => c.escape_default().to_string(),
                c if unseen(c) => c.escape_unicode().to_string(),
                c => c.into(),
            })
            .collect(),
    )
}

/// A character that does not show as itself: a control character, a line or paragraph
/// separator (U+2028, U+2029), a bidirectional override, isolate or mark (which reorders what
/// follows it on screen: U+202A to U+202E, U+2066 to U+2069, U+200E, U+200F, U+061C), or one
/// that shows as nothing (of no width: U+200B to U+200D, U+2060, U+FEFF, the soft hyphen, the
/// tag characters U+E0000 to U+E007F, the interlinear annotation marks U+FFF9 to U+FFFB; a
/// blank filler: U+115F, U+1160, U+180E, U+3164, U+FFA0). What [`inert`] writes out, and what
/// a line shown in a terminal drops.
pub fn unseen(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200b}'..='\u{200f}' | '\u{2060}' | '\u{feff}'
                | '\u{ad}' | '\u{61c}' | '\u{115f}' | '\u{1160}' | '\u{180e}' | '\u{3164}' | '\u{ffa0}'
                | '\u{fff9}'..='\u{fffb}' | '\u{e0000}'..='\u{e007f}'
        )
}

/// One line of text as a terminal can show it: colour and cursor codes (`ESC [ … letter`) and
/// characters that do not show as themselves ([`unseen`]: of no width, or
/// reordering what follows, as a bidirectional override does) dropped, other control characters
/// and runs of spaces made one space.
pub fn terminal_line(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                if chars.clone().next() == Some('[') {
                    // Parameters and intermediates up to the final byte, `@` to `~`.
                    chars.by_ref().skip(1).find(|c| ('@'..='~').contains(c));
                }
            }
            c if c.is_control() || c.is_whitespace() => {
                if !out.is_empty() && !out.ends_with(' ') {
                    out.push(' ');
                }
            }
            c if unseen(c) => {}
            c => out.push(c),
        }
    }
    out.truncate(out.trim_end().len());
    out
}

/// JSON text (as `serde_json` writes it) with each character that does not show as itself and
/// that JSON leaves as it is ([`unseen`] past ASCII's controls: DEL, the C1 controls such as
/// U+009B, which a terminal may read as the start of a command, a bidirectional override, a
/// line separator, one of no width) written as its `\u` escape: the same value, inert where it
/// is printed. Such a character can only stand inside a string of the JSON, where the escape
/// means it.
pub fn json_inert(json: &str) -> std::borrow::Cow<'_, str> {
    let escaped = |c: char| unseen(c) && c >= '\u{7f}';
    if !json.chars().any(escaped) {
        return std::borrow::Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if escaped(c) {
            // Past U+FFFF as its UTF-16 pair (`\ud83c\udff4`), as JSON writes such a character.
            for unit in c.encode_utf16(&mut [0; 2]) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// As [`inert`], its line breaks kept: text of several lines (a tool's description in its own
/// `--help`).
pub fn inert_lines(s: &str) -> String {
    s.split('\n').map(inert).collect::<Vec<_>>().join("\n")
}

/// At most `chars` characters of `text`, unquoted, saying how long it was when cut: for text
/// that is already a line of its own (a URL, an error), where [`shown`] would quote it.
pub fn cut(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        None => text.to_string(),
        Some((at, _)) => format!("{}… ({} characters)", &text[..at], text.chars().count()),
    }
}

/// `[a-z0-9][a-z0-9-]{0,63}`: tool ids and model names.
pub fn is_valid_id(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

pub fn check_tool_id(s: &str) -> Result<(), CoreError> {
    if is_valid_id(s) {
        Ok(())
    } else {
        Err(CoreError::bad_input(
            "invalid_id",
            format!(
                "invalid tool id {}: use 1 to 64 characters of a-z, 0-9 and '-', starting with a letter or digit (e.g. \"forum-sentinel\")",
                shown(s)
            ),
        ))
    }
}

pub fn check_model_name(s: &str) -> Result<(), CoreError> {
    if is_valid_id(s) {
        Ok(())
    } else {
        Err(CoreError::bad_input(
            "invalid_model",
            format!(
                "invalid model name {}: use 1 to 64 characters of a-z, 0-9 and '-', starting with a letter or digit",
                shown(s)
            ),
        ))
    }
}

/// Capabilities are short lower-case tags: `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn check_capability(s: &str) -> Result<(), CoreError> {
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(CoreError::bad_input(
            "invalid_capability",
            format!(
                "invalid capability {}: use 1 to 64 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit",
                shown(s)
            ),
        ))
    }
}

/// A free-text field (name, version, description): bounded, no control characters but newline and tab.
pub fn check_text(field: &str, s: &str, max_chars: usize, required: bool) -> Result<(), CoreError> {
    if required && s.trim().is_empty() {
        return Err(CoreError::bad_input("missing_field", format!("{field} must not be empty")));
    }
    if s.chars().count() > max_chars {
        return Err(CoreError::bad_input("field_too_long", format!("{field} is longer than {max_chars} characters")));
    }
    if s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return Err(CoreError::bad_input("invalid_text", format!("{field} contains control characters")));
    }
    Ok(())
}

/// A label (a tool's name, a version): [`check_text`], and no bidirectional override, embedding
/// or isolate, which would reorder on screen what is shown after it (an id beside the name
/// read backwards). Right-to-left text needs none of them; its letters carry their direction.
pub fn check_label(field: &str, s: &str, max_chars: usize) -> Result<(), CoreError> {
    check_text(field, s, max_chars, true)?;
    if let Some(c) = s.chars().find(|c| matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')) {
        return Err(CoreError::bad_input(
            "invalid_text",
            format!(
                "{field} contains a bidirectional control (U+{:04X}), which would reorder the text shown after it",
                c as u32
            ),
        ));
    }
    Ok(())
}

/// The longest token name, in characters.
pub const MAX_TOKEN_NAME_CHARS: usize = 200;

/// A token name, when one is given: 1 to 200 characters, no control characters (a NUL, CR or LF
/// in a name broke every line-oriented reader of tokens, and names were unbounded).
pub fn check_token_name(name: Option<&str>) -> Result<(), CoreError> {
    let Some(name) = name else { return Ok(()) };
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_TOKEN_NAME_CHARS {
        return Err(CoreError::bad_input(
            "invalid_name",
            format!("a token name has 1 to {MAX_TOKEN_NAME_CHARS} characters; this one has {chars}"),
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(CoreError::bad_input(
            "invalid_name",
            format!("a token name may not contain control characters (found {c:?})"),
        ));
    }
    Ok(())
}

/// Reduces a user-supplied filename to a safe base name: the last path component, only
/// `[A-Za-z0-9._-]`, no leading dots, at most 128 bytes. `None` when nothing usable is left.
pub fn safe_filename(raw: &str) -> Option<String> {
    let base = raw.rsplit(['/', '\\']).next().unwrap_or("");
    let mut out: String =
        base.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect();
    // Collapse any run of dots so `..` can never appear, then drop leading dots (no hidden files).
    while out.contains("..") {
        out = out.replace("..", ".");
    }
    let out = out.trim_start_matches('.').to_string();
    let mut out = out;
    if out.len() > 128 {
        out.truncate(128);
    }
    if out.is_empty() || out.chars().all(|c| c == '_' || c == '.' || c == '-') { None } else { Some(out) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_refuses_bidirectional_controls_and_keeps_right_to_left_letters() {
        assert!(check_label("name", "Reader \u{202e}elif", 200).unwrap_err().message.contains("U+202E"));
        assert!(check_label("name", "a\u{2067}b", 200).is_err());
        assert!(check_label("name", "שלום עולם", 200).is_ok());
        assert!(check_label("name", "mixed \u{200f}mark", 200).is_ok());
        assert_eq!(check_label("name", "", 200).unwrap_err().code, "missing_field");
    }

    #[test]
    fn a_long_name_is_shown_cut_with_its_length() {
        assert_eq!(shown("short"), "\"short\"");
        assert_eq!(shown(&"a".repeat(64)), format!("{:?}", "a".repeat(64)));
        assert_eq!(shown(&"a".repeat(65)), format!("{:?}… (65 characters)", "a".repeat(64)));
        // Cut on a character, never inside one.
        assert_eq!(shown(&"ü".repeat(100)), format!("{:?}… (100 characters)", "ü".repeat(64)));
    }

    #[test]
    fn ids() {
        for ok in ["a", "0", "forum-sentinel", "a-", &"a".repeat(64)] {
            assert!(is_valid_id(ok), "{ok}");
        }
        for bad in ["", "-a", "A", "a_b", "a.b", "a/b", "ü", &"a".repeat(65), " a"] {
            assert!(!is_valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn token_names_are_short_printable_text() {
        for ok in [None, Some("a"), Some("ünïcode name"), Some(&*"x".repeat(200))] {
            assert!(check_token_name(ok).is_ok(), "{ok:?}");
        }
        for bad in ["", "a\0b", "a\r\nb", "tab\there", &"x".repeat(201), &"x".repeat(200_000)] {
            assert_eq!(check_token_name(Some(bad)).unwrap_err().code, "invalid_name", "{bad:?}");
        }
    }

    fn check(raw: &str, expected: Option<&str>) {
        assert_eq!(safe_filename(raw).as_deref(), expected, "input {raw:?}");
    }

    #[test]
    fn filenames_are_reduced_to_safe_base_names() {
        check("run.sh", Some("run.sh"));
        check("../../etc/passwd", Some("passwd"));
        check("..\\..\\windows\\evil.bat", Some("evil.bat"));
        check("a/b/../c.py", Some("c.py"));
        check("..", None);
        check("/", None);
        check("", None);
        check(".hidden", Some("hidden"));
        check("x..y.js", Some("x.y.js"));
        check("my script (1).cjs", Some("my_script__1_.cjs"));
        check("nul\0byte", Some("nul_byte"));
    }

    #[test]
    fn json_inert_escapes_what_does_not_show_and_keeps_the_value() {
        let v = serde_json::json!({"a": "x\u{9b}31m\u{202e}txt\u{2028}\u{7f}\u{feff}é\u{1b}\u{1f3f4}\u{e0067}\u{e007f}", "b\u{200b}": [1]});
        let text = serde_json::to_string(&v).unwrap();
        let inert = json_inert(&text);
        assert!(!inert.chars().any(|c| c != ' ' && unseen(c)), "{inert}");
        assert!(inert.contains(r"\u009b") && inert.contains(r"\u202e") && inert.contains(r"\u2028"), "{inert}");
        assert!(inert.contains('é') && inert.contains('\u{1f3f4}'), "a character that shows stays as it is: {inert}");
        assert!(inert.contains(r"\udb40\udc67\udb40\udc7f"), "a tag character as its UTF-16 pair: {inert}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&inert).unwrap(), v);
        assert!(matches!(json_inert(r#"{"a":"plain é"}"#), std::borrow::Cow::Borrowed(_)));
    }
}
