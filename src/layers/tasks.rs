//! The `tasks` layer: records every task, binds it to its owner, routes `tasks/*` to the upstream
//! session that holds the task, and keeps terminal statuses terminal
//! (2025-11-25 basic/utilities/tasks).
//!
//! What it does to which messages:
//! - `tools/call` with `params.task` (task-augmented): refused locally with [`TASK_LIMIT_EXCEEDED`]
//!   when the owner already has `tasks.max_live_tasks_per_owner` live tasks on this upstream;
//!   `params.task.ttl` above `tasks.max_ttl_ms` is lowered to it; the `CreateTaskResult` in the
//!   reply (JSON body or SSE event) is written to the registry and made durable **before** that
//!   reply is passed on. The ttl the upstream reports there is capped the same way in the record
//!   (`ttl_ms` and `expires_at` use the smaller of it and `tasks.max_ttl_ms`; `null` or none means
//!   `tasks.max_ttl_ms`), so no upstream can make a record outlive the cap. The reply itself is
//!   passed on with the bytes the upstream sent (the request is rewritten on its way up, replies
//!   are not rewritten on their way down); `tasks/list` shows the capped ttl.
//! - `tasks/get`, `tasks/result`, `tasks/cancel`: a `taskId` that is unknown, expired or owned by
//!   someone else is answered `-32602` "Task not found" here and never forwarded. A known one goes
//!   upstream on the task's recorded `Mcp-Session-Id` (SDK task stores are per session), so a
//!   client that opened a new session (same principal) still reaches it.
//! - `tasks/list`: answered here from the registry: the caller's tasks on this upstream, newest
//!   first, `tasks.list_page_size` per page, opaque `nextCursor` (an invalid cursor is `-32602`).
//!   Each task's status is the last one taskgate saw (a `CreateTaskResult`, a reply to
//!   `tasks/get`, `tasks/cancel` or `tasks/result`, or a `notifications/tasks/status` on any
//!   stream); call `tasks/get` for the upstream's current status.
//! - Every reply to `tasks/get` / `tasks/cancel`, every `tasks/result` result, and every
//!   `notifications/tasks/status` on any stream updates the record, following the spec's
//!   transitions. When the upstream reports another status for a task recorded as terminal, the
//!   message is rewritten to show the recorded status, counted and logged.
//! - `initialize`: when callers cannot be told apart (`[auth] mode = "none"` and the upstream gives
//!   no `Mcp-Session-Id`), `capabilities.tasks.list` is removed from the result and `tasks/list`
//!   is refused with `-32601`.
//!
//! Owners: `principal:<name>` with bearer auth; with `mode = "none"` the client's
//! `session:<Mcp-Session-Id>`, which is weaker (whoever holds the session id is the owner), or
//! `anonymous` without a session (no binding at all; task ids are the upstream's).

use crate::exchange::{McpReply, McpRequest, Operation, ReplyBody};
use crate::jsonrpc::needles::{self, found};
use crate::jsonrpc::{self, Id, Kind, Message};
use crate::layers::extensions::{AuthorisedTask, Upgraded};
use crate::mcp::task::{format_rfc3339_ms, now_ms, parse_rfc3339_ms, TaskStatus};
use crate::registry::{Observed, Registry};
use crate::sse::{Event, EventStream};
use crate::store::{ListCursor, Origin, Owner, TaskRecord};
use base64::Engine;
use bytes::Bytes;
use futures_util::StreamExt;
use http::HeaderValue;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// JSON-RPC code taskgate answers when an owner is over `tasks.max_live_tasks_per_owner`
/// (implementation-defined server error range, -32000 to -32099).
pub const TASK_LIMIT_EXCEEDED: i64 = -32029;

/// Builds [`TasksService`]s over a shared [`Registry`].
#[derive(Clone)]
pub struct TasksLayer {
    registry: Arc<Registry>,
    /// `[auth] mode = "bearer"`: callers are told apart by principal even without sessions.
    authenticated: bool,
}

impl TasksLayer {
    /// `authenticated`: whether `[auth]` identifies callers (bearer mode).
    pub fn new(registry: Arc<Registry>, authenticated: bool) -> TasksLayer {
        TasksLayer {
            registry,
            authenticated,
        }
    }
}

impl<S> tower::Layer<S> for TasksLayer {
    type Service = TasksService<S>;

