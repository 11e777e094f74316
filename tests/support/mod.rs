//! Test support for taskgate integration tests: a scripted upstream MCP server, helpers that start
//! taskgate in process or as the real binary, and a small HTTP client with an incremental SSE reader.
//!
//! - [`Upstream`]: a hyper 1 server on `127.0.0.1:0` that records every request it receives
//!   ([`RecordedRequest`]: method, path, all headers, body bytes) and answers what the test's
//!   handler returns ([`ScriptedResponse`]: JSON or any body, SSE with raw field control, 202,
//!   any status, or never answering).
//! - [`GatewayBuilder`] / [`Gateway`]: writes a TOML config pointing at upstreams and runs
//!   `taskgate::gateway::start` in process; the store lives in a temporary directory.
//! - [`Req`] / [`Resp`] / [`SseReader`]: a hyper client that shows a response the moment its
//!   headers arrive and yields SSE events one by one as they arrive.
//! - [`TaskgateProcess`]: the real binary as a child process, killed on drop.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;

/// The longest any single step of a test waits before it fails (network answers, events).
pub const STEP: Duration = Duration::from_secs(10);

/// Body type used on both the scripted upstream and the test client.
pub type TestBody = UnsyncBoxBody<Bytes, Infallible>;

pub const ACCEPT_BOTH: &str = "application/json, text/event-stream";
pub const PROTOCOL_VERSION: &str = "2025-11-25";

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

/// A TCP port on 127.0.0.1 that was free a moment ago (bound, read, released).
pub fn free_port() -> u16 {
    let l = StdTcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

/// An MCP URL on which nothing listens (connection refused).
pub fn dead_url() -> String {
    format!("http://127.0.0.1:{}/mcp", free_port())
}

/// A JSON-RPC request with `id_json` inserted verbatim (`0`, `"0"`, `7`...).
pub fn rpc(id_json: &str, method: &str, params_json: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id_json},"method":"{method}","params":{params_json}}}"#)
}

/// A JSON-RPC notification.
pub fn notification(method: &str, params_json: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":{params_json}}}"#)
}

/// A JSON-RPC result response with `id_json` inserted verbatim.
pub fn rpc_result(id_json: &str, result_json: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id_json},"result":{result_json}}}"#)
}

pub fn initialize_body(id_json: &str) -> String {
    rpc(
        id_json,
        "initialize",
        &format!(
            r#"{{"protocolVersion":"{PROTOCOL_VERSION}","capabilities":{{}},"clientInfo":{{"name":"taskgate-tests","version":"0"}}}}"#
        ),
    )
}

/// Parses bytes as JSON or panics with the text.
pub fn parse_json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(bytes)))
}

/// A gate a scripted response can wait on; the test opens it.
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate(Arc::new(watch::channel(false).0))
    }
    pub fn open(&self) {
        self.0.send_replace(true);
    }
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// A response body fed from a channel: each `Bytes` sent is one data frame, written as it comes.
pub struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

fn full_body(b: impl Into<Bytes>) -> TestBody {
    Full::new(b.into()).boxed_unsync()
}

fn empty_body() -> TestBody {
    Empty::<Bytes>::new().boxed_unsync()
}

// ---------------------------------------------------------------------------------------------
// Scripted upstream
// ---------------------------------------------------------------------------------------------

/// One request as the upstream received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query, as on the request line.
    pub path: String,
    /// Every header in arrival order (names lower-case), values as raw bytes.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Bytes,
    pub version: String,
}

impl RecordedRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<String> {
        self.header_all(name).into_iter().next()
    }
    pub fn header_all(&self, name: &str) -> Vec<String> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }
    pub fn has_header(&self, name: &str) -> bool {
        !self.header_all(name).is_empty()
    }
    pub fn header_names(&self) -> Vec<String> {
        self.headers.iter().map(|(n, _)| n.clone()).collect()
    }
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> Value {
        parse_json(&self.body)
    }
    /// JSON-RPC `method`, when the body is a JSON object that has one.
    pub fn rpc_method(&self) -> Option<String> {
        serde_json::from_slice::<Value>(&self.body)
            .ok()?
            .get("method")?
            .as_str()
            .map(str::to_owned)
    }
    /// JSON-RPC `id` with its type, when present.
    pub fn rpc_id(&self) -> Option<Value> {
        serde_json::from_slice::<Value>(&self.body)
            .ok()?
            .get("id")
            .cloned()
    }
    /// The `id` re-encoded as JSON text (`0` or `"0"`), `null` when absent.
    pub fn rpc_id_json(&self) -> String {
        self.rpc_id()
            .map(|v| v.to_string())
            .unwrap_or_else(|| "null".into())
    }
}

/// One step of a scripted SSE body.
pub enum SseStep {
    /// Bytes written exactly as given (full control over the wire format).
    Raw(String),
    /// Bytes written exactly as given, for bodies that are not text (a gzip stream).
    Bytes(Bytes),
    Sleep(Duration),
    /// Wait until the test opens the gate.
    Wait(Gate),
    /// Keep the stream open until the peer goes away.
    HoldOpen,
}

