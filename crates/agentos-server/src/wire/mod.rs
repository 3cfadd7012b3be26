//! The API's request and answer types and their OpenAPI schemas.
//!
//! The server owns them: handlers parse requests into these types and answer with them,
//! converting from and to the domain types of `agentos-core` and `agentos-engine`. Events and
//! snapshots keep their own types in core, so renaming a field of the API never changes the
//! log, and the core carries no knowledge of routes or OpenAPI. Each conversion destructures its
//! domain type in full: a field added there does not compile here until the API decides on it.

mod admin;
mod catalog;
mod jobs;
mod nets;
mod query;

pub use admin::*;
pub use catalog::*;
pub use jobs::*;
pub use nets::*;
pub use query::*;

#[cfg(test)]
mod tests {
    //! The wire types must serialize to exactly the JSON the domain types did before the split.
    //! Schema-only types (commands, the net document) are checked against the parser that reads
    //! them; answer types against the domain type they are converted from.

    use serde::Serialize;
    use serde::de::DeserializeOwned;
    use serde_json::{Value, json};

    use agentos_core::{command, entry, event, job, net, net_state, search, state};

    /// Parses `input` as both types and checks they serialize to the same JSON.
    fn check_same_shape<Domain: DeserializeOwned + Serialize, Wire: DeserializeOwned + Serialize>(input: Value) {
        let domain: Domain = serde_json::from_value(input.clone()).expect("the domain type reads it");
        let wire: Wire = serde_json::from_value(input.clone()).expect("the wire type reads it");
        assert_eq!(serde_json::to_value(&domain).unwrap(), serde_json::to_value(&wire).unwrap(), "{input}");
    }

    /// Checks that converting `domain` to its wire type changes nothing in its JSON.
    fn check_answer<Domain: Serialize, Wire: Serialize + From<Domain>>(domain: Domain) {
        let before = serde_json::to_value(&domain).unwrap();
        assert_eq!(before, serde_json::to_value(Wire::from(domain)).unwrap());
    }

    fn script_entry() -> entry::CatalogEntry {
        serde_json::from_value(json!({
            "id": "forum-sentinel", "name": "Forum sentinel", "version": "1.0.0",
            "description": "Watches a forum", "capabilities": ["forum", "watch"], "status": "approved",
            "contract": {"type": "script-io", "operations": {"run": {
                "description": "Run it", "input": {"type": "object"}, "output": {"type": "string"},
                "examples": [{"description": "once", "input": {"url": "https://example.com"}}]}}},
            "binding": {"type": "script", "runtime": "node",
                "scriptUrn": "urn:agentos:blob:tool-catalog/scripts/df6ff312a2c0955727f8735dcc93686f684fb8fc3eac8a87288c87f4596af6d1.cjs",
                "sha256": "df6ff312a2c0955727f8735dcc93686f684fb8fc3eac8a87288c87f4596af6d1",
                "filename": "sentinel.cjs", "sizeBytes": 120, "env": ["FORUM_TOKEN"]}
        }))
        .unwrap()
    }

    fn entry_view(entry: entry::CatalogEntry, scope: entry::Scope) -> entry::EntryView {
        let (created, updated) = (1_796_097_600_000, 1_796_097_900_000);
        let stored = entry::StoredEntry::new(entry, "default".into(), 7, created, updated, "operator".into());
        std::sync::Arc::new(stored).view(scope, true)
    }

