//! The registry's side of a tier of replicas sharing one store (PostgreSQL): the cross-replica
//! `tasks/cancel` claim, run off the runtime like every store call, and the bounded wait for the
//! outcome of a cancel another replica forwards.
//!
//! A claim's lease is the upstream's `timeout_ms` plus a margin ([`crate::store::cancel_lease`]):
//! the forwarded cancel ends within `timeout_ms`, so a slow upstream's cancel is not claimed and
//! sent again by another replica while it is still answering. The replicas of a tier share one
//! configuration, so a waiter's lease is the forwarder's.
//!
//! The wait polls the store (every 10 ms, growing to 100 ms) until the forwarding replica has
//! stored its outcome, for at most the claim's lease plus one second; past that deadline the
//! caller gets `-32603` (the forwarding replica is presumed dead; its claim has expired and the
//! next `tasks/cancel` claims again).

use super::Registry;
use crate::store::{CancelClaim, SharedCancelOutcome, StoreError};
use std::sync::Arc;
use std::time::Duration;

impl Registry {
    /// True when other processes share the store (see [`crate::store::TaskStore::shared`]).
    pub fn is_shared(&self) -> bool {
        self.store.shared()
    }

    /// Decides whether this replica forwards a `tasks/cancel` of the task (see [`CancelClaim`]).
    /// Errors: the store's (counted in `taskgate_store_write_failures_total`).
    pub async fn claim_cancel(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        modern: bool,
        lease: Duration,
    ) -> Result<CancelClaim, StoreError> {
        let (up, id) = (upstream.to_string(), task_id.to_string());
        let claimed = self
            .try_off_runtime(move |r| r.store.claim_cancel(&up, &id, modern, lease))
            .await
            .and_then(|claimed| claimed);
        if let Err(e) = &claimed {
            self.write_failed(e, "the cancel claim could not be taken");
        }
        claimed
    }

    /// Stores the outcome of cancel claim `generation` for the replicas waiting on it. A failure
    /// is counted and logged: the waiters then time out and the claim expires with its lease.
    pub async fn finish_cancel(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        generation: i64,
        outcome: SharedCancelOutcome,
    ) {
        let done = self
            .off_runtime_about(upstream, task_id, move |r, up, id| {
                r.store.finish_cancel(up, id, generation, &outcome)
            })
            .await;
        if let Some(Err(e)) = done {
            self.write_failed(&e, "the cancel outcome could not be stored");
        }
    }

    /// Waits for the outcome of cancel claim `generation`, forwarded by another replica under
    /// `lease` (see the module doc for the poll and its deadline).
    pub async fn await_cancel(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        generation: i64,
        lease: Duration,
    ) -> SharedCancelOutcome {
        let deadline = tokio::time::Instant::now() + lease + Duration::from_secs(1);
        let mut pause = Duration::from_millis(10);
        loop {
            let read = self
                .off_runtime_about(upstream, task_id, move |r, up, id| {
                    r.store.cancel_outcome(up, id, generation)
                })
                .await;
            match read {
                Some(Ok(Some(outcome))) => return outcome,
                Some(Ok(None)) => {}
                Some(Err(e)) => {
                    self.write_failed(&e, "reading a cancel outcome failed");
                    return SharedCancelOutcome::Failed(format!("task store: {e}"));
                }
                None => return SharedCancelOutcome::Failed("the task store read was not run".into()),
            }
            if tokio::time::Instant::now() + pause > deadline {
                return SharedCancelOutcome::Failed(
                    "the replica forwarding this tasks/cancel did not answer in time".into(),
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}
