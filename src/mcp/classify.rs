//! A message classified once: its method and the few params the layers act on, read from the
//! places the edge's envelope parse noted (`jsonrpc::Message::param`), as slices of the
//! message's own bytes. No layer parses `params` again to learn them, and nothing is copied
//! until a layer decodes the one value it needs.
//!
//! | what | where (both eras) | read by |
//! |---|---|---|
//! | [`Classified::method`] | `method` | every layer's dispatch |
//! | [`Classified::task_id`] | `params.taskId` (`tasks/get`, `tasks/result`, `tasks/cancel`, `tasks/update`) | `tasks` (authorise), `cancel` |
//! | [`Classified::task`] | `params.task` (a 2025-11-25 task-augmented `tools/call`) | `tasks`, `upgrade` |
//! | [`Classified::tool`] | `params.name` (`tools/call`) | `tasks`, `upgrade` |
//! | [`Classified::progress_token`] | `params._meta.progressToken` | `tasks`, `upgrade` |
//! | [`Classified::request_id`] | `params.requestId` (`notifications/cancelled`) | `upgrade`, `cancel`, `ids` |
//! | [`Classified::meta`] | `params._meta[key]` (the 2026-07-28 protocol version) | the edge (era) |
//! | [`Classified::meta_str`] | `params._meta.traceparent`, `params._meta.tracestate` | the edge (trace parent) |
//!
//! A message a layer rewrites is a new `Message`, whose places its own parse noted: a
//! classification never describes bytes other than the ones it is read from.
//!
//! Keys compare as the strings they spell (a message whose keys hold escapes, `"t\u0061sk"`, is
//! read by a walk of its `params`: `jsonrpc::Message::param`), so what a layer sees here is
//! what the upstream's JSON parser sees.

use crate::jsonrpc::{Id, Kind, Message};
use std::borrow::Cow;

/// The classified view of one message (see the module docs): borrowed, free to make.
#[derive(Clone, Copy, Debug)]
pub struct Classified<'a> {
    msg: &'a Message,
}

impl<'a> Classified<'a> {
    /// The view of `msg`.
    pub fn of(msg: &'a Message) -> Classified<'a> {
        Classified { msg }
    }

    /// The method of a request or notification.
    pub fn method(&self) -> Option<&'a str> {
        self.msg.method()
    }

    /// The method of a *request* (with an id): a notification naming a request method is not
    /// that request.
    pub fn request_method(&self) -> Option<&'a str> {
        match self.msg.kind() {
            Kind::Request => self.msg.method(),
            _ => None,
        }
    }

    /// The method of a notification (no id).
    pub fn notification_method(&self) -> Option<&'a str> {
        match self.msg.kind() {
            Kind::Notification => self.msg.method(),
            _ => None,
        }
    }

    /// The raw JSON of the member `name` of `params`, whatever its type.
    pub fn param(&self, name: &str) -> Option<&'a str> {
        self.msg.param(name)
    }

    /// `params.taskId` when it is a JSON string, decoded (borrowed when it holds no escape).
    pub fn task_id(&self) -> Option<Cow<'a, str>> {
        string(self.msg.param("taskId")?)
    }

    /// The raw JSON of `params.task` when it is an object (2025-11-25: a task-augmented request).
    pub fn task(&self) -> Option<&'a str> {
        self.msg.param("task").filter(|t| t.starts_with('{'))
    }

    /// `params.name` of a `tools/call` when it is a JSON string, decoded.
    pub fn tool(&self) -> Option<Cow<'a, str>> {
        string(self.msg.param("name")?)
    }

    /// The raw JSON of `params._meta[key]`.
    pub fn meta(&self, key: &str) -> Option<&'a str> {
        let meta = self.msg.param("_meta")?;
        if !meta.starts_with('{') {
            return None;
        }
        crate::jsonrpc::splice::raw_at(meta.as_bytes(), &[key])
            .ok()
            .flatten()
            .map(serde_json::value::RawValue::get)
    }

    /// `params._meta[key]` when it is a JSON string, decoded: the W3C trace context a client
    /// put there (`traceparent`, `tracestate`: SEP-414; read by the edge for its span).
    pub fn meta_str(&self, key: &str) -> Option<Cow<'a, str>> {
        string(self.meta(key)?)
    }

    /// The raw JSON of `params._meta.progressToken` (basic/utilities/progress).
    pub fn progress_token(&self) -> Option<&'a str> {
        self.meta("progressToken")
    }

    /// `params.requestId` of a `notifications/cancelled` (basic/utilities/cancellation), when it
    /// is an id (a string or an integer), in [`Id`]'s spelling.
    pub fn request_id(&self) -> Option<Id> {
        Id::from_json(self.msg.param("requestId")?)
    }
}

