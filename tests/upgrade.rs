//! Upgrade of plain calls (issue 5): a plain `tools/call` to a tool whose `taskSupport` is
//! `required` becomes a task upstream, is followed to its end, and is answered under the client's
//! original id, against a scripted MCP task server (tests/common). Also what must stay
//! untouched, progress and status relay, server→client requests, cancellation, disconnects, the
//! orphan sweep after a restart of the real binary, and a printed latency benchmark (#[ignore]).

use crate::common::*;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use taskgate::mcp::task::TaskStatus;

async fn list_tools(c: &Client, id_json: &str, cursor: Option<&str>) -> Value {
    let params = match cursor {
        Some(cur) => json!({ "cursor": cur }),
        None => json!({}),
    };
    let v = c.rpc(rpc(id_json, "tools/list", &params.to_string())).await;
    assert!(v.get("result").is_some(), "tools/list failed: {v}");
    v
}

fn task_support_of(list: &Value, name: &str) -> Option<String> {
    list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == json!(name))
        .unwrap_or_else(|| panic!("{name} not listed: {list}"))
        .pointer("/execution/taskSupport")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// A `tasks/result` answer's result as an upgraded call's plain client gets it: without the
/// related-task `_meta` key, and without `_meta` when that was all of it (tester 5 #8b).
fn as_plain_result(result: &Value) -> Value {
    let mut result = result.clone();
    let o = result.as_object_mut().unwrap();
    if let Some(meta) = o.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.remove(RELATED);
        if meta.is_empty() {
            o.remove("_meta");
        }
    }
    result
}

// =============================================================================================
// The upgrade itself
// =============================================================================================

/// Ids 0 and "0", concurrently on one session: each call goes upstream with
/// `params.task = {ttl: upgrade.ttl_ms}` (name, arguments, id kept), and each client gets the
/// `tasks/result` payload under its own id with its own type. The records say origin=upgraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_call_is_sent_as_task_and_answered_under_the_original_id() {
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(300),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url())
        .with("ttl_ms = 45000")
        .start()
        .await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    list_tools(&c, "\"list\"", None).await;

    let mut calls = Vec::new();
    for id in [json!(0), json!("0")] {
        let c = c.clone();
        calls.push(tokio::spawn(async move {
            let body = call_body(&id.to_string(), "research", None);
            (id.clone(), call(&c, &body, &id).await)
        }));
    }
    let mut task_ids = Vec::new();
    for h in calls {
        let (id, o) = h.await.unwrap();
        assert!(
            o.content_type.starts_with("text/event-stream"),
            "an upgraded answer is a stream: {o:?}"
        );
        assert_eq!(
            o.answer["id"], id,
            "answered under the original id, type kept: {o:?}"
        );
        assert_eq!(o.answer["jsonrpc"], json!("2.0"));
        let task_id = up
            .task_of_request(&id)
            .unwrap_or_else(|| panic!("no upstream task for request {id}"));
        let sent = parse_json(
            up.result_sent(&task_id)
                .expect("tasks/result answered")
                .as_bytes(),
        );
        assert_eq!(
            o.answer["result"],
            as_plain_result(&sent["result"]),
            "the payload is tasks/result's, unchanged but for the related-task key"
        );
        assert_eq!(
            o.answer["result"]["content"][0]["text"],
            json!(format!("result of {task_id}"))
        );
        assert!(o.before.is_empty(), "nothing else on the stream: {o:?}");
        assert!(o.after.is_empty(), "nothing after the answer: {o:?}");
        task_ids.push(task_id);
    }

    let creations = up.received("tools/call");
    assert_eq!(creations.len(), 2);
    for r in &creations {
        let v = r.json();
        assert_eq!(v["params"]["task"], json!({"ttl": 45000}), "{v}");
        assert_eq!(v["params"]["name"], json!("research"));
        assert_eq!(v["params"]["arguments"], json!({"n": 1}));
        assert!(v["id"] == json!(0) || v["id"] == json!("0"), "{v}");
        assert_eq!(r.header("mcp-session-id").as_deref(), Some("sess-1"));
    }
    assert_ne!(creations[0].json()["id"], creations[1].json()["id"]);
    // One `tasks/result` per task. A second is the follower's designed re-ask (`follower.rs`,
    // `confirm_terminal`): after a `tasks/get` said the task ended, the first gets one more poll
    // interval (100 ms here) to answer; on a loaded machine its answer can take longer, and
    // counting exactly two made this test flaky (3 or 4: 4 runs of 70 under CPU load).
    for t in &task_ids {
        let results = up.seen("tasks/result", t);
        let gets = up.seen("tasks/get", t);
        assert!(
            !results.is_empty() && results.len() <= 2,
            "{t}: tasks/result {} times",
            results.len()
        );
        if let Some(again) = results.get(1) {
            assert!(
                gets.iter().any(|g| g < again),
                "{t}: tasks/result asked again without a tasks/get before it"
            );
        }
    }
    assert_eq!(up.count("tasks/cancel"), 0);

    let (_, list) = tg.admin("/admin/tasks").await;
    let records = list["tasks"].as_array().unwrap();
    assert_eq!(records.len(), 2, "{list}");
    for r in records {
        assert_eq!(r["origin"], json!("upgraded"), "{r}");
        assert_eq!(r["tool"], json!("research"), "{r}");
        assert_eq!(r["ttl_ms"], json!(45000), "{r}");
        assert!(task_ids.contains(&r["task_id"].as_str().unwrap().to_string()));
    }
    let (_, only) = tg.admin("/admin/tasks?status=completed").await;
    assert_eq!(
        only["tasks"].as_array().unwrap().len(),
        2,
        "both recorded completed: {list}"
    );
    let m = tg.metrics_text().await;
    assert_eq!(upgraded(&m, "completed"), 2.0);
    assert_eq!(
        metric(
            &m,
            "taskgate_tasks_created_total",
            &[("origin", "upgraded")]
        ),
        2.0
    );
    assert_eq!(
        metric(&m, "taskgate_tasks_created_total", &[("origin", "client")]),
        0.0
    );
}

/// A required tool the session has not listed yet: taskgate lists the tools once, every page,
/// on the client's session, before upgrading; later calls use the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_not_in_cache_triggers_one_paged_tools_list() {
    let tools = vec![
        tool("maybe", Some("optional")),
        tool("never", Some("forbidden")),
        tool("plain", None),
        tool("other", Some("optional")),
        tool("research", Some("required")),
    ];
    let up = UpServer::start(UpBehaviour {
        tools: Arc::new(std::sync::Mutex::new(tools)),
        page_size: 2,
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    assert_eq!(up.count("tools/list"), 0);

    let o = call(&c, &call_body("1", "research", None), &json!(1)).await;
    assert!(o.answer.get("result").is_some(), "{o:?}");
    assert!(
        o.before.is_empty(),
        "taskgate's own tools/list is not shown: {o:?}"
    );
    let lists = up.received("tools/list");
    let cursors: Vec<Value> = lists
        .iter()
        .map(|r| {
            r.json()
                .pointer("/params/cursor")
                .cloned()
                .unwrap_or(Value::Null)
        })
        .collect();
    assert_eq!(
        cursors,
        vec![Value::Null, json!("page-2"), json!("page-4")],
        "one listing, all three pages"
    );
    for r in &lists {
        assert_eq!(r.header("mcp-session-id").as_deref(), Some("sess-1"));
    }
    let creation = up.received("tools/call");
    assert_eq!(creation.len(), 1);
    assert!(creation[0].json()["params"]["task"].is_object());

    // Cached now: no more listing for it, nor for a tool from the first page.
    let o = call(&c, &call_body("2", "research", None), &json!(2)).await;
    assert!(o.answer.get("result").is_some(), "{o:?}");
    let body = call_body("3", "maybe", None);
    let o = call(&c, &body, &json!(3)).await;
    assert_eq!(
        o.answer["result"]["content"][0]["text"],
        json!("plain maybe")
    );
    assert_eq!(up.up.last().body_str(), body);
    assert_eq!(up.count("tools/list"), 3, "no further tools/list");
    // Each upgraded call asked for its result; a follower whose tasks/get saw the terminal
    // status while tasks/result was still pending asks once more (issue 10 defect 7), so the
    // count is not exact.
    assert!((2..=4).contains(&up.count("tasks/result")));
}

/// `notifications/tools/list_changed` from the upstream (here on the GET stream) empties the
/// session's cache: the next call lists again and follows the new `taskSupport`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_list_changed_empties_the_cache() {
    let gate = Gate::new();
    let g = gate.clone();
    let up = UpServer::start(UpBehaviour {
        get_stream: Some(Arc::new(move || {
            vec![
                SseStep::Wait(g.clone()),
                ev().event("message")
                    .data(&notification("notifications/tools/list_changed", "{}"))
                    .into(),
                SseStep::HoldOpen,
            ]
        })),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    list_tools(&c, "\"l1\"", None).await;
    let o = call(&c, &call_body("1", "research", None), &json!(1)).await;
    assert!(o.answer.get("result").is_some(), "{o:?}");
    assert_eq!(up.count("tools/list"), 1);
    assert_eq!(up.count("tasks/result"), 1);

    let get = Req::mcp_get(&tg.mcp_url())
        .header("mcp-session-id", c.session.as_deref().unwrap())
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert_eq!(get.status(), 200);
    let mut stream = get.sse();
    // The upstream now says `research` must not be called as a task.
    for t in up.tools.lock().unwrap().iter_mut() {
        if t["name"] == json!("research") {
            t["execution"]["taskSupport"] = json!("forbidden");
        }
    }
    gate.open();
    let e = stream.next_event(STEP).await.json();
    assert_eq!(e["method"], json!("notifications/tools/list_changed"));

    let body = call_body("2", "research", None);
    let o = call(&c, &body, &json!(2)).await;
    assert_eq!(
        up.count("tools/list"),
        2,
        "the cache was emptied: listed again"
    );
    assert_eq!(
        o.answer["result"]["content"][0]["text"],
        json!("plain research"),
        "now forbidden: forwarded as it was: {o:?}"
    );
    assert_eq!(up.up.last().body_str(), body, "byte-exact");
    assert_eq!(up.count("tasks/result"), 1, "not upgraded");
}

/// Calls that must not be upgraded go upstream byte for byte: plain calls to `optional`,
/// `forbidden` and execution-less tools, and calls that carry `params.task` themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_forbidden_and_task_calls_are_forwarded_byte_exact() {
    let up = UpServer::default().await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    list_tools(&c, "\"list\"", None).await;
    let bodies = [
        (
            json!(10),
            r#"{ "jsonrpc" : "2.0", "id" : 10, "method" : "tools/call", "params" : { "name" : "maybe", "arguments" : { "n" : 1.50 } } }"#,
            "plain maybe",
        ),
        (
            json!("11"),
            r#"{"method":"tools/call","params":{"arguments":{},"name":"never"},"id":"11","jsonrpc":"2.0"}"#,
            "plain never",
        ),
        (
            json!(12),
            r#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"plain","arguments":{"n":1}}}"#,
            "plain plain",
        ),
    ];
    for (id, body, text) in bodies {
        let before = up.up.count();
        let o = call(&c, body, &id).await;
        assert_eq!(
            o.answer["result"]["content"][0]["text"],
            json!(text),
            "{o:?}"
        );
        assert_eq!(o.answer["id"], id);
        assert_eq!(up.up.count(), before + 1, "exactly one upstream request");
        assert_eq!(up.up.last().body_str(), body, "forwarded byte for byte");
    }
    // A required tool called with params.task by the client itself.
    let body = r#"{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"research","task":{"ttl":5000},"arguments":{"n":2}}}"#;
    let before = up.up.count();
    let v = c.rpc(body).await;
    let task_id = v["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string();
    assert_eq!(up.up.count(), before + 1);
    assert_eq!(up.up.last().body_str(), body, "forwarded byte for byte");
    // No fixed wait for a follower that should not exist: taskgate follows only the tasks it
    // created itself, and those are recorded (before the client sees anything) with origin
    // `upgraded`. The client's own task is recorded `client` and no upgraded task exists.
    let r = tg.record(&task_id).expect("recorded");
    assert_eq!(r.origin, taskgate::store::Origin::Client);
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_tasks_created_total",
            &[("origin", "upgraded")]
        ),
        0.0
    );
    assert_eq!(metric(&m, "taskgate_upgraded_calls_total", &[]), 0.0);
    assert_eq!(
        up.count("tasks/result"),
        0,
        "taskgate does not follow the client's own task"
    );
    assert_eq!(up.count("tasks/get"), 0);
}

