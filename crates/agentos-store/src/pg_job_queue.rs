//! The job queue on PostgreSQL, shared by several masters: a job queued through one master may
//! be handed out, renewed, handed back and finished through any other.
//!
//! A job is a row of `agentos_jobs`. Hand-out takes the oldest free row with
//! `FOR UPDATE SKIP LOCKED`, so two masters never hand out one job; a lease is the row's
//! `lease_id`, `executor` and `expires` (the database's clock, so masters' clocks do not
//! matter). A result is taken by marking the row `completing` with the master that records it;
//! the row goes once the result is in the log. A master that dies between the two leaves a
//! marked row whose lease runs out: the next reaper finds the result in the log (the row goes)
//! or not (the job is queued again). Every queueing is announced on the channel `agentos_jobs`,
//! and so is every goodbye of an executor (see [`stopped_notice`]).
//! Executors are rows of `agentos_executors`: when each was last seen, until when it polls, and
//! whether it said it stopped (in good order, its jobs finished or handed back).

use async_trait::async_trait;
use tokio_postgres::Row;

use crate::StoreError;
use crate::pg::PgConn;

/// The channel new and returned jobs, and executors' goodbyes, are announced on.
pub const JOBS_CHANNEL: &str = "agentos_jobs";

/// The payload announcing that `executor` (whose name holds no space) said goodbye through
/// master `origin` (a run name).
pub fn stopped_notice(executor: &str, origin: &str) -> String {
    format!("stopped {executor} {origin}")
}

/// The executor and the master of a goodbye's announcement; `None` for any other payload.
pub fn read_stopped_notice(payload: &str) -> Option<(&str, &str)> {
    payload.strip_prefix("stopped ")?.split_once(' ')
}

const SCHEMA: &str = "
CREATE SEQUENCE IF NOT EXISTS agentos_jobs_order;
CREATE TABLE IF NOT EXISTS agentos_jobs (
    job_id     TEXT        PRIMARY KEY,
    model      TEXT        NOT NULL,
    target     TEXT,
    invoker    TEXT,
    owner      TEXT        NOT NULL,
    body       BYTEA       NOT NULL,
    sealed     BOOLEAN     NOT NULL,
    attempt    INTEGER     NOT NULL DEFAULT 0,
    position   BIGINT      NOT NULL DEFAULT nextval('agentos_jobs_order'),
    lease_id   TEXT,
    executor   TEXT,
    expires    TIMESTAMPTZ,
    completing TEXT
);
DO $$ BEGIN
    -- Added after the table's first form; looked up first, since the ALTER locks the table
    -- against the other masters' queries even when there is nothing to add.
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
                   AND table_name = 'agentos_jobs' AND column_name = 'leased_at') THEN
        ALTER TABLE agentos_jobs ADD COLUMN IF NOT EXISTS leased_at TIMESTAMPTZ;
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS agentos_jobs_free ON agentos_jobs (position) WHERE lease_id IS NULL;
CREATE INDEX IF NOT EXISTS agentos_jobs_by_invoker ON agentos_jobs (invoker);
CREATE TABLE IF NOT EXISTS agentos_executors (
    name          TEXT   PRIMARY KEY,
    last_seen     BIGINT NOT NULL,
    polling_until BIGINT NOT NULL
);
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
                   AND table_name = 'agentos_executors' AND column_name = 'stopped') THEN
        ALTER TABLE agentos_executors ADD COLUMN IF NOT EXISTS stopped BOOLEAN NOT NULL DEFAULT false;
    END IF;
END $$;
";

/// The database's clock in milliseconds since the epoch.
const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// A job to queue.
#[derive(Debug, Clone)]
pub struct NewJobRow {
    pub job_id: String,
    pub model: String,
    /// Only this executor may take it.
    pub target: Option<String>,
    /// The principal that invoked it directly; `None` for a net's job.
    pub invoker: Option<String>,
    /// The master that queued it.
    pub owner: String,
    /// What the job carries (its command token and credential values), encoded by the master.
    pub body: Vec<u8>,
    /// The body is sealed with the secrets key (it carries credential values).
    pub sealed: bool,
}

