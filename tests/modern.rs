//! MCP 2026-07-28 tasks (the extension `io.modelcontextprotocol/tasks`, issue 11) through
//! taskgate, against a scripted modern task server whose received requests are counted:
//! records for flat `CreateTaskResult`s (JSON and SSE), the spec's gates and HTTP statuses,
//! owner binding for `tasks/get|update|cancel`, one upstream cancel, the terminal ack, terminal
//! statuses that stay final, terminal results served from the record, and the record surviving
//! SIGKILL. Only the wire, `/admin` and `/metrics` are asserted.

use crate::common::*;

use serde_json::{json, Value};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------------------------

/// A flat `CreateTaskResult` is recorded (era modern, ttl `null` capped), listed in
/// `/admin/tasks`, and the next `tasks/get` reaches the upstream and answers.
#[tokio::test]
async fn a_modern_task_is_recorded_and_reachable() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_ttl_ms = 3600000")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let r = tg
        .record(&t)
        .expect("the task is recorded before the reply");
    assert_eq!(r.ttl_ms, Some(3_600_000), "ttlMs null is capped");
    let (_, list) = tg.admin("/admin/tasks").await;
    let row = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["task_id"] == json!(t))
        .cloned()
        .unwrap_or_default();
    assert_eq!(row["era"], "modern", "{list}");
    let (status, v) = task_call(&url, None, 2, "tasks/get", &t).await;
    assert_eq!(
        (status, v["result"]["status"].clone()),
        (200, json!("working")),
        "{v}"
    );
    assert_eq!(count(&up, "tasks/get"), 1);
}

/// A `CreateTaskResult` inside an SSE stream is recorded before its event is relayed, and a
/// `notifications/tasks` on the same stream updates the record.
#[tokio::test]
async fn sse_creation_and_notifications_update_the_record() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let t = create(&tg.mcp_url(), None, "sse_tool").await;
    assert!(
        tg.record(&t).is_some(),
        "recorded before the event reached the client"
    );
    let done = eventually(STEP, || async {
        tg.record(&t)
            .filter(|r| r.status == taskgate::mcp::task::TaskStatus::Completed)
    })
    .await;
    assert!(done.is_some(), "notifications/tasks applied");
    let _ = up;
}

/// Break-tasks H4 and the refused leftover: a `notifications/tasks` the server sends about its
/// new task before the `CreateTaskResult` is held until that answer was recorded and passed, then
/// passed (the client never learns a `taskId` before its record exists); no message about a task
/// refused over `tasks.max_live_tasks_per_owner` reaches the client, before the refusal or
/// after. On the old code the client saw the early `working` first and, for the refused task,
/// both notifications carrying its id.
#[tokio::test]
async fn a_task_is_never_named_to_the_client_before_its_record_nor_when_refused() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let url = tg.mcp_url();
    let call = |id: u64| {
        modern_req(
            &url,
            None,
            id,
            "tools/call",
            json!({"name": "sse_early_tool", "arguments": {}}),
        )
    };
    let events = |text: &str| -> Vec<Value> {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    };

    // Recorded: the answer first, then the early `working`, then the end.
    let text = call(1).send().await.text().await;
    let seen = events(&text);
    assert_eq!(seen[0]["id"], json!(1), "the answer comes first: {text}");
    let t = seen[0]["result"]["taskId"].as_str().unwrap().to_string();
    assert!(tg.record(&t).is_some(), "{text}");
    let statuses: Vec<_> = seen
        .iter()
        .filter(|m| m["method"] == "notifications/tasks")
        .map(|m| (m["params"]["taskId"].clone(), m["params"]["status"].clone()))
        .collect();
    assert_eq!(
        statuses,
        vec![(json!(t), json!("working")), (json!(t), json!("completed"))],
        "{text}"
    );

    // That task ended; with one live task the owner is at its limit: the next task the server
    // makes is refused, and no message on its stream names it.
    create(&url, None, "slow_compute").await;
    let text = call(2).send().await.text().await;
    let seen = events(&text);
    let refused = seen
        .iter()
        .find(|m| m["id"] == json!(2))
        .unwrap_or_else(|| panic!("no answer: {text}"));
    assert_eq!(refused["error"]["code"], -32029, "{text}");
    let over = up
        .first_cancelled_task(STEP)
        .await
        .expect("the refused task is cancelled upstream");
    assert!(
        !text.contains(&over),
        "the refused task's id reached the client: {text}"
    );
    assert_eq!(seen.len(), 1, "only the refusal: {text}");
}

/// A `CreateTaskResult` whose `taskId` is not a string names no task taskgate could record (nor
/// one a client could ask about or cancel): the client gets `-32603` saying so, not the
/// unrecorded "task". On the old code it was handed out unrecorded (break-edge F5).
#[tokio::test]
async fn a_create_task_result_without_a_string_task_id_is_not_handed_out() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    // Not a string; and (cold test) an empty one, and one holding NUL, which PostgreSQL cannot
    // store: before, they were recorded on sled and a store failure on PostgreSQL.
    for arguments in [
        json!({}),
        json!({"taskId": ""}),
        json!({"taskId": "a\u{0}b"}),
    ] {
        let req = modern_req(
            &tg.mcp_url(),
            None,
            1,
            "tools/call",
            json!({"name": "bad_task", "arguments": arguments}),
        );
        let (status, v) = send(req).await;
        assert_eq!((status, err_code(&v)), (200, -32603), "{arguments}: {v}");
        assert!(err_message(&v).contains("CreateTaskResult"), "{v}");
        assert!(v.get("result").is_none(), "{v}");
    }
    let (_, list) = tg.admin("/admin/tasks").await;
    assert_eq!(list["tasks"], json!([]), "{list}");
}

/// `tasks.max_live_tasks_per_owner` holds for the tasks a 2026-07-28 server makes of plain
/// calls: at the limit, a `tools/call` the server answers with a live `CreateTaskResult` gets
/// `-32029` (HTTP 200, the limit's answer in both eras), the task is cancelled upstream once
/// and never recorded; plain answers pass at the limit; a task that ends frees a slot. Before
/// the fix the third task was recorded and handed out (the owner then had 3 live tasks).
#[tokio::test]
async fn a_task_the_server_makes_over_the_owner_limit_is_cancelled_and_refused() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 2")
        .start()
        .await;
    let url = tg.mcp_url();
    let t1 = create(&url, None, "slow_compute").await;
    create(&url, None, "slow_compute").await;
    let call = |id: u64, tool: &str| call_tool(&url, id, tool);
    // A plain answer is not a task: not limited.
    let (status, v) = send(call(3, "plain_tool")).await;
    assert_eq!(
        (status, v["result"]["resultType"].clone()),
        (200, json!("complete")),
        "{v}"
    );

    let (status, v) = send(call(4, "slow_compute")).await;
    assert_eq!((status, err_code(&v)), (200, -32029), "{v}");
    assert_eq!(v["id"], json!(4), "{v}");
    assert!(
        err_message(&v).contains("max_live_tasks_per_owner"),
        "the message says what happened: {v}"
    );
    let over = up
        .first_cancelled_task(STEP)
        .await
        .expect("the task the server made over the limit is cancelled upstream");
    assert_eq!(state.lock().unwrap().tasks[&over], "cancelled");
    assert!(tg.record(&over).is_none(), "never recorded");
    // The SSE form of a creation is refused the same way.
    let (status, v) = send(call(5, "sse_tool")).await;
    assert_eq!((status, err_code(&v)), (200, -32029), "{v}");
    eventually(STEP, || async {
        (up.received("tasks/cancel").len() == 2).then_some(())
    })
    .await
    .expect("the SSE creation's task is cancelled upstream too");

    // One task ends: the owner may have another.
    state
        .lock()
        .unwrap()
        .tasks
        .insert(t1.clone(), "completed".into());
    let (_, v) = task_call(&url, None, 6, "tasks/get", &t1).await;
    assert_eq!(v["result"]["status"], "completed", "{v}");
    let t4 = create(&url, None, "slow_compute").await;
    assert!(tg.record(&t4).is_some());
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_task_creation_refused_total",
            &[("reason", "owner_limit")]
        ),
        2.0,
        "{m}"
    );
    assert_eq!(count(&up, "tasks/cancel"), 2, "one cancel per refused task");
}

// ---------------------------------------------------------------------------------------------
// Gates and HTTP statuses
// ---------------------------------------------------------------------------------------------

/// The spec's order: Mcp-Name ≠ taskId → -32020 (at the edge, before anything else);
/// no extension → -32021 (data.requiredCapabilities); unknown taskId → -32602; all HTTP 400; tasks/result and tasks/list → -32601 with 404.
/// None reaches the upstream; each is counted as a local answer, not as `ok`.
#[tokio::test]
async fn gates_come_first_with_their_http_statuses() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;

    let no_ext = modern_req(
        &url,
        None,
        2,
        "tasks/get",
        json!({"taskId": t, "_meta": meta(false)}),
    );
    let (status, v) = send(no_ext).await;
    assert_eq!((status, err_code(&v)), (400, -32021), "{v}");
    assert!(
        v["error"]["data"]["requiredCapabilities"]["extensions"][EXT].is_object(),
        "{v}"
    );

    let mismatch = modern_req(&url, None, 3, "tasks/cancel", json!({"taskId": t}))
        .without("mcp-name")
        .header("mcp-name", "other");
    let (status, v) = send(mismatch).await;
    assert_eq!((status, err_code(&v)), (400, -32020), "{v}");
    let encoded = format!("=?base64?{}?=", base64_of("other"));
    let mismatch = modern_req(&url, None, 4, "tasks/update", json!({"taskId": t}))
        .without("mcp-name")
        .header("mcp-name", &encoded);
    let (status, v) = send(mismatch).await;
    assert_eq!((status, err_code(&v)), (400, -32020), "{v}");
    // A missing Mcp-Name passes (FastMCP 4 accepts it; fastmcp.Client 4 sends none).
    let missing =
        modern_req(&url, None, 5, "tasks/update", json!({"taskId": t})).without("mcp-name");
    let (status, v) = send(missing).await;
    assert_eq!(
        (status, v["result"]["resultType"].clone()),
        (200, json!("complete")),
        "{v}"
    );

    for (i, m) in ["tasks/get", "tasks/update", "tasks/cancel"]
        .iter()
        .enumerate()
    {
        let (status, v) = task_call(&url, None, 10 + i as u64, m, "never-recorded").await;
        assert_eq!((status, err_code(&v)), (400, -32602), "{m}: {v}");
    }
    for m in ["tasks/result", "tasks/list"] {
        let (status, v) = task_call(&url, None, 20, m, &t).await;
        assert_eq!((status, err_code(&v)), (404, -32601), "{m}: {v}");
    }
    assert_eq!(
        count(&up, "tasks/update"),
        1,
        "only the one with a matching name"
    );
    for m in ["tasks/get", "tasks/cancel", "tasks/result", "tasks/list"] {
        assert_eq!(count(&up, m), 0, "{m} reached the upstream");
    }
    let text = tg.metrics_text().await;
    assert_eq!(
        metric(
            &text,
            "taskgate_local_answers_total",
            &[("upstream", "default"), ("reason", "missing_extension")]
        ),
        1.0
    );
    // Header mismatches are refused at the edge, before any layer (issue 37 #2).
    assert_eq!(
        metric(
            &text,
            "taskgate_http_rejections_total",
            &[("reason", "header_mismatch")]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &text,
            "taskgate_local_answers_total",
            &[("upstream", "default"), ("reason", "task_not_found")]
        ),
        3.0
    );
    assert_eq!(
        metric(
            &text,
            "taskgate_local_answers_total",
            &[("upstream", "default"), ("reason", "method_not_found")]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &text,
            "taskgate_requests_total",
            &[
                ("upstream", "default"),
                ("method", "tasks/update"),
                ("outcome", "ok")
            ]
        ),
        1.0,
        "only the forwarded one"
    );
    assert_eq!(
        metric(
            &text,
            "taskgate_requests_total",
            &[
                ("upstream", "default"),
                ("method", "tasks/update"),
                ("outcome", "local")
            ]
        ),
        1.0
    );
}

