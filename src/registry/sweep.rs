//! The TTL sweep: records whose `expires_at` has passed are removed with their index entries and
//! audit events (run by `gateway` every `tasks.sweep_interval_ms`), and so are held sessions idle
//! past `gateway.session_idle_ms` (`store::held`). On a shared store only the
//! replica holding the store's sweep lease sweeps; a record removed by two sweeps is counted by
//! the one whose removal returned it.
//!
//! `taskgate_tasks` on a shared store: the replica holding the sweep lease (PostgreSQL keeps it
//! with one replica while that replica lives) sets it each sweep from a count in the database;
//! every other replica exports no series of it. So a Prometheus `sum` over the replicas counts
//! each record once (a replica's own view would double-count the records every replica counted
//! at start, and go negative for a task created on one replica and finished on another).

use super::Registry;
use crate::mcp::task::{now_ms, TaskStatus};
use crate::metrics::ReleaseReason;

impl Registry {
    /// Removes records whose ttl is over; returns how many were removed (blocking).
    pub(super) fn sweep_now(&self) -> usize {
        // One sweeper at a time across the processes sharing the store (held to the end).
        let _lease = match self.store.sweep_lease() {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                self.clear_shared_gauges();
                return 0;
            }
            Err(e) => {
                crate::store::log_failure(&e, "sweeper could not take the sweep lease");
                self.clear_shared_gauges();
                return 0;
            }
        };
        let now = now_ms();
        let keys = match self.store.expired(now, 10_000) {
            Ok(k) => k,
            Err(e) => {
                crate::store::log_failure(&e, "sweeper could not read the expiry index");
                return 0;
            }
        };
        let mut removed = 0;
        for (up, id) in keys {
            match self.remove(&up, &id) {
                Ok(Some(r)) => {
                    removed += 1;
                    self.metrics.task_expired(&up);
                    if self.counts_own_gauges() {
                        self.metrics.tasks_dec(&up, r.status);
                    }
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
                Err(e) => crate::store::log_failure(&e, "sweeper could not remove a record"),
            }
        }
        // Held sessions idle past `gateway.session_idle_ms` (see `store::held`) go too.
        match self.store.remove_expired_held_sessions(now, 10_000) {
            Ok(n) if n > 0 => {
                tracing::debug!(count = n, "idle held sessions removed from the store");
                self.store.sync_soon();
            }
            Ok(_) => {}
            Err(e) => crate::store::log_failure(&e, "sweeper could not remove idle held sessions"),
        }
        if removed > 0 {
            self.store.sync_soon();
        }
        self.export_shared_gauges();
        removed
    }

    /// Not the sweep lease holder of a shared store: no `taskgate_tasks` series (see the module
    /// doc).
    fn clear_shared_gauges(&self) {
        if self.store.shared() {
            self.metrics.tasks.reset();
        }
    }

    /// The sweep lease holder of a shared store: `taskgate_tasks` as the database counts it
    /// (every status of each configured upstream and of each upstream that has records; 0 for
    /// those it has none of).
    fn export_shared_gauges(&self) {
        let Some(slots) = self.store.slots() else {
            return;
        };
        let counts = match slots.count_by_status() {
            Ok(c) => c,
            Err(e) => {
                crate::store::log_failure(&e, "the task gauges could not be counted in the store");
                self.metrics.tasks.reset();
                return;
            }
        };
        self.metrics.tasks.reset();
        let upstreams: std::collections::BTreeSet<&str> = counts
            .iter()
            .map(|(up, _, _)| up.as_str())
            .chain(self.metrics.upstreams().iter().map(String::as_str))
            .collect();
        for up in upstreams {
            for &status in TaskStatus::ALL {
                self.metrics.tasks_set(up, status, 0);
            }
        }
        for (up, status, n) in &counts {
            self.metrics.tasks_set(up, *status, *n);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::layers::testing;
    use std::sync::atomic::Ordering;

    /// On a shared store the sweep lease holder exports `taskgate_tasks` at 0 for every
    /// configured upstream without records, as every other series is pre-created: an upstream
    /// whose last record was swept lost its series (a sum over the replicas said "no data",
    /// not 0), and one with no task yet never had any.
    #[test]
    fn the_holder_exports_every_configured_upstream() {
        let (registry, store) = testing::registry();
        store.with_slots.store(true, Ordering::SeqCst);
        registry.sweep_now();
        let text = String::from_utf8(registry.metrics().encode()).unwrap();
        assert!(
            text.lines()
                .any(|l| l == r#"taskgate_tasks{status="working",upstream="up"} 0"#),
            "{}",
            text.lines()
                .filter(|l| l.starts_with("taskgate_tasks"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
