//! A queue for one client bounded in messages and in bytes: what a slow client lets pile up
//! (the messages of its GET stream, those related to one of its requests) is bounded by what
//! the messages weigh, not only by their count (64 messages of up to `max_message_bytes`,
//! 16 MiB by default, were a gigabyte).

use crate::sse;
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// What a queued message weighs, in bytes.
pub trait Weigh {
    /// Its bytes.
    fn weight(&self) -> usize;
}

impl Weigh for Bytes {
    fn weight(&self) -> usize {
        self.len()
    }
}

impl Weigh for sse::Event {
    fn weight(&self) -> usize {
        self.data.as_ref().map_or(0, |d| d.len())
    }
}

/// A queue for one client bounded in messages and in bytes ([`queue`]): a message that finds
/// it full is refused (the sender says what that means). A message larger than the byte bound
/// still goes to an empty queue, alone, so that every message can be delivered: the queue
/// holds at most its byte bound, or one message (`max_message_bytes`).
pub struct QueueTx<T> {
    tx: mpsc::Sender<T>,
    /// Bytes of the messages queued and not taken by the client yet.
    queued: Arc<AtomicUsize>,
    max_bytes: usize,
}

impl<T> Clone for QueueTx<T> {
    fn clone(&self) -> Self {
        QueueTx {
            tx: self.tx.clone(),
            queued: self.queued.clone(),
            max_bytes: self.max_bytes,
        }
    }
}

/// The client's end of a [`QueueTx`]: what it takes leaves the byte count.
pub struct QueueRx<T> {
    rx: mpsc::Receiver<T>,
    queued: Arc<AtomicUsize>,
}

/// A queue of at most `messages` messages and `max_bytes` bytes (see [`QueueTx`]).
pub fn queue<T: Weigh>(messages: usize, max_bytes: usize) -> (QueueTx<T>, QueueRx<T>) {
    let (tx, rx) = mpsc::channel(messages);
    let queued = Arc::new(AtomicUsize::new(0));
    (
        QueueTx {
            tx,
            queued: queued.clone(),
            max_bytes,
        },
        QueueRx { rx, queued },
    )
}

impl<T: Weigh> QueueTx<T> {
    /// Whether its client is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Queues `msg` unless the queue is full, in messages or in bytes.
    pub fn try_send(&self, msg: T) -> Result<(), mpsc::error::TrySendError<T>> {
        let len = msg.weight();
        let queued = self.queued.load(Ordering::Acquire);
        if queued > 0 && queued.saturating_add(len) > self.max_bytes {
            return Err(mpsc::error::TrySendError::Full(msg));
        }
        // Counted before it can be taken (the client only subtracts what it took), so the
        // count never falls below what waits. Two senders at once may both pass the check:
        // one message over the bound at most per sender (a queue has one or two).
        self.queued.fetch_add(len, Ordering::AcqRel);
        self.tx.try_send(msg).inspect_err(|_| {
            self.queued.fetch_sub(len, Ordering::AcqRel);
        })
    }
}

impl<T: Weigh> QueueRx<T> {
    /// The next message, when one waits.
    pub fn try_recv(&mut self) -> Result<T, mpsc::error::TryRecvError> {
        let msg = self.rx.try_recv()?;
        self.queued.fetch_sub(msg.weight(), Ordering::AcqRel);
        Ok(msg)
    }

    /// The next message; `None` once every sender is gone and nothing waits.
    pub async fn recv(&mut self) -> Option<T> {
        let msg = self.rx.recv().await?;
        self.queued.fetch_sub(msg.weight(), Ordering::AcqRel);
        Some(msg)
    }

    /// Refuses further messages (those waiting can still be taken).
    pub fn close(&mut self) {
        self.rx.close();
    }
}

impl<T: Weigh + Send + 'static> QueueRx<T> {
    /// The messages as they come, until every sender is gone.
    pub fn into_stream(self) -> std::pin::Pin<Box<dyn futures_util::Stream<Item = T> + Send>> {
        Box::pin(futures_util::stream::unfold(self, |mut q| async move {
            q.recv().await.map(|m| (m, q))
        }))
    }
}