// ---------------------------------------------------------------------------------------------
// Owner binding
// ---------------------------------------------------------------------------------------------

/// Principal B gets -32602 for tasks/get, tasks/update and tasks/cancel on A's task; the
/// upstream sees none of them; A still reaches it.
#[tokio::test]
async fn another_principal_cannot_touch_a_task() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .token("bob", "tok-b")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, Some("tok-a"), "slow_compute").await;
    for (i, m) in ["tasks/get", "tasks/update", "tasks/cancel"]
        .iter()
        .enumerate()
    {
        let (status, v) = task_call(&url, Some("tok-b"), 2 + i as u64, m, &t).await;
        assert_eq!((status, err_code(&v)), (400, -32602), "{m}: {v}");
    }
    for m in ["tasks/get", "tasks/update", "tasks/cancel"] {
        assert_eq!(count(&up, m), 0, "{m} of bob reached the upstream");
    }
    let (status, v) = task_call(&url, Some("tok-a"), 9, "tasks/update", &t).await;
    assert_eq!(
        (status, v["result"]["resultType"].clone()),
        (200, json!("complete")),
        "{v}"
    );
    assert_eq!(count(&up, "tasks/update"), 1);
}

/// 2026-07-28 has no sessions: a client's `Mcp-Session-Id` on a 2026 request is ignored
/// (spec §2.2: "ignore it, never mint one"), not checked against the session table (with
/// authentication an id taskgate never issued was 404 `-32001`) nor sent upstream (where a
/// dual-era server takes a session id for the legacy era, §2.4). On the old code: 404 with
/// auth, and the header reached the upstream without.
#[tokio::test]
async fn a_2026_request_ignores_a_session_id() {
    let (up, _) = modern_server().await;
    for auth in [true, false] {
        let tg = match auth {
            true => TgConfig::new(&up.url()).token("alice", "tok-a"),
            false => TgConfig::new(&up.url()),
        }
        .start()
        .await;
        let token = auth.then_some("tok-a");
        let r = modern_req(&tg.mcp_url(), token, 1, "tools/list", json!({}))
            .header("mcp-session-id", "a-session-nobody-issued");
        let (status, v) = send(r).await;
        assert_eq!(status, 200, "auth {auth}: {v}");
        assert!(v["result"]["tools"].is_array(), "auth {auth}: {v}");
    }
    // Nor judged: a malformed one (empty, a list) is ignored too (review 20 #7: 400).
    let tg = TgConfig::new(&up.url()).start().await;
    for bad in ["a,b", ""] {
        let r = modern_req(&tg.mcp_url(), None, 1, "tools/list", json!({}))
            .header("mcp-session-id", bad);
        let (status, v) = send(r).await;
        assert_eq!(status, 200, "session id {bad:?}: {v}");
    }
    let sent: Vec<_> = up
        .requests()
        .into_iter()
        .filter_map(|r| r.header("mcp-session-id"))
        .collect();
    assert!(sent.is_empty(), "a session id went upstream: {sent:?}");
}

/// A server that reports another principal's task on bob's stream (a `notifications/tasks`
/// with alice's task, its result included) does not show it to bob, and the report is not
/// applied to alice's record (she never got it); alice's own call reporting it passes and is
/// applied. On the old code bob got alice's result and her record turned `completed`.
#[tokio::test]
async fn another_principals_task_notification_does_not_reach_a_caller() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .token("bob", "tok-b")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, Some("tok-a"), "slow_compute").await;
    let notify = |token: &str, id: u64| {
        modern_req(
            &url,
            Some(token),
            id,
            "tools/call",
            json!({"name": "notify_about", "arguments": {"taskId": t}}),
        )
    };
    let text = notify("tok-b", 2).send().await.text().await;
    assert!(!text.contains(&t), "alice's task reached bob: {text}");
    assert!(
        text.contains(r#""id":2"#),
        "bob's own answer passes: {text}"
    );
    assert_eq!(
        tg.record(&t).unwrap().status,
        taskgate::mcp::task::TaskStatus::Working,
        "a report on bob's stream is not applied to alice's task"
    );
    let text = notify("tok-a", 3).send().await.text().await;
    assert!(
        text.contains(&t),
        "alice sees her own task's report: {text}"
    );
    assert_eq!(
        tg.record(&t).unwrap().status,
        taskgate::mcp::task::TaskStatus::Completed
    );
}

/// Without auth (2026-07-28: no owner, the unguessable `taskId` is the only key), a task's
/// notification reaches only a stream whose request named the task: a listener that named it
/// gets it; another listener, or a plain call's stream, that did not is not handed the id and
/// its result, and the report is not applied. On the old code every anonymous stream the
/// upstream sent it to passed it on (review 16, R4).
#[tokio::test]
async fn without_auth_a_tasks_notification_reaches_only_a_stream_that_named_it() {
    let state: Shared = Default::default();
    let modern = modern_handler(state.clone());
    let known = state.clone();
    // A server that sends every listener a `notifications/tasks` about every task it has.
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        if v["method"] != "subscriptions/listen" {
            return modern(req);
        }
        let mut steps = Vec::new();
        for t in known.lock().unwrap().tasks.keys() {
            let note = json!({"jsonrpc":"2.0","method":"notifications/tasks",
                "params": detailed(t, "completed")});
            steps.push(SseStep::Raw(ev().data(&note.to_string()).wire()));
        }
        let done = json!({"resultType": "complete"});
        steps.push(SseStep::Raw(
            ev().data(&rpc_result(&req.rpc_id_json(), &done.to_string()))
                .wire(),
        ));
        ScriptedResponse::sse(steps)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let listen = |id: u64, ids: Value| {
        modern_req(
            &url,
            None,
            id,
            "subscriptions/listen",
            json!({"notifications": {"taskIds": ids}, "_meta": meta(true)}),
        )
    };
    let text = listen(2, json!([])).send().await.text().await;
    assert!(
        !text.contains(&t),
        "a task the listener did not name: {text}"
    );
    assert!(
        text.contains(r#""id":2"#),
        "the listen's own answer: {text}"
    );
    let notify = modern_req(
        &url,
        None,
        3,
        "tools/call",
        json!({"name": "notify_about", "arguments": {"taskId": t}}),
    );
    let text = notify.send().await.text().await;
    assert!(!text.contains(&t), "a plain call's stream: {text}");
    assert_eq!(
        tg.record(&t).unwrap().status,
        taskgate::mcp::task::TaskStatus::Working,
        "reports on streams that did not name the task are not applied"
    );
    let text = listen(4, json!([t])).send().await.text().await;
    assert!(text.contains(&t), "the listener that named it: {text}");
    assert_eq!(
        tg.record(&t).unwrap().status,
        taskgate::mcp::task::TaskStatus::Completed
    );
}

/// A `tasks/get` answer about another task than the one asked about (an upstream that mixed up
/// its tasks: here alice's, completed, with its result) is not passed on nor applied: bob gets
/// `-32603` saying so, his task stays `working` with no result kept, and the next `tasks/get`
/// asks the upstream again. On the old code bob got alice's result, his record turned
/// `completed` and kept it, and later polls were answered from it (break-edge F2b).
#[tokio::test]
async fn a_tasks_get_answer_about_another_task_is_not_passed_on() {
    let state: Shared = Default::default();
    let modern = modern_handler(state.clone());
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        if v["method"] == "tasks/get" {
            return ScriptedResponse::json(rpc_result(
                &req.rpc_id_json(),
                &detailed("alice-task", "completed").to_string(),
            ));
        }
        modern(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    for id in [2, 3] {
        let (status, v) = task_call(&url, None, id, "tasks/get", &t).await;
        assert_eq!((status, err_code(&v)), (200, -32603), "{v}");
        assert!(err_message(&v).contains("another task"), "{v}");
        assert!(!v.to_string().contains("alice-task"), "{v}");
    }
    assert_eq!(
        count(&up, "tasks/get"),
        2,
        "nothing was answered from the record"
    );
    let r = tg.record(&t).unwrap();
    assert_eq!(r.status, taskgate::mcp::task::TaskStatus::Working);
    assert!(r.terminal_result.is_none());
}

/// A 2026-07-28 upstream whose `tools/call` answers misbehave as the tool says (see
/// `misbehaving_2026`); everything else as `modern_handler` answers it.
async fn misbehaving_2026_server() -> Upstream {
    let modern = modern_handler(Shared::default());
    Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        match (v["method"].as_str(), v["params"]["name"].as_str()) {
            (Some("tools/call"), Some(tool)) => {
                misbehaving_2026(req, tool).unwrap_or_else(|| modern(req))
            }
            _ => modern(req),
        }
    })
    .await
}

