//! The cross-replica cancel claim holds for as long as its forward can run (issue 29, item 7),
//! the store writes the forwarding replica makes before the upstream call included.
//!
//! Reproduced on the code before the fix: replica A's database answers one round trip a second
//! (a paced proxy); A claims a `tasks/cancel` with a lease of the upstream's `timeout_ms`
//! (500 ms here) plus the 5 s margin, then spends more than that margin on its store writes
//! (`cancel_requested_at`, its audit event) before the upstream call. Meanwhile the lease runs
//! out, replica B (a fast database path) claims the same cancel and forwards it, and A forwards
//! its own afterwards: the upstream got two `tasks/cancel` for one task.

use crate::common::*;
use std::time::Duration;

/// `(cancel_generation, cancel_lease_until, the database's clock now)` of `task_id`'s row, both
/// times in ms on the database's clock.
async fn claim_row(db: &tokio_postgres::Client, task_id: &str) -> (i64, Option<i64>, i64) {
    let row = db
        .query_one(
            "SELECT cancel_generation, cancel_lease_until, \
             (extract(epoch FROM clock_timestamp()) * 1000)::bigint \
             FROM taskgate_tasks WHERE task_id = $1",
            &[&task_id],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// POSTs `body` to `/mcp` at `gw` as alice on `session` and returns the whole raw response:
/// a request through a database answering once a second takes longer than the test client's
/// 10 s wait for response headers.
async fn slow_post(gw: std::net::SocketAddr, session: String, body: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(gw).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {gw}\r\nAuthorization: Bearer alice-token\r\n\
         Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: {PROTOCOL_VERSION}\r\n\
         Accept: {ACCEPT_BOTH}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_database_does_not_let_a_second_replica_forward_the_cancel() {
    let test = "a_slow_database_does_not_let_a_second_replica_forward_the_cancel";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let up = TaskServer::default().await;
    let config = TgConfig::new(&up.url())
        .token("alice", "alice-token")
        .tasks("sweep_interval_ms = 600000");
    // A 500 ms upstream timeout: the claim's lease is 5.5 s.
    let start = |env: &'static str, url: String| {
        std::env::set_var(env, url);
        let config = config.clone();
        async move {
            Tg::start(move |store| {
                format!(
                    "{}timeout_ms = 500\n",
                    config.to_toml(store).replace(
                        &format!("[store]\npath = {store:?}\n"),
                        &format!(
                            "[store]\nbackend = \"postgres\"\nurl_env = {env:?}\npool_size = 4\n"
                        ),
                    )
                )
            })
            .await
        }
    };
    let proxy = BlackHole::start(&pg.url).await;
    let via = proxy.url(&pg.url);
    let sep = if via.contains('?') { '&' } else { '?' };
    // The query bound well above the slow database's answers (this is slow, not unreachable).
    let a = start("TG_LEASE_A_DB", format!("{via}{sep}connect_timeout=30")).await;
    let b = start("TG_LEASE_B_DB", pg.url.clone()).await;
    let (db, conn) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);

    let mut on_b = b.client().with_token("alice-token");
    on_b.initialize().await;
    let task = on_b.create_task("1").await;
    let mut on_a = a.client().with_token("alice-token");
    on_a.initialize().await;

    // A's database now answers one round trip a second.
    proxy.pace(Duration::from_secs(1));
    let cancel_a = tokio::spawn(slow_post(
        a.gw,
        on_a.session.clone().unwrap(),
        rpc("\"a\"", "tasks/cancel", &format!("{{\"taskId\":{task:?}}}")),
    ));
    // A's claim is made: its lease ends at `first_until` on the database's clock.
    let first_until = eventually(Duration::from_secs(60), || {
        let (db, task) = (&db, &task);
        async move {
            match claim_row(db, task).await {
                (1, Some(until), _) => Some(until),
                _ => None,
            }
        }
    })
    .await
    .expect("replica A claims the cancel");
    // That lease's end passes while A is still making its store writes: nothing went upstream.
    let passed = eventually(Duration::from_secs(60), || {
        let (db, task) = (&db, &task);
        async move { (claim_row(db, task).await.2 > first_until + 200).then_some(()) }
    })
    .await;
    assert!(passed.is_some(), "the database's clock moves on");
    assert_eq!(
        up.count("tasks/cancel"),
        0,
        "the scenario: A's forward has not started when its first lease ends"
    );

    // Replica B is asked to cancel the same task now.
    let v = tokio::time::timeout(Duration::from_secs(60), on_b.cancel("\"b\"", &task))
        .await
        .expect("B answers");
    let v_a = tokio::time::timeout(Duration::from_secs(120), cancel_a)
        .await
        .expect("A answers")
        .unwrap();
    assert_eq!(
        up.count("tasks/cancel"),
        1,
        "one tasks/cancel upstream for one task (A: {v_a}; B: {v})"
    );
    assert!(
        v_a.starts_with("HTTP/1.1 200") && v_a.contains(r#""status":"cancelled""#),
        "A forwarded it and got the upstream's answer: {v_a}"
    );
    let (generation, _, _) = claim_row(&db, &task).await;
    assert_eq!(generation, 1, "no second claim was granted");
}
