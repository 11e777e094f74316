//! A held session's messages in the sessionless 2026-07-28 form, and back (pure translation;
//! the held sessions' own stage, `crate::layers::held_sessions::upstream`, sends them):
//!
//! - a request of a held session as the stateless 2026-07-28 request that goes upstream
//!   ([`modernize`]): no `Mcp-Session-Id`, `MCP-Protocol-Version: 2026-07-28`, `Mcp-Method`,
//!   `Mcp-Name` (`params.name` of `tools/call` / `prompts/get`, `params.uri` of
//!   `resources/read`, the `taskId` of `tasks/*`), and `_meta` with the protocol version, the
//!   client's capabilities taskgate relays input for and `clientInfo` ([`add_session_meta`],
//!   also on the bridge's own task requests of a held session);
//! - the upstream's answer as a 2025 client takes it ([`legacy_answer`]): HTTP 200 for a
//!   JSON-RPC error (the 2026 transport's 400/404), `notifications/tasks` as
//!   `notifications/tasks/status`, an MRTR `input_required` to a request that may not have one
//!   as `-32603`;
//! - whether an upstream refused a 2025 `initialize` ([`is_refusal`],
//!   [`refused_without_answer`]): then taskgate holds its sessions (see `calls::initialize`).

use super::{modern_request, translate};
use crate::exchange::{McpReply, McpRequest, Operation, ReplyBody};
use crate::jsonrpc::{self, Id};
use crate::layers::extensions::HeldSession;
use crate::mcp::capabilities::{CLIENT_CAPABILITIES_META, TASKS_EXTENSION};
use crate::mcp::era::{MODERN_VERSION, PROTOCOL_VERSION_META};
use crate::mcp::errors::McpError;
use http::StatusCode;
use serde_json::{json, Map, Value};

/// `_meta` key of a 2026-07-28 request's `clientInfo`.
pub const CLIENT_INFO_META: &str = "io.modelcontextprotocol/clientInfo";

/// The client capabilities a held session passes upstream: those taskgate relays input for
/// (`input::capability_for`: `elicitation`, `sampling`, `roots`). Anything else the client
/// declared (the 2026 `extensions`, say the tasks extension, `experimental`) is a promise
/// taskgate does not keep for it on a held session, so it never goes upstream (issue 29 #2: a
/// declared tasks extension let the upstream take the session's `tasks/update` as the
/// client's own).
const RELAYED_CAPABILITIES: [&str; 3] = ["elicitation", "sampling", "roots"];

/// Adds a held session's `_meta` members to a 2026 request's `params`: its client
/// capabilities that taskgate relays ([`RELAYED_CAPABILITIES`]; the tasks extension only when
/// `params` declared it, which the bridge's own task requests do), and its `clientInfo`.
pub(crate) fn add_session_meta(params: &mut Value, session: &HeldSession) {
    let Some(meta) = params
        .as_object_mut()
        .and_then(|p| p.get_mut("_meta"))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let declares = meta
        .get(CLIENT_CAPABILITIES_META)
        .and_then(|c| c.get("extensions"))
        .and_then(|e| e.get(TASKS_EXTENSION))
        .is_some();
    let mut caps: Map<String, Value> = RELAYED_CAPABILITIES
        .iter()
        .filter_map(|k| Some((k.to_string(), session.client_capabilities.get(*k)?.clone())))
        .collect();
    if declares {
        caps.insert("extensions".into(), json!({ TASKS_EXTENSION: {} }));
    }
    let caps = Value::Object(caps);
    meta.insert(CLIENT_CAPABILITIES_META.into(), caps);
    if let Some(info) = &session.client_info {
        meta.entry(CLIENT_INFO_META).or_insert_with(|| info.clone());
    }
}

/// A request of a held session as the stateless 2026-07-28 request that goes upstream (see
/// the module docs); `None` when it is not a POSTed request.
pub(crate) fn modernize(req: &McpRequest) -> Option<McpRequest> {
    let Operation::Post(msg) = &req.op else {
        return None;
    };
    let id = msg.id()?.clone();
    let method = msg.method()?.to_string();
    let v: Value = msg.parse_as().ok()?;
    let mut params = match v.get("params") {
        Some(Value::Object(p)) => p.clone(),
        _ => Map::new(),
    };
    let mut meta = match params.get("_meta") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    meta.remove(crate::mcp::task::RELATED_TASK_META);
    meta.insert(PROTOCOL_VERSION_META.into(), json!(MODERN_VERSION));
    meta.insert(CLIENT_CAPABILITIES_META.into(), json!({}));
    params.insert("_meta".into(), Value::Object(meta));
    let name_key = match method.as_str() {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        m if m.starts_with("tasks/") => Some("taskId"),
        _ => None,
    };
    let name = name_key
        .and_then(|k| params.get(k))
        .and_then(Value::as_str)
        .map(str::to_string);
    Some(modern_request(
        req,
        &id,
        &method,
        Value::Object(params),
        name.as_deref(),
    ))
}

