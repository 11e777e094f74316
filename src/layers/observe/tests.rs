//! Tests of the `observe` layer (the module docs say what it must do).

use super::*;
use crate::config::TasksConfig;
use crate::exchange::GatewayError;
use crate::layers::testing::{json_of, owner, record, registry, registry_with, request};
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
            ..Default::default()
        })
        .collect();
    McpReply::new(
        StatusCode::OK,
        HeaderMap::new(),
        ReplyBody::Stream(Box::pin(futures_util::stream::iter(events))),
    )
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
/// `jsonrpc` changes nothing (as the envelope parse decided) and, not being the answer, is the
/// upstream's invalid answer (break-edge F3); the same status under the request's id is applied.
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
        let out = get(other.clone()).await;
        assert!(
            matches!(out, Err(GatewayError::UpstreamProtocol { .. })),
            "{other}"
        );
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

/// An upstream (for the creation tests below) that answers a `tools/call` with `created` and
/// anything else (the `tasks/cancel`) with a cancelled task, and hands every request it gets to
/// the test.
fn recording_upstream(
    registry: &Arc<Registry>,
    created: &'static str,
) -> (
    impl tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Clone,
    tokio::sync::mpsc::UnboundedReceiver<McpRequest>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let svc = ObserveLayer::new(registry.clone()).layer(tower::service_fn(
        move |req: McpRequest| {
            let answer = if req.method() == Some("tools/call") {
                created.to_string()
            } else {
                format!(
                    r#"{{"jsonrpc":"2.0","id":{},"result":{{"taskId":"t9","status":"cancelled","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:01Z","ttl":60000}}}}"#,
                    req.id().map(|i| i.as_json().to_string()).unwrap_or_default()
                )
            };
            let _ = tx.send(req);
            async move { Ok::<_, GatewayError>(McpReply::local_json(Bytes::from(answer))) }
        },
    ));
    (svc, rx)
}

/// The next request the recording upstream gets, waited for (at most 10 s).
async fn next_upstream_request(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<McpRequest>,
) -> McpRequest {
    tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
        .await
        .expect("a request reached the upstream in time")
        .expect("the upstream is alive")
}

/// No further request (an undo's `tasks/cancel`, spawned in the background) reaches the
/// upstream while the runtime runs everything ready 100 times over.
async fn assert_no_cancel_sent(rx: &mut tokio::sync::mpsc::UnboundedReceiver<McpRequest>) {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        rx.try_recv().is_err(),
        "no tasks/cancel for a recorded task"
    );
}

/// `taskgate_unrecorded_task_cancels_total{upstream="up",outcome}` once it reaches `want`
/// (waited for: the cancel runs in the background), or what it was after 10 s.
async fn undo_count(registry: &Arc<Registry>, outcome: &str, want: u64) -> u64 {
    let counter = registry
        .metrics()
        .unrecorded_task_cancels_total
        .with_label_values(&["up", outcome]);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while counter.get() < want && tokio::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    counter.get()
}

