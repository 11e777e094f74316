//! A held session's GET stream (2025-11-25 transports: the client's standalone SSE stream),
//! bridged to the upstream's `subscriptions/listen` (2026-07-28 §2.3: the only long-lived
//! stream; there is no GET stream and no `resources/subscribe` there).
//!
//! **What is listened to**: what the upstream's `server/discover` capabilities offer (asked at
//! most once per [`DISCOVER_TTL`]): `toolsListChanged` (`capabilities.tools.listChanged`),
//! `promptsListChanged` (`prompts.listChanged`), `resourcesListChanged`
//! (`resources.listChanged`), and `resourceSubscriptions`: the URIs the client subscribed to on
//! its session (`resources/subscribe` / `resources/unsubscribe`, which taskgate answers itself
//! with `{}` when the upstream offers `resources.subscribe`, and keeps per session: at most
//! [`MAX_SUBSCRIPTIONS`] URIs, a URI longer than [`MAX_URI_BYTES`] refused with `-32602`). An
//! upstream that offers none of these (or does not answer `server/discover`, or answers the
//! first `subscriptions/listen` with anything but an SSE stream) gets the GET answered 405 as
//! before (the 2025 answer of a server without a GET stream).
//!
//! **The stream**: `subscriptions/listen` goes upstream as a stateless 2026 request (as every
//! request of a held session), its SSE answer relayed to the client's GET stream as a 2025
//! client takes it: `notifications/subscriptions/acknowledged` swallowed, the
//! `_meta["io.modelcontextprotocol/subscriptionId"]` removed from every notification,
//! `notifications/tasks` as `notifications/tasks/status`; the listen's final result (the server
//! ending it) ends the client's stream, which a 2025 client reopens. A `resources/subscribe` or
//! `unsubscribe` while the stream is open closes the upstream listen and opens one with the new
//! filter (2026: closing the stream is the cancel). The client closing its stream closes the
//! upstream listen.
//!
//! **One GET stream per held session**: 2025-11-25 lets a server answer GET with a stream or
//! 405 (nothing else) and lets either side close a stream, so a second GET gets its stream and
//! the first one is closed (a client that reconnects after a lost connection is never refused).
//! At most [`MAX_LISTENING_SESSIONS`] sessions have state here (subscriptions, a stream); past it
//! the oldest entry is dropped (its stream closed). A session's DELETE drops its entry.

use super::{modern_request, translate, BridgeState};
use crate::era::{self, CLIENT_CAPABILITIES_META, PROTOCOL_VERSION_META};
use crate::exchange::{GatewayError, McpReply, McpRequest, Operation, ReplyBody};
use crate::jsonrpc;
use crate::layers::McpService;
use crate::metrics::LocalReason;
use crate::sse::{Event, EventStream};
use futures_util::StreamExt;
use http::{HeaderValue, StatusCode};
use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};
use tower::ServiceExt;

/// Most resource URIs one held session keeps subscribed.
pub const MAX_SUBSCRIPTIONS: usize = 256;
/// Longest resource URI kept (bytes).
pub const MAX_URI_BYTES: usize = 2048;
/// Most held sessions with listen state per upstream.
pub const MAX_LISTENING_SESSIONS: usize = 4096;
/// How long the upstream's `server/discover` capabilities are reused.
pub const DISCOVER_TTL: Duration = Duration::from_secs(60);
/// `_meta` key a 2026 server puts on every notification of a `subscriptions/listen` stream.
pub const SUBSCRIPTION_ID_META: &str = "io.modelcontextprotocol/subscriptionId";
/// The `Accept` of taskgate's POSTs for a GET stream.
const BOTH_TYPES: HeaderValue = HeaderValue::from_static("application/json, text/event-stream");
/// Capacity of the channel to the client's GET stream.
const RELAY_CAPACITY: usize = 64;

