//! Unit tests of the sled store.

use super::*;
use crate::mcp::task::TaskStatus;
use crate::store::{HeldSessionRecord, HeldSessionStore};

/// `layers::testing`'s working task, owned by principal `owner`, recorded at `recorded_at` (ms)
/// and expiring 1 s later.
fn record(id: &str, owner: &str, recorded_at: u64) -> TaskRecord {
    TaskRecord {
        owner: Owner::Principal(owner.into()),
        recorded_at,
        expires_at: 1_000 + recorded_at,
        ..crate::layers::testing::record(id)
    }
}

/// Opens the store at `dir` again after the test dropped its first handle: sled's own threads
/// (its flusher, its I/O pool) may hold the database a moment longer, so "could not acquire
/// lock" is retried until the lock is free (at most 10 s); any other error fails at once.
async fn reopen(dir: &std::path::Path) -> Arc<SledStore> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match SledStore::open(dir, 1 << 20, None) {
            Ok(store) => return store,
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < until =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            Err(e) => panic!("reopening the store failed: {e}"),
        }
    }
}

#[tokio::test]
async fn records_survive_reopen_and_list_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    let alice = Owner::Principal("alice".into());
    let bob = Owner::Principal("bob".into());
    {
        let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
        for i in 0..5u64 {
            store
                .create(record(&format!("t:{i}"), "alice", i))
                .await
                .unwrap();
        }
        store.create(record("b", "bob", 9)).await.unwrap();
        let (page, next) = store.list_owner("up", &alice, None, 2).unwrap();
        let ids: Vec<_> = page.iter().map(|r| r.task_id.as_str()).collect();
        assert_eq!(ids, ["t:4", "t:3"]);
        let next = next.unwrap();
        assert!(store.cursor_is_valid("up", &alice, &next));
        assert!(!store.cursor_is_valid("up", &bob, &next));
        let (page, next) = store.list_owner("up", &alice, Some(&next), 2).unwrap();
        assert_eq!(page[0].task_id, "t:2");
        let (page, next) = store.list_owner("up", &alice, next.as_ref(), 2).unwrap();
        assert_eq!(page.len(), 1);
        assert!(next.is_none());
    }
    let store = reopen(dir.path()).await;
    assert_eq!(store.len(), 6);
    let (before, after) = store
        .update("up", "t:1", &mut |r| {
            r.status = TaskStatus::Cancelled;
            r.expires_at = 5;
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(before.status, TaskStatus::Working);
    assert_eq!(after.status, TaskStatus::Cancelled);
    assert_eq!(
        store.expired(5, 10).unwrap(),
        vec![("up".into(), "t:1".into())]
    );
    assert!(store.remove("up", "t:1").unwrap().is_some());
    assert!(store.get("up", "t:1").unwrap().is_none());
    assert_eq!(store.list_owner("up", &alice, None, 10).unwrap().0.len(), 4);
}

#[test]
fn a_second_open_names_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let _first = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    // sled locks per process with flock; a second process is what fails in practice, but a
    // second open in one process fails the same way while the first is alive.
    match SledStore::open(dir.path(), 1 << 20, None) {
        Err(e) => assert!(e.to_string().contains("lock"), "{e}"),
        Ok(_) => panic!("second open of a locked store succeeded"),
    }
}

/// A record over sled's blob threshold (about 128 KiB: a large kept result) lives in a file of
/// its own that sled never syncs: the commit syncs it (`blobs`) before acknowledging, and a
/// store of small records syncs none.
#[tokio::test]
async fn a_commit_syncs_the_blob_files_sled_writes_for_large_records() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    store
        .create(record("small", "alice", now_ms()))
        .await
        .unwrap();
    store.sync().await.unwrap();
    assert_eq!(store.blobs_synced.load(Ordering::Relaxed), 0);
    let mut large = record("large", "alice", now_ms());
    large.terminal_result = Some(format!("{{\"text\":\"{}\"}}", "x".repeat(300 << 10)));
    store.create(large).await.unwrap();
    store.sync().await.unwrap();
    assert!(
        store.blobs_synced.load(Ordering::Relaxed) >= 1,
        "the large record's blob file was not synced"
    );
    assert!(std::fs::read_dir(dir.path().join("blobs")).unwrap().count() >= 1);
}

/// `swap`'s second rule: an index entry is removed only if it still has the value its remover
/// read; one written again since (a writer asserting it for its record) stays. And no two
/// writes of an entry leave the same value, so "as read" means "not written since" (the cold
/// review: no other test failed with a plain remove or a constant value).
#[test]
fn an_index_entry_written_again_after_it_was_read_is_not_removed() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    let key = b"entry";
    let read = swap::index_value(5);
    store.by_expiry.insert(key, &read[..]).unwrap();
    let again = swap::index_value(5);
    assert_ne!(read, again, "two writes at one time leave different values");
    store.by_expiry.insert(key, &again[..]).unwrap();
    assert!(!remove_entry(&store.by_expiry, key, &read).unwrap());
    assert!(store.by_expiry.get(key).unwrap().is_some());
    assert!(remove_entry(&store.by_expiry, key, &again).unwrap());
    assert!(store.by_expiry.get(key).unwrap().is_none());
}

