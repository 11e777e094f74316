//! What flows through the `McpService` stack: an [`McpRequest`] goes down once, an [`McpReply`]
//! comes back up through the same layers.
//!
//! A request is one Streamable HTTP operation (2025-11-25 basic/transports): a POST carrying one
//! JSON-RPC [`Message`], the GET that opens the standalone SSE stream, or the DELETE that ends a
//! session. Its [`RequestContext`] says who sent it, on which `Mcp-Session-Id`, to which upstream.
//! A reply is the upstream's answer: one JSON message, a stream of SSE events (inspected event by
//! event by the layers that need to, never buffered whole), an empty body (202), or any other body
//! passed through as it came (upstream HTTP errors).

use crate::jsonrpc::{self, Id, Message};
use crate::mcp::classify::Classified;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::metrics::{LocalReason, RequestOutcome};
use crate::sse::EventStream;
use crate::store::Owner;
use crate::telemetry::{semconv, KeyValue, RequestTrace};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use std::sync::Arc;

/// The Streamable HTTP operation a client performed.
#[derive(Debug, Clone)]
pub enum Operation {
    /// `POST`: one JSON-RPC message.
    Post(Message),
    /// `GET`: open (or resume, with `Last-Event-ID`) the standalone SSE stream.
    OpenStream,
    /// `DELETE`: end the session.
    EndSession,
}

/// Whom the per-principal fairness caps (`[limits]`: GET streams, sessions, held-session listen
/// state; failed authentications) count a request against: its authenticated principal, or,
/// without one (`[auth] mode = "none"`), the client's address: the only thing that tells
/// callers apart before they hold a session. An IPv6 address counts by its /64 prefix (one
/// host usually holds a whole /64); an IPv4-mapped IPv6 address as the IPv4 address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Tenant {
    /// An authenticated principal ([`Principal::Token`]).
    Principal(Arc<str>),
    /// The client's address (IPv6: its /64 prefix, the rest zero).
    Address(std::net::IpAddr),
    /// No principal and no address known (requests taskgate makes itself, unit tests).
    Unknown,
}

impl Tenant {
    /// The key of a client address (see the type's docs).
    pub fn of_addr(addr: std::net::IpAddr) -> Tenant {
        use std::net::{IpAddr, Ipv6Addr};
        Tenant::Address(match addr {
            IpAddr::V4(_) => addr,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
            },
        })
    }

    /// The tenant of a caller: its principal when authenticated, else its address.
    pub fn of(principal: &Principal, addr: Option<std::net::IpAddr>) -> Tenant {
        match (principal, addr) {
            (Principal::Token(p), _) => Tenant::Principal(p.clone()),
            (Principal::Anonymous, Some(a)) => Tenant::of_addr(a),
            (Principal::Anonymous, None) => Tenant::Unknown,
        }
    }
}

/// Who a caller is: the spec's "authorization context" (2025-11-25 tasks: Security Considerations).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// Authenticated: a configured bearer token's principal name, or `<iss>#<sub>` of an OAuth
    /// access token (`src/auth/oauth.rs`).
    Token(Arc<str>),
    /// No authentication configured: callers are told apart only by their `Mcp-Session-Id`.
    Anonymous,
}

/// A request extension the edge sets on a 2025-11-25 client request whose JSON-RPC id has the
/// form of taskgate's own ids ([`in_own_form`]): that id, as the client chose it. The `ids`
/// layer sends such a request upstream under an id it mints (and gives the answer the client's
/// id back), so an upstream never sees a client's id in taskgate's form, and an answer under
/// one on a session's GET stream is never a client's (`ids` drops those there).
#[derive(Debug, Clone)]
pub struct ClientIdInOwnForm(pub Id);

/// Whether `id` has the form of taskgate's own request ids: a string starting `taskgate-`
/// (`layers::own_request`, the `upgrade`, `relay` and `gateway_tasks` ids, the `ids` layer's
/// minted `taskgate-id-<n>`).
pub fn in_own_form(id: &Id) -> bool {
    id.as_json().starts_with("\"taskgate-")
}