async fn assert_untouched(up: &UpServer, tg: &Tg) {
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let list = list_tools(&c, "\"list\"", None).await;
    assert_eq!(
        task_support_of(&list, "research").as_deref(),
        Some("required"),
        "tools/list not rewritten: {list}"
    );
    let body = call_body("7", "research", None);
    let before = up.up.count();
    let o = call(&c, &body, &json!(7)).await;
    assert_eq!(up.up.count(), before + 1);
    assert_eq!(up.up.last().body_str(), body, "forwarded byte for byte");
    assert_eq!(
        o.answer["result"]["isError"],
        json!(true),
        "the upstream's refusal: {o:?}"
    );
    assert_eq!(up.task_requests_len(), 0);
    let m = tg.metrics_text().await;
    assert_eq!(metric(&m, "taskgate_upgraded_calls_total", &[]), 0.0);
}

trait TaskRequests {
    fn task_requests_len(&self) -> usize;
}
impl TaskRequests for UpServer {
    fn task_requests_len(&self) -> usize {
        self.up
            .requests()
            .iter()
            .filter(|r| r.rpc_method().is_some_and(|m| m.starts_with("tasks/")))
            .count()
    }
}

/// An upstream that does not declare `tasks.requests.tools.call` (tasks without tool calls, or
/// no tasks at all): nothing is upgraded and tools/list is shown as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_without_tasks_tools_call_is_untouched() {
    for caps in [Some(json!({"list": {}, "cancel": {}})), None] {
        let up = UpServer::start(UpBehaviour {
            tasks_capability: caps.clone(),
            ..UpBehaviour::default()
        })
        .await;
        let tg = UgConfig::new(&up.url()).start().await;
        assert_untouched(&up, &tg).await;
    }
}

/// `[upgrade] enabled = false` (and no `[upgrade]` section at all): nothing is upgraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_disabled_is_untouched() {
    let up = UpServer::default().await;
    let tg = UgConfig::new(&up.url())
        .upgrade(&["enabled = false"])
        .start()
        .await;
    assert_untouched(&up, &tg).await;
    let up = UpServer::default().await;
    let tg = UgConfig::new(&up.url()).upgrade(&[]).start().await;
    assert_untouched(&up, &tg).await;
}

/// tools/list as seen by a client without `capabilities.tasks`: `required` shows as `optional`,
/// everything else as the upstream sent it; every page, JSON or SSE. A client with
/// `capabilities.tasks` sees `required`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_list_shows_required_as_optional_only_to_clients_without_tasks() {
    for (list_sse, page_size) in [(false, 0), (true, 2)] {
        let up = UpServer::start(UpBehaviour {
            list_sse,
            page_size,
            ..UpBehaviour::default()
        })
        .await;
        let tg = UgConfig::new(&up.url()).start().await;
        let plain = client_with(&tg.mcp_url(), json!({"elicitation": {}})).await;
        let aware = client_with(
            &tg.mcp_url(),
            json!({"tasks": {"list": {}, "cancel": {}, "requests": {"elicitation": {"create": {}}}}}),
        )
        .await;
        for (c, research) in [(&plain, "optional"), (&aware, "required")] {
            let mut tools = Vec::new();
            let mut cursor: Option<String> = None;
            for page in 0.. {
                let v = list_tools(c, &format!("\"p{page}\""), cursor.as_deref()).await;
                tools.extend(v["result"]["tools"].as_array().unwrap().clone());
                cursor = v["result"]["nextCursor"].as_str().map(str::to_string);
                if cursor.is_none() {
                    break;
                }
            }
            let mut expected = standard_tools();
            expected[0]["execution"]["taskSupport"] = json!(research);
            assert_eq!(
                Value::Array(tools),
                Value::Array(expected),
                "sse={list_sse} page_size={page_size}: every other field as sent"
            );
        }
        // And the relaxed listing did not change what taskgate upgrades.
        let o = call(&plain, &call_body("1", "research", None), &json!(1)).await;
        assert!(o.answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("result of"));
    }
}

// =============================================================================================
// Results as they came
// =============================================================================================

/// An `isError` CallToolResult from tasks/result reaches the client unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_error_result_passes_unchanged() {
    let up = UpServer::start(UpBehaviour {
        payload: Payload::IsError,
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let o = call(&c, &call_body("\"e\"", "research", None), &json!("e")).await;
    let task_id = up.only_task();
    let sent = parse_json(up.result_sent(&task_id).unwrap().as_bytes());
    assert_eq!(o.answer["id"], json!("e"));
    assert_eq!(
        o.answer["result"],
        as_plain_result(&sent["result"]),
        "{o:?}"
    );
    assert_eq!(o.answer["result"]["isError"], json!(true));
    let keys: Vec<&String> = o.answer.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 3, "jsonrpc, id, result only: {keys:?}");
    let m = tg.metrics_text().await;
    assert_eq!(upgraded(&m, "failed"), 1.0);
}

/// A JSON-RPC error from tasks/result reaches the client under its original id (0 and a string).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonrpc_error_from_tasks_result_reaches_the_client_under_the_original_id() {
    let up = UpServer::start(UpBehaviour {
        payload: Payload::RpcError(-32603, "no result stored for this task".into()),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    for id in [json!(0), json!("call-9")] {
        let o = call(&c, &call_body(&id.to_string(), "research", None), &id).await;
        let task_id = up.task_of_request(&id).unwrap();
        let sent = parse_json(up.result_sent(&task_id).unwrap().as_bytes());
        assert_eq!(o.answer["id"], id, "{o:?}");
        assert_eq!(
            o.answer["error"], sent["error"],
            "the error as it came: {o:?}"
        );
        assert!(o.answer.get("result").is_none());
        assert!(o.after.is_empty());
    }
    let m = tg.metrics_text().await;
    assert_eq!(upgraded(&m, "failed"), 2.0);
}

/// An upstream that lists the tool as required but does not make the upgraded call a task
/// (answers a plain result, or a JSON-RPC error): the client gets that answer under its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_answer_without_a_task_reaches_the_client_as_it_came() {
    for (refusal, id) in [
        ((0, String::new()), json!(0)),
        ((-32602, "no tasks today".to_string()), json!("x")),
    ] {
        let up = UpServer::start(UpBehaviour {
            refuse_task: Some(refusal.clone()),
            ..UpBehaviour::default()
        })
        .await;
        let tg = UgConfig::new(&up.url()).start().await;
        let c = client_with(&tg.mcp_url(), json!({})).await;
        let o = call(&c, &call_body(&id.to_string(), "research", None), &id).await;
        assert_eq!(o.answer["id"], id, "{o:?}");
        if refusal.0 == 0 {
            assert_eq!(
                o.answer["result"]["content"][0]["text"],
                json!("ran without a task"),
                "{o:?}"
            );
        } else {
            assert_eq!(
                o.answer["error"],
                json!({"code": -32602, "message": "no tasks today"}),
                "{o:?}"
            );
        }
        assert!(up.received("tools/call")[0].json()["params"]["task"].is_object());
        assert_eq!(up.task_requests_len(), 0, "nothing to follow");
        let m = tg.metrics_text().await;
        assert_eq!(upgraded(&m, "not_a_task"), 1.0);
    }
}

// =============================================================================================
// Progress and status
// =============================================================================================

fn progress_behaviour() -> UpBehaviour {
    let token_of = |req: &Value| req.pointer("/params/_meta/progressToken").cloned();
    UpBehaviour {
        poll_interval: 200,
        task_ms: Some(1100),
        creation_head: Some(Arc::new(move |_, req| match token_of(req) {
            Some(t) => vec![ev()
                .event("message")
                .data(&progress_notification(&t, 1))
                .into()],
            None => vec![],
        })),
        result_head: Some(Arc::new(move |task_id, call| {
            let status = json!({
                "jsonrpc": "2.0",
                "method": "notifications/tasks/status",
                "params": {"taskId": task_id, "status": "working", "statusMessage": "halfway",
                           "createdAt": format_rfc3339_ms(now_ms()), "lastUpdatedAt": format_rfc3339_ms(now_ms()),
                           "ttl": 60000, "pollInterval": 200},
            });
            let status: SseStep = ev().event("message").data(&status.to_string()).into();
            match token_of(call) {
                Some(t) => vec![
                    ev().event("message")
                        .data(&progress_notification(&t, 2))
                        .into(),
                    status,
                    ev().event("message")
                        .data(&progress_notification(&t, 3))
                        .into(),
                ],
                None => vec![status],
            }
        })),
        ..UpBehaviour::default()
    }
}