/// One held session's listen state.
struct Session {
    uris: BTreeSet<String>,
    /// Bumped when `uris` change (an open stream listens again).
    changed: watch::Sender<u64>,
    /// The open GET stream: its token, and the signal that closes it.
    stream: Option<(u64, oneshot::Sender<()>)>,
}

/// The listen state of one upstream's held sessions (see the module docs).
#[derive(Default)]
pub struct Listens {
    sessions: Mutex<(HashMap<String, Session>, VecDeque<String>)>,
    discovered: Mutex<Option<(Instant, Value)>>,
    tokens: AtomicU64,
}

impl Listens {
    fn with_session<T>(&self, id: &str, f: impl FnOnce(&mut Session) -> T) -> T {
        let mut guard = self.sessions.lock();
        let (map, order) = &mut *guard;
        if !map.contains_key(id) {
            if map.len() >= MAX_LISTENING_SESSIONS {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                }
            }
            order.push_back(id.to_string());
            map.insert(
                id.to_string(),
                Session {
                    uris: BTreeSet::new(),
                    changed: watch::channel(0).0,
                    stream: None,
                },
            );
        }
        f(map.get_mut(id).expect("inserted above"))
    }

    /// Runs `f` on a session's state only if it has one (never creates it: a stream ending
    /// after its session's DELETE must not bring the session's entry back).
    fn if_session(&self, id: &str, f: impl FnOnce(&mut Session)) {
        if let Some(s) = self.sessions.lock().0.get_mut(id) {
            f(s);
        }
    }

    /// Forgets a session (it ended): its stream is closed.
    pub fn forget(&self, id: &str) {
        let mut guard = self.sessions.lock();
        guard.0.remove(id);
        guard.1.retain(|s| s != id);
    }
}

/// The filter categories an upstream offers (from its `server/discover` capabilities).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Offer {
    tools: bool,
    prompts: bool,
    resources: bool,
    subscribe: bool,
}

impl Offer {
    /// What `capabilities` (a 2026 `ServerCapabilities`) offers to listen to.
    pub fn of(capabilities: &Value) -> Offer {
        let yes = |p: &str| capabilities.pointer(p).and_then(Value::as_bool) == Some(true);
        Offer {
            tools: yes("/tools/listChanged"),
            prompts: yes("/prompts/listChanged"),
            resources: yes("/resources/listChanged"),
            subscribe: yes("/resources/subscribe"),
        }
    }

    fn any(&self) -> bool {
        self.tools || self.prompts || self.resources || self.subscribe
    }

    /// The `subscriptions/listen` filter with `uris` subscribed; `None` when it is empty.
    pub fn filter(&self, uris: &BTreeSet<String>) -> Option<Value> {
        let mut f = Map::new();
        for (on, name) in [
            (self.tools, "toolsListChanged"),
            (self.prompts, "promptsListChanged"),
            (self.resources, "resourcesListChanged"),
        ] {
            if on {
                f.insert(name.into(), json!(true));
            }
        }
        if self.subscribe && !uris.is_empty() {
            f.insert("resourceSubscriptions".into(), json!(uris));
        }
        (!f.is_empty()).then_some(Value::Object(f))
    }
}

fn session_of(req: &McpRequest) -> Option<String> {
    req.ctx
        .client_session_id
        .as_ref()
        .and_then(|s| s.to_str().ok())
        .map(str::to_string)
}

/// HTTP 405 with `Allow: POST, DELETE` (no GET stream here).
pub(super) fn not_allowed() -> McpReply {
    let mut r = McpReply::accepted();
    r.status = StatusCode::METHOD_NOT_ALLOWED;
    r.headers.insert(
        http::header::ALLOW,
        HeaderValue::from_static("POST, DELETE"),
    );
    r.answered_locally(LocalReason::HeldSession)
}

/// A GET's headers made those of a JSON-RPC POST taskgate sends for it: a GET accepts only
/// `text/event-stream` and has no `Content-Type`.
fn as_post(headers: &mut http::HeaderMap) {
    headers.insert(http::header::ACCEPT, BOTH_TYPES);
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.remove("last-event-id");
}

