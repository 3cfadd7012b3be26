//! Redaction: every form a secret's value can take in what a tool, a server or a script answers
//! (raw, JSON-escaped, URL-encoded, base64 and base32 at any alignment, hex; in any ASCII letter case,
//! reversed, or one character per separator) is replaced by `[redacted]`, in JSON values
//! (walked, keys included), text and bytes, before anything is recorded.
//!
//! It catches a secret a tool echoes by accident or passes through a common encoding. It is no
//! barrier to a script bent on leaking one (a cipher, a secret split over two answers): that is
//! why a grant of a secret names the script's sha256, a script the operator read.

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use serde_json::{Map, Value};

/// What a secret's value is replaced by.
pub const MARK: &str = "[redacted]";

/// Secrets are at least this long when set: a shorter value turns up by chance in ordinary
/// answers, which redaction would then mangle, and is quick to guess.
pub const MIN_SECRET_BYTES: usize = 8;

/// A base64 core shorter than this is not used: short runs of base64 characters occur by
/// chance in ordinary text, and redacting them would damage it.
const MIN_CORE: usize = 8;

/// Replaces the secrets it was built from, in every form it knows, by [`MARK`].
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// `None`: there is nothing to redact.
    matcher: Option<AhoCorasick>,
}

impl Redactor {
    /// A redactor for these secret values; empty ones are ignored.
    pub fn new(secrets: &[String]) -> Redactor {
        let mut patterns: Vec<Vec<u8>> = secrets.iter().filter(|s| !s.is_empty()).flat_map(|s| forms(s)).collect();
        patterns.sort();
        patterns.dedup();
        if patterns.is_empty() {
            return Redactor { matcher: None };
        }
        // Leftmost-longest: where the padded base64 of a secret and its shorter core both start,
        // the whole form goes, not the core with its tail left behind. ASCII case is ignored:
        // `tr a-z A-Z` or `${S^^}` leaves a secret as readable as before.
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .ascii_case_insensitive(true)
            .build(&patterns)
            .expect("literal patterns of bounded size always build");
        Redactor { matcher: Some(matcher) }
    }

    /// True when there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.matcher.is_none()
    }

    /// `v` with every string and every object key redacted. A number whose text holds a secret
    /// becomes the string [`MARK`]. Structure is never changed.
    pub fn value(&self, v: Value) -> Value {
        if self.is_empty() {
            return v;
        }
        match v {
            Value::String(s) => Value::String(self.text(&s)),
            Value::Number(n) => {
                let shown = n.to_string();
                if self.text(&shown) == shown { Value::Number(n) } else { Value::String(MARK.to_string()) }
            }
            Value::Array(items) => Value::Array(items.into_iter().map(|x| self.value(x)).collect()),
            Value::Object(fields) => {
                let mut out = Map::with_capacity(fields.len());
                for (k, x) in fields {
                    out.insert(self.text(&k), self.value(x));
                }
                Value::Object(out)
            }
            other => other,
        }
    }

    /// `s` with every form of every secret replaced.
    pub fn text(&self, s: &str) -> String {
        let Some(m) = &self.matcher else { return s.to_string() };
        // Every pattern is valid UTF-8 (a secret is a string, its encodings ASCII), so matches
        // fall on character boundaries.
        let mut out = String::with_capacity(s.len());
        m.replace_all_with(s, &mut out, |_, _, dst| {
            dst.push_str(MARK);
            true
        });
        out
    }

    /// `b` with every form of every secret replaced.
    pub fn bytes(&self, b: Vec<u8>) -> Vec<u8> {
        let Some(m) = &self.matcher else { return b };
        if !m.is_match(&b) {
            return b;
        }
        let mut out = Vec::with_capacity(b.len());
        m.replace_all_with_bytes(&b, &mut out, |_, _, dst| {
            dst.extend_from_slice(MARK.as_bytes());
            true
        });
        out
    }
}

/// Separators a secret may be spelled out with, one character at a time (`sed 's/./& /g'`,
/// `fold -w1`, a JSON string of the latter).
const SPELLED: [&str; 8] = [" ", "\n", "\\n", "\t", ",", ".", "-", ":"];

