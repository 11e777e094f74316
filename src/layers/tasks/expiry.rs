//! A 2025-11-25 `tasks/result` ends with its task's ttl (finding L2).
//!
//! A `tasks/result` of a live task blocks until the task is terminal (2025-11-25 tasks), so it
//! goes upstream without a deadline (`Deadline::Unbounded`). But the task's record expires at
//! its ttl (`expires_at`: the sweep removes it, and `tasks/*` about it are answered `-32602`
//! "Task not found" from then on). An upstream that never answers kept the request waiting
//! past that, about a task taskgate no longer knows. So the exchange is bounded by the
//! record's expiry ([`Expiry`]): when it passes before the answer, the upstream exchange is
//! dropped and the client gets what a request about an expired task gets, `-32602` "Task not
//! found" (as the JSON answer, or as an event for the request on an SSE answer whose head
//! already went up).
//!
//! Only a client's 2025-11-25 task recorded live (not a gateway, upgraded or bridged task,
//! whose layers follow their own requests). Cost: one timer per such `tasks/result`; an SSE
//! answer's events are read for the answer (one parse per event) until it passed.

use crate::exchange::{McpReply, McpRequest, ReplyBody};
use crate::jsonrpc::{self, Id};
use crate::layers::extensions::AuthorisedTask;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::task::now_ms;
use crate::metrics::LocalReason;
use crate::sse::{Event, EventStream};
use crate::store::Origin;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// The expiry a `tasks/result`'s exchange is bounded by (see the module docs).
pub(super) struct Expiry {
    at: Instant,
    id: Id,
    task_id: String,
}

/// What [`Expiry::bound`] gives back: the reply, or (the record expired first) the answer.
pub(super) enum Bounded {
    /// The upstream's reply came first (an SSE answer is still bounded: [`Expiry::stream`]).
    Reply(McpReply),
    /// The record expired first: the client's answer, the exchange dropped.
    Expired(McpReply),
}

impl Expiry {
    /// The expiry of `req` when it is a 2025-11-25 `tasks/result` of a client's task recorded
    /// live (authorised: its [`AuthorisedTask`]); `None` otherwise.
    pub(super) fn of(req: &McpRequest) -> Option<Expiry> {
        if req.request_method() != Some("tasks/result") || req.era() != Era::Legacy {
            return None;
        }
        let record = &req.extensions.get::<AuthorisedTask>()?.record;
        if record.status.is_terminal() || record.origin != Origin::Client {
            return None;
        }
        if record.era != Era::Legacy {
            return None;
        }
        let left = record.expires_at.saturating_sub(now_ms());
        Some(Expiry {
            at: Instant::now() + Duration::from_millis(left),
            id: req.id()?.clone(),
            task_id: record.task_id.clone(),
        })
    }

    /// `reply` (the upstream exchange) until the record expires.
    pub(super) async fn bound<F, E>(&self, reply: F) -> Result<Bounded, E>
    where
        F: Future<Output = Result<McpReply, E>>,
    {
        match tokio::time::timeout_at(self.at, reply).await {
            Ok(reply) => Ok(Bounded::Reply(reply?)),
            Err(_) => {
                self.log();
                Ok(Bounded::Expired(
                    McpReply::error(Era::Legacy, Some(&self.id), &self.not_found())
                        .answered_locally(LocalReason::TaskNotFound),
                ))
            }
        }
    }

    /// `reply` with an SSE answer bounded too: when the record expires before the answer
    /// passed, the client gets the `-32602` event for its request and the stream ends (the
    /// upstream's dropped). A JSON reply is returned as it is.
    pub(super) fn stream(self, mut reply: McpReply) -> McpReply {
        if let ReplyBody::Stream(events) = reply.body {
            reply.body = ReplyBody::Stream(Box::pin(UntilExpiry {
                sleep: Box::pin(tokio::time::sleep_until(self.at)),
                events: Some(events),
                expiry: self,
                answered: false,
            }));
        }
        reply
    }

    fn not_found(&self) -> McpError {
        McpError::TaskNotFound {
            task_id: self.task_id.clone(),
        }
    }