/// A held session's touches run on the store threads in no set order: an earlier expiry
/// arriving late does not move it back (an expiry returning to a value it had would break
/// `swap`'s rule), and its index entry stays the latest's.
#[test]
fn a_late_touch_does_not_move_a_held_session_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    let now = now_ms();
    store.put_held_session(session("h", now + 60_000)).unwrap();
    assert!(store.touch_held_session("up", "h", now + 120_000).unwrap());
    assert!(store.touch_held_session("up", "h", now + 90_000).unwrap());
    let kept = store.held_session("up", "h").unwrap().unwrap();
    assert_eq!(kept.expires_at, now + 120_000);
    assert_eq!(store.held_by_expiry.len(), 1);
    assert_eq!(
        store
            .remove_expired_held_sessions(now + 100_000, 10)
            .unwrap(),
        0
    );
}

/// A held session whose bytes cannot be read back goes at the sweep (it would stop every later
/// sweep), and its index entry after the leftover grace (the cold review: the compare-and-swap
/// removal had no test).
#[test]
fn an_unreadable_held_session_is_swept() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    store.put_held_session(session("h", 1_000)).unwrap();
    store
        .held
        .insert(task_key("up", "h"), &b"not a session"[..])
        .unwrap();
    assert!(store.held_session("up", "h").is_err());
    assert_eq!(store.remove_expired_held_sessions(2_000, 10).unwrap(), 1);
    assert_eq!(store.held.len(), 0);
    // Its entry, written just now, goes once surely not a write in progress (`is_leftover`).
    let far = now_ms() + 2 * LEFTOVER_GRACE_MS;
    store.remove_expired_held_sessions(far, 10).unwrap();
    assert_eq!(store.held_by_expiry.len(), 0);
}

/// After `close` (the gateway's shutdown) a sync fails at once instead of flushing on the
/// caller's thread without the committer's `fdatasync`: nothing waited for afterwards is
/// acknowledged as durable. Before `close` the same store's sync succeeds.
#[tokio::test]
async fn a_sync_after_close_fails_instead_of_flushing_on_the_callers_thread() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    store.create(record("t", "alice", now_ms())).await.unwrap();
    store.sync().await.unwrap();
    store.close();
    let err = store.sync().await.unwrap_err();
    assert!(
        err.to_string().contains("the task store is closed"),
        "{err}"
    );
    assert!(err.is_closed(), "work racing the stop, told apart: {err:?}");
}

/// A committer thread that died (here: its commit observer panics) is a fault, not a graceful
/// stop: every later sync fails as a store error, counted and logged at ERROR by the registry,
/// never as [`StoreError::Closed`] (cold review, 2026-12-05: a dead committer read as closed).
#[tokio::test]
async fn a_dead_committer_is_a_store_error_not_a_closed_store() {
    struct Panics;
    impl CommitObserver for Panics {
        fn commit(&self, _seconds: f64, _ok: bool) {
            panic!("the committer dies (test)");
        }
        fn write(&self, _seconds: f64) {}
    }
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, Some(Arc::new(Panics))).unwrap();
    // The first sync's commit kills the thread (while it unwinds, or after it is gone).
    for round in 0..50 {
        let err = store.sync().await.unwrap_err();
        assert!(!err.is_closed(), "round {round}: {err:?}");
        assert!(err.to_string().contains("committer stopped"), "{err}");
    }
}

