//! A scripted MCP 2026-07-28 task server (the extension `io.modelcontextprotocol/tasks`) and a
//! client's requests to it, shared by `tests/modern.rs` and `tests/oauth.rs`.

use super::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const MODERN: &str = "2026-07-28";
pub const EXT: &str = "io.modelcontextprotocol/tasks";

// ---------------------------------------------------------------------------------------------
// A scripted 2026-07-28 task server
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
pub struct Modern {
    /// taskId → status.
    pub tasks: HashMap<String, String>,
    /// taskId → the status `tasks/get` reports after the task was cancelled (a late result).
    pub after_cancel: HashMap<String, String>,
    pub next: u32,
    /// Delay of every `tasks/cancel` answer.
    pub cancel_delay: Duration,
    /// A request about a task it does not have is answered `-32602` in an SSE stream (the
    /// TypeScript and Python SDK default), not a JSON body with HTTP 400.
    pub sse_errors: bool,
    /// A cooperative cancel: `tasks/cancel` is acknowledged and the task stays `working` for
    /// this long, then turns `cancelled` (a worker-queue server).
    pub cancel_after: Option<Duration>,
    /// taskId → when its asynchronous cancel takes effect (see `cancel_after`).
    pub cancelling: HashMap<String, std::time::Instant>,
}

pub type Shared = Arc<Mutex<Modern>>;

pub fn detailed(task_id: &str, status: &str) -> Value {
    let mut t = json!({
        "resultType": "complete", "taskId": task_id, "status": status,
        "createdAt": format_rfc3339_ms(now_ms()), "lastUpdatedAt": format_rfc3339_ms(now_ms()),
        "ttlMs": 60000, "pollIntervalMs": 50
    });
    match status {
        "completed" => {
            t["result"] = json!({"content":[{"type":"text","text":format!("done {task_id}")}],"isError":false})
        }
        "failed" => t["error"] = json!({"code":-32603,"message":"boom"}),
        // A tool error: 2026 `completed` with `isError: true` (a 2025 `failed`).
        "tool_error" => {
            t["status"] = json!("completed");
            t["result"] = json!({"content":[{"type":"text","text":"tool failed"}],"isError":true});
        }
        // Live, and kept for ever as far as the upstream is concerned (`ttlMs: null`).
        "working_unlimited" => {
            t["status"] = json!("working");
            t["ttlMs"] = Value::Null;
        }
        "input_required" => {
            t["inputRequests"] = json!({"name": {"method":"elicitation/create","params":{
                "mode":"form","message":"your name?","requestedSchema":{"type":"object","properties":{"name":{"type":"string"}}}}}});
        }
        _ => {}
    }
    t
}