/// With a progressToken, the client gets, on the call's stream and before the answer: the
/// upstream's progress (from the creation stream and the tasks/result stream), the status
/// notification as a progress message, and status changes seen by polling tasks/get at the
/// task's pollInterval. All on the client's token; the answer comes last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_and_status_reach_the_client_before_the_answer() {
    let up = UpServer::start(progress_behaviour()).await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let o = call(
        &c,
        &call_body("5", "research", Some(json!("tok-7"))),
        &json!(5),
    )
    .await;
    assert!(o.answer.get("result").is_some(), "{o:?}");
    assert!(o.after.is_empty());
    let creation = up.received("tools/call")[0].json();
    assert_eq!(
        creation["params"]["_meta"]["progressToken"],
        json!("tok-7"),
        "token kept upstream"
    );

    let progress = o.progress();
    assert_eq!(
        progress.len(),
        o.before.len(),
        "only progress before the answer: {:?}",
        o.before
    );
    for p in &progress {
        assert_eq!(p["params"]["progressToken"], json!("tok-7"), "{p}");
    }
    let messages: Vec<String> = progress
        .iter()
        .map(|p| p["params"]["message"].as_str().unwrap_or("").to_string())
        .collect();
    println!("progress messages: {messages:?}");
    for m in ["step 1", "step 2", "step 3"] {
        assert!(
            messages.iter().any(|x| x == m),
            "upstream progress {m:?} relayed: {messages:?}"
        );
    }
    assert!(
        messages.iter().any(|x| x.contains("halfway")),
        "the status notification became a progress message: {messages:?}"
    );
    let polled = messages.iter().filter(|x| x.contains("stage")).count();
    assert!(
        polled >= 2,
        "status changes from tasks/get polling: {messages:?}"
    );
    assert!(
        !o.before
            .iter()
            .any(|m| m["method"] == json!("notifications/tasks/status")),
        "{:?}",
        o.before
    );

    // tasks/get at the task's pollInterval (200 ms), not faster.
    let task_id = up.only_task();
    let gets = up.seen("tasks/get", &task_id);
    assert!(
        (2..=7).contains(&gets.len()),
        "{} tasks/get in 1.1 s",
        gets.len()
    );
    for w in gets.windows(2) {
        let gap = w[1] - w[0];
        assert!(
            gap >= Duration::from_millis(170),
            "tasks/get {gap:?} apart; pollInterval is 200 ms"
        );
    }

    // Without a progressToken nothing is injected.
    let o = call(&c, &call_body("6", "research", None), &json!(6)).await;
    assert!(o.answer.get("result").is_some(), "{o:?}");
    assert!(
        o.before.is_empty(),
        "without a token, status changes are not reported (and the status notification is not relayed): {:?}",
        o.before
    );
}

/// A slow `tasks/get` is not followed by a burst of polls (found this stop, behind a timing
/// failure of the test above under load): the follower's poll ticker made up for the ticks it
/// missed while a poll was out, so a server that took 700 ms to answer one `tasks/get` (the
/// task's pollInterval 100 ms) got the next six back to back, a few ms apart. Now the next poll
/// goes when the slow one is answered and the ones after it a pollInterval apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_tasks_get_is_not_followed_by_a_burst_of_polls() {
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(1400),
        poll_interval: 100,
        hook: Some(Arc::new(|method, id, task_id, n| {
            (method == "tasks/get" && n == 1).then(|| {
                let task = json!({"taskId": task_id, "status": "working",
                    "createdAt": "2026-12-05T00:00:00Z", "lastUpdatedAt": "2026-12-05T00:00:00Z",
                    "ttl": 60000, "pollInterval": 100});
                ScriptedResponse::json(rpc_result(id, &task.to_string()))
                    .after(Duration::from_millis(700))
            })
        })),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let o = call(&c, &call_body("1", "research", None), &json!(1)).await;
    assert!(o.answer.get("result").is_some(), "{o:?}");
    let gets = up.seen("tasks/get", &up.only_task());
    assert!(gets.len() >= 3, "{} tasks/get", gets.len());
    let gaps: Vec<Duration> = gets.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().all(|g| *g >= Duration::from_millis(50)),
        "tasks/get gaps {gaps:?}; pollInterval is 100 ms"
    );
}

/// The progress values a client sees on its token must increase with each notification
/// (2025-11-25 basic/utilities/progress: "The progress value MUST increase with each
/// notification"), also when taskgate mixes its status messages with the upstream's progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_values_on_the_clients_token_increase() {
    let up = UpServer::start(progress_behaviour()).await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let o = call(
        &c,
        &call_body("5", "research", Some(json!("tok-7"))),
        &json!(5),
    )
    .await;
    let seen: Vec<(f64, String)> = o
        .progress()
        .iter()
        .map(|p| {
            (
                p["params"]["progress"].as_f64().unwrap_or(f64::NAN),
                p["params"]["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    println!("progress (value, message) in arrival order: {seen:?}");
    for w in seen.windows(2) {
        assert!(
            w[1].0 > w[0].0,
            "progress went from {:?} to {:?}; all: {seen:?}",
            w[0],
            w[1]
        );
    }
}

/// (arrival, stream, progress value, message)
type Seen = (Instant, &'static str, f64, String);

/// The same when the upstream sends its progress on the session's GET stream (as the TypeScript
/// SDK server does for everything after the CreateTaskResult): what the client sees on its token,
/// GET stream and call stream together in arrival order, must increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_on_the_get_stream_and_status_messages_increase_together() {
    let mut b = progress_behaviour();
    b.creation_head = None;
    b.result_head = None;
    b.get_stream = Some(Arc::new(|| {
        let mut steps = vec![SseStep::Sleep(Duration::from_millis(300))];
        for i in 1..=3 {
            steps.push(
                ev().event("message")
                    .data(&progress_notification(&json!("tok-7"), i))
                    .into(),
            );
            steps.push(SseStep::Sleep(Duration::from_millis(300)));
        }
        steps.push(SseStep::HoldOpen);
        steps
    }));
    let up = UpServer::start(b).await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let seen: Arc<std::sync::Mutex<Vec<Seen>>> = Arc::default();
    let get = Req::mcp_get(&tg.mcp_url())
        .header("mcp-session-id", c.session.as_deref().unwrap())
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert_eq!(get.status(), 200);
    let mut get = get.sse();
    let s = seen.clone();
    let get_reader = tokio::spawn(async move {
        while let Next::Item(item) = get.next(Duration::from_secs(3)).await {
            if let SseItem::Event(e) = item {
                let v = e.json();
                if v["method"] == json!("notifications/progress") {
                    s.lock().unwrap().push((
                        Instant::now(),
                        "GET",
                        v["params"]["progress"].as_f64().unwrap(),
                        v["params"]["message"].as_str().unwrap_or("").into(),
                    ));
                }
            }
        }
    });
    let mut call_stream = c
        .send(call_body("5", "research", Some(json!("tok-7"))))
        .await
        .sse();
    loop {
        let v = call_stream.next_event(STEP).await.json();
        if v["id"] == json!(5) {
            break;
        }
        if v["method"] == json!("notifications/progress") {
            seen.lock().unwrap().push((
                Instant::now(),
                "call",
                v["params"]["progress"].as_f64().unwrap(),
                v["params"]["message"].as_str().unwrap_or("").into(),
            ));
        }
    }
    get_reader.abort();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by_key(|e| e.0);
    let order: Vec<String> = seen
        .iter()
        .map(|(_, stream, p, m)| format!("{p} {m:?} ({stream})"))
        .collect();
    println!("progress on tok-7 as the client saw it: {order:?}");
    assert!(seen.iter().any(|e| e.1 == "GET"), "{order:?}");
    for w in seen.windows(2) {
        assert!(w[1].2 > w[0].2, "progress went down: {order:?}");
    }
}

// =============================================================================================
// Server→client requests
// =============================================================================================

/// elicitation/create sent on the tasks/result stream is relayed on the call's stream to a client
/// that declared elicitation; its POSTed answer reaches the upstream; the task completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elicitation_is_relayed_and_the_answer_reaches_the_upstream() {
    let up = UpServer::start(UpBehaviour {
        ask: Some("elicitation/create"),
        task_ms: Some(100),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({"elicitation": {}})).await;
    let start = Instant::now();
    let r = c.send(call_body("3", "research", None)).await;
    assert_eq!(r.status(), 200);
    let ct = r.header("content-type").unwrap_or_default();
    let mut sse = r.sse();
    let ask = sse.next_event(STEP).await.json();
    let task_id = up.only_task();
    assert_eq!(ask["method"], json!("elicitation/create"), "{ask}");
    assert_eq!(ask["id"], json!(format!("ask-{task_id}")));
    assert_eq!(ask["params"]["_meta"][RELATED]["taskId"], json!(task_id));
    assert_eq!(up.status(&task_id), "input_required");

    let answer = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "accept", "content": {"choice": "a"}}});
    let resp = c.send(answer.to_string()).await;
    assert_eq!(resp.status(), 202, "the client's answer is accepted");
    let o = read_to_answer(&mut sse, &json!(3), ct, start).await;
    assert_eq!(
        o.answer["result"]["content"][0]["text"],
        json!(format!("result of {task_id}")),
        "{o:?}"
    );
    let t = up.task(&task_id);
    assert_eq!(
        t.answer,
        Some(answer.clone()),
        "the answer reached the upstream as sent"
    );
    let posted = up
        .up
        .requests()
        .into_iter()
        .find(|r| r.rpc_id() == Some(ask["id"].clone()))
        .unwrap();
    assert_eq!(posted.header("mcp-session-id").as_deref(), Some("sess-1"));
    assert_eq!(up.count("tasks/cancel"), 0);
    let m = tg.metrics_text().await;
    assert_eq!(upgraded(&m, "completed"), 1.0);
}

