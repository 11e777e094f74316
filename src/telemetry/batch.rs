//! The bounded queue between the serving threads and the export thread, and that thread.
//!
//! A serving thread ending a span moves its [`Record`] (one span, or a request's SERVER span
//! and its first exchange's CLIENT span, queued once both ended) into the queue under a short
//! lock: no allocation (the queue's buffer is allocated once, [`MAX_QUEUE_SPANS`] records
//! long), no wake-up but one per [`BATCH_SPANS`] spans; a record that would take the queue past
//! [`MAX_QUEUE_SPANS`] spans is dropped, never waited for. The export thread wakes at that
//! signal or every [`SCHEDULED_DELAY`], swaps the buffer for its spare, encodes the records at
//! most [`BATCH_SPANS`] spans at a time (`otlp`) and posts each body (`export`) on a
//! current-thread tokio runtime of its own, one export at a time. (The SDK's
//! `BatchSpanProcessor` does the same with `SpanData`, which must then be built on the serving
//! threads: see `span.rs` for what that cost.)

use super::export::Exporter;
use super::otlp::Encoder;
use super::span::Record;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Spans waiting for export at most; past it new spans are dropped (the SDK's default).
pub(super) const MAX_QUEUE_SPANS: usize = 2048;
/// Spans per export, and the queue length that wakes the export thread (the SDK's default).
pub(super) const BATCH_SPANS: usize = 512;
/// The export thread's wake-up when fewer than [`BATCH_SPANS`] wait (the SDK's default).
pub(super) const SCHEDULED_DELAY: Duration = Duration::from_secs(5);

/// The queue the serving threads push to.
pub(super) struct Queue {
    state: Mutex<State>,
    /// Wakes the export thread (a batch is ready, or shutdown).
    wake: Condvar,
    /// Wakes [`Queue::shutdown`] when the export thread has stopped.
    stopped: Condvar,
    /// Spans dropped because the queue was full or export had stopped
    /// (`taskgate_trace_spans_dropped_total`; logged by the export thread).
    dropped: prometheus::IntCounter,
}

struct State {
    /// The records queued (a record holds one span or two, `Record::exchange`).
    records: Vec<Record>,
    /// The spans they hold.
    spans: usize,
    /// Shutdown asked: export what is queued, then stop.
    stop: bool,
    /// Set by the export thread when it has stopped.
    stopped: bool,
}

impl Queue {
    /// An empty queue; the spans it drops are counted in `dropped`.
    pub(super) fn new(dropped: prometheus::IntCounter) -> Queue {
        Queue {
            state: Mutex::new(State {
                records: Vec::with_capacity(MAX_QUEUE_SPANS),
                spans: 0,
                stop: false,
                stopped: false,
            }),
            wake: Condvar::new(),
            stopped: Condvar::new(),
            dropped,
        }
    }

    /// Queues the record `slot` holds for export, taken out of it; drops it when the queue is
    /// full or export has stopped. (Taken from where it was kept, it is moved once, into the
    /// queue: passed by value, a record (~600 bytes) was copied four times on its way, ~300
    /// instructions per request, callgrind, issue 34.)
    pub(super) fn push(&self, slot: &mut Option<Record>) {
        let Some(spans) = slot.as_ref().map(Record::spans) else {
            return;
        };
        let mut state = self.state.lock();
        if state.spans + spans > MAX_QUEUE_SPANS || state.stop {
            drop(state);
            *slot = None;
            self.dropped.inc_by(spans as u64);
            return;
        }
        move_into(slot, &mut state.records);
        let before = state.spans;
        state.spans += spans;
        if before < BATCH_SPANS && state.spans >= BATCH_SPANS {
            self.wake.notify_one();
        }
    }

    /// The records queued, taken out (tests: a queue without its export thread).
    #[cfg(test)]
    pub(super) fn drain(&self) -> Vec<Record> {
        let mut state = self.state.lock();
        state.spans = 0;
        std::mem::take(&mut state.records)
    }

    /// Asks the export thread to export what is queued and stop; waits at most `timeout` for it.
    pub(super) fn shutdown(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut state = self.state.lock();
        state.stop = true;
        self.wake.notify_all();
        while !state.stopped {
            if self.stopped.wait_until(&mut state, deadline).timed_out() {
                return;
            }
        }
    }
}

/// Moves the record `slot` holds to the end of `records` in one copy, leaving `None`.
/// (`records.push(slot.take())` copied it twice, out of the slot and into the queue, since
/// `push` may grow the buffer in between: ~140 instructions per traced request, callgrind,
/// issue 34.)
fn move_into(slot: &mut Option<Record>, records: &mut Vec<Record>) {
    // The queue's buffer is never full here (`MAX_QUEUE_SPANS` records long, and a push past
    // that many spans is refused first); grown if it were, before anything is moved.
    records.reserve(1);
    let Some(record) = slot.as_mut() else {
        return;
    };
    let len = records.len();
    // SAFETY: `records` has room for one more (reserved above), so `len` is within its
    // allocation and `set_len(len + 1)` covers only that slot, written here. The record is
    // copied out of `slot` once, and `slot` is overwritten with `None` without dropping what
    // it held: the record has exactly one owner, the queue. Nothing between the copy and
    // that write can panic or read `slot`.
    unsafe {
        std::ptr::copy_nonoverlapping(std::ptr::from_mut(record), records.as_mut_ptr().add(len), 1);
        records.set_len(len + 1);
        std::ptr::write(slot, None);
    }
}

/// Starts the export thread: it encodes what `queue` gets for `resource` and posts it through
/// `exporter`, until [`Queue::shutdown`]. Errors: the thread or its runtime could not be made.
pub(super) fn start(
    queue: Arc<Queue>,
    exporter: Exporter,
    resource: &opentelemetry_sdk::Resource,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("the export runtime: {e}"))?;
    let mut encoder = Encoder::new(resource);
    std::thread::Builder::new()
        .name("taskgate-trace-export".into())
        .spawn(move || {
            let mut spare: Vec<Record> = Vec::with_capacity(MAX_QUEUE_SPANS);
            let mut dropped_before = queue.dropped.get();
            loop {
                let stop = {
                    let mut state = queue.state.lock();
                    if state.spans < BATCH_SPANS && !state.stop {
                        queue.wake.wait_for(&mut state, SCHEDULED_DELAY);
                    }
                    std::mem::swap(&mut state.records, &mut spare);
                    state.spans = 0;
                    state.stop
                };
                let dropped = queue.dropped.get();
                if dropped > dropped_before {
                    tracing::debug!(
                        dropped = dropped - dropped_before,
                        "trace export queue full: spans dropped"
                    );
                    dropped_before = dropped;
                }
                let mut rest = &spare[..];
                while !rest.is_empty() {
                    // At most BATCH_SPANS spans per export (at least one record).
                    let (mut take, mut spans) = (0, 0);
                    while take < rest.len() && spans + rest[take].spans() <= BATCH_SPANS {
                        spans += rest[take].spans();
                        take += 1;
                    }
                    let (batch, later) = rest.split_at(take.max(1));
                    let (body, spans) = encoder.body(batch);
                    runtime.block_on(exporter.export(body, spans));
                    rest = later;
                }
                spare.clear();
                if stop {
                    queue.state.lock().stopped = true;
                    queue.stopped.notify_all();
                    return;
                }
            }
        })
        .map_err(|e| format!("the export thread: {e}"))?;
    Ok(())
}
