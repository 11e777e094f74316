//! The `upgrade` layer: a plain `tools/call` to a tool whose `execution.taskSupport` is
//! `"required"` becomes a task upstream, and the client gets the task's result as the answer to
//! its original request (2025-11-25 server/tools: taskSupport; basic/utilities/tasks).
//!
//! Active when `[upgrade] enabled = true`. Messages it touches:
//! - `tools/call` without `params.task`, on a session whose upstream declared
//!   `capabilities.tasks.requests.tools.call`, to a tool the session's `tools/list` marked
//!   `required` (a tool not yet seen triggers one `tools/list`, all pages): sent upstream with
//!   `params.task = {ttl: upgrade.ttl_ms}` (recorded with `origin = upgraded`). The client's answer
//!   becomes an SSE stream on which taskgate relays, while the task runs:
//!   - `notifications/progress` the upstream sends (on the client's `progressToken`, kept in the
//!     upgraded request);
//!   - status changes seen by polling `tasks/get` at the task's `pollInterval` (at least 100 ms)
//!     and `notifications/tasks/status`, as `notifications/progress` messages on the client's
//!     `progressToken` (only when the client gave one);
//!   - `elicitation/create` and `sampling/createMessage` requests from the upstream, when the
//!     client declared `capabilities.elicitation` / `capabilities.sampling`; the client's answers
//!     are ordinary POSTs that taskgate forwards upstream. Without the capability the task is
//!     cancelled upstream and the client gets a JSON-RPC error (`-32603`) saying why.
//!   The last event is the `tasks/result` answer (a `CallToolResult`, `isError` ones included, or
//!   the JSON-RPC error) under the client's original id.
//! - `notifications/cancelled` naming an upgraded call's id: becomes one `tasks/cancel` through the
//!   `cancel` layer (single-flight, audit facts); the client gets no further message for that id.
//! - The client's stream closing early (disconnect): `on_client_disconnect = "cancel"` cancels the
//!   task after `disconnect_grace_ms`; `"keep"` lets it run upstream (taskgate stops following it;
//!   the record stays and the client's principal can still reach it with `tasks/*`).
//! - `tools/list` answers to a client that did not declare `capabilities.tasks`, from an upstream
//!   that declares `tasks.requests.tools.call`: `required` tools are shown as `"optional"`, so such
//!   clients call them. Task-capable clients see the upstream's values.
//! - After a restart, upgraded tasks that are not terminal have lost their client: taskgate cancels
//!   them upstream ([`cancel_orphans`]), counted as `taskgate_upgraded_calls_total{outcome="orphaned"}`.
//!
//! Outcomes of `taskgate_upgraded_calls_total{upstream,outcome}`: `completed`, `failed` (error or
//! `isError` result), `cancelled` (client's `notifications/cancelled`), `disconnected`,
//! `refused_capability`, `not_a_task` (the upstream answered without a task), `upstream_error`,
//! `orphaned`, `relay_overflow` (too many events before the `CreateTaskResult`).
//!
//! A `notifications/cancelled` that arrives before the upstream's `CreateTaskResult` is held and
//! becomes the `tasks/cancel` once the task exists. The upstream side of an upgraded call runs
//! on its own task, so a client that disconnects before the `CreateTaskResult` still leaves a
//! recorded task that `on_client_disconnect` handles.
//!
//! Who a call belongs to: an upgraded call is named by `(upstream, Caller, id)`
//! ([`crate::exchange::CallKey`]: the principal and the client's own session), plus a token
//! unique to the call, so a second call never replaces the first one's entry. A caller with
//! neither a principal nor a session cannot be told apart from another such caller; when more
//! than one upgraded call with the same key is live, a `notifications/cancelled` for that id is
//! ambiguous and cancels none of them (it is passed on down the stack like any other): taskgate
//! never cancels a call that may be another client's. With a single live call it cancels that one.
//!
//! Bounds: what the upstream sends before the `CreateTaskResult` is buffered up to
//! [`EARLY_LIMIT`] events; past it the exchange ends with a JSON-RPC error (`-32603`), the task
//! (once its `CreateTaskResult` arrives) is cancelled upstream, counted as
//! `outcome="relay_overflow"`. Afterwards the relay from the `tasks/result` stream to the client
//! goes through bounded channels ([`RELAY_CAPACITY`]), so a slow client slows the reading of the
//! upstream's stream instead of growing a buffer.
//!
//! Terminal polls: when a `tasks/get` poll reports a terminal status while `tasks/result` has not
//! answered, taskgate waits one more poll interval for it, then asks `tasks/result` once more
//! (bounded by the upstream's `timeout_ms`); if that gives no answer either, the client gets a
//! JSON-RPC error (`-32603`) naming the status (`outcome="upstream_error"`). An upstream answer
//! that is not a JSON object gets the same error code, never a panic.
//!
//! Progress values on the client's token always increase (2025-11-25 basic/utilities/progress),
//! across the call's own stream and the session's GET stream, where some servers send progress.
//!
//! Limitations: the session table is in memory, so after a restart calls on sessions opened
//! before it are forwarded as they are until the client lists tools again. With an upstream
//! without sessions and no `[auth]`, clients cannot be told apart: no client's capabilities are
//! kept, so every client is treated as one without `capabilities.tasks` (required tools listed
//! as optional, plain calls upgraded) and relayed elicitation/sampling is not checked against
//! capabilities.

