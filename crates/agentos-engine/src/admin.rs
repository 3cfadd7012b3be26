//! Principals and secrets: agents with capability flags, their tokens (kept as hashes), revocation,
//! secrets encrypted at rest with a key outside the log, the audit trail, and the per-principal
//! limit on invocations in flight.

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};

use agentos_core::event::{
    EventBody, EventView, GrantTarget, PrincipalKind, PrincipalRecord, SecretGrant, SecretRecord,
};
use agentos_core::flags::{Flag, Flags};
use agentos_core::name::{check_model_name, check_tool_id, is_valid_id, shown};
use agentos_core::net::valid_credential;
use agentos_core::{CoreError, DEFAULT_MODEL, sha256_hex};

use agentos_core::decide::{
    decide_create_principal, decide_model_grant, decide_revoke_principal, decide_revoke_secret_grant,
    decide_secret_grant,
};

use crate::access::operator_only;
pub use crate::outbound::origin_of;
use crate::principal::new_token;
use crate::redact::{MIN_SECRET_BYTES, Redactor};
use std::path::Path;
use std::sync::Arc;

use agentos_store::StoreError;

use crate::slots::SlotGuard;
use crate::{EngineError, Principal, Principals};

/// A principal as listed: never its token or the token's hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrincipalView {
    pub name: String,
    pub kind: String,
    pub flags: String,
    pub model: String,
    /// Models the operator granted besides the home model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub granted: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretView {
    pub name: String,
    pub updated_at: String,
}

/// One use for a secret: a pinned tool or an origin, optionally only in one model.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretGrantRequest {
    #[serde(default)]
    pub secret: String,
    /// A pinned tool, resolved in `model` (or the global catalog) when granted.
    #[serde(default)]
    pub tool: Option<String>,
    /// `scheme://host[:port]`: the secret may go in headers of requests to this origin.
    #[serde(default)]
    pub origin: Option<String>,
    /// Only in this model.
    #[serde(default)]
    pub model: Option<String>,
}

