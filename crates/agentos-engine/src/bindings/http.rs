//! HTTP services described by an OpenAPI document: every operation of the document is one tool
//! of the entry. Registration imports the document (`agentos_openapi`) and pins it as a blob;
//! a call builds the request with `agentos_openapi::build_request`, adds the credential from
//! the secret store at that moment, and sends it through the outbound policy's client.

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use agentos_core::command::{HeaderFields, Plan, fields};
use agentos_core::entry::{
    Binding, BindingKind, Contract, HttpAuth, HttpAuthKind, HttpBinding, HttpOperation, Operation, Status,
};
use agentos_core::event::GrantTarget;
use agentos_core::flags::Flag;
use agentos_core::urn::BlobUrn;
use agentos_core::{CoreError, DEFAULT_MODEL, ErrorKind, sha256_hex};

use super::{Binder, Call, Outcome, ValueCall, ValueKind};
use crate::outbound::{describe, origin_of};
use crate::{Engine, EngineError, Principal};

/// The blob namespace of OpenAPI documents.
pub const OPENAPI_NAMESPACE: &str = "tool-catalog/openapi";

/// The registration command of HTTP services.
pub const REGISTER_HTTP: &str = "TOOL_CATALOG_REGISTER_HTTP";

/// How long fetching a document by `openapiUrl` may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes of an answer read at most; a longer body fails the call rather than fill the master.
pub(crate) const MAX_ANSWER_BYTES: usize = 32 << 20;

/// Why an answer's body was not read whole.
pub(crate) enum AnswerError {
    /// Past [`MAX_ANSWER_BYTES`]: the rest was not read.
    TooLarge,
    /// The request's timeout ran out while the body came.
    TimedOut,
    Failed(reqwest::Error),
}

/// Reads an answer's body, at most [`MAX_ANSWER_BYTES`] of it: an endless or huge body fails
/// rather than fill the master. reqwest's timeout runs until the body is read, so a slow body
/// times out as well.
pub(crate) async fn read_answer(resp: &mut reqwest::Response) -> Result<Vec<u8>, AnswerError> {
    let mut bytes = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if bytes.len() + c.len() > MAX_ANSWER_BYTES {
                    return Err(AnswerError::TooLarge);
                }
                bytes.extend_from_slice(&c);
            }
            Ok(None) => return Ok(bytes),
            Err(e) if e.is_timeout() => return Err(AnswerError::TimedOut),
            Err(e) => return Err(AnswerError::Failed(e)),
        }
    }
}

/// Characters of a failed answer's body quoted in the error line.
const EXCERPT_CHARS: usize = 200;

/// Answer headers an agent is shown; the rest (cookies, server details) stay out of answers.
const SHOWN_HEADERS: [&str; 17] = [
    "content-length",
    "content-disposition",
    "etag",
    "last-modified",
    "link",
    "location",
    "retry-after",
    "x-request-id",
    "x-total-count",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "ratelimit-policy",
    "ratelimit",
];

pub struct Http;

#[async_trait]
impl Binder for Http {
    fn kind(&self) -> BindingKind {
        BindingKind::Http
    }

    fn register_command(&self) -> Option<&'static str> {
        Some(REGISTER_HTTP)
    }

    fn global_only(&self) -> bool {
        true
    }

    fn registering(&self) -> &'static str {
        "register http services"
    }

    async fn plan(&self, engine: &Engine, _p: &Principal, body: Value) -> Result<Plan, EngineError> {
        let cmd: RegisterHttp = fields(REGISTER_HTTP, body)?;
        cmd.plan(engine).await
    }

    fn pinned_blob<'b>(&self, binding: &'b Binding) -> Option<&'b str> {
        match binding {
            Binding::Http(h) => Some(&h.openapi_urn),
            _ => None,
        }
    }

    async fn invoke(&self, engine: &Engine, call: Call<'_>) -> Result<Outcome, EngineError> {
        let c = KIND.call(call)?;
        Ok(Outcome::Value(call_operation(engine, &c).await?))
    }

    async fn queue(&self, _engine: &Engine, call: Call<'_>) -> Result<String, EngineError> {
        Err(KIND.queue(&call))
    }
}

/// Calling needs `x` and the flag that reveals the kind.
const KIND: ValueKind =
    ValueKind { flag: Flag::Http, plural: "http services", one: "an http service", parts: "operations" };

/// Calls one operation of an http entry with `input` (an object of its input schema), acting in
/// `model`: the request built, the credential added if granted there, the answer
/// `{status, contentType, headers, body}`; a status outside 2xx is an error. Flags are the
/// caller's to check (a shell command's principal, a fire's authority).
pub(crate) async fn call_operation(engine: &Engine, c: &ValueCall<'_>) -> Result<Value, EngineError> {
    let ValueCall { id, model, tool, ref input, timeout_ms, .. } = *c;
    let Binding::Http(b) = &c.entry.entry.binding else {
        return Err(CoreError::bad_input("not_http", format!("{id:?} is not an http service")).into());
    };
    let op = c.op.request().ok_or_else(|| CoreError::internal(format!("{id} {tool}: no request description")))?;
    let request = agentos_openapi::build_request(&b.base_url, op, input)
        .map_err(|e| CoreError::bad_input("usage", e.to_string()))?;
    let cfg = engine.inner.dispatch.config;
    let timeout_ms = timeout_ms.or(b.timeout_ms).unwrap_or(cfg.default_timeout_ms).min(cfg.max_timeout_ms);
    let sent = Sent { engine, id, tool, model, auth: b.auth.as_ref(), via: Via::Outbound, secrets: &[] };
    sent.send(request, Duration::from_millis(timeout_ms)).await
}

