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
//! A session's DELETE drops its entry.
//!
//! **Bounds** (issue 29 #5; one caller never evicts another's stream or subscriptions): an
//! entry (subscriptions, a stream) costs [`ENTRY_BYTES`] plus its id, and each URI
//! [`URI_OVERHEAD_BYTES`] plus its length. One principal (without auth, one client address:
//! [`Tenant`]) has at most [`MAX_LISTENING_PER_PRINCIPAL`] entries (past it, its own oldest
//! entry is dropped, its stream closed) and [`MAX_LISTEN_BYTES_PER_PRINCIPAL`] bytes (a
//! subscribe past it is refused `-32602`). Per upstream at most [`MAX_LISTENING_SESSIONS`]
//! entries and [`MAX_LISTEN_BYTES`] bytes: when full, entries of sessions taskgate no longer
//! holds (ended, reclaimed) are dropped first; if that frees nothing, the new entry is refused
//! (a GET 503 with `Retry-After`, a subscribe `-32603`), never taken from another caller.
//!
//! **Re-sent filters**: a 2026-07-28 listen's filter is fixed when it opens (no method changes
//! it), so a change of subscriptions opens a new listen with the whole filter (at most
//! [`MAX_SUBSCRIPTIONS`] URIs). Changes that arrive while a listen is being opened are folded
//! into the next one (a `watch` channel keeps only the latest), so a burst of subscribes costs
//! about one listen per upstream round trip, not one per subscribe.

use crate::exchange::{GatewayError, McpReply, McpRequest, Operation, ReplyBody, Tenant};
use crate::jsonrpc;
use crate::layers::bridge::era::Discovered;
use crate::layers::bridge::Discovery;
use crate::layers::bridge::{modern_request, translate};
use crate::layers::extensions::HeldAlive;
use crate::layers::relay::OwnIds;
use crate::layers::McpService;
use crate::mcp::capabilities::{CLIENT_CAPABILITIES_META, SUBSCRIPTION_ID_META};
use crate::mcp::era::{Era, MODERN_VERSION, PROTOCOL_VERSION_META};
use crate::mcp::errors::McpError;
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
/// Most held sessions with listen state per principal (or client address) and upstream.
pub const MAX_LISTENING_PER_PRINCIPAL: usize = 64;
/// Most bytes of listen state per upstream (see the module docs for how they are counted).
pub const MAX_LISTEN_BYTES: usize = 64 << 20;
/// Most bytes of listen state per principal (or client address) and upstream.
pub const MAX_LISTEN_BYTES_PER_PRINCIPAL: usize = 1 << 20;
/// What an entry costs besides its id and URIs, in bytes (the map slot, the channels).
pub const ENTRY_BYTES: usize = 256;
/// What a subscribed URI costs besides its length, in bytes (the set's node).
pub const URI_OVERHEAD_BYTES: usize = 64;
/// How long the upstream's `server/discover` capabilities are reused.
pub const DISCOVER_TTL: Duration = Duration::from_secs(60);
/// The `Accept` of taskgate's POSTs for a GET stream.
const BOTH_TYPES: HeaderValue = HeaderValue::from_static("application/json, text/event-stream");
/// Capacity of the channel to the client's GET stream.
const RELAY_CAPACITY: usize = 64;

/// One held session's listen state.
struct Session {
    /// Whom it counts against.
    tenant: Tenant,
    /// What it costs (see [`ENTRY_BYTES`]).
    bytes: usize,
    uris: BTreeSet<String>,
    /// Bumped when `uris` change (an open stream listens again).
    changed: watch::Sender<u64>,
    /// The open GET stream: its token, and the signal that closes it.
    stream: Option<(u64, oneshot::Sender<()>)>,
}

/// What one upstream's held sessions' GET streams need: the listen state, and the handles
/// the held sessions' upstream stage gives it.
pub struct Listening {
    /// Ids of taskgate's own upstream requests (shared with the bridge and the relay).
    ids: Arc<OwnIds>,
    /// The upstream's era, the one fact both bridges read: its `server/discover` says what a
    /// GET stream can listen to.
    era: Arc<Discovery>,
    /// The upstream's `timeout_ms`: bounds each `subscriptions/listen` until its stream opens.
    timeout: Duration,
    /// The held sessions' GET streams and resource subscriptions.
    listens: Listens,
}

impl Listening {
    /// The GET streams of one upstream's held sessions: taskgate's own ids from `ids`, what
    /// can be listened to from `era`'s `server/discover`, each `subscriptions/listen` bounded by
    /// `timeout` (the upstream's `timeout_ms`).
    pub fn new(ids: Arc<OwnIds>, era: Arc<Discovery>, timeout: Duration) -> Listening {
        Listening {
            ids,
            era,
            timeout,
            listens: Listens::default(),
        }
    }
}

