//! Restart folds a snapshot plus the log tail into the same state a full replay gives.

use std::sync::Arc;

use agentos_core::event::PrincipalKind;
use agentos_core::flags::Flags;
use agentos_core::search::SearchQuery;
use agentos_engine::{Engine, EngineConfig, Principal, Restored};
use agentos_store::{FsBlobStore, SqliteEventLog};

fn operator() -> Principal {
    Principal {
        id: "operator".into(),
        name: "operator".into(),
        kind: PrincipalKind::Operator,
        flags: Flags::all(),
        home_model: "default".into(),
    }
}

async fn open(dir: &std::path::Path, snapshot_every: u64) -> Engine {
    let log = Arc::new(SqliteEventLog::open(&dir.join("events.db")).unwrap());
    let blobs = Arc::new(FsBlobStore::open(dir.join("blobs")).unwrap());
    Engine::open(EngineConfig { snapshot_every, ..Default::default() }, log, blobs).await.unwrap()
}

fn script(id: &str, model: &str, content: &str) -> serde_json::Value {
    serde_json::json!({"id": id, "name": id, "runtime": "sh", "content": content, "model": model})
}

const REGISTER: &str = "TOOL_CATALOG_REGISTER_SCRIPT";

fn everything(e: &Engine) -> serde_json::Value {
    let q = |m: Option<&str>| SearchQuery { model: m.map(str::to_string), limit: 1000, ..Default::default() };
    let op = operator();
    serde_json::json!({
        "global": e.catalog().search(&op, &q(None)).unwrap(),
        "local": e.catalog().search(&op, &q(Some("m"))).unwrap(),
        "models": e.catalog().models(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_plus_tail_equals_full_replay() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path(), 1_000_000).await;
    let op = operator();
    for i in 0..30 {
        e.catalog()
            .register(
                &op,
                REGISTER,
                script(&format!("t{i}"), if i % 2 == 0 { "default" } else { "m" }, &format!("echo {i}")),
            )
            .await
            .unwrap();
    }
    let snap = e.snapshot_now().await.unwrap();
    for i in 0..7 {
        e.catalog().register(&op, REGISTER, script(&format!("t{i}"), "m", "echo changed")).await.unwrap();
    }
    let expected = everything(&e);
    let last = e.last_seq();
    // No shutdown: as after a kill, the final snapshot is never written.
    drop(e);

    let e = open(dir.path(), 1_000_000).await;
    assert_eq!(e.restored(), Restored { snapshot_seq: snap, replayed: last - snap });
    assert_eq!(everything(&e), expected);
    e.shutdown().await;

    let e = open(dir.path(), 1_000_000).await;
    assert_eq!(e.restored(), Restored { snapshot_seq: last, replayed: 0 }, "shutdown writes a final snapshot");
    assert_eq!(everything(&e), expected);
}
