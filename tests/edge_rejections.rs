//! What the client gets for a request the gateway will not pass on: bad JSON, batches, wrong
//! `Accept` or `Content-Type`, bodies over the limit, a `Host` or `Origin` not allowed, an
//! unreachable or slow upstream. Each is a clear HTTP status and JSON-RPC error, nothing reaches
//! the upstream that should not, and the session keeps working.
//!
//! Every test builds the smallest setup that shows its rule and asserts what a user relies on:
//! status codes, JSON-RPC codes, the bytes/ids/headers the upstream received, and SSE events
//! arriving while the upstream still holds the stream open.

use crate::common::*;

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};

// =============================================================================================
// Bad input: a clear error, nothing else disturbed
// =============================================================================================

async fn error_body(r: Resp) -> Value {
    let ct = r.header("content-type").unwrap_or_default();
    assert!(
        ct.starts_with("application/json"),
        "error content-type {ct:?}"
    );
    let v = r.json().await;
    assert_eq!(v["jsonrpc"], json!("2.0"), "{v}");
    v
}

/// Invalid JSON: 400 with JSON-RPC -32700 (id null); the upstream sees nothing; the session
/// keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_is_400_parse_error() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let sid = initialize(&gw, "/mcp").await;
    let before = up.count();

    let r = Req::mcp_post(&gw.url("/mcp"), r#"{"jsonrpc":"2.0","id":1,"method":"#)
        .header("mcp-session-id", &sid)
        .send()
        .await;

    assert_eq!(r.status(), 400);
    let v = error_body(r).await;
    assert_eq!(v["error"]["code"], json!(-32700), "{v}");
    assert_eq!(v["id"], Value::Null, "{v}");
    assert_eq!(up.count(), before, "nothing forwarded");
    assert_session_works(&gw, &up, &sid).await;
}

/// A JSON array (batch): 400 with -32600, nothing forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_array_is_400_invalid_request() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let sid = initialize(&gw, "/mcp").await;
    let before = up.count();
    let batch = format!(
        "[{},{}]",
        rpc("1", "ping", "{}"),
        rpc("2", "tools/list", "{}")
    );

    let r = Req::mcp_post(&gw.url("/mcp"), batch)
        .header("mcp-session-id", &sid)
        .send()
        .await;

    assert_eq!(r.status(), 400);
    let v = error_body(r).await;
    assert_eq!(v["error"]["code"], json!(-32600), "{v}");
    assert_eq!(up.count(), before, "nothing forwarded");
    assert_session_works(&gw, &up, &sid).await;
}

/// POST whose `Accept` does not list both types: 406, nothing forwarded. A type listed with
/// `q=0` is "not acceptable" (RFC 9110 §12.5.1): not listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_without_accept_both_is_406() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let sid = initialize(&gw, "/mcp").await;
    let before = up.count();

    for accept in [
        None,
        Some("application/json"),
        Some("text/event-stream"),
        Some("application/json;q=0, text/event-stream"),
        Some("application/json, text/event-stream;q=0"),
    ] {
        let mut req = Req::post_raw(&gw.url("/mcp"), rpc("1", "ping", "{}"))
            .header("content-type", "application/json")
            .header("mcp-session-id", &sid);
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let r = req.send().await;
        assert_eq!(r.status(), 406, "Accept {accept:?}");
    }
    assert_eq!(up.count(), before, "nothing forwarded");
    assert_session_works(&gw, &up, &sid).await;
}

/// POST with a `Content-Type` other than JSON: 415, nothing forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_with_wrong_content_type_is_415() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let sid = initialize(&gw, "/mcp").await;
    let before = up.count();

    for ct in ["text/plain", "application/x-www-form-urlencoded"] {
        let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
            .without("content-type")
            .header("content-type", ct)
            .header("mcp-session-id", &sid)
            .send()
            .await;
        assert_eq!(r.status(), 415, "Content-Type {ct}");
    }
    assert_eq!(up.count(), before, "nothing forwarded");
    assert_session_works(&gw, &up, &sid).await;
}

