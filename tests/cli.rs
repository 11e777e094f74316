//! The real binary: `check-config` on good and bad files, `--version` and `--help`, the listening
//! line, exit 0 on SIGTERM or SIGINT, draining in-flight streams up to `drain_timeout_ms`, a missing
//! `${VAR}` at start-up, JSON logs that carry no bodies, and `taskgate tasks list|show` on the
//! PostgreSQL store a config file names.
//!
//! Every test builds the smallest setup that shows its rule and asserts what a user relies on:
//! status codes, JSON-RPC codes, the bytes/ids/headers the upstream received, and SSE events
//! arriving while the upstream still holds the stream open.

use crate::common::*;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

// =============================================================================================
// CLI and config (the real binary)
// =============================================================================================

fn manifest_path(rel: &str) -> String {
    format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// `check-config` accepts a complete file and the shipped default config.
#[test]
fn check_config_accepts_good_files() {
    let b = GatewayBuilder::new()
        .gateway_opt("max_body_bytes = 1024")
        .upstream("default", "http://127.0.0.1:3000/mcp")
        .upstream_opt("timeout_ms = 30000")
        .upstream_opt("connect_timeout_ms = 5000")
        .upstream_opt("forward_authorization = false");
    let f = ConfigFile::from_builder(&b);
    let ran = run_taskgate(&["check-config", f.path_str()], &[]);
    assert!(
        ran.status.success(),
        "{ran:?}\n{}",
        std::fs::read_to_string(&f.path).unwrap()
    );

    let shipped = manifest_path("config/taskgate.toml");
    let ran = run_taskgate(&["check-config", &shipped], &[]);
    assert!(
        ran.status.success(),
        "shipped config/taskgate.toml: {ran:?}"
    );
}

/// An unknown key is an error (exit 1) that names the key and its line.
#[test]
fn check_config_unknown_key_names_key_and_line() {
    let text = "[gateway]\nlisten = \"127.0.0.1:0\"\nlisten_backlog = 5\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\npath = \"data/x\"\n\n[[upstream]]\nname = \"default\"\nurl = \"http://127.0.0.1:3000/mcp\"\n";
    assert_eq!(text.lines().nth(2), Some("listen_backlog = 5"));
    let f = ConfigFile::write(text);
    let ran = run_taskgate(&["check-config", f.path_str()], &[]);
    assert_eq!(ran.status.code(), Some(1), "{ran:?}");
    assert!(
        ran.stderr.contains("listen_backlog"),
        "names the key: {}",
        ran.stderr
    );
    assert!(
        ran.stderr.to_lowercase().contains("line 3"),
        "names line 3: {}",
        ran.stderr
    );

    let text = "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n[store]\npath = \"data/x\"\n\n[[upstream]]\nname = \"default\"\nurl = \"http://127.0.0.1:3000/mcp\"\ntimeout_secs = 3\n";
    assert_eq!(text.lines().nth(12), Some("timeout_secs = 3"));
    let f = ConfigFile::write(text);
    let ran = run_taskgate(&["check-config", f.path_str()], &[]);
    assert_eq!(ran.status.code(), Some(1), "{ran:?}");
    assert!(
        ran.stderr.contains("timeout_secs"),
        "names the key: {}",
        ran.stderr
    );
    assert!(
        ran.stderr.to_lowercase().contains("line 13"),
        "names line 13: {}",
        ran.stderr
    );
}

/// Values of later features (`auth.mode` other than none, `upgrade.enabled = true`) are rejected
/// with an error naming the feature; a missing file is an error too.
#[test]
fn check_config_rejects_bad_feature_settings_and_missing_file() {
    let base = GatewayBuilder::single("http://127.0.0.1:3000/mcp").to_toml(
        "data/x",
        "127.0.0.1:0",
        "127.0.0.1:0",
    );

    let bearer = base.replace("mode = \"none\"", "mode = \"bearer\"");
    assert_ne!(bearer, base);
    let f = ConfigFile::write(&bearer);
    let ran = run_taskgate(&["check-config", f.path_str()], &[]);
    assert_eq!(ran.status.code(), Some(1), "auth.mode = bearer: {ran:?}");
    assert!(
        ran.stderr.contains("auth") || ran.stderr.contains("bearer"),
        "{}",
        ran.stderr
    );

    // The upgrade is built: enabling it is valid, an unknown disconnect policy is not.
    let upgrade = base.replace("enabled = false", "enabled = true");
    assert_ne!(upgrade, base);
    let f = ConfigFile::write(&upgrade);
    let ran = run_taskgate(&["check-config", f.path_str()], &[]);
    assert_eq!(
        ran.status.code(),
        Some(0),
        "upgrade.enabled = true: {ran:?}"
    );
    let bad_policy = base.replace(
        "enabled = false",
        "enabled = true\non_client_disconnect = \"sometimes\"",
    );
    let f = ConfigFile::write(&bad_policy);
    let ran = run_taskgate(&["check-config", f.path_str()], &[]);
    assert_eq!(ran.status.code(), Some(1), "bad policy: {ran:?}");
    assert!(ran.stderr.contains("sometimes"), "{}", ran.stderr);

    let ran = run_taskgate(&["check-config", "/nonexistent/taskgate.toml"], &[]);
    assert_eq!(ran.status.code(), Some(1), "missing file: {ran:?}");
    assert!(!ran.stderr.is_empty());
}

/// `check-config` prints its verdict only after every check: with a PostgreSQL store it does
/// not say "valid" on stdout and then fail the database check with exit 1; a failure prints
/// only the failure (stderr), a success the verdict and the database line (stdout).
#[test]
fn check_config_prints_valid_only_after_the_database_check() {
    let file = "[gateway]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
                [store]\nbackend = \"postgres\"\nurl_env = \"TG_CHECK_DB\"\n\
                [[upstream]]\nname = \"default\"\nurl = \"http://127.0.0.1:9/mcp\"\n";
    let f = ConfigFile::write(file);
    // Nothing listens there: refused at once.
    let dead = format!(
        "postgres://taskgate:hunter2@127.0.0.1:{}/postgres?connect_timeout=2",
        free_port()
    );
    let bad = run_taskgate(&["check-config", f.path_str()], &[("TG_CHECK_DB", &dead)]);
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(bad.stderr.contains("unreachable"), "{}", bad.stderr);
    assert!(
        !bad.stdout.contains("valid") && bad.stdout.trim().is_empty(),
        "a failed check prints no verdict on stdout: {:?}",
        bad.stdout
    );
    let unset = run_taskgate(&["check-config", f.path_str()], &[]);
    assert_eq!(unset.status.code(), Some(1), "{unset:?}");
    assert!(unset.stderr.contains("TG_CHECK_DB"), "{}", unset.stderr);
    assert!(
        unset.stdout.trim().is_empty(),
        "a failed check prints no verdict on stdout: {:?}",
        unset.stdout
    );
}

#[test]
fn version_flag_prints_name_and_version() {
    let ran = run_taskgate(&["--version"], &[]);
    assert!(ran.status.success(), "{ran:?}");
    assert_eq!(
        ran.stdout.trim(),
        format!("taskgate {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn help_lists_subcommands() {
    let ran = run_taskgate(&["--help"], &[]);
    assert!(ran.status.success(), "{ran:?}");
    assert!(
        ran.stdout.contains("serve") && ran.stdout.contains("check-config"),
        "{}",
        ran.stdout
    );
}

/// `serve` prints exactly one listening line on stdout, serves, and exits 0 on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_prints_listening_line_and_exits_0_on_sigterm() {
    let up = Upstream::mcp().await;
    let f = ConfigFile::from_builder(&GatewayBuilder::single(&up.url()));
    let mut p = TaskgateProcess::spawn(&["serve", "--config", f.path_str()], &[]);
    let (gw, admin) = p.listening();
    assert!(gw.ip().is_loopback() && gw.port() != 0, "{gw}");
    assert!(
        admin.ip().is_loopback() && admin.port() != 0 && admin != gw,
        "{admin}"
    );

    let r = Req::get(&format!("http://{admin}/healthz")).send().await;
    assert_eq!(r.status(), 200);
    let r = Req::mcp_post(&format!("http://{gw}/mcp"), rpc("1", "ping", "{}"))
        .send()
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(up.count(), 1);

    p.sigterm();
    let status = p.wait_exit(STEP).expect("exit within 10 s of SIGTERM");
    assert_eq!(status.code(), Some(0), "stderr: {}", p.stderr());
    assert_eq!(
        p.drain_stdout(),
        Vec::<String>::new(),
        "stdout holds only the listening line"
    );
    assert_eq!(
        p.listening_line.as_deref(),
        Some(format!(r#"{{"listening":{{"gateway":"{gw}","admin":"{admin}"}}}}"#).as_str()),
        "the contract's exact line (gateway first, then admin)"
    );
}

/// The listening line means "ready": SIGINT or SIGTERM sent the moment it is printed is a
/// graceful stop with exit 0, never death by the signal (handlers must be installed first).
#[test]
fn binary_signal_right_after_listening_line_exits_0() {
    let f = ConfigFile::from_builder(&GatewayBuilder::single(&dead_url()));
    for round in 0..40 {
        let sig = if round % 2 == 0 {
            libc::SIGINT
        } else {
            libc::SIGTERM
        };
        let mut p = TaskgateProcess::spawn(&["serve", "--config", f.path_str()], &[]);
        p.listening();
        p.signal(sig);
        let status = p.wait_exit(STEP).expect("exit within 10 s of the signal");
        assert_eq!(
            status.code(),
            Some(0),
            "round {round}, signal {sig}: {status:?}; stderr: {}",
            p.stderr()
        );
    }
}

/// `serve` with a header naming an unset `${VAR}` fails to start, naming the variable.
#[test]
fn binary_missing_env_var_fails_to_start() {
    let var = "TASKGATE_IT_BIN_UNSET_VAR";
    let b = GatewayBuilder::single("http://127.0.0.1:3000/mcp").upstream_opt(&format!(
        "headers = {{ Authorization = \"Bearer ${{{var}}}\" }}"
    ));
    let f = ConfigFile::from_builder(&b);
    let mut p = TaskgateProcess::spawn(&["serve", "--config", f.path_str()], &[]);
    let status = p
        .wait_exit(STEP)
        .expect("serve must exit when a variable is missing");
    assert!(!status.success(), "{status:?}");
    assert_eq!(p.drain_stdout(), Vec::<String>::new(), "no listening line");
    let stderr = p.stderr();
    assert!(stderr.contains(var), "stderr names the variable: {stderr}");
}

/// A start error after the other serving threads' runtimes exist (here the admin address is
/// taken; `gateway.threads = 3`) is a clean error naming the address, exit 1, not a panic.
#[test]
fn binary_start_error_with_several_serving_threads_exits_cleanly() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = taken.local_addr().unwrap().to_string();
    let b = GatewayBuilder::single("http://127.0.0.1:3000/mcp").gateway_opt("threads = 3");
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let path = dir.path().join("taskgate.toml");
    std::fs::write(
        &path,
        b.to_toml(store.to_str().unwrap(), "127.0.0.1:0", &admin),
    )
    .unwrap();
    let mut p = TaskgateProcess::spawn(&["serve", "--config", path.to_str().unwrap()], &[]);
    let status = p.wait_exit(STEP).expect("serve must exit");
    let stderr = p.stderr();
    assert_eq!(status.code(), Some(1), "{status:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {admin} (admin)")),
        "{stderr}"
    );
}

/// On SIGTERM an in-flight SSE answer is allowed to finish; new connections are refused; then 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_sigterm_drains_in_flight_stream() {
    let gate = Gate::new();
    let g = gate.clone();
    let up = Upstream::start(move |req| {
        ScriptedResponse::sse(vec![
            ev().id("d-0").data("").into(),
            SseStep::Wait(g.clone()),
            ev().data(&rpc_result(&req.rpc_id_json(), "{\"drained\":true}"))
                .into(),
        ])
    })
    .await;
    let f = ConfigFile::from_builder(
        &GatewayBuilder::single(&up.url()).gateway_opt("drain_timeout_ms = 10000"),
    );
    let mut p = TaskgateProcess::spawn(&["serve", "--config", f.path_str()], &[]);
    let (gw, _) = p.listening();

    let mut s = stream_in_flight(gw, "9").await;

    p.sigterm();
    // The listener closing shows the signal was handled; the stream still holds the exit.
    listener_closes(gw, "still accepting connections after SIGTERM").await;
    assert!(
        p.wait_exit(Duration::ZERO).is_none(),
        "exited with a stream in flight"
    );
    let refused = Req::mcp_post(&format!("http://{gw}/mcp"), rpc("10", "ping", "{}"))
        .try_send()
        .await;
    assert!(
        refused.is_err(),
        "new requests must not be accepted while draining: {:?}",
        refused.map(|r| r.status())
    );

    gate.open();
    let e = s.next_event(STEP).await;
    assert_eq!(e.json()["result"]["drained"], json!(true));
    s.expect_end(STEP).await;
    let status = p.wait_exit(STEP).expect("exit after the stream ended");
    assert_eq!(status.code(), Some(0), "stderr: {}", p.stderr());
}