/// Issue 29 #17: a 2025-11-25 creation whose store write fails gets `-32603` as before, and the
/// task the upstream started is cancelled there: one `tasks/cancel` naming it, on the upstream
/// session the creation went out on, under an id taskgate minted; counted and the slot given
/// back.
#[tokio::test]
async fn an_unrecorded_creation_is_cancelled_upstream() {
    let (registry, store) = registry();
    store
        .fail_creates
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (svc, mut seen) = recording_upstream(&registry, CREATED);
    let mut req = creation_request(&registry);
    req.ctx
        .headers
        .insert("mcp-method", http::HeaderValue::from_static("tools/call"));
    let reply = json_of(&svc.oneshot(req).await.unwrap());
    assert_eq!(reply["error"]["code"], -32603, "{reply}");
    assert_eq!(reply["id"], 1, "{reply}");
    // The store's own error (a database's names hosts and users) is logged, not sent.
    assert_eq!(
        reply["error"]["message"],
        "taskgate could not record the task durably (task store unavailable); the task was not handed out",
        "{reply}"
    );
    assert_eq!(registry.owners_count("up", &owner()), 0, "the slot is free");

    assert_eq!(
        next_upstream_request(&mut seen).await.method(),
        Some("tools/call")
    );
    let cancel = next_upstream_request(&mut seen).await;
    assert_eq!(cancel.request_method(), Some("tasks/cancel"));
    let Operation::Post(msg) = &cancel.op else {
        panic!("not a POST")
    };
    let body: Value = msg.parse_as().unwrap();
    assert_eq!(
        body["params"],
        serde_json::json!({"taskId": "t9"}),
        "{body}"
    );
    assert!(
        body["id"]
            .as_str()
            .is_some_and(|i| i.starts_with("taskgate-")),
        "{body}"
    );
    assert_eq!(cancel.ctx.session_id.as_ref().unwrap(), "s1");
    assert!(
        cancel.ctx.headers.get("mcp-method").is_none(),
        "the creation's routing header is not the cancel's"
    );
    assert_eq!(undo_count(&registry, "answered", 1).await, 1);
    assert_eq!(undo_count(&registry, "failed", 0).await, 0);
    assert!(registry.store().get("up", "t9").unwrap().is_none());
}

/// A 2025-11-25 `CreateTaskResult` under another id than the creation's is not its answer:
/// the client gets `-32603` (break-edge F3), nothing is recorded, the slot is given back, and
/// the task it names is cancelled upstream on the creation's session, as an unrecorded one is.
/// On the code before, that task was left running upstream.
#[tokio::test]
async fn a_creation_answered_under_another_id_is_cancelled_upstream() {
    const STRAY: &str = r#"{"jsonrpc":"2.0","id":"not-yours","result":{"task":{"taskId":"t9","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":60000}}}"#;
    let (registry, _store) = registry();
    let (svc, mut seen) = recording_upstream(&registry, STRAY);
    let err = svc
        .oneshot(creation_request(&registry))
        .await
        .err()
        .expect("an invalid answer");
    assert!(err.to_string().contains("another id"), "{err}");
    assert_eq!(registry.owners_count("up", &owner()), 0, "the slot is free");
    assert!(registry.store().get("up", "t9").unwrap().is_none());
    next_upstream_request(&mut seen).await;
    let cancel = next_upstream_request(&mut seen).await;
    assert_eq!(cancel.request_method(), Some("tasks/cancel"));
    let Operation::Post(msg) = &cancel.op else {
        panic!("not a POST")
    };
    let body: Value = msg.parse_as().unwrap();
    assert_eq!(
        body["params"],
        serde_json::json!({"taskId": "t9"}),
        "{body}"
    );
    assert_eq!(cancel.ctx.session_id.as_ref().unwrap(), "s1");
    assert_eq!(undo_count(&registry, "answered", 1).await, 1);
}

/// Makes `req` a 2026-07-28 `tools/call` whose answer `observe` records (as `tasks` marks one),
/// holding `slot`.
fn modern_creation(req: &mut McpRequest, slot: crate::registry::Reservation) {
    req.extensions.insert(Era::Modern);
    let template = TaskRecord {
        task_id: String::new(),
        era: Era::Modern,
        upstream_session: None,
        ..record("")
    };
    req.extensions.insert(PendingCreation {
        template: Arc::new(template),
        reservation: Arc::new(slot),
        progress_token: None,
        created: Arc::default(),
    });
}

