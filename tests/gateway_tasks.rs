//! Gateway-owned tasks (`upstream.tasks = "gateway"`, issue 32): taskgate runs the tasks of a
//! scripted MCP server without task support. Negotiation in both eras, creation (durable,
//! origin `gateway`, answered at once while the server still works), progress as the task's
//! `statusMessage`, the end (result, `isError`, JSON-RPC error), cancel (recorded at once, one
//! `notifications/cancelled` naming taskgate's id, also for 100 concurrent cancels, "resources
//! released" only once the server's handler has ended, a late answer never overturning
//! `cancelled`), owner binding and `tasks/list`, and `kill -9` then restart → `failed`.

use crate::common::*;

use serde_json::{json, Value};
use std::time::Duration;
use taskgate::mcp::task::TaskStatus;

/// A server without tasks: `initialize` and `server/discover` declare only tools; `tools/list`
/// lists `slow`, `boom`, `oops`; a `tools/call` answers on an SSE stream: one progress
/// notification on the call's token ("halfway"), then, once `gate` opens, its answer (`slow`:
/// a result, `oops`: an `isError` result, `heed`: the error the Python SDK answers a cancelled
/// call with, `boom`: a JSON-RPC error with `data`, at once, without
/// waiting for `gate`; `ask` sends an
/// `elicitation/create` request instead of the progress). Everything else is
/// [`mcp_handler`]'s.
fn no_tasks_server(gate: Gate) -> impl Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync {
    let sessions = std::sync::atomic::AtomicUsize::new(0);
    move |req| {
        if req.method == "GET" {
            // The session's GET stream: open, nothing of the server's own on it.
            return ScriptedResponse::sse(vec![SseStep::HoldOpen]);
        }
        let v = req.json();
        let id = req.rpc_id_json();
        match v["method"].as_str() {
            // One session per client, so principals are told apart by their sessions too.
            Some("initialize") => {
                let n = sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                mcp_handler(req).set_header("mcp-session-id", &format!("up-session-{n}"))
            }
            Some("server/discover") => ScriptedResponse::result_for(
                req,
                r#"{"resultType":"complete","supportedVersions":["2025-11-25","2026-07-28"],"capabilities":{"tools":{}}}"#,
            ),
            Some("tools/list") => ScriptedResponse::result_for(
                req,
                r#"{"tools":[{"name":"slow","inputSchema":{"type":"object"}},{"name":"boom","inputSchema":{"type":"object"}},{"name":"oops","inputSchema":{"type":"object"}}]}"#,
            ),
            // A 2026-07-28 server asking within the call (MRTR): `input_required` until the
            // call comes again with the answer and the requestState echoed.
            // MRTR asking for a sampled message: `input_required` until the call comes again
            // with an answer, which it completes with (whatever it is).
            Some("tools/call") if v["params"]["name"] == "mrtr-sample" => {
                let answer = &v["params"]["inputResponses"]["sample"];
                if answer.is_null() {
                    return ScriptedResponse::result_for(
                        req,
                        r#"{"resultType":"input_required","inputRequests":{"sample":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"hi"}}],"maxTokens":5}}},"requestState":"st-s"}"#,
                    );
                }
                let text = format!("sampled: {answer}");
                ScriptedResponse::result_for(
                    req,
                    &json!({"resultType": "complete", "content": [{"type": "text", "text": text}]})
                        .to_string(),
                )
            }
            Some("tools/call") if v["params"]["name"] == "mrtr" => {
                let answer = &v["params"]["inputResponses"]["confirm"];
                if answer.is_null() || v["params"]["requestState"] != "st-1" {
                    return ScriptedResponse::result_for(
                        req,
                        r#"{"resultType":"input_required","inputRequests":{"confirm":{"method":"elicitation/create","params":{"message":"sure?","requestedSchema":{"type":"object","properties":{}}}}},"requestState":"st-1"}"#,
                    );
                }
                let text = format!("confirmed: {}", answer["action"].as_str().unwrap_or("?"));
                ScriptedResponse::result_for(
                    req,
                    &json!({"resultType": "complete", "content": [{"type": "text", "text": text}]})
                        .to_string(),
                )
            }
            Some("tools/call") => {
                let token = v["params"]["_meta"]["progressToken"].to_string();
                let progress = format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{token},"progress":1,"total":2,"message":"halfway"}}}}"#
                );
                let answer = match v["params"]["name"].as_str() {
                    Some("boom") => format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32000,"message":"it broke","data":{{"why":"scripted"}}}}}}"#
                    ),
                    Some("oops") => rpc_result(
                        &id,
                        r#"{"content":[{"type":"text","text":"bad input"}],"isError":true}"#,
                    ),
                    // How the Python SDK (`mcp` 1.x) heeds `notifications/cancelled`: it
                    // stops the handler and answers the call with an error.
                    Some("heed") => format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":0,"message":"Request cancelled"}}}}"#
                    ),
                    // A valid result nested past serde_json's 128 levels.
                    Some("deep") => rpc_result(&id, &deep_result()),
                    _ => rpc_result(&id, r#"{"content":[{"type":"text","text":"done"}]}"#),
                };
                let ask = r#"{"jsonrpc":"2.0","id":"elicit-1","method":"elicitation/create","params":{"message":"ok?","requestedSchema":{"type":"object","properties":{}}}}"#;
                let first = match v["params"]["name"].as_str() {
                    Some("ask") => ask.to_string(),
                    _ => progress,
                };
                if v["params"]["name"] == "boom" {
                    // Fails at once, gate or not.
                    return ScriptedResponse::sse(vec![
                        ev().event("message").data(&first).into(),
                        ev().event("message").data(&answer).into(),
                    ]);
                }
                ScriptedResponse::sse(vec![
                    ev().event("message").data(&first).into(),
                    SseStep::Wait(gate.clone()),
                    ev().event("message").data(&answer).into(),
                ])
            }
            _ => mcp_handler(req),
        }
    }
}

/// The `deep` tool's `CallToolResult`: `structuredContent` nested 200 levels (arrays), past
/// serde_json's 128-level limit, written with spaces a re-serialisation would drop.
fn deep_result() -> String {
    format!(
        r#"{{"content":[{{"type":"text","text":"deep"}}], "structuredContent":{{"v":{}1{}}}}}"#,
        "[ ".repeat(200),
        " ]".repeat(200)
    )
}

/// taskgate with `tasks = "gateway"` in front of [`no_tasks_server`] (a short quiet window).
async fn setup(tokens: bool) -> (Upstream, Gate, Tg) {
    let gate = Gate::new();
    let up = Upstream::start(no_tasks_server(gate.clone())).await;
    let mut cfg = UgConfig::new(&up.url())
        .upgrade(&["enabled = false"])
        .upstream_line("tasks = \"gateway\"")
        .tasks("release_quiet_ms = 100");
    if tokens {
        cfg.tg = cfg
            .tg
            .token("alice", "alice-token")
            .token("bob", "bob-token");
    }
    let tg = cfg.start().await;
    (up, gate, tg)
}

/// A task-augmented `tools/call` of `tool`; returns the whole answer.
async fn create_call(c: &Client, id: &str, tool: &str) -> Value {
    c.rpc(rpc(
        id,
        "tools/call",
        &json!({"name": tool, "arguments": {}, "task": {"ttl": 60000}}).to_string(),
    ))
    .await
}

fn task_id_of(v: &Value) -> String {
    v.pointer("/result/task/taskId")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("not a CreateTaskResult: {v}"))
        .to_string()
}

/// 2025-11-25: `initialize` declares tasks, `tools/list` marks every tool `optional`.
#[tokio::test]
async fn a_2025_client_is_told_tasks_exist() {
    let (_up, _gate, tg) = setup(false).await;
    let mut c = tg.client();
    let init = c.initialize().await;
    assert_eq!(
        init["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"],
        json!({}),
        "{init}"
    );
    assert!(init["result"]["capabilities"]["tasks"]["cancel"].is_object());
    let tools = c.rpc(rpc("2", "tools/list", "{}")).await;
    for t in tools["result"]["tools"].as_array().unwrap() {
        assert_eq!(t["execution"]["taskSupport"], "optional", "{tools}");
    }
}