/// `badjson`, `empty`, `wrongid`, `truncated_sse` (see `edge_transport`'s `misbehaving`), and
/// `twice`: an SSE stream with two `CreateTaskResult`s for the request.
fn misbehaving_2026(req: &RecordedRequest, tool: &str) -> Option<ScriptedResponse> {
    let id = req.rpc_id_json();
    let task = |t: &str| {
        let mut created = detailed(t, "working");
        created["resultType"] = json!("task");
        ev().data(&rpc_result(&id, &created.to_string())).into()
    };
    Some(match tool {
        "badjson" => ScriptedResponse::json(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":["#
        )),
        "empty" => ScriptedResponse::status(200, Some("application/json"), ""),
        "wrongid" => ScriptedResponse::json(rpc_result(
            r#""not-yours""#,
            r#"{"resultType":"complete","content":[]}"#,
        )),
        "truncated_sse" => ScriptedResponse::sse(vec![SseStep::Raw(format!(
            "data: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"res\n"
        ))]),
        "twice" => ScriptedResponse::sse(vec![task("first-task"), task("second-task")]),
        // A CreateTaskResult under another id than the request's: as JSON, and as the only
        // event of a stream.
        "wrongid_task" | "wrongid_task_sse" => {
            let t = format!("stray-{tool}");
            let mut created = detailed(&t, "working");
            created["resultType"] = json!("task");
            let answer = rpc_result(r#""not-yours""#, &created.to_string());
            match tool {
                "wrongid_task" => ScriptedResponse::json(answer),
                _ => ScriptedResponse::sse(vec![ev().data(&answer).into()]),
            }
        }
        // The 2025-11-25 nested CreateTaskResult (no `resultType`) to a 2026-07-28 call.
        "nested_task" => ScriptedResponse::json(rpc_result(
            &id,
            &json!({"task": {"taskId": "nested-2", "status": "working", "ttl": 60000}}).to_string(),
        )),
        // The same with a taskId that is not a string: no task anyone can name.
        "nested_numeric" => ScriptedResponse::json(rpc_result(
            &id,
            &json!({"task": {"taskId": 5, "status": "working", "ttl": 60000}}).to_string(),
        )),
        // A plain CallToolResult (no `resultType`: a legacy result counts as `complete`) that
        // carries an extra top-level `task` object of its own (a to-do tool's new item).
        "task_field" => ScriptedResponse::json(rpc_result(
            &id,
            &json!({"content": [{"type": "text", "text": "filed"}],
                "task": {"taskId": "todo-7", "title": "buy milk"}})
            .to_string(),
        )),
        // Both ends intact, broken inside (a trailing comma): a CreateTaskResult nobody can read.
        "badjson_ends" => ScriptedResponse::json(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"resultType":"task","taskId":"leak-1","status":"working",}}}}"#
        )),
        // 17 notifications about the new task before its answer: one more than are held.
        "many_early" => {
            let mut steps: Vec<SseStep> = (0..17)
                .map(|n| {
                    let mut d = detailed("early-1", "working");
                    d["statusMessage"] = json!(format!("n{n}"));
                    let note = json!({"jsonrpc":"2.0","method":"notifications/tasks","params": d});
                    SseStep::Raw(ev().data(&note.to_string()).wire())
                })
                .collect();
            steps.push(task("early-1"));
            ScriptedResponse::sse(steps)
        }
        // A notification about a new task, then a JSON-RPC error answer.
        "early_then_error" => {
            let note = json!({"jsonrpc":"2.0","method":"notifications/tasks",
                "params": detailed("orphan-2", "working")});
            let error = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32603,"message":"tool crashed"}}}}"#
            );
            ScriptedResponse::sse(vec![
                SseStep::Raw(ev().data(&note.to_string()).wire()),
                SseStep::Raw(ev().data(&error).wire()),
            ])
        }
        // A notification about a new task, then the stream ends without the answer.
        "early_then_end" => {
            let note = json!({"jsonrpc":"2.0","method":"notifications/tasks",
                "params": detailed("orphan-1", "working")});
            ScriptedResponse::sse(vec![SseStep::Raw(ev().data(&note.to_string()).wire())])
        }
        _ => return None,
    })
}

/// What is not the answer to a 2026-07-28 `tools/call` is an invalid answer (break-edge F3): a
/// JSON body that is not JSON, an empty body or a result under another id gets HTTP 502 with
/// `-32603` under the client's id naming the upstream, a stream that ends without the answer a
/// `-32603` event for the request; each counted in
/// `taskgate_upstream_errors_total{kind="protocol"}`. Two `CreateTaskResult`s on one stream
/// (F4): only the first reaches the client, and it is the one recorded. On the old code every
/// one of these reached the client as it came (200), and the second task id went out
/// unrecorded.
#[tokio::test]
async fn invalid_answers_to_a_2026_call_are_upstream_errors() {
    let up = misbehaving_2026_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let call = |id: u64, tool: &str| call_tool(&url, id, tool);
    for (id, (tool, says)) in [
        ("badjson", "not JSON"),
        ("empty", "empty body"),
        ("wrongid", "\"not-yours\""),
        ("truncated_sse", "without a response"),
    ]
    .into_iter()
    .enumerate()
    {
        let id = id as u64 + 1;
        let (status, v) = send(call(id, tool)).await;
        let want_status = if tool == "truncated_sse" { 200 } else { 502 };
        assert_eq!((status, err_code(&v)), (want_status, -32603), "{tool}: {v}");
        assert_eq!(v["id"], json!(id), "{tool}: {v}");
        let message = err_message(&v);
        assert!(
            message.contains("upstream `default` sent an invalid response")
                && message.contains(says),
            "{tool}: {v}"
        );
    }
    let text = call(9, "twice").send().await.text().await;
    assert!(text.contains("first-task"), "{text}");
    assert!(
        !text.contains("second-task"),
        "the second task went out: {text}"
    );
    assert!(tg.record("first-task").is_some(), "the first is recorded");
    let (_, list) = tg.admin("/admin/tasks").await;
    assert_eq!(list["tasks"].as_array().map(Vec::len), Some(1), "{list}");
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_upstream_errors_total",
            &[("kind", "protocol")]
        ),
        5.0,
        "{m}"
    );
}

