//! The registry's store work, off the runtime: every method here runs its store calls (reads,
//! writes, audit appends, scans) on the registry's **store threads** ([`StoreThreads`])
//! and awaits the result, so an fsync or a database that does not answer never occupies one of
//! the (two, on the target machine) runtime workers. The exception: a store whose calls about
//! one task are memory work of microseconds (sled:
//! [`crate::store::TaskStore::quick_point_calls`], which says what they can still wait for)
//! has those run on the calling thread ([`Registry::point`]); its scans, sweeps, listings and
//! the session table's stored sessions still come here, and the group commit's `fdatasync`
//! is its committer thread's.
//!
//! **Why threads of their own, not tokio's blocking pool** (issue 29, item 8): the serving
//! runtimes' blocking pool also resolves upstream host names (`TcpStream::connect` of a name
//! runs `getaddrinfo` there). A store call can park its thread for as long as the store's bound
//! (PostgreSQL: a free connection, a new connection and the answer, each within the URL's
//! `connect_timeout`, see `store::pg::bounded`); with the database black-holed, enough
//! concurrent store calls filled that pool, and a plain `tools/call` that needed a new upstream
//! connection queued its DNS look-up behind them and failed with the store's outage although it
//! never touches the store (reproduced in `tests/store_unreachable.rs`). Store work now runs on
//! at most [`STORE_THREADS`] threads of the registry's own, so DNS, the gateway's other blocking
//! work and the runtime workers never wait behind it.
//!
//! **Bounded**: at most [`STORE_QUEUE`] store jobs are queued or running at once; past that a
//! job is refused at once, and a job that waited [`STORE_QUEUE_WAIT`] for a thread is not run:
//! both end like a failed store call (counted in `taskgate_store_write_failures_total`: the
//! registry's, and the session table's a client sees; the caller answers "task
//! store unavailable", or the session's error, where a request depends on it). So a store that
//! does not answer costs at most [`STORE_THREADS`] parked threads, a bounded queue, and each
//! caller a bounded wait.
//!
//! Why threads and not a store thread (actor) of its own: it keeps [`crate::store::TaskStore`]
//! synchronous and small, lets independent reads run in parallel (sled is thread-safe; one
//! actor thread would queue every `tasks/get` authorisation behind every write), and the
//! only place that must wait for the disk (group commit + `fdatasync`) already has its own
//! committer thread.
//!
//! If the store threads are shutting down and a job is dropped, a read finds nothing and a
//! write is not made (logged).

use super::status::Applied;
use super::{Observed, Registry};
use crate::mcp::task::now_ms;
use crate::store::{Owner, StoreError, TaskRecord};
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Threads that run store work at most (started as needed, ended after 10 s idle).
pub const STORE_THREADS: usize = 64;

/// Store jobs queued or running at once at most; past it a job is refused at once.
pub const STORE_QUEUE: usize = 4_096;

/// How long a store job may wait for a free store thread; past it the job is not run.
pub const STORE_QUEUE_WAIT: Duration = Duration::from_secs(5);

/// The registry's store threads (see the module doc): the blocking pool of a runtime of their
/// own, which runs nothing else (it is never driven: only its blocking pool is used). A cheap
/// handle: clones share the threads and their bound, which end when the last clone goes. The
/// session table runs its stored sessions' reads and writes here too
/// (`layers::session::held_store`), so a store that does not answer never fills the serving
/// runtime's blocking pool either way.
#[derive(Clone)]
pub struct StoreThreads {
    inner: Arc<Threads>,
}

struct Threads {
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    /// Jobs queued or running.
    pending: Arc<AtomicUsize>,
}

/// Why a store job did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRun {
    /// `STORE_QUEUE` jobs were already queued or running.
    Busy,
    /// It waited `STORE_QUEUE_WAIT` for a thread.
    Late,
    /// The store threads are shutting down.
    ShuttingDown,
}

impl NotRun {
    /// As the store error a caller reports: [`StoreError::Closed`] when shutting down (work
    /// that raced a graceful stop), else a [`StoreError::Db`] saying why.
    pub fn into_store_error(self) -> StoreError {
        match self {
            NotRun::ShuttingDown => StoreError::Closed,
            why => StoreError::Db(why.to_string()),
        }
    }
}

impl std::fmt::Display for NotRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotRun::Busy => "task store busy: too many store calls queued",
            NotRun::Late => "task store busy: no store thread free in time",
            NotRun::ShuttingDown => "task store shutting down",
        })
    }
}

