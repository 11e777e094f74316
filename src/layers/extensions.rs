//! Facts one layer hands to the others as typed extensions: down on the request
//! ([`crate::exchange::RequestParts::extensions`]), up on the reply
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

//! - [`SessionView`]: set by the session stage (`session_guard` on a request naming a session
//!   it let through, `session` on a 2025 request without one) when taskgate knows the caller's
//!   session: its owner, what the client declared, what the upstream declared, and a
//!   [`SessionTag`] by which a layer keeps something per session (`upgrade`'s tool cache)
//!   without reading the session table.
//! - [`UpstreamWithoutTasks`]: set by `session` on a 2025 `tasks/*` request whose upstream
//!   session advertised no `capabilities.tasks`: `tasks` then serves nothing itself and passes
//!   the request on.

//! - [`HeldSession`]: set by `held_sessions` on a request of a 2025 session taskgate holds
//!   itself (an upstream without 2025 sessions): what the client declared in its `initialize`,
//!   carried upstream in every request's `_meta`. The session table keeps it with the session.
//! - [`SessionsHeld`]: set by `held_sessions` on every 2025-11-25 request to an upstream whose
//!   2025 sessions taskgate holds: the `bridge` answers its `initialize` without asking the
//!   upstream for a session.
//! - [`ClientDeclares`]: set by `held_sessions` on the requests for which the `bridge` or the
//!   `relay` may ask the client for input (a held session's, a task-augmented `tools/call`, a
//!   bridged `tasks/result`): the input capabilities the client's session declared, so neither
//!   reads the session table.
//! - [`HeldAlive`]: set by `held_sessions` on a held session's GET stream and
//!   `resources/subscribe`: asks whether taskgate still holds a session (the held sessions'
//!   upstream stage's listen state drops what belongs to sessions that ended).

//! - [`OnBehalfOf`]: set by taskgate on a request it makes itself about a task it recorded (the
//!   cancel of an upgraded task orphaned by a restart): `tasks` authorises it as the record's
//!   owner instead of the (absent) client's.

//! - [`RelaysUpstreamRequests`]: set by `gateway_tasks` on the plain `tools/call` it holds for
//!   a 2026-07-28 client's gateway task, and on the answers to the server's requests it sends
//!   in that call's context: the reverse bridge passes the server's requests on that call's
//!   stream (it drops them for other 2026 calls) and sends those answers on the caller's
//!   upstream session (it drops a 2026 client's responses otherwise).
//! - [`PlainAnswerIsTask`]: set by `bridge` on the 2026-07-28 `tools/call` it sends for a
//!   2025-11-25 client: how `observe` is to read its answer (a plain result is a `completed`
//!   task). It carries the [`Fact`] `observe` fills with what it recorded.
//!
//! **Facts up** (reply extensions; none reaches the client):
//!
//! - [`crate::metrics::LocalReason`]: set on an answer taskgate gave itself
//!   ([`crate::exchange::McpReply::answered_locally`]); the edge takes it to count and log it.
//! - [`HoldSession`]: set by `bridge` on its reply to a 2025 `initialize` the upstream refused
//!   while it answered `server/discover` (or to any `initialize` once sessions are held): what
//!   `held_sessions` answers the client from (it mints the session id).
//! - [`HeldAnswer`]: set by `held_sessions` on the `initialize` answer it gave for a session
//!   taskgate holds itself; `session` takes it and stores the session.
//! - [`NeedsTask`]: set by `bridge` on the reply to a plain 2025-11-25 `tools/call`: filled when
//!   the 2026-07-28 server said the tool runs only as a task (`-32021` naming the tasks
//!   extension, which the 2025 client sees as `-32601`); `upgrade` reads it, not the error.
//! - [`SynthesizedTask`]: what `observe` recorded for a [`PlainAnswerIsTask`] request, handed
//!   to `bridge` in its [`Fact`].
//! - [`CancelFoundTerminal`]: set by `bridge` on its `-32602` answer to a 2025-11-25
//!   `tasks/cancel` whose task its 2026-07-28 server showed terminal, before any cancel went
//!   upstream (`cancel` counts it as its own answer, `outcome="rejected_terminal"`) or after
//!   its ack (counted `forwarded`, not as an upstream error).
//!
//! A fact about a message of an SSE reply is known only once that message has passed, after the
//! reply's head went up: such a fact travels as a [`Fact`], a cell the layer that learns it fills
//! as the message passes and the layer that wants it reads once it has read that message (as
//! hyper hands a later upgrade up in a response's extensions). Only the layer named for a fact
//! fills it.

