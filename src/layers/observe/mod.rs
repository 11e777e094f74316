//! The `observe` layer, innermost but for `ids` (which only keeps request ids apart): the only
//! place where what the upstream says about tasks is applied to the [`Registry`], once per
//! message (2025-11-25 basic/utilities/tasks).
//!
//! Every upstream message passes here exactly once, whoever sent the request (a client, or the
//! `upgrade` layer's own `tasks/*` requests):
//! - **Creation**: the answer to a task-augmented `tools/call` that carries a
//!   [`PendingCreation`] (set by `tasks`). A `CreateTaskResult` (JSON body or SSE event) is
//!   recorded durably **before** that message is passed on; the record is the template
//!   completed from the result's `Task` (ttl capped: see `Registry::creation_record`). When the
//!   write fails, the client gets `-32603` instead of a taskId taskgate cannot stand behind, and
//!   the task the upstream started is cancelled there: one `tasks/cancel` under an id taskgate
//!   mints, sent to the service below (the upstream), not waited for by the client, in the task's
//!   era (2025-11-25: on the upstream session the creation went out on; 2026-07-28: stateless,
//!   with `Mcp-Method`/`Mcp-Name` and the tasks extension in `_meta`), logged, and counted in
//!   `taskgate_unrecorded_task_cancels_total{outcome}` (`answered`, `failed`). Not when the
//!   store refused the record as a duplicate (`StoreError::Conflict`): that taskId names a task
//!   already recorded, maybe another owner's, which must not be cancelled. A live task a
//!   2026-07-28 server made of a plain call (its slot provisional) whose owner is at
//!   `tasks.max_live_tasks_per_owner` is not recorded either: the client gets `-32029`, the same
//!   `TaskLimitExceeded` a 2025-11-25 creation is refused with before it goes upstream, and the
//!   task is cancelled upstream the same way (once, counted in the same metric). So is a task
//!   a `CreateTaskResult` under another id than the creation's names (not the answer: the
//!   client gets `-32603`, and such an event on a stream is not passed on). An
//!   answer that is not a `CreateTaskResult` (an error, a plain result) records nothing and the
//!   owner's slot is given back; a task a notification on the creation's stream named before an
//!   error answer is cancelled upstream the same way (`Watch::cancel_orphan`). The message passes as sent but for its ttl (`show_recorded_ttl`).
//! - **Statuses**: replies to `tasks/get` and `tasks/cancel` (a Task; applied to the task the
//!   `tasks` layer authorised, [`AuthorisedTask`]), `tasks/result` payloads (the task ended:
//!   `failed` for an `isError` result), and `notifications/tasks/status` on any stream, follow the
//!   spec's transitions. A message reporting another status for a task recorded terminal is
//!   rewritten to show the recorded status (counted when it is rewritten, and logged once as a
//!   late result).
//! - **For the `bridge`** (its 2025-11-25 client's task on a 2026-07-28 server, see `bridged`):
//!   a plain result to a call carrying `PlainAnswerIsTask` is recorded as a `completed` task,
//!   which goes to the bridge in the request's `Fact`. (The bridge applies the ack to its
//!   `tasks/cancel` itself, after asking the task's status again: `cancel_ack`.)
//! - **Activity** for the "resources released" fact (`registry::releases`): progress on a task's
//!   `progressToken`, messages whose related-task `_meta` names it, status notifications.
//! - **Holds**: a `tasks/result` in flight holds its task until its reply is done; a creation's
//!   own SSE stream holds the new task while it is still relayed.
//!
//! - **Answers** (`answered`): a 2xx reply to a request must be its JSON-RPC response: a JSON
//!   body that is not (not JSON, empty, another id) is the upstream's invalid answer (502
//!   `-32603`), an SSE answer that ends without it (and cannot be resumed) gets a `-32603`
//!   event, and a second response on the stream is not passed on.
//!
//! Messages that concern none of this pass without a parse (a byte search decides) and keep
//! their bytes; a plain request's JSON answer is read once, for whether it is the answer.

mod answered;
mod bridged;
mod client_gone;
pub(crate) mod modern;
mod poll;

use modern::{show_recorded_ttl, ttl_path};
use poll::TaskView;

use crate::exchange::{
    Caller, GatewayError, McpReply, McpRequest, Operation, ReplyBody, RequestContext,
};
use crate::jsonrpc::{splice, Id, Kind, Message};
use crate::layers::after::{AfterReply, ReplyStep};
use crate::layers::extensions::{
    AuthorisedTask, Fact, PendingCreation, PlainAnswerIsTask, SynthesizedTask,
};
use crate::layers::own_request;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::needles::{self, found};
use crate::mcp::task::{now_ms, TaskStatus};
use crate::metrics::UndoOutcome;
use crate::registry::as_registry_task;
use crate::registry::in_flight::{InFlight, Settled};
use crate::registry::{Registry, ResourceHold};
use crate::sse::{ByteString, Event, EventStream};
use crate::store::{StoreError, TaskRecord};
use bytes::Bytes;
use client_gone::RunToEnd;
use futures_util::future::{BoxFuture, Either};
use parking_lot::Mutex;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Builds [`ObserveService`]s over the registry.
#[derive(Clone)]
pub struct ObserveLayer {
    registry: Arc<Registry>,
}

impl ObserveLayer {
    /// A layer applying what passes to `registry`.
    pub fn new(registry: Arc<Registry>) -> ObserveLayer {
        ObserveLayer { registry }
    }
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = ObserveService<S>;
    fn layer(&self, inner: S) -> ObserveService<S> {
        ObserveService {
            inner,
            registry: self.registry.clone(),
        }
    }
}

/// The `observe` layer's service (see the module docs).
#[derive(Clone)]
pub struct ObserveService<S> {
    inner: S,
    registry: Arc<Registry>,
}

type BoxFut<E> = Pin<Box<dyn Future<Output = Result<McpReply, E>> + Send>>;

/// Which `tasks/*` request a reply answers.
#[derive(Clone, Copy, PartialEq)]
enum ReplyTo {
    Get,
    Result,
    Cancel,
}

impl ReplyTo {
    fn source(self) -> &'static str {
        match self {
            ReplyTo::Get => "tasks/get",
            ReplyTo::Result => "tasks/result",
            ReplyTo::Cancel => "tasks/cancel",
        }
    }
}

/// An awaited `CreateTaskResult` answering `id`; `undo` cancels the task upstream when it cannot
/// be recorded.
struct Creation {
    id: Id,
    pending: PendingCreation,
    /// Boxed: it holds the request's context, and [`Expect`] is kept in every task request's
    /// future (issue 36).
    undo: Option<Box<Undo>>,
    /// The `bridge`'s [`PlainAnswerIsTask`]: a plain result is a `completed` task.
    plain: Option<Fact<SynthesizedTask>>,
    /// The creating request's span (`[telemetry]` on), given `mcp.task.id` once recorded.
    trace: Option<crate::telemetry::RequestTrace>,
    /// A creation the client asked for, counted in flight on its upstream until it is
    /// recorded or refused (`registry::in_flight`: what a notification naming its task on
    /// another stream waits for).
    in_flight: Option<InFlight>,
}

/// What the answer to the request is awaited for.
enum Expect {
    /// Nothing beyond status notifications and activity.
    Nothing,
    /// A `CreateTaskResult` ([`Creation`]).
    Creation(Creation),
    /// The reply to `tasks/get|result|cancel` about the task of `known`.
    TaskReply {
        id: Id,
        method: ReplyTo,
        /// The record `tasks` authorised the request against (shared, not copied; its `task_id`
        /// names the task).
        known: Arc<TaskRecord>,
        /// The request's era (2026-07-28 `tasks/get` answers are flat `DetailedTask`s).
        era: Era,
    },
}

impl Expect {
    fn of(req: &mut McpRequest) -> Expect {
        let Some(id) = req.id().cloned() else {
            return Expect::Nothing;
        };
        let method = match req.request_method() {
            Some("tools/call") => {
                return match req.extensions.remove::<PendingCreation>() {
                    Some(pending) => Expect::Creation(Creation {
                        id,
                        pending,
                        undo: None,
                        plain: req
                            .extensions
                            .remove::<PlainAnswerIsTask>()
                            .map(|p| p.recorded),
                        trace: req.trace.clone(),
                        in_flight: None,
                    }),
                    None => Expect::Nothing,
                }
            }
            Some("tasks/get") => ReplyTo::Get,
            Some("tasks/result") => ReplyTo::Result,
            Some("tasks/cancel") => ReplyTo::Cancel,
            _ => return Expect::Nothing,
        };
        match req.extensions.get::<AuthorisedTask>() {
            Some(a) => Expect::TaskReply {
                id,
                method,
                known: a.record.clone(),
                era: req.era(),
            },
            None => Expect::Nothing,
        }
    }

    fn id(&self) -> Option<&Id> {
        match self {
            Expect::Nothing => None,
            Expect::Creation(Creation { id, .. }) | Expect::TaskReply { id, .. } => Some(id),
        }
    }
}

