//! What `observe` applies from 2026-07-28 messages (tasks extension, SEP-2663):
//!
//! - replies to `tasks/get`: a flat `DetailedTask` with `resultType:"complete"` (`completed`
//!   with `isError: true` is still `completed`; `failed` carries `error`). Applied to the
//!   authorised task; a status contradicting a recorded terminal one is rewritten (byte-exact
//!   splice) to the recorded one, without the contradicting `result` / `error` when the recorded
//!   status is `cancelled`; never to a `completed` / `failed` lacking its payload
//!   ([`Watch::against_terminal`]). The first terminal answer's `result` member is kept in the record
//!   (`tasks.max_stored_result_bytes`), so later polls are answered by the `tasks` layer.
//! - replies to `tasks/cancel` and `tasks/update`: acks (`{"resultType":"complete"}`), nothing to
//!   apply (the status cancelled is first seen in a later `tasks/get` or notification).
//! - `notifications/tasks` on any stream (a `subscriptions/listen` stream included): a full
//!   `DetailedTask` naming its `taskId`, applied like a `tasks/get` answer; activity for the
//!   "resources released" fact.
//!
//! Both eras: a `CreateTaskResult`'s and a `tasks/get` answer's ttl are shown as the record
//! holds it when the upstream's is `null` or longer ([`show_recorded_ttl`]).

use super::{ReplyTo, Watch};
use crate::exchange::Caller;
use crate::jsonrpc::splice;
use crate::mcp::era::Era;
use crate::mcp::task::TaskStatus;
use crate::registry::as_registry_task;
use crate::registry::{Observed, OnRefusal, Registry, TaskFields};
use crate::store::TaskRecord;
use bytes::Bytes;
use serde_json::Value;
use std::borrow::Cow;

impl Watch {
    /// Applies the reply to a 2026-07-28 `tasks/get|cancel` about `task_id`.
    /// `parsed`: `bytes` as a `Value` when `on_message` already parsed it.
    pub(super) async fn on_modern_task_reply(
        &self,
        bytes: Bytes,
        parsed: Option<Value>,
        method: ReplyTo,
        task_id: &str,
        known: &TaskRecord,
    ) -> Bytes {
        if method != ReplyTo::Get {
            // Acks carry no status.
            return bytes;
        }
        // Read leniently (a deep tool output in `result.result`): the payload kept below is
        // taken from `bytes`.
        let Some(value) = parsed.or_else(|| super::lenient_value(&bytes)) else {
            return bytes;
        };
        let Some(result) = value.get("result").filter(|r| r.is_object()) else {
            return bytes;
        };
        if super::names_another(result, task_id) {
            let id = value.get("id").and_then(crate::jsonrpc::Id::from_value);
            return self.foreign_answer("tasks/get", task_id, id.as_ref());
        }
        let task = as_registry_task(result, self.registry.config().max_ttl_ms);
        // A poll repeating what the record holds needs no store trip (a terminal record never
        // changes); its result may still be the first one seen for the task (the status may
        // have come by notifications/tasks).
        // A terminal answer whose result the record does not hold yet keeps it with its status,
        // in one store update.
        let first_result = || {
            let terminal = TaskFields::of(&task)
                .status
                .and_then(TaskStatus::parse)
                .is_some_and(TaskStatus::is_terminal);
            (terminal && known.terminal_result.is_none())
                .then(|| splice::raw_at(&bytes, &["result"]).ok().flatten())
                .flatten()
        };
        let observed = if !Registry::would_change(known, &task) {
            Observed::Recorded(known.status)
        } else if let Some(raw) = first_result() {
            // Boxed, as the store's futures below: only a poll that reports a change awaits
            // one (see `apply_get`).
            let raw = raw.get().to_string();
            let observed = Box::pin(self.registry.observe_task_with_result(
                &self.upstream,
                task_id,
                task,
                raw,
                "tasks/get",
                OnRefusal::Keep,
            ))
            .await;
            // Kept with the status when it could be: nothing left for the match below.
            return match observed {
                Observed::Rewrite { .. } => self.rewritten(&observed, bytes, "result"),
                _ => bytes,
            };
        } else {
            Box::pin(
                self.registry
                    .observe_task_as(&self.upstream, task_id, task, "tasks/get"),
            )
            .await
        };
        match observed {
            Observed::Recorded(status)
                if status.is_terminal() && known.terminal_result.is_none() =>
            {
                // Served from the record from now on: on disk before the answer leaves, as
                // when it comes with the status (review 19b #1).
                if let Ok(Some(raw)) = splice::raw_at(&bytes, &["result"]) {
                    let raw = raw.get().to_string();
                    Box::pin(self.registry.keep_terminal_result(
                        &self.upstream,
                        task_id,
                        Some(status),
                        raw,
                    ))
                    .await;
                }
                bytes
            }
            Observed::Rewrite { status, .. } => {
                let reported = result
                    .get("status")
                    .and_then(Value::as_str)
                    .and_then(TaskStatus::parse);
                let shown =
                    self.against_terminal(&observed, status, reported, bytes, task_id, "result");
                Box::pin(shown).await
            }
            _ => bytes,
        }
    }

