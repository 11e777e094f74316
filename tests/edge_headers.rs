//! Headers across the gateway: `Mcp-Session-Id` and `Mcp-Protocol-Version` both ways, `Accept`
//! and `Content-Type` exactly, hop-by-hop headers dropped, the upstream's own `Host`, the client's
//! `Authorization` only when configured, and configured headers with `${VAR}` expansion.
//!
//! Every test builds the smallest setup that shows its rule and asserts what a user relies on:
//! status codes, JSON-RPC codes, the bytes/ids/headers the upstream received, and SSE events
//! arriving while the upstream still holds the stream open.

use crate::common::*;

use serde_json::json;

// =============================================================================================
// Headers
// =============================================================================================

/// The upstream's `Mcp-Session-Id` reaches the client unchanged, and the client's reaches the
/// upstream unchanged; initialize goes out without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_session_id_passes_both_ways() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let sid = initialize(&gw, "/mcp").await;
    assert_eq!(sid, UPSTREAM_SESSION);
    assert!(
        !up.last().has_header("mcp-session-id"),
        "initialize carries no session id"
    );

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("2", "tools/list", "{}"))
        .header("mcp-session-id", &sid)
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        up.last().header_all("mcp-session-id"),
        vec![UPSTREAM_SESSION.to_string()]
    );
}

/// `Mcp-Session-Id` set on an SSE answer to initialize reaches the client too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_session_id_on_sse_initialize_answer() {
    let up = Upstream::start(|req| {
        ScriptedResponse::sse(vec![ev()
            .event("message")
            .data(&rpc_result(&req.rpc_id_json(), r#"{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"s","version":"1"}}"#))
            .into()])
        .header("mcp-session-id", "sse-sess-42")
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), initialize_body("1"))
        .send()
        .await;

    assert_eq!(r.status(), 200);
    assert_eq!(
        r.header_all("mcp-session-id"),
        vec!["sse-sess-42".to_string()]
    );
    let mut s = r.sse();
    assert_eq!(s.next_event(STEP).await.json()["id"], json!(1));
    s.expect_end(STEP).await;
}

/// `MCP-Protocol-Version` is forwarded as sent, and not invented when the client sent none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_protocol_version_forwarded() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        up.last().header_all("mcp-protocol-version"),
        vec!["2025-06-18".to_string()]
    );

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("2", "ping", "{}"))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert!(
        !up.last().has_header("mcp-protocol-version"),
        "no version invented"
    );
}

/// `Accept` and `Content-Type` reach the upstream as sent; the answer's `Content-Type` reaches
/// the client as the upstream sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_and_content_type_forwarded_exactly() {
    let up = Upstream::start(|req| {
        ScriptedResponse::result_for(req, "{}")
            .set_header("content-type", "application/json; charset=utf-8")
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json; charset=utf-8")
    );
    let seen = up.last();
    assert_eq!(seen.header_all("accept"), vec![ACCEPT_BOTH.to_string()]);
    assert_eq!(
        seen.header_all("content-type"),
        vec!["application/json".to_string()]
    );
}

/// Media-type parameters (q-values, charset) are fine: both types listed is what counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_with_q_values_and_content_type_with_charset_accepted() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let accept = "text/event-stream;q=0.9, application/json";
    let ct = "application/json; charset=utf-8";

    let r = Req::post_raw(&gw.url("/mcp"), rpc("1", "ping", "{}"))
        .header("accept", accept)
        .header("content-type", ct)
        .send()
        .await;

    assert_eq!(r.status(), 200);
    assert_eq!(up.last().header("accept").as_deref(), Some(accept));
    assert_eq!(up.last().header("content-type").as_deref(), Some(ct));
}

