//! A call that ends while the PostgreSQL store is briefly down (break B, F2): taskgate in this
//! process on a PostgreSQL of the test's own (leases of 1.5 s polled every 100 ms, the URL
//! saying `connect_timeout=1`), the database stopped as `pg_ctl stop -m fast` does while the
//! call runs, and started again once the call has ended. Proven:
//! - a gateway task (`upstream.tasks = "gateway"`) whose held call is answered during the
//!   outage is `completed` once the database is back: `tasks/get` says so and `tasks/result`
//!   answers the call's result; its call lease is ended (not renewed for ever);
//! - a graceful stop while that final write waits: the drain waits for it, and the database
//!   back within the drain takes it before taskgate exits;
//! - an upgraded call (`[upgrade] enabled`) whose task ends during the outage: the client gets
//!   its result, and once the database is back the record is terminal, the lease ended, and the
//!   owner's live-task slot (`tasks.max_live_tasks_per_owner = 1`) free for a new task;
//! - a 2025-11-25 task the upstream runs whose `completed` passes through to the client during
//!   the outage: once the database is back, with no further request, the record is `completed`
//!   and the owner's slot free (`registry::refused`); a graceful stop meanwhile drains it.
//! - the same for a blocking `tasks/result` whose payload (the task ended) reaches the client
//!   during the outage (`Registry::apply_result_payload` keeps it as the status reports are).
//!
//! Each fails on the code before its fix (fe9c9c2; the last on ee40333): the final write was
//! tried once, the lease end too, and the lease renewed for as long as the process ran: the
//! gateway task stayed `working` (its result lost), the upgraded call's record and the
//! upstream's task `working` (their slot held) until their ttl.
//!
//! Each starts a PostgreSQL of its own (it is stopped), also under the suite's shared one.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const AUTH: &[(&str, &str)] = &[("alice", "alice-token")];

/// How long the database is given to be back and the final write to land (the retry's wait
/// is 5 s at most; a loaded 2-core machine is slow).
const RECOVERY: Duration = Duration::from_secs(30);

/// A database this test may stop (its own), or `None` (printed: skipped).
fn stoppable(test: &str) -> Option<PgCluster> {
    PgCluster::start_own(test)
}

/// taskgate in this process on `pg` (through env var `env`), one upstream `url` with
/// `upstream_lines`, `[upgrade] enabled = upgrade`, one live task per owner, a drain of 30 s.
async fn start_tg(pg: &PgCluster, env: &str, url: &str, upstream_lines: &str, upgrade: bool) -> Tg {
    let sep = if pg.url.contains('?') { '&' } else { '?' };
    std::env::set_var(env, format!("{}{sep}connect_timeout=1", pg.url));
    let auth = bearer_auth(AUTH);
    Tg::start(|_| {
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\ndrain_timeout_ms = 30000\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n\
             [store]\nbackend = \"postgres\"\nurl_env = {env:?}\npool_size = 4\n\
             lease_ms = 1500\nlease_poll_ms = 100\n\n{auth}\n\
             [tasks]\nrelease_quiet_ms = 100\nmax_live_tasks_per_owner = 1\n\n\
             [upgrade]\nenabled = {upgrade}\n\n\
             [[upstream]]\nname = \"default\"\nurl = {url:?}\n{upstream_lines}\n"
        )
    })
    .await
}

/// A database client for the assertions (once the database is up).
async fn db(pg: &PgCluster) -> tokio_postgres::Client {
    let (db, conn) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    db
}

/// The task's stored record.
async fn record(db: &tokio_postgres::Client, task_id: &str) -> Option<Value> {
    let row = db
        .query_opt(
            "SELECT record FROM taskgate_tasks WHERE task_id = $1",
            &[&task_id],
        )
        .await
        .ok()??;
    serde_json::from_str(&row.get::<_, String>(0)).ok()
}

/// How many leases the task has.
async fn leases(db: &tokio_postgres::Client, task_id: &str) -> i64 {
    db.query_one(
        "SELECT count(*) FROM taskgate_leases WHERE task_id = $1",
        &[&task_id],
    )
    .await
    .unwrap()
    .get(0)
}