/// Issue 29 #17, 2026-07-28: the unrecorded task is cancelled statelessly (no session), with
/// the version, `Mcp-Method: tasks/cancel` and `Mcp-Name: <taskId>` headers and the tasks
/// extension in `_meta`; the creation's `Mcp-Param-*` headers are not carried over.
#[tokio::test]
async fn an_unrecorded_modern_creation_is_cancelled_upstream_statelessly() {
    const FLAT: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t9","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttlMs":60000}}"#;
    let (registry, store) = registry();
    store
        .fail_creates
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (svc, mut seen) = recording_upstream(&registry, FLAT);
    let mut req = request(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","arguments":{"x":1},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
    );
    req.ctx.session_id = None;
    for (k, v) in [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "slow"),
        ("mcp-param-x", "1"),
    ] {
        req.ctx.headers.insert(k, http::HeaderValue::from_static(v));
    }
    let slot = registry.reserve(&"up".into(), &owner()).unwrap();
    modern_creation(&mut req, slot);
    let reply = json_of(&svc.oneshot(req).await.unwrap());
    assert_eq!(reply["error"]["code"], -32603, "{reply}");

    next_upstream_request(&mut seen).await;
    let cancel = next_upstream_request(&mut seen).await;
    assert_eq!(cancel.request_method(), Some("tasks/cancel"));
    assert!(cancel.ctx.session_id.is_none(), "2026: no session");
    let header = |n: &str| {
        cancel
            .ctx
            .headers
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
    };
    assert_eq!(
        header("mcp-protocol-version").as_deref(),
        Some("2026-07-28")
    );
    assert_eq!(header("mcp-method").as_deref(), Some("tasks/cancel"));
    assert_eq!(header("mcp-name").as_deref(), Some("t9"));
    assert_eq!(header("mcp-param-x"), None);
    assert_eq!(cancel.era(), Era::Modern);
    let Operation::Post(msg) = &cancel.op else {
        panic!("not a POST")
    };
    let body: Value = msg.parse_as().unwrap();
    assert_eq!(body["params"]["taskId"], "t9", "{body}");
    let meta = &body["params"]["_meta"];
    assert_eq!(
        meta["io.modelcontextprotocol/protocolVersion"],
        "2026-07-28"
    );
    assert!(
        meta["io.modelcontextprotocol/clientCapabilities"]["extensions"]
            .get("io.modelcontextprotocol/tasks")
            .is_some(),
        "{body}"
    );
    assert_eq!(undo_count(&registry, "answered", 1).await, 1);
}

/// A creation refused as a duplicate taskId (the store already holds that task, maybe another
/// owner's) is not cancelled: the id names the recorded task.
#[tokio::test]
async fn a_duplicate_task_id_is_not_cancelled() {
    let (registry, _store) = registry();
    let slot = registry.reserve(&"up".into(), &owner()).unwrap();
    registry.record_creation(record("t9"), &slot).await.unwrap();
    let (svc, mut seen) = recording_upstream(&registry, CREATED);
    let reply = json_of(&svc.oneshot(creation_request(&registry)).await.unwrap());
    assert_eq!(reply["error"]["code"], -32603, "{reply}");
    // Break-tasks L4: said as what happened, not as a store failure.
    let message = reply["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("upstream `up` answered with taskId \"t9\"")
            && message.contains("reuses taskIds")
            && !message.contains("durably"),
        "{reply}"
    );
    next_upstream_request(&mut seen).await;
    assert_no_cancel_sent(&mut seen).await;
    assert_eq!(undo_count(&registry, "answered", 0).await, 0);
}

/// A 2026-07-28 server answering a plain call with the taskId of a task already recorded
/// while its owner is at `tasks.max_live_tasks_per_owner`: refused as a duplicate, as below the
/// limit, and not cancelled upstream (the id names the recorded task). The limit's refusal
/// cancelled it (cold review, 2026-12-05).
#[tokio::test]
async fn a_duplicate_modern_task_id_at_the_limit_is_not_cancelled() {
    const FLAT: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t9","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttlMs":60000}}"#;
    let (registry, _store) = registry_with(TasksConfig {
        max_live_tasks_per_owner: 1,
        ..TasksConfig::default()
    });
    let slot = registry.reserve(&"up".into(), &owner()).unwrap();
    registry.record_creation(record("t9"), &slot).await.unwrap();
    let (svc, mut seen) = recording_upstream(&registry, FLAT);
    let mut req = request(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
    );
    req.ctx.session_id = None;
    modern_creation(&mut req, registry.reserve_modern(&"up".into(), &owner()));
    let reply = json_of(&svc.oneshot(req).await.unwrap());
    assert_eq!(reply["error"]["code"], -32603, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already recorded"),
        "{reply}"
    );
    next_upstream_request(&mut seen).await;
    assert_no_cancel_sent(&mut seen).await;
    assert!(registry.store().get("up", "t9").unwrap().is_some());
    assert_eq!(
        registry.owners_count("up", &owner()),
        1,
        "the call's slot given back"
    );
}

