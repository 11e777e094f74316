//! Stateful scripted MCP 2025-11-25 servers built on [`Upstream`].
//!
//! - [`TaskServer`]: `initialize` hands out `sess-N`, a task-augmented `tools/call` answers a
//!   `CreateTaskResult` (JSON or inside SSE, with scripted events before/after it), `tasks/get`,
//!   `tasks/cancel`, `tasks/result` follow a per-task status the test can change at any moment.
//! - [`UpServer`]: tools and tasks, for upgraded calls. `initialize` hands out `sess-N` and
//!   declares the configured `capabilities.tasks`; `tools/list` pages through a tool list the test
//!   can change (JSON or SSE); a plain `tools/call` to a `required` tool is refused the way the
//!   SDKs refuse it (a `CallToolResult` with `isError: true`); a task-augmented one creates a task
//!   that completes after a fixed time (or never). `tasks/result` blocks until then, optionally
//!   sending scripted events first (progress, `notifications/tasks/status`, an `elicitation/create`
//!   or `sampling/createMessage` request whose answer the client POSTs back); `tasks/get` reports
//!   the status with a `statusMessage` that changes over time; `tasks/cancel` cancels.

use super::*;

// =============================================================================================
// Scripted task server
// =============================================================================================

/// One task as the scripted server holds it.
#[derive(Clone, Debug)]
pub struct ServerTask {
    pub status: String,
    pub status_message: Option<String>,
    pub created_at: String,
    pub last_updated_at: String,
    pub ttl: Value,
    /// The `Mcp-Session-Id` the creating request came on.
    pub session: Option<String>,
}

impl ServerTask {
    pub fn to_json(&self, task_id: &str) -> Value {
        let mut t = json!({
            "taskId": task_id,
            "status": self.status,
            "createdAt": self.created_at,
            "lastUpdatedAt": self.last_updated_at,
            "ttl": self.ttl,
            "pollInterval": 100,
        });
        if let Some(m) = &self.status_message {
            t["statusMessage"] = Value::from(m.clone());
        }
        if self.ttl == Value::from(NO_TTL) {
            if let Some(t) = t.as_object_mut() {
                t.remove("ttl");
            }
        }
        t
    }
}

/// A `ttl_override` that makes the server leave `ttl` out of its tasks (a required member in
/// both eras: a server that does not conform).
pub const NO_TTL: &str = "(no ttl member)";

/// Mutable state of the scripted server; tests lock it to change a task's status at will.
#[derive(Default)]
pub struct ServerState {
    pub next_session: usize,
    pub next_task: usize,
    pub tasks: HashMap<String, ServerTask>,
    /// Statuses `tasks/get` reports for a task instead of its real one, one per call.
    pub get_script: HashMap<String, VecDeque<String>>,
    /// Sessions the server forgot (a restart): a request on one is answered HTTP 404 `-32001`
    /// "Session not found", as the SDK servers answer an unknown session.
    pub lost_sessions: std::collections::HashSet<String>,
}

impl ServerState {
    /// A restart: every task and every session issued so far are forgotten.
    pub fn forget_everything(&mut self) {
        self.tasks.clear();
        self.lost_sessions
            .extend((1..=self.next_session).map(|n| format!("sess-{n}")));
    }
}

impl ServerState {
    /// Sets a task's status (the upstream's own view).
    pub fn set(&mut self, task_id: &str, status: &str) {
        let t = self
            .tasks
            .get_mut(task_id)
            .unwrap_or_else(|| panic!("scripted server has no task {task_id}"));
        t.status = status.to_string();
        t.last_updated_at = format_rfc3339_ms(now_ms());
    }
    pub fn status(&self, task_id: &str) -> String {
        self.tasks[task_id].status.clone()
    }
}

type StepsFn = Arc<dyn Fn(&str, &Value) -> Vec<SseStep> + Send + Sync>;

