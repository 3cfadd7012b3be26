//! The event log on PostgreSQL, for several masters sharing one log.
//!
//! Events are rows of `agentos_events`, numbered by their `seq`, the primary key. A master
//! appends with the sequence number it has folded up to (`after`): its events take
//! `after + 1 ..`, so when another master appended first the insert breaks the key and the
//! append is refused as a [`StoreError::Conflict`]; the master folds what it missed and decides
//! again. One statement inserts a whole batch, so a batch is all in or all out. Triggers keep
//! the table append-only (no UPDATE, no DELETE, no TRUNCATE) and announce each append on the
//! channel `agentos_events` (`NOTIFY`), which [`PgEventLog::listen`] follows.

use std::time::Duration;

use async_trait::async_trait;
use tokio_postgres::Row;

use crate::pg::{PgConn, query_error};
use crate::{EventLog, NewEvent, RecordedEvent, Snapshot, StoreError};

/// The channel appends are announced on.
pub const CHANNEL: &str = "agentos_events";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS agentos_events (
    seq       BIGINT  PRIMARY KEY,
    model     TEXT    NOT NULL,
    type      TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    payload   TEXT    NOT NULL,
    principal TEXT    NOT NULL,
    time      BIGINT  NOT NULL,
    v         INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS agentos_events_by_key ON agentos_events (model, key, seq);
CREATE INDEX IF NOT EXISTS agentos_events_by_key_any_model ON agentos_events (key, seq);
CREATE OR REPLACE FUNCTION agentos_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the event log is append-only';
END $$;
CREATE OR REPLACE FUNCTION agentos_events_announce() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('agentos_events', '');
    RETURN NULL;
END $$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'agentos_events_append_only') THEN
        CREATE TRIGGER agentos_events_append_only BEFORE UPDATE OR DELETE ON agentos_events
            FOR EACH ROW EXECUTE FUNCTION agentos_events_append_only();
        CREATE TRIGGER agentos_events_no_truncate BEFORE TRUNCATE ON agentos_events
            FOR EACH STATEMENT EXECUTE FUNCTION agentos_events_append_only();
        CREATE TRIGGER agentos_events_announce AFTER INSERT ON agentos_events
            FOR EACH STATEMENT EXECUTE FUNCTION agentos_events_announce();
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS agentos_snapshots (
    seq  BIGINT  PRIMARY KEY,
    v    INTEGER NOT NULL,
    data BYTEA   NOT NULL
);
";

const SELECT: &str = "SELECT seq, model, type, key, payload, principal, time, v FROM agentos_events";

/// A log on PostgreSQL. Cheap to share: one connection, opened again when it breaks (a
/// restarted database), carries every query.
pub struct PgEventLog {
    conn: PgConn,
    /// Where [`EventLog::append_blocking`] runs its query from the committer's thread.
    runtime: tokio::runtime::Handle,
}

impl PgEventLog {
    /// Connects to `url` (`postgres://user@host:port/db`) and creates the tables when missing.
    /// Call from within a Tokio runtime.
    pub async fn open(url: &str) -> Result<PgEventLog, StoreError> {
        let log = PgEventLog { conn: PgConn::new(url)?, runtime: tokio::runtime::Handle::current() };
        let client = log.conn.client().await?;
        client.batch_execute(SCHEMA).await.map_err(|e| query_error("creating the log's tables", e))?;
        Ok(log)
    }

    async fn query(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        self.conn.query(what, sql, params).await
    }

    async fn append(&self, after: u64, events: Vec<NewEvent>) -> Result<Vec<RecordedEvent>, StoreError> {
        let n = events.len();
        let seqs: Vec<i64> = (1..=n as i64).map(|i| after as i64 + i).collect();
        let col = |f: fn(&NewEvent) -> &str| events.iter().map(|e| f(e).to_string()).collect::<Vec<String>>();
        let (models, kinds, keys, payloads, principals) =
            (col(|e| &e.model), col(|e| &e.kind), col(|e| &e.key), col(|e| &e.payload), col(|e| &e.principal));
        let times: Vec<i64> = events.iter().map(|e| e.time).collect();
        let versions: Vec<i32> = events.iter().map(|e| e.schema as i32).collect();
        let client = self.conn.client().await?;
        let inserted = client
            .execute(
                "INSERT INTO agentos_events (seq, model, type, key, payload, principal, time, v) \
                 SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::int[])",
                &[&seqs, &models, &kinds, &keys, &payloads, &principals, &times, &versions],
            )
            .await;
        match inserted {
            Ok(_) => {
                Ok(events.into_iter().zip(seqs).map(|(event, seq)| RecordedEvent { seq: seq as u64, event }).collect())
            }
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                Err(StoreError::Conflict { after })
            }
            Err(e) => Err(query_error("appending events", e)),
        }
    }

    /// Calls `on_append` whenever another master (or this one) appends, and at least every
    /// `poll` besides, in case a notice is lost with a broken connection. Runs until
    /// `on_append` answers false; reconnects when the database goes away.
    pub async fn listen(&self, poll: Duration, on_append: impl FnMut() -> bool + Send) {
        self.conn.listen(CHANNEL, poll, on_append).await
    }
}