use crate::config::{OnDisconnect, UpgradeConfig};
use crate::exchange::{
    CallKey, Caller, GatewayError, McpReply, McpRequest, Operation, Principal, ReplyBody,
    RequestContext,
};
use crate::jsonrpc::{self, Id, Kind, Message};
use crate::layers::session::{session_key, Sessions, TaskSupport};
use crate::mcp::task::TaskStatus;
use crate::registry::Registry;
use crate::sse::{Event, EventStream};

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode};
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tower::ServiceExt;

/// (caller, progressToken JSON) of an upgraded call with a progress token.
type TokenKey = (Caller, String);

/// Events buffered before the upstream's `CreateTaskResult`; past it the exchange ends.
pub const EARLY_LIMIT: usize = 1024;
/// Capacity of the channels that relay the task's messages to the client.
pub const RELAY_CAPACITY: usize = 256;
/// Deadline of the `tasks/result` asked again after a terminal poll, when the upstream's own
/// `timeout_ms` is not known.
const DEFAULT_RESULT_DEADLINE: Duration = Duration::from_secs(30);

/// One live upgraded call: a token unique to it and its cancel signal.
struct ActiveCall {
    token: u64,
    cancel: oneshot::Sender<()>,
}

/// The next progress value on a token whose last value is `last`: the upstream's own value when
/// it increases, otherwise a little more than the last (below `total` when there is one), so the
/// values a client sees always increase (2025-11-25 basic/utilities/progress).
fn next_progress(last: &Mutex<Option<f64>>, wanted: Option<f64>, total: Option<f64>) -> f64 {
    let mut last = last.lock();
    let next = match (*last, wanted) {
        (None, Some(p)) => p,
        (None, None) => 0.0,
        (Some(l), Some(p)) if p > l => p,
        (Some(l), _) => match total {
            Some(t) if t > l => l + (t - l) / 100.0,
            _ => l + 1.0,
        },
    };
    *last = Some(next);
    next
}

/// State of the upgrade layer for one upstream (built per stack in `gateway`).
pub struct UpgradeState {
    sessions: Arc<Sessions>,
    registry: Arc<Registry>,
    config: UpgradeConfig,
    /// Upgraded calls being followed: the client's call → every live call with that key (more
    /// than one only for callers that cannot be told apart; see the module docs).
    active: Mutex<HashMap<CallKey, Vec<ActiveCall>>>,
    /// The upstream's `timeout_ms` (the deadline of a `tasks/result` asked after a terminal poll).
    result_deadline: Duration,
    /// Progress state of upgraded calls by token, for progress the upstream sends on the
    /// session's GET stream.
    tokens: Mutex<HashMap<TokenKey, Arc<Mutex<Option<f64>>>>>,
    seq: AtomicU64,
}

impl UpgradeState {
    /// The state of one upstream's upgrade layer; `upstream_timeout` is its `timeout_ms`.
    pub fn new(
        sessions: Arc<Sessions>,
        registry: Arc<Registry>,
        config: UpgradeConfig,
        upstream_timeout: Duration,
    ) -> Arc<UpgradeState> {
        Arc::new(UpgradeState {
            sessions,
            registry,
            config,
            active: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            result_deadline: upstream_timeout,
            seq: AtomicU64::new(1),
        })
    }

    fn result_deadline(&self) -> Duration {
        if self.result_deadline.is_zero() {
            DEFAULT_RESULT_DEADLINE
        } else {
            self.result_deadline
        }
    }

    /// Registers a live upgraded call; never replaces another call's entry. Returns its token.
    fn register(&self, key: &CallKey, cancel: oneshot::Sender<()>) -> u64 {
        let token = self.seq.fetch_add(1, Ordering::Relaxed);
        self.active
            .lock()
            .entry(key.clone())
            .or_default()
            .push(ActiveCall { token, cancel });
        token
    }

    /// Forgets one live upgraded call (only that one).
    fn forget(&self, key: &CallKey, token: u64) {
        let mut active = self.active.lock();
        if let Some(calls) = active.get_mut(key) {
            calls.retain(|c| c.token != token);
            if calls.is_empty() {
                active.remove(key);
            }
        }
    }

    /// A client's `notifications/cancelled` for `key`: signals the call when exactly one live
    /// call has that key. Returns whether it did.
    fn cancel_call(&self, key: &CallKey) -> bool {
        let mut active = self.active.lock();
        let Some(calls) = active.get_mut(key) else {
            return false;
        };
        if calls.len() != 1 {
            tracing::info!(
                live = calls.len(),
                "notifications/cancelled names more than one upgraded call of callers that cannot be told apart: none is cancelled"
            );
            return false;
        }
        let call = calls.pop().expect("one call");
        active.remove(key);
        call.cancel.send(()).is_ok()
    }
    fn next_id(&self) -> Id {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        Id::from_json(&format!("\"taskgate-{n}\"")).expect("a string id")
    }

