//! The protocol era of a request (DESIGN.md "Two eras, one gateway"; MCP 2026-07-28 basic/versioning
//! and the tasks extension `io.modelcontextprotocol/tasks`, SEP-2663).
//!
//! - [`Era::Legacy`]: 2025-11-25 (and older): sessions, `initialize`, tasks as `params.task`,
//!   `tasks/result`, `tasks/list`.
//! - [`Era::Modern`]: 2026-07-28 and later: no sessions, every request carries its version in
//!   `MCP-Protocol-Version` and `_meta["io.modelcontextprotocol/protocolVersion"]`; tasks are the
//!   extension (flat `CreateTaskResult` with `resultType:"task"`, `tasks/get|update|cancel`,
//!   `notifications/tasks`).
//!
//! The era is computed once per request at the edge ([`Era::of_request`]) and travels down the
//! stack as a typed request extension; a request without one (the `upgrade` layer's own
//! requests, unit tests) is [`Era::Legacy`] ([`Era::of`]).

use crate::exchange::McpRequest;
use crate::jsonrpc::{self, Id, Message};
use crate::store::Owner;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The first protocol revision of the modern era.
pub const MODERN_VERSION: &str = "2026-07-28";

/// The protocol revisions taskgate serves, oldest first: a request naming another one in
/// `MCP-Protocol-Version` is refused at the edge with 400 (2025-11-25 transports: "an invalid
/// or unsupported value gets 400"; 2026-07-28: `-32022` UnsupportedProtocolVersion), since
/// taskgate cannot apply its rules to a revision it does not know.
pub const SUPPORTED_VERSIONS: [&str; 5] = [
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    MODERN_VERSION,
];

/// Whether `version` is one of [`SUPPORTED_VERSIONS`] (exactly: no space, case as written).
pub fn is_supported_version(version: &[u8]) -> bool {
    // The two revisions clients send today first (on every request with the header).
    version == b"2025-11-25"
        || version == MODERN_VERSION.as_bytes()
        || SUPPORTED_VERSIONS.iter().any(|v| v.as_bytes() == version)
}

/// `_meta` key carrying a request's protocol version (2026-07-28 basic: required request `_meta`).
pub const PROTOCOL_VERSION_META: &str = "io.modelcontextprotocol/protocolVersion";

/// `_meta` key carrying a request's client capabilities.
pub const CLIENT_CAPABILITIES_META: &str = "io.modelcontextprotocol/clientCapabilities";

/// The tasks extension's identifier (SEP-2663).
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

pub use crate::mcp::routing_headers::MCP_NAME;

/// `-32020` HeaderMismatch: a standard header disagrees with the body, or is missing (HTTP 400).
pub const HEADER_MISMATCH: i64 = -32020;
/// `-32021` MissingRequiredClientCapability: the request did not declare a capability the
/// server needs; `data.requiredCapabilities` names it (HTTP 400).
pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
/// `-32022` UnsupportedProtocolVersion (HTTP 400).
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// The protocol era a request (or a task record) belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Era {
    /// 2025-11-25 and older (the default: records written before eras existed are legacy).
    #[default]
    Legacy,
    /// 2026-07-28 and later.
    Modern,
}

impl Era {
    /// The label value (`legacy`, `modern`).
    pub fn as_str(self) -> &'static str {
        match self {
            Era::Legacy => "legacy",
            Era::Modern => "modern",
        }
    }

    /// The era of a protocol version string (`YYYY-MM-DD`, compared as such).
    pub fn of_version(version: &str) -> Era {
        let v = version.trim();
        // Revision names are dates: their lexical order is their order in time.
        if v.len() == MODERN_VERSION.len() && v >= MODERN_VERSION {
            Era::Modern
        } else {
            Era::Legacy
        }
    }

    /// The era of a request as it arrived: the `MCP-Protocol-Version` header when present (the
    /// 2026 transport requires it to equal the `_meta` value), else
    /// `params._meta["io.modelcontextprotocol/protocolVersion"]`, else legacy (a 2025 session's
    /// negotiated version is always below 2026-07-28). The body is parsed only when the header
    /// is absent and the key occurs in it.
    pub fn of_request(headers: &HeaderMap, msg: Option<&Message>) -> Era {
        Era::of_parts(
            headers
                .get(&crate::headers::MCP_PROTOCOL_VERSION)
                .map(Era::of_header),
            msg,
        )
    }

    /// The era an `MCP-Protocol-Version` header value names (legacy when it is not text).
    pub fn of_header(value: &HeaderValue) -> Era {
        value.to_str().map(Era::of_version).unwrap_or(Era::Legacy)
    }

    /// [`Era::of_request`] from the era of the request's `MCP-Protocol-Version` header, found
    /// by the caller ([`Era::of_header`]; `None` without one), and its message.
    pub fn of_parts(header: Option<Era>, msg: Option<&Message>) -> Era {
        if let Some(era) = header {
            return era;
        }
        let Some(msg) = msg else {
            return Era::Legacy;
        };
        if !jsonrpc::contains(msg.bytes(), PROTOCOL_VERSION_META.as_bytes()) {
            return Era::Legacy;
        }
        msg.parse_as::<Value>()
            .ok()
            .and_then(|v| {
                v.pointer("/params/_meta")?
                    .get(PROTOCOL_VERSION_META)?
                    .as_str()
                    .map(Era::of_version)
            })
            .unwrap_or(Era::Legacy)
    }

    /// The era the edge attached to `req` (legacy when none was).
    pub fn of(req: &McpRequest) -> Era {
        req.extensions.get::<Era>().copied().unwrap_or_default()
    }
}