    /// A 2026-07-28 `tasks/get` answer (its `DetailedTask` at `member`, `"result"`) or
    /// `notifications/tasks` (at `"params"`) whose status (`reported`) contradicts the task's
    /// recorded terminal `status` (`observed`, an [`Observed::Rewrite`]), as the client is
    /// shown it. A `completed` or
    /// `failed` `DetailedTask` MUST carry its `result` / `error` (2026-07-28 §1.4), which
    /// splicing the recorded status into the upstream's answer cannot add (review 17 #7: a
    /// `working` answer became `completed` without `result`). So, for those two statuses:
    ///
    /// - the record now holds the task's payload (a terminal report kept it while this poll was
    ///   upstream): that payload, as the `tasks` layer answers a later poll (a notification
    ///   keeps its own `params._meta`, [`served`]);
    /// - it holds none (the terminal `notifications/tasks` had no `result`, or its
    ///   `DetailedTask` was over `tasks.max_stored_result_bytes`) and the upstream's answer is
    ///   live (an eventually consistent server behind its own notification): the upstream's
    ///   answer unchanged, a valid `DetailedTask` (not counted as a terminal rewrite). The
    ///   client polls on (it SHOULD poll until terminal) and gets the upstream's terminal
    ///   answer with its payload when it comes.
    ///
    /// Otherwise (`cancelled`, which carries nothing; or another terminal status upstream) the
    /// recorded status is shown ([`rewrite`]). Runs only for a contradicted terminal record.
    async fn against_terminal(
        &self,
        observed: &Observed,
        status: TaskStatus,
        reported: Option<TaskStatus>,
        bytes: Bytes,
        task_id: &str,
        member: &str,
    ) -> Bytes {
        if !matches!(status, TaskStatus::Completed | TaskStatus::Failed) {
            return self.rewritten(observed, bytes, member);
        }
        let held = self.registry.record_cached(&self.upstream, task_id).await;
        let stored = held
            .ok()
            .flatten()
            .filter(|r| r.status == status)
            .and_then(|r| r.terminal_result.clone());
        if let Some(shown) = stored.as_deref().and_then(|s| served(s, &bytes, member)) {
            if let Ok(Some(out)) = splice::replace(&bytes, &[member], &shown) {
                return self.shown_recorded(Some(out), bytes);
            }
        }
        if reported.is_some_and(|s| !s.is_terminal()) {
            return bytes;
        }
        self.rewritten(observed, bytes, member)
    }

    /// [`rewrite`], counted as a terminal rewrite when it changed the message
    /// ([`Watch::shown_recorded`]).
    fn rewritten(&self, observed: &Observed, bytes: Bytes, member: &str) -> Bytes {
        let out = rewrite(observed, &bytes, member);
        let changed = out.as_ptr() != bytes.as_ptr() || out.len() != bytes.len();
        self.shown_recorded(changed.then_some(out), bytes)
    }

