//! The `cancel` layer: `tasks/cancel` sent upstream once, cancels of terminal tasks answered
//! here, and `notifications/cancelled` routed and de-duplicated
//! (2025-11-25 basic/utilities/tasks: Task Cancellation; basic/utilities/cancellation).
//!
//! It sits inside the `tasks` layer, so a `tasks/cancel` reaching it names a task the caller owns,
//! already routed to the task's upstream session, with the record `tasks` read
//! ([`AuthorisedTask`]). It sits above `observe`, so the answer it reads has already been applied
//! to the registry (and rewritten to a recorded terminal status) when it reaches this layer.
//! Its state belongs to one upstream's stack.
//!
//! - **Terminal**: a task whose record is `completed`, `failed` or `cancelled` (the authorised
//!   record, or the outcome of a flight that just ended) is answered `-32602` naming the status;
//!   the upstream is not called (`outcome="rejected_terminal"`). Under 2026-07-28 it is the ack
//!   `{"resultType":"complete"}` instead (the spec defines no error there;
//!   `outcome="acknowledged_terminal"`), with the
//!   `cancel_requested` audit fact; and a task whose forwarded cancel the upstream acknowledged
//!   gets the ack here for every later cancel (one upstream cancel per task). The three audit
//!   facts stay apart: cancel requested (the ack), status cancelled (first seen in a later
//!   `tasks/get` or `notifications/tasks`; the task may end `completed` or `failed` instead) and
//!   resources released. `notifications/cancelled` never cancels a 2026 task (reason `task`).
//! - **Single-flight**: while one `tasks/cancel` for a task is in flight upstream, identical
//!   requests wait for it and each gets the same outcome under its own JSON-RPC id
//!   (`outcome="deduplicated"`). The first is `forwarded` (or `upstream_error` when the upstream
//!   answers an error or cannot be reached); it records `cancel_requested_at` and the
//!   `cancel_requested` audit event (for a 2025-11-25 cancel of a 2026-07-28 task, not a
//!   gateway task's, the `bridge` below records them when it sends or passes on the cancel:
//!   it asks the task's status first, and a task
//!   it finds terminal is answered `-32602` with nothing sent, counted `rejected_terminal`). A flight that ends with a terminal status leaves it behind
//!   before it leaves the table, so a cancel arriving afterwards is answered here. Every caller
//!   gets the answer as one `application/json` message, even if the upstream streamed it.
//! - `notifications/cancelled` (ordinary cancellation): dropped when its `requestId` is the
//!   session's `initialize` (reason `initialize`), a request that produced a `CreateTaskResult`
//!   (reason `task`: tasks are cancelled with `tasks/cancel` only), or already forwarded once
//!   (reason `duplicate`); otherwise it goes to the upstream session that carries the request (a
//!   pending `tasks/result` may have been routed to the task's session). Requests are named by
//!   who sent them ([`Caller`](crate::exchange::Caller) and id), so one client's cancel is never taken for another's. A
//!   caller with neither a principal nor a session cannot be told apart from another one: its
//!   cancels are never dropped as `duplicate` (a second `notifications/cancelled` is harmless;
//!   dropping another client's is not), while the `initialize` and `task` checks still apply
//!   (they protect a session and a task from being cancelled by the wrong message). What is
//!   noted of a session's requests is forgotten when its DELETE succeeds (or the upstream
//!   answers 404), and a noted session id is a copy, not a slice of the upstream's read buffer.
//!
//! ## The two audit facts
//!
//! - **status cancelled** (`cancelled_at`): the first time taskgate sees `cancelled` for the task,
//!   in a `tasks/cancel` reply, a `tasks/get` reply or a `notifications/tasks/status`. Applied by
//!   `observe` through [`crate::registry::Registry`] when the status changes.
//! - **resources released** (`released_at`): after status cancelled, when (a) no gateway-side
//!   resource is held for the task any more: no `tasks/result` for it is open upstream through
//!   taskgate, and no SSE stream that carries its messages (the task-augmented `tools/call`'s own
//!   stream included) is still being relayed; and (b) the upstream has sent nothing about the task
//!   for `tasks.release_quiet_ms` (default 2 s): no `notifications/progress` on the task's
//!   `progressToken`, no message whose `_meta["io.modelcontextprotocol/related-task"]` names it,
//!   no `notifications/tasks/status` for it. `released_at` is the moment both held, i.e. the last
//!   of those events plus the quiet window. Activity after status cancelled is counted
//!   (`taskgate_task_activity_after_cancel_total`) and restarts the window. Records still
//!   unreleased at start-up (a restart) are released after one quiet window with
//!   `reason="restart"`; records removed by the TTL sweeper first count `reason="expired"`.
//!   Holds and activity are taken by `observe`; the tracker is `crate::registry::releases`.

