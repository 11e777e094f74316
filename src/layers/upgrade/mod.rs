//! The `upgrade` layer: a plain `tools/call` to a tool whose `execution.taskSupport` is
//! `"required"` becomes a task upstream, and the client gets the task's result as the answer to
//! its original request (2025-11-25 server/tools: taskSupport; basic/utilities/tasks).
//!
//! Active when `[upgrade] enabled = true`. Messages it touches:
//! - `tools/call` without `params.task`, on a session whose upstream declared
//!   `capabilities.tasks.requests.tools.call`, to a tool the session's `tools/list` marked
//!   `required` (a tool not yet seen triggers one `tools/list`, all pages): sent upstream with
//!   `params.task = {ttl: upgrade.ttl_ms}` (recorded with `origin = upgraded`). The client's answer
//!   becomes an SSE stream on which taskgate relays, while the task runs:
//!   - `notifications/progress` the upstream sends (on the client's `progressToken`, kept in the
//!     upgraded request);
//!   - status changes seen by polling `tasks/get` at the task's `pollInterval` (within 100 ms to 5 s: `mcp::task::MIN_POLL`..`MAX_POLL`)
//!     and `notifications/tasks/status`, as `notifications/progress` messages on the client's
//!     `progressToken` (only when the client gave one);
//!   - `elicitation/create` and `sampling/createMessage` requests from the upstream, when the
//!     client declared `capabilities.elicitation` / `capabilities.sampling`; the client's answers
//!     are ordinary POSTs that taskgate forwards upstream. Without the capability the task is
//!     cancelled upstream and the client gets a JSON-RPC error (`-32603`) saying why.
//!
//!   Requests to the client that come before the `CreateTaskResult` (the `bridge` relaying the
//!   input a 2026-07-28 upstream asks for before the task exists, MRTR) open the client's stream
//!   (with the messages buffered until then), so it can answer; a call that then ends without a
//!   task gets its answer as the stream's last event.
//!   The last event is the `tasks/result` answer (a `CallToolResult`, `isError` ones included, or
//!   the JSON-RPC error) under the client's original id, its `_meta` without the related-task
//!   key (the client asked for no task; the rest of `_meta` kept).
//! - A `tasks/result` that fails while the task is followed (the upstream out of reach for a
//!   while, a timeout, a 5xx whose body answers no request, a stream closed before the answer)
//!   is asked again, 100 ms apart doubling up to 5 s (`mcp::task::MIN_POLL`..`MAX_POLL`), until
//!   just before the task's ttl (`upgrade.ttl_ms` from the call, or the record's when sooner;
//!   `follower::give_up_at`); the `tasks/get` polls go on meanwhile (a failed one is skipped).
//!   Then, or at once on a failure that asking again does not mend (the upstream refused the
//!   request, an invalid answer, another 4xx), taskgate gives up: the client gets `-32603`
//!   saying why (`outcome="upstream_error"`), the task's one `tasks/cancel` is sent, best effort,
//!   as for a client gone with `on_client_disconnect = "cancel"`, and a record that did not end
//!   with it becomes `failed` with a `statusMessage` saying why, as the kept follower's final
//!   write does (`follower::record_terminal`), so it stops holding one of its owner's
//!   `tasks.max_live_tasks_per_owner` slots (the plain client never learned the task id).
//! - a plain `tools/call` the upstream answers `-32021` naming the tasks extension (a 2026-07-28
//!   server behind the `bridge` layer, whose session then declares `tasks.requests.tools.call`):
//!   sent again with `params.task` like a `required` tool's (only the answer's JSON body or first
//!   SSE event with data is looked at, past priming events; anything else is relayed as it came). 2026-07-28 requests are never
//!   upgraded.
//! - `notifications/cancelled` naming an upgraded call's id: becomes one `tasks/cancel` through the
//!   `cancel` layer (single-flight, audit facts); the client gets no further message for that id.
//! - The client's stream closing early (disconnect): `on_client_disconnect = "cancel"` cancels the
//!   task after `disconnect_grace_ms`; `"keep"` lets it run upstream, and taskgate keeps following
//!   it in the background (`tasks/get` at its `pollInterval`, no client stream, at most
//!   `upgrade.ttl_ms` from the call) until it ends, so its record ends too and stops holding one
//!   of the owner's `tasks.max_live_tasks_per_owner` slots (a client without the tasks
//!   capability never polls it itself); the client's principal can still reach it with
//!   `tasks/*`. At most [`MAX_KEPT_FOLLOWERS`] such followers per upstream: past it a kept task
//!   is not followed (logged), and its record stays as it was until something polls it or its
//!   ttl ends. A graceful stop ends them (their leases in a tier are left to lapse, so another
//!   replica adopts and follows the calls; after a restart on a store not shared they are
//!   cancelled as orphans).
//! - `tools/list` answers to a client that did not declare `capabilities.tasks`, from an upstream
//!   that declares `tasks.requests.tools.call`: `required` tools are shown as `"optional"`, so such
//!   clients call them. Task-capable clients see the upstream's values.
//! - After a restart, upgraded tasks that are not terminal have lost their client: taskgate cancels
//!   them upstream ([`cancel_orphans`]), counted as `taskgate_upgraded_calls_total{outcome="orphaned"}`.
//!   Not in a PostgreSQL tier, where the follower holds a lease on its call instead
//!   (`registry::leases`): when its replica is lost, another replica adopts the call and follows
//!   it to its end ([`follow_adopted`]), so its record gets its final status and result,
//!   counted as `taskgate_upgraded_calls_total{outcome="adopted"}` on the adopting replica.
//!
//! Outcomes of `taskgate_upgraded_calls_total{upstream,outcome}`: `completed`, `failed` (error or
//! `isError` result), `cancelled` (client's `notifications/cancelled`), `disconnected`,
//! `refused_capability`, `not_a_task` (the upstream answered without a task), `upstream_error`,
//! `orphaned`, `adopted` (followed to its end by another replica of a tier), `relay_overflow`
//! (too many events before the `CreateTaskResult`).
//!
//! A `notifications/cancelled` that arrives before the upstream's `CreateTaskResult` is held and
//! becomes the `tasks/cancel` once the task exists. The upstream side of an upgraded call runs
//! on its own task, so a client that disconnects before the `CreateTaskResult` still leaves a
//! recorded task that `on_client_disconnect` handles.
//!
//! Who a call belongs to: an upgraded call is named by `(upstream, Caller, id)`
//! ([`crate::exchange::CallKey`]: the principal and the client's own session), plus a token
//! unique to the call, so a second call never replaces the first one's entry. A caller with
//! neither a principal nor a session cannot be told apart from another such caller; when more
//! than one upgraded call with the same key is live, a `notifications/cancelled` for that id is
//! ambiguous and cancels none of them (it is passed on down the stack like any other): taskgate
//! never cancels a call that may be another client's. With a single live call it cancels that one.
//!
//! Bounds: what the upstream sends before the `CreateTaskResult` is buffered up to
//! [`EARLY_LIMIT`] events; past it the exchange ends with a JSON-RPC error (`-32603`), the task
//! (once its `CreateTaskResult` arrives) is cancelled upstream, counted as
//! `outcome="relay_overflow"`. Afterwards the relay from the `tasks/result` stream to the client
//! goes through bounded channels ([`RELAY_CAPACITY`]), so a slow client slows the reading of the
//! upstream's stream instead of growing a buffer.
//!
//! Terminal polls: when a `tasks/get` poll reports a terminal status while `tasks/result` has not
//! answered, taskgate waits one more poll interval for it, then asks `tasks/result` once more
//! (bounded by the upstream's `timeout_ms`); if that gives no answer either, the client gets a
//! JSON-RPC error (`-32603`) naming the status (`outcome="upstream_error"`). An upstream answer
//! that is not a JSON object gets the same error code, never a panic.
//!
//! Progress first: with a `progressToken`, the client's first message once the task exists is a
//! progress message naming the task's status (`working`), so it learns at once that its call
//! runs, however soon the result follows.
//!
//! Progress values on the client's token always increase (2025-11-25 basic/utilities/progress),
//! across the call's own stream and the session's GET stream, where some servers send progress.
//!
//! Limitations: the session table is in memory and holds only sessions initialized through
//! taskgate, so after a restart calls on sessions opened before it are forwarded as they are
//! (with bearer auth such sessions get 404 and clients initialize again). With an upstream
//! without sessions and no `[auth]`, clients cannot be told apart: no client's capabilities are
//! kept, so every client is treated as one without `capabilities.tasks` (required tools listed
//! as optional, plain calls upgraded) and relayed elicitation/sampling is not checked against
//! capabilities.
//!
//! What it knows of a session comes down from the session stage above it (the `SessionView`
//! fact: what the client and the upstream declared); it reads no session table. The
//! `taskSupport` of the tools is its own: `tool_cache` learns it from the `tools/list` answers
//! that pass through the layer (see there for its memory and bound).
//!
//! Files: this one holds the layer, its state and the dispatch (with the `notifications/cancelled`
//! interception); `tool_cache` the tool cache and the inner service that fills it; `tools` the
//! `tools/list` rewrite and `taskSupport` lookup; `call` the upgrade,
//! the driver up to the `CreateTaskResult` and taskgate's internal requests; `early` what comes
//! before that answer; `follower` the
//! task's follower; `progress` the increasing progress values and the GET-stream rewrite;
//! `orphans` the sweep after a restart; `adopt` the follow of a call adopted from a lost replica.

