//! A gateway tier: three taskgate replicas (the real binary) sharing one PostgreSQL behind nginx
//! (round-robin, no stickiness), in front of a scripted MCP 2026-07-28 task server whose
//! received requests are counted. Proven on the wire:
//! - a `tasks/get` on another replica right after the `CreateTaskResult` finds the task;
//! - 500 concurrent identical `tasks/cancel` spread over the replicas → 1 upstream cancel, and
//!   every caller gets the ack;
//! - kill -9 of one replica while creators run: every acknowledged `taskId` stays reachable
//!   (get, cancel) through the others; after a restart on its port it serves them again;
//! - 2025-11-25: a session's task is served by any replica on its recorded upstream session;
//! - `tasks.max_live_tasks_per_owner` holds across replicas, and `taskgate_tasks` summed over
//!   the replicas counts each record once (two and three replicas in process);
//! - 2025-11-25 sessions under authentication behind HAProxy with the optional stickiness
//!   `deploy/README.md` documents, and behind nginx without it (issue 35; `tier_sessions.rs`);
//! - a sweep lease holder whose connection is black-holed gives the lease up (in process).

use crate::common::*;
use serde_json::json;
use std::time::Duration;

/// The tier in front of a scripted 2026-07-28 task server.
struct ModernTier {
    tier: Tier,
    up: Upstream,
    state: Shared,
}

async fn tier(test: &str) -> Option<ModernTier> {
    tier_with(test, "[auth]\nmode = \"none\"\n").await
}

/// [`tier`] with the replicas' `[auth]` section and any other sections `sections` (TOML).
async fn tier_with(test: &str, sections: &str) -> Option<ModernTier> {
    let (up, state) = modern_server().await;
    let tier = Tier::start_with(test, &up.url(), sections)?;
    Some(ModernTier { tier, up, state })
}

impl std::ops::Deref for ModernTier {
    type Target = Tier;
    fn deref(&self) -> &Tier {
        &self.tier
    }
}

impl std::ops::DerefMut for ModernTier {
    fn deref_mut(&mut self) -> &mut Tier {
        &mut self.tier
    }
}

/// Created on one replica, found on the next one at once; and through the balancer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_right_after_create_on_another_replica() {
    let Some(t) = tier("get_right_after_create_on_another_replica").await else {
        return;
    };
    for i in 0..30 {
        let (a, b) = (&t.replicas[i % 3], &t.replicas[(i + 1) % 3]);
        let id = create(&a.url(), None, "slow_compute").await;
        let (status, v) = task_call(&b.url(), None, 2, "tasks/get", &id).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["result"]["status"], "working", "{v}");
    }
    for _ in 0..10 {
        let id = create(&t.balancer.mcp_url(), None, "slow_compute").await;
        let (status, v) = task_call(&t.balancer.mcp_url(), None, 2, "tasks/get", &id).await;
        assert_eq!(
            (status, v["result"]["taskId"].clone()),
            (200, json!(id)),
            "{v}"
        );
    }
    // An unknown id is -32602 on every replica, without reaching the upstream; so is one
    // holding NUL (cold test: PostgreSQL took it for a database error, `-32603` "task store
    // unavailable" and a store failure counted, on one unauthenticated request).
    let before = count(&t.up, "tasks/get");
    for r in &t.replicas {
        for id in ["no-such-task", "a\u{0}b"] {
            for method in ["tasks/get", "tasks/cancel"] {
                let (_, v) = task_call(&r.url(), None, 3, method, id).await;
                assert_eq!(v["error"]["code"], -32602, "{method} {id:?}: {v}");
            }
        }
    }
    assert_eq!(count(&t.up, "tasks/get"), before);
}

