//! What the PostgreSQL stores share: one connection opened again when it breaks, the way a
//! query's error is told (unreachable or a fault), and following a `NOTIFY` channel.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_postgres::{Client, Config, NoTls, Row};

use crate::StoreError;

/// How long a master waits for the database to answer before it calls it unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) fn unavailable(what: &str, e: &tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(format!("{what}: {}", with_causes(e)))
}

/// An error with what caused it: tokio-postgres says only "db error" or "error connecting to
/// server", and the database's own words (`role "nobody" does not exist`, "Connection
/// refused") are in its source.
fn with_causes(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        cause = c.source();
    }
    text
}

/// A query's error: the database unreachable (retry later) or a fault (a refused statement, a
/// parameter that does not fit).
pub(crate) fn query_error(what: &str, e: tokio_postgres::Error) -> StoreError {
    let io = std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
    let shutting_down = e.code().is_some_and(|c| c.code().starts_with("57P"));
    if e.is_closed() || io || shutting_down {
        unavailable(what, &e)
    } else {
        StoreError::Log(format!("{what}: {}", with_causes(&e)))
    }
}

/// `url` without its password, for messages.
pub fn redact_url(url: &str) -> String {
    match url.split_once("://").and_then(|(scheme, rest)| Some((scheme, rest.split_once('@')?))) {
        Some((scheme, (auth, host))) => {
            let user = auth.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}@{host}")
        }
        None => url.to_string(),
    }
}

/// One connection, shared: tokio-postgres pipelines concurrent queries on it. Opened again on
/// the next query once it broke (a restarted database).
pub(crate) struct PgConn {
    pub(crate) config: Config,
    client: Mutex<Option<Arc<Client>>>,
}

impl PgConn {
    /// A connection whose commits do not wait for the disk (`synchronous_commit = off`): a
    /// crash of the database may lose the last fraction of a second of them, never make them
    /// half done. For writes whose loss only makes work run again.
    pub(crate) fn new_relaxed(url: &str) -> Result<PgConn, StoreError> {
        let mut conn = PgConn::new(url)?;
        conn.config.options("-c synchronous_commit=off");
        Ok(conn)
    }

    pub(crate) fn new(url: &str) -> Result<PgConn, StoreError> {
        let mut config: Config = url
            .parse()
            .map_err(|e| StoreError::Log(format!("the database URL {:?} is not valid: {e}", redact_url(url))))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.application_name("agentos");
        Ok(PgConn { config, client: Mutex::new(None) })
    }

    async fn connect(config: &Config) -> Result<Client, StoreError> {
        let (client, connection) =
            config.connect(NoTls).await.map_err(|e| unavailable("connecting to the database", &e))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "the connection to the database ended");
            }
        });
        Ok(client)
    }

    /// The shared connection, opened again when the last one broke.
    pub(crate) async fn client(&self) -> Result<Arc<Client>, StoreError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let c = Arc::new(Self::connect(&self.config).await?);
        *slot = Some(c.clone());
        Ok(c)
    }

    pub(crate) async fn query(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let client = self.client().await?;
        client.query(sql, params).await.map_err(|e| query_error(what, e))
    }

    pub(crate) async fn execute(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let client = self.client().await?;
        client.execute(sql, params).await.map_err(|e| query_error(what, e))
    }

    /// Calls `on_notice` whenever `channel` is notified, and at least every `poll` besides, in
    /// case a notice is lost with a broken connection. Runs until `on_notice` answers false;
    /// listens again on a new connection when the database goes away.
    pub(crate) async fn listen(&self, channel: &str, poll: Duration, mut on_notice: impl FnMut() -> bool + Send) {
        self.listen_except(channel, None, poll, move |_| on_notice()).await
    }

    /// Like [`PgConn::listen`], leaving out the notices whose payload is `own` (this process's
    /// own, which it acted on already), and handing `on_notice` the payloads heard since its
    /// last call (none when it is called for the poll, or after listening again).
    pub(crate) async fn listen_except(
        &self,
        channel: &str,
        own: Option<String>,
        poll: Duration,
        mut on_notice: impl FnMut(&[String]) -> bool + Send,
    ) {
        use futures_util::StreamExt;
        let mut listened = false;
        loop {
            let connected = self.config.connect(NoTls).await;
            let (client, mut connection) = match connected {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, channel, "listening: the database is unreachable");
                    if !on_notice(&[]) {
                        return;
                    }
                    tokio::time::sleep(poll).await;
                    continue;
                }
            };
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            let own = own.clone();
            let pump = tokio::spawn(async move {
                let mut messages = std::pin::pin!(messages);
                while let Some(m) = messages.next().await {
                    match m {
                        Ok(tokio_postgres::AsyncMessage::Notification(n))
                            if own.as_deref().is_some_and(|o| o == n.payload()) => {}
                        Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                            if tx.send(n.payload().to_string()).is_err() {
                                break;
                            }
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            });
            if client.batch_execute(&format!("LISTEN {channel}")).await.is_err() {
                pump.abort();
                tokio::time::sleep(poll).await;
                continue;
            }
            // Listening again on a new connection: what was announced while the last one was
            // down reached nobody, so catch up now rather than at the next poll.
            if std::mem::replace(&mut listened, true) && !on_notice(&[]) {
                pump.abort();
                return;
            }
            let mut payloads = Vec::new();
            loop {
                payloads.clear();
                match tokio::time::timeout(poll, rx.recv()).await {
                    // The connection ended: listen again.
                    Ok(None) => break,
                    Ok(Some(p)) => payloads.push(p),
                    Err(_) => {}
                }
                while let Ok(p) = rx.try_recv() {
                    payloads.push(p);
                }
                if !on_notice(&payloads) {
                    pump.abort();
                    return;
                }
            }
            pump.abort();
        }
    }
}

/// A database of its own for one test, on the cluster `scripts/pg-env` starts.
#[cfg(test)]
pub(crate) async fn fresh_database() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/pg-env");
    let out = std::process::Command::new(script).output().expect("scripts/pg-env");
    assert!(out.status.success(), "scripts/pg-env failed: {}", String::from_utf8_lossy(&out.stderr));
    let url = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let (client, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(conn);
    let stamp = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
    let name = format!("agentos_test_{}", &agentos_core::sha256_hex(stamp.as_bytes())[..12]);
    client.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
    format!("{}/{name}", url.rsplit_once('/').unwrap().0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_stays_out_of_messages() {
        assert_eq!(redact_url("postgres://u:secret@h:5432/db"), "postgres://u@h:5432/db");
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
    }
}
