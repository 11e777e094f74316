//! Server-Sent Events codec, used by both sides: the upstream client decodes the upstream's
//! `text/event-stream` into [`Event`]s (with the `sse-stream` crate), the edge encodes them again
//! for the client with [`encode`], adding keep-alive comments on idle streams ([`KeepAlive`]).
//!
//! The fields `id`, `event`, `retry` and `data` (including an empty `data`, which the spec's
//! "priming" event uses, 2025-11-25 basic/transports: Resumability) are preserved exactly.
//! Comments from the upstream are not forwarded; taskgate sends its own keep-alives.

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::Stream;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// One SSE event: `event`, `data` (lines joined with `\n`), `id`, `retry` (ms).
pub type Event = sse_stream::Sse;

/// A stream of SSE events. Decoding errors are logged and skipped inside; the stream ends when
/// the underlying connection ends.
pub type EventStream = Pin<Box<dyn Stream<Item = Event> + Send>>;

/// The keep-alive comment sent on idle streams.
pub const KEEPALIVE_COMMENT: &[u8] = b": keep-alive\n\n";

/// Decodes an HTTP body carrying `text/event-stream` into an [`EventStream`].
///
/// `label` names the source in the logs (the upstream's name).
pub fn decode<B>(body: B, label: std::sync::Arc<str>) -> EventStream
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    use futures_util::StreamExt;
    let stream = sse_stream::SseStream::new(body);
    Box::pin(stream.filter_map(move |item| {
        let out = match item {
            Ok(event) => Some(event),
            Err(sse_stream::Error::Body(e)) => {
                tracing::debug!(upstream = %label, error = %e, "upstream SSE stream ended with an error");
                None
            }
            Err(e) => {
                tracing::warn!(upstream = %label, error = %e, "skipping a malformed SSE line from upstream");
                None
            }
        };
        std::future::ready(out)
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
/// has been idle for `interval`. Ends when the events end.
pub struct KeepAlive {
    events: EventStream,
    interval: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl KeepAlive {
    /// Wraps `events`; `interval` is the idle time before a keep-alive comment.
    pub fn new(events: EventStream, interval: Duration) -> KeepAlive {
        KeepAlive {
            events,
            interval,
            sleep: Box::pin(tokio::time::sleep(interval)),
        }
    }
}

impl Stream for KeepAlive {
    type Item = Bytes;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let this = self.get_mut();
        match this.events.as_mut().poll_next(cx) {
            Poll::Ready(Some(event)) => {
                let deadline = tokio::time::Instant::now() + this.interval;
                this.sleep.as_mut().reset(deadline);
                Poll::Ready(Some(encode(&event)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let deadline = tokio::time::Instant::now() + this.interval;
                    this.sleep.as_mut().reset(deadline);
                    Poll::Ready(Some(Bytes::from_static(KEEPALIVE_COMMENT)))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

use std::future::Future;

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use http_body_util::Full;

    #[tokio::test]
    async fn round_trip_keeps_fields() {
        let wire = "id: 7\ndata: \n\nevent: message\nid: s1-8\nretry: 2500\ndata: {\"jsonrpc\":\"2.0\"}\n\n: comment\n\ndata: a\ndata: b\n\n";
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

    #[tokio::test(start_paused = true)]
    async fn keepalive_on_idle() {
        let events: EventStream = Box::pin(futures_util::stream::pending());
        let mut ka = KeepAlive::new(events, Duration::from_millis(50));
        let first = ka.next().await.unwrap();
        assert_eq!(&first[..], KEEPALIVE_COMMENT);
    }
}