/// How the scripted server behaves. Closures get the taskId and the whole request JSON.
#[derive(Clone)]
pub struct Behaviour {
    /// `initialize` answers with `Mcp-Session-Id: sess-N` (default true).
    pub sessions: bool,
    /// `capabilities.tasks` in the `InitializeResult` (default list, cancel, tools/call).
    pub tasks_capability: Value,
    /// Answer a task-augmented `tools/call` with SSE instead of JSON.
    pub creation_sse: bool,
    /// SSE events sent before the `CreateTaskResult` (needs `creation_sse`).
    pub creation_head: Option<StepsFn>,
    /// SSE steps after the `CreateTaskResult` (needs `creation_sse`); the stream ends after them.
    pub creation_tail: Option<StepsFn>,
    /// The `ttl` the server reports (default: the requested one, or null; [`NO_TTL`]: none).
    pub ttl_override: Option<Value>,
    /// Delay before the `tasks/cancel` answer (the status changes when the request arrives).
    pub cancel_delay: Arc<dyn Fn(&str) -> Duration + Send + Sync>,
    /// Called when a `tasks/cancel` for a working task was accepted.
    pub on_cancel: Option<Arc<dyn Fn(&str) + Send + Sync>>,
    /// Answer every `tasks/cancel` with this JSON-RPC error instead.
    pub cancel_error: Option<(i64, String)>,
    /// A GET (standalone stream) answers these SSE steps (default 405).
    pub get_stream: Option<Arc<dyn Fn() -> Vec<SseStep> + Send + Sync>>,
    /// taskId prefix (default `task-`).
    pub id_prefix: String,
    /// `tasks/result` answers in an SSE stream that waits for this gate before the result.
    pub result_gate: Option<Gate>,
    /// `tasks/cancel` answers in an SSE stream instead of JSON.
    pub cancel_sse: bool,
    /// Delay before a JSON `CreateTaskResult` is sent.
    pub creation_delay: Duration,
    /// A `tasks/*` request about a task it does not have is answered `-32602` in an SSE stream
    /// (the TypeScript and Python SDK default), not a JSON body.
    pub errors_sse: bool,
    /// Every POST must carry `X-Api-Key` with this value (an upstream authenticating its
    /// clients by a header of its own); one without it is answered HTTP 401.
    pub api_key: Option<&'static str>,
    /// A task-augmented `tools/call` for which this returns `Some((code, message))` (it gets
    /// the request) still starts its task, but is answered with that JSON-RPC error instead of
    /// the `CreateTaskResult` (after `creation_head`, under `creation_sse`).
    pub creation_error: Option<Arc<dyn Fn(&Value) -> Option<(i64, String)> + Send + Sync>>,
    /// `tasks/result` answers JSON, head and body only once this gate opens.
    pub result_json_gate: Option<Gate>,
    /// A request on a lost session is answered as the Python SDK (`mcp` 1.x) answers it:
    /// HTTP 404 with `{"id":"server-error","error":{"code":-32600,"message":"Session not
    /// found"}}` (not the TypeScript SDK's `-32001` under the request's id).
    pub python_session_not_found: bool,
    /// A request on a lost session is answered HTTP 404 with this JSON-RPC error (code,
    /// message) instead: a proxy in front of the server, say.
    pub lost_session_error: Option<(i64, &'static str)>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            sessions: true,
            tasks_capability: json!({"list":{},"cancel":{},"requests":{"tools":{"call":{}}}}),
            creation_sse: false,
            creation_head: None,
            creation_tail: None,
            ttl_override: None,
            cancel_delay: Arc::new(|_| Duration::ZERO),
            on_cancel: None,
            cancel_error: None,
            get_stream: None,
            id_prefix: "task-".into(),
            result_gate: None,
            cancel_sse: false,
            creation_delay: Duration::ZERO,
            errors_sse: false,
            api_key: None,
            creation_error: None,
            result_json_gate: None,
            python_session_not_found: false,
            lost_session_error: None,
        }
    }
}

/// A scripted MCP task server (see the module docs).
pub struct TaskServer {
    pub up: Upstream,
    pub state: Arc<Mutex<ServerState>>,
}

impl TaskServer {
    pub async fn start(b: Behaviour) -> TaskServer {
        let state: Arc<Mutex<ServerState>> = Arc::default();
        let s = state.clone();
        let b = Arc::new(b);
        let up = Upstream::start(move |req| handle(&b, &s, req)).await;
        TaskServer { up, state }
    }
    pub async fn default() -> TaskServer {
        TaskServer::start(Behaviour::default()).await
    }
    pub fn url(&self) -> String {
        self.up.url()
    }
    /// Every JSON-RPC message with this method the server received.
    pub fn received(&self, method: &str) -> Vec<RecordedRequest> {
        self.up.received(method)
    }
    pub fn count(&self, method: &str) -> usize {
        self.received(method).len()
    }
    /// Every `tasks/*` request received (get, result, cancel, list).
    pub fn task_requests(&self) -> Vec<RecordedRequest> {
        self.up
            .requests()
            .into_iter()
            .filter(|r| r.rpc_method().is_some_and(|m| m.starts_with("tasks/")))
            .collect()
    }
    pub fn set(&self, task_id: &str, status: &str) {
        self.state.lock().unwrap().set(task_id, status)
    }
    pub fn status(&self, task_id: &str) -> String {
        self.state.lock().unwrap().status(task_id)
    }
    /// `tasks/get` reports these statuses for `task_id`, one per call, before the real one again.
    pub fn script_get(&self, task_id: &str, statuses: &[&str]) {
        self.state
            .lock()
            .unwrap()
            .get_script
            .entry(task_id.into())
            .or_default()
            .extend(statuses.iter().map(|s| s.to_string()));
    }
}