    fn layer(&self, inner: S) -> TasksService<S> {
        TasksService {
            inner,
            registry: self.registry.clone(),
            authenticated: self.authenticated,
        }
    }
}

/// The `tasks` layer's service (see the module docs).
#[derive(Clone)]
pub struct TasksService<S> {
    inner: S,
    registry: Arc<Registry>,
    authenticated: bool,
}

type BoxFut<E> = Pin<Box<dyn Future<Output = Result<McpReply, E>> + Send>>;

/// What the reply watcher looks for in the reply to one request.
#[derive(Clone)]
enum Expect {
    /// Nothing beyond status notifications.
    Nothing,
    /// A `CreateTaskResult` answering `id`; the record to write is completed from it.
    Creation {
        id: Id,
        template: Box<TaskRecord>,
        /// The client's request (for `notifications/cancelled` routing).
        key: crate::exchange::CallKey,
        /// `params._meta.progressToken` as JSON text.
        progress_token: Option<String>,
    },
    /// The reply to `tasks/get` / `tasks/cancel` (a Task) or `tasks/result` (the payload).
    TaskReply {
        id: Id,
        method: &'static str,
        task_id: String,
    },
    /// An `InitializeResult`; `capabilities.tasks.list` is removed when `hide_list` is set.
    Initialize { id: Id, hide_list: bool },
}

impl<S> tower::Service<McpRequest> for TasksService<S>
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
        let registry = self.registry.clone();
        let inner = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, inner);
        let method = req.request_method().map(str::to_string);
        let expect = match method.as_deref() {
            Some("tools/call") => match self.prepare_creation(&mut req) {
                Ok(e) => e,
                Err(reply) => return Box::pin(async move { Ok(reply) }),
            },
            Some(m @ ("tasks/get" | "tasks/result" | "tasks/cancel")) => {
                match self.route_task_request(&mut req, m) {
                    Ok(e) => e,
                    Err(reply) => return Box::pin(async move { Ok(reply) }),
                }
            }
            Some("tasks/list") => {
                let reply = self.list(&req);
                return Box::pin(async move { Ok(reply) });
            }
            Some("initialize") => Expect::Initialize {
                id: req.id().cloned().expect("a request has an id"),
                hide_list: !self.authenticated,
            },
            _ => Expect::Nothing,
        };
        let upstream = req.ctx.upstream.clone();
        let principal = req.ctx.principal.clone();
        Box::pin(async move {
            let reply = inner.call(req).await;
            let mut reply = match reply {
                Ok(r) => r,
                Err(e) => {
                    if let Expect::Creation { template, .. } = &expect {
                        registry.release_slot(&template.upstream, &template.owner);
                    }
                    return Err(e);
                }
            };
            if let Expect::Initialize { id, .. } = &expect {
                let session = reply.headers.get("mcp-session-id").cloned();
                let has_session = session.is_some();
                let caller = crate::exchange::Caller {
                    principal,
                    client_session: session,
                };
                registry.note_initialize(&upstream, caller, id.clone());
                if has_session {
                    // A session tells callers apart: nothing to hide.
                    return Ok(reply);
                }
            }
            if matches!(expect, Expect::Nothing) && !matches!(reply.body, ReplyBody::Stream(_)) {
                // Fast path: a JSON answer to an ordinary request carries nothing to record.
                return Ok(reply);
            }
            let watch = Arc::new(ReplyWatch {
                registry,
                upstream,
                expect: Mutex::new(expect),
                hold: Mutex::new(None),
            });
            // Dropped when the reply is done with: gives back a creation's slot if no
            // CreateTaskResult came (an error, a plain answer, a broken stream).
            let guard = CreationGuard(watch.clone());
            reply.body = match reply.body {
                ReplyBody::Json(bytes) => ReplyBody::Json(watch.on_message(bytes).await),
                ReplyBody::Stream(events) => ReplyBody::Stream(ReplyWatch::watch(guard, events)),
                other => other,
            };
            Ok(reply)
        })
    }
}