/// break-edge F11: a creation whose taskId is already recorded (the upstream reused it) is
/// counted `task_creation_refused_total{reason="duplicate"}`, not `store` (whose write did not
/// fail, and whose HELP said "before reaching the upstream"), nor a store write failure.
#[tokio::test]
async fn a_recorded_task_id_created_again_is_counted_as_a_duplicate() {
    let (registry, _store) = registry_with(TasksConfig::default());
    let slot = registry.reserve(&"up".into(), &owner()).unwrap();
    registry.record_creation(record("t9"), &slot).await.unwrap();
    let again = registry.reserve(&"up".into(), &owner()).unwrap();
    assert!(registry
        .record_creation(record("t9"), &again)
        .await
        .is_err());
    let refused = |reason: &str| {
        registry
            .metrics()
            .task_creation_refused_total
            .with_label_values(&["up", reason])
            .get()
    };
    assert_eq!((refused("duplicate"), refused("store")), (1, 0));
    assert_eq!(registry.metrics().store_write_failures_total.get(), 0);
}

/// A plain result to the `bridge`'s task call (`PlainAnswerIsTask`) is a `completed` task
/// under a minted id, with the result stored, recorded before the answer passes (JSON or SSE),
/// and handed back in the request's fact; the message passes as it came. `input_required` and
/// a `CreateTaskResult` are not plain results.
#[tokio::test]
async fn a_plain_answer_to_a_bridged_task_call_is_recorded_completed() {
    const PLAIN: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hi"}],"isError":true}}"#;
    for streamed in [false, true] {
        let (registry, _store) = registry();
        let svc = stack(&registry, move || match streamed {
            true => sse(&[PLAIN]),
            false => McpReply::local_json(Bytes::from_static(PLAIN.as_bytes())),
        });
        let mut req = creation_request(&registry);
        let plain = PlainAnswerIsTask::default();
        req.extensions.insert(plain.clone());
        let reply = svc.oneshot(req).await.unwrap();
        let body = match reply.body {
            ReplyBody::Json(b) => String::from_utf8(b.to_vec()).unwrap(),
            ReplyBody::Stream(mut events) => {
                let ev = events.next().await.unwrap();
                ev.data.unwrap().to_string()
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(body, PLAIN, "bytes as they came");
        let fact = plain.recorded.get().expect("the fact is filled");
        let r = registry
            .store()
            .get("up", &fact.record.task_id)
            .unwrap()
            .unwrap();
        assert!(r.task_id.starts_with("taskgate-"), "{}", r.task_id);
        assert_eq!((r.status, r.tool_error), (TaskStatus::Completed, true));
        let stored: Value = serde_json::from_str(r.terminal_result.as_deref().unwrap()).unwrap();
        assert_eq!(stored["result"]["content"][0]["text"], "hi");
    }
    for answer in [
        r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"x"}}"#,
    ] {
        let (registry, _store) = registry();
        let svc = stack(&registry, move || {
            McpReply::local_json(Bytes::from_static(answer.as_bytes()))
        });
        let mut req = creation_request(&registry);
        let plain = PlainAnswerIsTask::default();
        req.extensions.insert(plain.clone());
        svc.oneshot(req).await.unwrap();
        assert!(plain.recorded.get().is_none(), "{answer}");
        assert_eq!(registry.owners_count("up", &owner()), 0, "{answer}");
    }
}