/// Builder for one SSE event, written as `field: value` lines followed by a blank line.
#[derive(Default, Clone)]
pub struct SseOut {
    lines: Vec<String>,
}

/// Starts an SSE event.
pub fn ev() -> SseOut {
    SseOut::default()
}

impl SseOut {
    pub fn id(mut self, id: &str) -> Self {
        self.lines.push(format!("id: {id}"));
        self
    }
    pub fn event(mut self, name: &str) -> Self {
        self.lines.push(format!("event: {name}"));
        self
    }
    pub fn retry(mut self, ms: u64) -> Self {
        self.lines.push(format!("retry: {ms}"));
        self
    }
    /// One `data:` line per line of `data` (an empty string gives one empty `data:` line).
    pub fn data(mut self, data: &str) -> Self {
        for line in data.split('\n') {
            if line.is_empty() {
                self.lines.push("data:".into());
            } else {
                self.lines.push(format!("data: {line}"));
            }
        }
        self
    }
    pub fn comment(mut self, text: &str) -> Self {
        self.lines.push(format!(":{text}"));
        self
    }
    pub fn wire(&self) -> String {
        let mut s = String::new();
        for l in &self.lines {
            s.push_str(l);
            s.push('\n');
        }
        s.push('\n');
        s
    }
}

impl From<SseOut> for SseStep {
    fn from(e: SseOut) -> SseStep {
        SseStep::Raw(e.wire())
    }
}

/// What the scripted upstream answers.
pub enum ScriptedResponse {
    /// Any status with a complete body.
    Full {
        status: u16,
        headers: Vec<(String, String)>,
        body: Bytes,
    },
    /// `text/event-stream` written step by step; the stream ends after the last step.
    Sse {
        status: u16,
        headers: Vec<(String, String)>,
        steps: Vec<SseStep>,
    },
    /// Never answer.
    Hang,
    /// Answer after a delay.
    After(Duration, Box<ScriptedResponse>),
    /// Answer once the gate is open.
    AfterGate(Gate, Box<ScriptedResponse>),
}

impl ScriptedResponse {
    /// 200 `application/json` with exactly `body`.
    pub fn json(body: impl Into<String>) -> Self {
        Self::Full {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: Bytes::from(body.into()),
        }
    }
    /// 200 JSON-RPC result for the request's id (type kept).
    pub fn result_for(req: &RecordedRequest, result_json: &str) -> Self {
        Self::json(rpc_result(&req.rpc_id_json(), result_json))
    }
    /// 202 Accepted, empty body.
    pub fn accepted() -> Self {
        Self::Full {
            status: 202,
            headers: vec![],
            body: Bytes::new(),
        }
    }
    /// Any status, optional content type, body.
    pub fn status(status: u16, content_type: Option<&str>, body: impl Into<Bytes>) -> Self {
        let headers = content_type
            .map(|ct| vec![("content-type".to_string(), ct.to_string())])
            .unwrap_or_default();
        Self::Full {
            status,
            headers,
            body: body.into(),
        }
    }
    /// 200 `text/event-stream` with these steps.
    pub fn sse(steps: Vec<SseStep>) -> Self {
        Self::Sse {
            status: 200,
            headers: vec![],
            steps,
        }
    }
    pub fn hang() -> Self {
        Self::Hang
    }
    pub fn after(self, d: Duration) -> Self {
        Self::After(d, Box::new(self))
    }
    pub fn after_gate(self, g: &Gate) -> Self {
        Self::AfterGate(g.clone(), Box::new(self))
    }
    /// Adds a response header (Full and Sse only).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        match &mut self {
            Self::Full { headers, .. } | Self::Sse { headers, .. } => {
                headers.push((name.into(), value.into()))
            }
            _ => panic!("header() on a response without headers"),
        }
        self
    }
    /// Replaces every value of a header (Full and Sse only).
    pub fn set_header(mut self, name: &str, value: &str) -> Self {
        match &mut self {
            Self::Full { headers, .. } | Self::Sse { headers, .. } => {
                headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
                headers.push((name.into(), value.into()))
            }
            _ => panic!("set_header() on a response without headers"),
        }
        self
    }
}

type Handler = dyn Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync + 'static;

struct UpstreamShared {
    handler: Box<Handler>,
    log: Mutex<Vec<RecordedRequest>>,
    count: watch::Sender<usize>,
    /// SSE bodies whose reader went away before the script ended.
    sse_disconnects: AtomicUsize,
    sse_disconnect_tx: watch::Sender<usize>,
}

