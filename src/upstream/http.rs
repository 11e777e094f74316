//! Streamable HTTP upstream client (2025-11-25 basic/transports: Streamable HTTP).
//!
//! One [`StreamableHttp`] per configured `[[upstream]]` with a `url`, with a keep-alive connection pool
//! ([`super::h1`]).
//! - `https://`: TLS on every connection ([`Tls`]: rustls, the certificate chain and host name
//!   verified against `ca_file` or the Mozilla roots; the handshake within `connect_timeout_ms`).
//!   A refused handshake is 502 `-32603` "upstream `x` is unreachable: connect: TLS with
//!   host:port: &lt;why&gt;", counted `taskgate_upstream_errors_total{kind="connect"}`.
//! - POST carries the message bytes unchanged; GET opens the standalone stream; DELETE ends a session.
//! - `Host` is the upstream's authority (SDK servers validate it against DNS rebinding);
//!   `Mcp-Session-Id` is the one in the request context (a layer may route to a task's session);
//!   configured headers are added; the client's `Authorization` is removed unless
//!   `forward_authorization = true` (MCP 2025-11-25 authorization: no token passthrough).
//! - `principal_header`: the client's own header of that name is always removed; an
//!   authenticated caller's principal is sent in it (non-ASCII, controls and `%` percent-encoded).
//! - `Accept-Encoding` is not forwarded: answers must be readable to the layers, so the upstream
//!   sends them uncompressed.
//! - Timeouts: `timeout_ms`, applied as the request's [`Deadline`] says (set by the layer that
//!   knows the request; this client matches no method names). [`Deadline::Head`] (the default):
//!   the time to the response headers and, for a JSON answer, to its whole body; GET streams and
//!   SSE answers have none once their headers arrived. [`Deadline::Exchange`] (`cancel`'s
//!   forwarded `tasks/cancel`: the layer shares one flight between callers, and a stream that
//!   never answers must not pin it): the whole exchange, and past it an SSE answer ends with a
//!   JSON-RPC error for the request (`-32603`, "upstream did not answer tasks/cancel within N
//!   ms"). [`Deadline::Unbounded`] (`tasks`' `tasks/result`, which blocks until the task is
//!   terminal): none.
//! - Size: `max_message_bytes` bounds a JSON (or other non-SSE) body as a whole, and each SSE line
//!   and event. A larger JSON body is an error reply (`-32603`, naming the limit); a larger SSE
//!   line or event ends the stream with a JSON-RPC error event for the request (id `null` on a GET
//!   stream), so the client never sees a clean end. Both count
//!   `taskgate_upstream_oversize_total{kind}` and `taskgate_upstream_errors_total{kind="protocol"}`.
//! - Status: a redirect (3xx) is not followed and not passed on (502 `-32603`, counted
//!   `kind="protocol"`). A 401 or 403 to a request that carried the client's own
//!   `Authorization` (`forward_authorization = true`, the client sent one, and no configured
//!   `Authorization` replaced it) is passed on as it came; any other 401 or 403 refused
//!   taskgate's credentials (its configured `headers`), or a request without any, not the
//!   client's, and becomes 502 `-32603` without the upstream's `WWW-Authenticate` (counted
//!   `kind="auth"`).
//! - The answer's body becomes [`ReplyBody::Json`], [`ReplyBody::Stream`] (decoded event by event
//!   as it arrives), [`ReplyBody::Empty`] or [`ReplyBody::Raw`].

