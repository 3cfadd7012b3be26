//! How `agentos up`'s local executor reaches the master it runs beside: by calling the engine
//! directly, with the same credential and the same checks as over HTTP, but without two HTTP
//! exchanges and their JSON per job.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;

use agentos_core::job::LeasedJob;
use agentos_engine::dispatch::Worker;
use agentos_engine::{Engine, EngineError, Principal};
use agentos_executor::protocol::{Link, PollCall, ProtocolError, ResultCall};
use agentos_server::ApiError;

/// The longest poll the master holds over HTTP; a direct one is held no longer.
const MAX_POLL: Duration = Duration::from_secs(60);

pub struct LocalLink {
    engine: Engine,
    token: String,
    /// The master's `--max-result-bytes`, which a result over HTTP may not exceed either.
    max_result_bytes: usize,
}

impl LocalLink {
    pub fn new(engine: Engine, token: String, max_result_bytes: usize) -> Self {
        LocalLink { engine, token, max_result_bytes }
    }

    /// Who the executor is, looked up at every call as an HTTP request's bearer token is: a
    /// credential rotated or revoked meanwhile stops the local executor the same way.
    fn principal(&self) -> Result<Principal, ProtocolError> {
        self.engine.authenticate(&self.token).ok_or_else(|| ProtocolError::Refused {
            status: 401,
            message: "the bearer token is not valid (revoked, mistyped, or from another data folder)".into(),
        })
    }
}

/// Runs one call, for at most `limit` (the HTTP client's timeout for the same request). A panic
/// in the master's code ends this call, not the executor's worker that made it: the worker sees
/// the master unreachable and retries, as it does when a request over HTTP loses its connection
/// or times out.
async fn guarded<T>(limit: Duration, call: impl Future<Output = Result<T, ProtocolError>>) -> Result<T, ProtocolError> {
    match tokio::time::timeout(limit, AssertUnwindSafe(call).catch_unwind()).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(failed()),
        Err(_) => Err(ProtocolError::Unreachable(format!("the master did not answer within {limit:?}"))),
    }
}

fn failed() -> ProtocolError {
    ProtocolError::Unreachable("the master failed on this request; its log has the details".into())
}

/// What the HTTP client allows a heartbeat or a release, and a result.
const SHORT_CALL: Duration = Duration::from_secs(10);
const RESULT_CALL: Duration = Duration::from_secs(120);

/// Says the master's `--max-result-bytes` with a job, as the HTTP answer does.
fn with_limit(job: LeasedJob, max_result_bytes: usize) -> LeasedJob {
    LeasedJob { max_result_bytes: Some(max_result_bytes as u64), ..job }
}

/// The status and message the same refusal has over HTTP.
fn refused(e: EngineError) -> ProtocolError {
    let e = ApiError::from(e);
    ProtocolError::Refused { status: e.status.as_u16(), message: e.message }
}

#[async_trait::async_trait]
impl Link for LocalLink {
    fn describe(&self) -> String {
        "the master in this process".into()
    }

    async fn poll(&self, call: PollCall<'_>) -> Result<Option<LeasedJob>, ProtocolError> {
        // A stopping master answers every poll at once with no job: said as the master being
        // away, so that the worker backs off rather than ask again at once, in a loop, as it
        // would over HTTP were the listener not closed.
        if self.engine.is_stopping() {
            return Err(ProtocolError::Unreachable("the master in this process is stopping".into()));
        }
        let p = self.principal()?;
        let wait = call.wait.min(MAX_POLL);
        guarded(wait + SHORT_CALL, async {
            let worker = Worker { instance: call.instance, slot: call.slot, reclaim: call.reclaim };
            let job = self.engine.dispatch().poll_job(&p, call.name, worker, call.replaces, wait).await;
            job.map(|j| j.map(|j| with_limit(j, self.max_result_bytes))).map_err(refused)
        })
        .await
    }

    async fn heartbeat(&self, name: Option<&str>, job_id: &str, lease_id: &str) -> Result<(), ProtocolError> {
        let p = self.principal()?;
        guarded(SHORT_CALL, async {
            self.engine.dispatch().heartbeat_job(&p, name, job_id, lease_id).await.map(|_| ()).map_err(refused)
        })
        .await
    }

    async fn release(&self, name: Option<&str>, job_id: &str, lease_id: &str) -> Result<(), ProtocolError> {
        let p = self.principal()?;
        guarded(SHORT_CALL, async {
            self.engine.dispatch().release_job(&p, name, job_id, lease_id).await.map_err(refused)
        })
        .await
    }

