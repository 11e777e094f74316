//! The reverse bridge: a 2026-07-28 client on a 2025-11-25 task server (issue 33; DESIGN.md
//! "Every client, every server", the cell "2026-07-28 task client · 2025-11-25 tasks"). The
//! `bridge` layer above serves the other direction and passes every 2026-07-28 request to this
//! layer, which sits directly below it and above `observe`: the layers above keep the client's
//! era (2026 owner binding, gates, single-flight cancel with the 2026 ack), while `observe`
//! sees the 2025-11-25 requests that actually go upstream and records them as for a 2025
//! client (a task's record: era `legacy`, origin `bridged`, its upstream session).
//!
//! **When.** A 2026-07-28 request (`McpRequest::era`) to an upstream whose era is
//! [`UpstreamEra::Legacy`]: `upstream.protocol = "2025-11-25"`, or `"auto"` and the upstream
//! refuses taskgate's own `server/discover` (a 2025 server refuses it without a session, or
//! answers `-32601`). That is the one fact per upstream the `bridge` above reads too
//! (`bridge::era`: learned once per process from taskgate's own well-formed discovery, never
//! from a client's; one unanswered within `bridge::DISCOVER_DEADLINE` decides nothing and is
//! asked again after `bridge::UNANSWERED_RETRY`). Every other 2026-07-28 request, and every
//! 2025-11-25 one, passes untouched (2025 clients on the same upstream are unchanged). No new
//! configuration.
//!
//! **Sessions** (`sessions`): each request goes out on a 2025-11-25 session taskgate holds,
//! one per principal with auth and per client address without (why: see `sessions`), opened
//! with `initialize` (client capabilities [`HELD_CLIENT_CAPABILITIES`]: what this bridge
//! relays, see there) + `notifications/initialized` by the first request that needs it and
//! opened again when the upstream answers 404 on it (the request is then sent once more);
//! pinged every `gateway.session_idle_ms` / 2 (at most 30 s), side by side (`pings`: at most
//! [`MAX_CONCURRENT_PINGS`] at once, one per session), a ping answered 404 opening it again.
//!
//! **Requests** (every one taskgate sends upstream here): under an id taskgate mints (a string
//! no client id is: two stateless clients sharing a session can use the same id), the answer
//! given back under the client's id; `params._meta` without the `io.modelcontextprotocol/*`
//! keys (`traceparent`, `progressToken` and other keys kept: `translate::legacy_params`);
//! `MCP-Protocol-Version` the session's negotiated version (`2025-11-25`), its
//! `Mcp-Session-Id`, no `Mcp-Method` / `Mcp-Name`.
//!
//! A request whose `params._meta` lacks `io.modelcontextprotocol/protocolVersion` or
//! `io.modelcontextprotocol/clientCapabilities` (required on every 2026-07-28 request), is
//! not an object, or has a `progressToken` of another type is refused `-32602` (HTTP 400)
//! under the client's id, sent nowhere: taskgate is this client's 2026-07-28 server.
//!
//! What each 2026-07-28 message becomes:
//! - `server/discover`: answered here from the held session's `InitializeResult`
//!   (`translate::discover_result`: `supportedVersions` with 2026-07-28, the tasks extension
//!   iff the upstream has `capabilities.tasks.requests.tools.call`, tools/resources/prompts as
//!   the upstream declared them).
//! - `tools/call`: the tool's `execution.taskSupport` is read from the session's `tools/list`
//!   (asked when the tool is not in the cached one). A task tool (`required`, or `optional`
//!   when this request declares the extension) on an upstream that runs tool tasks is sent as
//!   a 2025 task (`params.task.ttl` = `tasks.max_ttl_ms`, the ttl taskgate would cap to
//!   anyway; the upstream may lower it) and answered as the flat `CreateTaskResult`
//!   (`resultType:"task"`, `ttlMs`, `pollIntervalMs`) once `observe` has recorded it. A
//!   `required` tool called without the extension is `-32021` naming it (HTTP 400; 2026-07-28
//!   tasks §creation), sent nowhere. Any other call goes out plain and its result gets
//!   `resultType:"complete"`.
//! - `tasks/get` (authorised by `tasks` above, routed to the task's recorded session): 2025
//!   `tasks/get`; at a terminal status one 2025 `tasks/result` (the payload `observe` keeps in
//!   the record, so later polls are answered from it, here, without the upstream); answered as
//!   a `DetailedTask` (`translate::detailed_task`: a tool error keeps its content as a
//!   `completed` result with `isError`, a JSON-RPC error is `failed` with that `error`).
//! - `tasks/cancel` (single-flighted by `cancel` above; a terminal task is acknowledged there):
//!   one 2025 `tasks/cancel`, answered with the 2026 ack `{"resultType":"complete"}`, also when
//!   the upstream says the task is already terminal (`-32602`).
//! - `input_required` (`input`): the first `tasks/get` that sees it opens one upstream
//!   `tasks/result` for the task in the background; the upstream's requests on it
//!   (`elicitation/create`, `sampling/createMessage`, `roots/list`, each only when that
//!   `tasks/get` declared its capability; any other is answered upstream `-32601`: see
//!   [`HELD_CLIENT_CAPABILITIES`]) are shown as the
//!   `DetailedTask`'s `inputRequests`, keyed by their JSON-RPC id (that `tasks/get` waits up to
//!   [`INPUT_WAIT`] for the first), and written to the task's record
//!   (`TaskRecord::input_requests`), so a `tasks/get` on another replica or after a restart
//!   shows them too. One a previous run of taskgate followed whose record holds no request (it
//!   could not be stored, and the 1.x SDKs do not send it again) is `failed` with a
//!   `statusMessage` saying so, and cancelled upstream (see `input`). `tasks/update`: each
//!   `inputResponses[key]` for a request kept (here, or in the record: answered once) goes
//!   upstream as the JSON-RPC response to it, on the task's session; the ack
//!   (`{"resultType":"complete"}`), unless `inputResponses` is not an object (`-32602`, HTTP
//!   400).
//! - `subscriptions/listen` (`listen`): served here, never sent upstream (a 2025 server has no
//!   such method): the list changes the upstream declares and the caller's task ids
//!   acknowledged; the upstream's `notifications/tasks/status` (on the held session's GET
//!   stream, which taskgate reads while the caller listens, or a followed `tasks/result` stream)
//!   sent as `notifications/tasks` with the `DetailedTask` a `tasks/get` gives.
//! - any other request (`tools/list`, `resources/*`, `prompts/*`, …): sent on the session;
//!   results get `resultType:"complete"` (a `tools/list`'s tools lose the 2025
//!   `execution.taskSupport`: `translate::modern_tools_list`); an SSE answer keeps its
//!   notifications; the upstream's own requests on it (2026-07-28 has no server→client
//!   requests, and a plain call has no task whose `inputRequests` could show them) are
//!   answered upstream at once on the session, not shown: a `ping` with `{}`, any other (`sampling/createMessage`,
//!   `elicitation/create`, `roots/list`) with `-32601` saying so, counted in
//!   `taskgate_bridge_input_refused_total{reason="undeclared"}` (`forward::Refuser`).
//! - a client that goes away before the answer to a request sent here (a plain `tools/call`,
//!   any forwarded request): `notifications/cancelled` upstream on the same session, naming the
//!   request id the upstream got (2026-07-28 transports: closing the stream is the cancel).
//! - notifications: sent on the session as they are (`_meta` cleaned); responses a client
//!   POSTs: 202, dropped (no upstream request of this bridge asks a 2026 client anything),
//!   except those `gateway_tasks` sends for a gateway task's held call
//!   ([`RelaysUpstreamRequests`]: the answers to the server's requests on that call's stream,
//!   which this layer then keeps): sent on the caller's session as they are.
//! - GET and DELETE: 405 (2026-07-28 has no standalone stream and no sessions).
//!
//! **Files**, by concern (each imports only this file and those listed before it): `sessions`
//! (the table of held sessions), `translate` (the JSON of each era), this file (the layer, the
//! dispatch, opening and sending on held sessions, `tools/call` and `tasks/get|cancel`),
//! `pings` (keeping held sessions alive), `forward` (requests and notifications passed on as
//! they are), `listen` (`subscriptions/listen`), `input` (input requests, `tasks/update`).
//!
//! **Errors**: an upstream session that cannot be opened is `-32603` naming why; an exchange
//! taskgate makes itself that the upstream does not finish within its `timeout_ms` is the
//! upstream timeout's `-32603`. A JSON-RPC error the upstream answers keeps its code and message
//! and gets the 2026-07-28 HTTP status for its code (`mcp::errors::modern_error_status`).

