//! Held sessions: a 2025-11-25 client on an upstream without 2025 sessions (a pure 2026-07-28
//! server: rmcp 3 with `legacy_session_mode` off, or any server that refuses `initialize`).
//!
//! **When**: the first 2025 `initialize` goes upstream as it is (a dual-era upstream keeps its
//! own sessions). When the upstream refuses it (a JSON-RPC error answer, `-32022` say, or an
//! HTTP 4xx without one) and answers `server/discover` (within
//! [`super::DISCOVER_DEADLINE`]), taskgate holds 2025 sessions for that upstream from then on
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
//!   bridge reads no session table.
//! - every later request on the session goes upstream as a stateless 2026-07-28 request: no
//!   `Mcp-Session-Id`, `MCP-Protocol-Version: 2026-07-28`, `Mcp-Method`, `Mcp-Name`
//!   (`params.name` of `tools/call` / `prompts/get`, `params.uri` of `resources/read`, the
//!   `taskId` of `tasks/*`), and `_meta` with the protocol version, the client's capabilities
//!   (plus the tasks extension on the bridge's own task requests; plain calls do not declare it,
//!   so the server never answers them with a task) and `clientInfo`. Its answer comes back as a
//!   2025 client takes it: HTTP 200 for a JSON-RPC error (the 2026 transport's 400/404),
//!   `notifications/tasks` as `notifications/tasks/status`. An MRTR `input_required` answer
//!   (2026 multi-round-trip requests) to `tools/call`, `prompts/get` or `resources/read` is
//!   relayed: its input requests go to the client as `elicitation/create` /
//!   `sampling/createMessage` / `roots/list` on the request's stream and the request is retried
//!   with the answers (see `relay::mrtr`); one to any other request (which 2026 does not allow) becomes
//!   `-32603` saying so.
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
//! Limits: MRTR `relay::mrtr::MAX_ROUNDS` rounds of 32 keys, each answered within `timeout_ms`; the GET
//! stream's subscriptions are in memory, at most `listen::MAX_SUBSCRIPTIONS` per session.

use super::{modern_request, translate, BridgeState, UpstreamEra};
use crate::exchange::{CallKey, GatewayError, McpReply, McpRequest, Operation, ReplyBody};
use crate::jsonrpc::{self, Id, Kind};
use crate::layers::extensions::{HeldSession, HoldSession};
use crate::layers::relay::mrtr;
use crate::layers::McpService;
use crate::mcp::capabilities::{CLIENT_CAPABILITIES_META, TASKS_EXTENSION};
use crate::mcp::era::{MODERN_VERSION, PROTOCOL_VERSION_META};
use crate::metrics::LocalReason;
use futures_util::StreamExt;
use http::{HeaderValue, StatusCode};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use tokio::sync::oneshot;
use tower::ServiceExt;

/// `_meta` key of a 2026-07-28 request's `clientInfo`.
pub const CLIENT_INFO_META: &str = "io.modelcontextprotocol/clientInfo";

/// A request of a held session in flight upstream: its token, and the signal that ends it.
pub(super) struct Flight {
    token: u64,
    cancel: oneshot::Sender<()>,
}

/// Keeps a request's entry in `held_calls` while it is in flight; removes it (only its own) when
/// dropped.
struct InFlight {
    state: Arc<BridgeState>,
    key: CallKey,
    token: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut calls = self.state.held_calls.lock();
        if calls.get(&self.key).is_some_and(|f| f.token == self.token) {
            calls.remove(&self.key);
        }
    }
}