/// A server without tasks: a `tools/call` answers on an SSE stream, one progress notification
/// first, then its result once `gate` opens.
fn held_call_server(gate: Gate) -> impl Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync {
    move |req| {
        if req.method == "GET" {
            return ScriptedResponse::sse(vec![SseStep::HoldOpen]);
        }
        let v = req.json();
        let id = req.rpc_id_json();
        match v["method"].as_str() {
            Some("tools/call") => {
                let token = v["params"]["_meta"]["progressToken"].to_string();
                let progress = format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{token},"progress":1,"total":2,"message":"halfway"}}}}"#
                );
                let answer = rpc_result(&id, r#"{"content":[{"type":"text","text":"done"}]}"#);
                ScriptedResponse::sse(vec![
                    ev().event("message").data(&progress).into(),
                    SseStep::Wait(gate.clone()),
                    ev().event("message").data(&answer).into(),
                ])
            }
            _ => mcp_handler(req),
        }
    }
}

/// Waits until `tg` counted more store write failures than `before` (the write refused).
async fn write_refused(tg: &Tg, before: u64) {
    let refused = eventually(STEP, || async {
        (tg.metrics.store_write_failures_total.get() > before).then_some(())
    })
    .await;
    assert!(
        refused.is_some(),
        "a store write was refused while the database was down"
    );
}

/// Waits until the task's record is `completed` (the database back, the final write landed);
/// returns it. Panics with `what` and the record as it is when it does not become so.
async fn completed_once_back(db: &tokio_postgres::Client, task: &str, what: &str) -> Value {
    let rec = eventually(RECOVERY, || async {
        let r = record(db, task).await?;
        (r["status"] == "completed").then_some(r)
    })
    .await;
    match rec {
        Some(rec) => rec,
        None => panic!("{what}: {:?}", record(db, task).await),
    }
}

/// The owner's one live-task slot (`tasks.max_live_tasks_per_owner = 1`) is free: a new task
/// of its is admitted.
async fn slot_is_free(c: &Client) {
    let v = c
        .rpc(rpc(
            "2",
            "tools/call",
            r#"{"name":"research","arguments":{},"task":{"ttl":60000}}"#,
        ))
        .await;
    assert!(
        v.pointer("/result/task/taskId").is_some(),
        "the owner's slot is free: a new task is admitted: {v}"
    );
}