impl<S> tower::Service<McpRequest> for ObserveService<S>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = McpReply;
    type Error = S::Error;
    /// For a request whose answer carries nothing to apply (not a task creation nor a task
    /// request), the inner service's own future with its SSE stream, if any, watched
    /// ([`WatchStream`]); a boxed one otherwise.
    type Future = Either<AfterReply<S::Future, WatchStream>, BoxFut<S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: McpRequest) -> Self::Future {
        let registry = self.registry.clone();
        let upstream = req.ctx.upstream.clone();
        let mut expect = Expect::of(&mut req);
        // A creation the client asked for (`params.task`: a 2025-11-25 task-augmented call,
        // also one a bridge made for its client) runs to its answer ([`RunToEnd`]). A
        // 2026-07-28 call the server may turn into a task does not: a 2026 client's disconnect
        // cancels its plain call (the exchange is dropped), as it always did.
        let runs_to_end = matches!(expect, Expect::Creation(_))
            && req.classified().is_some_and(|c| c.task().is_some());
        if let Expect::Creation(Creation {
            undo, in_flight, ..
        }) = &mut expect
        {
            *undo = Some(Box::new(Undo::new(self.inner.clone(), &req)));
            if runs_to_end {
                let session = req.ctx.session_id.as_ref().and_then(|s| s.to_str().ok());
                *in_flight = Some(registry.creations().begin(&upstream, session));
            }
        }
        if matches!(expect, Expect::Nothing) {
            let watch = WatchStream {
                registry,
                upstream,
                caller: req.ctx.caller(),
                answer: awaited_answer(&req),
                named: named_by(&req),
                // A GET stream's only (not a plain POST's: no copy on that path).
                session: match req.op {
                    Operation::OpenStream => req.ctx.session_id.clone(),
                    _ => None,
                },
            };
            return Either::Left(AfterReply::new(self.inner.call(req), watch));
        }
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let asked_about = match &expect {
            Expect::TaskReply { known, .. } => Some(known.clone()),
            _ => None,
        };
        // An open tasks/result is a resource held for its task until its reply is done.
        let request_hold = match &expect {
            Expect::TaskReply {
                method: ReplyTo::Result,
                known,
                ..
            } => Some(registry.releases().hold(&upstream, &known.task_id)),
            _ => None,
        };
        // Built here, so that the boxed future holds one pointer rather than the expectation,
        // the hold and the registry (callgrind, issue 36: that future is moved into its box on
        // every task request, and at 1,064 bytes it was past the allocator's small sizes).
        let watch = Arc::new(Watch {
            registry,
            upstream,
            expect: Mutex::new(expect),
            holds: Mutex::new(request_hold.into_iter().collect()),
            client_gone: Default::default(),
            orphan: Default::default(),
            runs_to_end,
            recorded_its_task: Default::default(),
            named: named_by(&req).map(Mutex::new),
            asked_about,
            session: req.ctx.session_id.clone(),
        });
        let caller = req.ctx.caller();
        let answer = awaited_answer(&req);
        let creation = watch.runs_to_end.then(|| watch.clone());
        let work = async move {
            // An error drops `watch` and its `expect`: a creation's reserved slot is given back.
            let mut reply = inner.call(req).await?;
            let answer = answer.filter(|_| reply.status.is_success());
            reply.body = match reply.body {
                // Only an SSE event is ever dropped (`Watch::on_message`): a JSON body stays.
                ReplyBody::Json(bytes) => {
                    let out = watch.on_message(bytes, None).await.unwrap_or_default();
                    // The one pass above took the body for the answer (the expectation is
                    // met), or it is not the answer: read again only then, to say why.
                    let unmet = watch.expect.lock().id().is_some();
                    if let (true, Some(awaited)) = (unmet, &answer) {
                        if let Err(detail) = answered::check_json(&out, &awaited.id) {
                            return Err(watch.invalid(detail));
                        }
                    }
                    ReplyBody::Json(out)
                }
                ReplyBody::Stream(events) => {
                    ReplyBody::Stream(Watch::watch(watch, events, caller, answer))
                }
                ReplyBody::Empty if answer.is_some() => {
                    return Err(watch.invalid(empty_answer(answer.as_ref().map(|a| &a.id))));
                }
                other => other,
            };
            Ok(reply)
        };
        match creation {
            Some(watch) => Either::Right(Box::pin(RunToEnd {
                work: Some(Box::pin(work)),
                watch,
            })),
            None => Either::Right(Box::pin(work)),
        }
    }
}

/// The reply to a request with nothing to expect: a JSON answer passes as it is (nothing to
/// apply); an SSE stream is watched for status notifications and activity.
#[doc(hidden)]
pub struct WatchStream {
    registry: Arc<Registry>,
    upstream: Arc<str>,
    /// Who the reply goes to (a stream's task notifications are checked against it).
    caller: Caller,
    /// The request whose answer this reply must be ([`awaited_answer`]).
    answer: Option<answered::Awaited>,
    /// What the reply may show of tasks without an owner ([`Watch::named`]).
    named: Option<Vec<Arc<str>>>,
    /// The upstream session of a GET stream ([`Watch::session`]); `None` for a POST.
    session: Option<http::HeaderValue>,
}

impl ReplyStep<GatewayError> for WatchStream {
    /// A JSON answer is read once here, for whether it is the answer ([`answered`]); a stream
    /// is watched.
    fn apply(self, mut reply: McpReply) -> Result<McpReply, GatewayError> {
        let answer = self.answer.filter(|_| reply.status.is_success());
        let fault = match (&reply.body, &answer) {
            (ReplyBody::Stream(_), _) | (_, None) => None,
            (ReplyBody::Json(bytes), Some(a)) => answered::check_plain_json(bytes, &a.id).err(),
            (ReplyBody::Empty, Some(a)) => Some(empty_answer(Some(&a.id))),
            (ReplyBody::Raw(_), Some(_)) => None,
        };
        if let Some(detail) = fault {
            return Err(answered::invalid(
                self.registry.metrics(),
                &self.upstream,
                detail,
            ));
        }
        if let ReplyBody::Stream(events) = reply.body {
            let watch = Arc::new(Watch {
                registry: self.registry,
                upstream: self.upstream,
                expect: Mutex::new(Expect::Nothing),
                holds: Mutex::new(Vec::new()),
                client_gone: Default::default(),
                orphan: Default::default(),
                runs_to_end: false,
                recorded_its_task: Default::default(),
                named: self.named.map(Mutex::new),
                asked_about: None,
                session: self.session,
            });
            reply.body = ReplyBody::Stream(Watch::watch(watch, events, self.caller, answer));
        }
        Ok(reply)
    }
}

/// What the reply to `req` must answer, when `req` is a request (a client's response or
/// notification is answered 202, with no message): its id ([`answered`]).
///
/// Not `subscriptions/listen` (2026-07-28 §2.3: the one long-lived stream): it ends with its
/// connection, an upstream restart included, and was never meant to be answered; an error
/// event there was a false "invalid answer" for every listener (review 17).
fn awaited_answer(req: &McpRequest) -> Option<answered::Awaited> {
    match &req.op {
        Operation::Post(msg)
            if msg.kind() == Kind::Request && msg.method() != Some("subscriptions/listen") =>
        {
            msg.id().map(|id| answered::Awaited {
                id: id.clone(),
                may_resume: req.era() == Era::Legacy,
            })
        }
        _ => None,
    }
}

/// What is wrong with an empty 2xx answer to request `id`.
fn empty_answer(id: Option<&Id>) -> String {
    format!(
        "its answer to request id {} has an empty body",
        id.map_or("null", Id::as_json)
    )
}

/// An SSE reply as [`Watch`] relays it: every event passes [`Watch::on_event`] once, in order.
/// Most events (progress, logging, results of ordinary calls) concern nothing here: they are
/// decided by a byte search and passed on in the same poll, without a copy, a parse or a future.
struct Watched {
    watch: Arc<Watch>,
    events: EventStream,
    /// Who the stream goes to ([`Caller::kept_for_streams`]).
    caller: Arc<Caller>,
    /// The upstream's stream ended (it is not read again: see `client_gone`).
    ended: bool,
    /// The event being applied (`None` once applied: dropped); the next one is read only after
    /// it.
    applying: Option<Pin<Box<dyn Future<Output = Relay> + Send>>>,
    /// Task notifications held until the creation is answered ([`Relay::Hold`]), at most
    /// [`MAX_HELD_EVENTS`] (more are dropped).
    held: std::collections::VecDeque<Event>,
    /// The request this stream answers (`None`: a GET stream, or a stream the transport cut):
    /// its first response passes, a later one does not, and a stream that ends without one
    /// gets a `-32603` event for it ([`answered`]) unless it may be resumed.
    answer: Option<answered::Awaited>,
    /// The response to `answer` has passed.
    answered: bool,
    /// An event with an SSE `id` passed on a stream whose era lets the client resume it (GET
    /// with `Last-Event-ID`): its end before the response is not an invalid answer.
    resumable: bool,
    /// The event being applied went to `on_message` while the expectation awaited the answer:
    /// once applied, a met expectation means it was the answer.
    applying_awaited: bool,
}

/// What a reply to `req` may show of tasks without an owner ([`Watch::named`]): `None` (not
/// scoped) for a request that does not go upstream as 2026-07-28 (a 2025 stream keeps the
/// owner rule, and the reverse bridge's own GET stream of its held session feeds listeners the
/// bridge scopes itself); else the `params.notifications.taskIds` of a `subscriptions/listen`
/// (as the `tasks` layer filtered them to the caller's tasks), empty for any other request.
/// Read only for that method (one long-lived stream per listener): other requests pay a
/// comparison of the era and the method.
fn named_by(req: &McpRequest) -> Option<Vec<Arc<str>>> {
    if req.era() != Era::Modern {
        return None;
    }
    if req.request_method() != Some("subscriptions/listen") {
        return Some(Vec::new());
    }
    let Operation::Post(msg) = &req.op else {
        return Some(Vec::new());
    };
    const PATH: [&str; 3] = ["params", "notifications", "taskIds"];
    let Ok(Some(raw)) = splice::raw_at(msg.bytes(), &PATH) else {
        return Some(Vec::new());
    };
    let ids = serde_json::from_str::<Vec<Value>>(raw.get()).unwrap_or_default();
    Some(
        ids.iter()
            .filter_map(Value::as_str)
            .map(Arc::from)
            .collect(),
    )
}