/// `max_body_bytes`: a body of exactly the limit passes, one byte more is 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_configured_limit_is_413() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url())
        .gateway_opt("max_body_bytes = 1024")
        .start()
        .await;
    let sid = initialize(&gw, "/mcp").await;

    let before = up.count();
    let r = Req::mcp_post(&gw.url("/mcp"), body_of_len(1025))
        .header("mcp-session-id", &sid)
        .send()
        .await;
    assert_eq!(r.status(), 413);
    assert_eq!(up.count(), before, "nothing forwarded");

    let r = Req::mcp_post(&gw.url("/mcp"), body_of_len(1024))
        .header("mcp-session-id", &sid)
        .send()
        .await;
    assert_eq!(r.status(), 200, "a body of exactly the limit passes");
    assert_eq!(up.last().body.len(), 1024);
    assert_session_works(&gw, &up, &sid).await;
}

/// The limit also holds for a chunked body with no Content-Length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_over_limit_is_413() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url())
        .gateway_opt("max_body_bytes = 1024")
        .start()
        .await;
    let sid = initialize(&gw, "/mcp").await;
    let before = up.count();

    let body = Bytes::from(body_of_len(2000));
    let chunks = vec![
        body.slice(0..500),
        body.slice(500..1000),
        body.slice(1000..1500),
        body.slice(1500..),
    ];
    let r = Req::mcp_post(&gw.url("/mcp"), Bytes::new())
        .header("mcp-session-id", &sid)
        .chunked(chunks)
        .send()
        .await;

    assert_eq!(r.status(), 413);
    assert_eq!(up.count(), before, "nothing forwarded");
    assert_session_works(&gw, &up, &sid).await;
}

/// A chunked body under the limit, in several chunks, reaches the upstream whole and in order
/// (a body of one frame is passed on as that frame; more frames are joined).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_under_limit_is_forwarded_whole() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url())
        .gateway_opt("max_body_bytes = 1024")
        .start()
        .await;
    let sid = initialize(&gw, "/mcp").await;
    for pieces in [1usize, 2, 3, 7] {
        let body = Bytes::from(body_of_len(1000));
        let step = body.len().div_ceil(pieces);
        let chunks: Vec<Bytes> = (0..body.len())
            .step_by(step)
            .map(|at| body.slice(at..(at + step).min(body.len())))
            .collect();
        let r = Req::mcp_post(&gw.url("/mcp"), Bytes::new())
            .header("mcp-session-id", &sid)
            .chunked(chunks)
            .send()
            .await;
        assert_eq!(r.status(), 200, "{pieces} chunks");
        assert_eq!(up.last().body, body, "{pieces} chunks: the body as sent");
    }
}

/// The default limit is 4 MiB: 4 MiB passes, 4 MiB + 1 is 413. The client must actually get the
/// 413 (not a reset connection while it is still sending the body), every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_body_limit_is_4_mib() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    const MIB4: usize = 4 * 1024 * 1024;

    let over = Bytes::from(body_of_len(MIB4 + 1));
    for attempt in 1..=5 {
        let r = Req::mcp_post(&gw.url("/mcp"), over.clone())
            .try_send()
            .await
            .unwrap_or_else(|e| panic!("attempt {attempt}: no 413 for a 4 MiB + 1 body: {e}"));
        assert_eq!(r.status(), 413, "attempt {attempt}");
    }
    assert_eq!(up.count(), 0);

    let r = Req::mcp_post(&gw.url("/mcp"), body_of_len(MIB4))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(up.last().body.len(), MIB4);
}

/// Upstream unreachable: 502 with a JSON-RPC error for the request's id naming the upstream;
/// other upstreams and sessions are not disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_unreachable_is_502_naming_upstream() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::new()
        .upstream("live", &up.url())
        .upstream("deadone", &dead_url())
        .upstream_opt("connect_timeout_ms = 1000")
        .start()
        .await;
    let sid = initialize(&gw, "/mcp").await;

    for _ in 0..2 {
        let r = Req::mcp_post(
            &gw.url("/mcp/deadone"),
            rpc("7", "tools/call", r#"{"name":"x"}"#),
        )
        .header("mcp-session-id", &sid)
        .send()
        .await;
        assert_eq!(r.status(), 502);
        let v = error_body(r).await;
        assert_eq!(v["id"], json!(7), "error answers the request's id: {v}");
        assert!(v["error"]["code"].is_i64(), "{v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("deadone"),
            "message names the upstream: {msg:?}"
        );
    }
    assert_session_works(&gw, &up, &sid).await;
}

