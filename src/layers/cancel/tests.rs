//! Tests of the `cancel` layer.

use super::*;
use crate::layers::observe::ObserveLayer;
use crate::layers::tasks::TasksLayer;
use crate::layers::testing::{json_of, record, registry, request};
use std::sync::atomic::{AtomicUsize, Ordering};
use tower::{Layer, ServiceExt};

/// An upstream that answers every `tasks/cancel` (after `delay_ms`) with the task cancelled.
fn upstream(
    calls: Arc<AtomicUsize>,
    delay_ms: u64,
) -> impl tower::Service<
    McpRequest,
    Response = McpReply,
    Error = GatewayError,
    Future = impl Future<Output = Result<McpReply, GatewayError>> + Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |req: McpRequest| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            let id = req
                .id()
                .map(|i| i.as_json().to_string())
                .unwrap_or_default();
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"taskId":"t1","status":"cancelled","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:01Z","ttl":60000}}}}"#
            );
            Ok(McpReply::local_json(Bytes::from(body)))
        }
    })
}

fn cancel(id: u32) -> McpRequest {
    request(&format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tasks/cancel","params":{{"taskId":"t1"}}}}"#
    ))
}

async fn registry_with_t1() -> (Arc<Registry>, Arc<crate::layers::testing::CountingStore>) {
    let (registry, store) = registry();
    let slot = registry
        .reserve(&"up".into(), &crate::layers::testing::owner())
        .unwrap();
    registry.record_creation(record("t1"), &slot).await.unwrap();
    (registry, store)
}

/// The store accesses of one forwarded `tasks/cancel` through `tasks`, `cancel` and
/// `observe`: the authorising read is served by the record cache (filled by the creation),
/// one update for `cancel_requested_at`, one to apply the reply (and the two audit events:
/// cancel requested, status cancelled), and one waited sync: the `cancelled` the client is
/// told is on disk before the answer leaves (issue 16 #2). Before `observe` existed it was
/// 3 reads, 3 updates (the reply applied twice) and 2 audit appends; after the redesign,
/// 1 read (off the runtime), 2 updates, 2 audits, and the status was only synced "soon".
#[tokio::test]
async fn one_forwarded_cancel_touches_the_store_this_often() {
    let (registry, store) = registry_with_t1().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let stack = TasksLayer::new(registry.clone(), false).layer(
        CancelLayer::new(CancelState::new(registry.clone(), Duration::from_secs(30)))
            .layer(ObserveLayer::new(registry.clone()).layer(upstream(calls.clone(), 5))),
    );
    store.counts.reset();
    let reply = stack.oneshot(cancel(7)).await.unwrap();
    assert_eq!(json_of(&reply)["result"]["status"], "cancelled");
    let [gets, updates, creates, audits, scans] = store.counts.snapshot();
    let syncs = store.counts.syncs.load(Ordering::SeqCst);
    eprintln!("tasks/cancel trace: gets={gets} updates={updates} creates={creates} audits={audits} scans={scans} syncs={syncs}");
    assert_eq!([gets, updates, creates, audits, scans], [0, 2, 0, 2, 0]);
    assert_eq!(
        syncs, 1,
        "the cancelled status is made durable before the answer"
    );
    let r = registry.store().get("up", "t1").unwrap().unwrap();
    assert_eq!(r.status, TaskStatus::Cancelled);
    assert!(r.cancel_requested_at.is_some() && r.cancelled_at.is_some());
}

/// Two concurrent cancels of one task: one goes upstream, both get its answer under their
/// own ids, and a third one afterwards is answered here (terminal) without a store call (the
/// cancel's update left the cancelled record in the record cache).
#[tokio::test]
async fn two_concurrent_cancels_forward_one() {
    let (registry, store) = registry_with_t1().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let stack = TasksLayer::new(registry.clone(), false).layer(
        CancelLayer::new(CancelState::new(registry.clone(), Duration::from_secs(30)))
            .layer(ObserveLayer::new(registry.clone()).layer(upstream(calls.clone(), 50))),
    );
    let (a, b) = tokio::join!(
        stack.clone().oneshot(cancel(1)),
        stack.clone().oneshot(cancel(2))
    );
    let (a, b) = (json_of(&a.unwrap()), json_of(&b.unwrap()));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!((a["id"].clone(), b["id"].clone()), (1.into(), 2.into()));
    assert_eq!(a["result"]["status"], "cancelled");
    assert_eq!(b["result"], a["result"]);
    store.counts.reset();
    let c = json_of(&stack.clone().oneshot(cancel(4)).await.unwrap());
    assert_eq!(c["error"]["code"], jsonrpc::INVALID_PARAMS);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        store.counts.snapshot()[..2],
        [0, 0],
        "no store call: the authorising read finds the cancelled record in the cache"
    );
}

