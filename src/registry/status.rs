//! The status machine: what the upstream reports about a task, applied to its record following
//! the spec's transitions (2025-11-25 basic/utilities/tasks: a terminal status never changes),
//! and [`Observed`], what a report did (a message contradicting a recorded terminal status is
//! rewritten to show it).

use super::Registry;
use crate::jsonrpc::splice;
use crate::mcp::task::{format_rfc3339_ms, now_ms, parse_rfc3339_ms, valid_time, TaskStatus};
use crate::metrics::ReleaseReason;
use crate::store::TaskRecord;
use bytes::Bytes;
use serde_json::Value;

/// What a status report did to the record.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    /// The task is not in the registry.
    Unknown,
    /// The record now holds this status (possibly unchanged).
    Recorded(TaskStatus),
    /// The record is terminal with another status; the message must show `status`.
    Rewrite {
        /// The recorded terminal status.
        status: TaskStatus,
        /// The recorded `statusMessage`.
        status_message: Option<String>,
    },
}

impl Observed {
    /// For [`Observed::Rewrite`]: sets `status` (and `statusMessage`) of a Task object to the
    /// recorded ones. Returns whether anything was rewritten.
    pub fn rewrite(&self, task: &mut Value) -> bool {
        let Observed::Rewrite {
            status,
            status_message,
        } = self
        else {
            return false;
        };
        let Some(task) = task.as_object_mut() else {
            return false;
        };
        task.insert("status".into(), Value::String(status.as_str().to_string()));
        match status_message {
            Some(m) => task.insert("statusMessage".into(), Value::String(m.clone())),
            None => task.remove("statusMessage"),
        };
        true
    }

    /// For [`Observed::Rewrite`]: `json` with the Task object at `path` showing the recorded
    /// `status` and `statusMessage`, spliced into the original bytes (at most two splices: every
    /// other byte stays as it arrived). Falls back to a full rewrite (keys sorted, big numbers
    /// lossy) only when a splice is not possible (an escaped `statusMessage` key to remove, or no
    /// `status` member). `None`: nothing to rewrite, or `json` cannot be read.
    pub fn rewrite_bytes(&self, json: &[u8], path: &[&str]) -> Option<Bytes> {
        let Observed::Rewrite {
            status,
            status_message,
        } = self
        else {
            return None;
        };
        let task = splice::raw_at(json, path).ok()??;
        if !task.get().starts_with('{') {
            return None;
        }
        self.splice_rewrite(json, path, *status, status_message.as_deref())
            .or_else(|| self.full_rewrite(json, path))
    }

    fn splice_rewrite(
        &self,
        json: &[u8],
        path: &[&str],
        status: TaskStatus,
        status_message: Option<&str>,
    ) -> Option<Bytes> {
        let at = |key: &'static str| path.iter().copied().chain([key]).collect::<Vec<_>>();
        let (status_path, message_path) = (at("status"), at("statusMessage"));
        let status_text = serde_json::to_string(status.as_str()).ok()?;
        let has_message = splice::raw_at(json, &message_path).ok()?.is_some();
        match (status_message, has_message) {
            (Some(m), true) => {
                let with_status = splice::replace(json, &status_path, &status_text).ok()??;
                let m = serde_json::to_string(m).ok()?;
                splice::replace(&with_status, &message_path, &m).ok()?
            }
            // No `statusMessage` yet: it goes right after `status`, in the same splice.
            (Some(m), false) => {
                let m = serde_json::to_string(m).ok()?;
                let text = format!("{status_text},\"statusMessage\":{m}");
                splice::replace(json, &status_path, &text).ok()?
            }
            (None, true) => {
                let with_status = splice::replace(json, &status_path, &status_text).ok()??;
                splice::remove(&with_status, &message_path).ok()?
            }
            (None, false) => splice::replace(json, &status_path, &status_text).ok()?,
        }
    }

    fn full_rewrite(&self, json: &[u8], path: &[&str]) -> Option<Bytes> {
        let mut value = serde_json::from_slice::<Value>(json).ok()?;
        let pointer: String = path
            .iter()
            .map(|k| format!("/{}", k.replace('~', "~0").replace('/', "~1")))
            .collect();
        if !self.rewrite(value.pointer_mut(&pointer)?) {
            return None;
        }
        serde_json::to_vec(&value).ok().map(Bytes::from)
    }
}