/// A scripted upstream MCP server on 127.0.0.1.
pub struct Upstream {
    pub addr: SocketAddr,
    shared: Arc<UpstreamShared>,
    accept: tokio::task::JoinHandle<()>,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Upstream {
    /// Starts a server that answers every request with `handler(&request)`.
    pub async fn start<F>(handler: F) -> Upstream
    where
        F: Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(UpstreamShared {
            handler: Box::new(handler),
            log: Mutex::new(Vec::new()),
            count: watch::channel(0).0,
            sse_disconnects: AtomicUsize::new(0),
            sse_disconnect_tx: watch::channel(0).0,
        });
        let conns: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = {
            let shared = shared.clone();
            let conns = conns.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let shared = shared.clone();
                    let task = tokio::spawn(async move {
                        let svc = service_fn(move |req: Request<Incoming>| {
                            let shared = shared.clone();
                            async move { Ok::<_, Infallible>(serve_one(shared, req).await) }
                        });
                        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                    conns.lock().unwrap().push(task.abort_handle());
                }
            })
        };
        Upstream {
            addr,
            shared,
            accept,
            conns,
        }
    }

    /// The standard MCP upstream of these tests (see [`mcp_handler`]).
    pub async fn mcp() -> Upstream {
        Upstream::start(mcp_handler).await
    }

    /// `http://127.0.0.1:PORT/mcp`
    pub fn url(&self) -> String {
        self.url_path("/mcp")
    }
    pub fn url_path(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
    /// `127.0.0.1:PORT`: the authority a Host header for this upstream carries.
    pub fn authority(&self) -> String {
        self.addr.to_string()
    }
    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.log.lock().unwrap().clone()
    }
    pub fn count(&self) -> usize {
        self.shared.log.lock().unwrap().len()
    }
    /// The last request received (panics when there is none).
    pub fn last(&self) -> RecordedRequest {
        self.requests().pop().expect("upstream received no request")
    }
    /// Waits until at least `n` requests arrived.
    pub async fn wait_for_count(&self, n: usize) {
        let mut rx = self.shared.count.subscribe();
        tokio::time::timeout(STEP, rx.wait_for(|c| *c >= n))
            .await
            .unwrap_or_else(|_| panic!("upstream got {} requests, waited for {n}", self.count()))
            .unwrap();
    }
    /// How many SSE responses lost their reader before their script ended.
    pub fn sse_disconnects(&self) -> usize {
        self.shared.sse_disconnects.load(Ordering::SeqCst)
    }
    /// Waits until at least `n` SSE responses lost their reader; false on timeout.
    pub async fn wait_for_sse_disconnects(&self, n: usize, within: Duration) -> bool {
        let mut rx = self.shared.sse_disconnect_tx.subscribe();
        let ok = tokio::time::timeout(within, rx.wait_for(|c| *c >= n))
            .await
            .is_ok();
        ok
    }
    /// Stops listening and drops every open connection.
    pub fn stop(&self) {
        self.accept.abort();
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

async fn serve_one(shared: Arc<UpstreamShared>, req: Request<Incoming>) -> Response<TestBody> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let recorded = RecordedRequest {
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
            .collect(),
        body,
        version: format!("{:?}", parts.version),
    };
    let scripted = (shared.handler)(&recorded);
    {
        let mut log = shared.log.lock().unwrap();
        log.push(recorded);
        shared.count.send_replace(log.len());
    }
    render(shared, scripted).await
}

async fn render(shared: Arc<UpstreamShared>, mut resp: ScriptedResponse) -> Response<TestBody> {
    loop {
        match resp {
            ScriptedResponse::After(d, inner) => {
                tokio::time::sleep(d).await;
                resp = *inner;
            }
            ScriptedResponse::AfterGate(g, inner) => {
                g.wait().await;
                resp = *inner;
            }
            ScriptedResponse::Hang => std::future::pending::<()>().await,
            ScriptedResponse::Full {
                status,
                headers,
                body,
            } => {
                let mut r = Response::new(full_body(body));
                *r.status_mut() = StatusCode::from_u16(status).unwrap();
                put_headers(r.headers_mut(), &headers);
                return r;
            }
            ScriptedResponse::Sse {
                status,
                headers,
                steps,
            } => {
                let (tx, rx) = mpsc::channel::<Bytes>(64);
                let mut r = Response::new(ChannelBody { rx }.boxed_unsync());
                *r.status_mut() = StatusCode::from_u16(status).unwrap();
                if !headers
                    .iter()
                    .any(|(n, _)| n.eq_ignore_ascii_case("content-type"))
                {
                    r.headers_mut().insert(
                        "content-type",
                        HeaderValue::from_static("text/event-stream"),
                    );
                }
                r.headers_mut()
                    .insert("cache-control", HeaderValue::from_static("no-cache"));
                put_headers(r.headers_mut(), &headers);
                tokio::spawn(run_sse(shared, tx, steps));
                return r;
            }
        }
    }
}