/// The upstream's `server/discover` capabilities (reused for [`DISCOVER_TTL`]).
async fn capabilities<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
) -> Option<Value> {
    if let Some((at, caps)) = state.listens.discovered.lock().as_ref() {
        if at.elapsed() < DISCOVER_TTL {
            return Some(caps.clone());
        }
    }
    let mut probe = req.clone();
    as_post(&mut probe.ctx.headers);
    let super::follow::Discovered::Answer(Some(answer)) =
        super::follow::ask_discover(state, inner.clone(), &probe).await
    else {
        return None;
    };
    let caps = answer.pointer("/result/capabilities").cloned()?;
    *state.listens.discovered.lock() = Some((Instant::now(), caps.clone()));
    Some(caps)
}

/// A held session's GET: its stream bridged to `subscriptions/listen` (see the module docs).
pub(super) async fn open<S: McpService>(
    state: Arc<BridgeState>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError> {
    let Some(session) = session_of(&req) else {
        return Ok(not_allowed());
    };
    let caps = capabilities(&state, &inner, &req).await;
    let Some(offer) = caps.as_ref().map(Offer::of).filter(Offer::any) else {
        tracing::debug!(capabilities = ?caps, "nothing to listen to: the held session's GET is 405");
        return Ok(not_allowed());
    };
    let (uris, changed) = state
        .listens
        .with_session(&session, |s| (s.uris.clone(), s.changed.subscribe()));
    let first = match offer.filter(&uris) {
        Some(filter) => match listen(&state, &inner, &req, filter).await {
            Ok(events) => Some(events),
            Err(why) => {
                tracing::info!(upstream = %req.ctx.upstream, why, "subscriptions/listen refused: the held session's GET is 405");
                return Ok(not_allowed());
            }
        },
        None => None,
    };
    let token = state.listens.tokens.fetch_add(1, Ordering::Relaxed);
    let (close_tx, close_rx) = oneshot::channel();
    let previous = state
        .listens
        .with_session(&session, |s| s.stream.replace((token, close_tx)));
    if let Some((_, close)) = previous {
        tracing::debug!("a second GET stream of a held session: the first one is closed");
        let _ = close.send(());
    }
    let (tx, rx) = mpsc::channel(RELAY_CAPACITY);
    tokio::spawn(async move {
        run(
            &state, inner, &req, &session, offer, first, close_rx, changed, tx,
        )
        .await;
        state.listens.if_session(&session, |s| {
            if s.stream.as_ref().is_some_and(|(t, _)| *t == token) {
                s.stream = None;
            }
        });
    });
    Ok(McpReply::event_stream(rx, None))
}

/// Relays upstream listens to `tx` until the client goes away, the stream is replaced or its
/// session dropped, or the upstream ends its listen.
#[allow(clippy::too_many_arguments)]
async fn run<S: McpService>(
    state: &Arc<BridgeState>,
    inner: S,
    req: &McpRequest,
    session: &str,
    offer: Offer,
    mut upstream: Option<EventStream>,
    mut close: oneshot::Receiver<()>,
    mut changed: watch::Receiver<u64>,
    tx: mpsc::Sender<Event>,
) {
    loop {
        if upstream.is_none() {
            let uris = state.listens.with_session(session, |s| s.uris.clone());
            if let Some(filter) = offer.filter(&uris) {
                match listen(state, &inner, req, filter).await {
                    Ok(events) => upstream = Some(events),
                    Err(why) => tracing::info!(why, "subscriptions/listen refused; waiting for a change of the session's subscriptions"),
                }
            }
        }
        let pump = async {
            match upstream.take() {
                Some(events) => relay(events, &tx).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut close => return,
            _ = tx.closed() => return,
            c = changed.changed() => {
                if c.is_err() {
                    return;
                }
                // The subscriptions changed: the listen in flight is dropped (closed upstream)
                // and a new one opened with the new filter.
            }
            _ = pump => {
                tracing::debug!("the upstream ended its subscriptions/listen: the GET stream ends");
                return;
            }
        }
    }
}

/// Sends `subscriptions/listen` with `filter` upstream: its SSE stream, or why not.
async fn listen<S: McpService>(
    state: &BridgeState,
    inner: &S,
    req: &McpRequest,
    filter: Value,
) -> Result<EventStream, String> {
    let id = state.next_id();
    let params = json!({
        "notifications": filter,
        "_meta": {PROTOCOL_VERSION_META: era::MODERN_VERSION, CLIENT_CAPABILITIES_META: {}},
    });
    let mut out = modern_request(req, &id, "subscriptions/listen", params, None);
    as_post(&mut out.ctx.headers);
    let reply = match tokio::time::timeout(state.timeout, inner.clone().oneshot(out)).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no answer within {} ms", state.timeout.as_millis())),
    };
    match reply.body {
        ReplyBody::Stream(events) if reply.status.is_success() => Ok(events),
        ReplyBody::Json(bytes) | ReplyBody::Raw(bytes) => Err(format!(
            "HTTP {}: {}",
            reply.status,
            String::from_utf8_lossy(&bytes[..bytes.len().min(512)])
        )),
        _ => Err(format!("HTTP {} without a stream", reply.status)),
    }
}

/// Relays one upstream listen's notifications to the client (see [`legacy_listen_event`])
/// until it ends (its final result, or the stream closing).
async fn relay(mut events: EventStream, tx: &mpsc::Sender<Event>) {
    while let Some(ev) = events.next().await {
        let Some(data) = ev.data.as_deref() else {
            continue;
        };
        match legacy_listen_event(data) {
            Listened::Relay(text) => {
                if tx.send(Event::message(text)).await.is_err() {
                    return;
                }
            }
            Listened::Skip => {}
            Listened::End => return,
        }
    }
}

/// What one message of a `subscriptions/listen` stream is for a 2025 client's GET stream.
#[derive(Debug, PartialEq)]
pub enum Listened {
    /// This notification (JSON text).
    Relay(String),
    /// Nothing (the acknowledgement, or not JSON-RPC).
    Skip,
    /// The listen's final answer: the stream ends.
    End,
}

/// A message of a `subscriptions/listen` stream as a 2025 client's GET stream takes it:
/// `notifications/subscriptions/acknowledged` swallowed, the subscription id `_meta` removed,
/// `notifications/tasks` as `notifications/tasks/status`; an answer (the listen's result or
/// error) ends the stream.
pub fn legacy_listen_event(data: &str) -> Listened {
    let Ok(mut v) = serde_json::from_str::<Value>(data) else {
        return Listened::Skip;
    };
    if v.get("id").is_some() {
        return if v.get("method").is_some() {
            // A request to the client: 2026 has none on any stream.
            Listened::Skip
        } else {
            Listened::End
        };
    }
    match v.get("method").and_then(Value::as_str) {
        None | Some("notifications/subscriptions/acknowledged") => return Listened::Skip,
        Some(_) => {}
    }
    if let Some(meta) = v
        .get_mut("params")
        .and_then(|p| p.get_mut("_meta"))
        .and_then(Value::as_object_mut)
    {
        meta.remove(SUBSCRIPTION_ID_META);
        if meta.is_empty() {
            if let Some(p) = v.get_mut("params").and_then(Value::as_object_mut) {
                p.remove("_meta");
            }
        }
    }
    let text = v.to_string();
    Listened::Relay(translate::legacy_notification(&text).unwrap_or(text))
}

/// A held session's `resources/subscribe` / `resources/unsubscribe`: answered here (`{}`) and
/// kept for its listen when the upstream offers `resources.subscribe`; `None` (send it upstream
/// as any request) when it does not.
pub(super) async fn subscribe<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
) -> Option<McpReply> {
    let Operation::Post(msg) = &req.op else {
        return None;
    };
    let id = msg.id()?.clone();
    let session = session_of(req)?;
    let caps = capabilities(state, inner, req).await?;
    if !Offer::of(&caps).subscribe {
        return None;
    }
    let v: Value = msg.parse_as().ok()?;
    let Some(uri) = v.pointer("/params/uri").and_then(Value::as_str) else {
        return Some(McpReply::local_error(
            Some(&id),
            jsonrpc::INVALID_PARAMS,
            "params.uri (a string) is required",
        ));
    };
    if uri.len() > MAX_URI_BYTES {
        return Some(McpReply::local_error(
            Some(&id),
            jsonrpc::INVALID_PARAMS,
            &format!("the resource URI is longer than taskgate keeps ({MAX_URI_BYTES} bytes)"),
        ));
    }
    let adding = msg.method() == Some("resources/subscribe");
    let kept = state.listens.with_session(&session, |s| {
        let changed = if adding {
            if !s.uris.contains(uri) && s.uris.len() >= MAX_SUBSCRIPTIONS {
                return false;
            }
            s.uris.insert(uri.to_string())
        } else {
            s.uris.remove(uri)
        };
        if changed {
            s.changed.send_modify(|n| *n += 1);
        }
        true
    });
    let reply = if kept {
        McpReply::local_json(jsonrpc::result_response(&id, "{}"))
    } else {
        McpReply::local_error(
            Some(&id),
            jsonrpc::INVALID_PARAMS,
            &format!(
                "taskgate keeps at most {MAX_SUBSCRIPTIONS} resource subscriptions per session"
            ),
        )
    };
    Some(reply.answered_locally(LocalReason::HeldSession))
}

