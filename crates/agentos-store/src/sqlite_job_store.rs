//! The embedded store of open direct jobs: one SQLite table in `jobs.db` beside the event log,
//! WAL with full sync. A database of its own rather than a table in the log's: the log is
//! append-only (triggers refuse deletes), and a job leaves this store when it ends.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use crate::StoreError;
use crate::job_store::{JobStore, JobWrite, StoredJob};
use crate::sqlite_event_log::{connect, create_private};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    job_id    TEXT    PRIMARY KEY,
    model     TEXT    NOT NULL,
    invoker   TEXT    NOT NULL,
    token     TEXT    NOT NULL,
    queued_at INTEGER NOT NULL
);
";

pub struct SqliteJobStore {
    conn: Arc<Mutex<Connection>>,
}

fn err(e: rusqlite::Error) -> StoreError {
    StoreError::Jobs(e.to_string())
}

impl SqliteJobStore {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        create_private(path)?;
        let conn = connect(path)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        Ok(SqliteJobStore { conn: Arc::new(Mutex::new(conn)) })
    }

    async fn with<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            // A std Mutex: held only inside this blocking task, never across an await.
            let guard = conn.lock().map_err(|_| StoreError::Jobs("connection lock poisoned".into()))?;
            f(&guard).map_err(err)
        })
        .await
        .map_err(|e| StoreError::Jobs(format!("job store task failed: {e}")))?
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredJob> {
    Ok(StoredJob { job_id: r.get(0)?, model: r.get(1)?, invoker: r.get(2)?, token: r.get(3)?, queued_at: r.get(4)? })
}

#[async_trait]
impl JobStore for SqliteJobStore {
    async fn write(&self, writes: Vec<JobWrite>) -> Result<(), StoreError> {
        self.with(move |c| {
            let tx = c.unchecked_transaction()?;
            for w in &writes {
                // Cached statements: parsing the SQL again for every job cost more than running it.
                match w {
                    JobWrite::Put(job) => tx
                        .prepare_cached(
                            "INSERT OR REPLACE INTO jobs (job_id, model, invoker, token, queued_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                        )?
                        .execute(params![job.job_id, job.model, job.invoker, job.token, job.queued_at])?,
                    JobWrite::Forget(id) => {
                        tx.prepare_cached("DELETE FROM jobs WHERE job_id = ?1")?.execute(params![id])?
                    }
                };
            }
            tx.commit()
        })
        .await
    }

    async fn put(&self, job: StoredJob) -> Result<(), StoreError> {
        self.with(move |c| {
            c.execute(
                "INSERT OR REPLACE INTO jobs (job_id, model, invoker, token, queued_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![job.job_id, job.model, job.invoker, job.token, job.queued_at],
            )
            .map(|_| ())
        })
        .await
    }

    async fn forget(&self, job_id: &str) -> Result<(), StoreError> {
        let id = job_id.to_string();
        self.with(move |c| c.execute("DELETE FROM jobs WHERE job_id = ?1", params![id]).map(|_| ())).await
    }

    async fn get(&self, job_id: &str) -> Result<Option<StoredJob>, StoreError> {
        let id = job_id.to_string();
        self.with(move |c| {
            c.query_row("SELECT job_id, model, invoker, token, queued_at FROM jobs WHERE job_id = ?1", params![id], row)
                .optional()
        })
        .await
    }

    async fn all(&self) -> Result<Vec<StoredJob>, StoreError> {
        self.with(|c| {
            let mut stmt =
                c.prepare("SELECT job_id, model, invoker, token, queued_at FROM jobs ORDER BY queued_at, rowid")?;
            let rows = stmt.query_map([], row)?;
            rows.collect()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, at: i64) -> StoredJob {
        StoredJob { job_id: id.into(), model: "m".into(), invoker: "p-1".into(), token: "{}".into(), queued_at: at }
    }

    #[tokio::test]
    async fn a_batch_of_writes_applies_in_order_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        {
            let s = SqliteJobStore::open(&path).unwrap();
            s.write(vec![
                JobWrite::Put(job("a", 1)),
                JobWrite::Put(job("b", 2)),
                JobWrite::Forget("a".into()),
                JobWrite::Put(job("c", 3)),
                JobWrite::Forget("never-stored".into()),
            ])
            .await
            .unwrap();
        }
        let s = SqliteJobStore::open(&path).unwrap();
        let ids: Vec<String> = s.all().await.unwrap().into_iter().map(|j| j.job_id).collect();
        assert_eq!(ids, ["b", "c"]);
    }

    #[tokio::test]
    async fn a_stored_job_survives_reopening_until_it_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        {
            let s = SqliteJobStore::open(&path).unwrap();
            s.put(job("b", 2)).await.unwrap();
            s.put(job("a", 1)).await.unwrap();
        }
        let s = SqliteJobStore::open(&path).unwrap();
        let ids: Vec<String> = s.all().await.unwrap().into_iter().map(|j| j.job_id).collect();
        assert_eq!(ids, ["a", "b"], "oldest first");
        assert_eq!(s.get("a").await.unwrap(), Some(job("a", 1)));
        s.forget("a").await.unwrap();
        s.forget("never-stored").await.unwrap();
        assert_eq!(s.get("a").await.unwrap(), None);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