mod forward;
pub mod input;
pub mod listen;
mod pings;
mod sessions;
pub mod translate;

pub use super::era::ForModernUpstream;
pub use input::INPUT_WAIT;
pub use pings::MAX_CONCURRENT_PINGS;
pub use sessions::{UpstreamSession, UpstreamSessions, MAX_UPSTREAM_SESSIONS};
pub use translate::PROTOCOL_META_PREFIX;

use super::answer::answer_of;
use super::era::{Discovery, UpstreamEra};
use crate::exchange::{GatewayError, McpReply, McpRequest, Operation, ReplyBody, RequestParts};
use crate::jsonrpc::{self, Id, Kind, Message};
use crate::layers::extensions::{AuthorisedTask, PendingCreation, RelaysUpstreamRequests};
use crate::layers::lost_task;
use crate::layers::own_request;
use crate::layers::relay::OwnIds;
use crate::layers::McpService;
use crate::mcp::capabilities::{
    declares_tasks_extension, ClientCapabilities, CLIENT_CAPABILITIES_META,
};
use crate::mcp::era::{Era, PROTOCOL_VERSION_META};
use crate::mcp::errors::McpError;
use crate::mcp::task::TaskStatus;
use crate::metrics::LocalReason;
use crate::registry::Registry;
use crate::store::{Origin, TaskRecord};
use bytes::Bytes;
use forward::{forward, modern_reply, notification};
use futures_util::future::Either;
use http::{HeaderValue, StatusCode};
use input::{input_lost, input_requests, tasks_update, Input};
use serde_json::{json, Map, Value};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::ServiceExt;
use translate::Outcome;

/// The protocol version taskgate asks for in the `initialize` of a session it holds.
pub const LEGACY_VERSION: &str = "2025-11-25";
/// Most `tools/list` pages read to learn one tool's `taskSupport`.
pub const MAX_TOOL_PAGES: usize = 16;

/// The client capabilities a held session declares in its `initialize` (2025-11-25
/// lifecycle: `ClientCapabilities`): exactly the requests this bridge relays to a 2026-07-28
/// client, as a task's `inputRequests` (`input`) or a gateway task's (`forward`,
/// [`RelaysUpstreamRequests`]): `elicitation` (form mode: `{}`), `sampling` (no `context`, no
/// `tools`) and `roots` (no `listChanged`: no 2026-07-28 client tells taskgate its roots
/// changed). Nothing else (no `tasks`: taskgate runs no task for the server). A compliant
/// 2025-11-25 server sends none of these to a session that did not declare it, so without
/// them the `input_required` relay was reachable only with servers that ignore capabilities
/// (server-everything's `simulate-research-query` never asked).
///
/// Why all of them, whatever one caller declares: a held session is shared by every
/// 2026-07-28 request of its tenant (a principal, or a client address: see `sessions`), and
/// 2026-07-28 declares capabilities per request, not per session, so the session declares
/// what the bridge can relay and each request of the upstream's is checked against the
/// 2026-07-28 request it reaches: one whose capability that request did not declare
/// (`_meta["io.modelcontextprotocol/clientCapabilities"]`; for a task's input, the `tasks/get`
/// that started following it) is answered upstream on the caller's behalf as a 2025-11-25
/// client without it answers (no handler: `-32601`), never shown, so nothing waits for an
/// answer that cannot come; counted `taskgate_bridge_input_refused_total{reason="undeclared"}`.
pub const HELD_CLIENT_CAPABILITIES: &str = r#"{"elicitation":{},"sampling":{},"roots":{}}"#;