/// Hop-by-hop headers (RFC 9110 7.6.1: Connection and the headers it names, Keep-Alive, TE,
/// Proxy-Authorization) are dropped in both directions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_dropped_both_ways() {
    let up = Upstream::start(|req| {
        ScriptedResponse::result_for(req, "{}")
            .header("connection", "x-up-hop")
            .header("x-up-hop", "1")
            .header("keep-alive", "timeout=7")
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
        .header("connection", "x-hop-a")
        .header("x-hop-a", "1")
        .header("keep-alive", "timeout=5")
        .header("te", "trailers")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .send()
        .await;

    assert_eq!(r.status(), 200);
    let seen = up.last();
    for h in ["x-hop-a", "keep-alive", "te", "proxy-authorization"] {
        assert!(
            !seen.has_header(h),
            "upstream got hop-by-hop {h}: {:?}",
            seen.header_names()
        );
    }
    for v in seen.header_all("connection") {
        assert!(
            !v.to_ascii_lowercase().contains("x-hop-a"),
            "connection forwarded: {v}"
        );
    }
    for h in ["x-up-hop", "keep-alive"] {
        assert!(
            r.header(h).is_none(),
            "client got hop-by-hop {h}: {:?}",
            r.headers
        );
    }
    for v in r.header_all("connection") {
        assert!(
            !v.to_ascii_lowercase().contains("x-up-hop"),
            "connection passed back: {v}"
        );
    }
}

/// The `Host` the upstream sees is its own authority, not the gateway's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_sent_upstream_is_upstream_authority() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
        .header("host", &format!("localhost:{}", gw.addr.port()))
        .send()
        .await;

    assert_eq!(r.status(), 200);
    assert_eq!(up.last().header_all("host"), vec![up.authority()]);
}

/// The client's `Authorization` is not forwarded by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_authorization_not_forwarded_by_default() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
        .header("authorization", "Bearer client-secret")
        .send()
        .await;

    assert_eq!(r.status(), 200);
    assert!(
        !up.last().has_header("authorization"),
        "{:?}",
        up.last().header_names()
    );
}

/// With `forward_authorization = true` the client's `Authorization` reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_authorization_forwarded_when_configured() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url())
        .upstream_opt("forward_authorization = true")
        .start()
        .await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
        .header("authorization", "Bearer client-secret")
        .send()
        .await;

    assert_eq!(r.status(), 200);
    assert_eq!(
        up.last().header_all("authorization"),
        vec!["Bearer client-secret".to_string()]
    );
}

/// Configured upstream headers are added with `${VAR}` expanded from the environment; the client's
/// own `Authorization` does not replace the configured one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_headers_added_with_env_expansion() {
    let token_var = format!("TASKGATE_IT_TOKEN_{}", std::process::id());
    let tenant_var = format!("TASKGATE_IT_TENANT_{}", std::process::id());
    std::env::set_var(&token_var, "tok-123");
    std::env::set_var(&tenant_var, "acme");
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url())
        .upstream_opt(&format!(
            "headers = {{ Authorization = \"Bearer ${{{token_var}}}\", X-Tenant = \"t-${{{tenant_var}}}-end\" }}"
        ))
        .start()
        .await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
        .header("authorization", "Bearer client-secret")
        .send()
        .await;

    assert_eq!(r.status(), 200);
    let seen = up.last();
    assert_eq!(
        seen.header_all("authorization"),
        vec!["Bearer tok-123".to_string()]
    );
    assert_eq!(seen.header_all("x-tenant"), vec!["t-acme-end".to_string()]);
}

/// A `${VAR}` that is not set is a start-up error naming the variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_header_with_missing_env_var_is_start_error() {
    let var = format!("TASKGATE_IT_SURELY_UNSET_{}", std::process::id());
    std::env::remove_var(&var);
    let up = Upstream::mcp().await;
    let result = GatewayBuilder::single(&up.url())
        .upstream_opt(&format!(
            "headers = {{ Authorization = \"Bearer ${{{var}}}\" }}"
        ))
        .try_start()
        .await;
    match result {
        Ok(_) => panic!("taskgate started although ${{{var}}} is not set"),
        Err(e) => assert!(e.contains(&var), "error must name the variable: {e}"),
    }
    assert_eq!(up.count(), 0);
}

// =============================================================================================
// Malformed Mcp-Session-Id and unsupported MCP-Protocol-Version (issue 29 item 11)
// =============================================================================================

/// The JSON-RPC error of a 400 answer.
async fn bad_request(r: Resp, what: &str) -> serde_json::Value {
    bad_request_answer(r, what).await["error"].clone()
}

/// The whole JSON-RPC answer of a 400.
async fn bad_request_answer(r: Resp, what: &str) -> serde_json::Value {
    assert_eq!(r.status(), 400, "{what}");
    let v = r.json().await;
    assert_eq!(v["jsonrpc"], json!("2.0"), "{what}: {v}");
    v
}

