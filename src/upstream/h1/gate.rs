//! The I/O of a pooled upstream connection as hyper sees it: the TCP stream, with a gate that
//! stops at the end of each response head, so the pool can take a chunked body over from hyper
//! ([`super::chunked`]) at a known place in the byte stream.
//!
//! Why: hyper 1.12's chunked decoder reads every byte of the chunk framing (`1a\r\n` before
//! each chunk, `\r\n` after it) with a `read_mem(1)`, each a `BytesMut::split_to` and a
//! `Bytes` of its own, and hands each chunk to the body through a channel: about 1,800
//! instructions per chunk. An upstream sends an SSE event as a chunk, so an answer of 100
//! progress events spent ~207k of taskgate's ~509k instructions in hyper's client body
//! (benches/profile.sh sse). The request, the response head and every other body stay hyper's.
//!
//! How the gate works (one response at a time, HTTP/1.1 without pipelining):
//! - The pool [`GateCtl::arm`]s it before sending a request. The gate then reads for hyper as
//!   usual and looks at the bytes for the end of the response head: the first empty line, the
//!   head starting with `HTTP/1.` and using CRLF line ends only (a bare LF, which hyper would
//!   accept, opens the gate instead: then the gate could not know where hyper's head ended).
//!   Interim `1xx` heads are passed on and the next head is looked for.
//! - At the end of the final head it gives hyper exactly the head and keeps the rest (the start
//!   of the body) back; hyper's further reads wait ([`Mode::Held`]) until the pool decides. A
//!   head that arrived in one read and does not say `chunked` opens the gate at once instead
//!   (a JSON answer with `Content-Length`: nothing is held or copied).
//! - The pool then either takes the connection apart (`into_parts`: hyper consumed the head and
//!   nothing else, so the body starts at the bytes held here) or [`GateCtl::open`]s the gate:
//!   hyper reads the held bytes first, then the socket, as if the gate had not been there.
//! - A write of the request that was partial or had to wait is noted ([`GateCtl::sent_whole`]):
//!   part of the request may still be in hyper's buffer then, and the pool leaves the body to
//!   hyper rather than drop that part with hyper's connection.
//!
//! The gate never holds bytes when open, and only the pool moves it out of [`Mode::Held`]; the
//! pool does so for every response it receives, so hyper never waits on a held gate.

use super::io::Io;
use bytes::{Buf, BytesMut};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `chunked` without its first letter, which may be upper case (transfer codings are
/// case-insensitive; a head that writes the rest in upper case is left to hyper).
static CHUNKED: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"hunked"));

/// The end of a response head (a CRLF-only one).
static HEAD_END: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\r\n\r\n"));

/// Whether `read`, the first read of a response, holds a final head that does not say
/// `chunked`: then the gate opens at once, without the line-by-line [`Scan`] (which cost ~800
/// instructions a JSON answer, benches/profile.sh lifecycle). Whatever ended hyper's head, this
/// head has no chunked body for the pool to take over, so nothing is held.
fn plainly_not_chunked(read: &[u8]) -> bool {
    read.len() > 12
        && read.starts_with(b"HTTP/1.")
        && read[9] != b'1'
        && HEAD_END
            .find(read)
            .is_some_and(|end| CHUNKED.find(&read[..end]).is_none())
}

/// What the gate does with reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Mode {
    /// Bytes pass through (the held ones first).
    Open = 0,
    /// Armed for a new response: the scan starts afresh at the next read.
    Armed = 1,
    /// Reading a response head, looking for its end.
    Head = 2,
    /// The final head was given to hyper; the bytes after it are held, reads wait.
    Held = 3,
}

/// The pool's handle on a connection's gate (the gate itself is inside hyper's connection).
/// Used from the thread that drives the connection; atomics only because hyper's connection
/// must be `Send`.
#[derive(Debug, Default)]
pub(super) struct GateCtl {
    mode: AtomicU8,
    /// A write of the current request was partial or had to wait.
    backlog: AtomicBool,
}

