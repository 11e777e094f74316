//! Call leases: which process holds an upstream call for a task, kept in the store so that the
//! other processes of a tier can reach it and take over when it is gone (issue 32, issue 35).
//!
//! One lease per call a process holds or follows for a task ([`LeaseKind`]): a gateway task's
//! held `tools/call` (`layers::gateway_tasks`), or an upgraded call's follower
//! (`layers::upgrade`). The holder renews its leases well inside their lapse; a lease not
//! renewed within its lapse belongs to a process that is gone, and another process adopts it
//! ([`LeaseStore::adopt_lapsed`]: one process only, atomically). A `tasks/cancel` answered by a
//! process that does not hold the call asks the holder through the lease
//! ([`LeaseStore::ask_cancel`]); the holder reads the asks ([`LeaseStore::cancels_asked`]),
//! each once. The registry's lease keeper (`registry::leases`) drives all of this; the times
//! are `store.lease_ms` and `store.lease_poll_ms`.
//!
//! PostgreSQL keeps the leases in `taskgate_leases`, on the database's clock (`pg::leases`);
//! the embedded store keeps them in memory ([`LocalLeases`]): one process holds every call, and
//! a restart fails or cancels what the previous run held (`gateway.rs`).

use super::StoreError;
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What a lease holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseKind {
    /// A gateway task's held `tools/call` (`upstream.tasks = "gateway"`): adopted by marking the
    /// task `failed` (the call died with its process).
    Held,
    /// An upgraded call's follower (`[upgrade]`): adopted by following the task to its end.
    Followed,
}

impl LeaseKind {
    /// The name stored in the lease (`held`, `followed`).
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseKind::Held => "held",
            LeaseKind::Followed => "followed",
        }
    }

    /// The kind a stored name stands for.
    pub fn parse(s: &str) -> Option<LeaseKind> {
        [LeaseKind::Held, LeaseKind::Followed]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// A lease this process just adopted ([`LeaseStore::adopt_lapsed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    /// The upstream's name.
    pub upstream: String,
    /// The task's id.
    pub task_id: String,
    /// What the lease held.
    pub kind: LeaseKind,
}

/// The leases of a store ([`super::TaskStore::leases`]). Every method is bounded by the store's
/// query timeout; errors are the store's.
pub trait LeaseStore: Send + Sync {
    /// Takes the lease of `(upstream, task_id)` for this process, lapsing `lapse` from now (the
    /// store's clock); one that already exists becomes this process's (its cancel ask kept).
    fn take_lease(
        &self,
        upstream: &str,
        task_id: &str,
        kind: LeaseKind,
        lapse: Duration,
    ) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Moves the lapse of every lease this process holds to `lapse` from now; returns the
    /// `(upstream, task_id)` of each lease renewed. A lease this process took that is not among
    /// them is no longer its own (it lapsed and another process adopted it): its call must stop.
    fn renew_leases(
        &self,
        lapse: Duration,
    ) -> BoxFuture<'static, Result<Vec<(String, String)>, StoreError>>;

    /// Ends the lease of `(upstream, task_id)` when it is this process's (its call ended).
    fn end_lease(
        &self,
        upstream: &str,
        task_id: &str,
    ) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Gives up the lease of `(upstream, task_id)` without ending it, when it is this
    /// process's: it lapses now and is held by nobody (no renewal of this process keeps it), so
    /// the next [`LeaseStore::adopt_lapsed`] of any process adopts it again (an adoption that
    /// failed).
    fn let_lapse(
        &self,
        upstream: &str,
        task_id: &str,
    ) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Asks the holder of `(upstream, task_id)`'s lease to cancel its call. Returns whether a
    /// lease that has not lapsed was asked (false: no lease, or a lapsed one, which its
    /// adopter deals with).
    fn ask_cancel(
        &self,
        upstream: &str,
        task_id: &str,
    ) -> BoxFuture<'static, Result<bool, StoreError>>;

