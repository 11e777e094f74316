//! A bridged task's input request across two replicas on one PostgreSQL (issue 33, the reverse
//! bridge: a 2026-07-28 client on a 2025-11-25-only task server): the replica that follows the
//! task's `tasks/result` stream captures the server's `elicitation/create` and writes it to the
//! task's record, so a `tasks/get` on the other replica shows it and a `tasks/update` there
//! answers it on the task's upstream session; the key is answered once, whichever replica the
//! client asks again.

use crate::common::*;
use serde_json::{json, Value};
use std::sync::Arc;

/// What the TypeScript SDK 1.x answers `server/discover` without `Mcp-Session-Id`.
fn no_session(id: &str) -> ScriptedResponse {
    ScriptedResponse::status(
        400,
        Some("application/json"),
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32000,"message":"Bad Request: No valid session ID provided"}}}}"#
        ),
    )
}

/// The JSON-RPC response POSTs (no `method`) the upstream received: (session, message).
fn answers_received(up: &UpServer) -> Vec<(Option<String>, Value)> {
    up.up
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .filter_map(|r| {
            let v: Value = serde_json::from_slice(&r.body).ok()?;
            (v.get("method").is_none() && v.get("id").is_some())
                .then(|| (r.header("mcp-session-id"), v))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_request_captured_on_one_replica_is_shown_and_answered_on_another() {
    let Some(pg) = PgCluster::start("tier_reverse_input") else {
        return;
    };
    let up = UpServer::start(UpBehaviour {
        ask: Some("elicitation/create"),
        task_ms: Some(100),
        // 2025-11-25 only, and as the 1.x SDKs: `input_required` before anyone opens
        // `tasks/result`, the request sent once, on the first stream (the second, the other
        // replica's, waits asking nothing; the third, after the answer, carries the result).
        hook: Some(Arc::new(|method, id, task_id, n| {
            let now = format_rfc3339_ms(now_ms());
            match method {
                "server/discover" => Some(no_session(id)),
                "tasks/get" if n == 1 => Some(ScriptedResponse::json(rpc_result(
                    id,
                    &json!({"taskId": task_id, "status": "input_required", "createdAt": now,
                        "lastUpdatedAt": now, "ttl": 60000, "pollInterval": 100})
                    .to_string(),
                ))),
                "tasks/result" if n == 2 => Some(ScriptedResponse::sse(vec![SseStep::HoldOpen])),
                _ => None,
            }
        })),
        ..UpBehaviour::default()
    })
    .await;
    let config = TgConfig::new(&up.url());
    let env = "TG_TIER_REVERSE_INPUT_DB";
    let a = tg_on_pg(&config, env, &pg.url).await;
    let b = tg_on_pg(&config, env, &pg.url).await;
    let (on_a, on_b) = (a.mcp_url(), b.mcp_url());
    let (_, v) = send(modern_req(
        &on_a,
        None,
        1,
        "tools/call",
        json!({"name": "research", "arguments": {}, "_meta": meta(true)}),
    ))
    .await;
    let t = v["result"]["taskId"].as_str().unwrap().to_string();
    let key = format!("ask-{t}");
    // Captured on A (its follower's `tasks/result` stream).
    let (_, on_first) = get_asking(&on_a, None, 2, &t).await;
    assert_eq!(
        on_first["result"]["inputRequests"][&key]["method"], "elicitation/create",
        "{on_first}"
    );
    // Shown on B, from the record.
    let (status, v) = get_asking(&on_b, None, 3, &t).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["status"], "input_required", "{v}");
    assert_eq!(
        v["result"]["inputRequests"], on_first["result"]["inputRequests"],
        "B shows what A captured: {v}"
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
    // Answered on B: the response goes upstream on the task's session, once.
    let (status, ack) = send(modern_req(
        &on_b,
        None,
        4,
        "tasks/update",
        json!({"taskId": t, "inputResponses": {key.clone(): {"action": "accept", "content": {"choice": "b"}}}}),
    ))
    .await;
    assert_eq!(status, 200, "{ack}");
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    let answers = answers_received(&up);
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].0.as_deref(), Some("sess-1"), "{answers:?}");
    assert_eq!(answers[0].1["id"], json!(key));
    assert_eq!(answers[0].1["result"]["content"]["choice"], "b");
    // A, which captured it, does not answer it again; nor does B.
    for (url, id) in [(&on_a, 5), (&on_b, 6)] {
        let (status, _) = send(modern_req(
            url,
            None,
            id,
            "tasks/update",
            json!({"taskId": t, "inputResponses": {key.clone(): {"action": "decline"}}}),
        ))
        .await;
        assert_eq!(status, 200);
    }
    assert_eq!(answers_received(&up).len(), 1, "answered once");
    // The task completes with the answer, seen on either replica.
    let done = eventually(STEP, || async {
        let (_, v) = get_asking(&on_a, None, 7, &t).await;
        (v["result"]["status"] == "completed").then_some(v)
    })
    .await
    .expect("the task completes");
    assert!(done["result"].get("inputRequests").is_none(), "{done}");
    let (_, v) = get_asking(&on_b, None, 8, &t).await;
    assert_eq!(v["result"]["status"], "completed", "{v}");
    assert_eq!(up.count("tasks/cancel"), 0);
}
