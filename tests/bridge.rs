//! A 2025-11-25 client on a 2026-07-28 task server through taskgate (issue 12, the `bridge`
//! layer), against the scripted dual-era server of `common/modern_server.rs` (a 2025
//! `initialize` session without `capabilities.tasks`, `server/discover` advertising the tasks
//! extension, stateless 2026 task requests). Only the wire, the upstream's received requests and
//! the registry are asserted.

use crate::common::modern_server::create as create_modern;
use crate::common::*;

use serde_json::{json, Value};
use taskgate::mcp::task::TaskStatus;
use taskgate::store::Origin;

const RELATED: &str = "io.modelcontextprotocol/related-task";

/// A 2025 client (TS SDK style: `MCP-Protocol-Version: 2025-11-25`, a session) initialized
/// through taskgate.
async fn legacy_client(tg: &Tg) -> (Client, Value) {
    let mut c = tg.client();
    let init = c.initialize().await;
    (c, init)
}

fn create_body(id: u64, tool: &str) -> String {
    rpc(
        &id.to_string(),
        "tools/call",
        &json!({"name": tool, "arguments": {}, "task": {"ttl": 60000}}).to_string(),
    )
}

async fn create(c: &Client, id: u64) -> String {
    let v = c.rpc(create_body(id, "slow_compute")).await;
    v.pointer("/result/task/taskId")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("not a 2025 CreateTaskResult: {v}"))
        .to_string()
}

fn set(state: &Shared, task_id: &str, status: &str) {
    state
        .lock()
        .unwrap()
        .tasks
        .insert(task_id.into(), status.into());
}

/// Taskgate in front of `up`, a 2025 client declaring `capability` (and tasks), one of its
/// bridged tasks set to `status` upstream, and that task's `tasks/result` (id 3) read up to its
/// status notification: taskgate, the client, the task's id, the stream and the notification.
async fn input_stream(
    up: &Upstream,
    state: &Shared,
    capability: &str,
    status: &str,
) -> (Tg, Client, String, SseReader, Value) {
    let tg = TgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({capability: {}, "tasks": {}})).await;
    let t = create(&c, 2).await;
    set(state, &t, status);
    let (sse, notification) = c.input_stream("3", &t).await;
    (tg, c, t, sse, notification)
}

/// initialize advertises 2025 `capabilities.tasks`, tools get `execution.taskSupport`, a
/// task-augmented call goes upstream as a 2026 request declaring the extension (no
/// `params.task`, no session, 2026 headers), comes back nested, recorded `bridged` before the
/// client sees it; tasks/get, tasks/list, a blocking tasks/result with the related-task `_meta`,
/// and a tool error shown as 2025 `failed`.
#[tokio::test]
async fn a_2025_client_runs_the_task_lifecycle_on_a_2026_server() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, init) = legacy_client(&tg).await;
    let tasks = &init["result"]["capabilities"]["tasks"];
    assert!(
        tasks["requests"]["tools"]["call"].is_object() && tasks["cancel"].is_object(),
        "{init}"
    );
    assert_eq!(
        count(&up, "server/discover"),
        1,
        "the era was discovered once"
    );
    let tools = c.rpc(rpc("2", "tools/list", "{}")).await;
    assert_eq!(
        tools["result"]["tools"][0]["execution"]["taskSupport"], "optional",
        "{tools}"
    );

    let t = create(&c, 3).await;
    let r = tg
        .record(&t)
        .expect("recorded before the client saw the id");
    assert_eq!(
        (r.origin, r.era),
        (Origin::Bridged, taskgate::mcp::era::Era::Modern)
    );
    let sent = up.received("tools/call").pop().unwrap();
    let body = sent.json();
    assert!(body["params"].get("task").is_none(), "{body}");
    assert!(
        body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]["extensions"][EXT]
            .is_object(),
        "{body}"
    );
    assert_eq!(
        body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
        MODERN
    );
    assert_eq!(sent.header("mcp-protocol-version").as_deref(), Some(MODERN));
    assert_eq!(sent.header("mcp-method").as_deref(), Some("tools/call"));
    assert_eq!(sent.header("mcp-name").as_deref(), Some("slow_compute"));
    assert!(!sent.has_header("mcp-session-id"));

    let got = c.get("4", &t).await;
    assert_eq!(got["result"]["status"], "working", "{got}");
    assert!(got["result"].get("resultType").is_none(), "{got}");
    assert_eq!(got["result"]["pollInterval"], 50, "{got}");
    let sent = up.received("tasks/get").pop().unwrap();
    assert_eq!(sent.header("mcp-name").as_deref(), Some(t.as_str()));

    let list = c.list("5", None).await;
    assert!(
        list["result"]["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["taskId"] == json!(t)),
        "{list}"
    );

    // tasks/result blocks until the upstream says completed.
    let waiting = {
        let c = Client {
            url: c.url.clone(),
            token: None,
            session: c.session.clone(),
        };
        let t = t.clone();
        tokio::spawn(async move { c.result("6", &t).await })
    };
    assert!(up.wait_for_method("tasks/get", 3, STEP).await);
    assert!(!waiting.is_finished());
    set(&state, &t, "completed");
    let res = waiting.await.unwrap();
    assert_eq!(
        res["result"]["content"][0]["text"],
        format!("done {t}"),
        "{res}"
    );
    assert_eq!(res["result"]["_meta"][RELATED]["taskId"], json!(t), "{res}");
    assert_eq!(tg.record(&t).unwrap().status, TaskStatus::Completed);
    let gets = count(&up, "tasks/get");
    let again = c.result("7", &t).await;
    assert_eq!(again["result"], res["result"], "served from the record");
    assert_eq!(count(&up, "tasks/get"), gets, "without the upstream");

    // A tool error (2026 completed + isError) is a 2025 failed; its result has isError.
    let e = create(&c, 8).await;
    set(&state, &e, "tool_error");
    let got = c.get("9", &e).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    let res = c.result("10", &e).await;
    assert_eq!(res["result"]["isError"], true, "{res}");
    // A protocol error (2026 failed + error) is the same JSON-RPC error from tasks/result.
    let f = create(&c, 11).await;
    set(&state, &f, "failed");
    let res = c.result("12", &f).await;
    assert_eq!(err_code(&res), -32603, "{res}");
}

/// `upstream.protocol = "2025-11-25"` never bridges nor asks `server/discover`.
#[tokio::test]
async fn protocol_2025_is_never_bridged() {
    let (up, _) = modern_server().await;
    let cfg = TgConfig::new(&up.url());
    let tg = Tg::start(|store| cfg.to_toml(store) + "protocol = \"2025-11-25\"\n").await;
    let (_c, init) = legacy_client(&tg).await;
    assert!(
        init["result"]["capabilities"].get("tasks").is_none(),
        "{init}"
    );
    assert_eq!(count(&up, "server/discover"), 0);
}

/// tasks/cancel of a working task: one upstream cancel, the reply and the record say
/// cancelled; a second cancel is -32602 and not forwarded; a late upstream completion never
/// changes what the 2025 client sees, and is counted as a late result. The server cancels
/// cooperatively: after its ack the task is still `working` (2026-07-28 §1.6), so the bridge's
/// `tasks/get` after the ack sees it live and the ack stands as `cancelled`; then it completes.
#[tokio::test]
async fn cancel_is_forwarded_once_and_stays_cancelled() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    state.lock().unwrap().cancel_after = Some(std::time::Duration::from_secs(3600));
    let v = c.cancel("3", &t).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    assert_eq!(v["result"]["taskId"], json!(t), "{v}");
    assert_eq!(count(&up, "tasks/cancel"), 1);
    let r = tg.record(&t).unwrap();
    assert_eq!(r.status, TaskStatus::Cancelled);
    assert!(r.cancel_requested_at.is_some() && r.cancelled_at.is_some());
    let again = c.cancel("4", &t).await;
    assert_eq!(err_code(&again), -32602, "{again}");
    assert_eq!(
        count(&up, "tasks/cancel"),
        1,
        "a terminal task's cancel is local"
    );
    // The upstream now reports the late completion.
    set(&state, &t, "completed");
    let got = c.get("5", &t).await;
    assert_eq!(got["result"]["status"], "cancelled", "{got}");
    let res = c.result("6", &t).await;
    assert_eq!(
        err_code(&res),
        -32603,
        "no result for a cancelled task: {res}"
    );
    let r = tg.record(&t).unwrap();
    assert_eq!(r.status, TaskStatus::Cancelled);
    assert!(r.late_result_at.is_some(), "the late completion is counted");
}

/// A task that ended upstream before the 2025 client's cancel, while taskgate had not polled it
/// (a 2026 server has no status notifications without a listen), is not turned into
/// `cancelled`: the 2026 server acknowledges any cancel, so the bridge asks `tasks/get` first;
/// the client gets `-32602` naming the status, as from a 2025 server, and its result stays
/// reachable. Before: the ack was taken for `cancelled`, the answer said so, and `tasks/result`
/// was `-32603` "was cancelled; it has no result" for a task that had completed.
#[tokio::test]
async fn a_cancel_of_a_task_that_already_ended_upstream_keeps_its_result() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    set(&state, &t, "completed");
    let v = c.cancel("3", &t).await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("completed"),
        "{v}"
    );
    assert_eq!(tg.record(&t).unwrap().status, TaskStatus::Completed);
    let res = c.result("4", &t).await;
    assert_eq!(
        res["result"]["content"][0]["text"],
        json!(format!("done {t}")),
        "{res}"
    );
    let got = c.get("5", &t).await;
    assert_eq!(got["result"]["status"], "completed", "{got}");
    assert_eq!(
        count(&up, "tasks/cancel"),
        0,
        "an ended task is not cancelled"
    );
}

