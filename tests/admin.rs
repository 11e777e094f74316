//! The admin listener: `/healthz`, `/readyz` following upstream reachability, and `/metrics`
//! with the core metrics after traffic and the open SSE stream gauge.
//!
//! Every test builds the smallest setup that shows its rule and asserts what a user relies on:
//! status codes, JSON-RPC codes, the bytes/ids/headers the upstream received, and SSE events
//! arriving while the upstream still holds the stream open.

use crate::common::*;

use std::time::Duration;

// =============================================================================================
// Admin listener
// =============================================================================================

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_healthz_ok() {
    let gw = GatewayBuilder::single(&dead_url()).start().await;
    let (status, _) = admin_get(&gw, "/healthz").await;
    assert_eq!(status, 200, "process alive, even with the upstream down");
}

/// `/readyz` is 200 when every upstream is reachable and 503 when one is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_readyz_follows_upstream_reachability() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let (status, body) = admin_get(&gw, "/readyz").await;
    assert_eq!(status, 200, "upstream up: {body}");

    up.stop();
    let not_ready = eventually(Duration::from_secs(5), || async {
        let (status, _) = admin_get(&gw, "/readyz").await;
        (status == 503).then_some(())
    })
    .await;
    if not_ready.is_none() {
        let (status, body) = admin_get(&gw, "/readyz").await;
        panic!("readyz still {status} 5 s after the upstream stopped: {body}");
    }

    let up2 = Upstream::mcp().await;
    let gw2 = GatewayBuilder::new()
        .upstream("up", &up2.url())
        .upstream("down", &dead_url())
        .start()
        .await;
    let (status, body) = admin_get(&gw2, "/readyz").await;
    assert_eq!(status, 503, "one of two upstreams down: {body}");
}

/// `/readyz?upstreams=any` (a tier in front of several servers) is 200 while one upstream is up,
/// naming the one that is down, and 503 once none is; the store counts as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_readyz_upstreams_any_needs_one_upstream_up() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::new()
        .upstream("up", &up.url())
        .upstream("down", &dead_url())
        .start()
        .await;
    let (status, body) = admin_get(&gw, "/readyz?upstreams=any").await;
    assert_eq!(status, 200, "one of two upstreams up: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["ready"], true, "{body}");
    assert_eq!(v["upstreams"]["up"], "ok", "{body}");
    assert!(
        v["upstreams"]["down"]
            .as_str()
            .is_some_and(|s| s.starts_with("unreachable")),
        "the upstream that is down is named: {body}"
    );
    let (status, body) = admin_get(&gw, "/readyz?store=optional&upstreams=any").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = admin_get(&gw, "/readyz?upstreams=all").await;
    assert_eq!(status, 503, "all: one down is not ready: {body}");
    let (status, body) = admin_get(&gw, "/readyz?upstreams=some").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("some"), "{body}");

    up.stop();
    let none_up = eventually(Duration::from_secs(5), || async {
        let (status, _) = admin_get(&gw, "/readyz?upstreams=any").await;
        (status == 503).then_some(())
    })
    .await;
    if none_up.is_none() {
        let (status, body) = admin_get(&gw, "/readyz?upstreams=any").await;
        panic!("readyz?upstreams=any still {status} with no upstream up: {body}");
    }
}

