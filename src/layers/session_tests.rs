//! Unit tests of the session table: only sessions the upstream issued get an entry, the table is
//! bounded, and nobody's traffic evicts a session in use (issue 16, items 1 and 3).

use super::*;
use crate::exchange::{GatewayError, McpReply, McpRequest};
use crate::layers::session_guard::SessionGuardLayer;
use crate::layers::testing::request;
use crate::registry::StoreThreads;
use crate::store::HeldSessionStore;
use tower::{Layer, ServiceExt};

/// Store threads of their own, as the registry's (the session table's store calls run there).
fn threads() -> StoreThreads {
    StoreThreads::new().unwrap()
}

/// An upstream answering `initialize` with session `issued-<n>` and anything else with a
/// `tools/list` result naming one tool.
fn stack(
    sessions: Arc<Sessions>,
) -> impl tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Clone {
    let upstream = crate::layers::testing::issuing_upstream();
    let inner = SessionLayer::new(sessions.clone()).layer(upstream);
    SessionGuardLayer::new(sessions, false).layer(inner)
}

fn with_session(json: &str, sid: Option<&str>) -> McpRequest {
    let mut req = request(json);
    let sid = sid.map(|s| HeaderValue::from_str(s).unwrap());
    req.ctx.session_id = sid.clone();
    req.ctx.client_session_id = sid;
    req
}

async fn drain(reply: McpReply) {
    // The session layer observes the body as it is read.
    if let ReplyBody::Json(_) = &reply.body {
        let _ = reply.body.map_messages(|_| None);
    }
}

#[tokio::test]
async fn client_chosen_session_ids_create_no_state() {
    let sessions = Sessions::new();
    let svc = stack(sessions.clone());
    for i in 0..1000 {
        let req = with_session(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            Some(&format!("random-{i}")),
        );
        drain(svc.clone().oneshot(req).await.unwrap()).await;
    }
    assert_eq!(
        sessions.len(),
        0,
        "tools/list on unknown sessions must not create entries"
    );
    let init = with_session(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{"tasks":{}}}}"#,
        Some("stale"),
    );
    drain(svc.clone().oneshot(init).await.unwrap()).await;
    assert_eq!(sessions.len(), 1);
    let key = SessionKey::Session(HeaderValue::from_static("issued-0"));
    let info = sessions
        .get(&"up".into(), Some(&key))
        .expect("issued session known");
    assert!(info.client_declares_tasks());
    assert!(info.upstream_tasks_tools_call());
    assert!(sessions
        .get(
            &"up".into(),
            Some(&SessionKey::Session(HeaderValue::from_static("stale")))
        )
        .is_none());
}

#[tokio::test]
async fn a_full_table_refuses_new_sessions_and_keeps_the_old_ones() {
    let sessions = Sessions::with_limits(3, Duration::from_secs(3600));
    let svc = stack(sessions.clone());
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}"#;
    for _ in 0..3 {
        let reply = svc.clone().oneshot(with_session(init, None)).await.unwrap();
        assert_eq!(reply.status, 200);
        drain(reply).await;
    }
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    drain(
        svc.clone()
            .oneshot(with_session(list, Some("issued-0")))
            .await
            .unwrap(),
    )
    .await;
    let refused = svc.clone().oneshot(with_session(init, None)).await.unwrap();
    assert_eq!(refused.status, 503);
    for k in 0..3 {
        let key = SessionKey::Session(HeaderValue::from_str(&format!("issued-{k}")).unwrap());
        assert!(
            sessions.get(&"up".into(), Some(&key)).is_some(),
            "issued-{k} kept"
        );
    }
    // That the tools/list of a kept session fills its tool cache is `upgrade`'s now
    // (upgrade::tool_cache::tests::a_known_sessions_tools_list_fills_the_cache).
}

// `equal_tool_caches_are_shared` moved with the tool cache to `upgrade::tool_cache::tests`.

