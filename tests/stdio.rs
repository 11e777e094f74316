//! stdio upstreams (issue 31): a `command` upstream behind taskgate, with the scripted server
//! `tests/stdio/fake_server.py` (it logs every line it reads, so a test counts what reached the
//! child's stdin, and its pid at each start).
//!
//! Shared mode: 100 identical concurrent `tasks/cancel` make one on the child's stdin; two
//! clients using the same JSON-RPC id each get their own answer; `notifications/cancelled`
//! reaches the child with the id the child saw; `kill -9` of the child mid-task fails the task
//! (status message, both audit facts), the child is restarted and the next call works;
//! `/readyz` is red while no child is live. The real binary: SIGTERM and `kill -9` of taskgate
//! leave no child. `per_session`: a child per session, ended by `DELETE`.

use crate::common::*;

use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

const SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/stdio/fake_server.py");

/// A scratch directory for the child's log and pid files (kept while the test runs).
struct Kid {
    dir: tempfile::TempDir,
}

impl Kid {
    fn new() -> Kid {
        Kid {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The `[[upstream]]` of the scripted server: `lines` (keys), then its `[upstream.env]`
    /// with the log and pid files and `env` (`KEY = "value"` lines).
    fn upstream(&self, lines: &str, env: &str) -> String {
        format!(
            "\n[[upstream]]\nname = \"default\"\ncommand = [\"python3\", {SERVER:?}]\ntimeout_ms = 5000\n{lines}\n[upstream.env]\nSTDIO_LOG = {:?}\nSTDIO_PIDS = {:?}\n{env}\n",
            self.path("log").display().to_string(),
            self.path("pids").display().to_string(),
        )
    }

    /// What the child read, one JSON message per line.
    fn seen(&self) -> Vec<Value> {
        std::fs::read_to_string(self.path("log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn seen_method(&self, method: &str) -> Vec<Value> {
        self.seen()
            .into_iter()
            .filter(|m| m["method"] == method)
            .collect()
    }

    /// The pids the child had, one per start.
    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path("pids"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

fn toml(store: &str, upstream: &str) -> String {
    format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\npath = {store:?}\n\n[auth]\nmode = \"none\"\n{upstream}"
    )
}

/// `tools/call` of the child's `echo` (`text`, answered after `delay_ms`) as request `id`
/// (a JSON string), sent in the background.
fn echo_call(
    c: &Client,
    id: &str,
    text: &str,
    delay_ms: u64,
) -> tokio::task::JoinHandle<Result<Resp, String>> {
    let call = json!({"name": "echo", "arguments": {"text": text, "delay_ms": delay_ms}});
    tokio::spawn(
        c.req(rpc(&format!("\"{id}\""), "tools/call", &call.to_string()))
            .try_send(),
    )
}

/// The client gives up on request `id` (a JSON string): its `notifications/cancelled`,
/// answered 202.
async fn give_up(c: &Client, id: &str) {
    let params = json!({"requestId": id, "reason": "the user gave up"}).to_string();
    let note = c
        .send(notification("notifications/cancelled", &params))
        .await;
    assert_eq!(note.status(), 202);
}

/// Waits (polling, up to 10 s) until `check` holds.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Waits until `/readyz` answers `code`.
async fn readyz(admin: std::net::SocketAddr, code: u16) -> Value {
    for _ in 0..500 {
        let (status, body) = admin_json(admin, "/readyz").await;
        if status == code {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("/readyz never answered {code}");
}

/// Whether process `pid` is gone (reaped, or a zombie nobody waits for).
fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Stalls the child (its `stall` tool: it stops reading its stdin, for `resume_ms` or for good)
/// through `c`, asserting the tool answered first.
async fn stall(c: &mut Client, resume_ms: Option<u64>) {
    let arguments = resume_ms.map_or(json!({}), |ms| json!({"resume_ms": ms}));
    let stall = json!({"name": "stall", "arguments": arguments}).to_string();
    let stalled = c.rpc(rpc("1", "tools/call", &stall)).await;
    assert_eq!(
        stalled["result"]["content"][0]["text"], "stalled",
        "{stalled}"
    );
}

/// Makes the child a slow reader (its `stall` tool with `trickle_ms`: one line every 500 ms,
/// for `resume_ms`, then as before) through `c`: its write queue stays full, so writes wait
/// `timeout_ms` and get 504, yet lines still reach it (a deaf child, one that reads nothing
/// while a write waits `timeout_ms`, is ended instead: the liveness rule).
async fn slow_down(c: &mut Client, resume_ms: u64) {
    let arguments = json!({"resume_ms": resume_ms, "trickle_ms": 500});
    let stall = json!({"name": "stall", "arguments": arguments}).to_string();
    let stalled = c.rpc(rpc("1", "tools/call", &stall)).await;
    assert_eq!(
        stalled["result"]["content"][0]["text"], "stalled",
        "{stalled}"
    );
}

/// A `notifications/message` of 16 KiB: a few hundred fill a stalled child's pipe (64 KiB) and
/// taskgate's stdin write queue (256 lines).
fn padded_note() -> String {
    let pad = "z".repeat(16 * 1024);
    notification("notifications/message", &json!({"pad": pad}).to_string())
}

async fn start(child: &Kid, lines: &str, env: &str) -> Tg {
    let upstream = child.upstream(lines, env);
    let tg = Tg::start(|store| toml(store, &upstream)).await;
    readyz(tg.admin, 200).await;
    tg
}

#[tokio::test]
async fn one_hundred_identical_cancels_make_one_on_the_childs_stdin() {
    let child = Kid::new();
    let tg = start(&child, "", "STDIO_CANCEL_DELAY_MS = \"300\"").await;
    let mut client = tg.client();
    client.initialize().await;
    let task = client.create_task("1").await;
    let cancels = (0..100).map(|i| {
        let client = Client::new(&tg.mcp_url()).with_session(client.session.as_deref().unwrap());
        let task = task.clone();
        async move { client.cancel(&format!("{}", 100 + i), &task).await }
    });
    let answers = futures_util::future::join_all(cancels).await;
    let cancelled = answers
        .iter()
        .filter(|a| a.pointer("/result/status") == Some(&json!("cancelled")))
        .count();
    let refused = answers.iter().filter(|a| a.get("error").is_some()).count();
    assert_eq!(cancelled + refused, 100, "{answers:?}");
    assert!(cancelled >= 1);
    assert_eq!(
        child.seen_method("tasks/cancel").len(),
        1,
        "one tasks/cancel reached the child"
    );
}

#[tokio::test]
async fn two_clients_with_the_same_id_each_get_their_own_answer() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let (mut a, mut b) = (tg.client(), tg.client());
    let ia = a.initialize().await;
    let ib = b.initialize().await;
    assert_ne!(a.session, b.session, "a session each");
    assert_eq!(
        ia["result"], ib["result"],
        "the child's one initialize answer"
    );
    assert_eq!(ia["result"]["serverInfo"]["name"], "fake-stdio");
    let call = |text: &str| {
        rpc(
            "7",
            "tools/call",
            &json!({"name": "echo", "arguments": {"text": text, "delay_ms": 300}}).to_string(),
        )
    };
    let (ra, rb) = tokio::join!(a.rpc(call("for-a")), b.rpc(call("for-b")));
    assert_eq!(ra["id"], 7);
    assert_eq!(ra["result"]["content"][0]["text"], "for-a");
    assert_eq!(rb["id"], 7);
    assert_eq!(rb["result"]["content"][0]["text"], "for-b");
    assert_eq!(child.seen_method("initialize").len(), 1, "initialized once");
    let ids: Vec<Value> = child
        .seen_method("tools/call")
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1], "the child saw two ids");
}

#[tokio::test]
async fn notifications_cancelled_reaches_the_child_with_the_id_it_saw() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let mut client = tg.client();
    client.initialize().await;
    let body = rpc(
        "\"slow-1\"",
        "tools/call",
        &json!({"name": "echo", "arguments": {"text": "late", "delay_ms": 2000}}).to_string(),
    );
    let waiting = {
        let client = Client::new(&tg.mcp_url()).with_session(client.session.as_deref().unwrap());
        tokio::spawn(async move { client.send(body).await.status() })
    };
    until("the child reads the call", || {
        !child.seen_method("tools/call").is_empty()
    })
    .await;
    let child_id = child.seen_method("tools/call")[0]["id"].clone();
    assert!(child_id.is_u64(), "taskgate's own id: {child_id}");
    let status = client
        .notify(
            "notifications/cancelled",
            json!({"requestId": "slow-1", "reason": "no longer needed"}),
        )
        .await;
    assert_eq!(status, 202);
    until("the child reads the cancellation", || {
        !child.seen_method("notifications/cancelled").is_empty()
    })
    .await;
    let seen = child.seen_method("notifications/cancelled");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["params"]["requestId"], child_id);
    waiting.abort();
}

#[tokio::test]
async fn a_child_killed_mid_task_fails_the_task_and_is_restarted() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let mut client = tg.client();
    client.initialize().await;
    let task = client.create_task("1").await;
    assert_eq!(client.get("2", &task).await["result"]["status"], "working");
    let pid = child.pids()[0];
    // SAFETY: a signal to the child this test's taskgate started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    until("the task is failed", || {
        tg.record(&task)
            .is_some_and(|r| r.status.as_str() == "failed" && r.released_at.is_some())
    })
    .await;
    let record = tg.record(&task).expect("record");
    assert!(
        record
            .status_message
            .as_deref()
            .is_some_and(|m| m.contains("restarted") && m.contains("default")),
        "{:?}",
        record.status_message
    );
    let audit = tg
        .registry
        .store()
        .audit_for("default", &task)
        .expect("audit");
    let events: Vec<&str> = audit.iter().map(|e| e.event.as_str()).collect();
    assert!(events.contains(&"resources_released"), "{events:?}");
    until("a second child", || child.pids().len() == 2).await;
    readyz(tg.admin, 200).await;
    // The client sees it failed too: the new child never knew the task, taskgate answers.
    let got = client.get("4", &task).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    assert!(
        got["result"]["statusMessage"]
            .as_str()
            .is_some_and(|m| m.contains("restarted")),
        "{got}"
    );
    assert_eq!(
        child.seen_method("tasks/get").len(),
        1,
        "not asked of the new child"
    );
    let again = client
        .rpc(rpc(
            "3",
            "tools/call",
            &json!({"name": "echo", "arguments": {"text": "back"}}).to_string(),
        ))
        .await;
    assert_eq!(again["result"]["content"][0]["text"], "back");
    assert_eq!(again["result"]["pid"], child.pids()[1]);
    let metrics = tg.metrics_text().await;
    assert!(
        metrics.contains("taskgate_upstream_restarts_total{upstream=\"default\"} 1"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("restarts"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// break-tasks M7: a task failed because its child died is answered from its record on any
/// session of its owner: a new, valid session's `tasks/result` gets the error the task was
/// failed with (HTTP 200), and `tasks/get` the failed task, never the dead child's session's
/// HTTP 404 `-32001` (which tells a client its own session is gone).
#[tokio::test]
async fn a_task_of_a_dead_child_is_answered_from_its_record_on_a_new_session() {
    let child = Kid::new();
    let upstream = child.upstream("", "");
    let token = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"alice-token"));
    let tg = Tg::start(|store| {
        toml(store, &upstream).replace(
            "[auth]\nmode = \"none\"\n",
            &format!("[auth]\nmode = \"bearer\"\n\n[[auth.token]]\nprincipal = \"alice\"\nsha256 = {token:?}\n"),
        )
    })
    .await;
    readyz(tg.admin, 200).await;
    let mut first = tg.client().with_token("alice-token");
    first.initialize().await;
    let task = first.create_task("1").await;
    assert_eq!(first.get("2", &task).await["result"]["status"], "working");
    let pid = child.pids()[0];
    // SAFETY: a signal to the child this test's taskgate started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    until("the task is failed", || {
        tg.record(&task)
            .is_some_and(|r| r.status.as_str() == "failed" && r.released_at.is_some())
    })
    .await;
    until("a second child", || child.pids().len() == 2).await;
    readyz(tg.admin, 200).await;
    let mut second = tg.client().with_token("alice-token");
    second.initialize().await;
    assert_ne!(first.session, second.session);
    // `rpc` asserts HTTP 200.
    let result = second.result("3", &task).await;
    assert_eq!(err_code(&result), -32603, "{result}");
    assert!(err_message(&result).contains("restarted"), "{result}");
    let got = second.get("4", &task).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    assert!(
        got["result"]["statusMessage"]
            .as_str()
            .is_some_and(|m| m.contains("restarted")),
        "{got}"
    );
    let cancel = second.cancel("5", &task).await;
    assert_eq!(err_code(&cancel), -32602, "terminal: {cancel}");
    // A 2026-07-28 request of the owner (no session; README: a task is reachable across eras)
    // is answered from the record too, the failed `DetailedTask` with the error, not routed
    // to the dead child's session (review 17 #13: HTTP 404 `-32001`).
    let url = format!("http://{}/mcp", tg.gw);
    let (status, modern) = send(modern_req(
        &url,
        Some("alice-token"),
        8,
        "tasks/get",
        json!({ "taskId": task }),
    ))
    .await;
    assert_eq!(status, 200, "{modern}");
    assert_eq!(modern["result"]["status"], "failed", "{modern}");
    assert_eq!(modern["result"]["error"]["code"], -32603, "{modern}");
    // The creating session is answered the same way.
    let result = first.result("6", &task).await;
    assert_eq!(err_code(&result), -32603, "{result}");
    assert!(
        child.seen_method("tasks/result").is_empty(),
        "never asked of a child"
    );
}

