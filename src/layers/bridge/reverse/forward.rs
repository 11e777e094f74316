//! Requests with nothing of their own to translate (everything but `server/discover`,
//! `tools/call` and `tasks/*`), and notifications: sent on the caller's held session under an
//! id taskgate mints, the answer relayed to the 2026-07-28 client under its own id; a client
//! gone before the answer becomes `notifications/cancelled` upstream ([`CancelOnDrop`]).

use super::{
    id_value, input, legacy_body, send, translate, NoSession, On, ReverseState, UpstreamSession,
};
use crate::exchange::{
    GatewayError, McpReply, McpRequest, Operation, ReplyBody, RequestContext, RequestParts,
};
use crate::jsonrpc::{self, Id, Message};
use crate::layers::extensions::{PendingCreation, RelaysUpstreamRequests};
use crate::layers::relay::input::capability_for;
use crate::layers::McpService;
use crate::mcp::capabilities::ClientCapabilities;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

/// The answer a 2026 client gets for the upstream `answer` under its `id`: `result` mapped by
/// `map`, an `error` as it came (with its 2026-07-28 HTTP status), `-32603` without either.
pub(super) fn modern_reply(
    id: &Id,
    answer: Option<&Value>,
    map: impl FnOnce(&Value) -> Value,
) -> McpReply {
    if let Some(result) = answer.and_then(|a| a.get("result")) {
        return McpReply::local_json(jsonrpc::result_response(id, &map(result).to_string()));
    }
    match answer
        .and_then(|a| a.get("error"))
        .filter(|e| e.get("code").is_some_and(Value::is_i64))
    {
        Some(e) => {
            let code = e.get("code").and_then(Value::as_i64).unwrap_or_default();
            let mut reply = McpReply::local_json(Bytes::from(format!(
                r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#,
                id.as_json(),
                e
            )));
            reply.status = crate::mcp::errors::modern_error_status(code);
            reply
        }
        None => McpReply::error(
            Era::Modern,
            Some(id),
            &McpError::BridgedUnanswered {
                upstream_version: "2025-11-25",
            },
        ),
    }
}

/// What [`relay`] does with one upstream message.
enum Relayed {
    /// Passed as it came (a notification, anything unreadable).
    Keep,
    /// Not shown: a request of the upstream's, which has no 2026-07-28 form (answered upstream
    /// by the [`Refuser`]).
    Drop,
    /// The answer, under the client's id.
    Answer(String),
}

/// Why the upstream's request during a plain call is refused (see [`Refuser`]).
const PLAIN_CALL: &str = "taskgate's 2026-07-28 client cannot be asked during a call (2026-07-28 has no server-to-client requests, and a plain call has no task to show it in)";

/// An upstream reply passed to the 2026 client: the answer to `own` under the client's `id`
/// (its result through `complete_result`, or `cacheable_result` for a `method` whose 2026
/// result carries caching hints), notifications as they came, the upstream's own
/// requests not shown (2026-07-28 has none) but answered upstream by `refuser` (kept instead
/// when `keep_requests`, for a gateway task's held call: [`RelaysUpstreamRequests`], unless it
/// is an input request whose capability the client did not declare in `declared`, which is
/// refused as `input::refusal` says), HTTP errors as they came. `cancel` is disarmed once
/// the answer has passed (before that, the client going away cancels the request upstream).
#[allow(clippy::too_many_arguments)]
fn relay(
    reply: McpReply,
    own: Id,
    id: Id,
    method: &str,
    mut cancel: CancelOnDrop,
    keep_requests: bool,
    declared: ClientCapabilities,
    refuser: Refuser,
) -> McpReply {
    let result_of: fn(&Value) -> Value = if method == "tools/list" {
        translate::modern_tools_list
    } else if translate::carries_cache_hints(method) {
        translate::cacheable_result
    } else {
        translate::complete_result
    };
    let McpReply {
        status,
        headers,
        body,
        ..
    } = reply;
    let fix = move |text: &str| -> Relayed {
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return Relayed::Keep;
        };
        if let Some(asked) = v.get("method").and_then(Value::as_str) {
            let Some(request_id) = v.get("id") else {
                return Relayed::Keep;
            };
            if !keep_requests {
                refuser.refuse(request_id, asked, &format!("{asked}: {PLAIN_CALL}"));
                return Relayed::Drop;
            }
            // A gateway task's held call: shown to its client when it declared what the
            // request needs (`gateway_tasks` answers a `ping` or another method itself).
            return match input::refusal(asked, declared) {
                Some(Err(error)) if capability_for(asked).is_some() => {
                    let message = error["message"].as_str().unwrap_or_default().to_string();
                    refuser.refuse(request_id, asked, &message);
                    Relayed::Drop
                }
                _ => Relayed::Keep,
            };
        }
        if v.get("id").map(|i| i.to_string()).as_deref() != Some(own.as_json()) {
            return Relayed::Keep;
        }
        let mut reply = modern_reply(&id, Some(&v), result_of);
        match std::mem::replace(&mut reply.body, ReplyBody::Empty) {
            ReplyBody::Json(b) => Relayed::Answer(String::from_utf8_lossy(&b).into_owned()),
            _ => Relayed::Keep,
        }
    };
    let mut headers = headers;
    headers.remove("mcp-session-id");
    let body = match body {
        ReplyBody::Json(bytes) => {
            cancel.disarm();
            match fix(&String::from_utf8_lossy(&bytes)) {
                Relayed::Answer(t) => {
                    let status = serde_json::from_str::<Value>(&t)
                        .ok()
                        .and_then(|v| v.pointer("/error/code").and_then(Value::as_i64))
                        .map_or(status, crate::mcp::errors::modern_error_status);
                    return McpReply::new(status, headers, ReplyBody::Json(Bytes::from(t)));
                }
                _ => ReplyBody::Json(bytes),
            }
        }
        ReplyBody::Stream(events) => {
            use futures_util::StreamExt;
            ReplyBody::Stream(Box::pin(events.filter_map(move |mut ev| {
                let out = match ev.data.as_deref().map(&fix) {
                    Some(Relayed::Drop) => None,
                    Some(Relayed::Answer(t)) => {
                        cancel.disarm();
                        ev.data = Some(t.into());
                        Some(ev)
                    }
                    _ => Some(ev),
                };
                std::future::ready(out)
            })))
        }
        other => {
            cancel.disarm();
            other
        }
    };
    McpReply::new(status, headers, body)
}