mod adopt;
mod call;
mod early;
mod follower;
mod orphans;
mod progress;
mod requests;
mod tool_cache;
mod tools;

pub use adopt::follow_adopted;
pub use orphans::cancel_orphans;
pub use tool_cache::{ToolCache, ToolMap, Watched};

use call::tools_call;
use progress::get_stream;
use tools::tools_list;

use crate::config::UpgradeConfig;
use crate::exchange::{CallKey, Caller, GatewayError, McpReply, McpRequest, Operation};
use crate::jsonrpc::Id;
use crate::layers::McpService;
use crate::metrics::UpgradeOutcome;
use crate::registry::Registry;

use futures_util::future::Either;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;

/// (caller, progressToken JSON) of an upgraded call with a progress token.
type TokenKey = (Caller, String);

/// Events buffered before the upstream's `CreateTaskResult`; past it the exchange ends.
pub const EARLY_LIMIT: usize = 1024;
/// Capacity of the channels that relay the task's messages to the client.
pub const RELAY_CAPACITY: usize = 256;
/// Kept upgraded calls (`on_client_disconnect = "keep"`) followed in the background at once,
/// per upstream: each polls its upstream at least every 5 s (`mcp::task::MAX_POLL`).
pub const MAX_KEPT_FOLLOWERS: usize = 1024;
/// Deadline of the `tasks/result` asked again after a terminal poll, when the upstream's own
/// `timeout_ms` is not known.
const DEFAULT_RESULT_DEADLINE: Duration = Duration::from_secs(30);

