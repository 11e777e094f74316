//! The TTL sweep: records whose `expires_at` has passed are removed with their index entries and
//! audit events (run by `gateway` every `tasks.sweep_interval_ms`). On a shared store only the
//! replica holding the store's sweep lease sweeps; a record removed by two sweeps is counted by
//! the one whose removal returned it.

use super::Registry;
use crate::mcp::task::now_ms;
use crate::metrics::ReleaseReason;

impl Registry {
    /// Removes records whose ttl is over; returns how many were removed (blocking).
    pub(super) fn sweep_now(&self) -> usize {
        // One sweeper at a time across the processes sharing the store (held to the end).
        let _lease = match self.store.sweep_lease() {
            Ok(Some(lease)) => lease,
            Ok(None) => return 0,
            Err(e) => {
                tracing::error!(error = %e, "sweeper could not take the sweep lease");
                return 0;
            }
        };
        let now = now_ms();
        let keys = match self.store.expired(now, 10_000) {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(error = %e, "sweeper could not read the expiry index");
                return 0;
            }
        };
        let mut removed = 0;
        for (up, id) in keys {
            match self.remove(&up, &id) {
                Ok(Some(r)) => {
                    removed += 1;
                    self.metrics.task_expired(&up);
                    self.metrics.tasks_dec(&up, r.status);
                    if !r.status.is_terminal() {
                        self.release_slot(&up, &r.owner);
                    }
                    if r.cancelled_at.is_some() && r.released_at.is_none() {
                        self.releases.forget(&up, &id);
                        self.metrics.tasks_cancelled_unreleased.dec();
                        self.metrics.task_released(&up, ReleaseReason::Expired);
                    }
                    tracing::debug!(upstream = %up, task_id = %id, "expired task record removed");
                }
                Ok(None) => {}
                Err(e) => tracing::error!(error = %e, "sweeper could not remove a record"),
            }
        }
        if removed > 0 {
            self.store.sync_soon();
        }
        removed
    }
}