use super::h1::{Pool, PoolError, Proxy, Tls};
use super::traced::Ending;
use super::{Exchange, Transport};
use crate::config::UpstreamConfig;
use crate::exchange::{Deadline, GatewayError, McpReply, McpRequest, Operation, ReplyBody};
use crate::headers::{content_type_is, is_visible_ascii, strip_upstream_reply, MCP_SESSION_ID};
use crate::jsonrpc::{self, Id};
use crate::metrics::{Metrics, OversizeKind, UpstreamErrorKind};
use crate::sse;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::Full;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// The Streamable HTTP transport to one MCP server (a [`Transport`]; the stack reaches it through
/// [`super::Upstream`]). Its connections are the [`Pool`]'s.
pub struct StreamableHttp {
    name: Arc<str>,
    /// The request target in origin-form (`/path?q`), as sent on a connection to the upstream.
    target: Uri,
    host: HeaderValue,
    pool: Arc<Pool>,
    timeout: Duration,
    timeout_ms: u64,
    headers: HeaderMap,
    forward_authorization: bool,
    /// Whether the configured `headers` set `Authorization` (replacing a forwarded client's).
    configured_authorization: bool,
    principal_header: Option<HeaderName>,
    max_message_bytes: usize,
    metrics: Arc<Metrics>,
}

impl StreamableHttp {
    /// Builds the transport for one `[[upstream]]` with a `url` (the config is already
    /// validated: its URL, header names and values).
    ///
    /// Errors: an `https://` upstream's TLS settings cannot be built ([`Tls::new`]: its
    /// `ca_file`, read again here, became unreadable after the config was checked).
    pub fn new(config: &UpstreamConfig, metrics: Arc<Metrics>) -> Result<StreamableHttp, String> {
        let uri: Uri = config.url.parse().expect("validated upstream url");
        let authority = uri.authority().expect("validated");
        let host = HeaderValue::from_str(authority.as_str())
            .expect("an authority is a valid header value");
        let connect_timeout = Duration::from_millis(config.connect_timeout_ms);
        let address = crate::config::upstream_authority(&uri);
        let tls = match uri.scheme_str() {
            Some("https") => Some(Tls::new(
                crate::config::upstream_host(&uri),
                config.trust(),
                config.client_auth(),
            )?),
            _ => None,
        };
        let proxy = match &config.proxy {
            Some(url) => Some(Proxy::new(
                &crate::config::ProxyUrl::parse(url)
                    .map_err(|e| format!("upstream {:?}: proxy {e}", config.name))?,
                &address,
            )),
            None => None,
        };
        let pool = Pool::for_upstream(address, connect_timeout, tls, proxy);
        let target = origin_form(&uri);
        let mut headers = HeaderMap::new();
        for (k, v) in &config.headers {
            headers.insert(
                HeaderName::from_bytes(k.as_bytes()).expect("validated header name"),
                HeaderValue::from_str(v).expect("validated header value"),
            );
        }
        Ok(StreamableHttp {
            name: config.name.as_str().into(),
            target,
            host,
            pool,
            timeout: Duration::from_millis(config.timeout_ms),
            timeout_ms: config.timeout_ms,
            configured_authorization: headers.contains_key(header::AUTHORIZATION),
            headers,
            forward_authorization: config.forward_authorization,
            principal_header: config
                .principal_header
                .as_ref()
                .and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok()),
            max_message_bytes: config.max_message_bytes,
            metrics,
        })
    }
}

/// What `/readyz` checks of a Streamable HTTP upstream ([`StreamableHttp::readiness`]).
#[derive(Clone)]
pub struct Readiness(Arc<Pool>);

impl Readiness {
    /// A new connection to the upstream, made as a request's would be (TCP, the TLS
    /// handshake of an `https://` one; through a proxy, TCP to the proxy), then closed.
    /// Errors: why it could not be made (`Pool::probe`).
    pub async fn check(&self) -> Result<(), String> {
        self.0.probe().await
    }
}

impl StreamableHttp {
    /// Its readiness check for `/readyz`.
    pub fn readiness(&self) -> Readiness {
        Readiness(self.pool.clone())
    }
}

impl Transport for StreamableHttp {
    fn name(&self) -> &Arc<str> {
        &self.name
    }

    fn exchange(self: Arc<Self>, req: McpRequest) -> Exchange {
        Box::pin(self.send(req, Ending::none()))
    }

