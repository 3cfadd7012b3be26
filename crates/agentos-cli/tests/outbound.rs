//! The outbound policy end to end: an http transition may not reach loopback addresses (by IP,
//! by name, or through a redirect) unless the master was started with `--http-allow`.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;

use common::{Api, Master, wait_for};
use serde_json::json;

/// A net with one manual http transition calling `url`, and one token to fire it with.
fn http_net(api: &Api, model: &str, url: &str) {
    let (status, v) = api.put(
        &format!("/api/models/{model}/net"),
        json!({
            "places": ["p-req", "p-resp"],
            "transitions": [{"id": "call", "kind": "http", "mode": "manual",
                "presets": {"req": {"place": "p-req"}}, "postsets": {"o": {"place": "p-resp"}},
                "action": {"method": "GET", "url": url}, "emit": [{"to": "o"}]}]
        }),
    );
    assert_eq!(status, 200, "{v}");
    let (status, v) = api.post(&format!("/api/models/{model}/places/p-req/tokens"), json!({"data": {}}));
    assert_eq!(status, 200, "{v}");
}

/// Fires the transition by hand and answers the reason its fire failed with.
fn fire_and_fail(api: &Api, model: &str) -> String {
    let (status, o) = api.post(&format!("/api/models/{model}/transitions/call/fire"), json!({}));
    assert_eq!(status, 200, "{o}");
    assert_eq!(o["outcome"], "started", "{o}");
    let mut reason = String::new();
    wait_for("the fire to fail", || {
        let (_, net) = api.get(&format!("/api/models/{model}/net"));
        match net["transitions"][0]["lastError"].as_str() {
            Some(e) => {
                reason = e.to_string();
                true
            }
            None => false,
        }
    });
    assert!(api.token_data(model, "p-resp").is_empty(), "a response arrived");
    assert_eq!(api.token_data(model, "p-req"), vec![json!({})], "the input was not kept");
    reason
}

/// A listener whose every connection is a failure of the policy: once the fire has failed, a
/// connection the master made would already wait in its backlog.
fn untouched(listener: &TcpListener) {
    listener.set_nonblocking(true).unwrap();
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the refused listener was reached: {other:?}"),
    }
}

#[test]
fn a_master_without_http_allow_refuses_loopback_by_ip_and_by_name() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_default_policy(dir.path());
    let api = m.client();

    http_net(&api, "by-ip", &format!("http://127.0.0.1:{port}/"));
    let reason = fire_and_fail(&api, "by-ip");
    // The way to allow it names the port asked for, not every service on the address.
    let allow = format!("--http-allow 127.0.0.1:{port} to allow it");
    assert!(reason.contains("127.0.0.1 is refused") && reason.contains(&allow), "{reason}");

    // `localhost` goes through the resolver, which keeps no loopback address.
    http_net(&api, "by-name", &format!("http://localhost:{port}/"));
    let reason = fire_and_fail(&api, "by-name");
    assert!(reason.contains("localhost resolves only to refused addresses"), "{reason}");
    assert!(reason.contains("--http-allow"), "{reason}");

    // A registered service's operation called by name is refused as by its address (403
    // `refused`, exit 3), not as a request that failed.
    let doc = "openapi: 3.0.3\ninfo: {title: t, version: '1'}\npaths:\n  /x:\n    get: {operationId: get-x, responses: {'200': {description: ok}}}\n";
    for (id, base) in [("by-ip", format!("http://127.0.0.1:{port}")), ("by-name", format!("http://localhost:{port}"))] {
        let register =
            json!({"type": "TOOL_CATALOG_REGISTER_HTTP", "id": id, "name": id, "baseUrl": base, "openapi": doc});
        let (status, v) = api.command(register);
        assert_eq!(status, 200, "{v}");
        let (status, v) = api.post(&format!("/api/tools/{id}/call"), json!({"tool": "get-x", "args": []}));
        assert_eq!((status, v["error"]["code"].as_str()), (403, Some("refused")), "{id}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("--http-allow"), "{id}: {v}");
    }

    // Another spelling of the same address is the same address.
    http_net(&api, "decimal", &format!("http://2130706433:{port}/"));
    let reason = fire_and_fail(&api, "decimal");
    assert!(reason.contains("127.0.0.1 is refused"), "{reason}");

    untouched(&listener);
}