/// One status report about a task, as `Registry::apply_status` applies it (a terminal one a
/// shared store refused is kept and applied again: [`super::refused`]).
#[derive(Debug, Clone)]
pub(super) struct Report {
    pub(super) status: TaskStatus,
    pub(super) message: Option<String>,
    pub(super) updated_at: Option<String>,
    pub(super) poll_interval_ms: Option<u64>,
    /// The report is a 2026 `completed` whose `result.isError` is `true`.
    pub(super) tool_error: bool,
    /// A terminal 2026-07-28 `tasks/get` answer's whole `result` (JSON text, at most
    /// `tasks.max_stored_result_bytes`), kept in the record by the same update that records the
    /// terminal status (see [`Registry::store_terminal_result`] for when it is kept).
    pub(super) result: Option<String>,
    /// A JSON-RPC `error` object (JSON text) taskgate itself ends the task with (its process
    /// died, its upstream lost it: `registry::gone`): kept in `terminal_error` by the same
    /// update, only when this report is what makes the task `failed`. It marks the record as
    /// ended by taskgate, which then answers the task's requests from it.
    pub(super) error: Option<String>,
}

/// A 2026-07-28 `Task` / `DetailedTask` object seen with the field names the status machine
/// reads (2025-11-25 `ttl`, `pollInterval`): a copy of `task` with `ttlMs` as `ttl` (`null`,
/// unlimited, as `cap`: the record's ttl is capped by `tasks.max_ttl_ms`) and `pollIntervalMs`
/// as `pollInterval`. Other members are kept.
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

/// Whether `reported`, the `lastUpdatedAt` of a report repeating a terminal record's status,
/// is earlier than the record's `held` one: then the record takes it. Why: a task's end can be
/// recorded before its upstream's time of it is seen, with taskgate's time (a 2026 `tasks/cancel`
/// ack, which carries none; a 2025 `tasks/result` payload), and the upstream's `tasks/get`
/// then shows the upstream's (earlier) time, `tasks/list` the record's. A later time is not
/// taken: a terminal task's time does not move (an upstream that stamps each answer with the
/// time of the answer would otherwise cost a store write per poll). Both must parse (RFC 3339).
fn ended_earlier(reported: &str, held: &str) -> bool {
    reported != held
        && match (parse_rfc3339_ms(reported), parse_rfc3339_ms(held)) {
            (Some(r), Some(h)) => r < h,
            _ => false,
        }
}

/// Whether a status report (a 2026 `DetailedTask`) is a tool error: `completed` with
/// `result.isError: true` (SEP-2663: `completed` includes results with `isError`).
fn is_tool_error(task: &Value) -> bool {
    task.get("status").and_then(Value::as_str) == Some("completed")
        && task.pointer("/result/isError").and_then(Value::as_bool) == Some(true)
}

impl Report {
    /// The report of a `Task` read into [`TaskFields`], as `observe_task_as_now` reads it from a
    /// `Value`: `None` without a known `status` string; a field of another type than expected
    /// counts as absent.
    pub(super) fn of_fields(task: &TaskFields<'_>) -> Option<Report> {
        Some(Report {
            status: task.status.and_then(TaskStatus::parse)?,
            message: task.status_message.flatten().map(str::to_string),
            updated_at: valid_time(task.last_updated_at.flatten()).map(str::to_string),
            poll_interval_ms: task.poll_interval.flatten(),
            tool_error: task.tool_error,
            result: None,
            error: None,
        })
    }
}

/// What applying a report did, and whether it made the record terminal just now: then the
/// caller waits for [`crate::store::TaskStore::sync`] before the message that told it leaves
/// taskgate (a terminal status a client was told about survives a crash, like a creation).
pub(super) type Applied = (Observed, bool);

/// Who writes a terminal status report again when a shared store (PostgreSQL) refused it
/// (an outage): the registry ([`super::refused`]), or the caller, which retries the write
/// itself (a gateway task's final write, `layers::gateway_tasks`: it holds the task's only
/// outcome, its call lease, and its own bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRefusal {
    /// The registry keeps the report and applies it again until the store takes it.
    Keep,
    /// The caller writes it again; the registry only counts and logs the refusal.
    CallerRetries,
}

