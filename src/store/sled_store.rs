//! The sled implementation of [`TaskStore`] (sled 0.34).
//!
//! Trees:
//! - `tasks`: `(upstream, taskId)` → JSON [`TaskRecord`];
//! - `by_owner`: `(upstream, owner, recorded_at, taskId)` → `()`, for `tasks/list`, newest first;
//! - `by_expiry`: `(expires_at, upstream, taskId)` → `()`, for the sweeper;
//! - `audit`: `(upstream, taskId, seq)` → JSON [`AuditEvent`], append-only;
//! - `held_sessions`, `held_by_expiry`: the held sessions (see `held`).
//!
//! Keys are length-prefixed strings and big-endian integers, so any `taskId` bytes are safe and
//! ranges sort by time. No change runs a sled transaction (`swap` says why and argues crashes and
//! races): a creation writes the index entries, then the record if absent (a compare-and-swap:
//! see `SledStore::insert_new`); an update is a compare-and-swap against the bytes it read,
//! retried on the record as it is now when it loses (an expiry it moves: the new entry written
//! before, the old one removed after); a removal swaps the record to nothing, then removes its
//! entries. So a crash may leave index entries without their record, never a record without
//! them; readers check an entry against its record and skip (and after [`LEFTOVER_GRACE_MS`]
//! remove) such leftovers.
//!
//! Durability (sled 0.34.7 as measured on a 2-core ext4 machine): `flush_async` deadlocks under concurrency and
//! `flush` alone does not empty the disk's write cache. One committer thread does group commit:
//! it takes every pending sync request, runs `flush()`, `fsync`s the blob files written since
//! the last commit (`blobs`: sled never does), then `fdatasync`s the database file once, and
//! answers them all. [`TaskStore::create`] waits for that before it returns.
//!
//! A [`TaskStore::sync_soon`] request that arrives alone (a change no client waits on: a
//! non-terminal status, a stored result, a sweep) waits up to [`SOON`] for a waited request to
//! share its commit. Why: every commit costs the same whatever it carries (sled's buffer write
//! through its I/O thread pool, `sync_file_range`, `fdatasync`, about 29 futex calls), and in
//! the task lifecycle one commit in three was such a lone "soon" (issue 15, `benches/RESULTS.md`).
//!
//! Failure: the first I/O error sled reports, or a group commit not finished within
//! [`COMMIT_DEADLINE`], fails the store for good (`failure` says why sled leaves no other
//! choice): every later call answers [`StoreError::Failed`] at once, without touching sled.

mod blobs;
mod failure;
pub(crate) mod held;
mod keys;
mod swap;

use super::{AuditEvent, ListCursor, Owner, StoreError, TaskRecord, TaskStore, UpdatedStored};
use crate::mcp::task::now_ms;
use failure::Failure;
pub use failure::COMMIT_DEADLINE;
use futures_util::future::BoxFuture;
use keys::{expiry_key, owner_key, task_key};
pub(super) use keys::{owner_prefix, push_str, read_str, read_u64};
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use swap::{remove_entry, swap_indexed};
use tokio::sync::oneshot;

type SyncReply = oneshot::Sender<Result<(), String>>;

/// What [`SledStore::write_index`] wrote: the `by_owner` and the `by_expiry` entry, each its key
/// and value.
type IndexWritten = ((Vec<u8>, [u8; 16]), (Vec<u8>, [u8; 16]));

/// How long a lone [`TaskStore::sync_soon`] request waits for a waited sync to share its group
/// commit (see the module doc): the longest a "soon" change stays only in memory.
pub const SOON: std::time::Duration = std::time::Duration::from_millis(10);

/// How old an index entry without its record must be before a reader takes it for what a crash
/// left behind (see `SledStore::insert_new`) and removes it: far longer than a creation's two
/// index writes and its record write take, so a creation in progress is never mistaken for one.
/// Measured in ms from the later of the entry's own time (`recorded_at` in `by_owner`,
/// `expires_at` in `by_expiry`) and the time it was written (see `is_leftover`).
pub const LEFTOVER_GRACE_MS: u64 = 60_000;

/// Whether an index entry with no record of its own (see `swap`) is surely what a crash or a
/// lost race left, not a change in progress: its own time (`key_ms`) and the time it was
/// written (its value's first 8 bytes, big-endian ms: `swap::index_value`; the value is empty
/// in entries written before taskgate stored it, or by a transaction) are both more than
/// [`LEFTOVER_GRACE_MS`] before `now`.
fn is_leftover(key_ms: u64, value: &[u8], now: u64) -> bool {
    let written = value
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_be_bytes);
    key_ms.max(written).saturating_add(LEFTOVER_GRACE_MS) < now
}