/// The listen state of one upstream's held sessions (see the module docs).
#[derive(Default)]
pub struct Listens {
    sessions: Mutex<Table>,
    discovered: Mutex<Option<(Instant, Value)>>,
    tokens: AtomicU64,
}

/// The entries, in creation order, with what each tenant holds.
#[derive(Default)]
struct Table {
    map: HashMap<String, Session>,
    order: VecDeque<String>,
    /// Per tenant: (entries, bytes).
    tenants: HashMap<Tenant, (usize, usize)>,
    bytes: usize,
}

/// Why an entry could not be made or grown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Full {
    /// The upstream's table is full of other callers' live entries.
    Table,
    /// The caller's own byte budget is spent.
    Principal,
}

impl Table {
    fn remove(&mut self, id: &str) {
        let Some(old) = self.map.remove(id) else {
            return;
        };
        self.order.retain(|s| s != id);
        self.bytes -= old.bytes;
        if let Some((n, b)) = self.tenants.get_mut(&old.tenant) {
            *n -= 1;
            *b -= old.bytes;
            if *n == 0 {
                self.tenants.remove(&old.tenant);
            }
        }
    }

    fn charge(&mut self, id: &str, delta: isize) {
        let Some(s) = self.map.get_mut(id) else {
            return;
        };
        s.bytes = s.bytes.saturating_add_signed(delta);
        self.bytes = self.bytes.saturating_add_signed(delta);
        if let Some((_, b)) = self.tenants.get_mut(&s.tenant) {
            *b = b.saturating_add_signed(delta);
        }
    }

    fn held_by(&self, tenant: &Tenant) -> (usize, usize) {
        self.tenants.get(tenant).copied().unwrap_or((0, 0))
    }

    /// Room for `extra` more bytes of `tenant` (and a new entry when `new`): its own oldest
    /// entry goes when it is at its entry cap; entries of sessions no longer `alive` go when
    /// the table is full; never another live caller's.
    fn make_room(
        &mut self,
        tenant: &Tenant,
        new: bool,
        extra: usize,
        alive: &dyn Fn(&str) -> bool,
    ) -> Result<(), Full> {
        if new && self.held_by(tenant).0 >= MAX_LISTENING_PER_PRINCIPAL {
            if let Some(old) = self
                .order
                .iter()
                .find(|id| self.map.get(*id).is_some_and(|s| s.tenant == *tenant))
                .cloned()
            {
                self.remove(&old);
            }
        }
        if self.held_by(tenant).1 + extra > MAX_LISTEN_BYTES_PER_PRINCIPAL {
            return Err(Full::Principal);
        }
        let full = |t: &Table| {
            (new && t.map.len() >= MAX_LISTENING_SESSIONS) || t.bytes + extra > MAX_LISTEN_BYTES
        };
        if full(self) {
            let gone: Vec<String> = self.order.iter().filter(|id| !alive(id)).cloned().collect();
            for id in gone {
                self.remove(&id);
            }
        }
        if full(self) {
            return Err(Full::Table);
        }
        Ok(())
    }
}

impl Listens {
    /// Runs `f` on a session's state, made for `tenant` when it has none (see the module docs
    /// for the bounds; `alive` tells whether taskgate still holds a session id).
    fn with_session<T>(
        &self,
        id: &str,
        tenant: &Tenant,
        alive: &dyn Fn(&str) -> bool,
        f: impl FnOnce(&mut Session) -> T,
    ) -> Result<T, Full> {
        let mut table = self.sessions.lock();
        if !table.map.contains_key(id) {
            let bytes = ENTRY_BYTES + id.len();
            table.make_room(tenant, true, bytes, alive)?;
            table.order.push_back(id.to_string());
            table.map.insert(
                id.to_string(),
                Session {
                    tenant: tenant.clone(),
                    bytes,
                    uris: BTreeSet::new(),
                    changed: watch::channel(0).0,
                    stream: None,
                },
            );
            table.bytes += bytes;
            let held = table.tenants.entry(tenant.clone()).or_default();
            held.0 += 1;
            held.1 += bytes;
        }
        Ok(f(table.map.get_mut(id).expect("inserted above")))
    }

    /// Runs `f` on a session's state only if it has one (never creates it: a stream ending
    /// after its session's DELETE must not bring the session's entry back).
    fn if_session<T>(&self, id: &str, f: impl FnOnce(&mut Session) -> T) -> Option<T> {
        self.sessions.lock().map.get_mut(id).map(f)
    }

