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
//! Cost: one relaxed atomic store per request and a branch per read/write; the 408 is one
//! non-blocking `send(2)` at drop, made through `socket2` because tokio's `try_write` may refuse
//! before the socket's write readiness was ever polled.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The answer to a request head that did not arrive in time.
const REQUEST_TIMEOUT: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Set by the connection's service each time hyper hands it a request (the head was complete).
pub type Dispatched = Arc<AtomicBool>;

/// A server-side connection that answers a header timeout with 408. See the module doc.
pub struct HeadTimeoutIo {
    stream: TcpStream,
    dispatched: Dispatched,
    /// Bytes of a request head were read and hyper has not dispatched that request yet.
    pending_head: bool,
}

impl HeadTimeoutIo {
    /// Wraps an accepted connection; `dispatched` is shared with the connection's service.
    pub fn new(stream: TcpStream, dispatched: Dispatched) -> Self {
        HeadTimeoutIo {
            stream,
            dispatched,
            pending_head: false,
        }
    }
}

impl AsyncRead for HeadTimeoutIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if buf.filled().len() == before {
                // End of stream: the client went away; nobody is left to answer.
                self.pending_head = false;
            } else if !self.dispatched.load(Ordering::Relaxed) {
                // Bytes before a dispatch are a request head (after a dispatch: its body).
                self.pending_head = true;
            }
        }
        polled
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
        self.dispatched.store(false, Ordering::Relaxed);
        Pin::new(&mut self.stream).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.pending_head = false;
        self.dispatched.store(false, Ordering::Relaxed);
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
        if self.pending_head && !self.dispatched.load(Ordering::Relaxed) {
            // Best effort: an empty send buffer takes these 75 bytes at once; if it cannot, the
            // close that follows is what the client would have seen anyway.
            let _ = socket2::SockRef::from(&self.stream).send(REQUEST_TIMEOUT);
            tracing::debug!("request head not received in time; answered 408");
        }
    }
}
