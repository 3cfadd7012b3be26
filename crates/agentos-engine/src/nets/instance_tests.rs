//! Tool-net instances leave nothing behind: not in the state, not in the net runtime's maps,
//! and not after a master that died during an invocation starts again.

use std::sync::Arc;
use std::time::Duration;

use agentos_core::job::InvokeRequest;
use agentos_store::{FsBlobStore, SqliteEventLog};
use serde_json::json;

use super::INSTANCE_PREFIX;
use crate::{Engine, EngineConfig, Principal};

fn operator(e: &Engine) -> Principal {
    e.operator().expect("the operator exists")
}

/// An engine over `dir`, with its operator (a tool net's transitions act with its authority).
async fn open(dir: &std::path::Path) -> Engine {
    let log = Arc::new(SqliteEventLog::open(&dir.join("events.db")).unwrap());
    let blobs = Arc::new(FsBlobStore::open(dir.join("blobs")).unwrap());
    let e = Engine::open(EngineConfig::default(), log, blobs).await.unwrap();
    e.principals().ensure_operator(&dir.join("operator.token")).await.unwrap();
    e
}

/// Instances in the state's models and nets, and models the net runtime keeps anything for.
fn instances_held(e: &Engine) -> (usize, Vec<String>) {
    let st = e.read_state();
    let in_state = st.models.keys().chain(st.nets.models.keys()).filter(|m| m.starts_with(INSTANCE_PREFIX)).count();
    let in_runtime = e.inner.nets.models_held().into_iter().filter(|m| m.starts_with(INSTANCE_PREFIX)).collect();
    (in_state, in_runtime)
}

async fn register(e: &Engine, id: &str, net: serde_json::Value) {
    let cmd = json!({"id": id, "name": id, "net": net, "inputPlace": "p-in", "outputPlace": "p-out"});
    e.catalog().register(&operator(e), "TOOL_CATALOG_REGISTER_TOOLNET", cmd).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invocations_leave_no_instance_in_the_state_or_the_runtime_maps() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path()).await;
    // A map then a pass: both compile an inscription and count a fire per invocation.
    register(
        &e,
        "twice",
        json!({"places": ["p-in", "p-mid", "p-out"], "transitions": [
            {"id": "double", "kind": "map", "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-mid"}},
             "action": {"template": {"n": "${.i.data.n * 2}"}}, "emit": [{"to": "o"}]},
            {"id": "move", "kind": "pass", "presets": {"i": {"place": "p-mid"}}, "postsets": {"o": {"place": "p-out"}},
             "emit": [{"to": "o"}]}]}),
    )
    .await;
    for n in 0..30 {
        let req = InvokeRequest { input: Some(json!({"n": n})), timeout_ms: Some(10_000), ..Default::default() };
        let answer = e.dispatch().invoke(&operator(&e), "twice", None, req).await.unwrap();
        assert_eq!(answer["output"], json!({"n": n * 2}), "{answer}");
    }
    assert_eq!(instances_held(&e), (0, vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_left_by_a_master_that_died_mid_invocation_is_deleted_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path()).await;
    // No executor: the command waits in its place, and the invocation with it.
    register(
        &e,
        "stuck",
        json!({"places": ["p-in", "p-out"], "transitions": [
            {"id": "run", "kind": "command", "presets": {"c": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}},
             "emit": [{"to": "o"}]}]}),
    )
    .await;
    let invoking = e.clone();
    let call = tokio::spawn(async move {
        let input = json!({"executor": "bash", "command": "true", "args": {}});
        let req = InvokeRequest { input: Some(input), timeout_ms: Some(60_000), ..Default::default() };
        invoking.dispatch().invoke(&operator(&invoking), "stuck", None, req).await
    });
    for _ in 0..500 {
        if instances_held(&e).0 > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(instances_held(&e).0 > 0, "the instance never appeared");
    // As if the master died: the invocation never reaches its cleanup.
    call.abort();
    let _ = call.await;
    drop(e);

    let e = open(dir.path()).await;
    assert_eq!(instances_held(&e), (0, vec![]));
}
