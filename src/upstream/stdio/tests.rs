//! The stdio transport against the scripted server `tests/stdio/fake_server.py`: one shared
//! child initialized once, sessions per client, ids mapped both ways, a killed child's waiting
//! requests answered with an error naming the upstream, and its restart.

use super::*;
use crate::exchange::{Principal, RequestContext, RequestParts};
use crate::mcp::era::Era;
use futures_util::StreamExt;

const SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/stdio/fake_server.py");

struct Fixture {
    transport: Arc<StdioTransport>,
    handle: StdioHandle,
    dir: std::path::PathBuf,
}

impl Fixture {
    fn new(extra: &str) -> Fixture {
        Fixture::with_env(extra, "")
    }

    /// `extra`: lines of the upstream's table; `env`: lines of its `[env]` (the fake server's
    /// switches).
    fn with_env(extra: &str, env: &str) -> Fixture {
        let dir = std::env::temp_dir().join(format!(
            "tg-stdio-unit-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        // 3 s unless `extra` says otherwise.
        let timeout = if extra.contains("timeout_ms") {
            ""
        } else {
            "timeout_ms = 3000"
        };
        let config: UpstreamConfig = toml::from_str(&format!(
            "name = \"kid\"\ncommand = [\"python3\", \"{SERVER}\"]\n{timeout}\n{extra}\n[env]\nSTDIO_LOG = \"{}\"\nSTDIO_PIDS = \"{}\"\n{env}\n",
            dir.join("log").display(),
            dir.join("pids").display()
        ))
        .expect("config");
        let metrics = Arc::new(Metrics::new(&["kid".to_string()]));
        let transport = StdioTransport::new(&config, metrics, PER_SESSION_IDLE).expect("command");
        let handle = transport.handle();
        Fixture {
            transport: Arc::new(transport),
            handle,
            dir,
        }
    }

    async fn send(&self, session: Option<&str>, text: &str) -> Result<McpReply, GatewayError> {
        self.send_with(session, text, http::Extensions::new()).await
    }

    async fn send_with(
        &self,
        session: Option<&str>,
        text: &str,
        extensions: http::Extensions,
    ) -> Result<McpReply, GatewayError> {
        let req = McpRequest::from(RequestParts {
            op: Operation::Post(Message::parse(Bytes::from(text.to_string())).expect("json")),
            ctx: RequestContext {
                upstream: "kid".into(),
                client_session_id: None,
                session_id: session.map(|s| HeaderValue::from_str(s).expect("ascii")),
                principal: Principal::Anonymous,
                client_addr: None,
                headers: HeaderMap::new(),
            },
            extensions,
            trace: None,
        });
        self.transport.clone().exchange(req).await
    }

    /// The lines the child read, parsed.
    fn seen(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.join("log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("pids"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    async fn ready(&self) {
        for _ in 0..200 {
            if self.handle.readiness().is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the child never became live: {:?}", self.handle.readiness());
    }
}

static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

async fn body(reply: McpReply) -> Vec<serde_json::Value> {
    match reply.body {
        ReplyBody::Json(b) => vec![serde_json::from_slice(&b).expect("json")],
        ReplyBody::Stream(s) => {
            s.filter_map(|e| async move { e.data.and_then(|d| serde_json::from_str(&d).ok()) })
                .collect()
                .await
        }
        other => panic!("unexpected body {other:?}"),
    }
}

async fn initialize(f: &Fixture, id: &str) -> (String, serde_json::Value) {
    let reply = f
        .send(
            None,
            &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"c","version":"1"}}}}}}"#),
        )
        .await
        .expect("initialize answered");
    let session = reply
        .headers
        .get("mcp-session-id")
        .expect("a session")
        .to_str()
        .expect("ascii")
        .to_string();
    (session, body(reply).await.remove(0))
}