#[test]
fn a_redirect_from_an_allowed_origin_to_a_refused_address_is_not_followed() {
    // 127.0.0.2 is loopback too, and outside `--http-allow 127.0.0.1`.
    let target = TcpListener::bind("127.0.0.2:0").unwrap();
    let target_port = target.local_addr().unwrap().port();
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin_port = origin.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = origin.accept().unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&req).contains("\r\n\r\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "the request ended early");
            req.extend_from_slice(&buf[..n]);
        }
        write!(
            s,
            "HTTP/1.1 302 Found\r\nlocation: http://127.0.0.2:{target_port}/inside\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        String::from_utf8_lossy(&req).into_owned()
    });
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    http_net(&api, "redirect", &format!("http://127.0.0.1:{origin_port}/outside"));
    let reason = fire_and_fail(&api, "redirect");
    assert!(reason.contains("127.0.0.2 is refused") && reason.contains("--http-allow 127.0.0.2"), "{reason}");
    let request: String = server.join().unwrap();
    assert!(request.starts_with("GET /outside"), "{request}");
    untouched(&target);
}

/// A master listening on all addresses (`0.0.0.0`) is reached on each address of the machine's
/// interfaces: its own http transitions may not call them, unless `--http-allow` names them.
#[test]
fn a_master_listening_on_all_addresses_refuses_its_own_interface_addresses() {
    let own = agentos_engine::outbound::interface_addresses()
        .into_iter()
        .find(|ip| ip.is_ipv4() && !ip.is_loopback())
        .expect("a non-loopback IPv4 interface address");
    let listener = TcpListener::bind((own, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_full(dir.path(), "0.0.0.0:0", &[], &[]);
    let api = m.client();
    http_net(&api, "own", &format!("http://{own}:{port}/"));
    let reason = fire_and_fail(&api, "own");
    assert!(reason.contains(&format!("{own} is refused")) && reason.contains("this master's own address"), "{reason}");
    untouched(&listener);
}

/// Cloud metadata and link-local addresses are refused by the policy before any connection
/// (a connection tried would fail as a timeout or a refused connect, not as the policy's refusal).
#[test]
fn metadata_and_link_local_addresses_are_refused_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    for (model, url, what) in [
        (
            "metadata",
            "http://169.254.169.254/latest/meta-data/",
            "169.254.169.254 is refused: it is a cloud metadata address",
        ),
        ("link-local", "http://169.254.10.20:8080/", "169.254.10.20 is refused: it is a link-local address"),
        ("link-local-v6", "http://[fe80::1]:8080/", "fe80::1 is refused: it is a link-local address"),
    ] {
        http_net(&api, model, url);
        let reason = fire_and_fail(&api, model);
        assert!(reason.contains(what), "{reason}");
    }
}

/// Answers the first request `listener` takes with `{}`; the thread's result is the request's
/// first bytes.
fn answer_once(listener: TcpListener) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        write!(
            s,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
        )
        .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
}