async fn run_sse(shared: Arc<UpstreamShared>, tx: mpsc::Sender<Bytes>, steps: Vec<SseStep>) {
    let gone = |shared: &UpstreamShared| {
        let n = shared.sse_disconnects.fetch_add(1, Ordering::SeqCst) + 1;
        shared.sse_disconnect_tx.send_replace(n);
    };
    for step in steps {
        match step {
            SseStep::Raw(s) => {
                if tx.send(Bytes::from(s)).await.is_err() {
                    return gone(&shared);
                }
            }
            SseStep::Bytes(b) => {
                if tx.send(b).await.is_err() {
                    return gone(&shared);
                }
            }
            SseStep::Sleep(d) => tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = tx.closed() => return gone(&shared),
            },
            SseStep::Wait(g) => tokio::select! {
                _ = g.wait() => {}
                _ = tx.closed() => return gone(&shared),
            },
            SseStep::HoldOpen => {
                tx.closed().await;
                return gone(&shared);
            }
        }
    }
}

fn put_headers(map: &mut HeaderMap, headers: &[(String, String)]) {
    for (n, v) in headers {
        map.append(
            HeaderName::from_bytes(n.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
}

/// Session id the standard upstream hands out on `initialize`.
pub const UPSTREAM_SESSION: &str = "up-session-7f3a";

/// A well-behaved MCP server: `initialize` gets a result and `Mcp-Session-Id`, notifications and
/// responses get 202, any other request a JSON result `{"echo":METHOD}` with the same id,
/// GET gets 405, DELETE gets 200.
pub fn mcp_handler(req: &RecordedRequest) -> ScriptedResponse {
    match req.method.as_str() {
        "GET" => return ScriptedResponse::status(405, None, ""),
        "DELETE" => return ScriptedResponse::status(200, None, ""),
        _ => {}
    }
    let v: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(_) => return ScriptedResponse::status(400, Some("text/plain"), "upstream: bad json"),
    };
    let method = v.get("method").and_then(Value::as_str);
    let id = v.get("id");
    match (method, id) {
        (Some("initialize"), Some(_)) => ScriptedResponse::result_for(
            req,
            &format!(
                r#"{{"protocolVersion":"{PROTOCOL_VERSION}","capabilities":{{"tools":{{}}}},"serverInfo":{{"name":"scripted","version":"1"}}}}"#
            ),
        )
        .header("mcp-session-id", UPSTREAM_SESSION),
        (Some(m), Some(_)) => ScriptedResponse::result_for(req, &format!(r#"{{"echo":"{m}"}}"#)),
        _ => ScriptedResponse::accepted(),
    }
}

// ---------------------------------------------------------------------------------------------
// taskgate in process
// ---------------------------------------------------------------------------------------------

struct UpstreamToml {
    name: String,
    url: String,
    lines: Vec<String>,
}

/// Writes a taskgate TOML config: listeners on port 0, a temporary store, the given upstreams.
#[derive(Default)]
pub struct GatewayBuilder {
    gateway_lines: Vec<String>,
    upstreams: Vec<UpstreamToml>,
}

impl GatewayBuilder {
    pub fn new() -> Self {
        Self::default()
    }
    /// One upstream named `default` at `url`.
    pub fn single(url: &str) -> Self {
        Self::new().upstream("default", url)
    }
    /// An extra `key = value` line in `[gateway]`.
    pub fn gateway_opt(mut self, line: &str) -> Self {
        self.gateway_lines.push(line.into());
        self
    }
    pub fn upstream(mut self, name: &str, url: &str) -> Self {
        self.upstreams.push(UpstreamToml {
            name: name.into(),
            url: url.into(),
            lines: vec![],
        });
        self
    }
    /// An extra `key = value` line in the last `[[upstream]]`.
    pub fn upstream_opt(mut self, line: &str) -> Self {
        self.upstreams
            .last_mut()
            .expect("upstream() first")
            .lines
            .push(line.into());
        self
    }
    pub fn to_toml(&self, store_path: &str, gateway_listen: &str, admin_listen: &str) -> String {
        let mut s = format!("[gateway]\nlisten = \"{gateway_listen}\"\n");
        for l in &self.gateway_lines {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str(&format!("\n[admin]\nlisten = \"{admin_listen}\"\n"));
        s.push_str(&format!("\n[store]\npath = {store_path:?}\n"));
        s.push_str("\n[auth]\nmode = \"none\"\n\n[upgrade]\nenabled = false\n");
        for u in &self.upstreams {
            s.push_str(&format!(
                "\n[[upstream]]\nname = \"{}\"\nurl = \"{}\"\n",
                u.name, u.url
            ));
            for l in &u.lines {
                s.push_str(l);
                s.push('\n');
            }
        }
        s
    }
    /// Parses the config and starts taskgate; Err carries the error's Display text.
    pub async fn try_start(self) -> Result<Gateway, String> {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let toml = self.to_toml(store.to_str().unwrap(), "127.0.0.1:0", "127.0.0.1:0");
        let config = taskgate::config::Config::from_toml_str(&toml)
            .map_err(|e| format!("config error: {e}"))?;
        #[allow(unused_mut)]
        let mut running = taskgate::gateway::start(config)
            .await
            .map_err(|e| format!("start error: {e}"))?;
        let addr: SocketAddr = running.gateway_addr;
        let admin: SocketAddr = running.admin_addr;
        let shutdown: ShutdownFn = Box::new(move || {
            Box::pin(async move {
                #[allow(clippy::let_unit_value)]
                let _ = running.shutdown().await;
            })
        });
        Ok(Gateway {
            shutdown: Some(shutdown),
            addr,
            admin,
            toml,
            _dir: dir,
        })
    }
    pub async fn start(self) -> Gateway {
        match self.try_start().await {
            Ok(g) => g,
            Err(e) => panic!("taskgate did not start: {e}"),
        }
    }
}

type ShutdownFn = Box<dyn FnOnce() -> Pin<Box<dyn std::future::Future<Output = ()>>>>;

/// taskgate running in this process.
pub struct Gateway {
    shutdown: Option<ShutdownFn>,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub toml: String,
    _dir: tempfile::TempDir,
}

impl Gateway {
    /// `http://127.0.0.1:PORT{path}` on the gateway listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
    /// `http://127.0.0.1:PORT{path}` on the admin listener.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }
    /// Graceful stop (`running.shutdown().await`).
    pub async fn shutdown(mut self) {
        if let Some(f) = self.shutdown.take() {
            f().await
        }
    }
    /// The shutdown future, to be raced against other work.
    pub fn shutdown_future(&mut self) -> Pin<Box<dyn std::future::Future<Output = ()>>> {
        (self.shutdown.take().expect("shutdown already taken"))()
    }
}

// ---------------------------------------------------------------------------------------------
// Test client
// ---------------------------------------------------------------------------------------------

/// An HTTP request the test sends; headers go out exactly as listed (plus hyper's Host when none
/// is given, and Content-Length or chunked framing).
pub struct Req {
    method: Method,
    url: String,
    headers: Vec<(String, String)>,
    body: ReqBody,
}

enum ReqBody {
    Empty,
    Full(Bytes),
    Chunked(Vec<Bytes>),
}

impl Req {
    pub fn new(method: Method, url: &str) -> Req {
        Req {
            method,
            url: url.into(),
            headers: vec![],
            body: ReqBody::Empty,
        }
    }
    /// POST with no headers at all.
    pub fn post_raw(url: &str, body: impl Into<Bytes>) -> Req {
        let mut r = Req::new(Method::POST, url);
        r.body = ReqBody::Full(body.into());
        r
    }
    /// POST the way an MCP client does: `Accept` lists both types, `Content-Type: application/json`.
    pub fn mcp_post(url: &str, body: impl Into<Bytes>) -> Req {
        Req::post_raw(url, body)
            .header("accept", ACCEPT_BOTH)
            .header("content-type", "application/json")
    }
    /// GET of the standalone SSE stream.
    pub fn mcp_get(url: &str) -> Req {
        Req::new(Method::GET, url).header("accept", "text/event-stream")
    }
    pub fn get(url: &str) -> Req {
        Req::new(Method::GET, url)
    }
    pub fn delete(url: &str) -> Req {
        Req::new(Method::DELETE, url)
    }
    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.into(), value.into()));
        self
    }
    /// Removes every value of a header.
    pub fn without(mut self, name: &str) -> Req {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self
    }
    /// Sends the body in these chunks with `Transfer-Encoding: chunked` (no Content-Length).
    pub fn chunked(mut self, chunks: Vec<Bytes>) -> Req {
        self.body = ReqBody::Chunked(chunks);
        self
    }
    pub async fn try_send(self) -> Result<Resp, String> {
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .build_http::<TestBody>();
        let body = match self.body {
            ReqBody::Empty => empty_body(),
            ReqBody::Full(b) => full_body(b),
            ReqBody::Chunked(chunks) => {
                let (tx, rx) = mpsc::channel(chunks.len().max(1));
                for c in chunks {
                    tx.try_send(c).unwrap();
                }
                ChannelBody { rx }.boxed_unsync()
            }
        };
        let mut req = Request::builder().method(self.method).uri(&self.url);
        for (n, v) in &self.headers {
            req = req.header(n.as_str(), v.as_str());
        }
        let req = req.body(body).map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(STEP, client.request(req))
            .await
            .map_err(|_| format!("no response headers within {STEP:?}"))?
            .map_err(|e| format!("request failed: {e:?}"))?;
        let (parts, body) = resp.into_parts();
        Ok(Resp {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
    pub async fn send(self) -> Resp {
        let what = format!("{} {}", self.method, self.url);
        self.try_send()
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"))
    }
}

/// A response whose headers have arrived; the body is read on demand.
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Incoming,
}

impl Resp {
    pub fn status(&self) -> u16 {
        self.status.as_u16()
    }
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }
    pub fn header_all(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }
    pub async fn bytes(self) -> Bytes {
        tokio::time::timeout(STEP, self.body.collect())
            .await
            .expect("body did not end in time")
            .expect("body read failed")
            .to_bytes()
    }
    pub async fn text(self) -> String {
        String::from_utf8_lossy(&self.bytes().await).into_owned()
    }
    pub async fn json(self) -> Value {
        parse_json(&self.bytes().await)
    }
    pub fn sse(self) -> SseReader {
        SseReader {
            body: self.body,
            buf: Vec::new(),
            fields: Vec::new(),
            queue: VecDeque::new(),
            ended: false,
            raw: Vec::new(),
        }
    }
}

/// One SSE block as received: fields in order (comments excluded).
#[derive(Clone, Debug, PartialEq)]
pub struct SseEvent {
    pub fields: Vec<(String, String)>,
}

impl SseEvent {
    fn last(&self, name: &str) -> Option<String> {
        self.fields
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }
    pub fn id(&self) -> Option<String> {
        self.last("id")
    }
    pub fn event(&self) -> Option<String> {
        self.last("event")
    }
    pub fn retry(&self) -> Option<String> {
        self.last("retry")
    }
    /// `data` lines joined with `\n`; None when the block has no data field.
    pub fn data(&self) -> Option<String> {
        let d: Vec<&str> = self
            .fields
            .iter()
            .filter(|(n, _)| n == "data")
            .map(|(_, v)| v.as_str())
            .collect();
        if d.is_empty() {
            None
        } else {
            Some(d.join("\n"))
        }
    }
    pub fn json(&self) -> Value {
        parse_json(self.data().expect("event without data").as_bytes())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum SseItem {
    /// A `:` comment line (text after the colon), yielded as soon as its line is complete.
    Comment(String),
    /// A block of fields closed by a blank line.
    Event(SseEvent),
}

#[derive(Debug)]
pub enum Next {
    Item(SseItem),
    End,
    Timeout,
}

/// Reads an SSE body incrementally, yielding comments and events as their bytes arrive.
pub struct SseReader {
    body: Incoming,
    buf: Vec<u8>,
    fields: Vec<(String, String)>,
    queue: VecDeque<SseItem>,
    ended: bool,
    /// Every byte received so far.
    pub raw: Vec<u8>,
}

impl SseReader {
    pub fn raw_text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }

    /// The next comment or event, or the end of the stream, or Timeout after `within`.
    pub async fn next(&mut self, within: Duration) -> Next {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Next::Item(item);
            }
            if self.ended {
                return Next::End;
            }
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_) => return Next::Timeout,
                Ok(None) => {
                    self.ended = true;
                    self.parse(true);
                }
                Ok(Some(Err(e))) => {
                    // A reset counts as the end; keep what was parsed.
                    eprintln!("sse body error: {e:?}");
                    self.ended = true;
                    self.parse(true);
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.raw.extend_from_slice(&data);
                        self.buf.extend_from_slice(&data);
                        self.parse(false);
                    }
                }
            }
        }
    }

    /// The next event (comments skipped); panics on end or timeout.
    pub async fn next_event(&mut self, within: Duration) -> SseEvent {
        loop {
            match self.next(within).await {
                Next::Item(SseItem::Event(e)) => return e,
                Next::Item(SseItem::Comment(_)) => continue,
                Next::End => panic!(
                    "stream ended before the next event; got: {:?}",
                    self.raw_text()
                ),
                Next::Timeout => {
                    panic!(
                        "no event within {within:?}; got so far: {:?}",
                        self.raw_text()
                    )
                }
            }
        }
    }

    /// The next comment, skipping nothing: panics if an event, the end or a timeout comes first.
    pub async fn next_comment(&mut self, within: Duration) -> String {
        match self.next(within).await {
            Next::Item(SseItem::Comment(c)) => c,
            other => panic!(
                "expected a comment, got {other:?}; raw: {:?}",
                self.raw_text()
            ),
        }
    }

    /// Asserts the stream ends within `within` with no further event (comments allowed).
    pub async fn expect_end(&mut self, within: Duration) {
        loop {
            match self.next(within).await {
                Next::End => return,
                Next::Item(SseItem::Comment(_)) => continue,
                other => panic!(
                    "expected end of stream, got {other:?}; raw: {:?}",
                    self.raw_text()
                ),
            }
        }
    }

    /// Asserts that for `dur` neither an event nor the end arrives (comments allowed).
    pub async fn expect_open_for(&mut self, dur: Duration) {
        let until = Instant::now() + dur;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match self.next(left).await {
                Next::Timeout => return,
                Next::Item(SseItem::Comment(_)) => continue,
                other => panic!("expected the stream to stay open and quiet, got {other:?}"),
            }
        }
    }

    fn parse(&mut self, at_end: bool) {
        while let Some(pos) = self.buf.iter().position(|b| *b == b'\n' || *b == b'\r') {
            let mut consumed = pos + 1;
            if self.buf[pos] == b'\r' {
                if pos + 1 == self.buf.len() && !at_end {
                    break; // a CR at the end may be half of a CRLF
                }
                if self.buf.get(pos + 1) == Some(&b'\n') {
                    consumed += 1;
                }
            }
            let line = String::from_utf8_lossy(&self.buf[..pos]).into_owned();
            self.buf.drain(..consumed);
            self.line(line);
        }
    }

    fn line(&mut self, line: String) {
        if line.is_empty() {
            if !self.fields.is_empty() {
                let fields = std::mem::take(&mut self.fields);
                self.queue.push_back(SseItem::Event(SseEvent { fields }));
            }
        } else if let Some(c) = line.strip_prefix(':') {
            self.queue.push_back(SseItem::Comment(c.to_string()));
        } else {
            let (name, value) = match line.find(':') {
                Some(i) => {
                    let v = &line[i + 1..];
                    (
                        line[..i].to_string(),
                        v.strip_prefix(' ').unwrap_or(v).to_string(),
                    )
                }
                None => (line.clone(), String::new()),
            };
            self.fields.push((name, value));
        }
    }
}

