//! `[auth] mode = "oauth"` (issue 14): taskgate as an OAuth 2.1 resource server, against an
//! in-test authorization server (OpenID configuration + JWK Set on a loopback port) whose ES256
//! keys are generated per test. Also `[limits]` (429 and recovery) in oauth and bearer modes.
//! The real `oidc-provider` run is `tests/oauth/run.sh`.

use crate::common::idp::*;
use crate::common::*;

use base64::Engine;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A token whose JOSE header lists a critical extension (`crit`), signed with `key`.
fn with_crit(key: &TestKey, claims: &Value) -> String {
    let header = json!({"alg": "ES256", "kid": key.kid, "typ": "at+jwt", "crit": ["exp"]});
    let message = format!("{}.{}", b64(&header), b64(claims));
    let signature =
        jsonwebtoken::crypto::sign(message.as_bytes(), &key.enc, Algorithm::ES256).unwrap();
    format!("{message}.{signature}")
}

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

fn oauth_toml(idp: &Idp, upstream: &str, extra: &str) -> impl FnOnce(&str) -> String {
    let (issuer, upstream, extra) = (idp.issuer(), upstream.to_string(), extra.to_string());
    move |store| {
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             [store]\npath = {store:?}\n[auth]\nmode = \"oauth\"\n[auth.oauth]\n\
             issuer = {issuer:?}\naudience = {AUDIENCE:?}\nrequired_scopes = [\"mcp\"]\n\
             jwks_min_refresh_ms = 1000\nfetch_timeout_ms = 500\n{extra}\n\
             [[upstream]]\nname = \"default\"\nurl = {upstream:?}\nprincipal_header = \"x-principal\"\n"
        )
    }
}

async fn status_and_challenge(tg: &Tg, token: Option<&str>) -> (u16, String, Value) {
    let mut c = tg.client();
    c.token = token.map(String::from);
    let r = c.send(initialize_body("1")).await;
    let challenge = r.header("www-authenticate").unwrap_or_default();
    (r.status(), challenge, r.json().await)
}

#[tokio::test]
async fn metadata_and_the_challenge_of_a_request_without_a_token() {
    let k1 = new_key("k1");
    let idp = Idp::start(&[&k1]).await;
    let up = Upstream::mcp().await;
    let tg = Tg::start(oauth_toml(&idp, &up.url(), "")).await;
    for suffix in ["", "/mcp", "/mcp/default"] {
        let url = format!(
            "http://{}/.well-known/oauth-protected-resource{suffix}",
            tg.gw
        );
        let r = Req::get(&url).send().await;
        assert_eq!(r.status(), 200, "{suffix}");
        let doc = r.json().await;
        // RFC 9728 §3.3: `resource` is the identifier the metadata URL was built from.
        let resource = match suffix {
            "/mcp/default" => "https://mcp.example.com/mcp/default",
            _ => AUDIENCE,
        };
        assert_eq!(doc["resource"], json!(resource));
        assert_eq!(doc["authorization_servers"], json!([idp.issuer()]));
        assert_eq!(doc["scopes_supported"], json!(["mcp"]));
        assert_eq!(doc["bearer_methods_supported"], json!(["header"]));
    }
    let url = format!("http://{}/.well-known/oauth-protected-resource/nope", tg.gw);
    assert_eq!(Req::get(&url).send().await.status(), 404);

    let (status, challenge, body) = status_and_challenge(&tg, None).await;
    assert_eq!(status, 401);
    assert_eq!(
        challenge,
        "Bearer resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/mcp\", scope=\"mcp\""
    );
    assert_eq!(err_code(&body), -32600, "{body}");
    let r = Req::mcp_post(
        &format!("http://{}/mcp/default", tg.gw),
        initialize_body("1"),
    )
    .send()
    .await;
    assert!(r
        .header("www-authenticate")
        .unwrap()
        .contains("oauth-protected-resource/mcp/default\""));
    // Unauthorised callers learn nothing else: not even that a route does not exist.
    let r = Req::mcp_post(&format!("http://{}/mcp/nope", tg.gw), initialize_body("1"))
        .send()
        .await;
    assert_eq!(r.status(), 401);
    assert_eq!(up.count(), 0);
}

