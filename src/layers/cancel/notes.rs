//! `notifications/cancelled` routing (see the `cancel` module docs): the facts about client
//! requests it needs, named by who sent them ([`Caller`] and id), bounded.

use super::CancelState;
use crate::exchange::{Caller, McpReply, McpRequest, Operation};
use crate::jsonrpc::{Id, Kind};
use crate::layers::extensions::PendingCreation;
use crate::metrics::DropReason;
use http::HeaderValue;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

/// A client request, named by who sent it.
pub(super) type RequestKey = (Caller, Id);

/// Entries a note table holds before it is cleared (a `notifications/cancelled` comes right
/// after its request, not 10,000 requests later).
pub(super) const NOTES_LIMIT: usize = 10_000;

/// Facts about client requests needed to route `notifications/cancelled` (bounded).
#[derive(Default)]
pub(super) struct CancelNotes {
    /// Caller (with the session its `initialize` opened) → that `initialize`'s id.
    initialize: HashMap<Caller, Id>,
    /// Task-augmented requests → the taskId once `observe` recorded their creation.
    creations: HashMap<RequestKey, Arc<OnceLock<String>>>,
    /// Requests routed to another upstream session than the client's → that session.
    in_flight: HashMap<RequestKey, Option<HeaderValue>>,
    /// Requests already cancelled once.
    forwarded: HashSet<RequestKey>,
}

fn bounded_insert<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>, k: K, v: V) {
    if map.len() >= NOTES_LIMIT {
        map.clear();
    }
    map.insert(k, v);
}

/// Removes a request from the in-flight table when its reply is finished: at once for JSON,
/// when the stream ends for SSE.
pub(super) struct InFlightGuard {
    pub(super) state: Arc<CancelState>,
    pub(super) key: RequestKey,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.state.notes.lock().in_flight.remove(&self.key);
    }
}

impl CancelState {
    /// Remembers the `initialize` id of a caller (its principal and the session the
    /// `initialize` opened, from the reply).
    pub(super) fn note_initialize(&self, caller: Caller, reply: &McpReply, id: Id) {
        // A copy: a clone would be a slice of hyper's read buffer of the upstream connection
        // (kilobytes), kept alive as long as the note: about 5 kB per session, left behind
        // after the session ended (issue 29 item 16).
        let caller = Caller {
            principal: caller.principal,
            client_session: crate::headers::find(&reply.headers, &crate::headers::MCP_SESSION_ID)
                .map(crate::headers::owned),
        };
        bounded_insert(&mut self.notes.lock().initialize, caller, id);
    }

    /// Forgets every note of a caller whose session ended (a DELETE the upstream accepted, or
    /// answered 404): nothing sent on that session can be cancelled any more, and its notes
    /// would stay until their table is next cleared. A caller without a session is left alone
    /// (its notes are shared with every caller like it).
    pub(super) fn forget_session(&self, caller: &Caller) {
        if caller.client_session.is_none() {
            return;
        }
        let mut notes = self.notes.lock();
        notes.initialize.remove(caller);
        notes.creations.retain(|(c, _), _| c != caller);
        notes.in_flight.retain(|(c, _), _| c != caller);
        notes.forwarded.retain(|(c, _)| c != caller);
    }

    /// The session ids of the `initialize` notes, for tests.
    #[cfg(test)]
    pub(super) fn noted_sessions(&self) -> Vec<HeaderValue> {
        let notes = self.notes.lock();
        notes
            .initialize
            .keys()
            .filter_map(|c| c.client_session.clone())
            .collect()
    }

    /// How many notes are kept (all tables), for tests.
    #[cfg(test)]
    pub(super) fn notes_len(&self) -> usize {
        let notes = self.notes.lock();
        notes.initialize.len()
            + notes.creations.len()
            + notes.in_flight.len()
            + notes.forwarded.len()
    }

    /// Remembers a task-augmented request: once `observe` records its creation, a
    /// `notifications/cancelled` for it is dropped.
    pub(super) fn note_creation(&self, req: &McpRequest) {
        let (Some(pending), Some(id)) = (req.extensions.get::<PendingCreation>(), req.id()) else {
            return;
        };
        // Kept after the request (until its creation is recorded and cancelled, or the table
        // is cleared): detached from the request's read buffer.
        let key = (req.ctx.caller().detached(), id.clone());
        bounded_insert(
            &mut self.notes.lock().creations,
            key,
            pending.created.clone(),
        );
    }

    /// Notes a client request (with an id) going upstream on another session than the client's;
    /// returns its in-flight key.
    pub(super) fn note_request(&self, req: &McpRequest) -> Option<RequestKey> {
        let Operation::Post(msg) = &req.op else {
            return None;
        };
        if msg.kind() != Kind::Request {
            return None;
        }
        // Only requests the `tasks` layer routed to another upstream session need a note: a
        // notifications/cancelled for any other request reaches it on the client's own session.
        if req.ctx.session_id == req.ctx.client_session_id {
            return None;
        }
        let key = (req.ctx.caller(), msg.id()?.clone());
        bounded_insert(
            &mut self.notes.lock().in_flight,
            key.clone(),
            req.ctx.session_id.clone(),
        );
        Some(key)
    }

    /// Decides what to do with a client's `notifications/cancelled`; returns the drop reason, or
    /// `None` to forward it (possibly re-routed to another upstream session).
    pub(super) fn route_cancelled(&self, req: &mut McpRequest) -> Option<DropReason> {
        // As the edge classified it (`mcp::classify`).
        let Some(request_id) = req.classified().and_then(|c| c.request_id()) else {
            // Without a requestId nothing can be cancelled; the receiver ignores it anyway.
            return None;
        };
        let caller = req.ctx.caller();
        let mut notes = self.notes.lock();
        if notes.initialize.get(&caller) == Some(&request_id) {
            return Some(DropReason::Initialize);
        }
        let key = (caller, request_id);
        if notes.creations.get(&key).is_some_and(|c| c.get().is_some()) {
            return Some(DropReason::Task);
        }
        if key.0.is_identified() && notes.forwarded.contains(&key) {
            return Some(DropReason::Duplicate);
        }
        if notes.forwarded.len() >= 100_000 {
            notes.forwarded.clear();
        }
        if let Some(target) = notes.in_flight.get(&key) {
            req.ctx.session_id = target.clone();
        }
        // Kept until the table is cleared (100,000): detached from the request's read buffer.
        notes.forwarded.insert((key.0.detached(), key.1));
        None
    }
}
