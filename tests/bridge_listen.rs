//! A held session's GET stream (issue 12): a 2025-11-25 client on a pure 2026-07-28 upstream
//! (taskgate holds its session) opens the 2025 GET stream; taskgate listens upstream with
//! `subscriptions/listen` (2026-07-28 §2.3) for what the upstream's `server/discover` offers and
//! the session's `resources/subscribe`s, and relays the notifications as a 2025 client takes
//! them. Only the wire and the upstream's received requests are asserted.

use crate::common::*;

use serde_json::{json, Value};

const SUB_META: &str = "io.modelcontextprotocol/subscriptionId";

fn note(method: &str, mut params: Value) -> SseStep {
    params["_meta"] = json!({SUB_META: "sub-1"});
    let msg = json!({"jsonrpc": "2.0", "method": method, "params": params});
    SseStep::Raw(ev().data(&msg.to_string()).wire())
}

/// A pure 2026 upstream offering `capabilities` whose `subscriptions/listen` acknowledges, sends
/// a notification or two for its filter and stays open.
fn upstream(capabilities: Value) -> impl Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync {
    move |req: &RecordedRequest| {
        let id = req.rpc_id_json();
        if req.method != "POST" {
            return ScriptedResponse::status(405, Some("text/plain"), "no GET here");
        }
        // As rmcp 3 does: a POST must be JSON and accept both answer types (a GET's headers
        // reused as they are would fail here: found against rmcp 3.11).
        let accept = req.header("accept").unwrap_or_default();
        if req.header("content-type").as_deref() != Some("application/json")
            || !(accept.contains("application/json") && accept.contains("text/event-stream"))
        {
            return ScriptedResponse::status(415, Some("text/plain"), "JSON POSTs only");
        }
        let body = req.json();
        match req.rpc_method().as_deref() {
            Some("initialize") => ScriptedResponse::status(
                400,
                Some("application/json"),
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32022,"message":"Unsupported protocol version"}}}}"#
                ),
            ),
            Some("server/discover") => ScriptedResponse::json(rpc_result(
                &id,
                &json!({"resultType":"complete","supportedVersions":[MODERN],
                    "capabilities": capabilities.clone()})
                .to_string(),
            )),
            // The task the notifications below are about (a notification about a task taskgate
            // has not recorded is not passed on).
            Some("tools/call") => ScriptedResponse::json(rpc_result(
                &id,
                &json!({"resultType": "task", "taskId": "t-1", "status": "working",
                    "createdAt": format_rfc3339_ms(now_ms()),
                    "lastUpdatedAt": format_rfc3339_ms(now_ms()),
                    "ttlMs": 60000, "pollIntervalMs": 50})
                .to_string(),
            )),
            Some("subscriptions/listen") => {
                let filter = &body["params"]["notifications"];
                let ack = json!({"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged",
                    "params":{"notifications": filter}});
                let mut steps = vec![SseStep::Raw(ev().data(&ack.to_string()).wire())];
                match filter["resourceSubscriptions"][0].as_str() {
                    Some(uri) => {
                        steps.push(note("notifications/resources/updated", json!({"uri": uri})))
                    }
                    None => {
                        steps.push(note("notifications/tools/list_changed", json!({})));
                        steps.push(note("notifications/tasks", detailed("t-1", "working")));
                    }
                }
                steps.push(SseStep::HoldOpen);
                ScriptedResponse::sse(steps)
            }
            _ => ScriptedResponse::status(
                404,
                Some("application/json"),
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32601,"message":"Method not found"}}}}"#
                ),
            ),
        }
    }
}

/// Makes the task `t-1` through the held session (a 2025 task-augmented call, bridged), so the
/// upstream's notifications about it reach the client.
async fn make_t1(c: &Client) {
    let v = c
        .rpc(rpc(
            "9",
            "tools/call",
            &json!({"name": "slow", "arguments": {}, "task": {"ttl": 60000}}).to_string(),
        ))
        .await;
    assert_eq!(v["result"]["task"]["taskId"], "t-1", "{v}");
}

fn offers_lists_and_subscriptions() -> Value {
    json!({"tools": {"listChanged": true}, "resources": {"subscribe": true},
        "extensions": {EXT: {}}})
}

fn get(c: &Client) -> Req {
    Req::mcp_get(&c.url)
        .header("mcp-session-id", c.session.as_deref().unwrap())
        .header("mcp-protocol-version", PROTOCOL_VERSION)
}

