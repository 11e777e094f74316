//! Streamable HTTP pass-through at the edge: a POST's JSON or SSE answer, GET's standalone stream
//! and DELETE reach the client as the upstream sent them (ids, SSE fields, split writes, large
//! messages, gzip), keep-alive comments fill idle streams, a client or upstream that goes away
//! ends the other side, upstream HTTP errors pass through, and shutdown ends open GET streams.
//!
//! Every test builds the smallest setup that shows its rule and asserts what a user relies on:
//! status codes, JSON-RPC codes, the bytes/ids/headers the upstream received, and SSE events
//! arriving while the upstream still holds the stream open.

use crate::common::*;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

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

/// The SSE fields `id`, `event`, `retry` and an empty-`data` priming event come through as sent
/// (to a client of 2025-11-25: older ones get no priming events, see
/// `priming_events_reach_only_clients_of_2025_11_25_or_later`).
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
        .header("mcp-protocol-version", PROTOCOL_VERSION)
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
    // A 2 MiB event through the test's own (unoptimised) SSE reader: under a loaded CI machine
    // it took longer than one STEP; the bound is three (no wait when it comes sooner).
    let e = s.next_event(STEP * 3).await;
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

/// An upstream's 401 or 403 refuses taskgate's credentials, not the client's (break-edge F8):
/// the client gets 502 `-32603` naming the upstream under its own id, never the upstream's
/// `WWW-Authenticate` (an OAuth client would run discovery against the upstream's metadata),
/// counted `upstream_errors_total{kind="auth"}`. Without configured `headers` taskgate sent no
/// credentials at all, and the message does not name any (review 18b #6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_401_and_403_are_502_without_the_challenge() {
    let up = Upstream::start(|req| {
        let status = if req.rpc_id_json() == "1" { 401 } else { 403 };
        ScriptedResponse::status(
            status,
            Some("application/json"),
            "{\"error\":\"invalid_token\"}",
        )
        .header(
            "www-authenticate",
            "Bearer resource_metadata=\"http://127.0.0.1:9/.well-known/oauth-protected-resource\"",
        )
    })
    .await;
    let configured = GatewayBuilder::single(&up.url())
        .upstream_opt("headers = { Authorization = \"Bearer taskgate\" }")
        .start()
        .await;
    let bare = GatewayBuilder::single(&up.url()).start().await;

    for (gw, refused) in [
        (&configured, "refused taskgate's credentials"),
        (&bare, "refused the request"),
    ] {
        for (id, status) in [(1, 401), (2, 403)] {
            let r = Req::mcp_post(&gw.url("/mcp"), rpc(&id.to_string(), "tools/list", "{}"))
                .header("mcp-session-id", "s")
                .send()
                .await;
            assert_eq!(r.status(), 502, "an upstream {status}");
            assert_eq!(
                r.header("www-authenticate"),
                None,
                "the upstream's challenge"
            );
            let v = r.json().await;
            assert_eq!(v["id"], json!(id), "{v}");
            assert_eq!(v["error"]["code"], json!(-32603), "{v}");
            let message = v["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains(&format!("upstream `default` {refused} (HTTP {status})")),
                "{v}"
            );
        }
        let text = scrape(gw.admin).await;
        assert_eq!(
            metric(
                &text,
                "taskgate_upstream_errors_total",
                &[("upstream", "default"), ("kind", "auth")]
            ),
            2.0
        );
    }
    let sent = up.requests();
    assert_eq!(
        sent[0].header("authorization").as_deref(),
        Some("Bearer taskgate")
    );
    assert_eq!(sent[2].header("authorization"), None);
}

