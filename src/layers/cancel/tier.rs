//! Single-flight `tasks/cancel` across a tier of replicas sharing one store (PostgreSQL).
//!
//! Inside one replica, identical cancels already share one flight (`CancelState::flights`). The
//! flight's leader then asks the store who forwards ([`crate::store::CancelClaim`]): the
//! replica whose claim the database grants sends the one upstream `tasks/cancel` and stores the
//! outcome; a replica that finds another's claim waits for that outcome (a bounded poll, see
//! `registry::tier`) and shares it with its own waiters, each under its own JSON-RPC id. A task
//! the database shows terminal is answered locally. With an embedded store no claim is made.
//!
//! **Take-over** (tester 4 #4): a forwarding replica killed mid-forward leaves a claim without
//! an outcome. Its waiters see the claim lapse (within the lease: a live forwarder renews it)
//! and claim again; the one granted takes the cancel over (`take_over`): the task's state is
//! read upstream first, since the dead replica's cancel may have reached it, and a cancel that
//! worked is answered as one, without a second `tasks/cancel`. The other waiters wait on the
//! new claim. Before, each waiter got `-32603` "did not answer in time" after the lease plus a
//! second, although the upstream had cancelled the task.

use super::{
    forward_upstream, internal, status_of, Answer, CancelState, FlightAnswer, FlightGuard,
    MODERN_ACK,
};
use crate::exchange::{GatewayError, McpReply, McpRequest};
use crate::layers::extensions::AuthorisedTask;
use crate::layers::{lost_task, own_request};
use crate::mcp::era::Era;
use crate::mcp::task::TaskStatus;
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
    // Whether this flight waited on a claim that lapsed (its replica died while forwarding).
    let mut waited = false;
    let mut claims = 0;
    let (generation, took_over) = loop {
        claims += 1;
        let claim = registry
            .claim_cancel(&upstream, &task_id, modern, state.lease)
            .await;
        match claim {
            Ok(CancelClaim::Forward { generation }) => break (generation, false),
            Ok(CancelClaim::TakeOver { generation }) => break (generation, true),
            // The cancel this flight waited on worked; its replica died before storing the
            // outcome. Its callers are answered as that replica's would have been.
            Ok(CancelClaim::Terminal(TaskStatus::Cancelled)) if waited => {
                return FlightAnswer::Elsewhere(Box::new(cancelled(&registry, &req).await));
            }
            Ok(CancelClaim::Terminal(status)) => return FlightAnswer::Terminal(status),
            Ok(CancelClaim::Acknowledged) => return FlightAnswer::Acknowledged,
            Ok(CancelClaim::Wait { generation }) => {
                let shared = registry
                    .await_cancel(&upstream, &task_id, generation, state.lease)
                    .await;
                let shared = match shared {
                    Some(shared) => shared,
                    // Lapsed: claim again (take it over, or wait on whoever did).
                    None if claims < MAX_CLAIMS => {
                        waited = true;
                        continue;
                    }
                    None => SharedCancelOutcome::Failed(format!(
                        "its claim lapsed {MAX_CLAIMS} times without an outcome"
                    )),
                };
                return FlightAnswer::Elsewhere(Box::new(match shared {
                    SharedCancelOutcome::Result(r) => FlightAnswer::Result(r),
                    SharedCancelOutcome::Error(e) => FlightAnswer::Error(e),
                    SharedCancelOutcome::Failed(why) => FlightAnswer::Error(internal(format!(
                        "tasks/cancel forwarded by another taskgate replica failed: {why}"
                    ))),
                    // As on the claim path: the cancel this flight waited on (lapsed, then
                    // taken over by a fresh cancel that found it done upstream) worked.
                    SharedCancelOutcome::Terminal(TaskStatus::Cancelled) if waited => {
                        cancelled(&registry, &req).await
                    }
                    SharedCancelOutcome::Terminal(status) => FlightAnswer::Terminal(status),
                }));
            }
            Err(e) => {
                return FlightAnswer::Error(internal(format!(
                    "tasks/cancel: the task store could not decide who forwards it: {e}"
                )))
            }
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
    let outcome = if took_over {
        take_over(state, inner, req, task_id.clone(), waited).await
    } else {
        forward_upstream(state, inner, req, task_id.clone()).await
    };
    unfinished.registry = None;
    let shared = shared_of(&outcome);
    registry
        .finish_cancel(&upstream, &task_id, generation, shared)
        .await;
    outcome
}

/// How many times one flight claims a `tasks/cancel` at most: each claim it waits on that lapses
/// without an outcome (its replica died while forwarding) makes it claim again, and take the
/// cancel over or wait on whoever did. Each wait is bounded (`Registry::await_cancel`); past
/// the last one the callers get `-32603`.
const MAX_CLAIMS: usize = 3;

/// Forwards a `tasks/cancel` whose previous claim lapsed without an outcome
/// ([`CancelClaim::TakeOver`]): that claim's replica may have sent it upstream before it died,
/// so the task's state is read there first (taskgate's own `tasks/get`, which `observe` below
/// applies to the record). A live task (or a `tasks/get` that failed) gets the cancel
/// forwarded. A terminal one is answered without a second cancel: when this flight `waited`
/// on the lapsed claim, it joined that cancel, and a task the upstream shows `cancelled` is
/// answered as the cancel that worked (2025-11-25: the task; 2026-07-28: the ack), as the dead
/// replica's callers would have been; otherwise (another terminal status, or a cancel that
/// came after the lapse) as its era answers a cancel of a terminal task (2025-11-25: `-32602`;
/// 2026-07-28: the ack). A waiter's forward answered `-32602` because the task is `cancelled`
/// by now (the dead replica's cancel reached the upstream after the `tasks/get`) is a cancel
/// that worked too.
async fn take_over<S>(
    state: Arc<CancelState>,
    mut inner: S,
    req: McpRequest,
    task_id: String,
    waited: bool,
) -> FlightAnswer
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Send + 'static,
    S::Future: Send + 'static,
{
    let registry = state.registry.clone();
    let upstream = req.ctx.upstream.clone();
    tracing::info!(%upstream, task_id = %task_id,
        "a tasks/cancel claim lapsed without an outcome (its replica died while forwarding?): \
         taken over, the task's state read upstream first");
    match upstream_status(&mut inner, &req, &task_id).await {
        // Counted as joined (`deduplicated`), not forwarded: nothing was sent.
        Some(TaskStatus::Cancelled) if waited => {
            return FlightAnswer::Elsewhere(Box::new(cancelled(&registry, &req).await))
        }
        Some(status) if status.is_terminal() => return FlightAnswer::Terminal(status),
        _ => {}
    }
    let era = req.era();
    let outcome = forward_upstream(state, inner, req, task_id.clone()).await;
    let FlightAnswer::Error(error) = &outcome else {
        return outcome;
    };
    if !waited {
        return outcome;
    }
    if lost_task::error_object_code(error) != Some(lost_task::INVALID_PARAMS) {
        return outcome;
    }
    // The forward's own `-32602` check (`lost_task::Confirm`) has read the task's state again.
    match registry.record_cached(&upstream, &task_id).await {
        Ok(Some(now)) if now.status == TaskStatus::Cancelled => cancelled_as(era, Some(&*now)),
        _ => outcome,
    }
}

/// The task's status as the upstream answers taskgate's own `tasks/get` of it, in the cancel's
/// era and on its session (`observe` below applies the answer to the record); `None` when it
/// did not answer one.
async fn upstream_status<S>(inner: &mut S, req: &McpRequest, task_id: &str) -> Option<TaskStatus>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>,
{
    let id = own_request::own_id("cancel-takeover");
    let mut get = own_request::task_request(&req.ctx, req.era(), "tasks/get", task_id, &id);
    if let Some(a) = req.extensions.get::<AuthorisedTask>() {
        get.extensions.insert(a.clone());
    }
    get.trace = req.trace.clone();
    let answer = match own_request::ask(inner, get).await {
        Ok(Some(answer)) => answer,
        Ok(None) => return None,
        Err(e) => {
            tracing::debug!(error = %e, "taskgate's tasks/get before taking a cancel over failed");
            return None;
        }
    };
    let answer = serde_json::from_slice::<Answer>(&answer).ok()?;
    status_of(answer.result?)
}

/// The answer of a cancel that worked though the replica that forwarded it died before storing
/// the upstream's answer: the task `cancelled` as the record now holds it (2025-11-25's
/// `CancelTaskResult` is the task), or the 2026-07-28 ack. Each caller gets it in its own era
/// (`modern::other_eras_answer`).
async fn cancelled(registry: &Arc<crate::registry::Registry>, req: &McpRequest) -> FlightAnswer {
    let Some(record) = authorised(req) else {
        return cancelled_as(req.era(), None);
    };
    let now = registry
        .record_cached(&record.upstream, &record.task_id)
        .await;
    match now {
        Ok(Some(now)) => cancelled_as(req.era(), Some(&*now)),
        _ => cancelled_as(req.era(), Some(&*record)),
    }
}

/// [`cancelled`]'s answer from `record` (`None`: no record to show, the 2026-07-28 ack).
fn cancelled_as(era: Era, record: Option<&crate::store::TaskRecord>) -> FlightAnswer {
    let task = match (era, record) {
        (Era::Legacy, Some(record)) => {
            let mut task = record.to_task();
            task.status = TaskStatus::Cancelled;
            serde_json::to_string(&task).ok()
        }
        _ => None,
    };
    FlightAnswer::Result(task.unwrap_or_else(|| MODERN_ACK.to_string()))
}

/// The record the `tasks` layer authorised for this cancel.
fn authorised(req: &McpRequest) -> Option<Arc<crate::store::TaskRecord>> {
    req.extensions
        .get::<AuthorisedTask>()
        .map(|a| a.record.clone())
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

/// The outcome of a flight as the replicas waiting on its claim read it.
fn shared_of(outcome: &FlightAnswer) -> SharedCancelOutcome {
    match outcome {
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
        // A lapsed claim taken over (`take_over`): the task found terminal upstream, or the
        // dead replica's cancel that worked.
        FlightAnswer::Terminal(status) => SharedCancelOutcome::Terminal(*status),
        FlightAnswer::Elsewhere(o) => shared_of(o),
        FlightAnswer::Acknowledged => {
            SharedCancelOutcome::Failed("unexpected outcome acknowledged".into())
        }
    }
}