/// Without the capability a server→client request needs (elicitation, sampling), the task is
/// cancelled upstream (one tasks/cancel) and the client gets a JSON-RPC error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_needing_an_undeclared_capability_cancels_the_task() {
    for (method, capability) in [
        ("elicitation/create", "elicitation"),
        ("sampling/createMessage", "sampling"),
    ] {
        let up = UpServer::start(UpBehaviour {
            ask: Some(method),
            ..UpBehaviour::default()
        })
        .await;
        let tg = UgConfig::new(&up.url()).start().await;
        // Declares the other one only.
        let other = if capability == "sampling" {
            "elicitation"
        } else {
            "sampling"
        };
        let c = client_with(&tg.mcp_url(), json!({ other: {} })).await;
        let o = call(&c, &call_body("4", "research", None), &json!(4)).await;
        assert_eq!(o.answer["id"], json!(4), "{o:?}");
        assert_eq!(err_code(&o.answer), -32603, "{o:?}");
        let msg = err_message(&o.answer);
        assert!(
            msg.contains(method) && msg.contains(&format!("capabilities.{capability}")),
            "the error says why: {msg}"
        );
        assert!(
            !o.before.iter().any(|m| m["method"] == json!(method)),
            "the request is not relayed: {:?}",
            o.before
        );
        let task_id = up.only_task();
        // The call's end: its outcome counted and its cancel's answer recorded.
        assert!(call_ended(&tg, &task_id, "refused_capability").await);
        assert_eq!(
            up.count("tasks/cancel"),
            1,
            "{method}: exactly one tasks/cancel"
        );
        assert_eq!(
            up.received("tasks/cancel")[0].json()["params"]["taskId"],
            json!(task_id)
        );
        assert_eq!(up.status(&task_id), "cancelled");
        let m = tg.metrics_text().await;
        assert_eq!(upgraded(&m, "refused_capability"), 1.0);
        let r = tg.record(&task_id).unwrap();
        assert_eq!(r.status, TaskStatus::Cancelled);
    }
}

// =============================================================================================
// Cancellation and disconnects
// =============================================================================================

/// The client's notifications/cancelled for the original id: exactly one tasks/cancel upstream
/// (also when the notification is repeated), no further message for that id, the outcome
/// counted, and both audit facts recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_cancelled_becomes_one_tasks_cancel() {
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url())
        .tasks("release_quiet_ms = 200")
        .start()
        .await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let r = c.send(call_body("0", "research", None)).await;
    assert_eq!(r.status(), 200);
    let mut sse = r.sse();
    assert!(
        up.wait_count("tasks/result", 1, STEP).await,
        "taskgate follows the task"
    );
    let task_id = up.only_task();

    for _ in 0..2 {
        let s = c
            .notify(
                "notifications/cancelled",
                json!({"requestId": 0, "reason": "user"}),
            )
            .await;
        assert_eq!(s, 202);
    }
    sse.expect_end(STEP).await;
    assert!(call_ended(&tg, &task_id, "cancelled").await);
    assert_eq!(up.count("tasks/cancel"), 1, "exactly one tasks/cancel");
    let cancel = &up.received("tasks/cancel")[0];
    assert_eq!(cancel.json()["params"]["taskId"], json!(task_id));
    assert_eq!(cancel.header("mcp-session-id").as_deref(), Some("sess-1"));
    assert_eq!(up.status(&task_id), "cancelled");
    assert_eq!(
        up.count("notifications/cancelled"),
        0,
        "the notification is turned into tasks/cancel, not forwarded"
    );

    let m = tg.metrics_text().await;
    assert_eq!(upgraded(&m, "cancelled"), 1.0);
    assert_eq!(
        metric(
            &m,
            "taskgate_cancel_requests_total",
            &[("outcome", "forwarded")]
        ),
        1.0
    );
    let r = tg.record(&task_id).unwrap();
    assert_eq!(r.status, TaskStatus::Cancelled);
    assert_eq!(r.origin, taskgate::store::Origin::Upgraded);
    let (d, events) = eventually(STEP, || async {
        let (d, e) = audit_events(&tg, &task_id).await;
        e.contains(&"resources_released".to_string())
            .then_some((d, e))
    })
    .await
    .unwrap_or_else(|| panic!("resources_released never recorded for {task_id}"));
    println!("audit events: {events:?}");
    assert!(events.contains(&"cancel_requested".to_string()), "{d}");
    assert_eq!(
        events.iter().filter(|e| *e == "status_cancelled").count(),
        1,
        "{d}"
    );
}

/// Ids 0 and "0" upgraded at once on one session: cancelling "0" cancels only its task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_string_id_0_leaves_number_id_0_running() {
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let mut num = c.send(call_body("0", "research", None)).await.sse();
    let mut text = c.send(call_body("\"0\"", "research", None)).await.sse();
    assert!(up.wait_count("tasks/result", 2, STEP).await);
    let t_num = up.task_of_request(&json!(0)).unwrap();
    let t_text = up.task_of_request(&json!("0")).unwrap();

    assert_eq!(
        c.notify("notifications/cancelled", json!({"requestId": "0"}))
            .await,
        202
    );
    text.expect_end(STEP).await;
    num.expect_open_for(Duration::from_millis(300)).await;
    assert_eq!(up.count("tasks/cancel"), 1);
    assert_eq!(
        up.received("tasks/cancel")[0].json()["params"]["taskId"],
        json!(t_text)
    );
    assert_eq!(up.status(&t_num), "working");

    assert_eq!(
        c.notify("notifications/cancelled", json!({"requestId": 0}))
            .await,
        202
    );
    num.expect_end(STEP).await;
    assert_eq!(up.count("tasks/cancel"), 2);
    assert_eq!(
        up.received("tasks/cancel")[1].json()["params"]["taskId"],
        json!(t_num)
    );
}

/// `on_client_disconnect = "cancel"`: the client's stream goes away, the task is cancelled
/// upstream once, after the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_with_cancel_policy_cancels_after_the_grace_period() {
    const GRACE: u64 = 400;
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url())
        .with("on_client_disconnect = \"cancel\"")
        .with(&format!("disconnect_grace_ms = {GRACE}"))
        .gateway("sse_keepalive_ms = 50")
        .start()
        .await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let sse = c.send(call_body("1", "research", None)).await.sse();
    assert!(up.wait_count("tasks/result", 1, STEP).await);
    let task_id = up.only_task();
    let dropped = Instant::now();
    drop(sse);
    assert!(
        up.wait_count("tasks/cancel", 1, STEP).await,
        "the task is cancelled after a disconnect"
    );
    let at = up.seen("tasks/cancel", &task_id)[0];
    let after = at - dropped;
    println!("tasks/cancel {after:?} after the client went away (grace {GRACE} ms)");
    assert!(
        after >= Duration::from_millis(GRACE - 20),
        "not before the grace period: {after:?}"
    );
    assert!(after < Duration::from_millis(GRACE + 2000), "{after:?}");
    assert!(call_ended(&tg, &task_id, "disconnected").await);
    assert_eq!(up.count("tasks/cancel"), 1);
    assert_eq!(up.status(&task_id), "cancelled");
    let m = tg.metrics_text().await;
    assert_eq!(upgraded(&m, "disconnected"), 1.0);
}

/// `on_client_disconnect = "cancel"` while the upstream is out of reach: the client goes away,
/// the task's `tasks/cancel` fails (connection refused), and the record is not left `working`
/// holding its owner's slot until its ttl: it is `failed` (a terminal record frees the slot),
/// its `statusMessage` saying why. Before: the record stayed `working`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_whose_cancel_fails_fails_the_record_and_frees_the_slot() {
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        ..UpBehaviour::default()
    })
    .await;
    let blip = Blip::start(up.up.addr).await;
    let tg = UgConfig::new(&blip.url())
        .with("on_client_disconnect = \"cancel\"")
        .with("disconnect_grace_ms = 50")
        .gateway("sse_keepalive_ms = 50")
        .start()
        .await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let sse = c.send(call_body("1", "research", None)).await.sse();
    assert!(up.wait_count("tasks/result", 1, STEP).await);
    let task_id = up.only_task();
    blip.down().await;
    drop(sse);
    let failed = eventually(STEP, || async {
        let r = tg.record(&task_id)?;
        (r.status == TaskStatus::Failed).then_some(r)
    })
    .await;
    let r = failed.unwrap_or_else(|| {
        panic!(
            "the record is failed, not left working: {:?}",
            tg.record(&task_id).map(|r| r.status)
        )
    });
    let why = r.status_message.clone().unwrap_or_default();
    assert!(why.contains("went away"), "statusMessage says why: {why}");
}

/// `on_client_disconnect = "keep"`: no tasks/cancel; the task runs to its end upstream and the
/// client's session can still reach it with tasks/get and tasks/result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_with_keep_policy_lets_the_task_run() {
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(1200),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url())
        .with("on_client_disconnect = \"keep\"")
        .with("disconnect_grace_ms = 100")
        .gateway("sse_keepalive_ms = 50")
        .start()
        .await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let sse = c.send(call_body("1", "research", None)).await.sse();
    assert!(up.wait_count("tasks/result", 1, STEP).await);
    let task_id = up.only_task();
    drop(sse);
    let m = eventually(STEP, || async {
        let m = tg.metrics_text().await;
        (upgraded(&m, "disconnected") == 1.0).then_some(m)
    })
    .await;
    assert!(m.is_some(), "the disconnect is noticed and counted");
    // No fixed wait: the task ends upstream 1200 ms after it started, long after the 100 ms
    // grace, and its result (fetched below, which waits for that end) is the event after which
    // "no tasks/cancel" is checked.
    let v = c.get("\"g\"", &task_id).await;
    assert_eq!(v["result"]["status"], json!("working"), "{v}");
    let v = c.result("\"r\"", &task_id).await;
    assert_eq!(
        v["result"]["content"][0]["text"],
        json!(format!("result of {task_id}")),
        "{v}"
    );
    assert_eq!(up.count("tasks/cancel"), 0);
}

/// Tester 3 F13: `on_client_disconnect = "keep"` with a client that speaks no tasks (the one
/// upgrade exists for): once it hangs up, taskgate keeps following the task in the background,
/// so the record ends `completed` when the task ends upstream, with no client request, and
/// the owner's live-task slot (`max_live_tasks_per_owner = 1`) frees: the client's next call is
/// admitted. Before the fix the record stayed `working` (for `upgrade.ttl_ms`) and the next
/// call was refused `-32029`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_policy_follows_the_task_to_its_end_and_frees_the_owners_slot() {
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(800),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url())
        .with("on_client_disconnect = \"keep\"")
        .with("disconnect_grace_ms = 100")
        .gateway("sse_keepalive_ms = 50")
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let sse = c.send(call_body("1", "research", None)).await.sse();
    assert!(up.wait_count("tasks/result", 1, STEP).await);
    let task_id = up.only_task();
    drop(sse);
    let disconnected = eventually(STEP, || async {
        let m = tg.metrics_text().await;
        (upgraded(&m, "disconnected") == 1.0).then_some(())
    })
    .await;
    assert!(
        disconnected.is_some(),
        "the disconnect is noticed and counted"
    );
    let ended = eventually(STEP, || async {
        let r = tg.record(&task_id)?;
        r.status.is_terminal().then_some(r.status)
    })
    .await;
    assert_eq!(
        ended,
        Some(TaskStatus::Completed),
        "the kept task's record ends when the task does, with no client request"
    );
    assert_eq!(up.count("tasks/cancel"), 0, "kept, not cancelled");
    let o = call(&c, &call_body("2", "research", None), &json!(2)).await;
    assert!(
        o.answer.get("result").is_some(),
        "the owner's slot is free again: {:?}",
        o.answer
    );
}