/// With `forward_authorization = true` the token the upstream refused is the client's own when
/// the client sent one: its 401 and challenge reach the client as they are. Without a client
/// token (an anonymous client, taskgate's own background requests), or with a configured
/// `Authorization` replacing the client's, the refused credentials are not the client's: 502
/// `-32603` without the challenge (review 18b #6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_401_passes_through_when_the_client_token_is_forwarded() {
    let up = Upstream::start(|_| {
        ScriptedResponse::status(401, Some("text/plain"), "Unauthorized")
            .header("www-authenticate", "Bearer")
    })
    .await;
    let gw = GatewayBuilder::single(&up.url())
        .upstream_opt("forward_authorization = true")
        .start()
        .await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "tools/list", "{}"))
        .header("mcp-session-id", "s")
        .header("authorization", "Bearer client")
        .send()
        .await;
    assert_eq!(r.status(), 401);
    assert_eq!(r.header("www-authenticate").as_deref(), Some("Bearer"));
    assert_eq!(
        up.requests()[0].header("authorization").as_deref(),
        Some("Bearer client")
    );

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("2", "tools/list", "{}"))
        .header("mcp-session-id", "s")
        .send()
        .await;
    assert_eq!(r.status(), 502, "no client token was sent");
    assert_eq!(r.header("www-authenticate"), None);
    let v = r.json().await;
    assert_eq!(v["id"], json!(2), "{v}");
    assert_eq!(v["error"]["code"], json!(-32603), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("upstream `default` refused the request (HTTP 401)"),
        "{v}"
    );

    let replaced = GatewayBuilder::single(&up.url())
        .upstream_opt("forward_authorization = true")
        .upstream_opt("headers = { Authorization = \"Bearer taskgate\" }")
        .start()
        .await;
    let r = Req::mcp_post(&replaced.url("/mcp"), rpc("3", "tools/list", "{}"))
        .header("mcp-session-id", "s")
        .header("authorization", "Bearer client")
        .send()
        .await;
    assert_eq!(
        r.status(),
        502,
        "taskgate's configured token replaced the client's"
    );
    assert_eq!(r.header("www-authenticate"), None);
    let v = r.json().await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("upstream `default` refused taskgate's credentials (HTTP 401)"),
        "{v}"
    );
    assert_eq!(
        up.requests()[2].header("authorization").as_deref(),
        Some("Bearer taskgate")
    );
}

/// taskgate does not follow an upstream's redirect nor pass its `Location` on: 502 `-32603`
/// naming the status (break-edge F8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_redirect_is_502_naming_the_status() {
    let up = Upstream::start(|_| {
        ScriptedResponse::status(302, None, "").header("location", "http://evil.example/mcp")
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("4", "tools/list", "{}"))
        .header("mcp-session-id", "s")
        .send()
        .await;
    assert_eq!(r.status(), 502);
    assert_eq!(r.header("location"), None);
    let v = r.json().await;
    assert_eq!(v["id"], json!(4), "{v}");
    assert_eq!(v["error"]["code"], json!(-32603), "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("HTTP 302") && message.contains("redirect"),
        "{v}"
    );
    assert_eq!(up.count(), 1, "the redirect is not followed");
}

/// 2026-07-28 has no sessions: an `Mcp-Session-Id` on the upstream's answer to a 2026 request
/// is not passed on (break-edge F8); a 2025 client still gets its session's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modern_answer_never_carries_the_upstreams_session_id() {
    let up = Upstream::start(|req| {
        ScriptedResponse::result_for(req, r#"{"content":[]}"#)
            .header("mcp-session-id", "upstream-chosen")
    })
    .await;
    let gw = GatewayBuilder::single(&up.url())
        .upstream_opt("protocol = \"2026-07-28\"")
        .start()
        .await;

    let r = modern_req(
        &gw.url("/mcp"),
        None,
        3,
        "tools/call",
        json!({"name": "ok"}),
    )
    .send()
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.header("mcp-session-id"), None, "a 2026 answer");

    let r = Req::mcp_post(&gw.url("/mcp"), rpc("5", "tools/list", "{}"))
        .header("mcp-session-id", "upstream-chosen")
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.header("mcp-session-id").as_deref(),
        Some("upstream-chosen"),
        "a 2025 answer"
    );
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
// Priming events only for 2025-11-25 and later (issue 29 item 15)
// =============================================================================================

