//! The lean `agentos-shim`'s rules against the whole shim's: what it sends and reads must be
//! what `toolkit`, `call` and `lean_http` would.

use serde_json::json;

use crate::lean_logic::{self as lean, Call, Master, Out};

fn written(f: impl FnOnce(&mut Out)) -> Vec<u8> {
    let mut buf = vec![0u8; 1 << 16];
    let mut out = Out::new(&mut buf);
    f(&mut out);
    out.written().expect("fits").to_vec()
}

#[test]
fn strings_are_escaped_as_serde_json_writes_them() {
    let mut samples: Vec<String> = (0u8..128).map(|b| format!("a{}b", b as char)).collect();
    samples.extend(["", "plain", "ünïcödé ✓ 🦀", "\"quoted\" \\ back", "line\nbreak\ttab\r\u{7f}"].map(String::from));
    for s in samples {
        assert_eq!(written(|o| lean::json_str(o, s.as_bytes())), serde_json::to_vec(&s).unwrap(), "{s:?}");
    }
}

#[test]
fn a_model_is_form_encoded_as_the_url_crate_does() {
    for m in ["plain", "with space", "a/b?c=d&e", "ünï", "*-._~!'()", ""] {
        let want: String = url::form_urlencoded::byte_serialize(m.as_bytes()).collect();
        assert_eq!(written(|o| lean::form_value(o, m.as_bytes())), want.as_bytes(), "{m:?}");
    }
}

