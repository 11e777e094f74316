//! The answer to a 2025-11-25 `tasks/get` read by hand, in one pass over its bytes: what
//! [`super::result_answering`] reads into a [`TaskView`] through serde's derived readers, for the
//! shape nearly every answer has; anything else is handed back (`None`) and serde decides as
//! before. The same reader finds a `tasks/result` answer's raw payload and a `CreateTaskResult`'s
//! raw `task` ([`payload_of_answer`], [`creation_task_of_answer`]).
//!
//! Why: serde's derived readers (the envelope's five members, then the `Task`'s, each key
//! matched by a generated visitor, `IgnoredAny` for the rest) cost about 5,900 instructions per
//! answer, ten answers per task in the lifecycle benchmark (issue 36).
//!
//! Conservative, like `jsonrpc::envelope`: it accepts only text that serde's readers accept,
//! with the same view. Handed back: text that is not UTF-8; a `method` or `error` member (an
//! error answer, or not an answer); a key with an escape; a `\u` escape anywhere (it may be a
//! lone surrogate); any escape in a string the view keeps; a known member twice; a
//! `pollInterval` that is not plain digits fitting a `u64`; a member of another type than the
//! view reads; nesting deeper than [`MAX_DEPTH`]; any syntax error.

use super::{MapOnly, ResultView, TaskView, TtlSeen};
use crate::jsonrpc::lex::Lex;
use crate::jsonrpc::Id;
use crate::registry::CreatedTask;
use std::borrow::Cow;

/// Nesting (the message is 1) past which the text is handed back; serde_json's limit is 128.
const MAX_DEPTH: usize = 64;

/// The `Task` of `bytes` when it is a JSON-RPC 2.0 result answering `id` (see the module doc);
/// `None` to let serde decide.
pub(super) fn task_of_answer<'a>(bytes: &'a [u8], id: &Id) -> Option<TaskView<'a>> {
    answer(bytes, id, Scan::task)
}

/// The raw `result` of `bytes` when it is a JSON-RPC 2.0 result answering `id` (a `tasks/result`
/// payload): the text serde's `&RawValue` holds; `None` to let serde decide (a `null` result
/// too, which serde reads as none).
///
/// Why: serde's derived reader of the envelope and the `RawValue` skip of the ~1 KiB payload
/// cost about 7,600 instructions per `tasks/result` in the lifecycle benchmark (issue 36).
pub(super) fn payload_of_answer<'a>(bytes: &'a [u8], id: &Id) -> Option<&'a str> {
    answer(bytes, id, |r| {
        if r.peek()? == b'n' {
            return None;
        }
        let start = r.i;
        r.value(1)?;
        r.text.get(start..r.i)
    })
}

/// `result.task` of `bytes`, raw, when it is a JSON-RPC 2.0 result answering `id` whose
/// `result` is an object (a 2025-11-25 `CreateTaskResult`): `Some(None)` when it holds no
/// `task`; `None` to let serde decide (a `task` of `null` or twice too).
///
/// Why: serde's derived readers of the envelope and of `result` cost about 4,600 instructions
/// per creation in the lifecycle benchmark (issue 36).
pub(super) fn creation_task_of_answer<'a>(bytes: &'a [u8], id: &Id) -> Option<Option<&'a str>> {
    answer(bytes, id, Scan::creation_task)
}

