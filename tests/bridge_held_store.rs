//! Held sessions (a 2025-11-25 client on a pure 2026-07-28 upstream, see `tests/bridge_held.rs`)
//! across a `kill -9` of the real binary, and two review findings about them: a held session is
//! in the registry's store before its id is handed out, so after a restart the same
//! `Mcp-Session-Id` is served as the held session it was (its owner, capabilities and
//! `clientInfo`), its tasks are reachable and their `tasks/result` completes; an upstream's OAuth
//! 401 keeps its status; a full session table answers a held `initialize` 503 without an id.

use crate::common::*;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn create_body(id: &str) -> String {
    rpc(
        id,
        "tools/call",
        &json!({"name": "slow_compute", "arguments": {}, "task": {"ttl": 600000}}).to_string(),
    )
}

fn task_id_of(v: &Value) -> String {
    v.pointer("/result/task/taskId")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("not a CreateTaskResult: {v}"))
        .to_string()
}

/// Without authentication (a task's owner is the session id): a held session and two bridged
/// tasks, `kill -9`, restart on the same store. The same `Mcp-Session-Id` is served as the held
/// session (the stored `clientInfo` and capabilities go upstream, nothing carries a session
/// id upstream), `tasks/get`, `tasks/list`, `tasks/cancel` and a blocking `tasks/result` of the
/// tasks created before the kill work; an id of the held form that was never issued is 404 and
/// not forwarded. After a DELETE and another `kill -9`, the id is 404. On the code before held
/// sessions were stored, the restarted taskgate did not know the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_session_and_its_tasks_survive_kill_9() {
    let (up, state) = pure_server().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url()).write_for_binary(dir.path());
    let (mut p, gw, _) = spawn_binary(&cfg);
    let mut c = Client::new(&format!("http://{gw}/mcp"));
    let r = c.send(initialize_with(json!({"elicitation": {}}))).await;
    assert_eq!(r.status(), 200);
    let session = r.header("mcp-session-id").expect("a held session id");
    c.session = Some(session.clone());
    let t1 = task_id_of(&c.rpc(create_body("1")).await);
    let t2 = task_id_of(&c.rpc(create_body("2")).await);
    sigkill(&mut p);

    let (mut p, gw, _) = spawn_binary(&cfg);
    let c = Client::new(&format!("http://{gw}/mcp")).with_session(&session);
    let tools = c.send(rpc("3", "tools/list", "{}")).await;
    assert_eq!(
        tools.status(),
        200,
        "the held session is known after the restart"
    );
    let tools = tools.json().await;
    assert!(tools["result"]["tools"].is_array(), "{tools}");
    let sent = up.received("tools/list").pop().unwrap().json();
    let meta = &sent["params"]["_meta"];
    assert_eq!(
        meta["io.modelcontextprotocol/clientInfo"]["name"], "held-test",
        "{sent}"
    );
    assert!(
        meta["io.modelcontextprotocol/clientCapabilities"]["elicitation"].is_object(),
        "{sent}"
    );
    let got = c.get("4", &t1).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    let list = c.list("5", None).await;
    let listed: Vec<&str> = list["result"]["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .filter_map(|t| t["taskId"].as_str())
        .collect();
    assert!(
        listed.contains(&t1.as_str()) && listed.contains(&t2.as_str()),
        "{list}"
    );
    let cancelled = c.cancel("6", &t2).await;
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    let pending = {
        let c = c.clone();
        let t1 = t1.clone();
        tokio::spawn(async move { c.result("7", &t1).await })
    };
    assert!(up.wait_for_method("tasks/get", 2, STEP).await, "followed");
    state
        .lock()
        .unwrap()
        .tasks
        .insert(t1.clone(), "completed".into());
    let res = tokio::time::timeout(STEP * 2, pending)
        .await
        .expect("tasks/result completes")
        .unwrap();
    assert_eq!(
        res["result"]["content"][0]["text"],
        format!("done {t1}"),
        "{res}"
    );
    assert!(up
        .requests()
        .iter()
        .all(|r| !r.has_header("mcp-session-id")));

    // An id of the held form taskgate never issued: 404, nothing forwarded.
    let before = up.count();
    let forged = Client::new(&c.url).with_session(&format!("tgh-{}", "0".repeat(32)));
    let r = forged.send(rpc("8", "tools/list", "{}")).await;
    assert_eq!(r.status(), 404);
    assert_eq!(err_code(&r.json().await), -32001);
    assert_eq!(up.count(), before);

    // DELETE ends it for good: after another kill -9 the id is unknown.
    let del = Req::delete(&c.url)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert_eq!(del.status(), 200);
    sigkill(&mut p);
    let (_p, gw, _) = spawn_binary(&cfg);
    let c = Client::new(&format!("http://{gw}/mcp")).with_session(&session);
    let r = c.send(rpc("9", "tools/list", "{}")).await;
    assert_eq!(r.status(), 404);
}

