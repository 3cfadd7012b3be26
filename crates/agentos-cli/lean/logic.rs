//! What the lean `agentos-shim` decides and writes, in `core` alone (no allocation, no C
//! library): whether a call can go its short way, the request it sends, and the answer it reads.
//! The same rules as the whole shim (`toolkit`, `call`, `lean_http`); whatever falls outside
//! them is handed to `agentos-shim-full`, so this file only has to be exact for what it takes.
//! It is compiled into the lean program and, for its tests, into the `agentos` crate.

/// A writer into a fixed buffer that notes when something did not fit, and counts what was put
/// either way (so an empty buffer measures).
pub struct Out<'a> {
    buf: &'a mut [u8],
    len: usize,
    fits: bool,
    put: usize,
}

impl<'a> Out<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        Out { buf, len: 0, fits: true, put: 0 }
    }

    pub fn put(&mut self, bytes: &[u8]) {
        self.put += bytes.len();
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(room) if self.fits => {
                room.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            _ => self.fits = false,
        }
    }

    pub fn num(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.put(&digits[i..]);
    }

    /// How many bytes were put, whether they fit or not.
    pub fn put_len(&self) -> usize {
        self.put
    }

    /// What was written, or `None` when some of it did not fit.
    pub fn written(&self) -> Option<&[u8]> {
        self.fits.then(|| &self.buf[..self.len])
    }
}

/// `agentos_core::name::is_valid_id`.
pub fn is_valid_id(s: &[u8]) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && (s[0].is_ascii_lowercase() || s[0].is_ascii_digit())
        && s.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// The toolkit a process started as `…/agentos-{toolkit}` stands for, when its name is one.
pub fn toolkit_of(argv0: &[u8]) -> Option<&[u8]> {
    let name = argv0.rsplit(|b| *b == b'/').next()?;
    name.strip_prefix(b"agentos-").filter(|t| is_valid_id(t))
}

/// Whether the arguments after the program's name make a plain call: a tool named first, no
/// help asked for, no `--x-file` or `--json-file` to read here, and UTF-8 throughout.
pub fn plain_call(args: &[&[u8]]) -> bool {
    let Some(tool) = args.first() else { return false };
    if tool.first() == Some(&b'-') {
        return false;
    }
    args.iter().all(|a| {
        let name = a.strip_prefix(b"--").map(|f| f.split(|b| *b == b'=').next().unwrap_or(f));
        core::str::from_utf8(a).is_ok()
            && *a != b"--help"
            && *a != b"-h"
            && !name.is_some_and(|n| n.ends_with(b"-file"))
    })
}

/// A master this program reaches itself: `http://` and a dotted IPv4 address, with a port and
/// trailing slashes or not; anything else (a name to look up, a path, IPv6, `https://`) is left
/// to the whole shim.
#[derive(Debug, PartialEq, Eq)]
pub struct Master {
    pub ip: [u8; 4],
    pub port: u16,
}

pub fn master_of(url: &[u8]) -> Option<Master> {
    let mut rest = url.strip_prefix(b"http://")?;
    while let Some(r) = rest.strip_suffix(b"/") {
        rest = r;
    }
    let (host, port) = match rest.iter().position(|b| *b == b':') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let mut ip = [0u8; 4];
    let mut parts = host.split(|b| *b == b'.');
    for octet in ip.iter_mut() {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 3 || (p.len() > 1 && p[0] == b'0') {
            return None;
        }
        *octet = u8::try_from(digits(p)?).ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    let port = match port {
        None => 80,
        Some(p) if !p.is_empty() && p.len() <= 5 => u16::try_from(digits(p)?).ok()?,
        Some(_) => return None,
    };
    Some(Master { ip, port })
}

/// Digits only, as a number.
fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 {
        return None;
    }
    s.iter().try_fold(0u64, |n, b| b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0')))
}

/// Rust's `u64::from_str`: an optional `+`, then digits, within range.
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    let s = s.strip_prefix(b"+").unwrap_or(s);
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(
        0u64,
        |n, b| if b.is_ascii_digit() { n.checked_mul(10)?.checked_add(u64::from(b - b'0')) } else { None },
    )
}