    /// The span ended in `send` where the outcome is made: ended on the outcome `send`
    /// returned, it was moved three times more (~90 instructions per traced exchange,
    /// callgrind, issue 34).
    fn traced_exchange(self: Arc<Self>, req: McpRequest, span: super::ClientSpan) -> Exchange {
        Box::pin(self.send(req, Ending::of(span)))
    }
}

impl StreamableHttp {
    /// One exchange: the request as HTTP, its answer's head within the deadline, then its body
    /// as a stream of events (SSE) or read whole; `ending` ends its CLIENT span, if any, with
    /// the outcome.
    ///
    /// The boxed exchange itself, owning its share of the transport (not a future around a
    /// borrowing one: that future's poll cost each exchange ~100 instructions, callgrind,
    /// issue 34).
    async fn send(
        self: Arc<Self>,
        req: McpRequest,
        mut ending: Ending,
    ) -> Result<McpReply, GatewayError> {
        let deadline = req.deadline();
        // The request's id, kept for an SSE answer's error events; its method only where an
        // event names it (a copy per request cost an allocation: benches/profile.sh small).
        let (rpc_id, method) = match &req.op {
            Operation::Post(msg) => (
                msg.id().cloned(),
                (deadline == Deadline::Exchange)
                    .then(|| msg.method().map(Box::<str>::from))
                    .flatten(),
            ),
            _ => (None, None),
        };
        let (request, client_token) = self.http_request(req);
        // One timer for both the response head and, for a JSON answer, its body; pinned in
        // this future, not boxed (an allocation less per request).
        let mut timer = std::pin::pin!(match deadline {
            Deadline::Head | Deadline::Exchange => Some(tokio::time::sleep(self.timeout)),
            Deadline::Unbounded => None,
        });
        let sent = self.pool.send(request);
        let response = match timer.as_mut().as_pin_mut() {
            Some(timer) => tokio::select! {
                biased;
                r = sent => r,
                () = timer => return Err(ending.fail(self.timeout_error())),
            },
            None => sent.await,
        }
        .map_err(|e| ending.fail(self.unreachable(e)))?;

        let (parts, incoming) = response.into_parts();
        // The one check a 200 answer pays; the body of a refused answer is dropped unread.
        if parts.status != http::StatusCode::OK {
            self.check_status(parts.status, client_token)
                .map_err(|e| ending.fail(e))?;
        }
        let mut headers = parts.headers;
        let is_sse = self.check_head(&mut headers).map_err(|e| ending.fail(e))?;
        if is_sse {
            let events = sse::decode(incoming, self.name.clone(), self.max_message_bytes);
            let give_up = match timer.as_pin_mut() {
                Some(timer) if deadline == Deadline::Exchange => Some(timer.deadline()),
                _ => None,
            };
            let events = self.bounded_events(events, rpc_id, method, give_up);
            let mut reply = McpReply::new(parts.status, headers, ReplyBody::Stream(events));
            ending.reply(&mut reply);
            return Ok(reply);
        }
        // Read whole within `max_message_bytes` and the same timer. Awaited here rather than in
        // a helper `async fn`: its future moved into this one cost memcpy per request.
        let collect = Whole::new(incoming, self.max_message_bytes);
        let collected = match timer.as_mut().as_pin_mut() {
            Some(timer) => tokio::select! {
                biased;
                r = collect => r,
                () = timer => return Err(ending.fail(self.timeout_error())),
            },
            None => collect.await,
        };
        let bytes = collected.map_err(|e| ending.fail(self.body_error(e)))?;
        let body = self
            .whole_body(&headers, bytes)
            .map_err(|e| ending.fail(e))?;
        let mut reply = McpReply::new(parts.status, headers, body);
        ending.reply(&mut reply);
        Ok(reply)
    }