/// Sends `initialize` through the gateway and returns the `Mcp-Session-Id` the client got.
pub async fn initialize(gw: &Gateway, path: &str) -> String {
    let r = Req::mcp_post(&gw.url(path), initialize_body("1"))
        .send()
        .await;
    assert_eq!(r.status(), 200, "initialize through the gateway");
    let sid = r
        .header("mcp-session-id")
        .expect("initialize answer carries Mcp-Session-Id");
    let _ = r.bytes().await;
    sid
}

/// Asserts a normal request on `session` still goes through to `up` with the session header.
pub async fn assert_session_works(gw: &Gateway, up: &Upstream, session: &str) {
    let before = up.count();
    let body = rpc("\"after-bad\"", "tools/list", "{}");
    let r = Req::mcp_post(&gw.url("/mcp"), body.clone())
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", PROTOCOL_VERSION)
        .send()
        .await;
    assert_eq!(
        r.status(),
        200,
        "session must keep working after a bad request"
    );
    let got = r.json().await;
    assert_eq!(got["id"], Value::from("after-bad"));
    assert_eq!(got["result"]["echo"], Value::from("tools/list"));
    assert_eq!(up.count(), before + 1, "exactly one more upstream request");
    let last = up.last();
    assert_eq!(last.body_str(), body);
    assert_eq!(last.header("mcp-session-id").as_deref(), Some(session));
}

