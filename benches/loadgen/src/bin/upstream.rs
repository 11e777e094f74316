//! A fast MCP upstream (Streamable HTTP, 2025-11-25) for taskgate's benchmark.
//!
//! `upstream [--listen 127.0.0.1:0] [--threads 1]` prints `{"listening":"ADDR"}` on stdout once
//! bound, then serves until killed. `--tls-cert PEM --tls-key PEM`: every connection is TLS
//! (rustls, `http/1.1` by ALPN; scenario 16's `https://` upstream). `upstream --stdio` serves the same answers over stdin/stdout
//! (newline-delimited JSON-RPC, MCP's stdio transport) until stdin ends (scenario 11).
//!
//! `POST /mcp`:
//! - `initialize`: a result with `capabilities.tasks` (list, cancel, requests.tools.call) and an
//!   `Mcp-Session-Id` header; notifications are answered 202;
//! - `tools/call` (plain): a ~1 KiB JSON result; `{name:"big"}`: a ~1 MiB JSON result;
//!   `{name:"progress"}`: an SSE answer with `arguments.count` (default 100) `notifications/progress`
//!   events, `arguments.interval_ms` apart (default 0), then the result;
//! - `tools/call` with `params.task`: a `CreateTaskResult`; the task is kept in an in-memory table and
//!   completes at once, except for `{name:"slow"}` which stays `working` until cancelled;
//! - `tasks/get`, `tasks/result`, `tasks/cancel` (each one received is counted), `tasks/list`.
//!
//! MCP 2026-07-28 (tasks extension `io.modelcontextprotocol/tasks`, SEP-2663), told apart per
//! request by `MCP-Protocol-Version: 2026-07-28` or `_meta["io.modelcontextprotocol/protocolVersion"]`:
//! - `tools/call` whose `params._meta["io.modelcontextprotocol/clientCapabilities"].extensions`
//!   declares the extension: a flat `CreateTaskResult` (`resultType:"task"`, `ttlMs`,
//!   `pollIntervalMs`; `params.task` is ignored); the task is stored completed at once (`slow`:
//!   working), as on the 2025 path. Without the declaration: the plain result (the spec forbids
//!   a task then);
//! - `tasks/get`: a `DetailedTask` (`resultType:"complete"`), carrying the tool's result (the same
//!   ~1 KiB `content` the plain call returns) inline as `result` once completed.
//!
//! `--no-tasks` (issue 32's gateway-task scenario): a server without task support: `initialize`
//! declares no `capabilities.tasks`, `server/discover` no tasks extension (what taskgate with
//! `upstream.tasks = "gateway"` runs the tasks of); the rest is answered as above.
//!
//! `GET /stats`: `{"requests":N,"cancels":N,"tasks":N}`. `DELETE /mcp`: 200.
//!
//! Task ids are global (not per session); the benchmark never needs more.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;

/// A response body made of ready chunks (exact length known) or of a channel (SSE, chunked).
enum OutBody {
    Chunks(VecDeque<Bytes>, u64),
    Chan(tokio::sync::mpsc::Receiver<Bytes>),
}

impl OutBody {
    fn chunks(parts: Vec<Bytes>) -> OutBody {
        let len = parts.iter().map(|b| b.len() as u64).sum();
        OutBody::Chunks(parts.into_iter().filter(|b| !b.is_empty()).collect(), len)
    }
    fn empty() -> OutBody {
        OutBody::Chunks(VecDeque::new(), 0)
    }
}

impl Body for OutBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            OutBody::Chunks(q, left) => match q.pop_front() {
                Some(b) => {
                    *left -= b.len() as u64;
                    Poll::Ready(Some(Ok(Frame::data(b))))
                }
                None => Poll::Ready(None),
            },
            OutBody::Chan(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, OutBody::Chunks(q, _) if q.is_empty())
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            OutBody::Chunks(_, left) => SizeHint::with_exact(*left),
            OutBody::Chan(_) => SizeHint::default(),
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Status {
    Working,
    Completed,
    Cancelled,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Working => "working",
            Status::Completed => "completed",
            Status::Cancelled => "cancelled",
        }
    }
}

struct TaskEntry {
    status: Status,
    created_at: String,
    updated_at: String,
    ttl: u64,
}

const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
const MODERN_VERSION: &str = "2026-07-28";

