//! Upgraded calls whose follower was lost with its replica (issue 35): in a PostgreSQL tier the
//! follower holds a lease on its call ([`crate::store::LeaseKind::Followed`], see
//! `registry::leases`); when it is not renewed within `store.lease_ms`, a surviving replica
//! adopts it and follows the task here to its end, so the record is complete: `tasks/get` at
//! the task's `pollInterval` (within `MIN_POLL`..`MAX_POLL`) until the record is terminal, then
//! one `tasks/result` (2025-11-25), whose answer `observe` applies and keeps in the record
//! (`tasks.max_stored_result_bytes`). The requests go through the stack below `upgrade`,
//! authorised as the task's owner, in its session and era, as after a restart (`orphans`).
//! The client's own stream went with the lost replica; the client (or its principal) finds the
//! task's end and result with `tasks/*` on any replica.

use super::early::{answer_of, Others};
use super::orphans::owner_context;
use super::requests::internal_request;
use super::UpgradeState;
use crate::exchange::RequestContext;
use crate::layers::extensions::OnBehalfOf;
use crate::layers::McpService;
use crate::mcp::era::Era;
use crate::mcp::task::{now_ms, TaskStatus, MAX_POLL, MIN_POLL};
use crate::store::{Owner, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

/// Follows the upgraded task `task_id` of `upstream`, adopted from a lost replica, until its
/// record is terminal (or expired, or gone), then asks its result once. Returns the status it
/// ended with (`None`: no record).
///
/// Errors: the store's, when the record could not be read (the adoption failed: its lease is
/// given back and adopted again, `registry::leases`).
pub async fn follow_adopted<S: McpService>(
    state: &UpgradeState,
    upstream: &Arc<str>,
    stack: S,
    task_id: &str,
) -> Result<Option<TaskStatus>, StoreError> {
    let Some(mut record) = state.registry.try_record_of(upstream, task_id).await? else {
        return Ok(None);
    };
    let ctx = owner_context(upstream, &record);
    let poll =
        Duration::from_millis(record.poll_interval_ms.unwrap_or(1000)).clamp(MIN_POLL, MAX_POLL);
    while !record.status.is_terminal() {
        if record.is_expired(now_ms()) {
            tracing::warn!(upstream = %upstream, task_id, "an adopted upgraded call expired before it ended");
            return Ok(Some(record.status));
        }
        // Its answer is applied to the record by `observe`.
        ask(&stack, state, &ctx, "tasks/get", task_id, &record.owner).await;
        let Some(now) = state.registry.try_record_of(upstream, task_id).await? else {
            return Ok(None);
        };
        record = now;
        if !record.status.is_terminal() {
            tokio::time::sleep(poll).await;
        }
    }
    if record.era == Era::Legacy && record.terminal_result.is_none() {
        ask(&stack, state, &ctx, "tasks/result", task_id, &record.owner).await;
    }
    tracing::info!(upstream = %upstream, task_id, status = record.status.as_str(), "an adopted upgraded call was followed to its end");
    Ok(Some(record.status))
}

/// One request about the task, authorised as `owner`; its answer is read to its end.
async fn ask<S: McpService>(
    stack: &S,
    state: &UpgradeState,
    ctx: &RequestContext,
    method: &str,
    task_id: &str,
    owner: &Owner,
) {
    let id = state.next_id();
    let mut req = internal_request(ctx, &id, method, serde_json::json!({ "taskId": task_id }));
    req.extensions.insert(OnBehalfOf(owner.clone()));
    match stack.clone().oneshot(req).await {
        Ok(reply) => {
            if answer_of(reply, &id, Others::Discard).await.is_none() {
                tracing::warn!(task_id, method, "an adopted upgraded call: no answer");
            }
        }
        Err(e) => {
            tracing::warn!(task_id, method, error = %e, "an adopted upgraded call: the request failed")
        }
    }
}
