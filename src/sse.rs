//! Server-Sent Events codec, used by both sides: the upstream client decodes the upstream's
//! `text/event-stream` into [`Event`]s as bytes arrive, the edge encodes them again for the
//! client with [`encode`], adding keep-alive comments on idle streams ([`KeepAlive`]).
//!
//! The decoder follows the WHATWG "event stream interpretation" rules: lines end in CRLF, LF or
//! CR; a line without a colon is a field name with an empty value; unknown fields are ignored;
//! comments (`:` lines) are dropped (taskgate sends its own keep-alives). The `sse-stream` crate
//! was tried first and rejected: it fails on such lines and drops the events around them.
//! The fields `id`, `event`, `retry` and `data` (including an empty `data`, which the spec's
//! "priming" event uses, 2025-11-25 basic/transports: Resumability) are preserved exactly.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::Stream;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

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

/// The keep-alive comment sent on idle streams.
pub const KEEPALIVE_COMMENT: &[u8] = b": keep-alive\n\n";

/// Incremental `text/event-stream` decoder: feed bytes, take complete events.
#[derive(Default)]
pub struct Decoder {
    buf: BytesMut,
    current: Event,
    has_field: bool,
    /// The previous chunk ended in CR: a leading LF of the next one belongs to it.
    skip_lf: bool,
    bom_checked: bool,
}