/// A cancel whose authorised record is stale (read while the flight was still running) is
/// answered from what the finished flight left behind, not forwarded a second time.
#[tokio::test]
async fn a_stale_record_after_a_finished_flight_is_not_forwarded_again() {
    let (registry, _store) = registry_with_t1().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let stack = CancelLayer::new(CancelState::new(registry.clone(), Duration::from_secs(30)))
        .layer(ObserveLayer::new(registry.clone()).layer(upstream(calls.clone(), 0)));
    let authorised = |id| {
        let mut r = cancel(id);
        r.extensions.insert(AuthorisedTask {
            record: record("t1").into(),
        });
        r
    };
    let a = json_of(&stack.clone().oneshot(authorised(1)).await.unwrap());
    assert_eq!(a["result"]["status"], "cancelled");
    let b = json_of(&stack.clone().oneshot(authorised(2)).await.unwrap());
    assert_eq!(b["error"]["code"], jsonrpc::INVALID_PARAMS, "{b}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Issue 29 item 16: an `initialize` notes the session it opened with a copy of the upstream's
/// `Mcp-Session-Id` (a clone is a slice of the upstream connection's read buffer, which the
/// note kept alive: about 5 kB per session), and the session's DELETE forgets every note of
/// it (before, they stayed until their table was next cleared, 10,000 sessions later).
#[tokio::test]
async fn a_deleted_session_leaves_no_notes_and_the_noted_id_is_a_copy() {
    use crate::exchange::Operation;
    use http::HeaderValue;
    let (registry, _) = registry();
    let state = CancelState::new(registry, Duration::from_secs(30));
    // The upstream's head as hyper keeps it: every value a slice of one read buffer.
    let buffer = Bytes::from(b"mcp-session-id: up-session-1\r\n".repeat(256));
    let issued = HeaderValue::from_maybe_shared(buffer.slice(16..28)).unwrap();
    let upstream = tower::service_fn(move |req: McpRequest| {
        let issued = issued.clone();
        async move {
            let mut reply = match &req.op {
                Operation::Post(m) if m.method() == Some("initialize") => {
                    let mut r = McpReply::local_json(Bytes::from_static(
                        br#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"s","version":"1"}}}"#,
                    ));
                    r.headers
                        .insert(crate::headers::MCP_SESSION_ID.clone(), issued);
                    r
                }
                _ => McpReply::accepted(),
            };
            if matches!(req.op, Operation::EndSession) {
                reply.status = http::StatusCode::OK;
            }
            Ok::<_, GatewayError>(reply)
        }
    });
    let stack = CancelLayer::new(state.clone()).layer(upstream);
    let on_session = |mut req: McpRequest, session: Option<&str>| {
        let session = session.map(|s| HeaderValue::from_str(s).unwrap());
        req.ctx.session_id = session.clone();
        req.ctx.client_session_id = session;
        req
    };
    let init = on_session(
        request(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#),
        None,
    );
    stack.clone().oneshot(init).await.unwrap();
    let noted = state.noted_sessions();
    assert_eq!(noted, vec![HeaderValue::from_static("up-session-1")]);
    let range = buffer.as_ptr() as usize..buffer.as_ptr() as usize + buffer.len();
    assert!(
        !range.contains(&(noted[0].as_bytes().as_ptr() as usize)),
        "the note keeps the upstream's read buffer alive"
    );
    // A forwarded notifications/cancelled is noted too (a second one would be a duplicate).
    let cancelled = on_session(
        request(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}}"#),
        Some("up-session-1"),
    );
    stack.clone().oneshot(cancelled).await.unwrap();
    assert_eq!(state.notes_len(), 2);
    // Another session's DELETE leaves them; this session's DELETE forgets them.
    let mut delete = on_session(request(r#"{"jsonrpc":"2.0","method":"x"}"#), Some("other"));
    delete.op = Operation::EndSession;
    stack.clone().oneshot(delete).await.unwrap();
    assert_eq!(state.notes_len(), 2);
    let mut delete = on_session(
        request(r#"{"jsonrpc":"2.0","method":"x"}"#),
        Some("up-session-1"),
    );
    delete.op = Operation::EndSession;
    let reply = stack.oneshot(delete).await.unwrap();
    assert_eq!(reply.status, http::StatusCode::OK);
    assert_eq!(state.notes_len(), 0, "the ended session's notes are gone");
}

/// Notes kept after their request (a task-augmented call's creation note, a forwarded
/// `notifications/cancelled`) hold none of the request's read buffer: the client's
/// `Mcp-Session-Id` as it arrived is a slice of it (8 KiB or more), and 10,000 creation notes
/// kept 78 MiB of buffers alive in `benches/run.sh` scenario 6 (heaptrack, 2026-12-05).
#[tokio::test]
async fn notes_kept_after_their_request_hold_none_of_its_read_buffer() {
    use crate::layers::extensions::PendingCreation;
    use http::HeaderValue;
    let (registry, _) = registry();
    let state = CancelState::new(registry.clone(), Duration::from_secs(30));
    // The client's head as hyper keeps it: every value a slice of one read buffer.
    let buffer = Bytes::from(b"mcp-session-id: client-session-1\r\n".repeat(256));
    let session = || HeaderValue::from_maybe_shared(buffer.slice(16..32)).unwrap();
    let on_session = |mut req: McpRequest| {
        req.ctx.session_id = Some(session());
        req.ctx.client_session_id = Some(session());
        req
    };
    let mut create = on_session(request(
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","task":{}}}"#,
    ));
    let up: Arc<str> = "up".into();
    let owner = create.ctx.caller().owner();
    create.extensions.insert(PendingCreation {
        template: Arc::new(record("t1")),
        reservation: Arc::new(registry.reserve(&up, &owner).expect("a slot")),
        progress_token: None,
        created: Default::default(),
    });
    state.note_creation(&create);
    drop(create);
    let upstream =
        tower::service_fn(|_req: McpRequest| async { Ok::<_, GatewayError>(McpReply::accepted()) });
    let cancelled = on_session(request(
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}}"#,
    ));
    CancelLayer::new(state.clone())
        .layer(upstream)
        .oneshot(cancelled)
        .await
        .unwrap();
    assert_eq!(state.notes_len(), 2, "both noted");
    assert!(
        buffer.is_unique(),
        "a note keeps the request's read buffer alive"
    );
}

/// The transport's deadline is set by the layers that know the request (never by the transport
/// matching method names): `tasks` leaves a `tasks/result` unbounded, `cancel` bounds the whole
/// exchange of the `tasks/cancel` it forwards, anything else keeps the default.
#[tokio::test]
async fn the_layers_set_each_request_s_deadline() {
    use crate::exchange::Deadline;
    let (registry, _) = registry_with_t1().await;
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let inner = {
        let (seen, calls) = (seen.clone(), Arc::new(AtomicUsize::new(0)));
        let answer = upstream(calls, 0);
        tower::service_fn(move |req: McpRequest| {
            seen.lock()
                .push((req.method().unwrap_or("").to_string(), req.deadline()));
            answer.clone().oneshot(req)
        })
    };
    let stack = TasksLayer::new(registry.clone(), false)
        .layer(CancelLayer::new(CancelState::new(registry, Duration::from_secs(1))).layer(inner));
    for (id, method) in [(1, "tasks/result"), (2, "tasks/cancel"), (3, "tasks/get")] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{"taskId":"t1"}}}}"#
        );
        stack.clone().oneshot(request(&body)).await.unwrap();
    }
    assert_eq!(
        *seen.lock(),
        [
            ("tasks/result".to_string(), Deadline::Unbounded),
            ("tasks/cancel".to_string(), Deadline::Exchange),
            ("tasks/get".to_string(), Deadline::Head),
        ]
    );
}