#[tokio::test]
async fn every_bad_token_is_refused_before_the_upstream_sees_anything() {
    let k1 = new_key("k1");
    let other = new_key("k1");
    let idp = Idp::start(&[&k1]).await;
    let up = Upstream::mcp().await;
    let tg = Tg::start(oauth_toml(&idp, &up.url(), "")).await;
    let good = claims(&idp, "alice");
    let with = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        c
    };
    let now = now_ms() / 1000;
    let none_token = format!("{}.{}.", b64(&json!({"alg":"none","kid":"k1"})), b64(&good));
    let mut hs = Header::new(Algorithm::HS256);
    hs.kid = Some("k1".into());
    let hs_token = encode(
        &hs,
        &good,
        &EncodingKey::from_secret(k1.jwk.to_string().as_bytes()),
    )
    .unwrap();
    let no_sub = {
        let mut c = good.clone();
        c.as_object_mut().unwrap().remove("sub");
        c
    };
    let cases: Vec<(&str, String, &str)> = vec![
        ("malformed", "not-a-jwt".into(), "not a valid JWT"),
        ("wrong signature", sign(&other, &good), "signature"),
        ("alg none", none_token, "not a valid JWT"),
        ("HS256 with the public key", hs_token, "not accepted"),
        (
            "expired",
            sign(&k1, &with("exp", json!(now - 600))),
            "expired",
        ),
        (
            "not yet valid",
            sign(&k1, &with("nbf", json!(now + 600))),
            "not valid yet",
        ),
        (
            "wrong issuer",
            sign(&k1, &with("iss", json!("https://evil.example"))),
            "issuer",
        ),
        (
            "wrong audience",
            sign(&k1, &with("aud", json!("https://other.example/mcp"))),
            "aud",
        ),
        ("no subject", sign(&k1, &no_sub), "\"sub\""),
        // A control character (NUL: PostgreSQL cannot store it as the tasks' owner) is no
        // principal.
        (
            "subject with NUL",
            sign(&k1, &with("sub", json!("a\u{0}b"))),
            "\"sub\"",
        ),
        (
            "subject with a line feed",
            sign(&k1, &with("sub", json!("a\nb"))),
            "\"sub\"",
        ),
        ("unknown kid", sign(&new_key("k9"), &good), "key id"),
        // Issue 29 #18: RFC 9068 §4 (an ID token is no access token) and RFC 7515 §4.1.11.
        (
            "typ JWT",
            sign_typed(&k1, &good, Some("JWT")),
            "typ \"jwt\"",
        ),
        ("no typ", sign_typed(&k1, &good, None), "typ"),
        ("crit", with_crit(&k1, &good), "crit"),
    ];
    for (what, token, says) in cases {
        let (status, challenge, body) = status_and_challenge(&tg, Some(&token)).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert!(
            challenge.contains("error=\"invalid_token\""),
            "{what}: {challenge}"
        );
        assert!(
            challenge.starts_with("Bearer resource_metadata=\""),
            "{what}"
        );
        assert!(err_message(&body).contains(says), "{what}: {body}");
    }
    let (status, challenge, body) =
        status_and_challenge(&tg, Some(&sign(&k1, &with("scope", json!("other"))))).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        challenge.contains("error=\"insufficient_scope\", scope=\"mcp\""),
        "{challenge}"
    );
    assert_eq!(up.count(), 0, "nothing reached the upstream");
    let refused = tg
        .metrics
        .http_rejections_total
        .with_label_values(&["auth"])
        .get();
    assert_eq!(refused, 15);
    assert_eq!(
        tg.metrics
            .http_rejections_total
            .with_label_values(&["scope"])
            .get(),
        1
    );
}

#[tokio::test]
async fn a_valid_token_is_not_forwarded_and_the_principal_header_is_set() {
    let k1 = new_key("k1");
    let idp = Idp::start(&[&k1]).await;
    let up = Upstream::mcp().await;
    let tg = Tg::start(oauth_toml(&idp, &up.url(), "")).await;
    let token = sign(&k1, &claims(&idp, "alice"));
    let r = tg
        .client()
        .with_token(&token)
        .req(initialize_body("1"))
        .header("x-principal", "spoofed")
        .send()
        .await;
    assert_eq!(r.status(), 200);
    let seen = &up.requests()[0];
    assert!(
        !seen.has_header("authorization"),
        "the token never goes upstream"
    );
    assert_eq!(
        seen.header_all("x-principal"),
        vec![format!("{}#alice", idp.issuer())]
    );
}

