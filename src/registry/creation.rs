//! A creation: the record completed from the upstream's `CreateTaskResult` and written durably
//! before that message is passed on.

use super::{Registry, Reservation};
use crate::mcp::task::{format_rfc3339_ms, now_ms, parse_rfc3339_ms, valid_time, TaskStatus};
use crate::metrics::CreationRefusal;
use crate::store::{StoreError, TaskRecord};
use serde_json::Value;

impl Registry {
    /// The record of a new task: `template` completed from the `Task` of a `CreateTaskResult`.
    ///
    /// The upstream's ttl is capped like a requested one (`ttl_ms` and `expires_at` use the
    /// smaller of it and `tasks.max_ttl_ms`; `null` or none means the cap, recorded as such), so
    /// no upstream can make a record outlive the cap, and the client is told the ttl taskgate
    /// keeps the task for. A shorter ttl than the retention floor ([`MIN_RETENTION_MS`]: `0`,
    /// a few ms) is recorded and shown as the upstream gave it, but the record expires at the
    /// floor. A `createdAt` that is not an RFC 3339 time is recorded as taskgate's clock, a
    /// `lastUpdatedAt` that is not one as the `createdAt` recorded (a `tasks/list` shows
    /// what the record holds). `None` when `task` has no string `taskId`.
    pub fn creation_record(&self, template: &TaskRecord, task: &Value) -> Option<TaskRecord> {
        self.creation_record_of(template, &CreatedTask::of(task)?)
    }

    /// [`Registry::creation_record`] of a `Task` read already (by hand, or by
    /// [`CreatedTask::of`]).
    pub fn creation_record_of(
        &self,
        template: &TaskRecord,
        task: &CreatedTask<'_>,
    ) -> Option<TaskRecord> {
        let text = |s: Option<&str>| s.map(str::to_string);
        // An upstream time that is not one is taskgate's clock (`valid_time`): the record, and
        // every `tasks/list` and answer made of it, stays schema-valid.
        let time = |s: Option<&str>| valid_time(s).map(str::to_string);
        let now = now_ms();
        let mut record = template.clone();
        record.task_id = task.task_id.to_string();
        record.status = task
            .status
            .and_then(TaskStatus::parse)
            .unwrap_or(TaskStatus::Working);
        record.status_message = text(task.status_message);
        record.created_at = time(task.created_at).unwrap_or_else(|| format_rfc3339_ms(now));
        record.last_updated_at =
            time(task.last_updated_at).unwrap_or_else(|| record.created_at.clone());
        let cap = self.config.max_ttl_ms;
        // `null` (2025-11-25: unlimited) or none: the record still ends at the cap, so the cap
        // is the ttl recorded and shown to the client (see `observe`'s `show_recorded_ttl`).
        record.ttl_ms = Some(task.ttl.map_or(cap, |t| t.min(cap)));
        record.poll_interval_ms = task.poll_interval;
        record.recorded_at = now;
        if record.status.is_terminal() {
            record.terminal_at = Some(now);
        }
        // The record is kept at least `retention_floor` (an upstream's `ttl: 0` would have it
        // expire at its creation: the client's next `tasks/get` refused though the upstream
        // still answers it); the ttl recorded and shown stays the upstream's.
        let ttl = record
            .ttl_ms
            .unwrap_or(cap)
            .max(retention_floor(task.poll_interval, cap));
        // The upstream's createdAt, unless its clock is off: in the future, or so far in the
        // past that the task would be expired on arrival; then taskgate's clock.
        let created = parse_rfc3339_ms(&record.created_at)
            .filter(|c| *c <= now && now - c < ttl)
            .unwrap_or(now);
        record.expires_at = created.saturating_add(ttl);
        Some(record)
    }

