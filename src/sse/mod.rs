//! Server-Sent Events codec, used by both sides: the upstream client decodes the upstream's
//! `text/event-stream` into [`Event`]s as bytes arrive, the edge encodes them again for the
//! client with [`encode`], adding keep-alive comments on idle streams ([`KeepAlive`]).
//!
//! The decoder follows the WHATWG "event stream interpretation" rules: lines end in CRLF, LF or
//! CR; a line without a colon is a field name with an empty value; unknown fields are ignored;
//! comments (`:` lines) are dropped (taskgate sends its own keep-alives). The `sse-stream` crate
//! was tried first (0.2.x) and rejected: 0.2.5 fails on colonless lines (`src/stream.rs` returns
//! `Error::InvalidLine`) and drops the events around them. 0.3.0 accepts such lines but ends the
//! stream on invalid UTF-8, which this decoder replaces lossily (U+FFFD) instead.
//! A line or an event larger than the decoder's limit (`max_message_bytes` of the upstream) ends
//! the stream with [`Oversize`]: one newline-free body cannot take all memory.
//! The fields `id`, `event`, `retry` and `data` (including an empty `data`, which the spec's
//! "priming" event uses, 2025-11-25 basic/transports: Resumability) are preserved exactly.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::Stream;
use std::pin::Pin;

mod keepalive;
pub use keepalive::{KeepAlive, StreamAborted};

/// One SSE event. `None` means the field was absent; `data` lines are joined with `\n`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Event {
    /// `event:` (the event type).
    pub event: Option<String>,
    /// `data:` lines, joined with `\n`.
    pub data: Option<String>,
    /// `id:` (the event id, for `Last-Event-ID`).
    pub id: Option<String>,
    /// `retry:` in ms.
    pub retry: Option<u64>,
}

/// A stream of SSE events. The stream ends when the underlying body ends or fails.
pub type EventStream = Pin<Box<dyn Stream<Item = Event> + Send>>;

/// A decoded upstream stream: events, then possibly one [`Cut`] after which it ends.
pub type DecodedStream = Pin<Box<dyn Stream<Item = Result<Event, Cut>> + Send>>;

/// Why a decoded upstream stream ended before its body's clean end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cut {
    /// A line or an event exceeded the limit.
    Oversize(Oversize),
    /// The body failed (connection reset, truncated chunked encoding): the text of the error.
    Reset(String),
}

/// The type of the marker event [`Event::abort`]: a decoded event type never holds a newline.
const ABORT_TYPE: &str = "\n";

impl Event {
    /// A `message` event carrying one JSON-RPC message (`data`): what taskgate sends on the SSE
    /// streams it makes itself (an upgraded call's, a bridged `tasks/result`'s).
    pub fn message(data: String) -> Event {
        Event {
            event: Some("message".into()),
            data: Some(data),
            id: None,
            retry: None,
        }
    }

    /// A marker that travels up the stack like an event and makes the edge abort the client's
    /// stream (a transport error instead of a clean end): the upstream's stream was cut. It
    /// cannot come from the wire: decoded field values never contain a newline.
    pub fn abort() -> Event {
        Event {
            event: Some(ABORT_TYPE.to_string()),
            ..Default::default()
        }
    }

    /// Whether this is the [`Event::abort`] marker.
    pub fn is_abort(&self) -> bool {
        self.event.as_deref() == Some(ABORT_TYPE) && self.data.is_none()
    }
}

/// Default limit of one line or event, in bytes (16 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// A line or an event exceeded the decoder's limit; the stream ends here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oversize {
    /// The limit in bytes.
    pub limit: usize,
}

impl std::fmt::Display for Oversize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "an SSE line or event exceeded max_message_bytes={}",
            self.limit
        )
    }
}

/// The keep-alive comment sent on idle streams.
pub const KEEPALIVE_COMMENT: &[u8] = b": keep-alive\n\n";

/// Incremental `text/event-stream` decoder: feed bytes, take complete events.
pub struct Decoder {
    buf: BytesMut,
    current: Event,
    has_field: bool,
    /// The previous chunk ended in CR: a leading LF of the next one belongs to it.
    skip_lf: bool,
    bom_checked: bool,
    /// Largest line, and largest event (the sum of its field lines), in bytes.
    max: usize,
    /// Bytes of the field lines of the event being assembled.
    event_bytes: usize,
    /// The limit was exceeded: every later `feed` fails at once.
    failed: bool,
}