/// Forgets the listen state of `req`'s session (its DELETE).
pub(super) fn forget(state: &BridgeState, req: &McpRequest) {
    if let Some(session) = session_of(req) {
        state.listens.forget(&session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_events_as_a_2025_client_takes_them() {
        let ack = r#"{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{"notifications":{}}}"#;
        assert_eq!(legacy_listen_event(ack), Listened::Skip);
        let changed = r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":{"io.modelcontextprotocol/subscriptionId":"s1"}}}"#;
        let Listened::Relay(t) = legacy_listen_event(changed) else {
            panic!("relayed")
        };
        let v: Value = serde_json::from_str(&t).unwrap();
        assert!(v["params"].get("_meta").is_none(), "{v}");
        let kept = r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"a://b","_meta":{"io.modelcontextprotocol/subscriptionId":"s1","x":1}}}"#;
        let Listened::Relay(t) = legacy_listen_event(kept) else {
            panic!("relayed")
        };
        let v: Value = serde_json::from_str(&t).unwrap();
        assert_eq!(v["params"]["_meta"], json!({"x": 1}));
        assert_eq!(
            legacy_listen_event(r#"{"jsonrpc":"2.0","id":"l","result":{}}"#),
            Listened::End
        );
        assert_eq!(legacy_listen_event("not json"), Listened::Skip);
    }

    #[test]
    fn the_filter_is_what_the_upstream_offers() {
        let caps = json!({"tools": {"listChanged": true}, "resources": {"subscribe": true}});
        let offer = Offer::of(&caps);
        assert!(offer.any());
        let none = BTreeSet::new();
        assert_eq!(offer.filter(&none), Some(json!({"toolsListChanged": true})));
        let uris: BTreeSet<String> = ["a://1".to_string()].into();
        assert_eq!(
            offer.filter(&uris),
            Some(json!({"toolsListChanged": true, "resourceSubscriptions": ["a://1"]}))
        );
        assert!(!Offer::of(&json!({"tools": {}})).any());
        let only_subscribe = Offer::of(&json!({"resources": {"subscribe": true}}));
        assert!(only_subscribe.any() && only_subscribe.filter(&none).is_none());
    }
}
