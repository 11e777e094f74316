//! What taskgate answers for the tasks it runs itself (see the module docs of `gateway_tasks`):
//! `tasks/get`, `tasks/result`, `tasks/cancel` and `tasks/update` of a gateway task, and the
//! task shapes of both eras (2025-11-25 `Task`, nested `CreateTaskResult`; 2026-07-28 flat
//! `CreateTaskResult` and `DetailedTask`, `ttlMs`/`pollIntervalMs`).

use super::{GatewayTasksState, Outcome, RESULT_POLL};
use crate::exchange::{McpReply, McpRequest};
use crate::jsonrpc::{self, splice, Id};
use crate::layers::cancel::MODERN_ACK;
use crate::layers::extensions::AuthorisedTask;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::task::{format_rfc3339_ms, now_ms, TaskStatus};
use crate::metrics::LocalReason;
use crate::registry::Observed;
use crate::store::TaskRecord;
use bytes::Bytes;
use serde_json::{json, Value};
use std::sync::Arc;

/// The answer to `method` (`tasks/get|result|cancel|update`) about the gateway task `req`'s
/// [`AuthorisedTask`] names, in the request's era.
pub(super) async fn answer(
    state: &Arc<GatewayTasksState>,
    method: &str,
    req: McpRequest,
) -> McpReply {
    let era = req.era();
    let (Some(id), Some(authorised)) = (req.id().cloned(), req.extensions.get::<AuthorisedTask>())
    else {
        return McpReply::accepted();
    };
    let record = authorised.record.clone();
    let reply = match method {
        "tasks/get" => get(state, &record, &id, era),
        "tasks/result" => {
            let live = state.live.lock().get(&record.task_id).cloned();
            match live {
                Some(live) if !record.status.is_terminal() => {
                    let (last_state, last_record, last_id) =
                        (state.clone(), record.clone(), id.clone());
                    let last = async move {
                        let reply = result(&last_state, last_record, &last_id).await;
                        reply_bytes(reply, &last_id)
                    };
                    let rx = super::input::stream(state.clone(), live, record, req, last);
                    McpReply::event_stream(rx, None)
                }
                _ => result(state, record, &id).await,
            }
        }
        "tasks/cancel" => cancel(state, &record, &id, era).await,
        "tasks/update" if era == Era::Modern => {
            match super::input::update(state, &record.task_id, &req).await {
                Ok(()) => json_reply(&id, &serde_json::from_str(MODERN_ACK).unwrap_or_default()),
                Err(refused) => error(era, &id, refused),
            }
        }
        _ => error(
            era,
            &id,
            McpError::NotAwaitingInput {
                method: method.to_string(),
                task_id: record.task_id.clone(),
            },
        ),
    };
    reply.answered_locally(LocalReason::GatewayTask)
}

/// The JSON-RPC text of a local answer (an error naming `id` when it has none).
fn reply_bytes(reply: McpReply, id: &Id) -> bytes::Bytes {
    match reply.body {
        crate::exchange::ReplyBody::Json(b) | crate::exchange::ReplyBody::Raw(b) => b,
        _ => jsonrpc::error_response(Some(id), jsonrpc::INTERNAL_ERROR, "no answer"),
    }
}

fn json_reply(id: &Id, result: &Value) -> McpReply {
    McpReply::local_json(jsonrpc::result_response(id, &result.to_string()))
}

/// `error` under `id` as a 2025-11-25 answer (HTTP 200): `tasks/result`, and a 2025
/// `tasks/cancel` of a terminal task.
fn legacy_error(id: &Id, error: McpError) -> McpReply {
    McpReply::error(Era::Legacy, Some(id), &error)
}

fn error(era: Era, id: &Id, error: McpError) -> McpReply {
    McpReply::error(era, Some(id), &error).answered_locally(LocalReason::GatewayTask)
}

/// `tasks/get`: the record's task (2025 `Task`; 2026 `DetailedTask`, with the result a
/// terminal one needs when taskgate still has it: the `tasks` layer answers from the record
/// when the record keeps it).
fn get(state: &GatewayTasksState, record: &TaskRecord, id: &Id, era: Era) -> McpReply {
    if era == Era::Legacy {
        return json_reply(id, &task_value(record));
    }
    let mut task = detailed_task(record);
    if !record.status.is_terminal() {
        // Every waiting input request (2026-07-28 tasks §1.5), answered by `tasks/update`.
        let live = state.live.lock().get(&record.task_id).cloned();
        if let Some(requests) = live.and_then(|l| l.input.input_requests()) {
            task["status"] = json!("input_required");
            task["inputRequests"] = requests;
        }
    }
    match (record.status, state.outcome(&record.task_id)) {
        (TaskStatus::Completed, Some(Outcome::Result(r))) => {
            // The result's own bytes, not read again (see `Outcome::Result`).
            let task = with_member(&task, "result", &r);
            return McpReply::local_json(jsonrpc::result_response(id, &task));
        }
        (TaskStatus::Failed, Some(Outcome::Error(e))) => task["error"] = (*e).clone(),
        (TaskStatus::Completed, _) => {
            let task_id = record.task_id.clone();
            return error(era, id, McpError::ResultNotKept { task_id });
        }
        (TaskStatus::Failed, _) => {
            let message = record
                .status_message
                .as_deref()
                .unwrap_or("the call failed");
            task["error"] = json!({"code": jsonrpc::INTERNAL_ERROR, "message": message});
        }
        _ => {}
    }
    json_reply(id, &task)
}

