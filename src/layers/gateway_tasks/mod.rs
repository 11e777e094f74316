//! The `gateway_tasks` layer: taskgate runs the tasks of an upstream without task support
//! itself (`upstream.tasks = "gateway"`, issue 32; DESIGN.md "Every client, every server",
//! gateway-owned tasks; 2025-11-25 basic/utilities/tasks, 2026-07-28 tasks extension SEP-2663).
//! Off (every request passes untouched) unless configured.
//!
//! It sits below `cancel` and above `held_sessions`: the `tasks` layer has already applied the
//! task policy (owner limit, ttl cap: the [`PendingCreation`] it hands down; owner binding of
//! `tasks/*`: the [`AuthorisedTask`]), `cancel` single-flights `tasks/cancel` (so one cancel per
//! task reaches this layer), and the plain call this layer sends goes through the era bridge,
//! `observe` and `ids` like a client's.
//!
//! What it does, per message (every other one passes as it came):
//! - `initialize` answer (2025-11-25): `capabilities.tasks` (`list`, `cancel`,
//!   `requests.tools.call`) added; `tools/list` answer: `execution.taskSupport: "optional"` on
//!   every tool without a `taskSupport`. `server/discover` answer (2026-07-28):
//!   `capabilities.extensions["io.modelcontextprotocol/tasks"]` added. An upstream whose answer
//!   already declares tasks (`capabilities.tasks`, or the extension) runs its own: that is
//!   learned once for the upstream, and from then on this layer passes everything through, so
//!   the server's own tasks are recorded and cancelled as for `tasks = "upstream"` (its tasks
//!   are better than taskgate's: they can ask for input and survive a taskgate restart).
//!   Before anything is learned (no `initialize` or `server/discover` since start) the
//!   configuration stands: taskgate runs the tasks.
//! - `tools/call` that asks for a task: 2025-11-25 with `params.task` (the `tasks` layer's
//!   [`PendingCreation`]), or 2026-07-28 from a client that declares the tasks extension in
//!   `params._meta`. Every such call becomes a task (the policy: at least every call that
//!   asks; a plain call, and a 2026 call without the extension, passes through unchanged).
//!   The record (origin `gateway`, the taskId `tgt-` + 32 random hex digits, taskgate's) is
//!   written durably, then the client is answered its `CreateTaskResult` (2025: `{task}`;
//!   2026: flat, `resultType:"task"`) at once, and the call goes upstream as a plain
//!   `tools/call` (without `params.task`) under taskgate's own id (`"taskgate-gt-<n>"`, which
//!   `ids` sends under an id of its own on a shared session) with a `progressToken`
//!   (the client's, else the taskId). A `params.task` that is not an object, or whose `ttl` is
//!   not a number of ms at least 0, was refused `-32602` by `tasks` above.
//!   taskgate holds that call on a task of its own
//!   (`held`): until its answer, the end of its stream, or the task's expiry (its ttl,
//!   capped by `tasks.max_ttl_ms`); live held calls count against
//!   `tasks.max_live_tasks_per_owner` as the live tasks they are, in both eras (a 2026 call
//!   over the limit is refused `-32029` here: taskgate, not the server, makes it a task).
//! - While the call runs: the task is `working`; each `notifications/progress` on its token
//!   becomes the task's `statusMessage` (its `message`, else `progress/total`, cut at
//!   `held::MAX_PROGRESS_MESSAGE` bytes; written at most every `held::PROGRESS_WRITE_EVERY`, 200 ms,
//!   and no more once the task is terminal). A
//!   request the server sends the client during the call (`elicitation/create`,
//!   `sampling/createMessage`, `roots/list`) makes the task `input_required` and is relayed as
//!   each era has it (see `input`: 2025-11-25 on the `tasks/result` stream with the
//!   related-task `_meta`, 2026-07-28 as `inputRequests` answered by `tasks/update`); the
//!   client's answer goes upstream as the response to the server's request, and the task is
//!   `working` again. `ping` is answered by taskgate; any other request `-32601`. A 2026-07-28
//!   upstream asks within the call instead (MRTR: it answers the plain call
//!   `resultType: "input_required"`): each `inputRequests` entry is relayed the same way, and
//!   once all are answered the call goes upstream again under a new id with `inputResponses`
//!   and the `requestState` echoed (at most `relay::mrtr::MAX_ROUNDS` rounds; a round taskgate
//!   cannot relay fails the task saying why). Such a result is never taken for the call's end.
//! - The call's end: a result is `completed` (also with `isError: true`, as the spec has it),
//!   a JSON-RPC error `failed` (its message the `statusMessage`), no answer at all `failed`
//!   saying why. The answer is kept as the bytes that came and read member by member
//!   (`splice::raw_at`; an error object with `observe::lenient_value`): the result kept and
//!   served is a slice of those bytes (2025: the related-task `_meta` spliced in), never a
//!   `Value` serialised again, so a result nested past serde_json's 128 levels completes and
//!   is answered byte for byte (cold test, session 25: it failed "the upstream's answer ended
//!   without the call's result"). An HTTP 404 saying the call's session is not found (the upstream restarted)
//!   fails the task the same way, and the client session is remembered gone (`gone`,
//!   bounded): its next task-augmented `tools/call` is answered HTTP 404 `-32001` "Session not
//!   found", so the 2025-11-25 client initializes again instead of creating tasks that fail
//!   for ever; the failed tasks are still answered from their records. The result is kept in the record up to `tasks.max_stored_result_bytes`
//!   (2025: the `CallToolResult` with the related-task `_meta`, or the JSON-RPC `error` of a
//!   failed task in `terminal_error`, so that `tasks/result` answers exactly that error after a
//!   restart too; 2026: the whole `DetailedTask`) and, bounded ([`DONE_LIMIT`] tasks, [`DONE_BYTES`], each at most
//!   `tasks.max_stored_result_bytes`), in memory with a JSON-RPC error.
//! - `tasks/get` of a gateway task: answered from the record (2025 `Task`; 2026 `DetailedTask`,
//!   its result inline once terminal). `tasks/result` (2025): blocks until the task is terminal
//!   (woken by the held call's end, or a registry poll every [`RESULT_POLL`] when this process
//!   does not hold the call), then the `CallToolResult`, the call's JSON-RPC error, or `-32603`
//!   for a cancelled task (it has no result); while this process holds the call it is an SSE
//!   stream (status changes as `notifications/tasks/status`, input requests, the answer last).
//!   `tasks/update` (2026-07-28): the task's `inputResponses` (see `input`), acknowledged;
//!   under 2025-11-25 `-32602`.
//! - `tasks/cancel` of a gateway task: `cancelled` is recorded (durably) before the answer
//!   (2025: the `Task`, `cancelled`; 2026: the ack), then the held call is told: a 2025 call
//!   gets one `notifications/cancelled` naming the request id taskgate sent it under (the
//!   server only learns the result is no longer needed; the task's terminal state is
//!   taskgate's), a 2026 call's stream is closed (2026-07-28 has no `notifications/cancelled`
//!   over HTTP: closing the stream is the cancel). Identical cancels share `cancel`'s flight,
//!   later ones find the task terminal: one notification per task. A late answer is applied as
//!   a status report, so it is counted as a late result and never overturns `cancelled`.
//!   Audit: "status cancelled" is the registry's `on_transition` (at once); "resources
//!   released" waits on a [`crate::registry::ResourceHold`] the held call keeps until it has
//!   actually ended (answer, stream end, connection close; a 2025 call still open
//!   `held::CANCELLED_CALL_GRACE` after its notification is closed by taskgate), then the quiet window
//!   (`tasks.release_quiet_ms`), and is recorded by the registry's release tracker with the
//!   `taskgate_cancelled_to_released_seconds` histogram.
//! - A restart (`gateway.rs` at start, on a store of one gateway): gateway tasks that were not
//!   terminal are `failed` with a `statusMessage` saying taskgate restarted (the held call died
//!   with the process), and released (`reason="restart"`).
//! - A stdio upstream's child dies with held calls in flight (each held call carries
//!   [`crate::exchange::HeldTask`], so the death names its task: `upstream::stdio::ChildGone`):
//!   their tasks are `failed` (by the held call, which got no answer, or by the death, whichever
//!   is seen first) and released (`reason="process_exited"`), as the child's own tasks are.
//!
//! Owner binding and `tasks/list` are the `tasks` layer's, as for every task (another
//! principal gets `-32602` for everything). `notifications/tasks/status`: on the `tasks/result`
//! stream of a held call (see `input`), and on the GET streams of the session the task was
//! created on when its client declared `capabilities.tasks` (see `listen`).
//! - A PostgreSQL tier (`registry::leases`): the replica holding the call keeps a lease on it
//!   ([`crate::store::LeaseKind::Held`], taken before the `CreateTaskResult` is answered). A
//!   `tasks/cancel` answered by another replica records `cancelled` there at once and asks the
//!   holder through the lease; the holder, within `store.lease_poll_ms`, sends the one
//!   `notifications/cancelled` and records "released" once its call has ended. When the holder
//!   is gone (its lease not renewed within `store.lease_ms`), a surviving replica marks the task
//!   `failed`, saying its replica was lost, and released. A call that ends while the database
//!   is out of reach keeps its live entry and its lease (renewed) while its final write (the
//!   terminal status with the outcome) is tried again (`held`, `Held::retry_final`: 100 ms
//!   doubling to 5 s, until the store takes it or the task's ttl ends; bounded by
//!   [`PENDING_FINAL_WRITES`] and [`PENDING_FINAL_BYTES`]); `tasks/result` on this replica waits
//!   for it, and so does a graceful stop's drain.
//!
//! Files: this one (the layer, the dispatch, the negotiation rewrites), `held` (creation and
//! the held call), `gone` (client sessions the upstream said are gone), `answers` (`tasks/get|result|cancel|update` and the task shapes of both
//! eras), `input` (the server's requests during the call, relayed to the client), `listen`
//! (status notifications on the session's GET streams).