/// `https://Host:443/x` -> `https://host`: the form origins are compared in.
pub fn normalize_origin(s: &str) -> Result<String, CoreError> {
    let bad = |why: &str| {
        CoreError::bad_input(
            "invalid_origin",
            format!("origin {} {why}: use scheme://host[:port], e.g. https://api.example.com", shown(s)),
        )
    };
    let url = reqwest::Url::parse(s).map_err(|_| bad("is not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("must be http or https"));
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err(bad("must have no path, query or user"));
    }
    if url.port() == Some(0) {
        return Err(bad("names port 0, which no request goes to"));
    }
    // A name made of labels, as requests resolve it: `*` or `.` would be kept as written and
    // match nothing (no wildcards: each origin is granted by itself).
    let host = url.host_str().unwrap_or("");
    let ip = host.starts_with('[') || host.parse::<std::net::Ipv4Addr>().is_ok();
    let labels =
        host.strip_suffix('.').unwrap_or(host).split('.').all(|label| {
            !label.is_empty() && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !ip && !labels {
        return Err(bad("has no valid host name (no wildcards: grant each origin by itself)"));
    }
    crate::outbound::origin_of(&url).ok_or_else(|| bad("has no host"))
}

fn cipher(key: &[u8; 32]) -> XChaCha20Poly1305 {
    XChaCha20Poly1305::new(key.into())
}

/// `msg` sealed with the secrets key, bound to `aad`: a fresh nonce, then the ciphertext.
pub(crate) fn seal(key: &[u8; 32], aad: &[u8], msg: &[u8]) -> Result<Vec<u8>, CoreError> {
    let mut nonce = [0u8; 24];
    getrandom::fill(&mut nonce).map_err(|e| CoreError::internal(format!("no randomness: {e}")))?;
    let ct = cipher(key)
        .encrypt(&XNonce::from(nonce), Payload { msg, aad })
        .map_err(|_| CoreError::internal("encryption failed"))?;
    Ok([nonce.as_slice(), &ct].concat())
}

/// What [`seal`] sealed, or `None` when it was sealed with another key, for another `aad`, or
/// changed since.
pub(crate) fn unseal(key: &[u8; 32], aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
    let (nonce, ct) = sealed.split_at_checked(24)?;
    let nonce: [u8; 24] = nonce.try_into().ok()?;
    cipher(key).decrypt(&XNonce::from(nonce), Payload { msg: ct, aad }).ok()
}

/// Which events a reader of the log wants; each field given must match.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// The principal's name.
    pub principal: Option<String>,
    pub model: Option<String>,
    /// The event's type (`ToolRegistered`, `Net`, `JobFinished`, …).
    pub kind: Option<String>,
}

impl EventFilter {
    fn matches(&self, e: &agentos_store::NewEvent) -> bool {
        let is = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        is(&self.principal, &e.principal) && is(&self.model, &e.model) && is(&self.kind, &e.kind)
    }
}

impl Principals<'_> {
    /// Creates an agent with a home model and capability flags; answers its token, shown once.
    pub async fn create_agent(
        &self,
        p: &Principal,
        name: &str,
        flags: &str,
        model: Option<&str>,
    ) -> Result<(PrincipalView, String), EngineError> {
        operator_only(p, "create agents")?;
        if !is_valid_id(name) || name == "operator" || name == "system" {
            return Err(CoreError::bad_input(
                "invalid_name",
                format!("agent name {}: use a-z, 0-9 and '-', at most 64 (not operator or system)", shown(name)),
            )
            .into());
        }
        let parsed: Flags = flags.parse()?;
        let model = model.unwrap_or(name).to_string();
        check_model_name(&model)?;
        let token = new_token().map_err(|e| CoreError::internal(format!("no randomness for a token: {e}")))?;
        let record = PrincipalRecord {
            id: crate::principal::new_principal_id()
                .map_err(|e| CoreError::internal(format!("no randomness for an id: {e}")))?,
            name: name.to_string(),
            kind: PrincipalKind::Agent,
            flags: parsed.to_string(),
            home_model: model.clone(),
            token_sha256: sha256_hex(token.as_bytes()),
        };
        let view = PrincipalView {
            name: name.to_string(),
            kind: "agent".into(),
            flags: parsed.to_string(),
            model,
            granted: Vec::new(),
        };
        self.submit(&p.name, Box::new(move |st| decide_create_principal(st, &record))).await?;
        Ok((view, token))
    }

    pub fn list_principals(&self, p: &Principal) -> Result<Vec<PrincipalView>, EngineError> {
        operator_only(p, "list principals")?;
        let st = self.read_state();
        Ok(st
            .principals
            .values()
            .map(|r| PrincipalView {
                granted: st.model_grants.get(&r.id).map(|m| m.iter().cloned().collect()).unwrap_or_default(),
                name: r.name.clone(),
                kind: match r.kind {
                    PrincipalKind::Operator => "operator",
                    PrincipalKind::Agent => "agent",
                    PrincipalKind::Executor => "executor",
                }
                .into(),
                flags: if r.kind == PrincipalKind::Operator { Flags::all().to_string() } else { r.flags.clone() },
                model: r.home_model.clone(),
            })
            .collect())
    }

    /// Revokes an agent or executor credential: its token stops working at once.
    pub async fn revoke(&self, p: &Principal, name: &str) -> Result<(), EngineError> {
        operator_only(p, "revoke principals")?;
        let n = name.to_string();
        self.submit(&p.name, Box::new(move |st| decide_revoke_principal(st, &n))).await?;
        Ok(())
    }

    /// Sets a secret, encrypted before it reaches the log.
    pub async fn set_secret(&self, p: &Principal, name: &str, value: &str) -> Result<(), EngineError> {
        operator_only(p, "set secrets")?;
        if !valid_credential(name) {
            return Err(CoreError::bad_input(
                "invalid_name",
                format!("secret name {}: use A-Z, a-z, 0-9, '_' and '-'", shown(name)),
            )
            .into());
        }
        if value.len() < MIN_SECRET_BYTES || value.len() > 64 * 1024 {
            return Err(CoreError::bad_input(
                "invalid_secret",
                format!("a secret value is at least {MIN_SECRET_BYTES} bytes and at most 64 KiB"),
            )
            .into());
        }
        // A secret reaches a script and a container as an environment variable, which cannot
        // hold a NUL byte: the engine's refusal would quote the value back.
        if value.contains('\0') {
            return Err(CoreError::bad_input(
                "invalid_secret",
                "a secret value cannot hold a NUL byte (it is passed in environment variables)",
            )
            .into());
        }
        let key =
            self.inner.principals.secret_key.ok_or_else(|| CoreError::internal("this master has no secret key"))?;
        let mut nonce = [0u8; 24];
        getrandom::fill(&mut nonce).map_err(|e| CoreError::internal(format!("no randomness: {e}")))?;
        let ciphertext = cipher(&key)
            .encrypt(&XNonce::from(nonce), Payload { msg: value.as_bytes(), aad: name.as_bytes() })
            .map_err(|_| CoreError::internal("encryption failed"))?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let record =
            SecretRecord { name: name.to_string(), nonce: b64.encode(nonce), ciphertext: b64.encode(ciphertext) };
        self.submit(
            &p.name,
            Box::new(move |_| Ok(vec![(DEFAULT_MODEL.to_string(), EventBody::SecretSet(record.clone()))])),
        )
        .await?;
        Ok(())
    }

    pub fn list_secrets(&self, p: &Principal) -> Result<Vec<SecretView>, EngineError> {
        operator_only(p, "list secrets")?;
        Ok(self
            .read_state()
            .secrets
            .iter()
            .map(|(n, (_, t))| SecretView { name: n.clone(), updated_at: agentos_core::event::format_time(*t) })
            .collect())
    }

    /// A secret's value, for the master's own use only.
    pub(crate) fn secret(&self, name: &str) -> Option<String> {
        let key = self.inner.principals.secret_key?;
        let (rec, _) = self.read_state().secrets.get(name).cloned()?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let nonce = b64.decode(&rec.nonce).ok()?;
        let ct = b64.decode(&rec.ciphertext).ok()?;
        let nonce: [u8; 24] = nonce.try_into().ok()?;
        let plain = cipher(&key).decrypt(&XNonce::from(nonce), Payload { msg: &ct, aad: name.as_bytes() }).ok()?;
        String::from_utf8(plain).ok()
    }

    /// Every secret's value, to strip them from what a tool answers.
    pub(crate) fn secret_values(&self) -> Vec<String> {
        let names: Vec<String> = self.read_state().secrets.keys().cloned().collect();
        names.iter().filter_map(|n| self.secret(n)).collect()
    }

    /// A redactor of every secret in the store and of `extra` (a credential a job carried, which
    /// may have been deleted from the store since). The store's part is built once per change of
    /// the store, not once per answer: with ten secrets a build costs about a millisecond.
    pub(crate) fn redactor(&self, extra: &[String]) -> Arc<Redactor> {
        let cache = &self.inner.principals.redactor;
        let cached = {
            let st = self.read_state();
            let held = cache.lock().unwrap_or_else(|e| e.into_inner());
            held.as_ref()
                .filter(|c| {
                    c.key.len() == st.secrets.len()
                        && c.key
                            .iter()
                            .zip(&st.secrets)
                            .all(|((n, nonce), (name, (rec, _)))| n == name && *nonce == rec.nonce)
                })
                .cloned()
        };
        let store = match cached {
            Some(c) => c,
            None => {
                let key: Vec<(String, String)> =
                    self.read_state().secrets.iter().map(|(n, (rec, _))| (n.clone(), rec.nonce.clone())).collect();
                let values = self.secret_values();
                let built = Arc::new(CachedRedactor { redactor: Arc::new(Redactor::new(&values)), key, values });
                *cache.lock().unwrap_or_else(|e| e.into_inner()) = Some(built.clone());
                built
            }
        };
        if extra.iter().all(|v| v.is_empty() || store.values.contains(v)) {
            return store.redactor.clone();
        }
        let mut all = store.values.clone();
        all.extend(extra.iter().cloned());
        Arc::new(Redactor::new(&all))
    }

    /// Lets an agent act in `model` besides its home model. The operator only; an event.
    pub async fn grant_model(&self, p: &Principal, name: &str, model: &str, grant: bool) -> Result<(), EngineError> {
        operator_only(p, if grant { "grant models" } else { "revoke model grants" })?;
        check_model_name(model)?;
        let (n, m) = (name.to_string(), model.to_string());
        self.submit(&p.name, Box::new(move |st| decide_model_grant(st, &n, &m, grant))).await?;
        Ok(())
    }

    /// Grants a secret to one pinned tool (resolved now; a changed pin loses the grant) or to
    /// requests for one origin, optionally only in one model. The operator only; an event.
    pub async fn grant_secret(&self, p: &Principal, req: SecretGrantRequest) -> Result<SecretGrant, EngineError> {
        operator_only(p, "grant secrets")?;
        if let Some(m) = &req.model {
            check_model_name(m)?;
        }
        let to = match (&req.tool, &req.origin) {
            (Some(tool), None) => {
                check_tool_id(tool)?;
                let model = req.model.clone().unwrap_or_else(|| DEFAULT_MODEL.to_string());
                let st = self.read_state();
                let (e, _) = st.resolve(&model, tool).ok_or_else(|| {
                    CoreError::not_found(format!(
                        "no tool {} in model {} nor in the global catalog",
                        shown(tool),
                        shown(&model)
                    ))
                })?;
                let kind = e.entry.binding.kind();
                let Some(sha256) = crate::bindings::binder(kind).and_then(|b| b.secret_pin(&e.entry.binding)) else {
                    return Err(CoreError::bad_input(
                        "not_pinned",
                        format!(
                            "{} is a {} tool; secrets are granted to pinned tools (scripts) or to origins",
                            shown(tool),
                            kind.as_str()
                        ),
                    )
                    .into());
                };
                GrantTarget::Tool { id: tool.clone(), model: e.model.to_string(), sha256 }
            }
            (None, Some(origin)) => GrantTarget::Origin { origin: normalize_origin(origin)? },
            _ => {
                return Err(CoreError::bad_input(
                    "invalid_grant",
                    "name exactly one use: a tool (--tool ID) or an origin (--origin https://host[:port])",
                )
                .into());
            }
        };
        let grant = SecretGrant::new(&req.secret, to, req.model.clone());
        let g = grant.clone();
        self.submit(&p.name, Box::new(move |st| decide_secret_grant(st, &g))).await?;
        Ok(grant)
    }

    pub fn secret_grants(&self, p: &Principal) -> Result<Vec<SecretGrant>, EngineError> {
        operator_only(p, "list secret grants")?;
        Ok(self.read_state().secret_grants.values().cloned().collect())
    }

    pub async fn revoke_secret_grant(&self, p: &Principal, id: &str) -> Result<(), EngineError> {
        operator_only(p, "revoke secret grants")?;
        let id = id.to_string();
        self.submit(&p.name, Box::new(move |st| decide_revoke_secret_grant(st, &id))).await?;
        Ok(())
    }

    /// Names of secrets set before values had a minimum length and shorter than it.
    pub fn short_secrets(&self) -> Vec<String> {
        let names: Vec<String> = self.read_state().secrets.keys().cloned().collect();
        names.into_iter().filter(|n| self.secret(n).is_some_and(|v| v.len() < MIN_SECRET_BYTES)).collect()
    }

    /// Events, oldest first, for the audit trail. Needs `l`.
    pub async fn events(
        &self,
        p: &Principal,
        after: u64,
        limit: usize,
        filter: &EventFilter,
    ) -> Result<Vec<EventView>, EngineError> {
        if !p.flags.has(Flag::Logs) {
            return Err(CoreError::forbidden(format!(
                "{} may not read the event log: that needs the 'l' (logs) flag",
                p.name
            ))
            .into());
        }
        // SQLite keeps sequence numbers as i64: a larger `after` wrapped round to the start.
        if after > i64::MAX as u64 {
            return Err(CoreError::bad_input("invalid_after", format!("after must be at most {}", i64::MAX)).into());
        }
        // A limit over the page size is refused, as 0 is, rather than cut quietly: a reader that
        // asked for everything would take the first 1000 for all.
        if !(1..=1000).contains(&limit) {
            return Err(CoreError::bad_input("invalid_limit", "limit must be between 1 and 1000").into());
        }
        // A type that no event has matches nothing: a mistyped one (`ToolRegister`) would read
        // as a log without such events.
        if let Some(kind) = filter.kind.as_deref()
            && !EventBody::TYPE_NAMES.contains(&kind)
        {
            return Err(CoreError::bad_input(
                "invalid_type",
                format!("no event type {}: the types are {}", shown(kind), EventBody::TYPE_NAMES.join(", ")),
            )
            .into());
        }
        let mut out = Vec::new();
        let mut cursor = after;
        // Bounded scan: a filter that matches rarely still answers quickly.
        for _ in 0..100 {
            let page = self.inner.ledger.log.read_after(cursor, 1000).await?;
            let Some(last) = page.last() else { break };
            cursor = last.seq;
            for rec in page {
                if self.inner.ledger.skipped.contains(&rec.seq) {
                    continue;
                }
                if !filter.matches(&rec.event) {
                    continue;
                }
                // An agent reads the events of the models it may act in; the rest of the log
                // (other models' tokens, principals, secrets) is the operator's.
                if !p.is_operator() && !crate::access::may_use_model(&self.read_state(), p, &rec.event.model) {
                    continue;
                }
                out.push(crate::records::to_event(rec)?.view());
                if out.len() >= limit {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// Takes one of the caller's invocation slots, or refuses when all are in use.
    pub fn invocation_slot(&self, p: &Principal) -> Result<SlotGuard, EngineError> {
        Ok(crate::slots::Slots::take(&self.inner.principals.slots, &p.name)?)
    }
}

/// Loads the secret key of a data folder, creating it (mode 0600) on first start.
pub fn load_or_create_secret_key(path: &std::path::Path) -> std::io::Result<[u8; 32]> {
    if let Ok(bytes) = std::fs::read(path) {
        return bytes.try_into().map_err(|_| std::io::Error::other(format!("{} is not a 32-byte key", path.display())));
    }
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| std::io::Error::other(e.to_string()))?;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.write_all(&key)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(key)
}

impl Principals<'_> {
    /// Makes sure an operator exists and its token is in `token_file` (mode 0600). A missing
    /// file means the token is lost, so a new one replaces it; but on a log other masters share,
    /// the token lives in the file of the master that made it, and replacing it would lock
    /// every other master's operator out, so it is left alone. Returns true when a token was
    /// written.
    pub async fn ensure_operator(&self, token_file: &Path) -> Result<bool, EngineError> {
        let has_operator = self.read_state().principals.contains_key("operator");
        if has_operator && token_file.exists() {
            return Ok(false);
        }
        if has_operator && self.inner.ledger.log.shared() {
            tracing::warn!(
                file = %token_file.display(),
                "the shared log already has an operator, whose token this master does not hold: copy operator.token from the master that made it, or use an agent's token"
            );
            return Ok(false);
        }
        let token = new_token().map_err(|e| CoreError::internal(format!("no randomness for a token: {e}")))?;
        write_secret_file(token_file, &token)
            .map_err(|e| StoreError::io(format!("writing {}", token_file.display()), e))?;
        let record = PrincipalRecord {
            id: agentos_core::event::OPERATOR_ID.into(),
            name: "operator".into(),
            kind: PrincipalKind::Operator,
            flags: Flags::all().to_string(),
            home_model: DEFAULT_MODEL.into(),
            token_sha256: sha256_hex(token.as_bytes()),
        };
        self.submit(
            "system",
            Box::new(move |_| Ok(vec![(DEFAULT_MODEL.to_string(), EventBody::PrincipalCreated(record.clone()))])),
        )
        .await?;
        Ok(true)
    }
}

fn write_secret_file(path: &Path, content: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("secret")));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.write_all(content.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// The redactor of the secret store's values, with what it was built from.
pub(crate) struct CachedRedactor {
    /// Each secret's name and nonce: a new value always comes with a new nonce.
    key: Vec<(String, String)>,
    values: Vec<String>,
    redactor: Arc<Redactor>,
}

#[cfg(test)]
mod tests {
    use super::normalize_origin;

    #[test]
    fn an_origin_is_a_host_with_an_optional_port() {
        assert_eq!(normalize_origin("https://API.example.com:443").unwrap(), "https://api.example.com");
        assert_eq!(normalize_origin("http://127.0.0.1:8080").unwrap(), "http://127.0.0.1:8080");
        assert_eq!(normalize_origin("http://[::1]:9").unwrap(), "http://[::1]:9");
        for (origin, why) in [
            ("http://*", "no valid host name"),
            ("http://*.example.com", "no valid host name"),
            ("http://.", "no valid host name"),
            ("http://a..b", "no valid host name"),
            ("http://x:0", "port 0"),
            ("https://example.com/v1", "no path"),
            ("ftp://example.com", "http or https"),
        ] {
            let e = normalize_origin(origin).unwrap_err();
            assert!(e.message.contains(why), "{origin}: {}", e.message);
        }
    }
}
