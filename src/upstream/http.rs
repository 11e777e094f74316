//! Streamable HTTP upstream client (2025-11-25 basic/transports: Streamable HTTP).
//!
//! One [`HttpUpstream`] per configured `[[upstream]]`, with a pooled keep-alive connection pool.
//! - POST carries the message bytes unchanged; GET opens the standalone stream; DELETE ends a session.
//! - `Host` is the upstream's authority (SDK servers validate it against DNS rebinding);
//!   `Mcp-Session-Id` is the one in the request context (a layer may route to a task's session);
//!   configured headers are added; the client's `Authorization` is removed unless
//!   `forward_authorization = true`.
//! - `Accept-Encoding` is not forwarded: answers must be readable to the layers, so the upstream
//!   sends them uncompressed.
//! - Timeouts: `timeout_ms` bounds the time to the response headers and, for a JSON answer, to its
//!   whole body. `tasks/result` (which blocks until the task is terminal) has no timeout; GET
//!   streams and SSE answers have none once their headers arrived.
//! - The answer's body becomes [`ReplyBody::Json`], [`ReplyBody::Stream`] (decoded event by event
//!   as it arrives), [`ReplyBody::Empty`] or [`ReplyBody::Raw`].

use super::pool::{Pool, PoolError};
use crate::config::UpstreamConfig;
use crate::exchange::{GatewayError, McpReply, McpRequest, Operation, ReplyBody};
use crate::metrics::Metrics;
use crate::sse;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// `Mcp-Session-Id` (case-insensitive on the wire).
pub static MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");

/// A Streamable HTTP MCP server; a `tower::Service<McpRequest>`. Cloning shares the pool.
#[derive(Clone)]
pub struct HttpUpstream {
    inner: Arc<Inner>,
}

struct Inner {
    name: Arc<str>,
    /// Origin-form request target (`/mcp?x`), sent to the pooled connection.
    target: Uri,
    host: HeaderValue,
    pool: Arc<Pool>,
    timeout: Duration,
    timeout_ms: u64,
    headers: HeaderMap,
    forward_authorization: bool,
    metrics: Arc<Metrics>,
}

impl HttpUpstream {
    /// Builds the client for one `[[upstream]]` (the config is already validated).
    pub fn new(config: &UpstreamConfig, metrics: Arc<Metrics>) -> HttpUpstream {
        let uri: Uri = config.url.parse().expect("validated upstream url");
        let authority = uri.authority().expect("validated");
        let host = HeaderValue::from_str(authority.as_str())
            .expect("an authority is a valid header value");
        let pool = Pool::new(
            format!(
                "{}:{}",
                authority.host(),
                authority.port_u16().unwrap_or(80)
            ),
            Duration::from_millis(config.connect_timeout_ms),
        );
        let target: Uri = uri
            .path_and_query()
            .map(|pq| pq.as_str())
            .unwrap_or("/")
            .parse()
            .expect("a path is a valid origin-form target");
        let mut headers = HeaderMap::new();
        for (k, v) in &config.headers {
            headers.insert(
                HeaderName::from_bytes(k.as_bytes()).expect("validated header name"),
                HeaderValue::from_str(v).expect("validated header value"),
            );
        }
        HttpUpstream {
            inner: Arc::new(Inner {
                name: config.name.as_str().into(),
                target,
                host,
                pool,
                timeout: Duration::from_millis(config.timeout_ms),
                timeout_ms: config.timeout_ms,
                headers,
                forward_authorization: config.forward_authorization,
                metrics,
            }),
        }
    }

    /// The upstream's configured name.
    pub fn name(&self) -> &Arc<str> {
        &self.inner.name
    }
}

impl tower::Service<McpRequest> for HttpUpstream {
    type Response = McpReply;
    type Error = GatewayError;
    type Future = Pin<Box<dyn Future<Output = Result<McpReply, GatewayError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: McpRequest) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { inner.send(req).await })
    }
}

