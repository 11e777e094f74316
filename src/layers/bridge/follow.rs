//! The bridged `tasks/get`, `tasks/result` (followed by polling) and `tasks/cancel` (see the
//! module docs of `bridge`).

use super::translate::{self, Payload};
use super::{ask, ask_until, error_reply, failure_reply, legacy_reply, modern_request};
use super::{BridgeService, BridgeState, MAX_POLL, MIN_POLL};
use crate::exchange::{GatewayError, McpReply, McpRequest, ReplyBody, RequestParts};
use crate::jsonrpc::{self, Id};
use crate::layers::cancel_ack;
use crate::layers::extensions::{AuthorisedTask, CancelFoundTerminal};
use crate::layers::lost_task;
use crate::layers::relay::input::{self, Ask, Pending, MAX_KEYS_PER_TASK};
use crate::layers::McpService;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::task::{now_ms, valid_time, TaskStatus};
use crate::metrics::InputRefusal;
use crate::registry::Observed;
use crate::sse::Event;
use crate::store::TaskRecord;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

fn params_for(task_id: &str) -> Value {
    json!({ "taskId": task_id, "_meta": translate::modern_meta(None) })
}

/// taskgate's 2026 `method` about `task_id` under `id`, in `req`'s context (its extensions, for
/// `observe`; `record` as the [`AuthorisedTask`] when given), sent upstream and its answer
/// read, the whole exchange bounded by the upstream's `timeout_ms` (see [`ask`]).
async fn task_request<S: McpService>(
    state: &BridgeState,
    inner: S,
    req: &McpRequest,
    id: &Id,
    method: &str,
    task_id: &str,
    record: Option<&TaskRecord>,
) -> Result<Option<Value>, GatewayError> {
    let mut out = modern_request(req, id, method, params_for(task_id), Some(task_id));
    if let Some(r) = record {
        out.extensions.insert(AuthorisedTask {
            record: Arc::new(r.clone()),
        });
    }
    ask(state, inner, out, id).await
}

/// A bridged `tasks/get`: the `DetailedTask` answered as a 2025 `Task`.
pub(super) async fn tasks_get<S: McpService>(
    state: &Arc<BridgeState>,
    inner: S,
    req: McpRequest,
    id: Id,
    record: TaskRecord,
) -> McpReply {
    if let Some(task) = stored_task(&record) {
        return McpReply::local_json(jsonrpc::result_response(&id, &task.to_string()))
            .answered_locally(crate::metrics::LocalReason::StoredResult);
    }
    if let Some(reply) = lost_answer(&record, Lost::Get, &id) {
        return reply;
    }
    match task_request(state, inner, &req, &id, "tasks/get", &record.task_id, None).await {
        Ok(answer) if lost_task::is_not_found(answer.as_ref()) => {
            // Lost: the record as it now is (failed; or a status recorded terminal before, a
            // cancel's, which stays), never the upstream's "not found" for a task it holds.
            state.relay.inputs.forget(&record.task_id);
            let now = lost_task::fail_lost_bridged(&state.registry, &record, "tasks/get").await;
            match now.filter(|r| r.status.is_terminal()) {
                Some(now) => match serde_json::to_string(&now.to_task()) {
                    Ok(task) => McpReply::local_json(jsonrpc::result_response(&id, &task))
                        .answered_locally(crate::metrics::LocalReason::StoredResult),
                    Err(_) => legacy_reply(&id, answer, Value::clone),
                },
                None => legacy_reply(&id, answer, Value::clone),
            }
        }
        Ok(answer) => legacy_reply(&id, answer, |r| match translate::legacy_task(r) {
            Some(mut task) => {
                recorded_times(&mut task, r, &record);
                task
            }
            None => r.clone(),
        }),
        Err(e) => failure_reply(&id, &e),
    }
}

