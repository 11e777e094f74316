//! The held sessions' upstream stage: where a held session's requests go. A 2025-11-25 client
//! on an upstream without 2025 sessions (a pure 2026-07-28 server: rmcp 3 with
//! `legacy_session_mode` off, or any server that refuses `initialize`) has its session held by
//! taskgate; this stage, directly below the `bridge` (assembled in `gateway`), sends what the
//! bridge passes on of such a session (a 2025-era request carrying [`HeldSession`], the fact
//! the `held_sessions` stage above the bridge hands down) upstream as stateless 2026-07-28
//! requests, keeps those in flight, and answers what has no 2026-07-28 counterpart. Everything
//! else passes untouched: 2026-07-28 requests (the bridge's own translated task requests of a
//! held session among them) and every request of a session taskgate does not hold.
//!
//! **When**: the first 2025 `initialize` goes upstream as it is (a dual-era upstream keeps its
//! own sessions). When the upstream refuses it (a JSON-RPC error answer, `-32022` say, or an
//! HTTP 4xx without one) and answers `server/discover` (within
//! [`crate::layers::bridge::DISCOVER_DEADLINE`]), taskgate holds 2025 sessions for that upstream from then on
//! (learned once, kept for the process's life, with `upstream.protocol` `"auto"` and
//! `"2026-07-28"` alike; `"2025-11-25"` never does). An upstream that refuses `initialize` and
//! does not answer `server/discover` gets its refusal relayed as it came.
//!
//! **What taskgate does for a held session**:
//! - `initialize`: answered by taskgate from the upstream's `server/discover` result. The
//!   bridge asks `server/discover` (learning the era from it) and replies with the
//!   `HoldSession` fact; the `held_sessions` stage above answers the client from it (the
//!   `InitializeResult`, the `tgh-` session id it mints, the `HeldAnswer` fact for `session`,
//!   which stores the session); see `crate::layers::held_sessions`. Which requests are a held
//!   session's (the [`HeldSession`] extension), whether this upstream's sessions are held
//!   (`SessionsHeld`), and the 404 for a held-form id nobody holds are that stage's too: the
//!   bridge reads no session table. This stage passes a held session's `initialize` on.
//! - its task requests (`tools/call` with `params.task`, `tasks/*` of a bridged task) are the
//!   bridge's: it translates them (with the session's `_meta`) and they pass here as 2026-07-28
//!   requests.
//! - every other request on the session goes upstream as a stateless 2026-07-28 request
//!   (`bridge::sessionless::modernize`): no `Mcp-Session-Id`, `MCP-Protocol-Version:
//!   2026-07-28`, `Mcp-Method`, `Mcp-Name` (`params.name` of `tools/call` / `prompts/get`,
//!   `params.uri` of `resources/read`, the `taskId` of `tasks/*`), and `_meta` with the protocol
//!   version, the client's capabilities (plus the tasks extension on the bridge's own task
//!   requests; plain calls do not declare it, so the server never answers them with a task) and
//!   `clientInfo`. Its answer comes back as a 2025 client takes it
//!   (`bridge::sessionless::legacy_answer`): HTTP 200 for a JSON-RPC error (the 2026
//!   transport's 400/404), `notifications/tasks` as `notifications/tasks/status`. An MRTR
//!   `input_required` answer (2026 multi-round-trip requests) to `tools/call`, `prompts/get` or
//!   `resources/read` is relayed: its input requests go to the client as `elicitation/create` /
//!   `sampling/createMessage` / `roots/list` on the request's stream and the request is retried
//!   with the answers (see `relay::mrtr`; the client's answers reach the relay through the
//!   bridge, which shares its [`Relay`]); one to any other request (which 2026 does not allow)
//!   becomes `-32603` saying so. The bridge above still reads the answers it translates: the
//!   `taskSupport` of `tools/list`, a `-32021` of a plain `tools/call`, 2026-only error codes.
//! - a `notifications/cancelled` naming a request of the session still in flight upstream ends
//!   it: taskgate closes that upstream request (2026-07-28: closing the stream is the cancel)
//!   and the client's stream ends without an answer (2025-11-25 cancellation: none is due); the
//!   same while an MRTR exchange waits for the client's input or retries.
//! - answered here (counted as `taskgate_local_answers_total{reason="held_session"}`):
//!   `notifications/initialized` and every other notification, and responses nothing waits for
//!   (202); `ping` and `logging/setLevel` (`{}`; 2026-07-28 has neither); `resources/subscribe`
//!   and `resources/unsubscribe` (`{}`, kept for the GET stream, when the upstream offers
//!   `resources.subscribe`; see `listen`); the GET stream when the upstream offers nothing to
//!   listen to (405, the 2025 transport's answer of a server without one); the DELETE (200: the
//!   session ends, nothing goes upstream).
//! - the GET stream: the upstream's `subscriptions/listen` for what its `server/discover`
//!   offers (list changes, the session's resource subscriptions), its notifications relayed as
//!   a 2025 client takes them; one per session, a second GET closing the first (see `listen`).
//! - a 2025 request naming a session id of the held form that taskgate does not hold is looked
//!   up in the store first (`session::held_store`, by `session_guard`): a held session issued
//!   before a restart (or by another replica sharing a PostgreSQL store) comes back with its
//!   owner, negotiated version, capabilities and `clientInfo` and is served as it was, so the
//!   tasks created on it (whose owner, without authentication, is the session id) stay
//!   reachable; after a restart the first such request also asks `server/discover` when the
//!   era is not known yet. One the store does not hold (never issued, ended, reclaimed, idle
//!   past `gateway.session_idle_ms`) gets 404 `-32001` "Session not found", with or without
//!   authentication and before the first `initialize` after a start alike (never forwarded):
//!   the client initializes again.
//!
//! Durability: the stored session's expiry moves forward on use at most once per
//! `session::touch_every` (a sixteenth of `gateway.session_idle_ms`), so a session may be taken
//! for idle that much early after a restart; its removal on DELETE is durable before the answer,
//! a removal on reclaim happens in the background.
//!
//! Limits: MRTR `relay::mrtr::MAX_ROUNDS` rounds of 32 keys, each answered within `timeout_ms`;
//! at most [`MAX_HELD_CALLS`] requests in flight per upstream that a `notifications/cancelled`
//! can end; the GET stream's subscriptions are in memory, at most `listen::MAX_SUBSCRIPTIONS`
//! per session.