/// GETs an admin path and returns (status, body text).
pub async fn admin_get(gw: &Gateway, path: &str) -> (u16, String) {
    let r = Req::get(&gw.admin_url(path)).send().await;
    let s = r.status();
    (s, r.text().await)
}

// ---------------------------------------------------------------------------------------------
// The real binary
// ---------------------------------------------------------------------------------------------

pub fn taskgate_bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskgate")
}

/// The result of running the binary to completion.
#[derive(Debug)]
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `taskgate ARGS` to completion (killed after `STEP` * 2).
pub fn run_taskgate(args: &[&str], envs: &[(&str, &str)]) -> Ran {
    let mut p = TaskgateProcess::spawn(args, envs);
    let status = p
        .wait_exit(STEP * 2)
        .unwrap_or_else(|| panic!("taskgate {args:?} did not exit"));
    let stdout = p.drain_stdout().join("\n");
    Ran {
        status,
        stdout,
        stderr: p.stderr(),
    }
}

/// `taskgate` as a child process; killed (SIGKILL) and reaped on drop.
pub struct TaskgateProcess {
    child: Child,
    stdout_rx: std::sync::mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    stderr_thread: Option<std::thread::JoinHandle<()>>,
    stdout_thread: Option<std::thread::JoinHandle<()>>,
    exited: Option<ExitStatus>,
    /// The raw `{"listening":...}` line, once [`TaskgateProcess::listening`] read it.
    pub listening_line: Option<String>,
}