/// One application of a report to the store ([`Registry::apply_report`]).
pub(super) enum Write {
    /// The store took the update (or there was nothing to change): what it did.
    Applied(Applied),
    /// The store holds no such record.
    Unknown,
    /// The store refused the update (counted and logged): the report, given back, and whether
    /// the store was closing (a graceful stop: nothing to try again).
    Refused { report: Report, closed: bool },
}

impl Registry {
    /// A provisional live-task slot for a 2026-07-28 `tools/call` (the server decides whether it
    /// becomes a task, so the slot is taken even at `tasks.max_live_tasks_per_owner`; a live
    /// task the server makes of the call is held to the limit by
    /// [`Registry::admit_creation`] before it is recorded).
    pub fn reserve_modern(
        &self,
        upstream: &std::sync::Arc<str>,
        owner: &crate::store::Owner,
    ) -> super::Reservation {
        self.owners.reserve_provisional(upstream, owner)
    }

    /// Keeps `result_json` (the `result` of a terminal 2026 `tasks/get` answer, or of a 2025
    /// `tasks/result` answer, as it passed through) in the task's record, once: when the record
    /// holds no result yet, its status is `status` (any terminal status for `None`) and
    /// `result_json` is at most `tasks.max_stored_result_bytes` (0 turns this off). Returns
    /// whether it was stored. Store work runs where `Registry::point` says.
    pub async fn store_terminal_result(
        self: &std::sync::Arc<Self>,
        upstream: &str,
        task_id: &str,
        status: Option<TaskStatus>,
        result_json: String,
    ) -> bool {
        if status.is_some_and(|s| !s.is_terminal()) {
            return false;
        }
        self.store_terminal(upstream, task_id, result_json, move |r, json| {
            let wanted = status.map_or(r.status.is_terminal(), |s| r.status == s);
            if !wanted || r.terminal_result.is_some() {
                return false;
            }
            r.terminal_result = Some(json.to_string());
            true
        })
        .await
    }

    /// Keeps `error_json` (the JSON-RPC `error` object a 2025-11-25 gateway task `failed` with,
    /// or the one taskgate failed a bridged task with: see `TaskRecord::terminal_error`) in the
    /// task's record, once: when the record is `failed`, holds no error yet, and
    /// `error_json` is at most `tasks.max_stored_result_bytes` (0 turns this off). Returns
    /// whether it was stored. Store work runs where `Registry::point` says.
    pub async fn store_terminal_error(
        self: &std::sync::Arc<Self>,
        upstream: &str,
        task_id: &str,
        error_json: String,
    ) -> bool {
        self.store_terminal(upstream, task_id, error_json, |r, json| {
            if r.status != TaskStatus::Failed || r.terminal_error.is_some() {
                return false;
            }
            r.terminal_error = Some(json.to_string());
            true
        })
        .await
    }

    /// Edits the input requests stored in a bridged task's record (`TaskRecord::input_requests`,
    /// issue 33) with `edit`, which says whether it changed them (it may run more than once, on
    /// the latest record each time: it copies, never takes); where `Registry::point` says. Returns the
    /// field as it was before and after the edit that stood, durable when it changed (the
    /// store's sync awaited; a failed sync is counted and logged); `None` when the record is
    /// unknown or the store failed (counted and logged).
    pub async fn edit_input_requests(
        self: &std::sync::Arc<Self>,
        upstream: &str,
        task_id: &str,
        mut edit: impl FnMut(&mut Option<String>) -> bool + Send + 'static,
    ) -> Option<(Option<String>, Option<String>)> {
        let edited = self
            .point_about(upstream, task_id, move |this, up, id| {
                match this.update(up, id, &mut |r| edit(&mut r.input_requests)) {
                    Ok(Some((before, after))) => {
                        Some((before.input_requests.clone(), after.input_requests.clone()))
                    }
                    Ok(None) => None,
                    Err(e) => {
                        this.write_failed(&e, "task store update of input requests failed");
                        None
                    }
                }
            })
            .await
            .flatten()?;
        if edited.0 != edited.1 {
            // Durable before a request is shown (a `kill -9` right after must not lose it).
            if let Err(e) = self.store.sync().await {
                self.write_failed(&e, "task store sync of input requests failed");
            }
        }
        Some(edited)
    }