/// A `CreateTaskResult` under another id than the `tools/call`'s is not its answer (break-edge
/// F3): the client gets HTTP 502 `-32603` (JSON) or a `-32603` event without the stray one
/// (SSE), nothing is recorded, and the upstream gets a `tasks/cancel` for the task it named.
/// On the code before, that task was left running upstream, and the stream passed the stray
/// event naming it.
#[tokio::test]
async fn a_creation_answered_under_another_id_is_cancelled_upstream() {
    let up = misbehaving_2026_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let call = |id: u64, tool: &str| call_tool(&url, id, tool);
    let (status, v) = send(call(1, "wrongid_task")).await;
    assert_eq!((status, err_code(&v)), (502, -32603), "{v}");
    assert!(err_message(&v).contains("\"not-yours\""), "{v}");
    let text = call(2, "wrongid_task_sse").send().await.text().await;
    assert!(!text.contains("stray-"), "an unrecorded task's id: {text}");
    assert!(text.contains("-32603"), "{text}");
    assert!(
        up.wait_for_method("tasks/cancel", 2, Duration::from_secs(10))
            .await,
        "each stray task is cancelled upstream"
    );
    let mut cancelled: Vec<String> = up
        .received("tasks/cancel")
        .iter()
        .map(|r| {
            r.json()["params"]["taskId"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    cancelled.sort();
    assert_eq!(cancelled, ["stray-wrongid_task", "stray-wrongid_task_sse"]);
    for t in &cancelled {
        assert!(tg.record(t).is_none(), "{t} is not recorded");
    }
}

/// A 2026-07-28 call answered with the 2025-11-25 nested `CreateTaskResult` names a task the
/// 2026 client cannot follow (`tasks/get` of an id never recorded is refused): `-32603`
/// "malformed CreateTaskResult", nothing recorded, the task cancelled upstream once. On the code
/// before, the answer passed as it came (a result without `resultType`, read as `complete`) and
/// the task ran on upstream, never cancelled.
#[tokio::test]
async fn a_2025_shaped_creation_to_a_2026_call_is_refused_and_cancelled() {
    let up = misbehaving_2026_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (status, v) = send(call_tool(&tg.mcp_url(), 1, "nested_task")).await;
    assert_eq!(err_code(&v), -32603, "{v}");
    assert_eq!(
        status, 200,
        "README: 200, as any malformed CreateTaskResult"
    );
    // What was wrong with it: not "no string taskId, or no status" (it has both).
    assert!(err_message(&v).contains("other protocol era"), "{v}");
    assert!(
        up.wait_for_method("tasks/cancel", 1, Duration::from_secs(5))
            .await,
        "the task it named is cancelled upstream"
    );
    let cancel = up.received("tasks/cancel").pop().unwrap();
    assert_eq!(cancel.json()["params"]["taskId"], "nested-2");
    assert!(tg.record("nested-2").is_none());
}

/// The 2025-11-25 nested `CreateTaskResult` whose taskId is not a string is refused as the
/// README's table says for any `CreateTaskResult` without a string taskId (nothing to cancel):
/// it passed on as a plain result (`resultType` absent reads `complete`), a creation shown to a
/// 2026 client as a tool's result.
#[tokio::test]
async fn a_2025_shaped_creation_without_a_string_task_id_is_refused() {
    let up = misbehaving_2026_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (status, v) = send(call_tool(&tg.mcp_url(), 1, "nested_numeric")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(err_code(&v), -32603, "{v}");
    assert!(
        err_message(&v).contains("malformed CreateTaskResult"),
        "{v}"
    );
    assert!(
        !up.wait_for_method("tasks/cancel", 1, Duration::from_millis(300))
            .await,
        "no id to cancel"
    );
}

/// A plain 2026-07-28 tool result (no `resultType`) that carries a top-level `task` object of
/// its own (with a `taskId`) is a result, not the 2025-11-25 nested `CreateTaskResult`: that
/// one has no `content`, which a `CallToolResult` must have. The client gets the result as it
/// came, and nothing named in it is cancelled upstream. Broken by c6a4e51: `-32603`
/// "malformed CreateTaskResult" (the tool's work lost) and a `tasks/cancel` of `todo-7` sent
/// upstream.
#[tokio::test]
async fn a_plain_2026_result_with_a_task_field_is_a_result() {
    let up = misbehaving_2026_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (status, v) = send(call_tool(&tg.mcp_url(), 1, "task_field")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["content"][0]["text"], "filed", "{v}");
    assert_eq!(v["result"]["task"]["taskId"], "todo-7", "{v}");
    assert!(
        !up.wait_for_method("tasks/cancel", 1, Duration::from_millis(500))
            .await,
        "nothing is cancelled upstream"
    );
    assert!(tg.record("todo-7").is_none());
}

// ---------------------------------------------------------------------------------------------
// Cancel
// ---------------------------------------------------------------------------------------------

/// An upstream's error to a 2026-07-28 `tasks/cancel` (here `-32602`: it lost the task) reaches
/// the caller with the HTTP status that code has in 2026-07-28 (400), as an error passed on
/// as it came does. On the old code the single flight answered it with 200 (break-tasks M6).
#[tokio::test]
async fn a_cancels_upstream_error_keeps_its_2026_status() {
    let state: Shared = Default::default();
    let modern = modern_handler(state.clone());
    let up = Upstream::start(move |req: &RecordedRequest| {
        if req.json()["method"] == "tasks/cancel" {
            return ScriptedResponse::status(
                400,
                Some("application/json"),
                format!(
                    r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32602,"message":"Task not found"}}}}"#,
                    req.rpc_id_json()
                ),
            );
        }
        modern(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let (status, v) = task_call(&url, None, 2, "tasks/cancel", &t).await;
    assert_eq!((status, err_code(&v)), (400, -32602), "{v}");
}

/// A 2026-07-28 client that hangs up on its `tools/call` cancels it (the spec: closing the
/// stream is the cancel of a plain call): the upstream exchange ends with it, also though the
/// server might have made the call a task (only a call the client asked to run as a task runs
/// to its answer: `tests/cancel.rs`).
#[tokio::test]
async fn a_2026_client_hanging_up_ends_its_call_upstream() {
    let gate = Gate::new();
    let g = gate.clone();
    let state: Shared = Default::default();
    let modern = modern_handler(state);
    let up = Upstream::start(move |req: &RecordedRequest| {
        if req.json()["method"] == "tools/call" {
            let done = rpc_result(
                &req.rpc_id_json(),
                r#"{"resultType":"complete","content":[]}"#,
            );
            return ScriptedResponse::sse(vec![
                SseStep::Wait(g.clone()),
                SseStep::Raw(ev().data(&done).wire()),
            ]);
        }
        modern(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let req = modern_req(
        &tg.mcp_url(),
        None,
        1,
        "tools/call",
        json!({"name": "slow_compute", "arguments": {}}),
    );
    let r = req.send().await;
    assert_eq!(r.status(), 200);
    drop(r);
    assert!(
        up.wait_for_sse_disconnects(1, STEP).await,
        "the upstream exchange ended with the client's"
    );
    gate.open();
}

/// 200 concurrent identical tasks/cancel: exactly one reaches the upstream, every caller gets
/// the ack under its own id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cancels_send_one() {
    let (up, state) = modern_server().await;
    state.lock().unwrap().cancel_delay = Duration::from_millis(300);
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let mut calls = Vec::new();
    for i in 0..200u64 {
        let (url, t) = (url.clone(), t.clone());
        calls.push(tokio::spawn(async move {
            task_call(&url, None, 1000 + i, "tasks/cancel", &t).await
        }));
    }
    for (i, c) in calls.into_iter().enumerate() {
        let (status, v) = c.await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["id"], json!(1000 + i as u64));
        assert_eq!(v["result"], json!({"resultType":"complete"}), "{v}");
    }
    assert_eq!(count(&up, "tasks/cancel"), 1);
}

/// A cancel of a task recorded terminal is acknowledged without calling the upstream, and
/// counted `outcome="acknowledged_terminal"` (the code before counted it `rejected_terminal`).
#[tokio::test]
async fn cancel_of_a_terminal_task_is_acked_here() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    state
        .lock()
        .unwrap()
        .tasks
        .insert(t.clone(), "completed".into());
    let (_, v) = task_call(&url, None, 2, "tasks/get", &t).await;
    assert_eq!(v["result"]["status"], "completed", "{v}");
    let (status, v) = task_call(&url, None, 3, "tasks/cancel", &t).await;
    assert_eq!(
        (status, v["result"].clone()),
        (200, json!({"resultType":"complete"})),
        "{v}"
    );
    assert_eq!(count(&up, "tasks/cancel"), 0);
    // Counted as what it is (break-tasks L7: it was `rejected_terminal`).
    let m = tg.metrics_text().await;
    let outcome = |o: &str| metric(&m, "taskgate_cancel_requests_total", &[("outcome", o)]);
    assert_eq!(outcome("acknowledged_terminal"), 1.0, "{m}");
    assert_eq!(outcome("rejected_terminal"), 0.0, "{m}");
    // The ack is recorded as "cancel requested"; the status stays completed.
    let (_, events) = audit_events(&tg, &t).await;
    assert!(
        events.contains(&"cancel_requested".to_string()),
        "{events:?}"
    );
    assert!(
        !events.contains(&"status_cancelled".to_string()),
        "{events:?}"
    );
    let (_, v) = task_call(&url, None, 4, "tasks/get", &t).await;
    assert_eq!(v["result"]["status"], "completed", "{v}");
}

/// The "cancel requested" audit fact is recorded once per task: concurrent cancels (one goes
/// upstream, the rest share its ack) and any number of later acks of the terminal task leave
/// one `cancel_requested` event, so an owner cannot grow its task's durable record by
/// repeating `tasks/cancel` (break-tasks M5: one event per cancel, without bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_cancels_record_cancel_requested_once() {
    let (up, state) = modern_server().await;
    state.lock().unwrap().cancel_delay = Duration::from_millis(200);
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let mut calls = Vec::new();
    for i in 0..8u64 {
        let (url, t) = (url.clone(), t.clone());
        calls.push(tokio::spawn(async move {
            task_call(&url, None, 100 + i, "tasks/cancel", &t).await
        }));
    }
    for c in calls {
        let (status, v) = c.await.unwrap();
        assert_eq!(status, 200, "{v}");
    }
    assert_eq!(count(&up, "tasks/cancel"), 1);
    let (_, v) = task_call(&url, None, 2, "tasks/get", &t).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    let (_, before) = audit_events(&tg, &t).await;
    for i in 0..30u64 {
        let (status, v) = task_call(&url, None, 200 + i, "tasks/cancel", &t).await;
        assert_eq!(
            (status, v["result"].clone()),
            (200, json!({"resultType":"complete"})),
            "{v}"
        );
    }
    assert_eq!(count(&up, "tasks/cancel"), 1, "acked here, not forwarded");
    let (_, events) = audit_events(&tg, &t).await;
    let requested = events.iter().filter(|e| *e == "cancel_requested").count();
    assert_eq!(requested, 1, "{events:?}");
    assert_eq!(
        events.len(),
        before.len(),
        "later acks add nothing: {events:?}"
    );
}

/// A task completed before any cancel: its first acknowledged cancel records the fact, the
/// next ones do not repeat it.
#[tokio::test]
async fn acks_of_a_terminal_task_record_cancel_requested_once() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    state
        .lock()
        .unwrap()
        .tasks
        .insert(t.clone(), "completed".into());
    let (_, v) = task_call(&url, None, 2, "tasks/get", &t).await;
    assert_eq!(v["result"]["status"], "completed", "{v}");
    for i in 0..20u64 {
        let (status, v) = task_call(&url, None, 10 + i, "tasks/cancel", &t).await;
        assert_eq!(
            (status, v["result"].clone()),
            (200, json!({"resultType":"complete"})),
            "{v}"
        );
    }
    assert_eq!(count(&up, "tasks/cancel"), 0);
    let (_, events) = audit_events(&tg, &t).await;
    let requested = events.iter().filter(|e| *e == "cancel_requested").count();
    assert_eq!(requested, 1, "{events:?}");
}

/// break-tasks M3: after the upstream acknowledges a forwarded `tasks/cancel`, taskgate polls
/// the task once itself, so a client that forgets the task right after the ack (the spec allows
/// it) finds its slot free when the upstream cancelled it: the next creation is not refused
/// `-32029`. Still one upstream cancel per task.
#[tokio::test]
async fn a_cancel_and_forget_client_gets_its_slot_back() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let (status, v) = task_call(&url, None, 2, "tasks/cancel", &t).await;
    assert_eq!(
        (status, v["result"].clone()),
        (200, json!({"resultType":"complete"})),
        "{v}"
    );
    assert_eq!(state.lock().unwrap().tasks[&t], "cancelled");
    // No poll of the client's: the record already shows what the upstream made of it.
    let r = tg.record(&t).expect("record");
    assert_eq!(r.status, taskgate::mcp::task::TaskStatus::Cancelled);
    let next = create(&url, None, "slow_compute").await;
    assert_ne!(next, t);
    // Later cancels are acknowledged here.
    let (status, _) = task_call(&url, None, 3, "tasks/cancel", &t).await;
    assert_eq!(status, 200);
    assert_eq!(count(&up, "tasks/cancel"), 1);
    assert_eq!(count(&up, "tasks/get"), 1, "taskgate's one poll");
}

/// break-tasks M2 (2026-07-28): a server that restarted and forgot a task answers its
/// `tasks/get` with `-32602` (HTTP 400). taskgate ends the record (`failed`, saying the upstream
/// lost the task, "resources released" with `reason=upstream_lost`), answers the failed
/// `DetailedTask`, and the owner's slot is free again: the next creation is not refused
/// `-32029` for the rest of the ttl. A later cancel is the terminal ack, not forwarded.
#[tokio::test]
async fn a_task_the_upstream_forgot_is_failed_and_frees_its_slot() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    // The upstream restarts: its tasks are gone.
    state.lock().unwrap().tasks.clear();
    let (status, v) = task_call(&url, None, 2, "tasks/get", &t).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["status"], "failed", "{v}");
    assert_eq!(v["result"]["taskId"], json!(t), "{v}");
    assert_eq!(v["result"]["error"]["code"], -32603, "{v}");
    assert!(
        v["result"]["statusMessage"]
            .as_str()
            .is_some_and(|m| m.contains("no longer has this task")),
        "{v}"
    );
    let r = tg.record(&t).expect("record");
    assert_eq!(r.status, taskgate::mcp::task::TaskStatus::Failed);
    assert!(r.released_at.is_some());
    let (d, events) = audit_events(&tg, &t).await;
    assert!(events.contains(&"resources_released".to_string()), "{d}");
    assert!(d.to_string().contains("reason=upstream_lost"), "{d}");
    let text = tg.metrics_text().await;
    assert_eq!(
        metric(
            &text,
            "taskgate_task_resources_released_total",
            &[("upstream", "default"), ("reason", "upstream_lost")]
        ),
        1.0
    );
    // The slot is free.
    let again = create(&url, None, "slow_compute").await;
    assert_ne!(again, t);
    // The next get is answered from the record; a cancel is the terminal ack.
    let (status, v) = task_call(&url, None, 3, "tasks/get", &t).await;
    assert_eq!(
        (status, v["result"]["status"].clone()),
        (200, json!("failed"))
    );
    let (status, v) = task_call(&url, None, 4, "tasks/cancel", &t).await;
    assert_eq!(
        (status, v["result"].clone()),
        (200, json!({"resultType":"complete"})),
        "{v}"
    );
    // The client's and taskgate's own clean one that confirmed the -32602 (review 18a #1).
    assert_eq!(count(&up, "tasks/get"), 2);
    assert_eq!(count(&up, "tasks/cancel"), 0);
}

/// break-tasks M2 (2026-07-28) on a server that answers by SSE, as the TypeScript and Python
/// SDK servers do by default (errors included): its `-32602` event ends the record all the same
/// (review 17 #2: only a JSON answer was read, so the record stayed `working`, holding the
/// slot). The client gets the failed `DetailedTask` in that event.
#[tokio::test]
async fn a_task_the_upstream_forgot_answered_by_sse_is_failed_and_frees_its_slot() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    {
        let mut s = state.lock().unwrap();
        s.tasks.clear();
        s.sse_errors = true;
    }
    let (status, v) = task_call(&url, None, 2, "tasks/get", &t).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["status"], "failed", "{v}");
    assert_eq!(v["result"]["taskId"], json!(t), "{v}");
    assert_eq!(v["result"]["error"]["code"], -32603, "{v}");
    let r = tg.record(&t).expect("record");
    assert_eq!(r.status, taskgate::mcp::task::TaskStatus::Failed);
    assert!(r.released_at.is_some());
    let again = create(&url, None, "slow_compute").await;
    assert_ne!(again, t);
    // The client's and taskgate's own clean one that confirmed the -32602 (review 18a #1).
    assert_eq!(count(&up, "tasks/get"), 2);
}

