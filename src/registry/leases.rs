//! The lease keeper of a tier (issue 32, issue 35): this process's call leases
//! ([`crate::store::lease`]) taken, renewed, asked to cancel, and the lapsed ones of processes
//! that are gone adopted.
//!
//! - A layer that holds a call for a task takes its lease with [`LeaseKeeper::hold`] (a
//!   gateway task's held `tools/call`: [`LeaseKind::Held`], with a cancel hook; an upgraded
//!   call's follower: [`LeaseKind::Followed`]); the [`LeaseGuard`] ends the lease when the call
//!   has ended.
//! - Every `store.lease_poll_ms` (250 ms by default) one task of the keeper reads the cancels
//!   other replicas asked of this process's leases ([`LeaseKeeper::ask_cancel`], from a
//!   `tasks/cancel` answered there) and runs each lease's cancel hook once; and it adopts the
//!   leases whose lapse (`store.lease_ms`, 15 s by default) has passed: a [`LeaseKind::Held`]
//!   one's task is `failed` with a `statusMessage` saying its replica was lost (and released,
//!   `reason="process_exited"`), a [`LeaseKind::Followed`] one is followed to its end by the
//!   adopter its upstream registered ([`LeaseKeeper::on_adopt`]). Every third of the lapse it
//!   renews all of this process's leases (one statement); a held call whose lease is not among
//!   those renewed was adopted by another replica (this one stalled or lost the store past the
//!   lapse) and is stopped as a cancelled one is. After the store was out of reach
//!   (a poll's store call failed), nothing is adopted for one lapse: every live replica's
//!   renewals failed as well, and each gets that long to renew its own. A lease whose end the
//!   store refused (its call ended during an outage) is ended again at each poll, before the
//!   renewal: the renewal renews every lease of this process, so it would otherwise be kept
//!   for as long as the process runs.
//!
//! Why a bounded poll and not PostgreSQL `LISTEN`/`NOTIFY`: a notification reaches only a
//! session listening when it is sent, so a replica whose listening connection broke (a
//! restart of the database, a network cut) misses the cancels sent meanwhile and needs this
//! poll anyway; `LISTEN` also needs a connection of its own outside the pool, kept and
//! re-opened by hand. The poll is one indexed statement per replica per `lease_poll_ms`, and a
//! cancel reaches its holder within one poll: measured in `tests/tier_leases.rs` (real binary,
//! local PostgreSQL), from the cancel's answer on one replica to the holder's
//! `notifications/cancelled` upstream, 83 to 201 ms over 5 runs with the default 250 ms, 53 to
//! 55 ms with 100 ms.

use super::Registry;
use crate::mcp::task::{now_ms, TaskStatus};
use crate::store::{Adopted, LeaseKind, LeaseStore, StoreError};
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Most lapsed leases adopted per poll.
const ADOPT_PER_POLL: usize = 16;

/// Most leases whose end the store refused kept to be ended again ([`LeaseKeeper::end`]);
/// past it one is left as it is (renewed by this process until it stops: logged).
const MAX_UNENDED: usize = 65_536;
/// Leases ended again per poll at most (`end_unended`): at 5 ms a statement, a third of a
/// second before the renewal.
const UNENDED_PER_TICK: usize = 64;

type Key = (String, String);

/// What a lease's holder does when another replica asks it to cancel the call.
pub type CancelHook = Box<dyn FnOnce() + Send>;

/// What an upstream does with a [`LeaseKind::Followed`] lease it adopted: follows the task
/// (its id) to its end. The future's `true`: done, the lease ends; `false`: it failed (the
/// store was out of reach), the lease is given back and adopted again at a later poll.
pub type Adopter = Arc<dyn Fn(String) -> BoxFuture<'static, bool> + Send + Sync>;

/// A lease's cancel hook, and when its lease was in the store (`None`: not yet).
struct Hooked {
    hook: CancelHook,
    taken_at: Option<Instant>,
}

/// The keeper's task's own state across polls.
struct Ticks {
    /// When this replica's leases are renewed next.
    renew_at: Instant,
    /// No lease is adopted before this (a lapse after the store was last out of reach).
    adopt_after: Instant,
    /// A store call of this poll failed.
    failing: bool,
}

impl Ticks {
    /// `result`'s value; a failure is logged, once per outage (`failing` already set at the
    /// previous poll: not again), and marks this poll failing.
    fn note<T>(&mut self, result: Result<T, StoreError>, what: &str) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(e) => {
                if !self.failing && Instant::now() >= self.adopt_after {
                    tracing::warn!(error = %e, "{what}");
                }
                self.failing = true;
                None
            }
        }
    }
}

