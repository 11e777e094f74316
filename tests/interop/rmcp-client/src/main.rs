//! rmcp 3.11.0 as a 2026-07-28 client (the tasks extension declared) on a 2025-11-25 task server
//! (task-server.mjs or py_task_server.py), direct or through taskgate (issue 33, the reverse
//! bridge).
//!
//!     taskgate-interop-rmcp-client URL [--label L] [--json FILE]
//!
//! rmcp's `ClientLifecycleMode::Auto`: `server/discover` first, a 2025-11-25 `initialize`
//! session when the server is legacy (directly against a 1.x server). Checks, one each:
//! `era-2026` (the session speaks 2026-07-28), `list-tools`, `plain-call` (plain_echo),
//! `task-call` (slow_task, taskSupport required: a CreateTaskResult), `poll-completed`,
//! `result-inline` (the CallToolResult in the completed DetailedTask), `failed-keeps-content`
//! (failing_task as a task: completed with isError and its text), `cancel-ack`, `cancelled`,
//! `cancel-terminal-ack`. Prints `PASS name` / `FAIL name: why` and `LABEL: N/M passed`; exit 0
//! only when all passed. `--json FILE`: {label, ok, passed, total, checks:[{name, ok, detail}]}.

use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig,
    GetTaskParams, GetTaskResult, Implementation, ProtocolVersion, TaskPayload, TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, Peer, RoleClient};
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{json, Value};

struct Checks {
    list: Vec<Value>,
}

impl Checks {
    fn check(&mut self, name: &str, ok: bool, detail: impl std::fmt::Debug) {
        let detail = if ok {
            String::new()
        } else {
            let d = format!("{detail:?}");
            d.chars().take(400).collect()
        };
        if ok {
            println!("PASS {name}");
        } else {
            println!("FAIL {name}: {detail}");
        }
        self.list
            .push(json!({"name": name, "ok": ok, "detail": detail}));
    }
}

fn args(name: &str, v: Value) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new(name.to_string());
    p.arguments = v.as_object().cloned();
    p
}