/// A 2026-07-28 ack to a `tasks/cancel` applies nothing (it carries no status: a 2026 client
/// learns the status later; the `bridge` applies it for a 2025 client itself, after asking the
/// task's status again), whatever the task's recorded status.
#[tokio::test]
async fn a_modern_cancel_ack_applies_nothing() {
    const ACK: &str = r#"{"jsonrpc":"2.0","id":5,"result":{"resultType":"complete"}}"#;
    for first in [TaskStatus::Working, TaskStatus::Completed] {
        let (registry, _store) = registry();
        let slot = registry.reserve(&"up".into(), &owner()).unwrap();
        let known = TaskRecord {
            status: first,
            ..record("t1")
        };
        registry
            .record_creation(known.clone(), &slot)
            .await
            .unwrap();
        let svc = stack(&registry, || {
            McpReply::local_json(Bytes::from_static(ACK.as_bytes()))
        });
        let mut req =
            request(r#"{"jsonrpc":"2.0","id":5,"method":"tasks/cancel","params":{"taskId":"t1"}}"#);
        req.extensions.insert(Era::Modern);
        req.extensions.insert(AuthorisedTask {
            record: known.into(),
        });
        let reply = svc.oneshot(req).await.unwrap();
        assert_eq!(json_of(&reply)["result"]["resultType"], "complete");
        let r = registry.store().get("up", "t1").unwrap().unwrap();
        assert_eq!(r.status, first);
    }
}

/// Review 18b: a stray `CreateTaskResult` (another id) naming a task taskgate already recorded
/// (an upstream replaying an earlier creation's answer, or reusing ids: break-tasks L4) is
/// cancelled upstream anyway: `Step::StrayCreation` calls `Undo` without the
/// `StoreError::Conflict` / recorded check the in-order path makes, so it ends the recorded
/// task of another request (its owner's live task).
#[tokio::test]
async fn a_stray_creation_naming_a_recorded_task_is_not_cancelled() {
    const STRAY: &str = r#"{"jsonrpc":"2.0","id":"not-yours","result":{"task":{"taskId":"t9","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":60000}}}"#;
    let (registry, _store) = registry();
    let reservation = registry.reserve(&"up".into(), &owner()).unwrap();
    registry
        .record_creation(crate::layers::testing::record("t9"), &reservation)
        .await
        .unwrap();
    drop(reservation);
    let (svc, mut seen) = recording_upstream(&registry, STRAY);
    let _ = svc.oneshot(creation_request(&registry)).await;
    next_upstream_request(&mut seen).await;
    assert_no_cancel_sent(&mut seen).await;
}

/// Review 18b #9: a notification held on a creation's stream about another task, unrecorded
/// yet, while another creation of the same upstream session is in flight (the server reporting
/// that one's task before its answer), goes the normal way once this creation recorded its
/// task: it waits for the other creation and passes once that one records the task. With no
/// other creation in flight it is still dropped (review 17 #4). On the code before, it was
/// dropped in both cases.
#[tokio::test]
async fn a_held_notification_about_another_creations_task_passes_once_recorded() {
    const OTHER: &str = r#"{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{"taskId":"t-other","status":"working"}}"#;
    for other_in_flight in [false, true] {
        let (registry, _store) = registry();
        let streamed = stack(&registry, || sse(&[OTHER, CREATED]));
        let other = other_in_flight.then(|| registry.creations().begin("up", Some("s1")));
        let reply = streamed.oneshot(creation_request(&registry)).await.unwrap();
        let ReplyBody::Stream(mut events) = reply.body else {
            panic!("not a stream")
        };
        let first = events.next().await.unwrap();
        assert_eq!(
            first.data.as_deref(),
            Some(CREATED),
            "the answer comes first"
        );
        let Some(other) = other else {
            assert!(
                events.next().await.is_none(),
                "no other creation in flight: the unrecorded task's notification is dropped"
            );
            continue;
        };
        // The held notification is released and waits for the other creation to settle.
        let mut next = std::pin::pin!(events.next());
        for _ in 0..100 {
            if let Some(event) = futures_util::FutureExt::now_or_never(&mut next) {
                panic!("released before the other creation settled: {event:?}");
            }
            tokio::task::yield_now().await;
        }
        let slot = registry.reserve(&"up".into(), &owner()).unwrap();
        registry
            .record_creation(record("t-other"), &slot)
            .await
            .unwrap();
        drop(other);
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), next)
            .await
            .expect("in time");
        assert_eq!(
            event.and_then(|e| e.data).as_deref(),
            Some(OTHER),
            "the other creation's task, recorded for this session, is shown"
        );
    }
}