/// The sled-backed registry. Drop it (every clone of the `Arc`) to release the database lock;
/// [`SledStore::close`] flushes and stops the committer first.
pub struct SledStore {
    db: sled::Db,
    tasks: sled::Tree,
    by_owner: sled::Tree,
    by_expiry: sled::Tree,
    audit: sled::Tree,
    held: sled::Tree,
    held_by_expiry: sled::Tree,
    syncer: Mutex<Option<mpsc::Sender<Option<SyncReply>>>>,
    committer: Mutex<Option<JoinHandle<()>>>,
    /// The call leases, in memory: this process holds every call (see `store::lease`).
    leases: super::lease::LocalLeases,
    /// Set at the first I/O error or a commit past its deadline; never cleared (`failure`).
    failed: Failure,
    /// How long a [`TaskStore::sync`] waits for its group commit, in ms ([`COMMIT_DEADLINE`];
    /// tests shorten it).
    commit_deadline: std::sync::atomic::AtomicU64,
    /// Tests: set, the committer waits (before its flush) while it stays set: a disk that
    /// does not answer.
    #[cfg(test)]
    stall_commits: Arc<std::sync::atomic::AtomicBool>,
    /// Tests: set, the next group commits fail as an I/O error would.
    #[cfg(test)]
    fail_commits: Arc<std::sync::atomic::AtomicBool>,
    /// Blob files the committer has synced (`blobs`): read by the tests only.
    #[cfg_attr(not(test), allow(dead_code))]
    blobs_synced: Arc<std::sync::atomic::AtomicU64>,
}

fn decode(bytes: &[u8]) -> Result<TaskRecord, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn encode(r: &TaskRecord) -> Vec<u8> {
    r.to_json()
}

/// A scratch buffer at most this large is kept for the next [`encode_form`] on its thread (a
/// record carrying a large result leaves none behind).
const SCRATCH_KEPT: usize = 16 * 1024;

/// [`encode`] into the one buffer the record's bytes are held in ([`StoredForm`]: the registry's
/// cache and sled's tree share it), written first into a scratch buffer this thread reuses.
///
/// Why: encoding into a `Vec` of its own (grown once past its first 512 bytes), then copying
/// it into an `Arc` and sled copying it again into an `IVec` of its own was four allocations
/// and two copies of the record per write, three writes per task in the lifecycle benchmark
/// (callgrind, issue 36).
fn encode_form(r: &TaskRecord) -> StoredForm {
    in_scratch(|buf| r.to_json_into(buf))
}

/// [`encode_form`] of `after`, a change of `before` whose bytes are `before_form` (exactly
/// `encode(before)`): the unchanged members are copied from them
/// ([`TaskRecord::to_json_after`]).
fn encode_form_after(after: &TaskRecord, before: &TaskRecord, before_form: &[u8]) -> StoredForm {
    in_scratch(|buf| after.to_json_after(before, before_form, buf))
}

/// The bytes `write` puts in this thread's scratch buffer (see [`encode_form`]).
fn in_scratch(write: impl FnOnce(&mut Vec<u8>)) -> StoredForm {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        write(buf);
        let form = StoredForm::from(&buf[..]);
        if buf.capacity() > SCRATCH_KEPT {
            *buf = Vec::new();
        }
        form
    })
}

/// A record's bytes as a store that compares records by their bytes (sled) holds them: returned
/// by [`TaskStore::create_stored`] and [`TaskStore::update_from_stored`], handed back to the
/// latter with the record they encode. sled's own buffer, shared with its tree (a clone counts
/// a reference; the bytes are never copied).
///
/// Why sled's buffer: sled copied the bytes of every write into a buffer of its own (an
/// `IVec`), one allocation and copy of the record more per write, three writes per task in the
/// lifecycle benchmark, and the record cache's copy was a second one in memory (issue 36).
#[derive(Clone, PartialEq, Eq)]
pub struct StoredForm(sled::IVec);

impl std::ops::Deref for StoredForm {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl From<&[u8]> for StoredForm {
    fn from(bytes: &[u8]) -> StoredForm {
        StoredForm(sled::IVec::from(bytes))
    }
}

impl std::fmt::Debug for StoredForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoredForm({} bytes)", self.0.len())
    }
}

/// Told of every group commit: how long it took (flush and `fdatasync`) and whether it succeeded.
/// The gateway's `Metrics` implement it: the store reports, the metrics count, and the store
/// imports nothing above it. The PostgreSQL store reports each task write's transaction
/// ([`CommitObserver::write`]).
pub trait CommitObserver: Send + Sync {
    /// One commit took `seconds`; `ok` is false when it failed.
    fn commit(&self, seconds: f64, ok: bool);
    /// One write of a store that commits each write itself (PostgreSQL) took `seconds`, until
    /// committed or failed; its failures are its callers' to count.
    fn write(&self, seconds: f64);
}

fn db_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Db(e.to_string())
}