/// `str::trim` for ASCII text (the callers hand anything else over).
pub fn trim(mut s: &[u8]) -> &[u8] {
    // `char::is_whitespace` on ASCII: space, tab, line feed, vertical tab, form feed, return.
    let space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    while let [first, rest @ ..] = s
        && space(first)
    {
        s = rest;
    }
    while let [rest @ .., last] = s
        && space(last)
    {
        s = rest;
    }
    s
}

/// A token this program sends as it is: ASCII, and no control character once trimmed.
pub fn token_ok(trimmed: &[u8]) -> bool {
    !trimmed.is_empty() && trimmed.iter().all(|b| b.is_ascii() && !b.is_ascii_control())
}

/// `Path::join` of a relative `name` onto `dir`.
pub fn join(out: &mut Out, dir: &[u8], name: &[u8]) {
    out.put(dir);
    if !dir.is_empty() && !dir.ends_with(b"/") {
        out.put(b"/");
    }
    out.put(name);
}

/// A path whose `Path::parent` is what comes before its last slash: no empty, `.` or `..`
/// component and no trailing slash. Others are handed over.
pub fn plain_path(p: &[u8]) -> bool {
    !p.is_empty()
        && !p.ends_with(b"/")
        && p.split(|b| *b == b'/').skip(1).all(|c| !c.is_empty() && c != b"." && c != b"..")
        && p.split(|b| *b == b'/').next().is_none_or(|c| c != b"." && c != b"..")
}

