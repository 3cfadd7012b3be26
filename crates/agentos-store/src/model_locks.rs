//! Which master runs the fires of which model, when several share one log: a session-level
//! advisory lock per model on PostgreSQL. A master holds the locks it took on a connection of
//! its own; when it dies, its connection ends and the database lets the locks go, so another
//! master takes them over at its next claim.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio_postgres::{Client, Config, NoTls};

use crate::StoreError;

/// Decides, per model, whether this master runs its fires.
#[async_trait]
pub trait ModelLocks: Send + Sync + 'static {
    /// Whether this master holds `model`'s lock (and so runs its fires).
    fn holds(&self, model: &str) -> bool;
    /// Tries to take the locks of the `models` this master does not hold yet; answers those it
    /// took. Locks lost with a broken connection are forgotten here and taken again when free.
    async fn claim(&self, models: &[String]) -> Vec<String>;
}

/// The first key of every lock agentos takes (`pg_try_advisory_lock(key1, key2)`), so its locks
/// never meet another program's on the same database.
const LOCK_SPACE: i32 = 0x6167_6e74;

pub struct PgModelLocks {
    config: Config,
    client: tokio::sync::Mutex<Option<Client>>,
    held: Mutex<HashSet<String>>,
    /// The number of the session holding the locks while it is alive, 0 the moment its
    /// connection ends (a restarted database): this master stops firing at once rather than at
    /// its next claim, when another master may already hold the locks.
    alive: Arc<AtomicU64>,
    sessions: AtomicU64,
}

impl PgModelLocks {
    pub async fn open(url: &str) -> Result<PgModelLocks, StoreError> {
        let config: Config = url.parse().map_err(|e| StoreError::Log(format!("the database URL is not valid: {e}")))?;
        Ok(PgModelLocks {
            config,
            client: tokio::sync::Mutex::new(None),
            held: Mutex::new(HashSet::new()),
            alive: Arc::new(AtomicU64::new(0)),
            sessions: AtomicU64::new(0),
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl ModelLocks for PgModelLocks {
    fn holds(&self, model: &str) -> bool {
        self.alive.load(Ordering::Acquire) != 0 && self.held().contains(model)
    }

    async fn claim(&self, models: &[String]) -> Vec<String> {
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_none_or(|c| c.is_closed()) {
            // A new session holds no lock: whatever the old one held is gone with it.
            self.held().clear();
            match self.config.connect(NoTls).await {
                Ok((client, connection)) => {
                    let alive = self.alive.clone();
                    let session = self.sessions.fetch_add(1, Ordering::Relaxed) + 1;
                    alive.store(session, Ordering::Release);
                    tokio::spawn(async move {
                        let _ = connection.await;
                        // Only this session's end: a newer one may be alive already.
                        let _ = alive.compare_exchange(session, 0, Ordering::AcqRel, Ordering::Acquire);
                    });
                    *slot = Some(client);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "claiming models: the database is unreachable");
                    return Vec::new();
                }
            }
        }
        let Some(client) = slot.as_ref() else { return Vec::new() };
        let mut taken = Vec::new();
        for m in models {
            if self.held().contains(m) {
                continue;
            }
            let got = client
                .query_one("SELECT pg_try_advisory_lock($1, hashtext($2))", &[&LOCK_SPACE, &format!("fire:{m}")])
                .await;
            match got {
                Ok(row) if row.get::<_, bool>(0) => {
                    self.held().insert(m.clone());
                    taken.push(m.clone());
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "claiming a model failed");
                    if client.is_closed() {
                        self.held().clear();
                        break;
                    }
                }
            }
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::fresh_database;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lock_is_let_go_the_moment_its_session_ends_and_taken_by_one_master_only() {
        let url = fresh_database().await;
        let a = PgModelLocks::open(&url).await.unwrap();
        let b = PgModelLocks::open(&url).await.unwrap();
        let models = vec!["flow".to_string()];
        assert_eq!(a.claim(&models).await, models);
        assert!(b.claim(&models).await.is_empty(), "held by a");
        assert!(a.holds("flow") && !b.holds("flow"));
        // a's session ends (as when the database restarts): a stops holding at once, before
        // its next claim, and b takes the model over.
        let (admin, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
        tokio::spawn(conn);
        // Only this test's database: other tests share the server.
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while a.holds("flow") {
            assert!(std::time::Instant::now() < deadline, "a still believes it holds the model");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // The ended backend tells its client before it lets its locks go, so b may find the
        // lock still held for a moment; b takes it at one of its next claims.
        loop {
            if b.claim(&models).await == models {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "b never took the model over");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // a reconnects at its next claim, finds the lock taken, and does not fire.
        assert!(a.claim(&models).await.is_empty());
        assert!(!a.holds("flow") && b.holds("flow"));
    }
}