/// A job as taken out of the queue: handed out, finished, or failed.
#[derive(Debug, Clone)]
pub struct JobRow {
    pub job_id: String,
    pub model: String,
    pub invoker: Option<String>,
    pub body: Vec<u8>,
    pub sealed: bool,
    pub attempt: u32,
    /// The executor that held it last.
    pub executor: Option<String>,
    /// How long that executor has held it, in ms (none from a master before this column).
    pub held_ms: Option<u64>,
}

/// Why a lease operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseRefusal {
    /// No such job (finished, failed, or never queued).
    UnknownJob,
    /// The job is under another lease, or its result is being recorded.
    LeaseLost,
    /// The lease is right but another executor holds it.
    NotHolder,
}

/// An open job: queued, or handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenJobRow {
    pub model: String,
    pub invoker: Option<String>,
    pub running: bool,
}

/// An executor as the queue last saw it; times in the database's milliseconds.
#[derive(Debug, Clone)]
pub struct ExecutorRow {
    pub name: String,
    pub last_seen: i64,
    pub polling_until: i64,
    /// It said it stopped, and has not been heard from since.
    pub stopped: bool,
    /// The jobs it holds: id, model, invoker.
    pub held: Vec<(String, String, Option<String>)>,
}

/// The expired leases one reaper round dealt with.
#[derive(Debug, Default)]
pub struct Reaped {
    /// Jobs queued again.
    pub requeued: usize,
    /// Jobs past their last attempt, now this master's to record as failed (then [`SharedJobs::forget`]).
    pub failed: Vec<JobRow>,
}

/// The queue several masters share.
#[async_trait]
pub trait SharedJobs: Send + Sync + 'static {
    async fn insert(&self, job: NewJobRow) -> Result<(), StoreError>;
    /// Hands the oldest job `executor` may take to it under `lease_id`. `names` are the names a
    /// targeted job may carry to go to this executor.
    async fn take(
        &self,
        executor: &str,
        names: &[String],
        lease_id: &str,
        lease_ms: u64,
    ) -> Result<Option<JobRow>, StoreError>;
    async fn heartbeat(
        &self,
        executor: &str,
        job_id: &str,
        lease_id: &str,
        lease_ms: u64,
    ) -> Result<Result<(), LeaseRefusal>, StoreError>;
    async fn release(
        &self,
        executor: &str,
        job_id: &str,
        lease_id: &str,
    ) -> Result<Result<(), LeaseRefusal>, StoreError>;
    /// Takes the result of a job from its lease holder: the row is marked as being recorded by
    /// `master` (for `lease_ms`), and no other result is taken.
    async fn complete(
        &self,
        executor: &str,
        job_id: &str,
        lease_id: &str,
        master: &str,
        lease_ms: u64,
    ) -> Result<Result<JobRow, LeaseRefusal>, StoreError>;
    /// Ends now every lease `executor` holds whose id starts with one of `lease_prefixes`
    /// (executor processes that died: their lease ids start with their instance ids), so that
    /// the next reap deals with those jobs. A result being recorded is left alone. Answers how
    /// many.
    async fn expire_leases(&self, executor: &str, lease_prefixes: &[String]) -> Result<usize, StoreError>;
    /// Removes a job whose result is recorded.
    async fn forget(&self, job_id: &str) -> Result<(), StoreError>;
    /// Removes a job whose result is not being recorded, queued or handed out (its executor's
    /// next heartbeat finds it gone and stops it); answers whether it was there.
    async fn cancel(&self, job_id: &str) -> Result<bool, StoreError>;
    /// Takes a job that is queued or handed out, and whose result is not being recorded, for
    /// this master to record as cancelled (as [`SharedJobs::complete`] takes an executor's
    /// result); `None` when there is no such job.
    async fn take_cancelled(&self, job_id: &str, master: &str, lease_ms: u64) -> Result<Option<JobRow>, StoreError>;
    /// Jobs whose lease expired while their result was being recorded: the reaper asks the
    /// log whether it was.
    async fn stale_completions(&self) -> Result<Vec<String>, StoreError>;
    /// Queues again the expired jobs with attempts left, and marks the others as `master`'s to
    /// fail.
    async fn reap(&self, max_attempts: u32, master: &str, lease_ms: u64) -> Result<Reaped, StoreError>;
    async fn open_job(&self, job_id: &str) -> Result<Option<OpenJobRow>, StoreError>;
    async fn open_jobs_of(&self, invoker: &str) -> Result<usize, StoreError>;
    /// Drops the queued (not handed out) jobs of nets in `models` that other masters queued:
    /// the fires that wanted them resume here and queue their own.
    async fn drop_orphans(&self, models: &[String], master: &str) -> Result<u64, StoreError>;
    /// Notes that `executor` was seen now, polling for `polling_ms` more when given.
    async fn seen(&self, executor: &str, polling_ms: Option<u64>) -> Result<(), StoreError>;
    /// Notes that `executor` stopped polling (its last poll through this master ended).
    async fn stopped_polling(&self, executor: &str) -> Result<(), StoreError>;
    /// Notes that `executor` said it stopped, through master `origin`; the next
    /// [`SharedJobs::seen`] of it undoes that. With `end_polls`, it is no longer polling either
    /// (the master it said so to has no poll of it open); without, its polls end as any other
    /// does ([`SharedJobs::stopped_polling`]). Announced on [`JOBS_CHANNEL`] once written, so
    /// that a master with a poll of that name open (another process's) notes it again.
    async fn stopped(&self, executor: &str, end_polls: bool, origin: &str) -> Result<(), StoreError>;
    /// Every executor, and the database's clock now.
    async fn executors(&self) -> Result<(Vec<ExecutorRow>, i64), StoreError>;
    /// Forgets the executors neither seen nor polling for `older_than_ms`; answers how many.
    async fn forget_executors(&self, older_than_ms: u64) -> Result<u64, StoreError>;
}

