//! Gateway core (issue 2): transparent Streamable HTTP pass-through, bad input, routing, admin
//! endpoints and the CLI, each rule shown against a scripted upstream (tests/support).
//!
//! Every test builds the smallest setup that shows its rule and asserts what a user relies on:
//! status codes, JSON-RPC codes, the bytes/ids/headers the upstream received, and SSE events
//! arriving while the upstream still holds the stream open.

mod common;

use common::*;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use bytes::Bytes;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use serde_json::{json, Value};

/// How long a stream must stay quiet to count as "still open, nothing more yet".
const QUIET: Duration = Duration::from_millis(400);

// =============================================================================================
// Streamable HTTP: POST
// =============================================================================================

/// A request and an `application/json` answer travel as the exact bytes that arrived, and the
/// upstream is called on its own configured path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_json_answer_is_passed_through_byte_exact() {
    let req_body = "{\"jsonrpc\":\"2.0\",  \"id\":7,\"method\":\"tools/call\",\n \"params\":{\"name\":\"echo\",\"arguments\":{\"z\":1,\"a\":\"\\u00e9\\n\",\"n\":1.50,\"big\":123456789012345678901234567890}}}";
    let resp_body = "{ \"result\" : {\"content\":[{\"type\":\"text\",\"text\":\"h\\u00e9\"}],\"n\":1.50e0,\"big\":123456789012345678901234567890} ,\"id\":7, \"jsonrpc\":\"2.0\" }";
    let up = Upstream::start(move |_| ScriptedResponse::json(resp_body)).await;
    let gw = GatewayBuilder::single(&up.url_path("/upstream/mcp"))
        .start()
        .await;

    let r = Req::mcp_post(&gw.url("/mcp"), req_body).send().await;

    assert_eq!(r.status(), 200);
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(
        r.text().await,
        resp_body,
        "client must get the upstream's bytes"
    );
    assert_eq!(up.count(), 1);
    let seen = up.last();
    assert_eq!(seen.method, "POST");
    assert_eq!(
        seen.path, "/upstream/mcp",
        "upstream is called on its configured path"
    );
    assert_eq!(
        seen.body_str(),
        req_body,
        "upstream must get the client's bytes"
    );
}

fn echo_id_json(req: &RecordedRequest) -> ScriptedResponse {
    ScriptedResponse::json(format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{{"seen":{}}}}}"#,
        req.rpc_id_json(),
        req.rpc_id_json()
    ))
}

/// `0` stays the number 0 and `"0"` the string "0", upstream and back (JSON answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_zero_and_string_zero_keep_their_type_json() {
    let up = Upstream::start(echo_id_json).await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    for (id_json, expected) in [("0", json!(0)), ("\"0\"", json!("0"))] {
        let body = rpc(id_json, "tools/list", "{}");
        let r = Req::mcp_post(&gw.url("/mcp"), body.clone()).send().await;
        assert_eq!(r.status(), 200);
        let text = r.text().await;
        let got: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            got["id"], expected,
            "client got id {} for sent {id_json}: {text}",
            got["id"]
        );
        assert_eq!(got["result"]["seen"], expected);
        assert!(
            text.contains(&format!("\"id\":{id_json},")),
            "id bytes kept in answer: {text}"
        );
        let seen = up.last();
        assert_eq!(seen.body_str(), body);
        assert_eq!(
            seen.rpc_id(),
            Some(expected.clone()),
            "upstream saw id {:?}",
            seen.rpc_id()
        );
    }
}