/// A 2025-11-25 `tasks/result` of a live task ends it: the terminal status is on disk (one
/// sync awaited) before the payload leaves, and the result is kept in the record (review 19:
/// a status not awaited let the payload leave with none).
#[tokio::test]
async fn a_tasks_result_that_ends_a_task_leaves_once_it_is_on_disk() {
    use std::sync::atomic::Ordering;
    let (registry, store) = registry();
    let slot = registry.reserve(&"up".into(), &owner()).unwrap();
    let live = record("t1");
    registry.record_creation(live.clone(), &slot).await.unwrap();
    const PAYLOAD: &str = r#"{"jsonrpc":"2.0","id":6,"result":{"content":[{"type":"text","text":"hi"}],"isError":false}}"#;
    let svc = stack(&registry, || {
        McpReply::local_json(Bytes::from_static(PAYLOAD.as_bytes()))
    });
    let mut req =
        request(r#"{"jsonrpc":"2.0","id":6,"method":"tasks/result","params":{"taskId":"t1"}}"#);
    req.extensions.insert(AuthorisedTask {
        record: live.into(),
    });
    let before = store.counts.syncs.load(Ordering::SeqCst);
    let reply = svc.oneshot(req).await.unwrap();
    let waited = store.counts.syncs.load(Ordering::SeqCst) - before;
    assert_eq!(json_of(&reply)["result"]["content"][0]["text"], "hi");
    let r = registry.store().get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Completed);
    assert!(
        r.terminal_result.is_some(),
        "the result is kept to be served"
    );
    assert!(
        waited >= 1,
        "the payload that ended the task left with no sync awaited"
    );
}

/// A 2026-07-28 creation whose stream named its task (held) and was then answered with a
/// JSON-RPC error: the orphan is cancelled upstream, also while another caller's creation is in
/// flight on the upstream (a 2026 POST stream carries only its own exchange's messages; review
/// 19 #3: any creation on the upstream suppressed the cancel, so a busy upstream never saw it).
#[tokio::test]
async fn a_modern_orphan_is_cancelled_while_another_callers_creation_is_in_flight() {
    const NOTE: &str = r#"{"jsonrpc":"2.0","method":"notifications/tasks","params":{"taskId":"t-orphan","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttlMs":60000}}"#;
    const ERR: &str = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"the tool failed after it started"}}"#;
    for elsewhere in [false, true] {
        let (registry, _store) = registry();
        let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let svc =
            ObserveLayer::new(registry.clone()).layer(tower::service_fn(move |req: McpRequest| {
                let reply = if req.method() == Some("tools/call") {
                    sse(&[NOTE, ERR])
                } else {
                    McpReply::local_json(Bytes::from(format!(
                        r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#,
                        req.id()
                            .map(|i| i.as_json().to_string())
                            .unwrap_or_default()
                    )))
                };
                let _ = tx.send(req);
                async move { Ok::<_, GatewayError>(reply) }
            }));
        // Another caller's creation, on another upstream session, in flight meanwhile.
        let _elsewhere = elsewhere.then(|| {
            registry
                .creations()
                .begin("up", Some("someone-elses-session"))
        });
        let mut req = request(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
        );
        req.ctx.session_id = None;
        req.ctx.headers.insert(
            "mcp-protocol-version",
            http::HeaderValue::from_static("2026-07-28"),
        );
        let slot = registry.reserve(&"up".into(), &owner()).unwrap();
        modern_creation(&mut req, slot);
        let reply = svc.oneshot(req).await.unwrap();
        let ReplyBody::Stream(events) = reply.body else {
            panic!("not a stream")
        };
        let shown: Vec<Event> = events.collect().await;
        assert!(
            shown
                .iter()
                .all(|e| !e.data.as_deref().unwrap_or("").contains("t-orphan")),
            "{shown:?}"
        );
        assert_eq!(
            next_upstream_request(&mut seen).await.method(),
            Some("tools/call")
        );
        let cancel = tokio::time::timeout(std::time::Duration::from_secs(2), seen.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                panic!("elsewhere={elsewhere}: the orphan is not cancelled upstream")
            });
        assert_eq!(cancel.request_method(), Some("tasks/cancel"));
    }
}