/// Answers the upstream's own requests on the stream of a request forwarded for a 2026-07-28
/// client, which cannot be asked anything (2026-07-28 has no server→client requests; a plain
/// call has no task whose `inputRequests` could show them), so that the server does not wait
/// for an answer that never comes (before: they were dropped, and a tool awaiting its
/// `sampling/createMessage` held the client's call until the server gave up, if ever). The
/// held session declares `elicitation`, `sampling` and `roots` for a task's input
/// (`super::HELD_CLIENT_CAPABILITIES`), but nobody can give it during a plain call, so, as a
/// 2025-11-25 client without a handler for the method: `-32601` naming it and why (a `ping`
/// gets its empty result); the same for a gateway task's held call whose client did not
/// declare the capability the request needs. Sent on the same session in the background,
/// counted in
/// `taskgate_bridge_input_refused_total{reason="undeclared"}`. At most
/// [`super::MAX_REFUSALS_IN_FLIGHT`] are in flight per upstream; past it one is left
/// unanswered (logged at warn).
#[derive(Clone)]
struct Refuser(Arc<RefuserInner>);

struct RefuserInner {
    /// Sends one message on the held session, in the background (the service below).
    send: Box<dyn Fn(McpRequest) + Send + Sync>,
    /// The held session's request context, once [`send`] picked the session.
    session: Arc<Mutex<Option<RequestContext>>>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl Refuser {
    fn new<S: McpService>(
        state: &ReverseState,
        inner: &S,
        session: Arc<Mutex<Option<RequestContext>>>,
    ) -> Refuser {
        let inner = inner.clone();
        let permits = state.refusals.clone();
        let send = Box::new(move |message: McpRequest| {
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                tracing::warn!(
                    "too many refusals of upstream requests in flight: one is left unanswered"
                );
                return;
            };
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                return;
            };
            let inner = inner.clone();
            rt.spawn(async move {
                let _ = inner.oneshot(message).await;
                drop(permit);
            });
        });
        Refuser(Arc::new(RefuserInner {
            send,
            session,
            metrics: state.registry.metrics().clone(),
        }))
    }

    /// Answers the upstream's request `id` (`method`) on the held session (see [`Refuser`]):
    /// `-32601` with `message` (a `ping`: `{}`).
    fn refuse(&self, id: &Value, method: &str, message: &str) {
        let Some(ctx) = self.0.session.lock().clone() else {
            return;
        };
        let body = if method == "ping" {
            json!({"jsonrpc": "2.0", "id": id, "result": {}})
        } else {
            self.0
                .metrics
                .bridge_input_refused(&ctx.upstream, crate::metrics::InputRefusal::Undeclared);
            tracing::info!(upstream = %ctx.upstream, method, "the upstream asked a 2026-07-28 client's call for input: refused -32601");
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": jsonrpc::METHOD_NOT_FOUND,
                "message": message}})
        };
        let Ok(msg) = Message::parse(Bytes::from(body.to_string())) else {
            return;
        };
        let mut extensions = http::Extensions::new();
        extensions.insert(Era::Legacy);
        (self.0.send)(McpRequest::from(RequestParts {
            op: Operation::Post(msg),
            ctx,
            extensions,
            trace: None,
        }));
    }
}