/// The whole 2025 lifecycle: the `CreateTaskResult` comes while the server still works (the
/// record durable, origin `gateway`); the server got a plain call under taskgate's id; progress
/// is the `statusMessage`; `tasks/result` blocks until the call ends, then the result.
#[tokio::test]
async fn a_2025_task_runs_while_taskgate_holds_the_plain_call() {
    let (up, gate, tg) = setup(false).await;
    let mut c = tg.client();
    c.initialize().await;
    let created = create_call(&c, "5", "slow").await;
    let t = task_id_of(&created);
    assert_eq!(created["result"]["task"]["status"], "working");
    assert_eq!(created["result"]["task"]["ttl"], 60000);
    let rec = tg.record(&t).expect("recorded before the answer");
    assert_eq!(rec.origin.as_str(), "gateway");
    assert!(up.wait_for_method("tools/call", 1, STEP).await);
    let call = up.received("tools/call").pop().unwrap().json();
    assert!(call["params"].get("task").is_none(), "a plain call: {call}");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|i| i.starts_with("taskgate-")),
        "taskgate's own id: {call}"
    );
    let progressed = eventually(STEP, || async {
        let v = c.get("6", &t).await;
        (v["result"]["statusMessage"] == "halfway").then_some(v)
    })
    .await;
    let v = progressed.expect("progress became the statusMessage");
    assert_eq!(v["result"]["status"], "working");
    // tasks/result blocks until the held call ends.
    let waiting = {
        let c = c.clone();
        let t = t.clone();
        tokio::spawn(async move { c.result("7", &t).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "tasks/result waits for the call");
    gate.open();
    let result = tokio::time::timeout(STEP, waiting).await.unwrap().unwrap();
    assert_eq!(result["result"]["content"][0]["text"], "done", "{result}");
    assert_eq!(
        result["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        json!(t)
    );
    let v = c.get("8", &t).await;
    assert_eq!(v["result"]["status"], "completed", "{v}");
    // Served again from the record.
    let again = c.result("9", &t).await;
    assert_eq!(again["result"]["content"][0]["text"], "done", "{again}");
}

/// `isError: true` is `completed` with that result; a JSON-RPC error is `failed`, and
/// `tasks/result` answers that error.
#[tokio::test]
async fn tool_errors_complete_and_rpc_errors_fail() {
    let (_up, gate, tg) = setup(false).await;
    gate.open();
    let mut c = tg.client();
    c.initialize().await;
    let oops = task_id_of(&create_call(&c, "1", "oops").await);
    let boom = task_id_of(&create_call(&c, "2", "boom").await);
    let r = c.result("3", &oops).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert_eq!(c.get("4", &oops).await["result"]["status"], "completed");
    let r = c.result("5", &boom).await;
    assert_eq!(r["error"]["code"], -32000, "{r}");
    assert_eq!(r["error"]["message"], "it broke");
    let g = c.get("6", &boom).await;
    assert_eq!(g["result"]["status"], "failed", "{g}");
    assert_eq!(g["result"]["statusMessage"], "it broke");
}

/// `tasks/cancel`: `cancelled` is recorded before the answer; the server gets exactly one
/// `notifications/cancelled` (for 100 concurrent identical cancels) naming the id it got the
/// call under; "resources released" waits until the server's handler has ended; the answer
/// that comes after never overturns `cancelled`.
#[tokio::test]
async fn cancel_is_recorded_at_once_and_released_when_the_call_ends() {
    let (up, gate, tg) = setup(false).await;
    let mut c = tg.client();
    c.initialize().await;
    let t = task_id_of(&create_call(&c, "1", "slow").await);
    assert!(up.wait_for_method("tools/call", 1, STEP).await);
    let cancels: Vec<_> = (0..100)
        .map(|i| {
            let (c, t) = (c.clone(), t.clone());
            tokio::spawn(async move { c.cancel(&format!("\"c{i}\""), &t).await })
        })
        .collect();
    let mut cancelled = 0;
    for h in cancels {
        let v = h.await.unwrap();
        if v["result"]["status"] == "cancelled" {
            cancelled += 1;
        } else {
            assert_eq!(
                err_code(&v),
                -32602,
                "a later cancel of a terminal task: {v}"
            );
        }
    }
    assert!(cancelled >= 1);
    let rec = tg.record(&t).unwrap();
    assert_eq!(rec.status, TaskStatus::Cancelled);
    assert!(rec.cancelled_at.is_some() && rec.cancel_requested_at.is_some());
    assert!(up.wait_for_method("notifications/cancelled", 1, STEP).await);
    let call_id = up.received("tools/call").pop().unwrap().json()["id"].clone();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let notes = up.received("notifications/cancelled");
    assert_eq!(notes.len(), 1, "one notification for 100 cancels");
    assert_eq!(notes[0].json()["params"]["requestId"], call_id);
    // The handler still runs (gate closed): nothing is released, well past the quiet window.
    assert!(
        tg.record(&t).unwrap().released_at.is_none(),
        "released while the call runs"
    );
    gate.open();
    let released = eventually(STEP, || async { tg.record(&t).and_then(|r| r.released_at) }).await;
    assert!(released.is_some(), "released once the call ended");
    let rec = tg.record(&t).unwrap();
    assert_eq!(
        rec.status,
        TaskStatus::Cancelled,
        "the late answer changes nothing"
    );
    assert!(released.unwrap() >= rec.cancelled_at.unwrap());
    let g = c.get("9", &t).await;
    assert_eq!(g["result"]["status"], "cancelled", "{g}");
    let (_, names) = audit_events(&tg, &t).await;
    for fact in ["cancel_requested", "status_cancelled", "resources_released"] {
        assert!(names.iter().any(|n| n == fact), "{fact}: {names:?}");
    }
    let m = tg.metrics_text().await;
    assert!(
        metric(
            &m,
            "taskgate_local_answers_total",
            &[("reason", "gateway_task")]
        ) >= 1.0,
        "counted as taskgate's answers"
    );
}

/// A gateway task a principal created from a 2026-07-28 client and cancels from a 2025-11-25
/// session: the `gateway_tasks` layer answers the cancel (no `bridge` sends it), and the
/// "cancel requested" fact is recorded as for any cancel, apart from "status cancelled" and
/// "resources released". Before: the `cancel` layer left it to the bridge (a 2025 cancel of a
/// 2026-era record), which never saw it: no `cancel_requested_at`, no `cancel_requested` event.
#[tokio::test]
async fn a_2025_cancel_of_a_2026_gateway_task_records_cancel_requested() {
    let (_up, gate, tg) = setup(true).await;
    let url = tg.mcp_url();
    let t = create(&url, Some("alice-token"), "slow").await;
    let mut alice = tg.client().with_token("alice-token");
    alice.initialize().await;
    let v = alice.cancel("\"c1\"", &t).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    let rec = tg.record(&t).unwrap();
    assert_eq!(rec.status, TaskStatus::Cancelled);
    assert!(
        rec.cancel_requested_at.is_some(),
        "cancel requested: {rec:?}"
    );
    gate.open();
    let released = eventually(STEP, || async { tg.record(&t).and_then(|r| r.released_at) }).await;
    assert!(released.is_some(), "released once the call ended");
    let (_, names) = audit_events(&tg, &t).await;
    for fact in ["cancel_requested", "status_cancelled", "resources_released"] {
        assert!(names.iter().any(|n| n == fact), "{fact}: {names:?}");
    }
}

/// Another principal gets `-32602` for everything about the task; the owner's `tasks/list`
/// lists it.
#[tokio::test]
async fn another_principal_gets_not_found_and_the_owner_lists_it() {
    let (_up, gate, tg) = setup(true).await;
    let mut alice = tg.client().with_token("alice-token");
    alice.initialize().await;
    let mut bob = tg.client().with_token("bob-token");
    bob.initialize().await;
    let t = task_id_of(&create_call(&alice, "1", "slow").await);
    for (i, method) in ["tasks/get", "tasks/result", "tasks/cancel"]
        .iter()
        .enumerate()
    {
        let v = bob.task_call(&format!("{i}"), method, &t).await;
        assert_eq!(err_code(&v), -32602, "{method}: {v}");
    }
    let list = alice.list("5", None).await;
    assert_eq!(listed_task(&list, &t)["status"], "working");
    let theirs = bob.list("6", None).await;
    assert!(
        theirs["result"]["tasks"].as_array().unwrap().is_empty(),
        "{theirs}"
    );
    gate.open();
    assert_eq!(
        alice.result("7", &t).await["result"]["content"][0]["text"],
        "done"
    );
}

/// 2026-07-28: `server/discover` declares the extension; a `tools/call` that declares it is a
/// flat `CreateTaskResult`; `tasks/get` shows the result inline once the call ended; a call
/// without the extension passes through as a plain call.
#[tokio::test]
async fn a_2026_client_gets_a_task_and_its_result_inline() {
    let (up, gate, tg) = setup(false).await;
    let url = tg.mcp_url();
    let (status, d) = send(modern_req(&url, None, 1, "server/discover", json!({}))).await;
    assert_eq!(status, 200, "{d}");
    assert!(
        d["result"]["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"].is_object(),
        "{d}"
    );
    let t = create(&url, None, "slow").await;
    assert_eq!(tg.record(&t).unwrap().origin.as_str(), "gateway");
    let (_, v) = task_call(&url, None, 2, "tasks/get", &t).await;
    assert_eq!(v["result"]["status"], "working", "{v}");
    assert_eq!(v["result"]["resultType"], "complete");
    gate.open();
    let done = eventually(STEP, || async {
        let (_, v) = task_call(&url, None, 3, "tasks/get", &t).await;
        (v["result"]["status"] == "completed").then_some(v)
    })
    .await
    .expect("completed");
    assert_eq!(
        done["result"]["result"]["content"][0]["text"], "done",
        "{done}"
    );
    // 2026-07-28 has no related-task `_meta` key (the task is the answer's subject).
    assert!(
        done["result"]["result"]["_meta"]
            .get("io.modelcontextprotocol/related-task")
            .is_none(),
        "a 2025 key in a 2026 result: {done}"
    );
    let plain = modern_req(
        &url,
        None,
        4,
        "tools/call",
        json!({"name": "slow", "arguments": {}, "_meta": meta(false)}),
    );
    let (_, v) = send(plain).await;
    assert_eq!(
        v["result"]["content"][0]["text"], "done",
        "passed through: {v}"
    );
    assert_eq!(up.received("tools/call").len(), 2);
}

/// A 2026-07-28 `tools/call` that carries a `params.task` of any shape is not refused: 2026-07-28
/// servers ignore the 2025 member (conformance-next `sep-2663-legacy-task-param-ignored`), and
/// taskgate is this upstream's 2026 task server; only a 2025 `params.task` is taskgate's to check.
#[tokio::test]
async fn a_2026_call_with_an_odd_params_task_is_not_refused() {
    let (_up, gate, tg) = setup(false).await;
    gate.open();
    let url = tg.mcp_url();
    for (i, task) in [json!("x"), json!({"ttl": -5}), json!([])]
        .iter()
        .enumerate()
    {
        let call = json!({"name": "slow", "arguments": {}, "task": task, "_meta": meta(false)});
        let (status, v) = send(modern_req(&url, None, i as u64 + 1, "tools/call", call)).await;
        assert_eq!(status, 200, "task {task}: {v}");
        assert_eq!(
            v["result"]["content"][0]["text"], "done",
            "task {task}: {v}"
        );
    }
}

/// A graceful stop (SIGTERM, a rolling restart) lets the held call of a gateway task still
/// `working` finish within `gateway.drain_timeout_ms`: its task ends `completed` with its
/// result, instead of being failed at the next start ("taskgate restarted") or, in a tier, by
/// the replica that adopts its lease. (Before, the stop returned at once and the task was left
/// `working`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_lets_a_held_call_finish_within_the_drain() {
    let gate = Gate::new();
    let up = Upstream::start(no_tasks_server(gate.clone())).await;
    let mut tg = UgConfig::new(&up.url())
        .upgrade(&["enabled = false"])
        .upstream_line("tasks = \"gateway\"")
        .gateway("drain_timeout_ms = 10000")
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;
    let t = task_id_of(&create_call(&c, "1", "slow").await);
    assert!(up.wait_for_method("tools/call", 1, STEP).await);
    let running = tg.running.take().expect("running");
    let mut stop = tokio::spawn(running.shutdown());
    // The stop waits for the held call: it has not returned while the call is held (a window
    // of 300 ms: no event marks "still waiting").
    let early = tokio::time::timeout(std::time::Duration::from_millis(300), &mut stop).await;
    assert!(
        early.is_err(),
        "the stop returned with the gateway task's call still held"
    );
    gate.open();
    tokio::time::timeout(std::time::Duration::from_secs(8), stop)
        .await
        .expect("the stop returns once the held call ended")
        .expect("the stop task");
    let record = tg
        .registry
        .store()
        .get("default", &t)
        .expect("the store reads")
        .expect("the task's record");
    assert_eq!(
        record.status,
        taskgate::mcp::task::TaskStatus::Completed,
        "{record:?}"
    );
}

/// `kill -9` while a gateway task is working; after the restart it is `failed`, saying taskgate
/// restarted, never `working` for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_then_restart_fails_the_working_task() {
    let gate = Gate::new();
    let up = Upstream::start(no_tasks_server(gate.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = UgConfig::new(&up.url())
        .upgrade(&["enabled = false"])
        .upstream_line("tasks = \"gateway\"");
    let path = cfg.write_for_binary(dir.path());
    let (mut p, gw, _) = spawn_binary(&path);
    let mut c = Client::new(&format!("http://{gw}/mcp"));
    c.initialize().await;
    // A task failed with a JSON-RPC error before the kill: after the restart, tasks/result
    // still answers exactly that error (the record keeps it), not -32603.
    let failed = task_id_of(&create_call(&c, "7", "boom").await);
    let v = eventually(STEP, || async {
        let v = c.get("8", &failed).await;
        (v["result"]["status"] == "failed").then_some(v)
    })
    .await;
    assert!(v.is_some(), "boom failed");
    let t = task_id_of(&create_call(&c, "1", "slow").await);
    assert!(up.wait_for_method("tools/call", 2, STEP).await);
    // A second task cancelled just before the kill, its call still open (not yet released):
    // after the restart it stays `cancelled` and is only released (no `failed` applied to it,
    // so no late result counted).
    let t2 = task_id_of(&create_call(&c, "4", "slow").await);
    assert!(up.wait_for_method("tools/call", 3, STEP).await);
    let v = c.cancel("\"5\"", &t2).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    assert!(up.wait_for_method("notifications/cancelled", 1, STEP).await);
    sigkill(&mut p);
    let (mut p2, gw2, admin2) = spawn_binary(&path);
    let c2 = Client::new(&format!("http://{gw2}/mcp")).with_session(c.session.as_deref().unwrap());
    let v = c2.get("2", &t).await;
    assert_eq!(v["result"]["status"], "failed", "{v}");
    assert!(
        v["result"]["statusMessage"]
            .as_str()
            .is_some_and(|m| m.contains("taskgate restarted")),
        "{v}"
    );
    let r = c2.result("3", &t).await;
    assert_eq!(err_code(&r), -32603, "{r}");
    let r = c2.result("9", &failed).await;
    assert_eq!(
        r["error"],
        json!({"code": -32000, "message": "it broke", "data": {"why": "scripted"}}),
        "the stored error, exactly: {r}"
    );
    let v = c2.get("6", &t2).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    let m = Req::get(&format!("http://{admin2}/metrics"))
        .send()
        .await
        .text()
        .await;
    assert_eq!(
        metric(&m, "taskgate_task_late_results_total", &[]),
        0.0,
        "no late result counted for the cancelled task"
    );
    blocking(|| {
        p2.signal(libc::SIGTERM);
        let _ = p2.wait_exit(STEP);
    });
}

/// 2026-07-28 `tasks/cancel` of a gateway task: the ack, the task `cancelled` at once, and the
/// held call's stream closed (2026-07-28 has no `notifications/cancelled` over HTTP: closing the
/// stream is the cancel); a second cancel gets the ack too, and nothing more goes upstream.
#[tokio::test]
async fn a_2026_cancel_closes_the_held_stream() {
    let (up, _gate, tg) = setup(false).await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow").await;
    assert!(up.wait_for_method("tools/call", 1, STEP).await);
    let (status, v) = task_call(&url, None, 2, "tasks/cancel", &t).await;
    assert_eq!(
        (status, v["result"]["resultType"].clone()),
        (200, json!("complete")),
        "{v}"
    );
    assert_eq!(tg.record(&t).unwrap().status, TaskStatus::Cancelled);
    assert!(
        up.wait_for_sse_disconnects(1, STEP).await,
        "the held stream is closed"
    );
    let (_, again) = task_call(&url, None, 3, "tasks/cancel", &t).await;
    assert_eq!(again["result"]["resultType"], "complete", "{again}");
    let (_, g) = task_call(&url, None, 4, "tasks/get", &t).await;
    assert_eq!(g["result"]["status"], "cancelled", "{g}");
    let released = eventually(STEP, || async { tg.record(&t).and_then(|r| r.released_at) }).await;
    assert!(released.is_some(), "released once the stream is closed");
    assert!(up.received("notifications/cancelled").is_empty());
}

/// taskgate with `tasks = "gateway"` in front of [`no_tasks_server`] and
/// `max_live_tasks_per_owner = 1`; the gate closed.
async fn one_task_per_owner() -> (Upstream, Gate, Tg) {
    let gate = Gate::new();
    let up = Upstream::start(no_tasks_server(gate.clone())).await;
    let tg = UgConfig::new(&up.url())
        .upgrade(&["enabled = false"])
        .upstream_line("tasks = \"gateway\"")
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    (up, gate, tg)
}

/// `tasks.max_live_tasks_per_owner` holds for gateway tasks of both eras (taskgate, not the
/// server, decides that a 2026-07-28 call becomes a task here): one more is `-32029`, and
/// nothing reaches the server.
#[tokio::test]
async fn the_owner_limit_holds_in_both_eras() {
    let (up, gate, tg) = one_task_per_owner().await;
    let url = tg.mcp_url();
    create(&url, None, "slow").await;
    let (_, v) = send(modern_req(
        &url,
        None,
        2,
        "tools/call",
        json!({"name": "slow", "arguments": {}}),
    ))
    .await;
    assert_eq!(err_code(&v), -32029, "{v}");
    let mut c = tg.client();
    c.initialize().await;
    task_id_of(&create_call(&c, "1", "slow").await);
    let over = create_call(&c, "2", "slow").await;
    assert_eq!(err_code(&over), -32029, "{over}");
    // The held calls reach the server after the clients got their tasks: wait for both, then
    // make sure no third follows (the refused call never goes upstream).
    eventually(STEP, || async {
        (up.received("tools/call").len() >= 2).then_some(())
    })
    .await
    .expect("both owners' held calls reach the server");
    assert_eq!(
        up.received("tools/call").len(),
        2,
        "one held call per owner"
    );
    gate.open();
}

/// A plain 2026-07-28 call in flight (from a client without the tasks extension: it passes
/// through, holding only the provisional slot every 2026 `tools/call` takes) is not one of the
/// owner's live tasks: with `max_live_tasks_per_owner = 1` the owner still gets its gateway
/// task, and only a second task is `-32029`.
#[tokio::test]
async fn a_plain_call_in_flight_does_not_count_against_the_owner_limit() {
    let (up, gate, tg) = one_task_per_owner().await;
    let url = tg.mcp_url();
    let plain = tokio::spawn(send(modern_req(
        &url,
        None,
        7,
        "tools/call",
        json!({"name": "slow", "arguments": {}, "_meta": meta(false)}),
    )));
    assert!(
        up.wait_for_method("tools/call", 1, STEP).await,
        "the plain call is held upstream"
    );
    let t = create(&url, None, "slow").await;
    assert!(tg.record(&t).is_some(), "the gateway task is recorded");
    let (_, over) = send(modern_req(
        &url,
        None,
        8,
        "tools/call",
        json!({"name": "slow", "arguments": {}}),
    ))
    .await;
    assert_eq!(err_code(&over), -32029, "{over}");
    gate.open();
    let (status, v) = plain.await.expect("the plain call's task");
    assert_eq!(
        (status, v["result"]["content"][0]["text"].clone()),
        (200, json!("done")),
        "{v}"
    );
}

/// 2025-11-25 input: a request the server sends the client during the held call
/// (`elicitation/create`) makes the task `input_required`; `tasks/result` is then an SSE
/// stream carrying the status, the request (an id taskgate minted, the related-task `_meta`)
/// and, once the client's POSTed answer (HTTP 202) went upstream as the response to the
/// server's own id, the task `working` again and finally the result.
#[tokio::test]
async fn a_2025_input_request_is_relayed_on_the_result_stream() {
    let (up, gate, tg) = setup(false).await;
    let c = client_with(&tg.mcp_url(), json!({"elicitation": {}})).await;
    let t = task_id_of(&create_call(&c, "1", "ask").await);
    let waiting = eventually(STEP, || async {
        let v = c.get("2", &t).await;
        (v["result"]["status"] == "input_required").then_some(v)
    })
    .await
    .expect("input_required while the server waits for the client");
    assert!(
        waiting["result"]["statusMessage"]
            .as_str()
            .is_some_and(|m| m.contains("elicitation/create")),
        "{waiting}"
    );
    let (mut sse, status) = c.input_stream("3", &t).await;
    assert_eq!(status["params"]["status"], "input_required", "{status}");
    let ask = sse.next_event(STEP).await.json();
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    assert_eq!(ask["params"]["message"], "ok?", "{ask}");
    assert_eq!(
        ask["params"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        json!(t),
        "{ask}"
    );
    assert_ne!(ask["id"], "elicit-1", "an id taskgate minted: {ask}");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"action": "accept", "content": {"ok": true}}});
    assert_eq!(c.send(answer.to_string()).await.status(), 202);
    let relayed = eventually(STEP, || async {
        up.requests().into_iter().find(|r| {
            let v = r.json();
            v["id"] == "elicit-1" && v.get("method").is_none()
        })
    })
    .await
    .expect("the client's answer went upstream under the server's id");
    let v = relayed.json();
    assert_eq!(v["result"]["action"], "accept", "{v}");
    assert_eq!(v["result"]["content"]["ok"], true, "{v}");
    let working = sse.next_event(STEP).await.json();
    assert_eq!(working["params"]["status"], "working", "{working}");
    assert_eq!(c.get("4", &t).await["result"]["status"], "working");
    gate.open();
    let done = loop {
        let v = sse.next_event(STEP).await.json();
        if v.get("id").is_some() {
            break v;
        }
    };
    assert_eq!(done["id"], 3, "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "done", "{done}");
}

/// A 2025 client that answers an MRTR `sampling/createMessage` of a gateway task with a
/// JSON-RPC error: a `CreateMessageResult` has no refusal form (a `decline` is an
/// `ElicitResult`), so, as in the bridge's MRTR, the call is not sent again; the task fails
/// with the `-32603` saying so. Before: the call went upstream again with
/// `inputResponses: {"sample": {"action":"decline"}}` taken as the sampled message, and the task
/// completed with it.
#[tokio::test]
async fn a_2025_error_answer_to_an_mrtr_sampling_request_fails_the_task_without_a_retry() {
    let (up, _gate, tg) = setup(false).await;
    let c = client_with(&tg.mcp_url(), json!({"sampling": {}})).await;
    let t = task_id_of(&create_call(&c, "1", "mrtr-sample").await);
    eventually(STEP, || async {
        let v = c.get("2", &t).await;
        (v["result"]["status"] == "input_required").then_some(v)
    })
    .await
    .expect("input_required while the server waits for a sampled message");
    let resp = c
        .send(rpc("3", "tasks/result", &json!({"taskId": t}).to_string()))
        .await;
    assert_eq!(resp.status(), 200);
    let mut sse = resp.sse();
    let ask = loop {
        let v = sse.next_event(STEP).await.json();
        if v.get("id").is_some() {
            break v;
        }
    };
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    let refusal = json!({"jsonrpc": "2.0", "id": ask["id"],
        "error": {"code": -1, "message": "User rejected sampling request"}});
    assert_eq!(c.send(refusal.to_string()).await.status(), 202);
    let done = loop {
        let v = sse.next_event(STEP).await.json();
        if v.get("id").is_some() {
            break v;
        }
    };
    assert_eq!(done["id"], 3, "{done}");
    assert_eq!(err_code(&done), -32603, "{done}");
    assert!(
        err_message(&done).contains("sampling/createMessage"),
        "{done}"
    );
    assert_eq!(c.get("4", &t).await["result"]["status"], "failed");
    assert_eq!(up.received("tools/call").len(), 1, "no retry of the call");
}

/// A 2025 client that loses its `tasks/result` stream while the server waits for its answer is
/// asked again on the next one, under the same id taskgate minted; its answer goes upstream
/// once, and a second answer under that id is not relayed again.
#[tokio::test]
async fn a_2025_client_that_lost_its_result_stream_is_asked_again() {
    let (up, gate, tg) = setup(false).await;
    let c = client_with(&tg.mcp_url(), json!({"elicitation": {}})).await;
    let t = task_id_of(&create_call(&c, "1", "ask").await);
    let waiting = eventually(STEP, || async {
        let v = c.get("2", &t).await;
        (v["result"]["status"] == "input_required").then_some(v)
    })
    .await;
    assert!(waiting.is_some(), "input_required");
    // A new `tasks/result` stream: the status, then the request (returned with the stream).
    async fn asked(c: &Client, id: &str, t: &str) -> (Value, SseReader) {
        let resp = c
            .send(rpc(id, "tasks/result", &json!({"taskId": t}).to_string()))
            .await;
        assert_eq!(resp.status(), 200);
        let mut sse = resp.sse();
        let status = sse.next_event(STEP).await.json();
        assert_eq!(status["params"]["status"], "input_required", "{status}");
        let ask = sse.next_event(STEP).await.json();
        assert_eq!(ask["method"], "elicitation/create", "{ask}");
        (ask, sse)
    }
    let (first, sse) = asked(&c, "3", &t).await;
    drop(sse);
    let (again, mut sse) = asked(&c, "4", &t).await;
    assert_eq!(again["id"], first["id"], "the same id: {again}");
    assert_eq!(
        again["params"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        json!(t),
        "{again}"
    );
    let answer = json!({"jsonrpc": "2.0", "id": again["id"],
        "result": {"action": "accept", "content": {"ok": true}}});
    assert_eq!(c.send(answer.to_string()).await.status(), 202);
    let working = sse.next_event(STEP).await.json();
    assert_eq!(working["params"]["status"], "working", "{working}");
    let _ = c.send(answer.to_string()).await;
    let answers = || {
        up.requests()
            .into_iter()
            .filter(|r| {
                let v = r.json();
                v["id"] == "elicit-1" && v.get("method").is_none()
            })
            .count()
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(answers(), 1, "the answer went upstream once");
    gate.open();
    let done = loop {
        let v = sse.next_event(STEP).await.json();
        if v.get("id").is_some() {
            break v;
        }
    };
    assert_eq!(done["result"]["content"][0]["text"], "done", "{done}");
}

/// A client whose session did not declare `capabilities.elicitation` is not asked: the server
/// gets `-32601` saying so once the client reads `tasks/result`, and the task goes on.
#[tokio::test]
async fn an_input_request_the_client_cannot_answer_is_refused_to_the_server() {
    let (up, gate, tg) = setup(false).await;
    let mut c = tg.client();
    c.initialize().await;
    let t = task_id_of(&create_call(&c, "1", "ask").await);
    let waiting = eventually(STEP, || async {
        let v = c.get("2", &t).await;
        (v["result"]["status"] == "input_required").then_some(v)
    })
    .await;
    assert!(waiting.is_some(), "input_required");
    let result = {
        let c = c.clone();
        let t = t.clone();
        tokio::spawn(async move { c.result("3", &t).await })
    };
    let refused = eventually(STEP, || async {
        up.requests().into_iter().find(|r| {
            let v = r.json();
            v["id"] == "elicit-1" && v.get("method").is_none()
        })
    })
    .await
    .expect("taskgate answered the server's request");
    let v = refused.json();
    assert_eq!(v["error"]["code"], -32601, "{v}");
    gate.open();
    let r = tokio::time::timeout(STEP, result).await.unwrap().unwrap();
    assert_eq!(r["result"]["content"][0]["text"], "done", "{r}");
}

/// 2026-07-28 input: the waiting request is the task's `inputRequests` in `tasks/get`
/// (`input_required`); `tasks/update` with `inputResponses` answers it (the ack), the answer
/// goes upstream under the server's id, and the task is `working` again.
#[tokio::test]
async fn a_2026_input_request_is_shown_and_answered_with_tasks_update() {
    let (up, gate, tg) = setup(false).await;
    let url = tg.mcp_url();
    let t = create(&url, None, "ask").await;
    let waiting = eventually(STEP, || async {
        let (_, v) = task_call(&url, None, 2, "tasks/get", &t).await;
        (v["result"]["status"] == "input_required").then_some(v)
    })
    .await
    .expect("input_required with its inputRequests");
    let requests = waiting["result"]["inputRequests"]
        .as_object()
        .unwrap_or_else(|| panic!("inputRequests: {waiting}"));
    assert_eq!(requests.len(), 1, "{waiting}");
    let (key, request) = requests.iter().next().unwrap();
    assert_eq!(request["method"], "elicitation/create", "{waiting}");
    assert_eq!(request["params"]["message"], "ok?", "{waiting}");
    let update = modern_req(
        &url,
        None,
        3,
        "tasks/update",
        json!({"taskId": t, "inputResponses": {
            key.clone(): {"action": "accept", "content": {"ok": true}},
            "unknown-key": {"action": "decline"}}}),
    );
    let (status, ack) = send(update).await;
    assert_eq!(status, 200, "{ack}");
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    let relayed = eventually(STEP, || async {
        up.requests().into_iter().find(|r| {
            let v = r.json();
            v["id"] == "elicit-1" && v.get("method").is_none()
        })
    })
    .await
    .expect("the answer went upstream under the server's id");
    assert_eq!(relayed.json()["result"]["action"], "accept");
    let (_, v) = task_call(&url, None, 4, "tasks/get", &t).await;
    assert_eq!(v["result"]["status"], "working", "{v}");
    assert!(v["result"].get("inputRequests").is_none(), "{v}");
    gate.open();
    let done = eventually(STEP, || async {
        let (_, v) = task_call(&url, None, 5, "tasks/get", &t).await;
        (v["result"]["status"] == "completed").then_some(v)
    })
    .await
    .expect("completed");
    assert_eq!(done["result"]["result"]["content"][0]["text"], "done");
}

/// A 2026-07-28 server that answers the held call `input_required` (MRTR) asks the client
/// through the task (issue 32, "Life"): the task is `input_required` with the server's
/// request in `inputRequests`; the client's `tasks/update` answers it, the call goes upstream
/// again under a new id with `inputResponses` (the server's key) and the `requestState`
/// echoed, and its result completes the task. Fails on 9ca1420: the `input_required` result
/// was recorded as the task's `completed` result.
#[tokio::test]
async fn a_2026_servers_input_required_answer_is_relayed_and_the_call_sent_again() {
    let (up, _gate, tg) = setup(false).await;
    let url = tg.mcp_url();
    let t = create(&url, None, "mrtr").await;
    let waiting = eventually(STEP, || async {
        let (_, v) = task_call(&url, None, 2, "tasks/get", &t).await;
        (v["result"]["status"] == "input_required").then_some(v)
    })
    .await
    .expect("input_required with the server's inputRequests");
    let requests = waiting["result"]["inputRequests"]
        .as_object()
        .unwrap_or_else(|| panic!("inputRequests: {waiting}"));
    assert_eq!(requests.len(), 1, "{waiting}");
    let (key, request) = requests.iter().next().unwrap();
    assert_eq!(request["method"], "elicitation/create", "{waiting}");
    assert_eq!(request["params"]["message"], "sure?", "{waiting}");
    let update = modern_req(
        &url,
        None,
        3,
        "tasks/update",
        json!({"taskId": t, "inputResponses": {key.clone(): {"action": "accept", "content": {}}}}),
    );
    let (status, ack) = send(update).await;
    assert_eq!(status, 200, "{ack}");
    let done = eventually(STEP, || async {
        let (_, v) = task_call(&url, None, 4, "tasks/get", &t).await;
        (v["result"]["status"] == "completed").then_some(v)
    })
    .await
    .expect("completed once the call was sent again");
    assert_eq!(
        done["result"]["result"]["content"][0]["text"], "confirmed: accept",
        "{done}"
    );
    let calls = up.received("tools/call");
    assert_eq!(calls.len(), 2, "the call, then its retry");
    let (first, retry) = (calls[0].json(), calls[1].json());
    assert_ne!(first["id"], retry["id"], "the retry has a new id");
    assert_eq!(
        retry["params"]["inputResponses"],
        json!({"confirm": {"action": "accept", "content": {}}})
    );
    assert_eq!(retry["params"]["requestState"], "st-1");
    assert_eq!(retry["params"]["name"], "mrtr");
}

/// 2026-07-28 `tasks/update` whose `inputResponses` is not an object of results (`[]`, `"x"`,
/// `null`, `5`, or a key answered with `null`) is refused `-32602` (HTTP 400) naming
/// `params.inputResponses`, nothing goes upstream, and the request still waits; a good update
/// after that answers it.
#[tokio::test]
async fn a_malformed_input_responses_is_refused_and_the_request_still_waits() {
    let (up, gate, tg) = setup(false).await;
    let url = tg.mcp_url();
    let t = create(&url, None, "ask").await;
    let waiting = eventually(STEP, || async {
        let (_, v) = task_call(&url, None, 2, "tasks/get", &t).await;
        (v["result"]["status"] == "input_required").then_some(v)
    })
    .await
    .expect("input_required with its inputRequests");
    let key = waiting["result"]["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .unwrap_or_else(|| panic!("inputRequests: {waiting}"));
    let bad = [
        json!([]),
        json!("x"),
        Value::Null,
        json!(5),
        json!({key.clone(): null}),
        json!({key.clone(): "accept"}),
    ];
    for (i, responses) in bad.iter().enumerate() {
        let update = modern_req(
            &url,
            None,
            10 + i as u64,
            "tasks/update",
            json!({"taskId": t, "inputResponses": responses}),
        );
        let (status, v) = send(update).await;
        assert_eq!(status, 400, "inputResponses {responses}: {v}");
        assert_eq!(err_code(&v), -32602, "inputResponses {responses}: {v}");
        assert!(
            err_message(&v).contains("params.inputResponses"),
            "inputResponses {responses}: {v}"
        );
    }
    let (_, v) = task_call(&url, None, 20, "tasks/get", &t).await;
    assert_eq!(v["result"]["status"], "input_required", "{v}");
    assert!(v["result"]["inputRequests"].get(&key).is_some(), "{v}");
    let answered = |up: &Upstream| {
        up.requests()
            .into_iter()
            .filter(|r| {
                let v = r.json();
                v["id"] == "elicit-1" && v.get("method").is_none()
            })
            .count()
    };
    assert_eq!(answered(&up), 0, "nothing went upstream");
    let update = modern_req(
        &url,
        None,
        21,
        "tasks/update",
        json!({"taskId": t, "inputResponses": {key.clone(): {"action": "decline"}}}),
    );
    let (status, ack) = send(update).await;
    assert_eq!(status, 200, "{ack}");
    assert!(
        eventually(STEP, || async { (answered(&up) == 1).then_some(()) })
            .await
            .is_some(),
        "the good answer went upstream"
    );
    gate.open();
}

/// 2026-07-28 input on a 2025-11-25 server (the reverse bridge carries the held call): the
/// server's `elicitation/create` on the call's stream is not dropped but becomes the task's
/// `inputRequests`, and the `tasks/update` answer reaches the server under its own id.
#[tokio::test]
async fn a_2026_input_request_crosses_the_reverse_bridge() {
    let gate = Gate::new();
    let up = Upstream::start(no_tasks_server(gate.clone())).await;
    let tg = UgConfig::new(&up.url())
        .upgrade(&["enabled = false"])
        .upstream_line("tasks = \"gateway\"")
        .upstream_line("protocol = \"2025-11-25\"")
        .tasks("release_quiet_ms = 100")
        .start()
        .await;
    let url = tg.mcp_url();
    // A client that can be asked (the held call's requests are checked against what the call
    // declared: `bridge::reverse::HELD_CLIENT_CAPABILITIES`).
    let (status, v) = send(modern_req(
        &url,
        None,
        1,
        "tools/call",
        json!({"name": "ask", "arguments": {}, "_meta": meta_asking()}),
    ))
    .await;
    assert_eq!(
        (status, &v["result"]["resultType"]),
        (200, &json!("task")),
        "{v}"
    );
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    assert!(
        up.wait_for_method("initialize", 1, STEP).await,
        "a 2025 session upstream"
    );
    let waiting = eventually(STEP, || async {
        let (_, v) = task_call(&url, None, 2, "tasks/get", &t).await;
        (v["result"]["status"] == "input_required").then_some(v)
    })
    .await
    .expect("the server's request reached the task");
    let key = waiting["result"]["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .unwrap_or_else(|| panic!("inputRequests: {waiting}"));
    let update = modern_req(
        &url,
        None,
        3,
        "tasks/update",
        json!({"taskId": t, "inputResponses": {key: {"action": "decline"}}}),
    );
    let (status, ack) = send(update).await;
    assert_eq!(status, 200, "{ack}");
    let relayed = eventually(STEP, || async {
        up.requests().into_iter().find(|r| {
            let v = r.json();
            v["id"] == "elicit-1" && v.get("method").is_none()
        })
    })
    .await
    .expect("the answer went upstream on the session, under the server's id");
    let v = relayed.json();
    assert_eq!(v["result"]["action"], "decline", "{v}");
    assert!(
        relayed.header("mcp-session-id").is_some(),
        "on the upstream session"
    );
    gate.open();
    let done = eventually(STEP, || async {
        let (_, v) = task_call(&url, None, 4, "tasks/get", &t).await;
        (v["result"]["status"] == "completed").then_some(v)
    })
    .await
    .expect("completed");
    assert_eq!(done["result"]["result"]["content"][0]["text"], "done");
}

/// `notifications/tasks/status` on the GET stream of a session whose client declared
/// `capabilities.tasks`: one per status change of its gateway task (here `input_required`,
/// `working`, and the terminal one: here `completed`), merged into the upstream's stream.
#[tokio::test]
async fn status_changes_reach_a_listening_client_on_its_get_stream() {
    let (_up, gate, tg) = setup(false).await;
    let c = client_with(&tg.mcp_url(), json!({"tasks": {}})).await;
    let get = Req::mcp_get(&tg.mcp_url())
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .header("mcp-session-id", c.session.as_deref().unwrap())
        .send()
        .await;
    assert_eq!(get.status(), 200);
    let mut stream = get.sse();
    let t = task_id_of(&create_call(&c, "1", "slow").await);
    gate.open();
    let note = loop {
        let v = stream.next_event(STEP).await.json();
        if v["method"] == "notifications/tasks/status" && v["params"]["status"] == "completed" {
            break v;
        }
    };
    assert_eq!(note["params"]["taskId"], json!(t), "{note}");
}

/// A server that heeds `notifications/cancelled` by never answering and keeps its stream open
/// (the TypeScript SDK does) does not keep the held call, and its connection, until the task's
/// ttl: taskgate closes it after `CANCELLED_CALL_GRACE` (5 s), and the task is released then,
/// still `cancelled`, with no late result.
#[tokio::test]
async fn a_cancelled_call_the_server_keeps_open_is_closed_and_released() {
    let (up, _gate, tg) = setup(false).await;
    let mut c = tg.client();
    c.initialize().await;
    let t = task_id_of(&create_call(&c, "1", "slow").await);
    assert!(up.wait_for_method("tools/call", 1, STEP).await);
    let v = c.cancel("\"c\"", &t).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    assert!(up.wait_for_method("notifications/cancelled", 1, STEP).await);
    let released = eventually(Duration::from_secs(20), || async {
        tg.record(&t).and_then(|r| r.released_at)
    })
    .await;
    assert!(released.is_some(), "released once taskgate closed the call");
    let rec = tg.record(&t).unwrap();
    assert_eq!(rec.status, TaskStatus::Cancelled);
    assert!(rec.late_result_at.is_none(), "no late result: {rec:?}");
}

/// A server that heeds `notifications/cancelled` by stopping the handler and answering the call
/// with an error (the Python SDK `mcp` 1.x answers `{"code":0,"message":"Request cancelled"}`):
/// that answer is the call's end, not a late result. The task stays `cancelled`, is released,
/// and neither `late_result_at` nor `taskgate_task_late_results_total` moves (the
/// `TaskgateLateResultsAfterCancel` alert says "the work ran to the end after it was
/// cancelled", which it did not).
#[tokio::test]
async fn a_cancelled_call_the_server_answers_with_an_error_is_no_late_result() {
    let (up, gate, tg) = setup(false).await;
    let mut c = tg.client();
    c.initialize().await;
    let t = task_id_of(&create_call(&c, "1", "heed").await);
    assert!(up.wait_for_method("tools/call", 1, STEP).await);
    let v = c.cancel("\"c\"", &t).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    assert!(up.wait_for_method("notifications/cancelled", 1, STEP).await);
    gate.open();
    let released = eventually(STEP, || async { tg.record(&t).and_then(|r| r.released_at) }).await;
    // A late result would be recorded before the release (`Held::late` is awaited first).
    assert!(released.is_some(), "released once the call ended");
    let rec = tg.record(&t).unwrap();
    assert_eq!(rec.status, TaskStatus::Cancelled);
    assert!(rec.late_result_at.is_none(), "no late result: {rec:?}");
    let m = tg.metrics_text().await;
    assert_eq!(metric(&m, "taskgate_task_late_results_total", &[]), 0.0);
    let (_, names) = audit_events(&tg, &t).await;
    assert!(!names.iter().any(|n| n == "late_result"), "{names:?}");
}

/// taskgate is the task server of a `tasks = "gateway"` upstream: a `params.task` that is not
/// an object, or whose `ttl` is not a number of ms at least 0, is refused `-32602` by
/// taskgate, and nothing goes upstream.
#[tokio::test]
async fn a_malformed_params_task_is_refused_by_taskgate() {
    let (up, _gate, tg) = setup(false).await;
    let mut c = tg.client();
    c.initialize().await;
    assert_unboundable_tasks_refused(&c, "slow").await;
    assert!(
        up.received("tools/call").is_empty(),
        "nothing went upstream"
    );
}

/// Break-tasks M4: a gateway task whose result is larger than `tasks.max_stored_result_bytes`
/// (nowhere to keep it) ends `failed` saying so, in both eras: a 2026 `tasks/get` answers a
/// `DetailedTask` with its `error`, a 2025 `tasks/result` the error. Before, it was `completed`
/// with no result anywhere: a 2026 `tasks/get` answered a JSON-RPC error instead of the task,
/// and a 2025 `tasks/result` `-32603`.
#[tokio::test]
async fn a_result_too_large_to_keep_fails_the_task_saying_so() {
    let (_up, tg) = keeping_at_most(16).await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow").await;
    let done = eventually(STEP, || async {
        let (_, v) = task_call(&url, None, 2, "tasks/get", &t).await;
        (v["result"]["status"] == "failed").then_some(v)
    })
    .await
    .expect("failed, not completed without its result");
    let message = done["result"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("max_stored_result_bytes"), "{done}");
    assert_eq!(done["result"]["resultType"], "complete", "{done}");

    let mut c = tg.client();
    c.initialize().await;
    let t = task_id_of(&create_call(&c, "1", "slow").await);
    let failed = eventually(STEP, || async {
        let v = c.get("2", &t).await;
        (v["result"]["status"] == "failed").then_some(v)
    })
    .await
    .expect("failed");
    let said = failed["result"]["statusMessage"]
        .as_str()
        .unwrap_or_default();
    assert!(said.contains("max_stored_result_bytes"), "{failed}");
    let r = c.result("3", &t).await;
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_stored_result_bytes")),
        "{r}"
    );
}

/// Review 17 #8: under 2026-07-28 the record keeps the whole `DetailedTask`, a few hundred bytes
/// more than the result: a result that fits `tasks.max_stored_result_bytes` while its
/// `DetailedTask` does not is measured as kept, so the task is `failed` saying so, and a
/// `tasks/get` still answers the task. Before, it was `completed` with nothing kept, and the
/// `tasks/get` was an error.
#[tokio::test]
async fn a_2026_result_is_measured_as_the_record_keeps_it() {
    let (_up, tg) = keeping_at_most(100).await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow").await;
    let done = eventually(STEP, || async {
        let (_, v) = task_call(&url, None, 2, "tasks/get", &t).await;
        v["result"]["status"]
            .as_str()
            .is_some_and(|s| s != "working")
            .then_some(v)
    })
    .await
    .expect("ended");
    assert_eq!(done["result"]["status"], "failed", "{done}");
    let message = done["result"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("max_stored_result_bytes"), "{done}");
}

/// taskgate with `tasks = "gateway"` in front of [`no_tasks_server`] whose calls end at once
/// (its gate open), keeping results of at most `bytes` (`tasks.max_stored_result_bytes`).
async fn keeping_at_most(bytes: u64) -> (Upstream, Tg) {
    let gate = Gate::new();
    gate.open();
    let up = Upstream::start(no_tasks_server(gate)).await;
    let tg = UgConfig::new(&up.url())
        .upgrade(&["enabled = false"])
        .upstream_line("tasks = \"gateway\"")
        .tasks(&format!("max_stored_result_bytes = {bytes}"))
        .start()
        .await;
    (up, tg)
}

/// How a server that lost a session answers a request on it: HTTP 404 with ...
#[derive(Clone, Copy)]
enum Gone {
    /// ... `-32001` under the request's id (the TypeScript SDK).
    TypeScript,
    /// ... `-32600` "Session not found" under the id `"server-error"` (the Python SDK, `mcp` 1.x).
    Python,
    /// ... an error that does not say the session is gone (a proxy in front of the server).
    Proxy,
}

/// [`no_tasks_server`] that can lose its sessions (a restart): a request on a session in
/// `lost` is answered as `gone` says.
fn losing_sessions(
    gate: Gate,
    lost: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    gone: Gone,
) -> impl Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync {
    let server = no_tasks_server(gate);
    move |req| {
        let lost_here = req
            .header("mcp-session-id")
            .is_some_and(|s| lost.lock().unwrap().contains(&s));
        if !lost_here {
            return server(req);
        }
        let id = req.rpc_id_json();
        let body = match gone {
            Gone::Python => r#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Session not found"}}"#.to_string(),
            Gone::TypeScript => format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32001,"message":"Session not found"}}}}"#),
            Gone::Proxy => format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32000,"message":"no route to the server"}}}}"#),
        };
        ScriptedResponse::status(404, Some("application/json"), body)
    }
}