/// Whether a request is 2026-07-28: the `MCP-Protocol-Version` header, else the `_meta` key.
fn is_modern(header: Option<&str>, params: &Value) -> bool {
    let version = header.or_else(|| {
        params
            .pointer("/_meta/io.modelcontextprotocol~1protocolVersion")
            .and_then(Value::as_str)
    });
    version.is_some_and(|v| v.len() == MODERN_VERSION.len() && v >= MODERN_VERSION)
}

/// Whether `params._meta` declares the tasks extension (SEP-2663 §negotiation).
fn declares_tasks_extension(params: &Value) -> bool {
    params
        .pointer("/_meta/io.modelcontextprotocol~1clientCapabilities/extensions")
        .and_then(|e| e.get(TASKS_EXTENSION))
        .is_some_and(Value::is_object)
}

struct State {
    tasks: Mutex<HashMap<String, TaskEntry>>,
    next_task: AtomicU64,
    next_session: AtomicU64,
    requests: AtomicU64,
    cancels: AtomicU64,
    /// `"result":{...}}` of the small answer (without the leading id).
    small_result: Bytes,
    /// The ~1 MiB result object.
    big_result: Bytes,
    /// A per-process prefix for session ids.
    boot: u64,
    /// `--no-tasks`: neither `capabilities.tasks` nor the tasks extension is declared.
    no_tasks: bool,
}

const SMALL_TEXT_LEN: usize = 960;
const BIG_TEXT_LEN: usize = 1024 * 1024;

fn filler(len: usize) -> String {
    const WORDS: &str = "the quick brown fox jumps over the lazy dog while the gateway relays every message unchanged ";
    WORDS.chars().cycle().take(len).collect()
}

fn tool_result(text_len: usize) -> String {
    serde_json::json!({
        "content": [{"type": "text", "text": filler(text_len)}],
        "isError": false
    })
    .to_string()
}

/// RFC 3339 UTC with milliseconds from Unix ms (civil-from-days, H. Hinnant).
fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn json_response(status: StatusCode, parts: Vec<Bytes>) -> Response<OutBody> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(OutBody::chunks(parts))
        .expect("valid response")
}

/// `{"jsonrpc":"2.0","id":ID,` + rest, as chunks (rest is shared, not copied).
fn rpc(id: &str, rest: Bytes) -> Response<OutBody> {
    let head = Bytes::from(format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},"));
    json_response(StatusCode::OK, vec![head, rest])
}

fn rpc_result(id: &str, result: &str) -> Response<OutBody> {
    rpc(id, Bytes::from(format!("\"result\":{result}}}")))
}

fn rpc_error(id: &str, code: i64, message: &str) -> Response<OutBody> {
    let err = serde_json::json!({"code": code, "message": message});
    rpc(id, Bytes::from(format!("\"error\":{err}}}")))
}

/// The 2026-07-28 `Task` fields, without the closing brace: `{"resultType":R,"taskId":..`.
fn modern_task_head(result_type: &str, id: &str, t: &TaskEntry) -> String {
    let v = serde_json::json!({
        "resultType": result_type,
        "taskId": id,
        "status": t.status.as_str(),
        "createdAt": t.created_at,
        "lastUpdatedAt": t.updated_at,
        "ttlMs": t.ttl,
        "pollIntervalMs": 100,
    })
    .to_string();
    v[..v.len() - 1].to_string()
}

fn task_json(id: &str, t: &TaskEntry) -> String {
    serde_json::json!({
        "taskId": id,
        "status": t.status.as_str(),
        "createdAt": t.created_at,
        "lastUpdatedAt": t.updated_at,
        "ttl": t.ttl,
        "pollInterval": 100,
    })
    .to_string()
}

impl State {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<OutBody> {
        match (req.method().clone(), req.uri().path()) {
            (Method::GET, "/stats") => {
                let tasks = self.tasks.lock().expect("tasks").len();
                let body = serde_json::json!({
                    "requests": self.requests.load(Ordering::Relaxed),
                    "cancels": self.cancels.load(Ordering::Relaxed),
                    "tasks": tasks,
                });
                json_response(StatusCode::OK, vec![Bytes::from(body.to_string())])
            }
            (Method::POST, "/mcp") => self.post(req).await,
            (Method::DELETE, "/mcp") => Response::new(OutBody::empty()),
            (Method::GET, "/mcp") => Response::builder()
                .status(StatusCode::METHOD_NOT_ALLOWED)
                .body(OutBody::empty())
                .expect("valid response"),
            _ => Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(OutBody::empty())
                .expect("valid response"),
        }
    }