/// A time of `upstream` (the 2026 task a `tasks/get` answered) that is not an RFC 3339 one is
/// shown in `task` (its 2025 translation) as the record holds it (taskgate's clock when it was
/// recorded: `Registry::creation_record`), so every `tasks/get` and `tasks/list` shows the same
/// time, not taskgate's clock at each answer.
fn recorded_times(task: &mut Value, upstream: &Value, record: &TaskRecord) {
    let invalid = |key: &str| valid_time(upstream.get(key).and_then(Value::as_str)).is_none();
    if invalid("createdAt") {
        task["createdAt"] = Value::from(record.created_at.as_str());
    }
    // The record's time is this status's only when the record holds it already.
    let same = upstream.get("status").and_then(Value::as_str) == Some(record.status.as_str());
    if invalid("lastUpdatedAt") && same {
        task["lastUpdatedAt"] = Value::from(record.last_updated_at.as_str());
    }
}

/// The request a lost task is answered for ([`lost_answer`]).
#[derive(Clone, Copy)]
enum Lost {
    Get,
    Result,
    Cancel,
}

/// The 2025 answer about a bridged task taskgate failed itself (its upstream lost it: `failed`
/// with the `-32603` it was failed with kept, no result), from its record: `tasks/get` the
/// failed `Task`, `tasks/result` that error, `tasks/cancel` `-32602` "already terminal".
/// `None` for any other record.
fn lost_answer(record: &TaskRecord, method: Lost, id: &Id) -> Option<McpReply> {
    if record.status != TaskStatus::Failed || record.terminal_result.is_some() {
        return None;
    }
    let error: Value = serde_json::from_str(record.terminal_error.as_deref()?).ok()?;
    let reply = match method {
        Lost::Get => {
            let task = serde_json::to_string(&record.to_task()).ok()?;
            McpReply::local_json(jsonrpc::result_response(id, &task))
        }
        Lost::Result => error_reply(id, Some(&error)),
        Lost::Cancel => McpReply::error(
            Era::Legacy,
            Some(id),
            &McpError::TaskAlreadyTerminal {
                task_id: record.task_id.clone(),
                status: TaskStatus::Failed,
            },
        ),
    };
    Some(reply.answered_locally(crate::metrics::LocalReason::StoredResult))
}

/// A bridged task whose upstream answered taskgate's own `tasks/get` `-32602` (it restarted and
/// forgot it), as for every task an upstream lost (README "when the upstream says it no longer
/// has a task"): the record is failed (`reason="upstream_lost"`, the owner's slot given back)
/// and the client answered from it ([`lost_answer`]). `first`: the request first answered
/// `-32602`. `None`: the record could not be read or ended otherwise first.
async fn lost(
    state: &BridgeState,
    record: &TaskRecord,
    first: &str,
    method: Lost,
    id: &Id,
) -> Option<McpReply> {
    state.relay.inputs.forget(&record.task_id);
    let now = lost_task::fail_lost_bridged(&state.registry, record, first).await?;
    lost_answer(&now, method, id)
}

/// The 2025 `Task` of a terminal record from the `DetailedTask` it holds.
fn stored_task(record: &TaskRecord) -> Option<Value> {
    if !record.status.is_terminal() {
        return None;
    }
    let stored: Value = serde_json::from_str(record.terminal_result.as_deref()?).ok()?;
    let mut task = translate::legacy_task(&stored)?;
    // The recorded status wins (a cancel recorded before a late completion).
    if record.status == TaskStatus::Cancelled {
        task["status"] = json!("cancelled");
    }
    Some(task)
}

/// The wait before the next poll: the task's `pollIntervalMs` (else the record's), clamped to
/// [`MIN_POLL`]..[`MAX_POLL`]; when neither gives a positive interval (`0`, or none), `backoff`,
/// which then doubles up to [`MAX_POLL`].
fn poll_wait(task: &Value, record: &TaskRecord, backoff: &mut Duration) -> Duration {
    let given = task
        .get("pollIntervalMs")
        .map(Value::as_u64)
        .unwrap_or(record.poll_interval_ms)
        .filter(|ms| *ms > 0);
    match given {
        Some(ms) => Duration::from_millis(ms).clamp(MIN_POLL, MAX_POLL),
        None => {
            let wait = *backoff;
            *backoff = (*backoff * 2).min(MAX_POLL);
            wait
        }
    }
}