    /// Whether a terminal result of `json.len()` bytes is kept in its record:
    /// `tasks.max_stored_result_bytes` is not 0 (off) and the result fits in it.
    pub(super) fn keeps_result(&self, json: &str) -> bool {
        let max = self.config.max_stored_result_bytes;
        max > 0 && json.len() as u64 <= max
    }

    /// Writes `json` into the record of `(upstream, task_id)` with `put` (which says whether it
    /// changed the record, and may run more than once, on the latest record each time: it
    /// copies, never takes),
    /// when `json` is at most `tasks.max_stored_result_bytes` (0 turns storing off); where
    /// `Registry::point` says. Returns whether the record changed.
    async fn store_terminal(
        self: &std::sync::Arc<Self>,
        upstream: &str,
        task_id: &str,
        json: String,
        put: impl Fn(&mut crate::store::TaskRecord, &str) -> bool + Send + 'static,
    ) -> bool {
        if !self.keeps_result(&json) {
            return false;
        }
        self.point_about(upstream, task_id, move |this, up, id| {
            match this.update(up, id, &mut |r| put(r, &json)) {
                Ok(Some((before, after))) if before != after => {
                    this.store.sync_soon();
                    true
                }
                Ok(_) => false,
                Err(e) => {
                    this.write_failed(&e, "task store update failed");
                    false
                }
            }
        })
        .await
        .unwrap_or(false)
    }

    /// Applies a status report (a `Task` object: `tasks/get` / `tasks/cancel` result,
    /// `notifications/tasks/status` params) to the record of `(upstream, taskId)`.
    pub(super) fn observe_task_now(
        &self,
        upstream: &str,
        task: &Value,
        source: &'static str,
    ) -> Applied {
        let Some(task_id) = task.get("taskId").and_then(Value::as_str) else {
            return (Observed::Unknown, false);
        };
        self.observe_task_as_now(upstream, task_id, task, source)
    }

    /// Applies a status report about `task_id` (a reply to a request about that task: its own
    /// `taskId`, if any, is not trusted to name another task).
    pub(super) fn observe_task_as_now(
        &self,
        upstream: &str,
        task_id: &str,
        task: &Value,
        source: &'static str,
    ) -> Applied {
        self.observe_task_with_result_now(
            upstream,
            task_id,
            task,
            source,
            None,
            None,
            OnRefusal::Keep,
        )
    }