#[tokio::test]
async fn a_request_of_the_child_reaches_the_client_whose_call_it_serves() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let client = client_with(&tg.mcp_url(), json!({"elicitation": {}})).await;
    let call = rpc(
        "\"q\"",
        "tools/call",
        &json!({"name": "ask", "arguments": {}}).to_string(),
    );
    let r = client.send(call).await;
    assert_eq!(r.status(), 200);
    let mut events = r.sse();
    let asked = events.next_event(STEP).await.json();
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    let accepted = client
        .send(rpc_result(
            &asked["id"].to_string(),
            r#"{"action":"accept","content":{}}"#,
        ))
        .await;
    assert_eq!(accepted.status(), 202);
    let answer = events.next_event(STEP).await.json();
    assert_eq!(answer["id"], "q", "{answer}");
    assert!(
        answer["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("accept")),
        "{answer}"
    );
    // Another client cannot answer it: only the session it was sent to may.
    let mut other = tg.client();
    other.initialize().await;
    let r = other.send(rpc_result("\"ask-9\"", "{}")).await;
    assert_eq!(r.status(), 202);
    assert!(
        !child.seen().iter().any(|m| m["id"] == "ask-9"),
        "an answer from a session not asked is dropped"
    );
}

#[tokio::test]
async fn readyz_is_red_while_no_child_is_live() {
    let child = Kid::new();
    let upstream = child.upstream("", "STDIO_CRASH_INIT = \"1\"");
    let tg = Tg::start(|store| toml(store, &upstream)).await;
    let body = readyz(tg.admin, 503).await;
    assert!(
        body["upstreams"]["default"]
            .as_str()
            .is_some_and(|s| s.starts_with("unavailable")),
        "{body}"
    );
    // A request gets an error naming the upstream, not a hang.
    let mut client = tg.client();
    let r = client.send(initialize_body("1")).await;
    let text = r.text().await;
    assert!(text.contains("default"), "{text}");
    client.session = None;
}

#[tokio::test]
async fn per_session_gives_each_session_its_own_child_and_delete_ends_it() {
    let child = Kid::new();
    let tg = start(&child, "process = \"per_session\"", "").await;
    let (mut a, mut b) = (tg.client(), tg.client());
    let ia = a.initialize().await;
    let ib = b.initialize().await;
    let (pa, pb) = (
        ia["result"]["serverInfo"]["pid"].as_i64().expect("pid") as i32,
        ib["result"]["serverInfo"]["pid"].as_i64().expect("pid") as i32,
    );
    assert_ne!(pa, pb, "a child each");
    let echo = rpc(
        "1",
        "tools/call",
        &json!({"name": "echo", "arguments": {"text": "x"}}).to_string(),
    );
    assert_eq!(a.rpc(echo.clone()).await["result"]["pid"], pa);
    assert_eq!(b.rpc(echo.clone()).await["result"]["pid"], pb);
    let r = Req::delete(&tg.mcp_url())
        .header("mcp-session-id", a.session.as_deref().unwrap())
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert!(r.status() < 300, "DELETE: {}", r.status());
    until("the session's child is gone", || process_gone(pa)).await;
    assert!(!process_gone(pb), "the other session's child runs on");
    assert_eq!(b.rpc(echo).await["result"]["pid"], pb);
}

#[tokio::test]
async fn per_session_children_idle_past_the_session_idle_limit_are_ended() {
    let child = Kid::new();
    let upstream = child.upstream("process = \"per_session\"", "");
    let tg = Tg::start(|store| {
        toml(store, &upstream).replace(
            "listen = \"127.0.0.1:0\"\n\n[admin]",
            "listen = \"127.0.0.1:0\"\nsession_idle_ms = 1000\n\n[admin]",
        )
    })
    .await;
    let mut client = tg.client();
    let init = client.initialize().await;
    let pid = init["result"]["serverInfo"]["pid"].as_i64().expect("pid") as i32;
    assert!(!process_gone(pid));
    until("the idle child is ended", || process_gone(pid)).await;
}

/// A `per_session` child answering a request is not idle: a call longer than
/// `gateway.session_idle_ms` gets its answer (its child was ended mid-call, the client got 502),
/// and a gateway task's held call (whose `tasks/get` polls never reach the child) completes
/// instead of failing with its child. Idle time counts once nothing is in flight.
#[tokio::test]
async fn a_per_session_child_is_not_idle_while_it_answers_a_request() {
    let child = Kid::new();
    let upstream = child.upstream(
        "process = \"per_session\"\ntasks = \"gateway\"",
        "STDIO_NO_TASKS = \"1\"",
    );
    let tg = Tg::start(|store| {
        toml(store, &upstream).replace(
            "listen = \"127.0.0.1:0\"\n\n[admin]",
            "listen = \"127.0.0.1:0\"\nsession_idle_ms = 1000\n\n[admin]",
        )
    })
    .await;
    let mut c = tg.client();
    let init = c.initialize().await;
    let pid = init["result"]["serverInfo"]["pid"].as_i64().expect("pid") as i32;
    let echo = |delay: u64, task: bool| {
        let mut params = json!({"name": "echo", "arguments": {"text": "done", "delay_ms": delay}});
        if task {
            params["task"] = json!({"ttl": 60000});
        }
        params.to_string()
    };
    let created = c.rpc(rpc("1", "tools/call", &echo(2500, true))).await;
    let task = created["result"]["task"]["taskId"]
        .as_str()
        .expect("a gateway task")
        .to_string();
    let answer = c.rpc(rpc("2", "tools/call", &echo(2500, false))).await;
    assert_eq!(answer["result"]["content"][0]["text"], "done", "{answer}");
    until("the gateway task completes", || {
        tg.record(&task)
            .is_some_and(|r| r.status.as_str() != "working")
    })
    .await;
    let record = tg.record(&task).expect("record");
    assert_eq!(
        record.status.as_str(),
        "completed",
        "{:?}",
        record.status_message
    );
    assert!(!process_gone(pid), "the child runs on");
    until("the child, idle now, is ended", || process_gone(pid)).await;
}

/// The real binary with one stdio upstream whose child ignores the end of its stdin (only a
/// signal ends it); returns it and the child's pid.
async fn binary_with_child(child: &Kid) -> (TaskgateProcess, i32) {
    let upstream = child.upstream("", "STDIO_IGNORE_EOF = \"1\"");
    let config = child.path("taskgate.toml");
    let store = child.path("store");
    std::fs::write(&config, toml(store.to_str().unwrap(), &upstream)).unwrap();
    let mut p = TaskgateProcess::spawn(&["serve", "--config", config.to_str().unwrap()], &[]);
    let (_, admin) = p.listening();
    readyz(admin, 200).await;
    let pid = child.pids()[0];
    assert!(!process_gone(pid));
    (p, pid)
}

