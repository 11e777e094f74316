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
//! A chunked answer's body is read by taskgate itself rather than hyper: the connection's I/O
//! stops at the end of each response head (`super::gate`), and the pool takes a chunked
//! body over there (`super::chunked`; an SSE event is a chunk, and hyper's chunk decoding
//! cost ~1,800 instructions a chunk). Everything else stays hyper's.
//!
//! An idle connection is checked before reuse (a closed one is dropped); a request that hyper
//! could not send on a reused connection is sent again on a fresh one.
//!
//! Limits ([`PoolLimits`]): at most `max_connections` open connections per upstream (idle and in
//! use; past it a request fails at once with [`PoolError::Limit`] rather than queueing), at most
//! `max_idle` kept idle, and an idle connection older than `idle_timeout` is dropped, on checkout
//! and on checkin, rather than kept in the idle list.
//!
//! Measured reason it stays (the A/B of issue 10: `benches/run.sh` then ran both clients in the
//! same runs, 3 interleaved runs per case, medians, 2 runs on 2026-12-01; `benches/RESULTS.md`,
//! "Upstream HTTP/1 client A/B"): an SSE answer of 100 events costs the pool 385-414 µs of CPU
//! per stream and `hyper_util`'s client 1,768-1,798 µs at c=1 (1,108-1,134 against 359-392 at
//! c=16; streams/s 0.31-0.42× of the pool's), the cost of the per-event task hand-over above;
//! small JSON calls at c=64 are 0.77-0.88× of the pool's throughput with hyper_util; at c=1 and
//! c=16 the two overlap (hyper_util 13-23 % less CPU at c=1). That A/B decided: `hyper_util`'s
//! client, and the `TASKGATE_UPSTREAM_CLIENT` switch that chose it, were removed. The pool has
//! since become per serving thread ([`pin_thread`]), which `hyper_util`'s client, with its
//! connection tasks, cannot do.
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
use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

use super::chunked::{self, Chunked};
use super::gate::{Gate, GateCtl};
use super::io::{Io, Tls};
use super::proxy::Proxy;

/// Idle time before the first TCP keepalive probe.
pub const KEEPALIVE_TIME: Duration = Duration::from_secs(30);
/// Time between unanswered TCP keepalive probes (the OS default count, 9 on Linux, applies).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// Default cap on the open connections (idle and in use) of one upstream.
pub const MAX_CONNECTIONS: usize = 1024;
/// Default cap on the idle connections kept for one upstream.
pub const MAX_IDLE: usize = 256;
/// Default idle time after which a connection is not reused. Below the 5 s keep-alive timeout of
/// Node's and uvicorn's HTTP servers, so an idle connection is not reused just as the server
/// closes it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// The bounds of one upstream's pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolLimits {
    /// Open connections (idle and in use); past it [`Pool::send`] fails with [`PoolError::Limit`].
    pub max_connections: usize,
    /// Idle connections kept; a connection checked in past it is closed.
    pub max_idle: usize,
    /// An idle connection older than this is closed instead of reused.
    pub idle_timeout: Duration,
}