/// Every form of one secret that is matched: its encodings, those of the secret reversed
/// (`rev`, by character), and the secret spelled out with each of [`SPELLED`].
fn forms(secret: &str) -> Vec<Vec<u8>> {
    let mut out = encodings(secret);
    let reversed: String = secret.chars().rev().collect();
    out.extend(encodings(&reversed));
    let chars: Vec<String> = secret.chars().map(String::from).collect();
    for sep in SPELLED {
        out.push(chars.join(sep).into_bytes());
    }
    // UTF-16, little and big endian, as a service answering in `charset=utf-16` echoes it: a NUL
    // between the characters of an ASCII secret.
    let units: Vec<u16> = secret.encode_utf16().collect();
    out.push(units.iter().flat_map(|u| u.to_le_bytes()).collect());
    out.push(units.iter().flat_map(|u| u.to_be_bytes()).collect());
    out
}

/// The encodings of one text that are matched.
fn encodings(secret: &str) -> Vec<Vec<u8>> {
    let raw = secret.as_bytes();
    let mut out = vec![raw.to_vec()];
    // JSON escaping as serde_json writes it, and with non-ASCII as \u escapes as other
    // serializers (Python's json, for one) write it.
    let quoted = serde_json::to_string(secret).expect("a string always serializes");
    let escaped = &quoted[1..quoted.len() - 1];
    out.push(escaped.as_bytes().to_vec());
    out.push(json_ascii(escaped).into_bytes());
    // `/` written `\/`, as PHP's json_encode and others write it by default.
    if escaped.contains('/') {
        let slashed = escaped.replace('/', "\\/");
        out.push(json_ascii(&slashed).into_bytes());
        out.push(slashed.into_bytes());
    }
    // Every character as a `\uXXXX` escape (UTF-16, hex in either case), as a serializer set to
    // escape everything writes it: found here in text that is not read as JSON (broken JSON, a
    // `text/plain` error page), where the walk of a parsed value cannot decode it.
    out.push(secret.encode_utf16().map(|u| format!("\\u{u:04x}")).collect::<String>().into_bytes());
    // Non-ASCII bytes read as Latin-1 and written back as UTF-8, as a service that decodes
    // headers as Latin-1 (Python's, WSGI's) echoes them: `ü` comes back as `Ã¼`.
    if !secret.is_ascii() {
        out.push(raw.iter().map(|&b| char::from(b)).collect::<String>().into_bytes());
    }
    // URL encoding: every byte outside the unreserved set, upper and lower case hex, with `%20`
    // or `+` for a space; and form encoding as browsers and the `url` crate write it (the http
    // binding's query credential): `*` kept, `~` encoded.
    for (lower, plus) in [(false, false), (true, false), (false, true), (true, true)] {
        out.push(percent(raw, lower, plus, UNRESERVED).into_bytes());
    }
    for lower in [false, true] {
        out.push(percent(raw, lower, true, FORM_KEPT).into_bytes());
    }
    // base64, whole, in both alphabets, with and without padding.
    let std = base64::engine::general_purpose::STANDARD.encode(raw);
    out.push(std.clone().into_bytes());
    out.push(std.trim_end_matches('=').as_bytes().to_vec());
    out.push(url_safe(&std).into_bytes());
    out.push(url_safe(std.trim_end_matches('=')).into_bytes());
    // base64 of a longer text that holds the secret (`echo $S | base64`, a prefix before it):
    // the characters that depend on the secret's bytes alone, for each of the three alignments.
    for filler in 0..3usize {
        let mut buf = vec![0u8; filler];
        buf.extend_from_slice(raw);
        let enc = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&buf);
        // Character i covers bits 6i..6i+6: those below 8*filler come from the filler, those
        // past the last whole byte from whatever follows the secret.
        let first = (8 * filler).div_ceil(6);
        let end = (8 * buf.len()) / 6;
        if end > first && end - first >= MIN_CORE {
            let core = &enc[first..end];
            out.push(core.as_bytes().to_vec());
            out.push(url_safe(core).into_bytes());
        }
    }
    // base32 (`base32`, TOTP keys), likewise: each of the five alignments, the characters
    // that depend on the secret's bytes alone (letter case is ignored by the matcher).
    for filler in 0..5usize {
        let mut buf = vec![0u8; filler];
        buf.extend_from_slice(raw);
        let enc = base32(&buf);
        let first = (8 * filler).div_ceil(5);
        let end = (8 * buf.len()) / 5;
        if end > first && end - first >= MIN_CORE {
            out.push(enc.as_bytes()[first..end].to_vec());
        }
    }
    out.push(hex::encode(raw).into_bytes());
    out.push(hex::encode_upper(raw).into_bytes());
    out
}