/// Who sent a request, as far as taskgate can tell: the authenticated principal and the
/// client's own `Mcp-Session-Id` (as it arrived, never a session a layer routed to). Tables that
/// hold per-request facts (upgraded calls, `notifications/cancelled` routing) key them by
/// `(upstream, Caller, id)`, so two clients using the same JSON-RPC id never share an entry.
///
/// A caller with neither a principal nor a session ([`Caller::is_identified`] is false) cannot
/// be told apart from another such caller: users of the key must not let one such call replace
/// or drop another's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    /// The authenticated principal ([`Principal::Anonymous`] without auth).
    pub principal: Principal,
    /// The client's own `Mcp-Session-Id`.
    pub client_session: Option<HeaderValue>,
}

impl Caller {
    /// This caller with a session id that holds only its own bytes, for a note kept after the
    /// request. The id as it arrived is a slice of hyper's read buffer of the client's
    /// connection (8 KiB or more): a note keyed by it kept that whole buffer alive (the
    /// `cancel` layer's creation notes, up to 10,000: `benches/run.sh` scenario 6, 100,000
    /// creations on one session, heaptrack: 78 MiB of read buffers at the peak). Copying here,
    /// for the few notes that outlive their request, costs nothing on other requests (copying
    /// every id at the edge cost ~2,000 instructions per lifecycle request).
    pub fn detached(self) -> Caller {
        Caller {
            principal: self.principal,
            client_session: self.client_session.as_ref().map(crate::headers::owned),
        }
    }

    /// Whether this caller may see a task recorded for `owner`, in either era: `owner` is
    /// [`Caller::owner`] or [`Caller::modern_owner`] (the principal with auth; without auth the
    /// 2025-11-25 session, or no binding at all). No allocation.
    pub fn may_see(&self, owner: &Owner) -> bool {
        match (owner, &self.principal) {
            (Owner::Principal(p), Principal::Token(t)) => **t == **p,
            (Owner::Session(s), Principal::Anonymous) => self
                .client_session
                .as_ref()
                .is_some_and(|v| v.as_bytes() == s.as_bytes()),
            (Owner::Anonymous, Principal::Anonymous) => true,
            _ => false,
        }
    }

    /// This caller as a watched stream keeps it for [`Caller::may_see`]: with a principal, the
    /// session is dropped (ownership does not read it); without, it is [`Caller::detached`] (a
    /// stream lives long, and must not keep the client's read buffer alive).
    pub fn kept_for_streams(self) -> Caller {
        match self.principal {
            Principal::Token(_) => Caller {
                principal: self.principal,
                client_session: None,
            },
            Principal::Anonymous => self.detached(),
        }
    }

    /// Whether anything tells this caller apart from other callers (a principal or a session).
    pub fn is_identified(&self) -> bool {
        self.client_session.is_some() || matches!(self.principal, Principal::Token(_))
    }

    /// The owner of the tasks this caller creates: its principal with auth; without auth the
    /// client's own session (as it arrived, never a session a layer routed to), else
    /// [`Owner::Anonymous`].
    pub fn owner(&self) -> Owner {
        match (&self.principal, &self.client_session) {
            (Principal::Token(p), _) => Owner::Principal(p.to_string()),
            (Principal::Anonymous, Some(s)) => match s.to_str() {
                Ok(s) => Owner::Session(s.to_string()),
                // Not visible ASCII: no session can be named by it.
                Err(_) => Owner::Anonymous,
            },
            (Principal::Anonymous, None) => Owner::Anonymous,
        }
    }

    /// The owner of a 2026-07-28 request's tasks: the bearer principal, else
    /// [`Owner::Anonymous`] (2026-07-28 has no sessions: an `Mcp-Session-Id` a client still
    /// sends is not an owner, and without auth the unguessable `taskId` is the only key).
    pub fn modern_owner(&self) -> Owner {
        match &self.principal {
            Principal::Token(p) => Owner::Principal(p.to_string()),
            Principal::Anonymous => Owner::Anonymous,
        }
    }

    /// The key of this caller's request `id` on `upstream`.
    pub fn call_key(&self, upstream: &Arc<str>, id: &Id) -> CallKey {
        CallKey {
            upstream: upstream.clone(),
            caller: self.clone(),
            id: id.clone(),
        }
    }
}

/// One client request, named by who sent it: see [`Caller`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallKey {
    /// The upstream's configured name.
    pub upstream: Arc<str>,
    /// Who sent the request.
    pub caller: Caller,
    /// The request's JSON-RPC id (its exact type kept).
    pub id: Id,
}

