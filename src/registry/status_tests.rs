//! Tests of `status` (the registry's status machine).
use super::*;

fn rewrite(message: Option<&str>, json: &str) -> String {
    let o = Observed::Rewrite {
        status: TaskStatus::Completed,
        status_message: message.map(str::to_string),
    };
    let out = o.rewrite_bytes(json.as_bytes(), &["result"]).unwrap();
    String::from_utf8(out.to_vec()).unwrap()
}

#[test]
fn would_change_is_false_for_a_poll_repeating_a_terminal_status() {
    let mut r = crate::layers::testing::record("t1");
    r.status = TaskStatus::Completed;
    let same = serde_json::json!({"status": "completed", "lastUpdatedAt": "2030-01-01T00:00:00Z", "statusMessage": "x"});
    assert!(
        !Registry::would_change(&r, &same),
        "a terminal record never changes"
    );
    let other = serde_json::json!({"status": "failed"});
    assert!(
        Registry::would_change(&r, &other),
        "a contradiction is counted once"
    );
    r.status = TaskStatus::Working;
    assert!(Registry::would_change(&r, &same), "working -> completed");
    let poll = serde_json::json!({"status": "working", "lastUpdatedAt": r.last_updated_at.clone()});
    assert!(!Registry::would_change(&r, &poll));
    // The upstream's earlier time of a terminal status recorded with a later one is taken.
    r.status = TaskStatus::Completed;
    let earlier =
        serde_json::json!({"status": "completed", "lastUpdatedAt": "2025-12-31T23:59:59Z"});
    assert!(Registry::would_change(&r, &earlier));
}

/// A task's end recorded with taskgate's time (a `tasks/result` payload carries none) takes the
/// upstream's earlier time when a report of the same status brings it, so `tasks/list` shows
/// what `tasks/get` shows; a later time, or a time that does not parse, changes nothing.
#[tokio::test]
async fn a_terminal_record_takes_the_upstreams_earlier_time() {
    let (registry, _store) = crate::layers::testing::registry();
    let owner = crate::layers::testing::owner();
    let reservation = registry.reserve(&"up".into(), &owner).unwrap();
    registry
        .record_creation(crate::layers::testing::record("t1"), &reservation)
        .await
        .unwrap();
    registry.apply_result_payload("up", "t1", false).await;
    let stamped = registry.store().get("up", "t1").unwrap().unwrap();
    let report =
        |at: &str| serde_json::json!({"taskId": "t1", "status": "completed", "lastUpdatedAt": at});
    for (at, kept) in [
        ("2099-01-01T00:00:00Z", stamped.last_updated_at.as_str()),
        ("not a time", stamped.last_updated_at.as_str()),
        ("2026-01-01T00:00:05Z", "2026-01-01T00:00:05Z"),
        ("2026-01-01T00:00:09Z", "2026-01-01T00:00:05Z"),
    ] {
        registry.observe_task("up", report(at), "tasks/get").await;
        let r = registry.store().get("up", "t1").unwrap().unwrap();
        assert_eq!(
            (r.status, r.last_updated_at.as_str()),
            (TaskStatus::Completed, kept),
            "{at}"
        );
    }
}

