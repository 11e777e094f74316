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
//!
//! A 2026-07-28 `tools/call` takes a *provisional* slot ([`Owners::reserve_provisional`]): the
//! server alone decides whether it becomes a task, so it goes upstream even at the limit, and
//! most such calls end plainly. Provisional slots count like any other for [`Owners::count`]
//! and [`Owners::reserve`], but not against the one that [`Owners::admit`] decides on: when the
//! server does answer with a live task, the slot is admitted only if the owner's other slots
//! (live tasks, 2025-11-25 creations in flight, admitted ones), provisional ones left out, are
//! below the limit; otherwise `observe` refuses the task (`-32029`) and cancels it upstream.
//! A call taskgate itself makes a task of (a gateway task, a reverse-bridged one) is admitted
//! the same way, before anything goes upstream.

use crate::store::{Owner, TaskStore};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

type Key = (Arc<str>, Owner);

/// Live (non-terminal) tasks per `(upstream, owner)`, reservations included.
pub struct Owners {
    limit: usize,
    live: Mutex<Counts>,
}

/// The slots held per owner, and how many of them are provisional (see the module docs).
struct Counts {
    held: HashMap<Key, usize>,
    provisional: HashMap<Key, usize>,
}

/// One less of `key` in `map` (an entry at 0 is removed: owners come and go, a session each
/// without auth, so only live ones are kept).
fn decrement(map: &mut HashMap<Key, usize>, key: &Key) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Owners {
    /// Slots over `live` (counted from the store at start-up), at most `limit` per owner.
    pub fn new(limit: usize, live: HashMap<Key, usize>) -> Arc<Owners> {
        Arc::new(Owners {
            limit,
            live: Mutex::new(Counts {
                held: live,
                provisional: HashMap::new(),
            }),
        })
    }

    /// Takes a slot for `owner` on `upstream`; `None` when the owner is at the limit.
    pub fn reserve(self: &Arc<Self>, upstream: &Arc<str>, owner: &Owner) -> Option<Reservation> {
        let key = (upstream.clone(), owner.clone());
        {
            let mut live = self.live.lock();
            let n = live.held.get(&key).copied().unwrap_or(0);
            if n >= self.limit {
                return None;
            }
            *live.held.entry(key.clone()).or_default() += 1;
        }
        Some(Reservation::new(self.clone(), key, false))
    }

    /// Takes a (firm) slot for `owner` on `upstream` even at the limit: a 2025-11-25 creation's
    /// on a shared store, whose database already held it to the limit (this count is then the
    /// replica's view only).
    pub fn reserve_over_limit(self: &Arc<Self>, upstream: &Arc<str>, owner: &Owner) -> Reservation {
        let key = (upstream.clone(), owner.clone());
        *self.live.lock().held.entry(key.clone()).or_default() += 1;
        Reservation::new(self.clone(), key, false)
    }

    /// Takes a provisional slot for `owner` on `upstream`, even at the limit: for 2026-07-28
    /// `tools/call` requests, where the server alone decides whether a call becomes a task
    /// (SEP-2663). It counts like any other slot; a live task the server makes of the call is
    /// held to the limit when it is recorded ([`Owners::admit`]).
    pub fn reserve_provisional(
        self: &Arc<Self>,
        upstream: &Arc<str>,
        owner: &Owner,
    ) -> Reservation {
        let key = (upstream.clone(), owner.clone());
        {
            let mut live = self.live.lock();
            *live.held.entry(key.clone()).or_default() += 1;
            *live.provisional.entry(key.clone()).or_default() += 1;
        }
        Reservation::new(self.clone(), key, true)
    }

    /// Makes `reservation`'s slot a firm one, for the live task the server made of its call:
    /// true when the owner's other firm slots are below the limit (or `regardless`: a shared
    /// store, whose database counted), false (nothing changed) otherwise. True at once for a
    /// slot that is not provisional (a 2025-11-25 creation's, checked when it was taken).
    pub fn admit(&self, reservation: &Reservation, regardless: bool) -> bool {
        let mut live = self.live.lock();
        if !reservation.provisional.load(Ordering::Acquire) {
            return true;
        }
        let key = &reservation.key;
        let held = live.held.get(key).copied().unwrap_or(0);
        let provisional = live.provisional.get(key).copied().unwrap_or(0);
        // The other firm slots: this one is among the provisional ones.
        if !regardless && held.saturating_sub(provisional) >= self.limit {
            return false;
        }
        reservation.provisional.store(false, Ordering::Release);
        decrement(&mut live.provisional, key);
        true
    }

    /// `reservation`'s slot is no longer provisional (kept for a task, or given back).
    fn settle(&self, reservation: &Reservation) {
        if reservation.provisional.swap(false, Ordering::AcqRel) {
            decrement(&mut self.live.lock().provisional, &reservation.key);
        }
    }

    /// Gives back one slot of `owner` (its task became terminal or was removed).
    pub fn release(&self, upstream: &str, owner: &Owner) {
        let key = (Arc::from(upstream), owner.clone());
        decrement(&mut self.live.lock().held, &key);
    }

    /// How many slots `owner` holds on `upstream`, provisional ones included (tests,
    /// diagnostics, a session's deferred DELETE).
    pub fn count(&self, upstream: &str, owner: &Owner) -> usize {
        let key = (Arc::from(upstream), owner.clone());
        self.live.lock().held.get(&key).copied().unwrap_or(0)
    }
}