#[test]
fn backoff_doubles_up_to_its_cap() {
    let mut b = Backoff::default();
    assert_eq!(b.take(), BACKOFF_START);
    assert_eq!(b.take(), BACKOFF_START * 2);
    for _ in 0..20 {
        b.take();
    }
    assert_eq!(b.take(), BACKOFF_MAX);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_child_is_initialized_once_and_clients_keep_their_own_ids() {
    let f = Fixture::new("");
    f.ready().await;
    let (s1, a1) = initialize(&f, "1").await;
    let (s2, a2) = initialize(&f, "\"one\"").await;
    assert_ne!(s1, s2);
    assert_eq!(a1["result"], a2["result"], "both get the child's answer");
    assert_eq!(a1["id"], 1);
    assert_eq!(a2["id"], "one");
    // Two clients, the same id, at once: each gets its own answer.
    let call = |text: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}","delay_ms":200}}}}}}"#
        )
    };
    let (c1, c2) = (call("from-1"), call("from-2"));
    let (r1, r2) = tokio::join!(f.send(Some(&s1), &c1), f.send(Some(&s2), &c2));
    let (r1, r2) = (
        body(r1.expect("answer")).await,
        body(r2.expect("answer")).await,
    );
    assert_eq!(r1[0]["id"], 5);
    assert_eq!(r1[0]["result"]["content"][0]["text"], "from-1");
    assert_eq!(r2[0]["id"], 5);
    assert_eq!(r2[0]["result"]["content"][0]["text"], "from-2");
    let seen = f.seen();
    let inits = seen.iter().filter(|m| m["method"] == "initialize").count();
    assert_eq!(inits, 1, "one initialize reached the child: {seen:?}");
    let ids: Vec<_> = seen
        .iter()
        .filter(|m| m["method"] == "tools/call")
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1], "the child saw two ids");
    // An unknown session is 404.
    let unknown = f
        .send(
            Some("tgs-nope"),
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        )
        .await
        .expect("answered");
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    f.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_comes_back_with_the_clients_token_and_cancelled_names_the_childs_id() {
    let f = Fixture::new("");
    f.ready().await;
    let (s1, _) = initialize(&f, "1").await;
    let reply = f
        .send(
            Some(&s1),
            r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"echo","arguments":{"text":"x"},"_meta":{"progressToken":"tok"}}}"#,
        )
        .await
        .expect("answer");
    let messages = body(reply).await;
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0]["params"]["progressToken"], "tok");
    assert_eq!(messages[1]["id"], "a");

    let slow = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"text":"late","delay_ms":1500}}}"#;
    let pending = {
        let t = f.transport.clone();
        let s1 = s1.clone();
        let f2 = Fixture {
            transport: t,
            handle: f.handle.clone(),
            dir: f.dir.clone(),
        };
        tokio::spawn(async move { f2.send(Some(&s1), slow).await.map(|_| ()) })
    };
    // Wait until the child saw the call, then cancel it by the client's id.
    let mut child_id = serde_json::Value::Null;
    for _ in 0..100 {
        if let Some(m) = f
            .seen()
            .into_iter()
            .find(|m| m["params"]["arguments"]["text"] == "late")
        {
            child_id = m["id"].clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(child_id.is_u64(), "the child saw the call");
    let accepted = f
        .send(
            Some(&s1),
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":9,"reason":"no"}}"#,
        )
        .await
        .expect("accepted");
    assert_eq!(accepted.status, StatusCode::ACCEPTED);
    for _ in 0..100 {
        if f.seen()
            .iter()
            .any(|m| m["method"] == "notifications/cancelled")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled: Vec<_> = f
        .seen()
        .into_iter()
        .filter(|m| m["method"] == "notifications/cancelled")
        .collect();
    assert_eq!(cancelled.len(), 1);
    assert_eq!(cancelled[0]["params"]["requestId"], child_id);
    let _ = pending.await;
    f.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_child_fails_its_requests_by_name_and_is_restarted() {
    let f = Fixture::new("");
    f.ready().await;
    let mut gone = f.handle.deaths().expect("deaths");
    let (s1, _) = initialize(&f, "1").await;
    let slow = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"delay_ms":5000}}}"#;
    let waiting = f.send(Some(&s1), slow);
    let kill = async {
        for _ in 0..100 {
            if f.seen().iter().any(|m| m["method"] == "tools/call") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pid = f.pids()[0];
        // SAFETY: a signal to the child this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    };
    let (answer, ()) = tokio::join!(waiting, kill);
    match answer {
        Err(GatewayError::UpstreamUnreachable { upstream, detail }) => {
            assert_eq!(&*upstream, "kid");
            assert!(detail.contains("child process"), "{detail}");
        }
        other => panic!("expected an error naming the upstream, got {other:?}"),
    }
    let event = tokio::time::timeout(Duration::from_secs(5), gone.recv())
        .await
        .expect("announced")
        .expect("event");
    assert_eq!(&*event.upstream, "kid");
    assert!(event.session.is_none());
    f.ready().await;
    let again = f
        .send(
            Some(&s1),
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo","arguments":{"text":"back"}}}"#,
        )
        .await
        .expect("answered");
    assert_eq!(body(again).await[0]["result"]["content"][0]["text"], "back");
    assert_eq!(f.pids().len(), 2, "restarted once");
    f.handle.shutdown().await;
    assert!(f.handle.readiness().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_initialize_is_an_error_not_a_hang() {
    let dir = std::env::temp_dir().join(format!("tg-stdio-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config: UpstreamConfig = toml::from_str(&format!(
        "name = \"kid\"\ncommand = [\"python3\", \"{SERVER}\"]\ntimeout_ms = 10000\nprocess = \"per_session\"\n[env]\nSTDIO_CRASH_INIT = \"1\"\n"
    ))
    .expect("config");
    let metrics = Arc::new(Metrics::new(&["kid".to_string()]));
    let transport = Arc::new(StdioTransport::new(&config, metrics, PER_SESSION_IDLE).expect("cmd"));
    let f = Fixture {
        handle: transport.handle(),
        transport,
        dir,
    };
    let started = Instant::now();
    let answer = f
        .send(
            None,
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#,
        )
        .await;
    match answer {
        Err(GatewayError::UpstreamUnreachable { upstream, detail }) => {
            assert_eq!(&*upstream, "kid");
            assert!(detail.contains("initialize"), "{detail}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "no hang");
    f.handle.shutdown().await;
}

/// Issue 31: a client that goes away before its answer (hyper drops the exchange) frees its
/// `max_in_flight` slot and the child is told (`notifications/cancelled`), as a client's own
/// cancel would; an abandoned `tasks/result` (no slot) leaves no route behind either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_frees_its_slot_and_the_child_is_told() {
    let f = Fixture::new("max_in_flight = 2");
    f.ready().await;
    let (s1, _) = initialize(&f, "1").await;
    let never = |id: u32| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"delay_ms":60000}}}}}}"#
        )
    };
    // Four callers that give up at once (their futures dropped, as on a disconnect).
    for id in 10..14 {
        let gave_up =
            tokio::time::timeout(Duration::from_millis(300), f.send(Some(&s1), &never(id))).await;
        assert!(gave_up.is_err(), "the child never answers");
    }
    let started = Instant::now();
    let answer = f
        .send(
            Some(&s1),
            r#"{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"echo","arguments":{"text":"room"}}}"#,
        )
        .await
        .expect("a slot is free");
    assert_eq!(
        body(answer).await[0]["result"]["content"][0]["text"],
        "room"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no wait for a slot"
    );
    let calls: Vec<_> = f
        .seen()
        .into_iter()
        .filter(|m| m["method"] == "tools/call" && m["params"]["arguments"]["delay_ms"] == 60000)
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(
        calls.len(),
        4,
        "each reached the child: the one before freed its slot"
    );
    for _ in 0..100 {
        let cancelled = f
            .seen()
            .into_iter()
            .filter(|m| m["method"] == "notifications/cancelled")
            .count();
        if cancelled >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled: Vec<_> = f
        .seen()
        .into_iter()
        .filter(|m| m["method"] == "notifications/cancelled")
        .map(|m| m["params"]["requestId"].clone())
        .collect();
    for id in &calls {
        assert!(cancelled.contains(id), "{id} cancelled: {cancelled:?}");
    }
    // An abandoned `tasks/result` (it waits for a task that stays working): its route goes.
    let task = f
        .send(
            Some(&s1),
            r#"{"jsonrpc":"2.0","id":30,"method":"tools/call","params":{"name":"slow","arguments":{},"task":{}}}"#,
        )
        .await
        .expect("a task");
    let task = body(task).await[0]["result"]["task"]["taskId"]
        .as_str()
        .expect("task id")
        .to_string();
    let mut unbounded = http::Extensions::new();
    unbounded.insert(Deadline::Unbounded);
    let result = format!(
        r#"{{"jsonrpc":"2.0","id":31,"method":"tasks/result","params":{{"taskId":"{task}"}}}}"#
    );
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        f.send_with(Some(&s1), &result, unbounded),
    )
    .await;
    assert!(gave_up.is_err(), "a working task's result waits");
    let State::Live(conn) = f.transport.inner.state.borrow().clone() else {
        panic!("live");
    };
    assert_eq!(conn.in_flight(), 0, "no route left behind");
    f.handle.shutdown().await;
}

