//! The `observe` layer, innermost (just above the upstream client): the only place where what
//! the upstream says about tasks is applied to the [`Registry`], once per message
//! (2025-11-25 basic/utilities/tasks).
//!
//! Every upstream message passes here exactly once, whoever sent the request (a client, or the
//! `upgrade` layer's own `tasks/*` requests):
//! - **Creation**: the answer to a task-augmented `tools/call` that carries a
//!   [`PendingCreation`] (set by `tasks`). A `CreateTaskResult` (JSON body or SSE event) is
//!   recorded durably **before** that message is passed on; the record is the template
//!   completed from the result's `Task` (ttl capped: see `Registry::creation_record`). When the
//!   write fails, the client gets `-32603` instead of a taskId taskgate cannot stand behind. An
//!   answer that is not a `CreateTaskResult` (an error, a plain result) records nothing and the
//!   owner's slot is given back. The message passes as sent but for its ttl (`show_recorded_ttl`).
//! - **Statuses**: replies to `tasks/get` and `tasks/cancel` (a Task; applied to the task the
//!   `tasks` layer authorised, [`AuthorisedTask`]), `tasks/result` payloads (the task ended:
//!   `failed` for an `isError` result), and `notifications/tasks/status` on any stream, follow the
//!   spec's transitions. A message reporting another status for a task recorded terminal is
//!   rewritten to show the recorded status (counted, and logged once as a late result).
//! - **Activity** for the "resources released" fact (`registry::releases`): progress on a task's
//!   `progressToken`, messages whose related-task `_meta` names it, status notifications.
//! - **Holds**: a `tasks/result` in flight holds its task until its reply is done; a creation's
//!   own SSE stream holds the new task while it is still relayed.
//!
//! Messages that concern none of this pass without a parse (a byte search decides) and keep
//! their bytes.

pub(crate) mod modern;
mod poll;

use modern::{show_recorded_ttl, ttl_path};
use poll::poll_repeats;

use crate::era::{self, Era};
use crate::exchange::{McpReply, McpRequest, ReplyBody};
use crate::jsonrpc::needles::{self, found};
use crate::jsonrpc::{self, splice, Id, Kind, Message};
use crate::layers::extensions::{AuthorisedTask, PendingCreation};
use crate::registry::{Registry, ResourceHold};
use crate::sse::{Event, EventStream};
use crate::store::TaskRecord;
use bytes::Bytes;
use futures_util::StreamExt;
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
enum TaskMethod {
    Get,
    Result,
    Cancel,
}

impl TaskMethod {
    fn source(self) -> &'static str {
        match self {
            TaskMethod::Get => "tasks/get",
            TaskMethod::Result => "tasks/result",
            TaskMethod::Cancel => "tasks/cancel",
        }
    }
}

/// What the answer to the request is awaited for.
enum Expect {
    /// Nothing beyond status notifications and activity.
    Nothing,
    /// A `CreateTaskResult` answering `id`.
    Creation { id: Id, pending: PendingCreation },
    /// The reply to `tasks/get|result|cancel` about `task_id`.
    TaskReply {
        id: Id,
        method: TaskMethod,
        task_id: String,
        /// The record `tasks` authorised the request against.
        known: Box<TaskRecord>,
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
                    Some(pending) => Expect::Creation { id, pending },
                    None => Expect::Nothing,
                }
            }
            Some("tasks/get") => TaskMethod::Get,
            Some("tasks/result") => TaskMethod::Result,
            Some("tasks/cancel") => TaskMethod::Cancel,
            _ => return Expect::Nothing,
        };
        match req.extensions.get::<AuthorisedTask>() {
            Some(a) => Expect::TaskReply {
                id,
                method,
                task_id: a.record.task_id.clone(),
                known: Box::new(a.record.clone()),
                era: Era::of(req),
            },
            None => Expect::Nothing,
        }
    }

    fn id(&self) -> Option<&Id> {
        match self {
            Expect::Nothing => None,
            Expect::Creation { id, .. } | Expect::TaskReply { id, .. } => Some(id),
        }
    }
}

