//! Pure translations for a 2026-07-28 client on a 2025-11-25 task server (the reverse of
//! `bridge::translate`), on `serde_json::Value`s. No I/O; every function accepts any JSON and
//! never panics.
//!
//! | 2026-07-28 (client) | 2025-11-25 (upstream) |
//! |---|---|
//! | `server/discover` result | the held session's `InitializeResult` ([`discover_result`]) |
//! | request `_meta` `io.modelcontextprotocol/*` keys | removed; `progressToken`, `traceparent` and any other key kept ([`legacy_params`]) |
//! | `tools/call` that the server turns into a task | `tools/call` with `params.task: {ttl}` |
//! | flat `CreateTaskResult` (`resultType:"task"`, `ttlMs`, `pollIntervalMs`) | nested `{task:{…, ttl, pollInterval}}` ([`modern_create_result`]) |
//! | `tasks/get` → `DetailedTask` with `result` / `error` inline | `tasks/get` (a `Task`) + `tasks/result` once terminal ([`detailed_task`]) |
//! | `completed` with `result.isError: true` | `failed` whose `tasks/result` is a `CallToolResult` (a tool error keeps its content) |
//! | `failed` with `error` | `failed` whose `tasks/result` is a JSON-RPC error |
//! | every result carries `resultType` | none does: `"complete"` added ([`complete_result`]) |

use crate::mcp::capabilities::TASKS_EXTENSION;
use crate::mcp::era::MODERN_VERSION;
use serde_json::{json, Map, Value};

/// The prefix of the `_meta` keys 2026-07-28 requests carry for the protocol itself
/// (`protocolVersion`, `clientCapabilities`, `clientInfo`, `logLevel`): a 2025-11-25 server
/// gets none of them (2026-07-28 basic: required request `_meta`).
pub const PROTOCOL_META_PREFIX: &str = "io.modelcontextprotocol/";

/// How long `server/discover`'s answer may be cached by the client (`ttlMs`), in ms: the held
/// upstream session's capabilities can change when it is initialized again.
pub const DISCOVER_TTL_MS: u64 = 60_000;

