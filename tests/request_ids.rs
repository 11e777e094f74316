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