mod answers;
mod gone;
mod held;
mod input;
mod listen;

use crate::exchange::{GatewayError, McpReply, McpRequest};
use crate::jsonrpc;
use crate::layers::extensions::{AuthorisedTask, PendingCreation};
use crate::layers::relay::Inputs;
use crate::layers::McpService;
use crate::mcp::capabilities::{declares_tasks_extension, TASKS_EXTENSION};
use crate::mcp::era::Era;
use crate::registry::Registry;
use crate::store::Origin;
use futures_util::future::Either;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{oneshot, watch};

/// Finished gateway tasks whose outcome (result or JSON-RPC error) is kept in memory for
/// `tasks/result` beside the record's stored result (the oldest forgotten past this many).
pub const DONE_LIMIT: usize = 4096;
/// Most bytes (serialized JSON) of outcomes kept in memory in all; each one is kept only when
/// it is at most `tasks.max_stored_result_bytes` (the oldest forgotten past this).
pub const DONE_BYTES: usize = 64 << 20;

/// Final writes (a held call's terminal status with its outcome) the task store refused and
/// that are retried (see `held::Held::end`), per upstream: past this many, or
/// [`PENDING_FINAL_BYTES`], a call that ends while the store is out of reach is written
/// `failed` instead, saying its outcome could not be kept (its outcome is not held in memory).
pub const PENDING_FINAL_WRITES: usize = 1024;
/// Most bytes of outcomes held in memory for final writes being retried, per upstream.
pub const PENDING_FINAL_BYTES: usize = 64 << 20;
/// How often a `tasks/result` of a gateway task this process does not hold reads the registry.
pub const RESULT_POLL: Duration = Duration::from_secs(1);