/// An update whose record changed between its plain read and its write (here: another update
/// made from inside the change, the first time it runs) is not lost: the compare-and-swap against
/// the bytes first read fails, and the change is applied again to the record as it is now. Both
/// changes are in the record afterwards, and `before` is the record the change was finally
/// applied to.
#[tokio::test]
async fn an_update_racing_another_keeps_both() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    store.create(record("t", "alice", 1)).await.unwrap();
    let mut calls = 0;
    let (before, after) = store
        .update("up", "t", &mut |r| {
            calls += 1;
            if calls == 1 {
                let other = store.update("up", "t", &mut |o| {
                    o.status_message = Some("from the other update".into());
                    true
                });
                assert!(other.unwrap().is_some());
            }
            r.status = TaskStatus::Completed;
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(
        calls, 2,
        "the change ran again on the record as it was then"
    );
    assert_eq!(
        before.status_message.as_deref(),
        Some("from the other update")
    );
    assert_eq!(after.status, TaskStatus::Completed);
    assert_eq!(
        after.status_message.as_deref(),
        Some("from the other update")
    );
    let stored = store.get("up", "t").unwrap().unwrap();
    assert_eq!(stored, after);
    // The expiry index stays in step when only the record changed.
    assert_eq!(
        store.expired(1_001, 10).unwrap(),
        vec![("up".to_string(), "t".to_string())]
    );
}

/// A record changed by an update that moves its expiry is found by the sweep at the new time
/// only (the index entry moves with the record: the new one written before it, the old one
/// removed after).
#[tokio::test]
async fn an_update_moving_the_expiry_moves_its_index_entry() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    store.create(record("t", "alice", 1)).await.unwrap();
    store
        .update("up", "t", &mut |r| {
            r.expires_at = 5_000;
            true
        })
        .unwrap();
    assert!(store.expired(1_001, 10).unwrap().is_empty());
    assert_eq!(store.expired(5_000, 10).unwrap().len(), 1);
    assert_eq!(store.by_expiry.len(), 1, "the old entry is gone");
}

/// A creation refused for a taskId already recorded leaves no index entry of its own behind (the
/// refused owner lists nothing, the sweep finds the task once), and keeps the recorded task's
/// entries, also where the refused one's would have been the same keys.
#[tokio::test]
async fn a_refused_creation_leaves_the_index_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    store.create(record("t", "alice", 1)).await.unwrap();
    for (owner, recorded_at) in [("mallory", 2), ("alice", 1)] {
        assert!(matches!(
            store.create(record("t", owner, recorded_at)).await,
            Err(StoreError::Conflict(_))
        ));
        let mallory = Owner::Principal("mallory".into());
        assert!(store
            .list_owner("up", &mallory, None, 10)
            .unwrap()
            .0
            .is_empty());
        let alice = Owner::Principal("alice".into());
        assert_eq!(store.list_owner("up", &alice, None, 10).unwrap().0.len(), 1);
        assert_eq!(
            store.expired(u64::MAX - 1, 10).unwrap(),
            [("up".to_string(), "t".to_string())]
        );
    }
}

/// Index entries a crash left between a creation's index writes and its record write: one for a
/// task whose record was never written, and one of mallory's for an id the upstream later handed
/// to bob. Neither lists mallory anything or makes the sweep remove bob's record early, and once
/// older than `LEFTOVER_GRACE_MS` both are removed.
#[tokio::test]
async fn index_entries_a_crash_left_are_skipped_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    let now = now_ms();
    let (ghost, stale) = (record("ghost", "mallory", 5), record("t", "mallory", 6));
    for left in [&ghost, &stale] {
        // Written as long ago as each claims to have been recorded.
        store.write_index(left, left.recorded_at).unwrap();
    }
    // bob's task, recorded after the restart, expires in an hour.
    let mut bobs = record("t", "bob", now);
    bobs.expires_at = now + 3_600_000;
    store.create(bobs).await.unwrap();

    let mallory = Owner::Principal("mallory".into());
    let (page, next) = store.list_owner("up", &mallory, None, 10).unwrap();
    assert!(page.is_empty() && next.is_none(), "listed {page:?}");
    assert!(store.expired(now, 10).unwrap().is_empty());
    // Gone, not only skipped; bob's own entries stay.
    assert_eq!(store.by_owner.len(), 1);
    assert_eq!(store.by_expiry.len(), 1);
    assert_eq!(store.expired(now + 3_600_000, 10).unwrap().len(), 1);
}

/// Entries of a creation in progress (written, its record not yet) are not taken for leftovers.
#[tokio::test]
async fn a_young_entry_without_its_record_stays() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    let now = now_ms();
    let mut pending = record("p", "alice", now);
    pending.expires_at = now;
    store.write_index(&pending, now).unwrap();
    let alice = Owner::Principal("alice".into());
    assert!(store
        .list_owner("up", &alice, None, 10)
        .unwrap()
        .0
        .is_empty());
    assert!(store.expired(now, 10).unwrap().is_empty());
    assert_eq!((store.by_owner.len(), store.by_expiry.len()), (1, 1));
}