fn handle(b: &Behaviour, state: &Mutex<ServerState>, req: &RecordedRequest) -> ScriptedResponse {
    match req.method.as_str() {
        "GET" => {
            return match &b.get_stream {
                Some(f) => ScriptedResponse::sse(f()),
                None => ScriptedResponse::status(405, None, ""),
            }
        }
        "DELETE" => return ScriptedResponse::status(200, None, ""),
        _ => {}
    }
    let v: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(_) => return ScriptedResponse::status(400, Some("text/plain"), "bad json"),
    };
    let (Some(method), Some(_)) = (v.get("method").and_then(Value::as_str), v.get("id")) else {
        return ScriptedResponse::accepted(); // notifications and responses
    };
    let id = req.rpc_id_json();
    if let Some(key) = b.api_key {
        if req.header("x-api-key").as_deref() != Some(key) {
            let body = rpc_error_json(&id, -32001, "X-Api-Key required");
            return ScriptedResponse::status(401, Some("application/json"), body);
        }
    }
    if req
        .header("mcp-session-id")
        .is_some_and(|s| state.lock().unwrap().lost_sessions.contains(&s))
    {
        let body = if let Some((code, message)) = b.lost_session_error {
            rpc_error_json(&id, code, message)
        } else if b.python_session_not_found {
            rpc_error_json("\"server-error\"", -32600, "Session not found")
        } else {
            rpc_error_json(&id, -32001, "Session not found")
        };
        return ScriptedResponse::status(404, Some("application/json"), body);
    }
    let task_id_param = v
        .pointer("/params/taskId")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    match method {
        "initialize" => {
            let mut st = state.lock().unwrap();
            st.next_session += 1;
            let result = json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {"tools": {}, "tasks": b.tasks_capability},
                "serverInfo": {"name": "scripted-tasks", "version": "1"},
            });
            let r = ScriptedResponse::json(rpc_result(&id, &result.to_string()));
            if b.sessions {
                r.header("mcp-session-id", &format!("sess-{}", st.next_session))
            } else {
                r
            }
        }
        "tools/call" => {
            let Some(task) = v.pointer("/params/task") else {
                return ScriptedResponse::json(rpc_result(
                    &id,
                    r#"{"content":[{"type":"text","text":"plain"}]}"#,
                ));
            };
            let mut st = state.lock().unwrap();
            st.next_task += 1;
            let task_id = format!("{}{}", b.id_prefix, st.next_task);
            let now = format_rfc3339_ms(now_ms());
            let ttl = b
                .ttl_override
                .clone()
                .or_else(|| task.get("ttl").cloned())
                .unwrap_or(Value::Null);
            let t = ServerTask {
                status: "working".into(),
                status_message: None,
                created_at: now.clone(),
                last_updated_at: now,
                ttl,
                session: req.header("mcp-session-id"),
            };
            let body = match b.creation_error.as_ref().and_then(|f| f(&v)) {
                Some((code, message)) => rpc_error_json(&id, code, &message),
                None => rpc_result(&id, &json!({ "task": t.to_json(&task_id) }).to_string()),
            };
            st.tasks.insert(task_id.clone(), t);
            drop(st);
            if !b.creation_sse {
                let r = ScriptedResponse::json(body);
                return if b.creation_delay.is_zero() {
                    r
                } else {
                    r.after(b.creation_delay)
                };
            }
            let mut steps = Vec::new();
            if let Some(head) = &b.creation_head {
                steps.extend(head(&task_id, &v));
            }
            steps.push(ev().data(&body).into());
            if let Some(tail) = &b.creation_tail {
                steps.extend(tail(&task_id, &v));
            }
            ScriptedResponse::sse(steps)
        }
        "tasks/get" => {
            let mut st = state.lock().unwrap();
            let scripted = st
                .get_script
                .get_mut(&task_id_param)
                .and_then(VecDeque::pop_front);
            let Some(t) = st.tasks.get(&task_id_param) else {
                return not_found(b, &id);
            };
            let mut t = t.clone();
            if let Some(s) = scripted {
                t.status = s;
            }
            ScriptedResponse::json(rpc_result(&id, &t.to_json(&task_id_param).to_string()))
        }
        "tasks/cancel" => {
            if let Some((code, message)) = &b.cancel_error {
                return ScriptedResponse::json(rpc_error_json(&id, *code, message));
            }
            let mut st = state.lock().unwrap();
            let Some(t) = st.tasks.get_mut(&task_id_param) else {
                let delay = (b.cancel_delay)(&task_id_param);
                return not_found(b, &id).after(delay);
            };
            if matches!(t.status.as_str(), "completed" | "failed" | "cancelled") {
                let msg = format!("Cannot cancel task: it is already {}", t.status);
                return ScriptedResponse::json(rpc_error_json(&id, -32602, &msg));
            }
            t.status = "cancelled".into();
            t.last_updated_at = format_rfc3339_ms(now_ms());
            let body = rpc_result(&id, &t.to_json(&task_id_param).to_string());
            drop(st);
            if let Some(f) = &b.on_cancel {
                f(&task_id_param);
            }
            let delay = (b.cancel_delay)(&task_id_param);
            let r = if b.cancel_sse {
                ScriptedResponse::sse(vec![ev().data(&body).into()])
            } else {
                ScriptedResponse::json(body)
            };
            if delay.is_zero() {
                r
            } else {
                r.after(delay)
            }
        }
        "tasks/result" => {
            let mut st = state.lock().unwrap();
            let Some(t) = st.tasks.get_mut(&task_id_param) else {
                return not_found(b, &id);
            };
            if t.status == "working" {
                t.status = "completed".into();
            }
            let result = json!({
                "content": [{"type": "text", "text": format!("result of {task_id_param}")}],
                "_meta": {"io.modelcontextprotocol/related-task": {"taskId": task_id_param}},
            });
            let body = rpc_result(&id, &result.to_string());
            match (&b.result_gate, &b.result_json_gate) {
                (Some(g), _) => {
                    ScriptedResponse::sse(vec![SseStep::Wait(g.clone()), ev().data(&body).into()])
                }
                (None, Some(g)) => ScriptedResponse::json(body).after_gate(g),
                (None, None) => ScriptedResponse::json(body),
            }
        }
        "tasks/list" => ScriptedResponse::json(rpc_result(&id, r#"{"tasks":[]}"#)),
        m => ScriptedResponse::json(rpc_result(&id, &json!({ "echo": m }).to_string())),
    }
}

