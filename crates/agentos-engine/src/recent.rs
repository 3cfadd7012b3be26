//! The jobs that finished lately, for people looking at a master (`GET /api/jobs`): the last
//! [`KEPT`] results folded from the log, this master's and (on a shared log) every other's.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

use agentos_core::event::{Event, EventBody};
use agentos_core::flags::Flag;
use agentos_core::job::JobResult;

use crate::{Engine, EngineError, Principal};

/// Results kept.
pub const KEPT: usize = 500;
/// Characters of output a listed job shows; the whole is a `GET /api/jobs/{id}` away.
const PREVIEW: usize = 300;

/// A finished job as listed.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecentJob {
    pub job_id: String,
    pub model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_id: Option<String>,
    pub seq: u64,
    pub finished_at: String,
    pub executor: String,
    /// Which hand-out ran it: 1 for the first, more after leases that ran out.
    pub attempt: u32,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The first characters of stdout and stderr.
    pub stdout: String,
    pub stderr: String,
    /// Where the whole output is when it was offloaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_blob: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_blob: Option<String>,
    #[serde(skip)]
    invoker: Option<String>,
}

fn preview(s: &str) -> String {
    s.chars().take(PREVIEW).collect()
}

impl RecentJob {
    fn of(ev: &Event, job_id: &str, tool_id: &Option<String>, r: &JobResult, invoker: &Option<String>) -> Self {
        RecentJob {
            job_id: job_id.to_string(),
            model: ev.model.clone(),
            tool_id: tool_id.clone(),
            seq: ev.seq,
            finished_at: agentos_core::event::format_time(ev.time),
            executor: r.executor.clone(),
            attempt: r.attempt,
            exit_code: r.exit_code,
            signal: r.signal,
            timed_out: r.timed_out,
            duration_ms: r.duration_ms,
            error: r.error.clone(),
            stdout: preview(&r.stdout),
            stderr: preview(&r.stderr),
            stdout_blob: r.stdout_blob.as_ref().map(|b| b.urn.clone()),
            stderr_blob: r.stderr_blob.as_ref().map(|b| b.urn.clone()),
            invoker: invoker.clone(),
        }
    }
}

#[derive(Default)]
pub(crate) struct RecentJobs {
    ring: Mutex<VecDeque<RecentJob>>,
}

impl RecentJobs {
    /// Notes `ev` if it is a job's result, in sequence order: the listener may note a result
    /// committed at start before the list is filled from the log behind it.
    pub(crate) fn note(&self, ev: &Event) {
        if let EventBody::JobFinished { job_id, tool_id, result, invoker } = &ev.body {
            let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
            let at = ring.partition_point(|j| j.seq < ev.seq);
            if ring.get(at).is_some_and(|j| j.seq == ev.seq) || (at == 0 && ring.len() >= KEPT) {
                return;
            }
            ring.insert(at, RecentJob::of(ev, job_id, tool_id, result, invoker));
            while ring.len() > KEPT {
                ring.pop_front();
            }
        }
    }
}

/// Fills the list from the end of the log. What is committed from then on the ledger's
/// listener notes (see `Engine::open`), which is set before this runs: a result committed
/// meanwhile is in the log, the listener's, or both.
pub(crate) async fn fill(engine: &Engine) {
    let inner = &engine.inner;
    let last = inner.ledger.last_seq();
    let mut after = last.saturating_sub(5_000);
    while after < last {
        let Ok(page) = inner.ledger.log.read_after(after, 1000).await else { break };
        let Some(end) = page.last().map(|r| r.seq) else { break };
        for rec in page {
            if inner.ledger.skipped.contains(&rec.seq) || rec.event.kind != "JobFinished" {
                continue;
            }
            if let Ok(ev) = crate::records::to_event(rec) {
                inner.recent.note(&ev);
            }
        }
        after = end;
    }
}

impl crate::Dispatch<'_> {
    /// The jobs that finished lately, newest first: those the caller invoked, and those of
    /// models it may use when it may read logs (`l`); all of them for the operator. Each with
    /// whose it is, as the caller sees it (as a job read alone says).
    pub fn recent_jobs(
        &self,
        p: &Principal,
        limit: usize,
    ) -> Result<Vec<(RecentJob, crate::dispatch::Invoker)>, EngineError> {
        if limit == 0 || limit > KEPT {
            return Err(agentos_core::CoreError::bad_input(
                "invalid_limit",
                format!("limit must be between 1 and {KEPT}"),
            )
            .into());
        }
        let st = self.read_state();
        let ring = self.inner.recent.ring.lock().unwrap_or_else(|p| p.into_inner());
        Ok(ring
            .iter()
            .rev()
            .filter(|j| {
                p.is_operator()
                    || j.invoker.as_deref() == Some(p.id.as_str())
                    || (p.flags.has(Flag::Logs) && crate::access::may_use_model(&st, p, &j.model))
            })
            .take(limit)
            .map(|j| (j.clone(), crate::dispatch::Invoker::seen_by(j.invoker.as_deref(), p)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(seq: u64) -> Event {
        let job_id = format!("job-{seq}");
        Event {
            seq,
            model: "default".into(),
            body: EventBody::JobFinished {
                result: JobResult::failed(&job_id, 1, "x".into()),
                job_id,
                tool_id: None,
                invoker: Some("operator".into()),
            },
            principal: "system".into(),
            time: 0,
            schema: agentos_core::event::EVENT_SCHEMA_VERSION,
        }
    }

    fn seqs(r: &RecentJobs) -> Vec<u64> {
        r.ring.lock().unwrap().iter().map(|j| j.seq).collect()
    }

    /// A result noted as it is committed at start, then the list filled from the log behind
    /// it: every result once, in the log's order.
    #[test]
    fn results_noted_live_and_from_the_log_are_listed_once_in_order() {
        let r = RecentJobs::default();
        r.note(&finished(7));
        for seq in [3, 5, 7] {
            r.note(&finished(seq));
        }
        r.note(&finished(9));
        assert_eq!(seqs(&r), [3, 5, 7, 9]);
    }

    #[test]
    fn a_full_list_keeps_the_newest() {
        let r = RecentJobs::default();
        for seq in 1..=(KEPT as u64 + 10) {
            r.note(&finished(seq + 100));
        }
        r.note(&finished(50));
        let kept = seqs(&r);
        assert_eq!((kept.len(), kept[0], kept[KEPT - 1]), (KEPT, 111, KEPT as u64 + 110));
        r.note(&finished(105));
        assert_eq!(seqs(&r)[0], 111, "older than all kept: not listed");
    }
}
