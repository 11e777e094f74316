//! A PostgreSQL store that stops answering (a proxy in front of the server stops forwarding: no
//! answer, no error, TCP stays up, as behind a black-holed network or a stuck server) fails each
//! store call within its bound instead of holding the client's request forever: a `tasks/get`
//! gets `-32603` "task store unavailable", a creation is refused, both counted in
//! `taskgate_store_write_failures_total`; the gateway serves other requests meanwhile; once the
//! database answers again, tasks are served and created again (the connections that did not
//! answer were closed, not pooled again). `check-config`'s probe of such a database fails in
//! time too. And a database that answers, slowly (a paced link), is not taken for one that does
//! not: pages of records that keep arriving are read whole, and restart counts the store.

use crate::common::*;
use serde_json::json;
use std::time::Duration;

/// Generous: the bound under test is the URL's `connect_timeout` (1 s here) plus the pool's own
/// (5 s to open a connection); this only tells "answered with the error" from "never answered"
/// (the test client itself gives up on response headers after 10 s).
const ANSWERED_WITHIN: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswering_database_fails_store_calls_in_time_and_the_gateway_recovers() {
    let test = "an_unanswering_database_fails_store_calls_in_time_and_the_gateway_recovers";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let proxy = BlackHole::start(&pg.url).await;
    let via = proxy.url(&pg.url);
    let sep = if via.contains('?') { '&' } else { '?' };
    let url = format!("{via}{sep}connect_timeout=1");
    let up = TaskServer::default().await;
    let config = TgConfig::new(&up.url()).token("alice", "alice-token");
    let tg = tg_on_pg(&config, "TG_UNANSWERED_DB", &url).await;
    let mut c = tg.client().with_token("alice-token");
    c.initialize().await;
    let task = c.create_task("1").await;
    assert_eq!(c.get("2", &task).await["result"]["taskId"], json!(task));
    let failures = |text: &str| metric(text, "taskgate_store_write_failures_total", &[]);
    let before = failures(&tg.metrics_text().await);

    proxy.stop();
    let get = tokio::spawn({
        let (c, task) = (c.clone(), task.clone());
        async move { c.get("3", &task).await }
    });
    // Meanwhile the gateway serves what needs no store.
    let v = answered("tools/list", c.rpc(rpc("4", "tools/list", "{}"))).await;
    assert!(v["result"].is_object(), "passed on and answered: {v}");
    let v = answered("tasks/get", async { get.await.unwrap() }).await;
    assert_eq!(err_code(&v), -32603, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("task store unavailable")),
        "{v}"
    );
    let v = answered("a creation", c.rpc(Client::create_body("5", Some(60_000)))).await;
    assert_eq!(err_code(&v), -32603, "the creation is refused: {v}");
    let after = failures(&tg.metrics_text().await);
    assert!(after >= before + 2.0, "counted: {before} -> {after}");

    proxy.resume();
    let back = eventually(ANSWERED_WITHIN, || {
        let (c, task) = (c.clone(), task.clone());
        async move {
            let v = c.get("6", &task).await;
            (v["result"]["taskId"] == json!(task)).then_some(())
        }
    })
    .await;
    assert!(back.is_some(), "tasks/get is served again");
    // Every time: no connection that missed its answers went back to the pool (4 connections).
    for i in 0..10 {
        let v = c.get(&format!("\"again-{i}\""), &task).await;
        assert_eq!(
            v["result"]["taskId"],
            json!(task),
            "after the database is back: {v}"
        );
    }
    let again = c.create_task("7").await;
    assert_eq!(c.get("8", &again).await["result"]["taskId"], json!(again));
}

/// What `call` answers, or a failure naming `what` when it does not answer in
/// [`ANSWERED_WITHIN`].
async fn answered(
    what: &str,
    call: impl std::future::Future<Output = serde_json::Value>,
) -> serde_json::Value {
    tokio::time::timeout(ANSWERED_WITHIN, call)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer while the database does not answer"))
}

/// A database that answers, slowly (the proxy passes every byte, paced: a slow link): restart
/// still counts the store. The start-up count reads each record's head only (owner, status, the
/// cancellation facts), not the whole record with its stored result, so a page of the count is
/// small and comes within the query bound, which is meant for a database that does not answer.
/// Before, a page was 500 whole records (here 8 KiB of stored result each, 4 MiB): not read
/// within the bound, start-up was refused ("no answer within 1000 ms").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_counts_a_store_of_big_records_over_a_slow_link() {
    use std::sync::Arc;
    use taskgate::config::TasksConfig;
    use taskgate::metrics::Metrics;
    use taskgate::registry::Registry;
    use taskgate::store::TaskStore;
    let test = "restart_counts_a_store_of_big_records_over_a_slow_link";
    let Some((_pg, _proxy, slow, owner)) = big_records_over_a_slow_link(test).await else {
        return;
    };
    let metrics = Arc::new(Metrics::new(&["up".to_string()]));
    let counted = {
        let metrics = metrics.clone();
        tokio::task::spawn_blocking(move || {
            Registry::new(slow as Arc<dyn TaskStore>, metrics, TasksConfig::default())
        })
        .await
        .unwrap()
    };
    let registry = counted.unwrap_or_else(|e| panic!("start-up over a slow link: {e}"));
    assert_eq!(registry.owners_count("up", &owner), 10);
    assert_eq!(metrics.tasks_cancelled_unreleased.get(), 1);
}

