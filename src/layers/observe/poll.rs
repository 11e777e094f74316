//! The common poll, decided (and applied when it reports a change) without a `Value` tree (see
//! [`TaskView`]).

use crate::jsonrpc::Id;
#[cfg(test)]
use crate::registry::Registry;
use crate::registry::{CreatedTask, TaskFields};
#[cfg(test)]
use crate::store::TaskRecord;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use std::borrow::Cow;

mod scan;

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
/// Whether `bytes`, a reply to a 2025-11-25 `tasks/get`, repeats what `known` holds (see
/// [`Registry::would_change`]), decided on the [`TaskView`]; `false` when the view cannot decide.
#[cfg(test)]
pub(super) fn poll_repeats(bytes: &[u8], known: &TaskRecord) -> bool {
    TaskView::of_reply(bytes).is_some_and(|t| !Registry::would_change_fields(known, &t.fields()))
}

/// The `Task` of a 2025-11-25 `tasks/get` reply's `result`, borrowed: only `status`,
/// `statusMessage`, `lastUpdatedAt`, `pollInterval` and `result.isError` are read, everything
/// else is skipped (and its syntax checked) without building a `Value`. `None` whenever it
/// cannot stand for the `Value` path: an error reply, a `result` (or the message, or
/// `result.result`) that is not an object, a field of an unexpected type, a repeated key; the
/// caller then takes the `Value` path, which decides as before.
///
/// Why: parsing the answer into a `Value` was the largest part of a poll's cost in taskgate's own
/// code (benches/profile.sh, lifecycle; the before/after pair is in benches/RESULTS.md,
/// "typed tasks/get view"); a poll that reports a change is applied from this view too (issue
/// 15: it was parsed twice then, typed and into a `Value`).
#[derive(serde::Deserialize)]
pub(super) struct TaskView<'a> {
    #[serde(borrow, rename = "taskId")]
    task_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    status: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "statusMessage")]
    status_message: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "lastUpdatedAt")]
    last_updated_at: Option<Cow<'a, str>>,
    #[serde(rename = "pollInterval")]
    poll_interval: Option<u64>,
    result: Option<MapOnly<ResultView>>,
    /// The `Task`'s `ttl` as the one-pass reader saw it; [`TtlSeen::Unread`] through serde.
    #[serde(skip)]
    ttl: TtlSeen,
}

/// The `ttl` member of the `Task` a [`TaskView`] was read from, as far as the one-pass reader
/// (`scan`) knows it: enough to tell that `show_recorded_ttl` would leave the answer as it is,
/// without the search for `"ttl"` and the number's parse it does (about 1,000 instructions per
/// `tasks/get` answer, ten per task in the lifecycle benchmark: callgrind, issue 36).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) enum TtlSeen {
    /// Not known (read through serde's derived readers): ask `show_recorded_ttl`.
    #[default]
    Unread,
    /// The `Task` has no `ttl` member.
    Absent,
    /// One `ttl` member, a number in plain digits that fits a `u64`.
    Plain(u64),
    /// Anything else: `null`, another number or type, the member twice.
    Other,
}

#[derive(serde::Deserialize)]
struct ResultView {
    #[serde(rename = "isError")]
    is_error: Option<bool>,
}

#[derive(serde::Deserialize)]
struct Reply<'a> {
    #[serde(borrow)]
    result: Option<MapOnly<TaskView<'a>>>,
}