/// What `read` makes of `result` when `bytes` is a JSON-RPC 2.0 result answering `id`, read in
/// one pass with its envelope; `None` to let serde decide (see the module doc).
fn answer<'a, R>(
    bytes: &'a [u8],
    id: &Id,
    read: impl FnOnce(&mut Scan<'a>) -> Option<R>,
) -> Option<R> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut r = Scan::new(text);
    let (mut jsonrpc, mut raw_id, mut result) = (None, None, None);
    let mut read = Some(read);
    r.ws();
    r.eat(b'{')?;
    loop {
        let key = r.member_name()?;
        let start = r.i;
        match key {
            "jsonrpc" | "id" => {
                r.value(1)?;
                let slot = if key == "id" {
                    &mut raw_id
                } else {
                    &mut jsonrpc
                };
                if slot.replace(text.get(start..r.i)?).is_some() {
                    return None;
                }
            }
            // A second `result` finds `read` taken: handed back.
            "result" => result = Some(read.take()?(&mut r)?),
            "method" | "error" => return None,
            _ => r.value(1)?,
        }
        r.ws();
        if !r.next_member()? {
            break;
        }
    }
    r.ws();
    if r.i != r.b.len() || jsonrpc? != "\"2.0\"" {
        return None;
    }
    // The same text is the same id (an id's text is its canonical form); another text may
    // still spell it (`Id::from_json` decides).
    let raw_id: &str = raw_id?;
    let answers =
        raw_id.as_bytes() == id.as_bytes() || Id::from_json(raw_id).is_some_and(|got| got == *id);
    result.filter(|_| answers)
}

/// What [`Registry::creation_record`](crate::registry::Registry::creation_record) reads of the
/// `Task` text `raw` (a `CreateTaskResult`'s `task`, as [`creation_task_of_answer`] or serde's
/// `RawValue` finds it), read by hand as [`CreatedTask::of`] reads its `Value`; `None` to let
/// serde decide: besides what the module doc lists, a `taskId` missing (or not a string), a
/// number with an exponent or more than 19 digits before its point anywhere (serde_json refuses
/// one out of an `f64`'s range), and a `ttl` or `pollInterval` number that is not plain digits
/// fitting a `u64`.
///
/// Why: the `Task` parsed into a `Value` to read seven members, and that `Value` dropped, cost
/// about 6,000 instructions per creation in the lifecycle benchmark (issue 36).
pub(super) fn created_task(raw: &str) -> Option<CreatedTask<'_>> {
    let mut r = Scan::new(raw);
    r.notes_wide = true;
    let mut task = CreatedTask {
        task_id: "",
        status: None,
        status_message: None,
        created_at: None,
        last_updated_at: None,
        ttl: None,
        poll_interval: None,
    };
    let mut task_id = None;
    r.ws();
    r.eat(b'{')?;
    r.ws();
    if r.eat(b'}').is_none() {
        // The members read, one bit each: a known member twice is handed back (a `Value`
        // keeps the last one).
        let mut seen = 0u8;
        loop {
            let key = r.member_name()?;
            let bit = match key {
                "taskId" => 1,
                "status" => 2,
                "statusMessage" => 4,
                "createdAt" => 8,
                "lastUpdatedAt" => 16,
                "ttl" => 32,
                "pollInterval" => 64,
                _ => 0,
            };
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            match bit {
                1 => task_id = r.text_or_other()?,
                2 => task.status = r.text_or_other()?,
                4 => task.status_message = r.text_or_other()?,
                8 => task.created_at = r.text_or_other()?,
                16 => task.last_updated_at = r.text_or_other()?,
                32 => task.ttl = r.u64_or_other()?,
                64 => task.poll_interval = r.u64_or_other()?,
                _ => r.value(2)?,
            }
            r.ws();
            if !r.next_member()? {
                break;
            }
        }
    }
    r.ws();
    if r.i != r.b.len() || r.wide {
        return None;
    }
    // An empty one (or one holding NUL, which comes escaped: serde's) is serde's to refuse.
    task.task_id = task_id.filter(|id: &&str| crate::store::recordable_task_id(id))?;
    Some(task)
}

struct Scan<'a> {
    /// The text and the place read next (the tokens, [`Lex`]'s).
    lex: Lex<'a>,
    /// Whether skipped numbers are noted in [`Scan::wide`] ([`created_task`] only: the other
    /// readers skip numbers as serde's `IgnoredAny` does, whatever their range).
    notes_wide: bool,
    /// A number skipped had an exponent or more than 19 digits before its point (see
    /// [`created_task`]).
    wide: bool,
}

impl<'a> std::ops::Deref for Scan<'a> {
    type Target = Lex<'a>;
    fn deref(&self) -> &Lex<'a> {
        &self.lex
    }
}

