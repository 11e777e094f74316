//! The OTLP/HTTP export: taskgate's own HTTP client for `opentelemetry-otlp` and the exporter
//! that counts what it could not deliver.
//!
//! The SDK's batch span processor runs the export on a thread of its own and drives it with a
//! plain executor, not a tokio runtime; this client posts each batch on a current-thread tokio
//! runtime it creates on that thread at its first export, with the hyper and hyper-rustls
//! (ring, webpki roots) taskgate already has: no reqwest, no second TLS stack, nothing on the
//! serving threads.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::Duration;

/// Largest collector answer read, in bytes (an OTLP `ExportTraceServiceResponse` is a few bytes).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The export thread's runtime and client, made there at the first export.
struct OnExportThread {
    runtime: tokio::runtime::Runtime,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// An [`HttpClient`] for the batch processor's export thread: one POST per batch, bounded by
/// `timeout` (connect, answer and body).
pub(super) struct ExportClient {
    timeout: Duration,
    on_thread: OnceLock<Result<OnExportThread, String>>,
}

impl std::fmt::Debug for ExportClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportClient")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl ExportClient {
    /// A client whose exports end within `timeout`.
    pub(super) fn new(timeout: Duration) -> ExportClient {
        ExportClient {
            timeout,
            on_thread: OnceLock::new(),
        }
    }

    fn on_thread(&self) -> Result<&OnExportThread, HttpError> {
        self.on_thread
            .get_or_init(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .enable_time()
                    .build()
                    .map_err(|e| format!("the export runtime: {e}"))?;
                let https = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
                    .map_err(|e| format!("TLS set-up failed: {e}"))?
                    .https_or_http()
                    .enable_http1()
                    .build();
                let client = Client::builder(TokioExecutor::new()).build(https);
                Ok(OnExportThread { runtime, client })
            })
            .as_ref()
            .map_err(|e| e.clone().into())
    }

    fn post(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let on = self.on_thread()?;
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, Full::new(body));
        let exchange = async {
            let answer = on.client.request(request).await?;
            let (parts, body) = answer.into_parts();
            let body = Limited::new(body, MAX_ANSWER_BYTES).collect().await?;
            Ok::<_, HttpError>(Response::from_parts(parts, body.to_bytes()))
        };
        on.runtime
            .block_on(async { tokio::time::timeout(self.timeout, exchange).await })
            .map_err(|_| {
                HttpError::from(format!("no answer within {} ms", self.timeout.as_millis()))
            })?
    }
}

impl HttpClient for ExportClient {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        // The batch processor's thread blocks on the export anyway: the POST runs to its end
        // here, on the runtime of that thread.
        let answer = self.post(request);
        Box::pin(std::future::ready(answer))
    }
}

/// The OTLP exporter, counting the spans of every batch whose export failed in
/// `taskgate_trace_export_failures_total`.
#[derive(Debug)]
pub(super) struct Counted<E> {
    pub(super) inner: E,
    pub(super) failures: Failures,
}

/// The failure counter (a Prometheus counter shared with `/metrics`).
#[derive(Clone)]
pub(super) struct Failures(pub(super) prometheus::IntCounter);

impl std::fmt::Debug for Failures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Failures({})", self.0.get())
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.inner.export(batch).await;
        if let Err(e) = &result {
            self.failures.0.inc_by(spans);
            tracing::debug!(spans, error = %e, "trace export failed");
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}