impl StoreThreads {
    /// Starts no thread yet (they start with the first jobs).
    ///
    /// Errors: the OS refused the runtime's resources (its I/O driver is not enabled; this
    /// only fails where a thread or an event fd cannot be had).
    pub fn new() -> std::io::Result<StoreThreads> {
        StoreThreads::with_max(STORE_THREADS)
    }

    /// [`Self::new`] with at most `threads` store threads (tests: a burst's bound).
    pub fn with_max(threads: usize) -> std::io::Result<StoreThreads> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(threads.max(1))
            .thread_name("tg-store")
            .build()?;
        Ok(StoreThreads {
            inner: Arc::new(Threads {
                handle: runtime.handle().clone(),
                runtime: Some(runtime),
                pending: Arc::new(AtomicUsize::new(0)),
            }),
        })
    }

    /// Runs `work` on a store thread and waits for it (see the module doc for the bounds).
    ///
    /// Errors: [`NotRun`] when it did not run (the queue was full, it waited
    /// `STORE_QUEUE_WAIT` for a thread, or the threads are shutting down). A panic in `work`
    /// is resumed here.
    pub async fn run<T, F>(&self, work: F) -> Result<T, NotRun>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        match self.queue(work, false)?.await {
            Ok(v) => v,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(NotRun::ShuttingDown),
        }
    }

    /// Queues `work` on a store thread without waiting for it (in the background: what it
    /// does is its own to log). Errors: [`NotRun::Busy`] when the queue is full (it is then
    /// not run); a job that waits too long for a thread is dropped unrun as in [`Self::run`],
    /// and logged here (nobody waits for it to say so).
    pub fn spawn<F>(&self, work: F) -> Result<(), NotRun>
    where
        F: FnOnce() + Send + 'static,
    {
        self.queue(work, true).map(drop)
    }

    /// The job of [`Self::run`] and [`Self::spawn`]: counted against [`STORE_QUEUE`], dropped
    /// unrun after [`STORE_QUEUE_WAIT`] in the queue (logged when `log_late`).
    fn queue<T, F>(
        &self,
        work: F,
        log_late: bool,
    ) -> Result<tokio::task::JoinHandle<Result<T, NotRun>>, NotRun>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let inner = &self.inner;
        if inner.pending.fetch_add(1, Ordering::SeqCst) >= STORE_QUEUE {
            inner.pending.fetch_sub(1, Ordering::SeqCst);
            return Err(NotRun::Busy);
        }
        let pending = inner.pending.clone();
        let queued = Instant::now();
        // The work sees the caller's runtime as its own, as it did on that runtime's blocking
        // pool: what it spawns (the release tracker's waiters) runs there, never on the store
        // threads' runtime, which is not driven.
        let caller = tokio::runtime::Handle::try_current().ok();
        Ok(inner.handle.spawn_blocking(move || {
            let _done = Done(pending);
            if queued.elapsed() > STORE_QUEUE_WAIT {
                if log_late {
                    tracing::warn!(reason = %NotRun::Late, "background task store work was not run");
                }
                return Err(NotRun::Late);
            }
            let _entered = caller.as_ref().map(tokio::runtime::Handle::enter);
            Ok(work())
        }))
    }
}

/// Counts a store job done however it ends (run, skipped, panicked).
struct Done(Arc<AtomicUsize>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            // Never blocks (the registry may be dropped on a runtime worker).
            rt.shutdown_background();
        }
    }
}

impl Registry {
    /// Runs `work` on the store threads; `None` if it did not run (busy, see the module doc, or
    /// shutting down; counted and logged).
    pub(super) async fn off_runtime<T, F>(self: &Arc<Self>, work: F) -> Option<T>
    where
        F: FnOnce(&Registry) -> T + Send + 'static,
        T: Send + 'static,
    {
        let this = self.clone();
        match self.threads.run(move || work(&this)).await {
            Ok(v) => Some(v),
            Err(why) => {
                self.not_run(why);
                None
            }
        }
    }

    /// [`Registry::off_runtime`] for work whose caller counts its failures itself: why it did
    /// not run as a [`StoreError::Db`] ([`StoreError::Closed`] when the store threads are
    /// shutting down), neither counted nor logged here.
    pub(super) async fn try_off_runtime<T, F>(self: &Arc<Self>, work: F) -> Result<T, StoreError>
    where
        F: FnOnce(&Registry) -> T + Send + 'static,
        T: Send + 'static,
    {
        let this = self.clone();
        self.threads
            .run(move || work(&this))
            .await
            .map_err(NotRun::into_store_error)
    }