/// The cancel of a task that already ended upstream is taskgate's own answer for a terminal
/// task, as when its record already said so: counted
/// `taskgate_cancel_requests_total{outcome="rejected_terminal"}`, no "cancel requested" fact
/// (nothing was sent). Before: counted `upstream_error`, and audited "tasks/cancel forwarded
/// upstream" with `cancel_requested_at` set, for a cancel that never left taskgate.
#[tokio::test]
async fn a_cancel_of_an_ended_task_is_counted_as_taskgates_own_answer() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    set(&state, &t, "completed");
    let v = c.cancel("3", &t).await;
    assert_eq!(err_code(&v), -32602, "{v}");
    assert_eq!(count(&up, "tasks/cancel"), 0);
    let m = tg.metrics_text().await;
    let outcome = |o: &str| metric(&m, "taskgate_cancel_requests_total", &[("outcome", o)]);
    assert_eq!(outcome("rejected_terminal"), 1.0, "{m}");
    assert_eq!(outcome("upstream_error") + outcome("forwarded"), 0.0, "{m}");
    let r = tg.record(&t).unwrap();
    assert_eq!(r.status, TaskStatus::Completed);
    assert!(r.cancel_requested_at.is_none(), "{r:?}");
    let audit = tg.registry.store().audit_for("default", &t).unwrap();
    assert!(
        !audit.iter().any(|e| e.event == "cancel_requested"),
        "{audit:?}"
    );
    // A second cancel is answered from the record, counted the same way.
    let again = c.cancel("4", &t).await;
    assert_eq!(err_code(&again), -32602, "{again}");
    let m = tg.metrics_text().await;
    let outcome = |o: &str| metric(&m, "taskgate_cancel_requests_total", &[("outcome", o)]);
    assert_eq!(outcome("rejected_terminal"), 2.0, "{m}");
}

/// A 2025 cancel of a principal's 2026 task on a server whose 2025 sessions serve 2025 tasks
/// themselves (its `initialize` declares `capabilities.tasks`): the bridge passes the cancel
/// on untranslated, and "cancel requested" is recorded as for any forwarded cancel. Before:
/// `cancel` left it to the bridge (a 2025 cancel of a 2026-era record), which recorded it only
/// when it sent the cancel itself: a cancel that went upstream with no "cancel requested".
#[tokio::test]
async fn a_2025_cancel_passed_on_untranslated_records_cancel_requested() {
    let (up, _state) = scripted(|req, v, _| {
        (v["method"] == "initialize").then(|| {
            ScriptedResponse::json(rpc_result(
                &req.rpc_id_json(),
                &json!({"protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {}, "tasks": {"cancel": {}, "requests": {"tools": {"call": {}}}}},
                    "serverInfo": {"name": "dual", "version": "1"}})
                .to_string(),
            ))
            .header("mcp-session-id", "dual-session-1")
        })
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .start()
        .await;
    let url = tg.mcp_url();
    let t = create_modern(&url, Some("alice-token"), "slow_compute").await;
    assert_eq!(tg.record(&t).unwrap().era, taskgate::mcp::era::Era::Modern);
    let mut alice = tg.client().with_token("alice-token");
    alice.initialize().await;
    let v = alice.cancel("\"c1\"", &t).await;
    assert!(
        up.received("tasks/cancel")
            .iter()
            .any(|r| r.json()["id"] == "c1"),
        "passed on untranslated, under the client's own id: {v}"
    );
    let r = tg.record(&t).unwrap();
    assert!(r.cancel_requested_at.is_some(), "{r:?}");
}

/// The bridged cancel's `tasks/get` and `tasks/cancel` share one deadline, the upstream's
/// `timeout_ms`: with each answered after 0.7 of it, the client gets the upstream timeout's
/// `-32603` at `timeout_ms`, not the ack at 1.4 times it (before: each exchange had
/// `timeout_ms` of its own, so a cancel could take twice as long).
#[tokio::test]
async fn a_bridged_cancel_ends_within_one_timeout() {
    let slow = std::time::Duration::from_millis(700);
    let (up, state) = tasks_get_answered(slow, |task_id, state| {
        let status = state.lock().unwrap().tasks.get(task_id).cloned()?;
        Some(detailed(task_id, &status))
    })
    .await;
    state.lock().unwrap().cancel_delay = slow;
    let cfg = TgConfig::new(&up.url());
    let tg = Tg::start(|store| cfg.to_toml(store) + "timeout_ms = 1000\n").await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    let started = std::time::Instant::now();
    let v = tokio::time::timeout(STEP, c.cancel("3", &t))
        .await
        .expect("tasks/cancel answered");
    let took = started.elapsed();
    assert_eq!(err_code(&v), -32603, "{v}");
    assert!(
        err_message(&v).contains("did not answer within 1000 ms"),
        "{v}"
    );
    assert!(
        took < std::time::Duration::from_millis(1350),
        "answered after {took:?}: {v}"
    );
}

/// A 2026 server whose task, asked about once by the bridge's cancel, is answered `working`
/// and ends `status` (`completed`, `tool_error`, ...) right after that answer; taskgate on it, a
/// 2025 client, and that client's task, ready for its cancel.
async fn ends_between_check_and_cancel(status: &'static str) -> (Upstream, Tg, Client, String) {
    let flip: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>> =
        Default::default();
    let to_flip = flip.clone();
    let (up, _state) = tasks_get_answered(std::time::Duration::ZERO, move |task_id, state| {
        if !to_flip.lock().unwrap().remove(task_id) {
            return None;
        }
        state
            .lock()
            .unwrap()
            .tasks
            .insert(task_id.to_string(), status.into());
        Some(detailed(task_id, "working"))
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    flip.lock().unwrap().insert(t.clone());
    (up, tg, c, t)
}

/// A task that completes upstream between the bridge's `tasks/get` and its `tasks/cancel` (the
/// 2026 server acknowledges the cancel and keeps `completed`, as §1.6 allows) is not recorded
/// `cancelled`: after the ack the bridge asks again, records `completed` with its result, and
/// answers `-32602` naming it; the result stays reachable. Before: recorded `cancelled` from
/// the ack, its result lost (`tasks/result` `-32603`).
#[tokio::test]
async fn a_task_that_completes_before_its_cancel_takes_effect_keeps_its_result() {
    let (up, tg, c, t) = ends_between_check_and_cancel("completed").await;
    let v = c.cancel("3", &t).await;
    assert_eq!(err_code(&v), -32602, "{v}");
    assert!(err_message(&v).contains("completed"), "{v}");
    assert_eq!(count(&up, "tasks/cancel"), 1, "the cancel was sent");
    // Sent and acknowledged: `forwarded`, not an upstream error.
    let m = tg.metrics_text().await;
    let outcome = |o: &str| metric(&m, "taskgate_cancel_requests_total", &[("outcome", o)]);
    assert_eq!(outcome("forwarded"), 1.0, "{m}");
    assert_eq!(outcome("upstream_error"), 0.0, "{m}");
    let r = tg.record(&t).unwrap();
    assert_eq!(r.status, TaskStatus::Completed, "{r:?}");
    assert!(r.cancel_requested_at.is_some(), "{r:?}");
    let res = c.result("4", &t).await;
    assert_eq!(
        res["result"]["content"][0]["text"],
        json!(format!("done {t}")),
        "{res}"
    );
    let got = c.get("5", &t).await;
    assert_eq!(got["result"]["status"], "completed", "{got}");
}

/// The same race with a tool error (2026 `completed` with `isError: true`, which a 2025
/// client is shown as `failed`): the cancel's `-32602` names `failed`, as every `tasks/get`
/// of the task does. Before: it named `completed`, the 2026 status, which this client never
/// saw for the task.
#[tokio::test]
async fn a_tool_error_that_ends_before_its_cancel_takes_effect_is_named_failed() {
    let (_up, _tg, c, t) = ends_between_check_and_cancel("tool_error").await;
    let v = c.cancel("3", &t).await;
    assert_eq!(err_code(&v), -32602, "{v}");
    assert!(err_message(&v).contains("failed"), "{v}");
    let got = c.get("4", &t).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    // A second cancel, answered from the record, names it the same way.
    let again = c.cancel("5", &t).await;
    assert!(err_message(&again).contains("failed"), "{again}");
}

/// A cancel racing the task's completion, 200 rounds: the cancel's answer, later tasks/get
/// answers and the record agree, and the client never sees a terminal status change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_completion_agrees_everywhere() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1000")
        .start()
        .await;
    let (c, _) = legacy_client(&tg).await;
    let c = std::sync::Arc::new(c);
    let mut cancelled = 0;
    for round in 0..200u64 {
        let t = create(&c, 10_000 + round * 10).await;
        let canceller = {
            let (c, t) = (c.clone(), t.clone());
            tokio::spawn(async move { c.cancel(&(10_001 + round * 10).to_string(), &t).await })
        };
        let poller = {
            let (c, t, state) = (c.clone(), t.clone(), state.clone());
            tokio::spawn(async move {
                set(&state, &t, "completed");
                c.get(&(10_002 + round * 10).to_string(), &t).await
            })
        };
        let cancel = canceller.await.unwrap();
        let first = poller.await.unwrap();
        let last = c.get(&(10_003 + round * 10).to_string(), &t).await;
        let record = tg.record(&t).unwrap().status;
        let last_status = last["result"]["status"].as_str().unwrap().to_string();
        assert_eq!(record.as_str(), last_status, "round {round}: {last}");
        if cancel.get("result").is_some() {
            cancelled += 1;
            assert_eq!(cancel["result"]["status"], "cancelled", "round {round}");
            assert_eq!(last_status, "cancelled", "round {round}");
        } else {
            assert_eq!(err_code(&cancel), -32602, "round {round}: {cancel}");
            assert_eq!(last_status, "completed", "round {round}");
        }
        let first_status = first["result"]["status"].as_str().unwrap_or("");
        if ["completed", "failed", "cancelled"].contains(&first_status) {
            assert_eq!(
                first_status, last_status,
                "round {round}: a terminal status changed"
            );
        }
    }
    assert!(count(&up, "tasks/cancel") <= 200);
    eprintln!("{cancelled} of 200 rounds ended cancelled");
}

/// An upstream that dropped a bridged task (it restarted, or deleted it) answers taskgate's own
/// 2026 `tasks/get` `-32602`: as for every task an upstream lost (README: "when the upstream
/// says it no longer has a task taskgate recorded live"), the record becomes `failed` ("no
/// longer has this task"; "resources released", `reason=upstream_lost`), the owner's slot is
/// free again, and the 2025 client gets the failed `Task` and, from `tasks/result`, the `-32603`
/// it was failed with, from the record from then on (nothing more goes upstream); a cancel is
/// `-32602` "already terminal". Before: `-32602` "not found" to each, and the record stayed
/// `working`, holding the owner's slot for the task's ttl.
#[tokio::test]
async fn a_task_the_upstream_dropped_is_failed_as_lost() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 2")
        .start()
        .await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    let t2 = create(&c, 3).await;
    state.lock().unwrap().tasks.remove(&t);
    state.lock().unwrap().tasks.remove(&t2);
    let got = c.get("4", &t).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    assert_eq!(got["result"]["taskId"], json!(t), "{got}");
    assert!(
        got["result"]["statusMessage"]
            .as_str()
            .is_some_and(|m| m.contains("no longer has this task")),
        "{got}"
    );
    // Found lost by the blocking tasks/result's own poll.
    let res = c.result("5", &t2).await;
    assert_eq!(err_code(&res), -32603, "{res}");
    assert!(
        err_message(&res).contains("no longer has this task"),
        "{res}"
    );
    for task in [&t, &t2] {
        let r = tg.record(task).expect("record");
        assert_eq!(r.status, TaskStatus::Failed, "{task}");
        assert!(r.released_at.is_some(), "released");
        let audit = tg
            .registry
            .store()
            .audit_for("default", task)
            .expect("audit");
        assert!(
            audit
                .iter()
                .any(|e| e.event == "resources_released" && e.detail == "reason=upstream_lost"),
            "{audit:?}"
        );
    }
    // From the records now: nothing more goes upstream.
    let gets = count(&up, "tasks/get");
    assert_eq!(c.get("6", &t).await["result"]["status"], "failed");
    assert_eq!(err_code(&c.result("7", &t).await), -32603);
    let cancel = c.cancel("8", &t2).await;
    assert_eq!(err_code(&cancel), -32602, "terminal: {cancel}");
    assert_eq!(count(&up, "tasks/get"), gets);
    assert_eq!(count(&up, "tasks/cancel"), 0);
    // Both slots are free again.
    create(&c, 9).await;
    create(&c, 10).await;
}

/// The same lost task cancelled before anyone polls it: the upstream answers the 2026
/// `tasks/cancel` `-32602`, taskgate's own `tasks/get` is answered `-32602` too, so the record
/// is failed as lost and the owner's slot freed; the 2025 client gets `-32602` "already
/// terminal" naming `failed`. Before: the upstream's `-32602` "not found", and the record
/// stayed `working` (its slot held) for the task's ttl.
#[tokio::test]
async fn a_task_the_upstream_dropped_is_failed_by_its_cancel() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    state.lock().unwrap().tasks.remove(&t);
    let cancel = c.cancel("3", &t).await;
    assert_eq!(err_code(&cancel), -32602, "{cancel}");
    assert!(err_message(&cancel).contains("failed"), "{cancel}");
    let r = tg.record(&t).expect("record");
    assert_eq!(r.status, TaskStatus::Failed, "{:?}", r.status_message);
    assert!(r.released_at.is_some(), "released");
    create(&c, 4).await;
    assert_eq!(count(&up, "tasks/cancel"), 1);
}

/// A bridged task recorded `cancelled` (its cancel acknowledged) that the upstream then forgets
/// (a restart) is still shown `cancelled` to the 2025 client's `tasks/get` (the first terminal
/// status is final), and its "resources released" is recorded (`reason=upstream_lost`); before,
/// the upstream's `-32602` "not found" about a task the client had just cancelled.
#[tokio::test]
async fn a_cancelled_task_the_upstream_dropped_stays_cancelled() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_stored_result_bytes = 0")
        .start()
        .await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    let cancel = c.cancel("3", &t).await;
    assert_eq!(cancel["result"]["status"], "cancelled", "{cancel}");
    state.lock().unwrap().tasks.remove(&t);
    let got = c.get("4", &t).await;
    assert_eq!(got["result"]["status"], "cancelled", "{got}");
    let r = tg.record(&t).expect("record");
    assert_eq!(r.status, TaskStatus::Cancelled);
    assert!(r.released_at.is_some(), "released");
}