    #[test]
    fn commands_have_the_shape_the_command_parser_reads() {
        let register = json!({
            "id": "nightly-digest", "name": "Nightly digest", "runtime": "node",
            "content": "console.log(1)", "model": "m1", "version": "1.2.0", "description": "Digest",
            "capabilities": ["digest"], "filename": "digest.cjs", "input": {"type": "object"}, "env": ["API_KEY"]
        });
        let search =
            json!({"toolType": "script", "model": "m1", "q": "digest", "capability": "x", "limit": 5, "offset": 10});
        let get = json!({"id": "nightly-digest", "model": "m1"});
        let remove = json!({"id": "nightly-digest"});
        for (kind, body) in [
            ("TOOL_CATALOG_REGISTER_SCRIPT", &register),
            ("TOOL_CATALOG_SEARCH", &search),
            ("TOOL_CATALOG_GET", &get),
            ("TOOL_CATALOG_REMOVE", &remove),
        ] {
            let mut typed = body.clone();
            typed["type"] = json!(kind);
            agentos_engine::commands::Command::parse(typed).unwrap_or_else(|e| panic!("{kind}: {e}"));
        }
        check_same_shape::<agentos_engine::bindings::script::RegisterScript, super::RegisterScript>(register);
        check_same_shape::<agentos_engine::bindings::script::RegisterScript, super::RegisterScript>(
            json!({"id": "b", "name": "B", "runtime": "sh", "contentBase64": "ZWNobyBoaQ=="}),
        );
        check_same_shape::<agentos_engine::bindings::toolnet::RegisterToolnet, super::RegisterToolnet>(json!({
            "id": "flow", "name": "Flow", "inputPlace": "in", "outputPlace": "out", "model": "m1", "version": "1.0.0",
            "description": "A flow", "capabilities": ["flow"], "input": {"type": "object"},
            "net": {"places": ["in", "out"], "transitions": [{"id": "t", "kind": "pass",
                "presets": {"x": {"place": "in"}}, "postsets": {"y": {"place": "out"}}}]}
        }));
        check_same_shape::<agentos_engine::bindings::http::RegisterHttp, super::RegisterHttp>(json!({
            "id": "pets", "name": "Pets", "baseUrl": "https://pets.example.com/v1", "openapi": {"openapi": "3.1.0"},
            "auth": {"type": "header", "name": "X-Key", "secret": "PETS_KEY"}, "description": "Pets",
            "capabilities": ["pets"], "include": ["list-pets"], "timeoutMs": 5000
        }));
        check_same_shape::<agentos_engine::bindings::http::RegisterHttp, super::RegisterHttp>(json!({
            "id": "pets", "name": "Pets", "baseUrl": "https://pets.example.com", "openapiUrl": "https://pets.example.com/openapi.yaml",
            "auth": {"type": "bearer", "secret": "PETS_TOKEN"}
        }));
        check_same_shape::<agentos_engine::bindings::mcp::RegisterMcp, super::RegisterMcp>(json!({
            "id": "weather", "name": "Weather", "model": "m1", "description": "Weather", "capabilities": ["weather"],
            "server": {"command": "python3", "args": ["server.py"], "env": {"API_KEY": "WEATHER_KEY"}},
            "include": ["get-forecast"], "timeoutMs": 5000
        }));
        check_same_shape::<agentos_engine::bindings::mcp::RegisterMcp, super::RegisterMcp>(json!({
            "id": "weather", "name": "Weather",
            "server": {"url": "https://mcp.example.com/mcp", "auth": {"type": "bearer", "secret": "WEATHER_TOKEN"}}
        }));
        check_same_shape::<agentos_engine::bindings::docker::ImportImage, super::ImportImage>(json!({
            "image": "127.0.0.1:5001/tools/echo:1", "id": "echo", "name": "Echo", "secrets": ["ECHO_KEY"],
            "description": "Echo", "capabilities": ["echo"], "timeoutMs": 5000
        }));
        check_same_shape::<agentos_engine::bindings::docker::ImportImage, super::ImportImage>(json!({
            "image": "127.0.0.1:5001/echo", "id": "echo"
        }));
        check_same_shape::<command::SearchArgs, super::SearchArgs>(search);
        check_same_shape::<command::SearchArgs, super::SearchArgs>(json!({"bindingType": "toolnet"}));
        check_same_shape::<command::SearchArgs, super::SearchArgs>(json!({}));
        check_same_shape::<command::GetArgs, super::GetArgs>(get);
        check_same_shape::<command::RemoveArgs, super::RemoveArgs>(remove);
    }

