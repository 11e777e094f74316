//! A PostgreSQL store that does not answer (issue 29, item 8) must cost only what needs the
//! store: store calls wait on the registry's own store threads, within their bounds, while a
//! plain `tools/call` (which never touches the store) is still answered, its upstream connection
//! included, whose host name is looked up on the runtime's blocking pool.
//!
//! Reproduced on the code before the fix: every store call parked a thread of that blocking
//! pool for up to about three times the URL's `connect_timeout` (15 s by default); with enough
//! of them in flight (512 per serving runtime in the binary; the runtime here has 4 so the
//! test needs few requests) a plain call whose upstream needed a new connection queued its DNS
//! look-up behind them and failed (502 after `upstream.connect_timeout_ms`).

use crate::common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// An `initialize`'s params (2025-11-25, no capabilities).
const INITIALIZE: &str =
    r#"{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}"#;

/// Blocking threads of the runtime taskgate serves on in this test (the binary's have 512).
const BLOCKING_THREADS: usize = 4;

/// Concurrent `tasks/get` loops keeping store calls in flight: far more than the blocking
/// threads, so before the fix the pool stays full with a queue behind it.
const STORE_CALLERS: usize = 32;

/// A plain call is answered within this (generous for a loopback upstream; below the upstream's
/// `connect_timeout_ms` of 5 s, which a queued DNS look-up ran into before the fix).
const PLAIN_WITHIN: Duration = Duration::from_secs(4);

/// What keeps store calls in flight while the database is black-holed.
#[derive(Clone, Copy)]
enum Load {
    /// `tasks/get` of a task (the registry's store calls): answered `-32603` "task store
    /// unavailable".
    TasksGet,
    /// `initialize` of new sessions, each written to the store before its answer (the session
    /// table's store calls): answered HTTP 500 `-32603`. Reproduced on the code before they
    /// ran on the registry's store threads: they parked the serving runtime's blocking pool as
    /// the registry's calls once did, and the plain call failed.
    Initialize,
}

#[test]
fn plain_calls_keep_working_while_the_database_is_black_holed() {
    black_holed(
        Load::TasksGet,
        "plain_calls_keep_working_while_the_database_is_black_holed",
    );
}

#[test]
fn plain_calls_keep_working_while_initializes_wait_for_a_black_holed_database() {
    black_holed(
        Load::Initialize,
        "plain_calls_keep_working_while_initializes_wait_for_a_black_holed_database",
    );
}

fn black_holed(load: Load, test: &'static str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(black_holed_database_leaves_plain_calls_alone(load, test));
    runtime.shutdown_timeout(Duration::from_secs(5));
}

