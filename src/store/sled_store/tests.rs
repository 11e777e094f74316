//! Unit tests of the sled store.

use super::*;
use crate::mcp::task::TaskStatus;

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

/// An update whose record changed between its plain read and its write (here: another update
/// made from inside the change, the first time it runs) is not lost: the compare-and-swap of an
/// update that only changes the record fails, and the change is applied again to the record as it
/// is now, in the transaction. Both changes are in the record afterwards, and `before` is the
/// record the change was finally applied to.
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
/// only (the index entry moves with the record, in one transaction).
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
        .create_stored(created.clone())
        .await
        .unwrap()
        .expect("sled returns its bytes");
    let held = |store: &SledStore| store.tasks.get(task_key("up", "t")).unwrap().unwrap();
    assert_eq!(&*held(&store), &*form);
    let (before, after, next) = store
        .update_from_stored("up", "t", &created, Some(&form), &mut |r| {
            r.status_message = Some("half way".into());
            true
        })
        .unwrap()
        .unwrap();
    assert_eq!(before, created);
    let next = next.expect("the swap's bytes");
    assert_eq!(&*held(&store), &*next);
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
        (cancelled.clone(), cancelled, None)
    );
    assert_eq!(store.get("up", "t").unwrap().unwrap(), now);
}