/// The `pollInterval` gateway tasks advertise, in ms.
pub const POLL_INTERVAL_MS: u64 = 1000;

/// What is known of the upstream's own task support.
const UNKNOWN: u8 = 0;
const WITHOUT_TASKS: u8 = 1;
const OWN_TASKS: u8 = 2;

/// How a held call ended, kept for `tasks/result` (see [`DONE_LIMIT`]).
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// The `CallToolResult`, as JSON text taken from the upstream's answer as it came (2025:
    /// with the related-task `_meta` spliced in), never read into a `Value`: a result nested
    /// past serde_json's 128 levels is kept and served byte for byte.
    Result(Arc<str>),
    /// The JSON-RPC `error` object, or one taskgate made (`-32603`) when there was no answer.
    Error(Arc<Value>),
}

/// The outcomes kept in memory: by task id with their size, oldest first.
#[derive(Default)]
struct Done {
    map: HashMap<String, (Outcome, usize)>,
    order: std::collections::VecDeque<String>,
    bytes: usize,
}

/// One held call: how to tell it the task was cancelled, when its task became terminal, and
/// the server's requests waiting for the client's answer.
struct Live {
    /// The upstream's name.
    upstream: String,
    /// The record as created (its key and owner).
    record: Arc<crate::store::TaskRecord>,
    /// The client session the task was created on (its GET streams get the task's status
    /// changes, see `listen`).
    session: Option<String>,
    cancel: Mutex<Option<oneshot::Sender<()>>>,
    terminal: watch::Sender<bool>,
    input: input::CallInput,
}

