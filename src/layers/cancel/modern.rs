//! `tasks/cancel` answers that depend on the request's era (2026-07-28 tasks extension,
//! SEP-2663: the cancel of a terminal task has no error, it is acknowledged).

use super::CancelState;
use crate::exchange::{McpReply, McpRequest};
use crate::jsonrpc;
use crate::layers::cancel_ack;
use crate::layers::extensions::AuthorisedTask;
use crate::layers::own_request;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::task::{TaskStatus, MAX_POLL, MIN_POLL};
use crate::metrics::LocalReason;
use std::sync::Arc;
use std::time::Duration;

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

/// The answer of a caller whose era is not the one the flight's successful `result` is shaped
/// for: a 2025-11-25 caller who joined a 2026-07-28 caller's cancel of the same task, or the
/// other way round (break-tasks M1: each got the other era's shape, which its SDK rejects).
/// A 2026 caller gets the ack; a 2025 caller the ack applied as the task `cancelled`, as the
/// bridge answers its own cancel ([`cancel_ack`]). `None`: `result` already has the caller's
/// era's shape (a 2026 ack has `resultType`, a 2025 `Task` has `status`).
pub(super) async fn other_eras_answer(
    state: &Arc<CancelState>,
    era: Era,
    upstream: &str,
    record: &crate::store::TaskRecord,
    id: &jsonrpc::Id,
    result: &str,
) -> Option<McpReply> {
    let has = |member: &str| {
        matches!(
            jsonrpc::splice::raw_at(result.as_bytes(), &[member]),
            Ok(Some(_))
        )
    };
    match era {
        Era::Modern if !has("resultType") => Some(McpReply::local_json(jsonrpc::result_response(
            id, MODERN_ACK,
        ))),
        // Only a 2026 ack (`resultType`, no `status`): a 2025 result that is malformed stays
        // the caller's to see (review 17 #9: `{}` was taken for an ack and recorded cancelled).
        Era::Legacy if has("resultType") && !has("status") => {
            let (task, observed) = cancel_ack::apply(&state.registry, upstream, record).await;
            let answer = cancel_ack::legacy_answer(&observed, id, &record.task_id, &task);
            Some(McpReply::local_json(answer))
        }
        _ => None,
    }
}

pub use crate::mcp::modern::MODERN_ACK;

/// taskgate's own `tasks/get` of the task a 2026-07-28 `tasks/cancel` names, after the upstream
/// acknowledged that cancel (break-tasks M3): the ack carries no status, and a client may
/// forget the task right after it (the spec allows it), so without it the record stayed
/// `working`, holding its owner's slot, until someone polled it or its ttl passed. Each
/// [`PollAfterAck::request`] is a fresh one (`own_request`), answered to `observe` like a
/// client's poll (the task's [`AuthorisedTask`]).
pub(super) struct PollAfterAck {
    /// The cancel's context (its upstream, the caller's credentials).
    ctx: crate::exchange::RequestContext,
    record: Arc<crate::store::TaskRecord>,
    trace: Option<crate::telemetry::RequestTrace>,
}

impl PollAfterAck {
    /// The polls a 2026-07-28 `tasks/cancel` (`cancel`) may need; `None` when the task is not a
    /// 2026-07-28 one on a 2026-07-28 upstream (the bridges record their own outcome).
    pub(super) fn of(cancel: &McpRequest) -> Option<PollAfterAck> {
        if cancel.era() != Era::Modern {
            return None;
        }
        let authorised = cancel.extensions.get::<AuthorisedTask>()?;
        if authorised.record.era != Era::Modern {
            return None;
        }
        Some(PollAfterAck {
            ctx: cancel.ctx.clone(),
            record: authorised.record.clone(),
            trace: cancel.trace.clone(),
        })
    }

    /// The task's upstream and id.
    pub(super) fn task(&self) -> (&str, &str) {
        (&self.record.upstream, &self.record.task_id)
    }

    /// The task's `pollIntervalMs` as recorded, within [`MIN_POLL`]..=[`MAX_POLL`].
    pub(super) fn interval(&self) -> Duration {
        self.record
            .poll_interval_ms
            .map_or(MIN_POLL, Duration::from_millis)
            .clamp(MIN_POLL, MAX_POLL)
    }

    /// Drops the cancel's trace: the polls from now on carry none (a follow-up outlives the
    /// request it follows by far; review 18a #5).
    pub(super) fn untraced(&mut self) {
        self.trace = None;
    }

    /// One `tasks/get` of the task (`"taskgate-cancel-poll-<n>"`).
    pub(super) fn request(&self) -> McpRequest {
        let id = own_request::own_id("cancel-poll");
        let task_id = &self.record.task_id;
        let mut poll = own_request::task_request(&self.ctx, Era::Modern, "tasks/get", task_id, &id);
        poll.extensions.insert(AuthorisedTask {
            record: self.record.clone(),
        });
        poll.trace = self.trace.clone();
        poll
    }
}
