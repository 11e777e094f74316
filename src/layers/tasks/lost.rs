//! Tasks taskgate ended itself, and upstreams that lost a task (break-tasks M7, M2).
//!
//! - **Ended here**: a client's task whose record is `failed` with the JSON-RPC error taskgate
//!   failed it with (`TaskRecord::terminal_error`: its stdio child died, its upstream lost it,
//!   its input request was lost) is answered from the record: `tasks/get` with the failed task,
//!   `tasks/result` with that error, in the request's era. Nothing goes to the process or
//!   session that lost the task (a dead child's session answered HTTP 404 `-32001`, which tells
//!   a client its own, valid session is gone).
//! - **Lost upstream** ([`Probe`]): the upstream's answer to a `tasks/get|result` about a
//!   task recorded live is read for an authoritative "not found" about that very task:
//!   - `-32602` (the spec's answer for a nonexistent `taskId`, in both eras) only once
//!     taskgate's own clean `tasks/get` of the task is answered `-32602` too
//!     (`layers::lost_task`: the client's own params may have caused it, and a 2025-11-25
//!     `tasks/result` returns the tool's own error, review 18a #1, #2); otherwise the
//!     client's answer passes as it came. A `tasks/cancel` answered `-32602` is confirmed the
//!     same way inside the `cancel` layer's flight, once for all the callers sharing it.
//!   - HTTP 404 with a JSON-RPC error saying the session is gone (`-32001` from the TypeScript
//!     SDK, `-32600` "Session not found" from the Python SDK; not another code, a proxy's) from
//!     the task's own upstream session (2025-11-25: SDK task stores are per session), taken at
//!     once.
//!
//!   The record is then failed the way a dead child's tasks are
//!   (`Registry::fail_task_lost_upstream`: `failed`, "resources released" with
//!   `reason="upstream_lost"`, the owner's slot given back) and the client is answered from it
//!   as above (a `tasks/cancel` answered `-32001` gets 2025-11-25 `-32602` "already terminal").
//!   Anything else (a 5xx, a timeout, another code) changes nothing. The answer is read
//!   whether it came as a JSON body or as an event of an SSE stream (the TypeScript and Python
//!   SDK servers answer every POST with SSE by default, errors included: review 17 #2); only
//!   error answers are read: a byte search rules out the others, so the common poll pays for
//!   one short search and nothing else, and an SSE answer one per event.
//! - **Forgotten after its end** ([`Probe`] of a terminal task): a `tasks/get` of a client's
//!   task recorded terminal in the request's era still goes upstream (its answer may carry
//!   what the record does not keep, and a contradicting one is shown as recorded by
//!   `observe`), but an upstream that no longer knows the task (`-32602`, or HTTP 404
//!   "session not found" from the task's own 2025-11-25 session: a restart) does not make it
//!   unknown to the client: a terminal status is final and durable in the registry, so the
//!   client is answered from the record (2025-11-25: the recorded `Task`; 2026-07-28: the
//!   cancelled `DetailedTask`, the only terminal one the record can make without the payload
//!   `tasks.max_stored_result_bytes` may not have kept). Nothing is confirmed and nothing is
//!   written (the record is final; a `-32602` the client's own params caused gets the same
//!   true answer). Cost: none on a live task's poll; on a terminal task's forwarded
//!   `tasks/get`, the probe (one `Arc` and one id clone) and the error search above; the
//!   answer is built from the record the request was authorised with, no store read.

use crate::exchange::{McpReply, McpRequest, Operation, ReplyBody};
use crate::jsonrpc::{self, Id};
use crate::layers::extensions::AuthorisedTask;
use crate::layers::lost_task::{self, error_code, Confirm, Confirmations, INVALID_PARAMS};
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::modern;
use crate::mcp::task::TaskStatus;
use crate::metrics::{LocalReason, TaskMethod};
use crate::registry::Registry;
use crate::sse::{ByteString, Event};
use crate::store::{Origin, TaskRecord};
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;
use std::sync::Arc;

