//! Shared by `tests/registry.rs` (issue 3) and `tests/cancel.rs` (issue 4), on top of
//! `tests/support` (declared by each test crate as `mod support;` next to `mod tasks_support;`).
//!
//! - [`TaskServer`]: a stateful scripted MCP 2025-11-25 task server built on
//!   [`support::Upstream`]: `initialize` hands out `sess-N`, a task-augmented `tools/call` answers a
//!   `CreateTaskResult` (JSON or inside SSE, with scripted events before/after it), `tasks/get`,
//!   `tasks/cancel`, `tasks/result` follow a per-task status the test can change at any moment.
//! - [`TgConfig`] / [`Tg`]: taskgate in process (`taskgate::gateway::start`) with `[auth]` and
//!   `[tasks]` settings, or the TOML for the real binary.
//! - [`Client`]: a JSON-RPC client over [`support::Req`] with bearer token and session.
//! - Admin and `/metrics` readers.
#![allow(dead_code)]

use crate::support::*;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub use taskgate::mcp::task::{format_rfc3339_ms, now_ms};

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
        t
    }
}

/// Mutable state of the scripted server; tests lock it to change a task's status at will.
#[derive(Default)]
pub struct ServerState {
    pub next_session: usize,
    pub next_task: usize,
    pub tasks: HashMap<String, ServerTask>,
    /// Statuses `tasks/get` reports for a task instead of its real one, one per call.
    pub get_script: HashMap<String, VecDeque<String>>,
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
    /// The `ttl` the server reports (default: the requested one, or null).
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
        self.up
            .requests()
            .into_iter()
            .filter(|r| r.rpc_method().as_deref() == Some(method))
            .collect()
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

fn rpc_error_json(id: &str, code: i64, message: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"error":{}}}"#,
        json!({"code": code, "message": message})
    )
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
            let body = rpc_result(&id, &json!({ "task": t.to_json(&task_id) }).to_string());
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
                return ScriptedResponse::json(rpc_error_json(&id, -32602, "Task not found"));
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
                return ScriptedResponse::json(rpc_error_json(&id, -32602, "Task not found"));
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
                return ScriptedResponse::json(rpc_error_json(&id, -32602, "Task not found"));
            };
            if t.status == "working" {
                t.status = "completed".into();
            }
            let result = json!({
                "content": [{"type": "text", "text": format!("result of {task_id_param}")}],
                "_meta": {"io.modelcontextprotocol/related-task": {"taskId": task_id_param}},
            });
            let body = rpc_result(&id, &result.to_string());
            match &b.result_gate {
                Some(g) => {
                    ScriptedResponse::sse(vec![SseStep::Wait(g.clone()), ev().data(&body).into()])
                }
                None => ScriptedResponse::json(body),
            }
        }
        "tasks/list" => ScriptedResponse::json(rpc_result(&id, r#"{"tasks":[]}"#)),
        m => ScriptedResponse::json(rpc_result(&id, &json!({ "echo": m }).to_string())),
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

// =============================================================================================
// taskgate in process / config for the binary
// =============================================================================================

/// A taskgate configuration: one upstream `default`, optional bearer tokens, `[tasks]` lines.
#[derive(Clone)]
pub struct TgConfig {
    pub upstream_url: String,
    /// (principal, token): `[auth] mode = "bearer"` when not empty.
    pub tokens: Vec<(String, String)>,
    /// `key = value` lines of `[tasks]`.
    pub tasks: Vec<String>,
    /// `key = value` lines of `[gateway]`.
    pub gateway: Vec<String>,
}

impl TgConfig {
    pub fn new(upstream_url: &str) -> TgConfig {
        TgConfig {
            upstream_url: upstream_url.into(),
            tokens: vec![],
            tasks: vec![],
            gateway: vec![],
        }
    }
    pub fn token(mut self, principal: &str, token: &str) -> Self {
        self.tokens.push((principal.into(), token.into()));
        self
    }
    pub fn tasks(mut self, line: &str) -> Self {
        self.tasks.push(line.into());
        self
    }
    pub fn gateway(mut self, line: &str) -> Self {
        self.gateway.push(line.into());
        self
    }
    pub fn to_toml(&self, store: &str) -> String {
        let mut s = String::from("[gateway]\nlisten = \"127.0.0.1:0\"\n");
        for l in &self.gateway {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str("\n[admin]\nlisten = \"127.0.0.1:0\"\n");
        s.push_str(&format!("\n[store]\npath = {store:?}\n"));
        if self.tokens.is_empty() {
            s.push_str("\n[auth]\nmode = \"none\"\n");
        } else {
            s.push_str("\n[auth]\nmode = \"bearer\"\n");
            for (p, t) in &self.tokens {
                let h = hex::encode(Sha256::digest(t.as_bytes()));
                s.push_str(&format!(
                    "\n[[auth.token]]\nprincipal = {p:?}\nsha256 = {h:?}\n"
                ));
            }
        }
        s.push_str("\n[tasks]\n");
        for l in &self.tasks {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str(&format!(
            "\n[[upstream]]\nname = \"default\"\nurl = {:?}\n",
            self.upstream_url
        ));
        s
    }
    /// Starts taskgate in this process on a fresh temporary store.
    pub async fn start(&self) -> Tg {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let text = self.to_toml(store.to_str().unwrap());
        let config = taskgate::config::Config::from_toml_str(&text)
            .unwrap_or_else(|e| panic!("config error: {e}\n{text}"));
        let running = taskgate::gateway::start(config)
            .await
            .unwrap_or_else(|e| panic!("taskgate did not start: {e}"));
        Tg {
            gw: running.gateway_addr,
            admin: running.admin_addr,
            metrics: running.metrics.clone(),
            registry: running.registry.clone(),
            running: Some(running),
            dir,
        }
    }
    /// Writes the TOML for the binary into `dir` (store at `dir/store`); returns the config path.
    pub fn write_for_binary(&self, dir: &std::path::Path) -> String {
        let store = dir.join("store");
        let path = dir.join("taskgate.toml");
        std::fs::write(&path, self.to_toml(store.to_str().unwrap())).unwrap();
        path.to_str().unwrap().to_string()
    }
}

/// taskgate running in this process.
pub struct Tg {
    pub gw: SocketAddr,
    pub admin: SocketAddr,
    pub metrics: Arc<taskgate::metrics::Metrics>,
    pub registry: Arc<taskgate::layers::registry::Registry>,
    pub running: Option<taskgate::gateway::Running>,
    pub dir: tempfile::TempDir,
}

impl Tg {
    pub fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.gw)
    }
    pub fn client(&self) -> Client {
        Client::new(&self.mcp_url())
    }
    /// The record as the store holds it now.
    pub fn record(&self, task_id: &str) -> Option<taskgate::store::TaskRecord> {
        self.registry.store().get("default", task_id).unwrap()
    }
    pub async fn admin(&self, path: &str) -> (u16, Value) {
        admin_json(self.admin, path).await
    }
    pub async fn metrics_text(&self) -> String {
        scrape(self.admin).await
    }
}

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

// =============================================================================================
// Admin and metrics
// =============================================================================================

/// GETs an admin path; returns (status, JSON body).
pub async fn admin_json(admin: SocketAddr, path: &str) -> (u16, Value) {
    let r = Req::get(&format!("http://{admin}{path}")).send().await;
    let s = r.status();
    let text = r.text().await;
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (s, v)
}

/// The `/metrics` text.
pub async fn scrape(admin: SocketAddr) -> String {
    let r = Req::get(&format!("http://{admin}/metrics")).send().await;
    assert_eq!(r.status(), 200);
    r.text().await
}

/// The sum of every sample named `name` whose labels include all of `labels` (0 when none).
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut sum = 0.0;
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(p) => p,
            None => continue,
        };
        let (n, label_text) = match series.find('{') {
            Some(i) => (&series[..i], &series[i + 1..series.len() - 1]),
            None => (series, ""),
        };
        if n != name {
            continue;
        }
        let have: Vec<(String, String)> = label_text
            .split("\",")
            .filter(|p| !p.is_empty())
            .filter_map(|p| {
                let (k, v) = p.split_once('=')?;
                Some((k.trim().to_string(), v.trim_matches('"').to_string()))
            })
            .collect();
        if labels
            .iter()
            .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
        {
            sum += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    sum
}

/// Polls `f` every 20 ms until it returns Some, for at most `within`.
pub async fn eventually<T, F, Fut>(within: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
