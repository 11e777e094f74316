//! The pure parts of `gateway_tasks`: the negotiation rewrites and the task shapes.

use super::*;

#[test]
fn initialize_gets_tasks_unless_the_server_has_its_own() {
    let state = GatewayTasksState::new_for_tests();
    let plain = r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"s","version":"1"}}}"#;
    let out: Value =
        serde_json::from_str(&advertise(&state, plain, initialize_result).unwrap()).unwrap();
    assert_eq!(
        out["result"]["capabilities"]["tasks"],
        json!({"cancel": {}, "list": {}, "requests": {"tools": {"call": {}}}})
    );
    assert!(state.runs_tasks());
    let own = r#"{"jsonrpc":"2.0","id":1,"result":{"capabilities":{"tasks":{"cancel":{}}}}}"#;
    assert_eq!(advertise(&state, own, initialize_result), None);
    assert!(!state.runs_tasks(), "a server with tasks keeps its own");
}

#[test]
fn discover_gets_the_extension() {
    let state = GatewayTasksState::new_for_tests();
    let discover = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{"tools":{}}}}"#;
    let out: Value =
        serde_json::from_str(&advertise(&state, discover, discover_result).unwrap()).unwrap();
    assert!(out["result"]["capabilities"]["extensions"][TASKS_EXTENSION].is_object());
    let error = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no"}}"#;
    assert_eq!(advertise(&state, error, discover_result), None);
    assert!(state.runs_tasks());
}

#[test]
fn tools_are_optional_tasks() {
    let list = r#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"a","inputSchema":{}},{"name":"b","execution":{"taskSupport":"forbidden"}}]}}"#;
    let out: Value = serde_json::from_str(&optional_task_support(list).unwrap()).unwrap();
    assert_eq!(
        out["result"]["tools"][0]["execution"]["taskSupport"],
        "optional"
    );
    assert_eq!(
        out["result"]["tools"][1]["execution"]["taskSupport"],
        "forbidden"
    );
}

#[test]
fn the_plain_call_keeps_the_clients_bytes() {
    let msg = crate::jsonrpc::Message::parse(bytes::Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"task":{"ttl":5000},"name":"slow","arguments":{"n":1.10}}}"#,
    ))
    .unwrap();
    let own = crate::jsonrpc::Id::from_json("\"taskgate-gt-1\"").unwrap();
    let (plain, token) = held::plain_call(&msg, &own, "tgt-x").unwrap();
    assert_eq!(
        std::str::from_utf8(plain.bytes()).unwrap(),
        r#"{"jsonrpc":"2.0","id":"taskgate-gt-1","method":"tools/call","params":{"_meta":{"progressToken":"tgt-x"},"name":"slow","arguments":{"n":1.10}}}"#
    );
    assert_eq!(token, "\"tgt-x\"");
    let with_token = crate::jsonrpc::Message::parse(bytes::Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","_meta":{"progressToken":42,"k":1},"task":{}}}"#,
    ))
    .unwrap();
    let (plain, token) = held::plain_call(&with_token, &own, "tgt-x").unwrap();
    assert_eq!(token, "42");
    assert_eq!(
        std::str::from_utf8(plain.bytes()).unwrap(),
        r#"{"jsonrpc":"2.0","id":"taskgate-gt-1","method":"tools/call","params":{"name":"slow","_meta":{"progressToken":42,"k":1}}}"#
    );
    // 2026-07-28: the client's tasks extension is not declared to the server (it would invite
    // a task of the server's own); its other capabilities go as they came.
    let modern = crate::jsonrpc::Message::parse(bytes::Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","_meta":{"progressToken":1,"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}},"elicitation":{}}}}}"#,
    ))
    .unwrap();
    let (plain, _) = held::plain_call(&modern, &own, "tgt-x").unwrap();
    assert_eq!(
        std::str::from_utf8(plain.bytes()).unwrap(),
        r#"{"jsonrpc":"2.0","id":"taskgate-gt-1","method":"tools/call","params":{"name":"slow","_meta":{"progressToken":1,"io.modelcontextprotocol/clientCapabilities":{"extensions":{},"elicitation":{}}}}}"#
    );
}