impl<'a> TaskView<'a> {
    /// The `Task` of `bytes` when `bytes` is a JSON-RPC 2.0 result answering `id` (what
    /// `Message::parse` and the id check would find) whose `result` the view can read; `None`
    /// for anything else (an error, another id, another shape, text that is not UTF-8): the
    /// caller then takes the envelope path, which decides as before.
    ///
    /// Why: the envelope parse of every `tasks/get` answer, and then this view, were two passes
    /// over the same bytes (issue 15). Read by hand first (`scan`: the common shape, without
    /// serde's derived readers), through serde for what that hands back.
    pub(super) fn of_answer(bytes: &'a [u8], id: &Id) -> Option<TaskView<'a>> {
        scan::task_of_answer(bytes, id).or_else(|| Self::of_answer_by_serde(bytes, id))
    }

    /// [`TaskView::of_answer`] through serde's derived readers (the reference `scan` agrees
    /// with).
    fn of_answer_by_serde(bytes: &'a [u8], id: &Id) -> Option<TaskView<'a>> {
        result_answering::<MapOnly<TaskView<'a>>>(bytes, id).map(|MapOnly(task)| task)
    }

    /// The view of `bytes`' `result` (see the type's doc).
    pub(super) fn of_reply(bytes: &'a [u8]) -> Option<TaskView<'a>> {
        match serde_json::from_slice::<MapOnly<Reply<'a>>>(bytes) {
            Ok(MapOnly(Reply {
                result: Some(MapOnly(task)),
            })) => Some(task),
            _ => None,
        }
    }

    /// The fields as [`crate::registry::Registry::would_change_fields`] and
    /// [`crate::registry::Registry::observe_fields_as`]
    /// take them (what `TaskFields::of` would read from the same `Task` as a `Value`).
    pub(super) fn fields(&self) -> TaskFields<'_> {
        TaskFields {
            status: self.status.as_deref(),
            status_message: self.status_message.as_deref().map(Some),
            last_updated_at: self.last_updated_at.as_deref().map(Some),
            poll_interval: self.poll_interval.map(Some),
            tool_error: self.status.as_deref() == Some("completed")
                && self.result.as_ref().and_then(|r| r.0.is_error) == Some(true),
        }
    }

    /// Whether the `Task` names another task than `task_id` (the one asked about): an answer
    /// that is not about the task asked about is never applied to it (break-edge F2b: an
    /// upstream that mixed up its tasks had another owner's status and result relayed, applied
    /// and kept as this task's). A `Task` without a `taskId` (or a `null` one) is taken as
    /// the one asked about.
    pub(super) fn names_another(&self, task_id: &str) -> bool {
        self.task_id.as_deref().is_some_and(|t| t != task_id)
    }

    /// Whether `show_recorded_ttl` would leave the answer this view was read from as it is,
    /// for a record holding `recorded` as its ttl, decided from the view alone; `false` when the
    /// view cannot tell (the caller then asks `show_recorded_ttl`). True for a record without
    /// a ttl, or a plain number no greater than the record's: the cases in which
    /// `show_recorded_ttl` finds `result.ttl` no longer than the record's (a `Task` without one
    /// gets the record's added).
    pub(super) fn shows_recorded_ttl(&self, recorded: Option<u64>) -> bool {
        match (recorded, self.ttl) {
            (None, _) => true,
            (Some(cap), TtlSeen::Plain(ttl)) => ttl <= cap,
            // A `Task` without its `ttl` gets the record's (`show_recorded_ttl`).
            (Some(_), TtlSeen::Absent | TtlSeen::Unread | TtlSeen::Other) => false,
        }
    }
}

/// A JSON-RPC answer read in one pass: the envelope fields `Message::parse` reads, and
/// `result` as `R`.
#[derive(serde::Deserialize)]
struct Answer<'a, R> {
    #[serde(borrow)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    method: Option<IgnoredAny>,
    result: Option<R>,
    error: Option<IgnoredAny>,
}