    /// `req` as the HTTP request to the upstream: POST with the message's bytes unchanged, GET
    /// or DELETE without a body, on the upstream's path, with the headers of
    /// [`StreamableHttp::upstream_headers`] and its own `Content-Length`; and whether it carries
    /// the client's own `Authorization`.
    fn http_request(&self, mut req: McpRequest) -> (Request<Full<Bytes>>, bool) {
        // What is taken is taken out of the request's box, not the box's parts moved out whole.
        let (method, body) = match std::mem::replace(&mut req.op, Operation::OpenStream) {
            // Moved, not cloned: a message a layer or the trace rewrote is a `Vec`'s bytes, whose
            // first clone allocates their shared count (~450 instructions per traced upstream
            // request, whose `_meta.traceparent` is spliced in; callgrind, issue 34).
            Operation::Post(msg) => (Method::POST, msg.into_bytes()),
            Operation::OpenStream => (Method::GET, Bytes::new()),
            Operation::EndSession => (Method::DELETE, Bytes::new()),
        };
        let length = body.len();
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = self.target.clone();
        let headers = request.headers_mut();
        let ctx = &mut req.ctx;
        *headers = std::mem::take(&mut ctx.headers);
        let client_token = self.upstream_headers(headers, &ctx.principal, ctx.session_id.take());
        // Replaces the client's `Content-Length` (the edge leaves it in place).
        if length == 0 {
            headers.remove(header::CONTENT_LENGTH);
        } else {
            headers.insert(
                header::CONTENT_LENGTH,
                crate::headers::content_length(length as u64),
            );
        }
        (request, client_token)
    }

    /// The client's head fields as the upstream gets them: `Authorization` (unless
    /// `forward_authorization`), `Accept-Encoding` and the client's own `principal_header`
    /// removed; the principal, the upstream's `Host`, the routed `Mcp-Session-Id` and the
    /// configured headers set. Returns whether the `Authorization` that goes up is the
    /// client's own: it sent one, `forward_authorization` keeps it, and no configured
    /// `Authorization` replaces it (review 18b #6).
    fn upstream_headers(
        &self,
        headers: &mut HeaderMap,
        principal: &crate::exchange::Principal,
        session_id: Option<HeaderValue>,
    ) -> bool {
        // The names to drop, found in one pass over the few present (a hashed `remove` per
        // name, present or not, cost more; benches/profile.sh small).
        let (mut authorization, mut encoding, mut own_principal) = (false, false, false);
        for name in headers.keys() {
            authorization |= name == header::AUTHORIZATION;
            encoding |= name == header::ACCEPT_ENCODING;
            own_principal |= self.principal_header.as_ref() == Some(name);
        }
        if authorization && !self.forward_authorization {
            headers.remove(header::AUTHORIZATION);
        }
        // taskgate reads the messages it relays (task records, status): ask for plain bodies.
        if encoding {
            headers.remove(header::ACCEPT_ENCODING);
        }
        if let Some(name) = &self.principal_header {
            if own_principal {
                headers.remove(name);
            }
            if let crate::exchange::Principal::Token(p) = principal {
                if let Some(v) = principal_value(p) {
                    headers.insert(name.clone(), v);
                }
            }
        }
        // Replaces the client's `Host` (the edge leaves it in place).
        headers.insert(header::HOST, self.host.clone());
        // The edge took the client's `Mcp-Session-Id` out of the headers (into the context).
        if let Some(sid) = session_id {
            headers.insert(MCP_SESSION_ID.clone(), sid);
        }
        for (k, v) in &self.headers {
            headers.insert(k.clone(), v.clone());
        }
        authorization && self.forward_authorization && !self.configured_authorization
    }