/// Whether a message may be a task notification (`notifications/tasks/status`, 2025-11-25, or
/// `notifications/tasks`, 2026-07-28). Escapes may spell either method
/// (`notifications\/tasks\/status`): then it is read. One search where neither method is named
/// (nearly always): `TASKS_METHODS` is found in every message either is (callgrind, issue 36:
/// ~190 instructions a message).
#[inline]
fn is_task_notification(bytes: &[u8]) -> bool {
    (found(&needles::TASKS_METHODS, bytes)
        && (found(&needles::TASK_STATUS, bytes) || found(&needles::TASKS_NOTIFICATION, bytes)))
        || needles::may_hide_names(bytes)
}

/// Most task notifications one creation's stream holds until its answer.
const MAX_HELD_EVENTS: usize = 16;

/// What becomes of one event of a watched stream ([`Watch::on_event`]).
enum Relay {
    /// Passed on (rewritten if needed).
    Pass(Event),
    /// Not passed on ([`Watch::shown_to`]).
    Drop,
    /// Held until the stream's creation is answered ([`Watch::names_a_task_to_hold`]).
    Hold(Event),
}

impl futures_util::Stream for Watched {
    type Item = Event;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let this = self.get_mut();
        loop {
            if let Some(applying) = this.applying.as_mut() {
                let relay = std::task::ready!(applying.as_mut().poll(cx));
                this.applying = None;
                if std::mem::take(&mut this.applying_awaited)
                    && this.watch.expect.lock().id().is_none()
                {
                    // `on_message` took it for the answer (break-edge F4: the next is not).
                    this.answered = true;
                }
                match relay {
                    Relay::Pass(event) => return Poll::Ready(Some(event)),
                    // Dropped (`Watch::on_event`): the next one.
                    Relay::Drop => continue,
                    Relay::Hold(event) => {
                        if this.held.len() < MAX_HELD_EVENTS {
                            this.held.push_back(event);
                        } else {
                            // Passed on, it would name the task before its record (review 17,
                            // #4): dropped, as a status notification may be.
                            tracing::debug!(upstream = %this.watch.upstream, "more task notifications before a creation's answer than are held: dropped");
                        }
                        continue;
                    }
                }
            }
            // Held events go on once the creation was answered (or the stream ended without
            // its answer), in their order, no longer held.
            if !this.held.is_empty() && (this.ended || !this.watch.awaits_creation()) {
                if let Some(event) = this.held.pop_front() {
                    let caller = this.caller.clone();
                    let relay = this.watch.clone().on_event(event, caller, false);
                    this.applying = Some(Box::pin(relay));
                    continue;
                }
            }
            if this.ended {
                if let (Some(a), false, false) = (&this.answer, this.answered, this.resumable) {
                    // Ended without the answer (break-edge F3): a -32603 event for it, once.
                    this.answered = true;
                    let (metrics, upstream) = (this.watch.registry.metrics(), &this.watch.upstream);
                    return Poll::Ready(Some(answered::unanswered_event(metrics, upstream, &a.id)));
                }
                return Poll::Ready(None);
            }
            let Some(event) = std::task::ready!(this.events.as_mut().poll_next(cx)) else {
                this.ended = true;
                continue;
            };
            // The transport cut the stream (the client's connection is aborted): nothing more.
            if event.is_abort() {
                this.answer = None;
                return Poll::Ready(Some(event));
            }
            // Awaited by the expectation, the answer is found by `on_message`'s one pass.
            let awaited = this.watch.expect.lock().id().is_some();
            if let Some(a) = &this.answer {
                this.resumable |= a.may_resume && event.id.as_ref().is_some_and(|i| !i.is_empty());
            }
            if let (Some(a), Some(data)) = (&this.answer, event.data.as_ref()) {
                let id = &a.id;
                if this.answered {
                    if answered::answers(data.as_bytes(), id) {
                        // The transport's own error event (an oversized event after the answer)
                        // was counted where it was made (review 17 #10).
                        if !event.is_transport_error() {
                            let (metrics, upstream) =
                                (this.watch.registry.metrics(), &this.watch.upstream);
                            answered::dropped_second_answer(metrics, upstream, id);
                        }
                        continue;
                    }
                } else if !awaited && answered::answers(data.as_bytes(), id) {
                    this.answered = true;
                }
            }
            if !this.watch.cares_about(&event) {
                return Poll::Ready(Some(event));
            }
            this.applying_awaited = awaited && this.answer.is_some() && !this.answered;
            let caller = this.caller.clone();
            let relay = this.watch.clone().on_event(event, caller, true);
            this.applying = Some(Box::pin(relay));
        }
    }
}

/// What [`Watch::envelope_step`] found a message to call for.
enum Step {
    /// Nothing to apply: the message passes as it is.
    Done(Bytes),
    /// A `notifications/tasks/status` (2025-11-25), read.
    StatusNotification(Bytes, Value),
    /// A `notifications/tasks` (2026-07-28), read.
    TasksNotification(Bytes, Value),
    /// The answer to an awaited creation (`response`: a result, not an error).
    Creation {
        bytes: Bytes,
        response: bool,
        creation: Creation,
    },
    /// A `CreateTaskResult` under another id than the awaited creation's (not its answer): the
    /// task it names is cancelled upstream with `undo`, a copy of the creation's, which stays.
    StrayCreation {
        bytes: Bytes,
        task_id: String,
        era: Era,
        undo: Undo,
    },
    /// The answer to a `tasks/get|result|cancel` about `known`'s task (`parsed`: the message as
    /// a `Value` when it was read for a status or activity).
    TaskReply {
        bytes: Bytes,
        parsed: Option<Value>,
        method: ReplyTo,
        known: Arc<TaskRecord>,
        era: Era,
    },
}

/// Watches one reply (a JSON message, or an SSE stream event by event).
struct Watch {
    registry: Arc<Registry>,
    upstream: Arc<str>,
    expect: Mutex<Expect>,
    /// Resources held for tasks while this reply is relayed (dropped with the reply).
    holds: Mutex<Vec<ResourceHold>>,
    /// The creation was answered with an error on its stream: its [`Undo`] and era, to cancel
    /// upstream the task a held notification named before that answer ([`Watch::cancel_orphan`]).
    /// Boxed: an `Undo` is ~250 bytes, and every `Watch` (each creation, `tasks/get`,
    /// `tasks/result`) would carry them for this rare case (review 19).
    orphan: Mutex<Option<Box<(Undo, Era)>>>,
    /// The client went away before the creation's answer was relayed ([`RunToEnd`]).
    client_gone: std::sync::atomic::AtomicBool,
    /// A creation the client asked for: it runs to its answer if the client goes away
    /// ([`RunToEnd`], and the drop of [`Watched`]).
    runs_to_end: bool,
    /// The creation's answer was a `CreateTaskResult` taskgate recorded ([`Watch::created`]):
    /// a held notification still naming an unrecorded task is about another task, which may be
    /// another creation's of the same session ([`Watch::on_event`]).
    recorded_its_task: std::sync::atomic::AtomicBool,
    /// For a request that went upstream as 2026-07-28 ([`named_by`]), the tasks it named (a
    /// `subscriptions/listen`'s `taskIds` as `tasks` filtered them) or created; with
    /// [`Watch::asked_about`], the only ones whose notifications reach the caller when neither
    /// the task nor the caller has an owner ([`Watch::shows`]). `None`: the owner rule alone.
    named: Option<Mutex<Vec<Arc<str>>>>,
    /// The task a `tasks/*` request is about (the record `tasks` authorised it against).
    asked_about: Option<Arc<TaskRecord>>,
    /// The upstream session the reply comes on, when known (a task request's, a GET
    /// stream's): a notification about an unrecorded task waits only for that session's
    /// creations in flight (`registry::in_flight`); `None`: for the upstream's.
    session: Option<http::HeaderValue>,
}

impl Watch {
    /// `events` watched; `answer`: the id of the request they answer ([`Watched::answer`]).
    fn watch(
        this: Arc<Watch>,
        events: EventStream,
        caller: Caller,
        answer: Option<answered::Awaited>,
    ) -> EventStream {
        Box::pin(Watched {
            watch: this,
            events,
            caller: Arc::new(caller.kept_for_streams()),
            ended: false,
            applying: None,
            held: Default::default(),
            answer,
            answered: false,
            resumable: false,
            applying_awaited: false,
        })
    }

    /// The invalid answer `detail` describes, counted ([`answered::invalid`]).
    fn invalid(&self, detail: String) -> GatewayError {
        answered::invalid(self.registry.metrics(), &self.upstream, detail)
    }

    /// `rewritten` (the message shown with a recorded terminal status instead of the one the
    /// upstream reported), counted in `taskgate_task_terminal_rewrites_total`; `bytes`, as they
    /// came, when nothing was rewritten (not counted).
    fn shown_recorded(&self, rewritten: Option<Bytes>, bytes: Bytes) -> Bytes {
        match rewritten {
            Some(out) => {
                self.registry
                    .metrics()
                    .task_terminal_rewrite(&self.upstream);
                out
            }
            None => bytes,
        }
    }

    /// Whether `event` may concern this watch (see [`Watch::cares`]).
    fn cares_about(&self, event: &Event) -> bool {
        event
            .data
            .as_ref()
            .is_some_and(|d| self.cares(d.as_bytes()))
    }

