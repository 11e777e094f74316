//! The upstream's era: one learned fact per upstream, which both bridges read (issue 30). The
//! `bridge` (2025-11-25 clients on a 2026-07-28 task server) bridges when the upstream serves
//! the tasks extension; `reverse` (2026-07-28 clients on a 2025-11-25 task server) bridges when
//! it speaks only 2025-11-25. Each used to learn this on its own, by its own
//! `server/discover`, and they could disagree (one took a discovery unanswered in time for
//! "2025-11-25" for the process's life, the other asked again later); now one
//! [`Discovery`] per upstream holds the answer and one probe asks.
//!
//! From `upstream.protocol`: `"2025-11-25"` is [`UpstreamEra::Legacy`] and `"2026-07-28"`
//! [`UpstreamEra::ModernTasks`] without asking; `"auto"` (default) is learned once, and only
//! from taskgate's own well-formed `server/discover` (2026-07-28 server/discover; a stateless
//! request with the protocol version and client capabilities in `_meta`), never from a
//! client's request or its answer (a conformance suite sends malformed discoveries on purpose,
//! which a 2026-07-28 server refuses too):
//! - a result advertising `capabilities.extensions["io.modelcontextprotocol/tasks"]`:
//!   [`UpstreamEra::ModernTasks`]; any other result: [`UpstreamEra::Modern`];
//! - a JSON-RPC error, or no JSON-RPC answer (HTTP 400/404 without one, as 2025-11-25 servers
//!   refuse a request without a session): [`UpstreamEra::Legacy`];
//! - an answer that says nothing of the method, whatever its body ([`says_nothing_of_the_era`]:
//!   HTTP 401, 403, 407, 408, 429 or 5xx, the credentials, a proxy or an overloaded server; or
//!   a 2xx that carries no JSON-RPC answer): nothing is learned, and no request asks again for
//!   [`UNANSWERED_RETRY`] (one 503 used to make a 2026-07-28 server "2025-11-25" for the
//!   process's life, so every 2026 request went to a 2025 session it does not have);
//! - not sent (a transport error): nothing is learned, the next request asks again;
//! - unanswered within [`DISCOVER_DEADLINE`] (or the upstream's `timeout_ms` when shorter):
//!   nothing is learned (a 2026-07-28 server slow at its start must not be taken for a
//!   2025-11-25 one for the process's life), and no request asks again for
//!   [`UNANSWERED_RETRY`]; meanwhile the era is unknown, and neither bridge translates.

use super::answer::answer_of;
use super::translate;
use crate::config::UpstreamProtocol;
use crate::exchange::{McpRequest, Operation, RequestParts};
use crate::jsonrpc::Id;
use crate::layers::own_request;
use crate::layers::relay::OwnIds;
use crate::layers::McpService;
use crate::mcp::era::Era;
use http::HeaderValue;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tower::ServiceExt;

/// How long `server/discover` may take before it counts as unanswered (see the module docs);
/// a client's `initialize` or first 2026-07-28 request waits at most this long for the probe.
pub const DISCOVER_DEADLINE: Duration = Duration::from_secs(3);
/// How long after a `server/discover` unanswered within [`DISCOVER_DEADLINE`] requests go on
/// without asking again (`"auto"` upstreams).
pub const UNANSWERED_RETRY: Duration = Duration::from_secs(30);

/// What an upstream serves, as far as the bridges care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamEra {
    /// Only 2025-11-25 (it refuses `server/discover`): its 2026-07-28 clients are bridged by
    /// `reverse`.
    Legacy,
    /// 2026-07-28 without the tasks extension: nothing is bridged.
    Modern,
    /// 2026-07-28 with the tasks extension: its 2025-11-25 clients' tasks are bridged by
    /// `bridge`.
    ModernTasks,
}

/// Policy down, set on the 2026-07-28 requests the bridges send for a 2026-07-28 upstream
/// (`bridge::modern_request`, the discovery): they pass `reverse` untranslated.
#[derive(Debug, Clone, Copy)]
pub struct ForModernUpstream;

/// What asking the upstream `server/discover` gave (see [`Discovery::ask`]).
pub enum Discovered {
    /// It could not be sent (transport error): nothing learned.
    NotSent,
    /// No answer within the deadline: nothing learned.
    Unanswered,
    /// An answer that says nothing of the era (see [`says_nothing_of_the_era`]): nothing
    /// learned.
    Inconclusive,
    /// The answer (`None`: no JSON-RPC answer, such as an HTTP 400 or 404 page, or a stream
    /// that ended without one).
    Answer(Option<Value>),
}