/// Whether `record` is a client's task that taskgate itself ended (`failed`, with the error it
/// failed it with kept).
pub(super) fn ended_here(record: &TaskRecord) -> bool {
    record.origin == Origin::Client
        && record.status == TaskStatus::Failed
        && record.terminal_error.is_some()
}

/// The answer to `method` about a task taskgate ended itself ([`ended_here`]), from its record,
/// in the request's `era`; `None` when the record is not such a task. `tasks/get` → the failed
/// task; `tasks/result` → the error it was failed with; `tasks/cancel` → 2025-11-25 `-32602`
/// "already terminal", 2026-07-28 the ack.
pub(super) fn answer(
    record: &TaskRecord,
    method: TaskMethod,
    era: Era,
    id: &Id,
) -> Option<McpReply> {
    if !ended_here(record) {
        return None;
    }
    let error: Value = serde_json::from_str(record.terminal_error.as_deref()?)
        .ok()
        .filter(Value::is_object)?;
    let reply = match (method, era) {
        (TaskMethod::Get, Era::Legacy) => {
            let task = serde_json::to_string(&record.to_task()).ok()?;
            McpReply::local_json(jsonrpc::result_response(id, &task))
        }
        (TaskMethod::Get, Era::Modern) => {
            let task = serde_json::to_value(record.to_task()).ok()?;
            let detailed = modern::detailed_task(&task, Some(&modern::Outcome::Error(error)), "")?;
            McpReply::local_json(jsonrpc::result_response(id, &detailed.to_string()))
        }
        (TaskMethod::Result, _) => {
            let answer = serde_json::json!({"jsonrpc": "2.0", "id": id_value(id), "error": error});
            McpReply::local_json(answer.to_string().into())
        }
        (TaskMethod::Cancel, Era::Modern) => {
            McpReply::local_json(jsonrpc::result_response(id, modern::MODERN_ACK))
        }
        (TaskMethod::Cancel, Era::Legacy) => McpReply::error(
            Era::Legacy,
            Some(id),
            &McpError::TaskAlreadyTerminal {
                task_id: record.task_id.clone(),
                status: TaskStatus::Failed,
            },
        ),
    };
    Some(reply.answered_locally(LocalReason::StoredResult))
}

/// `id` as a JSON value.
fn id_value(id: &Id) -> Value {
    serde_json::from_str(id.as_json()).unwrap_or(Value::Null)
}

/// A `tasks/get|result|cancel` about a task recorded live, or a `tasks/get` of one recorded
/// terminal, whose upstream answer is read for "the upstream lost the task" (see the module
/// docs).
pub(super) struct Probe {
    record: Arc<TaskRecord>,
    method: TaskMethod,
    era: Era,
    id: Id,
    /// The request went out on the task's own upstream session.
    on_task_session: bool,
    /// What a `-32602` answer needs before it counts (`None`: a `tasks/cancel`, whose
    /// `-32602` the `cancel` layer confirms inside its flight, or a terminal task's).
    confirm: Option<Confirm>,
    /// The task is recorded terminal: an answer saying the upstream lost it is replaced by the
    /// record's ([`terminal_answer`]), which is not failed.
    terminal: bool,
}

impl Probe {
    /// The probe for `req` (authorised: its [`AuthorisedTask`]), or `None` when there is nothing
    /// to read its answer for: a gateway task, a request bridged to the other era (the bridge
    /// answers for the task there), or a terminal task's request other than a `tasks/get` (a
    /// `tasks/cancel` of it is answered by `cancel`; a `tasks/result` may carry the tool's own
    /// `-32602`) or a `tasks/get` the record cannot answer ([`terminal_answer`]).
    pub(super) fn of(req: &McpRequest) -> Option<Probe> {
        let record = &req.extensions.get::<AuthorisedTask>()?.record;
        let method = TaskMethod::parse(req.request_method()?)?;
        let era = req.era();
        if record.origin != Origin::Client || record.era != era {
            return None;
        }
        let terminal = record.status.is_terminal();
        if terminal && (method != TaskMethod::Get || !answerable_when_lost(record, era)) {
            return None;
        }
        let record = record.clone();
        let on_task_session = match (&record.upstream_session, &req.ctx.session_id) {
            (Some(task), Some(sent)) => sent.as_bytes() == task.as_bytes(),
            _ => false,
        };
        if !matches!(req.op, Operation::Post(_)) {
            return None;
        }
        let confirm = match method {
            TaskMethod::Cancel => None,
            _ => Confirm::of(req),
        };
        Some(Probe {
            id: req.id()?.clone(),
            record,
            method,
            era,
            on_task_session,
            confirm,
            terminal,
        })
    }