/// An `Mcp-Session-Id` that is empty, not visible ASCII, a comma-separated list, or sent on
/// two header lines is answered 400 `-32600` saying what is wrong, on POST, GET and DELETE,
/// and nothing reaches the upstream (before, each was forwarded: the upstream saw a list or
/// two values, or an id taskgate never checked); the session keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_session_ids_get_400_and_are_never_forwarded() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let sid = initialize(&gw, "/mcp").await;
    let before = up.count();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![String::new()], "Mcp-Session-Id is empty"),
        (vec!["a b".into()], "visible ASCII"),
        (vec!["a\tb".into()], "visible ASCII"),
        (vec![format!("{sid},other")], "comma-separated list"),
        (vec![format!("{sid}, {sid}")], "comma-separated list"),
        (vec![sid.clone(), "other".into()], "sent on 2 header lines"),
        (vec![sid.clone(), sid.clone()], "sent on 2 header lines"),
    ];
    for (values, words) in &cases {
        for method in ["POST", "GET", "DELETE"] {
            let mut req = match method {
                "POST" => Req::mcp_post(&gw.url("/mcp"), rpc("1", "tools/list", "{}")),
                "GET" => Req::mcp_get(&gw.url("/mcp")),
                _ => Req::delete(&gw.url("/mcp")),
            };
            for v in values {
                req = req.header("mcp-session-id", v);
            }
            let what = format!("{method} with {values:?}");
            let err = bad_request(req.send().await, &what).await;
            assert_eq!(err["code"], json!(-32600), "{what}: {err}");
            let message = err["message"].as_str().unwrap_or_default();
            assert!(message.contains(words), "{what}: {message}");
        }
    }
    assert_eq!(
        up.count(),
        before,
        "nothing forwarded: {:?}",
        up.requests().last().map(|r| r.header_all("mcp-session-id"))
    );
    assert_session_works(&gw, &up, &sid).await;
}

/// An `MCP-Protocol-Version` taskgate does not serve is answered 400 and not forwarded (before,
/// `2099-01-01` was taken for a 2026-era request and forwarded): a 2026-era date gets `-32022`
/// with `data: {supported, requested}` (`supported`: the 2026-era revisions), as does any
/// other text but a 2025-era date (conformance sends `v999.0.0`); a 2025-era date, an empty or
/// non-text value `-32600` naming the revisions served; two header lines are refused too; a POST's answer
/// carries its request's id. The served revisions pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_protocol_version_gets_400_and_is_never_forwarded() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let sid = initialize(&gw, "/mcp").await;
    let before = up.count();
    for (versions, code) in [
        (&["2099-01-01"][..], -32022),
        (&["2026-07-29"], -32022),
        (&["2025-01-01"], -32600),
        (&["latest"], -32022),
        (&["v999.0.0"], -32022),
        (&[""], -32600),
        (&["2025-11-25", "2025-06-18"], -32600),
    ] {
        for method in ["POST", "GET"] {
            let mut req = match method {
                "POST" => Req::mcp_post(&gw.url("/mcp"), rpc("1", "tools/list", "{}")),
                _ => Req::mcp_get(&gw.url("/mcp")),
            };
            req = req.header("mcp-session-id", &sid);
            for v in versions {
                req = req.header("mcp-protocol-version", v);
            }
            let what = format!("{method} with {versions:?}");
            let answer = bad_request_answer(req.send().await, &what).await;
            // A POST's refusal answers its request (2026-07-28 §2.2; on 75a9bff..49d7765: null).
            let id = if method == "POST" {
                json!(1)
            } else {
                json!(null)
            };
            assert_eq!(answer["id"], id, "{what}: {answer}");
            let err = &answer["error"];
            assert_eq!(err["code"], json!(code), "{what}: {err}");
            if code == -32022 {
                assert_eq!(err["data"]["requested"], json!(versions[0]), "{err}");
                // The 2026-era revisions: each is one the route's server/discover lists
                // (conformance sep-2575-server-unsupported-version-error).
                assert_eq!(err["data"]["supported"], json!(["2026-07-28"]), "{err}");
            } else if versions.len() == 1 {
                let message = err["message"].as_str().unwrap_or_default();
                assert!(message.contains("2025-11-25"), "{message}");
            }
        }
    }
    assert_eq!(up.count(), before, "nothing forwarded");
    for version in ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"] {
        let r = Req::mcp_post(&gw.url("/mcp"), rpc("2", "tools/list", "{}"))
            .header("mcp-session-id", &sid)
            .header("mcp-protocol-version", version)
            .send()
            .await;
        assert_eq!(r.status(), 200, "{version}");
    }
}