/// The top-level client capabilities a 2026-07-28 request declares in
/// `params._meta["io.modelcontextprotocol/clientCapabilities"]` (none when absent or
/// unreadable).
pub(crate) fn declared_by(req: &McpRequest) -> ClientCapabilities {
    let Operation::Post(msg) = &req.op else {
        return ClientCapabilities::default();
    };
    let path = ["params", "_meta", CLIENT_CAPABILITIES_META];
    match crate::jsonrpc::splice::raw_at(msg.bytes(), &path) {
        Ok(Some(raw)) => serde_json::from_str::<Value>(raw.get())
            .map(|c| ClientCapabilities::of(&c))
            .unwrap_or_default(),
        _ => ClientCapabilities::default(),
    }
}

/// One upstream's reverse-bridge state: its era (shared with the `bridge` state), and its
/// held sessions.
pub struct ReverseState {
    registry: Arc<Registry>,
    /// The upstream's era, the one fact the `bridge` reads too.
    era: Arc<Discovery>,
    sessions: UpstreamSessions,
    /// Input requests of tasks that are `input_required` upstream (see `input`).
    inputs: input::Inputs,
    /// The 2026 clients' `subscriptions/listen` streams (see `listen`).
    listens: listen::Listens,
    ids: OwnIds,
    /// The upstream's `timeout_ms`: bounds each exchange taskgate makes itself.
    timeout: Duration,
    /// Whether the held sessions' pinger runs (started with the first session; see `sessions`).
    pinging: std::sync::atomic::AtomicBool,
    /// This state, for the pinger (which ends with it).
    me: std::sync::Weak<ReverseState>,
    /// Permits for the refusals of the upstream's requests during a plain call, each sent in
    /// the background (`forward::Refuser`): at most [`MAX_REFUSALS_IN_FLIGHT`] at once.
    refusals: Arc<tokio::sync::Semaphore>,
}

/// Most refusals of the upstream's requests in flight at once per upstream (see
/// `forward::Refuser`); past it a request is left unanswered, logged.
pub const MAX_REFUSALS_IN_FLIGHT: usize = 64;

impl ReverseState {
    /// The state of one upstream whose era is `era` (shared with its `bridge` state);
    /// taskgate's own exchanges bounded by `timeout` (the upstream's `timeout_ms`); held
    /// sessions idle for `idle` (`gateway.session_idle_ms`) with no live task forgotten.
    pub fn new(
        registry: Arc<Registry>,
        era: Arc<Discovery>,
        timeout: Duration,
        idle: Duration,
    ) -> Arc<ReverseState> {
        Arc::new_cyclic(|me| ReverseState {
            registry,
            era,
            sessions: UpstreamSessions::new(idle),
            inputs: input::Inputs::default(),
            listens: listen::Listens::default(),
            ids: OwnIds::default(),
            timeout,
            pinging: std::sync::atomic::AtomicBool::new(false),
            me: me.clone(),
            refusals: Arc::new(tokio::sync::Semaphore::new(MAX_REFUSALS_IN_FLIGHT)),
        })
    }

    /// Whether the upstream speaks only 2025-11-25, when known without asking it.
    fn known(&self) -> Option<bool> {
        self.era.known().map(|e| e == UpstreamEra::Legacy)
    }

    async fn bounded<T>(
        &self,
        upstream: &Arc<str>,
        exchange: impl Future<Output = Result<T, GatewayError>>,
    ) -> Result<T, GatewayError> {
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => {
                self.registry
                    .metrics()
                    .upstream_error(upstream, crate::metrics::UpstreamErrorKind::Timeout);
                Err(GatewayError::UpstreamTimeout {
                    upstream: upstream.clone(),
                    timeout_ms: self.timeout.as_millis().min(u64::MAX as u128) as u64,
                })
            }
        }
    }
}

/// Builds [`ReverseService`]s over one upstream's [`ReverseState`].
#[derive(Clone)]
pub struct ReverseLayer {
    state: Arc<ReverseState>,
}

impl ReverseLayer {
    /// A layer bridging with `state`.
    pub fn new(state: Arc<ReverseState>) -> ReverseLayer {
        ReverseLayer { state }
    }
}

impl<S> tower::Layer<S> for ReverseLayer {
    type Service = ReverseService<S>;
    fn layer(&self, inner: S) -> ReverseService<S> {
        ReverseService {
            inner,
            state: self.state.clone(),
        }
    }
}

/// The reverse bridge's service (see the module docs).
#[derive(Clone)]
pub struct ReverseService<S> {
    inner: S,
    state: Arc<ReverseState>,
}

type BoxFut = Pin<Box<dyn Future<Output = Result<McpReply, GatewayError>> + Send>>;

impl<S: McpService> tower::Service<McpRequest> for ReverseService<S> {
    type Response = McpReply;
    type Error = GatewayError;
    /// The inner service's own future for what passes (2025-11-25 requests, any request to an
    /// upstream that speaks 2026-07-28); a boxed one otherwise.
    type Future = Either<S::Future, BoxFut>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: McpRequest) -> Self::Future {
        if req.era() != Era::Modern
            || self.state.known() == Some(false)
            || req.extensions.get::<ForModernUpstream>().is_some()
        {
            return Either::Left(self.inner.call(req));
        }
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let state = self.state.clone();
        Either::Right(Box::pin(async move {
            if state.era.era(&inner, &req, &state.ids).await == Some(UpstreamEra::Legacy) {
                bridge(&state, inner, req).await
            } else {
                // It speaks 2026-07-28, or its era is not known yet (see `bridge::era`).
                inner.oneshot(req).await
            }
        }))
    }
}