/// 500 concurrent identical `tasks/cancel` through the balancer: one reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_cancels_one_upstream_cancel() {
    let Some(t) = tier("five_hundred_cancels_one_upstream_cancel").await else {
        return;
    };
    t.state.lock().unwrap().cancel_delay = Duration::from_millis(500);
    let id = create(&t.balancer.mcp_url(), None, "slow_compute").await;
    let url = t.balancer.mcp_url();
    let calls = (0..500u64).map(|i| {
        let (url, id) = (url.clone(), id.clone());
        tokio::spawn(async move { task_call(&url, None, 100 + i, "tasks/cancel", &id).await })
    });
    let answers = futures_util::future::join_all(calls).await;
    for a in answers {
        let (status, v) = a.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["result"]["resultType"], "complete", "{v}");
    }
    assert_eq!(
        count(&t.up, "tasks/cancel"),
        1,
        "exactly one upstream cancel"
    );
    // Later cancels, on any replica, are acknowledged without the upstream.
    for r in &t.replicas {
        let (_, v) = task_call(&r.url(), None, 9, "tasks/cancel", &id).await;
        assert_eq!(v["result"]["resultType"], "complete", "{v}");
    }
    assert_eq!(count(&t.up, "tasks/cancel"), 1);
}

/// kill -9 of a replica while creators run through the balancer: every acknowledged task stays
/// reachable through the others, and through the replica again after its restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_loses_nothing() {
    // 160 creations of one (anonymous) owner, most still working when the next come: the
    // default `max_live_tasks_per_owner` (100) would refuse some (`-32029`), which this test is
    // not about.
    let sections = "[auth]\nmode = \"none\"\n\n[tasks]\nmax_live_tasks_per_owner = 1000\n";
    let Some(mut t) = tier_with("a_killed_replica_loses_nothing", sections).await else {
        return;
    };
    let url = t.balancer.mcp_url();
    let creators = (0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            for _ in 0..40 {
                let resp = modern_req(
                    &url,
                    None,
                    1,
                    "tools/call",
                    json!({"name": "slow_compute", "arguments": {}}),
                )
                .send()
                .await;
                // A request cut by the kill gets nginx's 502; only acknowledged tasks count.
                if resp.status() != 200 {
                    continue;
                }
                let v: serde_json::Value = resp.json().await;
                if v["result"]["resultType"] == "task" {
                    acked.push(v["result"]["taskId"].as_str().unwrap().to_string());
                }
            }
            acked
        })
    });
    let creators: Vec<_> = creators.collect();
    // Kill replica 1 once tasks are being created.
    let seen = eventually(STEP, || {
        let n = count(&t.up, "tools/call");
        async move { (n >= 20).then_some(()) }
    })
    .await;
    assert!(seen.is_some(), "creators started");
    t.replicas[1]
        .process
        .as_ref()
        .unwrap()
        .signal(libc::SIGKILL);
    let mut acked = Vec::new();
    for c in creators {
        acked.extend(c.await.unwrap());
    }
    assert!(
        acked.len() >= 100,
        "most creations acknowledged: {}",
        acked.len()
    );
    let survivors = [&t.replicas[0], &t.replicas[2]];
    for (i, id) in acked.iter().enumerate() {
        let r = survivors[i % 2];
        let (status, v) = task_call(&r.url(), None, 2, "tasks/get", id).await;
        assert_eq!(
            (status, v["result"]["taskId"].clone()),
            (200, json!(id)),
            "{v}"
        );
    }
    let (_, v) = task_call(&t.replicas[2].url(), None, 3, "tasks/cancel", &acked[0]).await;
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    // Restart on the same port: it serves the same tasks.
    t.replicas[1].process = None;
    let db = t.pg.url.clone();
    t.replicas[1].start(&db);
    for id in acked.iter().take(20) {
        let (status, v) = task_call(&t.replicas[1].url(), None, 4, "tasks/get", id).await;
        assert_eq!(
            (status, v["result"]["taskId"].clone()),
            (200, json!(id)),
            "{v}"
        );
    }
}

