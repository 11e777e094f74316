//! Bounds on what an upstream can make taskgate hold or wait for (issue 10): `max_message_bytes`
//! on JSON answers and SSE lines/events, the `timeout_ms` deadline on a `tasks/cancel` answered
//! over an SSE stream that never delivers the answer (the single flight must not be pinned), and
//! the `max_message_bytes` config key.

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

/// Every test ends within this, whatever the gateway does.
const BOUND: Duration = Duration::from_secs(6);

fn oversize(m: &str, kind: &str) -> f64 {
    metric(m, "taskgate_upstream_oversize_total", &[("kind", kind)])
}

/// A JSON answer of unknown length that keeps coming (1500 bytes, then the upstream holds the
/// body open): with `max_message_bytes = 1024` the client gets, well before `timeout_ms`, a
/// JSON-RPC error under its id naming the limit; the metric counts it. (Before the fix the body
/// was collected without limit: here the client waited for the 30 s upstream timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_json_answer_is_a_jsonrpc_error_naming_the_limit() {
    let up = Upstream::start(|req| match req.rpc_method().as_deref() {
        Some("tools/call") => {
            let head = format!(
                r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[{{"type":"text","text":""#,
                req.rpc_id_json()
            );
            ScriptedResponse::sse(vec![
                SseStep::Raw(head),
                SseStep::Raw("x".repeat(1500)),
                SseStep::HoldOpen,
            ])
            .set_header("content-type", "application/json")
        }
        _ => mcp_handler(req),
    })
    .await;
    let gw = GatewayBuilder::single(&up.url())
        .upstream_opt("max_message_bytes = 1024")
        .start()
        .await;
    let admin = gw.admin;
    let started = Instant::now();
    let v = tokio::time::timeout(BOUND, async {
        let r = Req::mcp_post(
            &gw.url("/mcp"),
            rpc("\"big\"", "tools/call", r#"{"name":"t","arguments":{}}"#),
        )
        .send()
        .await;
        r.json().await
    })
    .await
    .expect("the oversize JSON answer must end the exchange (it hung)");
    println!("oversize json: answered in {:?}: {v}", started.elapsed());
    assert_eq!(v["id"], json!("big"), "{v}");
    assert_eq!(err_code(&v), -32603, "{v}");
    assert!(
        err_message(&v).contains("max_message_bytes=1024"),
        "names the limit: {v}"
    );
    let m = scrape(admin).await;
    assert_eq!(oversize(&m, "json"), 1.0);
    assert_eq!(oversize(&m, "sse_event"), 0.0);

    // A small answer still passes.
    let r = Req::mcp_post(&gw.url("/mcp"), rpc("2", "tools/list", "{}"))
        .send()
        .await;
    let v = r.json().await;
    assert_eq!(v["result"]["echo"], json!("tools/list"), "{v}");
}

/// An SSE answer whose second event never ends (a 3000-byte `data:` line without newline, then
/// the stream stays open): the client gets the first event, then a JSON-RPC error event under
/// its id naming the limit, then the end of the stream; the upstream connection is dropped and
/// the metric counts it, and the request is counted `outcome="upstream_invalid"` (break-edge
/// F11: it was `ok`). (Before the fix the decoder buffered without limit and the client saw
/// nothing after the first event.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_sse_event_ends_stream_with_error_event() {
    let up = Upstream::start(|req| match req.rpc_method().as_deref() {
        Some("tools/call") => ScriptedResponse::sse(vec![
            ev().data(r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"first"}}"#)
                .into(),
            SseStep::Raw(format!("data: {}", "y".repeat(3000))),
            SseStep::HoldOpen,
        ]),
        _ => mcp_handler(req),
    })
    .await;
    let gw = GatewayBuilder::single(&up.url())
        .upstream_opt("max_message_bytes = 1024")
        .start()
        .await;
    let r = Req::mcp_post(
        &gw.url("/mcp"),
        rpc("7", "tools/call", r#"{"name":"t","arguments":{}}"#),
    )
    .send()
    .await;
    assert_eq!(r.status(), 200);
    let mut sse = r.sse();
    let within = Duration::from_secs(3);
    let first = sse.next_event(within).await;
    assert_eq!(first.json()["params"]["data"], json!("first"));
    let err = match sse.next(within).await {
        Next::Item(SseItem::Event(e)) => e.json(),
        other => panic!("expected an error event after the oversize event, got {other:?}"),
    };
    println!("oversize sse: error event {err}");
    assert_eq!(err["id"], json!(7), "{err}");
    assert_eq!(err_code(&err), -32603, "{err}");
    assert!(
        err_message(&err).contains("max_message_bytes=1024"),
        "{err}"
    );
    loop {
        match sse.next(within).await {
            Next::End => break,
            Next::Item(SseItem::Comment(_)) => continue,
            other => panic!("the stream must end after the error event, got {other:?}"),
        }
    }
    assert!(
        up.wait_for_sse_disconnects(1, within).await,
        "the upstream stream is released"
    );
    let m = scrape(gw.admin).await;
    assert_eq!(oversize(&m, "sse_event"), 1.0);
    // break-edge F11: the request is counted as what it was, an invalid answer, not `ok`.
    assert_eq!(outcome(&m, "upstream_invalid"), 1.0, "{m}");
    assert_eq!(outcome(&m, "ok"), 0.0, "{m}");
}

/// `taskgate_requests_total` of `tools/call` with `outcome`.
fn outcome(m: &str, outcome: &str) -> f64 {
    metric(
        m,
        "taskgate_requests_total",
        &[("method", "tools/call"), ("outcome", outcome)],
    )
}

/// `max_message_bytes` below 1024 is refused naming the key; 1024 is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_message_bytes_below_1024_is_refused() {
    let err = match GatewayBuilder::single(&dead_url())
        .upstream_opt("max_message_bytes = 1023")
        .try_start()
        .await
    {
        Ok(_) => panic!("max_message_bytes = 1023 must be refused"),
        Err(e) => e,
    };
    assert!(
        err.contains("max_message_bytes") && err.contains("between 1024 and"),
        "{err}"
    );
    let gw = GatewayBuilder::single(&dead_url())
        .upstream_opt("max_message_bytes = 1024")
        .try_start()
        .await
        .expect("1024 is accepted");
    gw.shutdown().await;
}

/// A task server whose `tasks/cancel` answer is an SSE stream that never delivers the answer.
fn never_answering_cancel(req: &RecordedRequest) -> ScriptedResponse {
    let id = req.rpc_id_json();
    match req.rpc_method().as_deref() {
        Some("initialize") => ScriptedResponse::json(rpc_result(
            &id,
            &json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {"tools": {}, "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}},
                "serverInfo": {"name": "stuck-cancel", "version": "1"},
            })
            .to_string(),
        ))
        .header("mcp-session-id", "sess-1"),
        Some("tools/call") => {
            let now = format_rfc3339_ms(now_ms());
            ScriptedResponse::json(rpc_result(
                &id,
                &json!({"task": {"taskId": "t-1", "status": "working", "createdAt": now,
                    "lastUpdatedAt": now, "ttl": 60000, "pollInterval": 100}})
                .to_string(),
            ))
        }
        Some("tasks/cancel") => ScriptedResponse::sse(vec![
            ev().comment("working on it").into(),
            SseStep::HoldOpen,
        ]),
        _ => mcp_handler(req),
    }
}

