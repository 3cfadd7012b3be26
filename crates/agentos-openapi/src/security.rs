//! The security schemes a document declares: what credential a registration's `auth` must match.

use serde_json::Value;

use crate::pointer;
use crate::{Location, SecurityKind, SecurityScheme};

/// Every scheme under `components.securitySchemes`, in name order. A scheme given by `$ref` is
/// followed; one that is not an object is left out.
pub(crate) fn schemes(doc: &Value) -> Vec<SecurityScheme> {
    let Some(map) = doc.pointer("/components/securitySchemes").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut out: Vec<SecurityScheme> = map
        .iter()
        .filter_map(|(name, s)| {
            let s = match s.get("$ref").and_then(Value::as_str) {
                Some(r) => pointer::resolve(doc, r)?,
                None => s,
            };
            let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("");
            let kind = match text("type") {
                "http" => match text("scheme").to_ascii_lowercase().as_str() {
                    "bearer" => SecurityKind::Bearer,
                    "basic" => SecurityKind::Basic,
                    other => SecurityKind::Http { scheme: other.to_string() },
                },
                "apiKey" => {
                    let location = match text("in") {
                        "query" => Location::Query,
                        "cookie" => Location::Cookie,
                        _ => Location::Header,
                    };
                    SecurityKind::ApiKey { location, name: text("name").to_string() }
                }
                "oauth2" => SecurityKind::OAuth2,
                "openIdConnect" => SecurityKind::OpenIdConnect,
                "mutualTLS" => SecurityKind::MutualTls,
                other => SecurityKind::Unknown { declared: other.to_string() },
            };
            Some(SecurityScheme { name: name.clone(), kind })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