pub fn modern_handler(
    state: Shared,
) -> impl Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync {
    move |req| {
        let v = req.json();
        let id = req.rpc_id_json();
        let method = v["method"].as_str().unwrap_or("").to_string();
        let mut s = state.lock().unwrap();
        let task_id = v["params"]["taskId"].as_str().unwrap_or("").to_string();
        let result = |r: Value| ScriptedResponse::json(rpc_result(&id, &r.to_string()));
        if v.get("id").is_none() {
            // A notification (or a client's response): accepted.
            return ScriptedResponse::accepted();
        }
        match method.as_str() {
            // Dual-era, like FastMCP 4: a 2025 `initialize` gets a session and no legacy
            // `capabilities.tasks`; `server/discover` advertises the tasks extension.
            "initialize" => ScriptedResponse::json(rpc_result(
                &id,
                &json!({"protocolVersion":"2025-11-25","capabilities":{"tools":{}},
                    "serverInfo":{"name":"scripted-modern","version":"1"}})
                .to_string(),
            ))
            .header("mcp-session-id", "modern-session-1"),
            "server/discover" => {
                result(json!({"resultType":"complete","supportedVersions":[MODERN],
                "capabilities":{"tools":{},"extensions":{EXT:{}}},"ttlMs":0,"cacheScope":"private"}))
            }
            "tools/list" => result(
                json!({"tools":[{"name":"slow_compute","inputSchema":{"type":"object"}},
                {"name":"task_only","inputSchema":{"type":"object"}}]}),
            ),
            "tools/call"
                if v["params"]["name"] == "task_only"
                    && v["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
                        ["extensions"][EXT]
                        .is_null() =>
            {
                ScriptedResponse::status(
                    400,
                    Some("application/json"),
                    format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32021,"message":"Missing required client capability","data":{{"requiredCapabilities":{{"extensions":{{"{EXT}":{{}}}}}}}}}}}}"#
                    ),
                )
            }
            // A CreateTaskResult without a string taskId (or with `arguments.taskId`'s).
            "tools/call" if v["params"]["name"] == "bad_task" => {
                let named = v["params"]["arguments"].get("taskId").cloned();
                result(
                    json!({"resultType": "task", "taskId": named.unwrap_or(json!(5)), "status": "working"}),
                )
            }
            // A task whose tasks/get answer is not an object.
            "tasks/get" if s.tasks.get(&task_id).is_some_and(|st| st == "garbage") => {
                ScriptedResponse::json(rpc_result(&id, "\"oops\""))
            }
            // A plain call whose stream also reports the task named in `arguments.taskId`
            // (`completed`, with its result): a server that reports more than the caller asked.
            "tools/call" if v["params"]["name"] == "notify_about" => {
                let other = v["params"]["arguments"]["taskId"]
                    .as_str()
                    .unwrap_or_default();
                let note = json!({"jsonrpc":"2.0","method":"notifications/tasks",
                    "params": detailed(other, "completed")});
                let done = json!({"resultType": "complete", "content": []});
                ScriptedResponse::sse(vec![
                    SseStep::Raw(ev().data(&note.to_string()).wire()),
                    SseStep::Raw(ev().data(&rpc_result(&id, &done.to_string())).wire()),
                ])
            }
            // Runs plainly even when the request declares the extension.
            "tools/call" if v["params"]["name"] == "plain_tool" => result(json!({
                "resultType": "complete", "content": [{"type": "text", "text": "plain"}]
            })),
            "tools/call" => {
                s.next += 1;
                let tid = format!("mt-{}-{}", s.next, now_ms());
                s.tasks.insert(tid.clone(), "working".into());
                let created = json!({
                    "resultType": "task", "taskId": tid, "status": "working",
                    "createdAt": format_rfc3339_ms(now_ms()), "lastUpdatedAt": format_rfc3339_ms(now_ms()),
                    "ttlMs": null, "pollIntervalMs": 50
                });
                if v["params"]["name"] == "sse_tool" {
                    let done = json!({"jsonrpc":"2.0","method":"notifications/tasks",
                        "params": detailed(&tid, "completed")});
                    s.tasks.insert(tid.clone(), "completed".into());
                    return ScriptedResponse::sse(vec![
                        SseStep::Raw(ev().data(&rpc_result(&id, &created.to_string())).wire()),
                        SseStep::Raw(ev().data(&done.to_string()).wire()),
                    ]);
                }
                // A server that reports the task (`working`) before answering with it, then
                // its end, on the call's stream.
                if v["params"]["name"] == "sse_early_tool" {
                    let working = json!({"jsonrpc":"2.0","method":"notifications/tasks",
                        "params": detailed(&tid, "working")});
                    let done = json!({"jsonrpc":"2.0","method":"notifications/tasks",
                        "params": detailed(&tid, "completed")});
                    s.tasks.insert(tid.clone(), "completed".into());
                    return ScriptedResponse::sse(vec![
                        SseStep::Raw(ev().data(&working.to_string()).wire()),
                        SseStep::Raw(ev().data(&rpc_result(&id, &created.to_string())).wire()),
                        SseStep::Raw(ev().data(&done.to_string()).wire()),
                    ]);
                }
                result(created)
            }
            "tasks/get" => {
                if s.cancelling
                    .get(&task_id)
                    .is_some_and(|at| *at <= std::time::Instant::now())
                {
                    s.cancelling.remove(&task_id);
                    s.tasks.insert(task_id.clone(), "cancelled".into());
                }
                match s.tasks.get(&task_id) {
                    Some(st) => result(detailed(&task_id, st)),
                    None => not_found(&id, s.sse_errors),
                }
            }
            // A task the server does not have (never made, or forgotten in a restart).
            "tasks/cancel" if !s.tasks.contains_key(&task_id) => not_found(&id, s.sse_errors),
            "tasks/cancel" if s.cancel_after.is_some() => {
                let at = std::time::Instant::now() + s.cancel_after.unwrap_or_default();
                if s.tasks.get(&task_id).is_some_and(|st| st == "working") {
                    s.cancelling.insert(task_id.clone(), at);
                }
                result(json!({"resultType":"complete"}))
            }
            "tasks/cancel" => {
                let late = s.after_cancel.get(&task_id).cloned();
                if let Some(st) = s.tasks.get_mut(&task_id) {
                    if !matches!(
                        st.as_str(),
                        "completed" | "tool_error" | "failed" | "cancelled"
                    ) {
                        *st = "cancelled".into();
                    }
                }
                if let Some(late) = late {
                    // A server that reports cancelled once, then a late terminal result.
                    s.tasks.insert(task_id.clone(), "cancelled".into());
                    s.after_cancel.insert(task_id.clone(), late);
                }
                let delay = s.cancel_delay;
                result(json!({"resultType":"complete"})).after(delay)
            }
            "tasks/update" => result(json!({"resultType":"complete"})),
            _ => result(json!({"resultType":"complete"})),
        }
    }
}

