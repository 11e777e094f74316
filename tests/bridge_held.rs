//! A 2025-11-25 client on a pure 2026-07-28 upstream (issue 12, held sessions: the upstream
//! refuses `initialize`, as rmcp 3 with `legacy_session_mode` off does, and has no sessions):
//! taskgate holds the 2025 session itself and sends every request upstream as a stateless 2026
//! request. The scripted upstream is `common/modern_server.rs`'s, made pure 2026: `initialize`
//! is `-32022` (HTTP 400), any request carrying `Mcp-Session-Id` is refused, GET and DELETE are
//! 405. Only the wire, the upstream's received requests and the registry are asserted.

use crate::common::*;

use serde_json::json;
use taskgate::store::Origin;

const CAPS: &str = "io.modelcontextprotocol/clientCapabilities";

/// `initialize` is answered by taskgate from `server/discover` with a session id it minted; the
/// session's requests go upstream as stateless 2026 requests carrying the client's
/// capabilities; `notifications/initialized`, `ping`, GET and DELETE are answered locally.
#[tokio::test]
async fn a_2025_client_gets_a_session_on_a_pure_2026_upstream() {
    let (up, state) = pure_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    let r = c.send(initialize_with(json!({"elicitation": {}}))).await;
    assert_eq!(r.status(), 200);
    let session = r.header("mcp-session-id").expect("a session id");
    assert!(r.header("x-taskgate-held-session").is_none());
    let init = r.json().await;
    c.session = Some(session.clone());
    assert!(
        session.len() == 36 && session.starts_with("tgh-"),
        "the held form: {session}"
    );
    let result = &init["result"];
    assert_eq!(result["protocolVersion"], PROTOCOL_VERSION, "{init}");
    assert_eq!(result["serverInfo"]["name"], "pure-2026", "{init}");
    assert_eq!(result["instructions"], "pure 2026", "{init}");
    assert!(
        result["capabilities"]["tasks"]["requests"]["tools"]["call"].is_object(),
        "{init}"
    );
    assert!(result["capabilities"].get("extensions").is_none(), "{init}");
    assert_eq!(count(&up, "initialize"), 1);

    assert_eq!(c.notify("notifications/initialized", json!({})).await, 202);
    assert_eq!(count(&up, "notifications/initialized"), 0);
    let pong = c.rpc(rpc("1", "ping", "{}")).await;
    assert_eq!(pong["result"], json!({}), "{pong}");
    assert_eq!(count(&up, "ping"), 0);

    let tools = c.rpc(rpc("2", "tools/list", "{}")).await;
    assert_eq!(
        tools["result"]["tools"][0]["execution"]["taskSupport"], "optional",
        "{tools}"
    );
    let sent = up.received("tools/list").pop().unwrap();
    let body = sent.json();
    assert!(!sent.has_header("mcp-session-id"));
    assert_eq!(sent.header("mcp-protocol-version").as_deref(), Some(MODERN));
    assert_eq!(sent.header("mcp-method").as_deref(), Some("tools/list"));
    assert_eq!(
        body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
        MODERN
    );
    assert_eq!(
        body["params"]["_meta"][CAPS],
        json!({"elicitation": {}}),
        "{body}"
    );
    assert_eq!(
        body["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]["name"],
        "held-test"
    );

    // A task: created, read and completed through the held session.
    let v = c
        .rpc(rpc(
            "3",
            "tools/call",
            &json!({"name": "slow_compute", "arguments": {}, "task": {"ttl": 60000}}).to_string(),
        ))
        .await;
    let t = v["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string();
    assert_eq!(tg.record(&t).unwrap().origin, Origin::Bridged);
    let sent = up.received("tools/call").pop().unwrap().json();
    assert!(
        sent["params"]["_meta"][CAPS]["elicitation"].is_object(),
        "{sent}"
    );
    assert!(
        sent["params"]["_meta"][CAPS]["extensions"][EXT].is_object(),
        "{sent}"
    );
    state
        .lock()
        .unwrap()
        .tasks
        .insert(t.clone(), "completed".into());
    let got = c.get("4", &t).await;
    assert_eq!(got["result"]["status"], "completed", "{got}");
    let res = c.result("5", &t).await;
    assert_eq!(
        res["result"]["content"][0]["text"],
        format!("done {t}"),
        "{res}"
    );

    // The 2025 transport's GET and DELETE, answered here.
    let get = Req::mcp_get(&c.url)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert_eq!(get.status(), 405);
    let del = Req::delete(&c.url)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert_eq!(del.status(), 200);
    assert!(up.requests().iter().all(|r| r.method == "POST"));
    assert!(up
        .requests()
        .iter()
        .all(|r| !r.has_header("mcp-session-id")));
    // The session is gone: taskgate does not know it any more.
    let after = c.send(rpc("6", "tools/list", "{}")).await;
    assert_eq!(after.status(), 404);
    assert_eq!(err_code(&after.json().await), -32001);
}

/// The refusal is learned once: later clients' `initialize` never reach the upstream, and each
/// gets its own session; a session id taskgate never issued is 404.
#[tokio::test]
async fn later_sessions_are_held_without_asking_initialize_again() {
    let (up, _) = pure_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut a = tg.client();
    let mut b = tg.client();
    a.initialize().await;
    b.initialize().await;
    assert_eq!(count(&up, "initialize"), 1);
    assert!(a.session.is_some() && a.session != b.session);
    let forged = tg.client().with_session("0123456789abcdef0123456789abcdef");
    let r = forged.send(rpc("1", "tools/list", "{}")).await;
    assert_eq!(r.status(), 404);
    assert_eq!(count(&up, "tools/list"), 0);
}

/// With bearer auth a held session belongs to the principal that opened it: bob gets 404 on
/// alice's session id, and nothing goes upstream.
#[tokio::test]
async fn a_held_session_is_bound_to_its_principal() {
    let (up, _) = pure_server().await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .token("bob", "tok-b")
        .start()
        .await;
    let mut alice = tg.client().with_token("tok-a");
    alice.initialize().await;
    let session = alice.session.clone().unwrap();
    let before = up.count();
    let bob = tg.client().with_token("tok-b").with_session(&session);
    let r = bob.send(rpc("1", "tools/list", "{}")).await;
    assert_eq!(r.status(), 404);
    assert_eq!(up.count(), before);
    let ok = alice.rpc(rpc("2", "tools/list", "{}")).await;
    assert!(ok.get("result").is_some(), "{ok}");
}

/// A 2026 error answer (HTTP 400) reaches the 2025 client as HTTP 200 with the JSON-RPC error;
/// a plain call to a task-only tool (`-32021`) gets the real result through `[upgrade]`.
#[tokio::test]
async fn held_answers_are_2025_answers_and_plain_calls_are_upgraded() {
    let (up, state) = pure_server().await;
    let tg = UgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let body = call_body("7", "task_only", Some(json!("pt-7")));
    let answer = {
        let c = c.clone();
        tokio::spawn(async move { call(&c, &body, &json!(7)).await })
    };
    assert!(up.wait_for_method("tasks/get", 1, STEP).await, "followed");
    let t = state.lock().unwrap().tasks.keys().next().cloned().unwrap();
    state
        .lock()
        .unwrap()
        .tasks
        .insert(t.clone(), "completed".into());
    let out = answer.await.unwrap();
    assert_eq!(
        out.answer["result"]["content"][0]["text"],
        format!("done {t}"),
        "{out:?}"
    );
    assert_eq!(tg.record(&t).unwrap().origin, Origin::Upgraded);
    let first = up.received("tools/call")[0].json();
    assert!(
        first["params"]["_meta"][CAPS].get("extensions").is_none(),
        "{first}"
    );
    // An unknown method: the upstream's 404/400 error as a 2025 answer.
    let r = c.send(rpc("8", "resources/list", "{}")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(err_code(&r.json().await), -32601);
}

/// taskgate's reserved reply headers (`x-taskgate-*`, the names its layers once used for a local
/// answer's reason and a held session's mark; now typed reply extensions) cannot come from an
/// upstream: they are removed from its replies, so an upstream neither reaches the client with
/// them nor skews `taskgate_local_answers_total`.
#[tokio::test]
async fn an_upstream_cannot_set_taskgates_internal_headers() {
    let state: Shared = Default::default();
    let modern = modern_handler(state);
    let up = Upstream::start(move |req: &RecordedRequest| {
        modern(req)
            .header("x-taskgate-local-answer", "stored_result")
            .header("x-taskgate-held-session", "1")
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let r = c.send(rpc("1", "tools/list", "{}")).await;
    assert_eq!(r.status(), 200);
    assert!(r.header("x-taskgate-local-answer").is_none());
    assert!(r.header("x-taskgate-held-session").is_none());
    let _ = r.bytes().await;
    let m = tg.metrics_text().await;
    assert!(
        m.contains(r#"taskgate_local_answers_total{reason="stored_result",upstream="default"} 0"#),
        "{}",
        m.lines()
            .filter(|l| l.contains("local_answers"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A plain client's `notifications/cancelled` for its call on a held session closes the upstream
/// request (2026-07-28: closing the stream is the cancel); nothing is forwarded as a message.
#[tokio::test]
async fn a_cancelled_plain_call_of_a_held_session_is_closed_upstream() {
    let state: Shared = Default::default();
    let pure = pure_2026(state);
    let up = Upstream::start(move |req: &RecordedRequest| {
        if req.rpc_method().as_deref() == Some("tools/call")
            && req.json()["params"]["name"] == "hang"
        {
            return ScriptedResponse::hang();
        }
        pure(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let pending = {
        let c = c.clone();
        tokio::spawn(async move { c.send(call_body("5", "hang", None)).await.bytes().await })
    };
    assert!(up.wait_for_method("tools/call", 1, STEP).await);
    assert_eq!(
        c.notify("notifications/cancelled", json!({"requestId": 5}))
            .await,
        202
    );
    assert!(
        up.wait_for_hangs_abandoned(1, STEP).await,
        "the upstream request was closed"
    );
    assert_eq!(count(&up, "notifications/cancelled"), 0);
    let _ = pending.await;
}

/// A dual-era upstream (2025 sessions and 2026 requests on one endpoint, as FastMCP 4) that
/// refuses a malformed `initialize` with `-32602` and answers `server/discover`: that client's
/// error is passed on, and taskgate never starts holding sessions for the upstream, so the next
/// good `initialize` still gets the upstream's own session (found by review: one bad
/// `initialize` switched every later session to held ones). An upstream 401 that is not a
/// JSON-RPC error is not made a 200: it is taskgate's credentials refused, a 502 (break-edge F8).
#[tokio::test]
async fn a_malformed_initialize_never_switches_a_dual_era_upstream_to_held_sessions() {
    let up = Upstream::start(|req: &RecordedRequest| {
        let id = req.rpc_id_json();
        match req.rpc_method().as_deref() {
            Some("initialize") if req.json()["params"].get("protocolVersion").is_none() => {
                ScriptedResponse::json(format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"protocolVersion is required"}}}}"#
                ))
            }
            Some("initialize") => ScriptedResponse::json(rpc_result(
                &id,
                &json!({"protocolVersion": PROTOCOL_VERSION, "capabilities": {"tools": {}},
                    "serverInfo": {"name": "dual", "version": "4"}})
                .to_string(),
            ))
            .header("mcp-session-id", "UP-SESSION-1"),
            Some("server/discover") => ScriptedResponse::json(rpc_result(
                &id,
                &json!({"resultType":"complete","supportedVersions":[MODERN, PROTOCOL_VERSION],
                    "capabilities":{"tools":{},"extensions":{EXT:{}}}})
                .to_string(),
            )),
            _ => ScriptedResponse::status(
                401,
                Some("application/json"),
                r#"{"error":"invalid_token"}"#,
            )
            .header("www-authenticate", "Bearer error=\"invalid_token\""),
        }
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    let bad = rpc(
        "\"bad\"",
        "initialize",
        &json!({"capabilities": {}}).to_string(),
    );
    let r = c.send(bad).await;
    let v = r.json().await;
    assert_eq!(
        v["error"]["code"], -32602,
        "the client's error, as it came: {v}"
    );
    for _ in 0..2 {
        let r = c.send(initialize_with(json!({}))).await;
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.header("mcp-session-id").as_deref(),
            Some("UP-SESSION-1"),
            "the upstream's own session, not one taskgate holds"
        );
    }
    c.session = Some("UP-SESSION-1".into());
    let r = c.send(rpc("3", "tools/list", "{}")).await;
    assert_eq!(
        r.status(),
        502,
        "a 401 that is no JSON-RPC answer is the upstream refusing taskgate"
    );
}

/// Issue 29 #2: on held sessions, a request that names another principal's `taskId` is refused
/// in the 2025 form and never forwarded (`tasks/update` with `inputResponses`: Bob answering
/// Alice's elicitation), `subscriptions/listen` keeps only the caller's own task ids, and a
/// declared tasks extension (or any capability the bridge does not relay) never goes upstream.
/// On f2cd7c5 Bob's `tasks/update` got HTTP 200 and reached the upstream, and his listen went
/// upstream with Alice's task id in it.
#[tokio::test]
async fn held_sessions_authorise_every_request_naming_a_task() {
    let (up, _) = pure_server().await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .token("bob", "tok-b")
        .start()
        .await;
    let greedy = json!({"elicitation": {}, "extensions": {EXT: {}}, "experimental": {"x": {}}});
    let open = |token: &'static str| {
        let (tg_url, greedy) = (tg.mcp_url(), greedy.clone());
        async move {
            let mut c = Client::new(&tg_url).with_token(token);
            let r = c.send(initialize_with(greedy)).await;
            c.session = r.header("mcp-session-id");
            assert!(c.session.is_some());
            c
        }
    };
    let alice = open("tok-a").await;
    let bob = open("tok-b").await;
    let v = alice
        .rpc(rpc(
            "1",
            "tools/call",
            &json!({"name": "slow_compute", "arguments": {}, "task": {"ttl": 60000}}).to_string(),
        ))
        .await;
    let t = v["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string();
    let update = json!({"taskId": t, "inputResponses": {"k": {"action": "accept", "content": {}}},
        "_meta": {CAPS: {"extensions": {EXT: {}}}}});
    let r = bob
        .send(rpc("2", "tasks/update", &update.to_string()))
        .await;
    assert_eq!(
        r.status(),
        200,
        "2025 clients get JSON-RPC errors with HTTP 200"
    );
    let v = r.json().await;
    assert_eq!(err_code(&v), -32602, "{v}");
    assert_eq!(
        count(&up, "tasks/update"),
        0,
        "Bob's update never went upstream"
    );

    let listen = json!({"notifications": {"taskIds": [t, "never-recorded", 5]}});
    let _ = bob
        .send(rpc("3", "subscriptions/listen", &listen.to_string()))
        .await;
    for sent in up.received("subscriptions/listen") {
        assert_eq!(
            sent.json()["params"]["notifications"]["taskIds"],
            json!([]),
            "Bob listens to none of Alice's tasks"
        );
    }
    // Alice's own update goes on; nothing the bridge does not relay is declared upstream.
    let mine = alice
        .send(rpc("4", "tasks/update", &update.to_string()))
        .await;
    assert_eq!(mine.status(), 200);
    assert_eq!(count(&up, "tasks/update"), 1);
    for sent in up.requests().iter().filter(|r| r.method == "POST") {
        let caps = &sent.json()["params"]["_meta"][CAPS];
        assert!(caps.get("experimental").is_none(), "{caps}");
        // The bridge's own task calls and taskgate's own discovery declare what taskgate serves.
        if !matches!(
            sent.rpc_method().as_deref(),
            Some("tools/call" | "server/discover")
        ) {
            assert!(
                caps.get("extensions").is_none(),
                "{:?}: {caps}",
                sent.rpc_method()
            );
        }
    }
}

/// A held session's `tools/call` whose `params.task` taskgate cannot read as `TaskMetadata`
/// (not an object; a `ttl` that is not a number of ms) is refused `-32602` naming the member,
/// and nothing goes upstream. Before, `[]` and `null` went upstream as a plain call the
/// pure-2026 upstream made a task of, and the 2025 client got a flat 2026 `CreateTaskResult`
/// (`resultType: "task"`) it cannot read; a string ttl was dropped for the upstream's default.
#[tokio::test]
async fn a_held_sessions_unreadable_params_task_is_refused() {
    let (up, _state) = pure_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    let r = c.send(initialize_with(json!({}))).await;
    c.session = r.header("mcp-session-id");
    assert_unboundable_tasks_refused(&c, "slow_compute").await;
    assert!(
        up.received("tools/call").is_empty(),
        "nothing went upstream"
    );
}

/// A held session's request (sent upstream as a stateless 2026-07-28 request) answered under
/// another id than its own is an invalid answer: the 2025 client gets HTTP 502 with `-32603`
/// under its own id naming the upstream, counted as a protocol error. On the old code the
/// answer was relayed under the foreign id, and the client never got its own (break-edge F3).
#[tokio::test]
async fn a_held_sessions_answer_under_another_id_is_an_upstream_error() {
    let pure = pure_2026(Shared::default());
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = req.json();
        if v["method"] == "tools/call" && v["params"]["name"] == "wrongid" {
            return ScriptedResponse::json(rpc_result(
                r#""not-yours""#,
                r#"{"resultType":"complete","content":[]}"#,
            ));
        }
        pure(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    assert!(
        c.session.as_deref().is_some_and(|s| s.starts_with("tgh-")),
        "a held session"
    );
    let r = c
        .send(rpc(
            "4",
            "tools/call",
            r#"{"name":"wrongid","arguments":{}}"#,
        ))
        .await;
    let status = r.status();
    let v = r.json().await;
    assert_eq!((status, err_code(&v)), (502, -32603), "{v}");
    assert_eq!(v["id"], json!(4), "{v}");
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