impl GateCtl {
    fn mode(&self) -> Mode {
        match self.mode.load(Ordering::Relaxed) {
            1 => Mode::Armed,
            2 => Mode::Head,
            3 => Mode::Held,
            _ => Mode::Open,
        }
    }

    fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::Relaxed);
    }

    /// Before a request is sent: look for the end of its response head.
    pub(super) fn arm(&self) {
        self.backlog.store(false, Ordering::Relaxed);
        self.set(Mode::Armed);
    }

    /// Lets hyper read on (the held bytes first).
    pub(super) fn open(&self) {
        self.set(Mode::Open);
    }

    /// Whether the gate stopped at the end of the final response head.
    pub(super) fn held(&self) -> bool {
        self.mode() == Mode::Held
    }

    /// Whether every write of the current request wrote all it was given at once.
    pub(super) fn sent_whole(&self) -> bool {
        !self.backlog.load(Ordering::Relaxed)
    }
}

/// The gated stream (see the module docs).
pub(super) struct Gate {
    io: Io,
    ctl: std::sync::Arc<GateCtl>,
    /// Bytes after the final head, not given to hyper (yet).
    held: BytesMut,
    scan: Scan,
}

impl Gate {
    pub(super) fn new(io: Io, ctl: std::sync::Arc<GateCtl>) -> Gate {
        Gate {
            io,
            ctl,
            held: BytesMut::new(),
            scan: Scan::default(),
        }
    }

    /// The stream and the bytes held after the head (the start of the body).
    pub(super) fn into_parts(self) -> (Io, BytesMut) {
        (self.io, self.held)
    }
}

/// Where the scan of the response heads is.
#[derive(Default)]
struct Scan {
    /// Bytes of the current head seen so far.
    len: usize,
    /// The first bytes of the current head (`HTTP/1.1 200` is 12 bytes).
    start: [u8; 12],
    /// Offset in the current head just past its last `\n` (0: none yet).
    line: usize,
    /// The last byte seen.
    prev: u8,
}

/// What the scan found in the bytes given to it.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// No end of a final head yet.
    More,
    /// The final head ends this many bytes into the slice.
    End(usize),
    /// A head that is not what the gate can stand for (not `HTTP/1.`, a bare LF).
    GiveUp,
}

impl Scan {
    fn find(&mut self, bytes: &[u8]) -> Found {
        let mut at = 0;
        while at < bytes.len() {
            let Some(i) = memchr::memchr(b'\n', &bytes[at..]) else {
                self.take(&bytes[at..]);
                return Found::More;
            };
            let lf = at + i;
            self.take(&bytes[at..lf]);
            if self.prev != b'\r' {
                return Found::GiveUp; // a bare LF (or a head that starts with one)
            }
            self.take(&bytes[lf..=lf]);
            at = lf + 1;
            // An empty line: the `\r\n` right after the previous line's `\n`.
            if self.len - self.line == 2 && self.line > 0 {
                if !self.start.starts_with(b"HTTP/1.") || self.len < 13 {
                    return Found::GiveUp;
                }
                if self.start[9] == b'1' {
                    *self = Scan::default(); // an interim 1xx head: the next one follows
                    continue;
                }
                return Found::End(at);
            }
            self.line = self.len;
        }
        Found::More
    }

    fn take(&mut self, part: &[u8]) {
        if let Some(&last) = part.last() {
            if self.len < self.start.len() {
                let n = (self.start.len() - self.len).min(part.len());
                self.start[self.len..self.len + n].copy_from_slice(&part[..n]);
            }
            self.len += part.len();
            self.prev = last;
        }
    }
}

