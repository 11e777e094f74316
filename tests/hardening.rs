//! Findings of a cold review ("Hardening from a cold review"), one test each. Every test fails
//! on the code before that commit (a panic, a hang, a wrong routing or status) and passes now.
//!
//! The scripted upstreams come from tests/common; [`Evil`] below is a
//! small task server that can answer what a well-behaved one would not (a number as the
//! `tasks/cancel` result, one taskId for every creation, a skewed `createdAt`, a `tasks/result`
//! that never answers, creation errors).

use crate::common::*;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// =============================================================================================
// Helpers
// =============================================================================================

/// How the hostile task server behaves.
#[derive(Clone, Default)]
struct Evil {
    /// Every creation gets this taskId (default `task-N`).
    fixed_task_id: Option<String>,
    /// `createdAt` = now minus this many ms (default now).
    created_ago_ms: u64,
    /// `tasks/cancel` is answered with this `result` (default a cancelled Task).
    cancel_result: Option<Value>,
    /// `tasks/result` is never answered (not even headers).
    result_hangs: bool,
}

/// Starts the hostile server. `initialize` hands out `sess-N`; a task-augmented `tools/call`
/// whose `arguments.fail` is true gets a JSON-RPC error (no task), otherwise a CreateTaskResult.
async fn evil(e: Evil) -> Upstream {
    let sessions = Arc::new(AtomicUsize::new(0));
    let tasks = Arc::new(AtomicUsize::new(0));
    Upstream::start(move |req| {
        if req.method != "POST" {
            return ScriptedResponse::status(405, None, "");
        }
        let Ok(v) = serde_json::from_slice::<Value>(&req.body) else {
            return ScriptedResponse::status(400, Some("text/plain"), "bad json");
        };
        let (Some(method), Some(_)) = (v.get("method").and_then(Value::as_str), v.get("id"))
        else {
            return ScriptedResponse::accepted();
        };
        let task_id_param = v
            .pointer("/params/taskId")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let task = |task_id: &str, status: &str| {
            let now = now_ms();
            json!({
                "taskId": task_id,
                "status": status,
                "createdAt": format_rfc3339_ms(now.saturating_sub(e.created_ago_ms)),
                "lastUpdatedAt": format_rfc3339_ms(now),
                "ttl": 60000,
                "pollInterval": 100,
            })
        };
        match method {
            "initialize" => {
                let n = sessions.fetch_add(1, Ordering::SeqCst) + 1;
                let result = json!({
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {"tools": {}, "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}},
                    "serverInfo": {"name": "evil", "version": "1"},
                });
                ScriptedResponse::result_for(req, &result.to_string())
                    .header("mcp-session-id", &format!("sess-{n}"))
            }
            "tools/call" if v.pointer("/params/task").is_some() => {
                if v.pointer("/params/arguments/fail") == Some(&Value::Bool(true)) {
                    return ScriptedResponse::json(format!(
                        r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32000,"message":"tool refused"}}}}"#,
                        req.rpc_id_json()
                    ));
                }
                let n = tasks.fetch_add(1, Ordering::SeqCst) + 1;
                let id = e.fixed_task_id.clone().unwrap_or(format!("task-{n}"));
                ScriptedResponse::result_for(req, &json!({ "task": task(&id, "working") }).to_string())
            }
            "tasks/get" => ScriptedResponse::result_for(req, &task(&task_id_param, "working").to_string()),
            "tasks/cancel" => {
                let result = e
                    .cancel_result
                    .clone()
                    .unwrap_or_else(|| task(&task_id_param, "cancelled"));
                ScriptedResponse::result_for(req, &result.to_string())
            }
            "tasks/result" if e.result_hangs => ScriptedResponse::hang(),
            m => ScriptedResponse::result_for(req, &json!({ "echo": m }).to_string()),
        }
    })
    .await
}

/// A raw HTTP/1.1 response read off a socket.
#[derive(Debug)]
struct RawResp {
    status: u16,
    head: String,
    body: String,
    /// From the end of the write to the end of the response.
    elapsed: Duration,
}

