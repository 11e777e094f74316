//! Upstreams: the innermost service of every stack, which carries an [`McpRequest`] to one MCP
//! server and hands its answer back as an [`McpReply`].
//!
//! ```text
//! [layers] ─▶ Upstream (tower::Service<McpRequest>) ─▶ dyn Transport ─▶ MCP server
//!                                                       ├ http::StreamableHttp (HTTP/1: h1/)
//!                                                       └ stdio::StdioTransport (child process)
//! ```
//!
//! The layers see one type, [`Upstream`]. Which [`Transport`] is behind it is chosen once, from
//! the `[[upstream]]` config: Streamable HTTP ([`http`], a `url`: [`Upstream::for_config`]), or
//! a supervised child process speaking JSON-RPC on its stdio ([`stdio`], a `command`: issue 31),
//! which `gateway.rs` builds itself ([`stdio::StdioTransport::new`]) because it also wires the
//! child's readiness, deaths and shutdown ([`stdio::StdioHandle`]) to `/readyz`, the registry and
//! `Running::shutdown`. No layer and no part of the edge changes.
//!
//! # What a transport must do
//!
//! One [`Transport::exchange`] is one exchange, shaped as Streamable HTTP shapes it (2025-11-25
//! basic/transports), whatever the wire:
//!
//! - **Operations.** [`Operation::Post`]: deliver the message. A request (it has an id) is
//!   answered with the server's answer to it; a notification or a client's response is
//!   answered 202 with [`ReplyBody::Empty`] once delivered. [`Operation::OpenStream`]: the
//!   session's server→client messages as a [`ReplyBody::Stream`] (405 when the server offers no
//!   such stream, as a Streamable HTTP server may answer). [`Operation::EndSession`]: ends the
//!   session `ctx.session_id` names (2xx; 404 for a session the server does not know).
//! - **Ids.** The message's JSON-RPC id is the caller's and comes back unchanged on its answer.
//!   Within one upstream session an id is in flight at most once (the `ids` layer sees to it
//!   for 2025-11-25 sessions). A transport that carries several sessions or clients over one
//!   channel (a shared stdio child) allocates the ids it writes and maps everything that names
//!   one back to its caller: answers, `notifications/cancelled`'s `requestId`, progress tokens,
//!   server→client requests and their answers; two callers using the same id never collide.
//! - **Sessions.** `ctx.session_id` is the upstream session to use (a layer may have routed the
//!   request to a task's session); a session the server opens goes up as the reply's
//!   `Mcp-Session-Id` header (visible ASCII, else [`GatewayError::UpstreamProtocol`]).
//!   `ctx.headers` are the client's fields the edge forwards (hop-by-hop fields, `Origin` and
//!   `Mcp-Session-Id` already removed; `MCP-Protocol-Version` names the request's revision); a
//!   transport without headers keeps what it needs of them and drops the rest.
//! - **Answers.** An [`McpReply`]: a status (the server's; 200 for an answer, 202 for accepted),
//!   header fields without taskgate's own `x-taskgate-*` ([`crate::headers::strip_upstream_reply`])
//!   and a body: [`ReplyBody::Json`] for one message; [`ReplyBody::Stream`] for messages as they
//!   arrive (related notifications and server→client requests, then the answer), passed on event
//!   by event, never buffered whole; [`ReplyBody::Raw`] for anything else. Each message and each
//!   event is bounded by the upstream's `max_message_bytes`: past it the exchange fails with
//!   [`GatewayError::UpstreamProtocol`], or a stream ends with a JSON-RPC error event for the
//!   request (id `null` on a GET stream), counted in `taskgate_upstream_oversize_total`. A
//!   stream cut before its end ends with [`crate::sse::Event::abort`], so the client never sees
//!   a clean end.
//! - **Deadlines.** The request's [`Deadline`] ([`McpRequest::deadline`], set by the layer that
//!   knows the request), with the upstream's `timeout_ms`: [`Deadline::Head`] bounds the time to
//!   the answer's start and a single message's whole arrival (a stream, once started, runs);
//!   [`Deadline::Exchange`] the whole exchange, a stream included (past it the stream ends with
//!   a JSON-RPC error event naming the method); [`Deadline::Unbounded`] nothing. A transport
//!   matches no method names to choose. A dead peer still ends a waiting exchange (TCP
//!   keepalive; a child's exit).
//! - **Errors.** [`GatewayError::UpstreamUnreachable`] (nothing delivered: connect failed, the
//!   pool is full, no child is running), [`GatewayError::UpstreamTimeout`] (the deadline passed
//!   before the answer started), [`GatewayError::UpstreamProtocol`] (the answer is not MCP over
//!   this transport; a redirect), [`GatewayError::UpstreamRefused`] (a 401 or 403 to
//!   a request without the client's own `Authorization`), each naming the upstream and counted in
//!   `taskgate_upstream_errors_total{kind}`. Nothing a server sends panics or grows a buffer
//!   without bound.
//! - **Threads.** An exchange runs on the serving thread that called it: its I/O is polled by
//!   the request's future and then by the reply's stream, with no hand-over to another task per
//!   message ([`h1`] says what that saves); [`pin_thread`] tells the transports which serving
//!   thread they run on.
//!
//! [`McpRequest`]: crate::exchange::McpRequest
//! [`McpRequest::deadline`]: crate::exchange::McpRequest::deadline
//! [`McpReply`]: crate::exchange::McpReply
//! [`Operation::Post`]: crate::exchange::Operation::Post
//! [`Operation::OpenStream`]: crate::exchange::Operation::OpenStream
//! [`Operation::EndSession`]: crate::exchange::Operation::EndSession
//! [`ReplyBody::Empty`]: crate::exchange::ReplyBody::Empty
//! [`ReplyBody::Stream`]: crate::exchange::ReplyBody::Stream
//! [`ReplyBody::Json`]: crate::exchange::ReplyBody::Json
//! [`ReplyBody::Raw`]: crate::exchange::ReplyBody::Raw
//! [`Deadline`]: crate::exchange::Deadline
//! [`Deadline::Head`]: crate::exchange::Deadline::Head
//! [`Deadline::Exchange`]: crate::exchange::Deadline::Exchange
//! [`Deadline::Unbounded`]: crate::exchange::Deadline::Unbounded
//! [`GatewayError::UpstreamProtocol`]: crate::exchange::GatewayError::UpstreamProtocol
//! [`GatewayError::UpstreamTimeout`]: crate::exchange::GatewayError::UpstreamTimeout
//! [`GatewayError::UpstreamUnreachable`]: crate::exchange::GatewayError::UpstreamUnreachable
//! [`GatewayError::UpstreamRefused`]: crate::exchange::GatewayError::UpstreamRefused