/// Sends a built request to a service of the master's own on loopback (a container it runs)
/// through `client`, outside the outbound policy, and answers as for an http service; `secrets`
/// are the values the service was given, kept out of the answer.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn send_local(
    engine: &Engine,
    id: &str,
    tool: &str,
    model: &str,
    request: agentos_openapi::Request,
    timeout: Duration,
    client: &reqwest::Client,
    secrets: &[String],
) -> Result<Value, EngineError> {
    let sent = Sent { engine, id, tool, model, auth: None, via: Via::Local(client), secrets };
    sent.send(request, timeout).await
}

/// How a request leaves the master.
enum Via<'a> {
    /// Through the outbound policy's sealed client.
    Outbound,
    /// Through this client, to the master's own loopback service.
    Local(&'a reqwest::Client),
}

/// One call on its way: what the answer and the errors name.
struct Sent<'a> {
    engine: &'a Engine,
    id: &'a str,
    tool: &'a str,
    model: &'a str,
    auth: Option<&'a HttpAuth>,
    via: Via<'a>,
    /// Values to keep out of the answer besides the secret store's.
    secrets: &'a [String],
}

impl Sent<'_> {
    async fn send(&self, request: agentos_openapi::Request, timeout: Duration) -> Result<Value, EngineError> {
        let (id, tool) = (self.id, self.tool);
        let failed = |kind, code, why: String| -> EngineError {
            CoreError::new(kind, code, format!("{id} {tool}: {why}")).into()
        };
        let mut url = reqwest::Url::parse(&request.url)
            .map_err(|e| failed(ErrorKind::BadInput, "usage", format!("the request URL is not valid: {e}")))?;
        let mut secrets = self.secrets.to_vec();
        let mut headers = request.headers;
        if let Some(auth) = self.auth {
            let value = self.credential(auth, &url)?;
            secrets.push(value.clone());
            place_credential(auth, &value, &mut url, &mut headers)
                .map_err(|why| failed(ErrorKind::BadInput, "usage", why))?;
        }
        let redactor = self.engine.principals().redactor(&secrets);
        let method = reqwest::Method::from_bytes(request.method.as_bytes())
            .map_err(|e| failed(ErrorKind::BadInput, "usage", format!("method {:?}: {e}", request.method)))?;
        // A URL can be as long as the caller's values: an error line names it cut.
        let shown = format!("{method} {}", cut_line(&redactor.text(url.as_str())));
        let client = match self.via {
            Via::Outbound => {
                let policy = &self.engine.inner.nets.outbound;
                policy
                    .check_url(&url)
                    .map_err(|e| failed(ErrorKind::Forbidden, "refused", format!("{shown} refused: {e}")))?;
                // Same-origin redirects only: a credential granted to one origin never reaches
                // another, and another origin's redirect is the answer.
                &self.engine.inner.nets.sealed_http
            }
            Via::Local(c) => c,
        };
        // What `http::Uri` takes: past it the client fails the send with a line about a URI.
        if url.as_str().len() > MAX_URL_BYTES {
            return Err(failed(
                ErrorKind::BadInput,
                "usage",
                format!(
                    "{shown}: the URL is {} bytes, past the {MAX_URL_BYTES} a request carries; shorten the values that go in the path or query",
                    url.as_str().len()
                ),
            ));
        }
        let target = url.clone();
        let mut req = client.request(method, url).timeout(timeout);
        for (k, v) in &headers {
            req = req.header(k.as_str(), v.as_str());
        }
        if let Some(ct) = &request.content_type {
            req = req.header("content-type", ct.as_str());
        }
        if !request.body.is_empty() {
            req = req.body(request.body);
        }
        let mut resp = crate::outbound::sending(&target, req.send()).await.map_err(|e| {
            let why = cut_line(&redactor.text(&describe(&e)));
            if e.is_builder() {
                // Nothing was sent: the request could not be made of the caller's values (a URL
                // past what a request line carries, say). Theirs to mend.
                failed(ErrorKind::BadInput, "usage", format!("{shown} could not be sent: {why}"))
            } else if e.is_timeout() {
                failed(
                    ErrorKind::Unavailable,
                    "timed_out",
                    format!("{shown} timed out after {} ms", timeout.as_millis()),
                )
            } else if let Some(refused) = crate::outbound::refusal_of(&e) {
                // A name that resolves only to refused addresses: refused as the address is.
                failed(ErrorKind::Forbidden, "refused", format!("{shown} refused: {refused}"))
            } else if crate::outbound::service_down(&e) {
                // Down or restarting: the same call may pass in a while, as a timed-out one may.
                failed(
                    ErrorKind::Unavailable,
                    "service_down",
                    format!("{shown} failed: {why}; nothing answers at the service's address now: try again later"),
                )
            } else {
                failed(ErrorKind::ToolFailed, "request_failed", format!("{shown} failed: {why}"))
            }
        })?;
        let status = resp.status().as_u16();
        // Where a redirect that is the answer leads, when that is another origin: the sealed
        // client follows redirects within the origin only.
        let elsewhere = match (&self.via, resp.headers().get("location").and_then(|v| v.to_str().ok())) {
            (Via::Outbound, Some(to)) if (300..400).contains(&status) => {
                resp.url().join(to).ok().filter(|t| origin_of(t) != origin_of(resp.url())).map(|t| t.to_string())
            }
            _ => None,
        };
        // Redacted as the shown headers are: a service may echo the credential in any of them.
        let content_type =
            redactor.text(resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or(""));
        let mut shown_headers = Map::new();
        for name in SHOWN_HEADERS {
            if let Some(v) = resp.headers().get(name).and_then(|v| v.to_str().ok()) {
                shown_headers.insert(name.into(), Value::String(redactor.text(v)));
            }
        }
        // A failure while the body is read still says the status it came with, when that was one.
        let answered = (!(200..300).contains(&status)).then(|| format!(" answered {status}, and"));
        let bytes = match read_answer(&mut resp).await {
            Ok(bytes) => bytes,
            Err(AnswerError::TooLarge) => {
                return Err(failed(
                    ErrorKind::ToolFailed,
                    "answer_too_large",
                    format!(
                        "{shown}{} the answer is over {MAX_ANSWER_BYTES} bytes",
                        answered.as_deref().unwrap_or(":")
                    ),
                ));
            }
            Err(AnswerError::TimedOut) => {
                return Err(failed(
                    ErrorKind::Unavailable,
                    "timed_out",
                    format!(
                        "{shown}{} timed out after {} ms",
                        answered.as_deref().unwrap_or_default(),
                        timeout.as_millis()
                    ),
                ));
            }
            Err(AnswerError::Failed(e)) => {
                let why = redactor.text(&describe(&e));
                return Err(failed(
                    ErrorKind::ToolFailed,
                    "request_failed",
                    format!("{shown}: reading the answer: {why}"),
                ));
            }
        };
        // Defence in depth: a service that echoes the credential does not hand it to the caller.
        // JSON is redacted again once read, for the escapes its writer may use (`\/`, `\u002B`)
        // that the bytes' forms do not know; the bytes are written anew only when that found
        // something, for the error's excerpt and the blob as much as for the inline body.
        let (content_type, mut bytes) = redacted_text(&redactor, content_type, bytes);
        let mut parsed =
            if content_type.contains("json") { serde_json::from_slice::<Value>(&bytes).ok() } else { None };
        if !redactor.is_empty()
            && let Some(v) = parsed.take()
        {
            let clean = redactor.value(v.clone());
            if clean != v {
                bytes = serde_json::to_vec(&clean).unwrap_or(bytes);
            }
            parsed = Some(clean);
        }
        if !(200..300).contains(&status) {
            let text = String::from_utf8_lossy(&bytes);
            // One line, and inert in a terminal: a control character (an escape sequence, a
            // bell) is written out, not passed on.
            let excerpt: String = text
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .chars()
                .take(EXCERPT_CHARS)
                .flat_map(|c| if c.is_control() { c.escape_unicode().collect() } else { vec![c] })
                .collect();
            let tail = if excerpt.is_empty() { String::new() } else { format!(": {excerpt}") };
            // A redirect within the origin was followed; one that is still the answer leads
            // elsewhere, and saying where tells the caller why it stopped.
            let moved = match &elsewhere {
                Some(to) => format!(
                    " (a redirect to {}, not followed: redirects are followed within the origin only)",
                    agentos_core::name::shown(&redactor.text(to))
                ),
                None => String::new(),
            };
            let inline = self.engine.inner.dispatch.config.inline_output_bytes;
            let response = failed_response(status, &content_type, Some(shown_headers), parsed, &bytes, inline);
            let e = CoreError::new(
                ErrorKind::ToolFailed,
                "http_status",
                format!("{id} {tool}: {shown} answered {status}{moved}{tail}"),
            );
            return Err(e.with_response(response).into());
        }
        let mut answer = json!({"status": status, "contentType": content_type, "headers": shown_headers});
        let size = bytes.len();
        match parsed {
            Some(v) if size <= self.engine.inner.dispatch.config.inline_output_bytes => answer["body"] = v,
            _ => {
                // Large answers go to the blob store like script output, readable in the caller's
                // model; so do bytes that are not text (an image, a PDF), which a string would mangle.
                let binary = std::str::from_utf8(&bytes).is_err();
                let (text, blob) = self.engine.dispatch().shape_output_kept(self.model, bytes, binary).await?;
                let text = if binary {
                    let of = if content_type.is_empty() { String::new() } else { format!(" of {content_type}") };
                    format!("{size} bytes{of}, not text: the bytes are in bodyBlob")
                } else {
                    text
                };
                answer["body"] = Value::String(text);
                if let Some(blob) = blob {
                    answer["bodyBlob"] = serde_json::to_value(blob).map_err(|e| CoreError::internal(e.to_string()))?;
                }
            }
        }
        Ok(answer)
    }

    /// The credential's value for a request to `url`, when the operator granted it to the
    /// URL's origin (for the model the call acts in, when the grant is narrowed).
    fn credential(&self, auth: &HttpAuth, url: &reqwest::Url) -> Result<String, EngineError> {
        let origin = origin_of(url).unwrap_or_default();
        if !self.engine.principals().secret_granted_to_origin(&auth.secret, &origin, Some(self.model)) {
            return Err(not_granted(&auth.secret, &origin).into());
        }
        self.engine.principals().secret(&auth.secret).ok_or_else(|| {
            CoreError::new(
                ErrorKind::ToolFailed,
                "secret_missing",
                format!("{} {}: secret {:?} is not set on the master", self.id, self.tool, auth.secret),
            )
            .into()
        })
    }
}

