//! [`AfterReply`]: the inner service's future with a synchronous step applied to its reply,
//! for a layer whose work on an ordinary exchange needs no await (`session` and `observe` on a
//! plain `tools/call`): the request goes on without a boxed future of the layer's own.

use crate::exchange::McpReply;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// What a layer does to a reply once it arrives, without waiting on anything.
pub(crate) trait ReplyStep<E> {
    /// `reply` as the layer passes it on, or the error it turns into (`observe`: an invalid
    /// answer).
    fn apply(self, reply: McpReply) -> Result<McpReply, E>;
}

pin_project_lite::pin_project! {
    /// Resolves to the inner future's reply after `step`; an error passes unchanged.
    pub struct AfterReply<F, T> {
        #[pin]
        inner: F,
        step: Option<T>,
    }
}

impl<F, T> AfterReply<F, T> {
    /// `inner` (the inner service's future), then `step` on its reply.
    pub(crate) fn new(inner: F, step: T) -> AfterReply<F, T> {
        AfterReply {
            inner,
            step: Some(step),
        }
    }
}

impl<F, T, E> Future for AfterReply<F, T>
where
    F: Future<Output = Result<McpReply, E>>,
    T: ReplyStep<E>,
{
    type Output = Result<McpReply, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let reply = ready!(this.inner.poll(cx))?;
        let step = this
            .step
            .take()
            .expect("AfterReply polled after it completed");
        Poll::Ready(step.apply(reply))
    }
}
