//! Call leases in a tier (issue 32, issue 35): three replicas (the real binary) on one
//! PostgreSQL, leases of 1.5 s polled every 100 ms (`store.lease_ms`, `store.lease_poll_ms`), a
//! scripted upstream. Proven on the wire:
//! - a gateway task's `tasks/cancel` answered by another replica than the one holding the call
//!   reaches the holder: one `notifications/cancelled` upstream naming the held call's id, and
//!   "resources released" only once the upstream handler has ended;
//! - kill -9 of the replica holding a gateway task's call: the task is `failed`, saying its
//!   replica was lost, once the lease lapses (not `working` until its ttl);
//! - SIGSTOP of that replica past the lapse: the task is adopted and `failed`, and once it runs
//!   again the holder stops its call (`notifications/cancelled` upstream), its lease lost;
//! - a gateway task whose lease cannot be taken is refused (-32603), nothing sent upstream;
//! - kill -9 of the replica following an upgraded call: another replica adopts it and follows
//!   it to its end; the record gets its final status and result.
//!
//! The requests that must reach a given replica go to it directly, the rest through nginx
//! round-robin (30 more cancels; `tasks/get` after the kill). Each fails on the commit before the leases (5b6ec94, built
//! and run with `TASKGATE_TEST_BIN`, which leaves the lease keys out of the configs): no
//! notification reaches the upstream, the task stays `working`, the upgraded call's record stays
//! `working`.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const AUTH: &[(&str, &str)] = &[("alice", "alice-token")];
/// The lease lapse the replicas are given (ms).
const LEASE_MS: u64 = 1500;

/// Three replicas on one PostgreSQL, each started; a database client for the assertions.
struct LeaseTier {
    replicas: Vec<Replica>,
    /// nginx round-robin over the replicas.
    balancer: Balancer,
    pg: PgCluster,
    db: tokio_postgres::Client,
    _dir: tempfile::TempDir,
}

impl LeaseTier {
    /// `upstream_lines`: added to the `[[upstream]]` section; `upgrade`: `[upgrade] enabled`.
    async fn start(
        test: &str,
        upstream: &str,
        upstream_lines: &str,
        upgrade: bool,
    ) -> Option<LeaseTier> {
        let pg = PgCluster::start(test)?;
        let dir = tempfile::tempdir().unwrap();
        // An older build (TASKGATE_TEST_BIN) refuses keys it does not know.
        let lease = if std::env::var("TASKGATE_TEST_BIN").is_ok() {
            String::new()
        } else {
            format!("lease_ms = {LEASE_MS}\nlease_poll_ms = 100\n")
        };
        let mut replicas: Vec<Replica> = (0..3)
            .map(|n| {
                let gp = free_port();
                let toml = format!(
                    "[gateway]\nlisten = \"127.0.0.1:{gp}\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n\
                     [store]\nbackend = \"postgres\"\nurl_env = \"TASKGATE_DATABASE_URL\"\npool_size = 8\n{lease}\n\
                     {auth}\n[tasks]\nrelease_quiet_ms = 100\n\n[upgrade]\nenabled = {upgrade}\n\n\
                     [[upstream]]\nname = \"default\"\nurl = \"{upstream}\"\n{upstream_lines}\n",
                    auth = bearer_auth(AUTH),
                );
                let config = dir.path().join(format!("replica{n}.toml"));
                std::fs::write(&config, toml).unwrap();
                Replica {
                    config: config.to_str().unwrap().to_string(),
                    gateway: std::net::SocketAddr::from(([127, 0, 0, 1], gp)),
                    process: None,
                }
            })
            .collect();
        for r in &mut replicas {
            r.start(&pg.url);
        }
        let backends: Vec<std::net::SocketAddr> = replicas.iter().map(|r| r.gateway).collect();
        let balancer = Balancer::start(test, &backends)?;
        let (db, conn) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        Some(LeaseTier {
            replicas,
            balancer,
            pg,
            db,
            _dir: dir,
        })
    }

    fn on(&self, n: usize, session: &str) -> Client {
        Client::new(&self.replicas[n].url())
            .with_token("alice-token")
            .with_session(session)
    }

    fn kill(&mut self, n: usize) {
        sigkill(self.replicas[n].process.as_mut().unwrap());
    }

