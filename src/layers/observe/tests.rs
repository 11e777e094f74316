//! Tests of the `observe` layer (the module docs say what it must do).

use super::*;
use crate::exchange::GatewayError;
use crate::layers::testing::{json_of, owner, record, registry, request};
use crate::mcp::task::TaskStatus;
use crate::store::TaskRecord;
use futures_util::StreamExt;
use http::{HeaderMap, StatusCode};
use tower::{Layer, ServiceExt};

const CREATED: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"taskId":"t9","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":60000}}}"#;

fn sse(messages: &[&str]) -> McpReply {
    let events: Vec<Event> = messages
        .iter()
        .map(|m| Event {
            event: None,
            data: Some(m.to_string().into()),
            id: None,
            retry: None,
        })
        .collect();
    McpReply {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        body: ReplyBody::Stream(Box::pin(futures_util::stream::iter(events))),
    }
}

/// A stack of `observe` over an upstream that answers every request with `reply()`.
fn stack(
    registry: &Arc<Registry>,
    reply: impl Fn() -> McpReply + Clone + Send + Sync + 'static,
) -> impl tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Clone {
    ObserveLayer::new(registry.clone()).layer(tower::service_fn(move |_req: McpRequest| {
        let reply = reply.clone();
        async move { Ok::<_, GatewayError>(reply()) }
    }))
}

fn creation_request(registry: &Arc<Registry>) -> McpRequest {
    let mut req = request(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","task":{"ttl":60000}}}"#,
    );
    let template = TaskRecord {
        task_id: String::new(),
        ..record("")
    };
    req.extensions.insert(PendingCreation {
        template: Arc::new(template),
        reservation: Arc::new(registry.reserve(&"up".into(), &owner()).unwrap()),
        progress_token: None,
        created: Arc::default(),
    });
    req
}

/// The `CreateTaskResult` is in the store when the JSON reply leaves the layer, and when the
/// SSE event carrying it is handed on (not later); the owner's slot stays taken.
#[tokio::test]
async fn creation_is_recorded_before_the_reply_passes() {
    let (registry, _store) = registry();
    let json = stack(&registry, || {
        McpReply::local_json(Bytes::from_static(CREATED.as_bytes()))
    });
    let reply = json.oneshot(creation_request(&registry)).await.unwrap();
    assert!(registry.store().get("up", "t9").unwrap().is_some());
    assert_eq!(json_of(&reply)["result"]["task"]["taskId"], "t9");
    assert_eq!(
        registry.owners_count("up", &owner()),
        1,
        "the slot is the task's"
    );

    let (registry, _store) = crate::layers::testing::registry();
    let streamed = stack(&registry, || {
        sse(&[
            r#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#,
            CREATED,
        ])
    });
    let reply = streamed.oneshot(creation_request(&registry)).await.unwrap();
    let ReplyBody::Stream(mut events) = reply.body else {
        panic!("not a stream")
    };
    let first = events.next().await.unwrap();
    assert!(first.data.unwrap().contains("notifications/message"));
    assert!(registry.store().get("up", "t9").unwrap().is_none());
    let second = events.next().await.unwrap();
    assert_eq!(second.data.as_deref(), Some(CREATED), "bytes as they came");
    let r = registry.store().get("up", "t9").unwrap().unwrap();
    assert_eq!((r.status, r.owner), (TaskStatus::Working, owner()));
}

/// An answer that is not a `CreateTaskResult` records nothing and gives the slot back.
#[tokio::test]
async fn a_plain_answer_gives_the_slot_back() {
    let (registry, _store) = registry();
    let plain = stack(&registry, || {
        McpReply::local_json(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#,
        ))
    });
    let req = creation_request(&registry);
    plain.oneshot(req).await.unwrap();
    assert!(registry.store().get("up", "t9").unwrap().is_none());
    assert_eq!(registry.owners_count("up", &owner()), 0);
}