/// `0` stays the number 0 and `"0"` the string "0" on SSE answers too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_zero_and_string_zero_keep_their_type_sse() {
    let up = Upstream::start(|req| {
        ScriptedResponse::sse(vec![ev()
            .event("message")
            .data(&rpc_result(&req.rpc_id_json(), "{}"))
            .into()])
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    for (id_json, expected) in [("0", json!(0)), ("\"0\"", json!("0"))] {
        let body = rpc(id_json, "tools/call", r#"{"name":"x"}"#);
        let r = Req::mcp_post(&gw.url("/mcp"), body.clone()).send().await;
        assert_eq!(r.status(), 200);
        let mut s = r.sse();
        let e = s.next_event(STEP).await;
        assert_eq!(
            e.data().unwrap(),
            rpc_result(id_json, "{}"),
            "event data bytes kept"
        );
        assert_eq!(e.json()["id"], expected);
        s.expect_end(STEP).await;
        assert_eq!(up.last().rpc_id(), Some(expected));
    }
}

/// A progress notification reaches the client while the upstream still holds the SSE stream
/// open (no buffering); the final answer follows and the stream ends after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_progress_arrives_while_upstream_still_holds_stream() {
    let progress = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p1","progress":1,"total":3,  "message":"working"}}"#;
    let result = r#"{"jsonrpc":"2.0","id":11,"result":{"content":[{"type":"text","text":"done"}],"isError":false}}"#;
    let gate = Gate::new();
    let g = gate.clone();
    let up = Upstream::start(move |_| {
        ScriptedResponse::sse(vec![
            ev().id("ev-1").data("").into(),
            ev().event("message").id("ev-2").data(progress).into(),
            SseStep::Wait(g.clone()),
            ev().event("message").id("ev-3").data(result).into(),
        ])
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let body = rpc(
        "11",
        "tools/call",
        r#"{"name":"slow","_meta":{"progressToken":"p1"}}"#,
    );
    let r = Req::mcp_post(&gw.url("/mcp"), body).send().await;
    assert_eq!(r.status(), 200);
    let ct = r.header("content-type").unwrap_or_default();
    assert!(ct.starts_with("text/event-stream"), "content-type {ct:?}");
    let mut s = r.sse();

    assert_eq!(s.next_event(STEP).await.id().as_deref(), Some("ev-1"));
    let e = s.next_event(STEP).await;
    assert_eq!(e.data().as_deref(), Some(progress), "progress bytes kept");
    assert_eq!(e.id().as_deref(), Some("ev-2"));
    // The upstream is still waiting on the gate: the client already has the progress event.
    s.expect_open_for(QUIET).await;

    gate.open();
    let e = s.next_event(STEP).await;
    assert_eq!(e.data().as_deref(), Some(result));
    assert_eq!(e.id().as_deref(), Some("ev-3"));
    s.expect_end(STEP).await;
}

/// The SSE fields `id`, `event`, `retry` and an empty-`data` priming event come through as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_fields_id_event_retry_and_empty_data_priming_preserved() {
    let progress = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#;
    let result = r#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
    let up = Upstream::start(move |_| {
        ScriptedResponse::sse(vec![
            SseStep::Raw("id: prime-0\ndata:\n\n".into()),
            SseStep::Raw(format!("event: message\nid: s-1\ndata: {progress}\n\n")),
            SseStep::Raw(format!(
                "id: s-2\nevent: message\nretry: 2500\ndata: {result}\n\n"
            )),
        ])
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "tools/call", r#"{"name":"x"}"#))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let mut s = r.sse();

    let e0 = s.next_event(STEP).await;
    assert_eq!(e0.id().as_deref(), Some("prime-0"), "priming id: {e0:?}");
    assert_eq!(
        e0.data().as_deref(),
        Some(""),
        "priming event keeps its empty data: {e0:?}"
    );
    assert_eq!(e0.event(), None, "{e0:?}");
    let e1 = s.next_event(STEP).await;
    assert_eq!(e1.id().as_deref(), Some("s-1"));
    assert_eq!(e1.event().as_deref(), Some("message"));
    assert_eq!(e1.data().as_deref(), Some(progress));
    let e2 = s.next_event(STEP).await;
    assert_eq!(e2.id().as_deref(), Some("s-2"));
    assert_eq!(e2.event().as_deref(), Some("message"));
    assert_eq!(e2.retry().as_deref(), Some("2500"));
    assert_eq!(e2.data().as_deref(), Some(result));
    s.expect_end(STEP).await;
}

/// An event whose data spans several `data:` lines keeps its value (lines joined with `\n`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_multiline_data_preserved() {
    let result = "{\"jsonrpc\":\"2.0\",\n\"id\":3,\n\"result\":{}}";
    let up = Upstream::start(move |_| {
        ScriptedResponse::sse(vec![SseStep::Raw(
            "id: m-1\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"id\":3,\ndata: \"result\":{}}\n\n"
                .into(),
        )])
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("3", "tools/call", r#"{"name":"x"}"#))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let mut s = r.sse();
    let e = s.next_event(STEP).await;
    assert_eq!(e.data().as_deref(), Some(result), "raw: {:?}", s.raw_text());
    assert_eq!(e.id().as_deref(), Some("m-1"));
    s.expect_end(STEP).await;
}

/// The upstream closes the connection after a priming event with `retry` (spec 6: it MAY close
/// the connection without ending the stream): the client sees the event, then the end; it resumes
/// with GET + `Last-Event-ID` and gets the answer on the resumed stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_closed_after_retry_then_resumed_with_get_last_event_id() {
    let result = r#"{"jsonrpc":"2.0","id":"r-1","result":{"ok":true}}"#;
    let up = Upstream::start(move |req| match req.method.as_str() {
        "POST" => ScriptedResponse::sse(vec![ev().id("p-0").retry(1500).data("").into()]),
        "GET" if req.header("last-event-id").as_deref() == Some("p-0") => {
            ScriptedResponse::sse(vec![ev().id("p-1").event("message").data(result).into()])
        }
        _ => ScriptedResponse::status(400, Some("text/plain"), "bad resume"),
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(
        &gw.url("/mcp"),
        rpc("\"r-1\"", "tools/call", r#"{"name":"x"}"#),
    )
    .header("mcp-session-id", "s-resume")
    .send()
    .await;
    assert_eq!(r.status(), 200);
    let mut s = r.sse();
    let e = s.next_event(STEP).await;
    assert_eq!(e.id().as_deref(), Some("p-0"));
    assert_eq!(e.retry().as_deref(), Some("1500"));
    assert_eq!(e.data().as_deref(), Some(""));
    s.expect_end(STEP).await;

    let r = Req::mcp_get(&gw.url("/mcp"))
        .header("mcp-session-id", "s-resume")
        .header("last-event-id", "p-0")
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let mut s = r.sse();
    let e = s.next_event(STEP).await;
    assert_eq!(e.id().as_deref(), Some("p-1"));
    assert_eq!(e.data().as_deref(), Some(result));
    s.expect_end(STEP).await;
    let get = up.last();
    assert_eq!(get.method, "GET");
    assert_eq!(get.header("last-event-id").as_deref(), Some("p-0"));
    assert_eq!(get.header("mcp-session-id").as_deref(), Some("s-resume"));
}

/// A POST SSE answer that keeps delivering is not cut by the upstream's request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_answer_still_delivering_outlives_request_timeout() {
    let up = Upstream::start(|_| {
        let mut steps: Vec<SseStep> = vec![ev().id("t-0").data("").into()];
        for i in 1..=5 {
            steps.push(SseStep::Sleep(Duration::from_millis(250)));
            steps.push(
                ev().data(&format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"t","progress":{i}}}}}"#
                ))
                .into(),
            );
        }
        steps.push(ev().data(r#"{"jsonrpc":"2.0","id":5,"result":{}}"#).into());
        ScriptedResponse::sse(steps)
    })
    .await;
    let gw = GatewayBuilder::single(&up.url())
        .upstream_opt("timeout_ms = 400")
        .start()
        .await;

    let started = Instant::now();
    let r = Req::mcp_post(&gw.url("/mcp"), rpc("5", "tools/call", r#"{"name":"x"}"#))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let mut s = r.sse();
    s.next_event(STEP).await;
    for i in 1..=5 {
        let e = s.next_event(STEP).await;
        assert_eq!(e.json()["params"]["progress"], json!(i), "progress {i}");
    }
    let e = s.next_event(STEP).await;
    assert_eq!(e.json()["id"], json!(5));
    s.expect_end(STEP).await;
    assert!(started.elapsed() >= Duration::from_millis(1200));
}

/// A notification gets 202 with no body, and the upstream got its exact bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notification_gets_202_and_is_forwarded() {
    let up = Upstream::start(|_| ScriptedResponse::accepted()).await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let body = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

    let r = Req::mcp_post(&gw.url("/mcp"), body)
        .header("mcp-session-id", "s-n")
        .send()
        .await;

    assert_eq!(r.status(), 202);
    assert_eq!(r.bytes().await.len(), 0, "202 has no body");
    assert_eq!(up.count(), 1);
    assert_eq!(up.last().body_str(), body);
    assert_eq!(up.last().header("mcp-session-id").as_deref(), Some("s-n"));
}

/// A JSON-RPC response (client answering a server request) gets 202 and is forwarded as is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_message_gets_202_and_is_forwarded() {
    let up = Upstream::start(|_| ScriptedResponse::accepted()).await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let body =
        r#"{"jsonrpc":"2.0","id":"srv-req-1","result":{"action":"accept","content":{"x":1}}}"#;

    let r = Req::mcp_post(&gw.url("/mcp"), body)
        .header("mcp-session-id", "s-r")
        .send()
        .await;

    assert_eq!(r.status(), 202);
    assert_eq!(r.bytes().await.len(), 0);
    assert_eq!(up.count(), 1);
    assert_eq!(up.last().body_str(), body);
}

/// An event split across TCP writes (mid-field) and CRLF line endings arrive as whole events
/// with their values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_split_writes_and_crlf_line_endings_decoded() {
    let progress = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"s","progress":1}}"#;
    let result = r#"{"jsonrpc":"2.0","id":4,"result":{}}"#;
    let up = Upstream::start(move |_| {
        ScriptedResponse::sse(vec![
            SseStep::Raw("id: sp-1\r\nda".into()),
            SseStep::Sleep(Duration::from_millis(150)),
            SseStep::Raw(format!("ta: {progress}\r")),
            SseStep::Sleep(Duration::from_millis(150)),
            SseStep::Raw("\n\r\n".into()),
            SseStep::Raw(format!("id: sp-2\rdata: {result}\r\r")),
        ])
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("4", "tools/call", r#"{"name":"x"}"#))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let mut s = r.sse();
    let e = s.next_event(STEP).await;
    assert_eq!(e.id().as_deref(), Some("sp-1"));
    assert_eq!(e.data().as_deref(), Some(progress));
    let e = s.next_event(STEP).await;
    assert_eq!(e.id().as_deref(), Some("sp-2"));
    assert_eq!(e.data().as_deref(), Some(result));
    s.expect_end(STEP).await;
}

/// Reads a whole SSE body: (id, data) of every event, until the end.
async fn all_events(r: Resp) -> (Vec<(Option<String>, Option<String>)>, String) {
    let mut s = r.sse();
    let mut got = Vec::new();
    loop {
        match s.next(STEP).await {
            Next::Item(SseItem::Event(e)) => got.push((e.id(), e.data())),
            Next::Item(SseItem::Comment(_)) => {}
            Next::End => break,
            Next::Timeout => panic!("stream did not end; raw {:?}", s.raw_text()),
        }
    }
    (got, s.raw_text())
}

fn id_data(id: &str, data: &str) -> (Option<String>, Option<String>) {
    (Some(id.to_string()), Some(data.to_string()))
}

/// An unknown SSE field (which the SSE standard says to ignore) does not make the gateway lose
/// the events around it, least of all the JSON-RPC answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_unknown_field_does_not_lose_events() {
    let progress = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"u","progress":1}}"#;
    let result = r#"{"jsonrpc":"2.0","id":6,"result":{"ok":1}}"#;
    let up = Upstream::start(move |_| {
        // One write: the whole body arrives in one chunk.
        ScriptedResponse::sse(vec![SseStep::Raw(format!(
            "id: u-1\nx-vendor: 1\ndata: {progress}\n\nid: u-2\ndata: {result}\n\n"
        ))])
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("6", "tools/call", r#"{"name":"x"}"#))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let (got, raw) = all_events(r).await;
    assert_eq!(
        got,
        vec![id_data("u-1", progress), id_data("u-2", result)],
        "raw to client: {raw:?}"
    );
}

/// A field line without a colon is, per the SSE standard, the field name with an empty value
/// (`data` alone is an empty data line); events around it are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_field_line_without_colon_accepted() {
    let result = r#"{"jsonrpc":"2.0","id":6,"result":{"ok":1}}"#;
    let up = Upstream::start(move |_| {
        ScriptedResponse::sse(vec![SseStep::Raw(format!(
            "id: n-1\ndata\n\nid: n-2\ndata: {result}\n\n"
        ))])
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("6", "tools/call", r#"{"name":"x"}"#))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let (got, raw) = all_events(r).await;
    assert_eq!(
        got,
        vec![id_data("n-1", ""), id_data("n-2", result)],
        "raw to client: {raw:?}"
    );
}

/// A client that sends `Accept-Encoding: gzip` (Node's fetch and Python's httpx do by default)
/// still gets readable SSE answers from an upstream that compresses when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_answer_readable_when_client_accepts_gzip() {
    let result = r#"{"jsonrpc":"2.0","id":12,"result":{"ok":true}}"#;
    let up = Upstream::start(move |req| {
        let events = [
            ev().id("z-0").data("").wire(),
            ev().id("z-1").data(result).wire(),
        ];
        let asked = req
            .header_all("accept-encoding")
            .iter()
            .any(|v| v.contains("gzip"));
        if !asked {
            return ScriptedResponse::sse(events.iter().map(|e| SseStep::Raw(e.clone())).collect());
        }
        // One gzip stream in three writes: each event is flushed as it is written.
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        let mut chunks = Vec::new();
        for e in &events {
            gz.write_all(e.as_bytes()).unwrap();
            gz.flush().unwrap();
            chunks.push(SseStep::Bytes(std::mem::take(gz.get_mut()).into()));
        }
        chunks.push(SseStep::Bytes(gz.finish().unwrap().into()));
        ScriptedResponse::sse(chunks).header("content-encoding", "gzip")
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("12", "tools/call", r#"{"name":"x"}"#))
        .header("accept-encoding", "gzip, deflate")
        .send()
        .await;

    assert_eq!(r.status(), 200);
    if r.header("content-encoding")
        .is_some_and(|v| v.contains("gzip"))
    {
        let body = r.bytes().await;
        let mut text = String::new();
        GzDecoder::new(&body[..])
            .read_to_string(&mut text)
            .unwrap_or_else(|e| {
                panic!(
                    "the client got Content-Encoding: gzip but the body is not a gzip stream ({e}): {:?}",
                    String::from_utf8_lossy(&body)
                )
            });
        assert!(text.contains(&format!("data: {result}\n")), "{text}");
    } else {
        let (got, raw) = all_events(r).await;
        assert!(
            got.contains(&id_data("z-1", result)),
            "events {got:?}; raw {raw:?}"
        );
    }
}

/// When the upstream connection dies in the middle of an SSE answer, the client's stream ends
/// (it does not hang).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_answer_upstream_connection_lost_ends_client_stream() {
    let up = Upstream::start(|_| {
        ScriptedResponse::sse(vec![ev().id("l-0").data("").into(), SseStep::HoldOpen])
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "tools/call", r#"{"name":"x"}"#))
        .send()
        .await;
    let mut s = r.sse();
    s.next_event(STEP).await;
    up.stop();
    s.expect_end(Duration::from_secs(5)).await;
}

/// An SSE answer that is idle (the tool is working, nothing to report) gets keep-alive comments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_answer_idle_gets_keepalive_comments() {
    let gate = Gate::new();
    let g = gate.clone();
    let up = Upstream::start(move |req| {
        ScriptedResponse::sse(vec![
            ev().id("k-0").data("").into(),
            SseStep::Wait(g.clone()),
            ev().data(&rpc_result(&req.rpc_id_json(), "{}")).into(),
        ])
    })
    .await;
    let gw = GatewayBuilder::single(&up.url())
        .gateway_opt("sse_keepalive_ms = 100")
        .start()
        .await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("8", "tools/call", r#"{"name":"x"}"#))
        .send()
        .await;
    let mut s = r.sse();
    assert_eq!(s.next_event(STEP).await.id().as_deref(), Some("k-0"));
    s.next_comment(Duration::from_secs(2)).await;
    s.next_comment(Duration::from_secs(2)).await;
    gate.open();
    assert_eq!(s.next_event(STEP).await.json()["id"], json!(8));
    s.expect_end(STEP).await;
}

/// When the client drops a POST SSE answer, the gateway lets go of the upstream stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_answer_client_disconnect_releases_upstream_stream() {
    let up = Upstream::start(|_| {
        ScriptedResponse::sse(vec![ev().id("x-0").data("").into(), SseStep::HoldOpen])
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "tools/call", r#"{"name":"x"}"#))
        .send()
        .await;
    let mut s = r.sse();
    s.next_event(STEP).await;
    drop(s);
    assert!(
        up.wait_for_sse_disconnects(1, Duration::from_secs(5)).await,
        "upstream POST stream still held 5 s after the client left"
    );
}

/// Large messages pass unchanged both ways: a 3 MiB request, a 6 MiB JSON answer (answers are not
/// bound by `max_body_bytes`) and a 2 MiB SSE event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_pass_unchanged() {
    let big_json = rpc_result("1", &format!(r#"{{"blob":"{}"}}"#, "j".repeat(6 << 20)));
    let big_event = rpc_result("2", &format!(r#"{{"blob":"{}"}}"#, "s".repeat(2 << 20)));
    let (bj, be) = (big_json.clone(), big_event.clone());
    let up = Upstream::start(move |req| match req.rpc_id() {
        Some(v) if v == json!(1) => ScriptedResponse::json(bj.clone()),
        _ => ScriptedResponse::sse(vec![ev().data(&be).into()]),
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let request = body_of_len(3 << 20);
    let r = Req::mcp_post(&gw.url("/mcp"), request.clone()).send().await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await == big_json, "6 MiB JSON answer changed");
    assert!(up.last().body_str() == request, "3 MiB request changed");

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("2", "tools/call", "{}"))
        .send()
        .await;
    let mut s = r.sse();
    let e = s.next_event(STEP).await;
    assert!(
        e.data().as_deref() == Some(big_event.as_str()),
        "2 MiB event changed"
    );
    s.expect_end(STEP).await;
}

/// Many requests in flight at once each get their own answer (ids and bodies not mixed up),
/// whether the answers come as JSON or SSE and in whatever order they finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_each_get_their_own_answer() {
    let up = Upstream::start(|req| {
        let id = req.rpc_id().unwrap();
        let n = id.as_i64().unwrap_or(0);
        let delay = Duration::from_millis(((20 - n.rem_euclid(20)) * 15) as u64);
        let body = rpc_result(
            &req.rpc_id_json(),
            &format!(r#"{{"n":{}}}"#, req.rpc_id_json()),
        );
        if n % 2 == 0 {
            ScriptedResponse::json(body).after(delay)
        } else {
            ScriptedResponse::sse(vec![
                ev().data("").into(),
                SseStep::Sleep(delay),
                ev().data(&body).into(),
            ])
        }
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let mut tasks = Vec::new();
    for n in 0..20i64 {
        let url = gw.url("/mcp");
        tasks.push(tokio::spawn(async move {
            let r = Req::mcp_post(&url, rpc(&n.to_string(), "tools/call", "{}"))
                .header("mcp-session-id", "s-conc")
                .send()
                .await;
            assert_eq!(r.status(), 200);
            let v = if n % 2 == 0 {
                r.json().await
            } else {
                let mut s = r.sse();
                s.next_event(STEP).await;
                s.next_event(STEP).await.json()
            };
            assert_eq!(v["id"], json!(n));
            assert_eq!(v["result"]["n"], json!(n));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(up.count(), 20);
}

/// The upstream is called on its configured path and query, whatever the client's path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_url_path_and_query_used() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::new()
        .upstream("q", &up.url_path("/v1/mcp?key=abc&x=1"))
        .start()
        .await;

    let r = Req::mcp_post(&gw.url("/mcp/q"), rpc("1", "ping", "{}"))
        .send()
        .await;

    assert_eq!(r.status(), 200);
    assert_eq!(up.last().path, "/v1/mcp?key=abc&x=1");
}

/// A body that is JSON but not a JSON-RPC message: 400 with -32600, nothing forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_that_is_not_jsonrpc_is_400_invalid_request() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    for body in [r#""hello""#, r#"{"foo":1}"#, "42"] {
        let r = Req::mcp_post(&gw.url("/mcp"), body).send().await;
        assert_eq!(r.status(), 400, "body {body}");
        let v = r.json().await;
        assert_eq!(v["error"]["code"], json!(-32600), "body {body}: {v}");
    }
    assert_eq!(up.count(), 0);
}

// =============================================================================================
// Streamable HTTP: GET and DELETE
// =============================================================================================

fn server_note(n: u32) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":"note {n}"}}}}"#
    )
}

/// GET opens the standalone stream upstream with `Last-Event-ID`, session and version headers;
/// events arrive while the upstream holds it open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_stream_forwarded_with_last_event_id() {
    let gate = Gate::new();
    let g = gate.clone();
    let up = Upstream::start(move |req| {
        if req.method == "GET" {
            ScriptedResponse::sse(vec![
                ev().id("g-6").data(&server_note(6)).into(),
                SseStep::Wait(g.clone()),
                ev().id("g-7").data(&server_note(7)).into(),
                SseStep::HoldOpen,
            ])
        } else {
            mcp_handler(req)
        }
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_get(&gw.url("/mcp"))
        .header("mcp-session-id", "sess-get-1")
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .header("last-event-id", "g-5")
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert!(r
        .header("content-type")
        .unwrap_or_default()
        .starts_with("text/event-stream"));

    let seen = up.last();
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.path, "/mcp");
    assert_eq!(seen.header("last-event-id").as_deref(), Some("g-5"));
    assert_eq!(seen.header("mcp-session-id").as_deref(), Some("sess-get-1"));
    assert_eq!(
        seen.header("mcp-protocol-version").as_deref(),
        Some(PROTOCOL_VERSION)
    );
    assert_eq!(seen.header("accept").as_deref(), Some("text/event-stream"));

    let mut s = r.sse();
    let e = s.next_event(STEP).await;
    assert_eq!(e.id().as_deref(), Some("g-6"));
    assert_eq!(e.data().unwrap(), server_note(6));
    s.expect_open_for(QUIET).await;
    gate.open();
    let e = s.next_event(STEP).await;
    assert_eq!(e.id().as_deref(), Some("g-7"));
    s.expect_open_for(QUIET).await;
}

/// An idle GET stream gets keep-alive comments, and is not cut by the upstream timeout: an event
/// the upstream sends long after `timeout_ms` still arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_stream_idle_gets_keepalive_comments_and_no_read_timeout() {
    let up = Upstream::start(|req| {
        if req.method == "GET" {
            ScriptedResponse::sse(vec![
                SseStep::Sleep(Duration::from_millis(1500)),
                ev().id("late").data(&server_note(1)).into(),
                SseStep::HoldOpen,
            ])
        } else {
            mcp_handler(req)
        }
    })
    .await;
    let gw = GatewayBuilder::single(&up.url())
        .gateway_opt("sse_keepalive_ms = 100")
        .upstream_opt("timeout_ms = 300")
        .start()
        .await;

    let r = Req::mcp_get(&gw.url("/mcp"))
        .header("mcp-session-id", "s-idle")
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let mut s = r.sse();
    let first = s.next(Duration::from_millis(1200)).await;
    assert!(
        matches!(first, Next::Item(SseItem::Comment(_))),
        "a keep-alive comment within 1.2 s of an idle stream, got {first:?}"
    );
    let mut comments = 1;
    let late = loop {
        match s.next(STEP).await {
            Next::Item(SseItem::Comment(_)) => comments += 1,
            Next::Item(SseItem::Event(e)) => break e,
            other => panic!(
                "stream must stay open past timeout_ms, got {other:?}; raw {:?}",
                s.raw_text()
            ),
        }
    };
    assert_eq!(late.id().as_deref(), Some("late"));
    assert!(
        comments >= 3,
        "about one comment per 100 ms over 1.5 s, got {comments}"
    );
}

/// When the client goes away, the gateway lets go of the upstream GET stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_stream_client_disconnect_releases_upstream_stream() {
    let up = Upstream::start(|req| {
        if req.method == "GET" {
            ScriptedResponse::sse(vec![
                ev().id("d-1").data(&server_note(1)).into(),
                SseStep::HoldOpen,
            ])
        } else {
            mcp_handler(req)
        }
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_get(&gw.url("/mcp"))
        .header("mcp-session-id", "s-d")
        .send()
        .await;
    let mut s = r.sse();
    s.next_event(STEP).await;
    assert_eq!(up.sse_disconnects(), 0);
    drop(s);
    assert!(
        up.wait_for_sse_disconnects(1, Duration::from_secs(5)).await,
        "upstream GET stream still held 5 s after the client left"
    );
}

/// When the upstream ends the GET stream, the client's stream ends too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_stream_upstream_close_ends_client_stream() {
    let up = Upstream::start(|req| {
        if req.method == "GET" {
            ScriptedResponse::sse(vec![
                ev().id("c-1").data(&server_note(1)).into(),
                SseStep::Sleep(Duration::from_millis(200)),
            ])
        } else {
            mcp_handler(req)
        }
    })
    .await;
    let gw = GatewayBuilder::single(&up.url())
        .gateway_opt("sse_keepalive_ms = 50")
        .start()
        .await;

    let r = Req::mcp_get(&gw.url("/mcp"))
        .header("mcp-session-id", "s-c")
        .send()
        .await;
    let mut s = r.sse();
    assert_eq!(s.next_event(STEP).await.id().as_deref(), Some("c-1"));
    s.expect_end(Duration::from_secs(5)).await;
}

/// DELETE is forwarded with the session header; the upstream's status comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_forwarded_with_session() {
    let up = Upstream::start(|req| {
        if req.method == "DELETE" {
            ScriptedResponse::status(200, None, "")
        } else {
            mcp_handler(req)
        }
    })
    .await;
    let gw = GatewayBuilder::single(&up.url_path("/x/mcp")).start().await;

    let r = Req::delete(&gw.url("/mcp"))
        .header("mcp-session-id", "sess-del-9")
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;

    assert_eq!(r.status(), 200);
    assert_eq!(up.count(), 1);
    let seen = up.last();
    assert_eq!(seen.method, "DELETE");
    assert_eq!(seen.path, "/x/mcp");
    assert_eq!(seen.header("mcp-session-id").as_deref(), Some("sess-del-9"));
    assert_eq!(
        seen.header("mcp-protocol-version").as_deref(),
        Some(PROTOCOL_VERSION)
    );
}

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

/// POST whose `Accept` does not list both types: 406, nothing forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_without_accept_both_is_406() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let sid = initialize(&gw, "/mcp").await;
    let before = up.count();

    for accept in [None, Some("application/json"), Some("text/event-stream")] {
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

/// A body of exactly `n` bytes that is a valid JSON-RPC request.
fn body_of_len(n: usize) -> String {
    let head = r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":""#;
    let tail = r#""}}"#;
    let pad = n - head.len() - tail.len();
    let s = format!("{head}{}{tail}", "x".repeat(pad));
    assert_eq!(s.len(), n);
    s
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

/// `Host` not in the allow-list: 403 (DNS rebinding); listen address, localhost, 127.0.0.1 and
/// configured `allowed_hosts` pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_not_allowed_is_403() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url())
        .gateway_opt(r#"allowed_hosts = ["gw.internal"]"#)
        .start()
        .await;
    let sid = initialize(&gw, "/mcp").await;
    let port = gw.addr.port();
    let before = up.count();

    for host in ["evil.example".to_string(), format!("evil.example:{port}")] {
        let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
            .header("host", &host)
            .header("mcp-session-id", &sid)
            .send()
            .await;
        assert_eq!(r.status(), 403, "Host {host}");
    }
    let r = Req::mcp_get(&gw.url("/mcp"))
        .header("host", "evil.example")
        .send()
        .await;
    assert_eq!(r.status(), 403, "GET with a bad Host");
    assert_eq!(up.count(), before, "nothing forwarded");

    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "gw.internal".to_string(),
    ] {
        let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
            .header("host", &host)
            .send()
            .await;
        assert_eq!(r.status(), 200, "Host {host} is allowed");
    }
    assert_session_works(&gw, &up, &sid).await;
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

/// `Origin` not in the allow-list: 403; no Origin, localhost/127.0.0.1 origins and configured
/// `allowed_origins` pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_not_allowed_is_403() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url())
        .gateway_opt(r#"allowed_origins = ["https://app.example"]"#)
        .start()
        .await;
    let sid = initialize(&gw, "/mcp").await;
    let port = gw.addr.port();
    let before = up.count();

    for origin in ["http://evil.example", "https://app.example.evil"] {
        let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
            .header("origin", origin)
            .header("mcp-session-id", &sid)
            .send()
            .await;
        assert_eq!(r.status(), 403, "Origin {origin}");
    }
    let r = Req::mcp_get(&gw.url("/mcp"))
        .header("origin", "http://evil.example")
        .send()
        .await;
    assert_eq!(r.status(), 403, "GET with a bad Origin");
    assert_eq!(up.count(), before, "nothing forwarded");

    for origin in [
        format!("http://localhost:{port}"),
        format!("http://127.0.0.1:{port}"),
        "https://app.example".to_string(),
    ] {
        let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "ping", "{}"))
            .header("origin", &origin)
            .send()
            .await;
        assert_eq!(r.status(), 200, "Origin {origin} is allowed");
    }
    assert_session_works(&gw, &up, &sid).await;
}

// =============================================================================================
// Upstream HTTP errors pass through
// =============================================================================================

/// 404 (session expired) comes back with its status and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_404_session_expired_passes_through() {
    let body = r#"{"jsonrpc":"2.0","id":5,"error":{"code":-32001,"message":"Session not found"}}"#;
    let up =
        Upstream::start(move |_| ScriptedResponse::status(404, Some("application/json"), body))
            .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("5", "tools/list", "{}"))
        .header("mcp-session-id", "expired-1")
        .send()
        .await;

    assert_eq!(r.status(), 404);
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(r.text().await, body);
    assert_eq!(up.count(), 1);
}

/// 400 from the upstream comes back with its status and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_400_passes_through() {
    let body = "Bad Request: No valid session ID provided";
    let up =
        Upstream::start(move |_| ScriptedResponse::status(400, Some("text/plain"), body)).await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "tools/list", "{}"))
        .send()
        .await;

    assert_eq!(r.status(), 400);
    assert_eq!(r.text().await, body);
}

/// 405 on GET (no standalone stream) and on DELETE come back with status and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_405_on_get_and_delete_passes_through() {
    let up = Upstream::start(|_| {
        ScriptedResponse::status(405, Some("text/plain"), "Method Not Allowed")
            .header("allow", "POST")
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_get(&gw.url("/mcp"))
        .header("mcp-session-id", "s")
        .send()
        .await;
    assert_eq!(r.status(), 405);
    assert_eq!(r.text().await, "Method Not Allowed");

    let r = Req::delete(&gw.url("/mcp"))
        .header("mcp-session-id", "s")
        .send()
        .await;
    assert_eq!(r.status(), 405);
    assert_eq!(r.text().await, "Method Not Allowed");
    assert_eq!(up.count(), 2);
}

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
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, body) = admin_get(&gw, "/readyz").await;
        if status == 503 {
            break;
        }
        assert!(
            Instant::now() < until,
            "readyz still {status} 5 s after the upstream stopped: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
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

/// The value of the sample of `name` whose labels include all of `labels`.
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
        &[("upstream", "default"), ("method", "tools/call")],
    );
    assert!(
        calls.unwrap_or(0.0) >= 1.0,
        "requests_total for tools/call: {calls:?}\n{text}"
    );
    let inits = sample(
        &text,
        "taskgate_requests_total",
        &[("upstream", "default"), ("method", "initialize")],
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
            &[("upstream", "default")]
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
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, text) = admin_get(&gw, "/metrics").await;
        if gauge(&text) == Some(0.0) {
            break;
        }
        assert!(
            Instant::now() < until,
            "gauge not back to 0 5 s after the client left\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// In-process shutdown ends open GET streams at once (clients reconnect elsewhere) instead of
/// waiting out the drain timeout, and lets go of the upstream stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_get_streams_promptly() {
    let up = Upstream::start(|req| {
        if req.method == "GET" {
            ScriptedResponse::sse(vec![
                ev().id("sd-1").data(&server_note(1)).into(),
                SseStep::HoldOpen,
            ])
        } else {
            mcp_handler(req)
        }
    })
    .await;
    let mut gw = GatewayBuilder::single(&up.url())
        .gateway_opt("drain_timeout_ms = 10000")
        .start()
        .await;
    let r = Req::mcp_get(&gw.url("/mcp"))
        .header("mcp-session-id", "s-sd")
        .send()
        .await;
    let mut s = r.sse();
    s.next_event(STEP).await;

    let shutdown = gw.shutdown_future();
    tokio::time::timeout(Duration::from_secs(5), shutdown)
        .await
        .expect("shutdown must not wait out drain_timeout_ms for a GET stream");
    s.expect_end(Duration::from_secs(2)).await;
    assert!(
        up.wait_for_sse_disconnects(1, Duration::from_secs(5)).await,
        "upstream GET stream still held after shutdown"
    );
}

// =============================================================================================
// CLI and config (the real binary)
// =============================================================================================

fn manifest_path(rel: &str) -> String {
    format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// `check-config` accepts a complete file and the shipped default config.
#[test]
fn check_config_accepts_good_files() {
    let b = GatewayBuilder::new()
        .gateway_opt("max_body_bytes = 1024")
        .upstream("default", "http://127.0.0.1:3000/mcp")
        .upstream_opt("timeout_ms = 30000")
        .upstream_opt("connect_timeout_ms = 5000")
        .upstream_opt("forward_authorization = false");
    let f = ConfigFile::from_builder(&b);
    let ran = run_taskgate(&["check-config", f.path_str()], &[]);
    assert!(
        ran.status.success(),
        "{ran:?}\n{}",
        std::fs::read_to_string(&f.path).unwrap()
    );

    let shipped = manifest_path("config/taskgate.toml");
    let ran = run_taskgate(&["check-config", &shipped], &[]);
    assert!(
        ran.status.success(),
        "shipped config/taskgate.toml: {ran:?}"
    );
}

/// An unknown key is an error (exit 1) that names the key and its line.
#[test]
fn check_config_unknown_key_names_key_and_line() {
    let text = "[gateway]\nlisten = \"127.0.0.1:0\"\nlisten_backlog = 5\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\npath = \"data/x\"\n\n[[upstream]]\nname = \"default\"\nurl = \"http://127.0.0.1:3000/mcp\"\n";
    assert_eq!(text.lines().nth(2), Some("listen_backlog = 5"));
    let f = ConfigFile::write(text);
    let ran = run_taskgate(&["check-config", f.path_str()], &[]);
    assert_eq!(ran.status.code(), Some(1), "{ran:?}");
    assert!(
        ran.stderr.contains("listen_backlog"),
        "names the key: {}",
        ran.stderr
    );
    assert!(
        ran.stderr.to_lowercase().contains("line 3"),
        "names line 3: {}",
        ran.stderr
    );

    let text = "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\npath = \"data/x\"\n\n[[upstream]]\nname = \"default\"\nurl = \"http://127.0.0.1:3000/mcp\"\ntimeout_secs = 3\n";
    assert_eq!(text.lines().nth(12), Some("timeout_secs = 3"));
    let f = ConfigFile::write(text);
    let ran = run_taskgate(&["check-config", f.path_str()], &[]);
    assert_eq!(ran.status.code(), Some(1), "{ran:?}");
    assert!(
        ran.stderr.contains("timeout_secs"),
        "names the key: {}",
        ran.stderr
    );
    assert!(
        ran.stderr.to_lowercase().contains("line 13"),
        "names line 13: {}",
        ran.stderr
    );
}

/// Values of later features (`auth.mode` other than none, `upgrade.enabled = true`) are rejected
/// with an error naming the feature; a missing file is an error too.
#[test]
fn check_config_rejects_bad_feature_settings_and_missing_file() {
    let base = GatewayBuilder::single("http://127.0.0.1:3000/mcp").to_toml(
        "data/x",
        "127.0.0.1:0",
        "127.0.0.1:0",
    );

    let bearer = base.replace("mode = \"none\"", "mode = \"bearer\"");
    assert_ne!(bearer, base);
    let f = ConfigFile::write(&bearer);
    let ran = run_taskgate(&["check-config", f.path_str()], &[]);
    assert_eq!(ran.status.code(), Some(1), "auth.mode = bearer: {ran:?}");
    assert!(
        ran.stderr.contains("auth") || ran.stderr.contains("bearer"),
        "{}",
        ran.stderr
    );

    // The upgrade is built: enabling it is valid, an unknown disconnect policy is not.
    let upgrade = base.replace("enabled = false", "enabled = true");
    assert_ne!(upgrade, base);
    let f = ConfigFile::write(&upgrade);
    let ran = run_taskgate(&["check-config", f.path_str()], &[]);
    assert_eq!(
        ran.status.code(),
        Some(0),
        "upgrade.enabled = true: {ran:?}"
    );
    let bad_policy = base.replace(
        "enabled = false",
        "enabled = true\non_client_disconnect = \"sometimes\"",
    );
    let f = ConfigFile::write(&bad_policy);
    let ran = run_taskgate(&["check-config", f.path_str()], &[]);
    assert_eq!(ran.status.code(), Some(1), "bad policy: {ran:?}");
    assert!(ran.stderr.contains("sometimes"), "{}", ran.stderr);

    let ran = run_taskgate(&["check-config", "/nonexistent/taskgate.toml"], &[]);
    assert_eq!(ran.status.code(), Some(1), "missing file: {ran:?}");
    assert!(!ran.stderr.is_empty());
}

#[test]
fn version_flag_prints_name_and_version() {
    let ran = run_taskgate(&["--version"], &[]);
    assert!(ran.status.success(), "{ran:?}");
    assert_eq!(
        ran.stdout.trim(),
        format!("taskgate {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn help_lists_subcommands() {
    let ran = run_taskgate(&["--help"], &[]);
    assert!(ran.status.success(), "{ran:?}");
    assert!(
        ran.stdout.contains("serve") && ran.stdout.contains("check-config"),
        "{}",
        ran.stdout
    );
}

/// `serve` prints exactly one listening line on stdout, serves, and exits 0 on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_prints_listening_line_and_exits_0_on_sigterm() {
    let up = Upstream::mcp().await;
    let f = ConfigFile::from_builder(&GatewayBuilder::single(&up.url()));
    let mut p = TaskgateProcess::spawn(&["serve", "--config", f.path_str()], &[]);
    let (gw, admin) = p.listening();
    assert!(gw.ip().is_loopback() && gw.port() != 0, "{gw}");
    assert!(
        admin.ip().is_loopback() && admin.port() != 0 && admin != gw,
        "{admin}"
    );

    let r = Req::get(&format!("http://{admin}/healthz")).send().await;
    assert_eq!(r.status(), 200);
    let r = Req::mcp_post(&format!("http://{gw}/mcp"), rpc("1", "ping", "{}"))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(up.count(), 1);

    p.sigterm();
    let status = p.wait_exit(STEP).expect("exit within 10 s of SIGTERM");
    assert_eq!(status.code(), Some(0), "stderr: {}", p.stderr());
    assert_eq!(
        p.drain_stdout(),
        Vec::<String>::new(),
        "stdout holds only the listening line"
    );
    assert_eq!(
        p.listening_line.as_deref(),
        Some(format!(r#"{{"listening":{{"gateway":"{gw}","admin":"{admin}"}}}}"#).as_str()),
        "the contract's exact line (gateway first, then admin)"
    );
}

/// The listening line means "ready": SIGINT or SIGTERM sent the moment it is printed is a
/// graceful stop with exit 0, never death by the signal (handlers must be installed first).
#[test]
fn binary_signal_right_after_listening_line_exits_0() {
    let f = ConfigFile::from_builder(&GatewayBuilder::single(&dead_url()));
    for round in 0..40 {
        let sig = if round % 2 == 0 {
            libc::SIGINT
        } else {
            libc::SIGTERM
        };
        let mut p = TaskgateProcess::spawn(&["serve", "--config", f.path_str()], &[]);
        p.listening();
        p.signal(sig);
        let status = p.wait_exit(STEP).expect("exit within 10 s of the signal");
        assert_eq!(
            status.code(),
            Some(0),
            "round {round}, signal {sig}: {status:?}; stderr: {}",
            p.stderr()
        );
    }
}

/// `serve` with a header naming an unset `${VAR}` fails to start, naming the variable.
#[test]
fn binary_missing_env_var_fails_to_start() {
    let var = "TASKGATE_IT_BIN_UNSET_VAR";
    let b = GatewayBuilder::single("http://127.0.0.1:3000/mcp").upstream_opt(&format!(
        "headers = {{ Authorization = \"Bearer ${{{var}}}\" }}"
    ));
    let f = ConfigFile::from_builder(&b);
    let mut p = TaskgateProcess::spawn(&["serve", "--config", f.path_str()], &[]);
    let status = p
        .wait_exit(STEP)
        .expect("serve must exit when a variable is missing");
    assert!(!status.success(), "{status:?}");
    assert_eq!(p.drain_stdout(), Vec::<String>::new(), "no listening line");
    let stderr = p.stderr();
    assert!(stderr.contains(var), "stderr names the variable: {stderr}");
}

/// On SIGTERM an in-flight SSE answer is allowed to finish; new connections are refused; then 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_sigterm_drains_in_flight_stream() {
    let gate = Gate::new();
    let g = gate.clone();
    let up = Upstream::start(move |req| {
        ScriptedResponse::sse(vec![
            ev().id("d-0").data("").into(),
            SseStep::Wait(g.clone()),
            ev().data(&rpc_result(&req.rpc_id_json(), "{\"drained\":true}"))
                .into(),
        ])
    })
    .await;
    let f = ConfigFile::from_builder(
        &GatewayBuilder::single(&up.url()).gateway_opt("drain_timeout_ms = 10000"),
    );
    let mut p = TaskgateProcess::spawn(&["serve", "--config", f.path_str()], &[]);
    let (gw, _) = p.listening();

    let r = Req::mcp_post(
        &format!("http://{gw}/mcp"),
        rpc("9", "tools/call", r#"{"name":"x"}"#),
    )
    .send()
    .await;
    let mut s = r.sse();
    s.next_event(STEP).await;

    p.sigterm();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        p.wait_exit(Duration::ZERO).is_none(),
        "exited with a stream in flight"
    );
    let refused = Req::mcp_post(&format!("http://{gw}/mcp"), rpc("10", "ping", "{}"))
        .try_send()
        .await;
    assert!(
        refused.is_err(),
        "new requests must not be accepted while draining: {:?}",
        refused.map(|r| r.status())
    );

    gate.open();
    let e = s.next_event(STEP).await;
    assert_eq!(e.json()["result"]["drained"], json!(true));
    s.expect_end(STEP).await;
    let status = p.wait_exit(STEP).expect("exit after the stream ended");
    assert_eq!(status.code(), Some(0), "stderr: {}", p.stderr());
}

/// A stream that never ends does not hold shutdown past `drain_timeout_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_sigterm_gives_up_after_drain_timeout() {
    let up = Upstream::start(|_| {
        ScriptedResponse::sse(vec![ev().id("h-0").data("").into(), SseStep::HoldOpen])
    })
    .await;
    let f = ConfigFile::from_builder(
        &GatewayBuilder::single(&up.url()).gateway_opt("drain_timeout_ms = 500"),
    );
    let mut p = TaskgateProcess::spawn(&["serve", "--config", f.path_str()], &[]);
    let (gw, _) = p.listening();
    let r = Req::mcp_post(
        &format!("http://{gw}/mcp"),
        rpc("1", "tools/call", r#"{"name":"x"}"#),
    )
    .send()
    .await;
    let mut s = r.sse();
    s.next_event(STEP).await;

    let started = Instant::now();
    p.sigterm();
    let status = p
        .wait_exit(Duration::from_secs(5))
        .expect("exit within 5 s with drain_timeout_ms = 500");
    assert_eq!(status.code(), Some(0), "stderr: {}", p.stderr());
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "did not wait for the drain: {:?}",
        started.elapsed()
    );
}

/// `--log-format json` writes JSON lines to stderr, and bodies are not logged at info level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_json_logs_without_bodies() {
    let up = Upstream::mcp().await;
    let f = ConfigFile::from_builder(&GatewayBuilder::single(&up.url()));
    let mut p = TaskgateProcess::spawn(
        &["serve", "--config", f.path_str(), "--log-format", "json"],
        &[("RUST_LOG", "info")],
    );
    let (gw, _) = p.listening();
    let marker = "BODY-MARKER-5c1e";
    let r = Req::mcp_post(
        &format!("http://{gw}/mcp"),
        rpc(
            "1",
            "tools/call",
            &format!(r#"{{"name":"x","arguments":{{"secret":"{marker}"}}}}"#),
        ),
    )
    .send()
    .await;
    assert_eq!(r.status(), 200);
    assert!(!r.text().await.is_empty());
    p.sigterm();
    p.wait_exit(STEP).expect("exit");
    let stderr = p.stderr();
    assert!(!stderr.trim().is_empty(), "some logs at info");
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        serde_json::from_str::<Value>(line)
            .unwrap_or_else(|e| panic!("log line not JSON ({e}): {line}"));
    }
    assert!(!stderr.contains(marker), "body logged:\n{stderr}");
}