/// L7: the background follower of a kept call (F13) is held to its task's ttl (here the
/// record's, `tasks.max_ttl_ms` = 1.5 s, shorter than `upgrade.ttl_ms`): once it has passed
/// the follower stops polling and leaves the record as the registry does (expired, swept),
/// and `taskgate_upgrade_kept_followers` says how many kept calls are followed (1, then 0).
/// Before, it polled on until `upgrade.ttl_ms` from the call's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_calls_follower_stops_at_its_tasks_ttl() {
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url())
        .with("on_client_disconnect = \"keep\"")
        .with("disconnect_grace_ms = 100")
        .gateway("sse_keepalive_ms = 50")
        .tasks("max_ttl_ms = 1500")
        .start()
        .await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let sse = c.send(call_body("1", "research", None)).await.sse();
    assert!(up.wait_count("tasks/result", 1, STEP).await);
    let task_id = up.only_task();
    let expires_at = tg.record(&task_id).expect("recorded").expires_at;
    drop(sse);
    let followed = eventually(STEP, || async {
        let m = tg.metrics_text().await;
        (metric(&m, "taskgate_upgrade_kept_followers", &[]) == 1.0).then_some(())
    })
    .await;
    assert!(followed.is_some(), "one kept call followed");
    let polls = up.count("tasks/get");
    assert!(
        up.wait_count("tasks/get", polls + 2, STEP).await,
        "it polls"
    );
    // Past the task's ttl (and a poll interval): no follower left, no poll after.
    let left = expires_at.saturating_sub(taskgate::mcp::task::now_ms());
    tokio::time::sleep(Duration::from_millis(left + 300)).await;
    let stopped = eventually(STEP, || async {
        let m = tg.metrics_text().await;
        (metric(&m, "taskgate_upgrade_kept_followers", &[]) == 0.0).then_some(())
    })
    .await;
    assert!(stopped.is_some(), "the follower ended at the task's ttl");
    let polls = up.count("tasks/get");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(up.count("tasks/get"), polls, "no poll past the task's ttl");
    assert_eq!(up.count("tasks/cancel"), 0, "kept, not cancelled");
}

/// The background follower of a kept call (F13) never holds a graceful stop back (its task may
/// run for `upgrade.ttl_ms`), and sends nothing upstream once the stop has returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_ends_the_followers_of_kept_calls() {
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        ..UpBehaviour::default()
    })
    .await;
    let mut tg = UgConfig::new(&up.url())
        .with("on_client_disconnect = \"keep\"")
        .gateway("sse_keepalive_ms = 50")
        .gateway("drain_timeout_ms = 30000")
        .start()
        .await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let sse = c.send(call_body("1", "research", None)).await.sse();
    assert!(up.wait_count("tasks/result", 1, STEP).await);
    drop(sse);
    let disconnected = eventually(STEP, || async {
        let m = tg.metrics_text().await;
        (upgraded(&m, "disconnected") == 1.0).then_some(())
    })
    .await;
    assert!(disconnected.is_some());
    // Followed in the background: it polls on.
    let polls = up.count("tasks/get");
    assert!(up.wait_count("tasks/get", polls + 2, STEP).await);
    let running = tg.running.take().unwrap();
    let stopping = Instant::now();
    tokio::time::timeout(STEP, running.shutdown())
        .await
        .expect("the stop returns");
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopping.elapsed()
    );
    let polls = up.count("tasks/get");
    // Five poll intervals (100 ms): a follower left running would have polled.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(up.count("tasks/get"), polls, "no poll after the stop");
    assert_eq!(up.count("tasks/cancel"), 0);
}

// =============================================================================================
// Restart
// =============================================================================================

/// The real binary, SIGKILLed while following an upgraded task, restarted on the same store:
/// the upgraded task (its client is gone) is cancelled upstream and counted `orphaned`; a task
/// the client created itself is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_cancels_orphaned_upgraded_tasks() {
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        ..UpBehaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = UgConfig::new(&up.url()).write_for_binary(dir.path());
    let args = ["serve", "--config", config.as_str()];
    let mut first = TaskgateProcess::spawn(&args, &[]);
    let (gw, _) = first.listening();
    let url = format!("http://{gw}/mcp");
    let c = client_with(&url, json!({})).await;
    let own = c
        .rpc(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"maybe","arguments":{},"task":{"ttl":60000}}}"#)
        .await;
    let own_task = own["result"]["task"]["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    let sse = c.send(call_body("2", "research", None)).await.sse();
    assert!(up.wait_count("tasks/result", 1, STEP).await);
    let upgraded_task = up.task_of_request(&json!(2)).unwrap();

    first.signal(libc::SIGKILL);
    assert!(first.wait_exit(STEP).is_some(), "taskgate did not die");
    drop(sse);
    assert_eq!(up.count("tasks/cancel"), 0);

    let mut second = TaskgateProcess::spawn(&args, &[]);
    let (_, admin) = second.listening();
    assert!(
        up.wait_count("tasks/cancel", 1, STEP).await,
        "the orphan is cancelled after the restart; stderr: {}",
        second.stderr()
    );
    // The orphan pass is over once its only orphan's cancel answer is recorded.
    let recorded = eventually(STEP, || async {
        let (_, d) = admin_json(admin, &format!("/admin/tasks/default/{upgraded_task}")).await;
        (d["task"]["status"] == json!("cancelled")).then_some(())
    })
    .await;
    assert!(recorded.is_some(), "the orphan's cancel is recorded");
    let cancels = up.received("tasks/cancel");
    assert_eq!(cancels.len(), 1, "only the upgraded task");
    assert_eq!(cancels[0].json()["params"]["taskId"], json!(upgraded_task));
    assert_eq!(
        cancels[0].header("mcp-session-id").as_deref(),
        Some("sess-1")
    );
    assert_eq!(up.status(&upgraded_task), "cancelled");
    assert_eq!(up.status(&own_task), "working");
    let m = scrape(admin).await;
    assert_eq!(upgraded(&m, "orphaned"), 1.0, "{m}");
}

// =============================================================================================
// Ids
// =============================================================================================

/// A string id written with a JSON escape (`"a\/b"` is the string `a/b`): the upgraded call is
/// still answered, under that id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_string_id_is_answered() {
    let up = UpServer::default().await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let body = r#"{"jsonrpc":"2.0","id":"a\/b","method":"tools/call","params":{"name":"research","arguments":{}}}"#;
    let o = call(&c, body, &json!("a/b")).await;
    println!("answer: {}", o.answer);
    assert!(
        o.answer.get("result").is_some(),
        "the task's result under id \"a/b\", got {}",
        o.answer
    );
}

// =============================================================================================
// Robustness of the follower
// =============================================================================================

/// A slow tasks/get (the status poll) must not hold back the task's answer: tasks/result
/// answers 300 ms after creation, each tasks/get takes 1 s, pollInterval is 100 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_status_poll_does_not_delay_the_answer() {
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(300),
        poll_interval: 100,
        get_delay: Duration::from_secs(1),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let start = Instant::now();
    let mut sse = c.send(call_body("1", "research", None)).await.sse();
    let answer = loop {
        match sse.next(Duration::from_secs(30)).await {
            Next::Item(SseItem::Event(e)) => {
                let v = e.json();
                if v["id"] == json!(1) {
                    break v;
                }
            }
            Next::Item(_) => {}
            other => panic!("no answer within 30 s: {other:?}"),
        }
    };
    let elapsed = start.elapsed();
    let task_id = up.only_task();
    let result_at = up.seen("tasks/result", &task_id)[0];
    println!(
        "answer after {elapsed:?} (task ends at 300 ms; tasks/get: 1 s each, {} sent meanwhile; tasks/result sent at +{:?})",
        up.seen("tasks/get", &task_id).len(),
        result_at - up.task(&task_id).created
    );
    assert!(answer.get("result").is_some(), "{answer}");
    assert!(
        elapsed < Duration::from_millis(900),
        "the answer waited for status polls: {elapsed:?}"
    );
}

/// A server that closes the tasks/result SSE stream after its priming event (SSE polling,
/// 2025-11-25 transports: the client reconnects) still gets its result to the client: taskgate
/// must come back for it rather than report a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_result_stream_closed_before_the_answer_is_resumed() {
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(300),
        result_drops: 1,
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let o = call(&c, &call_body("1", "research", None), &json!(1)).await;
    let task_id = up.only_task();
    println!(
        "answer: {} (tasks/result calls upstream: {}, GETs: {})",
        o.answer,
        up.count("tasks/result"),
        up.up
            .requests()
            .iter()
            .filter(|r| r.method == "GET")
            .count()
    );
    assert_eq!(
        o.answer["result"]["content"][0]["text"],
        json!(format!("result of {task_id}")),
        "{o:?}"
    );
    assert_eq!(up.count("tasks/cancel"), 0);
}

/// The client's stream of an upgraded call is taskgate's own: none of its events carries an
/// upstream event `id`. The upstream's ids name events of taskgate's own exchanges (the
/// `tools/call` that made the task, its `tasks/result`); a client that resumed with
/// `Last-Event-ID` would have the upstream replay them (server-everything does): the
/// `CreateTaskResult` under the client's own id (the TypeScript SDK took it as an empty
/// `CallToolResult`), the answers to taskgate's polls, a task id it never asked for.
/// Events without data (SSE priming events) are not passed on either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgraded_streams_carry_no_upstream_event_ids() {
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(300),
        result_drops: 1,
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let r = c.send(call_body("1", "research", Some(json!("tok")))).await;
    assert_eq!(r.status(), 200);
    let mut sse = r.sse();
    let mut events = Vec::new();
    loop {
        let e = sse.next_event(STEP).await;
        let answer = e
            .data()
            .filter(|d| !d.is_empty())
            .map(|d| parse_json(d.as_bytes()))
            .is_some_and(|v| v.get("method").is_none() && v["id"] == json!(1));
        events.push(e);
        if answer {
            break;
        }
    }
    assert!(
        up.count("tasks/result") >= 2,
        "the priming-only tasks/result was sent"
    );
    for e in &events {
        assert!(
            e.id().is_none(),
            "an upstream event id reached the client: {e:?}"
        );
        assert!(
            e.data().is_some_and(|d| !d.is_empty()),
            "an event without data reached the client: {e:?}"
        );
    }
}

