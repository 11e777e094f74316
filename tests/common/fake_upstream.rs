//! The scripted upstream: a hyper server on `127.0.0.1:0` that records every request it
//! receives ([`RecordedRequest`]) and answers what the test's handler returns
//! ([`ScriptedResponse`]: JSON or any body, SSE with raw field control, 202, any status, or never
//! answering), plus [`mcp_handler`], a well-behaved MCP server.

use super::*;

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
    pub(super) rx: mpsc::Receiver<Bytes>,
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
    /// Requests answered with [`ScriptedResponse::hang`] whose caller went away.
    hangs_abandoned: watch::Sender<usize>,
}

/// Counts a hanging request as abandoned when hyper drops it (its connection closed).
struct HangGuard(Arc<UpstreamShared>);

impl Drop for HangGuard {
    fn drop(&mut self) {
        self.0.hangs_abandoned.send_modify(|n| *n += 1);
    }
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
            hangs_abandoned: watch::channel(0).0,
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
    /// Every JSON-RPC message with this method received so far.
    /// The `params.taskId` of the first `tasks/cancel` this upstream receives within `within`.
    pub async fn first_cancelled_task(&self, within: Duration) -> Option<String> {
        let cancels = eventually(within, || async {
            let c = self.received("tasks/cancel");
            (!c.is_empty()).then_some(c)
        })
        .await?;
        cancels[0].json()["params"]["taskId"]
            .as_str()
            .map(str::to_string)
    }

    pub fn received(&self, method: &str) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.rpc_method().as_deref() == Some(method))
            .collect()
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
    /// Waits (up to `within`) until at least `n` messages with `method` arrived; false if not.
    #[allow(dead_code)]
    pub async fn wait_for_method(&self, method: &str, n: usize, within: Duration) -> bool {
        let mut rx = self.shared.count.subscribe();
        tokio::time::timeout(within, async {
            loop {
                if self.received(method).len() >= n {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await
        .is_ok()
            && self.received(method).len() >= n
    }
    /// Waits (up to `within`) until a request matching `which` arrived; false if none did.
    #[allow(dead_code)]
    pub async fn wait_for_request(
        &self,
        which: impl Fn(&RecordedRequest) -> bool,
        within: Duration,
    ) -> bool {
        let mut rx = self.shared.count.subscribe();
        let seen = |up: &Self| up.requests().iter().any(&which);
        tokio::time::timeout(within, async {
            while !seen(self) {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await
        .is_ok()
            && seen(self)
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
    /// How many requests answered with [`ScriptedResponse::hang`] lost their caller.
    pub fn hangs_abandoned(&self) -> usize {
        *self.shared.hangs_abandoned.borrow()
    }
    /// Waits until at least `n` hanging requests lost their caller; false on timeout.
    pub async fn wait_for_hangs_abandoned(&self, n: usize, within: Duration) -> bool {
        let mut rx = self.shared.hangs_abandoned.subscribe();
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
            ScriptedResponse::Hang => {
                let _abandoned = HangGuard(shared.clone());
                std::future::pending::<()>().await
            }
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

/// A server-to-client notification (`notifications/message` "note N").
pub fn server_note(n: u32) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":"note {n}"}}}}"#
    )
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