/// A held session as the `session` layer stores it (owner `owner`), in the table and the store.
async fn store_a_held_session(sessions: &Arc<Sessions>, up: &Arc<str>, id: &str, owner: Principal) {
    let held = HeldSession::from_initialize(Some(&serde_json::json!({
        "capabilities": {"elicitation": {}}, "clientInfo": {"name": "c", "version": "1"}})));
    let result = serde_json::json!({"protocolVersion": "2025-06-18", "capabilities": {}});
    let key = SessionKey::Session(HeaderValue::from_str(id).unwrap());
    assert!(sessions.insert(
        up,
        Some(key),
        (owner.clone(), Tenant::of(&owner, None)),
        None,
        Some(&result),
        Some(Arc::new(held))
    ));
    let id = HeaderValue::from_str(id).unwrap();
    sessions.store_entry(up, &id).await.unwrap();
}

/// A burst of sessions written to the store holds no store thread through the group commit:
/// with one store thread (and one blocking thread) and the commit held, every session is still
/// written. (Each write used to wait for the commit on its thread, so 64 clients opening
/// sessions at once started 62 threads, `benches/profile.sh` at c=64, issue 30; here the first
/// write kept the only thread and the others never ran.)
#[test]
fn session_writes_hold_no_thread_through_the_group_commit() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = crate::layers::testing::CountingStore::new();
        let sessions = Sessions::with_limits(100, Duration::from_secs(3600));
        sessions.keep_held_in(store.clone(), StoreThreads::with_max(1).unwrap());
        let up: Arc<str> = "up".into();
        let commits = store.syncs_gate.lock().await;
        let held = HeldSession::from_initialize(Some(&serde_json::json!({"capabilities": {}})));
        let result = serde_json::json!({"protocolVersion": "2025-06-18", "capabilities": {}});
        let alice = Principal::Token("alice".into());
        let ids: Vec<String> = (0..8)
            .map(|n| format!("{HELD_SESSION_PREFIX}{n:032}"))
            .collect();
        let mut writes = Vec::new();
        for id in &ids {
            let hv = HeaderValue::from_str(id).unwrap();
            assert!(sessions.insert(
                &up,
                Some(SessionKey::Session(hv.clone())),
                (alice.clone(), Tenant::of(&alice, None)),
                None,
                Some(&result),
                Some(Arc::new(held.clone()))
            ));
            let (sessions, up) = (sessions.clone(), up.clone());
            writes.push(tokio::spawn(
                async move { sessions.store_entry(&up, &hv).await },
            ));
        }
        let written = || {
            ids.iter()
                .filter(|id| store.held_session(&up, id).unwrap().is_some())
                .count()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while written() < ids.len() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            written(),
            ids.len(),
            "sessions written while the commit is held"
        );
        assert!(
            writes.iter().all(|w| !w.is_finished()),
            "no write is answered before its commit"
        );
        drop(commits);
        for w in writes {
            w.await.unwrap().unwrap();
        }
    });
}

/// The background re-read of a session due for it never puts back an entry that went while the
/// row was read: a local DELETE between the read and its answer left the session served again
/// (up to the next re-read) although the store had removed it (cold review of issue 35).
#[tokio::test]
async fn a_recheck_never_brings_back_a_session_ended_meanwhile() {
    let store = crate::layers::testing::CountingStore::new();
    let up: Arc<str> = "up".into();
    let id = format!("{HELD_SESSION_PREFIX}{}", "b".repeat(32));
    let hv = HeaderValue::from_str(&id).unwrap();
    let alice = Principal::Token("alice".into());
    let sessions = Sessions::with_limits(10, Duration::from_secs(3600));
    sessions.keep_held_in(store.clone(), threads());
    store_a_held_session(&sessions, &up, &id, alice.clone()).await;
    // The row as the re-read saw it before the DELETE removed it.
    let stale = store.held_session(&up, &id).unwrap().expect("stored");
    sessions
        .forget_ended(&up, Some(&SessionKey::Session(hv.clone())))
        .await;
    use crate::store::HeldSessionStore;
    store.put_held_session(stale).unwrap();
    crate::store::TaskStore::sync(&*store).await.unwrap();
    assert_eq!(
        sessions.recheck(&up, &hv).await,
        Revived::NotStored,
        "a recheck does not insert"
    );
    assert_eq!(sessions.access(&up, &hv, &alice), Access::Unknown);
}

