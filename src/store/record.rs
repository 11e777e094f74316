//! The task record: one per `(upstream, taskId)`, with what was last seen of the task and the
//! audit event appended for the two cancellation facts.

use crate::mcp::task::{Task, TaskStatus};
use serde::{Deserialize, Serialize};

/// Who made a call a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The client sent `params.task`.
    Client,
    /// taskgate turned a plain `tools/call` into a task.
    Upgraded,
}

impl Origin {
    /// Every origin.
    pub const ALL: &'static [Origin] = &[Origin::Client, Origin::Upgraded];

    /// The label value (`client`, `upgraded`).
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Client => "client",
            Origin::Upgraded => "upgraded",
        }
    }
}

/// One task as taskgate knows it. Times named `*_at` without a string type are milliseconds since
/// the Unix epoch on taskgate's clock; `created_at` / `last_updated_at` are the upstream's strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The upstream's configured name.
    pub upstream: String,
    /// The upstream's `taskId`, never rewritten.
    pub task_id: String,
    /// The owner: `principal:<name>` (bearer auth), `session:<Mcp-Session-Id>`, or `anonymous`.
    pub owner: String,
    /// The `Mcp-Session-Id` the task was created on; `tasks/*` for it go out on that session.
    pub upstream_session: Option<String>,
    /// `client` or `upgraded`.
    pub origin: Origin,
    /// The tool called (`params.name`).
    pub tool: Option<String>,
    /// The client's `MCP-Protocol-Version` at creation.
    pub protocol_version: Option<String>,
    /// The last status seen.
    pub status: TaskStatus,
    /// The last `statusMessage` seen.
    pub status_message: Option<String>,
    /// The upstream's `createdAt` (RFC 3339).
    pub created_at: String,
    /// The upstream's `lastUpdatedAt` (RFC 3339).
    pub last_updated_at: String,
    /// The upstream's `ttl` in ms (`None`: unlimited).
    pub ttl_ms: Option<u64>,
    /// The upstream's `pollInterval` in ms.
    pub poll_interval_ms: Option<u64>,
    /// When taskgate recorded the task (orders `tasks/list`, newest first).
    pub recorded_at: u64,
    /// First `tasks/cancel` taskgate forwarded for it.
    pub cancel_requested_at: Option<u64>,
    /// Audit fact "status cancelled": first time taskgate saw `cancelled`.
    pub cancelled_at: Option<u64>,
    /// Audit fact "resources released" (see `layers::cancel`).
    pub released_at: Option<u64>,
    /// When the status became terminal.
    pub terminal_at: Option<u64>,
    /// First time the upstream reported another terminal status after this one was recorded.
    #[serde(default)]
    pub late_result_at: Option<u64>,
    /// When the record expires: `createdAt + ttl`, or `createdAt + tasks.max_ttl_ms` when the
    /// upstream gave no ttl.
    pub expires_at: u64,
}

impl TaskRecord {
    /// The `Task` object as the spec shapes it (for `tasks/list` and rewrites).
    pub fn to_task(&self) -> Task {
        Task {
            task_id: self.task_id.clone(),
            status: self.status,
            status_message: self.status_message.clone(),
            created_at: self.created_at.clone(),
            last_updated_at: self.last_updated_at.clone(),
            ttl: self.ttl_ms,
            poll_interval: self.poll_interval_ms,
        }
    }

    /// True when the record's time is up at `now_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at <= now_ms
    }
}

/// One append-only audit event (`tasks show`, `/admin/tasks/<upstream>/<taskId>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// Milliseconds since the Unix epoch.
    pub time: u64,
    /// The upstream's name.
    pub upstream: String,
    /// The task.
    #[serde(rename = "taskId")]
    pub task_id: String,
    /// The task's owner.
    pub owner: String,
    /// `created`, `cancel_requested`, `status_cancelled`, `resources_released`, `late_result`,
    /// `terminal_rewrite`, `expired`.
    pub event: String,
    /// Free-form detail.
    pub detail: String,
}
