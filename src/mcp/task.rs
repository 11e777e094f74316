//! Tasks (2025-11-25 basic/utilities/tasks): `TaskStatus`, the `Task` object, and the allowed
//! status transitions.

use serde::{Deserialize, Serialize};

/// `_meta` key that ties a message to a task: `{"taskId": ...}`.
pub const RELATED_TASK_META: &str = "io.modelcontextprotocol/related-task";

/// Ties the message whose result or params is `object` to `task_id` (2025-11-25: every message
/// of a task carries it): `_meta["io.modelcontextprotocol/related-task"] = {"taskId": task_id}`,
/// the other `_meta` members kept. A `_meta` that is not an object is left as it is.
pub fn set_related_task(object: &mut serde_json::Map<String, serde_json::Value>, task_id: &str) {
    let meta = object
        .entry("_meta")
        .or_insert_with(|| serde_json::Value::Object(Default::default()));
    if let Some(m) = meta.as_object_mut() {
        m.insert(
            RELATED_TASK_META.into(),
            serde_json::json!({ "taskId": task_id }),
        );
    }
}

/// Removes `_meta["io.modelcontextprotocol/related-task"]` from the result or params `object`,
/// and `_meta` with it when it is left empty: a message for a party that asked for no task (an
/// upgraded call's plain client) or knows no such key (2026-07-28).
pub fn remove_related_task(object: &mut serde_json::Map<String, serde_json::Value>) {
    if let Some(serde_json::Value::Object(meta)) = object.get_mut("_meta") {
        meta.remove(RELATED_TASK_META);
        if meta.is_empty() {
            object.remove("_meta");
        }
    }
}

/// `TaskStatus`: `working | input_required | completed | failed | cancelled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Being worked on (the first status of every task).
    Working,
    /// The receiver needs input (elicitation or sampling) before it can go on.
    InputRequired,
    /// Finished with a result (terminal).
    Completed,
    /// Finished with an error, or a tool result with `isError: true` (terminal).
    Failed,
    /// Cancelled by `tasks/cancel` (terminal).
    Cancelled,
}

impl TaskStatus {
    /// Every status, in the spec's order.
    pub const ALL: &'static [TaskStatus] = &[
        TaskStatus::Working,
        TaskStatus::InputRequired,
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ];

    /// The wire name (`"working"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Working => "working",
            TaskStatus::InputRequired => "input_required",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<TaskStatus> {
        Some(match s {
            "working" => TaskStatus::Working,
            "input_required" => TaskStatus::InputRequired,
            "completed" => TaskStatus::Completed,
            "failed" => TaskStatus::Failed,
            "cancelled" => TaskStatus::Cancelled,
            _ => return None,
        })
    }

    /// `completed`, `failed` and `cancelled` are terminal: nothing leaves them.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }

    /// Whether the spec allows `self → to`. The same status again is allowed (an update).
    pub fn can_become(self, to: TaskStatus) -> bool {
        self == to || !self.is_terminal()
    }
}

impl std::fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `Task` object as it appears in `CreateTaskResult.task`, `tasks/get`, `tasks/cancel`,
/// `tasks/list` and `notifications/tasks/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// The receiver's id, opaque.
    pub task_id: String,
    /// Current status.
    pub status: TaskStatus,
    /// Human-readable status detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
    /// ISO 8601 creation time.
    pub created_at: String,
    /// ISO 8601 time of the last status change.
    pub last_updated_at: String,
    /// Lifetime in ms from creation; `null` for unlimited (the key is required).
    pub ttl: Option<u64>,
    /// Suggested polling interval in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<u64>,
}

/// `at` when it is an RFC 3339 time ([`parse_rfc3339_ms`]), else `None`: what taskgate takes of
/// an upstream's `createdAt` / `lastUpdatedAt`. An invalid one (`"yesterday"`) is as if absent,
/// so no record, list or translated task shows it (a client's schema rejects the whole result
/// over one such member: 2025-11-25 and 2026-07-28 `Task` give both as RFC 3339 strings).
pub fn valid_time(at: Option<&str>) -> Option<&str> {
    at.filter(|t| parse_rfc3339_ms(t).is_some())
}

/// Parses an RFC 3339 time (`2025-11-25T10:30:00Z`, fractions and offsets allowed) into
/// milliseconds since the Unix epoch. Returns `None` for anything else or times before 1970.
pub fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Formats milliseconds since the Unix epoch as RFC 3339 UTC (`2025-11-25T10:30:00.25Z`).
pub fn format_rfc3339_ms(ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Shortest wait between two `tasks/get` polls taskgate makes itself (the bridge serving a
/// `tasks/result`, the upgrade follower): an upstream's smaller poll interval is raised to it,
/// and it is the first wait of the back-off used when the upstream gives `0` or none.
pub const MIN_POLL: std::time::Duration = std::time::Duration::from_millis(100);
/// Longest wait between two such polls: an upstream's larger poll interval (`pollInterval`,
/// `pollIntervalMs`, up to 2^64 ms on the wire) is lowered to it, so a task is never left
/// unwatched for longer (issue 29 #18); the back-off doubles up to it.
pub const MAX_POLL: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_follow_the_spec() {
        use TaskStatus::*;
        assert!(Working.can_become(InputRequired));
        assert!(InputRequired.can_become(Working));
        assert!(Working.can_become(Cancelled));
        assert!(!Cancelled.can_become(Completed));
        assert!(!Completed.can_become(Cancelled));
        assert!(Failed.can_become(Failed));
    }

    #[test]
    fn times_round_trip() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        let ms = parse_rfc3339_ms("2025-11-25T10:30:00.250Z").unwrap();
        assert_eq!(parse_rfc3339_ms(&format_rfc3339_ms(ms)), Some(ms));
        assert_eq!(
            parse_rfc3339_ms("2025-11-25T11:30:00+01:00"),
            parse_rfc3339_ms("2025-11-25T10:30:00Z")
        );
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
        assert_eq!(parse_rfc3339_ms("2025-13-01T00:00:00Z"), None);
    }
}