/// This process's leases (see the module docs).
pub struct LeaseKeeper {
    registry: Weak<Registry>,
    lapse: Duration,
    poll: Duration,
    /// The cancel hooks of the leases this process holds.
    hooks: Mutex<HashMap<Key, Hooked>>,
    /// `(upstream, kind)` → what adopts such a lease.
    adopters: Mutex<HashMap<(String, LeaseKind), Adopter>>,
    /// The leases whose call has ended but whose end the store refused (an outage): ended
    /// again at each poll, before the renewal (bounded: [`MAX_UNENDED`]).
    unended: Mutex<std::collections::HashSet<Key>>,
}

/// A lease this process holds; dropping it ends the lease (in the background).
pub struct LeaseGuard {
    keeper: Arc<LeaseKeeper>,
    key: Key,
    /// Dropping ends the lease (false after [`LeaseGuard::leave`]).
    end_on_drop: bool,
}

impl LeaseGuard {
    /// Leaves the lease in the store, not ended: this process renews it while it runs, then
    /// it lapses and another replica adopts the call (a graceful stop with a call still
    /// followed).
    pub fn leave(mut self) {
        self.end_on_drop = false;
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.keeper.hooks.lock().remove(&self.key);
        if !self.end_on_drop {
            return;
        }
        let (keeper, key) = (self.keeper.clone(), self.key.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { keeper.end(&key.0, &key.1).await });
        }
    }
}

impl LeaseKeeper {
    /// The lapse of a lease (`store.lease_ms`).
    pub fn lapse(&self) -> Duration {
        self.lapse
    }

    /// Takes the lease of `(upstream, task_id)` for this process; `on_cancel` runs (once) when
    /// another replica asks for the call's cancel. Returns once the lease is in the store.
    ///
    /// Errors: the store's (no lease is then held: a call run without it could not be cancelled
    /// from another replica nor adopted, so `gateway_tasks` refuses the creation).
    pub async fn hold(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        kind: LeaseKind,
        on_cancel: Option<CancelHook>,
    ) -> Result<LeaseGuard, StoreError> {
        let key = (upstream.to_string(), task_id.to_string());
        self.unended.lock().remove(&key);
        if let Some(hook) = on_cancel {
            let hooked = Hooked {
                hook,
                taken_at: None,
            };
            self.hooks.lock().insert(key.clone(), hooked);
        }
        let guard = LeaseGuard {
            keeper: self.clone(),
            key,
            end_on_drop: true,
        };
        let taken = self
            .with_leases(|l| l.take_lease(upstream, task_id, kind, self.lapse))
            .await;
        if let Err(e) = taken {
            // Counted here, for every caller (a gateway task's call, an upgraded call): the
            // caller logs the error, and the client is told no store detail.
            if let Some(r) = self.registry.upgrade().filter(|_| !e.is_closed()) {
                r.metrics.store_write_failures_total.inc();
            }
            return Err(e);
        }
        if let Some(h) = self.hooks.lock().get_mut(&guard.key) {
            h.taken_at = Some(Instant::now());
        }
        Ok(guard)
    }