    /// Applies an event that [`Watch::cares_about`]: passed on, rewritten if needed; dropped
    /// when it must not reach the client ([`Watch::shown_to`]); or, when `may_hold` (a new
    /// event), held until this reply's creation is answered ([`Watch::names_a_task_to_hold`]).
    /// An event released from hold (`may_hold` false) that still names a task neither recorded
    /// nor refused is dropped: the creation was answered without recording it (an error, a
    /// plain result, a refusal; or the stream ended), so it names a task no client may learn
    /// (review 17 #4: an error answer let it through). Only when the answer recorded this
    /// creation's task and another creation is in flight on the stream's upstream session is
    /// it about that one's task, perhaps: it goes the normal way ([`Watch::unrecorded_shown`]
    /// waits for that creation to settle), as before it was held (review 18b #9).
    async fn on_event(
        self: Arc<Self>,
        mut event: Event,
        caller: Arc<Caller>,
        may_hold: bool,
    ) -> Relay {
        let Some(data) = event.data.as_ref() else {
            return Relay::Pass(event);
        };
        // The event's own bytes (shared, not copied).
        let original = data.as_bytes().clone();
        if may_hold && self.awaits_creation() && is_task_notification(&original) {
            if Box::pin(self.names_a_task_to_hold(&original)).await {
                return Relay::Hold(event);
            }
        } else if !may_hold
            && Box::pin(self.names_a_task_to_hold(&original)).await
            && !self.another_creation_in_flight()
        {
            tracing::debug!(upstream = %self.upstream, "a held notification names a task its creation did not record: dropped");
            self.cancel_orphan(&original);
            return Relay::Drop;
        }
        let Some(bytes) = self.on_message(original.clone(), Some(&caller)).await else {
            return Relay::Drop;
        };
        if bytes != original {
            event.data = Some(
                ByteString::try_from(bytes.clone())
                    .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned().into()),
            );
        }
        Relay::Pass(event)
    }

    /// Whether a task notification on the stream of a creation still awaited names a task that
    /// is neither recorded nor refused: the server reporting its new task before the
    /// `CreateTaskResult` (server-everything sends `working` first). Such an event is held
    /// until the answer passed, so the client never learns a `taskId` before it is recorded
    /// (break-tasks H4), then passed as its record says (or dropped, refused).
    async fn names_a_task_to_hold(&self, bytes: &[u8]) -> bool {
        let Ok(value) = serde_json::from_slice::<Value>(bytes) else {
            return false;
        };
        let Some(task_id) = value.pointer("/params/taskId").and_then(Value::as_str) else {
            return false;
        };
        matches!(
            value.get("method").and_then(Value::as_str),
            Some("notifications/tasks/status" | "notifications/tasks")
        ) && !self
            .registry
            .creations()
            .was_refused(&self.upstream, task_id)
            && matches!(
                self.registry.record_cached(&self.upstream, task_id).await,
                Ok(None)
            )
    }

    /// Whether a message may concern this watch: a status or task-related message, or (while
    /// the answer is awaited) any message.
    /// (A superset is fine: `on_message` decides exactly, so `notifications/tasks` stands for
    /// both status notifications in one search.)
    fn cares(&self, bytes: &[u8]) -> bool {
        self.expect.lock().id().is_some()
            || needles::may_name(&needles::TASKS_METHODS, bytes)
            || self.is_activity(bytes)
    }

    fn is_activity(&self, bytes: &[u8]) -> bool {
        self.registry.releases().awaits_activity()
            && (needles::may_name(&needles::PROGRESS, bytes)
                || found(&needles::RELATED_TASK, bytes))
    }

    /// Applies one JSON-RPC message of the reply; returns it, rewritten if needed, or `None` for
    /// a task notification that must not reach the client (only in a stream: `stream` is the
    /// caller the SSE stream goes to, [`Watch::shown_to`]; `None` for a JSON body).
    async fn on_message(self: &Arc<Self>, bytes: Bytes, stream: Option<&Caller>) -> Option<Bytes> {
        let in_stream = stream.is_some();
        let is_status = is_task_notification(&bytes);
        let is_activity = self.is_activity(&bytes);
        let waiting_for = self.expect.lock().id().cloned();
        if !is_status && !is_activity && waiting_for.is_none() {
            return Some(bytes);
        }
        if !is_status && !is_activity {
            if let Some(out) = self.on_get_answer(&bytes).await {
                return Some(out);
            }
            if let Some(out) = self.on_payload_answer(&bytes).await {
                return Some(out);
            }
            // Boxed, as the other creation paths below: a creation comes once per task, and its
            // future (~3,000 bytes) inline made every request's future as large (issue 36).
            if let Some(out) = Box::pin(self.on_creation_answer(&bytes, in_stream)).await {
                return Some(out);
            }
        }
        self.on_envelope(bytes, is_status, is_activity, waiting_for, stream)
            .await
    }

    /// The envelope path of [`Watch::on_message`]: the message read ([`Watch::envelope_step`]),
    /// then what it calls for applied. Only small values are held across an await here, and the
    /// rare paths' futures are boxed: the message, the expectation and those futures inline made
    /// every request's future larger (issue 36: `ObserveService::call`'s boxed future was 4,896
    /// bytes, moved into its box on every task request).
    async fn on_envelope(
        &self,
        bytes: Bytes,
        is_status: bool,
        is_activity: bool,
        waiting_for: Option<Id>,
        stream: Option<&Caller>,
    ) -> Option<Bytes> {
        let in_stream = stream.is_some();
        let out = match self.envelope_step(bytes, is_status, is_activity, waiting_for) {
            Step::Done(bytes) => bytes,
            // A task notification as a JSON body (where the one response belongs) is never
            // applied: no caller's stream to check it against, and it is not the answer (the
            // caller gets the invalid-answer error, `answered::check_json`). Applied, another
            // owner's task took the status an upstream reported in bob's reply (review 16, R2).
            Step::StatusNotification(bytes, _) | Step::TasksNotification(bytes, _)
                if stream.is_none() =>
            {
                bytes
            }
            Step::StatusNotification(bytes, value) => {
                return Box::pin(self.on_status_notification(bytes, value, stream)).await;
            }
            Step::TasksNotification(bytes, value) => {
                return Box::pin(self.on_tasks_notification(bytes, value, stream)).await;
            }
            Step::StrayCreation {
                bytes,
                task_id,
                era,
                undo,
            } => {
                // Only a task taskgate never recorded: a recorded one may be another client's
                // live task, which an upstream mixing up its answers names here (review 18b #1;
                // as a taskId the upstream reuses is not cancelled either, break-tasks L4).
                let recorded = self.registry.record_cached(&self.upstream, &task_id).await;
                if matches!(recorded, Ok(None)) {
                    undo.cancel(&self.registry, era, task_id, UndoReason::WrongId);
                }
                // A JSON body stays: it is refused as an answer under another id (502). An
                // event is dropped: it would name a task never recorded.
                return (!in_stream).then_some(bytes);
            }
            Step::Creation {
                bytes,
                response,
                creation,
            } => Box::pin(self.on_creation_reply(bytes, response, creation, in_stream)).await,
            Step::TaskReply {
                bytes,
                parsed,
                method,
                known,
                era,
            } => {
                let task_id = &known.task_id;
                let out = if era == Era::Modern {
                    self.on_modern_task_reply(bytes, parsed, method, task_id, &known)
                        .await
                } else {
                    // Boxed: the `Value` path, seldom taken (the common answers are read by
                    // `on_get_answer` and `on_payload_answer`).
                    Box::pin(self.on_task_reply(bytes, parsed, method, task_id, &known)).await
                };
                match method {
                    ReplyTo::Get => show_recorded_ttl(out, ttl_path(era, false), &known),
                    _ => out,
                }
            }
        };
        Some(out)
    }

    /// Reads a message for [`Watch::on_envelope`] (no await): what to apply, with what it needs.
    fn envelope_step(
        &self,
        bytes: Bytes,
        is_status: bool,
        is_activity: bool,
        waiting_for: Option<Id>,
    ) -> Step {
        let Ok(msg) = Message::parse(bytes.clone()) else {
            return Step::Done(bytes);
        };
        // One parse serves the activity note, the status update and the reply's handling below
        // (a tasks/get answer was parsed twice before: about 10,000 instructions each).
        let mut parsed = None;
        if is_status || is_activity {
            let value = serde_json::from_slice::<Value>(&bytes).ok().or_else(|| {
                // A legacy status notification nested too deep for serde_json: its `Task`
                // still applies (`lenient_value`; a 2026 one is read as before).
                (msg.method() == Some("notifications/tasks/status"))
                    .then(|| lenient_value(&bytes))
                    .flatten()
            });
            if let Some(value) = value {
                self.registry.note_activity_in(&self.upstream, &value);
                if msg.method() == Some("notifications/tasks/status") {
                    return Step::StatusNotification(bytes, value);
                }
                if msg.method() == Some("notifications/tasks") {
                    return Step::TasksNotification(bytes, value);
                }
                parsed = Some(value);
            }
        }
        let answers = waiting_for.is_some()
            && msg.id() == waiting_for.as_ref()
            && matches!(msg.kind(), Kind::Response | Kind::Error);
        if !answers {
            // A response under another id while a creation is awaited (rare: the upstream
            // answered under an id it was not sent).
            if waiting_for.is_some() && msg.kind() == Kind::Response {
                if let Some((task_id, era, undo)) = self.stray_creation(&bytes, parsed) {
                    return Step::StrayCreation {
                        bytes,
                        task_id,
                        era,
                        undo,
                    };
                }
            }
            return Step::Done(bytes);
        }
        let response = msg.kind() == Kind::Response;
        let expect = std::mem::replace(&mut *self.expect.lock(), Expect::Nothing);
        match expect {
            Expect::Creation(creation) => Step::Creation {
                bytes,
                response,
                creation,
            },
            Expect::TaskReply {
                method, known, era, ..
            } => Step::TaskReply {
                bytes,
                parsed,
                method,
                known,
                era,
            },
            Expect::Nothing => Step::Done(bytes),
        }
    }

    /// The answer to an awaited creation (`response`: a result, not an error), read on the
    /// envelope path: the bridge's task call's plain result is a completed task (`bridged`);
    /// any other answer is read as a creation, from the one parse.
    async fn on_creation_reply(
        &self,
        bytes: Bytes,
        response: bool,
        creation: Creation,
        in_stream: bool,
    ) -> Bytes {
        // `_in_flight` is given back at the end, once the task is recorded or refused.
        let Creation {
            id,
            pending,
            undo,
            plain,
            trace,
            in_flight: _in_flight,
        } = creation;
        let mut parsed = None;
        if let (Some(recorded), true) = (&plain, response) {
            match self.on_plain_answer(&bytes, &id, &pending, recorded).await {
                Ok(out) => return out,
                Err(value) => parsed = value,
            }
        }
        let undo = undo.map(|u| *u);
        if let (Some(undo), false, true) = (&undo, response, in_stream) {
            // Nothing is recorded: a task the stream named before this error was started by
            // this creation (`cancel_orphan`, when a held notification naming it is released).
            *self.orphan.lock() = Some(Box::new((undo.clone(), pending.template.era)));
        }
        let (out, created) = self.on_creation(bytes, parsed, &id, pending, undo).await;
        self.created(out, created, trace.as_ref(), in_stream)
    }

    /// The answer to an awaited 2025-11-25 `tasks/get`, read and applied in one pass over its
    /// bytes ([`TaskView::of_answer`]); `None` (nothing done) for any other message, which then
    /// takes the envelope path.
    async fn on_get_answer(&self, bytes: &Bytes) -> Option<Bytes> {
        // Read under the lock (no await), so nothing awaited is copied out of it.
        let (task, known) = {
            let mut expect = self.expect.lock();
            let Expect::TaskReply {
                id,
                method: ReplyTo::Get,
                known,
                era: Era::Legacy,
                ..
            } = &*expect
            else {
                return None;
            };
            let task = TaskView::of_answer(bytes, id)?;
            if task.names_another(&known.task_id) {
                let out = self.foreign_answer("tasks/get", &known.task_id, Some(id));
                *expect = Expect::Nothing;
                return Some(out);
            }
            let known = known.clone();
            // The answer: nothing more is awaited (as `on_message` does).
            *expect = Expect::Nothing;
            (task, known)
        };
        let out = self
            .apply_get(bytes.clone(), &task, &known.task_id, &known)
            .await;
        // The answer as it came, whose ttl the reader saw to need no change: passed as it is
        // (what `show_recorded_ttl` decides, without its search: ~1,000 instructions a poll).
        let unchanged = out.as_ptr() == bytes.as_ptr() && out.len() == bytes.len();
        if unchanged && task.shows_recorded_ttl(known.ttl_ms) {
            return Some(out);
        }
        Some(show_recorded_ttl(out, ttl_path(Era::Legacy, false), &known))
    }

    /// The answer to an awaited 2025-11-25 `tasks/result` of a task authorised as terminal,
    /// read in one pass ([`poll::payload_of_answer`]): its payload kept in the record once (as
    /// `on_task_reply` keeps it), the message passed as it came. `None` (nothing done) for any
    /// other message, which then takes the envelope path.
    async fn on_payload_answer(&self, bytes: &Bytes) -> Option<Bytes> {
        let (raw, known) = {
            let mut expect = self.expect.lock();
            let Expect::TaskReply {
                id,
                method: ReplyTo::Result,
                known,
                era: Era::Legacy,
            } = &*expect
            else {
                return None;
            };
            if !known.status.is_terminal() {
                return None;
            }
            let raw = poll::payload_of_answer(bytes, id)?;
            let known = known.clone();
            if known.status == TaskStatus::Cancelled {
                // Nothing more is awaited: the answer is replaced.
                let id = id.clone();
                *expect = Expect::Nothing;
                return Some(cancelled_has_no_result(&known.task_id, Some(&id)));
            }
            // The answer: nothing more is awaited (as `on_message` does).
            *expect = Expect::Nothing;
            (raw, known)
        };
        if known.terminal_result.is_none() {
            // Boxed: once per task (see `apply_get`).
            let upstream = &self.upstream;
            let raw = raw.to_string();
            Box::pin(
                self.registry
                    .store_terminal_result(upstream, &known.task_id, None, raw),
            )
            .await;
        }
        Some(bytes.clone())
    }

    /// The answer to an awaited 2025-11-25 task-augmented `tools/call` (not the bridge's),
    /// read in one pass ([`poll::creation_of_answer`]: its envelope and `result.task`, the only
    /// part read into a `Value`) and recorded as `on_creation` records it. `None` (nothing
    /// done) for any other message, which then takes the envelope path.
    async fn on_creation_answer(&self, bytes: &Bytes, in_stream: bool) -> Option<Bytes> {
        // Read under the lock (no await): the record is made there, from the template.
        let record = {
            let expect = self.expect.lock();
            let Expect::Creation(Creation {
                id,
                pending,
                plain: None,
                ..
            }) = &*expect
            else {
                return None;
            };
            if pending.template.era != Era::Legacy {
                return None;
            }
            let template = &pending.template;
            poll::creation_of_answer(bytes, id, |task| {
                self.registry.creation_record_of(template, task)
            })?
        };
        // No record made: a `CreateTaskResult` in the other era's shape, or a nested one no
        // record can be made of (no string taskId), takes the envelope path, which refuses it
        // (`on_creation`); a plain result (with `content`) passes below.
        if record.is_none()
            && (found(&needles::TASK_KEY, bytes) || found(&needles::UNICODE_ESCAPE, bytes))
            && serde_json::from_slice::<Value>(bytes).ok().and_then(|v| {
                v.get("result").map(|r| {
                    other_era_creation(Era::Legacy, r).is_some()
                        || (r.get("content").is_none()
                            && r.get("task").is_some_and(Value::is_object))
                })
            }) == Some(true)
        {
            return None;
        }
        // `_in_flight` is given back at the end, once the task is recorded or refused.
        let Expect::Creation(Creation {
            id,
            pending,
            undo,
            trace,
            in_flight: _in_flight,
            ..
        }) = std::mem::replace(&mut *self.expect.lock(), Expect::Nothing)
        else {
            return None;
        };
        let (out, created) = self
            .record_task(bytes.clone(), record, &id, pending, undo.map(|u| *u))
            .await;
        Some(self.created(out, created, trace.as_ref(), in_stream))
    }

    /// After a creation was handled: the span learns the recorded taskId, the watch notes that
    /// its task was recorded ([`Watch::another_creation_in_flight`]), and a creation answered
    /// on its own stream holds the new task while that stream is relayed.
    fn created(
        &self,
        out: Bytes,
        created: Option<String>,
        trace: Option<&crate::telemetry::RequestTrace>,
        in_stream: bool,
    ) -> Bytes {
        if let (Some(trace), Some(task_id)) = (trace, &created) {
            trace.set(crate::telemetry::task_id_attribute(task_id.as_str().into()));
        }
        if created.is_some() {
            self.recorded_its_task
                .store(true, std::sync::atomic::Ordering::Release);
        }
        if let (Some(task_id), true) = (created, in_stream) {
            // The creation's own stream relays the task's messages from now on.
            let hold = self.registry.releases().hold(&self.upstream, &task_id);
            self.holds.lock().push(hold);
            if let Some(named) = &self.named {
                named.lock().push(Arc::from(task_id));
            }
        }
        out
    }

    /// Applies a 2025-11-25 `tasks/get` answer read into `task`: nothing when it repeats what
    /// `known` holds (see the `Value` path's `would_change` in `on_task_reply` for why that is
    /// enough), else the report, and the answer rewritten if it contradicts a terminal record.
    async fn apply_get(
        &self,
        bytes: Bytes,
        task: &TaskView<'_>,
        task_id: &str,
        known: &TaskRecord,
    ) -> Bytes {
        let fields = task.fields();
        if !Registry::would_change_fields(known, &fields) {
            return bytes;
        }
        // Boxed: a poll that reports a change is the rare one, and the store's future inline
        // made every request's future larger by its size (issue 36: the boxed future of
        // `ObserveService::call` was 4,896 bytes, moved into its box on every task request).
        let source = ReplyTo::Get.source();
        let observed =
            Box::pin(
                self.registry
                    .observe_fields_as(&self.upstream, task_id, &fields, source),
            )
            .await;
        self.shown_recorded(observed.rewrite_bytes(&bytes, &["result"]), bytes)
    }

    async fn on_status_notification(
        &self,
        bytes: Bytes,
        value: Value,
        stream: Option<&Caller>,
    ) -> Option<Bytes> {
        let Some(params) = value.get("params") else {
            return Some(bytes);
        };
        if let Some(caller) = stream {
            if !self.shown_to(caller, params).await {
                return None;
            }
        }
        let observed = self
            .registry
            .observe_task(&self.upstream, params.clone(), "notifications/tasks/status")
            .await;
        Some(self.shown_recorded(observed.rewrite_bytes(&bytes, &["params"]), bytes))
    }

    /// Whether a task notification (`task`: its `params`, a `Task` or `DetailedTask`) on a stream
    /// to `caller` may reach it, and be applied: not when the task it names is recorded for
    /// another caller ([`Caller::may_see`]) or expired. An upstream that reports more than this
    /// caller asked for showed another owner's status and result to a caller refused its
    /// `tasks/get`, and had it applied to a record on a report its owner never got (break-edge
    /// F1). One whose record could not be read does not pass either (the failure is logged).
    ///
    /// A notification about a task not recorded (yet) waits for the creations in flight on
    /// its upstream ([`Watch::unrecorded_shown`]): the task a server reports before its
    /// `CreateTaskResult` was recorded is then shown as its record says (break-tasks H4); one
    /// taskgate refused or never recorded, and cancelled upstream, is not shown at all.
    async fn shown_to(&self, caller: &Caller, task: &Value) -> bool {
        let Some(task_id) = task.get("taskId").and_then(Value::as_str) else {
            return true;
        };
        let shown = match self.registry.record_cached(&self.upstream, task_id).await {
            Ok(Some(r)) => self.shows(caller, &r),
            Ok(None) => Box::pin(self.unrecorded_shown(caller, task_id)).await,
            Err(_) => false,
        };
        if !shown {
            tracing::debug!(
                upstream = %self.upstream,
                task_id,
                "a notification about another caller's task, or a refused one, is not passed on"
            );
        }
        shown
    }

    /// [`Watch::shown_to`] of a task not recorded: not a task taskgate cancelled upstream
    /// unrecorded (over `tasks.max_live_tasks_per_owner`, its client gone, its record not
    /// written). On another stream than a creation's own, it first waits (at most
    /// `in_flight::SETTLE_WAIT`) until the task is recorded, refused, or no creation is in
    /// flight on the upstream: the TypeScript SDK 1.x server sends a quick task's `completed`
    /// on the GET stream while its `CreateTaskResult` is being recorded. A creation's own
    /// stream does not wait (its own creation is in flight: its events are held instead,
    /// [`Watched`]). A task neither recorded nor refused passes, as it always did (a task
    /// created past taskgate, or one of an older refusal).
    async fn unrecorded_shown(&self, caller: &Caller, task_id: &str) -> bool {
        let creations = self.registry.creations();
        if self.awaits_creation() {
            // Its own creation in flight: what was held names a task never recorded when the
            // stream ended without the answer (review 17, #4), or a refused one.
            return false;
        }
        let recorded = || async {
            matches!(
                self.registry.record_cached(&self.upstream, task_id).await,
                Ok(Some(_)) | Err(_)
            )
        };
        let session = self.session.as_ref().and_then(|s| s.to_str().ok());
        match creations
            .settle(&self.upstream, session, task_id, recorded)
            .await
        {
            Settled::Refused | Settled::InFlightElsewhere => false,
            Settled::Unrecorded => true,
            Settled::Recorded => match self.registry.record_cached(&self.upstream, task_id).await {
                Ok(Some(r)) => self.shows(caller, &r),
                Ok(None) => true,
                Err(_) => false,
            },
        }
    }

    /// Whether a notification about the task of `record` may reach `caller` on this reply: the
    /// caller may see its owner ([`Caller::may_see`]), it has not expired, and a task without
    /// an owner (2026-07-28 without auth: the unguessable `taskId` is the only key) is one
    /// this reply's request named or created, when that request went upstream as 2026-07-28
    /// ([`Watch::named`]). Without that last rule, an
    /// upstream that sent every listener every task's notification handed each anonymous
    /// caller the others' ids and results (review 16, R4).
    fn shows(&self, caller: &Caller, record: &TaskRecord) -> bool {
        caller.may_see(&record.owner)
            && !record.is_expired(now_ms())
            && (record.owner != crate::store::Owner::Anonymous
                || self
                    .asked_about
                    .as_ref()
                    .is_some_and(|a| a.task_id == record.task_id)
                || self
                    .named
                    .as_ref()
                    .is_none_or(|named| named.lock().iter().any(|n| **n == *record.task_id)))
    }

    /// The task a `CreateTaskResult` under another id than the awaited creation's names (`bytes`,
    /// a response; `parsed`: it as a `Value` when already read), in the creation's era's shape,
    /// with that era and a copy of the creation's [`Undo`]; `None` when no creation is awaited,
    /// it has no `Undo`, or `bytes` is no `CreateTaskResult` naming a string taskId.
    fn stray_creation(&self, bytes: &Bytes, parsed: Option<Value>) -> Option<(String, Era, Undo)> {
        let era = match &*self.expect.lock() {
            Expect::Creation(Creation {
                pending,
                undo: Some(_),
                ..
            }) => pending.template.era,
            _ => return None,
        };
        let value = parsed.or_else(|| serde_json::from_slice::<Value>(bytes).ok())?;
        let result = value.get("result")?;
        let task_id = match era {
            Era::Legacy => result.pointer("/task/taskId"),
            Era::Modern => result
                .get("taskId")
                .filter(|_| result.get("resultType").and_then(Value::as_str) == Some("task")),
        }
        .and_then(Value::as_str)?
        .to_string();
        match &*self.expect.lock() {
            Expect::Creation(Creation {
                undo: Some(undo), ..
            }) => Some((task_id, era, Undo::clone(undo))),
            _ => None,
        }
    }

    /// Whether this creation's answer recorded its task and another creation is in flight on
    /// the stream's upstream session (the session's own `in_flight` guard is given back once
    /// its task is recorded, before any held event is released): what a held notification
    /// naming a task still unrecorded may be about ([`Watch::on_event`]).
    fn another_creation_in_flight(&self) -> bool {
        let session = self.session.as_ref().and_then(|s| s.to_str().ok());
        self.recorded_its_task
            .load(std::sync::atomic::Ordering::Acquire)
            && self.registry.creations().in_flight(&self.upstream, session)
    }

    /// A notification held on this creation's stream, released after the creation was answered
    /// with an error, names `bytes`' task, neither recorded nor refused: the task the creation
    /// started upstream before it failed (an orphan nobody can learn of, ask about or cancel).
    /// Cancelled there once, as a wrong-id creation is ([`UndoReason::Orphan`]; noted refused,
    /// so a later notification naming it is dropped, not cancelled again). A 2025-11-25
    /// creation's stream may carry its session's other tasks: not while another creation is in
    /// flight on the stream's upstream session (the task may be its). A 2026-07-28 POST stream
    /// carries only its own exchange's messages, so its orphan is its own, whoever else is
    /// creating (review 19 #3: any creation on the upstream suppressed the cancel). A recorded
    /// task is never cancelled here (`names_a_task_to_hold` said it is not recorded).
    fn cancel_orphan(&self, bytes: &[u8]) {
        let session = self.session.as_ref().and_then(|s| s.to_str().ok());
        let mut orphan = self.orphan.lock();
        let Some(era) = orphan.as_ref().map(|o| o.1) else {
            return;
        };
        if era != Era::Modern && self.registry.creations().in_flight(&self.upstream, session) {
            return;
        }
        let Some(taken) = orphan.take() else {
            return;
        };
        drop(orphan);
        let (undo, era) = *taken;
        let value = serde_json::from_slice::<Value>(bytes).ok();
        let task_id = value
            .as_ref()
            .and_then(|v| v.pointer("/params/taskId"))
            .and_then(Value::as_str);
        if let Some(task_id) = task_id {
            undo.cancel(&self.registry, era, task_id.to_string(), UndoReason::Orphan);
        }
    }

    /// Whether this reply still awaits its creation's answer.
    fn awaits_creation(&self) -> bool {
        matches!(*self.expect.lock(), Expect::Creation(_))
    }

    /// Records a `CreateTaskResult`; returns the message to pass on and the recorded taskId.
    /// A task that could not be recorded is cancelled upstream with `undo` (module docs).
    /// `parsed`: `bytes` as a `Value` when `on_plain_answer` already parsed it.
    async fn on_creation(
        &self,
        bytes: Bytes,
        parsed: Option<Value>,
        id: &Id,
        pending: PendingCreation,
        undo: Option<Undo>,
    ) -> (Bytes, Option<String>) {
        // Most 2026 calls end plainly: no `"task"` (nor an escape that could spell it), no parse.
        if parsed.is_none()
            && pending.template.era == Era::Modern
            && !found(&needles::TASK_KEY, &bytes)
            && !found(&needles::UNICODE_ESCAPE, &bytes)
        {
            return (bytes, None);
        }
        let Some(value) = parsed.or_else(|| lenient_value(&bytes)) else {
            return (bytes, None);
        };
        // A creation answered in the other era's `CreateTaskResult` shape: a task started
        // upstream that is not recorded as this era's creation. Never handed out unrecorded:
        // `-32603`, and the task it names cancelled upstream.
        let era = pending.template.era;
        if let Some(named) = value.get("result").and_then(|r| other_era_creation(era, r)) {
            if let (Some(undo), Some(task_id)) = (undo, named) {
                undo.cancel(
                    &self.registry,
                    era,
                    task_id.to_string(),
                    UndoReason::OtherEraShape,
                );
            }
            return (McpError::MalformedCreateTaskResult.body(Some(id)), None);
        }
        // Not a CreateTaskResult (an error, or a server that ran the call plainly): nothing to
        // record, and dropping `pending` gives the owner's slot back.
        let task = match pending.template.era {
            Era::Legacy => value.pointer("/result/task").cloned(),
            // 2026-07-28: a flat CreateTaskResult, whatever the request carried.
            Era::Modern => value
                .get("result")
                .filter(|r| r.get("resultType").and_then(Value::as_str) == Some("task"))
                .map(|r| as_registry_task(r, self.registry.config().max_ttl_ms)),
        };
        let record = task
            .as_ref()
            .and_then(|task| self.registry.creation_record(&pending.template, task));
        if task.is_some() && record.is_none() {
            // A CreateTaskResult taskgate cannot record (no string taskId: it names no task
            // that could be asked about or cancelled): never handed out unrecorded (break-edge
            // F5). Dropping `pending` gives the owner's slot back.
            tracing::warn!(
                upstream = %self.upstream,
                "the upstream answered with a CreateTaskResult whose taskId is not a string, is empty or holds NUL: not passed on"
            );
            return (McpError::MalformedCreateTaskResult.body(Some(id)), None);
        }
        self.record_task(bytes, record, id, pending, undo).await
    }

    /// Records the record made of the `Task` of a `CreateTaskResult` (`None`: the answer holds
    /// none, or none could be made of it); returns the message to pass on and the recorded
    /// taskId (see [`Watch::on_creation`]).
    async fn record_task(
        &self,
        bytes: Bytes,
        record: Option<TaskRecord>,
        id: &Id,
        pending: PendingCreation,
        undo: Option<Undo>,
    ) -> (Bytes, Option<String>) {
        let Some(record) = record else {
            return (bytes, None);
        };
        let task_id = record.task_id.clone();
        let era = pending.template.era;
        if self.client_gone.load(std::sync::atomic::Ordering::Relaxed) {
            // Nobody will see this answer: not recorded (the owner's slot is given back with
            // `pending`), cancelled upstream.
            if let Some(undo) = undo {
                undo.cancel(&self.registry, era, task_id, UndoReason::ClientGone);
            }
            return (bytes, None);
        }
        // A live task made of a 2026-07-28 plain call (its slot is provisional) is held to
        // `tasks.max_live_tasks_per_owner` here, where it is known to be a task (module docs).
        if !record.status.is_terminal() {
            match self.registry.admit_creation(&pending.reservation).await {
                Ok(true) => {}
                Ok(false) => return (self.over_limit(id, undo, era, task_id).await, None),
                Err(e) => {
                    if let Some(undo) = undo {
                        undo.cancel(&self.registry, era, task_id, UndoReason::NotRecorded);
                    }
                    return (not_recorded(id, &self.upstream, e), None);
                }
            }
        }
        let bytes = show_recorded_ttl(bytes, ttl_path(era, true), &record);
        match self
            .registry
            .record_creation(record, &pending.reservation)
            .await
        {
            Ok(()) => {
                let _ = pending.created.set(task_id.clone());
                if let Some(token) = pending.progress_token {
                    self.registry
                        .releases()
                        .note_progress_token(&self.upstream, token, &task_id);
                }
                (bytes, Some(task_id))
            }
            Err(e) => {
                if let (Some(undo), false) = (undo, matches!(e, StoreError::Conflict(_))) {
                    undo.cancel(&self.registry, era, task_id, UndoReason::NotRecorded);
                }
                (not_recorded(id, &self.upstream, e), None)
            }
        }
    }

    /// The answer to a creation whose live task (`task_id`, made by the server of a 2026-07-28
    /// plain call) is over `tasks.max_live_tasks_per_owner`: the task is cancelled upstream
    /// with `undo`, once, and the client gets the `-32029` the limit is answered with
    /// elsewhere (`McpError::TaskLimitExceeded`, the same code and message as a refused
    /// 2025-11-25 creation or 2026 gateway task). The upstream had already created the task, so
    /// refusing it before it went upstream, as for a 2025 creation, was not possible.
    ///
    /// But a taskId already recorded (an upstream reusing one, maybe another owner's task) is
    /// refused as a duplicate and never cancelled, as `record_creation`'s `Conflict` is; a
    /// failed read is not taken for "new" either: cancelling a recorded task upstream would end
    /// it for its owner, while a new one left running ends at its ttl.
    async fn over_limit(&self, id: &Id, undo: Option<Undo>, era: Era, task_id: String) -> Bytes {
        match self.registry.try_record_of(&self.upstream, &task_id).await {
            Ok(None) => {}
            Ok(Some(_)) => return not_recorded(id, &self.upstream, StoreError::Conflict(task_id)),
            Err(e) => {
                let what = format!(
                    "task {task_id:?} of upstream `{}`, made over tasks.max_live_tasks_per_owner, could not be looked up: neither recorded nor cancelled upstream (it ends at its ttl)",
                    self.upstream
                );
                crate::store::log_failure(&e, &what);
                return not_recorded(id, &self.upstream, e);
            }
        }
        let error = self.registry.refuse_over_limit(&self.upstream);
        if let Some(undo) = undo {
            undo.cancel(&self.registry, era, task_id, UndoReason::OwnerLimit);
        }
        error.body(Some(id))
    }

    /// The answer to a `method` about `task_id` whose `Task` names another task (see
    /// [`TaskView::names_another`]): `-32603` naming both, in place of the upstream's answer,
    /// which is applied to no record.
    fn foreign_answer(&self, method: &str, task_id: &str, id: Option<&Id>) -> Bytes {
        tracing::warn!(
            upstream = %self.upstream,
            task_id,
            "the upstream answered {method} about another task: not passed on"
        );
        McpError::Upstream {
            detail: format!(
                "upstream `{}` answered {method} for task {task_id:?} with another task; not passed on",
                self.upstream
            ),
        }
        .body(id)
    }

    /// Whether `task_id` is recorded `cancelled` now (`known`: its record when the request was
    /// authorised; a blocking `tasks/result` may see the cancel happen while it waits, so the
    /// record is read again then, from the record cache).
    async fn cancelled(&self, task_id: &str, known: &TaskRecord) -> bool {
        if known.status == TaskStatus::Cancelled {
            return true;
        }
        matches!(
            self.registry.record_cached(&self.upstream, task_id).await,
            Ok(Some(r)) if r.status == TaskStatus::Cancelled
        )
    }

    /// Applies the reply to a `tasks/get|result|cancel` about `task_id`.
    /// `parsed`: `bytes` as a `Value` when `on_message` already parsed it.
    async fn on_task_reply(
        &self,
        bytes: Bytes,
        parsed: Option<Value>,
        method: ReplyTo,
        task_id: &str,
        known: &TaskRecord,
    ) -> Bytes {
        // A `tasks/get` answer is decided on a borrowing view of it, without a `Value` tree
        // (see `TaskView`): the common poll repeats what the record holds and needs nothing;
        // one that reports a change is applied from the same view.
        if parsed.is_none() && method == ReplyTo::Get {
            if let Some(task) = TaskView::of_reply(&bytes) {
                if task.names_another(task_id) {
                    return self.foreign_answer("tasks/get", task_id, answer_id(&bytes).as_ref());
                }
                return self.apply_get(bytes.clone(), &task, task_id, known).await;
            }
        }
        // The payload of a task authorised as terminal: there is no status to apply (a payload
        // only ever ends a live record), only the payload to keep once; no `Value` tree.
        if parsed.is_none()
            && method == ReplyTo::Result
            && known.status.is_terminal()
            && known.status != TaskStatus::Cancelled
        {
            if known.terminal_result.is_none() {
                if let Ok(Some(raw)) = splice::raw_at(&bytes, &["result"]) {
                    self.registry
                        .store_terminal_result(&self.upstream, task_id, None, raw.get().to_string())
                        .await;
                }
            }
            return bytes;
        }
        let Some(value) = parsed.or_else(|| serde_json::from_slice::<Value>(&bytes).ok()) else {
            return bytes;
        };
        let Some(result) = value.get("result") else {
            return bytes;
        };
        if method != ReplyTo::Result && names_another(result, task_id) {
            let id = value.get("id").and_then(Id::from_value);
            return self.foreign_answer(method.source(), task_id, id.as_ref());
        }
        if method == ReplyTo::Result {
            // A payload only ever ends a live record: for one authorised as terminal (final
            // forever) there is nothing to apply and no store trip.
            if !known.status.is_terminal() {
                let failed = result.get("isError").and_then(Value::as_bool) == Some(true);
                self.registry
                    .apply_result_payload(&self.upstream, task_id, failed)
                    .await;
            }
            if self.cancelled(task_id, known).await {
                let id = value.get("id").and_then(Id::from_value);
                return cancelled_has_no_result(task_id, id.as_ref());
            }
            // The payload of a task now terminal: later tasks/result calls are answered from
            // the record (`tasks.max_stored_result_bytes`), once.
            if known.terminal_result.is_none() {
                if let Ok(Some(raw)) = splice::raw_at(&bytes, &["result"]) {
                    self.registry
                        .store_terminal_result(&self.upstream, task_id, None, raw.get().to_string())
                        .await;
                }
            }
            return bytes;
        }
        if !result.is_object() {
            return bytes;
        }
        // The common poll: a tasks/get answer that repeats what the authorised record holds for a
        // live task changes nothing, so the store is not asked again. (Measured: the store
        // round trip off the runtime was most of the task path's added CPU; see benches/RESULTS.md.)
        // A terminal status recorded in between is not missed in a way a client could tell: this
        // answer was produced while the request was in flight, before that status.
        if method == ReplyTo::Get && !Registry::would_change(known, result) {
            return bytes;
        }
        let observed = self
            .registry
            .observe_task_as(&self.upstream, task_id, result.clone(), method.source())
            .await;
        self.shown_recorded(observed.rewrite_bytes(&bytes, &["result"]), bytes)
    }
}