/// kill -9 in the middle of a bridged tasks/result: after a restart the task is still
/// reachable and tasks/result completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridged_task_survives_sigkill_mid_result() {
    let (up, state) = modern_server().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = TgConfig::new(&up.url()).write_for_binary(dir.path());
    let spawn = |cfg: String| {
        tokio::task::block_in_place(move || {
            let mut p = TaskgateProcess::spawn(&["serve", "--config", &cfg], &[]);
            let (g, _) = p.listening();
            (p, g)
        })
    };
    let (mut p, gw) = spawn(cfg.clone());
    let mut c = Client::new(&format!("http://{gw}/mcp"));
    c.initialize().await;
    let t = create(&c, 2).await;
    let pending = {
        let (c, t) = (
            Client {
                url: c.url.clone(),
                token: None,
                session: c.session.clone(),
            },
            t.clone(),
        );
        tokio::spawn(async move {
            // Held open (the SSE answer): a client that goes away stops the polls.
            c.send(rpc("3", "tasks/result", &json!({"taskId": t}).to_string()))
                .await
                .bytes()
                .await
        })
    };
    assert!(
        up.wait_for_method("tasks/get", 2, STEP).await,
        "tasks/result is polling"
    );
    tokio::task::block_in_place(|| {
        p.signal(libc::SIGKILL);
        p.wait_exit(STEP).expect("taskgate did not die on SIGKILL");
    });
    pending.abort();
    let (_p2, gw) = spawn(cfg);
    let mut c = Client::new(&format!("http://{gw}/mcp"));
    c.session = None;
    c.initialize().await;
    set(&state, &t, "completed");
    let res = c.result("4", &t).await;
    assert_eq!(res["result"]["_meta"][RELATED]["taskId"], json!(t), "{res}");
}

// ---------------------------------------------------------------------------------------------
// Plain clients on a 2026 task server ([upgrade] enabled)
// ---------------------------------------------------------------------------------------------

fn only_task(state: &Shared) -> Option<String> {
    state.lock().unwrap().tasks.keys().next().cloned()
}

/// A client without the tasks capability calls a tool the 2026 server only runs as a task (it
/// answers `-32021`): taskgate sends the call again declaring the extension, records the task
/// (origin `upgraded`), follows it and answers the original id with the real result.
#[tokio::test]
async fn a_plain_call_answered_32021_gets_the_real_result() {
    let (up, state) = modern_server().await;
    let tg = UgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let body = call_body("41", "task_only", Some(json!("pt-41")));
    let answer = {
        let c = Client {
            url: c.url.clone(),
            token: None,
            session: c.session.clone(),
        };
        tokio::spawn(async move { call(&c, &body, &json!(41)).await })
    };
    assert!(
        up.wait_for_method("tools/call", 2, STEP).await,
        "sent again as a task"
    );
    let calls = up.received("tools/call");
    assert!(calls[0].json()["params"]["_meta"]
        .get("io.modelcontextprotocol/clientCapabilities")
        .is_none());
    assert!(
        calls[1].json()["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
            ["extensions"][EXT]
            .is_object()
    );
    let t = only_task(&state).expect("the upstream created the task");
    assert!(up.wait_for_method("tasks/get", 1, STEP).await, "followed");
    set(&state, &t, "completed");
    let out = answer.await.unwrap();
    assert_eq!(
        out.answer["result"]["content"][0]["text"],
        format!("done {t}"),
        "{:?}",
        out
    );
    assert_eq!(tg.record(&t).unwrap().origin, Origin::Upgraded);
}

/// The plain client's `notifications/cancelled` for an upgraded call becomes one upstream
/// `tasks/cancel`.
#[tokio::test]
async fn notifications_cancelled_of_an_upgraded_call_cancels_once() {
    let (up, state) = modern_server().await;
    let tg = UgConfig::new(&up.url()).start().await;
    let mut c = tg.client();
    c.initialize().await;
    let body = call_body("51", "task_only", None);
    let _answer = {
        let c = Client {
            url: c.url.clone(),
            token: None,
            session: c.session.clone(),
        };
        tokio::spawn(async move { c.send(body).await.bytes().await })
    };
    assert!(up.wait_for_method("tasks/get", 1, STEP).await, "followed");
    let t = only_task(&state).unwrap();
    for _ in 0..2 {
        c.notify(
            "notifications/cancelled",
            json!({"requestId": 51, "reason": "user"}),
        )
        .await;
    }
    assert!(up.wait_for_method("tasks/cancel", 1, STEP).await);
    let r = eventually(STEP, || async {
        tg.record(&t).filter(|r| r.status == TaskStatus::Cancelled)
    })
    .await;
    assert!(r.is_some(), "recorded cancelled");
    assert_eq!(count(&up, "tasks/cancel"), 1, "one upstream cancel");
    assert_eq!(count(&up, "notifications/cancelled"), 0);
}

/// Tester 5 #5: a `notifications/cancelled` naming a pending bridged `tasks/result` is
/// answered by taskgate (HTTP 202) and not sent upstream: the upstream never saw that request
/// (the bridge polls with requests of its own). Before: sent on without a session, answered
/// HTTP 400 by the upstream, and so to the client. The `tasks/result` runs on to the task's
/// end (a receiver may ignore a cancellation).
#[tokio::test]
async fn notifications_cancelled_of_a_bridged_tasks_result_is_answered_here() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    let mut result = c
        .send(rpc("3", "tasks/result", &json!({"taskId": t}).to_string()))
        .await
        .sse();
    assert!(up.wait_for_method("tasks/get", 1, STEP).await, "following");
    let status = c
        .notify(
            "notifications/cancelled",
            json!({"requestId": 3, "reason": "user"}),
        )
        .await;
    assert_eq!(status, 202);
    assert_eq!(
        count(&up, "notifications/cancelled"),
        0,
        "not sent upstream"
    );
    set(&state, &t, "completed");
    let done = loop {
        let ev = result.next_event(STEP).await.json();
        if ev.get("id").is_some() {
            break ev;
        }
    };
    assert_eq!(done["id"], 3, "{done}");
    assert!(done["result"].is_object(), "ran on to the end: {done}");
}