/// One `timeout_ms` covers a request's wait for a `max_in_flight` slot and its exchange: a
/// request that got its slot late had a whole `timeout_ms` more for its answer (up to twice
/// the bound, three times with a full stdin queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_deadline_covers_the_wait_for_a_slot_and_the_exchange() {
    let f = Fixture::new("max_in_flight = 1\ntimeout_ms = 1000");
    f.ready().await;
    let (s1, _) = initialize(&f, "1").await;
    let echo = |id: u32, delay: u32| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"hi","delay_ms":{delay}}}}}}}"#
        )
    };
    // The first holds the only slot until its own deadline (1 s); the second, 200 ms later,
    // gets the slot then and would be answered 900 ms after.
    let (first, late) = (echo(10, 5000), echo(11, 900));
    let holder = f.send(Some(&s1), &first);
    let second = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        let reply = f.send(Some(&s1), &late).await;
        (reply, started.elapsed())
    };
    let (held, (reply, took)) = tokio::join!(holder, second);
    assert!(matches!(held, Err(GatewayError::UpstreamTimeout { .. })));
    assert!(
        took < Duration::from_millis(1300),
        "answered after {took:?}: {:?}",
        reply.as_ref().map(|r| r.status)
    );
    assert!(
        matches!(reply, Err(GatewayError::UpstreamTimeout { .. })),
        "{:?}",
        reply.as_ref().map(|r| r.status)
    );
    f.handle.shutdown().await;
}

