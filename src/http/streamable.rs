//! The MCP endpoint: Streamable HTTP decoding on the client side (2025-11-25 basic/transports).
//!
//! Routes `POST|GET|DELETE /mcp` (first upstream) and `/mcp/<name>`, checks what the transport
//! requires before anything reaches the stack, and turns the stack's [`McpReply`] back into HTTP.
//!
//! | input | answer |
//! |---|---|
//! | no `Host`, or more than one (RFC 9112 section 3.2) | 400, JSON-RPC error `-32600` |
//! | `Expect: 100-continue` with a `Content-Length` over the limit | 413 at once, no `100 Continue` |
//! | unknown path / upstream name | 404, JSON naming the configured upstreams |
//! | `Host` not allowed (DNS rebinding) | 403, JSON-RPC error `-32600`, id `null` |
//! | `Origin` present and not allowed | 403, JSON-RPC error `-32600`, id `null` |
//! | `GET /.well-known/oauth-protected-resource[/mcp[/<name>]]` (`mode = "oauth"`) | 200, RFC 9728 metadata |
//! | `[auth] mode = "bearer"`/`"oauth"` and no valid token | 401 with `WWW-Authenticate: Bearer` (`resource_metadata`, `error`) |
//! | `mode = "oauth"`, a valid token without a required scope | 403, `error="insufficient_scope"` |
//! | a client address past `limits.auth_failures_per_minute` (failed authentications) | 429 with `Retry-After`, `-32029`, no token check |
//! | over a per-principal `[limits]` limit (a GET: past `limits.max_get_streams` open streams) | 429 with `Retry-After`, `-32029` |
//! | `Mcp-Session-Id` empty, not visible ASCII (0x21 to 0x7E), a comma-separated list, or on two header lines | 400, `-32600` saying which |
//! | `MCP-Protocol-Version` not one taskgate serves ([`crate::mcp::era::SUPPORTED_VERSIONS`]), or on two header lines | 400; `-32022` with `data: {supported, requested}` for a 2026-era date (`2099-01-01`), else `-32600` |
//! | `MCP-Protocol-Version` present and not the body's `_meta["io.modelcontextprotocol/protocolVersion"]` (2026-07-28 §2.2) | 400, `-32020` naming both |
//! | method other than POST, GET, DELETE | 405 with `Allow` |
//! | GET or DELETE with a 2026-era `MCP-Protocol-Version` (2026-07-28 §2.2: no GET stream, no sessions) | 405 with `Allow: POST`, `-32600`, before any `[limits]` GET slot or the upstream |
//! | POST `Content-Type` not `application/json` | 415 |
//! | POST `Accept` not listing both `application/json` and `text/event-stream` (a type listed with `q=0` is not acceptable, RFC 9110 §12.5.1: not listed) | 406 |
//! | GET `Accept` not listing `text/event-stream` (nor with `q=0`) | 406 |
//! | body over `gateway.max_body_bytes` | 413, `-32600` |
//! | invalid JSON | 400, `-32700` |
//! | a JSON array (batch) or not a JSON-RPC message | 400, `-32600` |
//! | upstream unreachable / invalid answer / timeout | 502 / 502 / 504, `-32603` naming the upstream |
//!
//! None of these touch the upstream or the client's session: one bad request never ends a session.
//!
//! A `DELETE` answered 2xx (by the upstream, or by taskgate when it defers it) ends the
//! session's open GET streams on that route (`session_streams`), whether or not the upstream
//! ends its side.
//!
//! SSE answers and GET streams reach a client that negotiated a revision before 2025-11-25
//! (its `MCP-Protocol-Version` names one, or its `initialize` asks for one) without the
//! upstream's priming events (events without data, new in 2025-11-25), which older clients
//! would take for a message. A request without the header gets them as the upstream sent
//! them (taskgate does not guess its session's revision).

use super::gate::Gate;
use super::response::{gateway_error_response, json_response, rpc_error_response};
use super::response::{read_body, BodyError, Head, HeadFields, DISCARD_LIMIT};
use super::server::{Body, BodyError as ResponseError, Handler};
use crate::auth::Authenticator;
use crate::exchange::Principal;
use crate::exchange::{in_own_form, ClientIdInOwnForm};
use crate::exchange::{
    McpReply, McpRequest, McpStack, Operation, ReplyBody, RequestContext, RequestParts,
};
use crate::headers::{content_type_is, remove_hop_by_hop, MCP_SESSION_ID};
use crate::jsonrpc::{self, EnvelopeError, Message};
use crate::limits::{Limiter, Permit};
use crate::mcp::era::Era;
use crate::metrics::{McpMethod, Metrics, RejectReason, RequestOutcome, RequestSeries, SseKind};
use crate::sse::KeepAlive;
use futures_util::StreamExt;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// One route: an upstream's name and the stack in front of it.
#[derive(Clone)]
pub struct Route {
    /// The upstream's name.
    pub name: Arc<str>,
    /// The layers and the upstream client.
    pub stack: McpStack,
}

