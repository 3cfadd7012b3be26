//! Blob URNs: `urn:agentos:blob:<namespace>/<sha256>[.<ext>]`.

use std::fmt;
use std::str::FromStr;

use crate::CoreError;
use crate::name::shown;

const PREFIX: &str = "urn:agentos:blob:";

/// The name of one immutable blob. Its identity is the namespace and the sha256; the
/// extension is a hint for whoever materializes the bytes as a file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlobUrn {
    namespace: String,
    sha256: String,
    ext: Option<String>,
}

fn valid_segment(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn valid_namespace(ns: &str) -> bool {
    let segments: Vec<&str> = ns.split('/').collect();
    !ns.is_empty() && segments.len() <= 4 && segments.iter().all(|s| valid_segment(s))
}

fn valid_sha(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

fn valid_ext(s: &str) -> bool {
    !s.is_empty() && s.len() <= 8 && s.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

impl BlobUrn {
    pub fn new(namespace: &str, sha256: &str, ext: Option<&str>) -> Result<Self, CoreError> {
        if !valid_namespace(namespace) {
            return Err(bad(format!("namespace {} is not valid", shown(namespace))));
        }
        if !valid_sha(sha256) {
            return Err(bad(format!("{} is not a lower-case hex sha256", shown(sha256))));
        }
        if let Some(e) = ext
            && !valid_ext(e)
        {
            return Err(bad(format!("extension {} is not valid", shown(e))));
        }
        Ok(BlobUrn { namespace: namespace.to_string(), sha256: sha256.to_string(), ext: ext.map(str::to_string) })
    }
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
    pub fn sha256(&self) -> &str {
        &self.sha256
    }
    pub fn ext(&self) -> Option<&str> {
        self.ext.as_deref()
    }
}

fn bad(why: String) -> CoreError {
    CoreError::bad_input(
        "invalid_urn",
        format!(
            "invalid blob URN: {why}; expected urn:agentos:blob:<namespace>/<sha256>[.<ext>], e.g. urn:agentos:blob:tool-catalog/scripts/<64 hex>.sh"
        ),
    )
}

impl FromStr for BlobUrn {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, CoreError> {
        let rest = s.strip_prefix(PREFIX).ok_or_else(|| bad(format!("{} does not start with {PREFIX}", shown(s))))?;
        let (namespace, last) = rest.rsplit_once('/').ok_or_else(|| bad(format!("{} has no namespace", shown(s))))?;
        let (sha, ext) = match last.split_once('.') {
            Some((sha, ext)) => (sha, Some(ext)),
            None => (last, None),
        };
        BlobUrn::new(namespace, sha, ext)
    }
}

impl fmt::Display for BlobUrn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}/{}", self.namespace, self.sha256)?;
        if let Some(e) = &self.ext {
            write!(f, ".{e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "df6ff312a2c0955727f8735dcc93686f684fb8fc3eac8a87288c87f4596af6d1";

    fn check(input: &str, ok: bool) {
        let parsed = input.parse::<BlobUrn>();
        assert_eq!(parsed.is_ok(), ok, "input {input:?}: {parsed:?}");
        if let Ok(urn) = parsed {
            assert_eq!(urn.to_string(), input);
        }
    }

    #[test]
    fn round_trips_and_refuses() {
        check(&format!("urn:agentos:blob:tool-catalog/scripts/{SHA}.cjs"), true);
        check(&format!("urn:agentos:blob:specs/{SHA}"), true);
        check(&format!("urn:agentos:blob:../etc/{SHA}"), false);
        check(&format!("urn:agentos:blob:a//b/{SHA}"), false);
        check(&format!("urn:agentos:blob:/{SHA}"), false);
        check(&format!("urn:agentos:blob:{SHA}"), false);
        check(&format!("urn:agentos:blob:x/{}", &SHA[1..]), false);
        check(&format!("urn:agentos:blob:x/{}", SHA.to_uppercase()), false);
        check(&format!("urn:agentos:blob:x/{SHA}.tar.gz"), false);
        check(&format!("urn:other:blob:x/{SHA}"), false);
        check("", false);
    }
}