impl Decoder {
    /// Adds bytes and appends every event they complete to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<Event>) {
        self.buf.extend_from_slice(chunk);
        if !self.bom_checked && self.buf.len() >= 3 {
            if self.buf.starts_with(b"\xEF\xBB\xBF") {
                self.buf.advance(3);
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
            self.line(&buf[pos..line_end], out);
            pos = line_end + 1;
        }
        self.buf = buf;
        self.buf.advance(pos);
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<Event>) {
        if line.is_empty() {
            if self.has_field {
                out.push(std::mem::take(&mut self.current));
                self.has_field = false;
            }
            return;
        }
        if line[0] == b':' {
            return;
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
    }
}

/// Decodes an HTTP body carrying `text/event-stream` into an [`EventStream`], event by event as
/// bytes arrive. `label` names the source in the logs (the upstream's name).
pub fn decode<B>(body: B, label: std::sync::Arc<str>) -> EventStream
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    struct State<B> {
        body: B,
        decoder: Decoder,
        ready: std::collections::VecDeque<Event>,
        label: std::sync::Arc<str>,
        done: bool,
    }
    let state = State {
        body,
        decoder: Decoder::default(),
        ready: Default::default(),
        label,
        done: false,
    };
    Box::pin(futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.ready.pop_front() {
                return Some((ev, st));
            }
            if st.done {
                return None;
            }
            let frame = std::future::poll_fn(|cx| Pin::new(&mut st.body).poll_frame(cx)).await;
            match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let mut out = Vec::new();
                        st.decoder.feed(&data, &mut out);
                        st.ready.extend(out);
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(upstream = %st.label, error = %e, "upstream SSE stream ended with an error");
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
    if let Some(name) = &event.event {
        put_field(&mut buf, b"event", name);
    }
    if let Some(id) = &event.id {
        put_field(&mut buf, b"id", id);
    }
    if let Some(retry) = event.retry {
        put_field(&mut buf, b"retry", &retry.to_string());
    }
    if let Some(data) = &event.data {
        for line in data.split('\n') {
            put_field(&mut buf, b"data", line);
        }
    }
    buf.put_u8(b'\n');
    buf.freeze()
}

fn put_field(buf: &mut BytesMut, name: &[u8], value: &str) {
    buf.put_slice(name);
    buf.put_slice(b": ");
    buf.put_slice(value.as_bytes());
    buf.put_u8(b'\n');
}

/// Encodes an [`EventStream`] as SSE bytes and inserts [`KEEPALIVE_COMMENT`] whenever the stream
/// has been idle for `interval`. Events that are ready together are written as one chunk (one
/// write to the client instead of one per event). Ends when the events end.
pub struct KeepAlive {
    events: EventStream,
    interval: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    last_sent: tokio::time::Instant,
    done: bool,
    /// Events held back for one turn of the scheduler (see `poll_next`).
    held: Option<BytesMut>,
    /// Whether any event was written yet.
    sent_any: bool,
}

/// Largest chunk assembled from events that are ready at once, in bytes.
const BATCH_BYTES: usize = 256 * 1024;

impl KeepAlive {
    /// Wraps `events`; `interval` is the idle time before a keep-alive comment.
    pub fn new(events: EventStream, interval: Duration) -> KeepAlive {
        KeepAlive {
            events,
            interval,
            sleep: Box::pin(tokio::time::sleep(interval)),
            last_sent: tokio::time::Instant::now(),
            done: false,
            held: None,
            sent_any: false,
        }
    }
}

impl Stream for KeepAlive {
    type Item = Bytes;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        // Events held back on the previous call go out now, with whatever arrived since.
        let deferred = this.held.is_some();
        let mut batch: Option<BytesMut> = this.held.take();
        let mut upstream_pending = false;
        loop {
            match this.events.as_mut().poll_next(cx) {
                Poll::Ready(Some(event)) => {
                    let encoded = encode(&event);
                    match &mut batch {
                        None => {
                            let mut b = BytesMut::with_capacity(encoded.len().max(512));
                            b.extend_from_slice(&encoded);
                            batch = Some(b);
                        }
                        Some(b) => b.extend_from_slice(&encoded),
                    }
                    if batch.as_ref().is_some_and(|b| b.len() >= BATCH_BYTES) {
                        break;
                    }
                }
                Poll::Ready(None) => {
                    this.done = true;
                    break;
                }
                Poll::Pending => {
                    upstream_pending = true;
                    break;
                }
            }
        }
        // The first event of a stream goes out at once (time to first event matters most).
        if upstream_pending && !deferred && batch.is_some() && this.sent_any {
            // The upstream connection's task hands its body over one chunk at a time: yield
            // once so the chunks it already has arrive, and write them all in one go instead of
            // one write per event.
            this.held = batch;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if let Some(b) = batch {
            this.sent_any = true;
            // The idle timer is not reset per event: it re-arms from `last_sent` when it fires.
            this.last_sent = tokio::time::Instant::now();
            return Poll::Ready(Some(b.freeze()));
        }
        if this.done {
            return Poll::Ready(None);
        }
        loop {
            match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let due = this.last_sent + this.interval;
                    if tokio::time::Instant::now() >= due {
                        this.last_sent = tokio::time::Instant::now();
                        this.sleep.as_mut().reset(this.last_sent + this.interval);
                        return Poll::Ready(Some(Bytes::from_static(KEEPALIVE_COMMENT)));
                    }
                    this.sleep.as_mut().reset(due);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use http_body_util::Full;

    #[tokio::test]
    async fn round_trip_keeps_fields() {
        let wire = "id: 7\ndata: \n\nevent: message\nid: s1-8\nretry: 2500\ndata: {\"jsonrpc\":\"2.0\"}\n\n: comment\n\ndata: a\r\ndata: b\rx-unknown: 1\n\n";
        let events: Vec<Event> = decode(Full::new(Bytes::from(wire)), "t".into())
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
        let reparsed: Vec<Event> = decode(Full::new(Bytes::from(again)), "t".into())
            .collect()
            .await;
        assert_eq!(events, reparsed);
    }

    #[test]
    fn decoder_handles_split_chunks_and_colonless_lines() {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        for chunk in ["id: 1\r", "\ndata", "\n\nda", "ta: x\n", "\n"] {
            d.feed(chunk.as_bytes(), &mut out);
        }
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].id.as_deref(), Some("1"));
        assert_eq!(out[0].data.as_deref(), Some(""));
        assert_eq!(out[1].data.as_deref(), Some("x"));
        assert_eq!(out[1].id, None);
    }

    #[tokio::test(start_paused = true)]
    async fn keepalive_on_idle() {
        let events: EventStream = Box::pin(futures_util::stream::pending());
        let mut ka = KeepAlive::new(events, Duration::from_millis(50));
        let first = ka.next().await.unwrap();
        assert_eq!(&first[..], KEEPALIVE_COMMENT);
    }
}