/// Two connections: queueing a job commits to disk before it is acknowledged (a caller told
/// "queued" finds it after a crash of the database); what happens to a job afterwards (hand-out,
/// renewal, the marks of a result, removal) commits without waiting for the disk, since losing
/// the last of those to a crash only makes a job run again or a stale row be looked up in the
/// log, where the results are kept durably. That saves four disk flushes per job.
pub struct PgJobQueue {
    conn: PgConn,
    durable: PgConn,
}

impl PgJobQueue {
    /// Connects to `url` and creates the queue's tables when missing.
    pub async fn open(url: &str) -> Result<PgJobQueue, StoreError> {
        let q = PgJobQueue { conn: PgConn::new_relaxed(url)?, durable: PgConn::new(url)? };
        let client = q.conn.client().await?;
        client.batch_execute(SCHEMA).await.map_err(|e| crate::pg::query_error("creating the queue's tables", e))?;
        Ok(q)
    }

    /// Calls `on_notice` whenever a job is queued (or queued again) through any master, but for
    /// the jobs `own` (a master's [`NewJobRow::owner`]) queued itself, and at least every `poll`
    /// besides; with the executors that said goodbye through other masters than `own` since the
    /// last call.
    pub async fn listen(
        &self,
        own: Option<String>,
        poll: std::time::Duration,
        mut on_notice: impl FnMut(Vec<String>) -> bool + Send,
    ) {
        let me = own.clone();
        self.conn
            .listen_except(JOBS_CHANNEL, own, poll, move |heard| {
                let stopped = heard
                    .iter()
                    .filter_map(|p| read_stopped_notice(p))
                    .filter(|(_, origin)| me.as_deref() != Some(*origin))
                    .map(|(executor, _)| executor.to_string())
                    .collect();
                on_notice(stopped)
            })
            .await
    }