/// With bearer auth, the owner binding of a held session survives a `kill -9`: bob gets 404 on
/// alice's session id (nothing goes upstream), alice's requests are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_sessions_owner_binding_survives_kill_9() {
    let (up, _) = pure_server().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .token("bob", "tok-b")
        .write_for_binary(dir.path());
    let (mut p, gw, _) = spawn_binary(&cfg);
    let url = format!("http://{gw}/mcp");
    let mut alice = Client::new(&url).with_token("tok-a");
    alice.initialize().await;
    let session = alice.session.clone().expect("a held session id");
    let t = task_id_of(&alice.rpc(create_body("1")).await);
    sigkill(&mut p);

    let (_p, gw, _) = spawn_binary(&cfg);
    let url = format!("http://{gw}/mcp");
    let before = up.count();
    let bob = Client::new(&url).with_token("tok-b").with_session(&session);
    let r = bob.send(rpc("2", "tools/list", "{}")).await;
    assert_eq!(r.status(), 404);
    assert_eq!(up.count(), before);
    let alice = Client::new(&url).with_token("tok-a").with_session(&session);
    let got = alice.get("3", &t).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
}

/// Found by review: on a held session, an upstream's HTTP 401 whose JSON body is no JSON-RPC
/// message (an OAuth `{"error":"invalid_token"}`) is not rewritten to 200 as a 2026 JSON-RPC
/// error answer is. It refused taskgate's request (no credentials configured), not the
/// client's token (break-edge F8, review 18b #6): 502 `-32603` saying so, without the
/// upstream's `WWW-Authenticate`.
#[tokio::test]
async fn a_held_sessions_upstream_401_keeps_its_status() {
    let state: Shared = Default::default();
    let pure = pure_2026(state);
    let up = Upstream::start(move |req: &RecordedRequest| {
        if req.rpc_method().as_deref() == Some("tools/list") {
            return ScriptedResponse::status(
                401,
                Some("application/json"),
                r#"{"error":"invalid_token"}"#,
            )
            .header("www-authenticate", "Bearer error=\"invalid_token\"");
        }
        pure(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    assert!(c.session.is_some());
    let r = c.send(rpc("1", "tools/list", "{}")).await;
    assert_eq!(r.status(), 502);
    assert_eq!(r.header("www-authenticate"), None);
    let v = r.json().await;
    assert_eq!(v["error"]["code"], -32603, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("refused the request (HTTP 401)"),
        "{v}"
    );
}

/// Found by review: held `initialize`s that pass the full-table check together (their
/// `server/discover`s held until both are in flight) with room for one more session: one gets a
/// session, the other 503 and no `Mcp-Session-Id` (not an id that is 404 at once); the sessions
/// already held keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_table_answers_a_held_initialize_503_without_an_id() {
    let state: Shared = Default::default();
    let pure = pure_2026(state);
    let gate = Gate::new();
    let gating = Arc::new(AtomicBool::new(false));
    let up = {
        let (gate, gating) = (gate.clone(), gating.clone());
        Upstream::start(move |req: &RecordedRequest| {
            let answer = pure(req);
            if req.rpc_method().as_deref() == Some("server/discover")
                && gating.load(Ordering::SeqCst)
            {
                return answer.after_gate(&gate);
            }
            answer
        })
        .await
    };
    let tg = TgConfig::new(&up.url())
        .gateway("max_sessions = 2")
        .start()
        .await;
    let mut first = tg.client();
    first.initialize().await;
    assert!(first.session.is_some());
    let discovers = up.received("server/discover").len();
    gating.store(true, Ordering::SeqCst);
    let opening: Vec<_> = (0..2)
        .map(|_| {
            let c = tg.client();
            tokio::spawn(async move {
                let r = c.send(initialize_body("\"init\"")).await;
                (r.status(), r.header("mcp-session-id"))
            })
        })
        .collect();
    assert!(
        up.wait_for_method("server/discover", discovers + 2, STEP)
            .await,
        "both initializes are past the full-table check"
    );
    gate.open();
    let mut answers = Vec::new();
    for o in opening {
        answers.push(o.await.unwrap());
    }
    answers.sort();
    assert_eq!(answers[0].0, 200, "{answers:?}");
    assert!(answers[0].1.is_some(), "{answers:?}");
    assert_eq!(answers[1], (503, None), "{answers:?}");
    // The sessions held keep working.
    for c in [
        &first,
        &tg.client().with_session(answers[0].1.as_ref().unwrap()),
    ] {
        let r = c.send(rpc("2", "tools/list", "{}")).await;
        assert_eq!(r.status(), 200);
    }
}