    /// After a renewal that began at `started` and renewed `held`: each call whose lease was in
    /// the store before then and is not among them is no longer this process's (it stalled or
    /// lost the store past the lapse, and another replica adopted the lease, recording the task
    /// failed). Its hook runs, as for a cancel asked: the call stops (its server is sent
    /// `notifications/cancelled`) instead of running on unseen, where no cancel could reach it.
    fn stop_lost(&self, held: &[Key], started: Instant) {
        let held: std::collections::HashSet<&Key> = held.iter().collect();
        let lost: Vec<(Key, CancelHook)> = {
            let mut hooks = self.hooks.lock();
            let keys: Vec<Key> = hooks
                .iter()
                .filter(|(k, h)| h.taken_at.is_some_and(|t| t < started) && !held.contains(k))
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| hooks.remove(&k).map(|h| (k, h.hook)))
                .collect()
        };
        for ((upstream, task_id), hook) in lost {
            tracing::warn!(upstream, task_id, "this replica's call lease was adopted by another replica (it was not renewed within its lapse): the call is stopped here");
            hook();
        }
    }

    /// Asks the replica holding `(upstream, task_id)`'s call to cancel it. Returns whether a
    /// live lease was asked (false: no lease, or a lapsed one, whose adopter deals with it).
    pub async fn ask_cancel(&self, upstream: &str, task_id: &str) -> Result<bool, StoreError> {
        self.with_leases(|l| l.ask_cancel(upstream, task_id)).await
    }

    /// Registers what adopts a lapsed `kind` lease of `upstream`.
    pub fn on_adopt(&self, upstream: &str, kind: LeaseKind, adopter: Adopter) {
        self.adopters
            .lock()
            .insert((upstream.to_string(), kind), adopter);
    }

    /// Runs `op` on the store's leases (an error when the registry is gone or its store keeps
    /// none).
    fn with_leases<T: Send + 'static>(
        &self,
        op: impl FnOnce(&dyn LeaseStore) -> BoxFuture<'static, Result<T, StoreError>>,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let registry = self.registry.upgrade();
        match registry.as_ref().and_then(|r| r.store.leases()) {
            Some(l) => op(l),
            None => Box::pin(std::future::ready(Err(StoreError::Db(
                "the task store keeps no call leases".into(),
            )))),
        }
    }

    /// Ends the lease of a call that has ended. One the store refuses to end (an outage) is
    /// kept in `unended` and ended again at each poll before the renewal: renewing every lease
    /// of this process (one statement) would otherwise keep it for as long as the process
    /// runs, so no replica adopts it, and its task's cleanup (failing it if it is still live)
    /// never happens.
    async fn end(&self, upstream: &str, task_id: &str) {
        if let Err(e) = self.with_leases(|l| l.end_lease(upstream, task_id)).await {
            let key = (upstream.to_string(), task_id.to_string());
            let mut unended = self.unended.lock();
            if unended.len() < MAX_UNENDED {
                unended.insert(key);
                tracing::warn!(upstream, task_id, error = %e, "a call lease could not be ended: ended again once the task store answers");
            } else {
                tracing::warn!(upstream, task_id, error = %e, max = MAX_UNENDED, "a call lease could not be ended, and too many others wait to be ended again: this one is renewed until the process stops");
            }
        }
    }

    /// Ends again the leases whose end the store refused, at most [`UNENDED_PER_TICK`] per
    /// poll (one statement each: thousands of them, one after another, would hold back the
    /// renewal past the lapse, and other replicas would adopt the live calls; review); those it
    /// refuses again stay. Returns whether the store answered (or there was nothing to end).
    async fn end_unended(&self) -> bool {
        let keys: Vec<Key> = self
            .unended
            .lock()
            .iter()
            .take(UNENDED_PER_TICK)
            .cloned()
            .collect();
        for key in keys {
            match self.with_leases(|l| l.end_lease(&key.0, &key.1)).await {
                Ok(()) => {
                    tracing::info!(upstream = %key.0, task_id = %key.1, "a call lease the task store could not end before is ended");
                    self.unended.lock().remove(&key);
                }
                Err(_) => return false,
            }
        }
        true
    }

    /// One poll: the cancels asked, the renewal when due, the lapsed leases adopted.
    async fn tick(self: &Arc<Self>, t: &mut Ticks) {
        let Some(registry) = self.registry.upgrade() else {
            return;
        };
        let Some(leases) = registry.store.leases() else {
            return;
        };
        // Before the renewal: a lease whose call has ended is not renewed once more.
        if !self.unended.lock().is_empty() && !self.end_unended().await {
            t.failing = true;
        }
        let asked = leases.cancels_asked().await;
        let asked = t.note(
            asked,
            "the cancels asked of this replica's leases could not be read",
        );
        for key in asked.unwrap_or_default() {
            let hook = self.hooks.lock().remove(&key);
            if let Some(Hooked { hook, .. }) = hook {
                tracing::info!(upstream = %key.0, task_id = %key.1, "a cancel asked by another replica reached the call this replica holds");
                hook();
            }
        }
        if Instant::now() >= t.renew_at {
            let started = Instant::now();
            let renewed = leases.renew_leases(self.lapse).await;
            if let Some(held) = t.note(renewed, "this replica's call leases could not be renewed") {
                t.renew_at = Instant::now() + self.lapse / 3;
                self.stop_lost(&held, started);
            }
        }
        if t.failing {
            // Every replica's renewals failed too while the store was out of reach: after it
            // comes back, each gets a whole lapse to renew before anything is adopted (else a
            // replica that ticks first would take every live replica's leases, its own too).
            t.adopt_after = Instant::now() + self.lapse;
            return;
        }
        if Instant::now() < t.adopt_after {
            return;
        }
        let adopted = leases.adopt_lapsed(self.lapse, ADOPT_PER_POLL).await;
        for a in t
            .note(adopted, "lapsed call leases could not be looked for")
            .unwrap_or_default()
        {
            let this = self.clone();
            tokio::spawn(async move { this.adopted(a).await });
        }
    }

    /// What becomes of a lease this process adopted; the lease ends afterwards when the
    /// adoption succeeded, else it is given back ([`LeaseStore::let_lapse`]) and adopted again
    /// at a later poll (never ended with its task still `working` until its ttl).
    async fn adopted(self: Arc<Self>, a: Adopted) {
        let Some(registry) = self.registry.upgrade() else {
            return;
        };
        let done = match a.kind {
            LeaseKind::Held => {
                let message = format!(
                    "the taskgate replica holding this task's call to upstream `{}` was lost (its lease lapsed); the call's result was lost",
                    a.upstream
                );
                registry
                    .fail_tasks_of_dead_process(
                        &a.upstream,
                        Some(vec![a.task_id.clone()]),
                        now_ms(),
                        &message,
                    )
                    .await;
                // Done once the store shows nothing left to do (the failures above are only
                // logged): no record, or a terminal one (a cancelled one released too).
                match registry.try_record_of(&a.upstream, &a.task_id).await {
                    Ok(None) => true,
                    Ok(Some(rec))
                        if rec.status.is_terminal()
                            && (rec.status != TaskStatus::Cancelled
                                || rec.released_at.is_some()) =>
                    {
                        tracing::warn!(upstream = %a.upstream, task_id = %a.task_id, status = rec.status.as_str(), "a gateway task's replica was lost: its lease lapsed");
                        true
                    }
                    Ok(Some(_)) => false,
                    Err(e) => {
                        tracing::warn!(upstream = %a.upstream, task_id = %a.task_id, error = %e, "a lost replica's gateway task could not be read after its adoption");
                        false
                    }
                }
            }
            LeaseKind::Followed => {
                let adopter = self
                    .adopters
                    .lock()
                    .get(&(a.upstream.clone(), a.kind))
                    .cloned();
                match adopter {
                    Some(adopt) => {
                        tracing::warn!(upstream = %a.upstream, task_id = %a.task_id, "an upgraded call's follower was lost (its lease lapsed): followed here");
                        adopt(a.task_id.clone()).await
                    }
                    None => {
                        tracing::warn!(upstream = %a.upstream, task_id = %a.task_id, "an upgraded call's follower was lost, and this replica does not upgrade calls for its upstream: not followed");
                        true
                    }
                }
            }
        };
        self.hooks
            .lock()
            .remove(&(a.upstream.clone(), a.task_id.clone()));
        if done {
            self.end(&a.upstream, &a.task_id).await;
            return;
        }
        tracing::warn!(upstream = %a.upstream, task_id = %a.task_id, "a lapsed call lease could not be adopted (the task store failed): given back, adopted again at a later poll");
        if let Err(e) = self
            .with_leases(|l| l.let_lapse(&a.upstream, &a.task_id))
            .await
        {
            // Renewed by this process until it ends: the lease is ended instead of kept.
            tracing::warn!(upstream = %a.upstream, task_id = %a.task_id, error = %e, "a call lease whose adoption failed could not be given back");
            self.end(&a.upstream, &a.task_id).await;
        }
    }
}