mod modern;
mod notes;
mod tier;

use modern::terminal_answer;
pub use modern::MODERN_ACK;

use crate::exchange::{Deadline, GatewayError, McpReply, McpRequest, ReplyBody};
use crate::jsonrpc;
use crate::layers::extensions::{AuthorisedTask, CancelFoundTerminal};
use crate::layers::lost_task;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::task::TaskStatus;
use crate::metrics::{self, LocalReason};
use crate::registry::Registry;
use bytes::Bytes;
use futures_util::future::{BoxFuture, Either, FutureExt, Shared};
use futures_util::StreamExt;
use notes::{CancelNotes, InFlightGuard, NOTES_LIMIT};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;

/// The upstream's answer to one forwarded `tasks/cancel`, shared by every waiting caller.
#[derive(Clone)]
enum FlightAnswer {
    /// A JSON-RPC result: its `result` JSON text.
    Result(String),
    /// A JSON-RPC error: its `error` JSON text.
    Error(String),
    /// The upstream answered with an HTTP error or no message at all.
    Http(Arc<Mutex<Option<McpReply>>>, u16),
    /// The upstream answered HTTP 404 with a JSON-RPC error that says the task's 2025-11-25
    /// session is gone ([`lost_task::says_session_not_found`]): that error's JSON text. Every
    /// caller gets it under its own id with the 404, which the `tasks` layer's lost-task probe
    /// reads (review 21 #1, 21b #2).
    SessionGone(String),
    /// The upstream could not be reached.
    Failed(Arc<GatewayError>),
    /// The `bridge` below found the task terminal (`status`, [`CancelFoundTerminal`]) before
    /// sending anything (`sent: false`) or after the upstream acknowledged the cancel (`sent`):
    /// its JSON-RPC `error` JSON text (the 2025 `-32602`), answered to every caller.
    Ended {
        status: TaskStatus,
        error: String,
        sent: bool,
    },
    /// Shared store: the task was terminal (with this status) when the cancel was claimed.
    Terminal(TaskStatus),
    /// Shared store, 2026-07-28: a cancel of the task was already acknowledged upstream.
    Acknowledged,
    /// Shared store: another replica forwarded the cancel; this is its outcome.
    Elsewhere(Box<FlightAnswer>),
}

type SharedCancel = Shared<BoxFuture<'static, FlightAnswer>>;

/// State of the cancel layer for one upstream.
pub struct CancelState {
    registry: Arc<Registry>,
    /// taskId → the flight of its forwarded `tasks/cancel`.
    flights: Mutex<HashMap<String, SharedCancel>>,
    /// taskId → the terminal status a finished flight's answer showed (bounded).
    settled: Mutex<HashMap<String, TaskStatus>>,
    /// 2026-07-28 taskIds whose forwarded `tasks/cancel` the upstream acknowledged (bounded):
    /// later cancels of them are acknowledged here (one upstream cancel per task).
    acked: Mutex<std::collections::HashSet<String>>,
    notes: Mutex<CancelNotes>,
    /// The lease of this upstream's cross-replica cancel claims (`timeout_ms` plus a margin).
    lease: Duration,
    /// How many follow-ups of acknowledged 2026-07-28 cancels run (at most
    /// [`MAX_FOLLOW_UPS`]; see [`follow_after_ack`]).
    follow_ups: Arc<AtomicUsize>,
    /// taskgate's shutdown signal (`true`: stopping), which ends the follow-ups.
    shutdown: Option<watch::Receiver<bool>>,
}

impl CancelState {
    /// Creates the state of one upstream's cancel layer; `upstream_timeout` is the upstream's
    /// `timeout_ms`, which bounds a forwarded `tasks/cancel` and sets the claim's lease on a
    /// shared store ([`crate::store::cancel_lease`]).
    pub fn new(registry: Arc<Registry>, upstream_timeout: Duration) -> Arc<CancelState> {
        Arc::new(Self::state(registry, upstream_timeout, None))
    }

