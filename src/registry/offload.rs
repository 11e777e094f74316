//! The registry's store work, off the runtime: every method here runs its sled calls (reads,
//! transactions, audit appends, scans) with [`tokio::task::spawn_blocking`] and awaits the
//! result, so a sled stall or an fsync never occupies one of the (two, on the target machine)
//! runtime workers.
//!
//! Why `spawn_blocking` and not a store thread of its own: it keeps [`crate::store::TaskStore`]
//! synchronous and small (a PostgreSQL store can do the same, or grow async methods later),
//! lets independent reads run in parallel (sled is thread-safe; one actor thread would queue
//! every `tasks/get` authorisation behind every transaction), and the only place that must wait
//! for the disk (group commit + `fdatasync`) already has its own committer thread.
//!
//! If the runtime is shutting down and the blocking task is cancelled, a read finds nothing and a
//! write is not made (logged).

use super::status::Applied;
use super::{Observed, Registry};
use crate::mcp::task::now_ms;
use crate::store::{Owner, TaskRecord};
use serde_json::Value;
use std::sync::Arc;

impl Registry {
    /// Runs `work` on the blocking pool; `None` if it could not run (runtime shutting down).
    pub(super) async fn off_runtime<T, F>(self: &Arc<Self>, work: F) -> Option<T>
    where
        F: FnOnce(&Registry) -> T + Send + 'static,
        T: Send + 'static,
    {
        let this = self.clone();
        match tokio::task::spawn_blocking(move || work(&this)).await {
            Ok(v) => Some(v),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => {
                tracing::warn!(error = %e, "task store work was not run");
                None
            }
        }
    }

    /// [`Registry::off_runtime`] for work about one task: `work` gets the registry and the task's
    /// `(upstream, taskId)` (owned copies moved to the blocking pool, so callers keep borrows).
    pub(super) async fn off_runtime_about<T, F>(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        work: F,
    ) -> Option<T>
    where
        F: FnOnce(&Registry, &str, &str) -> T + Send + 'static,
        T: Send + 'static,
    {
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
    /// trip; never on a shared store); otherwise read off the runtime and cached.
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
        if let Some(r) = self.records.get(upstream, task_id) {
            return Ok(visible(&r).then_some(r));
        }
        let seen = self.records.epoch();
        let read = self
            .off_runtime_about(upstream, task_id, |r, up, id| r.store.get(up, id))
            .await
            .unwrap_or_else(|| Err(crate::store::StoreError::Db("shutting down".into())));
        match read {
            Ok(Some(r)) => {
                let r = Arc::new(r);
                self.records.fill(seen, &r);
                Ok(visible(&r).then_some(r))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                self.metrics.store_write_failures_total.inc();
                tracing::error!(error = %e, "task store read failed");
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
            .off_runtime(move |r| r.observe_task_now(&up, &task, source))
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
            .off_runtime_about(upstream, task_id, move |r, up, id| {
                r.observe_task_as_now(up, id, &task, source)
            })
            .await;
        self.durable(applied).await
    }

    /// [`Registry::observe_task_as`] of a `Task` already read into [`TaskFields`] (a typed view
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
            .off_runtime_about(upstream, task_id, move |r, up, id| {
                r.apply_status(up, id, report, source)
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
            .off_runtime_about(upstream, task_id, move |r, up, id| {
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
        self.off_runtime_about(upstream, task_id, Registry::request_cancel_now)
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
        self.off_runtime_about(upstream, task_id, move |r, up, id| {
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
                tracing::error!(error = %e, "task store scan failed");
            }
            found
        })
        .await
        .unwrap_or_default()
    }

    /// One page of `owner`'s tasks on `upstream` for `tasks/list`, newest first, after
    /// `cursor` (see [`crate::store::TaskStore::list_owner`]). `Ok(None)` when the cursor is
    /// not one this owner could have been given.
    pub async fn list_page(
        self: &Arc<Self>,
        upstream: &str,
        owner: &Owner,
        cursor: Option<crate::store::ListCursor>,
        limit: usize,
    ) -> Result<Option<ListPage>, crate::store::StoreError> {
        let (up, owner) = (upstream.to_string(), owner.clone());
        self.off_runtime(move |r| {
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
        .unwrap_or_else(|| Err(crate::store::StoreError::Db("shutting down".into())))
    }
}

/// One page of `tasks/list`: the records and the cursor of the next page.
pub type ListPage = (Vec<TaskRecord>, Option<crate::store::ListCursor>);