#[tokio::test]
async fn sigterm_of_taskgate_leaves_no_child() {
    let child = Kid::new();
    let (mut p, pid) = binary_with_child(&child).await;
    p.sigterm();
    let status = p.wait_exit(Duration::from_secs(15)).expect("exits");
    assert!(status.success(), "{}", p.stderr());
    assert!(process_gone(pid), "the child went with taskgate");
}

#[tokio::test]
async fn sigterm_of_taskgate_ends_per_session_children_in_order() {
    let child = Kid::new();
    let upstream = child.upstream("process = \"per_session\"", "STDIO_IGNORE_EOF = \"1\"");
    let config = child.path("taskgate.toml");
    let store = child.path("store");
    std::fs::write(&config, toml(store.to_str().unwrap(), &upstream)).unwrap();
    let mut p = TaskgateProcess::spawn(&["serve", "--config", config.to_str().unwrap()], &[]);
    let (gw, _) = p.listening();
    let mut client = Client::new(&format!("http://{gw}/mcp"));
    let init = client.initialize().await;
    let pid = init["result"]["serverInfo"]["pid"].as_i64().expect("pid") as i32;
    p.sigterm();
    let status = p.wait_exit(Duration::from_secs(15)).expect("exits");
    assert!(status.success());
    assert!(process_gone(pid), "the session's child went with taskgate");
    // Ended by taskgate (stdin closed, then SIGTERM: it ignores EOF), not by the kernel's
    // parent-death SIGKILL when a serving thread ended.
    let log = p.stderr();
    assert!(log.contains("exited after SIGTERM"), "{log}");
}

#[tokio::test]
async fn tasks_of_a_taskgate_killed_with_its_child_are_failed_at_the_next_start() {
    let child = Kid::new();
    let upstream = child.upstream("", "");
    let config = child.path("taskgate.toml");
    let store = child.path("store");
    std::fs::write(&config, toml(store.to_str().unwrap(), &upstream)).unwrap();
    let args = ["serve", "--config", config.to_str().unwrap()];
    let mut p = TaskgateProcess::spawn(&args, &[]);
    let (gw, admin) = p.listening();
    readyz(admin, 200).await;
    let mut client = Client::new(&format!("http://{gw}/mcp"));
    client.initialize().await;
    let task = client.create_task("1").await;
    p.signal(libc::SIGKILL);
    p.wait_exit(Duration::from_secs(5)).expect("killed");
    let mut again = TaskgateProcess::spawn(&args, &[]);
    let (_, admin) = again.listening();
    let path = format!("/admin/tasks/default/{task}");
    let mut record = Value::Null;
    for _ in 0..250 {
        let (status, body) = admin_json(admin, &path).await;
        if status == 200 && body["task"]["status"] == "failed" {
            record = body;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(record["task"]["status"], "failed", "{record}");
    assert!(
        record["task"]["status_message"]
            .as_str()
            .is_some_and(|m| m.contains("taskgate restarted")),
        "{record}"
    );
    again.sigterm();
    again.wait_exit(Duration::from_secs(15)).expect("exits");
}

/// break-tasks M7, after a restart: the tasks a `kill -9`ed taskgate's child took with it are
/// `failed` at the next start, and their owner's new session gets the failed task and the error
/// from the record (HTTP 200), not the HTTP 404 `-32001` of the gone child's session that the
/// task was routed to (a 404 tells the SDK client its own, valid session is gone).
#[tokio::test]
async fn a_task_failed_at_the_next_start_is_answered_from_its_record() {
    let child = Kid::new();
    let upstream = child.upstream("", "");
    let config = child.path("taskgate.toml");
    let store = child.path("store");
    let token = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"alice-token"));
    let text = toml(store.to_str().unwrap(), &upstream).replace(
        "[auth]\nmode = \"none\"\n",
        &format!("[auth]\nmode = \"bearer\"\n\n[[auth.token]]\nprincipal = \"alice\"\nsha256 = {token:?}\n"),
    );
    std::fs::write(&config, text).unwrap();
    let args = ["serve", "--config", config.to_str().unwrap()];
    let mut p = TaskgateProcess::spawn(&args, &[]);
    let (gw, admin) = p.listening();
    readyz(admin, 200).await;
    let mut client = Client::new(&format!("http://{gw}/mcp")).with_token("alice-token");
    client.initialize().await;
    let task = client.create_task("1").await;
    p.signal(libc::SIGKILL);
    p.wait_exit(Duration::from_secs(5)).expect("killed");
    let mut again = TaskgateProcess::spawn(&args, &[]);
    let (gw, admin) = again.listening();
    readyz(admin, 200).await;
    let path = format!("/admin/tasks/default/{task}");
    let mut failed = false;
    for _ in 0..250 {
        let (status, body) = admin_json(admin, &path).await;
        if status == 200 && body["task"]["status"] == "failed" {
            failed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(failed, "the task is failed at the next start");
    let mut fresh = Client::new(&format!("http://{gw}/mcp")).with_token("alice-token");
    fresh.initialize().await;
    // `rpc` asserts HTTP 200.
    let result = fresh.result("2", &task).await;
    assert_eq!(err_code(&result), -32603, "{result}");
    assert!(
        err_message(&result).contains("taskgate restarted"),
        "{result}"
    );
    let got = fresh.get("3", &task).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    let cancel = fresh.cancel("4", &task).await;
    assert_eq!(err_code(&cancel), -32602, "terminal: {cancel}");
    again.sigterm();
    again.wait_exit(Duration::from_secs(15)).expect("exits");
}

#[tokio::test]
async fn kill_9_of_taskgate_leaves_no_child() {
    let child = Kid::new();
    let (mut p, pid) = binary_with_child(&child).await;
    p.signal(libc::SIGKILL);
    p.wait_exit(Duration::from_secs(5)).expect("killed");
    until("the parent-death signal ends the child", || {
        process_gone(pid)
    })
    .await;
}

/// Issue 31: many `per_session` children dying at once lose no death: every task they ran
/// becomes `failed` (the deaths outnumber any queue the announcements pass through).
#[tokio::test]
async fn many_children_dying_at_once_fail_every_task() {
    const N: usize = 100;
    let child = Kid::new();
    let tg = start(&child, "process = \"per_session\"", "").await;
    let mut tasks = Vec::new();
    for chunk in 0..N / 10 {
        let made = (0..10).map(|i| {
            let mut client = tg.client();
            async move {
                client.initialize().await;
                client.create_task(&format!("{}", chunk * 10 + i)).await
            }
        });
        tasks.extend(futures_util::future::join_all(made).await);
    }
    let pids = child.pids();
    assert_eq!(pids.len(), N);
    for pid in &pids {
        // SAFETY: a signal to a child this test's taskgate started.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    for _ in 0..750 {
        let working = tasks
            .iter()
            .filter(|t| tg.record(t).is_some_and(|r| r.status.as_str() != "failed"))
            .count();
        if working == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let working: Vec<_> = tasks
        .iter()
        .filter(|t| tg.record(t).is_some_and(|r| r.status.as_str() != "failed"))
        .collect();
    panic!(
        "{} of {N} tasks never failed: {:?}",
        working.len(),
        &working[..working.len().min(5)]
    );
}

/// Issue 31: a child that closes its stdout, or its stdin, but runs on is ended and restarted
/// (a closed pipe is a dead peer), not answered "closed its stdout" forever.
#[tokio::test]
async fn a_child_that_closes_its_stdout_or_stdin_is_restarted() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let mut client = tg.client();
    client.initialize().await;
    let call = |id: &str, name: &str| {
        rpc(
            id,
            "tools/call",
            &json!({"name": name, "arguments": {"text": "back"}}).to_string(),
        )
    };
    let first = child.pids()[0];
    let hushed = client.send(call("1", "hush")).await;
    assert!(hushed.status() >= 400 || hushed.text().await.contains("error"));
    until("a second child", || child.pids().len() == 2).await;
    until("the first child is gone", || process_gone(first)).await;
    readyz(tg.admin, 200).await;
    let again = client.rpc(call("2", "echo")).await;
    assert_eq!(again["result"]["pid"], child.pids()[1], "{again}");
    // Its stdin closed: the next write fails, and the child is ended and restarted too.
    let deaf = client.rpc(call("3", "deafen")).await;
    assert_eq!(deaf["result"]["content"][0]["text"], "deaf", "{deaf}");
    let _ = client.send(call("4", "echo")).await;
    until("a third child", || child.pids().len() == 3).await;
    until("the second child is gone", || process_gone(child.pids()[1])).await;
    readyz(tg.admin, 200).await;
    let again = client.rpc(call("5", "echo")).await;
    assert_eq!(again["result"]["pid"], child.pids()[2], "{again}");
}

/// Gateway-owned tasks (issue 32) on a stdio child without task support: `initialize` offers
/// tasks, the plain call reaches the child's stdin (no `params.task`) and its result is the
/// task's; a `tasks/cancel` reaches the child as one `notifications/cancelled` naming the id the
/// child saw for the call.
#[tokio::test]
async fn gateway_tasks_on_a_stdio_child_without_tasks() {
    let child = Kid::new();
    let tg = start(&child, "tasks = \"gateway\"", "STDIO_NO_TASKS = \"1\"").await;
    let mut c = tg.client();
    let init = c.initialize().await;
    assert!(
        init["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"].is_object(),
        "{init}"
    );
    let call = |id: &str, delay: u64| {
        rpc(
            id,
            "tools/call",
            &json!({"name": "slow", "arguments": {"text": "hi", "delay_ms": delay}, "task": {"ttl": 60000}})
                .to_string(),
        )
    };
    let task_of = |v: &Value| v["result"]["task"]["taskId"].as_str().unwrap().to_string();
    let t = task_of(&c.rpc(call("1", 200)).await);
    let r = c.result("2", &t).await;
    assert_eq!(r["result"]["content"][0]["text"], "hi", "{r}");
    let t2 = task_of(&c.rpc(call("3", 3000)).await);
    until("the child read the second call", || {
        child.seen_method("tools/call").len() >= 2
    })
    .await;
    let cancelled = c.cancel("4", &t2).await;
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    until("notifications/cancelled on the child's stdin", || {
        !child.seen_method("notifications/cancelled").is_empty()
    })
    .await;
    let calls = child.seen_method("tools/call");
    assert!(
        calls.iter().all(|m| m["params"].get("task").is_none()),
        "{calls:?}"
    );
    let notes = child.seen_method("notifications/cancelled");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0]["params"]["requestId"], calls[1]["id"]);
}

