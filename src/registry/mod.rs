//! The owner of task facts (not a layer): the status machine over the [`TaskStore`], the
//! durable record of a creation, the audit events, and the authorising lookup.
//!
//! - `status`: the status machine (the spec's transitions, terminal is final) and [`Observed`];
//! - `creation`: the record completed from a `CreateTaskResult` and written durably;
//! - [`owners`]: live-task slots per owner and the [`Reservation`] guard;
//! - [`releases`]: the "resources released" tracker and the `progressToken` → `taskId` map;
//! - [`sweep`]: the TTL sweep;
//! - `gone`: the tasks of an upstream process that died, failed and released;
//! - [`leases`]: a tier's call leases (held and followed calls, cross-replica cancel asks,
//!   lapsed leases adopted).
//! - [`refused`]: the terminal status reports a shared store refused (an outage), kept and
//!   applied again until it takes them (the final writes a gateway task and an upgraded call
//!   hold themselves are retried by their layers, with the same [`FinalWriteBackoff`]);
//! - `backoff`: [`FinalWriteBackoff`], the waits between the tries of a refused final write.
//!
//! Every method that touches the store is `async` and runs the store work on the registry's
//! own store threads (`offload`), never on the runtime's blocking pool (which resolves
//! upstream host names); the exception is sled's calls about one task, which run on the
//! calling serving thread (`Registry::point`, `TaskStore::quick_point_calls`: they are
//! memory work; the commit's `fdatasync` stays on sled's committer thread, and sled's global
//! lock stays in its lock-free mode because taskgate runs no sled transaction).
//!
//! Layers read and write task facts only through [`Registry`]: `tasks` looks records up to
//! authorise and reserves slots, `cancel` records `cancel_requested_at`, and `observe` (the
//! innermost layer) applies everything the upstream reports.

mod backoff;
mod cache;
mod creation;
mod gone;
pub mod in_flight;
pub mod leases;
mod offload;
pub mod owners;
pub mod refused;
pub mod releases;
mod status;
pub mod sweep;
mod tier;

pub use backoff::{FinalWriteBackoff, FINAL_WRITE_FIRST_WAIT, FINAL_WRITE_MAX_WAIT};
pub use creation::{CreatedTask, MIN_RETENTION_MS};
pub use leases::{LeaseGuard, LeaseKeeper};
pub use offload::{ListPage, NotRun, StoreThreads};
pub use owners::{Owners, Reservation};
pub use releases::{Releases, ResourceHold};
pub use status::{as_registry_task, Observed, OnRefusal, TaskFields};

use crate::config::TasksConfig;
use crate::mcp::errors::McpError;
use crate::mcp::task::{now_ms, TaskStatus};
use crate::metrics::{CreationRefusal, Metrics, ReleaseReason};
use crate::store::{AuditEvent, Owner, StoreError, TaskRecord, TaskStore};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// The registry: the store, the live-task slots, the release tracker and the status logic.
pub struct Registry {
    store: Arc<dyn TaskStore>,
    metrics: Arc<Metrics>,
    config: TasksConfig,
    /// Live (non-terminal) tasks per (upstream, owner), including reservations for creations in
    /// flight.
    owners: Arc<Owners>,
    /// The "resources released" tracker.
    releases: Arc<Releases>,
    /// Recently used records, so authorising reads skip the blocking pool (see `cache`).
    records: cache::RecordCache,
    /// Where store work runs, off the runtime and off its blocking pool (see `offload`).
    threads: offload::StoreThreads,
    /// The trace export, when `[telemetry]` is on: the two audit facts become span events
    /// linked to the task's creating span (issue 34). Set once, at start.
    telemetry: std::sync::OnceLock<crate::telemetry::Telemetry>,
    /// This process's call leases, in a tier (see `leases`). Set once, at start.
    leases: std::sync::OnceLock<Arc<leases::LeaseKeeper>>,
    /// Creations in flight and the tasks refused unrecorded, for the notifications that name
    /// a task before (or instead of) its record (see `in_flight`).
    creations: in_flight::CreationsInFlight,
    /// Terminal status reports a shared store refused, applied again (see [`refused`]).
    refused: refused::RefusedReports,
}

