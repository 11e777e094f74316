//! The CLIENT span of each upstream exchange (issue 34), whatever the transport: a child of the
//! request's SERVER span (the edge's `RequestTrace`, the request's `trace`), or for a request taskgate makes
//! itself (`upgrade`'s and the bridge's polls) a root linked to the task's creating span
//! ([`TaskLink`], set by the `tasks` layer). The upstream request carries the CLIENT span as its
//! parent twice: in the HTTP `traceparent` (and `tracestate`) header fields, and in
//! `params._meta.traceparent`, spliced in (every other byte as it was), so a stdio child, which
//! has no header fields, sees it too.

use super::{Exchange, Transport};
use crate::config::UpstreamConfig;
use crate::exchange::{GatewayError, McpReply, McpRequest, Operation};
use crate::jsonrpc::{Kind, CARVED_MESSAGE};
use crate::mcp::classify::Classified;
use crate::telemetry::propagation::{traceparent_quoted, tracestate};
use crate::telemetry::{semconv, KeyValue, Peer, RequestTrace, TaskLink, Telemetry};
use http::{HeaderName, HeaderValue};
use std::sync::Arc;

static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
/// `params._meta.traceparent`'s key and colon as JSON text, put in before the value in one
/// piece (`Message::with_meta_member_at`).
const TRACEPARENT_MEMBER: &[u8] = b"\"traceparent\":";

/// What the CLIENT spans of one upstream are made with: the exporter and the upstream's
/// `server.address`, `server.port` and `network.transport`.
pub(super) struct Traced {
    telemetry: Telemetry,
    peer: Peer,
}

impl Traced {
    /// The spans of upstream `config`: `tcp` and the `url`'s host and port, or `pipe` and the
    /// command's program for a stdio upstream.
    pub(super) fn new(telemetry: Telemetry, config: &UpstreamConfig) -> Traced {
        let mut peer = Vec::with_capacity(4);
        match &config.command {
            Some(command) => {
                peer.push(KeyValue::new(semconv::NETWORK_TRANSPORT, semconv::PIPE));
                if let Some(program) = command.first() {
                    peer.push(KeyValue::new(semconv::SERVER_ADDRESS, program.clone()));
                }
            }
            None => {
                peer.push(KeyValue::new(semconv::NETWORK_TRANSPORT, semconv::TCP));
                peer.push(KeyValue::new(semconv::NETWORK_PROTOCOL_NAME, "http"));
                if let Ok(url) = config.url.parse::<http::Uri>() {
                    if url.host().is_some() {
                        peer.push(KeyValue::new(
                            semconv::SERVER_ADDRESS,
                            crate::config::upstream_host(&url).to_string(),
                        ));
                    }
                    let port = crate::config::upstream_port(&url);
                    peer.push(KeyValue::new(semconv::SERVER_PORT, i64::from(port)));
                }
            }
        }
        Traced {
            telemetry,
            peer: Peer::new(peer),
        }
    }

    /// `req` sent through `transport` under a CLIENT span (a POSTed request; anything else goes
    /// as it is).
    pub(super) fn exchange(&self, transport: Arc<dyn Transport>, mut req: McpRequest) -> Exchange {
        match self.start(&mut req) {
            Some(span) => transport.traced_exchange(req, span),
            None => transport.exchange(req),
        }
    }

