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