/// Issue 31: `MAX_CHILDREN` counts children still in `initialize` too; past it an
/// `initialize` is refused at once with 503 and `Retry-After`, and no child is started for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_children_counts_children_still_starting() {
    let dir = std::env::temp_dir().join(format!("tg-stdio-max-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    // A child that never answers `initialize`: every one stays starting.
    let config: UpstreamConfig = toml::from_str(
        "name = \"kid\"\ncommand = [\"sleep\", \"60\"]\ntimeout_ms = 20000\nprocess = \"per_session\"\n",
    )
    .expect("config");
    let metrics = Arc::new(Metrics::new(&["kid".to_string()]));
    let transport = Arc::new(StdioTransport::new(&config, metrics, PER_SESSION_IDLE).expect("cmd"));
    let f = Arc::new(Fixture {
        handle: transport.handle(),
        transport,
        dir,
    });
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#;
    let mut starting = Vec::new();
    for i in 0..MAX_CHILDREN {
        let f2 = f.clone();
        starting.push(tokio::spawn(async move { f2.send(None, init).await }));
        // Each one counted and taken by the spawner before the next (its queue is short).
        let inner = &f.transport.inner;
        for _ in 0..500 {
            let counted = inner.starting.load(std::sync::atomic::Ordering::Acquire) == i + 1;
            let drained = inner
                .spawner
                .lock()
                .as_ref()
                .is_some_and(|s| s.capacity() == s.max_capacity());
            if counted && drained {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    for _ in 0..5 {
        let started = Instant::now();
        let reply = tokio::time::timeout(Duration::from_secs(5), f.send(None, init))
            .await
            .expect("refused at once, not after an initialize timeout");
        let reply = reply.expect("a reply");
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(reply.headers.get(http::header::RETRY_AFTER).is_some());
        assert!(started.elapsed() < Duration::from_secs(2));
    }
    for s in starting {
        s.abort();
    }
    f.handle.shutdown().await;
}

/// The methods the child read, in order.
fn methods(f: &Fixture) -> Vec<String> {
    f.seen()
        .iter()
        .filter_map(|m| m["method"].as_str().map(str::to_string))
        .collect()
}

/// The methods the child read, once it read at least `n` lines (it reads what taskgate wrote
/// in its own time), or after 5 s.
async fn methods_after(f: &Fixture, n: usize) -> Vec<String> {
    for _ in 0..250 {
        if f.seen().len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    methods(f)
}

/// A request of the 2026-07-28 era (as the edge marks it).
fn modern() -> http::Extensions {
    let mut e = http::Extensions::new();
    e.insert(Era::Modern);
    e
}

const META_2026: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}"#;

/// Issue 31, rmcp 3.11's stdio server with `--modern-only`: it answers `initialize` with
/// `-32022` and stops serving, so a shared child sent taskgate's `initialize` exited and was
/// restarted for ever. The era probe finds it modern-only: it is never sent `initialize`, stays
/// up, serves 2026-07-28 requests, and a client's `initialize` gets its refusal from taskgate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modern_only_child_is_probed_and_never_sent_initialize() {
    let f = Fixture::with_env("", "STDIO_MODERN = \"only\"");
    f.ready().await;
    // Long enough for a child that died of an initialize to have been restarted.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        methods(&f),
        ["server/discover"],
        "only the probe reached it"
    );
    assert_eq!(f.pids().len(), 1, "never restarted");
    let reply = f
        .send(
            None,
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#,
        )
        .await
        .expect("answered");
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.headers.get("mcp-session-id").is_none());
    let refusal = body(reply).await.remove(0);
    assert_eq!(refusal["id"], 1);
    assert_eq!(refusal["error"]["code"], -32022);
    assert_eq!(
        refusal["error"]["data"]["supported"],
        serde_json::json!(["2026-07-28"])
    );
    assert_eq!(refusal["error"]["data"]["requested"], "2025-11-25");
    let initialized = f
        .send(
            None,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        )
        .await
        .expect("accepted");
    assert_eq!(initialized.status, StatusCode::ACCEPTED);
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"modern"}},{META_2026}}}}}"#
    );
    let answer = f.send_with(None, &call, modern()).await.expect("answered");
    assert_eq!(
        body(answer).await[0]["result"]["content"][0]["text"],
        "modern"
    );
    assert_eq!(
        methods(&f),
        ["server/discover", "tools/call"],
        "neither the client's initialize nor its notifications/initialized reached the child"
    );
    assert_eq!(f.pids().len(), 1);
    f.handle.shutdown().await;
}

