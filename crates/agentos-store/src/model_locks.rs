//! Which master runs the fires of which model, when several share one log: a session-level
//! advisory lock per model on PostgreSQL. A master holds the locks it took on a connection of
//! its own; when it dies, its connection ends and the database lets the locks go, so another
//! master takes them over at its next claim.

use std::collections::HashSet;
use std::sync::Mutex;

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
}

impl PgModelLocks {
    pub async fn open(url: &str) -> Result<PgModelLocks, StoreError> {
        let config: Config = url.parse().map_err(|e| StoreError::Log(format!("the database URL is not valid: {e}")))?;
        Ok(PgModelLocks { config, client: tokio::sync::Mutex::new(None), held: Mutex::new(HashSet::new()) })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl ModelLocks for PgModelLocks {
    fn holds(&self, model: &str) -> bool {
        self.held().contains(model)
    }

    async fn claim(&self, models: &[String]) -> Vec<String> {
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_none_or(|c| c.is_closed()) {
            // A new session holds no lock: whatever the old one held is gone with it.
            self.held().clear();
            match self.config.connect(NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(async move {
                        let _ = connection.await;
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
            if self.holds(m) {
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