/// Session store calls that fail (a database outage) are counted in the registry's
/// `taskgate_store_write_failures_total`: a replica that had not seen a session answered each
/// of its requests 500 ("could not read the session"), and an `initialize` 500 ("could not
/// record the session"), while that counter, behind the store alert, stayed 0.
#[tokio::test]
async fn session_store_failures_are_counted() {
    let store = crate::layers::testing::CountingStore::new();
    let up: Arc<str> = "up".into();
    let sessions = Sessions::with_limits(10, Duration::from_secs(3600));
    sessions.keep_held_in(store.clone(), threads());
    let failures = prometheus::IntCounter::new("failures", "failures").unwrap();
    sessions.count_store_failures(failures.clone());
    let id = format!("{HELD_SESSION_PREFIX}{}", "c".repeat(32));
    let hv = HeaderValue::from_str(&id).unwrap();
    store_a_held_session(&sessions, &up, &id, Principal::Token("alice".into())).await;
    assert_eq!(failures.get(), 0);
    store
        .fail_held
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // Its write fails (an `initialize` answered 500).
    assert!(sessions.store_entry(&up, &hv).await.is_err());
    assert_eq!(failures.get(), 1, "a failed session write is counted");
    // Unknown to a table that never saw it (another replica): its read fails.
    let other = Sessions::with_limits(10, Duration::from_secs(3600));
    other.keep_held_in(store.clone(), threads());
    other.count_store_failures(failures.clone());
    assert_eq!(
        other.revive(&up, &hv, Tenant::Unknown).await,
        Revived::Failed
    );
    assert_eq!(failures.get(), 2, "a failed session read is counted");
}

/// A held session comes back from the store into a new table (a restart) with its owner, its
/// protocol version and what the client declared; one past `gateway.session_idle_ms` does not
/// come back and leaves the store; a DELETE removes it from the store before it returns.
#[tokio::test]
async fn held_sessions_come_back_from_the_store_within_their_idle_limit() {
    let store = crate::layers::testing::CountingStore::new();
    let up: Arc<str> = "up".into();
    let id = format!("{HELD_SESSION_PREFIX}{}", "a".repeat(32));
    let hv = HeaderValue::from_str(&id).unwrap();
    let alice = Principal::Token("alice".into());
    let before = Sessions::with_limits(10, Duration::from_secs(3600));
    before.keep_held_in(store.clone(), threads());
    store_a_held_session(&before, &up, &id, alice.clone()).await;

    let after = Sessions::with_limits(10, Duration::from_secs(3600));
    after.keep_held_in(store.clone(), threads());
    assert_eq!(after.access(&up, &hv, &alice), Access::Unknown);
    assert_eq!(
        after.revive(&up, &hv, Tenant::Unknown).await,
        Revived::InTable
    );
    assert_eq!(
        after.access(&up, &hv, &alice),
        Access::Owner(Some(HeaderValue::from_static("2025-06-18")))
    );
    assert_eq!(
        after.access(&up, &hv, &Principal::Token("bob".into())),
        Access::Foreign
    );
    let held = after.held(&up, &hv).flatten().expect("held");
    assert!(held.client_capabilities["elicitation"].is_object());
    assert_eq!(held.client_info.as_ref().unwrap()["name"], "c");

    after
        .forget_ended(&up, Some(&SessionKey::Session(hv.clone())))
        .await;
    assert!(store.held_session(&up, &id).unwrap().is_none());
    let again = Sessions::with_limits(10, Duration::from_secs(3600));
    again.keep_held_in(store.clone(), threads());
    assert_eq!(
        again.revive(&up, &hv, Tenant::Unknown).await,
        Revived::NotStored
    );

    // Idle past the limit (0 here) when the table comes back: not revived, and gone.
    let idle = Sessions::with_limits(10, Duration::ZERO);
    idle.keep_held_in(store.clone(), threads());
    store_a_held_session(&idle, &up, &id, Principal::Anonymous).await;
    assert!(store.held_session(&up, &id).unwrap().is_some());
    let restarted = Sessions::with_limits(10, Duration::ZERO);
    restarted.keep_held_in(store.clone(), threads());
    assert_eq!(
        restarted.revive(&up, &hv, Tenant::Unknown).await,
        Revived::NotStored
    );
    assert!(store.held_session(&up, &id).unwrap().is_none());
}