    #[test]
    fn the_net_document_has_the_shape_the_net_parser_reads() {
        let doc = json!({
            "model": "m1",
            "places": ["inbox", {"id": "done", "description": "Finished work"}, "failed", "other:x"],
            "transitions": [
                {"id": "work", "kind": "command",
                 "presets": {"job": {"place": "inbox", "take": "all", "consume": false, "filter": ".data.ok", "limit": 3}},
                 "postsets": {"ok": {"place": "done"}, "bad": {"place": "failed"}},
                 "action": {"timeoutMs": 1000},
                 "emit": [{"to": "ok", "when": ".result.exitCode == 0"}, {"to": "bad", "from": "@input.job"}],
                 "mode": "manual", "schedule": {"everyMs": 60000}, "concurrency": 2, "onUnmatched": "keep",
                 "retry": {"maxAttempts": 3, "backoffMs": 100}, "onError": {"to": "bad"}},
                {"id": "tick", "kind": "pass", "schedule": {"cron": "0 * * * * *"}},
                {"id": "l", "kind": "link", "from": {"place": "done"}, "to": {"model": "m2", "place": "in"}, "relation": "feeds"}
            ]
        });
        let domain = net::NetDoc::from_value(doc.clone()).expect("the net parser reads it");
        let wire: super::NetDoc = serde_json::from_value(doc).unwrap();
        assert_eq!(serde_json::to_value(&domain).unwrap(), serde_json::to_value(&wire).unwrap());
        check_same_shape::<net::NetDoc, super::NetDoc>(
            json!({"places": ["a"], "transitions": [{"id": "t", "kind": "pass"}]}),
        );
    }

    #[test]
    fn catalog_answers_keep_their_json() {
        let toolnet: entry::CatalogEntry = serde_json::from_value(json!({
            "id": "flow", "name": "Flow", "version": "1.0.0", "status": "registered",
            "contract": {"type": "toolnet", "operations": {"run": {"input": {}}}},
            "binding": {"type": "toolnet", "netUrn": "urn:agentos:blob:tool-catalog/toolnets/ab.json",
                "sha256": "ab", "sizeBytes": 9, "inputPlace": "in", "outputPlace": "out"}
        }))
        .unwrap();
        let host: entry::CatalogEntry = serde_json::from_value(json!({
            "id": "clock", "name": "Clock", "version": "1", "status": "approved",
            "contract": {"type": "host", "operations": {}}, "binding": {"type": "host", "toolkit": "clock"}
        }))
        .unwrap();
        check_answer::<_, super::CatalogEntry>(script_entry());
        check_answer::<_, super::EntryView>(entry_view(script_entry(), entry::Scope::Global));
        check_answer::<_, super::EntryAnswer>(entry_view(script_entry(), entry::Scope::Global));
        let page = || search::SearchPage {
            items: vec![
                entry_view(script_entry(), entry::Scope::Local),
                entry_view(toolnet.clone(), entry::Scope::Global),
                entry_view(host.clone(), entry::Scope::Local),
            ],
            total: 30,
            limit: 3,
            offset: 6,
        };
        check_answer::<_, super::SearchPage>(page());
        check_answer::<_, super::SearchAnswer>(page());
        // The answers written straight from the catalog read back as the document's schema types.
        let answer = serde_json::to_value(super::SearchAnswer::from(page())).unwrap();
        let typed: super::SearchPage = serde_json::from_value(answer.clone()).unwrap();
        assert_eq!(serde_json::to_value(typed).unwrap(), answer);
        let event_view = event::EventView {
            seq: 4,
            model: "m1".into(),
            kind: "ToolRemoved".into(),
            payload: json!({"id": "x"}),
            principal: "operator".into(),
            time: "2026-12-01T04:00:00.000Z".into(),
            v: 1,
        };
        check_answer::<_, super::EventView>(event_view.clone());
        check_answer::<_, super::History>(agentos_engine::History {
            id: "x".into(),
            model: "m1".into(),
            scope: entry::Scope::Local,
            events: vec![event_view],
        });
        check_answer::<_, super::ModelView>(state::ModelView {
            name: "m1".into(),
            created_at: "2026-12-01T04:00:00.000Z".into(),
            created_by: "operator".into(),
            places: vec![state::PlaceView { name: "p-tool-catalog".into(), tokens: 2 }],
        });
    }

