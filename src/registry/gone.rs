//! Tasks whose upstream process died (a stdio upstream's child: `upstream::stdio`): a task's
//! state lives in that process, so a task that was not terminal can never finish. Each becomes
//! `failed` with a `statusMessage` saying so (never `working` forever), and both audit facts
//! are recorded: the status (`status` transition to `failed`, or the `cancelled` already
//! recorded) and "resources released" (`released_at`, audit `resources_released`,
//! `reason=process_exited`): the process that held them is gone.

use super::status::Report;
use super::Registry;
use crate::mcp::task::{now_ms, TaskStatus};
use crate::metrics::ReleaseReason;
use std::sync::Arc;

impl Registry {
    /// Fails the tasks of `upstream` recorded before `before_ms` (only those recorded on
    /// `session` when given: a `per_session` child's) that were not terminal, and records
    /// "resources released" for them and for its cancelled tasks not yet released. Returns how
    /// many records changed.
    pub async fn fail_tasks_of_dead_process(
        self: &Arc<Self>,
        upstream: &str,
        session: Option<&str>,
        before_ms: u64,
        message: &str,
    ) -> usize {
        let (up, session, message) = (
            upstream.to_string(),
            session.map(str::to_string),
            message.to_string(),
        );
        let changed = self
            .off_runtime(move |r| r.fail_dead_now(&up, session.as_deref(), before_ms, &message))
            .await
            .unwrap_or(0);
        if changed > 0 {
            if let Err(e) = self.store.sync().await {
                self.write_failed(
                    &e,
                    "failed tasks of a dead process could not be made durable",
                );
            }
        }
        changed
    }

    fn fail_dead_now(
        &self,
        upstream: &str,
        session: Option<&str>,
        before_ms: u64,
        message: &str,
    ) -> usize {
        let mut found = Vec::new();
        let scanned = self.store.scan(&mut |rec| {
            let unreleased_cancel =
                rec.status == TaskStatus::Cancelled && rec.released_at.is_none();
            if rec.upstream == upstream
                && rec.recorded_at <= before_ms
                && (!rec.status.is_terminal() || unreleased_cancel)
                && session.is_none_or(|s| rec.upstream_session.as_deref() == Some(s))
            {
                found.push(rec.task_id);
            }
            true
        });
        if let Err(e) = scanned {
            self.write_failed(&e, "task store scan failed");
        }
        let mut changed = 0;
        for task_id in found {
            let report = Report {
                status: TaskStatus::Failed,
                message: Some(message.to_string()),
                updated_at: None,
                poll_interval_ms: None,
                tool_error: false,
            };
            self.apply_status(upstream, &task_id, report, "process_exited");
            let now = now_ms();
            let updated = self.update(upstream, &task_id, &mut |r| {
                if r.released_at.is_some() {
                    return false;
                }
                r.released_at = Some(now);
                true
            });
            let Ok(Some((before, after))) = updated else {
                continue;
            };
            if before.released_at.is_some() {
                continue;
            }
            changed += 1;
            self.metrics
                .task_released(upstream, ReleaseReason::ProcessExited);
            if let Some(c) = after.cancelled_at {
                self.metrics.tasks_cancelled_unreleased.dec();
                self.metrics
                    .cancelled_to_released_seconds
                    .observe(now.saturating_sub(c) as f64 / 1000.0);
            }
            self.releases.forget(upstream, &task_id);
            self.audit(
                &after,
                "resources_released",
                format!("reason={}", ReleaseReason::ProcessExited.as_str()),
            );
        }
        changed
    }
}