impl<S> TasksService<S> {
    /// For a task-augmented `tools/call`: owner limit, ttl cap, and what to record.
    fn prepare_creation(&self, req: &mut McpRequest) -> Result<Expect, McpReply> {
        let Operation::Post(msg) = &req.op else {
            return Ok(Expect::Nothing);
        };
        // Cheap pre-check: plain tool calls (the common case) are not parsed twice. A message
        // with escapes may spell the key `"t\u0061sk"`: those are always parsed.
        if !crate::jsonrpc::contains(msg.bytes(), b"\"task\"")
            && !crate::jsonrpc::contains(msg.bytes(), b"\\u")
        {
            return Ok(Expect::Nothing);
        }
        let id = msg.id().cloned().expect("a request has an id");
        let mut value = match serde_json::from_slice::<Value>(msg.bytes()) {
            Ok(v) => v,
            // taskgate must know whether this is a task before it goes upstream; a message it
            // cannot read (numbers beyond f64, nesting deeper than 128) is not forwarded.
            Err(e) => {
                return Err(McpReply::local_error(
                    Some(&id),
                    jsonrpc::INVALID_PARAMS,
                    &format!("tools/call: params cannot be read: {e}"),
                ))
            }
        };
        let Some(task_meta) = value.pointer("/params/task") else {
            return Ok(Expect::Nothing);
        };
        if !task_meta.is_object() {
            return Ok(Expect::Nothing);
        }
        let owner = req.ctx.caller().owner();
        let registry = &self.registry;
        let upstream = req.ctx.upstream.clone();
        let Some(reservation) = registry.reserve(&upstream, &owner) else {
            registry
                .metrics()
                .task_creation_refused_total
                .with_label_values(&[&upstream, "owner_limit"])
                .inc();
            let limit = registry.config().max_live_tasks_per_owner;
            return Err(McpReply::local_error(
                Some(&id),
                TASK_LIMIT_EXCEEDED,
                &format!(
                    "Task limit reached: this caller already has {limit} unfinished tasks on upstream `{upstream}` (tasks.max_live_tasks_per_owner); wait for one to finish or cancel one"
                ),
            ));
        };
        // The slot is given back by `release_slot` below when no task is recorded.
        reservation.keep();
        let cap = registry.config().max_ttl_ms;
        // Any number above the cap (1e12 included), or a non-integer, is lowered to the cap.
        let over_cap = match task_meta.get("ttl") {
            Some(Value::Number(n)) => n.as_u64().is_none_or(|t| t > cap),
            _ => false,
        };
        if over_cap {
            value["params"]["task"]["ttl"] = Value::from(cap);
            let bytes = Bytes::from(serde_json::to_vec(&value).expect("re-serialise a message"));
            req.op =
                Operation::Post(Message::parse(bytes).expect("a re-serialised message parses"));
        }
        let tool = value
            .pointer("/params/name")
            .and_then(Value::as_str)
            .map(str::to_string);
        let template = TaskRecord {
            upstream: upstream.to_string(),
            task_id: String::new(),
            owner,
            upstream_session: header_string(req.ctx.session_id.as_ref()),
            origin: if req.extensions.get::<Upgraded>().is_some() {
                Origin::Upgraded
            } else {
                Origin::Client
            },
            tool,
            protocol_version: header_string(req.ctx.protocol_version()),
            status: TaskStatus::Working,
            status_message: None,
            created_at: String::new(),
            last_updated_at: String::new(),
            ttl_ms: None,
            poll_interval_ms: None,
            recorded_at: 0,
            cancel_requested_at: None,
            cancelled_at: None,
            released_at: None,
            terminal_at: None,
            late_result_at: None,
            expires_at: 0,
        };
        let progress_token = value
            .pointer("/params/_meta/progressToken")
            .map(Value::to_string);
        Ok(Expect::Creation {
            key: req.ctx.call_key(&id),
            id,
            template: Box::new(template),
            progress_token,
        })
    }