    /// Adds or removes a subscribed URI of `id`'s session (made for `tenant` when it has no
    /// state); `Ok(false)` when [`MAX_SUBSCRIPTIONS`] are kept already.
    fn subscribe(
        &self,
        id: &str,
        tenant: &Tenant,
        alive: &dyn Fn(&str) -> bool,
        uri: &str,
        adding: bool,
    ) -> Result<bool, Full> {
        self.with_session(id, tenant, alive, |_| ())?;
        let mut table = self.sessions.lock();
        let Some(s) = table.map.get(id) else {
            return Err(Full::Table);
        };
        let (has, count, tenant) = (s.uris.contains(uri), s.uris.len(), s.tenant.clone());
        let cost = URI_OVERHEAD_BYTES + uri.len();
        let delta = match (adding, has) {
            (true, false) if count >= MAX_SUBSCRIPTIONS => return Ok(false),
            (true, false) => {
                table.make_room(&tenant, false, cost, alive)?;
                cost as isize
            }
            (false, true) => -(cost as isize),
            _ => return Ok(true),
        };
        let Some(s) = table.map.get_mut(id) else {
            return Err(Full::Table);
        };
        if adding {
            s.uris.insert(uri.to_string());
        } else {
            s.uris.remove(uri);
        }
        s.changed.send_modify(|n| *n += 1);
        table.charge(id, delta);
        Ok(true)
    }

    /// Forgets a session (it ended): its stream is closed.
    pub fn forget(&self, id: &str) {
        self.sessions.lock().remove(id);
    }

    /// Entries and bytes held now (for tests and metrics).
    pub fn usage(&self) -> (usize, usize) {
        let table = self.sessions.lock();
        (table.map.len(), table.bytes)
    }
}

/// Whether taskgate still holds `req`'s upstream's session `id`, as `held_sessions` tells it
/// ([`HeldAlive`]; without it: always).
fn alive_in(req: &McpRequest) -> impl Fn(&str) -> bool {
    let alive = req.extensions.get::<HeldAlive>().cloned();
    move |id: &str| alive.as_ref().map_or(true, |a| (a.0)(id))
}

/// HTTP 503 with `Retry-After: 1`: no room for another session's listen state (a GET stream;
/// a `resources/subscribe` gets the same error under its id).
fn no_room() -> McpReply {
    McpReply::error(Era::Legacy, None, &McpError::HeldListenFull)
        .answered_locally(LocalReason::HeldSession)
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
    state: &Arc<Listening>,
    inner: &S,
    req: &McpRequest,
) -> Option<Value> {
    if let Some((at, caps)) = state.listens.discovered.lock().as_ref() {
        if at.elapsed() < DISCOVER_TTL {
            return Some(caps.clone());
        }
    }
    let Discovered::Answer(Some(answer)) = state.era.ask(inner.clone(), req, &state.ids).await
    else {
        return None;
    };
    let caps = answer.pointer("/result/capabilities").cloned()?;
    *state.listens.discovered.lock() = Some((Instant::now(), caps.clone()));
    Some(caps)
}