/// The file name `SeenSeq` keeps a token's last sequence in: `seq-` and 16 hex digits of the
/// token's SHA-256.
pub fn seq_name(token: &[u8]) -> [u8; 20] {
    let digest = sha256(token);
    let mut name = *b"seq-0000000000000000";
    for (i, b) in digest[..8].iter().enumerate() {
        name[4 + 2 * i] = HEX[usize::from(b >> 4)];
        name[5 + 2 * i] = HEX[usize::from(b & 15)];
    }
    name
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A JSON string as `serde_json` writes it.
pub fn json_str(out: &mut Out, s: &[u8]) {
    out.put(b"\"");
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.put(&s[start..i]);
        if esc.is_empty() {
            out.put(&[b'\\', b'u', b'0', b'0', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        } else {
            out.put(esc);
        }
        start = i + 1;
    }
    out.put(&s[start..]);
    out.put(b"\"");
}

/// A value of a form-encoded query (`url::form_urlencoded::byte_serialize`).
pub fn form_value(out: &mut Out, s: &[u8]) {
    for &b in s {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => out.put(&[b]),
            b' ' => out.put(b"+"),
            _ => out.put(&[b'%', HEX_UPPER[usize::from(b >> 4)], HEX_UPPER[usize::from(b & 15)]]),
        }
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// What the call request needs.
pub struct Call<'a> {
    pub master: &'a Master,
    pub toolkit: &'a [u8],
    pub tool: &'a [u8],
    pub args: &'a [&'a [u8]],
    pub model: Option<&'a [u8]>,
    pub token: &'a [u8],
    pub min_seq: Option<u64>,
}

/// The most the request for `call` can take: each byte of an argument escapes to at most six.
pub fn request_room(call: &Call) -> usize {
    let args: usize = call.args.iter().map(|a| a.len() * 6 + 3).sum();
    1024 + call.toolkit.len() + call.tool.len() * 6 + call.model.map_or(0, |m| m.len() * 3) + call.token.len() + args
}

/// The request the whole shim sends for the call (`Target::request` through `lean_http`):
/// `POST /api/tools/{toolkit}/call` with `{"args": [...], "tool": ...}`, keys in `serde_json`'s
/// order.
pub fn request(out: &mut Out, call: &Call) {
    out.put(b"POST /api/tools/");
    out.put(call.toolkit);
    out.put(b"/call");
    if let Some(model) = call.model {
        out.put(b"?model=");
        form_value(out, model);
    }
    out.put(b" HTTP/1.1\r\nHost: ");
    let m = call.master;
    for (i, octet) in m.ip.iter().enumerate() {
        if i > 0 {
            out.put(b".");
        }
        out.num(u64::from(*octet));
    }
    if m.port != 80 {
        out.put(b":");
        out.num(u64::from(m.port));
    }
    out.put(b"\r\nAuthorization: Bearer ");
    out.put(call.token);
    out.put(b"\r\nAccept: */*\r\n");
    if let Some(n) = call.min_seq {
        out.put(b"Agentos-Min-Seq: ");
        out.num(n);
        out.put(b"\r\n");
    }
    out.put(b"Content-Type: application/json\r\nContent-Length: ");
    out.num(body_length(call) as u64);
    out.put(b"\r\nConnection: close\r\n\r\n");
    body(out, call);
}

fn body(out: &mut Out, call: &Call) {
    out.put(b"{\"args\":[");
    for (i, a) in call.args.iter().enumerate() {
        if i > 0 {
            out.put(b",");
        }
        json_str(out, a);
    }
    out.put(b"],\"tool\":");
    json_str(out, call.tool);
    out.put(b"}");
}

/// The body's length, measured by writing it into no room.
fn body_length(call: &Call) -> usize {
    let mut counted = Out::new(&mut []);
    body(&mut counted, call);
    counted.put_len()
}

/// `lean_http::is_chunked`: whether the head that came so far says the body is chunked.
pub fn is_chunked(raw: &[u8]) -> bool {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(raw.len().min(MAX_HEAD));
    raw[..end].windows(26).any(|w| w.eq_ignore_ascii_case(b"transfer-encoding: chunked"))
}

/// Largest answer head read (`lean_http::MAX_HEAD`).
pub const MAX_HEAD: usize = 64 << 10;

/// An answer read whole: its status, its `Agentos-Seq`, and where its body is (a chunked body
/// is joined in place, so the range is into the buffer as it is after [`complete`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub seq: Option<u64>,
    pub body: core::ops::Range<usize>,
}

/// Why an answer cannot be read, in `lean_http`'s words.
pub type Bad = &'static str;

/// `lean_http::complete` for a request that is not `HEAD`: the answer in `raw[..len]` once all
/// of it is there, `None` while more is to come.
pub fn complete(raw: &mut [u8], eof: bool) -> Result<Option<Answer>, Bad> {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        if raw.len() > MAX_HEAD {
            return Err("the answer's head is too long");
        }
        return Ok(None);
    };
    let head = core::str::from_utf8(&raw[..end]).map_err(|_| "the answer's head is not text")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| status_line.starts_with("HTTP/1."))
        .ok_or("the answer does not start with an HTTP/1 status line")?;
    let mut length = None;
    let mut chunked = None;
    let mut seq = None;
    for (name, value) in lines.filter_map(|l| l.split_once(':')) {
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") && length.is_none() {
            length = Some(value);
        } else if name.eq_ignore_ascii_case("transfer-encoding") && chunked.is_none() {
            chunked = Some(value.eq_ignore_ascii_case("chunked"));
        } else if name.eq_ignore_ascii_case("agentos-seq") && seq.is_none() {
            seq = Some(parse_u64(value.as_bytes()));
        }
    }
    let seq = seq.flatten();
    let start = end + 4;
    let body = if chunked == Some(true) {
        match dechunk(raw, start)? {
            Some(len) => start..start + len,
            None => return Ok(None),
        }
    } else if let Some(len) = length {
        let len = parse_u64(len.as_bytes()).ok_or("the answer's Content-Length is not a number")? as usize;
        if raw.len() - start < len {
            return Ok(None);
        }
        start..start + len
    } else if status == 204 || status == 304 || (100..200).contains(&status) {
        start..start
    } else if eof {
        start..raw.len()
    } else {
        return Ok(None);
    };
    Ok(Some(Answer { status, seq, body }))
}