/// A 2026-07-28 request bridged to the 2025-11-25 upstream (see the module docs).
async fn bridge<S: McpService>(
    state: &Arc<ReverseState>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError> {
    let msg = match &req.op {
        Operation::Post(m) => m.clone(),
        _ => {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::ALLOW, HeaderValue::from_static("POST"));
            return Ok(
                McpReply::new(StatusCode::METHOD_NOT_ALLOWED, headers, ReplyBody::Empty)
                    .answered_locally(LocalReason::HeldUpstreamSession),
            );
        }
    };
    match msg.kind() {
        Kind::Response | Kind::Error
            if req.extensions.get::<RelaysUpstreamRequests>().is_some() =>
        {
            // A client's answer to the server's request during a gateway task's held call
            // (`gateway_tasks`): to the server, on the caller's session, as it is.
            let body = msg.parse_as::<Value>().unwrap_or(Value::Null);
            let _ = send(state, &inner, &req, &body, On::Caller, &|_, _| {}).await;
            return Ok(McpReply::accepted().answered_locally(LocalReason::HeldUpstreamSession));
        }
        Kind::Response | Kind::Error => {
            return Ok(McpReply::accepted().answered_locally(LocalReason::HeldUpstreamSession))
        }
        Kind::Notification => return notification(state, inner, &req, &msg).await,
        _ => {}
    }
    let id = msg.id().cloned().expect("a request has an id");
    // Params taskgate cannot read (a number beyond f64) cannot be translated: refused, never
    // sent on without them.
    let params: Option<Value> = match msg.params().map(serde_json::from_str::<Value>) {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => {
            let error = McpError::ParamsUnreadable {
                method: None,
                detail: e.to_string(),
            };
            return Ok(McpReply::error(Era::Modern, Some(&id), &error)
                .answered_locally(LocalReason::InvalidParams));
        }
    };
    // taskgate is this client's 2026-07-28 server: `params._meta` is an object (MCP
    // basic/_meta) carrying the version and the client's capabilities (2026-07-28: required on
    // every request, `-32602` HTTP 400 without them), and `progressToken` a string or an
    // integer (2025-11-25 basic/utilities/progress): what the 2025 upstream would refuse with
    // an error under no id is refused here, under the client's.
    let meta = params.as_ref().and_then(|p| p.get("_meta"));
    const REQUIRED: [&str; 2] = [PROTOCOL_VERSION_META, CLIENT_CAPABILITIES_META];
    let bad_meta = match meta {
        None => Some((
            "_meta".to_string(),
            format!(
                "must carry {} and {} (required on every 2026-07-28 request)",
                REQUIRED[0], REQUIRED[1]
            ),
        )),
        Some(Value::Object(m)) => match (
            REQUIRED.iter().find(|k| !m.contains_key(**k)),
            m.get("progressToken"),
        ) {
            (Some(k), _) => Some((
                format!("_meta[\"{k}\"]"),
                "is required on every 2026-07-28 request".to_string(),
            )),
            (None, None | Some(Value::String(_))) => None,
            (None, Some(Value::Number(n))) if n.is_i64() || n.is_u64() => None,
            (None, Some(_)) => Some((
                "_meta.progressToken".to_string(),
                "must be a string or an integer".to_string(),
            )),
        },
        Some(_) => Some(("_meta".to_string(), "must be an object".to_string())),
    };
    if let Some((key, problem)) = bad_meta {
        let error = McpError::InvalidParam {
            method: None,
            key,
            problem,
        };
        return Ok(McpReply::error(Era::Modern, Some(&id), &error)
            .answered_locally(LocalReason::InvalidParams));
    }
    let method = msg.method().unwrap_or_default().to_string();
    let record = req
        .extensions
        .get::<AuthorisedTask>()
        .map(|a| a.record.clone());
    Ok(match method.as_str() {
        "server/discover" => match session(state, &inner, &req).await? {
            Ok(s) => McpReply::local_json(jsonrpc::result_response(
                &id,
                &translate::discover_result(&s.init).to_string(),
            ))
            .answered_locally(LocalReason::HeldUpstreamSession),
            Err(NoSession(reply)) => reply,
        },
        // Served here from the held session's GET stream and the statuses taskgate reads
        // (`listen`); the 2025 upstream has no such method.
        "subscriptions/listen" => listen::open(state, inner, req, &id, params.as_ref()).await,
        "tools/call" => tools_call(state, inner, req, id, params).await?,
        "tasks/get" | "tasks/cancel" | "tasks/update" => match record {
            Some(r) if r.era == Era::Legacy => match method.as_str() {
                "tasks/get" => tasks_get(state, inner, &req, &id, r).await?,
                "tasks/cancel" => tasks_cancel(state, inner, &req, &id, r).await?,
                _ => tasks_update(state, inner, &req, &id, r, params.as_ref()).await,
            },
            // Not authorised by `tasks` (a stack without it): the upstream answers.
            _ => forward(state, inner, &req, &id, &method, params.as_ref(), None).await?,
        },
        _ => forward(state, inner, &req, &id, &method, params.as_ref(), None).await?,
    })
}

/// Why a request could not go out on a held session: the reply for it (`-32603` naming why,
/// under the client's id).
struct NoSession(McpReply);

/// The session `req`'s caller uses, opened when none is held.
async fn session<S: McpService>(
    state: &ReverseState,
    inner: &S,
    req: &McpRequest,
) -> Result<Result<Arc<UpstreamSession>, NoSession>, GatewayError> {
    let tenant = req.ctx.tenant();
    if let Some(s) = state.sessions.get(&tenant) {
        return Ok(Ok(s));
    }
    let _one = state.sessions.opening.lock().await;
    if let Some(s) = state.sessions.get(&tenant) {
        return Ok(Ok(s));
    }
    let s = match open(state, inner, req).await {
        Ok(s) => s,
        Err(Unopened::Refused(why)) => return Ok(Err(no_session(req, &why))),
        Err(Unopened::Failed(e)) => return Err(e),
    };
    if !state
        .pinging
        .swap(true, std::sync::atomic::Ordering::SeqCst)
    {
        tokio::spawn(pings::ping_held(state.me.clone(), inner.clone()));
    }
    if state.sessions.insert(tenant, s.clone()).is_err() {
        return Ok(Err(no_session(req, &format!("taskgate holds {MAX_UPSTREAM_SESSIONS} upstream sessions, each with live tasks; try again later"))));
    }
    Ok(Ok(s))
}