/// The upstream restarted and lost the client's session (hostile tester): the first gateway
/// task created on it fails ("Session not found": taskgate could not know yet), and from then
/// on a task-augmented `tools/call` on that session is answered HTTP 404 `-32001` (2025-11-25
/// transports: the client MUST then start a new session), not another `CreateTaskResult`
/// whose held call fails again (the client looped for ever). The failed task stays readable by
/// its owner (without auth: the old session id); after the new `initialize` tasks run again.
async fn a_lost_upstream_session_is_404_to_the_next_task(gone: Gone) {
    let (up, _tg, mut c, before, failed) = a_task_failed_on_a_lost_session(gone).await;
    let old = c.session.clone().expect("a session");
    let g = c.get("4", &failed).await;
    assert_eq!(g["result"]["statusMessage"], "Session not found", "{g}");
    // The next task-augmented call on that session: 404 -32001, no task, nothing upstream.
    let calls = up.received("tools/call").len();
    let body = rpc(
        "5",
        "tools/call",
        &json!({"name": "slow", "arguments": {}, "task": {"ttl": 60000}}).to_string(),
    );
    let r = c.send(body).await;
    assert_eq!(r.status(), 404, "a lost session is 404 to a new task");
    let v = r.json().await;
    assert_eq!(v["error"]["code"], -32001, "{v}");
    assert_eq!(v["id"], 5, "{v}");
    assert_eq!(
        c.send(rpc(
            "6",
            "tools/call",
            &json!({"name": "slow", "arguments": {}, "task": {}}).to_string()
        ))
        .await
        .status(),
        404,
        "and stays so"
    );
    assert_eq!(
        up.received("tools/call").len(),
        calls,
        "nothing went upstream"
    );
    // The failed task (and the one before) are still its owner's to read.
    let g = c.get("7", &failed).await;
    assert_eq!(g["result"]["status"], "failed", "{g}");
    let r = c.result("8", &failed).await;
    assert_eq!(r["error"]["message"], "Session not found", "{r}");
    let r = c.result("9", &before).await;
    assert_eq!(r["result"]["content"][0]["text"], "done", "{r}");
    // The client starts a new session, as the 404 told it to: tasks run again.
    c.initialize().await;
    assert_ne!(c.session.as_deref(), Some(old.as_str()), "a new session");
    let after = task_id_of(&create_call(&c, "10", "slow").await);
    let r = c.result("11", &after).await;
    assert_eq!(r["result"]["content"][0]["text"], "done", "{r}");
    // Without auth a task's owner is the session it was created on: the new session does not
    // see the failed task, the old session id still does (README "Who owns a task").
    assert_eq!(err_code(&c.get("12", &failed).await), -32602);
    let g = c.clone().with_session(&old).get("13", &failed).await;
    assert_eq!(g["result"]["status"], "failed", "{g}");
}