impl<'a> std::ops::DerefMut for Scan<'a> {
    fn deref_mut(&mut self) -> &mut Lex<'a> {
        &mut self.lex
    }
}

impl<'a> Scan<'a> {
    fn new(text: &'a str) -> Scan<'a> {
        Scan {
            lex: Lex::new(text),
            notes_wide: false,
            wide: false,
        }
    }

    /// A member [`created_task`] keeps as a string: the text of a string without escape,
    /// `Some(None)` for a value of another type (skipped); `None` (handed back) for a string
    /// with an escape.
    fn text_or_other(&mut self) -> Option<Option<&'a str>> {
        if self.peek()? == b'"' {
            return self.plain_string().map(Some);
        }
        self.value(2).map(|()| None)
    }

    /// A member [`created_task`] keeps as a `u64`: plain digits fitting one, `Some(None)` for a
    /// value that is not a number (skipped); `None` (handed back) for any other number.
    fn u64_or_other(&mut self) -> Option<Option<u64>> {
        match self.peek()? {
            b'0'..=b'9' => self.u64_or_null(),
            b'-' => None,
            _ => self.value(2).map(|()| None),
        }
    }

    /// A number skipped by [`Scan::value`], noted in [`Scan::wide`] (when [`Scan::notes_wide`])
    /// if serde_json might find it out of an `f64`'s range. (Noted always, the check cost the
    /// `tasks/get` reader ~70 instructions a poll, callgrind, issue 36.)
    fn skipped_number(&mut self) -> Option<()> {
        let start = self.i;
        self.number()?;
        if !self.notes_wide {
            return Some(());
        }
        let raw = &self.b[start..self.i];
        let whole = raw
            .iter()
            .take_while(|c| !matches!(c, b'.' | b'e' | b'E'))
            .filter(|c| c.is_ascii_digit())
            .count();
        if whole > 19 || raw.iter().any(|c| matches!(c, b'e' | b'E')) {
            self.wide = true;
        }
        Some(())
    }