/// A stream that never ends does not hold shutdown past `drain_timeout_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_sigterm_gives_up_after_drain_timeout() {
    let up = Upstream::start(|_| {
        ScriptedResponse::sse(vec![ev().id("h-0").data("").into(), SseStep::HoldOpen])
    })
    .await;
    let f = ConfigFile::from_builder(
        &GatewayBuilder::single(&up.url()).gateway_opt("drain_timeout_ms = 500"),
    );
    let mut p = TaskgateProcess::spawn(&["serve", "--config", f.path_str()], &[]);
    let (gw, _) = p.listening();
    let _held = stream_in_flight(gw, "1").await;

    let started = Instant::now();
    p.sigterm();
    let status = p
        .wait_exit(Duration::from_secs(5))
        .expect("exit within 5 s with drain_timeout_ms = 500");
    assert_eq!(status.code(), Some(0), "stderr: {}", p.stderr());
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "did not wait for the drain: {:?}",
        started.elapsed()
    );
}

/// The admin listener serves through the drain: after SIGTERM, while an SSE answer still holds
/// the exit, `/metrics` answers (with the drain's counts) and `/readyz` is 503 "draining" (a
/// load balancer stops sending); it closes once the drain has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_admin_serves_metrics_and_not_ready_through_the_drain() {
    let gate = Gate::new();
    let g = gate.clone();
    let up = Upstream::start(move |req| {
        ScriptedResponse::sse(vec![
            ev().id("d-0").data("").into(),
            SseStep::Wait(g.clone()),
            ev().data(&rpc_result(&req.rpc_id_json(), "{\"drained\":true}"))
                .into(),
        ])
    })
    .await;
    let f = ConfigFile::from_builder(
        &GatewayBuilder::single(&up.url()).gateway_opt("drain_timeout_ms = 20000"),
    );
    let mut p = TaskgateProcess::spawn(&["serve", "--config", f.path_str()], &[]);
    let (gw, admin) = p.listening();
    let r = Req::get(&format!("http://{admin}/readyz")).send().await;
    assert_eq!(r.status(), 200, "ready before the stop");

    let mut s = stream_in_flight(gw, "9").await;

    p.sigterm();
    listener_closes(gw, "still accepting MCP connections after SIGTERM").await;
    assert!(
        p.wait_exit(Duration::ZERO).is_none(),
        "exited with a stream in flight"
    );
    // Draining: the admin listener still answers, each request on a new connection as a
    // scraper and a probe make them.
    let metrics = Req::get(&format!("http://{admin}/metrics"))
        .try_send()
        .await;
    let metrics = metrics.expect("/metrics must answer during the drain");
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await;
    assert!(text.contains("taskgate_"), "{text}");
    let ready = Req::get(&format!("http://{admin}/readyz"))
        .try_send()
        .await
        .expect("/readyz must answer during the drain");
    assert_eq!(ready.status(), 503, "not ready while draining");
    let body = ready.text().await;
    assert!(body.contains(r#""draining":true"#), "{body}");
    let health = Req::get(&format!("http://{admin}/healthz"))
        .try_send()
        .await
        .expect("/healthz must answer during the drain");
    assert_eq!(health.status(), 200, "alive while draining");

    gate.open();
    let e = s.next_event(STEP).await;
    assert_eq!(e.json()["result"]["drained"], json!(true));
    s.expect_end(STEP).await;
    let status = p.wait_exit(STEP).expect("exit after the stream ended");
    assert_eq!(status.code(), Some(0), "stderr: {}", p.stderr());
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "the admin listener closes with the process"
    );
}

