//! The embedded event log: SQLite in WAL mode with full sync, one file in the data folder.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use crate::{EventLog, NewEvent, RecordedEvent, Snapshot, StoreError};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (
    seq       INTEGER PRIMARY KEY,
    model     TEXT    NOT NULL,
    type      TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    payload   TEXT    NOT NULL,
    principal TEXT    NOT NULL,
    time      INTEGER NOT NULL,
    v         INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_key ON events (model, key, seq);
CREATE INDEX IF NOT EXISTS events_by_key_any_model ON events (key, seq);
CREATE TRIGGER IF NOT EXISTS events_append_only_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_append_only_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END;
";

const SNAPSHOT_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS snapshots (
    seq  INTEGER PRIMARY KEY,
    v    INTEGER NOT NULL,
    data BLOB    NOT NULL
);
";

/// Writes go through one connection and reads through another, so a long read (history,
/// replay) never waits for a commit; WAL lets them run side by side. Snapshots live in a
/// database file of their own (`<log>.snapshots`), so writing a large one never holds up an
/// append behind SQLite's single write lock.
pub struct SqliteEventLog {
    writer: Arc<Mutex<Connection>>,
    reader: Arc<Mutex<Connection>>,
    snapshots: Arc<Mutex<Connection>>,
}

/// Creates the database file with mode 0600 before SQLite opens it. SQLite would create it
/// 0644 (less the umask), and it gives the `-wal` and `-shm` files it makes later the mode of
/// the database file, so this one mode keeps all three private: the log holds token data
/// that no other user of the machine (a script running as `nobody`, say) may read.
pub(crate) fn create_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| StoreError::io(format!("creating {}", path.display()), e))?;
    Ok(())
}

pub(crate) fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: a commit is on disk before the API answers, even if the machine loses power.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    Ok(conn)
}

fn try_open_snapshots(path: &Path) -> Result<Connection, StoreError> {
    create_private(path)?;
    let conn = connect(path)?;
    conn.execute_batch(SNAPSHOT_SCHEMA)?;
    conn.query_row("SELECT count(*) FROM snapshots", [], |r| r.get::<_, i64>(0))?;
    Ok(conn)
}

/// Opens the snapshot database, or a new one in place of one that cannot be read. A snapshot
/// only saves replay time, so an unreadable one must not stop the master (a garbage file did,
/// with an error that named the event log): it is moved aside, for whoever wants to look, and
/// the state is rebuilt from the log.
fn open_snapshots(path: &Path) -> Result<Connection, StoreError> {
    match try_open_snapshots(path) {
        Ok(conn) => Ok(conn),
        Err(e) => {
            let now =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
            let mut aside = path.as_os_str().to_owned();
            aside.push(format!(".unreadable-{now}"));
            tracing::warn!(
                file = %path.display(),
                moved_to = %Path::new(&aside).display(),
                error = %e,
                "the snapshot database cannot be read; ignoring it and replaying the whole log"
            );
            std::fs::rename(path, &aside)
                .map_err(|e| StoreError::io(format!("moving the unreadable {} aside", path.display()), e))?;
            for suffix in ["-wal", "-shm"] {
                let mut side = path.as_os_str().to_owned();
                side.push(suffix);
                // Left over from the unreadable file, they would be applied to the new one.
                match std::fs::remove_file(&side) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(StoreError::io(format!("removing {}", Path::new(&side).display()), e));
                    }
                    _ => {}
                }
            }
            try_open_snapshots(path)
        }
    }
}

impl SqliteEventLog {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        create_private(path)?;
        let writer = connect(path)?;
        writer.execute_batch(SCHEMA)?;
        let reader = connect(path)?;
        let mut snapshot_path = path.as_os_str().to_owned();
        snapshot_path.push(".snapshots");
        let snapshots = open_snapshots(Path::new(&snapshot_path))?;
        Ok(SqliteEventLog {
            writer: Arc::new(Mutex::new(writer)),
            reader: Arc::new(Mutex::new(reader)),
            snapshots: Arc::new(Mutex::new(snapshots)),
        })
    }

    async fn with<T, F>(conn: &Arc<Mutex<Connection>>, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let conn = conn.clone();
        tokio::task::spawn_blocking(move || {
            // A std Mutex is right here: it is held only inside this blocking task, never across an await.
            let mut guard = conn.lock().map_err(|_| StoreError::Log("connection lock poisoned".into()))?;
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Log(format!("log task failed: {e}")))?
    }
}