/// Writes `request` on a new connection to `addr` and reads one response (by Content-Length,
/// chunked end, or EOF); panics when none is complete within `within`.
async fn raw_exchange(addr: SocketAddr, request: &[u8], within: Duration) -> RawResp {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    // The server may answer (and close) before it read everything: ignore write errors.
    let _ = s.write_all(request).await;
    let started = Instant::now();
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(r) = complete_response(&buf, started) {
            return r;
        }
        let mut chunk = [0u8; 16384];
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Err(_) => panic!(
                "no complete response within {within:?}; got {:?}",
                String::from_utf8_lossy(&buf)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => {
                return complete_response(&buf, started)
                    .or_else(|| partial_response(&buf, started))
                    .unwrap_or_else(|| {
                        panic!(
                            "connection closed without a response; got {:?}",
                            String::from_utf8_lossy(&buf)
                        )
                    })
            }
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn split_head(buf: &[u8]) -> Option<(String, &[u8])> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    Some((
        String::from_utf8_lossy(&buf[..end]).into_owned(),
        &buf[end + 4..],
    ))
}

fn status_of(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP status line: {head:?}"))
}

fn complete_response(buf: &[u8], started: Instant) -> Option<RawResp> {
    let (head, body) = split_head(buf)?;
    let lower = head.to_ascii_lowercase();
    let length = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let done = match length {
        Some(n) => body.len() >= n,
        None if lower.contains("transfer-encoding: chunked") => body.ends_with(b"0\r\n\r\n"),
        None => false,
    };
    done.then(|| RawResp {
        status: status_of(&head),
        body: String::from_utf8_lossy(body).into_owned(),
        head,
        elapsed: started.elapsed(),
    })
}

fn partial_response(buf: &[u8], started: Instant) -> Option<RawResp> {
    let (head, body) = split_head(buf)?;
    Some(RawResp {
        status: status_of(&head),
        body: String::from_utf8_lossy(body).into_owned(),
        head,
        elapsed: started.elapsed(),
    })
}

/// A POST of `body` to `path` as an MCP client writes it, with extra header lines.
fn raw_post(addr: SocketAddr, path: &str, extra: &[String], body: &str) -> Vec<u8> {
    let mut h = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: {ACCEPT_BOTH}\r\nMcp-Protocol-Version: {PROTOCOL_VERSION}\r\nContent-Length: {}\r\n",
        body.len()
    );
    for l in extra {
        h.push_str(l);
        h.push_str("\r\n");
    }
    h.push_str("\r\n");
    h.push_str(body);
    h.into_bytes()
}

/// Sends a request through `c` and returns the JSON-RPC message answering it; fails (instead of
/// panicking deep in the client) when taskgate dropped the connection.
async fn rpc_or_fail(c: &Client, body: String) -> Value {
    let r = c
        .req(body.clone())
        .try_send()
        .await
        .unwrap_or_else(|e| panic!("no HTTP answer to {body} (did taskgate panic?): {e}"));
    assert_eq!(r.status(), 200, "HTTP status for {body}");
    let sse = r
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"));
    if !sse {
        return r.json().await;
    }
    let mut reader = r.sse();
    loop {
        let v = reader.next_event(STEP).await.json();
        if v.get("id").is_some() && (v.get("result").is_some() || v.get("error").is_some()) {
            return v;
        }
    }
}

/// A task-augmented `tools/call` body with `task_json` spliced in verbatim (the key too).
fn task_call(id_json: &str, arguments: &str, task_json: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id_json},"method":"tools/call","params":{{"name":"slow","arguments":{arguments},{task_json}}}}}"#
    )
}

fn upstream_errors(metrics: &str) -> f64 {
    metric(metrics, "taskgate_upstream_errors_total", &[])
}

// =============================================================================================
// 1. Notifications naming request methods; null ids
// =============================================================================================