/// Two concurrent tasks/cancel for a task whose upstream opens an SSE answer and never sends the
/// response: both callers get `-32603 upstream did not answer tasks/cancel within 1000 ms` within
/// the deadline (plus slack), the upstream saw exactly one tasks/cancel (the second joined the
/// flight), and the flight is cleared: a later cancel is sent upstream again. (Before the fix
/// both callers waited forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_answered_by_silent_sse_stream_times_out_for_every_waiter() {
    let up = Upstream::start(never_answering_cancel).await;
    let cfg = TgConfig::new(&up.url());
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // [[upstream]] is the last table of the generated TOML.
    let text = cfg.to_toml(store.to_str().unwrap()) + "timeout_ms = 1000\n";
    let config = taskgate::config::Config::from_toml_str(&text).unwrap();
    let running = taskgate::gateway::start(config).await.unwrap();
    let tg = Tg {
        gw: running.gateway_addr,
        admin: running.admin_addr,
        metrics: running.metrics.clone(),
        registry: running.registry.clone(),
        running: Some(running),
        dir,
    };
    let mut c = tg.client();
    c.initialize().await;
    let task_id = c.create_task("1").await;
    assert_eq!(task_id, "t-1");

    let count_cancels = || {
        up.requests()
            .iter()
            .filter(|r| r.rpc_method().as_deref() == Some("tasks/cancel"))
            .count()
    };
    let started = Instant::now();
    let first = {
        let (c, t) = (c.clone(), task_id.clone());
        tokio::spawn(async move { c.cancel("\"a\"", &t).await })
    };
    // The second cancel is sent once the first one is upstream (its flight is open). Waited
    // for by method: a count read after the spawn could already include the first cancel, and
    // the wait for one more request then timed out (3 of 30 runs failed so).
    assert!(
        up.wait_for_method("tasks/cancel", 1, STEP).await,
        "the first cancel reaches the upstream"
    );
    assert_eq!(count_cancels(), 1);
    let second = {
        let (c, t) = (c.clone(), task_id.clone());
        tokio::spawn(async move { c.cancel("\"b\"", &t).await })
    };
    let (a, b) = tokio::time::timeout(BOUND, async { (first.await, second.await) })
        .await
        .expect("both cancels must end within the deadline (they hung on the flight)");
    let (a, b): (Value, Value) = (a.unwrap(), b.unwrap());
    let elapsed = started.elapsed();
    println!("silent cancel stream: both answered after {elapsed:?}: {a} / {b}");
    for (v, id) in [(&a, "a"), (&b, "b")] {
        assert_eq!(v["id"], json!(id), "{v}");
        assert_eq!(err_code(v), -32603, "{v}");
        assert_eq!(
            err_message(v),
            "upstream did not answer tasks/cancel within 1000 ms",
            "{v}"
        );
    }
    assert!(elapsed >= Duration::from_millis(900), "{elapsed:?}");
    assert_eq!(
        count_cancels(),
        1,
        "the upstream saw exactly one tasks/cancel"
    );
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_cancel_requests_total",
            &[("outcome", "deduplicated")]
        ),
        1.0
    );
    assert!(
        up.wait_for_sse_disconnects(1, Duration::from_secs(3)).await,
        "the stuck upstream stream is released"
    );

    // The flight was cleared: a later cancel tries again upstream.
    let v = tokio::time::timeout(BOUND, c.cancel("3", &task_id))
        .await
        .expect("a later cancel ends too");
    assert_eq!(err_code(&v), -32603, "{v}");
    assert_eq!(count_cancels(), 2);
}