    async fn stopped(&self, name: Option<&str>, instance: Option<&str>) -> Result<(), ProtocolError> {
        let p = self.principal()?;
        guarded(SHORT_CALL, async {
            self.engine.dispatch().executor_stopped(&p, name, instance).await.map_err(refused)
        })
        .await
    }

    async fn result(&self, call: ResultCall<'_>) -> Result<Option<LeasedJob>, ProtocolError> {
        let p = self.principal()?;
        let r = call.result;
        // What the post's body would carry: its output, in base64, and the error line.
        let size = r.stdout_base64.len() + r.stderr_base64.len() + r.error.as_ref().map_or(0, String::len);
        if size > self.max_result_bytes {
            return Err(ProtocolError::Refused {
                status: 413,
                message: format!(
                    "the request body is larger than {} bytes (the master's --max-result-bytes)",
                    self.max_result_bytes
                ),
            });
        }
        // As over HTTP: the instance is only sent, and checked, with a request for the next job,
        // and checked before the result is taken.
        let instance = if call.take_next { call.instance } else { None };
        agentos_engine::dispatch::checked_instance("instance", instance).map_err(refused)?;
        // On a task of its own, as a request's handler is: a result taken is recorded even when
        // the executor stops waiting for the answer. The next job is taken here, not on that
        // task: a worker that gave up waiting is handed nothing afterwards.
        let (engine, started) = (self.engine.clone(), tokio::time::Instant::now());
        let (name, job_id, result) = (call.name.map(str::to_string), call.job_id.to_string(), r.clone());
        let task = {
            let p = p.clone();
            tokio::spawn(async move {
                engine.dispatch().complete_job(&p, name.as_deref(), &job_id, result).await.map_err(refused)
            })
        };
        match tokio::time::timeout(RESULT_CALL, task).await {
            Ok(Ok(taken)) => taken?,
            Ok(Err(_)) => return Err(failed()),
            Err(_) => {
                return Err(ProtocolError::Unreachable(format!("the master did not answer within {RESULT_CALL:?}")));
            }
        }
        if !call.take_next {
            return Ok(None);
        }
        guarded(RESULT_CALL.saturating_sub(started.elapsed()), async {
            let worker = Worker { instance, slot: call.slot, reclaim: false };
            let job = self.engine.dispatch().next_job_now(&p, call.name, worker).await.map_err(refused)?;
            Ok(job.map(|j| with_limit(j, self.max_result_bytes)))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    //! The direct link on its own, against a real engine on a temporary data folder: the same
    //! answers an executor gets over HTTP for the same calls.

    use std::sync::Arc;

    use agentos_core::job::{ExecutorResult, InvokeRequest};
    use agentos_engine::{EngineConfig, Principal};
    use agentos_store::{FsBlobStore, SqliteEventLog};

    use super::*;

    const LIMIT: usize = 1000;

    struct Master {
        engine: Engine,
        operator: Principal,
        _dir: tempfile::TempDir,
    }

    async fn master() -> Master {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(SqliteEventLog::open(&dir.path().join("events.db")).unwrap());
        let blobs = Arc::new(FsBlobStore::open(dir.path().join("blobs")).unwrap());
        let engine = Engine::open(EngineConfig::default(), log, blobs).await.unwrap();
        engine.principals().ensure_operator(&dir.path().join("operator.token")).await.unwrap();
        let operator = engine.operator().unwrap();
        let script =
            serde_json::json!({"id": "t", "name": "t", "runtime": "sh", "content": "echo hi", "model": "default"});
        engine.catalog().register(&operator, "TOOL_CATALOG_REGISTER_SCRIPT", script).await.unwrap();
        Master { engine, operator, _dir: dir }
    }

    impl Master {
        async fn link(&self) -> LocalLink {
            let token = self.engine.dispatch().create_executor_token(&self.operator, "local").await.unwrap();
            LocalLink::new(self.engine.clone(), token, LIMIT)
        }

        async fn queue(&self) -> String {
            let req = InvokeRequest { timeout_ms: Some(30_000), ..Default::default() };
            self.engine.dispatch().invoke_async(&self.operator, "t", None, req).await.unwrap()
        }

        async fn state(&self, job_id: &str) -> String {
            self.engine.dispatch().job(&self.operator, job_id).await.unwrap().state
        }

        /// The job's state once its result is committed (recording it does not hold up the
        /// executor's answer).
        async fn settled(&self, job_id: &str) -> String {
            for _ in 0..200 {
                let state = self.state(job_id).await;
                if state != "running" {
                    return state;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            self.state(job_id).await
        }
    }

    fn poll_call() -> PollCall<'static> {
        PollCall {
            name: None,
            instance: None,
            slot: None,
            reclaim: false,
            holding: false,
            replaces: &[],
            wait: Duration::from_millis(200),
        }
    }

    fn result_of(job: &LeasedJob, stdout_base64: &str) -> ExecutorResult {
        ExecutorResult {
            lease_id: job.lease_id.clone(),
            exit_code: Some(0),
            stdout_base64: stdout_base64.into(),
            ..Default::default()
        }
    }

    fn status(e: ProtocolError) -> u16 {
        match e {
            ProtocolError::Refused { status, .. } => status,
            other => panic!("expected a refusal, got {other}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_is_handed_out_with_the_limit_and_its_result_brings_the_next() {
        let m = master().await;
        let link = m.link().await;
        assert!(link.poll(poll_call()).await.unwrap().is_none(), "an empty queue answers nothing after the wait");
        let (first, second) = (m.queue().await, m.queue().await);
        let job = link.poll(poll_call()).await.unwrap().expect("a queued job");
        assert_eq!((job.job_id.as_str(), job.max_result_bytes), (first.as_str(), Some(LIMIT as u64)));
        assert_eq!(m.state(&first).await, "running");
        let call = ResultCall {
            name: None,
            instance: None,
            slot: None,
            job_id: &first,
            result: &result_of(&job, "aGkK"),
            take_next: true,
        };
        let next = link.result(call).await.unwrap().expect("the next job comes with the answer");
        assert_eq!((next.job_id.as_str(), next.max_result_bytes), (second.as_str(), Some(LIMIT as u64)));
        assert_eq!(m.settled(&first).await, "finished");
        let call = ResultCall {
            name: None,
            instance: None,
            slot: None,
            job_id: &second,
            result: &result_of(&next, ""),
            take_next: false,
        };
        assert!(link.result(call).await.unwrap().is_none(), "no next job is taken unless asked for");
        assert_eq!(m.settled(&second).await, "finished");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_result_over_the_limit_gets_413_and_leaves_the_job_running() {
        let m = master().await;
        let link = m.link().await;
        let id = m.queue().await;
        let job = link.poll(poll_call()).await.unwrap().unwrap();
        let big = "A".repeat(LIMIT + 1);
        let call = ResultCall {
            name: None,
            instance: None,
            slot: None,
            job_id: &id,
            result: &result_of(&job, &big),
            take_next: true,
        };
        let e = link.result(call).await.unwrap_err();
        assert!(e.to_string().contains("--max-result-bytes"), "{e}");
        assert_eq!(status(e), 413);
        assert_eq!(m.state(&id).await, "running", "nothing of a refused result is recorded");
        let call = ResultCall {
            name: None,
            instance: None,
            slot: None,
            job_id: &id,
            result: &result_of(&job, ""),
            take_next: false,
        };
        link.result(call).await.unwrap();
        assert_eq!(m.settled(&id).await, "finished");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rotated_credential_is_refused_at_the_next_call_with_401() {
        let m = master().await;
        let link = m.link().await;
        let id = m.queue().await;
        let job = link.poll(poll_call()).await.unwrap().unwrap();
        let _rotated = m.link().await;
        assert_eq!(status(link.poll(poll_call()).await.unwrap_err()), 401);
        assert_eq!(status(link.heartbeat(None, &id, &job.lease_id).await.unwrap_err()), 401);
        assert_eq!(status(link.release(None, &id, &job.lease_id).await.unwrap_err()), 401);
        let call = ResultCall {
            name: None,
            instance: None,
            slot: None,
            job_id: &id,
            result: &result_of(&job, ""),
            take_next: false,
        };
        assert_eq!(status(link.result(call).await.unwrap_err()), 401);
        assert_eq!(m.state(&id).await, "running");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stale_lease_gets_409_and_a_bad_instance_400_as_over_http() {
        let m = master().await;
        let link = m.link().await;
        let id = m.queue().await;
        let job = link.poll(poll_call()).await.unwrap().unwrap();
        let e = link.heartbeat(None, &id, "not-this-lease").await.unwrap_err();
        assert!(e.lease_lost(), "{e}");
        let e = link.heartbeat(None, "no-such-job", &job.lease_id).await.unwrap_err();
        assert!(e.lease_lost(), "{e}");
        let bad = ResultCall {
            name: None,
            instance: Some("../x"),
            slot: None,
            job_id: &id,
            result: &result_of(&job, ""),
            take_next: true,
        };
        let e = link.result(bad).await.unwrap_err();
        assert!(e.to_string().contains("16 lower-case hex"), "{e}");
        assert_eq!(status(e), 400);
        assert_eq!(m.state(&id).await, "running", "the instance is checked before the result is taken");
        link.heartbeat(None, &id, &job.lease_id).await.unwrap();
        link.release(None, &id, &job.lease_id).await.unwrap();
        assert_eq!(m.state(&id).await, "queued", "a released job is handed out again");
    }

    /// A worker that stops waiting for its result's answer (its call dropped, as its timeout
    /// does) still has the result recorded, but is handed no next job it would never hear of.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_result_whose_caller_gave_up_is_recorded_and_hands_out_no_next_job() {
        // Polled once, so that the result is on its way, then dropped. The committer runs on a
        // thread of its own and may, on a busy machine, have answered by that first poll: such
        // a try is not the case under test, and another is made.
        let (m, first, second) = 'tries: {
            for _ in 0..20 {
                let m = master().await;
                let link = m.link().await;
                let (first, second) = (m.queue().await, m.queue().await);
                let job = link.poll(poll_call()).await.unwrap().expect("a queued job");
                let call = ResultCall {
                    name: None,
                    instance: None,
                    slot: None,
                    job_id: &first,
                    result: &result_of(&job, "aGkK"),
                    take_next: true,
                };
                if link.result(call).now_or_never().is_none() {
                    break 'tries (m, first, second);
                }
            }
            panic!("the answer was there at the first poll in 20 tries");
        };
        let link = m.link().await;
        assert_eq!(m.settled(&first).await, "finished");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(m.state(&second).await, "queued", "the next job stays queued for a worker that asks");
        let next = link.poll(poll_call()).await.unwrap().expect("the next job");
        assert_eq!(next.job_id, second);
    }

    /// A [`LocalLink`] that notes how many jobs its worker holds at once, and which it hands
    /// back: what the master sees of a worker taking jobs ahead.
    struct Watched {
        link: LocalLink,
        /// Jobs handed out and not yet answered or handed back; the most at any moment.
        held: std::sync::Mutex<(i64, i64)>,
        /// Jobs handed back, with when.
        released: std::sync::Mutex<Vec<(String, std::time::Instant)>>,
        /// Loses the first answer that carries a job to a result posted while the worker held
        /// another job: the master hands the job out, and the worker never hears of it. A fake
        /// failure, for an answer lost on the way, which nothing in one process produces.
        lose: bool,
        /// What the worker did, in order: `result`, `lost JOB`, `reclaim`.
        events: std::sync::Mutex<Vec<String>>,
        /// Told when the answer is lost.
        at_loss: tokio::sync::Notify,
    }

    type Running = tokio::task::JoinHandle<Result<(), agentos_executor::ExecutorError>>;

    impl Watched {
        fn new(link: LocalLink, lose: bool) -> Arc<Watched> {
            let (held, released, events, at_loss) = Default::default();
            Arc::new(Watched { link, held, released, lose, events, at_loss })
        }

        fn held(&self, by: i64) -> i64 {
            let mut h = self.held.lock().unwrap();
            h.0 += by;
            h.1 = h.1.max(h.0);
            h.0
        }

        fn handed(&self, answer: Result<Option<LeasedJob>, ProtocolError>) -> Result<Option<LeasedJob>, ProtocolError> {
            if let Ok(Some(_)) = &answer {
                self.held(1);
            }
            answer
        }

        fn note(&self, event: String) {
            self.events.lock().unwrap().push(event);
        }

        /// Runs an executor of one worker over this link until the returned sender is used.
        fn executor(self: &Arc<Self>) -> (tokio::sync::oneshot::Sender<()>, Running, tempfile::TempDir) {
            let workspace = tempfile::tempdir().unwrap();
            let config = agentos_executor::ExecutorConfig {
                master: String::new(),
                token: String::new(),
                workspace: workspace.path().to_path_buf(),
                name: None,
                concurrency: 1,
                limits: agentos_executor::job::JobLimits::default(),
                grace: Duration::from_secs(5),
                poll_wait: Duration::from_millis(500),
                direct: Some(agentos_executor::protocol::Direct(self.clone())),
            };
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let executor = tokio::spawn(agentos_executor::run(config, async move {
                let _ = stopped.await;
            }));
            (stop, executor, workspace)
        }
    }

    #[async_trait::async_trait]
    impl Link for Watched {
        fn describe(&self) -> String {
            self.link.describe()
        }
        async fn poll(&self, call: PollCall<'_>) -> Result<Option<LeasedJob>, ProtocolError> {
            if call.reclaim {
                self.note("reclaim".into());
            }
            let answer = self.link.poll(call).await;
            self.handed(answer)
        }
        async fn heartbeat(&self, name: Option<&str>, job_id: &str, lease_id: &str) -> Result<(), ProtocolError> {
            self.link.heartbeat(name, job_id, lease_id).await
        }
        async fn stopped(&self, name: Option<&str>, instance: Option<&str>) -> Result<(), ProtocolError> {
            self.link.stopped(name, instance).await
        }
        async fn release(&self, name: Option<&str>, job_id: &str, lease_id: &str) -> Result<(), ProtocolError> {
            self.held(-1);
            self.released.lock().unwrap().push((job_id.to_string(), std::time::Instant::now()));
            self.link.release(name, job_id, lease_id).await
        }
        async fn result(&self, call: ResultCall<'_>) -> Result<Option<LeasedJob>, ProtocolError> {
            let holding = self.held(-1) > 0;
            self.note("result".into());
            let answer = self.handed(self.link.result(call).await);
            if let Ok(Some(job)) = &answer
                && self.lose
                && holding
                && !self.events.lock().unwrap().iter().any(|e| e.starts_with("lost"))
            {
                self.note(format!("lost {}", job.job_id));
                self.at_loss.notify_one();
                return Err(ProtocolError::Unreachable("the answer was lost on the way".into()));
            }
            answer
        }
    }

    /// Waits for each job to be finished.
    async fn finished(m: &Master, ids: &[String]) {
        for id in ids {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while m.state(id).await != "finished" && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(m.state(id).await, "finished", "{id}");
        }
    }

    /// A job's results, as its view shows them.
    async fn results(m: &Master, id: &str) -> serde_json::Value {
        let job = m.engine.dispatch().job(&m.operator, id).await.unwrap();
        serde_json::to_value(&job).unwrap()["results"].clone()
    }

    /// With work queued, a worker holds the job after the one it runs, so that the next one
    /// starts the moment the last one ends; behind a job that runs on, the job ahead goes back
    /// to the queue at once (for a free worker), its attempt not counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_holds_the_next_job_ahead_and_hands_it_back_behind_a_long_job() {
        let m = master().await;
        let script = serde_json::json!({"id": "long", "name": "long", "runtime": "sh", "content": "sleep 1", "model": "default"});
        m.engine.catalog().register(&m.operator, "TOOL_CATALOG_REGISTER_SCRIPT", script).await.unwrap();
        let req = InvokeRequest { timeout_ms: Some(30_000), ..Default::default() };
        let first = m.queue().await;
        let long = m.engine.dispatch().invoke_async(&m.operator, "long", None, req).await.unwrap();
        let behind = m.queue().await;
        let mut quick = Vec::new();
        for _ in 0..20 {
            quick.push(m.queue().await);
        }
        let watched = Watched::new(m.link().await, false);
        let (stop, executor, _workspace) = watched.executor();
        let started = std::time::Instant::now();
        let all: Vec<String> = [first, long, behind.clone()].into_iter().chain(quick).collect();
        finished(&m, &all).await;
        let _ = stop.send(());
        executor.await.unwrap().unwrap();
        let released = watched.released.lock().unwrap().clone();
        assert_eq!(released.iter().map(|(id, _)| id).collect::<Vec<_>>(), [&behind], "{released:?}");
        let handed_back_after = released[0].1 - started;
        assert!(
            handed_back_after < Duration::from_millis(800),
            "handed back {handed_back_after:?} after the start, not while the long job ran"
        );
        let (now, most) = *watched.held.lock().unwrap();
        assert_eq!(now, 0, "every job handed out was answered or handed back");
        assert_eq!(most, 2, "the worker held one job ahead, never more");
        for id in &all {
            let results = results(&m, id).await;
            assert_eq!(results.as_array().map(Vec::len), Some(1), "{results}");
            assert_eq!(results[0]["attempt"], 1, "a job handed back counts no attempt: {results}");
        }
    }

    /// A master with 30 jobs queued (below the 32 one principal may have open), and their ids.
    async fn busy_master() -> (Master, Vec<String>) {
        let m = master().await;
        let mut all = Vec::new();
        for _ in 0..30 {
            all.push(m.queue().await);
        }
        (m, all)
    }

    /// Regression: an answer lost while the worker held a job ahead (here the answer to a
    /// result, which carried the next job) was reclaimed only at the worker's next long poll,
    /// which a busy queue kept from coming: the job handed out in it waited for the queue to run
    /// dry, or for its lease to run out. The worker now takes no more jobs once an answer is
    /// lost, and reclaims as soon as the jobs in its hands are done.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_lost_while_a_job_is_ahead_is_reclaimed_once_the_jobs_in_hand_are_done() {
        // The answer lost is one to a result posted while a job was ahead, which a slow machine
        // may not come to within a round (each job ran past the hold): then another round.
        for _ in 0..5 {
            let (m, all) = busy_master().await;
            let watched = Watched::new(m.link().await, true);
            let (stop, executor, _workspace) = watched.executor();
            finished(&m, &all).await;
            let _ = stop.send(());
            executor.await.unwrap().unwrap();
            let events = watched.events.lock().unwrap().clone();
            let Some(at) = events.iter().position(|e| e.starts_with("lost")) else { continue };
            let lost = events[at].strip_prefix("lost ").unwrap().to_string();
            let reclaimed = events[at..].iter().position(|e| e == "reclaim").map(|r| at + r);
            let reclaimed = reclaimed.unwrap_or_else(|| panic!("no reclaim after the loss: {events:?}"));
            let between = events[at..reclaimed].iter().filter(|e| *e == "result").count();
            assert!(between <= 2, "{between} results were posted before the reclaim: {events:?}");
            let results_of_lost = results(&m, &lost).await;
            assert_eq!(results_of_lost.as_array().map(Vec::len), Some(1), "{results_of_lost}");
            assert_eq!(results_of_lost[0]["attempt"], 2, "the job of the lost answer ran again: {results_of_lost}");
            for id in &all {
                let results = results(&m, id).await;
                assert_eq!(results.as_array().map(Vec::len), Some(1), "{id}: {results}");
            }
            return;
        }
        panic!("in 5 rounds no result was posted while a job was ahead");
    }

    /// An executor that stops right after an answer was lost on its way (here one that carried
    /// the next job) ends that job's lease before it exits: the job is queued again at once, not
    /// when its lease runs out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_executor_stopping_after_a_lost_answer_gives_back_the_job_handed_out_in_it() {
        for _ in 0..5 {
            let (m, _queued) = busy_master().await;
            let watched = Watched::new(m.link().await, true);
            let (stop, executor, _workspace) = watched.executor();
            let lost = tokio::time::timeout(Duration::from_secs(20), watched.at_loss.notified()).await;
            let _ = stop.send(());
            executor.await.unwrap().unwrap();
            if lost.is_err() {
                // No result was posted while a job was ahead (a slow machine): another round.
                continue;
            }
            let events = watched.events.lock().unwrap().clone();
            let lost = events.iter().find_map(|e| e.strip_prefix("lost ")).unwrap().to_string();
            assert!(events.iter().any(|e| e == "reclaim"), "no reclaim before the executor exited: {events:?}");
            assert_eq!(m.state(&lost).await, "queued", "the job of the lost answer waits out its lease: {events:?}");
            return;
        }
        panic!("in 5 rounds no result was posted while a job was ahead");
    }

    #[tokio::test]
    async fn a_panic_or_a_call_that_never_ends_is_an_unreachable_master() {
        let panicked = guarded::<()>(Duration::from_secs(1), async { panic!("a defect in the master") }).await;
        assert!(matches!(&panicked, Err(ProtocolError::Unreachable(m)) if m.contains("failed")), "{panicked:?}");
        let stuck = guarded::<()>(Duration::from_millis(50), std::future::pending()).await;
        assert!(matches!(&stuck, Err(ProtocolError::Unreachable(m)) if m.contains("did not answer")), "{stuck:?}");
    }
}
