//! A `pass` or `map` fire and the start of the command fire its output enables go in one
//! commit, and only where deciding the start needs nothing but the net.

use std::sync::Arc;

use agentos_core::net::NetDoc;
use agentos_core::net_state::{NetEvent, NewToken, fire_id, token_id};
use agentos_store::{FsBlobStore, SqliteEventLog};
use serde_json::{Value, json};

use crate::{Engine, EngineConfig, Principal};

async fn open(dir: &std::path::Path) -> (Engine, Principal) {
    open_with(dir, EngineConfig::default()).await
}

async fn open_with(dir: &std::path::Path, config: EngineConfig) -> (Engine, Principal) {
    let log = Arc::new(SqliteEventLog::open(&dir.join("events.db")).unwrap());
    let blobs = Arc::new(FsBlobStore::open(dir.join("blobs")).unwrap());
    let e = Engine::open(config, log, blobs).await.unwrap();
    e.principals().ensure_operator(&dir.join("operator.token")).await.unwrap();
    let op = e.operator().expect("the operator exists");
    (e, op)
}

/// A map that fills `p-cmd` (never started: the test commits its fire by hand) and a started
/// command transition reading `p-cmd`, with `preset` as its preset.
async fn model(e: &Engine, op: &Principal, name: &str, preset: Value) {
    let doc: NetDoc = serde_json::from_value(json!({
        "places": ["p-in", "p-cmd", "p-out", "p-other"],
        "transitions": [
            {"id": "build", "kind": "map", "presets": {"i": {"place": "p-in"}}, "postsets": {"o": {"place": "p-cmd"}},
             "action": {"template": "${.i.data}"}, "emit": [{"to": "o"}]},
            {"id": "run", "kind": "command", "presets": {"c": preset}, "postsets": {"o": {"place": "p-out"}},
             "emit": [{"to": "o"}]}]
    }))
    .unwrap();
    e.nets().apply_net(op, name, doc).await.unwrap();
    e.nets().set_started(op, name, "run", true).await.unwrap();
}

