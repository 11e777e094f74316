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
//! older than a write that already invalidated it. An update that changed the record puts its
//! result in place of the entry ([`RecordCache::refresh`]) when no other write ran between the
//! epoch read before it and its commit; otherwise it drops the entry, so of two overlapping
//! writes the record left cached is never the older one. (Why: dropping it made the next poll of
//! every task whose status changed a store read off the runtime, about 17,000 instructions and
//! two thread hand-overs per task in the lifecycle benchmark.) Unknown ids are not cached (each costs a store
//! read). Bounded twice (quick_cache's S3-FIFO eviction over a weight): by bytes,
//! `tasks.record_cache_bytes`, counting each record's heap (its strings, the stored terminal
//! result included, and the store's bytes of it when they are kept: not for a record that
//! carries its terminal result, which is not updated again, so a large result is not counted
//! twice), and by entries, `tasks.record_cache_entries`, since each record weighs at
//! least `record_cache_bytes / record_cache_entries`. 0 in either turns the cache off.
//!
//! Why bytes: a record may carry its terminal result (up to `tasks.max_stored_result_bytes`,
//! 1 MiB by default), so a cache bounded by entries alone could hold 65,536 × 1 MiB. Measured on
//! `benches/run.sh` scenario 6 (100,000 records created on one taskgate): see
//! `benches/RESULTS.md` ("record cache by bytes").
//!
//! A store shared by several processes (PostgreSQL for a tier of replicas) must not use this
//! cache for anything another replica can change: there, only the immutable parts of a record
//! (owner, upstream session) could be served from it.

use crate::store::{StoredForm, TaskRecord};
use parking_lot::Mutex;
use quick_cache::{sync::Cache, Equivalent, Weighter};
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

/// A cached record and, when the store gave them, the bytes it holds for it
/// ([`crate::store::TaskStore::update_from_stored`] swaps against them, so an update does not
/// encode the record again: about 4,000 instructions, twice per task in the lifecycle
/// benchmark, issue 36). Both are written together, so they always describe the same record.
#[derive(Clone)]
struct Entry {
    record: Arc<TaskRecord>,
    form: Option<StoredForm>,
}

impl Entry {
    /// `record` with `form`, unless it carries its terminal result: nothing updates such a
    /// record again in a task's life (its expiry moves go through `update`), and its bytes
    /// hold the result a second time, escaped (a cache of 1 MiB results would hold half as
    /// many; the cold review of 2026-12-05).
    fn new(record: &Arc<TaskRecord>, form: Option<StoredForm>) -> Entry {
        Entry {
            record: record.clone(),
            form: form.filter(|_| record.terminal_result.is_none()),
        }
    }
}

/// Weighs an entry by the heap it holds (the stored bytes included), at least `floor` (so the
/// entry count stays bounded).
#[derive(Clone)]
struct ByHeap {
    floor: u64,
}

impl Weighter<Key, Entry> for ByHeap {
    fn weight(&self, key: &Key, entry: &Entry) -> u64 {
        let heap = std::mem::size_of::<Key>()
            + key.0.len()
            + key.1.len()
            + std::mem::size_of::<TaskRecord>()
            + entry.record.heap_bytes()
            + entry.form.as_ref().map_or(0, |f| f.len());
        (heap as u64).max(self.floor)
    }
}

/// Task records by `(upstream, taskId)`, bounded in bytes and entries.
pub(crate) struct RecordCache {
    records: Option<Cache<Key, Entry, ByHeap>>,
    /// Bumped by every invalidation; held while a fill checks it.
    epoch: Mutex<u64>,
}

impl RecordCache {
    /// A cache of at most `entries` records holding at most about `bytes` of heap; `0` in
    /// either caches nothing.
    pub(crate) fn new(entries: usize, bytes: u64) -> RecordCache {
        RecordCache {
            records: (entries > 0 && bytes > 0).then(|| {
                let floor = (bytes / entries as u64).max(1);
                let estimated = entries.min((bytes / 512).max(1) as usize);
                Cache::with_weighter(estimated, bytes, ByHeap { floor })
            }),
            epoch: Mutex::new(0),
        }
    }

    /// The cached record of `(upstream, task_id)`, if any.
    pub(crate) fn get(&self, upstream: &str, task_id: &str) -> Option<Arc<TaskRecord>> {
        self.get_with_form(upstream, task_id)
            .map(|(record, _)| record)
    }

    /// The cached record of `(upstream, task_id)` and the store's bytes of it, if it has them.
    pub(crate) fn get_with_form(
        &self,
        upstream: &str,
        task_id: &str,
    ) -> Option<(Arc<TaskRecord>, Option<StoredForm>)> {
        let entry = self.records.as_ref()?.get(&KeyRef(upstream, task_id))?;
        Some((entry.record, entry.form))
    }

    /// Call before a store read whose result may fill the cache.
    pub(crate) fn epoch(&self) -> Epoch {
        Epoch(*self.epoch.lock())
    }

    /// Caches `record` (with `form`, the store's bytes of it, if known), read or written after
    /// `seen`, unless a write invalidated anything since.
    pub(crate) fn fill(&self, seen: Epoch, record: &Arc<TaskRecord>, form: Option<StoredForm>) {
        let Some(records) = &self.records else {
            return;
        };
        let epoch = self.epoch.lock();
        if *epoch == seen.0 {
            records.insert(
                Key(record.upstream.clone(), record.task_id.clone()),
                Entry::new(record, form),
            );
        }
    }

