//! Whether a request got its answer (break-edge F3, F4): a JSON body that is the JSON-RPC
//! response to the request's id, or an SSE stream that carries that response once.
//!
//! What the upstream sends instead (a JSON body that is not JSON, an empty body, an answer
//! under another id, a stream that ends without the answer) is an invalid answer, as the
//! README's error table has it: a JSON answer becomes HTTP 502 with `-32603` naming the upstream
//! and what was wrong ([`GatewayError::UpstreamProtocol`], under the client's id); a stream gets
//! a `-32603` event for the request before it ends, as an oversized event gets one from the
//! transport (unless a 2025-11-25 stream may be resumed: an event with an SSE `id` passed). Both
//! count `taskgate_upstream_errors_total{kind="protocol"}` (and the edge
//! `outcome="upstream_invalid"` for the 502). A second response to the request's id on a stream
//! is not passed on: only the first is the answer (and only the first `CreateTaskResult` is
//! recorded).
//!
//! Cost: a JSON answer is read once. Where `observe` awaits the answer for a task (a creation,
//! every 2026-07-28 `tools/call`, `tasks/*`), the one pass it already makes decides; a
//! body that pass did not take for the answer is read again here, only to word the error. A
//! plain answer (nothing awaited) is read here once, with the envelope reader
//! (`Message::parse`), which checks the whole text's grammar in one pass. An SSE event is read
//! only if it can be a response at all (a `"result"` or `"error"` key, or an escape that could
//! spell one).

use crate::exchange::GatewayError;
use crate::jsonrpc::{self, Id, Kind, Message};
use crate::mcp::needles::{self, found};
use crate::metrics::{Metrics, UpstreamErrorKind};
use crate::sse::Event;
use bytes::Bytes;
use memchr::memmem::Finder;
use std::sync::LazyLock;

/// What a reply to a request must carry: the response to `id`. `may_resume`: the request's era
/// lets an SSE answer end before its response once an event with an SSE `id` passed (2025-11-25
/// transports: the server MAY close the connection without ending the stream, the client
/// resumes with GET and `Last-Event-ID`); 2026-07-28 has no resumability.
#[derive(Clone)]
pub(super) struct Awaited {
    pub(super) id: Id,
    pub(super) may_resume: bool,
}

static RESULT_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\"result\""));
static ERROR_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\"error\""));

/// `Ok` when `bytes` (a JSON body) answers request `id`: a result or an error under `id`, or an
/// error under `null` (JSON-RPC 2.0: the server could not read the request's id); `Err` with
/// what is wrong otherwise.
pub(super) fn check_json(bytes: &Bytes, id: &Id) -> Result<(), String> {
    let msg = match Message::parse(bytes.clone()) {
        Ok(msg) => msg,
        Err(jsonrpc::EnvelopeError::Parse(e)) => {
            return Err(format!("its JSON answer is not JSON ({e})"))
        }
        Err(jsonrpc::EnvelopeError::Batch) => {
            return Err("its JSON answer is an array, not one JSON-RPC response".into())
        }
        Err(jsonrpc::EnvelopeError::Invalid(e)) => {
            return Err(format!("its JSON answer is not a JSON-RPC response ({e})"))
        }
    };
    match (msg.kind(), msg.id()) {
        (Kind::Response | Kind::Error, Some(got)) if got == id => Ok(()),
        (Kind::Error, None) => Ok(()),
        (Kind::Response | Kind::Error, Some(got)) => Err(format!(
            "it answered request id {} under another id, {}",
            id.as_json(),
            got.as_json()
        )),
        (Kind::Request | Kind::Notification, _) => Err(format!(
            "its JSON answer to request id {} is a {}, not a response",
            id.as_json(),
            match msg.kind() {
                Kind::Request => "request",
                _ => "notification",
            }
        )),
        (Kind::Response, None) => Err("its JSON answer has no id".into()),
    }
}

