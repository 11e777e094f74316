//! Capabilities a client declares (2025-11-25: once, in `initialize`; 2026-07-28: per request,
//! in `_meta`), and the tasks extension's identifier (SEP-2663).

use serde_json::Value;

/// `_meta` key carrying a request's client capabilities.
pub const CLIENT_CAPABILITIES_META: &str = "io.modelcontextprotocol/clientCapabilities";

/// The prefix of the `_meta` keys the protocol reserves (`io.modelcontextprotocol/*`: 2026-07-28
/// requests carry `protocolVersion`, `clientCapabilities`, `clientInfo`, `logLevel` there, and
/// results `serverInfo`); none of them crosses into the other era (`layers::bridge`).
pub const PROTOCOL_META_PREFIX: &str = "io.modelcontextprotocol/";

/// The tasks extension's identifier (SEP-2663).
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// `_meta` key a 2026-07-28 server puts on every notification of a `subscriptions/listen`
/// stream (and on its final result): the subscription's id.
pub const SUBSCRIPTION_ID_META: &str = "io.modelcontextprotocol/subscriptionId";

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

/// [`declares_tasks_extension`] read from the raw JSON of `params._meta` (as
/// [`crate::jsonrpc::Message::param`] gives it), without a `Value` tree: the same path, keys
/// compared after unescaping and the last of a repeated key counting, as `Value::get` does.
///
/// Why: a 2026-07-28 `tasks/get` was read into a `Value` whole for this and its `taskId`:
/// about 12,400 instructions, 10 times per task in the modern lifecycle (issue 36).
pub fn meta_declares_tasks_extension(meta: Option<&str>) -> bool {
    let Some(meta) = meta.filter(|m| m.starts_with('{')) else {
        return false;
    };
    let path = [CLIENT_CAPABILITIES_META, "extensions", TASKS_EXTENSION];
    matches!(
        crate::jsonrpc::splice::raw_at(meta.as_bytes(), &path),
        Ok(Some(raw)) if raw.get().starts_with('{')
    )
}

/// The top-level client capabilities taskgate acts on (`tasks`, `elicitation`, `sampling`,
/// `roots`), as bits: a session keeps these, not the capabilities object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientCapabilities(u8);

impl ClientCapabilities {
    const TASKS: u8 = 1;
    const ELICITATION: u8 = 2;
    const SAMPLING: u8 = 4;
    const ROOTS: u8 = 8;

    /// What a client's `capabilities` object declares (the members' values are not looked at).
    pub fn of(capabilities: &Value) -> ClientCapabilities {
        ClientCapabilities(
            capabilities
                .as_object()
                .map_or(0, |o| o.keys().fold(0, |bits, k| bits | Self::bit(k))),
        )
    }

    /// The capabilities kept as [`ClientCapabilities::bits`] (a held session's stored record).
    pub fn from_bits(bits: u8) -> ClientCapabilities {
        ClientCapabilities(bits)
    }

    /// The bits, as a held session's record stores them.
    pub fn bits(self) -> u8 {
        self.0
    }

    fn bit(name: &str) -> u8 {
        match name {
            "tasks" => Self::TASKS,
            "elicitation" => Self::ELICITATION,
            "sampling" => Self::SAMPLING,
            "roots" => Self::ROOTS,
            _ => 0,
        }
    }

    /// Whether the client declared `capabilities.tasks`.
    pub fn tasks(self) -> bool {
        self.0 & Self::TASKS != 0
    }

    /// Whether the client declared a top-level capability, by JSON pointer (`/elicitation`,
    /// `/sampling`, `/tasks`, `/roots`; other capabilities are not kept and read as absent).
    pub fn has(self, pointer: &str) -> bool {
        let bit = Self::bit(pointer.trim_start_matches('/'));
        bit != 0 && self.0 & bit != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extension_must_be_declared_in_meta() {
        let yes = serde_json::json!({"_meta":{CLIENT_CAPABILITIES_META:{"extensions":{TASKS_EXTENSION:{}}}}});
        let legacy = serde_json::json!({"_meta":{CLIENT_CAPABILITIES_META:{"tasks":{}}}});
        assert!(declares_tasks_extension(Some(&yes)));
        assert!(!declares_tasks_extension(Some(&legacy)));
        assert!(!declares_tasks_extension(None));
    }

    /// The raw `_meta` reading decides as the `Value` one: escaped keys, the last of a repeated
    /// key, a declaration that is not an object.
    #[test]
    fn the_raw_meta_reads_as_the_value() {
        let ext = r#"{"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":"#;
        let cases = [
            (format!("{ext}{{}}}}}}}}"), true),
            (format!("{ext}{{\"a\":1}}}}}}}}"), true),
            (format!("{ext}true}}}}}}"), false),
            (format!("{ext}null}}}}}}"), false),
            (r#"{"io.modelcontextprotocol/clientCapabilities":{"tasks":{}}}"#.into(), false),
            (
                r#"{"io.modelcontextprotocol/clientCapabilities":{"ext\u0065nsions":{"io.modelcontextprotocol/tasks":{}}}}"#.into(),
                true,
            ),
            (
                r#"{"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}},"io.modelcontextprotocol/clientCapabilities":{}}"#.into(),
                false,
            ),
            ("[]".into(), false),
        ];
        for (meta, want) in cases {
            let value: Value = serde_json::from_str(&meta).unwrap();
            let params = serde_json::json!({ "_meta": value });
            assert_eq!(declares_tasks_extension(Some(&params)), want, "{meta}");
            assert_eq!(meta_declares_tasks_extension(Some(&meta)), want, "{meta}");
        }
        assert!(!meta_declares_tasks_extension(None));
    }

    #[test]
    fn client_capabilities_keep_the_four_taskgate_acts_on() {
        let caps =
            ClientCapabilities::of(&serde_json::json!({"elicitation": {}, "tasks": {}, "x": {}}));
        assert!(caps.tasks() && caps.has("/elicitation"));
        assert!(!caps.has("/sampling") && !caps.has("/x") && !caps.has("/roots"));
        assert_eq!(ClientCapabilities::from_bits(caps.bits()), caps);
        assert_eq!(ClientCapabilities::of(&Value::Null).bits(), 0);
    }
}