/// Review 18a #5: a follow-up of an acknowledged 2026-07-28 cancel stops at taskgate's
/// shutdown signal: no poll goes upstream after it (before: polls ran on until their count was
/// used up, possibly after the store was closed). Paused time: the
/// follow-up's waits pass at once, so a follow-up that ignored the signal would poll on.
#[tokio::test(start_paused = true)]
async fn a_follow_up_after_a_cancel_ack_stops_at_shutdown() {
    use crate::layers::extensions::AuthorisedTask;
    let (registry, _) = registry();
    let slot = registry
        .reserve(&"up".into(), &crate::layers::testing::owner())
        .unwrap();
    let mut live = record("t1");
    live.era = Era::Modern;
    registry.record_creation(live.clone(), &slot).await.unwrap();
    let polls = Arc::new(AtomicUsize::new(0));
    let counted = polls.clone();
    // The task stays `working` upstream, however often it is polled.
    let upstream = tower::service_fn(move |req: McpRequest| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let id = req
                .id()
                .map(|i| i.as_json().to_string())
                .unwrap_or_default();
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"resultType":"complete","taskId":"t1","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttlMs":60000,"pollIntervalMs":100}}}}"#
            );
            Ok::<_, GatewayError>(McpReply::local_json(Bytes::from(body)))
        }
    });
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let state = CancelState::stopping_with(registry.clone(), Duration::from_secs(30), shutdown);
    let mut cancel =
        request(r#"{"jsonrpc":"2.0","id":7,"method":"tasks/cancel","params":{"taskId":"t1"}}"#);
    cancel.extensions.insert(Era::Modern);
    cancel.extensions.insert(AuthorisedTask {
        record: Arc::new(live),
    });
    let poll = modern::PollAfterAck::of(&cancel).expect("a 2026 task");
    follow_after_ack(&state, upstream, poll).await;
    assert_eq!(polls.load(Ordering::SeqCst), 1, "the poll before the ack");
    // The follow-up runs (its first wait is the task's interval).
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(polls.load(Ordering::SeqCst), 2, "one follow-up poll");
    assert_eq!(state.follow_ups.load(Ordering::SeqCst), 1);
    stop.send(true).unwrap();
    tokio::time::sleep(FOLLOW_UP_FOR * 2).await;
    assert_eq!(polls.load(Ordering::SeqCst), 2, "no poll after shutdown");
    assert_eq!(
        state.follow_ups.load(Ordering::SeqCst),
        0,
        "its place given back"
    );
}
