//! What a 2025-11-25 client is shown of a task on a 2026-07-28 server (issue 12, the `bridge`
//! layer), against the scripted dual-era server of `common/modern_server.rs`: the upstream's
//! `notifications/tasks` as 2025 `notifications/tasks/status`, and a tool error (2026
//! `completed` + `isError`) as `failed` in `tasks/list` as in `tasks/get`.

use crate::common::*;

use serde_json::{json, Value};
use taskgate::mcp::task::TaskStatus;

fn create_body(id: u64, tool: &str) -> String {
    rpc(
        &id.to_string(),
        "tools/call",
        &json!({"name": tool, "arguments": {}, "task": {"ttl": 60000}}).to_string(),
    )
}

async fn create(c: &Client, id: u64) -> String {
    let v = c.rpc(create_body(id, "slow_compute")).await;
    v.pointer("/result/task/taskId")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("not a 2025 CreateTaskResult: {v}"))
        .to_string()
}

fn listed_status(list: &Value, task_id: &str) -> String {
    list["result"]["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .find(|t| t["taskId"] == json!(task_id))
        .unwrap_or_else(|| panic!("{task_id} not listed: {list}"))["status"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// A tool error is `failed` for a 2025 client everywhere: `tasks/get` and `tasks/list` agree
/// (the record keeps the 2026 `completed` and notes the tool error).
#[tokio::test]
async fn tasks_list_agrees_with_tasks_get_on_a_tool_error() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let t = create(&c, 2).await;
    let ok = create(&c, 3).await;
    {
        let mut s = state.lock().unwrap();
        s.tasks.insert(t.clone(), "tool_error".into());
        s.tasks.insert(ok.clone(), "completed".into());
    }
    let got = c.get("4", &t).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    let got = c.get("5", &ok).await;
    assert_eq!(got["result"]["status"], "completed", "{got}");
    let list = c.list("6", None).await;
    assert_eq!(listed_status(&list, &t), "failed", "{list}");
    assert_eq!(listed_status(&list, &ok), "completed", "{list}");
    let r = tg.record(&t).unwrap();
    assert_eq!((r.status, r.tool_error), (TaskStatus::Completed, true));
    assert!(!tg.record(&ok).unwrap().tool_error);
    // The cancel of a terminal task is refused, as ever, naming the 2025 status.
    let refused = c.cancel("7", &t).await;
    assert_eq!(err_code(&refused), -32602);
    assert!(err_message(&refused).contains("failed"), "{refused}");
}

/// A plain answer with `isError` to a call that asked for a task: a task already `failed` for
/// the 2025 client, in the `CreateTaskResult` and in `tasks/list`.
#[tokio::test]
async fn a_plain_tool_error_is_a_failed_task() {
    let state: Shared = Default::default();
    let modern = modern_handler(state);
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        if v["method"] == "tools/call" && v["params"]["name"] == "plain_error" {
            return ScriptedResponse::json(rpc_result(
                &req.rpc_id_json(),
                r#"{"resultType":"complete","content":[{"type":"text","text":"no"}],"isError":true}"#,
            ));
        }
        modern(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let v = c.rpc(create_body(2, "plain_error")).await;
    assert_eq!(v["result"]["task"]["status"], "failed", "{v}");
    let t = v["result"]["task"]["taskId"].as_str().unwrap().to_string();
    let list = c.list("3", None).await;
    assert_eq!(listed_status(&list, &t), "failed", "{list}");
    let res = c.result("4", &t).await;
    assert_eq!(res["result"]["isError"], true, "{res}");
}

/// The upstream's `notifications/tasks` on the creation's own stream reach the 2025 client as
/// `notifications/tasks/status` (a 2025 `Task`: `ttl`, no `resultType` nor payload) after the
/// nested `CreateTaskResult`; the record follows them.
#[tokio::test]
async fn tasks_notifications_on_the_creation_stream_are_translated() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let r = c.send(create_body(2, "sse_tool")).await;
    assert_eq!(r.status(), 200);
    assert!(r
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream")));
    let mut sse = r.sse();
    let answer = sse.next_event(STEP).await.json();
    let t = answer["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"))
        .to_string();
    let note = sse.next_event(STEP).await.json();
    assert_eq!(note["method"], "notifications/tasks/status", "{note}");
    let p = &note["params"];
    assert_eq!(
        (p["taskId"].clone(), p["status"].clone()),
        (json!(t), json!("completed")),
        "{note}"
    );
    assert_eq!(p["ttl"], 60000, "{note}");
    assert!(
        p.get("resultType").is_none() && p.get("result").is_none() && p.get("ttlMs").is_none(),
        "{note}"
    );
    sse.expect_end(STEP).await;
    assert_eq!(tg.record(&t).unwrap().status, TaskStatus::Completed);
}

/// Any other stream of a 2026 task server reaching a 2025 client (here a plain call's answer
/// stream) carries `notifications/tasks` as `notifications/tasks/status` too (about a task
/// taskgate recorded: one about a task it has not is not passed on, `tests/modern.rs`).
#[tokio::test]
async fn tasks_notifications_on_other_streams_are_translated() {
    let state: Shared = Default::default();
    let modern = modern_handler(state.clone());
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        if v["method"] == "tools/call" && v["params"]["name"] == "chatty" {
            // The task the client made first.
            let other = state.lock().unwrap().tasks.keys().next().cloned();
            let note = json!({"jsonrpc":"2.0","method":"notifications/tasks",
                "params": detailed(&other.unwrap_or_default(), "tool_error")});
            let done = rpc_result(&req.rpc_id_json(), r#"{"content":[]}"#);
            return ScriptedResponse::sse(vec![
                SseStep::Raw(ev().data(&note.to_string()).wire()),
                SseStep::Raw(ev().data(&done).wire()),
            ]);
        }
        modern(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    // Learn the era (a task call asks server/discover).
    let t = create(&c, 1).await;
    let out = call(&c, &call_body("2", "chatty", None), &json!(2)).await;
    assert_eq!(out.before.len(), 1, "{out:?}");
    let note = &out.before[0];
    assert_eq!(note["method"], "notifications/tasks/status", "{note}");
    assert_eq!(note["params"]["taskId"], json!(t), "{note}");
    assert_eq!(note["params"]["status"], "failed", "{note}");
    assert!(note["params"].get("result").is_none(), "{note}");
}

/// A relayed `notifications/tasks` with members a 2025 client's schema rejects (`pollIntervalMs:
/// -1`, `createdAt: "yesterday"`, `lastUpdatedAt: 12`) reaches a 2025 client made valid, as a
/// bridged creation and `tasks/get` are (one normalisation, `translate::legacy_task`).
#[tokio::test]
async fn a_relayed_notifications_invalid_fields_are_made_valid() {
    let state: Shared = Default::default();
    let modern = modern_handler(state.clone());
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        if v["method"] == "tools/call" && v["params"]["name"] == "chatty" {
            let other = state.lock().unwrap().tasks.keys().next().cloned();
            let mut task = detailed(&other.unwrap_or_default(), "working");
            task["pollIntervalMs"] = json!(-1);
            task["createdAt"] = json!("yesterday");
            task["lastUpdatedAt"] = json!(12);
            let note = json!({"jsonrpc":"2.0","method":"notifications/tasks","params": task});
            let done = rpc_result(&req.rpc_id_json(), r#"{"content":[]}"#);
            return ScriptedResponse::sse(vec![
                SseStep::Raw(ev().data(&note.to_string()).wire()),
                SseStep::Raw(ev().data(&done).wire()),
            ]);
        }
        modern(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let t = create(&c, 1).await;
    let out = call(&c, &call_body("2", "chatty", None), &json!(2)).await;
    assert_eq!(out.before.len(), 1, "{out:?}");
    let p = &out.before[0]["params"];
    assert_eq!(p["taskId"], json!(t), "{p}");
    assert!(p.get("pollInterval").is_none(), "{p}");
    for key in ["createdAt", "lastUpdatedAt"] {
        let at = p[key].as_str().unwrap_or_default();
        assert!(
            taskgate::mcp::task::parse_rfc3339_ms(at).is_some(),
            "{key}: {p}"
        );
    }
}

/// Progress first: a plain client (no tasks capability) whose call of a task-only tool taskgate
/// runs as a task gets a progress message on its token as soon as the task exists, before the
/// real result, even when the task ends before the first status poll.
#[tokio::test]
async fn an_upgraded_call_reports_progress_before_a_quick_result() {
    let state: Shared = Default::default();
    let modern = modern_handler(state);
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        if v["method"] == "tasks/get" {
            let task_id = v["params"]["taskId"].as_str().unwrap_or("");
            return ScriptedResponse::json(rpc_result(
                &req.rpc_id_json(),
                &detailed(task_id, "completed").to_string(),
            ));
        }
        modern(req)
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let out = call(
        &c,
        &call_body("9", "task_only", Some(json!("pt-9"))),
        &json!(9),
    )
    .await;
    assert!(
        out.answer["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("done ")),
        "{out:?}"
    );
    let progress = out.progress();
    assert!(
        !progress.is_empty(),
        "no progress before the result: {out:?}"
    );
    assert_eq!(out.before[0]["method"], "notifications/progress", "{out:?}");
    assert_eq!(progress[0]["params"]["progressToken"], "pt-9");
    assert_eq!(progress[0]["params"]["message"], "working");
}

/// A `-32021` that comes after an SSE priming event (an event with an id and no data, as rmcp
/// sends on a 2025 session's POST streams) still makes the plain call a task: the real result.
#[tokio::test]
async fn a_32021_after_a_priming_event_is_upgraded() {
    let state: Shared = Default::default();
    let modern = modern_handler(state);
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        let declared = !v["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
            ["extensions"][EXT]
            .is_null();
        if v["method"] == "tools/call" && v["params"]["name"] == "primed" && !declared {
            let id = req.rpc_id_json();
            let err = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32021,"message":"Missing required client capability","data":{{"requiredCapabilities":{{"extensions":{{"{EXT}":{{}}}}}}}}}}}}"#
            );
            return ScriptedResponse::sse(vec![
                SseStep::Raw(ev().id("prime-0").retry(3000).wire()),
                SseStep::Raw(ev().data(&err).wire()),
            ]);
        }
        if v["method"] == "tasks/get" {
            let task_id = v["params"]["taskId"].as_str().unwrap_or("");
            return ScriptedResponse::json(rpc_result(
                &req.rpc_id_json(),
                &detailed(task_id, "completed").to_string(),
            ));
        }
        modern(req)
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let out = call(&c, &call_body("3", "primed", None), &json!(3)).await;
    assert!(
        out.answer["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("done ")),
        "{out:?}"
    );
    assert_eq!(up.received("tools/call").len(), 2, "sent again as a task");
}

/// With `[upgrade]` on, a long plain call whose SSE stream opens with a priming event gets its
/// response headers and that event at once, not when the tool ends: the look past events
/// without data for a `-32021` waits at most a moment for the next event (found by review).
#[tokio::test]
async fn a_long_plain_call_after_a_priming_event_gets_its_headers_at_once() {
    let state: Shared = Default::default();
    let modern = modern_handler(state);
    let gate = Gate::new();
    let held = gate.clone();
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        if v["method"] == "tools/call" && v["params"]["name"] == "long" {
            let id = req.rpc_id_json();
            let result = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"long done"}}]}}}}"#
            );
            return ScriptedResponse::sse(vec![
                SseStep::Raw(ev().id("prime-0").retry(3000).wire()),
                SseStep::Wait(held.clone()),
                SseStep::Raw(ev().data(&result).wire()),
            ]);
        }
        modern(req)
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    // The tool is still running (the gate is shut): the headers must come anyway.
    let r = tokio::time::timeout(STEP, c.send(call_body("4", "long", None)))
        .await
        .expect("no response headers while the tool runs");
    assert_eq!(r.status(), 200);
    gate.open();
    let content_type = r.header("content-type").unwrap_or_default();
    let mut sse = r.sse();
    let out = read_to_answer(&mut sse, &json!(4), content_type, std::time::Instant::now()).await;
    assert_eq!(
        out.answer["result"]["content"][0]["text"], "long done",
        "{out:?}"
    );
    assert_eq!(
        up.received("tools/call").len(),
        1,
        "a plain call, not upgraded"
    );
}

