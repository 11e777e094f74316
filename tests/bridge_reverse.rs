//! A 2026-07-28 client on a 2025-11-25-only task server (issue 33, the reverse bridge): taskgate
//! answers `server/discover` from the `initialize` of a 2025 session it holds, sends every
//! request on that session in the 2025 form, runs task tools as 2025 tasks and answers them in
//! the 2026 form. The scripted upstream is `common/task_server.rs`'s `UpServer`, made
//! 2025-only: it refuses `server/discover` without a session as the TypeScript SDK 1.x does
//! (HTTP 400, `-32000`). Only the wire, the upstream's received requests and the registry are
//! asserted.

use crate::common::*;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use taskgate::mcp::era::Era;
use taskgate::mcp::task::TaskStatus;
use taskgate::store::{Origin, Owner};

/// `_meta` key naming the listen a notification belongs to (2026-07-28 §2.3).
const SUB_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// What the TypeScript SDK 1.x answers a request without `Mcp-Session-Id` that is not
/// `initialize`.
fn no_session(id: &str) -> ScriptedResponse {
    ScriptedResponse::status(
        400,
        Some("application/json"),
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32000,"message":"Bad Request: No valid session ID provided"}}}}"#
        ),
    )
}

/// `b` made 2025-only (see the module docs), with `hook` consulted first.
async fn legacy_server_with(mut b: UpBehaviour, hook: Option<Hook>) -> UpServer {
    b.hook = Some(Arc::new(move |method, id, task_id, n| {
        if method == "server/discover" {
            return Some(no_session(id));
        }
        hook.as_ref().and_then(|h| h(method, id, task_id, n))
    }));
    UpServer::start(b).await
}

async fn legacy_server() -> UpServer {
    legacy_server_with(UpBehaviour::default(), None).await
}

/// The upstream's requests of `method` as JSON.
fn bodies(up: &UpServer, method: &str) -> Vec<Value> {
    up.received(method).iter().map(|r| r.json()).collect()
}

async fn call(url: &str, token: Option<&str>, id: u64, tool: &str, ext: bool) -> (u16, Value) {
    send(modern_req(
        url,
        token,
        id,
        "tools/call",
        json!({"name": tool, "arguments": {}, "_meta": meta(ext)}),
    ))
    .await
}

/// Polls 2026 `tasks/get` until the task is terminal; returns the last answer.
async fn until_terminal(url: &str, token: Option<&str>, task_id: &str) -> Value {
    let done = eventually(STEP, || async {
        let (_, v) = task_call(url, token, 50, "tasks/get", task_id).await;
        matches!(
            v["result"]["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        )
        .then_some(v)
    })
    .await;
    done.expect("the task ends")
}

/// `server/discover` is answered from the held session's `InitializeResult`: 2026-07-28 among
/// the versions, the tasks extension offered (the upstream has `tasks.requests.tools.call`),
/// the upstream's other capabilities and its serverInfo; one `initialize` serves later requests.
#[tokio::test]
async fn discover_is_answered_from_the_upstream_initialize() {
    let up = legacy_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let (status, v) = send(modern_req(&url, None, 1, "server/discover", json!({}))).await;
    assert_eq!(status, 200, "{v}");
    let r = &v["result"];
    assert_eq!(r["resultType"], "complete", "{v}");
    let versions = r["supportedVersions"].as_array().unwrap();
    assert!(versions.contains(&json!("2026-07-28")), "{v}");
    assert_eq!(r["capabilities"]["extensions"][EXT], json!({}), "{v}");
    assert!(r["capabilities"]["tools"].is_object(), "{v}");
    assert!(r["capabilities"].get("tasks").is_none(), "{v}");
    assert!(
        r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"].is_string(),
        "{v}"
    );
    assert_eq!(
        r["cacheScope"], "public",
        "SEP-2549: private or public: {v}"
    );
    let (_, again) = send(modern_req(&url, None, 2, "server/discover", json!({}))).await;
    assert_eq!(again["result"], v["result"]);
    // A list result carries the caching hints 2026-07-28 requires (none from a 2025 server:
    // not to be cached, private).
    let (status, l) = send(modern_req(&url, None, 3, "tools/list", json!({}))).await;
    assert_eq!(status, 200, "{l}");
    assert_eq!(
        (&l["result"]["ttlMs"], &l["result"]["cacheScope"]),
        (&json!(0), &json!("private")),
        "{l}"
    );
    // 2026-07-28 has no `Tool.execution.taskSupport` (tester 5 #10: it was passed on).
    let tools = l["result"]["tools"].as_array().unwrap();
    assert!(
        !tools.is_empty()
            && tools
                .iter()
                .all(|t| t.pointer("/execution/taskSupport").is_none()),
        "{l}"
    );
    assert_eq!(up.count("initialize"), 1);
    assert_eq!(up.count("notifications/initialized"), 1);
    let init = &bodies(&up, "initialize")[0];
    assert_eq!(init["params"]["protocolVersion"], "2025-11-25", "{init}");

    // An upstream without task tools: no extension offered.
    let plain = legacy_server_with(
        UpBehaviour {
            tasks_capability: None,
            ..UpBehaviour::default()
        },
        None,
    )
    .await;
    let tg2 = TgConfig::new(&plain.url()).start().await;
    let (_, v) = send(modern_req(
        &tg2.mcp_url(),
        None,
        1,
        "server/discover",
        json!({}),
    ))
    .await;
    assert!(
        v["result"]["capabilities"].get("extensions").is_none(),
        "{v}"
    );
}

/// A request goes out on the held session in the 2025 form: `MCP-Protocol-Version:
/// 2025-11-25`, the session id, no `io.modelcontextprotocol/*` `_meta` (`traceparent` kept),
/// under taskgate's own id; the answer comes back under the client's id with `resultType`.
#[tokio::test]
async fn requests_go_out_in_the_2025_form_on_the_held_session() {
    let up = legacy_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut m = meta(true);
    m["traceparent"] = json!("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    let (status, v) = send(modern_req(
        &tg.mcp_url(),
        None,
        41,
        "tools/list",
        json!({"_meta": m}),
    ))
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["id"], 41, "{v}");
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert_eq!(
        v["result"]["tools"].as_array().map(Vec::len),
        Some(4),
        "{v}"
    );
    let sent = up.received("tools/list");
    let last = sent.last().unwrap();
    assert_eq!(
        last.header("mcp-protocol-version").as_deref(),
        Some("2025-11-25")
    );
    assert_eq!(last.header("mcp-session-id").as_deref(), Some("sess-1"));
    assert!(last.header("mcp-method").is_none());
    let body = last.json();
    assert_ne!(body["id"], 41, "taskgate's own id: {body}");
    let meta = &body["params"]["_meta"];
    assert_eq!(meta["traceparent"], m["traceparent"], "{body}");
    assert!(
        meta.as_object()
            .unwrap()
            .keys()
            .all(|k| !k.starts_with("io.modelcontextprotocol/")),
        "{body}"
    );
}

/// A `required` tool runs as a 2025 task (ttl = `tasks.max_ttl_ms`), answered flat
/// (`resultType:"task"`, `ttlMs`, `pollIntervalMs`) and recorded (era legacy, origin bridged, the
/// upstream session); `tasks/get` follows it, and at the end fetches `tasks/result` once and
/// answers the result inline; later polls are answered from the record.
#[tokio::test]
async fn a_task_tool_runs_as_a_task_and_its_result_comes_inline() {
    let up = legacy_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_ttl_ms = 600000")
        .start()
        .await;
    let url = tg.mcp_url();
    let (status, v) = call(&url, None, 1, "research", true).await;
    assert_eq!(status, 200, "{v}");
    let r = &v["result"];
    assert_eq!(r["resultType"], "task", "{v}");
    assert_eq!(r["status"], "working", "{v}");
    assert_eq!(r["ttlMs"], 600000, "{v}");
    assert_eq!(r["pollIntervalMs"], 100, "{v}");
    assert!(r.get("task").is_none() && r.get("ttl").is_none(), "{v}");
    let t = r["taskId"].as_str().unwrap().to_string();
    let sent = &bodies(&up, "tools/call")[0];
    assert_eq!(sent["params"]["task"]["ttl"], 600000, "{sent}");
    let rec = tg.record(&t).expect("recorded before the answer");
    assert_eq!(
        (rec.era, rec.origin, rec.owner.clone()),
        (Era::Legacy, Origin::Bridged, Owner::Anonymous)
    );
    assert_eq!(rec.upstream_session.as_deref(), Some("sess-1"));

    let done = until_terminal(&url, None, &t).await;
    let r = &done["result"];
    assert_eq!(
        (r["resultType"].clone(), r["status"].clone()),
        (json!("complete"), json!("completed")),
        "{done}"
    );
    assert_eq!(
        r["result"]["content"][0]["text"],
        format!("result of {t}"),
        "{done}"
    );
    assert_eq!(r["result"]["resultType"], "complete", "{done}");
    assert_eq!(up.count("tasks/result"), 1);
    let gets = up.count("tasks/get");
    let (_, again) = task_call(&url, None, 60, "tasks/get", &t).await;
    assert_eq!(again["result"]["result"], r["result"], "{again}");
    assert_eq!(up.count("tasks/get"), gets, "answered from the record");
    assert_eq!(tg.record(&t).unwrap().status, TaskStatus::Completed);
}

/// A 2025-11-25 server that answers the bridged 2025 task call in the 2026-07-28 flat shape
/// (`resultType:"task"`, `taskId` at the top, no `task` object) started a task taskgate cannot
/// record as a 2025 creation: the 2026 client gets `-32603` "malformed CreateTaskResult", not
/// a taskId, and that task is cancelled upstream once. Before: the answer went to the client as
/// it came, a `CreateTaskResult` naming a task never recorded (its `tasks/get` and
/// `tasks/cancel` refused `-32602`), left running upstream.
#[tokio::test]
async fn a_2026_shaped_creation_from_a_2025_server_is_refused_and_cancelled() {
    let hook: Hook = Arc::new(|method, id, _, _| {
        (method == "tools/call").then(|| {
            let flat = json!({"resultType": "task", "taskId": "flat-1", "status": "working",
                "ttlMs": 60000, "createdAt": "2026-12-07T00:00:00Z",
                "lastUpdatedAt": "2026-12-07T00:00:00Z"});
            ScriptedResponse::json(rpc_result(id, &flat.to_string()))
        })
    });
    let up = legacy_server_with(UpBehaviour::default(), Some(hook)).await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (status, v) = call(&tg.mcp_url(), None, 1, "research", true).await;
    assert_eq!(v["error"]["code"], -32603, "{v}");
    assert_eq!(
        status, 200,
        "README: 200, as any malformed CreateTaskResult"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("other protocol era")),
        "{v}"
    );
    assert!(
        up.up
            .wait_for_method("tasks/cancel", 1, std::time::Duration::from_secs(5))
            .await,
        "the task it named is cancelled upstream"
    );
    assert_eq!(bodies(&up, "tasks/cancel")[0]["params"]["taskId"], "flat-1");
    assert!(tg.record("flat-1").is_none());
}