#[tokio::test]
async fn principals_own_their_tasks_across_sessions() {
    let k1 = new_key("k1");
    let idp = Idp::start(&[&k1]).await;
    let up = TaskServer::default().await;
    let tg = Tg::start(oauth_toml(&idp, &up.url(), "")).await;
    let alice_token = sign(&k1, &claims(&idp, "alice"));
    let mut alice = tg.client().with_token(&alice_token);
    alice.initialize().await;
    let mut bob = tg.client().with_token(&sign(&k1, &claims(&idp, "bob")));
    bob.initialize().await;
    let task_id = alice.create_task("1").await;
    let owner = tg.record(&task_id).unwrap().owner;
    assert_eq!(
        owner.to_string(),
        format!("principal:{}#alice", idp.issuer())
    );
    let v = bob.get("\"b\"", &task_id).await;
    assert_eq!(err_code(&v), -32602, "{v}");
    // Alice's session is hers (issue 16 #1): Bob carrying its id gets 404 like an unknown one.
    let bob_on_alice_session = bob.clone().with_session(alice.session.as_deref().unwrap());
    let r = bob_on_alice_session
        .send(rpc(
            "\"b2\"",
            "tasks/get",
            &json!({ "taskId": task_id }).to_string(),
        ))
        .await;
    assert_eq!(r.status(), 404);
    let listed = bob.list("\"l\"", None).await;
    assert_eq!(listed["result"]["tasks"], json!([]), "{listed}");
    let mut again = tg.client().with_token(&alice_token);
    again.initialize().await;
    assert_ne!(again.session, alice.session);
    let v = again.get("\"g\"", &task_id).await;
    assert_eq!(v["result"]["taskId"], json!(task_id), "{v}");
}

#[tokio::test]
async fn a_rotated_key_is_picked_up_and_a_removed_one_refused() {
    let (k1, k2) = (new_key("k1"), new_key("k2"));
    let idp = Idp::start(&[&k1]).await;
    let up = Upstream::mcp().await;
    let tg = Tg::start(oauth_toml(&idp, &up.url(), "")).await;
    let old = sign(&k1, &claims(&idp, "alice"));
    assert_eq!(status_and_challenge(&tg, Some(&old)).await.0, 200);
    idp.set_keys(&[&k2]);
    let new = sign(&k2, &claims(&idp, "alice"));
    // Fetched again within `jwks_min_refresh_ms` (at least 1 s) of the last fetch.
    assert!(until_admitted(&tg, Some(&new)).await, "new kid fetched");
    let (status, _, body) = status_and_challenge(&tg, Some(&old)).await;
    assert_eq!(status, 401, "the removed key is refused: {body}");
    assert!(err_message(&body).contains("\"k1\""), "{body}");
}

