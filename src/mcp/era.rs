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
//! The edge computes the era once per request ([`Era::of_parts`]); it travels down the stack as
//! a typed request extension, which layers read with `McpRequest::era` (absent, as on the
//! `upgrade` layer's own requests and in unit tests, means [`Era::Legacy`]).

use super::classify::Classified;
use crate::jsonrpc::Message;
use serde::{Deserialize, Serialize};

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

    /// The era an `MCP-Protocol-Version` header value names (legacy when it is not text).
    pub fn of_header(value: &http::HeaderValue) -> Era {
        value.to_str().map(Era::of_version).unwrap_or(Era::Legacy)
    }

    /// The era of a request as it arrived: `header`, the era of its `MCP-Protocol-Version`
    /// header ([`Era::of_header`]; `None` without one), when present (the 2026 transport
    /// requires it to equal the `_meta` value), else
    /// `params._meta["io.modelcontextprotocol/protocolVersion"]` of `msg`, else legacy (a 2025
    /// session's negotiated version is always below 2026-07-28). The `_meta` value is read
    /// from the places the envelope parse noted (`mcp::classify`): nothing parses the body.
    pub fn of_parts(header: Option<Era>, msg: Option<&Message>) -> Era {
        if let Some(era) = header {
            return era;
        }
        msg.and_then(|m| Classified::of(m).meta(PROTOCOL_VERSION_META))
            .and_then(super::classify::string)
            .map_or(Era::Legacy, |v| Era::of_version(&v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

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
        assert_eq!(Era::of_parts(None, Some(&msg)), Era::Modern);
        let legacy = Era::of_header(&http::HeaderValue::from_static("2025-11-25"));
        assert_eq!(Era::of_parts(Some(legacy), Some(&msg)), Era::Legacy);
        assert_eq!(Era::of_parts(None, None), Era::Legacy);
    }
}