/// A 2025-11-25 `CreateTaskResult` whose taskId is not a string names no task anyone could
/// ask about: `-32603` "malformed CreateTaskResult" (README), nothing recorded, to a 2026 client
/// through the reverse bridge and to a 2025 client alike. Before: the 2025 client got it as it
/// came (the one-pass reader of 2025 creations took "no record made" for "no task").
#[tokio::test]
async fn a_2025_creation_without_a_string_task_id_is_refused() {
    let hook: Hook = Arc::new(|method, id, _, _| {
        (method == "tools/call").then(|| {
            let nested = json!({"task": {"taskId": 5, "status": "working", "ttl": 60000,
                "createdAt": "2026-12-07T00:00:00Z", "lastUpdatedAt": "2026-12-07T00:00:00Z"}});
            ScriptedResponse::json(rpc_result(id, &nested.to_string()))
        })
    });
    let up = legacy_server_with(UpBehaviour::default(), Some(hook.clone())).await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (_, v) = call(&tg.mcp_url(), None, 1, "research", true).await;
    assert_eq!(v["error"]["code"], -32603, "2026 client: {v}");
    let up = UpServer::start(UpBehaviour {
        hook: Some(hook),
        ..Default::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "research", "arguments": {}, "task": {"ttl": 60000}}});
    let v = c.rpc(body.to_string()).await;
    assert_eq!(v["error"]["code"], -32603, "2025 client: {v}");
}

/// `tasks.max_live_tasks_per_owner` holds for a bridged task before anything goes upstream:
/// taskgate, not the 2025-11-25 server, decides that a 2026-07-28 call becomes a task, so with
/// a limit of 1 and one live task the owner's second is `-32029` and the server gets no second
/// task-augmented `tools/call`. (Before: the server made the task, and taskgate cancelled it.)
#[tokio::test]
async fn a_bridged_task_over_the_owner_limit_is_refused_before_it_goes_upstream() {
    let up = legacy_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, None, 1, "research", true).await;
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    let (status, v) = call(&url, None, 2, "research", true).await;
    assert_eq!((status, err_code(&v)), (200, -32029), "{v}");
    assert_eq!(
        up.count("tools/call"),
        1,
        "the refused call never went upstream"
    );
    assert_eq!(up.count("tasks/cancel"), 0, "nothing to cancel upstream");
}

/// `optional` runs as a task only when the request declares the extension; a `required` tool
/// without it is `-32021` (HTTP 400) and nothing goes upstream; a plain tool's answer gets
/// `resultType:"complete"`.
#[tokio::test]
async fn the_extension_decides_optional_tools_and_required_ones_need_it() {
    let up = legacy_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let (status, v) = call(&url, None, 1, "maybe", false).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert_eq!(v["result"]["content"][0]["text"], "plain maybe", "{v}");
    assert!(bodies(&up, "tools/call")[0]["params"].get("task").is_none());
    let (_, v) = call(&url, None, 2, "maybe", true).await;
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    let (_, v) = call(&url, None, 3, "plain", true).await;
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    let calls = up.count("tools/call");
    let (status, v) = call(&url, None, 4, "research", false).await;
    assert_eq!((status, err_code(&v)), (400, -32021), "{v}");
    assert!(v["error"]["data"]["requiredCapabilities"]["extensions"][EXT].is_object());
    assert_eq!(up.count("tools/call"), calls, "nothing upstream");
    // Params taskgate cannot read are refused, never sent on without them.
    let body = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"plain","arguments":{"n":1e400},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
    let r = Req::mcp_post(&url, body)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "plain");
    let (status, v) = send(r).await;
    assert_eq!((status, err_code(&v)), (400, -32602), "{v}");
    assert_eq!(up.count("tools/call"), calls, "nothing upstream");
    // So are a `_meta` that is not an object and a progress token of another type: under the
    // client's id (the 2025 upstream would answer a parse error under no id).
    for (i, meta) in ["null", "[]", "\"x\"", r#"{"progressToken":{"a":1}}"#]
        .iter()
        .enumerate()
    {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"plain","arguments":{{}},"_meta":{meta}}}}}"#,
            10 + i
        );
        let r = Req::mcp_post(&url, body)
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "plain");
        let (status, v) = send(r).await;
        assert_eq!((status, err_code(&v)), (400, -32602), "_meta {meta}: {v}");
        assert_eq!(v["id"], 10 + i, "under the client's id: {v}");
    }
    assert_eq!(up.count("tools/call"), calls, "nothing upstream");
}

/// taskgate is the 2026-07-28 server of a reverse-bridged client: a request without the
/// `_meta` every 2026-07-28 request must carry (`io.modelcontextprotocol/protocolVersion` and
/// `io.modelcontextprotocol/clientCapabilities`) is refused `-32602`, HTTP 400, naming what is
/// missing, under the client's id, and sent nowhere (2026-07-28 basic: required request
/// `_meta`). Before, it was served as if the client had declared nothing.
#[tokio::test]
async fn a_request_without_its_required_meta_is_refused() {
    let up = legacy_server().await;
    let tg = UgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let cases = [
        ("", "_meta"),
        (r#","_meta":{}"#, "protocolVersion"),
        (
            r#","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#,
            "clientCapabilities",
        ),
        (
            r#","_meta":{"io.modelcontextprotocol/clientCapabilities":{}}"#,
            "protocolVersion",
        ),
    ];
    for (i, (meta, named)) in cases.iter().enumerate() {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"tools/list","params":{{"cursor":null{meta}}}}}"#,
            20 + i
        );
        let r = Req::mcp_post(&url, body)
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/list");
        let (status, v) = send(r).await;
        assert_eq!((status, err_code(&v)), (400, -32602), "{meta}: {v}");
        assert!(err_message(&v).contains(named), "{meta}: {v}");
        assert_eq!(v["id"], 20 + i, "under the client's id: {v}");
    }
    assert_eq!(up.count("tools/list"), 0, "nothing upstream");
}

/// A failed tool call keeps its content (2026: `completed` with `isError`); a JSON-RPC error
/// becomes `failed` with that error.
#[tokio::test]
async fn a_failed_task_keeps_its_content_or_its_error() {
    for (payload, check) in [
        (Payload::IsError, "content"),
        (Payload::RpcError(-32050, "the job broke".into()), "error"),
    ] {
        let up = legacy_server_with(
            UpBehaviour {
                payload,
                ..UpBehaviour::default()
            },
            None,
        )
        .await;
        let tg = TgConfig::new(&up.url()).start().await;
        let url = tg.mcp_url();
        let (_, v) = call(&url, None, 1, "research", true).await;
        let t = v["result"]["taskId"].as_str().unwrap().to_string();
        let done = until_terminal(&url, None, &t).await;
        let r = &done["result"];
        if check == "content" {
            assert_eq!(r["status"], "completed", "{done}");
            assert_eq!(r["result"]["isError"], true, "{done}");
            assert!(
                r["result"]["content"]
                    .as_array()
                    .is_some_and(|c| !c.is_empty()),
                "{done}"
            );
        } else {
            assert_eq!(r["status"], "failed", "{done}");
            assert_eq!(r["error"]["code"], -32050, "{done}");
            assert_eq!(r["error"]["message"], "the job broke", "{done}");
        }
    }
}

/// Twenty concurrent 2026 `tasks/cancel`s make one upstream 2025 `tasks/cancel`; each caller
/// gets the ack; the task then reads `cancelled`, and a cancel of it is acknowledged here.
#[tokio::test]
async fn cancel_is_one_upstream_cancel_and_acked() {
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: None,
            ..UpBehaviour::default()
        },
        None,
    )
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, None, 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    let cancels = (0..20).map(|i| task_call(&url, None, 100 + i, "tasks/cancel", &t));
    for (status, v) in futures_util::future::join_all(cancels).await {
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["result"], json!({"resultType": "complete"}), "{v}");
    }
    assert_eq!(up.count("tasks/cancel"), 1);
    let last = up.received("tasks/cancel")[0].clone();
    assert_eq!(last.header("mcp-session-id").as_deref(), Some("sess-1"));
    let done = until_terminal(&url, None, &t).await;
    assert_eq!(done["result"]["status"], "cancelled", "{done}");
    let (_, v) = task_call(&url, None, 200, "tasks/cancel", &t).await;
    assert_eq!(v["result"], json!({"resultType": "complete"}), "{v}");
    assert_eq!(up.count("tasks/cancel"), 1);
    assert!(tg.record(&t).unwrap().cancelled_at.is_some());
}