impl Default for Decoder {
    fn default() -> Decoder {
        Decoder::new(DEFAULT_MAX_MESSAGE_BYTES)
    }
}

impl Decoder {
    /// A decoder whose lines and events may hold at most `max` bytes each.
    pub fn new(max: usize) -> Decoder {
        Decoder {
            buf: BytesMut::new(),
            current: Event::default(),
            has_field: false,
            skip_lf: false,
            bom_checked: false,
            max,
            event_bytes: 0,
            failed: false,
        }
    }

    /// Adds bytes and appends every event they complete to `out`. Fails (now and on every later
    /// call) when a line or an event exceeds the limit; events completed before it are in `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<Event>) -> Result<(), Oversize> {
        if self.failed {
            return Err(Oversize { limit: self.max });
        }
        self.buf.extend_from_slice(chunk);
        if !self.bom_checked {
            // Only a BOM at the very start of the stream is removed. Until the first three
            // bytes are known nothing is consumed, so `buf` still starts where the stream did.
            const BOM: &[u8] = b"\xEF\xBB\xBF";
            if self.buf.len() < BOM.len() && BOM.starts_with(&self.buf) {
                return Ok(());
            }
            if self.buf.starts_with(BOM) {
                self.buf.advance(BOM.len());
            }
            self.bom_checked = true;
        }
        // Lines are read in place and the buffer is advanced once: no handle per line.
        let buf = std::mem::take(&mut self.buf);
        let mut pos = 0;
        loop {
            if self.skip_lf && pos < buf.len() {
                if buf[pos] == b'\n' {
                    pos += 1;
                }
                self.skip_lf = false;
            }
            let Some(end) = memchr::memchr2(b'\n', b'\r', &buf[pos..]) else {
                break;
            };
            let line_end = pos + end;
            if buf[line_end] == b'\r' {
                self.skip_lf = true;
            }
            let line = &buf[pos..line_end];
            if line.len() > self.max || !self.line(line, out) {
                return self.fail();
            }
            pos = line_end + 1;
        }
        self.buf = buf;
        self.buf.advance(pos);
        // What is left is one incomplete line.
        if self.buf.len() > self.max {
            return self.fail();
        }
        Ok(())
    }

    fn fail(&mut self) -> Result<(), Oversize> {
        self.failed = true;
        self.buf = BytesMut::new();
        self.current = Event::default();
        Err(Oversize { limit: self.max })
    }

    /// Applies one line; false when the event it belongs to grew past the limit.
    fn line(&mut self, line: &[u8], out: &mut Vec<Event>) -> bool {
        if line.is_empty() {
            if self.has_field {
                out.push(std::mem::take(&mut self.current));
                self.has_field = false;
            }
            self.event_bytes = 0;
            return true;
        }
        if line[0] == b':' {
            return true;
        }
        self.event_bytes += line.len() + 1;
        if self.event_bytes > self.max {
            return false;
        }
        let (name, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = match std::str::from_utf8(value) {
            Ok(v) => std::borrow::Cow::Borrowed(v),
            Err(_) => String::from_utf8_lossy(value),
        };
        match name {
            b"data" => {
                match &mut self.current.data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(&value);
                    }
                    None => self.current.data = Some(value.into_owned()),
                }
                self.has_field = true;
            }
            b"event" => {
                self.current.event = Some(value.into_owned());
                self.has_field = true;
            }
            b"id" => {
                if !value.contains('\0') {
                    self.current.id = Some(value.into_owned());
                    self.has_field = true;
                }
            }
            b"retry" => {
                if let Ok(ms) = value.parse::<u64>() {
                    self.current.retry = Some(ms);
                    self.has_field = true;
                }
            }
            _ => {}
        }
        true
    }
}