/// A second SIGTERM (or SIGINT) during the drain ends it at once, logged, instead of waiting
/// for `drain_timeout_ms` (an answer that never ends holds it here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_second_signal_ends_the_drain_at_once() {
    let up = Upstream::start(|_| {
        ScriptedResponse::sse(vec![ev().id("h-0").data("").into(), SseStep::HoldOpen])
    })
    .await;
    let f = ConfigFile::from_builder(
        &GatewayBuilder::single(&up.url()).gateway_opt("drain_timeout_ms = 60000"),
    );
    for second in [libc::SIGTERM, libc::SIGINT] {
        let mut p = TaskgateProcess::spawn(&["serve", "--config", f.path_str()], &[]);
        let (gw, _) = p.listening();
        let _held = stream_in_flight(gw, "1").await;

        p.sigterm();
        // The listener closing shows the first signal was handled and the drain began.
        listener_closes(gw, "still accepting connections after SIGTERM").await;
        assert!(
            p.wait_exit(Duration::from_millis(300)).is_none(),
            "the stream in flight holds the drain"
        );
        let started = Instant::now();
        p.signal(second);
        let status = p
            .wait_exit(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("no exit within 5 s of a second signal {second}"));
        assert_eq!(status.code(), Some(0), "stderr: {}", p.stderr());
        assert!(started.elapsed() < Duration::from_secs(5));
        let stderr = p.stderr();
        assert!(
            stderr.contains("second shutdown signal received"),
            "the forced stop is logged: {stderr}"
        );
    }
}