/// `-32602` "Task not found" for request `id`: JSON, or one SSE event (`errors_sse`).
fn not_found(b: &Behaviour, id: &str) -> ScriptedResponse {
    let body = rpc_error_json(id, -32602, "Task not found");
    if b.errors_sse {
        ScriptedResponse::sse(vec![ev().data(&body).into()])
    } else {
        ScriptedResponse::json(body)
    }
}

/// A `notifications/tasks/status` message for `task_id` (params are the Task fields).
pub fn status_notification(task_id: &str, status: &str) -> String {
    let now = format_rfc3339_ms(now_ms());
    json!({
        "jsonrpc": "2.0",
        "method": "notifications/tasks/status",
        "params": {
            "taskId": task_id, "status": status, "createdAt": now, "lastUpdatedAt": now,
            "ttl": 60000, "pollInterval": 100,
        }
    })
    .to_string()
}

/// A `notifications/progress` message.
pub fn progress_notification(token: &Value, progress: u64) -> String {
    json!({
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": token, "progress": progress, "message": format!("step {progress}")},
    })
    .to_string()
}

pub const RELATED: &str = "io.modelcontextprotocol/related-task";

/// What `tasks/result` ends with.
#[derive(Clone, Debug)]
pub enum Payload {
    /// A `CallToolResult` with text `result of <taskId>`.
    Result,
    /// A `CallToolResult` with `isError: true`; the task ends `failed`.
    IsError,
    /// A JSON-RPC error (code, message) with `data: {"taskId": ...}`; the task ends `failed`.
    RpcError(i64, String),
}

type Steps = Arc<dyn Fn(&str, &Value) -> Vec<SseStep> + Send + Sync>;