/// [`a_lost_upstream_session_is_404_to_the_next_task`], the TypeScript SDK's 404 (`-32001`).
#[tokio::test]
async fn a_lost_upstream_session_is_404_to_the_next_task_typescript() {
    a_lost_upstream_session_is_404_to_the_next_task(Gone::TypeScript).await;
}

/// [`a_lost_upstream_session_is_404_to_the_next_task`], the Python SDK's 404 (`-32600`
/// "Session not found" under the id `"server-error"`).
#[tokio::test]
async fn a_lost_upstream_session_is_404_to_the_next_task_python() {
    a_lost_upstream_session_is_404_to_the_next_task(Gone::Python).await;
}

/// A 404 whose error does not say the session is gone (a proxy's, during a deploy) fails the
/// task it answered, but is not taken for the session lost: the next task is created.
#[tokio::test]
async fn a_proxys_404_is_not_taken_for_a_lost_session() {
    let (_up, _tg, c, _before, failed) = a_task_failed_on_a_lost_session(Gone::Proxy).await;
    let g = c.get("4", &failed).await;
    assert_eq!(
        g["result"]["statusMessage"], "no route to the server",
        "{g}"
    );
    let next = create_call(&c, "5", "slow").await;
    assert_eq!(next["result"]["task"]["status"], "working", "{next}");
}