#[test]
fn create_results_in_both_eras() {
    let task = json!({"taskId":"tgt-1","status":"working","createdAt":"t","lastUpdatedAt":"t","ttl":60000,"pollInterval":1000});
    let legacy = answers::create_result(&task, Era::Legacy);
    assert_eq!(legacy["task"]["ttl"], 60000);
    let modern = answers::create_result(&task, Era::Modern);
    assert_eq!(modern["resultType"], "task");
    assert_eq!(modern["ttlMs"], 60000);
    assert_eq!(modern["pollIntervalMs"], 1000);
    assert!(modern.get("ttl").is_none());
}

/// Outcomes in memory are bounded by bytes and count: one larger than
/// `tasks.max_stored_result_bytes` is not kept, and past [`DONE_LIMIT`] the oldest go, not all.
#[test]
fn kept_outcomes_are_bounded_and_the_oldest_go_first() {
    let state = GatewayTasksState::new_for_tests();
    let max = state.registry.config().max_stored_result_bytes as usize;
    let big = json!({"content": [{"type": "text", "text": "x".repeat(max + 1)}]});
    let size = big.to_string().len();
    state.remember("big", Outcome::Result(big.to_string().into()), size);
    assert!(
        state.outcome("big").is_none(),
        "larger than the record may keep"
    );
    for i in 0..=DONE_LIMIT {
        state.remember(
            &format!("t{i}"),
            Outcome::Error(Arc::new(json!({"code": 1}))),
            10,
        );
    }
    assert!(state.outcome("t0").is_none(), "the oldest went");
    assert!(state.outcome("t1").is_some(), "the others stayed");
    assert!(state.outcome(&format!("t{DONE_LIMIT}")).is_some());
    assert!(state.done.lock().bytes <= DONE_BYTES);
}

/// A GET answer that is no stream passes as it came; a session's channel to its GET streams
/// goes with its last stream (the table stays bounded by the open streams).
#[tokio::test]
async fn get_stream_channels_go_with_their_last_stream() {
    let state = GatewayTasksState::new_for_tests();
    let json = crate::exchange::McpReply::local_json(bytes::Bytes::from_static(b"{}"));
    let passed = listen::merged(&state, "s1", json);
    assert!(matches!(passed.body, crate::exchange::ReplyBody::Json(ref b) if &b[..] == b"{}"));
    assert!(state.listeners.lock().is_empty());
    let (_tx1, rx1) = tokio::sync::mpsc::channel(1);
    let (_tx2, rx2) = tokio::sync::mpsc::channel(1);
    let a = listen::merged(
        &state,
        "s1",
        crate::exchange::McpReply::event_stream(rx1, None),
    );
    let b = listen::merged(
        &state,
        "s1",
        crate::exchange::McpReply::event_stream(rx2, None),
    );
    assert_eq!(state.listeners.lock().len(), 1);
    drop(a);
    assert_eq!(state.listeners.lock().len(), 1, "one stream still listens");
    drop(b);
    assert!(
        state.listeners.lock().is_empty(),
        "gone with the last stream"
    );
}

