//! Defects found under attack (issue 16): bodies validated whole (item 5), HTTP edge details
//! (item 8), upstream SSE resets (item 4), media types (item 9), the negotiated protocol version
//! (item 10) and upstream session ids (item 11).

use crate::common::*;
use hyper::body::Incoming;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Writes `request` on a new connection and returns what arrives until the peer closes, a
/// complete response head is followed by `Content-Length` bytes, or `within` passes.
async fn raw(addr: SocketAddr, request: &[u8], within: Duration) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let _ = s.write_all(request).await;
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .to_ascii_lowercase()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok());
            if len.is_some_and(|n| buf.len() >= end + 4 + n) {
                return text;
            }
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Err(_) => return format!("TIMEOUT after {within:?}: {text}"),
            Ok(Ok(0)) | Ok(Err(_)) => return text,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn status_line(resp: &str) -> &str {
    resp.lines().next().unwrap_or("")
}

async fn post_bytes(gw: &Gateway, body: Vec<u8>) -> (u16, Value) {
    let r = Req::mcp_post(&gw.url("/mcp"), body).send().await;
    let status = r.status();
    (status, r.json().await)
}

// ---------------------------------------------------------------------------------------------
// Item 5: the whole body is validated
// ---------------------------------------------------------------------------------------------

/// Invalid UTF-8 inside `params` is not JSON: 400 `-32700`, nothing forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_inside_params_is_400_parse_error() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let mut body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"#.to_vec();
    body.extend_from_slice(b"\xff\xfe");
    body.extend_from_slice(br#"","arguments":{}}}"#);
    let (status, v) = post_bytes(&gw, body).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(err_code(&v), -32700, "{v}");
    assert!(err_message(&v).contains("UTF-8"), "{v}");
    assert_eq!(up.count(), 0, "nothing forwarded");
}

/// 100,000-deep nesting inside `params` (and 200 levels, over the limit of 128) is refused with
/// 400 `-32700` naming the nesting; 100 levels pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_nesting_inside_params_is_400_parse_error() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let nested = |depth: usize| {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"a","arguments":{{"x":{}1{}}}}}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
        .into_bytes()
    };
    for depth in [100_000, 200] {
        let (status, v) = post_bytes(&gw, nested(depth)).await;
        assert_eq!(status, 400, "depth {depth}: {v}");
        assert_eq!(err_code(&v), -32700, "depth {depth}: {v}");
        assert!(err_message(&v).contains("nest"), "{v}");
    }
    assert_eq!(up.count(), 0, "nothing forwarded");
    let (status, v) = post_bytes(&gw, nested(100)).await;
    assert_eq!(status, 200, "100 levels are fine: {v}");
}

// ---------------------------------------------------------------------------------------------
// Item 8: HTTP edge details
// ---------------------------------------------------------------------------------------------

/// `Expect: 100-continue` with a `Content-Length` over `max_body_bytes` gets 413 at once, never
/// `100 Continue`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_over_the_limit_gets_413_not_100() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url())
        .gateway_opt("max_body_bytes = 1024")
        .start()
        .await;
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: {ACCEPT_BOTH}\r\nContent-Length: 2048\r\nExpect: 100-continue\r\n\r\n",
        gw.addr
    );
    let resp = raw(gw.addr, head.as_bytes(), STEP).await;
    assert!(status_line(&resp).contains(" 413 "), "{resp}");
    assert_eq!(up.count(), 0);
}

/// A request without `Host`, or with two, gets 400 (RFC 9112 section 3.2) and is not forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_duplicate_host_is_400() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let body = rpc("1", "ping", "{}");
    let rest = format!(
        "Content-Type: application/json\r\nAccept: {ACCEPT_BOTH}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let no_host = format!("POST /mcp HTTP/1.1\r\n{rest}");
    let two_hosts = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nHost: evil.example\r\n{rest}",
        gw.addr
    );
    for req in [no_host, two_hosts] {
        let resp = raw(gw.addr, req.as_bytes(), STEP).await;
        assert!(status_line(&resp).contains(" 400 "), "{req}\n---\n{resp}");
    }
    assert_eq!(up.count(), 0);
}

/// A header-phase slowloris (part of a request head, then nothing) gets `408 Request Timeout`
/// with `Connection: close` once the header timeout (`request_timeout_ms`) passes, and the
/// connection closes; nothing is forwarded. RFC 9110 section 15.5.9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_phase_slowloris_gets_408() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url())
        .gateway_opt("request_timeout_ms = 300")
        .start()
        .await;
    let partial = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: app",
        gw.addr
    );
    let resp = raw(gw.addr, partial.as_bytes(), STEP).await;
    assert!(status_line(&resp).contains(" 408 "), "{resp}");
    assert!(
        resp.to_ascii_lowercase().contains("connection: close"),
        "{resp}"
    );
    assert_eq!(up.count(), 0);
}