/// A gateway task created on `tg` whose held call on `up` (held by `gate`) has sent its
/// progress (recorded); returns its id and the client.
async fn held_gateway_task(tg: &Tg, up: &Upstream) -> (String, Client) {
    let mut c = tg.client().with_token("alice-token");
    c.initialize().await;
    let task = c.create_held_gateway_task(up).await;
    // The progress is written before the outage: the only write during it is the final one.
    let halfway = eventually(STEP, || async {
        let v = c.get("\"g0\"", &task).await;
        (v["result"]["statusMessage"] == "halfway").then_some(())
    })
    .await;
    assert!(halfway.is_some(), "the progress is recorded");
    (task, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_task_whose_call_ends_while_the_database_is_down_completes_once_it_is_back() {
    let test =
        "a_gateway_task_whose_call_ends_while_the_database_is_down_completes_once_it_is_back";
    let Some(mut pg) = stoppable(test) else {
        return;
    };
    let gate = Gate::new();
    let up = Upstream::start(held_call_server(gate.clone())).await;
    let tg = start_tg(
        &pg,
        "TG_FINAL_WRITE_GATEWAY_DB",
        &up.url(),
        "tasks = \"gateway\"",
        false,
    )
    .await;
    let (task, c) = held_gateway_task(&tg, &up).await;

    let before = tg.metrics.store_write_failures_total.get();
    pg.stop_server();
    gate.open();
    write_refused(&tg, before).await;
    pg.start_server();

    let done = eventually(RECOVERY, || async {
        let v = c.get("\"g1\"", &task).await;
        (v["result"]["status"] == "completed").then_some(v)
    })
    .await;
    let last = c.get("\"g2\"", &task).await;
    assert!(
        done.is_some(),
        "tasks/get says completed once the database is back: {last}"
    );
    let v = c
        .rpc(rpc(
            "3",
            "tasks/result",
            &json!({ "taskId": task }).to_string(),
        ))
        .await;
    assert_eq!(v["result"]["content"][0]["text"], "done", "{v}");
    let db = db(&pg).await;
    let rec = record(&db, &task).await.expect("the record");
    assert_eq!(rec["status"], "completed", "{rec}");
    assert!(
        !rec["terminal_result"].is_null(),
        "the result is stored: {rec}"
    );
    let ended = eventually(STEP, || async {
        (leases(&db, &task).await == 0).then_some(())
    })
    .await;
    assert!(ended.is_some(), "the call's lease is ended");
}

/// A graceful stop while a gateway task's final write waits for the database: the drain
/// (`gateway.drain_timeout_ms`) waits for it, and the database back within it takes it before
/// taskgate exits. Before the fix the stop returned at once (the call was no longer held) and
/// the record stayed `working`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_drains_a_final_write_waiting_for_the_database() {
    let test = "a_graceful_stop_drains_a_final_write_waiting_for_the_database";
    let Some(mut pg) = stoppable(test) else {
        return;
    };
    let gate = Gate::new();
    let up = Upstream::start(held_call_server(gate.clone())).await;
    let mut tg = start_tg(
        &pg,
        "TG_FINAL_WRITE_DRAIN_DB",
        &up.url(),
        "tasks = \"gateway\"",
        false,
    )
    .await;
    let (task, _c) = held_gateway_task(&tg, &up).await;

    let before = tg.metrics.store_write_failures_total.get();
    pg.stop_server();
    gate.open();
    write_refused(&tg, before).await;
    let running = tg.running.take().expect("running");
    let stop = tokio::spawn(running.shutdown());
    pg.start_server();
    tokio::time::timeout(RECOVERY, stop)
        .await
        .expect("the stop ends within its drain")
        .unwrap();
    let db = db(&pg).await;
    let rec = record(&db, &task).await.expect("the record");
    assert_eq!(rec["status"], "completed", "written before the exit: {rec}");
    assert!(
        !rec["terminal_result"].is_null(),
        "the result is stored: {rec}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_call_that_ends_while_the_database_is_down_is_recorded_once_it_is_back() {
    let test = "an_upgraded_call_that_ends_while_the_database_is_down_is_recorded_once_it_is_back";
    let Some(mut pg) = stoppable(test) else {
        return;
    };
    let server = UpServer::start(UpBehaviour {
        task_ms: Some(3000),
        ..UpBehaviour::default()
    })
    .await;
    let tg = start_tg(&pg, "TG_FINAL_WRITE_UPGRADE_DB", &server.url(), "", true).await;
    let mut c = tg.client().with_token("alice-token");
    c.initialize().await;
    // A plain call to a `required` tool: made a task and followed. Its answer is read to the
    // end of the stream: the stream ends with the answer, though the database is still down
    // (review: the retry held the stream's only sender, keeping the principal's in-flight
    // slot and the client waiting until the database was back).
    let call = {
        let c = c.clone();
        tokio::spawn(async move {
            let body = c
                .send(rpc(
                    "1",
                    "tools/call",
                    r#"{"name":"research","arguments":{}}"#,
                ))
                .await
                .text()
                .await;
            let data = body
                .lines()
                .filter_map(|l| l.strip_prefix("data: ").or(l.strip_prefix("data:")))
                .map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).unwrap())
                .find(|v| v.get("id").is_some() && v.get("method").is_none());
            data.unwrap_or_else(|| serde_json::from_str(&body).unwrap_or_default())
        })
    };
    // Its `tasks/result` is out (past the owner check) before the outage.
    let task = eventually(STEP, || async {
        let state = server.state.lock().unwrap();
        let task = state.tasks.keys().next().cloned()?;
        (state.result_calls.get(&task).copied().unwrap_or(0) >= 1).then_some(task)
    })
    .await
    .expect("the upgraded call is a task upstream, its result asked");

    let before = tg.metrics.store_write_failures_total.get();
    pg.stop_server();
    let answer = tokio::time::timeout(STEP, call)
        .await
        .expect("the client is answered, its stream ended, the database still down")
        .unwrap();
    assert!(
        answer.get("result").is_some(),
        "the call's result: {answer}"
    );
    write_refused(&tg, before).await;
    pg.start_server();

    let db = db(&pg).await;
    completed_once_back(
        &db,
        &task,
        "the record is terminal once the database is back",
    )
    .await;
    let ended = eventually(STEP, || async {
        (leases(&db, &task).await == 0).then_some(())
    })
    .await;
    assert!(ended.is_some(), "the follower's lease is ended");
    slot_is_free(&c).await;
}

