//! Tasks taskgate ended itself, and upstreams that lost a task (break-tasks M7, M2).
//!
//! - **Ended here**: a client's task whose record is `failed` with the JSON-RPC error taskgate
//!   failed it with (`TaskRecord::terminal_error`: its stdio child died, its upstream lost it,
//!   its input request was lost) is answered from the record: `tasks/get` with the failed task,
//!   `tasks/result` with that error, in the request's era. Nothing goes to the process or
//!   session that lost the task (a dead child's session answered HTTP 404 `-32001`, which tells
//!   a client its own, valid session is gone).
//! - **Lost upstream** ([`Probe`]): the upstream's answer to a `tasks/get|result|cancel` about a
//!   task recorded live is read for an authoritative "not found" about that very task: under
//!   2025-11-25 `-32602` to `tasks/get` / `tasks/result` (the spec's answer for a nonexistent
//!   `taskId`); under 2026-07-28 `-32602` to `tasks/get` / `tasks/cancel` (a terminal task's
//!   cancel is acknowledged there); a `-32602` counts only when the request asked about nothing
//!   but the task ([`asked_only_about_the_task`]); and `-32001` "Session not found" from the
//!   task's own upstream session (2025-11-25: SDK task stores are per session). A 2025-11-25
//!   `tasks/cancel` answered `-32602` (there it also means "already terminal") is confirmed
//!   inside the `cancel` layer's flight, once for all the callers sharing it ([`confirm`]).
//!   The record is then failed the way a dead child's tasks are
//!   (`Registry::fail_task_lost_upstream`: `failed`, "resources released" with
//!   `reason="upstream_lost"`, the owner's slot given back) and the client is answered from it
//!   as above (a `tasks/cancel` answered `-32602` by the upstream gets that answer as it came;
//!   one answered `-32001` gets 2025-11-25 `-32602` "already terminal").
//!   Anything else (a 5xx, a timeout, another code) changes nothing. The answer is read
//!   whether it came as a JSON body or as an event of an SSE stream (the TypeScript and Python
//!   SDK servers answer every POST with SSE by default, errors included: review 17 #2); only
//!   error answers are read: a byte search rules out the others, so the common poll pays for
//!   one short search and nothing else, and an SSE answer one per event.

use crate::exchange::{McpReply, McpRequest, Operation, ReplyBody, RequestContext};
use crate::jsonrpc::{self, Id};
use crate::layers::extensions::AuthorisedTask;
use crate::layers::own_request;
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
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;

/// JSON-RPC `-32602` Invalid params: the spec's answer for a nonexistent `taskId`.
const INVALID_PARAMS: i64 = -32602;

/// Replies longer than this are not read for an error (a JSON-RPC error about a task is short;
/// a long reply is a payload).
const MAX_ERROR_REPLY: usize = 16 * 1024;

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

/// A `tasks/get|result|cancel` about a task recorded live, whose upstream answer is read for
/// "the upstream lost the task" (see the module docs).
pub(super) struct Probe {
    record: Arc<TaskRecord>,
    method: TaskMethod,
    era: Era,
    id: Id,
    /// The request went out on the task's own upstream session.
    on_task_session: bool,
    /// The request as the client sent it (shared bytes): a `-32602` counts only when it asked
    /// about nothing but the task ([`asked_only_about_the_task`]).
    request: bytes::Bytes,
}

impl Probe {
    /// The probe for `req` (authorised: its [`AuthorisedTask`]), or `None` when there is nothing
    /// to read its answer for: the task is terminal, a gateway task, or the request is bridged
    /// to the other era (the bridge answers for the task there).
    pub(super) fn of(req: &McpRequest) -> Option<Probe> {
        let record = req.extensions.get::<AuthorisedTask>()?.record.clone();
        let method = TaskMethod::parse(req.request_method()?)?;
        let era = req.era();
        if record.status.is_terminal() || record.origin != Origin::Client || record.era != era {
            return None;
        }
        let on_task_session = match (&record.upstream_session, &req.ctx.session_id) {
            (Some(task), Some(sent)) => sent.as_bytes() == task.as_bytes(),
            _ => false,
        };
        let request = match &req.op {
            Operation::Post(msg) => msg.bytes().clone(),
            _ => return None,
        };
        Some(Probe {
            request,
            id: req.id()?.clone(),
            record,
            method,
            era,
            on_task_session,
        })
    }