/// One live upgraded call: a token unique to it and its cancel signal.
struct ActiveCall {
    token: u64,
    cancel: oneshot::Sender<()>,
}

/// State of the upgrade layer for one upstream (built per stack in `gateway`).
pub struct UpgradeState {
    /// The `taskSupport` of the tools each session's upstream listed.
    tools: Arc<ToolCache>,
    registry: Arc<Registry>,
    config: UpgradeConfig,
    /// Upgraded calls being followed: the client's call → every live call with that key (more
    /// than one only for callers that cannot be told apart; see the module docs).
    active: Mutex<HashMap<CallKey, Vec<ActiveCall>>>,
    /// The upstream's `timeout_ms` (the deadline of a `tasks/result` asked after a terminal poll).
    result_deadline: Duration,
    /// Progress state of upgraded calls by token, for progress the upstream sends on the
    /// session's GET stream.
    tokens: Mutex<HashMap<TokenKey, Arc<Mutex<Option<f64>>>>>,
    seq: AtomicU64,
    /// Ended calls whose final status the task store refused, written again until it takes it
    /// (`follower::record_terminal`): a graceful stop waits for them within its drain
    /// ([`UpgradeState::final_writes_ended`]).
    final_writes: tokio_util::task::TaskTracker,
    /// Followers of kept calls whose client is gone (`follower::Follower::follow_kept`): a
    /// permit each, [`MAX_KEPT_FOLLOWERS`] in all.
    kept: tokio::sync::Semaphore,
    /// Ends the followers of kept calls: a graceful stop ([`UpgradeState::final_writes_ended`]).
    stop_kept: tokio_util::sync::CancellationToken,
}

