//! Routing by path: `/mcp` goes to the first upstream, `/mcp/NAME` to the named one for POST, GET
//! and DELETE, and an unknown name is 404 listing the names.
//!
//! Every test builds the smallest setup that shows its rule and asserts what a user relies on:
//! status codes, JSON-RPC codes, the bytes/ids/headers the upstream received, and SSE events
//! arriving while the upstream still holds the stream open.

use crate::common::*;

use serde_json::{json, Value};

// =============================================================================================
// Routing
// =============================================================================================

async fn named(name: &'static str) -> Upstream {
    Upstream::start(move |req| match req.method.as_str() {
        "GET" => ScriptedResponse::sse(vec![ev().data(&format!("\"{name}\"")).into()]),
        "DELETE" => ScriptedResponse::status(200, None, ""),
        _ => ScriptedResponse::result_for(req, &format!(r#"{{"from":"{name}"}}"#)),
    })
    .await
}

/// `/mcp` goes to the first configured upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_bare_mcp_goes_to_first_upstream() {
    let alpha = named("alpha").await;
    let beta = named("beta").await;
    let gw = GatewayBuilder::new()
        .upstream("alpha", &alpha.url_path("/a/mcp"))
        .upstream("beta", &beta.url_path("/b/mcp"))
        .start()
        .await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
        .send()
        .await;

    assert_eq!(r.status(), 200);
    assert_eq!(r.json().await["result"]["from"], json!("alpha"));
    assert_eq!((alpha.count(), beta.count()), (1, 0));
    assert_eq!(alpha.last().path, "/a/mcp");
}

/// `/mcp/<name>` goes to that upstream for POST, GET and DELETE, on the upstream's own path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_named_upstream_for_post_get_delete() {
    let alpha = named("alpha").await;
    let beta = named("beta").await;
    let gw = GatewayBuilder::new()
        .upstream("alpha", &alpha.url_path("/a/mcp"))
        .upstream("beta", &beta.url_path("/b/mcp"))
        .start()
        .await;

    let r = Req::mcp_post(&gw.url("/mcp/beta"), rpc("1", "ping", "{}"))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json().await["result"]["from"], json!("beta"));

    let r = Req::mcp_get(&gw.url("/mcp/beta"))
        .header("mcp-session-id", "s")
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let mut s = r.sse();
    assert_eq!(s.next_event(STEP).await.data().as_deref(), Some("\"beta\""));

    let r = Req::delete(&gw.url("/mcp/beta"))
        .header("mcp-session-id", "s")
        .send()
        .await;
    assert_eq!(r.status(), 200);

    assert_eq!(alpha.count(), 0, "alpha got {:?}", alpha.requests());
    let methods: Vec<String> = beta.requests().iter().map(|r| r.method.clone()).collect();
    assert_eq!(methods, ["POST", "GET", "DELETE"]);
    assert!(beta.requests().iter().all(|r| r.path == "/b/mcp"));

    let r = Req::mcp_post(&gw.url("/mcp/alpha"), rpc("2", "ping", "{}"))
        .send()
        .await;
    assert_eq!(r.json().await["result"]["from"], json!("alpha"));
    assert_eq!(alpha.count(), 1);
}

/// An unknown name gets 404 with a JSON body that lists the names that exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_unknown_name_404_lists_names() {
    let alpha = named("alpha").await;
    let beta = named("beta").await;
    let gw = GatewayBuilder::new()
        .upstream("alpha", &alpha.url())
        .upstream("beta", &beta.url())
        .start()
        .await;

    let r = Req::mcp_post(&gw.url("/mcp/nope"), rpc("1", "ping", "{}"))
        .send()
        .await;
    assert_eq!(r.status(), 404);
    let ct = r.header("content-type").unwrap_or_default();
    assert!(ct.starts_with("application/json"), "content-type {ct:?}");
    let text = r.text().await;
    let _: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    assert!(
        text.contains("alpha") && text.contains("beta"),
        "names listed: {text}"
    );

    let r = Req::mcp_get(&gw.url("/mcp/nope")).send().await;
    assert_eq!(r.status(), 404);
    assert_eq!(alpha.count() + beta.count(), 0);
}