/// A graceful stop while an upgraded call's final status waits for the database: the drain
/// waits for it (`UpgradeState::final_writes_ended`), and the database back within the drain
/// takes it before taskgate exits. Before (ee40333) the stop returned at once, the retry was
/// dropped with its runtime and the record stayed `working` (another replica would adopt and
/// follow a call that had already been answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_drains_an_upgraded_calls_final_write() {
    let test = "a_graceful_stop_drains_an_upgraded_calls_final_write";
    let Some(mut pg) = stoppable(test) else {
        return;
    };
    let server = UpServer::start(UpBehaviour {
        task_ms: Some(3000),
        ..UpBehaviour::default()
    })
    .await;
    let mut tg = start_tg(
        &pg,
        "TG_FINAL_WRITE_UPGRADE_DRAIN_DB",
        &server.url(),
        "",
        true,
    )
    .await;
    let mut c = tg.client().with_token("alice-token");
    c.initialize().await;
    let call = {
        let c = c.clone();
        tokio::spawn(async move {
            c.send(rpc(
                "1",
                "tools/call",
                r#"{"name":"research","arguments":{}}"#,
            ))
            .await
            .text()
            .await
        })
    };
    let task = eventually(STEP, || async {
        let state = server.state.lock().unwrap();
        let task = state.tasks.keys().next().cloned()?;
        (state.result_calls.get(&task).copied().unwrap_or(0) >= 1).then_some(task)
    })
    .await
    .expect("the upgraded call is a task upstream, its result asked");

    let before = tg.metrics.store_write_failures_total.get();
    pg.stop_server();
    let body = tokio::time::timeout(STEP, call)
        .await
        .expect("the client is answered, the database still down")
        .unwrap();
    assert!(body.contains("\"result\""), "the call's result: {body}");
    write_refused(&tg, before).await;
    let running = tg.running.take().expect("running");
    let stop = tokio::spawn(running.shutdown());
    pg.start_server();
    tokio::time::timeout(RECOVERY, stop)
        .await
        .expect("the stop ends within its drain")
        .unwrap();
    let db = db(&pg).await;
    let rec = record(&db, &task).await.expect("the record");
    assert_eq!(rec["status"], "completed", "written before the exit: {rec}");
}

/// An upstream-owned 2025-11-25 task (the scripted upstream runs it) on taskgate over `pg`
/// (through env var `env`) whose `completed` reaches the client while the database is down:
/// its `tasks/get` is authorised (the record read) and upstream before the outage, and the
/// upstream's answer comes during it, so the record's write is refused (counted: awaited here)
/// and the client sees `completed`. Returns taskgate, the upstream, the client and the task's
/// id; the database is still down.
async fn upstream_task_completed_while_down(
    pg: &mut PgCluster,
    env: &str,
) -> (Tg, UpServer, Client, String) {
    upstream_task_ended_while_down(pg, env, "tasks/get").await
}

/// [`upstream_task_completed_while_down`], the end told by the answer to `ends_by`: a
/// `tasks/get` (`completed`) or a blocking `tasks/result` (the tool's result: the task ended).
async fn upstream_task_ended_while_down(
    pg: &mut PgCluster,
    env: &str,
    ends_by: &'static str,
) -> (Tg, UpServer, Client, String) {
    // The first `ends_by` of a task answers once `gate` opens; the task itself never ends
    // upstream otherwise (no later poll could record it by chance).
    let gate = Gate::new();
    let held = gate.clone();
    let hook: Hook = std::sync::Arc::new(move |method, id, task_id, n| {
        (method == ends_by && n == 1).then(|| {
            let answer = if ends_by == "tasks/result" {
                json!({"content": [{"type": "text", "text": "done"}], "isError": false})
            } else {
                json!({
                    "taskId": task_id, "status": "completed", "statusMessage": "all done",
                    "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:01Z",
                    "ttl": 60000, "pollInterval": 100,
                })
            };
            ScriptedResponse::json(rpc_result(id, &answer.to_string())).after_gate(&held)
        })
    });
    let server = UpServer::start(UpBehaviour {
        task_ms: None,
        hook: Some(hook),
        ..UpBehaviour::default()
    })
    .await;
    let tg = start_tg(pg, env, &server.url(), "", false).await;
    let mut c = tg.client().with_token("alice-token");
    c.initialize().await;
    let created = c
        .rpc(rpc(
            "1",
            "tools/call",
            r#"{"name":"research","arguments":{},"task":{"ttl":60000}}"#,
        ))
        .await;
    let task = created
        .pointer("/result/task/taskId")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("not a CreateTaskResult: {created}"))
        .to_string();

    // The client's request is authorised and upstream; the database stops; the upstream
    // answers that the task ended.
    let get = {
        let (c, task) = (c.clone(), task.clone());
        tokio::spawn(async move {
            if ends_by == "tasks/result" {
                c.result("\"g1\"", &task).await
            } else {
                c.get("\"g1\"", &task).await
            }
        })
    };
    assert!(
        server.wait_count(ends_by, 1, STEP).await,
        "the {ends_by} is upstream"
    );
    let before = tg.metrics.store_write_failures_total.get();
    pg.stop_server();
    gate.open();
    let seen = tokio::time::timeout(STEP, get)
        .await
        .expect("the client is answered")
        .unwrap();
    if ends_by == "tasks/result" {
        assert_eq!(
            seen["result"]["content"][0]["text"], "done",
            "passed through: {seen}"
        );
    } else {
        assert_eq!(
            seen["result"]["status"], "completed",
            "passed through: {seen}"
        );
    }
    write_refused(&tg, before).await;
    (tg, server, c, task)
}