/// A creation whose writes come more than `LEFTOVER_GRACE_MS` after its record was built (a
/// stalled disk) keeps its index entries when a tasks/list and a sweep run between its index
/// writes and its record write: the entries carry the time they were written. (Found by the cold
/// review: the grace counted from `recorded_at` alone removed them, leaving a record that was
/// neither listed nor swept.)
#[tokio::test]
async fn a_late_creation_keeps_its_entries_against_a_concurrent_reader() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    let now = now_ms();
    let late = record("late", "alice", now - 62_000);
    // `insert_new`'s index writes ...
    store.write_index(&late, now).unwrap();
    // ... a tasks/list and a sweep in between ...
    let alice = Owner::Principal("alice".into());
    assert!(store
        .list_owner("up", &alice, None, 10)
        .unwrap()
        .0
        .is_empty());
    assert!(store.expired(now, 10).unwrap().is_empty());
    // ... and its record write.
    let key = task_key(&late.upstream, &late.task_id);
    let put = store
        .tasks
        .compare_and_swap(&key, None::<&[u8]>, Some(encode(&late)));
    assert!(put.unwrap().is_ok());
    let listed = store.list_owner("up", &alice, None, 10).unwrap().0.len();
    let swept = store.expired(now + 3_600_000, 10).unwrap().len();
    assert_eq!((listed, swept), (1, 1));
}

/// One record that cannot be read does not stop every other task from expiring: `expired`
/// returns its key as before (its removal reports the damage). (Found by the cold review.)
#[tokio::test]
async fn an_unreadable_record_does_not_stop_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    let bad = record("bad", "alice", 1);
    store.create(bad.clone()).await.unwrap();
    store.create(record("good", "alice", 2)).await.unwrap();
    let key = task_key(&bad.upstream, &bad.task_id);
    store.tasks.insert(key, &b"\x00not json"[..]).unwrap();
    let due = store.expired(10_000, 10).unwrap();
    assert_eq!(due.len(), 2, "{due:?}");
}