/// A third SIGTERM or SIGINT, during what is left of a stop after the second ended the drain,
/// exits at once with 128 + the signal's number (130 for SIGINT), logged at warn, as most
/// servers do: what is left of the stop is skipped. The store is left as `kill -9` leaves it
/// (every acknowledged write is on disk already) and opens afterwards. Here what is left is a
/// stdio child that ignores `SIGTERM` and its stdin's end (about 5 s before its `SIGKILL`).
/// Before: the third signal was ignored, unlogged, and the stop ran on to exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_third_signal_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let config = dir.path().join("taskgate.toml");
    let text = format!(
        r#"[gateway]
listen = "127.0.0.1:0"

[admin]
listen = "127.0.0.1:0"

[store]
path = {:?}

[[upstream]]
name = "deaf"
command = ["sh", "-c", "trap '' TERM; while :; do sleep 1; done"]
"#,
        store.to_str().unwrap()
    );
    std::fs::write(&config, text).unwrap();
    let mut p = TaskgateProcess::spawn(&["serve", "--config", config.to_str().unwrap()], &[]);
    let (gw, _) = p.listening();

    p.sigterm();
    listener_closes(gw, "still accepting connections after SIGTERM").await;
    p.sigterm();
    let second = eventually(STEP, || {
        let seen = p.stderr().contains("second shutdown signal received");
        async move { seen.then_some(()) }
    })
    .await;
    assert!(second.is_some(), "stderr: {}", p.stderr());
    assert!(
        p.wait_exit(Duration::ZERO).is_none(),
        "the stop goes on: the child is not ended yet"
    );
    let started = Instant::now();
    p.signal(libc::SIGINT);
    let status = blocking(|| p.wait_exit(Duration::from_secs(2)))
        .unwrap_or_else(|| panic!("no exit within 2 s of a third signal"));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(status.code(), Some(130), "stderr: {}", p.stderr());
    let stderr = p.stderr();
    assert!(
        stderr.contains("third shutdown signal received"),
        "the forced exit is logged: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The store opens (its lock went with the process) and reads.
    assert!(records_in_store(store.to_str().unwrap()).is_empty());
}

