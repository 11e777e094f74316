//! The group commit's `fsync` of sled's blob files.
//!
//! sled 0.34 stores a log message larger than a quarter of its segment (512 KiB by default, so
//! about 128 KiB: a task record keeping a large result, `tasks.max_stored_result_bytes` is 1 MiB
//! by default) in a file of its own under `<store>/blobs/`, which it writes and never `fsync`s
//! (`pagecache/blob_io.rs`); the log keeps a pointer to it. The committer's `fdatasync` of the
//! `db` file made the pointer durable and not the bytes: after a power cut such a record could
//! come back as its earlier version (recovery skips a missing blob) or stop recovery at a torn
//! one, losing later writes that had been acknowledged (the cold review of the transaction-free
//! store). [`BlobSync::sync_new`] runs in each commit before the `db` file's `fdatasync`: each
//! blob file not synced before is, and then the directory (its new entries).
//!
//! A file first seen in a commit is synced again in the next one before it counts as synced: sled
//! creates it, then writes it, inside the record's log reservation, so a commit's listing (after
//! its `flush`) may find it half written by another thread. That record's pointer is only made
//! durable by a later commit, whose `flush` waits for every reservation made before it began, the
//! blob's included: by then the file is complete (the cold review of this stop).
//!
//! Needs a local file system: the directory's modification time must move with each new file
//! within [`TICK_DOUBT`] (NFS's attribute cache may keep it stale for longer).
//!
//! Cost when no blob is written (every small record): one `stat` of the directory per commit.
//! The directory is read again only when its modification time moved, or is too recent to tell
//! (a coarse clock tick may cover a file created just after the last read).

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How recent a directory modification time is read again at every commit: file system
/// timestamps move in clock ticks (a few ms), so a file created in the tick of the last read may
/// leave the time unchanged.
const TICK_DOUBT: Duration = Duration::from_secs(1);

/// The blob files of one store and which of them are synced.
pub(super) struct BlobSync {
    dir: PathBuf,
    /// The directory's modification time at the last read, when it was old enough to trust.
    read_at: Option<SystemTime>,
    synced: HashSet<OsString>,
    /// Files synced once, when first seen: synced again at the next commit (see the module doc).
    pending: HashSet<OsString>,
    /// Blob files synced so far (tests read it).
    count: Arc<AtomicU64>,
}

impl BlobSync {
    /// The blob files under `dir` (`<store>/blobs`), counting each file synced in `count`.
    pub(super) fn new(dir: PathBuf, count: Arc<AtomicU64>) -> BlobSync {
        BlobSync {
            dir,
            read_at: None,
            synced: HashSet::new(),
            pending: HashSet::new(),
            count,
        }
    }

    /// Syncs every blob file written since the last call, then the directory. Returns how many
    /// files it synced. Errors: the directory or a file could not be read or synced (the
    /// commit fails with it: what it would acknowledge is not on disk). A directory sled has not
    /// made yet, or a file sled removed meanwhile (a reclaimed segment's blob), is no error.
    pub(super) fn sync_new(&mut self) -> io::Result<usize> {
        let modified = match std::fs::metadata(&self.dir) {
            Ok(m) => m.modified()?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        if self.read_at == Some(modified) && self.pending.is_empty() {
            return Ok(0);
        }
        let mut synced = 0;
        // Seen last time, maybe half written then: complete since this commit's flush.
        for name in std::mem::take(&mut self.pending) {
            if sync_file(&self.dir.join(&name))? {
                synced += 1;
                self.synced.insert(name);
            }
        }
        let mut present = HashSet::with_capacity(self.synced.len());
        let mut first_seen = false;
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            if !self.synced.contains(&name) && sync_file(&self.dir.join(&name))? {
                synced += 1;
                first_seen = true;
                self.pending.insert(name.clone());
            }
            present.insert(name);
        }
        if first_seen {
            File::open(&self.dir)?.sync_all()?;
        }
        self.count.fetch_add(synced as u64, Ordering::Relaxed);
        // Names of removed files go; a time too recent to trust is read again next time.
        self.synced.retain(|name| present.contains(name));
        let settled = SystemTime::now()
            .duration_since(modified)
            .is_ok_and(|age| age > TICK_DOUBT);
        self.read_at = settled.then_some(modified);
        Ok(synced)
    }
}

/// `fdatasync` of the file at `path`; false when it is gone (sled removed it meanwhile).
fn sync_file(path: &std::path::Path) -> io::Result<bool> {
    match File::open(path).and_then(|f| f.sync_data()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// A file first seen while sled is still writing it (here: empty) is synced again at the next
    /// commit, then no more (the cold review: it was marked synced for good at once, its content
    /// never synced).
    #[test]
    fn a_blob_first_seen_is_synced_again_at_the_next_commit() {
        let dir = tempfile::tempdir().unwrap();
        let count = Arc::<AtomicU64>::default();
        let mut blobs = BlobSync::new(dir.path().to_path_buf(), count.clone());
        assert_eq!(blobs.sync_new().unwrap(), 0);
        let mut f = File::create(dir.path().join("42")).unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 1, "first seen");
        f.write_all(&[7; 4096]).unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 1, "synced again once complete");
        assert_eq!(blobs.sync_new().unwrap(), 0, "then it counts as synced");
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }
}