/// `update_from` swaps against the record it is handed only while the store still holds exactly
/// that record: from a stale one (the task was cancelled since) the change is decided on the
/// stored record, so a late `completed` never overwrites `cancelled`.
#[tokio::test]
async fn an_update_from_a_stale_record_decides_on_the_stored_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    store.create(record("t", "alice", 1)).await.unwrap();
    let known = store.get("up", "t").unwrap().unwrap();
    let mut complete = |r: &mut TaskRecord| {
        if !r.status.can_become(TaskStatus::Completed) {
            return false;
        }
        r.status = TaskStatus::Completed;
        true
    };
    // Current: swapped against it.
    let (before, after) = store
        .update_from("up", "t", &known, &mut |r| {
            r.status_message = Some("half way".into());
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(before, known);
    assert_eq!(store.get("up", "t").unwrap().unwrap(), after);
    let cancelled = store
        .update("up", "t", &mut |r| {
            r.status = TaskStatus::Cancelled;
            true
        })
        .unwrap()
        .unwrap()
        .1;
    // Stale (`known` is still working): the stored `cancelled` decides.
    let (before, after) = store
        .update_from("up", "t", &known, &mut complete)
        .unwrap()
        .unwrap();
    assert_eq!(before, cancelled);
    assert_eq!(after, cancelled);
    assert_eq!(store.get("up", "t").unwrap().unwrap(), cancelled);
}

/// `update_from_stored` swaps against the bytes handed with the record: the bytes `create_stored`
/// and each swap return are exactly what the store holds, so the next update swaps against them
/// without encoding; once the record changed under them (a stale pair), the stored record
/// decides, as for `update_from`.
#[tokio::test]
async fn an_update_from_stored_bytes_swaps_against_them_and_falls_back_when_stale() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    let created = record("t", "alice", 1);
    let form = store
        .create_stored(Arc::new(created.clone()))
        .await
        .unwrap()
        .expect("sled returns its bytes");
    let held = |store: &SledStore| store.tasks.get(task_key("up", "t")).unwrap().unwrap();
    assert_eq!(&*held(&store), &*form);
    // The very bytes sled holds, not a copy of them.
    assert_eq!(held(&store).as_ptr(), form.as_ptr());
    let (before, after, next) = store
        .update_from_stored("up", "t", &created, Some(&form), &mut |r| {
            r.status_message = Some("half way".into());
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(
        before, None,
        "the record before is `created` itself, not a copy"
    );
    let next = next.expect("the swap's bytes");
    assert_eq!(&*held(&store), &*next);
    assert_eq!(held(&store).as_ptr(), next.as_ptr());
    assert_eq!(store.get("up", "t").unwrap().unwrap(), after);
    let cancelled = store
        .update("up", "t", &mut |r| {
            r.status = TaskStatus::Cancelled;
            true
        })
        .unwrap()
        .unwrap()
        .1;
    // Stale (`after` and its bytes are still working): the stored `cancelled` decides.
    let (before, now, none) = store
        .update_from_stored("up", "t", &after, Some(&next), &mut |r| {
            if !r.status.can_become(TaskStatus::Completed) {
                return false;
            }
            r.status = TaskStatus::Completed;
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(
        (before, now.clone(), none),
        (Some(cancelled.clone()), cancelled, None)
    );
    assert_eq!(store.get("up", "t").unwrap().unwrap(), now);
}

/// The count an edit of [`concurrent_updates_all_apply_and_a_terminal_status_stands`] keeps in
/// `status_message`.
fn edits(r: &TaskRecord) -> u64 {
    r.status_message
        .as_deref()
        .map_or(0, |m| m.parse().unwrap())
}

/// Updates of one task from several threads at once (each counting itself in the record, some
/// cancelling, some completing, each only from a status that may become it) all apply: no
/// lost edit (the count is every update's), and the first terminal status stands (exactly one
/// update made the task terminal, and the record ends with its status).
#[test]
fn concurrent_updates_all_apply_and_a_terminal_status_stands() {
    const THREADS: u64 = 6;
    const EACH: u64 = 150;
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    let key = task_key("up", "t");
    store
        .write_index(&record("t", "alice", 1), now_ms())
        .unwrap();
    store
        .tasks
        .insert(&key, encode(&record("t", "alice", 1)))
        .unwrap();
    let made_terminal = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (store, made_terminal) = (&store, &made_terminal);
            s.spawn(move || {
                for i in 0..EACH {
                    // Thread 0 cancels half way; the others complete in their second half.
                    let to = match t {
                        0 if i == EACH / 2 => Some(TaskStatus::Cancelled),
                        0 => None,
                        _ if i >= EACH / 2 => Some(TaskStatus::Completed),
                        _ => None,
                    };
                    let (before, after) = store
                        .update("up", "t", &mut |r| {
                            r.status_message = Some((edits(r) + 1).to_string());
                            if let Some(to) = to.filter(|&to| r.status.can_become(to)) {
                                r.status = to;
                            }
                            true
                        })
                        .unwrap()
                        .unwrap();
                    assert_eq!(edits(&after), edits(&before) + 1);
                    if !before.status.is_terminal() && after.status.is_terminal() {
                        made_terminal.lock().unwrap().push(after.status);
                    }
                }
            });
        }
    });
    let last = store.get("up", "t").unwrap().unwrap();
    assert_eq!(edits(&last), THREADS * EACH, "an edit was lost");
    let made_terminal = made_terminal.into_inner().unwrap();
    assert_eq!(made_terminal.len(), 1, "{made_terminal:?}");
    assert_eq!(last.status, made_terminal[0]);
    assert_eq!((store.by_owner.len(), store.by_expiry.len()), (1, 1));
}

/// An update that loses its compare-and-swap to a cancel (made from inside its change, the first
/// time it runs) judges the cancelled record: its `completed` is refused, and `cancelled` stays.
#[tokio::test]
async fn an_update_that_loses_to_a_cancel_does_not_overwrite_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    store.create(record("t", "alice", 1)).await.unwrap();
    let mut calls = 0;
    let (before, after) = store
        .update("up", "t", &mut |r| {
            calls += 1;
            if calls == 1 {
                let cancel = store.update("up", "t", &mut |c| {
                    c.status = TaskStatus::Cancelled;
                    true
                });
                assert!(cancel.unwrap().is_some());
            }
            if !r.status.can_become(TaskStatus::Completed) {
                return false;
            }
            r.status = TaskStatus::Completed;
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(calls, 2);
    assert_eq!(
        (before.status, after.status),
        (TaskStatus::Cancelled, TaskStatus::Cancelled)
    );
    assert_eq!(
        store.get("up", "t").unwrap().unwrap().status,
        TaskStatus::Cancelled
    );
}

/// A removal made while an update that moves the expiry is under way (from inside its change,
/// the first time it runs): the update finds no record and writes none (it returns `None`: the
/// record is not brought back), and the expiry entry it wrote before its swap is a leftover the
/// sweep removes; the removal took the record's own entries.
#[tokio::test]
async fn a_removal_racing_an_update_leaves_no_record_and_no_entry_after_a_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    store.create(record("t", "alice", 1)).await.unwrap();
    let now = now_ms();
    let mut calls = 0;
    let updated = store
        .update("up", "t", &mut |r| {
            calls += 1;
            if calls == 1 {
                assert!(store.remove("up", "t").unwrap().is_some());
            }
            r.status = TaskStatus::Completed;
            r.expires_at = now + 5_000;
            true
        })
        .unwrap();
    assert!(updated.is_none(), "{updated:?}");
    assert_eq!(calls, 1);
    assert!(store.get("up", "t").unwrap().is_none());
    assert_eq!(store.by_owner.len(), 0);
    assert_eq!(store.by_expiry.len(), 1, "the update's entry, left");
    // Not returned (no record), and removed once past the grace.
    assert!(store.expired(now + 5_000, 10).unwrap().is_empty());
    assert_eq!(
        store.by_expiry.len(),
        1,
        "young: could be a change in progress"
    );
    let later = now + 5_000 + LEFTOVER_GRACE_MS + 1;
    assert!(store.expired(later, 10).unwrap().is_empty());
    assert_eq!(store.by_expiry.len(), 0);
    assert!(store.scan_heads(&mut |_| panic!("a ghost")).is_ok());
}

/// Removals racing updates (moving the expiry) from several threads, each task created again
/// after its removal: whichever wins, no record is left after the last removal, and after a
/// sweep past the grace no index entry either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removals_racing_updates_leave_nothing_after_a_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    for round in 0..40u64 {
        store.create(record("t", "alice", round)).await.unwrap();
        let removed = std::thread::scope(|s| {
            for t in 0..3u64 {
                let store = &store;
                s.spawn(move || {
                    for i in 0..20 {
                        let _ = store
                            .update("up", "t", &mut |r| {
                                r.expires_at = 10_000 + round * 1_000 + t * 100 + i;
                                true
                            })
                            .unwrap();
                    }
                });
            }
            let remover = s.spawn(|| store.remove("up", "t").unwrap());
            remover.join().unwrap()
        });
        assert!(removed.is_some());
        assert!(store.get("up", "t").unwrap().is_none(), "round {round}");
    }
    assert_eq!(store.len(), 0);
    assert_eq!(store.by_owner.len(), 0);
    let later = now_ms() + LEFTOVER_GRACE_MS + 1;
    assert!(store.expired(later, 10_000).unwrap().is_empty());
    assert_eq!(store.by_expiry.len(), 0);
}