use crate::exchange::Principal;
use crate::mcp::capabilities::ClientCapabilities;
use crate::registry::Reservation;
use crate::store::held::{MAX_HELD_CAPABILITIES, MAX_HELD_CLIENT_INFO};
use crate::store::TaskRecord;
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock, Weak};

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

/// Fact down, set by the session stage on a request of a session taskgate knows (see the module
/// docs): what the layers below act on, so none of them reads the session table. On every such
/// request, or with `[upgrade]` off on every one but a plain `tools/call` of a session taskgate
/// does not hold (`session::HandDown`: no layer reads it there).
#[derive(Debug, Clone)]
pub struct SessionView {
    /// The principal that initialized the session (its owner).
    pub owner: Principal,
    /// What the client declared in its `initialize` (none is kept for callers taskgate cannot
    /// tell apart: no session and no principal).
    pub client: ClientCapabilities,
    /// The upstream's `InitializeResult` declared `tasks.requests.tools.call`.
    pub upstream_tasks_tools_call: bool,
    /// The upstream's `InitializeResult` had capabilities without `tasks`.
    pub upstream_without_tasks: bool,
    /// The session itself, for as long as taskgate holds it.
    pub session: SessionTag,
}

/// Held by a session table entry for as long as the entry lives (until the session ends, is
/// reclaimed or is replaced by a new `initialize` under the same key): its [`SessionTag`]s then
/// read as ended. Clones share it; only the entry and its short-lived copies hold one.
#[derive(Debug, Clone, Default)]
pub struct SessionLife(Arc<()>);

impl SessionLife {
    /// A new session's life.
    pub fn new() -> SessionLife {
        SessionLife::default()
    }

    /// The tag the session's [`SessionView`]s carry.
    pub fn tag(&self) -> SessionTag {
        SessionTag(Arc::downgrade(&self.0))
    }
}

/// Names one session (one table entry, one life) for a layer that keeps something per session:
/// equal tags are the same session; [`SessionTag::ended`] once taskgate no longer holds it. A tag
/// keeps 16 bytes alive, not the session.
#[derive(Debug, Clone)]
pub struct SessionTag(Weak<()>);

impl SessionTag {
    /// Whether taskgate no longer holds the session.
    pub fn ended(&self) -> bool {
        self.0.strong_count() == 0
    }
}

impl PartialEq for SessionTag {
    fn eq(&self, other: &SessionTag) -> bool {
        Weak::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SessionTag {}

impl std::hash::Hash for SessionTag {
    /// By the life's address: unique while any tag of it exists (a tag keeps the allocation).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(self.0.as_ptr(), state)
    }
}

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

/// A fact about a reply's message, known once that message has passed the layer that fills it
/// (see the module docs): clones share one cell, filled at most once.
#[derive(Debug)]
pub struct Fact<T>(Arc<OnceLock<T>>);

impl<T> Clone for Fact<T> {
    fn clone(&self) -> Self {
        Fact(self.0.clone())
    }
}

impl<T> Default for Fact<T> {
    fn default() -> Self {
        Fact(Arc::default())
    }
}

impl<T> Fact<T> {
    /// Fills the cell (a second fill is ignored: the first fact stands).
    pub fn set(&self, fact: T) {
        let _ = self.0.set(fact);
    }