/// Taskgate with `lines` in front of a child without tasks of its own (`STDIO_NO_TASKS`), an
/// initialized client, and the gateway task of its echo call with `arguments`: taskgate, the
/// client and the task's id.
async fn gateway_task(child: &Kid, lines: &str, arguments: Value) -> (Tg, Client, String) {
    let tg = start(child, lines, "STDIO_NO_TASKS = \"1\"").await;
    let mut c = tg.client();
    c.initialize().await;
    let params = json!({"name": "echo", "task": {"ttl": 60000}, "arguments": arguments});
    let created = c.rpc(rpc("1", "tools/call", &params.to_string())).await;
    let task = created["result"]["task"]["taskId"]
        .as_str()
        .expect("a gateway task")
        .to_string();
    (tg, c, task)
}

/// A cancelled gateway task whose call the child never ends (it ignores the cancellation) is
/// told once: the held call closed `CANCELLED_CALL_GRACE` after the task's
/// `notifications/cancelled` sent the child a second one ("the client went away") as it was
/// dropped. "Resources released" is still recorded once the call is closed.
#[tokio::test]
async fn a_cancelled_gateway_task_tells_its_child_once() {
    let child = Kid::new();
    let (tg, c, task) = gateway_task(
        &child,
        "tasks = \"gateway\"",
        json!({"text": "late", "delay_ms": 9000}),
    )
    .await;
    until("the child reads the call", || {
        !child.seen_method("tools/call").is_empty()
    })
    .await;
    let cancelled = c.cancel("2", &task).await;
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    // The grace (5 s) and the quiet window: "resources released" once the call is closed.
    tokio::time::sleep(Duration::from_secs(5)).await;
    until("resources released", || {
        tg.record(&task).is_some_and(|r| r.released_at.is_some())
    })
    .await;
    let notes = child.seen_method("notifications/cancelled");
    assert_eq!(notes.len(), 1, "{notes:?}");
}

/// A gateway task's `statusMessage` from its call's `notifications/progress` is bounded: a
/// server's 1 MB progress message was stored whole in the record at every write (one each
/// 200 ms) and sent whole in every `tasks/get`, `tasks/list` and status notification.
#[tokio::test]
async fn a_gateway_tasks_progress_message_is_cut_to_a_bounded_status_message() {
    let message = status_message_of_a_long_progress("progress_message").await;
    assert!(
        message.starts_with("éé"),
        "{}",
        message.get(..40).unwrap_or(&message)
    );
}

/// A gateway task's `statusMessage` made of a progress notification's `progress` (no
/// `message`) is bounded too: a server's 1 MB `progress` string was stored whole.
#[tokio::test]
async fn a_gateway_tasks_progress_value_is_cut_to_a_bounded_status_message() {
    let message = status_message_of_a_long_progress("progress_value").await;
    assert!(
        message.starts_with("\"éé"),
        "{}",
        message.get(..40).unwrap_or(&message)
    );
}

/// The `statusMessage` of a gateway task whose call's progress carries 1 MB (500,000 `é`) in the
/// echo tool's `argument` (`progress_message` or `progress_value`), asserted at most 4 KiB plus
/// the cut's mark.
async fn status_message_of_a_long_progress(argument: &str) -> String {
    let child = Kid::new();
    let (tg, c, task) = gateway_task(
        &child,
        "tasks = \"gateway\"",
        json!({"text": "hi", "delay_ms": 1500, argument: "é".repeat(500_000)}),
    )
    .await;
    until("the progress is the task's statusMessage", || {
        tg.record(&task).is_some_and(|r| r.status_message.is_some())
    })
    .await;
    let got = c.get("2", &task).await;
    let message = got["result"]["statusMessage"].as_str().expect("a message");
    assert!(
        message.len() <= 4096 + '…'.len_utf8(),
        "{} bytes",
        message.len()
    );
    message.to_string()
}

/// Issue 31: a modern-only stdio server (2026-07-28 only; like rmcp 3.11's stdio server it
/// answers `initialize` with `-32022` and exits) behind taskgate. Found by taskgate's
/// `server/discover` probe, it is never sent `initialize`, so it is not restarted over and over
/// (it was, each start ending at taskgate's own `initialize`); 2026-07-28 calls reach it, a
/// JSON-RPC error it answers keeps its 2026 HTTP status (`-32021`: 400), and a 2025-11-25
/// client's `initialize` is answered by taskgate (its 2025 sessions held for the child).
#[tokio::test]
async fn a_modern_only_child_is_never_initialized_and_serves_both_eras() {
    let child = Kid::new();
    let tg = start(&child, "", "STDIO_MODERN = \"only\"").await;
    // Long enough for a child that died of an initialize to have been started again.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(child.pids().len(), 1, "started once");
    assert!(child.seen_method("initialize").is_empty());
    let restarts = metric(
        &tg.metrics_text().await,
        "taskgate_upstream_restarts_total",
        &[("upstream", "default")],
    );
    assert_eq!(restarts, 0.0);
    let url = tg.mcp_url();
    let (status, v) = send(modern_req(
        &url,
        None,
        1,
        "tools/call",
        json!({"name": "echo", "arguments": {"text": "modern"}}),
    ))
    .await;
    assert_eq!(
        (status, v["result"]["content"][0]["text"].clone()),
        (200, json!("modern")),
        "{v}"
    );
    let (status, v) = send(modern_req(
        &url,
        None,
        2,
        "tools/call",
        json!({"name": "fail", "arguments": {"code": -32021}}),
    ))
    .await;
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (400, json!(-32021)),
        "{v}"
    );
    let client = tg.client();
    let r = client.send(initialize_body("1")).await;
    assert_eq!(r.status(), 200);
    assert!(r.header("mcp-session-id").is_some(), "a held 2025 session");
    assert!(child.seen_method("initialize").is_empty());
    assert_eq!(child.pids().len(), 1);
}

/// A child that stops reading its stdin (a hung server that runs on: its pipe and taskgate's
/// write queue fill up) does not hang its clients: a notification or a request that cannot be
/// written is answered in time, 504 past `timeout_ms` or 502 once the child is ended (both
/// waited without end, holding the request's `max_in_flight` slot). And it is not kept (the
/// liveness rule): its pipe took nothing while a line waited `timeout_ms` to be written, so it
/// is ended and restarted as a crashed child is
/// (`taskgate_upstream_restarts_total`), its request in flight ending as on a crash (502,
/// naming why); it ran on, and every later client got 504 for as long as it lived.
#[tokio::test]
async fn a_child_that_stops_reading_its_stdin_is_ended_and_restarted() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let mut c = tg.client();
    c.initialize().await;
    // In flight when the child is found deaf: a task's `tasks/result` (no deadline; the child
    // answers it once the task ends, never here).
    let task = c.create_task("\"t\"").await;
    let result = {
        let (c, task) = (c.clone(), task.clone());
        let params = json!({ "taskId": task }).to_string();
        tokio::spawn(async move { c.send(rpc("\"r\"", "tasks/result", &params)).await })
    };
    until("the child reads the tasks/result", || {
        !child.seen_method("tasks/result").is_empty()
    })
    .await;
    stall(&mut c, None).await;
    // More than the pipe (64 KiB) and taskgate's write queue (256 lines) hold.
    let body = padded_note();
    let notes = (0..320).map(|_| c.req(body.clone()).try_send());
    let answers = futures_util::future::join_all(notes).await;
    let statuses: Vec<Result<u16, String>> =
        answers.into_iter().map(|a| a.map(|r| r.status())).collect();
    assert!(
        statuses.iter().all(|s| matches!(s, Ok(202 | 502 | 504))),
        "every notification is answered in time: {:?}",
        statuses
            .iter()
            .filter(|s| !matches!(s, Ok(202)))
            .take(3)
            .collect::<Vec<_>>()
    );
    assert!(
        statuses.iter().any(|s| matches!(s, Ok(502 | 504))),
        "the queue was filled"
    );
    let result = result.await.expect("the tasks/result is answered");
    // As on a crash: the child's death, named (HTTP 502).
    assert_eq!(result.status(), 502);
    let result = result.json().await;
    assert_eq!(err_code(&result), -32603, "{result}");
    assert!(
        err_message(&result).contains("stopped reading its stdin"),
        "{result}"
    );
    until("the task is failed and released", || {
        tg.record(&task)
            .is_some_and(|r| r.status.as_str() == "failed" && r.released_at.is_some())
    })
    .await;
    let record = tg.record(&task).expect("record");
    assert!(
        record
            .status_message
            .as_deref()
            .is_some_and(|m| m.contains("stopped reading its stdin")),
        "{:?}",
        record.status_message
    );
    until("a second child", || child.pids().len() == 2).await;
    readyz(tg.admin, 200).await;
    let pong = c.rpc(rpc("2", "ping", "{}")).await;
    assert!(pong.get("result").is_some(), "{pong}");
    let metrics = tg.metrics_text().await;
    assert_eq!(
        metric(
            &metrics,
            "taskgate_upstream_restarts_total",
            &[("upstream", "default")]
        ),
        1.0
    );
}

/// A `per_session` child's notification for every GET stream (`notifications/message`, a list
/// change) is its own session's: it reaches that session's GET stream and no other session's
/// (every child shared the upstream's streams, so one client's child's log lines went to every
/// client of the upstream).
#[tokio::test]
async fn a_per_session_childs_notification_reaches_only_its_own_sessions_stream() {
    let child = Kid::new();
    let tg = start(&child, "process = \"per_session\"", "").await;
    let (mut a, mut b) = (tg.client(), tg.client());
    a.initialize().await;
    b.initialize().await;
    let (mut sa, mut sb) = (a.get_stream().await, b.get_stream().await);
    let log = json!({"name": "log", "arguments": {"text": "a's secret"}}).to_string();
    let logged = a.rpc(rpc("1", "tools/call", &log)).await;
    assert_eq!(logged["result"]["content"][0]["text"], "logged", "{logged}");
    let ev = sa.next_event(Duration::from_secs(5)).await.json();
    assert_eq!(ev["params"]["data"], "a's secret", "{ev}");
    loop {
        match sb.next(Duration::from_secs(1)).await {
            Next::Item(SseItem::Comment(_)) => continue,
            Next::Timeout => break,
            other => panic!("session b got a's child's notification: {other:?}"),
        }
    }
}

