//! A record and its index entries changed together without a sled transaction: the record by
//! one compare-and-swap (the commit point), the index entries it gains written before it, the
//! ones it loses removed after it. Every write of a task record after its creation, every removal
//! of one, and every write or removal of a held session goes through [`swap_indexed`] (but
//! `update_from_stored`'s bare compare-and-swap, which changes no indexed field); a creation
//! is [`super::SledStore::insert_new`], the same order with a swap from nothing.
//!
//! **Why no transaction.** sled 0.34 runs every tree call through a process-global
//! concurrency-control lock (`concurrency_control.rs`) in one of two modes. Until the process's
//! first transaction (or `apply_batch`, or `checksum`) a call only counts itself in an atomic;
//! from then on, for the life of the process, every call takes a `parking_lot::RwLock` shared, a
//! transaction takes it exclusively, and a flush holds it shared through its buffer write. So a
//! transaction queued behind a flush on a stalled disk held up every tree call queued behind it,
//! the ones on the serving threads included (`TaskStore::quick_point_calls`). taskgate now runs
//! none (`architecture_tests` checks), so the lock never leaves its first mode.
//!
//! **Crash.** sled's log recovers a prefix of the writes, in the order they were made (for
//! messages over about 128 KiB, which sled keeps in blob files, because the committer `fsync`s
//! those files before the log: `blobs`). The
//! entries a change adds are written before the record's swap and the ones it drops after it, so
//! whatever prefix survives, a record always has the index entries of its fields (it is listed
//! and it expires); what a crash can leave is only entries no record has: an entry of a record
//! that is gone (a removal cut short), that was never written (a creation cut short) or that has
//! moved on (an expiry moved, its old entry not yet removed). Readers tolerate those: each entry
//! is checked against its record, skipped when it is not the record's own, and removed once
//! surely not a change in progress (`is_leftover`: [`LEFTOVER_GRACE_MS`] after both its own time
//! and the time it was written, which its value carries: [`index_value`]).
//!
//! **Races.** The record's swap is against the exact bytes read, so of two changes made from the
//! same read one wins and the other reads the record again and applies its edit to that (the
//! caller's loop): no edit is lost, and an edit that refuses the record as it now is (a terminal
//! `cancelled`) is not written. A removal is a swap to nothing, so a change racing it finds no
//! record and writes none: nothing resurrects it (only a creation writes where no record is).
//! Index entries follow two rules, so that the index never loses a live record's entry:
//!
//! - An entry is written with a value no other write has had ([`index_value`]: the time and a
//!   process-wide sequence number), whether or not the key was already there.
//! - An entry is removed only by a compare-and-swap against the value read *before* the record's
//!   swap (or, for a leftover, the value the reader saw), never by a plain remove.
//!
//! So a removal never takes an entry a record still needs. That entry was written by the change
//! that gave the record its field value (the expiry), after that change read the record; a
//! remover read the entry's value before its own swap. If the writer read the record after the
//! remover's swap, its write comes after the remover's read: before the removal (the value
//! differs, the removal fails and the entry stays) or after it (the entry is written again). A
//! writer that read *before* the remover's swap wins its own swap only if the record came back
//! to the exact bytes it read, so its indexed field left a value and returned to it in between;
//! taskgate never does that (a task's expiry is set at its creation, a held session's only moves
//! forward; a creation's entries carry its own recording time and expiry, never those of a
//! record of the same id removed meanwhile). An entry added by a change whose swap then lost
//! stays behind: it may be the winner's own entry too (the same field value), and otherwise it
//! is a leftover like a crash's, which readers clean. A reader removing a leftover is the
//! remover above with the value it saw (the grace covers a change between its entry write and
//! its swap).
//!
//! [`LEFTOVER_GRACE_MS`]: super::LEFTOVER_GRACE_MS

use super::db_err;
use crate::store::StoreError;
use std::sync::atomic::{AtomicU64, Ordering};

/// Index entries written so far by this process, numbering each [`index_value`].
static WRITTEN: AtomicU64 = AtomicU64::new(0);