    /// The store threads, for store work outside the registry that must stay off the serving
    /// runtime too (the session table's stored sessions).
    pub fn store_threads(&self) -> StoreThreads {
        self.threads.clone()
    }

    /// A store job that did not run: counted like a failed store call (unless shutting down)
    /// and logged.
    pub(super) fn not_run(&self, why: NotRun) {
        if why == NotRun::ShuttingDown {
            // Work that raced a graceful stop: not a fault (see `StoreError::Closed`).
            tracing::debug!(reason = %why, "task store work was not run");
            return;
        }
        self.metrics.store_write_failures_total.inc();
        tracing::warn!(reason = %why, "task store work was not run");
    }

    /// Runs `work`, store calls about one task, where the store says they belong
    /// ([`crate::store::TaskStore::quick_point_calls`]): on this thread for sled, whose point
    /// calls are memory work done in microseconds; on the store threads otherwise, as
    /// [`Registry::off_runtime`] does.
    ///
    /// Why not the store threads for sled too: in the 2025 task lifecycle (c=16) those threads
    /// took 17 % of taskgate's CPU, most of it waking a thread and putting it back to sleep for
    /// each of a task's three store trips, against a few microseconds of tree work (perf,
    /// issue 36). The commit's `fdatasync` stays off the runtime, on the committer thread,
    /// awaited. sled's global lock does not hold these calls up behind a flush: it blocks only
    /// after a sled transaction, and taskgate's sled code runs none (`SledStore`'s
    /// `quick_point_calls` says what a call can still wait for: a read of an evicted page).
    pub(super) async fn point<T, F>(self: &Arc<Self>, work: F) -> Option<T>
    where
        F: FnOnce(&Registry) -> T + Send + 'static,
        T: Send + 'static,
    {
        if self.store.quick_point_calls() {
            return Some(work(self));
        }
        self.off_runtime(work).await
    }

    /// [`Registry::point`] for work about one task: `work` gets the registry and the task's
    /// `(upstream, taskId)` (owned copies moved to a store thread when it goes there, so
    /// callers keep borrows).
    pub(super) async fn point_about<T, F>(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        work: F,
    ) -> Option<T>
    where
        F: FnOnce(&Registry, &str, &str) -> T + Send + 'static,
        T: Send + 'static,
    {
        if self.store.quick_point_calls() {
            return Some(work(self, upstream, task_id));
        }
        let (up, id) = (upstream.to_string(), task_id.to_string());
        self.off_runtime(move |r| work(r, &up, &id)).await
    }

    /// The record of a task if `owner` may see it now; `None` for unknown, expired or foreign,
    /// and when the store read fails (logged; see [`Registry::lookup_checked`]).
    pub async fn lookup(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        owner: &Owner,
    ) -> Option<Arc<TaskRecord>> {
        self.lookup_checked(upstream, task_id, owner)
            .await
            .ok()
            .flatten()
    }

    /// [`Registry::lookup`] that tells a failed store read apart (counted in
    /// `taskgate_store_write_failures_total` and logged), so the caller answers `-32603` and not
    /// "not found". Served from the record cache when it holds the record (no blocking-pool
    /// trip; never on a shared store); otherwise read (see `Registry::point`) and cached.
    ///
    /// The record is shared with the cache, not copied: a tasks/get hands it to the layers
    /// below and `observe` compares the answer with it (two whole-record clones per request
    /// before, most of `TaskRecord::clone` in the lifecycle profile, issue 15).
    pub async fn lookup_checked(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        owner: &Owner,
    ) -> Result<Option<Arc<TaskRecord>>, crate::store::StoreError> {
        let visible = |r: &TaskRecord| r.owner == *owner && !r.is_expired(now_ms());
        Ok(self
            .record_cached(upstream, task_id)
            .await?
            .filter(|r| visible(r)))
    }

    /// The record of a task, whoever owns it, expired or not: from the record cache when it
    /// holds it, else read and cached. Errors: the store read failed (counted in
    /// `taskgate_store_write_failures_total` and logged).
    pub async fn record_cached(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
    ) -> Result<Option<Arc<TaskRecord>>, crate::store::StoreError> {
        // Never recorded (`recordable_task_id`): not asked of the store, where PostgreSQL took
        // a NUL for a database error.
        if !crate::store::recordable_task_id(task_id) {
            return Ok(None);
        }
        if let Some(r) = self.records.get(upstream, task_id) {
            return Ok(Some(r));
        }
        let seen = self.records.epoch();
        let read = self.try_record_of(upstream, task_id).await;
        match read {
            Ok(Some(r)) => {
                let r = Arc::new(r);
                self.records.fill(seen, &r, None);
                Ok(Some(r))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                self.write_failed(&e, "task store read failed");
                Err(e)
            }
        }
    }

