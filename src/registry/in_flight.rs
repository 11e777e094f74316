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
//! - [`CreationsInFlight::begin`]: a creation the client asked for (`params.task`) is counted,
//!   per upstream session, while its answer is awaited and recorded ([`InFlight`], given back
//!   on drop).
//! - [`CreationsInFlight::refused`]: the task ids taskgate cancelled upstream unrecorded, the
//!   last [`REFUSED_KEPT`] per upstream.
//! - [`CreationsInFlight::settle`]: a notification about an unrecorded task on another stream
//!   waits, at most [`SETTLE_WAIT`], until that task is recorded or refused, or no creation is
//!   in flight that it could be about: on the stream's upstream session when the stream has one
//!   (a 2025-11-25 server reports on a session's streams only that session's tasks), on its
//!   upstream otherwise. One slow creation so holds back only its own session's notifications,
//!   not every other client's on that upstream (review 17 #11).
//!
//! 2026-07-28 creations (a plain `tools/call` the server makes a task of) are not counted: a
//! 2026 server reports a task on another stream only on a `subscriptions/listen` naming its
//! `taskId`, which a client can only name once it got the `CreateTaskResult`, recorded before
//! it was passed on (and `tasks` removes unrecorded ids from the subscription). A notification
//! about an unrecorded task there races no creation: it passes at once, as before.
//!
//! The common path pays nothing: only a creation the client asked for takes a lock, once.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
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
struct UpstreamCreations {
    /// The creations in flight per upstream session (`""`: none); a session with none is
    /// removed (the map holds only sessions with a creation in flight).
    in_flight: Mutex<HashMap<Box<str>, usize>>,
    refused: Mutex<VecDeque<String>>,
    /// Woken when a creation settles or a task is refused.
    settled: tokio::sync::Notify,
}

/// A creation counted in flight on its upstream session until this is dropped (after its
/// answer was recorded, or refused, or the exchange ended without one).
pub struct InFlight {
    of: Arc<UpstreamCreations>,
    session: Box<str>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        {
            let mut in_flight = self.of.in_flight.lock();
            if let Some(n) = in_flight.get_mut(&self.session) {
                *n -= 1;
                if *n == 0 {
                    in_flight.remove(&self.session);
                }
            }
        }
        self.of.settled.notify_waiters();
    }
}