    fn count(&self, upstream: &str, outcome: &str) {
        self.registry
            .metrics()
            .upgraded_calls_total
            .with_label_values(&[upstream, outcome])
            .inc();
    }
}

/// Builds [`UpgradeService`]s.
#[derive(Clone)]
pub struct UpgradeLayer {
    state: Arc<UpgradeState>,
}

impl UpgradeLayer {
    /// A layer sharing `state`.
    pub fn new(state: Arc<UpgradeState>) -> UpgradeLayer {
        UpgradeLayer { state }
    }
}

impl<S> tower::Layer<S> for UpgradeLayer {
    type Service = UpgradeService<S>;
    fn layer(&self, inner: S) -> UpgradeService<S> {
        UpgradeService {
            inner,
            state: self.state.clone(),
        }
    }
}

/// The `upgrade` layer's service (see the module docs).
#[derive(Clone)]
pub struct UpgradeService<S> {
    inner: S,
    state: Arc<UpgradeState>,
}

type BoxFut = Pin<Box<dyn Future<Output = Result<McpReply, GatewayError>> + Send>>;

impl<S> tower::Service<McpRequest> for UpgradeService<S>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    type Response = McpReply;
    type Error = GatewayError;
    type Future = BoxFut;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: McpRequest) -> BoxFut {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let state = self.state.clone();
        if !state.config.enabled {
            let mut inner = inner;
            return Box::pin(inner.call(req));
        }
        let is_request = req.request_method().is_some();
        match req.method() {
            Some("tools/call") if is_request => Box::pin(tools_call(state, inner, req)),
            Some("tools/list") if is_request => Box::pin(tools_list(state, inner, req)),
            None if matches!(req.op, Operation::OpenStream) => {
                Box::pin(get_stream(state, inner, req))
            }
            Some("notifications/cancelled") if !is_request => {
                if let Some(key) = cancelled_call(&req) {
                    if state.cancel_call(&key) {
                        return Box::pin(async { Ok(McpReply::accepted()) });
                    }
                }
                let mut inner = inner;
                Box::pin(inner.call(req))
            }
            _ => {
                let mut inner = inner;
                Box::pin(inner.call(req))
            }
        }
    }
}