/// One reserved slot; gives it back when dropped unless [`Reservation::keep`] was called.
pub struct Reservation {
    owners: Arc<Owners>,
    key: Key,
    kept: AtomicBool,
    /// Taken by [`Owners::reserve_provisional`] and not yet admitted, kept or given back.
    provisional: AtomicBool,
    /// The slot this reservation holds in a shared store, and that store.
    store_slot: OnceLock<(Arc<dyn TaskStore>, i64)>,
}

impl Reservation {
    fn new(owners: Arc<Owners>, key: Key, provisional: bool) -> Reservation {
        Reservation {
            owners,
            key,
            kept: AtomicBool::new(false),
            provisional: AtomicBool::new(provisional),
            store_slot: OnceLock::new(),
        }
    }

    /// This reservation also holds slot `id` of `store`
    /// ([`crate::store::SlotStore::reserve_slot`]): given back with the reservation unless the
    /// task was recorded in it.
    pub fn with_store_slot(self, store: Arc<dyn TaskStore>, id: i64) -> Reservation {
        self.attach_store_slot(store, id);
        self
    }

    /// [`Reservation::with_store_slot`] on a shared reservation (a provisional one admitted
    /// on a shared store); false, and slot `id` given back, when it already holds one.
    pub fn attach_store_slot(&self, store: Arc<dyn TaskStore>, id: i64) -> bool {
        match self.store_slot.set((store, id)) {
            Ok(()) => true,
            Err((store, id)) => {
                if let Some(slots) = store.slots() {
                    slots.release_slot(id);
                }
                false
            }
        }
    }

    /// The id of the store slot held, for [`crate::store::SlotStore::create_in_slot`].
    pub fn store_slot(&self) -> Option<i64> {
        self.store_slot.get().map(|(_, id)| *id)
    }

    /// Whether the slot is provisional (see [`Owners::admit`]).
    pub fn is_provisional(&self) -> bool {
        self.provisional.load(Ordering::Acquire)
    }

    /// The `(upstream, owner)` the slot is for.
    pub fn key(&self) -> &(Arc<str>, Owner) {
        &self.key
    }

    /// The creation was recorded with a live status: the slot now belongs to the task (it is
    /// given back by the status machine when the task ends).
    pub fn keep(&self) {
        self.owners.settle(self);
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
        self.owners.settle(self);
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

    /// Provisional slots (2026-07-28 calls in flight) count, but a live task the server makes
    /// of one is admitted against the other firm slots only: at the limit it is not; two calls
    /// in flight under the limit do not keep a third's task out; a refused slot is given back.
    #[test]
    fn a_provisional_slot_is_admitted_against_the_firm_ones_only() {
        let owners = Owners::new(2, HashMap::new());
        let up: Arc<str> = "up".into();
        let alice = Owner::Principal("alice".into());
        let calls: Vec<_> = (0..3)
            .map(|_| owners.reserve_provisional(&up, &alice))
            .collect();
        assert_eq!(owners.count("up", &alice), 3);
        assert!(owners.reserve(&up, &alice).is_none(), "they count");
        assert!(owners.admit(&calls[0], false));
        calls[0].keep();
        assert!(owners.admit(&calls[1], false));
        calls[1].keep();
        assert!(!calls[1].is_provisional());
        assert!(
            !owners.admit(&calls[2], false),
            "two live tasks: at the limit"
        );
        assert!(calls[2].is_provisional());
        assert!(
            owners.admit(&calls[2], true),
            "a shared store's database decided"
        );
        let over = owners.reserve_provisional(&up, &alice);
        assert!(!owners.admit(&over, false));
        drop(over);
        drop(calls);
        assert_eq!(owners.count("up", &alice), 2, "the two kept");
        assert!(owners.live.lock().provisional.is_empty());
        owners.release("up", &alice);
        let call = owners.reserve_provisional(&up, &alice);
        assert!(owners.admit(&call, false), "a slot was freed");
        let firm = owners.reserve_over_limit(&up, &alice);
        assert!(!firm.is_provisional(), "a shared store's 2025 slot is firm");
        assert!(owners.admit(&firm, false), "and needs no admission");
        drop(firm);
        let firm = owners.reserve(&up, &alice).map(|_| ());
        assert!(firm.is_none(), "the admitted slot counts");
    }
}