/// taskgate (`tasks = "gateway"`) in front of [`losing_sessions`] (calls end at once), and a
/// client whose first task completed on its session; then the server loses that session
/// (answering as `gone` says) and the client's second task fails. Returns the server,
/// taskgate, the client (still on its old session), the first task and the failed one.
async fn a_task_failed_on_a_lost_session(gone: Gone) -> (Upstream, Tg, Client, String, String) {
    let gate = Gate::new();
    gate.open();
    let lost = std::sync::Arc::<std::sync::Mutex<std::collections::HashSet<String>>>::default();
    let up = Upstream::start(losing_sessions(gate, lost.clone(), gone)).await;
    let tg = UgConfig::new(&up.url())
        .upgrade(&["enabled = false"])
        .upstream_line("tasks = \"gateway\"")
        .tasks("release_quiet_ms = 100")
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;
    let before = task_id_of(&create_call(&c, "1", "slow").await);
    assert_eq!(
        c.result("2", &before).await["result"]["content"][0]["text"],
        "done"
    );
    // The upstream restarts: it no longer knows the session.
    lost.lock()
        .unwrap()
        .insert(c.session.clone().expect("a session"));
    let failed = task_id_of(&create_call(&c, "3", "slow").await);
    eventually(STEP, || async {
        let v = c.get("4", &failed).await;
        (v["result"]["status"] == "failed").then_some(v)
    })
    .await
    .expect("the held call on the lost session failed its task");
    (up, tg, c, before, failed)
}