impl Default for PoolLimits {
    fn default() -> Self {
        PoolLimits {
            max_connections: MAX_CONNECTIONS,
            max_idle: MAX_IDLE,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

type Driver = Pin<Box<Connection<TokioIo<Gate>, Full<Bytes>>>>;

/// One HTTP/1.1 connection: the request sender and the I/O future that must be polled for it
/// to make progress.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    driver: Driver,
    /// The I/O future finished: the connection is closed.
    closed: bool,
    /// The gate at the end of each response head (see [`super::gate`]).
    ctl: Arc<GateCtl>,
    /// Counts this connection among the pool's open ones until dropped.
    _slot: Slot,
}

/// Where a connection whose chunked body taskgate reads goes when the body ended cleanly: back to
/// `pool` as a new hyper connection; `slot` counts it toward `max_connections` meanwhile.
struct Return {
    pool: Arc<Pool>,
    slot: Slot,
    ctl: Arc<GateCtl>,
}

impl chunked::Reuse for Return {
    fn reuse(self, io: Io) {
        self.pool.clone().checkin_stream(io, self);
    }
}

/// One unit of a pool's open-connection count, given back on drop.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// Takes a unit unless `max` are taken.
    fn take(open: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()
        .map(|_| Slot(open.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
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
    /// The upstream already has the maximum number of open connections.
    Limit(usize),
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolError::Connect(m) => write!(f, "connect: {m}"),
            PoolError::Http(e) => chain(f, e),
            PoolError::Limit(max) => write!(
                f,
                "taskgate's limit of {max} open connections to this upstream is reached"
            ),
        }
    }
}

/// Writes `e` and its sources, `: `-separated.
fn chain(f: &mut std::fmt::Formatter<'_>, e: &dyn std::error::Error) -> std::fmt::Result {
    write!(f, "{e}")?;
    let mut source = e.source();
    while let Some(s) = source {
        write!(f, ": {s}")?;
        source = s.source();
    }
    Ok(())
}

/// What a failed TLS handshake says: rustls's own error (e.g. "invalid peer certificate:
/// UnknownIssuer") rather than the I/O wrapper's, when it is one.
///
/// `UnknownIssuer`, the most common, is followed by what to do about it. One is said in words
/// instead: a server certificate that is a CA's (basicConstraints CA:TRUE), which webpki
/// refuses as a server's own whatever `ca_file` holds. It is what `openssl req -x509` makes by
/// default, the usual self-signed certificate, and rustls names it only as
/// `Other(OtherError(CaUsedAsEndEntity))` (both found by the cold review).
fn tls_error(e: &std::io::Error) -> String {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)))
            if format!("{other:?}").contains("CaUsedAsEndEntity") =>
        {
            "invalid peer certificate: the server's certificate is a CA certificate \
             (basicConstraints CA:TRUE), which cannot be a server's own: a self-signed one must \
             be made with basicConstraints CA:FALSE (openssl req -x509 ... -addext \
             basicConstraints=critical,CA:FALSE), or the server's certificate signed by that CA"
                .to_string()
        }
        Some(
            rustls @ rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        ) => format!(
            "{rustls} (the certificate does not chain to a trusted CA: set upstream.ca_file to \
             the CA that issued it, or upstream.ca_roots = \"system\" when that CA is in the \
             OS trust store, or the server does not send its intermediate certificates)"
        ),
        Some(rustls) => rustls.to_string(),
        None => e.to_string(),
    }
}

/// Idle lists per pool: one per serving thread ([`pin_thread`]; with more serving threads than
/// this, threads share lists by index modulo this, which still works, with cross-thread
/// wake-ups for the connections they share). 64 lists of an empty `Vec` are 4 KiB per upstream.
const IDLE_SHARDS: usize = 64;