/// An answer's bytes as UTF-8 text when it is text (`text/*`, JSON, XML, JavaScript, a form)
/// whose `charset` names the Western single-byte encoding (`iso-8859-1`, `latin1`,
/// `windows-1252`, `us-ascii` and the other names the WHATWG encoding standard gives it, all
/// read as windows-1252, as browsers read them) and they are not UTF-8 already (a service that
/// says latin1 and sends UTF-8 is common; latin1 text that reads as UTF-8 with characters past
/// ASCII is not): each byte is one character, so the text is whole and exact. Returned with the
/// content type it now has (`charset=utf-8`); any other answer (an image that names a charset,
/// bytes in another one) comes back as it was, with `None`. Without this an old service's
/// `café` in latin1 was "5 bytes, not text".
pub(crate) fn as_utf8_text(content_type: &str, bytes: &[u8]) -> Option<(String, Vec<u8>)> {
    if std::str::from_utf8(bytes).is_ok() {
        return None;
    }
    let params = media_params(content_type);
    let essence = params.first()?.to_ascii_lowercase();
    let text = essence.starts_with("text/")
        || ["json", "xml", "javascript", "x-www-form-urlencoded"].iter().any(|t| essence.ends_with(t));
    let charset = params[1..].iter().find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim().eq_ignore_ascii_case("charset").then(|| v.trim().trim_matches('"').to_ascii_lowercase())
    });
    const WESTERN: [&str; 17] = [
        "ansi_x3.4-1968",
        "ascii",
        "cp1252",
        "cp819",
        "csisolatin1",
        "ibm819",
        "iso-8859-1",
        "iso-ir-100",
        "iso8859-1",
        "iso88591",
        "iso_8859-1",
        "iso_8859-1:1987",
        "l1",
        "latin1",
        "us-ascii",
        "windows-1252",
        "x-cp1252",
    ];
    if !text || !charset.is_some_and(|c| WESTERN.contains(&c.as_str())) {
        return None;
    }
    let decoded: String = bytes.iter().map(|&b| windows_1252(b)).collect();
    let kept =
        params.iter().filter(|p| !p.split_once('=').is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("charset")));
    let content_type = kept.map(String::as_str).chain(["charset=utf-8"]).collect::<Vec<_>>().join("; ");
    Some((content_type, decoded.into_bytes()))
}