/// A request taskgate could not write to a child's stdin within `timeout_ms` (504) is not
/// cancelled at the child: the child never saw it, yet a `notifications/cancelled` naming it
/// was queued ahead of everything (and read once the child read again).
#[tokio::test]
async fn a_request_never_written_is_not_cancelled_at_the_child() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let mut c = tg.client();
    c.initialize().await;
    slow_down(&mut c, 8000).await;
    // More than the pipe (64 KiB) and taskgate's write queue (256 lines) hold.
    let body = padded_note();
    let notes = futures_util::future::join_all((0..320).map(|_| c.req(body.clone()).try_send()));
    let ping = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        c.req(rpc("2", "ping", "{}")).try_send().await
    };
    let (_, ping) = tokio::join!(notes, ping);
    assert_eq!(ping.expect("answered in time").status(), 504);
    // The child reads again: everything queued reaches it, then this ping.
    let pong = c.rpc(rpc("3", "ping", "{}")).await;
    assert!(pong.get("result").is_some(), "{pong}");
    let cancels = child.seen_method("notifications/cancelled");
    assert!(cancels.is_empty(), "{cancels:?}");
}

/// A child's message with a bare `\r` between its JSON tokens (JSON whitespace: one line, one
/// valid JSON-RPC message) reaches a GET stream as one event whose data is that JSON: the SSE
/// encoder split `data` at `\n` only, and a client's SSE parser ends a line at `\r` too (the
/// rest became a field of its own, the data a cut JSON text).
#[tokio::test]
async fn a_childs_message_with_a_carriage_return_is_one_valid_sse_event() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let mut c = tg.client();
    c.initialize().await;
    let mut stream = c.get_stream().await;
    let log = json!({"name": "log", "arguments": {"text": "a\u{0}b", "cr": true}}).to_string();
    let logged = c.rpc(rpc("1", "tools/call", &log)).await;
    assert_eq!(logged["result"]["content"][0]["text"], "logged", "{logged}");
    let ev = stream.next_event(Duration::from_secs(5)).await;
    let data = ev.data().expect("data");
    let note: Value = serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {ev:?}"));
    assert_eq!(note["params"]["data"], "a\u{0}b", "{note}");
}

/// A client's `notifications/cancelled` that finds the child's stdin queue full still reaches
/// the child once it reads again, once: the request was marked told, the cancel waited
/// `timeout_ms` for room and was dropped (504), and the request's own give-up, seeing it
/// told, told the child nothing.
#[tokio::test]
async fn a_cancel_that_finds_the_stdin_queue_full_reaches_the_child_once_it_reads() {
    let child = Kid::new();
    let tg = start(&child, "max_in_flight = 1000", "").await;
    let mut c = tg.client();
    c.initialize().await;
    let call = echo_call(&c, "x", "x", 20000);
    until("the child reads the call", || {
        !child.seen_method("tools/call").is_empty()
    })
    .await;
    let out = child.seen_method("tools/call")[0]["id"].clone();
    slow_down(&mut c, 9000).await;
    // Requests that fill the pipe (64 KiB) and the write queue, then their cancellations
    // (urgent lines, written ahead): more than the urgent queue (256 lines) holds.
    let pad = "z".repeat(16 * 1024);
    let params = json!({"name": "echo", "arguments": {"text": pad}}).to_string();
    let calls = futures_util::future::join_all(
        (0..300).map(|i| c.req(rpc(&i.to_string(), "tools/call", &params)).try_send()),
    );
    let cancels = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cancel = |id: String| {
            let params = json!({"requestId": id, "reason": "no"}).to_string();
            c.req(notification("notifications/cancelled", &params))
                .try_send()
        };
        let all = futures_util::future::join_all((0..300).map(|i| {
            let params = format!(r#"{{"requestId":{i},"reason":"no"}}"#);
            c.req(notification("notifications/cancelled", &params))
                .try_send()
        }));
        let ours = async {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            cancel("x".into()).await
        };
        tokio::join!(all, ours).1
    };
    let (_, note) = tokio::join!(calls, cancels);
    let status = note.expect("answered").status();
    assert!(matches!(status, 202 | 504), "{status}");
    let _ = call.await;
    let for_the_call = || {
        child
            .seen_method("notifications/cancelled")
            .into_iter()
            .filter(|n| n["params"]["requestId"] == out)
            .count()
    };
    until("the call's cancellation reaches the child", || {
        for_the_call() > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(for_the_call(), 1);
}

/// A client's `notifications/cancelled` for a request still waiting in the child's stdin queue
/// reaches the child after that request, not before it: written ahead of the queue, it named
/// an id the child did not know yet (ignored), then the request ran, and its give-up, the
/// request being told already, told the child nothing more.
#[tokio::test]
async fn a_cancel_of_a_request_still_queued_reaches_the_child_after_it() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let mut c = tg.client();
    c.initialize().await;
    stall(&mut c, Some(3000)).await;
    // A backlog: more than the pipe (64 KiB) holds, queued (202) behind it.
    let body = padded_note();
    for _ in 0..20 {
        assert_eq!(c.send(body.clone()).await.status(), 202);
    }
    let call = echo_call(&c, "q", "queued", 4000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    give_up(&c, "q").await;
    let _ = call.await;
    let is_call = |m: &Value| m["params"]["arguments"]["text"] == "queued";
    until("the child reads the call", || {
        child.seen().iter().any(is_call)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let seen = child.seen();
    let at = seen.iter().position(is_call).expect("the call");
    let out = &seen[at]["id"];
    let after: Vec<_> = seen[at..]
        .iter()
        .filter(|m| m["method"] == "notifications/cancelled" && m["params"]["requestId"] == *out)
        .collect();
    assert_eq!(
        after.len(),
        1,
        "the child is told, once, after the call: {:?}",
        {
            seen.iter()
                .filter(|m| m["method"] != "notifications/message")
                .collect::<Vec<_>>()
        }
    );
}

/// A `per_session` child's request outside any call (`roots/list` once initialized, as
/// filesystem servers send it) goes to its session's GET stream and the client's answer back
/// to the child: it was answered `-32603` ("taskgate cannot tell which client ... its process
/// is shared") although the child has one client only.
#[tokio::test]
async fn a_per_session_childs_request_outside_a_call_reaches_its_session() {
    let child = Kid::new();
    let tg = start(&child, "process = \"per_session\"", "").await;
    let c = client_with(&tg.mcp_url(), json!({"roots": {}})).await;
    let mut stream = c.get_stream().await;
    let later = json!({"name": "later", "arguments": {"delay_ms": 300}}).to_string();
    let answered = c.rpc(rpc("1", "tools/call", &later)).await;
    assert_eq!(
        answered["result"]["content"][0]["text"], "later",
        "{answered}"
    );
    let ask = stream.next_event(Duration::from_secs(5)).await.json();
    assert_eq!(ask["method"], "roots/list", "{ask}");
    let reply = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": []}}).to_string();
    assert_eq!(c.send(reply).await.status(), 202);
    until("the child gets the client's answer", || {
        child
            .seen()
            .iter()
            .any(|m| m["id"] == "roots-1" && m.get("result").is_some())
    })
    .await;
}

/// A request whose caller goes away while it still waits for room in the child's stdin queue
/// (the child stopped reading) is forgotten, not cancelled at the child: it was never written,
/// yet its drop guard queued a `notifications/cancelled` naming it (read by the child once it
/// read again, an id it never saw).
#[tokio::test]
async fn a_request_dropped_before_it_was_written_is_not_cancelled_at_the_child() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let mut c = tg.client();
    c.initialize().await;
    stall(&mut c, Some(3000)).await;
    // More than the pipe (64 KiB) and taskgate's write queue (256 lines) hold: the rest wait
    // for room (within timeout_ms, 5 s; the child reads again after 3 s).
    let body = padded_note();
    let notes = futures_util::future::join_all((0..300).map(|_| c.req(body.clone()).try_send()));
    let dropped = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let call = json!({"name": "echo", "arguments": {"text": "never"}}).to_string();
        let sent = c.req(rpc("\"n\"", "tools/call", &call)).try_send();
        // The client gives up (its connection closed) while the call waits for room.
        tokio::time::timeout(Duration::from_millis(500), sent).await
    };
    let (_, dropped) = tokio::join!(notes, dropped);
    if let Ok(answered) = dropped {
        panic!("the call was answered: {:?}", answered.map(|r| r.status()));
    }
    // The child reads again: everything queued reaches it, then this ping.
    let pong = c.rpc(rpc("3", "ping", "{}")).await;
    assert!(pong.get("result").is_some(), "{pong}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls: Vec<_> = child
        .seen_method("tools/call")
        .into_iter()
        .filter(|m| m["params"]["arguments"]["text"] == "never")
        .collect();
    assert!(calls.is_empty(), "{calls:?}");
    let cancels = child.seen_method("notifications/cancelled");
    assert!(cancels.is_empty(), "{cancels:?}");
}

/// A `per_session` child's request outside any call while its session has no GET stream open
/// is refused `-32603` naming why: the refusal said "its process is shared", which it is not.
#[tokio::test]
async fn a_per_session_childs_request_without_a_stream_is_refused_for_that_reason() {
    let child = Kid::new();
    let tg = start(&child, "process = \"per_session\"", "").await;
    let c = client_with(&tg.mcp_url(), json!({"roots": {}})).await;
    let later = json!({"name": "later", "arguments": {"delay_ms": 100}}).to_string();
    let answered = c.rpc(rpc("1", "tools/call", &later)).await;
    assert_eq!(
        answered["result"]["content"][0]["text"], "later",
        "{answered}"
    );
    let refused = || {
        child
            .seen()
            .into_iter()
            .find(|m| m["id"] == "roots-1" && m.get("error").is_some())
    };
    until("the child gets taskgate's refusal", || refused().is_some()).await;
    let refusal = refused().expect("a refusal");
    assert_eq!(refusal["error"]["code"], -32603, "{refusal}");
    let message = refusal["error"]["message"].as_str().expect("a message");
    assert!(!message.contains("shared"), "{message}");
    assert!(message.contains("GET stream"), "{message}");
}

/// A client's `notifications/cancelled` for a request still waiting for a `max_in_flight` slot
/// is not lost: the request was not registered yet, so the cancellation found nothing in
/// flight and was dropped, and the request, given its slot, then ran at the child, which was
/// never told.
#[tokio::test]
async fn a_cancel_of_a_request_waiting_for_a_slot_is_not_lost() {
    let child = Kid::new();
    let tg = start(&child, "max_in_flight = 1", "").await;
    let mut c = tg.client();
    c.initialize().await;
    let first = echo_call(&c, "a", "first", 1500);
    until("the child reads the first call", || {
        !child.seen_method("tools/call").is_empty()
    })
    .await;
    let second = echo_call(&c, "q", "waiting", 1000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    give_up(&c, "q").await;
    let _ = first.await;
    let _ = second.await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = child.seen();
    let is_call = |m: &Value| m["params"]["arguments"]["text"] == "waiting";
    if let Some(at) = seen.iter().position(is_call) {
        let out = &seen[at]["id"];
        let told = seen[at..]
            .iter()
            .any(|m| m["method"] == "notifications/cancelled" && m["params"]["requestId"] == *out);
        assert!(told, "the cancelled call ran at the child, never told");
    }
}

/// A client's `notifications/cancelled` for a request still waiting for room in the child's
/// stdin queue, which then is never written (504 past `timeout_ms`), does not reach the child:
/// it waited for room in its turn and named, once the child read again, an id it never saw.
#[tokio::test]
async fn a_cancel_of_a_request_never_written_does_not_reach_the_child() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let mut c = tg.client();
    c.initialize().await;
    slow_down(&mut c, 7000).await;
    // More than the pipe (64 KiB) and taskgate's write queue (256 lines) hold.
    let body = padded_note();
    let notes = futures_util::future::join_all((0..300).map(|_| c.req(body.clone()).try_send()));
    let call = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let call = json!({"name": "echo", "arguments": {"text": "never"}}).to_string();
        c.req(rpc("\"n\"", "tools/call", &call)).try_send().await
    };
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let params = json!({"requestId": "n", "reason": "no"}).to_string();
        c.req(notification("notifications/cancelled", &params))
            .try_send()
            .await
    };
    let (_, call, cancel) = tokio::join!(notes, call, cancel);
    assert_eq!(call.expect("answered").status(), 504);
    assert_eq!(cancel.expect("answered").status(), 202);
    // The child reads again: everything queued reaches it, then this ping.
    let pong = c.rpc(rpc("3", "ping", "{}")).await;
    assert!(pong.get("result").is_some(), "{pong}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cancels = child.seen_method("notifications/cancelled");
    assert!(cancels.is_empty(), "{cancels:?}");
}

/// A gateway task (`tasks = "gateway"`) whose held call dies with its child (`kill -9`) is
/// `failed` with both audit facts, as a task of the child's own is: "resources released"
/// (`reason=process_exited`, counted in `taskgate_task_resources_released_total`) was never
/// recorded for it (the child never saw the task, so its death did not name it; and a call
/// failed by its held call first was skipped as terminal already).
async fn a_gateway_task_whose_child_dies_is_released(mode: &str) {
    let child = Kid::new();
    let lines = format!("process = \"{mode}\"\ntasks = \"gateway\"");
    let (tg, _c, task) =
        gateway_task(&child, &lines, json!({"text": "never", "delay_ms": 60000})).await;
    until("the child reads the call", || {
        !child.seen_method("tools/call").is_empty()
    })
    .await;
    let pid = child.pids()[0];
    // SAFETY: a signal to the child this test's taskgate started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    until("the gateway task is failed", || {
        tg.record(&task)
            .is_some_and(|r| r.status.as_str() == "failed")
    })
    .await;
    until("the gateway task is released", || {
        tg.record(&task).is_some_and(|r| r.released_at.is_some())
    })
    .await;
    let audit = tg
        .registry
        .store()
        .audit_for("default", &task)
        .expect("audit");
    let released: Vec<&str> = audit
        .iter()
        .filter(|e| e.event == "resources_released")
        .map(|e| e.detail.as_str())
        .collect();
    assert_eq!(released, ["reason=process_exited"], "{audit:?}");
    let m = tg.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "taskgate_task_resources_released_total",
            &[("reason", "process_exited")]
        ),
        1.0
    );
}

