//! The `tasks` layer: records every task, binds it to its owner, routes `tasks/*` to the upstream
//! session that holds the task, and keeps terminal statuses terminal
//! (2025-11-25 basic/utilities/tasks).
//!
//! What it does to which messages:
//! - `tools/call` with `params.task` (task-augmented): refused locally with [`TASK_LIMIT_EXCEEDED`]
//!   when the owner already has `tasks.max_live_tasks_per_owner` live tasks on this upstream;
//!   `params.task.ttl` above `tasks.max_ttl_ms` is lowered to it; the `CreateTaskResult` in the
//!   reply (JSON body or SSE event) is written to the registry and made durable **before** that
//!   reply is passed on.
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

use crate::config::TasksConfig;
use crate::exchange::{McpReply, McpRequest, Operation, Principal, ReplyBody, RequestContext};
use crate::jsonrpc::{self, Id, Kind, Message};
use crate::layers::cancel::Releases;
use crate::mcp::task::{format_rfc3339_ms, now_ms, parse_rfc3339_ms, TaskStatus};
use crate::metrics::Metrics;
use crate::sse::{Event, EventStream};
use crate::store::{AuditEvent, ListCursor, Origin, StoreError, TaskRecord, TaskStore};
use base64::Engine;
use bytes::Bytes;
use futures_util::StreamExt;
use http::HeaderValue;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// JSON-RPC code taskgate answers when an owner is over `tasks.max_live_tasks_per_owner`
/// (implementation-defined server error range, -32000 to -32099).
pub const TASK_LIMIT_EXCEEDED: i64 = -32029;

/// The registry's shared state: the store, the live-task counts and the status logic. Used by
/// the `tasks` and `cancel` layers and the sweeper.
pub struct Registry {
    store: Arc<dyn TaskStore>,
    metrics: Arc<Metrics>,
    config: TasksConfig,
    /// Live (non-terminal) tasks per (upstream, owner), including reservations for creations in
    /// flight.
    live: Mutex<HashMap<(Arc<str>, String), usize>>,
    /// Request facts `notifications/cancelled` routing needs (bounded).
    requests: Mutex<RequestNotes>,
    /// The "resources released" tracker.
    releases: Arc<Releases>,
}

/// Bounded in-memory notes about client requests (cleared when they grow past a limit).
#[derive(Default)]
struct RequestNotes {
    /// (upstream, session) → the id of that session's `initialize`.
    initialize: HashMap<(Arc<str>, Option<HeaderValue>), Id>,
    /// (upstream, session, request id) → the taskId its `CreateTaskResult` carried.
    creations: HashMap<(Arc<str>, Option<HeaderValue>, Id), String>,
    /// (upstream, progressToken JSON) → taskId, for tasks not yet released.
    progress: HashMap<(Arc<str>, String), String>,
}

const NOTES_LIMIT: usize = 100_000;

/// What a status report did to the record.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    /// The task is not in the registry.
    Unknown,
    /// The record now holds this status (possibly unchanged).
    Recorded(TaskStatus),
    /// The record is terminal with another status; the message must show `status`.
    Rewrite {
        /// The recorded terminal status.
        status: TaskStatus,
        /// The recorded `statusMessage`.
        status_message: Option<String>,
    },
}

/// The owner key of a caller (see the module docs).
pub fn owner_of(ctx: &RequestContext) -> String {
    match &ctx.principal {
        Principal::Token(p) => format!("principal:{p}"),
        Principal::Anonymous => match ctx.session_id.as_ref().and_then(|s| s.to_str().ok()) {
            Some(s) => format!("session:{s}"),
            None => "anonymous".to_string(),
        },
    }
}

