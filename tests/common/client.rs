//! The test's side of the wire: [`Req`] / [`Resp`] / [`SseReader`] (a hyper client that shows a
//! response the moment its headers arrive and yields SSE events one by one), JSON-RPC message
//! builders, the JSON-RPC [`Client`] of taskgate (bearer token, session) and the helpers that
//! read an upgraded call's stream to its answer.

use super::*;

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

/// A body of exactly `n` bytes that is a valid JSON-RPC request.
pub fn body_of_len(n: usize) -> String {
    let head = r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":""#;
    let tail = r#""}}"#;
    let pad = n - head.len() - tail.len();
    let s = format!("{head}{}{tail}", "x".repeat(pad));
    assert_eq!(s.len(), n);
    s
}

/// Parses bytes as JSON or panics with the text.
pub fn parse_json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(bytes)))
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

// =============================================================================================
// Client
// =============================================================================================

/// A JSON-RPC client of taskgate: optional bearer token and `Mcp-Session-Id`.
#[derive(Clone)]
pub struct Client {
    pub url: String,
    pub token: Option<String>,
    pub session: Option<String>,
}

impl Client {
    pub fn new(url: &str) -> Client {
        Client {
            url: url.into(),
            token: None,
            session: None,
        }
    }
    pub fn with_token(mut self, token: &str) -> Client {
        self.token = Some(token.into());
        self
    }
    pub fn with_session(mut self, session: &str) -> Client {
        self.session = Some(session.into());
        self
    }
    pub fn req(&self, body: impl Into<String>) -> Req {
        let mut r =
            Req::mcp_post(&self.url, body.into()).header("mcp-protocol-version", PROTOCOL_VERSION);
        if let Some(t) = &self.token {
            r = r.header("authorization", &format!("Bearer {t}"));
        }
        if let Some(s) = &self.session {
            r = r.header("mcp-session-id", s);
        }
        r
    }
    pub async fn send(&self, body: impl Into<String>) -> Resp {
        self.req(body).send().await
    }
    /// Sends a request and returns the JSON-RPC message answering it (JSON body, or the first
    /// response in an SSE body).
    pub async fn rpc(&self, body: impl Into<String>) -> Value {
        let body = body.into();
        let r = self.send(body.clone()).await;
        assert_eq!(r.status(), 200, "HTTP status for {body}");
        let sse = r
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"));
        if !sse {
            return r.json().await;
        }
        let mut reader = r.sse();
        loop {
            let e = reader.next_event(STEP).await;
            let v = e.json();
            if v.get("id").is_some() && (v.get("result").is_some() || v.get("error").is_some()) {
                return v;
            }
        }
    }
    /// Opens this client's session GET stream: asserts HTTP 200 and returns its events.
    pub async fn get_stream(&self) -> SseReader {
        self.open_get_stream(None).await
    }
    /// Resumes this client's session GET stream (`Last-Event-ID: e-before`): asserts HTTP 200
    /// and returns its events.
    pub async fn resumed_get_stream(&self) -> SseReader {
        self.open_get_stream(Some("e-before")).await
    }
    async fn open_get_stream(&self, last_event_id: Option<&str>) -> SseReader {
        let mut get = Req::mcp_get(&self.url)
            .header(
                "mcp-session-id",
                self.session.as_deref().expect("a session"),
            )
            .header("mcp-protocol-version", PROTOCOL_VERSION);
        if let Some(id) = last_event_id {
            get = get.header("last-event-id", id);
        }
        let get = get.send().await;
        assert_eq!(get.status(), 200);
        get.sse()
    }
    /// `initialize`; keeps the `Mcp-Session-Id` taskgate relayed (if any). Returns the result.
    pub async fn initialize(&mut self) -> Value {
        let r = self.send(initialize_body("\"init\"")).await;
        assert_eq!(r.status(), 200, "initialize");
        self.session = r.header("mcp-session-id");
        r.json().await
    }
    /// A task-augmented `tools/call` body (`ttl` omitted when None).
    pub fn create_body(id_json: &str, ttl: Option<u64>) -> String {
        let task = match ttl {
            Some(t) => json!({ "ttl": t }),
            None => json!({}),
        };
        rpc(
            id_json,
            "tools/call",
            &json!({
                "name": "slow",
                "arguments": {"n": 1},
                "task": task,
                "_meta": {"progressToken": format!("pt-{}", id_json.trim_matches('"'))},
            })
            .to_string(),
        )
    }
    /// Creates a task; returns its taskId (panics on anything but a CreateTaskResult).
    /// A gateway task (`upstream.tasks = "gateway"`) of the tool `slow` (ttl 10 min) whose
    /// call `up` holds: its taskId, once the call reached `up`.
    pub async fn create_held_gateway_task(&self, up: &Upstream) -> String {
        let v = self
            .rpc(rpc(
                "1",
                "tools/call",
                &json!({"name": "slow", "arguments": {}, "task": {"ttl": 600000}}).to_string(),
            ))
            .await;
        let task = v
            .pointer("/result/task/taskId")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("not a CreateTaskResult: {v}"))
            .to_string();
        assert!(
            up.wait_for_method("tools/call", 1, STEP).await,
            "the call is held upstream"
        );
        task
    }

    pub async fn create_task(&self, id_json: &str) -> String {
        let v = self.rpc(Client::create_body(id_json, Some(60_000))).await;
        v.pointer("/result/task/taskId")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("not a CreateTaskResult: {v}"))
            .to_string()
    }
    pub async fn task_call(&self, id_json: &str, method: &str, task_id: &str) -> Value {
        self.rpc(rpc(
            id_json,
            method,
            &json!({ "taskId": task_id }).to_string(),
        ))
        .await
    }
    pub async fn get(&self, id_json: &str, task_id: &str) -> Value {
        self.task_call(id_json, "tasks/get", task_id).await
    }
    pub async fn cancel(&self, id_json: &str, task_id: &str) -> Value {
        self.task_call(id_json, "tasks/cancel", task_id).await
    }
    pub async fn result(&self, id_json: &str, task_id: &str) -> Value {
        self.task_call(id_json, "tasks/result", task_id).await
    }
    /// `tasks/result` of a task that waits for the client's input: the answer (HTTP 200) is an
    /// SSE stream whose first event is the task's status notification. Returns the stream, to
    /// read on, and that notification.
    pub async fn input_stream(&self, id_json: &str, task_id: &str) -> (SseReader, Value) {
        let resp = self
            .send(rpc(
                id_json,
                "tasks/result",
                &json!({ "taskId": task_id }).to_string(),
            ))
            .await;
        assert_eq!(resp.status(), 200);
        let mut sse = resp.sse();
        let status = sse.next_event(STEP).await.json();
        assert_eq!(status["method"], "notifications/tasks/status", "{status}");
        (sse, status)
    }
    pub async fn list(&self, id_json: &str, cursor: Option<Value>) -> Value {
        let params = match cursor {
            Some(c) => json!({ "cursor": c }),
            None => json!({}),
        };
        self.rpc(rpc(id_json, "tasks/list", &params.to_string()))
            .await
    }
    /// POSTs a notification; returns the HTTP status.
    pub async fn notify(&self, method: &str, params: Value) -> u16 {
        let r = self.send(notification(method, &params.to_string())).await;
        let s = r.status();
        let _ = r.bytes().await;
        s
    }
}

