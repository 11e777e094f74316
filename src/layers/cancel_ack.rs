//! A 2026-07-28 `tasks/cancel` ack, for a 2025-11-25 caller. 2025-11-25 tasks: the receiver
//! "MUST set `cancelled` before replying", and a 2026 ack carries no status; so where a 2025
//! caller's cancel is answered by a 2026 ack (the bridge's `tasks/cancel`, once a second
//! `tasks/get` told what the server made of it; a 2025 caller who joined a 2026 caller's
//! cancel, in `cancel`),
//! the ack is applied to the record as the task `cancelled` ([`apply`]) and the caller is
//! answered a 2025 `CancelTaskResult` ([`legacy_answer`], built by the `cancel` layer or the
//! `bridge`). Protocol translation of the layers, kept out of the registry (review 17 #15).

use crate::jsonrpc::{result_response, Id};
use crate::mcp::errors::TaskError;
use crate::mcp::task::{format_rfc3339_ms, now_ms, TaskStatus};
use crate::registry::{Observed, Registry};
use crate::store::TaskRecord;
use bytes::Bytes;
use serde_json::Value;
use std::sync::Arc;

/// Applies the ack as the task `cancelled`: `known` (the authorised record) with status
/// `cancelled` and updated now, reported to the registry as `tasks/cancel` would be. A terminal
/// status recorded first stands. Returns the 2025 `Task` applied and what applying it did (for
/// [`legacy_answer`]), as a 2025 caller is shown it: a recorded 2026 tool error (`completed`
/// with `isError: true`) is [`Observed::Rewrite`] `failed` ([`TaskRecord::legacy_status`]), as
/// every `tasks/get` of it and a cancel answered from the record name it.
pub async fn apply(
    registry: &Arc<Registry>,
    upstream: &str,
    known: &TaskRecord,
) -> (Value, Observed) {
    let mut task = known.to_task();
    task.status = TaskStatus::Cancelled;
    task.last_updated_at = format_rfc3339_ms(now_ms());
    let task = serde_json::to_value(&task).unwrap_or(Value::Null);
    let observed = registry
        .observe_task_as(upstream, &known.task_id, task.clone(), "tasks/cancel")
        .await;
    (
        task,
        legacy(registry, upstream, &known.task_id, observed).await,
    )
}

/// `observed` with a recorded `completed` that is a 2026 tool error named `failed`: the
/// record's own view ([`TaskRecord::legacy_status`]), read from the registry's cache (the
/// rewrite's status alone cannot tell a tool error).
async fn legacy(
    registry: &Arc<Registry>,
    upstream: &str,
    task_id: &str,
    observed: Observed,
) -> Observed {
    match observed {
        Observed::Rewrite {
            status: TaskStatus::Completed,
            status_message,
        } => {
            let status = match registry.record_cached(upstream, task_id).await {
                Ok(Some(r)) => r.legacy_status(),
                _ => TaskStatus::Completed,
            };
            Observed::Rewrite {
                status,
                status_message,
            }
        }
        other => other,
    }
}

/// The 2025-11-25 answer under `id` to a `tasks/cancel` whose ack [`apply`] applied as `task`:
/// the cancelled `Task` (a `CancelTaskResult`); `-32602` naming the status when another terminal
/// status was recorded first; `-32602` "Task not found" when the task is no longer recorded.
pub fn legacy_answer(observed: &Observed, id: &Id, task_id: &str, task: &Value) -> Bytes {
    match observed {
        Observed::Rewrite { status, .. } if *status != TaskStatus::Cancelled => {
            TaskError::AlreadyTerminal {
                task_id,
                status: *status,
            }
            .response(Some(id))
        }
        Observed::Unknown => TaskError::NotFound { task_id }.response(Some(id)),
        _ => result_response(id, &task.to_string()),
    }
}
