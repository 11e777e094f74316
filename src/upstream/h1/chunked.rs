//! A chunked response body (RFC 9112 section 7.1) read by taskgate itself from the upstream
//! connection, after the pool took it over from hyper at the end of the response head (see
//! [`super::gate`] for why and how). One frame per chunk, its data a slice of the read buffer
//! (no copy); the chunk-size line is read by `httparse::parse_chunk_size`. When the body ends
//! cleanly the connection goes back to the pool as a new hyper connection.
//!
//! Bounds and errors: a chunk-size line (with its extensions) over [`MAX_LINE`] bytes, trailers
//! over [`MAX_TRAILERS`] bytes, a chunk-size that is not hexadecimal or overflows, or missing
//! CRLF after a chunk's data end the body with an error, as does the connection ending before
//! the last chunk (a truncated answer is never a clean end). The buffer holds at most one read
//! (8 KiB) past such a line. Trailers are read and dropped (MCP has none).

use super::io::Io;
use bytes::{Buf, Bytes, BytesMut};
use http_body::Frame;
use std::io;
use std::task::{Context, Poll};

/// Longest chunk-size line taken, extensions and line end included, in bytes.
pub const MAX_LINE: usize = 4096;
/// Most trailer bytes taken after the last chunk.
pub const MAX_TRAILERS: usize = 16 * 1024;
/// Bytes read from the socket at a time.
const READ_SIZE: usize = 8 * 1024;

/// Where the decoding of a chunked body is ([`next`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Reading a chunk-size line.
    Size,
    /// This many bytes of the chunk's data are still to come.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines up to the empty line; the count of trailer bytes so far.
    Trailers(usize),
    /// The body ended cleanly.
    Done,
}

/// Where the connection goes when the body ended cleanly: the pool's check-in
/// (`pool::Return`), which also holds the connection's slot until the body ends or is dropped.
pub(super) trait Reuse {
    /// Takes the connection back, its body read to the end and nothing after it.
    fn reuse(self, io: Io);
}

/// The body (see the module docs). Dropped before its end, it closes the connection.
pub(super) struct Chunked<R> {
    /// The connection, until the body ended or failed.
    io: Option<Io>,
    /// Bytes read and not decoded yet.
    buf: BytesMut,
    /// Where the framing is.
    state: State,
    /// The pool's slot (the connection counts toward `max_connections` until the body ends
    /// or is dropped) and where the connection goes after a clean end.
    back: Option<R>,
    /// Whether the connection may be reused (not `Connection: close`, HTTP/1.1, not both
    /// `Transfer-Encoding` and `Content-Length`).
    reuse: bool,
}

/// The error of a [`Chunked`] body.
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

fn invalid(what: &str) -> Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("chunked body: {what}")).into()
}

impl<R: Reuse> Chunked<R> {
    /// `buf`: the bytes after the response head already read (hyper's, then the gate's).
    pub(super) fn new(io: Io, buf: BytesMut, back: Option<R>, reuse: bool) -> Chunked<R> {
        Chunked {
            io: Some(io),
            buf,
            state: State::Size,
            back,
            reuse,
        }
    }

    pub(super) fn is_end_stream(&self) -> bool {
        self.state == State::Done
    }

    /// Reads more bytes into the buffer; an error at the connection's end.
    ///
    /// Through `AsyncRead::poll_read`, not `TcpStream::try_read_buf`: tokio's `poll_read`
    /// takes a read shorter than the buffer as "drained" and waits for the next readiness
    /// event, where `try_read_buf` keeps the readiness and the next poll makes one more
    /// `read` that only finds `EAGAIN`: one extra system call per event of a stream whose
    /// events come apart (`TOOL=strace bash benches/profile.sh sse-apart`: 207 → 103
    /// `recvfrom` per 100-event stream; benches/RESULTS.md, 2026-12-03 morning).
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let Some(io) = self.io.as_mut() else {
            return Poll::Ready(Err(invalid("read after its end")));
        };
        if self.buf.capacity() - self.buf.len() < READ_SIZE / 8 {
            self.buf.reserve(READ_SIZE);
        }
        let read = tokio_util::io::poll_read_buf(std::pin::Pin::new(io), cx, &mut self.buf);
        if std::task::ready!(read)? == 0 {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the upstream closed the connection before the chunked body's last chunk",
            )
            .into()));
        }
        Poll::Ready(Ok(()))
    }

    /// The next data frame; `None` after the last chunk and the trailers.
    pub(super) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if self.state == State::Done {
            return Poll::Ready(None);
        }
        loop {
            match next(&mut self.state, &mut self.buf) {
                Ok(Step::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Step::End) => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Ok(Step::More) => {
                    if let Err(e) = std::task::ready!(self.fill(cx)) {
                        return self.fail(e);
                    }
                }
                Err(e) => return self.fail(e),
            }
        }
    }

    /// Ends the body with `e`; the connection is closed.
    fn fail(&mut self, e: Error) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.state = State::Done;
        self.io = None;
        self.back = None;
        Poll::Ready(Some(Err(e)))
    }

    /// After the last chunk: the connection goes back to the pool unless bytes follow the body
    /// (a pipelined or broken answer) or it is not to be reused.
    fn finish(&mut self) {
        let (Some(io), Some(back)) = (self.io.take(), self.back.take()) else {
            return;
        };
        if self.reuse && self.buf.is_empty() {
            back.reuse(io);
        }
    }
}