    /// The answer's head fields as they go up (taskgate's own `x-taskgate-*` and
    /// `Content-Length` removed), checked; returns whether the answer is an SSE stream.
    ///
    /// Errors ([`GatewayError::UpstreamProtocol`], counted): an `Mcp-Session-Id` that is not
    /// visible ASCII, an event stream declaring a charset other than UTF-8.
    fn check_head(&self, headers: &mut HeaderMap) -> Result<bool, GatewayError> {
        strip_upstream_reply(headers);
        headers.remove(header::CONTENT_LENGTH);
        if let Some(sid) = headers.get(&MCP_SESSION_ID) {
            if !is_visible_ascii(sid) {
                return Err(self.protocol_error(format!(
                    "its Mcp-Session-Id {:?} is not visible ASCII (0x21 to 0x7E)",
                    String::from_utf8_lossy(sid.as_bytes())
                )));
            }
        }
        let content_type = headers.get(header::CONTENT_TYPE);
        if content_type.is_some_and(|c| c.as_bytes() == b"application/json") {
            // The common answer, decided without `content_type_is`'s parse for the stream's
            // type (~160 instructions per call; benches/profile.sh small, issue 36).
            return Ok(false);
        }
        content_type_is(content_type, "text/event-stream").map_err(|c| {
            self.protocol_error(format!(
                "its event stream declares charset={c}; MCP messages are UTF-8"
            ))
        })
    }

    /// An answer's status that is not passed on (break-edge F8). Errors: a redirect
    /// ([`GatewayError::UpstreamProtocol`]: taskgate does not follow it, and its `Location` is
    /// the upstream's to choose), and, unless `client_token` (the request carried the client's
    /// own `Authorization`, forwarded as it came: [`StreamableHttp::upstream_headers`]), a 401
    /// or 403 ([`GatewayError::UpstreamRefused`], counted `kind="auth"`: what was refused is
    /// taskgate's credentials or none, not the client's, and the upstream's `WWW-Authenticate`
    /// would send an OAuth client to discover the upstream's authorization server).
    fn check_status(
        &self,
        status: http::StatusCode,
        client_token: bool,
    ) -> Result<(), GatewayError> {
        if status.is_redirection() {
            return Err(self.protocol_error(format!(
                "it answered HTTP {status}, a redirect, which taskgate does not follow"
            )));
        }
        if matches!(
            status,
            http::StatusCode::UNAUTHORIZED | http::StatusCode::FORBIDDEN
        ) && !client_token
        {
            self.metrics
                .upstream_error(&self.name, UpstreamErrorKind::Auth);
            // Any configured header may be the credential (`Authorization`, an API key's).
            let credentials = !self.headers.is_empty();
            tracing::warn!(upstream = %self.name, status = status.as_u16(), credentials, "the upstream refused taskgate's request (its credentials, or none)");
            return Err(GatewayError::UpstreamRefused {
                upstream: self.name.clone(),
                status,
                credentials,
            });
        }
        Ok(())
    }

    /// Why a non-SSE answer's body could not be read whole (counted): over
    /// `max_message_bytes`, or cut short ([`GatewayError::UpstreamProtocol`]).
    fn body_error(&self, e: WholeError) -> GatewayError {
        self.metrics
            .upstream_error(&self.name, UpstreamErrorKind::Protocol);
        let WholeError::Body(e) = e else {
            self.metrics
                .upstream_oversize(&self.name, OversizeKind::Json);
            tracing::warn!(upstream = %self.name, limit = self.max_message_bytes, "upstream answer exceeded max_message_bytes");
            return GatewayError::UpstreamProtocol {
                upstream: self.name.clone(),
                detail: format!(
                    "the upstream answer exceeded max_message_bytes={}",
                    self.max_message_bytes
                ),
            };
        };
        GatewayError::UpstreamProtocol {
            upstream: self.name.clone(),
            detail: format!("body ended early: {e}"),
        }
    }

    /// A whole body as the reply's: [`ReplyBody::Empty`] when empty, [`ReplyBody::Json`] when
    /// `application/json`, else [`ReplyBody::Raw`]. Errors: a JSON answer declaring a charset
    /// other than UTF-8 ([`GatewayError::UpstreamProtocol`], counted).
    fn whole_body(&self, headers: &HeaderMap, bytes: Bytes) -> Result<ReplyBody, GatewayError> {
        let is_json = content_type_is(headers.get(header::CONTENT_TYPE), "application/json")
            .map_err(|c| {
                self.protocol_error(format!(
                    "its JSON answer declares charset={c}; MCP messages are UTF-8"
                ))
            })?;
        Ok(if bytes.is_empty() {
            ReplyBody::Empty
        } else if is_json {
            ReplyBody::Json(bytes)
        } else {
            ReplyBody::Raw(bytes)
        })
    }