thread_local! {
    /// The idle list this thread checks connections in to and out of.
    static THREAD_SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Makes the calling thread use idle list `index` of every pool. A serving thread calls it once
/// (`gateway.threads`); other threads use list 0.
///
/// Why per thread: a connection's socket is registered with the I/O driver of the runtime that
/// opened it. Reused by a task on another thread's runtime, every readiness event would wake
/// that task from the opening thread (a cross-thread wake-up per response head and body chunk).
/// Kept per thread, a connection is only ever used where it was opened.
pub fn pin_thread(index: usize) {
    THREAD_SHARD.with(|s| s.set(index % IDLE_SHARDS));
}

/// One thread's idle connections with the instant each was checked in, oldest first (LIFO
/// reuse); on a cache line of its own, as each is locked by another thread.
#[repr(align(64))]
#[derive(Default)]
struct IdleList(Mutex<Vec<(Conn, Instant)>>);

/// The pool of one upstream (`host:port`).
pub struct Pool {
    authority: String,
    connect_timeout: Duration,
    /// For an `https://` upstream: the TLS of each new connection.
    tls: Option<Tls>,
    /// `upstream.proxy`: each new connection is a `CONNECT` tunnel through it.
    proxy: Option<Proxy>,
    /// Idle connections, per serving thread ([`pin_thread`]). A thread expires only its own
    /// list: another thread's idle connections are dropped when that thread next uses the pool.
    idle: [IdleList; IDLE_SHARDS],
    /// Idle connections over all lists (bounded by [`PoolLimits::max_idle`]).
    idle_count: AtomicUsize,
    limits: PoolLimits,
    /// Open connections, idle and in use (see [`Slot`]).
    open: Arc<AtomicUsize>,
}

impl Pool {
    /// A pool for `authority` (`host:port`) with the default [`PoolLimits`].
    pub fn new(authority: String, connect_timeout: Duration) -> Arc<Pool> {
        Pool::with_limits(authority, connect_timeout, PoolLimits::default())
    }

    /// A pool for `authority` whose connections are made secure by `tls` (an `https://`
    /// upstream), with the default [`PoolLimits`]. The TLS handshake counts in
    /// `connect_timeout`.
    pub fn with_tls(authority: String, connect_timeout: Duration, tls: Tls) -> Arc<Pool> {
        let mut pool = Pool::unshared(authority, connect_timeout, PoolLimits::default());
        pool.tls = Some(tls);
        Arc::new(pool)
    }

    /// A pool for `authority` whose connections are made secure by `tls` when set (an
    /// `https://` upstream) and go through `proxy`'s tunnels when set, with the default
    /// [`PoolLimits`]. The proxy's TCP connect, its tunnel and the TLS handshake share
    /// `connect_timeout`.
    pub fn for_upstream(
        authority: String,
        connect_timeout: Duration,
        tls: Option<Tls>,
        proxy: Option<Proxy>,
    ) -> Arc<Pool> {
        let mut pool = Pool::unshared(authority, connect_timeout, PoolLimits::default());
        pool.tls = tls;
        pool.proxy = proxy;
        Arc::new(pool)
    }

    /// A pool for `authority` (`host:port`).
    pub fn with_limits(
        authority: String,
        connect_timeout: Duration,
        limits: PoolLimits,
    ) -> Arc<Pool> {
        Arc::new(Pool::unshared(authority, connect_timeout, limits))
    }

    fn unshared(authority: String, connect_timeout: Duration, limits: PoolLimits) -> Pool {
        Pool {
            authority,
            connect_timeout,
            tls: None,
            proxy: None,
            idle: std::array::from_fn(|_| IdleList::default()),
            idle_count: AtomicUsize::new(0),
            limits,
            open: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// This thread's idle list.
    fn idle_list(&self) -> &Mutex<Vec<(Conn, Instant)>> {
        &self.idle[THREAD_SHARD.with(|s| s.get())].0
    }

    /// Removes the idle connections older than the idle timeout at `now` (the oldest come first).
    fn expire(&self, idle: &mut Vec<(Conn, Instant)>, now: Instant) -> Vec<(Conn, Instant)> {
        let fresh = idle
            .iter()
            .position(|(_, since)| now.duration_since(*since) <= self.limits.idle_timeout)
            .unwrap_or(idle.len());
        self.idle_count.fetch_sub(fresh, Ordering::Relaxed);
        idle.drain(..fresh).collect()
    }

    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.idle_list().lock();
        let expired = self.expire(&mut idle, Instant::now());
        let mut found = None;
        while let Some((mut conn, _)) = idle.pop() {
            self.idle_count.fetch_sub(1, Ordering::Relaxed);
            // A connection the upstream closed while idle shows it now (EOF).
            conn.drive(&mut Context::from_waker(std::task::Waker::noop()));
            if !conn.closed && !conn.sender.is_closed() {
                found = Some(conn);
                break;
            }
        }
        drop(idle);
        drop(expired);
        found
    }

    fn checkin(&self, conn: Conn) {
        if conn.closed || conn.sender.is_closed() {
            return;
        }
        let mut idle = self.idle_list().lock();
        // One clock read, under the lock (the list stays in idle order), for both the expiry and
        // the returned connection's idle mark.
        let now = Instant::now();
        let expired = self.expire(&mut idle, now);
        // Taken before the push: the count never exceeds max_idle, whatever other threads do.
        let room = self
            .idle_count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.limits.max_idle).then_some(n + 1)
            })
            .is_ok();
        let rejected = if room {
            idle.push((conn, now));
            None
        } else {
            Some(conn)
        };
        drop(idle);
        drop((expired, rejected));
    }

    async fn connect(&self) -> Result<Conn, PoolError> {
        let slot = Slot::take(&self.open, self.limits.max_connections)
            .ok_or(PoolError::Limit(self.limits.max_connections))?;
        let stream = self.connect_io().await?;
        let ctl = Arc::new(GateCtl::default());
        let (sender, driver) = http1::handshake(TokioIo::new(Gate::new(stream, ctl.clone())))
            .await
            .map_err(PoolError::Http)?;
        Ok(Conn {
            sender,
            driver: Box::pin(driver),
            closed: false,
            ctl,
            _slot: slot,
        })
    }

    /// A connection whose chunked body taskgate read to its end goes back to the idle list as
    /// a new hyper connection (hyper's handshake does no I/O).
    fn checkin_stream(self: Arc<Self>, io: Io, back: Return) {
        use futures_util::FutureExt;
        // Open, so the checkout's look for an EOF sees the idle connection's socket.
        back.ctl.open();
        let gate = Gate::new(io, back.ctl.clone());
        if let Some(Ok((sender, driver))) = http1::handshake(TokioIo::new(gate)).now_or_never() {
            back.pool.checkin(Conn {
                sender,
                driver: Box::pin(driver),
                closed: false,
                ctl: back.ctl,
                _slot: back.slot,
            });
        }
    }

    /// Opens the stream of a new pooled connection: TCP (to the proxy and through its tunnel
    /// when there is one), then for an `https://` upstream TLS, all within the connect timeout.
    /// What `/readyz` checks of this upstream: a new connection made as a request's would be,
    /// then closed. Direct: TCP and, for `https://`, the TLS handshake (a certificate that
    /// cannot be verified, a name it does not carry, a server that does not speak TLS fail it:
    /// every request would). Through a proxy: TCP to the proxy only (its tunnel would need a
    /// request to the upstream's host, which only the proxy resolves). Within
    /// `connect_timeout_ms`. Errors: what a request's connect would report.
    pub async fn probe(&self) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let outcome = match &self.proxy {
            Some(proxy) => self
                .connect_tcp(proxy.authority(), deadline)
                .await
                .map(drop)
                .map_err(|e| match e {
                    PoolError::Connect(m) => PoolError::Connect(format!("proxy {m}")),
                    e => e,
                }),
            None => self.connect_io().await.map(drop),
        };
        outcome.map_err(|e| match e {
            PoolError::Connect(m) => m,
            e => e.to_string(),
        })
    }

    async fn connect_io(&self) -> Result<Io, PoolError> {
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let stream = match &self.proxy {
            None => self.connect_tcp(&self.authority, deadline).await?,
            Some(proxy) => self.connect_tunnel(proxy, deadline).await?,
        };
        let Some(tls) = &self.tls else {
            return Ok(Io::Plain(stream));
        };
        tokio::time::timeout_at(deadline, tls.connect(stream))
            .await
            .map_err(|_| {
                PoolError::Connect(format!(
                    "{} did not complete the TLS handshake within {} ms",
                    self.authority,
                    self.connect_timeout.as_millis()
                ))
            })?
            .map_err(|e| {
                PoolError::Connect(format!("TLS with {}: {}", self.authority, tls_error(&e)))
            })
    }

    /// A TCP connection to `proxy` carrying its tunnel to the upstream, by `deadline`
    /// (see [`super::proxy`]). Errors name the proxy by its `host:port` and the upstream.
    async fn connect_tunnel(
        &self,
        proxy: &Proxy,
        deadline: tokio::time::Instant,
    ) -> Result<TcpStream, PoolError> {
        let mut stream = self
            .connect_tcp(proxy.authority(), deadline)
            .await
            .map_err(|e| match e {
                PoolError::Connect(m) => PoolError::Connect(format!("proxy {m}")),
                e => e,
            })?;
        match tokio::time::timeout_at(deadline, proxy.open(&mut stream)).await {
            Err(_) => Err(PoolError::Connect(format!(
                "proxy {} did not open a tunnel to {} within {} ms",
                proxy.authority(),
                self.authority,
                self.connect_timeout.as_millis()
            ))),
            Ok(Err(why)) => Err(PoolError::Connect(format!(
                "proxy {} (tunnel to {}): {why}",
                proxy.authority(),
                self.authority
            ))),
            Ok(Ok(())) => Ok(stream),
        }
    }

    /// Opens a TCP connection to `address` (the upstream's, or its proxy's) by `deadline`: no
    /// Nagle delay, TCP keepalive on.
    async fn connect_tcp(
        &self,
        address: &str,
        deadline: tokio::time::Instant,
    ) -> Result<TcpStream, PoolError> {
        let stream = tokio::time::timeout_at(deadline, TcpStream::connect(address))
            .await
            .map_err(|_| {
                PoolError::Connect(format!(
                    "{address} did not accept a connection within {} ms",
                    self.connect_timeout.as_millis()
                ))
            })?
            .map_err(|e| PoolError::Connect(format!("{address}: {e}")))?;
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
    ///
    /// Not an `async fn`: its future would keep the request (256 bytes) twice, the argument
    /// and the body's own copy of it (rust-lang/rust#62958); the block uses the one it captured.
    pub fn send(
        self: &Arc<Self>,
        mut req: Request<Full<Bytes>>,
    ) -> impl Future<Output = Result<Response<PooledBody>, PoolError>> + Send + '_ {
        async move {
            loop {
                let (mut conn, reused) = match self.checkout() {
                    Some(c) => (c, true),
                    // Boxed: a new connection is rare, and its future in place made every
                    // request's future (and the transport's box it is moved into) 400 bytes larger.
                    None => (Box::pin(self.connect()).await?, false),
                };
                // Ready to take a request (drives the connection meanwhile). Why the connection
                // ended, if it did: a new one's first error says why it was refused (an mTLS
                // server's alert after a TLS 1.3 handshake the client saw complete).
                // (In the output, not a variable the future keeps across its await.)
                let ready = std::future::poll_fn(|cx| {
                    if !conn.closed {
                        if let Poll::Ready(r) = conn.driver.as_mut().poll(cx) {
                            conn.closed = true;
                            return Poll::Ready(Err(r.err()));
                        }
                    }
                    if conn.closed {
                        return Poll::Ready(Err(None));
                    }
                    conn.sender.poll_ready(cx).map(|r| r.map_err(|_| None))
                })
                .await;
                if let Err(ended) = ready {
                    if reused {
                        continue;
                    }
                    return Err(PoolError::Connect(match ended {
                        Some(e) => format!("{}: {}", self.authority, PoolError::Http(e)),
                        None => format!("{} closed the connection at once", self.authority),
                    }));
                }
                let head_only = req.method() == http::Method::HEAD;
                conn.ctl.arm();
                let result = {
                    // Pinned in this future, not boxed: an allocation less per request.
                    let mut sent = std::pin::pin!(conn.sender.try_send_request(req));
                    std::future::poll_fn(|cx| {
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
                    .await
                };
                match result {
                    Ok(resp) => return Ok(self.clone().body_of(resp, conn, head_only)),
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
}

/// A response body that drives its connection while it is read, and gives the connection back
/// to the pool when it ends: hyper's body, or a chunked body taskgate reads itself (see
/// `super::gate` for why).
pub struct PooledBody(Kind);

enum Kind {
    Hyper {
        body: Incoming,
        conn: Option<Conn>,
        pool: Arc<Pool>,
    },
    Chunked(Chunked<Return>),
}

/// The error of a [`PooledBody`]: hyper's, or what `super::chunked` found.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

impl Pool {
    /// The body of `resp`, read on `conn`. A chunked body the gate stopped in front of, after a
    /// request written whole, is taken over from hyper (`into_parts`); any other is hyper's.
    fn body_of(
        self: Arc<Self>,
        resp: Response<Incoming>,
        conn: Conn,
        head_only: bool,
    ) -> Response<PooledBody> {
        let ctl = conn.ctl.clone();
        let take_over = ctl.held()
            && ctl.sent_whole()
            && !head_only
            && !matches!(resp.status().as_u16(), 100..=199 | 204 | 304)
            && is_chunked(resp.headers());
        if !take_over {
            ctl.open();
            return resp.map(|body| {
                PooledBody(Kind::Hyper {
                    body,
                    conn: Some(conn),
                    pool: self,
                })
            });
        }
        let reuse = resp.version() == http::Version::HTTP_11
            && !resp.headers().contains_key(http::header::CONTENT_LENGTH)
            && !has_token(resp.headers(), http::header::CONNECTION, "close");
        let (parts, incoming) = resp.into_parts();
        let Conn {
            sender,
            driver,
            _slot: slot,
            ..
        } = conn;
        drop(sender);
        let hyper_parts = Pin::into_inner(driver).into_parts();
        drop(incoming);
        let (io, held) = hyper_parts.io.into_inner().into_parts();
        // Stream order: what hyper read past the head (nothing, as the gate gave it only the
        // head), then what the gate held.
        let buf = if hyper_parts.read_buf.is_empty() {
            held
        } else {
            let mut buf = bytes::BytesMut::from(&hyper_parts.read_buf[..]);
            buf.extend_from_slice(&held);
            buf
        };
        // The slot goes with the body whether or not the connection is reused: it counts
        // toward `max_connections` while the body streams (found by the cold review).
        let back = Return {
            pool: self,
            slot,
            ctl,
        };
        Response::from_parts(
            parts,
            PooledBody(Kind::Chunked(Chunked::new(io, buf, Some(back), reuse))),
        )
    }
}

/// Whether the last transfer coding of `headers` is `chunked` (RFC 9112 section 6.3: then the
/// body is chunked, whatever `Content-Length` says).
fn is_chunked(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

/// Whether a `name` field lists `token` (case-insensitive).
fn has_token(headers: &http::HeaderMap, name: http::header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match &mut self.0 {
            Kind::Chunked(body) => body.poll_frame(cx),
            Kind::Hyper { body, conn, pool } => {
                if let Some(c) = conn.as_mut() {
                    c.drive(cx);
                }
                let frame = Pin::new(body).poll_frame(cx);
                if let Poll::Ready(None) = frame {
                    if let Some(c) = conn.take() {
                        pool.checkin(c);
                    }
                }
                frame.map(|f| f.map(|r| r.map_err(BodyError::from)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Kind::Chunked(body) => body.is_end_stream(),
            Kind::Hyper { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Chunked(_) => SizeHint::default(),
            Kind::Hyper { body, .. } => body.size_hint(),
        }
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
#[path = "pool_tls_tests.rs"]
mod tls_tests;

#[cfg(test)]
#[path = "pool_proxy_tests.rs"]
mod proxy_tests;
