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
//!   `taskId`), and to `tasks/cancel` once confirmed (there it also means "already terminal"):
//!   one `tasks/get` of taskgate's own is answered `-32602` too (a `Task` it answers instead is
//!   applied by `observe`, so a task that ended unobserved is recorded terminal); under
//!   2026-07-28 `-32602` to `tasks/get` / `tasks/cancel` (a terminal task's cancel is
//!   acknowledged there); and `-32001` "Session not found" from the task's own upstream session
//!   (2025-11-25: SDK task stores are per session). The record is then failed the way a dead child's tasks are
//!   (`Registry::fail_task_lost_upstream`: `failed`, "resources released" with
//!   `reason="upstream_lost"`, the owner's slot given back) and the client is answered from it
//!   as above (a `tasks/cancel` answered `-32602` by the upstream gets that answer as it came;
//!   one answered `-32001` gets 2025-11-25 `-32602` "already terminal").
//!   Anything else (a 5xx, a timeout, another code) changes nothing. Only replies that are
//!   JSON-RPC errors are read: a byte search rules out the others, so the common poll pays for
//!   one short search and nothing else.

use crate::exchange::{McpReply, McpRequest, ReplyBody};
use crate::jsonrpc::{self, Id};
use crate::layers::extensions::AuthorisedTask;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::task::TaskStatus;
use crate::metrics::{LocalReason, TaskMethod};
use crate::registry::Registry;
use crate::store::{Origin, TaskRecord};
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
            let outcome = crate::layers::bridge::reverse::translate::Outcome::Error(error);
            let detailed = crate::layers::bridge::reverse::translate::detailed_task(
                &task,
                Some(&outcome),
                "",
            )?;
            McpReply::local_json(jsonrpc::result_response(id, &detailed.to_string()))
        }
        (TaskMethod::Result, _) => {
            let answer = serde_json::json!({"jsonrpc": "2.0", "id": id_value(id), "error": error});
            McpReply::local_json(answer.to_string().into())
        }
        (TaskMethod::Cancel, Era::Modern) => McpReply::local_json(jsonrpc::result_response(
            id,
            crate::layers::cancel::MODERN_ACK,
        )),
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
    /// A 2025-11-25 `tasks/cancel`: its context, for the `tasks/get` that tells "not found"
    /// from "already terminal" when the upstream answers `-32602` (cloned for cancels only).
    confirm: Option<crate::exchange::RequestContext>,
    /// The request as the client sent it (shared bytes): a `-32602` counts only when it asked
    /// about nothing but the task ([`asked_only_about_the_task`]).
    request: bytes::Bytes,
}

/// The ids of taskgate's own `tasks/get` after a 2025-11-25 cancel answered `-32602`.
static CONFIRM_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

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
        let confirm = (era == Era::Legacy && method == TaskMethod::Cancel).then(|| req.ctx.clone());
        let request = match &req.op {
            crate::exchange::Operation::Post(msg) => msg.bytes().clone(),
            _ => return None,
        };
        Some(Probe {
            request,
            id: req.id()?.clone(),
            record,
            method,
            era,
            on_task_session,
            confirm,
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
    /// from the record taskgate just failed.
    /// `inner`: the service the request went to (a 2025-11-25 cancel's `-32602` is confirmed
    /// through it).
    pub(super) async fn check<S>(
        mut self,
        registry: &Arc<Registry>,
        inner: &mut S,
        reply: McpReply,
    ) -> McpReply
    where
        S: tower::Service<McpRequest, Response = McpReply>,
    {
        let ReplyBody::Json(bytes) = &reply.body else {
            return reply;
        };
        let Some(code) = error_code(bytes) else {
            return reply;
        };
        let why = match self.lost_because(code) {
            Some(why) => why,
            None => match self.confirm.take() {
                Some(ctx) if code == INVALID_PARAMS => {
                    // Concurrent cancels share one answer: once one of them confirmed, the
                    // record says so and nobody asks again.
                    let (up, id) = (&self.record.upstream, &self.record.task_id);
                    if let Ok(Some(now)) = registry.record_cached(up, id).await {
                        if now.status.is_terminal() {
                            return reply;
                        }
                    }
                    match self.confirm_lost(inner, ctx).await {
                        Some(why) => why,
                        None => return reply,
                    }
                }
                _ => return reply,
            },
        };
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
            return reply;
        }
        match registry.record_cached(upstream, task_id).await {
            Ok(Some(record)) => answer(&record, self.method, self.era, &self.id).unwrap_or(reply),
            _ => reply,
        }
    }
}

impl Probe {
    /// After a 2025-11-25 `tasks/cancel` answered `-32602` (the task is unknown, or already
    /// terminal: the spec gives both that code), one `tasks/get` of taskgate's own on the same
    /// upstream session, with the task's [`AuthorisedTask`] (`observe` applies a `Task` it
    /// answers, so a task that ended unobserved is recorded terminal). Why the task is lost when
    /// that answer is `-32602` too; `None` otherwise (any failure included: nothing changes).
    async fn confirm_lost<S>(
        &self,
        inner: &mut S,
        mut ctx: crate::exchange::RequestContext,
    ) -> Option<String>
    where
        S: tower::Service<McpRequest, Response = McpReply>,
    {
        use crate::exchange::{Deadline, Operation, RequestParts};
        use tower::ServiceExt;
        for name in [
            &crate::mcp::routing_headers::MCP_METHOD,
            &crate::mcp::routing_headers::MCP_NAME,
        ] {
            ctx.headers.remove(name);
        }
        let n = CONFIRM_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let params = serde_json::json!({ "taskId": self.record.task_id });
        let text = format!(
            r#"{{"jsonrpc":"2.0","id":"taskgate-lost-check-{n}","method":"tasks/get","params":{params}}}"#
        );
        let msg = jsonrpc::Message::parse(bytes::Bytes::from(text)).ok()?;
        let id = msg.id()?.clone();
        let mut extensions = http::Extensions::new();
        extensions.insert(Era::Legacy);
        // Bounded whole by the upstream's `timeout_ms`, a streamed answer included.
        extensions.insert(Deadline::Exchange);
        extensions.insert(AuthorisedTask {
            record: self.record.clone(),
        });
        let get = McpRequest::from(RequestParts {
            op: Operation::Post(msg),
            ctx,
            extensions,
            trace: None,
        });
        let reply = inner.ready().await.ok()?.call(get).await.ok()?;
        let answer = reply.answer_to(&id).await?;
        (error_code(&answer)? == INVALID_PARAMS).then(|| {
            format!(
                "upstream `{}` no longer has this task (it answered `tasks/cancel` and `tasks/get` with -32602, task not found); the task's state was lost (a restart of the upstream?)",
                self.record.upstream
            )
        })
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