impl Registry {
    /// Builds the registry over `store` and counts what it holds (for the gauges and limits).
    pub fn new(
        store: Arc<dyn TaskStore>,
        metrics: Arc<Metrics>,
        config: TasksConfig,
    ) -> Result<Arc<Registry>, StoreError> {
        let mut live: HashMap<(Arc<str>, String), usize> = HashMap::new();
        let mut by_status: HashMap<(String, TaskStatus), i64> = HashMap::new();
        store.scan(&mut |r| {
            if !r.status.is_terminal() {
                *live
                    .entry((Arc::from(r.upstream.as_str()), r.owner.clone()))
                    .or_default() += 1;
            }
            *by_status.entry((r.upstream.clone(), r.status)).or_default() += 1;
            true
        })?;
        for ((up, status), n) in by_status {
            metrics
                .tasks
                .with_label_values(&[&up, status.as_str()])
                .set(n);
        }
        let quiet = std::time::Duration::from_millis(config.release_quiet_ms);
        let mut unreleased = Vec::new();
        store.scan(&mut |r| {
            if r.cancelled_at.is_some() && r.released_at.is_none() {
                unreleased.push((r.upstream, r.task_id));
            }
            true
        })?;
        metrics
            .tasks_cancelled_unreleased
            .set(unreleased.len() as i64);
        let registry = Arc::new_cyclic(|weak| Registry {
            store,
            metrics,
            config,
            live: Mutex::new(live),
            requests: Mutex::new(RequestNotes::default()),
            releases: Arc::new(Releases::new(weak.clone(), quiet)),
        });
        for (up, id) in unreleased {
            registry.releases.cancelled(&up, &id, "restart");
        }
        Ok(registry)
    }

    /// The "resources released" tracker.
    pub fn releases(&self) -> &Arc<Releases> {
        &self.releases
    }

    /// Remembers the `initialize` id of a session.
    pub fn note_initialize(&self, upstream: &Arc<str>, session: Option<HeaderValue>, id: Id) {
        let mut notes = self.requests.lock().expect("notes lock");
        if notes.initialize.len() >= NOTES_LIMIT {
            notes.initialize.clear();
        }
        notes.initialize.insert((upstream.clone(), session), id);
    }

    /// Whether `id` is the `initialize` of that session.
    pub fn is_initialize_id(
        &self,
        upstream: &Arc<str>,
        session: Option<&HeaderValue>,
        id: &Id,
    ) -> bool {
        let notes = self.requests.lock().expect("notes lock");
        notes
            .initialize
            .get(&(upstream.clone(), session.cloned()))
            .is_some_and(|i| i == id)
    }

    /// The taskId a request of that session created, if it did.
    pub fn task_of_request(
        &self,
        upstream: &Arc<str>,
        session: Option<&HeaderValue>,
        id: &Id,
    ) -> Option<String> {
        let notes = self.requests.lock().expect("notes lock");
        notes
            .creations
            .get(&(upstream.clone(), session.cloned(), id.clone()))
            .cloned()
    }

    fn note_creation(
        &self,
        upstream: &Arc<str>,
        session: Option<HeaderValue>,
        id: Id,
        task_id: &str,
        progress_token: Option<String>,
    ) {
        let mut notes = self.requests.lock().expect("notes lock");
        if notes.creations.len() >= NOTES_LIMIT {
            notes.creations.clear();
        }
        notes
            .creations
            .insert((upstream.clone(), session, id), task_id.to_string());
        if let Some(token) = progress_token {
            if notes.progress.len() >= NOTES_LIMIT {
                notes.progress.clear();
            }
            notes
                .progress
                .insert((upstream.clone(), token), task_id.to_string());
        }
    }

