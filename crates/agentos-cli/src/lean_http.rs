//! One HTTP/1.1 exchange over a TCP connection of its own, for a master at an `http://` URL
//! with no proxy configured: a client command (a shim's tool call above all) is one request,
//! and a blocking `reqwest` client starts a thread and an async runtime to make it, which costs
//! more than the exchange itself on loopback. Anything else (`https://`, a proxy) goes through
//! `reqwest` (in `agentos-shim`, through the `agentos` binary beside it).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Longest wait for a connection to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an exchange failed after its request went out and before its whole answer came: the
/// call may have run ([`crate::call::Target::lost`]); a connection that could not be opened
/// fails with the system's own words instead.
pub(crate) const NO_ANSWER: &str = "no whole answer in time";

/// Largest answer head (status line and headers) read.
const MAX_HEAD: usize = 64 << 10;

/// An answer: its status, headers (names lower-cased) and whole body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Whether `url` can be reached this way: plain HTTP, and no proxy in the environment (which
/// `reqwest` would follow).
pub fn usable(url: &url::Url) -> bool {
    url.scheme() == "http"
        && ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
            .iter()
            .all(|k| std::env::var_os(k).is_none_or(|v| v.is_empty()))
}

/// Sends one request and reads its whole answer, within `timeout` in all (after the connection
/// opened). `headers` are sent as given, after `Host`; the body, if any, with its length.
pub fn exchange(
    url: &url::Url,
    method: &str,
    headers: &[(&str, String)],
    body: Option<(&str, &[u8])>,
    timeout: Duration,
) -> std::io::Result<Answer> {
    if headers.iter().any(|(_, v)| v.contains(['\r', '\n'])) {
        return Err(invalid("a header value holds a line break"));
    }
    let host = url.host_str().ok_or_else(|| invalid("the URL names no host"))?;
    let port = url.port_or_known_default().unwrap_or(80);
    let addrs: Vec<_> = (host.trim_start_matches('[').trim_end_matches(']'), port).to_socket_addrs()?.collect();
    let mut last = None;
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut stream = stream.ok_or_else(|| last.unwrap_or_else(|| invalid("the host has no address")))?;
    stream.set_nodelay(true)?;
    let deadline = Instant::now() + timeout;

    let mut req = Vec::with_capacity(512 + body.map_or(0, |(_, b)| b.len()));
    let target = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let host_header = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    write!(req, "{method} {target} HTTP/1.1\r\nHost: {host_header}\r\n")?;
    for (name, value) in headers {
        write!(req, "{name}: {value}\r\n")?;
    }
    match body {
        Some((media_type, bytes)) => {
            write!(req, "Content-Type: {media_type}\r\nContent-Length: {}\r\n", bytes.len())?;
        }
        None if method != "GET" && method != "HEAD" => req.extend_from_slice(b"Content-Length: 0\r\n"),
        None => {}
    }
    req.extend_from_slice(b"Connection: close\r\n\r\n");
    if let Some((_, bytes)) = body {
        req.extend_from_slice(bytes);
    }
    stream.set_write_timeout(Some(left(deadline)?))?;
    // A master may answer and close before taking a large body (a refused token, an unknown
    // toolkit): its answer, when it can still be read, says more than the broken write. (Often
    // it cannot: the reset that ends the write discards what came before it.)
    let written = stream.write_all(&req);
    let head_only = method == "HEAD";

    let mut raw = Vec::with_capacity(8192);
    let mut buf = [0u8; 16 << 10];
    loop {
        stream.set_read_timeout(Some(left(deadline)?))?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                written?;
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, NO_ANSWER));
            }
            Err(e) => {
                written?;
                return Err(e);
            }
        }
        // A chunked body is looked at once its last chunk may be there, not at every read.
        if (!is_chunked(&raw) || raw.ends_with(b"\r\n\r\n"))
            && let Some(answer) = complete(&raw, false, head_only)?
        {
            return Ok(answer);
        }
    }
    match complete(&raw, true, head_only)? {
        Some(answer) => Ok(answer),
        None => {
            written?;
            Err(invalid(CUT_ANSWER))
        }
    }
}

/// Whether the head that came so far says the body is chunked.
fn is_chunked(raw: &[u8]) -> bool {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(raw.len().min(MAX_HEAD));
    String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase().contains("transfer-encoding: chunked")
}

/// Why an exchange failed once the request was sent and the connection closed without the
/// answer: the master may have done what was asked.
pub(crate) const CUT_ANSWER: &str = "the connection closed before the whole answer came";

fn invalid(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string())
}

/// The time left until `deadline`, or a timeout error.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::TimedOut, NO_ANSWER))
}

