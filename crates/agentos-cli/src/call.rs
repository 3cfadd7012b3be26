//! What a client of the master needs without an HTTP library: its failures and their exit
//! codes, the sequence it has seen, and one request over a plain HTTP/1.1 exchange
//! (`lean_http`). Shared by the `agentos` binary and the small `agentos-shim`.

use std::path::PathBuf;

use serde_json::Value;

/// A failure, with the exit code it maps to.
#[derive(Debug)]
pub struct ClientError {
    pub code: u8,
    pub message: String,
    /// The master's HTTP status, when the master answered: shown by client commands, left off
    /// the one line a shim prints, where agents act on the message and the exit code.
    pub status: Option<u16>,
    /// The master's error code (`error.code` of its answer), when it gave one; `usage` for a
    /// usage error found here, before anything was sent.
    pub error_code: Option<String>,
    /// What the service behind a tool answered, when that answer is the failure (the master's
    /// `error.response`: an http operation's status outside 2xx, with its body).
    pub response: Option<Value>,
}

pub const EXIT_FAILURE: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
pub const EXIT_DENIED: u8 = 3;
pub const EXIT_NOT_FOUND: u8 = 4;
pub const EXIT_TOOL_FAILED: u8 = 5;
pub const EXIT_TIMED_OUT_CALL: u8 = 6;
pub const EXIT_UNREACHABLE: u8 = 7;

pub(crate) fn fail(code: u8, message: impl Into<String>) -> ClientError {
    // A usage error found before anything was sent has the code the master gives its own
    // (`usage`), so that a caller reading `--json` answers tells them apart by code alike.
    let error_code = (code == EXIT_USAGE).then(|| "usage".to_string());
    ClientError { code, message: message.into(), status: None, error_code, response: None }
}

/// Longest a client request waits for its whole answer: a minute past the longest a master
/// lets a call run by default (`--max-timeout-ms`, 600 s), since the master answers every call
/// by its own timeout. At 120 s, the default timeout of a call, a call queued behind others was
/// given up here while the master still ran it, and said as a master out of reach.
pub(crate) const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(660);

/// The last event a client of one installation (named by its token) has seen, so that its next
/// request, to whichever master of a shared log, waits until that master has folded it
/// (`Agentos-Min-Seq`): a write through one master is read back through any other. Kept in
/// `AGENTOS_SEQ_FILE`, else under `$XDG_RUNTIME_DIR` or `~/.cache/agentos`, one small file per
/// token; without any of those the client sends no header.
pub(crate) struct SeenSeq {
    pub(crate) file: Option<std::path::PathBuf>,
    pub(crate) seen: Option<u64>,
}