fn row_to_event(row: &rusqlite::Row<'_>) -> rusqlite::Result<RecordedEvent> {
    Ok(RecordedEvent {
        seq: row.get::<_, i64>(0)? as u64,
        event: NewEvent {
            model: row.get(1)?,
            kind: row.get(2)?,
            key: row.get(3)?,
            payload: row.get(4)?,
            principal: row.get(5)?,
            time: row.get(6)?,
            schema: row.get::<_, i64>(7)? as u32,
        },
    })
}

fn append_in(conn: &mut Connection, events: Vec<NewEvent>) -> Result<Vec<RecordedEvent>, StoreError> {
    let tx = conn.transaction()?;
    let mut out = Vec::with_capacity(events.len());
    {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO events (model, type, key, payload, principal, time, v) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        for e in events {
            stmt.execute(params![e.model, e.kind, e.key, e.payload, e.principal, e.time, e.schema as i64])?;
            out.push(RecordedEvent { seq: tx.last_insert_rowid() as u64, event: e });
        }
    }
    tx.commit()?;
    Ok(out)
}

const SELECT: &str = "SELECT seq, model, type, key, payload, principal, time, v FROM events";

#[async_trait]
impl EventLog for SqliteEventLog {
    fn append_blocking(&self, _after: u64, events: Vec<NewEvent>) -> Result<Vec<RecordedEvent>, StoreError> {
        let mut conn = self.writer.lock().map_err(|_| StoreError::Log("connection lock poisoned".into()))?;
        append_in(&mut conn, events)
    }