/// State of the layer for one upstream.
pub struct GatewayTasksState {
    registry: Arc<Registry>,
    /// `upstream.tasks = "gateway"`.
    enabled: bool,
    /// [`UNKNOWN`], [`WITHOUT_TASKS`] or [`OWN_TASKS`].
    upstream_tasks: AtomicU8,
    /// taskId → its held call, while it is held.
    live: Mutex<HashMap<String, Arc<Live>>>,
    /// Told each time a held call ends (its entry gone from `live`): what a graceful stop
    /// waits on ([`GatewayTasksState::held_calls_ended`]).
    held_ended: tokio::sync::Notify,
    /// taskId → how its held call ended (bounded: [`DONE_LIMIT`], [`DONE_BYTES`]).
    done: Mutex<Done>,
    /// Client session → the channel to its GET streams (see `listen`).
    listeners: Mutex<HashMap<String, tokio::sync::broadcast::Sender<crate::sse::Event>>>,
    /// The input requests sent to 2025-11-25 clients on `tasks/result` streams, by the id
    /// taskgate minted (see `input`).
    inputs: Inputs,
    /// Client sessions the upstream said are gone (bounded: see `gone`).
    lost_sessions: Mutex<gone::Lost>,
    /// The final writes being retried: how many, and the bytes of outcome they hold
    /// (bounded: [`PENDING_FINAL_WRITES`], [`PENDING_FINAL_BYTES`]).
    pending_final: Mutex<(usize, usize)>,
    seq: AtomicU64,
}

/// A final write being retried, counted in [`GatewayTasksState::pending_final`] until dropped.
pub(crate) struct PendingFinal {
    state: Arc<GatewayTasksState>,
    bytes: usize,
}

impl Drop for PendingFinal {
    fn drop(&mut self) {
        let mut pending = self.state.pending_final.lock();
        pending.0 = pending.0.saturating_sub(1);
        pending.1 = pending.1.saturating_sub(self.bytes);
    }
}

impl GatewayTasksState {
    /// Returns once no call of a gateway task is held (each has ended and recorded how), for a
    /// graceful stop: the calls of tasks still `working` finish within the drain instead of
    /// being failed ("taskgate restarted", or "replica lost" in a tier) after it. Bound it with
    /// a deadline.
    pub async fn held_calls_ended(&self) {
        loop {
            let ended = self.held_ended.notified();
            tokio::pin!(ended);
            // Registered before the look, so an end between the two is not missed.
            ended.as_mut().enable();
            if self.live.lock().is_empty() {
                return;
            }
            ended.await;
        }
    }

    /// How many calls of gateway tasks are held now.
    pub fn held_calls(&self) -> usize {
        self.live.lock().len()
    }

    /// How many of the held calls have ended and wait for the task store to take their final
    /// write (their terminal status and outcome: retried, see `held`).
    pub fn pending_final_writes(&self) -> usize {
        self.pending_final.lock().0
    }