/// Decodes an HTTP body carrying `text/event-stream` into a [`DecodedStream`], event by event as
/// bytes arrive. `label` names the source in the logs (the upstream's name). A line or event
/// larger than `max` bytes ends the stream with `Err(Oversize)` (the body is dropped); a body
/// error ends it (logged).
pub fn decode<B>(body: B, label: std::sync::Arc<str>, max: usize) -> DecodedStream
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    struct State<B> {
        body: Option<B>,
        decoder: Decoder,
        ready: std::collections::VecDeque<Event>,
        label: std::sync::Arc<str>,
        done: bool,
        /// Reported after the events decoded before it.
        cut: Option<Cut>,
    }
    let state = State {
        body: Some(body),
        decoder: Decoder::new(max),
        ready: Default::default(),
        label,
        done: false,
        cut: None,
    };
    Box::pin(futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.ready.pop_front() {
                return Some((Ok(ev), st));
            }
            if let Some(e) = st.cut.take() {
                return Some((Err(e), st));
            }
            if st.done {
                return None;
            }
            let body = st.body.as_mut()?;
            let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await;
            match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let mut out = Vec::new();
                        let fed = st.decoder.feed(&data, &mut out);
                        st.ready.extend(out);
                        if let Err(e) = fed {
                            tracing::warn!(upstream = %st.label, limit = e.limit, "upstream SSE line or event exceeded max_message_bytes; stream ended");
                            // Dropping the body closes the connection: nothing more is read.
                            st.body = None;
                            st.cut = Some(Cut::Oversize(e));
                            st.done = true;
                        }
                    }
                }
                Some(Err(e)) => {
                    // Counted and logged by the upstream client, which knows the request.
                    st.body = None;
                    st.cut = Some(Cut::Reset(e.to_string()));
                    st.done = true;
                }
                None => st.done = true,
            }
        }
    }))
}

/// Encodes one event in SSE wire format. Multi-line `data` becomes several `data:` lines.
pub fn encode(event: &Event) -> Bytes {
    let data_len = event.data.as_ref().map_or(0, |d| d.len() + 16);
    let mut buf = BytesMut::with_capacity(32 + data_len);
    encode_into(event, &mut buf);
    buf.freeze()
}

/// [`encode`] appending to `buf` (a batch of events written as one chunk: no buffer and no
/// copy of its own per event).
pub fn encode_into(event: &Event, buf: &mut BytesMut) {
    let buf = &mut *buf;
    if let Some(name) = &event.event {
        put_field(buf, b"event", name);
    }
    if let Some(id) = &event.id {
        put_field(buf, b"id", id);
    }
    if let Some(retry) = event.retry {
        put_field(buf, b"retry", &retry.to_string());
    }
    if let Some(data) = &event.data {
        for line in data.split('\n') {
            put_field(buf, b"data", line);
        }
    }
    buf.put_u8(b'\n');
}