/// A keep-alive connection that was answered and then stays silent is closed without any
/// unsolicited response: a client reusing it must never read a 408 as the answer to its next
/// request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connection_gets_no_unsolicited_408() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url())
        .gateway_opt("request_timeout_ms = 300")
        .start()
        .await;
    let body = rpc("1", "ping", "{}");
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: {ACCEPT_BOTH}\r\nContent-Length: {}\r\n\r\n{body}",
        gw.addr,
        body.len()
    );
    let mut s = TcpStream::connect(gw.addr).await.expect("connect");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    // Read the answer, then keep reading until the gateway closes the idle connection.
    let closed = tokio::time::timeout(STEP, async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    if closed.is_ok() {
        assert_eq!(text.matches("HTTP/1.1 ").count(), 1, "{text}");
    }
}

// ---------------------------------------------------------------------------------------------
// Item 4: a reset upstream SSE answer
// ---------------------------------------------------------------------------------------------

/// An upstream that answers every POST with a chunked SSE body carrying one event and then
/// closes the connection without the last chunk.
async fn resetting_upstream() -> (String, tokio::task::JoinHandle<()>) {
    scripted_sse_upstream(1, "", Duration::from_millis(50)).await
}

/// An upstream that answers every POST with a chunked SSE body of `events` progress events
/// followed by the raw bytes `tail`, all in one write, then waits `hold` and closes the
/// connection (no last chunk).
async fn scripted_sse_upstream(
    events: usize,
    tail: &'static str,
    hold: Duration,
) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                let mut out = String::from(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
                );
                for n in 1..=events {
                    let event = format!("data: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{\"progressToken\":1,\"progress\":{n}}}}}\n\n");
                    out.push_str(&format!("{:x}\r\n{event}\r\n", event.len()));
                }
                out.push_str(tail);
                let _ = s.write_all(out.as_bytes()).await;
                let _ = s.flush().await;
                tokio::time::sleep(hold).await;
                drop(s);
            });
        }
    });
    (format!("http://{addr}/mcp"), task)
}

/// What a client read of a streamed answer: the bytes, and how the stream ended.
async fn read_to_end(body: Incoming) -> (String, String) {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut seen = Vec::new();
    let ended_with = loop {
        match tokio::time::timeout(STEP, body.frame())
            .await
            .expect("stream ends in time")
        {
            Some(Ok(f)) => seen.extend_from_slice(&f.into_data().unwrap_or_default()),
            Some(Err(e)) => break format!("error: {e}"),
            None => break "clean end".to_string(),
        }
    };
    (String::from_utf8_lossy(&seen).into_owned(), ended_with)
}

/// Events that arrived whole reach the client even when the upstream's framing breaks in the
/// same read (a chunk-size line that is not hex): the client gets the 200, the events, then a
/// transport error. (It used to get no response at all: the abort came before hyper flushed
/// the head and the events it had buffered.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_before_broken_framing_in_the_same_read_reach_the_client() {
    for tail in ["zz\r\n", ";x\r\n", "5\r\nabcdeXY"] {
        let (url, _task) = scripted_sse_upstream(2, tail, Duration::from_millis(200)).await;
        let gw = GatewayBuilder::single(&url).start().await;
        let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "tools/call", r#"{"name":"x"}"#))
            .try_send()
            .await
            .unwrap_or_else(|e| panic!("tail {tail:?}: no response: {e}"));
        assert_eq!(r.status(), 200, "tail {tail:?}");
        let (seen, ended_with) = read_to_end(r.body).await;
        assert!(
            seen.contains("\"progress\":1") && seen.contains("\"progress\":2"),
            "tail {tail:?}: both events relayed: {seen:?}"
        );
        assert!(
            ended_with.starts_with("error"),
            "tail {tail:?}: ended with {ended_with}"
        );
    }
}

/// The client's stream is aborted (a transport error, no clean end), the truncation is
/// counted in `taskgate_upstream_errors_total{kind="stream_reset"}`, and the request is counted
/// `outcome="upstream_invalid"`, as a JSON answer cut short is (break-edge F11: it was counted
/// `ok`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_upstream_sse_aborts_the_clients_stream() {
    let (url, _task) = resetting_upstream().await;
    let gw = GatewayBuilder::single(&url).start().await;
    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "tools/call", r#"{"name":"x"}"#))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let (seen, ended_with) = read_to_end(r.body).await;
    assert!(
        seen.contains("progress"),
        "the event before the reset is relayed"
    );
    assert!(ended_with.starts_with("error"), "ended with {ended_with}");
    let metrics = Req::get(&gw.admin_url("/metrics"))
        .send()
        .await
        .text()
        .await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("taskgate_upstream_errors_total")
                && l.contains("kind=\"stream_reset\"")
                && l.ends_with(" 1")),
        "counted: {}",
        metrics
            .lines()
            .filter(|l| l.contains("upstream_errors"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let outcome = |o: &str| {
        metric(
            &metrics,
            "taskgate_requests_total",
            &[("method", "tools/call"), ("outcome", o)],
        )
    };
    assert_eq!(outcome("upstream_invalid"), 1.0, "{metrics}");
    assert_eq!(outcome("ok"), 0.0, "{metrics}");
}

/// A stream whose framing breaks before its first event still gives the client the 200 and a
/// transport error (not an empty reply), so the client can tell a cut stream from a dead gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_broken_before_any_event_is_a_cut_stream() {
    let (url, _task) = scripted_sse_upstream(0, "zz\r\n", Duration::from_millis(200)).await;
    let gw = GatewayBuilder::single(&url).start().await;
    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "tools/call", r#"{"name":"x"}"#))
        .try_send()
        .await
        .unwrap_or_else(|e| panic!("no response: {e}"));
    assert_eq!(r.status(), 200);
    let (seen, ended_with) = read_to_end(r.body).await;
    assert_eq!(seen, "");
    assert!(ended_with.starts_with("error"), "ended with {ended_with}");
}

