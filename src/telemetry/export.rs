//! The OTLP/HTTP export of one batch: a POST of its protobuf body (`otlp`), gzipped when
//! `OTEL_EXPORTER_OTLP_*COMPRESSION` is `gzip`, to the traces endpoint, with the
//! `OTEL_EXPORTER_OTLP_*HEADERS` header fields, within `OTEL_EXPORTER_OTLP_*TIMEOUT`, on the
//! export thread's runtime (`batch`), with the hyper and hyper-rustls (ring, webpki roots)
//! taskgate already has: no second HTTP client, no second TLS stack, nothing on the serving
//! threads. The spans of a batch whose export fails are counted in
//! `taskgate_trace_export_failures_total`, and the failure is logged at warn: the first one, then
//! at most one line per [`FAILURE_LOG_EVERY`] while exports keep failing (with how many failed
//! meanwhile); the first export that works again is logged at info. A wrong endpoint or a
//! collector refusing the body shows in the log at the default level, not only in the counter.

use super::Compression;
use bytes::Bytes;
use flate2::write::GzEncoder;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::io::Write as _;
use std::time::Duration;

/// While exports keep failing, at most one warn line per this long.
pub(super) const FAILURE_LOG_EVERY: Duration = Duration::from_secs(300);

/// Largest collector answer read, in bytes (an OTLP `ExportTraceServiceResponse` is a few bytes).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Posts export bodies to one collector.
pub(super) struct Exporter {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    endpoint: Uri,
    headers: HeaderMap,
    timeout: Duration,
    compression: Compression,
    failures: prometheus::IntCounter,
    /// Since when exports fail, when that was last logged and how many failed since: `None`
    /// while they work. Only the export thread touches it.
    failing: std::sync::Mutex<Option<Failing>>,
}

/// A run of failed exports ([`Exporter::export`]'s log).
struct Failing {
    logged_at: std::time::Instant,
    since_logged: u64,
}

impl Exporter {
    /// An exporter to `endpoint` (the full `…/v1/traces` URL) sending `headers`, each export
    /// ending within `timeout`, its body compressed as `compression` says, counting the spans
    /// of failed exports in `failures`. Errors: the endpoint is not a URL, a header is not a
    /// valid field, or the TLS set-up failed.
    pub(super) fn new(
        endpoint: &str,
        headers: &[(String, String)],
        timeout: Duration,
        compression: Compression,
        failures: prometheus::IntCounter,
    ) -> Result<Exporter, String> {
        let endpoint: Uri = endpoint
            .parse()
            .map_err(|e| format!("the OTLP endpoint {endpoint:?}: {e}"))?;
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let name = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| format!("OTLP header {name:?}: {e}"))?;
            let value =
                HeaderValue::from_str(value).map_err(|e| format!("OTLP header {name}: {e}"))?;
            map.append(name, value);
        }
        map.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        if compression == Compression::Gzip {
            map.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| format!("TLS set-up failed: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(Exporter {
            client,
            endpoint,
            headers: map,
            timeout,
            compression,
            failures,
            failing: std::sync::Mutex::new(None),
        })
    }

    /// Posts `body` (an `ExportTraceServiceRequest` of `spans` spans); a failure (no answer
    /// within the timeout, a transport error, a non-2xx status) counts the spans.
    pub(super) async fn export(&self, body: Bytes, spans: usize) {
        let outcome = self.post(body).await;
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        match (outcome, failing.as_mut()) {
            (Ok(()), None) => {}
            (Ok(()), Some(_)) => {
                *failing = None;
                tracing::info!(endpoint = %self.endpoint, "trace export works again");
            }
            (Err(e), None) => {
                self.failures.inc_by(spans as u64);
                *failing = Some(Failing {
                    logged_at: std::time::Instant::now(),
                    since_logged: 0,
                });
                tracing::warn!(endpoint = %self.endpoint, spans, error = %e, "trace export failed: its spans are dropped (counted in taskgate_trace_export_failures_total); logged again at most every {} s while exports fail", FAILURE_LOG_EVERY.as_secs());
            }
            (Err(e), Some(run)) => {
                self.failures.inc_by(spans as u64);
                run.since_logged += 1;
                if run.logged_at.elapsed() >= FAILURE_LOG_EVERY {
                    tracing::warn!(endpoint = %self.endpoint, failed_exports = run.since_logged, error = %e, "trace exports still fail");
                    run.logged_at = std::time::Instant::now();
                    run.since_logged = 0;
                } else {
                    tracing::debug!(spans, error = %e, "trace export failed");
                }
            }
        }
    }

    async fn post(&self, body: Bytes) -> Result<(), String> {
        let body = match self.compression {
            Compression::None => body,
            Compression::Gzip => Bytes::from(gzip(&body)?),
        };
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.endpoint.clone();
        *request.headers_mut() = self.headers.clone();
        let exchange = async {
            let answer = self
                .client
                .request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = answer.status();
            // Read to its end so the connection is reused (bounded: a collector's answer is small).
            let _ = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await;
            match status.is_success() {
                true => Ok(()),
                false => Err(format!("the collector answered {status}")),
            }
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| format!("no answer within {} ms", self.timeout.as_millis()))?
    }
}

/// `body` gzipped (flate2's default level: an export is a few hundred KiB at most, made on
/// the export thread).
pub(super) fn gzip(body: &[u8]) -> Result<Vec<u8>, String> {
    let mut encoder = GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::default(),
    );
    encoder
        .write_all(body)
        .and_then(|()| encoder.finish())
        .map_err(|e| format!("gzip: {e}"))
}