/// A held session reclaimed as idle to make room leaves the store too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_held_session_leaves_the_store() {
    let store = crate::layers::testing::CountingStore::new();
    let up: Arc<str> = "up".into();
    let id = format!("{HELD_SESSION_PREFIX}{}", "b".repeat(32));
    let sessions = Sessions::with_limits(1, Duration::ZERO);
    sessions.keep_held_in(store.clone(), threads());
    store_a_held_session(&sessions, &up, &id, Principal::Anonymous).await;
    assert!(
        sessions.has_room(&Tenant::Unknown),
        "the idle held session is reclaimed"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.held_session(&up, &id).unwrap().is_some() {
        assert!(std::time::Instant::now() < deadline, "still stored");
        tokio::task::yield_now().await;
    }
}

/// Sets when a session was last used (seconds since the table was made): the table's clock
/// counts whole seconds, so a test orders sessions itself.
fn set_used(sessions: &Sessions, up: &Arc<str>, id: &str, at: u32) {
    let key = (
        up.clone(),
        Some(SessionKey::Session(HeaderValue::from_str(id).unwrap())),
    );
    sessions
        .table
        .lock()
        .map
        .get_mut(&key)
        .expect("in the table")
        .last_used = at;
}

/// Issue 29 #4: a principal past `limits.max_sessions_per_principal` reclaims its own least
/// recently used session, never another principal's; a held one leaves the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_past_its_share_reclaims_its_own_least_recent_session() {
    let store = crate::layers::testing::CountingStore::new();
    let up: Arc<str> = "up".into();
    let sessions = Sessions::with_caps(100, Duration::from_secs(3600), 2);
    sessions.keep_held_in(store.clone(), threads());
    let alice = Principal::Token("alice".into());
    let bob = Principal::Token("bob".into());
    let as_alice = || (alice.clone(), Tenant::of(&alice, None));
    let key = |s: &str| SessionKey::Session(HeaderValue::from_str(s).unwrap());
    let held_id = format!("{HELD_SESSION_PREFIX}{}", "c".repeat(32));
    store_a_held_session(&sessions, &up, &held_id, alice.clone()).await;
    assert!(sessions.insert(&up, Some(key("a-2")), as_alice(), None, None, None));
    let as_bob = (bob.clone(), Tenant::of(&bob, None));
    assert!(sessions.insert(&up, Some(key("b-1")), as_bob, None, None, None));
    set_used(&sessions, &up, "b-1", 0);
    set_used(&sessions, &up, "a-2", 1);
    set_used(&sessions, &up, &held_id, 5);

    assert!(
        sessions.has_room(&Tenant::of(&alice, None)),
        "at her cap, alice still gets a session"
    );
    assert!(sessions.insert(&up, Some(key("a-3")), as_alice(), None, None, None));
    assert!(
        sessions.get(&up, Some(&key("a-2"))).is_none(),
        "alice's least recently used session is reclaimed"
    );
    assert!(sessions.get(&up, Some(&key(&held_id))).is_some());
    assert!(
        sessions.get(&up, Some(&key("b-1"))).is_some(),
        "bob's session (the least recently used of all) is never touched"
    );
    assert_eq!(sessions.len(), 3);

    // Now alice's held session is her least recent one: it goes, from the store too.
    set_used(&sessions, &up, "a-3", 9);
    assert!(sessions.insert(&up, Some(key("a-4")), as_alice(), None, None, None));
    assert!(sessions.get(&up, Some(&key(&held_id))).is_none());
    assert!(sessions.get(&up, Some(&key("a-3"))).is_some());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.held_session(&up, &held_id).unwrap().is_some() {
        assert!(std::time::Instant::now() < deadline, "still stored");
        tokio::task::yield_now().await;
    }

    // Without a principal, callers count by address: two addresses do not share a cap.
    let one = Tenant::of(&Principal::Anonymous, Some("10.0.0.1".parse().unwrap()));
    let two = Tenant::of(&Principal::Anonymous, Some("10.0.0.2".parse().unwrap()));
    for (id, t) in [("o-1", &one), ("o-2", &one), ("t-1", &two), ("t-2", &two)] {
        assert!(sessions.insert(
            &up,
            Some(key(id)),
            (Principal::Anonymous, t.clone()),
            None,
            None,
            None
        ));
    }
    set_used(&sessions, &up, "o-1", 1);
    set_used(&sessions, &up, "o-2", 2);
    set_used(&sessions, &up, "t-1", 0);
    assert!(sessions.insert(
        &up,
        Some(key("o-3")),
        (Principal::Anonymous, one),
        None,
        None,
        None
    ));
    assert!(
        sessions.get(&up, Some(&key("o-1"))).is_none(),
        "10.0.0.1 made room itself"
    );
    assert!(
        sessions.get(&up, Some(&key("t-1"))).is_some(),
        "10.0.0.2 keeps its sessions"
    );
    assert_eq!(sessions.len(), 7);
}