/// A 2026 task created with `ttlMs: null` (unlimited) on a gateway whose `tasks.max_ttl_ms`
/// ends its record: the 2025 client is told that cap, in the `CreateTaskResult` as in
/// `tasks/get` (the upstream saying `null` there too) and `tasks/list`, and the record expires
/// at it (before: `ttl: null` in the `CreateTaskResult` and `tasks/get`, the cap in `tasks/list`).
#[tokio::test]
async fn a_null_ttl_is_shown_as_the_cap_everywhere() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_ttl_ms = 3600000")
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;
    let created = c.rpc(create_body(2, "slow_compute")).await;
    let task = &created["result"]["task"];
    assert_eq!(task["ttl"], 3_600_000, "{created}");
    let t = task["taskId"].as_str().unwrap().to_string();
    state
        .lock()
        .unwrap()
        .tasks
        .insert(t.clone(), "working_unlimited".into());
    let got = c.get("3", &t).await;
    assert_eq!(got["result"]["ttl"], 3_600_000, "{got}");
    let list = c.list("4", None).await;
    assert_eq!(listed_task(&list, &t)["ttl"], 3_600_000, "{list}");
    let r = tg.record(&t).expect("recorded");
    assert_eq!(r.ttl_ms, Some(3_600_000));
}

/// A bridged task's `lastUpdatedAt` is the upstream's in `tasks/list` as in `tasks/get` (the
/// record keeps the time the 2026 server reported with the status), whichever request saw the
/// task end first: a `tasks/get`, the bridge following a `tasks/result`, or a `tasks/cancel`
/// (whose 2026 ack, which carries no time, is applied with taskgate's: before, that time stayed
/// in the record, and `tasks/list` showed it while `tasks/get` showed the upstream's).
#[tokio::test]
async fn tasks_list_shows_the_upstreams_last_updated_at() {
    for ended_by in ["tasks/get", "tasks/result", "tasks/cancel"] {
        last_updated_at_agrees(ended_by).await;
    }
}

