//! Pure translations between the 2025-11-25 task shapes and the 2026-07-28 tasks extension
//! (SEP-2663), on `serde_json::Value`s. No I/O; every function accepts any JSON and never panics.
//!
//! | 2025-11-25 | 2026-07-28 |
//! |---|---|
//! | `tools/call` + `params.task` | `tools/call` declaring the extension in `_meta` (no `params.task`) |
//! | `CreateTaskResult` `{task:{…, ttl, pollInterval}}` | flat `{resultType:"task", …, ttlMs, pollIntervalMs}` |
//! | `GetTaskResult` (a `Task`) | `DetailedTask` with `resultType:"complete"` and `result` / `error` / `inputRequests` inline |
//! | `failed` (a tool error too) | `completed` with `result.isError: true` is a 2025 `failed`; 2026 `failed` carries a JSON-RPC `error` |
//! | `notifications/tasks/status` (a `Task`) | `notifications/tasks` (a `DetailedTask`) |

use crate::mcp::capabilities::{PROTOCOL_META_PREFIX, TASKS_EXTENSION};
use crate::mcp::errors::McpError;
pub use crate::mcp::modern::modern_meta;
use crate::sse::Event;
use serde_json::{json, Map, Value};

/// The 2026 params of a bridged request: `params` without `task`, with [`modern_meta`].
pub fn modern_params(params: Option<&Value>) -> Value {
    let mut out = match params {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    out.remove("task");
    let meta = modern_meta(out.get("_meta"));
    out.insert("_meta".into(), meta);
    Value::Object(out)
}

/// A 2025 `Task` from a 2026 `Task` / `DetailedTask` (flat, `ttlMs`, `pollIntervalMs`):
/// `resultType`, `result`, `error` and `inputRequests` dropped, fields renamed, a
/// `completed` whose `result.isError` is `true` shown as `failed` (2025-11-25: a tool error is a
/// failed task), and the members a 2025 client's schema checks made valid
/// ([`normalise_legacy_task`], on taskgate's clock). Every 2025 task shown for a 2026 one is
/// made here: a bridged `CreateTaskResult`, `tasks/get` answer, and `notifications/tasks/status`
/// (a followed `tasks/result`'s, and the ones relayed from the upstream's streams, see
/// [`legacy_notification`]). `None` when `task` is not an object with a string `taskId` and
/// `status`.
pub fn legacy_task(task: &Value) -> Option<Value> {
    let o = task.as_object()?;
    o.get("taskId")?.as_str()?;
    let status = o.get("status")?.as_str()?;
    let is_error = o
        .get("result")
        .and_then(|r| r.get("isError"))
        .and_then(Value::as_bool)
        == Some(true);
    let mut out = Map::new();
    for (k, v) in o {
        match k.as_str() {
            "resultType" | "result" | "error" | "inputRequests" | "_meta" => {}
            "ttlMs" => {
                out.insert("ttl".into(), v.clone());
            }
            "pollIntervalMs" => {
                out.insert("pollInterval".into(), v.clone());
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if status == "completed" && is_error {
        out.insert("status".into(), json!("failed"));
    }
    out.entry("ttl").or_insert(Value::Null);
    let mut out = Value::Object(out);
    normalise_legacy_task(&mut out, crate::mcp::task::now_ms());
    Some(out)
}

/// Makes the members of `task`, a 2025 `Task` (see [`legacy_task`], which applies it), that a 2025 client's schema
/// checks valid, where the 2026 upstream sent invalid ones (tester 3 F7; the SDKs' schemas
/// reject the whole result over one of them): a `pollInterval` that is not a whole number of
/// ms ≥ 0 (`-1`) is dropped (it is optional); a `createdAt` or `lastUpdatedAt` that is not an
/// RFC 3339 time (`"yesterday"`, `12`) or is missing is shown as `now_ms` (`lastUpdatedAt`: the
/// upstream's `createdAt` when that one is valid). `ttl` is `observe`'s (the recorded one), and
/// a status none of the five is refused, not mended ([`has_task_status`]).
pub fn normalise_legacy_task(task: &mut Value, now_ms: u64) {
    let Some(o) = task.as_object_mut() else {
        return;
    };
    if o.get("pollInterval").is_some_and(|p| !p.is_u64()) {
        o.remove("pollInterval");
    }
    let time = |o: &Map<String, Value>, key: &str| {
        o.get(key)
            .and_then(Value::as_str)
            .filter(|t| crate::mcp::task::parse_rfc3339_ms(t).is_some())
            .map(str::to_string)
    };
    let created = time(o, "createdAt");
    let updated = time(o, "lastUpdatedAt").or_else(|| created.clone());
    let now = || crate::mcp::task::format_rfc3339_ms(now_ms);
    o.insert("createdAt".into(), Value::from(created.unwrap_or_else(now)));
    o.insert(
        "lastUpdatedAt".into(),
        Value::from(updated.unwrap_or_else(now)),
    );
}

/// Whether `task` (2026 flat or 2025) has a `status` that is one of the five task statuses.
///
/// A bridged `CreateTaskResult` without one is refused (`-32603` malformed, and its task
/// cancelled), not mended as [`normalise_legacy_task`] mends other members: taskgate cannot
/// tell what such a task is doing (`"exploded"` may mean failed as well as working), and a
/// 2025 client's schema rejects the whole result.
pub fn has_task_status(task: &Value) -> bool {
    task.get("status")
        .and_then(Value::as_str)
        .and_then(crate::mcp::task::TaskStatus::parse)
        .is_some()
}

/// The 2025 `notifications/tasks/status` (params: a 2025 `Task`, see [`legacy_task`]) for a
/// 2026 `notifications/tasks` message (params: a `DetailedTask`), as JSON text; `None` for any
/// other message, or one whose params are not a task. A tool error (`completed` with
/// `result.isError: true`) is a 2025 `failed`; the payload (`result`, `error`,
/// `inputRequests`) is dropped: 2025 clients fetch it with `tasks/result`.
pub fn legacy_notification(text: &str) -> Option<String> {
    if !crate::mcp::needles::may_name(&crate::mcp::needles::TASKS_NOTIFICATION, text.as_bytes()) {
        return None;
    }
    let v: Value = serde_json::from_str(text).ok()?;
    if v.get("method").and_then(Value::as_str) != Some("notifications/tasks")
        || v.get("id").is_some()
    {
        return None;
    }
    let task = legacy_task(v.get("params")?)?;
    Some(
        json!({"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": task})
            .to_string(),
    )
}

/// An event of a 2026 upstream's stream as a 2025 client gets it: a notification
/// (`notifications/tasks` translated to `notifications/tasks/status`, see
/// [`legacy_notification`]; others as they are); `None` for anything else (answers to other
/// ids, events without data).
pub fn legacy_event(mut ev: Event) -> Option<Event> {
    let data = ev.data.as_deref()?;
    if let Some(status) = legacy_notification(data) {
        ev.data = Some(status.into());
        return Some(ev);
    }
    let v: Value = serde_json::from_str(data).ok()?;
    (v.get("method").is_some() && v.get("id").is_none()).then_some(ev)
}

/// The 2025 `CreateTaskResult` (`{"task":{…}}`) for a flat 2026 one; `None` unless `result`
/// carries `resultType:"task"`.
pub fn legacy_create_result(result: &Value) -> Option<Value> {
    if result.get("resultType").and_then(Value::as_str) != Some("task") {
        return None;
    }
    Some(json!({ "task": legacy_task(result)? }))
}

/// What a terminal 2026 `DetailedTask` answers to a 2025 `tasks/result` (2025-11-25 tasks:
/// exactly what the request would have returned, with the related-task `_meta`).
#[derive(Debug, PartialEq)]
pub enum Payload {
    /// `completed`: the `CallToolResult` (an `isError` one too), its 2026-07-28 protocol
    /// `_meta` keys removed, the related-task `_meta` added.
    Result(Value),
    /// `failed`: the task's JSON-RPC `error` object.
    Error(Value),
    /// `cancelled` ([`McpError::NoResult`]), or a completed task without its result
    /// ([`McpError::CompletedWithoutResult`]): no result exists; the error the 2025
    /// `tasks/result` answers.
    None(McpError),
}

/// The [`Payload`] of a terminal `DetailedTask` about `task_id`; `None` while it is live.
pub fn terminal_payload(task: &Value, task_id: &str) -> Option<Payload> {
    let status = task.get("status").and_then(Value::as_str)?;
    Some(match status {
        "completed" => match task.get("result") {
            Some(Value::Object(r)) => {
                let mut r = r.clone();
                // 2025 results carry no `resultType`, and no 2026-07-28 protocol `_meta`
                // (`io.modelcontextprotocol/serverInfo`, ...: the keys have no 2025 meaning);
                // the one 2025 key is set below.
                r.remove("resultType");
                if let Some(Value::Object(meta)) = r.get_mut("_meta") {
                    meta.retain(|k, _| !k.starts_with(PROTOCOL_META_PREFIX));
                }
                crate::mcp::task::set_related_task(&mut r, task_id);
                Payload::Result(Value::Object(r))
            }
            _ => Payload::None(McpError::CompletedWithoutResult {
                task_id: task_id.to_string(),
            }),
        },
        "failed" => match task.get("error") {
            Some(e @ Value::Object(_)) if e.get("code").is_some_and(Value::is_i64) => {
                Payload::Error(e.clone())
            }
            _ => Payload::Error(json!({
                "code": crate::jsonrpc::INTERNAL_ERROR,
                "message": task.get("statusMessage").and_then(Value::as_str)
                    .unwrap_or("the task failed upstream without an error object"),
            })),
        },
        "cancelled" => Payload::None(McpError::NoResult {
            task_id: task_id.to_string(),
            status: crate::mcp::task::TaskStatus::Cancelled,
            status_message: None,
        }),
        _ => return None,
    })
}

/// Adds `execution.taskSupport: "optional"` to every tool of a `tools/list` result that has no
/// `taskSupport` (`"required"` for a tool in `task_only`). Returns whether anything changed.
pub fn mark_task_support(result: &mut Value, task_only: &dyn Fn(&str) -> bool) -> bool {
    let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) else {
        return false;
    };
    let mut changed = false;
    for tool in tools.iter_mut() {
        let Some(t) = tool.as_object_mut() else {
            continue;
        };
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let exec = t.entry("execution").or_insert_with(|| json!({}));
        let Some(exec) = exec.as_object_mut() else {
            continue;
        };
        if exec.get("taskSupport").is_none() {
            let support = if task_only(&name) {
                "required"
            } else {
                "optional"
            };
            exec.insert("taskSupport".into(), json!(support));
            changed = true;
        }
    }
    changed
}

/// Adds the 2025 `capabilities.tasks` taskgate serves for a 2026 task upstream to an
/// `InitializeResult`: `cancel`, `list` and `requests.tools.call` (the `tasks` layer above
/// removes `list` when callers cannot be told apart). Returns whether it changed.
pub fn add_legacy_tasks_capability(result: &mut Value) -> bool {
    let Some(caps) = result
        .get_mut("capabilities")
        .and_then(Value::as_object_mut)
    else {
        return false;
    };
    if caps.contains_key("tasks") {
        return false;
    }
    caps.insert(
        "tasks".into(),
        json!({"cancel": {}, "list": {}, "requests": {"tools": {"call": {}}}}),
    );
    true
}

/// Whether an `InitializeResult` / `server/discover` result advertises the tasks extension
/// (`capabilities.extensions["io.modelcontextprotocol/tasks"]`).
pub fn advertises_extension(result: &Value) -> bool {
    result
        .pointer("/capabilities/extensions")
        .and_then(|e| e.get(TASKS_EXTENSION))
        .is_some_and(Value::is_object)
}

/// Whether a JSON-RPC error object is the 2026 `-32021` naming the tasks extension.
pub fn is_missing_tasks_extension(error: &Value) -> bool {
    error.get("code").and_then(Value::as_i64)
        == Some(crate::mcp::errors::MISSING_REQUIRED_CLIENT_CAPABILITY)
        && error
            .pointer("/data/requiredCapabilities/extensions")
            .and_then(|e| e.get(TASKS_EXTENSION))
            .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::era::{MODERN_VERSION, PROTOCOL_VERSION_META};
    use crate::mcp::task::RELATED_TASK_META;

    #[test]
    fn flat_becomes_nested_and_is_error_becomes_failed() {
        let flat = json!({"resultType":"task","taskId":"a","status":"working","createdAt":"x",
            "lastUpdatedAt":"y","ttlMs":null,"pollIntervalMs":500});
        let nested = legacy_create_result(&flat).unwrap();
        assert_eq!(nested["task"]["pollInterval"], 500);
        assert!(nested["task"]["ttl"].is_null());
        assert!(nested["task"].get("resultType").is_none());
        assert!(legacy_create_result(&json!({"resultType":"complete","content":[]})).is_none());
        let done = json!({"resultType":"complete","taskId":"a","status":"completed",
            "result":{"content":[],"isError":true}});
        let t = legacy_task(&done).unwrap();
        assert_eq!(t["status"], "failed");
        assert!(t.get("result").is_none());
        assert!(legacy_task(&json!([1])).is_none());
        assert!(legacy_task(&json!({"taskId":1,"status":"working"})).is_none());
    }

    #[test]
    fn payloads_by_status() {
        let done = json!({"taskId":"a","status":"completed","result":{"content":[],"resultType":"complete"}});
        let Some(Payload::Result(r)) = terminal_payload(&done, "a") else {
            panic!("a result")
        };
        assert_eq!(r["_meta"][RELATED_TASK_META]["taskId"], "a");
        assert!(r.get("resultType").is_none());
        // A 2026 server's protocol `_meta` (tester 5 #8a: serverInfo in a 2025 tasks/result)
        // does not reach the 2025 client; the result's own `_meta` does.
        let info = json!({"taskId":"a","status":"completed","result":{"content":[],
            "_meta":{"io.modelcontextprotocol/serverInfo":{"name":"s"},"x-mine":{"n":1}}}});
        let Some(Payload::Result(r)) = terminal_payload(&info, "a") else {
            panic!("a result")
        };
        assert_eq!(
            r["_meta"],
            json!({"x-mine":{"n":1}, RELATED_TASK_META: {"taskId":"a"}}),
            "{r}"
        );
        let failed = json!({"taskId":"a","status":"failed","error":{"code":-32603,"message":"m"}});
        assert_eq!(
            terminal_payload(&failed, "a"),
            Some(Payload::Error(json!({"code":-32603,"message":"m"})))
        );
        let bad = json!({"taskId":"a","status":"failed","error":"nope"});
        assert!(matches!(
            terminal_payload(&bad, "a"),
            Some(Payload::Error(_))
        ));
        assert!(matches!(
            terminal_payload(&json!({"status":"cancelled"}), "a"),
            Some(Payload::None(_))
        ));
        assert_eq!(terminal_payload(&json!({"status":"working"}), "a"), None);
        assert_eq!(terminal_payload(&json!(null), "a"), None);
    }

    #[test]
    fn params_lose_task_and_declare_the_extension() {
        let p =
            json!({"name":"t","task":{"ttl":5},"_meta":{"progressToken":3,RELATED_TASK_META:{}}});
        let out = modern_params(Some(&p));
        assert!(out.get("task").is_none());
        assert_eq!(out["_meta"]["progressToken"], 3);
        assert!(out["_meta"].get(RELATED_TASK_META).is_none());
        assert!(crate::mcp::capabilities::declares_tasks_extension(Some(
            &out
        )));
        assert_eq!(out["_meta"][PROTOCOL_VERSION_META], MODERN_VERSION);
        assert!(modern_params(Some(&json!("x"))).is_object());
    }

    #[test]
    fn tasks_notifications_become_status_notifications() {
        let n = json!({"jsonrpc":"2.0","method":"notifications/tasks","params":{"resultType":"complete",
            "taskId":"a","status":"completed","ttlMs":5,"pollIntervalMs":7,
            "result":{"content":[],"isError":true}}});
        let out: Value =
            serde_json::from_str(&legacy_notification(&n.to_string()).unwrap()).unwrap();
        assert_eq!(out["method"], "notifications/tasks/status");
        assert_eq!(out["params"]["status"], "failed");
        assert_eq!(
            (
                out["params"]["ttl"].clone(),
                out["params"]["pollInterval"].clone()
            ),
            (json!(5), json!(7))
        );
        assert!(out["params"].get("result").is_none() && out.get("id").is_none());
        let other = json!({"jsonrpc":"2.0","method":"notifications/progress","params":{}});
        assert!(legacy_notification(&other.to_string()).is_none());
        let status = json!({"jsonrpc":"2.0","method":"notifications/tasks/status","params":{"taskId":"a","status":"working"}});
        assert!(legacy_notification(&status.to_string()).is_none());
        let bad = json!({"jsonrpc":"2.0","method":"notifications/tasks","params":[1]});
        assert!(legacy_notification(&bad.to_string()).is_none());
        assert!(legacy_notification("{\"notifications/tasks\"").is_none());
        // Escaped slashes (valid JSON, PHP's default) name the same method.
        let escaped = r#"{"jsonrpc":"2.0","method":"notifications\/tasks","params":{"resultType":"complete","taskId":"a","status":"working"}}"#;
        let out: Value = serde_json::from_str(&legacy_notification(escaped).unwrap()).unwrap();
        assert_eq!(out["method"], "notifications/tasks/status");
    }

    #[test]
    fn tools_and_capabilities() {
        let mut list = json!({"tools":[{"name":"a"},{"name":"b","execution":{"taskSupport":"forbidden"}},{"name":"c"}, 7]});
        assert!(mark_task_support(&mut list, &|n| n == "c"));
        assert_eq!(list["tools"][0]["execution"]["taskSupport"], "optional");
        assert_eq!(list["tools"][1]["execution"]["taskSupport"], "forbidden");
        assert_eq!(list["tools"][2]["execution"]["taskSupport"], "required");
        let mut init = json!({"capabilities":{"tools":{}}});
        assert!(add_legacy_tasks_capability(&mut init));
        assert!(init["capabilities"]["tasks"]["requests"]["tools"]["call"].is_object());
        assert!(!add_legacy_tasks_capability(&mut json!({})));
        let err: Value =
            serde_json::from_slice(&crate::mcp::errors::missing_tasks_extension(None)).unwrap();
        assert!(is_missing_tasks_extension(&err["error"]));
    }

    /// Tester 3 F7: what a 2025 client's schema checks is made valid; valid values are kept.
    #[test]
    fn invalid_task_members_are_made_valid_for_2025_clients() {
        let now = 1_796_601_600_000; // 2026-12-07T00:00:00Z
        let mut odd = json!({"taskId":"a","status":"working","pollInterval":-1,
            "createdAt":"yesterday","lastUpdatedAt":12,"ttl":1000});
        normalise_legacy_task(&mut odd, now);
        assert_eq!(
            odd,
            json!({"taskId":"a","status":"working","ttl":1000,
                "createdAt":"2026-12-07T00:00:00Z","lastUpdatedAt":"2026-12-07T00:00:00Z"})
        );
        let valid = json!({"taskId":"a","status":"working","pollInterval":250,"ttl":null,
            "createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-02T00:00:00.5+01:00"});
        let mut kept = valid.clone();
        normalise_legacy_task(&mut kept, now);
        assert_eq!(kept, valid);
        let mut half = json!({"taskId":"a","status":"working","createdAt":"2026-01-01T00:00:00Z",
            "lastUpdatedAt":"soon","pollInterval":0.5});
        normalise_legacy_task(&mut half, now);
        assert_eq!(half["lastUpdatedAt"], "2026-01-01T00:00:00Z");
        assert!(half.get("pollInterval").is_none());
        assert!(has_task_status(&json!({"status":"input_required"})));
        // Every 2025 task shown from a 2026 one is made valid, a relayed notification too.
        let note = json!({"jsonrpc":"2.0","method":"notifications/tasks","params":{"taskId":"a",
            "status":"working","pollIntervalMs":-1,"createdAt":"yesterday","lastUpdatedAt":12}});
        let note: Value =
            serde_json::from_str(&legacy_notification(&note.to_string()).unwrap()).unwrap();
        let task = &note["params"];
        assert!(task.get("pollInterval").is_none(), "{task}");
        for key in ["createdAt", "lastUpdatedAt"] {
            let at = task[key].as_str().unwrap_or_default();
            assert!(
                crate::mcp::task::parse_rfc3339_ms(at).is_some(),
                "{key}: {task}"
            );
        }
        for odd in [json!({"status":"exploded"}), json!({"status":5}), json!({})] {
            assert!(!has_task_status(&odd), "{odd}");
        }
    }
}