/// What is malformed in the `inputRequests` of `task`, a `DetailedTask` with status `status`
/// (2026-07-28 tasks: an `input_required` task MUST carry every outstanding input request, an
/// object of key → `{"method": string, "params"?: object}`); `None` when nothing is. Checked
/// when the status is `input_required` or the member is an object (its entries are relayed
/// whatever the status); an empty object is no error (nothing outstanding).
fn malformed_input_requests(task: &Value, status: TaskStatus) -> Option<String> {
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    let requests = match task.get("inputRequests") {
        Some(Value::Object(requests)) => requests,
        None if status == TaskStatus::InputRequired => {
            return Some("status input_required with no inputRequests".into())
        }
        Some(other) if status == TaskStatus::InputRequired => {
            return Some(format!("{}, not an object of input requests", kind(other)))
        }
        _ => return None,
    };
    requests.iter().find_map(|(key, request)| {
        let shown: String = key.chars().take(64).collect();
        let Some(request) = request.as_object() else {
            return Some(format!(
                "entry `{shown}` is {}, not a request",
                kind(request)
            ));
        };
        match (request.get("method"), request.get("params")) {
            (Some(Value::String(_)), None | Some(Value::Object(_))) => None,
            (Some(Value::String(_)), Some(params)) => Some(format!(
                "entry `{shown}` has params that are {}, not an object",
                kind(params)
            )),
            (Some(method), _) => Some(format!(
                "entry `{shown}` has a method that is {}, not a string",
                kind(method)
            )),
            (None, _) => Some(format!("entry `{shown}` has no method")),
        }
    })
}

/// The 2025 answer to `tasks/result` for a terminal `DetailedTask`.
fn payload_reply(id: &Id, payload: Payload) -> McpReply {
    match payload {
        Payload::Result(r) => McpReply::local_json(jsonrpc::result_response(id, &r.to_string())),
        Payload::Error(e) => error_reply(id, Some(&e)),
        Payload::None(error) => McpReply::error(Era::Legacy, Some(id), &error),
    }
}

/// A bridged `tasks/result`: blocks, following the upstream's `tasks/get`, until the task is
/// terminal or its ttl has elapsed (see the module docs). Answered as an SSE stream: a
/// `notifications/tasks/status` for each status change seen while following, the
/// `input_required` prompts (see `relay::input`), the answer last. The client closing the stream stops
/// the polls.
pub(super) async fn tasks_result<S: McpService>(
    state: &Arc<BridgeState>,
    inner: S,
    req: McpRequest,
    id: Id,
    record: TaskRecord,
) -> McpReply {
    let task_id = record.task_id.clone();
    if record.status == TaskStatus::Cancelled {
        // Cancelled is final, whatever the upstream reports later: no result exists.
        return payload_reply(
            &id,
            Payload::None(McpError::NoResult {
                task_id,
                status: TaskStatus::Cancelled,
                status_message: None,
            }),
        );
    }
    if let Some(reply) = lost_answer(&record, Lost::Result, &id) {
        return reply;
    }
    if record.status.is_terminal() {
        if let Some(stored) = record
            .terminal_result
            .as_deref()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
        {
            if let Some(p) = translate::terminal_payload(&stored, &task_id) {
                return payload_reply(&id, p)
                    .answered_locally(crate::metrics::LocalReason::StoredResult);
            }
        }
    }
    let (tx, rx) = mpsc::channel::<Event>(RELAY_CAPACITY);
    let state = state.clone();
    tokio::spawn(async move {
        let closed = tx.clone();
        tokio::select! {
            answer = follow_result(&state, inner, &req, &id, record, &tx) => {
                let bytes = match answer.body {
                    ReplyBody::Json(b) => b,
                    _ => McpError::FollowUnanswered.body(Some(&id)),
                };
                let _ = tx.send(Event::message(String::from_utf8_lossy(&bytes).into_owned())).await;
            }
            _ = closed.closed() => {
                tracing::debug!(task_id, "bridged tasks/result: the client went away; following stopped");
            }
        }
    });
    McpReply::event_stream(rx, None)
}