impl<S> tower::Service<McpRequest> for ObserveService<S>
where
    S: tower::Service<McpRequest, Response = McpReply> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = McpReply;
    type Error = S::Error;
    type Future = BoxFut<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: McpRequest) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let registry = self.registry.clone();
        let upstream = req.ctx.upstream.clone();
        let expect = Expect::of(&mut req);
        // An open tasks/result is a resource held for its task until its reply is done.
        let request_hold = match &expect {
            Expect::TaskReply {
                method: TaskMethod::Result,
                task_id,
                ..
            } => Some(registry.releases().hold(&upstream, task_id)),
            _ => None,
        };
        Box::pin(async move {
            // An error drops `expect`: a creation's reserved slot is given back.
            let mut reply = inner.call(req).await?;
            if matches!(expect, Expect::Nothing) && !matches!(reply.body, ReplyBody::Stream(_)) {
                // Fast path: a JSON answer to an ordinary request carries nothing to apply.
                return Ok(reply);
            }
            let watch = Arc::new(Watch {
                registry,
                upstream,
                expect: Mutex::new(expect),
                holds: Mutex::new(request_hold.into_iter().collect()),
            });
            reply.body = match reply.body {
                ReplyBody::Json(bytes) => ReplyBody::Json(watch.on_message(bytes, false).await),
                ReplyBody::Stream(events) => ReplyBody::Stream(Watch::watch(watch, events)),
                other => other,
            };
            Ok(reply)
        })
    }
}

/// Watches one reply (a JSON message, or an SSE stream event by event).
struct Watch {
    registry: Arc<Registry>,
    upstream: Arc<str>,
    expect: Mutex<Expect>,
    /// Resources held for tasks while this reply is relayed (dropped with the reply).
    holds: Mutex<Vec<ResourceHold>>,
}

impl Watch {
    fn watch(this: Arc<Watch>, events: EventStream) -> EventStream {
        Box::pin(events.then(move |event| this.clone().on_event(event)))
    }

    async fn on_event(self: Arc<Self>, mut event: Event) -> Event {
        // Most events (progress, logging, results of ordinary calls) concern nothing here: they
        // pass without a copy or a parse.
        let Some(data) = event.data.as_ref().filter(|d| self.cares(d.as_bytes())) else {
            return event;
        };
        let original = Bytes::copy_from_slice(data.as_bytes());
        let bytes = self.on_message(original.clone(), true).await;
        if bytes != original {
            event.data = Some(String::from_utf8_lossy(&bytes).into_owned());
        }
        event
    }

    /// Whether a message may concern this watch: a status or task-related message, or (while
    /// the answer is awaited) any message.
    fn cares(&self, bytes: &[u8]) -> bool {
        self.expect.lock().id().is_some()
            || found(&needles::TASK_STATUS, bytes)
            || found(&needles::TASKS_NOTIFICATION, bytes)
            || self.is_activity(bytes)
    }

    fn is_activity(&self, bytes: &[u8]) -> bool {
        self.registry.releases().is_tracking()
            && (found(&needles::PROGRESS, bytes) || found(&needles::RELATED_TASK, bytes))
    }