fn no_session(req: &McpRequest, why: &str) -> NoSession {
    let error = McpError::UpstreamSessionNotHeld {
        upstream: req.ctx.upstream.to_string(),
        detail: why.to_string(),
    };
    NoSession(McpReply::error(Era::Modern, req.id(), &error))
}

/// Why [`open`] held no session: the upstream refused the `initialize` (what it said), or the
/// exchange failed (unreachable, an invalid answer, past `timeout_ms`), which is the edge's
/// 502 / 504 as for any request (review 20 #4: it was answered HTTP 200 `-32603`).
enum Unopened {
    Refused(String),
    Failed(GatewayError),
}

impl std::fmt::Display for Unopened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unopened::Refused(why) => f.write_str(why),
            Unopened::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// Opens a 2025-11-25 session on the upstream: `initialize` (taskgate's own client info, the
/// client capabilities [`HELD_CLIENT_CAPABILITIES`]), then `notifications/initialized`; both
/// bounded by `timeout_ms`. Errors: [`Unopened`].
async fn open<S: McpService>(
    state: &ReverseState,
    inner: &S,
    req: &McpRequest,
) -> Result<Arc<UpstreamSession>, Unopened> {
    let id = state.ids.next_id();
    let body = json!({"jsonrpc": "2.0", "id": id_value(&id), "method": "initialize", "params": {
        "protocolVersion": LEGACY_VERSION,
        "capabilities": serde_json::from_str::<Value>(HELD_CLIENT_CAPABILITIES).unwrap_or_default(),
        "clientInfo": {"name": "taskgate", "version": env!("CARGO_PKG_VERSION")},
    }});
    let mut out = request_with(req, body, None);
    out.ctx
        .headers
        .remove(&crate::headers::MCP_PROTOCOL_VERSION);
    let upstream = req.ctx.upstream.clone();
    let (session_id, answer) = state
        .bounded(&upstream, async {
            let reply = inner.clone().oneshot(out).await?;
            let sid = reply.headers.get("mcp-session-id").cloned();
            Ok((sid, answer_of(reply, &id).await))
        })
        .await
        .map_err(Unopened::Failed)?;
    let Some(init) = answer
        .as_ref()
        .and_then(|a| a.get("result"))
        .filter(|r| r.is_object())
        .cloned()
    else {
        let why = answer
            .as_ref()
            .and_then(|a| a.pointer("/error/message"))
            .and_then(Value::as_str)
            .unwrap_or("no InitializeResult");
        return Err(Unopened::Refused(format!("initialize: {why}")));
    };
    let version = init
        .get("protocolVersion")
        .and_then(Value::as_str)
        .and_then(|v| HeaderValue::from_str(v).ok())
        .unwrap_or_else(|| HeaderValue::from_static(LEGACY_VERSION));
    let session = Arc::new(UpstreamSession::new(session_id, version, init));
    session.set_opened_in(req.ctx.clone());
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let out = request_with(req, note, Some(&session));
    let _ = state
        .bounded(&upstream, async { inner.clone().oneshot(out).await })
        .await;
    tracing::debug!(upstream = %upstream, session = ?session.id, "2025-11-25 upstream session opened for 2026-07-28 clients");
    Ok(session)
}

/// Opens `req`'s caller's session again after the upstream answered 404 on `lost` (a ping, the
/// GET stream), as [`send`] does for a request, without its call back into [`session`]
/// (which spawns the pinger); a replacement another request already opened is kept.
async fn reopen<S: McpService>(
    state: &ReverseState,
    inner: &S,
    req: &McpRequest,
    lost: &UpstreamSession,
) {
    let _one = state.sessions.opening.lock().await;
    let tenant = req.ctx.tenant();
    // Another request opened its replacement meanwhile (read without counting as use).
    if let Some(id) = lost.id.as_ref() {
        if state.sessions.route(id).is_some_and(|s| s.id != lost.id) {
            return;
        }
    }
    match open(state, inner, req).await {
        Ok(new) => state.sessions.replace(&tenant, lost, new),
        Err(why) => {
            tracing::info!(upstream = %req.ctx.upstream, %why, "a held upstream session lost (404) could not be opened again")
        }
    }
}

/// `id` as a JSON value.
fn id_value(id: &Id) -> Value {
    serde_json::from_str(id.as_json()).unwrap_or(Value::Null)
}

/// The upstream request `body` in `req`'s context: on `session` (its id and negotiated
/// version; none: no session, the client's version header removed), without the client's
/// `Mcp-Method` / `Mcp-Name`, era 2025-11-25, `req`'s extensions kept (an [`AuthorisedTask`]
/// and the `cancel` layer's deadline for `observe` and the transport).
fn request_with(req: &McpRequest, body: Value, session: Option<&UpstreamSession>) -> McpRequest {
    let msg = Message::parse(Bytes::from(body.to_string())).expect("a well-formed message");
    let method = msg.method().unwrap_or_default();
    let mut ctx = own_request::context(&req.ctx, Era::Legacy, method, None);
    ctx.session_id = session.and_then(|s| s.id.clone());
    match session {
        Some(s) => {
            ctx.headers
                .insert(&crate::headers::MCP_PROTOCOL_VERSION, s.version.clone());
        }
        None => {
            ctx.headers.remove(&crate::headers::MCP_PROTOCOL_VERSION);
        }
    }
    let mut extensions = req.extensions.clone();
    extensions.insert(Era::Legacy);
    McpRequest::from(RequestParts {
        op: Operation::Post(msg),
        ctx,
        extensions,
        trace: req.trace.clone(),
    })
}