/// Everything about a request except its message.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// The upstream's configured name.
    pub upstream: Arc<str>,
    /// The client's `Mcp-Session-Id`, sent upstream as it is unless a layer routes the request to
    /// another upstream session (a task's recorded session).
    pub session_id: Option<HeaderValue>,
    /// The client's own `Mcp-Session-Id`, as it arrived (never rewritten by layers).
    pub client_session_id: Option<HeaderValue>,
    /// Who the caller is.
    pub principal: Principal,
    /// The client's IP address (the TCP peer, or behind a `gateway.trusted_proxies` proxy the
    /// client it forwarded for), when the request came from a client; what the
    /// fairness caps count against without a principal (see [`Tenant`]).
    pub client_addr: Option<std::net::IpAddr>,
    /// End-to-end headers to forward upstream (hop-by-hop, `Origin` and `Mcp-Session-Id`
    /// already removed). The client's `Host` and `Content-Length` stay: the upstream client
    /// always replaces both, and removes `Authorization` unless configured otherwise.
    pub headers: HeaderMap,
}

impl RequestContext {
    /// The client's `MCP-Protocol-Version` header (kept in [`RequestContext::headers`]).
    pub fn protocol_version(&self) -> Option<&HeaderValue> {
        self.headers.get(&crate::headers::MCP_PROTOCOL_VERSION)
    }

    /// Whom the fairness caps count this request against (see [`Tenant`]).
    pub fn tenant(&self) -> Tenant {
        Tenant::of(&self.principal, self.client_addr)
    }

    /// Who sent the request (see [`Caller`]).
    pub fn caller(&self) -> Caller {
        Caller {
            principal: self.principal.clone(),
            client_session: self.client_session_id.clone(),
        }
    }

    /// The key of this caller's request `id` on this request's upstream.
    pub fn call_key(&self, id: &Id) -> CallKey {
        self.caller().call_key(&self.upstream, id)
    }
}

/// A request travelling down the stack: its [`RequestParts`], boxed once where the request is
/// made (the edge, or a layer's own request) and read through it (`req.op`, `req.ctx`,
/// `req.extensions`). Each layer hands the request on by value into the `call` of the one
/// below, about fourteen deep: a pointer moves in a register where the parts (some 400 bytes)
/// took a `memcpy` per layer (issue 36).
#[derive(Debug, Clone)]
pub struct McpRequest(Box<RequestParts>);

/// What a request is: its operation, its context and the facts layers attach to it.
#[derive(Debug, Clone)]
pub struct RequestParts {
    /// What the client asked for.
    pub op: Operation,
    /// Who asked, and where it goes.
    pub ctx: RequestContext,
    /// Facts a layer learned for the layers below it (see `layers::extensions`).
    pub extensions: http::Extensions,
    /// The request's SERVER span when it is traced (issue 34): set by the edge, read by the
    /// layers that add to it (`mcp.task.id`, task links) and by the upstream's CLIENT span;
    /// copied to a request a layer makes for it (beside [`crate::telemetry::carry`], which copies
    /// the task link). A field, not an
    /// extension: the extension map's first insert allocates it (three allocations, freed with
    /// the request) and makes every layer's look-up a hashed one, ~1,900 instructions per
    /// traced small `tools/call` (callgrind, 2026-12-05); most requests have no other extension.
    pub trace: Option<RequestTrace>,
}

impl From<RequestParts> for McpRequest {
    fn from(parts: RequestParts) -> McpRequest {
        McpRequest(Box::new(parts))
    }
}

impl std::ops::Deref for McpRequest {
    type Target = RequestParts;
    fn deref(&self) -> &RequestParts {
        &self.0
    }
}

impl std::ops::DerefMut for McpRequest {
    fn deref_mut(&mut self) -> &mut RequestParts {
        &mut self.0
    }
}

impl McpRequest {
    /// The request's parts, out of their box (for the transport, which takes them apart).
    pub fn into_parts(self) -> RequestParts {
        *self.0
    }

    /// The protocol era the edge attached to this request (legacy when none was: `upgrade`'s own
    /// requests, unit tests).
    pub fn era(&self) -> Era {
        self.extensions.get::<Era>().copied().unwrap_or_default()
    }