/// Whether `params._meta` of a request declares the tasks extension
/// (`_meta["io.modelcontextprotocol/clientCapabilities"].extensions["io.modelcontextprotocol/tasks"]`).
/// A client that declares only the legacy `tasks` capability does not count (SEP-2663 §back-compat).
pub fn declares_tasks_extension(params: Option<&Value>) -> bool {
    params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(CLIENT_CAPABILITIES_META))
        .and_then(|c| c.get("extensions"))
        .and_then(|e| e.get(TASKS_EXTENSION))
        .is_some_and(Value::is_object)
}

/// The owner of a modern-era request's tasks: the bearer principal, else [`Owner::Anonymous`]
/// (2026-07-28 has no sessions: an `Mcp-Session-Id` a client still sends is not an owner, and
/// without auth the unguessable `taskId` is the only key).
pub fn modern_owner(caller: &crate::exchange::Caller) -> Owner {
    match &caller.principal {
        crate::exchange::Principal::Token(p) => Owner::Principal(p.to_string()),
        crate::exchange::Principal::Anonymous => Owner::Anonymous,
    }
}

/// The HTTP status the 2026-07-28 transport prescribes for a JSON-RPC error taskgate answers
/// itself: 400 for `-32020`, `-32021`, `-32022`, `-32602` and `-32600`, 404 for `-32601`, 200
/// otherwise.
pub fn modern_error_status(code: i64) -> StatusCode {
    match code {
        HEADER_MISMATCH
        | MISSING_REQUIRED_CLIENT_CAPABILITY
        | UNSUPPORTED_PROTOCOL_VERSION
        | jsonrpc::INVALID_PARAMS
        | jsonrpc::INVALID_REQUEST => StatusCode::BAD_REQUEST,
        jsonrpc::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    }
}

/// The `-32021` error naming the tasks extension, under `id`:
/// `{"code":-32021,"message":"Missing required client capability","data":{"requiredCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}`.
pub fn missing_tasks_extension(id: Option<&Id>) -> Bytes {
    let data = serde_json::json!({
        "requiredCapabilities": { "extensions": { TASKS_EXTENSION: {} } }
    });
    jsonrpc::error_response_with_data(
        id,
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        "Missing required client capability",
        &data,
    )
}

/// A 2026-07-28 `Task` / `DetailedTask` object seen with the field names the registry's status
/// machine reads (2025-11-25 `ttl`, `pollInterval`): a copy of `task` with `ttlMs` as `ttl`
/// (`null`, unlimited, as `cap`: the record's ttl is capped by `tasks.max_ttl_ms`) and
/// `pollIntervalMs` as `pollInterval`. Other members are kept.
pub fn as_registry_task(task: &Value, cap: u64) -> Value {
    let mut out = task.clone();
    if let Some(o) = out.as_object_mut() {
        match o.remove("ttlMs") {
            Some(Value::Null) => {
                o.insert("ttl".into(), Value::from(cap));
            }
            Some(v) => {
                o.insert("ttl".into(), v);
            }
            None => {}
        }
        if let Some(v) = o.remove("pollIntervalMs") {
            o.insert("pollInterval".into(), v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_ordered_by_date() {
        assert_eq!(Era::of_version("2025-11-25"), Era::Legacy);
        assert_eq!(Era::of_version("2026-07-28"), Era::Modern);
        assert_eq!(Era::of_version("2027-01-01"), Era::Modern);
        assert_eq!(Era::of_version("2026-07-28-draft"), Era::Legacy);
        assert_eq!(Era::of_version(""), Era::Legacy);
    }

    #[test]
    fn the_header_wins_then_meta() {
        let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        let msg = Message::parse(Bytes::from_static(body.as_bytes())).unwrap();
        assert_eq!(Era::of_request(&HeaderMap::new(), Some(&msg)), Era::Modern);
        let mut h = HeaderMap::new();
        h.insert(
            &crate::headers::MCP_PROTOCOL_VERSION,
            http::HeaderValue::from_static("2025-11-25"),
        );
        assert_eq!(Era::of_request(&h, Some(&msg)), Era::Legacy);
        assert_eq!(Era::of_request(&HeaderMap::new(), None), Era::Legacy);
    }

    #[test]
    fn the_extension_must_be_declared_in_meta() {
        let yes = serde_json::json!({"_meta":{CLIENT_CAPABILITIES_META:{"extensions":{TASKS_EXTENSION:{}}}}});
        let legacy = serde_json::json!({"_meta":{CLIENT_CAPABILITIES_META:{"tasks":{}}}});
        assert!(declares_tasks_extension(Some(&yes)));
        assert!(!declares_tasks_extension(Some(&legacy)));
        assert!(!declares_tasks_extension(None));
        let e: Value = serde_json::from_slice(&missing_tasks_extension(None)).unwrap();
        assert_eq!(e["error"]["code"], -32021);
        assert!(
            e["error"]["data"]["requiredCapabilities"]["extensions"][TASKS_EXTENSION].is_object()
        );
    }
}