/// `result` of `bytes`, read as `R`, when `bytes` is a JSON-RPC 2.0 result answering `id`
/// (what `Message::parse` and the id check would find); `None` for anything else (an error,
/// another id, a `null` or repeated member, text that is not UTF-8, a `result` that is not an
/// `R`): the caller then takes the envelope path, which decides as before.
fn result_answering<'a, R: serde::Deserialize<'a>>(bytes: &'a [u8], id: &Id) -> Option<R> {
    // `Message::parse` refuses text that is not UTF-8 where serde would skip it in a string.
    std::str::from_utf8(bytes).ok()?;
    let answer = serde_json::from_slice::<MapOnly<Answer<'a, R>>>(bytes)
        .ok()?
        .0;
    let is_result = answer.jsonrpc.map(RawValue::get) == Some("\"2.0\"")
        && answer.method.is_none()
        && answer.error.is_none();
    let answers = answer
        .id
        .and_then(|raw| Id::from_json(raw.get()))
        .is_some_and(|got| got == *id);
    answer.result.filter(|_| is_result && answers)
}

/// The raw `result` of a 2025-11-25 `tasks/result` answer to `id` (what
/// `splice::raw_at(bytes, ["result"])` would find after the envelope path), or `None` as
/// [`result_answering`] says.
///
/// Why: a `tasks/result` payload was parsed as an envelope and then walked again for its
/// `result`, two passes over the ~1 KiB payload (about 17,000 instructions per task in the
/// lifecycle benchmark, issue 36).
pub(super) fn payload_of_answer<'a>(bytes: &'a [u8], id: &Id) -> Option<&'a str> {
    scan::payload_of_answer(bytes, id)
        .or_else(|| result_answering::<&RawValue>(bytes, id).map(RawValue::get))
}

/// Of a `CreateTaskResult`'s `result`, only `task` (as raw JSON).
#[derive(serde::Deserialize)]
struct CreateResult<'a> {
    #[serde(borrow)]
    task: Option<&'a RawValue>,
}