    /// As [`CancelState::new`], with taskgate's shutdown signal (`true`: stopping), which ends
    /// the follow-ups of acknowledged cancels (`follow_after_ack`) at once.
    pub fn stopping_with(
        registry: Arc<Registry>,
        upstream_timeout: Duration,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<CancelState> {
        Arc::new(Self::state(registry, upstream_timeout, Some(shutdown)))
    }

    fn state(
        registry: Arc<Registry>,
        upstream_timeout: Duration,
        shutdown: Option<watch::Receiver<bool>>,
    ) -> CancelState {
        CancelState {
            registry,
            flights: Mutex::new(HashMap::new()),
            settled: Mutex::new(HashMap::new()),
            acked: Mutex::new(Default::default()),
            notes: Mutex::new(CancelNotes::default()),
            lease: crate::store::cancel_lease(upstream_timeout),
            follow_ups: Arc::default(),
            shutdown,
        }
    }
}

/// Builds [`CancelService`]s.
#[derive(Clone)]
pub struct CancelLayer {
    state: Arc<CancelState>,
}

impl CancelLayer {
    /// A layer over `state` (one per upstream's stack).
    pub fn new(state: Arc<CancelState>) -> CancelLayer {
        CancelLayer { state }
    }
}

impl<S> tower::Layer<S> for CancelLayer {
    type Service = CancelService<S>;
    fn layer(&self, inner: S) -> CancelService<S> {
        CancelService {
            inner,
            state: self.state.clone(),
        }
    }
}

/// The `cancel` layer's service (see the module docs).
#[derive(Clone)]
pub struct CancelService<S> {
    inner: S,
    state: Arc<CancelState>,
}

type BoxFut = Pin<Box<dyn Future<Output = Result<McpReply, GatewayError>> + Send>>;

impl<S: Clone> CancelService<S> {
    /// The inner service for a future that outlives `call`: the ready one goes with the
    /// request, this service keeps a clone.
    fn take_inner(&mut self) -> S {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }
}

impl<S> tower::Service<McpRequest> for CancelService<S>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = McpReply;
    type Error = GatewayError;
    /// The inner service's own future for a request with nothing to track while in flight (a
    /// plain `tools/call`, a routed `notifications/cancelled`, ...); a boxed one otherwise.
    type Future = Either<S::Future, BoxFut>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: McpRequest) -> Self::Future {
        match (req.request_method(), req.notification_method()) {
            (Some("tasks/cancel"), _) => Either::Right(Box::pin(cancel_from_below(
                self.state.clone(),
                self.take_inner(),
                req,
            ))),
            (Some("initialize"), _) => {
                let (state, mut inner) = (self.state.clone(), self.take_inner());
                Either::Right(Box::pin(async move {
                    let caller = req.ctx.caller();
                    let id = req.id().cloned();
                    let reply = inner.call(req).await?;
                    if let Some(id) = id {
                        state.note_initialize(caller, &reply, id);
                    }
                    Ok(reply)
                }))
            }
            (None, None) if matches!(req.op, crate::exchange::Operation::EndSession) => {
                // A session that ended leaves no notes behind (issue 29 item 16).
                let (state, mut inner) = (self.state.clone(), self.take_inner());
                Either::Right(Box::pin(async move {
                    let caller = req.ctx.caller();
                    let reply = inner.call(req).await?;
                    if reply.status.is_success() || reply.status == http::StatusCode::NOT_FOUND {
                        state.forget_session(&caller);
                    }
                    Ok(reply)
                }))
            }
            (_, Some("notifications/cancelled")) => {
                if let Some(reason) = self.state.route_cancelled(&mut req) {
                    self.state
                        .registry
                        .metrics()
                        .cancelled_notification_dropped(&req.ctx.upstream, reason);
                    tracing::info!(reason = reason.as_str(), "notifications/cancelled dropped");
                    return Either::Right(Box::pin(async { Ok(McpReply::accepted()) }));
                }
                Either::Left(self.inner.call(req))
            }
            _ => {
                self.state.note_creation(&req);
                let Some(key) = self.state.note_request(&req) else {
                    // The common case: nothing to track while this request is in flight.
                    return Either::Left(self.inner.call(req));
                };
                // Made before the call: a client that goes away before the answer still
                // removes its note.
                let done = InFlightGuard {
                    state: self.state.clone(),
                    key,
                };
                let mut inner = self.take_inner();
                Either::Right(Box::pin(async move {
                    let mut reply = inner.call(req).await?;
                    if let ReplyBody::Stream(events) = reply.body {
                        reply.body = ReplyBody::Stream(Box::pin(events.map(move |e| {
                            let _ = &done;
                            e
                        })));
                    }
                    Ok(reply)
                }))
            }
        }
    }
}

impl CancelState {
    /// The terminal status a task is known to have: left by a finished flight, else the record
    /// the `tasks` layer authorised.
    fn known_terminal(&self, record: &crate::store::TaskRecord) -> Option<TaskStatus> {
        self.settled
            .lock()
            .get(&record.task_id)
            .copied()
            .or(Some(record.status))
            .filter(|s| s.is_terminal())
    }
}