/// A 2025-11-25 request `method` with `params` under taskgate's own id `own`.
fn legacy_body(own: &Id, method: &str, params: Map<String, Value>) -> Value {
    let mut body = json!({"jsonrpc": "2.0", "id": id_value(own), "method": method});
    if !params.is_empty() {
        body["params"] = Value::Object(params);
    }
    body
}

/// Which session a request goes out on.
enum On {
    /// The caller's (opened when none is held).
    Caller,
    /// A task's recorded session (`req.ctx.session_id`, set by `tasks`), or what replaced it.
    Task,
}

/// Sends `body` (under `own`) on the session `on` names and returns the reply; an upstream
/// 404 (the session ended upstream) opens a new session for the caller and sends it once more.
async fn send<S: McpService>(
    state: &ReverseState,
    inner: &S,
    req: &McpRequest,
    body: &Value,
    on: On,
    prepare: &(dyn Fn(&mut McpRequest, &UpstreamSession) + Send + Sync),
) -> Result<Result<McpReply, NoSession>, GatewayError> {
    let mut first = match on {
        On::Caller => match session(state, inner, req).await? {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        },
        On::Task => {
            let recorded = req.ctx.session_id.clone();
            match recorded.as_ref().and_then(|id| state.sessions.route(id)) {
                Some(s) => s,
                None => Arc::new(UpstreamSession::new(
                    recorded,
                    match state.sessions.get(&req.ctx.tenant()) {
                        Some(s) => s.version.clone(),
                        None => HeaderValue::from_static(LEGACY_VERSION),
                    },
                    Value::Null,
                )),
            }
        }
    };
    let mut retried = false;
    loop {
        let mut out = request_with(req, body.clone(), Some(&first));
        prepare(&mut out, &first);
        let reply = inner.clone().oneshot(out).await?;
        let Some(lost) = first
            .id
            .clone()
            .filter(|_| reply.status == StatusCode::NOT_FOUND && !retried)
        else {
            return Ok(Ok(reply));
        };
        retried = true;
        tracing::info!(upstream = %req.ctx.upstream, session = ?lost, "upstream session gone (404): initialized again");
        let tenant = req.ctx.tenant();
        let _one = state.sessions.opening.lock().await;
        first = match state.sessions.route(&lost) {
            // Another request opened its replacement meanwhile.
            Some(s) if s.id.as_ref() != Some(&lost) => s,
            _ => match open(state, inner, req).await {
                Ok(s) => {
                    state.sessions.replace(&tenant, &first, s.clone());
                    s
                }
                Err(Unopened::Refused(why)) => return Ok(Err(no_session(req, &why))),
                Err(Unopened::Failed(e)) => return Err(e),
            },
        };
    }
}

/// The tool's `execution.taskSupport` on the session's upstream (`None`: unknown tool, or its
/// `tools/list` could not be read), reading `tools/list` when the cached one does not name it.
async fn task_support<S: McpService>(
    state: &ReverseState,
    inner: &S,
    req: &McpRequest,
    session: &Arc<UpstreamSession>,
    tool: &str,
) -> Option<String> {
    if let Some(t) = session.tools() {
        if let Some(s) = translate::task_support(&t, tool) {
            return Some(s.to_string());
        }
    }
    let mut all = Vec::new();
    let mut cursor: Option<Value> = None;
    for _ in 0..MAX_TOOL_PAGES {
        let own = state.ids.next_id();
        let mut params = Map::new();
        if let Some(c) = cursor.take() {
            params.insert("cursor".into(), c);
        }
        let mut out = request_with(req, legacy_body(&own, "tools/list", params), Some(session));
        out.extensions.remove::<PendingCreation>();
        out.extensions.remove::<AuthorisedTask>();
        let upstream = req.ctx.upstream.clone();
        let answer = state
            .bounded(&upstream, async {
                let reply = inner.clone().oneshot(out).await?;
                Ok(answer_of(reply, &own).await)
            })
            .await
            .ok()
            .flatten()?;
        let result = answer.get("result")?;
        if let Some(tools) = result.get("tools").and_then(Value::as_array) {
            all.extend(tools.iter().cloned());
        }
        match result.get("nextCursor") {
            Some(c) if c.is_string() && all.len() < sessions::MAX_TOOLS => cursor = Some(c.clone()),
            _ => break,
        }
    }
    let tools = json!({ "tools": all });
    let support = translate::task_support(&tools, tool).map(str::to_string);
    session.set_tools(tools);
    support
}