    /// The POSTed message as the edge classified it (method, `taskId`, `task`, tool name,
    /// progress token, `requestId`: `mcp::classify`); `None` for a GET or DELETE.
    pub fn classified(&self) -> Option<Classified<'_>> {
        match &self.op {
            Operation::Post(m) => Some(Classified::of(m)),
            _ => None,
        }
    }

    /// The JSON-RPC method of a POSTed request or notification.
    pub fn method(&self) -> Option<&str> {
        match &self.op {
            Operation::Post(m) => m.method(),
            _ => None,
        }
    }

    /// The method of a POSTed *request* (with an id); `None` for notifications, so a
    /// notification that names a request method (`{"method":"tasks/get"}` without an id) is
    /// never handled as that request.
    pub fn request_method(&self) -> Option<&str> {
        match &self.op {
            Operation::Post(m) if m.kind() == jsonrpc::Kind::Request => m.method(),
            _ => None,
        }
    }

    /// The method of a POSTed notification (no id).
    pub fn notification_method(&self) -> Option<&str> {
        match &self.op {
            Operation::Post(m) if m.kind() == jsonrpc::Kind::Notification => m.method(),
            _ => None,
        }
    }

    /// The JSON-RPC id of a POSTed message.
    pub fn id(&self) -> Option<&Id> {
        match &self.op {
            Operation::Post(m) => m.id(),
            _ => None,
        }
    }

    /// How long the upstream transport waits on this request's exchange: the [`Deadline`] a
    /// layer set, else [`Deadline::Head`].
    pub fn deadline(&self) -> Deadline {
        self.extensions
            .get::<Deadline>()
            .copied()
            .unwrap_or_default()
    }

    /// The gateway task this request is the held call of ([`HeldTask`]), if it is one.
    pub fn held_task(&self) -> Option<Arc<str>> {
        self.extensions.get::<HeldTask>().map(|h| h.0.clone())
    }
}

/// The gateway task (`upstream.tasks = "gateway"`) a request is the held call of: a request
/// extension, set by `gateway_tasks` on the plain `tools/call` it holds. A transport that
/// loses the call with the process that ran it (a stdio child's death) names the task in
/// that death (`upstream::stdio::ChildGone::held`), so the task is released as a task of the
/// dead process (both audit facts), whichever of the call's end and the death is seen first.
#[derive(Debug, Clone)]
pub struct HeldTask(pub Arc<str>);

/// Which part of a request's exchange with the upstream the upstream's `timeout_ms` bounds: a
/// request extension, set by the layer that knows what the request is for; the transport reads
/// it ([`McpRequest::deadline`]) and matches no method names. Absent is [`Deadline::Head`], so
/// the common request stores nothing (the first insert into `Extensions` allocates its map).
///
/// The duration is always the upstream's own `timeout_ms` (`config/REFERENCE.md`); past it the
/// exchange ends with [`GatewayError::UpstreamTimeout`] (504), or, once an SSE answer is being
/// relayed, with a JSON-RPC error event for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Deadline {
    /// The answer's head, and a JSON (non-SSE) answer's whole body. An SSE answer or a GET
    /// stream runs unbounded once its head arrived. Every request but those below.
    #[default]
    Head,
    /// The whole exchange, an SSE answer included: past it the stream ends with a JSON-RPC
    /// error event for the request (`-32603`, "upstream did not answer `<method>` within N ms").
    /// Set by `cancel` on the `tasks/cancel` it forwards (a flight callers share must not be
    /// pinned by a stream that never answers) and by `observe` on the `tasks/cancel` it sends
    /// itself.
    Exchange,
    /// None at all: set by `tasks` on a 2025-11-25 `tasks/result`, which blocks until the task
    /// is terminal (TCP keepalive still ends it on a dead connection).
    Unbounded,
}

/// The body of a reply.
pub enum ReplyBody {
    /// `application/json`: one JSON-RPC message, as bytes (parse with [`Message::parse`] if needed).
    Json(Bytes),
    /// `text/event-stream`: SSE events as they arrive.
    Stream(EventStream),
    /// No body (202 Accepted, DELETE answers).
    Empty,
    /// Any other body, passed through unchanged (for example an upstream's 404 page).
    Raw(Bytes),
}