/// Sends the service below one request of taskgate's own and waits for its reply (type-erased,
/// so that [`Watch`] stays free of the service's type). Shared: an [`Undo`] may be cloned (a
/// stray `CreateTaskResult` is cancelled while the creation still awaits its own answer).
type SendBelow =
    Arc<dyn Fn(McpRequest) -> BoxFuture<'static, Result<McpReply, String>> + Send + Sync>;

/// How to cancel upstream a task whose creation could not be recorded: the creation request's
/// context (the upstream session it went out on, its headers) and the service below `observe`.
/// Built for task-augmented `tools/call`s only (a clone of the service and of the context).
#[derive(Clone)]
pub(crate) struct Undo {
    ctx: RequestContext,
    send: SendBelow,
}

/// Whether `task` (a `Task` object as a `Value`) names another task than `task_id`, as
/// [`TaskView::names_another`] decides it: a string `taskId` that is not `task_id`.
pub(super) fn names_another(task: &Value, task_id: &str) -> bool {
    task.get("taskId")
        .and_then(Value::as_str)
        .is_some_and(|t| t != task_id)
}

/// The id of the JSON-RPC message `bytes`, if it has one that can be read.
fn answer_id(bytes: &Bytes) -> Option<Id> {
    Message::parse(bytes.clone()).ok()?.id().cloned()
}

