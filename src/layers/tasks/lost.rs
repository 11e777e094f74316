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
//!   `taskId`; not to `tasks/cancel`, where it also means "already terminal"), under 2026-07-28
//!   `-32602` to `tasks/get` / `tasks/cancel` (a terminal task's cancel is acknowledged there),
//!   and `-32001` "Session not found" from the task's own upstream session (2025-11-25: SDK task
//!   stores are per session). The record is then failed the way a dead child's tasks are
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
        Some(Probe {
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
            | (INVALID_PARAMS, Era::Modern, TaskMethod::Get | TaskMethod::Cancel) => {
                Some(format!(
                    "upstream `{up}` no longer has this task (it answered `{method}` with -32602, task not found); the task's state was lost (a restart of the upstream?)"
                ))
            }
            _ => None,
        }
    }

    /// The reply the client gets: `reply` itself, or (the upstream lost the task) the answer
    /// from the record taskgate just failed.
    pub(super) async fn check(self, registry: &Arc<Registry>, reply: McpReply) -> McpReply {
        let ReplyBody::Json(bytes) = &reply.body else {
            return reply;
        };
        let Some(code) = error_code(bytes) else {
            return reply;
        };
        let Some(why) = self.lost_because(code) else {
            return reply;
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
