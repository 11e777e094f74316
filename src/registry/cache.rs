//! The record cache: recently used task records in memory, so the hot path (`tasks/get`,
//! `tasks/result` and `tasks/cancel` authorisation, a few times per second per live task) finds
//! its record without a trip to the blocking pool.
//!
//! Why: every authorising read used to be a `spawn_blocking` round trip (two cross-thread
//! wake-ups per request). On the task lifecycle benchmark (create, 10 × `tasks/get`,
//! `tasks/result`, c=16) that hop was most of the CPU taskgate added over its pre-redesign
//! inline reads; see `benches/RESULTS.md` ("record cache") for the before/after pair.
//!
//! Consistency: the registry is the only writer of the store in this process, and every write it
//! makes invalidates the entry *after* the write committed. A miss is filled from a store read
//! only if no invalidation happened between the moment the read was decided and the fill (one
//! epoch counter, bumped and checked under one small lock), so a fill can never put back a record
//! older than a write that already invalidated it. Unknown ids are not cached (each costs a store
//! read). Bounded by `tasks.record_cache_entries` (quick_cache's S3-FIFO eviction; 0 turns the
//! cache off).
//!
//! A store shared by several processes (PostgreSQL for a tier of replicas) must not use this
//! cache for anything another replica can change: there, only the immutable parts of a record
//! (owner, upstream session) could be served from it.

use crate::store::TaskRecord;
use parking_lot::Mutex;
use quick_cache::{sync::Cache, Equivalent};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// `(upstream, taskId)`, owned.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key(String, String);

/// `(upstream, taskId)`, borrowed for lookups; hashes like [`Key`].
struct KeyRef<'a>(&'a str, &'a str);

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Exactly what the derived `Hash` of `Key(String, String)` feeds the hasher.
        self.0.hash(state);
        self.1.hash(state);
    }
}

impl Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

/// A moment before a store read; a fill is accepted only if no write invalidated anything
/// since (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Epoch(u64);

/// Task records by `(upstream, taskId)`, bounded.
pub(crate) struct RecordCache {
    records: Option<Cache<Key, Arc<TaskRecord>>>,
    /// Bumped by every invalidation; held while a fill checks it.
    epoch: Mutex<u64>,
}

impl RecordCache {
    /// A cache of at most `entries` records; `0` caches nothing.
    pub(crate) fn new(entries: usize) -> RecordCache {
        RecordCache {
            records: (entries > 0).then(|| Cache::new(entries)),
            epoch: Mutex::new(0),
        }
    }

    /// The cached record of `(upstream, task_id)`, if any.
    pub(crate) fn get(&self, upstream: &str, task_id: &str) -> Option<Arc<TaskRecord>> {
        self.records.as_ref()?.get(&KeyRef(upstream, task_id))
    }

    /// Call before a store read whose result may fill the cache.
    pub(crate) fn epoch(&self) -> Epoch {
        Epoch(*self.epoch.lock())
    }

    /// Caches `record`, read from the store after `seen`, unless a write invalidated anything
    /// since.
    pub(crate) fn fill(&self, seen: Epoch, record: &TaskRecord) {
        let Some(records) = &self.records else {
            return;
        };
        let epoch = self.epoch.lock();
        if *epoch == seen.0 {
            records.insert(
                Key(record.upstream.clone(), record.task_id.clone()),
                Arc::new(record.clone()),
            );
        }
    }

    /// Drops the entry of `(upstream, task_id)`: call after every store write to that record.
    pub(crate) fn invalidate(&self, upstream: &str, task_id: &str) {
        let Some(records) = &self.records else {
            return;
        };
        let mut epoch = self.epoch.lock();
        *epoch = epoch.wrapping_add(1);
        records.remove(&KeyRef(upstream, task_id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testing::record;

    #[test]
    fn a_fill_read_before_an_invalidation_is_refused() {
        let cache = RecordCache::new(16);
        let r = record("t1");
        let seen = cache.epoch();
        // A write to the record committed and invalidated between the read and the fill.
        cache.invalidate(&r.upstream, &r.task_id);
        cache.fill(seen, &r);
        assert!(cache.get(&r.upstream, &r.task_id).is_none());
        // A fill read after it is kept, and found by a borrowed key.
        let seen = cache.epoch();
        cache.fill(seen, &r);
        let hit = cache.get(&r.upstream, &r.task_id).expect("cached");
        assert_eq!(*hit, r);
        cache.invalidate(&r.upstream, &r.task_id);
        assert!(cache.get(&r.upstream, &r.task_id).is_none());
    }

    #[test]
    fn zero_entries_caches_nothing() {
        let cache = RecordCache::new(0);
        let r = record("t1");
        cache.fill(cache.epoch(), &r);
        assert!(cache.get(&r.upstream, &r.task_id).is_none());
    }
}