    /// [`Registry::observe_task_as_now`] that also keeps `result` (a terminal 2026-07-28
    /// `tasks/get` answer's `result`, a gateway task's outcome, see [`Report::result`]) or
    /// `error` (a `failed` task's JSON-RPC error, see [`Report::error`]) in the same store
    /// update. A terminal report the shared store refuses is written again as `on_refusal` says.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn observe_task_with_result_now(
        &self,
        upstream: &str,
        task_id: &str,
        task: &Value,
        source: &'static str,
        result: Option<String>,
        error: Option<String>,
        on_refusal: OnRefusal,
    ) -> Applied {
        let Some(status) = task
            .get("status")
            .and_then(Value::as_str)
            .and_then(TaskStatus::parse)
        else {
            return (Observed::Unknown, false);
        };
        let message = task
            .get("statusMessage")
            .and_then(Value::as_str)
            .map(str::to_string);
        // A time that is not one is as if absent (`valid_time`): never recorded.
        let updated_at =
            valid_time(task.get("lastUpdatedAt").and_then(Value::as_str)).map(str::to_string);
        let poll = task.get("pollInterval").and_then(Value::as_u64);
        let report = Report {
            status,
            message,
            updated_at,
            poll_interval_ms: poll,
            tool_error: is_tool_error(task),
            result,
            error,
        };
        self.apply_status(upstream, task_id, report, source, on_refusal)
    }

    /// Whether the status report `task` (a `Task` object) needs the store: `false` for a report
    /// that repeats a terminal record's status (a terminal record never changes: the common
    /// poll of a finished task), and for a live record whose status, and every field the report
    /// carries (`statusMessage`, `lastUpdatedAt`, `pollInterval`), already hold those values.
    /// A report contradicting a terminal status needs it (the late result is counted once).
    /// Pure: no store access.
    pub fn would_change(record: &TaskRecord, task: &Value) -> bool {
        Registry::would_change_fields(record, &TaskFields::of(task))
    }

    /// [`Registry::would_change`] over the fields already read out of a `Task`.
    pub fn would_change_fields(record: &TaskRecord, task: &TaskFields<'_>) -> bool {
        let Some(status) = task.status.and_then(TaskStatus::parse) else {
            return true;
        };
        if record.status.is_terminal() {
            // A tool error's `isError` may come after the `completed` status itself; the
            // upstream's time of the end may come after taskgate recorded it with its own.
            return status != record.status
                || (status == TaskStatus::Completed && !record.tool_error && task.tool_error)
                || task
                    .last_updated_at
                    .flatten()
                    .is_some_and(|u| ended_earlier(u, &record.last_updated_at));
        }
        if status != record.status {
            return true;
        }
        let differs = |field: Option<Option<&str>>, held: Option<&str>| match field {
            None => false,
            Some(v) => v != held,
        };
        differs(task.status_message, record.status_message.as_deref())
            || valid_time(task.last_updated_at.flatten())
                .is_some_and(|u| u != record.last_updated_at)
            || match task.poll_interval {
                None => false,
                Some(v) => v != record.poll_interval_ms,
            }
    }

    /// Records that the task reached `report.status` (see [`Registry::observe_task`]). A
    /// terminal report a shared store refuses (a PostgreSQL outage: the client is told the
    /// task ended, and stops polling) is kept and applied again until the store takes it, with
    /// [`OnRefusal::Keep`] ([`super::refused`]); the refusal is counted in
    /// `taskgate_store_write_failures_total` and logged either way.
    pub(super) fn apply_status(
        &self,
        upstream: &str,
        task_id: &str,
        report: Report,
        source: &'static str,
        on_refusal: OnRefusal,
    ) -> Applied {
        match self.apply_report(upstream, task_id, report, source) {
            Write::Applied(applied) => applied,
            Write::Unknown => (Observed::Unknown, false),
            Write::Refused { report, closed } => {
                if on_refusal == OnRefusal::Keep && !closed {
                    self.keep_refused(upstream, task_id, report, source);
                }
                (Observed::Unknown, false)
            }
        }
    }

    /// One application of `report` to the record of `(upstream, task_id)` (one store
    /// update; the transition audited and counted when the status changed). A refused update
    /// gives the report back ([`Write::Refused`]) only then: the common case moves it in.
    pub(super) fn apply_report(
        &self,
        upstream: &str,
        task_id: &str,
        report: Report,
        source: &str,
    ) -> Write {
        let Report {
            status,
            message,
            updated_at,
            poll_interval_ms,
            tool_error,
            result: keep,
            error,
        } = report;
        let now = now_ms();
        // The result is kept as `store_terminal_result` keeps it: once, in a record holding
        // `status` (terminal), within the size bound.
        let keep = keep.filter(|json| status.is_terminal() && self.keeps_result(json));
        let apply = |r: &mut TaskRecord| {
            // A 2026 tool error (`completed` + `isError`), noted once, also when the
            // `completed` itself was recorded before (a notification without its result).
            let note_tool_error = tool_error && status == TaskStatus::Completed && !r.tool_error;
            if !r.status.can_become(status) {
                if note_tool_error && r.status == TaskStatus::Completed {
                    r.tool_error = true;
                    return true;
                }
                return false;
            }
            r.tool_error |= note_tool_error;
            let moved = r.status != status;
            r.status = status;
            if message.is_some() {
                r.status_message = message.clone();
            }
            match &updated_at {
                // A terminal status reported again: the record keeps the time it ended at,
                // unless this report says it ended earlier (see `ended_earlier`).
                Some(u)
                    if !moved && status.is_terminal() && !ended_earlier(u, &r.last_updated_at) => {}
                Some(u) => r.last_updated_at = u.clone(),
                // A new status without the upstream's time (a notification or answer that
                // left it out): taskgate's, not the creation's (break-tasks L6: `tasks/list`
                // showed a completed task last updated at its creation).
                None if moved => r.last_updated_at = format_rfc3339_ms(now),
                None => {}
            }
            if poll_interval_ms.is_some() {
                r.poll_interval_ms = poll_interval_ms;
            }
            if status.is_terminal() && r.terminal_at.is_none() {
                r.terminal_at = Some(now);
            }
            if status == TaskStatus::Cancelled && r.cancelled_at.is_none() {
                r.cancelled_at = Some(now);
            }
            true
        };
        let result = self.update(upstream, task_id, &mut |r| {
            let mut changed = apply(r);
            // A `failed` report's error, kept once: with the status, or in a record already
            // `failed` without one (a gateway task failed meanwhile by `gone`, whose real error
            // came after: review 19b #2, as `store_terminal_error` kept it).
            if let Some(error) = &error {
                if status == TaskStatus::Failed
                    && r.status == TaskStatus::Failed
                    && r.terminal_error.is_none()
                {
                    r.terminal_error = Some(error.clone());
                    changed = true;
                }
            }
            match &keep {
                Some(json) if r.status == status && r.terminal_result.is_none() => {
                    r.terminal_result = Some(json.clone());
                    true
                }
                _ => changed,
            }
        });
        let (before, after) = match result {
            Ok(Some(pair)) => pair,
            Ok(None) => return Write::Unknown,
            Err(e) => {
                self.write_failed(&e, "task store update failed");
                // Given back (the closures that borrowed its parts are done with them).
                let report = Report {
                    status,
                    message,
                    updated_at,
                    poll_interval_ms,
                    tool_error,
                    result: keep,
                    error,
                };
                let closed = e.is_closed();
                return Write::Refused { report, closed };
            }
        };
        if before.status != after.status {
            self.on_transition(&before, &after, source);
            let terminal_now = after.status.is_terminal();
            if !terminal_now {
                self.store.sync_soon();
            }
            return Write::Applied((Observed::Recorded(after.status), terminal_now));
        }
        if after.status.is_terminal() && status != after.status {
            let observed = self.on_stale_terminal(&after, status, source, now);
            return Write::Applied((observed, false));
        }
        // A result or error kept now, after its terminal status was recorded (a 2026
        // `notifications/tasks` `completed` without `result`, then the `tasks/get` that carries
        // it): taskgate serves it from the record from now on, whoever forgets it upstream, so
        // it is on disk before the message that brought it leaves, as it is when it comes with
        // the status (review 19 #2).
        let kept = |b: &Option<String>, a: &Option<String>| b.is_none() && a.is_some();
        if kept(&before.terminal_result, &after.terminal_result)
            || kept(&before.terminal_error, &after.terminal_error)
        {
            return Write::Applied((Observed::Recorded(after.status), true));
        }
        if before != after {
            self.store.sync_soon();
        }
        Write::Applied((Observed::Recorded(after.status), false))
    }

    /// Another status was reported for a task recorded terminal: the first late terminal
    /// result counted, audited and logged; the message must show the recorded status.
    pub(super) fn on_stale_terminal(
        &self,
        after: &TaskRecord,
        status: TaskStatus,
        source: &str,
        now: u64,
    ) -> Observed {
        // The first terminal state wins forever (2025-11-25 tasks: a terminal status MUST NOT change).
        // The message is counted as rewritten where it is (`observe`): a 2026-07-28 live
        // answer about a task whose payload is not held passes unchanged.
        let up = after.upstream.as_str();
        // A late result is one fact per task: counted, audited and logged the first time,
        // however often the upstream repeats it (every poll of tasks/get would).
        let first_late = status.is_terminal()
            && matches!(
                self.update(&after.upstream, &after.task_id, &mut |r| {
                    if r.late_result_at.is_some() {
                        return false;
                    }
                    r.late_result_at = Some(now);
                    true
                }),
                Ok(Some((ref b, _))) if b.late_result_at.is_none()
            );
        if first_late {
            self.metrics.task_late_result(up);
            self.audit(
                &after,
                "late_result",
                format!("{source} reported {status} after {}", after.status),
            );
            tracing::warn!(
                upstream = up,
                task_id = %after.task_id,
                recorded = %after.status,
                reported = %status,
                source,
                "upstream reported another terminal status for a terminal task; showing the recorded one"
            );
        } else {
            // A repeat, or a benign race: a reply saying `working` overtaken by the
            // terminal status notification.
            tracing::debug!(
                upstream = up,
                task_id = %after.task_id,
                recorded = %after.status,
                reported = %status,
                source,
                "stale status for a terminal task; showing the recorded one"
            );
        }
        Observed::Rewrite {
            status: after.status,
            status_message: after.status_message.clone(),
        }
    }

    /// A `tasks/result` payload arrived: the task ended (`failed` for an `isError` tool result).
    /// Applied only to a record that is not terminal yet: a payload carries no status, so it
    /// never contradicts a recorded terminal one (the Python SDK answers an empty result for a
    /// cancelled task). An update a shared store refuses is kept and applied again once it
    /// answers ([`super::refused`]), with the time taskgate saw the payload.
    /// Returns whether the record became terminal just now (see [`Applied`]).
    pub(super) fn apply_result_payload_now(
        &self,
        upstream: &str,
        task_id: &str,
        failed: bool,
    ) -> bool {
        let status = if failed {
            TaskStatus::Failed
        } else {
            TaskStatus::Completed
        };
        let now = now_ms();
        let result = self.update(upstream, task_id, &mut |r| {
            if r.status.is_terminal() || !r.status.can_become(status) {
                return false;
            }
            r.status = status;
            // The payload carries no `lastUpdatedAt`: the time taskgate saw the task end
            // (break-tasks L6: `tasks/list` showed it last updated at its creation).
            r.last_updated_at = format_rfc3339_ms(now);
            if r.terminal_at.is_none() {
                r.terminal_at = Some(now);
            }
            true
        });
        match result {
            Ok(Some((before, after))) if before.status != after.status => {
                self.on_transition(&before, &after, "tasks/result");
                true
            }
            Ok(_) => false,
            Err(e) => {
                self.write_failed(&e, "task store update failed");
                // The client read the payload and stops polling: the end is kept and written
                // again once a shared store answers, as a status report's is (`refused`).
                if !e.is_closed() {
                    let report = Report {
                        status,
                        message: None,
                        updated_at: Some(format_rfc3339_ms(now)),
                        poll_interval_ms: None,
                        tool_error: false,
                        result: None,
                        error: None,
                    };
                    self.keep_refused(upstream, task_id, report, "tasks/result");
                }
                false
            }
        }
    }

    /// Records that a `tasks/cancel` for the task goes upstream: `cancel_requested_at` and a
    /// `cancel_requested` audit event, both once per task (a later cancel changes nothing).
    /// One store update; returns the record after it.
    /// A gateway task's cancel (`layers::gateway_tasks`) does not go upstream as such: the
    /// server of its held call is sent `notifications/cancelled`, and the event says so.
    pub(super) fn request_cancel_now(
        &self,
        upstream: &str,
        task_id: &str,
    ) -> Option<std::sync::Arc<TaskRecord>> {
        self.cancel_requested_now(upstream, task_id, |r| {
            if r.origin == crate::store::Origin::Gateway {
                "tasks/cancel of a gateway task: notifications/cancelled sent upstream for its held tools/call"
            } else {
                "tasks/cancel forwarded upstream"
            }
        })
    }

    /// Records the "cancel requested" fact for a 2026-07-28 `tasks/cancel` that taskgate
    /// acknowledged itself (the task was already terminal: nothing went upstream).
    pub async fn record_cancel_acknowledged(
        self: &std::sync::Arc<Self>,
        upstream: &str,
        task_id: &str,
    ) {
        self.point_about(upstream, task_id, |this, up, id| {
            this.cancel_requested_now(up, id, |_| {
                "tasks/cancel of a terminal task acknowledged by taskgate (not forwarded)"
            })
        })
        .await;
    }

    /// Records that the upstream acknowledged a 2026-07-28 `tasks/cancel` for the task (a
    /// non-terminal ack: `TaskRecord::cancel_acked`), so later cancels are acknowledged by
    /// taskgate, also after a restart. Made durable soon (the ack is not a terminal status);
    /// a failed write is logged and counted, and only the in-memory note is then left.
    pub async fn record_cancel_acked(self: &std::sync::Arc<Self>, upstream: &str, task_id: &str) {
        self.point_about(upstream, task_id, |this, up, id| {
            match this.update(up, id, &mut |r| {
                !std::mem::replace(&mut r.cancel_acked, true)
            }) {
                Ok(Some((before, after))) if before != after => this.store.sync_soon(),
                Ok(_) => {}
                Err(e) => this.write_failed(&e, "task store update failed"),
            }
        })
        .await;
    }

    fn cancel_requested_now(
        &self,
        upstream: &str,
        task_id: &str,
        detail: impl Fn(&TaskRecord) -> &'static str,
    ) -> Option<std::sync::Arc<TaskRecord>> {
        let now = now_ms();
        let updated = self.update(upstream, task_id, &mut |r| {
            if r.cancel_requested_at.is_some() {
                return false;
            }
            r.cancel_requested_at = Some(now);
            true
        });
        match updated {
            Ok(Some((before, after))) => {
                // The fact is recorded once per task: only the update that set
                // `cancel_requested_at` audits it (the store's swap lets one caller win, also
                // among concurrent ones). A repeated cancel (a 2026 client may send any number
                // for a terminal task, each acknowledged) adds nothing to the record.
                if before.cancel_requested_at.is_none() && after.cancel_requested_at.is_some() {
                    self.audit(&after, "cancel_requested", detail(&after).to_string());
                }
                Some(after)
            }
            Ok(None) => None,
            Err(e) => {
                self.write_failed(&e, "task store update failed");
                None
            }
        }
    }

    pub(super) fn on_transition(&self, before: &TaskRecord, after: &TaskRecord, source: &str) {
        let up = after.upstream.as_str();
        self.metrics
            .task_transition(up, before.status, after.status);
        if self.counts_own_gauges() {
            self.metrics.tasks_dec(up, before.status);
            self.metrics.tasks_inc(up, after.status);
        }
        if after.status.is_terminal() && !before.status.is_terminal() {
            self.release_slot(up, &after.owner);
        }
        if after.cancelled_at.is_some() && before.cancelled_at.is_none() {
            // Audit fact 1: status cancelled.
            self.metrics.task_cancelled(up);
            self.metrics.tasks_cancelled_unreleased.inc();
            if let (Some(asked), Some(done)) = (after.cancel_requested_at, after.cancelled_at) {
                self.metrics
                    .cancel_to_cancelled_seconds
                    .observe(done.saturating_sub(asked) as f64 / 1000.0);
            }
            self.audit(after, "status_cancelled", format!("seen in {source}"));
            self.releases
                .cancelled(up, &after.task_id, ReleaseReason::Quiet);
        }
    }
}