/// A notification (no id) whose method names a request taskgate handles (tasks/*, initialize,
/// a task-augmented tools/call) is an ordinary notification: 202, forwarded as it came, and the
/// session keeps working (before: the layers expected an id and the connection's task panicked).
/// `"id": null` on a request is refused at the edge with 400 / -32600 naming null.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_naming_request_methods_are_forwarded_and_null_ids_refused() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;

    let cases = [
        ("tasks/get", json!({"taskId": "task-1"})),
        ("tasks/result", json!({"taskId": "task-1"})),
        ("tasks/cancel", json!({"taskId": "task-1"})),
        ("tasks/list", json!({})),
        (
            "initialize",
            json!({"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}),
        ),
        (
            "tools/call",
            json!({"name": "slow", "arguments": {}, "task": {"ttl": 1000}}),
        ),
    ];
    for (i, (method, params)) in cases.iter().enumerate() {
        let body = notification(method, &params.to_string());
        let before = up.up.count();
        let r = c.req(body.clone()).try_send().await.unwrap_or_else(|e| {
            panic!("notification {method}: no HTTP answer (did taskgate panic?): {e}")
        });
        assert_eq!(r.status(), 202, "notification {method}");
        let _ = r.bytes().await;
        assert_eq!(
            up.up.count(),
            before + 1,
            "notification {method} is forwarded"
        );
        let got = up.up.last();
        assert_eq!(got.body_str(), body, "forwarded unchanged");
        assert!(got.rpc_id().is_none());
        assert_eq!(got.header("mcp-session-id").as_deref(), Some("sess-1"));

        // The same session still answers requests.
        let v = rpc_or_fail(&c, rpc(&format!("\"after-{i}\""), "ping", "{}")).await;
        assert_eq!(
            v["result"]["echo"],
            json!("ping"),
            "after notification {method}"
        );
    }
    assert_eq!(up.count("tools/call"), 1);
    assert!(tg
        .registry
        .store()
        .get("default", "task-1")
        .unwrap()
        .is_none());

    // "id": null with a method: a request with an invalid id, not a notification.
    let before = up.up.count();
    let body = r#"{"jsonrpc":"2.0","id":null,"method":"tasks/get","params":{"taskId":"task-1"}}"#;
    let r = c
        .req(body)
        .try_send()
        .await
        .unwrap_or_else(|e| panic!("id null: no HTTP answer (did taskgate panic?): {e}"));
    assert_eq!(r.status(), 400);
    let v = r.json().await;
    assert_eq!(err_code(&v), -32600, "{v}");
    assert!(err_message(&v).contains("null"), "{v}");
    assert_eq!(up.up.count(), before, "nothing forwarded");
    let v = rpc_or_fail(&c, rpc("\"last\"", "ping", "{}")).await;
    assert_eq!(v["result"]["echo"], json!("ping"));
}

// =============================================================================================
// 2. tasks/cancel answered with a result that is not a Task
// =============================================================================================

/// The upstream answers tasks/cancel with `"result": 5`: the caller gets -32603, and the flight
/// leaves the table, so a second tasks/cancel goes upstream again (before: `v["taskId"] = ..`
/// on a number panicked inside the shared flight, which stayed in the table for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_answered_with_a_number_is_an_error_and_does_not_stick() {
    let up = evil(Evil {
        cancel_result: Some(json!(5)),
        ..Evil::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let task_id = c.create_task("1").await;

    for i in 0..2 {
        let body = rpc(
            &format!("\"c{i}\""),
            "tasks/cancel",
            &json!({ "taskId": task_id }).to_string(),
        );
        let v = tokio::time::timeout(Duration::from_secs(3), rpc_or_fail(&c, body))
            .await
            .unwrap_or_else(|_| panic!("cancel {i}: no answer within 3 s (a stuck flight?)"));
        assert_eq!(v["id"], json!(format!("c{i}")));
        assert_eq!(err_code(&v), -32603, "cancel {i}: {v}");
    }
    let cancels = up
        .requests()
        .into_iter()
        .filter(|r| r.rpc_method().as_deref() == Some("tasks/cancel"))
        .count();
    assert_eq!(cancels, 2, "the second cancel is forwarded again");
    let v = rpc_or_fail(&c, rpc("\"p\"", "ping", "{}")).await;
    assert_eq!(v["result"]["echo"], json!("ping"));
}

// =============================================================================================
// 3. Slow body
// =============================================================================================

/// A body that stops arriving (41 of 100 bytes) gets 408 with a JSON-RPC error after
/// `request_timeout_ms`, and the gateway keeps serving (before: the connection was held forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_body_gets_408_after_request_timeout() {
    let up = Upstream::mcp().await;
    let tg = TgConfig::new(&up.url())
        .gateway("request_timeout_ms = 500")
        .start()
        .await;
    let partial = r#"{"jsonrpc":"2.0","id":10,"method":"ping","#;
    assert_eq!(partial.len(), 41);
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: {ACCEPT_BOTH}\r\nContent-Length: 100\r\n\r\n{partial}",
        tg.gw
    );
    let r = raw_exchange(tg.gw, head.as_bytes(), Duration::from_secs(3)).await;
    assert_eq!(r.status, 408, "{r:?}");
    assert!(
        r.elapsed < Duration::from_millis(1500),
        "408 after {:?}",
        r.elapsed
    );
    let v = parse_json(r.body.as_bytes());
    assert_eq!(v["jsonrpc"], json!("2.0"));
    assert_eq!(err_code(&v), -32600, "{v}");
    assert_eq!(up.count(), 0);

    let v = rpc_or_fail(&tg.client(), rpc("2", "ping", "{}")).await;
    assert_eq!(v["result"]["echo"], json!("ping"));
}