/// [`no_tasks_server`] numbering its sessions from `s-0` (a counter, as this file's
/// own servers do; 2025-11-25 transports only say a session id SHOULD be globally unique), that
/// can restart: `restart` forgets every session and starts the count again. A request on a
/// session it does not know is answered HTTP 404 `-32001` (the TypeScript SDK).
fn restarting_server(
    gate: Gate,
    restart: std::sync::Arc<std::sync::Mutex<(usize, std::collections::HashSet<String>)>>,
) -> impl Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync {
    let server = no_tasks_server(gate);
    move |req| {
        let v = req.json();
        if req.method != "GET" && v["method"] == "initialize" {
            let mut s = restart.lock().unwrap();
            let id = format!("s-{}", s.0);
            s.0 += 1;
            s.1.insert(id.clone());
            return mcp_handler(req).set_header("mcp-session-id", &id);
        }
        let known = req
            .header("mcp-session-id")
            .is_none_or(|s| restart.lock().unwrap().1.contains(&s));
        if !known {
            let id = req.rpc_id_json();
            return ScriptedResponse::status(
                404,
                Some("application/json"),
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32001,"message":"Session not found"}}}}"#
                ),
            );
        }
        server(req)
    }
}

/// An upstream session id issued again is not gone (review 21 #2: the `gone` set was never told).
/// A server that restarted and numbers its sessions from the start again issues the client's
/// old id to its new `initialize`: that session is live upstream (a plain `tools/call` on it
/// works), and its task-augmented `tools/call` is a task again (before: HTTP 404 as if gone).
#[tokio::test]
async fn a_session_id_issued_again_is_not_gone() {
    let gate = Gate::new();
    gate.open();
    let restart =
        std::sync::Arc::<std::sync::Mutex<(usize, std::collections::HashSet<String>)>>::default();
    let up = Upstream::start(restarting_server(gate, restart.clone())).await;
    let tg = UgConfig::new(&up.url())
        .upgrade(&["enabled = false"])
        .upstream_line("tasks = \"gateway\"")
        .tasks("release_quiet_ms = 100")
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;
    assert_eq!(c.session.as_deref(), Some("s-0"));
    // The server restarts: it forgets s-0 and counts from 0 again.
    *restart.lock().unwrap() = Default::default();
    let failed = task_id_of(&create_call(&c, "2", "slow").await);
    eventually(STEP, || async {
        let v = c.get("3", &failed).await;
        (v["result"]["status"] == "failed").then_some(v)
    })
    .await
    .expect("the held call on the lost session failed its task");
    // The client initializes again and is issued s-0, live upstream.
    c.initialize().await;
    assert_eq!(
        c.session.as_deref(),
        Some("s-0"),
        "the restarted server's first session"
    );
    let plain = c
        .rpc(rpc(
            "4",
            "tools/call",
            &json!({"name": "slow", "arguments": {}}).to_string(),
        ))
        .await;
    assert_eq!(
        plain["result"]["content"][0]["text"], "done",
        "live upstream: {plain}"
    );
    let body = rpc(
        "5",
        "tools/call",
        &json!({"name": "slow", "arguments": {}, "task": {"ttl": 60000}}).to_string(),
    );
    let r = c.send(body).await;
    let status = r.status();
    let v = r.json().await;
    assert_eq!(
        status, 200,
        "a live session's task-augmented call was answered as gone: {v}"
    );
    assert_eq!(v["result"]["task"]["status"], "working", "{v}");
}