impl SledStore {
    /// `check-config`'s check of a sled store's `path`, leaving nothing behind: an existing
    /// directory taskgate can write in (a file made in it and removed at once), or a path whose
    /// missing directories can be made (made, then removed). `Ok` says which; `Err` why `serve`
    /// could not open a store there (`store.path` in the message). The store itself is not
    /// opened: a running taskgate holds its lock.
    pub fn check_path(path: &std::path::Path) -> Result<String, String> {
        let shown = path.display();
        if path.exists() {
            if !path.is_dir() {
                return Err(format!("store.path {shown} is not a directory"));
            }
            let probe = path.join(format!(".taskgate-check-{}", std::process::id()));
            std::fs::write(&probe, b"")
                .map_err(|e| format!("store.path {shown} cannot be written: {e}"))?;
            let _ = std::fs::remove_file(&probe);
            return Ok(format!("sled at {shown} (exists, writable)"));
        }
        // The missing directories, deepest first, to be removed again in that order.
        let mut missing = Vec::new();
        let mut at = path;
        while !at.exists() {
            missing.push(at.to_path_buf());
            match at.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => at = parent,
                _ => break,
            }
        }
        let made = std::fs::create_dir_all(path)
            .map_err(|e| format!("store.path {shown} cannot be created: {e}"));
        for dir in &missing {
            let _ = std::fs::remove_dir(dir);
        }
        made.map(|()| format!("sled at {shown} (created at the first start)"))
    }

    /// Opens (or creates) the store at `path` with a page cache of `cache_capacity_bytes`.
    ///
    /// Errors: [`StoreError::Open`] when the directory cannot be created or another process
    /// holds the database (the message then says "could not acquire lock").
    pub fn open(
        path: &Path,
        cache_capacity_bytes: u64,
        metrics: Option<Arc<dyn CommitObserver>>,
    ) -> Result<Arc<SledStore>, StoreError> {
        let open_err = |detail: String| StoreError::Open {
            path: path.display().to_string(),
            detail,
        };
        std::fs::create_dir_all(path).map_err(|e| open_err(e.to_string()))?;
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(cache_capacity_bytes)
            .mode(sled::Mode::LowSpace)
            .open()
            .map_err(|e| open_err(e.to_string()))?;
        let tree = |name: &str| db.open_tree(name).map_err(|e| open_err(e.to_string()));
        let (tasks, by_owner, by_expiry, audit) = (
            tree("tasks")?,
            tree("by_owner")?,
            tree("by_expiry")?,
            tree("audit")?,
        );
        let (held, held_by_expiry) = (tree("held_sessions")?, tree("held_by_expiry")?);
        let (tx, rx) = mpsc::channel::<Option<SyncReply>>();
        let committer_db = db.clone();
        let db_file = path.join("db");
        let blobs_synced = Arc::<std::sync::atomic::AtomicU64>::default();
        let blobs = blobs::BlobSync::new(path.join("blobs"), blobs_synced.clone());
        let failed = Failure::default();
        let committer = Committer {
            db: committer_db,
            db_file,
            blobs,
            metrics,
            failed: failed.clone(),
            #[cfg(test)]
            stall: Arc::default(),
            #[cfg(test)]
            fail: Arc::default(),
        };
        #[cfg(test)]
        let (stall_commits, fail_commits) = (committer.stall.clone(), committer.fail.clone());
        let committer = std::thread::Builder::new()
            .name("taskgate-store-commit".into())
            .spawn(move || committer.run(rx))
            .map_err(|e| open_err(e.to_string()))?;
        Ok(Arc::new(SledStore {
            db,
            tasks,
            by_owner,
            by_expiry,
            audit,
            held,
            held_by_expiry,
            syncer: Mutex::new(Some(tx)),
            committer: Mutex::new(Some(committer)),
            leases: Default::default(),
            failed,
            commit_deadline: (COMMIT_DEADLINE.as_millis() as u64).into(),
            #[cfg(test)]
            stall_commits,
            #[cfg(test)]
            fail_commits,
            blobs_synced,
        }))
    }

    /// Flushes everything, stops the committer thread and waits for it. Later writes still
    /// apply but are only made durable by sled's own background flush or on drop, and a later
    /// [`TaskStore::sync`] fails at once (nothing waited for is made durable after this).
    ///
    /// A failed store (`failure`) is neither flushed nor waited for: its committer may wait
    /// forever in sled's flush, so it is left to end with the process, and sled's log keeps
    /// what was committed before the failure.
    pub fn close(&self) {
        let sender = self.syncer.lock().take();
        drop(sender);
        if self.failed.reason().is_some() {
            return;
        }
        if let Some(handle) = self.committer.lock().take() {
            let _ = handle.join();
        }
        if self.failed.reason().is_none() {
            let _ = self.db.flush();
        }
    }

    /// Tests: how long a [`TaskStore::sync`] waits for its group commit.
    #[cfg(test)]
    pub(crate) fn set_commit_deadline(&self, deadline: std::time::Duration) {
        self.commit_deadline.store(
            deadline.as_millis() as u64,
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// Tests: group commits wait (a disk that does not answer) while `on`.
    #[cfg(test)]
    pub(crate) fn stall_commits(&self, on: bool) {
        self.stall_commits
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Tests: fails the store for `why`, as an I/O error does (`failure`).
    #[cfg(test)]
    pub(crate) fn fail_for_test(&self, why: &str) {
        self.failed.set(why);
    }

    /// Tests: group commits fail as on an I/O error while `on`.
    #[cfg(test)]
    pub(crate) fn fail_commits(&self, on: bool) {
        self.fail_commits
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Every stored record's bytes in key order, until `visit` returns false: a walk of the
    /// `tasks` tree that lets sled's page cache evict as it goes.
    ///
    /// Why not `tasks.iter()` alone: sled 0.34's page cache (`store.cache_capacity_bytes`) is
    /// 256 shards, a page in the shard of its page id, and a shard reads its queued accesses
    /// (and evicts past its share of the capacity) only once 64 have queued. An iterator
    /// touches each leaf page once, and a leaf holds at most 17 records: 100,000 records are
    /// ~8,000 leaves, ~30 accesses per shard, so no queue filled and every page the scan
    /// pulled from disk stayed in memory, whatever the capacity (heaptrack, `benches/run.sh`
    /// scenario 6 after a restart: 56 MiB of `tasks` nodes from the start-up count, with a
    /// 16 MiB or a 1 MiB cache alike). A look-up of each key touches its leaf once per
    /// record, so the queues fill and the cache stays near its capacity while the scan runs:
    /// peak RSS after the restart 88.6 → 45.4 MiB, after the full `tasks/list` walk 95.6 →
    /// 55.1 MiB (medians of 3). Cost: one in-memory look-up per record scanned (start-up,
    /// `/admin/tasks`, the orphan scans), no disk read.
    fn scan_tasks(
        &self,
        visit: &mut dyn FnMut(&[u8]) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        for item in self.tasks.iter() {
            let (k, v) = item.map_err(db_err)?;
            // Only for the access it records in the page cache (see above).
            self.tasks.contains_key(&k).map_err(db_err)?;
            if !visit(&v)? {
                break;
            }
        }
        Ok(())
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// True when no record is stored.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// [`TaskStore::create`]'s writes, without sled's multi-tree transaction: the two index
    /// entries first, then the record, inserted only if absent (a compare-and-swap from nothing),
    /// which is the commit point and keeps "a taskId is never rewritten".
    ///
    /// Why not a transaction: each sled 0.34 transaction takes sled's global write lock and makes
    /// its log roll the I/O buffer (an extra job for sled's I/O thread pool and a batch marker);
    /// measured on the task lifecycle (issue 15, `benches/RESULTS.md`), the creation's transaction
    /// was most of what sled's I/O pool still cost per task. And the first one would switch sled's
    /// lock into its blocking mode for good (`swap`).
    ///
    /// Why this order: sled's log recovers a prefix of the writes, so a crash before the group
    /// commit leaves at worst index entries without their record (never a record without them,
    /// which would neither expire nor be listed). Readers skip such leftovers and remove those
    /// older than [`LEFTOVER_GRACE_MS`] (`is_leftover`).
    /// Returns the record's bytes as stored.
    fn insert_new(&self, record: &TaskRecord) -> Result<StoredForm, StoreError> {
        let key = task_key(&record.upstream, &record.task_id);
        let ((listed, listed_as), (expiring, expiring_as)) = self.write_index(record, now_ms())?;
        let form = encode_form(record);
        swap::write_step()?;
        let swapped = self
            .tasks
            .compare_and_swap(&key, None::<&[u8]>, Some(form.0.clone()))
            .map_err(db_err)?;
        let Err(taken) = swapped else {
            return Ok(form);
        };
        // A taskId is never rewritten: an upstream handing out one twice is refused. The entries
        // just added go again (if still as written: `swap`), unless they are the recorded task's
        // own (same owner and times).
        let recorded = taken.current.as_deref().map(decode).transpose()?;
        let owns = |k: &[u8], of: fn(&TaskRecord) -> Vec<u8>| {
            recorded.as_ref().is_some_and(|r| of(r) == k)
        };
        if !owns(&listed, owner_key) {
            remove_entry(&self.by_owner, &listed, &listed_as)?;
        }
        if !owns(&expiring, expiry_key) {
            remove_entry(&self.by_expiry, &expiring, &expiring_as)?;
        }
        Err(StoreError::Conflict(record.task_id.clone()))
    }

    /// A creation's first step: `record`'s `by_owner` and `by_expiry` entries, each carrying
    /// `written_ms`, the time it is written (so a creation whose writes come long after its
    /// record was built, a stalled disk, is still not taken for a leftover: `is_leftover`), in
    /// a value of its own (`swap::index_value`). Returns each entry's key and value.
    fn write_index(
        &self,
        record: &TaskRecord,
        written_ms: u64,
    ) -> Result<IndexWritten, StoreError> {
        let (listed, expiring) = (owner_key(record), expiry_key(record));
        let (listed_as, expiring_as) =
            (swap::index_value(written_ms), swap::index_value(written_ms));
        swap::write_step()?;
        self.by_owner
            .insert(&listed, &listed_as[..])
            .map_err(db_err)?;
        swap::write_step()?;
        self.by_expiry
            .insert(&expiring, &expiring_as[..])
            .map_err(db_err)?;
        Ok(((listed, listed_as), (expiring, expiring_as)))
    }

    /// Writes `after` over `raw` (the bytes of `before`, as read) by [`swap_indexed`]: the
    /// `by_expiry` entry moves with the expiry when it changes (the new one written before the
    /// swap, the old one removed after), and the `by_owner` entry stays (an update never
    /// changes the owner or `recorded_at`). `Ok(Err(current))` when the record was no longer
    /// `raw`.
    fn swap_task(
        &self,
        key: &[u8],
        raw: &[u8],
        before: &TaskRecord,
        after: &TaskRecord,
        bytes: &[u8],
    ) -> Result<Result<(), Option<sled::IVec>>, StoreError> {
        debug_assert_eq!(
            (&before.owner, before.recorded_at),
            (&after.owner, after.recorded_at),
            "an update never moves the by_owner entry"
        );
        let new = Some(bytes);
        if after.expires_at == before.expires_at {
            return swap_indexed(&self.tasks, key, Some(raw), new, &[], &[], 0);
        }
        let (moved_from, moved_to) = (expiry_key(before), expiry_key(after));
        let (added, dropped) = (
            [(&self.by_expiry, &*moved_to)],
            [(&self.by_expiry, &*moved_from)],
        );
        swap_indexed(&self.tasks, key, Some(raw), new, &added, &dropped, now_ms())
    }

    /// Removes what [`SledStore::insert_new`] wrote for `record` (its bytes `form`), each if
    /// still as written, after its commit failed: best effort (sled may refuse every write by
    /// then; failures are ignored).
    fn forget_unrecorded(&self, record: &TaskRecord, form: &StoredForm) {
        let key = task_key(&record.upstream, &record.task_id);
        let removed = self
            .tasks
            .compare_and_swap(&key, Some(&form[..]), None::<&[u8]>);
        if matches!(removed, Ok(Ok(()))) {
            let _ = self.by_owner.remove(owner_key(record));
            let _ = self.by_expiry.remove(expiry_key(record));
        }
    }

    /// Hands a commit request to the committer thread: `None` once `close` took its channel
    /// (the graceful stop), `Some(false)` when the thread is gone (it died: a fault, not a
    /// stop), `Some(true)` when sent.
    fn request_sync(&self, reply: Option<SyncReply>) -> Option<bool> {
        let guard = self.syncer.lock();
        guard.as_ref().map(|tx| tx.send(reply).is_ok())
    }
}

/// `rx`, or `Err` once `deadline` has passed on the wall clock (`std::time::Instant`), not
/// only on tokio's: a test runtime with paused time advances tokio's clock whenever it is idle,
/// and would take a commit a real thread is still making for one past its deadline. Waits in
/// slices of at most 100 ms of tokio's clock.
async fn wait_real_time<T>(
    deadline: std::time::Duration,
    rx: oneshot::Receiver<T>,
) -> Result<Result<T, oneshot::error::RecvError>, ()> {
    let started = std::time::Instant::now();
    tokio::pin!(rx);
    loop {
        let left = deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(());
        }
        let slice = left.min(std::time::Duration::from_millis(100));
        if let Ok(answer) = tokio::time::timeout(slice, &mut rx).await {
            return Ok(answer);
        }
    }
}

/// The committer thread's state (see the module doc: group commit).
struct Committer {
    db: sled::Db,
    db_file: PathBuf,
    blobs: blobs::BlobSync,
    metrics: Option<Arc<dyn CommitObserver>>,
    /// The store's failure: a failed commit sets it; once set, no commit is tried again
    /// (sled's flush may never return then, `failure`) and every request is answered with it.
    failed: Failure,
    #[cfg(test)]
    stall: Arc<std::sync::atomic::AtomicBool>,
    #[cfg(test)]
    fail: Arc<std::sync::atomic::AtomicBool>,
}

impl Committer {
    fn run(mut self, rx: mpsc::Receiver<Option<SyncReply>>) {
        let file = std::fs::File::open(&self.db_file).ok();
        while let Ok(first) = rx.recv() {
            let mut waiting: Vec<SyncReply> = first.into_iter().collect();
            if waiting.is_empty() {
                // A lone "soon": let a waited sync arriving within SOON share the commit.
                let until = std::time::Instant::now() + SOON;
                loop {
                    match rx
                        .recv_timeout(until.saturating_duration_since(std::time::Instant::now()))
                    {
                        Ok(Some(reply)) => {
                            waiting.push(reply);
                            break;
                        }
                        Ok(None) => continue,
                        Err(_) => break,
                    }
                }
            }
            while let Ok(more) = rx.try_recv() {
                waiting.extend(more);
            }
            let result = match self.failed.reason() {
                Some(why) => Err(why.to_string()),
                None => self.commit(file.as_ref()),
            };
            for reply in waiting {
                let _ = reply.send(result.clone());
            }
        }
        if self.failed.reason().is_none() {
            let _ = self.db.flush();
        }
    }

    /// One group commit: sled's flush, the new blob files' `fsync`, the database file's
    /// `fdatasync`. A failure fails the store (`failure`).
    fn commit(&mut self, file: Option<&std::fs::File>) -> Result<(), String> {
        #[cfg(test)]
        while self.stall.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        #[cfg(test)]
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            let why = "IO error: No space left on device (os error 28) (test)".to_string();
            self.failed.set(why.clone());
            return Err(why);
        }
        let started = std::time::Instant::now();
        let result = self
            .db
            .flush()
            .map(|_| ())
            .map_err(|e| e.to_string())
            // The blob files the log points to before the log itself (`blobs`).
            .and_then(|()| {
                self.blobs
                    .sync_new()
                    .map(drop)
                    .map_err(|e| format!("blob files: {e}"))
            })
            .and_then(|()| match file {
                Some(f) => f.sync_data().map_err(|e| e.to_string()),
                None => Ok(()),
            });
        if let Some(m) = &self.metrics {
            m.commit(started.elapsed().as_secs_f64(), result.is_ok());
        }
        if let Err(e) = &result {
            tracing::error!(error = %e, "task store commit failed");
            self.failed.set(format!("a group commit failed: {e}"));
        }
        result
    }
}

impl TaskStore for SledStore {
    fn create(&self, record: TaskRecord) -> BoxFuture<'_, Result<(), StoreError>> {
        let created = self.create_stored(Arc::new(record));
        Box::pin(async move { created.await.map(|_| ()) })
    }

    fn create_stored(
        &self,
        record: Arc<TaskRecord>,
    ) -> BoxFuture<'_, Result<Option<StoredForm>, StoreError>> {
        let written = self.failed.guard(|| self.insert_new(&record));
        Box::pin(async move {
            let form = written?;
            if let Err(e) = self.sync().await {
                // Not durable, so not recorded: the record and its index entries leave sled's
                // memory (best effort, only if still as written), so no later read, nor a flush
                // sled makes itself, finds a task whose creation was refused (tester4 #2).
                self.forget_unrecorded(&record, &form);
                return Err(e);
            }
            Ok(Some(form))
        })
    }

    fn get(&self, upstream: &str, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        self.failed.guard(|| {
            match self
                .tasks
                .get(task_key(upstream, task_id))
                .map_err(db_err)?
            {
                Some(v) => decode(&v).map(Some),
                None => Ok(None),
            }
        })
    }

    /// A compare-and-swap against the bytes read, retried on the record as it is then when
    /// another change won meanwhile (`change` runs again on it, so no edit is lost and a record
    /// that became terminal since is judged as it is); `None` when the record is gone, also when
    /// a removal won. Most status reports change nothing (a tasks/get poll of a working task):
    /// that is decided on the read alone, and nothing goes to sled's log. An expiry the change moves takes its
    /// `by_expiry` entry along (see `swap_task`; why no transaction: `swap`).
    fn update(
        &self,
        upstream: &str,
        task_id: &str,
        change: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<Option<(TaskRecord, TaskRecord)>, StoreError> {
        self.failed.guard(|| {
            let key = task_key(upstream, task_id);
            let Some(mut raw) = self.tasks.get(&key).map_err(db_err)? else {
                return Ok(None);
            };
            loop {
                let current = decode(&raw)?;
                let mut after = current.clone();
                if !change(&mut after) || after == current {
                    return Ok(Some((current.clone(), current)));
                }
                // The records go to the caller moved, not cloned (issue 15: `TaskRecord::clone` and
                // `serialize` per update).
                let bytes = encode(&after);
                match self.swap_task(&key, &raw, &current, &after, &bytes)? {
                    Ok(()) => return Ok(Some((current, after))),
                    Err(Some(stored)) => raw = stored,
                    Err(None) => return Ok(None),
                }
            }
        })
    }

    /// One compare-and-swap against `known`'s bytes, without reading or decoding the stored
    /// record first: the stored bytes are exactly `known`'s encoding when nothing wrote the
    /// record since (this process is its only writer, and every write encodes with
    /// [`TaskRecord::to_json`]); a lost swap, or a change that would move the record's expiry,
    /// takes [`TaskStore::update`]'s path.
    ///
    /// Why: the read and decode were about half of an update (decode ~14,800 instructions,
    /// twice per task in the lifecycle benchmark: the first terminal `tasks/get`, then the
    /// kept `tasks/result` payload; issue 36).
    fn update_from(
        &self,
        upstream: &str,
        task_id: &str,
        known: &TaskRecord,
        change: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<Option<(TaskRecord, TaskRecord)>, StoreError> {
        let updated = self.update_from_stored(upstream, task_id, known, None, change)?;
        Ok(updated.map(|(before, after, _)| (before.unwrap_or_else(|| known.clone()), after)))
    }

    /// [`TaskStore::update_from`]'s compare-and-swap against `known_form` when the caller has
    /// it (the bytes this store returned with `known`), else against `known` encoded; returns
    /// the bytes written on that path.
    ///
    /// Why: encoding `known` again was about 4,000 instructions per update, two updates per
    /// task in the lifecycle benchmark (issue 36).
    fn update_from_stored(
        &self,
        upstream: &str,
        task_id: &str,
        known: &TaskRecord,
        known_form: Option<&[u8]>,
        change: &mut dyn FnMut(&mut TaskRecord) -> bool,
    ) -> Result<UpdatedStored, StoreError> {
        self.failed.guard(|| {
            let by_update = |change: &mut dyn FnMut(&mut TaskRecord) -> bool| {
                let updated = self.update(upstream, task_id, change)?;
                Ok(updated.map(|(before, after)| (Some(before), after, None)))
            };
            let mut probe = known.clone();
            // Nothing to write, or an expiry to move (its index entry with it: `update`): `known`
            // may be older than the store, so the stored record decides.
            if !change(&mut probe) || probe == *known || probe.expires_at != known.expires_at {
                return by_update(change);
            }
            let key = task_key(upstream, task_id);
            let encoded;
            let old = match known_form {
                Some(form) => form,
                None => {
                    encoded = encode(known);
                    &encoded[..]
                }
            };
            let form = encode_form_after(&probe, known, old);
            let swapped = self
                .tasks
                .compare_and_swap(&key, Some(old), Some(form.0.clone()))
                .map_err(db_err)?;
            match swapped {
                // `before` is `known` itself: the caller holds it (issue 36: a copy made only to
                // be returned, ~1,500 instructions and its drop, per update).
                Ok(()) => Ok(Some((None, probe, Some(form)))),
                Err(_) => by_update(change),
            }
        })
    }

    /// The record swapped to nothing against the bytes read (retried if another change won
    /// meanwhile, so the entries removed are those of the record removed), then its `by_owner`
    /// and `by_expiry` entries, each if still as read before the swap (`swap`). A change racing
    /// the removal finds no record and writes none; a crash after the record's removal leaves
    /// only its entries, leftovers that `list_owner` and `expired` skip and clean. A record that
    /// cannot be read stays ([`StoreError::Corrupt`], nothing removed).
    fn remove(&self, upstream: &str, task_id: &str) -> Result<Option<TaskRecord>, StoreError> {
        self.failed.guard(|| {
            let key = task_key(upstream, task_id);
            let removed = loop {
                let Some(raw) = self.tasks.get(&key).map_err(db_err)? else {
                    break None;
                };
                let old = decode(&raw)?;
                let (listed, expiring) = (owner_key(&old), expiry_key(&old));
                let dropped = [(&self.by_owner, &*listed), (&self.by_expiry, &*expiring)];
                match swap_indexed(&self.tasks, &key, Some(&raw), None, &[], &dropped, 0)? {
                    Ok(()) => break Some(old),
                    Err(Some(_)) => continue,
                    Err(None) => break None,
                }
            };
            if removed.is_some() {
                // The task's audit events go with it (the tree would otherwise only grow).
                for item in self.audit.scan_prefix(&key) {
                    let (k, _) = item.map_err(db_err)?;
                    self.audit.remove(k).map_err(db_err)?;
                }
            }
            Ok(removed)
        })
    }

    fn list_owner(
        &self,
        upstream: &str,
        owner: &Owner,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<(Vec<TaskRecord>, Option<ListCursor>), StoreError> {
        self.failed.guard(|| {
            let prefix = owner_prefix(upstream, owner);
            let iter = match cursor {
                Some(c) => self.by_owner.range(prefix.clone()..c.0.clone()),
                None => self.by_owner.scan_prefix(&prefix),
            };
            let mut page = Vec::with_capacity(limit.min(256));
            let mut last_key = None;
            for item in iter.rev() {
                let (k, v) = item.map_err(db_err)?;
                if !k.starts_with(&prefix) {
                    break;
                }
                if page.len() == limit {
                    return Ok((page, last_key.map(ListCursor)));
                }
                let mut rest = &k[prefix.len()..];
                let (Some(recorded_at), Some(task_id)) = (read_u64(&mut rest), read_str(&mut rest))
                else {
                    continue;
                };
                match self.get(upstream, task_id)? {
                    // The entry is this record's own: the same owner, recorded at the same time.
                    Some(r) if r.recorded_at == recorded_at && r.owner == *owner => {
                        page.push(r);
                        last_key = Some(k.to_vec());
                    }
                    // What a crash or a lost race left (`swap`): its record was never written or is
                    // gone, or the id was recorded again later for someone else. Skipped; removed
                    // once surely not a creation in progress, and only if still as read (a creation
                    // of the id may be writing it again).
                    _ if is_leftover(recorded_at, &v, now_ms()) => {
                        remove_entry(&self.by_owner, &k, &v)?;
                    }
                    _ => {}
                }
            }
            Ok((page, None))
        })
    }

    fn cursor_is_valid(&self, upstream: &str, owner: &Owner, cursor: &ListCursor) -> bool {
        let prefix = owner_prefix(upstream, owner);
        let Some(mut rest) = cursor.0.strip_prefix(prefix.as_slice()) else {
            return false;
        };
        read_u64(&mut rest).is_some() && read_str(&mut rest).is_some() && rest.is_empty()
    }

    fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        self.failed.guard(|| {
            /// The one field an expiry check reads (the rest of the record is skipped, not built).
            #[derive(serde::Deserialize)]
            struct Expiry {
                #[serde(default)]
                expires_at: u64,
            }
            let mut out = Vec::new();
            for item in self.by_expiry.range(..(now_ms + 1).to_be_bytes().to_vec()) {
                let (k, v) = item.map_err(db_err)?;
                let mut rest = &k[..];
                let (Some(expires_at), Some(up), Some(id)) = (
                    read_u64(&mut rest),
                    read_str(&mut rest),
                    read_str(&mut rest),
                ) else {
                    continue;
                };
                let recorded = match self.tasks.get(task_key(up, id)).map_err(db_err)? {
                    // A record that cannot be read is returned as before: its removal reports it,
                    // and one bad record does not stop every other task from expiring.
                    Some(record) => Some(
                        serde_json::from_slice::<Expiry>(&record)
                            .map_or(expires_at, |r| r.expires_at),
                    ),
                    None => None,
                };
                if recorded == Some(expires_at) {
                    out.push((up.to_string(), id.to_string()));
                } else if is_leftover(expires_at, &v, now_ms) {
                    // What a crash or a lost race left (see `swap`): no record, or a record whose
                    // expiry is another (moved since, or a later creation of the same id), which has
                    // an entry of its own. Never returned: the sweep would remove that record before
                    // its time. Removed only if still as read (a change may be writing it again).
                    remove_entry(&self.by_expiry, &k, &v)?;
                }
                if out.len() >= limit {
                    break;
                }
            }
            Ok(out)
        })
    }

    fn scan(&self, visit: &mut dyn FnMut(TaskRecord) -> bool) -> Result<(), StoreError> {
        self.failed
            .guard(|| self.scan_tasks(&mut |v| Ok(visit(decode(v)?))))
    }

    fn scan_heads(
        &self,
        visit: &mut dyn FnMut(super::RecordHead<'_>) -> bool,
    ) -> Result<(), StoreError> {
        self.failed.guard(|| {
            self.scan_tasks(&mut |v| {
                let head =
                    serde_json::from_slice(v).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                Ok(visit(head))
            })
        })
    }

    fn append_audit(&self, event: &AuditEvent) -> Result<(), StoreError> {
        self.failed.guard(|| {
            let mut key = task_key(&event.upstream, &event.task_id);
            let seq = self.db.generate_id().map_err(db_err)?;
            key.extend_from_slice(&seq.to_be_bytes());
            let value = serde_json::to_vec(event).expect("an audit event always serialises");
            self.audit.insert(key, value).map_err(db_err)?;
            Ok(())
        })
    }

    fn audit_for(&self, upstream: &str, task_id: &str) -> Result<Vec<AuditEvent>, StoreError> {
        self.failed.guard(|| {
            let prefix = task_key(upstream, task_id);
            let mut out = Vec::new();
            for item in self.audit.scan_prefix(&prefix) {
                let (k, v) = item.map_err(db_err)?;
                if k.len() != prefix.len() + 8 {
                    continue;
                }
                out.push(
                    serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt(e.to_string()))?,
                );
            }
            Ok(out)
        })
    }

    /// Bounded: a group commit not answered within [`COMMIT_DEADLINE`] fails the store
    /// (`failure`: sled's flush may never return after an I/O error).
    fn sync(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        if let Err(e) = self.failed.check() {
            return Box::pin(async move { Err(e) });
        }
        let (tx, rx) = oneshot::channel();
        let sent = self.request_sync(Some(tx));
        let deadline = std::time::Duration::from_millis(
            self.commit_deadline
                .load(std::sync::atomic::Ordering::SeqCst),
        );
        Box::pin(async move {
            // After `close` (the gateway's shutdown, once its listeners have drained) nothing
            // more is made durable: a flush here would run on the caller's thread (a runtime
            // worker) and, without the committer's `fdatasync`, would not be power-safe either.
            // So the caller is told, and acknowledges nothing (a creation's client gets an error,
            // not a `taskId` that may not survive).
            match sent {
                None => return Err(StoreError::Closed),
                Some(false) => return Err(StoreError::Db("the store committer stopped".into())),
                Some(true) => {}
            }
            match wait_real_time(deadline, rx).await {
                Ok(Ok(r)) => r.map_err(|why| match self.failed.reason() {
                    Some(failed) => StoreError::Failed(failed.to_string()),
                    None => StoreError::Db(why),
                }),
                Ok(Err(_)) => Err(StoreError::Db("the store committer stopped".into())),
                Err(_) => {
                    let why = format!(
                        "the task store did not answer within {} ms (a group commit did not finish)",
                        deadline.as_millis()
                    );
                    self.failed.set(why.clone());
                    Err(StoreError::Failed(why))
                }
            }
        })
    }

    fn sync_soon(&self) {
        if self.failed.reason().is_none() {
            let _ = self.request_sync(None);
        }
    }

    fn failed(&self) -> Option<String> {
        self.failed.reason().map(str::to_string)
    }

    /// An embedded store answers, unless it has failed (`failure`).
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let failed = self.failed.check();
        Box::pin(async move { failed })
    }

    /// sled's point calls are in-memory tree operations on this process's page cache; the
    /// group commit's `fdatasync` is the committer thread's. Measured (issue 36): handing each
    /// to a store thread cost more than the call (a thread woken and put back to sleep each
    /// time). What they can still wait for: a read of an evicted page (a local `pread`). Not
    /// sled 0.34's global concurrency-control lock: it blocks only once a process has run a
    /// sled transaction (then every tree call takes it shared, a transaction exclusively behind
    /// any flush in progress, and callers queue behind the transaction), and taskgate runs none
    /// (`swap`; `architecture_tests` checks), so the lock stays in its lock-free mode, where a
    /// call only counts itself in an atomic.
    fn quick_point_calls(&self) -> bool {
        true
    }

    fn leases(&self) -> Option<&dyn super::lease::LeaseStore> {
        Some(&self.leases)
    }
}

impl Drop for SledStore {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests;