/// A GET stream resumed with `Last-Event-ID` (the TypeScript SDK resumes its GET stream by
/// itself, after a restart of taskgate too) gets what the upstream replays, and
/// server-everything replays every later event of the session: the `CreateTaskResult` of an
/// upgraded call (under the client's own id: the SDK resolved its `callTool` with it, an empty
/// result, when taskgate restarted during the call) and the answers to taskgate's own polls.
/// Neither is the client's: the task is recorded as an upgraded call's, and `"taskgate-…"` ids
/// are taskgate's. Both are dropped, and so is the upgraded task's status notification (the
/// client asked for no task: it gets the statuses as progress on its call's stream); the rest
/// of the stream, and an answer the client's own id may still get there, pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_get_stream_gets_no_upgraded_creation_nor_taskgates_own_answers() {
    let up = UpServer::start(UpBehaviour {
        get_stream: Some(Arc::new(move || {
            let replayed = [
                r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"taskId":"up-task-1","status":"working","ttl":60000,"createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z"}}}"#,
                r#"{"result":{"taskId":"up-task-1","status":"working","ttl":60000,"createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z"},"jsonrpc":"2.0","id":"taskgate-1"}"#,
                r#"{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{"taskId":"up-task-1","status":"completed","ttl":60000,"createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z"}}"#,
                r#"{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"the client's own"}]}}"#,
                &notification("notifications/tools/list_changed", "{}"),
            ];
            let mut steps: Vec<SseStep> = replayed
                .iter()
                .enumerate()
                .map(|(i, d)| ev().event("message").id(&format!("e{i}")).data(d).into())
                .collect();
            steps.push(SseStep::HoldOpen);
            steps
        })),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    // The upgraded call whose creation the upstream replays.
    let o = call(&c, &call_body("1", "research", None), &json!(1)).await;
    assert_eq!(up.only_task(), "up-task-1");
    assert!(o.answer["result"]["content"].is_array(), "{o:?}");
    let mut stream = c.resumed_get_stream().await;
    let first = stream.next_event(STEP).await.json();
    assert_eq!(
        first["id"],
        json!(2),
        "the first event passed is the client's own answer: {first}"
    );
    let next = stream.next_event(STEP).await.json();
    assert_eq!(
        next["method"],
        json!("notifications/tools/list_changed"),
        "{next}"
    );
}

/// Twenty upgraded calls at once on one session (numbers and strings, with their own progress
/// tokens): each answer carries its own id and its own task's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_upgraded_calls_each_get_their_own_result() {
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(400),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    list_tools(&c, "\"l\"", None).await;
    let mut calls = Vec::new();
    for i in 0..20 {
        let id = if i % 2 == 0 {
            json!(i)
        } else {
            json!(format!("{i}"))
        };
        let c = c.clone();
        calls.push(tokio::spawn(async move {
            let body = call_body(&id.to_string(), "research", Some(json!(format!("tok-{i}"))));
            (id.clone(), call(&c, &body, &id).await)
        }));
    }
    for h in calls {
        let (id, o) = h.await.unwrap();
        let task_id = up.task_of_request(&id).unwrap();
        assert_eq!(o.answer["id"], id);
        assert_eq!(
            o.answer["result"]["content"][0]["text"],
            json!(format!("result of {task_id}")),
            "{id}: {o:?}"
        );
        let want = json!(format!("tok-{}", id.to_string().trim_matches('"')));
        for p in o.progress() {
            assert_eq!(p["params"]["progressToken"], want, "{id}: {p}");
        }
    }
    let m = tg.metrics_text().await;
    assert_eq!(upgraded(&m, "completed"), 20.0);
}

/// The client cancels while taskgate still waits for the upstream's CreateTaskResult: once the
/// task exists it is cancelled upstream (one tasks/cancel) and the client gets no result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_before_the_task_is_created_still_cancels_it() {
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        creation_delay: Duration::from_millis(600),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    list_tools(&c, "\"l\"", None).await;
    let c2 = c.clone();
    let pending = tokio::spawn(async move {
        let r = c2.send(call_body("1", "research", None)).await;
        let mut sse = r.sse();
        let mut got = Vec::new();
        loop {
            match sse.next(Duration::from_secs(3)).await {
                Next::Item(SseItem::Event(e)) => got.push(e.data().unwrap_or_default()),
                Next::Item(_) => {}
                Next::End => return (got, "end"),
                Next::Timeout => return (got, "still open after 3 s"),
            }
        }
    });
    assert!(up.wait_count("tools/call", 1, STEP).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        c.notify("notifications/cancelled", json!({"requestId": 1}))
            .await,
        202
    );
    let (got, how) = tokio::time::timeout(STEP, pending).await.unwrap().unwrap();
    let task_id = up.only_task();
    println!(
        "client saw {got:?} then {how}; upstream: tasks/cancel x{}, notifications/cancelled x{}, tasks/result x{}, task {}",
        up.count("tasks/cancel"),
        up.count("notifications/cancelled"),
        up.count("tasks/result"),
        up.status(&task_id)
    );
    assert!(
        !got.iter()
            .any(|d| d.contains("\"result\"") || d.contains("\"error\"")),
        "no answer for the cancelled id: {got:?}"
    );
    assert_eq!(
        up.count("tasks/cancel"),
        1,
        "the task, once created, is cancelled once"
    );
    assert_eq!(up.status(&task_id), "cancelled");
}

/// The client goes away while taskgate still waits for the CreateTaskResult: with
/// `on_client_disconnect = "cancel"` the task is cancelled once it exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_before_the_task_is_created_still_cancels_it() {
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        creation_delay: Duration::from_millis(600),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url())
        .with("on_client_disconnect = \"cancel\"")
        .with("disconnect_grace_ms = 100")
        .gateway("sse_keepalive_ms = 50")
        .start()
        .await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    list_tools(&c, "\"l\"", None).await;
    let c2 = c.clone();
    let pending = tokio::spawn(async move {
        let _ = c2.send(call_body("1", "research", None)).await;
    });
    assert!(up.wait_count("tools/call", 1, STEP).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    pending.abort();
    let _ = pending.await;
    let cancelled = up
        .wait_count("tasks/cancel", 1, Duration::from_secs(3))
        .await;
    let task_id = up.only_task();
    let m = tg.metrics_text().await;
    println!(
        "after the disconnect: tasks/cancel x{}, tasks/result x{}, task {}, record {:?}, upgraded outcomes: disconnected={} completed={} upstream_error={}",
        up.count("tasks/cancel"),
        up.count("tasks/result"),
        up.status(&task_id),
        tg.record(&task_id).map(|r| r.status),
        upgraded(&m, "disconnected"),
        upgraded(&m, "completed"),
        upgraded(&m, "upstream_error"),
    );
    assert!(
        cancelled,
        "the task the client left behind is never cancelled"
    );
    assert_eq!(up.count("tasks/cancel"), 1);
}

/// An upstream without sessions and no auth: nothing tells clients apart, so taskgate keeps no
/// client's capabilities (one client's `initialize` must not decide for another). Every client
/// is treated as one without `capabilities.tasks`: `required` tools show as `optional`, in
/// whatever order the clients initialized, and a plain call to them is upgraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessionless_upstream_keeps_no_clients_view() {
    let up = UpServer::start(UpBehaviour {
        sessions: false,
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let aware = client_with(&tg.mcp_url(), json!({"tasks": {}})).await;
    let old = client_with(&tg.mcp_url(), json!({})).await;
    assert!(old.session.is_none() && aware.session.is_none());
    // The task-aware client initialized first; the later one must not inherit its view.
    let seen_old = task_support_of(&list_tools(&old, "\"a\"", None).await, "research");
    let seen_aware = task_support_of(&list_tools(&aware, "\"b\"", None).await, "research");
    println!("client without tasks sees {seen_old:?}, client with tasks sees {seen_aware:?}");
    assert_eq!(
        seen_old.as_deref(),
        Some("optional"),
        "the client without tasks"
    );
    assert_eq!(
        seen_aware.as_deref(),
        Some("optional"),
        "no per-client view without sessions"
    );
}

// =============================================================================================
// Benchmark (printed, not asserted): cargo test --test core -- --ignored --nocapture upgrade::bench
// =============================================================================================

/// Added latency of an upgraded call over the task's own duration: 200 sequential calls, each a
/// task that completes TASK_MS after creation. Baseline: a task-aware client doing the same
/// directly (task-augmented tools/call, then tasks/result), and through taskgate without upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_upgraded_call_added_latency() {
    const N: usize = 200;
    const TASK_MS: u64 = 50;
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(TASK_MS),
        poll_interval: 1000,
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let task = Duration::from_millis(TASK_MS);

    let c = client_with(&tg.mcp_url(), json!({})).await;
    list_tools(&c, "\"l\"", None).await;
    let mut upgraded_added = Vec::with_capacity(N);
    for i in 0..N + 10 {
        let t0 = Instant::now();
        let o = call(&c, &call_body(&i.to_string(), "research", None), &json!(i)).await;
        let total = t0.elapsed();
        assert!(o.answer.get("result").is_some(), "{o:?}");
        if i >= 10 {
            upgraded_added.push(total.saturating_sub(task));
        }
    }

    async fn task_aware(c: &Client, i: usize) -> Duration {
        let t0 = Instant::now();
        let v = c
            .rpc(rpc(
                &i.to_string(),
                "tools/call",
                r#"{"name":"research","arguments":{"n":1},"task":{"ttl":60000}}"#,
            ))
            .await;
        let id = v["result"]["task"]["taskId"].as_str().unwrap().to_string();
        let r = c.result(&format!("\"r{i}\""), &id).await;
        assert!(r.get("result").is_some(), "{r}");
        t0.elapsed()
    }
    let direct = client_with(&up.url(), json!({"tasks": {}})).await;
    let via = client_with(&tg.mcp_url(), json!({"tasks": {}})).await;
    let mut direct_added = Vec::with_capacity(N);
    let mut via_added = Vec::with_capacity(N);
    for i in 0..N + 10 {
        let d = task_aware(&direct, i).await;
        let g = task_aware(&via, i).await;
        if i >= 10 {
            direct_added.push(d.saturating_sub(task));
            via_added.push(g.saturating_sub(task));
        }
    }
    for v in [&mut upgraded_added, &mut direct_added, &mut via_added] {
        v.sort();
    }
    let line = |name: &str, v: &[Duration]| {
        println!(
            "{name:<58} p50 {:>6.2} ms  p90 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms",
            pct(v, 50.0),
            pct(v, 90.0),
            pct(v, 99.0),
            pct(v, 100.0)
        )
    };
    println!(
        "added latency over a {TASK_MS} ms task, {N} sequential calls (debug build, one TCP connection per request):"
    );
    line(
        "upgraded plain tools/call through taskgate",
        &upgraded_added,
    );
    line(
        "task-aware client direct (tools/call+task, tasks/result)",
        &direct_added,
    );
    line(
        "task-aware client through taskgate (same two requests)",
        &via_added,
    );
    println!(
        "upgrade overhead vs the task-aware client direct: p50 {:+.2} ms, p99 {:+.2} ms",
        pct(&upgraded_added, 50.0) - pct(&direct_added, 50.0),
        pct(&upgraded_added, 99.0) - pct(&direct_added, 99.0)
    );
}