fn row_to_event(row: &Row) -> RecordedEvent {
    RecordedEvent {
        seq: row.get::<_, i64>(0) as u64,
        event: NewEvent {
            model: row.get(1),
            kind: row.get(2),
            key: row.get(3),
            payload: row.get(4),
            principal: row.get(5),
            time: row.get(6),
            schema: row.get::<_, i32>(7) as u32,
        },
    }
}

#[async_trait]
impl EventLog for PgEventLog {
    fn append_blocking(&self, after: u64, events: Vec<NewEvent>) -> Result<Vec<RecordedEvent>, StoreError> {
        self.runtime.block_on(self.append(after, events))
    }

    fn shared(&self) -> bool {
        true
    }

    fn read_after_blocking(&self, after: u64, limit: usize) -> Result<Vec<RecordedEvent>, StoreError> {
        self.runtime.block_on(self.read_after(after, limit))
    }

    async fn read_after(&self, after: u64, limit: usize) -> Result<Vec<RecordedEvent>, StoreError> {
        let rows = self
            .query(
                "reading the log",
                &format!("{SELECT} WHERE seq > $1 ORDER BY seq LIMIT $2"),
                &[&(after as i64), &(limit.min(i64::MAX as usize) as i64)],
            )
            .await?;
        Ok(rows.iter().map(row_to_event).collect())
    }

    async fn read_key(&self, model: &str, key: &str) -> Result<Vec<RecordedEvent>, StoreError> {
        let rows = self
            .query(
                "reading a history",
                &format!("{SELECT} WHERE model = $1 AND key = $2 ORDER BY seq"),
                &[&model, &key],
            )
            .await?;
        Ok(rows.iter().map(row_to_event).collect())
    }

    async fn read_key_any_model(&self, key: &str) -> Result<Vec<RecordedEvent>, StoreError> {
        let rows = self.query("reading a history", &format!("{SELECT} WHERE key = $1 ORDER BY seq"), &[&key]).await?;
        Ok(rows.iter().map(row_to_event).collect())
    }

    async fn last_seq(&self) -> Result<u64, StoreError> {
        let rows = self.query("reading the log's end", "SELECT coalesce(max(seq), 0) FROM agentos_events", &[]).await?;
        Ok(rows.first().map(|r| r.get::<_, i64>(0) as u64).unwrap_or(0))
    }

    async fn save_snapshot(&self, snapshot: Snapshot) -> Result<(), StoreError> {
        let seq = snapshot.seq as i64;
        self.query(
            "saving a snapshot",
            "INSERT INTO agentos_snapshots (seq, v, data) VALUES ($1, $2, $3) ON CONFLICT (seq) DO NOTHING",
            &[&seq, &(snapshot.schema as i32), &snapshot.data],
        )
        .await?;
        // The newest two are kept: a master reading the newest while another writes a newer one
        // still finds it.
        self.query(
            "dropping old snapshots",
            "DELETE FROM agentos_snapshots WHERE seq < (SELECT min(seq) FROM (SELECT seq FROM agentos_snapshots ORDER BY seq DESC LIMIT 2) newest)",
            &[],
        )
        .await?;
        Ok(())
    }