    /// After a store update of `after`'s record committed (`seen`: [`RecordCache::epoch`] read
    /// before the update): caches `after` if nothing was invalidated or refreshed since `seen`,
    /// else drops the entry. Either way later fills of reads made before now are refused.
    /// `form`: the store's bytes of `after`, if it returned them.
    pub(crate) fn refresh(&self, seen: Epoch, after: &Arc<TaskRecord>, form: Option<StoredForm>) {
        let Some(records) = &self.records else {
            return;
        };
        let mut epoch = self.epoch.lock();
        let alone = *epoch == seen.0;
        *epoch = epoch.wrapping_add(1);
        if alone {
            records.insert(
                Key(after.upstream.clone(), after.task_id.clone()),
                Entry::new(after, form),
            );
        } else {
            records.remove(&KeyRef(&after.upstream, &after.task_id));
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
    use crate::mcp::task::TaskStatus;

    #[test]
    fn a_fill_read_before_an_invalidation_is_refused() {
        let cache = RecordCache::new(16, 1 << 20);
        let r = Arc::new(record("t1"));
        let seen = cache.epoch();
        // A write to the record committed and invalidated between the read and the fill.
        cache.invalidate(&r.upstream, &r.task_id);
        cache.fill(seen, &r, None);
        assert!(cache.get(&r.upstream, &r.task_id).is_none());
        // A fill read after it is kept, and found by a borrowed key.
        let seen = cache.epoch();
        cache.fill(seen, &r, None);
        let hit = cache.get(&r.upstream, &r.task_id).expect("cached");
        assert_eq!(hit, r);
        cache.invalidate(&r.upstream, &r.task_id);
        assert!(cache.get(&r.upstream, &r.task_id).is_none());
    }

    #[test]
    fn a_refresh_keeps_the_newer_record_of_two_overlapping_writes() {
        let cache = RecordCache::new(16, 1 << 20);
        let old = Arc::new(record("t1"));
        let a = Arc::new(TaskRecord {
            status: TaskStatus::InputRequired,
            ..TaskRecord::clone(&old)
        });
        let b = Arc::new(TaskRecord {
            status: TaskStatus::Completed,
            ..TaskRecord::clone(&old)
        });
        // One write alone: its result is cached.
        let seen = cache.epoch();
        cache.refresh(seen, &a, None);
        assert_eq!(cache.get(&a.upstream, &a.task_id).expect("cached"), a);
        // A read made before that write may not fill behind it.
        cache.invalidate(&a.upstream, &a.task_id);
        let read = cache.epoch();
        cache.refresh(cache.epoch(), &a, None);
        cache.fill(read, &old, None);
        assert_eq!(cache.get(&a.upstream, &a.task_id).unwrap(), a);
        // Two overlapping writes, a committed first, b after it; whichever refreshes first,
        // the entry left is never a (older than what the store holds).
        for a_first in [true, false] {
            cache.invalidate(&a.upstream, &a.task_id);
            let (seen_a, seen_b) = (cache.epoch(), cache.epoch());
            if a_first {
                cache.refresh(seen_a, &a, None);
                cache.refresh(seen_b, &b, None);
            } else {
                cache.refresh(seen_b, &b, None);
                cache.refresh(seen_a, &a, None);
            }
            let left = cache.get(&a.upstream, &a.task_id);
            assert!(left != Some(a.clone()), "a_first={a_first}: {left:?}");
        }
    }

    #[test]
    fn zero_entries_caches_nothing() {
        for cache in [RecordCache::new(0, 1 << 20), RecordCache::new(16, 0)] {
            let r = Arc::new(record("t1"));
            cache.fill(cache.epoch(), &r, None);
            assert!(cache.get(&r.upstream, &r.task_id).is_none());
        }
    }

    /// The store's bytes are kept beside a record until it carries its terminal result, then
    /// not (they would hold the result a second time; nothing updates it again).
    #[test]
    fn stored_bytes_are_kept_until_the_result_is() {
        let cache = RecordCache::new(16, 1 << 20);
        let form = StoredForm::from(&b"{}"[..]);
        let working = Arc::new(record("t1"));
        cache.fill(cache.epoch(), &working, Some(form.clone()));
        let (_, kept) = cache.get_with_form("up", "t1").unwrap();
        assert!(kept.is_some());
        let mut done = record("t1");
        done.terminal_result = Some("{\"content\":[]}".into());
        let done = Arc::new(done);
        cache.refresh(cache.epoch(), &done, Some(form));
        let (cached, kept) = cache.get_with_form("up", "t1").unwrap();
        assert_eq!(cached, done);
        assert!(
            kept.is_none(),
            "a record with its result keeps no stored bytes"
        );
    }

    /// Records carrying their terminal result fill the cache by bytes, not by count: 64 records
    /// of 256 KiB each in a cache of 1 MiB and 1,000 entries leave at most about 1 MiB cached.
    #[test]
    fn records_with_large_results_are_bounded_by_bytes() {
        let cache = RecordCache::new(1000, 1 << 20);
        let mut cached = 0;
        for i in 0..64 {
            let mut r = record(&format!("t{i}"));
            r.terminal_result = Some("x".repeat(256 * 1024));
            cache.fill(cache.epoch(), &Arc::new(r), None);
        }
        for i in 0..64 {
            if cache.get("up", &format!("t{i}")).is_some() {
                cached += 1;
            }
        }
        assert!(cached <= 4, "{cached} records of 256 KiB cached in 1 MiB");
    }

    /// The entry bound holds for small records: at most `entries` of them are kept.
    #[test]
    fn small_records_are_bounded_by_entries() {
        let cache = RecordCache::new(8, 1 << 20);
        for i in 0..100 {
            let r = Arc::new(record(&format!("t{i}")));
            cache.fill(cache.epoch(), &r, None);
        }
        let cached = (0..100)
            .filter(|i| cache.get("up", &format!("t{i}")).is_some())
            .count();
        assert!(
            (1..=8).contains(&cached),
            "{cached} entries cached, bound 8"
        );
    }
}