/// A 2026-07-28 `tools/call` (see the module docs).
async fn tools_call<S: McpService>(
    state: &Arc<ReverseState>,
    inner: S,
    req: McpRequest,
    id: Id,
    params: Option<Value>,
) -> Result<McpReply, GatewayError> {
    let held = match session(state, &inner, &req).await? {
        Ok(s) => s,
        Err(NoSession(reply)) => return Ok(reply),
    };
    let tool = params
        .as_ref()
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let support = match translate::runs_tool_tasks(&held.init) {
        true => task_support(state, &inner, &req, &held, &tool).await,
        false => None,
    };
    let declared = declares_tasks_extension(params.as_ref());
    let as_task = match support.as_deref() {
        Some("required") if !declared => {
            return Ok(
                McpReply::error(Era::Modern, Some(&id), &McpError::MissingTasksExtension)
                    .answered_locally(LocalReason::MissingExtension),
            );
        }
        Some("required") => true,
        Some("optional") => declared,
        _ => false,
    };
    if !as_task {
        return forward(state, inner, &req, &id, "tools/call", params.as_ref(), None).await;
    }
    // Here taskgate, not the server, decides that the call becomes a task: its slot (a 2026
    // call's, provisional) is admitted against the owner's live tasks before anything goes
    // upstream (before: after the server had made the task, which was then cancelled).
    if let Some(pending) = req.extensions.get::<PendingCreation>() {
        match state.registry.admit_creation(&pending.reservation).await {
            Ok(true) => {}
            Ok(false) => {
                let error = state.registry.refuse_over_limit(&req.ctx.upstream);
                return Ok(McpReply::error(Era::Modern, Some(&id), &error)
                    .answered_locally(LocalReason::OwnerLimit));
            }
            Err(_) => {
                // The store's error is logged and counted by the registry, not sent.
                let error = McpError::StoreUnavailable {
                    method: Some("tools/call".into()),
                };
                return Ok(McpReply::error(Era::Modern, Some(&id), &error)
                    .answered_locally(LocalReason::StoreUnavailable));
            }
        }
    }
    let ttl = state.registry.config().max_ttl_ms;
    let own = state.ids.next_id();
    let mut p = translate::legacy_params(params.as_ref());
    p.insert("task".into(), json!({ "ttl": ttl }));
    let body = legacy_body(&own, "tools/call", p);
    // `observe` records the nested `CreateTaskResult` as the 2025 task it is upstream, on the
    // session it went out on, bound to the 2026 caller.
    let recorded_as = |out: &mut McpRequest, session: &UpstreamSession| {
        if let Some(p) = out.extensions.get_mut::<PendingCreation>() {
            p.template = Arc::new(TaskRecord {
                era: Era::Legacy,
                origin: Origin::Bridged,
                upstream_session: session.id_text(),
                protocol_version: session.version.to_str().ok().map(str::to_string),
                ..TaskRecord::clone(&p.template)
            });
        }
    };
    let upstream = req.ctx.upstream.clone();
    let sent = state
        .bounded(&upstream, async {
            match send(state, &inner, &req, &body, On::Caller, &recorded_as).await? {
                Ok(reply) => Ok(Ok(answer_of(reply, &own).await)),
                Err(e) => Ok(Err(e)),
            }
        })
        .await;
    let answer = match sent {
        Ok(Ok(answer)) => answer,
        Ok(Err(NoSession(reply))) => return Ok(reply),
        // Unreachable, invalid, past `timeout_ms`: the edge's 502 / 504 with `-32603` naming
        // the upstream, as for every other request (a 2026 `-32603` of its own is HTTP 200).
        Err(e) => return Err(e),
    };
    let created = answer
        .as_ref()
        .and_then(|a| a.get("result"))
        .and_then(translate::modern_create_result);
    if let Some(flat) = created {
        let ttl_ms = flat.get("ttlMs").and_then(Value::as_u64).unwrap_or(ttl);
        // The session lives as long as the task may be asked about (the recorded one, or
        // what replaced it).
        let held_now = state.sessions.get(&req.ctx.tenant()).unwrap_or(held);
        held_now.keep_for(Duration::from_millis(ttl_ms.min(ttl)));
        return Ok(McpReply::local_json(jsonrpc::result_response(
            &id,
            &flat.to_string(),
        )));
    }
    // A plain result (the upstream ran it without a task) or an error.
    Ok(modern_reply(
        &id,
        answer.as_ref(),
        translate::complete_result,
    ))
}

/// A 2026-07-28 `tasks/get` of a task recorded on a 2025-11-25 session (see the module docs).
async fn tasks_get<S: McpService>(
    state: &Arc<ReverseState>,
    inner: S,
    req: &McpRequest,
    id: &Id,
    record: Arc<TaskRecord>,
) -> Result<McpReply, GatewayError> {
    if let Some(detailed) = stored_detailed(&record) {
        return Ok(
            McpReply::local_json(jsonrpc::result_response(id, &detailed.to_string()))
                .answered_locally(LocalReason::StoredResult),
        );
    }
    let task_id = record.task_id.clone();
    let upstream = req.ctx.upstream.clone();
    let asked = state
        .bounded(&upstream, async {
            let own = state.ids.next_id();
            let body = legacy_body(&own, "tasks/get", task_params(&task_id));
            let task = match send(state, &inner, req, &body, On::Task, &|_, _| {}).await? {
                Ok(reply) => answer_of(reply, &own).await,
                Err(NoSession(reply)) => return Ok(Err(reply)),
            };
            let status = task
                .as_ref()
                .and_then(|a| a.pointer("/result/status"))
                .and_then(Value::as_str)
                .and_then(TaskStatus::parse);
            let outcome = match status {
                Some(TaskStatus::Completed | TaskStatus::Failed) => {
                    let own = state.ids.next_id();
                    let body = legacy_body(&own, "tasks/result", task_params(&task_id));
                    match send(state, &inner, req, &body, On::Task, &|_, _| {}).await? {
                        Ok(reply) => answer_of(reply, &own).await.and_then(|a| {
                            match (a.get("result"), a.get("error")) {
                                (Some(r), _) if r.is_object() => Some(Outcome::Result(r.clone())),
                                (_, Some(e)) if e.is_object() => Some(Outcome::Error(e.clone())),
                                _ => None,
                            }
                        }),
                        Err(_) => None,
                    }
                }
                _ => None,
            };
            Ok(Ok((task, outcome)))
        })
        .await;
    let (task, outcome) = match asked {
        Ok(Ok(found)) => found,
        Ok(Err(reply)) => return Ok(reply),
        // As a task tool's call (see `tools_call`): the edge's 502 / 504.
        Err(e) => return Err(e),
    };
    if lost_task::is_not_found(task.as_ref()) {
        if let Some(reply) = lost_upstream(state, id, &record, "tasks/get").await {
            return Ok(reply);
        }
    }
    let status = task
        .as_ref()
        .and_then(|a| a.pointer("/result/status"))
        .and_then(Value::as_str)
        .and_then(TaskStatus::parse);
    let inputs = match status {
        Some(TaskStatus::InputRequired) => {
            match input_requests(state, &inner, req, &record).await {
                Input::Shown(shown) => Some(shown),
                Input::Lost => {
                    input_lost(state, &inner, req, &task_id).await;
                    // The record as it now is (first terminal status wins).
                    let now = state
                        .registry
                        .lookup_checked(&upstream, &task_id, &record.owner)
                        .await;
                    let detailed = now.ok().flatten();
                    let detailed = detailed
                        .as_deref()
                        .and_then(|r| ended_here_detailed(r, input::LOST_INPUT_MESSAGE));
                    if let Some(detailed) = detailed {
                        return Ok(McpReply::local_json(jsonrpc::result_response(
                            id,
                            &detailed.to_string(),
                        )));
                    }
                    Some(json!({}))
                }
            }
        }
        Some(s) if s.is_terminal() => {
            state.inputs.forget(&task_id);
            if record.input_requests.is_some() {
                // Nothing left to answer: the record no longer shows (or holds) them.
                state
                    .registry
                    .edit_input_requests(&upstream, &task_id, |f| f.take().is_some())
                    .await;
            }
            None
        }
        _ => None,
    };
    let missing = format!("task {task_id} ended upstream but its tasks/result could not be read");
    let shown = modern_reply(id, task.as_ref(), |t| {
        let mut d =
            translate::detailed_task(t, outcome.as_ref(), &missing).unwrap_or_else(|| t.clone());
        if let (Some(shown), Some(o)) = (inputs, d.as_object_mut()) {
            o.insert("inputRequests".into(), shown);
        }
        d
    });
    Ok(shown)
}

