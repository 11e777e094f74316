//! `tasks/cancel` answers that depend on the request's era (2026-07-28 tasks extension,
//! SEP-2663: the cancel of a terminal task has no error, it is acknowledged).

use super::CancelState;
use crate::exchange::McpReply;
use crate::jsonrpc;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::task::TaskStatus;
use crate::metrics::LocalReason;
use std::sync::Arc;

/// The answer to a `tasks/cancel` of a task known terminal, without calling the upstream:
/// under 2025-11-25 `-32602` naming the status; under 2026-07-28 the ack
/// `{"resultType":"complete"}` (the spec defines no error there), with the `cancel_requested`
/// audit fact (the ack is not proof of anything: the status stays the recorded one).
pub(super) async fn terminal_answer(
    state: &Arc<CancelState>,
    era: Era,
    upstream: &str,
    record: &crate::store::TaskRecord,
    id: &jsonrpc::Id,
    status: TaskStatus,
) -> McpReply {
    let task_id = &record.task_id;
    let reply = if era == Era::Modern {
        // Recorded once per task: a repeated ack of a task whose cancel is already recorded
        // costs no store round trip (the registry checks again under the store's swap).
        if record.cancel_requested_at.is_none() {
            state
                .registry
                .record_cancel_acknowledged(upstream, task_id)
                .await;
        }
        tracing::debug!(task_id = %task_id, %status, "tasks/cancel of a terminal task: acknowledged here");
        McpReply::local_json(jsonrpc::result_response(id, MODERN_ACK))
    } else {
        // As 2025-11-25 names it: a 2026 tool error is `failed`.
        let status = if status == TaskStatus::Completed && record.tool_error {
            TaskStatus::Failed
        } else {
            status
        };
        let error = McpError::TaskAlreadyTerminal {
            task_id: task_id.clone(),
            status,
        };
        McpReply::error(era, Some(id), &error)
    };
    reply.answered_locally(LocalReason::CancelTerminal)
}

/// The 2026-07-28 `tasks/cancel` (and `tasks/update`) ack: `{"resultType":"complete"}`.
pub const MODERN_ACK: &str = r#"{"resultType":"complete"}"#;