    /// Applies a `notifications/tasks` (a `DetailedTask` in `params`).
    /// `None`: not passed on ([`Watch::shown_to`], only in a stream: `stream` is its caller).
    pub(super) async fn on_tasks_notification(
        &self,
        bytes: Bytes,
        value: Value,
        stream: Option<&Caller>,
    ) -> Option<Bytes> {
        let Some(params) = value.get("params").filter(|p| p.is_object()) else {
            return Some(bytes);
        };
        if let Some(caller) = stream {
            if !self.shown_to(caller, params).await {
                return None;
            }
        }
        if let Some(task_id) = params.get("taskId").and_then(Value::as_str) {
            if self.registry.releases().activity(&self.upstream, task_id) {
                self.registry
                    .metrics()
                    .task_activity_after_cancel(&self.upstream);
            }
        }
        let task = as_registry_task(params, self.registry.config().max_ttl_ms);
        let task_id = params.get("taskId").and_then(Value::as_str);
        let observed = match task_id.zip(terminal_payload(params)) {
            // A terminal report keeps its payload with its status, as a terminal `tasks/get`
            // answer does: a later `tasks/get` is answered from the record (hostile tester F6:
            // an upstream still answering `working` was shown `completed` without `result`).
            Some((task_id, payload)) => {
                self.registry
                    .observe_task_with_result(
                        &self.upstream,
                        task_id,
                        task,
                        payload,
                        "notifications/tasks",
                        OnRefusal::Keep,
                    )
                    .await
            }
            None => {
                self.registry
                    .observe_task(&self.upstream, task, "notifications/tasks")
                    .await
            }
        };
        match (&observed, task_id) {
            (Observed::Rewrite { status, .. }, Some(task_id)) => {
                let reported = params
                    .get("status")
                    .and_then(Value::as_str)
                    .and_then(TaskStatus::parse);
                let shown =
                    self.against_terminal(&observed, *status, reported, bytes, task_id, "params");
                Some(Box::pin(shown).await)
            }
            _ => Some(self.rewritten(&observed, bytes, "params")),
        }
    }
}

/// The `tasks/get` result a terminal `notifications/tasks` stands for (its `params`, a
/// `DetailedTask`, without the notification's `_meta`, with `resultType: "complete"`), as JSON
/// text; `None` for a live status, and for a `completed` without `result` or a `failed`
/// without `error` (2026-07-28 tasks: each MUST carry it; such a report is applied, not kept).
fn terminal_payload(params: &Value) -> Option<String> {
    let status = params
        .get("status")
        .and_then(Value::as_str)
        .and_then(TaskStatus::parse)?;
    let needs = match status {
        TaskStatus::Completed => Some("result"),
        TaskStatus::Failed => Some("error"),
        TaskStatus::Cancelled => None,
        TaskStatus::Working | TaskStatus::InputRequired => return None,
    };
    if needs.is_some_and(|member| params.get(member).is_none()) {
        return None;
    }
    let mut task = params.as_object()?.clone();
    task.remove("_meta");
    task.entry("resultType")
        .or_insert_with(|| Value::String("complete".into()));
    serde_json::to_string(&task).ok()
}

/// The stored `tasks/get` result `stored` as the `DetailedTask` at `member` of `bytes`, the
/// message [`Watch::against_terminal`] answers from the record. A `tasks/get` answer (`"result"`)
/// is the stored result as it is, as the `tasks` layer serves later polls. A
/// `notifications/tasks` (`"params"`) keeps its own `params._meta` in place of any the stored
/// result has: 2026-07-28 §2.3, every notification on a `subscriptions/listen` stream carries
/// `_meta["io.modelcontextprotocol/subscriptionId"]`, which its client demultiplexes listens by,
/// and a `related-task` or vendor key is the notification's too (review 18b #2: the whole
/// `params` was replaced, `_meta` lost). `None` when either is not the JSON it should be.
/// Runs only when a contradicted terminal record's payload is served.
fn served<'a>(stored: &'a str, bytes: &[u8], member: &str) -> Option<Cow<'a, str>> {
    if member != "params" {
        return Some(Cow::Borrowed(stored));
    }
    let own = splice::raw_at(bytes, &["params", "_meta"]).ok()?;
    let without = match splice::remove(stored.as_bytes(), &["_meta"]).ok()? {
        Some(without) => Cow::Owned(String::from_utf8(without.into()).ok()?),
        None => Cow::Borrowed(stored),
    };
    let Some(own) = own else {
        return Some(without);
    };
    // `_meta` put first, every other byte of the stored result as it was.
    let members = without.trim_start().strip_prefix('{')?;
    let comma = if members.trim_start().starts_with('}') {
        ""
    } else {
        ","
    };
    Some(Cow::Owned(format!(
        "{{\"_meta\":{}{comma}{members}",
        own.get()
    )))
}