    fn log(&self) {
        tracing::info!(task_id = %self.task_id, "a tasks/result outlived its task's ttl: answered -32602 (task not found), the upstream exchange dropped");
    }
}

/// An SSE answer to a `tasks/result`, bounded by [`Expiry`] until its answer passed.
struct UntilExpiry {
    expiry: Expiry,
    sleep: Pin<Box<Sleep>>,
    /// `None` once the record expired (the upstream's stream dropped).
    events: Option<EventStream>,
    answered: bool,
}

impl futures_util::Stream for UntilExpiry {
    type Item = Event;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let this = self.get_mut();
        let Some(events) = this.events.as_mut() else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(next) = events.as_mut().poll_next(cx) {
            if let Some(data) = next.as_ref().and_then(|e| e.data.as_ref()) {
                if !this.answered && jsonrpc::is_answer_to(data.as_bytes(), &this.expiry.id) {
                    this.answered = true;
                }
            }
            return Poll::Ready(next);
        }
        if this.answered || this.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        this.events = None;
        this.expiry.log();
        let body = this.expiry.not_found().body(Some(&this.expiry.id));
        Poll::Ready(Some(Event::message(
            String::from_utf8_lossy(&body).into_owned(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testing::{json_of, record, request};
    use std::sync::Arc;

    fn result_request(expires_in: u64) -> McpRequest {
        let mut req =
            request(r#"{"jsonrpc":"2.0","id":7,"method":"tasks/result","params":{"taskId":"t1"}}"#);
        let mut r = record("t1");
        r.expires_at = now_ms() + expires_in;
        req.extensions.insert(AuthorisedTask {
            record: Arc::new(r),
        });
        req
    }

    /// An upstream that never sends its JSON answer's head: at the record's expiry the client
    /// gets `-32602` "Task not found" for its request, the exchange dropped.
    #[tokio::test(start_paused = true)]
    async fn an_answer_that_never_comes_is_answered_not_found_at_expiry() {
        let expiry = Expiry::of(&result_request(5_000)).expect("a live task's tasks/result");
        let never = std::future::pending::<Result<McpReply, ()>>();
        let Ok(Bounded::Expired(reply)) = expiry.bound(never).await else {
            panic!("expired");
        };
        let v = json_of(&reply);
        assert_eq!(v["id"], 7, "{v}");
        assert_eq!(v["error"]["code"], -32602, "{v}");
    }

    #[test]
    fn only_a_live_client_tasks_result_is_bounded() {
        let mut get = result_request(5_000);
        assert!(Expiry::of(&get).is_some());
        let mut terminal = record("t1");
        terminal.status = crate::mcp::task::TaskStatus::Completed;
        get.extensions.insert(AuthorisedTask {
            record: Arc::new(terminal),
        });
        assert!(Expiry::of(&get).is_none(), "terminal: answered at once");
        let poll =
            request(r#"{"jsonrpc":"2.0","id":7,"method":"tasks/get","params":{"taskId":"t1"}}"#);
        assert!(Expiry::of(&poll).is_none());
        // Tasks whose layers follow their own requests, and a 2026 record, are not bounded here
        // (review 19 #7: nothing checked these exclusions).
        for origin in [Origin::Gateway, Origin::Upgraded, Origin::Bridged] {
            let mut req = result_request(5_000);
            let mut r = record("t1");
            r.origin = origin;
            req.extensions.insert(AuthorisedTask {
                record: Arc::new(r),
            });
            assert!(Expiry::of(&req).is_none(), "{origin:?}");
        }
        let mut modern_record = result_request(5_000);
        let mut r = record("t1");
        r.era = Era::Modern;
        modern_record.extensions.insert(AuthorisedTask {
            record: Arc::new(r),
        });
        assert!(Expiry::of(&modern_record).is_none(), "a 2026 record");
        let mut modern_request = result_request(5_000);
        modern_request.extensions.insert(Era::Modern);
        assert!(Expiry::of(&modern_request).is_none(), "a 2026 request");
    }
}