/// The value of an index entry written at `written_ms`: that time (8 bytes big-endian, read by
/// `is_leftover`) and a number no other entry this process writes has (8 bytes), so two writes of
/// one key never leave the same value (see the module doc's rules). An older process's values may
/// repeat only if the clock went back past them; values written before taskgate numbered them are
/// the time alone, or empty.
pub(super) fn index_value(written_ms: u64) -> [u8; 16] {
    let mut v = [0; 16];
    v[..8].copy_from_slice(&written_ms.to_be_bytes());
    v[8..].copy_from_slice(&WRITTEN.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    v
}

#[cfg(test)]
thread_local! {
    /// Tests: how many more writes (of [`swap_indexed`] and of a creation) this thread makes
    /// before the next one fails as if the process had died there; `None`, the default: no
    /// limit. The crash tests stop a change after each prefix of its writes, reopen the store and
    /// check what is left.
    pub(super) static WRITES_LEFT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Called before each write of a change: in tests, the simulated crash of `WRITES_LEFT` (test-only);
/// nothing otherwise.
#[inline(always)]
pub(super) fn write_step() -> Result<(), StoreError> {
    #[cfg(test)]
    {
        let left = WRITES_LEFT.get();
        match left {
            Some(0) => return Err(StoreError::Db(SIMULATED_CRASH.into())),
            Some(n) => WRITES_LEFT.set(Some(n - 1)),
            None => {}
        }
    }
    Ok(())
}

/// Whether `why` is the tests' simulated crash of [`write_step`] (never in a build outside
/// tests), which must not fail the store as sled's own errors do (`failure`).
pub(super) fn is_simulated(why: &str) -> bool {
    cfg!(test) && why == SIMULATED_CRASH
}

/// [`write_step`]'s error text in tests.
const SIMULATED_CRASH: &str = "simulated crash";

/// One index entry: its tree and key.
pub(super) type Entry<'a> = (&'a sled::Tree, &'a [u8]);

/// Changes `key` in `records` from `old` (the bytes read; `None`: no record) to `new` (`None`:
/// removed) by one compare-and-swap, with the entries the record gains (`added`, written first
/// with [`index_value`]s of `now_ms`) and loses (`dropped`, read before the swap and removed
/// after it if still as read). See the module doc for why this order and these rules.
///
/// Returns `Ok(Err(current))` when the record was no longer `old` (nothing dropped; the added
/// entries stay, see the module doc): the caller reads `current` and decides again.
pub(super) fn swap_indexed(
    records: &sled::Tree,
    key: &[u8],
    old: Option<&[u8]>,
    new: Option<&[u8]>,
    added: &[Entry<'_>],
    dropped: &[Entry<'_>],
    now_ms: u64,
) -> Result<Result<(), Option<sled::IVec>>, StoreError> {
    let mut seen = Vec::with_capacity(dropped.len());
    for (tree, k) in dropped {
        seen.push(tree.get(k).map_err(db_err)?);
    }
    for (tree, k) in added {
        write_step()?;
        tree.insert(k, &index_value(now_ms)[..]).map_err(db_err)?;
    }
    write_step()?;
    let swapped = records.compare_and_swap(key, old, new).map_err(db_err)?;
    if let Err(lost) = swapped {
        return Ok(Err(lost.current));
    }
    for ((tree, k), value) in dropped.iter().zip(seen) {
        if let Some(value) = value {
            write_step()?;
            remove_entry(tree, k, &value)?;
        }
    }
    Ok(Ok(()))
}

/// Removes entry `k` of `tree` if its value is still `seen` (the module doc's second rule; also
/// an unreadable held session, if still those bytes); whether it did.
pub(super) fn remove_entry(tree: &sled::Tree, k: &[u8], seen: &[u8]) -> Result<bool, StoreError> {
    let removed = tree
        .compare_and_swap(k, Some(seen), None::<&[u8]>)
        .map_err(db_err)?;
    Ok(removed.is_ok())
}
