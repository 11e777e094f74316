//! Cancellation (issue 4): single-flight `tasks/cancel`, terminal tasks answered locally, the
//! race between a cancel and a completion, `notifications/cancelled` routing, and the two audit
//! facts ("status cancelled", "resources released") with real timing, against a scripted MCP
//! task server (tests/common).

use crate::common::*;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use serde_json::{json, Value};
use taskgate::mcp::task::TaskStatus;

fn cancel_count(m: &str, outcome: &str) -> f64 {
    metric(m, "taskgate_cancel_requests_total", &[("outcome", outcome)])
}

// =============================================================================================
// Single-flight
// =============================================================================================

/// 500 concurrent identical tasks/cancel for one working task (the upstream takes 200 ms to
/// answer): the upstream receives exactly one; every caller gets an answer under its own id;
/// forwarded + deduplicated + rejected_terminal = 500 with forwarded = 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_cancels_reach_upstream_once() {
    const N: usize = 500;
    let up = TaskServer::start(Behaviour {
        cancel_delay: Arc::new(|_| Duration::from_millis(200)),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let task_id = c.create_task("\"create\"").await;

    let go = Gate::new();
    let mut callers = Vec::new();
    for i in 0..N {
        // Numbers and strings, including 0 and "0".
        let id_json = if i % 2 == 0 {
            format!("{}", i / 2)
        } else {
            format!("\"{}\"", i / 2)
        };
        let (c, go, task_id) = (c.clone(), go.clone(), task_id.clone());
        callers.push(tokio::spawn(async move {
            go.wait().await;
            let v = c.cancel(&id_json, &task_id).await;
            (id_json, v)
        }));
    }
    go.open();
    let mut cancelled = 0;
    let mut rejected = 0;
    for h in callers {
        let (id_json, v) = h.await.unwrap();
        let id: Value = serde_json::from_str(&id_json).unwrap();
        assert_eq!(
            v["id"], id,
            "the answer carries the caller's own id (type kept): {v}"
        );
        if let Some(r) = v.get("result") {
            assert_eq!(r["status"], json!("cancelled"), "{v}");
            assert_eq!(r["taskId"], json!(task_id), "{v}");
            cancelled += 1;
        } else {
            assert_eq!(err_code(&v), -32602, "{v}");
            assert!(
                err_message(&v).contains("cancelled"),
                "names the status: {v}"
            );
            rejected += 1;
        }
    }
    assert_eq!(
        up.count("tasks/cancel"),
        1,
        "the upstream must receive exactly one tasks/cancel"
    );

    let m = tg.metrics_text().await;
    let (fwd, dedup, term) = (
        cancel_count(&m, "forwarded"),
        cancel_count(&m, "deduplicated"),
        cancel_count(&m, "rejected_terminal"),
    );
    println!(
        "single-flight: callers={N} upstream_cancels={} replies_cancelled={cancelled} \
         replies_-32602={rejected} metrics forwarded={fwd} deduplicated={dedup} rejected_terminal={term}",
        up.count("tasks/cancel")
    );
    assert_eq!(fwd, 1.0);
    assert_eq!(fwd + dedup + term, N as f64);
    assert_eq!(dedup, (cancelled - 1) as f64);
    assert_eq!(term, rejected as f64);
    assert!(
        dedup > 0.0,
        "with a 200 ms upstream most callers must share the flight"
    );

    let r = tg.record(&task_id).unwrap();
    assert_eq!(r.status, TaskStatus::Cancelled);
    assert!(r.cancel_requested_at.is_some() && r.cancelled_at.is_some());
    assert_eq!(metric(&m, "taskgate_tasks_cancelled_total", &[]), 1.0);
    assert_eq!(
        metric(&m, "taskgate_cancel_to_cancelled_seconds_count", &[]),
        1.0
    );
}

// =============================================================================================
// Terminal tasks
// =============================================================================================

/// tasks/cancel for a task the registry holds as completed, failed or cancelled gets -32602 from
/// taskgate naming the status; the upstream is not called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_terminal_task_is_rejected_locally_naming_the_status() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let done = c.create_task("1").await;
    let failed = c.create_task("2").await;
    let cancelled = c.create_task("3").await;

    up.set(&done, "completed");
    assert_eq!(
        c.get("4", &done).await["result"]["status"],
        json!("completed")
    );
    up.set(&failed, "failed");
    assert_eq!(
        c.get("5", &failed).await["result"]["status"],
        json!("failed")
    );
    assert_eq!(
        c.cancel("6", &cancelled).await["result"]["status"],
        json!("cancelled")
    );
    assert_eq!(up.count("tasks/cancel"), 1);
    // The upstream would even accept these cancels now: it must not be asked.
    up.set(&done, "working");
    up.set(&failed, "working");

    for (task, status) in [
        (&done, "completed"),
        (&failed, "failed"),
        (&cancelled, "cancelled"),
    ] {
        let v = c.cancel("\"again\"", task).await;
        assert_eq!(err_code(&v), -32602, "{v}");
        assert_eq!(v["id"], json!("again"));
        assert!(
            err_message(&v).contains(status),
            "the message names the status {status}: {v}"
        );
    }
    assert_eq!(up.count("tasks/cancel"), 1, "the upstream was not called");
    assert_eq!(tg.record(&done).unwrap().status, TaskStatus::Completed);
    assert_eq!(tg.record(&failed).unwrap().status, TaskStatus::Failed);
    let m = tg.metrics_text().await;
    assert_eq!(cancel_count(&m, "rejected_terminal"), 3.0);
    assert_eq!(cancel_count(&m, "forwarded"), 1.0);
}

