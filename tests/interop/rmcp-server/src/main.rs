//! rmcp 3.11.0 fixture: the conformance 0.2.0-alpha.12 tasks-* fixture tools (greet, slow_compute,
//! failing_job, protocol_error_job, confirm_delete, multi_input, test_tool_with_task) on rmcp's
//! TaskManager, served with rmcp's StreamableHttpService on 127.0.0.1, or over stdio.
//!
//!     taskgate-interop-rmcp-server [--port N] [--modern-only] [--received FILE]
//!     taskgate-interop-rmcp-server --stdio [--modern-only] [--received FILE]
//!
//! HTTP: prints `{"listening":"http://127.0.0.1:PORT/mcp","port":PORT,"server":"rmcp","version":"3.11.0"}`
//! once bound, then one line `{"received":"tasks/cancel","taskId":ID}` per `tasks/cancel` it
//! handles (the interop scripts count them). Stops on SIGTERM/SIGINT.
//!
//! `--stdio` (issue 31): the same handler over rmcp's stdio transport (`stdio_pipes`, newline
//! delimited JSON-RPC on stdin/stdout), served as an rmcp user serves one: `serve`, then
//! `waiting`; it ends when stdin closes or the connection fails. stdout carries JSON-RPC only,
//! so the `received` lines go to `--received FILE` (appended), else to stderr.
//!
//! `--received FILE` (both modes): the `received` lines are appended to FILE instead.
//!
//! `--modern-only`: a pure 2026-07-28 server (only `2026-07-28` supported). HTTP: rmcp's
//! `legacy_session_mode` off, `initialize` is refused (`-32022`), there are no sessions. stdio:
//! rmcp answers `server/discover` and 2026-07-28 requests; an `initialize` is answered with an
//! error and ends the serving (rmcp's `serve` returns the error), so the process exits.
//!
//! Besides the conformance tools: `slow_required(seconds)`, task required (`-32021` without the
//! extension), sleeps `seconds` (a `tasks/cancel` ends it); `ask_name()`, MRTR without a task:
//! without `inputResponses` an `input_required` result asking `name` (`elicitation/create`) with
//! `requestState` `"asked:name"`, with them `"Hello, NAME! (state STATE)"` (the state echoed).
//!
//! `subscriptions/listen` (2026-07-28): it advertises `tools.listChanged` and accepts what is
//! asked of it; each listen sends one `notifications/tools/list_changed` once acknowledged, then
//! stays open until the client closes it.

use std::{sync::Arc, time::Duration};

use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto::Builder,
    service::TowerToHyperService,
};
use rmcp::{
    model::*,
    service::{RequestContext, RoleServer, SubscriptionContext},
    task_manager::{TaskContext, TaskExit, TaskManager, TaskOptions},
    transport::streamable_http_server::{
        session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
    },
    ErrorData as McpError, ServerHandler, ServiceExt,
};
use serde_json::{json, Value};

#[derive(Clone)]
struct Fixture {
    tasks: TaskManager,
    modern_only: bool,
    /// Where the `received` lines go.
    received: Received,
}

/// Where the fixture writes its `{"received":...}` lines.
#[derive(Clone)]
enum Received {
    Stdout,
    Stderr,
    File(Arc<std::sync::Mutex<std::fs::File>>),
}

impl Received {
    fn line(&self, v: Value) {
        use std::io::Write;
        match self {
            Received::Stdout => println!("{v}"),
            Received::Stderr => eprintln!("{v}"),
            Received::File(f) => {
                let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
                let _ = writeln!(f, "{v}");
                let _ = f.flush();
            }
        }
    }
}

fn schema(v: Value) -> Arc<JsonObject> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s.into())])
}

fn elicit(message: &str, props: Value) -> InputRequest {
    serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": {"type": "object", "properties": props}}
    }))
    .expect("elicitation request")
}

fn answer(v: &Value) -> String {
    let content = v.get("content").cloned().unwrap_or(Value::Null);
    for k in ["name", "user_name", "value"] {
        if let Some(s) = content.get(k).and_then(Value::as_str) {
            return s.to_string();
        }
    }
    content.to_string()
}

fn arg<'a>(req: &'a CallToolRequestParams, key: &str) -> Option<&'a Value> {
    req.arguments.as_ref().and_then(|a| a.get(key))
}

const OPTS_POLL_MS: u64 = 500;

impl Fixture {
    fn spawn<F, Fut>(&self, f: F) -> CallToolResponse
    where
        F: FnOnce(TaskContext) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<CallToolResult, TaskExit>> + Send + 'static,
    {
        let task = self
            .tasks
            .spawn(TaskOptions::new().with_poll_interval_ms(OPTS_POLL_MS), move |ctx| Box::pin(f(ctx)));
        CallToolResponse::Task(CreateTaskResult::new(task))
    }
}

