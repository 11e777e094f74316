//! The errors taskgate answers itself, in one place: the MCP codes beyond JSON-RPC's own, the
//! HTTP status the 2026-07-28 transport gives each code, and the task errors of both eras
//! ([`TaskError`]: each variant's code and message).
//!
//! JSON-RPC 2.0's codes (`-32700`, `-32600`..`-32603`) stay in [`crate::jsonrpc`]: they are the
//! envelope's, used by code that knows no MCP (the envelope parser's own refusals); MCP's build
//! on them.

use crate::jsonrpc::{self, Id};
use crate::mcp::capabilities::TASKS_EXTENSION;
use crate::mcp::task::TaskStatus;
use bytes::Bytes;
use http::StatusCode;

/// `-32020` HeaderMismatch: a standard header disagrees with the body, or is missing (HTTP 400).
pub const HEADER_MISMATCH: i64 = -32020;
/// `-32021` MissingRequiredClientCapability: the request did not declare a capability the
/// server needs; `data.requiredCapabilities` names it (HTTP 400).
pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
/// `-32022` UnsupportedProtocolVersion (HTTP 400).
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
/// `-32029`, taskgate's own: an owner is over `tasks.max_live_tasks_per_owner`, or a caller over
/// a `[limits]` bound (implementation-defined server error range, -32000 to -32099).
pub const TASK_LIMIT_EXCEEDED: i64 = -32029;

/// The HTTP status the 2026-07-28 transport prescribes for a JSON-RPC error taskgate answers
/// itself: 400 for `-32020`, `-32021`, `-32022`, `-32602` and `-32600`, 404 for `-32601`, 200
/// otherwise.
pub fn modern_error_status(code: i64) -> StatusCode {
    match code {
        HEADER_MISMATCH
        | MISSING_REQUIRED_CLIENT_CAPABILITY
        | UNSUPPORTED_PROTOCOL_VERSION
        | jsonrpc::INVALID_PARAMS
        | jsonrpc::INVALID_REQUEST => StatusCode::BAD_REQUEST,
        jsonrpc::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    }
}

/// The `-32021` error naming the tasks extension, under `id`:
/// `{"code":-32021,"message":"Missing required client capability","data":{"requiredCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}`.
pub fn missing_tasks_extension(id: Option<&Id>) -> Bytes {
    let data = serde_json::json!({
        "requiredCapabilities": { "extensions": { TASKS_EXTENSION: {} } }
    });
    jsonrpc::error_response_with_data(
        id,
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        "Missing required client capability",
        &data,
    )
}

/// A `tasks/*` request taskgate refuses about one task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TaskError<'a> {
    /// No task `task_id` the caller may see (unknown, expired, or another owner's: the same
    /// answer, so a caller cannot learn whether another's task exists).
    NotFound {
        /// The `taskId` as the request named it.
        task_id: &'a str,
    },
    /// A 2025-11-25 `tasks/cancel` of a task already in a terminal status (2026-07-28 acks it).
    AlreadyTerminal {
        /// The `taskId` as the request named it.
        task_id: &'a str,
        /// The task's terminal status.
        status: TaskStatus,
    },
}

impl TaskError<'_> {
    /// The JSON-RPC code: `-32602` for both (2025-11-25 tasks: "invalid or nonexistent taskId",
    /// "cannot cancel a task in a terminal status").
    pub fn code(&self) -> i64 {
        match self {
            TaskError::NotFound { .. } | TaskError::AlreadyTerminal { .. } => {
                jsonrpc::INVALID_PARAMS
            }
        }
    }

    /// The error's message.
    pub fn message(&self) -> String {
        match self {
            TaskError::NotFound { task_id } => format!("Task not found: {task_id}"),
            TaskError::AlreadyTerminal { task_id, status } => {
                format!("Cannot cancel task {task_id}: it is already {status} (a terminal status)")
            }
        }
    }

    /// The JSON-RPC error response under `id`.
    pub fn response(&self, id: Option<&Id>) -> Bytes {
        jsonrpc::error_response(id, self.code(), &self.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_tasks_extension_is_named_in_minus_32021() {
        let e: Value = serde_json::from_slice(&missing_tasks_extension(None)).unwrap();
        assert_eq!(e["error"]["code"], -32021);
        assert!(
            e["error"]["data"]["requiredCapabilities"]["extensions"][TASKS_EXTENSION].is_object()
        );
    }

    #[test]
    fn task_errors_say_which_task() {
        let e = TaskError::NotFound { task_id: "t1" };
        assert_eq!(
            (e.code(), e.message().as_str()),
            (-32602, "Task not found: t1")
        );
        let e = TaskError::AlreadyTerminal {
            task_id: "t1",
            status: TaskStatus::Completed,
        };
        assert_eq!(
            e.message(),
            "Cannot cancel task t1: it is already completed (a terminal status)"
        );
        assert_eq!(modern_error_status(e.code()), StatusCode::BAD_REQUEST);
    }
}