impl SeenSeq {
    pub(crate) fn of(token: &str) -> SeenSeq {
        let name = format!("seq-{}", &agentos_core::sha256_hex(token.as_bytes())[..16]);
        let file = std::env::var_os("AGENTOS_SEQ_FILE")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("XDG_RUNTIME_DIR").map(|d| std::path::Path::new(&d).join("agentos").join(&name))
            })
            .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache/agentos").join(&name)));
        let seen = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()).and_then(|s| s.trim().parse().ok());
        SeenSeq { file, seen }
    }

    pub(crate) fn note_seq(&self, seq: u64) {
        let Some(file) = &self.file else { return };
        if self.seen.is_some_and(|s| s >= seq) {
            return;
        }
        let Some(dir) = file.parent() else { return };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let tmp = dir.join(format!(".seq-{}", std::process::id()));
        if std::fs::write(&tmp, seq.to_string()).is_ok() && std::fs::rename(&tmp, file).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// A refused request as the exit code and line it gives: the status decides the code.
pub(crate) fn refusal(status: u16, value: &Value) -> ClientError {
    let message = match value {
        // Not the master's JSON (a proxy's page, an empty body): said as what came, on one line.
        Value::String(text) => not_json(status, text),
        _ => value.pointer("/error/message").and_then(Value::as_str).map(inert).unwrap_or_else(|| value.to_string()),
    };
    let code = match status {
        // A conflict with what exists (a name taken, a job finished or not yet) is the request's
        // to change, as bad input is.
        400 | 409 | 413 => EXIT_USAGE,
        401 | 403 => EXIT_DENIED,
        404 => EXIT_NOT_FOUND,
        422 => EXIT_TOOL_FAILED,
        // Both pass with time: a call that ran out of it, and one refused while too many of the
        // caller's are in flight.
        504 | 429 => EXIT_TIMED_OUT_CALL,
        _ => EXIT_FAILURE,
    };
    let error_code = value.pointer("/error/code").and_then(Value::as_str).map(str::to_string);
    let response = value.pointer("/error/response").cloned();
    ClientError { code, message, status: Some(status), error_code, response }
}

/// A message as a terminal shows it without acting on it: each of its lines as [`shown`] makes
/// it (escape sequences, a bell, a backspace, which a service's words passed on in an error could
/// hold, dropped or made a space), the line breaks kept.
fn inert(message: &str) -> String {
    message.split('\n').map(shown).collect::<Vec<_>>().join("\n")
}

/// The line for an answer whose body is not JSON: its first line with something to show, cut at
/// 200 characters, or that it was empty.
fn not_json(status: u16, text: &str) -> String {
    let line = text.split(['\n', '\r', '\u{2028}', '\u{2029}']).map(shown).find(|l| !l.is_empty());
    match line {
        None => format!("the master's address answered HTTP {status} with an empty body"),
        Some(line) => {
            let mut cut: String = line.chars().take(200).collect();
            if line.chars().nth(200).is_some() {
                cut.push('…');
            }
            format!("the master's address answered HTTP {status}, not in JSON: {cut}")
        }
    }
}

/// One line of text as a terminal can show it ([`agentos_core::name::terminal_line`]).
pub(crate) fn shown(line: &str) -> String {
    agentos_core::name::terminal_line(line)
}

/// The master and who we are, as a shim finds them in the environment.
pub(crate) struct Target {
    pub url: String,
    pub token: Option<String>,
    pub data: PathBuf,
}

/// What is wrong with `url` as a master's address (not a URL, not `http://` or `https://`, no
/// host), as one line naming where it came from (`named`); `None` when it may name a master.
pub(crate) fn not_a_master(url: &str, named: &str) -> Option<String> {
    let why = match url::Url::parse(url) {
        Err(e) => e.to_string(),
        Ok(u) if !matches!(u.scheme(), "http" | "https") => {
            format!("its scheme is {:?}, not http or https", u.scheme())
        }
        Ok(u) if u.host_str().is_none_or(str::is_empty) => "it names no host".to_string(),
        Ok(_) => return None,
    };
    Some(format!("{named} {url:?} is not a master's address ({why}); set it like http://127.0.0.1:7420"))
}

impl Target {
    /// `AGENTOS_URL`, `AGENTOS_TOKEN`, `AGENTOS_DATA`, with the client's defaults.
    pub(crate) fn from_env() -> Target {
        Target {
            url: std::env::var("AGENTOS_URL").unwrap_or_else(|_| "http://127.0.0.1:7420".into()),
            token: std::env::var("AGENTOS_TOKEN").ok(),
            data: std::env::var("AGENTOS_DATA").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from("./.agentos")),
        }
    }

    pub(crate) fn token(&self) -> Result<String, ClientError> {
        let token = match &self.token {
            Some(t) => t.trim().to_string(),
            None => {
                let file = self.data.join("operator.token");
                std::fs::read_to_string(&file).map(|t| t.trim().to_string()).map_err(|_| {
                    fail(EXIT_USAGE, format!("no token: set AGENTOS_TOKEN or --token (the operator's token is in <data>/operator.token; {} was not readable)", file.display()))
                })?
            }
        };
        if token.chars().any(char::is_control) {
            return Err(fail(
                EXIT_USAGE,
                "the token holds a control character (a line break?): check AGENTOS_TOKEN, --token or operator.token",
            ));
        }
        // Said here: the master would only see a header it cannot read, or none.
        if token.is_empty() {
            return Err(fail(
                EXIT_USAGE,
                "the token is empty: set AGENTOS_TOKEN (or --token) to a token, or unset it to use <data>/operator.token",
            ));
        }
        if !token.is_ascii() {
            return Err(fail(
                EXIT_USAGE,
                "the token holds a character that is not ASCII, which no agentos token has: check AGENTOS_TOKEN, --token or operator.token",
            ));
        }
        Ok(token)
    }

    /// Refuses, before anything is sent, a master's URL that names no master: not a URL, or
    /// not `http://` or `https://`, or no host. `named` is where the URL came from, for the
    /// message (`AGENTOS_URL` for a shim).
    pub(crate) fn check_url(&self, named: &str) -> Result<(), ClientError> {
        not_a_master(&self.url, named).map_or(Ok(()), |why| Err(fail(EXIT_USAGE, why)))
    }

    /// The message of a master that cannot be reached.
    /// The master took the request and gave no whole answer within [`REQUEST_TIMEOUT`]: not a
    /// master out of reach, and the call may still be running there.
    pub(crate) fn no_answer(&self) -> ClientError {
        fail(
            EXIT_TIMED_OUT_CALL,
            format!(
                "the master at {} gave no answer within {} s; the call may still be running there (`agentos executors` shows what runs)",
                self.url,
                REQUEST_TIMEOUT.as_secs()
            ),
        )
    }

    /// An exchange that failed: [`Target::no_answer`] when it timed out, else
    /// [`Target::unreachable`].
    pub(crate) fn lost(&self, e: &std::io::Error) -> ClientError {
        // A connection that could not be opened in time is a master out of reach: nothing was sent.
        if e.kind() == std::io::ErrorKind::TimedOut && e.to_string() == crate::lean_http::NO_ANSWER {
            self.no_answer()
        } else if e.to_string() == crate::lean_http::CUT_ANSWER {
            // (Said so by this process's reader, or handed over in the lean shim's words.)
            // Sent, and cut off before the answer (the master stopped or was killed): it is not
            // out of reach, and what was asked may have been done.
            fail(
                EXIT_TIMED_OUT_CALL,
                format!(
                    "the master at {} closed the connection before its answer came; the call may have run there (`agentos executors` lists what runs and what finished lately)",
                    self.url
                ),
            )
        } else {
            self.unreachable(e)
        }
    }

    pub(crate) fn unreachable(&self, e: &dyn std::fmt::Display) -> ClientError {
        fail(
            EXIT_UNREACHABLE,
            format!("cannot reach the master at {}: {e} (is `agentos up` running? set AGENTOS_URL)", self.url),
        )
    }

    /// One request as a plain exchange; `None` when this master is not reached that way.
    pub(crate) fn request(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Option<Result<Value, ClientError>> {
        let url = url::Url::parse(&format!("{}{}", self.url.trim_end_matches('/'), path)).ok()?;
        if !crate::lean_http::usable(&url) {
            return None;
        }
        Some((|| {
            // A call the lean `agentos-shim` already made: its answer, as it got it.
            let answer = match handed_over(method, path) {
                Some(Ok(answer)) => answer,
                Some(Err(lost)) => return Err(self.lost(&lost)),
                None => self.exchange(url, method, query, body)?,
            };
            let text = String::from_utf8_lossy(&answer.body);
            let value: Value = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.into_owned()));
            if (200..300).contains(&answer.status) {
                return Ok(value);
            }
            Err(refusal(answer.status, &value))
        })())
    }

    /// One exchange with the master, its sequence noted.
    fn exchange(
        &self,
        mut url: url::Url,
        method: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<crate::lean_http::Answer, ClientError> {
        let token = self.token()?;
        let seen = SeenSeq::of(&token);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let mut headers = vec![("Authorization", format!("Bearer {token}")), ("Accept", "*/*".into())];
        if let Some(n) = seen.seen {
            headers.push(("Agentos-Min-Seq", n.to_string()));
        }
        let bytes = body.map(|b| serde_json::to_vec(b).unwrap_or_default());
        let answer = crate::lean_http::exchange(
            &url,
            method,
            &headers,
            bytes.as_deref().map(|b| ("application/json", b)),
            REQUEST_TIMEOUT,
        )
        .map_err(|e| self.lost(&e))?;
        if let Some(seq) = answer.header("agentos-seq").and_then(|v| v.parse::<u64>().ok()) {
            seen.note_seq(seq);
        }
        Ok(answer)
    }
}