    /// A member the view keeps as a string: `Some(None)` for `null`, the text of a string
    /// without escape; `None` (handed back) for anything else.
    fn text_or_null(&mut self) -> Option<Option<Cow<'a, str>>> {
        if self.peek()? == b'n' {
            return self.literal(b"null").map(|()| None);
        }
        self.plain_string().map(|s| Some(Cow::Borrowed(s)))
    }

    /// `pollInterval` as serde reads an `Option<u64>`: `Some(None)` for `null`, plain digits
    /// fitting a `u64`; `None` for anything else (a sign, a fraction or exponent, which serde
    /// refuses or reads otherwise).
    fn u64_or_null(&mut self) -> Option<Option<u64>> {
        let first = self.peek()?;
        if first == b'n' {
            return self.literal(b"null").map(|()| None);
        }
        if !first.is_ascii_digit() {
            return None;
        }
        let start = self.i;
        let mut n = 0u64;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            self.i += 1;
        }
        // No digit after a leading 0 (serde: "invalid number").
        if first == b'0' && self.i - start > 1 {
            return None;
        }
        match self.peek() {
            Some(b'.' | b'e' | b'E') => None,
            _ => Some(Some(n)),
        }
    }

    /// The answer's `result`, a `Task` object (anything else is handed back: `null` is no
    /// view, an array is not a `Task`).
    fn task(&mut self) -> Option<TaskView<'a>> {
        let mut view = TaskView {
            task_id: None,
            status: None,
            status_message: None,
            last_updated_at: None,
            poll_interval: None,
            result: None,
            ttl: TtlSeen::Absent,
        };
        self.eat(b'{')?;
        self.ws();
        if self.eat(b'}').is_some() {
            return Some(view);
        }
        // The members read, one bit each: serde refuses a known member twice.
        let mut seen = 0u8;
        loop {
            let key = self.member_name()?;
            let bit = match key {
                "status" => 1,
                "statusMessage" => 2,
                "lastUpdatedAt" => 4,
                "pollInterval" => 8,
                "result" => 16,
                // Not refused twice (serde's view skips it): noted as `Other` then.
                "ttl" => 32,
                "taskId" => 64,
                _ => 0,
            };
            if seen & bit & !32 != 0 {
                return None;
            }
            // By the bit: the key is compared once (a second `match` on the key compared
            // the keys of the same length again, with a `memcmp` each).
            match bit {
                1 => view.status = self.text_or_null()?,
                2 => view.status_message = self.text_or_null()?,
                4 => view.last_updated_at = self.text_or_null()?,
                8 => view.poll_interval = self.u64_or_null()?,
                16 => view.result = self.result_view()?,
                32 => view.ttl = self.ttl(seen & 32 != 0)?,
                64 => view.task_id = self.text_or_null()?,
                _ => self.value(2)?,
            }
            seen |= bit;
            self.ws();
            if !self.next_member()? {
                return Some(view);
            }
        }
    }

    /// A `CreateTaskResult`'s `result` (an object): its `task`, raw, as serde's `&RawValue`
    /// holds it (`None` inside: no `task`); `None` for anything else (not an object, a `task`
    /// of `null` or twice).
    fn creation_task(&mut self) -> Option<Option<&'a str>> {
        self.eat(b'{')?;
        self.ws();
        if self.eat(b'}').is_some() {
            return Some(None);
        }
        let mut task = None;
        loop {
            let key = self.member_name()?;
            if key == "task" {
                if task.is_some() || self.peek()? == b'n' {
                    return None;
                }
                let start = self.i;
                self.value(2)?;
                task = Some(self.text.get(start..self.i)?);
            } else {
                self.value(2)?;
            }
            self.ws();
            if !self.next_member()? {
                return Some(task);
            }
        }
    }

    /// The `Task`'s `ttl` (`again`: a `ttl` member came before), skipped as any value and noted
    /// as [`TtlSeen`] says.
    fn ttl(&mut self, again: bool) -> Option<TtlSeen> {
        let start = self.i;
        self.value(2)?;
        let raw = &self.b[start..self.i];
        let mut n = 0u64;
        for &c in raw {
            if !c.is_ascii_digit() {
                return Some(TtlSeen::Other);
            }
            let Some(next) = n
                .checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(c - b'0')))
            else {
                return Some(TtlSeen::Other);
            };
            n = next;
        }
        Some(if again || raw.is_empty() {
            TtlSeen::Other
        } else {
            TtlSeen::Plain(n)
        })
    }

    /// The `Task`'s own `result` (a 2026 `DetailedTask`'s): `Some(None)` for `null`, an object
    /// of which `isError` (a boolean or `null`) is read; `None` for anything else.
    fn result_view(&mut self) -> Option<Option<MapOnly<ResultView>>> {
        if self.peek()? == b'n' {
            return self.literal(b"null").map(|()| None);
        }
        self.eat(b'{')?;
        let mut is_error = None;
        self.ws();
        if self.eat(b'}').is_some() {
            return Some(Some(MapOnly(ResultView { is_error })));
        }
        let mut seen = false;
        loop {
            let key = self.member_name()?;
            if key == "isError" {
                if std::mem::replace(&mut seen, true) {
                    return None;
                }
                is_error = match self.peek()? {
                    b't' => self.literal(b"true").map(|()| Some(true))?,
                    b'f' => self.literal(b"false").map(|()| Some(false))?,
                    _ => self.literal(b"null").map(|()| None)?,
                };
            } else {
                self.value(3)?;
            }
            self.ws();
            if !self.next_member()? {
                return Some(Some(MapOnly(ResultView { is_error })));
            }
        }
    }

    /// One value at nesting `depth` (the message is 1), skipped (serde's `IgnoredAny`, which
    /// also takes a key twice in an object it skips).
    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string(),
            b'{' | b'[' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                let object = self.peek() == Some(b'{');
                let close = if object { b'}' } else { b']' };
                self.i += 1;
                self.ws();
                if self.eat(close).is_some() {
                    return Some(());
                }
                loop {
                    self.ws();
                    if object {
                        self.string()?;
                        self.ws();
                        self.eat(b':')?;
                        self.ws();
                    }
                    self.value(depth + 1)?;
                    self.ws();
                    let c = self.peek()?;
                    self.i += 1;
                    match c {
                        b',' => continue,
                        c if c == close => return Some(()),
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.skipped_number(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::TaskFields;

    /// What a reader makes of `text` answering id 7: the fields, the inner `isError` and the
    /// `taskId`.
    type Read<'a> = Option<(TaskFields<'a>, Option<Option<bool>>, Option<&'a str>)>;

    fn seen<'a>(view: Option<&'a TaskView<'a>>) -> Read<'a> {
        view.map(|v| {
            let is_error = v.result.as_ref().map(|r| r.0.is_error);
            (v.fields(), is_error, v.task_id.as_deref())
        })
    }

    fn id() -> Id {
        Id::from_json("7").unwrap()
    }

    /// Answers of the usual shapes are read by hand, as serde reads them.
    #[test]
    fn common_answers_are_read_by_hand_as_serde_reads_them() {
        let common = [
            r#"{"jsonrpc":"2.0","id":7,"result":{"createdAt":"2026-12-05T12:00:00.000Z","lastUpdatedAt":"2026-12-05T12:00:01.000Z","pollInterval":100,"status":"completed","taskId":"t-1","ttl":600000}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"t-1","status":"working","statusMessage":"half way","pollInterval":0,"_meta":{"x":[1,-2.5e3,{"y":null}],"é":true}}}"#,
            " {\n \"result\" : {\"status\":\"completed\",\"result\":{\"content\":[],\"isError\":true}} , \"id\":7,\"jsonrpc\":\"2.0\"}\t",
            r#"{"jsonrpc":"2.0","id":7,"result":{"status":null,"statusMessage":null,"lastUpdatedAt":null,"pollInterval":null,"result":null}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"status":"failed","pollInterval":18446744073709551615,"result":{"isError":null}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":7,"x":[{"a":1,"a":2}],"result":{"k":{},"k":[]}}"#,
        ];
        for text in common {
            let hand = task_of_answer(text.as_bytes(), &id());
            let serde = TaskView::of_answer_by_serde(text.as_bytes(), &id());
            assert!(hand.is_some(), "{text}");
            assert_eq!(seen(hand.as_ref()), seen(serde.as_ref()), "{text}");
        }
    }

    /// What the reader is not sure of goes to serde, which decides as before.
    #[test]
    fn unusual_answers_are_handed_to_serde() {
        let handed_back = [
            r#"{"jsonrpc":"2.0","id":8,"result":{"status":"working"}}"#,
            r#"{"jsonrpc":"2.0","id":"7","result":{"status":"working"}}"#,
            r#"{"jsonrpc":"1.0","id":7,"result":{"status":"working"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":null,"result":{"status":"working"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"status":"work\u0069ng"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"st\u0061tus":"working"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"statusMessage":"a\nb"}}"#,
            // A `taskId` with escapes: serde decodes it (compared with the task asked about).
            r#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"t\"1\\\/","status":"working"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"t","taskId":"u"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"status":"working","status":"failed"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"status":null,"status":null}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"status":7}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"pollInterval":-1}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"pollInterval":-0}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"pollInterval":1.0}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"pollInterval":1e3}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"pollInterval":01}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"pollInterval":18446744073709551616}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"result":[true]}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"result":{"isError":1}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"result":{"isError":true,"isError":false}}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":["working"]}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":null}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{},"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":7,"id":7,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"a":"\ud800"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"a":"x	y"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"a":1,}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{}} x"#,
            r#"{"jsonrpc":"2.0","id":null,"result":{}}"#,
            r#"{"id":7,"result":{}}"#,
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}",
            r#"[{"jsonrpc":"2.0","id":7,"result":{}}]"#,
            "",
        ];
        for text in handed_back {
            assert!(task_of_answer(text.as_bytes(), &id()).is_none(), "{text}");
        }
        assert!(task_of_answer(
            b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"a\":\"\xff\"}}",
            &id()
        )
        .is_none());
        let nested = |n: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","id":7,"result":{{"a":{}1{}}}}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        assert!(task_of_answer(nested(60).as_bytes(), &id()).is_some());
        assert!(task_of_answer(nested(200).as_bytes(), &id()).is_none());
        // (serde skips it: the view comes from serde's reader then.)
        assert!(TaskView::of_answer(nested(200).as_bytes(), &id()).is_some());
    }

    /// Where the reader's note of the `ttl` says the answer shows the recorded ttl already,
    /// `show_recorded_ttl` leaves it as it is (it is then not asked): the usual members, odd
    /// ones, and texts with random edits around a `ttl`, for records with several ttls.
    #[test]
    fn the_ttl_noted_agrees_with_show_recorded_ttl() {
        use crate::layers::observe::modern::show_recorded_ttl;
        let noted = [
            (r#"{"status":"working","ttl":60000}"#, TtlSeen::Plain(60000)),
            (r#"{"ttl":0,"status":"working"}"#, TtlSeen::Plain(0)),
            (r#"{"status":"working"}"#, TtlSeen::Absent),
            (
                r#"{"_meta":{"ttl":99999999},"x":[{"ttl":null}]}"#,
                TtlSeen::Absent,
            ),
            (r#"{"ttl":null}"#, TtlSeen::Other),
            (r#"{"ttl":6e4}"#, TtlSeen::Other),
            (r#"{"ttl":60000.0}"#, TtlSeen::Other),
            (r#"{"ttl":-1}"#, TtlSeen::Other),
            (r#"{"ttl":"60000"}"#, TtlSeen::Other),
            (r#"{"ttl":{}}"#, TtlSeen::Other),
            (r#"{"ttl":1,"ttl":2}"#, TtlSeen::Other),
            (r#"{"ttl":18446744073709551616}"#, TtlSeen::Other),
            (r#"{"ttl":18446744073709551615}"#, TtlSeen::Plain(u64::MAX)),
        ];
        let agrees = |text: &str, view: &TaskView<'_>| {
            for cap in [
                None,
                Some(0),
                Some(1),
                Some(59_999),
                Some(60_000),
                Some(u64::MAX),
            ] {
                let mut r = crate::layers::testing::record("t1");
                r.ttl_ms = cap;
                let bytes = bytes::Bytes::from(text.to_string());
                if view.shows_recorded_ttl(cap) {
                    let shown = show_recorded_ttl(bytes.clone(), &["ttl"], &r);
                    assert_eq!(shown, bytes, "{text} {cap:?}");
                }
            }
        };
        for (task, ttl) in noted {
            let text = format!(r#"{{"jsonrpc":"2.0","id":7,"result":{task}}}"#);
            let view = task_of_answer(text.as_bytes(), &id()).expect("read by hand");
            assert_eq!(view.ttl, ttl, "{task}");
            agrees(&text, &view);
            // Through serde the ttl is not known: `show_recorded_ttl` decides.
            let serde = TaskView::of_answer_by_serde(text.as_bytes(), &id()).expect("read");
            assert_eq!(serde.ttl, TtlSeen::Unread);
            assert!(!serde.shows_recorded_ttl(Some(60_000)));
        }
        let seeds = [
            r#"{"jsonrpc":"2.0","id":7,"result":{"status":"working","ttl":60000,"pollInterval":100}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"ttl":1000,"_meta":{"ttl":5},"status":"completed"}}"#,
        ];
        let tokens = [
            "\"ttl\"", ":", ",", "{", "}", "0", "9", "99999", "-", ".", "e", "null", "\"", " ",
        ];
        crate::jsonrpc::lex::random_edits(&seeds, &tokens, 0x2545_f491_4f6c_dd1d, 20_000, |t| {
            if let Some(view) = task_of_answer(t.as_bytes(), &id()) {
                agrees(t, &view);
            }
        });
    }

    /// The payload and creation readers take only what serde takes, with the same text: texts
    /// with random edits (as below), compared with `result_answering`.
    #[test]
    fn the_payload_and_creation_readers_agree_with_serde_after_random_edits() {
        use super::super::{result_answering, CreateResult};
        use serde_json::value::RawValue;
        let seeds = [
            r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"x\ny"}],"isError":false}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"task":{"taskId":"t1","status":"working","ttl":60000},"_meta":{"a":[1,-2.5e3,null]}}}"#,
        ];
        let tokens: Vec<&str> = crate::jsonrpc::lex::JSON_TOKENS
            .iter()
            .copied()
            .chain([
                "\"task\"",
                "\"result\"",
                "\"id\"",
                "\"jsonrpc\"",
                "\"error\"",
                "\"method\"",
            ])
            .collect();
        let (mut payloads, mut creations) = (0, 0);
        crate::jsonrpc::lex::random_edits(&seeds, &tokens, 0x5851_f42d_4c95_7f2d, 40_000, |t| {
            let b = t.as_bytes();
            if let Some(hand) = payload_of_answer(b, &id()) {
                payloads += 1;
                let serde = result_answering::<&RawValue>(b, &id()).map(RawValue::get);
                assert_eq!(Some(hand), serde, "{t}");
            }
            if let Some(hand) = creation_task_of_answer(b, &id()) {
                creations += 1;
                let serde = result_answering::<MapOnly<CreateResult<'_>>>(b, &id())
                    .map(|MapOnly(r)| r.task.map(RawValue::get));
                assert_eq!(Some(hand), serde, "{t}");
            }
        });
        assert!(
            payloads > 4_000 && creations > 2_000,
            "{payloads} {creations}"
        );
    }

    /// What `creation_record` reads of a `Task`, by hand as through a `Value`
    /// (`CreatedTask::of`): listed texts, then texts with random edits; what the reader takes,
    /// serde reads the same, and what it hands back includes what serde refuses.
    #[test]
    fn the_created_task_reader_agrees_with_serde() {
        use serde_json::Value;
        let by_serde = |raw: &str| {
            serde_json::from_str::<Value>(raw)
                .ok()
                .map(|v| CreatedTask::of(&v).map(|t| format!("{t:?}")))
        };
        let agrees = |raw: &str| -> bool {
            let Some(hand) = created_task(raw) else {
                return false;
            };
            assert_eq!(by_serde(raw), Some(Some(format!("{hand:?}"))), "{raw}");
            true
        };
        let read = [
            r#"{"taskId":"t-1","status":"working","createdAt":"2026-12-05T12:00:00.000Z","lastUpdatedAt":"2026-12-05T12:00:00.000Z","ttl":60000,"pollInterval":100}"#,
            r#" { "taskId" : "t" , "status" : 7 , "statusMessage" : null , "ttl" : null , "pollInterval" : "100" } "#,
            r#"{"taskId":"t","ttl":"60000","pollInterval":[1],"createdAt":{},"_meta":{"x":[1,-2.5,true,null,"a\nb"],"x":{}}}"#,
            r#"{"taskId":"t","ttl":0,"pollInterval":18446744073709551615,"statusMessage":"é"}"#,
            r#"{"taskId":"x","_meta":{"n":1234567890123456789}}"#,
        ];
        for raw in read {
            assert!(agrees(raw), "{raw}");
        }
        let handed_back = [
            r#"{"status":"working"}"#,
            // An empty taskId names no task (`recordable_task_id`): serde's to refuse.
            r#"{"taskId":"","_meta":{"n":1234567890123456789}}"#,
            r#"{"taskId":7}"#,
            r#"{"taskId":"a","taskId":"b"}"#,
            r#"{"taskId":"t","status":"working","status":"failed"}"#,
            r#"{"task\u0049d":"t"}"#,
            r#"{"taskId":"t\"1"}"#,
            r#"{"taskId":"t","ttl":1000.0}"#,
            r#"{"taskId":"t","ttl":1e3}"#,
            r#"{"taskId":"t","ttl":-5}"#,
            r#"{"taskId":"t","ttl":18446744073709551616}"#,
            r#"{"taskId":"t","pollInterval":-0}"#,
            r#"{"taskId":"t","_meta":{"x":1e400}}"#,
            r#"{"taskId":"t","_meta":{"x":12345678901234567890}}"#,
            r#"{"taskId":"t","_meta":"\ud800"}"#,
            r#"{"taskId":"t"} x"#,
            r#"["t"]"#,
        ];
        for raw in handed_back {
            assert!(created_task(raw).is_none(), "{raw}");
        }
        // serde refuses an `f64` out of range (the reason such numbers are handed back).
        assert_eq!(by_serde(r#"{"taskId":"t","x":1e400}"#), None);
        let seeds = [
            r#"{"taskId":"t-1","status":"working","statusMessage":"half way","createdAt":"2026-12-05T12:00:00.000Z","lastUpdatedAt":"2026-12-05T12:00:01.000Z","ttl":60000,"pollInterval":100}"#,
            r#"{"pollInterval":5000,"ttl":null,"taskId":"a/b","_meta":{"n":[1,-2.5,null,{"taskId":"x\/y"}]},"status":"completed"}"#,
        ];
        let tokens: Vec<&str> = crate::jsonrpc::lex::JSON_TOKENS
            .iter()
            .copied()
            .chain([
                "9999999999999999999",
                "e400",
                "\"taskId\"",
                "\"status\"",
                "\"statusMessage\"",
                "\"createdAt\"",
                "\"lastUpdatedAt\"",
                "\"ttl\"",
                "\"pollInterval\"",
            ])
            .collect();
        let mut taken = 0;
        crate::jsonrpc::lex::random_edits(&seeds, &tokens, 0x2f69_3a5b_c1d7_e4f3, 40_000, |t| {
            if agrees(t) {
                taken += 1;
            }
        });
        assert!(taken > 4_000, "the reader took too few texts ({taken})");
    }

    /// Whatever the reader takes, serde takes with the same view: texts with several random
    /// edits (a fixed seed: the run repeats), JSON tokens and the view's keys inserted, replaced
    /// and removed anywhere. `SCAN_ROUNDS=N` runs N texts instead of 40,000.
    #[test]
    fn the_reader_agrees_with_serde_after_random_edits() {
        let seeds = [
            r#"{"jsonrpc":"2.0","id":7,"result":{"createdAt":"2026-12-05T12:00:00.000Z","lastUpdatedAt":"2026-12-05T12:00:01.000Z","pollInterval":100,"status":"completed","taskId":"t-1","ttl":600000}}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"t1","status":"working","statusMessage":"a b","result":{"isError":false,"content":[{"type":"text","text":"x\ny"}]},"_meta":{"n":[1,-2.5e3,null]}}}"#,
        ];
        let tokens: Vec<&str> = crate::jsonrpc::lex::JSON_TOKENS
            .iter()
            .copied()
            .chain([
                "\"status\"",
                "\"pollInterval\"",
                "\"result\"",
                "\"isError\"",
                "\"id\"",
                "\"jsonrpc\"",
                "\"error\"",
                "\"statusMessage\"",
                "\"lastUpdatedAt\"",
            ])
            .collect();
        let mut read = 0;
        let rounds = std::env::var("SCAN_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40_000usize);
        let seed = 0x9e37_79b9_7f4a_7c15u64;
        crate::jsonrpc::lex::random_edits(&seeds, &tokens, seed, rounds, |text| {
            let hand = task_of_answer(text.as_bytes(), &id());
            if hand.is_some() {
                read += 1;
                let serde = TaskView::of_answer_by_serde(text.as_bytes(), &id());
                assert_eq!(seen(hand.as_ref()), seen(serde.as_ref()), "{text}");
            }
        });
        assert!(
            read > rounds / 10,
            "the reader took too few texts to compare ({read})"
        );
    }
}