/// Registers `req` (a request) as in flight: the receiver a `notifications/cancelled` fires, and
/// the guard of its entry. `None` when it cannot be: no id, its key already in flight (callers
/// that cannot be told apart), or [`super::MAX_HELD_CALLS`] in flight.
fn register(
    state: &Arc<BridgeState>,
    req: &McpRequest,
) -> Option<(oneshot::Receiver<()>, InFlight)> {
    let key = req.ctx.call_key(req.id()?);
    let token = state.ids.next();
    let (tx, rx) = oneshot::channel();
    let mut calls = state.held_calls.lock();
    if calls.contains_key(&key) || calls.len() >= super::MAX_HELD_CALLS {
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
fn cancel_in_flight(state: &BridgeState, req: &McpRequest) {
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
    let flight = state.held_calls.lock().remove(&req.ctx.call_key(&id));
    if let Some(flight) = flight {
        tracing::debug!("notifications/cancelled: the held session's request is closed upstream");
        let _ = flight.cancel.send(());
    }
}

/// The answer taskgate gives itself to a request of a held session, if it is one of those it
/// answers (see the module docs).
pub(super) fn local(state: &BridgeState, req: &McpRequest) -> Option<McpReply> {
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

/// The client capabilities a held session passes upstream: those taskgate relays input for
/// (`input::capability_for`: `elicitation`, `sampling`, `roots`). Anything else the client
/// declared (the 2026 `extensions`, say the tasks extension, `experimental`) is a promise
/// taskgate does not keep for it on a held session, so it never goes upstream (issue 29 #2: a
/// declared tasks extension let the upstream take the session's `tasks/update` as the
/// client's own).
const RELAYED_CAPABILITIES: [&str; 3] = ["elicitation", "sampling", "roots"];

/// Adds a held session's `_meta` members to a 2026 request's `params`: its client
/// capabilities that taskgate relays ([`RELAYED_CAPABILITIES`]; the tasks extension only when
/// `params` declared it, which the bridge's own task requests do), and its `clientInfo`.
pub(crate) fn add_session_meta(params: &mut Value, session: &HeldSession) {
    let Some(meta) = params
        .as_object_mut()
        .and_then(|p| p.get_mut("_meta"))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let declares = meta
        .get(CLIENT_CAPABILITIES_META)
        .and_then(|c| c.get("extensions"))
        .and_then(|e| e.get(TASKS_EXTENSION))
        .is_some();
    let mut caps: Map<String, Value> = RELAYED_CAPABILITIES
        .iter()
        .filter_map(|k| Some((k.to_string(), session.client_capabilities.get(*k)?.clone())))
        .collect();
    if declares {
        caps.insert("extensions".into(), json!({ TASKS_EXTENSION: {} }));
    }
    let caps = Value::Object(caps);
    meta.insert(CLIENT_CAPABILITIES_META.into(), caps);
    if let Some(info) = &session.client_info {
        meta.entry(CLIENT_INFO_META).or_insert_with(|| info.clone());
    }
}

/// A request of a held session as the stateless 2026-07-28 request that goes upstream (see
/// the module docs); `None` when it is not a POSTed request.
pub(crate) fn modernize(req: &McpRequest) -> Option<McpRequest> {
    let Operation::Post(msg) = &req.op else {
        return None;
    };
    let id = msg.id()?.clone();
    let method = msg.method()?.to_string();
    let v: Value = msg.parse_as().ok()?;
    let mut params = match v.get("params") {
        Some(Value::Object(p)) => p.clone(),
        _ => Map::new(),
    };
    let mut meta = match params.get("_meta") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    meta.remove(crate::mcp::task::RELATED_TASK_META);
    meta.insert(PROTOCOL_VERSION_META.into(), json!(MODERN_VERSION));
    meta.insert(CLIENT_CAPABILITIES_META.into(), json!({}));
    params.insert("_meta".into(), Value::Object(meta));
    let name_key = match method.as_str() {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        m if m.starts_with("tasks/") => Some("taskId"),
        _ => None,
    };
    let name = name_key
        .and_then(|k| params.get(k))
        .and_then(Value::as_str)
        .map(str::to_string);
    Some(modern_request(
        req,
        &id,
        &method,
        Value::Object(params),
        name.as_deref(),
    ))
}

/// A request of a held session sent upstream as a 2026 request ([`modernize`]) through `send`
/// (an MRTR `input_required` answer relayed to the client, see `relay::mrtr`), its answer made a 2025
/// one ([`legacy_answer`]).
pub(super) async fn forward_with<S, F>(
    state: Arc<BridgeState>,
    inner: S,
    req: McpRequest,
    send: F,
) -> Result<McpReply, GatewayError>
where
    S: McpService,
    F: mrtr::Send2026<S>,
{
    let Some(out) = modernize(&req) else {
        return Ok(McpReply::local_error(
            req.id(),
            jsonrpc::INVALID_REQUEST,
            "taskgate holds this session and cannot send this message to the 2026-07-28 upstream",
        ));
    };
    let client = state.client_of(&out);
    let send = |inner, out| mrtr::call(state.relay.clone(), client.clone(), inner, out, send);
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

/// [`forward_with`] sending the request as it is.
pub(super) async fn forward<S: McpService>(
    state: Arc<BridgeState>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError> {
    forward_with(state, inner, req, |inner: S, out| inner.oneshot(out)).await
}

/// A 2026 upstream's reply as a 2025 client takes it (see the module docs).
pub(crate) fn legacy_answer(mut reply: McpReply) -> McpReply {
    reply.headers.remove("mcp-session-id");
    // A 2026 HTTP 4xx carrying a JSON-RPC error is HTTP 200 for a 2025 client; any other 4xx (an
    // OAuth 401 with `WWW-Authenticate`, a proxy's 413 or 429) keeps its status (found by review).
    if reply.status.is_client_error() {
        if let ReplyBody::Json(bytes) = &reply.body {
            if is_jsonrpc_error(bytes) {
                reply.status = StatusCode::OK;
            }
        }
    }
    reply.body = reply.body.map_messages(|text| {
        if let Some(status) = translate::legacy_notification(text) {
            return Some(status);
        }
        if !text.contains("\"input_required\"") {
            return None;
        }
        let v: Value = serde_json::from_str(text).ok()?;
        if v.pointer("/result/resultType").and_then(Value::as_str) != Some("input_required") {
            return None;
        }
        let id = v.get("id").and_then(Id::from_value)?;
        let error = jsonrpc::error_response(
            Some(&id),
            jsonrpc::INTERNAL_ERROR,
            "the 2026-07-28 upstream asked for input within a request that MRTR does not allow (only tools/call, prompts/get and resources/read may answer input_required)",
        );
        Some(String::from_utf8_lossy(&error).into_owned())
    });
    reply
}

/// Whether an upstream's answer to `initialize` (JSON text) refuses the method itself: a
/// JSON-RPC error `-32022` (2026-07-28: unsupported protocol version, what a server without the
/// 2025 handshake answers) or `-32601` (method not found). Any other error (a malformed
/// `initialize`, an auth failure) is the client's and is passed on: one bad `initialize` must
/// never switch every later session of every client to held sessions (found by review).
pub(super) fn is_refusal(answer: &[u8]) -> bool {
    serde_json::from_slice::<Value>(answer).is_ok_and(|v| {
        matches!(
            v.pointer("/error/code").and_then(Value::as_i64),
            Some(UNSUPPORTED_PROTOCOL_VERSION | jsonrpc::METHOD_NOT_FOUND)
        )
    })
}

/// Whether `bytes` is one JSON-RPC error message.
fn is_jsonrpc_error(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Value>(bytes)
        .is_ok_and(|v| v.get("jsonrpc").is_some() && v.get("error").is_some_and(Value::is_object))
}

/// 2026-07-28 `-32022`: the request's protocol version is not supported.
const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// The upstream refused `initialize`: when it answers `server/discover`, taskgate holds 2025
/// sessions for it from now on, and `held_sessions` answers this `initialize` itself (the
/// reply carries [`HoldSession`]); `None` (nothing learned) when it does not.
pub(super) async fn try_hold<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
) -> Option<McpReply> {
    let discovered = discover(state, inner.clone(), req).await?;
    Some(hold_session(state, discovered))
}

/// A 2025 `initialize` of a client on an upstream whose sessions taskgate holds (see the module
/// docs): the [`HoldSession`] reply `held_sessions` answers from; `-32603` when the upstream
/// does not answer `server/discover`.
pub(super) async fn initialize<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
) -> McpReply {
    match discover(state, inner.clone(), req).await {
        Some(discovered) => hold_session(state, discovered),
        None => McpReply::local_error(
            req.id(),
            jsonrpc::INTERNAL_ERROR,
            "the 2026-07-28 upstream did not answer server/discover; taskgate cannot open a session for it",
        ),
    }
}

/// The reply to a 2025 `initialize` that `held_sessions` answers itself: empty, carrying the
/// [`HoldSession`] fact (the `server/discover` result, and whether the upstream serves the
/// tasks extension, learned from it).
fn hold_session(state: &BridgeState, discovered: Value) -> McpReply {
    let mut reply = McpReply::accepted();
    reply.extensions.insert(HoldSession {
        discovered,
        modern_tasks: state.known() == Some(UpstreamEra::ModernTasks),
    });
    reply
}

/// The upstream's `server/discover` result (`None`: not asked, no answer within the deadline,
/// or an error); the upstream's era is learned from it (see `era`).
async fn discover<S: McpService>(
    state: &Arc<BridgeState>,
    inner: S,
    req: &McpRequest,
) -> Option<Value> {
    let super::era::Discovered::Answer(Some(answer)) = state.era.ask(inner, req, &state.ids).await
    else {
        return None;
    };
    answer.get("result").filter(|r| r.is_object()).cloned()
}

/// The reply of an `initialize` the upstream refused without a JSON-RPC answer: HTTP 404 or 405
/// without a JSON body (the endpoint has no such method). Other statuses (400, 401, 403, 413,
/// 429: the client's request, its credentials, a proxy) are passed on as they are.
pub(super) fn refused_without_answer(reply: &McpReply) -> bool {
    matches!(
        reply.status,
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
    ) && !matches!(reply.body, ReplyBody::Json(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_meta_carries_the_clients_capabilities() {
        let held = HeldSession {
            client_capabilities: json!({"elicitation": {}}),
            client_info: Some(json!({"name": "c", "version": "1"})),
        };
        let mut with_ext = json!({"_meta": translate::modern_meta(None)});
        add_session_meta(&mut with_ext, &held);
        let caps = &with_ext["_meta"][CLIENT_CAPABILITIES_META];
        assert!(caps["elicitation"].is_object() && caps["extensions"][TASKS_EXTENSION].is_object());
        assert_eq!(with_ext["_meta"][CLIENT_INFO_META]["name"], "c");
        let mut plain = json!({"_meta": {CLIENT_CAPABILITIES_META: {}}});
        add_session_meta(&mut plain, &held);
        assert!(plain["_meta"][CLIENT_CAPABILITIES_META]
            .get("extensions")
            .is_none());
        // What the client declared but taskgate does not relay never goes upstream (issue 29
        // #2): a declared tasks extension would let the upstream take a held session's
        // `tasks/update` as the client's own.
        let greedy = HeldSession {
            client_capabilities: json!({"sampling": {}, "experimental": {"x": {}},
                "extensions": {TASKS_EXTENSION: {}, "vendor/x": {}}}),
            client_info: None,
        };
        let mut plain = json!({"_meta": {CLIENT_CAPABILITIES_META: {}}});
        add_session_meta(&mut plain, &greedy);
        assert_eq!(
            plain["_meta"][CLIENT_CAPABILITIES_META],
            json!({"sampling": {}})
        );
        let mut none = json!("x");
        add_session_meta(&mut none, &held);
        assert_eq!(none, json!("x"));
    }
}
