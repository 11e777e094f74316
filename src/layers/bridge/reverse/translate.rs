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
//! | `tools/list`: no `Tool.execution.taskSupport` | `execution.taskSupport` removed ([`modern_tools_list`]) |

use crate::mcp::capabilities::TASKS_EXTENSION;
use crate::mcp::era::MODERN_VERSION;
pub use crate::mcp::modern::{complete_result, detailed_task, modern_task, Outcome};
use serde_json::{json, Map, Value};

pub use crate::mcp::capabilities::PROTOCOL_META_PREFIX;

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

/// The flat 2026-07-28 `CreateTaskResult` (`resultType:"task"`) for a nested 2025-11-25 one
/// (`{task:{…}}`); `None` when `result` has no task.
pub fn modern_create_result(result: &Value) -> Option<Value> {
    modern_task(result.get("task")?, "task").map(Value::Object)
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

/// A `tools/list` result as a 2026-07-28 client gets it: [`cacheable_result`], and each tool
/// without the 2025-11-25 `execution.taskSupport` (2026-07-28 tasks: `Tool.execution.taskSupport`
/// is gone, nothing replaces it: the server alone decides per call whether it becomes a task,
/// and a call that needs one without the extension is `-32021`); an `execution` left empty is
/// removed, its other members kept.
pub fn modern_tools_list(result: &Value) -> Value {
    let mut v = cacheable_result(result);
    let tools = v.get_mut("tools").and_then(Value::as_array_mut);
    for tool in tools.into_iter().flatten() {
        let Some(t) = tool.as_object_mut() else {
            continue;
        };
        if let Some(Value::Object(execution)) = t.get_mut("execution") {
            execution.remove("taskSupport");
            if execution.is_empty() {
                t.remove("execution");
            }
        }
    }
    v
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

    /// Tester 5 #10: the 2025 `execution.taskSupport` is gone in 2026-07-28.
    #[test]
    fn tools_lose_their_2025_task_support() {
        let list = json!({"tools": [
            {"name": "a", "execution": {"taskSupport": "forbidden"}},
            {"name": "b", "execution": {"taskSupport": "required", "other": 1}},
            {"name": "c"}, 7
        ]});
        let out = modern_tools_list(&list);
        assert_eq!(out["resultType"], "complete");
        assert_eq!(out["tools"][0], json!({"name": "a"}));
        assert_eq!(
            out["tools"][1],
            json!({"name": "b", "execution": {"other": 1}})
        );
        assert_eq!(out["tools"][2], json!({"name": "c"}));
        assert_eq!(out["tools"][3], json!(7));
        assert_eq!(modern_tools_list(&json!("x")), json!("x"));
    }
}
