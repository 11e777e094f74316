//! Facts one layer hands to the layers below it, as typed request extensions
//! ([`crate::exchange::McpRequest::extensions`]), never through tables an outer layer reads back.
//!
//! - [`Upgraded`]: set by `upgrade` on the plain `tools/call` it turned into a task (the record's
//!   origin is then `upgraded`).
//! - [`AuthorisedTask`]: set by `tasks` on a `tasks/get|result|cancel` it authorised: the record
//!   it read (`cancel` takes its terminal check from it, `observe` the taskId).
//! - [`PendingCreation`]: set by `tasks` on a task-augmented `tools/call` it let through: the
//!   record to complete from the `CreateTaskResult` and the owner's reserved slot. `observe`
//!   takes it and records the creation.

//! - [`UpstreamWithoutTasks`]: set by `session` on a 2025 `tasks/*` request whose upstream
//!   session advertised no `capabilities.tasks`: `tasks` then serves nothing itself and passes
//!   the request on.

use crate::registry::Reservation;
use crate::store::TaskRecord;
use std::sync::{Arc, OnceLock};

/// The `upgrade` layer's own `tools/call`: a plain call it turned into a task.
#[derive(Debug, Clone, Copy)]
pub struct Upgraded;

/// A `tasks/get|result|cancel` the `tasks` layer authorised, with the record it read then.
#[derive(Debug, Clone)]
pub struct AuthorisedTask {
    /// The task's record when the request was authorised.
    pub record: TaskRecord,
}

/// A task-augmented `tools/call` on its way upstream.
#[derive(Debug, Clone)]
pub struct PendingCreation {
    /// The record to write, without what the `CreateTaskResult` brings (taskId, status, times).
    pub template: Arc<TaskRecord>,
    /// The owner's live-task slot; given back when the last clone is dropped unless the creation
    /// was recorded with a live status.
    pub reservation: Arc<Reservation>,
    /// `params._meta.progressToken` as JSON text (ties progress to the task).
    pub progress_token: Option<String>,
    /// The taskId, once `observe` recorded the creation (`cancel` keeps a clone to drop a
    /// `notifications/cancelled` for this request: tasks are cancelled with `tasks/cancel`).
    pub created: Arc<OnceLock<String>>,
}

/// A 2025-11-25 `tasks/*` request on an upstream session whose `InitializeResult` advertised no
/// `capabilities.tasks`: there are no tasks there for taskgate to answer about.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamWithoutTasks;