/// The standalone GET stream: progress the upstream sends there on an upgraded call's token
/// (the TypeScript SDK does) keeps increasing together with the call's own stream.
async fn get_stream<S>(
    state: Arc<UpgradeState>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Send + 'static,
    S::Future: Send + 'static,
{
    let caller = req.ctx.caller();
    let mut reply = inner.oneshot(req).await?;
    reply.body = reply.body.map_messages(move |data| {
        if state.tokens.lock().is_empty()
            || !crate::jsonrpc::needles::found(&crate::jsonrpc::needles::PROGRESS, data.as_bytes())
        {
            return None;
        }
        let mut v = serde_json::from_str::<Value>(data).ok()?;
        let token = v.pointer("/params/progressToken").map(Value::to_string)?;
        let last = state.tokens.lock().get(&(caller.clone(), token)).cloned()?;
        let wanted = v.pointer("/params/progress").and_then(Value::as_f64);
        let total = v.pointer("/params/total").and_then(Value::as_f64);
        let value = next_progress(&last, wanted, total);
        (Some(value) != wanted).then(|| {
            v["params"]["progress"] = Value::from(value);
            v.to_string()
        })
    });
    Ok(reply)
}

fn cancelled_call(req: &McpRequest) -> Option<CallKey> {
    let Operation::Post(msg) = &req.op else {
        return None;
    };
    let v: Value = msg.parse_as().ok()?;
    let id = Id::from_value(v.pointer("/params/requestId")?)?;
    Some(req.ctx.call_key(&id))
}

/// Shows `required` tools as `optional` to clients without `capabilities.tasks`.
async fn tools_list<S>(
    state: Arc<UpgradeState>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Send + 'static,
    S::Future: Send + 'static,
{
    let upstream = req.ctx.upstream.clone();
    let session = session_key(&req.ctx);
    let mut reply = inner.oneshot(req).await?;
    let Some(info) = state.sessions.get(&upstream, session.as_ref()) else {
        return Ok(reply);
    };
    if info.client_declares_tasks() || !info.upstream_tasks_tools_call() {
        return Ok(reply);
    }
    reply.body = reply.body.map_messages(relax_required);
    Ok(reply)
}

/// `taskSupport: "required"` → `"optional"` in a `tools/list` result; `None` when nothing changes.
fn relax_required(text: &str) -> Option<String> {
    if !crate::jsonrpc::contains(text.as_bytes(), b"\"required\"") {
        return None;
    }
    let mut v = serde_json::from_str::<Value>(text).ok()?;
    let mut changed = false;
    if let Some(tools) = v.pointer_mut("/result/tools").and_then(Value::as_array_mut) {
        for tool in tools {
            if let Some(ts) = tool.pointer_mut("/execution/taskSupport") {
                if ts == "required" {
                    *ts = Value::String("optional".into());
                    changed = true;
                }
            }
        }
    }
    changed.then(|| v.to_string())
}

/// A request taskgate sends on its own (tasks/get, tasks/result, tasks/cancel, tools/list), in the
/// client's context so the `tasks` layer authorises and routes it as the client's.
fn own_request(ctx: &RequestContext, id: &Id, method: &str, params: Value) -> McpRequest {
    let body = serde_json::json!({"jsonrpc": "2.0", "method": method, "params": params});
    let mut text = body.to_string();
    // Splice the id in as raw JSON (keeps its type).
    text.insert_str(1, &format!("\"id\":{},", id.as_json()));
    let msg = Message::parse(Bytes::from(text)).expect("a well-formed request");
    McpRequest {
        op: Operation::Post(msg),
        ctx: ctx.clone(),
        extensions: http::Extensions::new(),
    }
}

/// Where [`answer_of`] puts the messages that are not the answer.
enum Others<'a> {
    /// Dropped.
    Discard,
    /// Sent on a bounded channel (waits while it is full: backpressure on the upstream stream).
    Relay(&'a mpsc::Sender<Event>),
    /// Kept, up to [`EARLY_LIMIT`]; past it the rest is dropped and `overflowed` set.
    Buffer {
        events: &'a mut Vec<Event>,
        overflowed: &'a mut bool,
    },
}

impl Others<'_> {
    async fn put(&mut self, ev: Event) {
        match self {
            Others::Discard => {}
            Others::Relay(tx) => {
                let _ = tx.send(ev).await;
            }
            Others::Buffer { events, overflowed } => {
                if events.len() < EARLY_LIMIT && !**overflowed {
                    events.push(ev);
                } else {
                    **overflowed = true;
                    events.clear();
                }
            }
        }
    }
}

/// Reads a reply until the message answering `id`; other messages go to `others`.
async fn answer_of(reply: McpReply, id: &Id, mut others: Others<'_>) -> Option<Value> {
    match reply.body {
        ReplyBody::Json(bytes) => serde_json::from_slice(&bytes).ok(),
        ReplyBody::Stream(mut events) => {
            while let Some(ev) = events.next().await {
                let answers = ev.data.as_ref().and_then(|d| {
                    let m = Message::parse(Bytes::copy_from_slice(d.as_bytes())).ok()?;
                    (m.id() == Some(id) && matches!(m.kind(), Kind::Response | Kind::Error))
                        .then(|| serde_json::from_str::<Value>(d).ok())
                        .flatten()
                });
                match answers {
                    Some(v) => return Some(v),
                    None => others.put(ev).await,
                }
            }
            None
        }
        _ => None,
    }
}

async fn tool_support<S>(
    state: &UpgradeState,
    inner: &S,
    ctx: &RequestContext,
    tool: &str,
) -> Option<TaskSupport>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let key = session_key(ctx);
    let session = key.as_ref();
    if let Some(ts) = state.sessions.tool_support(&ctx.upstream, session, tool) {
        return Some(ts);
    }
    // Not seen yet: one tools/list, every page (the session layer records what passes).
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let id = state.next_id();
        let params = match &cursor {
            Some(c) => serde_json::json!({ "cursor": c }),
            None => serde_json::json!({}),
        };
        let reply = inner
            .clone()
            .oneshot(own_request(ctx, &id, "tools/list", params))
            .await
            .ok()?;
        let answer = answer_of(reply, &id, Others::Discard).await?;
        cursor = answer
            .pointer("/result/nextCursor")
            .and_then(Value::as_str)
            .map(str::to_string);
        if cursor.is_none() {
            break;
        }
    }
    state.sessions.tool_support(&ctx.upstream, session, tool)
}

async fn tools_call<S>(
    state: Arc<UpgradeState>,
    inner: S,
    mut req: McpRequest,
) -> Result<McpReply, GatewayError>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let Operation::Post(msg) = &req.op else {
        return inner.oneshot(req).await;
    };
    // Cheap checks first: most calls are not candidates and are not parsed again.
    if !state
        .sessions
        .upstream_tasks_tools_call(&req.ctx.upstream, session_key(&req.ctx).as_ref())
    {
        return inner.oneshot(req).await;
    }
    let Ok(mut value) = msg.parse_as::<Value>() else {
        return inner.oneshot(req).await;
    };
    let plain = value.pointer("/params/task").is_none();
    let Some(tool) = value
        .pointer("/params/name")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return inner.oneshot(req).await;
    };
    if !plain || tool_support(&state, &inner, &req.ctx, &tool).await != Some(TaskSupport::Required)
    {
        return inner.oneshot(req).await;
    }
    let Some(original_id) = msg.id().cloned() else {
        return inner.oneshot(req).await;
    };
    let progress_token = value.pointer("/params/_meta/progressToken").cloned();
    let Some(params) = value.get_mut("params").and_then(Value::as_object_mut) else {
        return inner.oneshot(req).await;
    };
    params.insert(
        "task".into(),
        serde_json::json!({ "ttl": state.config.ttl_ms }),
    );
    let upgraded = serde_json::to_vec(&value)
        .ok()
        .and_then(|bytes| Message::parse(Bytes::from(bytes)).ok());
    let Some(upgraded) = upgraded else {
        return inner.oneshot(req).await;
    };
    req.op = Operation::Post(upgraded);
    req.extensions.insert(crate::layers::extensions::Upgraded);
    let ctx = req.ctx.clone();
    tracing::info!(
        tool,
        "plain tools/call to a required tool: upgraded to a task"
    );

    // The call is known as upgraded from now on: a notifications/cancelled for its id, even one
    // that arrives before the CreateTaskResult, becomes a tasks/cancel.
    let (cancel_tx, cancel_rx) = oneshot::channel();
    let key = ctx.call_key(&original_id);
    let call_token = state.register(&key, cancel_tx);
    // The upstream side runs on its own task: a client that goes away before the
    // CreateTaskResult still leaves a recorded task, handled by `on_client_disconnect`.
    let (first_tx, first_rx) = oneshot::channel();
    tokio::spawn(drive(
        Upgraded {
            state,
            inner,
            ctx,
            original_id: original_id.clone(),
            progress_token,
            key,
            call_token,
        },
        req,
        cancel_rx,
        first_tx,
    ));
    match first_rx.await {
        Ok(reply) => reply,
        Err(_) => Ok(McpReply::local_error(
            Some(&original_id),
            jsonrpc::INTERNAL_ERROR,
            "the upgraded call ended without an answer",
        )),
    }
}