/// How the scripted server behaves.
#[derive(Clone)]
pub struct UpBehaviour {
    /// `capabilities.tasks` in the InitializeResult; None: no tasks capability at all.
    pub tasks_capability: Option<Value>,
    /// The tools `tools/list` returns (shared: a test may change them between calls).
    pub tools: Arc<Mutex<Vec<Value>>>,
    /// Tools per `tools/list` page (0: one page).
    pub page_size: usize,
    /// `tools/list` answered as an SSE stream instead of JSON.
    pub list_sse: bool,
    /// Time from creation (or from the elicitation answer) to the task's end; None: never.
    pub task_ms: Option<u64>,
    /// `pollInterval` the tasks report.
    pub poll_interval: u64,
    pub payload: Payload,
    /// SSE events on the task-augmented `tools/call` stream before the CreateTaskResult.
    pub creation_head: Option<Steps>,
    /// SSE events on the `tasks/result` stream before it waits for the end (the closure gets
    /// the taskId and the `tools/call` request that created the task).
    pub result_head: Option<Steps>,
    /// `tasks/result` sends this server→client request (`elicitation/create` or
    /// `sampling/createMessage`, id `ask-<taskId>`), sets `input_required` and waits for the
    /// client's answer; the task ends `task_ms` after the answer.
    pub ask: Option<&'static str>,
    /// A GET opens a stream with these steps (default 405).
    pub get_stream: Option<Arc<dyn Fn() -> Vec<SseStep> + Send + Sync>>,
    /// `tasks/get` answers after this delay.
    pub get_delay: Duration,
    /// A task-augmented `tools/call` creates its task at once but answers after this delay.
    pub creation_delay: Duration,
    /// `initialize` hands out `Mcp-Session-Id: sess-N` (default true).
    pub sessions: bool,
    /// A task-augmented `tools/call` is not made a task: answered with this JSON-RPC error, or
    /// (code 0) with a plain CallToolResult `ran without a task`.
    pub refuse_task: Option<(i64, String)>,
    /// The first N `tasks/result` of each task send only a priming event (`id`, `retry: 100`,
    /// empty data) and close the stream, as a server that polls with SSE (SEP-1699) does; the
    /// client is expected to come back for the result.
    pub result_drops: usize,
    /// Overrides the server's answer to a request (method, JSON-RPC id as JSON, taskId, how
    /// many times this method was asked about this task so far, 1-based); None: as scripted.
    pub hook: Option<Hook>,
}

pub type Hook = Arc<dyn Fn(&str, &str, &str, usize) -> Option<ScriptedResponse> + Send + Sync>;

impl Default for UpBehaviour {
    fn default() -> Self {
        UpBehaviour {
            tasks_capability: Some(
                json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
            ),
            tools: Arc::new(Mutex::new(standard_tools())),
            page_size: 0,
            list_sse: false,
            task_ms: Some(150),
            poll_interval: 100,
            payload: Payload::Result,
            creation_head: None,
            result_head: None,
            ask: None,
            get_stream: None,
            get_delay: Duration::ZERO,
            creation_delay: Duration::ZERO,
            sessions: true,
            refuse_task: None,
            result_drops: 0,
            hook: None,
        }
    }
}

/// A tool object with `execution.taskSupport` (None: no `execution` at all).
pub fn tool(name: &str, task_support: Option<&str>) -> Value {
    let mut t = json!({
        "name": name,
        "description": format!("scripted tool {name}"),
        "inputSchema": {"type": "object", "properties": {"n": {"type": "number"}}},
    });
    if let Some(ts) = task_support {
        t["execution"] = json!({ "taskSupport": ts });
    }
    t
}

/// `research` (required), `maybe` (optional), `never` (forbidden), `plain` (no execution).
pub fn standard_tools() -> Vec<Value> {
    vec![
        tool("research", Some("required")),
        tool("maybe", Some("optional")),
        tool("never", Some("forbidden")),
        tool("plain", None),
    ]
}

/// One task as the scripted server holds it.
#[derive(Clone)]
pub struct UpTask {
    pub status: String,
    pub created_at: String,
    pub created: Instant,
    /// When the task ends on its own (None: not scheduled).
    pub ends_at: Option<Instant>,
    pub ttl: Value,
    pub session: Option<String>,
    pub tool: String,
    /// The JSON-RPC id of the `tools/call` that created it.
    pub request_id: Value,
    /// That `tools/call` request.
    pub call: Value,
    /// Opened when the client answered the task's server→client request.
    pub answered: Gate,
    /// The JSON-RPC message the client answered it with.
    pub answer: Option<Value>,
}

#[derive(Default)]
pub struct UpState {
    pub next_session: usize,
    pub next_task: usize,
    pub tasks: HashMap<String, UpTask>,
    /// The exact `tasks/result` body sent per task.
    pub results_sent: HashMap<String, String>,
    /// (taskId, time) of every `tasks/get`, `tasks/result`, `tasks/cancel` received.
    pub seen: Vec<(String, String, Instant)>,
    /// `tasks/result` calls per task.
    pub result_calls: HashMap<String, usize>,
    /// (method, taskId) → requests seen by [`UpBehaviour::hook`].
    pub hook_calls: HashMap<(String, String), usize>,
}

impl UpState {
    /// Moves a task to its end status when its time has come.
    fn refresh(&mut self, b: &UpBehaviour, task_id: &str) {
        if let Some(t) = self.tasks.get_mut(task_id) {
            if matches!(t.status.as_str(), "working")
                && t.ends_at.is_some_and(|e| Instant::now() >= e)
            {
                t.status = match b.payload {
                    Payload::Result => "completed",
                    _ => "failed",
                }
                .into();
            }
        }
    }
}

