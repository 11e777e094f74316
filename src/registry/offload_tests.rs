//! Tests of `offload` (where the registry's store calls run).
use super::*;
use crate::layers::testing;
use serde_json::json;
use std::sync::mpsc;

/// With sled, a task's own store calls do not queue behind the store threads: while every one
/// of them is held by long work (a `/admin/tasks` scan, a sweep, a listing of many records), a
/// creation, its terminal status and a read of its record still complete at once. They were
/// handed to those threads and waited for a free one (issue 36: the hand-over was most of the
/// lifecycle's store cost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_own_store_calls_do_not_wait_for_busy_store_threads() {
    let (registry, _store) = testing::registry();
    let gate = Arc::new(std::sync::RwLock::new(()));
    let held = gate.write().unwrap();
    let (entered, all_in) = mpsc::channel();
    let threads = registry.store_threads();
    for _ in 0..STORE_THREADS {
        let (gate, entered) = (gate.clone(), entered.clone());
        threads
            .spawn(move || {
                entered.send(()).unwrap();
                drop(gate.read());
            })
            .unwrap();
    }
    tokio::task::spawn_blocking(move || {
        for _ in 0..STORE_THREADS {
            all_in.recv_timeout(Duration::from_secs(10)).unwrap();
        }
    })
    .await
    .unwrap();

    let up: Arc<str> = "up".into();
    let reservation = registry.reserve(&up, &testing::owner()).unwrap();
    let work = async {
        registry
            .record_creation(testing::record("t1"), &reservation)
            .await
            .unwrap();
        let done = json!({"taskId": "t1", "status": "completed"});
        registry
            .observe_task_as("up", "t1", done, "tasks/get")
            .await;
        registry.try_record_of("up", "t1").await.unwrap().unwrap()
    };
    let record = tokio::time::timeout(Duration::from_secs(3), work)
        .await
        .expect("a task's store calls waited for a free store thread");
    assert_eq!(record.status, crate::mcp::task::TaskStatus::Completed);
    drop(held);
}

/// A creation's slot taken in a shared store for a caller that went away meanwhile (its client
/// disconnected while the database answered: the `admit_creation` or, for 2025-11-25,
/// `reserve_creation` future dropped)
/// is given back once the taking ends, not held until its lease lapses
/// (`TASK_SLOT_LEASE`, 120 s, counting against the owner's limit all that time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_taken_for_a_caller_gone_meanwhile_is_given_back() {
    given_back_when_the_caller_is_gone(true).await;
    given_back_when_the_caller_is_gone(false).await;
}

/// [`a_slot_taken_for_a_caller_gone_meanwhile_is_given_back`] for a 2026 call's admission
/// (`modern`) or a 2025 creation's reservation.
async fn given_back_when_the_caller_is_gone(modern: bool) {
    let (registry, store) = testing::registry();
    store.with_slots.store(true, Ordering::SeqCst);
    let up: Arc<str> = "up".into();
    let reservation = Arc::new(registry.reserve_modern(&up, &testing::owner()));
    let held = store.slots.gate.lock().unwrap();
    let admitting = tokio::spawn({
        let (registry, reservation, up) = (registry.clone(), reservation.clone(), up.clone());
        async move {
            match modern {
                true => registry.admit_creation(&reservation).await.map(|_| ()),
                false => registry
                    .reserve_creation(&up, &testing::owner())
                    .await
                    .map(|_| ()),
            }
        }
    });
    let begun = tokio::task::spawn_blocking({
        let store = store.clone();
        move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while store.slots.begun.load(Ordering::SeqCst) == 0 {
                assert!(std::time::Instant::now() < deadline, "the taking began");
                std::thread::yield_now();
            }
        }
    });
    begun.await.unwrap();
    // The caller goes away while the store takes the slot.
    admitting.abort();
    assert!(admitting.await.unwrap_err().is_cancelled());
    drop(reservation);
    drop(held);
    let released = tokio::task::spawn_blocking({
        let store = store.clone();
        move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let released = store.slots.released.lock().unwrap().clone();
                if !released.is_empty() || std::time::Instant::now() > deadline {
                    return released;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(
        released,
        vec![1],
        "the slot taken is given back (modern: {modern})"
    );
    assert_eq!(registry.owners_count(&up, &testing::owner()), 0);
}