/// A server that cancels cooperatively (2026-07-28 §1.6: the status may stay non-terminal after
/// the ack): it acknowledges the cancel and the task turns `cancelled` 200 ms later. taskgate
/// follows the task up after the ack, off the request path, so the owner's slot comes back with
/// no poll of the client's (review 17 #6: one poll right after the ack saw `working`, and the
/// record held the slot until someone polled or its ttl passed). Still one upstream cancel.
#[tokio::test]
async fn a_cooperative_cancel_frees_the_slot_with_no_client_poll() {
    let (up, state) = modern_server().await;
    state.lock().unwrap().cancel_after = Some(Duration::from_millis(200));
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let (status, v) = task_call(&url, None, 2, "tasks/cancel", &t).await;
    assert_eq!(
        (status, v["result"].clone()),
        (200, json!({"resultType":"complete"})),
        "{v}"
    );
    let cancelled = recorded_as(&tg, &t, taskgate::mcp::task::TaskStatus::Cancelled).await;
    assert!(cancelled.is_some(), "{:?}", tg.record(&t));
    let next = create(&url, None, "slow_compute").await;
    assert_ne!(next, t);
    assert_eq!(count(&up, "tasks/cancel"), 1);
    // The follow-up stopped at the terminal status.
    let polls = count(&up, "tasks/get");
    assert!((2..=6).contains(&polls), "{polls}");
}

/// break-tasks M2 (2026-07-28): the forgotten task's first request may be a `tasks/cancel`
/// (the upstream's `-32602`, HTTP 400, passed on as it came): the record is failed and the
/// slot freed the same way; the next cancel is the ack of a terminal task, not forwarded.
#[tokio::test]
async fn a_cancel_of_a_task_the_upstream_forgot_fails_it_and_frees_its_slot() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    state.lock().unwrap().tasks.clear();
    let (status, v) = task_call(&url, None, 2, "tasks/cancel", &t).await;
    assert_eq!((status, err_code(&v)), (400, -32602), "{v}");
    assert_eq!(
        tg.record(&t).expect("record").status,
        taskgate::mcp::task::TaskStatus::Failed
    );
    create(&url, None, "slow_compute").await;
    let (status, v) = task_call(&url, None, 3, "tasks/cancel", &t).await;
    assert_eq!(
        (status, v["result"].clone()),
        (200, json!({"resultType":"complete"})),
        "{v}"
    );
    assert_eq!(count(&up, "tasks/cancel"), 1);
}

/// 2026-07-28, results not kept (`tasks.max_stored_result_bytes = 0`, so a terminal task's
/// `tasks/get` goes upstream): a task recorded `cancelled` that the upstream then forgets (its
/// `tasks/get` answered `-32602`, HTTP 400, as JSON or as an SSE event) stays `cancelled`: the
/// client gets the cancelled `DetailedTask` from the record (HTTP 200), and the record is not
/// failed as lost. Before: the upstream's `-32602` reached the client.
#[tokio::test]
async fn a_cancelled_task_the_upstream_forgot_stays_cancelled() {
    for sse_errors in [false, true] {
        let (up, state) = modern_server().await;
        let tg = TgConfig::new(&up.url())
            .tasks("max_stored_result_bytes = 0")
            .start()
            .await;
        let url = tg.mcp_url();
        let t = create(&url, None, "slow_compute").await;
        let (_, v) = task_call(&url, None, 2, "tasks/cancel", &t).await;
        assert_eq!(v["result"]["resultType"], "complete", "{v}");
        let recorded = tg.record(&t).expect("record");
        assert_eq!(recorded.status, taskgate::mcp::task::TaskStatus::Cancelled);
        {
            let mut s = state.lock().unwrap();
            s.tasks.clear();
            s.sse_errors = sse_errors;
        }
        let asked = count(&up, "tasks/get");
        let (status, v) = task_call(&url, None, 3, "tasks/get", &t).await;
        assert_eq!(status, 200, "sse {sse_errors}: {v}");
        assert_eq!(v["id"], json!(3), "{v}");
        assert_eq!(v["result"]["status"], "cancelled", "sse {sse_errors}: {v}");
        assert_eq!(v["result"]["taskId"], json!(t), "{v}");
        assert_eq!(
            v["result"]["lastUpdatedAt"],
            json!(recorded.last_updated_at),
            "{v}"
        );
        assert!(v["result"].get("result").is_none(), "{v}");
        assert_eq!(
            count(&up, "tasks/get"),
            asked + 1,
            "the client's, forwarded"
        );
        let r = tg.record(&t).expect("record");
        assert_eq!(
            r.status,
            taskgate::mcp::task::TaskStatus::Cancelled,
            "not failed"
        );
    }
}

/// After `cancelled` is recorded, a later `completed` (with its result) is shown as
/// `cancelled` without the result, counted as a rewrite; the three audit facts stay apart.
#[tokio::test]
async fn a_late_completed_after_cancelled_is_shown_cancelled() {
    let (up, state) = modern_server().await;
    // Results not kept: every poll goes upstream, so the rewrite is what the client sees.
    let tg = TgConfig::new(&up.url())
        .tasks("max_stored_result_bytes = 0")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let (_, v) = task_call(&url, None, 2, "tasks/cancel", &t).await;
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    let (_, v) = task_call(&url, None, 3, "tasks/get", &t).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    state
        .lock()
        .unwrap()
        .tasks
        .insert(t.clone(), "completed".into());
    let (_, v) = task_call(&url, None, 4, "tasks/get", &t).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    assert!(v["result"].get("result").is_none(), "{v}");
    // The client's two and taskgate's own after the forwarded cancel's ack.
    assert_eq!(count(&up, "tasks/get"), 3);
    let text = tg.metrics_text().await;
    assert_eq!(
        metric(
            &text,
            "taskgate_task_terminal_rewrites_total",
            &[("upstream", "default")]
        ),
        1.0
    );
    let (_, events) = audit_events(&tg, &t).await;
    assert!(
        events.contains(&"cancel_requested".to_string()),
        "{events:?}"
    );
    assert!(
        events.contains(&"status_cancelled".to_string()),
        "{events:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Terminal results from the record
// ---------------------------------------------------------------------------------------------

/// Once a terminal tasks/get with its result passed through, later polls are answered from the
/// record with the same bytes; the upstream sees only the first.
#[tokio::test]
async fn polls_of_a_terminal_task_are_not_forwarded() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    state
        .lock()
        .unwrap()
        .tasks
        .insert(t.clone(), "completed".into());
    let (_, first) = task_call(&url, None, 2, "tasks/get", &t).await;
    assert_eq!(
        first["result"]["result"]["content"][0]["text"],
        json!(format!("done {t}")),
        "{first}"
    );
    for i in 3..8 {
        let (status, v) = task_call(&url, None, i, "tasks/get", &t).await;
        assert_eq!(status, 200);
        assert_eq!(v["id"], json!(i));
        assert_eq!(v["result"], first["result"], "same result");
    }
    assert_eq!(count(&up, "tasks/get"), 1);
}

// ---------------------------------------------------------------------------------------------
// Durability: the real binary, SIGKILL
// ---------------------------------------------------------------------------------------------

/// The real binary serving `cfg` (a config file), and its gateway address.
fn serve_binary(cfg: &str) -> (TaskgateProcess, String) {
    tokio::task::block_in_place(move || {
        let mut p = TaskgateProcess::spawn(&["serve", "--config", cfg], &[]);
        let (g, _) = p.listening();
        (p, g.to_string())
    })
}

/// A task created before SIGKILL is still reachable with tasks/get after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modern_task_survives_sigkill() {
    let (up, _) = modern_server().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url()).write_for_binary(dir.path());
    let (mut p, gw) = serve_binary(&cfg);
    let t = create(&format!("http://{gw}/mcp"), None, "slow_compute").await;
    tokio::task::block_in_place(|| {
        p.signal(libc::SIGKILL);
        p.wait_exit(STEP).expect("taskgate did not die on SIGKILL");
    });
    let (_p2, gw) = serve_binary(&cfg);
    let (status, v) = task_call(&format!("http://{gw}/mcp"), None, 2, "tasks/get", &t).await;
    assert_eq!(
        (status, v["result"]["status"].clone()),
        (200, json!("working")),
        "{v}"
    );
    assert_eq!(count(&up, "tasks/get"), 1);
}

/// One upstream `tasks/cancel` per 2026-07-28 task, also across a restart: the upstream
/// acknowledged the first (the task may keep running: a cancel is cooperative), so the cancel
/// after the restart is acknowledged by taskgate. On the old code the acknowledgement was held
/// in memory only, and the second cancel went upstream (break-tasks H2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_cancel_is_not_sent_again_after_a_restart() {
    let (up, _) = modern_server().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url()).write_for_binary(dir.path());
    let (mut p, gw) = serve_binary(&cfg);
    let url = format!("http://{gw}/mcp");
    let t = create(&url, None, "slow_compute").await;
    let (status, v) = task_call(&url, None, 2, "tasks/cancel", &t).await;
    assert_eq!(
        (status, v["result"].clone()),
        (200, json!({"resultType":"complete"})),
        "{v}"
    );
    assert_eq!(count(&up, "tasks/cancel"), 1);
    tokio::task::block_in_place(|| {
        p.signal(libc::SIGTERM);
        p.wait_exit(STEP).expect("taskgate did not stop on SIGTERM");
    });
    let (_p2, gw) = serve_binary(&cfg);
    let url = format!("http://{gw}/mcp");
    let (status, v) = task_call(&url, None, 3, "tasks/cancel", &t).await;
    assert_eq!(
        (status, v["result"].clone()),
        (200, json!({"resultType":"complete"})),
        "{v}"
    );
    assert_eq!(
        count(&up, "tasks/cancel"),
        1,
        "the second cancel went upstream"
    );
}

/// Under 2026-07-28 a `notifications/cancelled` naming the `tools/call` that became a task never
/// reaches the upstream (tasks are cancelled with `tasks/cancel` only).
#[tokio::test]
async fn notifications_cancelled_never_cancels_a_task() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let body = json!({"jsonrpc":"2.0","method":"notifications/cancelled",
        "params":{"requestId":1,"reason":"user","_meta":meta(true)}})
    .to_string();
    let resp = Req::mcp_post(&url, body)
        .header("mcp-protocol-version", MODERN)
        .send()
        .await;
    assert_eq!(resp.status(), 202);
    assert_eq!(count(&up, "notifications/cancelled"), 0);
    assert_eq!(count(&up, "tasks/cancel"), 0);
    let r = tg.record(&t).unwrap();
    assert_eq!(r.status, taskgate::mcp::task::TaskStatus::Working);
}