/// A `tasks/cancel` through the single-flight: a client's (from this layer's `call`), or one
/// taskgate itself sends from below this layer (the `bridge` cancels a task
/// whose input its client cannot give): `req` is a `tasks/cancel` with an id and the task's
/// [`AuthorisedTask`], `inner` the service below this layer. It goes through the same
/// single-flight, cross-replica claim, terminal check and audit facts as a client's, so a
/// client's `tasks/cancel` racing it still makes one upstream `tasks/cancel`; it is counted in
/// `taskgate_cancel_requests_total` like one.
pub async fn cancel_from_below<S>(
    state: Arc<CancelState>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Send + 'static,
    S::Future: Send + 'static,
{
    let metrics = state.registry.metrics().clone();
    let upstream = req.ctx.upstream.clone();
    let id = req.id().cloned();
    let count = |outcome: metrics::CancelOutcome| metrics.cancel_request(&upstream, outcome);
    let (Some(id), Some(record)) = (
        id,
        req.extensions
            .get::<AuthorisedTask>()
            .map(|a| a.record.clone()),
    ) else {
        // Only without the `tasks` layer above: nothing was authorised.
        count(metrics::CancelOutcome::RejectedUnknown);
        return Ok(McpReply::error(
            req.era(),
            req.id(),
            &McpError::NoAuthorisedTask,
        ));
    };
    let task_id = record.task_id.clone();
    let era = req.era();
    let joined = {
        let mut flights = state.flights.lock();
        if let Some(f) = flights.get(&task_id) {
            Ok((f.clone(), false))
        } else if let Some(status) = state.known_terminal(&record) {
            // Checked under the flights lock: a finished flight leaves its terminal status in
            // `settled` before it leaves the table, so this sees it.
            Err(Some(status))
        } else if (era == Era::Modern || record.era == Era::Modern)
            && (record.cancel_acked || state.acked.lock().contains(&task_id))
        {
            // 2026-07-28: one upstream cancel per task; the ack is all any 2026 caller gets
            // (the record holds it across restarts, the note until the record says so), and
            // a 2025 caller of a 2026 task (through the bridge: it went upstream again,
            // break-tasks H2b) gets it as the bridge answers it. Not a 2025 caller of a 2025
            // task: the reverse bridge acks every 2025 answer to a 2026 cancel, "already
            // completed" included, which says nothing about the 2025 task (review 18a #4).
            Err(None)
        } else {
            let flight = tier::forward_cancel(state.clone(), inner, req, task_id.clone())
                .boxed()
                .shared();
            flights.insert(task_id.clone(), flight.clone());
            Ok((flight, true))
        }
    };
    let (flight, first) = match joined {
        Ok(joined) => joined,
        Err(Some(status)) => {
            count(metrics::CancelOutcome::of_terminal(era == Era::Modern));
            return Ok(terminal_answer(&state, era, &upstream, &record, &id, status).await);
        }
        Err(None) => {
            count(metrics::CancelOutcome::Deduplicated);
            // A 2025 caller gets the ack as the bridge answers it: the task `cancelled`.
            let legacy =
                modern::other_eras_answer(&state, era, &upstream, &record, &id, MODERN_ACK);
            let reply = match legacy.await {
                Some(reply) => reply,
                None => McpReply::local_json(jsonrpc::result_response(&id, MODERN_ACK)),
            };
            return Ok(reply.answered_locally(LocalReason::CancelAcknowledged));
        }
    };
    let (outcome, here) = match flight.await {
        FlightAnswer::Elsewhere(o) => (*o, false),
        o => (o, true),
    };
    match outcome {
        FlightAnswer::Terminal(status) => {
            count(metrics::CancelOutcome::of_terminal(era == Era::Modern));
            return Ok(terminal_answer(&state, era, &upstream, &record, &id, status).await);
        }
        FlightAnswer::Ended {
            status,
            error,
            sent: false,
        } => {
            // Nothing went upstream: the bridge's answer for a terminal task is taskgate's own,
            // counted as a cancel of a task known terminal is (not `upstream_error`).
            count(metrics::CancelOutcome::of_terminal(era == Era::Modern));
            tracing::debug!(task_id = %task_id, %status, "tasks/cancel of a task its upstream showed terminal: answered here, nothing sent");
            if era == Era::Modern {
                // A 2026 caller who joined a 2025 caller's flight: a 2026 cancel of a terminal
                // task is acknowledged (2026-07-28 defines no error there), not the 2025 error.
                return Ok(terminal_answer(&state, era, &upstream, &record, &id, status).await);
            }
            let reply = reply_of(FlightAnswer::Error(error), &id, false, &upstream, era)?;
            return Ok(reply.answered_locally(LocalReason::CancelTerminal));
        }
        FlightAnswer::Ended {
            error, sent: true, ..
        } => {
            // Sent and acknowledged; the task had ended otherwise first.
            count(match first && here {
                true => metrics::CancelOutcome::Forwarded,
                false => metrics::CancelOutcome::Deduplicated,
            });
            if era == Era::Modern {
                // The upstream acknowledged the cancel: a 2026 caller gets the ack.
                return Ok(McpReply::local_json(jsonrpc::result_response(
                    &id, MODERN_ACK,
                )));
            }
            return reply_of(FlightAnswer::Error(error), &id, false, &upstream, era);
        }
        FlightAnswer::Acknowledged => {
            count(metrics::CancelOutcome::Deduplicated);
            return Ok(
                McpReply::local_json(jsonrpc::result_response(&id, MODERN_ACK))
                    .answered_locally(LocalReason::CancelAcknowledged),
            );
        }
        _ => {}
    }
    let first = first && here;
    let upstream_failed = !matches!(outcome, FlightAnswer::Result(_));
    count(match (first, upstream_failed) {
        (true, false) => metrics::CancelOutcome::Forwarded,
        (true, true) => metrics::CancelOutcome::UpstreamError,
        (false, _) => metrics::CancelOutcome::Deduplicated,
    });
    if let FlightAnswer::Result(result) = &outcome {
        let answer = modern::other_eras_answer(&state, era, &upstream, &record, &id, result);
        if let Some(reply) = answer.await {
            return Ok(reply);
        }
    }
    reply_of(outcome, &id, first, &upstream, era)
}

/// The reply one caller gets from a flight's outcome, under its own id (`first`: the caller
/// whose request went upstream gets an HTTP error reply as it came).
fn reply_of(
    outcome: FlightAnswer,
    id: &jsonrpc::Id,
    first: bool,
    upstream: &str,
    era: Era,
) -> Result<McpReply, GatewayError> {
    Ok(match outcome {
        FlightAnswer::Result(result) => McpReply::local_json(jsonrpc::result_response(id, &result)),
        FlightAnswer::Error(error) => {
            let mut text = String::with_capacity(48 + error.len());
            text.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
            text.push_str(id.as_json());
            text.push_str(",\"error\":");
            text.push_str(&error);
            text.push('}');
            let mut reply = McpReply::local_json(Bytes::from(text));
            // A 2026-07-28 error keeps the HTTP status its code has in that era (`-32602`: 400),
            // as an error passed on as it came does; each caller gets its own era's (break-tasks
            // M6: every such error was answered 200).
            if era == Era::Modern {
                let code = crate::layers::lost_task::error_object_code(&error).unwrap_or(0);
                reply.status = crate::mcp::errors::modern_error_status(code);
            }
            reply
        }
        FlightAnswer::SessionGone(error) => {
            let mut reply = McpReply::local_json(Bytes::from(format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{},\"error\":{error}}}",
                id.as_json()
            )));
            reply.status = http::StatusCode::NOT_FOUND;
            reply
        }
        // Taken by the first caller only: a joiner that read the outcome first took it and
        // threw it away (review 21b #2).
        FlightAnswer::Http(reply, status) => match first.then(|| reply.lock().take()).flatten() {
            Some(r) => r,
            _ => {
                let error = McpError::CancelAnsweredHttp {
                    upstream: upstream.to_string(),
                    status,
                };
                // `-32603`: HTTP 200 in both eras.
                McpReply::error(Era::Legacy, Some(id), &error)
            }
        },
        FlightAnswer::Failed(e) => return Err((*e).clone()),
        FlightAnswer::Terminal(_)
        | FlightAnswer::Ended { .. }
        | FlightAnswer::Acknowledged
        | FlightAnswer::Elsewhere(_) => {
            McpReply::error(Era::Legacy, Some(id), &McpError::CancelNoOutcome)
        }
    })
}

