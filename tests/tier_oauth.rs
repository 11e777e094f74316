//! 2025-11-25 sessions through the tier under OAuth 2.1 (issue 35: "round-robin works for both
//! eras, with auth (bearer and OAuth)"): three replicas (the real binary) on one PostgreSQL
//! behind nginx round-robin, each in `[auth] mode = "oauth"` against one in-test authorization
//! server (OpenID configuration + JWK Set, ES256 keys; `tests/common/idp.rs`), in front of a
//! scripted 2025-11-25 task server that issues sessions. Two principals (subjects `alice` and
//! `bob`, each an RFC 9068 access token). Proven on the wire:
//! - alice's session, initialized through nginx, is served by every replica: create, get, list,
//!   result, cancel, each request on the next replica, then round-robin through nginx;
//! - bob's token with alice's session id is 404 on every replica, and from his own session her
//!   task is `-32602` (not found) on every replica, and not in his `tasks/list`;
//! - alice from a new session finds her task on every replica (tasks belong to the principal);
//! - a token signed by a key the authorization server does not list is 401 on every replica;
//! - 2026-07-28 (no sessions), in front of a scripted 2026 task server: alice's tasks created
//!   through nginx are found by her on every replica, by bob on none (`-32602`), and his
//!   `tasks/cancel` of one never goes upstream.
//!
//! The real `oidc-provider` with the TypeScript SDK's OAuth client is `tests/oauth/run.sh`
//! (one process); this test needs no network beyond loopback, so it always runs with the tier.

use crate::common::idp::*;
use crate::common::*;
use serde_json::json;

fn oauth_auth(idp: &Idp) -> String {
    format!(
        "[auth]\nmode = \"oauth\"\n[auth.oauth]\nissuer = {:?}\naudience = {AUDIENCE:?}\n\
         required_scopes = [\"mcp\"]\n",
        idp.issuer()
    )
}

fn on(url: &str, token: &str, session: &str) -> Client {
    Client::new(url).with_token(token).with_session(session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_principals_round_robin_over_the_tier() {
    let test = "oauth_principals_round_robin_over_the_tier";
    let key = new_key("k1");
    let idp = Idp::start(&[&key]).await;
    let server = TaskServer::default().await;
    let Some(t) = Tier::start_with(test, &server.url(), &oauth_auth(&idp)) else {
        return;
    };
    let alice = sign(&key, &claims(&idp, "alice"));
    let bob = sign(&key, &claims(&idp, "bob"));

    let mut c = Client::new(&t.balancer.mcp_url()).with_token(&alice);
    c.initialize().await;
    let sid = c.session.clone().expect("the upstream's Mcp-Session-Id");
    let at = |i: usize| on(&t.replicas[i % 3].url(), &alice, &sid);
    let task = at(0).create_task("1").await;
    let v = at(1).get("2", &task).await;
    assert_eq!(v["result"]["taskId"], json!(task), "{v}");
    let v = at(2).list("3", None).await;
    assert!(
        v["result"]["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["taskId"] == json!(task)),
        "{v}"
    );
    let v = at(0).result("4", &task).await;
    assert_eq!(
        v["result"]["content"][0]["text"],
        format!("result of {task}"),
        "{v}"
    );
    let other = at(1).create_task("5").await;
    let v = at(2).cancel("6", &other).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    for i in 0..9 {
        let created = c.create_task(&format!("\"c{i}\"")).await;
        let v = c.get(&format!("\"g{i}\""), &created).await;
        assert_eq!(v["result"]["taskId"], json!(created), "{v}");
    }

    let mut b = Client::new(&t.balancer.mcp_url()).with_token(&bob);
    b.initialize().await;
    let bob_sid = b.session.clone().unwrap();
    for r in &t.replicas {
        let thief = on(&r.url(), &bob, &sid);
        let resp = thief.send(rpc("7", "tasks/list", "{}")).await;
        assert_eq!(
            resp.status(),
            404,
            "bob with alice's session on {}",
            r.url()
        );
        let mine = on(&r.url(), &bob, &bob_sid);
        let v = mine.get("8", &task).await;
        assert_eq!(
            err_code(&v),
            -32602,
            "alice's task from bob on {}: {v}",
            r.url()
        );
        let v = mine.list("9", None).await;
        assert!(
            !v["result"]["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["taskId"] == json!(task)),
            "{v}"
        );
    }

    let mut again = Client::new(&t.balancer.mcp_url()).with_token(&alice);
    again.initialize().await;
    let new_sid = again.session.clone().unwrap();
    assert_ne!(new_sid, sid);
    for r in &t.replicas {
        let v = on(&r.url(), &alice, &new_sid).get("10", &task).await;
        assert_eq!(v["result"]["taskId"], json!(task), "{v}");
    }

    let stranger = new_key("k1");
    let forged = sign(&stranger, &claims(&idp, "alice"));
    for r in &t.replicas {
        let resp = on(&r.url(), &forged, &sid)
            .send(rpc("11", "tasks/list", "{}"))
            .await;
        assert_eq!(resp.status(), 401, "a token the issuer never signed");
    }
}

/// 2026-07-28 (no sessions) under OAuth over the tier: alice's task, created through nginx, is
/// found by her on every replica and by bob on none (`-32602`, as an unknown task).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_principals_round_robin_over_the_tier_2026() {
    let test = "oauth_principals_round_robin_over_the_tier_2026";
    let key = new_key("k1");
    let idp = Idp::start(&[&key]).await;
    let (up, _state) = modern_server().await;
    let Some(t) = Tier::start_with(test, &up.url(), &oauth_auth(&idp)) else {
        return;
    };
    let alice = sign(&key, &claims(&idp, "alice"));
    let bob = sign(&key, &claims(&idp, "bob"));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        tasks.push(create(&t.balancer.mcp_url(), Some(&alice), "slow_compute").await);
    }
    for (i, task) in tasks.iter().enumerate() {
        for r in &t.replicas {
            let (status, v) = task_call(&r.url(), Some(&alice), 2, "tasks/get", task).await;
            assert_eq!(
                (status, v["result"]["taskId"].clone()),
                (200, json!(task)),
                "alice on {}: {v}",
                r.url()
            );
            let (_, v) = task_call(&r.url(), Some(&bob), 3, "tasks/get", task).await;
            assert_eq!(v["error"]["code"], -32602, "bob on {}: {v}", r.url());
        }
        if i == 0 {
            let (_, v) =
                task_call(&t.balancer.mcp_url(), Some(&bob), 4, "tasks/cancel", task).await;
            assert_eq!(v["error"]["code"], -32602, "bob cannot cancel it: {v}");
        }
    }
    assert_eq!(
        count(&up, "tasks/cancel"),
        0,
        "bob's cancel never went upstream"
    );
}