/// `--log-format json` writes JSON lines to stderr, and bodies are not logged at info level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_json_logs_without_bodies() {
    let up = Upstream::mcp().await;
    let f = ConfigFile::from_builder(&GatewayBuilder::single(&up.url()));
    let mut p = TaskgateProcess::spawn(
        &["serve", "--config", f.path_str(), "--log-format", "json"],
        &[("RUST_LOG", "info")],
    );
    let (gw, _) = p.listening();
    let marker = "BODY-MARKER-5c1e";
    let r = Req::mcp_post(
        &format!("http://{gw}/mcp"),
        rpc(
            "1",
            "tools/call",
            &format!(r#"{{"name":"x","arguments":{{"secret":"{marker}"}}}}"#),
        ),
    )
    .send()
    .await;
    assert_eq!(r.status(), 200);
    assert!(!r.text().await.is_empty());
    p.sigterm();
    p.wait_exit(STEP).expect("exit");
    let stderr = p.stderr();
    assert!(!stderr.trim().is_empty(), "some logs at info");
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        serde_json::from_str::<Value>(line)
            .unwrap_or_else(|e| panic!("log line not JSON ({e}): {line}"));
    }
    assert!(!stderr.contains(marker), "body logged:\n{stderr}");
}

/// `taskgate tasks list|show --config FILE` reads the `[store]` of the file: with
/// `backend = "postgres"`, the database at its URL (before: only a sled directory, `--store`),
/// while the gateway runs; a database without taskgate's schema is a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_list_and_show_read_a_postgres_store() {
    let Some(pg) = PgCluster::start("tasks_list_and_show_read_a_postgres_store") else {
        return;
    };
    let up = TaskServer::default().await;
    let config = TgConfig::new(&up.url()).token("alice", "alice-token");
    let env = "TG_CLI_DB";
    let tg = tg_on_pg(&config, env, &pg.url).await;
    let mut alice = tg.client().with_token("alice-token");
    alice.initialize().await;
    let task = alice.create_task("1").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tier.toml");
    let toml = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [store]\nbackend = \"postgres\"\nurl_env = {env:?}\n\n\
         [[upstream]]\nname = \"default\"\nurl = \"http://127.0.0.1:9/mcp\"\n"
    );
    std::fs::write(&file, toml).unwrap();
    let f = file.to_str().unwrap();
    let db = pg.url.as_str();
    let listed = blocking(|| {
        run_taskgate(
            &["tasks", "list", "--config", f, "--owner", "principal:alice"],
            &[(env, db)],
        )
    });
    assert!(listed.status.success(), "{}", listed.stderr);
    let lines: Vec<Value> = listed
        .stdout
        .lines()
        .map(|l| parse_json(l.as_bytes()))
        .collect();
    assert_eq!(lines.len(), 1, "{}", listed.stdout);
    assert_eq!(lines[0]["task_id"], json!(task));
    let shown = blocking(|| {
        run_taskgate(
            &["tasks", "show", "--config", f, "default", task.as_str()],
            &[(env, db)],
        )
    });
    assert!(shown.status.success(), "{}", shown.stderr);
    let v = parse_json(shown.stdout.as_bytes());
    assert_eq!(v["task"]["owner"], json!("principal:alice"), "{v}");
    assert!(v["audit"].is_array(), "{v}");

    // A database taskgate never ran on: said so, and nothing is created in it.
    let (client, conn) = tokio_postgres::connect(db, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("CREATE DATABASE tg_cli_bare")
        .await
        .unwrap();
    let (base, query) = db.split_once('?').unwrap_or((db, ""));
    let bare = format!("{}/tg_cli_bare?{query}", base.rsplit_once('/').unwrap().0);
    let none =
        blocking(|| run_taskgate(&["tasks", "list", "--config", f], &[(env, bare.as_str())]));
    assert!(!none.status.success());
    assert!(
        none.stderr.contains("no taskgate schema"),
        "{}",
        none.stderr
    );
    drop(tg);
}

/// A `tools/call` to taskgate at `gw` (JSON-RPC id `id`) whose SSE answer is open, its first
/// event read: a stream in flight that holds a drain.
async fn stream_in_flight(gw: std::net::SocketAddr, id: &str) -> SseReader {
    let r = Req::mcp_post(
        &format!("http://{gw}/mcp"),
        rpc(id, "tools/call", r#"{"name":"x"}"#),
    )
    .header("mcp-protocol-version", PROTOCOL_VERSION)
    .send()
    .await;
    let mut s = r.sse();
    s.next_event(STEP).await;
    s
}

/// Waits (at most `STEP`) for taskgate's listener at `gw` to refuse connections: the stop
/// signal was handled. Fails with `why` otherwise.
async fn listener_closes(gw: std::net::SocketAddr, why: &str) {
    let closed = eventually(STEP, || async move {
        tokio::net::TcpStream::connect(gw)
            .await
            .is_err()
            .then_some(())
    })
    .await;
    assert!(closed.is_some(), "{why}");
}