#[tokio::test]
async fn a_gateway_task_whose_per_session_child_dies_is_released() {
    a_gateway_task_whose_child_dies_is_released("per_session").await;
}

#[tokio::test]
async fn a_gateway_task_whose_shared_child_dies_is_released() {
    a_gateway_task_whose_child_dies_is_released("shared").await;
}

/// A child's request (`roots/list`) sent while an `initialize` is in flight (the client's to a
/// `per_session` child, taskgate's own to a shared one) is answered `-32603` by taskgate at
/// once, and the `initialize` goes on: no client could answer it (the client has no session
/// yet; MCP lifecycle: a server SHOULD NOT send it). It was tied to the `initialize`: a
/// client's answer was then an SSE stream with no session (the child was ended, the client
/// got 502), taskgate's own never read it (the child waited for an answer that never came).
async fn a_childs_request_during_initialize_is_refused_at_once(mode: &str) {
    let child = Kid::new();
    let lines = format!("process = \"{mode}\"");
    let tg = start(&child, &lines, "STDIO_ROOTS_ON_INIT = \"1\"").await;
    let mut c = tg.client();
    let started = std::time::Instant::now();
    let init = c.initialize().await;
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    assert!(c.session.is_some(), "a session");
    let refused = || {
        child
            .seen()
            .into_iter()
            .find(|m| m["id"] == "roots-init" && m.get("method").is_none())
    };
    until("the child gets taskgate's refusal", || refused().is_some()).await;
    let refusal = refused().expect("a refusal");
    assert_eq!(refusal["error"]["code"], -32603, "{refusal}");
    let message = refusal["error"]["message"].as_str().expect("a message");
    assert!(message.contains("initialize"), "{message}");
    if mode == "per_session" {
        // At once: the child waits 4 s for an answer before it answers the initialize.
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }
    let echo = json!({"name": "echo", "arguments": {"text": "hi"}}).to_string();
    let answered = c.rpc(rpc("1", "tools/call", &echo)).await;
    assert_eq!(answered["result"]["content"][0]["text"], "hi", "{answered}");
}

#[tokio::test]
async fn a_per_session_childs_request_during_initialize_is_refused_at_once() {
    a_childs_request_during_initialize_is_refused_at_once("per_session").await;
}

#[tokio::test]
async fn a_shared_childs_request_during_its_initialize_is_refused_at_once() {
    a_childs_request_during_initialize_is_refused_at_once("shared").await;
}

/// Tester 3 F3: a request still in taskgate's stdin queue when its caller got 504 is not
/// written later: the child, a slow reader behind a backlog, read it (and ran it) once it
/// caught up, followed by a `notifications/cancelled`, after its caller was told it failed.
#[tokio::test]
async fn a_request_that_timed_out_in_the_stdin_queue_never_reaches_the_child() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let mut c = tg.client();
    c.initialize().await;
    // One line every 500 ms for 8 s: slow, never deaf (a line reaches it well within 5 s).
    slow_down(&mut c, 8000).await;
    // A backlog of 20 lines of 16 KiB (more than the pipe holds; 10 s at the child's pace).
    let body = padded_note();
    for _ in 0..20 {
        assert_eq!(c.send(body.clone()).await.status(), 202);
    }
    let call = json!({"name": "echo", "arguments": {"text": "stale"}}).to_string();
    let stale = c.req(rpc("\"s\"", "tools/call", &call)).try_send().await;
    assert_eq!(stale.expect("answered in time").status(), 504);
    // The child catches up: everything still queued reaches it, then this ping.
    let pong = c.rpc(rpc("3", "ping", "{}")).await;
    assert!(pong.get("result").is_some(), "{pong}");
    let stale: Vec<_> = child
        .seen_method("tools/call")
        .into_iter()
        .filter(|m| m["params"]["arguments"]["text"] == "stale")
        .collect();
    assert!(
        stale.is_empty(),
        "the timed-out call reached the child: {stale:?}"
    );
    let cancels = child.seen_method("notifications/cancelled");
    assert!(cancels.is_empty(), "{cancels:?}");
}

/// Tester 3 F2: a child that stops reading its stdin is found deaf under light traffic too:
/// one request larger than the pipe, nothing more, and within about `timeout_ms` the child is
/// ended and restarted, and the next request is answered by the new child. Before: only a
/// write that found taskgate's 256-line queue full could find it deaf, which light traffic
/// never fills (every call got 504 and `/readyz` stayed green).
#[tokio::test]
async fn a_child_that_stops_reading_is_found_deaf_without_a_full_queue() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let mut c = tg.client();
    c.initialize().await;
    stall(&mut c, None).await;
    let started = std::time::Instant::now();
    let big = json!({"name": "echo", "arguments": {"text": "x".repeat(300 * 1024)}}).to_string();
    let big = c.req(rpc("\"big\"", "tools/call", &big)).try_send().await;
    let status = big.expect("answered").status();
    assert!(matches!(status, 502 | 504), "{status}");
    until("a second child", || child.pids().len() == 2).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(5000 + 3000),
        "restarted after {took:?}"
    );
    readyz(tg.admin, 200).await;
    let echo = json!({"name": "echo", "arguments": {"text": "hi"}}).to_string();
    let answer = c.rpc(rpc("2", "tools/call", &echo)).await;
    assert_eq!(answer["result"]["content"][0]["text"], "hi", "{answer}");
    assert_eq!(
        answer["result"]["pid"],
        json!(child.pids()[1]),
        "answered by the new child: {answer}"
    );
}

