//! The durable task registry and the `tasks` layer (issue 3), shown against a scripted MCP task
//! server (tests/common) and, where a crash or restart is the point, the real binary.
//!
//! Each test builds the smallest setup for one rule and asserts what users and operators rely on:
//! JSON-RPC codes, what the upstream received (and did not), what the store, `/admin/tasks`,
//! `taskgate tasks show|list` and `/metrics` hold.

use crate::common::*;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use taskgate::mcp::task::{parse_rfc3339_ms, TaskStatus};
use taskgate::store::Origin;

fn task_ids_in_store(store: &str) -> Vec<String> {
    records_in_store(store)
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

// =============================================================================================
// Recording CreateTaskResult
// =============================================================================================

/// A `CreateTaskResult` in a JSON body is recorded with the fields DESIGN.md lists, passed to the
/// client unchanged, and visible on the admin endpoint and in the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_task_result_in_json_body_is_recorded() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    assert_eq!(c.session.as_deref(), Some("sess-1"));

    let v = c.rpc(Client::create_body("1", Some(60_000))).await;
    let task = &v["result"]["task"];
    let task_id = task["taskId"]
        .as_str()
        .expect("CreateTaskResult")
        .to_string();
    let server_view = up.state.lock().unwrap().tasks[&task_id].to_json(&task_id);
    assert_eq!(
        task, &server_view,
        "client sees the upstream's task unchanged"
    );

    // Recorded before the reply reached us: no waiting.
    let r = tg
        .record(&task_id)
        .expect("record written before the reply");
    assert_eq!(r.upstream, "default");
    assert_eq!(r.task_id, task_id, "the upstream's taskId, never rewritten");
    assert_eq!(r.owner, "session:sess-1");
    assert_eq!(r.upstream_session.as_deref(), Some("sess-1"));
    assert_eq!(r.origin, Origin::Client);
    assert_eq!(r.tool.as_deref(), Some("slow"));
    assert_eq!(r.protocol_version.as_deref(), Some(PROTOCOL_VERSION));
    assert_eq!(r.status, TaskStatus::Working);
    assert_eq!(r.created_at, task["createdAt"].as_str().unwrap());
    assert_eq!(r.ttl_ms, Some(60_000));
    assert_eq!(r.poll_interval_ms, Some(100));
    assert_eq!(
        r.expires_at,
        parse_rfc3339_ms(&r.created_at).unwrap() + 60_000,
        "expires at createdAt + ttl"
    );
    assert!(r.cancelled_at.is_none() && r.released_at.is_none() && r.terminal_at.is_none());

    let (s, detail) = tg.admin(&format!("/admin/tasks/default/{task_id}")).await;
    assert_eq!(s, 200, "{detail}");
    assert_eq!(detail["task"]["task_id"], json!(task_id));
    assert_eq!(detail["task"]["status"], json!("working"));
    let (s, list) = tg.admin("/admin/tasks?owner=session:sess-1").await;
    assert_eq!(s, 200);
    assert_eq!(list["tasks"].as_array().unwrap().len(), 1, "{list}");
    let (_, none) = tg.admin("/admin/tasks?owner=session:sess-2").await;
    assert_eq!(none["tasks"], json!([]));

    let m = tg.metrics_text().await;
    assert_eq!(
        metric(&m, "taskgate_tasks_created_total", &[("origin", "client")]),
        1.0
    );
    assert_eq!(
        metric(&m, "taskgate_tasks", &[("status", "working")]),
        1.0,
        "{m}"
    );
}

/// A `CreateTaskResult` inside an SSE stream (after a progress event, with the stream still open)
/// is recorded by the time the client reads that event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_task_result_inside_sse_is_recorded_before_the_event_is_relayed() {
    let gate = Gate::new();
    let g = gate.clone();
    let up = TaskServer::start(Behaviour {
        creation_sse: true,
        creation_head: Some(Arc::new(|_, _| {
            vec![ev().data(&progress_notification(&json!("pt-1"), 0)).into()]
        })),
        creation_tail: Some(Arc::new(move |_, _| vec![SseStep::Wait(g.clone())])),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;

    let r = c.send(Client::create_body("1", Some(60_000))).await;
    assert_eq!(r.status(), 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let mut sse = r.sse();
    let first = sse.next_event(STEP).await.json();
    assert_eq!(first["method"], json!("notifications/progress"));
    let created = sse.next_event(STEP).await.json();
    let task_id = created["result"]["task"]["taskId"]
        .as_str()
        .expect("CreateTaskResult in the stream")
        .to_string();
    assert_eq!(created["id"], json!(1));

    let rec = tg
        .record(&task_id)
        .expect("recorded before the SSE event was relayed");
    assert_eq!(rec.owner, "session:sess-1");
    assert_eq!(rec.status, TaskStatus::Working);
    let (s, _) = tg.admin(&format!("/admin/tasks/default/{task_id}")).await;
    assert_eq!(s, 200);

    gate.open();
    sse.expect_end(STEP).await;
    // Only one record, and the stream's end changed nothing.
    let (_, list) = tg.admin("/admin/tasks").await;
    assert_eq!(list["tasks"].as_array().unwrap().len(), 1);
}

/// Two `CreateTaskResult`s answering one task-augmented call on its SSE stream (break-edge F4):
/// the first is recorded and passes, the second is not passed on (counted as a protocol error),
/// so no task id the registry does not hold reaches the client. On the old code both reached
/// the client and only the first was recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_create_task_result_on_the_stream_is_not_passed_on() {
    let up = TaskServer::start(Behaviour {
        creation_sse: true,
        creation_tail: Some(Arc::new(|task_id, v| {
            let second = json!({"task": {"taskId": format!("second-{task_id}"),
                "status": "working", "createdAt": "2026-01-01T00:00:00Z",
                "lastUpdatedAt": "2026-01-01T00:00:00Z", "ttl": 60000}});
            vec![ev()
                .data(&rpc_result(&v["id"].to_string(), &second.to_string()))
                .into()]
        })),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let r = c.send(Client::create_body("1", Some(60_000))).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await;
    assert!(
        !text.contains("second-"),
        "an unrecorded task id went out: {text}"
    );
    let (_, list) = tg.admin("/admin/tasks").await;
    let tasks = list["tasks"].as_array().cloned().unwrap_or_default();
    assert_eq!(tasks.len(), 1, "{list}");
    let recorded = tasks[0]["task_id"].as_str().unwrap_or_default();
    assert!(
        text.contains(&format!(r#""taskId":"{recorded}""#)),
        "the recorded task is the one the client got: {text}"
    );
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_upstream_errors_total",
            &[("kind", "protocol")]
        ),
        1.0,
        "{m}"
    );
}

// =============================================================================================
// Durability: the real binary, SIGKILL
// =============================================================================================

/// The client reads a taskId, the gateway is SIGKILLed at once, and `taskgate tasks show` finds
/// the task in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_is_durable_before_the_client_sees_its_id() {
    let up = TaskServer::default().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url()).write_for_binary(dir.path());
    let store = dir.path().join("store").to_str().unwrap().to_string();
    let (mut p, gw, _) = spawn_binary(&cfg);

    let c = Client::new(&format!("http://{gw}/mcp"));
    let task_id = c.create_task("1").await;
    sigkill(&mut p);

    let ran = blocking(|| {
        run_taskgate(
            &["tasks", "show", "--store", &store, "default", &task_id],
            &[],
        )
    });
    assert!(
        ran.status.success(),
        "tasks show after SIGKILL: {}",
        ran.stderr
    );
    let shown = parse_json(ran.stdout.as_bytes());
    assert_eq!(shown["task"]["task_id"], json!(task_id));
    assert_eq!(shown["task"]["status"], json!("working"));
    assert_eq!(shown["task"]["owner"], json!("anonymous"));
    assert_eq!(task_ids_in_store(&store), vec![task_id]);
}

// The crash loop (creations and acknowledged cancels under kill -9) is in tests/durability.rs.

// =============================================================================================
// Binding: principals and sessions
// =============================================================================================

/// With bearer auth, another principal's tasks/get|result|cancel get -32602 exactly like an
/// unknown task, the upstream sees nothing, and a missing or wrong token gets 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_principal_gets_task_not_found_and_upstream_sees_nothing() {
    let (up, tg, alice, bob) = bearer_pair().await;
    let task_id = alice.create_task("1").await;
    let record = tg.record(&task_id).unwrap();
    assert_eq!(record.owner, "principal:alice");

    let seen_before = up.up.count();
    // Bob on his own session; Bob presenting Alice's session id gets 404 (the session is
    // Alice's: tests/edge_sessions.rs) and reaches nothing either.
    let bob_on_alice_session = bob.clone().with_session(alice.session.as_deref().unwrap());
    let r = bob_on_alice_session
        .send(rpc(
            "\"b-0\"",
            "tasks/get",
            &format!(r#"{{"taskId":"{task_id}"}}"#),
        ))
        .await;
    assert_eq!(r.status(), 404, "another principal's session");
    for who in [&bob] {
        for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
            let foreign = who.task_call("\"b-1\"", method, &task_id).await;
            let unknown = who
                .task_call("\"b-2\"", method, "task-does-not-exist")
                .await;
            assert_eq!(err_code(&foreign), -32602, "{method}: {foreign}");
            assert_eq!(foreign["id"], json!("b-1"));
            assert_eq!(err_code(&unknown), -32602);
            assert_eq!(
                err_message(&foreign).replace(&task_id, "X"),
                err_message(&unknown).replace("task-does-not-exist", "X"),
                "a foreign task must be indistinguishable from an unknown one"
            );
        }
    }
    assert_eq!(
        up.up.count(),
        seen_before,
        "nothing reached the upstream: {:?}",
        up.task_requests()
    );
    assert_eq!(tg.record(&task_id).unwrap().status, TaskStatus::Working);

    // No token / a wrong token: 401 with WWW-Authenticate: Bearer, upstream untouched.
    for token in [None, Some("mallory")] {
        let mut c = tg.client();
        c.token = token.map(str::to_string);
        let r = c
            .send(rpc(
                "1",
                "tasks/get",
                &json!({"taskId": task_id}).to_string(),
            ))
            .await;
        assert_eq!(r.status(), 401);
        assert!(r
            .header("www-authenticate")
            .is_some_and(|h| h.starts_with("Bearer")));
    }
    assert_eq!(up.up.count(), seen_before);

    // Alice herself is served.
    let mine = alice.get("2", &task_id).await;
    assert_eq!(mine["result"]["status"], json!("working"), "{mine}");
    assert_eq!(up.count("tasks/get"), 1);
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(&m, "taskgate_task_lookups_rejected_total", &[]),
        6.0,
        "every refused lookup counted (Bob on Alice's session never reaches the lookup: 404)"
    );
}