/// An answer's bytes redacted, and as UTF-8 text when [`as_utf8_text`] reads them so, redacted
/// again as such: a secret's characters past ASCII read differently in the two.
pub(crate) fn redacted_text(
    redactor: &crate::redact::Redactor,
    content_type: String,
    bytes: Vec<u8>,
) -> (String, Vec<u8>) {
    let bytes = redactor.bytes(bytes);
    match as_utf8_text(&content_type, &bytes) {
        Some((utf8, text)) => (utf8, redactor.bytes(text)),
        None => (content_type, bytes),
    }
}

/// A content type's media type and its parameters, each trimmed, empty ones left out, a `;`
/// inside a quoted value kept in it.
fn media_params(content_type: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut quoted = false;
    let mut escaped = false;
    for c in content_type.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ';' if !quoted => {
                parts.push(String::new());
                continue;
            }
            _ => {}
        }
        parts.last_mut().expect("one at least").push(c);
    }
    parts.into_iter().map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect()
}

/// One byte of windows-1252: latin1, but for the printable characters at 0x80 to 0x9F.
fn windows_1252(b: u8) -> char {
    const HIGH: [char; 32] = [
        '\u{20ac}', '\u{81}', '\u{201a}', '\u{192}', '\u{201e}', '\u{2026}', '\u{2020}', '\u{2021}', '\u{2c6}',
        '\u{2030}', '\u{160}', '\u{2039}', '\u{152}', '\u{8d}', '\u{17d}', '\u{8f}', '\u{90}', '\u{2018}', '\u{2019}',
        '\u{201c}', '\u{201d}', '\u{2022}', '\u{2013}', '\u{2014}', '\u{2dc}', '\u{2122}', '\u{161}', '\u{203a}',
        '\u{153}', '\u{9d}', '\u{17e}', '\u{178}',
    ];
    match b {
        0x80..=0x9f => HIGH[usize::from(b - 0x80)],
        _ => char::from(b),
    }
}

/// What a service answered with a status outside 2xx, as its caller is shown it beside the
/// error line: the success answer's shape, with a body of at most `inline` bytes (a longer
/// one is cut, as text, and says so; bytes that are not text are named, not kept: the answer
/// is an error, and the blob store is for results). A URL action in a net shows no headers.
pub(crate) fn failed_response(
    status: u16,
    content_type: &str,
    headers: Option<Map<String, Value>>,
    parsed: Option<Value>,
    bytes: &[u8],
    inline: usize,
) -> Value {
    // JSON nested as deep as a token may be, at most: wrapped in an error's answer it must still
    // read back wherever it goes (a shim reads 128 levels). Deeper, it goes as its text.
    let body = match parsed.filter(|v| agentos_core::depth::check_token_depth(v).is_ok()) {
        Some(v) if bytes.len() <= inline => v,
        _ => match std::str::from_utf8(bytes) {
            Ok(text) if text.len() <= inline => Value::String(text.to_string()),
            Ok(text) => {
                let mut end = inline;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                Value::String(format!("{}\u{2026} (cut: the answer is {} bytes)", &text[..end], text.len()))
            }
            Err(_) => {
                let of = if content_type.is_empty() { String::new() } else { format!(" of {content_type}") };
                Value::String(format!("{} bytes{of}, not text", bytes.len()))
            }
        },
    };
    let mut response = json!({"status": status, "contentType": content_type, "body": body});
    if let Some(headers) = headers {
        response["headers"] = Value::Object(headers);
    }
    response
}