    /// Why `executor` may not use `lease_id` on `job_id`, when an update matched no row.
    async fn refusal(&self, executor: &str, job_id: &str, lease_id: &str) -> Result<LeaseRefusal, StoreError> {
        let rows = self
            .conn
            .query(
                "reading a lease",
                "SELECT lease_id, executor, completing FROM agentos_jobs WHERE job_id = $1",
                &[&job_id],
            )
            .await?;
        let Some(row) = rows.first() else { return Ok(LeaseRefusal::UnknownJob) };
        let (lease, holder, completing): (Option<String>, Option<String>, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        Ok(if lease.as_deref() != Some(lease_id) || completing.is_some() {
            LeaseRefusal::LeaseLost
        } else if holder.as_deref() != Some(executor) {
            LeaseRefusal::NotHolder
        } else {
            // It matched after all: the row changed in between. Told as lost; the executor stops.
            LeaseRefusal::LeaseLost
        })
    }
}

fn job_row(row: &Row) -> JobRow {
    JobRow {
        job_id: row.get(0),
        model: row.get(1),
        invoker: row.get(2),
        body: row.get(3),
        sealed: row.get(4),
        attempt: row.get::<_, i32>(5).max(0) as u32,
        executor: row.get(6),
        held_ms: row.get::<_, Option<i64>>(7).map(|ms| ms.max(0) as u64),
    }
}

const RETURNING: &str = "RETURNING job_id, model, invoker, body, sealed, attempt, executor, \
                         (extract(epoch FROM clock_timestamp() - leased_at) * 1000)::bigint";

fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

#[async_trait]
impl SharedJobs for PgJobQueue {
    async fn insert(&self, job: NewJobRow) -> Result<(), StoreError> {
        // The notice names the master that queued the job: it woke its own polls already.
        self.durable
            .execute(
                "queueing a job",
                "WITH queued AS (INSERT INTO agentos_jobs (job_id, model, target, invoker, owner, body, sealed) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING 1) \
                 SELECT pg_notify('agentos_jobs', $5) FROM queued",
                &[&job.job_id, &job.model, &job.target, &job.invoker, &job.owner, &job.body, &job.sealed],
            )
            .await
            .map(|_| ())
    }

    async fn take(
        &self,
        executor: &str,
        names: &[String],
        lease_id: &str,
        lease_ms: u64,
    ) -> Result<Option<JobRow>, StoreError> {
        let rows = self
            .conn
            .query(
                "handing out a job",
                &format!(
                    "UPDATE agentos_jobs SET lease_id = $1, executor = $2, attempt = attempt + 1, \
                     expires = clock_timestamp() + make_interval(secs => $3), leased_at = clock_timestamp() \
                     WHERE job_id = (SELECT job_id FROM agentos_jobs WHERE lease_id IS NULL \
                       AND (target IS NULL OR target = ANY($4)) ORDER BY position LIMIT 1 FOR UPDATE SKIP LOCKED) \
                     {RETURNING}"
                ),
                &[&lease_id, &executor, &secs(lease_ms), &names],
            )
            .await?;
        Ok(rows.first().map(job_row))
    }

    async fn heartbeat(
        &self,
        executor: &str,
        job_id: &str,
        lease_id: &str,
        lease_ms: u64,
    ) -> Result<Result<(), LeaseRefusal>, StoreError> {
        let n = self
            .conn
            .execute(
                "renewing a lease",
                "UPDATE agentos_jobs SET expires = clock_timestamp() + make_interval(secs => $4) \
                 WHERE job_id = $1 AND lease_id = $2 AND executor = $3 AND completing IS NULL",
                &[&job_id, &lease_id, &executor, &secs(lease_ms)],
            )
            .await?;
        if n == 1 { Ok(Ok(())) } else { Ok(Err(self.refusal(executor, job_id, lease_id).await?)) }
    }

    async fn expire_leases(&self, executor: &str, lease_prefixes: &[String]) -> Result<usize, StoreError> {
        // One statement for every prefix. Each is matched as text, not as a LIKE pattern: `%`
        // and `_` in it mean themselves.
        let n = self
            .conn
            .execute(
                "ending the leases of executor processes that died",
                "UPDATE agentos_jobs SET expires = clock_timestamp() \
                 WHERE executor = $1 AND completing IS NULL \
                 AND EXISTS (SELECT 1 FROM unnest($2::text[]) AS p WHERE left(lease_id, length(p)) = p)",
                &[&executor, &lease_prefixes],
            )
            .await?;
        Ok(n as usize)
    }

    async fn release(
        &self,
        executor: &str,
        job_id: &str,
        lease_id: &str,
    ) -> Result<Result<(), LeaseRefusal>, StoreError> {
        // Handed back, it goes first: ahead of every queued job.
        let rows = self
            .conn
            .query(
                "handing a job back",
                "WITH back AS (UPDATE agentos_jobs SET lease_id = NULL, executor = NULL, expires = NULL, leased_at = NULL, \
                   attempt = greatest(attempt - 1, 0), \
                   position = (SELECT coalesce(min(position), 0) - 1 FROM agentos_jobs) \
                 WHERE job_id = $1 AND lease_id = $2 AND executor = $3 AND completing IS NULL RETURNING 1) \
                 SELECT pg_notify('agentos_jobs', '') FROM back",
                &[&job_id, &lease_id, &executor],
            )
            .await?;
        if rows.len() == 1 { Ok(Ok(())) } else { Ok(Err(self.refusal(executor, job_id, lease_id).await?)) }
    }

