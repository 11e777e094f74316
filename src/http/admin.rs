//! The admin listener: `/healthz` (the process answers), `/readyz` (every upstream accepts TCP
//! connections), `/metrics` (Prometheus text format 0.0.4).

use super::server::{Body, Handler};
use super::streamable::json_response;
use crate::metrics::Metrics;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// An upstream as the readiness check sees it: its name and `host:port`.
#[derive(Clone)]
pub struct UpstreamTarget {
    /// The upstream's configured name.
    pub name: String,
    /// `host:port` to connect to.
    pub authority: String,
}

/// The admin endpoint handler.
pub struct Admin {
    metrics: Arc<Metrics>,
    upstreams: Vec<UpstreamTarget>,
}

impl Admin {
    /// Builds the handler.
    pub fn new(metrics: Arc<Metrics>, upstreams: Vec<UpstreamTarget>) -> Admin {
        Admin { metrics, upstreams }
    }

    async fn serve(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        if req.method() != Method::GET {
            return json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                Bytes::from_static(br#"{"error":"the admin endpoints take GET"}"#),
            );
        }
        match req.uri().path() {
            "/healthz" => json_response(StatusCode::OK, Bytes::from_static(br#"{"status":"ok"}"#)),
            "/readyz" => self.readyz().await,
            "/metrics" => Response::builder()
                .header(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )
                .body(
                    Full::new(Bytes::from(self.metrics.encode()))
                        .map_err(|e| match e {})
                        .boxed_unsync(),
                )
                .expect("valid response"),
            other => json_response(
                StatusCode::NOT_FOUND,
                serde_json::json!({
                    "error": format!("no admin endpoint at {other:?}"),
                    "endpoints": ["/healthz", "/readyz", "/metrics"],
                })
                .to_string()
                .into(),
            ),
        }
    }

    async fn readyz(&self) -> Response<Body> {
        let checks = self.upstreams.iter().map(|u| async move {
            let result = tokio::time::timeout(
                Duration::from_secs(1),
                tokio::net::TcpStream::connect(u.authority.as_str()),
            )
            .await;
            let status = match result {
                Ok(Ok(_)) => "ok".to_string(),
                Ok(Err(e)) => format!("unreachable: {e}"),
                Err(_) => "unreachable: connect timed out after 1 s".to_string(),
            };
            (u.name.clone(), status)
        });
        let results = futures_util::future::join_all(checks).await;
        let ready = results.iter().all(|(_, s)| s == "ok");
        let upstreams: serde_json::Map<String, serde_json::Value> = results
            .into_iter()
            .map(|(n, s)| (n, serde_json::Value::String(s)))
            .collect();
        let body = serde_json::json!({ "ready": ready, "upstreams": upstreams });
        let status = if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        json_response(status, body.to_string().into())
    }
}

impl Handler for Admin {
    fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> impl Future<Output = Response<Body>> + Send + 'static {
        self.serve(req)
    }
}
