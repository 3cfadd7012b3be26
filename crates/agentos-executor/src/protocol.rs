//! The executor's side of the protocol: every connection is opened by the executor.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use agentos_core::job::{ExecutorResult, LeasedJob};

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("cannot reach the master: {0}")]
    Unreachable(String),
    /// The master refused: the status and its message.
    #[error("the master answered {status}: {message}")]
    Refused { status: u16, message: String },
}

impl ProtocolError {
    /// The lease is gone (409) or the job is (404): stop working on it.
    pub fn lease_lost(&self) -> bool {
        matches!(self, ProtocolError::Refused { status: 404 | 409, .. })
    }

    /// The master may have carried the request out without its answer arriving: no answer came,
    /// or one the master's own code did not give (a proxy's 502 or 504, a 5xx), or one that
    /// cannot be read. Only a 4xx is the master saying it did not.
    pub fn answer_lost(&self) -> bool {
        !matches!(self, ProtocolError::Refused { status: 400..=499, .. })
    }
}

/// How an executor reaches its master. [`Http`] is the protocol every executor speaks; a master
/// that runs an executor in its own process (`agentos up`) may hand it a link that calls the
/// master directly, which saves each job two HTTP exchanges and their JSON. Either way the master
/// decides the same way: a link carries requests, it checks nothing itself.
#[async_trait::async_trait]
pub trait Link: Send + Sync {
    /// Where the master is, for the log.
    fn describe(&self) -> String;
    async fn poll(&self, call: PollCall<'_>) -> Result<Option<LeasedJob>, ProtocolError>;
    async fn heartbeat(&self, name: Option<&str>, job_id: &str, lease_id: &str) -> Result<(), ProtocolError>;
    async fn release(&self, name: Option<&str>, job_id: &str, lease_id: &str) -> Result<(), ProtocolError>;
    /// Posts a result; with `take_next`, also takes the next job if one is queued right now.
    async fn result(&self, call: ResultCall<'_>) -> Result<Option<LeasedJob>, ProtocolError>;
    /// Says this process stopped in good order: its jobs are finished or handed back.
    async fn stopped(&self, name: Option<&str>, instance: Option<&str>) -> Result<(), ProtocolError>;
}

/// One long poll, as [`Link::poll`] receives it.
pub struct PollCall<'a> {
    pub name: Option<&'a str>,
    pub instance: Option<&'a str>,
    /// Which of this process's workers polls.
    pub slot: Option<u16>,
    /// The worker's last request that could have brought a job got no answer: a job the master
    /// handed it there goes back to the queue.
    pub reclaim: bool,
    /// The worker runs a job meanwhile (this poll asks for the one ahead): it never reclaims,
    /// not even at the next master after one that did not answer, since that would end the
    /// lease of the job it runs.
    pub holding: bool,
    pub replaces: &'a [String],
    pub wait: Duration,
}

/// One result, as [`Link::result`] receives it.
pub struct ResultCall<'a> {
    pub name: Option<&'a str>,
    pub instance: Option<&'a str>,
    /// Which of this process's workers posts.
    pub slot: Option<u16>,
    pub job_id: &'a str,
    pub result: &'a ExecutorResult,
    pub take_next: bool,
}

/// The master as the executor's workers see it: a [`Link`] plus what this process says about
/// itself in every request (its name and instance id, and its dead predecessors until heard).
#[derive(Clone)]
pub struct Master {
    link: Arc<dyn Link>,
    name: Option<String>,
    /// This process's instance id: the lease ids the master hands it start with it.
    instance: Option<String>,
    /// Dead predecessors' instance ids, named in polls until a master has answered one, and
    /// the files that name them, removed then.
    replaces: Arc<std::sync::Mutex<(Vec<String>, Vec<std::path::PathBuf>)>>,
}

impl Master {
    /// `urls`: one master's URL, or several separated by commas.
    pub fn new(urls: &str, token: &str, name: Option<String>) -> Self {
        Master::over(Arc::new(Http::new(urls, token)), name)
    }

    /// A master reached through `link`.
    pub fn over(link: Arc<dyn Link>, name: Option<String>) -> Self {
        Master { link, name, instance: None, replaces: Arc::default() }
    }

    /// Sends this process's instance id with its polls and results, and `replaces` (dead
    /// predecessors') with its polls until one is answered; then removes the files `heard`.
    pub fn with_instance(mut self, instance: String, replaces: Vec<String>, heard: Vec<std::path::PathBuf>) -> Self {
        self.instance = Some(instance);
        self.replaces = Arc::new(std::sync::Mutex::new((replaces, heard)));
        self
    }

