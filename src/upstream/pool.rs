//! An HTTP/1.1 keep-alive connection pool whose connections are driven by the request that uses
//! them.
//!
//! Why not `hyper_util`'s pooled client: it runs each connection on a task of its own, so every
//! response head and every body chunk crosses from that task to the request's task and back
//! (a wake-up, often a thread hop, per SSE event). Here a checked-out connection's I/O future is
//! polled by the request future and then by the response body ([`PooledBody`]), in the task that
//! consumes the body: an SSE answer with 100 events costs no task hand-over per event. When a
//! body is read to its end the connection goes back to the pool; a body dropped early closes it
//! (the upstream sees its stream released).
//!
//! An idle connection is checked before reuse (a closed one is dropped); a request that hyper
//! could not send on a reused connection is sent again on a fresh one.
//!
//! Every connection has TCP keepalive on ([`KEEPALIVE_TIME`], [`KEEPALIVE_INTERVAL`]):
//! `tasks/result` and GET streams have no timeout by design, so without it a half-open socket
//! (the upstream host vanished, a NAT or load balancer dropped the flow) would wait forever. With
//! it the kernel probes an idle connection and fails it after a few unanswered probes; the waiting
//! exchange then ends with an error instead of hanging.

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// Idle time before the first TCP keepalive probe.
pub const KEEPALIVE_TIME: Duration = Duration::from_secs(30);
/// Time between unanswered TCP keepalive probes (the OS default count, 9 on Linux, applies).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

type Driver = Pin<Box<Connection<TokioIo<TcpStream>, Full<Bytes>>>>;

/// One HTTP/1.1 connection: the request sender and the I/O future that must be polled for it
/// to make progress.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    driver: Driver,
    /// The I/O future finished: the connection is closed.
    closed: bool,
}

impl Conn {
    /// Polls the I/O future; notes when the connection has ended.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if !self.closed && self.driver.as_mut().poll(cx).is_ready() {
            self.closed = true;
        }
    }
}

/// Why a request could not be sent.
#[derive(Debug)]
pub enum PoolError {
    /// TCP connect failed or timed out (the message says which).
    Connect(String),
    /// The HTTP exchange failed.
    Http(hyper::Error),
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolError::Connect(m) => write!(f, "connect: {m}"),
            PoolError::Http(e) => {
                write!(f, "{e}")?;
                let mut source = std::error::Error::source(e);
                while let Some(s) = source {
                    write!(f, ": {s}")?;
                    source = s.source();
                }
                Ok(())
            }
        }
    }
}

/// The pool of one upstream (`host:port`).
pub struct Pool {
    authority: String,
    connect_timeout: Duration,
    idle: Mutex<Vec<(Conn, Instant)>>,
    max_idle: usize,
    idle_timeout: Duration,
}

impl Pool {
    /// A pool for `authority` (`host:port`).
    pub fn new(authority: String, connect_timeout: Duration) -> Arc<Pool> {
        Arc::new(Pool {
            authority,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
            max_idle: 256,
            // Below the 5 s keep-alive timeout of Node's and uvicorn's HTTP servers, so an idle
            // connection is not reused just as the server closes it.
            idle_timeout: Duration::from_secs(4),
        })
    }

    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().expect("pool lock");
        while let Some((mut conn, since)) = idle.pop() {
            if since.elapsed() > self.idle_timeout {
                continue;
            }
            // A connection the upstream closed while idle shows it now (EOF).
            conn.drive(&mut Context::from_waker(std::task::Waker::noop()));
            if !conn.closed && !conn.sender.is_closed() {
                return Some(conn);
            }
        }
        None
    }

    fn checkin(&self, conn: Conn) {
        if conn.closed || conn.sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().expect("pool lock");
        if idle.len() < self.max_idle {
            idle.push((conn, Instant::now()));
        }
    }

    async fn connect(&self) -> Result<Conn, PoolError> {
        let stream = self.connect_tcp().await?;
        let (sender, driver) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(PoolError::Http)?;
        Ok(Conn {
            sender,
            driver: Box::pin(driver),
            closed: false,
        })
    }

    /// Opens the TCP connection of a new pooled connection: no Nagle delay, TCP keepalive on.
    async fn connect_tcp(&self) -> Result<TcpStream, PoolError> {
        let stream = tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect(self.authority.as_str()),
        )
        .await
        .map_err(|_| {
            PoolError::Connect(format!(
                "{} did not accept a connection within {} ms",
                self.authority,
                self.connect_timeout.as_millis()
            ))
        })?
        .map_err(|e| PoolError::Connect(format!("{}: {e}", self.authority)))?;
        let _ = stream.set_nodelay(true);
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE_TIME)
            .with_interval(KEEPALIVE_INTERVAL);
        if let Err(e) = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive) {
            tracing::debug!(upstream = %self.authority, error = %e, "could not enable TCP keepalive");
        }
        Ok(stream)
    }

    /// Sends `req` (origin-form URI) and returns the response once its head arrived. The body
    /// keeps the connection until it is read to its end (then the connection is pooled again)
    /// or dropped (then it is closed).
    pub async fn send(
        self: &Arc<Self>,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<PooledBody>, PoolError> {
        loop {
            let (mut conn, reused) = match self.checkout() {
                Some(c) => (c, true),
                None => (self.connect().await?, false),
            };
            // Ready to take a request (drives the connection meanwhile).
            let ready = std::future::poll_fn(|cx| {
                conn.drive(cx);
                if conn.closed {
                    return Poll::Ready(false);
                }
                conn.sender.poll_ready(cx).map(|r| r.is_ok())
            })
            .await;
            if !ready {
                if reused {
                    continue;
                }
                return Err(PoolError::Connect(format!(
                    "{} closed the connection at once",
                    self.authority
                )));
            }
            let mut sent = Box::pin(conn.sender.try_send_request(req));
            let result = std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = sent.as_mut().poll(cx) {
                    return Poll::Ready(r);
                }
                conn.drive(cx);
                if conn.closed {
                    // The exchange cannot progress any more: the sender reports why.
                    return sent.as_mut().poll(cx);
                }
                Poll::Pending
            })
            .await;
            drop(sent);
            match result {
                Ok(resp) => {
                    let pool = self.clone();
                    return Ok(resp.map(|body| PooledBody {
                        body,
                        conn: Some(conn),
                        pool,
                    }));
                }
                Err(mut e) => match e.take_message() {
                    // Not sent on a reused connection the upstream had closed: send it on a
                    // fresh one.
                    Some(unsent) if reused => req = unsent,
                    _ => return Err(PoolError::Http(e.into_error())),
                },
            }
        }
    }
}

/// A response body that drives its connection while it is read, and gives the connection back
/// to the pool when it ends.
pub struct PooledBody {
    body: Incoming,
    conn: Option<Conn>,
    pool: Arc<Pool>,
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(conn) = this.conn.as_mut() {
            conn.drive(cx);
        }
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            if let Some(conn) = this.conn.take() {
                this.pool.checkin(conn);
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pooled connection has SO_KEEPALIVE set (and the probe timing where the OS reports it).
    #[tokio::test]
    async fn pooled_connection_has_tcp_keepalive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pool = Pool::new(addr.to_string(), Duration::from_secs(5));
        let (stream, accepted) = tokio::join!(pool.connect_tcp(), listener.accept());
        let stream = stream.expect("connect");
        let _server_side = accepted.unwrap();
        let sock = socket2::SockRef::from(&stream);
        assert!(sock.keepalive().unwrap(), "SO_KEEPALIVE must be set");
        assert!(stream.nodelay().unwrap());
    }
}