impl TaskgateProcess {
    pub fn spawn(args: &[&str], envs: &[(&str, &str)]) -> TaskgateProcess {
        let mut cmd = Command::new(taskgate_bin());
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn taskgate");
        let (tx, stdout_rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        let stdout_thread = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let err = child.stderr.take().unwrap();
        let stderr_thread = {
            let stderr = stderr.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(err);
                let mut buf = [0u8; 4096];
                loop {
                    match r.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => stderr
                            .lock()
                            .unwrap()
                            .push_str(&String::from_utf8_lossy(&buf[..n])),
                    }
                }
            })
        };
        TaskgateProcess {
            child,
            stdout_rx,
            stderr,
            stderr_thread: Some(stderr_thread),
            stdout_thread: Some(stdout_thread),
            exited: None,
            listening_line: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next stdout line, or None when stdout closed or `within` passed.
    pub fn stdout_line(&self, within: Duration) -> Option<String> {
        self.stdout_rx.recv_timeout(within).ok()
    }

    /// Stdout lines not read yet (after exit: everything left).
    pub fn drain_stdout(&mut self) -> Vec<String> {
        if self.exited.is_some() {
            if let Some(t) = self.stdout_thread.take() {
                let _ = t.join();
            }
        }
        self.stdout_rx.try_iter().collect()
    }

    /// Everything written to stderr so far (complete after exit).
    pub fn stderr(&mut self) -> String {
        if self.exited.is_some() {
            if let Some(t) = self.stderr_thread.take() {
                let _ = t.join();
            }
        }
        self.stderr.lock().unwrap().clone()
    }

    pub fn signal(&self, sig: i32) {
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }

    pub fn sigterm(&self) {
        self.signal(libc::SIGTERM)
    }

    /// Waits for exit; None on timeout.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exited {
            return Some(s);
        }
        let until = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                self.exited = Some(s);
                return Some(s);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Reads the `{"listening":{...}}` line: (gateway, admin).
    pub fn listening(&mut self) -> (SocketAddr, SocketAddr) {
        let line = self.stdout_line(STEP * 2).unwrap_or_else(|| {
            let _ = self.wait_exit(Duration::from_millis(200));
            panic!("no listening line on stdout; stderr: {}", self.stderr())
        });
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("listening line is not JSON ({e}): {line:?}"));
        let g = v["listening"]["gateway"]
            .as_str()
            .expect("listening.gateway")
            .parse()
            .unwrap();
        let a = v["listening"]["admin"]
            .as_str()
            .expect("listening.admin")
            .parse()
            .unwrap();
        self.listening_line = Some(line);
        (g, a)
    }
}