/// [`stack`] with authentication on (an unknown session id is refused, never forwarded).
fn authenticated_stack(
    sessions: Arc<Sessions>,
) -> impl tower::Service<McpRequest, Response = McpReply, Error = GatewayError> + Clone {
    let upstream = crate::layers::testing::issuing_upstream();
    let inner = SessionLayer::new(sessions.clone()).layer(upstream);
    SessionGuardLayer::new(sessions, true).layer(inner)
}

fn as_principal(mut req: McpRequest, who: &str) -> McpRequest {
    req.ctx.principal = Principal::Token(who.into());
    req
}

/// Issue 35: a session the upstream issued is in the store before its `initialize` answer goes
/// on, and a table that never saw it (a restart, or another replica of a tier) serves it to
/// its owner from the store, with what the client declared; another principal still gets 404;
/// its DELETE removes it from the store. (Before: 404 "Session not found" for the owner too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_the_upstream_issued_are_served_by_a_table_that_never_saw_them() {
    let store = crate::layers::testing::CountingStore::new();
    let up: Arc<str> = "up".into();
    let before = Sessions::new();
    before.keep_held_in(store.clone(), threads());
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{"tasks":{},"elicitation":{}}}}"#;
    let reply = authenticated_stack(before.clone())
        .oneshot(as_principal(with_session(init, None), "alice"))
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    let sid = reply.headers["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let stored = store.held_session(&up, &sid).unwrap().expect("stored");
    assert!(stored.upstream_issued, "{stored:?}");
    assert_eq!(stored.owner.as_deref(), Some("alice"));

    let after = Sessions::new();
    after.keep_held_in(store.clone(), threads());
    let svc = authenticated_stack(after.clone());
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let bob = svc
        .clone()
        .oneshot(as_principal(with_session(list, Some(&sid)), "bob"))
        .await
        .unwrap();
    assert_eq!(bob.status, 404, "another principal's session");
    let alice = svc
        .clone()
        .oneshot(as_principal(with_session(list, Some(&sid)), "alice"))
        .await
        .unwrap();
    assert_eq!(alice.status, 200, "the owner's session is served");
    let key = SessionKey::Session(HeaderValue::from_str(&sid).unwrap());
    let info = after.get(&up, Some(&key)).expect("in the table");
    assert!(info.client_declares_tasks() && info.client_has("/elicitation"));
    assert!(info.upstream_tasks_tools_call());
    assert!(info.held.is_none(), "passed through, not held");
    // Not stored: 404 with authentication, as before.
    let unknown = svc
        .clone()
        .oneshot(as_principal(
            with_session(list, Some("never-issued")),
            "alice",
        ))
        .await
        .unwrap();
    assert_eq!(unknown.status, 404);

    let mut delete = as_principal(with_session(list, Some(&sid)), "alice");
    delete.op = crate::exchange::Operation::EndSession;
    let ended = svc.clone().oneshot(delete).await.unwrap();
    assert!(ended.status.is_success(), "{}", ended.status);
    assert!(
        store.held_session(&up, &sid).unwrap().is_none(),
        "DELETE removes it"
    );
    let gone = Sessions::new();
    gone.keep_held_in(store.clone(), threads());
    let again = authenticated_stack(gone)
        .oneshot(as_principal(with_session(list, Some(&sid)), "alice"))
        .await
        .unwrap();
    assert_eq!(again.status, 404);
}

/// alice's `initialize` through the session layers to an upstream that answers it over SSE with
/// `first` (a notification), then the `InitializeResult`, naming the upstream session `issued`.
async fn sse_initialize(sessions: &Arc<Sessions>, first: String, issued: &'static str) -> McpReply {
    let upstream = tower::service_fn(move |_req: McpRequest| {
        let first = first.clone();
        async move {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.send(crate::sse::Event::message(first)).await.unwrap();
            tx.send(crate::sse::Event::message(
                r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{}}}"#
                    .into(),
            ))
            .await
            .unwrap();
            Ok::<_, GatewayError>(McpReply::event_stream(
                rx,
                Some(HeaderValue::from_static(issued)),
            ))
        }
    });
    let svc = SessionGuardLayer::new(sessions.clone(), true)
        .layer(SessionLayer::new(sessions.clone()).layer(upstream));
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}"#;
    svc.oneshot(as_principal(with_session(init, None), "alice"))
        .await
        .unwrap()
}