/// tasks/cancel for a taskId taskgate does not know gets -32602, never reaches the upstream, and
/// is counted as `taskgate_cancel_requests_total{outcome="rejected_unknown"}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_unknown_task_is_rejected_and_counted_unknown() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let v = c.cancel("1", "task-never-created").await;
    assert_eq!(err_code(&v), -32602, "{v}");
    assert_eq!(up.count("tasks/cancel"), 0);
    let m = tg.metrics_text().await;
    assert_eq!(
        cancel_count(&m, "rejected_unknown"),
        1.0,
        "a tasks/cancel refused as unknown must show in the cancel outcome metric"
    );
}

/// The upstream answers tasks/cancel with a JSON-RPC error: the caller gets it under its own id,
/// the outcome is upstream_error, the record keeps its status and a later cancel goes upstream again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_error_on_cancel_is_relayed_and_counted() {
    let up = TaskServer::start(Behaviour {
        cancel_error: Some((-32603, "worker unreachable".into())),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let task_id = c.create_task("1").await;
    for id in ["\"x\"", "2"] {
        let v = c.cancel(id, &task_id).await;
        assert_eq!(v["id"], serde_json::from_str::<Value>(id).unwrap());
        assert_eq!(err_code(&v), -32603, "{v}");
        assert_eq!(err_message(&v), "worker unreachable");
    }
    assert_eq!(up.count("tasks/cancel"), 2);
    assert_eq!(tg.record(&task_id).unwrap().status, TaskStatus::Working);
    let m = tg.metrics_text().await;
    assert_eq!(cancel_count(&m, "upstream_error"), 2.0);
    assert_eq!(cancel_count(&m, "forwarded"), 0.0);
}

/// An upstream that answers tasks/cancel in an SSE stream: the caller gets one application/json
/// message and the registry records cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_answer_streamed_by_upstream_reaches_caller_as_json() {
    let up = TaskServer::start(Behaviour {
        cancel_sse: true,
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let task_id = c.create_task("1").await;
    let r = c
        .send(rpc(
            "2",
            "tasks/cancel",
            &json!({"taskId": task_id}).to_string(),
        ))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    let v = r.json().await;
    assert_eq!(v["id"], json!(2));
    assert_eq!(v["result"]["status"], json!("cancelled"));
    assert_eq!(tg.record(&task_id).unwrap().status, TaskStatus::Cancelled);
}

// =============================================================================================
// Cancel racing completion
// =============================================================================================

#[derive(Default, Debug)]
struct RaceStats {
    cancel_won: usize,
    completion_won: usize,
    local_rejections: usize,
    by_mode: HashMap<usize, (usize, usize)>,
}

/// 200 rounds: the scripted upstream completes the task at a random moment around the cancel.
/// Mode 0: a correct upstream announces completion with notifications/tasks/status; mode 1: a
/// correct upstream that only says so in tasks/get (polled at a random moment); mode 2: a buggy
/// upstream whose worker completes (and announces it) even after it accepted the cancel. In every
/// round the registry's terminal status, the cancel reply, every status the client is shown
/// afterwards and later tasks/get agree, and a recorded `cancelled` never becomes `completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_completion_agrees_everywhere() {
    const ROUNDS: usize = 200;
    const PARALLEL: usize = 4;
    let gates: Arc<Mutex<HashMap<u64, Gate>>> = Arc::default();
    let g = gates.clone();
    let up = Arc::new(
        TaskServer::start(Behaviour {
            creation_sse: true,
            creation_tail: Some(Arc::new(move |task_id, req| {
                let round = req
                    .pointer("/params/arguments/round")
                    .and_then(Value::as_u64);
                match round.and_then(|r| g.lock().unwrap().get(&r).cloned()) {
                    Some(gate) => vec![
                        SseStep::Wait(gate),
                        ev().data(&status_notification(task_id, "completed")).into(),
                        SseStep::HoldOpen,
                    ],
                    None => vec![],
                }
            })),
            cancel_delay: Arc::new(|_| Duration::from_millis(rand::thread_rng().gen_range(0..3))),
            ..Behaviour::default()
        })
        .await,
    );
    let tg = Arc::new(
        TgConfig::new(&up.url())
            .tasks("max_live_tasks_per_owner = 100000")
            .tasks("release_quiet_ms = 50")
            .start()
            .await,
    );
    let mut c = tg.client();
    c.initialize().await;
    let stats: Arc<Mutex<RaceStats>> = Arc::default();

    for batch in 0..ROUNDS / PARALLEL {
        let mut rounds = Vec::new();
        for k in 0..PARALLEL {
            let r = (batch * PARALLEL + k) as u64;
            let (up, tg, c, gates, stats) = (
                up.clone(),
                tg.clone(),
                c.clone(),
                gates.clone(),
                stats.clone(),
            );
            rounds.push(tokio::spawn(async move {
                race_round(r, &up, &tg, &c, &gates, &stats).await
            }));
        }
        for h in rounds {
            h.await.unwrap();
        }
    }

    let m = tg.metrics_text().await;
    let stats = stats.lock().unwrap();
    println!(
        "race: rounds={ROUNDS} cancel_won={} completion_won={} rejected_locally={} \
         by_mode(cancel_won, completion_won)={:?} late_results={} terminal_rewrites={} \
         cancel outcomes forwarded={} deduplicated={} rejected_terminal={}",
        stats.cancel_won,
        stats.completion_won,
        stats.local_rejections,
        stats.by_mode,
        metric(&m, "taskgate_task_late_results_total", &[]),
        metric(&m, "taskgate_task_terminal_rewrites_total", &[]),
        cancel_count(&m, "forwarded"),
        cancel_count(&m, "deduplicated"),
        cancel_count(&m, "rejected_terminal"),
    );
    assert_eq!(stats.cancel_won + stats.completion_won, ROUNDS);
    assert!(
        stats.cancel_won > 0 && stats.completion_won > 0,
        "the race must go both ways: {stats:?}"
    );
    assert_eq!(
        metric(&m, "taskgate_tasks_cancelled_total", &[]),
        stats.cancel_won as f64
    );
    assert_eq!(
        metric(
            &m,
            "taskgate_task_status_transitions_total",
            &[("from", "cancelled")]
        ),
        0.0
    );
    assert_eq!(
        metric(
            &m,
            "taskgate_task_status_transitions_total",
            &[("from", "completed")]
        ),
        0.0
    );
}

async fn race_round(
    round: u64,
    up: &TaskServer,
    tg: &Tg,
    c: &Client,
    gates: &Mutex<HashMap<u64, Gate>>,
    stats: &Mutex<RaceStats>,
) {
    let mode = (round % 3) as usize;
    let gate = Gate::new();
    if mode != 1 {
        gates.lock().unwrap().insert(round, gate.clone());
    }
    let body = rpc(
        &format!("\"create-{round}\""),
        "tools/call",
        &json!({"name": "slow", "arguments": {"round": round}, "task": {"ttl": 600000}})
            .to_string(),
    );
    let resp = c.send(body).await;
    assert_eq!(resp.status(), 200);
    let mut sse = resp.sse();
    let created = sse.next_event(STEP).await.json();
    let task_id = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("round {round}: {created}"))
        .to_string();
    // Everything else the creation stream carries (the status notification) is collected.
    let (notif_tx, mut notif_rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let reader = tokio::spawn(async move {
        while let Next::Item(item) = sse.next(Duration::from_secs(5)).await {
            if let SseItem::Event(e) = item {
                let _ = notif_tx.send(e.json());
            }
        }
    });

    let (u_cancel, u_complete, u_poll) = {
        let mut rng = rand::thread_rng();
        (
            rng.gen_range(0..4u64),
            rng.gen_range(0..10u64),
            rng.gen_range(0..10u64),
        )
    };
    let t0 = tokio::time::Instant::now();
    let completer = {
        let (state, task_id, gate) = (up.state.clone(), task_id.clone(), gate.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(t0 + Duration::from_millis(u_complete)).await;
            let mut st = state.lock().unwrap();
            let working = st.status(&task_id) == "working";
            match mode {
                0 if working => {
                    st.set(&task_id, "completed");
                    gate.open();
                }
                1 if working => st.set(&task_id, "completed"),
                2 => {
                    st.set(&task_id, "completed");
                    gate.open();
                }
                _ => {}
            }
            mode == 2 || working
        })
    };
    let poller = (mode == 1).then(|| {
        let (c, task_id) = (c.clone(), task_id.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(t0 + Duration::from_millis(u_poll)).await;
            c.get(&format!("\"poll-{round}\""), &task_id).await
        })
    });
    tokio::time::sleep_until(t0 + Duration::from_millis(u_cancel)).await;
    let cancel = c.cancel(&format!("\"cancel-{round}\""), &task_id).await;
    let after_cancel = tg.record(&task_id).unwrap().status;
    let notified = completer.await.unwrap() && mode != 1;
    let poll = match poller {
        Some(p) => Some(p.await.unwrap()),
        None => None,
    };
    // Let an announced completion pass through taskgate before the final look.
    let mut shown = Vec::new();
    if notified {
        let n = tokio::time::timeout(STEP, notif_rx.recv())
            .await
            .unwrap_or_else(|_| panic!("round {round}: the status notification never arrived"))
            .unwrap();
        shown.push(("notification", n["params"]["status"].clone()));
    }
    let g1 = c.get(&format!("\"final1-{round}\""), &task_id).await;
    let g2 = c.get(&format!("\"final2-{round}\""), &task_id).await;
    let recorded = tg.record(&task_id).unwrap().status;
    reader.abort();
    gates.lock().unwrap().remove(&round);
    gate.open();

    let ctx = format!(
        "round {round} mode {mode} (cancel at {u_cancel} ms, completion at {u_complete} ms): \
         cancel reply {cancel}, recorded {recorded}, after cancel {after_cancel}, gets {g1} {g2}, \
         poll {poll:?}, shown {shown:?}"
    );
    assert!(recorded.is_terminal(), "{ctx}");
    let r = json!(recorded.as_str());
    match cancel.get("result") {
        Some(res) => assert_eq!(res["status"], r, "cancel reply vs registry: {ctx}"),
        None => {
            assert_eq!(err_code(&cancel), -32602, "{ctx}");
            assert!(err_message(&cancel).contains("completed"), "{ctx}");
            assert_eq!(recorded, TaskStatus::Completed, "{ctx}");
        }
    }
    assert_eq!(g1["result"]["status"], r, "later tasks/get: {ctx}");
    assert_eq!(g2["result"]["status"], r, "later tasks/get: {ctx}");
    if after_cancel.is_terminal() {
        assert_eq!(
            after_cancel, recorded,
            "a recorded terminal status changed: {ctx}"
        );
    }
    if let Some(p) = &poll {
        let s = p["result"]["status"].as_str().unwrap_or("");
        if s != "working" {
            assert_eq!(json!(s), r, "poll: {ctx}");
        }
    }
    for (what, s) in &shown {
        assert_eq!(s, &r, "{what} shown to the client: {ctx}");
    }

    let mut st = stats.lock().unwrap();
    let entry = st.by_mode.entry(mode).or_default();
    if recorded == TaskStatus::Cancelled {
        entry.0 += 1;
        st.cancel_won += 1;
    } else {
        entry.1 += 1;
        st.completion_won += 1;
    }
    if cancel.get("error").is_some()
        && err_message(&cancel).contains("already completed (a terminal")
    {
        st.local_rejections += 1;
    }
}