    fn replaces(&self) -> std::sync::MutexGuard<'_, (Vec<String>, Vec<std::path::PathBuf>)> {
        self.replaces.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the master is, for the log.
    pub fn describe(&self) -> String {
        self.link.describe()
    }

    /// Long poll for worker `slot`: the next job, or `None` when the master had no work within
    /// `wait`. `reclaim`: the worker's last request that could have brought a job got no
    /// answer (see [`PollCall::reclaim`]).
    pub async fn poll(&self, wait: Duration, slot: u16, reclaim: bool) -> Result<Option<LeasedJob>, ProtocolError> {
        self.poll_for(wait, slot, reclaim, false).await
    }

    /// For worker `slot`, which runs a job: the job after it if one is queued right now. Never
    /// a reclaim (see [`PollCall::holding`]).
    pub async fn poll_ahead(&self, slot: u16) -> Result<Option<LeasedJob>, ProtocolError> {
        self.poll_for(Duration::ZERO, slot, false, true).await
    }

    async fn poll_for(
        &self,
        wait: Duration,
        slot: u16,
        reclaim: bool,
        holding: bool,
    ) -> Result<Option<LeasedJob>, ProtocolError> {
        let replaces = self.replaces().0.clone();
        let call = PollCall {
            name: self.name.as_deref(),
            instance: self.instance.as_deref(),
            slot: Some(slot),
            // A reclaim names the worker by its instance and slot: without an instance there is
            // nothing to name (and the master would refuse it).
            reclaim: reclaim && !holding && self.instance.is_some(),
            holding,
            replaces: &replaces,
            wait,
        };
        let answer = self.link.poll(call).await;
        if !replaces.is_empty() && answer.is_ok() {
            // A master took it: the predecessors' leases are ended, and their files may go.
            let (ids, heard) = &mut *self.replaces();
            ids.clear();
            for f in heard.drain(..) {
                let _ = std::fs::remove_file(f);
            }
        }
        answer
    }

    pub async fn heartbeat(&self, job_id: &str, lease_id: &str) -> Result<(), ProtocolError> {
        self.link.heartbeat(self.name.as_deref(), job_id, lease_id).await
    }

    pub async fn release(&self, job_id: &str, lease_id: &str) -> Result<(), ProtocolError> {
        self.link.release(self.name.as_deref(), job_id, lease_id).await
    }

    /// Says this process stopped in good order, so that the master lists it `stopped` at once
    /// (not `silent`, as a killed one) and counts it as serving the queue no more.
    pub async fn stopped(&self) -> Result<(), ProtocolError> {
        self.link.stopped(self.name.as_deref(), self.instance.as_deref()).await
    }

    /// Posts a result from worker `slot`; with `take_next`, also takes the next job if one is
    /// queued right now.
    pub async fn result(
        &self,
        job_id: &str,
        result: &ExecutorResult,
        take_next: bool,
        slot: u16,
    ) -> Result<Option<LeasedJob>, ProtocolError> {
        let call = ResultCall {
            name: self.name.as_deref(),
            instance: self.instance.as_deref(),
            slot: Some(slot),
            job_id,
            result,
            take_next,
        };
        self.link.result(call).await
    }
}

/// How long a stopping executor waits for each master to take its goodbye.
pub const GOODBYE_CALL: Duration = Duration::from_secs(3);

/// What an executor says of itself in the headers of a request.
#[derive(Clone, Copy)]
struct Head<'a> {
    name: Option<&'a str>,
    slot: Option<u16>,
    reclaim: bool,
    /// A poll that may reclaim (it names its instance and slot): tried at the next master after
    /// one that did not answer, it reclaims there, since that master shares the queue.
    may_reclaim: bool,
    /// A poll for a job ahead (see [`PollCall::holding`]): asked of the current master only.
    /// Moved on to the next one it could not reclaim what the first may have handed out; failed,
    /// it is reported lost, and the worker's next long poll reclaims.
    holding: bool,
}

impl<'a> Head<'a> {
    fn named(name: Option<&'a str>) -> Self {
        Head { name, slot: None, reclaim: false, may_reclaim: false, holding: false }
    }
}

/// The executor protocol over HTTP, to one master or several that share one database (any of
/// them hands out, renews and finishes any job). Every request goes to the current one; one
/// that cannot be reached hands the request to the next, which becomes the current one.
pub struct Http {
    urls: Vec<String>,
    current: AtomicUsize,
    token: String,
    http: reqwest::Client,
}

impl Http {
    /// `urls`: one master's URL, or several separated by commas.
    pub fn new(urls: &str, token: &str) -> Self {
        let http = reqwest::Client::builder()
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .expect("http client");
        let urls: Vec<String> =
            urls.split(',').map(|u| u.trim().trim_end_matches('/').to_string()).filter(|u| !u.is_empty()).collect();
        Http { urls, current: AtomicUsize::new(0), token: token.to_string(), http }
    }