/// Capacity of the channel to a bridged `tasks/result` stream.
const RELAY_CAPACITY: usize = 64;

/// Polls until terminal or expired; sends status changes and input requests on `tx`; returns
/// the answer (JSON; `McpReply::accepted()` when the client went away).
async fn follow_result<S: McpService>(
    state: &Arc<BridgeState>,
    inner: S,
    req: &McpRequest,
    id: &Id,
    record: TaskRecord,
    tx: &mpsc::Sender<Event>,
) -> McpReply {
    let task_id = record.task_id.clone();
    // An open tasks/result holds its task (the "resources released" fact) until answered.
    let _hold = state.registry.releases().hold(&req.ctx.upstream, &task_id);
    // The client capabilities its session declared, read once (they do not change).
    let declared = state.client_of(req).declared;
    let mut known = record;
    let mut backoff = MIN_POLL;
    loop {
        if let Ok(Some(now)) = state
            .registry
            .record_cached(&req.ctx.upstream, &task_id)
            .await
        {
            if now.status == TaskStatus::Cancelled {
                // Cancelled while followed (a client's `tasks/cancel`, taskgate's own for input
                // it could not relay): final, whatever the upstream reports later.
                state.relay.inputs.forget(&task_id);
                return payload_reply(
                    id,
                    Payload::None(McpError::NoResult {
                        task_id,
                        status: TaskStatus::Cancelled,
                        status_message: now.status_message.clone(),
                    }),
                );
            }
        }
        if known.is_expired(now_ms()) {
            // The ttl (the CreateTaskResult's, capped by tasks.max_ttl_ms) has elapsed: the
            // upstream may have deleted the task (2025-11-25: expired is -32602).
            state.relay.inputs.forget(&task_id);
            tracing::info!(
                task_id,
                "bridged tasks/result: the task's ttl elapsed while following it"
            );
            let error = McpError::TaskExpired { task_id };
            return McpReply::error(Era::Legacy, Some(id), &error);
        }
        let poll_id = state.next_id();
        let answer = task_request(
            state,
            inner.clone(),
            req,
            &poll_id,
            "tasks/get",
            &task_id,
            Some(&known),
        )
        .await;
        let answer = match answer {
            Ok(Some(answer)) => answer,
            Ok(None) => {
                let error = McpError::TaskGetUnanswered { task_id };
                return McpReply::error(Era::Legacy, Some(id), &error);
            }
            Err(e) => return failure_reply(id, &e),
        };
        let Some(task) = answer.get("result").filter(|r| r.is_object()) else {
            // The upstream no longer knows the task (a restart: -32602, taskgate's own clean
            // poll), or failed.
            if lost_task::is_not_found(Some(&answer)) {
                if let Some(reply) = lost(state, &known, "tasks/get", Lost::Result, id).await {
                    return reply;
                }
            }
            return error_reply(id, answer.get("error"));
        };
        if let Some(p) = translate::terminal_payload(task, &task_id) {
            state.relay.inputs.forget(&task_id);
            return payload_reply(id, p);
        }
        let Some(s) = task
            .get("status")
            .and_then(Value::as_str)
            .and_then(TaskStatus::parse)
        else {
            // Not a status the protocol has: the same answer would only come back until the
            // ttl ends (a day, for a task the upstream keeps for ever).
            state.relay.inputs.forget(&task_id);
            let error = McpError::Upstream {
                detail: format!(
                    "upstream `{}` answered tasks/get for task {task_id} with no valid task status ({})",
                    req.ctx.upstream,
                    task.get("status").map_or("none".into(), Value::to_string)
                ),
            };
            return McpReply::error(Era::Legacy, Some(id), &error);
        };
        if let Some(what) = malformed_input_requests(task, s) {
            // As for a status the protocol has not: the same answer would only come back until
            // the ttl ends (tester 3 F8: 600 polls in a minute, then the record was gone). The
            // task is not cancelled: the upstream's answer is wrong, not the client.
            state.relay.inputs.forget(&task_id);
            let error = McpError::Upstream {
                detail: format!(
                    "upstream `{}` answered tasks/get for task {task_id} with a malformed inputRequests: {what}",
                    req.ctx.upstream
                ),
            };
            return McpReply::error(Era::Legacy, Some(id), &error);
        }
        if s != known.status {
            // A status change seen while following: `notifications/tasks/status` (2025).
            backoff = MIN_POLL;
            if let Some(t) = translate::legacy_task(task) {
                let note =
                    json!({"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": t});
                if tx.send(Event::message(note.to_string())).await.is_err() {
                    return McpReply::accepted();
                }
            }
        }
        known.status = s;
        if let Some(requests) = task.get("inputRequests").and_then(Value::as_object) {
            if let Err(reply) =
                relay_inputs(state, &inner, req, id, &known, requests, &*declared, tx).await
            {
                return reply;
            }
        }
        let wait = poll_wait(task, &known, &mut backoff);
        let left = Duration::from_millis(known.expires_at.saturating_sub(now_ms()));
        tokio::time::sleep(wait.min(left)).await;
    }
}