use super::listen;
use crate::exchange::{CallKey, GatewayError, McpReply, McpRequest, Operation, ReplyBody};
use crate::jsonrpc::{self, Id, Kind};
use crate::layers::bridge::sessionless::{legacy_answer, modernize};
use crate::layers::bridge::translate;
use crate::layers::bridge::Discovery;
use crate::layers::extensions::{ClientDeclares, HeldSession};
use crate::layers::relay::{self, mrtr, OwnIds, Relay};
use crate::layers::McpService;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::metrics::LocalReason;
use futures_util::future::Either;
use futures_util::StreamExt;
use http::{HeaderValue, StatusCode};
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;
use tower::ServiceExt;

/// Most requests of held sessions in flight per upstream that a `notifications/cancelled` can
/// end (more are sent all the same, without that).
pub const MAX_HELD_CALLS: usize = 4096;

/// One upstream's held sessions' upstream path: the requests in flight, and the handles the
/// stage is given.
pub struct HeldUpstream {
    /// Ids of taskgate's own upstream requests (shared with the bridge and the relay).
    ids: Arc<OwnIds>,
    /// The relay of input the upstream asks for (MRTR), shared with the bridge (which takes
    /// the client's answers to it).
    relay: Arc<Relay>,
    /// Requests of held sessions in flight upstream, by caller and id: the client's
    /// `notifications/cancelled` ends them. At most [`MAX_HELD_CALLS`].
    calls: Mutex<HashMap<CallKey, Flight>>,
    /// Held sessions' GET streams and resource subscriptions (see `listen`).
    listening: Arc<listen::Listening>,
}