    /// For `tasks/get|result|cancel`: authorise against the registry and route to the task's session.
    fn route_task_request(&self, req: &mut McpRequest, method: &str) -> Result<Expect, McpReply> {
        let Operation::Post(msg) = &req.op else {
            return Ok(Expect::Nothing);
        };
        let id = msg.id().cloned().expect("a tasks/* request has an id");
        let task_id = match task_id_param(msg) {
            Some(t) => t,
            None => {
                return Err(McpReply::local_error(
                    Some(&id),
                    jsonrpc::INVALID_PARAMS,
                    &format!("{method}: params.taskId (a string) is required"),
                ))
            }
        };
        let owner = req.ctx.caller().owner();
        let Some(record) = self.registry.lookup(&req.ctx.upstream, &task_id, &owner) else {
            self.registry
                .metrics()
                .task_lookups_rejected_total
                .with_label_values(&[&req.ctx.upstream, method])
                .inc();
            if method == "tasks/cancel" {
                self.registry
                    .metrics()
                    .cancel_requests_total
                    .with_label_values(&[&req.ctx.upstream, "rejected_unknown"])
                    .inc();
            }
            return Err(McpReply::local_error(
                Some(&id),
                jsonrpc::INVALID_PARAMS,
                &format!("Task not found: {task_id}"),
            ));
        };
        req.ctx.session_id = record
            .upstream_session
            .as_deref()
            .and_then(|s| HeaderValue::from_str(s).ok());
        req.extensions.insert(AuthorisedTask { record });
        let method = match method {
            "tasks/get" => "tasks/get",
            "tasks/result" => "tasks/result",
            _ => "tasks/cancel",
        };
        Ok(Expect::TaskReply {
            id,
            method,
            task_id,
        })
    }

    /// `tasks/list` from the registry.
    fn list(&self, req: &McpRequest) -> McpReply {
        let Operation::Post(msg) = &req.op else {
            return McpReply::accepted();
        };
        let id = msg.id().cloned().expect("tasks/list is a request");
        let owner = req.ctx.caller().owner();
        if owner == Owner::Anonymous && !self.authenticated {
            return McpReply::local_error(
                Some(&id),
                jsonrpc::METHOD_NOT_FOUND,
                "tasks/list is not available: without [auth] and without an Mcp-Session-Id taskgate cannot tell callers apart",
            );
        }
        let params: Value = msg
            .parse_as::<Value>()
            .ok()
            .and_then(|v| v.get("params").cloned())
            .unwrap_or(Value::Null);
        let store = &self.registry.store();
        let upstream = &req.ctx.upstream;
        let cursor = match params.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => {
                let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(c)
                    .ok()
                    .map(ListCursor)
                    .filter(|c| store.cursor_is_valid(upstream, &owner, c));
                match decoded {
                    Some(c) => Some(c),
                    None => {
                        return McpReply::local_error(
                            Some(&id),
                            jsonrpc::INVALID_PARAMS,
                            "tasks/list: invalid cursor",
                        )
                    }
                }
            }
            Some(_) => {
                return McpReply::local_error(
                    Some(&id),
                    jsonrpc::INVALID_PARAMS,
                    "tasks/list: invalid cursor (must be a string)",
                )
            }
        };
        // `[tasks] list_page_size` is 1..=1000, checked at load.
        let limit = self.registry.config().list_page_size;
        match store.list_owner(upstream, &owner, cursor.as_ref(), limit) {
            Ok((page, next)) => {
                let now = now_ms();
                let tasks: Vec<_> = page
                    .iter()
                    .filter(|r| !r.is_expired(now))
                    .map(TaskRecord::to_task)
                    .collect();
                let mut result = serde_json::json!({ "tasks": tasks });
                if let Some(next) = next {
                    result["nextCursor"] = Value::String(
                        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(next.0),
                    );
                }
                McpReply::local_json(jsonrpc::result_response(&id, &result.to_string()))
            }
            Err(e) => McpReply::local_error(
                Some(&id),
                jsonrpc::INTERNAL_ERROR,
                &format!("tasks/list: the task registry failed: {e}"),
            ),
        }
    }
}

/// Watches one reply: the message answering the request, and status notifications.
struct ReplyWatch {
    registry: Arc<Registry>,
    upstream: Arc<str>,
    expect: Mutex<Expect>,
    /// Held while this reply's stream relays a task's messages (see `layers::cancel`).
    hold: Mutex<Option<crate::registry::ResourceHold>>,
}

impl ReplyWatch {
    fn watch(guard: CreationGuard, events: EventStream) -> EventStream {
        Box::pin(events.then(move |event| {
            let this = guard.0.clone();
            async move { this.on_event(event).await }
        }))
    }

    async fn on_event(self: Arc<Self>, mut event: Event) -> Event {
        // Most events (progress, logging, results of ordinary calls) concern nothing here: they
        // pass without a copy or a parse.
        let Some(data) = event.data.as_ref().filter(|d| self.cares(d.as_bytes())) else {
            return event;
        };
        let original = Bytes::copy_from_slice(data.as_bytes());
        let bytes = self.on_message(original.clone()).await;
        if bytes != original {
            event.data = Some(String::from_utf8_lossy(&bytes).into_owned());
        }
        event
    }