/// The 2025-11-25 params of a 2026-07-28 request's `params`: `_meta` without the
/// [`PROTOCOL_META_PREFIX`] keys (removed altogether when nothing is left), `inputResponses`
/// and `requestState` (MRTR, which a 2025 server does not have) removed, and `task` (a 2025
/// task augmentation a 2026-07-28 client may still send: 2026-07-28 tasks §creation says the
/// server ignores it, so it must not make the 2025 upstream create a task; the bridge adds its
/// own for a task tool) removed, everything else as it came. Not an object: an empty object.
pub fn legacy_params(params: Option<&Value>) -> Map<String, Value> {
    let mut out = match params {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    out.remove("inputResponses");
    out.remove("requestState");
    out.remove("task");
    if let Some(Value::Object(meta)) = out.get_mut("_meta") {
        meta.retain(|k, _| !k.starts_with(PROTOCOL_META_PREFIX));
        if meta.is_empty() {
            out.remove("_meta");
        }
    }
    out
}

/// Whether an `InitializeResult` advertises task-augmented `tools/call`
/// (`capabilities.tasks.requests.tools.call`, 2025-11-25 basic/utilities/tasks §capabilities).
pub fn runs_tool_tasks(init: &Value) -> bool {
    init.pointer("/capabilities/tasks/requests/tools/call")
        .is_some_and(Value::is_object)
}

/// The 2026-07-28 `server/discover` result for a 2025-11-25 upstream whose held session was
/// answered `init` (an `InitializeResult`): `supportedVersions` lists 2026-07-28 and the
/// version the session negotiated; `capabilities` are the upstream's without the 2025 `tasks`
/// member, with `extensions["io.modelcontextprotocol/tasks"]` when the upstream runs task
/// tools ([`runs_tool_tasks`]); `instructions` kept; `serverInfo` in `_meta`; `ttlMs`
/// [`DISCOVER_TTL_MS`]; `cacheScope` `"public"` (SEP-2549: `"private"` or `"public"`; the same for every caller of the upstream).
pub fn discover_result(init: &Value) -> Value {
    let mut caps = match init.get("capabilities") {
        Some(Value::Object(c)) => c.clone(),
        _ => Map::new(),
    };
    caps.remove("tasks");
    if runs_tool_tasks(init) {
        let ext = caps
            .entry("extensions")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(e) = ext.as_object_mut() {
            e.insert(TASKS_EXTENSION.into(), json!({}));
        }
    }
    let mut versions = vec![Value::from(MODERN_VERSION)];
    if let Some(v) = init.get("protocolVersion").and_then(Value::as_str) {
        if v != MODERN_VERSION {
            versions.insert(0, Value::from(v));
        }
    }
    let mut out = Map::new();
    out.insert("resultType".into(), json!("complete"));
    out.insert("supportedVersions".into(), Value::Array(versions));
    out.insert("capabilities".into(), Value::Object(caps));
    if let Some(i) = init.get("instructions").filter(|i| i.is_string()) {
        out.insert("instructions".into(), i.clone());
    }
    out.insert("ttlMs".into(), json!(DISCOVER_TTL_MS));
    out.insert("cacheScope".into(), json!("public"));
    if let Some(info) = init.get("serverInfo").filter(|i| i.is_object()) {
        out.insert(
            "_meta".into(),
            json!({ "io.modelcontextprotocol/serverInfo": info }),
        );
    }
    Value::Object(out)
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

/// The flat 2026-07-28 `CreateTaskResult` (`resultType:"task"`) for a nested 2025-11-25 one
/// (`{task:{…}}`); `None` when `result` has no task.
pub fn modern_create_result(result: &Value) -> Option<Value> {
    modern_task(result.get("task")?, "task").map(Value::Object)
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
    if let Some(Value::Object(meta)) = o.get_mut("_meta") {
        meta.remove(crate::mcp::task::RELATED_TASK_META);
        if meta.is_empty() {
            o.remove("_meta");
        }
    }
    Value::Object(o)
}

/// Whether a 2026-07-28 result of `method` carries caching hints (SEP-2549: `ttlMs`,
/// `cacheScope` are required members of these results).
pub fn carries_cache_hints(method: &str) -> bool {
    matches!(
        method,
        "tools/list"
            | "prompts/list"
            | "resources/list"
            | "resources/templates/list"
            | "resources/read"
    )
}

/// [`complete_result`] with the caching hints a 2025-11-25 server gives none of, when missing:
/// `ttlMs: 0` and `cacheScope: "private"` (not to be cached, not shared: the reading that
/// promises nothing the upstream did not).
pub fn cacheable_result(result: &Value) -> Value {
    let mut v = complete_result(result);
    if let Some(o) = v.as_object_mut() {
        o.entry("ttlMs").or_insert_with(|| json!(0));
        o.entry("cacheScope").or_insert_with(|| json!("private"));
    }
    v
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

/// `execution.taskSupport` of the tool `name` in a `tools/list` result's `tools`
/// (`"forbidden"` when the tool has none: the 2025-11-25 default); `None` when the list does
/// not name the tool.
pub fn task_support<'a>(tools: &'a Value, name: &str) -> Option<&'a str> {
    let tool = tools
        .get("tools")?
        .as_array()?
        .iter()
        .find(|t| t.get("name").and_then(Value::as_str) == Some(name))?;
    Some(
        tool.pointer("/execution/taskSupport")
            .and_then(Value::as_str)
            .unwrap_or("forbidden"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_meta_goes_and_the_rest_stays() {
        let p = json!({"name":"t","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
            "io.modelcontextprotocol/clientCapabilities":{},"traceparent":"00-ab-cd-01","progressToken":4},
            "requestState":"x","inputResponses":{},"task":{"ttl":1000}});
        let out = legacy_params(Some(&p));
        assert_eq!(
            Value::Object(out),
            json!({"name":"t","_meta":{"traceparent":"00-ab-cd-01","progressToken":4}})
        );
        let only = json!({"_meta":{"io.modelcontextprotocol/protocolVersion":"x"}});
        assert!(legacy_params(Some(&only)).is_empty());
        assert!(legacy_params(Some(&json!([1]))).is_empty());
        assert!(legacy_params(None).is_empty());
    }

    #[test]
    fn discover_offers_the_extension_iff_the_upstream_runs_tool_tasks() {
        let init = json!({"protocolVersion":"2025-11-25","capabilities":{"tools":{},
            "tasks":{"list":{},"cancel":{},"requests":{"tools":{"call":{}}}}},
            "serverInfo":{"name":"s","version":"1"},"instructions":"hi"});
        let d = discover_result(&init);
        assert_eq!(d["supportedVersions"], json!(["2025-11-25", "2026-07-28"]));
        assert!(d["capabilities"].get("tasks").is_none());
        assert_eq!(d["capabilities"]["extensions"][TASKS_EXTENSION], json!({}));
        assert_eq!(d["capabilities"]["tools"], json!({}));
        assert_eq!(
            d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
            "s"
        );
        assert_eq!(
            (d["resultType"].clone(), d["instructions"].clone()),
            (json!("complete"), json!("hi"))
        );
        let plain =
            json!({"protocolVersion":"2025-11-25","capabilities":{"tools":{},"tasks":{"list":{}}}});
        let d = discover_result(&plain);
        assert!(d["capabilities"].get("extensions").is_none(), "{d}");
        assert!(discover_result(&json!(7))["capabilities"].is_object());
    }

    #[test]
    fn nested_becomes_flat() {
        let created = json!({"task":{"taskId":"a","status":"working","createdAt":"x","lastUpdatedAt":"y",
            "ttl":5000,"pollInterval":200}});
        let flat = modern_create_result(&created).unwrap();
        assert_eq!(
            flat,
            json!({"resultType":"task","taskId":"a","status":"working","createdAt":"x",
                "lastUpdatedAt":"y","ttlMs":5000,"pollIntervalMs":200})
        );
        assert!(modern_create_result(&json!({"content":[]})).is_none());
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

    #[test]
    fn task_support_defaults_to_forbidden() {
        let tools =
            json!({"tools":[{"name":"a","execution":{"taskSupport":"required"}},{"name":"b"}, 3]});
        assert_eq!(task_support(&tools, "a"), Some("required"));
        assert_eq!(task_support(&tools, "b"), Some("forbidden"));
        assert_eq!(task_support(&tools, "c"), None);
        assert_eq!(task_support(&json!("x"), "a"), None);
        assert_eq!(
            complete_result(&json!({"content":[]}))["resultType"],
            "complete"
        );
        assert_eq!(
            complete_result(&json!({"resultType":"x"}))["resultType"],
            "x"
        );
    }
}
