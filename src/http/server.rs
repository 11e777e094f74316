//! The accept loop shared by the gateway and admin listeners: HTTP/1.1 with keep-alive, one task
//! per connection, graceful shutdown (stop accepting, let in-flight exchanges finish).

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use slab::Slab;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
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

    /// The answer to a request still waiting for its own when the drain ends
    /// (`gateway.drain_timeout_ms`, or a second stop signal): one whose head has not gone out
    /// gets this instead of a bare connection close, so its client can tell a shutdown from a
    /// crash. By default HTTP 503 with no body; [`serve`] adds `Connection: close`.
    fn shutting_down() -> Response<Body> {
        let mut resp = Response::new(Body::default());
        *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        resp
    }
}

/// After the drain ends, how long connections get to write the [`Handler::shutting_down`]
/// answers of their waiting requests before [`serve`] returns (and what is left is cut).
const FINAL_WRITE: Duration = Duration::from_millis(500);

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
/// requests. A request still waiting then, its answer not started, is answered
/// [`Handler::shutting_down`] with `Connection: close`; after at most `FINAL_WRITE` (500 ms) more for
/// those answers to be written, it returns (answers already streaming are cut).
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
    // The open connections, so the drain's end reaches the requests still waiting on them.
    let open = Arc::new(OpenConnections::default());
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
                let (key, waiting) = open.open();
                let service = hyper::service::service_fn(move |req| {
                    dispatched.store(true, Ordering::Relaxed);
                    let handler = handler.clone();
                    let waiting = waiting.clone();
                    // The answer's future is made at the first poll, in its place in hyper's
                    // box: made here and moved in, its copies cost ~275 instructions.
                    async move { UntilDrainEnd::<_, H>::new(handler.handle(req, peer), waiting).await }
                });
                let conn = builder.serve_connection(TokioIo::new(io), service);
                let conn = graceful.watch(conn);
                let open = open.clone();
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    open.close(key);
                    drop(permit);
                });
            }
            _ = async { let _ = shutdown.wait_for(|stop| *stop).await; } => break,
        }
    }
    drop(listener);
    let all_done = graceful.shutdown();
    tokio::pin!(all_done);
    tokio::select! {
        done = tokio::time::timeout(drain.timeout, &mut all_done) => {
            if done.is_ok() {
                return;
            }
            tracing::warn!(
                drain_ms = drain.timeout.as_millis() as u64,
                "drain timeout reached; answering waiting requests 503 and closing the remaining connections"
            );
        }
        () = drain.cut() => {
            tracing::debug!("drain cut short; answering waiting requests 503 and closing the remaining connections");
        }
    }
    // Waiting requests answer now; started answers (an SSE stream) are cut when this returns.
    open.end_all();
    let _ = tokio::time::timeout(FINAL_WRITE, all_done).await;
}

/// One connection's side of the drain's end. HTTP/1 has at most one request waiting for its
/// answer per connection: that request's future keeps its task's waker here while it waits.
#[derive(Default)]
struct Waiting {
    /// The drain ended: a request still waiting answers [`Handler::shutting_down`].
    ended: AtomicBool,
    /// The waiting request's task (the connection's task).
    waker: AtomicWaker,
}

/// The open connections of one listener, so the drain's end reaches the requests waiting on
/// them. One lock when a connection opens and one when it closes, none per request: a race
/// of every request with a watch channel (tokio's `Notified` takes a lock at each poll) cost
/// the small call ~1,200 instructions (benches/RESULTS.md R83); this costs a waker check and
/// an atomic load when a request's answer is not ready.
#[derive(Default)]
struct OpenConnections(std::sync::Mutex<Slab<Arc<Waiting>>>);

impl OpenConnections {
    /// A new connection's key (for [`OpenConnections::close`]) and its [`Waiting`].
    fn open(&self) -> (usize, Arc<Waiting>) {
        let waiting = Arc::new(Waiting::default());
        let key = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(waiting.clone());
        (key, waiting)
    }

    /// Forgets a closed connection.
    fn close(&self, key: usize) {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if open.contains(key) {
            open.remove(key);
        }
    }

    /// The drain ended: every waiting request answers [`Handler::shutting_down`] at its next
    /// poll, which this wakes.
    fn end_all(&self) {
        let open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (_, waiting) in open.iter() {
            waiting.ended.store(true, Ordering::Release);
            waiting.waker.wake();
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer, or [`Handler::shutting_down`] with `Connection: close` if the drain
    /// ends first.
    struct UntilDrainEnd<F, H> {
        #[pin]
        answer: F,
        waiting: Arc<Waiting>,
        handler: std::marker::PhantomData<fn() -> H>,
    }
}

impl<F, H> UntilDrainEnd<F, H> {
    fn new(answer: F, waiting: Arc<Waiting>) -> Self {
        UntilDrainEnd {
            answer,
            waiting,
            handler: std::marker::PhantomData,
        }
    }
}

impl<F: Future<Output = Response<Body>>, H: Handler> Future for UntilDrainEnd<F, H> {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(resp) = this.answer.poll(cx) {
            return Poll::Ready(Ok(resp));
        }
        // Registered before the flag is read: an end between the two still wakes this task.
        this.waiting.waker.register(cx.waker());
        if !this.waiting.ended.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        let mut resp = H::shutting_down();
        resp.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
        Poll::Ready(Ok(resp))
    }
}