/// The environment variable through which the lean `agentos-shim` (`lean/shim.rs`) hands a
/// call it already sent to this program: a descriptor of a memory file holding `A <status>`, a
/// line break and the answer's body; `P <errno> <status>`, a line break and the body (printed in
/// part before standard output failed with that error); `O <errno>` (no whole answer: an OS
/// error); or `S <reason>` (no whole answer, for that reason). The lean shim noted the answer's
/// sequence.
pub(crate) const HANDED_OVER: &str = "AGENTOS_SHIM_ANSWER_FD";

/// The OS error with which the lean shim's printing of the answer failed, after part of it went
/// out (0: none). Nothing is printed again; the failure is reported.
static STDOUT_FAILED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Why standard output cannot take the answer, when the lean shim found so while printing it.
pub(crate) fn stdout_failed() -> Option<std::io::Error> {
    let errno = STDOUT_FAILED.load(std::sync::atomic::Ordering::Relaxed);
    (errno != 0).then(|| std::io::Error::from_raw_os_error(errno))
}

/// What the lean shim handed over, until the call's request takes it.
static HANDED: std::sync::Mutex<Option<std::io::Result<crate::lean_http::Answer>>> = std::sync::Mutex::new(None);

/// Reads what [`HANDED_OVER`] names, once, first thing in a toolkit's run (before any thread),
/// and removes the variable. A value that is not the lean shim's is refused: the call it stands
/// for may have run, so it is not sent again.
pub(crate) fn take_handed_over() -> Result<(), ClientError> {
    let Some(value) = std::env::var_os(HANDED_OVER) else { return Ok(()) };
    // SAFETY: called at the start of the process, before any other thread exists.
    unsafe { std::env::remove_var(HANDED_OVER) };
    let refused = || {
        fail(
            EXIT_FAILURE,
            format!(
                "{HANDED_OVER}={value:?} names no answer agentos-shim left; the call may have run (see `agentos job`)"
            ),
        )
    };
    let fd: i32 = value.to_str().and_then(|v| v.parse().ok()).filter(|fd| *fd > 2).ok_or_else(refused)?;
    let mut text = Vec::new();
    // SAFETY: the descriptor was opened for this process by the lean shim and is read once here.
    let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    std::io::Read::read_to_end(&mut file, &mut text).map_err(|_| refused())?;
    let handed = match text.split_first_chunk::<2>() {
        Some((b"A ", rest)) => {
            let (status, body) = rest.split_at(rest.iter().position(|b| *b == b'\n').ok_or_else(refused)?);
            let status = std::str::from_utf8(status).ok().and_then(|s| s.parse().ok()).ok_or_else(refused)?;
            Ok(crate::lean_http::Answer { status, headers: Vec::new(), body: body[1..].to_vec() })
        }
        Some((b"P ", rest)) => {
            // Printed in part before standard output failed: that failure is this call's.
            let (head, body) = rest.split_at(rest.iter().position(|b| *b == b'\n').ok_or_else(refused)?);
            let (errno, status) = std::str::from_utf8(head).ok().and_then(|h| h.split_once(' ')).ok_or_else(refused)?;
            let errno: i32 = errno.parse().ok().filter(|e| *e > 0).ok_or_else(refused)?;
            let status = status.parse().ok().ok_or_else(refused)?;
            STDOUT_FAILED.store(errno, std::sync::atomic::Ordering::Relaxed);
            Ok(crate::lean_http::Answer { status, headers: Vec::new(), body: body[1..].to_vec() })
        }
        Some((b"O ", errno)) => {
            let errno = std::str::from_utf8(errno).ok().and_then(|s| s.parse().ok()).ok_or_else(refused)?;
            Err(std::io::Error::from_raw_os_error(errno))
        }
        Some((b"S ", reason)) => {
            let reason = String::from_utf8_lossy(reason).into_owned();
            // The lean shim's own words for a wait that ran out (`lean/shim.rs`).
            let kind = if reason == crate::lean_http::NO_ANSWER {
                std::io::ErrorKind::TimedOut
            } else {
                std::io::ErrorKind::Other
            };
            Err(std::io::Error::new(kind, reason))
        }
        _ => return Err(refused()),
    };
    *HANDED.lock().unwrap_or_else(|p| p.into_inner()) = Some(handed);
    Ok(())
}