/// The answer to a 2025-11-25 `tasks/result` of a task recorded `cancelled`, whatever the
/// upstream answered: `-32603` "task … was cancelled; it has no result", as the bridge and
/// gateway-owned tasks answer it. An upstream that completes the work after acknowledging the
/// cancel has a success payload for it; relayed (and kept as the task's result, answered from
/// the record from then on), it told the client "completed" about a task `tasks/get` shows
/// `cancelled`: the late completion taskgate promises never overwrites `cancelled`.
fn cancelled_has_no_result(task_id: &str, id: Option<&Id>) -> Bytes {
    McpError::NoResult {
        task_id: task_id.to_string(),
        status: TaskStatus::Cancelled,
        status_message: None,
    }
    .body(id)
}

/// The `-32603` answer to request `id` whose task the upstream created but taskgate did not
/// record (`e` says why; a `Conflict` is the upstream reusing a recorded `taskId` of
/// `upstream`, said as such: it is no store failure, break-tasks L4).
fn not_recorded(id: &Id, upstream: &str, e: StoreError) -> Bytes {
    let error = match e {
        StoreError::Conflict(task_id) => McpError::TaskIdReused {
            task_id,
            upstream: upstream.to_string(),
        },
        // Logged and counted by the registry (`record_creation`).
        _ => McpError::NotRecorded {
            before_upstream: false,
        },
    };
    error.body(Some(id))
}