/// [`check_json`] of a plain call's answer (nothing else read it): one in a common shape is
/// taken by its ends ([`answers_at_an_end`]), anything else is parsed. Not for an answer a parse
/// already refused (an awaited one): its ends may still look right.
pub(super) fn check_plain_json(bytes: &Bytes, id: &Id) -> Result<(), String> {
    if answers_at_an_end(bytes, id.as_json().as_bytes()) {
        return Ok(());
    }
    check_json(bytes, id)
}

/// Whether `bytes` is, by its ends, the response to the request whose id is spelled `id`, in
/// one of the two orders servers write: `{"jsonrpc":"2.0","id":<id>,"result":` (or `"error":`)
/// at its start and `}` last (the Python SDK's, rmcp's), or `{"result":` (or `{"error":`) at
/// its start and `,"id":<id>}` last (the TypeScript SDK's: `JSON.stringify` of `{result,
/// jsonrpc, id}`). A member at either end of the top-level object is the object's own, so the
/// id is the response's. Anything else takes [`check_json`]'s parse.
///
/// Why not always the parse: reading a plain call's ~1 KiB answer with the envelope reader
/// cost about 5,900 instructions a request (callgrind, `benches/profile.sh small`: 58,471 →
/// 64,383, +10 %), for answers that are almost always well formed. What this does not catch:
/// a body that keeps both ends but is broken inside (the transport already refuses one cut
/// short of its `Content-Length`); it reaches the client as it came, as every answer did.
fn answers_at_an_end(bytes: &[u8], id: &[u8]) -> bool {
    const HEAD: &[u8] = br#"{"jsonrpc":"2.0","id":"#;
    const KEYS: [&[u8]; 2] = [br#","result":"#, br#","error":"#];
    if let Some(rest) = bytes.strip_prefix(HEAD) {
        return bytes.ends_with(b"}")
            && rest.starts_with(id)
            && KEYS.iter().any(|k| rest[id.len()..].starts_with(k));
    }
    let opens = bytes.starts_with(br#"{"result":"#) || bytes.starts_with(br#"{"error":"#);
    let Some(tail) = bytes.strip_suffix(b"}") else {
        return false;
    };
    opens && tail.ends_with(id) && tail[..tail.len() - id.len()].ends_with(br#","id":"#)
}

/// Whether the SSE event `data` is a response (result or error) under `id`. Read only when it
/// can be one: a response has a `result` or an `error` member, whose key is spelled out unless
/// escaped (`\u`).
pub(super) fn answers(data: &Bytes, id: &Id) -> bool {
    // The answer event of a plain call, in a common shape: by its ends, no parse.
    if answers_at_an_end(data, id.as_json().as_bytes()) {
        return true;
    }
    (found(&RESULT_KEY, data) || found(&ERROR_KEY, data) || found(&needles::UNICODE_ESCAPE, data))
        // The event's own bytes, shared (`jsonrpc::is_answer_to` copies them).
        && Message::parse(data.clone()).is_ok_and(|m| {
            m.id() == Some(id) && matches!(m.kind(), Kind::Response | Kind::Error)
        })
}

/// The invalid answer of `upstream` (`detail`: what was wrong), counted and logged: the
/// [`GatewayError`] the edge answers 502 `-32603` with.
pub(super) fn invalid(
    metrics: &Metrics,
    upstream: &std::sync::Arc<str>,
    detail: String,
) -> GatewayError {
    metrics.upstream_error(upstream, UpstreamErrorKind::Protocol);
    tracing::warn!(%upstream, %detail, "invalid upstream answer");
    GatewayError::UpstreamProtocol {
        upstream: upstream.clone(),
        detail,
    }
}

/// The `-32603` event for request `id` whose SSE stream ended without its answer (counted and
/// logged), as the transport's event for an oversized event reads.
pub(super) fn unanswered_event(
    metrics: &Metrics,
    upstream: &std::sync::Arc<str>,
    id: &Id,
) -> Event {
    let error = invalid(
        metrics,
        upstream,
        format!(
            "its SSE stream ended without a response to request id {}",
            id.as_json()
        ),
    );
    let body = jsonrpc::error_response(Some(id), jsonrpc::INTERNAL_ERROR, &error.to_string());
    Event {
        data: Some(String::from_utf8_lossy(&body).into_owned().into()),
        ..Default::default()
    }
}

/// A later response to request `id` on its stream, dropped (counted and logged): the first was
/// the answer.
pub(super) fn dropped_second_answer(metrics: &Metrics, upstream: &std::sync::Arc<str>, id: &Id) {
    metrics.upstream_error(upstream, UpstreamErrorKind::Protocol);
    tracing::warn!(%upstream, id = %id.as_json(), "the upstream sent a second response to one request on its stream: not passed on");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> Id {
        Id::from_json(text).unwrap()
    }

    #[test]
    fn a_json_answer_is_the_response_to_the_id() {
        let ok = Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
        assert_eq!(check_json(&ok, &id("1")), Ok(()));
        let err =
            Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"}}"#);
        assert_eq!(check_json(&err, &id("1")), Ok(()));
        let null = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#,
        );
        assert_eq!(check_json(&null, &id("1")), Ok(()));
        for (bad, says) in [
            (
                &br#"{"jsonrpc":"2.0","id":1,"result":{"content":["#[..],
                "not JSON",
            ),
            (
                br#"{"jsonrpc":"2.0","id":"1","result":{}}"#,
                "under another id, \"1\"",
            ),
            (
                br#"{"jsonrpc":"2.0","id":"not-yours","result":{}}"#,
                "not-yours",
            ),
            (
                br#"{"jsonrpc":"2.0","method":"notifications/progress"}"#,
                "a notification",
            ),
            (br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#, "a request"),
            (br#"[{"jsonrpc":"2.0","id":1,"result":{}}]"#, "an array"),
            (br#"{"id":1,"result":{}}"#, "not a JSON-RPC response"),
        ] {
            let e = check_json(&Bytes::from_static(bad), &id("1")).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    /// The two orders servers write are read by their ends; whatever else, by the parse.
    #[test]
    fn the_common_shapes_are_read_by_their_ends() {
        let ends = |text: &str, i: &str| answers_at_an_end(text.as_bytes(), i.as_bytes());
        assert!(ends(
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#,
            "1"
        ));
        assert!(ends(
            r#"{"jsonrpc":"2.0","id":"a","error":{"code":1}}"#,
            r#""a""#
        ));
        assert!(ends(
            r#"{"result":{"content":[]},"jsonrpc":"2.0","id":1}"#,
            "1"
        ));
        // Another id, a cut body, a nested id at the end, a request: not by the ends.
        assert!(!ends(r#"{"jsonrpc":"2.0","id":12,"result":{}}"#, "1"));
        assert!(!ends(
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":["#,
            "1"
        ));
        assert!(!ends(r#"{"result":{"x":{"id":1}}}"#, "1"));
        assert!(!ends(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#, "1"));
        assert!(!ends(r#"{"result":{},"jsonrpc":"2.0","id":11}"#, "1"));
        // Each of those still gets its answer from the parse.
        let b = |t: &'static str| Bytes::from_static(t.as_bytes());
        assert!(
            check_plain_json(&b(r#"{"result":{},"jsonrpc":"2.0","id":11}"#), &id("1")).is_err()
        );
        assert!(check_plain_json(&b(r#"{"result":{"x":{"id":1}}}"#), &id("1")).is_err());
        // Broken inside, both ends intact: only the parse sees it.
        let broken = b(r#"{"jsonrpc":"2.0","id":1,"result":{"a":1,}}"#);
        assert!(check_plain_json(&broken, &id("1")).is_ok());
        assert!(check_json(&broken, &id("1")).is_err());
    }

    #[test]
    fn an_event_answers_only_under_the_id() {
        let i = id("7");
        let answers = |text: &'static str| answers(&Bytes::from_static(text.as_bytes()), &i);
        assert!(answers(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#));
        assert!(answers(
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"x"}}"#
        ));
        assert!(answers(r#"{"jsonrpc":"2.0","id":7,"r\u0065sult":{}}"#));
        assert!(!answers(r#"{"jsonrpc":"2.0","id":8,"result":{}}"#));
        assert!(!answers(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#));
        assert!(!answers(
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"result":1}}"#
        ));
        assert!(!answers("not json"));
    }
}
