//! The stdio transport against the scripted server `tests/stdio/fake_server.py`: one shared
//! child initialized once, sessions per client, ids mapped both ways, a killed child's waiting
//! requests answered with an error naming the upstream, and its restart.

use super::*;
use crate::exchange::{Principal, RequestContext};
use futures_util::StreamExt;

const SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/stdio/fake_server.py");

struct Fixture {
    transport: Arc<StdioTransport>,
    handle: StdioHandle,
    dir: std::path::PathBuf,
}

impl Fixture {
    fn new(extra: &str) -> Fixture {
        let dir = std::env::temp_dir().join(format!(
            "tg-stdio-unit-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let config: UpstreamConfig = toml::from_str(&format!(
            "name = \"kid\"\ncommand = [\"python3\", \"{SERVER}\"]\ntimeout_ms = 3000\n{extra}\n[env]\nSTDIO_LOG = \"{}\"\nSTDIO_PIDS = \"{}\"\n",
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
        let req = McpRequest {
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
        };
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