/// RFC 4648 base32 without padding: character `i` holds bits `5i..5i+5` of `raw`.
fn base32(raw: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity((raw.len() * 8).div_ceil(5));
    let (mut acc, mut bits) = (0u16, 0u32);
    for &b in raw {
        acc = (acc << 8) | u16::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[usize::from((acc >> bits) & 31)]));
        }
        acc &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[usize::from((acc << (5 - bits)) & 31)]));
    }
    out
}

/// JSON-escaped text with every non-ASCII character as `\uXXXX` (UTF-16, lower-case hex).
fn json_ascii(escaped: &str) -> String {
    let mut out = String::with_capacity(escaped.len());
    for c in escaped.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// The punctuation RFC 3986 leaves unencoded.
const UNRESERVED: &[u8] = b"-._~";
/// The punctuation `application/x-www-form-urlencoded` leaves unencoded (WHATWG URL).
const FORM_KEPT: &[u8] = b"*-._";

/// Percent-encoding of every byte that is neither alphanumeric nor in `kept`.
fn percent(raw: &[u8], lower: bool, plus_for_space: bool, kept: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len() * 3);
    for &b in raw {
        if b.is_ascii_alphanumeric() || kept.contains(&b) {
            out.push(b as char);
        } else if b == b' ' && plus_for_space {
            out.push('+');
        } else if lower {
            out.push_str(&format!("%{b:02x}"));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The URL-safe alphabet's spelling of standard base64.
fn url_safe(std: &str) -> String {
    std.replace('+', "-").replace('/', "_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    enum Input {
        Text(String),
        Value(Value),
    }

    fn b64(b: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(b)
    }

    /// Redacts `input` of `secret`; the result must equal `expected`, and must not hold the
    /// secret's raw form anywhere unless `expected` holds it too.
    fn check(secret: &str, input: Input, expected: Input) {
        let r = Redactor::new(&[secret.to_string()]);
        match (input, expected) {
            (Input::Text(t), Input::Text(e)) => {
                let got = r.text(&t);
                assert_eq!(got, e, "text of {t:?}");
                assert_eq!(r.bytes(t.clone().into_bytes()), e.as_bytes(), "bytes of {t:?}");
            }
            (Input::Value(v), Input::Value(e)) => {
                let got = r.value(v.clone());
                assert_eq!(got, e, "value {v}");
                let shown = got.to_string();
                assert!(e.to_string().contains(secret) || !shown.contains(secret), "{shown} holds {secret:?}");
            }
            _ => panic!("input and expected must be of one kind"),
        }
    }

    fn text(s: &str) -> Input {
        Input::Text(s.to_string())
    }

    /// The base64 of `plain` with its characters `from..to` redacted.
    fn around(plain: &[u8], from: usize, to: usize) -> Input {
        let e = b64(plain);
        Input::Text(format!("{}[redacted]{}", &e[..from], &e[to..]))
    }

    #[test]
    fn a_query_credential_is_redacted_as_the_http_binding_encodes_it() {
        // The binding places a query credential with `append_pair`, which form-encodes: `~` as
        // `%7E`, `*` as it is, a space as `+`.
        for secret in ["tok~en-SECRET-99", "a*b c~d/e", "plain-secret-value"] {
            let mut url = reqwest::Url::parse("http://127.0.0.1:1/raw/x").unwrap();
            url.query_pairs_mut().append_pair("k", secret);
            let line = format!("GET {url} answered 500");
            let redacted = Redactor::new(&[secret.to_string()]).text(&line);
            assert_eq!(redacted, "GET http://127.0.0.1:1/raw/x?k=[redacted] answered 500", "{secret}: {url}");
        }
    }

    #[test]
    fn a_secret_echoed_with_escaped_slashes_or_read_as_latin_1_is_redacted() {
        let slashed = "abc/def/ghi/jkl";
        let r = Redactor::new(&[slashed.to_string()]);
        assert_eq!(r.text(r#"{"auth":"Bearer abc\/def\/ghi\/jkl"}"#), r#"{"auth":"Bearer [redacted]"}"#);
        let accented = "k+y/v=1&z%20 \u{fc}-key";
        let r = Redactor::new(&[accented.to_string()]);
        let latin_1: String = accented.bytes().map(char::from).collect();
        assert_eq!(r.text(&format!("Bearer {latin_1}")), "Bearer [redacted]");
        // Every character escaped, in text that is not JSON (a broken body), hex in either case.
        let escaped: String = slashed.chars().map(|c| format!("\\u{:04X}", c as u32)).collect();
        let r = Redactor::new(&[slashed.to_string()]);
        assert_eq!(r.text(&format!("broken \"{escaped}")), "broken \"[redacted]");
    }

    #[test]
    fn every_form_of_a_secret_is_redacted() {
        let q = r#"pa"ss\word-42"#;
        let tricky_json = serde_json::to_string(q).unwrap();
        let tricky_escaped = &tricky_json[1..tricky_json.len() - 1];
        let cases: Vec<(&str, Input, Input)> = vec![
            ("hunter2-secret", text("token=hunter2-secret; ok"), text("token=[redacted]; ok")),
            // In a value the string is unescaped: the raw form, even with quotes and backslashes.
            (q, Input::Value(json!({"echo": format!("got {q}")})), Input::Value(json!({"echo": "got [redacted]"}))),
            // In text (a body that is JSON, say) it is escaped.
            (q, text(&format!(r#"{{"echo":"{tricky_escaped}"}}"#)), text(r#"{"echo":"[redacted]"}"#)),
            // A secret that looks like JSON leaves the value's structure whole.
            (
                r#"{"a":1}-secret"#,
                Input::Value(json!({"x": r#"{"a":1}-secret"#, "y": [1, 2]})),
                Input::Value(json!({"x": "[redacted]", "y": [1, 2]})),
            ),
            (
                r#"{"a":1}-secret"#,
                text(r#"{"x":"{\"a\":1}-secret","y":[1,2]}"#),
                text(r#"{"x":"[redacted]","y":[1,2]}"#),
            ),
            // URL-encoded in a query string.
            (
                "s3cr3t/with space&more",
                text("GET /x?k=s3cr3t%2Fwith%20space%26more&z=1"),
                text("GET /x?k=[redacted]&z=1"),
            ),
            ("s3cr3t/with space&more", text("k=s3cr3t%2fwith+space%26more"), text("k=[redacted]")),
            // `echo $S | base64`: the trailing newline shifts the last group.
            (
                "correct-horse-battery",
                text(&b64(b"correct-horse-battery\n")),
                around(b"correct-horse-battery\n", 0, 28),
            ),
            // base64 of the secret after a prefix of each length modulo 3.
            (
                "correct-horse-battery",
                text(&b64(b"x:correct-horse-battery")),
                around(b"x:correct-horse-battery", 3, 30),
            ),
            (
                "correct-horse-battery",
                text(&b64(b"user:correct-horse-battery")),
                around(b"user:correct-horse-battery", 7, 34),
            ),
            (
                "correct-horse-battery",
                text(&b64(b"Bearer correct-horse-battery ok")),
                around(b"Bearer correct-horse-battery ok", 10, 37),
            ),
            // Whole base64, standard and URL-safe.
            ("??>>secret<<??", text(&format!("a {} b", b64(b"??>>secret<<??"))), text("a [redacted] b")),
            ("??>>secret<<??", text(&format!("a {} b", url_safe(&b64(b"??>>secret<<??")))), text("a [redacted] b")),
            // Hex, both cases.
            ("hexsecret", text("6865787365637265740a"), text("[redacted]0a")),
            ("??>>secret<<??", text("x=3F3F3E3E7365637265743C3C3F3F."), text("x=[redacted].")),
            // base32, whole (`base32`, lower case too), and after a prefix of each length modulo 5.
            ("Sup3r-s3cret/V4lue+x", text("KN2XAM3SFVZTGY3SMV2C6VRUNR2WKK3Y"), text("[redacted]")),
            ("Sup3r-s3cret/V4lue+x", text("kn2xam3sfvztgy3smv2c6vrunr2wkk3y"), text("[redacted]")),
            ("hunter2-secret", text("NB2W45DFOIZC243FMNZGK5AK"), text("[redacted]AK")),
            ("hunter2-secret", text("PA5GQ5LOORSXEMRNONSWG4TFOQ======"), text("PA5G[redacted]Q======")),
            ("hunter2-secret", text("OVZWK4R2NB2W45DFOIZC243FMNZGK5A="), text("OVZWK4R2[redacted]A=")),
            // Key names and nested arrays.
            (
                "key-secret-99",
                Input::Value(json!({"key-secret-99": {"list": [["a key-secret-99 b"], 5, null]}})),
                Input::Value(json!({"[redacted]": {"list": [["a [redacted] b"], 5, null]}})),
            ),
            // A numeric secret in a number.
            (
                "1234567890",
                Input::Value(json!({"n": 1234567890, "m": 7})),
                Input::Value(json!({"n": "[redacted]", "m": 7})),
            ),
            // Non-ASCII, escaped as \u by other serializers.
            ("pässwörd-1", text(r#"{"p":"p\u00e4ssw\u00f6rd-1"}"#), text(r#"{"p":"[redacted]"}"#)),
            // Any ASCII case, raw and encoded.
            ("hunter2-Secret", text("TOKEN=HUNTER2-SECRET; ok"), text("TOKEN=[redacted]; ok")),
            ("hunter2-Secret", text("t=hunter2-secret"), text("t=[redacted]")),
            ("??>>secret<<??", text("x=3f3f3e3e7365637265743c3c3f3f."), text("x=[redacted].")),
            // Reversed, by character (`rev`), and a reversed encoding.
            ("hunter2-secret", text("out: terces-2retnuh\n"), text("out: [redacted]\n")),
            ("pässwörd-1", text("1-dröwssäp"), text("[redacted]")),
            ("hexsecret", text(&hex::encode("tercesxeh")), text("[redacted]")),
            // Spelled out one character at a time.
            ("hunter2-secret", text("h u n t e r 2 - s e c r e t "), text("[redacted] ")),
            ("hunter2-secret", text("h\nu\nn\nt\ne\nr\n2\n-\ns\ne\nc\nr\ne\nt\n"), text("[redacted]\n")),
            ("hunter2-secret", text("H,U,N,T,E,R,2,-,S,E,C,R,E,T"), text("[redacted]")),
            // Nothing to redact: untouched, whatever the case.
            ("not-here-secret", text("plain text"), text("plain text")),
            ("not-here-secret", text("NOT-HERE-SECRE"), text("NOT-HERE-SECRE")),
        ];
        for (secret, input, expected) in cases {
            check(secret, input, expected);
        }
    }

    #[test]
    fn base32_is_rfc_4648() {
        for (raw, enc) in [
            ("", ""),
            ("f", "MY"),
            ("fo", "MZXQ"),
            ("foo", "MZXW6"),
            ("foob", "MZXW6YQ"),
            ("fooba", "MZXW6YTB"),
            ("foobar", "MZXW6YTBOI"),
        ] {
            assert_eq!(base32(raw.as_bytes()), enc, "{raw:?}");
        }
    }

    /// Regression: a service answering in UTF-16 with the credential echoed handed it back
    /// readable, one NUL between its characters.
    #[test]
    fn a_secret_echoed_in_utf16_is_redacted() {
        let secret = "S3cr3tV4lue-XYZ-123";
        let r = Redactor::new(&[secret.to_string()]);
        for big_endian in [false, true] {
            let body: Vec<u8> = format!("{{\"auth\": \"Bearer {secret}\"}}")
                .encode_utf16()
                .flat_map(|u| if big_endian { u.to_be_bytes() } else { u.to_le_bytes() })
                .collect();
            let out = r.bytes(body);
            let readable: String = out.iter().filter(|b| **b != 0).map(|b| *b as char).collect();
            assert!(!readable.contains(secret), "big endian {big_endian}: {readable}");
            assert!(readable.contains("[redacted]"), "big endian {big_endian}: {readable}");
        }
    }

    #[test]
    fn no_secrets_redact_nothing() {
        let r = Redactor::new(&[String::new()]);
        assert!(r.is_empty());
        assert_eq!(r.text("anything"), "anything");
        assert!(!Redactor::new(&["long-enough".to_string()]).is_empty());
    }
}