fn put_field(buf: &mut BytesMut, name: &[u8], value: &str) {
    buf.put_slice(name);
    buf.put_slice(b": ");
    buf.put_slice(value.as_bytes());
    buf.put_u8(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use http_body_util::Full;
    use std::time::Duration;

    #[tokio::test]
    async fn round_trip_keeps_fields() {
        let wire = "id: 7\ndata: \n\nevent: message\nid: s1-8\nretry: 2500\ndata: {\"jsonrpc\":\"2.0\"}\n\n: comment\n\ndata: a\r\ndata: b\rx-unknown: 1\n\n";
        let events: Vec<Event> = decode(Full::new(Bytes::from(wire)), "t".into(), 1024)
            .map(|e| e.unwrap())
            .collect()
            .await;
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].id.as_deref(), Some("7"));
        assert_eq!(events[0].data.as_deref(), Some(""));
        assert_eq!(events[1].event.as_deref(), Some("message"));
        assert_eq!(events[1].retry, Some(2500));
        assert_eq!(events[2].data.as_deref(), Some("a\nb"));
        let again: String = events
            .iter()
            .map(|e| String::from_utf8(encode(e).to_vec()).unwrap())
            .collect();
        let reparsed: Vec<Event> = decode(Full::new(Bytes::from(again)), "t".into(), 1024)
            .map(|e| e.unwrap())
            .collect()
            .await;
        assert_eq!(events, reparsed);
    }

    #[test]
    fn decoder_handles_split_chunks_and_colonless_lines() {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        for chunk in ["id: 1\r", "\ndata", "\n\nda", "ta: x\n", "\n"] {
            d.feed(chunk.as_bytes(), &mut out).unwrap();
        }
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].id.as_deref(), Some("1"));
        assert_eq!(out[0].data.as_deref(), Some(""));
        assert_eq!(out[1].data.as_deref(), Some("x"));
        assert_eq!(out[1].id, None);
    }

    /// Every split of the input into two chunks, and the input fed byte by byte, decode to the
    /// same events as the whole input at once (CR/LF pairs, BOM, colonless lines, multi-byte
    /// UTF-8 and invalid UTF-8 across the split).
    #[test]
    fn decoder_same_events_at_every_chunk_split() {
        let wire: &[u8] = b"\xEF\xBB\xBFid: 1\r\ndata\r\n\r\n: c\rdata: a\xC3\xA9\rdata: b\xFF\n\nevent: e\nretry: 5\r\r\
            data:x\ndata: {\"k\":\"\xE2\x82\xAC\"}\r\nid\n\ndata: tail";
        let decode_all = |chunks: &[&[u8]]| {
            let mut d = Decoder::new(1024);
            let mut out = Vec::new();
            for c in chunks {
                d.feed(c, &mut out).unwrap();
            }
            out
        };
        let whole = decode_all(&[wire]);
        assert_eq!(whole.len(), 4, "{whole:?}");
        assert_eq!(whole[0].id.as_deref(), Some("1"));
        assert_eq!(whole[0].data.as_deref(), Some(""));
        assert_eq!(whole[1].data.as_deref(), Some("a\u{e9}\nb\u{FFFD}"));
        assert_eq!(whole[2].retry, Some(5));
        assert_eq!(whole[3].data.as_deref(), Some("x\n{\"k\":\"\u{20AC}\"}"));
        assert_eq!(whole[3].id.as_deref(), Some(""));
        for at in 0..=wire.len() {
            let (a, b) = wire.split_at(at);
            assert_eq!(decode_all(&[a, b]), whole, "split at {at}");
        }
        let bytes: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(decode_all(&bytes), whole, "byte by byte");
    }

    /// A line without an end (no newline ever) and an event of many small lines without a blank
    /// line both fail once they pass the limit, and stay failed; the buffers are released.
    #[test]
    fn decoder_caps_line_and_event_size() {
        let mut d = Decoder::new(1024);
        let mut out = Vec::new();
        d.feed(b"data: ok\n\n", &mut out).unwrap();
        let mut failed = false;
        for _ in 0..100 {
            if d.feed(&[b'x'; 100], &mut out).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "a newline-free line must hit the cap");
        assert!(d.buf.capacity() <= 1024 + 100);
        assert_eq!(out.len(), 1);
        assert_eq!(d.feed(b"\n\n", &mut out), Err(Oversize { limit: 1024 }));

        let mut d = Decoder::new(1024);
        let mut out = Vec::new();
        let mut failed = false;
        for _ in 0..1000 {
            if d.feed(b"data: 0123456789\n", &mut out).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "an event without end must hit the cap");
        assert!(d.current.data.is_none());
        assert!(out.is_empty());

        // Exactly at the limit is fine: a 1023-byte line, 1024 bytes with its newline.
        let mut d = Decoder::new(1024);
        let mut out = Vec::new();
        let mut line = b"data:".to_vec();
        line.resize(1023, b'y');
        line.extend_from_slice(b"\n\n");
        d.feed(&line, &mut out).unwrap();
        assert_eq!(out.len(), 1);
    }

    /// `decode` yields the events before the oversize line, then `Err(Oversize)`, then ends.
    #[tokio::test]
    async fn decode_reports_oversize_after_earlier_events() {
        let mut wire = b"data: first\n\ndata: ".to_vec();
        wire.resize(5000, b'z');
        let items: Vec<Result<Event, Cut>> = decode(Full::new(Bytes::from(wire)), "t".into(), 1024)
            .collect()
            .await;
        assert_eq!(items.len(), 2, "{items:?}");
        assert_eq!(items[0].as_ref().unwrap().data.as_deref(), Some("first"));
        assert_eq!(items[1], Err(Cut::Oversize(Oversize { limit: 1024 })));
    }

    #[tokio::test(start_paused = true)]
    async fn keepalive_on_idle() {
        let events: EventStream = Box::pin(futures_util::stream::pending());
        let mut ka = KeepAlive::new(events, Duration::from_millis(50));
        let first = ka.next().await.unwrap().unwrap();
        assert_eq!(&first[..], KEEPALIVE_COMMENT);
    }
}