/// `bytes` with the `DetailedTask` at `member` showing the recorded terminal status; a
/// contradicting `result` / `error` is removed when that status is `cancelled` (a
/// `CancelledTask` carries neither). Unchanged when there is nothing to rewrite.
pub(crate) fn rewrite(observed: &Observed, bytes: &Bytes, member: &str) -> Bytes {
    let Some(mut out) = observed.rewrite_bytes(bytes, &[member]) else {
        return bytes.clone();
    };
    if matches!(
        observed,
        Observed::Rewrite {
            status: TaskStatus::Cancelled,
            ..
        }
    ) {
        for payload in ["result", "error"] {
            if let Ok(Some(without)) = splice::remove(&out, &[member, payload]) {
                out = without;
            }
        }
    }
    out
}

/// Where a reply's `result` holds the task's ttl in `era`: a 2025-11-25 `CreateTaskResult`'s
/// `task.ttl` (`creation`) or `Task`'s `ttl`; a 2026-07-28 (flat) task's `ttlMs`.
pub(super) fn ttl_path(era: Era, creation: bool) -> &'static [&'static str] {
    match (era, creation) {
        (Era::Legacy, true) => &["task", "ttl"],
        (Era::Legacy, false) => &["ttl"],
        (Era::Modern, _) => &["ttlMs"],
    }
}

/// `bytes` (a JSON-RPC response) with the ttl at `result` / `at` no longer than the ttl `record`
/// holds: the upstream's, capped at `tasks.max_ttl_ms`, and the cap when the upstream gave `null`
/// (unlimited) or none (see `Registry::creation_record`). taskgate removes the record when that
/// ttl is over, so a `null`, a longer or a missing ttl is shown as the recorded one, in the
/// `CreateTaskResult` and every `tasks/get` answer, as `tasks/list` shows it (a missing one is
/// added to the task object, which must have it in both eras). Unchanged when the upstream's ttl
/// is a number no longer than that (a shorter one is the upstream's to keep), when `result` at
/// the path is not a task (no `taskId`), or for a record that holds no ttl (written before
/// taskgate recorded the cap).
pub(crate) fn show_recorded_ttl(bytes: Bytes, at: &[&str], record: &TaskRecord) -> Bytes {
    let Some(ttl) = record.ttl_ms else {
        return bytes;
    };
    let Some(name) = at.last() else {
        return bytes;
    };
    let path: Vec<&str> = std::iter::once("result")
        .chain(at.iter().copied())
        .collect();
    match members_named(&bytes, name, ttl) {
        Members::NoneLonger => return bytes,
        // Both eras' task has the member (`null` when unlimited); an upstream that leaves it
        // out is told nothing of when taskgate removes the record: shown as the record's.
        Members::None => return with_ttl_member(bytes, &path, ttl),
        Members::Other => {}
    }
    let longer = match splice::raw_at(&bytes, &path) {
        // A float no longer than the record's (`1000.0`, `1e3`) is the upstream's to keep too.
        Ok(Some(raw)) => raw
            .get()
            .parse::<f64>()
            .map_or(true, |t| t.is_nan() || t < 0.0 || t > ttl as f64),
        _ => false,
    };
    if !longer {
        return bytes;
    }
    match splice::replace(&bytes, &path, &ttl.to_string()) {
        Ok(Some(out)) => out,
        _ => bytes,
    }
}

/// Whether every member named `name` anywhere in `bytes` has a number no greater than `ttl` as
/// its value ([`Members::NoneLonger`]), or there is none ([`Members::None`]): then the ttl at
/// any path is no longer than `ttl`, and [`show_recorded_ttl`] leaves the reply as it is
/// without parsing it (or, for none, adds the member). Why: the exact path walk
/// (`splice::raw_at`) on every `tasks/get` answer cost about 8,000 instructions per request of
/// the lifecycle benchmark (137,035 → 145,322, `benches/RESULTS.md`), and a ttl is almost always
/// a number the record already holds. False (take the exact path) for anything else: a `null`, a
/// longer number, a `"ttl"` that is not followed by `:` and a number.
///
/// Sound for any JSON: the byte sequence `"name"` followed by `:` is a member name (inside a
/// string a `"` is escaped, so it could only be the tail of a longer name such as `"a\"ttl"`,
/// which is checked like the rest, never skipped).
fn members_named(bytes: &[u8], name: &str, ttl: u64) -> Members {
    let mut seen = Members::None;
    // The name between quotes, found without building the quoted needle (this runs per poll).
    for at in memchr::memmem::find_iter(bytes, name.as_bytes()) {
        let end = at + name.len();
        if at == 0 || bytes[at - 1] != b'"' || bytes.get(end) != Some(&b'"') {
            continue;
        }
        let rest = &bytes[end + 1..];
        let rest = rest.trim_ascii_start();
        let Some(rest) = rest.strip_prefix(b":") else {
            continue; // a string value "ttl", not a member name
        };
        let rest = rest.trim_ascii_start();
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let after = rest.get(digits).copied();
        let plain = digits > 0 && digits <= 19 && !matches!(after, Some(b'.' | b'e' | b'E'));
        let value = std::str::from_utf8(&rest[..digits])
            .ok()
            .and_then(|d| d.parse::<u64>().ok());
        match value {
            Some(v) if plain && v <= ttl => seen = Members::NoneLonger,
            _ => return Members::Other,
        }
    }
    seen
}