    async fn load_snapshot(&self) -> Result<Option<Snapshot>, StoreError> {
        let rows = self
            .query("loading a snapshot", "SELECT seq, v, data FROM agentos_snapshots ORDER BY seq DESC LIMIT 1", &[])
            .await?;
        Ok(rows.first().map(|r| Snapshot {
            seq: r.get::<_, i64>(0) as u64,
            schema: r.get::<_, i32>(1) as u32,
            data: r.get(2),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::fresh_database;
    use std::sync::Arc;

    fn ev(key: &str) -> NewEvent {
        NewEvent {
            model: "default".into(),
            kind: "K".into(),
            key: key.into(),
            payload: "{}".into(),
            principal: "p".into(),
            time: 1,
            schema: 1,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_number_after_the_folded_end_and_a_stale_append_conflicts() {
        let url = fresh_database().await;
        let a = Arc::new(PgEventLog::open(&url).await.unwrap());
        let b = Arc::new(PgEventLog::open(&url).await.unwrap());
        let a2 = a.clone();
        let first = tokio::task::spawn_blocking(move || a2.append_blocking(0, vec![ev("tool:a"), ev("tool:b")]))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2]);
        // b has folded nothing: its append would take seq 1 again.
        let b2 = b.clone();
        let stale = tokio::task::spawn_blocking(move || b2.append_blocking(0, vec![ev("tool:c")])).await.unwrap();
        assert!(matches!(stale, Err(StoreError::Conflict { after: 0 })), "{stale:?}");
        let b2 = b.clone();
        let caught_up = tokio::task::spawn_blocking(move || b2.read_after_blocking(0, 10)).await.unwrap().unwrap();
        assert_eq!(caught_up.len(), 2);
        let b2 = b.clone();
        let next =
            tokio::task::spawn_blocking(move || b2.append_blocking(2, vec![ev("tool:c")])).await.unwrap().unwrap();
        assert_eq!(next[0].seq, 3);
        assert_eq!(a.last_seq().await.unwrap(), 3);
        assert_eq!(a.read_key("default", "tool:a").await.unwrap().len(), 1);
        assert_eq!(a.read_key_any_model("tool:c").await.unwrap()[0].seq, 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_log_is_append_only_and_keeps_the_newest_snapshots() {
        let url = fresh_database().await;
        let log = Arc::new(PgEventLog::open(&url).await.unwrap());
        let l = log.clone();
        tokio::task::spawn_blocking(move || l.append_blocking(0, vec![ev("tool:a")])).await.unwrap().unwrap();
        let client = log.conn.client().await.unwrap();
        for sql in ["UPDATE agentos_events SET payload = 'x'", "DELETE FROM agentos_events", "TRUNCATE agentos_events"]
        {
            let err = client.batch_execute(sql).await.unwrap_err();
            assert!(format!("{err:?}").contains("append-only"), "{sql}: {err:?}");
        }
        for seq in [1, 5, 9] {
            log.save_snapshot(Snapshot { seq, schema: 2, data: vec![seq as u8] }).await.unwrap();
        }
        let newest = log.load_snapshot().await.unwrap().unwrap();
        assert_eq!((newest.seq, newest.data), (9, vec![9]));
        let kept = client.query("SELECT seq FROM agentos_snapshots ORDER BY seq", &[]).await.unwrap();
        assert_eq!(kept.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(), [5, 9]);
        // Opening again keeps what is there.
        let again = PgEventLog::open(&url).await.unwrap();
        assert_eq!(again.last_seq().await.unwrap(), 1);
    }

    /// A log on `url` listening with a poll far longer than any test, so only an announcement
    /// (or a catch-up) calls it in time; each call arrives on the receiver.
    async fn listening(url: &str) -> (tokio::sync::mpsc::UnboundedReceiver<()>, tokio::task::JoinHandle<()>) {
        let listener = Arc::new(PgEventLog::open(url).await.unwrap());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            listener.listen(Duration::from_secs(3600), move || tx.send(()).is_ok()).await;
        });
        (rx, task)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listener_hears_another_masters_append() {
        let url = fresh_database().await;
        let (mut rx, task) = listening(&url).await;
        // The listener's LISTEN may not be in place yet on a loaded machine (an announcement
        // before it is not heard): another master appends again until one is heard.
        let other = Arc::new(PgEventLog::open(&url).await.unwrap());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        for n in 0u64.. {
            let other = other.clone();
            let after = other.last_seq().await.unwrap();
            tokio::task::spawn_blocking(move || other.append_blocking(after, vec![ev(&format!("tool:{n}"))]))
                .await
                .unwrap()
                .unwrap();
            if tokio::time::timeout(Duration::from_millis(300), rx.recv()).await.is_ok() {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "no append was announced");
        }
        task.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listener_whose_connection_ends_catches_up_at_once_on_its_new_one() {
        let url = fresh_database().await;
        let (mut rx, task) = listening(&url).await;
        let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        let listening = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'";
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let pid: i32 = loop {
            if let Some(row) = admin.query(listening, &[]).await.unwrap().first() {
                break row.get(0);
            }
            assert!(tokio::time::Instant::now() < deadline, "the listener never listened");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(rx.try_recv().is_err(), "called before anything happened");
        admin.execute("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap();
        // Nothing is appended and the poll is an hour: only a catch-up on the new connection
        // (for what was announced while there was none) calls it in time.
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("no catch-up after listening again")
            .unwrap();
        task.abort();
    }
}