/// A 2026 upstream's reply as a 2025 client takes it (see the module docs).
pub(crate) fn legacy_answer(mut reply: McpReply) -> McpReply {
    reply.headers.remove("mcp-session-id");
    // A 2026 HTTP 4xx carrying a JSON-RPC error is HTTP 200 for a 2025 client; any other 4xx (an
    // OAuth 401 with `WWW-Authenticate`, a proxy's 413 or 429) keeps its status (found by review).
    if reply.status.is_client_error() {
        if let ReplyBody::Json(bytes) = &reply.body {
            if is_jsonrpc_error(bytes) {
                reply.status = StatusCode::OK;
            }
        }
    }
    reply.body = reply.body.map_messages(|text| {
        if let Some(status) = translate::legacy_notification(text) {
            return Some(status);
        }
        if !text.contains("\"input_required\"") {
            return None;
        }
        let v: Value = serde_json::from_str(text).ok()?;
        if v.pointer("/result/resultType").and_then(Value::as_str) != Some("input_required") {
            return None;
        }
        let id = v.get("id").and_then(Id::from_value)?;
        let error = McpError::InputNotAllowed.body(Some(&id));
        Some(String::from_utf8_lossy(&error).into_owned())
    });
    reply
}

/// Whether an upstream's answer to `initialize` (JSON text) refuses the method itself: a
/// JSON-RPC error `-32022` (2026-07-28: unsupported protocol version, what a server without the
/// 2025 handshake answers) or `-32601` (method not found). Any other error (a malformed
/// `initialize`, an auth failure) is the client's and is passed on: one bad `initialize` must
/// never switch every later session of every client to held sessions (found by review).
pub(crate) fn is_refusal(answer: &[u8]) -> bool {
    serde_json::from_slice::<Value>(answer).is_ok_and(|v| {
        matches!(
            v.pointer("/error/code").and_then(Value::as_i64),
            Some(UNSUPPORTED_PROTOCOL_VERSION | jsonrpc::METHOD_NOT_FOUND)
        )
    })
}

/// Whether `bytes` is one JSON-RPC error message.
fn is_jsonrpc_error(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Value>(bytes)
        .is_ok_and(|v| v.get("jsonrpc").is_some() && v.get("error").is_some_and(Value::is_object))
}

/// 2026-07-28 `-32022`: the request's protocol version is not supported.
const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// The reply of an `initialize` the upstream refused without a JSON-RPC answer: HTTP 404 or 405
/// without a JSON body (the endpoint has no such method). Other statuses (400, 401, 403, 413,
/// 429: the client's request, its credentials, a proxy) are passed on as they are.
pub(crate) fn refused_without_answer(reply: &McpReply) -> bool {
    matches!(
        reply.status,
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
    ) && !matches!(reply.body, ReplyBody::Json(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_meta_carries_the_clients_capabilities() {
        let held = HeldSession {
            client_capabilities: json!({"elicitation": {}}),
            client_info: Some(json!({"name": "c", "version": "1"})),
        };
        let mut with_ext = json!({"_meta": translate::modern_meta(None)});
        add_session_meta(&mut with_ext, &held);
        let caps = &with_ext["_meta"][CLIENT_CAPABILITIES_META];
        assert!(caps["elicitation"].is_object() && caps["extensions"][TASKS_EXTENSION].is_object());
        assert_eq!(with_ext["_meta"][CLIENT_INFO_META]["name"], "c");
        let mut plain = json!({"_meta": {CLIENT_CAPABILITIES_META: {}}});
        add_session_meta(&mut plain, &held);
        assert!(plain["_meta"][CLIENT_CAPABILITIES_META]
            .get("extensions")
            .is_none());
        // What the client declared but taskgate does not relay never goes upstream (issue 29
        // #2): a declared tasks extension would let the upstream take a held session's
        // `tasks/update` as the client's own.
        let greedy = HeldSession {
            client_capabilities: json!({"sampling": {}, "experimental": {"x": {}},
                "extensions": {TASKS_EXTENSION: {}, "vendor/x": {}}}),
            client_info: None,
        };
        let mut plain = json!({"_meta": {CLIENT_CAPABILITIES_META: {}}});
        add_session_meta(&mut plain, &greedy);
        assert_eq!(
            plain["_meta"][CLIENT_CAPABILITIES_META],
            json!({"sampling": {}})
        );
        let mut none = json!("x");
        add_session_meta(&mut none, &held);
        assert_eq!(none, json!("x"));
    }
}