/// One upgraded call, before its task exists.
struct Upgraded<S> {
    state: Arc<UpgradeState>,
    inner: S,
    ctx: RequestContext,
    original_id: Id,
    progress_token: Option<Value>,
    key: CallKey,
    call_token: u64,
}

/// Sends the upgraded call, answers the client (`first`) with its stream or, when no task came
/// of it, with the upstream's answer, and follows the task.
async fn drive<S>(
    call: Upgraded<S>,
    req: McpRequest,
    cancel_rx: oneshot::Receiver<()>,
    first: oneshot::Sender<Result<McpReply, GatewayError>>,
) where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let Upgraded {
        state,
        inner,
        ctx,
        original_id,
        progress_token,
        key,
        call_token,
    } = call;
    let upstream = ctx.upstream.clone();
    let forget = |state: &UpgradeState| state.forget(&key, call_token);
    let reply = match inner.clone().oneshot(req).await {
        Ok(r) => r,
        Err(e) => {
            forget(&state);
            state.count(&upstream, "upstream_error");
            let _ = first.send(Err(e));
            return;
        }
    };
    let status = reply.status;
    let headers = reply.headers.clone();
    let mut early = Vec::new();
    let mut overflowed = false;
    let others = Others::Buffer {
        events: &mut early,
        overflowed: &mut overflowed,
    };
    let answer = answer_of(reply, &original_id, others).await;
    if overflowed {
        forget(&state);
        state.count(&upstream, "relay_overflow");
        let task_id = answer
            .as_ref()
            .and_then(|a| a.pointer("/result/task/taskId"))
            .and_then(Value::as_str);
        let _ = first.send(Ok(McpReply::local_error(
            Some(&original_id),
            jsonrpc::INTERNAL_ERROR,
            &format!(
                "upstream `{upstream}` sent more than {EARLY_LIMIT} messages before answering the upgraded tools/call; the exchange was ended{}",
                if task_id.is_some() { " and the task cancelled" } else { "" }
            ),
        )));
        if let Some(task_id) = task_id {
            cancel_task(&inner, &state, &ctx, task_id).await;
        }
        return;
    }
    let Some(answer) = answer else {
        forget(&state);
        state.count(&upstream, "upstream_error");
        let _ = first.send(Ok(McpReply::local_error(
            Some(&original_id),
            jsonrpc::INTERNAL_ERROR,
            &format!("upstream `{upstream}` sent no answer to the upgraded tools/call"),
        )));
        return;
    };
    let Some(task) = answer
        .pointer("/result/task")
        .filter(|t| t.get("taskId").is_some())
    else {
        // Not a task after all (an error, or the call ran plainly): the answer as it came.
        forget(&state);
        state.count(&upstream, "not_a_task");
        let mut reply = McpReply::local_json(Bytes::from(answer.to_string()));
        reply.status = if status.is_success() {
            StatusCode::OK
        } else {
            status
        };
        let _ = first.send(Ok(reply));
        return;
    };
    let task_id = task
        .get("taskId")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let poll = task
        .get("pollInterval")
        .and_then(Value::as_u64)
        .unwrap_or(1000)
        .max(100);
    let (tx, rx) = mpsc::channel::<Event>(RELAY_CAPACITY);
    let mut progress = Arc::new(Mutex::new(None));
    let token_key = progress_token.as_ref().map(|t| {
        let k = (ctx.caller(), t.to_string());
        // Two calls of callers that cannot be told apart may use one token: they share its
        // progress state (values still increase), neither replaces the other's.
        progress = state
            .tokens
            .lock()
            .entry(k.clone())
            .or_insert_with(|| progress.clone())
            .clone();
        k
    });
    let follower = Follower {
        state: state.clone(),
        inner: Arc::new(inner),
        ctx,
        task_id,
        original_id,
        progress_token,
        poll: Duration::from_millis(poll),
        tx,
        progress,
        key,
        call_token,
        token_key,
    };

    let mut out_headers = HeaderMap::new();
    out_headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    out_headers.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    if let Some(sid) = headers.get("mcp-session-id") {
        out_headers.insert("mcp-session-id", sid.clone());
    }
    let events: EventStream = Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|ev| (ev, rx))
    }));
    // If the client is gone, this drops the stream and the follower sees a disconnect.
    let _ = first.send(Ok(McpReply {
        status: StatusCode::OK,
        headers: out_headers,
        body: ReplyBody::Stream(events),
    }));
    for ev in early {
        follower.relay_other(ev).await;
    }
    follower.run(cancel_rx).await;
}