/// `taskgate check-config`'s probe of a database that does not answer (the proxy forwards
/// nothing from the first byte: TCP is up, no answer, as with a stopped server) ends with an
/// error saying so within its bound (the URL's `connect_timeout`, 1 s here, twice for the
/// connection's start-up), not when the server gives up on the unfinished start-up
/// (`authentication_timeout`, 1 min).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_probe_of_an_unanswering_database_fails_in_time() {
    let test = "check_config_probe_of_an_unanswering_database_fails_in_time";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let proxy = BlackHole::start(&pg.url).await;
    proxy.stop();
    let via = proxy.url(&pg.url);
    let sep = if via.contains('?') { '&' } else { '?' };
    let url = format!("{via}{sep}connect_timeout=1");
    let probed = tokio::time::timeout(
        Duration::from_secs(30),
        taskgate::store::PgStore::probe(&url, taskgate::tls::Trust::default()),
    )
    .await
    .expect("check-config's probe got no answer in 30 s");
    let err = probed.expect_err("nothing answered").to_string();
    assert!(err.contains("no answer within 2000 ms"), "{err}");
}

/// 500 records (one page of a store scan) of `owner` on upstream `up`: 10 `working`, one
/// `cancelled` (not released), the rest `completed` with 8 KiB of stored result each (4 MiB).
/// A throwaway cluster holding [`store_big_records`] of an owner with a quote in its name, and a
/// store reaching it through a proxy that passes every byte 10 ms apart (a slow link), with
/// `connect_timeout=1` (the query bound: 1 s). `None` without PostgreSQL here.
async fn big_records_over_a_slow_link(
    test: &str,
) -> Option<(
    PgCluster,
    BlackHole,
    std::sync::Arc<taskgate::store::PgStore>,
    taskgate::store::Owner,
)> {
    let pg = PgCluster::start(test)?;
    let owner = taskgate::store::Owner::Session("s\"1".into());
    store_big_records(&pg.url, &owner).await;
    let proxy = BlackHole::start(&pg.url).await;
    let via = proxy.url(&pg.url);
    let sep = if via.contains('?') { '&' } else { '?' };
    let url = format!("{via}{sep}connect_timeout=1");
    let slow = taskgate::store::PgStore::open(&url, 2, taskgate::tls::Trust::default())
        .await
        .unwrap();
    proxy.pace(Duration::from_millis(10));
    Some((pg, proxy, slow, owner))
}

async fn store_big_records(url: &str, owner: &taskgate::store::Owner) {
    use taskgate::mcp::era::Era;
    use taskgate::mcp::task::TaskStatus;
    use taskgate::store::{Origin, PgStore, TaskRecord, TaskStore};
    let store = PgStore::open(url, 4, taskgate::tls::Trust::default())
        .await
        .unwrap();
    let result = format!(
        "{{\"content\":[{{\"type\":\"text\",\"text\":\"{}\"}}]}}",
        "x".repeat(8192)
    );
    for i in 0..500u64 {
        let status = match i {
            0..=9 => TaskStatus::Working,
            10 => TaskStatus::Cancelled,
            _ => TaskStatus::Completed,
        };
        let record = TaskRecord {
            upstream: "up".into(),
            task_id: format!("t{i}"),
            owner: owner.clone(),
            upstream_session: Some("s1".into()),
            origin: Origin::Client,
            tool: Some("slow".into()),
            protocol_version: None,
            status,
            status_message: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            last_updated_at: "2026-01-01T00:00:00Z".into(),
            ttl_ms: Some(60_000),
            poll_interval_ms: None,
            recorded_at: i,
            cancel_requested_at: None,
            cancelled_at: (status == TaskStatus::Cancelled).then_some(5),
            released_at: None,
            terminal_at: status.is_terminal().then_some(5),
            late_result_at: None,
            expires_at: u64::MAX / 4,
            era: Era::Legacy,
            terminal_result: (status == TaskStatus::Completed).then(|| result.clone()),
            trace_parent: None,
            tool_error: false,
            terminal_error: None,
            input_requests: None,
            cancel_acked: false,
        };
        store.create(record).await.unwrap();
    }
    drop(store);
}

/// Whole records over a slow link (the proxy passes every byte, paced): a scan page of 500
/// records with 8 KiB of stored result each (`/admin/tasks`, `taskgate tasks list`) and an
/// owner's page of 256 (`/admin/tasks?owner=…&upstream=…`; `tasks/list` at a large
/// `tasks.list_page_size`) arrive, because the query bound is on the wait for each row, not on
/// the whole answer (before: "no answer within 1000 ms", the answer arriving all along).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_whole_records_arrive_over_a_slow_link() {
    use std::sync::Arc;
    use taskgate::store::TaskStore;
    let test = "pages_of_whole_records_arrive_over_a_slow_link";
    let Some((_pg, _proxy, slow, owner)) = big_records_over_a_slow_link(test).await else {
        return;
    };
    let slow: Arc<dyn TaskStore> = slow;
    let (scanned, listed) = tokio::task::spawn_blocking(move || {
        let mut n = 0;
        let scanned = slow.scan(&mut |_| {
            n += 1;
            true
        });
        let listed = slow.list_owner("up", &owner, None, 256);
        (scanned.map(|()| n), listed)
    })
    .await
    .unwrap();
    assert_eq!(scanned.expect("a scan over a slow link"), 500);
    let (page, next) = listed.expect("an owner's page over a slow link");
    assert_eq!(page.len(), 256);
    assert!(next.is_some());
}