/// What [`members_named`] found of the members named `name` anywhere in a reply.
#[derive(Debug, PartialEq)]
enum Members {
    /// None at all.
    None,
    /// Each a plain number no greater than the record's ttl.
    NoneLonger,
    /// Another value somewhere (`null`, a longer number, a float): the exact path decides.
    Other,
}

/// `bytes` with `"<name>":ttl` added to the task object at `path`'s parent (the last element
/// of `path` is the member's name), when there is such an object and it is a task (it has a
/// `taskId`); else unchanged. Every other byte stays as it was (`splice::insert_first`).
fn with_ttl_member(bytes: Bytes, path: &[&str], ttl: u64) -> Bytes {
    let Some((name, parent)) = path.split_last() else {
        return bytes;
    };
    let out = match splice::raw_at(&bytes, parent) {
        Ok(Some(task)) if task.get().starts_with('{') => {
            let is_task = matches!(
                splice::raw_at(task.get().as_bytes(), &["taskId"]),
                Ok(Some(_))
            );
            is_task
                .then(|| splice::insert_first(&bytes, task.get(), &format!("\"{name}\":{ttl}")))
                .flatten()
        }
        _ => None,
    };
    out.unwrap_or(bytes)
}

#[cfg(test)]
mod tests {
    use crate::exchange::{GatewayError, McpReply, McpRequest};
    use crate::layers::extensions::PendingCreation;
    use crate::layers::observe::ObserveLayer;
    use crate::layers::testing::{owner, record, registry, request};
    use crate::mcp::era::Era;
    use crate::mcp::task::TaskStatus;
    use crate::store::TaskRecord;
    use bytes::Bytes;
    use std::sync::Arc;
    use tower::{Layer, ServiceExt};

    fn call(registry: &Arc<crate::registry::Registry>) -> McpRequest {
        let mut req =
            request(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}"#);
        req.extensions.insert(Era::Modern);
        req.extensions.insert(PendingCreation {
            template: Arc::new(TaskRecord {
                task_id: String::new(),
                era: Era::Modern,
                ..record("")
            }),
            reservation: Arc::new(registry.reserve_modern(&"up".into(), &owner())),
            progress_token: None,
            created: Arc::default(),
        });
        req
    }