    /// Counts a final write of `bytes` of outcome to be retried; `None` when that would pass
    /// [`PENDING_FINAL_WRITES`] or [`PENDING_FINAL_BYTES`].
    fn pend_final(self: &Arc<Self>, bytes: usize) -> Option<PendingFinal> {
        let mut pending = self.pending_final.lock();
        if pending.0 >= PENDING_FINAL_WRITES
            || pending.1.saturating_add(bytes) > PENDING_FINAL_BYTES
        {
            return None;
        }
        pending.0 += 1;
        pending.1 += bytes;
        Some(PendingFinal {
            state: self.clone(),
            bytes,
        })
    }

    /// The state of one upstream's layer; `enabled` is `upstream.tasks = "gateway"`.
    pub fn new(registry: Arc<Registry>, enabled: bool) -> Arc<GatewayTasksState> {
        Arc::new(GatewayTasksState {
            registry,
            enabled,
            upstream_tasks: AtomicU8::new(UNKNOWN),
            live: Mutex::new(HashMap::new()),
            held_ended: tokio::sync::Notify::new(),
            done: Mutex::new(Done::default()),
            inputs: Inputs::default(),
            listeners: Mutex::new(HashMap::new()),
            lost_sessions: Mutex::new(gone::Lost::default()),
            pending_final: Mutex::new((0, 0)),
            seq: AtomicU64::new(1),
        })
    }

    #[cfg(test)]
    fn new_for_tests() -> Arc<GatewayTasksState> {
        let (registry, _store) = crate::layers::testing::registry();
        GatewayTasksState::new(registry, true)
    }

    /// Whether taskgate runs this upstream's tasks now (configured, and the upstream has not
    /// declared tasks of its own).
    fn runs_tasks(&self) -> bool {
        self.enabled && self.upstream_tasks.load(Ordering::Relaxed) != OWN_TASKS
    }

    /// Learns from an `initialize` / `server/discover` answer whether the upstream has tasks.
    fn learn(&self, own: bool) {
        let was = self.upstream_tasks.swap(
            if own { OWN_TASKS } else { WITHOUT_TASKS },
            Ordering::Relaxed,
        );
        if own && was != OWN_TASKS {
            tracing::info!("upstream.tasks = \"gateway\", but the upstream declares tasks itself: its own tasks pass through");
        }
    }

    /// Keeps how `task_id`'s call ended, when its JSON is at most
    /// `tasks.max_stored_result_bytes`; the oldest outcomes are forgotten past [`DONE_LIMIT`]
    /// entries or [`DONE_BYTES`] in all (a larger one is answered from the record, or as not
    /// kept).
    /// `size` is the outcome's JSON length in bytes (the caller serialized it once).
    fn remember(&self, task_id: &str, outcome: Outcome, size: usize) {
        let max = self.registry.config().max_stored_result_bytes;
        if u64::try_from(size).map_or(true, |s| s > max) || size > DONE_BYTES {
            return;
        }
        let mut done = self.done.lock();
        while done.map.len() >= DONE_LIMIT || done.bytes + size > DONE_BYTES {
            let Some(oldest) = done.order.pop_front() else {
                break;
            };
            if let Some((_, n)) = done.map.remove(&oldest) {
                done.bytes -= n;
            }
        }
        if let Some((_, n)) = done.map.insert(task_id.to_string(), (outcome, size)) {
            done.bytes -= n;
        } else {
            done.order.push_back(task_id.to_string());
        }
        done.bytes += size;
    }

    fn outcome(&self, task_id: &str) -> Option<Outcome> {
        self.done.lock().map.get(task_id).map(|(o, _)| o.clone())
    }
}

/// Tells a held call its task was recorded cancelled (the held call then sends the server its
/// `notifications/cancelled`, see `held`), once, and the session's listeners the new status.
async fn stop_held(state: &GatewayTasksState, live: &Live) {
    if let Some(tx) = live.cancel.lock().take() {
        let _ = tx.send(());
    }
    live.terminal.send_replace(true);
    listen::publish(state, live.session.as_deref(), &live.record).await;
}