impl HeldUpstream {
    /// The upstream path of one upstream's held sessions: its own ids from `ids`, MRTR rounds
    /// relayed by `relay` (both shared with that upstream's `bridge`), what a GET stream can
    /// listen to from `era` (the upstream's `server/discover`, shared with both bridges), its
    /// `subscriptions/listen` requests bounded by `timeout` (the upstream's `timeout_ms`).
    pub fn new(
        ids: Arc<OwnIds>,
        relay: Arc<Relay>,
        era: Arc<Discovery>,
        timeout: Duration,
    ) -> Arc<HeldUpstream> {
        Arc::new(HeldUpstream {
            listening: Arc::new(listen::Listening::new(ids.clone(), era, timeout)),
            ids,
            relay,
            calls: Mutex::new(HashMap::new()),
        })
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
}

/// Builds [`HeldUpstreamService`]s over one upstream's [`HeldUpstream`].
#[derive(Clone)]
pub struct HeldUpstreamLayer {
    state: Arc<HeldUpstream>,
}

impl HeldUpstreamLayer {
    /// A layer sending held sessions' requests with `state`.
    pub fn new(state: Arc<HeldUpstream>) -> HeldUpstreamLayer {
        HeldUpstreamLayer { state }
    }
}

impl<S> tower::Layer<S> for HeldUpstreamLayer {
    type Service = HeldUpstreamService<S>;
    fn layer(&self, inner: S) -> HeldUpstreamService<S> {
        HeldUpstreamService {
            inner,
            state: self.state.clone(),
        }
    }
}

/// The held sessions' upstream stage's service (see the module docs).
#[derive(Clone)]
pub struct HeldUpstreamService<S> {
    inner: S,
    state: Arc<HeldUpstream>,
}

type BoxFut = Pin<Box<dyn Future<Output = Result<McpReply, GatewayError>> + Send>>;

impl<S: McpService> tower::Service<McpRequest> for HeldUpstreamService<S> {
    type Response = McpReply;
    type Error = GatewayError;
    /// The inner service's own future for what passes (a 2026-07-28 request, a request of a
    /// session taskgate does not hold, a held session's `initialize`); a boxed one otherwise.
    type Future = Either<S::Future, BoxFut>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: McpRequest) -> Self::Future {
        let held = req.era() != Era::Modern
            && req.extensions.get::<Arc<HeldSession>>().is_some()
            && req.request_method() != Some("initialize");
        if !held {
            return Either::Left(self.inner.call(req));
        }
        let state = self.state.clone();
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        match &req.op {
            // The GET stream: the upstream's `subscriptions/listen` (see `listen`).
            Operation::OpenStream => {
                let listening = state.listening.clone();
                return Either::Right(Box::pin(listen::open(listening, inner, req)));
            }
            Operation::EndSession => listen::forget(&state.listening, &req),
            Operation::Post(_) => {}
        }
        if matches!(
            req.request_method(),
            Some("resources/subscribe" | "resources/unsubscribe")
        ) {
            return Either::Right(Box::pin(async move {
                match listen::subscribe(&state.listening, &inner, &req).await {
                    Some(reply) => Ok(reply),
                    None => forward(state, inner, req).await,
                }
            }));
        }
        if let Some(reply) = local(&state, &req) {
            return Either::Right(Box::pin(std::future::ready(Ok(reply))));
        }
        Either::Right(Box::pin(forward(state, inner, req)))
    }
}

/// A request of a held session in flight upstream: its token, and the signal that ends it.
struct Flight {
    token: u64,
    cancel: oneshot::Sender<()>,
}

/// Keeps a request's entry in `calls` while it is in flight; removes it (only its own) when
/// dropped.
struct InFlight {
    state: Arc<HeldUpstream>,
    key: CallKey,
    token: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut calls = self.state.calls.lock();
        if calls.get(&self.key).is_some_and(|f| f.token == self.token) {
            calls.remove(&self.key);
        }
    }
}

