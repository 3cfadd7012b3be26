//! Bytes inside JSON: a `data:` URL (RFC 2397) with base64 content and an optional file name,
//! `data:image/png;name=cat.png;base64,iVBORw0…`. A binary field of an operation (a file part of
//! a multipart body, a raw binary body) takes one to send bytes rather than text; the shell
//! command's `--FLAG-file PATH` writes one from the file.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::pointer::percent_decode;

/// Marks a flag value that the shell command read from a file: a NUL, which no command-line
/// argument can hold, `file:`, the path as given, another NUL, then the file as a data URL (or
/// `!` and why it could not be read). The flag parser turns it into the flag's value: the text,
/// the data URL itself for a binary field, or the path when `--x-file` is a flag of its own.
pub const FILE_MARK: &str = "\0file:";

/// `--x-file PATH` as the shell command sends it: [`FILE_MARK`], the path, the file's content.
pub fn mark_file(path: &str, content: Result<String, String>) -> String {
    match content {
        Ok(url) => format!("{FILE_MARK}{path}\0{url}"),
        Err(why) => format!("{FILE_MARK}{path}\0!{why}"),
    }
}

/// A value [`mark_file`] wrote: the path, and the data URL or why the file could not be read.
pub fn unmark_file(value: &str) -> Option<(&str, Result<&str, &str>)> {
    let (path, content) = value.strip_prefix(FILE_MARK)?.split_once('\0')?;
    Some((path, content.strip_prefix('!').map_or(Ok(content), Err)))
}

/// A decoded `data:` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataUrl {
    /// `application/octet-stream` when the URL names none.
    pub media_type: String,
    /// The file name the URL carries (`name=`), if any.
    pub name: Option<String>,
    pub bytes: Vec<u8>,
}

impl DataUrl {
    /// The URL of `bytes`, named `name` when given.
    pub fn encode(media_type: &str, name: Option<&str>, bytes: &[u8]) -> String {
        let name = name.map(|n| format!(";name={}", percent_encode(n))).unwrap_or_default();
        format!("data:{media_type}{name};base64,{}", STANDARD.encode(bytes))
    }

    /// The bytes as standard base64, as a `format: byte` string carries them.
    pub fn base64(&self) -> String {
        STANDARD.encode(&self.bytes)
    }

    /// Reads a base64 `data:` URL; `None` for any other text (which is then sent as its own bytes).
    pub fn parse(text: &str) -> Option<DataUrl> {
        let rest = text.strip_prefix("data:")?;
        let (head, data) = rest.split_once(',')?;
        let mut params = head.split(';');
        let media_type = params.next().filter(|m| !m.is_empty()).unwrap_or("application/octet-stream").to_string();
        let mut name = None;
        let mut base64 = false;
        for p in params {
            match p.split_once('=') {
                Some(("name", v)) | Some(("filename", v)) => name = Some(percent_decode(v)?),
                Some(_) => {}
                None if p == "base64" => base64 = true,
                None => return None,
            }
        }
        if !base64 || media_type.contains(['\r', '\n', '"']) {
            return None;
        }
        let bytes = STANDARD.decode(data.trim()).ok()?;
        Some(DataUrl { media_type, name, bytes })
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_file_keeps_its_path_and_its_content_or_why_not() {
        let ok = mark_file("a b.txt", Ok("data:;base64,aGk=".into()));
        assert_eq!(unmark_file(&ok), Some(("a b.txt", Ok("data:;base64,aGk="))));
        let bad = mark_file("gone.txt", Err("no such file".into()));
        assert_eq!(unmark_file(&bad), Some(("gone.txt", Err("no such file"))));
        assert_eq!(unmark_file("gone.txt"), None);
    }

    #[test]
    fn a_data_url_carries_bytes_a_media_type_and_a_file_name_both_ways() {
        let bytes = [0u8, 159, 146, 150, b'\n', b'"'];
        let url = DataUrl::encode("image/png", Some("my cat;1.png"), &bytes);
        assert!(url.starts_with("data:image/png;name=my%20cat%3B1.png;base64,"), "{url}");
        let d = DataUrl::parse(&url).unwrap();
        assert_eq!(
            d,
            DataUrl { media_type: "image/png".into(), name: Some("my cat;1.png".into()), bytes: bytes.to_vec() }
        );
        let bare = DataUrl::parse("data:;base64,aGk=").unwrap();
        assert_eq!(
            (bare.media_type.as_str(), bare.name, bare.bytes),
            ("application/octet-stream", None, b"hi".to_vec())
        );
        // Not base64, not a data URL, or broken: plain text.
        for text in [
            "data:text/plain,hello",
            "hello",
            "data:;base64,***",
            "data:a\r\nb;base64,aGk=",
            "data:;name=%zz;base64,aGk=",
        ] {
            assert_eq!(DataUrl::parse(text), None, "{text}");
        }
    }
}
