//! The "resources released" tracker (the second audit fact; see `layers::cancel` for the
//! definition): what is still held or happening for each task, and the `progressToken` →
//! `taskId` map that ties `notifications/progress` to a task.
//!
//! A task is tracked while a [`ResourceHold`] exists for it (an open `tasks/result`, a relayed
//! stream that carries its messages, an upgraded call's follower), and from the moment it is
//! recorded cancelled until it is released. The waiter of a cancelled task sleeps on a
//! [`Notify`] while holds remain (woken when one drops) and then until the quiet window after
//! the last activity has passed; it then reports to the [`Registry`], which records the fact.

use super::Registry;
use crate::metrics::ReleaseReason;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

type Key = (String, String);

/// `progressToken` notes kept before they are cleared (a bound: tokens of released tasks are
/// removed on release; tasks that are never cancelled leave theirs until this is reached).
const PROGRESS_LIMIT: usize = 10_000;

/// Tracks what is still held or happening for tasks (see the module docs).
pub struct Releases {
    /// The registry that records the fact. Weak: the registry owns this tracker.
    registry: Weak<Registry>,
    quiet: Duration,
    tracks: Mutex<HashMap<Key, Track>>,
    /// How many tracked tasks are recorded cancelled (waiting for their release). Changed and
    /// read only with `tracks` locked.
    cancelled: AtomicUsize,
    /// `(upstream, progressToken JSON)` → taskId, for tasks not yet released.
    progress: Mutex<HashMap<(String, String), String>>,
}

#[derive(Default)]
struct Track {
    holds: usize,
    last_activity: Option<Instant>,
    cancelled: bool,
    /// Woken (one stored permit) when a hold drops or activity is noted.
    changed: Arc<Notify>,
}

/// A gateway-side resource held for a task (an open `tasks/result`, a relayed stream); dropping
/// it releases the hold.
pub struct ResourceHold {
    releases: Arc<Releases>,
    key: Key,
}

impl Drop for ResourceHold {
    fn drop(&mut self) {
        let mut tracks = self.releases.tracks.lock();
        if let Some(t) = tracks.get_mut(&self.key) {
            t.holds = t.holds.saturating_sub(1);
            t.last_activity = Some(Instant::now());
            t.changed.notify_one();
            if t.holds == 0 && !t.cancelled {
                tracks.remove(&self.key);
            }
        }
    }
}

impl Releases {
    /// A tracker reporting to `registry`; `quiet` is `tasks.release_quiet_ms`.
    pub fn new(registry: Weak<Registry>, quiet: Duration) -> Releases {
        Releases {
            registry,
            quiet,
            tracks: Mutex::new(HashMap::new()),
            cancelled: AtomicUsize::new(0),
            progress: Mutex::new(HashMap::new()),
        }
    }

    /// Whether any task recorded cancelled waits for its release: when none does, upstream
    /// activity needs no attention. Activity only moves a cancelled task's quiet window (and is
    /// counted after a cancel); a task held but not cancelled gets its window from the cancel
    /// itself. Why not "any task tracked": an open `tasks/result` holds its task, so its own
    /// answer (which names the task in its related-task `_meta`) was parsed into a `Value` for
    /// nothing on every task's last request (issue 15).
    pub fn awaits_activity(&self) -> bool {
        let _tracks = self.tracks.lock();
        self.cancelled.load(Ordering::Relaxed) > 0
    }

