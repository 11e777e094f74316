//! 2026-07-28 shapes more than one stage builds (the tasks extension, SEP-2663), on
//! `serde_json::Value`s: the `_meta` every request carries, the flat `Task`, and the
//! `DetailedTask` a `tasks/get` answers. Both era bridges translate with them, and the layers
//! that answer a 2026-07-28 request themselves (`tasks` for a task it ended, `cancel`, `observe`
//! for the requests taskgate sends) build with them. No I/O; every function accepts any JSON
//! and never panics.

use crate::mcp::capabilities::{CLIENT_CAPABILITIES_META, TASKS_EXTENSION};
use crate::mcp::era::{MODERN_VERSION, PROTOCOL_VERSION_META};
use crate::mcp::task::RELATED_TASK_META;
use serde_json::{json, Map, Value};

/// The `_meta` a 2026-07-28 request taskgate sends carries (2026-07-28 basic: required request
/// `_meta`): the protocol version and client capabilities declaring the tasks extension, plus
/// the client's own `_meta` members (a bridged request's) (a `progressToken`, say) except the 2025 related-task key.
pub fn modern_meta(client_meta: Option<&Value>) -> Value {
    let mut meta = Map::new();
    if let Some(Value::Object(m)) = client_meta {
        for (k, v) in m {
            if k != RELATED_TASK_META {
                meta.insert(k.clone(), v.clone());
            }
        }
    }
    meta.insert(PROTOCOL_VERSION_META.into(), json!(MODERN_VERSION));
    meta.insert(
        CLIENT_CAPABILITIES_META.into(),
        json!({ "extensions": { TASKS_EXTENSION: {} } }),
    );
    Value::Object(meta)
}

