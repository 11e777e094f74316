//! The `bridge` layer: a 2025-11-25 client on a 2026-07-28 task server (DESIGN.md "Two eras,
//! one gateway"; MCP 2026-07-28 tasks extension `io.modelcontextprotocol/tasks`, SEP-2663).
//!
//! It sits below `cancel` and above `observe`: the layers above it see the client's era (2025
//! `tasks/*`, owner binding, single-flight cancel, `-32602` for a terminal cancel, `tasks/list`
//! from the registry), `observe` sees what actually goes upstream (2026 requests, flat
//! `CreateTaskResult`s, `DetailedTask`s) and records it as for a 2026 client.
//!
//! **The upstream's era** ([`UpstreamEra`]): one fact per upstream, shared with `reverse` (see
//! `era`: configured by `upstream.protocol`, or under `"auto"` learned once from taskgate's own
//! `server/discover`, asked by the first `initialize` or task request that needs it). 2025
//! requests are bridged when it is [`UpstreamEra::ModernTasks`]; while it is unknown (a
//! discovery unanswered in time, asked again after [`UNANSWERED_RETRY`]) nothing is.
//!
//! Whether taskgate holds 2025 sessions itself (see `crate::layers::held_sessions`,
//! which keeps that fact) is learned apart from the era: the first `initialize` the upstream
//! refuses while it answers `server/discover` (`"auto"` and `"2026-07-28"` alike;
//! `"2025-11-25"` never holds sessions).
//!
//! **Dual-era upstreams** (FastMCP 4 serves 2025 `initialize` sessions and stateless 2026
//! requests on one endpoint): the 2025 client keeps its upstream session for everything that is
//! not a task (`initialize`, `tools/list`, plain `tools/call`, `ping`, the GET stream); its task
//! requests go out as stateless 2026 requests (no `Mcp-Session-Id`, `MCP-Protocol-Version:
//! 2026-07-28`, `Mcp-Method`, `Mcp-Name`, `_meta` with the protocol version and the client
//! capabilities declaring the extension), because that is the only way such a server runs tasks.
//!
//! What it does, for 2025-11-25 requests when the upstream is 2026-07-28 with the extension:
//! - `initialize` answer: `capabilities.tasks` (`cancel`, `list`, `requests.tools.call`) added;
//! - `tools/list` answer: `execution.taskSupport` `"optional"` on every tool without one
//!   (`"required"` for a tool the upstream answered `-32021` for, see below);
//! - `tools/call` with `params.task`: sent as a 2026 `tools/call` without `params.task`; the flat
//!   `CreateTaskResult` is recorded by `observe` (origin `bridged`, era `modern`) before the client
//!   sees the id, and answered nested (`{task:{taskId, status, ttl, pollInterval, …}}`). A plain
//!   result (the server ran the call without a task) is a task already `completed`: the call
//!   carries `PlainAnswerIsTask` down, `observe` records that task (an id taskgate mints, the
//!   result kept) and hands it back in the request's `Fact`, and the client is answered its
//!   `CreateTaskResult`;
//! - `tasks/get`: 2026 `tasks/get`; the `DetailedTask` answered as a 2025 `Task` (a `completed`
//!   with `isError: true` is a 2025 `failed`); a terminal task whose result the record holds is
//!   answered from the record;
//! - `tasks/result`: served here by polling 2026 `tasks/get` at the task's `pollIntervalMs`
//!   (else the `CreateTaskResult`'s; clamped to [`MIN_POLL`]..[`MAX_POLL`]; when the upstream
//!   gives `0` or none, a back-off from [`MIN_POLL`] doubling to [`MAX_POLL`], restarted by a
//!   status change) until it is terminal, then answered with the `CallToolResult` and the
//!   related-task `_meta`, the task's JSON-RPC `error` when it `failed`, and `-32603` when it was
//!   `cancelled` (no result exists; also as soon as its record is `cancelled` while followed:
//!   a client's `tasks/cancel`, or taskgate's own for input it cannot relay). A terminal result the record holds is answered without the
//!   upstream, so it survives a restart. An upstream that no longer knows the task (`-32602` to
//!   taskgate's own `tasks/get`, or to a `tasks/cancel` and then to that: it restarted) has the
//!   record failed as lost (`lost_task::fail_lost_bridged`: the owner's slot freed), and the
//!   task is answered from it from then on: `tasks/get` the failed `Task`, `tasks/result` the
//!   `-32603` it was failed with, `tasks/cancel` `-32602` "already terminal". **Overall
//!   bound**: the follower stops at the record's expiry (the
//!   task's `createdAt` + its ttl from the `CreateTaskResult`, or + `tasks.max_ttl_ms` when the
//!   ttl is `null`, and never more than that cap) and answers `-32602` (2025-11-25: an expired
//!   task); a client that closes the stream stops it (the poll in flight is dropped) once
//!   taskgate notices, at the latest on the next keep-alive (`gateway.sse_keepalive_ms`).
//! - `tasks/cancel` (reaches here once per task: `cancel` single-flights it and answers terminal
//!   tasks `-32602`; taskgate's own cancel of a task whose input its client cannot give is sent
//!   through that same single-flight, [`crate::layers::cancel::cancel_from_below`]), within
//!   one deadline (the upstream's `timeout_ms` for all its exchanges): first a 2026 `tasks/get`
//!   (a 2026 server acknowledges a cancel of a task that already ended, so an ack alone would
//!   turn a task that completed unobserved into `cancelled` and lose its result): a task it
//!   shows terminal is recorded so by `observe` and answered `-32602` naming that status,
//!   nothing sent or cancelled (the reply carries `CancelFoundTerminal`: `cancel` counts it
//!   `rejected_terminal`, and no "cancel requested" fact is recorded). Otherwise "cancel
//!   requested" is recorded here (`cancel` leaves it to the bridge) and the 2026 `tasks/cancel`
//!   sent; after its ack (which carries no status, §1.6) a second `tasks/get` tells whether
//!   the task ended otherwise meanwhile (skipped when the record already says it), then the
//!   ack is applied as the task `cancelled` (`cancel_ack::apply`, first terminal status wins,
//!   so a later upstream completion is a counted late result and never changes it): the client
//!   gets the `Task` with status `cancelled`, or, if the task reached another terminal status
//!   first, `-32602` naming it (see `follow::tasks_cancel` for what stays open).
//! - a plain `tools/call` answered `-32021` naming the extension: the tool is remembered as
//!   task-only (see `tools/list`), so `[upgrade]` runs later calls of it as tasks; the reply
//!   carries the `NeedsTask` fact up, filled when that answer passes, so `[upgrade]` can retry
//!   this call as a task without reading the error the 2025 client is shown.
//!
//! Why taskgate's own `tasks/cancel` (a task whose input its client cannot give) goes through
//! `cancel`'s single-flight by a call (`cancel_from_below`, with this layer re-wrapped as the
//! service below it) and not as a typed fact up: it must share the flight of a client's
//! `tasks/cancel` racing it (one upstream cancel), and it must be recorded before the
//! `tasks/result` stream, whose head went up long before, tells the client the task was
//! cancelled. A reply fact is read by `cancel` only as that stream passes it, after the bridge
//! has moved on. The `CancelState` is given to [`BridgeState::new`]; nothing is read back.
//!
//! The bridge records nothing itself: what it learns from the upstream for the registry, it
//! asks `observe` to record (policy down on its own requests, the outcome back in a `Fact`).
//!
//! Answers from the upstream to bridged requests come back as one `application/json` message,
//! HTTP 200 (the 2025 transport's status for a JSON-RPC error), even when the upstream streamed
//! them or gave a 2026 HTTP 400. 2026-only error codes (`-32020`, `-32021`, `-32022`) are shown
//! as the 2025-11-25 code for the situation, message kept (table in `errors`), in those answers
//! and in the answers to every other request of a 2025 client of a 2026 task upstream.
//!
//! **Deadlines**: each request taskgate sends itself (the bridged `tools/call`, `tasks/get`,
//! every poll of `tasks/result`, `tasks/update`) is bounded as a whole, its SSE answer
//! included, by the upstream's `timeout_ms`, and a bridged `tasks/cancel`'s exchanges
//! (`tasks/get`, `tasks/cancel`, `tasks/get`) by one `timeout_ms` together; past it the client gets the upstream
//! timeout's message ("upstream `x` did not answer within N ms") as JSON-RPC `-32603`, HTTP
//! 200, counted in `taskgate_upstream_errors_total{kind="timeout"}`. `server/discover` is bounded
//! by [`DISCOVER_DEADLINE`] or `timeout_ms`, whichever is shorter.
//!
//! - `input_required` while a bridged `tasks/result` follows the task: see `relay::input` (prompts on
//!   the `tasks/result` stream: `elicitation/create`, `sampling/createMessage`, `roots/list`;
//!   answers upstream as `tasks/update`; keys asked once; bounded per task and per caller). A
//!   JSON-RPC error answering a `sampling/createMessage` has no 2026 `inputResponses` form: the
//!   task is cancelled instead (`follow::refused_by_client`, `reason="client_error"`).
//! - MRTR (an `input_required` *result*, 2026-07-28 §2.3) answering the bridged task-augmented
//!   `tools/call` before its task exists, or a held session's `tools/call` / `prompts/get` /
//!   `resources/read`: see `relay::mrtr` (the same prompts on the request's own stream, then the request
//!   retried under a new id with `inputResponses` and the `requestState`; at most
//!   [`mrtr::MAX_ROUNDS`] rounds). The bridged task call declares, besides the extension, the
//!   `elicitation` / `sampling` / `roots` capabilities the client's session declared.
//!
//! - `notifications/cancelled` (2025-11-25 basic/utilities/cancellation) naming a client's
//!   request the bridge answers itself while it runs (a bridged task's `tasks/get`,
//!   `tasks/result`, `tasks/cancel`: the upstream gets taskgate's own requests, never that id)
//!   is answered here, HTTP 202, and not sent upstream (before: sent without the session the
//!   request never went out on, answered HTTP 400 by the upstream and so to the client). The
//!   request runs on (a receiver MAY ignore a cancellation; a `tasks/result` cancels no task).
//!   At most [`MAX_ANSWERING`] such requests are noted per upstream (past it a cancel passes on
//!   as before).
//! - status changes seen while a bridged `tasks/result` follows the task are sent on its stream
//!   as `notifications/tasks/status` (a 2025 `Task`).
//! - `notifications/tasks` (a `DetailedTask`) the upstream sends on any stream that reaches a
//!   2025 client become `notifications/tasks/status` (a 2025 `Task`, a tool error `failed`, no
//!   payload): on a bridged creation's own stream (then answered as SSE: the nested
//!   `CreateTaskResult`, then the stream's notifications as the upstream sends them), on plain
//!   calls' streams, the GET stream, and any other stream passed on (a `subscriptions/listen`
//!   a 2025-era request opened). `observe` below has recorded them first.
//! - the registry keeps the 2026 status (`completed` for a tool error) and notes the tool error
//!   (`TaskRecord::tool_error`), so `tasks/list` and every answer taken from a record show a
//!   2025 client `failed`, as `tasks/get` does.
//!
//! **Held sessions** (an upstream without 2025 sessions, which refuses `initialize`, such as
//! rmcp 3 with `legacy_session_mode` off): the bridge asks the upstream's `server/discover` and
//! replies with the `HoldSession` fact, from which the `held_sessions` stage above answers the
//! client's `initialize` (it mints the `Mcp-Session-Id`; `session` keeps it). Which requests are
//! a held session's comes down from that stage (`HeldSession`, `SessionsHeld`). The bridge
//! translates a held session's task requests as any 2025 client's (with the session's `_meta`,
//! `sessionless::add_session_meta`) and passes the rest on in their 2025 form: the held
//! sessions' upstream stage below (`crate::layers::held_sessions::upstream`) sends them as
//! stateless 2026 requests (`sessionless`) and answers what has no 2026 counterpart; the bridge
//! still reads the answers it translates (`tools/list`, a plain `tools/call`'s `-32021`, the
//! 2026-only error codes). Its GET stream is passed on too: that stage makes it the
//! upstream's `subscriptions/listen` (`held_sessions::listen`). The bridge reads no session
//! table: the input capabilities a client declared come down as `ClientDeclares`.
//!
//! Files: this one (the layer, the era, the dispatch, the request helpers), `calls`
//! (`initialize`, `tools/list`, `tools/call`), `follow` (tasks/get, tasks/result, tasks/cancel,
//! `server/discover`), `sessionless` (a held session's messages in the 2026 form and back),
//! `answer`
//! (the bridge's own exchanges), `translate` (the pure shape translations), `errors` (2026-only
//! error codes for 2025 clients). The input relay (`input_required` and MRTR) is a stage of its
//! own, `crate::layers::relay`: the bridge is handed one [`Relay`] per upstream (shared with
//! the held sessions' upstream stage) and calls it, handing it what the client declared and how
//! the upstream's events are shown to a 2025 client.

