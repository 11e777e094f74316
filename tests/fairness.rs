//! One principal must not starve the others (issue 29, items 3 to 6): GET streams are counted
//! per principal (`limits.max_get_streams`), a principal's sessions are capped at its share of
//! the table (`limits.max_sessions_per_principal`), and failed authentications are bounded per
//! client address (`limits.auth_failures_per_minute`).

use crate::common::*;
use serde_json::json;
use std::sync::Arc;

/// A bearer pair (alice, bob) behind taskgate with these `[limits]` lines, on `up`.
async fn bearer_with_limits(up: &TaskServer, limits: &[&str]) -> Tg {
    let cfg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .token("bob", "bob-token");
    let limits = limits.join("\n");
    Tg::start(|store| format!("{}\n[limits]\n{limits}\n", cfg.to_toml(store))).await
}

fn upstream_gets(up: &TaskServer) -> usize {
    up.up
        .requests()
        .iter()
        .filter(|r| r.method == "GET")
        .count()
}

async fn open_get(tg: &Tg, c: &Client) -> Resp {
    Req::mcp_get(&tg.mcp_url())
        .header(
            "authorization",
            &format!("Bearer {}", c.token.as_deref().unwrap()),
        )
        .header("mcp-session-id", c.session.as_deref().unwrap())
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await
}

/// Item 3: alice at `max_get_streams` open GET streams gets 429 with `Retry-After` for one
/// more, which never reaches the upstream; bob still opens his; when one of alice's streams
/// ends, she may open another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_streams_are_capped_per_principal() {
    let up = TaskServer::start(Behaviour {
        get_stream: Some(Arc::new(|| {
            vec![ev().id("g-1").data("").into(), SseStep::HoldOpen]
        })),
        ..Default::default()
    })
    .await;
    let tg = bearer_with_limits(&up, &["max_get_streams = 2"]).await;
    let mut alice = tg.client().with_token("alice-token");
    alice.initialize().await;
    let mut bob = tg.client().with_token("bob-token");
    bob.initialize().await;

    let first = open_get(&tg, &alice).await;
    assert_eq!(first.status(), 200);
    let second = open_get(&tg, &alice).await;
    assert_eq!(second.status(), 200);
    assert_eq!(upstream_gets(&up), 2);

    let third = open_get(&tg, &alice).await;
    assert_eq!(third.status(), 429, "a third GET stream of alice");
    assert_eq!(third.header("retry-after").as_deref(), Some("1"));
    let v = third.json().await;
    assert_eq!(v["error"]["code"], json!(-32029), "{v}");
    assert_eq!(
        upstream_gets(&up),
        2,
        "the refused GET never reached the upstream"
    );

    let bobs = open_get(&tg, &bob).await;
    assert_eq!(bobs.status(), 200, "bob is not starved by alice's streams");

    let text = tg.metrics_text().await;
    assert_eq!(
        metric(
            &text,
            "taskgate_http_rejections_total",
            &[("reason", "get_streams")]
        ),
        1.0
    );

    drop(first);
    let again = eventually(STEP, || async {
        let r = open_get(&tg, &alice).await;
        (r.status() == 200).then_some(r)
    })
    .await;
    assert!(again.is_some(), "a closed stream gives its slot back");
    drop((second, bobs, again));
}

/// break-edge F12: 2026-07-28 has no GET stream and no sessions (§2.2 "405: GET or DELETE"):
/// a GET or DELETE with a 2026 `MCP-Protocol-Version` is 405 `Allow: POST` at the edge,
/// below the caller's `max_get_streams` as past it (before: past it, 429 `-32029`), and never
/// reaches the upstream nor takes a GET slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modern_get_is_405_even_past_the_get_stream_limit() {
    let up = TaskServer::start(Behaviour {
        get_stream: Some(Arc::new(|| {
            vec![ev().id("g-1").data("").into(), SseStep::HoldOpen]
        })),
        ..Default::default()
    })
    .await;
    let tg = bearer_with_limits(&up, &["max_get_streams = 1"]).await;
    let mut alice = tg.client().with_token("alice-token");
    alice.initialize().await;
    let modern = |req: Req| {
        req.header("authorization", "Bearer alice-token")
            .header("mcp-protocol-version", "2026-07-28")
    };
    let check = |r: Resp, what: &'static str| async move {
        assert_eq!(r.status(), 405, "{what}");
        assert_eq!(r.header("allow").as_deref(), Some("POST"), "{what}");
        let v = r.json().await;
        assert_eq!(v["error"]["code"], json!(-32600), "{what}: {v}");
    };
    check(
        modern(Req::mcp_get(&tg.mcp_url())).send().await,
        "a 2026 GET below the limit",
    )
    .await;
    let held = open_get(&tg, &alice).await;
    assert_eq!(held.status(), 200, "the 2025 GET takes alice's one slot");
    check(
        modern(Req::mcp_get(&tg.mcp_url())).send().await,
        "a 2026 GET past the limit",
    )
    .await;
    check(
        modern(Req::delete(&tg.mcp_url())).send().await,
        "a 2026 DELETE",
    )
    .await;
    assert_eq!(
        upstream_gets(&up),
        1,
        "only the 2025 GET reached the upstream"
    );
    assert_eq!(
        up.up
            .requests()
            .iter()
            .filter(|r| r.method == "DELETE")
            .count(),
        0
    );
    drop(held);
}

/// A raw HTTP/1.1 request from the local address `from` (another loopback address than the
/// test client's): the status code of its answer.
async fn status_from(from: &str, gw: std::net::SocketAddr, token: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut s = socket.connect(gw).await.unwrap();
    let body = initialize_body("1");
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: {gw}\r\nAuthorization: Bearer {token}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(STEP, s.read_exact(&mut head))
        .await
        .expect("an answer in time")
        .unwrap();
    std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
}