/// The answer to a `tasks/cancel`, its parts kept as the bytes that came.
#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow)]
    result: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

/// Sends the one `tasks/cancel` upstream and reads its answer (JSON or SSE; `observe` below has
/// applied it). Called by `tier::forward_cancel`, which holds the flight's place in the table.
async fn forward_upstream<S>(
    state: Arc<CancelState>,
    mut inner: S,
    mut req: McpRequest,
    task_id: String,
) -> FlightAnswer
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Send + 'static,
    S::Future: Send + 'static,
{
    let upstream = req.ctx.upstream.clone();
    let era = req.era();
    if !sent_by_bridge(&req) {
        state.registry.request_cancel(&upstream, &task_id).await;
    }
    let Some(id) = req.id().cloned() else {
        return FlightAnswer::Error(internal("tasks/cancel without an id".to_string()));
    };
    // The whole exchange, a streamed answer included, within the upstream's `timeout_ms`:
    // every caller of this flight waits on it.
    req.extensions.insert(Deadline::Exchange);
    let poll = modern::PollAfterAck::of(&req);
    let confirm = lost_task::Confirm::of(&req);
    let reply = match inner.call(req).await {
        Err(e) => return FlightAnswer::Failed(Arc::new(e)),
        Ok(reply) => reply,
    };
    let status = reply.status.as_u16();
    if let Some(CancelFoundTerminal {
        status: ended,
        sent,
    }) = reply.extensions.get::<CancelFoundTerminal>().copied()
    {
        let message = match reply.body {
            ReplyBody::Json(bytes) => Some(bytes),
            _ => None,
        };
        let error = message
            .as_deref()
            .and_then(|b| serde_json::from_slice::<Answer>(b).ok())
            .and_then(|a| a.error.map(|e| e.get().to_string()));
        if let Some(error) = error {
            // Before the flight leaves the table (see `cancel_from_below`).
            let mut settled = state.settled.lock();
            if settled.len() >= NOTES_LIMIT {
                settled.clear();
            }
            settled.insert(task_id.clone(), ended);
            return FlightAnswer::Ended {
                status: ended,
                error,
                sent,
            };
        }
        return FlightAnswer::Error(internal(format!(
            "tasks/cancel: the answer for task {task_id}, terminal upstream, could not be read"
        )));
    }
    // The 2025-11-25 transport's "session gone" keeps its 404 for every caller: the status is
    // the signal the `tasks` layer's lost-task probe reads.
    if let ReplyBody::Json(bytes) = &reply.body {
        let error = lost_task::says_session_gone(reply.status, bytes)
            .then(|| serde_json::from_slice::<Answer>(bytes).ok())
            .flatten()
            .and_then(|a| a.error);
        if let Some(error) = error {
            return FlightAnswer::SessionGone(error.get().to_string());
        }
    }
    let message = match reply.body {
        ReplyBody::Json(bytes) => Some(bytes),
        ReplyBody::Stream(events) => {
            let stream = McpReply {
                body: ReplyBody::Stream(events),
                ..reply
            };
            stream.answer_to(&id).await
        }
        body => {
            let reply = McpReply { body, ..reply };
            return FlightAnswer::Http(Arc::new(Mutex::new(Some(reply))), status);
        }
    };
    let answer = message
        .as_deref()
        .and_then(|b| serde_json::from_slice::<Answer>(b).ok());
    let mut acked_now = false;
    let outcome = match answer {
        Some(Answer {
            result: Some(r), ..
        }) if !r.get().trim_start().starts_with('{') => FlightAnswer::Error(internal(format!(
            "upstream `{upstream}` answered tasks/cancel with a result that is not a Task object"
        ))),
        Some(Answer {
            result: Some(r), ..
        }) => {
            if let Some(s) = status_of(r).filter(|s| s.is_terminal()) {
                // Before the flight leaves the table (see `cancel_from_below`).
                let mut settled = state.settled.lock();
                if settled.len() >= NOTES_LIMIT {
                    settled.clear();
                }
                settled.insert(task_id.clone(), s);
            } else if era == Era::Modern {
                // Before the flight leaves the table, like `settled`.
                let mut acked = state.acked.lock();
                if acked.len() >= NOTES_LIMIT {
                    acked.clear();
                }
                acked.insert(task_id.clone());
                acked_now = true;
            }
            FlightAnswer::Result(r.get().to_string())
        }
        Some(Answer { error: Some(e), .. }) => FlightAnswer::Error(e.get().to_string()),
        _ => FlightAnswer::Error(internal(format!(
            "upstream `{upstream}` sent no answer to tasks/cancel (HTTP {status})"
        ))),
    };
    let invalid = |e: &str| lost_task::error_object_code(e) == Some(lost_task::INVALID_PARAMS);
    if let (Some(confirm), FlightAnswer::Error(error)) = (confirm, &outcome) {
        // A `-32602`: "not found", "already terminal" (2025-11-25), or about the caller's own
        // params (review 18a #1). Told apart with a clean `tasks/get` here, inside the flight,
        // so every caller sharing this answer shares the one `tasks/get` it takes (review 17
        // #14), and the record says so before the flight leaves the table.
        if invalid(error)
            && confirm
                .run(&state.registry, &mut inner, "tasks/cancel")
                .await
        {
            let mut settled = state.settled.lock();
            if settled.len() >= NOTES_LIMIT {
                settled.clear();
            }
            settled.insert(task_id.clone(), TaskStatus::Failed);
        }
    }
    if acked_now {
        // Kept in the record too, before the flight leaves the table: the note above is
        // forgotten at a restart (and past `NOTES_LIMIT` tasks), the record is not.
        state
            .registry
            .record_cancel_acked(&upstream, &task_id)
            .await;
        if let Some(poll) = poll {
            follow_after_ack(&state, inner, poll).await;
        }
    }
    outcome
}

