//! Facts one layer hands to the others as typed extensions: down on the request
//! ([`crate::exchange::McpRequest::extensions`]), up on the reply
//! ([`crate::exchange::McpReply::extensions`], as `http::Response` carries them), never through
//! tables an outer layer reads back nor through private headers.
//!
//! **Facts down** (request extensions):
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

//! - [`HeldSession`]: set by `bridge` on a request of a 2025 session taskgate holds itself (an
//!   upstream without 2025 sessions): what the client declared in its `initialize`, carried
//!   upstream in every request's `_meta`. The session table keeps it with the session.

//! - [`OnBehalfOf`]: set by taskgate on a request it makes itself about a task it recorded (the
//!   cancel of an upgraded task orphaned by a restart): `tasks` authorises it as the record's
//!   owner instead of the (absent) client's.

//! **Facts up** (reply extensions; none reaches the client):
//!
//! - [`crate::metrics::LocalReason`]: set on an answer taskgate gave itself
//!   ([`crate::exchange::McpReply::answered_locally`]); the edge takes it to count and log it.
//! - [`HeldAnswer`]: set by `bridge` on the `initialize` answer it gave for a session it holds
//!   itself; `session` takes it and stores the session.

use crate::registry::Reservation;
use crate::store::held::{MAX_HELD_CAPABILITIES, MAX_HELD_CLIENT_INFO};
use crate::store::TaskRecord;
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};

/// The `upgrade` layer's own `tools/call`: a plain call it turned into a task.
#[derive(Debug, Clone, Copy)]
pub struct Upgraded;

/// A `tasks/get|result|cancel` the `tasks` layer authorised, with the record it read then.
#[derive(Debug, Clone)]
pub struct AuthorisedTask {
    /// The task's record when the request was authorised, shared with the record cache (the
    /// layers below read it; nobody changes it).
    pub record: Arc<TaskRecord>,
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

/// A request taskgate makes itself about one of its recorded tasks, with no client behind it:
/// the `tasks` layer authorises it as `0`, the owner the record names, in both eras (issue 37
/// #3: the orphan cancel after a restart was refused `-32602` by taskgate's own owner check).
/// Only taskgate's own code sets it; the edge never does, so no client can claim an owner.
#[derive(Debug, Clone)]
pub struct OnBehalfOf(pub crate::store::Owner);

/// A 2025-11-25 `tasks/*` request on an upstream session whose `InitializeResult` advertised no
/// `capabilities.tasks`: there are no tasks there for taskgate to answer about.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamWithoutTasks;

/// A 2025-11-25 session taskgate holds itself for an upstream without 2025 sessions (see the
/// `bridge` layer, "held sessions"): what every request of the session carries upstream in its
/// 2026-07-28 `_meta`.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldSession {
    /// `io.modelcontextprotocol/clientCapabilities`: the client's `initialize`
    /// `params.capabilities` (an object; the 2025 `tasks` member removed: 2026-07-28 tasks are
    /// the extension, declared per request where the bridge wants a task).
    pub client_capabilities: Value,
    /// `io.modelcontextprotocol/clientInfo`: the client's `params.clientInfo`, when it gave one.
    pub client_info: Option<Value>,
}

impl HeldSession {
    /// What to keep of a 2025 `initialize` request's `params` (bounded: see
    /// [`MAX_HELD_CAPABILITIES`], [`MAX_HELD_CLIENT_INFO`]).
    pub fn from_initialize(params: Option<&Value>) -> HeldSession {
        let mut caps = match params.and_then(|p| p.get("capabilities")) {
            Some(Value::Object(m)) => m.clone(),
            _ => serde_json::Map::new(),
        };
        caps.remove("tasks");
        if Value::Object(caps.clone()).to_string().len() > MAX_HELD_CAPABILITIES {
            let names = ["elicitation", "sampling", "roots"];
            caps.retain(|k, _| names.contains(&k.as_str()));
            for v in caps.values_mut() {
                *v = json!({});
            }
        }
        let client_info = params
            .and_then(|p| p.get("clientInfo"))
            .filter(|i| i.is_object() && i.to_string().len() <= MAX_HELD_CLIENT_INFO)
            .cloned();
        HeldSession {
            client_capabilities: Value::Object(caps),
            client_info,
        }
    }
}

/// Reply fact: this `initialize` answer is the `bridge`'s own, for a 2025 session taskgate holds
/// itself (an upstream without 2025 sessions). The `session` layer takes it and keeps the
/// session ([`HeldSession`], written to the store before the session id goes on).
#[derive(Debug, Clone, Copy)]
pub struct HeldAnswer;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_session_keeps_bounded_capabilities() {
        let p = json!({"capabilities": {"elicitation": {"form": {}}, "tasks": {"list": {}}},
            "clientInfo": {"name": "c", "version": "1"}});
        let h = HeldSession::from_initialize(Some(&p));
        assert_eq!(h.client_capabilities, json!({"elicitation": {"form": {}}}));
        assert_eq!(h.client_info, Some(json!({"name": "c", "version": "1"})));
        let big = "x".repeat(MAX_HELD_CAPABILITIES);
        let p = json!({"capabilities": {"sampling": {"big": big}, "experimental": {"a": 1}},
            "clientInfo": {"name": big}});
        let h = HeldSession::from_initialize(Some(&p));
        assert_eq!(h.client_capabilities, json!({"sampling": {}}));
        assert_eq!(h.client_info, None);
        assert_eq!(
            HeldSession::from_initialize(None).client_capabilities,
            json!({})
        );
    }
}