/// The same principal's cancels of one reverse-bridged task from a 2026 client and a 2025
/// client at the same time share one upstream `tasks/cancel`, and each gets its own era's
/// answer: the 2026 client the ack, the 2025 client the cancelled `Task` (review 17 #16: break-
/// tasks M1 was tested only on a 2026 upstream).
#[tokio::test]
async fn cancels_of_both_eras_of_a_reverse_bridged_task_get_their_own_eras_answer() {
    // The upstream's cancel answer (the task `cancelled`) comes 400 ms late, so both join.
    let slow_cancel: Hook = Arc::new(|method, id, task_id, _| {
        (method == "tasks/cancel").then(|| {
            let now = format_rfc3339_ms(now_ms());
            let task = json!({"taskId": task_id, "status": "cancelled", "createdAt": now,
                "lastUpdatedAt": now, "ttl": 60000, "pollInterval": 100});
            ScriptedResponse::json(rpc_result(id, &task.to_string()))
                .after(std::time::Duration::from_millis(400))
        })
    });
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: None,
            ..UpBehaviour::default()
        },
        Some(slow_cancel),
    )
    .await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .start()
        .await;
    let url = tg.mcp_url();
    let mut legacy = tg.client().with_token("tok-a");
    legacy.initialize().await;
    for (round, modern_first) in [(0u64, true), (1, false)] {
        let (_, v) = call(&url, Some("tok-a"), 1 + round, "research", true).await;
        let t = v["result"]["taskId"].as_str().unwrap().to_string();
        let sent = round as usize + 1;
        let (url2, t2, c2) = (url.clone(), t.clone(), legacy.clone());
        let (old, new) = if modern_first {
            let modern = tokio::spawn(async move {
                task_call(&url2, Some("tok-a"), 20 + round, "tasks/cancel", &t2).await
            });
            assert!(up.up.wait_for_method("tasks/cancel", sent, STEP).await);
            let old = legacy.cancel(&(30 + round).to_string(), &t).await;
            (old, modern.await.unwrap())
        } else {
            let old = tokio::spawn(async move { c2.cancel(&(30 + round).to_string(), &t2).await });
            assert!(up.up.wait_for_method("tasks/cancel", sent, STEP).await);
            let new = task_call(&url, Some("tok-a"), 20 + round, "tasks/cancel", &t).await;
            (old.await.unwrap(), new)
        };
        let (status, new) = new;
        assert_eq!(status, 200, "round {round}: {new}");
        assert_eq!(
            new["result"],
            json!({"resultType": "complete"}),
            "round {round}: the 2026 ack: {new}"
        );
        assert_eq!(
            (&old["result"]["taskId"], &old["result"]["status"]),
            (&json!(t), &json!("cancelled")),
            "round {round}: the 2025 CancelTaskResult: {old}"
        );
        assert_eq!(
            up.count("tasks/cancel"),
            sent,
            "round {round}: one upstream cancel"
        );
    }
}

/// With bearer auth each principal has its own upstream session, and another principal's
/// `tasks/get|update|cancel` is `-32602` with nothing sent upstream.
#[tokio::test]
async fn principals_have_their_own_sessions_and_tasks() {
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: None,
            ..UpBehaviour::default()
        },
        None,
    )
    .await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .token("bob", "tok-b")
        .start()
        .await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, Some("tok-a"), 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    assert_eq!(
        tg.record(&t).unwrap().owner,
        Owner::Principal("alice".into())
    );
    let _ = call(&url, Some("tok-b"), 1, "plain", true).await;
    assert_eq!(up.count("initialize"), 2, "one session per principal");
    let before = up.up.requests().len();
    for (i, m) in ["tasks/get", "tasks/update", "tasks/cancel"]
        .iter()
        .enumerate()
    {
        let (status, v) = task_call(&url, Some("tok-b"), 10 + i as u64, m, &t).await;
        assert_eq!((status, err_code(&v)), (400, -32602), "{m}: {v}");
    }
    assert_eq!(up.up.requests().len(), before, "nothing upstream");
    let (_, v) = task_call(&url, Some("tok-a"), 20, "tasks/get", &t).await;
    assert_eq!(v["result"]["status"], "working", "{v}");
    let get = up.received("tasks/get").last().unwrap().clone();
    assert_eq!(get.header("mcp-session-id").as_deref(), Some("sess-1"));
}

/// An upstream that answers 404 on the held session (it ended it) gets a new `initialize`; the
/// request is sent again on the new session, and later requests about the task go there too.
#[tokio::test]
async fn a_lost_upstream_session_is_initialized_again() {
    let lost = Arc::new(AtomicUsize::new(0));
    let l = lost.clone();
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: None,
            ..UpBehaviour::default()
        },
        Some(Arc::new(move |method, _id, _task, n| {
            (method == "tasks/get" && n == 1).then(|| {
                l.fetch_add(1, Ordering::SeqCst);
                ScriptedResponse::status(404, Some("text/plain"), "Session not found")
            })
        })),
    )
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, None, 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    let (status, v) = task_call(&url, None, 2, "tasks/get", &t).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["status"], "working", "{v}");
    assert_eq!(lost.load(Ordering::SeqCst), 1);
    assert_eq!(up.count("initialize"), 2);
    let gets = up.received("tasks/get");
    assert_eq!(
        gets.last().unwrap().header("mcp-session-id").as_deref(),
        Some("sess-2")
    );
    let (_, _) = task_call(&url, None, 3, "tasks/cancel", &t).await;
    let cancel = up.received("tasks/cancel")[0].clone();
    assert_eq!(cancel.header("mcp-session-id").as_deref(), Some("sess-2"));
    assert_eq!(up.count("initialize"), 2);
}

/// An upstream that restarted and forgot a bridged task answers taskgate's own 2025
/// `tasks/get` of it with `-32602` "Task not found" (the TypeScript SDK 1.x after a restart:
/// the session is opened again and the task is unknown there). As for every task the upstream
/// lost (README: "when the upstream says it no longer has a task taskgate recorded live"), the
/// record becomes `failed` ("no longer has this task"), "resources released" is recorded
/// (`reason=upstream_lost`), the owner's slot is free again, and the client gets the failed
/// `DetailedTask`, from the record from then on. Before: the `-32602` was passed to the client
/// and the record stayed `working`, holding the owner's slot for the task's ttl (a day by
/// default), so an owner at its limit was refused `-32029` until then.
#[tokio::test]
async fn a_bridged_task_the_upstream_forgot_is_failed_and_frees_its_slot() {
    let (up, tg, url, t) = a_task_the_upstream_forgot().await;
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
    assert_eq!(r.status, TaskStatus::Failed);
    assert!(r.released_at.is_some(), "released");
    let audit = tg.registry.store().audit_for("default", &t).expect("audit");
    assert!(
        audit
            .iter()
            .any(|e| e.event == "resources_released" && e.detail == "reason=upstream_lost"),
        "{audit:?}"
    );
    // The owner's slot is free: the next task is created.
    let (status, v) = call(&url, None, 3, "research", true).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    // Answered from the record from now on; a cancel is the terminal ack.
    let gets = up.count("tasks/get");
    let (_, v) = task_call(&url, None, 4, "tasks/get", &t).await;
    assert_eq!(v["result"]["status"], "failed", "{v}");
    let (status, v) = task_call(&url, None, 5, "tasks/cancel", &t).await;
    assert_eq!(
        (status, &v["result"]),
        (200, &json!({"resultType":"complete"})),
        "{v}"
    );
    assert_eq!(up.count("tasks/get"), gets);
    assert_eq!(up.count("tasks/cancel"), 0);
}

/// The same lost task cancelled before anyone polls it: the upstream answers the 2025
/// `tasks/cancel` `-32602` ("not found", or "already terminal": 2025-11-25 answers both so),
/// taskgate's own `tasks/get` is answered `-32602` too, so the record is failed as lost and
/// the owner's slot freed; the client gets the 2026 ack. Before: the ack, and the record
/// stayed `working` (its slot held) for the task's ttl.
#[tokio::test]
async fn a_bridged_task_the_upstream_forgot_is_failed_by_its_cancel() {
    let (up, tg, url, t) = a_task_the_upstream_forgot().await;
    let (status, v) = task_call(&url, None, 2, "tasks/cancel", &t).await;
    assert_eq!(
        (status, &v["result"]),
        (200, &json!({"resultType":"complete"})),
        "{v}"
    );
    let r = tg.record(&t).expect("record");
    assert_eq!(r.status, TaskStatus::Failed, "{:?}", r.status_message);
    assert!(r.released_at.is_some(), "released");
    let (status, v) = call(&url, None, 3, "research", true).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["resultType"], "task", "the slot is free: {v}");
    let (_, v) = task_call(&url, None, 4, "tasks/get", &t).await;
    assert_eq!(v["result"]["status"], "failed", "{v}");
    assert_eq!(up.count("tasks/cancel"), 1);
}

/// A bridged task (its owner at `max_live_tasks_per_owner = 1`) whose 2025 upstream then
/// forgot every task (a restart): the upstream, taskgate, its MCP URL and the task's id.
async fn a_task_the_upstream_forgot() -> (UpServer, Tg, String, String) {
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: None,
            ..UpBehaviour::default()
        },
        None,
    )
    .await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, None, 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().expect("a task").to_string();
    up.state.lock().unwrap().tasks.clear();
    (up, tg, url, t)
}

/// An upstream that does not answer a bridged task's `tasks/get`, or a task tool's call,
/// within its `timeout_ms` is the upstream timeout (README Errors: HTTP 504, `-32603` naming the
/// upstream), as every other request of this bridge (`tools/list`, `tasks/cancel`) and every
/// 2026 request passed through are. Before: those two answered HTTP 200 (a 2026 `-32603`'s
/// status), so a client or load balancer could not tell the gateway's timeout from the task's
/// own error.
#[tokio::test]
async fn a_bridged_exchange_past_the_upstream_timeout_is_504() {
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: None,
            get_delay: std::time::Duration::from_millis(1500),
            ..UpBehaviour::default()
        },
        None,
    )
    .await;
    let tg =
        Tg::start(|store| TgConfig::new(&up.url()).to_toml(store) + "timeout_ms = 500\n").await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, None, 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().expect("a task").to_string();
    let (status, v) = task_call(&url, None, 2, "tasks/get", &t).await;
    assert_eq!((status, err_code(&v)), (504, -32603), "{v}");
    assert_eq!(v["id"], json!(2), "{v}");
    assert!(err_message(&v).contains("`default`"), "{v}");

    let slow = legacy_server_with(
        UpBehaviour {
            creation_delay: std::time::Duration::from_millis(1500),
            ..UpBehaviour::default()
        },
        None,
    )
    .await;
    let tg =
        Tg::start(|store| TgConfig::new(&slow.url()).to_toml(store) + "timeout_ms = 500\n").await;
    let (status, v) = call(&tg.mcp_url(), None, 3, "research", true).await;
    assert_eq!((status, err_code(&v)), (504, -32603), "{v}");
    assert_eq!(v["id"], json!(3), "{v}");
}