/// Without auth a task belongs to the session that created it: another session, or no session,
/// gets -32602 for tasks/get|result|cancel and the upstream sees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_session_gets_task_not_found_without_auth() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut a = tg.client();
    a.initialize().await;
    let mut b = tg.client();
    b.initialize().await;
    assert_ne!(a.session, b.session);
    let nobody = tg.client();
    let task_id = a.create_task("1").await;
    assert_eq!(tg.record(&task_id).unwrap().owner, "session:sess-1");

    let seen_before = up.up.count();
    for who in [&b, &nobody] {
        for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
            let v = who.task_call("7", method, &task_id).await;
            assert_eq!(err_code(&v), -32602, "{method} from {:?}: {v}", who.session);
            assert_eq!(v["id"], json!(7));
        }
    }
    assert_eq!(
        up.up.count(),
        seen_before,
        "the upstream saw: {:?}",
        up.task_requests()
    );

    let v = a.get("8", &task_id).await;
    assert_eq!(v["result"]["taskId"], json!(task_id));
    assert_eq!(
        up.received("tasks/get")[0]
            .header("mcp-session-id")
            .as_deref(),
        Some("sess-1")
    );
}

/// The same principal on a new MCP session (or without one) reaches its task, and taskgate sends
/// tasks/get|result|cancel upstream on the session the task was created on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_principal_new_session_reaches_task_on_original_session() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .start()
        .await;
    let mut first = tg.client().with_token("alice-token");
    first.initialize().await;
    let task_id = first.create_task("1").await;
    assert_eq!(
        up.received("tools/call")[0]
            .header("mcp-session-id")
            .as_deref(),
        Some("sess-1")
    );

    let mut second = tg.client().with_token("alice-token");
    second.initialize().await;
    assert_eq!(second.session.as_deref(), Some("sess-2"));
    let sessionless = tg.client().with_token("alice-token");

    let v = second.get("\"g\"", &task_id).await;
    assert_eq!(v["result"]["status"], json!("working"), "{v}");
    let v = sessionless.get("\"g2\"", &task_id).await;
    assert_eq!(v["result"]["taskId"], json!(task_id), "{v}");
    let v = second.result("\"r\"", &task_id).await;
    assert_eq!(
        v["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        json!(task_id),
        "{v}"
    );
    // tasks/result made it completed upstream; use a second task for cancel.
    let task2 = first.create_task("2").await;
    let v = second.cancel("\"c\"", &task2).await;
    assert_eq!(v["result"]["status"], json!("cancelled"), "{v}");

    let routed = up.task_requests();
    assert_eq!(routed.len(), 4, "{routed:?}");
    for r in &routed {
        assert_eq!(
            r.header("mcp-session-id").as_deref(),
            Some("sess-1"),
            "{} must go out on the task's original session",
            r.body_str()
        );
    }
}

// =============================================================================================
// An upstream that lost its tasks (break-tasks M2)
// =============================================================================================

/// alice at `max_live_tasks_per_owner = 2` on an upstream that restarts and forgets its tasks.
async fn alice_at_her_limit() -> (TaskServer, Tg, Client, String, String) {
    alice_at_her_limit_on(Behaviour::default()).await
}

/// [`alice_at_her_limit`] on an upstream that behaves as `b` says.
async fn alice_at_her_limit_on(b: Behaviour) -> (TaskServer, Tg, Client, String, String) {
    let up = TaskServer::start(b).await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .tasks("max_live_tasks_per_owner = 2")
        .start()
        .await;
    let mut alice = tg.client().with_token("alice-token");
    alice.initialize().await;
    let t1 = alice.create_task("1").await;
    let t2 = alice.create_task("2").await;
    let refused = alice.rpc(Client::create_body("3", Some(600_000))).await;
    assert_eq!(err_code(&refused), -32029, "at the limit: {refused}");
    (up, tg, alice, t1, t2)
}

/// The upstream answers `-32602` (task not found) to `tasks/get` and `tasks/result` of tasks
/// taskgate recorded live: each record becomes `failed` (statusMessage: the upstream lost it),
/// "resources released" is recorded (`reason=upstream_lost`), the client gets the failed task
/// and the error it was failed with, and the owner can create tasks again (before: the records
/// stayed `working`, and alice was refused `-32029` until their ttl).
#[tokio::test]
async fn tasks_the_upstream_forgot_are_failed_and_free_the_owners_slots() {
    let (up, tg, alice, t1, t2) = alice_at_her_limit().await;
    up.state.lock().unwrap().tasks.clear();
    let got = alice.get("4", &t1).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    assert_eq!(got["result"]["taskId"], json!(t1), "{got}");
    assert!(
        got["result"]["statusMessage"]
            .as_str()
            .is_some_and(|m| m.contains("no longer has this task")),
        "{got}"
    );
    let result = alice.result("5", &t2).await;
    assert_eq!(err_code(&result), -32603, "{result}");
    assert!(
        err_message(&result).contains("no longer has this task"),
        "{result}"
    );
    for t in [&t1, &t2] {
        let r = tg.record(t).expect("record");
        assert_eq!(r.status, TaskStatus::Failed);
        assert!(r.released_at.is_some(), "released");
        let audit = tg.registry.store().audit_for("default", t).expect("audit");
        assert!(
            audit
                .iter()
                .any(|e| e.event == "resources_released" && e.detail == "reason=upstream_lost"),
            "{audit:?}"
        );
    }
    // Answered from the records from now on: nothing more goes upstream.
    let before = up.task_requests().len();
    assert_eq!(alice.get("6", &t1).await["result"]["status"], "failed");
    assert_eq!(err_code(&alice.result("7", &t1).await), -32603);
    assert_eq!(err_code(&alice.cancel("8", &t2).await), -32602, "terminal");
    assert_eq!(up.task_requests().len(), before);
    // Both slots are free again.
    alice.create_task("9").await;
    alice.create_task("10").await;
}

/// The same upstream answering by SSE, as the TypeScript and Python SDK servers do by default
/// (errors included): its `-32602` event ends the records and frees the slots all the same
/// (review 17 #2: only a JSON answer was read, so the records stayed `working`, holding the
/// slots); the client gets the failed task and the error it was failed with in that event.
#[tokio::test]
async fn tasks_the_upstream_forgot_are_failed_when_it_answers_by_sse() {
    let (up, tg, alice, t1, t2) = alice_at_her_limit_on(Behaviour {
        errors_sse: true,
        ..Behaviour::default()
    })
    .await;
    up.state.lock().unwrap().tasks.clear();
    let got = alice.get("4", &t1).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    assert_eq!(got["result"]["taskId"], json!(t1), "{got}");
    let result = alice.result("5", &t2).await;
    assert_eq!(err_code(&result), -32603, "{result}");
    assert!(
        err_message(&result).contains("no longer has this task"),
        "{result}"
    );
    for t in [&t1, &t2] {
        let r = tg.record(t).expect("record");
        assert_eq!(r.status, TaskStatus::Failed, "{t}");
        assert!(r.released_at.is_some(), "released");
    }
    alice.create_task("6").await;
    alice.create_task("7").await;
}