/// One upstream's era: configured, or learned once from taskgate's own `server/discover`
/// (see the module docs). Shared by the `bridge` and `reverse` states of that upstream.
pub struct Discovery {
    protocol: UpstreamProtocol,
    learned: Mutex<Option<UpstreamEra>>,
    /// Until when a discovery unanswered in time keeps requests from asking again.
    unanswered_until: Mutex<Option<Instant>>,
    /// One probe at a time: concurrent first requests wait for its answer.
    probe: tokio::sync::Mutex<()>,
    /// The upstream's `timeout_ms` (bounds the probe with [`DISCOVER_DEADLINE`]).
    timeout: Duration,
}

impl Discovery {
    /// The era of an upstream configured with `protocol` whose `timeout_ms` is `timeout`.
    pub fn new(protocol: UpstreamProtocol, timeout: Duration) -> Arc<Discovery> {
        Arc::new(Discovery {
            protocol,
            learned: Mutex::new(None),
            unanswered_until: Mutex::new(None),
            probe: tokio::sync::Mutex::new(()),
            timeout,
        })
    }

    /// The era when known without asking the upstream.
    pub fn known(&self) -> Option<UpstreamEra> {
        match self.protocol {
            UpstreamProtocol::Legacy => Some(UpstreamEra::Legacy),
            UpstreamProtocol::Modern => Some(UpstreamEra::ModernTasks),
            UpstreamProtocol::Auto => *self.learned.lock(),
        }
    }

    /// The era, asking the upstream `server/discover` (in `req`'s context, under an id of
    /// `ids`) when it is not known and no discovery went unanswered in the last
    /// [`UNANSWERED_RETRY`]; `None` when it stays unknown. Concurrent callers share one probe.
    pub async fn era<S: McpService>(
        &self,
        inner: &S,
        req: &McpRequest,
        ids: &OwnIds,
    ) -> Option<UpstreamEra> {
        if let Some(e) = self.known() {
            return Some(e);
        }
        let _one = self.probe.lock().await;
        if let Some(e) = self.known() {
            return Some(e);
        }
        if self
            .unanswered_until
            .lock()
            .is_some_and(|until| Instant::now() < until)
        {
            return None;
        }
        self.ask(inner.clone(), req, ids).await;
        self.known()
    }

    /// Asks the upstream `server/discover` (in `req`'s context, under an id of `ids`), bounded
    /// by [`DISCOVER_DEADLINE`] or the upstream's `timeout_ms`, whichever is shorter, and
    /// learns the era from what it gave (see the module docs; the first fact learned stays).
    pub async fn ask<S: McpService>(&self, inner: S, req: &McpRequest, ids: &OwnIds) -> Discovered {
        let id = ids.next_id();
        let out = discovery_request(req, &id);
        let asked = async {
            match inner.oneshot(out).await {
                Ok(reply) => {
                    let status = reply.status;
                    Ok((status, answer_of(reply, &id).await))
                }
                Err(e) => Err(e),
            }
        };
        let upstream = &req.ctx.upstream;
        match tokio::time::timeout(DISCOVER_DEADLINE.min(self.timeout), asked).await {
            Ok(Ok((status, answer))) if says_nothing_of_the_era(status, answer.as_ref()) => {
                tracing::info!(upstream = %upstream, %status, "server/discover answered without telling the era: asked again later");
                *self.unanswered_until.lock() = Some(Instant::now() + UNANSWERED_RETRY);
                Discovered::Inconclusive
            }
            Ok(Ok((_, answer))) => {
                let era = match answer.as_ref().and_then(|a| a.get("result")) {
                    Some(r) if r.is_object() && translate::advertises_extension(r) => {
                        UpstreamEra::ModernTasks
                    }
                    Some(r) if r.is_object() => UpstreamEra::Modern,
                    _ => UpstreamEra::Legacy,
                };
                self.learn(upstream, era);
                Discovered::Answer(answer)
            }
            // The upstream answered, but refused taskgate's credentials (a 502 since break-edge
            // F8; before, an answer that says nothing of the era): asked again after
            // `UNANSWERED_RETRY`, not on every request. Not any protocol error (a body cut
            // short is asked again at once, as before: review 18b #5).
            Ok(Err(e @ crate::exchange::GatewayError::UpstreamRefused { .. })) => {
                tracing::info!(upstream = %upstream, error = %e, "server/discover answered without telling the era: asked again later");
                *self.unanswered_until.lock() = Some(Instant::now() + UNANSWERED_RETRY);
                Discovered::Inconclusive
            }
            Ok(Err(e)) => {
                tracing::debug!(upstream = %upstream, error = %e, "server/discover could not be sent; asked again later");
                Discovered::NotSent
            }
            Err(_) => {
                tracing::info!(upstream = %upstream, "server/discover unanswered within the deadline: the era is asked again later");
                *self.unanswered_until.lock() = Some(Instant::now() + UNANSWERED_RETRY);
                Discovered::Unanswered
            }
        }
    }

