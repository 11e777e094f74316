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

/// Exact `Accept` values clients commonly send, with the media types each lists.
const COMMON_ACCEPT: [(&str, &[&str]); 4] = [
    (
        "application/json, text/event-stream",
        &["application/json", "text/event-stream"],
    ),
    (
        "text/event-stream, application/json",
        &["application/json", "text/event-stream"],
    ),
    (
        "application/json,text/event-stream",
        &["application/json", "text/event-stream"],
    ),
    ("text/event-stream", &["text/event-stream"]),
];

/// True when the `Accept` header(s) list every media type in `needed` (case-insensitive,
/// parameters ignored). The 2025-11-25 transport requires the literal types, as SDK servers do.
///
/// One pass over the listed types, whatever the number needed (at most 64; on every POST).
pub(super) fn accept_lists(headers: &HeaderMap, needed: &[&str]) -> bool {
    debug_assert!(needed.len() <= 64);
    let all = match needed.len() {
        0 => return true,
        n => u64::MAX >> (64 - n.min(64)),
    };
    let mut found = 0u64;
    // On bytes: `str::split` sets up a memchr searcher per call, which for these short values
    // cost about 700 instructions per request (benches/profile.sh small); the names compared
    // are ASCII, so a value that is not ASCII cannot match either way.
    for value in headers.get_all(header::ACCEPT) {
        if let Some(listed) = COMMON_ACCEPT
            .iter()
            .find(|(v, _)| v.as_bytes() == value.as_bytes())
        {
            // The values MCP SDKs send, decided without the parse below (~1,000 instructions
            // per request for the common value).
            for (i, n) in needed.iter().enumerate() {
                if listed.1.iter().any(|l| l.eq_ignore_ascii_case(n)) {
                    found |= 1 << i;
                }
            }
            if found == all {
                return true;
            }
            continue;
        }
        if !crate::headers::is_text(value.as_bytes()) {
            continue;
        }
        for listed in value.as_bytes().split(|&b| b == b',') {
            let essence = listed
                .split(|&b| b == b';')
                .next()
                .unwrap_or(b"")
                .trim_ascii();
            for (i, n) in needed.iter().enumerate() {
                if essence.eq_ignore_ascii_case(n.as_bytes()) {
                    found |= 1 << i;
                }
            }
            if found == all {
                return true;
            }
        }
    }
    found == all
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

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::ACCEPT, v.parse().unwrap());
        }
        h
    }

    /// Every needed type must be listed, in one field or spread over several, in any case and
    /// with parameters; a type missing or only a prefix of one is not enough.
    #[test]
    fn accept_lists_needs_every_type() {
        let both = ["application/json", "text/event-stream"];
        assert!(accept_lists(
            &accept(&["application/json, text/event-stream"]),
            &both
        ));
        assert!(accept_lists(
            &accept(&["Text/Event-Stream;q=0.9", "APPLICATION/JSON"]),
            &both
        ));
        assert!(!accept_lists(&accept(&["application/json"]), &both));
        // The common values (decided from a table) agree with the parse.
        assert!(accept_lists(
            &accept(&["text/event-stream, application/json"]),
            &both
        ));
        assert!(!accept_lists(&accept(&["text/event-stream"]), &both));
        assert!(accept_lists(
            &accept(&["text/event-stream", "application/json"]),
            &both
        ));
        assert!(accept_lists(
            &accept(&["text/event-stream"]),
            &["text/event-stream"]
        ));
        assert!(!accept_lists(
            &accept(&["application/jsonx, text/event-stream"]),
            &both
        ));
        assert!(!accept_lists(&accept(&[]), &both));
        assert!(accept_lists(
            &accept(&["*/*, text/event-stream"]),
            &["text/event-stream"]
        ));
        assert!(accept_lists(&accept(&[]), &[]));
    }
}