/// Whether the store's trees agree: every record has its `by_owner` and `by_expiry` entries,
/// every held session its `held_by_expiry` entry (an entry without its record is allowed: a
/// leftover).
fn every_record_indexed(store: &SledStore) {
    let mut records = Vec::new();
    store
        .scan(&mut |r| {
            records.push(r);
            true
        })
        .unwrap();
    for r in &records {
        assert!(store.by_owner.contains_key(owner_key(r)).unwrap(), "{r:?}");
        assert!(
            store.by_expiry.contains_key(expiry_key(r)).unwrap(),
            "{r:?}"
        );
    }
    for item in store.held.iter() {
        let s = HeldSessionRecord::decode(&item.unwrap().1).unwrap();
        let k = held::expiry_key(s.expires_at, &s.upstream, &s.session_id);
        assert!(store.held_by_expiry.contains_key(k).unwrap(), "{s:?}");
    }
}

/// The readers after a crash: a listing and a sweep return only stored records (no ghosts), each
/// once, and leave exactly the records' own index entries.
fn readers_return_no_ghosts_and_clean(store: &SledStore) {
    let mut keys = std::collections::BTreeSet::new();
    store
        .scan(&mut |r| {
            keys.insert((r.upstream, r.task_id));
            true
        })
        .unwrap();
    let alice = Owner::Principal("alice".into());
    let listed = store.list_owner("up", &alice, None, 100).unwrap().0;
    let listed: Vec<_> = listed
        .into_iter()
        .map(|r| (r.upstream, r.task_id))
        .collect();
    assert_eq!(
        listed
            .iter()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        keys
    );
    assert_eq!(listed.len(), keys.len());
    let far = now_ms() + 2 * LEFTOVER_GRACE_MS + 7_200_000;
    let due = store.expired(far, 100).unwrap();
    assert_eq!(
        due.iter()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        keys
    );
    assert_eq!(due.len(), keys.len());
    assert_eq!(
        store.by_expiry.len(),
        keys.len(),
        "a leftover expiry entry stayed"
    );
    // `list_owner` judges by the clock: an entry without its record written just now (a
    // creation cut short in this test) is young, and stays; none older does.
    for item in store.by_owner.iter() {
        let (k, v) = item.unwrap();
        let mut rest = &k[owner_prefix("up", &alice).len()..];
        let (at, id) = (read_u64(&mut rest).unwrap(), read_str(&mut rest).unwrap());
        if !keys.contains(&("up".to_string(), id.to_string())) {
            assert!(
                !is_leftover(at, &v, now_ms()),
                "an old by_owner leftover of {id} stayed"
            );
        }
    }
}

/// A held session `id` of alice's on upstream `up`, expiring at `expires_at`.
fn session(id: &str, expires_at: u64) -> HeldSessionRecord {
    HeldSessionRecord {
        upstream: "up".into(),
        session_id: id.into(),
        owner: Some("alice".into()),
        protocol_version: Some("2025-11-25".into()),
        capability_bits: 2,
        upstream_tasks_tools_call: true,
        upstream_without_tasks: false,
        client_capabilities: serde_json::json!({"elicitation": {}}),
        client_info: None,
        expires_at,
        upstream_issued: false,
    }
}