    /// Applies a status report (a `Task` object naming its `taskId`: a
    /// `notifications/tasks/status`'s params) to the record of `(upstream, taskId)`.
    pub async fn observe_task(
        self: &Arc<Self>,
        upstream: &str,
        task: Value,
        source: &'static str,
    ) -> Observed {
        let up = upstream.to_string();
        let applied = self
            .point(move |r| r.observe_task_now(&up, &task, source))
            .await;
        self.durable(applied).await
    }

    /// Applies a status report about `task_id` (a reply to a request about that task: its own
    /// `taskId`, if any, is not trusted to name another task).
    pub async fn observe_task_as(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        task: Value,
        source: &'static str,
    ) -> Observed {
        let applied = self
            .point_about(upstream, task_id, move |r, up, id| {
                r.observe_task_as_now(up, id, &task, source)
            })
            .await;
        self.durable(applied).await
    }

    /// [`Registry::observe_task_as`] of a terminal 2026-07-28 `tasks/get` answer (or a terminal
    /// `notifications/tasks`: `source`) that also keeps `result` (the answer's whole `result`,
    /// the `DetailedTask` a later `tasks/get` is answered with, JSON text) in the record, in the same store update
    /// and under the same durable sync as the terminal status (kept as
    /// [`Registry::store_terminal_result`] keeps it: once, in a record holding the reported
    /// terminal status, at most `tasks.max_stored_result_bytes`).
    ///
    /// Why: storing the result apart was a second update of the record (read, decode, encode,
    /// write: about 48,000 instructions) and a second store call per task (issue 36).
    ///
    /// A terminal report a shared store refuses is written again as `on_refusal` says
    /// ([`super::OnRefusal`]).
    pub async fn observe_task_with_result(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        task: Value,
        result: String,
        source: &'static str,
        on_refusal: super::OnRefusal,
    ) -> Observed {
        let applied = self
            .point_about(upstream, task_id, move |r, up, id| {
                let result = Some(result);
                r.observe_task_with_result_now(up, id, &task, source, result, None, on_refusal)
            })
            .await;
        self.durable(applied).await
    }

    /// [`Registry::store_terminal_result`] on disk before it returns, when it stored (the
    /// store's sync awaited): for a result taskgate serves from the record from then on, kept
    /// after its terminal status was recorded (a 2026-07-28 `tasks/get` carrying the result of
    /// a task a `notifications/tasks` had reported `completed`: review 19b #1, it went to the
    /// next group commit). Returns whether it stored.
    pub async fn keep_terminal_result(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        status: Option<crate::mcp::task::TaskStatus>,
        result_json: String,
    ) -> bool {
        let stored = self
            .store_terminal_result(upstream, task_id, status, result_json)
            .await;
        if stored {
            self.sync_terminal().await;
        }
        stored
    }

    /// [`Registry::observe_task_as`] of a `failed` report that also keeps `error` (the JSON-RPC
    /// `error` object a 2025-11-25 gateway task failed with, JSON text) in the record, in the
    /// same store update and under the same durable sync as the status (kept as
    /// [`Registry::store_terminal_error`] keeps it: once, in a record `failed` without one,
    /// whether this report or an earlier one failed it, at most
    /// `tasks.max_stored_result_bytes`).
    ///
    /// Why: a gateway task's outcome is held by taskgate alone (the upstream got a plain call);
    /// written after its status, a crash between the two writes left a durable `failed` task
    /// whose error was nowhere (review 19 #2).
    ///
    /// A report a shared store refuses is written again as `on_refusal` says
    /// ([`super::OnRefusal`]).
    pub async fn observe_task_with_error(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        task: Value,
        error: String,
        source: &'static str,
        on_refusal: super::OnRefusal,
    ) -> Observed {
        let applied = self
            .point_about(upstream, task_id, move |r, up, id| {
                let error = r.keeps_result(&error).then_some(error);
                r.observe_task_with_result_now(up, id, &task, source, None, error, on_refusal)
            })
            .await;
        self.durable(applied).await
    }