/// Puts the credential where the auth says, as the one value of its header or parameter: an
/// input of the same name neither replaces it nor goes beside it (a service reading the first
/// value would take the caller's). As for an http action, a request that carries a credential
/// cannot say where it goes (`Host`, `Forwarded`, `X-Forwarded-*`).
fn place_credential(
    auth: &HttpAuth,
    value: &str,
    url: &mut reqwest::Url,
    headers: &mut Vec<(String, String)>,
) -> Result<(), String> {
    if let Some((k, _)) = headers.iter().find(|(k, _)| agentos_openapi::clients_header(k)) {
        return Err(format!("{k} cannot be set on a request that carries a credential"));
    }
    let name = auth.name.clone().unwrap_or_default();
    match auth.kind {
        HttpAuthKind::Query => {
            let kept: Vec<(String, String)> =
                url.query_pairs().filter(|(k, _)| *k != name).map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
            if kept.len() != url.query_pairs().count() {
                url.query_pairs_mut().clear().extend_pairs(kept);
            }
            url.query_pairs_mut().append_pair(&name, value);
        }
        // A cookie credential joins the operation's own cookies rather than replacing them:
        // first, and with any of the caller's cookies of the same names left out, since servers
        // take the first of a name and a caller's would otherwise stand in for the credential.
        HttpAuthKind::Header if name.eq_ignore_ascii_case("cookie") => {
            let names: Vec<&str> = value.split(';').map(|c| c.split_once('=').map_or(c, |(n, _)| n).trim()).collect();
            match headers.iter_mut().find(|(k, _)| k.eq_ignore_ascii_case("cookie")) {
                Some((_, cookies)) => {
                    let kept: Vec<&str> = cookies
                        .split(';')
                        .map(str::trim)
                        .filter(|c| !c.is_empty() && !names.contains(&c.split_once('=').map_or(*c, |(n, _)| n).trim()))
                        .collect();
                    *cookies = std::iter::once(value).chain(kept).collect::<Vec<_>>().join("; ");
                }
                None => headers.push((name, value.to_string())),
            }
        }
        HttpAuthKind::Header => {
            headers.retain(|(k, _)| !k.eq_ignore_ascii_case(&name));
            headers.push((name, value.to_string()));
        }
        HttpAuthKind::Bearer | HttpAuthKind::Basic => {
            headers.retain(|(k, _)| !k.eq_ignore_ascii_case("authorization"));
            let scheme = if auth.kind == HttpAuthKind::Bearer {
                format!("Bearer {value}")
            } else {
                format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(value.as_bytes()))
            };
            headers.push(("Authorization".into(), scheme));
        }
    }
    Ok(())
}

/// At most [`SHOWN_URL_CHARS`] characters of `text`, saying how long it was when cut.
fn cut_line(text: &str) -> String {
    agentos_core::name::cut(text, SHOWN_URL_CHARS)
}

/// The longest URL a request is made with (`http::Uri`'s limit).
const MAX_URL_BYTES: usize = 65_534;

/// How much of a URL, or of an error quoting one, an error line shows.
const SHOWN_URL_CHARS: usize = 300;

pub(crate) fn not_granted(secret: &str, origin: &str) -> CoreError {
    CoreError::new(
        ErrorKind::Forbidden,
        "secret_not_granted",
        format!(
            "secret {secret:?} is not granted to requests to {origin}; the operator grants it with `agentos secret grant {secret} --origin {origin}` (after `agentos secret set {secret}` if the master does not hold it yet)"
        ),
    )
}

impl crate::Principals<'_> {
    /// Whether `secret` is granted to requests to `origin`: for `model` when given (a grant
    /// narrowed to another model does not count), or in any model when not.
    pub(crate) fn secret_granted_to_origin(&self, secret: &str, origin: &str, model: Option<&str>) -> bool {
        self.read_state().secret_grants.values().any(|g| {
            g.secret == secret
                && matches!(&g.to, GrantTarget::Origin { origin: o } if o == origin)
                && match (&g.model, model) {
                    (Some(narrow), Some(m)) => narrow == m,
                    _ => true,
                }
        })
    }
}

/// `TOOL_CATALOG_REGISTER_HTTP`: an HTTP service by its base URL and OpenAPI document.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterHttp {
    pub id: String,
    pub name: String,
    /// Replaces the document's `servers`: `https://api.example.com/v1`.
    pub base_url: String,
    /// The document: a JSON or YAML string, or a JSON object. Exactly one of `openapi` and `openapiUrl`.
    #[serde(default)]
    pub openapi: Option<Value>,
    /// Where the master fetches the document (through its outbound policy).
    #[serde(default)]
    pub openapi_url: Option<String>,
    /// The credential, by the name of a secret granted to the service's origin.
    #[serde(default)]
    pub auth: Option<HttpAuth>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub capabilities: Option<Vec<String>>,
    /// Keep only these operations, by tool name.
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// How long one call may take, in milliseconds (the master's default and maximum apply).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