/// Whether the `bridge` below sends this `tasks/cancel` (a 2025-11-25 caller's cancel of a task
/// on a 2026-07-28 task server): it asks the task's status first and sends a 2026
/// `tasks/cancel` only for a live task, and records "cancel requested" itself when it does
/// (`Registry::request_cancel`), so a task found terminal is not audited as forwarded (it also
/// records it for such a cancel it passes on untranslated). Not a gateway task's: the
/// `gateway_tasks` layer answers that one above the bridge, whatever era created it.
fn sent_by_bridge(req: &McpRequest) -> bool {
    req.era() == Era::Legacy
        && req.extensions.get::<AuthorisedTask>().is_some_and(|a| {
            a.record.era == Era::Modern && a.record.origin != crate::store::Origin::Gateway
        })
}

/// The longest the callers of a forwarded 2026-07-28 cancel wait for taskgate's own poll of
/// the task after the upstream's ack (`follow_after_ack`).
pub const POLL_AFTER_ACK_WAIT: Duration = Duration::from_secs(2);

/// How long a follow-up after the first poll lasts at most (`follow_after_ack`): a
/// worker-queue server may cancel seconds after its ack (review 18a #5: 5 polls at the task's
/// `pollIntervalMs` gave up after about half a second).
pub const FOLLOW_UP_FOR: Duration = Duration::from_secs(30);