/// Review 17 #10: an oversized event after the answer ends the stream; the transport's error
/// event for it, a second response to the request, is not passed on, and is counted once as a
/// protocol error (before: once where it was made and again as a second response).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_event_after_the_answer_is_counted_once() {
    let up = Upstream::start(|req| match req.rpc_method().as_deref() {
        Some("tools/call") => ScriptedResponse::sse(vec![
            ev().data(&rpc_result(&req.rpc_id_json(), r#"{"content":[]}"#))
                .into(),
            SseStep::Raw(format!("data: {}", "y".repeat(3000))),
            SseStep::HoldOpen,
        ]),
        _ => mcp_handler(req),
    })
    .await;
    let gw = GatewayBuilder::single(&up.url())
        .upstream_opt("max_message_bytes = 1024")
        .start()
        .await;
    let r = Req::mcp_post(
        &gw.url("/mcp"),
        rpc("8", "tools/call", r#"{"name":"t","arguments":{}}"#),
    )
    .header("mcp-session-id", "s")
    .send()
    .await;
    assert_eq!(r.status(), 200);
    let mut sse = r.sse();
    let within = Duration::from_secs(3);
    let answer = sse.next_event(within).await.json();
    assert_eq!(answer["id"], json!(8), "{answer}");
    assert!(answer.get("result").is_some(), "{answer}");
    loop {
        match sse.next(within).await {
            Next::End => break,
            Next::Item(SseItem::Comment(_)) => continue,
            other => panic!("nothing after the answer, got {other:?}"),
        }
    }
    let protocol = |m: &str| {
        metric(
            m,
            "taskgate_upstream_errors_total",
            &[("upstream", "default"), ("kind", "protocol")],
        )
    };
    let counted = eventually(within, || async {
        let m = scrape(gw.admin).await;
        (oversize(&m, "sse_event") == 1.0).then_some(m)
    })
    .await
    .expect("the oversized event is counted");
    assert_eq!(protocol(&counted), 1.0, "counted once");
    assert_eq!(
        outcome(&counted, "ok"),
        1.0,
        "the client got its answer: {counted}"
    );
    assert_eq!(outcome(&counted, "upstream_invalid"), 0.0, "{counted}");
}