impl ServerHandler for Fixture {
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let obj = |props: Value| schema(json!({"type": "object", "properties": props}));
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new("greet", "Sync only: Hello, {name}!", obj(json!({"name": {"type": "string"}}))),
            Tool::new(
                "slow_compute",
                "Task optional: sleeps `seconds`",
                obj(json!({"seconds": {"type": "number"}, "label": {"type": "string"}})),
            ),
            Tool::new("failing_job", "Task required: a tool error after ~1 s", obj(json!({}))),
            Tool::new("protocol_error_job", "Task optional: ends failed (JSON-RPC error)", obj(json!({}))),
            Tool::new("confirm_delete", "Task optional: asks one confirmation", obj(json!({"filename": {"type": "string"}}))),
            Tool::new("multi_input", "Task optional: asks two inputs at once", obj(json!({}))),
            Tool::new("test_tool_with_task", "MRTR, then a task", obj(json!({}))),
            Tool::new("slow_required", "Task required: sleeps `seconds`", obj(json!({"seconds": {"type": "number"}}))),
            Tool::new("ask_name", "MRTR, no task: asks the user's name", obj(json!({}))),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let tasks_ok = context.client_capabilities().is_some_and(|c| c.supports_tasks());
        let missing = || McpError::missing_required_client_capability(ClientCapabilities::builder().enable_tasks().build());
        match request.name.as_ref() {
            "greet" => {
                let name = arg(&request, "name").and_then(Value::as_str).unwrap_or("World");
                Ok(text(format!("Hello, {name}!")).into())
            }
            "slow_compute" => {
                let secs = arg(&request, "seconds").and_then(Value::as_f64).unwrap_or(1.0);
                let label = arg(&request, "label").and_then(Value::as_str).unwrap_or("").to_string();
                if !tasks_ok {
                    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                    return Ok(text(format!("slow_compute({label}) done after {secs}s")).into());
                }
                Ok(self.spawn(move |ctx| async move {
                    tokio::select! {
                        _ = ctx.cancelled() => Err(TaskExit::Cancelled),
                        _ = tokio::time::sleep(Duration::from_secs_f64(secs)) => Ok(text(format!("slow_compute({label}) done after {secs}s"))),
                    }
                }))
            }
            "slow_required" => {
                if !tasks_ok {
                    return Err(missing());
                }
                let secs = arg(&request, "seconds").and_then(Value::as_f64).unwrap_or(30.0).clamp(0.0, 600.0);
                Ok(self.spawn(move |ctx| async move {
                    tokio::select! {
                        _ = ctx.cancelled() => Err(TaskExit::Cancelled),
                        _ = tokio::time::sleep(Duration::from_secs_f64(secs)) => Ok(text(format!("slow_required done after {secs}s"))),
                    }
                }))
            }
            "failing_job" => {
                if !tasks_ok {
                    return Err(missing());
                }
                Ok(self.spawn(|_ctx| async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok(CallToolResult::error(vec![ContentBlock::text("failing_job: the job failed on purpose")]))
                }))
            }
            "protocol_error_job" => {
                if !tasks_ok {
                    return Err(McpError::internal_error("protocol_error_job: internal failure on purpose", None));
                }
                Ok(self.spawn(|_ctx| async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Err(TaskExit::Error(McpError::internal_error("protocol_error_job: internal failure on purpose", None)))
                }))
            }
            "confirm_delete" => {
                if !tasks_ok {
                    return Err(missing());
                }
                let file = arg(&request, "filename").and_then(Value::as_str).unwrap_or("file.txt").to_string();
                Ok(self.spawn(move |ctx| async move {
                    let a = ctx.request_input("confirm", elicit(&format!("Delete {file}?"), json!({"confirm": {"type": "boolean"}}))).await?;
                    Ok(text(format!("confirm_delete({file}): {}", a.get("content").cloned().unwrap_or(Value::Null))))
                }))
            }
            "multi_input" => {
                if !tasks_ok {
                    return Err(missing());
                }
                Ok(self.spawn(|ctx| async move {
                    let props = json!({"name": {"type": "string"}, "confirm": {"type": "boolean"}});
                    let (a, b) = tokio::join!(
                        ctx.request_input("first", elicit("Input first?", props.clone())),
                        ctx.request_input("second", elicit("Input second?", props.clone()))
                    );
                    Ok(text(format!("multi_input: {}, {}", answer(&a?), answer(&b?))))
                }))
            }
            "ask_name" => {
                let Some(responses) = request.input_responses.clone().filter(|r| !r.is_empty()) else {
                    let ir: InputRequiredResult = serde_json::from_value(json!({
                        "resultType": "input_required",
                        "inputRequests": {"name": {"method": "elicitation/create", "params": {
                            "mode": "form", "message": "Your name?",
                            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}}}},
                        "requestState": "asked:name"
                    }))
                    .map_err(|e| McpError::internal_error(e.to_string(), None))?;
                    return Ok(CallToolResponse::InputRequired(ir));
                };
                let v = serde_json::to_value(&responses).unwrap_or(Value::Null);
                let name = v.get("name").map(answer).unwrap_or_default();
                let state = request.request_state.clone().unwrap_or_default();
                Ok(text(format!("Hello, {name}! (state {state})")).into())
            }
            "test_tool_with_task" => {
                let Some(responses) = request.input_responses.clone().filter(|r| !r.is_empty()) else {
                    let ir: InputRequiredResult = serde_json::from_value(json!({
                        "resultType": "input_required",
                        "inputRequests": {"user_name": {"method": "elicitation/create", "params": {
                            "mode": "form", "message": "Your name?",
                            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}}}}
                    }))
                    .map_err(|e| McpError::internal_error(e.to_string(), None))?;
                    return Ok(CallToolResponse::InputRequired(ir));
                };
                if !tasks_ok {
                    return Err(missing());
                }
                let v = serde_json::to_value(&responses).unwrap_or(Value::Null);
                let user = v.as_object().and_then(|m| m.values().next()).map(answer).unwrap_or_default();
                Ok(self.spawn(move |_ctx| async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok(text(format!("Hello from the task, {user}!")))
                }))
            }
            other => Err(McpError::invalid_params(format!("unknown tool {other}"), None)),
        }
    }

    async fn get_task(&self, request: GetTaskParams, _c: RequestContext<RoleServer>) -> Result<GetTaskResult, McpError> {
        Ok(GetTaskResult::new(self.tasks.get_task(&request.task_id)?))
    }

    async fn update_task(&self, request: UpdateTaskParams, _c: RequestContext<RoleServer>) -> Result<(), McpError> {
        self.tasks.update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(&self, request: CancelTaskParams, _c: RequestContext<RoleServer>) -> Result<(), McpError> {
        self.received.line(json!({"received": "tasks/cancel", "taskId": request.task_id.to_string()}));
        self.tasks.cancel_task(&request.task_id)
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        if self.modern_only {
            std::borrow::Cow::Owned(vec![ProtocolVersion::V_2026_07_28])
        } else {
            std::borrow::Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
        }
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().enable_tasks().build())
    }

    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(requested.clone())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let _ = context.sink().notify_tool_list_changed().await;
        context.cancelled().await;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let port: u16 = value("--port").and_then(|p| p.parse().ok()).unwrap_or(0);
    let modern_only = args.iter().any(|a| a == "--modern-only");
    let stdio = args.iter().any(|a| a == "--stdio");
    let received = match value("--received") {
        Some(path) => Received::File(Arc::new(std::sync::Mutex::new(
            std::fs::OpenOptions::new().create(true).append(true).open(path)?,
        ))),
        None if stdio => Received::Stderr,
        None => Received::Stdout,
    };
    let fixture = Fixture { tasks: TaskManager::new(), modern_only, received };
    if stdio {
        return serve_stdio(fixture).await;
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let port = listener.local_addr()?.port();
    let mut config = StreamableHttpServerConfig::default();
    config.legacy_session_mode = !modern_only;
    let service = StreamableHttpService::new(
        move || Ok(fixture.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    println!(
        "{}",
        json!({"listening": format!("http://127.0.0.1:{port}/mcp"), "port": port, "server": "rmcp", "version": "3.11.0"})
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let svc = TowerToHyperService::new(service.clone());
                tokio::spawn(async move {
                    let _ = Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(stream), svc).await;
                });
            }
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    Ok(())
}

/// `--stdio`: rmcp's stdio transport, as its examples serve one; a message on stderr when the
/// opening failed (a refused `initialize` on `--modern-only`) or the connection ended.
async fn serve_stdio(fixture: Fixture) -> std::io::Result<()> {
    eprintln!("{}", json!({"serving": "stdio", "server": "rmcp", "version": "3.11.0", "modernOnly": fixture.modern_only}));
    let running = match fixture.serve(rmcp::transport::stdio_pipes()).await {
        Ok(running) => running,
        Err(e) => {
            eprintln!("rmcp stdio server: serving ended before it began: {e}");
            return Err(std::io::Error::other(e.to_string()));
        }
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        quit = running.waiting() => eprintln!("rmcp stdio server: {quit:?}"),
        _ = term.recv() => eprintln!("rmcp stdio server: SIGTERM"),
    }
    Ok(())
}