/// The most polls of a follow-up after the first (`follow_after_ack`).
pub const FOLLOW_UP_POLLS: u32 = 12;

/// The most follow-ups of one upstream's acknowledged cancels running at once; past it a task
/// still live after the first poll keeps its record as it is (the next poll of a client's, or
/// its ttl, ends it).
pub const MAX_FOLLOW_UPS: usize = 256;

/// After a forwarded 2026-07-28 cancel was acknowledged (the ack tells no status): what the
/// upstream made of the cancel, recorded without anyone polling (break-tasks M3, review 17 #6).
///
/// - A record already terminal after the flight (a gateway task: `gateway_tasks` below
///   recorded it `cancelled`) is asked nothing.
/// - One poll of taskgate's own before the callers get the ack (a server that cancels at once:
///   a client that forgets the task right after the ack finds its slot free), waited for at
///   most [`POLL_AFTER_ACK_WAIT`] (a slow upstream held every cancel up to its `timeout_ms`).
/// - A task still live then (2026-07-28 §1.6: the cancel is cooperative, the status may stay
///   non-terminal after the ack; a worker-queue server cancels a moment later) is followed off
///   the request path: polls starting at the task's `pollIntervalMs` (100 ms to 5 s), each
///   wait twice the last up to 5 s, at most [`FOLLOW_UP_POLLS`] and none starting after
///   [`FOLLOW_UP_FOR`], ending at a terminal status; each poll bounded by the upstream's
///   `timeout_ms`; at most [`MAX_FOLLOW_UPS`] at once per upstream; stopped at once when
///   taskgate shuts down (a poll in progress included) or the stack is dropped. The follow-up
///   carries no trace (the cancel it follows was answered long before).
/// - A poll answered `-32602` (taskgate's own clean `tasks/get`: the upstream no longer has
///   the task, e.g. a server that deletes a cancelled task) ends the record as a lost task
///   (`lost_task::fail_lost`): its slot is freed (review 18a #5).
///
/// Each poll's answer is applied by `observe` below; any other failure leaves the record as it
/// was.
async fn follow_after_ack<S>(state: &Arc<CancelState>, mut inner: S, mut poll: modern::PollAfterAck)
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Send + 'static,
    S::Future: Send + 'static,
{
    let registry = &state.registry;
    if ended(registry, &poll).await {
        return;
    }
    let (upstream, task_id) = poll.task();
    let first = tokio::time::timeout(POLL_AFTER_ACK_WAIT, poll_once(registry, &mut inner, &poll));
    match first.await {
        Err(_) => {
            tracing::debug!(%upstream, %task_id, "the poll after a 2026 cancel ack took too long: the ack goes out without it");
        }
        Ok(true) => return,
        Ok(false) => {}
    }
    if ended(registry, &poll).await {
        return;
    }
    let Some(slot) = FollowUp::take(&state.follow_ups) else {
        tracing::debug!(%upstream, %task_id, "{MAX_FOLLOW_UPS} cancelled tasks followed already: this one is not");
        return;
    };
    poll.untraced();
    let me = Arc::downgrade(state);
    let mut shutdown = state.shutdown.clone();
    let follow = async move {
        let started = tokio::time::Instant::now();
        let mut every = poll.interval();
        for _ in 0..FOLLOW_UP_POLLS {
            if started.elapsed() + every > FOLLOW_UP_FOR {
                break;
            }
            tokio::time::sleep(every).await;
            every = (every * 2).min(crate::mcp::task::MAX_POLL);
            // Gone: the stack was dropped (taskgate stops).
            let Some(registry) = me.upgrade().map(|s| s.registry.clone()) else {
                return;
            };
            if poll_once(&registry, &mut inner, &poll).await || ended(&registry, &poll).await {
                return;
            }
        }
        let (upstream, task_id) = poll.task();
        tracing::debug!(%upstream, %task_id, "a cancelled task is still live upstream after taskgate's follow-up");
    };
    tokio::spawn(async move {
        let _slot = slot;
        tokio::select! {
            () = follow => {}
            () = stopping(&mut shutdown) => {}
        }
    });
}