/// The scripted upgrade-capable server (see the module docs).
pub struct UpServer {
    pub up: Upstream,
    pub state: Arc<Mutex<UpState>>,
    pub tools: Arc<Mutex<Vec<Value>>>,
}

impl UpServer {
    pub async fn start(b: UpBehaviour) -> UpServer {
        let state: Arc<Mutex<UpState>> = Arc::default();
        let tools = b.tools.clone();
        let s = state.clone();
        let b = Arc::new(b);
        let up = Upstream::start(move |req| up_handle(&b, &s, req)).await;
        UpServer { up, state, tools }
    }
    pub async fn default() -> UpServer {
        UpServer::start(UpBehaviour::default()).await
    }
    pub fn url(&self) -> String {
        self.up.url()
    }
    /// Every JSON-RPC message with this method the server received.
    pub fn received(&self, method: &str) -> Vec<RecordedRequest> {
        self.up.received(method)
    }
    pub fn count(&self, method: &str) -> usize {
        self.received(method).len()
    }
    pub fn status(&self, task_id: &str) -> String {
        self.state.lock().unwrap().tasks[task_id].status.clone()
    }
    pub fn task(&self, task_id: &str) -> UpTask {
        self.state.lock().unwrap().tasks[task_id].clone()
    }
    /// The only task created so far (panics unless exactly one).
    pub fn only_task(&self) -> String {
        let st = self.state.lock().unwrap();
        assert_eq!(
            st.tasks.len(),
            1,
            "expected one task, have {:?}",
            st.tasks.keys()
        );
        st.tasks.keys().next().unwrap().clone()
    }
    /// The task created by the `tools/call` with this JSON-RPC id.
    pub fn task_of_request(&self, id: &Value) -> Option<String> {
        let st = self.state.lock().unwrap();
        st.tasks
            .iter()
            .find(|(_, t)| &t.request_id == id)
            .map(|(k, _)| k.clone())
    }
    pub fn result_sent(&self, task_id: &str) -> Option<String> {
        self.state
            .lock()
            .unwrap()
            .results_sent
            .get(task_id)
            .cloned()
    }
    /// Times at which `method` was received for `task_id`.
    pub fn seen(&self, method: &str, task_id: &str) -> Vec<Instant> {
        self.state
            .lock()
            .unwrap()
            .seen
            .iter()
            .filter(|(m, t, _)| m == method && t == task_id)
            .map(|(_, _, at)| *at)
            .collect()
    }
    /// Waits until the server received `n` messages with `method`.
    pub async fn wait_count(&self, method: &str, n: usize, within: Duration) -> bool {
        eventually(within, || async { (self.count(method) >= n).then_some(()) })
            .await
            .is_some()
    }
}

fn task_json(t: &UpTask, task_id: &str, b: &UpBehaviour) -> Value {
    let mut v = json!({
        "taskId": task_id,
        "status": t.status,
        "createdAt": t.created_at,
        "lastUpdatedAt": format_rfc3339_ms(now_ms()),
        "ttl": t.ttl,
        "pollInterval": b.poll_interval,
    });
    if t.status == "working" {
        // Changes every 200 ms, so polling sees new status messages.
        let stage = t.created.elapsed().as_millis() / 200;
        v["statusMessage"] = json!(format!("stage {stage}"));
    }
    if t.status == "input_required" {
        v["statusMessage"] = json!("waiting for the client");
    }
    v
}

/// The `tasks/result` answer for a task (body text).
fn result_body(b: &UpBehaviour, id: &str, task_id: &str) -> String {
    let meta = json!({ RELATED: { "taskId": task_id } });
    match &b.payload {
        Payload::Result => rpc_result(
            id,
            &json!({"content": [{"type": "text", "text": format!("result of {task_id}")}], "_meta": meta})
                .to_string(),
        ),
        Payload::IsError => rpc_result(
            id,
            &json!({"content": [{"type": "text", "text": format!("tool failed in {task_id}")}], "isError": true, "_meta": meta})
                .to_string(),
        ),
        Payload::RpcError(code, message) => format!(
            r#"{{"jsonrpc":"2.0","id":{id},"error":{}}}"#,
            json!({"code": code, "message": message, "data": {"taskId": task_id}})
        ),
    }
}