/// The probe before `initialize`: a legacy child answers it with an error (the fake server's
/// `-32601`) and is initialized as before, on the same process; a dual-era child (2025-11-25
/// among its versions) is initialized too, for 2025 clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_and_dual_era_children_are_initialized_after_the_probe() {
    for env in ["", "STDIO_MODERN = \"dual\""] {
        let f = Fixture::with_env("", env);
        f.ready().await;
        assert_eq!(
            methods_after(&f, 3).await,
            ["server/discover", "initialize", "notifications/initialized"],
            "{env}"
        );
        let (session, answer) = initialize(&f, "1").await;
        assert!(session.starts_with("tgs-"));
        assert_eq!(
            answer["result"]["serverInfo"]["name"], "fake-stdio",
            "{env}"
        );
        assert_eq!(f.pids().len(), 1);
        f.handle.shutdown().await;
    }
}

/// A legacy child that ignores the probe is initialized once the upstream's `timeout_ms` (3 s
/// here) passed; one that dies of the probe is a failed start, and the next child is
/// initialized without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_or_crashing_probe_falls_back_to_initialize() {
    let silent = Fixture::with_env("", "STDIO_DISCOVER = \"silent\"");
    silent.ready().await;
    assert_eq!(
        methods_after(&silent, 3).await,
        ["server/discover", "initialize", "notifications/initialized"]
    );
    assert_eq!(silent.pids().len(), 1);
    silent.handle.shutdown().await;

    let crash = Fixture::with_env("", "STDIO_DISCOVER = \"crash\"");
    crash.ready().await;
    assert_eq!(
        methods_after(&crash, 3).await,
        ["server/discover", "initialize", "notifications/initialized"]
    );
    assert_eq!(crash.pids().len(), 2, "the second child got no probe");
    let (_, answer) = initialize(&crash, "1").await;
    assert_eq!(answer["result"]["serverInfo"]["name"], "fake-stdio");
    crash.handle.shutdown().await;
}

/// Issue 31: a 2026-07-28 request answered with a JSON-RPC error by the child gets the HTTP
/// status the 2026-07-28 transport prescribes (as an HTTP upstream answers it: 400 for
/// `-32021`, 404 for `-32601`); a 2025-11-25 request's stays 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modern_requests_error_from_the_child_gets_its_http_status() {
    let f = Fixture::with_env("", "STDIO_MODERN = \"only\"");
    f.ready().await;
    for (code, status) in [(-32021, 400), (-32601, 404), (-32602, 400), (-32603, 200)] {
        let call = format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"fail","arguments":{{"code":{code}}},{META_2026}}}}}"#
        );
        let reply = f.send_with(None, &call, modern()).await.expect("answered");
        assert_eq!(reply.status.as_u16(), status, "{code}");
        assert_eq!(body(reply).await[0]["error"]["code"], code);
    }
    let legacy = Fixture::new("");
    legacy.ready().await;
    let (session, _) = initialize(&legacy, "1").await;
    let reply = legacy
        .send(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"fail","arguments":{"code":-32021}}}"#,
        )
        .await
        .expect("answered");
    assert_eq!(reply.status, StatusCode::OK);
    f.handle.shutdown().await;
    legacy.handle.shutdown().await;
}

