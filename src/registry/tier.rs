//! The registry's side of a tier of replicas sharing one store (PostgreSQL): the cross-replica
//! `tasks/cancel` claim, run off the runtime like every store call, and the bounded wait for the
//! outcome of a cancel another replica forwards.
//!
//! A claim's lease is the upstream's `timeout_ms` plus a margin ([`crate::store::cancel_lease`]):
//! the forwarded cancel ends within `timeout_ms`, so a slow upstream's cancel is not claimed and
//! sent again by another replica while it is still answering. The replicas of a tier share one
//! configuration, so a waiter's lease is the forwarder's.
//!
//! **The claim is kept while its flight lives** (issue 29, item 7): the store writes the
//! forwarding replica makes between the claim and the upstream call (`cancel_requested_at` and
//! its audit event: three store calls, each bounded by about three times the database URL's
//! `connect_timeout`) used to count against the lease's 5 s margin, so with a slow database the
//! lease ran out before the forward even started and a second replica claimed the cancel and
//! forwarded it too (reproduced in `tests/tier_cancel_lease.rs`: a database answering one round
//! trip a second, two `tasks/cancel` upstream). Now the replica that is granted a claim renews
//! its lease ([`crate::store::TaskStore::renew_cancel`]) every quarter lease from the grant
//! until the claim is no longer its own (its outcome is stored by `finish_cancel`, also when
//! the flight is dropped, or a newer claim replaced it) or for at most the lease plus
//! [`KEEP_CLAIM_AT_MOST`] (a flight that neither finishes nor is dropped is a bug; the claim
//! then lapses as a dead replica's does). A replica that dies stops renewing: its claim lapses
//! within one lease, as before. The claim lapses under a live forwarder only when the database
//! does not take one of its renewals within three quarters of a lease; the generation fences
//! the rest (a lapsed claim's renewal, outcome and waiters never touch a newer claim).
//!
//! The wait polls the store (every 10 ms, growing to 100 ms) until the forwarding replica has
//! stored its outcome, or its claim lapsed without one (the forwarding replica died, or could
//! not renew it: the `cancel` layer then claims again and takes the cancel over, see
//! `layers::cancel::tier`), for at most the claim's lease plus one second; past that deadline
//! (a forwarder that keeps its claim renewed but has not answered) the caller gets `-32603`.

use super::Registry;
use crate::store::{CancelClaim, CancelProgress, SharedCancelOutcome, StoreError};
use std::sync::Arc;
use std::time::Duration;

/// How much longer than its lease a forwarding replica keeps renewing a cancel claim at most
/// (see the module doc): more than the store writes before the upstream call can take at their
/// bounds with the default `connect_timeout` (3 calls x 15 s).
pub const KEEP_CLAIM_AT_MOST: Duration = Duration::from_secs(120);

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
        match &claimed {
            Err(e) => self.write_failed(e, "the cancel claim could not be taken"),
            Ok(CancelClaim::Forward { generation } | CancelClaim::TakeOver { generation })
                if self.store.shared() =>
            {
                self.keep_claim(upstream, task_id, *generation, lease)
            }
            Ok(_) => {}
        }
        claimed
    }

    /// Renews the lease of claim `generation` while this replica forwards it (see the module
    /// doc), on the runtime that claimed it (the renewal's query runs on the store's own
    /// runtime: no thread waits for it).
    fn keep_claim(&self, upstream: &str, task_id: &str, generation: i64, lease: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, up, id) = (
            self.store.clone(),
            upstream.to_string(),
            task_id.to_string(),
        );
        let every = (lease / 4).max(Duration::from_millis(100));
        let until = tokio::time::Instant::now() + lease.saturating_add(KEEP_CLAIM_AT_MOST);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if tokio::time::Instant::now() >= until {
                    tracing::warn!(upstream = %up, task_id = %id, generation,
                        "a cancel claim was kept for its longest; it lapses with its lease");
                    return;
                }
                match store.renew_cancel(&up, &id, generation, lease).await {
                    Ok(true) => {}
                    // Finished (or replaced): nothing left to keep.
                    Ok(false) => return,
                    Err(e) => tracing::warn!(error = %e, upstream = %up, task_id = %id,
                        "the lease of a cancel claim could not be renewed; trying again"),
                }
            }
        });
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
            .point_about(upstream, task_id, move |r, up, id| {
                r.store.finish_cancel(up, id, generation, &outcome)
            })
            .await;
        if let Some(Err(e)) = done {
            self.write_failed(&e, "the cancel outcome could not be stored");
        }
    }

    /// Waits for the outcome of cancel claim `generation`, forwarded by another replica under
    /// `lease` (see the module doc for the poll and its deadline). `None`: the claim lapsed
    /// without an outcome (its replica died while forwarding) or a newer claim still in flight
    /// replaced it: the caller claims the cancel again, and takes it over or waits on that one.
    pub async fn await_cancel(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        generation: i64,
        lease: Duration,
    ) -> Option<SharedCancelOutcome> {
        let deadline = tokio::time::Instant::now() + lease + Duration::from_secs(1);
        let mut pause = Duration::from_millis(10);
        loop {
            let read = self
                .point_about(upstream, task_id, move |r, up, id| {
                    r.store.cancel_outcome(up, id, generation)
                })
                .await;
            match read {
                Some(Ok(CancelProgress::Done(outcome))) => return Some(outcome),
                Some(Ok(CancelProgress::Lapsed)) => return None,
                Some(Ok(CancelProgress::InFlight)) => {}
                Some(Err(e)) => {
                    self.write_failed(&e, "reading a cancel outcome failed");
                    return Some(SharedCancelOutcome::Failed(format!("task store: {e}")));
                }
                None => {
                    return Some(SharedCancelOutcome::Failed(
                        "the task store read was not run".into(),
                    ))
                }
            }
            if tokio::time::Instant::now() + pause > deadline {
                return Some(SharedCancelOutcome::Failed(
                    "the replica forwarding this tasks/cancel did not answer in time".into(),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}
