//! 2026-07-28-only JSON-RPC error codes, shown to 2025-11-25 clients as the code the 2025-11-25
//! spec prescribes for the same situation. The upstream's `message` and `data` are kept as they
//! came (a 2025 error object may carry `data`); only `code` changes.
//!
//! | 2026-07-28 (from the upstream) | situation | 2025-11-25 (to the client) |
//! |---|---|---|
//! | `-32021` MissingRequiredClientCapability naming the tasks extension | a tool that only runs as a task, called without `params.task` | `-32601` Method not found (2025-11-25 server/tools: a `"required"` tool called without a task MUST get `-32601`) |
//! | `-32021` naming any other capability | the request needs a client capability it did not declare | `-32600` Invalid Request |
//! | `-32020` HeaderMismatch | `MCP-Protocol-Version` / `Mcp-Method` / `Mcp-Name` do not match the body | `-32600` Invalid Request (2025-11-25 transports: an invalid `MCP-Protocol-Version` is a bad request) |
//! | `-32022` UnsupportedProtocolVersion | the protocol version is not served | `-32602` Invalid params, `data: {supported, requested}` kept (2025-11-25 lifecycle: "Unsupported protocol version") |
//!
//! Every other code passes unchanged. A JSON answer that carried such an error with HTTP 400 (the
//! 2026 transport's status for them) is answered HTTP 200, the 2025 transport's status for a
//! JSON-RPC error. The `upgrade` layer above still recognises a mapped `-32021` by its
//! `data.requiredCapabilities` ([`is_task_required`]).

use crate::era::{
    HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY, UNSUPPORTED_PROTOCOL_VERSION,
};
use crate::exchange::{McpReply, ReplyBody};
use crate::jsonrpc;
use serde_json::Value;

/// The 2025-11-25 code for a 2026-07-28-only JSON-RPC `error` object (see the module docs);
/// `None` when the code is not one of them (or `error` has no integer `code`).
pub fn legacy_code(error: &Value) -> Option<i64> {
    match error.get("code").and_then(Value::as_i64)? {
        MISSING_REQUIRED_CLIENT_CAPABILITY if names_tasks_extension(error) => {
            Some(jsonrpc::METHOD_NOT_FOUND)
        }
        MISSING_REQUIRED_CLIENT_CAPABILITY | HEADER_MISMATCH => Some(jsonrpc::INVALID_REQUEST),
        UNSUPPORTED_PROTOCOL_VERSION => Some(jsonrpc::INVALID_PARAMS),
        _ => None,
    }
}

/// `error` with its code mapped by [`legacy_code`] (cloned; unchanged when nothing maps).
pub fn legacy_error(error: &Value) -> Value {
    let mut e = error.clone();
    if let Some(code) = legacy_code(error) {
        e["code"] = Value::from(code);
    }
    e
}

/// A JSON-RPC message (JSON text) whose `error` has a 2026-only code, with it mapped; `None`
/// when there is nothing to map (the text is not parsed unless it mentions `-3202`).
pub fn legacy_message(text: &str) -> Option<String> {
    if !text.contains("-3202") {
        return None;
    }
    let mut v: Value = serde_json::from_str(text).ok()?;
    let code = legacy_code(v.get("error")?)?;
    v["error"]["code"] = Value::from(code);
    Some(v.to_string())
}

/// A passed-through reply for a 2025-11-25 client with every 2026-only error code mapped (its
/// JSON body, or each event of its SSE body); a JSON body that was mapped is answered HTTP 200.
pub fn legacy_reply(mut reply: McpReply) -> McpReply {
    if let ReplyBody::Json(bytes) = &reply.body {
        let mapped = std::str::from_utf8(bytes).ok().and_then(legacy_message);
        if let Some(text) = mapped {
            reply.body = ReplyBody::Json(bytes::Bytes::from(text));
            reply.status = http::StatusCode::OK;
        }
        return reply;
    }
    reply.body = reply.body.map_messages(legacy_message);
    reply
}

/// Whether a JSON-RPC `error` says the tool only runs as a task: the 2026 `-32021` naming the
/// tasks extension in `data.requiredCapabilities`, or the `-32601` this module maps it to.
pub fn is_task_required(error: &Value) -> bool {
    matches!(
        error.get("code").and_then(Value::as_i64),
        Some(MISSING_REQUIRED_CLIENT_CAPABILITY | jsonrpc::METHOD_NOT_FOUND)
    ) && names_tasks_extension(error)
}

fn names_tasks_extension(error: &Value) -> bool {
    error
        .pointer("/data/requiredCapabilities/extensions")
        .and_then(|e| e.get(crate::era::TASKS_EXTENSION))
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn codes_map_and_the_rest_stays() {
        let tasks = json!({"code":-32021,"message":"Missing required client capability",
            "data":{"requiredCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}});
        let mapped = legacy_error(&tasks);
        assert_eq!(mapped["code"], -32601);
        assert_eq!(mapped["message"], tasks["message"]);
        assert_eq!(mapped["data"], tasks["data"]);
        assert!(is_task_required(&tasks) && is_task_required(&mapped));
        let other =
            json!({"code":-32021,"message":"m","data":{"requiredCapabilities":{"sampling":{}}}});
        assert_eq!(legacy_error(&other)["code"], -32600);
        assert!(!is_task_required(&other));
        assert_eq!(
            legacy_error(&json!({"code":-32020,"message":"h"}))["code"],
            -32600
        );
        let version =
            json!({"code":-32022,"message":"v","data":{"supported":["x"],"requested":"y"}});
        assert_eq!(legacy_error(&version)["code"], -32602);
        assert_eq!(legacy_error(&version)["data"], version["data"]);
        for same in [
            json!({"code":-32603,"message":"x"}),
            json!({"code":"-32021"}),
            json!(3),
        ] {
            assert_eq!(legacy_error(&same), same);
        }
        assert!(!is_task_required(
            &json!({"code":-32601,"message":"no such tool"})
        ));
        let text = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32020,"message":"h"}}"#;
        assert!(legacy_message(text).unwrap().contains("-32600"));
        assert_eq!(legacy_message(r#"{"id":1,"result":{"n":-32021}}"#), None);
        assert_eq!(legacy_message("-32021 not json"), None);
    }
}