/// The answer in `raw`, once all of it is there (by its length, or its last chunk); `None`
/// while more is to come. An answer without either ends with the connection: whole at `eof`.
/// The answer to a `HEAD` request (`head_only`) has no body, whatever its head says.
fn complete(raw: &[u8], eof: bool, head_only: bool) -> std::io::Result<Option<Answer>> {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        if raw.len() > MAX_HEAD {
            return Err(invalid("the answer's head is too long"));
        }
        return Ok(None);
    };
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| invalid("the answer's head is not text"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| status_line.starts_with("HTTP/1."))
        .ok_or_else(|| invalid("the answer does not start with an HTTP/1 status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[end + 4..];
    let get = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    let body = if head_only {
        Vec::new()
    } else if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        match dechunk(rest)? {
            Some(b) => b,
            None => return Ok(None),
        }
    } else if let Some(len) = get("content-length") {
        let len: usize = len.parse().map_err(|_| invalid("the answer's Content-Length is not a number"))?;
        if rest.len() < len {
            return Ok(None);
        }
        rest[..len].to_vec()
    } else if status == 204 || status == 304 || (100..200).contains(&status) {
        Vec::new()
    } else if eof {
        rest.to_vec()
    } else {
        return Ok(None);
    };
    Ok(Some(Answer { status, headers, body }))
}

/// A chunked body, once its last chunk is there.
fn dechunk(mut rest: &[u8]) -> std::io::Result<Option<Vec<u8>>> {
    let mut body = Vec::with_capacity(rest.len());
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else { return Ok(None) };
        let size_text = std::str::from_utf8(&rest[..eol]).map_err(|_| invalid("a chunk size is not text"))?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| invalid("a chunk size is not hexadecimal"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            // Trailers, if any, end with an empty line; a body is whole at its last chunk.
            return Ok(Some(body));
        }
        let Some(with_end) = size.checked_add(2) else { return Err(invalid("a chunk size is too large")) };
        if rest.len() < with_end {
            return Ok(None);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_by_length_by_chunks_and_incomplete_ones() {
        let complete = |raw: &[u8]| complete(raw, false, false);
        let a = complete(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nAgentos-Seq: 7\r\n\r\nhello").unwrap().unwrap();
        assert_eq!((a.status, a.body.as_slice(), a.header("agentos-seq")), (200, &b"hello"[..], Some("7")));
        assert!(complete(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhel").unwrap().is_none());
        assert!(complete(b"HTTP/1.1 200 OK\r\ncontent-len").unwrap().is_none());
        let c = b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        let a = complete(c).unwrap().unwrap();
        assert_eq!((a.status, a.body.as_slice()), (403, &b"abcde"[..]));
        assert!(complete(&c[..c.len() - 7]).unwrap().is_none());
        let a = complete(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap().unwrap();
        assert_eq!((a.status, a.body.len()), (204, 0));
        assert!(complete(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(complete(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n").is_err());
        assert!(complete(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err());
        assert!(complete(&vec![b'a'; MAX_HEAD + 1]).is_err());
        // No length, no chunks: the body is what came before the connection closed.
        assert!(complete(b"HTTP/1.1 200 OK\r\n\r\nall of it").unwrap().is_none());
        let a = super::complete(b"HTTP/1.1 200 OK\r\n\r\nall of it", true, false).unwrap().unwrap();
        assert_eq!(a.body, b"all of it");
        // A HEAD answer is whole at its head; a chunk size past usize is refused, not a panic.
        let a = super::complete(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", false, true).unwrap().unwrap();
        assert_eq!((a.status, a.body.len()), (200, 0));
        let huge = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nab";
        assert!(complete(huge).is_err());
        assert!(is_chunked(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n"));
        assert!(!is_chunked(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"));
    }

    #[test]
    fn proxies_and_https_go_to_reqwest() {
        let http = url::Url::parse("http://127.0.0.1:7420/api").unwrap();
        let https = url::Url::parse("https://example.test/api").unwrap();
        assert!(!usable(&https));
        // The environment is the process's: only asserted when it names no proxy.
        if ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"].iter().all(|k| std::env::var_os(k).is_none()) {
            assert!(usable(&http));
        }
    }

    #[test]
    fn one_exchange_with_a_real_server() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") || !got.ends_with(b"{\"a\":1}") {
                let n = s.read(&mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            // Written in two pieces: the client reads until the length is there.
            s.write_all(b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\nok").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            s.write_all(b"!!").unwrap();
            String::from_utf8(got).unwrap()
        });
        let url = url::Url::parse(&format!("http://127.0.0.1:{port}/x/y?q=a%20b")).unwrap();
        let a = exchange(
            &url,
            "POST",
            &[("Authorization", "Bearer t".into())],
            Some(("application/json", b"{\"a\":1}")),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!((a.status, a.body.as_slice()), (201, &b"ok!!"[..]));
        let sent = server.join().unwrap();
        assert!(sent.starts_with(&format!("POST /x/y?q=a%20b HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n")), "{sent}");
        assert!(sent.contains("Content-Length: 7\r\n") && sent.contains("Authorization: Bearer t\r\n"), "{sent}");
        let bad = exchange(&url, "GET", &[("X", "a\r\nb".into())], None, Duration::from_secs(1)).unwrap_err();
        assert_eq!(bad.kind(), std::io::ErrorKind::InvalidData, "refused before connecting: {bad}");
        let gone = exchange(&url, "GET", &[], None, Duration::from_secs(1)).unwrap_err();
        assert_eq!(gone.kind(), std::io::ErrorKind::ConnectionRefused, "{gone}");
    }
}