impl Registry {
    /// Starts keeping this process's call leases (a tier: a store shared by replicas), with
    /// lapse `lapse` (`store.lease_ms`) and poll `poll` (`store.lease_poll_ms`); the keeper's
    /// task ends with the registry. Does nothing on a store not shared (one process holds every
    /// call; a restart deals with what the previous run held) or already keeping them.
    pub fn keep_leases(self: &Arc<Self>, lapse: Duration, poll: Duration) {
        if !self.store.shared() || self.store.leases().is_none() {
            return;
        }
        let keeper = Arc::new(LeaseKeeper {
            registry: Arc::downgrade(self),
            lapse,
            poll,
            hooks: Mutex::new(HashMap::new()),
            adopters: Mutex::new(HashMap::new()),
            unended: Mutex::default(),
        });
        if self.leases.set(keeper.clone()).is_err() {
            return;
        }
        let weak = Arc::downgrade(&keeper);
        drop(keeper);
        tokio::spawn(async move {
            let mut ticks = Ticks {
                renew_at: Instant::now(),
                adopt_after: Instant::now(),
                failing: false,
            };
            loop {
                let Some(keeper) = weak.upgrade() else { return };
                tokio::time::sleep(keeper.poll).await;
                ticks.failing = false;
                keeper.tick(&mut ticks).await;
            }
        });
    }