/// Follows one upgraded task to its end and writes to the client's stream.
struct Follower<S> {
    state: Arc<UpgradeState>,
    inner: Arc<S>,
    ctx: RequestContext,
    task_id: String,
    original_id: Id,
    progress_token: Option<Value>,
    poll: Duration,
    tx: mpsc::Sender<Event>,
    /// The last progress value sent on the client's token (shared with the GET-stream relay).
    progress: Arc<Mutex<Option<f64>>>,
    /// This call's entry in `UpgradeState::tokens`.
    token_key: Option<TokenKey>,
    key: CallKey,
    call_token: u64,
}

enum End {
    Answer(Value),
    /// A `tasks/get` poll said the task ended (status, statusMessage) and `tasks/result` has not
    /// answered within one more poll interval.
    Terminal(String, String),
    NeedsCapability(&'static str, &'static str),
    ClientCancelled,
    Disconnected,
    Failed(String),
}

fn event(data: String) -> Event {
    Event {
        event: Some("message".into()),
        data: Some(data),
        id: None,
        retry: None,
    }
}

impl<S> Follower<S>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    async fn send(&self, data: String) -> bool {
        self.tx.send(event(data)).await.is_ok()
    }

    /// The next progress value on the client's token: above every value sent so far (the spec
    /// requires progress to increase), below `total` when there is one.
    fn next_progress(&self, wanted: Option<f64>, total: Option<f64>) -> f64 {
        next_progress(&self.progress, wanted, total)
    }

    /// Sends a status change as a progress message on the client's token (if it gave one).
    async fn progress(&self, message: String) {
        let Some(token) = &self.progress_token else {
            return;
        };
        let value = self.next_progress(None, None);
        let msg = serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": { "progressToken": token, "progress": value, "message": message },
        });
        let _ = self.tx.send(event(msg.to_string())).await;
    }

    /// Relays what the upstream sends on the task's streams: status notifications become
    /// progress messages, progress on the client's token is kept increasing, the rest as it came.
    async fn relay_other(&self, mut ev: Event) {
        let Some(data) = &ev.data else { return };
        let bytes = data.as_bytes();
        if crate::jsonrpc::needles::found(&crate::jsonrpc::needles::TASK_STATUS, bytes) {
            if let Ok(v) = serde_json::from_str::<Value>(data) {
                if let Some(p) = v.get("params") {
                    let status = p.get("status").and_then(Value::as_str).unwrap_or("");
                    let message = p.get("statusMessage").and_then(Value::as_str).unwrap_or("");
                    let text = if message.is_empty() {
                        status.to_string()
                    } else {
                        format!("{status}: {message}")
                    };
                    self.progress(text).await;
                }
            }
            return;
        }
        if self.progress_token.is_some()
            && crate::jsonrpc::needles::found(&crate::jsonrpc::needles::PROGRESS, bytes)
        {
            if let Ok(mut v) = serde_json::from_str::<Value>(data) {
                let on_token = v.pointer("/params/progressToken") == self.progress_token.as_ref();
                if on_token {
                    let wanted = v.pointer("/params/progress").and_then(Value::as_f64);
                    let total = v.pointer("/params/total").and_then(Value::as_f64);
                    let value = self.next_progress(wanted, total);
                    if Some(value) != wanted {
                        v["params"]["progress"] = Value::from(value);
                        ev.data = Some(v.to_string());
                    }
                }
            }
        }
        let _ = self.tx.send(ev).await;
    }

    /// Asks `tasks/result` until it answers (a server may close the stream before the answer,
    /// as SSE polling does: ask again, a few times, as a reconnecting client would); what the
    /// upstream sends before the answer goes to `relay`.
    async fn ask_result(
        inner: S,
        state: Arc<UpgradeState>,
        ctx: RequestContext,
        task_id: String,
        relay: mpsc::Sender<Event>,
        attempts: usize,
    ) -> End {
        for _ in 0..attempts {
            let result_id = state.next_id();
            let result_req = own_request(
                &ctx,
                &result_id,
                "tasks/result",
                serde_json::json!({ "taskId": task_id }),
            );
            let reply = match inner.clone().oneshot(result_req).await {
                Ok(r) => r,
                Err(e) => return End::Failed(e.to_string()),
            };
            if let Some(v) = answer_of(reply, &result_id, Others::Relay(&relay)).await {
                return End::Answer(v);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        End::Failed(format!(
            "the tasks/result stream ended without an answer, {attempts} times"
        ))
    }

    async fn run(self, mut cancel_rx: oneshot::Receiver<()>) {
        let upstream = self.ctx.upstream.clone();
        let _hold = self
            .state
            .registry
            .releases()
            .hold(&upstream, &self.task_id);
        let (relay_tx, mut relay_rx) = mpsc::channel::<Event>(RELAY_CAPACITY);
        let client_caps = self
            .state
            .sessions
            .get(&upstream, session_key(&self.ctx).as_ref());
        let mut result_fut = Box::pin(Self::ask_result(
            (*self.inner).clone(),
            self.state.clone(),
            self.ctx.clone(),
            self.task_id.clone(),
            relay_tx.clone(),
            5,
        ));
        let mut ticker = tokio::time::interval(self.poll);
        ticker.tick().await;
        let mut last_status: Option<(String, String)> = None;
        // One tasks/get at a time, polled alongside (a slow one never delays the answer).
        let mut polling: Option<Pin<Box<dyn Future<Output = Option<(String, String)>> + Send>>> =
            None;
        // Set once a poll reported a terminal status: tasks/result gets one more poll interval.
        let mut terminal: Option<Pin<Box<tokio::time::Sleep>>> = None;
        // The cancel signal can only end in Ok (a client's cancel) or Err (the entry is gone);
        // only Ok is a cancel, and a finished receiver is not polled again.
        let mut cancel_open = true;
        let end = loop {
            tokio::select! {
                end = &mut result_fut => break end,
                signal = &mut cancel_rx, if cancel_open => {
                    cancel_open = false;
                    if signal.is_ok() {
                        break End::ClientCancelled;
                    }
                }
                _ = self.tx.closed() => break End::Disconnected,
                _ = async { terminal.as_mut().expect("guarded").await }, if terminal.is_some() => {
                    let (status, message) = last_status.clone().unwrap_or_default();
                    break End::Terminal(status, message);
                }
                _ = ticker.tick(), if polling.is_none() && terminal.is_none() => {
                    polling = Some(Box::pin(poll_status(
                        (*self.inner).clone(),
                        self.state.clone(),
                        self.ctx.clone(),
                        self.task_id.clone(),
                    )));
                }
                st = async { polling.as_mut().expect("guarded").await }, if polling.is_some() => {
                    polling = None;
                    if let Some(st) = st {
                        if last_status.as_ref() != Some(&st) {
                            let message = if st.1.is_empty() { st.0.clone() } else { format!("{}: {}", st.0, st.1) };
                            let ended = TaskStatus::parse(&st.0).is_some_and(|s| s.is_terminal());
                            last_status = Some(st);
                            self.progress(message).await;
                            if ended {
                                terminal = Some(Box::pin(tokio::time::sleep(self.poll)));
                            }
                        }
                    }
                }
                Some(ev) = relay_rx.recv() => {
                    if let Some(data) = &ev.data {
                        let method = serde_json::from_str::<Value>(data).ok().and_then(|v| v.get("method").and_then(Value::as_str).map(str::to_string));
                        let needs = match method.as_deref() {
                            Some("elicitation/create") => Some(("elicitation/create", "/elicitation")),
                            Some("sampling/createMessage") => Some(("sampling/createMessage", "/sampling")),
                            _ => None,
                        };
                        if let Some((method, pointer)) = needs {
                            if !client_caps.as_ref().is_some_and(|c| c.client_has(pointer)) {
                                break End::NeedsCapability(method, pointer);
                            }
                        }
                    }
                    self.relay_other(ev).await;
                }
            }
        };
        // The pending tasks/result (if any) is given up.
        drop(result_fut);
        let end = match end {
            End::Terminal(status, message) => {
                // Ask once more, bounded: the task has ended, so its result is there or never.
                tracing::info!(task_id = %self.task_id, status, "tasks/get says the upgraded task ended; tasks/result asked again");
                let again = Self::ask_result(
                    (*self.inner).clone(),
                    self.state.clone(),
                    self.ctx.clone(),
                    self.task_id.clone(),
                    relay_tx.clone(),
                    1,
                );
                let deadline = self.state.result_deadline();
                match tokio::time::timeout(deadline, again).await {
                    Ok(End::Answer(v)) => End::Answer(v),
                    _ => End::Terminal(status, message),
                }
            }
            end => end,
        };
        drop(relay_tx);
        self.state.forget(&self.key, self.call_token);
        if let Some(k) = &self.token_key {
            let mut tokens = self.state.tokens.lock();
            if tokens
                .get(k)
                .is_some_and(|p| Arc::ptr_eq(p, &self.progress))
            {
                tokens.remove(k);
            }
        }
        if matches!(end, End::Answer(_) | End::Failed(_) | End::Terminal(..)) {
            // What the upstream sent before its answer goes out before the answer.
            while let Ok(ev) = relay_rx.try_recv() {
                self.relay_other(ev).await;
            }
        }
        match end {
            End::Answer(Value::Object(mut v)) => {
                let failed = v.get("error").is_some()
                    || v.get("result")
                        .and_then(|r| r.get("isError"))
                        .and_then(Value::as_bool)
                        == Some(true);
                self.state
                    .count(&upstream, if failed { "failed" } else { "completed" });
                let id = serde_json::from_str(self.original_id.as_json()).unwrap_or(Value::Null);
                v.insert("id".into(), id);
                self.send(Value::Object(v).to_string()).await;
            }
            End::Answer(_) => {
                self.state.count(&upstream, "upstream_error");
                self.send_error("upstream answered tasks/result with a non-object body")
                    .await;
            }
            End::Terminal(status, message) => {
                self.state.count(&upstream, "upstream_error");
                let message = if message.is_empty() {
                    String::new()
                } else {
                    format!(" ({message})")
                };
                self.send_error(&format!(
                    "the upgraded task ended with status `{status}`{message}, but tasks/result gave no answer"
                ))
                .await;
            }
            End::NeedsCapability(method, pointer) => {
                self.state.count(&upstream, "refused_capability");
                self.cancel_upstream().await;
                let message = format!(
                    "the tool needs {method}, but this client did not declare capabilities.{}; the task was cancelled",
                    pointer.trim_start_matches('/')
                );
                self.send_error(&message).await;
            }
            End::ClientCancelled => {
                self.state.count(&upstream, "cancelled");
                self.cancel_upstream().await;
            }
            End::Disconnected => {
                self.state.count(&upstream, "disconnected");
                if self.state.config.on_client_disconnect == OnDisconnect::Cancel {
                    tokio::time::sleep(Duration::from_millis(
                        self.state.config.disconnect_grace_ms,
                    ))
                    .await;
                    self.cancel_upstream().await;
                }
            }
            End::Failed(why) => {
                self.state.count(&upstream, "upstream_error");
                self.send_error(&format!("following the upgraded task failed: {why}"))
                    .await;
            }
        }
    }

    /// Answers the client's original request with a JSON-RPC error (`-32603`).
    async fn send_error(&self, message: &str) {
        let err =
            jsonrpc::error_response(Some(&self.original_id), jsonrpc::INTERNAL_ERROR, message);
        self.send(String::from_utf8_lossy(&err).into_owned()).await;
    }

    async fn cancel_upstream(&self) {
        cancel_task(&*self.inner, &self.state, &self.ctx, &self.task_id).await;
    }
}

/// One `tasks/get` for the follower: the task's `(status, statusMessage)`.
async fn poll_status<S>(
    inner: S,
    state: Arc<UpgradeState>,
    ctx: RequestContext,
    task_id: String,
) -> Option<(String, String)>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Send + 'static,
    S::Future: Send + 'static,
{
    let id = state.next_id();
    let req = own_request(
        &ctx,
        &id,
        "tasks/get",
        serde_json::json!({ "taskId": task_id }),
    );
    let reply = inner.oneshot(req).await.ok()?;
    let v = answer_of(reply, &id, Others::Discard).await?;
    let r = v.get("result")?;
    Some((
        r.get("status")?.as_str()?.to_string(),
        r.get("statusMessage")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    ))
}

async fn cancel_task<S>(inner: &S, state: &UpgradeState, ctx: &RequestContext, task_id: &str)
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let id = state.next_id();
    let req = own_request(
        ctx,
        &id,
        "tasks/cancel",
        serde_json::json!({ "taskId": task_id }),
    );
    match inner.clone().oneshot(req).await {
        Ok(reply) => {
            let answer = answer_of(reply, &id, Others::Discard).await;
            tracing::info!(task_id, answer = ?answer.map(|v| v.to_string()), "upgraded task cancelled upstream");
        }
        Err(e) => tracing::warn!(task_id, error = %e, "could not cancel an upgraded task upstream"),
    }
}