/// A 2026-07-28 `Task` (flat: `ttlMs`, `pollIntervalMs`) from a 2025-11-25 `Task` (`ttl`,
/// `pollInterval`), with `resultType` set to `result_type`; the related-task `_meta` and any
/// other `_meta` dropped (2026-07-28 has no related-task key). `None` when `task` is not an
/// object with a string `taskId` and `status`.
pub fn modern_task(task: &Value, result_type: &str) -> Option<Map<String, Value>> {
    let o = task.as_object()?;
    o.get("taskId")?.as_str()?;
    o.get("status")?.as_str()?;
    let mut out = Map::new();
    out.insert("resultType".into(), Value::from(result_type));
    for (k, v) in o {
        match k.as_str() {
            "ttl" => {
                out.insert("ttlMs".into(), v.clone());
            }
            "pollInterval" => {
                out.insert("pollIntervalMs".into(), v.clone());
            }
            "_meta" | "resultType" => {}
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out.entry("ttlMs").or_insert(Value::Null);
    Some(out)
}

/// A result as a 2026-07-28 client gets it: `resultType: "complete"` added when it has none
/// (2026-07-28: a result without it counts as complete, but every result carries it), the
/// related-task `_meta` key removed. Not an object: unchanged.
pub fn complete_result(result: &Value) -> Value {
    let Some(o) = result.as_object() else {
        return result.clone();
    };
    let mut o = o.clone();
    o.entry("resultType").or_insert_with(|| json!("complete"));
    crate::mcp::task::remove_related_task(&mut o);
    Value::Object(o)
}

/// What a terminal 2025-11-25 task's `tasks/result` answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A result (a `CallToolResult`, an `isError` one included).
    Result(Value),
    /// A JSON-RPC `error` object.
    Error(Value),
}

/// The 2026-07-28 `DetailedTask` (`resultType:"complete"`) for a 2025-11-25 `Task` and, once it
/// is terminal, what its `tasks/result` answered (2026-07-28 tasks §`tasks/get`):
/// - `completed` with a result: `result` inline (`resultType` added);
/// - `failed` with a result (a tool error, 2025-11-25 `isError`): `completed`, the result
///   inline with `isError: true`, its content kept (2026-07-28: `failed` is only for JSON-RPC
///   errors);
/// - `completed` or `failed` with a JSON-RPC error: `failed` with that `error`;
/// - `failed` or `completed` whose payload could not be had: `failed` with a `-32603` `error`
///   naming why (`missing`);
/// - `input_required`: `inputRequests` (an empty object when taskgate has none to show);
/// - `working`, `cancelled`: the task alone.
///
/// `None` when `task` is not a task (see [`modern_task`]).
pub fn detailed_task(task: &Value, outcome: Option<&Outcome>, missing: &str) -> Option<Value> {
    let mut t = modern_task(task, "complete")?;
    let status = t.get("status").and_then(Value::as_str).unwrap_or_default();
    match (status, outcome) {
        ("completed" | "failed", Some(Outcome::Result(r))) => {
            let mut r = complete_result(r);
            if status == "failed" {
                if let Some(o) = r.as_object_mut() {
                    o.insert("isError".into(), json!(true));
                }
            }
            t.insert("status".into(), json!("completed"));
            t.insert("result".into(), r);
        }
        ("completed" | "failed", Some(Outcome::Error(e))) => {
            t.insert("status".into(), json!("failed"));
            t.insert("error".into(), e.clone());
        }
        ("completed" | "failed", None) => {
            t.insert("status".into(), json!("failed"));
            t.insert(
                "error".into(),
                json!({"code": crate::jsonrpc::INTERNAL_ERROR, "message": missing}),
            );
        }
        ("input_required", _) => {
            t.entry("inputRequests").or_insert_with(|| json!({}));
        }
        _ => {}
    }
    Some(Value::Object(t))
}

/// The 2026-07-28 ack of a `tasks/cancel` (and `tasks/update`): `{"resultType":"complete"}`.
pub const MODERN_ACK: &str = r#"{"resultType":"complete"}"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_meta_declares_the_extension_and_keeps_the_clients_members() {
        let meta = modern_meta(Some(&json!({"progressToken": 4,
            "io.modelcontextprotocol/related-task": {"taskId": "a"}})));
        assert_eq!(meta[PROTOCOL_VERSION_META], MODERN_VERSION);
        assert_eq!(
            meta[CLIENT_CAPABILITIES_META]["extensions"][TASKS_EXTENSION],
            json!({})
        );
        assert_eq!(meta["progressToken"], 4);
        assert!(meta.get(RELATED_TASK_META).is_none(), "{meta}");
    }

    #[test]
    fn a_flat_task_needs_a_task_id_and_a_status() {
        assert!(modern_task(&json!({"taskId":1,"status":"working"}), "task").is_none());
        let no_ttl = modern_task(&json!({"taskId":"a","status":"working"}), "task").unwrap();
        assert!(no_ttl["ttlMs"].is_null());
    }

    #[test]
    fn terminal_tasks_carry_their_payload() {
        let task = |s: &str| json!({"taskId":"a","status":s,"ttl":1,"pollInterval":2});
        let r = Outcome::Result(json!({"content":[{"type":"text","text":"ok"}],
            "_meta":{"io.modelcontextprotocol/related-task":{"taskId":"a"}}}));
        let done = detailed_task(&task("completed"), Some(&r), "m").unwrap();
        assert_eq!(done["status"], "completed");
        assert_eq!(done["result"]["resultType"], "complete");
        assert!(done["result"].get("_meta").is_none(), "{done}");
        let tool_error = detailed_task(&task("failed"), Some(&r), "m").unwrap();
        assert_eq!(
            (
                tool_error["status"].clone(),
                tool_error["result"]["isError"].clone()
            ),
            (json!("completed"), json!(true))
        );
        assert_eq!(tool_error["result"]["content"][0]["text"], "ok");
        let e = Outcome::Error(json!({"code":-32000,"message":"boom"}));
        let failed = detailed_task(&task("failed"), Some(&e), "m").unwrap();
        assert_eq!(
            (failed["status"].clone(), failed["error"]["message"].clone()),
            (json!("failed"), json!("boom"))
        );
        let lost = detailed_task(&task("completed"), None, "gone").unwrap();
        assert_eq!(
            (lost["status"].clone(), lost["error"]["message"].clone()),
            (json!("failed"), json!("gone"))
        );
        let input = detailed_task(&task("input_required"), None, "m").unwrap();
        assert_eq!(input["inputRequests"], json!({}));
        let cancelled = detailed_task(&task("cancelled"), None, "m").unwrap();
        assert!(cancelled.get("result").is_none() && cancelled.get("error").is_none());
        assert_eq!(
            (
                cancelled["ttlMs"].clone(),
                cancelled["pollIntervalMs"].clone()
            ),
            (json!(1), json!(2))
        );
    }
}
