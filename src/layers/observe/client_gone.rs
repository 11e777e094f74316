//! A creation that outlives its client (break-tasks H3): when the client goes away before the
//! answer to a task-augmented `tools/call` it asked for, the upstream may have made the task
//! already, and only that answer names it. [`RunToEnd`] runs a JSON exchange on to its answer,
//! the drop of [`Watched`] reads an SSE one on; the [`Watch`] is marked `client_gone`, so the
//! answer is not recorded but the task cancelled upstream ([`UndoReason::ClientGone`]).

#[cfg(doc)]
use super::UndoReason;
use super::{BoxFut, Expect, Watch, Watched};
use crate::exchange::McpReply;
use futures_util::{stream, StreamExt};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// A creation's exchange, run to its answer even when its client goes away meanwhile: the
/// upstream may have made the task already, and only its answer names it, to be cancelled
/// then (nobody else will ever learn its taskId): dropped before it ended, the rest of the
/// exchange goes on in a task of its own, its [`Watch`] marked so that the answer is not
/// recorded but cancelled upstream ([`UndoReason::ClientGone`]). Dropped with the client, the
/// exchange left that task running upstream, never recorded nor cancelled, and the owner's
/// slot given back (break-tasks H3). Nothing is spawned for an exchange that ends while its
/// client waits (the common case costs nothing more).
pub(super) struct RunToEnd<E: Send + 'static> {
    pub(super) work: Option<BoxFut<E>>,
    pub(super) watch: Arc<Watch>,
}

impl<E: Send + 'static> Future for RunToEnd<E> {
    type Output = Result<McpReply, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(work) = self.work.as_mut() else {
            return Poll::Pending;
        };
        let out = std::task::ready!(work.as_mut().poll(cx));
        self.work = None;
        Poll::Ready(out)
    }
}

impl<E: Send + 'static> Drop for RunToEnd<E> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        self.watch.client_gone.store(true, Ordering::Relaxed);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // An SSE reply's stream is dropped at once: `Watched`'s drop reads on.
                let _ = work.await;
            });
        }
    }
}

/// How long a creation's SSE answer is still read after its client went away, for the
/// answer naming the task (to cancel it upstream: [`UndoReason::ClientGone`]).
const CLIENT_GONE_DRAIN: Duration = Duration::from_secs(30);

impl Drop for Watched {
    /// A stream dropped before its creation's answer came (the client went away; or the event
    /// being applied was still being applied): that event is applied to its end, and the rest
    /// of the upstream's stream is read, within [`CLIENT_GONE_DRAIN`], until the answer naming
    /// the task comes, to cancel it upstream (break-tasks H3: the task was left running,
    /// never recorded nor cancelled). Nothing is done for a stream whose creation was answered
    /// or that awaits none.
    fn drop(&mut self) {
        let applying = self.applying.take();
        let awaiting = self.watch.runs_to_end
            && !self.ended
            && matches!(*self.watch.expect.lock(), Expect::Creation(_));
        if !awaiting && applying.is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if awaiting {
            self.watch.client_gone.store(true, Ordering::Relaxed);
        }
        let events = std::mem::replace(&mut self.events, Box::pin(stream::empty()));
        let (watch, caller) = (self.watch.clone(), self.caller.clone());
        runtime.spawn(async move {
            if let Some(applying) = applying {
                let _ = applying.await;
            }
            let deadline = tokio::time::Instant::now() + CLIENT_GONE_DRAIN;
            let mut events = events;
            while awaiting && matches!(*watch.expect.lock(), Expect::Creation(_)) {
                let next = events.next();
                let Ok(Some(event)) = tokio::time::timeout_at(deadline, next).await else {
                    break;
                };
                if let Some(data) = event.data {
                    let _ = watch
                        .on_message(data.as_bytes().clone(), Some(&caller))
                        .await;
                }
            }
        });
    }
}