/// `tasks/result` (2025-11-25): blocks until the task is terminal, then its outcome.
async fn result(state: &Arc<GatewayTasksState>, mut record: Arc<TaskRecord>, id: &Id) -> McpReply {
    let owner = record.owner.clone();
    let mut first = true;
    while !record.status.is_terminal() {
        let live = state.live.lock().get(&record.task_id).cloned();
        match live {
            Some(live) => {
                let mut terminal = live.terminal.subscribe();
                let _ = terminal.wait_for(|t| *t).await;
            }
            // The record read above may predate the held call's end (no longer live here):
            // read it again at once before polling.
            None if first => {}
            None => tokio::time::sleep(RESULT_POLL).await,
        }
        first = false;
        match state
            .registry
            .lookup_checked(&record.upstream, &record.task_id, &owner)
            .await
        {
            Ok(Some(r)) => record = r,
            Ok(None) => {
                let task_id = record.task_id.clone();
                return legacy_error(id, McpError::TaskNotFound { task_id });
            }
            Err(_) => return legacy_error(id, McpError::StoreUnavailable { method: None }),
        }
    }
    match (record.status, state.outcome(&record.task_id)) {
        (TaskStatus::Completed, Some(Outcome::Result(r))) => {
            McpReply::local_json(jsonrpc::result_response(id, &r))
        }
        (TaskStatus::Completed, _) => match record.terminal_result.as_deref() {
            Some(stored) => McpReply::local_json(jsonrpc::result_response(id, stored)),
            None => {
                let task_id = record.task_id.clone();
                legacy_error(id, McpError::ResultNotKept { task_id })
            }
        },
        (TaskStatus::Failed, Some(Outcome::Error(e))) => {
            let answer = json!({"jsonrpc": "2.0", "id": id_value(id), "error": (*e).clone()});
            McpReply::local_json(answer.to_string().into())
        }
        // Not in memory (a restart, or forgotten): the error the record keeps, exactly.
        (TaskStatus::Failed, _) if stored_error(&record).is_some() => {
            let error = stored_error(&record).unwrap_or_default();
            let answer = json!({"jsonrpc": "2.0", "id": id_value(id), "error": error});
            McpReply::local_json(answer.to_string().into())
        }
        (status, _) => {
            let error = McpError::NoResult {
                task_id: record.task_id.clone(),
                status,
                status_message: record.status_message.clone(),
            };
            legacy_error(id, error)
        }
    }
}

/// The JSON-RPC `error` object a failed 2025 gateway task's record keeps.
fn stored_error(record: &TaskRecord) -> Option<Value> {
    serde_json::from_str::<Value>(record.terminal_error.as_deref()?)
        .ok()
        .filter(Value::is_object)
}

/// `tasks/cancel` (reaches here once per task: `cancel` single-flights it and answers a
/// terminal task itself): `cancelled` recorded durably, then the held call told, then the
/// answer (2025: the `Task`; 2026: the ack).
async fn cancel(state: &GatewayTasksState, record: &TaskRecord, id: &Id, era: Era) -> McpReply {
    let now = format_rfc3339_ms(now_ms());
    let report = json!({"status": "cancelled", "lastUpdatedAt": now,
        "statusMessage": "cancelled by the client (tasks/cancel)"});
    let observed = state
        .registry
        .observe_task_as(&record.upstream, &record.task_id, report, "tasks/cancel")
        .await;
    match observed {
        Observed::Recorded(TaskStatus::Cancelled) => {
            let live = state.live.lock().get(&record.task_id).cloned();
            match (live, state.registry.leases()) {
                (Some(live), _) => super::stop_held(state, &live).await,
                // A tier: another replica may hold the call. It is asked through its lease,
                // sends the notification, and records "released" once its call has ended (so
                // this replica, which holds nothing, does not).
                (None, Some(keeper)) => {
                    match keeper.ask_cancel(&record.upstream, &record.task_id).await {
                        Ok(true) => state
                            .registry
                            .releases()
                            .forget(&record.upstream, &record.task_id),
                        Ok(false) => {}
                        Err(e) => tracing::warn!(
                            upstream = %record.upstream,
                            task_id = %record.task_id,
                            error = %e,
                            "the replica holding a cancelled gateway task's call could not be asked to cancel it; it runs to its end or its ttl"
                        ),
                    }
                }
                (None, None) => {}
            }
            if era == Era::Modern {
                return json_reply(id, &serde_json::from_str(MODERN_ACK).unwrap_or_default());
            }
            let mut task = record.to_task();
            task.status = TaskStatus::Cancelled;
            task.last_updated_at = now;
            task.status_message = Some("cancelled by the client (tasks/cancel)".into());
            json_reply(id, &serde_json::to_value(task).unwrap_or_default())
        }
        Observed::Unknown => {
            let task_id = record.task_id.clone();
            McpReply::error(era, Some(id), &McpError::TaskNotFound { task_id })
        }
        Observed::Rewrite { status, .. } | Observed::Recorded(status) => {
            if era == Era::Modern {
                return json_reply(id, &serde_json::from_str(MODERN_ACK).unwrap_or_default());
            }
            let task_id = record.task_id.clone();
            legacy_error(id, McpError::TaskAlreadyTerminal { task_id, status })
        }
    }
}