// ---------------------------------------------------------------------------------------------
// input_required
// ---------------------------------------------------------------------------------------------

/// `input_required`: the `inputRequests` entry becomes one `elicitation/create` on the
/// `tasks/result` stream (related-task `_meta`), never asked again though every poll repeats it;
/// the client's answer goes upstream as `tasks/update` under the key; then the result.
#[tokio::test]
async fn input_required_is_asked_once_and_answered_with_tasks_update() {
    let (up, state) = modern_server().await;
    let (_tg, c, t, mut sse, status) =
        input_stream(&up, &state, "elicitation", "input_required").await;
    assert_eq!(status["params"]["status"], "input_required", "{status}");
    let ask = sse.next_event(STEP).await.json();
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    assert_eq!(ask["params"]["_meta"][RELATED]["taskId"], json!(t), "{ask}");
    assert_eq!(ask["params"]["message"], "your name?");
    // The same snapshot on later polls is not asked again.
    let polls = count(&up, "tasks/get");
    assert!(up.wait_for_method("tasks/get", polls + 3, STEP).await);
    // The related-task `_meta` 2025-11-25 requires on the answer (whatever taskId the client
    // wrote) is not copied into the 2026 input response: 2026-07-28 has no such key.
    let answer = json!({"jsonrpc":"2.0","id": ask["id"],
        "result":{"action":"accept","content":{"name":"Luca"},
            "_meta": {RELATED: {"taskId": "not-this-one"}}}});
    let r = c.send(answer.to_string()).await;
    assert_eq!(r.status(), 202);
    assert!(up.wait_for_method("tasks/update", 1, STEP).await);
    let update = up.received("tasks/update").pop().unwrap().json();
    assert_eq!(update["params"]["taskId"], json!(t));
    assert_eq!(
        update["params"]["inputResponses"]["name"],
        json!({"action": "accept", "content": {"name": "Luca"}}),
        "{update}"
    );
    set(&state, &t, "completed");
    let done = sse.next_event(STEP).await.json();
    assert_eq!(
        done["id"], 3,
        "no second elicitation before the answer: {done}"
    );
    assert_eq!(
        done["result"]["_meta"][RELATED]["taskId"],
        json!(t),
        "{done}"
    );
    assert_eq!(count(&up, "tasks/update"), 1);
}

/// Tester 5 #6: a client's answer to a relayed `elicitation/create` that is no `ElicitResult`
/// (`{"bogus":true}`) is taken as an error answer: the upstream gets `{"action":"decline"}` as
/// its input response, which it can take. Before: the bogus result went on as it came, the
/// server kept the key waiting, taskgate (which had taken it as answered) never asked again,
/// and the client's `tasks/result` waited until the ttl.
#[tokio::test]
async fn an_answer_that_is_no_result_of_the_request_is_a_decline() {
    let (up, state) = modern_server().await;
    let (_tg, c, t, mut sse, _) = input_stream(&up, &state, "elicitation", "input_required").await;
    let ask = sse.next_event(STEP).await.json();
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    let answer = json!({"jsonrpc":"2.0","id": ask["id"], "result": {"bogus": true}});
    assert_eq!(c.send(answer.to_string()).await.status(), 202);
    assert!(up.wait_for_method("tasks/update", 1, STEP).await);
    let update = up.received("tasks/update").pop().unwrap().json();
    assert_eq!(update["params"]["taskId"], json!(t));
    assert_eq!(
        update["params"]["inputResponses"]["name"],
        json!({"action": "decline"}),
        "{update}"
    );
}

/// A `sampling/createMessage` input request the 2025 client answers with a JSON-RPC error: a
/// 2026 `CreateMessageResult` cannot say "refused" (`InputResponse` has no error form), so
/// nothing is sent as its answer; the task is cancelled upstream once, recorded `cancelled`,
/// counted `taskgate_bridge_input_refused_total{reason="client_error"}`, and the
/// `tasks/result` ends with `-32603`, the request not asked again although the (cooperative)
/// server still shows it. Before: `tasks/update` with `{"action":"decline"}` (an
/// `ElicitResult`) as the sampling result, and the task was left waiting.
#[tokio::test]
async fn a_sampling_request_answered_with_an_error_cancels_the_task() {
    let (up, state) = sampling_task_server().await;
    // A cooperative server: after the ack the task still asks for its input.
    state.lock().unwrap().cancel_after = Some(std::time::Duration::from_secs(3600));
    let (tg, c, t, mut sse, _status) = input_stream(&up, &state, "sampling", "sampling").await;
    let ask = sse.next_event(STEP).await.json();
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    let refusal = json!({"jsonrpc": "2.0", "id": ask["id"],
        "error": {"code": -1, "message": "User rejected sampling request"}});
    let r = c.send(refusal.to_string()).await;
    assert_eq!(r.status(), 202);
    assert!(
        up.wait_for_method("tasks/cancel", 1, STEP).await,
        "the task is cancelled upstream; tasks/update sent: {:?}",
        up.received("tasks/update")
            .iter()
            .map(|u| u.json())
            .collect::<Vec<_>>()
    );
    let end = sse.next_event(STEP).await.json();
    assert_eq!(end["id"], 3, "no second sampling request: {end}");
    assert_eq!(err_code(&end), -32603, "{end}");
    assert_eq!(
        count(&up, "tasks/update"),
        0,
        "no decline sent as a sampling result"
    );
    assert_eq!(count(&up, "tasks/cancel"), 1);
    assert_eq!(tg.record(&t).unwrap().status, TaskStatus::Cancelled);
    let m = tg.metrics_text().await;
    let refused = metric(
        &m,
        "taskgate_bridge_input_refused_total",
        &[("reason", "client_error")],
    );
    assert_eq!(refused, 1.0, "{m}");
}

/// The client's POST of an error answering a relayed `sampling/createMessage` gets its 202 at
/// once: the task's cancel that it causes runs in the background (here the upstream takes 3 s
/// to acknowledge it), still counted (`reason="client_error"`) and recorded `cancelled`.
/// Before: the 202 waited for the whole cancel (up to the upstream's `timeout_ms`).
#[tokio::test]
async fn an_error_answer_to_sampling_is_accepted_at_once_and_cancels_in_the_background() {
    let (up, state) = sampling_task_server().await;
    state.lock().unwrap().cancel_delay = std::time::Duration::from_secs(3);
    let (tg, c, t, mut sse, _status) = input_stream(&up, &state, "sampling", "sampling").await;
    let ask = sse.next_event(STEP).await.json();
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    let refusal = json!({"jsonrpc": "2.0", "id": ask["id"],
        "error": {"code": -1, "message": "User rejected sampling request"}});
    let started = std::time::Instant::now();
    let r = c.send(refusal.to_string()).await;
    let took = started.elapsed();
    assert_eq!(r.status(), 202);
    assert!(
        took < std::time::Duration::from_secs(1),
        "the 202 waited {took:?} for the cancel"
    );
    // The cancel goes on: sent upstream once, the task recorded cancelled once acknowledged.
    assert!(up.wait_for_method("tasks/cancel", 1, STEP).await);
    let cancelled = eventually(STEP, || {
        let status = tg.record(&t).map(|r| r.status);
        async move { (status == Some(TaskStatus::Cancelled)).then_some(()) }
    })
    .await;
    assert!(cancelled.is_some(), "{:?}", tg.record(&t));
    assert_eq!(count(&up, "tasks/cancel"), 1);
    assert_eq!(count(&up, "tasks/update"), 0);
    let end = sse.next_event(STEP).await.json();
    assert_eq!(err_code(&end), -32603, "{end}");
    let m = tg.metrics_text().await;
    let refused = metric(
        &m,
        "taskgate_bridge_input_refused_total",
        &[("reason", "client_error")],
    );
    assert_eq!(refused, 1.0, "{m}");
}

/// taskgate (the real binary, `drain_timeout_ms`) in front of a sampling task server whose
/// `tasks/cancel` answers take `cancel_delay`: a bridged task asks for sampling, the client
/// answers with an error (202 at once; the task's cancel runs in the background, its
/// `tasks/cancel` in flight) and closes its `tasks/result` stream, and taskgate gets SIGTERM.
/// Returns the upstream, taskgate, its directory (the store at `store`) and the task's id.
async fn sigterm_during_a_background_cancel(
    cancel_delay: std::time::Duration,
    drain_timeout_ms: u64,
) -> (Upstream, TaskgateProcess, tempfile::TempDir, String) {
    let (up, state) = sampling_task_server().await;
    state.lock().unwrap().cancel_delay = cancel_delay;
    let dir = tempfile::tempdir().unwrap();
    // Keep-alives 50 ms apart: the stream the client closes below is seen gone at once, so
    // only the cancel is left for the drain.
    let cfg = TgConfig::new(&up.url())
        .gateway(&format!("drain_timeout_ms = {drain_timeout_ms}"))
        .gateway("sse_keepalive_ms = 50")
        .write_for_binary(dir.path());
    let (p, gw, _) = spawn_binary(&cfg);
    let c = client_with(
        &format!("http://{gw}/mcp"),
        json!({"sampling": {}, "tasks": {}}),
    )
    .await;
    let t = create(&c, 2).await;
    set(&state, &t, "sampling");
    let (mut sse, _status) = c.input_stream("3", &t).await;
    let ask = sse.next_event(STEP).await.json();
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    let refusal = json!({"jsonrpc": "2.0", "id": ask["id"],
        "error": {"code": -1, "message": "User rejected sampling request"}});
    assert_eq!(c.send(refusal.to_string()).await.status(), 202);
    assert!(
        up.wait_for_method("tasks/cancel", 1, STEP).await,
        "the background cancel is in flight"
    );
    drop(sse);
    p.sigterm();
    (up, p, dir, t)
}