/// Issue 35: an `initialize` answered over SSE has its session stored before the stream goes
/// on, and the stream reaches the client whole (the answer and what came before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_initialize_answer_is_stored_before_it_goes_on() {
    let store = crate::layers::testing::CountingStore::new();
    let sessions = Sessions::new();
    sessions.keep_held_in(store.clone(), threads());
    let reply = sse_initialize(
        &sessions,
        r#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#.into(),
        "sse-session",
    )
    .await;
    let stored = store.held_session("up", "sse-session").unwrap();
    assert_eq!(
        stored.and_then(|s| s.protocol_version).as_deref(),
        Some("2025-11-25"),
        "stored before the answer went on"
    );
    let ReplyBody::Stream(events) = reply.body else {
        panic!("an SSE answer stays one");
    };
    use futures_util::StreamExt;
    let events: Vec<_> = events.collect().await;
    assert_eq!(events.len(), 2, "{events:?}");
}

/// The events read ahead of an SSE `initialize` answer are bounded in bytes too: past
/// `issued::MAX_BYTES_BEFORE` the stream goes on as it came (the session kept in this process's
/// table only), so one `initialize` cannot hold 64 events of `limits.max_event_bytes` each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_initialize_answer_holds_a_bounded_number_of_bytes() {
    let store = crate::layers::testing::CountingStore::new();
    let sessions = Sessions::new();
    sessions.keep_held_in(store.clone(), threads());
    let big = "x".repeat(super::issued::MAX_BYTES_BEFORE + 1);
    let reply = sse_initialize(
        &sessions,
        format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":"{big}"}}}}"#
        ),
        "big-session",
    )
    .await;
    assert!(
        store.held_session("up", "big-session").unwrap().is_none(),
        "not read ahead past the bound, so not stored"
    );
    let ReplyBody::Stream(events) = reply.body else {
        panic!("an SSE answer stays one");
    };
    use futures_util::StreamExt;
    let events: Vec<_> = events.collect().await;
    assert_eq!(events.len(), 2, "the stream reaches the client whole");
}

/// A session id the store did not have is not asked for again for `REVALIDATE_AFTER` (without
/// authentication such ids are forwarded, and a client that keeps using one would otherwise
/// cost a store read per request); other ids still are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_session_is_not_looked_up_again_at_once() {
    let store = crate::layers::testing::CountingStore::new();
    let up: Arc<str> = "up".into();
    let sessions = Sessions::new();
    assert!(
        !sessions.may_look_up(&up, &HeaderValue::from_static("x")),
        "no store"
    );
    sessions.keep_held_in(store, threads());
    let stale = HeaderValue::from_static("from-before-the-upgrade");
    assert!(sessions.may_look_up(&up, &stale));
    assert_eq!(
        sessions.revive(&up, &stale, Tenant::Unknown).await,
        Revived::NotStored
    );
    assert!(!sessions.may_look_up(&up, &stale));
    assert!(sessions.may_look_up(&up, &HeaderValue::from_static("another")));
    assert!(sessions.may_look_up(&"other-upstream".into(), &stale));
}

