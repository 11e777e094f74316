//! The `cancel` layer: `tasks/cancel` sent upstream once, cancels of terminal tasks answered
//! here, `notifications/cancelled` routed and de-duplicated, and the two audit facts
//! (2025-11-25 basic/utilities/tasks: Task Cancellation; basic/utilities/cancellation).
//!
//! It sits inside the `tasks` layer, so a `tasks/cancel` reaching it names a task the caller owns,
//! already routed to the task's upstream session.
//!
//! - **Terminal**: a task the registry holds as `completed`, `failed` or `cancelled` is answered
//!   `-32602` naming the status; the upstream is not called (`outcome="rejected_terminal"`).
//! - **Single-flight**: while one `tasks/cancel` for `(upstream, taskId)` is in flight upstream,
//!   identical requests wait for it and each gets the same outcome under its own JSON-RPC id
//!   (`outcome="deduplicated"`). The first is `forwarded` (or `upstream_error` when the upstream
//!   answers an error or cannot be reached). Its answer is applied to the registry before the
//!   waiters are released, so a cancel arriving afterwards finds the task terminal. Every caller
//!   gets the answer as one `application/json` message, even if the upstream streamed it.
//! - `notifications/cancelled` (ordinary cancellation): dropped when its `requestId` is the
//!   session's `initialize` (reason `initialize`), a request that produced a `CreateTaskResult`
//!   (reason `task`: tasks are cancelled with `tasks/cancel` only), or already forwarded once
//!   (reason `duplicate`); otherwise it goes to the upstream session that carries the request (a
//!   pending `tasks/result` may have been routed to the task's session). Requests are named by
//!   who sent them ([`crate::exchange::CallKey`]: upstream, principal and client session, id),
//!   so one client's cancel is never taken for another's. A caller with neither a principal nor
//!   a session cannot be told apart from another one: its cancels are never dropped as
//!   `duplicate` (a second `notifications/cancelled` is harmless; dropping another client's is
//!   not), while the `initialize` and `task` checks still apply (they protect a session and a
//!   task from being cancelled by the wrong message).
//!
//! ## The two audit facts
//!
//! - **status cancelled** (`cancelled_at`): the first time taskgate sees `cancelled` for the task,
//!   in a `tasks/cancel` reply, a `tasks/get` reply or a `notifications/tasks/status`. Recorded by
//!   the registry when the status changes ([`crate::registry::Registry`]).
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

use crate::exchange::{CallKey, GatewayError, McpReply, McpRequest, Operation, ReplyBody};
use crate::jsonrpc::{self, Id, Kind, Message};
use crate::layers::extensions::AuthorisedTask;
use crate::mcp::task::now_ms;
use crate::registry::{Registry, ResourceHold};
use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use futures_util::StreamExt;
use http::HeaderValue;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The upstream's answer to one forwarded `tasks/cancel`, shared by every waiting caller.
#[derive(Clone)]
enum CancelOutcome {
    /// A JSON-RPC result: its `result` JSON text.
    Result(String),
    /// A JSON-RPC error: its `error` JSON text.
    Error(String),
    /// The upstream answered with an HTTP error or no message at all.
    Http(Arc<Mutex<Option<McpReply>>>, u16),
    /// The upstream could not be reached.
    Failed(Arc<GatewayError>),
}

type SharedCancel = Shared<BoxFuture<'static, CancelOutcome>>;

/// Per-session facts about client requests needed to route `notifications/cancelled`.
#[derive(Default)]
struct CancelNotes {
    /// The caller's request → upstream session the request went out on.
    in_flight: HashMap<CallKey, Option<HeaderValue>>,
    /// The caller's requests already cancelled once.
    forwarded: HashMap<CallKey, u64>,
}

/// Shared state of the cancel layer.
pub struct CancelState {
    registry: Arc<Registry>,
    flights: Mutex<HashMap<(Arc<str>, String), SharedCancel>>,
    notes: Mutex<CancelNotes>,
}

impl CancelState {
    /// Creates the state over the registry.
    pub fn new(registry: Arc<Registry>) -> Arc<CancelState> {
        Arc::new(CancelState {
            registry,
            flights: Mutex::new(HashMap::new()),
            notes: Mutex::new(CancelNotes::default()),
        })
    }
}

/// Builds [`CancelService`]s.
#[derive(Clone)]
pub struct CancelLayer {
    state: Arc<CancelState>,
}

