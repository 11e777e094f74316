//! Upgraded tasks orphaned by a restart.

use super::requests::{send_tasks_cancel_for, CancelSent};
use super::UpgradeState;
use crate::exchange::{Principal, RequestContext};
use crate::layers::McpService;
use crate::mcp::task::TaskStatus;
use crate::metrics::UpgradeOutcome;

use http::{HeaderMap, HeaderValue};
use std::sync::Arc;

/// The context of a request taskgate makes itself about the upgraded task `r` whose client is
/// gone: its upstream session, its owner's principal, the era it was created in (the request is
/// authorised as `r.owner` with [`OnBehalfOf`](crate::layers::extensions::OnBehalfOf)).
pub(super) fn owner_context(upstream: &Arc<str>, r: &crate::store::TaskRecord) -> RequestContext {
    let session = r
        .upstream_session
        .as_deref()
        .and_then(|s| HeaderValue::from_str(s).ok());
    let principal = match &r.owner {
        crate::store::Owner::Principal(p) => Principal::Token(p.as_str().into()),
        _ => Principal::Anonymous,
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    if let Some(v) = r
        .protocol_version
        .as_deref()
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        headers.insert("mcp-protocol-version", v);
    }
    RequestContext {
        upstream: upstream.clone(),
        session_id: session.clone(),
        client_session_id: session,
        principal,
        client_addr: None,
        headers,
    }
}

/// What [`cancel_orphans`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Orphans {
    /// Upgraded tasks found live after the restart.
    pub found: usize,
    /// Of those, how many `tasks/cancel` were answered with a result.
    pub cancelled: usize,
}

/// After a restart: cancels every non-terminal upgraded task (its client is gone), through the
/// upstream's stack so the `cancel` layer records it, authorised as the owner each record names
/// ([`OnBehalfOf`](crate::layers::extensions::OnBehalfOf)), in the era the task was created in.
pub async fn cancel_orphans<S: McpService>(
    state: &UpgradeState,
    upstream: &Arc<str>,
    stack: S,
) -> Orphans {
    // A scan of the whole store: on the blocking pool (see `registry`).
    let orphans = state.registry.upgraded_live(upstream).await;
    let mut done = Orphans {
        found: orphans.len(),
        cancelled: 0,
    };
    for r in &orphans {
        let ctx = owner_context(upstream, r);
        state.count(upstream, UpgradeOutcome::Orphaned);
        match send_tasks_cancel_for(&stack, state, &ctx, &r.task_id, Some(&r.owner)).await {
            CancelSent::Cancelled => {
                done.cancelled += 1;
                if r.status != TaskStatus::Cancelled {
                    tracing::info!(task_id = %r.task_id, "orphaned upgraded task cancelled after restart");
                }
            }
            CancelSent::Refused(why) => tracing::warn!(
                task_id = %r.task_id,
                error = %why,
                "could not cancel an upgraded task orphaned by a restart; it may still run upstream"
            ),
        }
    }
    done
}