/// A 2025-11-25 client of the same upstream through the same taskgate is unchanged: its
/// session and task pass through (the upstream's own session id, the nested result).
#[tokio::test]
async fn a_2025_client_of_the_same_upstream_is_unchanged() {
    let up = legacy_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let _ = send(modern_req(&url, None, 1, "server/discover", json!({}))).await;
    let mut c = tg.client();
    c.initialize().await;
    assert_eq!(c.session.as_deref(), Some("sess-2"));
    let v = c
        .rpc(rpc(
            "7",
            "tools/call",
            r#"{"name":"research","arguments":{},"task":{"ttl":60000}}"#,
        ))
        .await;
    assert_eq!(v["result"]["task"]["status"], "working", "{v}");
    let rec = tg
        .record(v["result"]["task"]["taskId"].as_str().unwrap())
        .unwrap();
    assert_eq!((rec.origin, rec.era), (Origin::Client, Era::Legacy));
}

/// A bridged task created before `kill -9` is followed after the restart from the store: the
/// record routes `tasks/get` to the upstream session it was created on (the upstream still holds
/// it, so no new `initialize` is needed), and the result comes inline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridged_task_survives_sigkill() {
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: Some(1500),
            ..UpBehaviour::default()
        },
        None,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url()).write_for_binary(dir.path());
    let (mut p, gw, _) = spawn_binary(&cfg);
    let url = format!("http://{gw}/mcp");
    let (_, v) = call(&url, None, 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    sigkill(&mut p);
    let (_p2, gw, _) = spawn_binary(&cfg);
    let url = format!("http://{gw}/mcp");
    let done = until_terminal(&url, None, &t).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["result"]["content"][0]["text"],
        format!("result of {t}"),
        "{done}"
    );
    let gets = up.received("tasks/get");
    assert!(
        gets.iter()
            .all(|g| g.header("mcp-session-id").as_deref() == Some("sess-1")),
        "the recorded session"
    );
    assert_eq!(up.count("initialize"), 1, "no new session was needed");
}

/// The upstream's `tasks/get` answer: `input_required`.
fn input_required(id: &str, task_id: &str) -> ScriptedResponse {
    let now = format_rfc3339_ms(now_ms());
    ScriptedResponse::json(rpc_result(
        id,
        &json!({"taskId": task_id, "status": "input_required", "createdAt": now,
            "lastUpdatedAt": now, "ttl": 60000, "pollInterval": 100})
        .to_string(),
    ))
}

/// An input request captured before `kill -9` is in the task's record (issue 33): the upstream
/// asks once (as the 1.x SDKs do), yet after the restart `tasks/get` shows it (without the 2025
/// related-task `_meta`), `tasks/update` answers it on the task's session (a 2025 server takes
/// a response by its id on any POST of the session), and the task completes; the key is
/// answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_request_captured_before_a_restart_is_answered_after_it() {
    let up = legacy_server_with(
        UpBehaviour {
            ask: Some("elicitation/create"),
            task_ms: Some(100),
            ..UpBehaviour::default()
        },
        // The 1.x SDKs set `input_required` before anyone opens `tasks/result`, and send the
        // request once, on the first stream: the second (after the restart) waits, asking
        // nothing; the third (after the answer) carries the result.
        Some(Arc::new(|method, id, task_id, n| match method {
            "tasks/get" if n == 1 => Some(input_required(id, task_id)),
            "tasks/result" if n == 2 => Some(ScriptedResponse::sse(vec![SseStep::HoldOpen])),
            _ => None,
        })),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url()).write_for_binary(dir.path());
    let (mut p, gw, _) = spawn_binary(&cfg);
    let url = format!("http://{gw}/mcp");
    let (_, v) = call(&url, None, 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    let key = format!("ask-{t}");
    let (_, before) = get_asking(&url, None, 2, &t).await;
    assert_eq!(
        before["result"]["inputRequests"][&key]["method"], "elicitation/create",
        "{before}"
    );
    sigkill(&mut p);
    let (_p2, gw, _) = spawn_binary(&cfg);
    let url = format!("http://{gw}/mcp");
    let (status, v) = get_asking(&url, None, 3, &t).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["status"], "input_required", "{v}");
    assert_eq!(
        v["result"]["inputRequests"], before["result"]["inputRequests"],
        "the same request, from the record: {v}"
    );
    assert_eq!(
        v["result"]["inputRequests"][&key]["params"]["message"],
        "Which one?"
    );
    assert!(
        v["result"]["inputRequests"][&key]["params"]
            .get("_meta")
            .is_none(),
        "{v}"
    );
    assert_eq!(up.count("tasks/cancel"), 0, "not failed: {v}");
    let answer = json!({"action": "accept", "content": {"choice": "b"}});
    let (status, ack) = send(modern_req(
        &url,
        None,
        4,
        "tasks/update",
        json!({"taskId": t, "inputResponses": {key.clone(): answer}}),
    ))
    .await;
    assert_eq!(status, 200, "{ack}");
    let got = up.task(&t).answer.expect("the answer went upstream");
    assert_eq!(got["id"], json!(key), "{got}");
    assert_eq!(got["result"]["content"]["choice"], "b", "{got}");
    assert_eq!(got["result"]["_meta"][RELATED]["taskId"], json!(t), "{got}");
    let answers = up
        .up
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.rpc_method().is_none())
        .map(|r| r.header("mcp-session-id"))
        .collect::<Vec<_>>();
    assert_eq!(
        answers,
        vec![Some("sess-1".to_string())],
        "once, on the task's session"
    );
    let done = until_terminal(&url, None, &t).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert!(done["result"].get("inputRequests").is_none(), "{done}");
    // Answered once: the key is gone from the record, a second answer goes nowhere.
    let (status, _) = send(modern_req(
        &url,
        None,
        5,
        "tasks/update",
        json!({"taskId": t, "inputResponses": {key.clone(): {"action": "decline"}}}),
    ))
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        up.task(&t).answer.unwrap()["result"]["content"]["choice"],
        "b"
    );
}

/// An input request captured before `kill -9` that the record could not hold (here: over
/// `tasks.max_stored_result_bytes`) cannot be had again: the upstream asks once (as the
/// 1.x SDKs do: a later `tasks/result` stream gets nothing more), so after the restart the
/// task's `tasks/get` opens a new `tasks/result`, finds nothing, and the task is `failed` with a
/// `statusMessage` and an `error` saying the input request was lost when taskgate restarted;
/// one upstream `tasks/cancel` stops the server waiting. Later polls answer the same from the
/// store; the old key's answer goes nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_request_lost_with_a_restart_fails_the_task() {
    let up = legacy_server_with(
        UpBehaviour {
            ask: Some("elicitation/create"),
            task_ms: Some(100),
            ..UpBehaviour::default()
        },
        // Input required from the start; the request (2 KB, over the 1 KB bound the record
        // holds) goes out once, on the first `tasks/result`: a later one waits, asking nothing.
        Some(Arc::new(|method, id, task_id, n| match method {
            "tasks/get" => Some(input_required(id, task_id)),
            "tasks/result" if n == 1 => {
                let ask = json!({"jsonrpc": "2.0", "id": format!("ask-{task_id}"),
                    "method": "elicitation/create", "params": {"message": "?".repeat(2048),
                    "requestedSchema": {"type": "object", "properties": {}}}});
                Some(ScriptedResponse::sse(vec![
                    ev().event("message").data(&ask.to_string()).into(),
                    SseStep::HoldOpen,
                ]))
            }
            "tasks/result" => Some(ScriptedResponse::sse(vec![SseStep::HoldOpen])),
            _ => None,
        })),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url())
        .tasks("max_stored_result_bytes = 1024")
        .write_for_binary(dir.path());
    let (mut p, gw, _) = spawn_binary(&cfg);
    let url = format!("http://{gw}/mcp");
    let (_, v) = call(&url, None, 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    let key = format!("ask-{t}");
    let (_, v) = get_asking(&url, None, 2, &t).await;
    assert_eq!(v["result"]["status"], "input_required", "{v}");
    assert_eq!(
        v["result"]["inputRequests"][&key]["method"], "elicitation/create",
        "{v}"
    );
    sigkill(&mut p);
    let (_p2, gw, _) = spawn_binary(&cfg);
    let url = format!("http://{gw}/mcp");
    let (status, v) = get_asking(&url, None, 3, &t).await;
    assert_eq!(status, 200, "{v}");
    let r = &v["result"];
    assert_eq!(r["status"], "failed", "{v}");
    let said = r["statusMessage"].as_str().unwrap_or_default();
    assert!(
        said.contains("input request was lost when taskgate restarted"),
        "{v}"
    );
    assert_eq!(r["error"]["code"], -32603, "{v}");
    assert_eq!(r["error"]["message"], said, "{v}");
    assert!(r.get("inputRequests").is_none(), "{v}");
    assert_eq!(
        up.count("tasks/result"),
        2,
        "asked again once after the restart"
    );
    let cancels = eventually(STEP, || async {
        let c = bodies(&up, "tasks/cancel");
        (!c.is_empty()).then_some(c)
    })
    .await
    .expect("the upstream task is cancelled");
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["params"]["taskId"], json!(t));
    assert_eq!(up.task(&t).status, "cancelled");
    // Later polls: the same, from the store; the old key's answer goes nowhere.
    let gets = up.count("tasks/get");
    let (_, again) = get_asking(&url, None, 4, &t).await;
    assert_eq!(again["result"]["status"], "failed", "{again}");
    assert_eq!(again["result"]["error"], r["error"], "{again}");
    assert_eq!(up.count("tasks/get"), gets, "answered from the store");
    let (status, v) = send(modern_req(
        &url,
        None,
        5,
        "tasks/update",
        json!({"taskId": t, "inputResponses": {key.clone(): {"action": "accept", "content": {}}}}),
    ))
    .await;
    assert_eq!(status, 200, "{v}");
    assert!(up.task(&t).answer.is_none(), "no answer went upstream");
    assert_eq!(up.count("tasks/cancel"), 1);
}