/// Settings of the MCP endpoint, from `[gateway]`.
pub struct EdgeSettings {
    /// Accepted `Host` values (lowercase), or `None` for any.
    pub allowed_hosts: Option<Vec<String>>,
    /// Accepted `Origin` values (lowercase), or `None` for any.
    pub allowed_origins: Option<Vec<String>>,
    /// Largest body, in bytes.
    pub max_body_bytes: usize,
    /// Time to receive the whole body.
    pub body_timeout: Duration,
    /// Idle time before an SSE keep-alive comment.
    pub sse_keepalive: Duration,
    /// Per-principal limits (`[limits]`).
    pub limits: Arc<Limiter>,
    /// `gateway.trusted_proxies`: whose forwarding headers give the client's address.
    pub trusted_proxies: super::client_addr::TrustedProxies,
}

/// A route as the edge keeps it: with its request series resolved.
struct Served {
    route: Route,
    series: RequestSeries,
}

/// The MCP endpoint handler.
pub struct Edge {
    routes: HashMap<Arc<str>, Served>,
    first: Served,
    names: Vec<Arc<str>>,
    settings: EdgeSettings,
    auth: Authenticator,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
    /// The open GET streams by session, ended by the session's `DELETE`.
    streams: Arc<super::session_streams::SessionStreams>,
    /// Traces (`[telemetry]`): a SERVER span per request when set (`super::trace`).
    telemetry: Option<crate::telemetry::Telemetry>,
}

impl Edge {
    /// Builds the endpoint; `routes` in config order (the first is the default route).
    pub fn new(
        routes: Vec<Route>,
        settings: EdgeSettings,
        auth: Authenticator,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> Edge {
        let served = |route: Route| Served {
            series: metrics.request_series(&route.name),
            route,
        };
        let first = served(routes.first().expect("at least one upstream").clone());
        let names = routes.iter().map(|r| r.name.clone()).collect();
        Edge {
            routes: routes
                .into_iter()
                .map(|r| (r.name.clone(), served(r)))
                .collect(),
            first,
            names,
            settings,
            auth,
            metrics,
            shutdown,
            streams: Arc::default(),
            telemetry: None,
        }
    }

    /// The endpoint with a SERVER span per MCP request exported through `telemetry` (issue 34);
    /// `None` (the default): no span, nothing done per request.
    pub fn with_telemetry(mut self, telemetry: Option<crate::telemetry::Telemetry>) -> Edge {
        self.telemetry = telemetry;
        self
    }

    fn route(&self, path: &str) -> Result<&Served, Response<Body>> {
        let rest = path.strip_prefix("/mcp");
        match rest {
            Some("") | Some("/") => Ok(&self.first),
            Some(r) if r.starts_with('/') => {
                let name = r[1..].trim_end_matches('/');
                self.routes.get(name).ok_or_else(|| {
                    let body = serde_json::json!({
                        "error": format!("no upstream named {name:?}"),
                        "upstreams": self.names.iter().map(|n| n.as_ref()).collect::<Vec<_>>(),
                    });
                    json_response(StatusCode::NOT_FOUND, body.to_string().into())
                })
            }
            _ => {
                let body = serde_json::json!({
                    "error": format!("no MCP endpoint at {path:?}; use /mcp or /mcp/<upstream>"),
                    "upstreams": self.names.iter().map(|n| n.as_ref()).collect::<Vec<_>>(),
                });
                Err(json_response(
                    StatusCode::NOT_FOUND,
                    body.to_string().into(),
                ))
            }
        }
    }

    fn reject(&self, reason: RejectReason, response: Response<Body>) -> Response<Body> {
        self.metrics.http_rejection(reason);
        response
    }

    fn serve(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: IpAddr,
    ) -> impl Future<Output = Response<Body>> + Send + 'static {
        // Taken apart here, not in the async block, and the block is no `async fn`: an
        // `async fn`'s argument (or a value its body takes apart) stays in its future beside
        // the copy made of it (rust-lang/rust#62958), and hyper moves this future into its
        // connection's per request.
        let (parts, body) = req.into_parts();
        // The client's address from here on: the TCP peer, or behind a trusted proxy the
        // client it forwarded for (`gateway.trusted_proxies`).
        let peer = self
            .settings
            .trusted_proxies
            .client_address(peer, &parts.headers);
        async move {
            let fields = HeadFields::of(&parts.headers);
            let (principal, mut permit) = match self.gate(&parts, &fields, peer).await {
                Ok(admitted) => admitted,
                Err(resp) => return resp,
            };
            let resp = match self.decode(&parts, &fields, body).await {
                Ok((served, op)) => {
                    if matches!(op, Operation::OpenStream) {
                        // Counted before it goes upstream: a principal at its cap never takes
                        // another pooled upstream connection.
                        let tenant = crate::exchange::Tenant::of(&principal, Some(peer));
                        match self.settings.limits.open_stream(&tenant) {
                            Ok(slot) => permit = Some(slot),
                            Err(over) => return super::gate::too_many(&self.metrics, over),
                        }
                    }
                    let head = Head {
                        era: fields.protocol_version.map(crate::mcp::era::Era::of_header),
                        session_id: fields.session_id,
                        origin: fields.origin.is_some(),
                        hop_by_hop: fields.hop_by_hop,
                        primes: super::response::version_primes(fields.protocol_version),
                        routing: fields.routing,
                    };
                    let caller = Admitted {
                        principal,
                        peer,
                        permit,
                    };
                    return self.forward(served, parts.headers, head, op, caller).await;
                }
                Err(resp) => resp,
            };
            holding(resp, permit)
        }
    }