/// Joins the chunks after `start` in place once its last chunk is there (nothing is moved
/// before): the body's length.
fn dechunk(raw: &mut [u8], start: usize) -> Result<Option<usize>, Bad> {
    for join in [false, true] {
        let (mut read, mut written) = (start, start);
        loop {
            let rest = &raw[read..];
            let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else { return Ok(None) };
            let size_text = core::str::from_utf8(&rest[..eol]).map_err(|_| "a chunk size is not text")?;
            let size_text = size_text.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_text, 16).map_err(|_| "a chunk size is not hexadecimal")?;
            read += eol + 2;
            if size == 0 {
                if join {
                    return Ok(Some(written - start));
                }
                break;
            }
            let with_end = size.checked_add(2).ok_or("a chunk size is too large")?;
            if raw.len() - read < with_end {
                return Ok(None);
            }
            if join {
                raw.copy_within(read..read + size, written);
            }
            written += size;
            read += with_end;
        }
    }
    Ok(None)
}

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
        0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
        0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
        0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
        0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
        0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
        0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] =
        [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
    let bits = (data.len() as u64).wrapping_mul(8);
    let mut block = [0u8; 64];
    let blocks = (data.len() + 9).div_ceil(64);
    for n in 0..blocks {
        for (i, byte) in block.iter_mut().enumerate() {
            let at = n * 64 + i;
            *byte = match at {
                _ if at < data.len() => data[at],
                _ if at == data.len() => 0x80,
                _ if n == blocks - 1 && i >= 56 => (bits >> (8 * (63 - i))) as u8,
                _ => 0,
            };
        }
        let mut w = [0u32; 64];
        for i in 0..16 {
            w[i] = u32::from_be_bytes([block[4 * i], block[4 * i + 1], block[4 * i + 2], block[4 * i + 3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh.wrapping_add(s1).wrapping_add(ch).wrapping_add(K[i]).wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            (hh, g, f, e, d, c, b, a) = (g, f, e, d.wrapping_add(t1), c, b, a, t1.wrapping_add(t2));
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (i, word) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&word.to_be_bytes());
    }
    out
}

/// Whether `body` is already what the whole shim prints for it: the compact text `serde_json`
/// writes of the value it reads back (keys sorted and unique, no space between tokens, its own
/// escapes, valid UTF-8, floats in their shortest form). The master's answers are; anything else
/// (another server at that address, a float whose digits are not checked here) is handed over to
/// be read back.
pub fn printed_as_is(body: &[u8]) -> bool {
    if core::str::from_utf8(body).is_err() || body.first() != Some(&b'{') {
        return false;
    }
    // The open containers: whether each is an object, and the last key seen in it. Past 100
    // (`serde_json` reads 128 deep at most, and the whole shim prints what it cannot read as a
    // string) the answer is handed over.
    const DEPTH: usize = 100;
    let mut objects = [false; DEPTH];
    let mut last_key: [&[u8]; DEPTH] = [&[]; DEPTH];
    let mut has_key = [false; DEPTH];
    let mut depth = 0;
    let mut i = 0;
    // What may come next: a value, or (after one) a `,` or the container's end.
    let mut want_value = true;
    loop {
        let Some(&c) = body.get(i) else { return false };
        if want_value {
            match c {
                b'{' | b'[' => {
                    let close = if c == b'{' { b'}' } else { b']' };
                    i += 1;
                    if body.get(i) == Some(&close) {
                        i += 1;
                        want_value = false;
                    } else {
                        if depth == DEPTH {
                            return false;
                        }
                        (objects[depth], has_key[depth]) = (c == b'{', false);
                        depth += 1;
                        if c == b'{' && !key(body, &mut i, &mut last_key[depth - 1], &mut has_key[depth - 1]) {
                            return false;
                        }
                        continue;
                    }
                }
                b'"' => {
                    let Some(end) = string(body, i) else { return false };
                    i = end;
                    want_value = false;
                }
                b't' | b'f' | b'n' => {
                    let word: &[u8] = match c {
                        b't' => b"true",
                        b'f' => b"false",
                        _ => b"null",
                    };
                    if !body[i..].starts_with(word) {
                        return false;
                    }
                    i += word.len();
                    want_value = false;
                }
                b'-' | b'0'..=b'9' => {
                    let start = i;
                    i += usize::from(c == b'-');
                    let digits_start = i;
                    while body.get(i).is_some_and(u8::is_ascii_digit) {
                        i += 1;
                    }
                    let d = &body[digits_start..i];
                    if matches!(body.get(i), Some(b'.' | b'e' | b'E')) {
                        // A float: its whole text, up to the next `,`, `]` or `}`.
                        while body.get(i).is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-'))
                        {
                            i += 1;
                        }
                        if !float_as_written(&body[start..i]) {
                            return false;
                        }
                    } else {
                        if d.is_empty() || (d.len() > 1 && d[0] == b'0') {
                            return false;
                        }
                        // Integers within what `serde_json` keeps as one (`u64`, or `i64` below 0).
                        let Some(n) = parse_u64(d) else { return false };
                        if c == b'-' && (n == 0 || n > 1 << 63) {
                            return false;
                        }
                    }
                    want_value = false;
                }
                _ => return false,
            }
            if depth == 0 {
                return i == body.len();
            }
            continue;
        }
        // After a value: the next member or element, or the end of the container.
        let object = objects[depth - 1];
        match c {
            b',' => {
                i += 1;
                if object && !key(body, &mut i, &mut last_key[depth - 1], &mut has_key[depth - 1]) {
                    return false;
                }
                want_value = true;
            }
            b'}' if object => {
                i += 1;
                depth -= 1;
            }
            b']' if !object => {
                i += 1;
                depth -= 1;
            }
            _ => return false,
        }
        if depth == 0 {
            return i == body.len();
        }
    }
}

/// Whether `t`, a number with a fraction or an exponent, is the text `serde_json` writes of the
/// `f64` it reads back: the shortest digits that read back as that `f64` (`core` finds them as
/// `serde_json`'s formatter does), laid out as that formatter lays them out. `core` reads `t` as
/// `serde_json` does: both round the exact value to the nearest `f64` (the workspace builds
/// `serde_json` with `float_roundtrip`). Anything else is handed over.
pub fn float_as_written(t: &[u8]) -> bool {
    let (negative, rest) = match t.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, t),
    };
    let int_len = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    let (int, rest) = rest.split_at(int_len);
    let (frac, rest) = match rest.split_first() {
        Some((b'.', r)) => r.split_at(r.iter().take_while(|b| b.is_ascii_digit()).count()),
        _ => (&[][..], rest),
    };
    let exp: i64 = match rest.split_first() {
        None => 0,
        Some((b'e', e)) => {
            let (minus, e) = match e.split_first() {
                Some((b'-', e)) => (true, e),
                Some((b'+', e)) => (false, e),
                _ => return false,
            };
            match digits(e) {
                Some(n) if n < 1000 && !e.starts_with(b"0") => {
                    if minus {
                        -(n as i64)
                    } else {
                        n as i64
                    }
                }
                _ => return false,
            }
        }
        _ => return false,
    };
    // The digits as one integer `m` and the power of ten `k` it is multiplied by, with no zero
    // at either end.
    let all = || int.iter().chain(frac.iter());
    let lead = all().take_while(|b| **b == b'0').count();
    let trail = all().rev().take_while(|b| **b == b'0').count();
    let total = int.len() + frac.len();
    if int.is_empty() {
        return false;
    }
    if lead == total {
        return t == b"0.0" || t == b"-0.0";
    }
    // An `f64`'s shortest digits are 17 at most.
    let significant = total - lead - trail;
    if significant > 17 {
        return false;
    }
    let m = all().skip(lead).take(significant).fold(0u64, |n, b| n * 10 + u64::from(b - b'0'));
    let k = exp - frac.len() as i64 + trail as i64;
    let Ok(text) = core::str::from_utf8(t) else { return false };
    let Ok(x) = text.parse::<f64>() else { return false };
    let x = x.abs();
    if !x.is_finite() || x == 0.0 {
        return false;
    }
    // `core`'s shortest digits of `x`, as `d.ddde-n`: they must be `m`'s.
    let mut buf = [0u8; 40];
    let mut shortest = Out::new(&mut buf);
    if core::fmt::write(&mut shortest, format_args!("{x:e}")).is_err() {
        return false;
    }
    let Some(shortest) = shortest.written() else { return false };
    let Some(e_at) = shortest.iter().position(|b| *b == b'e') else { return false };
    let (mantissa, e) = (&shortest[..e_at], &shortest[e_at + 1..]);
    let mut ours = [0u8; 40];
    let mut mine = Out::new(&mut ours);
    mine.num(m);
    let Some(ours) = mine.written() else { return false };
    if !mantissa.iter().filter(|b| **b != b'.').eq(ours.iter()) {
        return false;
    }
    // Halfway between two numbers of as many digits, `core` rounds the last digit up and
    // `serde_json` to even: such a number is handed over.
    if is_decimal(x, m * 10 + 5, k - 1) || is_decimal(x, m * 10 - 5, k - 1) {
        return false;
    }
    let kk = significant as i64 + k;
    let printed_exp = kk - 1;
    let e_ok = match e.split_first() {
        Some((b'-', n)) => digits(n).is_some_and(|n| -(n as i64) == printed_exp),
        _ => digits(e).is_some_and(|n| n as i64 == printed_exp),
    };
    if !e_ok {
        return false;
    }
    // And laid out as `serde_json` lays them out (the `zmij` crate's `format_finite`): in full
    // from 10^-5 to below 10^16, with `.0` for a whole number; otherwise `d.ddde+n` or `de-n`.
    let mut laid = [0u8; 64];
    let mut out = Out::new(&mut laid);
    if negative {
        out.put(b"-");
    }
    let len = significant as i64;
    if k >= 0 && kk <= 16 {
        out.put(ours);
        for _ in 0..k {
            out.put(b"0");
        }
        out.put(b".0");
    } else if 0 < kk && kk <= 16 {
        out.put(&ours[..kk as usize]);
        out.put(b".");
        out.put(&ours[kk as usize..]);
    } else if -5 < kk && kk <= 0 {
        out.put(b"0.");
        for _ in 0..-kk {
            out.put(b"0");
        }
        out.put(ours);
    } else {
        out.put(&ours[..1]);
        if len > 1 {
            out.put(b".");
            out.put(&ours[1..]);
        }
        out.put(if printed_exp < 0 { b"e-" } else { b"e+" });
        out.num(printed_exp.unsigned_abs());
    }
    out.written() == Some(t)
}

/// Whether `x` is exactly `d` times 10^`j`, for `d` below 2^60. Outside `j` from -27 to 22 no
/// such `d` is exact: above, `d`·5^`j` has an odd part beyond any `f64`'s 2^53; below, `x` would
/// need 5^26 (more than 2^60) to divide `d`.
fn is_decimal(x: f64, d: u64, j: i64) -> bool {
    let bits = x.to_bits() & !(1 << 63);
    let (exp_bits, fraction) = ((bits >> 52) as i64, bits & ((1 << 52) - 1));
    // `x` is `mant` times 2^`e2`.
    let (mant, e2) =
        if exp_bits == 0 { (fraction as u128, -1074) } else { ((fraction | 1 << 52) as u128, exp_bits - 1075) };
    if !(-27..=22).contains(&j) || d >= 1 << 60 || mant == 0 {
        return false;
    }
    let five = |n: i64| (0..n).fold(1u128, |p, _| p * 5);
    // Both sides as integers times a power of two: x·10^-j = mant·5^-j·2^(e2-j) against d when
    // j < 0, and x = mant·2^e2 against d·5^j·2^j when j >= 0.
    let (left, right, shift) =
        if j < 0 { (mant * five(-j), d as u128, e2 - j) } else { (mant, d as u128 * five(j), e2 - j) };
    // left·2^shift == right
    if shift >= 0 {
        shift < 128 && left.checked_shl(shift as u32).is_some_and(|l| l >> shift == left && l == right)
    } else {
        let s = (-shift) as u32;
        s < 128 && left.trailing_zeros() >= s && left >> s == right
    }
}

impl core::fmt::Write for Out<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.put(s.as_bytes());
        if self.fits { Ok(()) } else { Err(core::fmt::Error) }
    }
}

