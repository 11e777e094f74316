//! Tests of `refused` (terminal reports a shared store refused, applied again).
use super::*;
use crate::layers::testing::{self, CountingStore};
use crate::registry::{Observed, OnRefusal};
use crate::store::TaskStore;
use serde_json::json;

/// A registry over a shared (counting) store holding the working task `t1` of `up`.
async fn shared() -> (Arc<Registry>, Arc<CountingStore>) {
    let (registry, store) = testing::registry();
    store.create(testing::record("t1")).await.unwrap();
    store.with_slots.store(true, Ordering::SeqCst);
    (registry, store)
}

fn down(store: &CountingStore, down: bool) {
    store.fail_updates.store(down, Ordering::SeqCst);
}

fn report(status: TaskStatus, result: Option<&str>) -> Report {
    Report {
        status,
        message: None,
        updated_at: None,
        poll_interval_ms: None,
        tool_error: false,
        result: result.map(str::to_string),
        error: None,
    }
}

/// `taskgate_task_status_transitions_total` from `working` to `to` on `up` (0 when absent).
fn transitions_to(registry: &Registry, to: &str) -> u64 {
    let text = String::from_utf8(registry.metrics().encode()).unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("taskgate_task_status_transitions_total")
                && l.contains(r#"from="working""#)
                && l.contains(&format!(r#"to="{to}""#))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The fault: an upstream's `completed` (its result with it) the shared store refused was
/// written never again (the record stayed `working` until its ttl, holding its owner's slot).
/// Now it is kept, applied again once the store answers (not before: a round the store refuses
/// leaves it kept), with its message and result, the transition counted once; a refused
/// non-terminal report is not kept.
#[tokio::test]
async fn a_refused_terminal_report_is_written_once_the_store_answers() {
    let (registry, store) = shared().await;
    down(&store, true);
    let failures = registry.metrics().store_write_failures_total.get();
    let done = json!({"status": "completed", "statusMessage": "all done"});
    let observed = registry
        .observe_task_with_result(
            "up",
            "t1",
            done,
            r#"{"content":[]}"#.into(),
            "tasks/get",
            OnRefusal::Keep,
        )
        .await;
    assert_eq!(observed, Observed::Unknown, "refused");
    assert_eq!(
        registry.metrics().store_write_failures_total.get(),
        failures + 1
    );
    assert_eq!(registry.refused.len(), 1, "kept");
    registry
        .observe_task("up", json!({"taskId": "t1", "status": "working"}), "test")
        .await;
    assert_eq!(
        registry.refused.len(),
        1,
        "a non-terminal report is not kept"
    );

    assert_eq!(registry.apply_kept_reports().await, Round::Refused);
    assert_eq!(registry.refused.len(), 1, "still kept");
    let r = store.get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Working);

    down(&store, false);
    assert_eq!(registry.apply_kept_reports().await, Round::Took);
    assert_eq!(registry.refused.len(), 0, "written: forgotten");
    let r = store.get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Completed);
    assert_eq!(r.status_message.as_deref(), Some("all done"));
    assert_eq!(r.terminal_result.as_deref(), Some(r#"{"content":[]}"#));
    assert_eq!(transitions_to(&registry, "completed"), 1, "counted once");
}

/// A kept `completed` is not applied over a `cancelled` recorded meanwhile (once the store
/// was back, before the round): the record stays `cancelled`, no late result is counted for it
/// (the report came before the cancel), and the report is forgotten.
#[tokio::test]
async fn a_kept_report_is_not_applied_over_a_cancel_recorded_meanwhile() {
    let (registry, store) = shared().await;
    down(&store, true);
    registry
        .observe_task("up", json!({"taskId": "t1", "status": "completed"}), "test")
        .await;
    assert_eq!(registry.refused.len(), 1, "kept");
    down(&store, false);
    registry
        .observe_task("up", json!({"taskId": "t1", "status": "cancelled"}), "test")
        .await;
    assert_eq!(registry.apply_kept_reports().await, Round::Took);
    assert_eq!(registry.refused.len(), 0, "done with");
    let r = store.get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Cancelled, "the cancel stands");
    assert_eq!(r.late_result_at, None, "no late result");
    assert_eq!(transitions_to(&registry, "completed"), 0, "never completed");
}

/// Only a shared store's refusals are kept (sled refuses a write when its disk is full), and
/// not a gateway task's final write (it retries itself: [`OnRefusal::CallerRetries`]).
#[tokio::test]
async fn only_a_shared_stores_refusals_are_kept_and_not_a_callers_own() {
    let (registry, store) = testing::registry();
    store.create(testing::record("t1")).await.unwrap();
    down(&store, true);
    let done = json!({"taskId": "t1", "status": "completed"});
    registry.observe_task("up", done.clone(), "test").await;
    assert_eq!(registry.refused.len(), 0, "sled: not kept");
    store.with_slots.store(true, Ordering::SeqCst);
    registry
        .observe_task_with_error(
            "up",
            "t1",
            json!({"status": "failed"}),
            r#"{"code":-32603,"message":"x"}"#.into(),
            "gateway task",
            OnRefusal::CallerRetries,
        )
        .await;
    assert_eq!(registry.refused.len(), 0, "the caller retries: not kept");
    registry.observe_task("up", done, "test").await;
    assert_eq!(registry.refused.len(), 1, "shared: kept");
}

/// The set is bounded by count and by bytes (past either a report is not kept); one report per
/// task, the latest, which keeps the result an earlier one of the same status carried.
#[test]
fn the_kept_reports_are_bounded_one_per_task() {
    let kept = RefusedReports::with_bounds(2, 2 * ENTRY_BYTES + 1000);
    let done = |result| report(TaskStatus::Completed, result);
    assert!(kept.keep("up", "a", done(Some("{}")), "test"));
    assert!(kept.keep("up", "b", done(None), "test"));
    assert!(!kept.keep("up", "c", done(None), "test"), "past the count");
    assert_eq!(kept.len(), 2);
    assert!(
        kept.keep("up", "a", done(None), "test"),
        "a task's latest replaces its own"
    );
    assert_eq!(kept.len(), 2);
    let big = "x".repeat(1000);
    assert!(
        !kept.keep("up", "b", done(Some(&big)), "test"),
        "past the bytes"
    );
    let batch = kept.batch();
    assert_eq!(batch.len(), 2, "one per task");
    let a = batch.iter().find(|(k, ..)| k.1 == "a").unwrap();
    assert_eq!(
        a.2.result.as_deref(),
        Some("{}"),
        "the earlier result is kept"
    );
    let b = batch.iter().find(|(k, ..)| k.1 == "b").unwrap();
    assert_eq!(b.2.result, None, "the refused big one did not replace it");
    for (key, seq, ..) in batch {
        kept.done(key, seq);
    }
    assert_eq!(kept.len(), 0);
    assert_eq!(kept.held.lock().bytes, 0, "every byte given back");
    assert!(kept.keep("up", "c", done(None), "test"), "room again");
}

/// A round applies at most [`REPORTS_PER_TICK`]; one the store refused goes to the back of the
/// queue, after the round's untried ones; a newer report kept during a round is not forgotten
/// with the one it replaced.
#[test]
fn a_round_is_bounded_and_a_refused_report_goes_to_the_back() {
    let kept = RefusedReports::default();
    for i in 0..REPORTS_PER_TICK + 1 {
        assert!(kept.keep(
            "up",
            &format!("t{i}"),
            report(TaskStatus::Failed, None),
            "test"
        ));
    }
    let mut batch = kept.batch();
    assert_eq!(batch.len(), REPORTS_PER_TICK);
    let (first, seq, ..) = batch.remove(0);
    let untried: Vec<Key> = batch.into_iter().map(|(k, ..)| k).collect();
    kept.refused(first.clone(), seq, untried.clone());
    let queue: Vec<Key> = kept.held.lock().queue.iter().cloned().collect();
    assert_eq!(queue[..untried.len()], untried[..], "the untried first");
    assert_eq!(queue.last(), Some(&first), "the refused one last");
    assert_eq!(kept.held.lock().reports[&first].tries, 2);

    let (key, seq, ..) = kept.batch().remove(0);
    assert!(kept.keep(&key.0, &key.1, report(TaskStatus::Cancelled, None), "test"));
    kept.done(key.clone(), seq);
    assert!(
        kept.held.lock().reports.contains_key(&key),
        "the newer one stays"
    );
}

/// A graceful stop's drain waits for the kept reports (`Registry::refused_reports_written`):
/// at once when none is kept, else until the last is done with.
#[tokio::test]
async fn the_wait_for_kept_reports_ends_when_they_are_written() {
    let (registry, store) = shared().await;
    registry.refused_reports_written().await;
    down(&store, true);
    registry
        .observe_task("up", json!({"taskId": "t1", "status": "failed"}), "test")
        .await;
    assert_eq!(registry.refused_reports_kept(), 1);
    let waiting = {
        let registry = registry.clone();
        tokio::spawn(async move { registry.refused_reports_written().await })
    };
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "one is kept");
    down(&store, false);
    assert_eq!(registry.apply_kept_reports().await, Round::Took);
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the wait ends once it is written")
        .unwrap();
    let r = store.get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Failed);
}

/// A 2025 `tasks/result` payload ending a task (`apply_result_payload`) while the shared store
/// refuses writes was tried once and lost: the record stayed `working`. Now it is kept as a
/// terminal report and written once the store answers, as the status reports are.
#[tokio::test]
async fn a_refused_result_payload_is_written_once_the_store_answers() {
    let (registry, store) = shared().await;
    down(&store, true);
    registry.apply_result_payload("up", "t1", true).await;
    assert_eq!(registry.refused.len(), 1, "kept");
    assert_eq!(registry.apply_kept_reports().await, Round::Refused);
    down(&store, false);
    assert_eq!(registry.apply_kept_reports().await, Round::Took);
    assert_eq!(registry.refused.len(), 0, "written: forgotten");
    let r = store.get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Failed);
    assert!(r.terminal_at.is_some());
    assert_eq!(transitions_to(&registry, "failed"), 1, "counted once");
}

/// A kept report whose record cannot be read (the store still out of reach) is tried again
/// later; the failed read is no store write failure (`taskgate_store_write_failures_total`
/// counts the registry's writes the store refused, L5).
#[tokio::test]
async fn a_kept_reports_failed_read_is_not_a_write_failure() {
    let (registry, store) = shared().await;
    down(&store, true);
    registry
        .observe_task("up", json!({"taskId": "t1", "status": "completed"}), "test")
        .await;
    assert_eq!(registry.refused.len(), 1, "kept");
    let failures = registry.metrics().store_write_failures_total.get();
    store.fail_gets.store(true, Ordering::SeqCst);
    assert_eq!(registry.apply_kept_reports().await, Round::Refused);
    assert_eq!(registry.refused.len(), 1, "still kept");
    assert_eq!(
        registry.metrics().store_write_failures_total.get(),
        failures,
        "a read is not a write"
    );
    store.fail_gets.store(false, Ordering::SeqCst);
    down(&store, false);
    assert_eq!(registry.apply_kept_reports().await, Round::Took);
    let r = store.get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Completed);
}