#[test]
fn the_request_is_the_one_the_whole_shim_sends() {
    let master = Master { ip: [127, 0, 0, 1], port: 7420 };
    let args: [&[u8]; 3] = [b"--city", "Zürich \"x\"\n".as_bytes(), b"--n=3"];
    let call = Call {
        master: &master,
        toolkit: b"weather",
        tool: b"forecast",
        args: &args,
        model: Some(b"team a"),
        token: b"tok",
        min_seq: Some(41),
    };
    let mut buf = vec![0u8; lean::request_room(&call)];
    let mut out = Out::new(&mut buf);
    lean::request(&mut out, &call);
    let sent = String::from_utf8(out.written().unwrap().to_vec()).unwrap();
    let body = serde_json::to_vec(&json!({"tool": "forecast", "args": ["--city", "Zürich \"x\"\n", "--n=3"]})).unwrap();
    let body = String::from_utf8(body).unwrap();
    let want = format!(
        "POST /api/tools/weather/call?model=team+a HTTP/1.1\r\nHost: 127.0.0.1:7420\r\nAuthorization: Bearer tok\r\n\
         Accept: */*\r\nAgentos-Min-Seq: 41\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(sent, want);
    // Port 80 is left out of the host, as the URL crate leaves a scheme's own port out.
    let m80 = Master { ip: [10, 1, 2, 3], port: 80 };
    let plain = Call { master: &m80, model: None, min_seq: None, args: &[], ..call };
    let mut buf = vec![0u8; lean::request_room(&plain)];
    let mut out = Out::new(&mut buf);
    lean::request(&mut out, &plain);
    let sent = String::from_utf8(out.written().unwrap().to_vec()).unwrap();
    assert!(sent.starts_with("POST /api/tools/weather/call HTTP/1.1\r\nHost: 10.1.2.3\r\n"), "{sent}");
    assert!(
        sent.ends_with("Content-Length: 29\r\nConnection: close\r\n\r\n{\"args\":[],\"tool\":\"forecast\"}"),
        "{sent}"
    );
    // A buffer too small says so rather than sending half.
    let mut small = [0u8; 40];
    let mut out = Out::new(&mut small);
    lean::request(&mut out, &plain);
    assert!(out.written().is_none());
}

#[test]
fn only_plain_masters_plain_calls_and_valid_toolkits_go_the_lean_way() {
    assert_eq!(lean::master_of(b"http://127.0.0.1:7420"), Some(Master { ip: [127, 0, 0, 1], port: 7420 }));
    assert_eq!(lean::master_of(b"http://10.0.0.255//"), Some(Master { ip: [10, 0, 0, 255], port: 80 }));
    for url in [
        "https://127.0.0.1:7420",
        "http://localhost:7420",
        "http://127.0.0.1:7420/base",
        "http://127.0.0.01:7420",
        "http://127.0.0.1:",
        "http://127.0.0.1:70000",
        "http://256.0.0.1",
        "http://1.2.3",
        "http://1.2.3.4.5",
        "http://[::1]:7420",
        "http://user@127.0.0.1",
        "HTTP://127.0.0.1",
        "http://127.0.0.1:7420?x",
    ] {
        assert_eq!(lean::master_of(url.as_bytes()), None, "{url}");
    }
    assert_eq!(lean::toolkit_of(b"/usr/local/bin/agentos-weather"), Some(&b"weather"[..]));
    for name in ["agentos-", "agentos-Weather", "agentos-a_b", "agentos", "weather", "agentos--x"] {
        assert_eq!(lean::toolkit_of(name.as_bytes()), None, "{name}");
    }
    let plain = |args: &[&[u8]]| lean::plain_call(args);
    assert!(plain(&[b"forecast", b"--city", b"Paris", b"--json", b"{}"]));
    assert!(plain(&[b"forecast", b"--", b"-x"]));
    assert!(!plain(&[]));
    assert!(!plain(&[b"--help"]));
    assert!(!plain(&[b"forecast", b"-h"]));
    assert!(!plain(&[b"forecast", b"--photo-file", b"a.png"]));
    assert!(!plain(&[b"forecast", b"--json-file=in.json"]));
    assert!(!plain(&[b"forecast", b"--city", b"\xff"]));
}

#[test]
fn numbers_text_and_paths_are_read_as_rust_reads_them() {
    for s in ["0", "+7", "18446744073709551615", "18446744073709551616", "", "+", "-1", "1 2", "x"] {
        assert_eq!(lean::parse_u64(s.as_bytes()), s.parse::<u64>().ok(), "{s:?}");
    }
    for s in ["  tok \n", "\t\x0b\x0ctok\r", "", "   ", "a b"] {
        assert_eq!(lean::trim(s.as_bytes()), s.trim().as_bytes(), "{s:?}");
    }
    assert!(lean::token_ok(b"sk-abc_123") && !lean::token_ok(b"a\x7fb") && !lean::token_ok(b"a\x1bb"));
    assert!(!lean::token_ok(b""), "an empty token is the whole shim's to word");
    for p in ["/tmp/seq", "rel/seq", "seq"] {
        assert!(lean::plain_path(p.as_bytes()), "{p}");
    }
    for p in ["", "/tmp/", "/tmp//seq", "/tmp/./seq", "../seq", "./seq", "/a/../seq"] {
        assert!(!lean::plain_path(p.as_bytes()), "{p}");
    }
    for (dir, name, want) in [("/a", "b", "/a/b"), ("/a/", "b", "/a/b"), ("", "b", "b")] {
        let joined = written(|o| lean::join(o, dir.as_bytes(), name.as_bytes()));
        assert_eq!(joined, std::path::Path::new(dir).join(name).as_os_str().as_encoded_bytes(), "{dir} {name}");
        assert_eq!(joined, want.as_bytes());
    }
}

#[test]
fn the_digest_and_the_sequence_file_name_are_the_whole_shims() {
    let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
    for len in [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 300] {
        let hex: String = lean::sha256(&data[..len]).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, agentos_core::sha256_hex(&data[..len]), "length {len}");
    }
    let token = "sk-agent-token";
    let want = format!("seq-{}", &agentos_core::sha256_hex(token.as_bytes())[..16]);
    assert_eq!(lean::seq_name(token.as_bytes()), want.as_bytes());
}