    /// The URL requests go to now.
    pub fn url(&self) -> &str {
        let i = self.current.load(Ordering::Relaxed) % self.urls.len().max(1);
        self.urls.get(i).map(String::as_str).unwrap_or_default()
    }

    async fn post<T: DeserializeOwned>(
        &self,
        head: Head<'_>,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<Option<T>, ProtocolError> {
        let body = serde_json::to_vec(body).expect("values serialize");
        self.post_noting(head, path, &body, timeout).await.0
    }

    /// Posts to the current master, or the next ones when it does not answer (or answers with
    /// a 5xx, its own or a proxy's). Also returns, when a later master answered, the error of
    /// the last one that did not: it may have carried the request out, its answer lost.
    async fn post_noting<T: DeserializeOwned>(
        &self,
        head: Head<'_>,
        path: &str,
        body: &[u8],
        timeout: Duration,
    ) -> (Result<Option<T>, ProtocolError>, Option<ProtocolError>) {
        let n = self.urls.len();
        if n == 0 {
            return (Err(ProtocolError::Unreachable("no master URL is configured".into())), None);
        }
        let start = self.current.load(Ordering::Relaxed);
        let (mut head, mut last) = (head, None);
        let tries = if head.holding { 1 } else { n };
        for i in 0..tries {
            let at = (start + i) % n;
            match self.post_to(&self.urls[at], head, path, body, timeout).await {
                // No answer, or one from a proxy in front of it: the next master may answer.
                // (An answer that cannot be read came from a master: it is not tried again.)
                Err(e) if e.answer_lost() && !matches!(e, ProtocolError::Refused { status: 200, .. }) => {
                    if i + 1 < tries {
                        tracing::warn!(master = %self.urls[at], error = %e, "no answer from this master, or a 5xx; trying the next");
                    }
                    // The request may have been carried out there: a poll may have been handed
                    // a job, which the next master, sharing the queue, takes back.
                    head.reclaim |= head.may_reclaim;
                    last = Some(e);
                }
                answer => {
                    if i > 0 {
                        tracing::info!(master = %self.urls[at], "moved to this master");
                        self.current.store(at, Ordering::Relaxed);
                    }
                    return (answer, last);
                }
            }
        }
        (Err(last.unwrap_or_else(|| ProtocolError::Unreachable("no master answered".into()))), None)
    }