// =============================================================================================
// 4. Connection limit
// =============================================================================================

/// With `max_connections = 4`, four idle connections hold every slot: a fifth request waits
/// until one of them closes, then it is served. The admin listener answers all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_holds_further_connections_until_one_closes() {
    let up = Upstream::mcp().await;
    let tg = TgConfig::new(&up.url())
        .gateway("max_connections = 4")
        .start()
        .await;
    // Each connection is served once (so the gateway holds it), then stays open and idle.
    let mut idle = Vec::new();
    for i in 0..4 {
        let mut s = TcpStream::connect(tg.gw).await.unwrap();
        s.write_all(&raw_post(
            tg.gw,
            "/mcp",
            &[],
            &rpc(&i.to_string(), "ping", "{}"),
        ))
        .await
        .unwrap();
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains(r#""echo":"ping""#) {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(STEP, s.read(&mut chunk))
                .await
                .expect("answer on an idle-to-be connection")
                .unwrap();
            assert!(n > 0, "connection {i} closed before its answer");
            got.extend_from_slice(&chunk[..n]);
        }
        idle.push(s);
    }
    assert_eq!(up.count(), 4);

    let url = tg.mcp_url();
    let mut fifth = tokio::spawn(async move {
        Req::mcp_post(&url, rpc("5", "ping", "{}"))
            .send()
            .await
            .json()
            .await
    });
    let waited = tokio::time::timeout(Duration::from_millis(700), &mut fifth).await;
    assert!(waited.is_err(), "the fifth connection was served at once");
    assert_eq!(up.count(), 4);
    let (s, _) = admin_json(tg.admin, "/healthz").await;
    assert_eq!(s, 200, "admin answers while the gateway is full");

    drop(idle.pop());
    let v = tokio::time::timeout(Duration::from_secs(3), fifth)
        .await
        .expect("served once a slot is free")
        .unwrap();
    assert_eq!(v["result"]["echo"], json!("ping"));
    let (s, _) = admin_json(tg.admin, "/healthz").await;
    assert_eq!(s, 200);
}

// =============================================================================================
// 5. Request heads over 64 KiB
// =============================================================================================