/// The cancel hook of a held call's lease in a tier (`registry::leases`): another replica
/// recorded the task cancelled and asked this one, which holds the call, to stop it. The
/// release is tracked here, where the call is held ("resources released" once it has ended).
fn cancelled_elsewhere(
    state: Arc<GatewayTasksState>,
    live: Arc<Live>,
) -> crate::registry::leases::CancelHook {
    Box::new(move || {
        let (upstream, task_id) = (live.upstream.clone(), live.record.task_id.clone());
        state.registry.releases().cancelled(
            &upstream,
            &task_id,
            crate::metrics::ReleaseReason::Quiet,
        );
        tokio::spawn(async move { stop_held(&state, &live).await });
    })
}

/// Builds [`GatewayTasksService`]s.
#[derive(Clone)]
pub struct GatewayTasksLayer {
    state: Arc<GatewayTasksState>,
}

impl GatewayTasksLayer {
    /// A layer over `state` (one per upstream's stack).
    pub fn new(state: Arc<GatewayTasksState>) -> GatewayTasksLayer {
        GatewayTasksLayer { state }
    }
}

impl<S> tower::Layer<S> for GatewayTasksLayer {
    type Service = GatewayTasksService<S>;
    fn layer(&self, inner: S) -> GatewayTasksService<S> {
        GatewayTasksService {
            inner,
            state: self.state.clone(),
        }
    }
}

/// The `gateway_tasks` layer's service (see the module docs).
#[derive(Clone)]
pub struct GatewayTasksService<S> {
    inner: S,
    state: Arc<GatewayTasksState>,
}

type BoxFut = Pin<Box<dyn Future<Output = Result<McpReply, GatewayError>> + Send>>;

impl<S: Clone> GatewayTasksService<S> {
    /// The inner service for a future that outlives `call`.
    fn take_inner(&mut self) -> S {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }
}

impl<S: McpService> tower::Service<McpRequest> for GatewayTasksService<S> {
    type Response = McpReply;
    type Error = GatewayError;
    /// The inner service's own future for what passes (everything when the layer is off); a
    /// boxed one for what this layer answers or rewrites.
    type Future = Either<S::Future, BoxFut>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: McpRequest) -> Self::Future {
        if !self.state.enabled {
            return Either::Left(self.inner.call(req));
        }
        let state = self.state.clone();
        if is_response(&req) && !state.live.lock().is_empty() {
            // Perhaps a 2025-11-25 client's answer to an input request of a gateway task.
            let mut inner = self.take_inner();
            return Either::Right(Box::pin(async move {
                if input::client_answer(&state, &req).await {
                    return Ok(McpReply::accepted());
                }
                inner.call(req).await
            }));
        }
        if matches!(req.op, crate::exchange::Operation::OpenStream) && req.era() == Era::Legacy {
            if let Some(session) = listen::listens(&req) {
                let mut inner = self.take_inner();
                return Either::Right(Box::pin(async move {
                    let reply = inner.call(req).await?;
                    Ok(listen::merged(&state, &session, reply))
                }));
            }
        }
        match req.request_method() {
            Some("initialize") if req.era() == Era::Legacy => {
                let mut inner = self.take_inner();
                Either::Right(Box::pin(async move {
                    let mut reply = inner.call(req).await?;
                    gone::issued(&state, &reply);
                    reply.body = reply
                        .body
                        .map_messages(move |text| advertise(&state, text, initialize_result));
                    Ok(reply)
                }))
            }
            Some("server/discover") => {
                let mut inner = self.take_inner();
                Either::Right(Box::pin(async move {
                    let mut reply = inner.call(req).await?;
                    reply.body = reply
                        .body
                        .map_messages(move |text| advertise(&state, text, discover_result));
                    Ok(reply)
                }))
            }
            Some("tools/list") if req.era() == Era::Legacy && state.runs_tasks() => {
                let mut inner = self.take_inner();
                Either::Right(Box::pin(async move {
                    let mut reply = inner.call(req).await?;
                    let state = state.clone();
                    reply.body = reply.body.map_messages(move |text| {
                        if !state.runs_tasks() {
                            return None;
                        }
                        optional_task_support(text)
                    });
                    Ok(reply)
                }))
            }
            Some("tools/call") if state.runs_tasks() && asks_for_task(&req) => {
                let inner = self.take_inner();
                Either::Right(Box::pin(held::create(state, inner, req)))
            }
            Some(method @ ("tasks/get" | "tasks/result" | "tasks/cancel" | "tasks/update"))
                if is_gateway_task(&req) =>
            {
                let method = method.to_string();
                Either::Right(Box::pin(async move {
                    Ok(answers::answer(&state, &method, req).await)
                }))
            }
            _ => Either::Left(self.inner.call(req)),
        }
    }
}