    async fn read_after(&self, after: u64, limit: usize) -> Result<Vec<RecordedEvent>, StoreError> {
        Self::with(&self.reader, move |conn| {
            let mut stmt = conn.prepare_cached(&format!("{SELECT} WHERE seq > ?1 ORDER BY seq LIMIT ?2"))?;
            let rows = stmt.query_map(params![after as i64, limit as i64], row_to_event)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn read_key(&self, model: &str, key: &str) -> Result<Vec<RecordedEvent>, StoreError> {
        let (model, key) = (model.to_string(), key.to_string());
        Self::with(&self.reader, move |conn| {
            let mut stmt = conn.prepare_cached(&format!("{SELECT} WHERE model = ?1 AND key = ?2 ORDER BY seq"))?;
            let rows = stmt.query_map(params![model, key], row_to_event)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn read_key_any_model(&self, key: &str) -> Result<Vec<RecordedEvent>, StoreError> {
        let key = key.to_string();
        Self::with(&self.reader, move |conn| {
            let mut stmt = conn.prepare_cached(&format!("{SELECT} WHERE key = ?1 ORDER BY seq"))?;
            let rows = stmt.query_map(params![key], row_to_event)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn last_seq(&self) -> Result<u64, StoreError> {
        Self::with(&self.reader, |conn| {
            let seq: Option<i64> = conn.query_row("SELECT MAX(seq) FROM events", [], |r| r.get(0))?;
            Ok(seq.unwrap_or(0) as u64)
        })
        .await
    }

    async fn save_snapshot(&self, snapshot: Snapshot) -> Result<(), StoreError> {
        Self::with(&self.snapshots, move |conn| {
            let tx = conn.transaction()?;
            tx.execute(
                "INSERT OR REPLACE INTO snapshots (seq, v, data) VALUES (?1, ?2, ?3)",
                params![snapshot.seq as i64, snapshot.schema as i64, snapshot.data],
            )?;
            // Keep the newest two: one to fall back on should the newest ever be unreadable.
            tx.execute(
                "DELETE FROM snapshots WHERE seq NOT IN (SELECT seq FROM snapshots ORDER BY seq DESC LIMIT 2)",
                [],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn load_snapshot(&self) -> Result<Option<Snapshot>, StoreError> {
        Self::with(&self.snapshots, |conn| {
            Ok(conn
                .query_row("SELECT seq, v, data FROM snapshots ORDER BY seq DESC LIMIT 1", [], |r| {
                    Ok(Snapshot {
                        seq: r.get::<_, i64>(0)? as u64,
                        schema: r.get::<_, i64>(1)? as u32,
                        data: r.get(2)?,
                    })
                })
                .optional()?)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(key: &str) -> NewEvent {
        NewEvent {
            model: "default".into(),
            kind: "ToolRegistered".into(),
            key: key.into(),
            payload: "{}".into(),
            principal: "operator".into(),
            time: 1,
            schema: 1,
        }
    }

    #[tokio::test]
    async fn appends_in_order_reads_back_and_refuses_rewrites() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.db");
        let log = SqliteEventLog::open(&path).unwrap();
        let a = log.append_blocking(0, vec![ev("tool:a"), ev("tool:b")]).unwrap();
        assert_eq!(a.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
        log.append_blocking(0, vec![ev("tool:a")]).unwrap();
        assert_eq!(log.last_seq().await.unwrap(), 3);
        assert_eq!(log.read_key("default", "tool:a").await.unwrap().len(), 2);
        assert_eq!(log.read_after(1, 10).await.unwrap().len(), 2);
        drop(log);

        let conn = Connection::open(&path).unwrap();
        assert!(conn.execute("DELETE FROM events", []).is_err());
        assert!(conn.execute("UPDATE events SET payload = 'x'", []).is_err());

        let log = SqliteEventLog::open(&path).unwrap();
        assert_eq!(log.last_seq().await.unwrap(), 3);
        for seq in [3, 5, 7] {
            log.save_snapshot(Snapshot { seq, schema: 1, data: vec![seq as u8] }).await.unwrap();
        }
        assert_eq!(log.load_snapshot().await.unwrap().unwrap().seq, 7);
    }

    #[tokio::test]
    async fn a_garbage_snapshot_file_is_set_aside_and_the_log_still_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.db");
        let log = SqliteEventLog::open(&path).unwrap();
        log.append_blocking(0, vec![ev("tool:a")]).unwrap();
        log.save_snapshot(Snapshot { seq: 1, schema: 1, data: vec![1] }).await.unwrap();
        drop(log);
        for f in ["events.db.snapshots-wal", "events.db.snapshots-shm"] {
            let _ = std::fs::remove_file(dir.path().join(f));
        }
        std::fs::write(dir.path().join("events.db.snapshots"), vec![0x5a; 8192]).unwrap();

        let log = SqliteEventLog::open(&path).unwrap();
        assert_eq!(log.last_seq().await.unwrap(), 1);
        assert!(log.load_snapshot().await.unwrap().is_none());
        log.save_snapshot(Snapshot { seq: 1, schema: 1, data: vec![2] }).await.unwrap();
        assert_eq!(log.load_snapshot().await.unwrap().unwrap().data, vec![2]);
        let aside = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("events.db.snapshots.unreadable-"))
            .count();
        assert_eq!(aside, 1);
    }

    #[tokio::test]
    async fn the_log_its_wal_and_the_snapshots_are_private_to_their_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let log = SqliteEventLog::open(&dir.path().join("events.db")).unwrap();
        log.append_blocking(0, vec![ev("tool:a")]).unwrap();
        log.save_snapshot(Snapshot { seq: 1, schema: 1, data: vec![1] }).await.unwrap();
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let entry = entry.unwrap();
            let mode = entry.metadata().unwrap().permissions().mode() & 0o777;
            files.push((entry.file_name().into_string().unwrap(), mode));
        }
        files.sort();
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"events.db-wal") && names.contains(&"events.db.snapshots-shm"), "{files:?}");
        assert!(files.iter().all(|(_, mode)| *mode == 0o600), "{files:?}");
    }
}