    /// A `ttl` of `null` (unlimited), above `tasks.max_ttl_ms` or missing is shown as the
    /// recorded cap (the record ends there); a shorter one, or one of a record without a ttl,
    /// stays.
    #[test]
    fn the_recorded_ttl_is_shown() {
        let capped = TaskRecord {
            ttl_ms: Some(1000),
            ..record("t")
        };
        let show = |body: &str, at: &[&str], r: &TaskRecord| {
            let out = super::show_recorded_ttl(Bytes::from(body.to_string()), at, r);
            String::from_utf8(out.to_vec()).unwrap()
        };
        let flat = r#"{"id":1,"result":{"taskId":"t","ttlMs":null,"z":1}}"#;
        assert_eq!(
            show(flat, &["ttlMs"], &capped),
            r#"{"id":1,"result":{"taskId":"t","ttlMs":1000,"z":1}}"#
        );
        let nested = r#"{"id":1,"result":{"task":{"ttl":5000}}}"#;
        assert_eq!(
            show(nested, &["task", "ttl"], &capped),
            r#"{"id":1,"result":{"task":{"ttl":1000}}}"#
        );
        for kept in [
            r#"{"id":1,"result":{"ttl":500}}"#,
            r#"{"id":1,"result":{"ttl":1000}}"#,
            // Not a task: nothing added.
            r#"{"id":1,"result":{}}"#,
            r#"{"id":1,"result":{"task":{}}}"#,
            r#"{"id":1,"error":{"code":-32602,"message":"no ttl"}}"#,
        ] {
            assert_eq!(show(kept, &["ttl"], &capped), kept);
            assert_eq!(show(kept, &["task", "ttl"], &capped), kept);
        }
        // A task without its ttl (both eras' task has the member) is told the record's.
        for (body, at, shown) in [
            (
                r#"{"id":1,"result":{"taskId":"t","status":"working"}}"#,
                &["ttl"][..],
                r#"{"id":1,"result":{"ttl":1000,"taskId":"t","status":"working"}}"#,
            ),
            (
                r#"{"id":1,"result":{"task":{ "taskId":"t"}}}"#,
                &["task", "ttl"][..],
                r#"{"id":1,"result":{"task":{"ttl":1000, "taskId":"t"}}}"#,
            ),
            (
                r#"{"id":1,"result":{"resultType":"task","taskId":"t"}}"#,
                &["ttlMs"][..],
                r#"{"id":1,"result":{"ttlMs":1000,"resultType":"task","taskId":"t"}}"#,
            ),
        ] {
            assert_eq!(show(body, at, &capped), shown);
        }
        let old = TaskRecord {
            ttl_ms: None,
            ..record("t")
        };
        let unlimited = r#"{"id":1,"result":{"ttl":null}}"#;
        assert_eq!(show(unlimited, &["ttl"], &old), unlimited);
    }