/// What the map's fire would commit: one command token into `p-cmd`.
fn fired(op: &Principal) -> NetEvent {
    let data = json!({"executor": "script", "command": "invoke", "args": {"toolId": "nothing-registered"}});
    NetEvent::Fired {
        transition: "build".into(),
        consumed: Vec::new(),
        outputs: vec![NewToken { place: "p-cmd".into(), name: None, data, by: vec![op.id.clone()] }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_fire_and_the_command_start_it_enables_are_one_commit_and_only_when_the_net_alone_decides_it() {
    let dir = tempfile::tempdir().unwrap();
    let (e, op) = open(dir.path()).await;

    model(&e, &op, "chained", json!({"place": "p-cmd"})).await;
    let before = e.read_state().last_seq;
    let started = e.nets().commit_fired("system", "chained", fired(&op), false).await.unwrap();
    // One submission, one transaction: the fire at the next number, binding the token the map
    // made, which it holds.
    let (fired_seq, start_seq) = (before + 1, before + 2);
    assert_eq!(started, vec![fire_id(start_seq)]);
    {
        let st = e.read_state();
        assert_eq!(st.last_seq, start_seq);
        let net = &st.nets.models["chained"];
        let fire = &net.in_flight[&fire_id(start_seq)];
        assert_eq!(fire.transition, "run");
        let bound: Vec<&str> = fire.bound["c"].iter().map(|r| r.id.as_str()).collect();
        assert_eq!(bound, [token_id(fired_seq, 0).as_str()]);
        assert_eq!(net.places["p-cmd"].reserved.get(&token_id(fired_seq, 0)), Some(&fire_id(start_seq)));
    }

    // A filtered preset needs an expression evaluated: left to the fire loop.
    model(&e, &op, "filtered", json!({"place": "p-cmd", "filter": ".data.executor == \"script\""})).await;
    assert_eq!(e.nets().commit_fired("system", "filtered", fired(&op), false).await.unwrap(), Vec::<String>::new());
    // A transition that is not started is not started by a fire either.
    model(&e, &op, "stopped", json!({"place": "p-cmd"})).await;
    e.nets().set_started(&op, "stopped", "run", false).await.unwrap();
    assert_eq!(e.nets().commit_fired("system", "stopped", fired(&op), false).await.unwrap(), Vec::<String>::new());
    // Places transitions read from too full to copy for the decision: left to the fire loop.
    model(&e, &op, "large", json!({"place": "p-cmd"})).await;
    for n in 0..=super::CHAIN_MAX_TOKENS {
        e.nets().put_token(&op, "large", "p-in", json!({"n": n}), None).await.unwrap();
    }
    assert_eq!(e.nets().commit_fired("system", "large", fired(&op), false).await.unwrap(), Vec::<String>::new());
    // As many tokens in a place no transition reads (results piling up) do not stop the chain.
    model(&e, &op, "piled", json!({"place": "p-cmd"})).await;
    for n in 0..=super::CHAIN_MAX_TOKENS {
        e.nets().put_token(&op, "piled", "p-other", json!({"n": n}), None).await.unwrap();
    }
    let before = e.read_state().last_seq;
    assert_eq!(e.nets().commit_fired("system", "piled", fired(&op), false).await.unwrap(), vec![fire_id(before + 2)]);
    // A fire by hand is its firer's: the start that follows is the loop's, under its own name.
    model(&e, &op, "by-hand", json!({"place": "p-cmd"})).await;
    assert_eq!(e.nets().commit_fired(&op.name, "by-hand", fired(&op), true).await.unwrap(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_pass_and_plain_map_fires_ends_in_a_command_start_in_one_commit_and_stops_at_a_computed_template() {
    let dir = tempfile::tempdir().unwrap();
    let (e, op) = open(dir.path()).await;
    // seed (by hand) → p-x → move (pass) → p-y → build (map, a plain path) → p-cmd → run (command).
    let net = |template: &str| {
        serde_json::from_value::<NetDoc>(json!({
            "places": ["p-x", "p-y", "p-cmd", "p-out"],
            "transitions": [
                {"id": "move", "kind": "pass", "presets": {"i": {"place": "p-x"}}, "postsets": {"o": {"place": "p-y"}},
                 "emit": [{"to": "o"}]},
                {"id": "build", "kind": "map", "presets": {"i": {"place": "p-y"}}, "postsets": {"o": {"place": "p-cmd"}},
                 "action": {"template": {"executor": "script", "command": "invoke", "args": {"toolId": "t", "input": template}}},
                 "emit": [{"to": "o"}]},
                {"id": "run", "kind": "command", "presets": {"c": {"place": "p-cmd"}}, "postsets": {"o": {"place": "p-out"}},
                 "emit": [{"to": "o"}]}]
        }))
        .unwrap()
    };
    let seed = |place: &str| NetEvent::Fired {
        transition: "seed".into(),
        consumed: Vec::new(),
        outputs: vec![NewToken { place: place.into(), name: None, data: json!({"n": 1}), by: vec![op.id.clone()] }],
    };
    for (model, template) in [("plain", "${.i.data}"), ("computed", "${.i.data.n + 1}")] {
        e.nets().apply_net(&op, model, net(template)).await.unwrap();
        for t in ["move", "build", "run"] {
            e.nets().set_started(&op, model, t, true).await.unwrap();
        }
    }

    let before = e.read_state().last_seq;
    let started = e.nets().commit_fired("system", "plain", seed("p-x"), false).await.unwrap();
    // seed, move, build and the start of run: four events, one commit.
    assert_eq!(started, vec![fire_id(before + 4)]);
    {
        let st = e.read_state();
        assert_eq!(st.last_seq, before + 4);
        let net = &st.nets.models["plain"];
        let fire = &net.in_flight[&fire_id(before + 4)];
        let cmd = net.token(&fire.bound["c"][0]).unwrap();
        assert_eq!(cmd.data["args"]["input"], json!({"n": 1}), "the map's plain path was rendered");
        assert_eq!((net.transitions["move"].fires, net.transitions["build"].fires), (1, 1));
    }

    // A template that computes needs an expression worker: the chain ends before the map (the
    // fire loop fires it on a turn of its own). Decided on the state as it is, as the committer
    // would: the pass follows the seed, and nothing after it.
    let decided = {
        let st = e.read_state();
        e.nets().follow_on(&st, "computed", &[seed("p-x")], st.last_seq + 1)
    };
    let fired: Vec<&str> = decided
        .iter()
        .map(|ev| match ev {
            NetEvent::Fired { transition, .. } => transition.as_str(),
            other => panic!("only the pass follows: {other:?}"),
        })
        .collect();
    assert_eq!(fired, ["move"]);
    // The same on the plain model: the pass and the map, and no start of the command, whose
    // one fire allowed (concurrency 1) is in flight from the commit above.
    let decided = {
        let st = e.read_state();
        e.nets().follow_on(&st, "plain", &[seed("p-x")], st.last_seq + 1)
    };
    let kinds: Vec<String> = decided
        .iter()
        .map(|ev| match ev {
            NetEvent::Fired { transition, .. } => format!("fired {transition}"),
            NetEvent::FireStarted { transition, .. } => format!("started {transition}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, ["fired move", "fired build"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_counts_the_tokens_of_places_no_transition_reads_against_the_place_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = EngineConfig::default();
    config.nets.max_tokens_per_place = 3;
    let (e, op) = open_with(dir.path(), config).await;
    // p-x → move (pass) → p-y, which nothing reads: its tokens are counted, not copied.
    let doc: NetDoc = serde_json::from_value(json!({
        "places": ["p-x", "p-y"],
        "transitions": [{"id": "move", "kind": "pass", "presets": {"i": {"place": "p-x"}},
            "postsets": {"o": {"place": "p-y"}}, "emit": [{"to": "o"}]}]
    }))
    .unwrap();
    e.nets().apply_net(&op, "m", doc).await.unwrap();
    e.nets().set_started(&op, "m", "move", true).await.unwrap();
    let seed = NetEvent::Fired {
        transition: "seed".into(),
        consumed: Vec::new(),
        outputs: vec![NewToken { place: "p-x".into(), name: None, data: json!({"n": 1}), by: vec![op.id.clone()] }],
    };
    let follows = |e: &Engine| {
        let st = e.read_state();
        e.nets().follow_on(&st, "m", std::slice::from_ref(&seed), st.last_seq + 1).len()
    };
    for n in 0..2 {
        e.nets().put_token(&op, "m", "p-y", json!({"n": n}), None).await.unwrap();
    }
    assert_eq!(follows(&e), 1, "two tokens in p-y: the pass fits and follows");
    // A leading event that also puts a token into p-y: counted with the ones left out.
    let both = NetEvent::Fired {
        transition: "seed".into(),
        consumed: Vec::new(),
        outputs: ["p-x", "p-y"]
            .map(|place| NewToken { place: place.into(), name: None, data: json!({"n": 1}), by: vec![op.id.clone()] })
            .to_vec(),
    };
    let led = {
        let st = e.read_state();
        e.nets().follow_on(&st, "m", &[both], st.last_seq + 1).len()
    };
    assert_eq!(led, 0, "two held and one led in: the pass would make four");
    e.nets().put_token(&op, "m", "p-y", json!({"n": 2}), None).await.unwrap();
    assert_eq!(follows(&e), 0, "p-y is full: the chain ends, and the fire loop stops the transition");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fire_loop_tries_only_transitions_whose_consumed_places_hold_a_token_or_whose_author_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (e, op) = open(dir.path()).await;
    model(&e, &op, "m", json!({"place": "p-cmd"})).await;
    let may_bind = |e: &Engine| {
        let st = e.read_state();
        let net = st.nets.models.get("m").unwrap();
        let t = net.inscription("run").unwrap();
        crate::engine::Nets::may_bind(&st, net, t)
    };
    assert!(!may_bind(&e), "an empty place binds nothing");
    // A token arrives (its fire may take it at once: what counts is that it was tried).
    e.nets().commit_fired("system", "m", fired(&op), false).await.unwrap();
    assert!(may_bind(&e), "a place with a token may bind");

    // A transition whose author is gone is tried with nothing to bind: the try stops it.
    model(&e, &op, "n", json!({"place": "p-cmd"})).await;
    let mut st = (*e.read_state()).clone();
    let net = st.nets.models.get_mut("n").unwrap();
    net.authors.insert("run".into(), "no-such-principal".into());
    let net = st.nets.models.get("n").unwrap();
    assert!(crate::engine::Nets::may_bind(&st, net, net.inscription("run").unwrap()));
}

/// The SQLite log, with the sequence numbers of each of its transactions written down.
struct Transactions {
    log: SqliteEventLog,
    seen: std::sync::Mutex<Vec<Vec<u64>>>,
}

#[async_trait::async_trait]
impl agentos_store::EventLog for Transactions {
    fn append_blocking(
        &self,
        after: u64,
        events: Vec<agentos_store::NewEvent>,
    ) -> Result<Vec<agentos_store::RecordedEvent>, agentos_store::StoreError> {
        let out = self.log.append_blocking(after, events)?;
        self.seen.lock().unwrap().push(out.iter().map(|r| r.seq).collect());
        Ok(out)
    }
    async fn read_after(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<agentos_store::RecordedEvent>, agentos_store::StoreError> {
        self.log.read_after(after, limit).await
    }
    async fn read_key(
        &self,
        model: &str,
        key: &str,
    ) -> Result<Vec<agentos_store::RecordedEvent>, agentos_store::StoreError> {
        self.log.read_key(model, key).await
    }
    async fn read_key_any_model(
        &self,
        key: &str,
    ) -> Result<Vec<agentos_store::RecordedEvent>, agentos_store::StoreError> {
        self.log.read_key_any_model(key).await
    }
    async fn last_seq(&self) -> Result<u64, agentos_store::StoreError> {
        self.log.last_seq().await
    }
    async fn save_snapshot(&self, snapshot: agentos_store::Snapshot) -> Result<(), agentos_store::StoreError> {
        self.log.save_snapshot(snapshot).await
    }
    async fn load_snapshot(&self) -> Result<Option<agentos_store::Snapshot>, agentos_store::StoreError> {
        self.log.load_snapshot().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_put_takes_the_fires_it_enables_into_its_commit_recorded_as_the_masters_own() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Transactions {
        log: SqliteEventLog::open(&dir.path().join("events.db")).unwrap(),
        seen: Default::default(),
    });
    let blobs = Arc::new(FsBlobStore::open(dir.path().join("blobs")).unwrap());
    let e = Engine::open(EngineConfig::default(), log.clone(), blobs).await.unwrap();
    e.principals().ensure_operator(&dir.path().join("operator.token")).await.unwrap();
    let op = e.operator().expect("the operator exists");
    // p-in → build (map, a plain path) → p-cmd → run (command), both started.
    model(&e, &op, "m", json!({"place": "p-cmd"})).await;
    e.nets().set_started(&op, "m", "build", true).await.unwrap();
    let before = e.read_state().last_seq;
    let command = json!({"executor": "script", "command": "invoke", "args": {"toolId": "nothing-registered"}});
    let token = e.nets().put_token(&op, "m", "p-in", command, None).await.unwrap();
    // Answered with the put token, not with a follow-on's.
    assert_eq!(token.id, token_id(before + 1, 0));
    let recs = e.inner.ledger.log.read_after(before, 10).await.unwrap();
    let seen: Vec<(u64, String, String)> = recs
        .iter()
        .take(3)
        .map(|r| {
            let payload: Value = serde_json::from_str(&r.event.payload).unwrap();
            let what = payload.as_object().and_then(|o| o.keys().next().cloned()).unwrap_or_default();
            (r.seq, what, r.event.principal.clone())
        })
        .collect();
    assert_eq!(
        seen,
        [
            (before + 1, "tokensPut".to_string(), op.name.clone()),
            (before + 2, "fired".to_string(), "system".to_string()),
            (before + 3, "fireStarted".to_string(), "system".to_string()),
        ],
        "the put, the map it enables and the command's start, in one run of numbers"
    );
    // In one transaction of the log.
    assert!(log.seen.lock().unwrap().contains(&vec![before + 1, before + 2, before + 3]), "{:?}", log.seen);
    {
        let st = e.read_state();
        assert_eq!(st.nets.models["m"].in_flight[&fire_id(before + 3)].transition, "run");
    }

    // Into a place no started transition reads, a put is the putter's alone.
    let before = e.read_state().last_seq;
    e.nets().put_token(&op, "m", "p-other", json!({"n": 1}), None).await.unwrap();
    assert_eq!(e.read_state().last_seq, before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fire_the_loop_chose_before_its_transition_was_stopped_is_not_committed_after_the_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (e, op) = open(dir.path()).await;
    model(&e, &op, "m", json!({"place": "p-cmd"})).await;
    e.nets().set_started(&op, "m", "build", true).await.unwrap();
    // Decided while the transition is started, as the loop does; the stop is committed first.
    let decide = super::Nets::while_started("m", "build", e.nets().leading("m", fired(&op), 0));
    e.nets().set_started(&op, "m", "build", false).await.unwrap();
    let before = e.read_state().last_seq;
    let refused = e.nets().commit_chain("system", "m", decide).await.expect_err("a fire committed after its stop");
    assert!(
        matches!(&refused, crate::EngineError::Core(c) if c.kind == agentos_core::ErrorKind::Conflict),
        "{refused}"
    );
    assert_eq!(e.read_state().last_seq, before, "nothing was committed");
    // Started again, the same fire commits.
    e.nets().set_started(&op, "m", "build", true).await.unwrap();
    let decide = super::Nets::while_started("m", "build", e.nets().leading("m", fired(&op), 0));
    e.nets().commit_chain("system", "m", decide).await.unwrap();
    assert!(e.read_state().last_seq > before, "the fire was committed once started again");
}
