//! The HTTP answers the edge builds itself (JSON bodies, JSON-RPC errors with their status), and
//! the request-side helpers they go with: reading a bounded body, checking `Accept`.

use super::server::{Body, BodyError as ResponseError};
use crate::exchange::GatewayError;
use crate::jsonrpc::{self, Id};
use bytes::Bytes;
use http::{header, HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use std::convert::Infallible;

pub(super) fn never(e: Infallible) -> ResponseError {
    match e {}
}

/// True when the `Accept` header(s) list every media type in `needed` (case-insensitive,
/// parameters ignored). The 2025-11-25 transport requires the literal types, as SDK servers do.
pub(super) fn accept_lists(headers: &HeaderMap, needed: &[&str]) -> bool {
    needed.iter().all(|n| {
        headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| {
                t.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .eq_ignore_ascii_case(n)
            })
    })
}

/// How much of an oversized body is read and discarded so the client, still sending, can read
/// the 413 (closing while it writes would give it a broken pipe instead), in bytes.
pub(super) const DISCARD_LIMIT: usize = 64 * 1024 * 1024;

pub(super) enum BodyError {
    TooLarge,
    Read(hyper::Error),
}

/// Reads a body of at most `limit` bytes. An oversized body is read to its end and dropped
/// (up to [`DISCARD_LIMIT`] more bytes) before [`BodyError::TooLarge`] is returned.
pub(super) async fn read_body(mut body: Incoming, limit: usize) -> Result<Bytes, BodyError> {
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BodyError::Read)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len();
        if seen > limit + DISCARD_LIMIT {
            return Err(BodyError::TooLarge);
        }
        if seen <= limit {
            buf.extend_from_slice(&data);
        }
    }
    if seen > limit {
        return Err(BodyError::TooLarge);
    }
    Ok(buf.freeze())
}

/// A JSON body with the given status.
pub fn json_response(status: StatusCode, body: Bytes) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body).map_err(never).boxed_unsync())
        .expect("valid response parts")
}

/// An HTTP error carrying a JSON-RPC error body.
pub fn rpc_error_response(
    status: StatusCode,
    id: Option<&Id>,
    code: i64,
    message: &str,
) -> Response<Body> {
    json_response(status, jsonrpc::error_response(id, code, message))
}

/// The HTTP answer for a [`GatewayError`]: its status, and a JSON-RPC error under the request's id.
pub fn gateway_error_response(e: &GatewayError, id: Option<&Id>) -> Response<Body> {
    rpc_error_response(e.status(), id, e.code(), &e.to_string())
}