    /// The record of `(upstream, task_id)` as the store holds it now (`None`: none).
    ///
    /// Errors: the store's read, or the work could not run.
    pub async fn try_record_of(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
    ) -> Result<Option<crate::store::TaskRecord>, StoreError> {
        if self.store.quick_point_calls() {
            return self.store.get(upstream, task_id);
        }
        let (up, id) = (upstream.to_string(), task_id.to_string());
        self.try_off_runtime(move |r| r.store.get(&up, &id))
            .await
            .and_then(|found| found)
    }

    /// The record of `(upstream, task_id)` as the store holds it now (`None`: none, or the read
    /// failed, logged).
    pub async fn record_of(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
    ) -> Option<crate::store::TaskRecord> {
        self.point_about(upstream, task_id, |r, up, id| match r.store.get(up, id) {
            Ok(found) => found,
            Err(e) => {
                crate::store::log_failure(&e, "task store read failed");
                None
            }
        })
        .await
        .flatten()
    }

    /// The lease keeper, in a tier ([`Registry::keep_leases`]).
    pub fn leases(&self) -> Option<&Arc<LeaseKeeper>> {
        self.leases.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> Key {
        ("up".to_string(), id.to_string())
    }

    /// A lease the store could not give (a database outage in a tier) is counted in
    /// `taskgate_store_write_failures_total`, as every other failed store write: the client
    /// gets `LeaseNotTaken` without the store's text, the log line has it. It was only logged.
    #[tokio::test]
    async fn a_lease_not_taken_is_counted() {
        // The counting store keeps no leases: every take fails, as with a store gone away.
        let (registry, _store) = crate::layers::testing::registry();
        let keeper = Arc::new(LeaseKeeper {
            registry: Arc::downgrade(&registry),
            lapse: Duration::from_secs(1),
            poll: Duration::from_millis(100),
            hooks: Mutex::new(HashMap::new()),
            adopters: Mutex::new(HashMap::new()),
            unended: Mutex::default(),
        });
        let before = registry.metrics().store_write_failures_total.get();
        assert!(keeper
            .hold("up", "t1", LeaseKind::Held, None)
            .await
            .is_err());
        assert_eq!(
            registry.metrics().store_write_failures_total.get(),
            before + 1
        );
    }

    /// A lease whose end the store refused is kept to be ended again (each poll, before the
    /// renewal), not left renewed for as long as the process runs (break B, F2: it was renewed
    /// for ever, so no replica adopted the task); taking that lease again forgets it.
    #[tokio::test]
    async fn a_lease_not_ended_is_ended_again() {
        // The counting store keeps no leases: every end fails, as with a store gone away.
        let (registry, _store) = crate::layers::testing::registry();
        let keeper = Arc::new(LeaseKeeper {
            registry: Arc::downgrade(&registry),
            lapse: Duration::from_secs(1),
            poll: Duration::from_millis(100),
            hooks: Mutex::new(HashMap::new()),
            adopters: Mutex::new(HashMap::new()),
            unended: Mutex::default(),
        });
        keeper.end("up", "t1").await;
        assert!(keeper.unended.lock().contains(&key("t1")));
        assert!(!keeper.end_unended().await, "refused again: kept");
        assert!(keeper.unended.lock().contains(&key("t1")));
        let _ = keeper.hold("up", "t1", LeaseKind::Held, None).await;
        assert!(keeper.unended.lock().is_empty(), "taken again: not ended");
    }

    /// A renewal that no longer returns a lease taken before it stops that call (its hook
    /// runs, once), and only that one: not a call still held, nor one whose lease was not yet
    /// in the store when the renewal began.
    #[test]
    fn leases_adopted_elsewhere_stop_their_calls() {
        let keeper = LeaseKeeper {
            registry: Weak::new(),
            lapse: Duration::from_secs(1),
            poll: Duration::from_millis(100),
            hooks: Mutex::new(HashMap::new()),
            adopters: Mutex::new(HashMap::new()),
            unended: Mutex::default(),
        };
        let stopped = Arc::new(Mutex::new(Vec::new()));
        let taken = Instant::now();
        for (id, taken_at) in [("lost", Some(taken)), ("held", Some(taken)), ("new", None)] {
            let stopped = stopped.clone();
            let hook: CancelHook = Box::new(move || stopped.lock().push(id));
            keeper
                .hooks
                .lock()
                .insert(key(id), Hooked { hook, taken_at });
        }
        let started = taken + Duration::from_millis(1);
        keeper.stop_lost(&[key("held")], started);
        assert_eq!(*stopped.lock(), vec!["lost"]);
        keeper.stop_lost(&[key("held")], started);
        assert_eq!(stopped.lock().len(), 1, "once");
        assert!(keeper.hooks.lock().contains_key(&key("held")));
        assert!(keeper.hooks.lock().contains_key(&key("new")));
    }
}