fn task_params(task_id: &str) -> Map<String, Value> {
    let mut p = Map::new();
    p.insert("taskId".into(), Value::from(task_id));
    p
}

/// The `DetailedTask` of a terminal record from the payload it holds (see `observe`:
/// `tasks.max_stored_result_bytes`), without the upstream.
fn stored_detailed(record: &TaskRecord) -> Option<Value> {
    if !record.status.is_terminal() {
        return None;
    }
    let task = serde_json::to_value(record.to_task()).ok()?;
    if record.status == TaskStatus::Cancelled {
        return translate::detailed_task(&task, None, "");
    }
    // An error taskgate failed the task with itself (`input`: the input request was lost).
    if let Some(error) = record.terminal_error.as_deref() {
        let error: Value = serde_json::from_str(error).ok()?;
        return translate::detailed_task(&task, Some(&Outcome::Error(error)), "");
    }
    let stored: Value = serde_json::from_str(record.terminal_result.as_deref()?).ok()?;
    translate::detailed_task(&task, Some(&Outcome::Result(stored)), "")
}

/// The `DetailedTask` of a task taskgate failed itself (its input request was lost: see
/// `input`; its upstream lost it: [`lost_upstream`]), from its record: the stored one, or
/// (results not stored: `tasks.max_stored_result_bytes = 0`) the record's `failed` with the
/// `-32603` error saying `message`; `None` when the record is not terminal.
fn ended_here_detailed(record: &TaskRecord, message: &str) -> Option<Value> {
    if let Some(detailed) = stored_detailed(record) {
        return Some(detailed);
    }
    if record.status != TaskStatus::Failed {
        return None;
    }
    let task = serde_json::to_value(record.to_task()).ok()?;
    let error = json!({"code": jsonrpc::INTERNAL_ERROR, "message": message});
    translate::detailed_task(&task, Some(&Outcome::Error(error)), "")
}

/// A bridged task the upstream no longer has (it answered taskgate's own `tasks/get` of it
/// `-32602` on the task's session, or on the session that replaced it after a 404: the
/// upstream restarted), as for every task an upstream lost (`lost_task`; README "when the
/// upstream says it no longer has a task"): the record is failed ("resources released",
/// `reason="upstream_lost"`, the owner's slot given back) with the error kept, and the
/// client gets the failed `DetailedTask` from it (later polls are answered from the record).
/// `method`: the request that first got the `-32602`. `None`: the record could not be read
/// (the upstream's answer then passes as it came).
async fn lost_upstream(
    state: &ReverseState,
    id: &Id,
    record: &TaskRecord,
    method: &str,
) -> Option<McpReply> {
    state.inputs.forget(&record.task_id);
    let now = lost_task::fail_lost_bridged(&state.registry, record, method).await?;
    let message = now.status_message.clone().unwrap_or_default();
    let detailed = ended_here_detailed(&now, &message)?;
    Some(
        McpReply::local_json(jsonrpc::result_response(id, &detailed.to_string()))
            .answered_locally(LocalReason::StoredResult),
    )
}

/// A 2026-07-28 `tasks/cancel`: one 2025 `tasks/cancel` (the `cancel` layer above lets one
/// through per task), acknowledged (see the module docs).
async fn tasks_cancel<S: McpService>(
    state: &ReverseState,
    inner: S,
    req: &McpRequest,
    id: &Id,
    record: Arc<TaskRecord>,
) -> Result<McpReply, GatewayError> {
    let own = state.ids.next_id();
    let body = legacy_body(&own, "tasks/cancel", task_params(&record.task_id));
    let answer = match send(state, &inner, req, &body, On::Task, &|_, _| {}).await? {
        Ok(reply) => answer_of(reply, &own).await,
        Err(NoSession(reply)) => return Ok(reply),
    };
    if lost_task::is_not_found(answer.as_ref()) {
        // "Already terminal" or "not found" (2025-11-25 answers both `-32602`): one clean
        // `tasks/get` tells them apart (a `Task` is applied by `observe`); `-32602` again, and
        // the upstream lost the task (see `lost_upstream`). The client gets the ack either way.
        let own = state.ids.next_id();
        let body = legacy_body(&own, "tasks/get", task_params(&record.task_id));
        // A failed check changes nothing: the cancel's own answer stands.
        let task = match send(state, &inner, req, &body, On::Task, &|_, _| {}).await {
            Ok(Ok(reply)) => answer_of(reply, &own).await,
            _ => None,
        };
        if lost_task::is_not_found(task.as_ref()) {
            lost_upstream(state, id, &record, "tasks/cancel").await;
        }
    }
    let acked = answer
        .as_ref()
        .is_some_and(|a| a.get("result").is_some() || lost_task::is_not_found(Some(a)));
    if acked {
        return Ok(McpReply::local_json(jsonrpc::result_response(
            id,
            crate::layers::cancel::MODERN_ACK,
        )));
    }
    Ok(modern_reply(id, answer.as_ref(), |r| r.clone()))
}