/// Review M3: a shared child that reads its stdin only between requests stops reading it for
/// longer than `timeout_ms` (7 s against 5 s) with more than a pipe's worth waiting (160 KiB),
/// while it speaks on stdout (a notification every 500 ms, as a long call's progress would):
/// it is busy, not deaf, so it is not ended, and once it reads again everything waiting reaches
/// it. Before: ended after `timeout_ms` with every session's calls and tasks.
#[tokio::test]
async fn a_child_that_speaks_while_it_does_not_read_is_not_deaf() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let mut c = tg.client();
    c.initialize().await;
    let arguments = json!({"resume_ms": 7000, "chatter_ms": 500});
    let stall = json!({"name": "stall", "arguments": arguments}).to_string();
    let stalled = c.rpc(rpc("1", "tools/call", &stall)).await;
    assert_eq!(
        stalled["result"]["content"][0]["text"], "stalled",
        "{stalled}"
    );
    let body = padded_note();
    for _ in 0..10 {
        assert_eq!(c.send(body.clone()).await.status(), 202);
    }
    // Past the 7 s: the child reads again and catches up, then answers this.
    until("the notes reach the child", || {
        child.seen_method("notifications/message").len() == 10
    })
    .await;
    let echo = json!({"name": "echo", "arguments": {"text": "hi"}}).to_string();
    let answer = c.rpc(rpc("2", "tools/call", &echo)).await;
    assert_eq!(answer["result"]["content"][0]["text"], "hi", "{answer}");
    assert_eq!(child.pids().len(), 1, "the child was not restarted");
    assert_eq!(answer["result"]["pid"], json!(child.pids()[0]), "{answer}");
}

/// `tools/call` of the child's `ask` (it sends `elicitation/create` and answers with what came
/// back) as request `id` (JSON).
fn ask_call(id: &str) -> String {
    rpc(
        id,
        "tools/call",
        &json!({"name": "ask", "arguments": {}}).to_string(),
    )
}

/// Tester 3 F6: a client that declared no `elicitation` is never sent the child's
/// `elicitation/create`: the child gets `-32601` at once (its tool then answers, here with
/// `null`). Before: it was relayed on the client's POST stream, and the child waited for an
/// answer that client would never give (504 for the call).
#[tokio::test]
async fn a_childs_request_is_not_sent_to_a_client_that_did_not_declare_it() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let c = client_with(&tg.mcp_url(), json!({})).await;
    let answer = c.rpc(ask_call("1")).await;
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(answer["result"]["content"][0]["text"], "null", "{answer}");
    let refused = child
        .seen()
        .into_iter()
        .find(|m| m["id"] == "ask-1")
        .expect("the child got an answer");
    assert_eq!(refused["error"]["code"], -32601, "{refused}");
}

/// Tester 3 F5: on a shared child, the child's `elicitation/create` reaches the one client in
/// flight that declared `elicitation`, while another client's call (which declared nothing) is
/// in flight too. Before: refused `-32603` ("cannot tell which client ... shared").
#[tokio::test]
async fn a_childs_request_reaches_the_one_client_in_flight_that_declared_it() {
    let child = Kid::new();
    let tg = start(&child, "", "").await;
    let plain = client_with(&tg.mcp_url(), json!({})).await;
    let asker = client_with(&tg.mcp_url(), json!({"elicitation": {}})).await;
    let busy = echo_call(&plain, "b", "busy", 3000);
    until("the child reads the other call", || {
        !child.seen_method("tools/call").is_empty()
    })
    .await;
    let r = asker.send(ask_call("\"q\"")).await;
    assert_eq!(r.status(), 200);
    let mut events = r.sse();
    let asked = events.next_event(STEP).await.json();
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    let accepted = asker
        .send(rpc_result(
            &asked["id"].to_string(),
            r#"{"action":"accept","content":{}}"#,
        ))
        .await;
    assert_eq!(accepted.status(), 202);
    let answer = events.next_event(STEP).await.json();
    assert!(
        answer["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("accept")),
        "{answer}"
    );
    let busy = busy.await.expect("joined").expect("answered");
    assert_eq!(busy.status(), 200);
}

/// Tester 3 F4: a gateway task's held call (`tasks = "gateway"`) on a shared stdio child is a
/// request in flight like any other (it was counted already): the child's `elicitation/create`
/// during it (no related-task `_meta`: the child has no tasks) makes the task
/// `input_required`, reaches the client on its `tasks/result` stream, and the client's answer
/// reaches the child; also while a cancelled task's held call is still open (its grace: the
/// child ignores the cancellation), as in the tester's run. Before: with that call in flight,
/// it was answered `-32603` ("cannot tell which client") and the task completed with that.
#[tokio::test]
async fn a_childs_request_during_a_gateway_tasks_held_call_makes_it_input_required() {
    let child = Kid::new();
    let tg = start(&child, "tasks = \"gateway\"", "STDIO_NO_TASKS = \"1\"").await;
    let c = client_with(&tg.mcp_url(), json!({"tasks": {}, "elicitation": {}})).await;
    // A task whose held call the child runs on after its cancellation.
    let slow = json!({"name": "echo", "arguments": {"text": "slow", "delay_ms": 8000}, "task": {"ttl": 60000}});
    let slow = c.rpc(rpc("0", "tools/call", &slow.to_string())).await;
    let slow = slow["result"]["task"]["taskId"]
        .as_str()
        .expect("a task")
        .to_string();
    until("the child reads the slow call", || {
        !child.seen_method("tools/call").is_empty()
    })
    .await;
    let cancelled = c.cancel("9", &slow).await;
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    until("the child is told", || {
        !child.seen_method("notifications/cancelled").is_empty()
    })
    .await;
    let params = json!({"name": "ask", "arguments": {}, "task": {"ttl": 60000}});
    let created = c.rpc(rpc("1", "tools/call", &params.to_string())).await;
    let t = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a gateway task: {created}"))
        .to_string();
    let waiting = eventually(Duration::from_secs(10), || async {
        let v = c.get("2", &t).await;
        (v["result"]["status"] == "input_required" || v["result"]["status"] == "completed")
            .then_some(v)
    })
    .await
    .expect("the task moved");
    assert_eq!(waiting["result"]["status"], "input_required", "{waiting}");
    let (mut sse, _status) = c.input_stream("3", &t).await;
    let ask = sse.next_event(STEP).await.json();
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"action": "accept", "content": {}}});
    assert_eq!(c.send(answer.to_string()).await.status(), 202);
    let done = loop {
        let v = sse.next_event(STEP).await.json();
        if v.get("id").is_some() {
            break v;
        }
    };
    assert!(
        done["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("accept")),
        "{done}"
    );
}

/// A task of the child's `echo` tool that the child completes after `complete_ms` (ttl 60 s).
fn completing_task(complete_ms: u64) -> String {
    let params = json!({
        "name": "echo",
        "arguments": {"text": "x", "complete_ms": complete_ms},
        "task": {"ttl": 60000},
    });
    rpc("\"make\"", "tools/call", &params.to_string())
}

/// Polls `tasks/get` of `task` through `c` every `every` until it is no longer `working`;
/// returns that status (and the record's message, for the failure).
async fn poll_until_ended(c: &Client, task: &str, every: Duration) -> (String, Value) {
    for i in 0..40 {
        tokio::time::sleep(every).await;
        let got = c.get(&format!("\"poll-{i}\""), task).await;
        let status = got["result"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if status != "working" {
            return (status, got);
        }
    }
    panic!("task {task} still working after 40 polls");
}

/// Tester 3 F22: a `per_session` child whose task is live is not idle: a client that polls its
/// task less often than `gateway.session_idle_ms` gets the task's result (the child was ended
/// under the task at the idle limit, and the task `failed` "the session's process ended").
/// Once its task has ended, the idle rule applies again.
#[tokio::test]
async fn a_per_session_child_with_a_live_task_outlives_the_idle_limit() {
    let child = Kid::new();
    let upstream = child.upstream("process = \"per_session\"", "");
    let tg = Tg::start(|store| {
        toml(store, &upstream).replace(
            "listen = \"127.0.0.1:0\"\n\n[admin]",
            "listen = \"127.0.0.1:0\"\nsession_idle_ms = 1000\n\n[admin]",
        )
    })
    .await;
    let mut c = tg.client();
    let init = c.initialize().await;
    let pid = init["result"]["serverInfo"]["pid"].as_i64().expect("pid") as i32;
    let created = c.rpc(completing_task(4000)).await;
    let task = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {created}"))
        .to_string();
    // Polled every 1.5 s: longer than the idle limit, within the task's ttl.
    let (status, got) = poll_until_ended(&c, &task, Duration::from_millis(1500)).await;
    assert_eq!(status, "completed", "{got}");
    let result = c.result("\"result\"", &task).await;
    assert_eq!(
        result["result"]["content"][0]["text"],
        format!("done {task}"),
        "{result}"
    );
    until("the child, its task ended and idle now, is ended", || {
        process_gone(pid)
    })
    .await;
}

/// Tester 3 F22: a principal past `limits.max_sessions_per_principal` ends its least recently
/// used session "as a DELETE would": a `per_session` child with a live task is kept (its
/// session ends for its client) until the task ends, and its owner reads the result from its
/// newest session (the child was ended at once, and the task `failed`). The share still holds:
/// the next least recently used session without a live task has its child ended.
#[tokio::test]
async fn a_per_session_child_with_a_live_task_outlives_its_principals_session_limit() {
    let child = Kid::new();
    let upstream = child.upstream("process = \"per_session\"", "");
    let token = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"alice-token"));
    let tg = Tg::start(|store| {
        toml(store, &upstream).replace(
            "[auth]\nmode = \"none\"\n",
            &format!("[limits]\nmax_sessions_per_principal = 2\n\n[auth]\nmode = \"bearer\"\n\n[[auth.token]]\nprincipal = \"alice\"\nsha256 = {token:?}\n"),
        )
    })
    .await;
    let session = || tg.client().with_token("alice-token");
    let pid_of = |init: &Value| init["result"]["serverInfo"]["pid"].as_i64().expect("pid") as i32;
    let mut a = session();
    let pa = pid_of(&a.initialize().await);
    let created = a.rpc(completing_task(3000)).await;
    let task = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {created}"))
        .to_string();
    let (mut b, mut c, mut d) = (session(), session(), session());
    let pb = pid_of(&b.initialize().await);
    let pc = pid_of(&c.initialize().await);
    let pd = pid_of(&d.initialize().await);
    until("b's child (no live task) makes room for d's", || {
        process_gone(pb)
    })
    .await;
    assert!(!process_gone(pa), "a's child runs its live task");
    assert!(!process_gone(pc) && !process_gone(pd));
    let (status, got) = poll_until_ended(&d, &task, Duration::from_millis(500)).await;
    assert_eq!(status, "completed", "{got}");
    let result = d.result("\"result\"", &task).await;
    assert_eq!(
        result["result"]["content"][0]["text"],
        format!("done {task}"),
        "{result}"
    );
    until("a's child, its task ended, is ended", || process_gone(pa)).await;
    assert!(!process_gone(pc) && !process_gone(pd));
}