/// `-32602` "Task not found": a JSON body with HTTP 400, or (`sse`) one event of an SSE stream.
fn not_found(id: &str, sse: bool) -> ScriptedResponse {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602,"message":"Task not found"}}}}"#
    );
    if sse {
        ScriptedResponse::sse(vec![SseStep::Raw(ev().data(&body).wire())])
    } else {
        ScriptedResponse::status(400, Some("application/json"), body)
    }
}

pub async fn modern_server() -> (Upstream, Shared) {
    let state: Shared = Arc::default();
    (Upstream::start(modern_handler(state.clone())).await, state)
}

pub fn meta(with_ext: bool) -> Value {
    let caps = if with_ext {
        json!({ "extensions": { EXT: {} } })
    } else {
        json!({})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": caps,
    })
}

/// [`meta`] with the extension that also declares the input capabilities (`elicitation`,
/// `sampling`, `roots`): a 2026-07-28 client that can be shown a task's `inputRequests`.
pub fn meta_asking() -> Value {
    let mut m = meta(true);
    m["io.modelcontextprotocol/clientCapabilities"]["elicitation"] = json!({});
    m["io.modelcontextprotocol/clientCapabilities"]["sampling"] = json!({});
    m["io.modelcontextprotocol/clientCapabilities"]["roots"] = json!({});
    m
}

/// A 2026-07-28 `tasks/get` of `task_id` from a client declaring [`meta_asking`].
pub async fn get_asking(url: &str, token: Option<&str>, id: u64, task_id: &str) -> (u16, Value) {
    send(modern_req(
        url,
        token,
        id,
        "tasks/get",
        json!({"taskId": task_id, "_meta": meta_asking()}),
    ))
    .await
}

/// A 2026-07-28 request: headers and `_meta` as the spec's clients send them.
/// An anonymous 2026 `tools/call` of `tool` with no arguments, under `id`.
pub fn call_tool(url: &str, id: u64, tool: &str) -> Req {
    modern_req(
        url,
        None,
        id,
        "tools/call",
        json!({"name": tool, "arguments": {}}),
    )
}

pub fn modern_req(url: &str, token: Option<&str>, id: u64, method: &str, params: Value) -> Req {
    let mut params = params;
    if params.get("_meta").is_none() {
        params["_meta"] = meta(true);
    }
    let body = json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}).to_string();
    let mut r = Req::mcp_post(url, body)
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", method);
    // What a 2026-07-28 client sends (§2.2): `Mcp-Name` is the task id for `tasks/*`, the
    // tool's or prompt's name or the resource's URI otherwise (`=?base64?…?=` when not
    // header-safe).
    let name = match method {
        "tools/call" | "prompts/get" => params.get("name"),
        "resources/read" => params.get("uri"),
        _ => params.get("taskId"),
    };
    if let Some(name) = name.and_then(Value::as_str) {
        let safe = name.bytes().all(|b| (0x21..0x7f).contains(&b));
        let value = match safe {
            true => name.to_string(),
            false => format!("=?base64?{}?=", base64_of(name)),
        };
        r = r.header("mcp-name", &value);
    }
    if let Some(t) = token {
        r = r.header("authorization", &format!("Bearer {t}"));
    }
    r
}

/// Sends and returns (HTTP status, the JSON-RPC answer; the response in an SSE body).
pub async fn send(r: Req) -> (u16, Value) {
    let resp = r.send().await;
    let status = resp.status();
    let sse = resp
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"));
    if !sse {
        return (status, resp.json().await);
    }
    let mut reader = resp.sse();
    loop {
        let v = reader.next_event(STEP).await.json();
        if v.get("id").is_some() && (v.get("result").is_some() || v.get("error").is_some()) {
            return (status, v);
        }
    }
}

pub async fn create(url: &str, token: Option<&str>, tool: &str) -> String {
    let (status, v) = send(modern_req(
        url,
        token,
        1,
        "tools/call",
        json!({"name": tool, "arguments": {}}),
    ))
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    v["result"]["taskId"].as_str().unwrap().to_string()
}

pub async fn task_call(
    url: &str,
    token: Option<&str>,
    id: u64,
    method: &str,
    task_id: &str,
) -> (u16, Value) {
    send(modern_req(
        url,
        token,
        id,
        method,
        json!({"taskId": task_id}),
    ))
    .await
}

