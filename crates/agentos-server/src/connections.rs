//! Accepting connections: a cap on how many are open, a deadline for request headers (which
//! also closes idle kept-alive connections), and a graceful stop.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// How the master holds its connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections open at once. More wait in the listen backlog, where they hold no file
    /// handle of the master's, until one closes.
    pub max_connections: usize,
    /// How long a request's headers may take to arrive, counted from when the connection waits
    /// for them: on a new connection, and on a kept-alive one after each answer. A connection
    /// that sends nothing (or half a header) for this long is closed. A request whose headers
    /// arrived is never cut by it, so watch streams and executor long polls are unaffected.
    pub header_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits { max_connections: 1024, header_timeout: Duration::from_secs(30) }
    }
}

impl ConnectionLimits {
    /// The cap actually used: at most half the file handles the process may open, so that
    /// connections alone can never starve the log, the blob store and the sandbox of handles
    /// (300 stalled connections under `ulimit -n 256` made `/healthz` time out).
    pub fn effective_max_connections(&self) -> usize {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit only writes the struct it is given.
        let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
        } else {
            usize::MAX
        };
        self.max_connections.min(soft / 2).max(1)
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then lets open connections finish
/// their requests (as `axum::serve` did) and returns.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let cap = limits.effective_max_connections();
    // The permits double as the count of open connections: the stop waits for all of them.
    let permits = Arc::new(Semaphore::new(cap));
    let (stop_tx, stop_rx) = watch::channel(false);
    tracing::debug!(max_connections = cap, header_timeout_ms = limits.header_timeout.as_millis() as u64, "serving");
    tokio::pin!(shutdown);
    loop {
        // A permit first, then accept: a connection past the cap waits in the kernel's backlog
        // rather than holding one of our file handles.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = &mut shutdown => break,
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file handles, say: wait a little rather than spin, and go on.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Answers written in pieces (an event stream's events, an MCP answer after its priming
        // event) go out at once, not after the peer's delayed acknowledgment of the first piece.
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        let timeout = limits.header_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service).with_upgrades();
            tokio::pin!(conn);
            let result = tokio::select! {
                result = conn.as_mut() => result,
                _ = stop.changed() => {
                    // Finish the request in hand, take no more.
                    conn.as_mut().graceful_shutdown();
                    conn.as_mut().await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%remote, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a permit until it closes.
    let _ = permits.acquire_many(cap as u32).await;
}