    /// The reply the client gets: `reply` itself, or (the upstream lost the task) the answer
    /// from the record taskgate just failed. An SSE reply is read event by event as it passes:
    /// the event answering the request is replaced the same way. `inner` (the service below
    /// `tasks`) carries the confirming `tasks/get`, shared through `confirming`.
    /// Whether [`Probe::check`] may change `reply`: an SSE answer, or a JSON one that may be
    /// an error ([`lost_task::may_be_error`]). Asked first so that the common poll's answer
    /// (JSON, no error) is not moved into `check`'s future: building it for every forwarded
    /// poll of a terminal task cost the 2025 lifecycle ~320 instructions per request in
    /// copies (callgrind, benches/profile.sh lifecycle).
    pub(super) fn may_change(reply: &McpReply) -> bool {
        match &reply.body {
            ReplyBody::Json(bytes) => lost_task::may_be_error(bytes),
            ReplyBody::Stream(_) => true,
            _ => false,
        }
    }

    pub(super) async fn check<S>(
        self,
        registry: &Arc<Registry>,
        mut reply: McpReply,
        inner: S,
        confirming: &Arc<Confirmations>,
    ) -> McpReply
    where
        S: tower::Service<McpRequest, Response = McpReply> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
    {
        match reply.body {
            ReplyBody::Json(ref bytes) => {
                let Some(code) = error_code(bytes) else {
                    return reply;
                };
                // The spec's signal that a session is gone is the HTTP 404; the code of its
                // JSON-RPC error is not specified: the TypeScript SDK answers `-32001`, the
                // Python SDK (`mcp` 1.x) `-32600` "Session not found" under the id
                // "server-error" (`lost_task::says_session_not_found`). A 404 whose body is not
                // a JSON-RPC error (a wrong path), or whose error says something else (a
                // proxy's), is not taken for it.
                let said = if lost_task::says_session_gone(reply.status, bytes) {
                    Said::SessionGone
                } else {
                    Said::Error(code)
                };
                match self.instead(registry, said, inner, confirming).await {
                    Some(answer) => answer,
                    None => reply,
                }
            }
            ReplyBody::Stream(events) => {
                let (registry, confirming) = (registry.clone(), confirming.clone());
                let mut probe = Some((self, inner));
                let events = events.then(move |event| {
                    // Until the answer passed: an error answering the request, with its code.
                    let found = probe.as_ref().and_then(|(p, _)| p.error_answer(&event));
                    let work = found.and_then(|code| {
                        let (probe, inner) = probe.take()?;
                        Some((probe, inner, code, registry.clone(), confirming.clone()))
                    });
                    async move {
                        let Some((probe, inner, code, registry, confirming)) = work else {
                            return event;
                        };
                        let said = Said::Error(code);
                        let instead = probe.instead(&registry, said, inner, &confirming).await;
                        match instead.map(|r| r.body) {
                            Some(ReplyBody::Json(bytes)) => with_data(event, bytes),
                            _ => event,
                        }
                    }
                });
                reply.body = ReplyBody::Stream(Box::pin(events));
                reply
            }
            _ => reply,
        }
    }

    /// The code of `event` when it is a JSON-RPC error answering the request.
    fn error_answer(&self, event: &Event) -> Option<i64> {
        let data = event.data.as_ref()?.as_bytes();
        let code = error_code(data)?;
        jsonrpc::is_answer_to(data, &self.id).then_some(code)
    }