    async fn complete(
        &self,
        executor: &str,
        job_id: &str,
        lease_id: &str,
        master: &str,
        lease_ms: u64,
    ) -> Result<Result<JobRow, LeaseRefusal>, StoreError> {
        let rows = self
            .conn
            .query(
                "taking a job's result",
                &format!(
                    "UPDATE agentos_jobs SET completing = $4, expires = clock_timestamp() + make_interval(secs => $5) \
                     WHERE job_id = $1 AND lease_id = $2 AND executor = $3 AND completing IS NULL {RETURNING}"
                ),
                &[&job_id, &lease_id, &executor, &master, &secs(lease_ms)],
            )
            .await?;
        match rows.first() {
            Some(row) => Ok(Ok(job_row(row))),
            None => Ok(Err(self.refusal(executor, job_id, lease_id).await?)),
        }
    }

    async fn forget(&self, job_id: &str) -> Result<(), StoreError> {
        self.conn.execute("removing a finished job", "DELETE FROM agentos_jobs WHERE job_id = $1", &[&job_id]).await?;
        Ok(())
    }

    async fn cancel(&self, job_id: &str) -> Result<bool, StoreError> {
        let n = self
            .conn
            .execute(
                "dropping a job nobody waits for",
                "DELETE FROM agentos_jobs WHERE job_id = $1 AND completing IS NULL",
                &[&job_id],
            )
            .await?;
        Ok(n == 1)
    }

    async fn take_cancelled(&self, job_id: &str, master: &str, lease_ms: u64) -> Result<Option<JobRow>, StoreError> {
        let rows = self
            .conn
            .query(
                "taking a cancelled job",
                &format!(
                    "UPDATE agentos_jobs SET completing = $2, expires = clock_timestamp() + make_interval(secs => $3) \
                     WHERE job_id = $1 AND completing IS NULL {RETURNING}"
                ),
                &[&job_id, &master, &secs(lease_ms)],
            )
            .await?;
        Ok(rows.first().map(job_row))
    }