/// With the key set unreachable (hanging, then down) a token of a cached key is admitted, and
/// one naming a key not cached gets 503 within `fetch_timeout_ms`: the issuer may have rotated
/// that key in since, so it is not the token's fault (cold test: it was 401 `invalid_token`,
/// telling the client to throw a valid token away, where README promises 503). Once the set is
/// fetched again, a key not in it is 401.
#[tokio::test]
async fn with_the_key_set_unreachable_cached_keys_work_and_unknown_kids_fail_fast() {
    let k1 = new_key("k1");
    let idp = Idp::start(&[&k1]).await;
    let up = Upstream::mcp().await;
    // The polls below are failed authentications: not limited here.
    let limits = "[limits]\nauth_failures_per_minute = 100000\nauth_failures_burst = 100000\n";
    let tg = Tg::start(oauth_toml(&idp, &up.url(), limits)).await;
    let token = sign(&k1, &claims(&idp, "alice"));
    assert_eq!(status_and_challenge(&tg, Some(&token)).await.0, 200);
    let fetches = idp.jwks_fetches();
    idp.state.lock().unwrap().hang = true;
    let unknown = sign(&new_key("k7"), &claims(&idp, "alice"));
    // Within `jwks_min_refresh_ms` (1 s) of the last good fetch the set is not asked again:
    // 401; past it the fetch hangs until `fetch_timeout_ms` (500 ms) and fails: 503.
    eventually(STEP, || async {
        let started = Instant::now();
        let (status, _, body) = status_and_challenge(&tg, Some(&unknown)).await;
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "bounded by fetch_timeout_ms"
        );
        assert!(status == 401 || status == 503, "{status} {body}");
        (status == 503).then_some(())
    })
    .await
    .expect("503 once the set's fetch fails");
    // The failed fetch is remembered: the next one is 503 at once, with Retry-After.
    let started = Instant::now();
    let r = tg
        .client()
        .with_token(&unknown)
        .req(initialize_body("1"))
        .send()
        .await;
    assert_eq!(r.status(), 503);
    assert!(r.header("retry-after").is_some(), "503 without Retry-After");
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "not fetched again"
    );
    assert_eq!(
        status_and_challenge(&tg, Some(&token)).await.0,
        200,
        "cached key"
    );
    idp.state.lock().unwrap().hang = false;
    // Fetched again (at most once per `jwks_min_refresh_ms`): the set has no "k7".
    let refused = eventually(STEP, || async {
        let (status, _, body) = status_and_challenge(&tg, Some(&unknown)).await;
        (status == 401).then_some(body)
    })
    .await
    .expect("401 once the set is fetched again");
    assert!(err_message(&refused).contains("\"k7\""), "{refused}");
    idp.up.stop();
    let started = Instant::now();
    let r = tg
        .client()
        .with_token(&sign(&new_key("k8"), &claims(&idp, "alice")))
        .req(initialize_body("1"))
        .send()
        .await;
    // Within `jwks_min_refresh_ms` of the last good fetch the set is not asked again: "k8"
    // is refused as unknown (401); past it, the fetch fails and it is 503 with Retry-After.
    match r.status() {
        401 => {}
        503 => assert!(r.header("retry-after").is_some(), "503 without Retry-After"),
        other => panic!("unexpected {other}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(
        status_and_challenge(&tg, Some(&token)).await.0,
        200,
        "cached key"
    );
    assert!(idp.jwks_fetches() >= fetches);
}

async fn until_admitted(tg: &Tg, token: Option<&str>) -> bool {
    eventually(STEP, || async {
        (status_and_challenge(tg, token).await.0 == 200).then_some(())
    })
    .await
    .is_some()
}

#[tokio::test]
async fn the_rate_limit_answers_429_and_recovers() {
    let k1 = new_key("k1");
    let idp = Idp::start(&[&k1]).await;
    let up = Upstream::mcp().await;
    let limits = "[limits]\nrequests_per_second = 2\nburst = 2\n";
    let tg = Tg::start(oauth_toml(&idp, &up.url(), limits)).await;
    let (alice, bob) = (
        sign(&k1, &claims(&idp, "alice")),
        sign(&k1, &claims(&idp, "bob")),
    );
    let mut statuses = vec![];
    for _ in 0..3 {
        let r = tg
            .client()
            .with_token(&alice)
            .send(initialize_body("7"))
            .await;
        statuses.push((r.status(), r.header("retry-after"), r.json().await));
    }
    assert_eq!(statuses[0].0, 200);
    let (status, retry_after, body) = &statuses[2];
    assert_eq!(*status, 429, "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(err_code(body), -32029, "{body}");
    assert_eq!(
        status_and_challenge(&tg, Some(&bob)).await.0,
        200,
        "per principal"
    );
    assert!(until_admitted(&tg, Some(&alice)).await, "recovers");
    assert!(
        tg.metrics
            .http_rejections_total
            .with_label_values(&["rate_limit"])
            .get()
            >= 1
    );
}

#[tokio::test]
async fn in_flight_limit_in_bearer_mode() {
    let gate = Gate::new();
    let g = gate.clone();
    let up = Upstream::start(move |req| {
        ScriptedResponse::AfterGate(g.clone(), Box::new(ScriptedResponse::result_for(req, "{}")))
    })
    .await;
    let url = up.url();
    let tg = Tg::start(move |store| {
        let mut s = TgConfig::new(&url)
            .token("alice", "alice-token")
            .to_toml(store);
        s.push_str("\n[limits]\nmax_in_flight = 1\n");
        s
    })
    .await;
    let c = tg.client().with_token("alice-token");
    let held = {
        let c = c.clone();
        tokio::spawn(async move { c.send(rpc("1", "ping", "{}")).await.status() })
    };
    tokio::time::timeout(STEP, up.wait_for_count(1))
        .await
        .unwrap();
    let r = c.send(rpc("2", "ping", "{}")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));
    gate.open();
    assert_eq!(held.await.unwrap(), 200);
    assert_eq!(c.send(rpc("3", "ping", "{}")).await.status(), 200);
    assert_eq!(
        tg.metrics
            .http_rejections_total
            .with_label_values(&["in_flight"])
            .get(),
        1
    );
}