    /// Removes `key`'s track, with `tracks` locked.
    fn untrack(&self, tracks: &mut HashMap<Key, Track>, key: &Key) {
        if tracks.remove(key).is_some_and(|t| t.cancelled) {
            self.cancelled.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Takes a hold on `(upstream, task_id)` until the returned guard is dropped.
    pub fn hold(self: &Arc<Self>, upstream: &str, task_id: &str) -> ResourceHold {
        let key = (upstream.to_string(), task_id.to_string());
        self.tracks.lock().entry(key.clone()).or_default().holds += 1;
        ResourceHold {
            releases: self.clone(),
            key,
        }
    }

    /// Ties `notifications/progress` on `token` (its JSON text) to `task_id`.
    pub fn note_progress_token(&self, upstream: &str, token: String, task_id: &str) {
        let mut progress = self.progress.lock();
        if progress.len() >= PROGRESS_LIMIT {
            progress.clear();
        }
        progress.insert((upstream.to_string(), token), task_id.to_string());
    }

    /// The task a progress token (its JSON text) belongs to, if noted.
    pub fn task_of_progress(&self, upstream: &str, token: &str) -> Option<String> {
        self.progress
            .lock()
            .get(&(upstream.to_string(), token.to_string()))
            .cloned()
    }

    /// The upstream sent something about the task; returns true if the task is already
    /// recorded cancelled (the caller counts it as activity after cancel).
    pub fn activity(&self, upstream: &str, task_id: &str) -> bool {
        let mut tracks = self.tracks.lock();
        match tracks.get_mut(&(upstream.to_string(), task_id.to_string())) {
            Some(t) => {
                t.last_activity = Some(Instant::now());
                t.changed.notify_one();
                t.cancelled
            }
            None => false,
        }
    }

    /// Starts waiting for the release of a task just recorded cancelled (`reason` is the label
    /// used when it is released: `quiet`, or `restart` for records found at start-up).
    pub fn cancelled(self: &Arc<Self>, upstream: &str, task_id: &str, reason: ReleaseReason) {
        let key = (upstream.to_string(), task_id.to_string());
        {
            let mut tracks = self.tracks.lock();
            let t = tracks.entry(key.clone()).or_default();
            if !t.cancelled {
                t.cancelled = true;
                self.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            t.last_activity = Some(Instant::now());
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.clone();
        handle.spawn(async move { this.wait_for_release(key, reason).await });
    }

    /// Waits until the task has no holds and `quiet` has passed since its last activity: on
    /// the track's [`Notify`] while holds remain, then until the end of the quiet window
    /// (activity in between moves the end, and the waiter sleeps again).
    async fn wait_for_release(self: Arc<Self>, key: Key, reason: ReleaseReason) {
        enum Wait {
            Changed(Arc<Notify>),
            Sleep(Duration),
        }
        loop {
            let wait = {
                let tracks = self.tracks.lock();
                let Some(t) = tracks.get(&key) else { return };
                let since = t.last_activity.map(|l| l.elapsed()).unwrap_or(self.quiet);
                if t.holds > 0 {
                    Wait::Changed(t.changed.clone())
                } else if since >= self.quiet {
                    break;
                } else {
                    Wait::Sleep(self.quiet - since)
                }
            };
            match wait {
                // A permit stored by a drop between the check and here is not lost.
                Wait::Changed(n) => n.notified().await,
                Wait::Sleep(d) => tokio::time::sleep(d).await,
            }
        }
        self.untrack(&mut self.tracks.lock(), &key);
        self.progress
            .lock()
            .retain(|(up, _), t| !(*up == key.0 && *t == key.1));
        if let Some(registry) = self.registry.upgrade() {
            registry.record_released(&key.0, &key.1, reason).await;
        }
    }

    /// Forgets a task (its record was removed).
    pub fn forget(&self, upstream: &str, task_id: &str) {
        let key = (upstream.to_string(), task_id.to_string());
        self.untrack(&mut self.tracks.lock(), &key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream activity needs attention only while a task recorded cancelled waits for its
    /// release: not for a task that is only held (an open `tasks/result`), and no longer once
    /// the cancelled task is forgotten (or released).
    #[test]
    fn activity_matters_only_while_a_cancelled_task_waits() {
        let releases = Arc::new(Releases::new(Weak::new(), Duration::from_secs(60)));
        let hold = releases.hold("up", "t1");
        assert!(!releases.awaits_activity(), "held, not cancelled");
        // No runtime here: no waiter is spawned, the task stays tracked as cancelled.
        releases.cancelled("up", "t1", ReleaseReason::Quiet);
        releases.cancelled("up", "t1", ReleaseReason::Quiet);
        assert!(releases.awaits_activity());
        assert!(releases.activity("up", "t1"), "activity after the cancel");
        drop(hold);
        assert!(releases.awaits_activity(), "still waiting for the release");
        releases.forget("up", "t1");
        assert!(!releases.awaits_activity(), "counted once, gone once");
    }
}