impl RegisterHttp {
    async fn plan(self, engine: &Engine) -> Result<Plan, EngineError> {
        super::check_timeout(engine, self.timeout_ms)?;
        let header = HeaderFields {
            id: self.id,
            name: self.name,
            // Always global: a service is one thing for every model.
            model: Some(DEFAULT_MODEL.to_string()),
            version: None,
            description: self.description,
            capabilities: self.capabilities,
        }
        .check(DEFAULT_MODEL)?;
        let (parsed, origin) = super::service_url("baseUrl", &self.base_url, "invalid_base_url")?;
        // What a call joins the operation's path to: no query or fragment to join after, and
        // no server variable left to fill.
        if self.base_url.contains(['?', '#']) {
            // Said without them: a query is where a pasted key would be (`?api_key=…`).
            let mut shown = parsed.clone();
            shown.set_query(None);
            shown.set_fragment(None);
            return Err(CoreError::bad_input(
                "invalid_base_url",
                format!(
                    "baseUrl {shown} has a query or fragment: give scheme, host, port and path only (a key goes in a secret, named in auth)"
                ),
            )
            .into());
        }
        if self.base_url.contains(['{', '}']) {
            return Err(CoreError::bad_input(
                "invalid_base_url",
                format!(
                    "baseUrl {:?} holds a server variable: give the URL with its variables filled in",
                    self.base_url
                ),
            )
            .into());
        }
        if let Some(auth) = &self.auth {
            check_auth(auth)?;
            if !engine.principals().secret_granted_to_origin(&auth.secret, &origin, None) {
                return Err(not_granted(&auth.secret, &origin).into());
            }
        }
        let options = agentos_openapi::ImportOptions { include: self.include, ..Default::default() };
        let refused = |e: agentos_openapi::ImportError| CoreError::bad_input("invalid_openapi", e.to_string());
        let (imported, bytes, ext) = match (self.openapi, self.openapi_url) {
            (Some(Value::String(text)), None) => {
                let imported = agentos_openapi::import(text.as_bytes(), &options).map_err(refused)?;
                let ext = if text.trim_start().starts_with('{') { "json" } else { "yaml" };
                (imported, text.into_bytes(), ext)
            }
            (Some(doc @ Value::Object(_)), None) => {
                let imported = agentos_openapi::import_value(&doc, &options).map_err(refused)?;
                let bytes = serde_json::to_vec(&doc).map_err(|e| CoreError::internal(e.to_string()))?;
                (imported, bytes, "json")
            }
            (None, Some(url)) => {
                let bytes = fetch_document(engine, &url, options.limits.max_bytes).await?;
                let imported = agentos_openapi::import(&bytes, &options).map_err(refused)?;
                let json = bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
                (imported, bytes, if json { "json" } else { "yaml" })
            }
            (Some(_), None) => {
                return Err(CoreError::bad_input(
                    "invalid_command",
                    "openapi must be the document as a JSON or YAML string, or a JSON object",
                )
                .into());
            }
            _ => {
                return Err(
                    CoreError::bad_input("invalid_command", "give exactly one of openapi and openapiUrl").into()
                );
            }
        };
        let sha256 = sha256_hex(&bytes);
        let urn = BlobUrn::new(OPENAPI_NAMESPACE, &sha256, Some(ext))?;
        let mut operations = imported.operations;
        if let Some(auth) = &self.auth {
            for op in &mut operations {
                drop_shadowed(op, auth);
            }
        }
        let (contract, calls) = contract_of(operations);
        let binding = Binding::Http(HttpBinding {
            base_url: self.base_url,
            openapi_urn: urn.to_string(),
            sha256,
            size_bytes: bytes.len() as u64,
            auth: self.auth,
            operations: calls,
            skipped: imported.skipped,
            timeout_ms: self.timeout_ms,
        });
        let (model, mut entry) = header.into_entry(Status::Registered, contract, binding);
        // The entry's version is the document's (`info.version`) when it makes a valid one.
        if agentos_core::name::check_label("version", &imported.version, 64).is_ok() {
            entry.version = imported.version;
        }
        Ok(Plan { model, entry, blobs: vec![(urn, bytes)] })
    }
}

/// Leaves out of `op` the parameter its credential fills (a query or header parameter of the
/// auth's name): every value given for it was replaced by the credential, so its flag was
/// offered and never sent. A `Cookie` header credential is joined to the operation's cookies
/// instead (see [`place_credential`]).
fn drop_shadowed(op: &mut agentos_openapi::Operation, auth: &HttpAuth) {
    use agentos_openapi::Location;
    let Some(name) = auth.name.as_deref() else { return };
    let shadowed = |b: &agentos_openapi::Binding| match auth.kind {
        HttpAuthKind::Query => b.location == Location::Query && b.name == name,
        HttpAuthKind::Header => {
            b.location == Location::Header && b.name.eq_ignore_ascii_case(name) && !name.eq_ignore_ascii_case("cookie")
        }
        HttpAuthKind::Bearer | HttpAuthKind::Basic => false,
    };
    let gone: Vec<String> = op.bindings.iter().filter(|b| shadowed(b)).map(|b| b.property.clone()).collect();
    if gone.is_empty() {
        return;
    }
    op.bindings.retain(|b| !shadowed(b));
    if let Some(props) = op.input_schema.get_mut("properties").and_then(Value::as_object_mut) {
        for p in &gone {
            props.remove(p);
        }
    }
    if let Some(required) = op.input_schema.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|r| !r.as_str().is_some_and(|r| gone.iter().any(|g| g == r)));
        if required.is_empty()
            && let Some(o) = op.input_schema.as_object_mut()
        {
            o.remove("required");
        }
    }
}

/// The contract of a service's imported operations, and how each is called: a tool per
/// operation, described by its summary, its description, or its method and path.
pub(crate) fn contract_of(imported: Vec<agentos_openapi::Operation>) -> (Contract, Vec<HttpOperation>) {
    let mut operations = std::collections::BTreeMap::new();
    let mut calls = Vec::with_capacity(imported.len());
    for op in imported {
        let description = [&op.summary, &op.description]
            .into_iter()
            .flatten()
            .map(|s| s.trim())
            .find(|s| !s.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| format!("{} {}", op.method, op.path));
        let contract_op = Operation { description, input: op.input_schema, output: None, examples: Vec::new() };
        operations.insert(op.name.clone(), contract_op);
        calls.push(HttpOperation {
            name: op.name,
            method: op.method,
            path: op.path,
            bindings: op.bindings,
            body: op.body,
        });
    }
    (Contract { kind: "openapi".into(), operations }, calls)
}