/// A held session's GET: its stream bridged to `subscriptions/listen` (see the module docs).
pub(super) async fn open<S: McpService>(
    state: Arc<Listening>,
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
    let (tenant, alive) = (req.ctx.tenant(), alive_in(&req));
    let Ok((uris, changed)) = state.listens.with_session(&session, &tenant, &alive, |s| {
        (s.uris.clone(), s.changed.subscribe())
    }) else {
        return Ok(no_room());
    };
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
    let Ok(previous) = state.listens.with_session(&session, &tenant, &alive, |s| {
        s.stream.replace((token, close_tx))
    }) else {
        return Ok(no_room());
    };
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
    state: &Arc<Listening>,
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
            // An entry dropped meanwhile (DELETE, or its own caller's newer ones) is not
            // made again here: its stream was closed with it.
            let Some(uris) = state.listens.if_session(session, |s| s.uris.clone()) else {
                return;
            };
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
    state: &Listening,
    inner: &S,
    req: &McpRequest,
    filter: Value,
) -> Result<EventStream, String> {
    let id = state.ids.next_id();
    let params = json!({
        "notifications": filter,
        "_meta": {PROTOCOL_VERSION_META: MODERN_VERSION, CLIENT_CAPABILITIES_META: {}},
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
    state: &Arc<Listening>,
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
        let error = McpError::MissingParam {
            method: None,
            key: "uri",
            shape: "a string",
        };
        return Some(McpReply::error(Era::Legacy, Some(&id), &error));
    };
    if uri.len() > MAX_URI_BYTES {
        let error = McpError::UriTooLong { max: MAX_URI_BYTES };
        return Some(McpReply::error(Era::Legacy, Some(&id), &error));
    }
    let adding = msg.method() == Some("resources/subscribe");
    let alive = alive_in(req);
    let kept = state
        .listens
        .subscribe(&session, &req.ctx.tenant(), &alive, uri, adding);
    let refuse = |error: McpError| McpReply::error(Era::Legacy, Some(&id), &error);
    let reply = match kept {
        Ok(true) => McpReply::local_json(jsonrpc::result_response(&id, "{}")),
        Ok(false) => refuse(McpError::TooManySubscriptions {
            max: MAX_SUBSCRIPTIONS,
        }),
        Err(Full::Principal) => refuse(McpError::SubscriptionBytesExceeded {
            max: MAX_LISTEN_BYTES_PER_PRINCIPAL,
        }),
        Err(Full::Table) => refuse(McpError::HeldListenFull),
    };
    Some(reply.answered_locally(LocalReason::HeldSession))
}

/// Forgets the listen state of `req`'s session (its DELETE).
pub(super) fn forget(state: &Listening, req: &McpRequest) {
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

    /// Issue 29 #5: other callers' sessions never evict a victim's listen state; one caller's
    /// own newer entries drop its own oldest; ended sessions make room; bytes are bounded per
    /// caller.
    #[test]
    fn the_listen_table_is_bounded_per_caller_and_in_bytes() {
        let listens = Listens::default();
        let live = |_: &str| true;
        let bob = Tenant::Principal("bob".into());
        let (close_tx, mut close_rx) = oneshot::channel();
        listens
            .with_session("bob-1", &bob, &live, |s| s.stream = Some((0, close_tx)))
            .unwrap();
        assert_eq!(
            listens.subscribe("bob-1", &bob, &live, "a://b", true),
            Ok(true)
        );
        // 64 other callers fill the table with live entries, 64 each.
        let mut refused = 0;
        for t in 0..64 {
            let tenant = Tenant::Principal(format!("t{t}").into());
            for i in 0..MAX_LISTENING_PER_PRINCIPAL {
                if listens
                    .with_session(&format!("t{t}-{i}"), &tenant, &live, |_| ())
                    .is_err()
                {
                    refused += 1;
                }
            }
        }
        assert_eq!(
            refused, 1,
            "the table is full: the last new entry is refused"
        );
        assert!(
            listens.if_session("bob-1", |s| s.uris.len()) == Some(1),
            "bob's subscriptions are kept"
        );
        assert!(
            matches!(
                close_rx.try_recv(),
                Err(oneshot::error::TryRecvError::Empty)
            ),
            "bob's stream stays open"
        );
        // A caller's own newer entry drops its own oldest.
        let t0 = Tenant::Principal("t0".into());
        listens.with_session("t0-new", &t0, &live, |_| ()).unwrap();
        assert!(listens.if_session("t0-0", |_| ()).is_none());
        assert!(listens.if_session("t1-0", |_| ()).is_some());
        // Ended sessions make room for a new caller.
        let alice = Tenant::Principal("alice".into());
        let t5_gone = |id: &str| !id.starts_with("t5-");
        assert_eq!(
            listens.with_session("alice-1", &alice, &live, |_| ()).err(),
            Some(Full::Table)
        );
        listens
            .with_session("alice-1", &alice, &t5_gone, |_| ())
            .unwrap();
        assert!(listens.if_session("t5-3", |_| ()).is_none());
        assert!(listens.if_session("bob-1", |_| ()).is_some());

        // Bytes: one caller's subscriptions stop at its budget; a removal frees bytes.
        let carol = Tenant::Principal("carol".into());
        let long = |i: usize| format!("r://{i:04}/{}", "x".repeat(MAX_URI_BYTES - 10));
        let mut over = None;
        'fill: for s in 0..4 {
            for i in 0..MAX_SUBSCRIPTIONS {
                match listens.subscribe(
                    &format!("carol-{s}"),
                    &carol,
                    &t5_gone,
                    &long(s * 1000 + i),
                    true,
                ) {
                    Ok(true) => {}
                    other => {
                        over = Some(other);
                        break 'fill;
                    }
                }
            }
        }
        assert_eq!(over, Some(Err(Full::Principal)));
        let (_, bytes) = listens.sessions.lock().held_by(&carol);
        assert!(bytes <= MAX_LISTEN_BYTES_PER_PRINCIPAL, "{bytes}");
        assert_eq!(
            listens.subscribe("carol-0", &carol, &t5_gone, &long(0), false),
            Ok(true)
        );
        assert_eq!(
            listens.subscribe("carol-0", &carol, &t5_gone, &long(0), true),
            Ok(true)
        );
        let (entries, total) = listens.usage();
        assert!(entries <= MAX_LISTENING_SESSIONS && total <= MAX_LISTEN_BYTES);
        listens.forget("carol-0");
        listens.forget("carol-1");
        assert!(listens.sessions.lock().held_by(&carol).1 < bytes);
    }
}
