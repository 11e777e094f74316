//! Bounded HTTPS GETs of the authorization server's JSON documents: its metadata (RFC 8414,
//! OpenID Connect Discovery 1.0 §4) and its JWK Set (RFC 7517 §5).
//!
//! Every fetch has a deadline (`auth.oauth.fetch_timeout_ms`) covering connect, headers and body,
//! and a size limit: a larger body is refused, never buffered. Redirects are not followed.

use bytes::Bytes;
use http::{header, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// Largest metadata or JWK Set document read, in bytes.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// A client for the issuer's documents (`https://`, or `http://` where the configuration allowed
/// it: loopback hosts).
pub struct Fetcher {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    timeout: Duration,
}

impl Fetcher {
    /// A client with Mozilla's root certificates (`webpki-roots`) and the `ring` provider.
    pub fn new(timeout: Duration) -> Result<Fetcher, String> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| format!("TLS set-up failed: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(Fetcher { client, timeout })
    }

    /// GETs `uri` and parses its JSON body (status 200, at most [`MAX_DOCUMENT_BYTES`], within
    /// the deadline). The error says which of these failed.
    pub async fn get_json(&self, uri: &Uri) -> Result<serde_json::Value, String> {
        match tokio::time::timeout(self.timeout, self.get(uri)).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "GET {uri}: no answer within {} ms (auth.oauth.fetch_timeout_ms)",
                self.timeout.as_millis()
            )),
        }
    }

    async fn get(&self, uri: &Uri) -> Result<serde_json::Value, String> {
        let req = Request::get(uri.clone())
            .header(header::ACCEPT, "application/json")
            .header(
                header::USER_AGENT,
                concat!("taskgate/", env!("CARGO_PKG_VERSION")),
            )
            .body(Empty::new())
            .map_err(|e| format!("GET {uri}: {e}"))?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| format!("GET {uri}: {e}"))?;
        if resp.status() != StatusCode::OK {
            return Err(format!("GET {uri}: HTTP {}", resp.status()));
        }
        let body = Limited::new(resp.into_body(), MAX_DOCUMENT_BYTES)
            .collect()
            .await
            .map_err(|e| format!("GET {uri}: body: {e} (limit {MAX_DOCUMENT_BYTES} bytes)"))?
            .to_bytes();
        serde_json::from_slice(&body).map_err(|e| format!("GET {uri}: not JSON: {e}"))
    }
}
