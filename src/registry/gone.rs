//! Tasks whose upstream process died (a stdio upstream's child: `upstream::stdio`): a task's
//! state lives in that process, so a task that was not terminal can never finish. Each becomes
//! `failed` with a `statusMessage` saying so (never `working` forever), and both audit facts
//! are recorded: the status (`status` transition to `failed`, or the `cancelled` already
//! recorded) and "resources released" (`released_at`, audit `resources_released`,
//! `reason=process_exited`): the process that held them is gone. The same holds for the
//! tasks taskgate itself was running (gateway-owned tasks, `layers::gateway_tasks`) when its
//! previous run ended: the held upstream calls died with it (`reason=restart`).

use super::status::Report;
use super::Registry;
use crate::mcp::task::{format_rfc3339_ms, now_ms, TaskStatus};
use crate::metrics::ReleaseReason;
use crate::store::Origin;
use std::sync::Arc;

/// Which tasks a dead process (or a previous run) leaves behind, and what becomes of them
/// ([`Registry::fail_dead_now`]): the tasks of `upstream` (those `only` names, else a scan; of
/// `origin` only, when given) recorded before `before_ms` that were not terminal (or cancelled
/// and not released; with `ended_too`, any not released) are failed with `message` (those not
/// terminal) and released with `reason`.
struct Dead {
    upstream: String,
    only: Option<Vec<String>>,
    origin: Option<Origin>,
    before_ms: u64,
    message: String,
    reason: ReleaseReason,
    ended_too: bool,
}

impl Registry {
    /// Fails the tasks of `upstream` that were not terminal: the tasks `only` names (the ones
    /// the dead process created, as its transport saw them, whenever they were recorded: their
    /// `recorded_at` is the creator's clock, which may run ahead of this one), or with `None`
    /// every task of the upstream recorded before `before_ms` (a scan: right only where no other live process
    /// serves the upstream, as with a store of one gateway). Records "resources released" for
    /// them and for those cancelled and not yet released. Returns how many records changed.
    pub async fn fail_tasks_of_dead_process(
        self: &Arc<Self>,
        upstream: &str,
        only: Option<Vec<String>>,
        before_ms: u64,
        message: &str,
    ) -> usize {
        self.fail_dead(Dead {
            upstream: upstream.to_string(),
            only,
            origin: None,
            before_ms,
            message: message.to_string(),
            reason: ReleaseReason::ProcessExited,
            ended_too: false,
        })
        .await
    }

    /// Releases the gateway tasks (`upstream.tasks = "gateway"`) whose held calls were in flight
    /// on a process of `upstream` when it died (`upstream::stdio::ChildGone::held`): "resources
    /// released" (`reason=process_exited`) for each not released yet, and `failed` with
    /// `message` first for one still not terminal. One its held call recorded `failed` already
    /// (it saw the call end without an answer) is released all the same: the process that held
    /// its resources is gone. Returns how many records changed.
    pub async fn release_held_of_dead_process(
        self: &Arc<Self>,
        upstream: &str,
        held: Vec<String>,
        message: &str,
    ) -> usize {
        if held.is_empty() {
            return 0;
        }
        self.fail_dead(Dead {
            upstream: upstream.to_string(),
            only: Some(held),
            origin: Some(Origin::Gateway),
            before_ms: now_ms(),
            message: message.to_string(),
            reason: ReleaseReason::ProcessExited,
            ended_too: true,
        })
        .await
    }

    /// Fails the tasks of `upstream` with origin `origin` recorded before `before_ms` that were
    /// not terminal (a scan): what a previous run of taskgate was holding itself when it ended
    /// (a gateway-owned task's upstream call, `layers::gateway_tasks`, dies with the process
    /// that held it). Each becomes `failed` with `message` as its `statusMessage`, and "resources
    /// released" is recorded for it (`reason="restart"`), as for those cancelled and not yet
    /// released. Right only where no other live taskgate holds such calls (a store of one
    /// gateway). Returns how many records changed.
    pub async fn fail_tasks_of_previous_run(
        self: &Arc<Self>,
        upstream: &str,
        origin: Origin,
        before_ms: u64,
        message: &str,
    ) -> usize {
        self.fail_dead(Dead {
            upstream: upstream.to_string(),
            only: None,
            origin: Some(origin),
            before_ms,
            message: message.to_string(),
            reason: ReleaseReason::Restart,
            ended_too: false,
        })
        .await
    }