/// Issue 31: taskgate's answers for a task a dead child took with it are in the request's era:
/// a 2026-07-28 `tasks/get` gets a flat `failed` Task (`resultType`, `ttlMs`) and a
/// `tasks/cancel` the 2026 ack; a 2025-11-25 one the 2025 Task (`ttl`) and `-32602`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_childs_tasks_are_answered_in_the_requests_era() {
    let f = Fixture::new("");
    f.ready().await;
    let mut gone = f.handle.deaths().expect("deaths");
    let (s1, _) = initialize(&f, "1").await;
    let created = f
        .send(
            Some(&s1),
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow","arguments":{},"task":{"ttl":60000}}}"#,
        )
        .await
        .expect("created");
    let task_id = body(created).await[0]["result"]["task"]["taskId"]
        .as_str()
        .expect("a task")
        .to_string();
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(f.pids()[0], libc::SIGKILL) };
    tokio::time::timeout(Duration::from_secs(5), gone.recv())
        .await
        .expect("announced")
        .expect("event");
    f.ready().await;
    let get = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{{"taskId":"{task_id}",{META_2026}}}}}"#
    );
    let modern_get = body(
        f.send_with(Some(&s1), &get, modern())
            .await
            .expect("answered"),
    )
    .await
    .remove(0);
    let task = &modern_get["result"];
    assert_eq!(task["resultType"], "complete", "{modern_get}");
    assert_eq!(task["status"], "failed");
    assert!(task["statusMessage"]
        .as_str()
        .is_some_and(|m| m.contains("`kid` restarted")));
    assert_eq!(task["ttlMs"], 60000);
    assert!(task.get("ttl").is_none(), "{modern_get}");
    let cancel = format!(
        r#"{{"jsonrpc":"2.0","id":4,"method":"tasks/cancel","params":{{"taskId":"{task_id}",{META_2026}}}}}"#
    );
    let modern_cancel = body(
        f.send_with(Some(&s1), &cancel, modern())
            .await
            .expect("answered"),
    )
    .await
    .remove(0);
    assert_eq!(
        modern_cancel["result"],
        serde_json::json!({"resultType":"complete"})
    );

    let legacy_get = body(
        f.send(
            Some(&s1),
            &format!(r#"{{"jsonrpc":"2.0","id":5,"method":"tasks/get","params":{{"taskId":"{task_id}"}}}}"#),
        )
        .await
        .expect("answered"),
    )
    .await
    .remove(0);
    assert_eq!(legacy_get["result"]["status"], "failed");
    assert_eq!(legacy_get["result"]["ttl"], 60000);
    assert!(legacy_get["result"].get("resultType").is_none());
    let legacy_cancel = body(
        f.send(
            Some(&s1),
            &format!(r#"{{"jsonrpc":"2.0","id":6,"method":"tasks/cancel","params":{{"taskId":"{task_id}"}}}}"#),
        )
        .await
        .expect("answered"),
    )
    .await
    .remove(0);
    assert_eq!(legacy_cancel["error"]["code"], -32602);
    f.handle.shutdown().await;
}

/// Issue 31: a 2026-07-28 `subscriptions/listen` to a shared child gets its notifications (the
/// child names the listen by the id it saw, `_meta` subscriptionId) on its own reply stream,
/// under the caller's id, not on the sessions' GET streams; it holds no `max_in_flight` slot;
/// its client going away cancels it at the child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listens_notifications_come_back_on_its_own_stream() {
    let f = Fixture::with_env("max_in_flight = 1", "STDIO_MODERN = \"only\"");
    f.ready().await;
    let listen = format!(
        r#"{{"jsonrpc":"2.0","id":"L1","method":"subscriptions/listen","params":{{"notifications":{{"toolsListChanged":true}},{META_2026}}}}}"#
    );
    let reply = f
        .send_with(None, &listen, modern())
        .await
        .expect("a stream");
    let ReplyBody::Stream(mut events) = reply.body else {
        panic!("expected a stream");
    };
    let mut seen = Vec::new();
    for _ in 0..2 {
        let e = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .expect("an event")
            .expect("the stream is open");
        let v: serde_json::Value = serde_json::from_str(&e.data.expect("data")).expect("json");
        seen.push(v);
    }
    assert_eq!(
        seen[0]["method"],
        "notifications/subscriptions/acknowledged"
    );
    assert_eq!(seen[1]["method"], "notifications/tools/list_changed");
    for v in &seen {
        assert_eq!(
            v["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "L1",
            "{v}"
        );
    }
    // The open listen holds no slot: a call (max_in_flight = 1) still goes through.
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"beside"}},{META_2026}}}}}"#
    );
    let answer = tokio::time::timeout(Duration::from_secs(5), f.send_with(None, &call, modern()))
        .await
        .expect("not waiting for a slot")
        .expect("answered");
    assert_eq!(
        body(answer).await[0]["result"]["content"][0]["text"],
        "beside"
    );
    let child_id = f
        .seen()
        .into_iter()
        .find(|m| m["method"] == "subscriptions/listen")
        .expect("the child saw the listen")["id"]
        .clone();
    drop(events);
    for _ in 0..100 {
        if methods(&f).iter().any(|m| m == "notifications/cancelled") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled: Vec<_> = f
        .seen()
        .into_iter()
        .filter(|m| m["method"] == "notifications/cancelled")
        .collect();
    assert_eq!(
        cancelled.len(),
        1,
        "the closed listen is cancelled at the child"
    );
    assert_eq!(cancelled[0]["params"]["requestId"], child_id);
    f.handle.shutdown().await;
}

/// The era the probe found is kept for the upstream's later children (MCP 2026-07-28: cache it,
/// MAY keep it across restarts): after `kill -9`, a modern-only child's successor is sent
/// nothing (no probe, no `initialize`), a dual-era one's gets `initialize` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_era_found_is_kept_across_restarts() {
    for (env, first, again) in [
        ("STDIO_MODERN = \"only\"", &["server/discover"][..], &[][..]),
        (
            "STDIO_MODERN = \"dual\"",
            &["server/discover", "initialize", "notifications/initialized"][..],
            &["initialize", "notifications/initialized"][..],
        ),
    ] {
        let f = Fixture::with_env("", env);
        f.ready().await;
        assert_eq!(methods_after(&f, first.len()).await, first, "{env}");
        // SAFETY: a signal to the child this test started.
        unsafe { libc::kill(f.pids()[0], libc::SIGKILL) };
        for _ in 0..200 {
            if f.pids().len() == 2 && f.handle.readiness().is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        f.ready().await;
        assert_eq!(f.pids().len(), 2, "{env}");
        let all = methods_after(&f, first.len() + again.len()).await;
        assert_eq!(&all[first.len()..], again, "{env}");
        f.handle.shutdown().await;
    }
}