/// A 2025-11-25 task the upstream runs (taskgate only records what passes through) whose
/// `completed` reaches the client while the database is down: its `tasks/get` was authorised
/// (the record read) before the outage, and the upstream's answer comes during it, so the
/// record's write is refused and the client sees `completed`. Without any further request the
/// record is `completed` once the database is back (the registry kept the report and wrote it
/// again), and the owner's live-task slot (`tasks.max_live_tasks_per_owner = 1`) is free for a
/// new task. Before the fix the report was tried once: the record stayed `working` (its slot
/// held) until its ttl, as no client polls a task it saw end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_task_that_completes_while_the_database_is_down_is_recorded_once_it_is_back() {
    let test =
        "an_upstream_task_that_completes_while_the_database_is_down_is_recorded_once_it_is_back";
    let Some(mut pg) = stoppable(test) else {
        return;
    };
    let (_tg, _server, c, task) =
        upstream_task_completed_while_down(&mut pg, "TG_FINAL_WRITE_UPSTREAM_DB").await;
    pg.start_server();

    // No client request from here on: the record is written by taskgate alone.
    let db = db(&pg).await;
    let rec = completed_once_back(
        &db,
        &task,
        "the record is completed once the database is back, without another request",
    )
    .await;
    assert_eq!(rec["status_message"], "all done", "{rec}");
    slot_is_free(&c).await;
}

/// A 2025-11-25 task the upstream runs whose blocking `tasks/result` is answered (the tool's
/// result: the task ended) while the database is down: the payload's end (`completed`) is kept
/// by the registry and written once the database is back, with no further request, and the
/// owner's slot is free. Before, `apply_result_payload` was tried once: the record stayed
/// `working` (its slot held) until its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_payload_that_ends_a_task_while_the_database_is_down_is_recorded_once_it_is_back()
{
    let test =
        "a_result_payload_that_ends_a_task_while_the_database_is_down_is_recorded_once_it_is_back";
    let Some(mut pg) = stoppable(test) else {
        return;
    };
    let (_tg, _server, c, task) =
        upstream_task_ended_while_down(&mut pg, "TG_FINAL_WRITE_PAYLOAD_DB", "tasks/result").await;
    pg.start_server();
    let db = db(&pg).await;
    completed_once_back(
        &db,
        &task,
        "the record is completed once the database is back, without another request",
    )
    .await;
    slot_is_free(&c).await;
}

/// A graceful stop while the terminal status of a task its upstream ran waits for the database
/// (kept by the registry): the drain waits for it, and the database back within the drain
/// takes it before taskgate exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_drains_an_upstream_tasks_refused_status() {
    let test = "a_graceful_stop_drains_an_upstream_tasks_refused_status";
    let Some(mut pg) = stoppable(test) else {
        return;
    };
    let (mut tg, _server, _c, task) =
        upstream_task_completed_while_down(&mut pg, "TG_FINAL_WRITE_UPSTREAM_DRAIN_DB").await;
    let running = tg.running.take().expect("running");
    let stop = tokio::spawn(running.shutdown());
    pg.start_server();
    tokio::time::timeout(RECOVERY, stop)
        .await
        .expect("the stop ends within its drain")
        .unwrap();
    let db = db(&pg).await;
    let rec = record(&db, &task).await.expect("the record");
    assert_eq!(rec["status"], "completed", "written before the exit: {rec}");
}