/// The `Task` of `task_id` in a `tasks/list` answer (panics naming the answer when it is not
/// listed).
pub fn listed_task(list: &Value, task_id: &str) -> Value {
    list["result"]["tasks"]
        .as_array()
        .and_then(|tasks| tasks.iter().find(|t| t["taskId"] == task_id))
        .cloned()
        .unwrap_or_else(|| panic!("{task_id} not listed: {list}"))
}

/// The JSON-RPC error code of a message (panics when it is not an error).
pub fn err_code(v: &Value) -> i64 {
    v.pointer("/error/code")
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("expected a JSON-RPC error, got {v}"))
}

pub fn err_message(v: &Value) -> String {
    v.pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// `params.task` values taskgate cannot bound (2025-11-25 `TaskMetadata` is an object whose
/// optional `ttl` is a number of ms), each with the member its `-32602` names.
pub const UNBOUNDABLE_TASKS: [(&str, &str); 8] = [
    ("[]", "params.task"),
    ("null", "params.task"),
    ("\"x\"", "params.task"),
    ("7", "params.task"),
    (r#"{"ttl":"99999999"}"#, "params.task.ttl"),
    (r#"{"ttl":true}"#, "params.task.ttl"),
    (r#"{"ttl":-1}"#, "params.task.ttl"),
    (r#"{"ttl":[]}"#, "params.task.ttl"),
];

/// Calls `tool` with each of [`UNBOUNDABLE_TASKS`] as its `params.task` and asserts the answer
/// is `-32602` (HTTP 200, 2025-11-25) naming the member.
pub async fn assert_unboundable_tasks_refused(c: &Client, tool: &str) {
    for (i, (task, member)) in UNBOUNDABLE_TASKS.iter().enumerate() {
        let v = c
            .rpc(rpc(
                &format!("\"unboundable-{i}\""),
                "tools/call",
                &format!(r#"{{"name":"{tool}","arguments":{{}},"task":{task}}}"#),
            ))
            .await;
        assert_eq!(err_code(&v), -32602, "task {task}: {v}");
        assert!(err_message(&v).contains(member), "task {task}: {v}");
    }
}

// =============================================================================================
// Client side
// =============================================================================================

/// `initialize` with these client capabilities (then `notifications/initialized`); returns a
/// client holding the session id taskgate relayed.
pub async fn client_with(url: &str, capabilities: Value) -> Client {
    let mut c = Client::new(url);
    let body = rpc(
        "\"init\"",
        "initialize",
        &json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": capabilities,
            "clientInfo": {"name": "taskgate-upgrade-tests", "version": "0"},
        })
        .to_string(),
    );
    let r = c.send(body).await;
    assert_eq!(r.status(), 200, "initialize");
    c.session = r.header("mcp-session-id");
    let v = r.json().await;
    assert!(v.get("result").is_some(), "initialize failed: {v}");
    assert_eq!(c.notify("notifications/initialized", json!({})).await, 202);
    c
}

/// A plain `tools/call` body (no `params.task`); `progressToken` in `_meta` when given.
pub fn call_body(id_json: &str, tool: &str, progress_token: Option<Value>) -> String {
    let mut params = json!({ "name": tool, "arguments": {"n": 1} });
    if let Some(t) = progress_token {
        params["_meta"] = json!({ "progressToken": t });
    }
    rpc(id_json, "tools/call", &params.to_string())
}

/// What the client got for one call: every message before the answer, and the answer.
#[derive(Debug)]
pub struct Outcome {
    pub content_type: String,
    pub before: Vec<Value>,
    pub answer: Value,
    /// Messages after the answer on the same stream (should be none).
    pub after: Vec<Value>,
    pub elapsed: Duration,
}

impl Outcome {
    /// The `notifications/progress` messages before the answer.
    pub fn progress(&self) -> Vec<Value> {
        self.before
            .iter()
            .filter(|m| m["method"] == json!("notifications/progress"))
            .cloned()
            .collect()
    }
}

/// Sends `body`, reads JSON or the SSE stream up to the message answering `id`, then to the
/// end of the stream.
pub async fn call(c: &Client, body: &str, id: &Value) -> Outcome {
    let start = Instant::now();
    let r = c.send(body.to_string()).await;
    assert_eq!(r.status(), 200, "HTTP status for {body}");
    let content_type = r.header("content-type").unwrap_or_default();
    if !content_type.starts_with("text/event-stream") {
        let answer = r.json().await;
        return Outcome {
            content_type,
            before: vec![],
            answer,
            after: vec![],
            elapsed: start.elapsed(),
        };
    }
    let mut sse = r.sse();
    read_to_answer(&mut sse, id, content_type, start).await
}

pub async fn read_to_answer(
    sse: &mut SseReader,
    id: &Value,
    content_type: String,
    start: Instant,
) -> Outcome {
    let mut before = Vec::new();
    let answer = loop {
        let e = sse.next_event(STEP).await;
        let Some(data) = e.data() else { continue };
        if data.is_empty() {
            continue;
        }
        let v = parse_json(data.as_bytes());
        if v.get("method").is_none() && &v["id"] == id {
            break v;
        }
        before.push(v);
    };
    let elapsed = start.elapsed();
    let mut after = Vec::new();
    loop {
        match sse.next(STEP).await {
            Next::Item(SseItem::Event(e)) => {
                if let Some(d) = e.data().filter(|d| !d.is_empty()) {
                    after.push(parse_json(d.as_bytes()));
                }
            }
            Next::Item(SseItem::Comment(_)) => {}
            Next::End => break,
            Next::Timeout => panic!("the stream did not end after the answer"),
        }
    }
    Outcome {
        content_type,
        before,
        answer,
        after,
        elapsed,
    }
}