/// The probe's answer, read (MCP 2026-07-28 basic/versioning: a recognized modern answer, a
/// `DiscoverResult` or `-32022`, says modern; anything else legacy).
#[test]
fn the_probe_answer_says_the_era() {
    let only = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{}}}"#;
    assert_eq!(
        classify_probe(only.as_bytes()),
        Probe::ModernOnly(r#"["2026-07-28"]"#.into())
    );
    let later = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"Unsupported protocol version","data":{"requested":"2026-07-28","supported":["2027-01-01"]}}}"#;
    assert_eq!(
        classify_probe(later.as_bytes()),
        Probe::ModernOnly(r#"["2027-01-01"]"#.into())
    );
    let dual =
        r#"{"jsonrpc":"2.0","id":1,"result":{"supportedVersions":["2025-11-25","2026-07-28"]}}"#;
    assert_eq!(classify_probe(dual.as_bytes()), Probe::DualEra);
    for legacy in [
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"Invalid request parameters"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"no data"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"supportedVersions":[]}}"#,
    ] {
        assert!(
            matches!(classify_probe(legacy.as_bytes()), Probe::Legacy(_)),
            "{legacy}"
        );
    }
}

/// An unknown session and "no room" are the transport's answers in the shared words of
/// `mcp::errors`: 404 `-32001` "Session not found: initialize a new session" (the session
/// layers' text; this one said only "Session not found" before issue 30), and 503 `-32603`
/// with `Retry-After: 1`.
#[tokio::test]
async fn session_not_found_and_overloaded_use_the_shared_words() {
    let id = Id::from_json("3").unwrap();
    let reply = session_not_found(Some(&id));
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    let v = body(reply).await;
    assert_eq!(v[0]["error"]["code"], -32001);
    assert_eq!(
        v[0]["error"]["message"],
        "Session not found: initialize a new session"
    );
    let reply = overloaded(Some(&id), "upstream `u`: too many children".into());
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.headers[http::header::RETRY_AFTER], "1");
    let v = body(reply).await;
    assert_eq!(v[0]["error"]["code"], -32603);
    assert_eq!(v[0]["error"]["message"], "upstream `u`: too many children");
}

/// A `per_session` fixture whose children are bounded by `caps`.
fn per_session_with(caps: ChildCaps) -> Fixture {
    let dir = std::env::temp_dir().join(format!(
        "tg-stdio-caps-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config: UpstreamConfig = toml::from_str(&format!(
        "name = \"kid\"\ncommand = [\"python3\", \"{SERVER}\"]\ntimeout_ms = 5000\nprocess = \"per_session\"\n[env]\nSTDIO_LOG = \"{}\"\nSTDIO_PIDS = \"{}\"\n",
        dir.join("log").display(),
        dir.join("pids").display()
    ))
    .expect("config");
    let metrics = Arc::new(Metrics::new(&["kid".to_string()]));
    let transport =
        StdioTransport::with_caps(&config, metrics, PER_SESSION_IDLE, caps).expect("command");
    Fixture {
        handle: transport.handle(),
        transport: Arc::new(transport),
        dir,
    }
}