/// 2025-11-25 through a tier: sessions are routed sticky (deploy/README.md), and when a session's
/// replica is not the one a request reaches (its replica died, or a rebalance), the task's
/// requests still work: any replica sends them on the task's recorded upstream session. Created
/// on replica 0; `tasks/get` on replica 1 and `tasks/cancel` on replica 2 with the same
/// `Mcp-Session-Id` reach the upstream on that session; another session's caller gets -32602.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2025_session_task_is_served_by_any_replica() {
    let server = TaskServer::default().await;
    let Some(t) = Tier::start(
        "a_2025_session_task_is_served_by_any_replica",
        &server.url(),
    ) else {
        return;
    };
    let mut c = Client::new(&t.replicas[0].url());
    c.initialize().await;
    let sid = c
        .session
        .clone()
        .expect("the upstream's Mcp-Session-Id is passed through");
    let task = c.create_task("\"c1\"").await;
    let v = Client::new(&t.replicas[1].url())
        .with_session(&sid)
        .get("\"g1\"", &task)
        .await;
    assert_eq!(v["result"]["taskId"], json!(task), "{v}");
    let get = server
        .received("tasks/get")
        .pop()
        .expect("tasks/get forwarded");
    assert_eq!(get.header("mcp-session-id").as_deref(), Some(sid.as_str()));
    let v = Client::new(&t.replicas[2].url())
        .with_session(&sid)
        .cancel("\"x1\"", &task)
        .await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    assert_eq!(server.count("tasks/cancel"), 1);
    let v = Client::new(&t.replicas[1].url())
        .with_session("another-session")
        .get("\"g2\"", &task)
        .await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
}

/// `tasks.max_live_tasks_per_owner` holds across replicas (the database counts), and
/// `taskgate_tasks` summed over the replicas counts each record once. Two replicas (in process)
/// with a limit of 2: ten concurrent creations by alice spread over both → 2 reach the upstream,
/// 8 get -32029 (before: 2 per replica). A task created on replica A that ends as replica B sees
/// it frees alice's slot on A (before: A's own count never heard of it). A third replica started
/// later adds nothing to the gauges' sum (before: each replica counted the whole store at start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_limit_and_task_gauges_hold_across_replicas() {
    let Some(pg) = PgCluster::start("owner_limit_and_task_gauges_hold_across_replicas") else {
        return;
    };
    let up = TaskServer::start(Behaviour {
        // A slow CreateTaskResult: the creations are in flight together.
        creation_delay: Duration::from_millis(200),
        ..Behaviour::default()
    })
    .await;
    let config = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .tasks("max_live_tasks_per_owner = 2")
        .tasks("sweep_interval_ms = 50");
    let env = "TG_TIER_LIMIT_DB";
    let a = tg_on_pg(&config, env, &pg.url).await;
    let b = tg_on_pg(&config, env, &pg.url).await;
    let mut on_a = a.client().with_token("alice-token");
    on_a.initialize().await;
    let mut on_b = b.client().with_token("alice-token");
    on_b.initialize().await;
    let go = Gate::new();
    let calls: Vec<_> = (0..10)
        .map(|i| {
            let c = (if i % 2 == 0 { &on_a } else { &on_b }).clone();
            let go = go.clone();
            tokio::spawn(async move {
                go.wait().await;
                c.rpc(Client::create_body(&i.to_string(), Some(60_000)))
                    .await
            })
        })
        .collect();
    go.open();
    let mut created = Vec::new();
    for (i, h) in calls.into_iter().enumerate() {
        let v = h.await.unwrap();
        match v.pointer("/result/task/taskId").and_then(|t| t.as_str()) {
            Some(id) => created.push((i % 2, id.to_string())),
            None => assert_eq!(err_code(&v), -32029, "{v}"),
        }
    }
    assert_eq!(
        created.len(),
        2,
        "the limit holds across replicas: {created:?}"
    );
    assert_eq!(
        up.count("tools/call"),
        2,
        "refused creations never go upstream"
    );

    // One of alice's tasks ends; the replica that did not create it sees the end.
    let (made_on, done) = created[0].clone();
    up.set(&done, "completed");
    let (creator, other) = if made_on == 0 {
        (&on_a, &on_b)
    } else {
        (&on_b, &on_a)
    };
    assert_eq!(
        other.get("\"g\"", &done).await["result"]["status"],
        "completed"
    );
    let again = creator
        .rpc(Client::create_body("\"again\"", Some(60_000)))
        .await;
    assert!(again.pointer("/result/task/taskId").is_some(), "{again}");

    // The gauges: 2 working and 1 completed in the database; summed over the replicas, each
    // record once, also with a replica started after the records were made.
    let c = tg_on_pg(&config, env, &pg.url).await;
    let sums = eventually(STEP, || {
        let replicas = [&a, &b, &c];
        async move {
            let mut texts = Vec::new();
            for r in replicas {
                texts.push(r.metrics_text().await);
            }
            let sum = |status: &str| -> f64 {
                texts
                    .iter()
                    .map(|t| metric(t, "taskgate_tasks", &[("status", status)]))
                    .sum()
            };
            let exporting = texts
                .iter()
                .filter(|t| t.lines().any(|l| l.starts_with("taskgate_tasks{")))
                .count();
            let got = (sum("working"), sum("completed"), exporting);
            (got == (2.0, 1.0, 1)).then_some(got)
        }
    })
    .await;
    assert!(sums.is_some(), "one replica exports the database's counts");
}