#[test]
fn answers_are_read_as_lean_http_reads_them() {
    let read = |raw: &[u8], eof: bool| {
        let mut raw = raw.to_vec();
        lean::complete(&mut raw, eof).map(|a| a.map(|a| (a.status, a.seq, raw[a.body].to_vec())))
    };
    let a = read(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nAgentos-Seq: 7\r\n\r\nhello", false).unwrap().unwrap();
    assert_eq!(a, (200, Some(7), b"hello".to_vec()));
    assert_eq!(read(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhel", false), Ok(None));
    assert_eq!(read(b"HTTP/1.1 200 OK\r\ncontent-len", false), Ok(None));
    let c = b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
    assert_eq!(read(c, false).unwrap().unwrap(), (403, None, b"abcde".to_vec()));
    // An incomplete chunked body is left as it came, to be read again with more.
    let mut partial = c[..c.len() - 7].to_vec();
    let before = partial.clone();
    assert_eq!(lean::complete(&mut partial, false), Ok(None));
    assert_eq!(partial, before);
    assert_eq!(read(b"HTTP/1.1 204 No Content\r\n\r\n", false).unwrap().unwrap(), (204, None, vec![]));
    assert!(read(b"SSH-2.0-OpenSSH\r\n\r\n", false).is_err());
    assert!(read(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n", false).is_err());
    assert!(read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", false).is_err());
    assert!(read(&vec![b'a'; lean::MAX_HEAD + 1], false).is_err());
    assert_eq!(read(b"HTTP/1.1 200 OK\r\n\r\nall of it", false), Ok(None));
    assert_eq!(read(b"HTTP/1.1 200 OK\r\n\r\nall of it", true).unwrap().unwrap(), (200, None, b"all of it".to_vec()));
    let huge = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nab";
    assert!(read(huge, false).is_err());
    assert!(lean::is_chunked(b"HTTP/1.1 200 OK\r\nTRANSFER-ENCODING: Chunked\r\n\r\n3\r\n"));
    assert!(lean::is_chunked(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked"));
    assert!(!lean::is_chunked(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntransfer-encoding: chunked"));
    // A sequence that is not a number is no sequence, as `parse::<u64>` leaves it.
    let a = read(b"HTTP/1.1 200 OK\r\nagentos-seq: x\r\ncontent-length: 0\r\n\r\n", false).unwrap().unwrap();
    assert_eq!(a.1, None);
}

#[test]
fn an_answer_is_printed_as_it_came_only_when_reading_it_back_would_not_change_it() {
    let canonical = |s: &str| {
        serde_json::from_str::<serde_json::Value>(s).is_ok_and(|v| serde_json::to_string(&v).is_ok_and(|t| t == s))
    };
    let samples = [
        r#"{"ok":true,"result":{}}"#,
        r#"{"ok":true,"result":{"a":[1,-2,null,true,false,"x"],"b":{"c":[]},"d":"\"q\" \\ \n\t\u0001é"}}"#,
        r#"{"a":18446744073709551615,"b":-9223372036854775808}"#,
        r#"{"a":18446744073709551616}"#,
        r#"{"a":-9223372036854775809}"#,
        r#"{"a":-0}"#,
        r#"{"a":1.5}"#,
        r#"{"a":1e3}"#,
        r#"{"a":01}"#,
        r#"{ "b":1 }"#,
        r#"{"b":1,"a":2}"#,
        r#"{"a":1,"a":2}"#,
        r#"{"a":"\u00e9"}"#,
        r#"{"a":"\/"}"#,
        r#"{"a":"\u000a"}"#,
        r#"{"a":"\u001F"}"#,
        r#"{"a":"\u001f"}"#,
        "{\"a\":\"\x01\"}",
        r#"{bad}"#,
        r#"{"a":1}x"#,
        r#"{"a":1"#,
        r#"{"a":[1,]}"#,
        r#"{"a":[,1]}"#,
        r#"{"a\"b":1}"#,
        r#"["not an object"]"#,
        r#"{"a":tru}"#,
        r#"{"a":{"b":{"c":[[[[{}]]]]}},"b":[{"x":1,"y":[2]}]}"#,
    ];
    for s in samples {
        // Never printed as it came unless reading it back gives the same text; the master's own
        // kinds of answer are printed as they came.
        let ours = lean::printed_as_is(s.as_bytes());
        assert!(!ours || canonical(s), "{s}");
        if s.starts_with('{') && canonical(s) && !s.contains('.') && !s.contains("e3") && !s.contains("\\\"b") {
            assert!(ours, "{s}");
        }
    }
    assert!(!lean::printed_as_is(b"{\"a\":\"\xff\"}"));
    for depth in [1, 50, 98, 99, 100, 127, 128, 129, 300] {
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(depth), "]".repeat(depth));
        let ours = lean::printed_as_is(deep.as_bytes());
        assert!(!ours || canonical(&deep), "{depth} deep");
        assert_eq!(ours, depth < 100, "{depth} deep");
    }
}

/// `serde_json`'s text of the value it reads from `s`, if it reads one.
fn rewritten(s: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(s).ok().and_then(|v| serde_json::to_string(&v).ok())
}

/// The digits (no zero at either end) and the power of ten of a number's text.
fn digits_and_power(t: &str) -> (String, i64) {
    let t = t.trim_start_matches('-');
    let (mantissa, exp) = t.split_once('e').map_or((t, 0), |(m, e)| (m, e.parse().unwrap()));
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{int}{frac}");
    let trimmed = all.trim_start_matches('0');
    let trail = trimmed.len() - trimmed.trim_end_matches('0').len();
    (trimmed.trim_end_matches('0').to_string(), exp - frac.len() as i64 + trail as i64)
}

#[test]
fn floats_are_printed_as_they_came_only_in_serde_jsons_shortest_form() {
    // A small generator, so that every run tries the same numbers.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut taken, mut tried, mut ties, mut long) = (0, 0, 0, 0);
    for round in 0..200_000 {
        // Numbers an agent's tool gives (a few digits, a modest power of ten), and any `f64` at all.
        let x = match round % 4 {
            0 => f64::from_bits(next()),
            1 => (next() % 1_000_000) as f64 / 10f64.powi((next() % 8) as i32),
            // What a tool computes: most of these take 17 digits (0.1 + 0.2).
            2 => (next() % 100_000) as f64 / 1000.0 * ((next() % 1000) as f64 / 7.0) + 0.1,
            _ => {
                let m = next() % 100_000_000_000_000_000;
                let k = (next() % 81) as i32 - 50;
                format!("{m}e{k}").parse().unwrap()
            }
        };
        if !x.is_finite() {
            continue;
        }
        let x = if next() % 2 == 0 { -x } else { x };
        let text = serde_json::to_string(&x).unwrap();
        if !text.contains(['.', 'e']) {
            continue;
        }
        tried += 1;
        let ours = lean::float_as_written(text.as_bytes());
        // Every text `serde_json` writes is taken, but for a halfway one.
        let (digits, _) = digits_and_power(&text);
        assert!(digits.len() <= 17, "{text}");
        // Halfway between two numbers of as many digits: `x`'s exact digits are those and a 5.
        let (all, _) =
            format!("{:.800e}", x.abs()).split_once('e').map(|(m, e)| (m.replace('.', ""), e.to_string())).unwrap();
        let halfway = all.trim_end_matches('0').len() == digits.len() + 1 && all.trim_end_matches('0').ends_with('5');
        assert_eq!(ours, !halfway || digits.is_empty(), "{text}");
        ties += usize::from(halfway);
        long += usize::from(ours && digits.len() == 17);
        taken += usize::from(ours);
        // Another text of a number near it is taken only when it is the one `serde_json` writes.
        let last = text.rfind(|c: char| c.is_ascii_digit()).unwrap();
        let mut other = text.clone().into_bytes();
        other[last] = b'0' + (other[last] - b'0' + 1 + (next() % 9) as u8) % 10;
        let other = String::from_utf8(other).unwrap();
        let doc = format!("{{\"a\":{other}}}");
        assert!(!lean::printed_as_is(doc.as_bytes()) || rewritten(&doc).as_deref() == Some(doc.as_str()), "{doc}");
    }
    assert!(taken * 3 > tried, "the short way takes most numbers a tool gives: {taken} of {tried}");
    assert!(ties > 0, "some numbers were halfway between two of as many digits");
    assert!(long * 10 > tried, "17 digits are taken too: {long} of {tried}");
    let samples = [
        ("1.5", true),
        ("-1.5", true),
        ("0.0", true),
        ("-0.0", true),
        ("100.0", true),
        ("0.001", true),
        ("0.0001", true),
        ("1e-5", false),
        ("0.00001", true),
        ("1e-6", true),
        ("1.5e-7", true),
        ("1e+16", true),
        ("1.2345e+20", true),
        ("1e+22", true),
        ("1e16", false),
        ("1.2345e20", false),
        ("9007199254740992.0", true),
        ("1e+23", true),
        ("1e23", false),
        ("0.30000000000000004", true),
        ("0.30000000000000005", false),
        ("-0.30000000000000004", true),
        ("300000000000000040.0", false),
        ("3.0000000000000004e+17", false),
        ("3.0000000000000006e+17", true),
        ("5e-324", true),
        ("4.9e-324", false),
        ("1.7976931348623157e+308", true),
        ("1.7976931348623159e+308", false),
        ("2.2250738585072014e-308", true),
        ("123456789012345678.0", false),
        ("1.2345678901234568e+17", true),
        ("0.1e1", false),
        // 767892885155262.25 exactly: `serde_json` writes .2, `core` .3; and at 17 digits,
        // 2^50 + 0.25.
        ("767892885155262.2", false),
        ("767892885155262.3", false),
        ("1125899906842624.2", false),
        ("1125899906842624.3", false),
        ("1.50", false),
        ("1.5e0", false),
        ("15e-1", false),
        ("1E-5", false),
        ("1e016", false),
        ("1e+016", false),
        ("10000000000000000.0", false),
        ("0.000001", false),
        ("1e+15", false),
        ("01.5", false),
        (".5", false),
        ("1.", false),
        ("-", false),
        ("0e0", false),
        ("0.00", false),
        ("1.0e", false),
        ("1.5x", false),
        ("1.5e-", false),
        ("1e99999999999999999999", false),
    ];
    for (text, taken) in samples {
        assert_eq!(lean::float_as_written(text.as_bytes()), taken, "{text}");
        let doc = format!("{{\"a\":[{text}]}}");
        assert_eq!(lean::printed_as_is(doc.as_bytes()), taken, "{doc}");
        if taken {
            assert_eq!(rewritten(&doc).as_deref(), Some(doc.as_str()));
        }
    }
    assert!(lean::printed_as_is(br#"{"ok":true,"result":{"celsius":21.5,"lat":51.5074,"lon":-0.1278,"n":3}}"#));
}

/// The lean shim hands over (to the whole shim, which writes them escaped) every answer with a
/// character the whole shim escapes, and prints the rest as they came.
#[test]
fn an_answer_with_a_character_that_does_not_show_is_not_printed_as_it_came() {
    for c in (0x7f..=0x10_ffff).filter_map(char::from_u32) {
        let mut utf8 = [0u8; 4];
        let bytes = c.encode_utf8(&mut utf8).as_bytes();
        assert_eq!(lean::unseen(bytes), agentos_core::name::unseen(c), "U+{:04X}", c as u32);
        let doc = serde_json::to_string(&serde_json::json!({"ok": true, "result": format!("a{c}b")})).unwrap();
        assert_eq!(lean::printed_as_is(doc.as_bytes()), !agentos_core::name::unseen(c), "U+{:04X}", c as u32);
    }
}