/// The GET stream is the upstream's `subscriptions/listen` for what it offers: the
/// acknowledgement is swallowed, notifications come without the subscription id `_meta`, and
/// `notifications/tasks` as `notifications/tasks/status`; the listen goes upstream as a
/// stateless 2026 request; the client closing its stream closes it upstream.
#[tokio::test]
async fn a_held_sessions_get_stream_relays_the_upstreams_listen() {
    let up = Upstream::start(upstream(offers_lists_and_subscriptions())).await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    make_t1(&c).await;
    let r = get(&c).send().await;
    assert_eq!(r.status(), 200);
    let mut sse = r.sse();
    let first = sse.next_event(STEP).await.json();
    assert_eq!(
        first["method"], "notifications/tools/list_changed",
        "{first}"
    );
    assert!(first["params"].get("_meta").is_none(), "{first}");
    let status = sse.next_event(STEP).await.json();
    assert_eq!(status["method"], "notifications/tasks/status", "{status}");
    assert_eq!(status["params"]["taskId"], "t-1", "{status}");
    assert!(status["params"].get("_meta").is_none(), "{status}");

    let listen = up.received("subscriptions/listen").pop().unwrap();
    let body = listen.json();
    assert_eq!(
        body["params"]["notifications"],
        json!({"toolsListChanged": true})
    );
    assert!(!listen.has_header("mcp-session-id"));
    assert_eq!(
        listen.header("mcp-protocol-version").as_deref(),
        Some(MODERN)
    );
    assert_eq!(
        listen.header("mcp-method").as_deref(),
        Some("subscriptions/listen")
    );
    drop(sse);
    assert!(
        up.wait_for_sse_disconnects(1, STEP).await,
        "the upstream listen was closed with the client's stream"
    );
}

/// `resources/subscribe` on the held session is answered by taskgate (nothing of it goes
/// upstream: 2026 has no such method) and listened for: the open GET stream's listen is
/// replaced by one with the URI in `resourceSubscriptions`, and the update reaches the client.
#[tokio::test]
async fn resource_subscriptions_are_answered_here_and_listened_for() {
    let up = Upstream::start(upstream(offers_lists_and_subscriptions())).await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let mut sse = get(&c).send().await.sse();
    assert_eq!(
        sse.next_event(STEP).await.json()["method"],
        "notifications/tools/list_changed"
    );
    let v = c
        .rpc(rpc(
            "1",
            "resources/subscribe",
            &json!({"uri": "test://r/1"}).to_string(),
        ))
        .await;
    assert_eq!(v["result"], json!({}), "{v}");
    assert_eq!(count(&up, "resources/subscribe"), 0);
    let updated = loop {
        let v = sse.next_event(STEP).await.json();
        if v["method"] == "notifications/resources/updated" {
            break v;
        }
    };
    assert_eq!(updated["params"], json!({"uri": "test://r/1"}), "{updated}");
    let listens = up.received("subscriptions/listen");
    assert_eq!(listens.len(), 2);
    assert_eq!(
        listens[1].json()["params"]["notifications"],
        json!({"toolsListChanged": true, "resourceSubscriptions": ["test://r/1"]})
    );
    assert!(
        up.wait_for_sse_disconnects(1, STEP).await,
        "the first listen was closed"
    );
    let v = c
        .rpc(rpc(
            "2",
            "resources/unsubscribe",
            &json!({"uri": "test://r/1"}).to_string(),
        ))
        .await;
    assert_eq!(v["result"], json!({}), "{v}");
    assert!(up.wait_for_method("subscriptions/listen", 3, STEP).await);
    let last = up.received("subscriptions/listen").pop().unwrap().json();
    assert_eq!(
        last["params"]["notifications"],
        json!({"toolsListChanged": true})
    );
}

/// One GET stream per held session: a second GET gets its stream and the first one ends.
#[tokio::test]
async fn a_second_get_stream_replaces_the_first() {
    let up = Upstream::start(upstream(offers_lists_and_subscriptions())).await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    make_t1(&c).await;
    let mut one = get(&c).send().await.sse();
    // All the first stream carries before the second GET: events, not timing, decide.
    assert_eq!(
        one.next_event(STEP).await.json()["method"],
        "notifications/tools/list_changed"
    );
    assert_eq!(
        one.next_event(STEP).await.json()["method"],
        "notifications/tasks/status"
    );
    let r = get(&c).send().await;
    assert_eq!(r.status(), 200);
    let mut two = r.sse();
    assert_eq!(
        two.next_event(STEP).await.json()["method"],
        "notifications/tools/list_changed"
    );
    one.expect_end(STEP).await;
    assert!(up.wait_for_sse_disconnects(1, STEP).await);
}

/// An upstream that offers nothing to listen to: the GET stays 405, nothing goes upstream.
#[tokio::test]
async fn nothing_to_listen_to_keeps_405() {
    let up = Upstream::start(upstream(json!({"tools": {}, "extensions": {EXT: {}}}))).await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let r = get(&c).send().await;
    assert_eq!(r.status(), 405);
    assert_eq!(count(&up, "subscriptions/listen"), 0);
}