    async fn post(self: Arc<Self>, req: Request<Incoming>) -> Response<OutBody> {
        let version_header = req
            .headers()
            .get("mcp-protocol-version")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = match req.into_body().collect().await {
            Ok(c) => c.to_bytes(),
            Err(_) => return json_response(StatusCode::BAD_REQUEST, vec![]),
        };
        self.answer(version_header, bytes).await
    }

    /// One JSON-RPC message (a POST body, or a line on stdin with `--stdio`), answered as the
    /// HTTP response would be: 202 for a notification or a response, else a JSON or SSE body.
    async fn answer(
        self: Arc<Self>,
        version_header: Option<String>,
        bytes: Bytes,
    ) -> Response<OutBody> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let msg: Value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(e) => {
                return rpc_error("null", -32700, &format!("parse error: {e}"));
            }
        };
        let Some(id) = msg.get("id").map(Value::to_string) else {
            // A notification or a response: accepted.
            return Response::builder()
                .status(StatusCode::ACCEPTED)
                .body(OutBody::empty())
                .expect("valid response");
        };
        let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let modern = is_modern(version_header.as_deref(), &params);
        match method {
            "initialize" => {
                let n = self.next_session.fetch_add(1, Ordering::Relaxed);
                let mut result = serde_json::json!({
                    "protocolVersion": "2025-11-25",
                    "capabilities": {
                        "tools": {"listChanged": false},
                        "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
                    },
                    "serverInfo": {"name": "taskgate-bench-upstream", "version": "0.1.0"}
                });
                if self.no_tasks {
                    result["capabilities"] = serde_json::json!({"tools": {"listChanged": false}});
                }
                let mut resp = rpc_result(&id, &result.to_string());
                resp.headers_mut().insert(
                    "mcp-session-id",
                    format!("bench-{:x}-{n}", self.boot).parse().expect("ascii"),
                );
                resp
            }
            "ping" => rpc_result(&id, "{}"),
            // 2026-07-28: servers MUST implement `server/discover` (taskgate asks it to learn
            // an `auto` upstream's era; without it the upstream counts as 2025-11-25 only and
            // 2026 requests would be bridged).
            "server/discover" if self.no_tasks => rpc_result(
                &id,
                &serde_json::json!({
                    "resultType": "complete",
                    "supportedVersions": ["2025-11-25", MODERN_VERSION],
                    "capabilities": {"tools": {"listChanged": false}},
                    "_meta": {"io.modelcontextprotocol/serverInfo":
                        {"name": "taskgate-bench-upstream", "version": "0.1.0"}}
                })
                .to_string(),
            ),
            "server/discover" => rpc_result(
                &id,
                &serde_json::json!({
                    "resultType": "complete",
                    "supportedVersions": ["2025-11-25", MODERN_VERSION],
                    "capabilities": {
                        "tools": {"listChanged": false},
                        "extensions": {"io.modelcontextprotocol/tasks": {}}
                    },
                    "ttlMs": 3_600_000,
                    "cacheScope": "public",
                    "_meta": {"io.modelcontextprotocol/serverInfo":
                        {"name": "taskgate-bench-upstream", "version": "0.1.0"}}
                })
                .to_string(),
            ),
            "tools/call" if modern && declares_tasks_extension(&params) => {
                self.modern_tools_call(&id, &params)
            }
            "tools/call" => self.tools_call(&id, &params),
            "tasks/get" if modern => {
                let small = self.small_result.clone();
                self.with_task(&id, &params, |tid, t| {
                    let head = modern_task_head("complete", tid, t);
                    if t.status == Status::Completed {
                        // small_result is `"result":{...}}`: the tool's result as `result`,
                        // and the closing brace of the DetailedTask.
                        Ok(format!("{head},{}", String::from_utf8_lossy(&small)))
                    } else {
                        Ok(format!("{head}}}"))
                    }
                })
            }
            "tasks/get" => self.with_task(&id, &params, |tid, t| Ok(task_json(tid, t))),
            "tasks/result" => self.task_result(&id, &params).await,
            "tasks/cancel" => {
                self.cancels.fetch_add(1, Ordering::Relaxed);
                self.with_task(&id, &params, |tid, t| {
                    if t.status != Status::Working {
                        return Err(format!(
                            "Cannot cancel task {tid}: already {}",
                            t.status.as_str()
                        ));
                    }
                    t.status = Status::Cancelled;
                    t.updated_at = rfc3339(now_ms());
                    Ok(task_json(tid, t))
                })
            }
            "tasks/list" => {
                let tasks = self.tasks.lock().expect("tasks");
                let list: Vec<Value> = tasks
                    .iter()
                    .take(50)
                    .map(|(k, t)| serde_json::from_str(&task_json(k, t)).expect("json"))
                    .collect();
                rpc_result(&id, &serde_json::json!({ "tasks": list }).to_string())
            }
            "tools/list" => rpc_result(
                &id,
                r#"{"tools":[{"name":"echo","inputSchema":{"type":"object"},"execution":{"taskSupport":"optional"}},{"name":"big","inputSchema":{"type":"object"}},{"name":"progress","inputSchema":{"type":"object"}},{"name":"slow","inputSchema":{"type":"object"},"execution":{"taskSupport":"optional"}}]}"#,
            ),
            other => rpc_error(&id, -32601, &format!("Method not found: {other}")),
        }
    }

    fn tools_call(&self, id: &str, params: &Value) -> Response<OutBody> {
        let name = params.get("name").and_then(Value::as_str).unwrap_or("");
        if let Some(task) = params.get("task").filter(|t| t.is_object()) {
            let n = self.next_task.fetch_add(1, Ordering::Relaxed);
            let task_id = format!("t-{:x}-{n}", self.boot);
            let now = rfc3339(now_ms());
            let ttl = task.get("ttl").and_then(Value::as_u64).unwrap_or(3_600_000);
            let created = TaskEntry {
                status: Status::Working,
                created_at: now.clone(),
                updated_at: now,
                ttl,
            };
            let body = format!("{{\"task\":{}}}", task_json(&task_id, &created));
            let stored = TaskEntry {
                status: if name == "slow" {
                    Status::Working
                } else {
                    Status::Completed
                },
                ..created
            };
            self.tasks.lock().expect("tasks").insert(task_id, stored);
            return rpc_result(id, &body);
        }
        match name {
            "big" => rpc(id, self.big_result.clone()),
            "progress" => self.progress(id, params),
            _ => rpc(id, self.small_result.clone()),
        }
    }

    /// A 2026-07-28 `tools/call` that declared the tasks extension: always a task (the server's
    /// choice), answered with the flat `CreateTaskResult`.
    fn modern_tools_call(&self, id: &str, params: &Value) -> Response<OutBody> {
        let name = params.get("name").and_then(Value::as_str).unwrap_or("");
        let n = self.next_task.fetch_add(1, Ordering::Relaxed);
        let task_id = format!("t-{:x}-{n}", self.boot);
        let now = rfc3339(now_ms());
        let created = TaskEntry {
            status: Status::Working,
            created_at: now.clone(),
            updated_at: now,
            ttl: 3_600_000,
        };
        let body = format!("{}}}", modern_task_head("task", &task_id, &created));
        let stored = TaskEntry {
            status: if name == "slow" {
                Status::Working
            } else {
                Status::Completed
            },
            ..created
        };
        self.tasks.lock().expect("tasks").insert(task_id, stored);
        rpc_result(id, &body)
    }

    fn progress(&self, id: &str, params: &Value) -> Response<OutBody> {
        let args = params.get("arguments");
        let count = args
            .and_then(|a| a.get("count"))
            .and_then(Value::as_u64)
            .unwrap_or(100);
        let interval = args
            .and_then(|a| a.get("interval_ms"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let token = params
            .pointer("/_meta/progressToken")
            .map(Value::to_string)
            .unwrap_or_else(|| id.to_string());
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(128);
        let id = id.to_string();
        let result = self.small_result.clone();
        tokio::spawn(async move {
            for i in 1..=count {
                let ev = format!(
                    "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{\"progressToken\":{token},\"progress\":{i},\"total\":{count},\"message\":\"step {i} of {count}\"}}}}\n\n"
                );
                if tx.send(Bytes::from(ev)).await.is_err() {
                    return;
                }
                if interval > 0 {
                    tokio::time::sleep(Duration::from_millis(interval)).await;
                }
            }
            let mut last = Vec::with_capacity(result.len() + 64);
            last.extend_from_slice(b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":");
            last.extend_from_slice(id.as_bytes());
            last.extend_from_slice(b",");
            last.extend_from_slice(&result);
            last.extend_from_slice(b"\n\n");
            let _ = tx.send(Bytes::from(last)).await;
        });
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "text/event-stream")
            .header("cache-control", "no-cache")
            .body(OutBody::Chan(rx))
            .expect("valid response")
    }

    fn with_task(
        &self,
        id: &str,
        params: &Value,
        f: impl FnOnce(&str, &mut TaskEntry) -> Result<String, String>,
    ) -> Response<OutBody> {
        let Some(task_id) = params.get("taskId").and_then(Value::as_str) else {
            return rpc_error(id, -32602, "params.taskId is required");
        };
        let out = {
            let mut tasks = self.tasks.lock().expect("tasks");
            match tasks.get_mut(task_id) {
                Some(t) => Some(f(task_id, t)),
                None => None,
            }
        };
        match out {
            Some(Ok(json)) => rpc_result(id, &json),
            Some(Err(message)) => rpc_error(id, -32602, &message),
            None => rpc_error(id, -32602, &format!("Task not found: {task_id}")),
        }
    }

    async fn task_result(&self, id: &str, params: &Value) -> Response<OutBody> {
        let Some(task_id) = params.get("taskId").and_then(Value::as_str) else {
            return rpc_error(id, -32602, "params.taskId is required");
        };
        // A slow task blocks tasks/result until it is terminal (polled; the benchmark never waits).
        for _ in 0..60_000 {
            let status = self
                .tasks
                .lock()
                .expect("tasks")
                .get(task_id)
                .map(|t| t.status);
            match status {
                None => return rpc_error(id, -32602, &format!("Task not found: {task_id}")),
                Some(Status::Working) => tokio::time::sleep(Duration::from_millis(10)).await,
                Some(Status::Cancelled) => {
                    return rpc_error(id, -32602, &format!("Task {task_id} was cancelled"))
                }
                Some(Status::Completed) => {
                    let meta = format!(
                        ",\"_meta\":{{\"io.modelcontextprotocol/related-task\":{{\"taskId\":\"{task_id}\"}}}}}}"
                    );
                    // small_result is `"result":{...}}`: splice _meta into the result object.
                    let r = &self.small_result[..self.small_result.len() - 2];
                    let mut body = Vec::with_capacity(r.len() + meta.len() + 1);
                    body.extend_from_slice(r);
                    body.extend_from_slice(meta.as_bytes());
                    body.push(b'}');
                    return rpc(id, Bytes::from(body));
                }
            }
        }
        rpc_error(id, -32603, "tasks/result timed out in the bench upstream")
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn new_state() -> Arc<State> {
    Arc::new(State {
        tasks: Mutex::new(HashMap::new()),
        next_task: AtomicU64::new(1),
        next_session: AtomicU64::new(1),
        requests: AtomicU64::new(0),
        cancels: AtomicU64::new(0),
        small_result: Bytes::from(format!("\"result\":{}}}", tool_result(SMALL_TEXT_LEN))),
        big_result: Bytes::from(format!("\"result\":{}}}", tool_result(BIG_TEXT_LEN))),
        boot: now_ms() & 0xffff_ffff,
        no_tasks: std::env::args().any(|a| a == "--no-tasks"),
    })
}

/// The answer's JSON-RPC messages as stdio lines (each ending in `\n`), appended to `out`: a JSON
/// body is one line, an SSE body one line per event's `data`, a 202 none.
async fn answer_lines(resp: Response<OutBody>, out: &mut Vec<u8>) {
    if resp.status() == StatusCode::ACCEPTED {
        return;
    }
    let sse = resp
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    match resp.into_body() {
        OutBody::Chunks(parts, _) => {
            for p in parts {
                out.extend_from_slice(&p);
            }
            out.push(b'\n');
        }
        OutBody::Chan(mut rx) => {
            while let Some(ev) = rx.recv().await {
                for line in ev.split(|&b| b == b'\n') {
                    if let Some(data) = line.strip_prefix(b"data: ") {
                        out.extend_from_slice(data);
                        out.push(b'\n');
                    }
                }
            }
            debug_assert!(sse);
        }
    }
}

/// `--stdio`: MCP over stdin/stdout (newline-delimited JSON-RPC, the stdio transport) with the
/// same answers as `POST /mcp` (scenario 11: taskgate's stdio upstream, its direct client, and
/// supergateway). The reading thread answers every message that is ready at once (all but a
/// `tasks/result` of a `working` task and `progress` with `interval_ms`) inline, and writes the
/// answers when no more input is buffered (one `write` for a batch); a message that has to wait
/// is finished on a second thread's runtime. Ends at EOF on stdin.
fn serve_stdio(state: Arc<State>) {
    use std::future::Future;
    use std::io::{BufRead, Read};
    let background = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let stdout = Arc::new(Mutex::new(std::io::stdout()));
    let write = |stdout: &Mutex<std::io::Stdout>, buf: &[u8]| {
        let out = stdout.lock().expect("stdout");
        let mut out = out.lock();
        if out.write_all(buf).and_then(|()| out.flush()).is_err() {
            std::process::exit(0); // the reader is gone
        }
    };
    let mut input = std::io::BufReader::with_capacity(256 * 1024, std::io::stdin().lock());
    let mut line = Vec::with_capacity(4096);
    let mut pending_out = Vec::with_capacity(64 * 1024);
    let _enter = background.enter();
    let mut cx = Context::from_waker(std::task::Waker::noop());
    loop {
        line.clear();
        match input.by_ref().read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let msg = line.trim_ascii();
        if !msg.is_empty() {
            let mut fut = Box::pin({
                let state = state.clone();
                let msg = Bytes::copy_from_slice(msg);
                async move {
                    let mut out = Vec::new();
                    answer_lines(state.answer(None, msg).await, &mut out).await;
                    out
                }
            });
            match fut.as_mut().poll(&mut cx) {
                Poll::Ready(out) => pending_out.extend_from_slice(&out),
                Poll::Pending => {
                    let stdout = stdout.clone();
                    background.spawn(async move {
                        let out = fut.await;
                        write(&stdout, &out);
                    });
                }
            }
        }
        if input.buffer().is_empty() && !pending_out.is_empty() {
            write(&stdout, &pending_out);
            pending_out.clear();
        }
    }
    if !pending_out.is_empty() {
        write(&stdout, &pending_out);
    }
}

/// A TLS acceptor with the certificate chain in `cert` and its key in `key` (PEM files).
fn tls_acceptor(cert: &str, key: &str) -> tokio_rustls::TlsAcceptor {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .expect("--tls-cert")
        .collect::<Result<Vec<_>, _>>()
        .expect("--tls-cert PEM");
    let key = PrivateKeyDer::from_pem_file(key).expect("--tls-key PEM");
    let mut config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("TLS certificate and key");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--stdio") {
        serve_stdio(new_state());
        return;
    }
    let listen = arg(&args, "--listen").unwrap_or_else(|| "127.0.0.1:0".into());
    let threads: usize = arg(&args, "--threads")
        .map(|t| t.parse().expect("--threads N"))
        .unwrap_or(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .expect("tokio runtime");
    let tls = arg(&args, "--tls-cert").map(|cert| {
        let key = arg(&args, "--tls-key").expect("--tls-key PEM with --tls-cert");
        tls_acceptor(&cert, &key)
    });
    runtime.block_on(async move {
        let listener = TcpListener::bind(&listen).await.expect("bind");
        let addr = listener.local_addr().expect("bound");
        let state = new_state();
        {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "{}",
                serde_json::json!({ "listening": addr.to_string() })
            );
            let _ = out.flush();
        }
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let _ = stream.set_nodelay(true);
            let state = state.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(state.handle(req).await) }
                });
                let mut http = hyper::server::conn::http1::Builder::new();
                let _ = match tls {
                    Some(acceptor) => {
                        let Ok(stream) = acceptor.accept(stream).await else {
                            return;
                        };
                        http.keep_alive(true)
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                    None => {
                        http.keep_alive(true)
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                };
            });
        }
    });
}
