//! Accepting connections: a cap on how many are open, a deadline for request headers (which
//! also closes idle kept-alive connections), and a graceful stop that ends event streams and
//! gives the requests in hand a deadline.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// How long, once the stop is asked, the requests in hand have to finish (a call still running;
/// an executor's long poll is answered "no job" at the stop) before their connections are
/// dropped. Without a bound, one
/// client that never leaves kept the master, and the data folder's LOCK, for as long as it liked.
const STOP_DEADLINE: Duration = Duration::from_secs(5);

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

/// Serves `app` on `listener` until `shutdown` completes, then stops in two steps: event streams
/// end at once (see [`end_at_stop`]) and the other requests in hand may finish (as
/// `axum::serve` let them) for [`STOP_DEADLINE`]; connections still open then are dropped.
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
    let streams_stop = stop_rx.clone();
    let app = app.layer(axum::middleware::from_fn(move |req, next| end_at_stop(streams_stop.clone(), req, next)));
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
        give_up_on_silent_peers(&stream);
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
                    match tokio::time::timeout(STOP_DEADLINE, conn.as_mut()).await {
                        Ok(result) => result,
                        Err(_) => {
                            tracing::debug!(%remote, "connection dropped: its request did not finish by the stop deadline");
                            Ok(())
                        }
                    }
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

/// Ends the body of an event stream when the stop is asked. A `GET` answered with
/// `text/event-stream` (an MCP session's stream, a net's watch) never ends by itself: its
/// keep-alives go on for as long as the client listens, and a graceful stop that waits for the
/// answer in hand waited for ever. Ended here, its last chunk goes out and the client sees a
/// clean end, as it does when a stream ends any other way, and may reconnect to the next master.
/// An event stream answering a `POST` (an MCP call's answer) is a request in hand and ends by
/// itself, so it is left to the deadline like any other.
async fn end_at_stop(mut stop: watch::Receiver<bool>, req: Request, next: Next) -> Response {
    let subscription = req.method() == Method::GET;
    let resp = next.run(req).await;
    let streams_events = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    if !(subscription && streams_events) {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    // `wait_for` also returns when the stop was asked before the stream began, or when the
    // sender is gone.
    let stopped = async move {
        let _ = stop.wait_for(|asked| *asked).await;
    };
    Response::from_parts(parts, Body::from_stream(body.into_data_stream().take_until(stopped)))
}

/// How long what the master wrote may go unacknowledged before the connection is dropped.
const UNACKNOWLEDGED_LIMIT: Duration = Duration::from_secs(120);

/// A peer gone without a word (its machine off, its network cut) leaves a connection open: an
/// event stream or an MCP `GET` stream then keeps writing its keep-alives into the void, and the
/// kernel retries them for about 15 minutes, holding the stream and what it keeps alive (an MCP
/// session, a slot of `--max-connections`). `TCP_USER_TIMEOUT` drops such a connection once its
/// data has gone unacknowledged for [`UNACKNOWLEDGED_LIMIT`], and keep-alive probes (after 60 s
/// of silence, every 10 s) find one on which nothing is being written. Best effort: a socket
/// that refuses the options is served all the same.
fn give_up_on_silent_peers(stream: &tokio::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: `fd` is an open socket for the duration of the call; the value is a c_int of
        // the size passed.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    let limit = UNACKNOWLEDGED_LIMIT.as_millis() as libc::c_int;
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, limit);
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 60);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 10);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 6);
}

#[cfg(test)]
mod silent_peer_tests {
    use super::*;

    fn option(stream: &tokio::net::TcpStream, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        use std::os::fd::AsRawFd;
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: reads a c_int option of an open socket into `value`, `len` its size.
        let r = unsafe {
            libc::getsockopt(stream.as_raw_fd(), level, name, (&mut value as *mut libc::c_int).cast(), &mut len)
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        value
    }

    /// Regression: a client whose machine went away held its MCP session (and its connection)
    /// for about 16 minutes, while the kernel retried the stream's keep-alives.
    #[tokio::test]
    async fn an_accepted_connection_gives_up_on_a_peer_that_stops_answering() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert_eq!(option(&accepted, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), 0, "the kernel's default");
        give_up_on_silent_peers(&accepted);
        assert_eq!(option(&accepted, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), 120_000);
        assert_eq!(option(&accepted, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(option(&accepted, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 60);
    }
}