impl UpgradeState {
    /// The state of one upstream's upgrade layer; `upstream_timeout` is its `timeout_ms`.
    pub fn new(
        registry: Arc<Registry>,
        config: UpgradeConfig,
        upstream_timeout: Duration,
    ) -> Arc<UpgradeState> {
        Arc::new(UpgradeState {
            tools: Arc::default(),
            registry,
            config,
            active: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            result_deadline: upstream_timeout,
            seq: AtomicU64::new(1),
            final_writes: tokio_util::task::TaskTracker::new(),
            kept: tokio::sync::Semaphore::new(MAX_KEPT_FOLLOWERS),
            stop_kept: tokio_util::sync::CancellationToken::new(),
        })
    }

    /// How many ended calls wait for the task store to take their final status (a PostgreSQL
    /// outage; see `follower::record_terminal`).
    pub fn pending_final_writes(&self) -> usize {
        self.final_writes.len()
    }

    /// How many kept calls (`on_client_disconnect = "keep"`, client gone) are followed in the
    /// background now.
    pub fn kept_followers(&self) -> usize {
        MAX_KEPT_FOLLOWERS - self.kept.available_permits()
    }

    /// Returns once no ended call waits for the task store to take its final status. A
    /// graceful stop waits here within its drain (`gateway::Linger`): a retry dropped with its
    /// runtime leaves the record `working` until another replica adopts the call. The
    /// followers of kept calls end first, at once: a kept task may run for the whole
    /// `upgrade.ttl_ms`, longer than any drain (in a tier their leases are left to lapse and
    /// another replica adopts the calls; on a store not shared the next start cancels them
    /// as orphans).
    pub async fn final_writes_ended(&self) {
        let kept = self.kept_followers();
        if kept > 0 && !self.stop_kept.is_cancelled() {
            tracing::info!(
                kept,
                "a graceful stop: kept upgraded calls whose clients are gone are no longer followed here"
            );
        }
        self.stop_kept.cancel();
        // `wait` returns only on a closed tracker; closing it does not stop it counting the
        // retries that start later.
        self.final_writes.close();
        self.final_writes.wait().await;
    }

    fn result_deadline(&self) -> Duration {
        if self.result_deadline.is_zero() {
            DEFAULT_RESULT_DEADLINE
        } else {
            self.result_deadline
        }
    }

    /// Registers a live upgraded call; never replaces another call's entry. Returns its token.
    fn register(&self, key: &CallKey, cancel: oneshot::Sender<()>) -> u64 {
        let token = self.seq.fetch_add(1, Ordering::Relaxed);
        self.active
            .lock()
            .entry(key.clone())
            .or_default()
            .push(ActiveCall { token, cancel });
        token
    }

    /// Forgets one live upgraded call (only that one).
    fn forget(&self, key: &CallKey, token: u64) {
        let mut active = self.active.lock();
        if let Some(calls) = active.get_mut(key) {
            calls.retain(|c| c.token != token);
            if calls.is_empty() {
                active.remove(key);
            }
        }
    }