    /// Why the upstream's `code` for this request says it lost the task, if it does.
    fn lost_because(&self, code: i64) -> Option<String> {
        let up = &self.record.upstream;
        let method = self.method.as_str();
        match (code, self.era, self.method) {
            (crate::mcp::errors::SESSION_NOT_FOUND, Era::Legacy, _) if self.on_task_session => {
                Some(format!(
                    "upstream `{up}` no longer has the session this task was created on (it answered `{method}` with -32001 \"Session not found\"); the task's state was lost (a restart of the upstream?)"
                ))
            }
            (INVALID_PARAMS, Era::Legacy, TaskMethod::Get | TaskMethod::Result)
            | (INVALID_PARAMS, Era::Modern, TaskMethod::Get | TaskMethod::Cancel)
                if asked_only_about_the_task(&self.request, self.era) =>
            {
                Some(format!(
                    "upstream `{up}` no longer has this task (it answered `{method}` with -32602, task not found); the task's state was lost (a restart of the upstream?)"
                ))
            }
            _ => None,
        }
    }

    /// The reply the client gets: `reply` itself, or (the upstream lost the task) the answer
    /// from the record taskgate just failed. An SSE reply is read event by event as it passes:
    /// the event answering the request is replaced the same way.
    pub(super) async fn check(self, registry: &Arc<Registry>, mut reply: McpReply) -> McpReply {
        match reply.body {
            ReplyBody::Json(ref bytes) => {
                let Some(code) = error_code(bytes) else {
                    return reply;
                };
                match self.instead(registry, code).await {
                    Some(answer) => answer,
                    None => reply,
                }
            }
            ReplyBody::Stream(events) => {
                let (registry, mut probe) = (registry.clone(), Some(self));
                let events = events.then(move |event| {
                    // Until the answer passed: an error answering the request, with its code.
                    let found = probe.as_ref().and_then(|p| p.error_answer(&event));
                    let work = found.and_then(|code| Some((probe.take()?, code, registry.clone())));
                    async move {
                        let Some((probe, code, registry)) = work else {
                            return event;
                        };
                        match probe.instead(&registry, code).await.map(|r| r.body) {
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

    /// What the client gets instead of the upstream's error answer `code`, when that answer
    /// says the upstream lost the task: the record is failed, then answered from (`None`: the
    /// answer passes as it came, the record failed or not).
    async fn instead(&self, registry: &Arc<Registry>, code: i64) -> Option<McpReply> {
        let why = self.lost_because(code)?;
        let (upstream, task_id) = (&self.record.upstream, &self.record.task_id);
        if registry
            .fail_task_lost_upstream(upstream, task_id, &why)
            .await
        {
            tracing::warn!(upstream = %upstream, task_id = %task_id, code, method = self.method.as_str(), "the upstream lost a task: its record is failed and its slot released");
        }
        // The upstream's own "not found" to a `tasks/cancel` is already the right answer
        // (`-32602`, HTTP 400 under 2026-07-28); a session error never is.
        if self.method == TaskMethod::Cancel && code == INVALID_PARAMS {
            return None;
        }
        match registry.record_cached(upstream, task_id).await {
            Ok(Some(record)) => answer(&record, self.method, self.era, &self.id),
            _ => None,
        }
    }
}

/// `event` carrying `data` instead of its own.
fn with_data(mut event: Event, data: Bytes) -> Event {
    event.data = Some(
        ByteString::try_from(data.clone())
            .unwrap_or_else(|_| String::from_utf8_lossy(&data).into_owned().into()),
    );
    event
}

/// A 2025-11-25 `tasks/cancel` answered `-32602`: the task is unknown, or already terminal (the
/// spec gives both that code). [`confirm`] tells them apart with one `tasks/get` of taskgate's
/// own, sent by the `cancel` layer inside the cancel's flight, so the callers sharing that
/// answer share one confirmation too (review 17 #14: each sent its own).
pub(crate) struct Confirm {
    /// The cancel's context (the task's upstream session, the caller's credentials).
    ctx: RequestContext,
    record: Arc<TaskRecord>,
}

impl Confirm {
    /// The confirmation a 2025-11-25 `tasks/cancel` (`req`, authorised) may need: `None` when
    /// the task is not a client's live 2025-11-25 task (see [`Probe::of`]).
    pub(crate) fn of(req: &McpRequest) -> Option<Confirm> {
        let record = &req.extensions.get::<AuthorisedTask>()?.record;
        let live_here = !record.status.is_terminal()
            && record.origin == Origin::Client
            && record.era == Era::Legacy;
        (req.era() == Era::Legacy && live_here).then(|| Confirm {
            ctx: req.ctx.clone(),
            record: record.clone(),
        })
    }

    /// Reads the flight's error answer `error` (its JSON text): when it is `-32602`, one
    /// `tasks/get` of taskgate's own on the same upstream session, with the task's
    /// [`AuthorisedTask`] (`observe` applies a `Task` it answers, so a task that ended
    /// unobserved is recorded terminal). Answered `-32602` too, the task is lost: its record
    /// is failed as [`Probe`] fails one. Whether it was (any failure: nothing changes).
    pub(crate) async fn run<S>(self, registry: &Arc<Registry>, inner: &mut S, error: &str) -> bool
    where
        S: tower::Service<McpRequest, Response = McpReply>,
    {
        if error_object_code(error) != Some(INVALID_PARAMS) {
            return false;
        }
        let id = own_request::own_id("lost-check");
        let (upstream, task_id) = (&self.record.upstream, &self.record.task_id);
        let mut get = own_request::task_request(&self.ctx, Era::Legacy, "tasks/get", task_id, &id);
        get.extensions.insert(AuthorisedTask {
            record: self.record.clone(),
        });
        let Ok(Some(answer)) = own_request::ask(inner, get).await else {
            return false;
        };
        if error_code(&answer) != Some(INVALID_PARAMS) {
            return false;
        }
        let why = format!(
            "upstream `{upstream}` no longer has this task (it answered `tasks/cancel` and `tasks/get` with -32602, task not found); the task's state was lost (a restart of the upstream?)"
        );
        let failed = registry
            .fail_task_lost_upstream(upstream, task_id, &why)
            .await;
        if failed {
            tracing::warn!(upstream = %upstream, task_id = %task_id, "the upstream lost a task: its record is failed and its slot released");
        }
        failed
    }
}

/// Whether `request` (a `tasks/*` request) carries nothing a server could refuse with
/// `-32602` but its `taskId`: `params` holds only `taskId` (a string) and `_meta`, and under
/// 2026-07-28 that `_meta` has the required `io.modelcontextprotocol/protocolVersion` (a
/// string) and `io.modelcontextprotocol/clientCapabilities` (an object). Otherwise a `-32602`
/// may be about the client's own params (2026-07-28 §2.1: a missing required `_meta` member is
/// `-32602`), and taking it for "task not found" let a client fail its own live task and free
/// its slot while the upstream still ran it (review 17, #1). Read only for an error answer.
fn asked_only_about_the_task(request: &[u8], era: Era) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(request) else {
        return false;
    };
    let Some(params) = v.get("params").and_then(Value::as_object) else {
        return false;
    };
    let known = params.keys().all(|k| k == "taskId" || k == "_meta");
    let meta = params.get("_meta");
    let meta_ok = match era {
        Era::Legacy => meta.is_none_or(Value::is_object),
        Era::Modern => meta.is_some_and(|m| {
            m.get(crate::mcp::era::PROTOCOL_VERSION_META)
                .is_some_and(Value::is_string)
                && m.get("io.modelcontextprotocol/clientCapabilities")
                    .is_some_and(Value::is_object)
        }),
    };
    known && meta_ok && params.get("taskId").is_some_and(Value::is_string)
}

/// The `error.code` of a JSON-RPC error reply; `None` for anything else (read only when a byte
/// search finds an `"error"` member in a short body).
fn error_code(bytes: &[u8]) -> Option<i64> {
    if bytes.len() > MAX_ERROR_REPLY || memchr::memmem::find(bytes, b"\"error\"").is_none() {
        return None;
    }
    #[derive(Deserialize)]
    struct Code {
        code: i64,
    }
    #[derive(Deserialize)]
    struct Envelope {
        error: Option<Code>,
    }
    serde_json::from_slice::<Envelope>(bytes)
        .ok()?
        .error
        .map(|e| e.code)
}

/// The `code` of a JSON-RPC `error` object (its JSON text).
fn error_object_code(error: &str) -> Option<i64> {
    #[derive(Deserialize)]
    struct Code {
        code: i64,
    }
    serde_json::from_str::<Code>(error).ok().map(|c| c.code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_error_replies_have_a_code() {
        assert_eq!(
            error_code(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"x"}}"#),
            Some(-32602)
        );
        assert_eq!(
            error_code(br#"{"jsonrpc":"2.0","id":1,"result":{"type":"error"}}"#),
            None
        );
        assert_eq!(error_code(br#"{"error":{"code":"no"}}"#), None);
        assert_eq!(error_code(b"not json \"error\""), None);
        let mut long = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":""#.to_vec();
        long.extend(std::iter::repeat_n(b'a', MAX_ERROR_REPLY));
        long.extend(br#""}}"#);
        assert_eq!(error_code(&long), None, "bounded");
    }
}