    /// [`Registry::observe_task_as`] of a `Task` already read into [`TaskFields`](super::status::TaskFields) (a typed view
    /// of the reply, no `Value` tree): the same report, applied the same way.
    pub async fn observe_fields_as(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        task: &super::TaskFields<'_>,
        source: &'static str,
    ) -> Observed {
        let Some(report) = super::status::Report::of_fields(task) else {
            return Observed::Unknown;
        };
        let applied = self
            .point_about(upstream, task_id, move |r, up, id| {
                r.apply_status(up, id, report, source, super::OnRefusal::Keep)
            })
            .await;
        self.durable(applied).await
    }

    /// Waits until a status that just became terminal is on disk (group commit + `fdatasync`)
    /// before the message that reported it is passed on; a status that changed otherwise is
    /// synced soon. A failed sync is logged and counted: the message still goes on (the
    /// upstream's word stands; the record is only less durable).
    async fn durable(self: &Arc<Self>, applied: Option<Applied>) -> Observed {
        let Some((observed, terminal_now)) = applied else {
            return Observed::Unknown;
        };
        if terminal_now {
            self.sync_terminal().await;
        }
        observed
    }

    async fn sync_terminal(&self) {
        if let Err(e) = self.store.sync().await {
            self.write_failed(&e, "a terminal status could not be made durable");
        }
    }

    /// A `tasks/result` payload arrived for `task_id` (see `apply_result_payload_now`).
    pub async fn apply_result_payload(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        failed: bool,
    ) {
        let terminal_now = self
            .point_about(upstream, task_id, move |r, up, id| {
                r.apply_result_payload_now(up, id, failed)
            })
            .await;
        if terminal_now == Some(true) {
            self.sync_terminal().await;
        }
    }

    /// Records that a `tasks/cancel` for the task goes upstream (`cancel_requested_at`, set
    /// once, and a `cancel_requested` audit event); one store update. Returns the record after it.
    pub async fn request_cancel(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
    ) -> Option<Arc<TaskRecord>> {
        self.point_about(upstream, task_id, Registry::request_cancel_now)
            .await
            .flatten()
    }

    /// Records the "resources released" audit fact (once).
    pub async fn record_released(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        reason: crate::metrics::ReleaseReason,
    ) {
        self.point_about(upstream, task_id, move |r, up, id| {
            r.record_released_now(up, id, reason)
        })
        .await;
    }

    /// Removes records whose ttl is over; returns how many were removed.
    pub async fn sweep(self: &Arc<Self>) -> usize {
        self.off_runtime(Registry::sweep_now).await.unwrap_or(0)
    }

    /// Non-terminal tasks of `upstream` created by taskgate's upgrade (orphans after a restart).
    pub async fn upgraded_live(self: &Arc<Self>, upstream: &str) -> Vec<TaskRecord> {
        let up = upstream.to_string();
        self.off_runtime(move |r| {
            let mut found = Vec::new();
            let scanned = r.store.scan(&mut |rec| {
                if rec.origin == crate::store::Origin::Upgraded
                    && !rec.status.is_terminal()
                    && rec.upstream == up
                {
                    found.push(rec);
                }
                true
            });
            if let Err(e) = scanned {
                crate::store::log_failure(&e, "task store scan failed");
            }
            found
        })
        .await
        .unwrap_or_default()
    }

    /// One page of `owner`'s tasks on `upstream` for `tasks/list`, newest first, after
    /// `cursor` (see [`crate::store::TaskStore::list_owner`]). `Ok(None)` when the cursor is
    /// not one this owner could have been given. Errors: the store's (counted in
    /// `taskgate_store_write_failures_total` and logged, as a failed read of one record is).
    pub async fn list_page(
        self: &Arc<Self>,
        upstream: &str,
        owner: &Owner,
        cursor: Option<crate::store::ListCursor>,
        limit: usize,
    ) -> Result<Option<ListPage>, crate::store::StoreError> {
        let (up, owner) = (upstream.to_string(), owner.clone());
        let listed = self
            .try_off_runtime(move |r| {
                if let Some(c) = &cursor {
                    if !r.store.cursor_is_valid(&up, &owner, c) {
                        return Ok(None);
                    }
                }
                r.store
                    .list_owner(&up, &owner, cursor.as_ref(), limit)
                    .map(Some)
            })
            .await
            .and_then(|listed| listed);
        if let Err(e) = &listed {
            self.write_failed(e, "a tasks/list page could not be read");
        }
        listed
    }
}

/// One page of `tasks/list`: the records and the cursor of the next page.
pub type ListPage = (Vec<TaskRecord>, Option<crate::store::ListCursor>);

#[cfg(test)]
#[path = "offload_tests.rs"]
mod tests;
