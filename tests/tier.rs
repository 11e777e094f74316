//! A gateway tier: three taskgate replicas (the real binary) sharing one PostgreSQL behind nginx
//! (round-robin, no stickiness), in front of a scripted MCP 2026-07-28 task server whose
//! received requests are counted. Proven on the wire:
//! - a `tasks/get` on another replica right after the `CreateTaskResult` finds the task;
//! - 500 concurrent identical `tasks/cancel` spread over the replicas → 1 upstream cancel, and
//!   every caller gets the ack;
//! - kill -9 of one replica while creators run: every acknowledged `taskId` stays reachable
//!   (get, cancel) through the others; after a restart on its port it serves them again.

mod common;

use common::*;
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;

/// One replica: its config (fixed ports, so a restart comes back where nginx expects it).
struct Replica {
    config: String,
    gateway: SocketAddr,
    process: Option<TaskgateProcess>,
}

impl Replica {
    fn new(dir: &std::path::Path, n: usize, upstream: &str) -> Replica {
        let (gp, ap) = (free_port(), free_port());
        let toml = format!(
            "[gateway]\nlisten = \"127.0.0.1:{gp}\"\n\n[admin]\nlisten = \"127.0.0.1:{ap}\"\n\n\
             [store]\nbackend = \"postgres\"\nurl_env = \"TASKGATE_DATABASE_URL\"\npool_size = 8\n\n\
             [auth]\nmode = \"none\"\n\n[upgrade]\nenabled = false\n\n\
             [[upstream]]\nname = \"default\"\nurl = \"{upstream}\"\n"
        );
        let config = dir.join(format!("replica{n}.toml"));
        std::fs::write(&config, toml).unwrap();
        Replica {
            config: config.to_str().unwrap().to_string(),
            gateway: SocketAddr::from(([127, 0, 0, 1], gp)),
            process: None,
        }
    }

    fn start(&mut self, db: &str) {
        let mut p = TaskgateProcess::spawn(
            &["serve", "--config", &self.config],
            &[("TASKGATE_DATABASE_URL", db), ("RUST_LOG", "warn")],
        );
        let (g, _) = p.listening();
        assert_eq!(g, self.gateway);
        self.process = Some(p);
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.gateway)
    }
}

struct Tier {
    replicas: Vec<Replica>,
    balancer: Balancer,
    up: Upstream,
    state: Shared,
    pg: PgCluster,
    _dir: tempfile::TempDir,
}

async fn tier(test: &str) -> Option<Tier> {
    let pg = PgCluster::start(test)?;
    let (up, state) = modern_server().await;
    let dir = tempfile::tempdir().unwrap();
    let mut replicas: Vec<Replica> = (0..3)
        .map(|n| Replica::new(dir.path(), n, &up.url()))
        .collect();
    for r in &mut replicas {
        r.start(&pg.url);
    }
    let backends: Vec<SocketAddr> = replicas.iter().map(|r| r.gateway).collect();
    let balancer = Balancer::start(test, &backends)?;
    Some(Tier {
        replicas,
        balancer,
        up,
        state,
        pg,
        _dir: dir,
    })
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
    // An unknown id is -32602 on every replica, without reaching the upstream.
    let before = count(&t.up, "tasks/get");
    for r in &t.replicas {
        let (_, v) = task_call(&r.url(), None, 3, "tasks/get", "no-such-task").await;
        assert_eq!(v["error"]["code"], -32602, "{v}");
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
    let Some(mut t) = tier("a_killed_replica_loses_nothing").await else {
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