    /// The `(upstream, task_id)` of this process's leases whose cancel was asked since the last
    /// call, each returned once.
    fn cancels_asked(&self) -> BoxFuture<'static, Result<Vec<(String, String)>, StoreError>>;

    /// Adopts at most `limit` leases whose lapse has passed, of any process: each becomes this
    /// process's, lapsing `lapse` from now, and is returned. A lease is adopted by one process
    /// only (two asking at once split them).
    fn adopt_lapsed(
        &self,
        lapse: Duration,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Adopted>, StoreError>>;
}

/// One lease kept in memory.
struct Local {
    kind: LeaseKind,
    lapses_at: Instant,
    cancel_asked: bool,
}

/// The leases of a store one process owns (sled), in memory: every lease is this process's.
#[derive(Default)]
pub struct LocalLeases {
    leases: Mutex<HashMap<(String, String), Local>>,
}

fn ready<T: Send + 'static>(v: T) -> BoxFuture<'static, Result<T, StoreError>> {
    Box::pin(std::future::ready(Ok(v)))
}

impl LeaseStore for LocalLeases {
    fn take_lease(
        &self,
        upstream: &str,
        task_id: &str,
        kind: LeaseKind,
        lapse: Duration,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let mut leases = self.leases.lock();
        let e = leases
            .entry((upstream.to_string(), task_id.to_string()))
            .or_insert(Local {
                kind,
                lapses_at: Instant::now(),
                cancel_asked: false,
            });
        e.kind = kind;
        e.lapses_at = Instant::now() + lapse;
        ready(())
    }

    fn renew_leases(
        &self,
        lapse: Duration,
    ) -> BoxFuture<'static, Result<Vec<(String, String)>, StoreError>> {
        let mut leases = self.leases.lock();
        let until = Instant::now() + lapse;
        let mut renewed = Vec::with_capacity(leases.len());
        for (key, l) in leases.iter_mut() {
            l.lapses_at = until;
            renewed.push(key.clone());
        }
        ready(renewed)
    }

    fn end_lease(
        &self,
        upstream: &str,
        task_id: &str,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.leases
            .lock()
            .remove(&(upstream.to_string(), task_id.to_string()));
        ready(())
    }

    fn let_lapse(
        &self,
        upstream: &str,
        task_id: &str,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        // One process holds every lease here: it lapses now (the keeper runs only in a tier).
        if let Some(l) = self
            .leases
            .lock()
            .get_mut(&(upstream.to_string(), task_id.to_string()))
        {
            l.lapses_at = Instant::now();
        }
        ready(())
    }

    fn ask_cancel(
        &self,
        upstream: &str,
        task_id: &str,
    ) -> BoxFuture<'static, Result<bool, StoreError>> {
        let mut leases = self.leases.lock();
        let asked = match leases.get_mut(&(upstream.to_string(), task_id.to_string())) {
            Some(l) if l.lapses_at > Instant::now() => {
                l.cancel_asked = true;
                true
            }
            _ => false,
        };
        ready(asked)
    }

    fn cancels_asked(&self) -> BoxFuture<'static, Result<Vec<(String, String)>, StoreError>> {
        let mut leases = self.leases.lock();
        let mut asked = Vec::new();
        for (key, l) in leases.iter_mut() {
            if std::mem::take(&mut l.cancel_asked) {
                asked.push(key.clone());
            }
        }
        ready(asked)
    }

    fn adopt_lapsed(
        &self,
        lapse: Duration,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Adopted>, StoreError>> {
        let mut leases = self.leases.lock();
        let now = Instant::now();
        let mut adopted = Vec::new();
        for ((upstream, task_id), l) in leases.iter_mut() {
            if adopted.len() >= limit {
                break;
            }
            if l.lapses_at <= now {
                l.lapses_at = now + lapse;
                adopted.push(Adopted {
                    upstream: upstream.clone(),
                    task_id: task_id.clone(),
                    kind: l.kind,
                });
            }
        }
        ready(adopted)
    }
}
