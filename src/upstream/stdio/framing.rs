//! Newline-delimited JSON-RPC framing on a child's stdout (MCP 2025-11-25 basic/transports:
//! stdio: "messages are delimited by newlines, and MUST NOT contain embedded newlines"), and
//! bounded lines of its stderr.
//!
//! The line splitting is `tokio_util::codec::LinesCodec` with a maximum length (past it the
//! codec reports the line and discards the rest of it, so a line never holds more than the bound
//! plus one read). The codec is driven here and not through `FramedRead`, because `FramedRead`
//! ends the stream after the first decode error: one oversized or non-UTF-8 line from a child
//! must end that message only, not every later one.

use bytes::BytesMut;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio_util::codec::{Decoder, LinesCodec, LinesCodecError};

/// How much is read from the pipe at once.
const READ_CHUNK: usize = 64 * 1024;

/// One line of a child's output.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// A line of UTF-8 text (without its `\n` or `\r\n`).
    Text(String),
    /// A line longer than the bound: its bytes were discarded up to its end. With the
    /// numeric `"id"` found in its first bytes, when there is one (see [`id_near_start`]).
    Oversize(Option<u64>),
    /// A line that is not UTF-8 (discarded).
    NotUtf8,
}

/// The lines of `reader`, each at most `max` bytes.
pub(super) struct Lines<R> {
    reader: R,
    buf: BytesMut,
    codec: LinesCodec,
    eof: bool,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    /// Lines of `reader`, each at most `max` bytes (longer ones are [`Line::Oversize`]).
    pub(super) fn new(reader: R, max: usize) -> Lines<R> {
        Lines {
            reader,
            buf: BytesMut::new(),
            codec: LinesCodec::new_with_max_length(max),
            eof: false,
        }
    }

    /// The next line; `None` at the end of the output (a last line without `\n` is a line).
    /// Errors: reading the pipe failed.
    pub(super) async fn next(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let decoded = if self.eof {
                self.codec.decode_eof(&mut self.buf)
            } else {
                self.codec.decode(&mut self.buf)
            };
            match decoded {
                Ok(Some(line)) => return Ok(Some(Line::Text(line))),
                Err(LinesCodecError::MaxLineLengthExceeded) => {
                    // The codec discards the line from its next call on: its start is still here.
                    let head = self.buf.get(..HEAD.min(self.buf.len())).unwrap_or_default();
                    return Ok(Some(Line::Oversize(id_near_start(head))));
                }
                Err(LinesCodecError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                    return Ok(Some(Line::NotUtf8))
                }
                Err(LinesCodecError::Io(e)) => return Err(e),
                Ok(None) if self.eof => return Ok(None),
                Ok(None) => {}
            }
            self.buf.reserve(READ_CHUNK);
            if self.reader.read_buf(&mut self.buf).await? == 0 {
                self.eof = true;
            }
        }
    }
}

/// A reader that counts the bytes read through it into a shared counter: how the writer's
/// liveness rule sees that a child still speaks on its stdout (`conn::write_lines`).
pub(super) struct Counting<R> {
    reader: R,
    count: Arc<AtomicU64>,
}

impl<R> Counting<R> {
    /// `reader`, each byte read through it added to `count`.
    pub(super) fn new(reader: R, count: Arc<AtomicU64>) -> Counting<R> {
        Counting { reader, count }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Counting<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.reader).poll_read(cx, buf);
        let read = buf.filled().len().saturating_sub(before);
        if read > 0 {
            self.count.fetch_add(read as u64, Ordering::AcqRel);
        }
        polled
    }
}

/// How much of an oversized line is searched for its id.
const HEAD: usize = 256;

/// The numeric id of a JSON-RPC message from its first bytes (`{"jsonrpc":"2.0","id":12,...`):
/// the digits after the first `"id":`. Hand-written because the line is never parsed whole (it
/// is over the bound); a request taskgate wrote has a numeric id, so an answer too large to
/// read still ends its request with an error, not a wait for its deadline. A `"id":` inside an
/// earlier string could mislead it: then at worst another request of the same child ends with
/// that error.
pub(super) fn id_near_start(head: &[u8]) -> Option<u64> {
    let at = memchr::memmem::find(head, b"\"id\"")?;
    let rest = head.get(at + 4..)?;
    let rest = rest.get(rest.iter().position(|b| !b.is_ascii_whitespace())?..)?;
    let rest = rest.strip_prefix(b":")?;
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let digits = rest.get(start..)?;
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    std::str::from_utf8(digits.get(..end)?).ok()?.parse().ok()
}

/// `text` as one line to write to a child: a JSON text's `\r` and `\n` can only be whitespace
/// between tokens (inside a string they must be escaped), so each becomes a space; then `\n`.
pub(super) fn one_line(text: &[u8]) -> bytes::Bytes {
    let mut out = Vec::with_capacity(text.len() + 1);
    out.extend_from_slice(text);
    if memchr::memchr2(b'\n', b'\r', text).is_some() {
        for b in out.iter_mut() {
            if *b == b'\n' || *b == b'\r' {
                *b = b' ';
            }
        }
    }
    out.push(b'\n');
    bytes::Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn all(input: &'static [u8], max: usize) -> Vec<Line> {
        let mut lines = Lines::new(input, max);
        let mut out = Vec::new();
        while let Some(l) = lines.next().await.expect("in-memory read") {
            out.push(l);
        }
        out
    }

    #[tokio::test]
    async fn an_oversized_line_ends_only_itself() {
        let got = all(
            b"{\"a\":1}\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n{\"b\":2}\r\nlast",
            16,
        )
        .await;
        assert_eq!(
            got,
            vec![
                Line::Text("{\"a\":1}".into()),
                Line::Oversize(None),
                Line::Text("{\"b\":2}".into()),
                Line::Text("last".into()),
            ]
        );
    }

    #[tokio::test]
    async fn a_line_that_is_not_utf8_ends_only_itself() {
        let got = all(b"\xff\xfe\n{}\n", 64).await;
        assert_eq!(got, vec![Line::NotUtf8, Line::Text("{}".into())]);
    }

    #[tokio::test]
    async fn an_oversized_answer_names_its_id() {
        let got = all(b"{\"jsonrpc\":\"2.0\", \"id\" : 42,\"result\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}\n", 32).await;
        assert_eq!(got, vec![Line::Oversize(Some(42))]);
        assert_eq!(id_near_start(b"{\"id\":\"s\""), None);
        assert_eq!(id_near_start(b"{\"id\":7"), Some(7));
    }

    #[test]
    fn newlines_between_tokens_become_spaces() {
        assert_eq!(&one_line(b"{\n \"a\":\r\n1}")[..], b"{  \"a\":  1}\n");
        assert_eq!(&one_line(b"{}")[..], b"{}\n");
    }
}
