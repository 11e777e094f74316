//! A `tasks/cancel` whose forwarding replica dies mid-forward is taken over by a replica waiting
//! on it (tester 4, finding 4).
//!
//! Two replicas (the real binary) on one PostgreSQL, a 2025-11-25 task server that changes the
//! task's status when a `tasks/cancel` arrives but answers it only much later. Replica 0
//! forwards a cancel and is killed -9 while the upstream holds the answer; the same cancel is
//! then sent to replica 1, which finds replica 0's claim still leased and waits on it.
//!
//! On the code before the takeover, replica 1 waited for the whole lease plus a second and then
//! answered `-32603` "tasks/cancel forwarded by another taskgate replica failed: the replica
//! forwarding this tasks/cancel did not answer in time", although the upstream had cancelled
//! the task. Now replica 1 takes the claim over once its lease lapses, reads the task's state
//! first (the dead replica's cancel may have reached the upstream), finds it `cancelled` and
//! answers the cancel as the one that worked: the task, `cancelled`, with no second
//! `tasks/cancel` upstream.

use crate::common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// The upstream's `timeout_ms` the replicas are given: the cancel claim's lease is this plus
/// the 5 s margin (`store::cancel_lease`).
const UPSTREAM_TIMEOUT_MS: u64 = 2000;
/// The claim's lease.
const LEASE: Duration = Duration::from_millis(UPSTREAM_TIMEOUT_MS + 5000);

/// `n` replicas on `pg` in front of `upstream`, each started.
fn replicas(pg: &PgCluster, dir: &std::path::Path, upstream: &str, n: usize) -> Vec<Replica> {
    let mut replicas: Vec<Replica> = (0..n)
        .map(|n| {
            let r = Replica::new(dir, n, upstream);
            let toml = std::fs::read_to_string(&r.config).unwrap();
            std::fs::write(
                &r.config,
                format!("{toml}timeout_ms = {UPSTREAM_TIMEOUT_MS}\n"),
            )
            .unwrap();
            r
        })
        .collect();
    for r in &mut replicas {
        r.start(&pg.url);
    }
    replicas
}