/// The tasks a 2026-07-28 server makes of plain calls count against
/// `tasks.max_live_tasks_per_owner` in the database too: alice has one task made on replica A
/// and one on B; a third live one, made on A (whose own count knows one), is cancelled upstream
/// and answered `-32029`, and never recorded. A plain answer passes at the limit. (Before: every
/// such task was recorded, whatever the limit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_server_task_over_the_owner_limit_is_refused_across_replicas() {
    let test = "a_2026_server_task_over_the_owner_limit_is_refused_across_replicas";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let (up, state) = modern_server().await;
    let config = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .token("bob", "bob-token")
        .tasks("max_live_tasks_per_owner = 2");
    let env = "TG_TIER_MODERN_LIMIT_DB";
    let a = tg_on_pg(&config, env, &pg.url).await;
    let b = tg_on_pg(&config, env, &pg.url).await;
    let alice = Some("alice-token");
    create(&a.mcp_url(), alice, "slow_compute").await;
    create(&b.mcp_url(), alice, "slow_compute").await;
    let call = |url: &str, id: u64, tool: &str| {
        modern_req(
            url,
            alice,
            id,
            "tools/call",
            json!({"name": tool, "arguments": {}}),
        )
    };
    let (status, v) = send(call(&a.mcp_url(), 3, "plain_tool")).await;
    assert_eq!(
        (status, v["result"]["resultType"].clone()),
        (200, json!("complete")),
        "{v}"
    );
    let (status, v) = send(call(&a.mcp_url(), 4, "slow_compute")).await;
    assert_eq!((status, err_code(&v)), (200, -32029), "{v}");
    assert!(
        up.wait_for_method("tasks/cancel", 1, STEP).await,
        "the task over the limit is cancelled upstream"
    );
    let over = up.received("tasks/cancel")[0].json()["params"]["taskId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(state.lock().unwrap().tasks[&over], "cancelled");
    assert!(a.record(&over).is_none(), "never recorded");
    // The same on B; another owner is not affected.
    let (status, v) = send(call(&b.mcp_url(), 5, "slow_compute")).await;
    assert_eq!(
        (status, err_code(&v)),
        (200, -32029),
        "alice again, on B: {v}"
    );
    let t = create(&b.mcp_url(), Some("bob-token"), "slow_compute").await;
    assert!(b.record(&t).is_some());
    assert!(
        up.wait_for_method("tasks/cancel", 2, STEP).await,
        "one cancel per refused task"
    );
    assert_eq!(up.received("tasks/cancel").len(), 2);
}

/// 2025-11-25 sessions under bearer authentication through a tier behind HAProxy with the
/// optional stickiness `deploy/README.md` documents (stick on the `Mcp-Session-Id` the
/// `initialize`'s response set): six sessions of two principals, placed round-robin, each run
/// create, get, list and cancel without one refusal. Since issue 35 stickiness is no longer
/// needed (`tier_sessions.rs`): the control, nginx round-robin without it, serves the same
/// session on every replica (before: 404 `-32001` from a replica that did not see the
/// `initialize`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticated_2025_sessions_stick_to_their_replica() {
    let test = "authenticated_2025_sessions_stick_to_their_replica";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let up = TaskServer::default().await;
    let config = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .token("bob", "bob-token")
        .gateway("allowed_hosts = [\"*\"]");
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(tg_on_pg(&config, "TG_TIER_STICKY_DB", &pg.url).await);
    }
    let backends: Vec<std::net::SocketAddr> = replicas.iter().map(|r| r.gw).collect();
    let Some(sticky) = Balancer::sticky(test, &backends) else {
        return;
    };
    for i in 0..6 {
        let token = if i % 2 == 0 {
            "alice-token"
        } else {
            "bob-token"
        };
        let mut c = Client::new(&sticky.mcp_url()).with_token(token);
        c.initialize().await;
        assert!(
            c.session.is_some(),
            "the upstream's Mcp-Session-Id is passed on"
        );
        let task = c.create_task("1").await;
        let v = c.get("2", &task).await;
        assert_eq!(v["result"]["taskId"], json!(task), "session {i}: {v}");
        let v = c.list("3", None).await;
        assert!(v["result"]["tasks"].is_array(), "session {i}: {v}");
        let v = c.cancel("4", &task).await;
        assert_eq!(v["result"]["status"], "cancelled", "session {i}: {v}");
    }
    assert_eq!(up.count("tools/call"), 6);

    // Control: round-robin without stickiness serves the session too (issue 35).
    let Some(rr) = Balancer::start(test, &backends) else {
        return;
    };
    let mut c = Client::new(&rr.mcp_url()).with_token("alice-token");
    c.initialize().await;
    for n in 0..6 {
        let r = c.send(rpc(&n.to_string(), "tasks/list", "{}")).await;
        assert_eq!(r.status(), 200, "every replica serves the session");
    }
}

