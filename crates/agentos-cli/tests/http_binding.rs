//! The http binding end to end: a real HTTP service (Python's standard library server, started
//! by each test on 127.0.0.1) described by a hand-written OpenAPI document, registered with the
//! real binary and called through shims and the call API.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{BIN, Master, Out, run};
use serde_json::{Value, json};

/// Answers every request with what it received (as JSON) and writes it to a log, one line a
/// request. `/missing` is a 404, `/boom` a 500, `/redirect` a 302 to `other`, `/hop` a 302 to
/// `/items/hopped` on the same origin, `/slow` answers after 3 s, `/big` answers about 200 KB,
/// `/bytes` the 256 byte values, `/openapi.json` serves the document file.
const SERVICE: &str = r#"
import gzip, http.server, json, sys, time, urllib.parse
log_path, other, doc = sys.argv[1], sys.argv[2], sys.argv[3]
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def handle_any(self):
        n = int(self.headers.get('content-length') or 0)
        raw = self.rfile.read(n) if n else b''
        body = raw.decode('utf-8', 'replace')
        u = urllib.parse.urlsplit(self.path)
        rec = {'method': self.command, 'path': u.path, 'rawQuery': u.query,
               'query': urllib.parse.parse_qs(u.query),
               'headers': {k.lower(): v for k, v in self.headers.items()}, 'body': body, 'bodyHex': raw.hex()}
        with open(log_path, 'a') as f:
            f.write(json.dumps(rec) + '\n')
        status, ctype, extra, out = 200, 'application/json', {}, json.dumps(rec).encode()
        if u.path == '/openapi.json':
            out = open(doc, 'rb').read()
        elif u.path == '/missing':
            status, out = 404, b'{"error": "no such item"}'
        elif u.path == '/deep':
            status, out = 422, ('{"a":' * 125 + '1' + '}' * 125).encode()
        elif u.path == '/boom':
            status, ctype, out = 500, 'text/plain', b'internal failure: the database is down'
        elif u.path == '/redirect':
            status, extra, out = 302, {'Location': other + '/stolen'}, b''
        elif u.path == '/slow':
            time.sleep(3)
        elif u.path == '/hop':
            status, extra, out = 302, {'Location': '/items/hopped'}, b''
        elif u.path == '/big':
            out = json.dumps({'rows': ['x' * 100] * 2000}).encode()
        elif u.path == '/bytes':
            ctype, out = 'application/octet-stream', bytes(range(256))
        elif u.path == '/latin1':
            status = 200 if 'fail' not in u.query else 400
            ctype, out = 'text/plain; charset=ISO-8859-1', 'café – “quoted” €'.encode('cp1252')
        elif u.path == '/gzip':
            extra, out = {'Content-Encoding': 'gzip'}, gzip.compress(out)
        elif u.path == '/ctecho':
            ctype = 'application/json; x="%s"' % self.headers.get('authorization', '')
        elif u.path == '/escaped':
            auth = self.headers.get('authorization', '')
            status, out = 401, ('{"echo": "%s"}' % ''.join('\\u%04x' % ord(c) for c in auth)).encode()
        self.send_response(status)
        self.send_header('content-type', ctype)
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header('content-length', str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_any
srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

const DOCUMENT: &str = r#"
openapi: 3.0.3
info: {title: Items, version: "1.0"}
paths:
  /items/{id}:
    parameters:
      - {name: id, in: path, required: true, schema: {type: string}, description: The item}
    get:
      operationId: getItem
      summary: Read one item
      parameters:
        - {name: verbose, in: query, schema: {type: boolean}}
        - {name: tags, in: query, schema: {type: array, items: {type: string}}}
        - {name: X-Trace, in: header, schema: {type: string}}
        - {name: api_key, in: query, schema: {type: string}, description: A key the caller may try to set}
      responses: {"200": {description: the item}}
    put:
      operationId: updateItem
      summary: Replace one item
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [title]
              properties:
                id: {type: string}
                title: {type: string}
                note: {type: string, nullable: true}
      responses: {"200": {description: done}}
  /forms:
    post:
      operationId: postForm
      requestBody:
        content:
          application/x-www-form-urlencoded:
            schema:
              type: object
              properties:
                name: {type: string}
                count: {type: integer}
                address: {type: object, properties: {city: {type: string}, zip: {type: string}}}
      responses: {"200": {description: done}}
  /upload:
    post:
      operationId: upload
      requestBody:
        required: true
        content:
          multipart/form-data:
            schema:
              type: object
              required: [file]
              properties:
                file: {type: string, format: binary}
                purpose: {type: string}
      responses: {"200": {description: stored}}
  /raw:
    put:
      operationId: putRaw
      requestBody:
        required: true
        content:
          application/octet-stream:
            schema: {type: string, format: binary}
      responses: {"200": {description: stored}}
  /labels:
    post:
      operationId: addLabel
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [name]
              properties:
                name: {type: string}
              additionalProperties: {type: string}
      responses: {"200": {description: labelled}}
  /notes:
    post:
      operationId: postNote
      requestBody:
        required: true
        content:
          text/plain:
            schema: {type: string}
      responses: {"200": {description: stored}}
  /missing:
    get: {operationId: missing, responses: {"404": {description: never there}}}
  /boom:
    get: {operationId: boom, responses: {"500": {description: always fails}}}
  /deep:
    get: {operationId: deep, responses: {"422": {description: an error nested 125 deep}}}
  /redirect:
    get: {operationId: redirect, responses: {"302": {description: elsewhere}}}
  /slow:
    get: {operationId: slow, responses: {"200": {description: eventually}}}
  /hop:
    get: {operationId: hop, responses: {"302": {description: here, elsewhere}}}
  /big:
    get: {operationId: big, responses: {"200": {description: many rows}}}
  /bytes:
    get: {operationId: bytes, responses: {"200": {description: every byte value}}}
  /latin1:
    get:
      operationId: latin1
      parameters: [{name: fail, in: query, schema: {type: boolean}}]
      responses: {"200": {description: text in windows-1252}}
  /gzip:
    get: {operationId: gzip, responses: {"200": {description: the echo, gzip-encoded}}}
  /ctecho:
    get: {operationId: ctecho, responses: {"200": {description: the echo, the credential in its content type}}}
  /escaped:
    get: {operationId: escaped, responses: {"401": {description: the credential echoed, every character escaped}}}
"#;

/// A running service; killed when dropped.
struct Service {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Service {
    fn start(dir: &Path, name: &str, other: &str) -> Service {
        let script = dir.join("service.py");
        std::fs::write(&script, SERVICE).unwrap();
        let doc = dir.join("items.yaml");
        std::fs::write(&doc, DOCUMENT).unwrap();
        let log = dir.join(format!("{name}.log"));
        std::fs::write(&log, "").unwrap();
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(&log)
            .arg(other)
            .arg(&doc)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port: u16 = line.trim().parse().expect("the service prints its port");
        Service { child, url: format!("http://127.0.0.1:{port}"), log }
    }

    /// Every request the service received, oldest first.
    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn install(m: &Master, token: &str, dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    common::install_shims(m, token, &bin);
    bin
}

fn register_items(m: &Master, dir: &Path, service: &Service, extra: &[&str]) -> Out {
    let doc = dir.join("items.yaml");
    std::fs::write(&doc, DOCUMENT).unwrap();
    let mut args = vec!["catalog", "register-http", "--id", "items", "--base-url", &service.url];
    args.extend(["--openapi", doc.to_str().unwrap(), "--timeout-ms", "500", "--json"]);
    args.extend(extra);
    run(m, &m.token, Path::new(BIN), &args)
}

#[test]
fn every_operation_of_a_document_is_a_tool_called_through_its_shim_and_the_call_api() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let elsewhere = Service::start(dir.path(), "elsewhere", "");
    let service = Service::start(dir.path(), "items", &elsewhere.url);
    let out = register_items(&m, dir.path(), &service, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let entry = out.json();
    assert_eq!(entry["status"], "registered");
    assert_eq!(entry["version"], "1.0", "the document's info.version");
    assert_eq!(entry["scope"], "global");
    let ops: Vec<&str> = entry["contract"]["operations"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        ops,
        [
            "add-label",
            "big",
            "boom",
            "bytes",
            "ctecho",
            "deep",
            "escaped",
            "get-item",
            "gzip",
            "hop",
            "latin1",
            "missing",
            "post-form",
            "post-note",
            "put-raw",
            "redirect",
            "slow",
            "update-item",
            "upload"
        ]
    );
    let sha = entry["binding"]["sha256"].as_str().unwrap();
    assert_eq!(sha, common::sha256_hex(DOCUMENT.as_bytes()));
    assert_eq!(entry["binding"]["openapiUrn"], format!("urn:agentos:blob:tool-catalog/openapi/{sha}.yaml"));
    // The pinned document is readable as a blob by whoever sees the entry.
    let (status, bytes) =
        m.client().get_bytes(&format!("/api/blobs/{}", entry["binding"]["openapiUrn"].as_str().unwrap()));
    assert_eq!((status, bytes.as_slice()), (200, DOCUMENT.as_bytes()));

    let bin = install(&m, &m.token, dir.path());
    let items = bin.join("agentos-items");

    // Help and the prompt are drawn from the contract, as for every kind.
    let out = run(&m, &m.token, &items, &["get-item", "--help"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    for flag in ["--id", "--verbose", "--tags", "--x-trace", "Read one item"] {
        assert!(out.stdout.contains(flag), "{flag}: {}", out.stdout);
    }
    // A toolkit of many tools: its command once, then one line a tool.
    let out = run(&m, &m.token, Path::new(BIN), &["prompt"]);
    assert!(out.stdout.contains("`agentos-items <tool>`:\n"), "{}", out.stdout);
    assert!(out.stdout.contains("\n- `update-item --path-id ID --title TITLE"), "{}", out.stdout);

    // Path, query (an array among them) and header parameters.
    let out = run(
        &m,
        &m.token,
        &items,
        &["get-item", "--id", "a b/c", "--verbose", "--tags", "red", "--tags", "blue", "--x-trace", "t-1"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    assert_eq!(v["ok"], true);
    assert_eq!(v["result"]["status"], 200);
    assert_eq!(v["result"]["contentType"], "application/json");
    let seen = &v["result"]["body"];
    assert_eq!(seen["path"], "/items/a%20b%2Fc", "the path value is escaped whole: {seen}");
    assert_eq!(seen["query"]["tags"], json!(["red", "blue"]));
    assert_eq!(seen["query"]["verbose"], json!(["true"]));
    assert_eq!(seen["headers"]["x-trace"], "t-1");
    assert!(v["result"]["headers"]["content-length"].is_string(), "{v}");

    // A URL past what a request carries is the caller's to mend (exit 2), said in a short line.
    let long = "x".repeat(70_000);
    let out = run(&m, &m.token, &items, &["get-item", "--id", &long]);
    assert_eq!(out.code, 2, "{}", &out.stderr[..out.stderr.len().min(500)]);
    assert!(out.stderr.contains("past the 65534 a request carries"), "{}", &out.stderr[..out.stderr.len().min(500)]);
    assert!(out.stderr.len() < 1000, "{} bytes of error", out.stderr.len());

    // A name in two locations: the path's id and the body's id are two flags.
    let out = run(&m, &m.token, &items, &["update-item", "--path-id", "7", "--body-id", "b-7", "--title", "New"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let seen = &out.json()["result"]["body"];
    assert_eq!(seen["method"], "PUT");
    assert_eq!(seen["path"], "/items/7");
    assert_eq!(seen["headers"]["content-type"], "application/json");
    let body: Value = serde_json::from_str(seen["body"].as_str().unwrap()).unwrap();
    assert_eq!(body, json!({"id": "b-7", "title": "New"}));
    let out = run(&m, &m.token, &items, &["update-item", "--path-id", "7"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--title"), "{}", out.stderr);
    // A nullable text field: `--note null` is the text, `--no-note` the null, sent as written.
    for (flag, want) in [(&["--note", "null"][..], json!("null")), (&["--no-note"][..], json!(null))] {
        let args = [&["update-item", "--path-id", "7", "--title", "New"][..], flag].concat();
        let out = run(&m, &m.token, &items, &args);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let body: Value = serde_json::from_str(out.json()["result"]["body"]["body"].as_str().unwrap()).unwrap();
        assert_eq!(body, json!({"title": "New", "note": want}), "{flag:?}");
    }
    let out = run(&m, &m.token, &items, &["update-item", "--help"]);
    assert!(out.stdout.contains("(--no-note for null)"), "{}", out.stdout);

    // A form body, through the call API.
    let (status, v) = m
        .client()
        .post("/api/tools/items/call", json!({"tool": "post-form", "args": ["--name", "Ann Lee", "--count", "3"]}));
    assert_eq!(status, 200, "{v}");
    let seen = &v["result"]["body"];
    assert_eq!(seen["headers"]["content-type"], "application/x-www-form-urlencoded");
    assert_eq!(seen["body"], "count=3&name=Ann+Lee");
    // A nested object of a form body: its fields are fields of the form (style form, exploded).
    let out =
        run(&m, &m.token, &items, &["post-form", "--name", "x", "--address.city", "Zürich", "--address.zip", "80"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json()["result"]["body"]["body"], "city=Z%C3%BCrich&zip=80&name=x");

    // Files: `--FLAG-file PATH` sends a file as a string flag's value; a binary field gets its
    // bytes, its name and its type, a text field its text.
    let photo = dir.path().join("cat photo.png");
    let bytes: Vec<u8> = (0..=255u8).chain([0, 13, 10, b'"']).collect();
    std::fs::write(&photo, &bytes).unwrap();
    let out = run(&m, &m.token, &items, &["upload", "--file-file", photo.to_str().unwrap(), "--purpose", "vision"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let seen = &out.json()["result"]["body"];
    let ct = seen["headers"]["content-type"].as_str().unwrap();
    let boundary = ct.strip_prefix("multipart/form-data; boundary=").unwrap_or_else(|| panic!("{ct}"));
    let raw = hex_decode(seen["bodyHex"].as_str().unwrap());
    let mut want = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"cat photo.png\"\r\nContent-Type: image/png\r\n\r\n"
    )
    .into_bytes();
    want.extend_from_slice(&bytes);
    want.extend_from_slice(
        format!(
            "\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nvision\r\n--{boundary}--\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(raw, want, "{}", String::from_utf8_lossy(&raw));
    let out = run(&m, &m.token, &items, &["put-raw", "--body-file", photo.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let seen = &out.json()["result"]["body"];
    assert_eq!(seen["headers"]["content-type"], "application/octet-stream");
    assert_eq!(hex_decode(seen["bodyHex"].as_str().unwrap()), bytes);
    let note = dir.path().join("note.txt");
    std::fs::write(&note, "first line\nsecond: ünïcode\n").unwrap();
    let out = run(&m, &m.token, &items, &["post-note", "--body-file", note.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json()["result"]["body"]["body"], "first line\nsecond: ünïcode\n");
    // A body that takes keys beyond its named ones takes them as one object.
    let out = run(&m, &m.token, &items, &["add-label", "--name", "urgent", "--extra-fields", r#"{"color":"red"}"#]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let sent: Value = serde_json::from_str(out.json()["result"]["body"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent, json!({"name": "urgent", "color": "red"}));
    // Of the type the document gives them.
    let out = run(&m, &m.token, &items, &["add-label", "--name", "urgent", "--extra-fields", r#"{"n":1}"#]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--extra-fields"), "{}", out.stderr);
    // Bytes where text is expected, and a file that is not there: one line that says so.
    let out = run(&m, &m.token, &items, &["post-note", "--body-file", photo.to_str().unwrap()]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("not UTF-8 text, and --body takes text"), "{}", out.stderr);
    let out = run(&m, &m.token, &items, &["post-note", "--body-file", "/nonexistent/n.txt"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--body-file /nonexistent/n.txt: No such file"), "{}", out.stderr);
    // Over the API there is no file to read: the content goes as the flag, bytes as a data URL.
    let (status, v) = m.client().post(
        "/api/tools/items/call",
        json!({"tool": "put-raw", "args": ["--body", "data:application/octet-stream;base64,AAEC"]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["body"]["bodyHex"], "000102");
    let (status, v) =
        m.client().post("/api/tools/items/call", json!({"tool": "put-raw", "args": ["--body-file", "/etc/passwd"]}));
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("takes a path that the agentos-<toolkit> shell command reads"),
        "{v}"
    );

    // A status outside 2xx is a tool failure: exit 5 with the status and an excerpt.
    let out = run(&m, &m.token, &items, &["missing"]);
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert!(out.stderr.contains("answered 404") && out.stderr.contains("no such item"), "{}", out.stderr);
    // The toolkit and tool are named once, by the command's own label.
    assert!(out.stderr.starts_with("agentos-items missing: GET "), "{}", out.stderr);
    // What the service answered is on stdout, whole, in the failure's shape: an agent acts on a
    // validation error's details, which the line's excerpt may cut.
    let failure = out.json();
    assert_eq!(failure["ok"], false, "{failure}");
    assert_eq!(failure["error"]["code"], "http_status", "{failure}");
    assert_eq!(failure["error"]["response"]["status"], 404, "{failure}");
    assert_eq!(failure["error"]["response"]["body"], json!({"error": "no such item"}), "{failure}");
    assert_eq!(failure["error"]["response"]["contentType"], "application/json", "{failure}");
    let out = run(&m, &m.token, &items, &["boom"]);
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert!(out.stderr.contains("answered 500: internal failure: the database is down"), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert_eq!(out.json()["error"]["response"]["body"], "internal failure: the database is down");
    // An error nested deeper than a token may be comes as its text: wrapped in the failure, its
    // JSON would pass what a reader takes.
    let out = run(&m, &m.token, &items, &["deep"]);
    assert_eq!(out.code, 5, "{}", out.stderr);
    let body = out.json()["error"]["response"]["body"].clone();
    assert!(body.as_str().is_some_and(|t| t.starts_with(r#"{"a":{"a":"#)), "{body}");
    // The call API gives it as the error's `response`.
    let (status, v) = m.client().post("/api/tools/items/call", json!({"tool": "missing", "args": []}));
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["response"]["status"], 404, "{v}");
    assert_eq!(v["error"]["response"]["body"]["error"], "no such item", "{v}");
    // Over MCP it is a second block of text beside the error line.
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}});
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "items_missing", "arguments": {}, "_meta": meta}});
    let resp = common::http()
        .post(format!("{}/mcp", m.url))
        .bearer_auth(&m.token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "items_missing")
        .json(&body)
        .send()
        .unwrap();
    let text = resp.text().unwrap();
    let message: Value = text
        .lines()
        .map(|l| l.strip_prefix("data: ").unwrap_or(l))
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no message: {text}"));
    let result = &message["result"];
    assert_eq!(result["isError"], true, "{message}");
    assert!(result["content"][0]["text"].as_str().unwrap().contains("answered 404"), "{message}");
    let answered: Value = serde_json::from_str(result["content"][1]["text"].as_str().unwrap()).unwrap();
    assert_eq!((answered["status"].as_u64(), &answered["body"]["error"]), (Some(404), &json!("no such item")));
    // A failure that is not the service's answer carries none.
    let (status, v) = m.client().post("/api/tools/items/call", json!({"tool": "missing", "args": ["--nope", "1"]}));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].get("response").is_none(), "{v}");

    // A redirect to another origin is not followed: its 302 is the answer.
    let out = run(&m, &m.token, &items, &["redirect"]);
    assert_eq!(out.code, 5, "{}", out.stderr);
    let said = format!(
        "answered 302 (a redirect to \"{}/stolen\", not followed: redirects are followed within the origin only)",
        elsewhere.url
    );
    assert!(out.stderr.contains(&said), "{}", out.stderr);
    assert!(elsewhere.requests().is_empty(), "the other origin was reached: {:?}", elsewhere.requests());

    // A redirect within the origin is followed.
    let out = run(&m, &m.token, &items, &["hop"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json()["result"]["body"]["path"], "/items/hopped");

    // A large answer is offloaded to a blob of the caller's model, like script output.
    let out = run(&m, &m.token, &items, &["big"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let result = &out.json()["result"];
    let blob = &result["bodyBlob"];
    assert!(blob["sizeBytes"].as_u64().unwrap() > 128 * 1024, "{blob}");
    assert!(result["body"].as_str().unwrap().starts_with("{\"rows\""), "a preview inline");
    let (status, bytes) = m.client().get_bytes(&format!("/api/blobs/{}", blob["urn"].as_str().unwrap()));
    assert_eq!(status, 200);
    let whole: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(whole["rows"].as_array().unwrap().len(), 2000);

    // Bytes that are not text go to a blob whatever their size, exactly; the body says so.
    let out = run(&m, &m.token, &items, &["bytes"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let result = &out.json()["result"];
    assert_eq!(
        result["body"], "256 bytes of application/octet-stream, not text: the bytes are in bodyBlob",
        "{result}"
    );
    let (status, bytes) = m.client().get_bytes(&format!("/api/blobs/{}", result["bodyBlob"]["urn"].as_str().unwrap()));
    assert_eq!((status, bytes), (200, (0..=255u8).collect::<Vec<u8>>()));

    // Text in a Western single-byte charset (latin1, windows-1252) is the text it is, as UTF-8,
    // and its content type says so; an error's answer too.
    let out = run(&m, &m.token, &items, &["latin1"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let result = &out.json()["result"];
    assert_eq!(result["body"], "café – “quoted” €", "{result}");
    assert_eq!(result["contentType"], "text/plain; charset=utf-8", "{result}");
    let out = run(&m, &m.token, &items, &["latin1", "--fail"]);
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert!(out.stderr.contains("answered 400: café – “quoted” €"), "{}", out.stderr);

    // An answer slower than the service's timeout is a timed-out call.
    let out = run(&m, &m.token, &items, &["slow"]);
    assert_eq!(out.code, 6, "{}", out.stderr);
    assert!(out.stderr.contains("timed out after 500 ms"), "{}", out.stderr);

    // The invoke API runs one operation only: it names the way to call one.
    let (status, v) = m.client().invoke("items", json!({"input": {}}));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("agentos-items OPERATION"), "{v}");
    let resp = common::http()
        .post(format!("{}/api/tools/items/invoke", m.url))
        .bearer_auth(&m.token)
        .header("prefer", "respond-async")
        .json(&json!({"input": {}}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let v: Value = resp.json().unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("is an http service: it answers synchronously"), "{v}");

    // A service that is down (nothing listens at its address) is a call to try again later
    // (exit 6, 504 `service_down`), not a tool that failed.
    drop(service);
    let out = run(&m, &m.token, &items, &["get-item", "--json", r#"{"id": "1"}"#]);
    assert_eq!(out.code, 6, "{}", out.stderr);
    assert!(out.stderr.contains("nothing answers at the service's address now: try again later"), "{}", out.stderr);
    // The URL once, where the line starts, not again inside the client's words.
    assert_eq!(out.stderr.matches("/items/1").count(), 1, "{}", out.stderr);
    assert_eq!(out.json()["error"]["code"], "service_down", "{}", out.stdout);
    assert_eq!(out.json()["error"]["status"], 504, "{}", out.stdout);
}

#[test]
fn the_credential_reaches_the_service_and_appears_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("master.log");
    let m = Master::start_logged(&dir.path().join("master"), &log, &[]);
    let service = Service::start(dir.path(), "items", "");
    let api = m.client();
    let token = "tok-7f3a9c2e1b5d4e60-canary";
    let key = "key-0c9d8e7f6a5b4c3d-canary";
    assert_eq!(api.put("/api/secrets/ITEMS_TOKEN", json!({"value": token})).0, 200);
    assert_eq!(api.put("/api/secrets/ITEMS_KEY", json!({"value": key})).0, 200);

    // Not granted to the service's origin: refused, with the command that grants it.
    let out = register_items(&m, dir.path(), &service, &["--auth", "bearer:ITEMS_TOKEN"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    let grant = format!("agentos secret grant ITEMS_TOKEN --origin {}", service.url);
    assert!(out.stderr.contains(&grant), "{}", out.stderr);

    for name in ["ITEMS_TOKEN", "ITEMS_KEY"] {
        let (s, v) = api.post(&format!("/api/secrets/{name}/grants"), json!({"origin": service.url}));
        assert_eq!(s, 200, "{v}");
    }
    let out = register_items(&m, dir.path(), &service, &["--auth", "bearer:ITEMS_TOKEN"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json()["binding"]["auth"], json!({"type": "bearer", "secret": "ITEMS_TOKEN"}));
    let bin = install(&m, &m.token, dir.path());
    let out = run(&m, &m.token, &bin.join("agentos-items"), &["get-item", "--id", "1"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let seen = service.requests().pop().unwrap();
    assert_eq!(seen["headers"]["authorization"], format!("Bearer {token}"), "the credential reaches the service");
    // The service echoes the header; the answer does not carry it.
    assert!(!out.stdout.contains(token), "{}", out.stdout);
    assert!(
        out.json()["result"]["body"]["headers"]["authorization"].as_str().unwrap().contains("[redacted]"),
        "{}",
        out.stdout
    );
    // A gzip-encoded answer is decoded, so its echo is redacted like any other, and the caller
    // reads JSON, not compressed bytes.
    let out = run(&m, &m.token, &bin.join("agentos-items"), &["gzip"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stdout.contains(token), "{}", out.stdout);
    let body = &out.json()["result"]["body"];
    assert_eq!(body["path"], "/gzip", "{body}");
    assert_eq!(body["headers"]["authorization"], "Bearer [redacted]", "{body}");
    // Regression: the answer's content type, which a service may set as it likes, carried the
    // echoed credential unredacted.
    let out = run(&m, &m.token, &bin.join("agentos-items"), &["ctecho"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stdout.contains(token), "{}", out.stdout);
    assert_eq!(out.json()["result"]["contentType"], "application/json; x=\"Bearer [redacted]\"", "{}", out.stdout);
    // A failed answer's JSON that spells the credential in escapes is redacted as read (in the
    // line's excerpt, which quotes the body as written, the escapes before it stay).
    let out = run(&m, &m.token, &bin.join("agentos-items"), &["escaped"]);
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert!(!out.stderr.contains(token) && out.stderr.contains("[redacted]"), "{}", out.stderr);
    // So is the whole answer the failure carries on stdout.
    assert!(!out.stdout.contains(token), "{}", out.stdout);
    assert_eq!(out.json()["error"]["response"]["body"]["echo"], "Bearer [redacted]", "{}", out.stdout);

    // `auth: query` sends the credential as the named query parameter only: the operation's own
    // parameter of that name is not offered, since the credential would replace its value.
    let out = register_items(&m, dir.path(), &service, &["--auth", "query:api_key:ITEMS_KEY"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let (status, v) = api.post(
        "/api/tools/items/call",
        json!({"tool": "get-item", "args": ["--id", "2", "--verbose", "--api-key", "the-caller-s-own"]}),
    );
    assert_eq!((status, v["error"]["message"].as_str()), (400, Some("unknown flag --api-key")), "{v}");
    let (status, v) =
        api.post("/api/tools/items/call", json!({"tool": "get-item", "args": ["--id", "2", "--verbose"]}));
    assert_eq!(status, 200, "{v}");
    let seen = service.requests().pop().unwrap();
    assert_eq!(seen["query"]["api_key"], json!([key]), "the credential is the parameter's one value");
    assert_eq!(seen["query"]["verbose"], json!(["true"]));
    assert!(seen["headers"].get("authorization").is_none(), "{seen}");
    assert!(!v.to_string().contains(key), "{v}");
    // A failure names the URL without the credential.
    let (status, v) = api.post("/api/tools/items/call", json!({"tool": "missing", "args": []}));
    assert_eq!(status, 422, "{v}");
    assert!(!v.to_string().contains(key), "{v}");

    // `auth: header` and `auth: basic` put it where they say.
    let out = register_items(&m, dir.path(), &service, &["--auth", "header:X-Api-Key:ITEMS_KEY"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let (status, v) = api.post("/api/tools/items/call", json!({"tool": "get-item", "args": ["--id", "3"]}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(service.requests().pop().unwrap()["headers"]["x-api-key"], key);
    let out = register_items(&m, dir.path(), &service, &["--auth", "basic:ITEMS_TOKEN"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let (status, v) = api.post("/api/tools/items/call", json!({"tool": "get-item", "args": ["--id", "4"]}));
    assert_eq!(status, 200, "{v}");
    use base64::Engine as _;
    let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(token));
    assert_eq!(service.requests().pop().unwrap()["headers"]["authorization"], basic);

    // Neither the event log as the API answers it nor anything the master stored holds either value.
    let (status, events) = api.get("/api/events?limit=1000");
    assert_eq!(status, 200);
    assert!(!events.to_string().contains(token) && !events.to_string().contains(key));
    assert!(!events.to_string().contains(&base64::engine::general_purpose::STANDARD.encode(token)));
    drop(m);
    let mut files = walk(&dir.path().join("master"));
    files.push(log);
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        for secret in [token, key] {
            let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!found, "{} holds a credential in clear", file.display());
        }
    }
}

fn hex_decode(h: &str) -> Vec<u8> {
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

#[test]
fn registering_needs_h_and_calling_needs_x_and_h() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let service = Service::start(dir.path(), "items", "");
    let api = m.client();
    let register = json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "items", "name": "Items",
        "baseUrl": service.url, "openapi": DOCUMENT, "include": ["get-item"]});
    let runner = api.agent("runner", "r-x");
    let (status, v) = runner.command(register.clone());
    assert_eq!(status, 403, "{v}");
    let author = api.agent("author", "r--h");
    let (status, v) = author.command(register);
    assert_eq!(status, 200, "{v}");
    let ops: Vec<&String> = v["contract"]["operations"].as_object().unwrap().keys().collect();
    assert_eq!(ops, ["get-item"], "include keeps a subset");

    let call = json!({"tool": "get-item", "args": ["--id", "1"]});
    let (status, v) = author.post("/api/tools/items/call", call.clone());
    assert_eq!(status, 403, "h alone does not call: {v}");
    let (status, v) = runner.post("/api/tools/items/call", call.clone());
    assert!(matches!(status, 403 | 404), "x alone does not see http services: {status} {v}");
    let both = api.agent("both", "r-xh");
    let bin = install(&m, both.token.as_deref().unwrap(), dir.path());
    let out = run(&m, both.token.as_deref().unwrap(), &bin.join("agentos-items"), &["get-item", "--id", "1"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json()["result"]["body"]["path"], "/items/1");
}

#[test]
fn documents_are_read_inline_or_fetched_and_refused_with_the_reason_when_they_cannot_be_imported() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let service = Service::start(dir.path(), "items", "");
    let api = m.client();
    let register = |doc: Value| {
        api.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "bad", "name": "Bad",
            "baseUrl": service.url, "openapi": doc}))
    };
    let (status, v) = register(json!({"swagger": "2.0", "info": {"title": "Old", "version": "1"}, "paths": {}}));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("Swagger 2.0 is not supported"), "{v}");

    let external = json!({"openapi": "3.1.0", "info": {"title": "Ext", "version": "1"}, "paths": {"/a": {"get": {
        "operationId": "a", "parameters": [{"$ref": "https://example.com/params.json#/limit"}],
        "responses": {"200": {"description": "ok"}}}}}});
    let (status, v) = register(external);
    assert_eq!(status, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("/paths/~1a/get/parameters/0") && msg.contains("https://example.com/params.json"), "{msg}");

    // A timeout no call could keep is refused at registration, not at every call.
    let object = json!({"openapi": "3.1.0", "info": {"title": "T", "version": "1"}, "paths": {"/t": {"get": {
        "operationId": "t", "responses": {"200": {"description": "ok"}}}}}});
    for timeout in [json!(0), json!(99_999_999_999u64)] {
        let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "bad", "name": "Bad",
            "baseUrl": service.url, "openapi": object, "timeoutMs": timeout}));
        assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_timeout")), "{timeout}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().starts_with("timeoutMs must be between 1 and "), "{v}");
    }

    // A base URL holding a credential, or one no call could join a path to, is refused at
    // registration, and the password is not repeated.
    let with_password = service.url.replacen("http://", "http://apiuser:pa55word-XYZ@", 1);
    let with_query = format!("{}/?api_key=pa55word-XYZ", service.url);
    let with_fragment = format!("{}/#top", service.url);
    let with_variable = format!("{}/{{version}}", service.url);
    for (base, says) in [
        (with_password.as_str(), "holds a user name or password: keep the credential in a secret"),
        (with_query.as_str(), "has a query or fragment"),
        (with_fragment.as_str(), "has a query or fragment"),
        (with_variable.as_str(), "holds a server variable"),
    ] {
        let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "bad", "name": "Bad",
            "baseUrl": base, "openapi": object}));
        assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_base_url")), "{base}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says) && !msg.contains("pa55word"), "{base}: {msg}");
    }
    // A header that routes or frames the request cannot carry the credential.
    for name in ["Host", "content-length", "X-Forwarded-Host", "Transfer-Encoding"] {
        let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "bad", "name": "Bad",
            "baseUrl": service.url, "openapi": object, "auth": {"type": "header", "name": name, "secret": "K"}}));
        assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_auth")), "{name}: {v}");
    }

    // None left an entry behind.
    assert_eq!(api.get("/api/tool-catalog/bad").0, 404);

    // One bad operation in a good document is skipped and listed, never silently: in the
    // answer, in the entry, and by the CLI.
    let doc = dir.path().join("partly.json");
    std::fs::write(
        &doc,
        json!({"openapi": "3.0.3", "info": {"title": "Partly", "version": "1"}, "paths": {
            "/good": {"get": {"operationId": "good", "responses": {"200": {"description": "ok"}}}},
            "/bad": {"get": {"operationId": "bad", "parameters": [{"$ref": "#/components/parameters/Missing"}],
                "responses": {"200": {"description": "ok"}}}}}})
        .to_string(),
    )
    .unwrap();
    let out = run(
        &m,
        &m.token,
        Path::new(BIN),
        &["catalog", "register-http", "--id", "partly", "--base-url", &service.url, "--openapi", doc.to_str().unwrap()],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("tools:  good"), "{}", out.stdout);
    assert!(out.stdout.contains("skipped /paths/~1bad/get: ") && out.stdout.contains("Missing"), "{}", out.stdout);
    let (status, v) = api.get("/api/tool-catalog/partly");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["binding"]["skipped"][0]["pointer"], "/paths/~1bad/get", "{v}");

    // A document fetched by the master from a URL, through the outbound policy.
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "fetched", "name": "Fetched",
        "baseUrl": service.url, "openapiUrl": format!("{}/openapi.json", service.url)}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["binding"]["sha256"], common::sha256_hex(DOCUMENT.as_bytes()));
    // A document sent as a JSON object is stored as its JSON text.
    let object = json!({"openapi": "3.1.0", "info": {"title": "Obj", "version": "2"}, "paths": {"/o": {"get": {
        "operationId": "read-o", "responses": {"200": {"description": "ok"}}}}}});
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "obj", "name": "Obj",
        "baseUrl": service.url, "openapi": object}));
    assert_eq!(status, 200, "{v}");
    let urn = v["binding"]["openapiUrn"].as_str().unwrap();
    assert!(urn.ends_with(".json"), "{urn}");
    let stored: Value = serde_json::from_slice(&api.get_bytes(&format!("/api/blobs/{urn}")).1).unwrap();
    assert_eq!(stored, object);

    // Both of openapi and openapiUrl, or neither, is refused.
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "x", "name": "X",
        "baseUrl": service.url}));
    assert_eq!(status, 400, "{v}");
}

#[test]
fn re_registering_replaces_the_entry_and_history_keeps_the_earlier_documents() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let service = Service::start(dir.path(), "items", "");
    let api = m.client();
    let register = |doc: &str| {
        api.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "items", "name": "Items",
            "baseUrl": service.url, "openapi": doc}))
    };
    let (status, first) = register(DOCUMENT);
    assert_eq!(status, 200, "{first}");
    let call = |args: &[&str]| api.post("/api/tools/items/call", json!({"tool": "get-item", "args": args}));
    let (status, v) = call(&["--id", "7", "--verbose"]);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["body"]["rawQuery"], "verbose=true");
    // The second document renames a parameter: the call after it follows that document, its
    // flags, its schema and its request, whatever the master kept from the calls before.
    let second_doc = DOCUMENT.replace("Read one item", "Read one item, again").replace(
        "{name: verbose, in: query, schema: {type: boolean}}",
        "{name: detail, in: query, schema: {type: integer, maximum: 3}}",
    );
    let (status, second) = register(&second_doc);
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["contract"]["operations"]["get-item"]["description"], "Read one item, again");
    let (status, v) = call(&["--id", "7", "--verbose"]);
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("--verbose"), "{v}");
    let (status, v) = call(&["--id", "7", "--detail", "4"]);
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().starts_with("--detail: 4 is greater than the maximum of 3"), "{v}");
    let (status, v) = call(&["--id", "7", "--detail", "2"]);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["body"]["rawQuery"], "detail=2");
    let (status, h) = api.get("/api/tool-catalog/items/history");
    assert_eq!(status, 200, "{h}");
    let pins: Vec<&str> = h["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["payload"]["entry"]["binding"]["sha256"].as_str().unwrap())
        .collect();
    assert_eq!(pins, [common::sha256_hex(DOCUMENT.as_bytes()), common::sha256_hex(second_doc.as_bytes())]);
    // The earlier document is still there, verified against its pin.
    let (status, bytes) = api.get_bytes(&format!("/api/blobs/{}", first["binding"]["openapiUrn"].as_str().unwrap()));
    assert_eq!((status, bytes.as_slice()), (200, DOCUMENT.as_bytes()));

    // A document fetched from a redirect to another origin is refused, naming the redirect.
    let other = Service::start(dir.path(), "other", "");
    let hopper = Service::start(dir.path(), "hopper", &other.url);
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "items", "name": "Items",
        "baseUrl": service.url, "openapiUrl": format!("{}/redirect", hopper.url)}));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("answered 302"), "{v}");
    assert!(other.requests().is_empty());
}

#[test]
fn an_http_transition_calls_a_registered_operation_with_its_credential() {
    let dir = tempfile::tempdir().unwrap();
    // No limit on a token's size (0): a large body still reaches the net whole.
    let m = Master::start_with(&dir.path().join("master"), &["--max-token-bytes", "0"]);
    let service = Service::start(dir.path(), "items", "");
    let api = m.client();
    let token = "net-tok-51d2e8a7c9b3-canary";
    assert_eq!(api.put("/api/secrets/ITEMS_TOKEN", json!({"value": token})).0, 200);
    let (s, v) = api.post("/api/secrets/ITEMS_TOKEN/grants", json!({"origin": service.url}));
    assert_eq!(s, 200, "{v}");
    let out = register_items(&m, dir.path(), &service, &["--auth", "bearer:ITEMS_TOKEN"]);
    assert_eq!(out.code, 0, "{}", out.stderr);

    // A credential in an operation's input is refused when the net is applied.
    let (status, v) = api.put(
        "/api/models/shop/net",
        json!({"places": ["p-req", "p-resp"], "transitions": [{"id": "read", "kind": "http",
            "presets": {"req": {"place": "p-req"}}, "postsets": {"o": {"place": "p-resp"}},
            "action": {"tool": "items", "operation": "get-item", "input": {"id": "${credentials.ITEMS_TOKEN}"}},
            "emit": [{"to": "o"}]}]}),
    );
    assert_eq!(status, 400, "{v}");
    assert!(v.to_string().contains("/transitions/0/action/input"), "{v}");

    // An operation the service does not have, or one a template would choose, never fires:
    // refused when the net is applied.
    for (operation, words) in
        [("nope", "items has no operation \"nope\"; its operations: "), ("${.req.data.op}", "named, not computed")]
    {
        let (status, v) = api.put(
            "/api/models/shop/net",
            json!({"places": ["p-req", "p-resp"], "transitions": [{"id": "read", "kind": "http",
                "presets": {"req": {"place": "p-req"}}, "postsets": {"o": {"place": "p-resp"}},
                "action": {"tool": "items", "operation": operation}, "emit": [{"to": "o"}]}]}),
        );
        assert_eq!(status, 400, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(words), "{v}");
    }
    let (status, v) = api.put(
        "/api/models/shop/net",
        json!({"places": ["p-req", "p-resp"], "transitions": [{"id": "read", "kind": "http",
            "presets": {"req": {"place": "p-req"}}, "postsets": {"o": {"place": "p-resp"}},
            "action": {"tool": "items", "operation": "get-item",
                "input": {"id": "${.req.data.id}", "tags": ["a", "b"], "verbose": "${.req.data.verbose}"}},
            "emit": [{"to": "o"}]}]}),
    );
    assert_eq!(status, 200, "{v}");
    let (status, v) = api.post("/api/models/shop/transitions/read/start", json!({}));
    assert_eq!(status, 200, "{v}");
    let (status, v) = api.post("/api/models/shop/places/p-req/tokens", json!({"data": {"id": "42"}}));
    assert_eq!(status, 200, "{v}");
    common::wait_for("the response token", || !api.token_data("shop", "p-resp").is_empty());
    let data = api.token_data("shop", "p-resp").remove(0);
    assert_eq!(data["path"], "/items/42", "{data}");
    assert_eq!(data["query"]["tags"], json!(["a", "b"]));
    // `verbose` was not in the token: its hole rendered null, which is left out, not refused.
    assert!(data["query"].get("verbose").is_none(), "{data}");
    assert_eq!(data["headers"]["authorization"], "Bearer [redacted]", "the echo is redacted: {data}");
    let seen = service.requests().pop().unwrap();
    assert_eq!(seen["headers"]["authorization"], format!("Bearer {token}"));
    assert!(seen["headers"]["user-agent"].as_str().unwrap().starts_with("agentos/"), "{seen}");

    // A fire acts with the flags of everyone behind it: a token put by an agent without `h`
    // does not call the service, and parks with the reason.
    let (status, v) = api.post("/api/agents", json!({"name": "clerk", "flags": "rwx"}));
    assert_eq!(status, 200, "{v}");
    let clerk = api.with_token(v["token"].as_str());
    let (status, v) = api.post("/api/agents/clerk/grants", json!({"model": "shop"}));
    assert_eq!(status, 200, "{v}");
    let before = service.requests().len();
    let (status, v) = clerk.post("/api/models/shop/places/p-req/tokens", json!({"data": {"id": "43"}}));
    assert_eq!(status, 200, "{v}");
    common::wait_for("the token to park", || !api.get("/api/models/shop/parked").1.as_array().unwrap().is_empty());
    let parked = api.get("/api/models/shop/parked").1;
    let reason = parked[0]["reason"].as_str().unwrap();
    assert!(reason.contains("needs the 'h' (http) flag") && reason.contains("clerk"), "{reason}");
    assert_eq!(service.requests().len(), before, "the service was not called");

    // The rendered input is checked against the operation's whole schema before anything is
    // sent, as a shell command's call is: an id that is not a string parks with the reason.
    let (status, v) = api.post("/api/models/shop/places/p-req/tokens", json!({"data": {"id": 44}}));
    assert_eq!(status, 200, "{v}");
    let parked = || api.get("/api/models/shop/parked").1.as_array().unwrap().clone();
    common::wait_for("the second token to park", || parked().len() == 2);
    let reasons: Vec<String> = parked().iter().map(|p| p["reason"].as_str().unwrap().to_string()).collect();
    let reason = reasons.iter().find(|r| r.contains("the input of items get-item")).expect("a reason naming the input");
    assert!(reason.contains("--id: 44 is not of type \"string\""), "{reason}");
    assert_eq!(service.requests().len(), before, "the service was not called");

    // A status outside 2xx goes to onError after the last attempt, and the error token carries
    // what the service answered, redacted as a result is.
    let net = json!({"places": ["p-ask", "p-ok", "p-err"], "transitions": [{"id": "escaped", "kind": "http",
        "presets": {"i": {"place": "p-ask"}}, "postsets": {"o": {"place": "p-ok"}, "e": {"place": "p-err"}},
        "action": {"tool": "items", "operation": "escaped"}, "emit": [{"to": "o"}], "onError": {"to": "e"}}]});
    let (status, v) = api.put("/api/models/errs/net", net);
    assert_eq!(status, 200, "{v}");
    assert_eq!(api.post("/api/models/errs/transitions/escaped/start", json!({})).0, 200);
    assert_eq!(api.post("/api/models/errs/places/p-ask/tokens", json!({"data": {"n": 1}})).0, 200);
    common::wait_for("the error token", || !api.token_data("errs", "p-err").is_empty());
    let err = api.token_data("errs", "p-err").remove(0);
    assert!(err["error"].as_str().unwrap().contains("answered 401"), "{err}");
    assert_eq!(err["response"]["status"], 401, "{err}");
    assert_eq!(err["response"]["body"]["echo"], "Bearer [redacted]", "{err}");
    assert_eq!(err["input"]["i"]["data"]["n"], 1, "{err}");
    assert!(!err.to_string().contains(token), "{err}");

    // A body too large to show inline reaches a net whole, parsed; bytes that are not text
    // arrive as their blob's reference, never as a mangled string.
    let call = |id: &str, from: &str, to: &str| {
        json!({"id": id, "kind": "http", "presets": {"i": {"place": from}}, "postsets": {"o": {"place": to}},
            "action": {"tool": "items", "operation": id}, "emit": [{"to": "o"}]})
    };
    let net = json!({"places": ["p-a", "p-big", "p-b", "p-bytes"],
        "transitions": [call("big", "p-a", "p-big"), call("bytes", "p-b", "p-bytes")]});
    assert_eq!(api.put("/api/models/bulk/net", net).0, 200);
    for (t, place) in [("big", "p-a"), ("bytes", "p-b")] {
        assert_eq!(api.post(&format!("/api/models/bulk/transitions/{t}/start"), json!({})).0, 200);
        assert_eq!(api.post(&format!("/api/models/bulk/places/{place}/tokens"), json!({"data": {}})).0, 200);
    }
    common::wait_for("both answers", || {
        !api.token_data("bulk", "p-big").is_empty() && !api.token_data("bulk", "p-bytes").is_empty()
    });
    let big = api.token_data("bulk", "p-big").remove(0);
    assert_eq!(big["rows"].as_array().map(Vec::len), Some(2000), "the whole body, parsed");
    let bytes = api.token_data("bulk", "p-bytes").remove(0);
    assert_eq!(bytes["sizeBytes"], 256, "{bytes}");
    let (status, got) = api.get_bytes(&format!("/api/blobs/{}", bytes["urn"].as_str().unwrap()));
    assert_eq!((status, got), (200, (0..=255u8).collect::<Vec<u8>>()));
    drop(m);
    for file in walk(&dir.path().join("master")) {
        let bytes = std::fs::read(&file).unwrap();
        assert!(!bytes.windows(token.len()).any(|w| w == token.as_bytes()), "{} holds the credential", file.display());
    }
}

/// The shared corpus of real documents (`fixtures/openapi/`, see its MANIFEST.md),
/// registered through the master: what the importer makes of each must also fit the catalog
/// (the depth and size of the event that stores it, the blob that pins it).
#[test]
fn every_shared_fixture_registers_through_the_master_or_is_refused_with_the_reason() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/openapi");
    let expected: &[(&str, Result<usize, &str>)] = &[
        ("api-with-examples-3.0.yaml", Ok(2)),
        ("box-3.0.json", Ok(296)),
        ("callback-example-3.0.yaml", Ok(1)),
        ("datadog-v1-3.0.yaml", Ok(235)),
        ("digitalocean-extref-3.0.yaml", Err("refers to another document at /paths/~1<upload_url>/put/$ref")),
        ("discord-3.1.json", Ok(242)),
        ("link-example-3.0.yaml", Ok(6)),
        ("non-oauth-scopes-3.1.json", Ok(1)),
        ("openai-3.1.yaml", Ok(288)),
        ("ory-kratos-3.0.json", Ok(60)),
        ("overseerr-3.0.yaml", Ok(170)),
        ("petstore-3.0.yaml", Ok(3)),
        ("petstore-expanded-3.0.json", Ok(4)),
        ("scalar-galaxy-3.1.yaml", Ok(10)),
        ("twilio-api-v2010-3.0.json", Ok(197)),
        ("uspto-3.0.json", Ok(3)),
        ("webhook-example-3.1.json", Err("the document has no `paths`, only 1 webhook(s)")),
    ];
    let mut names: Vec<String> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".json") || n.ends_with(".yaml"))
        .collect();
    names.sort();
    assert_eq!(names, expected.iter().map(|(n, _)| n.to_string()).collect::<Vec<_>>(), "the corpus changed");
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    for (i, (name, want)) in expected.iter().enumerate() {
        let text = std::fs::read_to_string(fixtures.join(name)).unwrap();
        let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": format!("doc-{i}"),
            "name": name, "baseUrl": "https://api.example.com", "openapi": text}));
        match want {
            Ok(tools) => {
                assert_eq!(status, 200, "{name}: {v}");
                assert_eq!(v["contract"]["operations"].as_object().unwrap().len(), *tools, "{name}");
                assert_eq!(v["binding"]["sha256"], common::sha256_hex(text.as_bytes()), "{name}");
            }
            Err(reason) => {
                assert_eq!(status, 400, "{name}: {v}");
                assert!(v["error"]["message"].as_str().unwrap().contains(reason), "{name}: {v}");
            }
        }
    }
    // The catalog still answers, and restarting folds every entry back.
    let m = m.restart();
    let (status, v) = m.client().get("/api/tool-catalog?type=http&limit=100");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["total"], 15, "{v}");
    // A tool Twilio's 197 lack is refused in one short line, naming the nearest and where the
    // rest are listed.
    let twilio = expected.iter().position(|(n, _)| n.starts_with("twilio")).unwrap();
    let (status, v) =
        m.client().post(&format!("/api/tools/doc-{twilio}/call"), json!({"tool": "list-calls", "args": []}));
    assert_eq!(status, 404, "{v}");
    assert_eq!(
        v["error"]["message"],
        format!(
            "no tool \"list-calls\" in doc-{twilio}; did you mean list-call? its 197 tools: agentos-doc-{twilio} --help"
        )
    );
}

#[test]
fn a_registration_over_another_owners_entry_is_refused_before_the_document_is_fetched() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(&dir.path().join("master"));
    let api = m.client();
    let watched = common::Watched::start();
    let (status, v) = api.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "items", "name": "Items",
        "baseUrl": watched.origin, "openapi": DOCUMENT}));
    assert_eq!(status, 200, "{v}");
    let mallory = api.agent("mallory", "r--h");
    let (status, v) = mallory.command(json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": "items", "name": "Items",
        "baseUrl": watched.origin, "openapiUrl": format!("{}/openapi.json", watched.origin)}));
    assert_eq!(status, 403, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("it belongs to \"operator\""), "{v}");
    assert!(!watched.contacted(), "the master fetched the document of a refused registration");
}