    /// Whether a message may concern this watch: a status or task-related message, or (while
    /// the answer is awaited) any message.
    fn cares(&self, bytes: &[u8]) -> bool {
        !matches!(*self.expect.lock().expect("expect lock"), Expect::Nothing)
            || found(&needles::TASK_STATUS, bytes)
            || (self.registry.releases().is_tracking()
                && (found(&needles::PROGRESS, bytes) || found(&needles::RELATED_TASK, bytes)))
    }

    /// Inspects one JSON-RPC message of the reply; returns it, rewritten if needed.
    async fn on_message(self: Arc<Self>, bytes: Bytes) -> Bytes {
        let is_status = found(&needles::TASK_STATUS, &bytes);
        let is_activity = self.registry.releases().is_tracking()
            && (found(&needles::PROGRESS, &bytes) || found(&needles::RELATED_TASK, &bytes));
        let expect = self.expect.lock().expect("expect lock").clone();
        let waiting_for = match &expect {
            Expect::Nothing => None,
            Expect::Creation { id, .. }
            | Expect::TaskReply { id, .. }
            | Expect::Initialize { id, .. } => Some(id.clone()),
        };
        if !is_status && !is_activity && waiting_for.is_none() {
            return bytes;
        }
        let Ok(msg) = Message::parse(bytes.clone()) else {
            return bytes;
        };
        if is_status || is_activity {
            // One parse serves the activity note and the status update.
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                self.registry.note_activity_in(&self.upstream, &value);
                if msg.method() == Some("notifications/tasks/status") {
                    return self.on_status_notification(bytes, value);
                }
            }
        }
        if msg.id().is_none()
            || msg.id() != waiting_for.as_ref()
            || !matches!(msg.kind(), Kind::Response | Kind::Error)
        {
            return bytes;
        }
        *self.expect.lock().expect("expect lock") = Expect::Nothing;
        match expect {
            Expect::Creation {
                id,
                template,
                key,
                progress_token,
            } => {
                let (out, created) = self.on_creation(bytes, &id, *template).await;
                if let Some(task_id) = created {
                    self.registry.note_creation(key, &task_id, progress_token);
                    *self.hold.lock().expect("hold lock") =
                        Some(self.registry.releases().hold(&self.upstream, &task_id));
                }
                out
            }
            Expect::TaskReply {
                method, task_id, ..
            } => self.on_task_reply(bytes, method, &task_id),
            Expect::Initialize {
                hide_list: true, ..
            } => hide_tasks_list(bytes),
            Expect::Initialize { .. } => bytes,
            Expect::Nothing => bytes,
        }
    }

    fn on_status_notification(&self, bytes: Bytes, mut value: Value) -> Bytes {
        let Some(params) = value.get("params") else {
            return bytes;
        };
        match self
            .registry
            .observe_task(&self.upstream, params, "notifications/tasks/status")
        {
            observed @ Observed::Rewrite { .. } => {
                observed.rewrite(&mut value["params"]);
                Bytes::from(serde_json::to_vec(&value).expect("re-serialise"))
            }
            _ => bytes,
        }
    }

    /// Records a `CreateTaskResult`; returns the message to pass on and the recorded taskId.
    async fn on_creation(
        &self,
        bytes: Bytes,
        id: &Id,
        mut record: TaskRecord,
    ) -> (Bytes, Option<String>) {
        let value: Value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(_) => {
                self.registry.release_slot(&record.upstream, &record.owner);
                return (bytes, None);
            }
        };
        let Some(task) = value
            .pointer("/result/task")
            .filter(|t| t.get("taskId").is_some())
        else {
            // Not a CreateTaskResult (an error, or a server that ran the call plainly).
            self.registry.release_slot(&record.upstream, &record.owner);
            return (bytes, None);
        };
        let Some(task_id) = task.get("taskId").and_then(Value::as_str) else {
            self.registry.release_slot(&record.upstream, &record.owner);
            return (bytes, None);
        };
        let now = now_ms();
        record.task_id = task_id.to_string();
        record.status = task
            .get("status")
            .and_then(Value::as_str)
            .and_then(TaskStatus::parse)
            .unwrap_or(TaskStatus::Working);
        record.status_message = task
            .get("statusMessage")
            .and_then(Value::as_str)
            .map(str::to_string);
        record.created_at = task
            .get("createdAt")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format_rfc3339_ms(now));
        record.last_updated_at = task
            .get("lastUpdatedAt")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| record.created_at.clone());
        // The upstream's ttl is capped like a requested one: a number above the cap (or not an
        // integer) counts as the cap; `null` or no ttl means the cap too (below).
        let cap = self.registry.config().max_ttl_ms;
        record.ttl_ms = match task.get("ttl") {
            Some(Value::Number(n)) => Some(n.as_u64().map_or(cap, |t| t.min(cap))),
            _ => None,
        };
        record.poll_interval_ms = task.get("pollInterval").and_then(Value::as_u64);
        record.recorded_at = now;
        if record.status.is_terminal() {
            record.terminal_at = Some(now);
        }
        let ttl = record.ttl_ms.unwrap_or(cap);
        // The upstream's createdAt, unless its clock is off: in the future, or so far in the
        // past that the task would be expired on arrival; then taskgate's clock.
        let created = parse_rfc3339_ms(&record.created_at)
            .filter(|c| *c <= now && now - c < ttl)
            .unwrap_or(now);
        record.expires_at = created.saturating_add(ttl);
        let task_id = record.task_id.clone();
        match self.registry.record_creation(record).await {
            Ok(()) => (bytes, Some(task_id)),
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

    fn on_task_reply(&self, bytes: Bytes, method: &str, task_id: &str) -> Bytes {
        let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
            return bytes;
        };
        let Some(result) = value.get("result") else {
            return bytes;
        };
        match method {
            "tasks/result" => {
                // A payload means the task is terminal: failed for an isError tool result. It
                // carries no status, so it never contradicts a recorded terminal status (the
                // Python SDK answers an empty result for a cancelled task).
                if self
                    .registry
                    .store()
                    .get(&self.upstream, task_id)
                    .ok()
                    .flatten()
                    .is_none_or(|r| r.status.is_terminal())
                {
                    return bytes;
                }
                let failed = result.get("isError").and_then(Value::as_bool) == Some(true);
                let status = if failed {
                    TaskStatus::Failed
                } else {
                    TaskStatus::Completed
                };
                self.registry.apply_status(
                    &self.upstream,
                    task_id,
                    status,
                    None,
                    None,
                    None,
                    "tasks/result",
                );
                bytes
            }
            _ => match self.registry.observe_task(&self.upstream, result, method) {
                observed @ Observed::Rewrite { .. } => {
                    observed.rewrite(&mut value["result"]);
                    Bytes::from(serde_json::to_vec(&value).expect("re-serialise"))
                }
                _ => bytes,
            },
        }
    }
}