/// Whether a `tools/call` asks for a task: the `tasks` layer's [`PendingCreation`] (every 2025
/// task-augmented call; every 2026 call), and under 2026-07-28 the tasks extension declared in
/// `params._meta` (the only way a 2026 client asks).
fn asks_for_task(req: &McpRequest) -> bool {
    if req.extensions.get::<PendingCreation>().is_none() {
        return false;
    }
    if req.era() == Era::Legacy {
        return true;
    }
    let params = req
        .classified()
        .and_then(|c| c.param("_meta"))
        .and_then(|m| serde_json::from_str::<Value>(m).ok())
        .map(|meta| json!({ "_meta": meta }));
    declares_tasks_extension(params.as_ref())
}

/// Whether `req` is a POSTed JSON-RPC response (a result or an error).
fn is_response(req: &McpRequest) -> bool {
    matches!(&req.op, crate::exchange::Operation::Post(m)
        if matches!(m.kind(), jsonrpc::Kind::Response | jsonrpc::Kind::Error))
}

/// Whether a `tasks/*` request names a task taskgate runs (the record `tasks` authorised).
fn is_gateway_task(req: &McpRequest) -> bool {
    req.extensions
        .get::<AuthorisedTask>()
        .is_some_and(|a| a.record.origin == Origin::Gateway)
}

/// An answer's `result` rewritten by `add` (which says whether the upstream declared tasks
/// itself, and adds taskgate's when not). `None`: the message stays as it came.
fn advertise(
    state: &GatewayTasksState,
    text: &str,
    add: fn(&mut Value) -> Option<bool>,
) -> Option<String> {
    let mut v = serde_json::from_str::<Value>(text).ok()?;
    let result = v.get_mut("result").filter(|r| r.is_object())?;
    let added = add(result)?;
    state.learn(!added);
    added.then(|| v.to_string())
}

/// An `InitializeResult` with the 2025 `capabilities.tasks` taskgate serves: `Some(false)`
/// when the upstream declares its own, `Some(true)` when added, `None` when it is not one.
fn initialize_result(result: &mut Value) -> Option<bool> {
    result.get("capabilities").filter(|c| c.is_object())?;
    Some(crate::layers::bridge::translate::add_legacy_tasks_capability(result))
}

/// A `server/discover` result with the tasks extension: `Some(false)` when the upstream
/// advertises it, `Some(true)` when added, `None` when it has no `capabilities` object.
fn discover_result(result: &mut Value) -> Option<bool> {
    let caps = result.get_mut("capabilities")?.as_object_mut()?;
    let extensions = caps.entry("extensions").or_insert_with(|| json!({}));
    let extensions = extensions.as_object_mut()?;
    if extensions
        .get(TASKS_EXTENSION)
        .is_some_and(Value::is_object)
    {
        return Some(false);
    }
    extensions.insert(TASKS_EXTENSION.into(), json!({}));
    Some(true)
}

/// A `tools/list` answer with `execution.taskSupport: "optional"` on every tool without one.
fn optional_task_support(text: &str) -> Option<String> {
    let mut v = serde_json::from_str::<Value>(text).ok()?;
    let result = v.get_mut("result")?;
    crate::layers::bridge::translate::mark_task_support(result, &|_| false).then(|| v.to_string())
}

#[cfg(test)]
mod tests;
