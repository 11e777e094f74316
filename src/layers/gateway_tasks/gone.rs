//! Client sessions whose upstream session is gone (the upstream restarted): a held call
//! answered HTTP 404 with a JSON-RPC error that says its session is not found
//! ([`lost_task::says_session_not_found`]: the TypeScript SDK's `-32001`, the Python SDK's
//! `-32600` "Session not found") fails its task (`held`), and its client session is remembered
//! here. From then on a task-augmented `tools/call` on that session is answered HTTP 404
//! `-32001` "Session not found" ([`McpError::SessionNotFound`], as taskgate answers an unknown
//! session elsewhere) instead of another `CreateTaskResult`: a 2025-11-25 client starts a new
//! session only when a request on its session gets a 404 (2025-11-25 basic/transports: Session
//! Management), and every gateway task it created on the dead session would fail again, for
//! ever.
//!
//! - **What else**: nothing. Every other request of the session that goes upstream already gets
//!   the upstream's own 404; `tasks/get`, `tasks/result` and `tasks/cancel` of the session's
//!   gateway tasks are answered from their records as before (their owner must still read how
//!   they failed; without auth that owner is the old session id, README "Who owns a task").
//! - **Why here, not in the session stage** (`session_guard`, `session`, which own the client
//!   sessions): the 404 reaches only the held call, which runs below them after the client's
//!   `CreateTaskResult` went up, so no reply fact can carry it to them; telling them otherwise
//!   is an arrow up the stack (`architecture_tests`) or a table one layer fills and another
//!   reads (ARCHITECTURE.md: none). And forgetting the session there would not do: without
//!   auth an unknown session id is forwarded, so its next task-augmented call would still reach
//!   this layer and become a task; and the failed tasks' owner (the old session id) would lose
//!   them. Only what this layer answers itself needs the memory, so it stays here.
//! - **Bounds and cost**: per upstream (one state per upstream's stack) at most
//!   [`LOST_SESSIONS`] ids of at most [`MAX_LOST_SESSION_ID`] bytes (128 KiB of ids at worst,
//!   about 10 KiB with the SDKs' 32- and 36-character ids), the oldest forgotten first (such
//!   a session then costs one more failed task before it is remembered again); a longer id is
//!   not remembered. One look-up, on the gateway-task creation path only.
//! - **Issued again**: an `initialize` answer naming a remembered id forgets it ([`issued`]):
//!   a server that numbers its sessions issues the old ids again after a restart.
//! - **Per process**: another replica of a tier learns it from its own held call.

use super::GatewayTasksState;
use crate::exchange::{McpReply, McpRequest, ReplyBody};
use crate::layers::lost_task;
#[cfg(doc)]
use crate::mcp::errors::McpError;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

/// Client sessions remembered gone per upstream, at most (the oldest forgotten first).
pub const LOST_SESSIONS: usize = 256;
/// The longest client session id remembered (the SDKs issue 32 or 36 characters).
pub const MAX_LOST_SESSION_ID: usize = 512;

/// The client sessions remembered gone, oldest first (see the module docs).
#[derive(Default)]
pub(super) struct Lost {
    set: HashSet<Arc<str>>,
    order: VecDeque<Arc<str>>,
}

impl Lost {
    /// Remembers `session` (not past [`MAX_LOST_SESSION_ID`]); whether it is new.
    fn insert(&mut self, session: &str) -> bool {
        if session.len() > MAX_LOST_SESSION_ID || self.set.contains(session) {
            return false;
        }
        while self.order.len() >= LOST_SESSIONS {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.set.remove(&oldest);
        }
        let session: Arc<str> = session.into();
        self.set.insert(session.clone());
        self.order.push_back(session);
        true
    }

    fn contains(&self, session: &str) -> bool {
        self.set.contains(session)
    }

    /// Forgets `session` (issued again).
    fn remove(&mut self, session: &str) {
        if self.set.remove(session) {
            self.order.retain(|s| &**s != session);
        }
    }
}

/// Forgets the session an `initialize` answer (`reply`) issues: an upstream may issue an id
/// again after a restart (2025-11-25 basic/transports asks only that ids SHOULD be globally
/// unique; servers that number their sessions do), and the client that initialized as the
/// 404 told it must not get the 404 again (review 21 #2). One look at the header; the set's
/// lock only while it holds anything.
pub(super) fn issued(state: &GatewayTasksState, reply: &McpReply) {
    let Some(session) = reply
        .headers
        .get(&crate::headers::MCP_SESSION_ID)
        .and_then(|v| v.to_str().ok())
    else {
        return;
    };
    let mut lost = state.lost_sessions.lock();
    if !lost.set.is_empty() {
        lost.remove(session);
    }
}

/// Whether `reply` (to a held call) is the upstream's HTTP 404 saying the call's session is
/// gone ([`lost_task::says_session_gone`], the body as JSON or as it came).
pub(super) fn says_session_gone(reply: &McpReply) -> bool {
    let (ReplyBody::Json(bytes) | ReplyBody::Raw(bytes)) = &reply.body else {
        return false;
    };
    lost_task::says_session_gone(reply.status, bytes)
}

/// Remembers the client session `session` (the held call's) as gone upstream.
pub(super) fn remember(state: &GatewayTasksState, upstream: &str, session: Option<&str>) {
    let Some(session) = session else {
        return;
    };
    if state.lost_sessions.lock().insert(session) {
        tracing::warn!(upstream = %upstream, "the upstream says a client session is gone (HTTP 404, session not found): its next task-augmented tools/call is answered 404 so that the client initializes again");
    }
}

/// Whether `req` (a 2025-11-25 task-augmented `tools/call`) is on a client session the upstream
/// said is gone.
pub(super) fn is_gone(state: &GatewayTasksState, req: &McpRequest) -> bool {
    let Some(session) = req
        .ctx
        .client_session_id
        .as_ref()
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    state.lost_sessions.lock().contains(session)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_sessions_are_bounded_oldest_first() {
        let mut lost = Lost::default();
        assert!(lost.insert("a"));
        assert!(!lost.insert("a"), "once");
        lost.remove("a");
        assert!(!lost.contains("a"), "issued again");
        assert!(lost.insert("a"));
        for n in 1..LOST_SESSIONS {
            assert!(lost.insert(&format!("s{n}")));
        }
        assert!(lost.contains("a"));
        assert!(lost.insert("one more"));
        assert!(!lost.contains("a"), "the oldest forgotten");
        assert!(lost.contains("s1") && lost.contains("one more"));
        assert_eq!(
            (lost.set.len(), lost.order.len()),
            (LOST_SESSIONS, LOST_SESSIONS)
        );
        assert!(
            !lost.insert(&"x".repeat(MAX_LOST_SESSION_ID + 1)),
            "too long"
        );
    }
}