/// Sends one POST whose head carries an `X-Big` header of `kib` KiB; asserts taskgate answers 431,
/// the upstream receives nothing, no upstream error is counted, and the gateway keeps serving.
async fn assert_head_refused(kib: usize) {
    let up = Upstream::mcp().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let errors_before = upstream_errors(&tg.metrics_text().await);

    let big = format!("X-Big: {}", "a".repeat(kib * 1024));
    let req = raw_post(tg.gw, "/mcp", &[big], &rpc("1", "ping", "{}"));
    let r = raw_exchange(tg.gw, &req, Duration::from_secs(3)).await;
    assert_eq!(r.status, 431, "a {kib} KiB head: {}", r.head);
    let v = rpc_or_fail(&tg.client(), rpc("2", "ping", "{}")).await;
    assert_eq!(v["result"]["echo"], json!("ping"));
    // The later ping is the upstream's only request: the refused one never got there.
    let got: Vec<_> = up.requests().iter().map(|r| r.rpc_id_json()).collect();
    assert_eq!(
        got,
        ["2"],
        "the upstream receives nothing but the later ping"
    );
    assert_eq!(
        upstream_errors(&tg.metrics_text().await),
        errors_before,
        "no upstream error"
    );
}

/// A request head over 64 KiB is answered 431 by taskgate; the upstream receives nothing and no
/// upstream error is counted (before: hyper's default ~400 KB buffer let a 200 KiB head through
/// to the upstream). 200 KiB: see the next test for heads just over 64 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_head_over_64_kib_gets_431_and_stays_local() {
    assert_head_refused(200).await;
}

/// Just over the limit too: `max_buf_size` alone is not a strict head limit in hyper 1.12 (heads
/// of 65 to ~100 KiB passed); `max_header_size` checks the parsed head size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_head_just_over_64_kib_gets_431() {
    assert_head_refused(70).await;
}

// =============================================================================================
// 6. Absolute-form request line
// =============================================================================================

/// `POST http://evil.example/mcp` names its host on the request line: refused with 403 even with
/// an allowed Host header (before: only the Host header was checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_request_line_host_is_checked() {
    let up = Upstream::mcp().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let req = raw_post(
        tg.gw,
        "http://evil.example/mcp",
        &[],
        &rpc("1", "ping", "{}"),
    );
    let r = raw_exchange(tg.gw, &req, Duration::from_secs(3)).await;
    assert_eq!(r.status, 403, "{} {}", r.head, r.body);
    assert_eq!(up.count(), 0);

    // Control: the same request in origin form goes through.
    let req = raw_post(tg.gw, "/mcp", &[], &rpc("2", "ping", "{}"));
    let r = raw_exchange(tg.gw, &req, Duration::from_secs(3)).await;
    assert_eq!(r.status, 200, "{} {}", r.head, r.body);
    assert_eq!(up.count(), 1);
}

// =============================================================================================
// 7. Authentication before routing
// =============================================================================================

/// In bearer mode a caller without a token gets 401 on any path, never a 404 listing the
/// upstream names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_unknown_route_gets_401_without_upstream_names() {
    let up = Upstream::mcp().await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .start()
        .await;
    let url = format!("http://{}/mcp/unknown-name", tg.gw);
    let r = Req::mcp_post(&url, rpc("1", "ping", "{}")).send().await;
    assert_eq!(r.status(), 401);
    let text = r.text().await;
    assert!(!text.contains("default"), "upstream names leaked: {text}");
    // With the token the unknown route is a 404 (it may name the upstreams then).
    let r = Req::mcp_post(&url, rpc("1", "ping", "{}"))
        .header("authorization", "Bearer alice-token")
        .send()
        .await;
    assert_eq!(r.status(), 404);
    assert_eq!(up.count(), 0);
}

// =============================================================================================
// 8. Escaped ids
// =============================================================================================

/// A client id spelled `"\u0061bc"` is the id `"abc"`: the CreateTaskResult the upstream echoes
/// as `"abc"` is recognised and recorded (before: the raw spellings differed and the task went
/// unrecorded, so the client could never reach it through taskgate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_request_id_matches_the_normalised_echo() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;

    let body = task_call(r#""\u0061bc""#, "{}", r#""task":{"ttl":60000}"#);
    let v = rpc_or_fail(&c, body).await;
    let task_id = v
        .pointer("/result/task/taskId")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("not a CreateTaskResult: {v}"))
        .to_string();
    assert_eq!(v["id"], json!("abc"));
    let sent = up.received("tools/call").pop().unwrap();
    assert!(
        sent.body_str().contains(r#""id":"\u0061bc""#),
        "forwarded as written"
    );

    let r = tg.record(&task_id).expect("the task is recorded");
    assert_eq!(r.owner, "session:sess-1");
    let (s, list) = tg.admin("/admin/tasks?owner=session:sess-1").await;
    assert_eq!(s, 200);
    assert_eq!(list["tasks"].as_array().unwrap().len(), 1, "{list}");
    let v = c.get("\"g\"", &task_id).await;
    assert_eq!(v["result"]["taskId"], json!(task_id), "{v}");
}