/// Why a task the upstream created is cancelled there by [`Undo::cancel`].
#[derive(Clone, Copy)]
enum UndoReason {
    /// Its record could not be written.
    NotRecorded,
    /// Its owner is at `tasks.max_live_tasks_per_owner` (a 2026-07-28 server made it of a
    /// plain call).
    OwnerLimit,
    /// The client went away before the answer naming it arrived: nobody will ever learn its
    /// taskId, so nobody could ask about it or cancel it.
    ClientGone,
    /// Its `CreateTaskResult` came under another JSON-RPC id than the creation's: not the
    /// answer, so not recorded (the client gets `-32603`, break-edge F3) nor passed on.
    WrongId,
    /// Its creation was answered with a JSON-RPC error after a notification on the creation's
    /// stream named it ([`Watch::cancel_orphan`]): nothing recorded it.
    Orphan,
    /// A creation was answered in the other era's `CreateTaskResult` shape
    /// ([`other_era_creation`]): not recorded, the client got `-32603`.
    OtherEraShape,
}

/// Whether a creation's `result` is the other era's `CreateTaskResult`, and the taskId it
/// names (`Some(None)`: that shape, its taskId not a string, no task anyone can name): for a
/// 2026-07-28 creation the 2025-11-25 nested one (`{"task": {"taskId": …}}`, no `resultType`),
/// for a 2025-11-25 creation the 2026-07-28 flat one (`resultType: "task"`, `taskId` at the
/// top, no `task` object). Neither has `content`, which every `CallToolResult` has: a plain
/// result that carries a member `task` (or `taskId`) of its own is a result, never refused nor
/// anything it names cancelled upstream.
pub(super) fn other_era_creation(era: Era, result: &Value) -> Option<Option<&str>> {
    if result.get("content").is_some() {
        return None;
    }
    let result_type = result.get("resultType");
    let task_id = match era {
        Era::Modern if result_type.is_none() => result.pointer("/task/taskId"),
        Era::Legacy if result_type.and_then(Value::as_str) == Some("task") => result
            .get("taskId")
            .filter(|_| !result.get("task").is_some_and(Value::is_object)),
        _ => None,
    }?;
    Some(task_id.as_str())
}