/// The pids of the processes whose command line (`/proc/<pid>/cmdline`) starts with `marker`
/// and that are not zombies.
fn processes_named(marker: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.starts_with(marker.as_bytes()))
                && !process_gone(*pid)
        })
        .collect()
}

/// Tester 3 F23: `kill -9` of taskgate leaves no orphan when the server is started through a
/// wrapper that forks (`bash -c "server; …"`, `npx`, `uv run`): the grandchild went on
/// running with parent 1 (the parent-death signal reached only the wrapper, taskgate's
/// direct child).
#[tokio::test]
async fn kill_9_of_taskgate_leaves_no_grandchild_of_a_wrapper() {
    let child = Kid::new();
    let marker = format!("tg-orphan-{}-{}", std::process::id(), rand_suffix());
    // bash stays the direct child; the "server" (a sleep named by the marker) is its child.
    // It never answers: taskgate waits in its start-up.
    let script = format!("(exec -a {marker} sleep 300) & wait");
    let upstream = format!(
        "\n[[upstream]]\nname = \"default\"\ncommand = [\"bash\", \"-c\", {script:?}]\ntimeout_ms = 60000\n"
    );
    let config = child.path("taskgate.toml");
    let store = child.path("store");
    std::fs::write(&config, toml(store.to_str().unwrap(), &upstream)).unwrap();
    let mut p = TaskgateProcess::spawn(&["serve", "--config", config.to_str().unwrap()], &[]);
    p.listening();
    until("the wrapper's child runs", || {
        !processes_named(&marker).is_empty()
    })
    .await;
    let grandchild = processes_named(&marker)[0];
    p.signal(libc::SIGKILL);
    p.wait_exit(Duration::from_secs(5)).expect("killed");
    let mut gone = false;
    for _ in 0..250 {
        if process_gone(grandchild) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !gone {
        // Not left behind by the test either.
        unsafe { libc::kill(grandchild, libc::SIGKILL) };
    }
    assert!(gone, "the wrapper's child outlived a kill -9 of taskgate");
}

/// A few random hex digits (a marker no other run shares).
fn rand_suffix() -> String {
    let mut bytes = [0u8; 4];
    getrandom::getrandom(&mut bytes).expect("random");
    hex::encode(bytes)
}

/// Tester 3 F21: a child that takes longer than `timeout_ms` to start (here 2.5 s against
/// 1 s: a cold `npx -y`, `uv run` resolving) has `startup_timeout_ms` (default 60 s) for its
/// first request: a shared child is started once and serves (it was killed and restarted
/// for ever, each start given `timeout_ms`), a `per_session` client's `initialize` gets its
/// session (it got 502).
#[tokio::test]
async fn a_child_slower_to_start_than_timeout_ms_is_given_its_start_up_budget() {
    for mode in ["shared", "per_session"] {
        let child = Kid::new();
        let upstream = child
            .upstream(&format!("process = {mode:?}"), "STDIO_START_MS = \"2500\"")
            .replace("timeout_ms = 5000", "timeout_ms = 1000");
        let tg = Tg::start(|store| toml(store, &upstream)).await;
        let mut c = tg.client();
        if mode == "shared" {
            readyz(tg.admin, 200).await;
        }
        let init = c.initialize().await;
        assert!(init["result"]["serverInfo"].is_object(), "{mode}: {init}");
        let echo = json!({"name": "echo", "arguments": {"text": "up"}}).to_string();
        let answer = c.rpc(rpc("1", "tools/call", &echo)).await;
        assert_eq!(
            answer["result"]["content"][0]["text"], "up",
            "{mode}: {answer}"
        );
        assert_eq!(child.pids().len(), 1, "{mode}: started once");
    }
}

/// Tester 3 F17: a task status notification of the child's that no GET stream takes (the
/// client holds none and never polls) still ends the record, so the owner's live-task slot is
/// freed; before, the record stayed `working` until its ttl (the tester's 101st task refused).
#[tokio::test]
async fn a_childs_task_status_ends_the_record_without_a_get_stream() {
    let child = Kid::new();
    let upstream = child.upstream("", "");
    let tg = Tg::start(|store| toml(store, &upstream)).await;
    let mut c = tg.client();
    c.initialize().await;
    let params = json!({
        "name": "echo",
        "arguments": {"text": "x", "complete_ms": 200, "notify": true},
        "task": {"ttl": 60000},
    });
    let created = c
        .rpc(rpc("\"make\"", "tools/call", &params.to_string()))
        .await;
    let task = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {created}"))
        .to_string();
    until(
        "the record is completed with no request after the creation",
        || {
            tg.record(&task)
                .is_some_and(|r| r.status == taskgate::mcp::task::TaskStatus::Completed)
        },
    )
    .await;
}

/// The pids whose command line holds `needle` anywhere (not only at its start).
fn processes_holding(needle: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle.as_bytes()))
                && !process_gone(*pid)
        })
        .collect()
}

/// Review L1: taskgate's `SIGKILL` escalation (a command that ignores `SIGTERM` and its stdin's
/// end) reaches also what the command started in a session of its own (`setsid`: outside the
/// process group taskgate kills). Before: the group and the shim got `SIGKILL` at once, and
/// what had left the group was adopted by init and ran on.
#[tokio::test]
async fn the_sigkill_escalation_reaches_what_left_the_group() {
    let child = Kid::new();
    let marker = format!("tg-left-{}-{}", std::process::id(), rand_suffix());
    // `"$M"x`: the left process's name ("<marker>x") is not in the script itself.
    let script = format!(
        "M={marker}; trap '' TERM; setsid bash -c 'while :; do sleep 0.2; done' \"$M\"x & while :; do sleep 0.2; done"
    );
    let upstream = format!(
        "\n[[upstream]]\nname = \"default\"\ncommand = [\"bash\", \"-c\", {script:?}]\ntimeout_ms = 60000\n"
    );
    let config = child.path("taskgate.toml");
    let store = child.path("store");
    std::fs::write(&config, toml(store.to_str().unwrap(), &upstream)).unwrap();
    let mut p = TaskgateProcess::spawn(&["serve", "--config", config.to_str().unwrap()], &[]);
    p.listening();
    let left = format!("{marker}x");
    until("the command's own session runs", || {
        !processes_holding(&left).is_empty()
    })
    .await;
    p.signal(libc::SIGTERM);
    p.wait_exit(Duration::from_secs(15)).expect("stopped");
    let log = p.stderr();
    assert!(log.contains("SIGKILL"), "escalated: {log}");
    let mut rest = processes_holding(&marker);
    for _ in 0..100 {
        if rest.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        rest = processes_holding(&marker);
    }
    for pid in &rest {
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    assert!(rest.is_empty(), "left running: {rest:?}");
}

/// Review L4: a command the shim cannot start (its file is there and executable, as
/// `check-config` sees it, but its interpreter is missing: exec fails with ENOENT) is named as
/// such in `/readyz` and the log, with the reason. Before: "its child process exited (exit
/// code 127)", the reason only in a stderr line of the log.
#[tokio::test]
async fn a_command_that_cannot_be_started_is_named_in_readyz() {
    use std::os::unix::fs::PermissionsExt;
    let child = Kid::new();
    let program = child.path("server");
    std::fs::write(&program, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let upstream = format!(
        "\n[[upstream]]\nname = \"default\"\ncommand = [{:?}]\ntimeout_ms = 5000\n",
        program.display().to_string()
    );
    let config = child.path("taskgate.toml");
    let store = child.path("store");
    std::fs::write(&config, toml(store.to_str().unwrap(), &upstream)).unwrap();
    let mut p = TaskgateProcess::spawn(&["serve", "--config", config.to_str().unwrap()], &[]);
    let (_, admin) = p.listening();
    let mut body = Value::Null;
    for _ in 0..250 {
        body = admin_json(admin, "/readyz").await.1;
        if body.to_string().contains("could not be started") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = body.to_string();
    let expected = format!(
        "its command could not be started: {}: No such file or directory",
        program.display()
    );
    assert!(text.contains(&expected), "{text}");
    assert!(!text.contains("exit code 127"), "{text}");
    p.signal(libc::SIGTERM);
    p.wait_exit(Duration::from_secs(15)).expect("stopped");
    assert!(p.stderr().contains(&expected), "{}", p.stderr());
}

/// A signal meant for the server sent to the pid taskgate started (now the shim, the group's
/// leader: `kill -USR1 <pid>` for a log reopen) reaches the command, which goes on. Before the
/// review fix the shim took only the stops: `SIGUSR1` killed it by its default action, and the
/// command died of its parent-death signal.
#[tokio::test]
async fn a_signal_sent_to_the_shim_reaches_the_command() {
    let child = Kid::new();
    let log = child.path("usr1");
    let marker = format!("tg-usr1-{}-{}", std::process::id(), rand_suffix());
    let script = format!(
        "trap 'echo usr1 >> {}' USR1; while :; do sleep 0.05; done # {marker}",
        log.display()
    );
    let upstream = format!(
        "\n[[upstream]]\nname = \"default\"\ncommand = [\"bash\", \"-c\", {script:?}]\ntimeout_ms = 60000\n"
    );
    let config = child.path("taskgate.toml");
    let store = child.path("store");
    std::fs::write(&config, toml(store.to_str().unwrap(), &upstream)).unwrap();
    let mut p = TaskgateProcess::spawn(&["serve", "--config", config.to_str().unwrap()], &[]);
    p.listening();
    let shim_and_bash = || {
        let all = processes_holding(&marker);
        let shim = all.iter().copied().find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(13).any(|w| w == b"__stdio-child"))
        });
        let bash = all.iter().copied().find(|pid| Some(*pid) != shim);
        shim.zip(bash)
    };
    until("the shim and its command run", || shim_and_bash().is_some()).await;
    let (shim, bash) = shim_and_bash().unwrap();
    unsafe { libc::kill(shim, libc::SIGUSR1) };
    until("the command got the signal", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("usr1"))
    })
    .await;
    assert!(!process_gone(shim) && !process_gone(bash), "both go on");
    p.signal(libc::SIGTERM);
    p.wait_exit(Duration::from_secs(15)).expect("stopped");
}