    #[test]
    fn job_answers_keep_their_json() {
        let blob = job::OutputBlob { urn: "urn:agentos:blob:jobs/aa".into(), size_bytes: 5000, sha256: "aa".into() };
        let full = job::JobResult {
            stdout_blob: Some(blob.clone()),
            stderr_blob: Some(blob),
            output_truncated: true,
            exit_code: Some(0),
            signal: Some(9),
            stdout: "hi".into(),
            stderr: "warn".into(),
            duration_ms: 12,
            timed_out: true,
            executor: "e1".into(),
            cancelled_by: Some("agent-a".into()),
            ..job::JobResult::failed("j1", 2, "boom".into())
        };
        check_answer::<_, super::JobResult>(full.clone());
        check_answer::<_, super::JobResult>(job::JobResult::failed("j2", 1, "no executor".into()));
        check_answer::<_, super::JobRecord>(agentos_engine::dispatch::JobRecord {
            job_id: "j1".into(),
            model: "m1".into(),
            state: "finished".into(),
            invoker: agentos_engine::dispatch::Invoker::Another,
            results: vec![full],
        });
        let token =
            job::CommandToken { executor: "script".into(), command: "invoke".into(), args: json!({"toolId": "t"}) };
        check_answer::<_, super::LeasedJob>(job::LeasedJob {
            job_id: "j1".into(),
            lease_id: "l1".into(),
            lease_ms: 30_000,
            attempt: 1,
            model: "m1".into(),
            token: token.clone(),
            sealed: true,
            resolution_error: Some("gone".into()),
            max_result_bytes: Some(1 << 20),
        });
        check_answer::<_, super::LeasedJob>(job::LeasedJob {
            job_id: "j1".into(),
            lease_id: "l1".into(),
            lease_ms: 30_000,
            attempt: 1,
            model: "m1".into(),
            token,
            sealed: false,
            resolution_error: None,
            max_result_bytes: None,
        });
        check_answer::<_, super::ExecutorView>(job::ExecutorView {
            name: "e1".into(),
            state: "busy".into(),
            last_seen: "2026-12-01T04:00:00.000Z".into(),
            jobs: vec!["j1".into()],
            other_jobs: 2,
        });
    }

    #[test]
    fn job_requests_read_as_the_domain_types_do() {
        let invoke = json!({"argv": ["-v"], "env": {"A": "1"}, "input": {"x": 1}, "timeoutMs": 500});
        let wire: super::InvokeRequest = serde_json::from_value(invoke.clone()).unwrap();
        let domain: job::InvokeRequest = serde_json::from_value(invoke).unwrap();
        assert_eq!(
            serde_json::to_value(job::InvokeRequest::from(wire)).unwrap(),
            serde_json::to_value(domain).unwrap()
        );
        let result = json!({"leaseId": "l1", "exitCode": 1, "signal": null, "stdoutBase64": "aGk=", "stderrBase64": "",
            "durationMs": 3, "timedOut": false, "outputTruncated": true, "error": "refused"});
        let wire: super::ExecutorResult = serde_json::from_value(result.clone()).unwrap();
        let domain: job::ExecutorResult = serde_json::from_value(result).unwrap();
        assert_eq!(job::ExecutorResult::from(wire), domain);
        let call = json!({"tool": "run", "args": ["--name", "x"]});
        let wire: super::CallRequest = serde_json::from_value(call.clone()).unwrap();
        let domain: agentos_engine::call::CallRequest = serde_json::from_value(call).unwrap();
        assert_eq!(
            serde_json::to_value(agentos_engine::call::CallRequest::from(wire)).unwrap(),
            serde_json::to_value(domain).unwrap()
        );
        check_same_shape::<job::PollRequest, super::PollRequest>(
            json!({"name": "e1", "waitMs": 100, "instance": "0123456789abcdef", "replaces": "fedcba9876543210"}),
        );
        check_same_shape::<job::PollRequest, super::PollRequest>(
            json!({"instance": "0123456789abcdef", "replaces": ["fedcba9876543210", "00000000000000ff"]}),
        );
        check_same_shape::<job::PollRequest, super::PollRequest>(json!({"replaces": null}));
        for wrong in [json!({"replaces": 5}), json!({"replaces": {"a": 1}}), json!({"replaces": [5]})] {
            let e = serde_json::from_value::<super::PollRequest>(wrong.clone()).unwrap_err().to_string();
            assert!(e.contains("a list of instance ids") || e.contains("expected a string"), "{wrong}: {e}");
        }
        check_same_shape::<job::LeaseRef, super::LeaseRef>(json!({"leaseId": "l1"}));
    }