mod answer;
mod calls;
pub mod era;
pub mod errors;
mod follow;
pub mod reverse;
pub(crate) mod sessionless;
pub mod translate;

use answer::{ask, ask_until, ask_with, error_reply, failure_reply, legacy_reply};

pub use era::{Discovery, UpstreamEra, DISCOVER_DEADLINE, UNANSWERED_RETRY};

use crate::exchange::{GatewayError, McpReply, McpRequest, Operation, ReplyBody, RequestParts};
use crate::jsonrpc::{self, Id};
use crate::layers::extensions::{
    AuthorisedTask, ClientDeclares, HeldSession, PendingCreation, SessionsHeld,
};
use crate::layers::own_request;
use crate::layers::relay::{self, input, mrtr, OwnIds, Relay};
use crate::layers::McpService;
use crate::mcp::era::Era;
use crate::registry::Registry;
use futures_util::future::Either;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::ServiceExt;

pub use crate::mcp::task::{MAX_POLL, MIN_POLL};
/// Events of an SSE `initialize` answer kept before the answer itself (more are dropped).
pub const MAX_EARLY_EVENTS: usize = 64;
/// Bytes of event data kept before the answer itself, at most (events past it are dropped like
/// those past [`MAX_EARLY_EVENTS`]): one event may be as large as `limits.max_event_bytes`.
pub const MAX_EARLY_BYTES: usize = 1 << 20;
/// Most tool names remembered as task-only per upstream.
pub const MAX_TASK_ONLY_TOOLS: usize = 4096;
/// Most clients' requests the bridge answers itself noted at once per upstream (see
/// `notifications/cancelled` in the module docs).
pub const MAX_ANSWERING: usize = 4096;