/// Sends the new keys of an `inputRequests` snapshot to the client (see `relay::input`); `Err` with
/// the answer that ends the `tasks/result` when the client cannot answer one or the task asks
/// for too many (the task is then cancelled), or when the client went away.
#[allow(clippy::too_many_arguments)]
async fn relay_inputs<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
    id: &Id,
    record: &TaskRecord,
    requests: &serde_json::Map<String, Value>,
    declared: &(dyn Fn(&str) -> bool + Send + Sync),
    tx: &mpsc::Sender<Event>,
) -> Result<(), McpReply> {
    let task_id = &record.task_id;
    let metrics = state.registry.metrics();
    if let Some(total) = state.relay.inputs.over_bound(task_id, requests) {
        metrics.bridge_input_refused(&req.ctx.upstream, InputRefusal::TooManyKeys);
        tracing::warn!(%task_id, keys = total, limit = MAX_KEYS_PER_TASK, "a bridged task asks for more input than taskgate relays for one task: cancelling it");
        cancel_for_input(state, inner, req, record).await;
        let error = McpError::TaskInputsExceeded {
            task_id: task_id.to_string(),
            asked: total,
            max: MAX_KEYS_PER_TASK,
        };
        return Err(McpReply::error(Era::Legacy, Some(id), &error));
    }
    for (key, request) in requests {
        let decision = state
            .relay
            .inputs
            .ask(declared, &req.ctx, task_id, key, request);
        match decision {
            Ask::Already => {}
            Ask::Send(message) => {
                if tx.send(Event::message(message)).await.is_err() {
                    return Err(McpReply::accepted());
                }
            }
            Ask::Unsupported(method) => {
                metrics.bridge_input_refused(&req.ctx.upstream, InputRefusal::Capability);
                cancel_for_input(state, inner, req, record).await;
                let error = McpError::TaskInputNotRelayed {
                    task_id: task_id.to_string(),
                    method: method.to_string(),
                };
                return Err(McpReply::error(Era::Legacy, Some(id), &error));
            }
        }
    }
    Ok(())
}

