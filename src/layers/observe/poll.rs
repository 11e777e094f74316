//! The common poll, decided without a `Value` tree (see [`poll_repeats`]).

use crate::registry::{Registry, TaskFields};
use crate::store::TaskRecord;

/// Whether `bytes`, a reply to a 2025-11-25 `tasks/get`, repeats what `known` holds (see
/// [`Registry::would_change`]), read through a typed, borrowing view: only `result`'s `status`,
/// `statusMessage`, `lastUpdatedAt` and `pollInterval` are read, everything else is skipped
/// (and its syntax checked) without building a `Value`. `false` whenever the view cannot decide:
/// an error reply, a `result` that is not an object, a field of an unexpected type, a repeated
/// key; the caller then takes the `Value` path, which decides as before.
///
/// Why: parsing the answer into a `Value` was the largest part of a poll's cost in taskgate's own
/// code (benches/profile.sh, lifecycle; the before/after pair is in benches/RESULTS.md,
/// "typed tasks/get view").
pub(super) fn poll_repeats(bytes: &[u8], known: &TaskRecord) -> bool {
    use std::borrow::Cow;
    #[derive(serde::Deserialize)]
    struct Reply<'a> {
        #[serde(borrow)]
        result: Option<TaskView<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct TaskView<'a> {
        #[serde(borrow)]
        status: Option<Cow<'a, str>>,
        #[serde(borrow, rename = "statusMessage")]
        status_message: Option<Cow<'a, str>>,
        #[serde(borrow, rename = "lastUpdatedAt")]
        last_updated_at: Option<Cow<'a, str>>,
        #[serde(rename = "pollInterval")]
        poll_interval: Option<u64>,
        result: Option<ResultView>,
    }
    #[derive(serde::Deserialize)]
    struct ResultView {
        #[serde(rename = "isError")]
        is_error: Option<bool>,
    }
    let Ok(Reply { result: Some(task) }) = serde_json::from_slice::<Reply<'_>>(bytes) else {
        return false;
    };
    let fields = TaskFields {
        status: task.status.as_deref(),
        status_message: task.status_message.as_deref().map(Some),
        last_updated_at: task.last_updated_at.as_deref().map(Some),
        poll_interval: task.poll_interval.map(Some),
        tool_error: task.status.as_deref() == Some("completed")
            && task.result.and_then(|r| r.is_error) == Some(true),
    };
    !Registry::would_change_fields(known, &fields)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::testing::record;
    use crate::mcp::task::TaskStatus;

    fn reply(task: &str) -> Vec<u8> {
        format!(r#"{{"jsonrpc":"2.0","id":3,"result":{task}}}"#).into_bytes()
    }

    #[test]
    fn a_poll_repeating_the_record_is_decided_by_the_view() {
        let r = record("t1");
        let same = format!(
            r#"{{"taskId":"t1","status":"working","lastUpdatedAt":"{}","ttl":60000,"extra":{{"a":[1,2]}}}}"#,
            r.last_updated_at
        );
        assert!(poll_repeats(&reply(&same), &r));
        // Anything else goes to the Value path: another status, message or time, an error
        // reply, a field of an unexpected type, a repeated key, escapes decoded alike.
        for other in [
            r#"{"taskId":"t1","status":"completed"}"#.to_string(),
            r#"{"taskId":"t1","status":"working","statusMessage":"half way"}"#.to_string(),
            r#"{"taskId":"t1","status":"working","lastUpdatedAt":"2030-01-01T00:00:00Z"}"#
                .to_string(),
            r#"{"taskId":"t1","status":"working","pollInterval":5}"#.to_string(),
            r#"{"taskId":"t1","status":"working","pollInterval":-1}"#.to_string(),
            r#"{"taskId":"t1","status":7}"#.to_string(),
            r#"{"taskId":"t1","status":"working","status":"failed"}"#.to_string(),
            r#"[]"#.to_string(),
        ] {
            assert!(!poll_repeats(&reply(&other), &r), "{other}");
        }
        let error = br#"{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"x"}}"#;
        assert!(!poll_repeats(error, &r));
        let escaped = r#"{"taskId":"t1","status":"work\u0069ng"}"#;
        assert!(
            poll_repeats(&reply(escaped), &r),
            "an escaped status reads as itself"
        );
    }

    #[test]
    fn a_terminal_record_repeated_needs_no_store() {
        let mut r = record("t1");
        r.status = TaskStatus::Completed;
        let poll =
            r#"{"taskId":"t1","status":"completed","statusMessage":"done","lastUpdatedAt":"x"}"#;
        assert!(poll_repeats(&reply(poll), &r));
        assert!(!poll_repeats(&reply(r#"{"status":"failed"}"#), &r));
    }
}