/// A client's request (its caller and id) the bridge answers itself.
type AnsweringKey = (crate::exchange::Caller, Id);

/// One upstream's bridge state: its era and the tools it answered `-32021` for.
pub struct BridgeState {
    registry: Arc<Registry>,
    /// The upstream's era, the one fact `reverse` reads too.
    era: Arc<Discovery>,
    task_only: Mutex<HashSet<String>>,
    /// Its 2025 `initialize` answers declare 2025-11-25 `capabilities.tasks`: its 2025 sessions
    /// serve 2025 tasks themselves, so their requests pass untranslated and need no
    /// `server/discover`. An observation about its 2025 sessions, not its era (a dual-era server
    /// may also serve the 2026 tasks extension): `reverse` never reads it. Not asking matters:
    /// Python `mcp` 1.30 (stateful) opens a transport for the sessionless probe and, when that
    /// one closes, stops task support for every other session on the server.
    serves_legacy_tasks: std::sync::atomic::AtomicBool,
    /// Ids of taskgate's own upstream requests (shared with the relay).
    ids: Arc<OwnIds>,
    /// The relay of input the upstream asks for (`input_required`, MRTR), its own stage.
    relay: Arc<Relay>,
    /// The `cancel` layer's state: taskgate's own `tasks/cancel` joins its single-flight.
    cancel: Option<Arc<crate::layers::cancel::CancelState>>,
    /// Permits for the cancels of tasks whose sampling request a client refused, run in the
    /// background after the refusal's 202 (at most [`MAX_BACKGROUND_CANCELS`] at once; past it
    /// the refusal's POST waits for its cancel, as backpressure: none is dropped).
    background_cancels: Arc<tokio::sync::Semaphore>,
    /// Told each time a background cancel ends: a stop's drain waits for them
    /// ([`BridgeState::background_cancels_ended`]).
    background_ended: tokio::sync::Notify,
    /// The clients' requests the bridge answers itself, while they run (at most
    /// [`MAX_ANSWERING`]): a `notifications/cancelled` naming one is answered here.
    answering: Mutex<HashSet<AnsweringKey>>,
}