impl ReplyBody {
    /// Applies `rewrite` to every JSON-RPC message of the body: the JSON message, or the `data`
    /// of each SSE event as it passes (`rewrite` returns its input to leave a message as it is;
    /// nothing is copied then). Other bodies are returned unchanged.
    pub fn map_messages<F>(self, mut rewrite: F) -> ReplyBody
    where
        F: FnMut(&str) -> Option<String> + Send + 'static,
    {
        match self {
            ReplyBody::Json(bytes) => match std::str::from_utf8(&bytes).ok().and_then(&mut rewrite)
            {
                Some(new) => ReplyBody::Json(Bytes::from(new)),
                None => ReplyBody::Json(bytes),
            },
            ReplyBody::Stream(events) => {
                use futures_util::StreamExt;
                ReplyBody::Stream(Box::pin(events.map(move |mut ev| {
                    if let Some(new) = ev.data.as_deref().and_then(&mut rewrite) {
                        ev.data = Some(new.into());
                    }
                    ev
                })))
            }
            other => other,
        }
    }
}

impl std::fmt::Debug for ReplyBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplyBody::Json(b) => write!(f, "Json({} bytes)", b.len()),
            ReplyBody::Stream(_) => f.write_str("Stream"),
            ReplyBody::Empty => f.write_str("Empty"),
            ReplyBody::Raw(b) => write!(f, "Raw({} bytes)", b.len()),
        }
    }
}

/// Ends a span when the SSE reply's stream is done with ([`McpReply::end_span`]).
struct EndOnDrop(RequestTrace);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A reply travelling up the stack.
#[derive(Debug)]
pub struct McpReply {
    /// HTTP status to send to the client.
    pub status: StatusCode,
    /// End-to-end response headers (`Mcp-Session-Id`, `Content-Type`, ...): only what may reach
    /// the client; facts for the layers above travel in [`McpReply::extensions`].
    pub headers: HeaderMap,
    /// The body.
    pub body: ReplyBody,
    /// Facts a layer hands to the layers above it, as `http::Response` carries them (see
    /// `layers::extensions`, "Facts up"): never sent to the client. Empty on nearly every
    /// reply, and then free (no allocation).
    pub extensions: http::Extensions,
}

impl McpReply {
    /// A JSON-RPC message answered by taskgate itself (HTTP 200, `application/json`).
    pub fn local_json(bytes: Bytes) -> McpReply {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        McpReply {
            status: StatusCode::OK,
            headers,
            body: ReplyBody::Json(bytes),
            extensions: http::Extensions::new(),
        }
    }

    /// The answer to a request taskgate refuses or fails itself: `error`'s JSON-RPC error under
    /// `id` (`application/json`), with the HTTP status `error` has in `era`
    /// ([`McpError::http_status`]) and its `Retry-After` when it has one. Mark it with
    /// [`McpReply::answered_locally`] where the refusal is counted as a local answer.
    pub fn error(era: Era, id: Option<&Id>, error: &McpError) -> McpReply {
        let mut reply = McpReply::local_json(error.body(id));
        reply.status = error.http_status(era);
        if let Some(secs) = error.retry_after_secs() {
            reply
                .headers
                .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        reply
    }

    /// An SSE answer taskgate makes itself (HTTP 200, `text/event-stream`, `no-cache`): the
    /// events `rx` receives, ending when every sender is gone; with the client's
    /// `Mcp-Session-Id` when given.
    pub fn event_stream(
        rx: tokio::sync::mpsc::Receiver<crate::sse::Event>,
        session_id: Option<HeaderValue>,
    ) -> McpReply {
        let events: EventStream = Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        }));
        McpReply::events(events, session_id)
    }

    /// An SSE answer taskgate makes itself, as [`McpReply::event_stream`], of any stream of
    /// `events`.
    pub fn events(events: EventStream, session_id: Option<HeaderValue>) -> McpReply {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache"),
        );
        if let Some(sid) = session_id {
            headers.insert("mcp-session-id", sid);
        }
        McpReply {
            status: StatusCode::OK,
            headers,
            body: ReplyBody::Stream(events),
            extensions: http::Extensions::new(),
        }
    }

    /// 202 Accepted with no body: what a POSTed notification or response gets.
    pub fn accepted() -> McpReply {
        McpReply {
            status: StatusCode::ACCEPTED,
            headers: HeaderMap::new(),
            body: ReplyBody::Empty,
            extensions: http::Extensions::new(),
        }
    }

    /// A reply with `status`, `headers` and `body`, and no facts for the layers above.
    pub fn new(status: StatusCode, headers: HeaderMap, body: ReplyBody) -> McpReply {
        McpReply {
            status,
            headers,
            body,
            extensions: http::Extensions::new(),
        }
    }
}