// =============================================================================================
// notifications/cancelled
// =============================================================================================

/// notifications/cancelled for the session's `initialize` is dropped (clients must not cancel
/// it) and counted; one for an unknown ordinary request id still goes upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_notification_for_initialize_is_dropped() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await; // id "init"

    let s = c
        .notify(
            "notifications/cancelled",
            json!({"requestId": "init", "reason": "no"}),
        )
        .await;
    assert_eq!(s, 202);
    assert_eq!(up.count("notifications/cancelled"), 0, "dropped");
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_cancelled_notifications_dropped_total",
            &[("reason", "initialize")]
        ),
        1.0
    );

    // Control: the path forwards ordinary ones.
    let s = c
        .notify(
            "notifications/cancelled",
            json!({"requestId": 99, "reason": "x"}),
        )
        .await;
    assert_eq!(s, 202);
    assert_eq!(up.count("notifications/cancelled"), 1);
}

/// notifications/cancelled naming the request that produced a CreateTaskResult is dropped and
/// counted: it is not turned into tasks/cancel, and the task keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_notification_for_task_request_is_dropped() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let task_id = c.create_task("42").await;

    for _ in 0..2 {
        let s = c
            .notify(
                "notifications/cancelled",
                json!({"requestId": 42, "reason": "stop"}),
            )
            .await;
        assert_eq!(s, 202);
    }
    assert_eq!(
        up.count("notifications/cancelled"),
        0,
        "never reaches the upstream"
    );
    assert_eq!(
        up.count("tasks/cancel"),
        0,
        "never turned into tasks/cancel"
    );
    assert_eq!(up.status(&task_id), "working");
    let r = tg.record(&task_id).unwrap();
    assert_eq!(r.status, TaskStatus::Working);
    assert!(r.cancel_requested_at.is_none());
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_cancelled_notifications_dropped_total",
            &[("reason", "task")]
        ),
        2.0
    );
}