impl Registry {
    /// Builds the registry over `store` and counts what it holds (for the gauges and limits).
    pub fn new(
        store: Arc<dyn TaskStore>,
        metrics: Arc<Metrics>,
        config: TasksConfig,
    ) -> Result<Arc<Registry>, StoreError> {
        // One pass over the store: live counts per owner, records per status, and the
        // cancelled tasks still waiting for their "resources released" fact.
        let mut live: HashMap<(Arc<str>, Owner), usize> = HashMap::new();
        let mut by_status: HashMap<String, HashMap<TaskStatus, i64>> = HashMap::new();
        let mut unreleased = Vec::new();
        let mut bad_owner = None;
        store.scan_heads(&mut |r| {
            // Every record's owner is checked, a terminal one's too: one that is not an owner
            // could be neither read, listed nor swept (whole-record decoding refuses it).
            let owner = if r.status.is_terminal() {
                Owner::is_stored_form(&r.owner).then_some(None)
            } else {
                Owner::parse(&r.owner).map(Some)
            };
            let Some(owner) = owner else {
                bad_owner = Some(format!(
                    "record {:?}/{:?}: not an owner: {:?}",
                    r.upstream, r.task_id, r.owner
                ));
                return false;
            };
            if let Some(owner) = owner {
                *live.entry((Arc::from(&*r.upstream), owner)).or_default() += 1;
            }
            let statuses = match by_status.get_mut(&*r.upstream) {
                Some(m) => m,
                None => by_status.entry(r.upstream.to_string()).or_default(),
            };
            *statuses.entry(r.status).or_default() += 1;
            if r.cancelled_at.is_some() && r.released_at.is_none() {
                unreleased.push((r.upstream.into_owned(), r.task_id.into_owned()));
            }
            true
        })?;
        if let Some(bad) = bad_owner {
            return Err(StoreError::Corrupt(bad));
        }
        // A shared store's gauges come from the database, by the sweep lease holder (`sweep`).
        if !store.shared() {
            for (up, statuses) in by_status {
                for (status, n) in statuses {
                    metrics.tasks_set(&up, status, n);
                }
            }
        }
        let quiet = std::time::Duration::from_millis(config.release_quiet_ms);
        metrics
            .tasks_cancelled_unreleased
            .set(unreleased.len() as i64);
        let owners = Owners::new(config.max_live_tasks_per_owner, live);
        // A shared store's records change under this process: nothing is cached (see `cache`).
        let cached = if store.shared() {
            0
        } else {
            config.record_cache_entries
        };
        let cached_bytes = config.record_cache_bytes;
        let threads = offload::StoreThreads::new()
            .map_err(|e| StoreError::Db(format!("the store threads could not start: {e}")))?;
        let registry = Arc::new_cyclic(|weak| Registry {
            store,
            metrics,
            records: cache::RecordCache::new(cached, cached_bytes),
            owners,
            releases: Arc::new(Releases::new(weak.clone(), quiet)),
            config,
            threads,
            telemetry: std::sync::OnceLock::new(),
            leases: std::sync::OnceLock::new(),
            creations: Default::default(),
            refused: Default::default(),
        });
        for (up, id) in unreleased {
            registry
                .releases
                .cancelled(&up, &id, ReleaseReason::Restart);
        }
        Ok(registry)
    }

    /// The "resources released" tracker.
    pub fn releases(&self) -> &Arc<Releases> {
        &self.releases
    }

    /// The creations in flight and the tasks refused unrecorded ([`in_flight`]).
    pub fn creations(&self) -> &in_flight::CreationsInFlight {
        &self.creations
    }