/// What `record` makes of `result.task` of a 2025-11-25 `CreateTaskResult` answering `id`
/// (`Some(None)`: the result, an object, holds none, or `null`, or `record` made nothing of it;
/// what `pointer("/result/task")` of the whole message as a `Value` would find), or `None` as
/// [`result_answering`] says, or for a `task` serde_json cannot read as a `Value`.
///
/// Why: the answer was parsed as an envelope and then whole into a `Value`, of which only the
/// `Task` is used (about 25,000 instructions per task in the lifecycle benchmark, issue 36).
/// Read by hand first (`scan`: the envelope, then the `Task`'s members), through serde for what
/// that hands back.
pub(super) fn creation_of_answer<T>(
    bytes: &[u8],
    id: &Id,
    record: impl FnOnce(&CreatedTask<'_>) -> Option<T>,
) -> Option<Option<T>> {
    let task = match scan::creation_task_of_answer(bytes, id) {
        Some(task) => task,
        None => {
            let MapOnly(result) = result_answering::<MapOnly<CreateResult<'_>>>(bytes, id)?;
            result.task.map(RawValue::get)
        }
    };
    let Some(raw) = task else {
        return Some(None);
    };
    if let Some(task) = scan::created_task(raw) {
        return Some(record(&task));
    }
    let value = serde_json::from_str::<serde_json::Value>(raw).ok()?;
    Some(CreatedTask::of(&value).and_then(|task| record(&task)))
}

/// `T` read from a JSON object only: serde's derived structs also take an array (the fields in
/// order), where a `Value` lookup by key finds nothing.
struct MapOnly<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for MapOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Object<T> {
            type Value = MapOnly<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<MapOnly<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(MapOnly)
            }
        }
        d.deserialize_map(Object(std::marker::PhantomData))
    }
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

    /// A `result` (or the reply, or `result.result`) that is an array is not a `Task`: the view
    /// gives up (the `Value` path finds no `status` there). Serde's derived structs take arrays
    /// too, so the view used to read `["working",…]` as a `Task` repeating a working record.
    #[test]
    fn arrays_are_not_read_as_objects() {
        let r = record("t1");
        let array = r#"["working",null,"2026-01-01T00:00:00Z",null,null]"#;
        assert!(!poll_repeats(&reply(array), &r));
        assert!(TaskView::of_reply(&reply(array)).is_none());
        let whole = format!(r#"[2,{array}]"#);
        assert!(TaskView::of_reply(whole.as_bytes()).is_none());
        let inner = r#"{"status":"completed","result":[true]}"#;
        assert!(TaskView::of_reply(&reply(inner)).is_none());
        let tool_error = r#"{"status":"completed","result":{"isError":true}}"#;
        let bytes = reply(tool_error);
        let view = TaskView::of_reply(&bytes).expect("an object");
        assert!(view.fields().tool_error);
    }

    /// The payload view finds what the envelope path finds: the raw `result` of a result
    /// answering the id, nothing for an error, another id, a notification or a `null` result.
    #[test]
    fn a_payload_is_read_with_its_envelope() {
        let id = Id::from_json("3").unwrap();
        let ok =
            br#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"a\"b"}]}}"#;
        assert_eq!(
            payload_of_answer(ok, &id),
            Some(r#"{"content":[{"type":"text","text":"a\"b"}]}"#)
        );
        for other in [
            &br#"{"jsonrpc":"2.0","id":4,"result":{}}"#[..],
            br#"{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":3,"result":null}"#,
            br#"{"jsonrpc":"2.0","id":3,"result":{},"result":{}}"#,
            br#"{"jsonrpc":"1.0","id":3,"result":{}}"#,
            br#"{"jsonrpc":"2.0","method":"x","id":3,"result":{}}"#,
            br#"[{"jsonrpc":"2.0","id":3,"result":{}}]"#,
        ] {
            assert!(
                payload_of_answer(other, &id).is_none(),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    /// The creation view finds what `pointer("/result/task")` of the whole message finds, and
    /// gives up where the envelope path must decide.
    #[test]
    fn a_creation_is_read_with_its_envelope() {
        let id = Id::from_json("\"c1\"").unwrap();
        let read = |task: &CreatedTask<'_>| Some(format!("{task:?}"));
        // Escaped (the `Value` path) and plain (read by hand).
        for task in [
            r#"{"taskId":"t\u0031","status":"working","ttl":60000,"pollInterval":100}"#,
            r#"{"taskId":"t1","status":"working","ttl":60000,"pollInterval":100}"#,
        ] {
            let ok = format!(
                r#"{{"jsonrpc":"2.0","id":"c1","result":{{"task":{task},"_meta":{{"a":[1]}}}}}}"#
            );
            let whole: serde_json::Value = serde_json::from_str(&ok).unwrap();
            let found = whole.pointer("/result/task").and_then(CreatedTask::of);
            assert_eq!(
                creation_of_answer(ok.as_bytes(), &id, read),
                Some(Some(format!("{:?}", found.expect("a task"))))
            );
        }
        let none = br#"{"jsonrpc":"2.0","id":"c1","result":{"content":[]}}"#;
        assert_eq!(creation_of_answer(none, &id, read), Some(None));
        // No string `taskId`: nothing to record.
        let no_id = br#"{"jsonrpc":"2.0","id":"c1","result":{"task":{"taskId":1}}}"#;
        assert_eq!(creation_of_answer(no_id, &id, read), Some(None));
        for other in [
            &br#"{"jsonrpc":"2.0","id":"c2","result":{"task":{}}}"#[..],
            br#"{"jsonrpc":"2.0","id":"c1","error":{"code":1,"message":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":"c1","result":[{"task":{}}]}"#,
            br#"{"jsonrpc":"2.0","id":"c1","result":{"task":{},"task":{}}}"#,
            br#"{"jsonrpc":"2.0","id":"c1","id":"c1","result":{"task":{}}}"#,
            // A `task` serde_json cannot read as a `Value`.
            br#"{"jsonrpc":"2.0","id":"c1","result":{"task":{"taskId":"t","x":1e400}}}"#,
        ] {
            assert!(
                creation_of_answer(other, &id, read).is_none(),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
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
