//! What `observe` records for the `bridge` (a 2025-11-25 client's task on a 2026-07-28 task
//! server): the answer whose meaning the bridge's client era gives it, asked for on the
//! request and handed back in its [`Fact`] (see `layers::extensions`). Recording them here
//! keeps `observe` the one place task facts reach the registry.
//!
//! - **A plain result to a task-augmented call** ([`PlainAnswerIsTask`]: a server that ran the
//!   call without creating a task): a task already `completed`, under a taskId taskgate mints
//!   (`taskgate-<random>`), recorded durably with the result as its stored `DetailedTask`, so
//!   `tasks/get`, `tasks/result` and `tasks/list` answer from the record. A tool error
//!   (`isError`) is a 2025 `failed`. A result over `tasks.max_stored_result_bytes`, or one no
//!   record can be made of, is not recorded: the client then gets the plain result. When the
//!   write fails the answer becomes `-32603` (nothing runs upstream to cancel).
//!
//! [`PlainAnswerIsTask`]: crate::layers::extensions::PlainAnswerIsTask

use super::Watch;
use crate::jsonrpc::Id;
use crate::layers::extensions::{Fact, PendingCreation, SynthesizedTask};
use crate::mcp::errors::McpError;
use crate::mcp::task::{format_rfc3339_ms, now_ms};
use crate::store::TaskRecord;
use bytes::Bytes;
use serde_json::{json, Value};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Mixed into each minted taskId (with a fresh random hasher key), so two ids never repeat.
static MINTED: AtomicU64 = AtomicU64::new(1);

/// A taskId for a task taskgate records without the upstream naming one.
fn minted_task_id() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(MINTED.fetch_add(1, Ordering::Relaxed));
    format!("taskgate-{:016x}", h.finish())
}

impl Watch {
    /// The answer (`bytes`, a JSON-RPC result answering `id`) to a call carrying
    /// [`PlainAnswerIsTask`](crate::layers::extensions::PlainAnswerIsTask): when its result is a
    /// plain one (neither a `CreateTaskResult` nor `input_required`), the `completed` task
    /// recorded from it (see the module docs; `recorded` filled) and the message to pass on;
    /// `Err` with the answer parsed (`None` if it is not JSON) for any other result, which is
    /// then read as a creation without a second parse.
    pub(super) async fn on_plain_answer(
        &self,
        bytes: &Bytes,
        id: &Id,
        pending: &PendingCreation,
        recorded: &Fact<SynthesizedTask>,
    ) -> Result<Bytes, Option<Value>> {
        let value: Value = serde_json::from_slice(bytes).map_err(|_| None)?;
        let plain = value.get("result").filter(|r| {
            r.is_object()
                && !matches!(
                    r.get("resultType").and_then(Value::as_str),
                    Some("task" | "input_required")
                )
                && super::other_era_creation(crate::mcp::era::Era::Modern, r).is_none()
        });
        let Some(result) = plain else {
            return Err(Some(value));
        };
        let Some(record) = self.completed_record(&pending.template, result) else {
            return Ok(bytes.clone());
        };
        let task_id = record.task_id.clone();
        let record = Arc::new(record);
        match self
            .registry
            .record_creation(TaskRecord::clone(&record), &pending.reservation)
            .await
        {
            Ok(()) => {
                let _ = pending.created.set(task_id);
                recorded.set(SynthesizedTask { record });
                Ok(bytes.clone())
            }
            // Logged and counted by the registry (`record_creation`).
            Err(_) => Ok(McpError::NotRecorded {
                before_upstream: false,
            }
            .body(Some(id))),
        }
    }

    /// The `completed` record of a plain `result` (see the module docs); `None` when none can
    /// be made or the result is over `tasks.max_stored_result_bytes`.
    fn completed_record(&self, template: &TaskRecord, result: &Value) -> Option<TaskRecord> {
        let now = format_rfc3339_ms(now_ms());
        let task = json!({"taskId": minted_task_id(), "status": "completed", "createdAt": now,
            "lastUpdatedAt": now, "ttl": null});
        let mut record = self.registry.creation_record(template, &task)?;
        let mut detailed = task;
        // The ttl the record keeps it for (capped), which the creation's answer names too.
        detailed["ttl"] = json!(record.ttl_ms);
        detailed["result"] = result.clone();
        let stored = detailed.to_string();
        if stored.len() as u64 > self.registry.config().max_stored_result_bytes {
            return None;
        }
        record.terminal_result = Some(stored);
        // A tool error is a 2025 `failed` (the client's answer and `tasks/list` show it so).
        record.tool_error = result.get("isError").and_then(Value::as_bool) == Some(true);
        Some(record)
    }
}