/// The 2025-11-25 `Task` of a record.
fn task_value(record: &TaskRecord) -> Value {
    serde_json::to_value(record.to_task()).unwrap_or_default()
}

/// The `CreateTaskResult` for `task` (a 2025 `Task` object as `held` made it): nested under
/// `task` (2025-11-25), or flat with `resultType:"task"` and `ttlMs`/`pollIntervalMs`
/// (2026-07-28).
pub(super) fn create_result(task: &Value, era: Era) -> Value {
    match era {
        Era::Legacy => json!({ "task": task }),
        Era::Modern => {
            let mut flat = modern_fields(task);
            flat["resultType"] = json!("task");
            flat
        }
    }
}

/// The 2026-07-28 `DetailedTask` of a record, without its `result` / `error` (the caller adds
/// the one its status needs), `resultType:"complete"` (a `tasks/get` answer).
pub(super) fn detailed_task(record: &TaskRecord) -> Value {
    let mut task = modern_fields(&task_value(&TaskRecord {
        tool_error: false,
        ..record.clone()
    }));
    task["status"] = json!(record.status.as_str());
    task["resultType"] = json!("complete");
    task
}

/// A 2025 `Task` object's members under their 2026 names (`ttl` → `ttlMs`, `pollInterval` →
/// `pollIntervalMs`).
fn modern_fields(task: &Value) -> Value {
    let mut out = task.clone();
    if let Some(o) = out.as_object_mut() {
        if let Some(ttl) = o.remove("ttl") {
            o.insert("ttlMs".into(), ttl);
        }
        if let Some(p) = o.remove("pollInterval") {
            o.insert("pollIntervalMs".into(), p);
        }
    }
    out
}

/// A JSON-RPC id as a JSON value (its type kept).
pub(super) fn id_value(id: &Id) -> Value {
    serde_json::from_str(id.as_json()).unwrap_or(Value::Null)
}

/// `object`'s JSON text with one more member `name`: `raw` (JSON text, not parsed again).
pub(super) fn with_member(object: &Value, name: &str, raw: &str) -> String {
    let mut text = object.to_string();
    if text.ends_with('}') {
        text.pop();
        if text.len() > 1 {
            text.push(',');
        }
        text.push_str(&format!("{}:{raw}}}", Value::from(name)));
    }
    text
}

/// The `CallToolResult` `result` (JSON object text) with the related-task `_meta` naming
/// `task_id` (2025-11-25 `tasks/result`), every other byte as it came. `None` when `result` is
/// not an object, or its `_meta` is not one that can be read.
pub(super) fn with_related_task_raw(result: &str, task_id: &str) -> Option<String> {
    let bytes = result.as_bytes();
    let related = json!({ "taskId": task_id }).to_string();
    let key = Value::from(crate::mcp::task::RELATED_TASK_META).to_string();
    let with = match splice::raw_at(bytes, &["_meta"]).ok()? {
        None => {
            let inner = result.trim().strip_prefix('{')?.strip_suffix('}')?;
            let sep = if inner.trim().is_empty() { "" } else { "," };
            Bytes::from(format!("{{\"_meta\":{{{key}:{related}}}{sep}{inner}}}"))
        }
        Some(meta) if meta.get().starts_with('{') => {
            let has_key = splice::raw_at(
                meta.get().as_bytes(),
                &[crate::mcp::task::RELATED_TASK_META],
            )
            .ok()?
            .is_some();
            if has_key {
                // The server's own related-task entry is replaced: read `_meta` whole (it is
                // metadata, shallow), set the key, put it back in its place.
                let mut object: serde_json::Map<String, Value> =
                    serde_json::from_str(meta.get()).ok()?;
                object.insert(
                    crate::mcp::task::RELATED_TASK_META.into(),
                    json!({ "taskId": task_id }),
                );
                let range = splice::span_of_str(bytes, meta.get())?;
                splice::splice(bytes, range, Value::Object(object).to_string().as_bytes())
            } else {
                splice::insert_first(bytes, meta.get(), &format!("{key}:{related}"))?
            }
        }
        Some(_) => return None,
    };
    String::from_utf8(with.to_vec()).ok()
}