/// Registers `req` (a request) as in flight: the receiver a `notifications/cancelled` fires, and
/// the guard of its entry. `None` when it cannot be: no id, its key already in flight (callers
/// that cannot be told apart), or [`MAX_HELD_CALLS`] in flight.
fn register(
    state: &Arc<HeldUpstream>,
    req: &McpRequest,
) -> Option<(oneshot::Receiver<()>, InFlight)> {
    let key = req.ctx.call_key(req.id()?);
    let token = state.ids.next();
    let (tx, rx) = oneshot::channel();
    let mut calls = state.calls.lock();
    if calls.contains_key(&key) || calls.len() >= MAX_HELD_CALLS {
        return None;
    }
    calls.insert(key.clone(), Flight { token, cancel: tx });
    drop(calls);
    let flight = InFlight {
        state: state.clone(),
        key,
        token,
    };
    Some((rx, flight))
}

/// A client's `notifications/cancelled`: ends the request it names, if in flight.
fn cancel_in_flight(state: &HeldUpstream, req: &McpRequest) {
    let Operation::Post(msg) = &req.op else {
        return;
    };
    let Some(id) = msg
        .parse_as::<Value>()
        .ok()
        .and_then(|v| v.pointer("/params/requestId").and_then(Id::from_value))
    else {
        return;
    };
    let flight = state.calls.lock().remove(&req.ctx.call_key(&id));
    if let Some(flight) = flight {
        tracing::debug!("notifications/cancelled: the held session's request is closed upstream");
        let _ = flight.cancel.send(());
    }
}

/// The answer taskgate gives itself to a request of a held session, if it is one of those it
/// answers (see the module docs).
fn local(state: &HeldUpstream, req: &McpRequest) -> Option<McpReply> {
    let reply = match &req.op {
        Operation::EndSession => {
            let mut r = McpReply::accepted();
            r.status = StatusCode::OK;
            r
        }
        Operation::OpenStream => {
            let mut r = McpReply::accepted();
            r.status = StatusCode::METHOD_NOT_ALLOWED;
            r.headers.insert(
                http::header::ALLOW,
                HeaderValue::from_static("POST, DELETE"),
            );
            r
        }
        Operation::Post(msg) => match (msg.kind(), msg.method()) {
            (Kind::Notification, Some("notifications/cancelled")) => {
                cancel_in_flight(state, req);
                McpReply::accepted()
            }
            (Kind::Notification | Kind::Response | Kind::Error, _) => McpReply::accepted(),
            (Kind::Request, Some("ping" | "logging/setLevel")) => {
                McpReply::local_json(jsonrpc::result_response(msg.id()?, "{}"))
            }
            _ => return None,
        },
    };
    Some(reply.answered_locally(LocalReason::HeldSession))
}

/// A request of a held session sent upstream as a 2026 request ([`modernize`]; an MRTR
/// `input_required` answer relayed to the client, see `relay::mrtr`), its answer made a 2025
/// one ([`legacy_answer`]).
async fn forward<S: McpService>(
    state: Arc<HeldUpstream>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError> {
    let Some(out) = modernize(&req) else {
        return Ok(McpReply::error(
            Era::Legacy,
            req.id(),
            &McpError::NotForwardable,
        ));
    };
    let client = state.client_of(&out);
    let send = |inner: S, out| {
        let plain = |inner: S, out| inner.oneshot(out);
        mrtr::call(state.relay.clone(), client.clone(), inner, out, plain)
    };
    let Some((mut cancelled, flight)) = register(&state, &req) else {
        return Ok(legacy_answer(send(inner, out).await?));
    };
    let reply = tokio::select! {
        reply = send(inner, out) => reply?,
        _ = &mut cancelled => {
            // Cancelled before the upstream answered: the upstream request is dropped (closed).
            let (_, rx) = tokio::sync::mpsc::channel(1);
            return Ok(McpReply::event_stream(rx, None));
        }
    };
    let mut reply = legacy_answer(reply);
    if let ReplyBody::Stream(events) = reply.body {
        // Cancelled while streaming: the stream (and the upstream request) ends; the entry
        // lives as long as the stream.
        let events = events.take_until(cancelled).map(move |ev| {
            let _ = &flight;
            ev
        });
        reply.body = ReplyBody::Stream(Box::pin(events));
    }
    Ok(reply)
}