    fn learn(&self, upstream: &str, era: UpstreamEra) {
        if self.protocol != UpstreamProtocol::Auto {
            return;
        }
        let mut l = self.learned.lock();
        if l.is_none() {
            tracing::info!(upstream = %upstream, ?era, "upstream era learned");
            *l = Some(era);
        }
    }
}

/// Whether a `server/discover` answered with HTTP `status` and the JSON-RPC `answer` (`None`:
/// none) says nothing of the upstream's era: 401, 403, 407 (credentials), 408, 429 and 5xx
/// (a proxy, an overloaded or starting server) whatever the body, and a 2xx without a JSON-RPC
/// answer. A 2025-11-25 server refuses the sessionless request with 400 or 404 (a JSON-RPC
/// error or none); a 2026-07-28 one answers it.
pub fn says_nothing_of_the_era(status: http::StatusCode, answer: Option<&Value>) -> bool {
    use http::StatusCode as S;
    matches!(
        status,
        S::UNAUTHORIZED
            | S::FORBIDDEN
            | S::PROXY_AUTHENTICATION_REQUIRED
            | S::REQUEST_TIMEOUT
            | S::TOO_MANY_REQUESTS
    ) || status.is_server_error()
        || (status.is_success() && answer.is_none())
}

/// taskgate's own `server/discover` under `id`, in `req`'s context (its upstream and the
/// headers the client sent, which may carry credentials): a stateless 2026-07-28 POST (no
/// `Mcp-Session-Id`, `MCP-Protocol-Version: 2026-07-28`, `Mcp-Method: server/discover`, the
/// protocol version and client capabilities declaring the tasks extension in `_meta`), whatever
/// `req` was (a GET included).
fn discovery_request(req: &McpRequest, id: &Id) -> McpRequest {
    let params = json!({ "_meta": translate::modern_meta(None) });
    let msg = own_request::message(id, "server/discover", &params);
    let mut ctx = own_request::context(&req.ctx, Era::Modern, "server/discover", None);
    let h = &mut ctx.headers;
    h.insert(
        http::header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.remove("last-event-id");
    let mut extensions = http::Extensions::new();
    crate::telemetry::carry(&req.extensions, &mut extensions);
    extensions.insert(Era::Modern);
    extensions.insert(ForModernUpstream);
    McpRequest::from(RequestParts {
        op: Operation::Post(msg),
        ctx,
        extensions,
        trace: req.trace.clone(),
    })
}

#[cfg(test)]
mod tests {
    //! One fact for both bridges, on the smallest stack: the discovery over a `service_fn`
    //! upstream, with paused time.
    use super::*;
    use crate::exchange::{GatewayError, McpReply};
    use crate::mcp::era::MODERN_VERSION;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn request() -> McpRequest {
        crate::layers::testing::request(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
    }

    /// An upstream whose first `server/discover` never comes back, and whose later ones are
    /// answered with the tasks extension; counts the discoveries.
    fn slow_then_modern(asked: Arc<AtomicUsize>) -> impl McpService {
        tower::service_fn(move |req: McpRequest| {
            let n = asked.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    std::future::pending::<()>().await;
                }
                let id = req.id().cloned().expect("an id");
                Ok::<_, GatewayError>(McpReply::local_json(crate::jsonrpc::result_response(
                    &id,
                    r#"{"supportedVersions":["2026-07-28"],"capabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}"#,
                )))
            }
        })
    }

    /// A discovery unanswered in time decides nothing, keeps everyone from asking for
    /// [`UNANSWERED_RETRY`], and the next one's answer is the one fact both bridges read.
    #[tokio::test(start_paused = true)]
    async fn an_unanswered_discovery_decides_nothing_and_is_asked_again_later() {
        let asked = Arc::new(AtomicUsize::new(0));
        let up = slow_then_modern(asked.clone());
        let era = Discovery::new(UpstreamProtocol::Auto, Duration::from_secs(60));
        let ids = OwnIds::default();
        assert_eq!(era.era(&up, &request(), &ids).await, None);
        assert_eq!(
            era.era(&up, &request(), &ids).await,
            None,
            "not asked again yet"
        );
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        tokio::time::advance(UNANSWERED_RETRY).await;
        assert_eq!(
            era.era(&up, &request(), &ids).await,
            Some(UpstreamEra::ModernTasks)
        );
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        assert_eq!(era.known(), Some(UpstreamEra::ModernTasks));
    }

    /// An answer that says nothing of the era (a 503, a 401, a 429, even with a JSON-RPC
    /// error body) decides nothing, keeps everyone from asking for [`UNANSWERED_RETRY`], and
    /// the next real answer is the fact: one 503 used to make a 2026-07-28 server "2025-11-25"
    /// for the process's life.
    #[tokio::test(start_paused = true)]
    async fn an_answer_that_says_nothing_of_the_era_decides_nothing() {
        for status in [503u16, 401, 429, 502] {
            let asked = Arc::new(AtomicUsize::new(0));
            let n = asked.clone();
            let up = tower::service_fn(move |req: McpRequest| {
                let first = n.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    let id = req.id().cloned().expect("an id");
                    if first {
                        let mut reply = McpReply::local_json(crate::jsonrpc::error_response(
                            Some(&id),
                            -32000,
                            "unavailable",
                        ));
                        reply.status = http::StatusCode::from_u16(status).unwrap();
                        return Ok::<_, GatewayError>(reply);
                    }
                    Ok(McpReply::local_json(crate::jsonrpc::result_response(
                        &id,
                        r#"{"supportedVersions":["2026-07-28"],"capabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}"#,
                    )))
                }
            });
            let era = Discovery::new(UpstreamProtocol::Auto, Duration::from_secs(60));
            let ids = OwnIds::default();
            assert_eq!(era.era(&up, &request(), &ids).await, None, "HTTP {status}");
            assert_eq!(era.known(), None, "HTTP {status}: nothing learned");
            assert_eq!(
                era.era(&up, &request(), &ids).await,
                None,
                "not asked again yet"
            );
            tokio::time::advance(UNANSWERED_RETRY).await;
            assert_eq!(
                era.era(&up, &request(), &ids).await,
                Some(UpstreamEra::ModernTasks),
                "HTTP {status}"
            );
            assert_eq!(asked.load(Ordering::SeqCst), 2);
        }
    }

    /// A 2025-11-25 server's refusal of the sessionless request (HTTP 400 with a JSON-RPC
    /// error, as the TypeScript SDK 1.x answers) is still the fact "2025-11-25".
    #[tokio::test]
    async fn a_400_refusal_is_still_a_2025_server() {
        let up = tower::service_fn(|req: McpRequest| async move {
            let id = req.id().cloned().expect("an id");
            let mut reply = McpReply::local_json(crate::jsonrpc::error_response(
                Some(&id),
                -32000,
                "Bad Request: No valid session ID provided",
            ));
            reply.status = http::StatusCode::BAD_REQUEST;
            Ok::<_, GatewayError>(reply)
        });
        let era = Discovery::new(UpstreamProtocol::Auto, Duration::from_secs(60));
        assert_eq!(
            era.era(&up, &request(), &OwnIds::default()).await,
            Some(UpstreamEra::Legacy)
        );
    }

    /// The request taskgate sends is its own well-formed, stateless 2026-07-28 discovery,
    /// whatever the client's request was.
    #[test]
    fn the_discovery_is_well_formed_and_stateless() {
        let req = request();
        let out = discovery_request(&req, &Id::from_json("\"d-1\"").unwrap());
        let Operation::Post(msg) = &out.op else {
            panic!("a POST")
        };
        assert_eq!(msg.method(), Some("server/discover"));
        let v: Value = serde_json::from_slice(msg.bytes()).unwrap();
        assert_eq!(
            v.pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion"),
            Some(&json!(MODERN_VERSION))
        );
        assert!(out.ctx.session_id.is_none());
        assert_eq!(out.era(), Era::Modern);
        assert!(out.extensions.get::<ForModernUpstream>().is_some());
    }
}