/// The sweep lease's holder whose connection is black-holed (a proxy that stops forwarding: no
/// answer, no error) gives the lease up within the URL's `connect_timeout` (the bound of its
/// liveness check) instead of stalling its sweeps and the shared gauges until TCP gives up; its
/// connection is closed, so the server ends the lock and another replica takes the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_sweep_lease_holder_gives_the_lease_up() {
    use taskgate::store::{PgStore, TaskStore};
    let Some(pg) = PgCluster::start("a_black_holed_sweep_lease_holder_gives_the_lease_up") else {
        return;
    };
    let proxy = BlackHole::start(&pg.url).await;
    let via = proxy.url(&pg.url);
    let sep = if via.contains('?') { '&' } else { '?' };
    let a = PgStore::open(
        &format!("{via}{sep}connect_timeout=1"),
        1,
        taskgate::tls::Trust::default(),
    )
    .await
    .unwrap();
    let b = PgStore::open(&pg.url, 1, taskgate::tls::Trust::default())
        .await
        .unwrap();
    // Off the runtime (the store blocks), on a thread of its own: a check that never ends
    // fails the test instead of hanging it.
    let lease = |store: std::sync::Arc<PgStore>| {
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let _ = tx.send(store.sweep_lease().unwrap().is_some());
        });
        async move {
            tokio::time::timeout(Duration::from_secs(20), rx)
                .await
                .expect("the sweep lease's liveness check ends")
                .unwrap()
        }
    };
    assert!(lease(a.clone()).await, "a takes the lease first");
    assert!(!lease(b.clone()).await, "b must not sweep while a holds it");
    proxy.stop();
    assert!(
        !lease(a.clone()).await,
        "a black-holed holder does not sweep"
    );
    let taken = eventually(Duration::from_secs(10), || {
        let b = b.clone();
        async move { lease(b).await.then_some(()) }
    })
    .await;
    assert!(taken.is_some(), "b takes the lease a gave up");
}

/// On PostgreSQL the task writes' durations are recorded in
/// `taskgate_store_write_duration_seconds`, as sled's group commits are (before: the histogram
/// stayed empty on PostgreSQL, and so did its dashboard panel for a tier).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_task_writes_are_timed_in_the_store_write_histogram() {
    let Some(pg) = PgCluster::start("postgres_task_writes_are_timed_in_the_store_write_histogram")
    else {
        return;
    };
    let up = TaskServer::default().await;
    let config = TgConfig::new(&up.url()).token("alice", "alice-token");
    let tg = tg_on_pg(&config, "TG_TIER_WRITE_TIMES_DB", &pg.url).await;
    let before = tg.metrics_text().await;
    let count = |text: &str| metric(text, "taskgate_store_write_duration_seconds_count", &[]);
    let mut alice = tg.client().with_token("alice-token");
    alice.initialize().await;
    let task = alice.create_task("1").await;
    assert!(!task.is_empty());
    let after = tg.metrics_text().await;
    assert!(
        count(&after) >= count(&before) + 1.0,
        "the creation's write is timed: before {}, after {}\n{after}",
        count(&before),
        count(&after)
    );
    let sum = metric(&after, "taskgate_store_write_duration_seconds_sum", &[]);
    assert!(sum > 0.0, "{after}");
}
