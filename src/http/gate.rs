//! The first steps of every MCP-endpoint request after the Host/Origin check: RFC 9728
//! protected-resource metadata (no credentials needed), the failed-authentication bound of the
//! client's address ([`crate::limits`]: 429 with `Retry-After`, no token check made),
//! authentication ([`crate::auth`]: 401/403 with `WWW-Authenticate`, before any other check; an
//! invalid token counts against the address), then per-principal limits ([`crate::limits`]:
//! 429 with `Retry-After`). Each refusal is counted in `taskgate_http_rejections_total{reason}`
//! (`auth_failures`, `auth`, `scope`, `rate_limit`, `in_flight`).

use super::response::{json_response, rpc_error_response};
use super::server::Body;
use crate::auth::{Authenticator, RefusalKind, METADATA_PATH};
use crate::exchange::Principal;
use crate::jsonrpc;
use crate::limits::{Limiter, Over, Permit};
use crate::metrics::{Metrics, RejectReason};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Response, StatusCode};
use std::sync::Arc;

/// What the gate needs from the edge.
pub struct Gate<'a> {
    /// `[auth]`.
    pub auth: &'a Authenticator,
    /// `[limits]`.
    pub limits: &'a Arc<Limiter>,
    /// The client's address (the TCP peer, or the client a trusted proxy forwarded for:
    /// [`super::client_addr`]): the key of the failed-authentication bound.
    pub peer: std::net::IpAddr,
    /// Where refusals are counted.
    pub metrics: &'a Metrics,
    /// Whether a path (`/mcp`, `/mcp/<name>`) is an MCP route.
    pub is_route: &'a (dyn Fn(&str) -> bool + Sync),
}

fn reject(metrics: &Metrics, reason: RejectReason, response: Response<Body>) -> Response<Body> {
    metrics.http_rejection(reason);
    response
}

/// HTTP 429 with `Retry-After` and JSON-RPC `-32029` for a `[limits]` refusal, counted.
pub(super) fn too_many(metrics: &Metrics, over: Over) -> Response<Body> {
    let mut resp = rpc_error_response(
        StatusCode::TOO_MANY_REQUESTS,
        None,
        crate::mcp::errors::TASK_LIMIT_EXCEEDED,
        &over.message(),
    );
    resp.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(over.retry_after_secs()),
    );
    let reason = match over {
        Over::Rate(_) => RejectReason::RateLimit,
        Over::InFlight => RejectReason::InFlight,
        Over::GetStreams => RejectReason::GetStreams,
        Over::AuthFailures(_) => RejectReason::AuthFailures,
    };
    reject(metrics, reason, resp)
}

impl Gate<'_> {
    /// The protected-resource metadata (served without credentials), then authentication, then
    /// `[limits]`: the caller's principal and its in-flight slot, or the refusal to send.
    pub async fn admit(
        &self,
        req: &http::request::Parts,
    ) -> Result<(Principal, Option<Permit>), Response<Body>> {
        let path = req.uri.path();
        if let Some(suffix) = path.strip_prefix(METADATA_PATH) {
            if let Some(doc) = self.auth.metadata(suffix) {
                return Err(self.metadata_response(&req.method, suffix, doc));
            }
        }
        if let Some(over) = self.limits.auth_blocked(self.peer) {
            return Err(too_many(self.metrics, over));
        }
        let principal = match self.auth.authenticate(&req.headers, path).await {
            Ok(p) => p,
            Err(refusal) => {
                if refusal.kind == RefusalKind::InvalidToken {
                    self.limits.auth_failed(self.peer);
                }
                let mut resp = rpc_error_response(
                    refusal.status(),
                    None,
                    jsonrpc::INVALID_REQUEST,
                    &refusal.message,
                );
                if refusal.kind == RefusalKind::Unavailable {
                    // The key set could not be fetched: the token may be fine; retry soon.
                    resp.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                } else {
                    resp.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        self.auth.challenge(&refusal, path),
                    );
                }
                let reason = match refusal.status() {
                    StatusCode::FORBIDDEN => RejectReason::Scope,
                    _ => RejectReason::Auth,
                };
                return Err(reject(self.metrics, reason, resp));
            }
        };
        match self.limits.admit(&principal, req.method == Method::POST) {
            Ok(permit) => Ok((principal, Some(permit))),
            Err(over) => Err(too_many(self.metrics, over)),
        }
    }

    /// `GET /.well-known/oauth-protected-resource` plus `""`, `/mcp` or `/mcp/<name>` (RFC 9728
    /// §3.1): the metadata document; other suffixes 404, other methods 405.
    fn metadata_response(&self, method: &Method, suffix: &str, doc: Bytes) -> Response<Body> {
        let suffix = suffix.trim_end_matches('/');
        let known = suffix.is_empty() || ((self.is_route)(suffix) && suffix.starts_with("/mcp"));
        if !known {
            let body = serde_json::json!({"error": format!("no protected resource at {suffix:?}")});
            return reject(
                self.metrics,
                RejectReason::Route,
                json_response(StatusCode::NOT_FOUND, body.to_string().into()),
            );
        }
        if method != Method::GET && method != Method::HEAD {
            let mut resp = json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                Bytes::from_static(b"{\"error\":\"use GET\"}"),
            );
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return reject(self.metrics, RejectReason::Method, resp);
        }
        let mut resp = json_response(StatusCode::OK, doc);
        resp.headers_mut().insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("max-age=300"),
        );
        resp.headers_mut().insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
        resp
    }
}