    /// How many `event` audit facts the task has.
    async fn audit(&self, task_id: &str, event: &str) -> i64 {
        self.db
            .query_one(
                "SELECT count(*) FROM taskgate_audit WHERE task_id = $1 AND event = $2",
                &[&task_id, &event],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// The task's stored record.
    async fn record(&self, task_id: &str) -> Option<Value> {
        let row = self
            .db
            .query_opt(
                "SELECT record FROM taskgate_tasks WHERE task_id = $1",
                &[&task_id],
            )
            .await
            .unwrap()?;
        serde_json::from_str(&row.get::<_, String>(0)).ok()
    }
}

/// A server without tasks: every `tools/call` answers on an SSE stream, first one progress
/// notification, then its result once `gate` opens.
fn held_call_server(gate: Gate) -> impl Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync {
    let sessions = std::sync::atomic::AtomicUsize::new(0);
    move |req| {
        if req.method == "GET" {
            return ScriptedResponse::sse(vec![SseStep::HoldOpen]);
        }
        let v = req.json();
        let id = req.rpc_id_json();
        match v["method"].as_str() {
            Some("initialize") => {
                let n = sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                mcp_handler(req).set_header("mcp-session-id", &format!("up-session-{n}"))
            }
            // Both eras (2026-07-28 clients' calls go to it as they come).
            Some("server/discover") => ScriptedResponse::result_for(
                req,
                r#"{"resultType":"complete","supportedVersions":["2025-11-25","2026-07-28"],"capabilities":{"tools":{}}}"#,
            ),
            Some("tools/list") => ScriptedResponse::result_for(
                req,
                r#"{"tools":[{"name":"slow","inputSchema":{"type":"object"}}]}"#,
            ),
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

/// A gateway task created on replica 0 (which holds its call); returns its id and the session.
async fn gateway_task(t: &LeaseTier, up: &Upstream) -> (String, String) {
    let mut c = Client::new(&t.replicas[0].url()).with_token("alice-token");
    c.initialize().await;
    let task = c.create_held_gateway_task(up).await;
    (task, c.session.clone().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_answered_by_another_replica_reaches_the_held_call() {
    let gate = Gate::new();
    let up = Upstream::start(held_call_server(gate.clone())).await;
    let Some(t) = LeaseTier::start(
        "a_cancel_answered_by_another_replica_reaches_the_held_call",
        &up.url(),
        "tasks = \"gateway\"",
        false,
    )
    .await
    else {
        return;
    };
    let (task, sid) = gateway_task(&t, &up).await;
    let call_id = up.received("tools/call")[0].json()["id"].clone();
    // Replica 1 answers the cancel: `cancelled` at once.
    let v = t.on(1, &sid).cancel("2", &task).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    let answered = Instant::now();
    // The notification upstream, within a poll of the lease (watched every 5 ms to time it).
    let reached = eventually(STEP, || async {
        if up.received("notifications/cancelled").is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
            return None;
        }
        Some(answered.elapsed())
    })
    .await
    .expect("the cancel reached the replica holding the call");
    eprintln!(
        "cancel answered on replica 1 -> notifications/cancelled from replica 0: {} ms",
        reached.as_millis()
    );
    // Replica 2's later cancel finds it terminal, and so do 30 more spread by nginx.
    let v = t.on(2, &sid).cancel("3", &task).await;
    assert_eq!(err_code(&v), -32602, "{v}");
    let via = t.balancer.mcp_url();
    let more: Vec<_> = (0..30)
        .map(|i| {
            let c = Client::new(&via)
                .with_token("alice-token")
                .with_session(&sid);
            let task = task.clone();
            tokio::spawn(async move { c.cancel(&format!("\"n{i}\""), &task).await })
        })
        .collect();
    for m in more {
        let v = m.await.unwrap();
        assert_eq!(err_code(&v), -32602, "{v}");
    }
    let notes = up.received("notifications/cancelled");
    assert_eq!(
        notes[0].json()["params"]["requestId"],
        call_id,
        "{:?}",
        notes[0].json()
    );
    // The upstream handler still runs: nothing released yet.
    assert_eq!(
        t.audit(&task, "resources_released").await,
        0,
        "released while the call runs"
    );
    gate.open();
    let released = eventually(STEP, || async {
        (t.audit(&task, "resources_released").await == 1).then_some(())
    })
    .await;
    assert!(released.is_some(), "released once the held call ended");
    assert_eq!(
        up.received("notifications/cancelled").len(),
        1,
        "one notification across the replicas"
    );
    for n in 0..3 {
        let v = t.on(n, &sid).get(&format!("\"g{n}\""), &task).await;
        assert_eq!(v["result"]["status"], "cancelled", "replica {n}: {v}");
    }
}

/// The same for a 2026-07-28 client (no session; the cancel is closing the held call's stream,
/// 2026-07-28 has no `notifications/cancelled` over HTTP): its `tasks/cancel` answered by replica
/// 1 is acked and the task `cancelled` on every replica; replica 0, holding the call, closes its
/// stream once, sends no notification, and records "resources released" once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_cancel_answered_by_another_replica_closes_the_held_stream() {
    let gate = Gate::new();
    let up = Upstream::start(held_call_server(gate.clone())).await;
    let Some(t) = LeaseTier::start(
        "a_2026_cancel_answered_by_another_replica_closes_the_held_stream",
        &up.url(),
        "tasks = \"gateway\"",
        false,
    )
    .await
    else {
        return;
    };
    let token = Some("alice-token");
    let task = create(&t.replicas[0].url(), token, "slow").await;
    assert!(
        up.wait_for_method("tools/call", 1, STEP).await,
        "the call is held upstream"
    );
    let (status, v) = task_call(&t.replicas[1].url(), token, 2, "tasks/cancel", &task).await;
    assert_eq!(
        (status, v["result"]["resultType"].clone()),
        (200, json!("complete")),
        "{v}"
    );
    assert!(
        up.wait_for_sse_disconnects(1, STEP).await,
        "the replica holding the call closed its stream"
    );
    let released = eventually(STEP, || async {
        (t.audit(&task, "resources_released").await == 1).then_some(())
    })
    .await;
    assert!(released.is_some(), "released once the stream is closed");
    for n in 0..3 {
        let (_, g) = task_call(&t.replicas[n].url(), token, 3, "tasks/get", &task).await;
        assert_eq!(g["result"]["status"], "cancelled", "replica {n}: {g}");
    }
    assert!(up.received("notifications/cancelled").is_empty());
    assert_eq!(up.sse_disconnects(), 1);
    assert_eq!(t.audit(&task, "status_cancelled").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_task_whose_replica_is_killed_fails_once_its_lease_lapses() {
    let gate = Gate::new();
    let up = Upstream::start(held_call_server(gate.clone())).await;
    let Some(mut t) = LeaseTier::start(
        "a_gateway_task_whose_replica_is_killed_fails_once_its_lease_lapses",
        &up.url(),
        "tasks = \"gateway\"",
        false,
    )
    .await
    else {
        return;
    };
    let (task, sid) = gateway_task(&t, &up).await;
    let v = t.on(1, &sid).get("2", &task).await;
    assert_eq!(v["result"]["status"], "working", "{v}");
    t.kill(0);
    let killed = Instant::now();
    let failed = eventually(Duration::from_millis(LEASE_MS) + STEP, || async {
        let v = t.on(1, &sid).get("3", &task).await;
        (v["result"]["status"] == "failed").then_some(v)
    })
    .await
    .expect("failed once the lease lapsed, not working until the ttl");
    eprintln!("kill -9 -> failed in {} ms", killed.elapsed().as_millis());
    let message = failed["result"]["statusMessage"].as_str().unwrap_or("");
    assert!(
        message.contains("replica") && message.contains("lost"),
        "{failed}"
    );
    let v = t.on(2, &sid).get("4", &task).await;
    assert_eq!(v["result"]["status"], "failed", "{v}");
    let r = t.on(2, &sid).result("5", &task).await;
    assert_eq!(err_code(&r), -32603, "{r}");
    // Through nginx too (it passes over the dead replica).
    let c = Client::new(&t.balancer.mcp_url())
        .with_token("alice-token")
        .with_session(&sid);
    for i in 0..4 {
        let v = c.get(&format!("\"b{i}\""), &task).await;
        assert_eq!(v["result"]["status"], "failed", "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_call_whose_follower_is_killed_is_followed_to_its_end() {
    let server = UpServer::start(UpBehaviour {
        task_ms: Some(4000),
        ..UpBehaviour::default()
    })
    .await;
    let Some(mut t) = LeaseTier::start(
        "an_upgraded_call_whose_follower_is_killed_is_followed_to_its_end",
        &server.url(),
        "",
        true,
    )
    .await
    else {
        return;
    };
    let mut c = Client::new(&t.replicas[0].url()).with_token("alice-token");
    c.initialize().await;
    // A plain call to a `required` tool: replica 0 makes it a task and follows it.
    let call = c
        .send(rpc(
            "1",
            "tools/call",
            r#"{"name":"research","arguments":{}}"#,
        ))
        .await;
    assert_eq!(call.status(), 200);
    let task = eventually(STEP, || async {
        server.state.lock().unwrap().tasks.keys().next().cloned()
    })
    .await
    .expect("the upgraded call is a task upstream");
    // Followed: replica 0 polls it.
    let followed = eventually(STEP, || async {
        let state = server.state.lock().unwrap();
        state
            .seen
            .iter()
            .any(|(m, id, _)| m == "tasks/get" && *id == task)
            .then_some(())
    })
    .await;
    assert!(followed.is_some(), "replica 0 follows the task");
    t.kill(0);
    drop(call);
    let killed = Instant::now();
    let rec = eventually(Duration::from_secs(30), || async {
        let r = t.record(&task).await?;
        (r["status"] == "completed" && !r["terminal_result"].is_null()).then_some(r)
    })
    .await;
    let rec = rec.unwrap_or_else(|| {
        panic!(
            "adopted and followed to its end; the record: {:?}",
            futures_util::FutureExt::now_or_never(t.record(&task))
        )
    });
    eprintln!(
        "kill -9 -> adopted call's record complete in {} ms",
        killed.elapsed().as_millis()
    );
    let results = server
        .state
        .lock()
        .unwrap()
        .result_calls
        .get(&task)
        .copied();
    assert!(
        results.unwrap_or(0) >= 1,
        "tasks/result asked upstream: {rec}"
    );
    // Counted once, by the replica that adopted it (once its follower ended).
    let adopted = || async {
        let mut n = 0.0;
        for r in &t.replicas[1..] {
            let text = scrape(r.admin().expect("a running replica")).await;
            n += metric(
                &text,
                "taskgate_upgraded_calls_total",
                &[("outcome", "adopted")],
            );
        }
        n
    };
    let counted = eventually(STEP, || async { (adopted().await >= 1.0).then_some(()) }).await;
    assert!(
        counted.is_some(),
        "upgraded_calls_total{{outcome=\"adopted\"}} counted"
    );
    assert_eq!(adopted().await, 1.0, "counted once over replicas 1 and 2");
    let _ = &t.pg;
}

/// The replica holding a gateway task's call stalls (SIGSTOP) past its lease's lapse: replica 1
/// adopts the lease and records the task `failed`. Once the holder runs again its renewal no
/// longer returns that lease, and it stops the call: one `notifications/cancelled` upstream
/// naming the held call, before the tool's end. Fails with the renewal's answer ignored (as
/// before bf55e9d): the call runs on to its end, nothing reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_whose_lease_was_adopted_stops_its_call() {
    let gate = Gate::new();
    let up = Upstream::start(held_call_server(gate.clone())).await;
    let Some(mut t) = LeaseTier::start(
        "a_stalled_holder_whose_lease_was_adopted_stops_its_call",
        &up.url(),
        "tasks = \"gateway\"",
        false,
    )
    .await
    else {
        return;
    };
    let (task, sid) = gateway_task(&t, &up).await;
    let call_id = up.received("tools/call")[0].json()["id"].clone();
    t.replicas[0]
        .process
        .as_mut()
        .unwrap()
        .signal(libc::SIGSTOP);
    let failed = eventually(Duration::from_millis(LEASE_MS) + STEP, || async {
        let v = t.on(1, &sid).get("3", &task).await;
        (v["result"]["status"] == "failed").then_some(v)
    })
    .await;
    t.replicas[0]
        .process
        .as_mut()
        .unwrap()
        .signal(libc::SIGCONT);
    assert!(failed.is_some(), "adopted while its holder stalled");
    assert!(
        up.received("notifications/cancelled").is_empty(),
        "nothing sent while stopped"
    );
    let stopped = eventually(STEP, || async {
        (!up.received("notifications/cancelled").is_empty()).then_some(())
    })
    .await;
    assert!(
        stopped.is_some(),
        "the holder stops the call whose lease another replica adopted"
    );
    let notes = up.received("notifications/cancelled");
    assert_eq!(notes[0].json()["params"]["requestId"], call_id);
    gate.open();
}

/// A gateway task whose call lease cannot be taken (the leases' table is gone; the records'
/// is there) is refused like one whose record cannot be made: -32603 saying the task store is
/// unavailable, nothing sent upstream, no record. Fails on d3e6784^: the call went ahead without
/// its lease (neither cancellable from another replica nor adoptable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_task_whose_lease_cannot_be_taken_is_refused() {
    let up = Upstream::start(held_call_server(Gate::new())).await;
    let Some(t) = LeaseTier::start(
        "a_gateway_task_whose_lease_cannot_be_taken_is_refused",
        &up.url(),
        "tasks = \"gateway\"",
        false,
    )
    .await
    else {
        return;
    };
    t.db.batch_execute("ALTER TABLE taskgate_leases RENAME TO taskgate_leases_away")
        .await
        .unwrap();
    let mut c = Client::new(&t.replicas[0].url()).with_token("alice-token");
    c.initialize().await;
    let v = c
        .rpc(rpc(
            "1",
            "tools/call",
            &json!({"name": "slow", "arguments": {}, "task": {"ttl": 600000}}).to_string(),
        ))
        .await;
    assert_eq!(err_code(&v), -32603, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("unavailable") && message.contains("lease"),
        "{v}"
    );
    assert!(
        up.received("tools/call").is_empty(),
        "nothing went upstream"
    );
    let n: i64 =
        t.db.query_one("SELECT count(*) FROM taskgate_tasks", &[])
            .await
            .unwrap()
            .get(0);
    assert_eq!(n, 0, "no record");
}

/// `tasks.max_live_tasks_per_owner` holds for gateway tasks across replicas (the database
/// counts, as for the tasks a server makes): with a limit of 1, alice's gateway task held by
/// replica A refuses her second, asked of replica B, `-32029`, and nothing of it goes
/// upstream; bob's passes. (Before: each replica counted only its own held calls, and B made
/// alice a second task.) Two replicas in this process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_limit_holds_for_gateway_tasks_across_replicas() {
    let test = "the_owner_limit_holds_for_gateway_tasks_across_replicas";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let gate = Gate::new();
    let up = Upstream::start(held_call_server(gate.clone())).await;
    let mut config = UgConfig::new(&up.url())
        .upgrade(&["enabled = false"])
        .upstream_line("tasks = \"gateway\"")
        .tasks("max_live_tasks_per_owner = 1");
    config.tg = config
        .tg
        .token("alice", "alice-token")
        .token("bob", "bob-token");
    let env = "TG_TIER_GATEWAY_LIMIT_DB";
    std::env::set_var(env, &pg.url);
    let replica = || {
        Tg::start(|store| {
            config.to_toml(store).replace(
                &format!("[store]\npath = {store:?}\n"),
                &format!("[store]\nbackend = \"postgres\"\nurl_env = {env:?}\npool_size = 4\n"),
            )
        })
    };
    let (a, b) = (replica().await, replica().await);
    let alice = Some("alice-token");
    let first = create(&a.mcp_url(), alice, "slow").await;
    assert!(a.record(&first).is_some());
    assert!(
        up.wait_for_method("tools/call", 1, STEP).await,
        "alice's call is held upstream by A"
    );
    let (status, v) = send(modern_req(
        &b.mcp_url(),
        alice,
        2,
        "tools/call",
        json!({"name": "slow", "arguments": {}}),
    ))
    .await;
    assert_eq!((status, err_code(&v)), (200, -32029), "alice on B: {v}");
    let t = create(&b.mcp_url(), Some("bob-token"), "slow").await;
    assert!(b.record(&t).is_some());
    assert!(
        up.wait_for_method("tools/call", 2, STEP).await,
        "bob's call is held upstream by B"
    );
    assert_eq!(
        up.received("tools/call").len(),
        2,
        "alice's refused call never went upstream"
    );
    gate.open();
}