// =============================================================================================
// Issue 10: hostile upstream bodies, callers told apart, bounded relay, terminal polls
// =============================================================================================

/// `tasks/result` answered with a JSON body that is not an object (`[]`, `42`, `"x"`): the
/// client gets a JSON-RPC error under its id (no panic in the follower) saying the upstream sent
/// an invalid response (such a body is not a JSON-RPC response: break-edge F3), and later calls
/// work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_object_tasks_result_body_is_an_error_and_later_calls_work() {
    let bodies = ["[]", "42", "\"x\""];
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(50),
        hook: Some(Arc::new(move |method, _id, task_id, _n| {
            let n: usize = task_id.strip_prefix("up-task-")?.parse().ok()?;
            (method == "tasks/result" && n <= 3)
                .then(|| ScriptedResponse::json(bodies[n - 1].to_string()))
        })),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    for (i, body) in bodies.iter().enumerate() {
        let id = json!(i + 1);
        let o = call(&c, &call_body(&id.to_string(), "research", None), &id).await;
        println!("tasks/result body {body}: client got {}", o.answer);
        assert_eq!(o.answer["id"], id);
        assert_eq!(o.answer["error"]["code"], json!(-32603), "{body}: {o:?}");
        let message = o.answer["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("upstream `default` sent an invalid response"),
            "{body}: {message}"
        );
    }
    let id = json!(4);
    let o = call(&c, &call_body("4", "research", None), &id).await;
    assert_eq!(
        o.answer["result"]["content"][0]["text"],
        json!("result of up-task-4"),
        "{o:?}"
    );
}

/// An upstream without sessions and no auth: two clients whose upgraded calls use the same
/// JSON-RPC id must not cancel each other; each gets its own task's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessionless_upstream_two_clients_same_id_each_get_their_own_answer() {
    let up = UpServer::start(UpBehaviour {
        sessions: false,
        task_ms: Some(400),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let a = client_with(&tg.mcp_url(), json!({})).await;
    let b = client_with(&tg.mcp_url(), json!({})).await;
    let id = json!(1);
    let body = call_body("1", "research", None);
    let (oa, ob) = tokio::join!(call(&a, &body, &id), call(&b, &body, &id));
    println!("client A got {}, client B got {}", oa.answer, ob.answer);
    let ta = oa.answer["result"]["content"][0]["text"]
        .as_str()
        .map(str::to_string);
    let tb = ob.answer["result"]["content"][0]["text"]
        .as_str()
        .map(str::to_string);
    assert!(
        ta.as_deref()
            .is_some_and(|t| t.starts_with("result of up-task-")),
        "A: {oa:?}"
    );
    assert!(
        tb.as_deref()
            .is_some_and(|t| t.starts_with("result of up-task-")),
        "B: {ob:?}"
    );
    assert_ne!(ta, tb, "each client gets its own task's result");
    assert_eq!(up.count("tasks/cancel"), 0, "nothing was cancelled");
    let m = tg.metrics_text().await;
    assert_eq!(upgraded(&m, "completed"), 2.0);
    assert_eq!(upgraded(&m, "cancelled"), 0.0);
}

/// `tasks/result` hangs while `tasks/get` says `completed`: the terminal poll ends the wait,
/// taskgate asks `tasks/result` again and the client gets the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_poll_while_tasks_result_hangs_asks_again() {
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(100),
        poll_interval: 100,
        hook: Some(Arc::new(|method, _id, _task, n| {
            (method == "tasks/result" && n == 1)
                .then(|| ScriptedResponse::sse(vec![SseStep::HoldOpen]))
        })),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let id = json!(1);
    let o = tokio::time::timeout(
        Duration::from_secs(5),
        call(&c, &call_body("1", "research", None), &id),
    )
    .await
    .expect("the client is answered after the terminal tasks/get");
    assert_eq!(
        o.answer["result"]["content"][0]["text"],
        json!("result of up-task-1"),
        "{o:?}"
    );
    assert_eq!(up.count("tasks/result"), 2);
}

/// `tasks/result` hangs every time while `tasks/get` says `completed`: after one more
/// `tasks/result` (bounded by the upstream timeout) the client gets an error naming the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_poll_with_tasks_result_hanging_twice_answers_with_the_status() {
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(100),
        poll_interval: 100,
        hook: Some(Arc::new(|method, _id, _task, _n| {
            (method == "tasks/result").then(|| ScriptedResponse::sse(vec![SseStep::HoldOpen]))
        })),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url())
        .upstream_line("timeout_ms = 300")
        .start()
        .await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let id = json!(1);
    let o = tokio::time::timeout(
        Duration::from_secs(5),
        call(&c, &call_body("1", "research", None), &id),
    )
    .await
    .expect("the client is answered after the terminal tasks/get");
    println!("client got {}", o.answer);
    assert_eq!(o.answer["error"]["code"], json!(-32603), "{o:?}");
    let message = o.answer["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("completed"), "{message}");
    assert_eq!(up.count("tasks/result"), 2);
}

/// More events before the CreateTaskResult than the relay buffers: the exchange ends with a
/// JSON-RPC error, the task is cancelled upstream, and the overflow is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_events_before_the_task_end_the_exchange_with_an_error() {
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        creation_head: Some(Arc::new(|_task, _call| {
            (0..1100)
                .map(|i| {
                    let n = json!({"jsonrpc": "2.0", "method": "notifications/message",
                        "params": {"level": "info", "data": format!("line {i}")}});
                    ev().event("message").data(&n.to_string()).into()
                })
                .collect()
        })),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let id = json!(1);
    let o = call(&c, &call_body("1", "research", None), &id).await;
    println!("client got {} after {} messages", o.answer, o.before.len());
    assert_eq!(o.answer["error"]["code"], json!(-32603), "{:?}", o.answer);
    assert!(
        o.before.len() <= 1024,
        "{} messages relayed",
        o.before.len()
    );
    assert!(
        up.wait_count("tasks/cancel", 1, Duration::from_secs(5))
            .await,
        "the task is cancelled upstream"
    );
    let m = tg.metrics_text().await;
    assert_eq!(upgraded(&m, "relay_overflow"), 1.0);
}

/// An upstream without sessions and no auth, two live upgraded calls with the same id: a
/// `notifications/cancelled` for that id cannot say whose call it means, so it cancels neither
/// (documented in the upgrade module); both calls complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_cancel_on_a_sessionless_upstream_cancels_no_call() {
    let up = UpServer::start(UpBehaviour {
        sessions: false,
        task_ms: Some(600),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let a = client_with(&tg.mcp_url(), json!({})).await;
    let b = client_with(&tg.mcp_url(), json!({})).await;
    let id = json!(1);
    let body = call_body("1", "research", None);
    let cancel = async {
        assert!(
            up.wait_count("tools/call", 2, Duration::from_secs(5)).await,
            "both calls reach the upstream"
        );
        let s = a
            .notify("notifications/cancelled", json!({"requestId": 1}))
            .await;
        assert_eq!(s, 202);
    };
    let (oa, ob, ()) = tokio::join!(call(&a, &body, &id), call(&b, &body, &id), cancel);
    println!("client A got {}, client B got {}", oa.answer, ob.answer);
    assert!(oa.answer.get("result").is_some(), "A: {oa:?}");
    assert!(ob.answer.get("result").is_some(), "B: {ob:?}");
    assert_eq!(up.count("tasks/cancel"), 0, "nothing was cancelled");
}

/// Waits (bounded) for the end of an upgraded call: its `outcome` counted in
/// `taskgate_upgraded_calls_total` and its task recorded `cancelled`. After that nothing of the
/// call is left to send another request upstream, so "exactly one tasks/cancel" can be checked
/// without a fixed sleep.
async fn call_ended(tg: &Tg, task_id: &str, outcome: &str) -> bool {
    eventually(STEP, || async {
        let m = tg.metrics_text().await;
        let cancelled = tg.record(task_id).map(|r| r.status) == Some(TaskStatus::Cancelled);
        (upgraded(&m, outcome) == 1.0 && cancelled).then_some(())
    })
    .await
    .is_some()
}

/// Issue 37 #3: the same restart with a pure 2026-07-28 upstream that checks its headers
/// strictly (a held session, the upgraded call bridged, no auth: the record's owner is the
/// client's held session): the orphan's `tasks/cancel` passes taskgate's own owner check and
/// reaches the upstream, with `Mcp-Name`. On f2cd7c5 the restarted taskgate refused its own
/// cancel (`-32602 Task not found`: it asked as nobody), nothing reached the upstream, and the
/// log said the task was cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_cancels_an_orphaned_upgraded_task_on_a_2026_upstream() {
    let (up, state) = strict_pure_server().await;
    let dir = tempfile::tempdir().unwrap();
    let config = UgConfig::new(&up.url()).write_for_binary(dir.path());
    let args = ["serve", "--config", config.as_str()];
    let mut first = TaskgateProcess::spawn(&args, &[]);
    let (gw, _) = first.listening();
    let url = format!("http://{gw}/mcp");
    let c = client_with(&url, json!({})).await;
    let sse = c
        .send(call_body("2", "task_only", Some(json!("pt-2"))))
        .await
        .sse();
    assert!(up.wait_for_method("tasks/get", 1, STEP).await, "followed");
    let task = state.lock().unwrap().tasks.keys().next().cloned().unwrap();

    first.signal(libc::SIGKILL);
    assert!(first.wait_exit(STEP).is_some(), "taskgate did not die");
    drop(sse);
    assert_eq!(up.received("tasks/cancel").len(), 0);

    let mut second = TaskgateProcess::spawn(&args, &[]);
    let (_, admin) = second.listening();
    assert!(
        up.wait_for_method("tasks/cancel", 1, STEP).await,
        "the orphan is cancelled upstream after the restart; stderr: {}",
        second.stderr()
    );
    let cancel = up.received("tasks/cancel").pop().unwrap();
    assert_eq!(cancel.json()["params"]["taskId"], json!(task));
    assert_eq!(cancel.header("mcp-name").as_deref(), Some(task.as_str()));
    let recorded = eventually(STEP, || async {
        let (_, d) = admin_json(admin, &format!("/admin/tasks/default/{task}")).await;
        (d["task"]["status"] == json!("cancelled")).then_some(())
    })
    .await;
    assert!(recorded.is_some(), "the orphan's cancel is recorded");
    assert_eq!(state.lock().unwrap().tasks[&task], "cancelled");
}

