//! The client side of an SSE answer: [`KeepAlive`] encodes an [`EventStream`], batches events
//! that are ready together, inserts keep-alive comments on idle streams, and ends with
//! [`StreamAborted`] when the upstream's stream was cut.

use super::{encode_into, EventStream, TransportFailure, KEEPALIVE_COMMENT};
use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Encodes an [`EventStream`] as SSE bytes and inserts [`KEEPALIVE_COMMENT`] whenever the stream
/// has been idle for `interval`. Events that are ready together are written as one chunk (one
/// write to the client instead of one per event). Ends when the events end.
pub struct KeepAlive {
    events: EventStream,
    interval: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    last_sent: tokio::time::Instant,
    done: bool,
    /// Set by [`Event::abort`](super::Event::abort): the error this stream ends with.
    aborted: Option<StreamAborted>,
    /// Whether the stream has answered `Pending` once since the abort arrived (see
    /// [`KeepAlive::end`]).
    yielded: bool,
    /// The failure the first [`Event::transport_error`](super::Event::transport_error) relayed reported, or the cut
    /// ([`Event::abort`](super::Event::abort)) the stream ended with.
    failure: Option<TransportFailure>,
}

/// Largest chunk assembled from events that are ready at once, in bytes.
const BATCH_BYTES: usize = 256 * 1024;

/// First capacity of a batch, in bytes (it grows by doubling up to about [`BATCH_BYTES`]).
const BATCH_START: usize = 8 * 1024;

impl KeepAlive {
    /// Wraps `events`; `interval` is the idle time before a keep-alive comment.
    pub fn new(events: EventStream, interval: Duration) -> KeepAlive {
        KeepAlive {
            events,
            interval,
            sleep: Box::pin(tokio::time::sleep(interval)),
            last_sent: tokio::time::Instant::now(),
            done: false,
            aborted: None,
            yielded: false,
            failure: None,
        }
    }

    /// The failure reported by the first [`Event::transport_error`](super::Event::transport_error) this stream relayed (an
    /// oversized upstream event, a deadline), else [`TransportFailure::Cut`] when the stream
    /// ended with [`Event::abort`](super::Event::abort): the request's outcome, for the edge's count.
    pub fn transport_failure(&self) -> Option<TransportFailure> {
        self.failure
    }

    /// The end of the stream once `done`: `None` for a clean end; for a cut upstream, one
    /// `Pending` (with a wake-up) before [`StreamAborted`]. Why: hyper's server polls the body
    /// again as soon as a chunk is buffered, and a body error aborts the connection before
    /// what it buffered is written, so without the `Pending` (during which hyper flushes) the
    /// client lost the response head and the events that arrived whole in the same upstream
    /// read as the break (curl: "Empty reply from server").
    fn end(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, StreamAborted>>> {
        if self.aborted.is_some() && !self.yielded {
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(self.aborted.take().map(Err))
    }
}

/// The upstream's stream was cut ([`Event::abort`](super::Event::abort)): the client's stream must end with a
/// transport error, not a clean end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the upstream's event stream was cut")]
pub struct StreamAborted;

impl Stream for KeepAlive {
    type Item = Result<Bytes, StreamAborted>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return this.end(cx);
        }
        // Every event that is ready now goes into one chunk, which goes out at once: an event
        // that arrived never waits for a later one. (Events used to be held back for one turn
        // of the scheduler to catch more; since the upstream connection is driven by this task
        // (`upstream::h1::pool`), a pending upstream means its socket had nothing more, and the
        // turn cost a whole poll of the client's connection and delayed what had arrived.)
        let mut batch: Option<BytesMut> = None;
        loop {
            match this.events.as_mut().poll_next(cx) {
                Poll::Ready(Some(event)) if event.is_abort() => {
                    this.aborted = Some(StreamAborted);
                    this.failure.get_or_insert(TransportFailure::Cut);
                    this.done = true;
                    break;
                }
                Poll::Ready(Some(event)) => {
                    // Room for the usual batch of small events at once: grown from 512 bytes,
                    // a 100-event batch was reallocated (and copied) 5 times (measured
                    // ~20,000 instructions per stream, `benches/profile.sh sse`).
                    let b = batch.get_or_insert_with(|| {
                        let data = event.data.as_ref().map_or(0, |d| d.len());
                        BytesMut::with_capacity((data + 64).max(BATCH_START))
                    });
                    if this.failure.is_none() {
                        this.failure = event.transport_failure();
                    }
                    encode_into(&event, b);
                    if b.len() >= BATCH_BYTES {
                        break;
                    }
                }
                Poll::Ready(None) => {
                    this.done = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        if let Some(b) = batch {
            // The idle timer is not reset per event: it re-arms from `last_sent` when it fires.
            this.last_sent = tokio::time::Instant::now();
            return Poll::Ready(Some(Ok(b.freeze())));
        }
        if this.done {
            return this.end(cx);
        }
        loop {
            match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let due = this.last_sent + this.interval;
                    if tokio::time::Instant::now() >= due {
                        this.last_sent = tokio::time::Instant::now();
                        this.sleep.as_mut().reset(this.last_sent + this.interval);
                        return Poll::Ready(Some(Ok(Bytes::from_static(KEEPALIVE_COMMENT))));
                    }
                    this.sleep.as_mut().reset(due);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