impl Drop for TaskgateProcess {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A config file for the binary: listeners on port 0, a store in the temp dir.
pub struct ConfigFile {
    pub dir: tempfile::TempDir,
    pub path: std::path::PathBuf,
}

impl ConfigFile {
    /// Writes `text` to `taskgate.toml` in a fresh temporary directory.
    pub fn write(text: &str) -> ConfigFile {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("taskgate.toml");
        std::fs::write(&path, text).unwrap();
        ConfigFile { dir, path }
    }
    /// A complete config built from `b` with listeners on port 0.
    pub fn from_builder(b: &GatewayBuilder) -> ConfigFile {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let text = b.to_toml(store.to_str().unwrap(), "127.0.0.1:0", "127.0.0.1:0");
        let path = dir.path().join("taskgate.toml");
        std::fs::write(&path, text).unwrap();
        ConfigFile { dir, path }
    }
    pub fn path_str(&self) -> &str {
        self.path.to_str().unwrap()
    }
    pub fn store_path(&self) -> String {
        self.dir.path().join("store").to_str().unwrap().to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// gzip with stored (uncompressed) deflate blocks: enough to script a `Content-Encoding: gzip`
// upstream without a compression library
// ---------------------------------------------------------------------------------------------

pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The 10-byte gzip header.
pub fn gzip_header() -> Vec<u8> {
    vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]
}

/// One stored deflate block (at most 65535 bytes of `data`).
pub fn deflate_stored_block(data: &[u8], last: bool) -> Vec<u8> {
    assert!(data.len() <= 0xFFFF);
    let len = data.len() as u16;
    let mut v = vec![u8::from(last)];
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&(!len).to_le_bytes());
    v.extend_from_slice(data);
    v
}

/// The gzip trailer for the whole uncompressed `data`.
pub fn gzip_trailer(data: &[u8]) -> Vec<u8> {
    let mut v = crc32(data).to_le_bytes().to_vec();
    v.extend_from_slice(&(data.len() as u32).to_le_bytes());
    v
}

/// Decodes a gzip stream made of stored deflate blocks; None if it is anything else or corrupt.
pub fn gunzip_stored(gz: &[u8]) -> Option<Vec<u8>> {
    if gz.len() < 18 || gz[..3] != [0x1f, 0x8b, 8] || gz[3] != 0 {
        return None;
    }
    let mut i = 10;
    let mut out = Vec::new();
    loop {
        let hdr = *gz.get(i)?;
        if hdr & 0b110 != 0 {
            return None; // not a stored block
        }
        let len = u16::from_le_bytes([*gz.get(i + 1)?, *gz.get(i + 2)?]);
        let nlen = u16::from_le_bytes([*gz.get(i + 3)?, *gz.get(i + 4)?]);
        if len != !nlen {
            return None;
        }
        let start = i + 5;
        out.extend_from_slice(gz.get(start..start + len as usize)?);
        i = start + len as usize;
        if hdr & 1 == 1 {
            break;
        }
    }
    let crc = u32::from_le_bytes(gz.get(i..i + 4)?.try_into().ok()?);
    (crc == crc32(&out)).then_some(out)
}