/// 2025-11-25: a second `tasks/result` of a terminal task is answered from the record with the
/// payload that passed through; the upstream sees one.
#[tokio::test]
async fn legacy_tasks_result_of_a_terminal_task_is_served_from_the_record() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let t = c.create_task("1").await;
    up.set(&t, "completed");
    let first = c.result("2", &t).await;
    assert!(first.get("result").is_some(), "{first}");
    let again = c.result("3", &t).await;
    assert_eq!(again["id"], json!(3));
    assert_eq!(again["result"], first["result"]);
    assert_eq!(up.count("tasks/result"), 1);
}

/// `subscriptions/listen` names only the caller's tasks upstream: another principal's (or a
/// never-recorded) taskId is removed from `params.notifications.taskIds`; the owner's own task
/// stays.
#[tokio::test]
async fn listen_keeps_only_the_callers_tasks() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .token("bob", "tok-b")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, Some("tok-a"), "slow_compute").await;
    let listen = |id: u64| json!({"notifications": {"taskIds": [t.clone(), "never-recorded"]}, "_meta": meta(true), "n": id});
    let (status, _) = send(modern_req(
        &url,
        Some("tok-b"),
        2,
        "subscriptions/listen",
        listen(2),
    ))
    .await;
    assert_eq!(status, 200);
    let (status, _) = send(modern_req(
        &url,
        Some("tok-a"),
        3,
        "subscriptions/listen",
        listen(3),
    ))
    .await;
    assert_eq!(status, 200);
    let seen = up.received("subscriptions/listen");
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].json()["params"]["notifications"]["taskIds"],
        json!([])
    );
    assert_eq!(
        seen[1].json()["params"]["notifications"]["taskIds"],
        json!([t])
    );
    // Not an array (one id as a string, a set as an object): refused, never passed on unread
    // (an upstream that took them so streamed alice's task to bob: break-edge F2).
    for (i, ids) in [json!(t.clone()), json!({t.clone(): {}}), json!(null)]
        .into_iter()
        .enumerate()
    {
        let params = json!({"notifications": {"taskIds": ids}, "_meta": meta(true)});
        let req = modern_req(
            &url,
            Some("tok-b"),
            10 + i as u64,
            "subscriptions/listen",
            params,
        );
        let (status, v) = send(req).await;
        assert_eq!((status, err_code(&v)), (400, -32602), "{v}");
        assert!(err_message(&v).contains("taskIds"), "{v}");
    }
    assert_eq!(up.received("subscriptions/listen").len(), 2);
}

// ---------------------------------------------------------------------------------------------
// Routing headers (issue 37 #1, #2)
// ---------------------------------------------------------------------------------------------

/// Issue 37 #1: a 2026 client that leaves out `Mcp-Name` on `tasks/*` (as `fastmcp.Client`
/// 4.1.4 does) is still served, and the upstream leg carries what the spec requires: `Mcp-Name`
/// derived from `params.taskId`. The upstream here checks the headers strictly; on f2cd7c5 it
/// refused every one of these with `-32020` because taskgate forwarded them without `Mcp-Name`.
/// A request lacking a header no client is known to omit (`Mcp-Method`; `Mcp-Name` on a
/// `tools/call`) is refused with `-32020` as the spec says (a `=?base64?…?=` name passes).
#[tokio::test]
async fn the_upstream_leg_carries_the_routing_headers_the_spec_requires() {
    let (up, _) = strict_modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let call = |id: u64| {
        modern_req(
            &url,
            None,
            id,
            "tools/call",
            json!({"name": "naïve tool", "arguments": {}}),
        )
    };
    // 2026-07-28 §2.2: a request without the headers it must carry is refused like one whose
    // headers disagree, and is not forwarded (conformance `http-header-validation`).
    for (req, lacks) in [
        (call(1).without("mcp-method"), "Mcp-Method"),
        (call(2).without("mcp-name"), "Mcp-Name"),
    ] {
        let (status, v) = send(req).await;
        assert_eq!((status, err_code(&v)), (400, -32020), "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(lacks), "{message}");
    }
    assert!(up.received("tools/call").is_empty());
    let encoded = format!("=?base64?{}?=", base64_of("naïve tool"));
    let (status, v) = send(call(3)).await;
    assert_eq!(status, 200, "{v}");
    let t = v["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string();
    let sent = up.received("tools/call").pop().unwrap();
    assert_eq!(sent.header("mcp-method").as_deref(), Some("tools/call"));
    assert_eq!(sent.header("mcp-name"), Some(encoded));
    // What `fastmcp.Client` 4.1.4 sends: `tasks/*` without `Mcp-Name`, derived upstream.
    for (i, m) in ["tasks/get", "tasks/update", "tasks/cancel"]
        .iter()
        .enumerate()
    {
        let req =
            modern_req(&url, None, 10 + i as u64, m, json!({"taskId": t})).without("mcp-name");
        let (status, v) = send(req).await;
        assert_eq!(status, 200, "{m}: {v}");
        let sent = up.received(m).pop().unwrap();
        assert_eq!(sent.header("mcp-name").as_deref(), Some(t.as_str()), "{m}");
    }
}

/// Issue 37 #1 and #2: headers that disagree with the body, or an `Mcp-Name` that is malformed,
/// get 400 `-32020` at the edge and nothing is forwarded, for every method that carries them and
/// in both eras. On f2cd7c5 a malformed `Mcp-Name` counted as absent, and `Mcp-Method` and a
/// tool call's `Mcp-Name` were never compared with the body.
#[tokio::test]
async fn routing_headers_that_disagree_with_the_body_are_refused_at_the_edge() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let before = up.count();
    let cases = [
        modern_req(&url, None, 2, "tasks/get", json!({"taskId": t}))
            .without("mcp-method")
            .header("mcp-method", "tasks/cancel"),
        modern_req(&url, None, 3, "tasks/get", json!({"taskId": t}))
            .without("mcp-name")
            .header("mcp-name", "=?base64?not base64!?="),
        modern_req(&url, None, 4, "tasks/cancel", json!({"taskId": t}))
            .without("mcp-name")
            .header("mcp-name", &format!("=?base64?{}?=", "/w==")),
        modern_req(
            &url,
            None,
            5,
            "tools/call",
            json!({"name": "slow_compute", "arguments": {}}),
        )
        .header("mcp-name", "another_tool"),
        modern_req(&url, None, 6, "tools/list", json!({})).header("mcp-name", "slow_compute"),
        // A 2025 request that carries them is held to them too.
        Req::mcp_post(
            &url,
            rpc(
                "7",
                "tools/call",
                r#"{"name":"slow_compute","arguments":{}}"#,
            ),
        )
        .header("mcp-method", "tools/list"),
    ];
    for (i, req) in cases.into_iter().enumerate() {
        let (status, v) = send(req).await;
        assert_eq!((status, err_code(&v)), (400, -32020), "case {i}: {v}");
    }
    assert_eq!(up.count(), before, "nothing was forwarded");
    let m = scrape(tg.admin).await;
    assert!(
        m.contains(r#"reason="header_mismatch""#),
        "counted as a rejection: {m}"
    );
}

/// Hostile tester F7: an `MCP-Protocol-Version` that is not the body's
/// `_meta["io.modelcontextprotocol/protocolVersion"]` (2026-07-28 §2.2: the header "MUST
/// equal the `_meta` value") is refused at the edge with 400 `-32020`, in either direction and
/// when the `_meta` value is not a string: taskgate takes the era from the header, the upstream
/// may take it from `_meta`. Before, each was forwarded. A request whose two agree passes.
#[tokio::test]
async fn a_version_header_that_disagrees_with_meta_is_refused_at_the_edge() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let call = |id: u64, version: Value| {
        let mut meta = meta(true);
        meta["io.modelcontextprotocol/protocolVersion"] = version;
        modern_req(
            &url,
            None,
            id,
            "tools/call",
            json!({"name": "plain_tool", "arguments": {}, "_meta": meta}),
        )
    };
    let before = up.count();
    let cases = [
        call(1, json!("2025-11-25")),
        call(2, json!(20260728)),
        // A 2025 header on a body that names 2026-07-28.
        call(3, json!(MODERN))
            .without("mcp-protocol-version")
            .header("mcp-protocol-version", "2025-11-25"),
    ];
    for (i, req) in cases.into_iter().enumerate() {
        let (status, v) = send(req).await;
        assert_eq!((status, err_code(&v)), (400, -32020), "case {i}: {v}");
        assert_eq!(v["id"], json!(i + 1), "case {i}: names the request: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("MCP-Protocol-Version"), "case {i}: {v}");
    }
    assert_eq!(up.count(), before, "nothing was forwarded");
    let (status, v) = send(call(4, json!(MODERN))).await;
    assert_eq!(status, 200, "agreeing versions pass: {v}");
    assert!(up.count() > before, "and were forwarded");
}

/// Review 17 #12: 2026-07-28 §2.2 "mismatch or missing header: 400 `-32020`". A request
/// without `MCP-Protocol-Version` whose `_meta` names a version is refused, naming the missing
/// header (before, it was served as 2026 from `_meta`); a 2026 request whose `_meta` client
/// capabilities are not an object is refused `-32602` (§2.1; before, forwarded). Neither
/// reaches the upstream; a 2025 request without either passes.
#[tokio::test]
async fn a_missing_version_header_or_non_object_capabilities_is_refused() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let before = up.count();

    let no_header = modern_req(
        &url,
        None,
        1,
        "tools/call",
        json!({"name": "plain_tool", "arguments": {}}),
    )
    .without("mcp-protocol-version");
    let (status, v) = send(no_header).await;
    assert_eq!((status, err_code(&v)), (400, -32020), "{v}");
    assert_eq!(v["id"], json!(1), "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("MCP-Protocol-Version is missing"), "{v}");

    for (i, caps) in [json!("x"), json!(null), json!([])].into_iter().enumerate() {
        let mut meta = meta(true);
        meta["io.modelcontextprotocol/clientCapabilities"] = caps;
        let id = 2 + i as u64;
        let (status, v) = send(modern_req(
            &url,
            None,
            id,
            "tools/call",
            json!({"name": "plain_tool", "arguments": {}, "_meta": meta}),
        ))
        .await;
        assert_eq!((status, err_code(&v)), (400, -32602), "case {i}: {v}");
        assert_eq!(v["id"], json!(id), "case {i}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("clientCapabilities") && message.contains("must be an object"),
            "case {i}: {v}"
        );
    }
    assert_eq!(up.count(), before, "nothing was forwarded");

    // Spaces around the key take the slow path, with the same answer.
    let body = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"plain_tool","arguments":{},"_meta":{ "io.modelcontextprotocol/protocolVersion" : "2026-07-28", "io.modelcontextprotocol/clientCapabilities" : 5 }}}"#;
    let (status, v) = send(
        Req::mcp_post(&url, body)
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", "tools/call")
            .header("mcp-name", "plain_tool"),
    )
    .await;
    assert_eq!((status, err_code(&v)), (400, -32602), "{v}");
    assert_eq!(up.count(), before, "nothing was forwarded");

    let (status, v) = send(modern_req(
        &url,
        None,
        10,
        "tools/call",
        json!({"name": "plain_tool", "arguments": {}}),
    ))
    .await;
    assert_eq!(status, 200, "a well-formed 2026 request passes: {v}");
}