impl McpReply {
    /// The JSON-RPC message answering request `id` in this reply: a JSON body that is that
    /// answer, or the first SSE event that is (the stream read up to it, within whatever
    /// deadline the exchange carries); `None` for anything else. For taskgate's own requests
    /// (a cancel of an unrecorded task, the poll after a 2026 cancel ack, the check of a task
    /// the upstream may have lost), which read their answers themselves.
    pub async fn answer_to(self, id: &Id) -> Option<Bytes> {
        match self.body {
            ReplyBody::Json(bytes) => jsonrpc::is_answer_to(&bytes, id).then_some(bytes),
            ReplyBody::Stream(mut events) => {
                use futures_util::StreamExt;
                while let Some(event) = events.next().await {
                    if let Some(data) = event.data.as_ref() {
                        if jsonrpc::is_answer_to(data.as_bytes(), id) {
                            return Some(data.as_bytes().clone());
                        }
                    }
                }
                None
            }
            ReplyBody::Empty | ReplyBody::Raw(_) => None,
        }
    }

    /// Notes this reply's outcome on `trace` (a request's SERVER span or an exchange's CLIENT
    /// span, issue 34) and ends it: `error.type` for a non-2xx status, a JSON-RPC error (its
    /// code) or a tool result with `isError: true` (`tool_error`). A JSON or empty reply ends it
    /// now; an SSE reply when its stream ends or is dropped, its answer to `id` read as it passes.
    /// `server`: the request's SERVER span when `trace` is an exchange's CLIENT span; a JSON
    /// answer is then read once for both ([`RequestTrace::answer_json`]).
    pub fn end_span(
        &mut self,
        trace: RequestTrace,
        server: Option<&RequestTrace>,
        id: Option<&Id>,
    ) {
        let status = (!self.status.is_success()).then(|| self.status.as_u16().to_string());
        match &self.body {
            ReplyBody::Json(bytes) => {
                // The JSON-RPC code says more than the HTTP status that carries it.
                trace.answer_json(bytes, status, server);
                trace.finish();
            }
            ReplyBody::Stream(_) => {
                let id = id.cloned();
                let ending = EndOnDrop(trace);
                let body = std::mem::replace(&mut self.body, ReplyBody::Empty);
                self.body = body.map_messages(move |message| {
                    if id
                        .as_ref()
                        .is_some_and(|id| jsonrpc::is_answer_to(message.as_bytes(), id))
                    {
                        ending.0.answer(message.as_bytes());
                    }
                    None
                });
            }
            ReplyBody::Empty | ReplyBody::Raw(_) => {
                if let Some(status) = status {
                    trace.set(KeyValue::new(semconv::ERROR_TYPE, status));
                }
                trace.finish()
            }
        }
    }

    /// Marks this reply as answered by taskgate itself for `reason`: a [`LocalReason`] reply
    /// extension, which the edge takes ([`McpReply::take_local_reason`]) to log the answer at
    /// debug and count it (`taskgate_local_answers_total`, `outcome="local"`).
    pub fn answered_locally(mut self, reason: LocalReason) -> McpReply {
        self.extensions.insert(reason);
        self
    }

    /// Removes the local-answer mark; the reason, if this reply was answered locally.
    pub fn take_local_reason(&mut self) -> Option<LocalReason> {
        self.extensions.remove::<LocalReason>()
    }
}