    /// The upstream's decoded SSE answer as relayed: an [`sse::Oversize`] becomes a JSON-RPC error
    /// event for the request (counted), and past `give_up` ([`Deadline::Exchange`] only) a
    /// JSON-RPC error event naming `method`; the stream ends after either (the upstream body is
    /// dropped).
    fn bounded_events(
        &self,
        events: sse::DecodedStream,
        rpc_id: Option<Id>,
        method: Option<Box<str>>,
        give_up: Option<tokio::time::Instant>,
    ) -> sse::EventStream {
        Box::pin(Bounded {
            events: Some(events),
            rpc_id,
            method: give_up.and(method),
            deadline: give_up.map(|at| Box::pin(tokio::time::sleep_until(at))),
            name: self.name.clone(),
            timeout_ms: self.timeout_ms,
            metrics: self.metrics.clone(),
        })
    }

    /// An invalid answer (counted): 502 naming the upstream and what was wrong.
    fn protocol_error(&self, detail: String) -> GatewayError {
        self.metrics
            .upstream_error(&self.name, UpstreamErrorKind::Protocol);
        tracing::warn!(upstream = %self.name, %detail, "invalid upstream answer");
        GatewayError::UpstreamProtocol {
            upstream: self.name.clone(),
            detail,
        }
    }

    fn timeout_error(&self) -> GatewayError {
        self.metrics
            .upstream_error(&self.name, UpstreamErrorKind::Timeout);
        GatewayError::UpstreamTimeout {
            upstream: self.name.clone(),
            timeout_ms: self.timeout_ms,
        }
    }

    fn unreachable(&self, e: PoolError) -> GatewayError {
        self.metrics
            .upstream_error(&self.name, UpstreamErrorKind::Connect);
        GatewayError::UpstreamUnreachable {
            upstream: self.name.clone(),
            detail: e.to_string(),
        }
    }
}

/// A JSON (or other non-SSE) answer's body read to its end, which gives its connection back to
/// the pool, within `limit` bytes (past it [`WholeError::Oversize`], at once). A body of one
/// frame (a small answer, read with its head) is kept as it came, without a copy;
/// `http_body_util`'s `Limited` and `collect` queued each frame in a list of their own (an
/// allocation per answer). Trailers are dropped, as `collect`'s bytes dropped them.
struct Whole {
    body: super::h1::PooledBody,
    limit: usize,
    seen: usize,
    /// The first data frame, while it is the only one.
    first: Option<Bytes>,
    /// Every data frame, once there is more than one.
    more: bytes::BytesMut,
}

/// Why [`Whole`] gave up.
enum WholeError {
    /// The body grew past the limit.
    Oversize,
    /// Reading the body failed (hyper's error, or the chunked reader's).
    Body(super::h1::pool::BodyError),
}

impl Whole {
    fn new(body: super::h1::PooledBody, limit: usize) -> Whole {
        Whole {
            body,
            limit,
            seen: 0,
            first: None,
            more: bytes::BytesMut::new(),
        }
    }
}

impl Future for Whole {
    type Output = Result<Bytes, WholeError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        use http_body::Body as _;
        let this = self.get_mut();
        loop {
            let frame = match std::task::ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Poll::Ready(Err(WholeError::Body(e))),
                None => {
                    let bytes = match this.first.take() {
                        Some(first) => first,
                        None => std::mem::take(&mut this.more).freeze(),
                    };
                    return Poll::Ready(Ok(bytes));
                }
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            this.seen += data.len();
            if this.seen > this.limit {
                return Poll::Ready(Err(WholeError::Oversize));
            }
            if data.is_empty() {
                continue;
            }
            match this.first.take() {
                None if this.more.is_empty() => this.first = Some(data),
                None => this.more.extend_from_slice(&data),
                Some(first) => {
                    this.more.reserve(first.len() + data.len());
                    this.more.extend_from_slice(&first);
                    this.more.extend_from_slice(&data);
                }
            }
        }
    }
}

