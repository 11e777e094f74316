//! Live-task slots per owner: `tasks.max_live_tasks_per_owner` on one upstream.
//!
//! A slot is taken when a task-augmented `tools/call` goes upstream ([`Owners::reserve`] returns
//! a [`Reservation`]) and belongs to the task once its `CreateTaskResult` is recorded
//! ([`Reservation::keep`]); it is given back when the task reaches a terminal status or its
//! record is swept. A reservation that is dropped without being kept (an error answer, a plain
//! answer, a broken stream, a store failure) gives its slot back at once.
//!
//! On a shared store (a tier of replicas) the limit is the database's: a reservation also holds a
//! slot taken in the store ([`crate::store::SlotStore::reserve_slot`]), which the recorded task
//! replaces, or which is given back with the reservation. The in-process count is then only this
//! replica's view (used to defer a session's DELETE), never a refusal.

use crate::store::{Owner, TaskStore};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

type Key = (Arc<str>, Owner);

/// Live (non-terminal) tasks per `(upstream, owner)`, reservations included.
pub struct Owners {
    limit: usize,
    live: Mutex<HashMap<Key, usize>>,
}

impl Owners {
    /// Slots over `live` (counted from the store at start-up), at most `limit` per owner.
    pub fn new(limit: usize, live: HashMap<Key, usize>) -> Arc<Owners> {
        Arc::new(Owners {
            limit,
            live: Mutex::new(live),
        })
    }

    /// Takes a slot for `owner` on `upstream`; `None` when the owner is at the limit.
    pub fn reserve(self: &Arc<Self>, upstream: &Arc<str>, owner: &Owner) -> Option<Reservation> {
        let key = (upstream.clone(), owner.clone());
        {
            let mut live = self.live.lock();
            let n = live.entry(key.clone()).or_default();
            if *n >= self.limit {
                if *n == 0 {
                    live.remove(&key);
                }
                return None;
            }
            *n += 1;
        }
        Some(Reservation {
            owners: self.clone(),
            key,
            kept: AtomicBool::new(false),
            store_slot: None,
        })
    }

    /// Takes a slot for `owner` on `upstream` even at the limit: for 2026-07-28 `tools/call`
    /// requests, where the server alone decides whether a call becomes a task (SEP-2663), so
    /// whatever it creates is recorded; the slot counts like any other.
    pub fn reserve_over_limit(self: &Arc<Self>, upstream: &Arc<str>, owner: &Owner) -> Reservation {
        let key = (upstream.clone(), owner.clone());
        *self.live.lock().entry(key.clone()).or_default() += 1;
        Reservation {
            owners: self.clone(),
            key,
            kept: AtomicBool::new(false),
            store_slot: None,
        }
    }

    /// Gives back one slot of `owner` (its task became terminal or was removed).
    pub fn release(&self, upstream: &str, owner: &Owner) {
        let mut live = self.live.lock();
        let key = (Arc::from(upstream), owner.clone());
        if let Some(n) = live.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                // Owners come and go (a session each, without auth): keep only live ones.
                live.remove(&key);
            }
        }
    }

    /// How many slots `owner` holds on `upstream` (tests, diagnostics).
    pub fn count(&self, upstream: &str, owner: &Owner) -> usize {
        let key = (Arc::from(upstream), owner.clone());
        self.live.lock().get(&key).copied().unwrap_or(0)
    }
}

/// One reserved slot; gives it back when dropped unless [`Reservation::keep`] was called.
pub struct Reservation {
    owners: Arc<Owners>,
    key: Key,
    kept: AtomicBool,
    /// The slot this reservation holds in a shared store, and that store.
    store_slot: Option<(Arc<dyn TaskStore>, i64)>,
}

impl Reservation {
    /// This reservation also holds slot `id` of `store`
    /// ([`crate::store::SlotStore::reserve_slot`]): given back with the reservation unless the
    /// task was recorded in it.
    pub fn with_store_slot(mut self, store: Arc<dyn TaskStore>, id: i64) -> Reservation {
        self.store_slot = Some((store, id));
        self
    }

    /// The id of the store slot held, for [`crate::store::SlotStore::create_in_slot`].
    pub fn store_slot(&self) -> Option<i64> {
        self.store_slot.as_ref().map(|(_, id)| *id)
    }

    /// The creation was recorded with a live status: the slot now belongs to the task (it is
    /// given back by the status machine when the task ends).
    pub fn keep(&self) {
        self.kept.store(true, Ordering::Release);
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reservation({}, {})", self.key.0, self.key.1)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.kept.load(Ordering::Acquire) {
            self.owners.release(&self.key.0, &self.key.1);
            // A kept slot became the task's row in the store; any other is given back (a
            // terminal creation's slot is already gone: the delete finds nothing).
            if let Some((store, id)) = self.store_slot.take() {
                if let Some(slots) = store.slots() {
                    slots.release_slot(id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_reservation_gives_its_slot_back_unless_kept() {
        let owners = Owners::new(1, HashMap::new());
        let up: Arc<str> = "up".into();
        let alice = Owner::Principal("alice".into());
        let r = owners.reserve(&up, &alice).unwrap();
        assert!(owners.reserve(&up, &alice).is_none());
        drop(r);
        assert_eq!(owners.count("up", &alice), 0);
        let r = owners.reserve(&up, &alice).unwrap();
        r.keep();
        drop(r);
        assert_eq!(owners.count("up", &alice), 1);
        assert!(owners.reserve(&up, &alice).is_none());
        owners.release("up", &alice);
        assert!(owners.reserve(&up, &alice).is_some());
    }
}