/// Review 19b #1: a 2026-07-28 task a `notifications/tasks` reported `completed` (no result),
/// then a `tasks/get` carrying the result: the record keeps it, and serves it from then on, so
/// it is on disk (one sync awaited) before the answer leaves. On the code before it went to the
/// next group commit (0 syncs): the path goes through `store_terminal_result`, not the status
/// machine.
#[tokio::test]
async fn a_modern_result_kept_after_a_notified_status_is_on_disk_before_it_leaves() {
    use std::sync::atomic::Ordering;
    const GET: &str = r#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"t1","status":"completed","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":60000,"result":{"content":[{"type":"text","text":"hi"}]}}}"#;
    let (registry, store) = registry();
    let slot = registry.reserve(&"up".into(), &owner()).unwrap();
    let live = TaskRecord {
        era: Era::Modern,
        ..record("t1")
    };
    registry.record_creation(live, &slot).await.unwrap();
    registry
        .observe_task(
            "up",
            serde_json::json!({"taskId":"t1","status":"completed"}),
            "notifications/tasks",
        )
        .await;
    let known = registry.store().get("up", "t1").unwrap().unwrap();
    assert_eq!(known.status, TaskStatus::Completed);
    assert!(known.terminal_result.is_none());
    let svc = stack(&registry, || {
        McpReply::local_json(Bytes::from_static(GET.as_bytes()))
    });
    let mut req =
        request(r#"{"jsonrpc":"2.0","id":7,"method":"tasks/get","params":{"taskId":"t1"}}"#);
    req.extensions.insert(Era::Modern);
    req.extensions.insert(AuthorisedTask {
        record: known.into(),
    });
    let before = store.counts.syncs.load(Ordering::SeqCst);
    let _ = svc.oneshot(req).await.unwrap();
    let waited = store.counts.syncs.load(Ordering::SeqCst) - before;
    let r = registry.store().get("up", "t1").unwrap().unwrap();
    assert!(r.terminal_result.is_some(), "kept");
    assert_eq!(
        waited, 1,
        "the result kept after its status left with no sync awaited"
    );
}

/// A 2026-07-28 `CreateTaskResult` whose `result` holds a member nested deeper than serde_json's
/// limit (128 levels; here in `_meta`, valid JSON all the same) is still recorded before it
/// passes: before, its parse failed and the answer went to the client unrecorded, so the
/// client held a taskId that taskgate then answered `-32602` for (`tasks/get`, `tasks/cancel`)
/// without asking the upstream, whose task ran on unreachable. Over JSON and over SSE.
#[tokio::test]
async fn a_modern_creation_nested_past_serdes_limit_is_recorded() {
    let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
    let flat = format!(
        r#"{{"jsonrpc":"2.0","id":1,"result":{{"_meta":{{"x":{deep}}},"resultType":"task","taskId":"t9","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttlMs":60000}}}}"#
    );
    assert!(
        serde_json::from_str::<Value>(&flat).is_err(),
        "past the limit"
    );
    for streamed in [false, true] {
        let (registry, _store) = registry();
        let answer = flat.clone();
        let svc = stack(&registry, move || {
            if streamed {
                sse(&[&answer])
            } else {
                McpReply::local_json(Bytes::from(answer.clone()))
            }
        });
        let mut req = request(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
        );
        req.ctx.session_id = None;
        let slot = registry.reserve(&"up".into(), &owner()).unwrap();
        modern_creation(&mut req, slot);
        let reply = svc.oneshot(req).await.unwrap();
        let text: String = match reply.body {
            ReplyBody::Stream(mut events) => events.next().await.unwrap().data.unwrap().to_string(),
            ReplyBody::Json(b) => String::from_utf8(b.to_vec()).unwrap(),
            other => panic!("{other:?}"),
        };
        assert!(text.contains(r#""taskId":"t9""#), "{streamed}: {text:.200}");
        let r = registry.store().get("up", "t9").unwrap();
        assert!(r.is_some(), "streamed {streamed}: handed out unrecorded");
        assert_eq!(
            registry.owners_count("up", &owner()),
            1,
            "the slot is the task's"
        );
    }
}

/// A `notifications/tasks/status` nested past serde_json's 128-level limit (a deep `_meta`) is
/// applied as any other: a live task's completion reaches its record, and a task recorded
/// `cancelled` is shown `cancelled` (its late `completed` recorded as such). Before, its parse
/// failed: the record stayed `working` (its owner's slot held until the ttl), and a cancelled
/// task reached the client as `completed`.
#[tokio::test]
async fn a_status_notification_nested_past_serdes_limit_is_applied() {
    let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
    for recorded in [TaskStatus::Working, TaskStatus::Cancelled] {
        let (registry, _store) = registry();
        let slot = registry.reserve(&"up".into(), &owner()).unwrap();
        let rec = TaskRecord {
            status: recorded,
            ..record("t1")
        };
        registry.record_creation(rec, &slot).await.unwrap();
        let note = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{{"_meta":{{"x":{deep}}},"taskId":"t1","status":"completed","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:01Z","ttl":60000}}}}"#
        );
        let notified = stack(&registry, move || sse(&[note.as_str()]));
        let reply = notified
            .oneshot(request(
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            ))
            .await
            .unwrap();
        let ReplyBody::Stream(mut events) = reply.body else {
            panic!("not a stream")
        };
        let shown = events.next().await.unwrap().data.unwrap().to_string();
        let r = registry.store().get("up", "t1").unwrap().unwrap();
        match recorded {
            TaskStatus::Cancelled => {
                assert!(
                    !shown.contains(r#""status":"completed""#)
                        && shown.contains(r#""status":"cancelled""#),
                    "a cancelled task shown completed"
                );
                assert_eq!(r.status, TaskStatus::Cancelled);
            }
            _ => assert_eq!(r.status, TaskStatus::Completed, "not applied"),
        }
    }
}

/// A 2026-07-28 `tasks/get` answer `completed` whose tool output nests past serde_json's limit
/// ends the record (its `DetailedTask` kept byte for byte), as a shallow one does.
/// Before, its parse failed: the record stayed `working` (the owner's slot held until the ttl,
/// `taskgate_tasks` wrong) while the client was shown `completed`.
#[tokio::test]
async fn a_modern_completion_nested_past_serdes_limit_is_recorded() {
    let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
    let payload = format!(r#"{{"content":[],"isError":true,"structuredContent":{{"x":{deep}}}}}"#);
    let get = format!(
        r#"{{"jsonrpc":"2.0","id":7,"result":{{"resultType":"complete","taskId":"t1","status":"completed","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:01Z","ttlMs":60000,"result":{payload}}}}}"#
    );
    let (registry, _store) = registry();
    let slot = registry.reserve(&"up".into(), &owner()).unwrap();
    let live = TaskRecord {
        era: Era::Modern,
        ..record("t1")
    };
    registry.record_creation(live.clone(), &slot).await.unwrap();
    let svc = stack(&registry, move || {
        McpReply::local_json(Bytes::from(get.clone()))
    });
    let mut req =
        request(r#"{"jsonrpc":"2.0","id":7,"method":"tasks/get","params":{"taskId":"t1"}}"#);
    req.extensions.insert(Era::Modern);
    req.extensions.insert(AuthorisedTask {
        record: live.into(),
    });
    let _ = svc.oneshot(req).await.unwrap();
    let r = registry.store().get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Completed, "not recorded");
    let kept = r.terminal_result.as_deref().unwrap_or_default();
    assert!(kept.contains(payload.as_str()), "payload kept as it came");
    assert_eq!(registry.owners_count("up", &owner()), 0, "slot given back");
}