impl Undo {
    fn new<S>(inner: S, req: &McpRequest) -> Undo
    where
        S: tower::Service<McpRequest, Response = McpReply> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: std::fmt::Display + Send + 'static,
    {
        Undo {
            ctx: req.ctx.clone(),
            send: {
                // `Sync` for the shared closure; locked only to clone the service.
                let inner = Mutex::new(inner);
                Arc::new(move |req| {
                    let inner = inner.lock().clone();
                    Box::pin(async move {
                        use tower::ServiceExt;
                        inner.oneshot(req).await.map_err(|e| e.to_string())
                    })
                })
            },
        }
    }

    /// Sends the `tasks/cancel` of `task_id` (created in `era`) in the background: the client's
    /// `-32603` does not wait for it. Its whole exchange is bounded by the upstream's
    /// `timeout_ms` (its [`Deadline::Exchange`](crate::exchange::Deadline::Exchange): a `tasks/cancel` answer, streamed or not, always is).
    fn cancel(self, registry: &Arc<Registry>, era: Era, task_id: String, why: UndoReason) {
        // The creation's context: the upstream session it went out on, its credentials.
        let id = own_request::own_id("undo");
        let req = own_request::task_request(&self.ctx, era, "tasks/cancel", &task_id, &id);
        let upstream = self.ctx.upstream.clone();
        // Before the creation's `InFlight` is given back: a notification waiting on it then
        // sees the task refused, and is not passed on.
        registry.creations().refused(&upstream, &task_id);
        let registry = registry.clone();
        match why {
            UndoReason::NotRecorded => {
                tracing::warn!(%upstream, %task_id, era = era.as_str(), "a task the upstream created could not be recorded: sending tasks/cancel upstream")
            }
            // A policy answer, not a fault: the client got -32029.
            UndoReason::OwnerLimit => {
                tracing::info!(%upstream, %task_id, era = era.as_str(), "a task the upstream made of a plain call is over tasks.max_live_tasks_per_owner: refused, sending tasks/cancel upstream")
            }
            UndoReason::ClientGone => {
                tracing::info!(%upstream, %task_id, era = era.as_str(), "the client went away before the task it created was answered: not recorded, sending tasks/cancel upstream")
            }
            UndoReason::Orphan => {
                tracing::warn!(%upstream, %task_id, era = era.as_str(), "the upstream answered a creation with an error after naming the task it started: sending tasks/cancel upstream")
            }
            UndoReason::OtherEraShape => {
                tracing::warn!(%upstream, %task_id, era = era.as_str(), "the upstream answered a creation with the other era's CreateTaskResult: not recorded nor passed on, sending tasks/cancel upstream")
            }
            UndoReason::WrongId => {
                tracing::warn!(%upstream, %task_id, era = era.as_str(), "the upstream answered a creation with a CreateTaskResult under another id: not recorded nor passed on, sending tasks/cancel upstream")
            }
        }
        tokio::spawn(async move {
            let outcome = match (self.send)(req).await {
                Ok(reply) => match reply.answer_to(&id).await {
                    Some(answer) => {
                        tracing::info!(%upstream, %task_id, answer = %String::from_utf8_lossy(&answer), "the unrecorded task's cancel was answered");
                        UndoOutcome::Answered
                    }
                    None => {
                        tracing::warn!(%upstream, %task_id, "the unrecorded task's cancel got no JSON-RPC answer");
                        UndoOutcome::Failed
                    }
                },
                Err(e) => {
                    tracing::warn!(%upstream, %task_id, error = %e, "the unrecorded task's cancel failed");
                    UndoOutcome::Failed
                }
            };
            registry
                .metrics()
                .unrecorded_task_cancel(&upstream, outcome);
        });
    }
}

/// How many levels of objects [`lenient_value`] opens to reach what serde_json cannot read
/// whole: the envelope, `result` or `params`, a `DetailedTask`'s `result`, one more.
const LENIENT_LEVELS: usize = 4;

/// `bytes` (an upstream message) as a `Value`. One nested deeper than serde_json's limit (128
/// levels; valid JSON all the same: a deep `_meta`, extra member or tool output) is read member
/// by member, [`LENIENT_LEVELS`] levels of objects down, a member still too deep read as
/// `null`: what taskgate reads of a task (its flat members, `isError`) is all there, and a
/// payload it keeps is taken from the bytes, never from this `Value`. Used where such a
/// message read as none and passed on unapplied: an awaited creation ([`Watch::on_creation`]:
/// the client held a taskId taskgate then answered `-32602` for, never asking the upstream), a
/// 2025-11-25 `notifications/tasks/status` and a 2026-07-28 `tasks/get` answer (a completion
/// never recorded, the owner's slot held until the ttl; a cancelled task shown `completed`).
/// `None` for text that is not a JSON object.
pub(crate) fn lenient_value(bytes: &[u8]) -> Option<Value> {
    if let Ok(value) = serde_json::from_slice::<Value>(bytes) {
        return Some(value);
    }
    let text = std::str::from_utf8(bytes).ok()?;
    members(text).map(|m| object_of(m, LENIENT_LEVELS))
}

type Members<'a> = Vec<(String, &'a serde_json::value::RawValue)>;

/// The members of the JSON object `raw`, each kept raw: skipping a value (a `RawValue`) has no
/// depth limit in serde_json, reading one into a `Value` does. `None` for anything else.
fn members(raw: &str) -> Option<Members<'_>> {
    struct Object<'a>(Members<'a>);
    impl<'de> serde::Deserialize<'de> for Object<'de> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Object<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Object<'de>, A::Error> {
                    let mut out = Vec::new();
                    while let Some(entry) = map.next_entry()? {
                        out.push(entry);
                    }
                    Ok(Object(out))
                }
            }
            d.deserialize_map(V)
        }
    }
    serde_json::from_str::<Object<'_>>(raw).ok().map(|o| o.0)
}

/// The object of `members`, each read whole or, too deep for that, opened `levels` more levels.
fn object_of(members: Members<'_>, levels: usize) -> Value {
    let read = |raw: &str| match serde_json::from_str::<Value>(raw) {
        Ok(value) => value,
        Err(_) if levels > 0 => {
            self::members(raw).map_or(Value::Null, |m| object_of(m, levels - 1))
        }
        Err(_) => Value::Null,
    };
    Value::Object(
        members
            .into_iter()
            .map(|(name, raw)| {
                let value = read(raw.get());
                (name, value)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests;