/// Most cancels of refused-input tasks running in the background at once, per upstream (see
/// `follow::send_update`).
pub const MAX_BACKGROUND_CANCELS: usize = 64;

impl BridgeState {
    /// The state of one upstream whose era is `era` (shared with its `reverse` state), with the
    /// handles it is given, not reached for: its own upstream exchanges bounded by the
    /// `relay`'s timeout (the upstream's `timeout_ms`, see `ask`); its own `tasks/cancel` sent
    /// through `cancel`'s single-flight.
    /// It reads no session table: what it needs of the client's session (held or not) comes
    /// down from `held_sessions` as request extensions. Its own ids come from `ids`, and input
    /// is relayed by `relay` (both shared with the held sessions' upstream stage below it).
    pub fn new(
        registry: Arc<Registry>,
        era: Arc<Discovery>,
        cancel: Arc<crate::layers::cancel::CancelState>,
        ids: Arc<OwnIds>,
        relay: Arc<Relay>,
    ) -> Arc<BridgeState> {
        Arc::new(BridgeState {
            registry,
            era,
            task_only: Mutex::new(HashSet::new()),
            serves_legacy_tasks: std::sync::atomic::AtomicBool::new(false),
            ids,
            relay,
            cancel: Some(cancel),
            background_cancels: Arc::new(tokio::sync::Semaphore::new(MAX_BACKGROUND_CANCELS)),
            background_ended: tokio::sync::Notify::new(),
            answering: Mutex::new(HashSet::new()),
        })
    }