pub mod h1;
pub mod http;
pub mod stdio;
mod traced;

pub use self::h1::pin_thread;
pub use self::http::StreamableHttp;
pub use self::traced::ClientSpan;

use crate::config::UpstreamConfig;
use crate::exchange::{GatewayError, McpReply, McpRequest};
use crate::metrics::Metrics;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The future of one exchange: the server's answer, or why there is none.
pub type Exchange = Pin<Box<dyn Future<Output = Result<McpReply, GatewayError>> + Send>>;

/// A way to reach one MCP server: what the module docs list, behind one call per exchange.
pub trait Transport: Send + Sync + 'static {
    /// The upstream's configured name (in errors and metric labels).
    fn name(&self) -> &Arc<str>;

    /// Sends `req` and returns its answer, as the module docs say. The future is `'static`: it
    /// owns its share of the transport.
    fn exchange(self: Arc<Self>, req: McpRequest) -> Exchange;

    /// [`Transport::exchange`] of `req` under its CLIENT span `span` (issue 34), which ends
    /// with the answer ([`ClientSpan::end`]). By default a future around the exchange's own;
    /// a transport may end the span in its own future instead, one allocation and one future
    /// fewer per traced exchange (~400 instructions, callgrind, issue 34).
    fn traced_exchange(self: Arc<Self>, req: McpRequest, span: ClientSpan) -> Exchange {
        let exchange = self.exchange(req);
        Box::pin(async move {
            let mut result = exchange.await;
            span.end(&mut result);
            result
        })
    }
}

/// One configured upstream as the stack's innermost service (`tower::Service<McpRequest>`,
/// always ready). Cloning shares the transport (one reference count).
#[derive(Clone)]
pub struct Upstream(Arc<dyn Transport>, Option<Arc<traced::Traced>>);

impl Upstream {
    /// The transport of a `url` upstream: Streamable HTTP to its `url` (the config is
    /// validated). A `command` upstream's is [`stdio::StdioTransport::new`]'s.
    ///
    /// Errors: an `https://` upstream's TLS settings cannot be built (its `ca_file` became
    /// unreadable after the config was checked).
    pub fn for_config(config: &UpstreamConfig, metrics: Arc<Metrics>) -> Result<Upstream, String> {
        StreamableHttp::new(config, metrics).map(Upstream::new)
    }

    /// An upstream over any `transport` (tests, embedding).
    pub fn new(transport: impl Transport) -> Upstream {
        Upstream(Arc::new(transport), None)
    }

    /// This upstream with a CLIENT span per exchange exported through `telemetry`, carried to
    /// the server as the request's trace parent (`traced`, issue 34); `None`: as it was.
    pub fn traced(
        self,
        telemetry: Option<&crate::telemetry::Telemetry>,
        config: &UpstreamConfig,
    ) -> Upstream {
        let traced = telemetry.map(|t| Arc::new(traced::Traced::new(t.clone(), config)));
        Upstream(self.0, traced)
    }

    /// The upstream's configured name.
    pub fn name(&self) -> &Arc<str> {
        self.0.name()
    }
}

impl tower::Service<McpRequest> for Upstream {
    type Response = McpReply;
    type Error = GatewayError;
    type Future = Exchange;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: McpRequest) -> Exchange {
        match &self.1 {
            None => self.0.clone().exchange(req),
            Some(traced) => traced.exchange(self.0.clone(), req),
        }
    }
}

#[cfg(test)]
mod tests;