/// An upstream that opens every SSE answer and GET stream with a priming event (an `id` and an
/// empty `data`, SEP-1699; some SDK servers send one whatever was negotiated), then one message.
async fn priming_upstream() -> Upstream {
    Upstream::start(|req| {
        let priming = ev().id("prime-1").retry(1000).data("");
        let message = match req.method.as_str() {
            "GET" => notification("notifications/message", r#"{"level":"info","data":"x"}"#),
            _ if req.rpc_method().as_deref() == Some("initialize") => rpc_result(
                &req.rpc_id_json(),
                r#"{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"s","version":"1"}}"#,
            ),
            _ => rpc_result(&req.rpc_id_json(), "{}"),
        };
        ScriptedResponse::sse(vec![priming.into(), ev().id("m-2").data(&message).into()])
            .header("mcp-session-id", "primed")
    })
    .await
}

/// A client that negotiated 2025-06-18 or older (its `MCP-Protocol-Version`, or the revision
/// its `initialize` asks for) gets the upstream's SSE answers and GET stream without priming
/// events, which it would take for a message with an empty body (before, they reached it as
/// sent); one of 2025-11-25 or an `initialize` asking for it, or a request without the header,
/// gets them as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priming_events_reach_only_clients_of_2025_11_25_or_later() {
    let up = priming_upstream().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let init = |version: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"{version}","capabilities":{{}},"clientInfo":{{"name":"c","version":"1"}}}}}}"#
        )
    };
    // (request, whether the priming event comes through)
    let cases: Vec<(&str, Req, bool)> = vec![
        (
            "POST 2025-06-18",
            Req::mcp_post(&gw.url("/mcp"), rpc("2", "tools/list", "{}"))
                .header("mcp-protocol-version", "2025-06-18"),
            false,
        ),
        (
            "POST 2025-03-26",
            Req::mcp_post(&gw.url("/mcp"), rpc("2", "tools/list", "{}"))
                .header("mcp-protocol-version", "2025-03-26"),
            false,
        ),
        (
            "POST without a version (passed as sent)",
            Req::mcp_post(&gw.url("/mcp"), rpc("2", "tools/list", "{}")),
            true,
        ),
        (
            "GET 2025-06-18",
            Req::mcp_get(&gw.url("/mcp")).header("mcp-protocol-version", "2025-06-18"),
            false,
        ),
        (
            "initialize asking for 2025-06-18",
            Req::mcp_post(&gw.url("/mcp"), init("2025-06-18")),
            false,
        ),
        (
            "POST 2025-11-25",
            Req::mcp_post(&gw.url("/mcp"), rpc("2", "tools/list", "{}"))
                .header("mcp-protocol-version", "2025-11-25"),
            true,
        ),
        (
            "GET 2025-11-25",
            Req::mcp_get(&gw.url("/mcp")).header("mcp-protocol-version", "2025-11-25"),
            true,
        ),
        (
            "initialize asking for 2025-11-25",
            Req::mcp_post(&gw.url("/mcp"), init("2025-11-25")),
            true,
        ),
    ];
    for (what, req, primed) in cases {
        let r = req.send().await;
        assert_eq!(r.status(), 200, "{what}");
        let mut s = r.sse();
        let first = s.next_event(STEP).await;
        if primed {
            assert_eq!(first.id().as_deref(), Some("prime-1"), "{what}: {first:?}");
            assert_eq!(first.data().as_deref(), Some(""), "{what}: {first:?}");
            let second = s.next_event(STEP).await;
            assert_eq!(second.id().as_deref(), Some("m-2"), "{what}: {second:?}");
        } else {
            assert_eq!(
                first.id().as_deref(),
                Some("m-2"),
                "{what}: the priming event was relayed: {first:?}"
            );
            assert!(!first.data().unwrap_or_default().is_empty(), "{what}");
        }
        s.expect_end(STEP).await;
    }
}

// =============================================================================================
// Invalid answers (break-edge F3, F4)
// =============================================================================================

/// A notification the scripted upstreams below send on their streams.
const LOG_FIRST: &str = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"first"}}"#;