    /// DNS-rebinding protection first, then authentication, then `[limits]`: nothing (not even
    /// the upstream names of a 404) for a bad Host or a caller without credentials.
    async fn gate(
        &self,
        parts: &http::request::Parts,
        fields: &HeadFields<'_>,
        peer: IpAddr,
    ) -> Result<(Principal, Option<Permit>), Response<Body>> {
        self.check_host_and_origin(&parts.uri, parts.version, fields)?;
        let gate = Gate {
            auth: &self.auth,
            limits: &self.settings.limits,
            peer,
            metrics: &self.metrics,
            is_route: &|p: &str| self.route(p).is_ok(),
        };
        gate.admit(parts).await
    }

    /// The route and the operation of an admitted request (its body read and parsed), or the
    /// answer refusing it.
    async fn decode(
        &self,
        parts: &http::request::Parts,
        fields: &HeadFields<'_>,
        body: Incoming,
    ) -> Result<(&Served, Operation), Response<Body>> {
        let served = match self.route(parts.uri.path()) {
            Ok(served) => served,
            Err(resp) => return Err(self.reject(RejectReason::Route, resp)),
        };
        if parts.method != Method::POST && modern_version(fields) {
            // 2026-07-28 §2.2: "405: GET or DELETE". Answered here, before a GET takes one of
            // the caller's `limits.max_get_streams` slots (break-edge F12: past them, a 2026
            // GET got 429) and before the upstream is asked.
            let mut resp = transport_refusal(
                StatusCode::METHOD_NOT_ALLOWED,
                "Method Not Allowed: MCP 2026-07-28 has no GET stream and no sessions to DELETE; POST each request (subscriptions/listen for notifications)",
            );
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            return Err(self.reject(RejectReason::Method, resp));
        }
        let op = match parts.method {
            Method::POST => Operation::Post(self.decode_post(fields, body).await?),
            Method::GET => {
                if !fields.accept_lists(&["text/event-stream"]) {
                    return Err(self.reject(
                        RejectReason::Accept,
                        transport_refusal(
                            StatusCode::NOT_ACCEPTABLE,
                            "Not Acceptable: a GET must accept text/event-stream",
                        ),
                    ));
                }
                Operation::OpenStream
            }
            Method::DELETE => Operation::EndSession,
            _ => {
                let mut resp = transport_refusal(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "Method Not Allowed: the MCP endpoint takes POST, GET and DELETE",
                );
                resp.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
                return Err(self.reject(RejectReason::Method, resp));
            }
        };
        // After the body: the refusal of a POST carries the request's id (2026-07-28 §2.2:
        // every error answer names the request it answers).
        let id = match &op {
            Operation::Post(msg) => msg.id(),
            _ => None,
        };
        if let Some((reason, resp)) = super::response::refuse_session_or_version(fields, id) {
            return Err(self.reject(reason, resp));
        }
        if let Operation::Post(msg) = &op {
            if let Some((reason, resp)) = super::response::refuse_version_disagreement(fields, msg)
            {
                return Err(self.reject(reason, resp));
            }
        }
        Ok((served, op))
    }