// =============================================================================================
// 9. Escaped task key
// =============================================================================================

/// `"t\u0061sk"` is the key `task`: the creation is recorded and counts toward
/// `max_live_tasks_per_owner` (before: the cheap pre-check missed it and the task went
/// unrecorded and unlimited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_task_key_is_recorded_and_limited() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;

    let v = rpc_or_fail(&c, task_call("1", "{}", r#""t\u0061sk":{"ttl":60000}"#)).await;
    let task_id = v
        .pointer("/result/task/taskId")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("not a CreateTaskResult: {v}"))
        .to_string();
    assert!(tg.record(&task_id).is_some(), "the task is recorded");

    let v = rpc_or_fail(&c, task_call("2", "{}", r#""t\u0061sk":{"ttl":60000}"#)).await;
    assert_eq!(err_code(&v), -32029, "{v}");
    assert_eq!(up.count("tools/call"), 1, "the upstream saw only one");
}

// =============================================================================================
// 10. Float ttl
// =============================================================================================

/// `ttl: 1e12` (a float) is above `max_ttl_ms` like any other number: lowered to the cap
/// (before: only integers were compared, 1e12 went upstream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn float_ttl_above_the_cap_is_lowered() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_ttl_ms = 60000")
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;
    let v = rpc_or_fail(&c, task_call("1", "{}", r#""task":{"ttl":1e12}"#)).await;
    assert!(v.pointer("/result/task/taskId").is_some(), "{v}");
    let sent = up.received("tools/call").pop().unwrap().json();
    assert_eq!(sent["params"]["task"]["ttl"], json!(60000), "{sent}");
}

/// A fractional `ttl` within the cap loses its fraction (1500.7 → 1500), and one under
/// `MIN_TASK_TTL_MS` is raised to it; it used to be taken for "above the cap" (600,000 ms for a
/// client that asked for 1.5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fractional_ttl_loses_its_fraction_not_its_size() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_ttl_ms = 60000")
        .start()
        .await;
    let mut c = tg.client();
    c.initialize().await;
    for (i, (asked, sent)) in [("1500.7", 1500), ("0.5", 1000), ("59999.9", 59999)]
        .iter()
        .enumerate()
    {
        let id = format!("{}", i + 1);
        let v = rpc_or_fail(
            &c,
            task_call(&id, "{}", &format!(r#""task":{{"ttl":{asked}}}"#)),
        )
        .await;
        assert!(v.pointer("/result/task/taskId").is_some(), "{v}");
        let out = up.received("tools/call").pop().unwrap().json();
        assert_eq!(
            out["params"]["task"]["ttl"],
            json!(sent),
            "ttl {asked}: {out}"
        );
    }
}

// =============================================================================================
// 11. Params taskgate cannot read
// =============================================================================================

/// A task-augmented tools/call whose params taskgate cannot parse (a number beyond f64) is
/// refused with -32602 and not forwarded (before: it went upstream unrecorded, bypassing the
/// owner limit and the ttl cap); nesting deeper than serde_json's 128 is refused at the edge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_task_params_are_refused_locally() {
    let up = TaskServer::default().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let before = up.up.count();

    let deep = format!("{{\"x\":{}{}}}", "[".repeat(200), "]".repeat(200));
    let cases = [(
        "huge number",
        task_call("1", r#"{"x":1e400}"#, r#""task":{"ttl":60000}"#),
    )];
    for (what, body) in cases {
        let r = c
            .req(body)
            .try_send()
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = r.status();
        let text = r.text().await;
        assert_eq!(
            up.up.count(),
            before,
            "{what}: the upstream receives nothing (got HTTP {status} {text})"
        );
        assert_eq!(status, 200, "{what}: {text}");
        let v = parse_json(text.as_bytes());
        assert_eq!(err_code(&v), -32602, "{what}: {v}");
        assert!(err_message(&v).contains("cannot be read"), "{what}: {v}");
    }
    // Nesting over 128 levels is not JSON taskgate accepts at all: 400 -32700 at the edge
    // (issue 16 item 5; tests/edge_attacks.rs), still nothing upstream.
    let r = c
        .req(task_call("2", &deep, r#""task":{"ttl":60000}"#))
        .send()
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(err_code(&r.json().await), -32700);
    assert_eq!(up.up.count(), before);
}

// =============================================================================================
// 12. taskId reuse
// =============================================================================================

/// An upstream that hands out a taskId already recorded (for another session) is refused: the
/// second client gets a JSON-RPC error and the first keeps its task (before: the record was
/// overwritten with the second owner, and the first client got "Task not found").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_task_id_is_refused_and_the_first_owner_keeps_it() {
    let up = evil(Evil {
        fixed_task_id: Some("task-fixed".into()),
        ..Evil::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut a = tg.client();
    a.initialize().await;
    let mut b = tg.client();
    b.initialize().await;
    assert_eq!(
        (a.session.as_deref(), b.session.as_deref()),
        (Some("sess-1"), Some("sess-2"))
    );

    assert_eq!(a.create_task("1").await, "task-fixed");
    let v = rpc_or_fail(&b, Client::create_body("1", Some(60_000))).await;
    assert!(
        v.get("error").is_some(),
        "the second creation is refused: {v}"
    );
    assert!(v.get("result").is_none());

    let v = a.get("\"g\"", "task-fixed").await;
    assert_eq!(v["result"]["taskId"], json!("task-fixed"), "{v}");
    let v = b.get("\"g\"", "task-fixed").await;
    assert_eq!(err_code(&v), -32602, "not the second client's task: {v}");
    let (s, detail) = tg.admin("/admin/tasks/default/task-fixed").await;
    assert_eq!(s, 200);
    assert_eq!(detail["task"]["owner"], json!("session:sess-1"), "{detail}");
}

// =============================================================================================
// 13. Skewed createdAt
// =============================================================================================

/// An upstream whose clock is a day behind (`createdAt` yesterday, ttl 60 s): the task is not
/// expired on arrival; it expires 60 s after taskgate saw it (before: tasks/get right after the
/// creation was "Task not found").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_at_in_the_past_is_clamped_to_now() {
    let up = evil(Evil {
        created_ago_ms: 86_400_000,
        ..Evil::default()
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let before = now_ms();
    let task_id = c.create_task("1").await;
    let after = now_ms();

    let v = c.get("\"g\"", &task_id).await;
    assert_eq!(v["result"]["taskId"], json!(task_id), "{v}");
    let r = tg.record(&task_id).unwrap();
    assert!(
        r.expires_at >= before + 60_000 && r.expires_at <= after + 60_000,
        "expires_at {} not within [{}, {}]",
        r.expires_at,
        before + 60_000,
        after + 60_000
    );
}

// =============================================================================================
// 14. In-flight notes of abandoned requests
// =============================================================================================

/// tasks/result requests re-routed to the task's session whose client goes away before the
/// upstream answered: their in-flight notes go with them. Observed through routing: a later
/// notifications/cancelled for one of those ids goes on the client's own session (before: the
/// leaked note still sent it to the task's session, and the notes grew without bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_rerouted_requests_leave_no_in_flight_note() {
    const N: usize = 20;
    let up = evil(Evil {
        result_hangs: true,
        ..Evil::default()
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .start()
        .await;
    let mut first = tg.client().with_token("alice-token");
    first.initialize().await;
    let task_id = first.create_task("1").await;
    let mut second = tg.client().with_token("alice-token");
    second.initialize().await;
    assert_eq!(second.session.as_deref(), Some("sess-2"));

    let received = |m: &str| {
        up.requests()
            .into_iter()
            .filter(|r| r.rpc_method().as_deref() == Some(m))
            .collect::<Vec<_>>()
    };
    for i in 0..N {
        let body = rpc(
            &format!("\"r{i}\""),
            "tasks/result",
            &json!({ "taskId": task_id }).to_string(),
        );
        let req = raw_post(
            tg.gw,
            "/mcp",
            &[
                "Authorization: Bearer alice-token".into(),
                "Mcp-Session-Id: sess-2".into(),
            ],
            &body,
        );
        let mut s = TcpStream::connect(tg.gw).await.unwrap();
        s.write_all(&req).await.unwrap();
        let ok = eventually(STEP, || {
            let n = received("tasks/result").len();
            async move { (n > i).then_some(()) }
        })
        .await;
        assert!(ok.is_some(), "tasks/result r{i} reached the upstream");
        drop(s); // the client goes away before any answer
    }
    let routed = received("tasks/result");
    assert!(routed
        .iter()
        .all(|r| r.header("mcp-session-id").as_deref() == Some("sess-1")));
    // taskgate drops its note when it drops the request; the upstream then sees the request go.
    assert!(
        up.wait_for_hangs_abandoned(N, STEP).await,
        "{} of {N} abandoned tasks/result went away upstream",
        up.hangs_abandoned()
    );

    for id in ["r0", &format!("r{}", N - 1)] {
        let s = second
            .notify("notifications/cancelled", json!({ "requestId": id }))
            .await;
        assert_eq!(s, 202);
    }
    let n = received("notifications/cancelled");
    assert_eq!(n.len(), 2, "forwarded, not dropped");
    for r in &n {
        assert_eq!(
            r.header("mcp-session-id").as_deref(),
            Some("sess-2"),
            "an abandoned request's cancel goes on the client's own session: {}",
            r.body_str()
        );
    }
}

// =============================================================================================
// 15. Owner counts
// =============================================================================================

/// 500 task-augmented calls, each on a new Mcp-Session-Id (a new owner), all answered with an
/// error (no task): every one reaches the upstream (none refused by the owner limit), and the
/// limit still works for a new owner and for one of those owners afterwards. (The fix also
/// drops owners whose count fell to 0; the map's size is not observable from outside.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_counts_after_many_failed_creations() {
    const N: usize = 500;
    let up = evil(Evil::default()).await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let url = tg.mcp_url();
    let mut joins = tokio::task::JoinSet::new();
    for w in 0..8 {
        let url = url.clone();
        joins.spawn(async move {
            let mut codes = Vec::new();
            for i in (w..N).step_by(8) {
                let c = Client::new(&url).with_session(&format!("err-{i}"));
                let v = c
                    .rpc(task_call("1", r#"{"fail":true}"#, r#""task":{"ttl":1000}"#))
                    .await;
                codes.push(err_code(&v));
            }
            codes
        });
    }
    let mut codes = Vec::new();
    while let Some(r) = joins.join_next().await {
        codes.extend(r.unwrap());
    }
    assert_eq!(codes.len(), N);
    assert!(codes.iter().all(|c| *c == -32000), "all upstream errors");
    let calls = |up: &Upstream| {
        up.requests()
            .into_iter()
            .filter(|r| r.rpc_method().as_deref() == Some("tools/call"))
            .count()
    };
    assert_eq!(calls(&up), N, "none refused locally");

    for session in ["fresh", "err-7"] {
        let c = Client::new(&url).with_session(session);
        let v = c.rpc(task_call("1", "{}", r#""task":{"ttl":60000}"#)).await;
        assert!(v.pointer("/result/task/taskId").is_some(), "{session}: {v}");
        let v = c.rpc(task_call("2", "{}", r#""task":{"ttl":60000}"#)).await;
        assert_eq!(err_code(&v), -32029, "{session}: {v}");
    }
    assert_eq!(calls(&up), N + 2);
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_task_creation_refused_total",
            &[("reason", "owner_limit")]
        ),
        2.0
    );
}