/// Cancels a task whose input the client cannot give: one upstream `tasks/cancel` through the
/// `cancel` layer's single-flight and claim (a client's `tasks/cancel` racing it joins the same
/// flight; `cancel_requested` is recorded there once), with `inner` as the service below it.
async fn cancel_for_input<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
    record: &TaskRecord,
) {
    cancel_by_taskgate(state, inner, req, record, "its input cannot be asked").await;
}

/// Cancels `record`'s task for taskgate's own reason `why` (logged), as [`cancel_for_input`]
/// says; `req` is a request of the task's owner.
pub(super) async fn cancel_by_taskgate<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
    record: &TaskRecord,
    why: &str,
) {
    let id = state.next_id();
    let mut cancel = super::internal_request(req, &id, "tasks/cancel", &record.task_id);
    cancel.extensions.insert(AuthorisedTask {
        record: Arc::new(record.clone()),
    });
    let answer = match &state.cancel {
        Some(layer) => {
            let below = BridgeService {
                inner: inner.clone(),
                state: state.clone(),
            };
            crate::layers::cancel::cancel_from_below(layer.clone(), below, cancel)
                .await
                .map(|r| r.body)
        }
        // (`tasks_cancel` records "cancel requested" when it sends the cancel.)
        None => Ok(
            tasks_cancel(state, inner.clone(), cancel, id, record.clone())
                .await
                .body,
        ),
    };
    state.relay.inputs.forget(&record.task_id);
    tracing::info!(task_id = %record.task_id, answer = ?answer, "task cancelled: {why}");
}

/// Sends a client's answer to an input request upstream as `tasks/update` (bounded like every
/// exchange of the bridge), before the answer's 202. An error answering a request whose 2026
/// result cannot carry it (a `sampling/createMessage`) cancels the task instead
/// ([`refused_by_client`]): in the background, so the 202 comes at once (at most
/// [`super::MAX_BACKGROUND_CANCELS`] such cancels run at once per upstream; past it this one
/// runs before the 202). A stop's drain waits for those still running (at most
/// `gateway.drain_timeout_ms`; `BridgeState::background_cancels_ended`).
pub(super) async fn send_update<S: McpService>(
    state: &Arc<BridgeState>,
    inner: S,
    req: &McpRequest,
    pending: Pending,
) {
    let answer = match &req.op {
        crate::exchange::Operation::Post(m) => m.parse_as::<Value>().unwrap_or(Value::Null),
        _ => Value::Null,
    };
    let base = McpRequest::from(RequestParts {
        op: req.op.clone(),
        ctx: pending.ctx.clone(),
        extensions: http::Extensions::new(),
        trace: None,
    });
    let Some(value) = input::response_value(&pending.method, &answer) else {
        match state.background_cancels.clone().try_acquire_owned() {
            Ok(permit) => {
                let state = state.clone();
                tokio::spawn(async move {
                    refused_by_client(&state, &inner, &base, &pending, &answer).await;
                    state.background_cancel_ended(permit);
                });
            }
            Err(_) => refused_by_client(state, &inner, &base, &pending, &answer).await,
        }
        return;
    };
    let id = state.next_id();
    let params = json!({
        "taskId": pending.task_id,
        "inputResponses": { pending.key.clone(): value },
        "_meta": translate::modern_meta(None),
    });
    let out = modern_request(&base, &id, "tasks/update", params, Some(&pending.task_id));
    match ask(state, inner, out, &id).await {
        Ok(a) => {
            tracing::debug!(task_id = %pending.task_id, key = %pending.key, answer = ?a, "tasks/update sent")
        }
        Err(e) => tracing::warn!(task_id = %pending.task_id, error = %e, "tasks/update failed"),
    }
}