impl CancelLayer {
    /// A layer sharing `state` (one per process, shared by every upstream's stack).
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
    type Future = BoxFut;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: McpRequest) -> BoxFut {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let state = self.state.clone();
        match (req.request_method(), req.notification_method()) {
            (Some("tasks/cancel"), _) => Box::pin(cancel_task(state, inner, req)),
            (_, Some("notifications/cancelled")) => {
                if let Some(reason) = state.route_cancelled(&mut req) {
                    state
                        .registry
                        .metrics()
                        .cancelled_notifications_dropped_total
                        .with_label_values(&[&req.ctx.upstream, reason])
                        .inc();
                    tracing::info!(reason, "notifications/cancelled dropped");
                    return Box::pin(async { Ok(McpReply::accepted()) });
                }
                Box::pin(inner.call(req))
            }
            _ => {
                let task = (req.request_method() == Some("tasks/result"))
                    .then(|| task_id_of(&req))
                    .flatten();
                let resource = task.map(|t| state.registry.releases().hold(&req.ctx.upstream, &t));
                let key = state.note_request(&req);
                if key.is_none() && resource.is_none() {
                    // The common case: nothing to track while this request is in flight.
                    return Box::pin(inner.call(req));
                }
                // Made before the call: a client that goes away before the answer still
                // removes its note.
                let done = InFlightGuard {
                    state: state.clone(),
                    key,
                    _resource: resource,
                };
                Box::pin(async move {
                    let result = inner.call(req).await;
                    match result {
                        Ok(mut reply) => {
                            if let ReplyBody::Stream(events) = reply.body {
                                reply.body = ReplyBody::Stream(Box::pin(events.map(move |e| {
                                    let _ = &done;
                                    e
                                })));
                            }
                            Ok(reply)
                        }
                        Err(e) => Err(e),
                    }
                })
            }
        }
    }
}

/// Removes a request from the in-flight table (and drops its resource hold) when its reply is
/// finished: at once for JSON, when the stream ends for SSE.
struct InFlightGuard {
    state: Arc<CancelState>,
    key: Option<CallKey>,
    _resource: Option<ResourceHold>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.state.notes.lock().in_flight.remove(&key);
        }
    }
}

impl CancelState {
    /// Notes a client request (with an id) going upstream on another session than the client's;
    /// returns its in-flight key.
    fn note_request(&self, req: &McpRequest) -> Option<CallKey> {
        let Operation::Post(msg) = &req.op else {
            return None;
        };
        if msg.kind() != Kind::Request {
            return None;
        }
        // Only requests the `tasks` layer routed to another upstream session need a note: a
        // notifications/cancelled for any other request reaches it on the client's own session.
        if req.ctx.session_id == req.ctx.client_session_id {
            return None;
        }
        let key = req.ctx.call_key(msg.id()?);
        if msg.method() == Some("initialize") {
            return None;
        }
        self.notes
            .lock()
            .in_flight
            .insert(key.clone(), req.ctx.session_id.clone());
        Some(key)
    }

    /// Decides what to do with a client's `notifications/cancelled`; returns the drop reason, or
    /// `None` to forward it (possibly re-routed to another upstream session).
    fn route_cancelled(&self, req: &mut McpRequest) -> Option<&'static str> {
        let Operation::Post(msg) = &req.op else {
            return None;
        };
        let request_id = msg
            .parse_as::<Value>()
            .ok()
            .and_then(|v| v.pointer("/params/requestId").cloned())
            .and_then(|v| Id::from_value(&v));
        let Some(request_id) = request_id else {
            // Without a requestId nothing can be cancelled; the receiver ignores it anyway.
            return None;
        };
        let key = req.ctx.call_key(&request_id);
        if self.registry.is_initialize_id(&key) {
            return Some("initialize");
        }
        if self.registry.task_of_request(&key).is_some() {
            return Some("task");
        }
        let mut notes = self.notes.lock();
        if key.caller.is_identified() && notes.forwarded.contains_key(&key) {
            return Some("duplicate");
        }
        if notes.forwarded.len() > 100_000 {
            notes.forwarded.clear();
        }
        notes.forwarded.insert(key.clone(), now_ms());
        if let Some(target) = notes.in_flight.get(&key) {
            req.ctx.session_id = target.clone();
        }
        None
    }
}

/// The taskId of a `tasks/*` request the `tasks` layer authorised.
fn task_id_of(req: &McpRequest) -> Option<String> {
    req.extensions
        .get::<AuthorisedTask>()
        .map(|a| a.record.task_id.clone())
}

