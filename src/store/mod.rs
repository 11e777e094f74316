//! Task storage: the [`TaskStore`] trait, its embedded sled implementation (the default) and its
//! PostgreSQL implementation for a tier of replicas sharing one registry (the status machine over
//! it is [`crate::registry`]).
//!
//! The trait is narrow on purpose (another embedded store, redb for one, could replace sled).
//! A store [`TaskStore::shared`] by several processes adds the cross-replica cancel claim and
//! sweep lease ([`shared`]). Reads and in-place updates are synchronous and fast, but they block: callers on the
//! runtime go through [`crate::registry::Registry`], which runs them on the blocking pool.
//! [`TaskStore::create`] and [`TaskStore::sync`] return only once what was written is on disk
//! (flush + `fdatasync`).

pub mod held;
pub mod lease;
pub mod pg;
pub mod record;
pub mod shared;
pub mod sled_store;

pub use held::{HeldSessionRecord, HeldSessionStore};
pub use lease::{Adopted, LeaseKind, LeaseStore};
pub use pg::PgStore;
pub use record::{recordable_task_id, AuditEvent, Origin, Owner, RecordHead, TaskRecord};
pub use shared::{
    cancel_lease, CancelClaim, CancelProgress, SharedCancelOutcome, CANCEL_LEASE_MARGIN,
};
pub use sled_store::{CommitObserver, SledStore};

use crate::mcp::task::TaskStatus;
use futures_util::future::BoxFuture;

/// Why the store failed. Mapped to JSON-RPC `-32603` when a client request depends on it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened (for example another taskgate holds its lock).
    #[error("cannot open the task store at {path}: {detail}")]
    Open {
        /// The configured path.
        path: String,
        /// sled's message (it names the lock when another process holds it).
        detail: String,
    },
    /// A read or write failed.
    #[error("task store error: {0}")]
    Db(String),
    /// `create` of a `(upstream, taskId)` that is already recorded (an upstream reusing an id).
    #[error("taskId {0:?} is already recorded for this upstream; a taskId is never reused")]
    Conflict(String),
    /// A stored value could not be decoded.
    #[error("task store holds a corrupt record: {0}")]
    Corrupt(String),
    /// A value past one of the store's bounds (a held session's capabilities larger than its
    /// limit, ...): not written, nothing else touched. The caller's value is at fault, not the
    /// store: it never fails the store (`sled_store::failure`).
    #[error("not written to the task store: {0}")]
    TooLarge(String),
    /// The store was closed by taskgate's graceful shutdown (or its store threads are stopping):
    /// work that raced the stop asked for a commit no longer made. Not a fault of the store:
    /// logged at DEBUG ([`log_failure`]), not counted as a store failure.
    #[error("the task store is closed (taskgate is shutting down)")]
    Closed,
    /// The store failed for good in this process (sled after an I/O error, or a group commit
    /// that did not finish within its deadline: `sled_store::failure`); the reason is the first
    /// failure's. Every later call fails at once with it, until taskgate is restarted.
    #[error("the task store failed and does not recover until taskgate is restarted: {0}; restart taskgate")]
    Failed(String),
}

impl StoreError {
    /// Whether this is [`StoreError::Closed`]: work that raced a graceful stop.
    pub fn is_closed(&self) -> bool {
        matches!(self, StoreError::Closed)
    }
}

/// Logs a failed store call, `what` with the error: at ERROR, but at DEBUG for
/// [`StoreError::Closed`] (background work that raced a graceful stop ends quietly; every stop
/// logged it as a store error before).
pub fn log_failure(e: &StoreError, what: &str) {
    if e.is_closed() {
        tracing::debug!(error = %e, "{what}");
    } else {
        tracing::error!(error = %e, "{what}");
    }
}

pub use sled_store::StoredForm;

/// What [`TaskStore::update_from_stored`] returns: the record before the update (`None`: it was
/// exactly the caller's `known`, which is not copied to say so), the record after it, and the
/// bytes the store now holds for `after` when it has them.
pub type UpdatedStored = Option<(Option<TaskRecord>, TaskRecord, Option<StoredForm>)>;

