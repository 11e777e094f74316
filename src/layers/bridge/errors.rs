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
//! Every other code passes unchanged. Answers the bridge makes itself (to the requests it sends
//! for a 2025 client) are HTTP 200. A passed-through answer is mapped only for a request of a
//! 2025 client (no `MCP-Protocol-Version`, or a `YYYY-MM-DD` one: a request naming a version no
//! revision has, such as `v999.0.0`, keeps the upstream's answer as it is); a JSON answer whose
//! `-32021` was mapped is answered HTTP 200 (a JSON-RPC-level error in 2025), while `-32020` and
//! `-32022` keep the upstream's HTTP status (400: the 2025 transport also answers a bad or
//! unsupported `MCP-Protocol-Version` with 400). The mapped `-32601` keeps
//! `data.requiredCapabilities`, so it still says the tool only runs as a task
//! ([`is_task_required`] reads either form; `props::bridge_legacy` checks the mapping keeps it);
//! the `upgrade` layer above does not read it: the bridge hands it the `NeedsTask` reply fact
//! (see `calls::plain_call`).

use crate::exchange::{McpReply, ReplyBody};
use crate::jsonrpc;
use crate::mcp::errors::{
    HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY, UNSUPPORTED_PROTOCOL_VERSION,
};
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
    mapped_message(text).map(|(text, _)| text)
}

/// [`legacy_message`] with the code the upstream gave.
fn mapped_message(text: &str) -> Option<(String, i64)> {
    if !text.contains("-3202") {
        return None;
    }
    let mut v: Value = serde_json::from_str(text).ok()?;
    let error = v.get("error")?;
    let was = error.get("code").and_then(Value::as_i64)?;
    let code = legacy_code(error)?;
    v["error"]["code"] = Value::from(code);
    Some((v.to_string(), was))
}

/// Whether a request with this `MCP-Protocol-Version` (none: a 2025 session's) is a 2025-11-25
/// client's for the mapping: none, or a revision date (`YYYY-MM-DD`; the caller has already
/// told 2026-07-28 and later apart).
pub fn is_revision_or_none(version: Option<&http::HeaderValue>) -> bool {
    version.is_none_or(|v| {
        let b = v.as_bytes();
        b.len() == 10
            && b.iter().enumerate().all(|(i, c)| {
                if i == 4 || i == 7 {
                    *c == b'-'
                } else {
                    c.is_ascii_digit()
                }
            })
    })
}

/// A passed-through reply for a 2025-11-25 client with every 2026-only error code mapped (its
/// JSON body, or each event of its SSE body); a JSON body whose `-32021` was mapped is answered
/// HTTP 200 (see the module docs).
pub fn legacy_reply(mut reply: McpReply) -> McpReply {
    if let ReplyBody::Json(bytes) = &reply.body {
        let mapped = std::str::from_utf8(bytes).ok().and_then(mapped_message);
        if let Some((text, was)) = mapped {
            reply.body = ReplyBody::Json(bytes::Bytes::from(text));
            if was == MISSING_REQUIRED_CLIENT_CAPABILITY {
                reply.status = http::StatusCode::OK;
            }
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
        .and_then(|e| e.get(crate::mcp::capabilities::TASKS_EXTENSION))
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

    #[test]
    fn passed_through_answers_keep_the_transport_status_of_a_version_error() {
        let reply = |status: u16, body: &str| {
            McpReply::new(
                http::StatusCode::from_u16(status).unwrap(),
                http::HeaderMap::new(),
                ReplyBody::Json(bytes::Bytes::from(body.to_string())),
            )
        };
        let json = |r: &McpReply| match &r.body {
            ReplyBody::Json(b) => serde_json::from_slice::<Value>(b).unwrap(),
            _ => panic!("not JSON"),
        };
        let tasks = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32021,"message":"m","data":{"requiredCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}"#;
        let r = legacy_reply(reply(400, tasks));
        assert_eq!(
            (r.status.as_u16(), json(&r)["error"]["code"].clone()),
            (200, json!(-32601))
        );
        let version = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"v"}}"#;
        let r = legacy_reply(reply(400, version));
        assert_eq!(
            (r.status.as_u16(), json(&r)["error"]["code"].clone()),
            (400, json!(-32602))
        );
        let other =
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"-32021 in text"}}"#;
        assert_eq!(legacy_reply(reply(400, other)).status.as_u16(), 400);
        let hv = |s: &str| http::HeaderValue::from_str(s).unwrap();
        assert!(is_revision_or_none(None));
        assert!(is_revision_or_none(Some(&hv("2025-11-25"))));
        assert!(!is_revision_or_none(Some(&hv("v999.0.0"))));
        assert!(!is_revision_or_none(Some(&hv("2025-11-2x"))));
    }
}
