//! Direct jobs survive a restart through the job store, and a job whose result is already in
//! the log is never queued again.

use std::sync::Arc;
use std::time::Duration;

use agentos_core::event::PrincipalKind;
use agentos_core::flags::Flags;
use agentos_core::job::{ExecutorResult, InvokeRequest};
use agentos_engine::dispatch::Worker;
use agentos_engine::{Engine, EngineConfig, Principal};
use agentos_store::{FsBlobStore, JobStore, SqliteEventLog, SqliteJobStore};

fn principal(name: &str, kind: PrincipalKind) -> Principal {
    let flags = if kind == PrincipalKind::Operator { Flags::all() } else { Flags::empty() };
    Principal { id: name.into(), name: name.into(), kind, flags, home_model: "default".into() }
}

/// Jobs left in `store` once it is empty, or after two seconds: removals are written off the
/// caller's path.
async fn left_after_waiting(store: &dyn JobStore) -> usize {
    let mut left = usize::MAX;
    for _ in 0..200 {
        left = store.all().await.unwrap().len();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    left
}

async fn open(dir: &std::path::Path) -> (Engine, Arc<SqliteJobStore>, usize) {
    open_with(dir, EngineConfig::default()).await
}

async fn open_with(dir: &std::path::Path, config: EngineConfig) -> (Engine, Arc<SqliteJobStore>, usize) {
    let log = Arc::new(SqliteEventLog::open(&dir.join("events.db")).unwrap());
    let blobs = Arc::new(FsBlobStore::open(dir.join("blobs")).unwrap());
    let engine = Engine::open(config, log, blobs).await.unwrap();
    let store = Arc::new(SqliteJobStore::open(&dir.join("jobs.db")).unwrap());
    let requeued = engine.dispatch().recover_jobs(store.clone()).await.unwrap();
    (engine, store, requeued)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_job_is_queued_again_after_a_restart_unless_its_result_is_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (op, exec) = (principal("operator", PrincipalKind::Operator), principal("e1", PrincipalKind::Executor));
    let (e, store, _) = open(dir.path()).await;
    let script = serde_json::json!({"id": "t", "name": "t", "runtime": "sh", "content": "echo hi", "model": "default"});
    e.catalog().register(&op, "TOOL_CATALOG_REGISTER_SCRIPT", script).await.unwrap();
    let invoke = || InvokeRequest { timeout_ms: Some(5000), ..Default::default() };
    let done = e.dispatch().invoke_async(&op, "t", None, invoke()).await.unwrap();
    let open_job = e.dispatch().invoke_async(&op, "t", None, invoke()).await.unwrap();
    assert_eq!(store.all().await.unwrap().len(), 2, "both jobs are stored before they are answered");
    // An executor finishes the first; the second is still queued when the master dies.
    let leased =
        e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_secs(1)).await.unwrap().unwrap();
    assert_eq!(leased.job_id, done);
    let result = ExecutorResult { lease_id: leased.lease_id, exit_code: Some(0), ..Default::default() };
    e.dispatch().complete_job(&exec, None, &done, result).await.unwrap();
    let mut finished = None;
    for _ in 0..200 {
        finished = e.dispatch().job(&op, &done).await.ok().filter(|j| j.state == "finished");
        if finished.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(finished.is_some(), "the first job's result was not recorded");
    // As if the master died after recording the result and before forgetting the job.
    let stored = store.get(&open_job).await.unwrap().unwrap();
    store.put(agentos_store::StoredJob { job_id: done.clone(), ..stored }).await.unwrap();
    drop((e, store));

    let (e, store, requeued) = open(dir.path()).await;
    assert_eq!(requeued, 1, "only the job without a result runs again");
    let ids: Vec<String> = store.all().await.unwrap().into_iter().map(|j| j.job_id).collect();
    assert_eq!(ids, std::slice::from_ref(&open_job));
    assert_eq!(e.dispatch().job(&op, &open_job).await.unwrap().state, "queued");
    let leased =
        e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_secs(1)).await.unwrap().unwrap();
    assert_eq!((leased.job_id.as_str(), leased.attempt), (open_job.as_str(), 1));
    assert!(
        e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_millis(50)).await.unwrap().is_none(),
        "a finished job ran again"
    );
}