    /// Writes a new record durably and counts it. A live task keeps the owner's `reservation`;
    /// a terminal one, or a failed write, lets it go (the slot is given back when it drops).
    pub async fn record_creation(
        &self,
        record: TaskRecord,
        reservation: &Reservation,
    ) -> Result<(), StoreError> {
        // Shared with the store's write and then the record cache, never copied (issue 36: a
        // copy for the store was ~2,400 instructions and its drop ~900 per creation).
        let record = std::sync::Arc::new(record);
        let up = &*record.upstream;
        let status = record.status;
        let origin = record.origin;
        let slot = reservation.store_slot();
        let seen = self.records.epoch();
        let result = if self.store.quick_point_calls() {
            // No slot to turn into the task: a store with slots is a shared one (PostgreSQL).
            debug_assert!(slot.is_none() || self.store.slots().is_none());
            // sled: the writes on this thread, the group commit awaited (see `Registry::point`).
            self.store.create_stored(record.clone()).await
        } else {
            // The store makes its writes before it waits for the group commit: both on a store
            // thread (`offload`), never on a runtime worker nor on the runtime's blocking pool.
            let (store, copy) = (self.store.clone(), record.clone());
            let handle = tokio::runtime::Handle::current();
            let write = move || match (store.slots(), slot) {
                // The slot taken in a shared store becomes the task in the same transaction.
                (Some(slots), Some(slot)) => handle
                    .block_on(slots.create_in_slot(TaskRecord::clone(&copy), slot))
                    .map(|()| None),
                // With the bytes the store holds, so the record's first update need not encode it.
                _ => handle.block_on(store.create_stored(copy)),
            };
            match self.threads.run(write).await {
                Ok(r) => r,
                Err(why) => Err(StoreError::Db(format!("the write was not run: {why}"))),
            }
        };
        match &result {
            Ok(form) => {
                // The client's first tasks/get follows at once: it finds the record here.
                self.records.fill(seen, &record, form.clone());
                self.metrics.task_created(up, origin);
                if self.counts_own_gauges() {
                    self.metrics.tasks_inc(up, status);
                }
                if !status.is_terminal() {
                    reservation.keep();
                }
                tracing::info!(
                    target: "taskgate::audit",
                    upstream = %up,
                    task_id = %record.task_id,
                    owner = %record.owner,
                    tool = record.tool.as_deref().unwrap_or(""),
                    event = "created",
                    "task created"
                );
            }
            Err(e @ crate::store::StoreError::Conflict(_)) => {
                // The upstream named a task already recorded (break-edge F11): the store is
                // sound, and the request did reach the upstream.
                self.metrics
                    .task_creation_refused(up, CreationRefusal::Duplicate);
                tracing::warn!(error = %e, upstream = %up, task_id = %record.task_id, "the upstream reused a recorded taskId; not handed out");
            }
            Err(e) => {
                self.metrics
                    .task_creation_refused(up, CreationRefusal::Store);
                if e.is_closed() {
                    // A creation that raced a graceful stop (its client gets -32603).
                    tracing::debug!(error = %e, upstream = %up, task_id = %record.task_id, "could not record a task");
                } else {
                    self.metrics.store_write_failures_total.inc();
                    tracing::error!(error = %e, upstream = %up, task_id = %record.task_id, "could not record a task");
                }
            }
        }
        result.map(|_| ())
    }
}

/// The shortest time a task's record is kept from its creation, in ms, whatever ttl the
/// upstream answered: the shortest ttl taskgate asks for (`layers::tasks::MIN_TASK_TTL_MS`,
/// issue 29 #12), and at least the upstream's `pollInterval`, so the client's first poll at the
/// interval it was told still finds the task; never past `tasks.max_ttl_ms` (`cap`).
pub const MIN_RETENTION_MS: u64 = 1_000;

/// The retention floor of a task created with `poll_interval` (see [`MIN_RETENTION_MS`]).
fn retention_floor(poll_interval: Option<u64>, cap: u64) -> u64 {
    poll_interval.unwrap_or(0).max(MIN_RETENTION_MS).min(cap)
}

/// What [`Registry::creation_record`] reads of a `CreateTaskResult`'s `Task`, borrowed: from a
/// `Value` ([`CreatedTask::of`]), or read by hand from its text (`layers::observe`'s one-pass
/// reader, which must make the same of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatedTask<'a> {
    /// `taskId`.
    pub task_id: &'a str,
    /// `status`, when a string.
    pub status: Option<&'a str>,
    /// `statusMessage`, when a string.
    pub status_message: Option<&'a str>,
    /// `createdAt`, when a string (recorded only when an RFC 3339 time, see
    /// [`Registry::creation_record`]).
    pub created_at: Option<&'a str>,
    /// `lastUpdatedAt`, when a string (as `created_at`).
    pub last_updated_at: Option<&'a str>,
    /// `ttl` in whole ms when a number that is one (a fraction rounded up); `None` for `null`,
    /// none, or anything else (the cap then).
    pub ttl: Option<u64>,
    /// `pollInterval` when an integer that fits a `u64`.
    pub poll_interval: Option<u64>,
}

impl<'a> CreatedTask<'a> {
    /// The `Task` object `task`; `None` when it has no string `taskId`.
    pub fn of(task: &'a Value) -> Option<CreatedTask<'a>> {
        let text = |key: &str| task.get(key).and_then(Value::as_str);
        Some(CreatedTask {
            // An empty one, or one holding NUL, names no task taskgate can record.
            task_id: text("taskId").filter(|id| crate::store::recordable_task_id(id))?,
            status: text("status"),
            status_message: text("statusMessage"),
            created_at: text("createdAt"),
            last_updated_at: text("lastUpdatedAt"),
            // A number written as a float (`1000.0`, `1e3`) is a ttl too: whole ms, rounded up.
            ttl: match task.get("ttl") {
                Some(Value::Number(n)) => n
                    .as_u64()
                    .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f.ceil() as u64)),
                _ => None,
            },
            poll_interval: task.get("pollInterval").and_then(Value::as_u64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{retention_floor, MIN_RETENTION_MS};

    /// The floor is `MIN_RETENTION_MS`, or the upstream's `pollInterval` when longer, and never
    /// past the cap.
    #[test]
    fn the_retention_floor_is_the_poll_interval_at_least_and_the_cap_at_most() {
        assert_eq!(retention_floor(None, 60_000), MIN_RETENTION_MS);
        assert_eq!(retention_floor(Some(100), 60_000), MIN_RETENTION_MS);
        assert_eq!(retention_floor(Some(5_000), 60_000), 5_000);
        assert_eq!(retention_floor(Some(u64::MAX), 60_000), 60_000);
        assert_eq!(retention_floor(None, 500), 500);
    }
}