/// Sends the upstream `notifications/cancelled` for one of taskgate's requests when dropped
/// before [`CancelOnDrop::disarm`]: the 2026-07-28 client went away before its answer
/// (2026-07-28 transports: closing the stream is the cancel; a 2025-11-25 server learns it only
/// from `notifications/cancelled` with the request id it got, taskgate's own). Sent in the
/// background on the request's session; nothing waits for it.
pub(super) struct CancelOnDrop(Option<Box<dyn FnOnce() + Send>>);

impl CancelOnDrop {
    /// The guard of taskgate's request `own`, sent below `inner`; its session is known once
    /// [`send`] picked it (the `note` cell its `prepare` fills).
    fn new<S: McpService>(inner: &S, note: Arc<Mutex<Option<McpRequest>>>) -> CancelOnDrop {
        let inner = inner.clone();
        CancelOnDrop(Some(Box::new(move || {
            let Some(note) = note.lock().take() else {
                return;
            };
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                tracing::debug!("2026-07-28 client gone before its answer: notifications/cancelled sent upstream");
                rt.spawn(async move {
                    let _ = inner.oneshot(note).await;
                });
            }
        })))
    }

    /// The answer has passed: nothing to cancel.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(fire) = self.0.take() {
            fire();
        }
    }
}

/// A request with nothing of its own to translate: sent on the caller's session under an id
/// taskgate mints, its answer relayed (see [`relay`]); the client going away first sends the
/// upstream `notifications/cancelled` naming that id ([`CancelOnDrop`]).
pub(super) async fn forward<S: McpService>(
    state: &ReverseState,
    inner: S,
    req: &McpRequest,
    id: &Id,
    method: &str,
    params: Option<&Value>,
    extra: Option<(&str, Value)>,
) -> Result<McpReply, GatewayError> {
    let own = state.ids.next_id();
    let mut p = translate::legacy_params(params);
    if let Some((k, v)) = extra {
        p.insert(k.to_string(), v);
    }
    let body = legacy_body(&own, method, p);
    let note = Arc::new(Mutex::new(None));
    let cell = note.clone();
    let session = Arc::new(Mutex::new(None));
    let session_cell = session.clone();
    let cancelled = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": id_value(&own), "reason": "the 2026-07-28 client closed its request"}});
    let prepare = move |out: &mut McpRequest, _: &UpstreamSession| {
        out.extensions.remove::<PendingCreation>();
        *session_cell.lock() = Some(out.ctx.clone());
        let msg =
            Message::parse(Bytes::from(cancelled.to_string())).expect("a well-formed message");
        let mut extensions = http::Extensions::new();
        extensions.insert(Era::Legacy);
        *cell.lock() = Some(McpRequest::from(RequestParts {
            op: Operation::Post(msg),
            ctx: out.ctx.clone(),
            extensions,
            trace: None,
        }));
    };
    let mut cancel = CancelOnDrop::new(&inner, note);
    match send(state, &inner, req, &body, On::Caller, &prepare).await {
        Ok(Ok(reply)) => {
            let keep = req.extensions.get::<RelaysUpstreamRequests>().is_some();
            let declared = match keep {
                true => super::declared_by(req),
                false => ClientCapabilities::default(),
            };
            let refuser = Refuser::new(state, &inner, session);
            Ok(relay(
                reply,
                own,
                id.clone(),
                method,
                cancel,
                keep,
                declared,
                refuser,
            ))
        }
        Ok(Err(NoSession(reply))) => {
            cancel.disarm();
            Ok(reply)
        }
        Err(e) => {
            cancel.disarm();
            Err(e)
        }
    }
}

/// A notification: sent on the caller's session with its `_meta` cleaned.
pub(super) async fn notification<S: McpService>(
    state: &ReverseState,
    inner: S,
    req: &McpRequest,
    msg: &Message,
) -> Result<McpReply, GatewayError> {
    let params: Option<Value> = match msg.params().map(serde_json::from_str::<Value>) {
        None => None,
        Some(Ok(p)) => Some(p),
        // Unreadable (a number beyond f64): not translatable, and a notification has no answer.
        Some(Err(_)) => return Ok(McpReply::accepted()),
    };
    let p = translate::legacy_params(params.as_ref());
    let mut body = json!({"jsonrpc": "2.0", "method": msg.method().unwrap_or_default()});
    if !p.is_empty() {
        body["params"] = Value::Object(p);
    }
    match send(state, &inner, req, &body, On::Caller, &|_, _| {}).await? {
        Ok(reply) => Ok(reply),
        Err(NoSession(_)) => Ok(McpReply::accepted()),
    }
}