/// An upstream that misbehaves as the tool called says: `badjson` (a JSON body that is not
/// JSON), `empty` (an empty body under `application/json`), `wrongid` (a result under another
/// id), `truncated_sse` (a stream that ends after a notification and a partial event, with no
/// answer), `twice` (a stream with two results for the request); any other tool is answered
/// well.
fn misbehaving(req: &RecordedRequest) -> ScriptedResponse {
    let id = req.rpc_id_json();
    let v = req.json();
    match v["params"]["name"].as_str().unwrap_or_default() {
        "badjson" => ScriptedResponse::json(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":["#
        )),
        "empty" => ScriptedResponse::status(200, Some("application/json"), ""),
        "wrongid" => ScriptedResponse::json(rpc_result(r#""not-yours""#, r#"{"content":[]}"#)),
        "truncated_sse" => ScriptedResponse::sse(vec![
            ev().data(LOG_FIRST).into(),
            SseStep::Raw(format!("data: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"res\n")),
        ]),
        "twice" => ScriptedResponse::sse(vec![
            ev().data(&rpc_result(
                &id,
                r#"{"content":[{"type":"text","text":"first"}]}"#,
            ))
            .into(),
            ev().data(LOG_FIRST).into(),
            ev().data(&rpc_result(
                &id,
                r#"{"content":[{"type":"text","text":"second"}]}"#,
            ))
            .into(),
        ]),
        _ => ScriptedResponse::result_for(req, r#"{"content":[]}"#),
    }
}

fn protocol_errors(m: &str) -> f64 {
    metric(m, "taskgate_upstream_errors_total", &[("kind", "protocol")])
}

fn tools_calls(m: &str, outcome: &str) -> f64 {
    metric(
        m,
        "taskgate_requests_total",
        &[("method", "tools/call"), ("outcome", outcome)],
    )
}

/// A JSON answer that is not the JSON-RPC response to the request (a body that is not JSON, an
/// empty body, a result under another id) is an invalid answer, as the README's error table
/// says: HTTP 502 with `-32603` under the client's id, naming the upstream and what was wrong,
/// counted in `taskgate_upstream_errors_total{kind="protocol"}` and as
/// `outcome="upstream_invalid"`. A valid answer still passes byte for byte. On the old code each
/// reached the client as 200, as it came, counted `outcome="ok"` (break-edge F3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_json_answer_is_502_naming_the_upstream() {
    let up = Upstream::start(misbehaving).await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    for (n, (tool, says)) in [
        ("badjson", "not JSON"),
        ("empty", "empty body"),
        ("wrongid", "\"not-yours\""),
    ]
    .into_iter()
    .enumerate()
    {
        let call = rpc(
            &format!("\"c{n}\""),
            "tools/call",
            &format!(r#"{{"name":"{tool}","arguments":{{}}}}"#),
        );
        let r = Req::mcp_post(&gw.url("/mcp"), call).send().await;
        let status = r.status();
        let v = r.json().await;
        assert_eq!((status, err_code(&v)), (502, -32603), "{tool}: {v}");
        assert_eq!(v["id"], json!(format!("c{n}")), "{tool}: {v}");
        let message = err_message(&v);
        assert!(
            message.contains("upstream `default` sent an invalid response")
                && message.contains(says),
            "{tool}: {v}"
        );
    }
    let r = Req::mcp_post(
        &gw.url("/mcp"),
        rpc("9", "tools/call", r#"{"name":"fine","arguments":{}}"#),
    )
    .send()
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await, rpc_result("9", r#"{"content":[]}"#));
    let m = scrape(gw.admin).await;
    assert_eq!(protocol_errors(&m), 3.0, "{m}");
    assert_eq!(tools_calls(&m, "upstream_invalid"), 3.0, "{m}");
    assert_eq!(tools_calls(&m, "ok"), 1.0, "{m}");
}

/// An SSE answer that ends without the response to the request (after a notification and a
/// partial event) gets a `-32603` event for the request, naming the upstream and what was
/// wrong, before the stream ends, as an oversized event does; counted as a protocol error. On
/// the old code the stream just ended: the client had neither an answer nor an error (break-edge
/// F3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_answer_that_ends_unanswered_gets_an_error_event() {
    let up = Upstream::start(misbehaving).await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let r = Req::mcp_post(
        &gw.url("/mcp"),
        rpc(
            "5",
            "tools/call",
            r#"{"name":"truncated_sse","arguments":{}}"#,
        ),
    )
    .send()
    .await;
    assert_eq!(r.status(), 200);
    let (events, raw) = all_events(r).await;
    let data: Vec<Value> = events
        .iter()
        .filter_map(|(_, d)| d.as_deref().map(|d| parse_json(d.as_bytes())))
        .collect();
    assert_eq!(data.len(), 2, "the notification, then the error: {raw}");
    assert_eq!(data[0]["params"]["data"], json!("first"), "{raw}");
    let err = &data[1];
    assert_eq!(
        (err["id"].clone(), err_code(err)),
        (json!(5), -32603),
        "{raw}"
    );
    let message = err_message(err);
    assert!(
        message.contains("upstream `default` sent an invalid response")
            && message.contains("without a response"),
        "{raw}"
    );
    let m = scrape(gw.admin).await;
    assert_eq!(protocol_errors(&m), 1.0, "{m}");
}

/// Two responses to one request on an SSE stream: the first is the answer and passes, so does
/// the notification after it; the second is not passed on (counted as a protocol error). On the
/// old code the client got both (break-edge F4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_response_on_a_stream_is_not_passed_on() {
    let up = Upstream::start(misbehaving).await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let r = Req::mcp_post(
        &gw.url("/mcp"),
        rpc("6", "tools/call", r#"{"name":"twice","arguments":{}}"#),
    )
    .send()
    .await;
    assert_eq!(r.status(), 200);
    let (events, raw) = all_events(r).await;
    let data: Vec<String> = events.into_iter().filter_map(|(_, d)| d).collect();
    assert_eq!(
        data,
        vec![
            rpc_result("6", r#"{"content":[{"type":"text","text":"first"}]}"#),
            LOG_FIRST.to_string(),
        ],
        "{raw}"
    );
    let m = scrape(gw.admin).await;
    assert_eq!(protocol_errors(&m), 1.0, "{m}");
}
