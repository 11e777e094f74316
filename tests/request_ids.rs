//! JSON-RPC request ids on the upstream leg (issue 29 #10, `src/layers/ids.rs`): two callers of
//! a session-less 2025-11-25 upstream that use the same id at once reach it under two ids, get
//! their own answers under their own ids, and a `notifications/cancelled` reaches only its
//! sender's request.

use crate::common::*;

/// A 2025-11-25 upstream without sessions (its `initialize` answer has no `Mcp-Session-Id`,
/// as the SDKs' stateless modes) that answers each `tools/call` with its `params.name`, under
/// the id it got, once the gate opens.
async fn sessionless_upstream(gate: &Gate) -> Upstream {
    let gate = gate.clone();
    Upstream::start(move |req| match req.rpc_method().as_deref() {
        Some("initialize") => ScriptedResponse::result_for(
            req,
            r#"{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"s","version":"1"}}"#,
        ),
        Some("tools/call") => {
            let name = req.json()["params"]["name"].clone();
            ScriptedResponse::result_for(req, &format!(r#"{{"content":[],"caller":{name}}}"#))
                .after_gate(&gate)
        }
        _ => ScriptedResponse::accepted(),
    })
    .await
}

/// alice and bob (bearer tokens) both call with id 1 while the other's call is in flight: the
/// upstream sees two ids (before `ids` it saw id 1 twice, and an SDK transport keyed by id would
/// have sent one caller's answer on the other's stream); each gets its own answer under id 1, a
/// number; bob's `notifications/cancelled` names his own call upstream, not alice's.
#[tokio::test]
async fn two_principals_with_the_same_id_reach_a_sessionless_upstream_under_two_ids() {
    let gate = Gate::new();
    let up = sessionless_upstream(&gate).await;
    let tg = TgConfig::new(&format!("http://{}/mcp", up.addr))
        .token("alice", "alice-token")
        .token("bob", "bob-token")
        .start()
        .await;
    let mut alice = tg.client().with_token("alice-token");
    let mut bob = tg.client().with_token("bob-token");
    alice.initialize().await;
    bob.initialize().await;
    assert!(
        alice.session.is_none() && bob.session.is_none(),
        "session-less"
    );

    let call = |c: &Client, who: &str| {
        let req = c.req(rpc("1", "tools/call", &format!(r#"{{"name":"{who}"}}"#)));
        tokio::spawn(async move { req.send().await.json().await })
    };
    let a = call(&alice, "alice");
    up.wait_for_method("tools/call", 1, STEP).await;
    let b = call(&bob, "bob");
    assert!(up.wait_for_method("tools/call", 2, STEP).await);
    let calls = up.received("tools/call");
    let ids: Vec<String> = calls.iter().map(|r| r.rpc_id_json()).collect();
    assert_eq!(ids[0], "1", "the first call goes as it came");
    assert_ne!(
        ids[0], ids[1],
        "both in flight at once under one id: {ids:?}"
    );

    assert_eq!(
        bob.notify(
            "notifications/cancelled",
            serde_json::json!({"requestId": 1})
        )
        .await,
        202
    );
    assert!(up.wait_for_method("notifications/cancelled", 1, STEP).await);
    let cancel = up.received("notifications/cancelled").pop().unwrap().json();
    assert_eq!(
        cancel["params"]["requestId"].to_string(),
        ids[1],
        "bob's cancel names bob's call: {cancel}"
    );

    gate.open();
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(
        (&a["id"], &a["result"]["caller"]),
        (&serde_json::json!(1), &serde_json::json!("alice")),
        "{a}"
    );
    assert_eq!(
        (&b["id"], &b["result"]["caller"]),
        (&serde_json::json!(1), &serde_json::json!("bob")),
        "{b}"
    );
}

/// A client's request whose id has the form of taskgate's own (`"taskgate-…"`) goes upstream
/// under an id taskgate mints, even when that id is free (before, it went as it came), and its
/// answer comes back under the client's id: the upstream never sees a client's id with
/// taskgate's prefix, so an answer under such an id on a resumed GET stream is taskgate's.
#[tokio::test]
async fn a_client_id_in_taskgates_form_goes_upstream_under_a_minted_id() {
    let up = Upstream::start(mcp_handler).await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let answer = c
        .rpc(rpc("\"taskgate-gt-1\"", "tools/call", r#"{"name":"echo"}"#))
        .await;
    assert_eq!(answer["id"], serde_json::json!("taskgate-gt-1"), "{answer}");
    assert_eq!(answer["result"]["echo"], serde_json::json!("tools/call"));
    let sent = up.received("tools/call").pop().unwrap().rpc_id_json();
    assert!(
        sent.starts_with("\"taskgate-id-"),
        "went upstream as {sent}"
    );
}

/// A resumed GET stream (`Last-Event-ID`) without `upgrade`: the upstream replays the answers to
/// taskgate's own requests on the session (a gateway-owned task's held call, a lost-task check)
/// beside the client's own answer and a notification; the client gets only its own.
#[tokio::test]
async fn a_resumed_get_stream_gets_no_answer_to_taskgates_own_requests() {
    let up = Upstream::start(|req| {
        if req.method == "GET" {
            let replayed = [
                r#"{"jsonrpc":"2.0","id":"taskgate-gt-7","result":{"content":[]}}"#.to_string(),
                r#"{"jsonrpc":"2.0","id":"taskgate-lost-check-3","error":{"code":-32602,"message":"Task not found"}}"#.to_string(),
                r#"{"jsonrpc":"2.0","id":"taskgate-id-9","result":{"content":[]}}"#.to_string(),
                r#"{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"the client's own"}]}}"#.to_string(),
                notification("notifications/tools/list_changed", "{}"),
            ];
            let mut steps: Vec<SseStep> = replayed
                .iter()
                .enumerate()
                .map(|(i, d)| ev().event("message").id(&format!("e{i}")).data(d).into())
                .collect();
            steps.push(SseStep::HoldOpen);
            return ScriptedResponse::sse(steps);
        }
        mcp_handler(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let mut stream = c.resumed_get_stream().await;
    let first = stream.next_event(STEP).await.json();
    assert_eq!(
        first["id"],
        serde_json::json!(2),
        "the first event passed is the client's own answer: {first}"
    );
    let next = stream.next_event(STEP).await.json();
    assert_eq!(
        next["method"],
        serde_json::json!("notifications/tools/list_changed"),
        "{next}"
    );
}

/// A client resumes its broken POST stream (2025-11-25 transports, "Resumability and
/// Redelivery": GET with `Last-Event-ID` of that stream's event) and the upstream replays the
/// answer to its request there, under the id the request went upstream with: the client gets
/// it under its own id, a plain one (`7`) and one in taskgate's form, which went upstream
/// under a minted id (review 21 #3: that answer was dropped as taskgate's own).
#[tokio::test]
async fn a_resumed_post_stream_gets_the_clients_answer_under_its_id() {
    let got = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let seen = got.clone();
    let up = Upstream::start(move |req| {
        if req.method == "GET" {
            let id = seen.lock().unwrap().clone();
            let answer = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"replayed"}}]}}}}"#
            );
            return ScriptedResponse::sse(vec![
                ev().event("message").id("p2").data(&answer).into(),
                SseStep::HoldOpen,
            ]);
        }
        if req.rpc_method().as_deref() == Some("tools/call") {
            *seen.lock().unwrap() = req.rpc_id_json();
            return broken_stream();
        }
        mcp_handler(req)
    })
    .await;
    let tg = UgConfig::new(&up.url())
        .upgrade(&["enabled = false"])
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;
    for id in ["7", "\"taskgate-mine\""] {
        let r = c
            .send(rpc(id, "tools/call", r#"{"name":"echo","arguments":{}}"#))
            .await;
        let mut post = r.sse();
        let first = post.next_event(STEP).await.json();
        assert_eq!(first["method"], "notifications/message", "{first}");
        drop(post);
        let get = Req::mcp_get(&tg.mcp_url())
            .header("mcp-session-id", c.session.as_deref().unwrap())
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .header("last-event-id", "p1")
            .send()
            .await;
        assert_eq!(get.status(), 200);
        let mut stream = get.sse();
        let answer = stream.next_event(STEP).await.json();
        let want: serde_json::Value = serde_json::from_str(id).unwrap();
        assert_eq!(answer["id"], want, "id {id}: {answer}");
    }
}

/// Callers share a session-less upstream's one stream of requests: the answer the upstream
/// replays on a resumed GET stream under a minted id gets its client's id back only on its
/// own caller's stream. bob, resuming with the event id of alice's broken stream, gets
/// neither her answer nor her id; alice then gets it under her own id.
#[tokio::test]
async fn a_replayed_answer_is_restored_only_for_its_own_caller() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sent = seen.clone();
    let up = Upstream::start(move |req| {
        if req.method == "GET" {
            let id = sent.lock().unwrap().clone();
            let answer = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[]}}}}"#);
            return replayed_on_get(&answer);
        }
        match req.rpc_method().as_deref() {
            Some("initialize") => ScriptedResponse::result_for(
                req,
                r#"{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"s","version":"1"}}"#,
            ),
            Some("tools/call") => {
                *sent.lock().unwrap() = req.rpc_id_json();
                broken_stream()
            }
            _ => ScriptedResponse::accepted(),
        }
    })
    .await;
    let (tg, alice, bob) = alice_and_bob_at(&up.url()).await;
    let r = alice
        .send(rpc("\"taskgate-a\"", "tools/call", r#"{"name":"echo"}"#))
        .await;
    let mut post = r.sse();
    assert_eq!(
        post.next_event(STEP).await.json()["method"],
        "notifications/message"
    );
    drop(post);
    assert!(seen.lock().unwrap().starts_with("\"taskgate-id-"), "mapped");
    let resume = |c: &Client| {
        Req::mcp_get(&tg.mcp_url())
            .header(
                "authorization",
                &format!("Bearer {}", c.token.clone().unwrap()),
            )
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .header("last-event-id", "p1")
            .send()
    };
    let get = resume(&bob).await;
    assert_eq!(get.status(), 200);
    let first = get.sse().next_event(STEP).await.json();
    assert_eq!(
        first["method"], "notifications/tools/list_changed",
        "bob gets no answer of alice's: {first}"
    );
    let get = resume(&alice).await;
    assert_eq!(get.status(), 200);
    let first = get.sse().next_event(STEP).await.json();
    assert_eq!(first["id"], serde_json::json!("taskgate-a"), "{first}");
}

/// On a session-less upstream (one upstream "session", `None`, shared by every
/// principal) bob's call with id 1 is in flight; alice's call with id 1 goes under a minted id
/// and her POST stream breaks before the answer. bob resumes a stream (GET, `Last-Event-ID`);
/// the upstream replays alice's answer under the minted id there (server-everything replays
/// the session's later events). bob must not get it (review 21b #1: he got alice's tool
/// result under his own id 1, his call still open: his client took it as its answer).
#[tokio::test]
async fn a_replayed_answer_never_reaches_another_principal() {
    let minted = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let m = minted.clone();
    let up = Upstream::start(move |req| {
        if req.method == "GET" {
            let id = m.lock().unwrap().clone();
            let answer = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[],"caller":"alice-secret"}}}}"#
            );
            return replayed_on_get(&answer);
        }
        match req.rpc_method().as_deref() {
            Some("initialize") => ScriptedResponse::result_for(
                req,
                r#"{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"s","version":"1"}}"#,
            ),
            Some("tools/call") if req.rpc_id_json() == "1" => ScriptedResponse::sse(vec![
                ev().event("message")
                    .id("b1")
                    .data(&notification("notifications/message", r#"{"level":"info","data":"bob working"}"#))
                    .into(),
                SseStep::HoldOpen,
            ]),
            Some("tools/call") => {
                *m.lock().unwrap() = req.rpc_id_json();
                broken_stream()
            }
            _ => ScriptedResponse::accepted(),
        }
    })
    .await;
    let (tg, alice, bob) = alice_and_bob_at(&up.url()).await;
    assert!(
        alice.session.is_none() && bob.session.is_none(),
        "session-less"
    );
    // bob's call 1, held open upstream.
    let mut bob_post = bob
        .send(rpc("1", "tools/call", r#"{"name":"bob"}"#))
        .await
        .sse();
    assert_eq!(
        bob_post.next_event(STEP).await.json()["method"],
        "notifications/message"
    );
    // alice's call 1: mapped; her stream breaks before the answer.
    let mut post = alice
        .send(rpc("1", "tools/call", r#"{"name":"alice"}"#))
        .await
        .sse();
    assert_eq!(
        post.next_event(STEP).await.json()["method"],
        "notifications/message"
    );
    drop(post);
    assert!(
        minted.lock().unwrap().starts_with("\"taskgate-id-"),
        "mapped"
    );
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let get = Req::mcp_get(&tg.mcp_url())
        .header("authorization", "Bearer bob-token")
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .header("last-event-id", "b1")
        .send()
        .await;
    assert_eq!(get.status(), 200);
    let first = get.sse().next_event(STEP).await.json();
    assert_eq!(
        first["method"], "notifications/tools/list_changed",
        "bob got alice's answer under his own id 1: {first}"
    );
    drop(bob_post);
}

/// A tools/call's SSE answer that breaks after its first event (id `p1`), before the answer.
fn broken_stream() -> ScriptedResponse {
    ScriptedResponse::sse(vec![ev()
        .event("message")
        .id("p1")
        .data(&notification(
            "notifications/message",
            r#"{"level":"info","data":"working"}"#,
        ))
        .into()])
}

/// A resumed GET stream's script: the upstream replays `answer` (event `p2`), then a
/// `notifications/tools/list_changed` (event `p3`, which every stream gets), and holds open.
fn replayed_on_get(answer: &str) -> ScriptedResponse {
    ScriptedResponse::sse(vec![
        ev().event("message").id("p2").data(answer).into(),
        ev().event("message")
            .id("p3")
            .data(&notification("notifications/tools/list_changed", "{}"))
            .into(),
        SseStep::HoldOpen,
    ])
}
