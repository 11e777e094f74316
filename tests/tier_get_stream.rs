//! A 2025-11-25 session's GET stream on one replica and its POSTs on the others (issue 35, "GET
//! streams across replicas"): three replicas (the real binary) on one PostgreSQL behind nginx
//! round-robin, under bearer authentication, in front of a scripted 2025-11-25 task server that
//! issues sessions. How server→client messages reach the client (deploy/README.md, "Routing"):
//! - the replica the client's GET reached holds the upstream GET of the session (the upstream's
//!   `Mcp-Session-Id`) and relays what the upstream sends on it: a notification and a
//!   server→client request arrive on the client's GET stream whichever replicas its POSTs go to;
//! - a request related to a POST (a task's `elicitation/create` before its `CreateTaskResult`,
//!   or on its `tasks/result` stream while the task is `input_required`) comes on that POST's
//!   own response stream, on whichever replica the POST reached;
//! - the client's answer to either is a POST like any other: any replica sends it upstream on the
//!   session, under the id the upstream gave (taskgate never renames a server→client request's
//!   id on a session the upstream issued), so the upstream matches it.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const AUTH: &[(&str, &str)] = &[("alice", "alice-token")];

/// The JSON-RPC response POSTs (no `method`) the upstream received, parsed.
fn answers_received(server: &TaskServer) -> Vec<(Option<String>, Value)> {
    server
        .up
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

/// The next SSE event carrying JSON-RPC, from `reader`.
async fn next_message(reader: &mut SseReader) -> Value {
    loop {
        let e = reader.next_event(STEP).await;
        if e.data().is_some_and(|d| !d.is_empty()) {
            return e.json();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_to_client_messages_reach_a_2025_client_whose_get_is_on_another_replica() {
    let test = "server_to_client_messages_reach_a_2025_client_whose_get_is_on_another_replica";
    let released = Gate::new();
    let gate = released.clone();
    let server = TaskServer::start(Behaviour {
        get_stream: Some(std::sync::Arc::new(move || {
            vec![
                SseStep::Wait(gate.clone()),
                ev().data(&notification(
                    "notifications/message",
                    r#"{"level":"info","data":"from the GET stream"}"#,
                ))
                .into(),
                ev().data(&rpc("\"srv-roots-1\"", "roots/list", "{}")).into(),
                SseStep::HoldOpen,
            ]
        })),
        creation_sse: true,
        creation_head: Some(std::sync::Arc::new(|task_id: &str, _: &Value| {
            let ask = json!({
                "jsonrpc": "2.0", "id": format!("srv-ask-{task_id}"), "method": "elicitation/create",
                "params": {
                    "mode": "form", "message": "which one?",
                    "requestedSchema": {"type": "object", "properties": {"pick": {"type": "string"}}},
                    "_meta": {"io.modelcontextprotocol/related-task": {"taskId": task_id}},
                },
            });
            vec![ev().data(&ask.to_string()).into()]
        })),
        ..Behaviour::default()
    })
    .await;
    let Some(t) = Tier::start_with(test, &server.url(), &bearer_auth(AUTH)) else {
        return;
    };
    let token = AUTH[0].1;
    let mut c = Client::new(&t.replicas[0].url()).with_token(token);
    let caps = c.initialize().await;
    assert!(caps["result"].is_object(), "{caps}");
    let sid = c.session.clone().unwrap();
    let on = |n: usize| {
        Client::new(&t.replicas[n].url())
            .with_token(token)
            .with_session(&sid)
    };

    // The GET stream on replica 1.
    let get = Req::mcp_get(&t.replicas[1].url())
        .header("authorization", &format!("Bearer {token}"))
        .header("mcp-session-id", &sid)
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert_eq!(get.status(), 200, "the GET stream opens");
    let mut stream = get.sse();
    let opened = eventually(STEP, || {
        let n = server
            .up
            .requests()
            .iter()
            .filter(|r| r.method == "GET")
            .count();
        async move { (n == 1).then_some(()) }
    })
    .await;
    assert!(opened.is_some(), "replica 1 holds the upstream GET");

    // POSTs round-robin through nginx while the upstream speaks on its GET stream.
    let rr = Client::new(&t.balancer.mcp_url())
        .with_token(token)
        .with_session(&sid);
    let mut tasks = Vec::new();
    for i in 0..6 {
        let r = rr
            .send(Client::create_body(&format!("\"c{i}\""), Some(60_000)))
            .await;
        assert_eq!(r.status(), 200);
        let mut reader = r.sse();
        // A task-related request comes on the creation POST's own stream, before its answer.
        let ask = next_message(&mut reader).await;
        assert_eq!(ask["method"], "elicitation/create", "{ask}");
        let created = next_message(&mut reader).await;
        let task = created["result"]["task"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("a CreateTaskResult: {created}"))
            .to_string();
        assert_eq!(ask["id"], format!("srv-ask-{task}"), "{ask}");
        // Answered through nginx: whichever replica takes it sends it upstream on the session.
        let answer = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "accept", "content": {"pick": "a"}}});
        let r = rr.send(answer.to_string()).await;
        assert_eq!(r.status(), 202, "the answer is accepted");
        tasks.push(task);
        if i == 2 {
            released.open();
        }
    }
    let v = next_message(&mut stream).await;
    assert_eq!(v["method"], "notifications/message", "{v}");
    assert_eq!(v["params"]["data"], "from the GET stream", "{v}");
    let v = next_message(&mut stream).await;
    assert_eq!(
        (v["method"].clone(), v["id"].clone()),
        (json!("roots/list"), json!("srv-roots-1")),
        "the upstream's request under its own id: {v}"
    );
    // The answer to the GET stream's request goes to replica 2, neither the GET's nor the
    // initialize's.
    let r = on(2)
        .send(json!({"jsonrpc": "2.0", "id": "srv-roots-1", "result": {"roots": []}}).to_string())
        .await;
    assert_eq!(r.status(), 202);

    let got = eventually(STEP, || {
        let answers = answers_received(&server);
        async move { (answers.len() >= 7).then_some(answers) }
    })
    .await
    .expect("every answer reaches the upstream");
    for (session, v) in &got {
        assert_eq!(
            session.as_deref(),
            Some(sid.as_str()),
            "on the session: {v}"
        );
    }
    let ids: Vec<&Value> = got.iter().map(|(_, v)| &v["id"]).collect();
    assert!(ids.contains(&&json!("srv-roots-1")), "{ids:?}");
    for task in &tasks {
        assert!(
            ids.contains(&&json!(format!("srv-ask-{task}"))),
            "{task}: {ids:?}"
        );
    }
    // And the session's tasks are served round-robin all along.
    for (i, task) in tasks.iter().enumerate() {
        let v = on(i % 3).get(&format!("\"g{i}\""), task).await;
        assert_eq!(v["result"]["taskId"], json!(task), "{v}");
    }
    // The stream is still open for what comes next.
    stream.expect_open_for(Duration::from_millis(300)).await;
}

/// A task that needs input, its requests spread over the replicas: created on one replica, its
/// `tasks/result` on a second (the stream the upstream sends the task's `elicitation/create` on,
/// under `related-task`), the client's answer on a third; the upstream takes the answer, the task
/// ends, and the result comes on the `tasks/result` stream of the second replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_input_request_and_its_answer_on_different_replicas() {
    let test = "a_task_input_request_and_its_answer_on_different_replicas";
    let server = UpServer::start(UpBehaviour {
        ask: Some("elicitation/create"),
        task_ms: Some(50),
        ..UpBehaviour::default()
    })
    .await;
    let Some(t) = Tier::start_with(test, &server.url(), &bearer_auth(AUTH)) else {
        return;
    };
    let token = AUTH[0].1;
    let mut c = Client::new(&t.replicas[0].url()).with_token(token);
    c.initialize().await;
    let sid = c.session.clone().unwrap();
    let on = |n: usize| {
        Client::new(&t.replicas[n].url())
            .with_token(token)
            .with_session(&sid)
    };
    let create = rpc(
        "1",
        "tools/call",
        r#"{"name":"research","arguments":{"n":1},"task":{"ttl":60000}}"#,
    );
    let created = on(1).rpc(create).await;
    let task = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a CreateTaskResult: {created}"))
        .to_string();
    let r = on(2)
        .send(rpc(
            "2",
            "tasks/result",
            &json!({"taskId": task}).to_string(),
        ))
        .await;
    assert_eq!(r.status(), 200);
    let mut stream = r.sse();
    let ask = next_message(&mut stream).await;
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    assert_eq!(ask["id"], format!("ask-{task}"), "the upstream's id: {ask}");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "accept", "content": {"name": "x"}}});
    assert_eq!(on(0).send(answer.to_string()).await.status(), 202);
    let done = next_message(&mut stream).await;
    assert_eq!(done["id"], 2, "{done}");
    assert!(done["result"].is_object(), "the task's result: {done}");
    let answered = server
        .task(&task)
        .answer
        .expect("the upstream got the answer");
    assert_eq!(answered["result"]["content"]["name"], "x", "{answered}");
    let v = on(1).get("3", &task).await;
    assert_eq!(v["result"]["status"], "completed", "{v}");
}