/// Every change stopped after each prefix of its writes (a simulated crash: `swap::WRITES_LEFT`),
/// the store reopened: no record or held session is left without its index entries, the record
/// is as before or as after the change, and listings and sweeps return no ghost and clean the
/// leftovers. (Writing a record before the entries it gains, or removing its entries before the
/// record, fails here.)
#[tokio::test]
async fn a_change_cut_after_any_write_recovers_after_a_reopen() {
    let now = now_ms();
    // The task: recorded and indexed long ago (so that its `by_owner` entry, once a leftover,
    // is old enough for `list_owner` to remove), expiring in an hour.
    let mut old = record("t", "alice", 1);
    old.expires_at = now + 3_600_000;
    type Change = fn(&SledStore, u64) -> Result<(), StoreError>;
    let changes: [(&str, Change); 6] = [
        ("create", |s, now| {
            let mut r = record("n", "alice", 2);
            r.expires_at = now + 3_600_000;
            s.insert_new(&r).map(drop)
        }),
        ("update moving the expiry", |s, now| {
            let moved = s.update("up", "t", &mut |r| {
                r.status = TaskStatus::Completed;
                r.expires_at = now + 1_800_000;
                true
            });
            moved.map(drop)
        }),
        ("remove", |s, _| s.remove("up", "t").map(drop)),
        ("put over a held session", |s, now| {
            s.put_held_session(session("h", now + 120_000))
        }),
        ("touch a held session", |s, now| {
            s.touch_held_session("up", "h", now + 180_000).map(drop)
        }),
        ("remove a held session", |s, _| {
            s.remove_held_session("up", "h").map(drop)
        }),
    ];
    for (what, change) in changes {
        for writes in 0..=4 {
            let dir = tempfile::tempdir().unwrap();
            {
                let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
                store.write_index(&old, 1).unwrap();
                let key = task_key(&old.upstream, &old.task_id);
                store.tasks.insert(key, encode(&old)).unwrap();
                store.put_held_session(session("h", now + 60_000)).unwrap();
                swap::WRITES_LEFT.set(Some(writes));
                let done = change(&store, now);
                swap::WRITES_LEFT.set(None);
                if let Err(e) = &done {
                    assert!(e.to_string().contains("simulated crash"), "{what}: {e}");
                }
                store.close();
            }
            let store = reopen(dir.path()).await;
            every_record_indexed(&store);
            let t = store.get("up", "t").unwrap();
            assert!(
                t.as_ref().is_none_or(|t| t.task_id == "t"),
                "{what} after {writes} writes: {t:?}"
            );
            readers_return_no_ghosts_and_clean(&store);
            // The held sessions: the sweep at a time past every expiry and its grace leaves
            // neither a session nor an entry (a session without its entry would stay).
            let far = now + 2 * LEFTOVER_GRACE_MS + 3_600_000;
            store.remove_expired_held_sessions(far, 100).unwrap();
            assert_eq!(
                (store.held.len(), store.held_by_expiry.len()),
                (0, 0),
                "{what} after {writes} writes"
            );
        }
    }
}

/// Held sessions written, touched and removed survive a reopen as last written, with their
/// index: the sweep still finds a touched session at its new expiry only.
#[tokio::test]
async fn held_sessions_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let now = now_ms();
    {
        let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
        for id in ["a", "b", "c"] {
            store.put_held_session(session(id, now + 60_000)).unwrap();
        }
        assert!(store.touch_held_session("up", "b", now + 600_000).unwrap());
        assert!(store.remove_held_session("up", "c").unwrap());
        store.sync().await.unwrap();
    }
    let store = reopen(dir.path()).await;
    assert_eq!(
        store.held_session("up", "a").unwrap(),
        Some(session("a", now + 60_000))
    );
    assert_eq!(
        store.held_session("up", "b").unwrap(),
        Some(session("b", now + 600_000))
    );
    assert!(store.held_session("up", "c").unwrap().is_none());
    assert_eq!(store.held_by_expiry.len(), 2);
    assert_eq!(
        store
            .remove_expired_held_sessions(now + 60_000, 10)
            .unwrap(),
        1
    );
    assert!(store.held_session("up", "b").unwrap().is_some());
    assert_eq!(
        store
            .remove_expired_held_sessions(now + 600_000, 10)
            .unwrap(),
        1
    );
    assert_eq!((store.held.len(), store.held_by_expiry.len()), (0, 0));
}