    /// The fact, once filled.
    pub fn get(&self) -> Option<&T> {
        self.0.get()
    }
}

/// Policy down, set by `bridge` on the 2026-07-28 `tools/call` it sends for a 2025-11-25
/// task-augmented one (beside its [`PendingCreation`]): a server that ran the call plainly
/// instead of creating a task has still answered a task, one already `completed`. `observe`
/// records it from the plain result and fills `recorded`.
#[derive(Debug, Clone, Default)]
pub struct PlainAnswerIsTask {
    /// Filled by `observe` once it recorded the task.
    pub recorded: Fact<SynthesizedTask>,
}

/// Fact up: the `completed` task `observe` recorded for a plain answer to a
/// [`PlainAnswerIsTask`] call (a taskId taskgate minted, `taskgate-<random>`; the result kept
/// as its `tasks/result` payload; `failed` for a 2025 client when the result `isError`).
#[derive(Debug, Clone)]
pub struct SynthesizedTask {
    /// The record as written.
    pub record: Arc<TaskRecord>,
}

/// Fact up, set by `bridge` on its `-32602` answer to a 2025-11-25 `tasks/cancel` of a bridged
/// task that its 2026-07-28 server showed terminal (`status`, as the 2025 client is told it):
/// when asked before the cancel (`sent: false`: no `tasks/cancel` went upstream, nothing was
/// cancelled; `cancel` counts it as its own answer for a terminal task, `rejected_terminal`),
/// or when asked again after the server acknowledged the cancel (`sent: true`: the task ended
/// otherwise first; counted `forwarded`, the upstream answered no error).
#[derive(Debug, Clone, Copy)]
pub struct CancelFoundTerminal {
    /// The terminal status the 2025 client is told.
    pub status: crate::mcp::task::TaskStatus,
    /// Whether the 2026 `tasks/cancel` was sent (and acknowledged).
    pub sent: bool,
}

/// Fact up, set by `bridge` on the reply to a plain 2025-11-25 `tools/call` and filled when the
/// 2026-07-28 server answered that the tool runs only as a task (its `-32021` naming the tasks
/// extension). `upgrade` reads this instead of the error the client is shown.
#[derive(Debug, Clone, Default)]
pub struct NeedsTask(pub Fact<()>);

/// Reply fact: this `initialize` answer is taskgate's own (`held_sessions`), for a 2025 session
/// taskgate holds itself (an upstream without 2025 sessions). The `session` layer takes it and
/// keeps the session ([`HeldSession`], written to the store before the session id goes on).
#[derive(Debug, Clone, Copy)]
pub struct HeldAnswer;

/// Policy down, set by `held_sessions` on every 2025-11-25 request to an upstream whose 2025
/// sessions taskgate holds (learned from the first [`HoldSession`] reply, kept for the
/// process's life).
#[derive(Debug, Clone, Copy)]
pub struct SessionsHeld;

/// Reply fact, set by `bridge` (its reply's body is empty): the upstream refused a 2025
/// `initialize` (or its sessions are held already) and answered `server/discover` with
/// `discovered` (its `result` object). `held_sessions` takes it and answers the `initialize`
/// itself with a session it mints (MCP 2025-11-25 lifecycle, from a 2026-07-28
/// `server/discover`).
#[derive(Debug, Clone)]
pub struct HoldSession {
    /// The `server/discover` result.
    pub discovered: Value,
    /// The upstream serves the 2026-07-28 tasks extension: the 2025 `capabilities.tasks` is
    /// added to the answer.
    pub modern_tasks: bool,
}

/// Policy down, set by `gateway_tasks` (see the module docs): the server's requests during a
/// gateway task's held call, and the client's answers to them, go through the reverse bridge
/// (issue 32: input during a gateway task, 2026-07-28 client on a 2025-11-25 server).
#[derive(Debug, Clone, Copy)]
pub struct RelaysUpstreamRequests;

/// Fact down, set by `held_sessions`: the input capabilities (`elicitation`, `sampling`,
/// `roots`, MCP 2025-11-25 client capabilities) the client declared in its `initialize`, as
/// its session (held or not) keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientDeclares {
    /// `capabilities.elicitation`.
    pub elicitation: bool,
    /// `capabilities.sampling`.
    pub sampling: bool,
    /// `capabilities.roots`.
    pub roots: bool,
}

impl ClientDeclares {
    /// Whether the client declared the capability at `pointer` (`"/elicitation"`,
    /// `"/sampling"`, `"/roots"`; any other reads as not declared).
    pub fn has(&self, pointer: &str) -> bool {
        match pointer {
            "/elicitation" => self.elicitation,
            "/sampling" => self.sampling,
            "/roots" => self.roots,
            _ => false,
        }
    }
}

/// Fact down, set by `held_sessions` on a held session's GET stream and
/// `resources/subscribe`: whether taskgate still holds a session (by its `Mcp-Session-Id`).
#[derive(Clone)]
pub struct HeldAlive(pub Arc<dyn Fn(&str) -> bool + Send + Sync>);

impl std::fmt::Debug for HeldAlive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeldAlive")
    }
}

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
