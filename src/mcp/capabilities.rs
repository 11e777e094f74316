//! Capabilities a request declares (2026-07-28: per request, in `_meta`), and the tasks
//! extension's identifier (SEP-2663).

use serde_json::Value;

/// `_meta` key carrying a request's client capabilities.
pub const CLIENT_CAPABILITIES_META: &str = "io.modelcontextprotocol/clientCapabilities";

/// The tasks extension's identifier (SEP-2663).
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

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
}