fn up_handle(b: &UpBehaviour, state: &Mutex<UpState>, req: &RecordedRequest) -> ScriptedResponse {
    match req.method.as_str() {
        "GET" => {
            return match &b.get_stream {
                Some(f) => ScriptedResponse::sse(f()),
                None => ScriptedResponse::status(405, None, ""),
            }
        }
        "DELETE" => return ScriptedResponse::status(200, None, ""),
        _ => {}
    }
    let v: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(_) => return ScriptedResponse::status(400, Some("text/plain"), "bad json"),
    };
    let method = v.get("method").and_then(Value::as_str);
    if method.is_none() {
        // A client's answer to a server→client request.
        if let Some(ask_id) = v.get("id").and_then(Value::as_str) {
            if let Some(task_id) = ask_id.strip_prefix("ask-") {
                let mut st = state.lock().unwrap();
                if let Some(t) = st.tasks.get_mut(task_id) {
                    t.answer = Some(v.clone());
                    if t.status == "input_required" {
                        t.status = "working".into();
                        t.ends_at = b
                            .task_ms
                            .map(|ms| Instant::now() + Duration::from_millis(ms));
                    }
                    t.answered.open();
                }
            }
        }
        return ScriptedResponse::accepted();
    }
    let method = method.unwrap();
    if v.get("id").is_none() {
        return ScriptedResponse::accepted();
    }
    let id = req.rpc_id_json();
    let task_id = v
        .pointer("/params/taskId")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if method.starts_with("tasks/") {
        let mut st = state.lock().unwrap();
        st.seen
            .push((method.to_string(), task_id.clone(), Instant::now()));
        st.refresh(b, &task_id);
    }
    if let Some(hook) = &b.hook {
        let n = {
            let mut st = state.lock().unwrap();
            let n = st
                .hook_calls
                .entry((method.to_string(), task_id.clone()))
                .or_default();
            *n += 1;
            *n
        };
        if let Some(r) = hook(method, &id, &task_id, n) {
            return r;
        }
    }
    match method {
        "initialize" => {
            let mut st = state.lock().unwrap();
            st.next_session += 1;
            let mut caps = json!({"tools": {"listChanged": true}});
            if let Some(t) = &b.tasks_capability {
                caps["tasks"] = t.clone();
            }
            let result = json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": caps,
                "serverInfo": {"name": "scripted-upgrade", "version": "1"},
            });
            let r = ScriptedResponse::json(rpc_result(&id, &result.to_string()));
            if b.sessions {
                r.header("mcp-session-id", &format!("sess-{}", st.next_session))
            } else {
                r
            }
        }
        "tools/list" => {
            let tools = b.tools.lock().unwrap().clone();
            let start: usize = v
                .pointer("/params/cursor")
                .and_then(Value::as_str)
                .and_then(|c| c.strip_prefix("page-"))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let size = if b.page_size == 0 {
                tools.len().max(1)
            } else {
                b.page_size
            };
            let end = (start + size).min(tools.len());
            let mut result = json!({ "tools": tools[start.min(end)..end] });
            if end < tools.len() {
                result["nextCursor"] = json!(format!("page-{end}"));
            }
            let body = rpc_result(&id, &result.to_string());
            if b.list_sse {
                ScriptedResponse::sse(vec![ev().event("message").data(&body).into()])
            } else {
                ScriptedResponse::json(body)
            }
        }
        "tools/call" => {
            let name = v
                .pointer("/params/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let support = b
                .tools
                .lock()
                .unwrap()
                .iter()
                .find(|t| t["name"] == json!(name))
                .and_then(|t| {
                    t.pointer("/execution/taskSupport")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                })
                .unwrap_or_else(|| "forbidden".into());
            let Some(task) = v.pointer("/params/task") else {
                if support == "required" {
                    // What both SDKs answer: an isError CallToolResult, not a JSON-RPC error.
                    return ScriptedResponse::json(rpc_result(
                        &id,
                        &json!({"content": [{"type": "text", "text": format!("MCP error -32601: Tool {name} requires task augmentation (taskSupport: 'required')")}], "isError": true}).to_string(),
                    ));
                }
                return ScriptedResponse::json(rpc_result(
                    &id,
                    &json!({"content": [{"type": "text", "text": format!("plain {name}")}]})
                        .to_string(),
                ));
            };
            if let Some((code, message)) = &b.refuse_task {
                return ScriptedResponse::json(if *code == 0 {
                    rpc_result(
                        &id,
                        r#"{"content":[{"type":"text","text":"ran without a task"}]}"#,
                    )
                } else {
                    rpc_error_json(&id, *code, message)
                });
            }
            if support == "forbidden" {
                return ScriptedResponse::json(rpc_error_json(
                    &id,
                    -32602,
                    &format!("Tool {name} does not support task augmentation"),
                ));
            }
            let mut st = state.lock().unwrap();
            st.next_task += 1;
            let task_id = format!("up-task-{}", st.next_task);
            let now = format_rfc3339_ms(now_ms());
            let t = UpTask {
                status: "working".into(),
                created_at: now,
                created: Instant::now(),
                ends_at: match (b.ask, b.task_ms) {
                    (None, Some(ms)) => Some(Instant::now() + Duration::from_millis(ms)),
                    _ => None,
                },
                ttl: task.get("ttl").cloned().unwrap_or(Value::Null),
                session: req.header("mcp-session-id"),
                tool: name,
                request_id: v["id"].clone(),
                call: v.clone(),
                answered: Gate::new(),
                answer: None,
            };
            let body = rpc_result(
                &id,
                &json!({ "task": task_json(&t, &task_id, b) }).to_string(),
            );
            st.tasks.insert(task_id.clone(), t);
            drop(st);
            let r = match &b.creation_head {
                None => ScriptedResponse::json(body),
                Some(head) => {
                    let mut steps = head(&task_id, &v);
                    steps.push(ev().event("message").data(&body).into());
                    ScriptedResponse::sse(steps)
                }
            };
            if b.creation_delay.is_zero() {
                r
            } else {
                r.after(b.creation_delay)
            }
        }
        "tasks/get" => {
            let st = state.lock().unwrap();
            let r = match st.tasks.get(&task_id) {
                Some(t) => {
                    ScriptedResponse::json(rpc_result(&id, &task_json(t, &task_id, b).to_string()))
                }
                None => ScriptedResponse::json(rpc_error_json(&id, -32602, "Task not found")),
            };
            if b.get_delay.is_zero() {
                r
            } else {
                r.after(b.get_delay)
            }
        }
        "tasks/cancel" => {
            let mut st = state.lock().unwrap();
            let Some(t) = st.tasks.get_mut(&task_id) else {
                return ScriptedResponse::json(rpc_error_json(&id, -32602, "Task not found"));
            };
            if matches!(t.status.as_str(), "completed" | "failed" | "cancelled") {
                let m = format!("Cannot cancel task: already {}", t.status);
                return ScriptedResponse::json(rpc_error_json(&id, -32602, &m));
            }
            t.status = "cancelled".into();
            let t = t.clone();
            ScriptedResponse::json(rpc_result(&id, &task_json(&t, &task_id, b).to_string()))
        }
        "tasks/result" => {
            let mut st = state.lock().unwrap();
            let Some(t) = st.tasks.get(&task_id).cloned() else {
                return ScriptedResponse::json(rpc_error_json(&id, -32602, "Task not found"));
            };
            let calls = {
                let n = st.result_calls.entry(task_id.clone()).or_default();
                *n += 1;
                *n
            };
            if calls <= b.result_drops {
                return ScriptedResponse::sse(vec![
                    ev().id(&format!("{task_id}-prime-{calls}"))
                        .retry(100)
                        .data("")
                        .into(),
                    SseStep::Sleep(Duration::from_millis(50)),
                ]);
            }
            let mut steps: Vec<SseStep> = Vec::new();
            if let Some(head) = &b.result_head {
                steps.extend(head(&task_id, &t.call));
            }
            if let Some(ask) = b.ask {
                if t.answer.is_none() {
                    st.tasks.get_mut(&task_id).unwrap().status = "input_required".into();
                    let params = if ask == "elicitation/create" {
                        json!({
                            "message": "Which one?",
                            "requestedSchema": {"type": "object", "properties": {"choice": {"type": "string"}}, "required": ["choice"]},
                            "_meta": { RELATED: { "taskId": task_id } },
                        })
                    } else {
                        json!({
                            "messages": [{"role": "user", "content": {"type": "text", "text": "Say hi"}}],
                            "maxTokens": 10,
                            "_meta": { RELATED: { "taskId": task_id } },
                        })
                    };
                    let request = json!({"jsonrpc": "2.0", "id": format!("ask-{task_id}"), "method": ask, "params": params});
                    steps.push(ev().event("message").data(&request.to_string()).into());
                    steps.push(SseStep::Wait(t.answered.clone()));
                    if let Some(ms) = b.task_ms {
                        steps.push(SseStep::Sleep(Duration::from_millis(ms)));
                    } else {
                        steps.push(SseStep::HoldOpen);
                    }
                }
            } else if !matches!(t.status.as_str(), "completed" | "failed" | "cancelled") {
                match t.ends_at {
                    Some(at) => {
                        steps.push(SseStep::Sleep(at.saturating_duration_since(Instant::now())))
                    }
                    None => steps.push(SseStep::HoldOpen),
                }
            }
            let body = result_body(b, &id, &task_id);
            st.results_sent.insert(task_id.clone(), body.clone());
            steps.push(ev().event("message").data(&body).into());
            ScriptedResponse::sse(steps)
        }
        "tasks/list" => ScriptedResponse::json(rpc_result(&id, r#"{"tasks":[]}"#)),
        m => ScriptedResponse::json(rpc_result(&id, &json!({ "echo": m }).to_string())),
    }
}