/// A 2026-07-28 client that closes a plain call's stream before the answer cancels it (the 2026
/// transport's cancel): the upstream gets `notifications/cancelled` naming the request id it
/// got, on the same session; a call that was answered sends none.
#[tokio::test]
async fn a_client_gone_before_the_answer_cancels_the_upstream_request() {
    let up = legacy_server_with(
        UpBehaviour::default(),
        Some(Arc::new(|method, _id, _task, _n| {
            (method == "tools/call").then(|| {
                ScriptedResponse::sse(vec![
                    ev().data(&progress_notification(&json!("p"), 1)).into(),
                    SseStep::HoldOpen,
                ])
            })
        })),
    )
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let (_, v) = send(modern_req(&url, None, 1, "tools/list", json!({}))).await;
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    let resp = modern_req(
        &url,
        None,
        2,
        "tools/call",
        json!({"name": "plain", "arguments": {}}),
    )
    .send()
    .await;
    assert_eq!(resp.status(), 200);
    let mut events = resp.sse();
    let first = events.next_event(STEP).await.json();
    assert_eq!(first["method"], "notifications/progress", "{first}");
    drop(events);
    let cancelled = eventually(STEP, || async {
        up.received("notifications/cancelled").first().cloned()
    })
    .await
    .expect("notifications/cancelled upstream");
    let call = up.received("tools/call")[0].clone();
    assert_eq!(cancelled.json()["params"]["requestId"], call.json()["id"]);
    assert_eq!(
        cancelled.header("mcp-session-id"),
        call.header("mcp-session-id")
    );
    assert_eq!(
        up.count("notifications/cancelled"),
        1,
        "tools/list sent none"
    );
}

/// An upstream task that goes `input_required` and asks on its `tasks/result` stream (as the
/// 1.x SDKs deliver a task's elicitation): the 2026 client sees the request in
/// `inputRequests` (keyed by its id), answers it with `tasks/update`, the upstream gets the
/// JSON-RPC response to its request (with the related-task `_meta`), and the task completes.
#[tokio::test]
async fn input_required_is_shown_as_input_requests_and_answered_with_tasks_update() {
    let up = legacy_server_with(
        UpBehaviour {
            ask: Some("elicitation/create"),
            task_ms: Some(100),
            ..UpBehaviour::default()
        },
        // The 1.x SDKs set `input_required` before anyone opens `tasks/result`.
        Some(Arc::new(|method, id, task_id, n| {
            (method == "tasks/get" && n == 1).then(|| {
                let now = format_rfc3339_ms(now_ms());
                ScriptedResponse::json(rpc_result(
                    id,
                    &json!({"taskId": task_id, "status": "input_required", "createdAt": now,
                        "lastUpdatedAt": now, "ttl": 60000, "pollInterval": 100})
                    .to_string(),
                ))
            })
        })),
    )
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, None, 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    let (status, v) = get_asking(&url, None, 2, &t).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["status"], "input_required", "{v}");
    let key = format!("ask-{t}");
    let asked = &v["result"]["inputRequests"][&key];
    assert_eq!(asked["method"], "elicitation/create", "{v}");
    assert_eq!(asked["params"]["message"], "Which one?", "{v}");
    let (status, v) = send(modern_req(
        &url,
        None,
        3,
        "tasks/update",
        json!({"taskId": t, "inputResponses": {
            key.clone(): {"action": "accept", "content": {"choice": "b"}},
            "unknown-key": {"action": "decline"}
        }}),
    ))
    .await;
    assert_eq!(
        (status, v["result"].clone()),
        (200, json!({"resultType": "complete"})),
        "{v}"
    );
    let answer = up.task(&t).answer.expect("the upstream got the answer");
    assert_eq!(answer["id"], json!(key), "{answer}");
    assert_eq!(answer["result"]["content"]["choice"], "b", "{answer}");
    assert_eq!(
        answer["result"]["_meta"][RELATED]["taskId"],
        json!(t),
        "{answer}"
    );
    let done = until_terminal(&url, None, &t).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert!(done["result"]["result"]["content"].is_array(), "{done}");
}

/// Tester 5 #4: the held session is `initialize`d with the client capabilities the bridge
/// relays (`elicitation`, `sampling`, `roots`; before: none, so a compliant 2025 server such as
/// server-everything never asked, and `input_required` never reached a 2026 client). A task's
/// request for a capability the 2026 caller did not declare is answered upstream on its behalf
/// as a 2025 client without it answers (`-32601` naming it), never shown, and the task goes on.
#[tokio::test]
async fn the_held_session_declares_what_the_bridge_relays_and_answers_for_callers_without_it() {
    let up = legacy_server_with(
        UpBehaviour {
            ask: Some("elicitation/create"),
            task_ms: Some(100),
            ..UpBehaviour::default()
        },
        Some(Arc::new(|method, id, task_id, n| {
            (method == "tasks/get" && n == 1).then(|| input_required(id, task_id))
        })),
    )
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, None, 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    let init = &bodies(&up, "initialize")[0];
    assert_eq!(
        init["params"]["capabilities"],
        json!({"elicitation": {}, "sampling": {}, "roots": {}}),
        "{init}"
    );
    // This caller declares the extension only.
    let (status, v) = task_call(&url, None, 2, "tasks/get", &t).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["inputRequests"], json!({}), "not shown: {v}");
    let answer = eventually(STEP, || async { up.task(&t).answer })
        .await
        .expect("the upstream's request is answered");
    assert_eq!(answer["id"], json!(format!("ask-{t}")), "{answer}");
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("elicitation"),
        "{answer}"
    );
    let done = until_terminal(&url, None, &t).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_bridge_input_refused_total",
            &[("reason", "undeclared")]
        ),
        1.0,
        "{m}"
    );
}

/// A cancel racing the task's completion, 200 rounds (two 2026 cancels per round, sent after a
/// varying delay): each round makes exactly one upstream `tasks/cancel`, both callers get the
/// ack, and the task ends as the upstream has it (`cancelled` or `completed`), which stays.
#[tokio::test]
async fn a_cancel_racing_completion_200_rounds() {
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: Some(15),
            ..UpBehaviour::default()
        },
        None,
    )
    .await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1000")
        .start()
        .await;
    let url = tg.mcp_url();
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut ends = (0, 0);
    for round in 0..200u64 {
        let (_, v) = call(&url, None, 1, "research", true).await;
        let t = v["result"]["taskId"].as_str().unwrap().to_string();
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        tokio::time::sleep(std::time::Duration::from_millis((seed >> 33) % 30)).await;
        let (a, b) = tokio::join!(
            task_call(&url, None, 10 + round, "tasks/cancel", &t),
            task_call(&url, None, 20 + round, "tasks/cancel", &t)
        );
        for (status, v) in [a, b] {
            assert_eq!(
                (status, v["result"].clone()),
                (200, json!({"resultType": "complete"})),
                "round {round}: {v}"
            );
        }
        let done = until_terminal(&url, None, &t).await;
        let shown = done["result"]["status"].as_str().unwrap().to_string();
        assert_eq!(shown, up.status(&t), "round {round}: the upstream's end");
        match shown.as_str() {
            "cancelled" => ends.0 += 1,
            "completed" => ends.1 += 1,
            other => panic!("round {round}: {other}"),
        }
        let (_, again) = task_call(&url, None, 30 + round, "tasks/get", &t).await;
        assert_eq!(
            again["result"]["status"],
            json!(shown),
            "round {round}: it stays"
        );
        let cancels = up
            .state
            .lock()
            .unwrap()
            .seen
            .iter()
            .filter(|(m, id, _)| m == "tasks/cancel" && *id == t)
            .count();
        assert_eq!(cancels, 1, "round {round}: one upstream cancel");
    }
    assert!(ends.0 > 0 && ends.1 > 0, "both ends happened: {ends:?}");
}