    #[test]
    fn net_answers_keep_their_json() {
        let token: net_state::Token = serde_json::from_value(json!({
            "id": "tk-1", "name": "first", "createdAt": "2026-12-01T04:00:00.000Z", "data": {"n": 1}, "by": ["operator"]
        }))
        .unwrap();
        check_answer::<_, super::Token>(token.clone());
        check_answer::<_, super::Token>(net_state::Token { name: None, by: Vec::new(), ..token.clone() });
        use agentos_engine::nets;
        check_answer::<_, super::NetView>(nets::NetView {
            model: "m1".into(),
            doc: json!({"places": ["a"]}),
            places: vec![nets::PlaceSummary { id: "a".into(), tokens: 2, reserved: 1 }],
            transitions: vec![
                nets::TransitionSummary {
                    id: "t".into(),
                    kind: "pass".into(),
                    started: true,
                    in_flight: 1,
                    fires: 9,
                    parked: 0,
                    last_error: Some("boom".into()),
                },
                nets::TransitionSummary {
                    id: "u".into(),
                    kind: "map".into(),
                    started: false,
                    in_flight: 0,
                    fires: 0,
                    parked: 2,
                    last_error: None,
                },
            ],
        });
        check_answer::<_, super::LinkView>(nets::LinkView {
            id: "l".into(),
            model: "m1".into(),
            relation: "feeds".into(),
            from: json!({"model": "m1", "place": "a"}),
            to: json!({"model": "m2", "place": "b"}),
        });
        check_answer::<_, super::FireOutcome>(nets::FireOutcome {
            transition: "t".into(),
            outcome: "fired".into(),
            fire: Some("f-1".into()),
            reason: None,
        });
        check_answer::<_, super::ParkedToken>(nets::ParkedToken {
            transition: "t".into(),
            place: "a".into(),
            token,
            reason: Some("no rule matched".into()),
            attempts: 3,
        });
    }

    #[test]
    fn admin_answers_and_requests_keep_their_json() {
        use agentos_engine::admin;
        check_answer::<_, super::PrincipalView>(admin::PrincipalView {
            name: "a1".into(),
            kind: "agent".into(),
            flags: "rwx--------".into(),
            model: "a1".into(),
            granted: vec!["m2".into()],
        });
        check_answer::<_, super::SecretView>(admin::SecretView {
            name: "api-key".into(),
            updated_at: "2026-12-01T04:00:00.000Z".into(),
        });
        let tool = event::GrantTarget::Tool { id: "t".into(), model: "default".into(), sha256: "ab".into() };
        check_answer::<_, super::SecretGrant>(event::SecretGrant::new("api-key", tool, Some("m1".into())));
        let origin = event::GrantTarget::Origin { origin: "https://api.example.com".into() };
        check_answer::<_, super::SecretGrant>(event::SecretGrant::new("api-key", origin, None));
        let grant = json!({"tool": "t", "origin": "https://x.example", "model": "m1"});
        let wire: super::SecretGrantRequest = serde_json::from_value(grant.clone()).unwrap();
        let domain: admin::SecretGrantRequest = serde_json::from_value(grant).unwrap();
        assert_eq!(
            serde_json::to_value(admin::SecretGrantRequest::from(wire)).unwrap(),
            serde_json::to_value(domain).unwrap()
        );
    }
}
