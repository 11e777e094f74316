//! The connection I/O handed to hyper: a `TcpStream` that answers a header-phase timeout with
//! `408 Request Timeout` (RFC 9110 section 15.5.9) instead of a silent close.
//!
//! hyper's `header_read_timeout` enforces the deadline but closes the socket without a
//! response, and the connection (with the socket) is already gone when its error surfaces. So
//! this wrapper watches the bytes going by: bytes read that hyper has not yet turned into a
//! request are a *pending head*; a response written, an end of stream, or hyper dispatching the
//! request (the service sets the shared [`Dispatched`] flag) clears it. When hyper drops the
//! connection with a pending head, the only ways there are the header timeout and a graceful
//! shutdown mid-head (a parse error or an oversized head makes hyper write 400/431 first, which
//! clears it), and both deserve the 408. A silent idle keep-alive connection has no pending
//! head and is closed without any unsolicited response, so a client reusing it never reads a
//! 408 as the answer to its next request.
//!
//! It also tells a client's half-close from a hang-up (break-edge F10). A client may send its
//! whole request and then shut down its sending side (RFC 9112 section 9.6), and still read the
//! answer; hyper takes every end of stream during a request for the client gone (which is how a
//! hang-up cancels the exchange: 2026-07-28, "closing the stream is the cancel"), and its own
//! `half_close` option gives that up for every connection. A TCP end of stream is the same in
//! both cases, so this wrapper goes by when it comes: one read while a dispatched request has no
//! answer byte yet, at most [`HALF_CLOSE_WINDOW`] after a read first waited past that request's
//! last bytes (the client shut down as it finished writing), is a half-close. It is not passed
//! to hyper (reads stay pending), and the service sends that answer with `Connection: close`,
//! after which hyper closes the connection. Any later end of stream (a client gone after a
//! wait, or after its answer started) is passed on, as before, and ends the exchange. A client
//! that closes within the window after its request, before any answer byte, is taken for a
//! half-close: its exchange runs to its answer, which finds the connection gone. (A reset is
//! never taken for a half-close.)
//!
//! Cost: one relaxed atomic store per request, a branch per read/write and a clock read when a
//! read first waits after a request's bytes; the 408 is one
//! non-blocking `send(2)` at drop, made through `socket2` because tokio's `try_write` may refuse
//! before the socket's write readiness was ever polled.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The answer to a request head that did not arrive in time.
const REQUEST_TIMEOUT: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// How long after a read first waited past a request's last bytes the client's end of stream is
/// still taken for a half-close (see the module doc): a half-closing client shuts down right
/// after writing, so its end of stream trails its bytes by no more than their delivery.
pub const HALF_CLOSE_WINDOW: Duration = Duration::from_millis(5);

/// What a connection's I/O and its service share.
#[derive(Default)]
pub struct ConnState {
    /// Set by the service each time hyper hands it a request (the head was complete); cleared
    /// by the first byte of a response.
    pub dispatched: AtomicBool,
    /// The client half-closed after its request: the service answers it with
    /// `Connection: close`.
    pub half_closed: AtomicBool,
}

/// The [`ConnState`] of one connection, shared by its I/O and its service.
pub type Dispatched = Arc<ConnState>;

/// A server-side connection that answers a header timeout with 408. See the module doc.
pub struct HeadTimeoutIo {
    stream: TcpStream,
    dispatched: Dispatched,
    /// Bytes of a request head were read and hyper has not dispatched that request yet.
    pending_head: bool,
    /// The last read gave bytes (no read has waited since).
    fresh: bool,
    /// When a read first waited after the last bytes.
    waiting_since: Option<Instant>,
    /// The client's end of stream was taken for a half-close: reads stay pending.
    half_closed: bool,
}

impl HeadTimeoutIo {
    /// Wraps an accepted connection; `dispatched` is shared with the connection's service.
    pub fn new(stream: TcpStream, dispatched: Dispatched) -> Self {
        HeadTimeoutIo {
            stream,
            dispatched,
            pending_head: false,
            fresh: false,
            waiting_since: None,
            half_closed: false,
        }
    }
}

impl AsyncRead for HeadTimeoutIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.half_closed {
            // The client sends nothing more; hyper is woken by its answer.
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        match polled {
            Poll::Ready(Ok(())) if buf.filled().len() == before => {
                // End of stream: a half-close right after an unanswered request, or the client
                // gone (nobody is left to answer).
                self.pending_head = false;
                if self.dispatched.dispatched.load(Ordering::Relaxed) && self.just_after_bytes() {
                    self.half_closed = true;
                    self.dispatched.half_closed.store(true, Ordering::Relaxed);
                    return Poll::Pending;
                }
            }
            Poll::Ready(Ok(())) => {
                self.fresh = true;
                if !self.dispatched.dispatched.load(Ordering::Relaxed) {
                    // Bytes before a dispatch are a request head (after a dispatch: its body).
                    self.pending_head = true;
                }
            }
            Poll::Pending if self.fresh => {
                self.fresh = false;
                self.waiting_since = Some(Instant::now());
            }
            _ => self.fresh = false,
        }
        polled
    }
}

impl HeadTimeoutIo {
    /// Whether an end of stream read now trails the last bytes: no read waited since, or the
    /// first wait began less than [`HALF_CLOSE_WINDOW`] ago.
    fn just_after_bytes(&self) -> bool {
        self.fresh
            || self
                .waiting_since
                .is_some_and(|t| t.elapsed() < HALF_CLOSE_WINDOW)
    }
}

impl AsyncWrite for HeadTimeoutIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        // A response is going out: the request it answers is over, the next head starts fresh.
        self.pending_head = false;
        self.dispatched.dispatched.store(false, Ordering::Relaxed);
        Pin::new(&mut self.stream).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.pending_head = false;
        self.dispatched.dispatched.store(false, Ordering::Relaxed);
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Drop for HeadTimeoutIo {
    fn drop(&mut self) {
        if self.pending_head && !self.dispatched.dispatched.load(Ordering::Relaxed) {
            // Best effort: an empty send buffer takes these 75 bytes at once; if it cannot, the
            // close that follows is what the client would have seen anyway.
            let _ = socket2::SockRef::from(&self.stream).send(REQUEST_TIMEOUT);
            tracing::debug!("request head not received in time; answered 408");
        }
    }
}
