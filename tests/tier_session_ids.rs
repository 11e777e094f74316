//! Long upstream session ids (issue 35): 2025-11-25 basic/transports allows an `Mcp-Session-Id`
//! of visible ASCII of any length; taskgate stores ids up to `MAX_HELD_SESSION_ID` (2 KiB, below
//! PostgreSQL's B-tree entry limit for the table's key) so any replica serves them. Proven on the
//! wire, three replicas (the real binary) on one PostgreSQL behind nginx round-robin, bearer
//! auth, in front of a scripted upstream issuing ids of the length the test asks:
//! - a 2048-byte id (and a 600-byte one) is served by every replica: before this, ids past 512
//!   bytes were not stored and the other replicas answered 404 "Session not found";
//! - a 2049-byte id: the `initialize` is refused 502 `-32603` naming the length and the bound,
//!   not answered with a session two replicas of three would refuse; before this it was answered
//!   200 and the other replicas said 404. The refused session is ended upstream (a `DELETE`).
//!
//! And one process on its embedded store: a 4096-byte id is served (by that process only).

use crate::common::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const AUTH: &[(&str, &str)] = &[("alice", "alice-token")];

/// What the ids are made of: visible ASCII, no comma (a comma-separated list is refused).
const ALPHABET: &[u8] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!#$%&*+/=?^|";

/// An upstream that issues session ids of `*len` bytes (pseudo-random, not compressible) and
/// answers `tools/call` with the session it came on.
async fn long_id_upstream(len: Arc<AtomicUsize>) -> Upstream {
    Upstream::start(move |req| {
        if req.method == "DELETE" {
            return ScriptedResponse::status(200, None, "");
        }
        if req.method != "POST" {
            return ScriptedResponse::status(405, None, "");
        }
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let id = v["id"].to_string();
        match v["method"].as_str() {
            Some("initialize") => {
                let n = len.load(Ordering::SeqCst);
                let seed = format!("{:x}", now_ms());
                let sid: String = (0..n)
                    .map(|i| {
                        let h = Sha256::digest(format!("{seed}-{}", i / 32).as_bytes());
                        char::from(ALPHABET[usize::from(h[i % 32]) % ALPHABET.len()])
                    })
                    .collect();
                let result = json!({
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "long-ids", "version": "1"},
                });
                ScriptedResponse::json(rpc_result(&id, &result.to_string()))
                    .header("mcp-session-id", &sid)
            }
            Some("tools/call") => {
                let on = req.header("mcp-session-id").unwrap_or_default();
                let result =
                    json!({"content": [{"type": "text", "text": format!("{} bytes", on.len())}]});
                ScriptedResponse::json(rpc_result(&id, &result.to_string()))
            }
            Some(_) => ScriptedResponse::json(rpc_result(&id, "{}")),
            None => ScriptedResponse::accepted(),
        }
    })
    .await
}

fn call_body(id: usize) -> String {
    rpc(
        &id.to_string(),
        "tools/call",
        r#"{"name":"echo","arguments":{}}"#,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_upstream_session_ids_are_served_by_every_replica_up_to_the_bound() {
    let test = "long_upstream_session_ids_are_served_by_every_replica_up_to_the_bound";
    let len = Arc::new(AtomicUsize::new(0));
    let up = long_id_upstream(len.clone()).await;
    let Some(t) = Tier::start_with(test, &up.url(), &bearer_auth(AUTH)) else {
        return;
    };
    for n in [600, 2048] {
        len.store(n, Ordering::SeqCst);
        let mut c = Client::new(&t.replicas[0].url()).with_token("alice-token");
        c.initialize().await;
        let sid = c.session.clone().expect("the upstream's Mcp-Session-Id");
        assert_eq!(sid.len(), n);
        for (i, r) in t.replicas.iter().enumerate() {
            let on = Client::new(&r.url())
                .with_token("alice-token")
                .with_session(&sid);
            let resp = on.send(call_body(i)).await;
            assert_eq!(resp.status(), 200, "a {n}-byte id on {}", r.url());
            let v = resp.json().await;
            assert_eq!(
                v["result"]["content"][0]["text"],
                format!("{n} bytes"),
                "{v}"
            );
        }
        let rr = Client::new(&t.balancer.mcp_url())
            .with_token("alice-token")
            .with_session(&sid);
        for i in 0..6 {
            assert_eq!(rr.send(call_body(10 + i)).await.status(), 200, "{n} bytes");
        }
    }
    len.store(2049, Ordering::SeqCst);
    for r in &t.replicas {
        let resp = Client::new(&r.url())
            .with_token("alice-token")
            .send(initialize_body("\"i\""))
            .await;
        assert_eq!(resp.status(), 502, "a 2049-byte id on {}", r.url());
        assert!(resp.header("mcp-session-id").is_none());
        let v = resp.json().await;
        assert_eq!(err_code(&v), -32603, "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("2049 bytes") && message.contains("at most 2048 bytes"),
            "{v}"
        );
    }
    // Each refused session is ended upstream (the client never learned its id).
    let ended = |r: &RecordedRequest| {
        r.method == "DELETE" && r.header("mcp-session-id").is_some_and(|s| s.len() == 2049)
    };
    assert!(
        up.wait_for_request(
            |_| up.requests().iter().filter(|r| ended(r)).count() >= t.replicas.len(),
            STEP
        )
        .await,
        "one DELETE per refused session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_serves_a_session_id_past_the_stored_bound() {
    let len = Arc::new(AtomicUsize::new(4096));
    let up = long_id_upstream(len).await;
    let tg = Tg::start(|store| {
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             [store]\npath = {store:?}\n[auth]\nmode = \"none\"\n\
             [[upstream]]\nname = \"default\"\nurl = {:?}\n",
            up.url()
        )
    })
    .await;
    let mut c = tg.client();
    c.initialize().await;
    let sid = c.session.clone().expect("the upstream's Mcp-Session-Id");
    assert_eq!(sid.len(), 4096);
    let v = c.rpc(call_body(1)).await;
    assert_eq!(v["result"]["content"][0]["text"], "4096 bytes", "{v}");
}