/// Review 19 #2: a gateway task's end and what its record keeps (the 2025-11-25 result of a
/// completed call, the JSON-RPC error of a failed one) are one store write, awaited: no write
/// leaves the record terminal without its outcome. The upstream got a plain call and holds
/// nothing, so a crash right after a status-only write left a durable `completed` whose result
/// was nowhere. On the code before, the status was written first, the outcome after it.
#[tokio::test]
async fn a_gateway_tasks_end_and_its_outcome_are_one_write() {
    use crate::exchange::GatewayError;
    use crate::layers::testing::{owner, record, registry, request};
    use crate::store::TaskRecord;
    use tower::{Layer, ServiceExt};
    for fails in [false, true] {
        let (registry, store) = registry();
        let state = GatewayTasksState::new(registry.clone(), true);
        let upstream = tower::service_fn(move |req: McpRequest| {
            let id = req
                .id()
                .map(|i| i.as_json().to_string())
                .unwrap_or_default();
            let body = match fails {
                true => format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32000,"message":"the tool broke"}}}}"#
                ),
                false => format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"done"}}]}}}}"#
                ),
            };
            async move { Ok::<_, GatewayError>(McpReply::local_json(body.into())) }
        });
        let svc = GatewayTasksLayer::new(state).layer(upstream);
        let mut req = request(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","arguments":{},"task":{"ttl":60000}}}"#,
        );
        let slot = registry.reserve(&"up".into(), &owner()).unwrap();
        req.extensions.insert(Era::Legacy);
        req.extensions.insert(PendingCreation {
            template: Arc::new(TaskRecord {
                task_id: String::new(),
                ..record("")
            }),
            reservation: Arc::new(slot),
            progress_token: None,
            created: Arc::default(),
        });
        let reply = svc.oneshot(req).await.unwrap();
        let created: Value = match &reply.body {
            crate::exchange::ReplyBody::Json(b) => serde_json::from_slice(b).unwrap(),
            _ => panic!("not a JSON CreateTaskResult"),
        };
        let task_id = created["result"]["task"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("{created}"))
            .to_string();
        let ended = |r: &TaskRecord| r.task_id == task_id && r.status.is_terminal();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !store.written.lock().unwrap().iter().any(ended) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the task never ended"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        for r in store.written.lock().unwrap().iter().filter(|r| ended(r)) {
            let kept = match fails {
                true => r.terminal_error.is_some(),
                false => r.terminal_result.is_some(),
            };
            assert!(
                kept,
                "fails={fails}: a write left the task {:?} without its outcome",
                r.status
            );
        }
    }
}

/// The related-task `_meta` is spliced into a result's own bytes (a result nested past
/// serde_json's 128 levels included), whether it has a `_meta`, one with the key, or nothing.
#[test]
fn the_related_task_meta_is_spliced_into_the_results_bytes() {
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let result = format!(r#"{{"content":[],"structuredContent":{{"v":{deep}}}}}"#);
    let with = answers::with_related_task_raw(&result, "t1").expect("spliced");
    assert_eq!(
        with,
        format!(
            r#"{{"_meta":{{"io.modelcontextprotocol/related-task":{{"taskId":"t1"}}}},"content":[],"structuredContent":{{"v":{deep}}}}}"#
        )
    );
    assert_eq!(
        answers::with_related_task_raw("{}", "t1").as_deref(),
        Some(r#"{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t1"}}}"#)
    );
    assert_eq!(
        answers::with_related_task_raw(r#"{"_meta":{"a":1},"x":2}"#, "t1").as_deref(),
        Some(r#"{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t1"},"a":1},"x":2}"#)
    );
    let replaced = answers::with_related_task_raw(
        r#"{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"other"}},"x":2}"#,
        "t1",
    )
    .expect("spliced");
    let v: serde_json::Value = serde_json::from_str(&replaced).expect("json");
    assert_eq!(
        v["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        "t1"
    );
    assert_eq!(v["x"], 2);
    assert!(answers::with_related_task_raw("[]", "t1").is_none());
}

/// The final writes held for retry are bounded by count and by bytes (break B, F2): past
/// either a new one is refused (its task is then written `failed`, see `held`), and one that
/// ends gives its place back.
#[test]
fn final_writes_held_for_retry_are_bounded() {
    let state = GatewayTasksState::new_for_tests();
    let held: Vec<PendingFinal> = (0..PENDING_FINAL_WRITES)
        .map(|_| state.pend_final(10).expect("within the bound"))
        .collect();
    assert_eq!(state.pending_final_writes(), PENDING_FINAL_WRITES);
    assert!(state.pend_final(1).is_none(), "past the count");
    drop(held);
    assert_eq!(state.pending_final_writes(), 0);
    let big = state
        .pend_final(PENDING_FINAL_BYTES)
        .expect("all the bytes");
    assert!(state.pend_final(1).is_none(), "past the bytes");
    drop(big);
    assert!(state.pend_final(1).is_some());
}