/// A 2026-07-28 server that does not answer its first `server/discover` within the deadline
/// (slow at its start) is not taken for a 2025-11-25 one for the process's life: the 2026
/// requests pass as they came, no 2025 session is opened (no `initialize` upstream), and the
/// server's own answers come back.
#[tokio::test]
async fn a_first_discovery_unanswered_in_time_bridges_nothing() {
    let state: Shared = Default::default();
    let handler = pure_2026(state);
    let discoveries = Arc::new(AtomicUsize::new(0));
    let seen = discoveries.clone();
    let up = Upstream::start(move |req: &RecordedRequest| {
        let first = req.rpc_method().as_deref() == Some("server/discover")
            && seen.fetch_add(1, Ordering::SeqCst) == 0;
        match first {
            true => handler(req).after(std::time::Duration::from_secs(30)),
            false => handler(req),
        }
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    for id in 1..=3 {
        let (status, v) = send(modern_req(&url, None, id, "tools/list", json!({}))).await;
        assert_eq!(status, 200, "{v}");
        assert!(v["result"]["tools"].is_array(), "{v}");
    }
    assert!(
        up.received("initialize").is_empty(),
        "no 2025 session is opened"
    );
    assert_eq!(
        discoveries.load(Ordering::SeqCst),
        1,
        "asked once, not per request"
    );
}

/// A client's own malformed `server/discover` (a conformance suite sends some on purpose),
/// which a 2026-07-28 server refuses, does not make that server a 2025-11-25 one: taskgate
/// learns the era from its own well-formed discovery, the client gets the server's refusal,
/// and its next requests pass unbridged.
#[tokio::test]
async fn a_clients_malformed_discovery_does_not_decide_the_era() {
    let state: Shared = Default::default();
    let handler = pure_2026(state);
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        let versioned = v
            .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
            .is_some();
        if req.rpc_method().as_deref() == Some("server/discover") && !versioned {
            return ScriptedResponse::status(
                400,
                Some("application/json"),
                format!(
                    r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32602,"message":"missing protocol version"}}}}"#,
                    req.rpc_id_json()
                ),
            );
        }
        handler(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let (status, v) = send(modern_req(
        &url,
        None,
        1,
        "server/discover",
        json!({"_meta": {}}),
    ))
    .await;
    assert_eq!(
        (status, err_code(&v)),
        (400, -32602),
        "the server's refusal: {v}"
    );
    let (status, v) = send(modern_req(&url, None, 2, "tools/list", json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["result"]["tools"].is_array(), "{v}");
    assert!(up.received("initialize").is_empty(), "never bridged");
}

/// One learned era per upstream, read by both bridges (issue 30): on a dual-era server (2025
/// sessions, 2026 tasks; FastMCP 4 is one), a 2025 client's `initialize` asks
/// `server/discover` once, and a 2026 client after it is neither asked about again nor
/// bridged: the forward bridge's fact (2026 tasks: the 2025 client gets `capabilities.tasks`)
/// is the reverse bridge's (2026-07-28: its requests pass). The old code asked twice, each
/// bridge for itself.
#[tokio::test]
async fn both_bridges_read_one_learned_era() {
    let (up, _state) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    let init = c.initialize().await;
    assert!(
        init["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"].is_object(),
        "{init}"
    );
    let (status, v) = send(modern_req(&tg.mcp_url(), None, 1, "tools/list", json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["result"]["tools"].is_array(), "{v}");
    assert_eq!(
        count(&up, "server/discover"),
        1,
        "one discovery for both bridges"
    );
    assert_eq!(
        count(&up, "initialize"),
        1,
        "only the 2025 client's: nothing bridged"
    );
}

/// A 2025 client on a 2025 task server (its `initialize` answer declares `capabilities.tasks`)
/// needs no bridge, so taskgate sends no `server/discover` for it: Python `mcp` 1.30 (stateful)
/// opens a transport for a request without a session and, when that one closes, stops task
/// support for every session on the server ("TaskSupport not running"), so the probe made every
/// 2025 task call through taskgate fail there (tests/interop step d, py-client-py-server).
#[tokio::test]
async fn a_2025_client_on_a_2025_task_server_asks_no_discovery() {
    let up = legacy_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    let init = c.initialize().await;
    assert!(
        init["result"]["capabilities"]["tasks"].is_object(),
        "{init}"
    );
    let created = c
        .rpc(rpc(
            "2",
            "tools/call",
            &json!({"name": "research", "arguments": {}, "task": {"ttl": 60000}}).to_string(),
        ))
        .await;
    let task_id = created
        .pointer("/result/task/taskId")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("a 2025 CreateTaskResult: {created}"))
        .to_string();
    let got = c
        .rpc(rpc(
            "3",
            "tasks/get",
            &json!({ "taskId": task_id }).to_string(),
        ))
        .await;
    assert!(got["result"]["status"].is_string(), "{got}");
    assert_eq!(
        up.count("server/discover"),
        0,
        "nothing to bridge for a 2025 client on a 2025 task server"
    );
    assert_eq!(up.count("tools/call"), 1, "the task call went as it came");
}

/// An upstream that refuses taskgate's credentials (401 to everything) is asked
/// `server/discover` once within `bridge::UNANSWERED_RETRY`, not on every request: since the
/// 401 is a 502 (break-edge F8) the discovery saw an error, which it took for "not sent" and
/// asked again each time.
#[tokio::test]
async fn an_upstream_refusing_credentials_is_not_asked_its_era_on_every_request() {
    let up = Upstream::start(|_req: &RecordedRequest| {
        ScriptedResponse::status(401, Some("application/json"), "{}".to_string())
            .header("www-authenticate", "Bearer")
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    for id in 1..=3 {
        let (status, v) = send(modern_req(&tg.mcp_url(), None, id, "tools/list", json!({}))).await;
        assert_eq!(status, 502, "{v}");
    }
    assert_eq!(count(&up, "server/discover"), 1, "asked once");
}

/// A discovery unanswered in time decides nothing for either bridge, and keeps both from
/// asking again (`bridge::UNANSWERED_RETRY`): the forward bridge used to take it for
/// "2025-11-25" for the process's life while the reverse bridge asked again at once and
/// learned "2026-07-28", so the two disagreed about one upstream from then on.
#[tokio::test]
async fn an_unanswered_discovery_leaves_both_bridges_undecided() {
    let state: Shared = Default::default();
    let handler = modern_handler(state);
    let discoveries = Arc::new(AtomicUsize::new(0));
    let seen = discoveries.clone();
    let up = Upstream::start(move |req: &RecordedRequest| {
        if req.rpc_method().as_deref() == Some("server/discover")
            && seen.fetch_add(1, Ordering::SeqCst) == 0
        {
            return ScriptedResponse::hang();
        }
        handler(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    let init = c.initialize().await;
    assert!(
        init["result"]["capabilities"].get("tasks").is_none(),
        "not bridged while unknown: {init}"
    );
    let (status, v) = send(modern_req(&tg.mcp_url(), None, 1, "tools/list", json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["result"]["tools"].is_array(), "{v}");
    assert_eq!(
        discoveries.load(Ordering::SeqCst),
        1,
        "not asked again within the retry interval, by either bridge"
    );
    assert_eq!(
        count(&up, "initialize"),
        1,
        "no 2025 session held for the 2026 client"
    );
}

/// A 2026-07-28 `tools/call` that still carries the 2025 `params.task` (the conformance suite's
/// `sep-2663-legacy-task-param-ignored` sends one to a plain tool) is not made a 2025 task:
/// 2026-07-28 servers ignore the member, so taskgate sends the plain tool's call without it and
/// the client gets the plain result (`resultType:"complete"`), not a `CreateTaskResult` it
/// cannot read.
#[tokio::test]
async fn a_legacy_task_param_is_ignored() {
    let up = legacy_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let (status, v) = send(modern_req(
        &url,
        None,
        1,
        "tools/call",
        json!({"name": "plain", "arguments": {}, "task": {"ttl": 60000}, "_meta": meta(true)}),
    ))
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert!(v["result"].get("taskId").is_none(), "{v}");
    let sent = &bodies(&up, "tools/call")[0];
    assert!(sent["params"].get("task").is_none(), "{sent}");
}

/// `tasks/update` whose `inputResponses` is not an object (an array) is refused `-32602`
/// (HTTP 400) under the client's id, not acknowledged as if it had answered something; an
/// object of answers is still acknowledged.
#[tokio::test]
async fn an_input_responses_array_is_refused() {
    let up = legacy_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, None, 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().expect("a task").to_string();
    let update = |id: u64, responses: Value| {
        send(modern_req(
            &url,
            None,
            id,
            "tasks/update",
            json!({"taskId": t, "inputResponses": responses, "_meta": meta(true)}),
        ))
    };
    let (status, v) = update(2, json!([1, 2])).await;
    assert_eq!((status, err_code(&v)), (400, -32602), "{v}");
    assert_eq!(v["id"], 2, "{v}");
    let (status, v) = update(3, json!({"unknown-key": {"action": "decline"}})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    // An answer that is not an object (a result) is refused, not taken and sent upstream.
    let (status, v) = update(4, json!({"0": "yes"})).await;
    assert_eq!((status, err_code(&v)), (400, -32602), "{v}");
}

/// Issue 33 item 8: a 2026 client's `subscriptions/listen` on a 2025 upstream. The
/// acknowledgement names what is honoured (`toolsListChanged`: the upstream declares
/// `tools.listChanged`; the caller's own task ids; `promptsListChanged` and
/// `resourceSubscriptions` omitted), every message carries the listen's id as its subscription
/// id; the upstream's `notifications/tasks/status` on the held session's GET stream becomes
/// `notifications/tasks` with the `DetailedTask` a `tasks/get` gives (the result inline), only on
/// the owner's listen; another principal naming the task is acknowledged without it and gets
/// only its own session's list change. Task ids without the extension: `-32021`. (Before: `-32601`,
/// HTTP 404.)
#[tokio::test]
async fn subscriptions_listen_relays_task_status_and_list_changes() {
    let task_cell: Arc<std::sync::Mutex<String>> = Default::default();
    let gate = Gate::new();
    let (cell, g) = (task_cell.clone(), gate.clone());
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: Some(50),
            get_stream: Some(Arc::new(move || {
                let t = cell.lock().unwrap().clone();
                vec![
                    SseStep::Wait(g.clone()),
                    SseStep::Raw(ev().data(&status_notification(&t, "completed")).wire()),
                    SseStep::Raw(
                        ev().data(
                            r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,
                        )
                        .wire(),
                    ),
                    SseStep::Raw(
                        ev().data(
                            r#"{"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}"#,
                        )
                        .wire(),
                    ),
                    SseStep::HoldOpen,
                ]
            })),
            ..UpBehaviour::default()
        },
        // Sessions whose upstream declares `tools.listChanged`.
        Some(Arc::new(|method, id, _task, n| {
            (method == "initialize").then(|| {
                let result = json!({"protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {"listChanged": true},
                        "tasks": {"requests": {"tools": {"call": {}}}, "cancel": {}}},
                    "serverInfo": {"name": "scripted-tasks", "version": "1"}});
                ScriptedResponse::json(rpc_result(id, &result.to_string()))
                    .header("mcp-session-id", &format!("sess-{n}"))
            })
        })),
    )
    .await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .token("bob", "tok-b")
        .start()
        .await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, Some("tok-a"), 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    *task_cell.lock().unwrap() = t.clone();

    let listen = |token: &'static str, id: u64, ext: bool| {
        modern_req(
            &url,
            Some(token),
            id,
            "subscriptions/listen",
            json!({"notifications": {"toolsListChanged": true, "promptsListChanged": true,
                "resourceSubscriptions": ["a://x"], "taskIds": [t.clone()]},
                "_meta": meta(ext)}),
        )
    };
    // Task ids without the extension: -32021, also for ids the caller does not own.
    let (status, v) = send(listen("tok-a", 6, false)).await;
    assert_eq!((status, err_code(&v)), (400, -32021), "{v}");
    let (status, v) = send(listen("tok-b", 6, false)).await;
    assert_eq!((status, err_code(&v)), (400, -32021), "another's ids: {v}");

    let alice = listen("tok-a", 7, true).send().await;
    assert_eq!(alice.status(), 200);
    let mut alice = alice.sse();
    let ack = alice.next_event(STEP).await.json();
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true, "taskIds": [t]}),
        "{ack}"
    );
    assert_eq!(ack["params"]["_meta"][SUB_ID], 7, "{ack}");
    let mut bob = listen("tok-b", 8, true).send().await.sse();
    let ack = bob.next_event(STEP).await.json();
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true}),
        "another principal's task is not acknowledged: {ack}"
    );
    assert_eq!(
        up.count("subscriptions/listen"),
        0,
        "nothing of 2026 upstream"
    );

    // Both principals' sessions' GET streams are read; the task has ended upstream.
    let both = eventually(STEP, || async {
        let gets: Vec<_> = up
            .up
            .requests()
            .into_iter()
            .filter(|r| r.method == "GET")
            .filter_map(|r| r.header("mcp-session-id"))
            .collect();
        let ended = up
            .task(&t)
            .ends_at
            .is_some_and(|e| std::time::Instant::now() >= e);
        (gets.len() >= 2 && ended).then_some(gets)
    })
    .await
    .expect("a GET stream per held session");
    assert!(both.contains(&"sess-1".to_string()), "{both:?}");
    gate.open();

    let (mut task, mut tools) = (None, None);
    while task.is_none() || tools.is_none() {
        let n = alice.next_event(STEP).await.json();
        assert_eq!(n["params"]["_meta"][SUB_ID], 7, "{n}");
        match n["method"].as_str() {
            Some("notifications/tasks") => task = Some(n),
            Some("notifications/tools/list_changed") => tools = Some(n),
            _ => panic!("not asked for: {n}"),
        }
    }
    let task = task.unwrap();
    let p = &task["params"];
    assert_eq!(
        (p["taskId"].as_str(), p["status"].as_str()),
        (Some(t.as_str()), Some("completed")),
        "{task}"
    );
    assert!(
        p["result"]["content"].is_array(),
        "the result inline: {task}"
    );
    assert!(p.get("resultType").is_none(), "{task}");
    let n = bob.next_event(STEP).await.json();
    assert_eq!(n["method"], "notifications/tools/list_changed", "{n}");
    assert_eq!(n["params"]["_meta"][SUB_ID], 8, "{n}");
    assert!(
        matches!(
            bob.next(std::time::Duration::from_millis(300)).await,
            Next::Timeout
        ),
        "nothing of alice's task on bob's listen"
    );
}