    /// Starts the span of `req` and writes it into `req` as its parent; with the request's
    /// SERVER span (looked up once) and its id.
    fn start(&self, req: &mut McpRequest) -> Option<ClientSpan> {
        let Operation::Post(msg) = &req.op else {
            return None;
        };
        if msg.kind() != Kind::Request {
            return None;
        }
        let c = Classified::of(msg);
        let method = c.method()?;
        let server = req.trace.as_ref();
        let link = req.extensions.get::<TaskLink>().map(|l| &l.0);
        // Made only for a span that is sampled.
        let details = || {
            let attributes = match c.task_id() {
                Some(task_id) => vec![crate::telemetry::task_id_attribute(task_id)],
                None => Vec::new(),
            };
            // Raw: compared with the SERVER span's tool as bytes (`Telemetry::exchange_span`).
            (msg.param_bytes("name"), attributes)
        };
        let span = self.telemetry.exchange_span(
            method,
            server,
            link.map_or(&[][..], std::slice::from_ref),
            &self.peer,
            details,
        );
        // A request with its client's SERVER span had the client's trace fields taken out at
        // the edge (`http::trace::start`), so the client's `tracestate` is looked for only in
        // one without.
        let from_edge = server.is_some();
        let server = span.server_kept(server);
        let id = msg.id().cloned();
        // Made on the stack, quoted, once for both places: a `String` for it, and one for its
        // quoted form, cost ~400 instructions (issue 34).
        let quoted = traceparent_quoted(span.context());
        // The quoted value's inside: the header field's value.
        let inside = |at: usize| at + 1..at + quoted.len() - 1;
        // `params._meta.traceparent`, spliced (`Message::with_meta_member_at`); the header
        // field's value is the spliced value's inside, a slice of the message when it was
        // carved from its thread's buffer (a reference count: carved apart, with the
        // message's own allocation, each traced request cost ~150 instructions more,
        // callgrind, issue 34), else carved. Neither is checked: the bytes are
        // `traceparent_bytes`' (checked, 55 bytes cost ~115 instructions).
        let mut value = None;
        if let Some((rewritten, at)) = msg.with_meta_member_at(TRACEPARENT_MEMBER, &quoted) {
            let bytes = rewritten.bytes();
            // Compared with what was spliced in (~25 instructions), so what goes in the
            // header field is known to be those bytes whatever `at` says.
            if bytes.len() <= CARVED_MESSAGE && bytes.get(inside(at)) == Some(&quoted[inside(0)]) {
                // SAFETY: the bytes are `quoted`'s inside: lowercase hex digits and dashes
                // (`traceparent_bytes`), each a byte a header value may hold.
                value = Some(unsafe { crate::headers::shared_unchecked(bytes.slice(inside(at))) });
            }
            req.op = Operation::Post(rewritten);
        }
        // Carved from a buffer this thread keeps, not an allocation of its own (~120
        // instructions, callgrind, issue 34).
        // SAFETY: as above: `quoted`'s inside is lowercase hex digits and dashes.
        let value = value
            .unwrap_or_else(|| unsafe { crate::headers::carved_unchecked(&quoted[inside(0)]) });
        let headers = &mut req.ctx.headers;
        headers.insert(TRACEPARENT.clone(), value);
        match tracestate(span.context()).map(HeaderValue::try_from) {
            Some(Ok(value)) => {
                headers.insert(TRACESTATE.clone(), value);
            }
            _ if from_edge => {}
            // Hashed only when the client sent one (`headers::take`, ~100 instructions).
            _ => {
                crate::headers::take(headers, &TRACESTATE);
            }
        }
        Some(ClientSpan { span, server, id })
    }
}

/// The CLIENT span of one upstream exchange, started ([`super::Transport::traced_exchange`]),
/// with the request's SERVER span when the CLIENT span is not the exchange that span's record
/// holds (`RequestTrace::server_kept`) and the request's id.
pub struct ClientSpan {
    span: RequestTrace,
    server: Option<RequestTrace>,
    id: Option<crate::jsonrpc::Id>,
}

impl ClientSpan {
    /// Ends the span with the exchange's outcome: `error.type` of the answer (read once for
    /// this span and the SERVER span, `McpReply::end_span`) or of the failure.
    pub fn end(self, result: &mut Result<McpReply, GatewayError>) {
        match result {
            Ok(reply) => self.end_reply(reply),
            Err(e) => e.end_span(self.span),
        }
    }

    /// [`ClientSpan::end`] with the answer `reply`.
    fn end_reply(self, reply: &mut McpReply) {
        reply.end_span(self.span, self.server.as_ref(), self.id.as_ref());
    }
}

/// The [`ClientSpan`], if any, a transport's exchange future ends where its outcome is made,
/// instead of a future around it ending the span on the outcome it returns (moved again on its
/// way out: ~90 instructions per traced exchange, callgrind, issue 34). One type for traced
/// exchanges and the others (`None`), so both run the same future: a generic one, made twice,
/// was inlined into each caller and changed the inlining below it, costing the exchange
/// without a span ~250 instructions (callgrind, issue 34).
pub(super) struct Ending(Option<ClientSpan>);

impl Ending {
    /// Ends `span`.
    pub(super) fn of(span: ClientSpan) -> Ending {
        Ending(Some(span))
    }

    /// Ends nothing (an exchange without a span).
    pub(super) fn none() -> Ending {
        Ending(None)
    }

    /// Ends the span with the answer `reply` ([`ClientSpan::end`]), at most once.
    pub(super) fn reply(&mut self, reply: &mut McpReply) {
        if let Some(span) = self.0.take() {
            span.end_reply(reply);
        }
    }

    /// Ends the span with the failure `e` ([`ClientSpan::end`]), at most once; returns `e`.
    pub(super) fn fail(&mut self, e: GatewayError) -> GatewayError {
        if let Some(span) = self.0.take() {
            e.end_span(span.span);
        }
        e
    }
}

impl std::fmt::Debug for ClientSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ClientSpan").field(&self.span).finish()
    }
}

#[cfg(test)]
mod tests {
    /// The member text put before the value is `traceparent`'s key and a colon.
    #[test]
    fn the_traceparent_member_is_its_key_and_a_colon() {
        let member = format!("\"{}\":", crate::telemetry::semconv::TRACEPARENT);
        assert_eq!(super::TRACEPARENT_MEMBER, member.as_bytes());
    }
}