async fn last_updated_at_agrees(ended_by: &str) {
    const AT: &str = "2026-01-02T03:04:05.678Z";
    let state: Shared = Default::default();
    let modern = modern_handler(state.clone());
    let seen = state.clone();
    // The scripted server, but a terminal task's `lastUpdatedAt` is fixed (as the SDKs' task
    // stores keep it), not the time of each answer.
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        let task_id = v["params"]["taskId"].as_str().unwrap_or_default();
        let status = seen.lock().unwrap().tasks.get(task_id).cloned();
        if let (true, Some(status @ ("completed" | "cancelled"))) =
            (v["method"] == "tasks/get", status.as_deref())
        {
            let mut t = detailed(task_id, status);
            t["lastUpdatedAt"] = json!(AT);
            return ScriptedResponse::json(rpc_result(&req.rpc_id_json(), &t.to_string()));
        }
        modern(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let t = create(&c, 2).await;
    let status = match ended_by {
        "tasks/cancel" => {
            let v = c.cancel("3", &t).await;
            assert_eq!(v["result"]["status"], "cancelled", "{v}");
            "cancelled"
        }
        _ => {
            state
                .lock()
                .unwrap()
                .tasks
                .insert(t.clone(), "completed".into());
            if ended_by == "tasks/result" {
                let res = c.result("3", &t).await;
                assert!(res["result"]["content"].is_array(), "{res}");
            }
            "completed"
        }
    };
    let got = c.get("4", &t).await;
    assert_eq!(got["result"]["status"], status, "{ended_by}: {got}");
    assert_eq!(got["result"]["lastUpdatedAt"], AT, "{ended_by}: {got}");
    let list = c.list("5", None).await;
    assert_eq!(
        listed_task(&list, &t)["lastUpdatedAt"],
        AT,
        "{ended_by}: {list}"
    );
    let got = c.get("6", &t).await;
    assert_eq!(got["result"]["lastUpdatedAt"], AT, "{ended_by}: {got}");
    assert_eq!(tg.record(&t).unwrap().last_updated_at, AT, "{ended_by}");
}