#[tokio::test]
async fn a_remembered_token_is_refused_once_it_expires() {
    let k1 = new_key("k1");
    let idp = Idp::start(&[&k1]).await;
    let up = Upstream::mcp().await;
    let tg = Tg::start(oauth_toml(&idp, &up.url(), "leeway_s = 0")).await;
    let mut c = claims(&idp, "alice");
    c["exp"] = json!(now_ms() / 1000 + 2);
    let token = sign(&k1, &c);
    // Accepted (and remembered), then refused by the remembered entry's own expiry check.
    assert_eq!(status_and_challenge(&tg, Some(&token)).await.0, 200);
    assert_eq!(status_and_challenge(&tg, Some(&token)).await.0, 200);
    let refused = eventually(STEP, || async {
        let (status, _, body) = status_and_challenge(&tg, Some(&token)).await;
        (status == 401).then_some(body)
    })
    .await
    .expect("the token expires");
    assert!(err_message(&refused).contains("expired"), "{refused}");
}

/// The 2026-07-28 era with OAuth principals (issue 14: "in either era"): Bob's `tasks/get`,
/// `tasks/update` and `tasks/cancel` of Alice's task are answered by taskgate with `-32602` (HTTP
/// 400) and never reach the upstream; Alice, with a fresh token, reaches her task.
#[tokio::test]
async fn principals_own_their_2026_tasks() {
    let k1 = new_key("k1");
    let idp = Idp::start(&[&k1]).await;
    let (up, _state) = modern_server().await;
    let tg = Tg::start(oauth_toml(&idp, &up.url(), "")).await;
    let url = tg.mcp_url();
    let alice = sign(&k1, &claims(&idp, "alice"));
    let bob = sign(&k1, &claims(&idp, "bob"));
    let task_id = create(&url, Some(&alice), "slow").await;
    let owner = tg.record(&task_id).expect("recorded").owner;
    assert_eq!(
        owner.to_string(),
        format!("principal:{}#alice", idp.issuer())
    );
    let forwarded = |up: &Upstream| {
        ["tasks/get", "tasks/update", "tasks/cancel"]
            .iter()
            .map(|m| count(up, m))
            .sum::<usize>()
    };
    for (n, method) in ["tasks/get", "tasks/update", "tasks/cancel"]
        .iter()
        .enumerate()
    {
        let (status, v) = task_call(&url, Some(&bob), 10 + n as u64, method, &task_id).await;
        assert_eq!((status, err_code(&v)), (400, -32602), "{method}: {v}");
    }
    assert_eq!(
        forwarded(&up),
        0,
        "none of Bob's requests reached the upstream"
    );
    let again = sign(&k1, &claims(&idp, "alice"));
    let (status, v) = task_call(&url, Some(&again), 20, "tasks/get", &task_id).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["taskId"], json!(task_id), "{v}");
    assert_eq!(forwarded(&up), 1);
}

/// Issue 29 #1: in oauth mode, a session id taskgate does not hold (one it never saw, as after a
/// restart, an idle reclaim or on another replica) is refused with 404 for POST, GET and DELETE
/// and nothing reaches the upstream, as in bearer mode. Before the fix (f2cd7c5) only
/// `mode = "bearer"` counted as "callers carry principals": Bob's `tools/call` on Alice's
/// upstream session got 200 from her session and his DELETE ended it.
#[tokio::test]
async fn a_session_id_taskgate_does_not_hold_is_refused_in_oauth_mode() {
    let k1 = new_key("k1");
    let idp = Idp::start(&[&k1]).await;
    let up = TaskServer::default().await;
    let tg = Tg::start(oauth_toml(&idp, &up.url(), "")).await;
    // Alice's session as the upstream issued it, which this taskgate does not hold.
    let direct = Req::mcp_post(&up.url(), initialize_body("1")).send().await;
    let alices = direct
        .header("mcp-session-id")
        .expect("the upstream issues a session");
    let before = up.up.count();
    let bob = tg
        .client()
        .with_token(&sign(&k1, &claims(&idp, "bob")))
        .with_session(&alices);
    let r = bob.send(call_body("2", "slow", None)).await;
    assert_eq!(r.status(), 404, "tools/call: {}", r.text().await);
    let token = sign(&k1, &claims(&idp, "bob"));
    for req in [Req::mcp_get(&tg.mcp_url()), Req::delete(&tg.mcp_url())] {
        let r = req
            .header("authorization", &format!("Bearer {token}"))
            .header("mcp-session-id", &alices)
            .header("mcp-protocol-version", "2025-11-25")
            .send()
            .await;
        assert_eq!(r.status(), 404);
    }
    assert_eq!(
        up.up.count(),
        before,
        "nothing of Bob's reached the upstream"
    );
}