/// Upstream timeout: 504 after `timeout_ms` with a JSON-RPC error for the request's id naming the
/// upstream; the next request on the same session works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_timeout_is_504_naming_upstream() {
    let up = Upstream::start(|req| {
        if req.rpc_method().as_deref() == Some("tools/call") {
            ScriptedResponse::hang()
        } else {
            mcp_handler(req)
        }
    })
    .await;
    let gw = GatewayBuilder::new()
        .upstream("slowone", &up.url())
        .upstream_opt("timeout_ms = 300")
        .start()
        .await;
    let sid = initialize(&gw, "/mcp").await;

    let started = Instant::now();
    let r = Req::mcp_post(
        &gw.url("/mcp"),
        rpc("\"t-1\"", "tools/call", r#"{"name":"x"}"#),
    )
    .header("mcp-session-id", &sid)
    .send()
    .await;
    let took = started.elapsed();
    assert_eq!(r.status(), 504);
    assert!(
        took >= Duration::from_millis(250),
        "answered after {took:?}, before the timeout"
    );
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    let v = error_body(r).await;
    assert_eq!(v["id"], json!("t-1"), "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("slowone"),
        "message names the upstream: {msg:?}"
    );
    assert_session_works(&gw, &up, &sid).await;
}

/// One allow-list check (`Host` or `Origin`): `config` set in `[gateway]`, values refused and
/// values let through, given the gateway's port.
struct AllowList {
    header: &'static str,
    config: &'static str,
    refused: fn(u16) -> Vec<String>,
    allowed: fn(u16) -> Vec<String>,
}

/// Every refused value is 403 on POST (with a valid session) and the first one on GET; nothing
/// is forwarded; every allowed value is 200; the session keeps working.
async fn assert_allow_list(check: AllowList) {
    let h = check.header;
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url())
        .gateway_opt(check.config)
        .start()
        .await;
    let sid = initialize(&gw, "/mcp").await;
    let port = gw.addr.port();
    let before = up.count();

    let refused = (check.refused)(port);
    for value in &refused {
        let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
            .header(h, value)
            .header("mcp-session-id", &sid)
            .send()
            .await;
        assert_eq!(r.status(), 403, "{h}: {value}");
    }
    let r = Req::mcp_get(&gw.url("/mcp"))
        .header(h, &refused[0])
        .send()
        .await;
    assert_eq!(r.status(), 403, "GET with {h}: {}", refused[0]);
    assert_eq!(up.count(), before, "nothing forwarded");

    for value in (check.allowed)(port) {
        let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
            .header(h, &value)
            .send()
            .await;
        assert_eq!(r.status(), 200, "{h}: {value} is allowed");
    }
    assert_session_works(&gw, &up, &sid).await;
}

/// `Host` not in the allow-list: 403 (DNS rebinding); listen address, localhost, 127.0.0.1 and
/// configured `allowed_hosts` pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_not_allowed_is_403() {
    assert_allow_list(AllowList {
        header: "host",
        config: r#"allowed_hosts = ["gw.internal"]"#,
        refused: |port| vec!["evil.example".into(), format!("evil.example:{port}")],
        allowed: |port| {
            vec![
                format!("localhost:{port}"),
                format!("127.0.0.1:{port}"),
                "gw.internal".into(),
            ]
        },
    })
    .await;
}