/// Review 18b #7: a 2026 request whose JSON has a space after each colon (Python's
/// `json.dumps` default, `": "`) or is pretty-printed is judged as the compact spelling is:
/// capabilities that are not an object are refused 400 `-32602` before the upstream, an object
/// is served.
#[tokio::test]
async fn spaced_meta_is_judged_as_compact_meta() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let post = |id: u64, caps: &str, sep: &str| {
        let body = format!(
            "{{\"jsonrpc\": \"2.0\", \"id\": {id}, \"method\": \"tools/call\", \"params\": {{\"name\": \"plain_tool\", \"arguments\": {{}}, \"_meta\": {{\"io.modelcontextprotocol/protocolVersion\":{sep}\"{MODERN}\", \"io.modelcontextprotocol/clientCapabilities\":{sep}{caps}}}}}}}"
        );
        Req::mcp_post(&url, body)
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", "tools/call")
            .header("mcp-name", "plain_tool")
    };
    let before = up.count();
    for (id, sep) in [(1, " "), (2, "\n    ")] {
        let (status, v) = send(post(id, "\"x\"", sep)).await;
        assert_eq!((status, err_code(&v)), (400, -32602), "{sep:?}: {v}");
        assert_eq!(v["id"], json!(id), "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("must be an object"),
            "{v}"
        );
    }
    assert_eq!(up.count(), before, "nothing was forwarded");
    let caps = format!("{{\"extensions\": {{\"{EXT}\": {{}}}}}}");
    for (id, sep) in [(3, " "), (4, "\n    ")] {
        let (status, v) = send(post(id, &caps, sep)).await;
        assert_eq!(status, 200, "{sep:?}: {v}");
        assert_eq!(v["id"], json!(id), "{v}");
        assert!(v.get("result").is_some(), "served: {v}");
    }
    assert!(up.count() >= before + 2, "both were forwarded");
}

/// Hostile tester F6: a `notifications/tasks` reporting a task `completed` with its `result`
/// is kept with its status, so a later `tasks/get` (the upstream still answering `working`,
/// as an eventually consistent one does) is answered `completed` with that `result` from the
/// record (2026-07-28 tasks: `completed` MUST carry `result`). Before, the upstream's `working`
/// was rewritten `completed` without any `result`.
#[tokio::test]
async fn a_terminal_notifications_result_answers_later_polls() {
    let (up, _) = modern_server().await;
    // With auth: without it only a stream that named the task may carry its notification.
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, Some("tok-a"), "slow_compute").await;
    let (status, v) = send(modern_req(
        &url,
        Some("tok-a"),
        2,
        "tools/call",
        json!({"name": "notify_about", "arguments": {"taskId": t}}),
    ))
    .await;
    assert_eq!(status, 200, "{v}");
    let done = eventually(STEP, || async {
        tg.record(&t)
            .filter(|r| r.status == taskgate::mcp::task::TaskStatus::Completed)
    })
    .await;
    assert!(done.is_some(), "the notification was applied");
    let (status, v) = task_call(&url, Some("tok-a"), 3, "tasks/get", &t).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["status"], "completed", "{v}");
    assert_eq!(
        v["result"]["result"]["content"][0]["text"],
        json!(format!("done {t}")),
        "completed carries its result: {v}"
    );
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert!(v["result"].get("_meta").is_none(), "{v}");
}

/// Review 17 #7 (F6 left open): a terminal `notifications/tasks` whose payload taskgate did not
/// keep (a `completed` without `result`; a `DetailedTask` over `tasks.max_stored_result_bytes`)
/// still ends the record, but a later `tasks/get` the upstream answers `working`, and a later
/// `working` notification, are passed as the upstream sent them: never `completed` without
/// `result` (2026-07-28 §1.4). When the upstream then answers `completed` with its `result`,
/// that is what the client gets. On the code before, both were rewritten `completed` without
/// `result`.
#[tokio::test]
async fn a_terminal_report_without_a_kept_payload_is_never_shown_without_it() {
    for (case, tool, stored_bytes) in [
        ("no result", "notify_bare", 1 << 20),
        ("over the size bound", "notify_about", 64),
    ] {
        let state: Shared = Default::default();
        let modern = modern_handler(state.clone());
        let up = Upstream::start(move |req: &RecordedRequest| {
            let v = req.json();
            let report = |mut task: Value| {
                task.as_object_mut().unwrap().remove("result");
                let note = json!({"jsonrpc":"2.0","method":"notifications/tasks","params": task});
                let done = json!({"resultType": "complete", "content": []});
                let id = req.rpc_id_json();
                ScriptedResponse::sse(vec![
                    SseStep::Raw(ev().data(&note.to_string()).wire()),
                    SseStep::Raw(ev().data(&rpc_result(&id, &done.to_string())).wire()),
                ])
            };
            let t = v["params"]["arguments"]["taskId"].as_str().unwrap_or("");
            match v["params"]["name"].as_str() {
                Some("notify_bare") => report(detailed(t, "completed")),
                Some("notify_working") => report(detailed(t, "working")),
                _ => modern(req),
            }
        })
        .await;
        // With auth: without it only a stream that named the task may carry its notification.
        let tg = TgConfig::new(&up.url())
            .token("alice", "tok-a")
            .tasks(&format!("max_stored_result_bytes = {stored_bytes}"))
            .start()
            .await;
        let url = tg.mcp_url();
        let t = create(&url, Some("tok-a"), "slow_compute").await;
        let notify = |id: u64, tool: &str| {
            modern_req(
                &url,
                Some("tok-a"),
                id,
                "tools/call",
                json!({"name": tool, "arguments": {"taskId": t}}),
            )
        };
        let (status, v) = send(notify(2, tool)).await;
        assert_eq!(status, 200, "{case}: {v}");
        let done = eventually(STEP, || async {
            tg.record(&t)
                .filter(|r| r.status == taskgate::mcp::task::TaskStatus::Completed)
        })
        .await;
        let done = done.unwrap_or_else(|| panic!("{case}: the notification was applied"));
        assert!(done.terminal_result.is_none(), "{case}: nothing kept");

        let (status, v) = task_call(&url, Some("tok-a"), 3, "tasks/get", &t).await;
        assert_eq!(status, 200, "{case}: {v}");
        assert_eq!(
            v["result"]["status"], "working",
            "{case}: the upstream's live answer, not completed without result: {v}"
        );
        let text = notify(4, "notify_working").send().await.text().await;
        assert!(text.contains("notifications/tasks"), "{case}: {text}");
        assert!(
            !text.contains(r#""status":"completed""#),
            "{case}: no completed without result: {text}"
        );
        // Both passed unchanged: no terminal rewrite is counted (before, each was).
        let m = tg.metrics_text().await;
        assert_eq!(
            metric(&m, "taskgate_task_terminal_rewrites_total", &[]),
            0.0,
            "{case}: nothing was rewritten"
        );

        state
            .lock()
            .unwrap()
            .tasks
            .insert(t.clone(), "completed".into());
        let (status, v) = task_call(&url, Some("tok-a"), 5, "tasks/get", &t).await;
        assert_eq!(status, 200, "{case}: {v}");
        assert_eq!(v["result"]["status"], "completed", "{case}: {v}");
        assert_eq!(
            v["result"]["result"]["content"][0]["text"],
            json!(format!("done {t}")),
            "{case}: completed carries its result: {v}"
        );
    }
}

/// Review 17, #3 and #4: an awaited answer broken inside (both ends intact) is the upstream's
/// invalid answer, not relayed nor recorded; past 16 held notifications about a new task, the
/// next is dropped, not passed before the answer; a stream that ends without its answer does
/// not pass the held notifications naming a task never recorded. On the code before, the
/// broken answer was relayed 200, the 17th notification came first, and the orphan's id
/// reached the client.
#[tokio::test]
async fn no_task_id_leaks_from_a_broken_or_unanswered_creation() {
    let up = misbehaving_2026_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let call = |id: u64, tool: &str| call_tool(&url, id, tool);
    let (status, v) = send(call(1, "badjson_ends")).await;
    assert_eq!((status, err_code(&v)), (502, -32603), "{v}");
    assert!(tg.record("leak-1").is_none());

    let text = call(2, "many_early").send().await.text().await;
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str::<Value>(d.trim()).unwrap())
        .collect();
    assert_eq!(
        events.first().map(|e| &e["id"]),
        Some(&json!(2)),
        "the answer comes first: {text}"
    );
    assert!(tg.record("early-1").is_some());
    // Review 17 #16: the 16 held pass after it, in their order; the 17th is dropped.
    let held: Vec<&str> = events[1..]
        .iter()
        .map(|e| e["params"]["statusMessage"].as_str().unwrap_or("?"))
        .collect();
    let want: Vec<String> = (0..16).map(|n| format!("n{n}")).collect();
    assert_eq!(held, want, "{text}");

    // A stream that ends, or is answered with an error, after an early notification: the
    // held notification naming a task never recorded is not passed on.
    for (id, tool, orphan) in [
        (3, "early_then_end", "orphan-1"),
        (4, "early_then_error", "orphan-2"),
    ] {
        let text = call(id, tool).send().await.text().await;
        assert!(
            !text.contains(orphan),
            "{tool}: an unrecorded task's id: {text}"
        );
        assert!(
            text.contains("-32603"),
            "{tool}: the error reaches the client: {text}"
        );
        assert!(tg.record(orphan).is_none(), "{tool}");
    }
}

/// Review 17, #1: a `-32602` the client provoked with its own params (a 2026-07-28
/// `tasks/get` without the required `_meta` protocol version: §2.1 answers `-32602`) is not
/// taken for "the upstream lost the task": the record stays live and keeps its slot. On the
/// code before, the task was failed and its slot freed while the upstream still ran it.
#[tokio::test]
async fn a_client_provoked_32602_does_not_end_its_task() {
    let modern = modern_handler(Shared::default());
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        let version = &v["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"];
        if v["method"] == "tasks/get" && version.is_null() {
            let id = req.rpc_id_json();
            return ScriptedResponse::status(
                400,
                Some("application/json"),
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"missing _meta protocolVersion"}}}}"#
                ),
            );
        }
        modern(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let mut m = meta(true);
    m.as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/protocolVersion");
    let (status, v) = send(modern_req(
        &url,
        None,
        5,
        "tasks/get",
        json!({"taskId": t, "_meta": m}),
    ))
    .await;
    assert_eq!(
        (status, err_code(&v)),
        (400, -32602),
        "the upstream's answer: {v}"
    );
    assert_eq!(
        tg.record(&t).map(|r| r.status),
        Some(taskgate::mcp::task::TaskStatus::Working),
        "the task is still live"
    );
}