/// A key and its `:` at `*i`, after the last one in byte order (so sorted and unique) and with
/// no escape in it (whose order would be the escaped text's).
fn key<'a>(body: &'a [u8], i: &mut usize, last: &mut &'a [u8], has: &mut bool) -> bool {
    if body.get(*i) != Some(&b'"') {
        return false;
    }
    let Some(end) = string(body, *i) else { return false };
    let text = &body[*i + 1..end - 1];
    if text.contains(&b'\\') || (*has && text <= *last) || body.get(end) != Some(&b':') {
        return false;
    }
    (*last, *has, *i) = (text, true, end + 1);
    true
}

/// The end (past the closing quote) of the string at `start`, when it has only the escapes
/// `serde_json` writes, no raw control character, and no character the whole shim escapes so
/// that it is inert where printed ([`unseen`]: it prints such an answer).
fn string(body: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        if body.get(i..).is_some_and(unseen) {
            return None;
        }
        match *body.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => {
                match *body.get(i + 1)? {
                    b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                    b'u' => {
                        let hex = body.get(i + 2..i + 6)?;
                        let lower = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
                        // Only a control character that has no short escape is written so.
                        let short = [b"0008", b"000c", b"000a", b"000d", b"0009"].iter().any(|s| hex == &s[..]);
                        if !hex.starts_with(b"00") || !matches!(hex[2], b'0' | b'1') || !lower(&hex[3]) || short {
                            return None;
                        }
                        i += 6;
                    }
                    _ => return None,
                }
            }
            0..=0x1f => return None,
            _ => i += 1,
        }
    }
}