/// Resolves when taskgate shuts down (never without a shutdown signal, as in unit tests).
async fn stopping(shutdown: &mut Option<watch::Receiver<bool>>) {
    match shutdown {
        // A dropped sender: taskgate is gone too.
        Some(rx) => {
            let _ = rx.wait_for(|stopped| *stopped).await;
        }
        None => std::future::pending().await,
    }
}

/// Whether the record of the task `poll` asks about is terminal.
async fn ended(registry: &Arc<Registry>, poll: &modern::PollAfterAck) -> bool {
    let (upstream, task_id) = poll.task();
    matches!(registry.record_cached(upstream, task_id).await, Ok(Some(r)) if r.status.is_terminal())
}

/// One running follow-up of [`follow_after_ack`], counted while it lives.
struct FollowUp(Arc<AtomicUsize>);

impl FollowUp {
    /// A place among the [`MAX_FOLLOW_UPS`] of `count`, if one is free.
    fn take(count: &Arc<AtomicUsize>) -> Option<FollowUp> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_FOLLOW_UPS).then_some(n + 1)
            })
            .ok()
            .map(|_| FollowUp(count.clone()))
    }
}

impl Drop for FollowUp {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Sends one of taskgate's own `tasks/get` after a forwarded 2026-07-28 cancel and reads its
/// answer to the end (`observe`, below, applies it as it passes). Answered `-32602` (a clean
/// request: the upstream no longer has the task), the record is failed as lost and this says
/// `true`; any failure only leaves the record as it was (logged at debug).
async fn poll_once<S>(registry: &Arc<Registry>, inner: &mut S, poll: &modern::PollAfterAck) -> bool
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>,
{
    let answer = match crate::layers::own_request::ask(inner, poll.request()).await {
        Ok(Some(answer)) => answer,
        Ok(None) => return false,
        Err(e) => {
            tracing::debug!(error = %e, "taskgate's tasks/get after a forwarded cancel failed");
            return false;
        }
    };
    if lost_task::error_code(&answer) != Some(lost_task::INVALID_PARAMS) {
        return false;
    }
    let (upstream, task_id) = poll.task();
    let why = format!(
        "upstream `{upstream}` no longer has this task (after acknowledging its cancel, it answered taskgate's own `tasks/get` with -32602, task not found)"
    );
    lost_task::fail_lost(registry, upstream, task_id, "tasks/get", &why).await;
    true
}

/// The `status` of a Task object.
fn status_of(task: &RawValue) -> Option<TaskStatus> {
    #[derive(Deserialize)]
    struct Status<'a> {
        #[serde(borrow)]
        status: Option<&'a str>,
    }
    serde_json::from_str::<Status>(task.get())
        .ok()?
        .status
        .and_then(TaskStatus::parse)
}

/// A JSON-RPC `error` object (`-32603`) as text.
fn internal(message: String) -> String {
    serde_json::json!({ "code": jsonrpc::INTERNAL_ERROR, "message": message }).to_string()
}

/// Removes a `tasks/cancel` flight from the table when its future ends in any way.
struct FlightGuard {
    state: Arc<CancelState>,
    task_id: String,
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        self.state.flights.lock().remove(&self.task_id);
    }
}

#[cfg(test)]
mod tests;