/// The client answered an input request whose 2026 result has no refusal form (a
/// `sampling/createMessage`: `InputResponse = CreateMessageResult | ListRootsResult |
/// ElicitResult`, and a `CreateMessageResult` cannot say "refused") with a JSON-RPC error.
/// No `inputResponses` value says that: an `ElicitResult` `decline` is not a sampling result,
/// and an error object is no `InputResponse` (the server may reject the whole `tasks/update`,
/// or take it for a sampled message); sending nothing leaves the task waiting for the answer
/// until its ttl. So the task is cancelled upstream, as for input the client cannot give
/// ([`cancel_for_input`]: one `tasks/cancel` through `cancel`'s single-flight, recorded
/// `cancelled`), counted `taskgate_bridge_input_refused_total{reason="client_error"}`; the
/// client's `tasks/result` then ends with the `-32603` of a cancelled task.
async fn refused_by_client<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
    pending: &Pending,
    answer: &Value,
) {
    let upstream = &pending.ctx.upstream;
    state
        .registry
        .metrics()
        .bridge_input_refused(upstream, InputRefusal::ClientError);
    let code = answer.pointer("/error/code").and_then(Value::as_i64);
    tracing::info!(task_id = %pending.task_id, key = %pending.key, method = %pending.method, ?code, "the client answered an input request with an error its 2026 result cannot carry: cancelling the task");
    match state
        .registry
        .record_cached(upstream, &pending.task_id)
        .await
    {
        Ok(Some(record)) if !record.status.is_terminal() => {
            cancel_for_input(state, inner, req, &record).await;
        }
        Ok(_) => state.relay.inputs.forget(&pending.task_id),
        Err(e) => {
            tracing::warn!(task_id = %pending.task_id, error = %e, "the task of a refused input request could not be read; not cancelled");
        }
    }
}