/// An upstream that authenticates its clients by a header of its own (`X-Api-Key`, not
/// `Authorization`) and forgot alice's task: taskgate's confirming `tasks/get` carries the
/// client's headers as its other own requests do, so it is answered `-32602` too: the record
/// is failed and alice's slot freed (before: the confirmation carried `Authorization` and
/// `MCP-Protocol-Version` only, was refused HTTP 401, and the record stayed `working`,
/// holding the slot until its ttl).
#[tokio::test]
async fn a_task_forgotten_by_an_upstream_keyed_by_its_own_header_is_failed() {
    const KEY: &str = "k-123";
    let up = TaskServer::start(Behaviour {
        api_key: Some(KEY),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let mut alice = tg.client().with_token("alice-token");
    let keyed = |c: &Client, body: String| {
        let req = c.req(body).header("x-api-key", KEY);
        async move {
            let r = req.send().await;
            assert_eq!(r.status(), 200);
            (r.header("mcp-session-id"), r.json().await)
        }
    };
    let (session, _) = keyed(&alice, initialize_body("\"init\"")).await;
    alice.session = session;
    let (_, created) = keyed(&alice, Client::create_body("1", Some(600_000))).await;
    let t1 = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    up.state.lock().unwrap().tasks.clear();
    let get = rpc("2", "tasks/get", &json!({ "taskId": t1 }).to_string());
    let (_, got) = keyed(&alice, get).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    let confirmations = up.received("tasks/get");
    assert_eq!(confirmations.len(), 2, "the client's and taskgate's own");
    assert!(confirmations
        .iter()
        .all(|r| r.header("x-api-key").as_deref() == Some(KEY)));
    let r = tg.record(&t1).expect("record");
    assert_eq!(r.status, TaskStatus::Failed);
    assert!(r.released_at.is_some(), "released");
    // The slot is free again.
    let (_, again) = keyed(&alice, Client::create_body("3", Some(600_000))).await;
    assert!(again["result"]["task"]["taskId"].is_string(), "{again}");
}

/// An upstream that names the task a creation started (a `notifications/tasks/status` on the
/// creation's stream) and then answers the `tools/call` with a JSON-RPC error: nothing records
/// that task, nobody can learn its id, so taskgate cancels it upstream, once (as a wrong-id
/// creation is undone). A recorded task named on the same stream is shown, never cancelled.
/// Before, the orphan kept running upstream (no `tasks/cancel` at all).
#[tokio::test]
async fn the_task_of_an_error_answered_creation_is_cancelled_upstream_once() {
    let up = TaskServer::start(Behaviour {
        creation_sse: true,
        creation_head: Some(Arc::new(|task_id, v| {
            let mut steps = vec![
                ev().data(&status_notification(task_id, "working")).into(),
                ev().data(&status_notification(task_id, "working")).into(),
            ];
            if let Some(also) = v.pointer("/params/arguments/also").and_then(Value::as_str) {
                steps.push(ev().data(&status_notification(also, "working")).into());
            }
            steps
        })),
        creation_error: Some(Arc::new(|v| {
            v.pointer("/params/arguments/also")
                .is_some()
                .then(|| (-32603, "the tool failed after it started".to_string()))
        })),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let recorded = c.create_task("1").await;
    let call = rpc(
        "2",
        "tools/call",
        &json!({"name": "slow", "arguments": {"also": recorded}, "task": {"ttl": 60_000}})
            .to_string(),
    );
    let r = c.send(call).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await;
    assert!(text.contains("the tool failed after it started"), "{text}");
    let orphan = "task-2";
    assert!(
        !text.contains(orphan),
        "the orphan's id never reaches the client: {text}"
    );
    let cancelled = eventually(STEP, || async {
        (up.count("tasks/cancel") > 0).then(|| up.received("tasks/cancel"))
    })
    .await
    .expect("the orphan is cancelled upstream");
    assert_eq!(cancelled.len(), 1, "once");
    assert_eq!(cancelled[0].json()["params"]["taskId"], json!(orphan));
    assert_eq!(up.state.lock().unwrap().status(orphan), "cancelled");
    assert!(tg.record(orphan).is_none(), "not recorded");
    // The recorded task named on that stream is untouched.
    assert_eq!(up.state.lock().unwrap().status(&recorded), "working");
    assert_eq!(tg.record(&recorded).unwrap().status, TaskStatus::Working);
    assert_eq!(c.get("3", &recorded).await["result"]["status"], "working");
    assert_eq!(up.count("tasks/cancel"), 1);
}

/// Concurrent 2025-11-25 cancels of a task the upstream forgot share the cancel's flight, and
/// its confirmation too: the upstream gets one `tasks/cancel` and one confirming `tasks/get`
/// (review 17 #14: each caller sent its own `tasks/get`); every caller gets the `-32602`, the
/// record is failed and the slot freed.
#[tokio::test]
async fn concurrent_cancels_of_a_forgotten_task_share_one_confirmation() {
    let (up, tg, alice, t1, _t2) = alice_at_her_limit_on(Behaviour {
        // The answer comes late enough for every cancel to join the first one's flight.
        cancel_delay: Arc::new(|_| Duration::from_millis(300)),
        ..Behaviour::default()
    })
    .await;
    up.state.lock().unwrap().tasks.clear();
    let ids: Vec<String> = (0..6).map(|i| format!("\"c{i}\"")).collect();
    let cancels = ids.iter().map(|id| alice.cancel(id, &t1));
    for answer in futures_util::future::join_all(cancels).await {
        assert_eq!(err_code(&answer), -32602, "{answer}");
    }
    assert_eq!(up.count("tasks/cancel"), 1, "one flight");
    assert_eq!(up.count("tasks/get"), 1, "one confirmation for all six");
    let r = tg.record(&t1).expect("record");
    assert_eq!(r.status, TaskStatus::Failed);
    alice.create_task("5").await;
}

/// The upstream restarted and forgot its sessions too: a request on the task's session gets
/// HTTP 404 `-32001`. A new, valid session of the owner is not told its own session is gone:
/// the record is failed as above, and `tasks/get` / `tasks/cancel` answer from it (HTTP 200).
#[tokio::test]
async fn a_task_whose_upstream_session_was_lost_is_failed_not_a_session_error() {
    let (up, tg, _alice, t1, t2) = alice_at_her_limit().await;
    up.state.lock().unwrap().forget_everything();
    let mut again = tg.client().with_token("alice-token");
    again.initialize().await;
    // `rpc` asserts HTTP 200.
    let got = again.get("4", &t1).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    assert!(
        got["result"]["statusMessage"]
            .as_str()
            .is_some_and(|m| m.contains("no longer has the session")),
        "{got}"
    );
    let cancel = again.cancel("5", &t2).await;
    assert_eq!(
        err_code(&cancel),
        -32602,
        "the task is terminal now: {cancel}"
    );
    for t in [&t1, &t2] {
        let r = tg.record(t).expect("record");
        assert_eq!(r.status, TaskStatus::Failed);
        assert!(r.released_at.is_some(), "released");
    }
    // A 2026-07-28 request of the owner about the 2025 task (no session) is answered from the
    // record too, the failed `DetailedTask` with its error; the upstream is not asked (review
    // 17 #13: it went out on the lost session).
    let asked = up.count("tasks/get");
    let url = format!("http://{}/mcp", tg.gw);
    let (status, modern) = send(modern_req(
        &url,
        Some("alice-token"),
        7,
        "tasks/get",
        json!({ "taskId": t1 }),
    ))
    .await;
    assert_eq!(status, 200, "{modern}");
    assert_eq!(modern["result"]["status"], "failed", "{modern}");
    assert!(modern["result"]["error"]["code"].is_i64(), "{modern}");
    assert_eq!(up.count("tasks/get"), asked, "the upstream was asked again");
    again.create_task("6").await;
}

/// The same with the Python SDK's answer to a lost session (`mcp` 1.30: HTTP 404, JSON-RPC
/// `-32600` "Session not found" under the id `"server-error"`): the spec's signal is the 404
/// itself, its code is not specified. The record is failed and answered from, the client is not
/// handed a 404 for its own, valid session (before: the 404 passed, the record stayed `working`
/// and its slot taken until its ttl).
#[tokio::test]
async fn a_task_whose_upstream_session_the_python_sdk_lost_is_failed_not_a_session_error() {
    let (up, tg, _alice, t1, _t2) = alice_at_her_limit_on(Behaviour {
        python_session_not_found: true,
        ..Behaviour::default()
    })
    .await;
    up.state.lock().unwrap().forget_everything();
    let mut again = tg.client().with_token("alice-token");
    again.initialize().await;
    // `rpc` asserts HTTP 200.
    let got = again.get("4", &t1).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    let r = tg.record(&t1).expect("record");
    assert_eq!(r.status, TaskStatus::Failed);
    assert!(r.released_at.is_some(), "released");
    again.create_task("6").await;
}

/// An HTTP 404 on the task's session whose JSON-RPC error does not say the session is gone (a
/// proxy's `-32603` "no route to backend" during a deploy) is not taken for the task lost: the
/// server may still hold it (2025-11-25: a session may end with 404 while its tasks live on),
/// and the record stays as it was, its slot held (review 20 #2: any code at a 404 failed it).
#[tokio::test]
async fn a_404_that_does_not_say_session_not_found_fails_no_task() {
    let (up, tg, alice, t1, _t2) = alice_at_her_limit_on(Behaviour {
        lost_session_error: Some((-32603, "no route to backend")),
        ..Behaviour::default()
    })
    .await;
    {
        let mut st = up.state.lock().unwrap();
        let n = st.next_session;
        st.lost_sessions
            .extend((1..=n).map(|n| format!("sess-{n}")));
    }
    let r = alice
        .send(rpc("4", "tasks/get", &json!({"taskId": t1}).to_string()))
        .await;
    assert_eq!(r.status(), 404, "the upstream's answer passes");
    let r = tg.record(&t1).expect("record");
    assert_ne!(
        r.status,
        TaskStatus::Failed,
        "failed: {:?}",
        r.status_message
    );
    assert!(r.released_at.is_none(), "released");
}

/// A 2025-11-25 `tasks/cancel` of a task the upstream forgot: its `-32602` also means "already
/// terminal" there, so taskgate asks once with a `tasks/get` of its own; answered `-32602` too,
/// the record is failed and the slot freed. The client gets the upstream's `-32602` as it came.
#[tokio::test]
async fn a_cancel_of_a_task_the_upstream_forgot_fails_it_once_confirmed() {
    let (up, tg, alice, t1, _t2) = alice_at_her_limit().await;
    up.state.lock().unwrap().tasks.clear();
    let cancel = alice.cancel("4", &t1).await;
    assert_eq!(err_code(&cancel), -32602, "{cancel}");
    let r = tg.record(&t1).expect("record");
    assert_eq!(r.status, TaskStatus::Failed);
    assert!(r.released_at.is_some(), "released");
    assert_eq!(up.count("tasks/cancel"), 1);
    assert_eq!(up.count("tasks/get"), 1, "taskgate's one confirmation");
    alice.create_task("5").await;
}

/// A task recorded `cancelled` (the client's `tasks/cancel`, acknowledged) that the upstream
/// then forgets (a restart: `tasks/get` answered `-32602`, as JSON or as an SSE event) stays
/// `cancelled`: its `tasks/get` is answered from the record as it was recorded (status,
/// `statusMessage`, timestamps), not with the upstream's `-32602`, whether or not results are
/// kept (`tasks.max_stored_result_bytes = 0` here); `tasks/result` is the "cancelled, no
/// result" error and `tasks/list` shows it `cancelled`, neither asking the upstream. The record
/// is not touched (it stays `cancelled`, not failed as lost). Before: the client got the
/// upstream's `-32602` "Task not found" for a task taskgate holds as `cancelled`.
#[tokio::test]
async fn a_cancelled_task_the_upstream_forgot_stays_cancelled() {
    for errors_sse in [false, true] {
        let up = TaskServer::start(Behaviour {
            errors_sse,
            ..Behaviour::default()
        })
        .await;
        let tg = TgConfig::new(&up.url())
            .tasks("max_stored_result_bytes = 0")
            .start()
            .await;
        let mut c = tg.client();
        c.initialize().await;
        let t = c.create_task("1").await;
        let cancel = c.cancel("2", &t).await;
        assert_eq!(cancel["result"]["status"], "cancelled", "{cancel}");
        let recorded = tg.record(&t).expect("record");
        assert_eq!(recorded.status, TaskStatus::Cancelled);
        // The upstream restarts and forgets its tasks (the session is kept: a `-32602`).
        up.state.lock().unwrap().tasks.clear();
        let got = c.get("3", &t).await;
        assert_eq!(got["id"], json!(3), "{got}");
        let task = &got["result"];
        assert_eq!(task["status"], "cancelled", "sse {errors_sse}: {got}");
        assert_eq!(task["taskId"], json!(t), "{got}");
        assert_eq!(task["createdAt"], json!(recorded.created_at), "{got}");
        assert_eq!(
            task["lastUpdatedAt"],
            json!(recorded.last_updated_at),
            "{got}"
        );
        assert_eq!(
            task.get("statusMessage").and_then(Value::as_str),
            recorded.status_message.as_deref(),
            "{got}"
        );
        assert_eq!(up.count("tasks/get"), 1, "the client's, forwarded");
        let result = c.result("4", &t).await;
        assert_eq!(err_code(&result), -32603, "{result}");
        assert!(err_message(&result).contains("cancelled"), "{result}");
        let list = c.list("5", None).await;
        let listed = list["result"]["tasks"]
            .as_array()
            .and_then(|ts| ts.iter().find(|x| x["taskId"] == json!(t)).cloned())
            .unwrap_or_else(|| panic!("listed: {list}"));
        assert_eq!(listed["status"], "cancelled", "{list}");
        assert_eq!(up.count("tasks/result") + up.count("tasks/list"), 0);
        let r = tg.record(&t).expect("record");
        assert_eq!(r.status, TaskStatus::Cancelled, "not failed as lost");
        assert_eq!(r.last_updated_at, recorded.last_updated_at);
    }
}

/// The same restart losing the sessions too: the cancelled task's `tasks/get` goes out on its
/// own upstream session and is answered HTTP 404 `-32001`; the owner's new session is answered
/// the recorded `cancelled` task (HTTP 200), not a session error, and the record stays
/// `cancelled`.
#[tokio::test]
async fn a_cancelled_task_whose_upstream_session_was_lost_stays_cancelled() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .tasks("max_stored_result_bytes = 0")
        .start()
        .await;
    let mut alice = tg.client().with_token("alice-token");
    alice.initialize().await;
    let t = alice.create_task("1").await;
    let cancel = alice.cancel("2", &t).await;
    assert_eq!(cancel["result"]["status"], "cancelled", "{cancel}");
    up.state.lock().unwrap().forget_everything();
    let mut again = tg.client().with_token("alice-token");
    again.initialize().await;
    // `rpc` asserts HTTP 200.
    let got = again.get("3", &t).await;
    assert_eq!(got["result"]["status"], "cancelled", "{got}");
    assert_eq!(got["result"]["taskId"], json!(t), "{got}");
    assert_eq!(up.count("tasks/get"), 1, "the client's, forwarded");
    let r = tg.record(&t).expect("record");
    assert_eq!(r.status, TaskStatus::Cancelled, "not failed as lost");
}

/// A 2025-11-25 `tasks/cancel` answered `-32602` because the task ended upstream unobserved:
/// taskgate's confirming `tasks/get` sees it `completed`, which is recorded (the record no longer
/// stays `working`, holding the slot, until someone polls).
#[tokio::test]
async fn a_cancel_of_a_task_that_ended_unobserved_records_its_end() {
    let (up, tg, alice, t1, _t2) = alice_at_her_limit().await;
    up.set(&t1, "completed");
    let cancel = alice.cancel("4", &t1).await;
    assert_eq!(err_code(&cancel), -32602, "{cancel}");
    let r = tg.record(&t1).expect("record");
    assert_eq!(r.status, TaskStatus::Completed);
    assert_eq!(up.count("tasks/get"), 1);
    alice.create_task("5").await;
}

/// Only an authoritative "not found" ends a record: another error from the upstream (here
/// `-32603` to `tasks/cancel`), and a 2025-11-25 `-32602` to `tasks/cancel` (it also means
/// "already terminal" there) whose confirming `tasks/get` finds the task, leave it `working`.
#[tokio::test]
async fn other_upstream_errors_leave_the_record_live() {
    for (code, message) in [
        (-32603, "boom"),
        (-32602, "Cannot cancel task: it is already completed"),
    ] {
        let up = TaskServer::start(Behaviour {
            cancel_error: Some((code, message.to_string())),
            ..Behaviour::default()
        })
        .await;
        let tg = TgConfig::new(&up.url()).start().await;
        let mut c = tg.client();
        c.initialize().await;
        let t = c.create_task("1").await;
        let cancel = c.cancel("2", &t).await;
        assert_eq!(err_code(&cancel), code, "relayed: {cancel}");
        let r = tg.record(&t).expect("record");
        assert_eq!(r.status, TaskStatus::Working, "{code}");
        assert!(r.released_at.is_none());
        // A `-32602` is confirmed with one `tasks/get` (the task is there, working).
        let confirmed = usize::from(code == -32602);
        assert_eq!(up.count("tasks/get"), confirmed, "{code}");
        assert_eq!(c.get("3", &t).await["result"]["status"], "working");
    }
}

// =============================================================================================
// Status tracking
// =============================================================================================

/// Once recorded `completed`, a task stays `completed`: when the upstream later reports
/// `working` or `cancelled`, the client is shown `completed` and the rewrite is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_status_is_final_and_later_reports_are_rewritten() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let task_id = c.create_task("1").await;

    up.set(&task_id, "completed");
    let v = c.get("2", &task_id).await;
    assert_eq!(v["result"]["status"], json!("completed"));
    let rec = tg.record(&task_id).unwrap();
    assert_eq!(rec.status, TaskStatus::Completed);
    assert!(rec.terminal_at.is_some());

    up.script_get(&task_id, &["working", "cancelled"]);
    for (id, reported) in [("3", "working"), ("4", "cancelled")] {
        let v = c.get(id, &task_id).await;
        assert_eq!(v["id"], json!(id.parse::<u64>().unwrap()));
        assert_eq!(
            v["result"]["status"],
            json!("completed"),
            "upstream said {reported}; the client must see the recorded terminal status: {v}"
        );
        assert_eq!(v["result"]["taskId"], json!(task_id));
    }
    assert_eq!(up.count("tasks/get"), 3, "the gets were forwarded");
    assert_eq!(tg.record(&task_id).unwrap().status, TaskStatus::Completed);

    let m = tg.metrics_text().await;
    assert_eq!(
        metric(&m, "taskgate_task_terminal_rewrites_total", &[]),
        2.0
    );
    assert_eq!(metric(&m, "taskgate_task_late_results_total", &[]), 1.0);
    assert_eq!(
        metric(
            &m,
            "taskgate_task_status_transitions_total",
            &[("from", "working"), ("to", "completed")]
        ),
        1.0
    );
    // The upstream repeating the late `cancelled` on every poll is still one late result (one
    // audit event), while each rewritten reply is counted.
    up.script_get(&task_id, &["cancelled", "cancelled", "cancelled"]);
    for id in ["5", "6", "7"] {
        let v = c.get(id, &task_id).await;
        assert_eq!(v["result"]["status"], json!("completed"), "{v}");
    }
    let m = tg.metrics_text().await;
    assert_eq!(metric(&m, "taskgate_task_late_results_total", &[]), 1.0);
    assert_eq!(
        metric(&m, "taskgate_task_terminal_rewrites_total", &[]),
        5.0
    );
    let (_, d) = tg.admin(&format!("/admin/tasks/default/{task_id}")).await;
    let late_events = d["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == json!("late_result"))
        .count();
    assert_eq!(late_events, 1, "{d}");
    assert_eq!(
        metric(
            &m,
            "taskgate_task_status_transitions_total",
            &[("from", "completed")]
        ),
        0.0
    );
}

/// A task server whose GET stream, once the gate opens, sends a `notifications/tasks/status`
/// for each `(taskId, status)` and stays open.
async fn gated_get_stream(notes: &[(&str, &str)]) -> (TaskServer, Gate) {
    let gate = Gate::new();
    let g = gate.clone();
    let notes: Vec<String> = notes
        .iter()
        .map(|(t, status)| status_notification(t, status))
        .collect();
    let up = TaskServer::start(Behaviour {
        get_stream: Some(Arc::new(move || {
            let mut steps = vec![SseStep::Wait(g.clone())];
            steps.extend(notes.iter().map(|n| ev().data(n).into()));
            steps.push(SseStep::HoldOpen);
            steps
        })),
        ..Behaviour::default()
    })
    .await;
    (up, gate)
}

/// `c`'s session's GET stream through taskgate.
async fn open_get_stream(tg: &Tg, c: &Client) -> SseReader {
    let r = Req::mcp_get(&tg.mcp_url())
        .header("mcp-session-id", c.session.as_deref().unwrap())
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert_eq!(r.status(), 200);
    r.sse()
}

/// Break-tasks H4 on the GET stream: a `notifications/tasks/status` naming a task whose
/// creation is still in flight (the TypeScript SDK 1.x server sends a quick task's
/// `completed` there as it ends) waits until the `CreateTaskResult` was recorded, then passes
/// and is applied. On the old code it passed before the record existed, was applied to no
/// record, and the task stayed `working`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_notification_racing_its_creation_waits_for_the_record() {
    let gate = Gate::new();
    let g = gate.clone();
    let up = TaskServer::start(Behaviour {
        get_stream: Some(Arc::new(move || {
            vec![
                SseStep::Wait(g.clone()),
                ev().data(&status_notification("task-1", "completed"))
                    .into(),
                SseStep::HoldOpen,
            ]
        })),
        creation_delay: Duration::from_millis(400),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let mut get_stream = open_get_stream(&tg, &c).await;
    let creating = {
        let c = c.clone();
        tokio::spawn(async move { c.create_task("1").await })
    };
    assert!(up.up.wait_for_method("tools/call", 1, STEP).await);
    gate.open();
    let n = get_stream.next_event(STEP).await.json();
    assert_eq!(n["params"]["taskId"], json!("task-1"), "{n}");
    assert!(
        tg.record("task-1").is_some(),
        "the task was recorded before the client heard of it"
    );
    assert_eq!(creating.await.unwrap(), "task-1");
    let applied = eventually(STEP, || async {
        tg.record("task-1")
            .filter(|r| r.status == taskgate::mcp::task::TaskStatus::Completed)
    })
    .await;
    assert!(
        applied.is_some(),
        "the completion was applied to the record"
    );
}

/// Without auth a 2025-11-25 task is its session's: a `notifications/tasks/status` about
/// session A's task on session B's GET stream is not passed to B, nor applied to A's record
/// (A never got it); B's own task's passes. On the old code B got A's task first and A's record
/// turned `completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sessions_task_status_is_not_passed_on() {
    let (up, gate) = gated_get_stream(&[("task-1", "completed"), ("task-2", "completed")]).await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (mut a, mut b) = (tg.client(), tg.client());
    a.initialize().await;
    b.initialize().await;
    assert_eq!(a.create_task("1").await, "task-1");
    assert_eq!(b.create_task("1").await, "task-2");
    let mut get_stream = open_get_stream(&tg, &b).await;
    gate.open();
    let n = get_stream.next_event(STEP).await.json();
    assert_eq!(n["params"]["taskId"], json!("task-2"), "{n}");
    assert_eq!(tg.record("task-1").unwrap().status, TaskStatus::Working);
    assert_eq!(tg.record("task-2").unwrap().status, TaskStatus::Completed);
}

/// 2025-11-25: a `tasks/get` answer whose `Task` is another task than the one asked about is
/// not passed on nor applied (`-32603`, the record unchanged); one without a `taskId` is taken
/// as the one asked about. On the old code the client got the other task and its record turned
/// `completed` (break-edge F2b).
#[tokio::test]
async fn a_tasks_get_answer_about_another_task_is_not_applied() {
    let up = Upstream::start(|req: &RecordedRequest| {
        let v = req.json();
        let now = format_rfc3339_ms(now_ms());
        let task = |id: Option<&str>, status: &str| {
            let mut t = json!({"status": status, "createdAt": now, "lastUpdatedAt": now,
                "ttl": 60000, "pollInterval": 100});
            if let Some(id) = id {
                t["taskId"] = json!(id);
            }
            t
        };
        match v["method"].as_str() {
            Some("initialize") => ScriptedResponse::result_for(
                req,
                &json!({"protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {"tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}},
                    "serverInfo": {"name": "swap", "version": "1"}})
                .to_string(),
            )
            .header("mcp-session-id", "sess-1"),
            Some("tools/call") => ScriptedResponse::result_for(
                req,
                &json!({"task": task(Some("bob-task"), "working")}).to_string(),
            ),
            Some("tasks/get") if v["id"] == json!(2) => {
                ScriptedResponse::result_for(req, &task(Some("alice-task"), "completed").to_string())
            }
            Some("tasks/get") => {
                ScriptedResponse::result_for(req, &task(None, "input_required").to_string())
            }
            _ => ScriptedResponse::accepted(),
        }
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    assert_eq!(c.create_task("1").await, "bob-task");
    let v = c.get("2", "bob-task").await;
    assert_eq!(err_code(&v), -32603, "{v}");
    assert!(!v.to_string().contains("alice-task"), "{v}");
    assert_eq!(tg.record("bob-task").unwrap().status, TaskStatus::Working);
    let v = c.get("3", "bob-task").await;
    assert_eq!(v["result"]["status"], "input_required", "{v}");
    assert_eq!(
        tg.record("bob-task").unwrap().status,
        TaskStatus::InputRequired
    );
}

/// An upstream that answers a request with a task notification as its JSON body (a protocol
/// violation: a JSON body is the one response) has it neither applied nor passed on: bob's
/// `tasks/get` answered with alice's `completed` status leaves alice's record `working` and
/// bob gets the invalid-answer error. On the old code alice's record turned `completed`
/// (review 16, R2: the ownership check ran only for SSE events).
#[tokio::test]
async fn a_task_notification_as_a_json_answer_is_not_applied() {
    let up = Upstream::start(|req: &RecordedRequest| {
        let v = req.json();
        let now = format_rfc3339_ms(now_ms());
        let task = |id: &str, status: &str| {
            json!({"taskId": id, "status": status, "createdAt": now, "lastUpdatedAt": now,
                "ttl": 60000, "pollInterval": 100})
        };
        match v["method"].as_str() {
            Some("initialize") => ScriptedResponse::result_for(
                req,
                &json!({"protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {"tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}},
                    "serverInfo": {"name": "leak", "version": "1"}})
                .to_string(),
            )
            .header("mcp-session-id", "sess-1"),
            Some("tools/call") if v["id"] == json!(1) => ScriptedResponse::result_for(
                req,
                &json!({"task": task("alice-task", "working")}).to_string(),
            ),
            Some("tools/call") => ScriptedResponse::result_for(
                req,
                &json!({"task": task("bob-task", "working")}).to_string(),
            ),
            Some("tasks/get") => ScriptedResponse::json(
                &json!({"jsonrpc": "2.0", "method": "notifications/tasks/status",
                    "params": task("alice-task", "completed")})
                .to_string(),
            ),
            _ => ScriptedResponse::accepted(),
        }
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (mut alice, mut bob) = (tg.client(), tg.client());
    alice.initialize().await;
    bob.initialize().await;
    assert_eq!(alice.create_task("1").await, "alice-task");
    assert_eq!(bob.create_task("2").await, "bob-task");
    let r = bob
        .send(rpc("3", "tasks/get", r#"{"taskId":"bob-task"}"#))
        .await;
    assert_eq!(r.status(), 502);
    let v = r.json().await;
    assert_eq!(err_code(&v), -32603, "{v}");
    assert!(!v.to_string().contains("alice-task"), "{v}");
    assert_eq!(tg.record("alice-task").unwrap().status, TaskStatus::Working);
    assert_eq!(tg.record("bob-task").unwrap().status, TaskStatus::Working);
}

/// `notifications/tasks/status` on the GET stream updates the record (seen on /admin/tasks);
/// one reporting a non-terminal status after a terminal one is rewritten for the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_notification_on_get_stream_updates_record() {
    let (g1, g2, g3) = (Gate::new(), Gate::new(), Gate::new());
    let (a, b, c3) = (g1.clone(), g2.clone(), g3.clone());
    let up = TaskServer::start(Behaviour {
        get_stream: Some(Arc::new(move || {
            vec![
                SseStep::Wait(a.clone()),
                ev().data(&status_notification("task-1", "input_required"))
                    .into(),
                SseStep::Wait(b.clone()),
                ev().data(&status_notification("task-1", "completed"))
                    .into(),
                SseStep::Wait(c3.clone()),
                ev().data(&status_notification("task-1", "working")).into(),
                SseStep::HoldOpen,
            ]
        })),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    assert_eq!(c.create_task("1").await, "task-1");

    let r = Req::mcp_get(&tg.mcp_url())
        .header("mcp-session-id", c.session.as_deref().unwrap())
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let mut get_stream = r.sse();

    let owner = "/admin/tasks?owner=session:sess-1";
    g1.open();
    let n = get_stream.next_event(STEP).await.json();
    assert_eq!(n["params"]["status"], json!("input_required"));
    let (_, v) = tg.admin(&format!("{owner}&status=input_required")).await;
    assert_eq!(v["tasks"][0]["task_id"], json!("task-1"), "{v}");

    g2.open();
    let n = get_stream.next_event(STEP).await.json();
    assert_eq!(n["params"]["status"], json!("completed"));
    let (_, v) = tg.admin(&format!("{owner}&status=completed")).await;
    assert_eq!(v["tasks"][0]["task_id"], json!("task-1"), "{v}");
    let (_, v) = tg.admin(&format!("{owner}&status=working")).await;
    assert_eq!(v["tasks"], json!([]));

    g3.open();
    let n = get_stream.next_event(STEP).await.json();
    assert_eq!(
        n["params"]["status"],
        json!("completed"),
        "a status after the terminal one is shown as the recorded terminal status"
    );
    assert_eq!(tg.record("task-1").unwrap().status, TaskStatus::Completed);
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_task_status_transitions_total",
            &[("from", "working"), ("to", "input_required")]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            "taskgate_task_status_transitions_total",
            &[("from", "input_required"), ("to", "completed")]
        ),
        1.0
    );
    assert_eq!(
        metric(&m, "taskgate_task_terminal_rewrites_total", &[]),
        1.0
    );
}

// =============================================================================================
// TTL and limits
// =============================================================================================

/// Finding L2: a 2025-11-25 `tasks/result` that the upstream holds until the task ends (here:
/// never) waits at most until the task's record expires; then the client gets what any request
/// about an expired task gets, `-32602` "Task not found": as the JSON answer when the upstream
/// sent no head, as an event on the SSE stream whose head already went up. Before, it kept
/// waiting past the ttl, about a task taskgate no longer knew.
#[tokio::test]
async fn a_blocking_tasks_result_ends_with_its_tasks_ttl() {
    for sse in [true, false] {
        let never = Gate::new();
        let up = TaskServer::start(Behaviour {
            result_gate: sse.then(|| never.clone()),
            result_json_gate: (!sse).then(|| never.clone()),
            ..Behaviour::default()
        })
        .await;
        let tg = TgConfig::new(&up.url()).start().await;
        let mut c = tg.client();
        c.initialize().await;
        let created = c.rpc(Client::create_body("1", Some(1_000))).await;
        let t = created["result"]["task"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("{created}"))
            .to_string();
        let answer = tokio::time::timeout(STEP, c.result("2", &t))
            .await
            .unwrap_or_else(|_| panic!("sse {sse}: answered once the ttl passed"));
        assert_eq!(answer["id"], json!(2), "sse {sse}: {answer}");
        assert_eq!(err_code(&answer), -32602, "sse {sse}: {answer}");
        assert!(err_message(&answer).contains("not found"), "{answer}");
        assert_eq!(up.count("tasks/result"), 1);
        // The task is unknown from now on, as that answer said.
        assert_eq!(err_code(&c.get("3", &t).await), -32602);
    }
}

/// A requested ttl above `tasks.max_ttl_ms` reaches the upstream lowered to the cap (the rest of
/// the request unchanged); a ttl under the cap goes upstream as the exact bytes sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_above_cap_is_lowered_before_it_goes_upstream() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_ttl_ms = 60000")
        .start()
        .await;
    let c = tg.client();

    let sent = Client::create_body("1", Some(3_600_000));
    let v = c.rpc(sent.clone()).await;
    let task_id = v["result"]["task"]["taskId"].as_str().unwrap().to_string();
    let got = up.received("tools/call")[0].json();
    assert_eq!(got["params"]["task"]["ttl"], json!(60_000), "{got}");
    let expected = sent.replace(r#""ttl":3600000"#, r#""ttl":60000"#);
    assert_ne!(expected, sent);
    assert_eq!(
        up.received("tools/call")[0].body_str(),
        expected,
        "only the ttl's bytes change"
    );
    assert_eq!(tg.record(&task_id).unwrap().ttl_ms, Some(60_000));

    let under = Client::create_body("2", Some(5_000));
    c.rpc(under.clone()).await;
    assert_eq!(
        up.received("tools/call")[1].body_str(),
        under,
        "bytes untouched"
    );

    let at = Client::create_body("3", Some(60_000));
    c.rpc(at.clone()).await;
    assert_eq!(up.received("tools/call")[2].body_str(), at);
}

/// Issue 29 #12: a requested ttl of 0 (or anything under `MIN_TASK_TTL_MS`, 1 s) reaches the
/// upstream raised to 1,000 ms, and the task is still there to poll. On f2cd7c5 a ttl of 0 went
/// upstream as 0, the record said ttl 0, and the task was gone 100 ms later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_of_zero_is_raised_to_the_minimum() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = tg.client();
    let sent = Client::create_body("1", Some(0));
    let v = c.rpc(sent.clone()).await;
    let task_id = v["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string();
    let got = up.received("tools/call")[0].json();
    assert_eq!(got["params"]["task"]["ttl"], json!(1_000), "{got}");
    assert_eq!(
        up.received("tools/call")[0].body_str(),
        sent.replace(r#""ttl":0"#, r#""ttl":1000"#),
        "only the ttl's bytes change"
    );
    assert_ne!(tg.record(&task_id).unwrap().ttl_ms, Some(0));
    let polled = c.get("2", &task_id).await;
    assert_eq!(polled["result"]["taskId"], json!(task_id), "{polled}");
}

/// A `tools/call` whose `params.task` is not `TaskMetadata` taskgate can bound (not an object;
/// a `ttl` that is not a number of ms at least 0) is refused `-32602` naming the member, on a
/// 2025 task server as on a held session or a gateway-owned task; nothing goes upstream. A
/// `ttl` of `null` is no ttl: removed, so the upstream never gets a ttl its schema refuses
/// (tester 5 #9: it was passed on; the TypeScript SDK answered it `-32603`). Before, such a
/// call went upstream untouched: `"ttl":"99999999"` escaped `tasks.max_ttl_ms` on a server that
/// reads the string as a number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_params_task_taskgate_cannot_bound_is_refused() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = tg.client();
    assert_unboundable_tasks_refused(&c, "slow").await;
    assert!(
        up.received("tools/call").is_empty(),
        "nothing went upstream"
    );
    let v = c
        .rpc(rpc(
            "9",
            "tools/call",
            r#"{"name":"slow","arguments":{},"task":{"ttl":null}}"#,
        ))
        .await;
    assert!(v["result"]["task"]["taskId"].is_string(), "{v}");
    let sent = up.received("tools/call")[0].json();
    assert_eq!(
        sent["params"]["task"],
        json!({}),
        "no null ttl upstream: {sent}"
    );
}

/// An upstream that reports a ttl above `tasks.max_ttl_ms` (here 10^12 ms) does not escape the
/// cap: the record's ttl is the cap and it expires within the cap of its creation. The client is
/// told the cap in the `CreateTaskResult` (before: the upstream's ttl, which taskgate does not
/// keep the task for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_reported_ttl_above_cap_is_capped_in_the_record() {
    let up = TaskServer::start(Behaviour {
        ttl_override: Some(json!(1_000_000_000_000u64)),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_ttl_ms = 60000")
        .start()
        .await;
    let c = tg.client();
    let v = c.rpc(Client::create_body("1", Some(30_000))).await;
    let task_id = v["result"]["task"]["taskId"].as_str().unwrap().to_string();
    assert_eq!(
        v["result"]["task"]["ttl"],
        json!(60_000),
        "the client is told the ttl taskgate keeps the task for: {v}"
    );
    let rec = tg.record(&task_id).unwrap();
    assert_eq!(rec.ttl_ms, Some(60_000));
    let created = parse_rfc3339_ms(&rec.created_at).unwrap();
    assert!(
        rec.expires_at > created && rec.expires_at <= created + 60_000,
        "expires_at {} is not within 60 s of createdAt {created}",
        rec.expires_at
    );
    let (status, admin) = tg.admin(&format!("/admin/tasks/default/{task_id}")).await;
    assert_eq!(status, 200, "{admin}");
}

/// A `null` ttl from the upstream (2025-11-25: unlimited) means `tasks.max_ttl_ms`, as for a
/// request without one: the record ends at the cap, and the client is told that ttl in the
/// `CreateTaskResult`, `tasks/get` (the upstream saying `null` there too) and `tasks/list`
/// (before: `null` everywhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_reported_null_ttl_expires_after_the_cap() {
    let up = TaskServer::start(Behaviour {
        ttl_override: Some(Value::Null),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_ttl_ms = 60000")
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;
    let v = c.rpc(Client::create_body("1", Some(30_000))).await;
    assert_eq!(v["result"]["task"]["ttl"], json!(60_000), "{v}");
    let task_id = v["result"]["task"]["taskId"].as_str().unwrap().to_string();
    let rec = tg.record(&task_id).unwrap();
    assert_eq!(rec.ttl_ms, Some(60_000));
    let created = parse_rfc3339_ms(&rec.created_at).unwrap();
    assert_eq!(rec.expires_at, created + 60_000);
    let got = c.get("2", &task_id).await;
    assert_eq!(got["result"]["ttl"], json!(60_000), "{got}");
    let list = c.list("3", None).await;
    assert_eq!(listed_task(&list, &task_id)["ttl"], 60_000, "{list}");
}

/// An upstream whose tasks have no `ttl` member (required in both eras) is recorded with the
/// cap, and the client is told it in the `CreateTaskResult` and `tasks/get` as with `null`
/// (before: the member stayed missing though taskgate removes the record at the cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_without_a_ttl_member_is_told_the_cap() {
    let up = TaskServer::start(Behaviour {
        ttl_override: Some(json!(crate::common::task_server::NO_TTL)),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_ttl_ms = 60000")
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;
    let v = c.rpc(Client::create_body("1", Some(30_000))).await;
    assert_eq!(v["result"]["task"]["ttl"], json!(60_000), "{v}");
    let task_id = v["result"]["task"]["taskId"].as_str().unwrap().to_string();
    assert_eq!(tg.record(&task_id).unwrap().ttl_ms, Some(60_000));
    let got = c.get("2", &task_id).await;
    assert_eq!(got["result"]["ttl"], json!(60_000), "{got}");
    assert_eq!(got["result"]["status"], "working", "{got}");
}

/// An upstream that answers `ttl: 0` (it promises no retention): the record still lives for
/// taskgate's floor (`MIN_RETENTION_MS`, or the upstream's `pollInterval` when longer), so the
/// client's next `tasks/get` reaches the upstream, which still has the task; the client is told
/// the upstream's ttl as it said it (before: the record expired at its creation, and that
/// `tasks/get` was answered `-32602` "Task not found" by taskgate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_reported_zero_ttl_keeps_the_record_for_the_floor() {
    let up = TaskServer::start(Behaviour {
        ttl_override: Some(json!(0)),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let v = c.rpc(Client::create_body("1", Some(30_000))).await;
    assert_eq!(v["result"]["task"]["ttl"], json!(0), "{v}");
    let task_id = v["result"]["task"]["taskId"].as_str().unwrap().to_string();
    let got = c.get("2", &task_id).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    assert_eq!(got["result"]["ttl"], json!(0), "{got}");
    let rec = tg.record(&task_id).unwrap();
    assert_eq!(rec.ttl_ms, Some(0));
    assert_eq!(
        rec.expires_at,
        parse_rfc3339_ms(&rec.created_at).unwrap() + taskgate::registry::MIN_RETENTION_MS
    );
}

/// A task the record keeps past the upstream's `ttl: 0` (the retention floor) that the upstream
/// then forgot, as that ttl said it may: its `-32602` reaches the client as the upstream sent
/// it, and the record is not failed as one the upstream lost (it expires at the floor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_the_upstream_forgot_after_its_ttl_is_not_failed_as_lost() {
    let up = TaskServer::start(Behaviour {
        ttl_override: Some(json!(0)),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let task_id = c.create_task("1").await;
    up.state.lock().unwrap().tasks.remove(&task_id);
    let got = c.get("2", &task_id).await;
    assert_eq!(err_code(&got), -32602, "{got}");
    assert_eq!(
        up.count("tasks/get"),
        1,
        "no confirmation of taskgate's own: {got}"
    );
    let rec = tg.record(&task_id).unwrap();
    assert_eq!(rec.status, TaskStatus::Working, "not failed as lost");
}

/// A record expires at createdAt + the ttl the upstream reported, here raised to the retention
/// floor (`MIN_RETENTION_MS`; the upstream's 400 ms is still what the record and the client
/// show); the sweeper removes it, then tasks/get|result|cancel get -32602 without reaching the
/// upstream and the metric counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_task_is_swept_and_answered_not_found() {
    use taskgate::registry::MIN_RETENTION_MS;
    // The client asks for a minute, the upstream grants 400 ms.
    let up = TaskServer::start(Behaviour {
        ttl_override: Some(json!(400)),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .tasks("sweep_interval_ms = 50")
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;
    let created = Instant::now();
    let task_id = c.create_task("1").await;
    let rec = tg.record(&task_id).unwrap();
    assert_eq!(rec.ttl_ms, Some(400));
    assert_eq!(
        rec.expires_at,
        parse_rfc3339_ms(&rec.created_at).unwrap() + MIN_RETENTION_MS
    );

    let v = c.get("2", &task_id).await;
    assert_eq!(
        v["result"]["status"],
        json!("working"),
        "alive before its ttl"
    );

    let path = format!("/admin/tasks/default/{task_id}");
    let gone = eventually(Duration::from_secs(3), || async {
        let (s, _) = tg.admin(&path).await;
        (s == 404).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the sweeper did not remove the expired record"
    );
    assert!(
        created.elapsed() >= Duration::from_millis(MIN_RETENTION_MS - 50),
        "removed before its retention was over"
    );
    assert!(tg.record(&task_id).is_none());

    let forwarded = up.task_requests().len();
    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        let v = c.task_call("3", method, &task_id).await;
        assert_eq!(err_code(&v), -32602, "{method}: {v}");
    }
    assert_eq!(
        up.task_requests().len(),
        forwarded,
        "nothing forwarded after expiry"
    );
    let list = c.list("4", None).await;
    assert_eq!(list["result"]["tasks"], json!([]), "{list}");
    let m = tg.metrics_text().await;
    assert_eq!(metric(&m, "taskgate_tasks_expired_total", &[]), 1.0);
    assert_eq!(metric(&m, "taskgate_tasks", &[]), 0.0, "{m}");
}

/// `max_live_tasks_per_owner = 2`: the third creation gets JSON-RPC -32029 and never reaches the
/// upstream; another owner is not affected; a task that finishes frees a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_over_live_task_limit_is_refused_locally() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 2")
        .start()
        .await;
    let mut a = tg.client();
    a.initialize().await;
    let t1 = a.create_task("1").await;
    a.create_task("2").await;

    let v = a.rpc(Client::create_body("3", Some(60_000))).await;
    assert_eq!(err_code(&v), -32029, "{v}");
    assert_eq!(v["id"], json!(3));
    assert!(
        err_message(&v).to_lowercase().contains("limit"),
        "the message must say what happened: {v}"
    );
    assert_eq!(
        up.count("tools/call"),
        2,
        "the refused creation never went upstream"
    );

    // A plain tools/call is not a task and is not limited.
    let plain = a
        .rpc(rpc("4", "tools/call", r#"{"name":"slow","arguments":{}}"#))
        .await;
    assert!(plain.get("result").is_some(), "{plain}");

    let mut b = tg.client();
    b.initialize().await;
    b.create_task("1").await;

    // One of a's tasks finishes: a may create again.
    up.set(&t1, "completed");
    assert_eq!(
        a.get("5", &t1).await["result"]["status"],
        json!("completed")
    );
    a.create_task("6").await;
    let v = a.rpc(Client::create_body("7", Some(60_000))).await;
    assert_eq!(err_code(&v), -32029, "{v}");
    assert_eq!(up.count("tools/call"), 5);
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_task_creation_refused_total",
            &[("reason", "owner_limit")]
        ),
        2.0
    );
}

/// A burst of concurrent creations by one owner with `max_live_tasks_per_owner = 3`: exactly
/// three reach the upstream, every other one gets -32029.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_limit_holds_under_concurrent_creations() {
    let up = TaskServer::start(Behaviour {
        // A slow CreateTaskResult: the creations are in flight together.
        creation_delay: Duration::from_millis(200),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 3")
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;
    let go = Gate::new();
    let mut calls = Vec::new();
    for i in 0..20 {
        let (c, go) = (c.clone(), go.clone());
        calls.push(tokio::spawn(async move {
            go.wait().await;
            c.rpc(Client::create_body(&i.to_string(), Some(60_000)))
                .await
        }));
    }
    go.open();
    let (mut created, mut refused) = (0, 0);
    for h in calls {
        let v = h.await.unwrap();
        if v.pointer("/result/task/taskId").is_some() {
            created += 1;
        } else {
            assert_eq!(err_code(&v), -32029, "{v}");
            refused += 1;
        }
    }
    assert_eq!((created, refused), (3, 17));
    assert_eq!(
        up.count("tools/call"),
        3,
        "refused creations never go upstream"
    );
}

// =============================================================================================
// tasks/list
// =============================================================================================

/// tasks/list is answered from the registry: the caller's tasks only, newest first, across pages
/// of `list_page_size` with an opaque nextCursor; a bad or foreign cursor is -32602.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_list_pages_newest_first_only_callers_tasks() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .token("bob", "bob-token")
        .tasks("list_page_size = 2")
        .start()
        .await;
    let mut alice = tg.client().with_token("alice-token");
    alice.initialize().await;
    let mut bob = tg.client().with_token("bob-token");
    bob.initialize().await;
    let mut mine = Vec::new();
    for i in 0..5 {
        mine.push(alice.create_task(&i.to_string()).await);
        if i == 2 {
            bob.create_task("\"b\"").await;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    // Freshness: a status taskgate saw is what the list shows.
    up.set(&mine[2], "completed");
    alice.get("\"g\"", &mine[2]).await;

    let mut pages = Vec::new();
    let mut cursor = None;
    let mut first_cursor = None;
    loop {
        let v = alice
            .list(&format!("\"l{}\"", pages.len()), cursor.clone())
            .await;
        let result = v.get("result").unwrap_or_else(|| panic!("{v}"));
        let ids: Vec<String> = result["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                assert!(
                    t.get("createdAt").is_some() && t.get("status").is_some(),
                    "{t}"
                );
                if t["taskId"] == json!(mine[2]) {
                    assert_eq!(t["status"], json!("completed"));
                }
                t["taskId"].as_str().unwrap().to_string()
            })
            .collect();
        pages.push(ids);
        match result.get("nextCursor") {
            Some(c) => {
                assert!(c.is_string());
                if first_cursor.is_none() {
                    first_cursor = Some(c.clone());
                    // A task created between pages does not shift the following pages.
                    alice.create_task("\"between\"").await;
                }
                cursor = Some(c.clone());
            }
            None => break,
        }
        assert!(pages.len() < 10, "pagination does not end: {pages:?}");
    }
    let newest_first: Vec<String> = mine.iter().rev().cloned().collect();
    assert_eq!(
        pages,
        vec![
            newest_first[0..2].to_vec(),
            newest_first[2..4].to_vec(),
            newest_first[4..5].to_vec()
        ]
    );

    let v = alice.list("\"fresh\"", None).await;
    assert_eq!(
        v["result"]["tasks"][0]["taskId"],
        json!("task-7"),
        "the task created between pages is newest on a fresh listing: {v}"
    );

    let v = bob.list("1", None).await;
    let bobs: Vec<&Value> = v["result"]["tasks"].as_array().unwrap().iter().collect();
    assert_eq!(bobs.len(), 1, "bob sees only his own task: {v}");
    assert!(!mine.contains(&bobs[0]["taskId"].as_str().unwrap().to_string()));

    for bad in [
        json!("not-a-cursor!"),
        json!(""),
        json!(12),
        json!({"a": 1}),
    ] {
        let v = alice.list("\"bad\"", Some(bad.clone())).await;
        assert_eq!(err_code(&v), -32602, "cursor {bad}: {v}");
    }
    let v = bob.list("\"foreign\"", first_cursor).await;
    assert_eq!(err_code(&v), -32602, "alice's cursor used by bob: {v}");
    assert_eq!(
        up.count("tasks/list"),
        0,
        "tasks/list is answered by taskgate"
    );
}

/// break-edge F12: a 2025 `tasks/list` whose `params` is not an object (`"x"`, `[]`, a number,
/// a boolean) is refused `-32602` saying params must be an object, instead of listing the
/// caller's tasks; without `params`, or with `null`, the list starts at its first page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_list_with_params_not_an_object_is_invalid_params() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .start()
        .await;
    let mut alice = tg.client().with_token("alice-token");
    alice.initialize().await;
    let task = alice.create_task("1").await;
    for (id, params) in [(2, "\"x\""), (3, "[]"), (4, "5"), (5, "true")] {
        let v = alice.rpc(rpc(&id.to_string(), "tasks/list", params)).await;
        assert_eq!(err_code(&v), -32602, "params {params}: {v}");
        assert_eq!(v["id"], json!(id), "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("tasks/list: params must be an object"),
            "params {params}: {v}"
        );
    }
    for body in [
        r#"{"jsonrpc":"2.0","id":6,"method":"tasks/list"}"#.to_string(),
        rpc("7", "tasks/list", "null"),
    ] {
        let v = alice.rpc(body.clone()).await;
        assert_eq!(
            v["result"]["tasks"][0]["taskId"],
            json!(task),
            "{body}: {v}"
        );
    }
}

/// Without auth and without a session nobody can be told apart: `capabilities.tasks.list` is
/// removed from the initialize result and tasks/list gets -32601. With bearer auth the same
/// upstream keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_auth_and_no_session_hides_tasks_list() {
    let up = TaskServer::start(Behaviour {
        sessions: false,
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    let init = c.initialize().await;
    assert!(c.session.is_none());
    let tasks = &init["result"]["capabilities"]["tasks"];
    assert!(
        tasks.get("list").is_none(),
        "tasks.list must be removed: {init}"
    );
    assert_eq!(tasks["cancel"], json!({}), "the rest is kept: {init}");
    assert_eq!(tasks["requests"], json!({"tools":{"call":{}}}));
    let v = c.list("2", None).await;
    assert_eq!(err_code(&v), -32601, "{v}");
    assert_eq!(up.count("tasks/list"), 0);

    let tg2 = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .start()
        .await;
    let mut alice = tg2.client().with_token("alice-token");
    let init = alice.initialize().await;
    assert_eq!(
        init["result"]["capabilities"]["tasks"]["list"],
        json!({}),
        "{init}"
    );
    let v = alice.list("2", None).await;
    assert_eq!(v["result"]["tasks"], json!([]), "{v}");
}

// =============================================================================================
// Restart and lock: the real binary
// =============================================================================================

/// After SIGKILL and a restart on the same store every record is there and tasks/get,
/// tasks/result and tasks/cancel for tasks created before work (on the original upstream
/// session); the owner binding survives too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_records_and_tasks_keep_working() {
    let up = TaskServer::default().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url()).write_for_binary(dir.path());
    let store = dir.path().join("store").to_str().unwrap().to_string();

    let (mut p, gw, _) = spawn_binary(&cfg);
    let mut c = Client::new(&format!("http://{gw}/mcp"));
    c.initialize().await;
    let t1 = c.create_task("1").await;
    let t2 = c.create_task("2").await;
    let t3 = c.create_task("3").await;
    sigkill(&mut p);

    let (_p2, gw, admin) = spawn_binary(&cfg);
    c.url = format!("http://{gw}/mcp");
    let (_, list) = admin_json(admin, "/admin/tasks").await;
    let ids: HashSet<&str> = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, HashSet::from([t1.as_str(), t2.as_str(), t3.as_str()]));

    let v = c.get("4", &t1).await;
    assert_eq!(v["result"]["status"], json!("working"), "{v}");
    let v = c.result("5", &t2).await;
    assert_eq!(
        v["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        json!(t2),
        "{v}"
    );
    let v = c.cancel("6", &t3).await;
    assert_eq!(v["result"]["status"], json!("cancelled"), "{v}");
    for r in up.task_requests() {
        assert_eq!(r.header("mcp-session-id").as_deref(), Some("sess-1"));
    }
    assert_eq!(up.task_requests().len(), 3);
    let (_, d) = admin_json(admin, &format!("/admin/tasks/default/{t3}")).await;
    assert_eq!(d["task"]["status"], json!("cancelled"), "{d}");

    // Another session still cannot reach them after the restart.
    let mut other = Client::new(&c.url);
    other.initialize().await;
    let v = other.get("7", &t1).await;
    assert_eq!(err_code(&v), -32602, "{v}");
    assert_eq!(up.task_requests().len(), 3);
    let _ = store;
}

/// The live-task limit counts what the store holds after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_limit_survives_restart() {
    let up = TaskServer::default().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .tasks("max_live_tasks_per_owner = 2")
        .write_for_binary(dir.path());
    let (mut p, gw, _) = spawn_binary(&cfg);
    let c = Client::new(&format!("http://{gw}/mcp")).with_token("alice-token");
    c.create_task("1").await;
    c.create_task("2").await;
    sigkill(&mut p);

    let (_p, gw, _) = spawn_binary(&cfg);
    let c = Client::new(&format!("http://{gw}/mcp")).with_token("alice-token");
    let v = c.rpc(Client::create_body("3", Some(60_000))).await;
    assert_eq!(err_code(&v), -32029, "{v}");
    assert_eq!(up.count("tools/call"), 2);
}

/// A second taskgate on the same store path fails at start with a message naming the lock; the
/// first keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_gateway_on_same_store_fails_naming_the_lock() {
    let up = TaskServer::default().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url()).write_for_binary(dir.path());
    let (_first, gw, _) = spawn_binary(&cfg);
    let c = Client::new(&format!("http://{gw}/mcp"));
    let task_id = c.create_task("1").await;

    let second = blocking(|| run_taskgate(&["serve", "--config", &cfg], &[]));
    assert!(
        !second.status.success(),
        "the second taskgate must not start"
    );
    assert!(
        second.stderr.to_lowercase().contains("lock"),
        "stderr must name the lock: {}",
        second.stderr
    );
    assert!(!second.stdout.contains("listening"), "{}", second.stdout);

    let v = c.get("2", &task_id).await;
    assert_eq!(
        v["result"]["taskId"],
        json!(task_id),
        "the first still serves: {v}"
    );
}

/// Graceful shutdown with work in flight (issue 6): SIGTERM while a GET stream is open and a
/// `tasks/result` is blocked upstream. New connections are refused at once, the GET stream ends
/// at once, the blocked `tasks/result` is answered at the drain timeout (tester4 finding 7: it
/// got a bare connection close; now HTTP 503 with `Connection: close` and JSON-RPC `-32603`
/// "taskgate is shutting down; retry", so a client tells a shutdown from a crash), the process
/// exits 0, and a restart on the same store finds every record (including the cancel recorded
/// just before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_stream_and_task_in_flight_drains_and_keeps_records() {
    let gate = Gate::new();
    let up = TaskServer::start(Behaviour {
        // A JSON answer the upstream holds back: no head reaches the client before it.
        result_json_gate: Some(gate.clone()),
        get_stream: Some(Arc::new(|| {
            vec![ev().id("g-1").data("").into(), SseStep::HoldOpen]
        })),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url())
        .gateway("drain_timeout_ms = 1500")
        .write_for_binary(dir.path());
    let store = dir.path().join("store").to_str().unwrap().to_string();

    let (mut p, gw, _) = spawn_binary(&cfg);
    let mut c = Client::new(&format!("http://{gw}/mcp"));
    c.initialize().await;
    let t1 = c.create_task("1").await;
    let t2 = c.create_task("2").await;
    let v = c.cancel("3", &t2).await;
    assert_eq!(v["result"]["status"], json!("cancelled"), "{v}");

    // The standalone GET stream, open.
    let session = c.session.clone().expect("a session");
    let mut get = Req::mcp_get(&format!("http://{gw}/mcp"))
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await
        .sse();
    let first = get.next_event(STEP).await;
    assert_eq!(first.id().as_deref(), Some("g-1"));

    // A tasks/result that blocks upstream until the gate opens (never, here).
    let pending = {
        let c = c.clone();
        let body = rpc("4", "tasks/result", &json!({"taskId": t1}).to_string());
        tokio::spawn(async move {
            let r = c.req(body).send().await;
            let close = r.header("connection");
            (r.status(), close, r.json().await)
        })
    };
    let started = Instant::now();
    while up.count("tasks/result") == 0 {
        assert!(
            started.elapsed() < STEP,
            "tasks/result never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let sent = Instant::now();
    p.signal(libc::SIGTERM);
    // The GET stream ends promptly (GET streams are not drained).
    loop {
        match get.next(Duration::from_millis(1000)).await {
            Next::End => break,
            Next::Item(_) => continue,
            Next::Timeout => panic!("the GET stream did not end after SIGTERM"),
        }
    }
    assert!(sent.elapsed() < Duration::from_millis(1000));
    // New connections are refused while draining: the listener closes once the accept loop has
    // seen the signal, which may be a moment after the GET stream ended (wait for that event).
    let closing = Instant::now();
    while tokio::net::TcpStream::connect(gw).await.is_ok() {
        assert!(
            closing.elapsed() < Duration::from_millis(500),
            "new connections were still accepted 500 ms into the drain"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The process exits 0 once the drain timeout cut the blocked tasks/result.
    let status = blocking(|| p.wait_exit(Duration::from_secs(10))).expect("no exit after SIGTERM");
    assert_eq!(status.code(), Some(0), "stderr: {}", p.stderr());
    let took = sent.elapsed();
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(5),
        "exit after {took:?}, drain timeout 1500 ms"
    );
    let (status, close, v) = pending
        .await
        .expect("the blocked tasks/result got an answer");
    assert_eq!(status, 503, "{v}");
    assert_eq!(close.as_deref(), Some("close"));
    assert_eq!(v["error"]["code"], json!(-32603), "{v}");
    assert_eq!(
        v["error"]["message"],
        json!("taskgate is shutting down; retry"),
        "{v}"
    );

    // Everything is in the store, readable without the gateway.
    let mut ids = task_ids_in_store(&store);
    ids.sort();
    let mut want = vec![t1.clone(), t2.clone()];
    want.sort();
    assert_eq!(ids, want);
    let (_p2, _gw, admin) = spawn_binary(&cfg);
    let (_, d) = admin_json(admin, &format!("/admin/tasks/default/{t2}")).await;
    assert_eq!(d["task"]["status"], json!("cancelled"), "{d}");
    assert!(d["task"]["cancelled_at"].is_u64(), "{d}");
    gate.open();
}

/// The ttl cap changes the ttl's digits and nothing else: key order, a number beyond 64 bits and
/// `1.10` reach the upstream byte for byte as the client sent them (compared as bytes, not as
/// parsed values, which would go through the same lossy parse on both sides).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_cap_rewrites_only_the_ttl_bytes() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_ttl_ms = 60000")
        .start()
        .await;
    let c = tg.client();
    let sent = r#"{"jsonrpc":"2.0","method":"tools/call","id":"big","params":{"name":"slow","task":{"ttl":3600000},"arguments":{"z":123456789012345678901234567890,"b":1.10,"a":[1, 2]},"_meta":{"progressToken":"pt-big"}}}"#;
    let v = c.rpc(sent).await;
    assert!(v.pointer("/result/task/taskId").is_some(), "{v}");
    let expected = sent.replace(r#""ttl":3600000"#, r#""ttl":60000"#);
    assert_eq!(up.received("tools/call")[0].body_str(), expected);
}

/// A terminal-status rewrite of a `tasks/get` reply changes `status` and `statusMessage` and
/// nothing else: the upstream's key order and a big number in `_meta` reach the client as bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_status_rewrite_splices_the_reply_bytes() {
    let gets = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = gets.clone();
    let up = Upstream::start(move |req| match req.rpc_method().as_deref() {
        Some("tools/call") => ScriptedResponse::result_for(
            req,
            r#"{"task":{"taskId":"t-big","status":"working","ttl":60000}}"#,
        ),
        Some("tasks/get") => {
            let body = if counter.fetch_add(1, Ordering::SeqCst) == 0 {
                r#"{"taskId":"t-big","status":"completed","statusMessage":"done","ttl":60000}"#
            } else {
                r#"{"ttl":60000,"status":"working","taskId":"t-big","_meta":{"z":123456789012345678901234567890,"a":1.10},"statusMessage":"still going"}"#
            };
            ScriptedResponse::result_for(req, body)
        }
        _ => mcp_handler(req),
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = tg.client();
    let task_id = c.create_task("1").await;
    assert_eq!(task_id, "t-big");
    assert_eq!(
        c.get("2", &task_id).await["result"]["status"],
        json!("completed")
    );

    let text = c
        .send(rpc("3", "tasks/get", r#"{"taskId":"t-big"}"#))
        .await
        .text()
        .await;
    let expected = r#"{"jsonrpc":"2.0","id":3,"result":{"ttl":60000,"status":"completed","taskId":"t-big","_meta":{"z":123456789012345678901234567890,"a":1.10},"statusMessage":"done"}}"#;
    assert_eq!(text, expected);
}

/// Review 18a #2: 2025-11-25 `tasks/result` of a task whose tool failed with a JSON-RPC
/// `-32602` (an SDK's invalid-arguments error, the spec's "unknown tool") MUST answer "that
/// same error". taskgate's own `tasks/get` finds the task, so the client gets the tool's error
/// as it came (before: taken for "the upstream no longer has this task", the client got
/// taskgate's `-32603` "... a restart of the upstream?" and the record was failed as lost).
#[tokio::test]
async fn a_tasks_result_error_of_the_tools_own_is_passed_on() {
    let tool_error: Hook = Arc::new(|method, id, _task, _n| {
        (method == "tasks/result").then(|| {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"Invalid arguments for tool slow: city is required"}}}}"#
            );
            ScriptedResponse::sse(vec![ev().data(&body).into()])
        })
    });
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        hook: Some(tool_error),
        ..UpBehaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let created = c
        .rpc(rpc(
            "1",
            "tools/call",
            r#"{"name":"research","arguments":{},"task":{"ttl":60000}}"#,
        ))
        .await;
    let t = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    // The tool failed upstream (unobserved: no poll in between).
    up.state.lock().unwrap().tasks.get_mut(&t).unwrap().status = "failed".into();
    let v = c.result("2", &t).await;
    assert_eq!(err_code(&v), -32602, "the tool's own error: {v}");
    assert!(
        err_message(&v).contains("Invalid arguments"),
        "the tool's own error: {v}"
    );
}

/// An upstream that reports session A's task on session B's GET stream while A's creation is
/// in flight does not hand B the task's id: with no creation in flight on B's own session but
/// one on another, a notification about an unrecorded task is not passed on (it may be that
/// other session's; a task created past taskgate is reported there only once no creation is in
/// flight). On the code before (per-session wait, 6ce7e70) B got A's task at once (review 18b
/// #3); before that, after the 2 s wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_in_flight_on_another_session_is_not_shown_on_a_get_stream() {
    let (gate, later) = (Gate::new(), Gate::new());
    let (g, g2) = (gate.clone(), later.clone());
    let up = TaskServer::start(Behaviour {
        get_stream: Some(Arc::new(move || {
            vec![
                SseStep::Wait(g.clone()),
                ev().data(&status_notification("task-1", "working")).into(),
                ev().data(&status_notification("past-taskgate-2", "completed"))
                    .into(),
                SseStep::Wait(g2.clone()),
                ev().data(&status_notification("past-taskgate-3", "completed"))
                    .into(),
                SseStep::HoldOpen,
            ]
        })),
        creation_delay: Duration::from_secs(1),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (mut a, mut b) = (tg.client(), tg.client());
    a.initialize().await;
    b.initialize().await;
    let mut get_stream = open_get_stream(&tg, &b).await;
    let creating = {
        let a = a.clone();
        tokio::spawn(async move { a.create_task("1").await })
    };
    assert!(up.up.wait_for_method("tools/call", 1, STEP).await);
    gate.open();
    assert_eq!(creating.await.unwrap(), "task-1");
    later.open();
    let n = get_stream.next_event(STEP).await.json();
    assert_eq!(
        n["params"]["taskId"],
        json!("past-taskgate-3"),
        "nothing before it reached B: {n}"
    );
}

/// A JSON-RPC `-32001` that is NOT an HTTP 404 (here HTTP 200, the TypeScript SDK's
/// `ErrorCode.RequestTimeout`, or any server-defined code in -32000..-32099) is not "session not
/// found": only the 404 says the session is gone (2025-11-25 transports). The record must stay
/// `working`, as for any other error (`other_upstream_errors_leave_the_record_live`).
#[tokio::test]
async fn a_200_minus_32001_is_not_a_lost_session() {
    let up = TaskServer::start(Behaviour {
        cancel_error: Some((-32001, "Request timed out".to_string())),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let t = c.create_task("1").await;
    let cancel = c.cancel("2", &t).await;
    let r = tg.record(&t).expect("record");
    assert_eq!(
        r.status,
        TaskStatus::Working,
        "an HTTP 200 -32001 failed the live task as lost upstream: cancel answered {cancel}, record {r:?}"
    );
    assert_eq!(c.get("3", &t).await["result"]["status"], "working");
}

/// The same under 2025-11-25 `tasks/result`, which answers a failed tool's own
/// JSON-RPC error (here `-32001`, HTTP 200, the way the TypeScript SDK relays an `McpError`
/// with `ErrorCode.RequestTimeout`): the client must get that error, and the record must not be
/// failed as "the upstream no longer has the session" (nothing answered HTTP 404).
#[tokio::test]
async fn a_tools_own_minus_32001_under_tasks_result_is_not_a_lost_session() {
    let up = Upstream::start(|req| match req.rpc_method().as_deref() {
        Some("tasks/result") => {
            let id = req.rpc_id_json();
            ScriptedResponse::json(format!(
                r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32001,"message":"the tool's backend timed out"}}}}"#
            ))
        }
        _ => one_task_session(req),
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let t = c.create_task("1").await;
    let r = c.result("2", &t).await;
    let record = tg.record(&t).expect("record");
    assert_eq!(
        (r["error"]["code"].clone(), r["error"]["message"].clone()),
        (json!(-32001), json!("the tool's backend timed out")),
        "the tool's own error, relayed: {r}; record {record:?}"
    );
    assert_ne!(record.status, TaskStatus::Failed, "{record:?}");
}

/// Two `tasks/cancel`s of one live task join one flight; the upstream answers
/// it HTTP 404 "Session not found" (it lost the session): every caller is answered from the
/// record, failed as lost (review 21b #2: with the 404 kept as one reply, whichever caller read
/// the outcome first took it, both got `-32603` and the record stayed `working`).
#[tokio::test]
async fn a_joined_cancel_of_a_lost_session_gets_the_failed_task_too() {
    let gate = Gate::new();
    let up = Upstream::start({
        let gate = gate.clone();
        move |req| match req.rpc_method().as_deref() {
            Some("tasks/cancel") => {
                let id = req.rpc_id_json();
                ScriptedResponse::status(
                    404,
                    Some("application/json"),
                    format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32001,"message":"Session not found"}}}}"#),
                )
                .after_gate(&gate)
            }
            _ => one_task_session(req),
        }
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let t = c.create_task("1").await;
    let send = |id: &str| {
        let req = c.req(rpc(id, "tasks/cancel", &format!(r#"{{"taskId":"{t}"}}"#)));
        tokio::spawn(async move {
            let r = req.send().await;
            (r.status(), r.json().await)
        })
    };
    let a = send("2");
    assert!(up.wait_for_method("tasks/cancel", 1, STEP).await);
    let b = send("3");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    gate.open();
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(up.received("tasks/cancel").len(), 1, "one flight");
    let record = tg.record(&t).expect("record");
    assert_eq!(record.status, TaskStatus::Failed, "{a:?} {b:?}");
    // As for one cancel alone: the record's answer (`-32602`, the task is already failed).
    assert_ne!(a.1["error"]["code"], json!(-32603), "first: {a:?}");
    assert_ne!(b.1["error"]["code"], json!(-32603), "joined: {b:?}");
}

/// A 2025-11-25 upstream with tasks and one session (`sess-1`) whose every task-augmented
/// `tools/call` creates task `t-1`, working; other methods as `mcp_handler`.
fn one_task_session(req: &RecordedRequest) -> ScriptedResponse {
    match req.rpc_method().as_deref() {
        Some("initialize") => ScriptedResponse::result_for(
            req,
            r#"{"protocolVersion":"2025-11-25","capabilities":{"tools":{},"tasks":{"list":{},"cancel":{},"requests":{"tools":{"call":{}}}}},"serverInfo":{"name":"s","version":"1"}}"#,
        )
        .set_header("mcp-session-id", "sess-1"),
        Some("tools/call") => ScriptedResponse::result_for(
            req,
            r#"{"task":{"taskId":"t-1","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":60000}}"#,
        ),
        _ => mcp_handler(req),
    }
}

/// A 2025-11-25 upstream's `CreateTaskResult` with times that are not RFC 3339 ones
/// (`"yesterday"`, `12`): the record holds taskgate's clock instead, so the gateway's own
/// `tasks/list` (made of the records) stays schema-valid.
#[tokio::test]
async fn tasks_list_shows_no_invalid_upstream_time() {
    let up = Upstream::start(|req| match req.rpc_method().as_deref() {
        Some("tools/call") => ScriptedResponse::result_for(
            req,
            r#"{"task":{"taskId":"t-1","status":"working","createdAt":"yesterday","lastUpdatedAt":12,"ttl":60000}}"#,
        ),
        _ => one_task_session(req),
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let t = c.create_task("1").await;
    let v = c.list("2", None).await;
    let tasks = v["result"]["tasks"].as_array().cloned().unwrap_or_default();
    let task = tasks.iter().find(|x| x["taskId"] == json!(t));
    let task = task.unwrap_or_else(|| panic!("{v}"));
    for key in ["createdAt", "lastUpdatedAt"] {
        let at = task[key].as_str().unwrap_or_default();
        assert!(parse_rfc3339_ms(at).is_some(), "{key}: {task}");
    }
}