async fn black_holed_database_leaves_plain_calls_alone(load: Load, test: &'static str) {
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let proxy = BlackHole::start(&pg.url).await;
    let via = proxy.url(&pg.url);
    let sep = if via.contains('?') { '&' } else { '?' };
    let url = format!("{via}{sep}connect_timeout=1");
    let tasks = TaskServer::default().await;
    let plain = Upstream::mcp().await;
    // A host name, not an address: a new connection to it needs a DNS look-up.
    let plain_url = format!("http://localhost:{}/mcp", plain.addr.port());
    let env = match load {
        Load::TasksGet => "TG_STORE_UNREACHABLE_DB",
        Load::Initialize => "TG_STORE_UNREACHABLE_DB_INIT",
    };
    std::env::set_var(env, &url);
    let tg = Tg::start(|_| {
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\nthreads = 1\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n\
             [store]\nbackend = \"postgres\"\nurl_env = {env:?}\npool_size = 4\n\n\
             [auth]\nmode = \"none\"\n\n\
             [[upstream]]\nname = \"tasks\"\nurl = {:?}\n\n\
             [[upstream]]\nname = \"plain\"\nurl = {plain_url:?}\n",
            tasks.url()
        )
    })
    .await;
    let base = format!("http://{}/mcp", tg.gw);
    let mut c = Client::new(&format!("{base}/tasks"));
    c.initialize().await;
    let task = c.create_task("1").await;
    assert_eq!(
        c.get("2", &task).await["result"]["taskId"],
        serde_json::json!(task)
    );

    proxy.stop();
    let stop = Arc::new(AtomicBool::new(false));
    let (failed_tx, mut failed_rx) = tokio::sync::mpsc::unbounded_channel();
    let callers: Vec<_> = (0..STORE_CALLERS)
        .map(|n| {
            let (c, task, stop, failed) =
                (c.clone(), task.clone(), stop.clone(), failed_tx.clone());
            // A client of its own for each initialize (no session header).
            let fresh = Client::new(&format!("{base}/tasks"));
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let id = format!("\"g{n}-{i}\"");
                    let r = match load {
                        Load::TasksGet => {
                            c.send(rpc(&id, "tasks/get", &format!("{{\"taskId\":{task:?}}}")))
                                .await
                        }
                        Load::Initialize => fresh.send(rpc(&id, "initialize", INITIALIZE)).await,
                    };
                    let status = r.status();
                    let v: serde_json::Value =
                        serde_json::from_slice(&r.bytes().await).unwrap_or_default();
                    let _ = failed.send((status, err_code(&v)));
                }
            })
        })
        .collect();
    // The event: store calls have been failing for a while (the black hole has bitten and the
    // store threads, or before the fix the blocking pool, are full of parked calls).
    let first = tokio::time::timeout(Duration::from_secs(60), failed_rx.recv())
        .await
        .expect("a tasks/get answers while the database does not")
        .unwrap();
    let unavailable = match load {
        Load::TasksGet => (200, -32603),
        Load::Initialize => (500, -32603),
    };
    assert_eq!(first, unavailable, "task store unavailable");

    let plain_client = Client::new(&format!("{base}/plain"));
    let started = tokio::time::Instant::now();
    let answered = tokio::time::timeout(
        PLAIN_WITHIN,
        plain_client.send(rpc(
            "\"plain\"",
            "tools/call",
            r#"{"name":"echo","arguments":{}}"#,
        )),
    )
    .await;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let answered = answered.unwrap_or_else(|_| {
        panic!("a plain tools/call got no answer in {PLAIN_WITHIN:?} while the database is black-holed")
    });
    let status = answered.status();
    let body = answered.text().await;
    assert_eq!(
        status, 200,
        "a plain tools/call while the database is black-holed ({elapsed:?}): {body}"
    );
    assert!(
        body.contains("\"echo\":\"tools/call\""),
        "the upstream's answer: {body}"
    );
    assert_eq!(plain.received("tools/call").len(), 1);
    // Every store call still ends within its bound (each caller's loop sees its answer).
    for h in callers {
        tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .expect("every store call ends within its bound")
            .unwrap();
    }
    while let Ok((status, code)) = failed_rx.try_recv() {
        assert_eq!((status, code), unavailable, "task store unavailable");
    }
}

/// Every wait of a PostgreSQL store call follows the URL's `connect_timeout`: the query's
/// answer, and the pool's waits for a free connection and for a new one. With the database
/// black-holed and `connect_timeout=1`, two concurrent calls on a pool of one connection (the
/// first's answer never comes; the second waits for the pool, then for a new connection that
/// never starts) both fail within three times that. Before the fix the pool's waits were a
/// fixed 5 s each: the second call failed after about 6 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_call_waits_at_most_three_connect_timeouts() {
    use taskgate::store::{PgStore, TaskStore};
    let test = "a_store_call_waits_at_most_three_connect_timeouts";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let proxy = BlackHole::start(&pg.url).await;
    let via = proxy.url(&pg.url);
    let sep = if via.contains('?') { '&' } else { '?' };
    let store = PgStore::open(
        &format!("{via}{sep}connect_timeout=1"),
        1,
        taskgate::tls::Trust::default(),
    )
    .await
    .unwrap();
    proxy.stop();
    let call = |n: u32| {
        let store = store.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let got = store.get("up", &format!("t{n}"));
            let _ = tx.send((got.map(|_| ()), started.elapsed()));
        });
        async move {
            tokio::time::timeout(Duration::from_secs(60), rx)
                .await
                .expect("the store call ends")
                .unwrap()
        }
    };
    let (a, b) = tokio::join!(call(1), call(2));
    for (got, took) in [a, b] {
        let err = got.expect_err("the database does not answer").to_string();
        assert!(
            took < Duration::from_millis(3_900),
            "failed after {took:?} (bound: 3 x connect_timeout of 1 s): {err}"
        );
    }
}