    /// Notes `req` (a client's request the bridge answers itself) until the guard is dropped;
    /// `None` past [`MAX_ANSWERING`] or without an id.
    fn answering(self: &Arc<Self>, req: &McpRequest) -> Option<Answering> {
        let key = (req.ctx.caller().detached(), req.id()?.clone());
        let mut noted = self.answering.lock();
        if noted.len() >= MAX_ANSWERING || !noted.insert(key.clone()) {
            return None;
        }
        Some(Answering {
            state: self.clone(),
            key,
        })
    }

    /// Whether `req` is a `notifications/cancelled` naming a request of its caller's that the
    /// bridge answers itself now.
    fn cancels_one_answered_here(&self, req: &McpRequest) -> bool {
        if req.notification_method() != Some("notifications/cancelled") {
            return false;
        }
        let Some(request_id) = req.classified().and_then(|c| c.request_id()) else {
            return false;
        };
        let noted = self.answering.lock();
        !noted.is_empty() && noted.contains(&(req.ctx.caller(), request_id))
    }

    /// How many cancels run in the background now (see the field `background_cancels`).
    pub fn background_cancels(&self) -> usize {
        MAX_BACKGROUND_CANCELS.saturating_sub(self.background_cancels.available_permits())
    }

    /// Returns once no cancel runs in the background. A cancel taskgate accepted (the client
    /// got its 202) is one the client expects to reach the upstream: a graceful stop waits
    /// here, within its drain, before the runtime those cancels run on is dropped
    /// (`gateway::Linger`).
    pub async fn background_cancels_ended(&self) {
        loop {
            let ended = self.background_ended.notified();
            tokio::pin!(ended);
            // Registered before the look, so an end between the two is not missed.
            ended.as_mut().enable();
            if self.background_cancels() == 0 {
                return;
            }
            ended.await;
        }
    }

    /// A background cancel ended (its permit given back first).
    fn background_cancel_ended(&self, permit: tokio::sync::OwnedSemaphorePermit) {
        drop(permit);
        self.background_ended.notify_waiters();
    }