/// Cold test: a tool result nested past serde_json's 128 levels ended the gateway task `failed`
/// ("the upstream's answer ended without the call's result": its answer read into a `Value`),
/// while the same call without a task passed. It completes, and `tasks/result` answers it
/// byte for byte as the server sent it, with the related-task `_meta` spliced in.
#[tokio::test]
async fn a_result_nested_past_serdes_limit_completes_byte_exact() {
    let (_up, gate, tg) = setup(false).await;
    gate.open();
    let mut c = tg.client();
    c.initialize().await;
    let t = task_id_of(&create_call(&c, "1", "deep").await);
    let r = c
        .send(rpc(
            "2",
            "tasks/result",
            &json!({ "taskId": t }).to_string(),
        ))
        .await;
    assert_eq!(r.status(), 200);
    let text = answer_text(&r.text().await);
    let upstream = deep_result();
    let expected = format!(
        r#"{{"jsonrpc":"2.0","id":2,"result":{{"_meta":{{"io.modelcontextprotocol/related-task":{{"taskId":"{t}"}}}},{}}}"#,
        upstream.strip_prefix('{').expect("an object")
    );
    assert_eq!(text, expected);
    let g = c.get("3", &t).await;
    assert_eq!(g["result"]["status"], "completed", "{g}");
    // Served again, the same bytes.
    let again = c
        .send(rpc(
            "2",
            "tasks/result",
            &json!({ "taskId": t }).to_string(),
        ))
        .await
        .text()
        .await;
    assert_eq!(answer_text(&again), expected);
}