/// A position in an owner's `tasks/list`, opaque to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor(pub Vec<u8>);

/// The task registry.
pub trait TaskStore: HeldSessionStore + Send + Sync + 'static {
    /// Inserts a new record and returns once it is durable. Fails with [`StoreError::Conflict`]
    /// when the key is already recorded (nothing is overwritten).
    fn create(&self, record: TaskRecord) -> BoxFuture<'_, Result<(), StoreError>>;

    /// [`TaskStore::create`] that also returns the bytes the store now holds for the record
    /// (see [`TaskStore::update_from_stored`]); `None` from a store that does not compare
    /// records by their bytes (the default).
    /// The record is shared, not moved: the caller keeps it (the registry's record cache), and
    /// a store that only reads it (sled) need not copy it; the default copies it when it is
    /// shared.
    fn create_stored(
        &self,
        record: std::sync::Arc<TaskRecord>,
    ) -> BoxFuture<'_, Result<Option<StoredForm>, StoreError>> {
        let created = self.create(std::sync::Arc::unwrap_or_clone(record));
        Box::pin(async move { created.await.map(|()| None) })
    }

    /// The record of `(upstream, task_id)`, expired or not.
    fn get(&self, upstream: &str, task_id: &str) -> Result<Option<TaskRecord>, StoreError>;

    /// Atomically applies `change` to the record; `change` returns false to leave it as it was.
    /// `change` may run more than once for one call (sled re-reads the record and applies it
    /// again when another change won the compare-and-swap meanwhile; PostgreSQL likewise): it
    /// must compute the same change from the same record every time and have no other effect.
    /// Returns `(before, after)` when a record exists. Made durable by the next group commit
    /// (call [`TaskStore::sync`] to wait for it).
    fn update(
        &self,
        upstream: &str,
        task_id: &str,
        change: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<Option<(TaskRecord, TaskRecord)>, StoreError>;

    /// [`TaskStore::update`] for a caller that holds `known`, the record as this process last
    /// read or wrote it (the registry's record cache): a store may apply `change` to `known`
    /// and write the result only if the stored record is still exactly `known` (else it does
    /// what `update` does). Same contract and result as `update`. The default is `update`.
    fn update_from(
        &self,
        upstream: &str,
        task_id: &str,
        known: &TaskRecord,
        change: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<Option<(TaskRecord, TaskRecord)>, StoreError> {
        let _ = known;
        self.update(upstream, task_id, change)
    }

    /// [`TaskStore::update_from`] for a caller that may also hold `known_form`, the bytes a
    /// `create_stored` or `update_from_stored` call returned together with `known` (never
    /// another record's): the store need not encode `known` again to compare with what it
    /// holds. Also returns the bytes it holds for the record after the update, when it has
    /// them. Same contract and records as `update_from`, but the record before the update is
    /// `None` when it was exactly `known` (the caller holds it: no copy is made to return it).
    /// The default is `update_from`, without bytes.
    fn update_from_stored(
        &self,
        upstream: &str,
        task_id: &str,
        known: &TaskRecord,
        known_form: Option<&[u8]>,
        change: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<UpdatedStored, StoreError> {
        let _ = known_form;
        let updated = self.update_from(upstream, task_id, known, change)?;
        Ok(updated.map(|(before, after)| (Some(before), after, None)))
    }

    /// Removes a record, its index entries and its audit events.
    fn remove(&self, upstream: &str, task_id: &str) -> Result<Option<TaskRecord>, StoreError>;

    /// One page of `owner`'s records on `upstream`, newest first, starting after `cursor`.
    /// Returns the page and the cursor of the next page, if more remain.
    fn list_owner(
        &self,
        upstream: &str,
        owner: &Owner,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<(Vec<TaskRecord>, Option<ListCursor>), StoreError>;

    /// Whether `cursor` is one this store could have issued for `(upstream, owner)`.
    fn cursor_is_valid(&self, upstream: &str, owner: &Owner, cursor: &ListCursor) -> bool;

    /// Keys `(upstream, task_id)` of records expired at `now_ms`, oldest first, at most `limit`.
    fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<(String, String)>, StoreError>;

    /// Calls `visit` with every record until it returns false.
    fn scan(&self, visit: &mut dyn FnMut(TaskRecord) -> bool) -> Result<(), StoreError>;

    /// [`TaskStore::scan`] of what start-up counting needs ([`RecordHead`]), in the same order.
    /// The default decodes whole records; the embedded store decodes only the head, and
    /// PostgreSQL reads only the head's columns (a page of whole records, stored results and
    /// all, could not come within its query bound over a slow link: `pg::bounded`).
    fn scan_heads(&self, visit: &mut dyn FnMut(RecordHead<'_>) -> bool) -> Result<(), StoreError> {
        self.scan(&mut |r| visit(RecordHead::of(&r)))
    }

    /// Appends an audit event (durable with the next group commit).
    fn append_audit(&self, event: &AuditEvent) -> Result<(), StoreError>;

    /// The audit events of one task, oldest first.
    fn audit_for(&self, upstream: &str, task_id: &str) -> Result<Vec<AuditEvent>, StoreError>;

    /// Returns once every write made before the call is durable.
    fn sync(&self) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Asks for a group commit soon without waiting for it.
    fn sync_soon(&self);

    /// True when other processes share this store (PostgreSQL): records may change under this
    /// process, so nothing mutable is cached, and cancels and sweeps are coordinated through
    /// the store. False (the default) for an embedded store one process owns.
    fn shared(&self) -> bool {
        false
    }

    /// True when a call about one task ([`TaskStore::get`], [`TaskStore::update`] and its
    /// variants, [`TaskStore::append_audit`], the writes of [`TaskStore::create`] before its
    /// commit) is work in this process on memory and local files, done in microseconds, that
    /// never waits on a network (the commit's `fdatasync` is awaited apart): the registry then
    /// makes those calls on the calling thread, a serving thread's single-threaded runtime,
    /// instead of handing each to its store threads (`registry::offload`). False (the
    /// default): every call goes to the store threads (PostgreSQL: a call may wait on the
    /// database). Only the registry's calls about one task rely on it; scans, sweeps and the
    /// session table's stored sessions always go to the store threads.
    fn quick_point_calls(&self) -> bool {
        false
    }

    /// Why the store failed for good in this process, once it has (sled after an I/O error:
    /// `sled_store::failure`): `/healthz` and `/readyz` then answer 503 naming it, and
    /// `taskgate_store_failed` is 1. `None` (the default): the store may still answer (a
    /// PostgreSQL outage ends when the database is back).
    fn failed(&self) -> Option<String> {
        None
    }

    /// Checks that the store answers (`/readyz`); an embedded store always does.
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    /// Shared stores: decides whether this process forwards a `tasks/cancel` for the task (see
    /// [`CancelClaim`]). The default (one process) always forwards: the `cancel` layer's
    /// in-process single flight is the whole story there.
    fn claim_cancel(
        &self,
        _upstream: &str,
        _task_id: &str,
        _modern: bool,
        _lease: std::time::Duration,
    ) -> Result<CancelClaim, StoreError> {
        Ok(CancelClaim::Forward { generation: 0 })
    }

    /// Shared stores: stores the outcome of the cancel claimed as `generation`, for the processes
    /// waiting on it, and ends the claim.
    fn finish_cancel(
        &self,
        _upstream: &str,
        _task_id: &str,
        _generation: i64,
        _outcome: &SharedCancelOutcome,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// Shared stores: extends the lease of cancel claim `generation`, which this process holds,
    /// to `lease` from now (the store's clock), so the claim holds for as long as its forward
    /// runs, the store writes before the upstream call included (issue 29, item 7). `Ok(false)`
    /// when the claim is no longer this process's (its outcome is stored, or another process
    /// took a newer claim after it lapsed): nothing changed. The default (one process): `true`.
    ///
    /// Errors: the store's (the lease is then not extended).
    fn renew_cancel(
        &self,
        _upstream: &str,
        _task_id: &str,
        _generation: i64,
        _lease: std::time::Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(async { Ok(true) })
    }

    /// Shared stores: where cancel claim `generation` stands (see [`CancelProgress`]): in
    /// flight, lapsed (claim again), or done with its outcome. The default (one process): in
    /// flight (no process ever waits on another's claim there).
    fn cancel_outcome(
        &self,
        _upstream: &str,
        _task_id: &str,
        _generation: i64,
    ) -> Result<CancelProgress, StoreError> {
        Ok(CancelProgress::InFlight)
    }

    /// The right to run the TTL sweep now; `None` when another process holds it. A shared store
    /// may keep the right past the returned guard (PostgreSQL keeps it for the life of the
    /// process, so one replica sweeps and exports the shared gauges until it goes away). The
    /// default (one process) always grants it.
    fn sweep_lease(&self) -> Result<Option<Box<dyn Send>>, StoreError> {
        Ok(Some(Box::new(())))
    }

    /// Shared stores: the live-task slots and status counts kept in the store
    /// ([`SlotStore`]). `None` (the default, one process): the registry's in-process count of
    /// live tasks per owner and its own view of the task gauges are the whole story.
    fn slots(&self) -> Option<&dyn SlotStore> {
        None
    }

    /// The call leases ([`lease`]): which process holds or follows the upstream call of a task.
    /// `None` (the default) for a store that keeps none; sled keeps them in memory, PostgreSQL
    /// in `taskgate_leases`.
    fn leases(&self) -> Option<&dyn LeaseStore> {
        None
    }
}

/// What a store shared by a tier of processes (PostgreSQL) adds so that
/// `tasks.max_live_tasks_per_owner` holds across the tier and the task gauges count each record
/// once: reached through [`TaskStore::slots`].
pub trait SlotStore: Send + Sync {
    /// Takes one of `owner`'s live-task slots on `upstream` (for a task-augmented `tools/call`
    /// about to go upstream) so that `limit` (`tasks.max_live_tasks_per_owner`) holds across
    /// every process sharing the store: the owner's live tasks and the slots held by all
    /// processes are counted atomically with the taking. Returns the slot's id, `None` at the
    /// limit. A slot ends as the task ([`SlotStore::create_in_slot`]), with
    /// [`SlotStore::release_slot`], or when `lease` is over (a process that died holding it).
    fn reserve_slot(
        &self,
        upstream: &str,
        owner: &Owner,
        limit: usize,
        lease: std::time::Duration,
    ) -> Result<Option<i64>, StoreError>;

    /// Gives slot `slot` of [`SlotStore::reserve_slot`] back, without waiting (a failure leaves
    /// it to its lease).
    fn release_slot(&self, slot: i64);

    /// [`TaskStore::create`] of the task that slot `slot` was taken for: the slot becomes the
    /// task in one transaction (the owner's count never dips or doubles).
    fn create_in_slot(
        &self,
        record: TaskRecord,
        slot: i64,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// The records per `(upstream, status)` counted in the store, for the task gauges of the
    /// process that holds the sweep lease.
    fn count_by_status(&self) -> Result<StatusCounts, StoreError>;
}

/// Records per `(upstream, status)`: [`SlotStore::count_by_status`].
pub type StatusCounts = Vec<(String, TaskStatus, i64)>;

/// How long a live-task slot taken in a shared store ([`SlotStore::reserve_slot`]) counts while
/// its creation is in flight: a replica killed between taking it and recording the task holds it
/// no longer than this; a `CreateTaskResult` slower than this no longer holds a slot while it is
/// awaited (the limit is then soft for that one creation).
pub const TASK_SLOT_LEASE: std::time::Duration = std::time::Duration::from_secs(120);