/// The listens of one caller are bounded (16): the 17th ends the oldest, whose stream gets the
/// listen's result (`resultType:"complete"`, its subscription id) and then ends; another caller's
/// listen is untouched. A listen without `params.notifications` is `-32602` (HTTP 400).
#[tokio::test]
async fn a_callers_newest_listen_ends_its_oldest() {
    let up = legacy_server().await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .token("bob", "tok-b")
        .start()
        .await;
    let url = tg.mcp_url();
    let (status, v) = send(modern_req(
        &url,
        Some("tok-a"),
        1,
        "subscriptions/listen",
        json!({"_meta": meta(true)}),
    ))
    .await;
    assert_eq!((status, err_code(&v)), (400, -32602), "{v}");
    let listen = |token: &'static str, id: u64| {
        modern_req(
            &url,
            Some(token),
            id,
            "subscriptions/listen",
            json!({"notifications": {"toolsListChanged": true}, "_meta": meta(true)}),
        )
    };
    let mut bob = listen("tok-b", 99).send().await.sse();
    let _ack = bob.next_event(STEP).await;
    let mut alice = Vec::new();
    for id in 0..17u64 {
        let mut r = listen("tok-a", 100 + id).send().await.sse();
        let ack = r.next_event(STEP).await.json();
        assert_eq!(
            ack["params"]["notifications"],
            json!({"toolsListChanged": true}),
            "{ack}"
        );
        alice.push(r);
    }
    let end = alice[0].next_event(STEP).await.json();
    assert_eq!(end["id"], 100, "{end}");
    assert_eq!(end["result"]["resultType"], "complete", "{end}");
    assert_eq!(end["result"]["_meta"][SUB_ID], 100, "{end}");
    assert!(
        matches!(alice[0].next(STEP).await, Next::End),
        "the ended listen's stream ends"
    );
    assert!(
        matches!(
            bob.next(std::time::Duration::from_millis(300)).await,
            Next::Timeout
        ),
        "another caller's listen stays open"
    );
}

/// A captured input request outlives the `tasks/result` stream it came on: the upstream asks
/// once and ends that stream (a restart-less reconnect: SEP-1699 polling, a proxy's idle cut),
/// taskgate opens a new one that does not repeat the request, and the client's next `tasks/get`
/// still shows it in `inputRequests`; its answer goes upstream under the request's id.
#[tokio::test]
async fn an_input_request_is_shown_again_after_its_stream_ended() {
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: None,
            ..UpBehaviour::default()
        },
        Some(Arc::new(|method, id, task_id, n| match method {
            "tasks/get" => {
                let now = format_rfc3339_ms(now_ms());
                Some(ScriptedResponse::json(rpc_result(
                    id,
                    &json!({"taskId": task_id, "status": "input_required", "createdAt": now,
                        "lastUpdatedAt": now, "ttl": 60000, "pollInterval": 100})
                    .to_string(),
                )))
            }
            // The request once, then the stream ends; a later stream does not repeat it.
            "tasks/result" if n == 1 => {
                let ask = json!({"jsonrpc": "2.0", "id": format!("ask-{task_id}"),
                    "method": "elicitation/create", "params": {"message": "Which one?",
                        "requestedSchema": {"type": "object", "properties": {}},
                        "_meta": {RELATED: {"taskId": task_id}}}});
                Some(ScriptedResponse::sse(vec![SseStep::Raw(
                    ev().event("message").data(&ask.to_string()).wire(),
                )]))
            }
            "tasks/result" => Some(ScriptedResponse::sse(vec![SseStep::HoldOpen])),
            _ => None,
        })),
    )
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, None, 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    let key = format!("ask-{t}");
    let (_, v) = get_asking(&url, None, 2, &t).await;
    assert_eq!(
        v["result"]["inputRequests"][&key]["method"], "elicitation/create",
        "{v}"
    );
    // The first stream has ended: a later poll opens a second one, which repeats nothing.
    let mut round = 3;
    let shown = eventually(STEP, || {
        round += 1;
        let (url, t) = (url.clone(), t.clone());
        let up = &up;
        async move {
            let (_, v) = task_call(&url, None, round, "tasks/get", &t).await;
            (up.count("tasks/result") >= 2).then_some(v)
        }
    })
    .await
    .expect("a second tasks/result after the first stream ended");
    assert_eq!(
        shown["result"]["inputRequests"][&key]["method"], "elicitation/create",
        "still shown after the stream it came on ended: {shown}"
    );
    let (status, v) = send(modern_req(
        &url,
        None,
        90,
        "tasks/update",
        json!({"taskId": t, "inputResponses": {key.clone(): {"action": "accept", "content": {}}}}),
    ))
    .await;
    assert_eq!(status, 200, "{v}");
    let answer = eventually(STEP, || async { up.task(&t).answer })
        .await
        .expect("the answer reached the upstream");
    assert_eq!(answer["id"], json!(key), "{answer}");
}

/// The held sessions' pings run side by side: a ping the upstream never answers (it waits up to
/// `timeout_ms`, 30 s) does not hold back the other sessions' pings nor the next rounds (before:
/// one at a time, so every other session went unpinged for 30 s).
#[tokio::test]
async fn a_hanging_ping_does_not_hold_back_the_others() {
    let up = legacy_server_with(
        UpBehaviour::default(),
        Some(Arc::new(|method, _id, _task, n| {
            (method == "ping" && n == 1).then(ScriptedResponse::hang)
        })),
    )
    .await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .token("bob", "tok-b")
        .gateway("session_idle_ms = 1000")
        .start()
        .await;
    let url = tg.mcp_url();
    for token in ["tok-a", "tok-b"] {
        let (_, v) = call(&url, Some(token), 1, "research", true).await;
        assert_eq!(v["result"]["resultType"], "task", "{v}");
    }
    // Pings every 500 ms; the first never answered.
    let pinged = eventually(std::time::Duration::from_secs(5), || async {
        let sessions: std::collections::HashSet<_> = up
            .received("ping")
            .iter()
            .filter_map(|r| r.header("mcp-session-id"))
            .collect();
        (up.count("ping") >= 5 && sessions.len() == 2).then_some(())
    })
    .await;
    assert!(
        pinged.is_some(),
        "pings went on beside the hanging one: {} pings",
        up.count("ping")
    );
}

/// More held sessions than pings allowed at once (16): every one of them is still pinged (a
/// round that stopped at the first busy permit pinged the same 16 sessions every round).
#[tokio::test]
async fn every_held_session_is_pinged_past_the_concurrency_bound() {
    let up = legacy_server_with(UpBehaviour::default(), None).await;
    let mut cfg = TgConfig::new(&up.url()).gateway("session_idle_ms = 1000");
    for n in 0..24 {
        cfg = cfg.token(&format!("p{n}"), &format!("tok-{n}"));
    }
    let tg = cfg.start().await;
    let url = tg.mcp_url();
    for n in 0..24 {
        let (_, v) = call(&url, Some(&format!("tok-{n}")), 1, "research", true).await;
        assert_eq!(v["result"]["resultType"], "task", "{v}");
    }
    let pinged = eventually(std::time::Duration::from_secs(10), || async {
        let sessions: std::collections::HashSet<_> = up
            .received("ping")
            .iter()
            .filter_map(|r| r.header("mcp-session-id"))
            .collect();
        (sessions.len() == 24).then_some(())
    })
    .await;
    let sessions: std::collections::HashSet<_> = up
        .received("ping")
        .iter()
        .filter_map(|r| r.header("mcp-session-id"))
        .collect();
    assert!(
        pinged.is_some(),
        "{} of 24 held sessions pinged",
        sessions.len()
    );
}