/// The origin-form request target (`/path?q`, RFC 9112 §3.2.1) of `url`
/// (`http://host:port/path?q`); `/` when it has no path.
fn origin_form(url: &Uri) -> Uri {
    url.path_and_query()
        .cloned()
        .map_or_else(|| Uri::from_static("/"), Uri::from)
}

/// A principal as a header value: controls, `%` and non-ASCII bytes percent-encoded.
fn principal_value(principal: &str) -> Option<HeaderValue> {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');
    let encoded = percent_encoding::utf8_percent_encode(principal, SET).to_string();
    HeaderValue::from_str(&encoded).ok()
}

/// The stream [`StreamableHttp::bounded_events`] returns (a plain `Stream`: one poll of the decoder per
/// event, no future built per event).
struct Bounded {
    /// `None` once the stream ended (after an error event or the abort marker).
    events: Option<sse::DecodedStream>,
    rpc_id: Option<Id>,
    /// The request's method, named in the error event past `deadline`.
    method: Option<Box<str>>,
    /// [`Deadline::Exchange`] only: when the upstream's answer is given up.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    name: Arc<str>,
    timeout_ms: u64,
    metrics: Arc<Metrics>,
}

impl Bounded {
    fn error_event(&mut self, message: &str, why: sse::TransportFailure) -> sse::Event {
        self.events = None;
        let body = jsonrpc::error_response(self.rpc_id.as_ref(), jsonrpc::INTERNAL_ERROR, message);
        sse::Event::transport_error(String::from_utf8_lossy(&body).into_owned(), why)
    }
}

impl futures_util::Stream for Bounded {
    type Item = sse::Event;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<sse::Event>> {
        let st = self.get_mut();
        let Some(events) = st.events.as_mut() else {
            return Poll::Ready(None);
        };
        // As `timeout_at`: an event that is ready wins over the deadline.
        let next = match events.as_mut().poll_next(cx) {
            Poll::Ready(next) => next,
            Poll::Pending => {
                let Some(deadline) = st.deadline.as_mut() else {
                    return Poll::Pending;
                };
                if deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                st.metrics
                    .upstream_error(&st.name, UpstreamErrorKind::Timeout);
                let message = format!(
                    "upstream did not answer {} within {} ms",
                    st.method.as_deref().unwrap_or("the request"),
                    st.timeout_ms
                );
                return Poll::Ready(Some(
                    st.error_event(&message, sse::TransportFailure::Timeout),
                ));
            }
        };
        match next {
            Some(Ok(ev)) => Poll::Ready(Some(ev)),
            Some(Err(sse::Cut::Reset(detail))) => {
                st.events = None;
                st.metrics
                    .upstream_error(&st.name, UpstreamErrorKind::StreamReset);
                tracing::warn!(upstream = %st.name, id = st.rpc_id.as_ref().map(|i| tracing::field::display(i.as_json())), error = %detail, "upstream SSE answer was cut before its end; aborting the client's stream");
                Poll::Ready(Some(sse::Event::abort()))
            }
            Some(Err(sse::Cut::Oversize(oversize))) => {
                st.metrics
                    .upstream_oversize(&st.name, OversizeKind::SseEvent);
                st.metrics
                    .upstream_error(&st.name, UpstreamErrorKind::Protocol);
                let message = format!(
                    "upstream `{}` sent an invalid response: the upstream answer exceeded max_message_bytes={}",
                    st.name, oversize.limit
                );
                Poll::Ready(Some(
                    st.error_event(&message, sse::TransportFailure::Invalid),
                ))
            }
            None => {
                st.events = None;
                Poll::Ready(None)
            }
        }
    }
}