/// Review 17: a `subscriptions/listen` stream the upstream ends (a restart, say) is not an
/// invalid answer: the one long-lived stream of 2026-07-28 is never meant to be answered, so
/// the client gets no `-32603` event and no protocol error is counted. Before, every listener
/// got one at every upstream restart.
#[tokio::test]
async fn a_listen_stream_the_upstream_ends_is_not_an_invalid_answer() {
    let modern = modern_handler(Shared::default());
    let up = Upstream::start(move |req: &RecordedRequest| {
        if req.json()["method"] == "subscriptions/listen" {
            let ack = json!({"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged",
                "params": {}});
            return ScriptedResponse::sse(vec![SseStep::Raw(ev().data(&ack.to_string()).wire())]);
        }
        modern(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let listen = modern_req(
        &tg.mcp_url(),
        None,
        1,
        "subscriptions/listen",
        json!({"notifications": {"toolsListChanged": true}}),
    );
    let text = listen.send().await.text().await;
    assert!(text.contains("acknowledged"), "{text}");
    assert!(!text.contains("-32603"), "no error event: {text}");
    let m = scrape(tg.admin).await;
    let counted = m
        .lines()
        .filter(|l| l.starts_with("taskgate_upstream_errors_total"))
        .filter(|l| l.contains(r#"kind="protocol""#))
        .any(|l| !l.ends_with(" 0"));
    assert!(!counted, "no protocol error counted: {m}");
}

/// Review 17 #6: the poll taskgate sends after a forwarded 2026 cancel's ack does not hold the
/// ack for long: an upstream slow to answer that `tasks/get` (here 30 s, within its
/// `timeout_ms`) still lets the caller have its ack within `POLL_AFTER_ACK_WAIT`. Before, the
/// ack waited for the poll, up to the upstream's `timeout_ms`.
#[tokio::test]
async fn a_slow_poll_after_a_cancel_ack_does_not_hold_the_ack() {
    let modern = modern_handler(Shared::default());
    let cancelled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = cancelled.clone();
    let up = Upstream::start(move |req: &RecordedRequest| {
        let method = req.json()["method"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if method == "tasks/cancel" {
            seen.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let answer = modern(req);
        if method == "tasks/get" && seen.load(std::sync::atomic::Ordering::SeqCst) {
            return answer.after(Duration::from_secs(30));
        }
        answer
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let cancel = task_call(&url, None, 2, "tasks/cancel", &t);
    let (status, v) = tokio::time::timeout(Duration::from_secs(10), cancel)
        .await
        .expect("the ack did not wait for the slow poll");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"], json!({"resultType": "complete"}), "{v}");
}

/// Review 18a #1: a client's `tasks/get` whose `_meta` carries a member of the wrong type
/// (`progressToken` an object) is refused `-32602` by a validating server (the Python SDK:
/// "Invalid request parameters"), in an SSE stream as that SDK answers by default. taskgate's
/// own clean `tasks/get` finds the task, so the client gets the server's refusal as it came and
/// the task stays live (before: taken for "not found", the live task was failed and its owner's
/// slot freed while the upstream still ran it, the limit bypass of review 17 #1).
#[tokio::test]
async fn a_clients_malformed_meta_does_not_fail_its_live_task() {
    let state: Shared = Default::default();
    let modern = modern_handler(state.clone());
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        let bad = v["params"]["_meta"]["progressToken"].is_object();
        if v["method"] == "tasks/get" && bad {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32602,"message":"Invalid request parameters"}}}}"#,
                req.rpc_id_json()
            );
            return ScriptedResponse::sse(vec![SseStep::Raw(ev().data(&body).wire())]);
        }
        modern(req)
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let mut m = meta(true);
    m["progressToken"] = json!({"not": "a token"});
    let (_, v) = send(modern_req(
        &url,
        None,
        2,
        "tasks/get",
        json!({"taskId": t, "_meta": m}),
    ))
    .await;
    assert_eq!(
        err_code(&v),
        -32602,
        "the server's refusal, as it came: {v}"
    );
    assert_eq!(
        tg.record(&t).unwrap().status,
        taskgate::mcp::task::TaskStatus::Working,
        "the task still runs upstream"
    );
}

/// Review 18a #5: a worker-queue server that cancels 1.5 s after the ack (2026 §1.6) is seen
/// to by taskgate's follow-up, which is bounded by time (backing off from the task's
/// `pollIntervalMs`), and the record becomes `cancelled` (before: 5 polls at the interval,
/// about half a second, then the record stayed `working` and held the owner's slot).
#[tokio::test]
async fn a_cancel_that_takes_effect_a_moment_later_frees_the_slot() {
    let (up, state) = modern_server().await;
    state.lock().unwrap().cancel_after = Some(Duration::from_millis(1500));
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let (status, _) = task_call(&url, None, 2, "tasks/cancel", &t).await;
    assert_eq!(status, 200);
    let cancelled = recorded_as(&tg, &t, taskgate::mcp::task::TaskStatus::Cancelled).await;
    assert!(
        cancelled.is_some(),
        "polls: {}, record: {:?}",
        count(&up, "tasks/get"),
        tg.record(&t).map(|r| r.status)
    );
}

/// Review 18a #5: a server that deletes a task once its cooperative cancel took effect answers
/// taskgate's follow-up `tasks/get` `-32602`. That clean request's "not found" ends the record
/// (`failed`, the upstream lost it) and frees the owner's slot: the next creation is not refused
/// `-32029` (before: the record stayed `working` and held the slot until its ttl).
#[tokio::test]
async fn a_task_gone_after_a_cancel_ack_frees_the_slot() {
    let state: Shared = Default::default();
    state.lock().unwrap().cancel_after = Some(Duration::from_secs(600));
    let modern = modern_handler(state.clone());
    let polls_after_cancel = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (polls, cancelled) = (
        polls_after_cancel.clone(),
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let up = Upstream::start(move |req: &RecordedRequest| {
        use std::sync::atomic::Ordering::SeqCst;
        let v = req.json();
        if v["method"] == "tasks/cancel" {
            cancelled.store(true, SeqCst);
        }
        // The poll before the ack finds the task working; it is gone from the next one on.
        if v["method"] == "tasks/get" && cancelled.load(SeqCst) && polls.fetch_add(1, SeqCst) >= 1
        {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32602,"message":"Task not found"}}}}"#,
                req.rpc_id_json()
            );
            return ScriptedResponse::status(400, Some("application/json"), body);
        }
        modern(req)
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, None, "slow_compute").await;
    let (status, v) = task_call(&url, None, 2, "tasks/cancel", &t).await;
    assert_eq!(status, 200, "{v}");
    let (record, id) = (&tg, &t);
    let failed = eventually(Duration::from_secs(5), || async move {
        let r = record.record(id).expect("record");
        (r.status == taskgate::mcp::task::TaskStatus::Failed).then_some(())
    })
    .await;
    assert!(
        failed.is_some(),
        "polls after the cancel: {}, record: {:?}",
        polls_after_cancel.load(std::sync::atomic::Ordering::SeqCst),
        tg.record(&t).map(|r| r.status)
    );
    // The slot is free again.
    let again = create(&url, None, "slow_compute").await;
    assert_ne!(again, t);
}

/// Review 18b #2: a `notifications/tasks` contradicting a terminal record whose payload is
/// kept is answered with that payload (F6), but keeps its own `params._meta`: 2026-07-28 §2.3,
/// every notification on a `subscriptions/listen` stream carries the `subscriptionId` its
/// client demultiplexes by. The stored `tasks/get` result's own `_meta` is not the
/// notification's; a notification without `_meta` shows none. On the code before, the whole
/// `params` was replaced by the stored result: the stored `_meta` shown, the notification's lost.
#[tokio::test]
async fn a_served_payload_keeps_the_notifications_meta() {
    let modern = modern_handler(Default::default());
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        let t = v["params"]["arguments"]["taskId"].as_str().unwrap_or("");
        let id = req.rpc_id_json();
        match (v["method"].as_str(), v["params"]["name"].as_str()) {
            // An upstream whose terminal answer carries a `_meta` of its own.
            (Some("tasks/get"), _) => {
                let mut task = detailed(v["params"]["taskId"].as_str().unwrap(), "completed");
                task["_meta"] = json!({"vendor/stored": 1});
                ScriptedResponse::json(rpc_result(&id, &task.to_string()))
            }
            // Then a late `working` report, with the `_meta` the call names.
            (_, Some("notify_working")) => {
                let mut task = detailed(t, "working");
                if let Some(meta) = v["params"]["arguments"].get("meta") {
                    task["_meta"] = meta.clone();
                }
                let note = json!({"jsonrpc":"2.0","method":"notifications/tasks","params": task});
                let done = json!({"resultType": "complete", "content": []});
                ScriptedResponse::sse(vec![
                    SseStep::Raw(ev().data(&note.to_string()).wire()),
                    SseStep::Raw(ev().data(&rpc_result(&id, &done.to_string())).wire()),
                ])
            }
            _ => modern(req),
        }
    })
    .await;
    // With auth: without it only a stream that named the task may carry its notification.
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create(&url, Some("tok-a"), "slow_compute").await;
    let (status, v) = task_call(&url, Some("tok-a"), 2, "tasks/get", &t).await;
    assert_eq!(
        (status, &v["result"]["status"]),
        (200, &json!("completed")),
        "{v}"
    );
    assert!(
        tg.record(&t).and_then(|r| r.terminal_result).is_some(),
        "the payload is kept"
    );

    let sub = json!({"io.modelcontextprotocol/subscriptionId": "sub-7"});
    for (id, meta) in [(3, Some(&sub)), (4, None)] {
        let mut arguments = json!({"taskId": t});
        if let Some(meta) = meta {
            arguments["meta"] = meta.clone();
        }
        let params = json!({"name": "notify_working", "arguments": arguments});
        let text = modern_req(&url, Some("tok-a"), id, "tools/call", params)
            .send()
            .await
            .text()
            .await;
        let note = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|m| m["method"] == "notifications/tasks")
            .unwrap_or_else(|| panic!("the notification is relayed: {text}"));
        let shown = &note["params"];
        assert_eq!(shown["status"], "completed", "the kept payload: {note}");
        assert_eq!(
            shown["result"]["content"][0]["text"],
            json!(format!("done {t}")),
            "{note}"
        );
        assert_eq!(
            shown.get("_meta"),
            meta,
            "the notification's own _meta: {note}"
        );
    }
}

/// `Some` once `task_id`'s record holds `status` (within 5 s), `None` if it never does.
async fn recorded_as(
    tg: &Tg,
    task_id: &str,
    status: taskgate::mcp::task::TaskStatus,
) -> Option<()> {
    eventually(Duration::from_secs(5), || async move {
        let r = tg.record(task_id).expect("record");
        (r.status == status).then_some(())
    })
    .await
}