    /// Applies one JSON-RPC message of the reply; returns it, rewritten if needed.
    async fn on_message(self: &Arc<Self>, bytes: Bytes, in_stream: bool) -> Bytes {
        let is_status =
            found(&needles::TASK_STATUS, &bytes) || found(&needles::TASKS_NOTIFICATION, &bytes);
        let is_activity = self.is_activity(&bytes);
        let waiting_for = self.expect.lock().id().cloned();
        if !is_status && !is_activity && waiting_for.is_none() {
            return bytes;
        }
        let Ok(msg) = Message::parse(bytes.clone()) else {
            return bytes;
        };
        // One parse serves the activity note, the status update and the reply's handling below
        // (a tasks/get answer was parsed twice before: about 10,000 instructions each).
        let mut parsed = None;
        if is_status || is_activity {
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                self.registry.note_activity_in(&self.upstream, &value);
                if msg.method() == Some("notifications/tasks/status") {
                    return self.on_status_notification(bytes, value).await;
                }
                if msg.method() == Some("notifications/tasks") {
                    return self.on_tasks_notification(bytes, value).await;
                }
                parsed = Some(value);
            }
        }
        let answers = waiting_for.is_some()
            && msg.id() == waiting_for.as_ref()
            && matches!(msg.kind(), Kind::Response | Kind::Error);
        if !answers {
            return bytes;
        }
        let expect = std::mem::replace(&mut *self.expect.lock(), Expect::Nothing);
        match expect {
            Expect::Creation { id, pending } => {
                let (out, created) = self.on_creation(bytes, &id, pending).await;
                if let (Some(task_id), true) = (created, in_stream) {
                    // The creation's own stream relays the task's messages from now on.
                    let hold = self.registry.releases().hold(&self.upstream, &task_id);
                    self.holds.lock().push(hold);
                }
                out
            }
            Expect::TaskReply {
                method,
                task_id,
                known,
                era,
                ..
            } => {
                let out = if era == Era::Modern {
                    self.on_modern_task_reply(bytes, parsed, method, &task_id, &known)
                        .await
                } else {
                    self.on_task_reply(bytes, parsed, method, &task_id, &known)
                        .await
                };
                match method {
                    TaskMethod::Get => show_recorded_ttl(out, ttl_path(era, false), &known),
                    _ => out,
                }
            }
            Expect::Nothing => bytes,
        }
    }

    async fn on_status_notification(&self, bytes: Bytes, value: Value) -> Bytes {
        let Some(params) = value.get("params") else {
            return bytes;
        };
        let observed = self
            .registry
            .observe_task(&self.upstream, params.clone(), "notifications/tasks/status")
            .await;
        observed.rewrite_bytes(&bytes, &["params"]).unwrap_or(bytes)
    }

    /// Records a `CreateTaskResult`; returns the message to pass on and the recorded taskId.
    async fn on_creation(
        &self,
        bytes: Bytes,
        id: &Id,
        pending: PendingCreation,
    ) -> (Bytes, Option<String>) {
        // Most 2026 calls end plainly: no `"task"` (nor an escape that could spell it), no parse.
        if pending.template.era == Era::Modern
            && !found(&needles::TASK_KEY, &bytes)
            && !found(&needles::UNICODE_ESCAPE, &bytes)
        {
            return (bytes, None);
        }
        let Ok(value) = serde_json::from_slice::<Value>(&bytes) else {
            return (bytes, None);
        };
        // Not a CreateTaskResult (an error, or a server that ran the call plainly): nothing to
        // record, and dropping `pending` gives the owner's slot back.
        let task = match pending.template.era {
            Era::Legacy => value.pointer("/result/task").cloned(),
            // 2026-07-28: a flat CreateTaskResult, whatever the request carried.
            Era::Modern => value
                .get("result")
                .filter(|r| r.get("resultType").and_then(Value::as_str) == Some("task"))
                .map(|r| era::as_registry_task(r, self.registry.config().max_ttl_ms)),
        };
        let Some(record) = task
            .as_ref()
            .and_then(|task| self.registry.creation_record(&pending.template, task))
        else {
            return (bytes, None);
        };
        let task_id = record.task_id.clone();
        let bytes = show_recorded_ttl(bytes, ttl_path(pending.template.era, true), &record);
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
            Err(e) => (
                jsonrpc::error_response(
                    Some(id),
                    jsonrpc::INTERNAL_ERROR,
                    &format!(
                        "taskgate could not record the task durably ({e}); the task was not handed out"
                    ),
                ),
                None,
            ),
        }
    }

    /// Applies the reply to a `tasks/get|result|cancel` about `task_id`.
    /// `parsed`: `bytes` as a `Value` when `on_message` already parsed it.
    async fn on_task_reply(
        &self,
        bytes: Bytes,
        parsed: Option<Value>,
        method: TaskMethod,
        task_id: &str,
        known: &TaskRecord,
    ) -> Bytes {
        // The common poll (a `tasks/get` answer repeating what the record holds) is decided on
        // a borrowing view of the answer, without a `Value` tree; see `poll_repeats`.
        if parsed.is_none() && method == TaskMethod::Get && poll_repeats(&bytes, known) {
            return bytes;
        }
        let Some(value) = parsed.or_else(|| serde_json::from_slice::<Value>(&bytes).ok()) else {
            return bytes;
        };
        let Some(result) = value.get("result") else {
            return bytes;
        };
        if method == TaskMethod::Result {
            // A payload only ever ends a live record: for one authorised as terminal (final
            // forever) there is nothing to apply and no store trip.
            if !known.status.is_terminal() {
                let failed = result.get("isError").and_then(Value::as_bool) == Some(true);
                self.registry
                    .apply_result_payload(&self.upstream, task_id, failed)
                    .await;
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
        if method == TaskMethod::Get && !Registry::would_change(known, result) {
            return bytes;
        }
        let observed = self
            .registry
            .observe_task_as(&self.upstream, task_id, result.clone(), method.source())
            .await;
        observed.rewrite_bytes(&bytes, &["result"]).unwrap_or(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::GatewayError;
    use crate::layers::testing::{json_of, owner, record, registry, request};
    use crate::mcp::task::TaskStatus;
    use crate::store::TaskRecord;
    use http::{HeaderMap, StatusCode};
    use tower::{Layer, ServiceExt};

    const CREATED: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"taskId":"t9","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":60000}}}"#;

    fn sse(messages: &[&str]) -> McpReply {
        let events: Vec<Event> = messages
            .iter()
            .map(|m| Event {
                event: None,
                data: Some(m.to_string()),
                id: None,
                retry: None,
            })
            .collect();
        McpReply {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: ReplyBody::Stream(Box::pin(futures_util::stream::iter(events))),
        }
    }

    /// A stack of `observe` over an upstream that answers every request with `reply()`.
    fn stack(
        registry: &Arc<Registry>,
        reply: impl Fn() -> McpReply + Clone + Send + Sync + 'static,
    ) -> impl tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Clone {
        ObserveLayer::new(registry.clone()).layer(tower::service_fn(move |_req: McpRequest| {
            let reply = reply.clone();
            async move { Ok::<_, GatewayError>(reply()) }
        }))
    }

    fn creation_request(registry: &Arc<Registry>) -> McpRequest {
        let mut req = request(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","task":{"ttl":60000}}}"#,
        );
        let template = TaskRecord {
            task_id: String::new(),
            ..record("")
        };
        req.extensions.insert(PendingCreation {
            template: Arc::new(template),
            reservation: Arc::new(registry.reserve(&"up".into(), &owner()).unwrap()),
            progress_token: None,
            created: Arc::default(),
        });
        req
    }

    /// The `CreateTaskResult` is in the store when the JSON reply leaves the layer, and when the
    /// SSE event carrying it is handed on (not later); the owner's slot stays taken.
    #[tokio::test]
    async fn creation_is_recorded_before_the_reply_passes() {
        let (registry, _store) = registry();
        let json = stack(&registry, || {
            McpReply::local_json(Bytes::from_static(CREATED.as_bytes()))
        });
        let reply = json.oneshot(creation_request(&registry)).await.unwrap();
        assert!(registry.store().get("up", "t9").unwrap().is_some());
        assert_eq!(json_of(&reply)["result"]["task"]["taskId"], "t9");
        assert_eq!(
            registry.owners_count("up", &owner()),
            1,
            "the slot is the task's"
        );

        let (registry, _store) = crate::layers::testing::registry();
        let streamed = stack(&registry, || {
            sse(&[
                r#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#,
                CREATED,
            ])
        });
        let reply = streamed.oneshot(creation_request(&registry)).await.unwrap();
        let ReplyBody::Stream(mut events) = reply.body else {
            panic!("not a stream")
        };
        let first = events.next().await.unwrap();
        assert!(first.data.unwrap().contains("notifications/message"));
        assert!(registry.store().get("up", "t9").unwrap().is_none());
        let second = events.next().await.unwrap();
        assert_eq!(second.data.as_deref(), Some(CREATED), "bytes as they came");
        let r = registry.store().get("up", "t9").unwrap().unwrap();
        assert_eq!((r.status, r.owner), (TaskStatus::Working, owner()));
    }

    /// An answer that is not a `CreateTaskResult` records nothing and gives the slot back.
    #[tokio::test]
    async fn a_plain_answer_gives_the_slot_back() {
        let (registry, _store) = registry();
        let plain = stack(&registry, || {
            McpReply::local_json(Bytes::from_static(
                br#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#,
            ))
        });
        let req = creation_request(&registry);
        plain.oneshot(req).await.unwrap();
        assert!(registry.store().get("up", "t9").unwrap().is_none());
        assert_eq!(registry.owners_count("up", &owner()), 0);
    }

    /// A reply (or notification) reporting another status for a task recorded terminal shows the
    /// recorded one; the record keeps it.
    #[tokio::test]
    async fn terminal_statuses_are_rewritten() {
        let (registry, _store) = registry();
        let slot = registry.reserve(&"up".into(), &owner()).unwrap();
        let done = TaskRecord {
            status: TaskStatus::Cancelled,
            ..record("t1")
        };
        registry.record_creation(done.clone(), &slot).await.unwrap();
        let get = stack(&registry, || {
            McpReply::local_json(Bytes::from_static(
                br#"{"jsonrpc":"2.0","id":5,"result":{"taskId":"t1","status":"completed","statusMessage":"done"}}"#,
            ))
        });
        let mut req =
            request(r#"{"jsonrpc":"2.0","id":5,"method":"tasks/get","params":{"taskId":"t1"}}"#);
        req.extensions.insert(AuthorisedTask { record: done });
        let reply = json_of(&get.oneshot(req).await.unwrap());
        assert_eq!(reply["result"]["status"], "cancelled");
        assert!(reply["result"].get("statusMessage").is_none());

        let notified = stack(&registry, || {
            sse(&[
                r#"{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{"taskId":"t1","status":"working"}}"#,
            ])
        });
        let reply = notified
            .oneshot(request(
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            ))
            .await
            .unwrap();
        let ReplyBody::Stream(mut events) = reply.body else {
            panic!("not a stream")
        };
        let ev: Value = serde_json::from_str(&events.next().await.unwrap().data.unwrap()).unwrap();
        assert_eq!(ev["params"]["status"], "cancelled");
        let r = registry.store().get("up", "t1").unwrap().unwrap();
        assert_eq!(r.status, TaskStatus::Cancelled);
    }
}