pub(crate) fn check_auth(auth: &HttpAuth) -> Result<(), CoreError> {
    if !agentos_core::net::valid_credential(&auth.secret) {
        return Err(CoreError::bad_input(
            "invalid_auth",
            format!("auth.secret {:?} is not a secret name", auth.secret),
        ));
    }
    let needs_name = matches!(auth.kind, HttpAuthKind::Header | HttpAuthKind::Query);
    match (&auth.name, needs_name) {
        (None, true) => Err(CoreError::bad_input("invalid_auth", "auth of type header or query needs a name")),
        (Some(_), false) => Err(CoreError::bad_input("invalid_auth", "auth of type bearer or basic takes no name")),
        (Some(n), true) if n.is_empty() || !n.bytes().all(|b| b.is_ascii_graphic()) => {
            Err(CoreError::bad_input("invalid_auth", format!("auth.name {n:?} is not a header or parameter name")))
        }
        (Some(n), true) if auth.kind == HttpAuthKind::Header && agentos_openapi::clients_header(n) => {
            Err(CoreError::bad_input(
                "invalid_auth",
                format!(
                    "auth.name {n:?} is a header that routes or frames the request, which cannot carry a credential; use bearer, basic or the header the service reads its key from"
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// Fetches a document through the outbound policy; a redirect to another origin is refused.
async fn fetch_document(engine: &Engine, url: &str, max_bytes: usize) -> Result<Vec<u8>, EngineError> {
    let bad = |why: String| -> EngineError { CoreError::bad_input("openapi_fetch_failed", why).into() };
    let parsed = reqwest::Url::parse(url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .ok_or_else(|| bad(format!("openapiUrl {url:?} is not an http or https URL")))?;
    engine.inner.nets.outbound.check_url(&parsed).map_err(|e| bad(format!("GET {url} refused: {e}")))?;
    let send = engine.inner.nets.sealed_http.get(parsed.clone()).timeout(FETCH_TIMEOUT).send();
    let mut resp = crate::outbound::sending(&parsed, send)
        .await
        .map_err(|e| bad(format!("GET {url} failed: {}", describe(&e))))?;
    let status = resp.status().as_u16();
    if !(200..300).contains(&status) {
        let hint =
            if (300..400).contains(&status) { " (redirects are followed within the same origin only)" } else { "" };
        return Err(bad(format!("GET {url} answered {status}{hint}")));
    }
    let mut bytes = Vec::new();
    while let Some(c) = resp.chunk().await.map_err(|e| bad(format!("reading {url}: {}", describe(&e))))? {
        if bytes.len() + c.len() > max_bytes {
            return Err(bad(format!("{url}: the document is over the limit max_bytes = {max_bytes}")));
        }
        bytes.extend_from_slice(&c);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_western_single_byte_answer_is_read_as_the_text_it_is() {
        let read =
            |ct: &str, bytes: &[u8]| as_utf8_text(ct, bytes).map(|(ct, text)| (ct, String::from_utf8(text).unwrap()));
        assert_eq!(
            read("text/plain; charset=ISO-8859-1", b"caf\xe9 \x80 \x93q\x94"),
            Some(("text/plain; charset=utf-8".into(), "café € “q”".into()))
        );
        let (ct, _) = read("text/html;charset=\"windows-1252\";level=1;", b"\xe9").unwrap();
        assert_eq!(ct, "text/html; level=1; charset=utf-8");
        let (ct, _) = read("application/problem+json; name=\"a;b\"; Charset=latin1", b"\xe9").unwrap();
        assert_eq!(ct, "application/problem+json; name=\"a;b\"; charset=utf-8");
        // Every byte is one character: latin1's own, but windows-1252's printable ones at 0x80
        // to 0x9F (five of which it leaves as the control characters they are).
        let all: Vec<u8> = (0..=255).collect();
        let (_, text) = read("text/plain; charset=latin1", &all).unwrap();
        let chars: Vec<char> = text.chars().collect();
        assert_eq!(chars.len(), 256);
        for (b, c) in all.iter().zip(&chars) {
            let same = u32::from(*b) == u32::from(*c);
            assert_eq!(same, !(0x80..=0x9f).contains(b) || [0x81, 0x8d, 0x8f, 0x90, 0x9d].contains(b), "{b:#x} {c:?}");
        }
        // UTF-8 already, another charset, none, or bytes that are not text: as they came.
        for (ct, bytes) in [
            ("text/plain; charset=latin1", "café".as_bytes()),
            ("text/plain; charset=shift_jis", b"\x82\xa0"),
            ("application/octet-stream", b"\xff\xfe"),
            ("image/png; charset=iso-8859-1", b"\x89PNG\xff"),
        ] {
            assert_eq!(read(ct, bytes), None, "{ct}");
        }
    }

    use super::*;

    fn auth(kind: HttpAuthKind, name: Option<&str>) -> HttpAuth {
        HttpAuth { kind, name: name.map(str::to_string), secret: "KEY".into() }
    }

    /// Places the credential `v` for `auth` on `url` with `headers`, and checks the URL and
    /// headers that result, or the refusal's words.
    /// Headers as a table writes them.
    type Headers<'a> = &'a [(&'a str, &'a str)];

    fn check(auth: HttpAuth, url: &str, headers: Headers<'_>, expected: Result<(&str, Headers<'_>), &str>) {
        let mut url = reqwest::Url::parse(url).unwrap();
        let mut hs: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let got = place_credential(&auth, "s3cr3t+/=", &mut url, &mut hs);
        match expected {
            Ok((want_url, want_headers)) => {
                assert_eq!(got, Ok(()), "{auth:?}");
                assert_eq!(url.as_str(), want_url, "{auth:?}");
                let want: Vec<(String, String)> =
                    want_headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
                assert_eq!(hs, want, "{auth:?}");
            }
            Err(words) => assert!(got.as_ref().is_err_and(|e| e.contains(words)), "{auth:?}: {got:?}"),
        }
    }

    #[test]
    fn the_credential_goes_where_its_auth_says_and_alone() {
        let u = "https://api.example.com/v1/items?q=1";
        check(
            auth(HttpAuthKind::Bearer, None),
            u,
            &[("X-Trace", "t")],
            Ok((u, &[("X-Trace", "t"), ("Authorization", "Bearer s3cr3t+/=")])),
        );
        check(
            auth(HttpAuthKind::Basic, None),
            u,
            &[("authorization", "Bearer mine")],
            Ok((u, &[("Authorization", "Basic czNjcjN0Ky89")])),
        );
        check(
            auth(HttpAuthKind::Header, Some("X-Api-Key")),
            u,
            &[("x-api-key", "mine"), ("Accept", "a")],
            Ok((u, &[("Accept", "a"), ("X-Api-Key", "s3cr3t+/=")])),
        );
        check(
            auth(HttpAuthKind::Query, Some("api_key")),
            "https://api.example.com/v1/items?api_key=mine&q=1",
            &[],
            Ok(("https://api.example.com/v1/items?q=1&api_key=s3cr3t%2B%2F%3D", &[])),
        );
        check(
            auth(HttpAuthKind::Query, Some("api_key")),
            u,
            &[],
            Ok(("https://api.example.com/v1/items?q=1&api_key=s3cr3t%2B%2F%3D", &[])),
        );
        // A cookie credential joins the operation's cookies, first; a caller's cookie of the
        // same name is left out.
        check(
            auth(HttpAuthKind::Header, Some("Cookie")),
            u,
            &[("cookie", "sess=mine")],
            Ok((u, &[("cookie", "s3cr3t+/=; sess=mine")])),
        );
        let mut url = reqwest::Url::parse(u).unwrap();
        let mut hs = vec![("cookie".to_string(), "session=forged; theme=dark".to_string())];
        place_credential(&auth(HttpAuthKind::Header, Some("Cookie")), "session=real", &mut url, &mut hs).unwrap();
        assert_eq!(hs, [("cookie".to_string(), "session=real; theme=dark".to_string())]);
        check(auth(HttpAuthKind::Header, Some("Cookie")), u, &[], Ok((u, &[("Cookie", "s3cr3t+/=")])));
        for h in ["Host", "forwarded", "X-Forwarded-For"] {
            check(
                auth(HttpAuthKind::Bearer, None),
                u,
                &[(h, "evil.example.com")],
                Err("cannot be set on a request that carries a credential"),
            );
        }
    }

    #[test]
    fn a_parameter_the_credential_fills_is_not_offered() {
        let doc = serde_json::json!({"openapi": "3.0.3", "info": {"title": "t", "version": "1"},
            "paths": {"/items": {"get": {"operationId": "list", "parameters": [
                {"name": "X-Api-Key", "in": "header", "required": true, "schema": {"type": "string"}},
                {"name": "api_key", "in": "query", "schema": {"type": "string"}},
                {"name": "limit", "in": "query", "schema": {"type": "integer"}}],
                "responses": {"200": {"description": "ok"}}}}}});
        let imported = agentos_openapi::import_value(&doc, &Default::default()).unwrap();
        let flags = |op: &agentos_openapi::Operation| {
            let mut names: Vec<String> = op.input_schema["properties"].as_object().unwrap().keys().cloned().collect();
            names.sort();
            names
        };
        let mut header = imported.operations[0].clone();
        drop_shadowed(&mut header, &auth(HttpAuthKind::Header, Some("x-api-key")));
        assert_eq!(flags(&header), ["api-key", "limit"]);
        assert!(header.input_schema.get("required").is_none(), "{}", header.input_schema);
        assert!(header.bindings.iter().all(|b| b.name != "X-Api-Key"));
        let mut query = imported.operations[0].clone();
        drop_shadowed(&mut query, &auth(HttpAuthKind::Query, Some("api_key")));
        assert_eq!(flags(&query), ["limit", "x-api-key"]);
        let mut bearer = imported.operations[0].clone();
        drop_shadowed(&mut bearer, &auth(HttpAuthKind::Bearer, None));
        assert_eq!(flags(&bearer), flags(&imported.operations[0]));
    }

    #[test]
    fn an_auth_names_a_secret_and_a_name_only_where_it_takes_one() {
        assert!(check_auth(&auth(HttpAuthKind::Bearer, None)).is_ok());
        assert!(check_auth(&auth(HttpAuthKind::Query, Some("api_key"))).is_ok());
        for (a, words) in [
            (auth(HttpAuthKind::Header, None), "needs a name"),
            (auth(HttpAuthKind::Basic, Some("x")), "takes no name"),
            (auth(HttpAuthKind::Header, Some("X Key")), "is not a header or parameter name"),
            (HttpAuth { secret: "no spaces".into(), ..auth(HttpAuthKind::Bearer, None) }, "is not a secret name"),
        ] {
            let e = check_auth(&a).unwrap_err();
            assert!(e.message.contains(words), "{a:?}: {}", e.message);
        }
    }
}