// ---------------------------------------------------------------------------------------------
// Item 9: media types are case-insensitive
// ---------------------------------------------------------------------------------------------

/// `Text/Event-Stream; Charset=UTF-8` is read as SSE: the events pass as they come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_type_of_an_sse_answer_is_case_insensitive() {
    let gate = Gate::new();
    let g = gate.clone();
    let up = Upstream::start(move |req| {
        if req.rpc_method().as_deref() != Some("tools/call") {
            return mcp_handler(req);
        }
        ScriptedResponse::sse(vec![
            ev().data(&server_note(1)).into(),
            SseStep::Wait(g.clone()),
            ev().data(&rpc_result(&req.rpc_id_json(), "{}")).into(),
        ])
        .set_header("content-type", "Text/Event-Stream; Charset=UTF-8")
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "tools/call", r#"{"name":"x"}"#))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let mut sse = r.sse();
    let first = sse.next_event(STEP).await;
    assert_eq!(
        first.json()["method"],
        json!("notifications/message"),
        "relayed before the end"
    );
    gate.open();
    let answer = sse.next_event(STEP).await;
    assert_eq!(answer.json()["id"], json!(1));
}

/// An SSE answer declaring a charset other than UTF-8 is refused with 502 naming the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_answer_in_another_charset_is_502() {
    let up = Upstream::start(|req| {
        if req.rpc_method().as_deref() != Some("tools/call") {
            return mcp_handler(req);
        }
        ScriptedResponse::sse(vec![ev()
            .data(&rpc_result(&req.rpc_id_json(), "{}"))
            .into()])
        .set_header("content-type", "text/event-stream; charset=iso-8859-1")
    })
    .await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let r = Req::mcp_post(&gw.url("/mcp"), rpc("1", "tools/call", r#"{"name":"x"}"#))
        .send()
        .await;
    assert_eq!(r.status(), 502);
    let v = r.json().await;
    assert!(
        err_message(&v).contains("`default`") && err_message(&v).contains("charset"),
        "{v}"
    );
}

// ---------------------------------------------------------------------------------------------
// Items 10 and 11: protocol version and upstream session ids
// ---------------------------------------------------------------------------------------------

/// A request on a session without `MCP-Protocol-Version` goes upstream with the version the
/// session negotiated; one with the header keeps the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiated_protocol_version_is_sent_when_the_client_left_it_out() {
    let up = Upstream::mcp().await;
    let gw = GatewayBuilder::single(&up.url()).start().await;
    let sid = initialize(&gw, "/mcp").await;
    let r = Req::mcp_post(&gw.url("/mcp"), rpc("2", "tools/list", "{}"))
        .header("mcp-session-id", &sid)
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        up.last().header("mcp-protocol-version").as_deref(),
        Some(PROTOCOL_VERSION)
    );
    let r = Req::mcp_post(&gw.url("/mcp"), rpc("3", "tools/list", "{}"))
        .header("mcp-session-id", &sid)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        up.last().header("mcp-protocol-version").as_deref(),
        Some("2025-06-18")
    );
}

/// An upstream session id with a space or a control character is refused: 502 naming the
/// upstream, and the id never reaches the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_session_id_outside_visible_ascii_is_502() {
    for bad in ["has space", "tab\there"] {
        let bad = bad.to_string();
        let up = Upstream::start(move |req| {
            let r = mcp_handler(req);
            if req.rpc_method().as_deref() == Some("initialize") {
                r.set_header("mcp-session-id", &bad)
            } else {
                r
            }
        })
        .await;
        let gw = GatewayBuilder::single(&up.url()).start().await;
        let r = Req::mcp_post(&gw.url("/mcp"), initialize_body("1"))
            .send()
            .await;
        assert_eq!(r.status(), 502);
        assert_eq!(r.header("mcp-session-id"), None);
        let v = r.json().await;
        assert!(err_message(&v).contains("`default`"), "{v}");
        assert!(err_message(&v).contains("Mcp-Session-Id"), "{v}");
    }
}
