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
        if self.read_at == Some(modified) {
            return Ok(0);
        }
        let mut present = HashSet::with_capacity(self.synced.len());
        let mut synced = 0;
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            if !self.synced.contains(&name) {
                match File::open(self.dir.join(&name)).and_then(|f| f.sync_data()) {
                    Ok(()) => synced += 1,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
            }
            present.insert(name);
        }
        if synced > 0 {
            File::open(&self.dir)?.sync_all()?;
            self.count.fetch_add(synced as u64, Ordering::Relaxed);
        }
        // Names of removed files go; a time too recent to trust is read again next time.
        self.synced = present;
        let settled = SystemTime::now()
            .duration_since(modified)
            .is_ok_and(|age| age > TICK_DOUBT);
        self.read_at = settled.then_some(modified);
        Ok(synced)
    }
}