/// Why the stack could not produce a reply. Each variant maps to one HTTP status and JSON-RPC code,
/// here and nowhere else.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    /// The upstream could not be reached (connection refused, reset, DNS): HTTP 502.
    #[error("upstream `{upstream}` is unreachable: {detail}")]
    UpstreamUnreachable {
        /// Upstream name.
        upstream: Arc<str>,
        /// What failed.
        detail: String,
    },
    /// The upstream did not answer within its `timeout_ms`: HTTP 504.
    #[error("upstream `{upstream}` did not answer within {timeout_ms} ms")]
    UpstreamTimeout {
        /// Upstream name.
        upstream: Arc<str>,
        /// The configured timeout.
        timeout_ms: u64,
    },
    /// The upstream answered something that is not valid Streamable HTTP: HTTP 502.
    #[error("upstream `{upstream}` sent an invalid response: {detail}")]
    UpstreamProtocol {
        /// Upstream name.
        upstream: Arc<str>,
        /// What was wrong.
        detail: String,
    },
    /// The upstream refused taskgate's credentials, or a request without any (HTTP 401 or 403
    /// to a request whose `Authorization` is not the client's): HTTP 502, without the
    /// upstream's challenge, so the client does not take it for a refusal of its own token.
    #[error(
        "upstream `{upstream}` refused {} (HTTP {})",
        if *credentials { "taskgate's credentials" } else { "the request" },
        status.as_u16()
    )]
    UpstreamRefused {
        /// Upstream name.
        upstream: Arc<str>,
        /// The upstream's status (401 or 403).
        status: StatusCode,
        /// Whether taskgate sent credentials of its own (configured `headers`); without, the
        /// request had none at all.
        credentials: bool,
    },
    /// taskgate is shutting down and takes no new work: HTTP 503.
    #[error("taskgate is shutting down")]
    ShuttingDown,
}

impl From<&GatewayError> for McpError {
    /// [`McpError::Upstream`] with the failure's text: where a failed exchange is answered as
    /// a JSON-RPC `-32603` (HTTP 200) rather than as its HTTP status.
    fn from(e: &GatewayError) -> McpError {
        McpError::Upstream {
            detail: e.to_string(),
        }
    }
}

impl GatewayError {
    /// The HTTP status for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::UpstreamUnreachable { .. }
            | GatewayError::UpstreamProtocol { .. }
            | GatewayError::UpstreamRefused { .. } => StatusCode::BAD_GATEWAY,
            GatewayError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The JSON-RPC error code for this error (all are `-32603` Internal error).
    pub fn code(&self) -> i64 {
        jsonrpc::INTERNAL_ERROR
    }

    /// Notes this failure on `trace` (`error.type`: the JSON-RPC code of the answer taskgate
    /// gives for it) and ends the span (issue 34).
    pub fn end_span(&self, trace: RequestTrace) {
        trace.set(KeyValue::new(semconv::ERROR_TYPE, self.code().to_string()));
        trace.finish();
    }

    /// The `outcome` label of `taskgate_requests_total` for this error.
    pub fn outcome(&self) -> RequestOutcome {
        match self {
            GatewayError::UpstreamUnreachable { .. } => RequestOutcome::Unreachable,
            GatewayError::UpstreamTimeout { .. } => RequestOutcome::Timeout,
            GatewayError::UpstreamProtocol { .. } => RequestOutcome::UpstreamInvalid,
            GatewayError::UpstreamRefused { .. } => RequestOutcome::UpstreamStatus,
            GatewayError::ShuttingDown => RequestOutcome::Rejected,
        }
    }
}

/// The stack in front of one upstream: every layer and the upstream client, shared
/// (`tower::Service<McpRequest, Response = McpReply, Error = GatewayError>`, always ready).
///
/// The edge clones it per request: a reference count, where a boxed clonable service
/// (`tower::util::BoxCloneSyncService`) allocated a copy of every layer. A call goes through
/// the calling thread's own clone of the layers (made at its first call, dropped with the
/// stack), checks their readiness and boxes their future (the one allocation): a clone of
/// every layer per request, and its drop, cost ~250 instructions of a small call
/// (benches/profile.sh small, issue 36).
#[derive(Clone)]
pub struct McpStack(Arc<dyn CallStack>);

impl McpStack {
    /// Shares `stack` (the outermost layer over the rest).
    pub fn new<S>(stack: S) -> McpStack
    where
        S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        McpStack(Arc::new(PerThread {
            shared: stack,
            local: thread_local::ThreadLocal::new(),
        }))
    }

    /// Sends `req` through the stack, through a shared reference: what the edge does per
    /// request, without the `Arc` clone and `Oneshot` state of `tower::ServiceExt::oneshot`
    /// (the stack is always ready; [`tower::Service::call`] does the same).
    pub fn send(&self, req: McpRequest) -> StackFuture {
        self.0.call(req)
    }
}