    /// Whether its 2025 sessions serve 2025 tasks themselves (see the field).
    pub(super) fn serves_legacy_tasks(&self) -> bool {
        self.serves_legacy_tasks
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes an `initialize` answer that declares 2025 `capabilities.tasks` (see the field).
    pub(super) fn saw_legacy_tasks(&self) {
        self.serves_legacy_tasks
            .store(true, std::sync::atomic::Ordering::Relaxed)
    }

    /// The upstream's era when known without asking it.
    pub fn known(&self) -> Option<UpstreamEra> {
        self.era.known()
    }

    /// An id for taskgate's own upstream requests (a string no client id equals by type and
    /// prefix).
    fn next_id(&self) -> Id {
        self.ids.next_id()
    }

    /// What the relay is told of `req`'s client (see [`relay::Client`]): the input
    /// capabilities its session declared (the [`ClientDeclares`] `held_sessions` handed down;
    /// none when absent), and the 2025 form of the upstream's events.
    fn client_of(&self, req: &McpRequest) -> relay::Client {
        let declares = req
            .extensions
            .get::<ClientDeclares>()
            .copied()
            .unwrap_or_default();
        relay::Client {
            declared: Arc::new(move |pointer: &str| declares.has(pointer)),
            shown: translate::legacy_event,
        }
    }

    fn is_task_only(&self, tool: &str) -> bool {
        self.task_only.lock().contains(tool)
    }
}

/// A client's request the bridge answers itself, noted while it runs (see
/// [`BridgeState::answering`]).
struct Answering {
    state: Arc<BridgeState>,
    key: AnsweringKey,
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.state.answering.lock().remove(&self.key);
    }
}

/// Builds [`BridgeService`]s over one upstream's [`BridgeState`].
#[derive(Clone)]
pub struct BridgeLayer {
    state: Arc<BridgeState>,
}

impl BridgeLayer {
    /// A layer bridging with `state`.
    pub fn new(state: Arc<BridgeState>) -> BridgeLayer {
        BridgeLayer { state }
    }
}

impl<S> tower::Layer<S> for BridgeLayer {
    type Service = BridgeService<S>;
    fn layer(&self, inner: S) -> BridgeService<S> {
        BridgeService {
            inner,
            state: self.state.clone(),
        }
    }
}

/// The `bridge` layer's service (see the module docs).
#[derive(Clone)]
pub struct BridgeService<S> {
    inner: S,
    state: Arc<BridgeState>,
}

type BoxFut = Pin<Box<dyn Future<Output = Result<McpReply, GatewayError>> + Send>>;

/// Marks a request of a held session for which the era was asked (asked once).
#[derive(Clone, Copy)]
struct EraAsked;

impl<S: McpService> tower::Service<McpRequest> for BridgeService<S> {
    type Response = McpReply;
    type Error = GatewayError;
    /// The inner service's own future for what passes untranslated (a 2026-07-28 request, any
    /// request to a 2025-11-25 upstream whose sessions taskgate does not hold); a boxed one
    /// otherwise.
    type Future = Either<S::Future, BoxFut>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: McpRequest) -> Self::Future {
        if req.era() == Era::Modern {
            return Either::Left(self.inner.call(req));
        }
        let state = &self.state;
        // A session taskgate holds, and whether it holds this upstream's sessions: told by
        // `held_sessions` above (nothing of a held session goes upstream in the 2025 form).
        let is_held = req.extensions.get::<Arc<HeldSession>>().is_some();
        let holds = req.extensions.get::<SessionsHeld>().is_some();
        if is_held && state.known().is_none() && req.extensions.get::<EraAsked>().is_none() {
            // A held session back from the store before this process learned the era.
            let (state, inner) = (state.clone(), self.take_inner());
            return Either::Right(Box::pin(async move {
                tasks_bridged(&state, &inner, &req).await;
                req.extensions.insert(EraAsked);
                BridgeService { inner, state }.call(req).await
            }));
        }
        if state.cancels_one_answered_here(&req) {
            // The upstream never saw that request (see the module docs).
            tracing::debug!(upstream = %req.ctx.upstream, "notifications/cancelled of a request the bridge answers itself: not sent upstream");
            return Either::Right(Box::pin(async { Ok(McpReply::accepted()) }));
        }
        if let Some(pending) = input_answer(state, &req) {
            if pending.round.is_some() {
                // An answer to an MRTR round's input request (see `relay::mrtr`).
                mrtr::answered(&req, pending);
                return Either::Right(Box::pin(async { Ok(McpReply::accepted()) }));
            }
            let (state, inner) = (state.clone(), self.take_inner());
            return Either::Right(Box::pin(async move {
                follow::send_update(&state, inner, &req, pending).await;
                Ok(McpReply::accepted())
            }));
        }
        if !is_held
            && (state.serves_legacy_tasks()
                || matches!(
                    state.known(),
                    Some(UpstreamEra::Legacy | UpstreamEra::Modern)
                ))
            && !(holds && req.request_method() == Some("initialize"))
        {
            // (A 2026 upstream without the tasks extension whose sessions taskgate holds still
            // gets its `initialize` answered here.)
            if passes_a_bridged_cancel(&req) {
                // `cancel` above leaves "cancel requested" of a 2025 cancel of a 2026 task to
                // the bridge (see `follow::tasks_cancel`); passed on as it came, it is sent.
                let (state, mut inner) = (state.clone(), self.take_inner());
                return Either::Right(Box::pin(async move {
                    if let Some(a) = req.extensions.get::<AuthorisedTask>() {
                        let task_id = a.record.task_id.clone();
                        state
                            .registry
                            .request_cancel(&req.ctx.upstream, &task_id)
                            .await;
                    }
                    inner.call(req).await
                }));
            }
            return Either::Left(self.inner.call(req));
        }
        let (state, inner) = (self.state.clone(), self.take_inner());
        Either::Right(Self::translated(state, inner, req, is_held))
    }
}