/// Item 6: an address that sent more invalid tokens than `auth_failures_burst` gets 429 with
/// `Retry-After` (no token check made), counted as `reason="auth_failures"`, even for a valid
/// token; another address is not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentications_are_limited_per_client_address() {
    let up = TaskServer::default().await;
    let tg = bearer_with_limits(
        &up,
        &["auth_failures_per_minute = 1", "auth_failures_burst = 3"],
    )
    .await;
    let bad = tg.client().with_token("not-a-token");
    for i in 0..4 {
        let r = bad.send(initialize_body("1")).await;
        assert_eq!(r.status(), 401, "invalid token {i}");
    }
    let r = bad.send(initialize_body("1")).await;
    assert_eq!(r.status(), 429, "past the burst, the address is refused");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    let v = r.json().await;
    assert_eq!(v["error"]["code"], json!(-32029), "{v}");
    let alice = tg.client().with_token("alice-token");
    let r = alice.send(initialize_body("2")).await;
    assert_eq!(r.status(), 429, "the address is refused whatever its token");
    assert_eq!(up.count("initialize"), 0, "nothing reached the upstream");

    assert_eq!(
        status_from("127.0.0.2", tg.gw, "bob-token").await,
        200,
        "another client address is not refused"
    );
    let text = tg.metrics_text().await;
    assert_eq!(
        metric(
            &text,
            "taskgate_http_rejections_total",
            &[("reason", "auth_failures")]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &text,
            "taskgate_http_rejections_total",
            &[("reason", "auth")]
        ),
        4.0
    );
}

/// Item 4: alice past `limits.max_sessions_per_principal` gets a new session by giving up one
/// of her own (that id then gets 404 `-32001`), so she can never fill `gateway.max_sessions`:
/// bob's `initialize`s still get sessions and his sessions are never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_past_its_session_share_never_takes_anothers() {
    let up = TaskServer::default().await;
    let cfg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .token("bob", "bob-token")
        .gateway("max_sessions = 4");
    let tg = Tg::start(|store| {
        format!(
            "{}\n[limits]\nmax_sessions_per_principal = 2\n",
            cfg.to_toml(store)
        )
    })
    .await;
    let mut alices = Vec::new();
    for _ in 0..3 {
        let mut a = tg.client().with_token("alice-token");
        let v = a.initialize().await;
        assert!(v.get("result").is_some(), "{v}");
        alices.push(a);
    }
    let mut bobs = Vec::new();
    for _ in 0..2 {
        let mut b = tg.client().with_token("bob-token");
        let r = b.send(initialize_body("1")).await;
        assert_eq!(
            r.status(),
            200,
            "bob gets a session while alice holds her share"
        );
        b.session = r.header("mcp-session-id");
        assert!(b.session.is_some());
        r.bytes().await;
        bobs.push(b);
    }
    for b in &bobs {
        let r = b.send(rpc("2", "tools/list", "{}")).await;
        assert_eq!(r.status(), 200, "bob's sessions work");
    }
    let mut statuses = Vec::new();
    for a in &alices {
        let r = a.send(rpc("3", "tools/list", "{}")).await;
        let status = r.status();
        if status == 404 {
            assert_eq!(err_code(&r.json().await), -32001);
        }
        statuses.push(status);
    }
    statuses.sort();
    assert_eq!(
        statuses,
        vec![200, 200, 404],
        "one of alice's own sessions made room for her third"
    );
}

/// An initialize with `token` sent as if through a reverse proxy at 127.0.0.1 that set
/// `X-Forwarded-For: xff`; the HTTP status.
async fn status_forwarded_for(tg: &Tg, xff: &str, token: &str) -> u16 {
    tg.client()
        .with_token(token)
        .req(initialize_body("1"))
        .header("x-forwarded-for", xff)
        .send()
        .await
        .status()
}

/// tester4 finding 3: behind a reverse proxy every client shares the proxy's address. With
/// the proxy in `gateway.trusted_proxies`, the failed-authentication bound keys on the client
/// `X-Forwarded-For` names: one client's bad tokens lock out that client only (and entries it
/// wrote itself, left of the proxy's, do not get it out). Without it, they lock out everyone
/// behind the proxy, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_failed_authentications_are_limited_per_forwarded_client() {
    let up = TaskServer::default().await;
    for trusted in [true, false] {
        let mut cfg = TgConfig::new(&up.url())
            .token("alice", "alice-token")
            .token("bob", "bob-token");
        if trusted {
            cfg = cfg.gateway("trusted_proxies = [\"10.0.0.0/8\", \"127.0.0.1\"]");
        }
        let tg = Tg::start(|store| {
            format!(
                "{}\n[limits]\nauth_failures_per_minute = 1\nauth_failures_burst = 3\n",
                cfg.to_toml(store)
            )
        })
        .await;
        let (mallory, alice) = ("203.0.113.66", "203.0.113.7");
        for i in 0..4 {
            let status = status_forwarded_for(&tg, mallory, "not-a-token").await;
            assert_eq!(status, 401, "invalid token {i} (trusted {trusted})");
        }
        assert_eq!(
            status_forwarded_for(&tg, mallory, "bob-token").await,
            429,
            "the failing client is refused (trusted {trusted})"
        );
        let spoofed = format!("198.51.100.9, {mallory}");
        assert_eq!(
            status_forwarded_for(&tg, &spoofed, "bob-token").await,
            429,
            "an entry the client wrote itself does not get it out (trusted {trusted})"
        );
        let expected = if trusted { 200 } else { 429 };
        assert_eq!(
            status_forwarded_for(&tg, alice, "alice-token").await,
            expected,
            "another client behind the same proxy (trusted {trusted})"
        );
    }
}