    async fn stale_completions(&self) -> Result<Vec<String>, StoreError> {
        let rows = self
            .conn
            .query(
                "reading stale results",
                "SELECT job_id FROM agentos_jobs WHERE completing IS NOT NULL AND expires < clock_timestamp()",
                &[],
            )
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn reap(&self, max_attempts: u32, master: &str, lease_ms: u64) -> Result<Reaped, StoreError> {
        let max = max_attempts.min(i32::MAX as u32) as i32;
        let requeued = self
            .conn
            .query(
                "queueing expired jobs again",
                "WITH back AS (UPDATE agentos_jobs SET lease_id = NULL, executor = NULL, expires = NULL, leased_at = NULL, completing = NULL \
                 WHERE expires < clock_timestamp() AND attempt < $1 RETURNING 1) \
                 SELECT count(*), pg_notify('agentos_jobs', '') FROM back HAVING count(*) > 0",
                &[&max],
            )
            .await?
            .first()
            .map(|r| r.get::<_, i64>(0) as usize)
            .unwrap_or(0);
        let failed = self
            .conn
            .query(
                "failing expired jobs",
                &format!(
                    "UPDATE agentos_jobs SET completing = $2, expires = clock_timestamp() + make_interval(secs => $3) \
                     WHERE expires < clock_timestamp() AND attempt >= $1 {RETURNING}"
                ),
                &[&max, &master, &secs(lease_ms)],
            )
            .await?;
        Ok(Reaped { requeued, failed: failed.iter().map(job_row).collect() })
    }

    async fn open_job(&self, job_id: &str) -> Result<Option<OpenJobRow>, StoreError> {
        let rows = self
            .conn
            .query(
                "reading a job",
                "SELECT model, invoker, lease_id IS NOT NULL FROM agentos_jobs WHERE job_id = $1",
                &[&job_id],
            )
            .await?;
        Ok(rows.first().map(|r| OpenJobRow { model: r.get(0), invoker: r.get(1), running: r.get(2) }))
    }

    async fn open_jobs_of(&self, invoker: &str) -> Result<usize, StoreError> {
        let rows = self
            .conn
            .query("counting open jobs", "SELECT count(*) FROM agentos_jobs WHERE invoker = $1", &[&invoker])
            .await?;
        Ok(rows.first().map(|r| r.get::<_, i64>(0) as usize).unwrap_or(0))
    }

    async fn drop_orphans(&self, models: &[String], master: &str) -> Result<u64, StoreError> {
        self.conn
            .execute(
                "dropping another master's net jobs",
                "DELETE FROM agentos_jobs WHERE model = ANY($1) AND owner <> $2 AND invoker IS NULL AND lease_id IS NULL",
                &[&models, &master],
            )
            .await
    }

    async fn seen(&self, executor: &str, polling_ms: Option<u64>) -> Result<(), StoreError> {
        let polling = polling_ms.map(|ms| ms.min(i64::MAX as u64) as i64);
        self.conn
            .execute(
                "noting an executor",
                &format!(
                    "INSERT INTO agentos_executors (name, last_seen, polling_until) \
                     VALUES ($1, {NOW_MS}, {NOW_MS} + coalesce($2::bigint, 0)) \
                     ON CONFLICT (name) DO UPDATE SET last_seen = excluded.last_seen, stopped = false, \
                     polling_until = CASE WHEN $2::bigint IS NULL THEN agentos_executors.polling_until \
                       ELSE greatest(agentos_executors.polling_until, excluded.polling_until) END"
                ),
                &[&executor, &polling],
            )
            .await
            .map(|_| ())
    }

    async fn stopped_polling(&self, executor: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "noting an executor",
                &format!(
                    "UPDATE agentos_executors SET last_seen = {NOW_MS}, polling_until = least(polling_until, {NOW_MS}) \
                     WHERE name = $1"
                ),
                &[&executor],
            )
            .await
            .map(|_| ())
    }

    async fn stopped(&self, executor: &str, end_polls: bool, origin: &str) -> Result<(), StoreError> {
        // The notice goes out when the update commits, so whoever hears it reads the goodbye.
        let notice = stopped_notice(executor, origin);
        self.conn
            .execute(
                "noting an executor stopped",
                &format!(
                    "WITH noted AS (UPDATE agentos_executors SET last_seen = {NOW_MS}, stopped = true, \
                     polling_until = CASE WHEN $2 THEN least(polling_until, {NOW_MS}) ELSE polling_until END \
                     WHERE name = $1 RETURNING 1) \
                     SELECT pg_notify('{JOBS_CHANNEL}', $3) FROM noted"
                ),
                &[&executor, &end_polls, &notice],
            )
            .await
            .map(|_| ())
    }

    async fn executors(&self) -> Result<(Vec<ExecutorRow>, i64), StoreError> {
        let client = self.conn.client().await?;
        let q = |e| crate::pg::query_error("listing executors", e);
        let now: i64 = client.query_one(&format!("SELECT {NOW_MS}"), &[]).await.map_err(q)?.get(0);
        let seen = client
            .query("SELECT name, last_seen, polling_until, stopped FROM agentos_executors ORDER BY name", &[])
            .await
            .map_err(q)?;
        let held = client
            .query(
                "SELECT executor, job_id, model, invoker FROM agentos_jobs WHERE executor IS NOT NULL AND completing IS NULL",
                &[],
            )
            .await
            .map_err(q)?;
        let mut out: Vec<ExecutorRow> = seen
            .iter()
            .map(|r| ExecutorRow {
                name: r.get(0),
                last_seen: r.get(1),
                polling_until: r.get(2),
                stopped: r.get(3),
                held: Vec::new(),
            })
            .collect();
        for r in &held {
            let name: String = r.get(0);
            if let Some(e) = out.iter_mut().find(|e| e.name == name) {
                e.held.push((r.get(1), r.get(2), r.get(3)));
            }
        }
        Ok((out, now))
    }

