//! The sled store's failure, sticky: set once, at the first I/O error sled or a group commit
//! reports, or at a group commit not finished within [`COMMIT_DEADLINE`]; never cleared in this
//! process.
//!
//! Why sticky (sled 0.34.7, as observed with taskgate on a full tmpfs and on a store directory
//! made read-only, tester4 findings 1 and 2): after one I/O error of its log (ENOSPC writing a
//! large value, EACCES creating a blob file) sled sets a global error and does not recover in
//! the process, whatever space or permission comes back: every later write fails with that
//! error, and `Db::flush` (the committer's group commit) can wait forever for a log position
//! that is never made stable (`make_stable` on its condition variable), so every request that
//! waited on a commit hung, `/readyz` said "ok", and the graceful stop waited forever to join
//! the committer. Once failed, the store answers every call at once with
//! [`StoreError::Failed`] (naming the first failure and "restart taskgate"), touches sled no
//! more, and `/healthz` and `/readyz` answer 503 so an orchestrator restarts the process:
//! sled's log recovers what was committed before the failure at the next start.

use super::StoreError;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How long a write waits for its group commit (flush, blob files' `fsync`, `fdatasync`)
/// before the store is taken for failed. Why 10 s: a commit takes milliseconds on a healthy
/// disk (`taskgate_store_write_duration_seconds`; `benches/RESULTS.md`), and a disk that takes
/// seconds for one is failing already; 10 s still answers well within a client's usual request
/// timeout (30 s or more), as PostgreSQL's store answers within its `connect_timeout`s.
pub const COMMIT_DEADLINE: Duration = Duration::from_secs(10);

/// The sticky failure (see the module doc); clones share it (the store, its committer).
#[derive(Clone, Default)]
pub(super) struct Failure(Arc<OnceLock<String>>);

impl Failure {
    /// Why the store failed, once it has.
    pub(super) fn reason(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }

    /// `Err(StoreError::Failed)` once the store has failed; every store call asks first.
    pub(super) fn check(&self) -> Result<(), StoreError> {
        match self.reason() {
            Some(why) => Err(StoreError::Failed(why.to_string())),
            None => Ok(()),
        }
    }

    /// Marks the store failed for `why` (the first reason stays), logged once at ERROR.
    pub(super) fn set(&self, why: impl Into<String>) {
        let why = why.into();
        if self.0.set(why.clone()).is_ok() {
            tracing::error!(reason = %why, "the task store failed and does not recover in this process: task operations fail until taskgate is restarted (/healthz and /readyz answer 503)");
        }
    }

    /// `result` of a store call, after checking it: a [`StoreError::Db`] (sled's error: I/O,
    /// corruption of its log, its bugs) fails the store; the tests' simulated crash
    /// (`swap::write_step`) does not.
    pub(super) fn note<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        match result {
            Err(StoreError::Db(why)) if !super::swap::is_simulated(&why) => {
                self.set(why.clone());
                Err(StoreError::Failed(why))
            }
            other => other,
        }
    }

    /// [`Failure::check`], then `call`, then [`Failure::note`] of its result.
    pub(super) fn guard<T>(
        &self,
        call: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.check()?;
        self.note(call())
    }
}