/// The Host check comes before everything else: a request with a bad `Host` to an unknown
/// upstream name gets 403, not the 404 that lists the upstream names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_check_comes_before_routing() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::new()
        .upstream("internal-name", &up.url())
        .start()
        .await;

    let r = Req::mcp_post(&gw.url("/mcp/nope"), rpc("1", "ping", "{}"))
        .header("host", "evil.example")
        .send()
        .await;
    let status = r.status();
    let text = r.text().await;
    assert_eq!(status, 403, "body: {text}");
    assert!(
        !text.contains("internal-name"),
        "upstream names leaked: {text}"
    );

    let r = Req::mcp_post(&gw.url("/mcp/nope"), rpc("1", "ping", "{}"))
        .header("origin", "http://evil.example")
        .send()
        .await;
    assert_eq!(r.status(), 403, "bad Origin on an unknown name");
}

/// Two `Origin` or two `Authorization` fields: 400 naming the field, nothing forwarded. The
/// checks read the first one, an upstream or a proxy may read the other: on the old code an
/// allowed Origin before an evil one passed, and of two bearer tokens the first one's
/// principal was taken (break-edge F9).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_origin_or_authorization_is_400() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::new().upstream("u", &up.url()).start().await;
    for (name, first, second) in [
        ("origin", "http://localhost", "http://evil.example"),
        ("authorization", "Bearer one", "Bearer two"),
    ] {
        let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
            .header(name, first)
            .header(name, second)
            .send()
            .await;
        let status = r.status();
        let text = r.text().await;
        assert_eq!(status, 400, "{name}: {text}");
        assert!(
            text.to_ascii_lowercase()
                .contains(&format!("one {name} header")),
            "{text}"
        );
    }
    assert!(up.received("ping").is_empty(), "nothing was forwarded");
}

/// `Origin` not in the allow-list: 403; no Origin, localhost/127.0.0.1 origins and configured
/// `allowed_origins` pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_not_allowed_is_403() {
    assert_allow_list(AllowList {
        header: "origin",
        config: r#"allowed_origins = ["https://app.example"]"#,
        refused: |_| {
            vec![
                "http://evil.example".into(),
                "https://app.example.evil".into(),
            ]
        },
        allowed: |port| {
            vec![
                format!("http://localhost:{port}"),
                format!("http://127.0.0.1:{port}"),
                "https://app.example".into(),
            ]
        },
    })
    .await;
}

/// Issue 29 item 13: a body with a key twice in one object (`params.taskId`, `params.task`, or
/// any other, at any depth) is refused with 400 `-32600` naming the key, before anything acts
/// on it: taskgate (serde_json keeps the last member) and the upstream (many parsers keep the
/// first) could otherwise read different values. Nothing is forwarded; the session keeps
/// working. The same key in two different objects is no duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_keys_are_400_invalid_request_and_not_forwarded() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let sid = initialize(&gw, "/mcp").await;
    let before = up.count();
    for (body, names) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"mine","taskId":"yours"}}"#,
            r#""taskId" in /params"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t","task":{"ttl":60000},"arguments":{},"task":{"ttl":1}}}"#,
            r#""task" in /params"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a","arguments":{"x":1},"name":"b"}}"#,
            r#""name" in /params"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"tasks/cancel","params":{"t\u0061skId":"a","taskId":"b"}}"#,
            r#""taskId" in /params"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{},"params":{"cursor":"x"}}"#,
            r#""params" in the message"#,
        ),
    ] {
        let r = Req::mcp_post(&gw.url("/mcp"), body)
            .header("mcp-session-id", &sid)
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .send()
            .await;
        assert_eq!(r.status(), 400, "{body}");
        let v = error_body(r).await;
        assert_eq!(v["error"]["code"], json!(-32600), "{body}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("duplicate key {names}")),
            "{message}"
        );
    }
    assert_eq!(up.count(), before, "nothing forwarded");
    let r = Req::mcp_post(
        &gw.url("/mcp"),
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"t","arguments":{"name":"x","task":1},"_meta":{"name":"y"}}}"#,
    )
    .header("mcp-session-id", &sid)
    .header("mcp-protocol-version", PROTOCOL_VERSION)
    .send()
    .await;
    assert_eq!(r.status(), 200, "the same key in different objects passes");
    assert_session_works(&gw, &up, &sid).await;
}