async fn cancel_task<S>(
    state: Arc<CancelState>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Send + 'static,
    S::Future: Send + 'static,
{
    let registry = state.registry.clone();
    let metrics = registry.metrics().clone();
    let upstream = req.ctx.upstream.clone();
    let id = req.id().cloned().expect("tasks/cancel is a request");
    let Some(task_id) = task_id_of(&req) else {
        return Ok(McpReply::local_error(
            Some(&id),
            jsonrpc::INVALID_PARAMS,
            "tasks/cancel: params.taskId (a string) is required",
        ));
    };
    let count = |outcome: &str| {
        metrics
            .cancel_requests_total
            .with_label_values(&[&upstream, outcome])
            .inc()
    };
    let key = (upstream.clone(), task_id.clone());
    let (flight, first) = {
        let mut flights = state.flights.lock();
        if let Some(f) = flights.get(&key) {
            (f.clone(), false)
        } else {
            // Checked under the flights lock: a finished flight has applied its answer to the
            // registry before leaving the table, so this sees the terminal status.
            match registry.store().get(&upstream, &task_id) {
                Ok(Some(r)) if r.status.is_terminal() => {
                    drop(flights);
                    count("rejected_terminal");
                    return Ok(McpReply::local_error(
                        Some(&id),
                        jsonrpc::INVALID_PARAMS,
                        &format!(
                            "Cannot cancel task {task_id}: it is already {} (a terminal status)",
                            r.status
                        ),
                    ));
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    drop(flights);
                    count("rejected_unknown");
                    return Ok(McpReply::local_error(
                        Some(&id),
                        jsonrpc::INVALID_PARAMS,
                        &format!("Task not found: {task_id}"),
                    ));
                }
            }
            let flight = forward_cancel(state.clone(), inner, req, key.clone())
                .boxed()
                .shared();
            flights.insert(key.clone(), flight.clone());
            (flight, true)
        }
    };
    let outcome = flight.await;
    let upstream_failed = !matches!(outcome, CancelOutcome::Result(_));
    count(match (first, upstream_failed) {
        (true, false) => "forwarded",
        (true, true) => "upstream_error",
        (false, _) => "deduplicated",
    });
    match outcome {
        CancelOutcome::Result(result) => {
            Ok(McpReply::local_json(jsonrpc::result_response(&id, &result)))
        }
        CancelOutcome::Error(error) => {
            let mut text = String::with_capacity(48 + error.len());
            text.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
            text.push_str(id.as_json());
            text.push_str(",\"error\":");
            text.push_str(&error);
            text.push('}');
            Ok(McpReply::local_json(Bytes::from(text)))
        }
        CancelOutcome::Http(reply, status) => match reply.lock().take() {
            Some(r) if first => Ok(r),
            _ => Ok(McpReply::local_error(
                Some(&id),
                jsonrpc::INTERNAL_ERROR,
                &format!("upstream `{upstream}` answered tasks/cancel with HTTP {status}"),
            )),
        },
        CancelOutcome::Failed(e) => Err((*e).clone()),
    }
}

/// Sends the one `tasks/cancel` upstream, reads its answer (JSON or SSE) and applies it to the
/// registry, then leaves the in-flight table.
async fn forward_cancel<S>(
    state: Arc<CancelState>,
    mut inner: S,
    req: McpRequest,
    key: (Arc<str>, String),
) -> CancelOutcome
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Send + 'static,
    S::Future: Send + 'static,
{
    let registry = state.registry.clone();
    let (upstream, task_id) = key.clone();
    // Leaves the in-flight table however this future ends: answered, failed, panicked, or
    // dropped because every caller went away (the next tasks/cancel is then sent again).
    let _flight = FlightGuard {
        state: state.clone(),
        key: key.clone(),
    };
    let _ = registry.store().update(&upstream, &task_id, &mut |r| {
        if r.cancel_requested_at.is_some() {
            return false;
        }
        r.cancel_requested_at = Some(now_ms());
        true
    });
    if let Some(r) = registry.store().get(&upstream, &task_id).ok().flatten() {
        registry.audit(
            &r,
            "cancel_requested",
            "tasks/cancel forwarded upstream".into(),
        );
    }
    let id = req.id().cloned().expect("tasks/cancel is a request");
    let outcome = match inner.call(req).await {
        Err(e) => CancelOutcome::Failed(Arc::new(e)),
        Ok(reply) => {
            let status = reply.status.as_u16();
            let message = match reply.body {
                ReplyBody::Json(bytes) => Some(bytes),
                ReplyBody::Stream(mut events) => {
                    let mut found = None;
                    while let Some(ev) = events.next().await {
                        let Some(data) = ev.data else { continue };
                        let bytes = Bytes::from(data);
                        if let Ok(m) = Message::parse(bytes.clone()) {
                            if m.id() == Some(&id)
                                && matches!(m.kind(), Kind::Response | Kind::Error)
                            {
                                found = Some(bytes);
                                break;
                            }
                        }
                    }
                    found
                }
                body => {
                    let reply = McpReply {
                        status: reply.status,
                        headers: reply.headers,
                        body,
                    };
                    return finish(
                        &state,
                        &key,
                        CancelOutcome::Http(Arc::new(Mutex::new(Some(reply))), status),
                    );
                }
            };
            match message.and_then(|b| serde_json::from_slice::<Value>(&b).ok()) {
                Some(v) if v.get("result").is_some_and(|r| !r.is_object()) => CancelOutcome::Error(
                    serde_json::json!({
                        "code": jsonrpc::INTERNAL_ERROR,
                        "message": format!("upstream `{upstream}` answered tasks/cancel with a result that is not a Task object"),
                    })
                    .to_string(),
                ),
                Some(v) if v.get("result").is_some() => {
                    let result = &v["result"];
                    // Apply before the flight ends (see `cancel_task`).
                    let observed = registry.observe_task(&upstream, &with_task_id(result, &task_id), "tasks/cancel");
                    let mut result = result.clone();
                    observed.rewrite(&mut result);
                    CancelOutcome::Result(result.to_string())
                }
                Some(v) if v.get("error").is_some() => CancelOutcome::Error(v["error"].to_string()),
                _ => CancelOutcome::Error(
                    serde_json::json!({
                        "code": jsonrpc::INTERNAL_ERROR,
                        "message": format!("upstream `{upstream}` sent no answer to tasks/cancel (HTTP {status})"),
                    })
                    .to_string(),
                ),
            }
        }
    };
    finish(&state, &key, outcome)
}

fn finish(state: &CancelState, key: &(Arc<str>, String), outcome: CancelOutcome) -> CancelOutcome {
    state.flights.lock().remove(key);
    outcome
}

/// Removes a `tasks/cancel` flight from the table when its future ends in any way.
struct FlightGuard {
    state: Arc<CancelState>,
    key: (Arc<str>, String),
}

impl Drop for FlightGuard {
    fn drop(&mut self) {
        self.state.flights.lock().remove(&self.key);
    }
}

fn with_task_id(result: &Value, task_id: &str) -> Value {
    let mut v = result.clone();
    if v.get("taskId").is_none() {
        v["taskId"] = Value::String(task_id.to_string());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::tasks::TasksLayer;
    use crate::layers::testing::{json_of, record, registry, request};
    use tower::{Layer, ServiceExt};

    /// An upstream that answers every `tasks/cancel` with the task cancelled.
    fn upstream(
        calls: Arc<std::sync::atomic::AtomicUsize>,
    ) -> impl tower::Service<
        McpRequest,
        Response = McpReply,
        Error = GatewayError,
        Future = impl Future<Output = Result<McpReply, GatewayError>> + Send,
    > + Clone
           + Send
           + 'static {
        tower::service_fn(move |req: McpRequest| {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let id = req.id().unwrap().as_json().to_string();
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{{"taskId":"t1","status":"cancelled","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:01Z","ttl":60000}}}}"#
                );
                Ok(McpReply::local_json(Bytes::from(body)))
            }
        })
    }

    const CANCEL: &str =
        r#"{"jsonrpc":"2.0","id":7,"method":"tasks/cancel","params":{"taskId":"t1"}}"#;

    /// The store accesses of one forwarded `tasks/cancel` through `tasks` and `cancel`.
    #[tokio::test]
    async fn one_forwarded_cancel_touches_the_store_this_often() {
        let (registry, store) = registry();
        registry.record_creation(record("t1")).await.unwrap();
        let calls = Arc::default();
        let stack = TasksLayer::new(registry.clone(), false)
            .layer(CancelLayer::new(CancelState::new(registry.clone())).layer(upstream(calls)));
        store.counts.reset();
        let reply = stack.oneshot(request(CANCEL)).await.unwrap();
        assert_eq!(json_of(&reply)["result"]["status"], "cancelled");
        let [gets, updates, creates, audits, scans] = store.counts.snapshot();
        eprintln!("tasks/cancel trace: gets={gets} updates={updates} creates={creates} audits={audits} scans={scans}");
        let r = registry.store().get("up", "t1").unwrap().unwrap();
        assert_eq!(r.status, crate::mcp::task::TaskStatus::Cancelled);
        assert!(r.cancel_requested_at.is_some() && r.cancelled_at.is_some());
    }
}