/// A reply (or notification) reporting another status for a task recorded terminal shows the
/// recorded one; the record keeps it.
#[tokio::test]
async fn terminal_statuses_are_rewritten() {
    let (registry, _store) = registry();
    let slot = registry.reserve(&"up".into(), &owner()).unwrap();
    let done = TaskRecord {
        status: TaskStatus::Cancelled,
        ..record("t1")
    };
    registry.record_creation(done.clone(), &slot).await.unwrap();
    let get = stack(&registry, || {
        McpReply::local_json(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":5,"result":{"taskId":"t1","status":"completed","statusMessage":"done"}}"#,
        ))
    });
    let mut req =
        request(r#"{"jsonrpc":"2.0","id":5,"method":"tasks/get","params":{"taskId":"t1"}}"#);
    req.extensions.insert(AuthorisedTask {
        record: done.into(),
    });
    let reply = json_of(&get.oneshot(req).await.unwrap());
    assert_eq!(reply["result"]["status"], "cancelled");
    assert!(reply["result"].get("statusMessage").is_none());

    let notified = stack(&registry, || {
        sse(&[
            r#"{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{"taskId":"t1","status":"working"}}"#,
        ])
    });
    let reply = notified
        .oneshot(request(
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ))
        .await
        .unwrap();
    let ReplyBody::Stream(mut events) = reply.body else {
        panic!("not a stream")
    };
    let ev: Value = serde_json::from_str(&events.next().await.unwrap().data.unwrap()).unwrap();
    assert_eq!(ev["params"]["status"], "cancelled");
    let r = registry.store().get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Cancelled);
}

/// A `tasks/get` answer reporting a change is applied from the typed view as the `Value` path
/// applied it: the status, message, time and poll interval reach the record; an answer whose
/// `result` is an array changes nothing.
#[tokio::test]
async fn a_changed_status_is_applied_from_the_typed_view() {
    let (registry, _store) = registry();
    let slot = registry.reserve(&"up".into(), &owner()).unwrap();
    let live = record("t1");
    registry.record_creation(live.clone(), &slot).await.unwrap();
    let get = |body: &'static str| {
        let known = live.clone();
        let svc = stack(&registry, move || {
            McpReply::local_json(Bytes::from_static(body.as_bytes()))
        });
        let mut req =
            request(r#"{"jsonrpc":"2.0","id":5,"method":"tasks/get","params":{"taskId":"t1"}}"#);
        req.extensions.insert(AuthorisedTask {
            record: known.into(),
        });
        svc.oneshot(req)
    };
    let array = r#"{"jsonrpc":"2.0","id":5,"result":["completed",null,null,null,null]}"#;
    let reply = get(array).await.unwrap();
    assert_eq!(json_of(&reply)["result"][0], "completed");
    let r = registry.store().get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Working);

    let done = r#"{"jsonrpc":"2.0","id":5,"result":{"taskId":"t1","status":"completed","statusMessage":"d\u006fne","lastUpdatedAt":"2026-01-01T00:00:09Z","pollInterval":250,"ttl":60000}}"#;
    let reply = get(done).await.unwrap();
    assert_eq!(json_of(&reply)["result"]["status"], "completed");
    let r = registry.store().get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Completed);
    assert_eq!(r.status_message.as_deref(), Some("done"));
    assert_eq!(r.last_updated_at, "2026-01-01T00:00:09Z");
    assert_eq!(r.poll_interval_ms, Some(250));
    assert!(r.terminal_at.is_some());
    assert_eq!(registry.owners_count("up", &owner()), 0, "the slot is free");
}