/// The 2025 sessions taskgate holds are pinged (every `gateway.session_idle_ms` / 2 here), on
/// the session and with its negotiated version, while a task created on one lives; a ping that
/// meets 404 (the upstream lost the session) opens it again, so the client's next `tasks/get`
/// finds the task without a round trip of its own to re-initialize.
#[tokio::test]
async fn held_sessions_are_pinged_and_reopened_when_lost() {
    // The second ping finds the session gone (404), as a 1.x server answers after a restart.
    let up = legacy_server_with(
        UpBehaviour::default(),
        Some(Arc::new(|method, _id, _task, n| {
            (method == "ping" && n == 2)
                .then(|| ScriptedResponse::status(404, Some("text/plain"), "Session not found"))
        })),
    )
    .await;
    let tg = TgConfig::new(&up.url())
        .gateway("session_idle_ms = 1000")
        .start()
        .await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, None, 1, "research", true).await;
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    let pinged = eventually(std::time::Duration::from_secs(10), || async {
        up.received("ping")
            .iter()
            .find(|r| r.header("mcp-session-id").as_deref() == Some("sess-1"))
            .map(|r| r.header("mcp-protocol-version"))
    })
    .await;
    assert_eq!(
        pinged,
        Some(Some("2025-11-25".to_string())),
        "a ping on the held session"
    );
    // Opened again, and in use: a ping on the new session shows taskgate holds it (the second
    // initialize alone arrives before taskgate has put the new session in place, and a
    // tasks/get sent in between still went on sess-1: a flake under load).
    let reopened = eventually(std::time::Duration::from_secs(10), || async {
        up.received("ping")
            .iter()
            .any(|r| r.header("mcp-session-id").as_deref() == Some("sess-2"))
            .then_some(())
    })
    .await;
    assert!(
        reopened.is_some(),
        "the lost session was opened again by a ping and is pinged in its turn"
    );
    assert_eq!(up.count("initialize"), 2);
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    let (status, v) = task_call(&url, None, 2, "tasks/get", &t).await;
    assert_eq!(status, 200, "{v}");
    let get = up
        .received("tasks/get")
        .last()
        .cloned()
        .expect("a tasks/get upstream");
    assert_eq!(get.header("mcp-session-id").as_deref(), Some("sess-2"));
    assert_eq!(
        up.count("initialize"),
        2,
        "no initialize of the client's own"
    );
}

/// A 2025-11-25 upstream's answer under another id than the one taskgate sent the request under
/// is an invalid answer: the 2026-07-28 client gets HTTP 502 with `-32603` under its own id
/// naming the upstream, counted as a protocol error. On the old code it was relayed as the
/// answer, under the upstream's id (break-edge F3).
#[tokio::test]
async fn an_answer_under_another_id_is_an_upstream_error() {
    let hook: Hook = Arc::new(|method, _, _, _| {
        (method == "resources/list")
            .then(|| ScriptedResponse::json(rpc_result(r#""not-yours""#, r#"{"resources":[]}"#)))
    });
    let up = legacy_server_with(UpBehaviour::default(), Some(hook)).await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (status, v) = send(modern_req(
        &tg.mcp_url(),
        None,
        43,
        "resources/list",
        json!({}),
    ))
    .await;
    assert_eq!((status, err_code(&v)), (502, -32603), "{v}");
    assert_eq!(v["id"], json!(43), "{v}");
    let message = err_message(&v);
    assert!(
        message.contains("upstream `default` sent an invalid response")
            && message.contains("\"not-yours\""),
        "{v}"
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

/// review18a #1: without auth, a 2026 client's `subscriptions/listen` on a 2025 upstream naming
/// its own task gets the task's `notifications/tasks`, as it does with auth
/// (`subscriptions_listen_relays_task_status_and_list_changes`). The reverse bridge reads the
/// status from the held session's GET stream, which reaches `observe` as a GET: the per-stream
/// rule for tasks without an owner (127d6d1) finds no `taskIds` on it and drops the event, so
/// the listener never hears of its task.
#[tokio::test]
async fn without_auth_a_reverse_bridged_listen_gets_its_tasks_status() {
    let task_cell: Arc<std::sync::Mutex<String>> = Default::default();
    let gate = Gate::new();
    let (cell, g) = (task_cell.clone(), gate.clone());
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: Some(50),
            get_stream: Some(Arc::new(move || {
                let t = cell.lock().unwrap().clone();
                vec![
                    SseStep::Wait(g.clone()),
                    SseStep::Raw(ev().data(&status_notification(&t, "completed")).wire()),
                    SseStep::HoldOpen,
                ]
            })),
            ..UpBehaviour::default()
        },
        None,
    )
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, None, 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    *task_cell.lock().unwrap() = t.clone();
    let listen = modern_req(
        &url,
        None,
        7,
        "subscriptions/listen",
        json!({"notifications": {"taskIds": [t.clone()]}, "_meta": meta(true)}),
    )
    .send()
    .await;
    assert_eq!(listen.status(), 200);
    let mut listen = listen.sse();
    let ack = listen.next_event(STEP).await.json();
    assert_eq!(
        ack["params"]["notifications"],
        json!({"taskIds": [t]}),
        "{ack}"
    );
    let opened = eventually(STEP, || async {
        let ended = up
            .task(&t)
            .ends_at
            .is_some_and(|e| std::time::Instant::now() >= e);
        (up.up.requests().iter().any(|r| r.method == "GET") && ended).then_some(())
    })
    .await;
    assert!(opened.is_some(), "the held session's GET stream is read");
    gate.open();
    let n = listen.next_event(STEP).await.json();
    assert_eq!(n["method"], "notifications/tasks", "{n}");
    assert_eq!(n["params"]["taskId"], json!(t), "{n}");
}

/// review18a #4: the reverse bridge acknowledges a 2026 cancel also when the 2025 upstream
/// answers `-32602` "already completed" (the task ended unobserved), and the `cancel` layer
/// notes that ack on the 2025 task's record. Since c53c9da every later cancel of the task, a
/// 2025 client's straight to the 2025 upstream included, is answered here as the ack applied:
/// the completed task is recorded `cancelled` and its result is gone for its owner
/// (`tasks/result`: "... was cancelled"). On the code before, the 2025 cancel went upstream, got
/// "already completed" and taskgate's own `tasks/get` recorded the task `completed`.
#[tokio::test]
async fn a_2025_cancel_after_a_reverse_bridged_ack_does_not_cancel_a_completed_task() {
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: None,
            ..UpBehaviour::default()
        },
        None,
    )
    .await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .start()
        .await;
    let url = tg.mcp_url();
    let (_, v) = call(&url, Some("tok-a"), 1, "research", true).await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    // The task completes upstream; nobody polls it.
    up.state.lock().unwrap().tasks.get_mut(&t).unwrap().status = "completed".into();
    let (status, v) = task_call(&url, Some("tok-a"), 2, "tasks/cancel", &t).await;
    assert_eq!(
        (status, &v["result"]),
        (200, &json!({"resultType": "complete"})),
        "{v}"
    );
    let mut legacy = tg.client().with_token("tok-a");
    legacy.initialize().await;
    let cancel = legacy.cancel("3", &t).await;
    assert_eq!(err_code(&cancel), -32602, "already completed: {cancel}");
    assert_ne!(tg.record(&t).unwrap().status, TaskStatus::Cancelled);
    let result = legacy.result("4", &t).await;
    assert!(result.get("result").is_some(), "its result: {result}");
}

/// An upstream that cannot be reached when the bridge must first open its 2025 session (a new
/// principal; the first call after a restart of taskgate, whose held sessions are in memory) is
/// the edge's 502 with `-32603` naming the upstream, as every other request to it is (review 20
/// #4: the opening turned the failure into a refusal, answered HTTP 200).
#[tokio::test]
async fn an_unreachable_upstream_at_session_open_is_502() {
    let up = legacy_server_with(
        UpBehaviour {
            task_ms: None,
            ..UpBehaviour::default()
        },
        None,
    )
    .await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .token("bob", "tok-b")
        .start()
        .await;
    let url = tg.mcp_url();
    let (status, v) = call(&url, Some("tok-a"), 1, "research", true).await;
    assert_eq!(status, 200, "{v}");
    up.up.stop();
    let (status, v) = call(&url, Some("tok-b"), 2, "research", true).await;
    assert_eq!((status, err_code(&v)), (502, -32603), "{v}");
}

/// A 2025 server that asks for input during a 2026 client's plain call (here
/// `sampling/createMessage`, which taskgate's held session, `initialize`d with no client
/// capabilities, never declared) gets its answer at once on the same session: `-32601` naming
/// the method, counted `taskgate_bridge_input_refused_total{reason="undeclared"}`; the tool then
/// goes on and the client gets the call's answer; a `ping` gets `{}`. Before: the request was
/// dropped, never answered, and the call waited for the server to give up on it.
#[tokio::test]
async fn an_input_request_during_a_plain_call_is_refused_upstream_at_once() {
    let gate = Gate::new();
    let g = gate.clone();
    let hook: Hook = Arc::new(move |method, id, _task, _n| {
        if method != "tools/call" {
            return None;
        }
        let ping = json!({"jsonrpc": "2.0", "id": "srv-ping", "method": "ping"});
        let ask = json!({"jsonrpc": "2.0", "id": "srv-1", "method": "sampling/createMessage",
            "params": {"messages": [], "maxTokens": 5}});
        let done = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"went on"}}]}}}}"#
        );
        Some(ScriptedResponse::sse(vec![
            ev().data(&ping.to_string()).into(),
            ev().data(&ask.to_string()).into(),
            SseStep::Wait(g.clone()),
            ev().data(&done).into(),
        ]))
    });
    let up = legacy_server_with(UpBehaviour::default(), Some(hook)).await;
    let tg = TgConfig::new(&up.url()).start().await;
    let url = tg.mcp_url();
    let call = tokio::spawn(async move { call(&url, None, 1, "plain", false).await });
    let answer_to = |id: &'static str| {
        let up = &up;
        move || {
            let found = up.up.requests().into_iter().find(|r| {
                let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                v.get("method").is_none() && v["id"] == id
            });
            async move { found }
        }
    };
    let refused = eventually(STEP, answer_to("srv-1"))
        .await
        .expect("the upstream's sampling request is answered");
    let v = refused.json();
    assert_eq!(v["error"]["code"], -32601, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("sampling/createMessage"),
        "{v}"
    );
    let call_req = &up.received("tools/call")[0];
    assert_eq!(
        refused.header("mcp-session-id"),
        call_req.header("mcp-session-id"),
        "on the call's session"
    );
    let pong = eventually(STEP, answer_to("srv-ping"))
        .await
        .expect("the upstream's ping is answered");
    assert_eq!(pong.json()["result"], json!({}), "{}", pong.body_str());

    gate.open();
    let (status, v) = call.await.unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["id"], 1, "{v}");
    assert_eq!(v["result"]["content"][0]["text"], "went on", "{v}");
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_bridge_input_refused_total",
            &[("reason", "undeclared")]
        ),
        1.0,
        "{m}"
    );
}