/// The same deep result for a 2026-07-28 client: `tasks/get` of the completed gateway task
/// carries it inline, byte for byte as the server sent it (the held answer is kept as bytes and
/// read member by member: a `Value` could not hold it).
#[tokio::test]
async fn a_2026_inline_result_nested_past_serdes_limit_is_byte_exact() {
    let (_up, gate, tg) = setup(false).await;
    let url = tg.mcp_url();
    let t = create(&url, None, "deep").await;
    gate.open();
    let upstream = deep_result();
    let text = eventually(STEP, || {
        let req = modern_req(&url, None, 2, "tasks/get", json!({ "taskId": t }));
        async move {
            let text = answer_text(&req.send().await.text().await);
            text.contains(r#""status":"completed""#).then_some(text)
        }
    })
    .await
    .expect("completed");
    assert!(
        text.contains(&format!(r#""result":{upstream}"#)),
        "the result is not the server's bytes: {}",
        &text[..text.len().min(400)]
    );
}

/// The answer (id 2) in a body: the JSON body itself, or its SSE event's data (the task's
/// status notifications may come first).
fn answer_text(body: &str) -> String {
    if body.starts_with('{') {
        return body.to_string();
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .find(|d| !d.contains(r#""method":"#) && d.contains(r#""id":2"#))
        .unwrap_or_else(|| panic!("no answer in {body}"))
        .to_string()
}