/// The future of a call through an [`McpStack`]: the stack's own future, boxed once.
pub type StackFuture = futures_util::future::BoxFuture<'static, Result<McpReply, GatewayError>>;

/// A shared stack called through a reference: [`McpStack`]'s object.
trait CallStack: Send + Sync {
    fn call(&self, req: McpRequest) -> StackFuture;
}

/// A stack and one clone of it per thread that called it. A layer's `call` needs `&mut self`
/// (tower), and every layer keeps what outlives a call in its future or in shared state, so a
/// clone serves one call after another; each thread's is borrowed only while `call` runs.
struct PerThread<S: Send> {
    shared: S,
    local: thread_local::ThreadLocal<std::cell::RefCell<S>>,
}

impl<S> CallStack for PerThread<S>
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    fn call(&self, req: McpRequest) -> StackFuture {
        let own = self
            .local
            .get_or(|| std::cell::RefCell::new(self.shared.clone()));
        match own.try_borrow_mut() {
            Ok(mut stack) => call_ready(&mut *stack, req),
            // Called again from within one of its own layers' `call` on this thread (no layer
            // does today): a clone for that call.
            Err(_) => call_ready(&mut self.shared.clone(), req),
        }
    }
}

/// Calls `stack`, which every layer and the upstream client keep ready: at once.
fn call_ready<S>(stack: &mut S, req: McpRequest) -> StackFuture
where
    S: tower::Service<McpRequest, Response = McpReply, Error = GatewayError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    use std::task::{Context, Poll};
    use tower::ServiceExt;
    let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
    match stack.poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => Box::pin(stack.call(req)),
        Poll::Ready(Err(e)) => Box::pin(std::future::ready(Err(e))),
        // (Not so today) readiness is awaited with the caller's waker, on a clone.
        Poll::Pending => Box::pin(stack.clone().oneshot(req)),
    }
}

impl tower::Service<McpRequest> for McpStack {
    type Response = McpReply;
    type Error = GatewayError;
    type Future = StackFuture;

    /// Always ready: the stack's own readiness is checked per call, on the calling thread's
    /// clone.
    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), GatewayError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: McpRequest) -> StackFuture {
        self.0.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A service that counts its calls and holds `_alive` (its clones too).
    #[derive(Clone)]
    struct Counting {
        _alive: Arc<()>,
        calls: Arc<AtomicUsize>,
    }

    impl tower::Service<McpRequest> for Counting {
        type Response = McpReply;
        type Error = GatewayError;
        type Future = std::future::Ready<Result<McpReply, GatewayError>>;

        fn poll_ready(
            &mut self,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), GatewayError>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, _req: McpRequest) -> Self::Future {
            self.calls.fetch_add(1, Ordering::Relaxed);
            std::future::ready(Ok(McpReply::accepted()))
        }
    }

    /// Calls go through one clone of the stack per calling thread, made at its first call
    /// (issue 36), and the clones go with the stack: nothing it holds (a registry, a store)
    /// outlives it.
    #[tokio::test]
    async fn a_stack_is_cloned_once_per_thread_and_its_clones_go_with_it() {
        let alive = Arc::new(());
        let calls = Arc::new(AtomicUsize::new(0));
        let stack = McpStack::new(Counting {
            _alive: alive.clone(),
            calls: calls.clone(),
        });
        for _ in 0..3 {
            let reply = stack
                .send(crate::layers::testing::request(
                    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                ))
                .await
                .unwrap();
            assert_eq!(reply.status, StatusCode::ACCEPTED);
        }
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        // The test's own handle, the stack's and this thread's clone.
        assert_eq!(Arc::strong_count(&alive), 3);
        let other = stack.clone();
        std::thread::spawn(move || {
            let _ = other.send(crate::layers::testing::request(
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            ));
        })
        .join()
        .unwrap();
        assert_eq!(Arc::strong_count(&alive), 4);
        drop(stack);
        assert_eq!(Arc::strong_count(&alive), 1);
    }
}