pub fn base64_of(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

pub fn count(up: &Upstream, method: &str) -> usize {
    up.received(method).len()
}

// ---------------------------------------------------------------------------------------------
// A pure 2026-07-28 server (no 2025 sessions): held sessions (`tests/bridge_held*.rs`)
// ---------------------------------------------------------------------------------------------

/// [`modern_handler`] made pure 2026: `initialize` is `-32022` (HTTP 400), any request carrying
/// `Mcp-Session-Id` is refused, GET and DELETE are 405.
pub fn pure_2026(state: Shared) -> impl Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync {
    let modern = modern_handler(state);
    move |req| {
        if req.method != "POST" {
            return ScriptedResponse::status(405, Some("text/plain"), "no GET or DELETE here");
        }
        let id = req.rpc_id_json();
        let error = |code: i64, message: &str| {
            ScriptedResponse::status(
                400,
                Some("application/json"),
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":{code},"message":"{message}"}}}}"#
                ),
            )
        };
        if req.has_header("mcp-session-id") {
            return error(-32600, "this server has no sessions");
        }
        match req.rpc_method().as_deref() {
            Some("initialize") => error(-32022, "Unsupported protocol version"),
            Some("server/discover") => ScriptedResponse::json(rpc_result(
                &id,
                &json!({"resultType":"complete","supportedVersions":[MODERN],
                    "capabilities":{"tools":{"listChanged":true},"extensions":{EXT:{}}},
                    "instructions":"pure 2026","ttlMs":0,"cacheScope":"private",
                    "_meta":{"io.modelcontextprotocol/serverInfo":{"name":"pure-2026","version":"3"}}})
                .to_string(),
            )),
            Some("ping" | "resources/list") => error(-32601, "Method not found"),
            _ => modern(req),
        }
    }
}

pub async fn pure_server() -> (Upstream, Shared) {
    let state: Shared = Default::default();
    (Upstream::start(pure_2026(state.clone())).await, state)
}

pub fn initialize_with(caps: Value) -> String {
    rpc(
        "\"init\"",
        "initialize",
        &json!({"protocolVersion": PROTOCOL_VERSION, "capabilities": caps,
            "clientInfo": {"name": "held-test", "version": "7"}})
        .to_string(),
    )
}

/// `inner` behind the 2026-07-28 header rules, checked strictly (spec 2026-07-28, transports):
/// every POSTed request must carry `Mcp-Method` equal to its method, and `tools/call`,
/// `prompts/get`, `resources/read` and `tasks/*` an `Mcp-Name` equal to `params.name` / `uri` /
/// `taskId` (a `=?base64?…?=` value decoded); otherwise 400 `-32020`. 2025 requests (without
/// `MCP-Protocol-Version: 2026-07-28`) pass unchecked.
pub fn strict_headers(
    inner: impl Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync,
) -> impl Fn(&RecordedRequest) -> ScriptedResponse + Send + Sync {
    move |req| {
        if req.method != "POST" || req.header("mcp-protocol-version").as_deref() != Some(MODERN) {
            return inner(req);
        }
        let v = req.json();
        let Some(method) = v["method"].as_str() else {
            return inner(req);
        };
        let mismatch = |why: String| {
            let id = req.rpc_id_json();
            ScriptedResponse::status(
                400,
                Some("application/json"),
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32020,"message":{}}}}}"#,
                    Value::String(why)
                ),
            )
        };
        if req.header("mcp-method").as_deref() != Some(method) {
            return mismatch(format!(
                "Mcp-Method {:?} for {method}",
                req.header("mcp-method")
            ));
        }
        let key = match method {
            "tools/call" | "prompts/get" => Some("name"),
            "resources/read" => Some("uri"),
            m if m.starts_with("tasks/") => Some("taskId"),
            _ => None,
        };
        if let Some(key) = key {
            let sent = req.header("mcp-name").map(|h| {
                match h
                    .strip_prefix("=?base64?")
                    .and_then(|r| r.strip_suffix("?="))
                {
                    Some(b64) => {
                        use base64::Engine;
                        base64::engine::general_purpose::STANDARD
                            .decode(b64)
                            .ok()
                            .and_then(|b| String::from_utf8(b).ok())
                            .unwrap_or_default()
                    }
                    None => h,
                }
            });
            if sent.as_deref() != v["params"][key].as_str() {
                return mismatch(format!("Mcp-Name {sent:?} for params.{key}"));
            }
        }
        inner(req)
    }
}

/// [`pure_server`] checking the 2026-07-28 headers strictly ([`strict_headers`]).
pub async fn strict_pure_server() -> (Upstream, Shared) {
    let state: Shared = Default::default();
    (
        Upstream::start(strict_headers(pure_2026(state.clone()))).await,
        state,
    )
}

/// [`modern_server`] checking the 2026-07-28 headers strictly ([`strict_headers`]).
pub async fn strict_modern_server() -> (Upstream, Shared) {
    let state: Shared = Arc::default();
    (
        Upstream::start(strict_headers(modern_handler(state.clone()))).await,
        state,
    )
}