    /// Sends a decoded request through its route's stack and answers with its reply: the
    /// client's head fields taskgate does not forward removed, the era computed once, the
    /// routing headers checked, then the stack's reply (or error) encoded and counted.
    /// (Not an `async fn`, for the reason `serve` gives.)
    fn forward<'a>(
        &'a self,
        served: &'a Served,
        mut headers: HeaderMap,
        head: Head,
        op: Operation,
        caller: Admitted,
    ) -> impl Future<Output = Response<Body>> + 'a {
        async move {
            let Admitted {
                principal,
                peer,
                mut permit,
            } = caller;
            let session_id = strip_client_fields(&mut headers, &head);
            let era = era_of(&head, &headers, &op);
            // 2026-07-28 has no sessions (§2.2: "ignore it, never mint one"): a client's
            // `Mcp-Session-Id` on a 2026 request is neither checked nor sent upstream, where a
            // dual-era server takes a session id for the legacy era (§2.4).
            let session_id = session_id.filter(|_| era == Era::Legacy);
            let primes = sends_primes(era, &head, &op);
            if let Err(resp) = self.check_routing_headers(era, &head, &mut headers, &op) {
                return holding(resp, permit);
            }
            let mut request = McpRequest::from(RequestParts {
                op,
                ctx: RequestContext {
                    upstream: served.route.name.clone(),
                    client_session_id: session_id.clone(),
                    session_id,
                    principal,
                    client_addr: Some(peer),
                    headers,
                },
                extensions: http::Extensions::new(),
                trace: None,
            });
            store_era(&mut request, era);
            mark_own_form_id(&mut request, era);
            let trace = match &self.telemetry {
                Some(telemetry) => super::trace::start(telemetry, &mut request),
                None => None,
            };
            let labels = Labels::of(&request);
            let span = labels.span(&served.route.name, &request);
            let started = Instant::now();
            let result =
                tracing::Instrument::instrument(served.route.stack.send(request), span.clone())
                    .await;
            served
                .series
                .duration(labels.method, started.elapsed().as_secs_f64());
            match result {
                Ok(mut reply) => {
                    if let Some(trace) = trace {
                        reply.end_span(trace, None, labels.rpc_id.as_ref());
                    }
                    self.answer(served, &labels, era, primes, reply, &mut permit)
                }
                Err(e) => {
                    if let Some(trace) = trace {
                        e.end_span(trace);
                    }
                    served.series.request(labels.method, e.outcome());
                    span.in_scope(|| {
                        tracing::warn!(
                            upstream = %served.route.name,
                            method = labels.method.as_str(),
                            id = labels.rpc_id.as_ref().map(|i| tracing::field::display(i.as_json())),
                            error = %e,
                            "request failed"
                        )
                    });
                    holding(gateway_error_response(&e, labels.rpc_id.as_ref()), permit)
                }
            }
        }
    }

    /// `Mcp-Method`/`Mcp-Name` agree with the body before anything acts on it; a 2026 request
    /// lacking them gets them on the upstream leg (see `mcp::routing_headers`). Errors: the
    /// 400 answer (`mcp::errors::HEADER_MISMATCH`) naming the disagreement.
    fn check_routing_headers(
        &self,
        era: Era,
        head: &Head,
        headers: &mut HeaderMap,
        op: &Operation,
    ) -> Result<(), Response<Body>> {
        if !(head.routing || era == Era::Modern) {
            return Ok(());
        }
        let Operation::Post(msg) = op else {
            return Ok(());
        };
        let checked = crate::mcp::routing_headers::check(headers, msg).and_then(|routing| {
            match (era, msg.kind(), msg.method()) {
                (Era::Modern, jsonrpc::Kind::Request, Some(method)) => {
                    match routing.refusal_for_modern(method) {
                        Some(message) => Err(message),
                        None => Ok(routing),
                    }
                }
                _ => Ok(routing),
            }
        });
        match checked {
            Ok(routing) if era == Era::Modern => {
                for (name, value) in routing.missing {
                    headers.insert(name, value);
                }
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(message) => Err(self.reject(
                RejectReason::HeaderMismatch,
                rpc_error_response(
                    StatusCode::BAD_REQUEST,
                    msg.id(),
                    crate::mcp::errors::HEADER_MISMATCH,
                    &message,
                ),
            )),
        }
    }

    /// The stack's reply as the client's answer: a 2026 client's without `Mcp-Session-Id`,
    /// priming events removed when the client does not take them, a session's GET stream or DELETE noted, a local answer counted as one;
    /// its body holds `permit` (see [`Edge::encode_reply`]).
    fn answer(
        &self,
        served: &Served,
        labels: &Labels,
        era: Era,
        primes: bool,
        mut reply: McpReply,
        permit: &mut Option<Permit>,
    ) -> Response<Body> {
        let (route, series, method) = (&served.route, &served.series, labels.method);
        if era == Era::Modern {
            // 2026-07-28 has no sessions: an upstream's (or a bridged session's) id is never
            // passed on (break-edge F8). One look-up per 2026 answer; 2025 answers pay nothing.
            reply.headers.remove(&crate::headers::MCP_SESSION_ID);
        }
        if !primes {
            reply.body = super::response::without_priming(reply.body);
        }
        if let Some(session) = &labels.stream_session {
            let delete = matches!(method, McpMethod::Delete);
            self.streams
                .on_reply(&route.name, session, delete, &mut reply);
        }
        if let Some(reason) = reply.take_local_reason() {
            self.metrics.local_answer(&route.name, reason);
            series.request(method, RequestOutcome::Local);
            tracing::debug!(
                upstream = %route.name,
                method = method.as_str(),
                id = labels.rpc_id.as_ref().map(|i| tracing::field::display(i.as_json())),
                reason = reason.as_str(),
                status = reply.status.as_u16(),
                era = era.as_str(),
                "answered by taskgate"
            );
            return self.encode_reply(reply, &route.name, labels.stream_kind, permit.take(), None);
        }
        if !reply.status.is_success() {
            series.request(method, RequestOutcome::UpstreamStatus);
        } else if labels.stream_kind == SseKind::Post && matches!(reply.body, ReplyBody::Stream(_))
        {
            // An SSE answer is counted when it ends: the transport may still end it with an
            // error of its own (an oversized event: break-edge F11).
            let count = Some(PendingCount {
                series: series.clone(),
                method,
            });
            return self.encode_reply(reply, &route.name, labels.stream_kind, permit.take(), count);
        } else {
            series.request(method, RequestOutcome::Ok);
        }
        self.encode_reply(reply, &route.name, labels.stream_kind, permit.take(), None)
    }

    fn check_host_and_origin(
        &self,
        uri: &http::Uri,
        version: http::Version,
        fields: &HeadFields<'_>,
    ) -> Result<(), Response<Body>> {
        // RFC 9112 section 3.2: exactly one Host field in HTTP/1.1 (HTTP/1.0 may omit it).
        let hosts = fields.hosts;
        if hosts > 1 || (hosts == 0 && version != http::Version::HTTP_10) {
            return Err(self.reject(
                RejectReason::Host,
                transport_refusal(
                    StatusCode::BAD_REQUEST,
                    &format!("Bad Request: a request must carry exactly one Host header field (got {hosts})"),
                ),
            ));
        }
        // One Origin and one Authorization at most: of two, the checks read the first and an
        // upstream or proxy may read the other (an allowed Origin before an evil one passed;
        // two tokens, the first one's principal was taken: break-edge F9).
        for (count, name, reason) in [
            (fields.origins, "Origin", RejectReason::Origin),
            (fields.authorizations, "Authorization", RejectReason::Auth),
        ] {
            if count > 1 {
                return Err(self.reject(
                    reason,
                    transport_refusal(
                        StatusCode::BAD_REQUEST,
                        &format!("Bad Request: a request may carry at most one {name} header field (got {count})"),
                    ),
                ));
            }
        }
        // An absolute-form request line (`POST http://evil.example/mcp`) names the host too.
        // Compared without a copy: the allowed values are lowercase (on every request).
        let host = uri
            .authority()
            .map(|a| a.as_str())
            .or_else(|| fields.host.map(|h| h.to_str().unwrap_or("")));
        if let (Some(allowed), Some(host)) = (&self.settings.allowed_hosts, host) {
            if !allowed.iter().any(|a| a.eq_ignore_ascii_case(host)) {
                let host = host.to_ascii_lowercase();
                return Err(self.reject(
                    RejectReason::Host,
                    transport_refusal(
                        StatusCode::FORBIDDEN,
                        &format!("Forbidden: Host {host:?} is not allowed (gateway.allowed_hosts; DNS-rebinding protection)"),
                    ),
                ));
            }
        }
        if let (Some(allowed), Some(origin)) = (&self.settings.allowed_origins, fields.origin) {
            let origin = origin.to_str().unwrap_or("");
            if !allowed.iter().any(|a| a.eq_ignore_ascii_case(origin)) {
                let origin = origin.to_ascii_lowercase();
                return Err(self.reject(
                    RejectReason::Origin,
                    transport_refusal(
                        StatusCode::FORBIDDEN,
                        &format!(
                            "Forbidden: Origin {origin:?} is not allowed (gateway.allowed_origins)"
                        ),
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A POST's body as one JSON-RPC message, in four steps: the media types
    /// ([`Self::check_media_types`]), the body read within `gateway.max_body_bytes` and the body
    /// timeout ([`Self::read_post_body`]), the parse, and the refusal's reason
    /// ([`envelope_reject_reason`]). Errors: the counted transport refusal (415, 406, 413, 408,
    /// 400), with the request's id when the JSON was read and its `id` is one (a duplicate key
    /// elsewhere, a `method` that is not a string: break-edge F12), else id `null`.
    async fn decode_post(
        &self,
        fields: &HeadFields<'_>,
        body: Incoming,
    ) -> Result<Message, Response<Body>> {
        self.check_media_types(fields)?;
        let bytes = self.read_post_body(fields, body).await?;
        let bom = bytes.starts_with(b"\xEF\xBB\xBF");
        Message::parse_checked_with_id(bytes).map_err(|(e, id)| {
            let e = match bom {
                // serde_json's "expected value at line 1 column 1" does not say why.
                true => crate::jsonrpc::EnvelopeError::Parse(
                    "the body starts with a UTF-8 byte order mark (EF BB BF), which JSON text sent over a network must not (RFC 8259 section 8.1)".into(),
                ),
                false => e,
            };
            self.reject(
                envelope_reject_reason(&e),
                rpc_error_response(StatusCode::BAD_REQUEST, id.as_ref(), e.code(), &e.to_string()),
            )
        })
    }

    /// A POST's `Content-Type` is `application/json` (UTF-8, 415 otherwise), it has no
    /// `Content-Encoding` but `identity` (415 otherwise), and its `Accept`
    /// lists both `application/json` and `text/event-stream` (406 otherwise; 2025-11-25 and
    /// 2026-07-28 transports, "Sending Messages to the Server").
    fn check_media_types(&self, fields: &HeadFields<'_>) -> Result<(), Response<Body>> {
        let content_type = content_type_is(fields.content_type, "application/json");
        if content_type != Ok(true) {
            let message = match content_type {
                Err(charset) => {
                    format!("Unsupported Media Type: charset={charset}; MCP messages are UTF-8")
                }
                Ok(_) => {
                    "Unsupported Media Type: Content-Type must be application/json".to_string()
                }
            };
            return Err(self.reject(
                RejectReason::ContentType,
                transport_refusal(StatusCode::UNSUPPORTED_MEDIA_TYPE, &message),
            ));
        }
        if let Some(coding) = fields
            .content_encoding
            .filter(|c| !c.as_bytes().trim_ascii().eq_ignore_ascii_case(b"identity"))
        {
            // RFC 9110 section 15.5.16: a content coding the server does not take is 415.
            // taskgate reads every message it relays, and forwards none compressed.
            let message = format!(
                "Unsupported Media Type: Content-Encoding not supported ({}); send the body uncompressed",
                String::from_utf8_lossy(coding.as_bytes())
            );
            return Err(self.reject(
                RejectReason::ContentType,
                transport_refusal(StatusCode::UNSUPPORTED_MEDIA_TYPE, &message),
            ));
        }
        if !fields.accept_lists(&["application/json", "text/event-stream"]) {
            return Err(self.reject(
                RejectReason::Accept,
                transport_refusal(
                    StatusCode::NOT_ACCEPTABLE,
                    "Not Acceptable: Accept must list both application/json and text/event-stream",
                ),
            ));
        }
        Ok(())
    }

    /// A POST's body, at most `gateway.max_body_bytes`: refused 413 at once (connection closed)
    /// when its `Content-Length` is over what can be read away, or over the limit from a client
    /// waiting for `100 Continue`; 413 when it grows over the limit; 408 (connection closed)
    /// when it does not arrive within the body timeout; 400 when reading it fails.
    async fn read_post_body(
        &self,
        fields: &HeadFields<'_>,
        body: Incoming,
    ) -> Result<bytes::Bytes, Response<Body>> {
        let limit = self.settings.max_body_bytes;
        let too_large = || {
            transport_refusal(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "Payload Too Large: the body exceeds {limit} bytes (gateway.max_body_bytes)"
                ),
            )
        };
        let declared = fields
            .content_length
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let expects_continue = fields
            .expect
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        // Too large to even read away, or a client waiting for `100 Continue` (reading the body
        // would send it): answer at once (the connection is closed after it).
        let refuse_at = if expects_continue {
            limit
        } else {
            limit + DISCARD_LIMIT
        };
        if declared.is_some_and(|n| n > refuse_at as u64) {
            let mut resp = too_large();
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Err(self.reject(RejectReason::BodyTooLarge, resp));
        }
        // A small body is all there at the first poll: taken without a timer then (setting one
        // up cost about 240 instructions per request); otherwise the timeout bounds the rest
        // (the first poll does not wait).
        let mut reading = std::pin::pin!(read_body(body, limit));
        let read = match std::future::poll_fn(|cx| Poll::Ready(reading.as_mut().poll(cx))).await {
            Poll::Ready(read) => Ok(read),
            Poll::Pending => tokio::time::timeout(self.settings.body_timeout, reading).await,
        };
        let Ok(read) = read else {
            let mut resp = transport_refusal(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "Request Timeout: the body did not arrive within {} ms (gateway.request_timeout_ms)",
                    self.settings.body_timeout.as_millis()
                ),
            );
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Err(self.reject(RejectReason::BodyTimeout, resp));
        };
        match read {
            Ok(bytes) => Ok(bytes),
            Err(BodyError::TooLarge) => Err(self.reject(RejectReason::BodyTooLarge, too_large())),
            Err(BodyError::Read(e)) => Err(self.reject(
                RejectReason::Invalid,
                transport_refusal(
                    StatusCode::BAD_REQUEST,
                    &format!("Bad Request: reading the body failed: {e}"),
                ),
            )),
        }
    }

    /// The reply as the HTTP response, its body holding `permit` (boxed once with it: a JSON
    /// answer boxed, then boxed again in [`HoldingPermit`], cost an allocation per request;
    /// benches/profile.sh small, issue 36).
    fn encode_reply(
        &self,
        reply: McpReply,
        upstream: &Arc<str>,
        kind: SseKind,
        permit: Option<Permit>,
        count: Option<PendingCount>,
    ) -> Response<Body> {
        let mut builder = Response::builder().status(reply.status);
        *builder.headers_mut().expect("fresh builder") = reply.headers;
        let body: Body = match reply.body {
            ReplyBody::Json(b) | ReplyBody::Raw(b) => boxed(Full::new(b), permit),
            ReplyBody::Empty => boxed(Empty::new(), permit),
            ReplyBody::Stream(events) => {
                let guard = self.metrics.sse_stream_opened(upstream, kind);
                let mut shutdown = self.shutdown.clone();
                // GET streams end when taskgate shuts down (clients reconnect); POST streams
                // carry a pending response and may run until the drain timeout.
                let stop: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> =
                    if kind == SseKind::Get {
                        Box::pin(async move {
                            let _ = shutdown.wait_for(|s| *s).await;
                        })
                    } else {
                        Box::pin(std::future::pending())
                    };
                let bytes = Relayed {
                    events: KeepAlive::new(events, self.settings.sse_keepalive).take_until(stop),
                    _guard: guard,
                    count,
                };
                boxed(StreamBody::new(bytes), permit)
            }
        };
        builder.body(body).expect("valid response parts")
    }
}

/// Removes the client's head fields that do not go upstream: hop-by-hop fields, `Origin`,
/// and `Mcp-Session-Id`, which is returned (the request carries it in its context). Each
/// removal is a hashed look-up, made only for a field [`Head`] found. `Host` and
/// `Content-Length` stay: the upstream client replaces both.
fn strip_client_fields(headers: &mut HeaderMap, head: &Head) -> Option<HeaderValue> {
    if head.hop_by_hop {
        remove_hop_by_hop(headers);
    }
    let session_id = if head.session_id {
        headers.remove(&MCP_SESSION_ID)
    } else {
        None
    };
    if head.origin {
        headers.remove(header::ORIGIN);
    }
    session_id
}

/// Whether `MCP-Protocol-Version` is one 2026-era revision taskgate serves (sent once; another
/// value is refused as the version checks say, whatever the method).
fn modern_version(fields: &HeadFields<'_>) -> bool {
    fields.protocol_versions == 1
        && fields.protocol_version.is_some_and(|v| {
            crate::mcp::era::is_supported_version(v.as_bytes()) && Era::of_header(v) == Era::Modern
        })
}

/// The request's era: its `MCP-Protocol-Version` (gone if a `Connection` field named it),
/// else the body's `_meta` ([`Era::of_parts`]).
fn era_of(head: &Head, headers: &HeaderMap, op: &Operation) -> Era {
    let header_era = match head.hop_by_hop {
        false => head.era,
        true => headers
            .get(&crate::headers::MCP_PROTOCOL_VERSION)
            .map(Era::of_header),
    };
    let msg = match op {
        Operation::Post(m) => Some(m),
        _ => None,
    };
    Era::of_parts(header_era, msg)
}

/// Whether the client gets priming events (empty SSE events, new in 2025-11-25): not a client
/// that negotiated an older revision (its `MCP-Protocol-Version`, or the revision its
/// `initialize` asks for, says so). A 2026-era request gets them.
fn sends_primes(era: Era, head: &Head, op: &Operation) -> bool {
    era == Era::Modern
        || (head.primes
            && !matches!(op, Operation::Post(m) if m.method() == Some("initialize")
                && !super::response::initialize_primes(m)))
}

/// Stores the request's era, once; layers read it with `Era::of` (DESIGN.md "Two eras, one
/// gateway"), which answers the default (legacy) when none is stored: the first insert into
/// `Extensions` allocates its map (three allocations), so the default is not stored. (In
/// place: a request moved in and out cost a copy of it per request.)
fn store_era(request: &mut McpRequest, era: Era) {
    if era != Era::default() {
        request.extensions.insert(era);
    }
}

/// Marks a 2025-11-25 request whose id the client chose in taskgate's own form
/// ([`ClientIdInOwnForm`]: the `ids` layer sends it under a minted id). A prefix compare per
/// request with an id; the extension only on the rare request it marks. (A client's response
/// to a server request taskgate relayed carries taskgate's own id, rightly: not marked.)
fn mark_own_form_id(request: &mut McpRequest, era: Era) {
    if era != Era::Legacy {
        return;
    }
    let Operation::Post(msg) = &request.op else {
        return;
    };
    if msg.kind() != jsonrpc::Kind::Request {
        return;
    }
    if let Some(id) = msg.id().filter(|id| in_own_form(id)) {
        let marker = ClientIdInOwnForm(id.clone());
        request.extensions.insert(marker);
    }
}

/// What the edge keeps of a request it sent down, to count, log and encode its answer.
struct Labels {
    method: McpMethod,
    stream_kind: SseKind,
    rpc_id: Option<jsonrpc::Id>,
    /// The client session of a GET stream or a DELETE (see `session_streams`).
    stream_session: Option<HeaderValue>,
}

impl Labels {
    fn of(request: &McpRequest) -> Labels {
        let method = match &request.op {
            Operation::Post(m) => m.method().map(McpMethod::of).unwrap_or(match m.kind() {
                jsonrpc::Kind::Error => McpMethod::ErrorResponse,
                _ => McpMethod::Response,
            }),
            Operation::OpenStream => McpMethod::Get,
            Operation::EndSession => McpMethod::Delete,
        };
        let stream_kind = if matches!(request.op, Operation::OpenStream) {
            SseKind::Get
        } else {
            SseKind::Post
        };
        let stream_session = match method {
            McpMethod::Get | McpMethod::Delete => request.ctx.client_session_id.clone(),
            _ => None,
        };
        Labels {
            method,
            stream_kind,
            rpc_id: request.id().cloned(),
            stream_session,
        }
    }

    /// The request's span. Debug level: at the default `info` it costs nothing per request;
    /// warnings carry the same fields themselves.
    fn span(&self, upstream: &Arc<str>, request: &McpRequest) -> tracing::Span {
        tracing::debug_span!(
            "request",
            upstream = %upstream,
            method = self.method.as_str(),
            id = self.rpc_id.as_ref().map(|i| tracing::field::display(i.as_json())),
            session = request.ctx.session_id.as_ref().and_then(|s| s.to_str().ok()),
        )
    }
}

impl Handler for Edge {
    fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: std::net::SocketAddr,
    ) -> impl Future<Output = Response<Body>> + Send + 'static {
        self.serve(req, peer.ip())
    }

    /// HTTP 503 with JSON-RPC `-32603` (both eras' internal error, as
    /// [`GatewayError::ShuttingDown`](crate::exchange::GatewayError::ShuttingDown)), no id: the
    /// request's body may not have been read.
    fn shutting_down() -> Response<Body> {
        let e = crate::exchange::GatewayError::ShuttingDown;
        rpc_error_response(
            e.status(),
            None,
            e.code(),
            "taskgate is shutting down; retry",
        )
    }
}

/// Who the gate admitted, and the `[limits]` slot the request holds (if any) until its
/// answer's body is done.
struct Admitted {
    principal: Principal,
    peer: IpAddr,
    permit: Option<Permit>,
}

/// `resp` with its body holding `permit` (the slot, in flight or a GET stream's, is held until
/// the answer's body, an SSE stream too, is done).
fn holding(resp: Response<Body>, permit: Option<Permit>) -> Response<Body> {
    match permit {
        Some(permit) => resp.map(|body| boxed(body, Some(permit))),
        None => resp,
    }
}

/// `body` as the edge's [`Body`], boxed once, holding `permit` when there is one.
fn boxed<B>(body: B, permit: Option<Permit>) -> Body
where
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<ResponseError>,
{
    match permit {
        Some(permit) => HoldingPermit {
            body,
            _permit: permit,
        }
        .boxed_unsync(),
        None => body.map_err(Into::into).boxed_unsync(),
    }
}

/// A request whose `taskgate_requests_total` count waits for the end of its SSE answer.
struct PendingCount {
    series: RequestSeries,
    method: McpMethod,
}

/// An SSE answer's bytes as the client gets them ([`KeepAlive`]), holding the stream's
/// `taskgate_sse_streams_open` count, and counting the request when the stream ends (or is
/// dropped, the client gone): `ok`, or what an error event the transport made itself reports
/// (`upstream_invalid` for an event over `max_message_bytes` or a stream the upstream cut,
/// `timeout` past a deadline; break-edge F11: such a stream was counted `ok` when its head
/// went out).
struct Relayed {
    events: futures_util::stream::TakeUntil<
        KeepAlive,
        std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    >,
    _guard: crate::metrics::GaugeGuard,
    count: Option<PendingCount>,
}

impl Relayed {
    /// Counts the request once, by what the stream relayed so far.
    fn settle(&mut self) {
        if let Some(PendingCount { series, method }) = self.count.take() {
            let outcome = match self.events.get_ref().transport_failure() {
                None => RequestOutcome::Ok,
                // A stream cut short is an invalid answer, as a JSON body cut short is.
                Some(crate::sse::TransportFailure::Invalid | crate::sse::TransportFailure::Cut) => {
                    RequestOutcome::UpstreamInvalid
                }
                Some(crate::sse::TransportFailure::Timeout) => RequestOutcome::Timeout,
            };
            series.request(method, outcome);
        }
    }
}

impl futures_util::Stream for Relayed {
    type Item = Result<Frame<bytes::Bytes>, ResponseError>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let next = std::task::ready!(this.events.poll_next_unpin(cx));
        // Counted before the end goes out (a client that read the whole answer sees the count).
        if !matches!(next, Some(Ok(_))) {
            this.settle();
        }
        Poll::Ready(next.map(|b| b.map(Frame::data).map_err(ResponseError::from)))
    }
}

impl Drop for Relayed {
    fn drop(&mut self) {
        self.settle();
    }
}

/// An answer's body that holds a `[limits]` slot until it is done (dropped with the body).
/// Hand-written because `http_body_util`'s `MapFrame` does not forward `size_hint`: a JSON
/// answer wrapped by it lost its `Content-Length` and went out chunked.
struct HoldingPermit<B> {
    body: B,
    _permit: Permit,
}

impl<B> http_body::Body for HoldingPermit<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<ResponseError>,
{
    type Data = bytes::Bytes;
    type Error = ResponseError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body)
            .poll_frame(cx)
            .map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A refusal of the HTTP exchange itself (before any JSON-RPC message was read): `status` with
/// a JSON-RPC `-32600` error (no id) saying why.
fn transport_refusal(status: StatusCode, message: &str) -> Response<Body> {
    rpc_error_response(status, None, jsonrpc::INVALID_REQUEST, message)
}

/// The `taskgate_http_rejections_total` reason of a body that is not one JSON-RPC message.
fn envelope_reject_reason(e: &EnvelopeError) -> RejectReason {
    match e {
        EnvelopeError::Parse(_) => RejectReason::Parse,
        EnvelopeError::Batch => RejectReason::Batch,
        EnvelopeError::Invalid(_) => RejectReason::Invalid,
    }
}