    /// The upstream sent something about a message's task (progress on its token, related-task
    /// `_meta`, a status notification): restarts the release quiet window.
    pub fn note_activity_in(&self, upstream: &Arc<str>, msg: &Value) {
        let params = msg.get("params");
        let mut task_id = None;
        if msg.get("method").and_then(Value::as_str) == Some("notifications/progress") {
            if let Some(token) = params.and_then(|p| p.get("progressToken")) {
                task_id = self.releases.task_of_progress(upstream, &token.to_string());
            }
        }
        if task_id.is_none() {
            task_id = [params, msg.get("result")]
                .into_iter()
                .flatten()
                .find_map(|p| {
                    p.pointer("/_meta/io.modelcontextprotocol~1related-task/taskId")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
        }
        if task_id.is_none()
            && msg.get("method").and_then(Value::as_str) == Some("notifications/tasks/status")
        {
            task_id = params
                .and_then(|p| p.get("taskId"))
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        if let Some(task_id) = task_id {
            if self.releases.activity(upstream, &task_id) {
                self.metrics.task_activity_after_cancel(upstream);
            }
        }
    }

    /// Records the "resources released" audit fact (once).
    fn record_released_now(&self, upstream: &str, task_id: &str, reason: ReleaseReason) {
        let now = now_ms();
        let updated = self.update(upstream, task_id, &mut |r| {
            if r.released_at.is_some() || r.cancelled_at.is_none() {
                return false;
            }
            r.released_at = Some(now);
            true
        });
        let Ok(Some((before, after))) = updated else {
            return;
        };
        if before.released_at.is_some() || after.released_at.is_none() {
            return;
        }
        self.metrics.task_released(upstream, reason);
        self.metrics.tasks_cancelled_unreleased.dec();
        if let Some(c) = after.cancelled_at {
            self.metrics
                .cancelled_to_released_seconds
                .observe(now.saturating_sub(c) as f64 / 1000.0);
        }
        self.audit(
            &after,
            "resources_released",
            format!("reason={}", reason.as_str()),
        );
        self.store.sync_soon();
    }

    /// The store behind the registry, for tests and tools that inspect it off the runtime
    /// (its calls block; layers use the registry's async methods instead).
    pub fn store(&self) -> &Arc<dyn TaskStore> {
        &self.store
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The `[tasks]` settings.
    pub fn config(&self) -> &TasksConfig {
        &self.config
    }

    /// The error a creation over `tasks.max_live_tasks_per_owner` on `upstream` is refused
    /// with (`-32029`, [`McpError::TaskLimitExceeded`]), counted in
    /// `taskgate_task_creation_refused_total{reason="owner_limit"}`: one refusal, whichever
    /// path found the owner at the limit.
    pub fn refuse_over_limit(&self, upstream: &str) -> McpError {
        self.metrics
            .task_creation_refused(upstream, CreationRefusal::OwnerLimit);
        McpError::TaskLimitExceeded {
            limit: self.config.max_live_tasks_per_owner,
            upstream: upstream.to_string(),
        }
    }

    /// Reserves a live-task slot for `owner`; `None` when the owner is at the limit.
    pub fn reserve(&self, upstream: &Arc<str>, owner: &Owner) -> Option<Reservation> {
        self.owners.reserve(upstream, owner)
    }

    /// Reserves a live-task slot for a task-augmented `tools/call` of `owner`; `Ok(None)` when
    /// the owner is at `tasks.max_live_tasks_per_owner`. On a shared store the limit holds across
    /// every replica: the slot is taken in the store
    /// ([`crate::store::SlotStore::reserve_slot`], off the runtime, held at most
    /// [`crate::store::TASK_SLOT_LEASE`]). The reservation is made where the slot is taken,
    /// off the runtime, so a caller gone meanwhile (its client disconnected) drops it there,
    /// which gives the slot back (as [`Registry::admit_creation`]). Errors: the store's
    /// (counted in `taskgate_store_write_failures_total`).
    pub async fn reserve_creation(
        self: &Arc<Self>,
        upstream: &Arc<str>,
        owner: &Owner,
    ) -> Result<Option<Reservation>, StoreError> {
        // A store failed for good (sled after an I/O error) refuses the creation before
        // anything goes upstream: the task could not be recorded (tester4 #1).
        if let Some(why) = self.store.failed() {
            self.metrics.store_write_failed();
            return Err(StoreError::Failed(why));
        }
        if self.store.slots().is_none() {
            return Ok(self.owners.reserve(upstream, owner));
        }
        self.take_store_slot(upstream.clone(), owner.clone(), |r, upstream, owner, id| {
            r.owners
                .reserve_over_limit(upstream, owner)
                .with_store_slot(r.store.clone(), id)
        })
        .await
    }

    /// Holds a 2026-07-28 call that becomes a task to `tasks.max_live_tasks_per_owner`: a live
    /// task the server made of a plain call, before it is recorded (`observe`), or a call
    /// taskgate itself makes a task of, before anything goes upstream (a gateway task, a
    /// reverse-bridged one). `Ok(true)` when `reservation` (the call's provisional slot,
    /// [`Registry::reserve_modern`]) may become the task's, `Ok(false)` when the owner is at
    /// the limit without it (the caller refuses the task, and `observe` cancels it upstream).
    /// At once `Ok(true)` for a slot that is not provisional (a 2025-11-25
    /// creation's, taken within the limit). On a shared store the database counts, as for a
    /// 2025 creation: a slot is taken in the store and the task replaces it when recorded (one
    /// transaction more per 2026 task, none per plain call). The slot is attached to
    /// `reservation` where it is taken, off the runtime: a caller that went away meanwhile (its
    /// client disconnected) leaves the last clone of the reservation there, which gives the
    /// slot back (before: its id was dropped with the caller's future, and the slot counted
    /// against the owner until [`crate::store::TASK_SLOT_LEASE`] lapsed). Errors: the store's
    /// (counted).
    pub async fn admit_creation(
        self: &Arc<Self>,
        reservation: &Arc<Reservation>,
    ) -> Result<bool, StoreError> {
        if !reservation.is_provisional() {
            return Ok(true);
        }
        if self.store.slots().is_none() {
            return Ok(self.owners.admit(reservation, false));
        }
        let held = reservation.clone();
        let (upstream, owner) = reservation.key();
        let attached = self
            .take_store_slot(upstream.clone(), owner.clone(), move |r, _, _, id| {
                held.attach_store_slot(r.store.clone(), id)
            })
            .await?;
        Ok(attached.is_some() && self.owners.admit(reservation, true))
    }

    /// Takes a live-task slot for `owner` on `upstream` in the shared store (the database
    /// counts the owner's tasks and slots across the tier), off the runtime, and there hands
    /// its id to `keep`, which ties it to a reservation: whatever `keep` returns is dropped
    /// there when the caller went away meanwhile, and gives the slot back. `Ok(None)`: the
    /// owner is at `tasks.max_live_tasks_per_owner` (or the store takes no slots). Errors: the
    /// store's (counted as a failed write).
    async fn take_store_slot<T: Send + 'static>(
        self: &Arc<Self>,
        upstream: Arc<str>,
        owner: Owner,
        keep: impl FnOnce(&Registry, &Arc<str>, &Owner, i64) -> T + Send + 'static,
    ) -> Result<Option<T>, StoreError> {
        let limit = self.config.max_live_tasks_per_owner;
        let taken = self
            .try_off_runtime(move |r| {
                let Some(slots) = r.store.slots() else {
                    return Ok(None);
                };
                let taken =
                    slots.reserve_slot(&upstream, &owner, limit, crate::store::TASK_SLOT_LEASE)?;
                Ok(taken.map(|id| keep(r, &upstream, &owner, id)))
            })
            .await
            .and_then(|taken| taken);
        if let Err(e) = &taken {
            self.write_failed(e, "a live-task slot could not be taken");
        }
        taken
    }

    /// How many live-task slots `owner` holds on `upstream`.
    pub fn owners_count(&self, upstream: &str, owner: &Owner) -> usize {
        self.owners.count(upstream, owner)
    }

    /// Whether `taskgate_tasks` moves with what this process sees (an embedded store); a shared
    /// store's is counted in the database (see `sweep`).
    fn counts_own_gauges(&self) -> bool {
        !self.store.shared()
    }

    pub(crate) fn release_slot(&self, upstream: &str, owner: &Owner) {
        self.owners.release(upstream, owner);
    }

    /// [`TaskStore::update`], then the record cache takes the new record if it changed (or
    /// forgets it). Every registry write to an existing record goes through here. The record
    /// after the update is shared with the cache, not copied into it; so is the one before it
    /// when the store swapped against the cached record (`TaskStore::update_from_stored`).
    fn update(
        &self,
        upstream: &str,
        task_id: &str,
        change: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<Option<(Arc<TaskRecord>, Arc<TaskRecord>)>, StoreError> {
        let seen = self.records.epoch();
        // The cached record is the last one this process read or wrote: the store swaps
        // against it instead of reading and decoding the record again (see
        // `TaskStore::update_from`; never cached on a shared store).
        // With the store's bytes of it when the cache has them (see `cache::Entry`).
        let result = match self.records.get_with_form(upstream, task_id) {
            Some((known, form)) => self
                .store
                .update_from_stored(upstream, task_id, &known, form.as_deref(), change)
                .map(|r| {
                    // `None`: the record before was the cached one itself.
                    r.map(|(before, after, form)| (before.map_or(known, Arc::new), after, form))
                }),
            None => self
                .store
                .update(upstream, task_id, change)
                .map(|r| r.map(|(before, after)| (Arc::new(before), after, None))),
        };
        match result {
            Ok(Some((before, after, form))) => {
                let after = Arc::new(after);
                if before != after {
                    // Changed: the next poll finds the new record (see `cache`).
                    self.records.refresh(seen, &after, form);
                }
                Ok(Some((before, after)))
            }
            Ok(None) => {
                self.records.invalidate(upstream, task_id);
                Ok(None)
            }
            Err(e) => {
                // Failed half-way: the cache must not keep what it had.
                self.records.invalidate(upstream, task_id);
                Err(e)
            }
        }
    }

    /// [`TaskStore::remove`], then the record cache forgets the record.
    fn remove(&self, upstream: &str, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        let result = self.store.remove(upstream, task_id);
        self.records.invalidate(upstream, task_id);
        result
    }

    /// A store write failed: counted in `taskgate_store_write_failures_total` and logged.
    /// A store call failed: counted and logged at ERROR, but for work that raced a graceful
    /// stop ([`StoreError::Closed`]): logged at DEBUG only, as a job the stopping store threads
    /// did not run is not counted either ([`Registry::not_run`]).
    fn write_failed(&self, e: &StoreError, what: &str) {
        if !e.is_closed() {
            self.metrics.store_write_failures_total.inc();
        }
        crate::store::log_failure(e, what);
    }

    /// Appends an audit event and logs it with target `taskgate::audit`.
    /// Traces the audit facts through `telemetry` from now on (issue 34; once, at start).
    pub fn trace_with(&self, telemetry: crate::telemetry::Telemetry) {
        let _ = self.telemetry.set(telemetry);
    }

    fn audit(&self, record: &TaskRecord, event: &str, detail: String) {
        if let Some(telemetry) = self.telemetry.get() {
            let fact = match event {
                "status_cancelled" => Some(crate::telemetry::semconv::EVENT_STATUS_CANCELLED),
                "resources_released" => Some(crate::telemetry::semconv::EVENT_RESOURCES_RELEASED),
                _ => None,
            };
            if let Some(fact) = fact {
                let creating = record
                    .trace_parent
                    .as_deref()
                    .and_then(crate::telemetry::restored);
                telemetry.task_fact(fact, &record.task_id, creating.as_ref());
            }
        }
        tracing::info!(
            target: "taskgate::audit",
            upstream = %record.upstream,
            task_id = %record.task_id,
            owner = %record.owner,
            event,
            detail = %detail,
            "task audit event"
        );
        let ev = AuditEvent {
            time: now_ms(),
            upstream: record.upstream.clone(),
            task_id: record.task_id.clone(),
            owner: record.owner.clone(),
            event: event.to_string(),
            detail,
        };
        if let Err(e) = self.store.append_audit(&ev) {
            self.write_failed(&e, "audit append failed");
        }
    }
}