/// After a restart: cancels every non-terminal upgraded task (its client is gone), through the
/// upstream's stack so the `cancel` layer records it. Returns how many were cancelled.
pub async fn cancel_orphans<S>(state: &UpgradeState, upstream: &Arc<str>, stack: S) -> usize
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    // A scan of the whole store: on the blocking pool (see `registry`).
    let orphans = state.registry.upgraded_live(upstream).await;
    for r in &orphans {
        let session = r
            .upstream_session
            .as_deref()
            .and_then(|s| HeaderValue::from_str(s).ok());
        let principal = match &r.owner {
            crate::store::Owner::Principal(p) => Principal::Token(p.as_str().into()),
            _ => Principal::Anonymous,
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        if let Some(v) = r
            .protocol_version
            .as_deref()
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            headers.insert("mcp-protocol-version", v);
        }
        let ctx = RequestContext {
            upstream: upstream.clone(),
            session_id: session.clone(),
            client_session_id: session,
            principal,
            headers,
        };
        state.count(upstream, "orphaned");
        cancel_task(&stack, state, &ctx, &r.task_id).await;
        if r.status != TaskStatus::Cancelled {
            tracing::info!(task_id = %r.task_id, "orphaned upgraded task cancelled after restart");
        }
    }
    orphans.len()
}