/// Whether `req` is a 2025-11-25 `tasks/cancel` of a 2026-07-28 task (not a gateway task's)
/// that this layer passes on untranslated: the `cancel` layer leaves its "cancel requested"
/// to the bridge (`cancel::sent_by_bridge`), so it is recorded when it passes.
fn passes_a_bridged_cancel(req: &McpRequest) -> bool {
    req.request_method() == Some("tasks/cancel")
        && req.era() == Era::Legacy
        && req.extensions.get::<AuthorisedTask>().is_some_and(|a| {
            a.record.era == Era::Modern && a.record.origin != crate::store::Origin::Gateway
        })
}

impl<S: McpService> BridgeService<S> {
    /// The inner service for a future that outlives `call`: the ready one goes with the
    /// request, this service keeps a clone.
    fn take_inner(&mut self) -> S {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }

    /// What `call` does to a 2025-11-25 request that does not pass untranslated.
    fn translated(state: Arc<BridgeState>, inner: S, req: McpRequest, is_held: bool) -> BoxFut {
        if is_held && matches!(req.op, Operation::OpenStream) {
            // The GET stream: the held sessions' upstream stage below makes it the upstream's
            // `subscriptions/listen`.
            return Box::pin(inner.oneshot(req));
        }
        let tasks_bridged = state.known() == Some(UpstreamEra::ModernTasks);
        match req.request_method() {
            Some("initialize") => Box::pin(calls::initialize(state, inner, req)),
            Some("tools/list") => Box::pin(calls::tools_list(state, inner, req)),
            Some("tools/call")
                if req.extensions.get::<PendingCreation>().is_some()
                    && (tasks_bridged || !is_held) =>
            {
                Box::pin(calls::task_call(state, inner, req))
            }
            Some("tools/call") => Box::pin(calls::plain_call(state, inner, req)),
            Some(m @ ("tasks/get" | "tasks/result" | "tasks/cancel")) => {
                let bridged = req
                    .extensions
                    .get::<AuthorisedTask>()
                    .filter(|a| a.record.era == Era::Modern)
                    .map(|a| crate::store::TaskRecord::clone(&a.record));
                let (Some(record), Some(id)) = (bridged, req.id().cloned()) else {
                    if is_held {
                        return Box::pin(async move {
                            Ok(errors::legacy_reply(inner.oneshot(req).await?))
                        });
                    }
                    return Box::pin(inner.oneshot(req));
                };
                let m = m.to_string();
                Box::pin(async move {
                    let answering = state.answering(&req);
                    let mut reply = match m.as_str() {
                        "tasks/get" => follow::tasks_get(&state, inner, req, id, record).await,
                        "tasks/result" => {
                            follow::tasks_result(&state, inner, req, id, record).await
                        }
                        _ => follow::tasks_cancel(&state, inner, req, id, record).await,
                    };
                    reply.body = match (answering, reply.body) {
                        // Noted until the stream ends (a `tasks/result` runs to the task's end).
                        (Some(noted), ReplyBody::Stream(events)) => {
                            use futures_util::StreamExt;
                            ReplyBody::Stream(Box::pin(events.map(move |e| {
                                let _ = &noted;
                                e
                            })))
                        }
                        (_, body) => body,
                    };
                    Ok(reply)
                })
            }
            // The rest of a held session's requests: sent upstream as stateless 2026 requests
            // (or answered) by the held sessions' upstream stage below.
            _ if is_held => {
                Box::pin(async move { Ok(errors::legacy_reply(inner.oneshot(req).await?)) })
            }
            // Other 2025 requests pass; a 2026-only error code in their answers is mapped, and
            // `notifications/tasks` on their streams become `notifications/tasks/status`.
            Some(_)
                if state.known() == Some(UpstreamEra::ModernTasks)
                    && errors::is_revision_or_none(req.ctx.protocol_version()) =>
            {
                Box::pin(async move {
                    let mut reply = errors::legacy_reply(inner.oneshot(req).await?);
                    reply.body = reply.body.map_messages(translate::legacy_notification);
                    Ok(reply)
                })
            }
            // Any stream a 2026 task server sends a 2025 client (the GET stream, a
            // `subscriptions/listen`): its `notifications/tasks` as `notifications/tasks/status`.
            _ => Box::pin(async move {
                let mut reply = inner.oneshot(req).await?;
                reply.body = reply.body.map_messages(translate::legacy_notification);
                Ok(reply)
            }),
        }
    }
}