/// What [`next`] found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Data of a chunk (all of it or the part buffered), sliced off the buffer.
    Data(Bytes),
    /// More bytes are needed.
    More,
    /// The last chunk and the trailers were read (once; [`State::Done`] after).
    End,
}

/// Decodes from `buf` (consuming what it read) until it has data, needs more, or the body
/// ended: the framing rules and bounds of the module docs. After an error or the end, `state`
/// is done and nothing more is read.
pub(crate) fn next(state: &mut State, buf: &mut BytesMut) -> Result<Step, Error> {
    let r = next_inner(state, buf);
    if r.is_err() {
        *state = State::Done;
    }
    r
}

fn next_inner(state: &mut State, buf: &mut BytesMut) -> Result<Step, Error> {
    loop {
        match *state {
            // httparse takes a line without a digit (`\r\n`, `;x\r\n`) as size 0, the last
            // chunk; hyper refuses it, and so does taskgate (found by the cold review).
            State::Size if buf.first().is_some_and(|b| !b.is_ascii_hexdigit()) => {
                return Err(invalid("invalid chunk-size line: no size digit"));
            }
            State::Size => match httparse::parse_chunk_size(buf) {
                Ok(httparse::Status::Complete((used, _))) if used > MAX_LINE => {
                    return Err(invalid("chunk-size line over 4096 bytes"));
                }
                Ok(httparse::Status::Complete((used, size))) => {
                    buf.advance(used);
                    *state = match size {
                        0 => State::Trailers(0),
                        n => State::Data(n),
                    };
                }
                Ok(httparse::Status::Partial) if buf.len() >= MAX_LINE => {
                    return Err(invalid("chunk-size line over 4096 bytes"));
                }
                Ok(httparse::Status::Partial) => return Ok(Step::More),
                Err(_) => return Err(invalid("invalid chunk-size line")),
            },
            State::Data(rest) => {
                if buf.is_empty() {
                    return Ok(Step::More);
                }
                let n = usize::try_from(rest).unwrap_or(usize::MAX).min(buf.len());
                let data = buf.split_to(n).freeze();
                let rest = rest - n as u64;
                *state = if rest == 0 {
                    State::DataEnd
                } else {
                    State::Data(rest)
                };
                return Ok(Step::Data(data));
            }
            State::DataEnd => {
                if buf.first().is_some_and(|&b| b != b'\r')
                    || buf.get(1).is_some_and(|&b| b != b'\n')
                {
                    return Err(invalid("no CRLF after a chunk's data"));
                }
                if buf.len() < 2 {
                    return Ok(Step::More);
                }
                buf.advance(2);
                *state = State::Size;
            }
            State::Trailers(seen) => match memchr::memchr(b'\n', buf) {
                Some(lf) => {
                    if seen + lf + 1 > MAX_TRAILERS {
                        return Err(invalid("trailers over 16 KiB"));
                    }
                    let empty = lf == 0 || (lf == 1 && buf[0] == b'\r');
                    buf.advance(lf + 1);
                    if empty {
                        *state = State::Done;
                        return Ok(Step::End);
                    }
                    *state = State::Trailers(seen + lf + 1);
                }
                None if seen + buf.len() > MAX_TRAILERS => {
                    return Err(invalid("trailers over 16 KiB"));
                }
                None => return Ok(Step::More),
            },
            State::Done => return Err(invalid("read after its end")),
        }
    }
}

#[cfg(test)]
#[path = "chunked_tests.rs"]
mod tests;