/// break-edge F12: a message refused after its JSON was read (a duplicate key, a `method` that
/// is not a string, no `jsonrpc`) is answered under its id (JSON-RPC 2.0 section 5: `null`
/// only when the id could not be read); an id that is no id, or is sent twice, gets `null`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_message_is_answered_under_its_id_when_it_was_read() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let before = up.count();
    for (body, id) in [
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"tasks/get","params":{"taskId":"a","taskId":"b"}}"#,
            json!(7),
        ),
        (r#"{"jsonrpc":"2.0","id":"s-8","method":5}"#, json!("s-8")),
        (r#"{"id":9,"method":"ping"}"#, json!(9)),
        (
            r#"{"jsonrpc":"2.0","id":10,"method":"ping","result":{}}"#,
            json!(10),
        ),
        (r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#, json!(null)),
        (
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#,
            json!(null),
        ),
    ] {
        let r = Req::mcp_post(&gw.url("/mcp"), body).send().await;
        assert_eq!(r.status(), 400, "{body}");
        let v = error_body(r).await;
        assert_eq!(v["error"]["code"], json!(-32600), "{body}: {v}");
        assert_eq!(v["id"], id, "{body}: {v}");
    }
    assert_eq!(up.count(), before, "nothing was forwarded");
}

/// break-edge F12: an id past 64 bits is said to be out of range (it is an integer); a body
/// with a `Content-Encoding` other than identity is 415 "Content-Encoding not supported"
/// (before: parsed as it was, or forwarded with the header); a body starting with a UTF-8 BOM
/// is a parse error naming the BOM. Nothing reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_ids_encoded_bodies_and_a_bom_are_refused_saying_why() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let before = up.count();

    let r = Req::mcp_post(
        &gw.url("/mcp"),
        r#"{"jsonrpc":"2.0","id":18446744073709551616,"method":"ping"}"#,
    )
    .send()
    .await;
    assert_eq!(r.status(), 400);
    let v = error_body(r).await;
    assert_eq!(v["error"]["code"], json!(-32600), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("out of range"),
        "{v}"
    );
    // `-0` is no integer out of range: serde_json reads it as a float (cold tester, session 25).
    let r = Req::mcp_post(
        &gw.url("/mcp"),
        r#"{"jsonrpc":"2.0","id":-0,"method":"ping"}"#,
    )
    .send()
    .await;
    assert_eq!(r.status(), 400);
    let v = error_body(r).await;
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("send 0") && !message.contains("out of range"),
        "{v}"
    );

    for coding in ["gzip", "br, identity"] {
        let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
            .header("content-encoding", coding)
            .send()
            .await;
        assert_eq!(r.status(), 415, "{coding}");
        let text = r.text().await;
        assert!(
            text.contains("Content-Encoding not supported"),
            "{coding}: {text}"
        );
    }

    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend_from_slice(rpc("2", "ping", "{}").as_bytes());
    let r = Req::mcp_post(&gw.url("/mcp"), Bytes::from(bom))
        .send()
        .await;
    assert_eq!(r.status(), 400);
    let v = error_body(r).await;
    assert_eq!(v["error"]["code"], json!(-32700), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("byte order mark"),
        "{v}"
    );
    assert_eq!(up.count(), before, "nothing was forwarded");

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("3", "ping", "{}"))
        .header("content-encoding", "identity")
        .header("mcp-session-id", "s")
        .send()
        .await;
    assert_eq!(r.status(), 200, "identity is no coding");
}

/// Review 18b: the Content-Encoding 415 reads only the first field (`HeadFields`'
/// `get_or_insert`): `Content-Encoding: identity` then `Content-Encoding: gzip` passes, and
/// both fields are forwarded, so the upstream is told the (plain) body is gzip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_content_encoding_field_is_refused_too() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let before = up.count();
    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
        .header("content-encoding", "identity")
        .header("content-encoding", "gzip")
        .send()
        .await;
    let status = r.status();
    let forwarded: Vec<String> = up
        .requests()
        .iter()
        .skip(before)
        .flat_map(|q| {
            q.headers
                .iter()
                .filter(|(n, _)| n == "content-encoding")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        status, 415,
        "a gzip coding in a second field; the upstream was sent content-encoding {forwarded:?}"
    );
}