/// A background cancel (the one a client's error answer to a relayed `sampling/createMessage`
/// causes) still in flight when taskgate is told to stop reaches its end before the process
/// exits: the drain (`gateway.drain_timeout_ms`) waits for it as for a request in flight, so
/// the upstream's acknowledgement is read and the task recorded `cancelled`. Before: it was
/// dropped with its serving thread's runtime at exit (the upstream took 2 s to answer, the
/// process was gone in less), and the store kept the task `input_required`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_cancel_in_flight_at_sigterm_ends_before_the_exit() {
    let (up, mut p, dir, t) =
        sigterm_during_a_background_cancel(std::time::Duration::from_secs(2), 20_000).await;
    let status = blocking(|| p.wait_exit(STEP)).expect("exit within 10 s of SIGTERM");
    assert_eq!(status.code(), Some(0), "stderr: {}", p.stderr());
    let store = dir.path().join("store");
    let records = records_in_store(store.to_str().unwrap());
    assert_eq!(
        records,
        vec![(t, "cancelled".to_string())],
        "the cancel's acknowledgement was read before the exit; stderr: {}",
        p.stderr()
    );
    assert_eq!(count(&up, "tasks/cancel"), 1);
}

/// The drain's deadline bounds that wait: a cancel the upstream does not answer within
/// `drain_timeout_ms` is dropped at it, and the log says how many were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_cancel_past_the_drain_is_dropped_and_logged() {
    let started = std::time::Instant::now();
    let (_up, mut p, _dir, _t) =
        sigterm_during_a_background_cancel(std::time::Duration::from_secs(30), 300).await;
    let status = blocking(|| p.wait_exit(STEP)).expect("exit within 10 s of SIGTERM");
    assert_eq!(status.code(), Some(0), "stderr: {}", p.stderr());
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let stderr = p.stderr();
    assert!(
        stderr.contains("background cancels still running")
            && stderr.contains("background_cancels=1"),
        "{stderr}"
    );
}

/// A client that did not declare `capabilities.elicitation` gets a clear error from
/// `tasks/result`, and the task is cancelled upstream once.
#[tokio::test]
async fn input_required_without_the_capability_cancels_the_task() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    set(&state, &t, "input_required");
    let res = c.result("3", &t).await;
    assert_eq!(err_code(&res), -32603, "{res}");
    assert!(err_message(&res).contains("elicitation/create"), "{res}");
    assert_eq!(count(&up, "tasks/cancel"), 1);
    assert_eq!(tg.record(&t).unwrap().status, TaskStatus::Cancelled);
}

/// A call that asked for a task and was run plainly by the server is a task already
/// `completed` for the 2025 client: recorded with its result; tasks/get, tasks/result and
/// tasks/list answer from the record, without the upstream.
#[tokio::test]
async fn a_plain_answer_to_a_task_call_is_a_completed_task() {
    let (up, _) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let v = c.rpc(create_body(2, "plain_tool")).await;
    assert_eq!(v["result"]["task"]["status"], "completed", "{v}");
    let t = v["result"]["task"]["taskId"].as_str().unwrap().to_string();
    assert_eq!(tg.record(&t).unwrap().origin, Origin::Bridged);
    let got = c.get("3", &t).await;
    assert_eq!(got["result"]["status"], "completed", "{got}");
    // The ttl the creation answer named (the record's, capped), not `null` ("kept for ever").
    assert_eq!(got["result"]["ttl"], v["result"]["task"]["ttl"], "{got}");
    assert!(got["result"]["ttl"].is_u64(), "{got}");
    let res = c.result("4", &t).await;
    assert_eq!(res["result"]["content"][0]["text"], "plain", "{res}");
    assert_eq!(res["result"]["_meta"][RELATED]["taskId"], json!(t), "{res}");
    let list = c.list("5", None).await;
    assert!(list.to_string().contains(&t), "{list}");
    let cancel = c.cancel("6", &t).await;
    assert_eq!(err_code(&cancel), -32602, "{cancel}");
    assert_eq!(count(&up, "tasks/get") + count(&up, "tasks/cancel"), 0);
}

/// Hostile 2026 answers never panic the gateway: a CreateTaskResult without a string taskId is
/// `-32603` and records nothing; a `tasks/get` answer that is not an object ends a bridged
/// `tasks/result` with `-32603`; taskgate keeps serving.
#[tokio::test]
async fn malformed_upstream_answers_are_errors_not_panics() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let v = c.rpc(create_body(2, "bad_task")).await;
    assert_eq!(err_code(&v), -32603, "{v}");
    let t = create(&c, 3).await;
    set(&state, &t, "garbage");
    let res = c.result("4", &t).await;
    assert_eq!(err_code(&res), -32603, "{res}");
    set(&state, &t, "completed");
    let res = c.result("5", &t).await;
    assert_eq!(res["result"]["_meta"][RELATED]["taskId"], json!(t), "{res}");
}