impl AsyncRead for Gate {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.ctl.mode() {
            Mode::Open => {
                if !this.held.is_empty() {
                    let n = this.held.len().min(buf.remaining());
                    buf.put_slice(&this.held[..n]);
                    this.held.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Pin::new(&mut this.io).poll_read(cx, buf)
            }
            // Woken by the pool: it drives the connection again after opening the gate, and
            // takes the connection apart otherwise.
            Mode::Held => Poll::Pending,
            Mode::Armed | Mode::Head => {
                if this.ctl.mode() == Mode::Armed {
                    this.scan = Scan::default();
                    this.held.clear();
                    this.ctl.set(Mode::Head);
                }
                let before = buf.filled().len();
                std::task::ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
                if this.scan.len == 0 && plainly_not_chunked(&buf.filled()[before..]) {
                    this.ctl.open();
                    return Poll::Ready(Ok(()));
                }
                match this.scan.find(&buf.filled()[before..]) {
                    Found::More => {}
                    Found::GiveUp => this.ctl.open(),
                    Found::End(end) => {
                        // A head read whole here that does not say `chunked` anywhere is not
                        // a chunked answer: nothing to hold (no copy for the common JSON
                        // answer). One read in parts is held whatever it says.
                        let head = (end + before)
                            .checked_sub(this.scan.len)
                            .filter(|&at| at >= before)
                            .map(|at| &buf.filled()[at..before + end]);
                        if head.is_some_and(|h| CHUNKED.find(h).is_none()) {
                            this.ctl.open();
                        } else {
                            this.held.extend_from_slice(&buf.filled()[before + end..]);
                            buf.set_filled(before + end);
                            this.ctl.set(Mode::Held);
                        }
                    }
                }
                Poll::Ready(Ok(()))
            }
        }
    }
}

impl AsyncWrite for Gate {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        if !matches!(r, Poll::Ready(Ok(n)) if n == buf.len()) {
            this.ctl.backlog.store(true, Ordering::Relaxed);
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        let offered: usize = bufs.iter().map(|b| b.len()).sum();
        if !matches!(r, Poll::Ready(Ok(n)) if n == offered) {
            this.ctl.backlog.store(true, Ordering::Relaxed);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(parts: &[&[u8]]) -> Vec<Found> {
        let mut s = Scan::default();
        parts.iter().map(|p| s.find(p)).collect()
    }

    #[test]
    fn the_end_of_the_head_is_found_in_one_read_or_across_reads() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n1a\r\n";
        assert_eq!(scan_all(&[head]), [Found::End(head.len() - 4)]);
        for cut in 1..head.len() - 4 {
            let got = scan_all(&[&head[..cut], &head[cut..]]);
            assert_eq!(got[0], Found::More, "cut at {cut}");
            assert_eq!(got[1], Found::End(head.len() - 4 - cut), "cut at {cut}");
        }
    }

    #[test]
    fn interim_heads_are_passed_on_and_the_final_one_found() {
        let bytes = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\nHTTP/1.1 200 OK\r\n\r\nbody";
        assert_eq!(scan_all(&[bytes]), [Found::End(bytes.len() - 4)]);
    }

    #[test]
    fn a_whole_head_without_chunked_opens_the_gate_at_once() {
        assert!(plainly_not_chunked(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        ));
        assert!(!plainly_not_chunked(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        ));
        assert!(!plainly_not_chunked(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
        ));
        assert!(!plainly_not_chunked(b"HTTP/1.1 100 Continue\r\n\r\n"));
        assert!(!plainly_not_chunked(b"junk"));
    }

    #[test]
    fn heads_the_gate_cannot_stand_for_open_it() {
        assert_eq!(
            scan_all(&[b"HTTP/1.1 200 OK\nA: b\n\nbody"]),
            [Found::GiveUp]
        );
        assert_eq!(
            scan_all(&[b"HTTP/1.1 200 OK\r\nA: b\n\r\n"]),
            [Found::GiveUp]
        );
        assert_eq!(scan_all(&[b"\r\nHTTP/1.1 200 OK\r\n\r\n"]), [Found::GiveUp]);
        assert_eq!(scan_all(&[b"HTTP/2 200\r\n\r\n"]), [Found::GiveUp]);
        assert_eq!(scan_all(&[b"ICY 200 OK\r\n\r\n"]), [Found::GiveUp]);
    }
}