/// Gives back a creation's reserved slot if the reply stream ends (or is dropped) before the
/// `CreateTaskResult` arrived.
struct CreationGuard(Arc<ReplyWatch>);

impl Drop for CreationGuard {
    fn drop(&mut self) {
        let expect = std::mem::replace(
            &mut *self.0.expect.lock().expect("expect lock"),
            Expect::Nothing,
        );
        if let Expect::Creation { template, .. } = expect {
            self.0
                .registry
                .release_slot(&template.upstream, &template.owner);
        }
    }
}

/// Removes `result.capabilities.tasks.list` from an `InitializeResult`.
fn hide_tasks_list(bytes: Bytes) -> Bytes {
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return bytes;
    };
    let removed = value
        .pointer_mut("/result/capabilities/tasks")
        .and_then(Value::as_object_mut)
        .and_then(|t| t.remove("list"))
        .is_some();
    if !removed {
        return bytes;
    }
    tracing::info!("no auth and no session: tasks.list removed from the upstream's capabilities");
    Bytes::from(serde_json::to_vec(&value).expect("re-serialise"))
}

fn task_id_param(msg: &Message) -> Option<String> {
    let v: Value = msg.parse_as().ok()?;
    v.get("params")?
        .as_object()?
        .get("taskId")?
        .as_str()
        .map(str::to_string)
}

fn header_string(v: Option<&HeaderValue>) -> Option<String> {
    v.and_then(|v| v.to_str().ok()).map(str::to_string)
}