/// The states `job_id` reads as, each change once (an error's text for a refusal), read as fast
/// as the reads go until it reads `finished`, for at most ten seconds.
async fn states_until_finished(e: &Engine, op: &Principal, job_id: &str) -> Vec<String> {
    let mut states: Vec<String> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state = e.dispatch().job(op, job_id).await.map(|j| j.state).unwrap_or_else(|err| err.to_string());
        let done = state == "finished";
        if states.last() != Some(&state) {
            states.push(state);
        }
        if done {
            return states;
        }
        assert!(std::time::Instant::now() < deadline, "never finished: {states:?}");
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_result_is_being_committed_reads_as_running_never_as_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let (op, exec) = (principal("operator", PrincipalKind::Operator), principal("e1", PrincipalKind::Executor));
    let (e, _store, _) = open(dir.path()).await;
    let script = serde_json::json!({"id": "t", "name": "t", "runtime": "sh", "content": "echo hi", "model": "default"});
    e.catalog().register(&op, "TOOL_CATALOG_REGISTER_SCRIPT", script).await.unwrap();
    for _ in 0..20 {
        let req = InvokeRequest { timeout_ms: Some(5000), ..Default::default() };
        let id = e.dispatch().invoke_async(&op, "t", None, req).await.unwrap();
        let leased =
            e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_secs(1)).await.unwrap().unwrap();
        let result = ExecutorResult { lease_id: leased.lease_id, exit_code: Some(0), ..Default::default() };
        e.dispatch().complete_job(&exec, None, &id, result).await.unwrap();
        // The result is taken and its commit is under way: a reader polling for it must not be
        // told the job does not exist.
        let states = states_until_finished(&e, &op, &id).await;
        assert!(states == ["finished"] || states == ["running", "finished"], "{states:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_net_jobs_result_reads_as_running_until_its_fire_records_it_never_as_unknown_and_it_is_not_cancelled_alone() {
    let dir = tempfile::tempdir().unwrap();
    let exec = principal("e1", PrincipalKind::Executor);
    let (e, _store, _) = open(dir.path()).await;
    e.principals().ensure_operator(&dir.path().join("operator.token")).await.unwrap();
    let op = e.operator().unwrap();
    let script = serde_json::json!({"id": "t", "name": "t", "runtime": "sh", "content": "echo hi", "model": "default"});
    e.catalog().register(&op, "TOOL_CATALOG_REGISTER_SCRIPT", script).await.unwrap();
    let doc: agentos_core::net::NetDoc = serde_json::from_value(serde_json::json!({
        "places": ["p-in", "p-out"],
        "transitions": [{"id": "run", "kind": "command", "presets": {"c": {"place": "p-in"}},
                         "postsets": {"o": {"place": "p-out"}}, "emit": [{"to": "o"}]}]
    }))
    .unwrap();
    e.nets().apply_net(&op, "default", doc).await.unwrap();
    e.nets().set_started(&op, "default", "run", true).await.unwrap();
    for n in 0..10 {
        let command = serde_json::json!({"executor": "script", "command": "invoke", "args": {"toolId": "t"}});
        e.nets().put_token(&op, "default", "p-in", command, None).await.unwrap();
        let leased =
            e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_secs(5)).await.unwrap().unwrap();
        if n == 0 {
            // A net's step is not cancelled alone: the refusal names the transition to stop.
            let err = e.dispatch().cancel_job(&op, &leased.job_id).await.unwrap_err();
            assert_eq!(err.code(), "net_job");
            let told = err.to_string();
            assert!(told.contains(r#"is a step of transition "run" of model "default""#), "{told}");
            assert!(told.contains("`agentos net stop run --model default`"), "{told}");
            assert!(told.contains("POST /api/models/default/transitions/run/stop"), "{told}");
            assert!(told.contains("it ends with its fire, when its command ends or times out"), "{told}");
            // An agent that may read the job (`l` in its model) is told the same, not that
            // another principal invoked it.
            let mut agent = principal("a1", PrincipalKind::Agent);
            agent.flags = "rwx-l".parse().unwrap();
            let err = e.dispatch().cancel_job(&agent, &leased.job_id).await.unwrap_err();
            assert_eq!((err.code(), err.to_string()), ("net_job", told));
        }
        let result = ExecutorResult {
            lease_id: leased.lease_id,
            exit_code: Some(0),
            stdout_base64: "e30K".into(),
            ..Default::default()
        };
        e.dispatch().complete_job(&exec, None, &leased.job_id, result).await.unwrap();
        // The fire has the result and records it with its outcome, in a commit of its own.
        let states = states_until_finished(&e, &op, &leased.job_id).await;
        assert!(states == ["finished"] || states == ["running", "finished"], "job {n}: {states:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_the_blob_store_cannot_keep_leaves_a_result_that_says_so_and_keeps_the_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let (op, exec) = (principal("operator", PrincipalKind::Operator), principal("e1", PrincipalKind::Executor));
    let (e, _store, _) = open(dir.path()).await;
    let script = serde_json::json!({"id": "t", "name": "t", "runtime": "sh", "content": "echo hi", "model": "default"});
    e.catalog().register(&op, "TOOL_CATALOG_REGISTER_SCRIPT", script).await.unwrap();
    // Large output goes to the blob store under job-output/; a file in that folder's place makes
    // every such write fail, as a full or broken disk would.
    std::fs::write(dir.path().join("blobs").join("job-output"), b"not a folder").unwrap();
    let req = InvokeRequest { timeout_ms: Some(5000), ..Default::default() };
    let id = e.dispatch().invoke_async(&op, "t", None, req).await.unwrap();
    let leased =
        e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_secs(1)).await.unwrap().unwrap();
    use base64::Engine as _;
    let big = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; 1 << 20]);
    let result =
        ExecutorResult { lease_id: leased.lease_id, exit_code: Some(3), stdout_base64: big, ..Default::default() };
    e.dispatch().complete_job(&exec, None, &id, result).await.expect("the result is taken, without its output");
    let mut job = None;
    for _ in 0..200 {
        job = e.dispatch().job(&op, &id).await.ok().filter(|j| j.state == "finished");
        if job.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = &job.expect("the result was recorded").results[0];
    // The start of the stream is kept, as a stored one's preview would be.
    assert_eq!((r.exit_code, r.stdout.as_str(), r.output_truncated), (Some(3), "x".repeat(2000).as_str(), true));
    assert!(r.stdout_blob.is_none());
    let why = r.error.as_deref().unwrap_or_default();
    assert!(
        why.contains("stdout (1048576 bytes) past its first 2000 characters") && why.contains("could not store"),
        "{why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_invocations_count_against_the_invocation_limit_while_their_jobs_are_open() {
    let dir = tempfile::tempdir().unwrap();
    let op = principal("operator", PrincipalKind::Operator);
    let (e, _store, _) =
        open_with(dir.path(), EngineConfig { max_concurrent_invocations: 2, ..Default::default() }).await;
    let script = serde_json::json!({"id": "t", "name": "t", "runtime": "sh", "content": "echo hi", "model": "default"});
    e.catalog().register(&op, "TOOL_CATALOG_REGISTER_SCRIPT", script).await.unwrap();
    for _ in 0..2 {
        e.dispatch().invoke_async(&op, "t", None, InvokeRequest::default()).await.unwrap();
    }
    let err = e.dispatch().invoke_async(&op, "t", None, InvokeRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), "too_many_invocations", "{err}");
    // No executor serves the queue: waiting would not help, and the error says what would.
    assert!(err.to_string().contains("no executor serves the queue"), "{err}");
    // With one polling, waiting for a job to finish is the advice.
    let exec = principal("e1", PrincipalKind::Executor);
    e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_secs(1)).await.unwrap().unwrap();
    let err = e.dispatch().invoke_async(&op, "t", None, InvokeRequest::default()).await.unwrap_err();
    assert!(err.to_string().ends_with("wait for one to finish"), "{err}");
}

/// The SQLite job store, with each transaction's changes written down as they are made.
struct Transactions {
    store: SqliteJobStore,
    seen: std::sync::Mutex<Vec<Vec<String>>>,
}

impl Transactions {
    fn seen(&self) -> Vec<Vec<String>> {
        self.seen.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl JobStore for Transactions {
    async fn write(&self, writes: Vec<agentos_store::JobWrite>) -> Result<(), agentos_store::StoreError> {
        let names = writes
            .iter()
            .map(|w| match w {
                agentos_store::JobWrite::Put(j) => format!("put {}", j.job_id),
                agentos_store::JobWrite::Forget(id) => format!("forget {id}"),
            })
            .collect();
        self.seen.lock().unwrap().push(names);
        self.store.write(writes).await
    }
    async fn put(&self, job: agentos_store::StoredJob) -> Result<(), agentos_store::StoreError> {
        self.seen.lock().unwrap().push(vec![format!("put {}", job.job_id)]);
        self.store.put(job).await
    }
    async fn forget(&self, job_id: &str) -> Result<(), agentos_store::StoreError> {
        self.seen.lock().unwrap().push(vec![format!("forget {job_id}")]);
        self.store.forget(job_id).await
    }
    async fn get(&self, job_id: &str) -> Result<Option<agentos_store::StoredJob>, agentos_store::StoreError> {
        self.store.get(job_id).await
    }
    async fn all(&self) -> Result<Vec<agentos_store::StoredJob>, agentos_store::StoreError> {
        self.store.all().await
    }
}

/// An engine whose waited-for jobs are stored after `store_after`, on `store`, with a script
/// tool `t`.
async fn open_on(dir: &std::path::Path, store_after: Duration, store: Arc<dyn JobStore>) -> Engine {
    let log = Arc::new(SqliteEventLog::open(&dir.join("events.db")).unwrap());
    let blobs = Arc::new(FsBlobStore::open(dir.join("blobs")).unwrap());
    let mut config = EngineConfig::default();
    config.dispatch.store_after = store_after;
    let e = Engine::open(config, log, blobs).await.unwrap();
    e.dispatch().recover_jobs(store).await.unwrap();
    let op = principal("operator", PrincipalKind::Operator);
    let script = serde_json::json!({"id": "t", "name": "t", "runtime": "sh", "content": "echo hi", "model": "default"});
    e.catalog().register(&op, "TOOL_CATALOG_REGISTER_SCRIPT", script).await.unwrap();
    e
}

/// The same, on a job store that writes down its transactions.
async fn open_counting(dir: &std::path::Path, store_after: Duration) -> (Engine, Arc<Transactions>) {
    let store =
        Arc::new(Transactions { store: SqliteJobStore::open(&dir.join("jobs.db")).unwrap(), seen: Default::default() });
    (open_on(dir, store_after, store.clone()).await, store)
}

/// The operator invoking `t` and waiting for its result, in a task of its own.
fn waiting_caller(e: &Engine) -> tokio::task::JoinHandle<Result<serde_json::Value, agentos_engine::EngineError>> {
    let e = e.clone();
    tokio::spawn(async move {
        let req = InvokeRequest { timeout_ms: Some(5000), ..Default::default() };
        e.dispatch().invoke(&principal("operator", PrincipalKind::Operator), "t", None, req).await
    })
}

/// A waited-for invocation of `t` as a caller on a shell makes it, taken by an executor that
/// polls first. Returns the job's id once its caller is answered (after its result is recorded
/// and its removal sent to the store).
async fn waited_call(e: &Engine) -> String {
    let exec = principal("e1", PrincipalKind::Executor);
    let poller = {
        let (e, exec) = (e.clone(), exec.clone());
        tokio::spawn(async move {
            e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_secs(5)).await.unwrap()
        })
    };
    let caller = waiting_caller(e);
    let leased = poller.await.unwrap().unwrap();
    let result = ExecutorResult { lease_id: leased.lease_id, exit_code: Some(0), ..Default::default() };
    e.dispatch().complete_job(&exec, None, &leased.job_id, result).await.unwrap();
    caller.await.unwrap().unwrap();
    leased.job_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waited_for_job_is_stored_once_it_has_run_store_after_and_forgotten_once_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let exec = principal("e1", PrincipalKind::Executor);
    let store_after = Duration::from_millis(400);
    let (e, store) = open_counting(dir.path(), store_after).await;
    // An executor polls first, so the job is handed out the moment it is queued.
    let poller = {
        let (e, exec) = (e.clone(), exec.clone());
        tokio::spawn(async move {
            e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_secs(5)).await.unwrap().unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let invoked = std::time::Instant::now();
    let caller = waiting_caller(&e);
    let leased = poller.await.unwrap();
    assert_eq!(store.seen(), Vec::<Vec<String>>::new(), "a job that just started is not stored yet");
    // Once it has run `store_after`, it is in the store: a master that died now would run it again.
    let mut stored = None;
    for _ in 0..300 {
        stored = store.get(&leased.job_id).await.unwrap();
        if stored.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(invoked.elapsed() >= store_after, "stored after {:?}", invoked.elapsed());
    assert_eq!(stored.map(|j| j.invoker), Some("operator".to_string()), "the running job is stored");
    let result = ExecutorResult { lease_id: leased.lease_id, exit_code: Some(7), ..Default::default() };
    e.dispatch().complete_job(&exec, None, &leased.job_id, result).await.unwrap();
    let answer = caller.await.unwrap().unwrap();
    assert_eq!(answer["exitCode"], 7, "{answer}");
    // Recorded, then forgotten: nothing to run again after a restart.
    assert_eq!(left_after_waiting(store.as_ref()).await, 0, "a recorded job stays in the store");
    let id = &leased.job_id;
    assert_eq!(store.seen(), [vec![format!("put {id}")], vec![format!("forget {id}")]]);
    drop((e, store));
    let (_e, _store, requeued) = open(dir.path()).await;
    assert_eq!(requeued, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waited_for_job_that_ends_sooner_than_store_after_is_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let (e, store) = open_counting(dir.path(), Duration::from_secs(30)).await;
    let a = waited_call(&e).await;
    let b = waited_call(&e).await;
    assert_ne!(a, b);
    // Past the time a held removal would have been written.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(store.seen(), Vec::<Vec<String>>::new(), "a job that ended before it was due was written");
    assert!(store.all().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_jobs_removal_shares_the_next_jobs_transaction_or_goes_alone_soon_after() {
    let dir = tempfile::tempdir().unwrap();
    // Stored as they are queued, as for a caller answered with the job's id.
    let (e, store) = open_counting(dir.path(), Duration::ZERO).await;
    let a = waited_call(&e).await;
    // The next job's put carries the first job's removal: one sync to the disk for both.
    let b = waited_call(&e).await;
    // With no job after it, the last removal goes on its own.
    assert_eq!(left_after_waiting(store.as_ref()).await, 0, "a finished job stays in the store");
    let seen = store.seen();
    // Usually [put a], [put b, forget a], [forget b]; on a busy machine the writer may take a
    // job's put and its removal (or more) in one batch. Either way a removal shares a put's
    // transaction and comes after its own job's put.
    let at = |w: &str| seen.iter().enumerate().find_map(|(t, ws)| ws.iter().position(|x| x == w).map(|i| (t, i)));
    let (Some(put_a), Some(forget_a)) = (at(&format!("put {a}")), at(&format!("forget {a}"))) else {
        panic!("{seen:?}")
    };
    assert!(put_a < forget_a, "a removal before its put: {seen:?}");
    assert!(seen.iter().flatten().any(|w| w == &format!("put {b}")), "{seen:?}");
    assert!(
        seen[forget_a.0].iter().any(|w| w.starts_with("put ")),
        "the first removal had a transaction of its own: {seen:?}"
    );
    assert!(seen.iter().flatten().any(|w| w == &format!("forget {b}")), "{seen:?}");
}

/// A job store whose writes wait for a permit of `gate` (none at first).
struct Gated {
    inner: Transactions,
    gate: tokio::sync::Semaphore,
}

#[async_trait::async_trait]
impl JobStore for Gated {
    async fn write(&self, writes: Vec<agentos_store::JobWrite>) -> Result<(), agentos_store::StoreError> {
        let _pass = self.gate.acquire().await.unwrap();
        self.inner.write(writes).await
    }
    async fn put(&self, job: agentos_store::StoredJob) -> Result<(), agentos_store::StoreError> {
        self.inner.put(job).await
    }
    async fn forget(&self, job_id: &str) -> Result<(), agentos_store::StoreError> {
        self.inner.forget(job_id).await
    }
    async fn get(&self, job_id: &str) -> Result<Option<agentos_store::StoredJob>, agentos_store::StoreError> {
        self.inner.get(job_id).await
    }
    async fn all(&self) -> Result<Vec<agentos_store::StoredJob>, agentos_store::StoreError> {
        self.inner.all().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_that_comes_with_its_jobs_put_is_written_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Gated {
        inner: Transactions {
            store: SqliteJobStore::open(&dir.path().join("jobs.db")).unwrap(),
            seen: Default::default(),
        },
        gate: tokio::sync::Semaphore::new(0),
    });
    let e = open_on(dir.path(), Duration::ZERO, store.clone()).await;
    // The writer takes the first job's put and waits on the store; what comes meanwhile (the
    // first job's removal, the second's put and its removal) is its next batch.
    let a = waited_call(&e).await;
    let b = waited_call(&e).await;
    store.gate.add_permits(1);
    for _ in 0..200 {
        if store.inner.seen().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(store.all().await.unwrap().is_empty(), "a removal was written before its job's put");
    assert_eq!(
        store.inner.seen(),
        [vec![format!("put {a}")], vec![format!("put {b}"), format!("forget {a}"), format!("forget {b}")]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_running_job_whose_caller_went_away_is_stopped_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let exec = principal("e1", PrincipalKind::Executor);
    let (e, store) = open_counting(dir.path(), Duration::from_millis(50)).await;
    let poller = {
        let (e, exec) = (e.clone(), exec.clone());
        tokio::spawn(async move {
            e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_secs(5)).await.unwrap().unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let caller = waiting_caller(&e);
    let leased = poller.await.unwrap();
    let mut stored = false;
    for _ in 0..300 {
        stored = store.get(&leased.job_id).await.unwrap().is_some();
        if stored {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(stored, "a job running past store_after is stored");
    // The caller goes (its connection dropped, an agent's Ctrl-C): the job holds an executor's
    // slot for nobody, so its next heartbeat is told the lease is lost (the executor then stops
    // it), and a result posted anyway is refused.
    caller.abort();
    let _ = caller.await;
    let id = leased.job_id.clone();
    let mut lost = None;
    for _ in 0..300 {
        match e.dispatch().heartbeat_job(&exec, None, &id, &leased.lease_id).await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(err) => {
                lost = Some(err);
                break;
            }
        }
    }
    let lost = lost.expect("the heartbeat of a job whose caller went away still renewed its lease");
    assert_eq!(lost.kind(), agentos_core::ErrorKind::NotFound, "{lost}");
    let result = ExecutorResult { lease_id: leased.lease_id, exit_code: Some(0), ..Default::default() };
    assert!(e.dispatch().complete_job(&exec, None, &id, result).await.is_err(), "a result for nobody was taken");
    assert_eq!(left_after_waiting(store.as_ref()).await, 0, "the stopped job stays in the store");
    assert_eq!(store.seen(), [vec![format!("put {id}")], vec![format!("forget {id}")]]);
    // Nor does it come back after a restart.
    drop((e, store));
    let (_e, _store, requeued) = open(dir.path()).await;
    assert_eq!(requeued, 0, "the stopped job was queued again after a restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_callers_job_no_executor_took_goes_with_the_caller_from_the_queue_and_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let exec = principal("e1", PrincipalKind::Executor);
    let (e, store) = open_counting(dir.path(), Duration::from_millis(50)).await;
    // No executor yet: the call waits, and is stored once it has waited `store_after`.
    let caller = waiting_caller(&e);
    let mut stored = None;
    for _ in 0..300 {
        stored = store.all().await.unwrap().first().map(|j| j.job_id.clone());
        if stored.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let id = stored.expect("a waiting job is stored after store_after");
    // The caller goes (its connection closed, say) before any executor came.
    caller.abort();
    let _ = caller.await;
    assert_eq!(left_after_waiting(store.as_ref()).await, 0, "the job stays in the store, to run after a restart");
    assert_eq!(store.seen(), [vec![format!("put {id}")], vec![format!("forget {id}")]]);
    // An executor that comes now finds nothing to run for nobody.
    let found = e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_millis(300)).await.unwrap();
    assert_eq!(found.map(|j| j.job_id), None, "the job of a caller that went away still ran");
    let op = principal("operator", PrincipalKind::Operator);
    assert!(e.dispatch().job(&op, &id).await.is_err(), "a dropped job is no job");
    drop((e, store));
    let (_e, _store, requeued) = open(dir.path()).await;
    assert_eq!(requeued, 0, "the job was queued again after a restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_results_error_is_kept_to_eight_kib_cut_at_a_character_and_saying_how_much_went() {
    let dir = tempfile::tempdir().unwrap();
    let exec = principal("e1", PrincipalKind::Executor);
    let (e, _store) = open_counting(dir.path(), Duration::from_secs(30)).await;
    let poller = {
        let (e, exec) = (e.clone(), exec.clone());
        tokio::spawn(async move {
            e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_secs(5)).await.unwrap().unwrap()
        })
    };
    let caller = waiting_caller(&e);
    let leased = poller.await.unwrap();
    // Three bytes a character, so that 8 KiB falls inside one.
    let huge = "€".repeat(1_000_000);
    let result =
        ExecutorResult { lease_id: leased.lease_id, exit_code: Some(1), error: Some(huge), ..Default::default() };
    e.dispatch().complete_job(&exec, None, &leased.job_id, result).await.unwrap();
    let answer = caller.await.unwrap().unwrap();
    let op = principal("operator", PrincipalKind::Operator);
    let job = e.dispatch().job(&op, &leased.job_id).await.unwrap();
    let recorded = serde_json::to_value(&job).unwrap();
    for error in [&answer["error"], &recorded["results"][0]["error"]] {
        let error = error.as_str().unwrap_or_else(|| panic!("no error in {answer}"));
        let kept = error.split('…').next().unwrap();
        assert_eq!((kept.len(), kept.chars().all(|c| c == '€')), (8190, true), "{}", &error[8000..]);
        assert!(
            error.ends_with(&format!("… ({} more bytes of this error were dropped)", 3_000_000 - 8190)),
            "{}",
            &error[8000..]
        );
    }
    assert_eq!(answer["exitCode"], 1);
}

/// A reclaiming poll ends the leases of its own worker only: slot 1 of a process takes back the
/// job handed to it, while slot 10 of the same process (whose lease ids start with the same
/// characters) and slot 1 of another process keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_takes_back_its_own_workers_job_and_leaves_every_other_worker_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let exec = principal("e1", PrincipalKind::Executor);
    let (e, _store) = open_counting(dir.path(), Duration::from_secs(30)).await;
    let op = principal("operator", PrincipalKind::Operator);
    for _ in 0..3 {
        e.dispatch().invoke_async(&op, "t", None, InvokeRequest::default()).await.unwrap();
    }
    let (this, other) = ("00000000000000aa", "00000000000000bb");
    let worker = |instance, slot, reclaim| Worker { instance: Some(instance), slot: Some(slot), reclaim };
    let take = |w: Worker<'static>| {
        let (e, exec) = (e.clone(), exec.clone());
        async move { e.dispatch().poll_job(&exec, None, w, &[], Duration::from_secs(1)).await.unwrap() }
    };
    let lost = take(worker(this, 1, false)).await.expect("a job for slot 1");
    let ten = take(worker(this, 10, false)).await.expect("a job for slot 10");
    let elsewhere = take(worker(other, 1, false)).await.expect("a job for the other process's slot 1");
    assert!(lost.lease_id.starts_with("00000000000000aa-1-"), "{}", lost.lease_id);
    assert!(ten.lease_id.starts_with("00000000000000aa-10-"), "{}", ten.lease_id);
    // Slot 1 never got its answer: its next poll says so, and takes its job again.
    let again = take(worker(this, 1, true)).await.expect("the job handed out in the lost answer");
    assert_eq!((again.job_id.as_str(), again.attempt), (lost.job_id.as_str(), 2));
    let heartbeat = |job: &agentos_core::job::LeasedJob| {
        let (e, exec, id, lease) = (e.clone(), exec.clone(), job.job_id.clone(), job.lease_id.clone());
        async move { e.dispatch().heartbeat_job(&exec, None, &id, &lease).await.is_ok() }
    };
    assert!(!heartbeat(&lost).await, "the lost hand-out's lease still holds");
    assert!(heartbeat(&ten).await, "slot 10 lost its lease to slot 1's reclaim");
    assert!(heartbeat(&elsewhere).await, "another process's slot 1 lost its lease");
    assert!(heartbeat(&again).await);
}

/// A result no process could have produced (a negative exit status, a signal past 64, a run
/// longer than a year) is refused before it is taken: the job stays its holder's, whose
/// correct result is then recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_no_process_could_produce_is_refused_and_leaves_the_job_to_its_holder() {
    let dir = tempfile::tempdir().unwrap();
    let exec = principal("e1", PrincipalKind::Executor);
    let (e, _store) = open_counting(dir.path(), Duration::from_secs(30)).await;
    let op = principal("operator", PrincipalKind::Operator);
    let id = e.dispatch().invoke_async(&op, "t", None, InvokeRequest::default()).await.unwrap();
    let job =
        e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_secs(1)).await.unwrap().unwrap();
    let result = |exit_code, signal, duration_ms| ExecutorResult {
        lease_id: job.lease_id.clone(),
        exit_code,
        signal,
        duration_ms,
        ..Default::default()
    };
    for (bad, says) in [
        (result(Some(-1), None, 1), "exitCode -1"),
        (result(Some(256), None, 1), "exitCode 256"),
        (result(None, Some(0), 1), "signal 0"),
        (result(None, Some(65), 1), "signal 65"),
        (result(Some(0), None, u64::MAX), "durationMs 18446744073709551615"),
    ] {
        let err = e.dispatch().complete_job(&exec, None, &id, bad).await.unwrap_err();
        assert_eq!(err.code(), "invalid_result", "{err}");
        assert!(err.to_string().contains(says), "{err}");
        assert_eq!(e.dispatch().job(&op, &id).await.unwrap().state, "running");
    }
    e.dispatch().complete_job(&exec, None, &id, result(None, Some(9), 12)).await.unwrap();
}

/// A stored job that does not read back at the next start (written by an older version, or
/// damaged) is not dropped in silence: it is recorded as failed, saying why, so that its caller
/// reading it by id learns it never ran; at the start after, its stored form goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_job_that_does_not_read_back_is_recorded_as_failed_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let op = principal("operator", PrincipalKind::Operator);
    {
        let store = SqliteJobStore::open(&dir.path().join("jobs.db")).unwrap();
        let job = agentos_store::StoredJob {
            job_id: "job-unreadable-1".into(),
            model: "default".into(),
            invoker: "operator".into(),
            token: "{\"executor\": \"script\", \"comm".into(),
            queued_at: 1,
        };
        store.put(job).await.unwrap();
    }
    let (e, store, requeued) = open(dir.path()).await;
    assert_eq!(requeued, 0);
    let mut job = None;
    for _ in 0..200 {
        job = e.dispatch().job(&op, "job-unreadable-1").await.ok().filter(|j| j.state == "finished");
        if job.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let job = serde_json::to_value(job.expect("the unreadable job is recorded")).unwrap();
    let error = job["results"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("does not read back") && error.contains("invoke the tool again"), "{job}");
    drop((e, store));
    let (_e, store, requeued) = open(dir.path()).await;
    assert_eq!((requeued, store.all().await.unwrap().len()), (0, 0));
}

/// A caller that waited its whole time for a job an executor took and never answered is told
/// `job_timeout` naming the job, and that job reads back, ended with the same words, where it
/// ran: it used to be dropped, and the id the caller was told of answered "no job". Its
/// executor's late result is refused, and a restart does not queue it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_its_caller_gave_up_on_reads_back_ended_with_why() {
    let dir = tempfile::tempdir().unwrap();
    let exec = principal("e1", PrincipalKind::Executor);
    let op = principal("operator", PrincipalKind::Operator);
    let log = Arc::new(SqliteEventLog::open(&dir.path().join("events.db")).unwrap());
    let blobs = Arc::new(FsBlobStore::open(dir.path().join("blobs")).unwrap());
    let mut config = EngineConfig::default();
    config.dispatch.queue_grace = Duration::from_millis(200);
    let e = Engine::open(config, log, blobs).await.unwrap();
    let store = Arc::new(SqliteJobStore::open(&dir.path().join("jobs.db")).unwrap());
    e.dispatch().recover_jobs(store.clone()).await.unwrap();
    let script = serde_json::json!({"id": "t", "name": "t", "runtime": "sh", "content": "echo hi", "model": "default"});
    e.catalog().register(&op, "TOOL_CATALOG_REGISTER_SCRIPT", script).await.unwrap();
    let poller = {
        let (e, exec) = (e.clone(), exec.clone());
        tokio::spawn(async move {
            e.dispatch().poll_job(&exec, None, Worker::default(), &[], Duration::from_secs(5)).await.unwrap().unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let caller = {
        let (e, op) = (e.clone(), op.clone());
        tokio::spawn(async move {
            let req = InvokeRequest { timeout_ms: Some(500), ..Default::default() };
            e.dispatch().invoke(&op, "t", None, req).await
        })
    };
    let leased = poller.await.unwrap();
    let told = caller.await.unwrap().unwrap_err().to_string();
    assert!(told.contains(&format!("job {} got no result within 700 ms", leased.job_id)), "{told}");
    let record = e.dispatch().job(&op, &leased.job_id).await.unwrap();
    assert_eq!(record.state, "finished");
    let result = &record.results[0];
    assert!(result.error.as_deref().unwrap_or("").contains("got no result within 700 ms"), "{result:?}");
    assert_eq!((result.executor.as_str(), result.cancelled_by.as_deref()), ("e1", None), "{result:?}");
    let late = ExecutorResult { lease_id: leased.lease_id.clone(), exit_code: Some(0), ..Default::default() };
    assert!(e.dispatch().complete_job(&exec, None, &leased.job_id, late).await.is_err(), "a late result was taken");
    assert_eq!(e.dispatch().job(&op, &leased.job_id).await.unwrap().results.len(), 1);
    assert_eq!(left_after_waiting(store.as_ref()).await, 0, "the ended job is left in the store");
    drop((e, store));
    let (_e, _store, requeued) = open(dir.path()).await;
    assert_eq!(requeued, 0, "the ended job was queued again after a restart");
}