impl UpstreamCreations {
    /// Whether a creation is in flight on `session` (`None`: on any session of the upstream).
    fn in_flight_on(&self, session: Option<&str>) -> bool {
        let in_flight = self.in_flight.lock();
        match session {
            Some(s) => in_flight.contains_key(s),
            None => !in_flight.is_empty(),
        }
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
    /// Neither, none in flight on the stream's own session, but creations are in flight on
    /// other sessions of its upstream: it may be one of theirs, which must not reach this
    /// session before its record (and the owner rule) says whose it is (review 18b #3: the
    /// per-session wait let session A's new task through on session B's stream).
    InFlightElsewhere,
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

    /// Counts a creation on `upstream`, sent on its upstream `session` (`None`: sessionless),
    /// in flight until the returned guard is dropped.
    pub fn begin(&self, upstream: &str, session: Option<&str>) -> InFlight {
        let u = self.upstream(upstream);
        let session: Box<str> = session.unwrap_or_default().into();
        *u.in_flight.lock().entry(session.clone()).or_default() += 1;
        InFlight { of: u, session }
    }

    /// Whether a creation is in flight on `upstream`'s `session` (`None`: on any of its
    /// sessions).
    pub fn in_flight(&self, upstream: &str, session: Option<&str>) -> bool {
        let Some(u) = self.upstreams.lock().get(upstream).cloned() else {
            return false;
        };
        u.in_flight_on(session)
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
    /// refused, or no creation is in flight on `upstream`'s `session` (the upstream session of
    /// the stream the notification came on; `None`: on any of `upstream`'s sessions).
    /// `recorded` is asked again each time a creation settles.
    pub async fn settle<F, Fut>(
        &self,
        upstream: &str,
        session: Option<&str>,
        task_id: &str,
        mut recorded: F,
    ) -> Settled
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
            if !u.in_flight_on(session) {
                if session.is_some() && u.in_flight_on(None) {
                    return Settled::InFlightElsewhere;
                }
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
    use futures_util::FutureExt;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A waiter whose task is recorded (`recorded` set) once `settle` asks again; `asked`
    /// counts how often it asked.
    fn waiter(
        c: &Arc<CreationsInFlight>,
        session: Option<&'static str>,
        recorded: &Arc<AtomicBool>,
        asked: &Arc<AtomicUsize>,
    ) -> tokio::task::JoinHandle<Settled> {
        let (c, recorded, asked) = (c.clone(), recorded.clone(), asked.clone());
        tokio::spawn(async move {
            c.settle("up", session, "t1", || {
                asked.fetch_add(1, Ordering::AcqRel);
                let r = recorded.load(Ordering::Acquire);
                async move { r }
            })
            .await
        })
    }

    /// Review 17 #16: the waiter has asked and is still pending while its session's creation is
    /// in flight (time paused: nothing but the guard can end the wait before `SETTLE_WAIT`),
    /// and settles `Recorded` once the guard is dropped after the record.
    #[tokio::test(start_paused = true)]
    async fn a_notification_waits_for_the_creation_in_flight() {
        let c = Arc::new(CreationsInFlight::default());
        let guard = c.begin("up", Some("s1"));
        let recorded = Arc::new(AtomicBool::new(false));
        let asked = Arc::new(AtomicUsize::new(0));
        let mut waiting = waiter(&c, Some("s1"), &recorded, &asked);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        tokio::time::advance(SETTLE_WAIT / 2).await;
        assert_eq!(
            asked.load(Ordering::Acquire),
            1,
            "it asked once, then waited"
        );
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "it waits while the creation is in flight"
        );
        recorded.store(true, Ordering::Release);
        drop(guard);
        assert_eq!(waiting.await.unwrap(), Settled::Recorded);
        assert_eq!(asked.load(Ordering::Acquire), 2);
    }

    /// Review 17 #11: a creation in flight on one upstream session holds back no notification on
    /// another session's stream (it is not passed on at once: it may be that creation's task,
    /// review 18b #3); a stream without a known session waits for any; and the wait ends at
    /// `SETTLE_WAIT` when nothing settles.
    #[tokio::test(start_paused = true)]
    async fn only_the_streams_own_session_waits() {
        let c = Arc::new(CreationsInFlight::default());
        let _guard = c.begin("up", Some("s1"));
        let never = Arc::new(AtomicBool::new(false));
        let asked = Arc::default();
        let other = waiter(&c, Some("s2"), &never, &asked);
        assert_eq!(other.await.unwrap(), Settled::InFlightElsewhere, "at once");
        let start = tokio::time::Instant::now();
        let any = waiter(&c, None, &never, &asked);
        assert_eq!(any.await.unwrap(), Settled::Unrecorded);
        assert!(
            start.elapsed() >= SETTLE_WAIT,
            "it waited for s1's creation"
        );
        assert!(c.upstream("up").in_flight_on(Some("s1")));
        drop(_guard);
        assert!(
            !c.upstream("up").in_flight_on(None),
            "nothing left in flight"
        );
    }

    #[tokio::test]
    async fn refused_tasks_are_known_and_bounded() {
        let c = CreationsInFlight::default();
        let _guard = c.begin("up", None);
        c.refused("up", "t1");
        assert!(c.was_refused("up", "t1"));
        assert!(!c.was_refused("other", "t1"));
        let settled = c.settle("up", None, "t1", || async { false }).await;
        assert_eq!(settled, Settled::Refused);
        for i in 0..REFUSED_KEPT {
            c.refused("up", &format!("x{i}"));
        }
        assert!(!c.was_refused("up", "t1"), "the oldest is forgotten");
    }

    #[tokio::test]
    async fn nothing_in_flight_settles_at_once() {
        let c = CreationsInFlight::default();
        let settled = c.settle("up", Some("s1"), "t1", || async { false }).await;
        assert_eq!(settled, Settled::Unrecorded);
    }
}