/// The handed-over answer, for the call it stands for (a tool call's `POST`).
fn handed_over(method: &str, path: &str) -> Option<std::io::Result<crate::lean_http::Answer>> {
    if method != "POST" || !path.ends_with("/call") {
        return None;
    }
    HANDED.lock().unwrap_or_else(|p| p.into_inner()).take()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_with_a_line_break_is_a_usage_error_before_anything_is_sent() {
        let t = Target { url: "http://127.0.0.1:9".into(), token: Some("abc\r\nEvil: 1".into()), data: PathBuf::new() };
        let e = t.token().unwrap_err();
        assert_eq!(e.code, EXIT_USAGE);
        assert!(e.message.contains("control character"), "{}", e.message);
        let e = t.request("GET", "/api/models", &[], None).unwrap().unwrap_err();
        assert_eq!(e.code, EXIT_USAGE, "{}", e.message);
        let ok = Target { token: Some("  aos_abc \n".into()), ..t };
        assert_eq!(ok.token().unwrap(), "aos_abc", "surrounding white space is trimmed");
    }

    #[test]
    fn an_empty_token_or_one_that_is_not_ascii_is_said_before_anything_is_sent() {
        for (token, says) in [("", "the token is empty"), ("  ", "the token is empty"), ("tökén", "not ASCII")] {
            let t = Target { url: "http://127.0.0.1:9".into(), token: Some(token.into()), data: PathBuf::new() };
            let e = t.token().unwrap_err();
            assert_eq!(e.code, EXIT_USAGE);
            assert!(e.message.contains(says), "{token:?}: {}", e.message);
        }
    }

    #[test]
    fn an_answer_cut_off_is_said_as_a_call_that_may_have_run() {
        let t = Target { url: "http://127.0.0.1:9".into(), token: None, data: PathBuf::new() };
        let e = t.lost(&std::io::Error::new(std::io::ErrorKind::InvalidData, crate::lean_http::CUT_ANSWER));
        assert_eq!(e.code, EXIT_TIMED_OUT_CALL);
        assert!(e.message.contains("may have run there") && !e.message.contains("agentos up"), "{}", e.message);
    }

    #[test]
    fn a_master_that_gives_no_answer_in_time_is_not_said_out_of_reach() {
        let t = Target { url: "http://127.0.0.1:9".into(), token: None, data: PathBuf::new() };
        let e = t.lost(&std::io::Error::new(std::io::ErrorKind::TimedOut, crate::lean_http::NO_ANSWER));
        assert_eq!(e.code, EXIT_TIMED_OUT_CALL);
        assert!(
            e.message.contains("gave no answer within 660 s") && e.message.contains("may still be running"),
            "{}",
            e.message
        );
        for kind in [std::io::ErrorKind::ConnectionRefused, std::io::ErrorKind::TimedOut] {
            // Refused, or a connection not opened in time: nothing was sent.
            let e = t.lost(&std::io::Error::from(kind));
            assert_eq!(e.code, EXIT_UNREACHABLE, "{kind:?}: {}", e.message);
        }
    }

    #[test]
    fn control_characters_in_the_master_s_message_never_reach_the_terminal() {
        let said = refusal(
            422,
            &serde_json::json!({"error": {"code": "http_status",
                "message": "svc raw: answered 500: \u{1b}]0;title\u{7}\u{1b}[2J FAKE PROMPT$\u{8}\u{8}\tend\nsecond"}}),
        )
        .message;
        assert_eq!(said, "svc raw: answered 500: ]0;title FAKE PROMPT$ end\nsecond");
    }

    #[test]
    fn an_answer_that_is_not_json_is_said_on_one_line_as_it_came() {
        let said = |status, body: &str| refusal(status, &Value::String(body.into())).message;
        assert_eq!(said(500, ""), "the master's address answered HTTP 500 with an empty body");
        assert_eq!(said(502, " \r\n\t"), "the master's address answered HTTP 502 with an empty body");
        assert_eq!(
            said(502, "\n<html>\r\n<h1>502 Bad\u{1b}[31m Gateway</h1>\n</html>"),
            "the master's address answered HTTP 502, not in JSON: <html>"
        );
        assert_eq!(said(503, "Bad\u{7}Gateway"), "the master's address answered HTTP 503, not in JSON: Bad Gateway");
        // A first line with nothing to show is passed over; codes and invisible characters go.
        for (body, shown) in [
            ("\u{0}\nBad Gateway", "Bad Gateway"),
            ("\u{1}  hi", "hi"),
            ("x\ry", "x"),
            ("\u{1b}[1;31mError\u{1b}[0m: no upstream", "Error: no upstream"),
            ("\u{feff}\u{200b}\u{2028}Busy\ttry\u{b}later ", "Busy try later"),
            ("evil\u{202e}txt.exe\u{2066}x\u{2069}", "eviltxt.exex"),
        ] {
            assert_eq!(
                said(502, body),
                format!("the master's address answered HTTP 502, not in JSON: {shown}"),
                "{body:?}"
            );
        }
        assert_eq!(said(502, "\u{feff}\u{1b}[0m\u{7}"), "the master's address answered HTTP 502 with an empty body");
        let long = said(500, &"é".repeat(300));
        assert!(long.ends_with(&format!("{}…", "é".repeat(200))) && !long.contains('\n'), "{long}");
        assert_eq!(
            said(500, &"x".repeat(200)),
            format!("the master's address answered HTTP 500, not in JSON: {}", "x".repeat(200))
        );
        // The master's own JSON keeps its message, and its exit code by status.
        let e = refusal(422, &serde_json::json!({"ok": false, "error": {"code": "tool_failed", "message": "no luck"}}));
        assert_eq!((e.message.as_str(), e.code), ("no luck", EXIT_TOOL_FAILED));
        // Too many calls in flight passes with time, as a timed-out call does.
        let busy =
            serde_json::json!({"error": {"code": "too_many_invocations", "message": "a has 32 invocations in flight"}});
        assert_eq!((refusal(429, &busy).code, refusal(504, &busy).code), (EXIT_TIMED_OUT_CALL, EXIT_TIMED_OUT_CALL));
    }
}