#[test]
fn rewrite_bytes_splices_status_and_message() {
    let big = r#""n":123456789012345678901234567890"#;
    // Replace both.
    let json = format!(r#"{{"result":{{"z":1,"status":"working","statusMessage":"x",{big}}}}}"#);
    let want =
        format!(r#"{{"result":{{"z":1,"status":"completed","statusMessage":"done",{big}}}}}"#);
    assert_eq!(rewrite(Some("done"), &json), want);
    // Remove the message.
    let want = format!(r#"{{"result":{{"z":1,"status":"completed",{big}}}}}"#);
    assert_eq!(rewrite(None, &json), want);
    // Insert a message after `status`.
    let json = format!(r#"{{"result":{{"status":"working",{big}}}}}"#);
    let want = format!(r#"{{"result":{{"status":"completed","statusMessage":"a \"b\"",{big}}}}}"#);
    assert_eq!(rewrite(Some("a \"b\""), &json), want);
    // No message on either side.
    let want = format!(r#"{{"result":{{"status":"completed",{big}}}}}"#);
    assert_eq!(rewrite(None, &json), want);
}

#[test]
fn rewrite_bytes_falls_back_to_a_full_rewrite_for_an_escaped_key() {
    let json = r#"{"result":{"status":"working","status\u004dessage":"x"}}"#;
    let v: Value = serde_json::from_str(&rewrite(None, json)).unwrap();
    assert_eq!(v, serde_json::json!({"result":{"status":"completed"}}));
    let o = Observed::Recorded(TaskStatus::Working);
    assert!(o.rewrite_bytes(json.as_bytes(), &["result"]).is_none());
    let not_object = r#"{"result":[1]}"#;
    let o = Observed::Rewrite {
        status: TaskStatus::Completed,
        status_message: None,
    };
    assert!(o
        .rewrite_bytes(not_object.as_bytes(), &["result"])
        .is_none());
}

/// A status change leaves the new record in the record cache: the next poll's authorising
/// read needs no store read (before, the change dropped the entry and every task whose status
/// changed cost a store read off the runtime on its next poll).
#[tokio::test]
async fn a_status_change_keeps_the_new_record_cached() {
    let (registry, store) = crate::layers::testing::registry();
    let r = crate::layers::testing::record("t1");
    crate::store::TaskStore::create(store.as_ref(), r.clone())
        .await
        .unwrap();
    let owner = r.owner.clone();
    assert!(registry.lookup(&r.upstream, "t1", &owner).await.is_some());
    let gets = store.counts.snapshot()[0];
    let task = serde_json::json!({"taskId": "t1", "status": "input_required"});
    registry
        .observe_task_as(&r.upstream, "t1", task, "test")
        .await;
    let seen = registry
        .lookup(&r.upstream, "t1", &owner)
        .await
        .expect("visible");
    assert_eq!(seen.status, TaskStatus::InputRequired);
    assert_eq!(store.counts.snapshot()[0], gets, "served from the cache");
}

/// A gateway task's `tasks/cancel` is audited as what it is (a notifications/cancelled for its
/// held call), not as forwarded upstream; a client task's still is.
#[tokio::test]
async fn a_gateway_task_cancel_is_audited_as_notifications_cancelled() {
    use crate::store::{Origin, TaskStore};
    let (registry, store) = crate::layers::testing::registry();
    let mut gateway = crate::layers::testing::record("gt");
    gateway.origin = Origin::Gateway;
    store.create(gateway).await.unwrap();
    store
        .create(crate::layers::testing::record("ct"))
        .await
        .unwrap();
    registry.request_cancel("up", "gt").await.unwrap();
    registry.request_cancel("up", "ct").await.unwrap();
    let detail = |id: &str| {
        store
            .audit_for("up", id)
            .unwrap()
            .into_iter()
            .find(|e| e.event == "cancel_requested")
            .map(|e| e.detail)
            .unwrap()
    };
    assert!(
        detail("gt").contains("notifications/cancelled"),
        "{}",
        detail("gt")
    );
    assert_eq!(detail("ct"), "tasks/cancel forwarded upstream");
}

/// "cancel requested" is one fact per task: a second forwarded cancel (a gateway task's, a
/// bridge's) and any number of acknowledged ones leave one `cancel_requested` event and keep
/// the first `cancel_requested_at` (break-tasks M5: each appended an event, without bound).
#[tokio::test]
async fn cancel_requested_is_recorded_once_per_task() {
    use crate::store::{Origin, TaskStore};
    let (registry, store) = crate::layers::testing::registry();
    let mut gateway = crate::layers::testing::record("gt");
    gateway.origin = Origin::Gateway;
    store.create(gateway).await.unwrap();
    let first = registry.request_cancel("up", "gt").await.unwrap();
    let again = registry.request_cancel("up", "gt").await.unwrap();
    assert_eq!(first.cancel_requested_at, again.cancel_requested_at);
    for _ in 0..5 {
        registry.record_cancel_acknowledged("up", "gt").await;
    }
    let requested = store
        .audit_for("up", "gt")
        .unwrap()
        .into_iter()
        .filter(|e| e.event == "cancel_requested")
        .count();
    assert_eq!(requested, 1);
}

use crate::test_log::Captured;

/// Work that races a graceful stop (a task turned terminal after the sled store was closed:
/// its commit cannot be awaited any more) ends quietly: no ERROR, nothing counted as a store
/// failure; the fact is logged at DEBUG. (Before: "task store error: the task store is closed
/// (taskgate is shutting down)" at ERROR, and a store write failure counted, at every stop.)
#[tokio::test]
async fn a_terminal_status_racing_shutdown_logs_no_store_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::store::SledStore::open(dir.path(), 1 << 20, None).unwrap();
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::new(&["up".to_string()]));
    let registry = Registry::new(
        store.clone() as std::sync::Arc<dyn crate::store::TaskStore>,
        metrics.clone(),
        crate::config::TasksConfig::default(),
    )
    .unwrap();
    let owner = crate::layers::testing::owner();
    let reservation = registry.reserve(&"up".into(), &owner).unwrap();
    registry
        .record_creation(crate::layers::testing::record("t1"), &reservation)
        .await
        .unwrap();
    store.close();
    let logs = Captured::default();
    let guard = logs.install();
    let done = serde_json::json!({"taskId": "t1", "status": "completed"});
    registry.observe_task("up", done, "tasks/get").await;
    drop(guard);
    let text = logs.text();
    assert!(text.contains("the task store is closed"), "{text}");
    assert!(!text.contains("ERROR"), "{text}");
    assert_eq!(metrics.store_write_failures_total.get(), 0, "{text}");
}

/// A real store failure still logs at ERROR (only the closed store's is quiet).
#[test]
fn a_real_store_failure_still_logs_at_error() {
    let logs = Captured::default();
    let guard = logs.install();
    crate::store::log_failure(
        &crate::store::StoreError::Db("disk full".into()),
        "a write failed",
    );
    crate::store::log_failure(&crate::store::StoreError::Closed, "a racing write");
    drop(guard);
    let text = logs.text();
    let line = |needle: &str| text.lines().find(|l| l.contains(needle)).unwrap_or("");
    assert!(line("disk full").contains("ERROR"), "{text}");
    assert!(line("a racing write").contains("DEBUG"), "{text}");
}

/// Break-tasks L6: a task that ends by its `tasks/result` payload (no `lastUpdatedAt`), or by a
/// status report without one, is recorded (and so listed by `tasks/list`) as last updated
/// when taskgate saw it end, not at its creation; a report's own `lastUpdatedAt` still wins.
/// On the code before, both kept the creation's time.
#[tokio::test]
async fn a_new_status_without_the_upstreams_time_is_dated_now() {
    let (registry, _store) = crate::layers::testing::registry();
    let owner = crate::layers::testing::owner();
    for t in ["t1", "t2", "t3"] {
        let reservation = registry.reserve(&"up".into(), &owner).unwrap();
        registry
            .record_creation(crate::layers::testing::record(t), &reservation)
            .await
            .unwrap();
    }
    let created = crate::layers::testing::record("t1").last_updated_at;
    let before = now_ms();
    registry.apply_result_payload("up", "t1", false).await;
    let done = serde_json::json!({"taskId": "t2", "status": "completed"});
    registry
        .observe_task("up", done, "notifications/tasks/status")
        .await;
    let dated = serde_json::json!({"taskId": "t3", "status": "completed",
        "lastUpdatedAt": "2026-01-01T00:00:05Z"});
    registry.observe_task("up", dated, "tasks/get").await;
    for t in ["t1", "t2"] {
        let r = registry.store().get("up", t).unwrap().unwrap();
        assert_eq!(r.status, TaskStatus::Completed, "{t}");
        assert_ne!(r.last_updated_at, created, "{t}");
        let at = crate::mcp::task::parse_rfc3339_ms(&r.last_updated_at);
        assert!(at >= Some(before), "{t}: {}", r.last_updated_at);
        assert_eq!(
            r.to_task().last_updated_at,
            r.last_updated_at,
            "{t}: listed so"
        );
    }
    let r = registry.store().get("up", "t3").unwrap().unwrap();
    assert_eq!(r.last_updated_at, "2026-01-01T00:00:05Z");
}

/// Review 19 #2: a result kept in the record after its terminal status was recorded (a
/// 2026-07-28 `notifications/tasks` `completed` without `result`, then the `tasks/get` that
/// carries it) is what taskgate serves from then on (F6): it is on disk before the answer
/// leaves (one sync awaited), as when it comes with the status. On the code before it went to
/// the next group commit (0 syncs).
#[tokio::test]
async fn a_result_kept_after_its_status_waits_for_the_disk() {
    use std::sync::atomic::Ordering;
    let (registry, store) = crate::layers::testing::registry();
    let owner = crate::layers::testing::owner();
    let reservation = registry.reserve(&"up".into(), &owner).unwrap();
    registry
        .record_creation(crate::layers::testing::record("kept-later"), &reservation)
        .await
        .unwrap();
    let report = serde_json::json!({"taskId": "kept-later", "status": "completed"});
    registry
        .observe_task("up", report.clone(), "notifications/tasks")
        .await;
    let before = store.counts.syncs.load(Ordering::SeqCst);
    registry
        .observe_task_with_result(
            "up",
            "kept-later",
            report,
            r#"{"taskId":"kept-later","status":"completed","result":{"content":[]}}"#.into(),
            "tasks/get",
            OnRefusal::Keep,
        )
        .await;
    let waited = store.counts.syncs.load(Ordering::SeqCst) - before;
    let r = registry.store().get("up", "kept-later").unwrap().unwrap();
    assert!(r.terminal_result.is_some(), "kept");
    assert_eq!(
        waited, 1,
        "the kept result went to the next group commit, not awaited"
    );
}

/// Review 19b #2: a gateway task failed meanwhile (by `gone`: its process died) whose held
/// call then ends with a JSON-RPC error: the error is kept in the record (as
/// `store_terminal_error` kept it), so a later `tasks/result` answers with it. Dropped by the
/// first version of the one-write end.
#[tokio::test]
async fn the_error_of_a_task_failed_meanwhile_is_kept() {
    let (registry, _store) = crate::layers::testing::registry();
    let owner = crate::layers::testing::owner();
    let reservation = registry.reserve(&"up".into(), &owner).unwrap();
    registry
        .record_creation(crate::layers::testing::record("f1"), &reservation)
        .await
        .unwrap();
    registry
        .observe_task_as("up", "f1", serde_json::json!({"status": "failed"}), "gone")
        .await;
    let observed = registry
        .observe_task_with_error(
            "up",
            "f1",
            serde_json::json!({"status": "failed"}),
            r#"{"code":-32000,"message":"the tool broke"}"#.into(),
            "gateway task",
            OnRefusal::CallerRetries,
        )
        .await;
    assert_eq!(
        observed,
        Observed::Recorded(TaskStatus::Failed),
        "recorded failed"
    );
    let r = registry.store().get("up", "f1").unwrap().unwrap();
    assert!(r.terminal_error.is_some(), "the error is kept");
}

/// What the registry records of an upstream's task is schema-valid whatever the upstream sent
/// (either era): a `createdAt` / `lastUpdatedAt` that is not an RFC 3339 time (`"yesterday"`,
/// `12`) is recorded as taskgate's clock (`lastUpdatedAt`: the valid `createdAt`), at the
/// creation and at a status change, so `tasks/list` (the records) shows valid times.
#[tokio::test]
async fn invalid_upstream_times_are_not_recorded() {
    let (registry, _store) = crate::layers::testing::registry();
    let template = crate::layers::testing::record("t1");
    let valid = |at: &str| crate::mcp::task::parse_rfc3339_ms(at).is_some();
    let odd = serde_json::json!({"taskId": "t1", "status": "working", "ttl": 60000,
        "createdAt": "yesterday", "lastUpdatedAt": 12, "pollInterval": -1});
    let record = registry.creation_record(&template, &odd).unwrap();
    assert!(valid(&record.created_at), "{}", record.created_at);
    assert!(valid(&record.last_updated_at), "{}", record.last_updated_at);
    assert_eq!(record.poll_interval_ms, None);
    let half = serde_json::json!({"taskId": "t1", "status": "working",
        "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "soon"});
    let record = registry.creation_record(&template, &half).unwrap();
    assert_eq!(record.last_updated_at, "2026-01-01T00:00:00Z");

    let owner = crate::layers::testing::owner();
    let reservation = registry.reserve(&"up".into(), &owner).unwrap();
    registry
        .record_creation(record, &reservation)
        .await
        .unwrap();
    let moved = serde_json::json!({"taskId": "t1", "status": "input_required",
        "lastUpdatedAt": "later"});
    registry.observe_task("up", moved, "tasks/get").await;
    let r = registry.store().get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::InputRequired);
    assert!(valid(&r.last_updated_at), "{}", r.last_updated_at);
}