/// Duplicate notifications/cancelled for one in-flight ordinary request reach the upstream once,
/// on the request's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_cancelled_notification_is_forwarded_once() {
    // A plain tools/call whose SSE answer stays open: the request is in flight.
    let up = Upstream::start(|req| {
        let plain_call = req.rpc_method().as_deref() == Some("tools/call");
        if plain_call {
            ScriptedResponse::sse(vec![SseStep::HoldOpen])
        } else {
            mcp_handler(req)
        }
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let call = c
        .send(rpc("7", "tools/call", r#"{"name":"slow","arguments":{}}"#))
        .await;
    assert_eq!(call.status(), 200);

    for _ in 0..3 {
        let s = c
            .notify(
                "notifications/cancelled",
                json!({"requestId": 7, "reason": "stop"}),
            )
            .await;
        assert_eq!(s, 202);
    }
    let forwarded: Vec<RecordedRequest> = up
        .requests()
        .into_iter()
        .filter(|r| r.rpc_method().as_deref() == Some("notifications/cancelled"))
        .collect();
    assert_eq!(forwarded.len(), 1, "forwarded once");
    assert_eq!(forwarded[0].json()["params"]["requestId"], json!(7));
    assert_eq!(
        forwarded[0].header("mcp-session-id").as_deref(),
        Some(UPSTREAM_SESSION)
    );
    // The same request id on another session is another request: forwarded.
    let other = c.clone().with_session("another-session");
    let s = other
        .notify("notifications/cancelled", json!({"requestId": 7}))
        .await;
    assert_eq!(s, 202);
    let n = up
        .requests()
        .into_iter()
        .filter(|r| r.rpc_method().as_deref() == Some("notifications/cancelled"))
        .count();
    assert_eq!(n, 2, "dedup is per session");
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_cancelled_notifications_dropped_total",
            &[("reason", "duplicate")]
        ),
        2.0
    );
    drop(call);
}

/// A pending tasks/result sent on a new session is routed to the task's session; a
/// notifications/cancelled for it follows it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_notification_follows_rerouted_tasks_result() {
    let gate = Gate::new();
    let up = TaskServer::start(Behaviour {
        result_gate: Some(gate.clone()),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .start()
        .await;
    let mut first = tg.client().with_token("alice-token");
    first.initialize().await;
    let task_id = first.create_task("1").await;
    let mut second = tg.client().with_token("alice-token");
    second.initialize().await;
    assert_eq!(second.session.as_deref(), Some("sess-2"));

    let pending = second
        .send(rpc(
            "\"r1\"",
            "tasks/result",
            &json!({"taskId": task_id}).to_string(),
        ))
        .await;
    assert_eq!(pending.status(), 200);
    assert_eq!(
        up.received("tasks/result")[0]
            .header("mcp-session-id")
            .as_deref(),
        Some("sess-1")
    );
    let s = second
        .notify("notifications/cancelled", json!({"requestId": "r1"}))
        .await;
    assert_eq!(s, 202);
    let n = up.received("notifications/cancelled");
    assert_eq!(n.len(), 1);
    assert_eq!(
        n[0].header("mcp-session-id").as_deref(),
        Some("sess-1"),
        "the cancel must go where the request went"
    );
    gate.open();
    drop(pending);
}

// =============================================================================================
// The two audit facts, with real timing
// =============================================================================================

/// The upstream keeps emitting notifications/progress on the task's progressToken on the still
/// open tools/call SSE stream for 1 s after the cancel. With release_quiet_ms = 300:
/// status_cancelled is recorded at the cancel, resources_released only after the last activity
/// plus the quiet window; the activity is counted and the histogram and gauge move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_facts_cancelled_first_released_after_last_activity_and_quiet_window() {
    const QUIET_MS: u64 = 300;
    let cancel_gate = Gate::new();
    let (g, g2) = (cancel_gate.clone(), cancel_gate.clone());
    let up = TaskServer::start(Behaviour {
        creation_sse: true,
        creation_tail: Some(Arc::new(move |_, req| {
            let token = req.pointer("/params/_meta/progressToken").cloned().unwrap();
            let mut steps = vec![SseStep::Wait(g.clone())];
            for i in 1..=10 {
                steps.push(SseStep::Sleep(Duration::from_millis(100)));
                steps.push(ev().data(&progress_notification(&token, i)).into());
            }
            steps
        })),
        on_cancel: Some(Arc::new(move |_| g2.open())),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .tasks(&format!("release_quiet_ms = {QUIET_MS}"))
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;

    let resp = c.send(Client::create_body("1", Some(60_000))).await;
    let mut sse = resp.sse();
    let created = sse.next_event(STEP).await.json();
    let task_id = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    let reader = tokio::spawn(async move {
        let mut progress = Vec::new();
        loop {
            match sse.next(STEP).await {
                Next::Item(SseItem::Event(e)) => {
                    if e.json()["method"] == json!("notifications/progress") {
                        progress.push(now_ms());
                    }
                }
                Next::Item(_) => {}
                Next::End => return (progress, now_ms()),
                Next::Timeout => panic!("the tools/call stream stalled"),
            }
        }
    });
    // No wait: the stream is open (its first event was read) and the worker's progress is
    // gated on the cancel itself.
    let v = c.cancel("2", &task_id).await;
    assert_eq!(v["result"]["status"], json!("cancelled"), "{v}");
    let path = format!("/admin/tasks/default/{task_id}");
    let (_, d) = tg.admin(&path).await;
    let events = |d: &Value| -> Vec<String> {
        d["audit"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(
        d["task"]["cancelled_at"].is_u64(),
        "status cancelled recorded at once: {d}"
    );
    assert!(
        d["task"]["released_at"].is_null(),
        "not released while the worker runs: {d}"
    );
    assert!(events(&d).contains(&"status_cancelled".to_string()), "{d}");
    assert!(
        !events(&d).contains(&"resources_released".to_string()),
        "{d}"
    );
    let m = tg.metrics_text().await;
    assert_eq!(metric(&m, "taskgate_tasks_cancelled_unreleased", &[]), 1.0);
    assert_eq!(metric(&m, "taskgate_tasks_cancelled_total", &[]), 1.0);

    let (progress, ended) = tokio::time::timeout(STEP, reader).await.unwrap().unwrap();
    assert_eq!(
        progress.len(),
        10,
        "progress after the cancel is still relayed"
    );
    let last = *progress.last().unwrap();
    if now_ms() < last + QUIET_MS - 100 {
        let (_, d) = tg.admin(&path).await;
        assert!(
            d["task"]["released_at"].is_null(),
            "released less than the quiet window after the last progress: {d}"
        );
    }
    // How long the test waits is not what it asserts (a loaded machine may take seconds to
    // run the watcher): the recorded `released_at` is checked against the window below.
    let d = eventually(STEP, || async {
        let (_, d) = tg.admin(&path).await;
        d["task"]["released_at"].is_u64().then_some(d)
    })
    .await
    .expect("resources released after the last activity");
    let task = &d["task"];
    let cancelled_at = task["cancelled_at"].as_u64().unwrap();
    let released_at = task["released_at"].as_u64().unwrap();
    println!(
        "audit: cancelled_at={cancelled_at} first_progress_after={} last_progress={last} \
         stream_end={ended} released_at={released_at} (released - last progress = {} ms, \
         released - cancelled = {} ms)",
        progress[0],
        released_at as i64 - last as i64,
        released_at - cancelled_at
    );
    // The client sees a progress event a moment after taskgate noted it: 20 ms of slack.
    assert!(
        released_at + 20 >= last + QUIET_MS,
        "released {} ms after the last progress; the quiet window is {QUIET_MS} ms",
        released_at as i64 - last as i64
    );
    assert!(
        released_at <= ended + QUIET_MS + 500,
        "released long after the window: {released_at} vs end {ended}"
    );
    assert!(
        cancelled_at <= progress[0],
        "cancelled is recorded before the late progress"
    );
    assert!(released_at - cancelled_at >= 900 + QUIET_MS);

    let audit = d["audit"].as_array().unwrap();
    let order = events(&d);
    let pos = |name: &str| {
        order
            .iter()
            .position(|e| e == name)
            .unwrap_or_else(|| panic!("audit event {name} missing: {order:?}"))
    };
    assert!(pos("cancel_requested") < pos("status_cancelled"));
    assert!(pos("status_cancelled") < pos("resources_released"));
    assert_eq!(order.iter().filter(|e| *e == "status_cancelled").count(), 1);
    assert_eq!(
        order.iter().filter(|e| *e == "resources_released").count(),
        1
    );
    let time_of = |name: &str| audit[pos(name)]["time"].as_u64().unwrap();
    assert!(time_of("resources_released") >= released_at);
    assert!(time_of("status_cancelled") >= cancelled_at);
    for e in audit {
        assert_eq!(e["taskId"], json!(task_id));
        assert_eq!(e["owner"], json!("session:sess-1"));
        assert_eq!(e["upstream"], json!("default"));
    }

    let m = tg.metrics_text().await;
    let activity = metric(&m, "taskgate_task_activity_after_cancel_total", &[]);
    assert!(
        activity >= 10.0,
        "each late progress is activity after cancel: {activity}"
    );
    assert_eq!(
        metric(&m, "taskgate_cancelled_to_released_seconds_count", &[]),
        1.0
    );
    let seconds = metric(&m, "taskgate_cancelled_to_released_seconds_sum", &[]);
    assert!(
        (seconds - (released_at - cancelled_at) as f64 / 1000.0).abs() < 0.01,
        "histogram sum {seconds}"
    );
    assert_eq!(metric(&m, "taskgate_tasks_cancelled_unreleased", &[]), 0.0);
    assert_eq!(
        metric(
            &m,
            "taskgate_task_resources_released_total",
            &[("reason", "quiet")]
        ),
        1.0
    );
    let r = tg.record(&task_id).unwrap();
    assert_eq!(r.status, TaskStatus::Cancelled);
    assert_eq!(r.released_at, Some(released_at));
}

/// An upstream without sessions, two bearer principals using the same request ids: B's
/// notifications/cancelled is not a "duplicate" of A's, and B's cancel of its own plain request
/// is not dropped because A's request with that id created a task. Without auth (nothing tells
/// the clients apart) none is dropped as a duplicate either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_notifications_are_told_apart_by_caller_on_a_sessionless_upstream() {
    let up = Upstream::start(|req| {
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        match (req.rpc_method().as_deref(), v.pointer("/params/task").is_some()) {
            (Some("initialize"), _) => ScriptedResponse::result_for(
                req,
                &format!(
                    r#"{{"protocolVersion":"{PROTOCOL_VERSION}","capabilities":{{"tools":{{}},"tasks":{{"requests":{{"tools":{{"call":{{}}}}}}}}}},"serverInfo":{{"name":"no-sessions","version":"1"}}}}"#
                ),
            ),
            (Some("tools/call"), true) => ScriptedResponse::result_for(
                req,
                r#"{"task":{"taskId":"t-a","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":60000}}"#,
            ),
            (Some("tools/call"), false) => ScriptedResponse::sse(vec![SseStep::HoldOpen]),
            _ => mcp_handler(req),
        }
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .token("bob", "tok-b")
        .start()
        .await;
    let cancelled = || {
        up.requests()
            .into_iter()
            .filter(|r| r.rpc_method().as_deref() == Some("notifications/cancelled"))
            .count()
    };
    let mut a = tg.client().with_token("tok-a");
    let mut b = tg.client().with_token("tok-b");
    a.initialize().await;
    b.initialize().await;
    assert!(a.session.is_none() && b.session.is_none(), "no sessions");

    // Both have a plain request 7 in flight; A cancels, then B cancels its own.
    let call_a = a
        .send(rpc("7", "tools/call", r#"{"name":"slow","arguments":{}}"#))
        .await;
    let call_b = b
        .send(rpc("7", "tools/call", r#"{"name":"slow","arguments":{}}"#))
        .await;
    let params = json!({"requestId": 7, "reason": "stop"});
    assert_eq!(
        a.notify("notifications/cancelled", params.clone()).await,
        202
    );
    assert_eq!(
        b.notify("notifications/cancelled", params.clone()).await,
        202
    );
    assert_eq!(cancelled(), 2, "B's cancel is not a duplicate of A's");
    // A repeats itself: that one is a duplicate.
    assert_eq!(a.notify("notifications/cancelled", params).await, 202);
    assert_eq!(cancelled(), 2, "A's second cancel is a duplicate");

    // A's request 8 created a task; B's request 8 is a plain call B may cancel.
    let created = a
        .rpc(rpc(
            "8",
            "tools/call",
            r#"{"name":"slow","arguments":{},"task":{"ttl":60000}}"#,
        ))
        .await;
    assert_eq!(
        created["result"]["task"]["taskId"],
        json!("t-a"),
        "{created}"
    );
    let call_b8 = b
        .send(rpc("8", "tools/call", r#"{"name":"slow","arguments":{}}"#))
        .await;
    let params = json!({"requestId": 8});
    assert_eq!(
        a.notify("notifications/cancelled", params.clone()).await,
        202
    );
    assert_eq!(cancelled(), 2, "A's cancel of its task request is dropped");
    assert_eq!(b.notify("notifications/cancelled", params).await, 202);
    assert_eq!(
        cancelled(),
        3,
        "B's cancel of its own request 8 reaches the upstream"
    );
    drop((call_a, call_b, call_b8));
}

/// A 2025-11-25 task cancelled while its `tasks/result` waits: the upstream acknowledges the
/// cancel, then sends the success payload anyway (a server that finishes the work after the
/// ack). The waiting client gets `-32603` "task … was cancelled; it has no result", as the
/// bridge and gateway-owned tasks answer it, nothing is kept as the task's result, and a later
/// `tasks/result` is answered so by taskgate without asking the upstream. On the old code the
/// client got "completed" content for a task `tasks/get` shows `cancelled`, and taskgate kept it
/// and served it from the record (break-tasks H1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_tasks_late_payload_is_not_its_result() {
    let gate = Gate::new();
    let up = TaskServer::start(Behaviour {
        result_gate: Some(gate.clone()),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let t = c.create_task("1").await;
    let waiting = {
        let (c, t) = (c.clone(), t.clone());
        tokio::spawn(async move { c.result("2", &t).await })
    };
    assert!(up.up.wait_for_method("tasks/result", 1, STEP).await);
    // (The scripted server completes a working task when its `tasks/result` arrives: the task
    // is still working until the payload is sent.)
    up.set(&t, "working");
    let v = c.cancel("3", &t).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    gate.open();
    let v = waiting.await.unwrap();
    assert_eq!(err_code(&v), -32603, "{v}");
    assert!(
        err_message(&v).contains("was cancelled; it has no result"),
        "{v}"
    );
    assert_eq!(v["id"], json!(2), "{v}");
    let r = tg.record(&t).unwrap();
    assert_eq!(r.status, TaskStatus::Cancelled);
    assert!(r.terminal_result.is_none(), "{:?}", r.terminal_result);
    let v = c.result("4", &t).await;
    assert_eq!(err_code(&v), -32603, "{v}");
    assert_eq!(up.count("tasks/result"), 1, "answered by taskgate");
}

/// A client that goes away while its task-augmented `tools/call` waits for the upstream's
/// answer (JSON here; SSE below): the upstream made the task, and only that answer names it.
/// taskgate reads it all the same, does not record the task (nobody will learn its taskId),
/// cancels it upstream once, and gives the owner's slot back. On the old code the exchange was
/// dropped with the client: the task ran on upstream, never recorded nor cancelled, and the
/// owner could start any number of them past `max_live_tasks_per_owner` (break-tasks H3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_whose_client_went_away_is_cancelled_upstream() {
    let up = TaskServer::start(Behaviour {
        creation_delay: Duration::from_millis(300),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;
    let req = c.req(Client::create_body("1", Some(60_000)));
    let gone = tokio::time::timeout(Duration::from_millis(100), req.send()).await;
    assert!(gone.is_err(), "the client was to go away before the answer");
    let cancelled = up.up.first_cancelled_task(STEP).await;
    assert_eq!(
        cancelled.as_deref(),
        Some("task-1"),
        "the task whose client went away is cancelled upstream"
    );
    assert!(tg.record("task-1").is_none(), "not recorded");
    // The owner's slot was given back: a second creation is admitted.
    assert_eq!(c.create_task("2").await, "task-2");
    assert_eq!(up.count("tasks/cancel"), 1);
}

/// The same for a creation answered as SSE: the client reads the stream's head and goes away
/// before the event carrying the `CreateTaskResult`; taskgate reads on until it comes and
/// cancels that task upstream, not recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_creation_whose_client_went_away_is_cancelled_upstream() {
    let gate = Gate::new();
    let g = gate.clone();
    let up = TaskServer::start(Behaviour {
        creation_sse: true,
        creation_head: Some(Arc::new(move |_: &str, _: &Value| {
            vec![SseStep::Wait(g.clone())]
        })),
        ..Behaviour::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let r = c.send(Client::create_body("1", Some(60_000))).await;
    assert_eq!(r.status(), 200);
    drop(r);
    // The answer comes once taskgate saw the client go (its stream no longer relayed).
    let relayed = || async {
        let m = tg.metrics_text().await;
        let open = metric(
            &m,
            "taskgate_sse_streams_open",
            &[("upstream", "default"), ("kind", "post")],
        );
        (open == 0.0).then_some(())
    };
    eventually(STEP, relayed)
        .await
        .expect("taskgate saw the client go");
    gate.open();
    let cancelled = up.up.first_cancelled_task(STEP).await;
    assert_eq!(
        cancelled.as_deref(),
        Some("task-1"),
        "the task whose client went away is cancelled upstream"
    );
    assert!(tg.record("task-1").is_none(), "not recorded");
}
