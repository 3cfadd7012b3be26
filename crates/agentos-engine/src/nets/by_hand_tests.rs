//! Fires by hand and starts against parked tokens: a fire by hand binds as the fire loop does,
//! skipping what its transition parked, and a manual transition refuses a start it would ignore.

use std::sync::Arc;

use agentos_core::ErrorKind;
use agentos_core::net::NetDoc;
use agentos_store::{FsBlobStore, SqliteEventLog};
use serde_json::{Value, json};

use crate::{Engine, EngineConfig, EngineError, Principal};

async fn open(dir: &std::path::Path) -> (Engine, Principal) {
    let log = Arc::new(SqliteEventLog::open(&dir.join("events.db")).unwrap());
    let blobs = Arc::new(FsBlobStore::open(dir.join("blobs")).unwrap());
    let e = Engine::open(EngineConfig::default(), log, blobs).await.unwrap();
    e.principals().ensure_operator(&dir.join("operator.token")).await.unwrap();
    let op = e.operator().expect("the operator exists");
    (e, op)
}

/// One `map` transition, `t`, whose template raises on a token with `bad`.
async fn poison_net(e: &Engine, op: &Principal, mode: &str) {
    let doc: NetDoc = serde_json::from_value(json!({
        "places": ["p-in", "p-out"],
        "transitions": [{"id": "t", "kind": "map", "mode": mode,
            "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-out"}},
            "action": {"template": "${if .i.data.bad then error(\"poison\") else .i.data end}"},
            "emit": [{"to": "o"}]}]
    }))
    .unwrap();
    e.nets().apply_net(op, "m", doc).await.unwrap();
}

fn data_in(e: &Engine, place: &str) -> Vec<Value> {
    let st = e.read_state();
    st.nets.models["m"].places[place].tokens.values().map(|t| t.data.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fire_by_hand_skips_a_parked_poison_token_and_fires_the_good_one_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let (e, op) = open(dir.path()).await;
    poison_net(&e, &op, "manual").await;
    let bad = e.nets().put_token(&op, "m", "p-in", json!({"bad": true}), None).await.unwrap();
    let o = e.nets().fire_once(&op, "m", "t").await.unwrap();
    assert_eq!(o.outcome, "failed", "{o:?}");
    assert!(o.reason.as_deref().unwrap_or_default().contains("poison"), "{o:?}");

    e.nets().put_token(&op, "m", "p-in", json!({"v": "good"}), None).await.unwrap();
    let o = e.nets().fire_once(&op, "m", "t").await.unwrap();
    assert_eq!(o.outcome, "fired", "the fire bound the parked token again: {o:?}");
    assert_eq!(data_in(&e, "p-out"), vec![json!({"v": "good"})]);

    // Only the parked token is left: not enabled, and the reason says how to release it.
    let o = e.nets().fire_once(&op, "m", "t").await.unwrap();
    assert_eq!(o.outcome, "not-enabled", "{o:?}");
    let reason = o.reason.unwrap_or_default();
    for part in ["parked for t", bad.id.as_str(), "agentos net retry", "agentos net discard", "agentos net parked t"] {
        assert!(reason.contains(part), "{part:?} is not in {reason:?}");
    }
    let parked = e.nets().parked(&op, "m", Some("t")).unwrap();
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!((parked[0].token.id.as_str(), parked[0].attempts), (bad.id.as_str(), 1), "{parked:?}");

    // Released, the next fire by hand binds it again.
    e.nets().retry_parked(&op, "m", &bad.id).await.unwrap();
    let o = e.nets().fire_once(&op, "m", "t").await.unwrap();
    assert_eq!(o.outcome, "failed", "{o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_transition_refuses_a_start_and_a_start_keeps_parked_tokens_parked() {
    let dir = tempfile::tempdir().unwrap();
    let (e, op) = open(dir.path()).await;
    poison_net(&e, &op, "manual").await;
    let refused = e.nets().set_started(&op, "m", "t", true).await.unwrap_err();
    let EngineError::Core(c) = refused else { panic!("{refused:?}") };
    assert_eq!((c.kind, c.code), (ErrorKind::BadInput, "manual_transition"), "{}", c.message);
    assert!(c.message.contains("agentos net fire t"), "{}", c.message);
    assert!(!e.read_state().nets.models["m"].transitions["t"].started);
    // A stop is still answered: it does no harm.
    e.nets().set_started(&op, "m", "t", false).await.unwrap();

    // The same transition in mode auto: its parked token stays parked through a start.
    poison_net(&e, &op, "auto").await;
    let bad = e.nets().put_token(&op, "m", "p-in", json!({"bad": true}), None).await.unwrap();
    assert_eq!(e.nets().fire_once(&op, "m", "t").await.unwrap().outcome, "failed");
    e.nets().set_started(&op, "m", "t", true).await.unwrap();
    let parked = e.nets().parked(&op, "m", Some("t")).unwrap();
    assert_eq!(parked.len(), 1, "a start released the parked token: {parked:?}");
    assert_eq!((parked[0].token.id.as_str(), parked[0].attempts), (bad.id.as_str(), 1), "{parked:?}");
}