/// A `DELETE` deferred while its owner has a live task is answered only once the session has
/// left the store too: before, the store removal ran in the background after the 200, and the
/// client's next request on the ended session could find it still stored, revive it and be
/// served (CI of 2026-12-05: 200 where 404 was due). A store that holds removals shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_delete_is_answered_once_its_session_left_the_store() {
    let store = crate::layers::testing::CountingStore::new();
    let up: Arc<str> = "up".into();
    let id = format!("{HELD_SESSION_PREFIX}{}", "d".repeat(32));
    let alice = Principal::Token("alice".into());
    let sessions = Sessions::with_limits(10, Duration::from_secs(3600));
    sessions.keep_held_in(store.clone(), threads());
    store_a_held_session(&sessions, &up, &id, alice.clone()).await;
    let (registry, _) = crate::layers::testing::registry();
    let mut delete = as_principal(
        with_session(r#"{"jsonrpc":"2.0","method":"x"}"#, Some(&id)),
        "alice",
    );
    delete.op = crate::exchange::Operation::EndSession;
    delete.ctx.upstream = up.clone();
    // One live task of alice's on `up`.
    let live = registry
        .reserve(&up, &delete.ctx.caller().owner())
        .expect("a slot");
    live.keep();
    let inner =
        SessionLayer::new(sessions.clone()).layer(crate::layers::testing::issuing_upstream());
    let svc = SessionGuardLayer::new(sessions.clone(), true)
        .defer_deletes(registry)
        .layer(inner);

    let removals = store.held_removals.lock().unwrap();
    let answer = tokio::spawn(svc.clone().oneshot(delete));
    // The removal has reached the store (and waits there).
    let begun = || {
        store
            .held_removals_begun
            .load(std::sync::atomic::Ordering::SeqCst)
            > 0
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while !begun() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the session's removal reached the store");
    assert!(
        !answer.is_finished(),
        "answered while the session was still in the store"
    );
    // A request on the session meanwhile (its client has no answer to its DELETE yet) is
    // served from the table; it must not bring the session back from the store for later
    // (taken from the table before the store removal, it was looked up there and revived).
    let mut meanwhile = as_principal(
        with_session(
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
            Some(&id),
        ),
        "alice",
    );
    meanwhile.ctx.upstream = up.clone();
    let served = svc.clone().oneshot(meanwhile).await.unwrap();
    assert_eq!(served.status, http::StatusCode::OK, "served meanwhile");
    drop(removals);
    let reply = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered once the store let go")
        .unwrap()
        .unwrap();
    assert_eq!(reply.status, http::StatusCode::OK);
    assert!(store.held_session(&up, &id).unwrap().is_none());
    assert_eq!(
        sessions.access(&up, &HeaderValue::from_str(&id).unwrap(), &alice),
        Access::Unknown
    );
}

/// A request's session is looked up by a `SessionRef` of its bytes (issue 36): it must hash
/// and compare as the `Key` the table holds, or a session in the table would read as unknown.
#[test]
fn a_session_ref_hashes_and_compares_as_its_key() {
    use std::hash::BuildHasher;
    let hasher = TableHasher::default();
    let upstream: Arc<str> = "bench".into();
    let id = HeaderValue::from_static("sess-1");
    let key: Key = (upstream.clone(), Some(SessionKey::Session(id.clone())));
    let at = SessionRef {
        upstream: &upstream,
        session: id.as_bytes(),
    };
    assert_eq!(hasher.hash_one(&key), hasher.hash_one(&at));
    assert!(hashbrown::Equivalent::equivalent(&at, &key));
    let other_id: Key = (
        upstream.clone(),
        Some(SessionKey::Session(HeaderValue::from_static("sess-2"))),
    );
    let other_upstream: Key = ("other".into(), Some(SessionKey::Session(id.clone())));
    let principal: Key = (
        upstream.clone(),
        Some(SessionKey::Principal("sess-1".into())),
    );
    for k in [
        &other_id,
        &other_upstream,
        &principal,
        &(upstream.clone(), None),
    ] {
        assert!(!hashbrown::Equivalent::equivalent(&at, k));
    }
    // And through the table: an owner's session is found by it.
    let sessions = Sessions::new();
    let owner = Principal::Token("alice".into());
    sessions.table.lock().put(
        key.clone(),
        SessionInfo {
            owner: owner.clone(),
            tenant: Tenant::Unknown,
            client_caps: Default::default(),
            upstream_tasks_tools_call: false,
            upstream_without_tasks: false,
            life: Default::default(),
            protocol_version: None,
            last_used: 0,
            held: None,
            stored: false,
            stored_at: 0,
            checked_at: 0,
        },
    );
    let (access, _) = sessions.access_view(&upstream, &id, &owner, |_| false);
    assert_eq!(access, Access::Owner(None));
    let (access, _) = sessions.access_view(
        &upstream,
        &HeaderValue::from_static("sess-2"),
        &owner,
        |_| false,
    );
    assert_eq!(access, Access::Unknown);
}