fn text_of(result: &Value) -> String {
    result
        .pointer("/content/0/text")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Polls `tasks/get` until the task is terminal (or `within` passes); the last answer.
async fn until_terminal(
    peer: &Peer<RoleClient>,
    task_id: &str,
    within: Duration,
) -> Option<GetTaskResult> {
    let end = Instant::now() + within;
    let mut last = None;
    while Instant::now() < end {
        if let Ok(r) = peer.get_task(GetTaskParams::new(task_id)).await {
            let done = matches!(
                r.task.task.status,
                TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
            );
            last = Some(r);
            if done {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

/// The completed payload's result as JSON.
fn completed(r: &Option<GetTaskResult>) -> Option<Value> {
    match &r.as_ref()?.task.payload {
        TaskPayload::Completed { result } => Some(Value::Object(result.clone())),
        _ => None,
    }
}

async fn task_of(peer: &Peer<RoleClient>, p: CallToolRequestParams) -> Result<String, String> {
    match peer.call_tool_once(p).await {
        Ok(CallToolResponse::Task(t)) => Ok(t.task.task_id.clone()),
        Ok(other) => Err(format!("not a task: {other:?}")),
        Err(e) => Err(format!("{e}")),
    }
}

async fn run(url: &str, c: &mut Checks) -> Result<(), String> {
    // The tasks extension declared (rmcp's builder needs its server features).
    let capabilities: ClientCapabilities =
        serde_json::from_value(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}))
            .map_err(|e| format!("capabilities: {e}"))?;
    let config = ClientConfig::new(
        capabilities,
        Implementation::new("taskgate-interop-rmcp-client", "0.0.0"),
    );
    let transport = StreamableHttpClientTransport::from_uri(url.to_string());
    let client = config
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Auto {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                legacy_version: Some(ProtocolVersion::V_2025_11_25),
            },
        )
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let version = client.peer_info().map(|i| i.protocol_version.clone());
    c.check(
        "era-2026",
        version.as_ref() == Some(&ProtocolVersion::V_2026_07_28),
        &version,
    );
    let peer: &Peer<RoleClient> = &client;
    match peer.list_tools(None).await {
        Ok(tools) => {
            let names: Vec<String> = tools.tools.iter().map(|t| t.name.to_string()).collect();
            let ok = ["slow_task", "fast_task", "failing_task", "plain_echo"]
                .iter()
                .all(|n| names.iter().any(|m| m == n));
            c.check("list-tools", ok, &names);
        }
        Err(e) => c.check("list-tools", false, e.to_string()),
    }
    match peer
        .call_tool_once(args("plain_echo", json!({"text": "rmcp"})))
        .await
    {
        Ok(CallToolResponse::Complete(r)) => {
            let v = serde_json::to_value(&r).unwrap_or_default();
            c.check("plain-call", text_of(&v) == "echo: rmcp", &v);
        }
        other => c.check("plain-call", false, format!("{other:?}")),
    }

    let created = task_of(
        peer,
        args("slow_task", json!({"duration_ms": 600, "steps": 3})),
    )
    .await;
    c.check("task-call", created.is_ok(), &created);
    match &created {
        Ok(id) => {
            let done = until_terminal(peer, id, Duration::from_secs(20)).await;
            let status = done.as_ref().map(|d| d.task.task.status.clone());
            c.check(
                "poll-completed",
                status == Some(TaskStatus::Completed),
                &status,
            );
            let result = completed(&done);
            c.check(
                "result-inline",
                result
                    .as_ref()
                    .is_some_and(|r| text_of(r).starts_with("slow_task done")),
                &result,
            );
        }
        Err(_) => {
            c.check("poll-completed", false, "no task was created");
            c.check("result-inline", false, "no task was created");
        }
    }

    match task_of(peer, args("failing_task", json!({}))).await {
        Ok(id) => {
            let done = until_terminal(peer, &id, Duration::from_secs(20)).await;
            let result = completed(&done);
            c.check(
                "failed-keeps-content",
                result.as_ref().is_some_and(|r| {
                    r.get("isError") == Some(&json!(true))
                        && text_of(r).contains("failed on purpose")
                }),
                (&result, done.map(|d| d.task.task.status)),
            );
        }
        Err(e) => c.check("failed-keeps-content", false, e),
    }

    match task_of(
        peer,
        args("slow_task", json!({"duration_ms": 60000, "steps": 60})),
    )
    .await
    {
        Ok(id) => {
            let ack = peer.cancel_task(CancelTaskParams::new(id.clone())).await;
            c.check("cancel-ack", ack.is_ok(), ack.map_err(|e| e.to_string()));
            let after = until_terminal(peer, &id, Duration::from_secs(10)).await;
            let status = after.as_ref().map(|d| d.task.task.status.clone());
            c.check("cancelled", status == Some(TaskStatus::Cancelled), &status);
            let again = peer.cancel_task(CancelTaskParams::new(id)).await;
            c.check(
                "cancel-terminal-ack",
                again.is_ok(),
                again.map_err(|e| e.to_string()),
            );
        }
        Err(e) => {
            c.check("cancel-ack", false, &e);
            c.check("cancelled", false, &e);
            c.check("cancel-terminal-ack", false, &e);
        }
    }
    let _ = client.cancel().await;
    Ok(())
}

#[tokio::main]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let (mut url, mut label, mut json_file) = (None, "rmcp-client".to_string(), None);
    let mut i = 0;
    while i < argv.len() {
        match argv[i].as_str() {
            "--label" => {
                i += 1;
                label = argv.get(i).cloned().unwrap_or_default();
            }
            "--json" => {
                i += 1;
                json_file = argv.get(i).cloned();
            }
            other => url = Some(other.to_string()),
        }
        i += 1;
    }
    let Some(url) = url else {
        eprintln!("usage: taskgate-interop-rmcp-client URL [--label L] [--json FILE]");
        std::process::exit(2);
    };
    let mut c = Checks { list: Vec::new() };
    let run = tokio::time::timeout(Duration::from_secs(150), run(&url, &mut c)).await;
    match run {
        Ok(Ok(())) => {}
        Ok(Err(e)) => c.check("client-session", false, e),
        Err(_) => c.check("client-session", false, "timed out after 150 s"),
    }
    let passed = c.list.iter().filter(|x| x["ok"] == json!(true)).count();
    let total = c.list.len();
    println!("{label}: {passed}/{total} passed");
    if let Some(f) = json_file {
        let v = json!({"label": label, "ok": passed == total, "passed": passed, "total": total, "checks": c.list});
        let _ = std::fs::write(f, serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    std::process::exit(if passed == total { 0 } else { 1 });
}
