//! The accept loop shared by the gateway and admin listeners: HTTP/1.1 with keep-alive, one task
//! per connection, graceful shutdown (stop accepting, let in-flight exchanges finish).

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::head_io::{Dispatched, HeadTimeoutIo};

/// The error a response body can end with: hyper then aborts the response (no clean end of a
/// chunked body), which is how a client learns that an upstream stream was cut. hyper aborts
/// before it writes what it buffered, so a body answers `Pending` once before its error (as
/// `sse::KeepAlive` does) or the client loses the head and the last chunks.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The response body type of both listeners.
pub type Body = UnsyncBoxBody<Bytes, BodyError>;

/// A request handler: one call per HTTP request.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request from the client at `peer` (the TCP peer's address). Never fails:
    /// errors are HTTP responses.
    fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: std::net::SocketAddr,
    ) -> impl Future<Output = Response<Body>> + Send + 'static;
}

/// Limits of one listener (shared by its serving threads: clone it for each).
#[derive(Clone)]
pub struct Limits {
    /// Permits for open connections, one per connection, shared by every thread serving the
    /// listener (at none, further connections wait in the listen backlog).
    pub connections: Arc<tokio::sync::Semaphore>,
    /// Time to receive a request's headers; a partial head then gets 408 (`head_io`).
    pub header_timeout: Duration,
}

/// A connection budget of `max` open connections for [`Limits::connections`].
pub fn connection_budget(max: usize) -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(max))
}

/// How a listener's drain ends: open connections get `timeout` to finish their in-flight
/// requests, unless `cut` turns true first (a second stop signal: the drain ends at once).
#[derive(Clone)]
pub struct Drain {
    /// The drain's budget (`gateway.drain_timeout_ms` for the gateway).
    pub timeout: Duration,
    /// Turns true to end the drain at once.
    pub cut: watch::Receiver<bool>,
}

impl Drain {
    /// Returns once the drain is cut (never when `cut`'s sender is gone without cutting it).
    pub async fn cut(&self) {
        let mut cut = self.cut.clone();
        if cut.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Accepts connections on `listener` until `shutdown` turns true, then waits up to
/// `drain.timeout` (or until the drain is cut) for open connections to finish their in-flight
/// requests, and returns.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
    drain: Drain,
    limits: Limits,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .keep_alive(true)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // Request heads above 64 KiB get 431 here instead of reaching an upstream.
        .max_buf_size(64 * 1024)
        .max_header_size(64 * 1024);
    let slots = limits.connections;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // At the connection limit, this connection waits for a permit and the thread
                // accepts no further one until it has it (further connections wait in the
                // listen backlog: at most one open connection per serving thread beyond the
                // limit). The permit is taken after the accept, not before: with a socket per
                // serving thread, a permit held by a thread whose socket gets no connection
                // would keep one that another thread's socket has waiting.
                let permit = tokio::select! {
                    p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                    _ = async { let _ = shutdown.wait_for(|stop| *stop).await; } => break,
                };
                let _ = stream.set_nodelay(true);
                let handler = handler.clone();
                let dispatched = Dispatched::default();
                let io = HeadTimeoutIo::new(stream, dispatched.clone());
                let service = hyper::service::service_fn(move |req| {
                    dispatched.store(true, Ordering::Relaxed);
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler.handle(req, peer).await) }
                });
                let conn = builder.serve_connection(TokioIo::new(io), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    drop(permit);
                });
            }
            _ = async { let _ = shutdown.wait_for(|stop| *stop).await; } => break,
        }
    }
    drop(listener);
    tokio::select! {
        ended = tokio::time::timeout(drain.timeout, graceful.shutdown()) => {
            if ended.is_err() {
                tracing::warn!(
                    drain_ms = drain.timeout.as_millis() as u64,
                    "drain timeout reached; closing the remaining connections"
                );
            }
        }
        () = drain.cut() => {
            tracing::debug!("drain cut short; closing the remaining connections");
        }
    }
}