/// A bridged `tasks/cancel` (one per task: `cancel` above single-flights it).
///
/// Three steps, all within one deadline, the upstream's `timeout_ms` from the start (past it,
/// in the first two, the upstream timeout's `-32603`):
/// 1. a 2026 `tasks/get` (a 2026 server acknowledges a cancel of a task that already ended,
///    and the ack carries no status: taken for `cancelled`, it would hide a task that completed
///    or failed unobserved, and its result). A task it shows terminal (recorded so by
///    `observe`) is answered `-32602` naming that status, marked [`CancelFoundTerminal`]: nothing was
///    sent, and `cancel` counts it as its own answer for a terminal task;
/// 2. otherwise "cancel requested" is recorded (`Registry::request_cancel`, the audit's
///    "forwarded upstream") and the 2026 `tasks/cancel` sent;
/// 3. after its ack, what the server made of it: 2026-07-28 §1.6 lets a task acknowledged
///    cancelled still end `completed` or `failed` ("if the work finished before cancellation
///    could take effect"), and the ack says nothing, so a task that ended between step 1 and
///    the cancel is seen only by asking again: a second `tasks/get`, skipped when the record is
///    already terminal (a `notifications/tasks` on the cancel's stream or another poll told
///    it). Then the ack is applied as the task `cancelled` (`cancel_ack::apply`: the first
///    terminal status recorded stands), so a task that completed keeps its result and the
///    client gets `-32602` naming `completed`; a task still live (a cooperative cancel not yet
///    taken effect), or one the second `tasks/get` could not tell about (an error, no answer,
///    the deadline reached), is recorded `cancelled` as the 2025 client is told. What remains:
///    such a task that completes after that answer keeps `cancelled` (a counted late result).
pub(super) async fn tasks_cancel<S: McpService>(
    state: &Arc<BridgeState>,
    inner: S,
    req: McpRequest,
    id: Id,
    record: TaskRecord,
) -> McpReply {
    let task_id = record.task_id.clone();
    let upstream = req.ctx.upstream.clone();
    let deadline = tokio::time::Instant::now() + state.relay.timeout();
    let get_id = state.next_id();
    let asked = status_request(state, &inner, &req, &get_id, &record, deadline).await;
    match asked {
        Ok(Some(status)) if status.is_terminal() => {
            let error = McpError::TaskAlreadyTerminal { task_id, status };
            let mut reply = McpReply::error(Era::Legacy, Some(&id), &error);
            reply.extensions.insert(CancelFoundTerminal {
                status,
                sent: false,
            });
            return reply;
        }
        // The one deadline is spent: nothing was sent.
        Err(e @ GatewayError::UpstreamTimeout { .. }) => return failure_reply(&id, &e),
        _ => {}
    }
    state.registry.request_cancel(&upstream, &task_id).await;
    let out = modern_request(
        &req,
        &id,
        "tasks/cancel",
        params_for(&task_id),
        Some(&task_id),
    );
    let answer = match ask_until(state, inner.clone(), out, &id, deadline).await {
        Ok(answer) => answer,
        Err(e) => return failure_reply(&id, &e),
    };
    match &answer {
        Some(a) if a.get("result").is_some() => {}
        Some(a) if lost_task::is_not_found(Some(a)) => {
            // "Not found" (the upstream lost the task) or the caller's own params: told apart
            // by taskgate's own clean `tasks/get` (`-32602` again: lost).
            let get_id = state.next_id();
            let get = modern_request(
                &req,
                &get_id,
                "tasks/get",
                params_for(&task_id),
                Some(&task_id),
            );
            if let Ok(got) = ask_until(state, inner, get, &get_id, deadline).await {
                if lost_task::is_not_found(got.as_ref()) {
                    if let Some(reply) =
                        lost(state, &record, "tasks/cancel", Lost::Cancel, &id).await
                    {
                        return reply;
                    }
                }
            }
            return legacy_reply(&id, answer, Value::clone);
        }
        _ => return legacy_reply(&id, answer, Value::clone),
    }
    let known = matches!(
        state.registry.record_cached(&upstream, &task_id).await,
        Ok(Some(r)) if r.status.is_terminal()
    );
    if !known {
        let get_id = state.next_id();
        let after = status_request(state, &inner, &req, &get_id, &record, deadline).await;
        if !matches!(after, Ok(Some(_))) {
            tracing::debug!(%task_id, answer = ?after, "bridged tasks/cancel: the tasks/get after the ack told no status; the ack is taken as the task cancelled");
        }
    }
    // The ack as the 2025 client's `cancelled` (a terminal status recorded first stands).
    let (task, observed) = cancel_ack::apply(&state.registry, &upstream, &record).await;
    let mut reply =
        McpReply::local_json(cancel_ack::legacy_answer(&observed, &id, &task_id, &task));
    if let Observed::Rewrite { status, .. } = observed {
        if status != TaskStatus::Cancelled {
            // The answer is `-32602` naming it: `cancel` counts the cancel forwarded (the
            // upstream acknowledged it), not as an upstream error.
            reply
                .extensions
                .insert(CancelFoundTerminal { status, sent: true });
        }
    }
    reply
}

/// taskgate's own 2026 `tasks/get` of `record`'s task under `id`, before `deadline` (its
/// answer applied by `observe`, `record` as the [`AuthorisedTask`]): the status it shows, as a
/// 2025 client is told it (a tool error `failed`); `None` when the answer shows none (an error,
/// no answer).
async fn status_request<S: McpService>(
    state: &BridgeState,
    inner: &S,
    req: &McpRequest,
    id: &Id,
    record: &TaskRecord,
    deadline: tokio::time::Instant,
) -> Result<Option<TaskStatus>, GatewayError> {
    let task_id = &record.task_id;
    let mut out = modern_request(req, id, "tasks/get", params_for(task_id), Some(task_id));
    out.extensions.insert(AuthorisedTask {
        record: Arc::new(record.clone()),
    });
    let answer = ask_until(state, inner.clone(), out, id, deadline).await?;
    Ok(answer
        .as_ref()
        .and_then(|a| a.get("result"))
        .and_then(translate::legacy_task)
        .and_then(|t| {
            t.get("status")
                .and_then(Value::as_str)
                .and_then(TaskStatus::parse)
        }))
}