    /// The upstream sent something about a message's task (progress on its token, related-task
    /// `_meta`, a status notification): restarts the release quiet window.
    pub fn note_activity_in(&self, upstream: &Arc<str>, msg: &Value) {
        let params = msg.get("params");
        let mut task_id = None;
        if msg.get("method").and_then(Value::as_str) == Some("notifications/progress") {
            if let Some(token) = params.and_then(|p| p.get("progressToken")) {
                let notes = self.requests.lock().expect("notes lock");
                task_id = notes
                    .progress
                    .get(&(upstream.clone(), token.to_string()))
                    .cloned();
            }
        }
        if task_id.is_none() {
            task_id = [params, msg.get("result")]
                .into_iter()
                .flatten()
                .find_map(|p| {
                    p.pointer("/_meta/io.modelcontextprotocol~1related-task/taskId")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
        }
        if task_id.is_none()
            && msg.get("method").and_then(Value::as_str) == Some("notifications/tasks/status")
        {
            task_id = params
                .and_then(|p| p.get("taskId"))
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        if let Some(task_id) = task_id {
            if self.releases.activity(upstream, &task_id) {
                self.metrics
                    .task_activity_after_cancel_total
                    .with_label_values(&[upstream])
                    .inc();
            }
        }
    }

    /// Records the "resources released" audit fact (once).
    pub fn record_released(&self, upstream: &str, task_id: &str, reason: &'static str) {
        let now = now_ms();
        let updated = self.store.update(upstream, task_id, &mut |r| {
            if r.released_at.is_some() || r.cancelled_at.is_none() {
                return false;
            }
            r.released_at = Some(now);
            true
        });
        let Ok(Some((before, after))) = updated else {
            return;
        };
        if before.released_at.is_some() || after.released_at.is_none() {
            return;
        }
        self.metrics
            .task_resources_released_total
            .with_label_values(&[upstream, reason])
            .inc();
        self.metrics.tasks_cancelled_unreleased.dec();
        if let Some(c) = after.cancelled_at {
            self.metrics
                .cancelled_to_released_seconds
                .observe(now.saturating_sub(c) as f64 / 1000.0);
        }
        {
            let mut notes = self.requests.lock().expect("notes lock");
            notes.progress.retain(|_, t| t != task_id);
        }
        self.audit(&after, "resources_released", format!("reason={reason}"));
        self.store.sync_soon();
    }

    /// The store behind the registry.
    pub fn store(&self) -> &Arc<dyn TaskStore> {
        &self.store
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The `[tasks]` settings.
    pub fn config(&self) -> &TasksConfig {
        &self.config
    }

    /// Reserves a live-task slot for `owner`; false when the owner is at the limit.
    fn reserve(&self, upstream: &Arc<str>, owner: &str) -> bool {
        let mut live = self.live.lock().expect("live lock");
        let n = live
            .entry((upstream.clone(), owner.to_string()))
            .or_default();
        if *n >= self.config.max_live_tasks_per_owner {
            return false;
        }
        *n += 1;
        true
    }

    fn release_slot(&self, upstream: &str, owner: &str) {
        let mut live = self.live.lock().expect("live lock");
        if let Some(n) = live.get_mut(&(Arc::from(upstream), owner.to_string())) {
            *n = n.saturating_sub(1);
        }
    }

    /// The record of a task if `owner` may see it now; `None` for unknown, expired or foreign.
    pub fn lookup(&self, upstream: &str, task_id: &str, owner: &str) -> Option<TaskRecord> {
        match self.store.get(upstream, task_id) {
            Ok(Some(r)) if r.owner == owner && !r.is_expired(now_ms()) => Some(r),
            Ok(_) => None,
            Err(e) => {
                tracing::error!(error = %e, "task store read failed");
                None
            }
        }
    }

    /// Appends an audit event and logs it with target `taskgate::audit`.
    pub fn audit(&self, record: &TaskRecord, event: &str, detail: String) {
        tracing::info!(
            target: "taskgate::audit",
            upstream = %record.upstream,
            task_id = %record.task_id,
            owner = %record.owner,
            event,
            detail = %detail,
            "task audit event"
        );
        let ev = AuditEvent {
            time: now_ms(),
            upstream: record.upstream.clone(),
            task_id: record.task_id.clone(),
            owner: record.owner.clone(),
            event: event.to_string(),
            detail,
        };
        if let Err(e) = self.store.append_audit(&ev) {
            self.metrics.store_write_failures_total.inc();
            tracing::error!(error = %e, "audit append failed");
        }
    }

    /// Applies a status report (a `Task` object: `tasks/get` / `tasks/cancel` result,
    /// `notifications/tasks/status` params) to the record of `(upstream, taskId)`.
    pub fn observe_task(&self, upstream: &str, task: &Value, source: &str) -> Observed {
        let Some(task_id) = task.get("taskId").and_then(Value::as_str) else {
            return Observed::Unknown;
        };
        let Some(status) = task
            .get("status")
            .and_then(Value::as_str)
            .and_then(TaskStatus::parse)
        else {
            return Observed::Unknown;
        };
        let message = task
            .get("statusMessage")
            .and_then(Value::as_str)
            .map(str::to_string);
        let updated_at = task
            .get("lastUpdatedAt")
            .and_then(Value::as_str)
            .map(str::to_string);
        let poll = task.get("pollInterval").and_then(Value::as_u64);
        self.apply_status(upstream, task_id, status, message, updated_at, poll, source)
    }

    /// Records that the task reached `status` (see [`Registry::observe_task`]).
    #[allow(clippy::too_many_arguments)]
    pub fn apply_status(
        &self,
        upstream: &str,
        task_id: &str,
        status: TaskStatus,
        message: Option<String>,
        updated_at: Option<String>,
        poll_interval_ms: Option<u64>,
        source: &str,
    ) -> Observed {
        let now = now_ms();
        let result = self.store.update(upstream, task_id, &mut |r| {
            if !r.status.can_become(status) {
                return false;
            }
            r.status = status;
            if message.is_some() {
                r.status_message = message.clone();
            }
            if let Some(u) = &updated_at {
                r.last_updated_at = u.clone();
            }
            if poll_interval_ms.is_some() {
                r.poll_interval_ms = poll_interval_ms;
            }
            if status.is_terminal() && r.terminal_at.is_none() {
                r.terminal_at = Some(now);
            }
            if status == TaskStatus::Cancelled && r.cancelled_at.is_none() {
                r.cancelled_at = Some(now);
            }
            true
        });
        let (before, after) = match result {
            Ok(Some(pair)) => pair,
            Ok(None) => return Observed::Unknown,
            Err(e) => {
                self.metrics.store_write_failures_total.inc();
                tracing::error!(error = %e, "task store update failed");
                return Observed::Unknown;
            }
        };
        if before.status != after.status {
            self.on_transition(&before, &after, source);
            self.store.sync_soon();
            return Observed::Recorded(after.status);
        }
        if after.status.is_terminal() && status != after.status {
            // The first terminal state wins forever (2025-11-25 tasks: a terminal status MUST NOT change).
            let up = after.upstream.as_str();
            self.metrics
                .task_terminal_rewrites_total
                .with_label_values(&[up])
                .inc();
            if status.is_terminal() {
                self.metrics
                    .task_late_results_total
                    .with_label_values(&[up])
                    .inc();
                self.audit(
                    &after,
                    "late_result",
                    format!("{source} reported {status} after {}", after.status),
                );
            }
            if after.status == TaskStatus::Cancelled {
                self.metrics
                    .task_activity_after_cancel_total
                    .with_label_values(&[up])
                    .inc();
            }
            if status.is_terminal() {
                tracing::warn!(
                    upstream = up,
                    task_id = %after.task_id,
                    recorded = %after.status,
                    reported = %status,
                    source,
                    "upstream reported another terminal status for a terminal task; showing the recorded one"
                );
            } else {
                // Usually a benign race: a reply saying `working` overtaken by the terminal
                // status notification.
                tracing::debug!(
                    upstream = up,
                    task_id = %after.task_id,
                    recorded = %after.status,
                    reported = %status,
                    source,
                    "stale non-terminal status for a terminal task; showing the recorded one"
                );
            }
            return Observed::Rewrite {
                status: after.status,
                status_message: after.status_message.clone(),
            };
        }
        if before != after {
            self.store.sync_soon();
        }
        Observed::Recorded(after.status)
    }

    fn on_transition(&self, before: &TaskRecord, after: &TaskRecord, source: &str) {
        let up = after.upstream.as_str();
        self.metrics
            .task_status_transitions_total
            .with_label_values(&[up, before.status.as_str(), after.status.as_str()])
            .inc();
        self.metrics
            .tasks
            .with_label_values(&[up, before.status.as_str()])
            .dec();
        self.metrics
            .tasks
            .with_label_values(&[up, after.status.as_str()])
            .inc();
        if after.status.is_terminal() && !before.status.is_terminal() {
            self.release_slot(up, &after.owner);
        }
        if after.cancelled_at.is_some() && before.cancelled_at.is_none() {
            // Audit fact 1: status cancelled.
            self.metrics
                .tasks_cancelled_total
                .with_label_values(&[up])
                .inc();
            self.metrics.tasks_cancelled_unreleased.inc();
            if let (Some(asked), Some(done)) = (after.cancel_requested_at, after.cancelled_at) {
                self.metrics
                    .cancel_to_cancelled_seconds
                    .observe(done.saturating_sub(asked) as f64 / 1000.0);
            }
            self.audit(after, "status_cancelled", format!("seen in {source}"));
            self.releases.cancelled(up, &after.task_id, "quiet");
        }
    }

    /// Writes a new record durably and counts it. The owner's slot must have been reserved.
    async fn record_creation(&self, record: TaskRecord) -> Result<(), StoreError> {
        let up = record.upstream.clone();
        let status = record.status;
        let origin = record.origin;
        let result = self.store.create(record.clone()).await;
        match &result {
            Ok(()) => {
                self.metrics
                    .tasks_created_total
                    .with_label_values(&[&up, origin.as_str()])
                    .inc();
                self.metrics
                    .tasks
                    .with_label_values(&[&up, status.as_str()])
                    .inc();
                if status.is_terminal() {
                    self.release_slot(&up, &record.owner);
                }
                tracing::info!(
                    target: "taskgate::audit",
                    upstream = %up,
                    task_id = %record.task_id,
                    owner = %record.owner,
                    tool = record.tool.as_deref().unwrap_or(""),
                    event = "created",
                    "task created"
                );
            }
            Err(e) => {
                self.metrics.store_write_failures_total.inc();
                self.metrics
                    .task_creation_refused_total
                    .with_label_values(&[&up, "store"])
                    .inc();
                self.release_slot(&up, &record.owner);
                tracing::error!(error = %e, upstream = %up, task_id = %record.task_id, "could not record a task");
            }
        }
        result
    }

    /// Removes records whose ttl is over; returns how many were removed.
    pub fn sweep(&self) -> usize {
        let now = now_ms();
        let keys = match self.store.expired(now, 10_000) {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(error = %e, "sweeper could not read the expiry index");
                return 0;
            }
        };
        let mut removed = 0;
        for (up, id) in keys {
            match self.store.remove(&up, &id) {
                Ok(Some(r)) => {
                    removed += 1;
                    self.metrics
                        .tasks_expired_total
                        .with_label_values(&[&up])
                        .inc();
                    self.metrics
                        .tasks
                        .with_label_values(&[&up, r.status.as_str()])
                        .dec();
                    if !r.status.is_terminal() {
                        self.release_slot(&up, &r.owner);
                    }
                    if r.cancelled_at.is_some() && r.released_at.is_none() {
                        self.releases.forget(&up, &id);
                        self.metrics.tasks_cancelled_unreleased.dec();
                        self.metrics
                            .task_resources_released_total
                            .with_label_values(&[&up, "expired"])
                            .inc();
                    }
                    tracing::debug!(upstream = %up, task_id = %id, "expired task record removed");
                }
                Ok(None) => {}
                Err(e) => tracing::error!(error = %e, "sweeper could not remove a record"),
            }
        }
        if removed > 0 {
            self.store.sync_soon();
        }
        removed
    }
}

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
        /// The client's own session (for `notifications/cancelled` routing).
        client_session: Option<HeaderValue>,
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
        let method = req.method().map(str::to_string);
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
                registry.note_initialize(&upstream, session, id.clone());
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
        // Cheap pre-check: plain tool calls (the common case) are not parsed twice.
        if !memmem(msg.bytes(), b"\"task\"") {
            return Ok(Expect::Nothing);
        }
        let Ok(mut value) = serde_json::from_slice::<Value>(msg.bytes()) else {
            return Ok(Expect::Nothing);
        };
        let Some(task_meta) = value.pointer("/params/task") else {
            return Ok(Expect::Nothing);
        };
        if !task_meta.is_object() {
            return Ok(Expect::Nothing);
        }
        let id = msg.id().cloned().expect("tools/call is a request");
        let owner = owner_of(&req.ctx);
        let registry = &self.registry;
        let upstream = req.ctx.upstream.clone();
        if !registry.reserve(&upstream, &owner) {
            registry
                .metrics
                .task_creation_refused_total
                .with_label_values(&[&upstream, "owner_limit"])
                .inc();
            let limit = registry.config.max_live_tasks_per_owner;
            return Err(McpReply::local_error(
                Some(&id),
                TASK_LIMIT_EXCEEDED,
                &format!(
                    "Task limit reached: this caller already has {limit} unfinished tasks on upstream `{upstream}` (tasks.max_live_tasks_per_owner); wait for one to finish or cancel one"
                ),
            ));
        }
        let cap = registry.config.max_ttl_ms;
        let requested = task_meta.get("ttl").and_then(Value::as_u64);
        if requested.is_some_and(|t| t > cap) {
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
            origin: if req.ctx.upgraded {
                Origin::Upgraded
            } else {
                Origin::Client
            },
            tool,
            protocol_version: header_string(req.ctx.protocol_version.as_ref()),
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
            expires_at: 0,
        };
        let progress_token = value
            .pointer("/params/_meta/progressToken")
            .map(Value::to_string);
        Ok(Expect::Creation {
            id,
            template: Box::new(template),
            client_session: req.ctx.client_session_id.clone(),
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
        let owner = owner_of(&req.ctx);
        let Some(record) = self.registry.lookup(&req.ctx.upstream, &task_id, &owner) else {
            self.registry
                .metrics
                .task_lookups_rejected_total
                .with_label_values(&[&req.ctx.upstream, method])
                .inc();
            if method == "tasks/cancel" {
                self.registry
                    .metrics
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
        let owner = owner_of(&req.ctx);
        if owner == "anonymous" && !self.authenticated {
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
        let store = &self.registry.store;
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
        let limit = self.registry.config.list_page_size.max(1);
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
    hold: Mutex<Option<crate::layers::cancel::ResourceHold>>,
}

impl ReplyWatch {
    fn watch(guard: CreationGuard, events: EventStream) -> EventStream {
        Box::pin(events.then(move |event| {
            let this = guard.0.clone();
            async move { this.on_event(event).await }
        }))
    }

    async fn on_event(self: Arc<Self>, mut event: Event) -> Event {
        let Some(data) = event.data.take() else {
            return event;
        };
        let bytes = self.on_message(Bytes::from(data)).await;
        event.data = Some(String::from_utf8(bytes.to_vec()).unwrap_or_default());
        event
    }

    /// Inspects one JSON-RPC message of the reply; returns it, rewritten if needed.
    async fn on_message(self: Arc<Self>, bytes: Bytes) -> Bytes {
        let is_status = memmem(&bytes, b"notifications/tasks/status");
        let is_activity = memmem(&bytes, b"notifications/progress")
            || memmem(&bytes, crate::mcp::task::RELATED_TASK_META.as_bytes());
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
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                self.registry.note_activity_in(&self.upstream, &value);
            }
        }
        if msg.method() == Some("notifications/tasks/status") {
            return self.on_status_notification(bytes);
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
                client_session,
                progress_token,
            } => {
                let out = self.on_creation(bytes, &id, *template).await;
                if let Some(task_id) = created_task_id(&out) {
                    self.registry.note_creation(
                        &self.upstream,
                        client_session,
                        id,
                        &task_id,
                        progress_token,
                    );
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

    fn on_status_notification(&self, bytes: Bytes) -> Bytes {
        let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
            return bytes;
        };
        let Some(params) = value.get("params") else {
            return bytes;
        };
        match self
            .registry
            .observe_task(&self.upstream, params, "notifications/tasks/status")
        {
            Observed::Rewrite {
                status,
                status_message,
            } => {
                rewrite_status(&mut value["params"], status, status_message);
                Bytes::from(serde_json::to_vec(&value).expect("re-serialise"))
            }
            _ => bytes,
        }
    }

    async fn on_creation(&self, bytes: Bytes, id: &Id, mut record: TaskRecord) -> Bytes {
        let value: Value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(_) => {
                self.registry.release_slot(&record.upstream, &record.owner);
                return bytes;
            }
        };
        let Some(task) = value
            .pointer("/result/task")
            .filter(|t| t.get("taskId").is_some())
        else {
            // Not a CreateTaskResult (an error, or a server that ran the call plainly).
            self.registry.release_slot(&record.upstream, &record.owner);
            return bytes;
        };
        let Some(task_id) = task.get("taskId").and_then(Value::as_str) else {
            self.registry.release_slot(&record.upstream, &record.owner);
            return bytes;
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
        record.ttl_ms = task.get("ttl").and_then(Value::as_u64);
        record.poll_interval_ms = task.get("pollInterval").and_then(Value::as_u64);
        record.recorded_at = now;
        if record.status.is_terminal() {
            record.terminal_at = Some(now);
        }
        let created = parse_rfc3339_ms(&record.created_at).unwrap_or(now);
        let ttl = record.ttl_ms.unwrap_or(self.registry.config.max_ttl_ms);
        record.expires_at = created.saturating_add(ttl);
        match self.registry.record_creation(record).await {
            Ok(()) => bytes,
            Err(e) => jsonrpc::error_response(
                Some(id),
                jsonrpc::INTERNAL_ERROR,
                &format!(
                    "taskgate could not record the task durably ({e}); the task was not handed out"
                ),
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
                    .store
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
                Observed::Rewrite {
                    status,
                    status_message,
                } => {
                    rewrite_status(&mut value["result"], status, status_message);
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

fn rewrite_status(task: &mut Value, status: TaskStatus, message: Option<String>) {
    task["status"] = Value::String(status.as_str().to_string());
    match message {
        Some(m) => task["statusMessage"] = Value::String(m),
        None => {
            if let Some(o) = task.as_object_mut() {
                o.remove("statusMessage");
            }
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

/// The taskId of a `CreateTaskResult` message, if it is one.
fn created_task_id(bytes: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(bytes).ok()?;
    v.pointer("/result/task/taskId")?
        .as_str()
        .map(str::to_string)
}

fn task_id_param(msg: &Message) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Params {
        #[serde(rename = "taskId")]
        task_id: String,
    }
    #[derive(serde::Deserialize)]
    struct Req {
        params: Params,
    }
    msg.parse_as::<Req>().ok().map(|r| r.params.task_id)
}

fn header_string(v: Option<&HeaderValue>) -> Option<String> {
    v.and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// Whether `needle` occurs in `haystack` (SIMD search; used to skip parsing most messages).
pub fn memmem(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}
