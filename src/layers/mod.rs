//! One tower layer per concern. A request goes down the stack once; its reply comes back up
//! once. Facts travel down as typed request extensions ([`extensions`]); facts about tasks are
//! applied to the registry ([`crate::registry`], not a layer) in one place, `observe`.
//!
//! Order, outermost first (assembled per upstream in `gateway`):
//! 0. `session_guard`: a session id is only usable by the principal that initialized it (404
//!    otherwise); an `initialize` carries no session id upstream.
//! 1. `session`: what is known of each session (its owner, what the client and the upstream
//!    declared), kept from `initialize` and handed down on every request of the session as the
//!    `SessionView` fact (with `session_guard`, the session stage: the table is read once per
//!    request, and by no layer below but `held_sessions`).
//! 2. `upgrade`: plain calls to `required` tools become tasks; it follows them with its own
//!    `tools/list`, `tasks/get`, `tasks/result` and `tasks/cancel` requests, sent into the rest of
//!    the stack as the client's (carrying its `SessionView`), so they are authorised, routed,
//!    single-flighted and observed like any client's. It owns its tool cache (`taskSupport` per
//!    tool and session), learned from the `tools/list` answers that pass through it, its own
//!    included: that is why `session` can sit outside it.
//! 3. `tasks`: policy: owner limit, ttl cap, authorise `tasks/*`, route to the task's session,
//!    `tasks/list`, hiding `tasks.list` when callers cannot be told apart.
//! 4. `cancel`: single-flight `tasks/cancel`, the terminal check, `notifications/cancelled`
//!    routing.
//!    Right below it, `gateway_tasks`: for an upstream with `tasks = "gateway"`, taskgate runs
//!    the tasks of a server without task support itself (below `cancel`, whose single-flight
//!    brings it one `tasks/cancel` per task; above `held_sessions` and `bridge`, so the plain
//!    call it holds goes upstream like a client's; it records through the registry's status
//!    machine).
//! 5. `held_sessions`: 2025 sessions taskgate holds for an upstream without them (looked up,
//!    `initialize` answered with an id it mints); below `cancel`, so a held session's requests
//!    (`upgrade`'s own included) pass owner binding, routing and single-flight like any other;
//!    it hands the bridge typed facts, so the bridge reads no session table.
//! 6. `bridge`: a 2025-11-25 client's task requests to a 2026-07-28 task server translated
//!    (below `cancel`, so single-flight and the terminal check stay in the client's era; above
//!    `observe`, which records what actually went upstream). It calls `relay` (not a layer of
//!    the stack: a stage handed to the bridge per upstream) for input a 2026 upstream asks a
//!    2025 client for (`input_required`, MRTR).
//!    Right below it, `held_sessions::upstream`: where a held session's requests go (the ones
//!    the bridge passes on in their 2025 form: stateless 2026 requests, kept in flight for
//!    `notifications/cancelled`, MRTR relayed; notifications, `ping`, DELETE answered; the GET
//!    stream as `subscriptions/listen`). The held session is on both sides of the bridge.
//! 7. `observe`: innermost but for `ids`: every upstream message passes it
//!    once. It records creations, applies statuses, notes activity, holds resources and rewrites
//!    terminal statuses. Being below `cancel`, it has applied an SSE `tasks/cancel` answer
//!    before `cancel` reads it from the stream, so a finished flight has applied its answer
//!    before it leaves the flight table.
//! 8. `ids`: below `observe`, just above the upstream client: a request id is in flight at most
//!    once per 2025 upstream session (a client's reuse refused, another caller's id collision sent
//!    under a minted id and answered under the client's), and a `notifications/cancelled` reaches
//!    only its sender's request. `observe` above it sees the clients' ids.
//!
//! Not layers: `own_request`, how the requests taskgate sends on its own are built (the
//! id, the context and routing headers, the body) and their answers read; `lost_task`, whether
//! an upstream lost a task (a `-32602` confirmed with taskgate's own clean `tasks/get`), which
//! `tasks` and `cancel` share. A layer names only layers below it, and these (the architecture
//! test checks it).
//!
//! Each module's doc says which messages it touches.

mod after;
pub mod bridge;
pub mod cancel;
pub(crate) mod cancel_ack;
pub mod extensions;
pub mod gateway_tasks;
pub mod held_sessions;
pub mod ids;
pub(crate) mod lost_task;
pub mod observe;
pub(crate) mod own_request;
pub mod relay;
pub mod session;
pub mod session_guard;
pub mod tasks;
pub mod upgrade;

#[cfg(test)]
pub(crate) mod testing;

use crate::exchange::{GatewayError, McpReply, McpRequest};

/// The service below a layer: one MCP exchange in, its reply out, cloneable and shareable across
/// tasks. An alias for the long `tower::Service` bound, with a blanket impl (so every such
/// service, [`crate::exchange::McpStack`] included, is one).
pub trait McpService:
    tower::Service<McpRequest, Response = McpReply, Error = GatewayError, Future: Send + 'static>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> McpService for S where
    S: tower::Service<
            McpRequest,
            Response = McpReply,
            Error = GatewayError,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}