    async fn forget_executors(&self, older_than_ms: u64) -> Result<u64, StoreError> {
        let older = older_than_ms.min(i64::MAX as u64) as i64;
        self.conn
            .execute(
                "forgetting executors long gone",
                &format!("DELETE FROM agentos_executors WHERE greatest(last_seen, polling_until) < {NOW_MS} - $1"),
                &[&older],
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::fresh_database;

    fn job(id: &str, target: Option<&str>) -> NewJobRow {
        NewJobRow {
            job_id: id.into(),
            model: "default".into(),
            target: target.map(str::to_string),
            invoker: Some("p1".into()),
            owner: "m1".into(),
            body: b"{}".to_vec(),
            sealed: false,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_masters_never_hand_out_one_job_and_only_the_holder_finishes_it() {
        let url = fresh_database().await;
        let a = PgJobQueue::open(&url).await.unwrap();
        let b = PgJobQueue::open(&url).await.unwrap();
        for i in 0..20 {
            a.insert(job(&format!("j{i}"), None)).await.unwrap();
        }
        // Both masters take at once: every job goes out exactly once.
        let (ta, tb) = tokio::join!(
            async {
                let mut got = Vec::new();
                while let Some(r) = a.take("e1", &["e1".into()], "lease-a", 30_000).await.unwrap() {
                    got.push(r.job_id);
                }
                got
            },
            async {
                let mut got = Vec::new();
                while let Some(r) = b.take("e2", &["e2".into()], "lease-b", 30_000).await.unwrap() {
                    got.push(r.job_id);
                }
                got
            }
        );
        let mut all: Vec<String> = ta.iter().chain(tb.iter()).cloned().collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 20, "a: {ta:?} b: {tb:?}");
        let (mine, lease, other) = if ta.is_empty() { (&tb[0], "lease-b", "e1") } else { (&ta[0], "lease-a", "e2") };
        let holder = if other == "e1" { "e2" } else { "e1" };
        assert_eq!(b.heartbeat(other, mine, lease, 30_000).await.unwrap(), Err(LeaseRefusal::NotHolder));
        assert_eq!(b.heartbeat(holder, mine, "wrong", 30_000).await.unwrap(), Err(LeaseRefusal::LeaseLost));
        assert_eq!(b.heartbeat(holder, "nope", lease, 30_000).await.unwrap(), Err(LeaseRefusal::UnknownJob));
        // Through either master: the result is taken once.
        let taken = b.complete(holder, mine, lease, "m2", 30_000).await.unwrap().unwrap();
        assert_eq!(&taken.job_id, mine);
        assert_eq!(a.complete(holder, mine, lease, "m1", 30_000).await.unwrap().unwrap_err(), LeaseRefusal::LeaseLost);
        b.forget(mine).await.unwrap();
        assert!(a.open_job(mine).await.unwrap().is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn targeted_jobs_expiry_release_and_failure() {
        let url = fresh_database().await;
        let q = PgJobQueue::open(&url).await.unwrap();
        q.insert(job("t", Some("gpu"))).await.unwrap();
        assert!(q.take("e1", &["e1".into()], "l1", 30_000).await.unwrap().is_none(), "meant for gpu only");
        let t = q.take("cred/gpu", &["cred/gpu".into(), "cred".into(), "gpu".into()], "l1", 30_000).await.unwrap();
        assert_eq!(t.unwrap().attempt, 1);
        // Handed back: not counted, and first in line.
        q.insert(job("later", None)).await.unwrap();
        q.release("cred/gpu", "t", "l1").await.unwrap().unwrap();
        let again = q.take("cred/gpu", &["gpu".into()], "l2", 30_000).await.unwrap().unwrap();
        assert_eq!((again.job_id.as_str(), again.attempt), ("t", 1));
        // A lease that runs out: queued again while attempts remain, then failed, once.
        let first = q.take("e1", &["e1".into()], "l3", 1).await.unwrap().unwrap();
        assert_eq!(first.job_id, "later");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let r = q.reap(2, "m1", 30_000).await.unwrap();
        assert_eq!((r.requeued, r.failed.len()), (1, 0));
        q.take("e1", &["e1".into()], "l4", 1).await.unwrap().unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let r = q.reap(2, "m1", 30_000).await.unwrap();
        assert_eq!((r.requeued, r.failed.len()), (0, 1));
        assert_eq!(r.failed[0].attempt, 2);
        let r = q.reap(2, "m2", 30_000).await.unwrap();
        assert!(r.failed.is_empty(), "another master does not fail it again");
        assert_eq!(q.open_jobs_of("p1").await.unwrap(), 2);
        // A job handed out whose caller went away is dropped too: its executor's next heartbeat
        // finds it gone (and stops it), and its result would be refused.
        assert!(q.heartbeat("cred/gpu", "t", "l2", 30_000).await.unwrap().is_ok());
        assert!(q.cancel("t").await.unwrap(), "handed out: dropped");
        assert!(q.heartbeat("cred/gpu", "t", "l2", 30_000).await.unwrap().is_err(), "the lease outlived the job");
        assert!(!q.cancel("t").await.unwrap(), "dropped once");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn executors_are_seen_across_masters_with_what_they_hold() {
        let url = fresh_database().await;
        let a = PgJobQueue::open(&url).await.unwrap();
        let b = PgJobQueue::open(&url).await.unwrap();
        a.seen("e1", Some(30_000)).await.unwrap();
        a.insert(job("j", None)).await.unwrap();
        a.take("e1", &["e1".into()], "l", 30_000).await.unwrap().unwrap();
        b.seen("e1", None).await.unwrap();
        let (rows, now) = b.executors().await.unwrap();
        assert_eq!(rows.len(), 1);
        assert!(rows[0].polling_until > now, "still polling: a heartbeat does not end the poll");
        assert_eq!(rows[0].held, vec![("j".to_string(), "default".to_string(), Some("p1".to_string()))]);
        a.stopped_polling("e1").await.unwrap();
        let (rows, now) = b.executors().await.unwrap();
        assert!(rows[0].polling_until <= now, "no longer polling");
        assert!(!rows[0].stopped);
        // A goodbye is seen by every master; it ends the polls only when told to (another
        // process of the same name may poll); the next sign of life undoes it.
        a.seen("e1", Some(30_000)).await.unwrap();
        b.stopped("e1", false, "m2").await.unwrap();
        let (rows, now) = a.executors().await.unwrap();
        assert!(rows[0].stopped && rows[0].polling_until > now, "{rows:?}");
        b.stopped("e1", true, "m2").await.unwrap();
        let (rows, now) = a.executors().await.unwrap();
        assert!(rows[0].stopped && rows[0].polling_until <= now, "{rows:?}");
        a.seen("e1", None).await.unwrap();
        assert!(!b.executors().await.unwrap().0[0].stopped, "heard from again");
        // A goodbye from an executor never seen notes nothing.
        b.stopped("e2", true, "m2").await.unwrap();
        assert_eq!(a.executors().await.unwrap().0.len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_goodbye_is_announced_to_the_other_masters() {
        let url = fresh_database().await;
        let a = std::sync::Arc::new(PgJobQueue::open(&url).await.unwrap());
        let b = PgJobQueue::open(&url).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let listener = a.clone();
        let listening = tokio::spawn(async move {
            listener
                .listen(Some("m1".into()), std::time::Duration::from_millis(200), move |stopped| {
                    stopped.is_empty() || tx.send(stopped).is_ok()
                })
                .await
        });
        for e in ["e1", "e2", "e3"] {
            b.seen(e, None).await.unwrap();
        }
        // Until the listener is on, a goodbye may go unheard: say it until it is heard.
        let heard = loop {
            b.stopped("e1", true, "m2").await.unwrap();
            if let Ok(Some(h)) = tokio::time::timeout(std::time::Duration::from_millis(300), rx.recv()).await {
                break h;
            }
        };
        assert_eq!(heard, ["e1"]);
        // Its own goodbyes, and those of executors never seen (nothing written), are not told.
        a.stopped("e3", true, "m1").await.unwrap();
        b.stopped("e4", true, "m2").await.unwrap();
        b.stopped("e2", true, "m2").await.unwrap();
        let mut told = Vec::new();
        while !told.contains(&"e2".to_string()) {
            let more = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
            told.extend(more);
        }
        assert!(told.iter().all(|e| e == "e1" || e == "e2"), "{told:?}");
        assert_eq!(read_stopped_notice("job-1-x"), None, "a job's announcement");
        assert_eq!(read_stopped_notice(&stopped_notice("c/e1", "job-1-m a")), Some(("c/e1", "job-1-m a")));
        listening.abort();
    }
}