/// Issue 29 #14: with several upstreams, each route is its own protected resource (RFC 9728):
/// `/mcp/<name>`'s metadata names `<origin>/mcp/<name>` as `resource`, and a token issued for
/// that resource (RFC 8707 `aud`) is accepted there and nowhere else; a token for the
/// configured audience is accepted everywhere. On f2cd7c5 the metadata of every route named
/// the configured audience, so a client following RFC 9728 asked for a token taskgate refused
/// on the route it had asked for.
#[tokio::test]
async fn each_route_is_a_protected_resource_of_its_own() {
    let k1 = new_key("k1");
    let idp = Idp::start(&[&k1]).await;
    let files = Upstream::mcp().await;
    let notes = Upstream::mcp().await;
    let (issuer, files_url, notes_url) = (idp.issuer(), files.url(), notes.url());
    let tg = Tg::start(move |store| {
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             [store]\npath = {store:?}\n[auth]\nmode = \"oauth\"\n[auth.oauth]\n\
             issuer = {issuer:?}\naudience = {AUDIENCE:?}\nfetch_timeout_ms = 500\n\
             [[upstream]]\nname = \"files\"\nurl = {files_url:?}\n\
             [[upstream]]\nname = \"notes\"\nurl = {notes_url:?}\n"
        )
    })
    .await;
    let metadata = format!(
        "http://{}/.well-known/oauth-protected-resource/mcp/files",
        tg.gw
    );
    let doc = Req::get(&metadata).send().await.json().await;
    assert_eq!(
        doc["resource"],
        json!("https://mcp.example.com/mcp/files"),
        "{doc}"
    );
    let mut for_files = claims(&idp, "alice");
    for_files["aud"] = json!("https://mcp.example.com/mcp/files");
    let token = sign(&k1, &for_files);
    let at = |route: &str| {
        let url = format!("http://{}/mcp/{route}", tg.gw);
        let token = token.clone();
        async move {
            Req::mcp_post(&url, initialize_body("1"))
                .header("authorization", &format!("Bearer {token}"))
                .send()
                .await
        }
    };
    assert_eq!(at("files").await.status(), 200);
    let refused = at("notes").await;
    assert_eq!(refused.status(), 401);
    assert!(refused
        .header("www-authenticate")
        .unwrap_or_default()
        .contains("oauth-protected-resource/mcp/notes\""));
    let everywhere = sign(&k1, &claims(&idp, "alice"));
    let r = Req::mcp_post(&format!("http://{}/mcp/notes", tg.gw), initialize_body("1"))
        .header("authorization", &format!("Bearer {everywhere}"))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        notes.received("initialize").len(),
        1,
        "only the token for the configured audience reached notes"
    );
}

/// Issue 29 #18: a key set that cannot be fetched is the service's trouble, not the caller's:
/// 503 with `Retry-After` and no internal detail in the answer (f2cd7c5: 401 `invalid_token`
/// carrying the fetch error's text).
#[tokio::test]
async fn a_key_set_outage_is_503_without_internal_detail() {
    let k1 = new_key("k1");
    let idp = Idp::start(&[&k1]).await;
    idp.up.stop();
    let up = Upstream::mcp().await;
    let tg = Tg::start(oauth_toml(&idp, &up.url(), "")).await;
    let token = sign(&k1, &claims(&idp, "alice"));
    let r = tg
        .client()
        .with_token(&token)
        .send(initialize_body("1"))
        .await;
    assert_eq!(r.status(), 503);
    assert!(r.header("retry-after").is_some());
    let body = r.json().await;
    let message = err_message(&body);
    assert!(
        !message.contains("127.0.0.1") && !message.contains("error"),
        "{message}"
    );
    assert_eq!(up.count(), 0);
}
