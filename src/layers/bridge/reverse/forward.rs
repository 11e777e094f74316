//! Requests with nothing of their own to translate (everything but `server/discover`,
//! `tools/call` and `tasks/*`), and notifications: sent on the caller's held session under an
//! id taskgate mints, the answer relayed to the 2026-07-28 client under its own id; a client
//! gone before the answer becomes `notifications/cancelled` upstream ([`CancelOnDrop`]).

use super::{id_value, legacy_body, send, translate, NoSession, On, ReverseState, UpstreamSession};
use crate::exchange::{GatewayError, McpReply, McpRequest, Operation, ReplyBody, RequestParts};
use crate::jsonrpc::{self, Id, Message};
use crate::layers::extensions::{PendingCreation, RelaysUpstreamRequests};
use crate::layers::McpService;
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
    /// Dropped: a request of the upstream's, which has no 2026-07-28 form.
    Drop,
    /// The answer, under the client's id.
    Answer(String),
}

/// An upstream reply passed to the 2026 client: the answer to `own` under the client's `id`
/// (its result through `complete_result`, or `cacheable_result` for a `method` whose 2026
/// result carries caching hints), notifications as they came, the upstream's own
/// requests dropped (2026-07-28 has none; kept when `keep_requests`, for a gateway task's held
/// call: [`RelaysUpstreamRequests`]), HTTP errors as they came. `cancel` is disarmed once
/// the answer has passed (before that, the client going away cancels the request upstream).
fn relay(
    reply: McpReply,
    own: Id,
    id: Id,
    method: &str,
    mut cancel: CancelOnDrop,
    keep_requests: bool,
) -> McpReply {
    let result_of: fn(&Value) -> Value = if translate::carries_cache_hints(method) {
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
        if v.get("method").is_some() {
            return match v.get("id") {
                Some(_) if !keep_requests => Relayed::Drop,
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
    let cancelled = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": id_value(&own), "reason": "the 2026-07-28 client closed its request"}});
    let prepare = move |out: &mut McpRequest, _: &UpstreamSession| {
        out.extensions.remove::<PendingCreation>();
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
            Ok(relay(reply, own, id.clone(), method, cancel, keep))
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