// =============================================================================================
// Tester 5 #3: an upstream out of reach for a while, and a follow that gives up
// =============================================================================================

/// `taskgate_upstream_errors_total{kind="connect"}`: connections to the upstream refused.
async fn refused_connections(tg: &Tg) -> f64 {
    let m = tg.metrics_text().await;
    metric(&m, "taskgate_upstream_errors_total", &[("kind", "connect")])
}

/// Tester 5 #3: a blip (every connection to the upstream cut, new ones refused) while an
/// upgraded call is followed. taskgate asks `tasks/result` again, with backoff, and once the
/// upstream is back the client gets the task's result, the record ends `completed`, nothing is
/// cancelled. Before: at the first refused request the client got `-32603 "following the
/// upgraded task failed: upstream … unreachable"`, and the record stayed `working`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blip_to_the_upstream_while_an_upgraded_call_is_followed_is_ridden_out() {
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        ..UpBehaviour::default()
    })
    .await;
    let blip = Blip::start(up.up.addr).await;
    let tg = UgConfig::new(&blip.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let called = tokio::spawn({
        let c = c.clone();
        async move { call(&c, &call_body("1", "research", None), &json!(1)).await }
    });
    assert!(up.wait_count("tasks/result", 1, STEP).await);
    let task_id = up.only_task();
    blip.down().await;
    // taskgate finds the upstream out of reach: its tasks/result stream cut, a new exchange
    // refused.
    let refused = eventually(STEP, || async {
        (refused_connections(&tg).await >= 1.0).then_some(())
    })
    .await;
    assert!(refused.is_some(), "taskgate tried the upstream while down");
    // The task ends upstream meanwhile; then the upstream is back.
    up.state
        .lock()
        .unwrap()
        .tasks
        .get_mut(&task_id)
        .unwrap()
        .ends_at = Some(Instant::now());
    blip.up().await;
    let o = called.await.unwrap();
    assert_eq!(
        o.answer["result"]["content"][0]["text"],
        json!(format!("result of {task_id}")),
        "the client gets the task's result: {o:?}"
    );
    let ended = eventually(STEP, || async {
        let r = tg.record(&task_id)?;
        r.status.is_terminal().then_some(r.status)
    })
    .await;
    assert_eq!(ended, Some(TaskStatus::Completed));
    assert_eq!(up.count("tasks/cancel"), 0, "nothing cancelled");
    let m = tg.metrics_text().await;
    assert_eq!(upgraded(&m, "completed"), 1.0);
    assert_eq!(upgraded(&m, "upstream_error"), 0.0);
}

/// Tester 5 #3, 5xx: something in front of the upstream answers the upgraded call's
/// `tasks/result` 503 with a JSON-RPC error for no request (`id: null`) twice, then 502 with an
/// HTML page three times: taskgate asks again, with backoff, and the client gets the result.
/// Before: the 503's error was taken for the answer (the client got `-32000`); a body that is
/// no answer at all was asked again at most 5 times, 100 ms apart, then the call failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_to_an_upgraded_calls_tasks_result_is_asked_again() {
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(0),
        // Status polls never answer in time: only tasks/result is followed.
        get_delay: Duration::from_secs(60),
        hook: Some(Arc::new(|method, _id, _task, n| {
            if method != "tasks/result" {
                return None;
            }
            match n {
                1 | 2 => Some(ScriptedResponse::status(
                    503,
                    Some("application/json"),
                    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"no healthy upstream"}}"#,
                )),
                3..=5 => Some(ScriptedResponse::status(
                    502,
                    Some("text/html"),
                    "<html><body>502 Bad Gateway</body></html>",
                )),
                _ => None,
            }
        })),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let o = call(&c, &call_body("1", "research", None), &json!(1)).await;
    let task_id = up.only_task();
    assert_eq!(
        o.answer["result"]["content"][0]["text"],
        json!(format!("result of {task_id}")),
        "{o:?}"
    );
    assert_eq!(up.count("tasks/result"), 6);
    assert_eq!(up.count("tasks/cancel"), 0);
}

/// Tester 5 #3, giving up: the upstream stays out of reach until the task's ttl
/// (`upgrade.ttl_ms` = 1.5 s here). taskgate gives up just before it (150 ms: a tenth of the
/// ttl, at most 1 s, so that the cancel and the record's end find the record live): the
/// client gets `-32603` saying
/// why, a `tasks/cancel` is tried (nothing listens), and the record is `failed` with a
/// `statusMessage` saying why, so the owner's live-task slot (`max_live_tasks_per_owner = 1`)
/// is free: once the upstream is back, the client's next call is admitted. Before: the client
/// got the error at the first refused request, no cancel was tried, and the record stayed
/// `working`, holding the slot (the plain client never learned the task id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_call_whose_upstream_stays_away_is_given_up_and_its_record_failed() {
    let up = UpServer::start(UpBehaviour {
        task_ms: Some(300),
        ..UpBehaviour::default()
    })
    .await;
    let blip = Blip::start(up.up.addr).await;
    let tg = UgConfig::new(&blip.url())
        .with("ttl_ms = 1500")
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let sse = c.send(call_body("1", "research", None)).await.sse();
    assert!(up.wait_count("tasks/result", 1, STEP).await);
    let task_id = up.only_task();
    blip.down().await;
    let mut sse = sse;
    let o = read_to_answer(&mut sse, &json!(1), String::new(), Instant::now()).await;
    assert_eq!(err_code(&o.answer), -32603, "{o:?}");
    let message = err_message(&o.answer);
    assert!(message.contains("unreachable"), "{message}");
    let failed = eventually(STEP, || async {
        let r = tg.record(&task_id)?;
        (r.status == TaskStatus::Failed).then_some(r)
    })
    .await;
    let r = failed.unwrap_or_else(|| {
        panic!(
            "the record is failed, not left working: {:?}",
            tg.record(&task_id).map(|r| r.status)
        )
    });
    let why = r.status_message.clone().unwrap_or_default();
    assert!(why.contains("unreachable"), "statusMessage says why: {why}");
    assert!(r.cancel_requested_at.is_some(), "a tasks/cancel was tried");
    blip.up().await;
    let o = call(&c, &call_body("2", "research", None), &json!(2)).await;
    assert!(
        o.answer.get("result").is_some(),
        "the owner's slot is free again: {:?}",
        o.answer
    );
}

/// Tester 5 #3, giving up while the upstream answers: every `tasks/result` and `tasks/get` of
/// the upgraded call is answered 503 until the task's ttl (1.5 s). taskgate gives up just
/// before it and
/// sends the one `tasks/cancel`, which the upstream takes: the record ends `cancelled`, and
/// the client got `-32603` saying why. Before: after five 503s, 100 ms apart, the client got
/// the error, no cancel was sent, and the record stayed `working`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_call_given_up_on_5xx_is_cancelled_once() {
    let up = UpServer::start(UpBehaviour {
        task_ms: None,
        hook: Some(Arc::new(|method, _id, _task, _n| {
            matches!(method, "tasks/result" | "tasks/get")
                .then(|| ScriptedResponse::status(503, Some("text/plain"), "upstream overloaded"))
        })),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).with("ttl_ms = 1500").start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let o = call(&c, &call_body("1", "research", None), &json!(1)).await;
    let task_id = up.only_task();
    assert_eq!(err_code(&o.answer), -32603, "{o:?}");
    let message = err_message(&o.answer);
    assert!(message.contains("503"), "{message}");
    let ended = eventually(STEP, || async {
        let r = tg.record(&task_id)?;
        r.status.is_terminal().then_some(r.status)
    })
    .await;
    assert_eq!(
        ended,
        Some(TaskStatus::Cancelled),
        "cancelled upstream, not left working"
    );
    assert_eq!(up.count("tasks/cancel"), 1);
    assert_eq!(up.status(&task_id), "cancelled");
    let m = tg.metrics_text().await;
    assert_eq!(upgraded(&m, "upstream_error"), 1.0);
}

/// Tester 5 #8b: the result a plain client gets for an upgraded call names no task: the
/// `_meta["io.modelcontextprotocol/related-task"]` of the `tasks/result` answer (2025-11-25
/// puts it there) is removed, the rest of `_meta` and the result kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_calls_result_names_no_task() {
    let up = UpServer::start(UpBehaviour {
        hook: Some(Arc::new(|method, id, task, _n| {
            (method == "tasks/result").then(|| {
                let result = json!({
                    "content": [{"type": "text", "text": "done"}],
                    "structuredContent": {"n": 1},
                    "_meta": {RELATED: {"taskId": task}, "x-kept": {"a": 1}},
                });
                ScriptedResponse::json(rpc_result(id, &result.to_string()))
            })
        })),
        ..UpBehaviour::default()
    })
    .await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let o = call(&c, &call_body("1", "research", None), &json!(1)).await;
    assert_eq!(
        o.answer["result"],
        json!({
            "content": [{"type": "text", "text": "done"}],
            "structuredContent": {"n": 1},
            "_meta": {"x-kept": {"a": 1}},
        }),
        "{o:?}"
    );
}
