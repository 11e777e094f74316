//! The GET streams open on each client session, so that a `DELETE` ending the session ends them
//! too (issue 29 item 16): an upstream may keep its side of the stream open after the session
//! ended (or taskgate answered the `DELETE` itself), and the client's stream then stayed open,
//! holding its connection and a `limits.max_get_streams` slot for a session that is gone.
//!
//! An entry per `(route, Mcp-Session-Id)` with at least one open GET stream: the count of its
//! streams and a watch sender whose receivers are the streams' stop signals. A stream's guard
//! takes its count back when the stream ends, and the entry goes with the last one: nothing is
//! left behind once a session's streams are gone. Ending a session removes the entry, which
//! drops the sender and so wakes every receiver.

use http::HeaderValue;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

type Key = (Arc<str>, HeaderValue);

struct Entry {
    /// Tells an entry from a later one under the same key (a session id issued again).
    generation: u64,
    /// Dropped when the session ends: every receiver then wakes.
    _ended: watch::Sender<()>,
    /// A receiver to clone for each new stream.
    signal: watch::Receiver<()>,
    open: usize,
}

/// The open GET streams by route and session (see the module docs).
#[derive(Default)]
pub(super) struct SessionStreams {
    map: Mutex<HashMap<Key, Entry>>,
    generation: AtomicU64,
}

/// Held by one open GET stream; takes its count back when dropped (the stream ended).
pub(super) struct OpenStream {
    streams: Arc<SessionStreams>,
    key: Key,
    generation: u64,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let mut map = self.streams.map.lock();
        if let Some(entry) = map.get_mut(&self.key) {
            if entry.generation == self.generation {
                entry.open -= 1;
                if entry.open == 0 {
                    map.remove(&self.key);
                }
            }
        }
    }
}

impl SessionStreams {
    /// Registers a GET stream of `session` on `route`: the future that completes when the
    /// session is ended ([`SessionStreams::end`]), and the guard the stream holds while open.
    pub(super) fn open(
        self: &Arc<Self>,
        route: &Arc<str>,
        session: &HeaderValue,
    ) -> (impl Future<Output = ()> + Send + 'static, OpenStream) {
        // A copy: the request's value is a slice of the client connection's read buffer.
        let session =
            HeaderValue::from_bytes(session.as_bytes()).unwrap_or_else(|_| session.clone());
        let key = (route.clone(), session);
        let mut map = self.map.lock();
        let entry = map.entry(key.clone()).or_insert_with(|| {
            let (ended, signal) = watch::channel(());
            Entry {
                generation: self.generation.fetch_add(1, Ordering::Relaxed),
                _ended: ended,
                signal,
                open: 0,
            }
        });
        entry.open += 1;
        let mut signal = entry.signal.clone();
        let guard = OpenStream {
            streams: self.clone(),
            key,
            generation: entry.generation,
        };
        (
            async move {
                // Only the sender's drop (the session ended) wakes this: nothing is sent.
                let _ = signal.changed().await;
            },
            guard,
        )
    }

    /// Ends the open GET streams of `session` on `route` (its `DELETE` succeeded).
    pub(super) fn end(&self, route: &Arc<str>, session: &HeaderValue) {
        let removed = self.map.lock().remove(&(route.clone(), session.clone()));
        if let Some(entry) = removed {
            tracing::debug!(upstream = %route, streams = entry.open, "GET streams of an ended session closed");
        }
    }

    /// What the edge does with the reply to a GET (`delete` false) or a `DELETE` (`delete`
    /// true) of `session` on `route`: a GET's SSE stream is registered and ends when the session
    /// does; a `DELETE` answered 2xx (by the upstream or by taskgate) ends the session's streams.
    pub(super) fn on_reply(
        self: &Arc<Self>,
        route: &Arc<str>,
        session: &HeaderValue,
        delete: bool,
        reply: &mut crate::exchange::McpReply,
    ) {
        use crate::exchange::ReplyBody;
        use futures_util::StreamExt;
        if delete {
            if reply.status.is_success() {
                self.end(route, session);
            }
            return;
        }
        let body = std::mem::replace(&mut reply.body, ReplyBody::Empty);
        reply.body = match body {
            ReplyBody::Stream(events) => {
                let (ended, guard) = self.open(route, session);
                ReplyBody::Stream(Box::pin(events.take_until(ended).map(move |e| {
                    let _ = &guard;
                    e
                })))
            }
            other => other,
        };
    }

    /// How many sessions have open GET streams.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    /// Ending a session wakes each of its streams and only them; the entry goes with the
    /// session's last stream or its end, and a stream of an earlier entry under the same key
    /// does not take a later entry's count.
    #[tokio::test]
    async fn ending_a_session_wakes_its_streams_and_leaves_nothing() {
        let streams = Arc::new(SessionStreams::default());
        let route: Arc<str> = "up".into();
        let (a, b) = (HeaderValue::from_static("a"), HeaderValue::from_static("b"));
        let (a1, g_a1) = streams.open(&route, &a);
        let (a2, g_a2) = streams.open(&route, &a);
        let (b1, g_b1) = streams.open(&route, &b);
        let (mut a1, mut a2, mut b1) = (Box::pin(a1), Box::pin(a2), Box::pin(b1));
        assert!(a1.as_mut().now_or_never().is_none());
        assert_eq!(streams.len(), 2);
        streams.end(&route, &a);
        assert!(a1.as_mut().now_or_never().is_some());
        assert!(a2.as_mut().now_or_never().is_some());
        assert!(
            b1.as_mut().now_or_never().is_none(),
            "another session's stream"
        );
        assert_eq!(streams.len(), 1);
        // The id used again: the old guards leave the new entry's count alone.
        let (a3, g_a3) = streams.open(&route, &a);
        drop((g_a1, g_a2));
        assert_eq!(streams.len(), 2);
        drop(g_a3);
        drop(a3);
        drop(g_b1);
        assert_eq!(streams.len(), 0, "nothing left once the streams are gone");
    }
}