    /// A 2025-11-25 `CreateTaskResult` with `ttl: null` (the same-era path): the record holds the
    /// cap and the client is told it.
    #[tokio::test]
    async fn a_null_ttl_is_recorded_and_shown_as_the_cap() {
        let (registry, _store) = registry();
        let cap = registry.config().max_ttl_ms;
        let created = r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"taskId":"l1","status":"working","createdAt":"2026-08-01T00:00:00Z","lastUpdatedAt":"2026-08-01T00:00:00Z","ttl":null}}}"#;
        let stack = ObserveLayer::new(registry.clone()).layer(tower::service_fn(
            move |_r: McpRequest| async move {
                Ok::<_, GatewayError>(McpReply::local_json(Bytes::from_static(created.as_bytes())))
            },
        ));
        let mut req = call(&registry);
        req.extensions.insert(Era::Legacy);
        if let Some(p) = req.extensions.get_mut::<PendingCreation>() {
            p.template = Arc::new(TaskRecord {
                task_id: String::new(),
                ..record("")
            });
        }
        let reply = stack.oneshot(req).await.unwrap();
        let shown = crate::layers::testing::json_of(&reply);
        assert_eq!(shown["result"]["task"]["ttl"], cap, "{shown}");
        let r = registry.store().get("up", "l1").unwrap().expect("recorded");
        assert_eq!(r.ttl_ms, Some(cap));
        assert_eq!(r.to_task().ttl, Some(cap), "tasks/list shows the same");
    }

    /// A ttl written as a float (`1000.0`, `1e3`) is recorded as that many ms (rounded up), not
    /// as "no ttl" (which would be the cap, longer than the upstream keeps the task).
    #[test]
    fn a_float_ttl_is_recorded_as_its_ms() {
        let (registry, _store) = registry();
        let cap = registry.config().max_ttl_ms;
        let template = record("");
        for (ttl, recorded) in [
            (serde_json::json!(1000.0), 1000),
            (serde_json::json!(1e3), 1000),
            (serde_json::json!(999.2), 1000),
            (serde_json::json!(-5), cap),
            (serde_json::json!(1e300), cap),
        ] {
            let task = serde_json::json!({"taskId": "f", "status": "working", "ttl": ttl});
            let r = registry
                .creation_record(&template, &task)
                .expect("a record");
            assert_eq!(r.ttl_ms, Some(recorded), "{ttl}");
        }
    }

    /// A flat `CreateTaskResult` is recorded (ttlMs null capped) before the reply passes; a plain
    /// result records nothing and gives the slot back.
    #[tokio::test]
    async fn flat_create_task_result_is_recorded() {
        let (registry, _store) = registry();
        let answer = |body: &'static str| {
            ObserveLayer::new(registry.clone()).layer(tower::service_fn(
                move |_r: McpRequest| async move {
                    Ok::<_, GatewayError>(McpReply::local_json(Bytes::from_static(body.as_bytes())))
                },
            ))
        };
        let created = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"m1","status":"working","createdAt":"2026-08-01T00:00:00Z","lastUpdatedAt":"2026-08-01T00:00:00Z","ttlMs":null,"pollIntervalMs":500}}"#;
        let reply = answer(created).oneshot(call(&registry)).await.unwrap();
        let shown = crate::layers::testing::json_of(&reply);
        assert_eq!(
            shown["result"]["ttlMs"],
            registry.config().max_ttl_ms,
            "the client is told the cap: {shown}"
        );
        let r = registry.store().get("up", "m1").unwrap().expect("recorded");
        assert_eq!((r.era, r.status), (Era::Modern, TaskStatus::Working));
        assert_eq!(r.ttl_ms, Some(registry.config().max_ttl_ms));
        assert_eq!(r.poll_interval_ms, Some(500));
        assert_eq!(registry.owners_count("up", &owner()), 1);
        let plain = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","content":[]}}"#;
        answer(plain).oneshot(call(&registry)).await.unwrap();
        assert_eq!(
            registry.owners_count("up", &owner()),
            1,
            "the plain call's slot is back"
        );
    }

    #[test]
    fn a_ttl_no_longer_than_the_record_is_decided_without_parsing() {
        use super::{members_named, Members};
        let cap = 60_000;
        for (json, fast) in [
            (
                r#"{"result":{"ttl":60000,"status":"working"}}"#,
                Members::NoneLonger,
            ),
            (
                r#"{"result":{"ttl" : 5,"status":"working"}}"#,
                Members::NoneLonger,
            ),
            (r#"{"result":{"status":"working"}}"#, Members::None),
            (r#"{"result":{"statusMessage":"ttl"}}"#, Members::None),
            (
                r#"{"result":{"statusMessage":"ttl","ttl":1}}"#,
                Members::NoneLonger,
            ),
            (r#"{"result":{"ttl":null}}"#, Members::Other),
            (r#"{"result":{"ttl":60001}}"#, Members::Other),
            (r#"{"result":{"ttl":1e3}}"#, Members::Other),
            (r#"{"result":{"ttl":1.5}}"#, Members::Other),
            (r#"{"result":{"ttl":"5"}}"#, Members::Other),
            (r#"{"result":{"ttl":-1}}"#, Members::Other),
            (
                r#"{"result":{"a\"ttl":1,"ttl":99999999999999999999999}}"#,
                Members::Other,
            ),
        ] {
            assert_eq!(members_named(json.as_bytes(), "ttl", cap), fast, "{json}");
        }
        // Every case the fast path passes, the exact path leaves alone too.
        let record = TaskRecord {
            ttl_ms: Some(cap),
            ..record("t")
        };
        for json in [
            r#"{"jsonrpc":"2.0","id":1,"result":{"ttl":60000,"status":"working"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"statusMessage":"ttl","ttl":1}}"#,
        ] {
            let out = super::show_recorded_ttl(Bytes::from(json), &["ttl"], &record);
            assert_eq!(out, json.as_bytes());
        }
        let out = super::show_recorded_ttl(
            Bytes::from(r#"{"jsonrpc":"2.0","id":1,"result":{"ttl":null}}"#),
            &["ttl"],
            &record,
        );
        assert_eq!(
            out,
            r#"{"jsonrpc":"2.0","id":1,"result":{"ttl":60000}}"#.as_bytes()
        );
        // A shorter ttl written as a float stays the upstream's; a longer one is capped.
        for (json, shown) in [
            (
                r#"{"result":{"ttl":1000.0}}"#,
                r#"{"result":{"ttl":1000.0}}"#,
            ),
            (r#"{"result":{"ttl":1e3}}"#, r#"{"result":{"ttl":1e3}}"#),
            (r#"{"result":{"ttl":6.1e4}}"#, r#"{"result":{"ttl":60000}}"#),
            (r#"{"result":{"ttl":-5}}"#, r#"{"result":{"ttl":60000}}"#),
        ] {
            let out = super::show_recorded_ttl(Bytes::from(json), &["ttl"], &record);
            assert_eq!(out, shown.as_bytes(), "{json}");
        }
    }
}