/// The `tasks/result` payload of a task authorised as terminal is kept in its record, once, and
/// the reply passes as it came.
#[tokio::test]
async fn a_terminal_tasks_result_payload_is_kept() {
    let (registry, _store) = registry();
    let slot = registry.reserve(&"up".into(), &owner()).unwrap();
    let done = TaskRecord {
        status: TaskStatus::Completed,
        ..record("t1")
    };
    registry.record_creation(done.clone(), &slot).await.unwrap();
    const PAYLOAD: &str = r#"{"jsonrpc":"2.0","id":6,"result":{"content":[{"type":"text","text":"hi"}],"isError":false}}"#;
    let svc = stack(&registry, || {
        McpReply::local_json(Bytes::from_static(PAYLOAD.as_bytes()))
    });
    let mut req =
        request(r#"{"jsonrpc":"2.0","id":6,"method":"tasks/result","params":{"taskId":"t1"}}"#);
    req.extensions.insert(AuthorisedTask {
        record: done.into(),
    });
    let reply = svc.oneshot(req).await.unwrap();
    let ReplyBody::Json(bytes) = reply.body else {
        panic!("not JSON")
    };
    assert_eq!(&bytes[..], PAYLOAD.as_bytes(), "bytes as they came");
    let r = registry.store().get("up", "t1").unwrap().unwrap();
    assert_eq!(
        r.terminal_result.as_deref(),
        Some(r#"{"content":[{"type":"text","text":"hi"}],"isError":false}"#)
    );
    assert_eq!(r.status, TaskStatus::Completed);
}

/// A `tasks/get` answer is read in one pass only when it is the JSON-RPC result to the request:
/// a message under another id, one that also carries `error` or `method`, or another
/// `jsonrpc` changes nothing (as the envelope parse decided); the same status under the
/// request's id is applied.
#[tokio::test]
async fn only_the_answer_to_the_request_is_applied() {
    let (registry, _store) = registry();
    let slot = registry.reserve(&"up".into(), &owner()).unwrap();
    let live = record("t1");
    registry.record_creation(live.clone(), &slot).await.unwrap();
    let get = |body: String| {
        let svc = stack(&registry, move || {
            McpReply::local_json(Bytes::from(body.clone().into_bytes()))
        });
        let mut req =
            request(r#"{"jsonrpc":"2.0","id":5,"method":"tasks/get","params":{"taskId":"t1"}}"#);
        req.extensions.insert(AuthorisedTask {
            record: live.clone().into(),
        });
        svc.oneshot(req)
    };
    let task = r#"{"taskId":"t1","status":"failed"}"#;
    for other in [
        format!(r#"{{"jsonrpc":"2.0","id":6,"result":{task}}}"#),
        format!(r#"{{"jsonrpc":"2.0","id":"5","result":{task}}}"#),
        format!(r#"{{"jsonrpc":"2.0","result":{task}}}"#),
        format!(r#"{{"jsonrpc":"1.0","id":5,"result":{task}}}"#),
        format!(r#"{{"jsonrpc":"2.0","id":5,"result":{task},"error":{{"code":1,"message":"x"}}}}"#),
        format!(r#"{{"jsonrpc":"2.0","id":5,"method":"x","result":{task}}}"#),
    ] {
        get(other.clone()).await.unwrap();
        let r = registry.store().get("up", "t1").unwrap().unwrap();
        assert_eq!(r.status, TaskStatus::Working, "{other}");
    }
    get(format!(r#"{{"jsonrpc":"2.0","id":5,"result":{task}}}"#))
        .await
        .unwrap();
    let r = registry.store().get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Failed);
}

/// A status notification whose method is written with escaped slashes
/// (`notifications\/tasks\/status`, valid JSON, PHP's `json_encode` default) is recorded like
/// the plain spelling; a `\u` escape in the name too.
#[tokio::test]
async fn an_escaped_status_notification_is_recorded() {
    for method in [
        r"notifications\/tasks\/status",
        r"notifications/t\u0061sks/status",
    ] {
        let (registry, _store) = registry();
        let slot = registry.reserve(&"up".into(), &owner()).unwrap();
        registry.record_creation(record("t1"), &slot).await.unwrap();
        let note = format!(
            r#"{{"jsonrpc":"2.0","method":"{method}","params":{{"taskId":"t1","status":"completed","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:01Z","ttl":60000}}}}"#
        );
        let notified = stack(&registry, move || sse(&[note.as_str()]));
        let reply = notified
            .oneshot(request(
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            ))
            .await
            .unwrap();
        let ReplyBody::Stream(events) = reply.body else {
            panic!("not a stream")
        };
        assert_eq!(events.count().await, 1, "{method}: the message passes on");
        let r = registry.store().get("up", "t1").unwrap().unwrap();
        assert_eq!(r.status, TaskStatus::Completed, "{method}");
    }
}