/// The fields of a `Task` that [`Registry::would_change_fields`] compares, borrowed. Each
/// `Option<Option<_>>` is `None` when the field is absent or `null`, `Some(None)` when it holds a
/// value of another type than expected (a string; `pollInterval`: an integer ≥ 0).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct TaskFields<'a> {
    /// `status`, when a string.
    pub status: Option<&'a str>,
    /// `statusMessage`.
    pub status_message: Option<Option<&'a str>>,
    /// `lastUpdatedAt`.
    pub last_updated_at: Option<Option<&'a str>>,
    /// `pollInterval`, in ms.
    pub poll_interval: Option<Option<u64>>,
    /// `completed` with `result.isError: true` (a 2026-07-28 `DetailedTask`'s tool error).
    pub tool_error: bool,
}

impl<'a> TaskFields<'a> {
    /// The fields of the `Task` object `task`.
    pub fn of(task: &'a Value) -> TaskFields<'a> {
        let present = |key: &str| task.get(key).filter(|v| !v.is_null());
        TaskFields {
            status: task.get("status").and_then(Value::as_str),
            status_message: present("statusMessage").map(Value::as_str),
            last_updated_at: present("lastUpdatedAt").map(Value::as_str),
            poll_interval: present("pollInterval").map(Value::as_u64),
            tool_error: is_tool_error(task),
        }
    }
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
