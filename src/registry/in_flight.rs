//! Creations in flight, and the tasks taskgate refused: what a task notification about a task
//! that is not recorded waits for, and whether it may pass (break-tasks H4; DESIGN.md "Task
//! registry": a record is durable before the client sees its `taskId`).
//!
//! An upstream may name a new task before its `CreateTaskResult` is recorded: on the
//! creation's own stream (server-everything sends `working` first), or on the session's GET
//! stream (the TypeScript SDK 1.x server sends a quick task's `completed` there as it ends,
//! racing the record). And it may go on reporting a task taskgate refused (over
//! `tasks.max_live_tasks_per_owner`) or never recorded (the client went away), which taskgate
//! cancelled upstream: its id must not reach a client.
//!
//! - [`CreationsInFlight::begin`]: a creation the client asked for (`params.task`) is counted
//!   while its answer is awaited and recorded ([`InFlight`], given back on drop).
//! - [`CreationsInFlight::refused`]: the task ids taskgate cancelled upstream unrecorded, the
//!   last [`REFUSED_KEPT`] per upstream.
//! - [`CreationsInFlight::settle`]: a notification about an unrecorded task on another stream
//!   waits, at most [`SETTLE_WAIT`], until that task is recorded or refused, or no creation is
//!   in flight on its upstream.
//!
//! The common path pays nothing: only a creation the client asked for takes a lock, once.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a task notification about an unrecorded task waits for the creations in flight on
/// its upstream to settle (a `CreateTaskResult` is recorded within milliseconds of its answer).
pub const SETTLE_WAIT: Duration = Duration::from_secs(2);

/// How many refused task ids are kept per upstream (a bounded memory: an upstream that goes
/// on naming an older refused task gets it passed as an unrecorded one).
pub const REFUSED_KEPT: usize = 1024;

/// The creations in flight and the refused tasks of every upstream.
#[derive(Default)]
pub struct CreationsInFlight {
    upstreams: Mutex<HashMap<Arc<str>, Arc<UpstreamCreations>>>,
}

/// One upstream's creations in flight and refused tasks.
#[derive(Default)]
pub struct UpstreamCreations {
    in_flight: AtomicUsize,
    refused: Mutex<VecDeque<String>>,
    /// Woken when a creation settles or a task is refused.
    settled: tokio::sync::Notify,
}

/// A creation counted in flight on its upstream until this is dropped (after its answer was
/// recorded, or refused, or the exchange ended without one).
pub struct InFlight(Arc<UpstreamCreations>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.settled.notify_waiters();
    }
}

/// What [`CreationsInFlight::settle`] found about a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Recorded (or its record could not be read: the caller reads it again).
    Recorded,
    /// taskgate cancelled it upstream unrecorded: its notifications must not pass.
    Refused,
    /// Neither, and no creation it could belong to is in flight (or [`SETTLE_WAIT`] passed).
    Unrecorded,
}

impl CreationsInFlight {
    fn upstream(&self, upstream: &str) -> Arc<UpstreamCreations> {
        let mut upstreams = self.upstreams.lock();
        if let Some(u) = upstreams.get(upstream) {
            return u.clone();
        }
        let u = Arc::new(UpstreamCreations::default());
        upstreams.insert(Arc::from(upstream), u.clone());
        u
    }

    /// Counts a creation on `upstream` in flight until the returned guard is dropped.
    pub fn begin(&self, upstream: &str) -> InFlight {
        let u = self.upstream(upstream);
        u.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(u)
    }

    /// Notes `task_id` of `upstream` as cancelled upstream unrecorded (the last
    /// [`REFUSED_KEPT`] are kept).
    pub fn refused(&self, upstream: &str, task_id: &str) {
        let u = self.upstream(upstream);
        {
            let mut refused = u.refused.lock();
            if refused.len() >= REFUSED_KEPT {
                refused.pop_front();
            }
            refused.push_back(task_id.to_string());
        }
        u.settled.notify_waiters();
    }

    /// Whether `task_id` of `upstream` was cancelled upstream unrecorded (one of the last
    /// [`REFUSED_KEPT`]).
    pub fn was_refused(&self, upstream: &str, task_id: &str) -> bool {
        let Some(u) = self.upstreams.lock().get(upstream).cloned() else {
            return false;
        };
        let refused = u.refused.lock();
        refused.iter().any(|t| t == task_id)
    }

    /// Waits, at most [`SETTLE_WAIT`], until `recorded()` says the task is recorded, or it was
    /// refused, or no creation is in flight on `upstream`. `recorded` is asked again each time
    /// a creation settles.
    pub async fn settle<F, Fut>(&self, upstream: &str, task_id: &str, mut recorded: F) -> Settled
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let u = self.upstream(upstream);
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        loop {
            // Registered before the checks: a creation settling in between still wakes it.
            let notified = u.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if u.refused.lock().iter().any(|t| t == task_id) {
                return Settled::Refused;
            }
            if recorded().await {
                return Settled::Recorded;
            }
            if u.in_flight.load(Ordering::Acquire) == 0 {
                return Settled::Unrecorded;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Settled::Unrecorded;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_notification_waits_for_the_creation_in_flight() {
        let c = Arc::new(CreationsInFlight::default());
        let guard = c.begin("up");
        let recorded = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waiter = {
            let (c, recorded) = (c.clone(), recorded.clone());
            tokio::spawn(async move {
                c.settle("up", "t1", || {
                    let r = recorded.load(Ordering::Acquire);
                    async move { r }
                })
                .await
            })
        };
        tokio::task::yield_now().await;
        recorded.store(true, Ordering::Release);
        drop(guard);
        assert_eq!(waiter.await.unwrap(), Settled::Recorded);
    }

    #[tokio::test]
    async fn refused_tasks_are_known_and_bounded() {
        let c = CreationsInFlight::default();
        let _guard = c.begin("up");
        c.refused("up", "t1");
        assert!(c.was_refused("up", "t1"));
        assert!(!c.was_refused("other", "t1"));
        let settled = c.settle("up", "t1", || async { false }).await;
        assert_eq!(settled, Settled::Refused);
        for i in 0..REFUSED_KEPT {
            c.refused("up", &format!("x{i}"));
        }
        assert!(!c.was_refused("up", "t1"), "the oldest is forgotten");
    }

    #[tokio::test]
    async fn nothing_in_flight_settles_at_once() {
        let c = CreationsInFlight::default();
        let settled = c.settle("up", "t1", || async { false }).await;
        assert_eq!(settled, Settled::Unrecorded);
    }
}