/// tester4 finding 1: a group commit that never finishes (sled's flush after an I/O error
/// waits forever) no longer hangs the write waiting on it: the write fails within the commit
/// deadline, the store is failed for good naming why, every later call fails at once (no
/// sled call, no wait), and `close` returns at once instead of joining the stuck committer.
#[tokio::test]
async fn a_commit_that_never_finishes_fails_the_store_within_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    store.create(record("before", "alice", 1)).await.unwrap();
    store.set_commit_deadline(std::time::Duration::from_millis(200));
    store.stall_commits(true);
    let refused = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        store.create(record("stuck", "alice", 2)),
    )
    .await
    .expect("a creation whose commit never finishes is answered within the deadline");
    let why = match refused {
        Err(StoreError::Failed(why)) => why,
        other => panic!("expected the store failed, got {other:?}"),
    };
    assert!(why.contains("did not answer within 200 ms"), "{why}");
    assert_eq!(store.failed().as_deref(), Some(why.as_str()));
    // Every later call fails at once, naming the failure and the remedy.
    let later = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        store.create(record("after", "alice", 3)),
    )
    .await
    .expect("no wait once failed");
    let message = later.unwrap_err().to_string();
    assert!(
        message.contains("restart taskgate") && message.contains(&why),
        "{message}"
    );
    assert!(matches!(
        store.get("up", "before"),
        Err(StoreError::Failed(_))
    ));
    assert!(matches!(
        store.list_owner("up", &Owner::Principal("alice".into()), None, 10),
        Err(StoreError::Failed(_))
    ));
    assert!(store.ping().await.is_err());
    // The graceful stop's close does not wait for the stuck committer.
    let (tx, rx) = std::sync::mpsc::channel();
    let closing = store.clone();
    std::thread::spawn(move || {
        closing.close();
        let _ = tx.send(());
    });
    rx.recv_timeout(std::time::Duration::from_secs(5))
        .expect("close returns although the committer is stuck");
    store.stall_commits(false);
}

/// tester4 finding 2: a creation whose group commit failed is not recorded: after the store
/// is reopened (sled's own flush on drop would have written what its memory held) the task is
/// neither gettable nor listed, while a task acknowledged before the failure is.
#[tokio::test]
async fn a_creation_whose_commit_failed_is_not_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let alice = Owner::Principal("alice".into());
    {
        let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
        store.create(record("acked", "alice", 1)).await.unwrap();
        store.fail_commits(true);
        let refused = store.create(record("refused", "alice", 2)).await;
        assert!(matches!(refused, Err(StoreError::Failed(_))), "{refused:?}");
        assert!(store.failed().unwrap().contains("No space left on device"));
        store.fail_commits(false);
        // Still failed: sled does not recover in the process.
        assert!(matches!(
            store.create(record("later", "alice", 3)).await,
            Err(StoreError::Failed(_))
        ));
        // What the failed store still holds in memory reaches disk on drop, as sled's own
        // flush would.
        store.db.flush().unwrap();
    }
    let store = reopen(dir.path()).await;
    assert!(store.failed().is_none());
    assert!(store.get("up", "refused").unwrap().is_none());
    assert!(store.get("up", "later").unwrap().is_none());
    let (page, _) = store.list_owner("up", &alice, None, 10).unwrap();
    let ids: Vec<_> = page.iter().map(|r| r.task_id.as_str()).collect();
    assert_eq!(ids, ["acked"]);
}

/// An I/O error sled returns from a point call fails the store for good, as a failed commit
/// does (sled sets its own global error then and does not recover in the process).
#[test]
fn a_sled_error_fails_the_store_and_a_simulated_crash_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    let crashed: Result<(), StoreError> = store.failed.note(Err(StoreError::Db(SIMULATED.into())));
    assert!(matches!(crashed, Err(StoreError::Db(_))));
    assert!(store.failed().is_none());
    let io: Result<(), StoreError> = store.failed.note(Err(StoreError::Db(
        "IO error: Permission denied (os error 13)".into(),
    )));
    assert!(matches!(io, Err(StoreError::Failed(_))));
    assert!(
        matches!(store.get("up", "x"), Err(StoreError::Failed(why)) if why.contains("os error 13"))
    );
}

/// A value past one of the store's bounds is refused, and only it: the store does not fail
/// (a client's 5 KB capabilities failed the whole store for good when the bound's error was
/// taken for sled's own, `store_contract::contract_sled`).
#[test]
fn a_value_past_a_bound_is_refused_without_failing_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20, None).unwrap();
    let mut big = session("big", now_ms() + 60_000);
    big.client_capabilities = serde_json::json!({"sampling": {"x": "y".repeat(5000)}});
    assert!(matches!(
        store.put_held_session(big),
        Err(StoreError::TooLarge(why)) if why.contains("capabilities")
    ));
    assert!(store.failed().is_none());
    assert!(store.held_session("up", "big").unwrap().is_none());
    store
        .put_held_session(session("h", now_ms() + 60_000))
        .unwrap();
}

const SIMULATED: &str = "simulated crash";