/// taskgate's own 2025 `method` about `task_id` under `id`, in `req`'s context (for
/// `follow`'s `tasks/cancel` of a task whose input cannot be asked; see `own_request`).
fn internal_request(req: &McpRequest, id: &Id, method: &str, task_id: &str) -> McpRequest {
    let mut out = own_request::task_request(&req.ctx, Era::Legacy, method, task_id, id);
    crate::telemetry::carry(&req.extensions, &mut out.extensions);
    out.trace = req.trace.clone();
    out
}

/// The input request a POSTed client response answers (see `relay::input`), taken.
fn input_answer(state: &BridgeState, req: &McpRequest) -> Option<input::Pending> {
    let Operation::Post(msg) = &req.op else {
        return None;
    };
    if !matches!(msg.kind(), jsonrpc::Kind::Response | jsonrpc::Kind::Error) {
        return None;
    }
    state.relay.inputs.take(msg.id()?, &req.ctx.caller())
}

/// Whether the upstream serves the tasks extension (2025 task requests are bridged), asking
/// `server/discover` when its era is not known (see `era`); `false` while it stays unknown.
pub(super) async fn tasks_bridged<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
) -> bool {
    state.era.era(inner, req, &state.ids).await == Some(UpstreamEra::ModernTasks)
}

/// The 2026-07-28 request `method` with `params` under `id`, in `req`'s context: no upstream
/// session, `MCP-Protocol-Version: 2026-07-28`, `Mcp-Method`, `Mcp-Name` (base64-encoded when it
/// is not visible ASCII), era modern, and `req`'s extensions (its [`AuthorisedTask`] and
/// [`PendingCreation`] for `observe`).
pub(crate) fn modern_request(
    req: &McpRequest,
    id: &Id,
    method: &str,
    params: Value,
    name: Option<&str>,
) -> McpRequest {
    let mut params = params;
    if let Some(session) = req.extensions.get::<Arc<HeldSession>>() {
        sessionless::add_session_meta(&mut params, session);
    }
    let msg = own_request::message(id, method, &params);
    // The client's own routing headers never go on: they name its request, not this one.
    let ctx = own_request::context(&req.ctx, Era::Modern, method, name);
    let mut extensions = req.extensions.clone();
    extensions.insert(Era::Modern);
    extensions.insert(era::ForModernUpstream);
    McpRequest::from(RequestParts {
        op: Operation::Post(msg),
        ctx,
        extensions,
        trace: req.trace.clone(),
    })
}