/// A 2026 server that answers a bridged task call with the 2025-11-25 nested shape
/// (`{"task": {"taskId": …}}`, no `resultType`) started a task no one could follow: the 2025
/// client gets `-32603` "malformed CreateTaskResult" and the named task is cancelled upstream
/// once. Before: the answer was taken for a plain result, the client got a task already
/// `completed` whose result was the upstream's task object, and the upstream task ran on,
/// never cancelled.
#[tokio::test]
async fn a_2025_shaped_creation_from_a_2026_server_is_refused_and_cancelled() {
    let (up, _) = scripted(|req, v, _| {
        (v["method"] == "tools/call" && v["params"]["name"] == "nested_task").then(|| {
            let task = json!({"task": {"taskId": "nested-1", "status": "working",
                "createdAt": "2026-12-07T00:00:00Z", "lastUpdatedAt": "2026-12-07T00:00:00Z",
                "ttl": 60000, "pollInterval": 100}});
            ScriptedResponse::json(rpc_result(&req.rpc_id_json(), &task.to_string()))
        })
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let v = c.rpc(create_body(2, "nested_task")).await;
    assert_eq!(v["error"]["code"], -32603, "{v}");
    assert!(
        up.wait_for_method("tasks/cancel", 1, std::time::Duration::from_secs(5))
            .await,
        "the task the upstream named is cancelled there"
    );
    let cancel = up.received("tasks/cancel").pop().unwrap();
    assert_eq!(cancel.json()["params"]["taskId"], "nested-1");
    let (_, list) = tg.admin("/admin/tasks").await;
    assert_eq!(list["tasks"].as_array().map(Vec::len), Some(0), "{list}");
}

/// A plain answer to a bridged task call that carries a top-level `task` object of its own
/// (`content` too: a `CallToolResult`, not the 2025-11-25 nested `CreateTaskResult`) is a
/// plain answer: the 2025 client gets a task already `completed` whose result is that answer,
/// and nothing named in it is cancelled upstream. Broken by c6a4e51: `-32603` "malformed
/// CreateTaskResult" and a `tasks/cancel` of `todo-1` sent upstream.
#[tokio::test]
async fn a_plain_answer_with_a_task_field_is_a_completed_task() {
    let (up, _) = scripted(|req, v, _| {
        (v["method"] == "tools/call" && v["params"]["name"] == "task_field").then(|| {
            let plain = json!({"content": [{"type": "text", "text": "filed"}],
                "task": {"taskId": "todo-1", "title": "buy milk"}});
            ScriptedResponse::json(rpc_result(&req.rpc_id_json(), &plain.to_string()))
        })
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let v = c.rpc(create_body(2, "task_field")).await;
    assert_eq!(v["result"]["task"]["status"], "completed", "{v}");
    let t = v["result"]["task"]["taskId"].as_str().unwrap().to_string();
    let res = c.result("3", &t).await;
    assert_eq!(res["result"]["content"][0]["text"], "filed", "{res}");
    assert_eq!(res["result"]["task"]["taskId"], "todo-1", "{res}");
    assert!(
        !up.wait_for_method("tasks/cancel", 1, std::time::Duration::from_millis(500))
            .await,
        "nothing is cancelled upstream"
    );
}

/// Tester 3 F7: invalid fields of a 2026 server's `CreateTaskResult` are not passed to the 2025
/// client, whose SDK schema would reject the whole result. A `pollIntervalMs: -1` is dropped
/// (`pollInterval` is optional in a 2025 `Task`), a `createdAt` or `lastUpdatedAt` that is not
/// an RFC 3339 time is shown as taskgate's clock, in the `CreateTaskResult` and in `tasks/get`
/// alike (one normalisation). A status that is none of the five refuses the creation as
/// malformed (`-32603`, as a missing one is): taskgate cannot tell what such a task is doing,
/// and the task it named is cancelled upstream, so it holds no slot of its owner.
#[tokio::test]
async fn invalid_fields_of_a_creation_are_not_passed_to_a_2025_client() {
    const AT: &str = "2026-12-07T00:00:00Z";
    let (up, _) = scripted(|req, v, _| {
        let method = v["method"].as_str()?;
        let flat = |id: &str, status: &str| {
            json!({"resultType": "task", "taskId": id, "status": status, "createdAt": AT,
                "lastUpdatedAt": AT, "ttlMs": 60000, "pollIntervalMs": 100})
        };
        let answer = match (
            method,
            v["params"]["name"].as_str(),
            v["params"]["taskId"].as_str(),
        ) {
            ("tools/call", Some("odd_fields"), _) | ("tasks/get", _, Some("odd-fields")) => {
                let mut t = flat("odd-fields", "working");
                t["pollIntervalMs"] = json!(-1);
                t["createdAt"] = json!("yesterday");
                t["lastUpdatedAt"] = json!(12);
                if method == "tasks/get" {
                    t["resultType"] = json!("complete");
                }
                t
            }
            ("tools/call", Some("odd_status"), _) => flat("exploded-1", "exploded"),
            ("tasks/get", _, Some("exploded-1")) => {
                let mut t = flat("exploded-1", "working");
                t["resultType"] = json!("complete");
                t
            }
            ("tasks/cancel", _, Some("exploded-1")) => json!({"resultType": "complete"}),
            _ => return None,
        };
        Some(ScriptedResponse::json(rpc_result(
            &req.rpc_id_json(),
            &answer.to_string(),
        )))
    })
    .await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_live_tasks_per_owner = 1")
        .start()
        .await;
    let (c, _) = legacy_client(&tg).await;
    let valid_task = |task: &Value, what: &str| {
        for key in ["createdAt", "lastUpdatedAt"] {
            let at = task[key].as_str().unwrap_or_default();
            assert!(
                taskgate::mcp::task::parse_rfc3339_ms(at).is_some(),
                "{what}: {key} {task}"
            );
        }
        assert!(
            task.get("pollInterval").is_none_or(Value::is_u64),
            "{what}: pollInterval {task}"
        );
        assert_eq!(task["status"], "working", "{what}: {task}");
    };

    let v = c.rpc(create_body(2, "odd_status")).await;
    assert_eq!(v["error"]["code"], -32603, "{v}");
    assert!(err_message(&v).contains("status"), "{v}");
    assert!(
        up.wait_for_method("tasks/cancel", 1, STEP).await,
        "the task it named is cancelled upstream"
    );
    let cancel = up.received("tasks/cancel").pop().unwrap();
    assert_eq!(cancel.json()["params"]["taskId"], "exploded-1");
    let freed = eventually(STEP, || async {
        let live = tg
            .record("exploded-1")
            .is_some_and(|r| !r.status.is_terminal());
        (!live).then_some(())
    })
    .await;
    assert!(freed.is_some(), "the refused task holds no slot");

    let v = c.rpc(create_body(3, "odd_fields")).await;
    valid_task(&v["result"]["task"], "CreateTaskResult");
    let v = c.get("4", "odd-fields").await;
    valid_task(&v["result"], "tasks/get");
    // The record holds valid times too: `tasks/list` is made of it.
    let v = c.list("5", None).await;
    let listed = v["result"]["tasks"].as_array().cloned().unwrap_or_default();
    let task = listed.iter().find(|t| t["taskId"] == "odd-fields");
    valid_task(task.unwrap_or(&Value::Null), "tasks/list");
    // One time, the record's, in every answer (not taskgate's clock at each).
    let got = c.get("6", "odd-fields").await;
    assert_eq!(
        got["result"]["createdAt"],
        task.unwrap_or(&Value::Null)["createdAt"],
        "{got}"
    );
}

/// An upstream that never answers `server/discover` is not bridged while it stays unknown:
/// after `DISCOVER_DEADLINE` the client's `initialize` is answered (without
/// `capabilities.tasks`) instead of waiting for the upstream timeout, and the upstream is not
/// asked again within `UNANSWERED_RETRY`.
#[tokio::test]
async fn an_unanswered_discover_bridges_nothing_for_a_while() {
    let state: Shared = Default::default();
    let modern = modern_handler(state);
    let up = Upstream::start(move |req: &RecordedRequest| {
        if req.rpc_method().as_deref() == Some("server/discover") {
            return ScriptedResponse::hang();
        }
        modern(req)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let started = std::time::Instant::now();
    let (_c, init) = legacy_client(&tg).await;
    assert!(
        init["result"]["capabilities"].get("tasks").is_none(),
        "{init}"
    );
    assert!(started.elapsed() < taskgate::layers::bridge::DISCOVER_DEADLINE * 2);
    let (_c2, _) = legacy_client(&tg).await;
    assert_eq!(count(&up, "server/discover"), 1);
}

// ---------------------------------------------------------------------------------------------
// Robustness: deadlines, polling, ttl, input bounds, cancel single-flight, roots, error codes
// ---------------------------------------------------------------------------------------------

/// The scripted 2026 server of `modern_server`, with `script` answering first: what it returns
/// (`Some`) is the answer, otherwise the ordinary handler's.
async fn scripted(
    script: impl Fn(&RecordedRequest, &Value, &Shared) -> Option<ScriptedResponse>
        + Send
        + Sync
        + 'static,
) -> (Upstream, Shared) {
    let state: Shared = Default::default();
    let modern = modern_handler(state.clone());
    let st = state.clone();
    let up = Upstream::start(move |req: &RecordedRequest| {
        let v = serde_json::from_slice::<Value>(&req.body).unwrap_or(Value::Null);
        script(req, &v, &st).unwrap_or_else(|| modern(req))
    })
    .await;
    (up, state)
}

/// A 2026 server whose tasks set to `"sampling"` ask for one `sampling/createMessage` (key
/// `s1`) as their input.
async fn sampling_task_server() -> (Upstream, Shared) {
    tasks_get_answered(std::time::Duration::ZERO, |task_id, state| {
        if state.lock().unwrap().tasks.get(task_id)? != "sampling" {
            return None;
        }
        let mut task = detailed(task_id, "input_required");
        task["inputRequests"] = json!({"s1": {"method": "sampling/createMessage", "params": {
            "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
            "maxTokens": 10}}});
        Some(task)
    })
    .await
}

/// A scripted 2026 server (see [`scripted`]) whose answer to a `tasks/get` is the task `answer`
/// gives for its id (it sees the server's state), sent after `delay`; a `tasks/get` it gives
/// none for, and every other request, is the stateful server's.
async fn tasks_get_answered(
    delay: std::time::Duration,
    answer: impl Fn(&str, &Shared) -> Option<Value> + Send + Sync + 'static,
) -> (Upstream, Shared) {
    scripted(move |req, v, state| {
        if v["method"] != "tasks/get" {
            return None;
        }
        let task = answer(v["params"]["taskId"].as_str()?, state)?;
        let answer = ScriptedResponse::json(rpc_result(&req.rpc_id_json(), &task.to_string()));
        Some(if delay.is_zero() {
            answer
        } else {
            answer.after(delay)
        })
    })
    .await
}

fn status_of(state: &Shared, task_id: &str) -> Option<String> {
    state.lock().unwrap().tasks.get(task_id).cloned()
}

/// An SSE answer that opens and never carries the answer.
fn stalled() -> ScriptedResponse {
    ScriptedResponse::sse(vec![ev().id("1").data("").into(), SseStep::HoldOpen])
}

fn a_client(c: &Client) -> Client {
    Client {
        url: c.url.clone(),
        token: None,
        session: c.session.clone(),
    }
}

/// A 2026 server whose `tasks/get` names no status the protocol has (`"done"`, a number): the
/// blocking `tasks/result` of a 2025 client ends at once with `-32603` saying so, instead of
/// polling the same answer until the task's ttl ends (up to `tasks.max_ttl_ms`, a day by
/// default: before, the client hung that long).
#[tokio::test]
async fn tasks_result_ends_on_a_status_the_protocol_has_not() {
    let (up, state) = tasks_get_answered(std::time::Duration::ZERO, |task_id, state| {
        let odd = state.lock().unwrap().tasks.get(task_id).cloned()?;
        let status = match odd.as_str() {
            "odd_text" => json!("done"),
            "odd_number" => json!(5),
            _ => return None,
        };
        let mut task = detailed(task_id, "working");
        task["status"] = status;
        Some(task)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    for (n, odd) in [(10u64, "odd_text"), (20, "odd_number")] {
        let t = create(&c, n).await;
        set(&state, &t, odd);
        let res = tokio::time::timeout(STEP, c.result(&(n + 1).to_string(), &t)).await;
        let res = res.expect("tasks/result answered");
        assert_eq!(res["error"]["code"], -32603, "{odd}: {res}");
        assert!(err_message(&res).contains("status"), "{odd}: {res}");
    }
}

/// Tester 3 F8: a 2026 server whose `tasks/get` says `input_required` with a malformed
/// `inputRequests` (a string, none at all, an entry that is not an object, one without a
/// `method`): the blocking `tasks/result` of a 2025 client ends at once with `-32603` naming
/// what was malformed, after one poll, as for a status the protocol has not. The task is not
/// cancelled (the upstream's answer is what is wrong, not the client's capabilities) and its
/// record stays. Before: the string polled every `pollIntervalMs` until the task's ttl ended
/// (about 600 polls in 60 s, then `-32602` expired, the record gone), and the entry without a
/// method was taken for an unsupported one and the task cancelled.
#[tokio::test]
async fn tasks_result_ends_on_malformed_input_requests() {
    let (up, state) = tasks_get_answered(std::time::Duration::ZERO, |task_id, state| {
        let odd = state.lock().unwrap().tasks.get(task_id).cloned()?;
        let requests = match odd.as_str() {
            "input_string" => Some(json!("not an object")),
            "input_missing" => None,
            "input_entry_string" => Some(json!({"k1": "elicit please"})),
            "input_entry_no_method" => Some(json!({"k1": {"params": {}}})),
            _ => return None,
        };
        let mut task = detailed(task_id, "input_required");
        match requests {
            Some(r) => task["inputRequests"] = r,
            None => {
                task.as_object_mut().unwrap().remove("inputRequests");
            }
        }
        Some(task)
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({"elicitation": {}, "tasks": {}})).await;
    let cases = [
        (10u64, "input_string", "string"),
        (20, "input_missing", "no inputRequests"),
        (30, "input_entry_string", "k1"),
        (40, "input_entry_no_method", "method"),
    ];
    for (n, odd, named) in cases {
        let t = create(&c, n).await;
        set(&state, &t, odd);
        let polls = up.received("tasks/get").len();
        let res = tokio::time::timeout(STEP, c.result(&(n + 1).to_string(), &t)).await;
        let res =
            res.unwrap_or_else(|_| panic!("{odd}: tasks/result not answered within {STEP:?}"));
        assert_eq!(res["error"]["code"], -32603, "{odd}: {res}");
        let message = err_message(&res);
        assert!(message.contains("inputRequests"), "{odd}: {res}");
        assert!(message.contains(named), "{odd}: {res}");
        assert_eq!(up.received("tasks/get").len(), polls + 1, "{odd}: one poll");
        let record = tg.record(&t).expect("the record stays");
        assert_ne!(record.status, TaskStatus::Cancelled, "{odd}");
    }
    assert_eq!(up.received("tasks/cancel").len(), 0, "nothing cancelled");
}

/// An upstream that answers taskgate's own requests (the bridged `tools/call`, `tasks/get`, the
/// polls of `tasks/result`) with an SSE stream that never carries the answer: each exchange ends
/// at the upstream's `timeout_ms` with the upstream timeout's `-32603`, HTTP 200.
#[tokio::test]
async fn bridged_exchanges_end_at_the_upstream_timeout() {
    let (up, _) = scripted(|_, v, _| {
        let stall = match v["method"].as_str() {
            Some("tasks/get") => true,
            Some("tools/call") => v["params"]["name"] == "stalled",
            _ => false,
        };
        stall.then(stalled)
    })
    .await;
    let cfg = TgConfig::new(&up.url());
    let tg = Tg::start(|store| cfg.to_toml(store) + "timeout_ms = 1000\n").await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    let timed_out = |what: &str, v: Value| {
        assert_eq!(err_code(&v), -32603, "{what}: {v}");
        assert!(
            err_message(&v).contains("did not answer within 1000 ms"),
            "{what}: {v}"
        );
    };
    let got = tokio::time::timeout(STEP, c.get("3", &t)).await;
    timed_out("tasks/get", got.expect("tasks/get answered"));
    let res = tokio::time::timeout(STEP, c.result("4", &t)).await;
    timed_out("tasks/result", res.expect("tasks/result answered"));
    let call = tokio::time::timeout(STEP, c.rpc(create_body(5, "stalled"))).await;
    timed_out("tools/call", call.expect("tools/call answered"));
}

/// An upstream that says `pollIntervalMs: 0` is not polled flat out: the waits back off from
/// `MIN_POLL` (100 ms), doubling (the old follower polled every 20 ms).
#[tokio::test]
async fn a_zero_poll_interval_backs_off() {
    let (up, _) = scripted(|req, v, _| {
        (v["method"] == "tasks/get").then(|| {
            let mut d = detailed(v["params"]["taskId"].as_str().unwrap_or(""), "working");
            d["pollIntervalMs"] = json!(0);
            ScriptedResponse::json(rpc_result(&req.rpc_id_json(), &d.to_string()))
        })
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    let started = std::time::Instant::now();
    let body = rpc("3", "tasks/result", &json!({"taskId": t}).to_string());
    let _open = c.send(body).await;
    assert!(up.wait_for_method("tasks/get", 5, STEP).await);
    // Four waits between five polls: at least 100 + 200 + 400 + 800 ms.
    let elapsed = started.elapsed();
    assert!(
        elapsed >= std::time::Duration::from_millis(1400),
        "{elapsed:?}"
    );
}

/// A bridged `tasks/result` stops following a task whose ttl (from its `CreateTaskResult`) has
/// elapsed: `-32602` (2025-11-25: an expired task), not an endless wait.
#[tokio::test]
async fn tasks_result_ends_when_the_ttl_elapsed() {
    let (up, _) = scripted(|req, v, st| {
        (v["method"] == "tools/call" && v["params"]["name"] == "short_ttl").then(|| {
            let mut s = st.lock().unwrap();
            s.next += 1;
            let tid = format!("ttl-{}", s.next);
            s.tasks.insert(tid.clone(), "working".into());
            let now = format_rfc3339_ms(now_ms());
            let created = json!({"resultType": "task", "taskId": tid, "status": "working",
                "createdAt": now, "lastUpdatedAt": now, "ttlMs": 2000, "pollIntervalMs": 50});
            ScriptedResponse::json(rpc_result(&req.rpc_id_json(), &created.to_string()))
        })
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let v = c.rpc(create_body(2, "short_ttl")).await;
    let t = v["result"]["task"]["taskId"].as_str().unwrap().to_string();
    assert_eq!(tg.record(&t).unwrap().ttl_ms, Some(2000), "{v}");
    let res = tokio::time::timeout(STEP, c.result("3", &t)).await;
    let res = res.expect("tasks/result answered once the ttl elapsed");
    assert_eq!(err_code(&res), -32602, "{res}");
    assert!(err_message(&res).contains("expired"), "{res}");
}

/// A client that closes its bridged `tasks/result` stream stops the follower: the poll in
/// flight is abandoned (long before the upstream timeout) and no other follows.
#[tokio::test]
async fn a_client_that_goes_away_stops_the_follower() {
    let polls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = polls.clone();
    let (up, _) = scripted(move |_, v, _| {
        let second = v["method"] == "tasks/get"
            && seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 1;
        second.then(ScriptedResponse::hang)
    })
    .await;
    let cfg = TgConfig::new(&up.url()).gateway("sse_keepalive_ms = 50");
    let tg = cfg.start().await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    let open = c
        .send(rpc("3", "tasks/result", &json!({"taskId": t}).to_string()))
        .await;
    assert!(up.wait_for_method("tasks/get", 2, STEP).await, "following");
    drop(open);
    assert!(
        up.wait_for_hangs_abandoned(1, STEP).await,
        "the poll in flight was dropped with the client's stream"
    );
    assert_eq!(count(&up, "tasks/get"), 2, "no poll after the client left");
}

/// A task whose `inputRequests` would take it past `MAX_KEYS_PER_TASK` keys: none of them is
/// asked, `tasks/result` ends with `-32603` saying why, the task is cancelled upstream once, and
/// the refusal is counted.
#[tokio::test]
async fn too_many_input_keys_end_the_result_and_cancel_the_task() {
    let (up, state) = tasks_get_answered(std::time::Duration::ZERO, |t, st| {
        let flood = st
            .lock()
            .unwrap()
            .tasks
            .get(t)
            .is_some_and(|s| s == "flood");
        flood.then(|| {
            let mut d = detailed(t, "input_required");
            let one = d["inputRequests"]["name"].clone();
            let max = taskgate::layers::relay::input::MAX_KEYS_PER_TASK;
            d["inputRequests"] = (0..=max).map(|n| (format!("k{n}"), one.clone())).collect();
            d
        })
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({"elicitation": {}, "tasks": {}})).await;
    let t = create(&c, 2).await;
    set(&state, &t, "flood");
    let resp = c
        .send(rpc("3", "tasks/result", &json!({"taskId": t}).to_string()))
        .await;
    let mut sse = resp.sse();
    let answer = loop {
        let v = sse.next_event(STEP).await.json();
        assert_ne!(v["method"], "elicitation/create", "nothing asked: {v}");
        if v.get("id").is_some() {
            break v;
        }
    };
    assert_eq!(err_code(&answer), -32603, "{answer}");
    assert!(
        err_message(&answer).contains("more than taskgate relays"),
        "{answer}"
    );
    assert_eq!(count(&up, "tasks/cancel"), 1);
    assert_eq!(status_of(&state, &t).as_deref(), Some("cancelled"));
    assert_eq!(tg.record(&t).unwrap().status, TaskStatus::Cancelled);
    let text = tg.metrics_text().await;
    let refused = metric(
        &text,
        "taskgate_bridge_input_refused_total",
        &[("upstream", "default"), ("reason", "too_many_keys")],
    );
    assert_eq!(refused, 1.0, "{text}");
}

/// taskgate's own cancel (its client cannot answer an input request) goes through the `cancel`
/// layer's single-flight: a client `tasks/cancel` racing it joins it, so the upstream gets one
/// `tasks/cancel`; both answers, the record and the audit facts agree.
#[tokio::test]
async fn the_bridge_cancel_and_a_client_cancel_make_one_upstream_cancel() {
    let (up, state) = modern_server().await;
    state.lock().unwrap().cancel_delay = std::time::Duration::from_millis(1500);
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    set(&state, &t, "input_required");
    let result = {
        let (c, t) = (a_client(&c), t.clone());
        tokio::spawn(async move { c.result("3", &t).await })
    };
    assert!(
        up.wait_for_method("tasks/cancel", 1, STEP).await,
        "taskgate cancels the task"
    );
    let cancel = c.cancel("4", &t).await;
    assert_eq!(cancel["result"]["status"], "cancelled", "{cancel}");
    let res = result.await.unwrap();
    assert_eq!(err_code(&res), -32603, "{res}");
    assert_eq!(count(&up, "tasks/cancel"), 1, "one upstream tasks/cancel");
    let r = tg.record(&t).unwrap();
    assert_eq!(r.status, TaskStatus::Cancelled);
    assert!(r.cancel_requested_at.is_some() && r.cancelled_at.is_some());
    let audit = tg.registry.store().audit_for("default", &t).unwrap();
    let requested = audit
        .iter()
        .filter(|e| e.event == "cancel_requested")
        .count();
    assert_eq!(requested, 1, "{audit:?}");
}

/// A `roots/list` input request goes to a client that declared `capabilities.roots` on its
/// `tasks/result` stream, and its answer goes upstream as `tasks/update`; a client without the
/// capability gets the clear error and the task is cancelled once.
#[tokio::test]
async fn roots_list_input_is_relayed_to_a_client_with_roots() {
    let (up, state) = tasks_get_answered(std::time::Duration::ZERO, |t, st| {
        let roots = st
            .lock()
            .unwrap()
            .tasks
            .get(t)
            .is_some_and(|s| s == "roots");
        roots.then(|| {
            let mut d = detailed(t, "input_required");
            d["inputRequests"] = json!({"where": {"method": "roots/list", "params": {}}});
            d
        })
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let c = client_with(&tg.mcp_url(), json!({"roots": {}, "tasks": {}})).await;
    let t = create(&c, 2).await;
    set(&state, &t, "roots");
    let resp = c
        .send(rpc("3", "tasks/result", &json!({"taskId": t}).to_string()))
        .await;
    let mut sse = resp.sse();
    let ask = loop {
        let v = sse.next_event(STEP).await.json();
        assert!(v.get("error").is_none(), "{v}");
        if v["method"] == "roots/list" {
            break v;
        }
    };
    assert_eq!(ask["params"]["_meta"][RELATED]["taskId"], json!(t), "{ask}");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"roots": [{"uri": "file:///work", "name": "work"}]}});
    assert_eq!(c.send(answer.to_string()).await.status(), 202);
    assert!(up.wait_for_method("tasks/update", 1, STEP).await);
    let update = up.received("tasks/update").pop().unwrap().json();
    assert_eq!(
        update["params"]["inputResponses"]["where"]["roots"][0]["uri"], "file:///work",
        "{update}"
    );
    set(&state, &t, "completed");
    let done = sse.next_event(STEP).await.json();
    assert_eq!(
        done["result"]["_meta"][RELATED]["taskId"],
        json!(t),
        "{done}"
    );
    assert_eq!(count(&up, "tasks/cancel"), 0);

    let (plain, _) = legacy_client(&tg).await;
    let u = create(&plain, 4).await;
    set(&state, &u, "roots");
    let res = plain.result("5", &u).await;
    assert_eq!(err_code(&res), -32603, "{res}");
    assert!(err_message(&res).contains("roots/list"), "{res}");
    assert_eq!(count(&up, "tasks/cancel"), 1);
}

/// 2026-only error codes reach a 2025 client as what 2025-11-25 prescribes, with the upstream's
/// message, HTTP 200: `-32021` for a task-only tool called plainly is `-32601`; `-32020` is
/// `-32600`; `-32022` is `-32602` with its `data`.
#[tokio::test]
async fn modern_error_codes_are_mapped_for_2025_clients() {
    let (up, _) = scripted(|req, v, _| {
        let (code, message, data) = match v["params"]["name"].as_str() {
            Some("mismatch") => (-32020, "Header mismatch: Mcp-Name", json!(null)),
            Some("old_version") => (
                -32022,
                "Unsupported protocol version",
                json!({"supported": [MODERN], "requested": "2025-11-25"}),
            ),
            _ => return None,
        };
        let mut error = json!({"code": code, "message": message});
        if !data.is_null() {
            error["data"] = data;
        }
        let body = json!({"jsonrpc": "2.0", "id": req.rpc_id(), "error": error});
        Some(ScriptedResponse::status(
            400,
            Some("application/json"),
            body.to_string(),
        ))
    })
    .await;
    let tg = TgConfig::new(&up.url()).start().await;
    let (c, _) = legacy_client(&tg).await;
    let plain = c.send(call_body("2", "task_only", None)).await;
    assert_eq!(plain.status(), 200);
    let plain = plain.json().await;
    assert_eq!(err_code(&plain), -32601, "{plain}");
    assert_eq!(err_message(&plain), "Missing required client capability");
    assert!(
        plain["error"]["data"]["requiredCapabilities"]["extensions"][EXT].is_object(),
        "{plain}"
    );
    let v = c.rpc(create_body(3, "mismatch")).await;
    assert_eq!(err_code(&v), -32600, "{v}");
    assert_eq!(err_message(&v), "Header mismatch: Mcp-Name");
    let v = c.rpc(create_body(4, "old_version")).await;
    assert_eq!(err_code(&v), -32602, "{v}");
    assert_eq!(v["error"]["data"]["supported"][0], MODERN, "{v}");
}

/// 2026-07-28 (break-tasks H2b): once a task's cancel was acknowledged upstream, a 2025 client's
/// cancel of it through the bridge does not send a second `tasks/cancel`: the upstream keeps the
/// task `working` after the ack (the spec allows it), and the 2025 client gets the ack as the
/// bridge answers it, the task `cancelled`. On the old code the upstream got a second cancel.
#[tokio::test]
async fn a_2025_cancel_after_a_2026_ack_is_not_sent_again() {
    let (up, state) = modern_server().await;
    // Acknowledged, and still `working` long after (2026 §1.6: cooperative).
    state.lock().unwrap().cancel_after = Some(std::time::Duration::from_secs(3600));
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .start()
        .await;
    let url = tg.mcp_url();
    let mut c = tg.client().with_token("tok-a");
    c.initialize().await;
    let t = create(&c, 10).await;
    let (status, modern) = task_call(&url, Some("tok-a"), 20, "tasks/cancel", &t).await;
    assert_eq!(status, 200, "{modern}");
    assert_eq!(
        modern["result"],
        json!({"resultType": "complete"}),
        "{modern}"
    );
    assert_eq!(count(&up, "tasks/cancel"), 1);
    let legacy = c.cancel("30", &t).await;
    assert_eq!(
        (&legacy["result"]["taskId"], &legacy["result"]["status"]),
        (&json!(t), &json!("cancelled")),
        "the 2025 CancelTaskResult: {legacy}"
    );
    assert_eq!(count(&up, "tasks/cancel"), 1, "one upstream cancel");
    assert_eq!(tg.record(&t).unwrap().status, TaskStatus::Cancelled);
}

/// Break-tasks M1: a 2025 client (through the bridge) and a 2026 client cancelling one task at
/// the same time share one upstream `tasks/cancel`, and each gets its own era's answer: the
/// 2025 client the cancelled `Task` (a `CancelTaskResult`), the 2026 client the ack, whichever
/// went first. Before, the second caller got the first one's bytes: a 2025 client
/// `{"resultType":"complete"}`, a 2026 client a 2025 `Task`.
#[tokio::test]
async fn cancels_of_both_eras_joined_in_one_flight_get_their_own_eras_answer() {
    let (up, state) = modern_server().await;
    state.lock().unwrap().cancel_delay = std::time::Duration::from_millis(400);
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .start()
        .await;
    let url = tg.mcp_url();
    let mut c = tg.client().with_token("tok-a");
    c.initialize().await;
    let ack = json!({"resultType": "complete"});
    for (round, modern_first) in [(0u64, true), (1, false)] {
        let t = create(&c, 10 + round).await;
        let sent = round as usize + 1;
        let (legacy, modern) = if modern_first {
            let (url, t2) = (url.clone(), t.clone());
            let modern = tokio::spawn(async move {
                task_call(&url, Some("tok-a"), 20 + round, "tasks/cancel", &t2).await
            });
            assert!(
                up.wait_for_method("tasks/cancel", sent, std::time::Duration::from_secs(5))
                    .await
            );
            let legacy = c.cancel(&(30 + round).to_string(), &t).await;
            (legacy, modern.await.unwrap())
        } else {
            let (c2, t2) = (c.clone(), t.clone());
            let legacy =
                tokio::spawn(async move { c2.cancel(&(30 + round).to_string(), &t2).await });
            assert!(
                up.wait_for_method("tasks/cancel", sent, std::time::Duration::from_secs(5))
                    .await
            );
            let modern = task_call(&url, Some("tok-a"), 20 + round, "tasks/cancel", &t).await;
            (legacy.await.unwrap(), modern)
        };
        let (status, modern) = modern;
        assert_eq!(status, 200, "round {round}: {modern}");
        assert_eq!(
            modern["result"], ack,
            "round {round}: the 2026 ack: {modern}"
        );
        assert_eq!(
            (&legacy["result"]["taskId"], &legacy["result"]["status"]),
            (&json!(t), &json!("cancelled")),
            "round {round}: the 2025 CancelTaskResult: {legacy}"
        );
        assert_eq!(
            count(&up, "tasks/cancel"),
            sent,
            "round {round}: one upstream cancel"
        );
        assert_eq!(
            tg.record(&t).unwrap().status,
            TaskStatus::Cancelled,
            "round {round}"
        );
    }
}

/// A 2026 client's cancel that joins a 2025 client's bridged cancel of a task the upstream
/// shows ended (the bridge's `tasks/get` finds it `completed`: nothing is sent) gets what a
/// 2026 cancel of a terminal task gets, the ack (HTTP 200; 2026-07-28 defines no error there,
/// and it is counted `acknowledged_terminal`), the 2025 client `-32602` naming `completed`.
/// Before: the 2026 client got the 2025 `-32602` (HTTP 400) while counted as acknowledged.
#[tokio::test]
async fn a_2026_cancel_joining_a_bridged_cancel_of_an_ended_task_gets_the_ack() {
    let slow: std::sync::Arc<std::sync::Mutex<Option<String>>> = Default::default();
    let which = slow.clone();
    let (up, _state) =
        tasks_get_answered(std::time::Duration::from_millis(500), move |task_id, _| {
            (which.lock().unwrap().as_deref() == Some(task_id))
                .then(|| detailed(task_id, "completed"))
        })
        .await;
    let tg = TgConfig::new(&up.url())
        .token("alice", "tok-a")
        .start()
        .await;
    let url = tg.mcp_url();
    let mut c = tg.client().with_token("tok-a");
    c.initialize().await;
    let t = create(&c, 2).await;
    *slow.lock().unwrap() = Some(t.clone());
    let gets = count(&up, "tasks/get");
    let (c2, t2) = (c.clone(), t.clone());
    let legacy = tokio::spawn(async move { c2.cancel("3", &t2).await });
    assert!(up.wait_for_method("tasks/get", gets + 1, STEP).await);
    let (status, modern) = task_call(&url, Some("tok-a"), 4, "tasks/cancel", &t).await;
    let legacy = legacy.await.unwrap();
    assert_eq!(err_code(&legacy), -32602, "{legacy}");
    assert!(err_message(&legacy).contains("completed"), "{legacy}");
    assert_eq!(
        (status, &modern["result"]),
        (200, &json!({"resultType": "complete"})),
        "the 2026 ack: {modern}"
    );
    assert_eq!(count(&up, "tasks/cancel"), 0, "nothing sent");
    let m = tg.metrics_text().await;
    let outcome = |o: &str| metric(&m, "taskgate_cancel_requests_total", &[("outcome", o)]);
    assert_eq!(outcome("acknowledged_terminal"), 1.0, "{m}");
    assert_eq!(outcome("rejected_terminal"), 1.0, "{m}");
}

/// A bridged task the upstream lost keeps the error it was failed with even when results are not
/// stored (`tasks.max_stored_result_bytes = 0`): the 2025 client's `tasks/result` gets that
/// `-32603` from the record, and nothing more goes upstream about it (review 20 #1: the error
/// was kept in a second write within the size limit, so none was kept, and the upstream's
/// `-32602` "Task not found" passed).
#[tokio::test]
async fn a_lost_bridged_task_keeps_its_error_without_stored_results() {
    let (up, state) = modern_server().await;
    let tg = TgConfig::new(&up.url())
        .tasks("max_stored_result_bytes = 0")
        .start()
        .await;
    let (c, _) = legacy_client(&tg).await;
    let t = create(&c, 2).await;
    state.lock().unwrap().tasks.remove(&t);
    let got = c.get("3", &t).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    let r = tg.record(&t).expect("record");
    assert_eq!(r.status, TaskStatus::Failed);
    assert!(r.terminal_error.is_some(), "no error kept");
    let gets = count(&up, "tasks/get");
    let res = c.result("4", &t).await;
    let again = count(&up, "tasks/get") - gets;
    assert_eq!((err_code(&res), again), (-32603, 0), "{res}");
}