/// Regression: `--http-allow 127.0.0.1`, given to reach a service beside the master, let a net
/// call the master's own API too, by IP or by name. Its own port is now opened only by an entry
/// naming it; other ports of the address stay open.
#[test]
fn opening_the_masters_address_leaves_its_own_port_refused_unless_named() {
    let beside = TcpListener::bind("127.0.0.1:0").unwrap();
    let beside_port = beside.local_addr().unwrap().port();
    let server = answer_once(beside);
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let port = m.url.rsplit(':').next().unwrap().to_string();
    for (model, host) in [("by-ip", "127.0.0.1"), ("by-name", "localhost")] {
        http_net(&api, model, &format!("http://{host}:{port}/healthz"));
        let reason = fire_and_fail(&api, model);
        assert!(reason.contains("this master's own address"), "{reason}");
        assert!(reason.contains(&format!("--http-allow 127.0.0.1:{port}")), "{reason}");
    }
    // The service beside it, on the same address, by name.
    http_net(&api, "beside", &format!("http://localhost:{beside_port}/x"));
    let (status, o) = api.post("/api/models/beside/transitions/call/fire", json!({}));
    assert_eq!((status, o["outcome"].as_str()), (200, Some("started")), "{o}");
    wait_for("the answer of the service beside", || !api.token_data("beside", "p-resp").is_empty());
    assert!(server.join().unwrap().starts_with("GET /x"));

    // Named with its port, the master's own address is reached.
    let port = common::free_port();
    let own = format!("127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start_full(dir.path(), &own, &["--http-allow", &own], &[]);
    let api = m.client();
    http_net(&api, "self", &format!("http://localhost:{port}/healthz"));
    api.post("/api/models/self/transitions/call/fire", json!({}));
    wait_for("the master's own answer", || !api.token_data("self", "p-resp").is_empty());
}

/// An entry with a port opens that port alone, whether the URL names the address or a name
/// that resolves to it.
#[test]
fn an_http_allow_entry_with_a_port_opens_that_port_alone() {
    let open = TcpListener::bind("127.0.0.1:0").unwrap();
    let open_port = open.local_addr().unwrap().port();
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    let server = answer_once(open);
    let dir = tempfile::tempdir().unwrap();
    let allow = format!("127.0.0.1:{open_port}");
    let m = Master::start_default_policy_with(dir.path(), &["--http-allow", &allow]);
    let api = m.client();
    for (model, host) in [("ip", "127.0.0.1"), ("name", "localhost")] {
        http_net(&api, model, &format!("http://{host}:{closed_port}/"));
        let reason = fire_and_fail(&api, model);
        // The master listens on 127.0.0.1 too: the address is refused as its own machine's.
        assert!(reason.contains("127.0.0.1 is refused") || reason.contains("127.0.0.1: a loopback"), "{reason}");
        assert!(reason.contains("a loopback address (the machine this master runs on)"), "{reason}");
    }
    untouched(&closed);
    http_net(&api, "open", &format!("http://localhost:{open_port}/y"));
    api.post("/api/models/open/transitions/call/fire", json!({}));
    wait_for("the answer of the open port", || !api.token_data("open", "p-resp").is_empty());
    assert!(server.join().unwrap().starts_with("GET /y"));
}

/// Regression: a header whose value held a line break failed the fire in reqwest's words,
/// "builder error: failed to parse header value", naming no header; it is named now, and the
/// value (which may hold a secret) is not shown.
#[test]
fn a_header_value_that_cannot_be_sent_is_refused_naming_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let m = Master::start(dir.path());
    let api = m.client();
    let (status, v) = api.put(
        "/api/models/hdr/net",
        json!({
            "places": ["p-req", "p-resp"],
            "transitions": [{"id": "call", "kind": "http", "mode": "manual",
                "presets": {"req": {"place": "p-req"}}, "postsets": {"o": {"place": "p-resp"}},
                "action": {"method": "GET", "url": "http://127.0.0.1:9/", "headers": {"X-Tag": "${.req.data.tag}"}},
                "emit": [{"to": "o"}]}]
        }),
    );
    assert_eq!(status, 200, "{v}");
    let (status, v) = api.post("/api/models/hdr/places/p-req/tokens", json!({"data": {"tag": "a\r\nX-Evil: 1"}}));
    assert_eq!(status, 200, "{v}");
    let (status, o) = api.post("/api/models/hdr/transitions/call/fire", json!({}));
    assert_eq!(status, 200, "{o}");
    let mut reason = String::new();
    wait_for("the fire to fail", || {
        let (_, net) = api.get("/api/models/hdr/net");
        net["transitions"][0]["lastError"].as_str().map(|e| reason = e.to_string()).is_some()
    });
    assert!(reason.contains("header \"X-Tag\" is not a valid header value"), "{reason}");
    assert!(!reason.contains("X-Evil"), "{reason}");

    // A URL of another scheme is said in words too (it was reqwest's "builder error").
    http_net(&api, "ftp", "ftp://127.0.0.1/x");
    let reason = fire_and_fail(&api, "ftp");
    assert!(
        reason.contains("has the scheme \"ftp\": an http action fetches http:// and https:// URLs only"),
        "{reason}"
    );
}