/// POSTs `body` on `session` to `/mcp` at `gw`; whatever comes back, if anything, is dropped.
async fn post_ignoring_errors(gw: std::net::SocketAddr, session: String, body: String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(gw).await else {
        return;
    };
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {gw}\r\nMcp-Session-Id: {session}\r\n\
         MCP-Protocol-Version: {PROTOCOL_VERSION}\r\nAccept: {ACCEPT_BOTH}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).await.is_err() || s.write_all(body.as_bytes()).await.is_err() {
        return;
    }
    let _ = s.read_to_end(&mut Vec::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_whose_forwarder_died_is_taken_over_by_its_waiter() {
    let test = "a_cancel_whose_forwarder_died_is_taken_over_by_its_waiter";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    // The status is `cancelled` as soon as the cancel arrives; the answer waits far longer than
    // the test (replica 0 is dead by then). A second cancel finds the task terminal and is
    // answered `-32602` at once.
    let server = TaskServer::start(Behaviour {
        cancel_delay: std::sync::Arc::new(|_| Duration::from_secs(600)),
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut replicas = replicas(&pg, dir.path(), &server.url(), 2);

    let mut c = Client::new(&replicas[0].url());
    c.initialize().await;
    let sid = c.session.clone().expect("the upstream's Mcp-Session-Id");
    let task = c.create_task("\"c1\"").await;

    // Sent raw: its connection is cut by the kill.
    let cancel = rpc(
        "\"x0\"",
        "tasks/cancel",
        &format!("{{\"taskId\":{task:?}}}"),
    );
    let forwarding = tokio::spawn(post_ignoring_errors(
        replicas[0].gateway,
        sid.clone(),
        cancel,
    ));
    assert!(
        server
            .up
            .wait_for_method("tasks/cancel", 1, Duration::from_secs(10))
            .await,
        "replica 0 forwards the cancel"
    );
    sigkill(replicas[0].process.as_mut().unwrap());
    let killed = Instant::now();
    forwarding.abort();

    // The same cancel on replica 1: replica 0's claim is still leased, so it waits on it.
    let v: Value = Client::new(&replicas[1].url())
        .with_session(&sid)
        .cancel("\"x1\"", &task)
        .await;
    let took = killed.elapsed();
    assert_eq!(
        v["result"]["status"], "cancelled",
        "the cancel that worked is answered as one (after {took:?}): {v}"
    );
    assert_eq!(v["result"]["taskId"], task.as_str(), "{v}");
    assert!(
        took < LEASE + Duration::from_secs(1),
        "taken over once the dead replica's lease lapsed ({LEASE:?}), not later: {took:?}"
    );
    assert_eq!(
        server.count("tasks/cancel"),
        1,
        "the dead replica's cancel reached the upstream; none is sent again"
    );

    // From now on the task is terminal on every replica: a later cancel is the 2025 `-32602`.
    let v = Client::new(&replicas[1].url())
        .with_session(&sid)
        .get("\"g1\"", &task)
        .await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
    let v = Client::new(&replicas[1].url())
        .with_session(&sid)
        .cancel("\"x2\"", &task)
        .await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert_eq!(server.count("tasks/cancel"), 1);
}

/// One replica (the real binary) on `pg` in front of `server`, and a database client to plant
/// the claim of a replica that "died" (no process behind it).
async fn one_replica(
    pg: &PgCluster,
    dir: &std::path::Path,
    upstream: &str,
) -> (Replica, tokio_postgres::Client) {
    let mut r = replicas(pg, dir, upstream, 1);
    let (db, conn) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    (r.pop().unwrap(), db)
}

/// Plants cancel claim 1 of `task_id` for a replica that has died: no outcome, its lease ending
/// `lease_ms` from now on the database's clock (negative: already lapsed).
async fn plant_dead_claim(db: &tokio_postgres::Client, task_id: &str, lease_ms: i64) {
    let n = db
        .execute(
            "UPDATE taskgate_tasks SET cancel_generation = 1, cancel_claimed_by = 'dead-replica', \
             cancel_lease_until = (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $2, \
             cancel_outcome = NULL WHERE task_id = $1",
            &[&task_id, &lease_ms],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
}

/// A claim whose replica died before its cancel reached the upstream: the waiter takes it over
/// once it lapses, finds the task still `working` upstream, and forwards the one cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_claim_that_sent_nothing_is_forwarded_by_its_waiter() {
    let test = "a_lapsed_claim_that_sent_nothing_is_forwarded_by_its_waiter";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let server = TaskServer::default().await;
    let dir = tempfile::tempdir().unwrap();
    let (replica, db) = one_replica(&pg, dir.path(), &server.url()).await;
    let mut c = Client::new(&replica.url());
    c.initialize().await;
    let task = c.create_task("\"c1\"").await;
    let planted = Instant::now();
    plant_dead_claim(&db, &task, 1500).await;

    let v = c.cancel("\"x1\"", &task).await;
    let took = planted.elapsed();
    assert_eq!(v["result"]["status"], "cancelled", "after {took:?}: {v}");
    assert!(
        took >= Duration::from_millis(1400),
        "the live claim was waited on: {took:?}"
    );
    assert!(
        took < Duration::from_millis(1500) + Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(server.count("tasks/get"), 1, "the state was read first");
    assert_eq!(server.count("tasks/cancel"), 1, "then the one cancel sent");
    let (generation,): (i64,) = {
        let row = db
            .query_one(
                "SELECT cancel_generation FROM taskgate_tasks WHERE task_id = $1",
                &[&task],
            )
            .await
            .unwrap();
        (row.get(0),)
    };
    assert_eq!(generation, 2, "taken over as claim 2");
}

/// A cancel arriving after a dead replica's claim lapsed, for a task the upstream shows
/// `cancelled` (that replica's cancel reached it): nothing is sent again, and the cancel, which
/// came later, is answered as a 2025-11-25 cancel of a terminal task is (`-32602`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_a_lapsed_claim_reads_the_upstream_first() {
    let test = "a_cancel_after_a_lapsed_claim_reads_the_upstream_first";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let server = TaskServer::default().await;
    let dir = tempfile::tempdir().unwrap();
    let (replica, db) = one_replica(&pg, dir.path(), &server.url()).await;
    let mut c = Client::new(&replica.url());
    c.initialize().await;
    let task = c.create_task("\"c1\"").await;
    // The dead replica's cancel reached the upstream; its answer never reached the registry.
    server
        .state
        .lock()
        .unwrap()
        .tasks
        .get_mut(&task)
        .unwrap()
        .status = "cancelled".into();
    plant_dead_claim(&db, &task, -1).await;

    let v = c.cancel("\"x1\"", &task).await;
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert_eq!(server.count("tasks/cancel"), 0, "nothing sent again");
    assert_eq!(server.count("tasks/get"), 1, "the state was read upstream");
    let v = c.get("\"g1\"", &task).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
}

/// 2026-07-28: a waiter on a claim whose replica died after its cancel reached the upstream
/// takes it over once it lapses, reads the task `cancelled` upstream and answers the ack,
/// nothing sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_waiter_on_a_dead_claim_gets_the_ack() {
    let test = "a_2026_waiter_on_a_dead_claim_gets_the_ack";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let (up, state) = modern_server().await;
    let dir = tempfile::tempdir().unwrap();
    let (replica, db) = one_replica(&pg, dir.path(), &up.url()).await;
    let task = create(&replica.url(), None, "slow_compute").await;
    state
        .lock()
        .unwrap()
        .tasks
        .insert(task.clone(), "cancelled".into());
    let planted = Instant::now();
    plant_dead_claim(&db, &task, 1500).await;

    let (status, v) = task_call(&replica.url(), None, 7, "tasks/cancel", &task).await;
    let took = planted.elapsed();
    assert_eq!(
        (status, &v["result"]["resultType"]),
        (200, &Value::from("complete")),
        "after {took:?}: {v}"
    );
    assert!(
        took < Duration::from_millis(1500) + Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(count(&up, "tasks/cancel"), 0, "nothing sent again");
    let (_, v) = task_call(&replica.url(), None, 8, "tasks/get", &task).await;
    assert_eq!(v["result"]["status"], "cancelled", "{v}");
}