    /// A client's `notifications/cancelled` for `key`: signals the call when exactly one live
    /// call has that key. Returns whether it did.
    fn cancel_call(&self, key: &CallKey) -> bool {
        let mut active = self.active.lock();
        let Some(calls) = active.get_mut(key) else {
            return false;
        };
        if calls.len() != 1 {
            tracing::info!(
                live = calls.len(),
                "notifications/cancelled names more than one upgraded call of callers that cannot be told apart: none is cancelled"
            );
            return false;
        }
        let call = calls.pop().expect("one call");
        active.remove(key);
        call.cancel.send(()).is_ok()
    }
    fn next_id(&self) -> Id {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        Id::from_json(&format!("\"taskgate-{n}\"")).expect("a string id")
    }

    fn count(&self, upstream: &str, outcome: UpgradeOutcome) {
        self.registry.metrics().upgraded_call(upstream, outcome);
    }
}

/// Builds [`UpgradeService`]s.
#[derive(Clone)]
pub struct UpgradeLayer {
    state: Arc<UpgradeState>,
}

impl UpgradeLayer {
    /// A layer sharing `state`.
    pub fn new(state: Arc<UpgradeState>) -> UpgradeLayer {
        UpgradeLayer { state }
    }
}

impl<S> tower::Layer<S> for UpgradeLayer {
    type Service = UpgradeService<S>;
    fn layer(&self, inner: S) -> UpgradeService<S> {
        // Nothing reads the tool cache when upgrading is off: then nothing fills it.
        let cache = self.state.config.enabled.then(|| self.state.tools.clone());
        UpgradeService {
            inner: Watched::new(inner, cache),
            state: self.state.clone(),
        }
    }
}

/// The `upgrade` layer's service (see the module docs).
#[derive(Clone)]
pub struct UpgradeService<S> {
    /// The inner service, its replies read into the tool cache.
    inner: Watched<S>,
    state: Arc<UpgradeState>,
}

type BoxFut = Pin<Box<dyn Future<Output = Result<McpReply, GatewayError>> + Send>>;

impl<S: McpService> UpgradeService<S> {
    /// The inner service for a future that outlives `call`: the ready one goes with the
    /// request, this service keeps a clone.
    fn take_inner(&mut self) -> Watched<S> {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }
}

impl<S: McpService> tower::Service<McpRequest> for UpgradeService<S> {
    type Response = McpReply;
    type Error = GatewayError;
    /// The inner service's own future for what passes as it is (everything when upgrading is
    /// off or the request is 2026-07-28); a boxed one for `tools/call`, `tools/list`, the GET
    /// stream and a `notifications/cancelled` answered here.
    type Future = Either<<Watched<S> as tower::Service<McpRequest>>::Future, BoxFut>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: McpRequest) -> Self::Future {
        // Upgrading is a 2025-11-25 notion (a 2026-07-28 client declares the tasks extension
        // itself, or gets the upstream's -32021).
        if !self.state.config.enabled || req.era() == crate::mcp::era::Era::Modern {
            return Either::Left(self.inner.call(req));
        }
        let is_request = req.request_method().is_some();
        match req.method() {
            Some("tools/call") if is_request => Either::Right(Box::pin(tools_call(
                self.state.clone(),
                self.take_inner(),
                req,
            ))),
            Some("tools/list") if is_request => {
                Either::Right(Box::pin(tools_list(self.take_inner(), req)))
            }
            None if matches!(req.op, Operation::OpenStream) => Either::Right(Box::pin(get_stream(
                self.state.clone(),
                self.take_inner(),
                req,
            ))),
            Some("notifications/cancelled") if !is_request => {
                if let Some(key) = cancelled_call(&req) {
                    if self.state.cancel_call(&key) {
                        return Either::Right(Box::pin(async { Ok(McpReply::accepted()) }));
                    }
                }
                Either::Left(self.inner.call(req))
            }
            _ => Either::Left(self.inner.call(req)),
        }
    }
}

/// The upgraded call a client's `notifications/cancelled` names (`params.requestId`, as the edge
/// classified it).
fn cancelled_call(req: &McpRequest) -> Option<CallKey> {
    let id = req.classified()?.request_id()?;
    Some(req.ctx.call_key(&id))
}