/// A JSON string's value: borrowed without escapes, decoded with them; `None` for any other
/// JSON value.
pub fn string(raw: &str) -> Option<Cow<'_, str>> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn msg(text: &'static str) -> Message {
        Message::parse_checked(Bytes::from_static(text.as_bytes())).unwrap()
    }

    #[test]
    fn the_params_layers_read_are_found_where_the_edge_noted_them() {
        let m = msg(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","arguments":{"taskId":"no","name":"x"},"task":{"ttl":5},"_meta":{"progressToken":7}}}"#,
        );
        let c = Classified::of(&m);
        assert_eq!(c.request_method(), Some("tools/call"));
        assert_eq!(c.notification_method(), None);
        assert_eq!(c.tool().as_deref(), Some("slow"));
        assert_eq!(c.task(), Some(r#"{"ttl":5}"#));
        assert_eq!(c.progress_token(), Some("7"));
        // Only `params`' own members: `arguments.taskId` is not the task's.
        assert_eq!(c.task_id(), None);
        let m = msg(r#"{"jsonrpc":"2.0","id":"a","method":"tasks/get","params":{"taskId":"t-1"}}"#);
        assert_eq!(Classified::of(&m).task_id().as_deref(), Some("t-1"));
    }

    #[test]
    fn escaped_keys_and_values_read_as_the_strings_they_spell() {
        let m =
            msg(r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"t\u0061skId":"a\"b"}}"#);
        assert_eq!(Classified::of(&m).task_id().as_deref(), Some("a\"b"));
        let m = msg(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","t\u0061sk":{}}}"#,
        );
        assert_eq!(Classified::of(&m).task(), Some("{}"));
    }

    #[test]
    fn many_params_are_walked_and_odd_shapes_are_absent() {
        let m = msg(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"task":{"ttl":1}}}"#,
        );
        assert_eq!(Classified::of(&m).task(), Some(r#"{"ttl":1}"#));
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[1]}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":null}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"task":true,"name":3}}"#,
        ] {
            let m = msg(text);
            let c = Classified::of(&m);
            assert_eq!(
                (c.task(), c.tool(), c.task_id()),
                (None, None, None),
                "{text}"
            );
        }
    }

    #[test]
    fn params_past_64_kib_are_walked() {
        let big = "x".repeat(70_000);
        let text = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"arguments":{{"s":"{big}"}},"name":"n","task":{{}}}}}}"#
        );
        let m = Message::parse_checked(Bytes::from(text)).unwrap();
        let c = Classified::of(&m);
        assert_eq!((c.tool().as_deref(), c.task()), (Some("n"), Some("{}")));
        assert!(m.params().is_some_and(|p| p.ends_with(r#""task":{}}"#)));
    }

    #[test]
    fn a_cancelled_notification_names_its_request_in_the_ids_spelling() {
        let m = msg(
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"\u0061","reason":"x"}}"#,
        );
        let c = Classified::of(&m);
        assert_eq!(c.notification_method(), Some("notifications/cancelled"));
        assert_eq!(c.request_id(), Id::from_json(r#""a""#));
        let m = msg(
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1.5}}"#,
        );
        assert_eq!(Classified::of(&m).request_id(), None);
    }
}