    /// `body` is JSON, serialized once by the caller whatever the number of masters tried.
    async fn post_to<T: DeserializeOwned>(
        &self,
        url: &str,
        head: Head<'_>,
        path: &str,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Option<T>, ProtocolError> {
        let mut req = self
            .http
            .post(format!("{url}{path}"))
            .bearer_auth(&self.token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_vec())
            .timeout(timeout);
        if let Some(n) = head.name {
            req = req.header("x-agentos-executor-name", n);
        }
        if let Some(s) = head.slot {
            req = req.header("x-agentos-executor-slot", s);
        }
        if head.reclaim {
            req = req.header("x-agentos-executor-reclaim", "true");
        }
        let resp = req.send().await.map_err(|e| ProtocolError::Unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        if status == 204 {
            return Ok(None);
        }
        let bytes = resp.bytes().await.map_err(|e| ProtocolError::Unreachable(e.to_string()))?;
        if !(200..300).contains(&status) {
            let v: Value = serde_json::from_slice(&bytes).unwrap_or_default();
            let message = v.pointer("/error/message").and_then(Value::as_str).unwrap_or("no message").to_string();
            return Err(ProtocolError::Refused { status, message });
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ProtocolError::Refused { status, message: format!("unreadable answer: {e}") })
    }
}

#[async_trait::async_trait]
impl Link for Http {
    fn describe(&self) -> String {
        self.urls.join(",")
    }

    async fn poll(&self, call: PollCall<'_>) -> Result<Option<LeasedJob>, ProtocolError> {
        let mut body = json!({"name": call.name, "waitMs": call.wait.as_millis() as u64, "instance": call.instance});
        match call.replaces {
            [] => {}
            // One as a plain string, which masters before the list read too.
            [one] => body["replaces"] = json!(one),
            many => body["replaces"] = json!(many),
        }
        let may_reclaim = call.instance.is_some() && call.slot.is_some() && !call.holding;
        let head = Head { name: call.name, slot: call.slot, reclaim: call.reclaim, may_reclaim, holding: call.holding };
        self.post(head, "/api/executor/poll", &body, call.wait + Duration::from_secs(10)).await
    }

    async fn heartbeat(&self, name: Option<&str>, job_id: &str, lease_id: &str) -> Result<(), ProtocolError> {
        let path = format!("/api/executor/jobs/{job_id}/heartbeat");
        self.post::<Value>(Head::named(name), &path, &json!({"leaseId": lease_id}), Duration::from_secs(10))
            .await
            .map(|_| ())
    }

    async fn release(&self, name: Option<&str>, job_id: &str, lease_id: &str) -> Result<(), ProtocolError> {
        let path = format!("/api/executor/jobs/{job_id}/release");
        self.post::<Value>(Head::named(name), &path, &json!({"leaseId": lease_id}), Duration::from_secs(10))
            .await
            .map(|_| ())
    }

    async fn stopped(&self, name: Option<&str>, instance: Option<&str>) -> Result<(), ProtocolError> {
        self.post::<Value>(Head::named(name), "/api/executor/stopped", &json!({"instance": instance}), GOODBYE_CALL)
            .await
            .map(|_| ())
    }

    async fn result(&self, call: ResultCall<'_>) -> Result<Option<LeasedJob>, ProtocolError> {
        // Serialized straight from the result, and the answer read straight into its job: no
        // JSON value on the way either side.
        let body = serde_json::to_vec(call.result).expect("results serialize");
        let job_id = call.job_id;
        let path = match (call.take_next, call.instance) {
            (false, _) => format!("/api/executor/jobs/{job_id}/result"),
            (true, None) => format!("/api/executor/jobs/{job_id}/result?next=true"),
            (true, Some(i)) => format!("/api/executor/jobs/{job_id}/result?next=true&instance={i}"),
        };
        let head = Head { name: call.name, slot: call.slot, reclaim: false, may_reclaim: false, holding: false };
        let (answer, earlier) = self.post_noting::<ResultAnswer>(head, &path, &body, Duration::from_secs(120)).await;
        let answer = match (answer, earlier) {
            // The lease is gone at this master, most likely because the earlier one that did
            // not answer took this very post (they share the queue): the answer carrying the
            // result's receipt, and perhaps a next job, was lost. Said as such, so that the
            // worker takes back a job handed out with it.
            (Err(e), Some(lost)) if e.lease_lost() => {
                return Err(ProtocolError::Unreachable(format!("{lost}; then the next master answered: {e}")));
            }
            (answer, _) => answer?,
        };
        Ok(answer.and_then(|a| a.next))
    }
}

/// The answer to a posted result: `{"recorded": true, "next": LeasedJob or null}`.
#[derive(serde::Deserialize)]
struct ResultAnswer {
    #[serde(default)]
    next: Option<LeasedJob>,
}

/// A [`Link`] to a master in this same process, which an [`crate::ExecutorConfig`] uses in place
/// of HTTP to its `master` URL.
#[derive(Clone)]
pub struct Direct(pub Arc<dyn Link>);

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Direct({})", self.0.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A master that takes connections and closes them unanswered.
    async fn silent() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
            }
        });
        url
    }

    /// A master that answers every poll 204 and keeps each request's head.
    async fn answering() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16384];
                    let mut have = 0;
                    while let Ok(n) = conn.read(&mut buf[have..]).await {
                        if n == 0 {
                            return;
                        }
                        have += n;
                        let text = String::from_utf8_lossy(&buf[..have]).to_string();
                        let Some(end) = text.find("\r\n\r\n") else { continue };
                        let length: usize = text[..end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if have < end + 4 + length {
                            continue;
                        }
                        seen.lock().unwrap().push(text[..end].to_ascii_lowercase());
                        have = 0;
                        let _ = conn.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await;
                    }
                });
            }
        });
        (url, heads)
    }

    /// Regression: a poll for a job ahead that the first of two masters left unanswered was
    /// moved on to the second with `x-agentos-executor-reclaim: true`, which ended the lease of
    /// the job the worker was running (it then ran twice). It is now asked of one master only,
    /// and reported lost; a long poll still moves on, reclaiming.
    #[tokio::test]
    async fn a_poll_for_a_job_ahead_never_reclaims_and_a_long_poll_moved_on_does() {
        let (live, heads) = answering().await;
        let urls = format!("{},{live}", silent().await);
        let master = Master::new(&urls, "t", None).with_instance("0123456789abcdef".into(), Vec::new(), Vec::new());
        let e = master.poll_ahead(0).await.unwrap_err();
        assert!(e.answer_lost(), "{e}");
        assert!(heads.lock().unwrap().is_empty(), "the second master was asked: {:?}", heads.lock().unwrap());
        assert_eq!(master.poll(Duration::from_millis(10), 0, false).await.unwrap().map(|j| j.job_id), None);
        let seen = heads.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(seen[0].contains("x-agentos-executor-reclaim: true"), "{seen:?}");
    }
}