    /// What the client gets instead of the upstream's error answer, which `said`, when that
    /// answer says the upstream lost the task: the record is failed, then answered from
    /// (`None`: the answer passes as it came, the record failed or not).
    async fn instead<S>(
        self,
        registry: &Arc<Registry>,
        said: Said,
        inner: S,
        confirming: &Arc<Confirmations>,
    ) -> Option<McpReply>
    where
        S: tower::Service<McpRequest, Response = McpReply> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
    {
        let (upstream, task_id) = (&self.record.upstream, &self.record.task_id);
        let method = self.method.as_str();
        let session_lost =
            said == Said::SessionGone && self.era == Era::Legacy && self.on_task_session;
        if self.terminal {
            // Final and durable here: the upstream forgetting it changes nothing (module docs).
            if said != Said::Error(INVALID_PARAMS) && !session_lost {
                return None;
            }
            tracing::debug!(upstream = %upstream, task_id = %task_id, ?said, "the upstream no longer knows a task recorded terminal: answered from its record");
            return terminal_answer(&self.record, self.era, &self.id);
        }
        match said {
            _ if session_lost => {
                let why = format!(
                    "upstream `{upstream}` no longer has the session this task was created on (it answered `{method}` with HTTP 404 \"Session not found\"); the task's state was lost (a restart of the upstream?)"
                );
                lost_task::fail_lost(registry, upstream, task_id, method, &why).await;
            }
            Said::Error(INVALID_PARAMS) => {
                // Not taken on the client's word: its own params, or the tool's own error under
                // `tasks/result`, may have caused it (review 18a #1, #2).
                let confirm = self.confirm?;
                let lost = confirming
                    .confirm(confirm, registry.clone(), inner, method)
                    .await;
                if !lost {
                    return None;
                }
            }
            _ => return None,
        }
        match registry.record_cached(upstream, task_id).await {
            Ok(Some(record)) => answer(&record, self.method, self.era, &self.id),
            _ => None,
        }
    }
}

/// What an upstream's error answer about a task says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Said {
    /// HTTP 404 with a JSON-RPC error that says the session is not found
    /// ([`lost_task::says_session_not_found`]): the 2025-11-25 transport's signal that the
    /// session is gone. Never an SSE event's nor another status's error.
    SessionGone,
    /// A JSON-RPC error with this code.
    Error(i64),
}

/// Whether [`terminal_answer`] can answer a `tasks/get` of `record` (terminal) in `era`:
/// 2025-11-25 always (a `Task` needs no payload); 2026-07-28 only a `cancelled` one (a
/// `completed` or `failed` `DetailedTask` carries its `result` or `error`).
fn answerable_when_lost(record: &TaskRecord, era: Era) -> bool {
    era == Era::Legacy || record.status == TaskStatus::Cancelled
}

/// The answer to a `tasks/get` (`id`) of a task recorded terminal that its upstream no longer
/// knows, from its record, in `era` (see the module docs); `None` when the record cannot make
/// one ([`answerable_when_lost`]): the upstream's answer then passes.
fn terminal_answer(record: &TaskRecord, era: Era, id: &Id) -> Option<McpReply> {
    if !record.status.is_terminal() || !answerable_when_lost(record, era) {
        return None;
    }
    let result = match era {
        Era::Legacy => serde_json::to_string(&record.to_task()).ok()?,
        Era::Modern => {
            let task = serde_json::to_value(record.to_task()).ok()?;
            modern::detailed_task(&task, None, "")?.to_string()
        }
    };
    Some(
        McpReply::local_json(jsonrpc::result_response(id, &result))
            .answered_locally(LocalReason::StoredResult),
    )
}

/// `event` carrying `data` instead of its own.
fn with_data(mut event: Event, data: Bytes) -> Event {
    event.data = Some(
        ByteString::try_from(data.clone())
            .unwrap_or_else(|_| String::from_utf8_lossy(&data).into_owned().into()),
    );
    event
}
