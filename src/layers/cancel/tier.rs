//! Single-flight `tasks/cancel` across a tier of replicas sharing one store (PostgreSQL).
//!
//! Inside one replica, identical cancels already share one flight (`CancelState::flights`). The
//! flight's leader then asks the store who forwards ([`crate::store::CancelClaim`]): the
//! replica whose claim the database grants sends the one upstream `tasks/cancel` and stores the
//! outcome; a replica that finds another's claim waits for that outcome (a bounded poll, see
//! `registry::tier`) and shares it with its own waiters, each under its own JSON-RPC id. A task
//! the database shows terminal is answered locally. With an embedded store no claim is made.

use super::{forward_upstream, internal, CancelState, FlightAnswer, FlightGuard};
use crate::exchange::{GatewayError, McpReply, McpRequest};
use crate::mcp::era::Era;
use crate::store::{CancelClaim, SharedCancelOutcome};
use std::sync::Arc;

/// The flight of one `tasks/cancel`: claims it on a shared store, forwards it (or waits for the
/// replica that does), and leaves the in-flight table however it ends (answered, failed,
/// panicked, or dropped because every caller went away: the next cancel is then sent again).
pub(super) async fn forward_cancel<S>(
    state: Arc<CancelState>,
    inner: S,
    req: McpRequest,
    task_id: String,
) -> FlightAnswer
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Send + 'static,
    S::Future: Send + 'static,
{
    let _flight = FlightGuard {
        state: state.clone(),
        task_id: task_id.clone(),
    };
    let registry = state.registry.clone();
    if !registry.is_shared() {
        return forward_upstream(state, inner, req, task_id).await;
    }
    let upstream = req.ctx.upstream.clone();
    let modern = req.era() == Era::Modern;
    let generation = match registry
        .claim_cancel(&upstream, &task_id, modern, state.lease)
        .await
    {
        Ok(CancelClaim::Forward { generation }) => generation,
        Ok(CancelClaim::Terminal(status)) => return FlightAnswer::Terminal(status),
        Ok(CancelClaim::Acknowledged) => return FlightAnswer::Acknowledged,
        Ok(CancelClaim::Wait { generation }) => {
            let shared = registry
                .await_cancel(&upstream, &task_id, generation, state.lease)
                .await;
            return FlightAnswer::Elsewhere(Box::new(match shared {
                SharedCancelOutcome::Result(r) => FlightAnswer::Result(r),
                SharedCancelOutcome::Error(e) => FlightAnswer::Error(e),
                SharedCancelOutcome::Failed(why) => FlightAnswer::Error(internal(format!(
                    "tasks/cancel forwarded by another taskgate replica failed: {why}"
                ))),
            }));
        }
        Err(e) => {
            return FlightAnswer::Error(internal(format!(
                "tasks/cancel: the task store could not decide who forwards it: {e}"
            )))
        }
    };
    // If this flight is dropped before the upstream answered (every caller went away), the
    // claim is ended as failed at once, so other replicas' waiters do not sit out the lease.
    let mut unfinished = Unfinished {
        registry: Some(registry.clone()),
        upstream: upstream.to_string(),
        task_id: task_id.clone(),
        generation,
    };
    let outcome = forward_upstream(state, inner, req, task_id.clone()).await;
    unfinished.registry = None;
    let shared = match &outcome {
        FlightAnswer::Result(r) => SharedCancelOutcome::Result(r.clone()),
        FlightAnswer::Error(e) | FlightAnswer::Ended { error: e, .. } => {
            SharedCancelOutcome::Error(e.clone())
        }
        // Other replicas' callers get the error under HTTP 200: the record is failed here by
        // this replica's own caller's probe, and they read it from then on.
        FlightAnswer::SessionGone(e) => SharedCancelOutcome::Error(e.clone()),
        FlightAnswer::Http(_, status) => {
            SharedCancelOutcome::Failed(format!("the upstream answered HTTP {status}"))
        }
        FlightAnswer::Failed(e) => SharedCancelOutcome::Failed(e.to_string()),
        other => SharedCancelOutcome::Failed(format!("unexpected outcome {}", kind(other))),
    };
    registry
        .finish_cancel(&upstream, &task_id, generation, shared)
        .await;
    outcome
}

/// Ends a claim whose flight was dropped mid-way (see `forward_cancel`).
struct Unfinished {
    /// `None` once the flight finished normally.
    registry: Option<Arc<crate::registry::Registry>>,
    upstream: String,
    task_id: String,
    generation: i64,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let Some(registry) = self.registry.take() else {
            return;
        };
        let (upstream, task_id, generation) = (
            std::mem::take(&mut self.upstream),
            std::mem::take(&mut self.task_id),
            self.generation,
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let why = "the replica forwarding it stopped waiting for the upstream".to_string();
                registry
                    .finish_cancel(
                        &upstream,
                        &task_id,
                        generation,
                        SharedCancelOutcome::Failed(why),
                    )
                    .await;
            });
        }
    }
}

fn kind(o: &FlightAnswer) -> &'static str {
    match o {
        FlightAnswer::Terminal(_) => "terminal",
        FlightAnswer::Acknowledged => "acknowledged",
        _ => "elsewhere",
    }
}