/// Whether `at` starts with the UTF-8 of a character that JSON leaves as it is but that does not
/// show as itself, which the whole shim writes as its `\u` escape (`agentos_core::name::unseen`
/// past ASCII's controls, through `json_inert`): DEL, a C1 control (U+0080 to U+009F), the soft
/// hyphen, a bidirectional mark, override or isolate, a line or paragraph separator, a character
/// of no width, a blank filler, an interlinear annotation mark, a tag character.
pub fn unseen(at: &[u8]) -> bool {
    matches!(
        at,
        [0x7f, ..]
            | [0xc2, 0x80..=0x9f | 0xad, ..]
            | [0xd8, 0x9c, ..]
            | [0xe1, 0x85, 0x9f | 0xa0, ..]
            | [0xe1, 0xa0, 0x8e, ..]
            | [0xe2, 0x80, 0x8b..=0x8f | 0xa8..=0xae, ..]
            | [0xe2, 0x81, 0xa0 | 0xa6..=0xa9, ..]
            | [0xe3, 0x85, 0xa4, ..]
            | [0xef, 0xbb, 0xbf, ..]
            | [0xef, 0xbe, 0xa0, ..]
            | [0xef, 0xbf, 0xb9..=0xbb, ..]
            | [0xf3, 0xa0, 0x80 | 0x81, 0x80..=0xbf, ..]
    )
}