/// The value of the first sample of `name` whose labels include all of `labels`. Every label
/// combination is pre-created at 0, so name enough labels to pick one series.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// After traffic, `/metrics` has the core metric names with upstream/method/kind labels and no
/// session id anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_metrics_has_core_metrics_after_traffic() {
    let up = Upstream::start(|req| match req.rpc_method().as_deref() {
        Some("tools/call") => ScriptedResponse::sse(vec![
            ev().id("m-0").data("").into(),
            ev().data(&rpc_result(&req.rpc_id_json(), "{}")).into(),
        ]),
        _ => mcp_handler(req),
    })
    .await;
    let gw = GatewayBuilder::new()
        .upstream("default", &up.url())
        .upstream("down", &dead_url())
        .start()
        .await;

    let sid = initialize(&gw, "/mcp").await;
    let r = Req::mcp_post(&gw.url("/mcp"), rpc("2", "tools/call", r#"{"name":"x"}"#))
        .header("mcp-session-id", &sid)
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    let mut s = r.sse();
    s.next_event(STEP).await;
    s.next_event(STEP).await;
    s.expect_end(STEP).await;
    let r = Req::mcp_post(&gw.url("/mcp/down"), rpc("3", "tools/list", "{}"))
        .send()
        .await;
    assert_eq!(r.status(), 502);

    let r = Req::get(&gw.admin_url("/metrics")).send().await;
    assert_eq!(r.status(), 200);
    let ct = r.header("content-type").unwrap_or_default();
    assert!(ct.starts_with("text/plain"), "content-type {ct:?}");
    let text = r.text().await;

    let calls = sample(
        &text,
        "taskgate_requests_total",
        &[
            ("upstream", "default"),
            ("method", "tools/call"),
            ("outcome", "ok"),
        ],
    );
    assert!(
        calls.unwrap_or(0.0) >= 1.0,
        "requests_total for tools/call: {calls:?}\n{text}"
    );
    let inits = sample(
        &text,
        "taskgate_requests_total",
        &[
            ("upstream", "default"),
            ("method", "initialize"),
            ("outcome", "ok"),
        ],
    );
    assert!(
        inits.unwrap_or(0.0) >= 1.0,
        "requests_total for initialize: {inits:?}\n{text}"
    );
    assert!(
        text.contains("# TYPE taskgate_request_duration_seconds histogram"),
        "duration histogram\n{text}"
    );
    assert!(
        sample(
            &text,
            "taskgate_request_duration_seconds_count",
            &[("upstream", "default"), ("method", "tools/call")]
        )
        .unwrap_or(0.0)
            >= 1.0,
        "duration samples\n{text}"
    );
    let connect = sample(
        &text,
        "taskgate_upstream_errors_total",
        &[("upstream", "down"), ("kind", "connect")],
    );
    assert!(
        connect.unwrap_or(0.0) >= 1.0,
        "upstream_errors_total connect: {connect:?}\n{text}"
    );
    let open = sample(
        &text,
        "taskgate_sse_streams_open",
        &[("upstream", "default"), ("kind", "post")],
    );
    assert_eq!(
        open,
        Some(0.0),
        "sse_streams_open after the stream ended\n{text}"
    );
    assert!(
        !text.contains(UPSTREAM_SESSION),
        "session id in metrics\n{text}"
    );
}

/// `taskgate_sse_streams_open{kind="get"}` is 1 while a GET stream is open and 0 after the
/// client left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_metrics_sse_streams_open_tracks_open_get_stream() {
    let up = Upstream::start(|req| {
        if req.method == "GET" {
            ScriptedResponse::sse(vec![
                ev().id("o-1").data(&server_note(1)).into(),
                SseStep::HoldOpen,
            ])
        } else {
            mcp_handler(req)
        }
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let gauge = |text: &str| {
        sample(
            text,
            "taskgate_sse_streams_open",
            &[("upstream", "default"), ("kind", "get")],
        )
    };

    let r = Req::mcp_get(&gw.url("/mcp"))
        .header("mcp-session-id", "s-g")
        .send()
        .await;
    let mut s = r.sse();
    s.next_event(STEP).await;
    let (_, text) = admin_get(&gw, "/metrics").await;
    assert_eq!(gauge(&text), Some(1.0), "one GET stream open\n{text}");

    drop(s);
    let closed = eventually(Duration::from_secs(5), || async {
        let (_, text) = admin_get(&gw, "/metrics").await;
        (gauge(&text) == Some(0.0)).then_some(())
    })
    .await;
    if closed.is_none() {
        let (_, text) = admin_get(&gw, "/metrics").await;
        panic!("gauge not back to 0 5 s after the client left\n{text}");
    }
}

/// break-edge F12: a negative `limit` is refused naming the range, not "must be a number"; a
/// task under an upstream that is not configured is a 404 naming the unknown upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_errors_name_the_range_and_the_unknown_upstream() {
    let gw = GatewayBuilder::single(&dead_url()).start().await;
    let (status, v) = admin_get_json(&gw, "/admin/tasks?limit=-1").await;
    assert_eq!(status, 400);
    let error = v["error"].as_str().unwrap_or_default();
    assert!(error.contains("from 0 to") && error.contains("-1"), "{v}");
    let (status, v) = admin_get_json(&gw, "/admin/tasks?limit=ten").await;
    assert_eq!(status, 400);
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("whole number"),
        "{v}"
    );

    let (status, v) = admin_get_json(&gw, "/admin/tasks/nope/x").await;
    assert_eq!(status, 404);
    let error = v["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("unknown upstream \"nope\"") && error.contains("default"),
        "{v}"
    );
    let (status, v) = admin_get_json(&gw, "/admin/tasks/default/x").await;
    assert_eq!(status, 404);
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("no task"),
        "{v}"
    );
}

async fn admin_get_json(gw: &Gateway, path: &str) -> (u16, serde_json::Value) {
    let (status, text) = admin_get(gw, path).await;
    (status, serde_json::from_str(&text).unwrap_or_default())
}