/// An `initialize` from client address `addr` (no auth: the address is the principal).
async fn initialize_from(f: &Fixture, addr: &str) -> McpReply {
    let req = McpRequest::from(RequestParts {
        op: Operation::Post(
            Message::parse(Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#))
                .expect("json"),
        ),
        ctx: RequestContext {
            upstream: "kid".into(),
            client_session_id: None,
            session_id: None,
            principal: Principal::Anonymous,
            client_addr: Some(addr.parse().expect("addr")),
            headers: HeaderMap::new(),
        },
        extensions: http::Extensions::new(),
        trace: None,
    });
    f.transport.clone().exchange(req).await.expect("answered")
}

fn session_of(reply: &McpReply) -> String {
    assert_eq!(reply.status, StatusCode::OK, "initialize accepted");
    reply.headers["mcp-session-id"]
        .to_str()
        .expect("ascii")
        .to_string()
}

/// The `n`th child started (its pid), once it wrote its pid.
async fn nth_pid(f: &Fixture, n: usize) -> i32 {
    for _ in 0..400 {
        if let Some(pid) = f.pids().get(n) {
            return *pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("child {n} never wrote its pid");
}

/// Waits (at most 10 s) for process `pid` to be gone (reaped by its keeper).
async fn gone(pid: i32) -> bool {
    for _ in 0..1000 {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

async fn ping(f: &Fixture, session: &str) -> McpReply {
    f.send(Some(session), r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#)
        .await
        .expect("answered")
}

/// Cold test: one unauthenticated address took every `per_session` child, and
/// `limits.max_sessions_per_principal` did not bound its children. Its share is now bounded
/// (its least recently used child ended, as a DELETE ends it), so other addresses still get
/// children; at the cap, a principal holding children gives up its own least recently used
/// idle one, and one holding none is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_per_session_child() {
    let f = per_session_with(ChildCaps {
        max_children: 4,
        per_principal: 2,
    });
    let a1 = session_of(&initialize_from(&f, "127.0.0.1").await);
    let a2 = session_of(&initialize_from(&f, "127.0.0.1").await);
    let first = nth_pid(&f, 0).await;
    // Its third: past its share, its least recently used (the first) ends.
    let a3 = session_of(&initialize_from(&f, "127.0.0.1").await);
    assert_eq!(ping(&f, &a1).await.status, StatusCode::NOT_FOUND);
    assert!(
        gone(first).await,
        "the first address's oldest child is ended"
    );
    for s in [&a2, &a3] {
        assert_eq!(ping(&f, s).await.status, StatusCode::OK);
    }
    // Another address (an IPv6 one: by its /64) still gets children, up to the cap.
    let b1 = session_of(&initialize_from(&f, "2001:db8::1").await);
    let b2 = session_of(&initialize_from(&f, "2001:db8::2").await);
    assert_eq!(ping(&f, &b1).await.status, StatusCode::OK);
    // At the cap, an address holding no child is refused.
    let refused = initialize_from(&f, "127.0.0.3").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    let v = body(refused).await;
    assert_eq!(
        v[0]["error"]["message"],
        "upstream `kid` runs 4 sessions (one child process each, those starting counted) already"
    );
    // The /64's next session gives up its own least recently used (b2, b1 pinged since).
    let b3 = session_of(&initialize_from(&f, "2001:db8::3").await);
    assert_eq!(ping(&f, &b2).await.status, StatusCode::NOT_FOUND);
    for s in [&a2, &a3, &b1, &b3] {
        assert_eq!(ping(&f, s).await.status, StatusCode::OK);
    }
    f.handle.shutdown().await;
    let _ = std::fs::remove_dir_all(&f.dir);
}

/// With no share below the cap (the default), a principal holding children at the cap gives
/// up its own least recently used idle child for a new one instead of everyone being refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_child_cap_a_principal_gives_up_its_own_idle_child() {
    let f = per_session_with(ChildCaps {
        max_children: 3,
        per_principal: 3,
    });
    let a: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(session_of(&initialize_from(&f, "127.0.0.1").await));
        }
        v
    };
    let first = nth_pid(&f, 0).await;
    assert_eq!(
        initialize_from(&f, "127.0.0.2").await.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "a principal holding none is refused at the cap"
    );
    let a4 = session_of(&initialize_from(&f, "127.0.0.1").await);
    assert_eq!(ping(&f, &a[0]).await.status, StatusCode::NOT_FOUND);
    assert!(gone(first).await, "its oldest idle child is ended");
    for s in [&a[1], &a[2], &a4] {
        assert_eq!(ping(&f, s).await.status, StatusCode::OK);
    }
    f.handle.shutdown().await;
    let _ = std::fs::remove_dir_all(&f.dir);
}

/// Without `limits.max_sessions_per_principal`, one principal's share of `per_session`
/// children is a quarter of the cap (the session table's default share, 1000 for 10,000
/// sessions, was above the cap: one address could still take every child); set, it is taken
/// as it is.
#[test]
fn the_default_share_of_children_is_a_quarter_of_the_cap() {
    let unset = crate::config::LimitsConfig::default();
    assert_eq!(
        ChildCaps::for_config(&unset, 10_000).per_principal,
        MAX_CHILDREN / 4
    );
    let set = crate::config::LimitsConfig {
        max_sessions_per_principal: Some(200),
        ..Default::default()
    };
    assert_eq!(ChildCaps::for_config(&set, 10_000).per_principal, 200);
}

/// Tester 3 F14: an answer carrying both `result` and `error` (not a JSON-RPC response) to a
/// request taskgate wrote is answered to its caller at once with `-32603` naming the invalid
/// answer; it was dropped as noise and the caller waited its whole `timeout_ms` (3 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_both_result_and_error_answers_its_caller_at_once() {
    let f = Fixture::new("");
    f.ready().await;
    let (session, _) = initialize(&f, "1").await;
    let started = std::time::Instant::now();
    let reply = f
        .send(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":"mine","method":"tools/call","params":{"name":"both","arguments":{}}}"#,
        )
        .await
        .expect("answered");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "answered after {:?}",
        started.elapsed()
    );
    let answer = body(reply).await.remove(0);
    assert_eq!(answer["id"], "mine", "{answer}");
    assert_eq!(answer["error"]["code"], jsonrpc::INTERNAL_ERROR, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("`kid`") && message.contains("invalid answer"),
        "{answer}"
    );
    assert!(message.contains("both `result` and `error`"), "{answer}");
    // The child serves on.
    let echo = f
        .send(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"still"}}}"#,
        )
        .await
        .expect("answered");
    assert_eq!(body(echo).await[0]["result"]["content"][0]["text"], "still");
    f.handle.shutdown().await;
}