impl Inner {
    async fn send(&self, req: McpRequest) -> Result<McpReply, GatewayError> {
        let (method, body, deadline) = match &req.op {
            Operation::Post(msg) => {
                // tasks/result blocks until the task is terminal (2025-11-25 tasks): no timeout.
                let deadline = (msg.method() != Some("tasks/result")).then_some(self.timeout);
                (Method::POST, msg.bytes().clone(), deadline)
            }
            Operation::OpenStream => (Method::GET, Bytes::new(), Some(self.timeout)),
            Operation::EndSession => (Method::DELETE, Bytes::new(), Some(self.timeout)),
        };
        let mut builder = Request::builder().method(method).uri(self.target.clone());
        let headers = builder.headers_mut().expect("fresh builder");
        *headers = req.ctx.headers;
        if !self.forward_authorization {
            headers.remove(header::AUTHORIZATION);
        }
        headers.insert(header::HOST, self.host.clone());
        // taskgate reads the messages it relays (task records, status): ask for plain bodies.
        headers.remove(header::ACCEPT_ENCODING);
        match req.ctx.session_id {
            Some(sid) => headers.insert(MCP_SESSION_ID.clone(), sid),
            None => headers.remove(&MCP_SESSION_ID),
        };
        for (k, v) in &self.headers {
            headers.insert(k.clone(), v.clone());
        }
        if body.is_empty() {
            headers.remove(header::CONTENT_LENGTH);
        } else {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        let request = builder.body(Full::new(body)).expect("valid request parts");

        let started = tokio::time::Instant::now();
        let sent = self.pool.send(request);
        let response = match deadline {
            Some(t) => match tokio::time::timeout(t, sent).await {
                Ok(r) => r,
                Err(_) => return Err(self.timeout_error()),
            },
            None => sent.await,
        }
        .map_err(|e| self.unreachable(e))?;

        let (parts, incoming) = response.into_parts();
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers);
        headers.remove(header::CONTENT_LENGTH);
        let is_sse = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.trim_start().starts_with("text/event-stream"));
        if is_sse {
            return Ok(McpReply {
                status: parts.status,
                headers,
                body: ReplyBody::Stream(sse::decode(incoming, self.name.clone())),
            });
        }
        let collect = incoming.collect();
        let collected = match deadline {
            Some(t) => {
                let left = t.saturating_sub(started.elapsed());
                match tokio::time::timeout(left, collect).await {
                    Ok(r) => r,
                    Err(_) => return Err(self.timeout_error()),
                }
            }
            None => collect.await,
        };
        let bytes = collected
            .map_err(|e| {
                self.metrics
                    .upstream_errors_total
                    .with_label_values(&[&self.name, "protocol"])
                    .inc();
                GatewayError::UpstreamProtocol {
                    upstream: self.name.clone(),
                    detail: format!("body ended early: {e}"),
                }
            })?
            .to_bytes();
        let is_json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.trim_start().starts_with("application/json"));
        let body = if bytes.is_empty() {
            ReplyBody::Empty
        } else if is_json {
            ReplyBody::Json(bytes)
        } else {
            ReplyBody::Raw(bytes)
        };
        Ok(McpReply {
            status: parts.status,
            headers,
            body,
        })
    }

    fn timeout_error(&self) -> GatewayError {
        self.metrics
            .upstream_errors_total
            .with_label_values(&[&self.name, "timeout"])
            .inc();
        GatewayError::UpstreamTimeout {
            upstream: self.name.clone(),
            timeout_ms: self.timeout_ms,
        }
    }

    fn unreachable(&self, e: PoolError) -> GatewayError {
        self.metrics
            .upstream_errors_total
            .with_label_values(&[&self.name, "connect"])
            .inc();
        GatewayError::UpstreamUnreachable {
            upstream: self.name.clone(),
            detail: e.to_string(),
        }
    }
}

/// Removes hop-by-hop headers (RFC 9110 section 7.6.1), including those named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}