    /// Fails the task `task_id` of `upstream` that the upstream itself says it no longer has
    /// (break-tasks M2: it restarted and forgot its tasks, or the task's session): an
    /// authoritative "not found" about that very task, read by `layers::tasks`. As for a dead
    /// process: `failed` with `message` (and the error it keeps, `terminal_error`) and
    /// "resources released" (`reason="upstream_lost"`), which gives the owner's slot back.
    /// Nothing happens to a record that is terminal already. Returns whether it changed.
    pub async fn fail_task_lost_upstream(
        self: &Arc<Self>,
        upstream: &str,
        task_id: &str,
        message: &str,
    ) -> bool {
        let changed = self
            .fail_dead(Dead {
                upstream: upstream.to_string(),
                only: Some(vec![task_id.to_string()]),
                origin: None,
                before_ms: now_ms(),
                message: message.to_string(),
                reason: ReleaseReason::UpstreamLost,
                ended_too: false,
            })
            .await;
        changed > 0
    }

    /// [`Registry::fail_dead_now`] off the runtime, then what it changed made durable (a
    /// failed sync is logged and counted). Returns how many records changed.
    async fn fail_dead(self: &Arc<Self>, dead: Dead) -> usize {
        let changed = self
            .off_runtime(move |r| r.fail_dead_now(dead))
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

    /// The tasks `dead` describes, failed and released now ([`Dead`]); how many records changed.
    fn fail_dead_now(&self, dead: Dead) -> usize {
        let Dead {
            upstream,
            only,
            origin,
            before_ms,
            message,
            reason,
            ended_too,
        } = dead;
        let (upstream, message) = (upstream.as_str(), message.as_str());
        // Named tasks are the dead process's own: no time filter (a scan needs one, for the
        // tasks created after the process's end).
        let named = only.is_some();
        let dead = |rec: &crate::store::TaskRecord| {
            let unreleased_cancel =
                rec.status == TaskStatus::Cancelled && rec.released_at.is_none();
            rec.upstream == upstream
                && origin.is_none_or(|o| rec.origin == o)
                && (named || rec.recorded_at <= before_ms)
                && (!rec.status.is_terminal()
                    || unreleased_cancel
                    || (ended_too && rec.released_at.is_none()))
        };
        // (task id, whether it still needs its `failed`: a cancelled one only its release,
        // else the status machine would count the `failed` as a late result after `cancelled`;
        // whether its record keeps the error it was failed with: a client's or a bridged task,
        // which are answered from it.)
        let mut found = Vec::new();
        match only {
            Some(ids) => {
                for id in ids {
                    match self.store.get(upstream, &id) {
                        Ok(Some(rec)) if dead(&rec) => {
                            found.push((id, !rec.status.is_terminal(), keeps_error(&rec)))
                        }
                        Ok(_) => {}
                        Err(e) => self.write_failed(&e, "task store read failed"),
                    }
                }
            }
            None => {
                let scanned = self.store.scan(&mut |rec| {
                    if dead(&rec) {
                        let fail = !rec.status.is_terminal();
                        let keeps = keeps_error(&rec);
                        found.push((rec.task_id, fail, keeps));
                    }
                    true
                });
                if let Err(e) = scanned {
                    self.write_failed(&e, "task store scan failed");
                }
            }
        }
        // A client's task failed here keeps the error it ended with (`terminal_error`), in the
        // same update as its `failed`, whatever `tasks.max_stored_result_bytes` says: its
        // `tasks/get` and `tasks/result` are answered from the record (`layers::tasks`), never
        // sent to the process or session that lost it. So does a bridged task (its bridge
        // answers from the record: review 20 #1, kept in a second write within the size limit,
        // a bridge with results not stored kept none and went on asking the upstream). A
        // gateway task's own layer answers it.
        let error = serde_json::json!({"code": crate::jsonrpc::INTERNAL_ERROR, "message": message})
            .to_string();
        let mut changed = 0;
        for (task_id, fail, keeps) in found {
            if fail {
                let report = Report {
                    status: TaskStatus::Failed,
                    message: Some(message.to_string()),
                    updated_at: Some(format_rfc3339_ms(now_ms())),
                    poll_interval_ms: None,
                    tool_error: false,
                    result: None,
                    error: keeps.then(|| error.clone()),
                };
                self.apply_status(
                    upstream,
                    &task_id,
                    report,
                    reason.as_str(),
                    super::OnRefusal::Keep,
                );
            }
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
            self.metrics.task_released(upstream, reason);
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
                format!("reason={}", reason.as_str()),
            );
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use crate::layers::testing::{record, registry};
    use crate::mcp::task::{now_ms, TaskStatus};
    use crate::store::TaskStore;

    /// A task the upstream lost is failed with the error it keeps (answered from the record
    /// from then on) and released; a record already terminal is left as it is.
    #[tokio::test]
    async fn a_task_the_upstream_lost_is_failed_and_released_once() {
        let (registry, store) = registry();
        store.create(record("live")).await.unwrap();
        let mut done = record("done");
        done.status = TaskStatus::Completed;
        store.create(done.clone()).await.unwrap();
        assert!(
            registry
                .fail_task_lost_upstream("up", "live", "lost it")
                .await
        );
        let rec = store.get("up", "live").unwrap().unwrap();
        assert_eq!(rec.status, TaskStatus::Failed);
        assert_eq!(rec.status_message.as_deref(), Some("lost it"));
        assert!(rec.released_at.is_some());
        let error: serde_json::Value =
            serde_json::from_str(rec.terminal_error.as_deref().unwrap()).unwrap();
        assert_eq!(error["code"], -32603);
        assert_eq!(error["message"], "lost it");
        assert!(
            !registry
                .fail_task_lost_upstream("up", "live", "again")
                .await
        );
        assert!(
            !registry
                .fail_task_lost_upstream("up", "done", "lost it")
                .await
        );
        assert_eq!(store.get("up", "done").unwrap().unwrap(), done);
        let released = store
            .audit_for("up", "live")
            .unwrap()
            .into_iter()
            .filter(|e| e.event == "resources_released")
            .map(|e| e.detail)
            .collect::<Vec<_>>();
        assert_eq!(released, ["reason=upstream_lost"]);
    }

    /// A task named by the lost replica's lease is failed even when its creator's clock ran
    /// ahead of the adopter's (`recorded_at` after the adopter's now); a scan keeps the filter.
    #[tokio::test]
    async fn lost_replica_leases_fail_a_named_task_whatever_the_clocks() {
        let (registry, store) = registry();
        let mut ahead = record("ahead");
        ahead.recorded_at = now_ms() + 60_000;
        store.create(ahead.clone()).await.unwrap();
        let mut scanned = ahead.clone();
        scanned.task_id = "scanned".into();
        store.create(scanned).await.unwrap();
        let now = now_ms();
        let changed = registry
            .fail_tasks_of_dead_process("up", None, now, "lost")
            .await;
        assert_eq!(changed, 0, "a scan: recorded after `before_ms`");
        let changed = registry
            .fail_tasks_of_dead_process("up", Some(vec!["ahead".into()]), now, "lost")
            .await;
        assert_eq!(changed, 1);
        let rec = store.get("up", "ahead").unwrap().unwrap();
        assert_eq!(rec.status, TaskStatus::Failed);
        assert!(rec.released_at.is_some());
        assert_ne!(
            rec.last_updated_at, ahead.last_updated_at,
            "lastUpdatedAt set"
        );
    }
}

/// Whether a task failed as dead or lost keeps the error it was failed with in its record: a
/// client's task, and a bridged one (both answered from the record from then on).
fn keeps_error(rec: &crate::store::TaskRecord) -> bool {
    matches!(rec.origin, Origin::Client | Origin::Bridged)
}
